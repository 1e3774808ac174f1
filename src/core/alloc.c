/* SPDX-License-Identifier: Apache-2.0 */
/*
 * alloc.c — blocks, the free-range index, split/merge, and the stream rule.
 *
 * Blocks tile each arena's address space.  Free blocks sit in two-level
 * segregated-fit indexes (32 buckets per power of two over 256-byte units):
 * a lookup checks a few blocks of the request's own bucket for the tightest
 * fit — so a training step that frees and re-requests the same sizes gets
 * the same places back — and otherwise takes any block from the next
 * non-empty bucket, which always fits.  Both are O(1).
 *
 * Every stream has its own index: a block freed on stream S is reusable at
 * once by S (S's queue orders the reuse after the earlier work) and by other
 * streams only after S was synchronized and the block moved ("drained") to
 * the global index.  Only blocks of the same index merge.  The global index
 * is also the only place whose pages may be unmapped (see pages.c).
 *
 * Live blocks are found by address in an open-addressing hash table.  Block
 * descriptors are recycled through a free list and allocated in slabs.
 * Stream states are found by handle in another, and freed when idle (see
 * "stream states" below), so a workload touching many streams holds about
 * as many states as streams in use.
 *
 * Every function here expects the pool lock to be held.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/pool.h"

/* How many blocks of the request's own bucket are compared for a best fit. */
#define OWN_BUCKET_SCAN 8
#define SLAB_BLOCKS 1024

/* ---- block descriptors ----------------------------------------------------- */

gm__block_t *gm__block_new_locked(gm_pool_t *pool)
{
    gm__block_t *b = pool->block_freelist;
    if (GM_UNLIKELY(!b)) {
        if (pool->n_slabs == pool->cap_slabs) {
            size_t cap = pool->cap_slabs ? pool->cap_slabs * 2 : 16;
            void **s = gm__realloc(pool->slabs, cap * sizeof *s);
            if (!s) return NULL;
            pool->slabs = s;
            pool->cap_slabs = cap;
        }
        gm__block_t *slab = gm__malloc(SLAB_BLOCKS * sizeof *slab);
        if (!slab) return NULL;
        pool->slabs[pool->n_slabs++] = slab;
        for (size_t i = 0; i < SLAB_BLOCKS; i++) {
            slab[i].fnext = pool->block_freelist;
            pool->block_freelist = &slab[i];
        }
        b = pool->block_freelist;
    }
    pool->block_freelist = b->fnext;
    *b = (gm__block_t){0};
    return b;
}

void gm__block_release_locked(gm_pool_t *pool, gm__block_t *b)
{
    b->fnext = pool->block_freelist;
    pool->block_freelist = b;
}

static void block_recycle(gm_pool_t *pool, gm__block_t *b)
{
    b->fnext = pool->block_freelist;
    pool->block_freelist = b;
}

/* ---- the segregated-fit index ---------------------------------------------- */

static inline unsigned log2_floor(uint64_t x) { return 63u - (unsigned)__builtin_clzll(x); }

static inline uint32_t bucket_of(size_t size)
{
    uint64_t u = size >> GM_UNIT_SHIFT;
    if (u < GM_SL_COUNT) return (uint32_t)u;
    unsigned l = log2_floor(u);
    unsigned fl = l - GM_SL_BITS + 1;
    unsigned sl = (unsigned)(u >> (l - GM_SL_BITS)) - GM_SL_COUNT;
    if (fl >= GM_FL_COUNT) return GM_FL_COUNT * GM_SL_COUNT - 1;
    return fl * GM_SL_COUNT + sl;
}

void gm__freeidx_insert(gm__freeidx_t *idx, gm__block_t *b)
{
    uint32_t bk = bucket_of(b->size);
    unsigned fl = bk / GM_SL_COUNT, sl = bk % GM_SL_COUNT;
    b->bucket = bk;
    b->fprev = NULL;
    b->fnext = idx->heads[fl][sl];
    if (b->fnext) b->fnext->fprev = b;
    idx->heads[fl][sl] = b;
    idx->sl_bits[fl] |= 1u << sl;
    idx->fl_bits |= (uint64_t)1 << fl;
    idx->count++;
    idx->bytes += b->size;
}

