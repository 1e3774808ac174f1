/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_tcache.c — the per-thread cache of small blocks, through the public
 * API: a repeated small alloc+free reuses the block, the statistics read as
 * if every operation had taken the lock, double frees are caught whether the
 * second free comes from the same thread or another one, a block cached for
 * one stream never serves another, a freed block is no longer a block
 * (gm_block_size), a thread's exit gives its cache back, and a pool
 * destroyed while another thread caches its blocks reports no live
 * allocation for them.  Blocks over 64 KiB, of any size: one at a time,
 * held only until the thread's next locked allocation or free, and, over
 * 2 MiB, until another thread's trim or allocation that would fail without
 * it takes it back.  A stress
 * test so that the TSan phase runs it.
 *
 * usage: test_tcache [threads] [scale] [iterations] [seed]
 *   threads that churn small pairs (and hand one block each to the main
 *   thread) while the main thread checks; iterations: pairs per thread;
 *   scale and seed: unused (the sequence is fixed).
 */
// ctest-args: 4 1 1000 1
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "gpumem.h"
#include "../test.h"

static gm_stats_t stats(gm_pool_t *pool) { return pool_stats_of(pool); }

static void *other_free(void *arg)
{
    void **pp = arg;
    /* pp[0]: pool, pp[1]: pointer; the result in pp[2] */
    pp[2] = (void *)(intptr_t)gm_free(pp[0], pp[1], NULL);
    return NULL;
}

/* p was freed on stream s (and waits in this thread's cache): a second
 * free, from this thread and from another one, is a double free. */
static void double_frees(gm_pool_t *pool, void *p, gm_stream_t s)
{
    CHECK_RC(gm_free(pool, p, s), GM_DOUBLE_FREE);
    CHECK(strstr(gm_last_error(), "already freed") != NULL);
    void *arg[3] = {pool, p, NULL};
    pthread_t t;
    if (pthread_create(&t, NULL, other_free, arg) != 0) {
        CHECK(!"pthread_create");
        return;
    }
    pthread_join(t, NULL);
    CHECK((int)(intptr_t)arg[2] == GM_DOUBLE_FREE);
    CHECK_OK(gm_pool_check(pool));
}

static void *other_alloc(void *arg)
{
    void **pp = arg;
    /* pp[0]: pool, pp[1]: size; the result in pp[2]; freed again */
    void *p = NULL;
    int rc = gm_alloc(pp[0], (size_t)(uintptr_t)pp[1], NULL, &p);
    if (rc == GM_OK) rc = gm_free(pp[0], p, NULL);
    pp[2] = (void *)(intptr_t)rc;
    return NULL;
}

static void *keep_alloc(void *arg)
{
    void **pp = arg;
    /* pp[0]: pool, pp[1]: size; the block (kept) in pp[2], NULL on failure */
    if (gm_alloc(pp[0], (size_t)(uintptr_t)pp[1], NULL, &pp[2]) != GM_OK) pp[2] = NULL;
    return NULL;
}

