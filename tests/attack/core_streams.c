/* SPDX-License-Identifier: Apache-2.0 */
/*
 * core_streams.c — attacks stream bookkeeping: "a trace with 65 535 streams
 * ... the library keeps ~20 KiB per stream per pool for the pool's life",
 * and finds a stream by a linear scan.  Each of 65 535 distinct stream
 * handles allocates and frees on the sim; afterwards the pool holds a bounded
 * number of stream states (the streams in use, not every stream ever seen),
 * and the whole run takes seconds.  Streams with live blocks stay known.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "gpumem.h"
#include "core/pool.h"
#include "../test.h"

#define MiB ((size_t)1 << 20)

static size_t stream_states(gm_pool_t *pool)
{
    gm__lock(&pool->lock);
    size_t n = gm__stream_count_locked(pool);
    gm__unlock(&pool->lock);
    return n;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(void)
{
    size_t n = getenv("GM_UNDER_VALGRIND") ? 4096 : 65535;
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = GM_BACKEND_SIM;
    cfg.sim_capacity = 256 * MiB;
    gm_pool_t *pool = pool_from(&cfg);
    REQUIRE(pool != NULL);
    double t0 = now();
    for (size_t i = 1; i <= n; i++) {
        gm_stream_t s = (gm_stream_t)(uintptr_t)(i * 16);
        void *p;
        CHECK_RC(gm_alloc(pool, 256 * (1 + i % 8), s, &p), GM_OK);
        CHECK_RC(gm_free(pool, p, s), GM_OK);
    }
    double dt = now() - t0;
    size_t states = stream_states(pool);
    printf("%zu streams: %.3f s, %zu stream states kept\n", n, dt, states);
    CHECK(states <= 256);
    CHECK(dt < 30);

    /* Streams holding live blocks are kept, and work after a sweep. */
    void *live[300];
    for (size_t i = 0; i < 300; i++)
        CHECK_RC(gm_alloc(pool, 4096, (gm_stream_t)(uintptr_t)(0x100000 + i * 16), &live[i]), GM_OK);
    for (size_t i = 0; i < 300; i++) /* free on another stream: the first stays referenced till here */
        CHECK_RC(gm_free(pool, live[i], (gm_stream_t)(uintptr_t)(0x100000 + ((i + 1) % 300) * 16)),
                 GM_OK);
    CHECK_OK(gm_pool_check(pool));
    for (size_t i = 1; i <= 2000; i++) { /* new streams: sweeps drop the idle */
        void *p;
        CHECK_RC(gm_alloc(pool, 512, (gm_stream_t)(uintptr_t)(0x200000 + i * 16), &p), GM_OK);
        CHECK_RC(gm_free(pool, p, (gm_stream_t)(uintptr_t)(0x200000 + i * 16)), GM_OK);
    }
    CHECK(stream_states(pool) <= 256);
    CHECK_OK(gm_stream_forget(pool, (gm_stream_t)(uintptr_t)(0x200000 + 2000 * 16)));
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
    return test_summary();
}
