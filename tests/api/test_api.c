/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_api.c — the public API through include/gpumem.h only: allocation,
 * bad input, limits, the stream rule, trim, stats, data kept through page
 * moves, a steady state with no backend calls, and fault injection.
 *
 * Runs on the sim backend by default; GPUMEM_TEST_BACKEND=cuda runs the same
 * checks on a GPU (the sim-only ones — fault injection, held streams — are
 * skipped there and say so).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpumem.h"
#include "../test.h"
#include "../lib/checks.h"

#define MiB ((size_t)1 << 20)

static int is_sim(void) { return test_backend() == GM_BACKEND_SIM; }

static uint64_t total_calls(const gm_stats_t *st)
{
    uint64_t n = 0;
    for (int k = 0; k < GM_CALL_COUNT; k++) n += st->backend_calls[k];
    return n;
}

/* Fill a device range with a pattern derived from seed, through the backend. */
static void put_pattern(gm_pool_t *pool, void *dev, size_t n, unsigned seed)
{
    unsigned char *h = malloc(n);
    for (size_t i = 0; i < n; i++) h[i] = (unsigned char)(seed * 131 + i * 7 + (i >> 12));
    CHECK_OK(gm_memcpy(pool, dev, h, n, NULL));
    CHECK_OK(gm_stream_synchronize(pool, NULL));
    free(h);
}

static int has_pattern(gm_pool_t *pool, const void *dev, size_t n, unsigned seed)
{
    unsigned char *h = malloc(n);
    int ok = gm_memcpy(pool, h, dev, n, NULL) == GM_OK && gm_stream_synchronize(pool, NULL) == GM_OK;
    for (size_t i = 0; ok && i < n; i++)
        if (h[i] != (unsigned char)(seed * 131 + i * 7 + (i >> 12))) ok = 0;
    free(h);
    return ok;
}

static void test_basics(void)
{
    gm_pool_t *pool = test_pool(256 * MiB, 0);
    if (!pool) { CHECK(pool != NULL); return; }
    void *p = (void *)1, *q = NULL;
    CHECK_OK(gm_alloc(pool, 0, NULL, &p));
    CHECK(p == NULL);
    CHECK_OK(gm_free(pool, NULL, NULL));
    CHECK_RC(gm_alloc(pool, 16, NULL, NULL), GM_INVALID_ARGUMENT);
    size_t sizes[] = {1, 255, 256, 257, 4096, 100000, MiB, 2 * MiB + 1, 9 * MiB};
    void *ptrs[9];
    for (int i = 0; i < 9; i++) {
        CHECK_OK(gm_alloc(pool, sizes[i], NULL, &ptrs[i]));
        CHECK(ptrs[i] != NULL && ((uintptr_t)ptrs[i] % GM_ALIGNMENT) == 0);
        size_t got = 0;
        CHECK_OK(gm_block_size(pool, ptrs[i], &got));
        CHECK(got == sizes[i]);
        put_pattern(pool, ptrs[i], sizes[i], (unsigned)i);
    }
    for (int i = 0; i < 9; i++) CHECK(has_pattern(pool, ptrs[i], sizes[i], (unsigned)i));
    gm_stats_t st = pool_stats_of(pool);
    size_t total = 0;
    for (int i = 0; i < 9; i++) total += sizes[i];
    CHECK(st.allocated == total && st.live_blocks == 9 && st.alloc_count == 9);
    CHECK(st.reserved >= st.active && st.active >= st.allocated);
    CHECK_OK(gm_pool_check(pool));
    for (int i = 0; i < 9; i++) CHECK_OK(gm_free(pool, ptrs[i], NULL));
    st = pool_stats_of(pool);
    CHECK(st.allocated == 0 && st.active == 0 && st.live_blocks == 0 && st.free_count == 9);
    CHECK(st.allocated_peak == total);
    CHECK_OK(gm_pool_reset_peaks(pool));
    st = pool_stats_of(pool);
    CHECK(st.allocated_peak == 0);
    /* JSON has every field. */
    char buf[4096];
    size_t len = 0;
    CHECK_OK(gm_stats_json(&st, buf, sizeof buf, &len));
    CHECK(len == strlen(buf) && strstr(buf, "\"reserved_peak\":") && strstr(buf, "\"map\":"));
    CHECK_RC(gm_stats_json(&st, buf, 8, &len), GM_INVALID_ARGUMENT);
    CHECK(strlen(buf) == 7);
    /* The same size comes back at the same place. */
    CHECK_OK(gm_alloc(pool, 3 * MiB, NULL, &p));
    CHECK_OK(gm_free(pool, p, NULL));
    CHECK_OK(gm_alloc(pool, 3 * MiB, NULL, &q));
    CHECK(p == q);
    CHECK_OK(gm_free(pool, q, NULL));
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
    gm_pool_destroy(NULL);
}