/* The cache of blocks over GM_TC_MAX, in a pool limited to two pages. */
static int large_blocks(void)
{
    const size_t page = (size_t)2 << 20;
    gm_pool_t *pool = test_pool((size_t)1 << 30, 2 * page);
    REQUIRE(pool != NULL);
    gm_device_info_t info = GM_DEVICE_INFO_INIT;
    CHECK_OK(gm_pool_device_info(pool, &info));
    void *a = NULL, *b = NULL;
    CHECK_OK(gm_alloc(pool, page, NULL, &a));
    CHECK_OK(gm_free(pool, a, NULL));
    gm_stats_t st = stats(pool);
    CHECK(st.allocated == 0 && st.live_blocks == 0 && st.alloc_count == 1 && st.free_count == 1);
    size_t sz = 0;
    CHECK_RC(gm_block_size(pool, a, &sz), GM_INVALID_POINTER);
    CHECK_OK(gm_alloc(pool, page, NULL, &b));
    CHECK(b == a); /* back from the cache */
    CHECK_OK(gm_free(pool, b, NULL));
    double_frees(pool, b, NULL);
    pthread_t t;
    if (info.granularity == page) {
        /* Another thread's small block takes the other page. */
        void *keep[3] = {pool, (void *)(uintptr_t)4096, NULL};
        REQUIRE(pthread_create(&t, NULL, keep_alloc, keep) == 0);
        pthread_join(t, NULL);
        REQUIRE(keep[2] != NULL);
        CHECK_OK(gm_alloc(pool, page, NULL, &a));
        CHECK_OK(gm_free(pool, a, NULL));
        /* Cached (2 MiB: not over GM_TC_RECLAIM_MIN), the block keeps its
         * page from other threads ... */
        void *big[3] = {pool, (void *)(uintptr_t)page, NULL};
        REQUIRE(pthread_create(&t, NULL, other_alloc, big) == 0);
        pthread_join(t, NULL);
        CHECK((int)(intptr_t)big[2] == GM_LIMIT || (int)(intptr_t)big[2] == GM_OUT_OF_MEMORY);
        /* ... until this thread's next locked operation (the free of a block
         * it has no entry for) gives it back first: two pages fit again. */
        CHECK_OK(gm_free(pool, keep[2], NULL));
        big[1] = (void *)(uintptr_t)(2 * page);
        big[2] = NULL;
        REQUIRE(pthread_create(&t, NULL, other_alloc, big) == 0);
        pthread_join(t, NULL);
        CHECK((int)(intptr_t)big[2] == GM_OK);
    }
    /* Two large frees in a row: the second goes to the pool after the first. */
    CHECK_OK(gm_alloc(pool, page / 2, NULL, &a));
    CHECK_OK(gm_alloc(pool, page / 2, NULL, &b));
    CHECK_OK(gm_free(pool, a, NULL));
    CHECK_OK(gm_free(pool, b, NULL));
    CHECK_OK(gm_pool_check(pool));
    st = stats(pool);
    CHECK(st.allocated == 0 && st.live_blocks == 0 && st.alloc_count == st.free_count);
    gm_pool_destroy(pool);
    return 0;
}

static void *other_trim(void *arg)
{
    size_t released = 0;
    if (gm_trim(arg, 0, &released) != GM_OK) released = 0;
    return (void *)(uintptr_t)released;
}

static uint64_t calls_of(gm_pool_t *pool)
{
    gm_stats_t st = stats(pool);
    uint64_t n = 0;
    for (int k = 0; k < GM_CALL_COUNT; k++) n += st.backend_calls[k];
    return n;
}

/* Blocks of any size over GM_TC_MAX (here 64 MiB and 1 GiB): a warm pair
 * is served by the cache (no backend call, the same block), and the block
 * never costs memory anyone else needs: another thread's trim gives its
 * pages back, another thread's allocation that needs them takes it, a leak
 * report does not list it, and its owner then finds it gone. */
