/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tcache.c — the per-thread front cache of small blocks; see tcache.h.
 *
 * Blocks over GM_TC_MAX, of any size: while one stream allocates from the
 * pool, one at a time, and only until the thread's next allocation or free
 * that takes the pool lock, which gives it back first.  Such an operation
 * would have seen the same pool had the free gone the locked way, because
 * the fast paths change nothing the pool sees; so the cache changes the
 * pool's placement only where it serves the very next allocation of the
 * size on the stream (a warm pair of 1 GiB touches no page then), and holds
 * no page other threads or later sizes could have used, beyond that one
 * block while the thread runs only fast-path operations.  Another thread's
 * trim or out-of-memory reclaim takes that block back (it may be large):
 * the owner publishes the block in its cache (large_blk), the reclaim
 * swaps it out there (under cache_mu, the pool lock held) and frees it the
 * locked way, adding what the owner's counts still hold of it to the
 * pool's tc_reclaimed; the owner swaps it out itself to hand it out or give
 * it back, and when it finds it gone puts its counts right, and the pool's
 * with them (under cache_mu, where the statistics read them).
 *
 * Locking: the fast paths touch only the calling thread's cache and one
 * atomic load of a block record's generation.  The caches of the process
 * are on one list (cache_mu, a leaf lock: nothing else is taken while it is
 * held), which the statistics read under the pool lock; a cache is bound to
 * one pool at a time, and is emptied (under that pool's lock, no other lock
 * held) before it binds to another.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/pool.h"
#include "core/tcache.h"

_Thread_local gm__tcache_t *gm__tc_self;
/* Set by the leak tracker and the trace recorder (pool.h). */
atomic_int gm__leak_on, gm__trace_on;

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static gm__tcache_t *caches; /* every thread's cache (cache_mu) */
static pthread_key_t exit_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

/* From the address bits below 2 MiB only: arenas start 2 MiB aligned at
 * addresses that change from run to run, offsets within them do not, so
 * which block a slot holds (and so a replay) is the same in every run. */
static inline unsigned slot_of(uintptr_t a)
{
    uint32_t o = (uint32_t)(a & ((1u << 21) - 1)) >> 8; /* 13 bits */
    return (o ^ (o >> 8) * 37u) % GM_TC_SLOTS;
}

/* The table entry of block (addr, requested size req): blocks over GM_TC_MAX
 * have one of their own (they often start at a 2 MiB boundary, where a
 * small block's entry would be). */
static inline unsigned entry_of(uintptr_t a, size_t req)
{
    return req > GM_TC_MAX ? GM_TC_LARGE_SLOT : slot_of(a);
}

static inline unsigned bin_of(size_t req, gm_stream_t s)
{
    uint64_t h = ((uint64_t)req ^ ((uint64_t)(uintptr_t)s * UINT64_C(0xff51afd7ed558ccd))) *
                 UINT64_C(0x9E3779B97F4A7C15);
    return (unsigned)(h >> 59) % GM_TC_BINS;
}

static inline bool observing(void)
{
    return atomic_load_explicit(&gm__leak_on, memory_order_relaxed) ||
           atomic_load_explicit(&gm__trace_on, memory_order_relaxed);
}

/* A live pool, or a live heap of one (heaps.c: a thread's cache binds to
 * the heap it allocates from). */
static inline bool live_magic(const gm_pool_t *pool)
{
    return pool->magic == GM_POOL_MAGIC || pool->magic == GM_HEAP_MAGIC;
}

/* Is tc bound to this live pool, and may the fast paths run? */
static inline bool bound(const gm__tcache_t *tc, const gm_pool_t *pool)
{
    return tc && tc->pool == pool && live_magic(pool) && tc->pool_gen == pool->tc_gen &&
           !observing() && pool->leaks == NULL;
}

static inline void count_add(_Atomic uint64_t *c, uint64_t v)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + v,
                          memory_order_relaxed); /* one writer: the owner */
}

static inline void count_sub(_Atomic uint64_t *c, uint64_t v)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) - v,
                          memory_order_relaxed);
}

/* ---- the large block ------------------------------------------------------------- */

/* The owner takes its cached large block e back, to hand out or to give to
 * the pool: true when it is still there (unpublished now); false when
 * another thread's reclaim took it, and then the entry is forgotten and the
 * counts that still held it (the cache's and the pool's correction) are
 * put right. */
