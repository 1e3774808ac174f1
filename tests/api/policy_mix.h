/* SPDX-License-Identifier: Apache-2.0 */
/*
 * policy_mix.h — the random mix the page-policy tests run (test_placement,
 * test_controller): SLOTS slots, each operation frees the slot's block or
 * allocates one of a size over 256 B .. 64 MiB, each power of two as likely
 * (uniform within it), so most large ones span several 2 MiB pages.  OPS
 * operations a pass: about 50 000 allocations.  Include after ../test.h.
 */
#ifndef GM_TEST_POLICY_MIX_H
#define GM_TEST_POLICY_MIX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpumem.h"

#define SLOTS 512
#ifndef OPS
#define OPS 100000 /* a test may define a shorter mix first */
#endif

typedef struct mix {
    uint32_t slot[OPS];
    size_t size[OPS];
} mix_t;

static inline void mix_make(mix_t *m, uint64_t seed)
{
    for (size_t i = 0; i < OPS; i++) {
        m->slot[i] = (uint32_t)(rng_next(&seed) % SLOTS);
        size_t lo = (size_t)256 << (rng_next(&seed) % 18);
        m->size[i] = lo + (size_t)(rng_next(&seed) % lo);
    }
}

/* One pass of mix m on stream s of pool; with check, gm_pool_check before
 * the blocks still live are freed; everything freed at the end.  Returns
 * the pass's requested peak (0 after a failure, which is CHECKed). */
static inline uint64_t mix_run(gm_pool_t *pool, gm_stream_t s, const mix_t *m, bool check)
{
    void *ptr[SLOTS] = {0};
    size_t sz[SLOTS] = {0};
    uint64_t live = 0, peak = 0;
    for (size_t i = 0; i < OPS; i++) {
        uint32_t k = m->slot[i];
        if (ptr[k]) {
            CHECK_OK(gm_free(pool, ptr[k], s));
            ptr[k] = NULL;
            live -= sz[k];
        } else {
            int rc = gm_alloc(pool, m->size[i], s, &ptr[k]);
            CHECK_OK(rc);
            if (rc != GM_OK) {
                ptr[k] = NULL;
                peak = 0;
                break;
            }
            sz[k] = m->size[i];
            live += sz[k];
            if (live > peak) peak = live;
        }
    }
    if (check) CHECK_OK(gm_pool_check(pool));
    for (int k = 0; k < SLOTS; k++)
        if (ptr[k]) CHECK_OK(gm_free(pool, ptr[k], s));
    return peak;
}

/* Backend calls of every kind so far. */
static inline uint64_t calls_of(const gm_stats_t *st)
{
    uint64_t n = 0;
    for (int k = 0; k < GM_CALL_COUNT; k++) n += st->backend_calls[k];
    return n;
}

/* A pool made from cfg runs mix m `passes` times on one stream, with
 * gm_pool_check after each pass (and, with check, before each pass's last
 * frees; with need_peak, each pass must have run whole).  *last_calls: the
 * backend calls of the last pass; *end: the pool's statistics after it.
 * False when the pool could not be made (CHECKed). */
static inline bool mix_passes(const gm_pool_config_t *cfg, const mix_t *m, int passes, bool check,
                              bool need_peak, uint64_t *last_calls, gm_stats_t *end)
{
    gm_pool_t *pool = NULL;
    CHECK_OK(gm_pool_create(cfg, &pool));
    if (!pool) return false;
    gm_stream_t s;
    CHECK_OK(gm_stream_create(pool, &s));
    for (int pass = 0; pass < passes; pass++) {
        gm_stats_t a = pool_stats_of(pool);
        uint64_t peak = mix_run(pool, s, m, check);
        if (need_peak) CHECK(peak > 0);
        CHECK_OK(gm_pool_check(pool));
        *end = pool_stats_of(pool);
        *last_calls = calls_of(end) - calls_of(&a);
    }
    CHECK_OK(gm_stream_destroy(pool, s));
    gm_pool_destroy(pool);
    return true;
}

#endif /* GM_TEST_POLICY_MIX_H */
