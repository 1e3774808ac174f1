/* SPDX-License-Identifier: Apache-2.0 */
/*
 * freemem.c — the free-memory engine's slower half (see freemem.h): the slab
 * of block records, the registry of stream states, and the stream rule's
 * passes (migrate, reclaim, wait-and-migrate), shared by the device
 * allocator and the pinned host pool.  The allocation path's functions are
 * static inline in freemem.h.
 *
 * Every function here expects the lock of the side that owns the structures
 * to be held.
 */
#include <stddef.h>
#include <string.h>

#include "core/pool.h"

/* ---- block records ------------------------------------------------------------ */

gm__block_t *gm__slab_new(gm__slab_t *sl)
{
    if (GM_UNLIKELY(!sl->spare)) {
        if (sl->n == sl->cap) {
            size_t cap = sl->cap ? sl->cap * 2 : 16;
            void **s = gm__realloc(sl->slabs, cap * sizeof *s);
            if (!s) return NULL;
            sl->slabs = s;
            sl->cap = cap;
        }
        gm__block_t *slab = gm__malloc(sl->per_slab * sizeof *slab);
        if (!slab) return NULL;
        sl->slabs[sl->n++] = slab;
        /* Pushed from the top, so records go out in address order. */
        for (size_t i = sl->per_slab; i-- > 0;) gm__slab_release(sl, &slab[i]);
    }
    gm__block_t *b = sl->spare;
    sl->spare = b->fnext;
    /* tc_gen is read without the lock by thread caches: an atomic store. */
    memset(b, 0, offsetof(gm__block_t, tc_gen));
    atomic_store_explicit(&b->tc_gen, 0, memory_order_relaxed);
    atomic_store_explicit(&b->tc_cached, 0, memory_order_relaxed);
    b->shared = 0;
    return b;
}

void gm__slab_fini(gm__slab_t *sl)
{
    for (size_t i = 0; i < sl->n; i++) gm__free(sl->slabs[i]);
    gm__free(sl->slabs);
    sl->slabs = NULL;
    sl->spare = NULL;
    sl->n = sl->cap = 0;
}

/* ---- stream states --------------------------------------------------------------- */

gm__stream_t *gm__streams_lookup(gm__streams_t *r, gm_stream_t handle)
{
    gm__stream_t *s;
    if (!handle) s = r->null_state;
    else s = r->of.cap ? gm__hash_get(&r->of, (uintptr_t)handle) : NULL;
    if (s) r->last = s;
    return s;
}

/* A zeroed state for handle with room for it in the list (not added yet);
 * NULL when out of host memory. */
static gm__stream_t *state_new(gm__streams_t *r, gm_stream_t handle)
{
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 8;
        gm__stream_t **a = gm__realloc(r->all, cap * sizeof *a);
        if (!a) return NULL;
        r->all = a;
        r->cap = cap;
    }
    gm__stream_t *s = gm__calloc(1, sizeof *s);
    if (s) s->handle = handle;
    return s;
}

/* Put new state s at the end of the list. */
static gm__stream_t *state_list(gm__streams_t *r, gm__stream_t *s)
{
    s->slot = r->n;
    r->all[r->n++] = s;
    return s;
}

gm__stream_t *gm__streams_add(gm__streams_t *r, gm_stream_t handle)
{
    gm_assert_internal(gm__streams_find(r, handle) == NULL);
    gm__stream_t *s = state_new(r, handle);
    if (!s) return NULL;
    if (!handle) {
        r->null_state = s;
    } else if (gm__hash_put(&r->of, (uintptr_t)handle, s) != GM_OK) {
        gm__free(s);
        return NULL;
    }
    return r->last = state_list(r, s);
}

static void event_drop(gm_pool_t *pool, gm__stream_t *s)
{
    if (!s->event) return;
    int rc;
    GM_BK(rc, pool, event_destroy, (pool->bk, s->event));
    if (rc != GM_OK) gm__clear_error();
}

gm__stream_t *gm__streams_add_detached(gm__streams_t *r, gm_stream_t handle)
{
    gm__stream_t *s = state_new(r, handle);
    if (!s) return NULL;
    s->retired = true;
    return state_list(r, s);
}

void gm__streams_detach(gm__streams_t *r, gm__stream_t *s)
{
    gm_assert_internal(!s->retired && s->slot < r->n && r->all[s->slot] == s);
    if (s->handle) gm__hash_take(&r->of, (uintptr_t)s->handle);
    else r->null_state = NULL;
    if (r->last == s) r->last = NULL;
    s->retired = true;
}

