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

# The test driver is tests/run.sh; these are its settings.
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
	@bash tests/run.sh $(PHASES)


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
