/* SPDX-License-Identifier: Apache-2.0 */
/*
 * managed.c — managed (unified) memory: gm_alloc_managed and
 * gm_managed_prefetch, and the managed row of the memory kinds.
 *
 * The idea: managed memory is the driver's (cuMemAllocManaged), migrated
 * page by page on the driver's terms, so it never enters the page layer;
 * the pool only keeps a table of what it handed out, so frees are checked
 * (a wrong pointer is refused, never passed to the driver), and counts it
 * apart in the stats: managed_allocated, managed_allocated_peak,
 * managed_count.  It lives in the root (heaps send their calls there);
 * gm_free, gm_block_size, gm_record_stream and the leak report reach it
 * through the root's address map and this file's row, gm__kind_managed
 * (core/kinds.h).
 *
 * Locking: every function runs with the root's lock held.
 */
#include <stdio.h>
#include <string.h>

#include "core/kinds.h"
#include "host/host.h"

typedef struct mblk {
    gm__kind_rec_t kind;         /* &gm__kind_managed: the address map's value */
    size_t size;                 /* the caller's */
    gm__recset_t recorded;       /* gm_record_stream */
} mblk_t;

struct gm__managed {
    gm__hash_t live;             /* address -> mblk_t */
};

static int table_ready(gm_pool_t *pool)
{
    if (pool->managed) return GM_OK;
    struct gm__managed *m = gm__calloc(1, sizeof *m);
    if (!m) return gm__set_error(GM_NO_HOST_MEMORY, "gm_alloc_managed: out of host memory");
    if (gm__hash_init(&m->live, 64) != GM_OK) {
        gm__free(m);
        return gm__set_error(GM_NO_HOST_MEMORY, "gm_alloc_managed: out of host memory");
    }
    pool->managed = m;
    return GM_OK;
}

int gm__managed_alloc_locked(gm_pool_t *pool, size_t size, unsigned flags, gm_stream_t stream,
                             void **ptr)
{
    if (!pool->ops->mem_alloc)
        return gm__set_error(GM_NOT_SUPPORTED, "gm_alloc_managed: the %s backend has no managed "
                             "memory", pool->ops->name);
    GM_CHECK(table_ready(pool));
    mblk_t *b = gm__calloc(1, sizeof *b);
    if (!b || gm__hash_reserve(&pool->managed->live) != GM_OK) {
        gm__free(b);
        return gm__set_error(GM_NO_HOST_MEMORY, "gm_alloc_managed: out of host memory");
    }
    b->kind.ops = &gm__kind_managed;
    uintptr_t p = 0;
    int rc;
    GM_BK(rc, pool, mem_alloc, (pool->bk, size, &p));
    if (rc != GM_OK) {
        gm__free(b);
        char why[256];
        snprintf(why, sizeof why, "%s", gm_last_error());
        return gm__set_error(rc, "gm_alloc_managed: cannot allocate %zu bytes: %s", size, why);
    }
    if (flags & GM_MANAGED_PREFER_DEVICE) {
        GM_BK(rc, pool, advise, (pool->bk, p, size, 1));
        if (rc == GM_OK) GM_BK(rc, pool, advise, (pool->bk, p, size, 2));
    }
    if (rc == GM_OK && (flags & GM_MANAGED_PREFETCH))
        GM_BK(rc, pool, prefetch, (pool->bk, p, size, 0, stream));
    if (rc == GM_OK) rc = gm__kinds_add(pool, p, &b->kind, "gm_alloc_managed");
    if (rc != GM_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", gm_last_error());
        int frc;
        GM_BK(frc, pool, mem_free, (pool->bk, p));
        (void)frc;
        gm__free(b);
        return gm__set_error(rc, "gm_alloc_managed: %s; nothing allocated", why);
    }
    b->size = size;
    (void)gm__hash_put(&pool->managed->live, p, b); /* room reserved above */
    pool->st.managed_allocated += size;
    if (pool->st.managed_allocated > pool->st.managed_allocated_peak)
        pool->st.managed_allocated_peak = pool->st.managed_allocated;
    pool->st.managed_count++;
    *ptr = (void *)p;
    return GM_OK;
}

/* gm_free: the recorded streams but the free's are waited for on the host,
 * then the driver frees it. */
