# SPDX-License-Identifier: Apache-2.0
# Attacks the promise of GM_BACKEND_AUTO (include/gpumem.h, gm_pool_create):
# auto takes the sim only when no NVIDIA driver is installed, and says so once
# on stderr; a driver that loads but cannot serve the device asked for (bad
# ordinal, no device visible, cuInit failing) is an error naming the device
# and the reason, never a quiet switch to host memory.
#
# The driver is the stub libcuda.so.1 of tests/preload (built next to the CLI,
# in BUILD/tests/preload; absent in sanitizer builds: then only the no-driver
# cases run).  STUB_CUDA_DEVICES and STUB_CUDA_INIT steer it.
# usage: bash backend_auto.sh GPUMEM HOLDER
set -u
GPUMEM=$1
STUB_DIR=$(cd "$(dirname "$GPUMEM")" && pwd)/tests/preload
unset GPUMEM_BACKEND GPUMEM_DEVICE CUDA_VISIBLE_DEVICES STUB_CUDA_DEVICES STUB_CUDA_INIT
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# run NAME ENV... -- ARGS: gpumem ARGS with ENV, output in $tmp/NAME.{out,err}, rc in $rc
run() {
    local name=$1; shift
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    env "${envs[@]}" "$GPUMEM" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
    rc=$?
}
expect_error() { # NAME WHAT-STDERR-MUST-SAY...
    local name=$1; shift
    [ "$rc" -eq 1 ] || fail "$name: exit $rc, want 1 (stderr: $(cat "$tmp/$name.err"))"
    for w in "$@"; do
        grep -q -- "$w" "$tmp/$name.err" || fail "$name: stderr lacks '$w': $(cat "$tmp/$name.err")"
    done
    grep -q "using the sim" "$tmp/$name.err" && fail "$name: fell back to the sim"
    grep -q "^backend: *sim" "$tmp/$name.out" && fail "$name: reports the sim"
}

if [ -f "$STUB_DIR/libcuda.so.1" ]; then
    LP="LD_LIBRARY_PATH=$STUB_DIR"
    # A device that does not exist: through the environment and through --device.
    run dev99 "$LP" GPUMEM_DEVICE=99 -- info
    expect_error dev99 "device 99" "does not exist" "1 device is visible" "not falling back"
    run dev99opt "$LP" -- info --device 99
    expect_error dev99opt "device 99" "does not exist"
    grep -q "cuda: installed, device 99 not usable" "$tmp/dev99opt.err" ||
        fail "dev99opt: info does not show what the probe found: $(cat "$tmp/dev99opt.err")"
    # Two devices, the third asked for.
    run dev2 "$LP" STUB_CUDA_DEVICES=2 GPUMEM_DEVICE=2 -- info
    expect_error dev2 "device 2" "2 devices are visible"
    # No device visible (CUDA_VISIBLE_DEVICES= on a real box).
    run nodev "$LP" STUB_CUDA_DEVICES=0 -- info
    expect_error nodev "no CUDA device is visible"
    # cuInit failing for another reason than "no driver".
    run initfail "$LP" STUB_CUDA_INIT=100 -- info
    expect_error initfail "cuInit failed" "CUDA_ERROR_NO_DEVICE"
    # The pool of a replay fails the same way (gm_pool_create with a config).
    printf 'Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate,0x10,64,0\n' >"$tmp/t.csv"
    run replay99 "$LP" STUB_CUDA_DEVICES=0 -- replay --backend auto "$tmp/t.csv"
    expect_error replay99 "cannot create a pool" "no CUDA device is visible"
    # The toolkit's stub library is no driver: the sim, with the notice.
    run stublib "$LP" STUB_CUDA_INIT=34 -- info
    [ "$rc" -eq 0 ] || fail "stublib: exit $rc: $(cat "$tmp/stublib.err")"
    grep -q "^backend: *sim" "$tmp/stublib.out" || fail "stublib: not the sim: $(cat "$tmp/stublib.out")"
    [ "$(grep -c "using the sim" "$tmp/stublib.err")" -eq 1 ] ||
        fail "stublib: want one notice line: $(cat "$tmp/stublib.err")"
    # Asking for the sim never probes a driver into the way.
    run simstub "$LP" GPUMEM_BACKEND=sim GPUMEM_DEVICE=3 -- info
    [ "$rc" -eq 0 ] && [ ! -s "$tmp/simstub.err" ] || fail "simstub: exit $rc, stderr: $(cat "$tmp/simstub.err")"
else
    echo "no stub libcuda.so.1 in $STUB_DIR (sanitizer build?): driver cases skipped"
fi

# No driver at all: only where none is installed system-wide.
if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
    echo "an NVIDIA driver is installed here: no-driver cases skipped"
else
    NOLP="LD_LIBRARY_PATH=$tmp/none"
    run nodrv "$NOLP" -- info
    [ "$rc" -eq 0 ] || fail "nodrv: exit $rc: $(cat "$tmp/nodrv.err")"
    grep -q "^backend: *sim" "$tmp/nodrv.out" || fail "nodrv: not the sim"
    grep -q "cuda: not installed" "$tmp/nodrv.out" || fail "nodrv: info does not say what was probed"
    [ "$(wc -l <"$tmp/nodrv.err")" -eq 1 ] && grep -q "libcuda.so.1 not found.*using the sim" "$tmp/nodrv.err" ||
        fail "nodrv: want exactly one notice line on stderr, got: $(cat "$tmp/nodrv.err")"
    # Once per process: two pools (two traces), one line.
    printf 'Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate,0x10,64,0\n' >"$tmp/t.csv"
    run twice "$NOLP" -- replay --backend auto "$tmp/t.csv" "$tmp/t.csv"
    [ "$rc" -eq 0 ] || fail "twice: exit $rc: $(cat "$tmp/twice.err")"
    [ "$(grep -c "using the sim" "$tmp/twice.err")" -eq 1 ] ||
        fail "twice: want one notice for two pools: $(cat "$tmp/twice.err")"
    # GPUMEM_BACKEND=sim: "I want the sim", nothing said.
    run quiet "$NOLP" GPUMEM_BACKEND=sim -- info
    [ "$rc" -eq 0 ] && [ ! -s "$tmp/quiet.err" ] || fail "quiet: exit $rc, stderr: $(cat "$tmp/quiet.err")"
fi

[ "$fails" -eq 0 ] && echo "backend_auto: all passed"
[ "$fails" -eq 0 ]
