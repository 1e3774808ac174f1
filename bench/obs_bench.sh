#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/obs_bench.sh [RUNS] — the cost of observability per operation, on the
# sim backend: build/bench/obs_bench in each mode, RUNS times (default 5)
# interleaved, keeping per mode the run with the median calling-thread CPU
# ns/op.  Modes: off with GPUMEM_MONITOR=0 (nothing), off (the shared
# statistics segment only: the default), trace, trace.gz, leak.  Writes
# bench/results/DATE-sim-observe.{jsonl,md} and prints the table.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
[[ -x build/bench/obs_bench ]] || make >/dev/null
date=$(date -u +%F)
. bench/commit_id.sh
commit="$(gm_commit_id)"
machine="$(uname -sm), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
modes=("nothing" "off" "trace" "trace.gz" "leak")
for ((r = 0; r < runs; r++)); do
  for m in "${modes[@]}"; do
    if [[ $m == nothing ]]; then
      GPUMEM_MONITOR=0 build/bench/obs_bench off - | sed 's/"mode":"off"/"mode":"nothing"/' >>"$tmp/$m"
    else
      GPUMEM_MONITOR=1 build/bench/obs_bench "$m" - >>"$tmp/$m"
    fi
  done
done
out=bench/results/$date-sim-observe
: >"$out.jsonl"
for m in "${modes[@]}"; do
  python3 - "$tmp/$m" >>"$out.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rows.sort(key=lambda r: r["thread_cpu_ns_per_op"])
print(json.dumps(rows[len(rows) // 2]))
PY
done
python3 - "$out.jsonl" "$date" "$commit" "$machine" "$runs" >"$out.md" <<'PY'
import json, sys
path, date, commit, machine, runs = sys.argv[1:]
rows = {r["mode"]: r for r in map(json.loads, open(path))}
base, mon = rows["nothing"], rows["off"]
print(f"# Observability overhead — sim backend, {date}\n")
print(f"- command: `bench/obs_bench.sh {runs}` (build/bench/obs_bench MODE, {runs} interleaved runs, "
      "the run with the median calling-thread CPU time kept per mode; each run: 7 batches of "
      "200000 free+alloc pairs on a working set of 64 blocks, median batch)")
print(f"- code: commit {commit}")
print(f"- machine: {machine} (shared with other work while measured: wall times are noisy, "
      "thread CPU times are the steadier figure)")
print("- per operation = one gm_alloc or one gm_free; a steady state (no backend calls)\n")
print("| mode | wall ns/op | caller CPU ns/op | added on the caller vs nothing | process CPU ns/op (adds the trace writer) |")
print("|---|---:|---:|---:|---:|")
names = {"nothing": "nothing (GPUMEM_MONITOR=0)", "off": "monitor segment (default)",
         "trace": "monitor + trace (CSV)", "trace.gz": "monitor + trace (gzip)",
         "leak": "monitor + leak tracking"}
for m in ["nothing", "off", "trace", "trace.gz", "leak"]:
    r = rows[m]
    add = r["thread_cpu_ns_per_op"] - base["thread_cpu_ns_per_op"]
    print(f"| {names[m]} | {r['wall_ns_per_op']:.1f} | {r['thread_cpu_ns_per_op']:.1f} | "
          f"{add:+.1f} | {r['process_cpu_ns_per_op']:.1f} |")
t = rows["trace"]["thread_cpu_ns_per_op"] - mon["thread_cpu_ns_per_op"]
print(f"\nTrace recording alone (trace vs monitor, caller CPU): {t:+.1f} ns/op.")
PY
cat "$out.md"
