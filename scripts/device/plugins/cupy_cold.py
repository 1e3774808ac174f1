# SPDX-License-Identifier: Apache-2.0
"""Where a CuPy allocation + free costs more on a thread that has made no
device current: each piece of gpumem's C path timed on such a thread (a
fresh thread per measurement), then again after cupy.cuda.Device(0).use().

usage: python3 cupy_cold.py pool|c   (one JSON line; a fresh process each)"""
import ctypes
import json
import sys
import threading
import time

N = 20000


def timed(fn):
    for _ in range(200):
        fn()
    t0 = time.perf_counter()
    for _ in range(N):
        fn()
    return round((time.perf_counter() - t0) / N * 1e6, 3)


def main():
    import cupy
    which = sys.argv[1]
    if which == "c":
        import gpumem.cupy
        gpumem.cupy.enable(path="c")
    import gpumem.cupy as gc
    addr, _ = gc._stream_fn(cupy)
    cur = ctypes.PYFUNCTYPE(ctypes.c_ssize_t)(addr)  # Cython code: the GIL stays held
    pieces = {
        "alloc_free": lambda: cupy.cuda.alloc(65536),
        "get_device_id": cupy.cuda.runtime.getDevice,
        "current_stream_c": cur,
        "current_stream_py": cupy.cuda.get_current_stream,
        "memory_pointer_noop": lambda: cupy.cuda.MemoryPointer(cupy.cuda.memory.UnownedMemory(0, 0, None, 0), 0),
    }
    res = {"allocator": which, "cold": {}, "warm": {}, "stream_cold": None, "stream_warm": None}

    def measure(key, use):
        def body():
            if use:
                cupy.cuda.Device(0).use()
            for name, fn in pieces.items():
                try:
                    res[key][name] = timed(fn)
                except Exception as e:  # a piece this CuPy lacks
                    res[key][name] = "fails: %s" % e
            res["stream_" + key] = int(cur())
        t = threading.Thread(target=body)
        t.start()
        t.join()

    measure("cold", False)
    measure("warm", True)
    print(json.dumps(res))


if __name__ == "__main__":
    sys.exit(main())
