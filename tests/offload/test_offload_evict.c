/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_offload_evict.c — eviction under memory pressure (GM_POOL_EVICT).
 *
 * A 64 MiB sim device.  Evictable tags are used between gm_tag_acquire and
 * gm_tag_release; an allocation that does not fit makes the pool offload
 * the least recently released evictable tag that nobody holds, one at a
 * time, until it fits.  Checked: which tag goes (LRU by release time, a
 * re-acquire and release making a tag young again), that only as many go
 * as needed, the counters (stats.evictions, gm_tag_info evictions and
 * offloads), the data of an evicted tag after gm_tag_acquire restores it; a
 * held tag, a tag without GM_TAG_EVICTABLE, and any tag of a pool without
 * GM_POOL_EVICT are never evicted (the allocation fails with
 * GM_OUT_OF_MEMORY instead); work queued before the release on a stream
 * that cannot be waited for (held, sim) keeps the tag from being evicted;
 * a GM_TAG_DISCARD tag is evicted without a copy; GPUMEM_EVICT=1 through
 * gm_config_from_env sets the flag.  Sim only (the device size).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpumem.h"
#include "../test.h"
#include "../lib/checks.h"
#include "offload_util.h"

#define CAP (64 * MiB)

static gm_tag_t A, B, C, D, N, K;

/* A sim pool of CAP bytes with `flags`, `heaps` heaps (1: the default) and
 * one copy thread. */
static gm_pool_t *evict_pool(unsigned flags, unsigned heaps)
{
    gm_pool_config_t cfg = sim_config(CAP);
    cfg.flags = flags;
    cfg.heaps = heaps;
    cfg.copy_threads = 1;
    return pool_from(&cfg);
}

/* A tag's memory: acquire, allocate `size` as one block, fill, release. */
static tblock_t tag_block(gm_pool_t *pool, gm_tag_t tag, size_t size, uint64_t seed,
                          gm_stream_t release_on)
{
    tblock_t x = {NULL, size, tag, seed, NULL};
    CHECK_OK(gm_tag_acquire(pool, tag, NULL));
    CHECK_OK(gm_alloc_tagged(pool, size, NULL, tag, &x.p));
    if (x.p) CHECK_OK(dev_fill(pool, x.p, size, seed, NULL));
    CHECK_OK(gm_stream_synchronize(pool, NULL));
    CHECK_OK(gm_tag_release(pool, tag, release_on));
    return x;
}

static int resident(gm_pool_t *pool, gm_tag_t tag)
{
    gm_tag_info_t ti = tag_info_of(pool, tag);
    return ti.offloaded_blocks == 0 && ti.resident_blocks > 0;
}

static int evicted(gm_pool_t *pool, gm_tag_t tag)
{
    gm_tag_info_t ti = tag_info_of(pool, tag);
    return ti.resident_blocks == 0 && ti.offloaded_blocks > 0;
}

/* Acquire (restoring), check the data, release. */
static void check_tag(gm_pool_t *pool, const tblock_t *x, const char *what)
{
    CHECK_OK(gm_tag_acquire(pool, x->tag, NULL));
    CHECK(resident(pool, x->tag));
    CHECK(dev_check(pool, x->p, x->n, x->seed, NULL, what));
    CHECK_OK(gm_tag_release(pool, x->tag, NULL));
}

