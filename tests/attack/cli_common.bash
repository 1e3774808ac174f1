# SPDX-License-Identifier: Apache-2.0
# Sourced (not run: no .sh, so ctest does not take it for a test) by the CLI
# attack scripts that count failures: $tmp, a scratch folder removed at exit,
# and `fail MESSAGE`, which prints it and counts it in $fails.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
