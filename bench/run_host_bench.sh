#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/run_host_bench.sh — build and run the host-memory benchmark
# (bench/host_bench.c: gpumem's pinned host pool and staged pageable copies
# against cudaMemcpy / cudaHostAlloc in the same process) and write
# bench/results/DATE-GPU-host.{md,json}.
#
# usage: bench/run_host_bench.sh            (from anywhere)
# Environment:
#   OUT        also copy the results and the log there (default: none)
#   BUILD_DIR  gpumem build directory (default build-device)
#   MAX_MIB    largest copy in MiB (default 1024)
#   SIM=1      build without CUDA and measure only gpumem's side on the sim
#              backend (a smoke test of this script; the figures are host
#              memmoves, not PCIe); results go to $OUT only, never to
#              bench/results.
# Needs: cmake, a C compiler, python3; without SIM=1 the CUDA toolkit
# (cuda_runtime.h and libcudart: nvcc on PATH, CUDA_HOME or /usr/local/cuda).
# The JSON has exactly the keys date, gpu, command, pageable_h2d_GBps,
# pageable_d2h_GBps, pinned_h2d_GBps, pinned_d2h_GBps,
# cudaMemcpy_pageable_h2d_GBps, cudaMemcpy_pageable_d2h_GBps,
# pinned_pool_pair_ns, cudaHostAlloc_pair_ns, host_overhead_ratio; the
# Markdown file also holds every per-size figure.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
. bench/lib.sh
gm_default BUILD_DIR="build-device" MAX_MIB="1024" SIM="0"
gm_workdir

echo "=== build gpumem ($BUILD_DIR)"
gm_build "$work/cmake.log" "$BUILD_DIR" gpumem_static -DCMAKE_BUILD_TYPE=RelWithDebInfo || exit 1

zl=-lz
grep -q 'GM_HAVE_ZLIB' "$BUILD_DIR/compile_commands.json" 2>/dev/null || zl=
bench="$BUILD_DIR/host_bench"
echo "=== build host_bench"
if [ "$SIM" = 1 ]; then
    ${CC:-cc} -O2 -std=c11 -D_GNU_SOURCE -DHOST_BENCH_NO_CUDA -Wall -Wextra -Iinclude \
        bench/host_bench.c "$BUILD_DIR/libgpumem.a" $zl -lpthread -ldl -lm -o "$bench" ||
        { echo "FAILED: host_bench build"; exit 1; }
    export GPUMEM_BACKEND=sim
    gpu="sim-$(nproc)core"
else
    gm_cuda_toolkit
    echo "CUDA toolkit: $cuda (libraries in $cudalib)"
    [ -f "$cuda/include/cuda_runtime.h" ] || echo "WARNING: no $cuda/include/cuda_runtime.h; set CUDA_HOME"
    ${CC:-cc} -O2 -std=c11 -D_GNU_SOURCE -Wall -Wextra -Iinclude -I"$cuda/include" \
        bench/host_bench.c "$BUILD_DIR/libgpumem.a" -L"$cudalib" -lcudart -Wl,-rpath,"$cudalib" \
        $zl -lpthread -ldl -lm -o "$bench" || { echo "FAILED: host_bench build"; exit 1; }
    export GPUMEM_BACKEND=cuda
    gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)"
    gpu="${gpu:-unknown-GPU}"
    nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current \
        --format=csv 2>/dev/null || true
fi
echo "host: $(nproc) cores; NUMA nodes online: $(cat /sys/devices/system/node/online 2>/dev/null || echo unknown)"
grep -E 'HugePages_(Total|Free)' /proc/meminfo 2>/dev/null || true
echo "transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo unknown)"

date="$(date -u +%Y-%m-%d)"
label="$(tr ' ' '-' <<<"$gpu")"
commit="$(gm_commit_id)"
command="bench/run_host_bench.sh"
[ "$SIM" = 1 ] && command="SIM=1 bench/run_host_bench.sh"

echo "=== run (largest copy $MAX_MIB MiB)"
start=$(date +%s)
timeout --kill-after=10 480 "$bench" --json "$work/full.json" --gpu "$gpu" --date "$date" \
    --command "$command" --max "$MAX_MIB" 2>&1 | tee "$work/log.txt"
st=${PIPESTATUS[0]}
echo "--- host_bench: exit $st, $(($(date +%s) - start)) s"
[ -f "$work/full.json" ] || { echo "FAILED: host_bench wrote no results"; exit 1; }

