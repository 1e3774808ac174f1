#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# build_wheel.sh [OUTDIR] — build the gpumem wheel (gpumem-VERSION-py3-none-PLATFORM.whl,
# carrying libgpumem.so built from this checkout's sources) into OUTDIR
# (default: build/wheel of this checkout, which git ignores) and print its path.  Offline, no
# pip needed: it calls the package's PEP 517 backend (python/build_backend/)
# the way pip would.  Knobs: PYTHON (default python3), GPUMEM_WHEEL_BUILDER,
# GPUMEM_WHEEL_CMAKE_ARGS, GPUMEM_WHEEL_JOBS (see gpumem_build.py).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${1:-$here/../build/wheel}
python=${PYTHON:-python3}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$here"
name=$("$python" -c '
import sys
sys.path.insert(0, "build_backend")
import gpumem_build
try:
    print(gpumem_build.build_wheel(sys.argv[1]))
except gpumem_build.BuildError as e:
    sys.exit(str(e))
' "$out")
echo "$out/$name"
