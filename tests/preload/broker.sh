#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# An unmodified program under the preload library gets its memory from a
# broker when GPUMEM_BROKER is set: the tenant's quota (8 MiB) acts as its
# limit (preload_app's "limit" checks), and the broker's books show the
# process while it runs and nothing after it exits.
# usage: broker.sh GPUMEM PRELOAD_LIB PRELOAD_APP
set -u
gpumem=$1 lib=$2 app=$3
dir=$(mktemp -d "${TMPDIR:-/tmp}/gmbrk.XXXXXX") || exit 1
trap 'kill "$bpid" 2>/dev/null; wait "$bpid" 2>/dev/null; rm -rf "$dir"' EXIT
"$gpumem" broker --socket "$dir/b.sock" --backend sim --capacity 64MiB --default-quota 8MiB \
    2>"$dir/log" &
bpid=$!
for _ in $(seq 500); do [ -S "$dir/b.sock" ] && break; sleep 0.01; done
[ -S "$dir/b.sock" ] || { echo "FAIL: the broker did not start"; cat "$dir/log"; exit 1; }
fail=0
GPUMEM_BROKER="$dir/b.sock" LD_PRELOAD="$lib" "$app" limit || { echo "FAIL: preload_app limit under the broker"; fail=1; }
used=$("$gpumem" top --json --broker "$dir/b.sock" | sed -n 's/.*"used": \([0-9]*\).*/\1/p')
[ "$used" = 0 ] || { echo "FAIL: the tenant holds '$used' bytes after the program exited"; fail=1; }
grep -q "serving $dir/b.sock" "$dir/log" || { echo "FAIL: no start line in the broker's log"; fail=1; }
kill -TERM "$bpid"; wait "$bpid"; rc=$?
[ "$rc" = 0 ] || { echo "FAIL: the broker exited with $rc on SIGTERM"; fail=1; }
[ -e "$dir/b.sock" ] && { echo "FAIL: the socket is left behind"; fail=1; }
[ $fail = 0 ] && echo "preload/broker: ok"
exit $fail