void gm__streams_forget(gm_pool_t *pool, gm__streams_t *r, gm__stream_t *s)
{
    gm_assert_internal(s->slot < r->n && r->all[s->slot] == s);
    event_drop(pool, s);
    if (!s->retired) { /* a retired one left the table already */
        if (s->handle) gm__hash_take(&r->of, (uintptr_t)s->handle);
        else r->null_state = NULL;
    }
    gm__stream_t *last = r->all[--r->n];
    r->all[s->slot] = last;
    last->slot = s->slot;
    if (r->last == s) r->last = NULL;
    gm__free(s);
}

void gm__streams_fini(gm_pool_t *pool, gm__streams_t *r)
{
    for (size_t i = 0; i < r->n; i++) {
        event_drop(pool, r->all[i]);
        gm__free(r->all[i]);
    }
    gm__free(r->all);
    gm__hash_fini(&r->of);
    *r = (gm__streams_t){0};
}

int gm__streams_check(const gm__streams_t *r)
{
    size_t retired = 0;
    for (size_t i = 0; i < r->n; i++) {
        const gm__stream_t *t = r->all[i];
        const gm__stream_t *found =
            !t->handle ? r->null_state
                       : r->of.cap ? gm__hash_get(&r->of, (uintptr_t)t->handle) : NULL;
        if (t->slot != i)
            return gm__set_error(GM_INTERNAL, "stream state %zu is not in its slot", i);
        if (t->retired) {
            retired++;
            if (found == t)
                return gm__set_error(GM_INTERNAL, "retired stream state %zu still found by its "
                                     "handle", i);
            if (t->ev_pending || t->done_seq != t->free_seq)
                return gm__set_error(GM_INTERNAL, "retired stream state %zu has work not known "
                                     "done", i);
        } else if (found != t) {
            return gm__set_error(GM_INTERNAL, "stream state %zu not found by its handle", i);
        }
    }
    size_t in_tab = r->of.count + (r->null_state != NULL);
    if (in_tab + retired != r->n)
        return gm__set_error(GM_INTERNAL, "stream table holds %zu states, list %zu (%zu retired)",
                             in_tab, r->n, retired);
    return GM_OK;
}

/* ---- the stream rule ----------------------------------------------------------------- */

size_t gm__fm_migrate(gm_pool_t *pool, const gm__fm_policy_t *pol, gm__slab_t *slab,
                      gm__stream_t *s, gm__stream_t *global, uint64_t upto)
{
    gm_assert_internal(!s->is_global && global->is_global);
    size_t moved = 0;
    for (int c = 0; c < GM_CLASS_COUNT; c++) {
        gm__freeidx_t *idx = &s->idx[c];
        /* Collected first: the releases below merge and recycle records. */
        gm__block_t *take = NULL, **tail = &take;
        for (uint64_t fb = idx->fl_bits; fb; fb &= fb - 1) {
            unsigned fl = (unsigned)__builtin_ctzll(fb);
            for (uint32_t sb = idx->sl_bits[fl]; sb; sb &= sb - 1) {
                unsigned sl = (unsigned)__builtin_ctz(sb);
                for (gm__block_t *b = idx->heads[fl][sl], *next; b; b = next) {
                    next = b->fnext;
                    if (b->free_seq > upto) continue;
                    gm__fm_remove(idx, b);
                    if (pol->migrate_reversed) {
                        b->fnext = take;
                        take = b;
                    } else {
                        b->fnext = NULL;
                        *tail = b;
                        tail = &b->fnext;
                    }
                }
            }
        }
        while (take) {
            gm__block_t *b = take;
            take = b->fnext;
            gm__fm_release(pool, pol, slab, b, global);
            moved++;
        }
    }
    return moved;
}

static inline void mark_done(gm__stream_t *s, uint64_t seq)
{
    if (seq > s->done_seq) s->done_seq = seq;
}

/* Move the blocks s is known to have passed (done_seq) to the global index. */
static size_t migrate_done(gm_pool_t *pool, const gm__fm_policy_t *pol, gm__slab_t *slab,
                           gm__stream_t *s, gm__stream_t *global)
{
    size_t moved = 0;
    if (gm__fm_held(s)) moved = gm__fm_migrate(pool, pol, slab, s, global, s->done_seq);
    s->mig_seq = s->done_seq;
    return moved;
}

