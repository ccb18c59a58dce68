"""User functions for python_op_test: what a team's module on --python-path looks like.

Functions that fail once write a marker file in $SLUICE_TEST_MARKERS first, so that the
redone call (on a fresh process) succeeds.
"""
import ctypes
import os
import signal
import time

import numpy as np


def invert(image, label, rng):
    return 255 - image, label


def draws(image, label, rng):
    """The first four draws of the element's generator, in the image's place."""
    return rng.integers(0, 1 << 30, size=(1, 1, 4)).astype(np.int32), label


def to_float(image, label, rng):
    return image.astype(np.float32) / 255, label


def wrong_dtype(image, label, rng):
    return image.astype(np.float64), label


def big_endian(image, label, rng):
    return image.astype(">i4"), label


def one_result(image, label, rng):
    return image


def raises_on_3(image, label, rng):
    if int(label) == 3:
        raise ValueError("bad record %d" % int(label))
    return 255 - image, label


def raises_long_on_3(image, label, rng):
    """An exception whose message is 100,000 characters, raised 50 calls deep."""
    def deep(n):
        if n == 0:
            raise ValueError("start " + "x" * 100000 + " end of record %d" % int(label))
        deep(n - 1)
    if int(label) == 3:
        deep(50)
    return 255 - image, label


def _first_time(tag, label):
    path = os.path.join(os.environ["SLUICE_TEST_MARKERS"], "%s-%d" % (tag, int(label)))
    if os.path.exists(path):
        return False
    open(path, "w").close()
    return True


def exits_once_on_3(image, label, rng):
    if int(label) == 3 and _first_time("exit", label):
        os._exit(7)
    return 255 - image, label


def segfaults_once_on_5(image, label, rng):
    if int(label) == 5 and _first_time("segv", label):
        ctypes.string_at(0)
    return 255 - image, label


def sigkills_once_on_3(image, label, rng):
    """Killed from outside, as the kernel's OOM killer does (SIGKILL), the first time."""
    if int(label) == 3 and _first_time("sigkill", label):
        os.kill(os.getpid(), signal.SIGKILL)
    return 255 - image, label


def hangs_once_on_2(image, label, rng):
    if int(label) == 2 and _first_time("hang", label):
        time.sleep(3600)
    return 255 - image, label


def forks_then_exits_once_on_3(image, label, rng):
    """Forks a child that sleeps on (as a user's multiprocessing helper may), holding the
    process's ends of the worker's socket and shared memory, writes the child's pid in
    grandchild-3, then exits, the first time."""
    if int(label) == 3 and _first_time("fork", label):
        pid = os.fork()
        if pid == 0:
            time.sleep(3600)
            os._exit(0)
        with open(os.path.join(os.environ["SLUICE_TEST_MARKERS"], "grandchild-3"), "w") as f:
            f.write(str(pid))
        os._exit(7)
    return 255 - image, label


def always_exits_on_4(image, label, rng):
    if int(label) == 4:
        os._exit(9)
    return 255 - image, label


def grows_on_5(image, label, rng):
    """A 1000x1000x3 image (3,000,000 bytes) for record 5."""
    if int(label) == 5:
        return np.zeros((1000, 1000, 3), np.uint8), label
    return 255 - image, label


def fork_comes_back(image, label, rng):
    """Forks a child that returns from the call (zeros) instead of exiting, ahead of this
    process's own answer: only the process sluice started may answer."""
    if os.fork() == 0:
        return np.zeros_like(image), label
    time.sleep(0.05)
    return 255 - image, label


def forks_a_helper(image, label, rng):
    """Forks a helper that sleeps on (in this process's group) and writes its pid in
    helper-<label>; returns normally."""
    pid = os.fork()
    if pid == 0:
        time.sleep(3600)
        os._exit(0)
    with open(os.path.join(os.environ["SLUICE_TEST_MARKERS"], "helper-%d" % int(label)), "w") as f:
        f.write(str(pid))
    return 255 - image, label


def _write_marker(name, pid):
    with open(os.path.join(os.environ["SLUICE_TEST_MARKERS"], name), "w") as f:
        f.write(str(pid))


def _start_a_daemon(marker):
    """A daemon's double fork: a process in a session of its own whose parent has exited,
    sleeping; writes its pid in `marker` before this returns."""
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.setsid()
        daemon = os.fork()
        if daemon == 0:
            os.close(r)
            os.close(w)
            time.sleep(3600)
            os._exit(0)
        os.write(w, b"%d" % daemon)
        os._exit(0)
    os.close(w)
    daemon = int(os.read(r, 32))
    os.close(r)
    os.waitpid(middle, 0)
    _write_marker(marker, daemon)


