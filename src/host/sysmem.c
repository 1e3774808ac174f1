/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sysmem.c — the sysmem fallback: when a pool made with
 * GM_POOL_SYSMEM_FALLBACK runs out of device memory, gm_alloc serves the
 * request from the pinned host pool (host.c), whose chunks are registered
 * device-mapped, and hands out the device address of that host memory.
 *
 * The idea: it is an explicit policy, never a silent one.  Such blocks live
 * in their own table (not the device allocator's), are counted apart in the
 * stats (sysmem_allocated, sysmem_allocated_peak, sysmem_count; they are not
 * in `allocated`), and the first one of a pool says so on stderr.  gm_free,
 * gm_block_size and gm_record_stream find them here when the live table does
 * not know the pointer (pool.c's owner lookup); their host blocks are tagged
 * GM__HOST_SYSMEM, so gm_host_free refuses them.  Leak reports list them.
 *
 * Locking: every function here runs with the pool lock held (it is called
 * from gm_alloc / gm_free / ...); it takes the host lock inside host.c.
 */
#include <stdio.h>
#include <stdlib.h>

#include "host/host.h"

#define SYSMEM_MAX_RECORDED 8

typedef struct sysblk {
    uintptr_t dptr;              /* what the caller got */
    void *hptr;                  /* the pinned host block behind it */
    size_t size;
    gm_stream_t recorded[SYSMEM_MAX_RECORDED]; /* gm_record_stream */
    unsigned n_recorded;
    struct sysblk *next;
} sysblk_t;

/* Accounting: pool->st.sysmem_allocated == sum of size over the list. */
struct gm__sysmem {
    sysblk_t *head;
    bool warned;
};

static sysblk_t **find_locked(gm_pool_t *pool, const void *ptr)
{
    for (sysblk_t **p = &pool->sysmem->head; *p; p = &(*p)->next)
        if ((*p)->dptr == (uintptr_t)ptr) return p;
    return NULL;
}

int gm__sysmem_alloc_locked(gm_pool_t *pool, size_t size, gm__stream_t *s, void **ptr, int rc)
{
    char why[256];
    snprintf(why, sizeof why, "%s", gm_last_error());
    if (!pool->sysmem && !(pool->sysmem = gm__calloc(1, sizeof *pool->sysmem)))
        return gm__set_error(rc, "%s (sysmem fallback: out of host memory)", why);
    sysblk_t *b = gm__calloc(1, sizeof *b);
    if (!b) return gm__set_error(rc, "%s (sysmem fallback: out of host memory)", why);
    int hrc = gm__host_alloc_kind(pool, GM__HOST_SYSMEM, size, s->handle, &b->hptr, &b->dptr);
    if (hrc != GM_OK) {
        char hwhy[256];
        snprintf(hwhy, sizeof hwhy, "%s", gm_last_error());
        gm__free(b);
        return gm__set_error(rc, "%s; the sysmem fallback failed too: %s", why, hwhy);
    }
    b->size = size;
    b->next = pool->sysmem->head;
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

int gm__sysmem_free_locked(gm_pool_t *pool, void *ptr, gm__stream_t *s, int rc_in)
{
    sysblk_t **p = find_locked(pool, ptr);
    if (!p) return rc_in;
    sysblk_t *b = *p;
    /* Streams it was recorded on: the host pool knows one stream per free,
     * so wait for the others here (the fallback is the slow path anyway). */
    for (unsigned i = 0; i < b->n_recorded; i++) {
        if (b->recorded[i] == s->handle) continue;
        int rc;
        GM_BK(rc, pool, stream_sync, (pool->bk, b->recorded[i]));
        if (rc != GM_OK) return rc;
    }
    GM_CHECK(gm__host_free_kind(pool, GM__HOST_SYSMEM, b->hptr, s->handle));
    *p = b->next;
    pool->st.sysmem_allocated -= b->size;
    gm__free(b);
    gm__clear_error();
    return GM_OK;
}

int gm__sysmem_record_locked(gm_pool_t *pool, void *ptr, gm__stream_t *s, int rc_in)
{
    sysblk_t **p = find_locked(pool, ptr);
    if (!p) return rc_in;
    sysblk_t *b = *p;
    gm__clear_error();
    for (unsigned i = 0; i < b->n_recorded; i++)
        if (b->recorded[i] == s->handle) return GM_OK;
    if (b->n_recorded == SYSMEM_MAX_RECORDED)
        return gm__set_error(GM_NOT_SUPPORTED, "gm_record_stream: a sysmem block takes at most %d "
                             "streams", SYSMEM_MAX_RECORDED);
    b->recorded[b->n_recorded++] = s->handle;
    return GM_OK;
}

int gm__sysmem_size_locked(gm_pool_t *pool, const void *ptr, size_t *size)
{
    sysblk_t **p = find_locked(pool, ptr);
    if (!p) return GM_INVALID_POINTER;
    *size = (*p)->size;
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

void gm__sysmem_foreach_locked(gm_pool_t *pool, void (*fn)(uintptr_t dptr, size_t size, void *arg),
                               void *arg)
{
    if (!pool->sysmem) return;
    for (sysblk_t *b = pool->sysmem->head; b; b = b->next) fn(b->dptr, b->size, arg);
}

/* The host pool releases the memory itself; only the table goes here. */
void gm__sysmem_fini(gm_pool_t *pool)
{
    if (!pool->sysmem) return;
    for (sysblk_t *b = pool->sysmem->head, *n; b; b = n) {
        n = b->next;
        gm__free(b);
    }
    gm__free(pool->sysmem);
    pool->sysmem = NULL;
}