static int managed_free(gm_pool_t *pool, gm__kind_rec_t *rec, void *ptr, gm_stream_t stream,
                        size_t *size)
{
    mblk_t *b = (mblk_t *)rec;
    GM_CHECK(gm__recset_wait(pool, &b->recorded, stream));
    int rc;
    GM_BK(rc, pool, mem_free, (pool->bk, (uintptr_t)ptr));
    if (rc != GM_OK) return rc; /* still ours: a later free may succeed */
    (void)gm__hash_take(&pool->managed->live, (uintptr_t)ptr);
    gm__kinds_take(pool, (uintptr_t)ptr);
    pool->st.managed_allocated -= b->size;
    *size = b->size;
    gm__recset_clear(&b->recorded);
    gm__free(b);
    gm__clear_error();
    return GM_OK;
}

static int managed_size(gm_pool_t *pool, const gm__kind_rec_t *rec, const void *ptr, size_t *size)
{
    (void)pool, (void)ptr;
    *size = ((const mblk_t *)rec)->size;
    return GM_OK;
}

static int managed_record(gm_pool_t *pool, gm__kind_rec_t *rec, void *ptr, gm_stream_t stream)
{
    (void)pool, (void)ptr;
    return gm__recset_add(&((mblk_t *)rec)->recorded, stream, "gm_record_stream");
}

int gm__managed_prefetch_locked(gm_pool_t *pool, void *ptr, size_t size, int to_host,
                                gm_stream_t stream)
{
    /* The range must lie inside one allocation: find the one that starts at
     * or below ptr (a walk: prefetches are rare and tables small). */
    uintptr_t p = (uintptr_t)ptr;
    bool inside = false;
    if (pool->managed) {
        gm__hash_t *h = &pool->managed->live;
        for (size_t i = 0; i < h->cap && !inside; i++) {
            if (!h->keys[i]) continue;
            const mblk_t *b = h->vals[i];
            inside = p >= h->keys[i] && p - h->keys[i] <= b->size && size <= b->size - (p - h->keys[i]);
        }
    }
    if (!inside)
        return gm__set_error(GM_INVALID_POINTER, "gm_managed_prefetch: [%p, +%zu) is not inside a "
                             "managed allocation of this pool", ptr, size);
    if (size == 0) return GM_OK;
    int rc;
    GM_BK(rc, pool, prefetch, (pool->bk, p, size, to_host, stream));
    return rc;
}

static void managed_foreach(gm_pool_t *pool, gm__kind_each_fn fn, void *arg)
{
    if (!pool->managed) return;
    gm__hash_t *h = &pool->managed->live;
    for (size_t i = 0; i < h->cap; i++)
        if (h->keys[i]) fn(h->keys[i], ((const mblk_t *)h->vals[i])->size, arg);
}

static int managed_check(gm_pool_t *pool)
{
    if (!pool->managed) return GM_OK;
    gm__hash_t *h = &pool->managed->live;
    uint64_t sum = 0;
    for (size_t i = 0; i < h->cap; i++) {
        if (!h->keys[i]) continue;
        sum += ((const mblk_t *)h->vals[i])->size;
        if (gm__kinds_find(pool, h->keys[i]) != h->vals[i])
            return gm__set_error(GM_INTERNAL, "managed: %#lx is not in the address map",
                                 (unsigned long)h->keys[i]);
    }
    if (sum != pool->st.managed_allocated)
        return gm__set_error(GM_INTERNAL, "managed: blocks hold %llu bytes, the stats say %llu",
                             (unsigned long long)sum,
                             (unsigned long long)pool->st.managed_allocated);
    return GM_OK;
}

/* gm_record_stream: the free waits on the host for each recorded stream
 * but its own (the driver's free does not know them). */
const gm__kind_ops_t gm__kind_managed = {
    .name = "managed memory of gm_alloc_managed",
    .free = managed_free,
    .size = managed_size,
    .record = managed_record,
    .foreach = managed_foreach,
    .check = managed_check,
};

/* At pool teardown (lock held, backend still open): what is left is freed. */
void gm__managed_fini(gm_pool_t *pool)
{
    if (!pool->managed) return;
    gm__hash_t *h = &pool->managed->live;
    for (size_t i = 0; i < h->cap; i++) {
        if (!h->keys[i]) continue;
        int rc;
        GM_BK(rc, pool, mem_free, (pool->bk, h->keys[i]));
        (void)rc;
        gm__kinds_take(pool, h->keys[i]);
        gm__recset_clear(&((mblk_t *)h->vals[i])->recorded);
        gm__free(h->vals[i]);
    }
    gm__hash_fini(h);
    gm__free(pool->managed);
    pool->managed = NULL;
}
