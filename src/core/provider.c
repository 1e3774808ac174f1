/* SPDX-License-Identifier: Apache-2.0 */
/*
 * provider.c — the local page provider: physical pages straight from the
 * pool's own backend.
 *
 * The one idea: the first provider changes nothing.  It makes one
 * phys_create per page obtained and one phys_release per page given back,
 * each through GM_BK, so the pool's backend call counts, its modeled time
 * and the fault injection that fails the n-th phys_create or phys_release
 * are the same as when pages.c called the backend itself.  It keeps no state
 * beyond the pool pointer, enforces nothing (the pool limit is pages.c's,
 * the device's capacity the backend's) and has nothing to describe.
 *
 * Called with the pool lock held, like every provider (provider.h).
 */
#include "core/provider.h"

#include "core/pool.h"

static int local_obtain(void *ctx, size_t page_size, size_t n, gm__phys_t *handles, size_t *got)
{
    gm_pool_t *pool = ctx;
    int rc = GM_OK;
    size_t k;
    for (k = 0; k < n; k++) {
        GM_BK(rc, pool, phys_create, (pool->bk, page_size, &handles[k]));
        if (rc != GM_OK) break;
    }
    *got = k;
    return rc;
}

static int local_give_back(void *ctx, const gm__phys_t *handles, size_t n, size_t *done)
{
    gm_pool_t *pool = ctx;
    int rc = GM_OK;
    size_t k;
    for (k = 0; k < n; k++) {
        GM_BK(rc, pool, phys_release, (pool->bk, handles[k]));
        if (rc != GM_OK) break;
    }
    *done = k;
    return rc;
}

static const gm__page_provider_ops_t local_ops = {
    .name = "local",
    .flags = GM__PROVIDER_EXTENTS,
    .obtain = local_obtain,
    .give_back = local_give_back,
    .describe = NULL,
};

void gm__provider_local_init(gm__page_provider_t *p, gm_pool_t *pool)
{
    p->ops = &local_ops;
    p->ctx = pool;
}
