/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_host_sysmem.c — the sysmem fallback policy: off by default (an
 * allocation past device memory fails), on with GM_POOL_SYSMEM_FALLBACK or
 * GPUMEM_SYSMEM_FALLBACK=1 (served from mapped pinned host memory, counted
 * apart in the stats, usable by device copies, freed, sized and recorded like
 * any block), and a failing fallback keeps the original out-of-memory error.
 * Needs the sim backend.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpumem.h"
#include "../test.h"
#include "../lib/checks.h"

#define MiB ((size_t)1 << 20)

static gm_pool_t *new_pool(unsigned flags) { return sim_pool(64 * MiB, flags); }

static void test_off(void)
{
    gm_pool_t *pool = new_pool(0);
    if (!pool) { CHECK(0); return; }
    void *a, *b;
    CHECK_OK(gm_alloc(pool, 48 * MiB, NULL, &a));
    int rc = gm_alloc(pool, 32 * MiB, NULL, &b);
    CHECK(rc == GM_OUT_OF_MEMORY || rc == GM_LIMIT);
    CHECK(b == NULL);
    CHECK(pool_stats_of(pool).sysmem_count == 0);
    CHECK_OK(gm_free(pool, a, NULL));
    gm_pool_destroy(pool);

    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.flags = 0x80;
    CHECK_RC(gm_pool_create(&cfg, &pool), GM_INVALID_ARGUMENT);
}

static void test_on(void)
{
    gm_pool_t *pool = new_pool(GM_POOL_SYSMEM_FALLBACK);
    if (!pool) { CHECK(0); return; }
    void *a, *b, *c;
    CHECK_OK(gm_alloc(pool, 48 * MiB, NULL, &a));
    gm_stats_t st0 = pool_stats_of(pool);
    CHECK_OK(gm_alloc(pool, 32 * MiB + 3, NULL, &b));
    CHECK(b != NULL);
    gm_stats_t st = pool_stats_of(pool);
    CHECK(st.sysmem_allocated == 32 * MiB + 3);
    CHECK(st.sysmem_allocated_peak == 32 * MiB + 3);
    CHECK(st.sysmem_count == 1);
    CHECK(st.allocated == st0.allocated); /* not counted as device memory */
    CHECK(st.live_blocks == st0.live_blocks);
    CHECK(st.host_allocated >= 32 * MiB);
    CHECK(st.alloc_failures >= 1); /* the device could not serve it ... */
    CHECK(st.oom_count == st0.oom_count); /* ... but the caller got memory: no OOM */
    size_t sz = 0;
    CHECK_OK(gm_block_size(pool, b, &sz));
    CHECK(sz == 32 * MiB + 3);
    /* The device can use it: copies and fills through the backend. */
    CHECK_OK(gm_memset(pool, b, 0x5a, 32 * MiB + 3, NULL));
    CHECK_OK(gm_memcpy(pool, a, b, MiB, NULL));
    unsigned char probe[16];
    CHECK_OK(gm_memcpy(pool, probe, (char *)a + 100, sizeof probe, NULL));
    CHECK(probe[0] == 0x5a && probe[15] == 0x5a);
    gm_stream_t S;
    CHECK_OK(gm_stream_create(pool, &S));
    CHECK_OK(gm_record_stream(pool, b, S));
    CHECK_OK(gm_alloc(pool, 24 * MiB, NULL, &c)); /* a second one */
    CHECK(pool_stats_of(pool).sysmem_count == 2);
    CHECK_OK(gm_free(pool, b, NULL));
    CHECK_RC(gm_free(pool, b, NULL), GM_INVALID_POINTER);
    CHECK_RC(gm_block_size(pool, b, &sz), GM_INVALID_POINTER);
    CHECK_OK(gm_free(pool, c, NULL));
    st = pool_stats_of(pool);
    CHECK(st.sysmem_allocated == 0 && st.sysmem_allocated_peak == 32 * MiB + 3 + 24 * MiB);
    char json[8192];
    CHECK_OK(gm_stats_json(&st, json, sizeof json, NULL));
    CHECK(strstr(json, "\"sysmem_count\":2") != NULL);
    CHECK_OK(gm_pool_check(pool));

    /* The fallback failing too keeps the out-of-memory status. */
    CHECK_OK(gm_sim_fail_nth(pool, GM_CALL_host_register, 1));
    CHECK_OK(gm_host_trim(pool, 0, NULL));
    int rc = gm_alloc(pool, 32 * MiB, NULL, &b);
    CHECK(rc == GM_OUT_OF_MEMORY || rc == GM_LIMIT);
    CHECK(strstr(gm_last_error(), "sysmem fallback failed too") != NULL);
    CHECK(pool_stats_of(pool).sysmem_count == 2);

    /* A block left live is released with the pool. */
    CHECK_OK(gm_alloc(pool, 32 * MiB, NULL, &b));
    CHECK_OK(gm_free(pool, a, NULL));
    CHECK_OK(gm_stream_destroy(pool, S));
    gm_pool_destroy(pool);
}

static void test_env(void)
{
    setenv("GPUMEM_SYSMEM_FALLBACK", "1", 1);
    gm_pool_config_t cfg;
    CHECK_OK(gm_config_from_env(&cfg));
    CHECK(cfg.flags & GM_POOL_SYSMEM_FALLBACK);
    setenv("GPUMEM_SYSMEM_FALLBACK", "yes", 1);
    CHECK_RC(gm_config_from_env(&cfg), GM_INVALID_ARGUMENT);
    unsetenv("GPUMEM_SYSMEM_FALLBACK");
    CHECK_OK(gm_config_from_env(&cfg));
    CHECK(!(cfg.flags & GM_POOL_SYSMEM_FALLBACK));
}

int main(void)
{
    static void (*const tests[])(void) = {test_off, test_on, test_env};
    return sim_tests_main("test_host_sysmem", tests, sizeof tests / sizeof tests[0]);
}
