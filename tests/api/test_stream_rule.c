/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_stream_rule.c — the cross-stream reuse rule under random load.
 *
 * Several streams allocate and free at random while the sim holds some of
 * them "in flight".  A block freed on a held stream S may be handed out again
 * on S, but never on another stream until S is released: every allocation on
 * stream T is checked against the ranges freed on other streams that were
 * still held; a block also used on another stream (gm_record_stream) is
 * reused by no stream at all before that stream is released.  The pool runs
 * under a tight limit so that memory is scarce and
 * pages move.  Data written to live blocks is checked before they are freed.
 * Needs the sim backend (held streams); on other backends it says so and
 * passes nothing.
 *
 * usage: test_stream_rule [iterations] [seed]
 * (not run under valgrind: memcheck makes its memsets of up to 8 MiB slow;
 * the ASan build covers it)
 */
// ctest-args: 40000 2
// ctest-valgrind: skip
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpumem.h"
#include "../test.h"
#include "../lib/checks.h"

#define STREAMS 4
#define SLOTS 64
#define MAX_GUARDED 4096
#define MiB ((size_t)1 << 20)

typedef struct {
    void *ptr;
    size_t size;
    int stream;
    int recorded; /* gm_record_stream'd on this stream too, or -1 */
    unsigned char tag;
} slot_t;

/* A range freed while a stream that used it was held: until `stream` is
 * released, no other stream may get it — and, when `all` is set (the stream
 * only used it through gm_record_stream), not even the freeing one. */
typedef struct {
    uintptr_t lo, hi;
    int stream;
    int all;
} guard_t;

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* A block freed on stream A while stream B still used it (gm_record_stream)
 * waits for B; if A is destroyed meanwhile, the block must still end up
 * free for everyone once B passes, and its pages go back at a trim.  (It
 * once went into A's free list, which nothing drains after A is gone: its
 * pages stayed reserved for the pool's life.) */
static void retired_owner(void)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = GM_BACKEND_SIM;
    cfg.sim_capacity = 512 * MiB;
    gm_pool_t *pool = NULL;
    CHECK_OK(gm_pool_create(&cfg, &pool));
    if (!pool) return;
    gm_stream_t a, b;
    CHECK_OK(gm_stream_create(pool, &a));
    CHECK_OK(gm_stream_create(pool, &b));
    void *p = NULL;
    CHECK_OK(gm_alloc(pool, 8 * MiB, a, &p));
    CHECK_OK(gm_record_stream(pool, p, b));
    CHECK_OK(gm_sim_hold_stream(pool, b, 1)); /* B's use of the block is in flight */
    CHECK_OK(gm_free(pool, p, a));
    CHECK_OK(gm_stream_destroy(pool, a));
    CHECK_OK(gm_sim_hold_stream(pool, b, 0));
    CHECK_OK(gm_trim(pool, 0, NULL));
    gm_stats_t st = GM_STATS_INIT;
    CHECK_OK(gm_pool_stats(pool, &st));
    CHECK(st.allocated == 0 && st.reserved == 0);
    if (st.reserved) fprintf(stderr, "retired_owner: %llu bytes still reserved\n", (unsigned long long)st.reserved);
    /* The same again, with the stream handle reused after the destroy. */
    void *q = NULL;
    CHECK_OK(gm_alloc(pool, 4 * MiB, b, &q));
    CHECK_OK(gm_free(pool, q, b));
    CHECK_OK(gm_pool_check(pool));
    CHECK_OK(gm_stream_destroy(pool, b));
    gm_pool_destroy(pool);
}