static void test_bad_input(void)
{
    gm_pool_t *pool = test_pool(64 * MiB, 0);
    if (!pool) { CHECK(pool != NULL); return; }
    void *p, *q;
    int host, rc;
    CHECK_RC(gm_free(pool, &host, NULL), GM_INVALID_POINTER);
    CHECK(strstr(gm_last_error(), "not allocated by this pool") != NULL);
    CHECK_OK(gm_alloc(pool, 4096, NULL, &p));
    CHECK_OK(gm_alloc(pool, 4096, NULL, &q));
    CHECK_RC(gm_free(pool, (char *)p + 256, NULL), GM_INVALID_POINTER);
    CHECK(strstr(gm_last_error(), "inside the live block") != NULL);
    CHECK_OK(gm_free(pool, p, NULL));
    CHECK_RC(gm_free(pool, p, NULL), GM_DOUBLE_FREE);
    CHECK(strstr(gm_last_error(), "already freed") != NULL);
    CHECK_RC(gm_alloc(pool, SIZE_MAX, NULL, &p), GM_OUT_OF_MEMORY);
    CHECK(p == NULL);
    CHECK_RC(gm_alloc(pool, (size_t)1 << 45, NULL, &p), GM_OUT_OF_MEMORY);
    rc = gm_alloc(pool, 65 * MiB, NULL, &p);
    CHECK(rc == (is_sim() ? GM_OUT_OF_MEMORY : GM_LIMIT));
    CHECK(strlen(gm_last_error()) > 10);
    CHECK_RC(gm_record_stream(pool, &host, NULL), GM_INVALID_POINTER);
    size_t sz;
    CHECK_RC(gm_block_size(pool, &host, &sz), GM_INVALID_POINTER);
    /* Exhaust the device: a clean error, then the pool still works. */
    void *big[40];
    int n = 0;
    rc = GM_OK;
    while (n < 40 && (rc = gm_alloc(pool, 3 * MiB, NULL, &big[n])) == GM_OK) n++;
    CHECK(rc == GM_OUT_OF_MEMORY || rc == GM_LIMIT);
    CHECK(n >= 15 && n < 40);
    gm_stats_t st = pool_stats_of(pool);
    CHECK(st.oom_count >= 1 && st.reserved <= 64 * MiB);
    CHECK_OK(gm_pool_check(pool));
    for (int i = 0; i < n; i++) CHECK_OK(gm_free(pool, big[i], NULL));
    CHECK_OK(gm_alloc(pool, 40 * MiB, NULL, &p)); /* pages move to serve it */
    put_pattern(pool, p, 40 * MiB, 3);
    CHECK(has_pattern(pool, p, 40 * MiB, 3));
    CHECK_OK(gm_free(pool, p, NULL));
    CHECK_OK(gm_free(pool, q, NULL));
    CHECK_OK(gm_pool_check(pool));
    /* Bad configs. */
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    gm_pool_t *other = NULL;
    cfg.version = 99;
    CHECK_RC(gm_pool_create(&cfg, &other), GM_INVALID_ARGUMENT);
    CHECK(other == NULL);
    cfg.version = GM_POOL_CONFIG_VERSION;
    cfg.backend = (gm_backend_kind_t)7;
    CHECK_RC(gm_pool_create(&cfg, &other), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_pool_create(&cfg, NULL), GM_INVALID_ARGUMENT);
    CHECK(strcmp(gm_strerror(GM_OUT_OF_MEMORY), "out of device memory") == 0);
    CHECK(strcmp(gm_errname(GM_DOUBLE_FREE), "GM_DOUBLE_FREE") == 0);
    gm_pool_destroy(pool);
}

