/* SPDX-License-Identifier: Apache-2.0 */
/*
 * core_oom_reentry.c — attacks the out-of-memory handlers: a handler that
 * tries a smaller gm_alloc on its own pool re-entered the handler chain
 * without bound (stack overflow).  Inside a handler, allocations on that pool
 * must not call the handlers again; they succeed or fail normally.
 */
#include <stdint.h>

#include "gpumem.h"
#include "../test.h"

#define MiB ((size_t)1 << 20)

static int depth, max_depth, calls, inner_rc = -1, inner_ok_rc = -1;

static int handler(gm_pool_t *pool, size_t size, gm_stream_t stream, void *user)
{
    (void)user;
    calls++;
    if (++depth > max_depth) max_depth = depth;
    if (depth < 50) { /* a bound of our own, so the bug fails cleanly */
        void *p = NULL;
        inner_rc = gm_alloc(pool, size / 2, stream, &p); /* still too big: fails */
        void *q = NULL;
        inner_ok_rc = gm_alloc(pool, MiB, stream, &q);   /* fits: served */
        if (q) gm_free(pool, q, stream);
    }
    depth--;
    return 0;
}

int main(void)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = GM_BACKEND_SIM;
    cfg.sim_capacity = 64 * MiB;
    gm_pool_t *pool = pool_from(&cfg);
    REQUIRE(pool != NULL);
    void *big;
    CHECK_OK(gm_alloc(pool, 40 * MiB, NULL, &big));
    CHECK_OK(gm_set_oom_handler(pool, handler, NULL));
    void *p = NULL;
    int rc = gm_alloc(pool, 60 * MiB, NULL, &p);
    CHECK(rc == GM_OUT_OF_MEMORY || rc == GM_LIMIT);
    CHECK(max_depth == 1);
    CHECK(calls == 1);
    CHECK(inner_rc == GM_OUT_OF_MEMORY || inner_rc == GM_LIMIT);
    CHECK_RC(inner_ok_rc, GM_OK);
    /* Outside the handler the chain runs again. */
    calls = 0;
    rc = gm_alloc(pool, 60 * MiB, NULL, &p);
    CHECK(rc == GM_OUT_OF_MEMORY || rc == GM_LIMIT);
    CHECK(calls == 1);
    CHECK_OK(gm_free(pool, big, NULL));
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
    return test_summary();
}
