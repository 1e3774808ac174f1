/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test.h — the tiny test helper every test program uses: CHECK macros that
 * count, and a closing summary line "N passed, N failed" that CI reads.
 * A test program returns test_summary() from main: 0 when nothing failed.
 */
#ifndef GM_TEST_H
#define GM_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned long test_passed_, test_failed_;

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (cond) {                                                            \
            test_passed_++;                                                    \
        } else {                                                               \
            test_failed_++;                                                    \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__,   \
                    #cond);                                                    \
        }                                                                      \
    } while (0)

/* CHECK that a gm status equals the expected one; print the message if not. */
#define CHECK_RC(expr, want)                                                   \
    do {                                                                       \
        int test_rc_ = (expr);                                                 \
        if (test_rc_ == (want)) {                                              \
            test_passed_++;                                                    \
        } else {                                                               \
            test_failed_++;                                                    \
            fprintf(stderr, "%s:%d: %s returned %d, want %d (%s)\n", __FILE__, \
                    __LINE__, #expr, test_rc_, (int)(want), gm_last_error());  \
        }                                                                      \
    } while (0)

#define CHECK_OK(expr) CHECK_RC(expr, GM_OK)

/* Stop this test program now (a precondition for the rest failed). */
#define REQUIRE(cond)                                                          \
    do {                                                                       \
        if (!(cond)) {                                                         \
            test_failed_++;                                                    \
            fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__,           \
                    __LINE__, #cond);                                          \
            return test_summary();                                             \
        }                                                                      \
        test_passed_++;                                                        \
    } while (0)

static inline int test_summary(void)
{
    printf("%lu passed, %lu failed\n", test_passed_, test_failed_);
    fflush(stdout);
    return test_failed_ ? 1 : 0;
}


/* Helpers for tests of the public API (include gpumem.h before this file). */
#ifdef GPUMEM_H
/* A pool made from cfg; NULL, with the reason on stderr, when it cannot be. */
static inline gm_pool_t *pool_from(const gm_pool_config_t *cfg)
{
    gm_pool_t *pool = NULL;
    if (gm_pool_create(cfg, &pool) != GM_OK) {
        fprintf(stderr, "pool: %s\n", gm_last_error());
        return NULL;
    }
    return pool;
}

/* A pool on the sim backend of `capacity` bytes with `flags` (GM_POOL_*);
 * NULL, with the reason on stderr, when it cannot be made. */
static inline gm_pool_t *sim_pool(size_t capacity, unsigned flags)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = GM_BACKEND_SIM;
    cfg.sim_capacity = capacity;
    cfg.flags = flags;
    return pool_from(&cfg);
}

/* The pool's stats (all zero when they cannot be read). */
static inline gm_stats_t pool_stats_of(gm_pool_t *pool)
{
    gm_stats_t st = GM_STATS_INIT;
    if (gm_pool_stats(pool, &st) != GM_OK) memset(&st, 0, sizeof st);
    return st;
}
#endif

#endif /* GM_TEST_H */
