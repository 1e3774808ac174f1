# SPDX-License-Identifier: Apache-2.0
# Attacks the promise of `gpumem info --options` (tools/main.c, src/core/options.c):
# it prints every GPUMEM_* variable of the library's one options table, with
# its value here, whether that is the default or comes from the environment,
# and its one-line doc; a value the library would refuse is shown as INVALID
# (exit status 1) instead of stopping the listing, and the flag takes no
# other argument (exit status 2).
# usage: bash cli_info_options.sh GPUMEM HOLDER
set -u
GPUMEM=$1
for v in $(env | grep -o '^GPUMEM_[A-Z_]*'); do unset "$v"; done
. "$(dirname "${BASH_SOURCE[0]}")/cli_common.bash" # $tmp; fail MESSAGE, counted in $fails

"$GPUMEM" info --options >"$tmp/plain" 2>&1 || fail "defaults: exit status $?"
# Every row of the table is listed, once (names taken from the source).
names=$(grep -o '"GPUMEM_[A-Z_]*"' src/core/options.c | tr -d '"' | sort -u)
[ -n "$names" ] || fail "no GPUMEM_ names found in src/core/options.c"
for n in $names; do
    [ "$(grep -c "^$n " "$tmp/plain")" = 1 ] || fail "$n is not listed once"
done
grep -q '^GPUMEM_SIM_CAPACITY  *80GiB  *default  *device size' "$tmp/plain" ||
    fail "the sim capacity row: $(grep SIM_CAPACITY "$tmp/plain")"
grep -q '^GPUMEM_MONITOR_DIR  */dev/shm  *default ' "$tmp/plain" || fail "monitor dir default"
grep -q '^GPUMEM_TRACE  *(unset)  *default ' "$tmp/plain" || fail "trace unset"

GPUMEM_LIMIT=8GiB GPUMEM_LEAK_CHECK=error "$GPUMEM" info --options >"$tmp/env" 2>&1 ||
    fail "valid environment: exit status $?"
grep -q '^GPUMEM_LIMIT  *8GiB  *environment ' "$tmp/env" || fail "limit from the environment"
grep -q '^GPUMEM_LEAK_CHECK  *error  *environment ' "$tmp/env" || fail "leak check from the environment"
grep -q '^GPUMEM_DEVICE  *0  *default ' "$tmp/env" || fail "device stays default"

# A bad value is shown, not fatal to the listing; checking it arms nothing.
GPUMEM_BACKEND=gpu GPUMEM_MALLOC_FAIL_NTH=1 "$GPUMEM" info --options >"$tmp/bad" 2>&1
rc=$?
[ $rc = 1 ] || fail "a bad value: exit status $rc, not 1"
grep -q '^GPUMEM_BACKEND  *gpu  *INVALID ' "$tmp/bad" || fail "bad backend not flagged"
grep -q '^GPUMEM_MALLOC_FAIL_NTH  *1  *environment ' "$tmp/bad" || fail "fail-nth row"
[ "$(wc -l <"$tmp/bad")" = "$(wc -l <"$tmp/plain")" ] || fail "listing stopped at the bad value"

# The plain info command still refuses the same bad value, with its message.
GPUMEM_BACKEND=gpu "$GPUMEM" info >"$tmp/info" 2>&1
rc=$?
[ $rc = 2 ] || fail "info with a bad backend: exit status $rc, not 2"
grep -q 'GPUMEM_BACKEND="gpu" is not valid: auto | sim | cuda' "$tmp/info" || fail "info message: $(cat "$tmp/info")"

"$GPUMEM" info --options --device 0 >"$tmp/mixed" 2>&1
rc=$?
[ $rc = 2 ] || fail "--options with another argument: exit status $rc, not 2"
"$GPUMEM" help info | grep -q -- '--options' || fail "usage does not mention --options"

[ $fails = 0 ] && echo "cli_info_options: ok"
exit $((fails != 0))
