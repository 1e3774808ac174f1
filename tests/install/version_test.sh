#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# version_test.sh SOURCE_DIR CMAKE_VERSION GPUMEM_CLI LIBGPUMEM_SO [READELF]
#
# One version number, defined once: GM_VERSION_MAJOR/MINOR/PATCH and
# GM_VERSION_STRING in include/gpumem.h.  Everything else must agree with it:
# the CMake project version (CMAKE_VERSION, read from the header), the CLI's
# `gpumem --version` (gm_version() of the static library), the shared
# library's real file name (libgpumem.so.X.Y.Z) and SONAME (libgpumem.so.X),
# every literal version in python/ (pyproject.toml, the build backend,
# __version__) and a "## [X.Y.Z]" section in CHANGELOG.md.  gm_version()
# itself is checked against the macros by tests/unit/test_version.c.
set -u
src=$1 cmake_version=$2 cli=$3 lib=$4 readelf=${5:-readelf}
fail=0
bad() { echo "FAIL: $*"; fail=1; }

h=$src/include/gpumem.h
major=$(sed -n 's/^#define GM_VERSION_MAJOR \([0-9]*\)$/\1/p' "$h")
minor=$(sed -n 's/^#define GM_VERSION_MINOR \([0-9]*\)$/\1/p' "$h")
patch=$(sed -n 's/^#define GM_VERSION_PATCH \([0-9]*\)$/\1/p' "$h")
string=$(sed -n 's/^#define GM_VERSION_STRING "\(.*\)"$/\1/p' "$h")
[[ -n $major && -n $minor && -n $patch && -n $string ]] ||
  { echo "FAIL: $h lacks one of GM_VERSION_MAJOR/MINOR/PATCH/STRING"; exit 1; }
v=$major.$minor.$patch
echo "header: $v (GM_VERSION_STRING \"$string\")"
[[ $string == "$v" ]] || bad "GM_VERSION_STRING \"$string\" is not MAJOR.MINOR.PATCH $v"
[[ $cmake_version == "$v" ]] || bad "CMake project version $cmake_version, header $v"

out=$("$cli" --version) || bad "gpumem --version failed"
[[ $out == "gpumem $v" ]] || bad "gpumem --version says '$out', want 'gpumem $v'"

real=$(readlink -f "$lib")
[[ $(basename "$real") == "libgpumem.so.$v" ]] || bad "shared library file $(basename "$real"), want libgpumem.so.$v"
if command -v "$readelf" >/dev/null 2>&1; then
  soname=$("$readelf" -d "$real" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
  [[ $soname == "libgpumem.so.$major" ]] || bad "SONAME '$soname', want libgpumem.so.$major"
  [[ -L $(dirname "$real")/libgpumem.so.$major ]] || bad "no libgpumem.so.$major link next to $real"
else
  bad "no readelf to read the SONAME"
fi

# python/: every literal version must be the header's (a backend that reads
# the header has none).
found=0
while IFS=: read -r file line text; do
  found=1
  got=$(sed -E 's/.*=[[:space:]]*"([^"]*)".*/\1/' <<<"$text")
  [[ $got == "$v" ]] || bad "$file:$line: version \"$got\", header $v"
done < <(grep -rnE '^[[:space:]]*(version|VERSION|__version__)[[:space:]]*=[[:space:]]*"[0-9][^"]*"' \
           "$src/python" --include=pyproject.toml --include='*.py' --include=setup.cfg 2>/dev/null)
[[ $found == 1 ]] && echo "python: literal versions checked" || echo "python: no literal version (read from the header)"

grep -qE "^## \[$v\]" "$src/CHANGELOG.md" 2>/dev/null || bad "CHANGELOG.md has no '## [$v]' section"

[[ $fail == 0 ]] && echo "PASS: version $v everywhere"
exit $fail
