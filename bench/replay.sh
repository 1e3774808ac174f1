#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/replay.sh — replay the real traces and the five synthetic workloads
# through gpumem and write the results, dated, under bench/results/.
#
# usage: bench/replay.sh [--backend sim|cuda] [--repeat N] [--runs N] [--label NAME] [TRACE_DIR]
#   TRACE_DIR  folder of RMM traces (*.csv, *.csv.gz) to replay besides the
#              synthetic ones; default ../shared/traces when it exists.
#   --runs     replays of the whole set; per trace, the run with the median
#              allocator ns/op is kept (timings vary from run to run; the
#              memory figures and call counts do not) (default 3)
#   --label    machine name in the file names (default: sim-<hostname cores>
#              for sim, the GPU name for cuda).
# Writes bench/results/DATE-LABEL-replay.jsonl (one JSON object per trace, as
# `gpumem replay --json` prints it) and DATE-LABEL-replay.md (a table plus the
# command, date and machine).  Needs build/gpumem (make) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
backend=sim repeat=3 runs=3 label="" tdir=""
while [ $# -gt 0 ]; do
    case "$1" in
    --backend) backend=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --label) label=$2; shift 2 ;;
    -*) echo "usage: bench/replay.sh [--backend sim|cuda] [--repeat N] [--label NAME] [TRACE_DIR]" >&2; exit 2 ;;
    *) tdir=$1; shift ;;
    esac
done
gm_trace_cli bench/replay.sh
if [ -z "$label" ]; then
    if [ "$backend" = cuda ]; then
        label=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 | tr ' ' '-' || true)
        label=${label:-cuda}
    else
        label="sim-$(nproc)core"
    fi
fi
date=$(date -u +%Y-%m-%d)
out="bench/results/$date-$label-replay"
gm_workdir
traces=()
gm_trace_list csv.gz
mkdir -p bench/results
cmd="$cli replay --backend $backend --repeat $repeat --json TRACES"
for r in $(seq "$runs"); do
    "$cli" replay --backend "$backend" --repeat "$repeat" --json "${traces[@]}" >"$work/run$r.jsonl"
done
python3 - "$out.jsonl" "$work"/run*.jsonl <<'PY'
import json, sys
runs = [[json.loads(l) for l in open(p) if l.strip()] for p in sys.argv[2:]]
with open(sys.argv[1], "w") as f:
    for per_trace in zip(*runs):
        per_trace = sorted(per_trace, key=lambda d: d["allocator_ns_per_op"])
        f.write(json.dumps(per_trace[len(per_trace) // 2], separators=(",", ":")) + "\n")
PY
. bench/commit_id.sh
commit="$(gm_commit_id)"
machine="$(uname -sm), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ *//')"
if [ "$backend" = cuda ]; then
    machine="$machine; GPU $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n1)"
fi
python3 - "$out.jsonl" "$out.md" "$date" "$cmd" "$machine" "$backend" "$commit" "$runs" <<'PY'
import json, sys, os
src, dst, date, cmd, machine, backend, commit, runs = sys.argv[1:9]
rows = [json.loads(l) for l in open(src) if l.strip()]
# Keep file names only: where a trace sat on the machine says nothing.
for d in rows:
    d["trace"] = os.path.basename(d["trace"])
with open(src, "w") as f:
    for d in rows:
        f.write(json.dumps(d, separators=(",", ":")) + "\n")
with open(dst, "w") as f:
    f.write(f"# gpumem replay — {backend} backend, {date}\n\n")
    f.write(f"- command: `bench/replay.sh --backend {backend} --runs {runs}` (runs `{cmd}` {runs} times and keeps, per trace, the run with the median allocator ns/op; synthetic traces from `gpumem synth KIND --seed 1`)\n")
    f.write(f"- code: commit {commit}\n")
    f.write(f"- machine: {machine}\n")
    f.write("- ratio: reserved peak / live peak over all passes; ns/op columns: wall time of the replay loop per operation, and the same less the time inside backend calls (allocator); steady: passes 2..N only\n\n")
    f.write("| trace | ops/pass | live peak GB | reserved peak GB | ratio | alloc ns/op | steady alloc ns/op | total ns/op | backend calls | steady calls | modeled device ms (sim) |\n")
    f.write("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    for d in rows:
        name = os.path.basename(d["trace"]).replace(".csv.gz", "").replace(".csv", "")
        calls = sum(d["backend_calls"].values())
        sa = d.get("steady_allocator_ns_per_op")
        dev = f"{d['modeled_device_ms']:.1f}" if backend == "sim" else "—"
        f.write(f"| {name} | {d['ops']} | {d['live_peak']/1e9:.2f} | {d['reserved_peak']/1e9:.2f} | {d['ratio']:.3f} | {d['allocator_ns_per_op']:.1f} | {'' if sa is None else f'{sa:.1f}'} | {d['ns_per_op']:.1f} | {calls} | {d['steady_backend_calls']} | {dev} |\n")
print(open(dst).read())
PY
echo "wrote $out.md and $out.jsonl"
