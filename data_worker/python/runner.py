# The child side of a sluice worker's Python process (data_worker/python/python_process.h).
#
# The worker starts `python3 -c <this file>` with fd 3 = a shared-memory file (memfd) and
# fd 4 = a stream socket to the worker; stdout goes to the worker's stderr. Each request is
# one call; the tensors stay in the shared memory, the socket carries only their layout:
#
#   worker -> child   CALL <module> <function> <seed> <ncols>\n
#                     <dtype> <offset> <nbytes> <ndim> <d0> <d1> ...\n      (ncols lines)
#   child -> worker   OK <nouts> <shm_size>\n
#                     <dtype> <offset> <nbytes> <ndim> <d0> <d1> ...\n      (nouts lines)
#                 or  ERR <kind> <nbytes>\n<nbytes of UTF-8 text>          (kind: import|call|result)
#
# Inputs are numpy views of the shared memory (no copy). Outputs are written after the inputs,
# 64-byte aligned; the child grows the memfd when they do not fit (the worker re-reads its size).
import importlib
import mmap
import os
import sys
import traceback

import numpy as np

SHM_FD = 3
CTL_FD = 4
DTYPES = ("uint8", "int32", "int64", "float16", "float32")


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


def send(data):
    view = memoryview(data)
    while view:
        n = os.write(CTL_FD, view)
        view = view[n:]


def send_error(kind, text):
    body = text.encode("utf-8", "replace")
    send(b"ERR %s %d\n" % (kind.encode(), len(body)) + body)


def main():
    reader = os.fdopen(CTL_FD, "rb", buffering=1 << 16, closefd=False)
    shm = Shm()
    functions = {}
    while True:
        line = reader.readline()
        if not line:
            return
        _, module, function, seed, ncols = line.split()
        specs = [reader.readline().split() for _ in range(int(ncols))]
        key = (module, function)
        fn = functions.get(key)
        if fn is None:
            try:
                fn = getattr(importlib.import_module(module.decode()), function.decode())
                if not callable(fn):
                    raise TypeError("%s.%s is not callable" % (module.decode(), function.decode()))
            except BaseException:
                send_error("import", traceback.format_exc())
                continue
            functions[key] = fn
        buf = shm.buffer()
        columns = []
        end = 0
        for dtype, offset, nbytes, ndim, *dims in specs:
            offset, nbytes = int(offset), int(nbytes)
            shape = tuple(int(d) for d in dims)
            columns.append(view(buf, np.dtype(dtype.decode()), shape, offset, nbytes))
            end = max(end, offset + nbytes)
        rng = np.random.Generator(np.random.PCG64(int(seed)))
        try:
            result = fn(*columns, rng=rng)
        except BaseException:
            send_error("call", traceback.format_exc())
            continue
        del columns
        outputs = result if isinstance(result, (tuple, list)) else (result,)
        arrays = []
        error = None
        for k, out in enumerate(outputs):
            a = np.asarray(out)
            if a.dtype.name not in DTYPES:
                error = "result %d is %s%s; return one of %s (cast with .astype)" % (
                    k, a.dtype.name, list(a.shape), ", ".join(DTYPES))
                break
            arrays.append(a)
        if error is not None:
            send_error("result", error)
            continue
        offset = align(end)
        layout = []
        for a in arrays:
            layout.append((a, offset))
            offset = align(offset + a.nbytes)
        buf = shm.buffer(need=offset)
        header = [b"OK %d %d\n" % (len(arrays), shm.size)]
        for a, off in layout:
            if a.nbytes:
                np.copyto(view(buf, a.dtype, a.shape, off, a.nbytes), a, casting="no")
            header.append(("%s %d %d %d%s\n" % (a.dtype.name, off, a.nbytes, a.ndim,
                                                "".join(" %d" % d for d in a.shape))).encode())
        del result, outputs, arrays, layout
        send(b"".join(header))


main()