static bool large_take(gm__tcache_t *tc, gm__tc_entry_t *e)
{
    tc->held_large = 0;
    tc->large_bin = 0;
    if (e->req <= GM_TC_RECLAIM_MIN) return true; /* never published */
    struct gm__block *mine = e->blk;
    if (atomic_compare_exchange_strong_explicit(&tc->large_blk, &mine, NULL, memory_order_acq_rel,
                                                memory_order_acquire))
        return true;
    /* Under cache_mu, as the reclaim added it and the statistics read it:
     * the counts move together. */
    pthread_mutex_lock(&cache_mu);
    gm_pool_t *pool = tc->pool;
    count_sub(&tc->c.held_req, e->req);
    count_sub(&tc->c.held_act, e->asize);
    count_sub(&tc->c.held_n, 1);
    count_sub(&tc->c.frees, 1);
    count_sub(&tc->c.free_bytes, e->req);
    atomic_fetch_sub_explicit(&pool->tc_reclaimed.req, e->req, memory_order_relaxed);
    atomic_fetch_sub_explicit(&pool->tc_reclaimed.act, e->asize, memory_order_relaxed);
    atomic_fetch_sub_explicit(&pool->tc_reclaimed.n, 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&pool->tc_reclaimed.frees, 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&pool->tc_reclaimed.free_bytes, e->req, memory_order_relaxed);
    pthread_mutex_unlock(&cache_mu);
    tc->held -= e->asize;
    e->addr = 0;
    e->cached = 0;
    return false;
}

int gm__tcache_alloc(gm_pool_t *pool, size_t size, gm_stream_t stream, void **ptr)
{
    gm__tcache_t *tc = gm__tc_self;
    if (!bound(tc, pool) || size > GM_TC_LARGE_MAX) return GM_NOT_READY;
    gm__tc_bin_t *bin = &tc->bins[bin_of(size, stream)];
    if (bin->n == 0 || bin->req != size || bin->stream != stream) return GM_NOT_READY;
    while (bin->n) {
        gm__tc_entry_t *e = &tc->table[bin->slot[--bin->n]];
        if (e->req > GM_TC_MAX && !large_take(tc, e)) continue; /* a reclaim took it */
        e->cached = 0;
        atomic_store_explicit(&e->blk->tc_cached, 0, memory_order_relaxed);
        tc->held -= e->asize;
        count_sub(&tc->c.held_req, e->req);
        count_sub(&tc->c.held_act, e->asize);
        count_sub(&tc->c.held_n, 1);
        if (atomic_load_explicit(&e->blk->tc_gen, memory_order_acquire) != e->gen) {
            e->addr = 0; /* freed by another thread meanwhile: the pool has it */
            continue;
        }
        count_add(&tc->c.hits, 1);
        count_add(&tc->c.hit_bytes, size);
        *ptr = (void *)e->addr;
        return GM_OK;
    }
    return GM_NOT_READY;
}

