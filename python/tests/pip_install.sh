#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# pip_install.sh — the gpumem wheel carries libgpumem.so and needs no checkout.
# Run from the repository root (ctest runs it).  Offline:
#   1. copy this checkout's files to a scratch folder and build the wheel there
#      (python/build_wheel.sh: the package's build backend builds the library);
#   2. check its name (py3-none-<this interpreter's platform>) and contents;
#   3. install it into a fresh venv with pip (without python3-venv: pip
#      --target; without pip: unzip, which is what installing this wheel is);
#   4. delete the copy, and from a folder outside any checkout, with
#      GPUMEM_LIBRARY unset, import gpumem and use it on the sim backend: the
#      library comes from the installed package, nothing is mapped from the
#      checkout or its copy, __version__ == gm_version() == include/gpumem.h's.
# GPUMEM_TEST_INSTALL=target|unzip forces a fallback of step 3 (to test it).
# Exit 77 (skipped) without python3.  GPUMEM_WHEEL_CMAKE_ARGS defaults to
# -DGM_LTO=OFF here (quicker); GPUMEM_WHEEL_JOBS to 2.
set -uo pipefail
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 is not installed"; exit 77; }
repo=$(pwd -P)
[[ -f $repo/python/build_wheel.sh && -f $repo/include/gpumem.h ]] || { echo "FAIL: run from the repository root"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# 1. A copy of the checkout (its tracked and new files; no build folders).
mkdir -p "$tmp/src"
if git -C "$repo" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    (cd "$repo" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - 2>/dev/null) |
        tar -C "$tmp/src" -xf - || fail "cannot copy the checkout"
else
    tar -C "$repo" --exclude='./build*' --exclude='./.git' -cf - . | tar -C "$tmp/src" -xf - ||
        fail "cannot copy the checkout"
fi
export GPUMEM_WHEEL_CMAKE_ARGS=${GPUMEM_WHEEL_CMAKE_ARGS--DGM_LTO=OFF} GPUMEM_WHEEL_JOBS=${GPUMEM_WHEEL_JOBS:-2}
wheel=$(bash "$tmp/src/python/build_wheel.sh" "$tmp/dist" 2>"$tmp/build.log" | tail -n 1)
[[ -f $wheel ]] || { cat "$tmp/build.log"; fail "python/build_wheel.sh built no wheel"; }
echo "built $(basename "$wheel")"

# 2. Its name and contents.
version=$(sed -n 's/^#define GM_VERSION_STRING "\(.*\)"$/\1/p' "$repo/include/gpumem.h")
plat=$(python3 -c 'import re, sysconfig; print(re.sub(r"[^A-Za-z0-9]", "_", sysconfig.get_platform()))')
[[ $(basename "$wheel") == "gpumem-$version-py3-none-$plat.whl" ]] ||
    fail "wheel name $(basename "$wheel"), expected gpumem-$version-py3-none-$plat.whl"
python3 - "$wheel" "$version" <<'EOF' || fail "the wheel's contents"
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
names = set(z.namelist())
for need in ("gpumem/__init__.py", "gpumem/libgpumem.so", "gpumem/_version.py",
             "gpumem-%s.dist-info/RECORD" % sys.argv[2]):
    assert need in names, (need, sorted(names))
wheel = z.read("gpumem-%s.dist-info/WHEEL" % sys.argv[2]).decode()
assert "Root-Is-Purelib: false" in wheel, wheel
assert z.read("gpumem/libgpumem.so")[:4] == b"\x7fELF"
EOF

# 3. Install it.
site=""
mode=${GPUMEM_TEST_INSTALL:-venv}
if [[ $mode == venv ]] && python3 -m venv "$tmp/venv" >"$tmp/venv.log" 2>&1 && [[ -x $tmp/venv/bin/python ]] &&
        "$tmp/venv/bin/python" -m pip --version >/dev/null 2>&1; then
    "$tmp/venv/bin/python" -m pip install --no-index --no-deps --no-cache-dir --disable-pip-version-check \
        "$wheel" >"$tmp/pip.log" 2>&1 || { cat "$tmp/pip.log"; fail "pip install of the wheel into a venv"; }
    py="$tmp/venv/bin/python"
    how="a venv"
else
    py=python3
    site="$tmp/site"
    if [[ $mode != unzip ]] && python3 -m pip --version >/dev/null 2>&1 &&
            python3 -m pip install --no-index --no-deps --no-cache-dir --disable-pip-version-check \
                --target "$site" "$wheel" >"$tmp/pip.log" 2>&1; then
        how="pip install --target (no python3 -m venv here)"
    else
        rm -rf "$site"
        python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" "$site" ||
            fail "cannot unpack the wheel"
        chmod +x "$site/gpumem/libgpumem.so"
        how="unzip (neither python3 -m venv nor pip here)"
    fi
fi
echo "installed with $how"

# 4. The checkout's copy goes away; use the installed package from elsewhere.
rm -rf "$tmp/src"
mkdir "$tmp/elsewhere"
cd "$tmp/elsewhere" || exit 1
unset GPUMEM_LIBRARY PYTHONPATH
run() { # extra environment..., then the check below
    env ${site:+PYTHONPATH="$site"} GPUMEM_BACKEND=sim GPUMEM_SIM_CAPACITY=4GiB "$@" "$py" - \
        "$repo" "$tmp" "$version" <<'EOF'
import os, sys
repo, tmp, version = sys.argv[1:4]
import gpumem
pkg = os.path.dirname(os.path.realpath(gpumem.__file__))
print("gpumem", gpumem.__version__, "from", pkg, "library", gpumem.library_path())
assert not pkg.startswith(repo + os.sep), pkg
assert os.path.realpath(gpumem.library_path()) == os.path.join(pkg, "libgpumem.so"), gpumem.library_path()
assert gpumem.__version__ == gpumem.version() == version, (gpumem.__version__, gpumem.version(), version)
with gpumem.alloc(1 << 20) as a:
    a.memset(0xA5)
    assert gpumem.stats()["allocated"] >= 1 << 20
with open("/proc/self/maps") as f:
    mapped = {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}
from_checkout = sorted(p for p in mapped if p.startswith((repo + os.sep, tmp + "/src")))
assert not from_checkout, from_checkout
print("PASS")
EOF
}
run || fail "the installed package does not work without the checkout"
# The bundled library comes first, even when GPUMEM_LIBRARY names another.
run GPUMEM_LIBRARY="$repo/no-such-dir/libgpumem.so" || fail "GPUMEM_LIBRARY took precedence over the bundled library"
echo "PASS: the wheel carries its library"
