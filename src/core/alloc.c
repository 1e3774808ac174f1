/* SPDX-License-Identifier: Apache-2.0 */
/*
 * alloc.c — the device allocator: blocks of the arenas, handed out and
 * freed through the free-memory engine (freemem.h), with the device's
 * policy and the parts only the device has (gm_record_stream's pending
 * blocks, stream states freed when idle, the arena's first block).
 *
 * The device's policy: free blocks sit in two-level segregated-fit indexes
 * (32 buckets per power of two over 256-byte units); a lookup checks a few
 * blocks of the request's own bucket for the tightest fit — so a training
 * step that frees and re-requests the same sizes gets the same places back —
 * and otherwise takes any block from the next non-empty bucket, which always
 * fits.  A block freed on a stream also absorbs its global neighbours, so the
 * free ranges stay maximal.  The global index is the only place whose pages
 * may be unmapped (see pages.c): the engine's callbacks keep the page state.
 *
 * Live blocks are found by address in the pool's address table.  Stream
 * states are freed when idle (see "stream states" below), so a workload
 * touching many streams holds about as many states as streams in use.
 *
 * Every function here expects the pool lock to be held.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/pool.h"

#define SLAB_BLOCKS 1024

/* ---- the device's policy ---------------------------------------------------- */

/* A free produced free block b; only pages near the newly freed range
 * [lo, hi) can have changed state.  Those wholly inside b give up their
 * physical pages now, fenced by the freeing stream's free number (none in
 * the global index, where every free has passed). */
static void freed(gm_pool_t *pool, gm__block_t *b, uintptr_t lo, uintptr_t hi)
{
    uintptr_t page = pool->page;
    uintptr_t wlo = lo - b->addr >= page ? lo - page : b->addr;
    uintptr_t whi = b->addr + b->size - hi >= page ? hi + page : b->addr + b->size;
    gm__stream_t *fs = b->owner->is_global ? NULL : b->owner;
    gm__pages_mark_unused_locked(pool, b->arena, wlo, whi - wlo, fs, b->free_seq);
}

/* One stream in use (has allocated: the default stream's state, made with
 * the pool, counts only once used): its frees of large blocks merge with the
 * arena's untouched tail, so the free ranges are those of a single index (a
 * second stream gets the untouched part back at once: give_back_tails).  In
 * the small arena only a free range of GM_SMALL_MAX or more merges with the
 * tail: a small block freed next to it stays a block of its own, which the
 * next request of its size takes whole with its page still owned (a merge
 * would split the tail again and hand the page back and forth at every
 * alloc+free pair). */
static bool sole_stream(gm_pool_t *pool) { return pool->n_active <= 1; }
static bool take_tail(gm_pool_t *pool, const gm__block_t *tail, const gm__block_t *freed)
{
    return (tail->cls == GM_CLASS_LARGE || freed->size >= GM_SMALL_MAX) && sole_stream(pool);
}

static const gm__fm_policy_t DEVICE = {
    .sl_bits = GM_SL_BITS,
    .take_global = true,
    .take_tail = take_tail,
    .migrate_reversed = true,
    .reclaim_eager = true,
    .freed = freed,
};

static gm__block_t *release_block(gm_pool_t *pool, gm__block_t *b, gm__stream_t *owner)
{
    return gm__fm_release(pool, &DEVICE, &pool->blocks, b, owner);
}

int gm__alloc_arena_ready_locked(gm_pool_t *pool, gm__arena_t *a)
{
    gm_assert_internal(a->first == NULL && a->size > 0);
    if (!pool->blocks.per_slab) pool->blocks.per_slab = SLAB_BLOCKS;
    gm__block_t *b = gm__slab_new(&pool->blocks);
    if (!b) return gm__set_error(GM_NO_HOST_MEMORY, "gm_pool_create: out of host memory for a block");
    b->addr = a->base;
    b->size = a->size;
    b->arena = a;
    b->cls = (uint8_t)a->cls;
    a->first = b;
    a->hwm = a->base;
    gm__fm_seed(&DEVICE, b, &pool->global);
    return GM_OK;
}

/* ---- stream states ------------------------------------------------------------ */

/* Stream states are kept only while they matter: a state with no free
 * blocks, no pending event and no users (live or pending blocks,
 * record_stream entries) is idle, and the sweep run when the count of states
 * reaches streams_sweep_at (twice what the last sweep kept, at least
 * STREAM_SWEEP_MIN) frees the idle ones after letting finished streams hand
 * their free blocks to everyone.  So a trace touching 65 535 streams holds
 * about as many states as streams in use, and each creation costs O(1)
 * amortized.  The default stream's state is kept. */
#define STREAM_SWEEP_MIN 64