int main(int argc, char **argv)
{
    int iterations = argc > 1 ? atoi(argv[1]) : 20000;
    uint64_t r = argc > 2 ? strtoull(argv[2], NULL, 0) : 7;
    if (!r) r = 7;
    if (!run_or_skip(sim_asked(), "test_stream_rule: held streams need the sim backend; skipped"))
        return 77; /* skipped (ctest SKIP_RETURN_CODE) */
    retired_owner();
    gm_pool_t *pool;
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = GM_BACKEND_SIM;
    cfg.sim_capacity = 512 * MiB;
    cfg.limit = 48 * MiB;
    REQUIRE(gm_pool_create(&cfg, &pool) == GM_OK);
    gm_stream_t st[STREAMS];
    int held[STREAMS] = {0};
    for (int i = 0; i < STREAMS; i++) REQUIRE(gm_stream_create(pool, &st[i]) == GM_OK);

    static slot_t slots[SLOTS];
    static guard_t guards[MAX_GUARDED];
    int n_guards = 0;
    unsigned long violations = 0, ooms = 0, allocs = 0, corrupt = 0;
    unsigned char buf[64];

    for (int it = 0; it < iterations; it++) {
        unsigned action = (unsigned)(rnd(&r) % 16);
        if (action == 0) { /* toggle a hold */
            int s = (int)(rnd(&r) % STREAMS);
            held[s] = !held[s];
            CHECK_OK(gm_sim_hold_stream(pool, st[s], held[s]));
            if (!held[s]) { /* its work is done: its guarded ranges are free for all */
                int w = 0;
                for (int g = 0; g < n_guards; g++)
                    if (guards[g].stream != s) guards[w++] = guards[g];
                n_guards = w;
            }
            continue;
        }
        slot_t *sl = &slots[rnd(&r) % SLOTS];
        if (sl->ptr) {
            /* Check a few bytes at both ends, then free on the block's stream. */
            size_t n = sl->size < sizeof buf ? sl->size : sizeof buf;
            CHECK_OK(gm_memcpy(pool, buf, sl->ptr, n, st[sl->stream]));
            for (size_t i = 0; i < n; i++) corrupt += buf[i] != sl->tag;
            CHECK_OK(gm_memcpy(pool, buf, (char *)sl->ptr + sl->size - n, n, st[sl->stream]));
            for (size_t i = 0; i < n; i++) corrupt += buf[i] != sl->tag;
            CHECK_OK(gm_free(pool, sl->ptr, st[sl->stream]));
            uintptr_t lo = (uintptr_t)sl->ptr, hi = lo + sl->size;
            if (held[sl->stream] && n_guards < MAX_GUARDED)
                guards[n_guards++] = (guard_t){lo, hi, sl->stream, 0};
            if (sl->recorded >= 0 && held[sl->recorded] && n_guards < MAX_GUARDED)
                guards[n_guards++] = (guard_t){lo, hi, sl->recorded, 1};
            sl->ptr = NULL;
            continue;
        }
        int s = (int)(rnd(&r) % STREAMS);
        size_t size = (size_t)256 << (rnd(&r) % 15); /* 256 B .. 4 MiB */
        size += rnd(&r) % size;
        void *p;
        int rc = gm_alloc(pool, size, st[s], &p);
        if (rc == GM_LIMIT || rc == GM_OUT_OF_MEMORY) {
            ooms++;
            continue;
        }
        CHECK_OK(rc);
        if (rc != GM_OK) continue;
        allocs++;
        for (int g = 0; g < n_guards; g++)
            if ((guards[g].all || guards[g].stream != s) && (uintptr_t)p < guards[g].hi &&
                (uintptr_t)p + size > guards[g].lo) {
                violations++;
                fprintf(stderr, "iteration %d: stream %d got [%p, +%zu), freed on held stream %d\n",
                        it, s, p, size, guards[g].stream);
            }
        /* Reused on its own stream: no longer guarded against that stream's
         * future frees (it is live again). */
        int w = 0;
        for (int g = 0; g < n_guards; g++)
            if (!((uintptr_t)p < guards[g].hi && (uintptr_t)p + size > guards[g].lo))
                guards[w++] = guards[g];
        n_guards = w;
        sl->ptr = p;
        sl->size = size;
        sl->stream = s;
        sl->tag = (unsigned char)rnd(&r);
        sl->recorded = -1;
        if (rnd(&r) % 8 == 0) { /* also used on another stream */
            int u = (int)(rnd(&r) % STREAMS);
            if (u != s) {
                CHECK_OK(gm_record_stream(pool, p, st[u]));
                sl->recorded = u;
            }
        }
        CHECK_OK(gm_memset(pool, p, sl->tag, size, st[s]));
    }
    for (int s = 0; s < STREAMS; s++)
        if (held[s]) CHECK_OK(gm_sim_hold_stream(pool, st[s], 0));
    for (int i = 0; i < SLOTS; i++)
        if (slots[i].ptr) CHECK_OK(gm_free(pool, slots[i].ptr, st[slots[i].stream]));
    CHECK(violations == 0);
    CHECK(corrupt == 0);
    CHECK(allocs > (unsigned long)iterations / 4);
    CHECK_OK(gm_pool_check(pool));
    gm_stats_t stats = GM_STATS_INIT;
    CHECK_OK(gm_pool_stats(pool, &stats));
    CHECK(stats.allocated == 0 && stats.reserved <= cfg.limit);
    printf("test_stream_rule: %lu allocations, %lu refused under the limit, pages moved %lu\n",
           allocs, ooms, (unsigned long)stats.pages_stolen);
    for (int i = 0; i < STREAMS; i++) CHECK_OK(gm_stream_destroy(pool, st[i]));
    gm_pool_destroy(pool);
    return test_summary();
}