def starts_a_daemon_then_exits_once_on_3(image, label, rng):
    """Starts a daemon (daemon-3), then exits, the first time."""
    if int(label) == 3 and _first_time("daemon-started", label):
        _start_a_daemon("daemon-3")
        os._exit(7)
    return 255 - image, label


def starts_a_daemon_then_hangs_once_on_2(image, label, rng):
    """Starts a daemon (daemon-2), then hangs, the first time."""
    if int(label) == 2 and _first_time("daemon-started", label):
        _start_a_daemon("daemon-2")
        time.sleep(3600)
    return 255 - image, label


def starts_a_session_helper(image, label, rng):
    """Starts `sleep 3600` in a session of its own (start_new_session=True), writes its pid in
    session-<label> and returns, leaving it running."""
    import subprocess
    helper = subprocess.Popen(["sleep", "3600"], start_new_session=True)
    _write_marker("session-%d" % int(label), helper.pid)
    return 255 - image, label


def holds_the_gil(image, label, rng):
    """Writes this process's pid in gil-<label>, then backtracks in a regular expression for
    hours without releasing the GIL."""
    import re
    with open(os.path.join(os.environ["SLUICE_TEST_MARKERS"], "gil-%d" % int(label)), "w") as f:
        f.write(str(os.getpid()))
    re.match(r"(a+)+$", "a" * 64 + "b")
    return image, label


def big_then_small(image, label, rng):
    """100 MB of results for record 1, the image's 6 bytes otherwise."""
    if int(label) == 1:
        return np.zeros((100, 1000, 1000), np.uint8), label
    return 255 - image, label


def shm_seen_then_big(image, label, rng):
    """The size of the runner's shared memory while this call runs (int64), then 70 MB of
    results."""
    size = -1
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        if target.startswith("/memfd:sluice-python"):
            size = os.fstat(int(fd)).st_size
    return np.int64(size), np.zeros((70, 1000, 1000), np.uint8)


class _UnreadableTuple(tuple):
    def __iter__(self):
        raise RuntimeError("this tuple cannot be iterated")


def returns_unreadable_tuple(image, label, rng):
    """A tuple whose own code raises once the function has returned it."""
    return _UnreadableTuple((image, label))


def returns_none(image, label, rng):
    return None


def returns_dict(image, label, rng):
    return {"image": image}


def returns_ragged_list(image, label, rng):
    return [image, label]  # a list is one array: these two do not make one


def hash_of_a_string(image, label, rng):
    """Python's str hash, randomized per interpreter unless PYTHONHASHSEED is set."""
    return image, np.int64(hash("sluice") & 0x7FFFFFFF)


def stdout_unbuffered(image, label, rng):
    """1 if what the function prints reaches the worker's log at once (no buffer to lose)."""
    import sys
    return image, np.int64(sys.stdout.write_through)


def heap_faults(image, label, rng):
    """Minor page faults over 10 rounds of three 300 KiB buffers made and freed, after two
    rounds to warm up: glibc by default gives such memory back at every round (about 190
    faults a round); a heap that is kept faults none."""
    import resource

    def once():
        a, b, c = bytearray(300 << 10), bytearray(300 << 10), bytearray(300 << 10)
        del a, b, c
    once()
    once()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        once()
    return image, np.int64(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)


def closes_fd3_and_opens_a_file(image, label, rng):
    """Closes fds 3 and 4 (where the worker handed the runner its shared memory and socket)
    and opens a file of 4096 0xAB bytes, which takes fd 3, kept open."""
    for fd in (3, 4):
        try:
            os.close(fd)
        except OSError:
            pass
    path = os.path.join(os.environ["SLUICE_TEST_MARKERS"], "fd3_%d" % os.getpid())
    with open(path, "wb") as f:
        f.write(b"\xab" * 4096)
    _kept.append(open(path, "rb+"))
    return 255 - image, label


_kept = []


# A numpy ufunc: callable, but with no signature inspect can read.
no_signature = np.negative


not_callable = 3


def takes_no_rng(image, label):
    return image, label


# Label-only functions (source columns [label]: the whole pipeline is one stage reading the
# feed, so a worker's groups are exactly the next `group` records): label + 1000, after the
# fault of the image version.

def _plus_1000(fault):
    def fn(label, rng):
        fault(int(label))
        return label + 1000
    return fn


def _raise_on_3(g):
    if g == 3:
        raise ValueError("bad record %d" % g)


