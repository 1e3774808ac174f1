/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_stress.c — threads x random alloc/free on their own streams, with the
 * data of every live block checked through the mappings before it is freed,
 * blocks handed between threads (freed on another stream than they were
 * allocated on), and trims racing with all of it.
 *
 * usage: test_stress [threads] [scale] [iterations] [seed]
 *   scale multiplies the largest request (scale x 4 MiB); deterministic per
 *   thread for a given seed.  GPUMEM_TEST_BACKEND=cuda runs it on a GPU.
 */
// ctest-args: 4 1 3000 42
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpumem.h"
#include "../test.h"

#define SLOTS 48
#define STRIDE 65536u
#define TAG 16u

typedef struct {
    void *ptr;
    size_t size;
    uint64_t tag;
} slot_t;

static gm_pool_t *pool;
static int n_threads = 4, scale = 1, iterations = 3000;
static unsigned long seed = 42;
static size_t max_size;

/* A handoff box: a block one thread allocated, another frees. */
static pthread_mutex_t box_lock = PTHREAD_MUTEX_INITIALIZER;
static slot_t box[16];
static int box_n;

static _Atomic unsigned long failures, allocs, frees;

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static gm_stream_t streams[256];

static gm_stream_t stream_of(int t) { return streams[t]; }

/* The tag written at every STRIDE bytes and at the end of a block. */
static void tag_bytes(uint64_t tag, size_t off, unsigned char out[TAG])
{
    uint64_t a = tag ^ (off * 0x9E3779B97F4A7C15ull), b = ~tag + off;
    memcpy(out, &a, 8);
    memcpy(out + 8, &b, 8);
}

static void write_tags(const slot_t *s, gm_stream_t st)
{
    unsigned char t[TAG];
    for (size_t off = 0; off + 2 * TAG <= s->size; off += STRIDE) {
        tag_bytes(s->tag, off, t);
        gm_memcpy(pool, (char *)s->ptr + off, t, TAG, st);
        gm_stream_synchronize(pool, st);
    }
    if (s->size >= TAG) {
        tag_bytes(s->tag, s->size - TAG, t);
        gm_memcpy(pool, (char *)s->ptr + s->size - TAG, t, TAG, st);
        gm_stream_synchronize(pool, st);
    }
}

static int tags_ok(const slot_t *s, gm_stream_t st)
{
    unsigned char want[TAG], got[TAG];
    for (size_t off = 0; off + 2 * TAG <= s->size; off += STRIDE) {
        tag_bytes(s->tag, off, want);
        if (gm_memcpy(pool, got, (char *)s->ptr + off, TAG, st) != GM_OK) return 0;
        gm_stream_synchronize(pool, st);
        if (memcmp(want, got, TAG)) return 0;
    }
    if (s->size >= TAG) {
        tag_bytes(s->tag, s->size - TAG, want);
        if (gm_memcpy(pool, got, (char *)s->ptr + s->size - TAG, TAG, st) != GM_OK) return 0;
        gm_stream_synchronize(pool, st);
        if (memcmp(want, got, TAG)) return 0;
    }
    return 1;
}

static void fail(const char *what, const slot_t *s)
{
    failures++;
    fprintf(stderr, "stress: %s: block %p of %zu bytes: %s\n", what, s->ptr, s->size, gm_last_error());
}

static void release(slot_t *s, gm_stream_t st)
{
    if (!tags_ok(s, st)) fail("data changed", s);
    if (gm_free(pool, s->ptr, st) != GM_OK) fail("gm_free", s);
    frees++;
    s->ptr = NULL;
}

