#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# obs_metrics_unique.sh GPUMEM HOLDER — attacks the promise that `gpumem
# metrics` prints a valid Prometheus text file: two processes of the same
# command (two HOLDERs, both "test_observe") must not give the same series
# (metric name and label set) twice, which a textfile collector rejects.
# The output is parsed: every sample line is NAME{LABELS} VALUE, each
# NAME{LABELS} appears once, each metric's samples follow its # TYPE line.
set -u
gpumem=$1 holder=$2
dir=$(mktemp -d "${TMPDIR:-/tmp}/gm_obs_uniq.XXXXXX")
export GPUMEM_MONITOR_DIR=$dir
fail=0
pids=()
for k in 1 2; do
  mkfifo "$dir/in$k"
  "$holder" hold <"$dir/in$k" >"$dir/out$k" &
  pids+=($!)
  eval "exec $((k + 2))>\"$dir/in$k\""
done
for k in 1 2; do
  for _ in $(seq 100); do grep -q ready "$dir/out$k" 2>/dev/null && break; sleep 0.1; done
  grep -q ready "$dir/out$k" || { echo "holder $k did not start"; fail=1; }
done
"$gpumem" metrics >"$dir/metrics.txt" || { echo "FAIL: gpumem metrics status"; fail=1; }
python3 - "$dir/metrics.txt" <<'PY' || fail=1
import re, sys
text = open(sys.argv[1]).read()
seen, bad, typed = set(), [], set()
for line in text.splitlines():
    if line.startswith("# TYPE "):
        typed.add(line.split()[2]); continue
    if line.startswith("#") or not line: continue
    m = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*",?)*\})? (\S+)', line)
    if not m: bad.append("not a sample line: %r" % line); continue
    name, labels = m.group(1), m.group(2) or ""
    key = (name, tuple(sorted(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', labels))))
    if key in seen: bad.append("duplicate series: %s%s" % (name, labels))
    seen.add(key)
    if name not in typed: bad.append("sample before its TYPE: " + name)
if sum(1 for k in seen if k[0] == "gpumem_allocated_bytes") != 2: bad.append("want 2 allocated series")
for b in bad[:10]: print("FAIL:", b)
sys.exit(1 if bad else 0)
PY
exec 3>&- 4>&-
for p in "${pids[@]}"; do wait "$p"; done
rm -rf "$dir"
[[ $fail == 0 ]] && echo "obs_metrics_unique: ok"
exit $fail
