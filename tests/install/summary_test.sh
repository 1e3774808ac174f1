#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# summary_test.sh SOURCE_DIR [MAKE] — `make test` counts a skipped test
# (exit 77 under SKIP_RETURN_CODE) as skipped, not passed, and .ci/run still
# finds the closing line.  A small CTest project in a temporary directory
# has one passing, two skipped and one failing test; `make test PHASES=normal`
# runs it as its build directory (CMAKE=true: nothing is configured or built)
# and must end with "1 passed, 1 failed, 2 skipped" and a non-zero status.
set -u
src=$1 make=${2:-make}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gm_summary.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/p"
cat >"$tmp/p/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.16)
project(summary NONE)
enable_testing()
add_test(NAME passes COMMAND sh -c "exit 0")
add_test(NAME skips COMMAND sh -c "echo 'SKIP: nothing to do'; exit 77")
add_test(NAME skips_too COMMAND sh -c "exit 77")
add_test(NAME fails COMMAND sh -c "exit 1")
set_tests_properties(skips skips_too PROPERTIES SKIP_RETURN_CODE 77)
CMAKE
cmake -S "$tmp/p" -B "$tmp/b" >/dev/null || { echo "FAIL: cmake of the small project"; exit 1; }
unset MAKEFLAGS MFLAGS
"$make" -s -C "$src" test PHASES=normal BUILD="$tmp/b" CMAKE=true JOBS=1 >"$tmp/log" 2>&1
status=$?
last=$(grep -E '^[0-9]+ passed, ' "$tmp/log" | tail -n 1)
fail=0
[[ $last == "1 passed, 1 failed, 2 skipped" ]] || { echo "FAIL: closing line '$last', want '1 passed, 1 failed, 2 skipped'"; fail=1; }
[[ $status != 0 ]] || { echo "FAIL: make test exited 0 with a failed test"; fail=1; }
# .ci/run picks the closing line with its own pattern.
pattern=$(sed -n "s/^summary=\$(grep -E '\([^']*\)'.*/\1/p" "$src/.ci/run")
[[ -n $pattern ]] || { echo "FAIL: no summary pattern in .ci/run"; fail=1; }
grep -qE "$pattern" <<<"$last" || { echo "FAIL: .ci/run's pattern '$pattern' misses '$last'"; fail=1; }
[[ $fail == 0 ]] && echo "PASS: $last" || tail -n 30 "$tmp/log"
exit $fail
