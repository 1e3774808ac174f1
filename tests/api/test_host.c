/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_host.c — the pinned host pool through the public API: allocation,
 * data, bad input, the stream reuse rule (with held sim streams), trim, the
 * stats, every backend call it makes failing in turn (clean error, nothing
 * lost), and the sim's cost model telling pinned from pageable copies.
 * Needs the sim backend (held streams, fault injection).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpumem.h"
#include "../test.h"
#include "../lib/checks.h"

#define MiB ((size_t)1 << 20)

static gm_pool_t *new_pool(void) { return sim_pool(256 * MiB, 0); }

static void test_basic(void)
{
    gm_pool_t *pool = new_pool();
    if (!pool) { CHECK(0); return; }
    void *p[64];
    size_t sizes[64];
    size_t total = 0;
    for (int i = 0; i < 64; i++) {
        sizes[i] = (size_t)(i * 977 + 1) * (i % 7 == 0 ? 17 : 3);
        CHECK_OK(gm_host_alloc(pool, sizes[i], NULL, &p[i]));
        CHECK(p[i] != NULL && (uintptr_t)p[i] % GM_ALIGNMENT == 0);
        if (p[i]) memset(p[i], i, sizes[i]);
        total += sizes[i];
    }
    int ok = 1;
    for (int i = 0; i < 64; i++)
        for (size_t j = 0; p[i] && j < sizes[i]; j += 61) ok &= ((unsigned char *)p[i])[j] == i;
    CHECK(ok);
    gm_stats_t st = pool_stats_of(pool);
    CHECK(st.host_allocated == total);
    CHECK(st.host_allocated_peak == total);
    CHECK(st.host_alloc_count == 64);
    CHECK(st.host_reserved >= total && st.host_reserved == 32 * MiB);
    CHECK(st.backend_calls[GM_CALL_host_register] == 1);
    CHECK(st.backend_calls[GM_CALL_host_device_pointer] == 1);

    /* Bad input. */
    void *q = (void *)1;
    CHECK_RC(gm_host_alloc(pool, 0, NULL, &q), GM_OK);
    CHECK(q == NULL);
    CHECK_RC(gm_host_alloc(pool, 16, NULL, NULL), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_host_alloc(pool, (size_t)1 << 62, NULL, &q), GM_NO_HOST_MEMORY);
    CHECK(strstr(gm_last_error(), "gm_host_alloc") != NULL);
    CHECK_OK(gm_host_free(pool, NULL, NULL));
    int x;
    CHECK_RC(gm_host_free(pool, &x, NULL), GM_INVALID_POINTER);
    CHECK_RC(gm_host_free(pool, (char *)p[3] + 256, NULL), GM_INVALID_POINTER);

    for (int i = 0; i < 64; i++) CHECK_OK(gm_host_free(pool, p[i], NULL));
    CHECK_RC(gm_host_free(pool, p[5], NULL), GM_INVALID_POINTER); /* double free */
    st = pool_stats_of(pool);
    CHECK(st.host_allocated == 0 && st.host_allocated_peak == total);
    CHECK_OK(gm_pool_reset_peaks(pool));
    CHECK(pool_stats_of(pool).host_allocated_peak == 0);

    /* A large request gets a chunk of its own (64 KiB rounding); growing
     * first gives back the wholly free small chunk (unused <= in use / 20). */
    void *big;
    CHECK_OK(gm_host_alloc(pool, 40 * MiB + 5, NULL, &big));
    st = pool_stats_of(pool);
    CHECK(st.host_reserved == 40 * MiB + 64 * 1024);
    CHECK(st.backend_calls[GM_CALL_host_unregister] == 1);
    if (big) memset(big, 7, 40 * MiB + 5);
    CHECK_OK(gm_host_free(pool, big, NULL));
    /* Reused whole by a request it fits within 1/32, not by a smaller one. */
    void *big2;
    CHECK_OK(gm_host_alloc(pool, 39 * MiB, NULL, &big2));
    CHECK(big2 == big);
    CHECK_OK(gm_host_free(pool, big2, NULL));
    uint64_t regs = pool_stats_of(pool).backend_calls[GM_CALL_host_register];
    CHECK_OK(gm_host_alloc(pool, 20 * MiB, NULL, &big2));
    CHECK(pool_stats_of(pool).backend_calls[GM_CALL_host_register] == regs + 1); /* a chunk of its own */
    CHECK_OK(gm_host_free(pool, big2, NULL));

    size_t rel = 0;
    size_t before = pool_stats_of(pool).host_reserved;
    CHECK(before == 20 * MiB); /* growing gave the free 40 MiB chunk back */
    CHECK_OK(gm_host_trim(pool, 20 * MiB, &rel));
    CHECK(rel == 0);
    CHECK_OK(gm_host_trim(pool, 0, &rel));
    CHECK(rel == before && pool_stats_of(pool).host_reserved == 0);
    /* It grows again after a trim. */
    CHECK_OK(gm_host_alloc(pool, 100, NULL, &q));
    CHECK_OK(gm_host_free(pool, q, NULL));
    gm_pool_destroy(pool);
}