def _exit_once_on_3(g):
    if g == 3 and _first_time("exit", g):
        os._exit(7)


def _segfault_once_on_5(g):
    if g == 5 and _first_time("segv", g):
        ctypes.string_at(0)


def _hang_once_on_2(g):
    if g == 2 and _first_time("hang", g):
        time.sleep(3600)


def _always_exit_on_4(g):
    if g == 4:
        os._exit(9)


def _sigkill_once_on_3_logged(g):
    """Logs the call (one line per call in calls-<g>), then SIGKILLs its process the first
    time on record 3."""
    with open(os.path.join(os.environ["SLUICE_TEST_MARKERS"], "calls-%d" % g), "a") as f:
        f.write("call\n")
    if g == 3 and _first_time("sigkill", g):
        os.kill(os.getpid(), signal.SIGKILL)


label_plus_1000 = _plus_1000(lambda g: None)
label_raises_on_3 = _plus_1000(_raise_on_3)
label_exits_once_on_3 = _plus_1000(_exit_once_on_3)
label_segfaults_once_on_5 = _plus_1000(_segfault_once_on_5)
label_hangs_once_on_2 = _plus_1000(_hang_once_on_2)
label_always_exits_on_4 = _plus_1000(_always_exit_on_4)
label_sigkills_once_on_3_logged = _plus_1000(_sigkill_once_on_3_logged)


def label_draw(label, rng):
    """The element's first draw."""
    return np.int64(rng.integers(0, 1 << 62))


def invert_and_draw(image, label, rng):
    """The image inverted; the label replaced by the element's first draw."""
    return 255 - image, np.int64(rng.integers(0, 1 << 62))


def mixed_draws(label, rng):
    """Eight int64 from draws of several kinds. It starts and ends with 32-bit draws, which
    numpy serves from half a buffered 64-bit word: the last leaves half a word buffered, which
    the next element's generator must not see (the last value says whether one is: 1)."""
    first = rng.integers(0, 1 << 32, size=1, dtype=np.uint32).astype(np.int64)
    floats = (rng.random(2) * (1 << 52)).astype(np.int64)
    normals = (rng.standard_normal(2) * 1e9).astype(np.int64)
    last = rng.integers(0, 1 << 32, size=2, dtype=np.uint32).astype(np.int64)
    buffered = [int(rng.bit_generator.state["has_uint32"])]
    return np.concatenate([first, floats, normals, last, buffered])


def spawned_draws(label, rng):
    """Eight int64: four draws from each of two child generators spawned from rng's
    SeedSequence (numpy's way to derive independent streams)."""
    children = rng.bit_generator._seed_seq.spawn(2)
    return np.concatenate([np.random.Generator(np.random.PCG64(c)).integers(0, 1 << 62, 4)
                           for c in children]).astype(np.int64)


def slow_then_hangs_on_3(image, label, rng):
    """20 ms per call (the runner reports its progress), and record 3 hangs."""
    time.sleep(0.02)
    if int(label) == 3:
        time.sleep(3600)
    return 255 - image, label


_OUT = {}


def inverts_into_one_buffer(image, label, rng):
    """invert, written into one array the module keeps and returns at every call (an `out=`
    buffer, as OpenCV's dst= or numpy's out= invite)."""
    out = _OUT.setdefault((image.shape, image.dtype.str), np.empty_like(image))
    np.subtract(255, image, out=out)
    return out, label


_CALLS = 0


def calls_so_far(image, label, rng):
    """The calls this process has served, this one included (a module global)."""
    global _CALLS
    _CALLS += 1
    return np.int64(_CALLS), label


def calls_so_far_as_label(image, label, rng):
    """calls_so_far in the label's place: in a pipeline of one thread, the record's order."""
    global _CALLS
    _CALLS += 1
    return image, np.int64(_CALLS)


def numpy_raises_from_now_on(image, label, rng):
    """Sets numpy, process-wide, to raise on a division by zero."""
    np.seterr(all="raise")
    return np.int64(0), label


def divides_by_zero(image, label, rng):
    """1 / 0 in numpy: inf with numpy's default settings (a warning), FloatingPointError after
    numpy_raises_from_now_on in the same process."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.int64(np.isinf(np.float64(1) / np.float64(0))), label


class _Float64ArrayLike:
    """Not an ndarray, but numpy reads it as one (as a torch tensor or a PIL image)."""

    def __array__(self, dtype=None):
        return np.zeros((2, 3), dtype=np.float64)


def returns_float64_array_like(image, label, rng):
    return _Float64ArrayLike(), label
