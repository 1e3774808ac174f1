/* SPDX-License-Identifier: Apache-2.0 */
/*
 * segments.c — registrable memory: gm_alloc_registrable, the pool's
 * register hooks, and the cache of freed segments.
 *
 * The idea: a communication library registers memory by the physical
 * allocation behind it.  NCCL up to 2.28 registers a buffer only when one
 * physical allocation covers all of it (the page layer's blocks span one
 * handle per page), and registration is expensive enough that it is done
 * once per segment, never per tensor.  So registrable memory is a segment:
 * one address range of its own, one physical allocation made with the pool's
 * page properties (GM_POOL_NCCL: NCCL's handle types) and one set_access for
 * the device and its peers.  The pool's register hook is called once when a
 * segment is made and its deregister hook once before it is unmapped.  A
 * freed segment stays mapped and registered in a cache and serves a later
 * request that fits it (at most 1/8 larger); only gm_trim, a failed
 * creation that needs the room, and pool destruction give cached segments
 * back.  Segments never enter the page layer, so trim, page moves and
 * offload never remap memory a library registered (a segment carries no
 * tag).
 *
 * The stream rule: a freed segment records an event on the freeing stream
 * (and waits for streams gm_record_stream added); a reuse on another stream
 * waits for that event on the device (stream_wait_event), and giving the
 * segment back waits on the host.
 *
 * Limits: segments count against the pool limit with the pages
 * (root->fam_reserved), and in stats apart (registrable_*).  A pool that
 * leases pages from a broker refuses them (the broker leases pages, not
 * segments).  Everything lives in the root; callers hold the root's lock.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/kinds.h"

typedef struct seg {
    gm__kind_rec_t kind;         /* &gm__kind_segment: the address map's value */
    struct seg *next;            /* every segment of the pool */
    uintptr_t va;
    size_t size;                 /* mapped bytes (pages) */
    size_t requested;            /* the live request, 0 while cached */
    gm__phys_t h;
    bool live;
    bool unmapped;               /* unmapped, but its physical allocation is not
                                    released yet (a release failed): never handed
                                    out; the next trim retries */
    bool registered;             /* the hook's register succeeded */
    void *reg_handle;            /* what the register hook returned */
    gm_stream_t stream;          /* live: allocated on; cached: freed on */
    gm__event_t ev;              /* cached: recorded at the free on `stream` */
    bool ev_set;
    gm__recset_t recorded;       /* gm_record_stream's other streams */
} seg_t;

struct gm__segs {
    gm__hash_t by_va;            /* va -> seg_t, live and cached; each va is in the
                                    root's address map too */
    seg_t *all;
    gm_register_hooks_t hooks;   /* reg NULL: none installed */
};

static int table_ready(gm_pool_t *pool)
{
    if (pool->segs) return GM_OK;
    struct gm__segs *t = gm__calloc(1, sizeof *t);
    if (!t || gm__hash_init(&t->by_va, 64) != GM_OK) {
        gm__free(t);
        return gm__set_error(GM_NO_HOST_MEMORY, "gm_alloc_registrable: out of host memory");
    }
    pool->segs = t;
    return GM_OK;
}

/* ---- making and giving back ------------------------------------------------ */

static void hook_dereg(gm_pool_t *pool, seg_t *s)
{
    if (!s->registered) return;
    const gm_register_hooks_t *k = &pool->segs->hooks;
    if (k->deregister) k->deregister(k->user, (void *)s->va, s->size, s->reg_handle);
    s->registered = false;
    s->reg_handle = NULL;
}

static int hook_reg(gm_pool_t *pool, seg_t *s)
{
    const gm_register_hooks_t *k = &pool->segs->hooks;
    if (!k->reg) return GM_OK;
    void *handle = NULL;
    int rc = k->reg(k->user, (void *)s->va, s->size, &handle);
    if (rc != GM_OK)
        return gm__set_error(rc == GM_OK ? GM_BACKEND : rc, "the pool's register hook refused "
                             "segment [%#" PRIxPTR ", +%zu) with status %d", s->va, s->size, rc);
    s->registered = true;
    s->reg_handle = handle;
    return GM_OK;
}

/* Undo what seg_make did, last step first: mapped (unmap), made (release),
 * reserved (va_free).  Best effort: a failure leaves its message set. */