/* A block freed on S is reused at once on S, by other streams only after S
 * passed the free. */
static void test_stream_rule(void)
{
    gm_pool_t *pool = new_pool();
    if (!pool) { CHECK(0); return; }
    gm_stream_t S, T, U;
    CHECK_OK(gm_stream_create(pool, &S));
    CHECK_OK(gm_stream_create(pool, &T));
    CHECK_OK(gm_stream_create(pool, &U));
    /* The whole first chunk, on S; the same stream gets it back at once. */
    void *p = reused_on_held_stream(pool, gm_host_alloc, gm_host_free, 32 * MiB, S), *r, *w;
    /* Another stream while S is in flight: not that block. */
    CHECK_OK(gm_host_alloc(pool, 32 * MiB, T, &r));
    CHECK(r != p);
    CHECK(pool_stats_of(pool).host_reserved == 64 * MiB);
    CHECK_OK(gm_host_free(pool, r, T));
    /* A slightly smaller block on T is T's own free one. */
    CHECK_OK(gm_host_alloc(pool, 31 * MiB + 512 * 1024, T, &w));
    CHECK(w == r);
    CHECK_OK(gm_host_free(pool, w, T));
    /* Trim cannot take S's chunk while S is in flight. */
    size_t rel = 0;
    CHECK_OK(gm_host_trim(pool, 0, &rel));
    CHECK(rel == 32 * MiB);
    CHECK(pool_stats_of(pool).host_reserved == 32 * MiB);
    /* Once S has passed the free, U gets it, without growing. */
    CHECK_OK(gm_sim_hold_stream(pool, S, 0));
    CHECK_OK(gm_host_alloc(pool, 32 * MiB, U, &w));
    CHECK(w == p);
    CHECK(pool_stats_of(pool).host_reserved == 32 * MiB);
    CHECK_OK(gm_host_free(pool, w, U));
    CHECK_OK(gm_stream_destroy(pool, S));
    CHECK_OK(gm_stream_destroy(pool, T));
    CHECK_OK(gm_stream_destroy(pool, U));
    gm_pool_destroy(pool);
}

/* Every backend call of growth and trim fails in turn: a clean error, no
 * memory held, and the next try works. */
