/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_provider.c — the page-provider seam (src/core/provider.h,
 * docs/pages.md).  A test provider wraps the local one in a pool on the sim:
 * every page the pool reserves is obtained through it and every page it lets
 * go is given back through it (the counts match the backend's phys_create /
 * phys_release calls and the reserved bytes); a provider that refuses past a
 * quota makes allocations fail cleanly with the pool consistent and under the
 * quota, and its describe line is what gm__pages_refuse_locked words the
 * refusal with; gm__pages_limit_allows is the pool limit's one rule.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "gpumem.h"
#include "core/pool.h"
#include "../test.h"

#define MiB ((size_t)1 << 20)

/* The local provider behind a count and an optional quota (0: none). */
typedef struct counting {
    gm__page_provider_t inner;
    size_t obtained, given_back, held, quota, refusals;
} counting_t;

static int c_obtain(void *ctx, size_t page_size, size_t n, gm__phys_t *handles, size_t *got)
{
    counting_t *c = ctx;
    if (c->quota && (c->held + n) * page_size > c->quota) {
        c->refusals++;
        *got = 0;
        return gm__set_error(GM_LIMIT, "test provider: over quota");
    }
    int rc = c->inner.ops->obtain(c->inner.ctx, page_size, n, handles, got);
    c->obtained += *got;
    c->held += *got;
    return rc;
}

static int c_give_back(void *ctx, const gm__phys_t *handles, size_t n, size_t *done)
{
    counting_t *c = ctx;
    int rc = c->inner.ops->give_back(c->inner.ctx, handles, n, done);
    c->given_back += *done;
    c->held -= *done;
    return rc;
}

static void c_describe(void *ctx, char *buf, size_t cap)
{
    counting_t *c = ctx;
    if (c->refusals) snprintf(buf, cap, "tenant 'test' over quota (%zu refusals)", c->refusals);
    else if (cap) buf[0] = '\0';
}

static const gm__page_provider_ops_t counting_ops = {
    .name = "counting",
    .obtain = c_obtain,
    .give_back = c_give_back,
    .describe = c_describe,
};

static void install(gm_pool_t *pool, counting_t *c)
{
    gm__lock(&pool->lock);
    c->inner = pool->provider;
    pool->provider.ops = &counting_ops;
    pool->provider.ctx = c;
    gm__unlock(&pool->lock);
}

static void uninstall(gm_pool_t *pool, counting_t *c)
{
    gm__lock(&pool->lock);
    pool->provider = c->inner;
    gm__unlock(&pool->lock);
}

int main(void)
{
    /* Every page through the provider, one backend call per page. */
    gm_pool_t *pool = sim_pool(512 * MiB, 0);
    REQUIRE(pool != NULL);
    counting_t c = {0};
    install(pool, &c);
    gm_stats_t st0 = pool_stats_of(pool);
    void *p[16];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 16; i++) CHECK_OK(gm_alloc(pool, (size_t)(i + 1) * MiB, 0, &p[i]));
        for (int i = 0; i < 16; i += 2) CHECK_OK(gm_free(pool, p[i], 0));
        size_t released = 0;
        CHECK_OK(gm_trim(pool, 0, &released));
        for (int i = 1; i < 16; i += 2) CHECK_OK(gm_free(pool, p[i], 0));
    }
    gm_stats_t st = pool_stats_of(pool);
    CHECK(c.obtained > 0 && c.given_back > 0);
    CHECK(c.obtained == st.backend_calls[GM_CALL_phys_create] - st0.backend_calls[GM_CALL_phys_create]);
    CHECK(c.given_back ==
          st.backend_calls[GM_CALL_phys_release] - st0.backend_calls[GM_CALL_phys_release]);
    CHECK(c.held * (2 * MiB) == st.reserved);
    CHECK_OK(gm_pool_check(pool));
    uninstall(pool, &c);
    gm_pool_destroy(pool);

    /* A quota: allocations past it fail cleanly; the pool stays under it and whole. */
    pool = sim_pool(512 * MiB, 0);
    REQUIRE(pool != NULL);
    counting_t q = {.quota = 64 * MiB};
    install(pool, &q);
    void *a = NULL, *b = NULL;
    CHECK_OK(gm_alloc(pool, 48 * MiB, 0, &a));
    int rc = gm_alloc(pool, 32 * MiB, 0, &b);
    CHECK(rc == GM_LIMIT || rc == GM_OUT_OF_MEMORY);
    CHECK(b == NULL);
    CHECK(q.refusals > 0);
    /* ... and the caller of gm_alloc reads the provider's word. */
    CHECK(strstr(gm_last_error(), "tenant 'test' over quota") != NULL);
    CHECK(pool_stats_of(pool).reserved <= q.quota);
    CHECK_OK(gm_pool_check(pool));
    CHECK_OK(gm_alloc(pool, 8 * MiB, 0, &b)); /* within the quota: served */

    /* The refusal's message carries the provider's word and the pool's figures. */
    gm__lock(&pool->lock);
    rc = gm__pages_refuse_locked(pool, GM_LIMIT, 32 * MiB);
    gm__unlock(&pool->lock);
    CHECK(rc == GM_LIMIT);
    CHECK(strstr(gm_last_error(), "cannot allocate 33554432 bytes") != NULL);
    CHECK(strstr(gm_last_error(), "tenant 'test' over quota") != NULL);
    CHECK(strstr(gm_last_error(), "reserved ") != NULL);
    CHECK_OK(gm_free(pool, a, 0));
    CHECK_OK(gm_free(pool, b, 0));
    uninstall(pool, &q);
    CHECK(q.given_back == 0 || q.given_back <= q.obtained);

    /* Without a describe line: the pool limit or the device. */
    gm__lock(&pool->lock);
    rc = gm__pages_refuse_locked(pool, GM_OUT_OF_MEMORY, 1);
    gm__unlock(&pool->lock);
    CHECK(rc == GM_OUT_OF_MEMORY);
    CHECK(strstr(gm_last_error(), "out of device memory") != NULL);
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);

    /* The limit rule, overflow included. */
    static gm_pool_t fake; /* large: not on the stack */
    fake.limit = 10 * MiB;
    CHECK(gm__pages_limit_allows(&fake, 8 * MiB, 2 * MiB));
    CHECK(!gm__pages_limit_allows(&fake, 8 * MiB + 1, 2 * MiB));
    CHECK(!gm__pages_limit_allows(&fake, 0, 10 * MiB + 1));
    CHECK(!gm__pages_limit_allows(&fake, 1, SIZE_MAX));
    CHECK(gm__pages_limit_allows(&fake, 0, 10 * MiB));

    return test_summary();
}
