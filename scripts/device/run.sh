#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/device/run.sh — the one script the team runs on the GPU machine.
#
# Run from the repository root.  It builds gpumem from scratch in
# build-device/, shows the GPU and driver, runs `gpumem info` on the cuda
# backend, the whole ctest suite against the GPU, and compute-sanitizer over
# the api and stress tests.  Each phase writes its own log,
# $OUT/device-<phase>.log ($OUT defaults to build-device/out), and the run
# ends with a summary (also in $OUT/device-summary.log).  Exit status: 0 when
# every phase passed.
#
# Choosing phases:   PHASES="build ctest" scripts/device/run.sh
# Adding a phase:    write phase_<name>() (return non-zero on failure), add
#                    <name> to ALL_PHASES, and give it a time limit in
#                    phase_limit() if it needs more than the default.
#
# Other knobs (environment):
#   BUILD_DIR         build directory                (build-device)
#   BUILD_TYPE        CMAKE_BUILD_TYPE               (RelWithDebInfo)
#   CMAKE_ARGS        extra arguments for configure
#   CTEST_JOBS        parallel ctest jobs            (4)
#   CTEST_TIMEOUT     seconds per test               (120)
#   CTEST_ARGS        more ctest arguments, e.g. "-L broker"  (none)
#   SANITIZE_GLOB     extended regex on executable paths for the sanitizer
#                     phase: the programs that use the GPU  ((^|/)test_(api|stress)$)
#   SANITIZE_ARGS     arguments passed to each sanitized test (none)
#   SANITIZE_TIMEOUT  seconds per sanitized test     (150)
#   GPUMEM_DEVICE     device ordinal                 (0)
#   TRACE_DIR         RMM traces replayed by the replay phase, besides the
#                     workloads `gpumem synth` makes there (.device-traces)
#   REPLAY_REPEAT     passes per trace in the replay phase (3)
# shellcheck disable=SC2317  # phases are called by name, through run_phase
set -u -o pipefail

ALL_PHASES="env build info ctest sanitize replay"
PHASES="${PHASES:-$ALL_PHASES}"
BUILD_DIR="${BUILD_DIR:-build-device}"
BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}"
CTEST_JOBS="${CTEST_JOBS:-4}"
CTEST_TIMEOUT="${CTEST_TIMEOUT:-120}"
CTEST_ARGS="${CTEST_ARGS:-}"
SANITIZE_GLOB="${SANITIZE_GLOB:-(^|/)test_(api|stress)$}"
SANITIZE_ARGS="${SANITIZE_ARGS:-}"
SANITIZE_TIMEOUT="${SANITIZE_TIMEOUT:-150}"
OUT="${OUT:-$BUILD_DIR/out}"
TRACE_DIR="${TRACE_DIR:-.device-traces}"
REPLAY_REPEAT="${REPLAY_REPEAT:-3}"

# Everything this run executes talks to the GPU.
export GPUMEM_BACKEND=cuda
export GPUMEM_TEST_BACKEND=cuda

if [ ! -f CMakeLists.txt ] || [ ! -f include/gpumem.h ]; then
    echo "run.sh: run me from the gpumem repository root" >&2
    exit 2
fi
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

note() { printf '\n=== %s ===\n' "$*"; }

# Seconds a phase may run (the whole script should stay under ~8 minutes).
phase_limit() {
    case "$1" in
    build) echo 240 ;;
    ctest) echo 300 ;;
    sanitize) echo 300 ;;
    replay) echo 400 ;;
    *) echo 60 ;;
    esac
}

# The CLI, wherever the build put it.
gpumem_cli() {
    if [ -x "$BUILD_DIR/gpumem" ]; then
        echo "$BUILD_DIR/gpumem"
    else
        find "$BUILD_DIR" -type f -name gpumem -perm -u+x 2>/dev/null | head -n 1
    fi
}

# ---- phases ---------------------------------------------------------------

phase_env() {
    echo "date:    $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host:    $(uname -srm)"
    echo "commit:  $(git rev-parse --short --verify -q HEAD 2>/dev/null || echo none) $(git status --porcelain 2>/dev/null | wc -l) changed path(s)"
    echo
    nvidia-smi -L || return 1
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used,compute_mode \
        --format=csv || return 1
    echo
    nvidia-smi | sed -n '1,4p' # the banner with the driver and CUDA versions
    echo
    command -v nvcc >/dev/null && nvcc --version | tail -n 2
    command -v compute-sanitizer >/dev/null && compute-sanitizer --version | head -n 3
    cmake --version | head -n 1
    ${CC:-cc} --version | head -n 1
    return 0
}

phase_build() {
    rm -rf "$BUILD_DIR"
    # shellcheck disable=SC2086
    # GM_TEST_BACKEND=cuda: ctest sets each test's backend from it (its
    # default, sim, would override the GPUMEM_TEST_BACKEND exported above).
    cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE="$BUILD_TYPE" -DGM_TEST_BACKEND=cuda \
        ${CMAKE_ARGS:-} || return 1
    cmake --build "$BUILD_DIR" -j "$(nproc)" || return 1
}

phase_info() {
    local cli
    cli="$(gpumem_cli)"
    if [ -z "$cli" ]; then
        echo "no gpumem executable under $BUILD_DIR (did the build phase run?)"
        return 1
    fi
    "$cli" info --backend cuda
}