int gm__tcache_free(gm_pool_t *pool, void *ptr, gm_stream_t stream)
{
    gm__tcache_t *tc = gm__tc_self;
    if (!bound(tc, pool)) return GM_NOT_READY;
    unsigned i = slot_of((uintptr_t)ptr);
    gm__tc_entry_t *e = &tc->table[i];
    if (e->addr != (uintptr_t)ptr) {
        e = &tc->table[i = GM_TC_LARGE_SLOT];
        if (e->addr != (uintptr_t)ptr) return GM_NOT_READY;
    }
    if (atomic_load_explicit(&e->blk->tc_gen, memory_order_acquire) != e->gen) {
        if (!e->cached) e->addr = 0; /* stale: the locked path decides */
        return GM_NOT_READY;
    }
    if (e->cached)
        return gm__set_error(GM_DOUBLE_FREE, "gm_free: %p was already freed", ptr);
    unsigned k = bin_of(e->req, stream);
    gm__tc_bin_t *bin = &tc->bins[k];
    if (bin->n && (bin->req != e->req || bin->stream != stream)) return GM_NOT_READY;
    if (bin->n == GM_TC_DEPTH ||
        (e->req <= GM_TC_MAX && tc->held - tc->held_large + e->asize > GM_TC_BYTES))
        return GM_NOT_READY;
    if (e->req > GM_TC_MAX && tc->large_bin)
        return GM_NOT_READY; /* the locked free gives that one back first */
    /* Claim the block against a free of it on another thread, which takes
     * the locked path (gm__free_locked claims it the same way): one of the
     * two wins, the other reports the double free.  A claim of a record the
     * locked path freed (and perhaps made anew) after the check above shows
     * as a new generation: let go, and the locked path decides. */
    uint32_t zero = 0;
    if (!atomic_compare_exchange_strong(&e->blk->tc_cached, &zero, 1)) return GM_NOT_READY;
    if (atomic_load(&e->blk->tc_gen) != e->gen) {
        atomic_store_explicit(&e->blk->tc_cached, 0, memory_order_relaxed);
        e->addr = 0; /* stale (not cached: checked above) */
        return GM_NOT_READY;
    }
    if (e->req > GM_TC_MAX) {
        tc->large_bin = (uint8_t)(k + 1);
        tc->held_large = e->asize;
    }
    bin->req = e->req;
    bin->stream = stream;
    bin->slot[bin->n++] = (uint16_t)i;
    e->cached = 1;
    e->fepoch = atomic_load_explicit(&pool->forget_epoch, memory_order_acquire);
    tc->held += e->asize;
    count_add(&tc->c.held_req, e->req);
    count_add(&tc->c.held_act, e->asize);
    count_add(&tc->c.held_n, 1);
    count_add(&tc->c.frees, 1);
    count_add(&tc->c.free_bytes, e->req);
    if (e->req > GM_TC_RECLAIM_MIN) { /* counted: now other threads may take it back */
        tc->large_stream = stream;
        tc->large_fepoch = e->fepoch;
        atomic_store_explicit(&tc->large_blk, e->blk, memory_order_release);
    }
    return GM_OK;
}

/* ---- binding --------------------------------------------------------------------- */

/* Was stream `handle` forgotten (and waited for, gm__stream_retire_locked)
 * after a block was cached at forget epoch `fepoch`? */
static bool forgotten_since(const gm_pool_t *pool, gm_stream_t handle, uint32_t fepoch)
{
    if (!handle || atomic_load_explicit(&pool->forget_epoch, memory_order_relaxed) == fepoch)
        return false;
    for (unsigned i = 0; i < GM_FORGOT_RING; i++)
        if (pool->forgot[i].handle == handle && (int32_t)(pool->forgot[i].epoch - fepoch) > 0)
            return true;
    return false;
}

/* Give the blocks of one of tc's bins back to its pool (that pool's lock
 * held). */
static void drain_bin_locked(gm_pool_t *pool, gm__tcache_t *tc, gm__tc_bin_t *bin)
{
    if (bin->n && bin->req > GM_TC_MAX) tc->large_bin = 0;
    while (bin->n) {
        gm__tc_entry_t *e = &tc->table[bin->slot[--bin->n]];
        if (e->req > GM_TC_MAX && !large_take(tc, e)) continue; /* a reclaim took it */
        atomic_store_explicit(&e->blk->tc_cached, 0, memory_order_relaxed);
        count_sub(&tc->c.held_req, e->req);
        count_sub(&tc->c.held_act, e->asize);
        count_sub(&tc->c.held_n, 1);
        tc->held -= e->asize;
        /* Counted as a free already (c.frees): the pool's own books
         * take it now, so the cache's tally gives it back. */
        if (atomic_load_explicit(&e->blk->tc_gen, memory_order_relaxed) == e->gen) {
            /* Freed on a stream forgotten since: passed (a fresh state of
             * that handle would name a stream that may be gone). */
            gm__stream_t *s = forgotten_since(pool, bin->stream, e->fepoch)
                                  ? gm__stream_forgotten_locked(pool, bin->stream)
                                  : gm__stream_get_locked(pool, bin->stream);
            size_t freed = 0;
            if (s && gm__free_locked(pool, (void *)e->addr, s, &freed, NULL) == GM_OK) {
                count_sub(&tc->c.frees, 1);
                count_sub(&tc->c.free_bytes, freed);
                pool->st.freed_total += freed;
            }
        }
        e->cached = 0;
    }
}

/* Give tc's cached blocks back to its pool (that pool's lock held) and
 * forget every entry. */
static void drain_locked(gm_pool_t *pool, gm__tcache_t *tc)
{
    for (unsigned k = 0; k < GM_TC_BINS; k++) drain_bin_locked(pool, tc, &tc->bins[k]);
    memset(tc->table, 0, sizeof tc->table);
    gm__clear_error();
}