if [ "$SIM" = 1 ]; then base="$work/$date-$label-host"; else mkdir -p bench/results; base="bench/results/$date-$label-host"; fi
python3 - "$work/full.json" "$base" "$commit" "$st" <<'PY'
import json, sys
full, base, commit, status = sys.argv[1:]
d = json.load(open(full))
keys = ["date", "gpu", "command", "pageable_h2d_GBps", "pageable_d2h_GBps", "pinned_h2d_GBps",
        "pinned_d2h_GBps", "cudaMemcpy_pageable_h2d_GBps", "cudaMemcpy_pageable_d2h_GBps",
        "pinned_pool_pair_ns", "cudaHostAlloc_pair_ns", "host_overhead_ratio"]
json.dump({k: d.get(k) for k in keys}, open(base + ".json", "w"), indent=1)
x = d.get("details", {})
def row(name, key):
    v = x.get(key, {})
    return "| " + name + " | " + " | ".join("{:.2f}".format(v[s]) if s in v else "—" for s in sizes) + " |"
sizes = sorted({s for k, v in x.items() if isinstance(v, dict) for s in v}, key=int)
def human(s):
    s = int(s)
    return f"{s >> 30} GiB" if s >= 1 << 30 else f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB"
targets = [
    ("pageable H2D ≥ 45 GB/s", d["pageable_h2d_GBps"], d["pageable_h2d_GBps"] >= 45),
    ("pageable D2H ≥ 40 GB/s", d["pageable_d2h_GBps"], d["pageable_d2h_GBps"] >= 40),
    ("pinned pool pair ≤ 100 ns", d["pinned_pool_pair_ns"], d["pinned_pool_pair_ns"] <= 100),
    ("host held / requested at peak ≤ 1.05", d["host_overhead_ratio"], d["host_overhead_ratio"] <= 1.05),
]
L = [f"# Host memory — {d['gpu']}, {d['date']}\n",
     f"- command: `{d['command']}`; code: commit {commit}; host_bench exit status {status}, failures {x.get('failures')}",
     "- copies: median GB/s (5 runs at ≥ 256 MiB, 21 at ≥ 1 MiB, 101 below) after a warm-up; gpumem H2D timed until gm_stream_synchronize returns, D2H until gm_memcpy_d2h returns (complete); cudaMemcpy is synchronous",
     "- headline copy figures: the lower of 256 MiB and 1 GiB; pinned = cudaMemcpy from/to cudaHostAlloc memory (the ceiling)",
     "- pairs: 4 KiB alloc+free, median of 21 batches of 100 000 (gpumem) / 5 batches of 40 (cudaHostAlloc+cudaFreeHost)",
     "- overhead: pinned bytes held at peak / bytes requested at peak; 256 slots, sizes log-uniform 4 KiB–64 MiB, 20 000 random alloc/free on a fresh pool",
     "",
     "| figure | value |", "|---|---:|"]
for k in keys[3:]:
    L.append(f"| {k} | {d[k]} |")
L += ["", "| target | measured | met |", "|---|---:|:---:|"]
for name, v, ok in targets:
    L.append(f"| {name} | {v} | {'yes' if ok else 'NO'} |")
L += ["", "Per size (GB/s):", "", "| copy | " + " | ".join(human(s) for s in sizes) + " |",
      "|---" + "|---:" * len(sizes) + "|",
      row("gpumem staged H2D (pageable)", "gpumem_staged_h2d_GBps"),
      row("gpumem staged D2H (pageable)", "gpumem_staged_d2h_GBps"),
      row("cudaMemcpy pageable H2D", "cudaMemcpy_pageable_h2d_GBps"),
      row("cudaMemcpy pageable D2H", "cudaMemcpy_pageable_d2h_GBps"),
      row("gpumem from pinned pool H2D", "gpumem_pinned_pool_h2d_GBps"),
      row("gpumem to pinned pool D2H", "gpumem_pinned_pool_d2h_GBps"),
      row("cudaMemcpy pinned H2D", "cudaMemcpy_pinned_h2d_GBps"),
      row("cudaMemcpy pinned D2H", "cudaMemcpy_pinned_d2h_GBps"),
      "",
      f"Mixed-size pinned pair (4 KiB–1 MiB, 64 live): {x.get('pinned_pool_pair_mixed_ns')} ns. "
      f"Overhead workload: requested peak {x.get('overhead_requested_peak_bytes')} B, held peak "
      f"{x.get('overhead_held_peak_bytes')} B, {x.get('overhead_chunk_registrations')} chunk registrations."]
open(base + ".md", "w").write("\n".join(L) + "\n")
PY
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    cp "$base.md" "$base.json" "$OUT/" 2>/dev/null
    cp "$work/log.txt" "$OUT/host-bench-log.txt" 2>/dev/null
fi
echo
cat "$base.md"
exit "$st"
