#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# install_test.sh BUILD_DIR [CC] [CMAKE] — install the build into a temporary
# prefix with `cmake --install BUILD_DIR --prefix TMP`, check what landed
# there, then build tests/install/consumer.c against it as a user would and
# run it (sim backend):
#   pkg-config, shared   cc consumer.c $(pkg-config --cflags --libs gpumem)
#                          -Wl,-rpath,$(pkg-config --variable=libdir gpumem)
#                        (the README's rpath flag); also without the rpath flag
#                        and with LD_LIBRARY_PATH=libdir instead
#   pkg-config, static   libgpumem.a + `pkg-config --static --libs` (Libs.private)
#   find_package         gpumem::gpumem and gpumem::gpumem_static; CMake gives
#                        the shared one an rpath in its build tree, so it runs
#                        with nothing set
# Skipped (exit 77) without pkg-config.  ctest runs it (install/consumers).
set -u
build=$(cd "$1" && pwd) cc=${2:-cc} cmake=${3:-cmake}
here=$(cd "$(dirname "$0")" && pwd)
command -v pkg-config >/dev/null 2>&1 || { echo "SKIP: pkg-config is not installed"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gm_install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
unset LD_LIBRARY_PATH GPUMEM_BACKEND
export GPUMEM_SIM_CAPACITY=1GiB

prefix=$tmp/prefix
"$cmake" --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; echo "FAIL: cmake --install"; exit 1; }
pc=$(find "$prefix" -name gpumem.pc -path '*/pkgconfig/*' | head -n 1)
[[ -n $pc ]] || { find "$prefix"; echo "FAIL: no gpumem.pc installed"; exit 1; }
export PKG_CONFIG_PATH=$(dirname "$pc")
libdir=$(cd "$(pkg-config --variable=libdir gpumem)" 2>/dev/null && pwd) ||
  { cat "$pc"; echo "FAIL: gpumem.pc: libdir does not exist"; exit 1; }
version=$(pkg-config --modversion gpumem)
echo "installed gpumem $version into $prefix (libdir $libdir)"

# What must be there.
[[ -f $prefix/include/gpumem.h ]] || bad "no include/gpumem.h"
[[ $(readlink "$libdir/libgpumem.so") == libgpumem.so.0 ]] || bad "libgpumem.so is not a link to libgpumem.so.0"
[[ $(readlink "$libdir/libgpumem.so.0") == "libgpumem.so.$version" ]] || bad "libgpumem.so.0 is not a link to libgpumem.so.$version"
[[ -f $libdir/libgpumem.so.$version && ! -L $libdir/libgpumem.so.$version ]] || bad "no libgpumem.so.$version"
[[ -f $libdir/libgpumem.a ]] || bad "no libgpumem.a"
[[ -f $libdir/libgpumem_preload.so ]] || bad "no libgpumem_preload.so in $libdir"
for f in gpumemConfig.cmake gpumemConfigVersion.cmake gpumemTargets.cmake; do
  [[ -f $libdir/cmake/gpumem/$f ]] || bad "no $libdir/cmake/gpumem/$f"
done
out=$("$prefix/bin/gpumem" --version 2>&1) && [[ $out == "gpumem $version" ]] ||
  bad "installed gpumem --version: '$out'"
out=$(LD_PRELOAD=$libdir/libgpumem_preload.so /bin/true 2>&1) && [[ -z $out ]] ||
  bad "LD_PRELOAD of the installed libgpumem_preload.so: '$out'"
grep -q -- '-lpthread' <<<"$(pkg-config --static --libs gpumem)" || bad "Libs.private lacks -lpthread"

run() { # name command... : the consumer must print "consumer: ok VERSION"
  local name=$1; shift
  local out; out=$("$@" 2>&1)
  if [[ $out == "consumer: ok $version" ]]; then echo "ok: $name"; else bad "$name: '$out'"; fi
}
src=$here/consumer.c
cd "$tmp" || exit 1

# pkg-config, shared, with the rpath flag the README gives.
read -r -a flags <<<"$(pkg-config --cflags --libs gpumem)"
if "$cc" "$src" "${flags[@]}" -Wl,-rpath,"$(pkg-config --variable=libdir gpumem)" -o app_pc; then
  run "pkg-config (rpath)" ./app_pc
else bad "pkg-config build (rpath)"; fi
# The same without the rpath flag: runs with LD_LIBRARY_PATH.
if "$cc" "$src" "${flags[@]}" -o app_pc_norpath; then
  run "pkg-config (LD_LIBRARY_PATH)" env LD_LIBRARY_PATH="$libdir" ./app_pc_norpath
else bad "pkg-config build (no rpath)"; fi
# pkg-config, static: Libs.private is all libgpumem.a needs.
read -r -a cflags <<<"$(pkg-config --cflags gpumem)"
read -r -a privs <<<"$(pkg-config --static --libs-only-l gpumem | sed 's/-lgpumem\b//')"
if "$cc" "$src" "${cflags[@]}" "$libdir/libgpumem.a" "${privs[@]}" -o app_pc_static; then
  run "pkg-config (static)" ./app_pc_static
else bad "pkg-config build (static, Libs.private)"; fi

# find_package.
mkdir -p cm
cat >cm/CMakeLists.txt <<CMAKE
cmake_minimum_required(VERSION 3.16)
project(gpumem_consumer C)
find_package(gpumem $version EXACT REQUIRED)
add_executable(app_shared "$src")
target_link_libraries(app_shared PRIVATE gpumem::gpumem)
add_executable(app_static "$src")
target_link_libraries(app_static PRIVATE gpumem::gpumem_static)
CMAKE
if "$cmake" -S cm -B cm/build -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" \
     -DCMAKE_BUILD_TYPE=Release >"$tmp/cm.log" 2>&1 &&
   "$cmake" --build cm/build >>"$tmp/cm.log" 2>&1; then
  run "find_package gpumem::gpumem" cm/build/app_shared
  run "find_package gpumem::gpumem_static" cm/build/app_static
  readelf -d cm/build/app_static 2>/dev/null | grep -q 'NEEDED.*libgpumem' && bad "app_static needs libgpumem.so"
  readelf -d cm/build/app_shared 2>/dev/null | grep -q 'NEEDED.*\[libgpumem.so.0\]' || bad "app_shared does not need libgpumem.so.0"
else
  cat "$tmp/cm.log"; bad "find_package consumer did not build"
fi

[[ $fail == 0 ]] && echo "PASS: install and consumers"
exit $fail