phase_ctest() {
    # shellcheck disable=SC2086
    cd "$BUILD_DIR" && ctest --output-on-failure -j "$CTEST_JOBS" \
        --timeout "$CTEST_TIMEOUT" --no-tests=error $CTEST_ARGS
}

phase_sanitize() {
    if ! command -v compute-sanitizer >/dev/null; then
        echo "compute-sanitizer not found"
        return 1
    fi
    local exes=() exe rc=0 log
    while IFS= read -r exe; do exes+=("$exe"); done < <(
        find "$BUILD_DIR" -type f -perm -u+x ! -name '*.so*' ! -path '*/CMakeFiles/*' 2>/dev/null |
            grep -E -- "$SANITIZE_GLOB" | sort)
    if [ "${#exes[@]}" -eq 0 ]; then
        echo "no executables match SANITIZE_GLOB='$SANITIZE_GLOB'"
        return 1
    fi
    for exe in "${exes[@]}"; do
        log="$OUT/device-sanitize-$(basename "$exe").log"
        echo "--- compute-sanitizer memcheck: $exe $SANITIZE_ARGS (log $(basename "$log"))"
        # shellcheck disable=SC2086
        timeout "$SANITIZE_TIMEOUT" compute-sanitizer --tool memcheck --leak-check no \
            --error-exitcode 99 "$exe" $SANITIZE_ARGS >"$log" 2>&1
        local st=$?
        grep -E 'ERROR SUMMARY|passed, .* failed' "$log" | sed 's/^/    /'
        case $st in
        0) echo "    ok" ;;
        99) echo "    FAILED: sanitizer errors"; rc=1 ;;
        124) echo "    FAILED: over ${SANITIZE_TIMEOUT}s"; rc=1 ;;
        *) echo "    FAILED: exit $st"; rc=1 ;;
        esac
    done
    return "$rc"
}

# Replay real and synthetic traces through the cuda backend with
# bench/replay.sh; its dated results (Markdown table and JSON lines) are
# copied to $OUT as device-replay.md / device-replay.jsonl.
phase_replay() {
    local cli
    cli="$(gpumem_cli)"
    [ -n "$cli" ] || { echo "no gpumem executable (did the build phase run?)"; return 1; }
    GPUMEM="$cli" bash bench/replay.sh --backend cuda --repeat "$REPLAY_REPEAT" \
        ${TRACE_DIR:+"$TRACE_DIR"} || return 1
    local md
    md="$(ls -t bench/results/*-replay.md | head -n 1)"
    cp "$md" "$OUT/device-replay.md"
    cp "${md%.md}.jsonl" "$OUT/device-replay.jsonl"
}

# ---- driver ---------------------------------------------------------------

declare -A RESULT SECONDS_TAKEN
ORDER=()
failed=0

run_phase() {
    local name="$1" log="$OUT/device-$1.log" limit start st
    if ! declare -F "phase_$name" >/dev/null; then
        echo "run.sh: unknown phase '$name' (known: $ALL_PHASES)" >&2
        RESULT[$name]="unknown"
        ORDER+=("$name")
        failed=1
        return
    fi
    limit="$(phase_limit "$name")"
    note "$name (limit ${limit}s, log $log)"
    start=$(date +%s)
    # A subshell under timeout's watch: a hung phase cannot stall the run.
    (
        # shellcheck disable=SC2046  # every function, for the phase's bash
        export -f $(declare -F | awk '{print $3}')
        timeout --kill-after=10 "$limit" bash -c "set -o pipefail; phase_$name"
    ) 2>&1 | tee "$log"
    st=${PIPESTATUS[0]}
    SECONDS_TAKEN[$name]=$(($(date +%s) - start))
    case $st in
    0) RESULT[$name]="ok" ;;
    124 | 137) RESULT[$name]="TIMEOUT"; failed=1 ;;
    *) RESULT[$name]="FAILED ($st)"; failed=1 ;;
    esac
    ORDER+=("$name")
}

# Exported for the phase subshells.
export BUILD_DIR BUILD_TYPE CTEST_JOBS CTEST_TIMEOUT SANITIZE_GLOB SANITIZE_ARGS \
    SANITIZE_TIMEOUT OUT TRACE_DIR REPLAY_REPEAT CMAKE_ARGS="${CMAKE_ARGS:-}"

for phase in $PHASES; do
    # Nothing after a failed build can mean anything.
    if [ "$phase" != build ] && [ "$phase" != env ] && [ "${RESULT[build]:-}" != "" ] &&
        [ "${RESULT[build]}" != ok ]; then
        RESULT[$phase]="skipped (build failed)"
        ORDER+=("$phase")
        continue
    fi
    run_phase "$phase"
done

summary() {
    echo "gpumem device run — $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
    local p
    for p in "${ORDER[@]}"; do
        printf '  %-10s %-24s %5ss\n' "$p" "${RESULT[$p]}" "${SECONDS_TAKEN[$p]:--}"
    done
    if [ -f "$OUT/device-ctest.log" ]; then
        grep -E 'tests passed|tests failed|Total Test time' "$OUT/device-ctest.log" | sed 's/^/  ctest: /'
        grep -E '^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess|Exception|Not Run)' \
            "$OUT/device-ctest.log" | sed 's/^/  /'
    fi
    [ "$failed" -eq 0 ] && echo "RESULT: all phases passed" || echo "RESULT: FAILURES (see $OUT/device-*.log)"
}
note summary
summary | tee "$OUT/device-summary.log"
exit "$failed"
