# The child side of a sluice worker's Python process (data_worker/python/python_process.h).
#
# The worker starts `python3 -c <this file> <limit> [<folder>...]` with fd 3 = a shared-memory
# file (memfd) and fd 4 = a stream socket to the worker; stdout goes to the worker's stderr.
# The runner moves both to fds PRIVATE_FD and above, close-on-exec, before any user code runs:
# a user function that closes fd 3 or 4 (a library closing "every fd above stderr") or opens a
# file that takes its number cannot make the runner map that file as the shared memory, and a
# program the function starts does not inherit them.
# The folders (--python-path) go first on sys.path once the runner's own modules are imported,
# and the worker's current directory (which `-c` puts there) is taken off it: neither can
# shadow numpy or the standard library the runner uses.
#
# Before the first call of a function the worker has it imported, so that an import that
# crashes, exits or takes long is told apart from the calls (and its time is not a call's):
#
#   worker -> child   LOAD <module> <function>\n
#   child -> worker   LOADED\n  or  ERR import <nbytes>\n<text>
#
# Each request is then one call or one group of calls; the tensors stay in the shared memory,
# the socket carries only their layout:
#
#   worker -> child   CALL <module> <function> <seed> <ncols>\n
#                     <dtype> <offset> <nbytes> <ndim> <d0> <d1> ...\n      (ncols lines)
#   child -> worker   OK <nouts> <shm_size>\n
#                     <dtype> <offset> <nbytes> <ndim> <d0> <d1> ...\n      (nouts lines)
#                 or  ERR <kind> <nbytes>\n<nbytes of UTF-8 text>  (kind: import|call|result|size)
#
# A group is n calls of the same function in one request and one answer (the function is
# still called once per element, in order, each with its own generator):
#
#   worker -> child   GROUP <module> <function> <n>\n
#                     then per element: <seed> <ncols>\n and its ncols layout lines
#   child -> worker   GROUP <k> <shm_size>\n
#                     then per element: OK <nouts>\n and its nouts layout lines,
#                                   or  ERR <kind> <nbytes>\n<text>   (kind: call|result|size)
#                 or  ERR import <nbytes>\n<text>                          (the whole group)
#
# While a group runs, the child reports progress, at most every PROGRESS_SECONDS (so that a
# group of cheap calls costs no extra messages): `P <calls done>\n` before the answer. The
# worker's deadline is then --python-op-timeout from the last report, not the whole group's.
#
# k is n, or fewer (at least 1) when the results of the first k elements took more than the
# limit (the worker asks again for the rest): `python3 -c <this file> <limit>`, the most bytes
# one element's results may take (the worker's memory budget; 0: no limit), so that a function
# that returns too much fails its element (ERR size: a bad record, like an exception) instead
# of filling the worker's memory.
#
# Example, a group of two one-column elements, the second raising:
#
#   GROUP augment_numpy train 2\n
#   8714532409152215325 1\nuint8 0 150528 3 224 224 3\n
#   1327006925436741376 1\nuint8 150528 150528 3 224 224 3\n
#   -> GROUP 2 1048576\nOK 1\nuint8 301056 150528 3 224 224 3\nERR call 93\nTraceback ...
#
# <seed> (a decimal uint64, from the job's seed, the epoch and the record) seeds the element's
# generator: a fresh numpy.random.Generator(numpy.random.PCG64(seed)) per call (about 9 us),
# so that everything of it is the seed's alone, its SeedSequence too: child generators
# spawned from it (rng.spawn, SeedSequence.spawn) do not depend on which process or thread
# ran the element, or on what ran before.
#
# Inputs are numpy views of the shared memory (no copy). Outputs are written after all the
# request's inputs, 64-byte aligned, each element's as soon as its call returns (so that a
# function that fills and returns the same array at every call, an `out=` buffer it keeps, gives
# each element of a group its own bytes); the child grows the memfd when they do not fit (the
# worker re-reads its size).
#
# The process the worker starts is the runner's *guardian*: it forks the runner (which does all of
# the above) and stays its parent until the runner and everything the runner started have
# ended. The runner's first line on the socket, before any answer, is its pid:
#
#   child -> worker   PID <runner pid>\n
#
# The guardian is a child subreaper (prctl PR_SET_CHILD_SUBREAPER): what the user function
# starts and leaves behind, even in a session of its own (os.setsid(), start_new_session=True, a
# daemon's double fork), becomes its child, not init's, when its parent ends. Once the runner has
# ended the guardian kills and reaps every child it has left, then ends the way the runner did
# (its exit status, or its signal), so the worker sees how the runner ended, and nothing the
# function started outlives it or is left for the worker (PID 1 in a container) to reap. The
# runner is killed, and the same cleanup runs, when the worker asks (SIGTERM to the guardian) or
# is gone (the guardian checks every ORPHAN_CHECK_SECONDS; a process apart from the calls, which
# a function stuck in C code holding the GIL cannot stop). The runner leads its own process
# group, without the guardian, and gets SIGKILL if the guardian ends first.
#
# Only the runner answers: a process the user function forked that returns from the call
# instead of exiting ends there (its answer would be read as the next request's).
import os
import sys

