/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fault_stream_event.c — attacks the stream rule under backend failure.
 *
 * Promise (include/gpumem.h, gm_record_stream and gm_host_alloc): memory used
 * on a stream is not handed to another stream before that stream's work on
 * it is done.  gm_free orders the reuse with an event recorded on every
 * stream the block was recorded on; here creating or recording that event
 * fails and so does the fallback stream synchronize (the stream is held "in
 * flight" by the sim).  The block must then stay unusable by other streams
 * until the held stream is released: an allocation on another stream must
 * not get it, and the sim's in-flight checker must see no copy or fill on
 * memory another stream's pending work still uses.  The same attack on the
 * pinned host pool: a block freed on a held stream while event create or
 * record fails.
 *
 * Needs a backend with fail_nth and hold_stream (the sim): otherwise it
 * prints "skipped" and passes nothing.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "gpumem.h"
#include "../test.h"

#define MiB ((size_t)1 << 20)
#define SZ (2 * MiB)

static gm_pool_t *small_pool(size_t limit)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = GM_BACKEND_SIM;
    cfg.limit = limit;
    cfg.sim_capacity = (size_t)256 << 20;
    cfg.copy_threads = 1;
    return pool_from(&cfg);
}

/* Device memory: p used on held stream A through gm_record_stream, freed on
 * S while the event for A fails (fail_kind's n-th call) and so does the
 * fallback sync of A. */
static void device_case(int fail_kind, unsigned long n)
{
    gm_pool_t *pool = small_pool(SZ); /* one page: any reuse is p's page */
    if (!pool) {
        CHECK(0);
        return;
    }
    gm_stream_t S = (gm_stream_t)0x10, A = (gm_stream_t)0x20, B = (gm_stream_t)0x30;
    void *p = NULL, *q = NULL;
    CHECK_OK(gm_alloc(pool, SZ, S, &p));
    CHECK_OK(gm_record_stream(pool, p, A));
    CHECK_OK(gm_sim_hold_stream(pool, A, 1));
    CHECK_OK(gm_memset(pool, p, 0xab, SZ, A)); /* A's work on p: in flight */
    CHECK_OK(gm_sim_fail_nth(pool, fail_kind, n));
    CHECK_OK(gm_sim_fail_nth(pool, GM_CALL_stream_sync, 1));
    CHECK_OK(gm_free(pool, p, S));
    CHECK_OK(gm_sim_fail_nth(pool, fail_kind, 0));
    CHECK_OK(gm_sim_fail_nth(pool, GM_CALL_stream_sync, 0));
    CHECK_OK(gm_pool_check(pool));

    /* A still busy: neither B nor S may get p's memory. */
    int rc = gm_alloc(pool, SZ, B, &q);
    if (rc == GM_OK) {
        CHECK_OK(gm_memset(pool, q, 0x5a, SZ, B)); /* the sim's checker */
        CHECK(q != p);
        CHECK_OK(gm_free(pool, q, B));
    } else {
        CHECK(rc == GM_LIMIT || rc == GM_OUT_OF_MEMORY);
    }
    q = NULL;
    rc = gm_alloc(pool, SZ, S, &q);
    if (rc == GM_OK) {
        CHECK_OK(gm_memset(pool, q, 0x5b, SZ, S));
        CHECK(q != p);
        CHECK_OK(gm_free(pool, q, S));
    }
    CHECK_OK(gm_pool_check(pool));

    /* Released: the memory comes back. */
    CHECK_OK(gm_sim_hold_stream(pool, A, 0));
    q = NULL;
    CHECK_OK(gm_alloc(pool, SZ, B, &q));
    if (q) {
        CHECK_OK(gm_memset(pool, q, 0x5c, SZ, B));
        CHECK_OK(gm_free(pool, q, B));
    }
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
}

/* A created stream A that a pending block still waits on (its event and
 * sync failed at the free) is destroyed: gm_stream_destroy must wait for A
 * (and fail while A is held), after which the block comes back; an event
 * cannot be recorded on A once it is gone. */