static void freeidx_remove(gm__freeidx_t *idx, gm__block_t *b)
{
    unsigned fl = b->bucket / GM_SL_COUNT, sl = b->bucket % GM_SL_COUNT;
    if (b->fprev) b->fprev->fnext = b->fnext;
    else idx->heads[fl][sl] = b->fnext;
    if (b->fnext) b->fnext->fprev = b->fprev;
    if (!idx->heads[fl][sl]) {
        idx->sl_bits[fl] &= ~(1u << sl);
        if (!idx->sl_bits[fl]) idx->fl_bits &= ~((uint64_t)1 << fl);
    }
    idx->count--;
    idx->bytes -= b->size;
}

/* A free block of at least `size` bytes, or NULL. */
static gm__block_t *freeidx_find(const gm__freeidx_t *idx, size_t size)
{
    if (!idx->fl_bits) return NULL;
    uint32_t bk = bucket_of(size);
    unsigned fl = bk / GM_SL_COUNT, sl = bk % GM_SL_COUNT;
    /* Own bucket: blocks may be smaller or larger than size; take the best. */
    gm__block_t *best = NULL;
    int n = 0;
    for (gm__block_t *b = idx->heads[fl][sl]; b && n < OWN_BUCKET_SCAN; b = b->fnext, n++) {
        if (b->size < size) continue;
        if (!best || b->size < best->size || (b->size == best->size && b->addr < best->addr))
            best = b;
        if (best->size == size) break;
    }
    if (best) return best;
    /* Any block of a higher bucket fits. */
    uint32_t slm = sl + 1 < GM_SL_COUNT ? idx->sl_bits[fl] & (~0u << (sl + 1)) : 0;
    if (!slm) {
        uint64_t flm = fl + 1 < 64 ? idx->fl_bits & (~(uint64_t)0 << (fl + 1)) : 0;
        if (!flm) return NULL;
        fl = (unsigned)__builtin_ctzll(flm);
        slm = idx->sl_bits[fl];
    }
    sl = (unsigned)__builtin_ctz(slm);
    /* Every block here fits; prefer the smallest, then the lowest address,
     * so placement depends on the free ranges more than on their history. */
    best = idx->heads[fl][sl];
    n = 0;
    for (gm__block_t *b = best->fnext; b && ++n < OWN_BUCKET_SCAN; b = b->fnext)
        if (b->size < best->size || (b->size == best->size && b->addr < best->addr)) best = b;
    return best;
}

/* ---- streams ------------------------------------------------------------------ */

/* Stream states are found by handle in an open-addressing table and kept
 * only while they matter: a state with no free blocks, no pending event and
 * no users (live or pending blocks, record_stream entries) is idle, and the
 * sweep run when the count of states reaches streams_sweep_at (twice what the
 * last sweep kept, at least STREAM_SWEEP_MIN) frees the idle ones after
 * letting finished streams hand their free blocks to everyone.  So a trace
 * touching 65 535 streams holds about as many states as streams in use, and
 * each creation costs O(1) amortized.  The default stream's state is kept. */
#define STREAM_SWEEP_MIN 64

static gm__stream_t *stream_find_locked(gm_pool_t *pool, gm_stream_t handle)
{
    if (!handle) return pool->null_stream;
    return gm__hash_get(&pool->stream_of, (uintptr_t)handle);
}

static bool stream_idle(const gm__stream_t *s)
{
    return !s->pinned && !s->is_global && s->users == 0 && !s->ev_pending &&
           s->idx[GM_CLASS_SMALL].count == 0 && s->idx[GM_CLASS_LARGE].count == 0;
}

static void stream_forget_locked(gm_pool_t *pool, gm__stream_t *s)
{
    if (s->event) {
        int rc;
        GM_BK(rc, pool, event_destroy, (pool->bk, s->event));
        if (rc != GM_OK) gm__clear_error();
    }
    if (s->handle) gm__hash_take(&pool->stream_of, (uintptr_t)s->handle);
    gm__stream_t *last = pool->streams[--pool->n_streams];
    pool->streams[s->slot] = last;
    last->slot = s->slot;
    if (pool->last_stream == s) pool->last_stream = NULL;
    gm__free(s);
}

static size_t reclaim_streams(gm_pool_t *pool, const gm__stream_t *except);

static void streams_sweep_locked(gm_pool_t *pool)
{
    reclaim_streams(pool, NULL); /* finished streams hand their free blocks over */
    for (size_t i = pool->n_streams; i-- > 0;)
        if (stream_idle(pool->streams[i])) stream_forget_locked(pool, pool->streams[i]);
    pool->streams_sweep_at = 2 * pool->n_streams > STREAM_SWEEP_MIN ? 2 * pool->n_streams
                                                                  : STREAM_SWEEP_MIN;
}