# The worker's current directory, however it got on the path ("" from -c, or an empty or
# relative PYTHONPATH entry made absolute): nothing there may shadow what the runner imports.
# The worker's start-up check of `import numpy` (python_pool.cc) filters the same way.
try:
    HERE = os.path.realpath(os.getcwd())
except OSError:  # the directory was removed: nothing is imported from it
    HERE = None
sys.path[:] = [p for p in sys.path
               if p not in ("", ".") and (HERE is None or os.path.realpath(p) != HERE)]

import ctypes
import fcntl
import importlib
import mmap
import resource
import signal
import time
import traceback

PRIVATE_FD = 200
ORPHAN_CHECK_SECONDS = 0.5
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def private_fd(fd):
    """`fd` moved to PRIVATE_FD or above, close-on-exec (the lowest free number there; above
    stderr if the open-files limit is lower)."""
    try:
        moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, PRIVATE_FD)
    except OSError:
        moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return moved


def children_of(parent):
    """The pids whose parent is `parent` (from /proc: every process this one can see; none if
    /proc cannot be read)."""
    pids = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return pids
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                stat = f.read()
        except OSError:  # it ended meanwhile
            continue
        # "pid (comm) state ppid ...": the command may hold spaces and parentheses.
        if int(stat[stat.rindex(b")") + 2:].split()[1]) == parent:
            pids.append(int(name))
    return pids


def reap_orphans(runner):
    """Reaps the children that have ended, except the runner (wait_for_the_runner's)."""
    while True:
        try:
            ended = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if ended is None or ended.si_pid == runner:
            return
        os.waitpid(ended.si_pid, 0)


