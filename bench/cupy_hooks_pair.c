/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cupy_hooks_pair.c — the C cost of gpumem's CuPy path without CuPy: one
 * million gm_cupy_malloc + gm_cupy_free pairs on device 0 with a
 * current-stream hook that answers the legacy stream, next to plain
 * gm_alloc + gm_free pairs on the same stream, for 512 B, 64 KiB and 2 MiB.
 * Not part of the build:
 *
 *   cc -O2 -Iinclude bench/cupy_hooks_pair.c -o cupy_hooks_pair -Lbuild -lgpumem \
 *      -Wl,-rpath,$PWD/build && ./cupy_hooks_pair
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "gpumem.h"

static intptr_t legacy_stream(void) { return 0; }

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(void)
{
    gm_cupy_hooks_t h = {sizeof h, GM_CUPY_HOOKS_VERSION, legacy_stream, 0, 0, 0, 0, 0};
    gm_pool_t *pool;
    if (gm_device_pool(0, &pool) != GM_OK) {
        fprintf(stderr, "gm_device_pool: %s\n", gm_last_error());
        return 1;
    }
    const size_t sizes[3] = {512, 64u << 10, 2u << 20};
    const int n = 1000000;
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < 10000; i++) gm_cupy_free(&h, gm_cupy_malloc(&h, sizes[s], 0), 0);
        double t0 = now();
        for (int i = 0; i < n; i++) gm_cupy_free(&h, gm_cupy_malloc(&h, sizes[s], 0), 0);
        double t1 = now();
        for (int i = 0; i < n; i++) {
            void *p;
            if (gm_alloc(pool, sizes[s], NULL, &p) != GM_OK) return 1;
            gm_free(pool, p, NULL);
        }
        double t2 = now();
        printf("size %zu: gm_cupy pair %.1f ns, gm_alloc/gm_free pair %.1f ns\n", sizes[s],
               (t1 - t0) * 1e9 / n, (t2 - t1) * 1e9 / n);
    }
    return 0;
}