size_t gm__stream_count_locked(gm_pool_t *pool) { return pool->n_streams; }

gm__stream_t *gm__stream_get_locked(gm_pool_t *pool, gm_stream_t handle)
{
    gm__stream_t *s = pool->last_stream;
    if (GM_LIKELY(s && s->handle == handle)) return s;
    s = stream_find_locked(pool, handle);
    if (s) return pool->last_stream = s;
    if (pool->n_streams >= pool->streams_sweep_at) streams_sweep_locked(pool);
    if (pool->n_streams == pool->cap_streams) {
        size_t cap = pool->cap_streams ? pool->cap_streams * 2 : 8;
        gm__stream_t **a = gm__realloc(pool->streams, cap * sizeof *a);
        if (!a) return NULL;
        pool->streams = a;
        pool->cap_streams = cap;
    }
    s = gm__calloc(1, sizeof *s);
    if (!s) return NULL;
    s->handle = handle;
    s->pinned = handle == NULL;
    if (!handle) {
        pool->null_stream = s;
    } else if (gm__hash_put(&pool->stream_of, (uintptr_t)handle, s) != GM_OK) {
        gm__free(s);
        return NULL;
    }
    s->slot = pool->n_streams;
    pool->streams[pool->n_streams++] = s;
    return pool->last_stream = s;
}

/* ---- free blocks into an index, with merging ----------------------------------- */

static inline gm__freeidx_t *idx_of(gm__stream_t *owner, const gm__block_t *b)
{
    return &owner->idx[b->arena->cls];
}

/* Can a block freed into owner's index take in its free neighbour n?  Same
 * index always; a stream's block also absorbs global blocks (memory anyone may
 * use), except an arena's last block, whose untouched address space is left
 * to the global index.  Merging this far keeps the free ranges maximal, so a
 * repeating step starts from the same layout every time. */
static inline bool mergeable(const gm__block_t *n, const gm__stream_t *owner)
{
    if (!n || !n->free) return false;
    if (n->owner == owner) return true;
    return !owner->is_global && n->owner->is_global && n->next != NULL;
}

static void absorb(gm_pool_t *pool, gm__block_t *n, gm__stream_t *owner)
{
    freeidx_remove(idx_of(n->owner, n), n);
    if (n->owner != owner) /* global pages now wait on owner's stream */
        gm__pages_mark_used_locked(n->arena, n->addr, n->size, pool->page_shift);
}

/* Make b a free block of owner's index, merged with its neighbours as
 * mergeable() allows.  Returns the merged block. */
static gm__block_t *release_block(gm_pool_t *pool, gm__block_t *b, gm__stream_t *owner)
{
    uintptr_t lo = b->addr, hi = b->addr + b->size;
    /* Absorbing a global neighbour can bring the next block of this index
     * alongside: keep going until neither side merges. */
    for (gm__block_t *p = b->prev; mergeable(p, owner); p = b->prev) {
        absorb(pool, p, owner);
        p->size += b->size;
        p->next = b->next;
        if (b->next) b->next->prev = p;
        block_recycle(pool, b);
        b = p;
    }
    for (gm__block_t *n = b->next; mergeable(n, owner); n = b->next) {
        absorb(pool, n, owner);
        b->size += n->size;
        b->next = n->next;
        if (n->next) n->next->prev = b;
        block_recycle(pool, n);
    }
    b->free = 1;
    b->pending = 0;
    b->owner = owner;
    if (!owner->is_global) b->free_seq = ++owner->free_seq; /* merged: the newest */
    gm__freeidx_insert(idx_of(owner, b), b);
    if (owner->is_global) {
        /* Only pages near the newly freed range can have changed state. */
        uintptr_t page = pool->page;
        uintptr_t wlo = lo - b->addr >= page ? lo - page : b->addr;
        uintptr_t whi = b->addr + b->size - hi >= page ? hi + page : b->addr + b->size;
        gm__pages_mark_unused_locked(pool, b->arena, wlo, whi - wlo);
    }
    return b;
}

/* ---- draining streams -------------------------------------------------------- */

static void destroy_recorded(gm_pool_t *pool, gm__block_t *b)
{
    gm__recorded_t *r = b->recorded;
    while (r) {
        gm__recorded_t *next = r->next;
        if (r->event) {
            int rc;
            GM_BK(rc, pool, event_destroy, (pool->bk, r->event));
            (void)rc;
        }
        r->stream->users--;
        gm__free(r);
        r = next;
    }
    b->recorded = NULL;
}