def kill_the_runner(runner):
    """SIGKILLs the runner and its process group (what it forked there). Only while it is not
    reaped: until then its pid cannot name another process or group."""
    for kill in (os.killpg, os.kill):
        try:
            kill(runner, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_for_the_runner(runner, worker):
    """The runner's wait status once it has ended. Kills it first when the worker asks (SIGTERM)
    or is gone (this process was given another parent)."""
    while True:
        if os.waitid(os.P_PID, runner, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            kill_the_runner(runner)  # what it forked in its group, before it is reaped
            return os.waitpid(runner, 0)[1]
        reap_orphans(runner)
        asked = signal.sigtimedwait((signal.SIGCHLD, signal.SIGTERM), ORPHAN_CHECK_SECONDS)
        if (asked is not None and asked.si_signo == signal.SIGTERM) or os.getppid() != worker:
            kill_the_runner(runner)


def end_every_child():
    """Kills and reaps every child this process has: what the runner started and left behind
    (adopted by this subreaper as the runner ended), and their children in turn, adopted as
    their parents end."""
    me = os.getpid()
    unseen = 0  # rounds in a row that found children to wait for but none in /proc
    while unseen < 1000:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] != 0:
                pass
        except ChildProcessError:
            return  # none left
        killed = 0
        for pid in children_of(me):
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        if killed:
            unseen = 0
            try:
                os.waitpid(-1, 0)  # one of them ending
            except ChildProcessError:
                return
        else:
            unseen += 1
            time.sleep(0.001)  # a child being adopted right now (or /proc hides it: give up)


def end_as(status):
    """Ends this process the way the runner ended: its signal (without a core file), or its
    exit status."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL's cannot be set, nor need to be
            pass
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def guard_the_runner():
    """Forks the runner and returns in it; this process stays its guardian (the comment at the
    top) and never returns."""
    worker = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    waited = {signal.SIGCHLD, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    guardian = os.getpid()
    runner = os.fork()
    if runner == 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, waited)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != guardian:  # it ended before the line above
            os._exit(1)
        os.setpgid(0, 0)  # a function that signals its group does not reach the guardian
        return
    try:
        os.setpgid(runner, runner)  # as the runner does, for whichever of the two runs first
    except OSError:
        pass
    os.close(CTL_FD)  # the shared memory and the socket are the runner's alone
    os.close(SHM_FD)
    status = wait_for_the_runner(runner, worker)
    end_every_child()
    end_as(status)


SHM_FD = private_fd(3)
CTL_FD = private_fd(4)
guard_the_runner()
RUNNER_PID = os.getpid()

import numpy as np  # noqa: E402 (in the runner only: the guardian stays small)
from numpy.random import PCG64, Generator  # noqa: E402

PROGRESS_SECONDS = 0.01
RESULT_LIMIT = int(sys.argv[1]) if len(sys.argv) > 1 else 0
USER_PATH = sys.argv[2:]
DTYPES = ("uint8", "int32", "int64", "float16", "float32")
# Wire name -> dtype, and the dtypes a result may have -> their wire name (native byte
# order only: a dict lookup, where dtype.name is Python-level code).
DTYPE_OF = {name.encode(): np.dtype(name) for name in DTYPES}
NAME_OF = {np.dtype(name): name for name in DTYPES}


class Shm:
    def __init__(self):
        self.map = None
        self.size = 0

    def buffer(self, need=0):
        size = os.fstat(SHM_FD).st_size
        if need > size:
            os.ftruncate(SHM_FD, need)
            size = need
        if size != self.size:
            # The old map may still be referenced by arrays the function kept; it is
            # released when they are.
            self.map = mmap.mmap(SHM_FD, size) if size > 0 else None
            self.size = size
        return self.map


def align(n):
    return (n + 63) // 64 * 64


def view(buf, dtype, shape, offset, nbytes):
    if nbytes == 0:
        return np.empty(shape, dtype=dtype)
    return np.frombuffer(buf, dtype=dtype, count=nbytes // dtype.itemsize, offset=offset).reshape(shape)


def exit_if_forked():
    """Ends a process the user function forked that came back here instead of exiting."""
    if os.getpid() != RUNNER_PID:
        os._exit(0)


def send(data):
    exit_if_forked()
    view = memoryview(data)
    while view:
        n = os.write(CTL_FD, view)
        view = view[n:]


def error(kind, text):
    body = text.replace("\0", "\\0").encode("utf-8", "replace")
    return b"ERR %s %d\n" % (kind.encode(), len(body)) + body


def load(functions, module, function):
    """The function, or raises (the caller sends the traceback as an import error)."""
    key = (module, function)
    fn = functions.get(key)
    if fn is None:
        fn = getattr(importlib.import_module(module.decode()), function.decode())
        if not callable(fn):
            raise TypeError("%s.%s is not callable" % (module.decode(), function.decode()))
        check_takes_rng(fn, "%s.%s" % (module.decode(), function.decode()))
        functions[key] = fn
    return fn


def check_takes_rng(fn, name):
    """Raises TypeError if `fn` cannot take the rng keyword every call passes: a programming
    error that would otherwise fail (or, under on_error: skip, drop) every record."""
    import inspect
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or a C function (a numpy ufunc)
        raise TypeError("%s has no signature Python can read, so whether it takes the keyword "
                        "argument rng cannot be checked: wrap it in a Python function "
                        "F(*columns, rng)" % name)
    try:
        signature.bind_partial(rng=None)
    except TypeError:
        raise TypeError("%s%s cannot take the keyword argument rng that every call passes: "
                        "define it as F(*columns, rng) (or with **kwargs)" % (name, signature))


def inputs_end(specs):
    return max((int(offset) + int(nbytes) for _, offset, nbytes, *_ in specs), default=0)


def call(fn, buf, specs, rng):
    """One call: (the result arrays, None) or (None, (kind, text))."""
    columns = [view(buf, DTYPE_OF[dtype], tuple(int(d) for d in dims), int(offset), int(nbytes))
               for dtype, offset, nbytes, ndim, *dims in specs]
    try:
        result = fn(*columns, rng=rng)
    except BaseException:
        exit_if_forked()
        return None, ("call", traceback.format_exc())
    exit_if_forked()
    del columns
    try:
        return arrays_of(result)
    except BaseException:  # a result whose own code raises (a tuple subclass's __iter__, ...)
        return None, ("result", "the result could not be read:\n" + traceback.format_exc())


def arrays_of(result):
    """The function's result as arrays: (the arrays, None) or (None, ("result", text))."""
    outputs = result if isinstance(result, tuple) else (result,)
    arrays = []
    for k, out in enumerate(outputs):
        try:
            a = np.asarray(out)
        except BaseException as e:  # a ragged list, a tensor that needs .detach(), ...
            return None, ("result", "result %d (a %s) cannot be made a numpy array: %s: %s; "
                          "return a numpy array (or a tuple of arrays, one per output column)" % (
                              k, type(out).__name__, type(e).__name__, e))
        if a.dtype not in NAME_OF:
            # numpy made an array of it, of a dtype sluice does not take (a float64 tensor, a
            # 16-bit PIL image): say which; otherwise it is no array at all (None, a dict).
            if out is None or (a.dtype.kind in "OUSV" and not isinstance(out, (np.ndarray, list))):
                return None, ("result", "result %d is %s, not an array; return a numpy array "
                              "(or a tuple of arrays, one per output column)" % (
                                  k, "None" if out is None else "a " + type(out).__name__))
            name = a.dtype.name if a.dtype.isnative else a.dtype.str  # '>i4': not native
            return None, ("result", "result %d is %s%s; return one of %s (cast with .astype)" % (
                k, name, list(a.shape), ", ".join(DTYPES)))
        arrays.append(a)
    return arrays, None


def call_all(fn, shm, elements, end):
    """The calls of one request, in order: per element, (its results' layout lines, None) or
    (None, (kind, text)), and the shared memory's size. Each element's results are copied into
    the shared memory, after `end` (the inputs), as soon as its call returns, before the next
    call can change them. An element whose results take more than RESULT_LIMIT bytes fails
    (ERR size), and the request stops once its results so far take more (the worker asks again
    for the rest)."""
    buf = shm.buffer()  # the inputs' views stay on this map if the results grow the memfd
    results = []
    offset = align(end)
    total = 0
    reported = time.monotonic()
    for seed, specs in elements:
        if results and time.monotonic() - reported >= PROGRESS_SECONDS:
            send(b"P %d\n" % len(results))
            reported = time.monotonic()
        arrays, err = call(fn, buf, specs, Generator(PCG64(int(seed))))
        if arrays is not None and RESULT_LIMIT:
            size = sum(a.nbytes for a in arrays)
            if size > RESULT_LIMIT:
                arrays, err = None, ("size", "results of %d bytes for one element, more than this "
                                     "worker's limit of %d bytes (its memory budget, --memory-mb)"
                                     % (size, RESULT_LIMIT))
            else:
                total += size
        if arrays is None:
            results.append((None, err))
        else:
            lines, offset = write_results(shm, arrays, offset)
            results.append((lines, None))
        if RESULT_LIMIT and total > RESULT_LIMIT:
            break
    return results, shm.size


def write_results(shm, arrays, offset):
    """Copies one element's result arrays into the shared memory from `offset` on, each 64-byte
    aligned; returns their layout lines and where the next element's may start."""
    placed = []
    for a in arrays:
        placed.append((a, offset))
        offset = align(offset + a.nbytes)
    buf = shm.buffer(need=offset)
    lines = []
    for a, off in placed:
        if a.nbytes:
            np.copyto(view(buf, a.dtype, a.shape, off, a.nbytes), a, casting="no")
        lines.append(("%s %d %d %d%s\n" % (NAME_OF[a.dtype], off, a.nbytes, a.ndim,
                                          "".join(" %d" % d for d in a.shape))).encode())
    return lines, offset


def first_for_the_oom_killer():
    """Out of memory, the kernel kills this process before its worker (a process may raise
    its own score): a user function that takes too much memory costs its element a retry on
    a fresh process, not every job the worker serves."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


def main():
    sys.path[0:0] = USER_PATH
    first_for_the_oom_killer()
    send(b"PID %d\n" % RUNNER_PID)
    reader = os.fdopen(CTL_FD, "rb", buffering=1 << 16, closefd=False)
    shm = Shm()
    functions = {}
    while True:
        line = reader.readline()
        if not line:  # the worker is gone: the guardian ends what the function started
            os._exit(0)
        words = line.split()
        if words[0] == b"LOAD":
            try:
                load(functions, words[1], words[2])
            except BaseException:
                exit_if_forked()
                send(error("import", traceback.format_exc()))
                continue
            send(b"LOADED\n")
            continue
        if words[0] == b"GROUP":
            _, module, function, n = words
            elements = []
            for _ in range(int(n)):
                seed, ncols = reader.readline().split()
                elements.append((seed,
                                 [reader.readline().split() for _ in range(int(ncols))]))
        else:
            _, module, function, seed, ncols = words
            elements = [(seed, [reader.readline().split() for _ in range(int(ncols))])]
        try:
            fn = load(functions, module, function)
        except BaseException:
            send(error("import", traceback.format_exc()))
            continue
        end = max((inputs_end(specs) for _, specs in elements), default=0)
        results, size = call_all(fn, shm, elements, end)
        if words[0] == b"GROUP":
            out = [b"GROUP %d %d\n" % (len(results), size)]
            for text, err in results:
                if err is not None:
                    out.append(error(*err))
                else:
                    out.append(b"OK %d\n" % len(text))
                    out.extend(text)
        else:
            text, err = results[0]
            if err is not None:
                out = [error(*err)]
            else:
                out = [b"OK %d %d\n" % (len(text), size)] + text
        send(b"".join(out))


main()