static bool stream_idle(const gm__stream_t *s)
{
    return !s->pinned && !s->is_global && s->users == 0 && !s->ev_pending && !gm__fm_held(s);
}

static size_t reclaim_streams(gm_pool_t *pool, const gm__stream_t *except);

/* Drop an idle state; pages whose (passed) fences name it forget it. */
static void forget_stream(gm_pool_t *pool, gm__stream_t *s)
{
    if (s->active) pool->n_active--;
    gm__pages_forget_stream_locked(pool, s);
    gm__streams_forget(pool, &pool->streams, s);
}

static void streams_sweep_locked(gm_pool_t *pool)
{
    reclaim_streams(pool, NULL); /* finished streams hand their free blocks over */
    for (size_t i = pool->streams.n; i-- > 0;)
        if (stream_idle(pool->streams.all[i])) forget_stream(pool, pool->streams.all[i]);
    pool->streams_sweep_at = 2 * pool->streams.n > STREAM_SWEEP_MIN ? 2 * pool->streams.n
                                                                    : STREAM_SWEEP_MIN;
}

size_t gm__stream_count_locked(gm_pool_t *pool) { return pool->streams.n; }

/* The last block of arena a (the one holding its untouched tail). */
static gm__block_t *last_block(const gm__arena_t *a)
{
    gm__block_t *b = a->first;
    while (b && b->next) b = b->next;
    return b;
}

/* Where the space no work ever touched starts in a's free last block:
 * the arena's high-water mark, page aligned, or the block's start. */
static uintptr_t untouched_from(const gm_pool_t *pool, const gm__arena_t *a,
                                const gm__block_t *last)
{
    uintptr_t from = a->hwm > last->addr ? a->hwm : last->addr;
    return a->base + GM_ALIGN_UP(from - a->base, pool->page);
}

/* Free block `last` split at cut (inside it): the part before cut stays a
 * free block of its index, as it was; returns the part from cut on, a free
 * block of the same index (last itself when cut is its start), or NULL when
 * no record can be had for the split. */
static gm__block_t *split_at(gm_pool_t *pool, gm__block_t *last, uintptr_t cut)
{
    if (cut == last->addr) return last;
    gm__stream_t *owner = last->owner;
    if (gm__fm_take(&pool->blocks, DEVICE.sl_bits, last, cut - last->addr, true) != GM_OK) {
        gm__clear_error();
        return NULL;
    }
    last->free = 1;
    gm__fm_insert(&owner->idx[last->cls], last, DEVICE.sl_bits);
    return last->next;
}

/* A second stream is in use: the untouched part of an arena's tail that the
 * sole stream absorbed goes back to the global index, where every stream
 * finds it.  No work ever touched that space, so no stream needs to pass
 * anything first. */
static void give_back_tails(gm_pool_t *pool)
{
    for (int c = 0; c < GM_CLASS_COUNT; c++) {
        gm__arena_t *a = &pool->arena[c];
        gm__block_t *last = last_block(a);
        if (!last || !last->free || last->owner->is_global) continue;
        uintptr_t cut = untouched_from(pool, a, last);
        if (cut >= last->addr + last->size) continue;
        gm__block_t *b = split_at(pool, last, cut);
        if (!b) continue;
        gm__fm_remove(&b->owner->idx[c], b);
        release_block(pool, b, &pool->global);
    }
}

/* A stream not known yet: a sweep when one is due, then its new state.
 * Kept apart so that the lookup's cache check inlines into callers. */
__attribute__((noinline)) static gm__stream_t *stream_add_locked(gm_pool_t *pool,
                                                                 gm_stream_t handle)
{
    if (pool->streams.n >= pool->streams_sweep_at) streams_sweep_locked(pool);
    gm__stream_t *s = gm__streams_add(&pool->streams, handle);
    if (s) s->pinned = handle == NULL;
    return s;
}

gm__stream_t *gm__stream_get_locked(gm_pool_t *pool, gm_stream_t handle)
{
    gm__stream_t *s = gm__streams_find(&pool->streams, handle);
    return GM_LIKELY(s != NULL) ? s : stream_add_locked(pool, handle);
}

/* ---- pending blocks (gm_record_stream) ------------------------------------------ */

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

