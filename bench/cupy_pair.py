# SPDX-License-Identifier: Apache-2.0
"""The cost of one CuPy allocation + free as Python sees it, under CuPy's own
memory pool or gpumem (its C path or its Python path), for a few sizes.

    python3 bench/cupy_pair.py pool|c|python [--pairs N] [--reps R]

Each size: 2000 warm-up pairs, then R repetitions of N pairs of
`m = cupy.cuda.alloc(size); del m` (the allocator call CuPy's arrays make,
and the release of the memory pointer); the median repetition, in
microseconds per pair, is printed as one JSON object.  Run each allocator in
a fresh process (CuPy's allocator is per process).

"cold_pair_us" is the same for 64 KiB measured first, before the thread has
made a device current (cupy.cuda.Device(0).use(), which any kernel launch or
array creation also does).  gpumem's C path makes the device current on a
thread where nothing is, at its first allocation there, as CuPy's own pool's
cudaMalloc does; without that every CUDA runtime call CuPy makes per
allocation took a slow path, 3.2-5.2 microseconds a pair in all (H200 and
H100, 2026-11-26; scripts/device/plugins/cupy_cold.py times the pieces).
"pair_us" is measured after it."""
import argparse
import json
import statistics
import sys
import time

SIZES = (512, 64 << 10, 2 << 20)


def run(alloc, size, pairs, reps):
    for _ in range(2000):
        m = alloc(size)
        del m
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(pairs):
            m = alloc(size)
            del m
        times.append((time.perf_counter() - t0) / pairs * 1e6)
    return round(statistics.median(times), 4)


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
    res["cold_pair_us"] = run(alloc, 64 << 10, a.pairs, a.reps)
    cupy.cuda.Device(0).use()
    for size in SIZES:
        res["pair_us"][str(size)] = run(alloc, size, a.pairs, a.reps)
    cupy.cuda.Device().synchronize()
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