/* Order the reuse of a freed block after the work r->stream has queued so
 * far: an event recorded there, else a wait for the whole stream.  When both
 * fail (a backend failure), r stays unordered and its block stays pending,
 * reusable by no stream, since that stream's work may still use it;
 * process_pending tries again (an event recorded later still follows the
 * work queued before the free).  The backend's message is cleared. */
static void order_recorded(gm_pool_t *pool, gm__recorded_t *r)
{
    int rc;
    if (!r->event) {
        GM_BK(rc, pool, event_create, (pool->bk, &r->event));
        if (rc != GM_OK) r->event = 0;
    }
    if (r->event) {
        GM_BK(rc, pool, event_record, (pool->bk, r->event, r->stream->handle));
        if (rc == GM_OK) {
            r->unordered = false;
            gm__clear_error();
            return;
        }
        GM_BK(rc, pool, event_destroy, (pool->bk, r->event));
        r->event = 0;
    }
    /* Cannot order the reuse: wait for that stream now. */
    GM_BK(rc, pool, stream_sync, (pool->bk, r->stream->handle));
    r->unordered = rc != GM_OK;
    gm__clear_error();
}

/* Move pending blocks whose recorded streams have all passed the free into
 * the index of the stream that freed them; returns how many. */
static size_t process_pending(gm_pool_t *pool)
{
    size_t released = 0;
    gm__block_t **pp = &pool->pending;
    while (*pp) {
        gm__block_t *b = *pp;
        bool done = true;
        for (gm__recorded_t *r = b->recorded; r && done; r = r->next) {
            int rc;
            if (r->unordered) order_recorded(pool, r);
            if (r->unordered) {
                done = false;
                break;
            }
            if (!r->event) continue;
            GM_BK(rc, pool, event_query, (pool->bk, r->event));
            if (rc != GM_OK) done = false;
        }
        if (!done) {
            pp = &b->fnext;
            continue;
        }
        *pp = b->fnext;
        destroy_recorded(pool, b);
        b->owner->users--; /* pending no more */
        release_block(pool, b, b->owner);
        released++;
    }
    return released;
}

/* Move to the global index the blocks of s freed up to free_seq <= upto. */
static size_t migrate_stream(gm_pool_t *pool, gm__stream_t *s, uint64_t upto)
{
    size_t moved = 0;
    for (int c = 0; c < GM_CLASS_COUNT; c++) {
        gm__freeidx_t *idx = &s->idx[c];
        gm__block_t *take = NULL;
        for (uint64_t fb = idx->fl_bits; fb; fb &= fb - 1) {
            unsigned fl = (unsigned)__builtin_ctzll(fb);
            for (uint32_t sb = idx->sl_bits[fl]; sb; sb &= sb - 1) {
                unsigned sl = (unsigned)__builtin_ctz(sb);
                for (gm__block_t *b = idx->heads[fl][sl], *next; b; b = next) {
                    next = b->fnext;
                    if (b->free_seq > upto) continue;
                    freeidx_remove(idx, b);
                    b->fnext = take;
                    take = b;
                }
            }
        }
        while (take) {
            gm__block_t *b = take;
            take = b->fnext;
            release_block(pool, b, &pool->global);
            moved++;
        }
    }
    return moved;
}

/* Let other streams' freed blocks reach the global index without waiting:
 * record an event on each stream holding free blocks (once), and move the
 * blocks freed before an event that has completed.  Cheap: one query per
 * such stream, one record when the last event was consumed. */
static size_t reclaim_streams(gm_pool_t *pool, const gm__stream_t *except)
{
    size_t moved = 0;
    if (pool->pending) moved += process_pending(pool); /* recorded streams may have passed */
    for (size_t i = 0; i < pool->n_streams; i++) {
        gm__stream_t *t = pool->streams[i];
        if (t == except) continue;
        int rc;
        if (t->ev_pending) {
            GM_BK(rc, pool, event_query, (pool->bk, t->event));
            if (rc == GM_NOT_READY) continue;
            t->ev_pending = false;
            if (rc == GM_OK) moved += migrate_stream(pool, t, t->ev_seq);
        }
        size_t held = 0;
        for (int c = 0; c < GM_CLASS_COUNT; c++) held += t->idx[c].count;
        if (!held) continue;
        if (!t->event) {
            GM_BK(rc, pool, event_create, (pool->bk, &t->event));
            if (rc != GM_OK) {
                t->event = 0;
                continue;
            }
        }
        GM_BK(rc, pool, event_record, (pool->bk, t->event, t->handle));
        if (rc != GM_OK) continue;
        t->ev_seq = t->free_seq;
        t->ev_pending = true;
        /* An idle stream has passed it already. */
        GM_BK(rc, pool, event_query, (pool->bk, t->event));
        if (rc == GM_OK) {
            t->ev_pending = false;
            moved += migrate_stream(pool, t, t->ev_seq);
        }
    }
    gm__clear_error();
    return moved;
}