static void seg_unmake(gm_pool_t *pool, seg_t *s, bool mapped, bool made)
{
    int rc;
    if (mapped) {
        GM_BK(rc, pool, unmap, (pool->bk, s->va, s->size));
        if (rc != GM_OK) made = false; /* still mapped: releasing would keep it alive anyway */
    }
    if (made) GM_BK(rc, pool, phys_release, (pool->bk, s->h));
    if (mapped || made) GM_BK(rc, pool, va_free, (pool->bk, s->va, s->size));
    (void)rc;
}

/* Segments are sized and aligned to the driver's recommended granularity
 * (what ncclMemAlloc does, and what NVLS registration asks for). */
static size_t seg_align(const gm_pool_t *pool)
{
    size_t g = pool->info.granularity_recommended;
    return g > pool->page && g % pool->page == 0 && (g & (g - 1)) == 0 ? g : pool->page;
}

/* A new segment of `size` bytes (pages), mapped, accessible and registered. */
static int seg_make(gm_pool_t *pool, size_t size, seg_t **out)
{
    if (!gm__pages_limit_take(pool, size))
        return gm__set_error(GM_LIMIT, "gm_alloc_registrable: %zu bytes would pass the pool "
                             "limit of %zu bytes", size, pool->limit);
    seg_t *s = gm__calloc(1, sizeof *s);
    int rc;
    if (!s || gm__hash_reserve(&pool->segs->by_va) != GM_OK) {
        rc = gm__set_error(GM_NO_HOST_MEMORY, "gm_alloc_registrable: out of host memory");
        goto fail;
    }
    s->kind.ops = &gm__kind_segment;
    s->size = size;
    GM_BK(rc, pool, va_reserve, (pool->bk, size, seg_align(pool), &s->va));
    if (rc != GM_OK) goto fail;
    GM_BK(rc, pool, phys_create, (pool->bk, size, &s->h));
    if (rc != GM_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", gm_last_error());
        int r2;
        GM_BK(r2, pool, va_free, (pool->bk, s->va, s->size)); /* reserved only */
        (void)r2;
        gm__set_error(rc, "%s", why);
        goto fail;
    }
    GM_BK(rc, pool, map, (pool->bk, s->va, size, s->h));
    if (rc == GM_OK) {
        GM_BK(rc, pool, set_access, (pool->bk, s->va, size, 0));
        if (rc == GM_OK) rc = gm__kinds_add(pool, s->va, &s->kind, "gm_alloc_registrable");
        if (rc == GM_OK && (rc = hook_reg(pool, s)) != GM_OK) gm__kinds_take(pool, s->va);
        if (rc != GM_OK) {
            char why[256];
            snprintf(why, sizeof why, "%s", gm_last_error());
            seg_unmake(pool, s, true, true);
            gm__set_error(rc, "%s", why);
            goto fail;
        }
    } else {
        char why[256];
        snprintf(why, sizeof why, "%s", gm_last_error());
        seg_unmake(pool, s, false, true);
        gm__set_error(rc, "%s", why);
        goto fail;
    }
    (void)gm__hash_put(&pool->segs->by_va, s->va, s); /* room reserved above */
    s->next = pool->segs->all;
    pool->segs->all = s;
    pool->st.registrable_reserved += size;
    *out = s;
    return GM_OK;
fail:
    gm__free(s);
    gm__pages_limit_put(pool, size);
    return rc;
}

/* Give a cached segment back: the stream rule, deregister, unmap, release.
 * On a failure the segment stays cached (nothing is lost) and the error is
 * returned. */
static int seg_give_back(gm_pool_t *pool, seg_t *s)
{
    int rc;
    if (!s->unmapped) {
        if (s->ev_set) {
            GM_BK(rc, pool, event_sync, (pool->bk, s->ev));
            if (rc != GM_OK) return rc;
        }
        hook_dereg(pool, s); /* a later reuse registers it again if the unmap fails */
        GM_BK(rc, pool, unmap, (pool->bk, s->va, s->size));
        if (rc != GM_OK) return rc;
        s->unmapped = true;
    }
    /* Unmapped: the memory is the device's only once released; until then
     * the segment stays on the books (and in the limit) for the next trim. */
    GM_BK(rc, pool, phys_release, (pool->bk, s->h));
    if (rc != GM_OK) return rc;
    GM_BK(rc, pool, va_free, (pool->bk, s->va, s->size));
    if (rc != GM_OK) gm__clear_error();
    if (s->ev_set) GM_BK(rc, pool, event_destroy, (pool->bk, s->ev));
    (void)gm__hash_take(&pool->segs->by_va, s->va);
    gm__kinds_take(pool, s->va);
    gm__recset_clear(&s->recorded);
    for (seg_t **p = &pool->segs->all; *p; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            break;
        }
    pool->st.registrable_reserved -= s->size;
    gm__pages_limit_put(pool, s->size);
    gm__free(s);
    return GM_OK;
}