/* Record s's event after its latest free; false when that failed. */
static bool event_arm(gm_pool_t *pool, gm__stream_t *s)
{
    int rc;
    if (!s->event) {
        GM_BK(rc, pool, event_create, (pool->bk, &s->event));
        if (rc != GM_OK) {
            s->event = 0;
            gm__clear_error();
            return false;
        }
    }
    GM_BK(rc, pool, event_record, (pool->bk, s->event, s->handle));
    if (rc != GM_OK) {
        gm__clear_error();
        return false;
    }
    s->ev_seq = s->free_seq;
    s->ev_pending = true;
    return true;
}

/* Has s's pending event completed?  GM_OK or the query's status. */
static int event_done(gm_pool_t *pool, gm__stream_t *s)
{
    int rc;
    GM_BK(rc, pool, event_query, (pool->bk, s->event));
    if (rc != GM_OK && rc != GM_NOT_READY) gm__clear_error();
    return rc;
}

size_t gm__fm_reclaim(gm_pool_t *pool, const gm__fm_policy_t *pol, gm__slab_t *slab,
                      gm__stream_t *s, gm__stream_t *global)
{
    gm_assert_internal(!s->is_global && global->is_global);
    size_t moved = 0;
    if (!pol->reclaim_eager && !gm__fm_held(s)) return 0;
    /* Known done already (gm__fm_passed consumed an event): no call. */
    if (s->done_seq > s->mig_seq) moved += migrate_done(pool, pol, slab, s, global);
    if (s->ev_pending) {
        int rc = event_done(pool, s);
        if (rc == GM_NOT_READY || (rc != GM_OK && !pol->reclaim_eager)) return moved;
        s->ev_pending = false;
        if (rc == GM_OK) {
            mark_done(s, s->ev_seq);
            moved += migrate_done(pool, pol, slab, s, global);
        }
        if (!pol->reclaim_eager) return moved;
    }
    if (!gm__fm_held(s) || !event_arm(pool, s)) return moved;
    /* An idle stream has passed it already. */
    if (event_done(pool, s) == GM_OK) {
        s->ev_pending = false;
        mark_done(s, s->ev_seq);
        moved += migrate_done(pool, pol, slab, s, global);
    }
    return moved;
}

bool gm__fm_passed(gm_pool_t *pool, gm__stream_t *s, uint64_t seq, bool wait)
{
    gm_assert_internal(!s->is_global && seq <= s->free_seq);
    if (s->done_seq >= seq) return true;
    if (s->ev_pending && event_done(pool, s) == GM_OK) {
        s->ev_pending = false;
        mark_done(s, s->ev_seq);
    }
    if (s->done_seq >= seq) return true;
    /* No event covers seq (or it is not done): one recorded now covers
     * every free so far; an idle stream has passed it at once. */
    if (!s->ev_pending && event_arm(pool, s) && event_done(pool, s) == GM_OK) {
        s->ev_pending = false;
        mark_done(s, s->ev_seq);
    }
    if (s->done_seq >= seq) return true;
    if (!wait) return false;
    int rc;
    uint64_t upto = s->free_seq;
    GM_BK(rc, pool, stream_sync, (pool->bk, s->handle));
    if (rc != GM_OK) {
        gm__clear_error();
        return false;
    }
    mark_done(s, upto);
    return true;
}

int gm__fm_sync_migrate(gm_pool_t *pool, const gm__fm_policy_t *pol, gm__slab_t *slab,
                        gm__stream_t *s, gm__stream_t *global)
{
    gm_assert_internal(!s->is_global && global->is_global);
    int rc;
    uint64_t upto = s->free_seq;
    if (s->retired) rc = GM_OK; /* waited for when it was forgotten */
    else GM_BK(rc, pool, stream_sync, (pool->bk, s->handle));
    if (rc == GM_OK) {
        gm__fm_migrate(pool, pol, slab, s, global, UINT64_MAX);
        mark_done(s, upto);
        s->mig_seq = s->done_seq;
    }
    return rc;
}

/* ---- validation -------------------------------------------------------------------- */

int gm__fm_check_free(const gm__block_t *b, unsigned slb)
{
    if (b->bucket != gm__fm_bucket(b->size, slb))
        return gm__set_error(GM_INTERNAL, "free block %#lx in the wrong bucket",
                             (unsigned long)b->addr);
    unsigned fl = b->bucket / GM_SL_COUNT, sl = b->bucket % GM_SL_COUNT;
    const gm__block_t *x = b->owner->idx[b->cls].heads[fl][sl];
    while (x && x != b) x = x->fnext;
    if (!x)
        return gm__set_error(GM_INTERNAL, "free block %#lx missing from its index",
                             (unsigned long)b->addr);
    return GM_OK;
}