static int large_any_size(void)
{
    const size_t GiB = (size_t)1 << 30, big = GiB, mid = (size_t)64 << 20;
    gm_pool_t *pool = test_pool(4 * GiB, GiB + mid);
    REQUIRE(pool != NULL);
    void *a = NULL, *b = NULL;
    CHECK_OK(gm_alloc(pool, big, NULL, &a));
    CHECK_OK(gm_free(pool, a, NULL));
    uint64_t c0 = calls_of(pool);
    for (int i = 0; i < 10; i++) {
        CHECK_OK(gm_alloc(pool, big, NULL, &b));
        CHECK(b == a);
        CHECK_OK(gm_free(pool, b, NULL));
    }
    CHECK(calls_of(pool) == c0);
    gm_stats_t st = stats(pool);
    CHECK(st.allocated == 0 && st.live_blocks == 0 && st.alloc_count == st.free_count);
    CHECK(st.reserved >= big && st.reserved - st.active >= big); /* cached memory */
    char buf[4096];
    CHECK_OK(gm_leak_report(pool, buf, sizeof buf, NULL));
    CHECK(strstr(buf, "Leaked") == NULL);

    /* Another thread's trim takes it back and gives its pages back. */
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, other_trim, pool) == 0);
    void *released = NULL;
    pthread_join(t, &released);
    CHECK((size_t)(uintptr_t)released >= big);
    st = stats(pool);
    CHECK(st.reserved < big && st.allocated == 0 && st.live_blocks == 0);
    CHECK(st.alloc_count == st.free_count);
    CHECK_RC(gm_free(pool, a, NULL), GM_DOUBLE_FREE); /* the owner finds it gone */
    CHECK_OK(gm_pool_check(pool));

    /* Another thread's allocation that needs its pages takes it. */
    CHECK_OK(gm_alloc(pool, big, NULL, &a));
    CHECK_OK(gm_free(pool, a, NULL));
    void *other[3] = {pool, (void *)(uintptr_t)big, NULL};
    REQUIRE(pthread_create(&t, NULL, other_alloc, other) == 0);
    pthread_join(t, NULL);
    CHECK((int)(intptr_t)other[2] == GM_OK);
    CHECK_OK(gm_alloc(pool, mid, NULL, &b)); /* the owner: served, its entry put right */
    st = stats(pool);
    CHECK(st.allocated == mid && st.live_blocks == 1 && st.alloc_count == st.free_count + 1);
    CHECK_OK(gm_free(pool, b, NULL));
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);

    /* A pool that gives memory back on free caches none larger than that. */
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = test_backend();
    cfg.sim_capacity = 4 * GiB;
    cfg.limit = cfg.backend == GM_BACKEND_SIM ? 0 : 2 * GiB;
    cfg.release_threshold = 8 << 20;
    REQUIRE(gm_pool_create(&cfg, &pool) == GM_OK);
    CHECK_OK(gm_alloc(pool, mid, NULL, &a));
    CHECK_OK(gm_free(pool, a, NULL));
    st = stats(pool);
    CHECK(st.reserved - st.active <= (8 << 20));
    gm_pool_destroy(pool);
    return 0;
}

static int n_threads = 4, scale = 1, iterations = 1000;

/* Threads repeating large pairs while another trims all the time: each
 * pair's free caches the block, each trim may take it from under its
 * owner, whose next allocation must still be served and whose counts must
 * come out right. */
static _Atomic int race_stop;

static _Atomic long race_trims, race_released;

static void *trimmer(void *arg)
{
    while (!atomic_load(&race_stop)) {
        size_t r = 0;
        if (gm_trim(arg, 0, &r) != GM_OK) return (void *)1;
        atomic_fetch_add(&race_trims, 1);
        if (r) atomic_fetch_add(&race_released, 1);
    }
    return NULL;
}

static void *large_pairs(void *arg)
{
    gm_pool_t *pool = arg;
    for (int i = 0; i < iterations; i++) {
        void *p = NULL;
        size_t n = ((size_t)(i % 3) + 1) << 24; /* 16, 32, 48 MiB */
        if (gm_alloc(pool, n, NULL, &p) != GM_OK || gm_free(pool, p, NULL) != GM_OK) {
            fprintf(stderr, "large pair %d: %s\n", i, gm_last_error());
            return (void *)1;
        }
    }
    return NULL;
}

static int large_race(void)
{
    gm_pool_t *pool = test_pool((size_t)1 << 30, 0);
    REQUIRE(pool != NULL);
    pthread_t tr, w[2];
    atomic_store(&race_stop, 0);
    REQUIRE(pthread_create(&tr, NULL, trimmer, pool) == 0);
    for (int i = 0; i < 2; i++) REQUIRE(pthread_create(&w[i], NULL, large_pairs, pool) == 0);
    void *bad = NULL;
    for (int i = 0; i < 2; i++) {
        pthread_join(w[i], &bad);
        CHECK(bad == NULL);
    }
    atomic_store(&race_stop, 1);
    pthread_join(tr, &bad);
    CHECK(bad == NULL);
    printf("large pairs against trims: %d pairs on 2 threads, %ld trims, %ld gave memory back\n",
           iterations, atomic_load(&race_trims), atomic_load(&race_released));
    gm_stats_t st = stats(pool);
    CHECK(st.allocated == 0 && st.live_blocks == 0 && st.alloc_count == st.free_count);
    CHECK(st.alloc_count == 2 * (uint64_t)iterations);
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
    return 0;
}
static unsigned long seed = 1;

