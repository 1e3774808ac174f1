/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tcache.h — the per-thread front cache of small blocks (tcache.c).
 *
 * The one idea: an alloc+free pair of a small size that a thread repeats
 * need not take the pool lock at all.  A thread keeps, for the one pool it
 * used last, the small blocks it allocated (a direct-mapped table by
 * address) and, in a few bins keyed by (requested size, stream), blocks its
 * program freed: those stay live in the pool's eyes (their pages owned,
 * their records in the live table), so handing one out again on the same
 * stream is a pop, and freeing one is a push — no lock, no atomic
 * read-modify-write.  Stream order makes the reuse safe: a bin only serves
 * the stream the block was freed on.
 *
 * Whether a table entry still names a live block of this thread is decided
 * by the block record's generation (gm__block_t.tc_gen, an atomic bumped
 * under the pool lock whenever the block is freed or made by the locked
 * path, or recorded on another stream): an entry whose generation differs is
 * stale and goes the locked way.  A block freed by another thread therefore
 * never comes back through this one's cache, and a double free of a cached
 * block is caught (the entry says "cached").  The block's tc_cached word
 * decides a free on this thread racing one on another: the cache claims it
 * 0 -> 1 and the locked free 0 -> 2, each with a compare-and-swap, so one
 * wins and the other reports GM_DOUBLE_FREE.
 *
 * Bounded: blocks of at most GM_TC_MAX bytes, GM_TC_DEPTH per bin, at most
 * GM_TC_BYTES of them held per thread; and one larger block.  The statistics subtract what the caches hold
 * and add what they served (gm__tcache_adjust_locked), so gm_pool_stats reads
 * as if every operation had gone through the lock; peaks may overstate by at
 * most what the caches hold.  Off while leak checking or tracing is on.
 */
#ifndef GM_TCACHE_H
#define GM_TCACHE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpumem.h"

#define GM_TC_MAX ((size_t)64 << 10) /* largest request cached in the bins */
/* Larger requests, of any size up to this, are cached one at a time and
 * only until the thread's next operation that takes the pool lock, or until
 * another thread's trim or out-of-memory reclaim takes it (see tcache.c). */
#define GM_TC_LARGE_MAX ((size_t)1 << 46)
/* Such a block over this is published for other threads' reclaim, and
 * cached only when the locked path made one of its size just before; up to
 * it, it stays its thread's (at most this much held that way). */
#define GM_TC_RECLAIM_MIN ((size_t)2 << 20)
#define GM_TC_BINS 32 /* < 255: gm__tcache_t.large_bin holds 1 + an index */
#define GM_TC_DEPTH 4
#define GM_TC_SLOTS 256               /* table entries (direct-mapped by address) */
#define GM_TC_LARGE_SLOT GM_TC_SLOTS  /* one more: the entry of blocks over GM_TC_MAX */
#define GM_TC_BYTES ((size_t)4 << 20) /* held per thread in blocks up to GM_TC_MAX */

struct gm__block;
struct gm__stream;

typedef struct gm__tc_entry {
    uintptr_t addr;              /* 0: empty */
    struct gm__block *blk;
    uint64_t gen;                /* blk->tc_gen when the entry was made */
    size_t req, asize;
    uint8_t cached;              /* freed by the program, sitting in a bin */
    uint32_t fepoch;             /* cached: the pool's forget_epoch at the free */
} gm__tc_entry_t;

typedef struct gm__tc_bin {
    size_t req;
    gm_stream_t stream;
    uint8_t n;
    uint16_t slot[GM_TC_DEPTH];  /* table indexes, newest last */
} gm__tc_bin_t;

/* Counters the owner thread writes and the locked stats read (relaxed). */
typedef struct gm__tc_counts {
    _Atomic uint64_t held_req, held_act, held_n;   /* in bins now */
    _Atomic uint64_t hits, hit_bytes;              /* allocations served */
    _Atomic uint64_t frees, free_bytes;            /* frees taken */
} gm__tc_counts_t;

