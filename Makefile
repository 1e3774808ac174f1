# SPDX-License-Identifier: Apache-2.0
# gpumem — top-level driver over CMake and CTest.
#
#   make / make all   configure + build into $(BUILD) (-O2 -g, GM_DEBUG=1)
#   make test         every phase below, then one closing line
#                     "N passed, N failed, N skipped" (ctest tests of all phases,
#                     +1 per fuzz run; a test that exits 77 is skipped, not
#                     passed); non-zero exit if anything failed.  Phases
#                     (PHASES="..." picks some):
#                       normal    $(BUILD): all ctest tests but the valgrind ones
#                       valgrind  $(BUILD): unit and api tests under valgrind memcheck
#                       asan      $(BUILD)-asan: the whole suite, ASan+UBSan, GM_DEBUG=3
#                       tsan      $(BUILD)-tsan: the stress, attack, share, broker, offload and multigpu tests under TSan
#                       fuzz      $(BUILD)-fuzz: each tests/fuzz/*.c target for
#                                 FUZZ_TIME seconds (clang + libFuzzer only)
#   make demo         build the CLI only (and the library it links), then replay
#                     data/sample.csv.gz with it (an uncompressed copy in $(BUILD)
#                     when the build has no zlib)
#   make lib          build libgpumem.so and libgpumem.a only (for your own programs)
#   make results      regenerate docs/results.md from bench/results/*.json
#   make install      build the library, CLI and preload library, then
#                     `cmake --install` them into PREFIX (/usr/local; DESTDIR
#                     is honoured)
#   make clean        remove every build directory
#
# Every build here is configured with GM_WERROR=ON (warnings are errors);
# CMake alone leaves it OFF, for packagers.
# Knobs: BUILD=dir (prefix of all build dirs), JOBS=n, FUZZ_TIME=s, CMAKE_ARGS=...
# (added to every configure), PHASES="normal asan", TEST_BACKEND=sim|cuda|auto
# (the backend every test runs on; sim by default, also on a GPU machine).

SHELL := /bin/bash
.NOTPARALLEL:
# cmake --build runs make again; the directory chatter of nested makes is noise.
MAKEFLAGS += --no-print-directory
.PHONY: all test demo install clean

BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE ?= cmake
CTEST ?= ctest
FUZZ_TIME ?= 30
FUZZ_CC ?= clang
CMAKE_ARGS ?=
PHASES ?= normal valgrind asan tsan fuzz
TEST_BACKEND ?= sim
PREFIX ?= /usr/local

HAVE_VALGRIND := $(shell command -v valgrind >/dev/null 2>&1 && echo ON || echo OFF)
# The same configuration for `make` and `make test`, so they share $(BUILD).
NORMAL_CONFIG := -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGM_DEBUG_LEVEL=1 -DGM_SANITIZE= \
                 -DGM_FUZZ=OFF -DGM_VALGRIND=$(HAVE_VALGRIND) -DGM_TEST_BACKEND=$(TEST_BACKEND) \
                 -DGM_WERROR=ON -DBUILD_TESTING=ON
CONFIGURE = $(CMAKE) -S . -B $(BUILD) --log-level=WARNING $(NORMAL_CONFIG) $(CMAKE_ARGS)

all:
	$(CONFIGURE)
	$(CMAKE) --build $(BUILD) -j $(JOBS)

# The libraries alone (libgpumem.so and libgpumem.a), for programs of your own
# (README, "Using it from C"): no CLI, tests, benchmarks or plug-ins.
.PHONY: lib
lib:
	$(CONFIGURE)
	$(CMAKE) --build $(BUILD) -j $(JOBS) --target gpumem_shared gpumem_static

# The demo needs the CLI alone: no tests, no benchmarks, no plug-ins.
demo:
	@test -f data/sample.csv.gz || { echo "make demo: data/sample.csv.gz does not exist yet" >&2; exit 1; }
	$(CONFIGURE)
	$(CMAKE) --build $(BUILD) -j $(JOBS) --target gpumem_cli
	@if grep -q '^GM_HAVE_ZLIB:INTERNAL=1$$' $(BUILD)/CMakeCache.txt; then \
	  trace=data/sample.csv.gz; \
	else \
	  trace=$(BUILD)/sample.csv; \
	  echo "make demo: this build has no zlib; replaying an uncompressed copy, $$trace"; \
	  gzip -dc data/sample.csv.gz >$$trace || { echo "make demo: gzip -dc failed" >&2; exit 1; }; \
	fi; \
	echo "$(BUILD)/gpumem replay $$trace"; \
	$(BUILD)/gpumem replay $$trace

# What `cmake --install` installs, built without the tests.
install:
	$(CONFIGURE) -DCMAKE_INSTALL_PREFIX=$(PREFIX)
	$(CMAKE) --build $(BUILD) -j $(JOBS) --target gpumem_installed
	$(CMAKE) --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-tsan $(BUILD)-fuzz

# The test driver is a bash script kept here (exported unexpanded through
# $(value ...)) so that `make test` needs no other file.
export GM_T_BUILD := $(BUILD)
export GM_T_JOBS := $(JOBS)
export GM_T_CMAKE := $(CMAKE)
export GM_T_CTEST := $(CTEST)
export GM_T_FUZZ_TIME := $(FUZZ_TIME)
export GM_T_FUZZ_CC := $(FUZZ_CC)
export GM_T_CMAKE_ARGS := $(CMAKE_ARGS)
export GM_T_NORMAL_CONFIG := $(NORMAL_CONFIG)
export GM_T_HAVE_VALGRIND := $(HAVE_VALGRIND)
export GM_T_TEST_BACKEND := $(TEST_BACKEND)

test:
	@bash -c "$$GM_TEST_SCRIPT" make-test $(PHASES)

define TEST_SCRIPT
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
endef
export GM_TEST_SCRIPT = $(value TEST_SCRIPT)

# make results: docs/results.md, the newest figure of each benchmark and an
# index of every results file, generated from bench/results/ (the ctest
# docs/results_current fails when it is stale).
.PHONY: results
results:
	python3 scripts/results_index.py --write docs/results.md

# make wheel: the Python wheel, carrying libgpumem.so built from the sources
# (python/build_wheel.sh), into $(BUILD)/wheel/gpumem-VERSION-py3-none-PLATFORM.whl.
.PHONY: wheel
wheel:
	GPUMEM_WHEEL_JOBS=$(JOBS) GPUMEM_WHEEL_CMAKE_ARGS="$(CMAKE_ARGS)" bash python/build_wheel.sh $(BUILD)/wheel