/* LRU by release time; only as many as needed; counters; data. */
static void test_lru(void)
{
    gm_pool_t *pool = evict_pool(GM_POOL_EVICT, 1);
    if (!pool) { CHECK(0); return; }
    tblock_t a = tag_block(pool, A, 12 * MiB, 1, NULL);
    tblock_t b = tag_block(pool, B, 12 * MiB, 2, NULL);
    tblock_t c = tag_block(pool, C, 12 * MiB, 3, NULL);
    CHECK(resident(pool, A) && resident(pool, B) && resident(pool, C));
    gm_stats_t st0 = pool_stats_of(pool);
    CHECK(st0.evictions == 0);

    /* 30 MiB do not fit beside 36: A, released first, goes; only A. */
    void *x = NULL, *y = NULL;
    CHECK_OK(gm_alloc(pool, 30 * MiB, NULL, &x));
    gm_stats_t st1 = pool_stats_of(pool);
    CHECK(st1.evictions == 1);
    CHECK(evicted(pool, A));
    CHECK(resident(pool, B) && resident(pool, C));
    gm_tag_info_t ti = tag_info_of(pool, A);
    CHECK(ti.evictions == 1 && ti.offloaded_bytes == 12 * MiB && ti.holds == 0);
    CHECK(tag_info_of(pool, B).evictions == 0 && tag_info_of(pool, C).evictions == 0);
    CHECK(st1.offloaded == 12 * MiB);
    CHECK(st1.offload_count - st0.offload_count == 1);
    if (x) CHECK_OK(gm_memset(pool, x, 0x11, 30 * MiB, NULL));
    CHECK_OK(gm_pool_check(pool));

    /* 12 MiB more, into a held evictable tag D: B goes next, not D, not C. */
    CHECK_OK(gm_tag_acquire(pool, D, NULL));
    CHECK_OK(gm_alloc_tagged(pool, 12 * MiB, NULL, D, &y));
    CHECK(pool_stats_of(pool).evictions == 2);
    CHECK(evicted(pool, A) && evicted(pool, B));
    CHECK(resident(pool, C) && resident(pool, D));
    CHECK(tag_info_of(pool, B).evictions == 1 && tag_info_of(pool, D).evictions == 0);
    if (y) CHECK_OK(gm_memset(pool, y, 0x22, 12 * MiB, NULL));
    CHECK(dev_check_byte(pool, x, 30 * MiB, 0x11, NULL, "the allocation served by eviction"));
    CHECK_OK(gm_free(pool, y, NULL));
    CHECK_OK(gm_tag_release(pool, D, NULL));
    CHECK_OK(gm_free(pool, x, NULL));
    CHECK_OK(gm_pool_check(pool));

    /* Acquire restores; the data came back.  Released now B, then A: the
     * order of last release is C, B, A. */
    CHECK_OK(gm_tag_acquire(pool, A, NULL));
    CHECK_OK(gm_tag_acquire(pool, B, NULL));
    CHECK(resident(pool, A) && resident(pool, B));
    CHECK(dev_check(pool, a.p, a.n, a.seed, NULL, "A after eviction"));
    CHECK(dev_check(pool, b.p, b.n, b.seed, NULL, "B after eviction"));
    CHECK_OK(gm_tag_release(pool, B, NULL));
    CHECK_OK(gm_tag_release(pool, A, NULL));
    CHECK_OK(gm_alloc(pool, 30 * MiB, NULL, &x));
    CHECK(evicted(pool, C));
    CHECK(resident(pool, A) && resident(pool, B));
    CHECK(pool_stats_of(pool).evictions == 3);
    CHECK_OK(gm_free(pool, x, NULL));
    check_tag(pool, &c, "C after eviction");
    check_tag(pool, &a, "A");
    check_tag(pool, &b, "B");
    ti = tag_info_of(pool, C);
    CHECK(ti.evictions == 1 && ti.restores == 1);

    CHECK_OK(gm_free(pool, a.p, NULL));
    CHECK_OK(gm_free(pool, b.p, NULL));
    CHECK_OK(gm_free(pool, c.p, NULL));
    CHECK_OK(gm_pool_check(pool));
    gm_stats_t st = pool_stats_of(pool);
    CHECK(st.allocated == 0 && st.offloaded == 0);
    gm_pool_destroy(pool);
}

/* A held tag is never evicted, nor one without GM_TAG_EVICTABLE, nor any
 * in a pool without GM_POOL_EVICT. */