void gm__tcache_release_large_slow_locked(gm_pool_t *pool)
{
    gm__tcache_t *tc = gm__tc_self;
    if (tc->pool != pool || tc->pool_gen != pool->tc_gen) return; /* another pool's: its own ops */
    drain_bin_locked(pool, tc, &tc->bins[tc->large_bin - 1]);
    tc->large_bin = 0; /* that bin held only the large block's size */
    gm__clear_error();
}

/* Take one large block another thread's cache (not this one's) holds for
 * pool, under cache_mu: *b, its stream and forget epoch; false when none. */
static bool reclaim_one(gm_pool_t *pool, gm__block_t **b, gm_stream_t *stream, uint32_t *fepoch)
{
    bool got = false;
    pthread_mutex_lock(&cache_mu);
    for (gm__tcache_t *tc = caches; tc && !got; tc = tc->next) {
        if (tc == gm__tc_self || tc->pool != pool || tc->pool_gen != pool->tc_gen) continue;
        gm__block_t *blk = atomic_load_explicit(&tc->large_blk, memory_order_acquire);
        /* Swapped out, or the owner took it first (it hands it out). */
        if (!blk || !atomic_compare_exchange_strong_explicit(&tc->large_blk, &blk, NULL,
                                                             memory_order_acq_rel,
                                                             memory_order_acquire))
            continue;
        *b = blk;
        *stream = tc->large_stream;
        *fepoch = tc->large_fepoch;
        /* The owner's counts hold it until it looks (large_take). */
        atomic_fetch_add_explicit(&pool->tc_reclaimed.req, (*b)->requested, memory_order_relaxed);
        atomic_fetch_add_explicit(&pool->tc_reclaimed.act, (*b)->size, memory_order_relaxed);
        atomic_fetch_add_explicit(&pool->tc_reclaimed.n, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&pool->tc_reclaimed.frees, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&pool->tc_reclaimed.free_bytes, (*b)->requested,
                                  memory_order_relaxed);
        got = true;
    }
    pthread_mutex_unlock(&cache_mu);
    return got;
}

size_t gm__tcache_reclaim_large_locked(gm_pool_t *pool)
{
    size_t n = 0;
    gm__block_t *b;
    gm_stream_t handle;
    uint32_t fepoch;
    while (reclaim_one(pool, &b, &handle, &fepoch)) {
        /* Its owner's table still says "cached": a free of it there is a
         * double free, as it should be, and it never hands it out again
         * (large_take).  The pool's own free, the stream as drain's. */
        atomic_store_explicit(&b->tc_cached, 0, memory_order_relaxed);
        gm__stream_t *s = forgotten_since(pool, handle, fepoch)
                              ? gm__stream_forgotten_locked(pool, handle)
                              : gm__stream_get_locked(pool, handle);
        size_t freed = 0;
        if (s && gm__free_locked(pool, (void *)b->addr, s, &freed, NULL) == GM_OK) {
            pool->st.freed_total += freed;
            n++;
        }
        gm__clear_error();
    }
    return n;
}

void gm__tcache_flush_self_locked(gm_pool_t *pool)
{
    gm__tcache_t *tc = gm__tc_self;
    if (tc && tc->pool == pool && tc->pool_gen == pool->tc_gen && tc->held) drain_locked(pool, tc);
}

/* Unbound tc starts afresh: no entry, no count. */
static void forget_all(gm__tcache_t *tc)
{
    memset(tc->table, 0, sizeof tc->table);
    memset(tc->bins, 0, sizeof tc->bins);
    tc->held = 0;
    tc->large_bin = 0;
    tc->held_large = 0;
    atomic_store_explicit(&tc->large_blk, NULL, memory_order_relaxed);
    atomic_store_explicit(&tc->c.held_req, 0, memory_order_relaxed);
    atomic_store_explicit(&tc->c.held_act, 0, memory_order_relaxed);
    atomic_store_explicit(&tc->c.held_n, 0, memory_order_relaxed);
    atomic_store_explicit(&tc->c.hits, 0, memory_order_relaxed);
    atomic_store_explicit(&tc->c.hit_bytes, 0, memory_order_relaxed);
    atomic_store_explicit(&tc->c.frees, 0, memory_order_relaxed);
    atomic_store_explicit(&tc->c.free_bytes, 0, memory_order_relaxed);
}

