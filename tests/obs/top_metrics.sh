#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# top_metrics.sh GPUMEM HOLDER — start HOLDER (test_observe hold: a pool with
# 3 MiB + 5 MiB live), then check `gpumem top --once --json`, the table and
# `gpumem metrics` show it; that a stale segment of a dead process is ignored
# and removed; and that the segment is gone once the holder exits.
set -u
gpumem=$1 holder=$2
dir=$(mktemp -d "${TMPDIR:-/tmp}/gm_mon.XXXXXX")
export GPUMEM_MONITOR_DIR=$dir
fifo=$dir/in
mkfifo "$fifo"
fail=0
backend=${GPUMEM_TEST_BACKEND:-sim}
[[ $backend == auto ]] && backend=sim
check() { if ! grep -q -- "$2" <<<"$3"; then echo "FAIL: $1: no '$2' in:"; echo "$3"; fail=1; fi; }

"$holder" hold <"$fifo" >"$dir/out" &
hpid=$!
exec 3>"$fifo"                     # keeps the holder's stdin open
for _ in $(seq 100); do grep -q ready "$dir/out" 2>/dev/null && break; sleep 0.1; done
grep -q ready "$dir/out" || { echo "holder did not start"; cat "$dir/out"; exit 1; }

# Stale segments: one of a process that cannot exist (the holder's, with its
# pid patched), a copy under another pid's name, and junk.
python3 - "$dir/gpumem.$hpid" "$dir/gpumem.999999999" <<'PY'
import struct, sys
d = bytearray(open(sys.argv[1], "rb").read())
d[16:20] = struct.pack("<i", 999999999)
open(sys.argv[2], "wb").write(d)
PY
cp "$dir/gpumem.$hpid" "$dir/gpumem.$$"
printf 'junk' >"$dir/gpumem.12"

json=$("$gpumem" top --once --json)
check "top --json pid" "\"pid\":$hpid" "$json"
check "top --json allocated" '"allocated":8388608' "$json"
check "top --json backend" "\"backend\":\"$backend\"" "$json"
check "top --json command" '"command":"test_observe"' "$json"
[[ $(grep -o '"pid":' <<<"$json" | wc -l) == 1 ]] || { echo "FAIL: more than one process: $json"; fail=1; }
[[ -e $dir/gpumem.999999999 ]] && { echo "FAIL: the dead process's segment was not removed"; fail=1; }
[[ -e $dir/gpumem.$$ ]] && { echo "FAIL: the copied segment was not removed"; fail=1; }

table=$("$gpumem" top --once)
check "top table header" "ALLOCATED" "$table"
check "top table row" "$hpid test_observe" "$table"
check "top table bytes" "8.00 MiB" "$table"
# Not a terminal: top prints one snapshot and exits.
table2=$(timeout 10 "$gpumem" top </dev/null) || { echo "FAIL: top without a tty did not exit"; fail=1; }
check "top without tty" "$hpid" "$table2"

m=$("$gpumem" metrics)
check "metrics HELP" "# HELP gpumem_allocated_bytes" "$m"
check "metrics TYPE" "# TYPE gpumem_alloc_total counter" "$m"
check "metrics sample" "gpumem_allocated_bytes{device=\"0\",backend=\"$backend\",command=\"test_observe\",pid=\"$hpid\",pool=\"0\"} 8388608" "$m"
check "metrics counter" "gpumem_alloc_total{device=\"0\",backend=\"$backend\",command=\"test_observe\",pid=\"$hpid\",pool=\"0\"} 2" "$m"
m2=$("$gpumem" metrics --pid-labels)   # still accepted: the default now
[[ $m2 == "$m" ]] || { echo "FAIL: --pid-labels changed the output"; fail=1; }
"$gpumem" metrics --bogus >/dev/null 2>&1; [[ $? == 2 ]] || { echo "FAIL: bad option status"; fail=1; }

exec 3>&-
wait "$hpid" || { echo "FAIL: holder exited $?"; fail=1; }
[[ -e $dir/gpumem.$hpid ]] && { echo "FAIL: segment left after exit"; fail=1; }
json=$("$gpumem" top --once --json)
[[ $json == "[]" ]] || { echo "FAIL: after exit: $json"; fail=1; }
rm -rf "$dir"
[[ $fail == 0 ]] && echo "top/metrics: ok"
exit $fail
