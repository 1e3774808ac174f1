#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/run_offload_bench.sh — build and run the offload benchmark
# (bench/offload_bench.c: gm_offload / gm_restore of a 1 GiB and a 16 GiB tag,
# warm and cold, against the pinned DMA ceiling; the device memory an offload
# gives back) and write bench/results/DATE-GPU-offload.{json,md}; prints the
# table.
#
# usage: bench/run_offload_bench.sh            (from anywhere)
# Environment:
#   BUILD_DIR  the build directory of its own (default build-offload; configured
#              Release with cmake, only offload_bench is built)
#   SIZES      tag sizes (default 1GiB,16GiB); BLOCK block size (256MiB);
#              REPS warm cycles per size (5); MIXED the mixed-size tag (default:
#              the smallest size; 0: none)
#   OUT        also copy the results and the log there (default: none; off the
#              cuda backend the results go to OUT, else BUILD_DIR/bench-results)
#   GM_COMMIT  the commit recorded (default: HEAD's short hash, +changes when the tree differs; bench/commit_id.sh)
#   BENCH_TIMEOUT  seconds for the bench (300); it skips a size that might not
#              end 20 s before then
#   PYTHON     python3 (reads the JSON for the file name and the summary)
# The bench runs with GPUMEM_BACKEND as given (unset: auto, cuda where an
# NVIDIA driver is installed; GPUMEM_BACKEND=sim with SIZES=64MiB,256MiB for a
# smoke run).  Results of another backend than cuda never go to bench/results.
# On an H100 about a minute (16 GiB of pinned host memory is registered once).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
. bench/lib.sh
gm_default BUILD_DIR="build-offload" PYTHON="python3" SIZES="1GiB,16GiB" BLOCK="256MiB" REPS="5" \
    MIXED="" BENCH_TIMEOUT="300"
gm_workdir

echo "=== build ($BUILD_DIR, Release)"
gm_build "$work/build.log" "$BUILD_DIR" offload_bench -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=ON -DGM_VALGRIND=OFF ||
    exit 1
bench="$BUILD_DIR/bench/offload_bench"
[ -x "$bench" ] || { echo "FAILED: no $bench after the build"; exit 1; }
command -v "$PYTHON" >/dev/null || { echo "FAILED: no $PYTHON (needed to read the results)"; exit 1; }

gm_banner "backend ${GPUMEM_BACKEND:-auto}"

GM_COMMIT="$(gm_commit_id)"
export GM_COMMIT
command="bench/run_offload_bench.sh"
args=(--sizes "$SIZES" --block "$BLOCK" --reps "$REPS")
[ "$SIZES" != "1GiB,16GiB" ] && command="SIZES=$SIZES $command"
[ "$BLOCK" != "256MiB" ] && command="BLOCK=$BLOCK $command"
[ "$REPS" != 5 ] && command="REPS=$REPS $command"
if [ -n "$MIXED" ]; then
    args+=(--mixed "$MIXED")
    command="MIXED=$MIXED $command"
fi
[ -n "${GPUMEM_BACKEND:-}" ] && command="GPUMEM_BACKEND=$GPUMEM_BACKEND $command"

gm_run_bench "offload_bench ${args[*]}" "$work/offload" env -u GPUMEM_BROKER -u GPUMEM_LIMIT -u GPUMEM_EVICT \
    timeout --kill-after=10 "$BENCH_TIMEOUT" "$bench" --json "$work/offload.json" --md "$work/offload.md" \
    --command "$command" --deadline "$((BENCH_TIMEOUT - 20))" "${args[@]}"

# ---- where the results go -----------------------------------------------------------
gm_publish offload "$work/offload" "$work/log.txt"

echo
echo "=== $base.md written (and .json)"
echo "=== summary"
"$PYTHON" - "$base.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
for k in ("pinned_ceiling_GBps", "offload_GBps", "restore_GBps", "offload_cold_GBps", "restore_first_GBps",
          "offload_mixed_GBps", "restore_mixed_GBps", "gpu_freed_fraction", "gpu_freed_fraction_reserved",
          "offload_of_ceiling", "restore_of_ceiling", "verified"):
    print("%-28s %s" % (k, json.dumps(d.get(k))))
det = d.get("details", {})
runs = dict(det.get("runs", {}))
if det.get("mixed"):
    runs["mixed"] = det["mixed"]
print("%-28s %s" % ("warm_host_register_calls", json.dumps({k: r.get("warm_host_register_calls")
                                                            for k, r in runs.items()})))
errs = d.get("errors", [])
print("errors: %d%s" % (len(errs), "".join("\n  " + e for e in errs)))
EOF
exit "$st"