size_t gm__segs_trim_locked(gm_pool_t *pool)
{
    if (!pool->segs) return 0;
    size_t freed = 0;
    seg_t *s = pool->segs->all;
    while (s) {
        seg_t *next = s->next;
        size_t size = s->size;
        if (!s->live) {
            if (seg_give_back(pool, s) == GM_OK) freed += size;
            else gm__clear_error();
        }
        s = next;
    }
    return freed;
}

/* The engine's own reclaim (pool.h): here, beside the segments it gives
 * back, so that the engine asks no floor above it. */
size_t gm__pool_reclaim_locked(gm_pool_t *pool)
{
    size_t pages = 0;
    gm__tcache_flush_self_locked(pool);
    gm__tcache_reclaim_large_locked(pool); /* other threads' large cached blocks */
    gm__drain_streams_locked(pool);
    if (gm__pages_trim_locked(pool, 0, &pages) != GM_OK) gm__clear_error();
    /* Cached registrable segments (the root's) hold the limit too. */
    return pages + (pool->root == pool ? gm__segs_trim_locked(pool) : 0);
}

/* After a creation found no room: the allocator's own reclaim (cached
 * pages and segments go back); whether anything went back.  The creation's
 * message is kept. */
static bool make_room_locked(gm_pool_t *pool, int rc)
{
    char why[256];
    snprintf(why, sizeof why, "%s", gm_last_error());
    size_t freed = gm__pool_reclaim_locked(pool);
    gm__set_error(rc, "%s", why);
    return freed > 0;
}

/* ---- the calls ------------------------------------------------------------- */

int gm__segs_alloc_locked(gm_pool_t *pool, size_t size, gm_stream_t stream, void **ptr)
{
    if (pool->provider.ops->flags & GM__PROVIDER_LEASED)
        return gm__set_error(GM_NOT_SUPPORTED, "gm_alloc_registrable: not in a pool that leases "
                             "its pages from a broker (the broker leases pages, not segments)");
    GM_CHECK(table_ready(pool));
    size_t need = GM_ALIGN_UP(size, seg_align(pool));
    /* The cached segment that fits best, at most 1/8 larger. */
    seg_t *best = NULL;
    for (seg_t *s = pool->segs->all; s; s = s->next)
        if (!s->live && !s->unmapped && s->size >= need && s->size - need <= need / 8 &&
            (!best || s->size < best->size))
            best = s;
    int rc;
    if (best) {
        if (best->ev_set && best->stream != stream) {
            GM_BK(rc, pool, stream_wait_event, (pool->bk, stream, best->ev));
            if (rc != GM_OK) return rc;
        }
        /* Deregistered by a give-back that could not unmap it. */
        if (!best->registered) GM_CHECK(hook_reg(pool, best));
    } else {
        rc = seg_make(pool, need, &best);
        if ((rc == GM_OUT_OF_MEMORY || rc == GM_LIMIT) && make_room_locked(pool, rc))
            rc = seg_make(pool, need, &best);
        if (rc != GM_OK) {
            if (rc == GM_OUT_OF_MEMORY || rc == GM_LIMIT) pool->st.oom_count++;
            char why[256];
            snprintf(why, sizeof why, "%s", gm_last_error());
            return gm__set_error(rc, "gm_alloc_registrable: cannot allocate %zu bytes: %s", size,
                                 why);
        }
    }
    best->live = true;
    best->requested = size;
    best->stream = stream;
    pool->st.registrable_allocated += size;
    pool->st.registrable_count++;
    *ptr = (void *)best->va;
    return GM_OK;
}

/* gm_free.  A cached segment is GM_DOUBLE_FREE. */
static int seg_free(gm_pool_t *pool, gm__kind_rec_t *rec, void *ptr, gm_stream_t stream,
                    size_t *size)
{
    seg_t *s = (seg_t *)rec;
    if (!s->live)
        return gm__set_error(GM_DOUBLE_FREE, "gm_free: %p, a registrable segment, is already "
                             "free", ptr);
    /* Streams the block was recorded on finish before it changes hands. */
    GM_CHECK(gm__recset_wait(pool, &s->recorded, stream)); /* still live: may be retried */
    int rc;
    if (!s->ev_set) {
        GM_BK(rc, pool, event_create, (pool->bk, &s->ev));
        if (rc != GM_OK) return rc;
        s->ev_set = true;
    }
    GM_BK(rc, pool, event_record, (pool->bk, s->ev, stream));
    if (rc != GM_OK) return rc;
    s->live = false;
    s->stream = stream;
    *size = s->requested;
    pool->st.registrable_allocated -= s->requested;
    s->requested = 0;
    gm__recset_clear(&s->recorded);
    gm__clear_error();
    return GM_OK;
}

