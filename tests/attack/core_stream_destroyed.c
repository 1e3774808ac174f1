/* SPDX-License-Identifier: Apache-2.0 */
/*
 * core_stream_destroyed.c — attacks gm_stream_forget's promise (gpumem.h):
 * "so that no event is recorded on the stream again ... gm_stream_destroy
 * calls it".  A stream may be destroyed while blocks allocated on it, or
 * recorded on it with gm_record_stream, are still live.  Before the fix the
 * pool kept calling the backend with the destroyed handle:
 *   - gm_offload of a tag with such a block synchronized the stream and
 *     failed with GM_INVALID_ARGUMENT on every retry (and so could never be
 *     evicted either);
 *   - gm_free of a block recorded on it recorded an event there, failed,
 *     and left the block pending for good: its memory never reusable, never
 *     trimmed.
 *   - a block freed on it into ANOTHER thread's cache came back (at that
 *     thread's exit) to a fresh state of the dead handle, whose event the
 *     pool could never record: its page was lost until the pool was
 *     destroyed, and a second gm_stream_forget failed.
 * Also: a stream forgotten and then used again keeps working.
 */
#include <pthread.h>

#include "gpumem.h"
#include "../test.h"

#define MiB ((size_t)1 << 20)

static void offload_after_destroy(void)
{
    gm_pool_t *pool = test_pool(64 * MiB, 0);
    gm_tag_t tag;
    gm_stream_t s = NULL, other = NULL;
    void *blk = NULL, *rec = NULL;
    if (!pool || gm_tag_get("destroyed_stream", 0, &tag) != GM_OK ||
        gm_stream_create(pool, &s) != GM_OK || gm_stream_create(pool, &other) != GM_OK) {
        CHECK(!"setup");
        if (pool) gm_pool_destroy(pool);
        return;
    }
    CHECK_OK(gm_alloc_tagged(pool, 3 * MiB, s, tag, &blk));
    CHECK_OK(gm_memset(pool, blk, 7, 3 * MiB, s));
    CHECK_OK(gm_alloc_tagged(pool, 5000, other, tag, &rec));
    CHECK_OK(gm_memset(pool, rec, 9, 5000, other));
    CHECK_OK(gm_record_stream(pool, rec, s)); /* used on s as well */
    CHECK_OK(gm_stream_destroy(pool, s));      /* both blocks stay live */
    CHECK_OK(gm_pool_check(pool));
    CHECK_OK(gm_offload(pool, tag, 0, other));
    gm_tag_info_t ti = GM_TAG_INFO_INIT;
    CHECK_OK(gm_tag_info(pool, tag, &ti));
    CHECK(ti.offloaded_blocks == 2 && ti.resident_blocks == 0);
    CHECK_OK(gm_restore(pool, tag, other));
    unsigned char a = 0, b = 0;
    CHECK_OK(gm_memcpy_d2h(pool, &a, (char *)blk + 3 * MiB - 1, 1, other));
    CHECK_OK(gm_memcpy_d2h(pool, &b, (char *)rec + 4999, 1, other));
    CHECK(a == 7 && b == 9);
    CHECK_OK(gm_free(pool, blk, other));
    CHECK_OK(gm_free(pool, rec, other));
    CHECK_OK(gm_pool_check(pool));
    CHECK_OK(gm_stream_destroy(pool, other));
    gm_pool_destroy(pool);
}

static void recorded_free_after_destroy(void)
{
    gm_pool_t *pool = test_pool(64 * MiB, 0);
    gm_stream_t s = NULL;
    void *blk = NULL;
    if (!pool || gm_stream_create(pool, &s) != GM_OK) {
        CHECK(!"setup");
        if (pool) gm_pool_destroy(pool);
        return;
    }
    CHECK_OK(gm_alloc(pool, 3 * MiB, NULL, &blk));
    CHECK_OK(gm_record_stream(pool, blk, s));
    CHECK_OK(gm_stream_destroy(pool, s));
    CHECK_OK(gm_free(pool, blk, NULL));
    size_t released = 0;
    CHECK_OK(gm_trim(pool, 0, &released));
    gm_stats_t st = GM_STATS_INIT;
    CHECK_OK(gm_pool_stats(pool, &st));
    CHECK(st.reserved == 0); /* not held back by a block waiting for s forever */
    CHECK(released >= 4 * MiB);
    /* And the memory serves again. */
    for (int i = 0; i < 3; i++) {
        void *p = NULL;
        CHECK_OK(gm_alloc(pool, 3 * MiB, NULL, &p));
        CHECK_OK(gm_free(pool, p, NULL));
    }
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
}

