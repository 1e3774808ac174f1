/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_copy_stress.c — threads x streams of staged and direct copies at
 * random, unaligned offsets and lengths, with pinned host blocks allocated,
 * checked and freed on random streams and trims racing with it all.
 *
 * Each thread owns a device buffer and a host model of its contents; every
 * gm_memcpy_d2h is checked against the model.  All threads copy from one
 * shared pageable source (overlapping reads), and successive copies of a
 * thread overlap on the device.  A thread switches between its two streams
 * and synchronizes the one it leaves, so its copies stay ordered.
 *
 * usage: test_copy_stress [threads] [scale] [iterations] [seed]
 *   scale multiplies the device buffer (scale x 3 MiB); deterministic per
 *   thread for a given seed.
 */
// ctest-args: 4 1 150 42
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpumem.h"
#include "../test.h"

#define MiB ((size_t)1 << 20)

static gm_pool_t *pool;
static int n_threads = 4, scale = 1, iterations = 150;
static unsigned long seed = 42;
static unsigned char *shared_src;
static size_t dev_size, src_size;

typedef struct {
    int id;
    unsigned long failures, mismatches, copies;
} result_t;

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* A length: mostly small, often above the direct-copy threshold. */
static size_t rnd_len(uint64_t *r, size_t max)
{
    size_t n;
    switch (rnd(r) % 4) {
    case 0: n = 1 + rnd(r) % 4096; break;
    case 1: n = 1 + rnd(r) % (256 << 10); break;
    default: n = (256 << 10) + rnd(r) % max; break;
    }
    return n > max ? max : n;
}

static void *worker(void *arg)
{
    result_t *res = arg;
    uint64_t r = seed * 1000003u + (uint64_t)res->id * 7919u + 1;
    gm_stream_t st[2];
    unsigned char *model = calloc(1, dev_size), *out = malloc(dev_size + 64);
    void *dev = NULL;
    if (!model || !out || gm_stream_create(pool, &st[0]) != GM_OK ||
        gm_stream_create(pool, &st[1]) != GM_OK || gm_alloc(pool, dev_size, st[0], &dev) != GM_OK) {
        fprintf(stderr, "thread %d: setup failed: %s\n", res->id, gm_last_error());
        res->failures++;
        free(model);
        free(out);
        return NULL;
    }
    int cur = 0;
    if (gm_memset(pool, dev, 0, dev_size, st[cur]) != GM_OK) res->failures++;
    void *pinned[4] = {0};
    size_t pinned_n[4] = {0};
    int pinned_s[4] = {0};
    for (int it = 0; it < iterations; it++) {
        unsigned action = (unsigned)(rnd(&r) % 10);
        if (action == 0) { /* switch streams: finish the old one first */
            if (gm_stream_synchronize(pool, st[cur]) != GM_OK) res->failures++;
            cur ^= 1;
        } else if (action <= 4) { /* h2d from the shared source */
            size_t n = rnd_len(&r, dev_size - 1);
            size_t doff = rnd(&r) % (dev_size - n + 1), soff = rnd(&r) % (src_size - n + 1);
            if (gm_memcpy_h2d(pool, (char *)dev + doff, shared_src + soff, n, st[cur]) != GM_OK) {
                fprintf(stderr, "thread %d: h2d: %s\n", res->id, gm_last_error());
                res->failures++;
            } else {
                memcpy(model + doff, shared_src + soff, n);
                res->copies++;
            }
        } else if (action <= 7) { /* d2h, checked */
            size_t n = rnd_len(&r, dev_size - 1);
            size_t doff = rnd(&r) % (dev_size - n + 1), ooff = rnd(&r) % 64;
            if (gm_memcpy_d2h(pool, out + ooff, (char *)dev + doff, n, st[cur]) != GM_OK) {
                fprintf(stderr, "thread %d: d2h: %s\n", res->id, gm_last_error());
                res->failures++;
            } else {
                res->copies++;
                if (memcmp(out + ooff, model + doff, n) != 0) res->mismatches++;
            }
        } else { /* a pinned block: free the slot's old one (checked), take a new one */
            int k = (int)(rnd(&r) % 4);
            if (pinned[k]) {
                unsigned char *p = pinned[k];
                if (p[0] != (unsigned char)k || p[pinned_n[k] - 1] != (unsigned char)(k + 1))
                    res->mismatches++;
                if (gm_host_free(pool, p, st[pinned_s[k]]) != GM_OK) res->failures++;
                pinned[k] = NULL;
            }
            size_t n = 1 + rnd(&r) % (2 * MiB);
            pinned_s[k] = (int)(rnd(&r) % 2);
            if (gm_host_alloc(pool, n, st[pinned_s[k]], &pinned[k]) != GM_OK) {
                res->failures++;
                pinned[k] = NULL;
            } else {
                unsigned char *p = pinned[k];
                p[0] = (unsigned char)k;
                p[n - 1] = (unsigned char)(k + 1);
                pinned_n[k] = n;
            }
            if (res->id == 0 && rnd(&r) % 4 == 0 && gm_host_trim(pool, 0, NULL) != GM_OK)
                res->failures++;
        }
    }
    for (int k = 0; k < 4; k++)
        if (pinned[k] && gm_host_free(pool, pinned[k], st[pinned_s[k]]) != GM_OK) res->failures++;
    /* The whole buffer, once more. */
    if (gm_memcpy_d2h(pool, out, dev, dev_size, st[cur]) != GM_OK) res->failures++;
    else if (memcmp(out, model, dev_size) != 0) res->mismatches++;
    if (gm_stream_synchronize(pool, st[0]) != GM_OK || gm_stream_synchronize(pool, st[1]) != GM_OK)
        res->failures++;
    if (gm_free(pool, dev, st[cur]) != GM_OK) res->failures++;
    if (gm_stream_destroy(pool, st[0]) != GM_OK || gm_stream_destroy(pool, st[1]) != GM_OK)
        res->failures++;
    free(model);
    free(out);
    return NULL;
}

