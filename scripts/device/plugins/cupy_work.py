# SPDX-License-Identifier: Apache-2.0
"""A CuPy workload under gpumem.cupy.enable(): FFTs, matrix products and
reductions of varying sizes, each checked against NumPy.  Prints one JSON
object (pass, checks, gpumem stats)."""
import json

import numpy as np
import cupy as cp
import gpumem
import gpumem.cupy

gpumem.cupy.enable()  # GPUMEM_CUPY_ALLOCATOR picks the path (auto: c where CuPy allows)
rng = np.random.default_rng(7)
checks = []
for n in (1000, 4096, 12345, 1 << 20):
    a = rng.standard_normal(n).astype(np.complex64)
    got = cp.asnumpy(cp.fft.fft(cp.asarray(a)))
    checks.append(("fft %d" % n, bool(np.allclose(got, np.fft.fft(a), rtol=1e-3, atol=1e-2 * np.sqrt(n)))))
for n in (64, 500, 1024, 3000):
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    got = cp.asnumpy(cp.asarray(a) @ cp.asarray(b))
    checks.append(("matmul %d" % n, bool(np.allclose(got, a @ b, rtol=1e-3, atol=1e-2 * np.sqrt(n)))))
for n in (10, 1 << 16, 1 << 24):
    a = rng.standard_normal(n).astype(np.float64)
    checks.append(("sum %d" % n, bool(np.isclose(float(cp.asarray(a).sum()), a.sum()))))
s = gpumem.stats(0)
cp.cuda.Device(0).synchronize()
oom = None
try:
    gpumem.set_limit(1 << 30, 0)
    cp.empty(4 << 30, dtype=cp.uint8)
except cp.cuda.memory.OutOfMemoryError as e:
    oom = type(e).__name__
finally:
    gpumem.set_limit(0, 0)
checks.append(("OutOfMemoryError over a 1 GiB limit", oom == "OutOfMemoryError"))
print(json.dumps({"pass": all(ok for _, ok in checks), "checks": checks,
                  "allocated_peak": s["allocated_peak"], "reserved_peak": s["reserved_peak"],
                  "alloc_count": s["alloc_count"], "cupy": cp.__version__, "path": gpumem.cupy.path()}))
