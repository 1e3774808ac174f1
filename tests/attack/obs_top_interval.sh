#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# obs_top_interval.sh GPUMEM HOLDER — attacks `gpumem top --interval S`:
# nan, inf, negative, zero, empty, garbage and absurdly small or large values
# must be rejected with exit status 2 and a message naming the option (before,
# nan was accepted and top stopped refreshing).  Valid values are accepted.
set -u
gpumem=$1
dir=$(mktemp -d "${TMPDIR:-/tmp}/gm_obs_int.XXXXXX")
trap 'rm -rf "$dir"' EXIT
export GPUMEM_MONITOR_DIR=$dir
fail=0
for v in nan NaN -nan inf -inf infinity -1 0 -0 0.0 '' ' ' 1x abc 0x 1e-9 0.001 1e9 3601 '1 ' 0x10p999; do
  err=$(timeout 5 "$gpumem" top --once --interval "$v" 2>&1 >/dev/null)
  rc=$?
  if [[ $rc != 2 ]]; then echo "FAIL: --interval '$v' gave status $rc (want 2)"; fail=1; continue; fi
  grep -q -- "--interval" <<<"$err" || { echo "FAIL: --interval '$v': message does not name the option: $err"; fail=1; }
done
for v in 0.1 0.5 1 2.5 3600; do
  timeout 5 "$gpumem" top --once --interval "$v" >/dev/null 2>&1 || { echo "FAIL: --interval $v rejected"; fail=1; }
done
[[ $fail == 0 ]] && echo "obs_top_interval: ok"
exit $fail