static void *churn(void *arg)
{
    gm_pool_t *pool = arg;
    for (int i = 0; i < iterations; i++) {
        void *p = NULL;
        if (gm_alloc(pool, 4096, NULL, &p) != GM_OK || gm_free(pool, p, NULL) != GM_OK)
            return (void *)1;
    }
    void *keep = NULL; /* one freed block left in this thread's cache */
    if (gm_alloc(pool, 8192, NULL, &keep) != GM_OK || gm_free(pool, keep, NULL) != GM_OK)
        return (void *)1;
    return NULL;
}

/* A pool of several heaps: a thread's cache serves the heap it allocates
 * from (it used to serve heap 0 only, so threads given other heaps took the
 * lock for every pair).  The thread (given heap 1) leaves a freed block in
 * its cache; a second free of it from the main thread must be told it
 * waits in a thread's cache. */
typedef struct heap_job {
    gm_pool_t *pool;
    pthread_barrier_t cached, checked;
    void *block;
    intptr_t bad;
} heap_job_t;

static void *heap_thread(void *arg)
{
    heap_job_t *j = arg;
    void *a = NULL, *b = NULL;
    for (int i = 0; i < 100; i++) {
        if (gm_alloc(j->pool, 512, NULL, &a) != GM_OK || gm_free(j->pool, a, NULL) != GM_OK) j->bad++;
        if (gm_alloc(j->pool, 512, NULL, &b) != GM_OK || b != a) j->bad++;
        if (i < 99 && gm_free(j->pool, b, NULL) != GM_OK) j->bad++;
    }
    if (gm_free(j->pool, b, NULL) != GM_OK) j->bad++;
    j->block = b;
    pthread_barrier_wait(&j->cached);
    pthread_barrier_wait(&j->checked); /* the main thread tried its free */
    gm_stats_t st = pool_stats_of(j->pool);
    if (st.alloc_count != 201 || st.free_count != 200 || st.live_blocks != 1) j->bad++;
    return NULL;
}

static void heaps_cache(void)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = test_backend();
    cfg.sim_capacity = (size_t)1 << 30;
    cfg.heaps = 4;
    gm_pool_t *pool = pool_from(&cfg);
    if (!pool) {
        CHECK(pool != NULL);
        return;
    }
    void *root_block = NULL; /* this thread takes heap 0 */
    CHECK_OK(gm_alloc(pool, 512, NULL, &root_block));
    heap_job_t j = {.pool = pool};
    pthread_barrier_init(&j.cached, NULL, 2);
    pthread_barrier_init(&j.checked, NULL, 2);
    pthread_t t;
    if (pthread_create(&t, NULL, heap_thread, &j) == 0) {
        pthread_barrier_wait(&j.cached);
        CHECK_RC(gm_free(pool, j.block, NULL), GM_DOUBLE_FREE);
        CHECK(strstr(gm_last_error(), "thread's cache") != NULL);
        pthread_barrier_wait(&j.checked);
        pthread_join(t, NULL);
    } else {
        CHECK(!"pthread_create");
    }
    CHECK(j.bad == 0);
    pthread_barrier_destroy(&j.cached);
    pthread_barrier_destroy(&j.checked);
    /* The thread's exit gave its cache back. */
    gm_stats_t st = pool_stats_of(pool);
    CHECK(st.live_blocks == 1 && st.allocated == 512 && st.alloc_count == st.free_count + 1);
    CHECK_OK(gm_free(pool, root_block, NULL));
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
}

