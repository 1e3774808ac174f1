/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_offload_prepare.c — pinned host memory made ahead of a first sleep
 * (gm_offload_prepare, gm_offload_prepare_wait).
 *
 * On a cold host pool (trimmed to nothing), a tag of several hundred MiB in
 * blocks of many sizes (more than one of the offload's 128 MiB windows):
 *   - the preparation registers pinned memory for the tag (host_register
 *     calls, host_reserved at least the tag's bytes), and the offload that
 *     follows registers nothing more: it finds all of it; after the
 *     restore every byte is back;
 *   - a second preparation of the same tag makes nothing new;
 *   - the reserve stays when the host pool grows for something else (a
 *     large gm_host_alloc, which gives unused chunks back otherwise), and
 *     gm_host_trim gives it back;
 *   - GM_PREPARE_ASYNC returns before the memory is made; gm_offload waits
 *     for it and registers nothing of its own; gm_offload_prepare_wait
 *     gives the status once (GM_OK when nothing ran);
 *   - a GM_TAG_DISCARD tag needs nothing (no registration);
 *   - misuse: GM_TAG_NONE, a tag never made, unknown flags: GM_INVALID_ARGUMENT
 *     naming what is wrong;
 *   - (sim) pinned memory running out during a preparation, made here and
 *     on its thread: an error (GM_NO_HOST_MEMORY, or GM_BACKEND for the
 *     driver's refusal) saying how much was made, the pool
 *     consistent, and a later offload and restore of the tag lose nothing.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "gpumem.h"
#include "../test.h"
#include "../lib/checks.h"
#include "offload_util.h"

#define NB 24

static gm_pool_t *pool;
static tblock_t b[NB];
static size_t nb;

static uint64_t regs(void) { return pool_stats_of(pool).backend_calls[GM_CALL_host_register]; }
static uint64_t host_reserved(void) { return pool_stats_of(pool).host_reserved; }

/* Blocks of tag t, total about `mib` MiB, of odd and even sizes. */
static size_t make_tag(gm_tag_t t, size_t mib, uint64_t seed)
{
    static const size_t shapes[] = {5000, MiB - 256, 3 * MiB + 5, 40 * MiB + 4099, 64 * KiB + 8,
                                    100 * MiB + 12345, 2 * MiB, 700};
    size_t total = 0;
    for (size_t i = 0; total < mib * MiB && nb < NB; i++) {
        size_t n = shapes[i % (sizeof shapes / sizeof shapes[0])];
        b[nb] = (tblock_t){NULL, n, t, seed + i, NULL};
        int rc = gm_alloc_tagged(pool, n, NULL, t, &b[nb].p);
        CHECK_OK(rc);
        if (rc != GM_OK) break;
        CHECK_OK(dev_fill(pool, b[nb].p, n, b[nb].seed, NULL));
        total += n;
        nb++;
    }
    return total;
}

static void check_tags(const char *what)
{
    for (size_t i = 0; i < nb; i++)
        if (b[i].p) CHECK(dev_check(pool, b[i].p, b[i].n, b[i].seed, NULL, what));
}

static void free_all(void)
{
    for (size_t i = 0; i < nb; i++)
        if (b[i].p) CHECK_OK(gm_free(pool, b[i].p, NULL));
    nb = 0;
}

static void test_made_ahead(void)
{
    gm_tag_t t;
    CHECK_OK(gm_tag_get("prep-weights", 0, &t));
    size_t bytes = make_tag(t, 300, 11);
    CHECK_OK(gm_host_trim(pool, 0, NULL));
    uint64_t r0 = regs(), h0 = host_reserved();

    CHECK_OK(gm_offload_prepare(pool, t, 0));
    uint64_t r1 = regs(), h1 = host_reserved();
    printf("prepare: %zu bytes of tag, %" PRIu64 " registrations, host_reserved %" PRIu64
           " -> %" PRIu64 "\n", bytes, r1 - r0, h0, h1);
    CHECK(r1 > r0);
    CHECK(h1 >= h0 + bytes);

    /* Again: the memory is there, nothing new. */
    CHECK_OK(gm_offload_prepare(pool, t, 0));
    CHECK(regs() == r1);
    CHECK(host_reserved() == h1);

    /* The reserve stays when the host pool grows for something else. */
    void *big = NULL;
    CHECK_OK(gm_host_alloc(pool, 64 * MiB, NULL, &big));
    CHECK(host_reserved() >= h1 + 64 * MiB);
    CHECK_OK(gm_host_free(pool, big, NULL));
    uint64_t r2 = regs();

    /* The first sleep finds every byte it needs pinned already. */
    CHECK_OK(gm_offload(pool, t, 0, NULL));
    gm_tag_info_t ti = tag_info_of(pool, t);
    CHECK(ti.offloaded_bytes == bytes && ti.resident_blocks == 0);
    if (regs() != r2)
        fprintf(stderr, "the offload registered %" PRIu64 " more times\n", regs() - r2);
    CHECK(regs() == r2);
    CHECK_OK(gm_restore(pool, t, NULL));
    check_tags("after a prepared offload");
    CHECK_OK(gm_pool_check(pool));
    free_all();

    /* gm_host_trim gives the reserve back. */
    CHECK_OK(gm_host_trim(pool, 0, NULL));
    CHECK(host_reserved() <= h0);
}

static void test_async(void)
{
    gm_tag_t t;
    CHECK_OK(gm_tag_get("prep-async", 0, &t));
    CHECK_OK(gm_offload_prepare_wait(pool)); /* nothing ran: GM_OK */
    size_t bytes = make_tag(t, 200, 21);
    CHECK_OK(gm_host_trim(pool, 0, NULL));
    uint64_t h0 = host_reserved();
    CHECK_OK(gm_offload_prepare(pool, t, GM_PREPARE_ASYNC));
    CHECK_OK(gm_offload_prepare_wait(pool));
    CHECK(host_reserved() >= h0 + bytes);
    uint64_t r1 = regs();
    CHECK_OK(gm_offload(pool, t, 0, NULL));
    CHECK(regs() == r1);
    CHECK_OK(gm_restore(pool, t, NULL));
    check_tags("after an async preparation");

    /* gm_offload right after an async start waits for it: same result. */
    CHECK_OK(gm_host_trim(pool, 0, NULL));
    CHECK_OK(gm_offload_prepare(pool, t, GM_PREPARE_ASYNC));
    CHECK_OK(gm_offload(pool, t, 0, NULL));
    CHECK(tag_info_of(pool, t).offloaded_bytes == bytes);
    CHECK_OK(gm_offload_prepare_wait(pool)); /* its status, once */
    CHECK_OK(gm_restore(pool, t, NULL));
    check_tags("after an offload that waited");
    CHECK_OK(gm_pool_check(pool));
    free_all();
    CHECK_OK(gm_host_trim(pool, 0, NULL));
}

static void test_discard_and_misuse(void)
{
    gm_tag_t d;
    CHECK_OK(gm_tag_get("prep-discard", GM_TAG_DISCARD, &d));
    make_tag(d, 50, 31);
    CHECK_OK(gm_host_trim(pool, 0, NULL));
    uint64_t r0 = regs();
    CHECK_OK(gm_offload_prepare(pool, d, 0));
    CHECK(regs() == r0);
    free_all();

    CHECK(gm_offload_prepare(pool, GM_TAG_NONE, 0) == GM_INVALID_ARGUMENT);
    CHECK(strstr(gm_last_error(), "GM_TAG_NONE") != NULL);
    CHECK(gm_offload_prepare(pool, 1000, 0) == GM_INVALID_ARGUMENT);
    CHECK(strstr(gm_last_error(), "gm_tag_get") != NULL);
    CHECK(gm_offload_prepare(pool, d, 0x10) == GM_INVALID_ARGUMENT);
    CHECK(strstr(gm_last_error(), "0x10") != NULL);
}

/* Pinned memory runs out part way: the n-th registration fails. */
static void test_faults(void)
{
    if (!run_or_skip(sim_asked(), "faults: need the sim backend; skipped")) return;
    gm_tag_t t;
    CHECK_OK(gm_tag_get("prep-faults", 0, &t));
    size_t bytes = make_tag(t, 300, 41);
    for (int async = 0; async < 2; async++) {
        for (unsigned long n = 1; n <= 3; n++) {
            CHECK_OK(gm_host_trim(pool, 0, NULL));
            CHECK_OK(gm_sim_fail_nth(pool, GM_CALL_host_register, n));
            int rc = gm_offload_prepare(pool, t, async ? GM_PREPARE_ASYNC : 0);
            if (async && rc == GM_OK) rc = gm_offload_prepare_wait(pool);
            CHECK_OK(gm_sim_fail_nth(pool, GM_CALL_host_register, 0));
            if (rc != GM_NO_HOST_MEMORY && rc != GM_BACKEND)
                fprintf(stderr, "fault at registration %lu (async %d): %d: %s\n", n, async, rc,
                        gm_last_error());
            CHECK(rc == GM_NO_HOST_MEMORY || rc == GM_BACKEND); /* the driver's refusal */
            CHECK(strstr(gm_last_error(), "bytes made") != NULL);
            CHECK_OK(gm_offload_prepare_wait(pool)); /* reported once */
            CHECK_OK(gm_pool_check(pool));
            check_tags("after a failed preparation");
        }
    }
    /* The tag still sleeps and wakes whole. */
    CHECK_OK(gm_offload(pool, t, 0, NULL));
    CHECK(tag_info_of(pool, t).offloaded_bytes == bytes);
    CHECK_OK(gm_restore(pool, t, NULL));
    check_tags("after the faults");
    free_all();
}

int main(void)
{
    pool = offload_pool(2048 * MiB);
    REQUIRE(pool != NULL);
    test_made_ahead();
    test_async();
    test_discard_and_misuse();
    test_faults();
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
    scratch_free();
    return test_summary();
}
