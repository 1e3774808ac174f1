#!/usr/bin/env bash
# pip_install.sh — `pip install ./python` works offline and the installed
# package finds the library built in this checkout (run from the repository
# root; ctest runs it).  Exit 77 (skipped) when python3 has no pip.
set -uo pipefail
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 is not installed"; exit 77; }
python3 -m pip --version >/dev/null 2>&1 || { echo "SKIP: python3 has no pip"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! python3 -m pip install --no-index --no-deps --disable-pip-version-check --target "$tmp/site" ./python \
        >"$tmp/log" 2>&1; then
    if grep -q externally-managed "$tmp/log"; then echo "SKIP: this pip refuses installs (PEP 668)"; exit 77; fi
    cat "$tmp/log"; echo "FAIL: pip install ./python"; exit 1
fi
unset GPUMEM_LIBRARY
cd "$tmp" || exit 1
PYTHONPATH="$tmp/site" GPUMEM_BACKEND=sim python3 -c '
import gpumem, os, sys
path = gpumem.library_path()
print("installed at", os.path.dirname(gpumem.__file__), "uses", path)
assert gpumem.__file__.startswith(sys.argv[1]), gpumem.__file__
assert os.path.isabs(path) and path.endswith("build/libgpumem.so"), path
with gpumem.alloc(1 << 20):
    assert gpumem.stats()["allocated"] >= 1 << 20
print("PASS")' "$tmp/site" || { echo "FAIL: the installed package does not work"; exit 1; }