typedef struct gm__tcache {
    gm_pool_t *pool;             /* bound pool, or NULL */
    uint64_t pool_gen;           /* pool->tc_gen when bound */
    size_t held;                 /* bytes (aligned) in bins */
    uint8_t large_bin;           /* 1 + the bin holding the one cached block over
                                    GM_TC_MAX; 0: none */
    size_t held_large;           /* its bytes (aligned), in held too */
    size_t last_large;           /* the size of the last block over
                                    GM_TC_RECLAIM_MIN the locked path made
                                    for this thread */
    /* That block, published for other threads' reclaim (tcache.c): stored
     * by the owner once cached (release), swapped to NULL by whoever takes
     * it: the owner when it hands it out or gives it back, or a reclaim.
     * Stream and epoch are written by the owner before it publishes. */
    _Atomic(struct gm__block *) large_blk;
    gm_stream_t large_stream;    /* freed on */
    uint32_t large_fepoch;       /* the pool's forget_epoch at the free */
    gm__tc_entry_t table[GM_TC_SLOTS + 1];
    gm__tc_bin_t bins[GM_TC_BINS];
    gm__tc_counts_t c;
    struct gm__tcache *next, *prev; /* the bound pool's list (its lock) */
} gm__tcache_t;

/* ---- defined in src/core/tcache.c ---- */

extern _Thread_local gm__tcache_t *gm__tc_self;
/* Fast paths (no lock).  GM_OK when served; anything else: take the locked
 * path (nothing changed). */
int gm__tcache_alloc(gm_pool_t *pool, size_t size, gm_stream_t stream, void **ptr);
int gm__tcache_free(gm_pool_t *pool, void *ptr, gm_stream_t stream);
/* May the fast path serve an allocation of size?  Over GM_TC_RECLAIM_MIN
 * only while this thread's cache holds its one large block (a miss costs
 * the locked path of a large allocation nothing then). */
static inline bool gm__tcache_may_serve(size_t size)
{
    return size <= GM_TC_RECLAIM_MIN || (gm__tc_self != NULL && gm__tc_self->large_bin);
}
/* Before the locked path of an allocation (no lock held): a cache bound to
 * another pool is emptied into it and unbound. */
void gm__tcache_prepare(gm_pool_t *pool);
/* In a child of fork(): a fresh list; this thread's cache forgets its pool. */
void gm__tcache_atfork_child(void);
/* After the locked path made block b for this thread (pool lock held):
 * remember it so that its free can be fast. */
void gm__tcache_note_alloc_locked(gm_pool_t *pool, struct gm__block *b);
/* Pool lock held, at the start of a locked allocation or free: the block
 * over GM_TC_MAX this thread cached, if any, goes back first. */
void gm__tcache_release_large_slow_locked(gm_pool_t *pool);
static inline void gm__tcache_release_large_locked(gm_pool_t *pool)
{
    if (GM_UNLIKELY(gm__tc_self != NULL && gm__tc_self->large_bin))
        gm__tcache_release_large_slow_locked(pool);
}
/* Pool lock held: give this thread's cached blocks back (before an OOM
 * retry, a trim, or when tracing started). */
void gm__tcache_flush_self_locked(gm_pool_t *pool);
/* Pool lock held: take back the large block every other thread's cache
 * holds for this pool (a trim, an allocation about to fail), as if freed
 * by the locked path.  Returns how many. */
size_t gm__tcache_reclaim_large_locked(gm_pool_t *pool);
/* Does any thread's cache hold blocks of pool (pool lock held)? */
bool gm__tcache_held_any_locked(gm_pool_t *pool);
/* Pool lock held: subtract from *s what every cache of the pool holds and
 * add what they served. */
void gm__tcache_adjust_locked(gm_pool_t *pool, gm_stats_t *s);
/* Pool lock held, teardown: unlink every cache (their threads see the
 * pool's generation change and drop them without touching the pool). */
void gm__tcache_pool_fini_locked(gm_pool_t *pool);

#endif /* GM_TCACHE_H */
