/* SPDX-License-Identifier: Apache-2.0 */
/*
 * freemem.h — the free-memory engine (freemem.c), shared by the device
 * allocator (core/alloc.c) and the pinned host pool (host/host.c): block
 * records and their slab, the two-level segregated-fit free index, stream
 * states and their registry, and the stream rule.
 *
 * The one idea: both sides tile regions (device arenas, pinned host chunks)
 * with blocks that are live or free, and a free block belongs to exactly one
 * free index: that of the stream that freed it, or the global one.  A block
 * freed on stream S is reusable at once by S (S's queue orders the reuse
 * after the earlier work) and by other streams only once S is known to have
 * passed the free: an event recorded on S after it has completed, or S was
 * synchronized; then the block moves ("migrates") to the global index.
 * Where the two sides differ (the index's second-level resolution, how a
 * request picks its block, whether a stream's free absorbs global
 * neighbours, how the reclaim pass steps through events), the difference is
 * a gm__fm_policy_t, never a second copy.
 *
 * Every function here expects the lock of the side that owns the structures
 * (the pool lock, or the host lock) to be held.  The functions on the
 * allocation path are static inline below: both sides pass a constant
 * policy, so the compiler folds the choices away.  The stream-wide passes
 * (gm__fm_migrate, gm__fm_reclaim: a drain, a reclaim, a sweep) are out of
 * line in freemem.c and read the policy at run time.
 */
#ifndef GM_FREEMEM_H
#define GM_FREEMEM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "base/hash.h"
#include "base/internal.h"

/* The policy-dependent functions of the allocation path are inlined into
 * every caller, so each side's wrapper, passing its constant policy, gets
 * a copy with the policy folded away (the callbacks become direct calls). */
#define GM_FM_INLINE static inline __attribute__((always_inline))

/* ---- size classes -------------------------------------------------------- */

#define GM_UNIT_SHIFT 8 /* block sizes are multiples of 256 B (GM_ALIGNMENT) */
#define GM_SL_BITS 5    /* the device's 32 second-level buckets per power of two */
#define GM_SL_COUNT (1u << GM_SL_BITS) /* columns of an index (the most any side uses) */
#define GM_FL_COUNT 40  /* covers sizes up to 2^(39+8) bytes */

/* Index classes: each region (arena, chunk) feeds one of a stream's two
 * indexes, so small and large blocks never compete. */
enum { GM_CLASS_SMALL = 0, GM_CLASS_LARGE = 1, GM_CLASS_COUNT = 2 };

struct gm__stream;
struct gm__arena;
struct gm__hchunk;
struct gm__recorded;

/* A block is a range of a region's address space.  The blocks of a region
 * tile it exactly, in address order (prev/next).  A block is live (handed
 * out) or free; a free block sits in exactly one free index, that of its
 * owner, and adjacent free blocks of the same index are always merged. */
typedef struct gm__block {
    uintptr_t addr;
    size_t size;                 /* bytes, multiple of 256 */
    size_t requested;            /* live: the caller's size */
    struct gm__block *prev, *next;   /* address order in the region */
    struct gm__block *fnext;     /* free index list (free blocks); slab list */
    union {
        struct gm__block *fprev; /* free index list (free blocks) */
        struct gm__offseg *offseg; /* device live, offloaded: the host segment its
                                      copy lies in (offload/offload.c) */
    };
    union {
        struct gm__arena *arena; /* device: the arena it tiles */
        struct gm__hchunk *chunk; /* host: the chunk it tiles */
    };
    struct gm__stream *owner;    /* free: whose index; device live: alloc stream */
    struct gm__recorded *recorded; /* device live: extra streams (gm_record_stream) */
    uint64_t free_seq;           /* free in a stream's index: its free_seq then */
    uint32_t bucket;             /* free: fl * GM_SL_COUNT + sl */
    uint8_t cls;                 /* index class of its region (GM_CLASS_*) */
    uint8_t free;
    uint8_t pending;             /* device: freed, waiting for recorded streams */
    uint8_t kind;                /* host live: GM__HOST_USER / _STAGING / _SYSMEM */
    _Atomic uint64_t tc_gen;     /* device: a new number whenever the locked path
                                    makes, frees or records it (tcache.h) */
    _Atomic uint32_t tc_cached;  /* device: freed into a thread cache (tcache.h) */
    uint8_t shared;              /* device live: held by sharing (src/share/): a
                                    gm_free is the share layer's to carry out */
    uint8_t offloaded;           /* device live: GM__OFFLOADED_* (offload/offload.c) */
    uint16_t tag;                /* device live: its gm_tag_t (0: none) */
    void *host_copy;             /* device live, offloaded: its data in pinned host memory */
} gm__block_t;