size_t gm__drain_streams_locked(gm_pool_t *pool)
{
    size_t moved = 0;
    if (pool->pending) process_pending(pool);
    for (size_t i = 0; i < pool->n_streams; i++) {
        gm__stream_t *s = pool->streams[i];
        size_t held = 0;
        for (int c = 0; c < GM_CLASS_COUNT; c++) held += s->idx[c].count;
        if (!held) continue;
        int rc;
        GM_BK(rc, pool, stream_sync, (pool->bk, s->handle));
        if (rc != GM_OK) continue; /* still in flight: its blocks stay put */
        moved += migrate_stream(pool, s, UINT64_MAX);
    }
    gm__clear_error(); /* a held stream's NOT_READY is no error of the caller's */
    return moved;
}

/* The stream is about to be destroyed: no event may be recorded on it again.
 * Wait for its work if it holds free blocks, and hand them to every stream;
 * its (now empty) state stays, harmless if the handle is reused. */
int gm__stream_retire_locked(gm_pool_t *pool, gm_stream_t handle)
{
    gm__stream_t *s = stream_find_locked(pool, handle);
    if (!s) return GM_OK;
    size_t held = 0;
    for (int c = 0; c < GM_CLASS_COUNT; c++) held += s->idx[c].count;
    /* Pending blocks whose order after s could not be set up yet cannot
     * get an event on s later: they need the wait too. */
    bool unordered = false;
    for (gm__block_t *b = pool->pending; b && !unordered; b = b->fnext)
        for (gm__recorded_t *r = b->recorded; r; r = r->next)
            if (r->unordered && r->stream == s) unordered = true;
    if (held || unordered) {
        int rc;
        GM_BK(rc, pool, stream_sync, (pool->bk, handle));
        GM_CHECK(rc);
        for (gm__block_t *b = pool->pending; b; b = b->fnext)
            for (gm__recorded_t *r = b->recorded; r; r = r->next)
                if (r->stream == s) r->unordered = false;
        migrate_stream(pool, s, UINT64_MAX);
    }
    /* Its event (recorded on a finished stream) is not needed any more. */
    if (s->ev_pending) {
        int rc;
        GM_BK(rc, pool, event_query, (pool->bk, s->event));
        if (rc == GM_OK) s->ev_pending = false;
        gm__clear_error();
    }
    if (stream_idle(s)) stream_forget_locked(pool, s);
    return GM_OK;
}

/* ---- allocation ---------------------------------------------------------------- */

/* The tightest free block for size: the stream's own index, then the global
 * one (ties go to the lower address). */
static gm__block_t *find_for(gm_pool_t *pool, gm__stream_t *s, int cls, size_t size)
{
    gm__block_t *b = freeidx_find(&s->idx[cls], size);
    if (!b || b->size != size) {
        gm__block_t *g = freeidx_find(&pool->global.idx[cls], size);
        if (g && (!b || g->size < b->size || (g->size == b->size && g->addr < b->addr))) b = g;
    }
    return b;
}

/* Why this attempt failed; the caller (pool.c's slow path) retries and, in
 * the end, the OOM report (oom.c) counts it and adds the pool's picture. */
static int oom_error(gm_pool_t *pool, int rc, size_t size)
{
    char a[32], r[32], l[32], f[32];
    return gm__set_error(rc == GM_LIMIT ? GM_LIMIT : GM_OUT_OF_MEMORY,
                         "gm_alloc: cannot allocate %zu bytes: %s; allocated %s, reserved %s, "
                         "limit %s, device free %s",
                         size,
                         rc == GM_LIMIT && pool->cfg.limit ? "the pool limit is reached"
                                                           : "out of device memory",
                         gm__fmt_bytes(pool->st.allocated, a, sizeof a),
                         gm__fmt_bytes(pool->st.reserved, r, sizeof r),
                         gm__fmt_bytes(pool->limit, l, sizeof l),
                         gm__fmt_bytes(pool->info.total_memory - pool->st.reserved, f, sizeof f));
}