static void test_never(void)
{
    gm_pool_t *pool = evict_pool(GM_POOL_EVICT, 1);
    if (!pool) { CHECK(0); return; }
    void *x = NULL;
    /* Held. */
    tblock_t a = {NULL, 40 * MiB, A, 10, NULL};
    CHECK_OK(gm_tag_acquire(pool, A, NULL));
    CHECK_OK(gm_alloc_tagged(pool, a.n, NULL, A, &a.p));
    CHECK_OK(dev_fill(pool, a.p, a.n, a.seed, NULL));
    gm_stats_t st0 = pool_stats_of(pool);
    CHECK_RC(gm_alloc(pool, 32 * MiB, NULL, &x), GM_OUT_OF_MEMORY);
    gm_stats_t st1 = pool_stats_of(pool);
    CHECK(st1.evictions == 0 && st1.offloaded == 0);
    CHECK(st1.oom_count == st0.oom_count + 1);
    CHECK(resident(pool, A));
    CHECK(tag_info_of(pool, A).holds == 1);
    CHECK(dev_check(pool, a.p, a.n, a.seed, NULL, "held tag"));
    /* Released: now it may go. */
    CHECK_OK(gm_tag_release(pool, A, NULL));
    CHECK_OK(gm_alloc(pool, 32 * MiB, NULL, &x));
    CHECK(evicted(pool, A));
    CHECK(pool_stats_of(pool).evictions == 1);
    /* Acquire with the device still full: cannot restore, holds nothing. */
    int rc = gm_tag_acquire(pool, A, NULL);
    CHECK(rc == GM_OUT_OF_MEMORY || rc == GM_LIMIT);
    CHECK(evicted(pool, A));
    CHECK(tag_info_of(pool, A).holds == 0);
    CHECK_OK(gm_free(pool, x, NULL));
    check_tag(pool, &a, "A after eviction");
    CHECK_OK(gm_free(pool, a.p, NULL));

    /* Not evictable (used without acquire, as plain tags are). */
    tblock_t n = {NULL, 40 * MiB, N, 11, NULL};
    CHECK_OK(gm_alloc_tagged(pool, n.n, NULL, N, &n.p));
    CHECK_OK(dev_fill(pool, n.p, n.n, n.seed, NULL));
    st0 = pool_stats_of(pool);
    CHECK_RC(gm_alloc(pool, 32 * MiB, NULL, &x), GM_OUT_OF_MEMORY);
    CHECK(pool_stats_of(pool).evictions == st0.evictions);
    CHECK(resident(pool, N));
    CHECK(tag_info_of(pool, N).evictions == 0);
    CHECK(dev_check(pool, n.p, n.n, n.seed, NULL, "non-evictable tag"));
    CHECK_OK(gm_free(pool, n.p, NULL));
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);

    /* A pool without GM_POOL_EVICT. */
    pool = evict_pool(0, 1);
    if (!pool) { CHECK(0); return; }
    tblock_t b = tag_block(pool, B, 40 * MiB, 12, NULL);
    CHECK_RC(gm_alloc(pool, 32 * MiB, NULL, &x), GM_OUT_OF_MEMORY);
    CHECK(pool_stats_of(pool).evictions == 0);
    CHECK(resident(pool, B));
    CHECK(dev_check(pool, b.p, b.n, b.seed, NULL, "pool without GM_POOL_EVICT"));
    CHECK_OK(gm_free(pool, b.p, NULL));
    gm_pool_destroy(pool);
}

/* The tag's work queued before the release on a held stream: it cannot be
 * waited for, so the tag stays; once the stream passes, it goes. */