static void test_limit_and_trim(void)
{
    gm_pool_t *pool = test_pool(256 * MiB, 16 * MiB);
    if (!pool) { CHECK(pool != NULL); return; }
    void *p[8];
    for (int i = 0; i < 7; i++) CHECK_OK(gm_alloc(pool, 2 * MiB, NULL, &p[i]));
    CHECK_RC(gm_alloc(pool, 4 * MiB, NULL, &p[7]), GM_LIMIT);
    CHECK(strstr(gm_last_error(), "limit") != NULL);
    CHECK_RC(gm_alloc(pool, 17 * MiB, NULL, &p[7]), GM_LIMIT);
    gm_stats_t st = pool_stats_of(pool);
    CHECK(st.reserved <= 16 * MiB);
    CHECK_OK(gm_pool_set_limit(pool, 32 * MiB));
    CHECK_OK(gm_alloc(pool, 4 * MiB, NULL, &p[7]));
    for (int i = 0; i < 8; i++) CHECK_OK(gm_free(pool, p[i], NULL));
    st = pool_stats_of(pool);
    CHECK(st.reserved > 0 && st.cached == st.reserved);
    size_t released = 0;
    CHECK_OK(gm_trim(pool, 0, &released));
    st = pool_stats_of(pool);
    CHECK(st.reserved == 0 && released > 0 && st.mapped == 0);
    CHECK_OK(gm_pool_check(pool));
    /* Usable after trim. */
    CHECK_OK(gm_alloc(pool, 5 * MiB, NULL, &p[0]));
    put_pattern(pool, p[0], 5 * MiB, 9);
    CHECK(has_pattern(pool, p[0], 5 * MiB, 9));
    CHECK_OK(gm_free(pool, p[0], NULL));
    gm_pool_destroy(pool);

    /* A release threshold gives memory back on free. */
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = test_backend();
    cfg.sim_capacity = 256 * MiB;
    cfg.release_threshold = 4 * MiB;
    CHECK_OK(gm_pool_create(&cfg, &pool));
    CHECK_OK(gm_alloc(pool, 20 * MiB, NULL, &p[0]));
    CHECK_OK(gm_free(pool, p[0], NULL));
    st = pool_stats_of(pool);
    CHECK(st.cached <= 4 * MiB);
    gm_pool_destroy(pool);

    /* Initial reserve: mapped up front, then used with no further calls. */
    cfg.release_threshold = SIZE_MAX;
    cfg.initial_reserve = 32 * MiB;
    CHECK_OK(gm_pool_create(&cfg, &pool));
    st = pool_stats_of(pool);
    CHECK(st.reserved == 32 * MiB);
    uint64_t calls = total_calls(&st);
    CHECK_OK(gm_alloc(pool, 20 * MiB, NULL, &p[0]));
    st = pool_stats_of(pool);
    CHECK(total_calls(&st) == calls);
    CHECK_OK(gm_free(pool, p[0], NULL));
    gm_pool_destroy(pool);
}

/* Large blocks built from pages taken out of holes keep their data, and so
 * do the live blocks around those holes. */