int main(int argc, char **argv)
{
    int rc = stress_args(argc, argv, &n_threads, &scale, &iterations, &seed, 0);
    if (rc) return rc;
    dev_size = (size_t)scale * 3 * MiB;
    src_size = dev_size + 12345;
    gm_pool_config_t cfg;
    REQUIRE(gm_config_from_env(&cfg) == GM_OK);
    cfg.copy_threads = 3;
    cfg.copy_chunk = 64 << 10; /* many pieces per copy */
    REQUIRE(gm_pool_create(&cfg, &pool) == GM_OK);
    shared_src = malloc(src_size);
    REQUIRE(shared_src != NULL);
    uint64_t r = seed | 1;
    for (size_t i = 0; i < src_size; i++) shared_src[i] = (unsigned char)rnd(&r);

    pthread_t th[256];
    result_t res[256];
    for (int i = 0; i < n_threads; i++) {
        res[i] = (result_t){.id = i};
        REQUIRE(pthread_create(&th[i], NULL, worker, &res[i]) == 0);
    }
    unsigned long failures = 0, mismatches = 0, copies = 0;
    for (int i = 0; i < n_threads; i++) {
        pthread_join(th[i], NULL);
        failures += res[i].failures;
        mismatches += res[i].mismatches;
        copies += res[i].copies;
    }
    CHECK(failures == 0);
    CHECK(mismatches == 0);
    CHECK(copies > 0);
    gm_stats_t st = GM_STATS_INIT;
    CHECK_OK(gm_pool_stats(pool, &st));
    CHECK(st.host_allocated == 3 * 2 * (64 << 10)); /* the staging buffers only */
    CHECK(st.copy_staged_bytes > 0 && st.copy_direct_bytes > 0);
    printf("%d threads, %lu copies (%llu staged bytes, %llu direct), %lu failures, %lu mismatches\n",
           n_threads, copies, (unsigned long long)st.copy_staged_bytes,
           (unsigned long long)st.copy_direct_bytes, failures, mismatches);
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
    free(shared_src);
    return test_summary();
}