static void test_release_stream(void)
{
    gm_pool_t *pool = evict_pool(GM_POOL_EVICT, 1);
    if (!pool) { CHECK(0); return; }
    gm_stream_t H;
    CHECK_OK(gm_stream_create(pool, &H));
    tblock_t a = {NULL, 40 * MiB, A, 20, NULL};
    CHECK_OK(gm_tag_acquire(pool, A, H));
    CHECK_OK(gm_alloc_tagged(pool, a.n, H, A, &a.p));
    CHECK_OK(dev_fill(pool, a.p, a.n, a.seed, H));
    CHECK_OK(gm_sim_hold_stream(pool, H, 1));
    CHECK_OK(gm_memset(pool, a.p, 0x6b, MiB, H)); /* in flight */
    CHECK_OK(gm_tag_release(pool, A, H));
    void *x = NULL;
    int rc = gm_alloc(pool, 32 * MiB, NULL, &x);
    CHECK(rc != GM_OK);
    CHECK(resident(pool, A));
    CHECK(pool_stats_of(pool).evictions == 0);
    if (rc == GM_OK) CHECK_OK(gm_free(pool, x, NULL));
    CHECK_OK(gm_pool_check(pool));
    CHECK_OK(gm_sim_hold_stream(pool, H, 0));
    CHECK_OK(gm_alloc(pool, 32 * MiB, NULL, &x));
    CHECK(evicted(pool, A));
    CHECK_OK(gm_free(pool, x, NULL));
    CHECK_OK(gm_tag_acquire(pool, A, H));
    unsigned char *want = malloc(a.n);
    if (want) {
        pattern(want, a.n, a.seed);
        memset(want, 0x6b, MiB);
        CHECK(dev_equal(pool, a.p, want, a.n, H, "evicted after the held stream passed"));
        free(want);
    }
    CHECK_OK(gm_tag_release(pool, A, H));
    CHECK_OK(gm_free(pool, a.p, H));
    CHECK_OK(gm_stream_destroy(pool, H));
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
}

/* An evictable discard tag goes without a copy and comes back usable. */
static void test_discard_evict(void)
{
    gm_pool_t *pool = evict_pool(GM_POOL_EVICT, 1);
    if (!pool) { CHECK(0); return; }
    tblock_t k = tag_block(pool, K, 40 * MiB, 30, NULL);
    gm_stats_t st0 = pool_stats_of(pool);
    void *x = NULL;
    CHECK_OK(gm_alloc(pool, 32 * MiB, NULL, &x));
    gm_stats_t st1 = pool_stats_of(pool);
    CHECK(st1.evictions == 1);
    CHECK(tag_info_of(pool, K).resident_blocks == 0);
    CHECK(st1.backend_calls[GM_CALL_memcpy] == st0.backend_calls[GM_CALL_memcpy]);
    CHECK(st1.host_allocated == st0.host_allocated);
    CHECK_OK(gm_free(pool, x, NULL));
    CHECK_OK(gm_tag_acquire(pool, K, NULL));
    CHECK(tag_info_of(pool, K).resident_blocks == 1);
    CHECK_OK(gm_memset(pool, k.p, 0x29, k.n, NULL));
    CHECK(dev_check_byte(pool, k.p, k.n, 0x29, NULL, "discard tag after eviction"));
    CHECK_OK(gm_tag_release(pool, K, NULL));
    CHECK_OK(gm_free(pool, k.p, NULL));
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
}