static void test_stitching_keeps_data(void)
{
    gm_pool_t *pool = test_pool(64 * MiB, 0);
    if (!pool) { CHECK(pool != NULL); return; }
    void *p[16];
    for (int i = 0; i < 16; i++) {
        CHECK_OK(gm_alloc(pool, 3 * MiB + 4096, NULL, &p[i]));
        put_pattern(pool, p[i], 3 * MiB + 4096, (unsigned)i);
    }
    for (int i = 0; i < 16; i++)
        if (i % 4 != 3) CHECK_OK(gm_free(pool, p[i], NULL));
    void *big;
    CHECK_OK(gm_alloc(pool, 20 * MiB, NULL, &big));
    gm_stats_t st = pool_stats_of(pool);
    CHECK(st.pages_stolen > 0);
    CHECK(st.reserved <= 64 * MiB);
    put_pattern(pool, big, 20 * MiB, 77);
    CHECK(has_pattern(pool, big, 20 * MiB, 77));
    for (int i = 3; i < 16; i += 4) CHECK(has_pattern(pool, p[i], 3 * MiB + 4096, (unsigned)i));
    CHECK_OK(gm_pool_check(pool));
    CHECK_OK(gm_free(pool, big, NULL));
    for (int i = 3; i < 16; i += 4) CHECK_OK(gm_free(pool, p[i], NULL));
    gm_pool_destroy(pool);
}

/* A repeating step reaches a state with no backend call at all. */
static void test_steady_state(void)
{
    gm_pool_t *pool = test_pool(1024 * MiB, 0);
    if (!pool) { CHECK(pool != NULL); return; }
    uint64_t calls[6];
    unsigned seed = 12345;
    for (int step = 0; step < 6; step++) {
        void *live[64];
        int n = 0;
        seed = 12345; /* the same sequence every step */
        for (int i = 0; i < 400; i++) {
            seed = seed * 1103515245u + 12345u;
            if (n < 64 && (n == 0 || (seed >> 16) % 3 != 0)) {
                size_t sz = (size_t)256 << ((seed >> 8) % 16);
                CHECK_OK(gm_alloc(pool, sz + (seed % 1000), NULL, &live[n]));
                n++;
            } else {
                int k = (int)((seed >> 4) % (unsigned)n);
                CHECK_OK(gm_free(pool, live[k], NULL));
                live[k] = live[--n];
            }
        }
        while (n) CHECK_OK(gm_free(pool, live[--n], NULL));
        gm_stats_t st = pool_stats_of(pool);
        calls[step] = total_calls(&st);
        if (getenv("GM_TEST_VERBOSE")) {
            for (int k = 0; k < GM_CALL_COUNT; k++)
                if (st.backend_calls[k]) fprintf(stderr, " %s=%lu", gm_call_name(k), (unsigned long)st.backend_calls[k]);
            fprintf(stderr, " reserved=%lu stolen=%lu\n", (unsigned long)st.reserved, (unsigned long)st.pages_stolen);
        }
    }
    CHECK(calls[5] == calls[2]);
    if (calls[5] != calls[2])
        fprintf(stderr, "backend calls per step: %lu %lu %lu %lu %lu\n",
                (unsigned long)(calls[1] - calls[0]), (unsigned long)(calls[2] - calls[1]),
                (unsigned long)(calls[3] - calls[2]), (unsigned long)(calls[4] - calls[3]),
                (unsigned long)(calls[5] - calls[4]));
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
}

