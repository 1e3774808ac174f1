#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# nozlib_test.sh SOURCE_DIR [MAKE] — zlib is optional: `make demo` with
# CMAKE_ARGS=-DGM_WITH_ZLIB=OFF, in a temporary build directory, builds the
# CLI (nothing linked to libz, gpumem.pc without -lz) and replays the sample
# trace through an uncompressed copy.  Costs one build of the library and the
# CLI without LTO (about 10 s of CPU); not run in sanitizer builds.
set -u
src=$1 make=${2:-make}
command -v gzip >/dev/null 2>&1 || { echo "SKIP: no gzip to decompress the sample trace"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gm_nozlib.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
unset MAKEFLAGS MFLAGS
b=$tmp/build
fail=0
bad() { echo "FAIL: $*"; fail=1; }
"$make" -s -C "$src" demo BUILD="$b" JOBS=1 CMAKE_ARGS="-DGM_WITH_ZLIB=OFF -DGM_LTO=OFF" >"$tmp/log" 2>&1 ||
  { cat "$tmp/log"; echo "FAIL: make demo without zlib"; exit 1; }
cat "$tmp/log" | grep -v '^\[' | tail -n 6
grep -q '^GM_HAVE_ZLIB:INTERNAL=0$' "$b/CMakeCache.txt" || bad "the build says it has zlib"
grep -qE "^$b/sample.csv +sim +10169 " "$tmp/log" || bad "no replay of the uncompressed sample in the output"
if command -v readelf >/dev/null 2>&1; then
  readelf -d "$b/gpumem" | grep -q 'NEEDED.*libz' && bad "the CLI needs libz"
fi
grep -q -- '-lz' "$b/gpumem.pc" && bad "gpumem.pc asks for -lz"
# The CLI of this build refuses gzip with a message, not garbage.
out=$(cd "$src" && "$b/gpumem" replay data/sample.csv.gz 2>&1) && bad "replay of a .gz without zlib succeeded"
grep -qi zlib <<<"$out" || bad "no word of zlib when refusing a .gz: $out"
[[ $fail == 0 ]] && echo "PASS: make demo without zlib"
exit $fail