/* A two-level segregated-fit index of free blocks.
 * Invariant: bit (fl) of fl_bits set <=> sl_bits[fl] != 0;
 *            bit (sl) of sl_bits[fl] set <=> heads[fl][sl] != NULL. */
typedef struct gm__freeidx {
    uint64_t fl_bits;
    uint32_t sl_bits[GM_FL_COUNT];
    gm__block_t *heads[GM_FL_COUNT][GM_SL_COUNT];
    size_t count;                /* blocks in the index */
    size_t bytes;                /* bytes in the index */
} gm__freeidx_t;

/* Per-stream state (and the global index, is_global).  Cross-stream reuse
 * without waiting: when another stream needs memory, an event is recorded
 * here; once it has completed, blocks freed on this stream up to
 * free_seq == ev_seq move to the global index. */
typedef struct gm__stream {
    gm_stream_t handle;
    gm__freeidx_t idx[GM_CLASS_COUNT];
    bool is_global;
    bool pinned;                /* device: never forgotten (the default stream) */
    bool active;                /* device: has allocated (counted in n_active) */
    size_t slot;                /* index in its registry's list */
    /* Device: references that keep the record alive besides its free blocks:
     * live blocks allocated on it (b->owner), pending blocks freed on it, and
     * gm_record_stream entries naming it (the global state: pending blocks
     * whose stream was forgotten, gm__stream_retire_locked).  A record with
     * users == 0, empty indexes and no pending event is idle: alloc.c's
     * sweep frees it. */
    size_t users;
    uint64_t free_seq;          /* counts frees into this index */
    uint64_t done_seq;          /* the stream is known to have passed this free_seq */
    uint64_t mig_seq;           /* blocks freed up to here have migrated (<= done_seq) */
    uint64_t ev_seq;            /* free_seq when event was recorded */
    gm__event_t event;          /* 0 until first needed */
    bool ev_pending;
    /* Device: forgotten (gm_stream_forget) while live blocks or
     * gm_record_stream entries still name it.  Its work was waited for then
     * and its frees all count as passed; no backend call names it again
     * (the handle may be destroyed, or reused by a new stream, which gets
     * a state of its own: this one is out of the table, gm__streams_detach). */
    bool retired;
} gm__stream_t;

/* The stream states of one side, found by handle. */
typedef struct gm__streams {
    gm__stream_t **all;          /* in no order: a forgotten one's slot takes the last */
    size_t n, cap;
    gm__stream_t *last;          /* lookup cache */
    gm__hash_t of;               /* non-NULL handle -> its state (sized on first use) */
    gm__stream_t *null_state;    /* the NULL handle's (key 0 is "empty" in the table) */
} gm__streams_t;

/* Block records, recycled through a free list and allocated in slabs that
 * live as long as the side. */
typedef struct gm__slab {
    gm__block_t *spare;          /* recycled records (through fnext) */
    void **slabs;
    size_t n, cap;
    unsigned per_slab;           /* records per slab */
} gm__slab_t;