/* free(p, S): reusable at once on S, on T only after S's work is done. */
static void test_streams(void)
{
    if (!run_or_skip(is_sim(), "test_streams: held streams need the sim backend; skipped")) return;
    gm_pool_t *pool = test_pool(256 * MiB, 8 * MiB);
    if (!pool) { CHECK(pool != NULL); return; }
    gm_stream_t S = (gm_stream_t)(uintptr_t)0x51, T = (gm_stream_t)(uintptr_t)0x52;
    /* Same stream: immediately. */
    void *p = reused_on_held_stream(pool, gm_alloc, gm_free, 6 * MiB, S), *q, *r;
    /* Other stream while S is in flight: never p's memory. Under the limit
     * there is room for 2 MiB elsewhere but not for 6. */
    CHECK_OK(gm_alloc(pool, 2 * MiB, T, &r));
    CHECK((uintptr_t)r + 2 * MiB <= (uintptr_t)p || (uintptr_t)r >= (uintptr_t)p + 6 * MiB);
    CHECK_OK(gm_free(pool, r, T));
    void *x;
    int rc = gm_alloc(pool, 6 * MiB, T, &x);
    CHECK(rc == GM_LIMIT || rc == GM_OUT_OF_MEMORY);
    /* S done: T may reuse it. */
    CHECK_OK(gm_sim_hold_stream(pool, S, 0));
    CHECK_OK(gm_alloc(pool, 6 * MiB, T, &x));
    CHECK_OK(gm_free(pool, x, T));
    CHECK_OK(gm_pool_check(pool));

    /* record_stream: a block used on T is not reused, even on S, before T
     * passes the free. */
    CHECK_OK(gm_trim(pool, 0, NULL));
    CHECK_OK(gm_alloc(pool, 4 * MiB, S, &p));
    CHECK_OK(gm_record_stream(pool, p, T));
    CHECK_OK(gm_sim_hold_stream(pool, T, 1));
    CHECK_OK(gm_free(pool, p, S));
    CHECK_RC(gm_free(pool, p, S), GM_DOUBLE_FREE);
    CHECK_OK(gm_alloc(pool, 4 * MiB, S, &q));
    CHECK(q != p);
    rc = gm_alloc(pool, 4 * MiB, S, &r);
    CHECK(rc == GM_LIMIT || rc == GM_OUT_OF_MEMORY);
    CHECK_OK(gm_sim_hold_stream(pool, T, 0));
    CHECK_OK(gm_alloc(pool, 4 * MiB, S, &r));
    CHECK_OK(gm_free(pool, q, S));
    CHECK_OK(gm_free(pool, r, S));
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
}

/* gm_stream_forget / gm_stream_destroy: blocks freed on a stream become
 * everyone's, and no event is recorded on that stream afterwards. */
static void test_stream_forget(void)
{
    gm_pool_t *pool = test_pool(256 * MiB, 8 * MiB);
    if (!pool) { CHECK(pool != NULL); return; }
    gm_stream_t S, T;
    CHECK_OK(gm_stream_create(pool, &S));
    CHECK_OK(gm_stream_create(pool, &T));
    void *p, *h, *q, *hq;
    CHECK_OK(gm_alloc(pool, 6 * MiB, S, &p));
    CHECK_OK(gm_host_alloc(pool, 100000, S, &h));
    CHECK_OK(gm_free(pool, p, S));
    CHECK_OK(gm_host_free(pool, h, S));
    if (is_sim()) {
        CHECK_OK(gm_sim_hold_stream(pool, S, 1));
        CHECK_RC(gm_stream_forget(pool, S), GM_NOT_READY);
        CHECK(strstr(gm_last_error(), "gm_stream_forget") != NULL);
        CHECK_OK(gm_sim_hold_stream(pool, S, 0));
    }
    CHECK_OK(gm_stream_destroy(pool, S));
    gm_stats_t a = GM_STATS_INIT, b = GM_STATS_INIT;
    CHECK_OK(gm_pool_stats(pool, &a));
    /* The memory S freed serves T at once: no event on S needed. */
    CHECK_OK(gm_alloc(pool, 6 * MiB, T, &q));
    CHECK(q == p);
    CHECK_OK(gm_host_alloc(pool, 100000, T, &hq));
    CHECK(hq == h);
    CHECK_OK(gm_pool_stats(pool, &b));
    CHECK(b.backend_calls[GM_CALL_event_record] == a.backend_calls[GM_CALL_event_record]);
    CHECK_OK(gm_free(pool, q, T));
    CHECK_OK(gm_host_free(pool, hq, T));
    CHECK_OK(gm_stream_forget(pool, NULL)); /* a stream it holds nothing for: nothing to do */
    CHECK_OK(gm_stream_destroy(pool, T));
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
}

/* Each backend call kind failing in turn: a clean status, nothing leaked,
 * the pool usable afterwards. */
