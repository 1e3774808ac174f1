#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/replay_compare.sh — the deterministic replay figures of a build, for
# checking that a change preserves behaviour to the digit.
#
# usage: bench/replay_compare.sh [-o FILE] [TRACE_DIR]
#        bench/replay_compare.sh --diff BEFORE.jsonl AFTER.jsonl
# The first form replays (`gpumem replay --repeat 3 --json --backend sim`)
# the real traces in TRACE_DIR (default ../shared/traces when it exists) and
# the five synthetic workloads (`gpumem synth KIND --seed 1`), and writes one
# JSON line per trace with the figures that do not depend on timing: ops,
# live and reserved peaks, backend calls per kind, steady-state backend calls,
# failed allocations, plus the SHA-256 of each synthetic trace (so a change to
# the generator shows too).  The second form compares two such files and
# exits 1 on any difference, printing it.  Needs build/gpumem (or $GPUMEM)
# and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
if [ "${1:-}" = --diff ]; then
    python3 - "$2" "$3" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
b = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
bad = 0
if [x["trace"] for x in a] != [x["trace"] for x in b]:
    print("different trace lists"); sys.exit(1)
for x, y in zip(a, b):
    for k in sorted(set(x) | set(y)):
        if x.get(k) != y.get(k):
            print(f"{x['trace']}: {k}: {x.get(k)} -> {y.get(k)}"); bad += 1
print(f"{len(a)} traces, {bad} differences")
sys.exit(1 if bad else 0)
PY
    exit $?
fi
out=/dev/stdout tdir=""
while [ $# -gt 0 ]; do
    case "$1" in
    -o) out=$2; shift 2 ;;
    -*) echo "usage: bench/replay_compare.sh [-o FILE] [TRACE_DIR] | --diff A B" >&2; exit 2 ;;
    *) tdir=$1; shift ;;
    esac
done
gm_trace_cli bench/replay_compare.sh
gm_workdir
traces=(data/sample.csv.gz)
gm_trace_list csv
"$cli" replay --backend sim --repeat 3 --json "${traces[@]}" >"$work/run.jsonl" 2>/dev/null
python3 - "$work/run.jsonl" "$work" >"$out" <<'PY'
import hashlib, json, os, sys
keep = ["ops", "repeat", "live_peak", "reserved_peak", "backend_calls",
        "steady_backend_calls", "failed_allocs", "unknown_frees", "dup_allocs",
        "double_frees", "free_size_mismatches"]
work = sys.argv[2]
for line in open(sys.argv[1]):
    if not line.strip(): continue
    r = json.loads(line)
    t = r["trace"]
    o = {"trace": os.path.basename(t)}
    o.update({k: r.get(k) for k in keep})
    if t.startswith(work):
        o["sha256"] = hashlib.sha256(open(t, "rb").read()).hexdigest()
    print(json.dumps(o, sort_keys=True))
PY