int gm__alloc_locked(gm_pool_t *pool, size_t size, gm__stream_t *s, void **ptr)
{
    size_t asize = GM_ALIGN_UP(size, GM_ALIGNMENT);
    int cls = asize <= GM_SMALL_MAX ? GM_CLASS_SMALL : GM_CLASS_LARGE;

    gm__block_t *b = find_for(pool, s, cls, asize);
    if (GM_UNLIKELY(!b)) {
        /* No address range left: free ranges may wait in other streams. */
        gm__drain_streams_locked(pool);
        b = freeidx_find(&pool->global.idx[cls], asize);
        if (!b) b = freeidx_find(&s->idx[cls], asize);
        if (!b) {
            return gm__set_error(GM_OUT_OF_MEMORY,
                                 "gm_alloc: cannot allocate %zu bytes: the pool's address space "
                                 "is exhausted (fragmented by blocks still in flight)", size);
        }
    }
    if (pool->n_streams > 1 && !gm__pages_ready_locked(b->arena, b->addr, asize, pool->page_shift) &&
        reclaim_streams(pool, s) > 0) {
        /* Blocks other streams finished with may serve it with no mapping;
         * the move may also have merged b away: look again. */
        b = find_for(pool, s, cls, asize);
    }
    gm__stream_t *owner = b->owner;
    freeidx_remove(idx_of(owner, b), b);
    if (b->size > asize) {
        gm__block_t *r = gm__block_new_locked(pool);
        if (GM_UNLIKELY(!r)) {
            gm__freeidx_insert(idx_of(owner, b), b);
            return gm__set_error(GM_NO_HOST_MEMORY, "gm_alloc: out of host memory for a block");
        }
        r->addr = b->addr + asize;
        r->size = b->size - asize;
        r->arena = b->arena;
        r->prev = b;
        r->next = b->next;
        if (b->next) b->next->prev = r;
        b->next = r;
        r->free = 1;
        r->owner = owner;
        r->free_seq = b->free_seq; /* freed when b was: same ordering rule */
        gm__freeidx_insert(idx_of(owner, r), r);
        b->size = asize;
    }
    b->free = 0;
    b->owner = s; /* counted in s->users once the allocation succeeds */
    b->requested = size;
    gm__pages_mark_used_locked(b->arena, b->addr, b->size, pool->page_shift);
    int rc = gm__pages_ensure_mapped_locked(pool, b->arena, b->addr, b->size, size);
    if (GM_LIKELY(rc == GM_OK)) rc = gm__hash_put(&pool->live, b->addr, b);
    if (GM_UNLIKELY(rc != GM_OK)) {
        release_block(pool, b, owner);
        if (rc == GM_NO_HOST_MEMORY) return gm__set_error(rc, "gm_alloc: out of host memory");
        if (rc == GM_LIMIT || rc == GM_OUT_OF_MEMORY) return oom_error(pool, rc, size);
        return rc; /* a backend failure: its message stands */
    }
    s->users++;
    pool->st.allocated += size;
    pool->st.active += asize;
    pool->st.alloc_count++;
    pool->st.live_blocks++;
    if (pool->st.allocated > pool->st.allocated_peak) pool->st.allocated_peak = pool->st.allocated;
    if (pool->st.active > pool->st.active_peak) pool->st.active_peak = pool->st.active;
    *ptr = (void *)b->addr;
    return GM_OK;
}

/* ---- free ---------------------------------------------------------------------- */

/* Explain why ptr is not a live block of this pool (error path only). */
static int bad_free(gm_pool_t *pool, void *ptr)
{
    uintptr_t p = (uintptr_t)ptr;
    for (int c = 0; c < GM_CLASS_COUNT; c++) {
        gm__arena_t *a = &pool->arena[c];
        if (p < a->base || p >= a->base + a->size) continue;
        for (gm__block_t *b = a->first; b; b = b->next) {
            if (p < b->addr || p >= b->addr + b->size) continue;
            if (b->free || b->pending) {
                if (b->addr == p)
                    return gm__set_error(GM_DOUBLE_FREE, "gm_free: %p was already freed", ptr);
                return gm__set_error(GM_DOUBLE_FREE,
                                     "gm_free: %p lies in free memory (already freed?)", ptr);
            }
            return gm__set_error(GM_INVALID_POINTER,
                                 "gm_free: %p points inside the live block %p of %zu bytes, "
                                 "not at its start", ptr, (void *)b->addr, b->requested);
        }
    }
    return gm__set_error(GM_INVALID_POINTER, "gm_free: %p was not allocated by this pool", ptr);
}