static void destroyed_stream_case(void)
{
    gm_pool_t *pool = small_pool(SZ);
    if (!pool) {
        CHECK(0);
        return;
    }
    gm_stream_t S = (gm_stream_t)0x10, B = (gm_stream_t)0x30, A = NULL;
    void *p = NULL, *q = NULL;
    CHECK_OK(gm_stream_create(pool, &A));
    CHECK_OK(gm_alloc(pool, SZ, S, &p));
    CHECK_OK(gm_record_stream(pool, p, A));
    CHECK_OK(gm_sim_hold_stream(pool, A, 1));
    CHECK_OK(gm_memset(pool, p, 0xab, SZ, A));
    CHECK_OK(gm_sim_fail_nth(pool, GM_CALL_event_create, 1));
    CHECK_OK(gm_sim_fail_nth(pool, GM_CALL_stream_sync, 1));
    CHECK_OK(gm_free(pool, p, S));
    /* A still busy: destroying it must wait for it, so it fails here. */
    CHECK(gm_stream_destroy(pool, A) != GM_OK);
    CHECK_OK(gm_sim_hold_stream(pool, A, 0));
    CHECK_OK(gm_stream_destroy(pool, A));
    CHECK_OK(gm_alloc(pool, SZ, B, &q)); /* the only page: p's, free again */
    if (q) {
        CHECK_OK(gm_memset(pool, q, 0x5c, SZ, B));
        CHECK_OK(gm_free(pool, q, B));
    }
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
}

/* Pinned host memory: h written by held stream S's copy, freed on S while
 * the reclaim event fails; B must not get h while S is held. */
static void host_case(int fail_kind)
{
    gm_pool_t *pool = small_pool(0);
    if (!pool) {
        CHECK(0);
        return;
    }
    gm_stream_t S = (gm_stream_t)0x10, B = (gm_stream_t)0x30;
    void *d = NULL, *h = NULL, *h2 = NULL;
    size_t n = 64 << 10;
    CHECK_OK(gm_alloc(pool, n, S, &d));
    CHECK_OK(gm_host_alloc(pool, n, S, &h));
    CHECK_OK(gm_sim_hold_stream(pool, S, 1));
    if (d && h) CHECK_OK(gm_memcpy(pool, h, d, n, S)); /* S writes h: in flight */
    CHECK_OK(gm_host_free(pool, h, S));
    CHECK_OK(gm_sim_fail_nth(pool, fail_kind, 1));
    CHECK_OK(gm_sim_fail_nth(pool, GM_CALL_stream_sync, 1));
    CHECK_OK(gm_host_alloc(pool, n, B, &h2));
    CHECK_OK(gm_sim_fail_nth(pool, fail_kind, 0));
    CHECK_OK(gm_sim_fail_nth(pool, GM_CALL_stream_sync, 0));
    CHECK(h2 != h);
    if (h2 && d) CHECK_OK(gm_memcpy(pool, h2, d, n, B)); /* the sim's checker */
    CHECK_OK(gm_host_free(pool, h2, B));
    CHECK_OK(gm_sim_hold_stream(pool, S, 0));
    CHECK_OK(gm_free(pool, d, S));
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
}

int main(void)
{
    gm_pool_t *probe = small_pool(0);
    REQUIRE(probe != NULL);
    int rc = gm_sim_fail_nth(probe, GM_CALL_event_create, 0);
    if (rc == GM_OK) rc = gm_sim_hold_stream(probe, (gm_stream_t)0x10, 0);
    gm_pool_destroy(probe);
    if (rc == GM_NOT_SUPPORTED) {
        printf("skipped: the backend has no fail_nth or hold_stream\n");
        return 77; /* ctest: skipped */
    }
    device_case(GM_CALL_event_create, 1);
    device_case(GM_CALL_event_record, 1);
    destroyed_stream_case();
    host_case(GM_CALL_event_create);
    host_case(GM_CALL_event_record);
    return test_summary();
}