/* Is tc bound to a pool that is still the one it was bound to? */
static bool bound_live(const gm__tcache_t *tc)
{
    return tc->pool && live_magic(tc->pool) && tc->pool_gen == tc->pool->tc_gen;
}

/* tc goes out of its pool's sight (that pool's lock held): its cached
 * blocks go back, and what it served moves into the pool's own books. */
static void retire_locked(gm_pool_t *pool, gm__tcache_t *tc)
{
    drain_locked(pool, tc);
    pool->st.alloc_count += atomic_load_explicit(&tc->c.hits, memory_order_relaxed);
    pool->st.free_count += atomic_load_explicit(&tc->c.frees, memory_order_relaxed);
    pool->st.allocated_total += atomic_load_explicit(&tc->c.hit_bytes, memory_order_relaxed);
    pool->st.freed_total += atomic_load_explicit(&tc->c.free_bytes, memory_order_relaxed);
}

static void set_pool(gm__tcache_t *tc, gm_pool_t *pool)
{
    pthread_mutex_lock(&cache_mu);
    tc->pool = pool;
    tc->pool_gen = pool ? pool->tc_gen : 0;
    pthread_mutex_unlock(&cache_mu);
}

/* Retire tc from its pool if that is still alive, then leave it unbound
 * (and, with unlink, off the list).  No pool lock held by the caller. */
static void detach(gm__tcache_t *tc, bool unlink)
{
    gm_pool_t *pool = bound_live(tc) ? tc->pool : NULL;
    if (pool) {
        gm__lock(&pool->lock);
        if (tc->pool_gen == pool->tc_gen) retire_locked(pool, tc);
    }
    pthread_mutex_lock(&cache_mu);
    tc->pool = NULL;
    if (unlink) {
        if (tc->prev) tc->prev->next = tc->next;
        else if (caches == tc) caches = tc->next;
        if (tc->next) tc->next->prev = tc->prev;
    }
    pthread_mutex_unlock(&cache_mu);
    if (pool) gm__unlock(&pool->lock);
    forget_all(tc);
}

static void thread_exit(void *arg)
{
    gm__tcache_t *tc = arg;
    detach(tc, true);
    gm__tc_self = NULL;
    free(tc);
}

static void make_key(void) { (void)pthread_key_create(&exit_key, thread_exit); }

void gm__tcache_prepare(gm_pool_t *pool)
{
    gm__tcache_t *tc = gm__tc_self;
    if (tc && tc->pool && (tc->pool != pool || tc->pool_gen != pool->tc_gen)) detach(tc, false);
}

void gm__tcache_note_alloc_locked(gm_pool_t *pool, gm__block_t *b)
{
    if (b->requested > GM_TC_LARGE_MAX || observing() || pool->leaks) return;
    /* Over GM_TC_MAX only while one stream allocates: with several, a block
     * served again where the locked path would have chosen another moved
     * memory between streams (more events and remaps on the multistream
     * trace). */
    if (b->requested > GM_TC_MAX && pool->n_active > 1) return;
    /* Nor one larger than the cached memory a free keeps (release_threshold):
     * its free would have given pages back at once. */
    if (b->requested > GM_TC_MAX && b->size > pool->cfg.release_threshold) return;
    gm__tcache_t *tc = gm__tc_self;
    if (!tc) {
        pthread_once(&key_once, make_key);
        /* Plain calloc, not the pool's host-allocation seam: the cache
         * belongs to the thread and outlives any pool (it goes with the
         * thread, or with the process for the main thread). */
        tc = calloc(1, sizeof *tc);
        if (!tc) return;
        if (pthread_setspecific(exit_key, tc) != 0) {
            free(tc);
            return;
        }
        pthread_mutex_lock(&cache_mu);
        tc->next = caches;
        if (caches) caches->prev = tc;
        caches = tc;
        pthread_mutex_unlock(&cache_mu);
        gm__tc_self = tc;
    }
    if (tc->pool != pool || tc->pool_gen != pool->tc_gen) {
        if (tc->pool) return; /* bound elsewhere: gm__tcache_prepare unbinds it first */
        set_pool(tc, pool);
    }
    /* A block over GM_TC_RECLAIM_MIN only when the locked path made one of
     * the same size just before: a size that repeats (a loop's buffer, a
     * layer's activations) may come back through the cache, a size seen
     * once would only pass through it on its way to the pool. */
    if (b->requested > GM_TC_RECLAIM_MIN && tc->last_large != b->requested) {
        tc->last_large = b->requested;
        return;
    }
    gm__tc_entry_t *e = &tc->table[entry_of(b->addr, b->requested)];
    if (e->addr && e->cached) return; /* the slot holds a cached block */
    e->addr = b->addr;
    e->blk = b;
    e->gen = atomic_load_explicit(&b->tc_gen, memory_order_relaxed);
    e->req = b->requested;
    e->asize = b->size;
    e->cached = 0;
}