int main(int argc, char **argv)
{
    int rc = stress_args(argc, argv, &n_threads, &scale, &iterations, &seed, 1);
    if (rc) return rc;
    gm_pool_t *pool = test_pool((size_t)1 << 30, 0);
    REQUIRE(pool != NULL);
    gm_stream_t s1 = (gm_stream_t)0, s2;
    CHECK_OK(gm_stream_create(pool, &s2));
    heaps_cache();

    /* Reuse, and the books. */
    void *a = NULL, *b = NULL;
    CHECK_OK(gm_alloc(pool, 512, s1, &a));
    CHECK_OK(gm_free(pool, a, s1));
    gm_stats_t st = stats(pool);
    CHECK(st.allocated == 0 && st.live_blocks == 0 && st.alloc_count == 1 && st.free_count == 1);
    size_t sz = 0;
    CHECK_RC(gm_block_size(pool, a, &sz), GM_INVALID_POINTER); /* freed is freed */
    CHECK_RC(gm_record_stream(pool, a, s2), GM_DOUBLE_FREE);
    CHECK_OK(gm_alloc(pool, 512, s1, &b));
    CHECK(b == a); /* the same block, back from the cache */
    st = stats(pool);
    CHECK(st.allocated == 512 && st.live_blocks == 1 && st.alloc_count == 2 && st.free_count == 1);
    CHECK(st.allocated_total == 1024 && st.freed_total == 512);
    CHECK_OK(gm_block_size(pool, b, &sz));
    CHECK(sz == 512);

    /* A double free from this thread, and from another thread: the block
     * waits in this one's cache. */
    CHECK_OK(gm_free(pool, b, s1));
    double_frees(pool, b, s1);
    pthread_t t;

    /* A block cached for s1 never serves s2. */
    void *c = NULL;
    CHECK_OK(gm_alloc(pool, 512, s2, &c));
    CHECK(c != b);
    CHECK_OK(gm_free(pool, c, s2));

    /* Freed by another thread: the pool has it; this thread's entry is
     * stale and the next free of the same address (a new block there) works. */
    void *d = NULL;
    CHECK_OK(gm_alloc(pool, 1024, s1, &d));
    void *arg2[3] = {pool, d, NULL};
    REQUIRE(pthread_create(&t, NULL, other_free, arg2) == 0);
    pthread_join(t, NULL);
    CHECK((int)(intptr_t)arg2[2] == GM_OK);
    CHECK_RC(gm_free(pool, d, s1), GM_DOUBLE_FREE);
    CHECK_OK(gm_pool_check(pool));

    /* Other threads' caches: counted while they run, given back at exit. */
    pthread_t ts[256];
    for (int i = 0; i < n_threads; i++) REQUIRE(pthread_create(&ts[i], NULL, churn, pool) == 0);
    for (int i = 0; i < n_threads; i++) {
        void *r = NULL;
        pthread_join(ts[i], &r);
        CHECK(r == NULL);
    }
    st = stats(pool);
    CHECK(st.allocated == 0 && st.live_blocks == 0 && st.active == 0);
    CHECK(st.alloc_count == st.free_count);
    CHECK_OK(gm_pool_check(pool));

    /* gm_trim gives this thread's cached blocks back. */
    CHECK_OK(gm_trim(pool, 0, NULL));
    st = stats(pool);
    CHECK(st.allocated == 0 && st.live_blocks == 0);
    CHECK_OK(gm_stream_destroy(pool, s2));
    gm_pool_destroy(pool);

    if (large_blocks() != 0) return test_summary();
    if (large_any_size() != 0) return test_summary();
    if (large_race() != 0) return test_summary();

    /* A pool destroyed while a cache holds its blocks: none reported live. */
    pool = test_pool((size_t)1 << 30, 0);
    REQUIRE(pool != NULL);
    void *e = NULL;
    CHECK_OK(gm_alloc(pool, 2048, NULL, &e));
    CHECK_OK(gm_free(pool, e, NULL));
    gm_pool_destroy(pool);
    CHECK(strstr(gm_last_error(), "live allocations") == NULL);
    /* The cache drops the dead pool; a new pool works from this thread. */
    pool = test_pool((size_t)1 << 30, 0);
    REQUIRE(pool != NULL);
    CHECK_OK(gm_alloc(pool, 2048, NULL, &e));
    CHECK_OK(gm_free(pool, e, NULL));
    CHECK_OK(gm_alloc(pool, 2048, NULL, &e));
    CHECK_OK(gm_free(pool, e, NULL));
    st = stats(pool);
    CHECK(st.allocated == 0 && st.alloc_count == 2 && st.free_count == 2);
    gm_pool_destroy(pool);
    return test_summary();
}