/* A stream forgotten while a block allocated on it is live, then used
 * again under the same handle (a program that calls gm_stream_forget and
 * keeps the stream): the handle gets a fresh state, and both blocks free. */
static void forgotten_then_used(void)
{
    gm_pool_t *pool = test_pool(64 * MiB, 0);
    gm_stream_t s = NULL;
    void *a = NULL, *b = NULL;
    if (!pool || gm_stream_create(pool, &s) != GM_OK) {
        CHECK(!"setup");
        if (pool) gm_pool_destroy(pool);
        return;
    }
    CHECK_OK(gm_alloc(pool, 300, s, &a));
    CHECK_OK(gm_stream_forget(pool, s));
    CHECK_OK(gm_pool_check(pool));
    CHECK_OK(gm_alloc(pool, 300, s, &b));
    CHECK_OK(gm_free(pool, a, s));
    CHECK_OK(gm_free(pool, b, s));
    CHECK_OK(gm_pool_check(pool));
    CHECK_OK(gm_stream_forget(pool, s));
    CHECK_OK(gm_stream_destroy(pool, s));
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
}

/* A worker frees a 4 KiB block on s into its own cache; the main thread
 * destroys s; the worker exits (its cache goes back).  Under a limit of one
 * page, the page must serve the default stream afterwards. */
typedef struct cache_job {
    gm_pool_t *pool;
    gm_stream_t s;
    pthread_barrier_t cached, destroyed;
    int rc;
} cache_job_t;

static void *cache_worker(void *arg)
{
    cache_job_t *j = arg;
    void *p = NULL;
    j->rc = gm_alloc(j->pool, 4096, j->s, &p);
    if (j->rc == GM_OK) j->rc = gm_free(j->pool, p, j->s); /* into this thread's cache */
    pthread_barrier_wait(&j->cached);
    pthread_barrier_wait(&j->destroyed);
    return NULL; /* exit: the cache goes back to the pool */
}

static void cached_in_other_thread(void)
{
    gm_pool_t *pool = test_pool(64 * MiB, 2 * MiB); /* a limit of one page */
    cache_job_t j = {.pool = pool};
    if (!pool || gm_stream_create(pool, &j.s) != GM_OK) {
        CHECK(!"setup");
        if (pool) gm_pool_destroy(pool);
        return;
    }
    pthread_barrier_init(&j.cached, NULL, 2);
    pthread_barrier_init(&j.destroyed, NULL, 2);
    pthread_t t;
    if (pthread_create(&t, NULL, cache_worker, &j) != 0) {
        CHECK(!"pthread_create");
    } else {
        pthread_barrier_wait(&j.cached);
        CHECK_OK(gm_stream_destroy(pool, j.s));
        pthread_barrier_wait(&j.destroyed);
        pthread_join(t, NULL);
        CHECK_OK(j.rc);
    }
    pthread_barrier_destroy(&j.cached);
    pthread_barrier_destroy(&j.destroyed);
    enum { N = 512 };
    static void *v[N];
    int failed = 0;
    for (int i = 0; i < N; i++)
        if (gm_alloc(pool, 4096, NULL, &v[i]) != GM_OK) failed++, v[i] = NULL;
    CHECK(failed == 0); /* the whole page serves the default stream */
    for (int i = 0; i < N; i++)
        if (v[i]) CHECK_OK(gm_free(pool, v[i], NULL));
    size_t released = 0;
    CHECK_OK(gm_trim(pool, 0, &released));
    gm_stats_t st = GM_STATS_INIT;
    CHECK_OK(gm_pool_stats(pool, &st));
    CHECK(st.reserved == 0 && st.allocated == 0);
    CHECK_OK(gm_stream_forget(pool, j.s)); /* nothing names the dead handle */
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
}

int main(void)
{
    cached_in_other_thread();
    offload_after_destroy();
    recorded_free_after_destroy();
    forgotten_then_used();
    return test_summary();
}
