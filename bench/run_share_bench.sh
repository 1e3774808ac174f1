#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/run_share_bench.sh — build and run the sharing benchmark
# (bench/share_bench.c: gm_share_* between real processes — import latency,
# weight sync, reclaim after kill -9 on either side, read-only enforcement,
# and cuIpcOpenMemHandle for comparison) and write
# bench/results/DATE-GPU-share.{md,json}.
#
# usage: bench/run_share_bench.sh            (from anywhere)
# Environment:
#   OUT        also copy the results and the log there (default: none)
#   BUILD_DIR  gpumem build directory (default build-device)
#   QUICK=1    weight sync at 1 GiB instead of 8 GiB (SHARE_BENCH_QUICK=1)
#   GM_COMMIT  the commit recorded (default: HEAD's short hash, +changes when the tree differs; bench/commit_id.sh)
# The bench runs with GPUMEM_BACKEND unset (auto: cuda where an NVIDIA
# driver is installed).  When the pool ends up on another backend (no
# driver: the sim) the results go to $OUT only, never to bench/results.
# Needs: cmake, a C compiler, python3 (to read the GPU name back from the
# JSON when nvidia-smi is missing).  No CUDA toolkit: the legacy-IPC figure
# loads libcuda.so.1 with dlopen.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
BUILD_DIR="${BUILD_DIR:-build-device}"
QUICK="${QUICK:-${SHARE_BENCH_QUICK:-0}}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "=== build share_bench ($BUILD_DIR)"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$work/cmake.log" 2>&1 &&
    cmake --build "$BUILD_DIR" -j "$(nproc)" --target share_bench >>"$work/cmake.log" 2>&1 ||
    { tail -n 40 "$work/cmake.log"; echo "FAILED: share_bench build"; exit 1; }
bench="$BUILD_DIR/bench/share_bench"
[ -x "$bench" ] || { echo "FAILED: no $bench after the build"; exit 1; }

nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>/dev/null || true
echo "host: $(nproc) cores; open files limit $(ulimit -n) (hard $(ulimit -Hn))"

date="$(date -u +%Y-%m-%d)"
# GM_COMMIT overrides the label (a copy of the tree without its git history).
. bench/commit_id.sh
GM_COMMIT="$(gm_commit_id)"
export GM_COMMIT
command="bench/run_share_bench.sh"
quick_env=()
if [ "$QUICK" = 1 ]; then
    command="QUICK=1 $command"
    quick_env=(SHARE_BENCH_QUICK=1)
fi

echo "=== run (weight sync $([ "$QUICK" = 1 ] && echo 1 || echo 8) GiB)"
start=$(date +%s)
env -u GPUMEM_BACKEND -u SHARE_BENCH_QUICK "${quick_env[@]}" \
    timeout --kill-after=10 1500 "$bench" --json "$work/share.json" --md "$work/share.md" \
    --command "$command" 2>&1 | tee "$work/log.txt"
st=${PIPESTATUS[0]}
echo "--- share_bench: exit $st, $(($(date +%s) - start)) s"
[ -f "$work/share.json" ] || { echo "FAILED: share_bench wrote no results"; exit 1; }
[ "$st" = 0 ] || echo "WARNING: share_bench failed (exit $st): see the errors in the JSON and the log"

backend="$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get("backend") or "")' "$work/share.json" 2>/dev/null)"
gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)"
[ -n "$gpu" ] || gpu="$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get("gpu") or "")' "$work/share.json" 2>/dev/null)"
gpu="${gpu:-unknown-GPU}"
label="$(tr ' ' '-' <<<"$gpu")"
[ "$backend" = cuda ] || label="${backend:-unknown}-$(nproc)core"

if [ "$backend" = cuda ]; then
    mkdir -p bench/results
    base="bench/results/$date-$label-share"
else
    echo "WARNING: the bench ran on the '${backend:-unknown}' backend, not cuda: results go to \$OUT only"
    base="$work/$date-$label-share"
fi
cp "$work/share.json" "$base.json" && cp "$work/share.md" "$base.md" ||
    { echo "FAILED: cannot write $base.{json,md}"; exit 1; }
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    cp "$base.md" "$base.json" "$OUT/" 2>/dev/null
    cp "$work/log.txt" "$OUT/share-bench-log.txt" 2>/dev/null
fi
echo
echo "=== $base.md"
cat "$base.md"
exit "$st"