int gm__free_locked(gm_pool_t *pool, void *ptr, gm__stream_t *s, size_t *freed)
{
    gm__block_t *b = gm__hash_take(&pool->live, (uintptr_t)ptr);
    if (GM_UNLIKELY(!b)) return bad_free(pool, ptr);
    *freed = b->requested;
    b->owner->users--; /* the stream it was allocated on */
    pool->st.allocated -= b->requested;
    pool->st.active -= b->size;
    pool->st.free_count++;
    pool->st.live_blocks--;
    if (GM_UNLIKELY(b->recorded != NULL)) {
        /* Other streams used it: reusable once they pass this point. */
        for (gm__recorded_t *r = b->recorded; r; r = r->next) order_recorded(pool, r);
        b->pending = 1;
        b->owner = s;
        s->users++;
        b->fnext = pool->pending;
        pool->pending = b;
        return GM_OK;
    }
    release_block(pool, b, s);
    return GM_OK;
}

int gm__record_stream_locked(gm_pool_t *pool, void *ptr, gm__stream_t *s)
{
    gm__block_t *b = gm__hash_get(&pool->live, (uintptr_t)ptr);
    if (!b) {
        int rc = bad_free(pool, ptr);
        return gm__set_error(rc, "gm_record_stream: %p is not a live block of this pool", ptr);
    }
    if (s == b->owner) return GM_OK;
    for (gm__recorded_t *r = b->recorded; r; r = r->next)
        if (r->stream == s) return GM_OK;
    gm__recorded_t *r = gm__calloc(1, sizeof *r);
    if (!r) return gm__set_error(GM_NO_HOST_MEMORY, "gm_record_stream: out of host memory");
    r->stream = s;
    s->users++;
    r->next = b->recorded;
    b->recorded = r;
    return GM_OK;
}

/* ---- statistics and validation -------------------------------------------------- */

void gm__alloc_free_summary_locked(gm_pool_t *pool, uint64_t *largest, uint64_t *free_blocks)
{
    uint64_t best = 0, n = 0;
    size_t shift = pool->page_shift;
    for (int c = 0; c < GM_CLASS_COUNT; c++) {
        gm__arena_t *a = &pool->arena[c];
        for (gm__block_t *b = a->first; b; b = b->next) {
            if (!b->free) continue;
            n++;
            /* Longest stretch of the block whose pages are all mapped. */
            size_t p0 = (b->addr - a->base) >> shift;
            size_t p1 = ((b->addr + b->size - 1 - a->base) >> shift) + 1;
            uintptr_t run_lo = 0;
            bool in_run = false;
            for (size_t p = p0; p <= p1; p++) {
                bool m = p < p1 && ((a->mapped[p >> 6] >> (p & 63)) & 1);
                uintptr_t pa = a->base + (p << shift);
                if (m && !in_run) {
                    in_run = true;
                    run_lo = pa > b->addr ? pa : b->addr;
                } else if (!m && in_run) {
                    in_run = false;
                    uintptr_t run_hi = pa < b->addr + b->size ? pa : b->addr + b->size;
                    if (run_hi - run_lo > best) best = run_hi - run_lo;
                }
            }
        }
    }
    *largest = best;
    *free_blocks = n;
}

