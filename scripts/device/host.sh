#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/device/host.sh — host memory on the GPU machine: the benchmark that
# writes bench/results/DATE-GPU-host.{md,json}, then the host-memory tests
# against the GPU.
#
# Run from the repository root:  OUT=/some/dir scripts/device/host.sh
# Steps (each logged to $OUT/host-<step>.log; a failing step is recorded and
# the next one still runs):
#   bench    bench/run_host_bench.sh (builds gpumem + bench/host_bench.c with
#            the CUDA toolkit; results into bench/results and $OUT)
#   stress   tests/stress/test_copy_stress on the cuda backend: 8 threads x
#            2 streams, 3 MiB x 4 device buffers, 400 iterations, every
#            device-to-host copy checked
#   sysmem   a pool with GPUMEM_SYSMEM_FALLBACK=1 and a 1 GiB limit: a
#            second 768 MiB block comes from mapped host memory; the device
#            fills it and reads it back (a small C program built here)
# Exit status: the number of failed steps.
# STEPS="stress sysmem" picks steps; BACKEND=sim runs stress and sysmem on
# the sim (a dry run of this script without a GPU).
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 1
. bench/lib.sh
gm_default BUILD_DIR="build-device" BACKEND="cuda" STEPS="bench stress sysmem"
gm_outdir
failed=()

step() { # name command...
    local name=$1
    shift
    echo "=== $name"
    local start=$SECONDS
    "$@" 2>&1 | tee "$OUT/host-$name.log"
    local st=${PIPESTATUS[0]}
    echo "--- $name: exit $st, $((SECONDS - start)) s" | tee -a "$OUT/host-$name.log"
    [ "$st" -eq 0 ] || failed+=("$name")
}

run_bench() {
    OUT="$OUT" BUILD_DIR="$BUILD_DIR" bench/run_host_bench.sh
}

run_stress() {
    cmake -S . -B "$BUILD_DIR" >/dev/null 2>&1 || { echo "FAILED: configure"; return 1; }
    cmake --build "$BUILD_DIR" -j "$(nproc)" --target stress_test_copy_stress >/dev/null 2>&1 ||
        cmake --build "$BUILD_DIR" -j "$(nproc)" >/dev/null 2>&1 || { echo "FAILED: build"; return 1; }
    local exe="$BUILD_DIR/tests/stress/test_copy_stress"
    [ -x "$exe" ] || { echo "FAILED: $exe not built"; return 1; }
    GPUMEM_BACKEND=$BACKEND GPUMEM_TEST_BACKEND=$BACKEND timeout 300 "$exe" 8 4 400 7
}

run_sysmem() {
    local src="$BUILD_DIR/sysmem_check.c" exe="$BUILD_DIR/sysmem_check"
    { cmake -S . -B "$BUILD_DIR" >/dev/null && cmake --build "$BUILD_DIR" -j "$(nproc)" --target gpumem_static >/dev/null; } ||
        { echo "FAILED: gpumem build"; return 1; }
    cat >"$src" <<'C'
#include <stdio.h>
#include <string.h>
#include "gpumem.h"
int main(void)
{
    gm_pool_t *pool;
    gm_pool_config_t cfg;
    if (gm_config_from_env(&cfg) != GM_OK || gm_pool_create(&cfg, &pool) != GM_OK) {
        printf("FAILED pool: %s\n", gm_last_error());
        return 1;
    }
    void *d = NULL, *p = NULL;
    size_t n = (size_t)768 << 20;
    int rc = gm_alloc(pool, n, NULL, &d);
    if (rc == GM_OK) rc = gm_alloc(pool, n, NULL, &p);
    if (rc != GM_OK) { printf("FAILED gm_alloc: %s\n", gm_last_error()); return 1; }
    unsigned char probe[64];
    rc = gm_memset(pool, p, 0x5a, n, NULL);
    if (rc == GM_OK) rc = gm_memcpy(pool, probe, (char *)p + n - 64, 64, NULL);
    if (rc == GM_OK) rc = gm_stream_synchronize(pool, NULL);
    gm_stats_t st = GM_STATS_INIT;
    gm_pool_stats(pool, &st);
    printf("sysmem_allocated %llu, sysmem_count %llu, allocated %llu, probe %#x\n",
           (unsigned long long)st.sysmem_allocated, (unsigned long long)st.sysmem_count,
           (unsigned long long)st.allocated, probe[63]);
    int ok = rc == GM_OK && st.sysmem_count == 1 && st.sysmem_allocated == n && probe[63] == 0x5a;
    if (gm_free(pool, p, NULL) != GM_OK || gm_free(pool, d, NULL) != GM_OK) ok = 0;
    gm_pool_destroy(pool);
    printf("%s\n", ok ? "sysmem fallback: ok" : "FAILED sysmem fallback");
    return !ok;
}
C
    ${CC:-cc} -O2 -std=c11 -D_GNU_SOURCE -Iinclude "$src" "$BUILD_DIR/libgpumem.a" -lz -lpthread -ldl -lm \
        -o "$exe" 2>/dev/null ||
        ${CC:-cc} -O2 -std=c11 -D_GNU_SOURCE -Iinclude "$src" "$BUILD_DIR/libgpumem.a" -lpthread -ldl -lm \
            -o "$exe" || { echo "FAILED: build"; return 1; }
    GPUMEM_BACKEND=$BACKEND GPUMEM_LIMIT=1GiB GPUMEM_SYSMEM_FALLBACK=1 timeout 120 "$exe"
}

for s in $STEPS; do
    case $s in
    bench) step bench run_bench ;;
    stress) step stress run_stress ;;
    sysmem) step sysmem run_sysmem ;;
    *) echo "unknown step $s"; failed+=("$s") ;;
    esac
done
echo
echo "host steps failed: ${#failed[@]} ${failed[*]:-}"
echo "results: bench/results/*-host.{md,json} and $OUT/"
exit "${#failed[@]}"
