#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `gpumem synth -o FILE` where FILE cannot be written: exit 1 with the file
# and the reason (strerror), and no summary line (before, it printed the
# summary "... -> FILE" as if the trace were written, then "cannot open FILE"
# without saying why).  A good FILE still gets the trace and the summary.
# usage: synth_output.sh GPUMEM [unused]
set -u
gpumem=$1
dir=$(mktemp -d "${TMPDIR:-/tmp}/gmsynth.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
fail=0
# fails FILE REASON [redirect-stdout-to]
fails() {
    local out rc
    if [ $# -ge 3 ]; then
        out=$(timeout 60 "$gpumem" synth kv_paged --scale 0.01 -o "$1" 2>&1 >"$3"); rc=$?
    else
        out=$(timeout 60 "$gpumem" synth kv_paged --scale 0.01 -o "$1" 2>&1); rc=$?
    fi
    [ $rc = 1 ] || { echo "FAIL: -o $1: exit $rc (want 1): $out"; fail=1; }
    grep -qF -- "$2" <<<"$out" || { echo "FAIL: -o $1: the reason '$2' is not said: $out"; fail=1; }
    grep -q -- "->\|ops" <<<"$out" && { echo "FAIL: -o $1: a summary line although nothing was written: $out"; fail=1; }
}
fails /nonexistent/x.csv "No such file or directory"
fails "$dir/a-directory/" "Is a directory"
mkdir "$dir/ro" && chmod 0500 "$dir/ro"
if [ "$(id -u)" != 0 ]; then fails "$dir/ro/x.csv" "Permission denied"; fi
if [ -w /dev/full ]; then
    fails /dev/full "No space left on device"
    fails - "No space left on device" /dev/full
fi
if "$gpumem" synth --help 2>&1 | grep -q "gzip"; then
    out=$(timeout 60 "$gpumem" synth kv_paged --scale 0.01 -o /nonexistent/x.csv.gz 2>&1); rc=$?
    if [ $rc = 1 ]; then
        fails /nonexistent/x.csv.gz "No such file or directory"
    elif [ $rc != 2 ]; then echo "FAIL: -o x.csv.gz: exit $rc: $out"; fail=1; fi
fi
out=$(timeout 60 "$gpumem" synth kv_paged --scale 0.01 -o "$dir/ok.csv" 2>&1) ||
    { echo "FAIL: a good -o failed: $out"; fail=1; }
[ -s "$dir/ok.csv" ] || { echo "FAIL: no trace written"; fail=1; }
grep -q -- "-> $dir/ok.csv" <<<"$out" || { echo "FAIL: no summary line: $out"; fail=1; }
[ $fail = 0 ] && echo "synth_output: ok"
exit $fail