/* Evictions one after another while many tags compete. */
static void test_churn(void)
{
    gm_pool_t *pool = evict_pool(GM_POOL_EVICT, 1);
    if (!pool) { CHECK(0); return; }
    gm_tag_t t[6];
    tblock_t blk[6];
    for (int i = 0; i < 6; i++) {
        char name[32];
        snprintf(name, sizeof name, "evict.churn.%d", i);
        CHECK_OK(gm_tag_get(name, GM_TAG_EVICTABLE, &t[i]));
        blk[i] = (tblock_t){NULL, 0, t[i], 0, NULL};
    }
    /* Each round: one tag is acquired (restored or made), rewritten, checked,
     * released; 6 tags of 14 MiB cannot all live on 64 MiB at once. */
    int rounds = scaled(60, 12);
    uint64_t rng = 7;
    int ok = 1;
    for (int r = 0; r < rounds; r++) {
        int i = (int)(rng_next(&rng) % 6);
        tblock_t *x = &blk[i];
        int rc = gm_tag_acquire(pool, t[i], NULL);
        CHECK_OK(rc);
        if (rc != GM_OK) {
            fprintf(stderr, "  churn round %d: acquire of tag %d: %s\n", r, i, gm_last_error());
            break;
        }
        if (!x->p) {
            x->n = 14 * MiB - 4096 * (size_t)i;
            rc = gm_alloc_tagged(pool, x->n, NULL, t[i], &x->p);
            CHECK_OK(rc);
            if (rc != GM_OK) break;
        } else if (!dev_check(pool, x->p, x->n, x->seed, NULL, "churn")) {
            ok = 0;
        }
        x->seed = rng_next(&rng);
        CHECK_OK(dev_fill(pool, x->p, x->n, x->seed, NULL));
        CHECK_OK(gm_tag_release(pool, t[i], NULL));
    }
    CHECK(ok);
    CHECK(pool_stats_of(pool).evictions > 0);
    for (int i = 0; i < 6; i++) {
        if (!blk[i].p) continue;
        check_tag(pool, &blk[i], "churn, last check");
        CHECK_OK(gm_free(pool, blk[i].p, NULL));
    }
    CHECK_OK(gm_pool_check(pool));
    gm_stats_t st = pool_stats_of(pool);
    CHECK(st.allocated == 0 && st.offloaded == 0);
    gm_pool_destroy(pool);
}

/* Heaps: a tag's blocks allocated by several threads lie in several heaps;
 * an allocation in one heap evicts the tag from all of them. */
typedef struct heap_job {
    gm_pool_t *pool;
    tblock_t *x;
    int rc;
} heap_job_t;

static void *heap_alloc(void *p)
{
    heap_job_t *j = p;
    j->rc = gm_alloc_tagged(j->pool, j->x->n, NULL, j->x->tag, &j->x->p);
    if (j->rc == GM_OK) j->rc = dev_fill(j->pool, j->x->p, j->x->n, j->x->seed, NULL);
    if (j->rc == GM_OK) j->rc = gm_stream_synchronize(j->pool, NULL);
    scratch_free();
    return NULL;
}

static void test_heaps(void)
{
    gm_pool_t *pool = evict_pool(GM_POOL_EVICT, 4);
    if (!pool) { CHECK(0); return; }
    void *first = NULL;
    CHECK_OK(gm_alloc(pool, 1000, NULL, &first)); /* this thread takes a heap first */
    tblock_t x[3];
    heap_job_t j[3];
    pthread_t th[3];
    CHECK_OK(gm_tag_acquire(pool, A, NULL));
    for (int i = 0; i < 3; i++) {
        x[i] = (tblock_t){NULL, 6 * MiB + 4096 * (size_t)i, A, 60 + (uint64_t)i, NULL};
        j[i] = (heap_job_t){pool, &x[i], -1};
        /* One at a time: each new thread is given the next heap. */
        CHECK(pthread_create(&th[i], NULL, heap_alloc, &j[i]) == 0);
        pthread_join(th[i], NULL);
        CHECK_OK(j[i].rc);
    }
    CHECK_OK(gm_tag_release(pool, A, NULL));
    gm_tag_info_t ti = tag_info_of(pool, A);
    CHECK(ti.resident_blocks == 3);
    void *big = NULL;
    CHECK_OK(gm_alloc(pool, 44 * MiB, NULL, &big));
    ti = tag_info_of(pool, A);
    CHECK(ti.resident_blocks == 0 && ti.offloaded_blocks == 3);
    CHECK(pool_stats_of(pool).evictions == 1);
    CHECK_OK(gm_free(pool, big, NULL));
    /* The 44 MiB just freed are cached in this thread's heap; the restore
     * of blocks of other heaps must be able to use that memory (as an
     * allocation there would: the pool trims its caches before failing). */
    int rc = gm_tag_acquire(pool, A, NULL);
    CHECK_OK(rc);
    if (rc != GM_OK) {
        ti = tag_info_of(pool, A);
        fprintf(stderr, "  heaps: acquire failed with 44 MiB cached in another heap; the tag "
                "is now %" PRIu64 " blocks resident, %" PRIu64 " offloaded, holds %" PRIu64
                "\n", ti.resident_blocks, ti.offloaded_blocks, ti.holds);
        CHECK((ti.resident_blocks == 0) && "a failed restore is all or nothing");
        CHECK_OK(gm_trim(pool, 0, NULL));
        CHECK_OK(gm_tag_acquire(pool, A, NULL));
    }
    CHECK(check_all(pool, x, 3, "heaps, after eviction"));
    CHECK_OK(gm_tag_release(pool, A, NULL));
    for (int i = 0; i < 3; i++) CHECK_OK(gm_free(pool, x[i].p, NULL));
    CHECK_OK(gm_free(pool, first, NULL));
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
}