static void test_fault_injection(void)
{
    if (!run_or_skip(is_sim(), "test_fault_injection: needs the sim backend; skipped")) return;
    gm_pool_t *probe = test_pool(64 * MiB, 0);
    if (probe) {
        CHECK_RC(gm_sim_fail_nth(probe, 999, 1), GM_INVALID_ARGUMENT);
        gm_pool_destroy(probe);
    }
    for (int kind = 0; kind < GM_CALL_COUNT; kind++) {
        for (unsigned long nth = 1; nth <= 3; nth++) {
            gm_pool_t *pool = test_pool(64 * MiB, 24 * MiB);
            if (!pool) { CHECK(pool != NULL); return; }
            CHECK_OK(gm_sim_fail_nth(pool, kind, nth));
            void *p[12] = {0};
            int failures = 0;
            for (int round = 0; round < 3; round++) {
                for (int i = 0; i < 12; i++) {
                    size_t sz = (size_t)(i % 4 + 1) * MiB + (size_t)i * 4096;
                    int rc = gm_alloc(pool, sz, (gm_stream_t)(uintptr_t)(i % 2), &p[i]);
                    if (rc != GM_OK) {
                        CHECK(p[i] == NULL);
                        CHECK(rc == GM_BACKEND || rc == GM_LIMIT || rc == GM_OUT_OF_MEMORY);
                        CHECK(strlen(gm_last_error()) > 0);
                        failures++;
                    }
                }
                for (int i = 0; i < 12; i++) {
                    if (!p[i]) continue;
                    int rc = gm_free(pool, p[i], (gm_stream_t)(uintptr_t)(i % 2));
                    CHECK(rc == GM_OK);
                    p[i] = NULL;
                }
                int rc = gm_trim(pool, 0, NULL);
                CHECK(rc == GM_OK || rc == GM_BACKEND);
            }
            CHECK_OK(gm_pool_check(pool));
            CHECK_OK(gm_sim_fail_nth(pool, kind, 0));
            CHECK_OK(gm_trim(pool, 0, NULL));
            gm_stats_t st = pool_stats_of(pool);
            CHECK(st.reserved == 0 && st.allocated == 0 && st.live_blocks == 0);
            void *q;
            CHECK_OK(gm_alloc(pool, 10 * MiB, NULL, &q));
            put_pattern(pool, q, 10 * MiB, 5);
            CHECK(has_pattern(pool, q, 10 * MiB, 5));
            CHECK_OK(gm_free(pool, q, NULL));
            CHECK_OK(gm_pool_check(pool));
            gm_pool_destroy(pool);
            (void)failures;
        }
    }
}

static void test_device_info(void)
{
    gm_pool_t *pool = test_pool(128 * MiB, 0);
    if (!pool) { CHECK(pool != NULL); return; }
    gm_device_info_t info = GM_DEVICE_INFO_INIT;
    CHECK_OK(gm_pool_device_info(pool, &info));
    CHECK(info.granularity >= 65536 && (info.granularity & (info.granularity - 1)) == 0);
    CHECK(info.total_memory > 0 && info.vmm_supported == 1);
    CHECK(strlen(info.backend_name) > 0 && strlen(info.device_name) > 0);
    if (is_sim()) CHECK(info.total_memory == 128 * MiB && !strcmp(info.backend_name, "sim"));
    gm_device_info_t bad = GM_DEVICE_INFO_INIT;
    bad.size = 4;
    CHECK_RC(gm_pool_device_info(pool, &bad), GM_INVALID_ARGUMENT);
    CHECK(gm_call_from_name("set_access") == GM_CALL_set_access);
    CHECK(gm_call_name(GM_CALL_map) && !strcmp(gm_call_name(GM_CALL_map), "map"));
    CHECK(gm_call_name(-1) == NULL && gm_call_from_name("nope") == -1);
    CHECK(strcmp(gm_version(), GM_VERSION_STRING) == 0);
    gm_pool_destroy(pool);
}

int main(void)
{
    test_basics();
    test_bad_input();
    test_limit_and_trim();
    test_stitching_keeps_data();
    test_steady_state();
    test_streams();
    test_stream_forget();
    test_fault_injection();
    test_device_info();
    return test_summary();
}