/* How one side uses the engine; each side has one constant policy. */
typedef struct gm__fm_policy {
    /* Second-level bits of the index (at most GM_SL_BITS). */
    unsigned sl_bits;
    /* A stream's free absorbs neighbouring global blocks (except a region's
     * last block): keeps free ranges maximal, so a repeating step starts
     * from the same layout (device).  Else only blocks of the same index
     * merge (host). */
    bool take_global;
    /* With take_global: may a stream's free absorb the region's last block
     * too (its untouched address space) now?  NULL: never.  The device
     * answers yes while one stream is in use, so a stream's frees next to
     * the tail merge with it, as they would in a single index. */
    bool (*take_tail)(gm_pool_t *pool, const gm__block_t *tail, const gm__block_t *freed);
    /* Migration inserts a stream's blocks into the global index in reverse
     * scan order (device) or in scan order (host).  Which block a later
     * search meets first depends on it: each side keeps its own. */
    bool migrate_reversed;
    /* The reclaim pass: may query a pending event of a stream that holds no
     * blocks, and right after consuming one records the next (device); or
     * touches only streams holding blocks, one step per pass, and keeps an
     * event whose query failed (host). */
    bool reclaim_eager;
    /* Called after a free into any index (a stream's or the global one)
     * produced b: once with [lo, hi) the range freed before merging, and
     * once more per boundary between merged blocks away from it (lo == hi,
     * the boundary).  In a stream's index b->free_seq is the free's number
     * on that stream.  May be NULL. */
    void (*freed)(gm_pool_t *pool, gm__block_t *b, uintptr_t lo, uintptr_t hi);
} gm__fm_policy_t;

/* ---- the segregated-fit index ----------------------------------------------- */

static inline unsigned gm__log2_floor(uint64_t x) { return 63u - (unsigned)__builtin_clzll(x); }

/* First- and second-level class of u units (u >= 1), not clamped: every
 * block of class (fl, sl) has at least its floor. */
static inline void gm__fm_class(uint64_t u, unsigned slb, unsigned *fl, unsigned *sl)
{
    gm_assert_internal(u >= 1 && slb >= 1 && slb <= GM_SL_BITS);
    if (u < (1u << slb)) {
        *fl = 0;
        *sl = (unsigned)u;
        return;
    }
    unsigned l = gm__log2_floor(u);
    *fl = l - slb + 1;
    *sl = (unsigned)(u >> (l - slb)) - (1u << slb);
}

/* The bucket a free block of `size` bytes sits in. */
static inline uint32_t gm__fm_bucket(size_t size, unsigned slb)
{
    unsigned fl, sl;
    gm__fm_class(size >> GM_UNIT_SHIFT, slb, &fl, &sl);
    if (fl >= GM_FL_COUNT) return GM_FL_COUNT * GM_SL_COUNT - 1;
    return fl * GM_SL_COUNT + sl;
}

