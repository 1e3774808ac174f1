#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# gpumem broker's config reader: the shipped example is valid; every kind of
# mistake is refused with exit 2 and a message naming the file and line.
# usage: broker_config.sh GPUMEM [unused]
set -u
gpumem=$1
dir=$(mktemp -d "${TMPDIR:-/tmp}/gmcfg.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
fail=0
out=$("$gpumem" broker --config contrib/broker/broker.conf --check) \
    || { echo "FAIL: the shipped contrib/broker/broker.conf is refused"; fail=1; }
case $out in *"socket /run/gpumem/broker.sock"*) ;; *) echo "FAIL: --check said: $out"; fail=1;; esac
bad() { # what config-text
    printf '%b' "$2" >"$dir/c.conf"
    out=$("$gpumem" broker --config "$dir/c.conf" --check 2>&1); rc=$?
    if [ $rc != 2 ] || ! grep -q "c.conf:[0-9]" <<<"$out"; then
        echo "FAIL: $1: exit $rc, said: $out"; fail=1
    fi
}
bad "unknown key" "socket = /tmp/x.sock\ncolour = blue\n"
bad "bad size" "capacity = lots\n"
bad "bad quota" "[tenant a]\nquota = -1GiB\n"
bad "duplicate tenant" "[tenant a]\n[tenant a]\n"
bad "tenant named uid:" "[tenant uid:5]\n"
bad "bad tenant name" "[tenant a b]\n"
bad "bad section" "[tenants]\n"
bad "unknown user" "[tenant a]\nusers = no-such-user-here\n"
bad "unknown tenant key" "[tenant a]\nsize = 1\n"
bad "relative socket" "socket = rel.sock\n"
bad "no equals" "socket\n"
bad "bad mode" "socket_mode = 999\n"
bad "long line" "# $(head -c 2000 /dev/zero | tr '\0' x)\n"
printf 'socket = /tmp/x.sock\n[tenant a]\nusers = 0, root\nquota = 1GiB\nguaranteed = 512MiB\n' >"$dir/ok.conf"
out=$("$gpumem" broker --config "$dir/ok.conf" --check) || { echo "FAIL: a good config refused"; fail=1; }
case $out in *"tenant a: 2 users"*"quota 1.00 GiB, guaranteed 512.00 MiB"*) ;; *) echo "FAIL: --check said: $out"; fail=1;; esac
"$gpumem" broker --check >/dev/null 2>&1; [ $? = 2 ] || { echo "FAIL: no socket given is not usage error 2"; fail=1; }
"$gpumem" broker --config "$dir/none.conf" >/dev/null 2>&1; [ $? = 2 ] || { echo "FAIL: a missing config is not exit 2"; fail=1; }
"$gpumem" broker --help | grep -q "usage: gpumem broker" || { echo "FAIL: --help"; fail=1; }
[ $fail = 0 ] && echo "broker_config: ok"
exit $fail