/* ---- what the pool's books see ------------------------------------------------------ */

bool gm__tcache_held_any_locked(gm_pool_t *pool)
{
    bool any = false;
    pthread_mutex_lock(&cache_mu);
    for (gm__tcache_t *tc = caches; tc && !any; tc = tc->next)
        any = tc->pool == pool && tc->pool_gen == pool->tc_gen &&
              atomic_load_explicit(&tc->c.held_n, memory_order_relaxed) > 0;
    pthread_mutex_unlock(&cache_mu);
    return any;
}

void gm__tcache_adjust_locked(gm_pool_t *pool, gm_stats_t *s)
{
    pthread_mutex_lock(&cache_mu);
    /* Less what reclaims took that owners have not seen yet (in their
     * counts still). */
    uint64_t hr = 0, ha = 0, hn = 0, fr = 0, fb = 0;
    for (gm__tcache_t *tc = caches; tc; tc = tc->next) {
        if (tc->pool != pool || tc->pool_gen != pool->tc_gen) continue;
        hr += atomic_load_explicit(&tc->c.held_req, memory_order_relaxed);
        ha += atomic_load_explicit(&tc->c.held_act, memory_order_relaxed);
        hn += atomic_load_explicit(&tc->c.held_n, memory_order_relaxed);
        s->alloc_count += atomic_load_explicit(&tc->c.hits, memory_order_relaxed);
        fr += atomic_load_explicit(&tc->c.frees, memory_order_relaxed);
        s->allocated_total += atomic_load_explicit(&tc->c.hit_bytes, memory_order_relaxed);
        fb += atomic_load_explicit(&tc->c.free_bytes, memory_order_relaxed);
    }
    uint64_t rr = atomic_load_explicit(&pool->tc_reclaimed.req, memory_order_relaxed);
    uint64_t ra = atomic_load_explicit(&pool->tc_reclaimed.act, memory_order_relaxed);
    uint64_t rn = atomic_load_explicit(&pool->tc_reclaimed.n, memory_order_relaxed);
    uint64_t rf = atomic_load_explicit(&pool->tc_reclaimed.frees, memory_order_relaxed);
    uint64_t rb = atomic_load_explicit(&pool->tc_reclaimed.free_bytes, memory_order_relaxed);
    pthread_mutex_unlock(&cache_mu);
    hr -= rr < hr ? rr : hr;
    ha -= ra < ha ? ra : ha;
    hn -= rn < hn ? rn : hn;
    fr -= rf < fr ? rf : fr;
    fb -= rb < fb ? rb : fb;
    s->allocated -= hr < s->allocated ? hr : s->allocated;
    s->active -= ha < s->active ? ha : s->active;
    s->live_blocks -= hn < s->live_blocks ? hn : s->live_blocks;
    s->free_count += fr;
    s->freed_total += fb;
}

void gm__tcache_pool_fini_locked(gm_pool_t *pool)
{
    /* This thread's cache is emptied for real (its blocks are the pool's);
     * others are dropped by their threads when they see the pool gone. */
    gm__tcache_flush_self_locked(pool);
    gm__tcache_t *tc = gm__tc_self;
    if (tc && tc->pool == pool) {
        set_pool(tc, NULL);
        forget_all(tc);
    }
}

void gm__tcache_atfork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    cache_mu = fresh;
    /* The parent's other threads are gone; their caches stay on the list
     * (their pools are dead here: no fast path matches them).  This
     * thread's cache forgets its pool, keeping its place on the list. */
    gm__tcache_t *tc = gm__tc_self;
    if (tc) {
        gm__tcache_t *next = tc->next, *prev = tc->prev;
        memset(tc, 0, sizeof *tc);
        tc->next = next;
        tc->prev = prev;
    }
}