int gm__alloc_check_locked(gm_pool_t *pool)
{
    uint64_t live = 0, active = 0, allocated = 0, free_blocks = 0;
    size_t idx_count[GM_CLASS_COUNT] = {0};
    for (int c = 0; c < GM_CLASS_COUNT; c++) {
        gm__arena_t *a = &pool->arena[c];
        uintptr_t at = a->base;
        gm__block_t *prev = NULL;
        for (gm__block_t *b = a->first; b; prev = b, b = b->next) {
            if (b->addr != at || b->prev != prev || b->arena != a || b->size == 0 ||
                b->size % GM_ALIGNMENT)
                return gm__set_error(GM_INTERNAL, "arena %d: block list broken at %#lx", c,
                                     (unsigned long)b->addr);
            at += b->size;
            if (b->free) {
                free_blocks++;
                if (b->bucket != bucket_of(b->size))
                    return gm__set_error(GM_INTERNAL, "free block %#lx in the wrong bucket",
                                         (unsigned long)b->addr);
                if (prev && prev->free && prev->owner == b->owner)
                    return gm__set_error(GM_INTERNAL, "free blocks %#lx and %#lx not merged",
                                         (unsigned long)prev->addr, (unsigned long)b->addr);
                /* Is it in its owner's list? */
                unsigned fl = b->bucket / GM_SL_COUNT, sl = b->bucket % GM_SL_COUNT;
                gm__block_t *x = b->owner->idx[c].heads[fl][sl];
                while (x && x != b) x = x->fnext;
                if (!x)
                    return gm__set_error(GM_INTERNAL, "free block %#lx missing from its index",
                                         (unsigned long)b->addr);
            } else if (!b->pending) {
                live++;
                active += b->size;
                allocated += b->requested;
                if (gm__hash_get(&pool->live, b->addr) != b)
                    return gm__set_error(GM_INTERNAL, "live block %#lx missing from the table",
                                         (unsigned long)b->addr);
            }
        }
        if (at != a->base + a->size)
            return gm__set_error(GM_INTERNAL, "arena %d: blocks do not cover it", c);
    }
    GM_CHECK(gm__pages_check_locked(pool));
    gm__stream_t *owners[1 + 64];
    size_t n_owners = 0;
    owners[n_owners++] = &pool->global;
    for (size_t i = 0; i < pool->n_streams && n_owners < 65; i++) owners[n_owners++] = pool->streams[i];
    for (size_t i = 0; i < n_owners; i++)
        for (int c = 0; c < GM_CLASS_COUNT; c++) idx_count[c] += owners[i]->idx[c].count;
    size_t indexed = 0;
    for (int c = 0; c < GM_CLASS_COUNT; c++) indexed += idx_count[c];
    if (pool->n_streams < 64 && indexed != free_blocks)
        return gm__set_error(GM_INTERNAL, "indexes hold %zu blocks, arenas %lu free blocks",
                             indexed, (unsigned long)free_blocks);
    if (live != pool->live.count || live != pool->st.live_blocks)
        return gm__set_error(GM_INTERNAL, "live blocks: %lu found, table %zu, counter %lu",
                             (unsigned long)live, pool->live.count,
                             (unsigned long)pool->st.live_blocks);
    if (active != pool->st.active || allocated != pool->st.allocated)
        return gm__set_error(GM_INTERNAL, "active/allocated counters drifted");
    /* Stream states: table and list agree; users == live blocks allocated
     * on it + pending blocks freed on it + record_stream entries naming it,
     * summed over all states. */
    size_t users = 0, refs = 0;
    for (size_t i = 0; i < pool->n_streams; i++) {
        gm__stream_t *t = pool->streams[i];
        if (t->slot != i || stream_find_locked(pool, t->handle) != t)
            return gm__set_error(GM_INTERNAL, "stream state %zu not found by its handle", i);
        users += t->users;
    }
    size_t in_tab = pool->stream_of.count + (pool->null_stream != NULL);
    if (in_tab != pool->n_streams)
        return gm__set_error(GM_INTERNAL, "stream table holds %zu states, list %zu", in_tab,
                             pool->n_streams);
    for (int c = 0; c < GM_CLASS_COUNT; c++)
        for (gm__block_t *b = pool->arena[c].first; b; b = b->next) {
            if (b->free) continue;
            refs++;
            for (gm__recorded_t *r = b->recorded; r; r = r->next) refs++;
        }
    if (users != refs)
        return gm__set_error(GM_INTERNAL, "stream users sum to %zu, blocks and records say %zu",
                             users, refs);
    return GM_OK;
}

void gm__alloc_fini(gm_pool_t *pool)
{
    while (pool->pending) {
        gm__block_t *b = pool->pending;
        pool->pending = b->fnext;
        destroy_recorded(pool, b);
    }
    for (int c = 0; c < GM_CLASS_COUNT; c++)
        for (gm__block_t *b = pool->arena[c].first; b; b = b->next)
            if (b->recorded) destroy_recorded(pool, b);
    for (size_t i = 0; i < pool->n_streams; i++) {
        if (pool->streams[i]->event) {
            int rc;
            GM_BK(rc, pool, event_destroy, (pool->bk, pool->streams[i]->event));
            (void)rc;
        }
        gm__free(pool->streams[i]);
    }
    gm__free(pool->streams);
    gm__hash_fini(&pool->stream_of);
    for (size_t i = 0; i < pool->n_slabs; i++) gm__free(pool->slabs[i]);
    gm__free(pool->slabs);
    gm__hash_fini(&pool->live);
}
