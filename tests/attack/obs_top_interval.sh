#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# obs_top_interval.sh GPUMEM HOLDER — attacks `gpumem top --interval S`:
# nan, inf, negative, zero, empty, garbage and absurdly small or large values,
# as --interval V and --interval=V, with --once and in the live view, must be
# rejected with exit status 2 and a message naming the option and the range
# (before, nan was accepted and top stopped refreshing).  Valid values are
# accepted, and the live view on a (pseudo-)terminal keeps refreshing.
set -u
gpumem=$1
dir=$(mktemp -d "${TMPDIR:-/tmp}/gm_obs_int.XXXXXX")
trap 'rm -rf "$dir"' EXIT
export GPUMEM_MONITOR_DIR=$dir
fail=0
bad=(nan NaN -nan +nan 'nan(1)' inf -inf +inf infinity -infinity -1 -0.1 0 -0 0.0 '' ' ' 1x abc 0x
     1e-9 0.001 0.0999 1e-400 0x1p-4 1e9 3601 3600.001 1e308 1e999 -1e999 '1 ' 0x10p999)
for v in "${bad[@]}"; do
  for form in split joined; do
    if [[ $form == split ]]; then err=$(timeout 5 "$gpumem" top --once --interval "$v" 2>&1 >/dev/null)
    else err=$(timeout 5 "$gpumem" top --once "--interval=$v" 2>&1 >/dev/null); fi
    rc=$?
    if [[ $rc != 2 ]]; then echo "FAIL: --interval '$v' ($form) gave status $rc (want 2)"; fail=1; continue; fi
    grep -q -- "--interval" <<<"$err" || { echo "FAIL: --interval '$v': message does not name the option: $err"; fail=1; }
    grep -q -- "0.1 to 3600" <<<"$err" || { echo "FAIL: --interval '$v': message does not give the range: $err"; fail=1; }
  done
  # Refused in the live view too (not only with --once), before any refresh.
  err=$(timeout 5 "$gpumem" top --interval "$v" 2>&1 </dev/null | head -c 2000)
  grep -q -- "--interval" <<<"$err" || { echo "FAIL: live --interval '$v' not refused: ${err:0:200}"; fail=1; }
done
for v in 0.1 0.5 1 2.5 3600 1e3 0x1p-3; do
  timeout 5 "$gpumem" top --once --interval "$v" >/dev/null 2>&1 || { echo "FAIL: --interval $v rejected"; fail=1; }
done
# The live view on a terminal keeps refreshing at a valid interval (what nan
# broke: poll's timeout became negative and top waited for a key forever).
# Under a pseudo-terminal for 10 s at 0.1 s: at least 3 screens (a stuck
# view draws one; the margin is for a loaded machine's slow start).
if command -v script >/dev/null 2>&1; then
  # (stdin a pipe that stays open and silent: an end of input would send a key)
  # timeout --foreground keeps top in the terminal's foreground process group:
  # where script's shell does not exec its command, a plain timeout moves top
  # into a group of its own, and top's first tcsetattr stops it (SIGTTOU).
  screens=$(sleep 11 | GPUMEM_BACKEND=sim timeout 60 script -qfec "timeout --foreground -s INT 10 '$gpumem' top --interval 0.1" /dev/null 2>/dev/null |
            grep -c "gpumem top .* every 0.1 s")
  if [[ ${screens:-0} -lt 3 ]]; then echo "FAIL: top --interval 0.1 drew ${screens:-0} screens in 10 s"; fail=1; fi
  # Started outside the terminal's foreground group (a shell that does not
  # exec, then a plain timeout, which makes a process group of its own), top
  # still refreshes instead of stopping at its first change of terminal modes.
  screens=$(sleep 6 | GPUMEM_BACKEND=sim timeout 60 script -qfec "true; timeout -s INT 5 '$gpumem' top --interval 0.1; true" /dev/null 2>/dev/null |
            grep -c "gpumem top .* every 0.1 s")
  if [[ ${screens:-0} -lt 3 ]]; then echo "FAIL: top in a background group drew ${screens:-0} screens in 5 s"; fail=1; fi
fi
[[ $fail == 0 ]] && echo "obs_top_interval: ok"
exit $fail
