#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# trace_roundtrip.sh GPUMEM — record a replay of the first 3000 rows of the
# sample trace with GPUMEM_TRACE (plain and gzip), replay the recording, and
# compare: the same live peak and reserved peak, every op accounted for (the
# recording adds the frees of what the part leaves live), no trace bugs.
set -u
gpumem=$1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gm_rt.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
field() { sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p" <<<"$2"; }
# A part of the sample keeps this quick in the sanitizer builds (GM_DEBUG=3
# validates the whole pool after every operation).
gzip -dc data/sample.csv.gz | head -n 3001 >"$tmp/part.csv"
orig=$("$gpumem" replay --json "$tmp/part.csv") || { echo "replay of the sample failed"; exit 1; }
for ext in csv csv.gz; do
  GPUMEM_TRACE="$tmp/rec.$ext" "$gpumem" replay --json "$tmp/part.csv" >/dev/null || { echo "recording replay failed"; fail=1; continue; }
  back=$("$gpumem" replay --json "$tmp/rec.$ext") || { echo "replay of the recording ($ext) failed"; fail=1; continue; }
  for f in live_peak reserved_peak; do
    if [[ $(field $f "$orig") != $(field $f "$back") ]]; then
      echo "$ext: $f differs: $(field $f "$orig") vs $(field $f "$back")"; fail=1
    fi
  done
  o=$(field ops "$orig"); b=$(field ops "$back")
  # The recording also holds the frees of what the sample leaves live.
  if (( b < o || b > o + 3000 )); then echo "$ext: ops $b, sample has $o"; fail=1; fi
  for f in failed_allocs unknown_frees dup_allocs allocate_failure_rows; do
    if [[ $(field $f "$back") != 0 ]]; then echo "$ext: $f = $(field $f "$back")"; fail=1; fi
  done
  echo "$ext: ops $o -> $b, live_peak $(field live_peak "$back"), reserved_peak $(field reserved_peak "$back")"
done
[[ $fail == 0 ]] && echo "trace round trip: ok"
exit $fail
