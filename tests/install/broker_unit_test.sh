#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# broker_unit_test.sh BUILD_DIR CMAKE — the systemd unit `cmake --install`
# puts in <prefix>/share/gpumem/broker/ starts the gpumem of that prefix,
# whatever the prefix: a plain install into a temporary prefix, and a staged
# one (DESTDIR) whose unit names the final prefix, not the staging root.
set -u
build=$1 cmake=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gm_unit.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { # UNIT BINDIR
  local want="ExecStart=$2/gpumem broker --config /etc/gpumem/broker.conf"
  if [[ ! -f $1 ]]; then echo "FAIL: no unit at $1"; fail=1; return; fi
  if grep -qxF "$want" "$1"; then echo "ok: $want"
  else echo "FAIL: $1 does not say '$want':"; grep -n '^ExecStart' "$1"; fail=1; fi
  if grep -q '@' "$1"; then echo "FAIL: $1 keeps an unconfigured @VARIABLE@"; fail=1; fi
}
"$cmake" --install "$build" --prefix "$tmp/prefix" >"$tmp/log" 2>&1 || { cat "$tmp/log"; echo "FAIL: cmake --install"; exit 1; }
check "$tmp/prefix/share/gpumem/broker/gpumem-broker.service" "$tmp/prefix/bin"
DESTDIR=$tmp/stage "$cmake" --install "$build" --prefix /opt/gpumem >"$tmp/log" 2>&1 || { cat "$tmp/log"; echo "FAIL: DESTDIR install"; exit 1; }
check "$tmp/stage/opt/gpumem/share/gpumem/broker/gpumem-broker.service" /opt/gpumem/bin
[[ $fail == 0 ]] && echo "PASS: the broker's unit names the installed gpumem"
exit $fail
