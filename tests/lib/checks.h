/* SPDX-License-Identifier: Apache-2.0 */
/*
 * checks.h — small helpers that test programs of several folders share:
 * what counts as a clean error, a sim pool's configuration to adjust before
 * pool_from, the one way a test (or a part of one) that needs the sim says
 * it is skipped, and the stream rule's same-stream reuse, which device and
 * host blocks share.  Header only; include gpumem.h and test.h first.
 */
#ifndef GM_TEST_CHECKS_H
#define GM_TEST_CHECKS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpumem.h"

/* GM_OK, or an error a caller can handle (out of host or device memory, a
 * backend failure, the pool limit, or the test's own `also`), with a
 * message. */
static inline int rc_clean(int rc, int also)
{
    if (rc == GM_OK) return 1;
    if (rc != GM_NO_HOST_MEMORY && rc != GM_BACKEND && rc != GM_OUT_OF_MEMORY &&
        rc != GM_LIMIT && rc != also)
        return 0;
    const char *m = gm_last_error();
    return m != NULL && m[0] != '\0';
}

/* The configuration of a sim pool of `capacity` bytes, every other field
 * its default: the caller sets heaps, flags and the like, then pool_from. */
static inline gm_pool_config_t sim_config(size_t capacity)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = GM_BACKEND_SIM;
    cfg.sim_capacity = capacity;
    return cfg;
}

/* Did the run ask for the sim (GPUMEM_TEST_BACKEND unset or "sim")?  Not
 * test_backend(): "auto" may pick a GPU. */
static inline int sim_asked(void)
{
    const char *b = getenv("GPUMEM_TEST_BACKEND");
    return !b || strcmp(b, "sim") == 0;
}

/* `run`; when it is 0, prints `skip_line` first, so a skip is never silent. */
static inline int run_or_skip(int run, const char *skip_line)
{
    if (!run) printf("%s\n", skip_line);
    return run;
}

/* The main of a test program that needs the sim: runs tests[0..n) in turn
 * and returns test_summary(); on another backend says "NAME: needs the sim
 * backend; skipped" and returns 77 (ctest's SKIP_RETURN_CODE). */
static inline int sim_tests_main(const char *name, void (*const tests[])(void), size_t n)
{
    char line[160];
    snprintf(line, sizeof line, "%s: needs the sim backend; skipped", name);
    if (!run_or_skip(sim_asked(), line)) return 77;
    for (size_t i = 0; i < n; i++) tests[i]();
    return test_summary();
}

/* The stream rule's first half, for device and host blocks alike: a block
 * of n bytes allocated on S and freed there while S is held (its work not
 * done) comes back at once to the next request on S.  Returns that block,
 * free again and S still held: the caller goes on to the other streams. */
static inline void *reused_on_held_stream(gm_pool_t *pool,
                                          int (*alloc)(gm_pool_t *, size_t, gm_stream_t, void **),
                                          int (*release)(gm_pool_t *, void *, gm_stream_t),
                                          size_t n, gm_stream_t S)
{
    void *p = NULL, *q = NULL;
    CHECK_OK(alloc(pool, n, S, &p));
    CHECK_OK(gm_sim_hold_stream(pool, S, 1));
    CHECK_OK(release(pool, p, S));
    CHECK_OK(alloc(pool, n, S, &q));
    CHECK(q == p);
    CHECK_OK(release(pool, q, S));
    return p;
}

#endif /* GM_TEST_CHECKS_H */