static void test_env(void)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    unsetenv("GPUMEM_EVICT");
    CHECK_OK(gm_config_from_env(&cfg));
    CHECK((cfg.flags & GM_POOL_EVICT) == 0);
    setenv("GPUMEM_EVICT", "1", 1);
    cfg = (gm_pool_config_t)GM_POOL_CONFIG_INIT;
    CHECK_OK(gm_config_from_env(&cfg));
    CHECK((cfg.flags & GM_POOL_EVICT) != 0);
    CHECK((cfg.flags & GM_POOL_SYSMEM_FALLBACK) == 0);
    setenv("GPUMEM_EVICT", "0", 1);
    cfg = (gm_pool_config_t)GM_POOL_CONFIG_INIT;
    CHECK_OK(gm_config_from_env(&cfg));
    CHECK((cfg.flags & GM_POOL_EVICT) == 0);
    unsetenv("GPUMEM_EVICT");
    /* A pool made from it evicts. */
    setenv("GPUMEM_EVICT", "1", 1);
    cfg = (gm_pool_config_t)GM_POOL_CONFIG_INIT;
    CHECK_OK(gm_config_from_env(&cfg));
    unsetenv("GPUMEM_EVICT");
    cfg.backend = GM_BACKEND_SIM;
    cfg.sim_capacity = CAP;
    gm_pool_t *pool = pool_from(&cfg);
    if (!pool) { CHECK(0); return; }
    tblock_t a = tag_block(pool, A, 40 * MiB, 40, NULL);
    void *x = NULL;
    CHECK_OK(gm_alloc(pool, 32 * MiB, NULL, &x));
    CHECK(pool_stats_of(pool).evictions == 1);
    CHECK_OK(gm_free(pool, x, NULL));
    check_tag(pool, &a, "pool from GPUMEM_EVICT=1");
    CHECK_OK(gm_free(pool, a.p, NULL));
    gm_pool_destroy(pool);
}

int main(void)
{
    if (test_backend() != GM_BACKEND_SIM) {
        printf("test_offload_evict: sim only, skipped\n");
        return 77;
    }
    REQUIRE(gm_tag_get("evict.a", GM_TAG_EVICTABLE, &A) == GM_OK);
    REQUIRE(gm_tag_get("evict.b", GM_TAG_EVICTABLE, &B) == GM_OK);
    REQUIRE(gm_tag_get("evict.c", GM_TAG_EVICTABLE, &C) == GM_OK);
    REQUIRE(gm_tag_get("evict.d", GM_TAG_EVICTABLE, &D) == GM_OK);
    REQUIRE(gm_tag_get("evict.n", 0, &N) == GM_OK);
    REQUIRE(gm_tag_get("evict.k", GM_TAG_EVICTABLE | GM_TAG_DISCARD, &K) == GM_OK);
    test_lru();
    test_never();
    test_release_stream();
    test_discard_evict();
    test_churn();
    test_heaps();
    test_env();
    scratch_free();
    return test_summary();
}