static void test_faults(void)
{
    gm_pool_t *pool = new_pool();
    if (!pool) { CHECK(0); return; }
    const int kinds[] = {GM_CALL_host_register, GM_CALL_host_device_pointer};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        void *p = (void *)1;
        CHECK_OK(gm_sim_fail_nth(pool, kinds[k], 1));
        CHECK_RC(gm_host_alloc(pool, 1000, NULL, &p), GM_BACKEND);
        CHECK(p == NULL);
        char want[64];
        snprintf(want, sizeof want, "injected failure of %s", gm_call_name(kinds[k]));
        CHECK(strstr(gm_last_error(), want) != NULL);
        gm_stats_t st = pool_stats_of(pool);
        CHECK(st.host_reserved == 0 && st.host_allocated == 0);
        /* The register call was undone when the device-pointer call failed. */
        CHECK(st.backend_calls[GM_CALL_host_unregister] == k);
    }
    void *p;
    CHECK_OK(gm_host_alloc(pool, 1000, NULL, &p));
    CHECK_OK(gm_host_free(pool, p, NULL));
    CHECK_OK(gm_sim_fail_nth(pool, GM_CALL_host_unregister, 1));
    size_t rel = 1;
    CHECK_RC(gm_host_trim(pool, 0, &rel), GM_BACKEND);
    CHECK(rel == 0);
    CHECK(pool_stats_of(pool).host_reserved == 32 * MiB);
    CHECK_OK(gm_host_trim(pool, 0, &rel));
    CHECK(rel == 32 * MiB && pool_stats_of(pool).host_reserved == 0);
    /* Reclaim's event calls failing only delay reuse (here: until growth
     * reclaims again and gives the free chunk back). */
    gm_stream_t S;
    CHECK_OK(gm_stream_create(pool, &S));
    CHECK_OK(gm_host_alloc(pool, 32 * MiB, S, &p));
    CHECK_OK(gm_host_free(pool, p, S));
    CHECK_OK(gm_sim_fail_nth(pool, GM_CALL_event_record, 1));
    void *q;
    CHECK_OK(gm_host_alloc(pool, 32 * MiB, NULL, &q));
    CHECK(strcmp(gm_last_error(), "") == 0);
    CHECK(pool_stats_of(pool).host_reserved == 32 * MiB);
    CHECK_OK(gm_host_free(pool, q, NULL));
    CHECK_OK(gm_stream_destroy(pool, S));
    gm_pool_destroy(pool);
}

/* The sim charges pageable copies at 7.9 / 12.2 GB/s and pinned ones at
 * 55 GB/s, so staging through pinned memory shows in modeled time. */
static void test_cost_model(void)
{
    gm_pool_t *pool = new_pool();
    if (!pool) { CHECK(0); return; }
    const size_t n = 16 * MiB;
    void *dev, *pinned, *pageable = malloc(n);
    CHECK_OK(gm_alloc(pool, n, NULL, &dev));
    CHECK_OK(gm_host_alloc(pool, n, NULL, &pinned));
    if (!pageable || !dev || !pinned) { CHECK(0); free(pageable); gm_pool_destroy(pool); return; }
    memset(pageable, 1, n);
    memset(pinned, 2, n);
    uint64_t t0 = pool_stats_of(pool).modeled_device_ns;
    CHECK_OK(gm_memcpy(pool, dev, pageable, n, NULL));
    uint64_t t1 = pool_stats_of(pool).modeled_device_ns;
    CHECK_OK(gm_memcpy(pool, dev, pinned, n, NULL));
    uint64_t t2 = pool_stats_of(pool).modeled_device_ns;
    CHECK_OK(gm_memcpy(pool, pageable, dev, n, NULL));
    uint64_t t3 = pool_stats_of(pool).modeled_device_ns;
    double h2d_pageable = (double)n / (double)(t1 - t0), h2d_pinned = (double)n / (double)(t2 - t1);
    double d2h_pageable = (double)n / (double)(t3 - t2);
    printf("sim model: H2D pageable %.1f GB/s, pinned %.1f GB/s; D2H pageable %.1f GB/s\n",
           h2d_pageable, h2d_pinned, d2h_pageable);
    CHECK(h2d_pageable > 7.5 && h2d_pageable < 8.0);
    CHECK(h2d_pinned > 50 && h2d_pinned < 56);
    CHECK(d2h_pageable > 11.8 && d2h_pageable < 12.4);
    CHECK(((unsigned char *)pageable)[n - 1] == 2);
    CHECK_OK(gm_free(pool, dev, NULL));
    CHECK_OK(gm_host_free(pool, pinned, NULL));
    free(pageable);
    gm_pool_destroy(pool);
}

int main(void)
{
    static void (*const tests[])(void) = {test_basic, test_stream_rule, test_faults, test_cost_model};
    return sim_tests_main("test_host", tests, sizeof tests / sizeof tests[0]);
}