/* Put free block b (not in any index) at the head of its bucket. */
static inline void gm__fm_insert(gm__freeidx_t *idx, gm__block_t *b, unsigned slb)
{
    gm_assert_internal(b->free && b->size >= GM_ALIGNMENT && b->size % GM_ALIGNMENT == 0);
    uint32_t bk = gm__fm_bucket(b->size, slb);
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

static inline void gm__fm_remove(gm__freeidx_t *idx, gm__block_t *b)
{
    unsigned fl = b->bucket / GM_SL_COUNT, sl = b->bucket % GM_SL_COUNT;
    gm_assert_internal(b->free && idx->heads[fl][sl] != NULL);
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

/* The first non-empty bucket at (*fl, >= *sl) or in a higher first level:
 * true, with (*fl, *sl) set to it; false when there is none. */
static inline bool gm__fm_next_bucket(const gm__freeidx_t *idx, unsigned *fl, unsigned *sl)
{
    uint32_t slm = *sl < GM_SL_COUNT ? idx->sl_bits[*fl] & (~0u << *sl) : 0;
    if (!slm) {
        uint64_t flm = *fl + 1 < 64 ? idx->fl_bits & (~(uint64_t)0 << (*fl + 1)) : 0;
        if (!flm) return false;
        *fl = (unsigned)__builtin_ctzll(flm);
        slm = idx->sl_bits[*fl];
    }
    *sl = (unsigned)__builtin_ctz(slm);
    return true;
}

/* The head of the first non-empty bucket at (fl, >= sl) or in a higher
 * first level; NULL when there is none. */
static inline gm__block_t *gm__fm_first_from(const gm__freeidx_t *idx, unsigned fl, unsigned sl)
{
    return gm__fm_next_bucket(idx, &fl, &sl) ? idx->heads[fl][sl] : NULL;
}

/* How many blocks of one bucket the best-fit search compares. */
#define GM_FM_BUCKET_SCAN 8

/* The device's search: a free block of at least `size` bytes, or NULL.  A
 * few blocks of the request's own bucket are compared for the tightest fit
 * (so a training step that frees and re-requests the same sizes gets the
 * same places back); else the smallest of a few in the next non-empty
 * bucket, where every block fits.  Ties go to the lower address, so
 * placement depends on the free ranges more than on their history. */
static inline gm__block_t *gm__fm_find_best(const gm__freeidx_t *idx, size_t size, unsigned slb)
{
    if (!idx->fl_bits) return NULL;
    uint32_t bk = gm__fm_bucket(size, slb);
    unsigned fl = bk / GM_SL_COUNT, sl = bk % GM_SL_COUNT;
    gm__block_t *best = NULL;
    int n = 0;
    for (gm__block_t *b = idx->heads[fl][sl]; b && n < GM_FM_BUCKET_SCAN; b = b->fnext, n++) {
        if (b->size < size) continue;
        if (!best || b->size < best->size || (b->size == best->size && b->addr < best->addr))
            best = b;
        if (best->size == size) break;
    }
    if (best) return best;
    best = gm__fm_first_from(idx, fl, sl + 1);
    if (!best) return NULL;
    n = 0;
    for (gm__block_t *b = best->fnext; b && ++n < GM_FM_BUCKET_SCAN; b = b->fnext)
        if (b->size < best->size || (b->size == best->size && b->addr < best->addr)) best = b;
    return best;
}

/* The host's search ("good fit"): the request is rounded up to the next
 * bucket floor, so the head of any bucket from there on fits with no scan;
 * only when none is left is the request's own bucket scanned. */
static inline gm__block_t *gm__fm_find_good(const gm__freeidx_t *idx, size_t size, unsigned slb)
{
    if (!idx->count) return NULL;
    uint64_t u = size >> GM_UNIT_SHIFT;
    uint64_t r = u < (1u << slb) ? u : u + ((uint64_t)1 << (gm__log2_floor(u) - slb)) - 1;
    unsigned fl, sl;
    gm__fm_class(r, slb, &fl, &sl);
    if (fl >= GM_FL_COUNT) return NULL;
    gm__block_t *b = gm__fm_first_from(idx, fl, sl);
    if (b) return b;
    gm__fm_class(u, slb, &fl, &sl);
    for (b = idx->heads[fl][sl]; b; b = b->fnext)
        if (b->size >= size) return b;
    return NULL;
}

/* Free blocks a stream holds, both classes. */
static inline size_t gm__fm_held(const gm__stream_t *s)
{
    return s->idx[GM_CLASS_SMALL].count + s->idx[GM_CLASS_LARGE].count;
}

/* ---- block records ------------------------------------------------------------ */

/* A zeroed record, or NULL (out of host memory). */
gm__block_t *gm__slab_new(gm__slab_t *sl);
static inline void gm__slab_release(gm__slab_t *sl, gm__block_t *b)
{
    b->fnext = sl->spare;
    sl->spare = b;
}
void gm__slab_fini(gm__slab_t *sl);

/* ---- free blocks: release (with merging), take (with splitting) ---------------- */

/* Can a block freed into owner's index take in its free neighbour n?  Same
 * index always; with take_global, a stream's block also absorbs global
 * blocks (memory anyone may use), except a region's last block, whose
 * untouched address space is left to the global index unless take_tail
 * says otherwise. */
GM_FM_INLINE bool gm__fm_mergeable(gm_pool_t *pool, const gm__fm_policy_t *pol,
                                    const gm__block_t *n, const gm__block_t *b,
                                    const gm__stream_t *owner)
{
    if (!n || !n->free) return false;
    if (n->owner == owner) return true;
    return pol->take_global && !owner->is_global && n->owner->is_global &&
           (n->next != NULL || (pol->take_tail && pol->take_tail(pool, n, b)));
}

static inline void gm__fm_absorb(gm__block_t *n) { gm__fm_remove(&n->owner->idx[n->cls], n); }

/* A new region's one block (fresh from the slab, tiling the whole region):
 * free in the global index.  Nothing to merge with and no page changed
 * state, so no policy callback runs. */
static inline void gm__fm_seed(const gm__fm_policy_t *pol, gm__block_t *b, gm__stream_t *global)
{
    gm_assert_internal(global->is_global && !b->prev && !b->next);
    b->free = 1;
    b->owner = global;
    gm__fm_insert(&global->idx[b->cls], b, pol->sl_bits);
}

/* Make b (live, pending, or just taken out of an index) a free block of
 * owner's index, merged with its neighbours as gm__fm_mergeable allows; a
 * stream's merged block counts as its newest free.  Returns the merged
 * block (b's record may have gone back to the slab). */
GM_FM_INLINE gm__block_t *gm__fm_release(gm_pool_t *pool, const gm__fm_policy_t *pol,
                                          gm__slab_t *slab, gm__block_t *b, gm__stream_t *owner)
{
    gm_assert_internal(owner != NULL && b->cls < GM_CLASS_COUNT);
    uintptr_t lo = b->addr, hi = b->addr + b->size;
    /* Boundaries between merged blocks that lie away from [lo, hi): pages
     * around them can change state too (the callback hears of each). */
    uintptr_t far[4];
    unsigned n_far = 0;
    bool overflow = false;
    /* Absorbing a global neighbour can bring the next block of this index
     * alongside: keep going until neither side merges. */
    for (gm__block_t *p = b->prev; gm__fm_mergeable(pool, pol, p, b, owner); p = b->prev) {
        if (pol->freed && b->addr != lo) {
            if (n_far < 4) far[n_far++] = b->addr;
            else overflow = true;
        }
        gm__fm_absorb(p);
        p->size += b->size;
        p->next = b->next;
        if (b->next) b->next->prev = p;
        gm__slab_release(slab, b);
        b = p;
    }
    for (gm__block_t *n = b->next; gm__fm_mergeable(pool, pol, n, b, owner); n = b->next) {
        if (pol->freed && b->addr + b->size != hi) {
            if (n_far < 4) far[n_far++] = b->addr + b->size;
            else overflow = true;
        }
        gm__fm_absorb(n);
        b->size += n->size;
        b->next = n->next;
        if (n->next) n->next->prev = b;
        gm__slab_release(slab, n);
    }
    b->free = 1;
    b->pending = 0;
    b->owner = owner;
    if (!owner->is_global) {
        b->free_seq = ++owner->free_seq;
        /* A forgotten stream's work was waited for: its frees pass at once. */
        if (GM_UNLIKELY(owner->retired)) owner->done_seq = owner->free_seq;
    }
    gm__fm_insert(&owner->idx[b->cls], b, pol->sl_bits);
    if (pol->freed) {
        if (GM_UNLIKELY(overflow)) {
            pol->freed(pool, b, b->addr, b->addr + b->size);
        } else {
            pol->freed(pool, b, lo, hi);
            for (unsigned i = 0; i < n_far; i++) pol->freed(pool, b, far[i], far[i]);
        }
    }
    return b;
}

/* Take free block b out of its owner's index as a live block of `size`
 * bytes (<= b->size); with split, the rest stays a free block of the same
 * index and freeing order.  GM_NO_HOST_MEMORY (no message; b back in its
 * index) when no record is left for the rest. */
static inline int gm__fm_take(gm__slab_t *slab, unsigned slb, gm__block_t *b, size_t size,
                              bool split)
{
    gm_assert_internal(b->free && b->size >= size);
    gm__freeidx_t *idx = &b->owner->idx[b->cls];
    gm__fm_remove(idx, b);
    if (split && b->size > size) {
        gm__block_t *r = gm__slab_new(slab);
        if (GM_UNLIKELY(!r)) {
            gm__fm_insert(idx, b, slb);
            return GM_NO_HOST_MEMORY;
        }
        r->addr = b->addr + size;
        r->size = b->size - size;
        r->arena = b->arena; /* the region, whichever member names it */
        r->cls = b->cls;
        r->prev = b;
        r->next = b->next;
        if (b->next) b->next->prev = r;
        b->next = r;
        r->free = 1;
        r->owner = b->owner;
        r->free_seq = b->free_seq; /* freed when b was: same ordering rule */
        gm__fm_insert(idx, r, slb);
        b->size = size;
    }
    b->free = 0;
    return GM_OK;
}

/* ---- stream states --------------------------------------------------------------- */

/* The state of handle, or NULL, past the lookup cache; a hit becomes it. */
gm__stream_t *gm__streams_lookup(gm__streams_t *r, gm_stream_t handle);
/* The state of handle, or NULL.  The cache check is all that is inlined, so
 * callers on the allocation path stay small. */
static inline gm__stream_t *gm__streams_find(gm__streams_t *r, gm_stream_t handle)
{
    gm__stream_t *s = r->last;
    if (GM_LIKELY(s && s->handle == handle)) return s;
    return gm__streams_lookup(r, handle);
}
/* A new state for handle (not known yet), or NULL (out of host memory). */
gm__stream_t *gm__streams_add(gm__streams_t *r, gm_stream_t handle);
/* A new retired state for handle, in the list only (NULL: out of host
 * memory): where blocks freed on a forgotten stream come back. */
gm__stream_t *gm__streams_add_detached(gm__streams_t *r, gm_stream_t handle);
/* Take s out of the handle table (its handle finds nothing, so a new state
 * can be made for it); s stays in the list until it is dropped.  Marks it
 * retired. */
void gm__streams_detach(gm__streams_t *r, gm__stream_t *s);
/* Drop state s: its event is destroyed (failures cleared). */
void gm__streams_forget(gm_pool_t *pool, gm__streams_t *r, gm__stream_t *s);
/* Destroy every state and the registry (teardown: failures ignored). */
void gm__streams_fini(gm_pool_t *pool, gm__streams_t *r);
/* The registry's list and table agree: GM_OK, or GM_INTERNAL with a message. */
int gm__streams_check(const gm__streams_t *r);

/* ---- the stream rule ----------------------------------------------------------------- */

/* Move the free blocks of s freed up to free_seq <= upto to the global
 * index.  Returns blocks moved. */
size_t gm__fm_migrate(gm_pool_t *pool, const gm__fm_policy_t *pol, gm__slab_t *slab,
                      gm__stream_t *s, gm__stream_t *global, uint64_t upto);
/* One reclaim step for s, never waiting: consume its completed event
 * (moving the blocks freed before it) and record a new one where it holds
 * blocks (see reclaim_eager).  Backend failures only mean nothing moves;
 * their messages are cleared, except GM_NOT_READY's.  Returns blocks moved. */
size_t gm__fm_reclaim(gm_pool_t *pool, const gm__fm_policy_t *pol, gm__slab_t *slab,
                      gm__stream_t *s, gm__stream_t *global);
/* Has s passed its free number seq?  Without a backend call when it is
 * known; else an event is queried (one recorded after s's latest free when
 * none covers seq: record + query); with wait, a stream sync as the last
 * resort.  Moves no block (the next reclaim migrates what is known done).
 * Backend failures read as "not passed"; their messages are cleared. */
bool gm__fm_passed(gm_pool_t *pool, gm__stream_t *s, uint64_t seq, bool wait);
/* Wait for stream s and move all its free blocks to the global index.  The
 * status of the wait (nothing moves unless GM_OK). */
int gm__fm_sync_migrate(gm_pool_t *pool, const gm__fm_policy_t *pol, gm__slab_t *slab,
                        gm__stream_t *s, gm__stream_t *global);

/* ---- validation -------------------------------------------------------------------- */

/* Free block b is in the right bucket of its owner's index: GM_OK, or
 * GM_INTERNAL with a message. */
int gm__fm_check_free(const gm__block_t *b, unsigned slb);

#endif /* GM_FREEMEM_H */
