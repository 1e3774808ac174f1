# SPDX-License-Identifier: Apache-2.0
"""The cost of one CuPy allocation + free as Python sees it, under CuPy's own
memory pool or gpumem (its C path or its Python path), for a few sizes.

    python3 bench/cupy_pair.py pool|c|python [--pairs N] [--reps R]

Each size: 2000 warm-up pairs, then R repetitions of N pairs of
`m = cupy.cuda.alloc(size); del m` (the allocator call CuPy's arrays make,
and the release of the memory pointer); the median repetition, in
microseconds per pair, is printed as one JSON object.  Run each allocator in
a fresh process (CuPy's allocator is per process)."""
import argparse
import json
import statistics
import sys
import time

SIZES = (512, 64 << 10, 2 << 20)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("allocator", choices=("pool", "c", "python"))
    ap.add_argument("--pairs", type=int, default=100000)
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
    import cupy
    if a.allocator != "pool":
        import gpumem.cupy
        gpumem.cupy.enable(path=a.allocator)
    alloc = cupy.cuda.alloc
    res = {"allocator": a.allocator, "cupy": cupy.__version__, "pair_us": {}}
    for size in SIZES:
        for _ in range(2000):
            m = alloc(size)
            del m
        reps = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            for _ in range(a.pairs):
                m = alloc(size)
                del m
            reps.append((time.perf_counter() - t0) / a.pairs * 1e6)
        res["pair_us"][str(size)] = round(statistics.median(reps), 4)
    cupy.cuda.Device().synchronize()
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
