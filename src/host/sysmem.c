/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sysmem.c — the sysmem fallback: when a pool made with
 * GM_POOL_SYSMEM_FALLBACK runs out of device memory, gm_alloc serves the
 * request from the pinned host pool (host.c), whose chunks are registered
 * device-mapped, and hands out the device address of that host memory.
 *
 * The idea: it is an explicit policy, never a silent one.  Such blocks live
 * in their own list (not the device allocator's), are counted apart in the
 * stats (sysmem_allocated, sysmem_allocated_peak, sysmem_count; they are not
 * in `allocated`), and the first one of a pool says so on stderr.  gm_free,
 * gm_block_size, gm_record_stream and the leak report reach them through the
 * root's address map and this file's row, gm__kind_sysmem (core/kinds.h),
 * like every other kind of memory; their host blocks are tagged
 * GM__HOST_SYSMEM, so gm_host_free refuses them.  Leak reports list them.
 *
 * Locking: every function here runs with the pool lock held (it is called
 * from gm_alloc / gm_free / ...); it takes the host lock inside host.c.
 */
#include <stdio.h>
#include <stdlib.h>

#include "core/kinds.h"
#include "host/host.h"

typedef struct sysblk {
    gm__kind_rec_t kind;         /* &gm__kind_sysmem: the address map's value */
    uintptr_t dptr;              /* what the caller got */
    void *hptr;                  /* the pinned host block behind it */
    size_t size;
    gm__recset_t recorded;       /* gm_record_stream */
    struct sysblk *prev, *next;
} sysblk_t;

/* Accounting: pool->st.sysmem_allocated == sum of size over the list; each
 * block's dptr is in the address map (and its hptr, as the library's own
 * memory, when the two differ). */
struct gm__sysmem {
    sysblk_t *head;
    bool warned;
};

/* The host side of a block whose device address differs from its host
 * address: pinned memory the library uses itself. */
static gm__kind_rec_t host_side = {&gm__kind_internal};

static void unlink_blk(gm_pool_t *pool, sysblk_t *b)
{
    if (b->prev) b->prev->next = b->next;
    else pool->sysmem->head = b->next;
    if (b->next) b->next->prev = b->prev;
}

int gm__sysmem_alloc_locked(gm_pool_t *pool, size_t size, gm__stream_t *s, void **ptr, int rc)
{
    char why[256];
    snprintf(why, sizeof why, "%s", gm_last_error());
    if (!pool->sysmem && !(pool->sysmem = gm__calloc(1, sizeof *pool->sysmem)))
        return gm__set_error(rc, "%s (sysmem fallback: out of host memory)", why);
    sysblk_t *b = gm__calloc(1, sizeof *b);
    if (!b) return gm__set_error(rc, "%s (sysmem fallback: out of host memory)", why);
    b->kind.ops = &gm__kind_sysmem;
    int hrc = gm__host_alloc_kind(pool, GM__HOST_SYSMEM, size, s->handle, &b->hptr, &b->dptr);
    if (hrc == GM_OK) {
        hrc = gm__kinds_add(pool, b->dptr, &b->kind, "gm_alloc");
        if (hrc == GM_OK && (uintptr_t)b->hptr != b->dptr &&
            (hrc = gm__kinds_add(pool, (uintptr_t)b->hptr, &host_side, "gm_alloc")) != GM_OK)
            gm__kinds_take(pool, b->dptr);
        if (hrc != GM_OK) {
            char hwhy[256];
            snprintf(hwhy, sizeof hwhy, "%s", gm_last_error());
            if (gm__host_free_kind(pool, GM__HOST_SYSMEM, b->hptr, s->handle) != GM_OK)
                gm__clear_error();
            gm__set_error(hrc, "%s", hwhy);
        }
    }
    if (hrc != GM_OK) {
        char hwhy[256];
        snprintf(hwhy, sizeof hwhy, "%s", gm_last_error());
        gm__free(b);
        return gm__set_error(rc, "%s; the sysmem fallback failed too: %s", why, hwhy);
    }
    b->size = size;
    b->next = pool->sysmem->head;
    if (b->next) b->next->prev = b;
    pool->sysmem->head = b;
    pool->st.sysmem_allocated += size;
    if (pool->st.sysmem_allocated > pool->st.sysmem_allocated_peak)
        pool->st.sysmem_allocated_peak = pool->st.sysmem_allocated;
    pool->st.sysmem_count++;
    if (!pool->sysmem->warned) {
        pool->sysmem->warned = true;
        fprintf(stderr, "gpumem: device memory exhausted (%s); serving allocations from pinned "
                "host memory (sysmem fallback): slower, counted in stats sysmem_*\n", why);
    }
    *ptr = (void *)b->dptr;
    gm__clear_error();
    return GM_OK;
}

/* gm_free: the host pool knows one stream per free, so the streams it was
 * recorded on are waited for here (the fallback is the slow path anyway). */
static int sysmem_free(gm_pool_t *pool, gm__kind_rec_t *rec, void *ptr, gm_stream_t stream,
                       size_t *size)
{
    (void)ptr;
    sysblk_t *b = (sysblk_t *)rec;
    GM_CHECK(gm__recset_wait(pool, &b->recorded, stream));
    GM_CHECK(gm__host_free_kind(pool, GM__HOST_SYSMEM, b->hptr, stream));
    gm__kinds_take(pool, b->dptr);
    if ((uintptr_t)b->hptr != b->dptr) gm__kinds_take(pool, (uintptr_t)b->hptr);
    unlink_blk(pool, b);
    pool->st.sysmem_allocated -= b->size;
    *size = b->size;
    gm__recset_clear(&b->recorded);
    gm__free(b);
    gm__clear_error();
    return GM_OK;
}

static int sysmem_record(gm_pool_t *pool, gm__kind_rec_t *rec, void *ptr, gm_stream_t stream)
{
    (void)pool, (void)ptr;
    return gm__recset_add(&((sysblk_t *)rec)->recorded, stream, "gm_record_stream");
}

static int sysmem_size(gm_pool_t *pool, const gm__kind_rec_t *rec, const void *ptr, size_t *size)
{
    (void)pool, (void)ptr;
    *size = ((const sysblk_t *)rec)->size;
    return GM_OK;
}

void gm__sysmem_count_locked(gm_pool_t *pool, size_t *count, size_t *bytes)
{
    *count = *bytes = 0;
    if (!pool->sysmem) return;
    for (sysblk_t *b = pool->sysmem->head; b; b = b->next) {
        (*count)++;
        *bytes += b->size;
    }
}

static void sysmem_foreach(gm_pool_t *pool, gm__kind_each_fn fn, void *arg)
{
    if (!pool->sysmem) return;
    for (sysblk_t *b = pool->sysmem->head; b; b = b->next) fn(b->dptr, b->size, arg);
}

static int sysmem_check(gm_pool_t *pool)
{
    size_t n, bytes;
    gm__sysmem_count_locked(pool, &n, &bytes);
    if (bytes != pool->st.sysmem_allocated)
        return gm__set_error(GM_INTERNAL, "sysmem: %zu blocks hold %zu bytes, the stats say %llu",
                             n, bytes, (unsigned long long)pool->st.sysmem_allocated);
    for (sysblk_t *b = pool->sysmem ? pool->sysmem->head : NULL; b; b = b->next)
        if (gm__kinds_find(pool, b->dptr) != &b->kind)
            return gm__set_error(GM_INTERNAL, "sysmem: block %#lx is not in the address map",
                                 (unsigned long)b->dptr);
    return GM_OK;
}

/* gm_record_stream: the free waits on the host for each recorded stream
 * but its own. */
const gm__kind_ops_t gm__kind_sysmem = {
    .name = "a gm_alloc block served by the sysmem fallback",
    .free = sysmem_free,
    .size = sysmem_size,
    .record = sysmem_record,
    .foreach = sysmem_foreach,
    .check = sysmem_check,
};

/* The host pool releases the memory itself; only the table goes here. */
void gm__sysmem_fini(gm_pool_t *pool)
{
    if (!pool->sysmem) return;
    for (sysblk_t *b = pool->sysmem->head, *n; b; b = n) {
        n = b->next;
        gm__recset_clear(&b->recorded);
        gm__free(b);
    }
    gm__free(pool->sysmem);
    pool->sysmem = NULL;
}