static int seg_size(gm_pool_t *pool, const gm__kind_rec_t *rec, const void *ptr, size_t *size)
{
    (void)pool, (void)ptr;
    const seg_t *s = (const seg_t *)rec;
    if (!s->live) return GM_INVALID_POINTER;
    *size = s->requested;
    return GM_OK;
}

static int seg_record(gm_pool_t *pool, gm__kind_rec_t *rec, void *ptr, gm_stream_t stream)
{
    (void)pool, (void)ptr;
    seg_t *s = (seg_t *)rec;
    if (!s->live) return GM_INVALID_POINTER;
    if (stream == s->stream) return GM_OK;
    return gm__recset_add(&s->recorded, stream, "gm_record_stream");
}

int gm__segs_set_hooks_locked(gm_pool_t *pool, const gm_register_hooks_t *hooks)
{
    GM_CHECK(table_ready(pool));
    for (seg_t *s = pool->segs->all; s; s = s->next) hook_dereg(pool, s);
    memset(&pool->segs->hooks, 0, sizeof pool->segs->hooks);
    if (!hooks || !hooks->reg) return GM_OK;
    pool->segs->hooks = *hooks;
    for (seg_t *s = pool->segs->all; s; s = s->next) {
        int rc = hook_reg(pool, s);
        if (rc == GM_OK) continue;
        char why[256];
        snprintf(why, sizeof why, "%s", gm_last_error());
        for (seg_t *t = pool->segs->all; t; t = t->next) hook_dereg(pool, t);
        memset(&pool->segs->hooks, 0, sizeof pool->segs->hooks);
        return gm__set_error(rc, "gm_pool_set_register_hooks: %s; no hooks are installed", why);
    }
    return GM_OK;
}

static void seg_foreach(gm_pool_t *pool, gm__kind_each_fn fn, void *arg)
{
    if (!pool->segs) return;
    for (seg_t *s = pool->segs->all; s; s = s->next)
        if (s->live) fn(s->va, s->requested, arg);
}

static int seg_check(gm_pool_t *pool)
{
    if (!pool->segs) return GM_OK;
    uint64_t live = 0, mapped = 0;
    for (seg_t *s = pool->segs->all; s; s = s->next) {
        live += s->live ? s->requested : 0;
        mapped += s->size;
        if (gm__kinds_find(pool, s->va) != &s->kind)
            return gm__set_error(GM_INTERNAL, "segments: %#" PRIxPTR " is not in the address map",
                                 s->va);
    }
    if (live != pool->st.registrable_allocated || mapped != pool->st.registrable_reserved)
        return gm__set_error(GM_INTERNAL, "segments: %llu bytes live of %llu, the stats say %llu "
                             "of %llu", (unsigned long long)live, (unsigned long long)mapped,
                             (unsigned long long)pool->st.registrable_allocated,
                             (unsigned long long)pool->st.registrable_reserved);
    return GM_OK;
}

/* gm_record_stream: the free waits on the host for each recorded stream
 * but its own, then records an event on its own, which a reuse on another
 * stream waits for on the device.  A cached segment takes none
 * (GM_INVALID_POINTER). */
const gm__kind_ops_t gm__kind_segment = {
    .name = "a registrable segment of gm_alloc_registrable",
    .free = seg_free,
    .size = seg_size,
    .record = seg_record,
    .foreach = seg_foreach,
    .check = seg_check,
};

void gm__segs_fini(gm_pool_t *pool)
{
    if (!pool->segs) return;
    seg_t *s = pool->segs->all;
    while (s) {
        seg_t *next = s->next;
        s->live = false;
        if (seg_give_back(pool, s) != GM_OK) { /* the context closes after this anyway */
            gm__clear_error();
            gm__kinds_take(pool, s->va);
            gm__recset_clear(&s->recorded);
            gm__free(s);
        }
        s = next;
    }
    gm__hash_fini(&pool->segs->by_va);
    gm__free(pool->segs);
    pool->segs = NULL;
}