void gm__block_drop_recorded_locked(gm_pool_t *pool, gm__block_t *b)
{
    if (b->recorded) destroy_recorded(pool, b);
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
    if (r->stream->retired) { /* its work was waited for when it was forgotten */
        r->unordered = false;
        return;
    }
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
        gm_assert_internal(b->pending && !b->free);
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

/* ---- the stream rule ------------------------------------------------------------ */

/* Could reclaim_streams(pool, except) do anything: a block waiting for its
 * recorded streams, or another stream holding free blocks or an event not
 * yet known done?  (If not, it would make no call and move nothing.) */
static bool others_hold(const gm_pool_t *pool, const gm__stream_t *except)
{
    if (pool->pending) return true;
    for (size_t i = 0; i < pool->streams.n; i++) {
        const gm__stream_t *t = pool->streams.all[i];
        if (t != except && (t->ev_pending || gm__fm_held(t))) return true;
    }
    return false;
}

/* Let other streams' freed blocks reach the global index without waiting:
 * the engine's reclaim step on every stream but `except` (one query per
 * stream holding blocks, one record when its last event was consumed). */
static size_t reclaim_streams(gm_pool_t *pool, const gm__stream_t *except)
{
    size_t moved = 0;
    if (pool->pending) moved += process_pending(pool); /* recorded streams may have passed */
    for (size_t i = 0; i < pool->streams.n; i++) {
        gm__stream_t *t = pool->streams.all[i];
        if (t == except) continue;
        moved += gm__fm_reclaim(pool, &DEVICE, &pool->blocks, t, &pool->global);
    }
    gm__clear_error();
    return moved;
}

void gm__drain_streams_locked(gm_pool_t *pool)
{
    if (pool->pending) process_pending(pool);
    for (size_t i = 0; i < pool->streams.n; i++) {
        gm__stream_t *s = pool->streams.all[i];
        /* A stream still in flight keeps its blocks where they are. */
        if (gm__fm_held(s))
            (void)gm__fm_sync_migrate(pool, &DEVICE, &pool->blocks, s, &pool->global);
    }
    gm__clear_error(); /* a held stream's NOT_READY is no error of the caller's */
}

/* The stream is about to be destroyed: no event may be recorded on it again.
 * Wait for its work if it holds free blocks, and hand them to every stream;
 * its state is forgotten when that leaves it idle. */
int gm__stream_retire_locked(gm_pool_t *pool, gm_stream_t handle)
{
    /* Blocks freed on it may wait in threads' caches, which belong to their
     * threads: wait for the stream now and note it (forget_epoch); a cache
     * gives such a block back later as passed (tcache.c). */
    bool synced = false;
    if (handle && gm__tcache_held_any_locked(pool)) {
        int rc;
        GM_BK(rc, pool, stream_sync, (pool->bk, handle));
        if (rc != GM_OK) return rc;
        synced = true;
        uint32_t e = atomic_load_explicit(&pool->forget_epoch, memory_order_relaxed) + 1;
        pool->forgot[pool->forgot_next % GM_FORGOT_RING].handle = handle;
        pool->forgot[pool->forgot_next % GM_FORGOT_RING].epoch = e;
        pool->forgot_next++;
        atomic_store_explicit(&pool->forget_epoch, e, memory_order_release);
    }
    gm__stream_t *s = gm__streams_find(&pool->streams, handle);
    if (!s) return GM_OK;
    size_t held = gm__fm_held(s);
    /* Pending blocks whose order after s could not be set up yet cannot
     * get an event on s later: they need the wait too. */
    bool unordered = false, owns_pending = false;
    for (gm__block_t *b = pool->pending; b; b = b->fnext) {
        if (b->owner == s) owns_pending = true;
        for (gm__recorded_t *r = b->recorded; r; r = r->next)
            if (r->unordered && r->stream == s) unordered = true;
    }
    /* Blocks freed on s that wait for other streams: once those pass, they
     * would go into s's index, which no one would ever drain (s is gone).
     * Wait for s now, and they become the global index's (freed on a stream
     * that has passed the free). */
    if (held || unordered || owns_pending) {
        GM_CHECK(gm__fm_sync_migrate(pool, &DEVICE, &pool->blocks, s, &pool->global));
        for (gm__block_t *b = pool->pending; b; b = b->fnext) {
            for (gm__recorded_t *r = b->recorded; r; r = r->next)
                if (r->stream == s) r->unordered = false;
            if (b->owner == s) {
                s->users--;
                b->owner = &pool->global;
                pool->global.users++;
            }
        }
    }
    /* Its event (recorded on a finished stream) is not needed any more. */
    if (s->ev_pending) {
        int rc;
        GM_BK(rc, pool, event_query, (pool->bk, s->event));
        if (rc == GM_OK) s->ev_pending = false;
        gm__clear_error();
    }
    if (stream_idle(s)) {
        forget_stream(pool, s);
        return GM_OK;
    }
    if (s->pinned) return GM_OK; /* the default stream is never destroyed */
    /* Live blocks allocated on it, or gm_record_stream entries, still name
     * it: wait for its work once, and from now on nothing calls the backend
     * with its handle (an offload's stream rule, a free's event for a
     * recorded stream); the handle finds a new state (gm__streams_detach). */
    if (!synced) { /* waited for above already, when caches held blocks */
        int rc;
        GM_BK(rc, pool, stream_sync, (pool->bk, s->handle));
        if (rc != GM_OK) return rc;
    }
    s->ev_pending = false;
    s->done_seq = s->mig_seq = s->free_seq;
    if (s->active) { /* it allocates no more */
        s->active = false;
        pool->n_active--;
    }
    gm__streams_detach(&pool->streams, s);
    return GM_OK;
}

gm__stream_t *gm__stream_forgotten_locked(gm_pool_t *pool, gm_stream_t handle)
{
    for (size_t i = 0; i < pool->streams.n; i++) {
        gm__stream_t *t = pool->streams.all[i];
        if (t->retired && t->handle == handle) return t;
    }
    gm__stream_t *s = gm__streams_add_detached(&pool->streams, handle);
    return s ? s : gm__stream_get_locked(pool, handle);
}

/* ---- allocation ---------------------------------------------------------------- */


/* Taken block b (live now) becomes the allocation of `size` on s: pages
 * marked used and mapped, and the block in the live table. */
static int serve(gm_pool_t *pool, gm__block_t *b, size_t size, gm__stream_t *s, unsigned how)
{
    b->owner = s; /* counted in s->users once the allocation succeeds */
    b->requested = size;
    atomic_store_explicit(&b->tc_gen, ++pool->tc_next, memory_order_release);
    if (b->addr + b->size > b->arena->hwm) b->arena->hwm = b->addr + b->size;
    gm__pages_mark_used_locked(b->arena, b->addr, b->size, pool->page_shift);
    int rc = gm__pages_ensure_mapped_locked(pool, b->arena, b->addr, b->size, size, s, how);
    if (GM_LIKELY(rc == GM_OK)) rc = gm__hash_put(&pool->live, b->addr, b);
    return rc;
}

/* A block of asize bytes of address space no work ever touched (above the
 * high-water mark of class cls's arena), taken out of the arena's last free
 * block when s may use it (global, or s's own); NULL when there is none. */
static gm__block_t *take_untouched(gm_pool_t *pool, int cls, size_t asize, gm__stream_t *s)
{
    gm__arena_t *a = &pool->arena[cls];
    gm__block_t *last = last_block(a);
    if (!last->free || (last->owner != s && !last->owner->is_global)) return NULL;
    uintptr_t end = last->addr + last->size, cut = untouched_from(pool, a, last);
    if (cut > end || end - cut < asize) return NULL;
    gm__block_t *b = split_at(pool, last, cut);
    if (!b) return NULL;
    gm__stream_t *owner = b->owner;
    if (gm__fm_take(&pool->blocks, DEVICE.sl_bits, b, asize, true) != GM_OK) {
        gm__fm_remove(&owner->idx[cls], b); /* merged back with what was split off */
        release_block(pool, b, owner);
        return NULL;
    }
    return b;
}

/* The tightest free block for size: the stream's own index, then the global
 * one (ties go to the lower address). */
static gm__block_t *find_for(gm_pool_t *pool, gm__stream_t *s, int cls, size_t size)
{
    gm__block_t *b = gm__fm_find_best(&s->idx[cls], size, DEVICE.sl_bits);
    if (!b || b->size != size) {
        gm__block_t *g = gm__fm_find_best(&pool->global.idx[cls], size, DEVICE.sl_bits);
        if (g && (!b || g->size < b->size || (g->size == b->size && g->addr < b->addr))) b = g;
    }
    return b;
}

/* ---- placement while the pool churns ------------------------------------------ */

/* Blocks looked at, per index, for one that needs no backend call. */
#define PLACE_SCAN 16

/* The first free block of idx that fits want, among the first PLACE_SCAN
 * looked at from want's bucket up (smallest buckets first), whose first
 * asize bytes s can use with no backend call: every page owned already, or
 * its own mapping's physical page free for s.  NULL when none of them can. */
static gm__block_t *find_cheap_in(gm_pool_t *pool, const gm__freeidx_t *idx, size_t want,
                                  size_t asize, const gm__stream_t *s)
{
    if (!idx->fl_bits) return NULL;
    uint32_t bk = gm__fm_bucket(want, DEVICE.sl_bits);
    unsigned fl = bk / GM_SL_COUNT, sl = bk % GM_SL_COUNT;
    int budget = PLACE_SCAN;
    for (; gm__fm_next_bucket(idx, &fl, &sl); sl++) {
        for (gm__block_t *b = idx->heads[fl][sl]; b; b = b->fnext) {
            if (--budget < 0) return NULL;
            if (b->size >= want && gm__pages_cheap_locked(pool, b->arena, b->addr, asize, s))
                return b;
        }
    }
    return NULL;
}

/* Best fit b (a large block, in s's index or the global one) would make
 * the allocation remap a page: a page of its range is mapped to a physical
 * page another live range owns, which costs an unmap, a map and an access
 * change.  While the pool churns (the controller saw more remapping than
 * the churn target, and one stream allocates), a free block that needs no
 * call at all is taken instead when one is found among the first few that
 * fit; else b.  Best fit is what keeps a repeating step's placement (and
 * so its pages) the same from step to step, so it is left only while
 * placement is not settling anyway: a random mix of large sizes, one heap
 * of many threads.  Only the choice of block changes: the stream rule
 * (s's own index, or the global one) is find_for's. */
static gm__block_t *place_churning(gm_pool_t *pool, gm__stream_t *s, int cls, gm__block_t *b,
                                   size_t want, size_t asize)
{
    if (gm__pages_ready_locked(b->arena, b->addr, asize, pool->page_shift) ||
        !gm__pages_remap_locked(pool, b->arena, b->addr, asize))
        return b;
    gm__block_t *c = find_cheap_in(pool, &s->idx[cls], want, asize, s);
    if (!c) c = find_cheap_in(pool, &pool->global.idx[cls], want, asize, s);
    return c ? c : b;
}

/* ---- the churn controller ---------------------------------------------------------- */

/* Allocations per window (about twice as many operations): a pool's, and a
 * heap's where the pool has several (a heap sees one thread's share of the
 * work, so a window of the pool's size would take it a whole run). */
#define CTL_WINDOW 32768
#define CTL_WINDOW_HEAP 4096
/* Slack step, the most steps one window may take, and the allocations
 * without a remapping call (whole windows) before a step back. */
#define CTL_STEP 0.004
#define CTL_STEPS_MAX 16
#define CTL_QUIET_ALLOCS (16u * CTL_WINDOW)

/* The most the controller may raise pool's slack to: reserve_slack_max (or
 * reserve_slack, if larger), and for a heap of several, heap_slack_max when
 * larger still. */
static double ctl_top(const gm_pool_t *pool)
{
    const gm_pool_config_t *cfg = &pool->cfg;
    double top = cfg->reserve_slack_max > cfg->reserve_slack ? cfg->reserve_slack_max
                                                             : cfg->reserve_slack;
    if (pool->root->heaps_max > 1 && cfg->heap_slack_max > top) top = cfg->heap_slack_max;
    return top;
}

void gm__controller_init(gm_pool_t *pool)
{
    /* One heap starts at reserve_slack and the controller raises it when
     * pages move.  A heap of several starts at its ceiling: a program that
     * turns heaps on has chosen speed over memory, and each thread's first
     * pass would otherwise remap pages while the slack climbs (16 threads
     * on the sim: 118 000 calls in the first pass, against 48 000, nearly
     * all of them new pages, when started at 0.2, for the same reserved
     * peak).  Quiet windows step it back down, as for one heap. */
    bool heaps = pool->root->heaps_max > 1;
    pool->slack_eff = heaps ? ctl_top(pool) : pool->cfg.reserve_slack;
    pool->ctl_window = heaps ? CTL_WINDOW_HEAP : CTL_WINDOW;
    pool->ctl_allocs = 0;
    pool->ctl_quiet = 0;
}

/* Calls that move pages without growing the pool: maps beyond the new
 * pages' own, unmaps, and the events and waits that fence them. */
static uint64_t remap_calls(gm_pool_t *pool)
{
    const _Atomic uint64_t *c = pool->bk_calls.count;
    uint64_t maps = atomic_load_explicit(&c[GM_CALL_map], memory_order_relaxed);
    uint64_t made = atomic_load_explicit(&c[GM_CALL_phys_create], memory_order_relaxed);
    return (maps > made ? maps - made : 0) +
           atomic_load_explicit(&c[GM_CALL_unmap], memory_order_relaxed) +
           atomic_load_explicit(&c[GM_CALL_event_record], memory_order_relaxed) +
           atomic_load_explicit(&c[GM_CALL_event_query], memory_order_relaxed) +
           atomic_load_explicit(&c[GM_CALL_stream_sync], memory_order_relaxed);
}

/* End of a window: more remapping than the user's target raises the slack
 * (up to the ceiling) by a step per multiple of the target the window made,
 * at most CTL_STEPS_MAX: a workload churning far over the target reaches
 * the slack it needs in a few windows, not in one window per 0.004.  A long
 * quiet stretch lowers it one step (down to the floor; gm_trim or the
 * release threshold returns the pages no longer needed). */
static void controller_step(gm_pool_t *pool)
{
    pool->ctl_allocs = 0;
    uint64_t calls = remap_calls(pool);
    uint64_t delta = calls - pool->ctl_calls;
    pool->ctl_calls = calls;
    const gm_pool_config_t *cfg = &pool->cfg;
    double target = cfg->churn_target * 2.0 * pool->ctl_window / 1000.0; /* calls a window */
    if ((double)delta > target) {
        pool->ctl_quiet = 0;
        pool->churning = true;
        double k = target > 0 ? (double)delta / target : CTL_STEPS_MAX;
        unsigned steps = k < CTL_STEPS_MAX ? (unsigned)k : CTL_STEPS_MAX;
        double up = pool->slack_eff + CTL_STEP * steps;
        double top = ctl_top(pool);
        pool->slack_eff = up < top ? up : top;
    } else if (delta == 0 && ++pool->ctl_quiet >= CTL_QUIET_ALLOCS / pool->ctl_window) {
        pool->ctl_quiet = 0;
        pool->churning = false;
        double down = pool->slack_eff - CTL_STEP;
        pool->slack_eff = down > cfg->reserve_slack ? down : cfg->reserve_slack;
    } else if (delta != 0) {
        pool->ctl_quiet = 0;
    }
}

/* A refused allocation (no room: the limit, the device, a broker's quota)
 * gives back the pages it had mapped for its range before the refusal:
 * kept, they would sit in this pool unused while the memory is short (under
 * a broker, a part of the tenant's quota no other process of it could
 * have).  The streams are drained first (the range's pages are fenced by
 * its stream's free, and pages it took back may still be in that stream's
 * queued work); a page that cannot be released yet stays cached.  The
 * refusal's message stands.  Lock held. */
static void give_back_attempt(gm_pool_t *pool, gm__arena_t *a, uintptr_t addr, size_t size)
{
    char why[1024];
    snprintf(why, sizeof why, "%s", gm_last_error());
    gm__drain_streams_locked(pool);
    /* Best effort: what stays is a trim's to give back. */
    (void)gm__pages_release_range_locked(pool, a, addr, size, NULL);
    gm__clear_error();
    gm__set_error(GM_OK, "%s", why);
}

/* b (free, in its index) moved on to the first align boundary inside it:
 * the part before stays free where it was.  b itself when it is aligned
 * already; NULL when no record can be had for the split. */
static gm__block_t *align_free_block(gm_pool_t *pool, gm__block_t *b, size_t align)
{
    gm__arena_t *a = b->arena;
    uintptr_t cut = a->base + GM_ALIGN_UP(b->addr - a->base, align);
    return split_at(pool, b, cut);
}

int gm__alloc_locked(gm_pool_t *pool, size_t size, size_t align, gm__stream_t *s, gm_tag_t tag,
                     void **ptr)
{
    if (GM_UNLIKELY(++pool->ctl_allocs >= pool->ctl_window)) controller_step(pool);
    gm_assert_internal(size > 0 && size <= GM_MAX_REQUEST && s != NULL && !s->is_global);
    size_t asize = GM_ALIGN_UP(size, align); /* whole pages for an aligned block */
    int cls = asize <= GM_SMALL_MAX ? GM_CLASS_SMALL : GM_CLASS_LARGE;
    /* An aligned block is looked for with room to move to the boundary
     * (free blocks start at multiples of GM_ALIGNMENT). */
    size_t want = GM_UNLIKELY(align > GM_ALIGNMENT) ? asize + align - GM_ALIGNMENT : asize;

    if (GM_UNLIKELY(!s->active)) {
        s->active = true;
        if (++pool->n_active == 2) give_back_tails(pool);
    }
    gm__block_t *b = find_for(pool, s, cls, want);
    if (GM_UNLIKELY(!b)) {
        /* No address range left: free ranges may wait in other streams. */
        gm__drain_streams_locked(pool);
        b = gm__fm_find_best(&pool->global.idx[cls], want, DEVICE.sl_bits);
        if (!b) b = gm__fm_find_best(&s->idx[cls], want, DEVICE.sl_bits);
        if (!b) {
            return gm__set_error(GM_OUT_OF_MEMORY,
                                 "gm_alloc: cannot allocate %zu bytes: the pool's address space "
                                 "is exhausted (fragmented by blocks still in flight)", size);
        }
    }
    /* Blocks other streams finished with may serve it with no mapping —
     * worth asking their events only when this block needs backend calls
     * (the move may also have merged b away: look again). */
    if (pool->streams.n > 1 && others_hold(pool, s) &&
        !gm__pages_ready_locked(b->arena, b->addr, asize, pool->page_shift) &&
        !gm__pages_cheap_locked(pool, b->arena, b->addr, asize, s) && reclaim_streams(pool, s) > 0)
        b = find_for(pool, s, cls, want);
    if (GM_UNLIKELY(pool->churning) && cls == GM_CLASS_LARGE && asize >= pool->page &&
        align == GM_ALIGNMENT && sole_stream(pool))
        b = place_churning(pool, s, cls, b, want, asize);
    if (GM_UNLIKELY(align > GM_ALIGNMENT) && !(b = align_free_block(pool, b, align)))
        return gm__set_error(GM_NO_HOST_MEMORY, "gm_alloc: out of host memory for a block");
    gm__stream_t *owner = b->owner;
    if (GM_UNLIKELY(gm__fm_take(&pool->blocks, DEVICE.sl_bits, b, asize, true) != GM_OK))
        return gm__set_error(GM_NO_HOST_MEMORY, "gm_alloc: out of host memory for a block");
    /* A publishable block (whole pages) has a handle per page; a tagged one
     * lies on extents where it can, as after its restores. */
    unsigned how = align >= pool->page ? GM__MAP_SOLO : tag != GM_TAG_NONE ? GM__MAP_EXTENTS : 0;
    int rc = serve(pool, b, size, s, how);
    if (GM_UNLIKELY(rc == GM_NOT_READY)) {
        /* A page of the range must be remapped under work that cannot be
         * waited for: untouched address space needs no remap. */
        release_block(pool, b, owner);
        b = take_untouched(pool, cls, asize, s);
        if (!b) return gm__set_error(GM_OUT_OF_MEMORY, "gm_alloc: cannot allocate %zu bytes: "
                                     "the pool's address space is exhausted", size);
        owner = b->owner;
        rc = serve(pool, b, size, s, how);
    }
    if (GM_UNLIKELY(rc != GM_OK)) {
        uintptr_t at = b->addr;
        gm__arena_t *arena = b->arena;
        release_block(pool, b, owner);
        if (rc == GM_LIMIT || rc == GM_OUT_OF_MEMORY) give_back_attempt(pool, arena, at, asize);
        if (rc == GM_NO_HOST_MEMORY) return gm__set_error(rc, "gm_alloc: out of host memory");
        /* GM_LIMIT / GM_OUT_OF_MEMORY: worded by the page layer
         * (gm__pages_refuse_locked); a backend failure: its message stands */
        return rc;
    }
    b->tag = (uint16_t)tag;
    b->offloaded = 0;
    b->host_copy = NULL;
    if (GM_UNLIKELY(tag != GM_TAG_NONE)) {
        if (pool->hooks->tagged_alloc_locked) pool->hooks->tagged_alloc_locked(pool, b);
    }
    else if (size <= GM_TC_LARGE_MAX) gm__tcache_note_alloc_locked(pool, b); /* its free may be fast */
    s->users++;
    pool->st.allocated += size;
    pool->st.active += asize;
    pool->st.alloc_count++;
    pool->st.live_blocks++;
    if (pool->st.allocated > pool->st.allocated_peak) {
        gm__fam_peak_add(pool, (int64_t)(pool->st.allocated - pool->st.allocated_peak));
        pool->st.allocated_peak = pool->st.allocated;
    }
    if (pool->st.active > pool->st.active_peak) pool->st.active_peak = pool->st.active;
    *ptr = (void *)b->addr;
    return GM_OK;
}

/* ---- free ---------------------------------------------------------------------- */

gm__block_t *gm__block_at_locked(gm_pool_t *pool, uintptr_t p)
{
    for (int c = 0; c < GM_CLASS_COUNT; c++) {
        gm__arena_t *a = &pool->arena[c];
        if (p < a->base || p >= a->base + a->size) continue;
        for (gm__block_t *b = a->first; b; b = b->next)
            if (p >= b->addr && p < b->addr + b->size) return b;
    }
    return NULL;
}

/* Explain why ptr is not a live block of this pool (error path only). */
static int bad_free(gm_pool_t *pool, void *ptr)
{
    uintptr_t p = (uintptr_t)ptr;
    gm__block_t *b = gm__block_at_locked(pool, p);
    if (!b)
        return gm__set_error(GM_INVALID_POINTER, "gm_free: %p was not allocated by this pool", ptr);
    if (b->free || b->pending) {
        if (b->addr == p) return gm__set_error(GM_DOUBLE_FREE, "gm_free: %p was already freed", ptr);
        return gm__set_error(GM_DOUBLE_FREE, "gm_free: %p lies in free memory (already freed?)",
                             ptr);
    }
    return gm__set_error(GM_INVALID_POINTER,
                         "gm_free: %p points inside the live block %p of %zu bytes, not at its "
                         "start", ptr, (void *)b->addr, b->requested);
}

int gm__free_locked(gm_pool_t *pool, void *ptr, gm__stream_t *s, size_t *freed, bool *held)
{
    gm_assert_internal(s != NULL && !s->is_global);
    gm__block_t *b = gm__hash_take(&pool->live, (uintptr_t)ptr);
    if (GM_UNLIKELY(!b)) return bad_free(pool, ptr);
    /* Claimed against a thread caching it at this moment (tcache.c claims
     * it the same way): the loser reports the double free. */
    uint32_t unclaimed = 0;
    if (GM_UNLIKELY(!atomic_compare_exchange_strong(&b->tc_cached, &unclaimed, 2))) {
        /* Back where it was: the table just had room for it. */
        int rc = gm__hash_put(&pool->live, b->addr, b);
        gm_assert_internal(rc == GM_OK);
        (void)rc;
        return gm__set_error(GM_DOUBLE_FREE, "gm_free: %p was already freed (it waits in a "
                             "thread's cache of small blocks)", ptr);
    }
    if (GM_UNLIKELY(b->shared)) {
        /* Published or imported elsewhere: the shared kind's free takes it
         * (gm__kind_shared), and it is freed when the last peer lets go. */
        atomic_store_explicit(&b->tc_cached, 0, memory_order_relaxed);
        int rc = gm__hash_put(&pool->live, b->addr, b);
        gm_assert_internal(rc == GM_OK && held != NULL);
        (void)rc;
        *held = true;
        return GM_OK;
    }
    *freed = b->requested;
    if (GM_UNLIKELY(b->tag != GM_TAG_NONE) && pool->hooks->tagged_free_locked)
        pool->hooks->tagged_free_locked(pool, b);
    atomic_store_explicit(&b->tc_gen, ++pool->tc_next, memory_order_release);
    /* After the new generation: a cache that claims it from now on sees it. */
    atomic_store_explicit(&b->tc_cached, 0, memory_order_release);
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
    /* A page this block shared with an offloaded neighbour holds nothing
     * resident once the free has passed: the next trim looks (offload.c). */
    if (GM_UNLIKELY(pool->st.offloaded) &&
        ((b->prev && !b->prev->free && gm__block_off_device(b->prev)) ||
         (b->next && !b->next->free && gm__block_off_device(b->next))))
        pool->offl_dirty = true;
    release_block(pool, b, s);
    return GM_OK;
}

int gm__record_stream_locked(gm_pool_t *pool, void *ptr, gm__stream_t *s)
{
    gm_assert_internal(s != NULL && !s->is_global);
    gm__block_t *b = gm__hash_get(&pool->live, (uintptr_t)ptr);
    if (b && atomic_load_explicit(&b->tc_cached, memory_order_relaxed))
        return gm__set_error(GM_DOUBLE_FREE, "gm_record_stream: %p was already freed", ptr);
    if (!b) {
        int rc = bad_free(pool, ptr);
        return gm__set_error(rc, "gm_record_stream: %p is not a live block of this pool", ptr);
    }
    if (s == b->owner) return GM_OK;
    /* Its free must go the locked way now (pending on s). */
    atomic_store_explicit(&b->tc_gen, ++pool->tc_next, memory_order_release);
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
            if (b->addr != at || b->prev != prev || b->arena != a || b->cls != c || b->size == 0 ||
                b->size % GM_ALIGNMENT)
                return gm__set_error(GM_INTERNAL, "arena %d: block list broken at %#lx", c,
                                     (unsigned long)b->addr);
            at += b->size;
            if (b->free) {
                free_blocks++;
                GM_CHECK(gm__fm_check_free(b, DEVICE.sl_bits));
                if (prev && prev->free && prev->owner == b->owner)
                    return gm__set_error(GM_INTERNAL, "free blocks %#lx and %#lx not merged",
                                         (unsigned long)prev->addr, (unsigned long)b->addr);
            } else if (!b->pending) {
                live++;
                if (!b->offloaded) active += b->size; /* active: on the device */
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
    for (size_t i = 0; i < pool->streams.n && n_owners < 65; i++)
        owners[n_owners++] = pool->streams.all[i];
    for (size_t i = 0; i < n_owners; i++)
        for (int c = 0; c < GM_CLASS_COUNT; c++) idx_count[c] += owners[i]->idx[c].count;
    size_t indexed = 0;
    for (int c = 0; c < GM_CLASS_COUNT; c++) indexed += idx_count[c];
    if (pool->streams.n < 64 && indexed != free_blocks)
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
     * summed over all states and the global one. */
    GM_CHECK(gm__streams_check(&pool->streams));
    size_t refs = 0;
    size_t users = pool->global.users; /* pending blocks of a forgotten stream */
    for (size_t i = 0; i < pool->streams.n; i++) users += pool->streams.all[i]->users;
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
    gm__streams_fini(pool, &pool->streams);
    gm__slab_fini(&pool->blocks);
    gm__hash_fini(&pool->live);
}