static void *worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    uint64_t r = seed * 0x2545F4914F6CDD1Dull + (uint64_t)id * 7919 + 1;
    gm_stream_t st = stream_of(id);
    slot_t slots[SLOTS] = {{0}};
    for (int it = 0; it < iterations; it++) {
        int k = (int)(rnd(&r) % SLOTS);
        slot_t *s = &slots[k];
        if (s->ptr) {
            unsigned action = (unsigned)(rnd(&r) % 8);
            if (action == 0) { /* hand it to another thread */
                pthread_mutex_lock(&box_lock);
                if (box_n < 16) {
                    box[box_n++] = *s;
                    s->ptr = NULL;
                }
                pthread_mutex_unlock(&box_lock);
                if (!s->ptr) continue;
            }
            release(s, st);
            continue;
        }
        /* log-uniform size in [256 B, max_size], sometimes odd-sized */
        double lo = 8, hi = 0;
        for (size_t m = max_size; m > 1; m >>= 1) hi++;
        double e = lo + (hi - lo) * (double)(rnd(&r) % 10000) / 10000.0;
        size_t size = (size_t)1 << (size_t)e;
        size += rnd(&r) % size;
        if (size > max_size) size = max_size;
        int rc = gm_alloc(pool, size, st, &s->ptr);
        if (rc == GM_OUT_OF_MEMORY || rc == GM_LIMIT) { /* legal under pressure */
            s->ptr = NULL;
            continue;
        }
        if (rc != GM_OK || !s->ptr || ((uintptr_t)s->ptr % GM_ALIGNMENT)) {
            fail("gm_alloc", s);
            s->ptr = NULL;
            continue;
        }
        allocs++;
        s->size = size;
        s->tag = rnd(&r);
        write_tags(s, st);
        if (it % 97 == 0) { /* take one from the box: free it on our stream */
            slot_t b = {0};
            pthread_mutex_lock(&box_lock);
            if (box_n) b = box[--box_n];
            pthread_mutex_unlock(&box_lock);
            if (b.ptr) release(&b, st);
        }
        if (id == 0 && it % 501 == 500 && gm_trim(pool, 0, NULL) != GM_OK) fail("gm_trim", s);
        if (id == 1 && it % 211 == 0) {
            gm_stats_t stats = GM_STATS_INIT;
            if (gm_pool_stats(pool, &stats) != GM_OK) fail("gm_pool_stats", s);
        }
    }
    for (int k = 0; k < SLOTS; k++)
        if (slots[k].ptr) release(&slots[k], st);
    return NULL;
}

int main(int argc, char **argv)
{
    int rc = stress_args(argc, argv, &n_threads, &scale, &iterations, &seed, 1);
    if (rc) return rc;
    max_size = (size_t)scale << 22;
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = test_backend();
    cfg.sim_capacity = (size_t)n_threads * SLOTS * max_size / 2 + ((size_t)64 << 20);
    /* A limit under the worst case keeps the pool under pressure. */
    cfg.limit = (size_t)n_threads * SLOTS * max_size / 10 + ((size_t)32 << 20);
    REQUIRE(gm_pool_create(&cfg, &pool) == GM_OK);
    printf("stress: %d threads, sizes up to %zu bytes, %d iterations, seed %lu, limit %zu\n",
           n_threads, max_size, iterations, seed, cfg.limit);
    pthread_t th[256];
    for (int t = 0; t < n_threads; t++) REQUIRE(gm_stream_create(pool, &streams[t]) == GM_OK);
    for (int t = 0; t < n_threads; t++)
        REQUIRE(pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t) == 0);
    for (int t = 0; t < n_threads; t++) pthread_join(th[t], NULL);
    for (int i = 0; i < box_n; i++) release(&box[i], NULL);
    CHECK(failures == 0);
    CHECK(allocs > (unsigned long)iterations / 4);
    CHECK(allocs == frees);
    CHECK_OK(gm_pool_check(pool));
    gm_stats_t st = GM_STATS_INIT;
    CHECK_OK(gm_pool_stats(pool, &st));
    CHECK(st.allocated == 0 && st.live_blocks == 0);
    CHECK(st.reserved_peak <= cfg.limit);
    CHECK_OK(gm_trim(pool, 0, NULL));
    CHECK_OK(gm_pool_stats(pool, &st));
    CHECK(st.reserved == 0);
    printf("stress: %lu allocations, reserved peak %lu, pages moved %lu, ooms %lu\n",
           (unsigned long)allocs, (unsigned long)st.reserved_peak,
           (unsigned long)st.pages_stolen, (unsigned long)st.oom_count);
    for (int t = 0; t < n_threads; t++) CHECK_OK(gm_stream_destroy(pool, streams[t]));
    gm_pool_destroy(pool);
    return test_summary();
}
