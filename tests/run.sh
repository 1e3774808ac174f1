#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# tests/run.sh — the test driver behind `make test`: runs the phases named in
# its arguments (normal valgrind asan tsan fuzz, and slurm where present;
# `make test` passes PHASES), each in its own build directory, and ends with
# one line "N passed, N failed, N skipped"; exit status non-zero when
# anything failed.  Its settings come from the Makefile through GM_T_*
# variables (build directory, jobs, cmake/ctest, fuzz time and compiler,
# extra cmake arguments, the normal configuration, valgrind, test backend):
# run it through `make test` (PHASES="normal asan" make test for some).
set -uo pipefail
B=$GM_T_BUILD; J=$GM_T_JOBS
read -r -a EXTRA <<<"$GM_T_CMAKE_ARGS"
read -r -a NORMAL <<<"$GM_T_NORMAL_CONFIG"
total_pass=0; total_fail=0; total_skip=0; table=()
t_all=$SECONDS

say() { printf '\n==== %s\n' "$*"; }
record() { # phase passed failed seconds [skipped]
  local s=${5:-0}
  total_pass=$((total_pass + $2)); total_fail=$((total_fail + $3)); total_skip=$((total_skip + s))
  table+=("$(printf '  %-16s %4d passed %4d failed %4d skipped %6ds' "$1" "$2" "$3" "$s" "$4")")
}
configure() { # dir args...
  local dir=$1; shift
  "$GM_T_CMAKE" -S . -B "$dir" --log-level=WARNING -DGM_TEST_BACKEND="$GM_T_TEST_BACKEND" \
    -DGM_WERROR=ON -DBUILD_TESTING=ON "$@" "${EXTRA[@]}"
}
build() { # dir [targets...]; keeps going past errors so the rest still runs
  local dir=$1; shift
  local tg=(); for t in "$@"; do tg+=(--target "$t"); done
  MAKEFLAGS="-k --no-print-directory" "$GM_T_CMAKE" --build "$dir" -j "$J" "${tg[@]}"
}
# run_ctest phase dir env-assignments... -- ctest-args...
run_ctest() {
  local phase=$1 dir=$2; shift 2
  local envs=(); while [[ $# -gt 0 && $1 != -- ]]; do envs+=("$1"); shift; done; shift
  local log="$dir/ctest-$phase.log" t0=$SECONDS
  (cd "$dir" && env "${envs[@]}" "$GM_T_CTEST" --output-on-failure -j "$J" "$@") 2>&1 | tee "$log"
  local line p f s
  # ctest counts a skipped test (SKIP_RETURN_CODE, exit 77) among the passed
  # ones and lists it under "The following tests did not run:" as
  # "<n> - <name> (Skipped)": count those apart.
  s=$(grep -cE '^[[:space:]]+[0-9]+ - .* \(Skipped\)$' "$log")
  line=$(grep -E '^[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -n 1)
  if [[ $line =~ ([0-9]+)\ tests?\ failed\ out\ of\ ([0-9]+) ]]; then
    f=${BASH_REMATCH[1]}; p=$((BASH_REMATCH[2] - f - s))
  elif grep -q 'No tests were found' "$log"; then
    p=0; f=0; s=0
  else
    echo "make test: ctest did not complete in $dir"; p=0; f=1; s=0
  fi
  record "$phase" "$p" "$f" $((SECONDS - t0)) "$s"
}
# A failed configure or build counts as one failed test of the phase.
build_phase() { # phase dir configure-args... -- targets...
  local phase=$1 dir=$2; shift 2
  local cfg=(); while [[ $# -gt 0 && $1 != -- ]]; do cfg+=("$1"); shift; done; shift
  local t0=$SECONDS
  say "$phase: configure and build in $dir"
  if ! configure "$dir" "${cfg[@]}"; then record "$phase-configure" 0 1 $((SECONDS - t0)); return 1; fi
  if ! build "$dir" "$@"; then record "$phase-build" 0 1 $((SECONDS - t0)); return 0; fi
  record "$phase-build" 0 0 $((SECONDS - t0))
}
# TSan needs the classic address-space layout on kernels with high mmap
# randomization; setarch -R provides it where the kernel lets us.
norandom() { if setarch "$(uname -m)" -R true 2>/dev/null; then setarch "$(uname -m)" -R "$@"; else "$@"; fi; }

for phase in "$@"; do
  case $phase in
  normal)
    if build_phase normal "$B" "${NORMAL[@]}" --; then
      say "normal: ctest in $B"
      run_ctest normal "$B" -- -LE valgrind
    fi ;;
  valgrind)
    if [[ $GM_T_HAVE_VALGRIND != ON ]]; then say "valgrind: skipped (valgrind not installed)"; continue; fi
    # Usually a no-op after the normal phase; builds $B when run alone.
    if ! build_phase valgrind "$B" "${NORMAL[@]}" --; then continue; fi
    say "valgrind: unit tests under memcheck in $B"
    run_ctest valgrind "$B" -- -L valgrind ;;
  asan)
    if build_phase asan "$B-asan" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS=-O1 -DGM_DEBUG_LEVEL=3 \
        -DGM_SANITIZE=address,undefined -DGM_VALGRIND=OFF -DGM_FUZZ=OFF --; then
      say "asan: ctest in $B-asan"
      run_ctest asan "$B-asan" \
        ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:abort_on_error=0:detect_stack_use_after_return=1 \
        UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 -- -LE valgrind
    fi ;;
  tsan)
    stress=(); for f in tests/stress/*.c; do [[ -e $f ]] && stress+=("stress_$(basename "$f" .c)"); done
    for f in tests/attack/*.c; do [[ -e $f ]] && stress+=("attack_$(basename "$f" .c)"); done
    for f in tests/share/*.c; do [[ -e $f ]] && stress+=("share_$(basename "$f" .c)"); done
    for f in tests/broker/*.c; do [[ -e $f ]] && stress+=("broker_$(basename "$f" .c)"); done
    for f in tests/offload/*.c; do [[ -e $f ]] && stress+=("offload_$(basename "$f" .c)"); done
    for f in tests/multigpu/*.c; do [[ -e $f ]] && stress+=("multigpu_$(basename "$f" .c)"); done
    if [[ ${#stress[@]} -eq 0 ]]; then say "tsan: skipped (no tests/stress/*.c yet)"; continue; fi
    stress+=(gpumem_cli) # the broker tests run `gpumem broker` (GM_TEST_CLI)
    if build_phase tsan "$B-tsan" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS=-O1 -DGM_DEBUG_LEVEL=1 \
        -DGM_SANITIZE=thread -DGM_VALGRIND=OFF -DGM_FUZZ=OFF -- "${stress[@]}"; then
      say "tsan: stress tests in $B-tsan"
      run_ctest tsan "$B-tsan" TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 -- -L '^(stress|attack|share|broker|offload|multigpu)$'
    fi ;;
  fuzz)
    targets=(); for f in tests/fuzz/*.c; do [[ -e $f ]] && targets+=("$(basename "$f" .c)"); done
    if [[ ${#targets[@]} -eq 0 ]]; then say "fuzz: skipped (no tests/fuzz/*.c yet)"; continue; fi
    if ! command -v "$GM_T_FUZZ_CC" >/dev/null; then say "fuzz: skipped ($GM_T_FUZZ_CC not installed)"; continue; fi
    F=$B-fuzz
    say "fuzz: configure and build in $F"
    t0=$SECONDS
    if ! configure "$F" -DCMAKE_C_COMPILER="$GM_T_FUZZ_CC" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS=-O1 \
        -DGM_FUZZ=ON -DGM_DEBUG_LEVEL=2 -DGM_SANITIZE= -DGM_VALGRIND=OFF; then
      record fuzz-configure 0 1 $((SECONDS - t0)); continue
    fi
    if ! grep -q '^GM_HAVE_LIBFUZZER:INTERNAL=1' "$F/CMakeCache.txt"; then
      say "fuzz: skipped ($GM_T_FUZZ_CC cannot link libFuzzer; install libclang-rt-dev)"; continue
    fi
    if ! build "$F" fuzz_targets; then record fuzz-build 0 1 $((SECONDS - t0)); fi
    for t in "${targets[@]}"; do
      say "fuzz: $t for ${GM_T_FUZZ_TIME}s"
      t0=$SECONDS
      exe="$F/fuzz/$t"; corpus="$F/corpus/$t"; seeds=()
      mkdir -p "$corpus" "$F/artifacts"
      [[ -d tests/fuzz/corpus/$t ]] && seeds=("tests/fuzz/corpus/$t")
      # New inputs go to the build's corpus; the seed corpus is only read.
      if [[ -x $exe ]] && timeout $((GM_T_FUZZ_TIME + 300)) "$exe" -max_total_time="$GM_T_FUZZ_TIME" \
          -timeout=25 -rss_limit_mb=4096 -artifact_prefix="$F/artifacts/$t-" \
          "$corpus" "${seeds[@]}" >"$F/fuzz-$t.log" 2>&1; then
        tail -n 3 "$F/fuzz-$t.log"; record "fuzz/$t" 1 0 $((SECONDS - t0))
      else
        tail -n 60 "$F/fuzz-$t.log" 2>/dev/null || echo "$exe was not built"
        record "fuzz/$t" 0 1 $((SECONDS - t0))
      fi
    done ;;
  *)
    echo "make test: unknown phase '$phase' (normal valgrind asan tsan fuzz)" >&2
    record "$phase" 0 1 0 ;;
  esac
done

say "summary ($((SECONDS - t_all))s)"
printf '%s\n' "${table[@]}"
echo "$total_pass passed, $total_fail failed, $total_skip skipped"
[[ $total_fail -eq 0 ]]
