/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test.h — the tiny test helper every test program uses: CHECK macros that
 * count, a closing summary line "N passed, N failed" that CI reads, and a
 * seeded random generator.
 * A test program returns test_summary() from main: 0 when nothing failed.
 */
#ifndef GM_TEST_H
#define GM_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned long test_passed_, test_failed_;

/* The tests' seeded generator (splitmix64): the same numbers on every
 * platform, so a seed names one sequence of operations. */
static inline uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* 1 in an ASan or TSan build: tests scale their work and their time bounds
 * by it (such builds run several times slower, and their processes start
 * and die slower). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define UNDER_SANITIZER 1
#endif
#endif
#ifndef UNDER_SANITIZER
#define UNDER_SANITIZER 0
#endif

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


/* The stress tests' command line: [threads] [scale] [iterations] [seed], each
 * optional (more are ignored), the defaults being what the caller put in the
 * variables: threads 1-256, scale >= 1, iterations >= min_iterations, seed any
 * number (0x.. too).  Both stress tests read their arguments this way.
 * Returns 0, or 2 after printing the usage on stderr: main returns it. */
static inline int stress_args(int argc, char **argv, int *threads, int *scale, int *iterations,
                              unsigned long *seed, int min_iterations)
{
    int *ints[3] = {threads, scale, iterations};
    int bad = 0;
    for (int i = 1; i < argc && i <= 4; i++) {
        char *end;
        if (i < 4) {
            long v = strtol(argv[i], &end, 10);
            if (v < 0 || v > 1000000000L) bad = 1;
            else *ints[i - 1] = (int)v;
        } else {
            *seed = strtoul(argv[i], &end, 0);
        }
        if (end == argv[i] || *end) bad = 1;
    }
    if (bad || *threads < 1 || *threads > 256 || *scale < 1 ||
        *iterations < min_iterations) {
        fprintf(stderr, "usage: %s [threads 1-256] [scale >=1] [iterations >=%d] [seed]\n",
                argc ? argv[0] : "stress", min_iterations);
        return 2;
    }
    return 0;
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

/* The backend the tests run on: GPUMEM_TEST_BACKEND=cuda, else the sim. */
static inline gm_backend_kind_t test_backend(void)
{
    const char *b = getenv("GPUMEM_TEST_BACKEND");
    return b && !strcmp(b, "cuda") ? GM_BACKEND_CUDA : GM_BACKEND_SIM;
}

/* A pool on the test backend of `capacity` bytes: the sim's device size; on a
 * GPU the device is the device, so a limit stands in for it.  limit: the
 * pool limit (0: none on the sim, `capacity` on a GPU).  NULL, with the
 * reason on stderr, when it cannot be made. */
static inline gm_pool_t *test_pool(size_t capacity, size_t limit)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = test_backend();
    cfg.sim_capacity = capacity;
    cfg.limit = limit ? limit : (cfg.backend == GM_BACKEND_SIM ? 0 : capacity);
    return pool_from(&cfg);
}

/* The pool's stats; a failure to read them is a failed CHECK (and all zero). */
static inline gm_stats_t pool_stats_of(gm_pool_t *pool)
{
    gm_stats_t st = GM_STATS_INIT;
    int rc = gm_pool_stats(pool, &st);
    CHECK_OK(rc);
    if (rc != GM_OK) memset(&st, 0, sizeof st);
    return st;
}
#endif

#endif /* GM_TEST_H */
