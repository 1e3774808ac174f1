/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pool.h — the allocator's private structures, grouped under the file that
 * owns each: a pool (pool.c) holds arenas of reserved address space whose
 * 2 MiB pages are mapped on demand (pages.c), tiled by blocks that are either
 * live or sit in a free index owned by one stream or by everyone (alloc.c).
 *
 * The one idea: address space is free, physical pages are not.  A block's
 * address range is contiguous; the pages behind it come from anywhere, so a
 * free page in a hole can be unmapped and mapped where it is needed
 * ("stealing"), and reserved memory tracks the pages that live data touches.
 */
#ifndef GM_POOL_H
#define GM_POOL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "base/internal.h"
#include "base/lock.h"
#include "core/freemem.h"
#include "core/provider.h"
#include "core/tcache.h"

/* ---- blocks, free indexes, streams (freemem.h) ----------------------------
 * Block records, the size classes (GM_UNIT_SHIFT, GM_SL_BITS, GM_FL_COUNT),
 * the classes GM_CLASS_SMALL / GM_CLASS_LARGE and stream states are the
 * free-memory engine's, shared with the pinned host pool. */

/* Requests up to this size live in the small arena, packed densely, so they
 * never pin pages inside the holes of large blocks. */
#ifndef GM_SMALL_MAX
#define GM_SMALL_MAX ((size_t)1 << 20)
#endif
/* Largest size we accept at all: far beyond any device, small enough that
 * aligned arithmetic cannot overflow. */
#define GM_MAX_REQUEST ((size_t)1 << 46)

/* Streams a live block was declared used on (gm_record_stream). */
typedef struct gm__recorded {
    struct gm__stream *stream;
    gm__event_t event;           /* recorded at free time */
    bool unordered;              /* pending: neither event nor sync worked yet */
    struct gm__recorded *next;
} gm__recorded_t;

/* ---- arenas and pages (pages.c) --------------------------------------- */

#define GM_NONE UINT32_MAX

/* One reservation of address space, cut into pages of `granularity`.
 * Per page (a "VA page", numbered gid = gid_base + index across arenas):
 *   mapped — some physical page is mapped there (pid[p]);
 *   used   — NOT wholly inside one free block (of any index), so it may hold
 *            live data;
 *   owned  — the physical page mapped there belongs to this VA page alone.
 * A physical page may be mapped at several VA pages at once ("aliases"), but
 * at most one of them owns it.  Every page under a live or pending block is
 * owned; ownership ends at the free that leaves the page wholly inside a
 * free block, whichever index that block is in.
 * The fence: work queued on the freeing stream before the free may still
 * touch an unowned page.  fence_s[p]/fence_seq[p] name that stream and its
 * free number (NULL: none, or known passed).  An unowned page is unmapped
 * only once its fence has passed, and its physical page serves another
 * stream's range only once the fence of the VA page that last owned it
 * (ppage.last_va) has passed; the freeing stream itself may reuse both at
 * once (its queue orders the new work after the old).  An unowned page
 * whose fence has not passed lies inside a free block of that stream's
 * index, so the stream's state outlives the fence (and forgetting a state
 * clears the passed fences naming it).
 * So an unowned mapping holds no data anyone needs, and reusing a physical
 * page elsewhere costs a map, not an unmap: a step that repeats finds its
 * mappings still in place.
 * Accounting: owned => used, mapped and phys[pid[p]].owner == gid;
 *             n_mapped == popcount(mapped). */
typedef struct gm__arena {
    uintptr_t base;
    size_t size;
    size_t npages;
    uint32_t gid_base;
    int cls;
    uint64_t *mapped;            /* bitmaps */
    uint64_t *used;
    uint64_t *owned;
    uint32_t *pid;               /* physical page mapped at each VA page */
    uint32_t *alias_next;        /* other VA pages mapping the same one */
    uint32_t *alias_prev;
    struct gm__stream **fence_s; /* unowned page: the fence (see above) */
    uint64_t *fence_seq;
    size_t n_mapped;
    size_t trim_hint;            /* where the next unmap scan starts */
    uintptr_t hwm;               /* end of the highest block ever handed out:
                                    no work touched the space above it */
    gm__block_t *first;          /* lowest block */
} gm__arena_t;

/* A physical page: one handle of `granularity` bytes, or one page of an
 * extent (ext != GM_NONE): a handle of several pages that a tagged block's
 * allocation or restore maps in one piece (pages.c, "extents").  An
 * extent's pages are mapped at one place each, in order, and never anywhere
 * else; they are never on the free list, and go back to the provider
 * together.
 * free <=> owner == GM_NONE; in the LRU list <=> free and ext == GM_NONE;
 * n_maps == length of the alias list starting at first_va. */
typedef struct gm__ppage {
    gm__phys_t handle;           /* an extent's pages: the extent's handle */
    uint32_t owner;              /* gid of the owning VA page, or GM_NONE */
    uint32_t first_va;           /* gid of one VA page mapping it, or GM_NONE */
    uint32_t n_maps;
    uint32_t lru_prev, lru_next; /* free list, oldest first */
    uint32_t last_va;            /* free: the VA page that owned it last (its
                                    fence guards it), or GM_NONE */
    uint32_t ext;                /* the first page of its extent, or GM_NONE */
    uint32_t ext_n;              /* an extent's first page: its pages */
    uint8_t live;                /* created and not released */
} gm__ppage_t;

/* ---- the pool (pool.c) -------------------------------------------------- */

/* Handle validation: a live pool has magic == GM_POOL_MAGIC.  The struct
 * lives in its own mapping that is never unmapped nor reused: destroying a
 * pool zeroes it (MADV_DONTNEED), so a stale handle reads magic 0.  In a
 * child of fork() every pool of the parent reads GM_POOL_FORKED. */
#define GM_POOL_MAGIC UINT64_C(0x4c4f4f504d454d47)  /* "GMEMPOOL" */
#define GM_FORGOT_RING 16 /* streams forgotten while thread caches held blocks */
#define GM_POOL_FORKED UINT64_C(0x4b524f464d454d47) /* "GMEMFORK" */
#define GM_HEAP_MAGIC UINT64_C(0x5041454850454d47)  /* "GMEPHEAP": a heap, not a handle */
/* Most heaps one pool may have (gm_pool_config_t.heaps). */
#define GM_HEAPS_MAX 64

/* Accounting (checked by gm_pool_check):
 *   reserved == live physical pages * page;  mapped == n_maps * page
 *   active   == sum of live block sizes;  allocated == sum of their requests
 *   live_blocks == hash.count
 *   cached   == reserved - active */
struct gm_pool {
    /* Read by every call of every thread, written only when the pool (or
     * heap) is made or destroyed: a cache line of their own, so that the
     * threads of other heaps never miss on it when this heap's lock or
     * counters change. */
    uint64_t magic;              /* GM_POOL_MAGIC while usable (see above) */
    uint64_t tc_gen;             /* this pool's number for the thread caches
                                    (unique per pool made; 0 once destroyed) */
    /* gm_stream_forget calls that found blocks in thread caches: the count
     * (read by the caches' fast free, stored in each cached entry), and the
     * last GM_FORGOT_RING handles with the count after each (lock held).  A
     * cached block freed on such a stream before its forget was waited for
     * then; its cache gives it back as passed (tcache.c, drain_bin_locked). */
    _Atomic uint32_t forget_epoch;
    struct gm_pool *root;        /* heaps.c: the pool a heap belongs to (itself for the root) */
    unsigned heaps_max;          /* root: heaps a thread may be given (1: none) */

    _Alignas(64) gm__lock_t lock;
    struct {
        gm_stream_t handle;
        uint32_t epoch;
    } forgot[GM_FORGOT_RING];
    unsigned forgot_next;
    gm_pool_config_t cfg;
    const gm__backend_ops_t *ops;
    void *bk;                    /* backend context */
    gm_backend_kind_t backend_kind;
    char backend_reason[128];
    gm__backend_info_t info;
    size_t page;                 /* granularity */
    unsigned page_shift;
    size_t limit;                /* effective hard limit on reserved (see
                                    gm__pages_limit_allows) */
    gm__page_provider_t provider; /* where physical pages come from (provider.h) */
    uint64_t tc_next;            /* the next block generation (tcache.h) */
    /* Large cached blocks other threads' caches still count, taken back by
     * gm__tcache_reclaim_large_locked: the statistics subtract them until
     * each owner notices (tcache.c). */
    struct {
        _Atomic uint64_t req, act, n, frees, free_bytes;
    } tc_reclaimed;
    double slack_eff;            /* reserve slack in force (gm__pages_budget),
                                    between cfg.reserve_slack and its max */
    bool offl_dirty;             /* offloaded blocks may have pages to give back
                                    (gm__offload_trim_locked) */
    uint32_t ctl_allocs;         /* allocations in the controller's window */
    uint32_t ctl_window;         /* allocations per window (gm__controller_init) */
    uint32_t ctl_quiet;          /* windows in a row without a remapping call */
    bool churning;               /* a window remapped over the churn target, and no
                                    CTL_QUIET quiet windows since: placement avoids
                                    remaps (alloc.c, place_churning) */
    uint64_t ctl_calls;          /* remapping calls at the window's start */

    gm__arena_t arena[GM_CLASS_COUNT];

    gm__stream_t global;         /* blocks reusable by every stream */
    gm__streams_t streams;       /* per-stream states */
    size_t streams_sweep_at;     /* streams.n that triggers the next sweep */
    size_t n_active;             /* stream states that have allocated */

    gm__hash_t live;             /* addr -> live block */

    gm__block_t *pending;        /* freed blocks waiting on recorded streams */

    gm__slab_t blocks;           /* block records, freed at destroy */

    gm__ppage_t *phys;           /* physical pages by id */
    uint32_t n_phys_ids, cap_phys; /* ids handed out (live or dead) */
    uint32_t *dead_ids;          /* released ids, reused first */
    uint32_t n_dead;
    uint32_t lru_head, lru_tail; /* free physical pages, oldest first */
    uint32_t n_free_phys;
    uint32_t n_ext;              /* live extents */
    uint64_t ext_unowned;        /* extent pages that lost their owner, ever */
    uint64_t ext_scanned;        /* ext_unowned when a search for an idle
                                    extent last found none (pages.c) */
    size_t n_maps;               /* VA pages mapped, all arenas */

    gm_stats_t st;               /* counters kept under the lock (backend_calls
                                    and backend_ns: in bk_calls) */
    gm__bk_calls_t bk_calls;     /* every backend call of the pool (GM_BK) */

    /* Heaps (heaps.c).  A pool with cfg.heaps > 1 serves each thread from
     * one of up to that many heaps: the pool itself is heap 0 (the root),
     * the others are pool structs of their own (magic GM_HEAP_MAGIC, never a
     * public handle) made on first use, each with its own lock, arenas,
     * streams, physical pages and statistics, sharing the root's backend.
     * root == the pool itself for the root (root and heaps_max
     * are at the top, with the fields every call reads). */
    _Alignas(64) _Atomic(struct gm_pool *) heap[GM_HEAPS_MAX]; /* root: heap[0] = root, others once made */
    _Atomic unsigned n_heaps;    /* root: heap[0..n_heaps) may be non-NULL */
    unsigned next_heap;          /* root: the next heap a thread is given (heaps_mu) */
    pthread_mutex_t heaps_mu;    /* root: making heaps and binding threads */
    /* Root: reserved memory of every heap together (pages obtained minus
     * pages given back), the one figure the pool limit applies to, and its
     * peak.  Changed by each heap under its own lock, atomically. */
    _Alignas(64) _Atomic uint64_t fam_reserved, fam_reserved_peak;
    /* Root, with heaps: the sum of the heaps' allocated peaks, which the
     * growth budget of every heap is taken over (gm__pages_budget), so that
     * live memory moving from one heap to another does not make either remap
     * pages.  Kept only while heaps_max > 1 (gm__fam_peak_add). */
    _Atomic uint64_t fam_peak_sum;
    _Alignas(64) char pad_after_fam;

    struct gm__host *host;       /* pinned host pool (host.c), own lock */
    struct gm__copy *copy;       /* staged copy engine (copy.c), made at pool creation */
    struct gm__sysmem *sysmem;   /* device blocks served from host memory (sysmem.c) */
    struct gm__offload *offl;    /* root: tags, offload and restore (offload.c) */
    struct gm__managed *managed; /* root: managed allocations (managed.c), or NULL */
    struct gm__segs *segs;       /* root: registrable segments (segments.c), or NULL */
    struct gm__kinds *kinds;     /* root: addresses outside the arenas -> their memory
                                    kind's record (kinds.c), own lock */

    /* Observability (src/observe/observe.h): out-of-memory handlers, in the order
     * added; the leak tracker's stacks; the current trace buffer; this
     * pool's slot in the shared statistics segment; registry membership. */
    struct gm__oom_handler {
        gm_oom_handler_t fn;
        void *user;
    } oom_handlers[GM_OOM_MAX_HANDLERS];
    unsigned n_oom_handlers;
    struct gm__leak_table *leaks;
    struct gm__trace_buf *trace_buf;
    struct gm__mon_slot *mon;
    uint32_t mon_countdown;      /* operations until the slot is written anyway */
    uint64_t mon_allocated, mon_reserved, mon_mapped; /* as last written there */
    bool registered;
    struct gm_pool *all_prev, *all_next; /* every pool of the process (process.c) */
    /* The features the engine tells (gm__heap_hooks_t below): the pool's
     * table, set by gm_pool_create before any block exists, copied to each
     * heap. */
    const struct gm__heap_hooks *hooks;
};

/* ---- the engine's hooks ----------------------------------------------------
 *
 * The engine (alloc.c, pages.c, heaps.c, tcache.c, handles.c) tells the
 * features of an event through this table, never by name, so that it stands
 * on a floor below them (src/FLOORS): the pool fills it at creation
 * (pool.c), each heap shares its root's.  Every member may be NULL (nothing
 * to tell); each call sits behind the branch the engine already had, so a
 * pool without the feature pays what it paid before. */
typedef struct gm__heap_hooks {
    /* A block with a tag was made / is being freed (offload.c; lock held). */
    void (*tagged_alloc_locked)(gm_pool_t *heap, gm__block_t *b);
    void (*tagged_free_locked)(gm_pool_t *heap, gm__block_t *b);
    /* Trim found pool->offl_dirty: offloaded blocks may have pages to give
     * back (offload.c; lock held). */
    void (*offload_trim_locked)(gm_pool_t *heap);
    /* A heap other than the root was made / is about to be torn down (no
     * lock held): its monitor row, its trace rows. */
    void (*heap_made)(gm_pool_t *heap);
    void (*heap_gone)(gm_pool_t *heap);
    /* Pages were given back outside an entry point (lock held): the
     * monitor's copy is stale. */
    void (*trimmed_locked)(gm_pool_t *heap);
    /* A heap's engine is being torn down (gm__pool_core_fini_locked, lock
     * held): first the offloaded state of its blocks (only when its live
     * table was made), later, after the thread caches, the observers'. */
    void (*offload_fini_locked)(gm_pool_t *heap);
    void (*observers_fini_locked)(gm_pool_t *heap);
} gm__heap_hooks_t;

/* Whether leak tracking / the trace recorder are on (process-wide; set by
 * observe/leak.c and observe/tracelog.c, read by the engine: a thread cache
 * steps aside while either watches every block). */
extern atomic_int gm__leak_on, gm__trace_on;

/* ---- defined in src/api/process.c ------------------------------------------- */

/* The pool of `device` if it was created already (gm_device_pool), else
 * NULL; never creates one.  Ordinals run from 0 to gm__device_pool_count(). */
gm_pool_t *gm__device_pool_peek(int device);
int gm__device_pool_count(void);
/* The handle check of every public entry point (registry.c): GM_OK for a usable pool;
 * else GM_INVALID_STATE (a pool of the parent, in a child of fork) or
 * GM_INVALID_ARGUMENT (destroyed, or not a pool), with a message naming fn.
 * pool NULL: the default pool is put in *pool.  One compare when valid. */
int gm__pool_resolve_slow(gm_pool_t **pool, const char *fn);
/* The handle arena (handles.c): every pool and heap struct is a slot of a
 * reserved address range, so a handle is checked by its address before it is
 * read.  gm__handles_lo: the first chunk's start; gm__handles_units: how many
 * 4 KiB units of it are handed out (slots start on a page, so a handle is
 * 4 KiB-aligned).  The fast path turns both tests into one compare: the
 * offset rotated right by 12 bits is below the unit count only when it is in
 * range and aligned (UBSan and the hardware never see a misaligned read).
 * gm__handle_in_arena checks every chunk and the slot alignment, touching no
 * handle memory. */
#define GM_HANDLE_UNIT_SHIFT 12
extern _Atomic uintptr_t gm__handles_lo, gm__handles_units;
bool gm__handle_in_arena(const void *p);
static inline int gm__pool_resolve(gm_pool_t **pool, const char *fn)
{
    uintptr_t lo = atomic_load_explicit(&gm__handles_lo, memory_order_relaxed);
    uintptr_t units = atomic_load_explicit(&gm__handles_units, memory_order_acquire);
    uintptr_t x = (uintptr_t)*pool - lo;
    x = (x >> GM_HANDLE_UNIT_SHIFT) | (x << (sizeof x * 8 - GM_HANDLE_UNIT_SHIFT));
    if (GM_LIKELY(x < units && (*pool)->magic == GM_POOL_MAGIC)) return GM_OK;
    return gm__pool_resolve_slow(pool, fn);
}
/* First thing in gm_pool_create: installs the fork handlers (once). */
void gm__process_init(void);
/* At the end of a successful gm_pool_create (no lock held): lists and
 * registers the pool, and at the first pool applies GPUMEM_TRACE,
 * GPUMEM_LEAK_CHECK and the monitor segment and installs the exit handler. */
void gm__process_pool_created(gm_pool_t *pool);
/* First thing in a pool's teardown (no lock held): unlisted; when it was
 * registered, its leak report (leak checking on), trace flush, monitor slot
 * release, unregistration.  A pool never registered is fine. */
void gm__process_pool_destroying(gm_pool_t *pool);

/* ---- defined in src/core/registry.c ----------------------------------------- */

/* Call fn on every registered pool, holding the registry lock (not the pools'
 * locks).  Lock order: registry, then a pool's lock, then the trace lock. */
void gm__registry_foreach(void (*fn)(gm_pool_t *pool, void *arg), void *arg);
/* List pool for the walks (pool->registered set); false when there was no
 * room (the pool is observed less). */
bool gm__registry_add(gm_pool_t *pool);
/* Unlist pool; true when no registered pool is left. */
bool gm__registry_remove(gm_pool_t *pool);
void gm__registry_atfork_child(void);
/* The maker of the default pool (process.c's gm_default_pool), for the
 * handle check's NULL; handed down when the library is loaded. */
void gm__registry_set_default(int (*fn)(gm_pool_t **pool));

/* ---- defined in src/api/pool.c --------------------------------------------- */

/* Who owns a pointer, and what gm_free, gm_block_size, gm_record_stream
 * and the leak report do with it: the memory kinds' table (core/kinds.h). */

/* ---- defined in src/core/heaps.c -------------------------------------------- */

/* The heap this thread allocates from in root (the root itself when the pool
 * has no heaps).  No lock held; makes the heap on first use (a heap that
 * cannot be made: the root). */
gm_pool_t *gm__heap_self_slow(gm_pool_t *root);
extern _Thread_local struct gm__heap_binding {
    gm_pool_t *root;
    uint64_t gen;                /* root->tc_gen when bound */
    gm_pool_t *heap;
} gm__heap_bound;
static inline gm_pool_t *gm__heap_self(gm_pool_t *root)
{
    if (GM_LIKELY(root->heaps_max <= 1)) return root;
    if (GM_LIKELY(gm__heap_bound.root == root && gm__heap_bound.gen == root->tc_gen))
        return gm__heap_bound.heap;
    return gm__heap_self_slow(root);
}
/* The heaps of root made so far, root first:
 *     for (unsigned i = 0; (h = gm__heap_next(root, &i));) ...
 * A heap made meanwhile may be missed (none is removed before the root's
 * destruction). */
static inline gm_pool_t *gm__heap_next(gm_pool_t *root, unsigned *i)
{
    unsigned n = atomic_load_explicit(&root->n_heaps, memory_order_acquire);
    while (*i < n) {
        gm_pool_t *h = atomic_load_explicit(&root->heap[(*i)++], memory_order_acquire);
        if (h) return h;
    }
    return NULL;
}
static inline bool gm__heap_holds(const gm_pool_t *h, uintptr_t p)
{
    return p - h->arena[0].base < h->arena[0].size || p - h->arena[1].base < h->arena[1].size;
}
/* The heap whose address space holds ptr; the root for any other pointer
 * (sysmem and host blocks, garbage: the root's checks word the error). */
static inline gm_pool_t *gm__heap_of(gm_pool_t *root, const void *ptr)
{
    if (GM_LIKELY(root->heaps_max <= 1)) return root;
    uintptr_t p = (uintptr_t)ptr;
    if (gm__heap_bound.root == root && gm__heap_holds(gm__heap_bound.heap, p))
        return gm__heap_bound.heap;
    gm_pool_t *h;
    for (unsigned i = 1; (h = gm__heap_next(root, &i));)
        if (gm__heap_holds(h, p)) return h;
    return root;
}
/* A heap's allocated peak moved by d (lock held): the pool's sum follows. */
static inline void gm__fam_peak_add(gm_pool_t *pool, int64_t d)
{
    if (pool->root->heaps_max > 1)
        atomic_fetch_add_explicit(&pool->root->fam_peak_sum, (uint64_t)d, memory_order_relaxed);
}
/* Pool struct plumbing shared by pool.c and heaps.c (defined in handles.c):
 * a struct in a mapping of its own with its empty state set (root NULL: a
 * new pool), its death (pages dropped, address space kept), a dead slot
 * never handed out kept for the next pool, and the engine every
 * heap has, set up and (lock held) torn down; the fini adds the blocks and
 * bytes still live (those waiting in thread caches were freed) to *blocks
 * and *bytes. */
gm_pool_t *gm__pool_map_new(gm_pool_t *root);
void gm__pool_map_dead(gm_pool_t *pool);
void gm__pool_map_unused(gm_pool_t *pool);
int gm__pool_core_init(gm_pool_t *pool, size_t small_va, size_t large_va);
void gm__pool_core_fini_locked(gm_pool_t *pool, uint64_t *blocks, uint64_t *bytes);
/* Teardown of root's other heaps (root's destruction, no lock held); their
 * live blocks and bytes are added to *blocks and *bytes. */
void gm__heaps_destroy(gm_pool_t *root, uint64_t *blocks, uint64_t *bytes);
/* Out of memory in heap h (its lock held, dropped and taken again inside):
 * every other heap of its pool drains its streams and gives its free pages
 * back, so that h may make new ones.  Returns whether any page went back. */
bool gm__heaps_reclaim_others(gm_pool_t *h);

/* ---- defined in src/core/pages.c -------------------------------------------- */

/* The pool limit, one rule decided here: may reserved memory grow from
 * `reserved` by `more` bytes?  The page layer asks it before every page it
 * obtains (with pool->st.reserved); a request larger than the limit can never
 * fit (ask with reserved 0).  No message: a page refused here is often
 * served another way (a free page); the refusal that ends an allocation gets
 * its message from gm__pages_refuse_locked. */
static inline bool gm__pages_limit_allows(const gm_pool_t *pool, uint64_t reserved, size_t more)
{
    return more <= pool->limit && reserved <= pool->limit - more;
}
/* An allocation of the caller's `size` ends without pages: rc GM_LIMIT (the
 * pool limit or a provider's quota) or GM_OUT_OF_MEMORY (device or provider
 * full).  Sets the message (what is allocated and reserved, the limit, the
 * device's free memory, and the provider's word on it) and returns the
 * status: GM_LIMIT for GM_LIMIT, else GM_OUT_OF_MEMORY.  The one place an
 * allocation's refusal is worded: gm__alloc_locked passes it up unchanged,
 * so a provider's word reaches the caller. */
int gm__pages_refuse_locked(gm_pool_t *pool, int rc, size_t size);
int gm__arena_init(gm_pool_t *pool, gm__arena_t *a, int cls, size_t size, uint32_t gid_base);
void gm__arena_fini(gm_pool_t *pool, gm__arena_t *a);
/* Mark pages overlapping [addr, addr+size) used. Lock held. */
void gm__pages_mark_used_locked(gm__arena_t *a, uintptr_t addr, size_t size, size_t page_shift);
/* Pages wholly inside [addr, addr+size) (a free block) become unused and
 * give up ownership.  fs: the stream whose free made the block (its queued
 * work may still touch the pages: fence (fs, fseq)); NULL for the global
 * index (the free has passed: the pages' fences are cleared). */
void gm__pages_mark_unused_locked(gm_pool_t *pool, gm__arena_t *a, uintptr_t addr, size_t size,
                                  struct gm__stream *fs, uint64_t fseq);
/* Is every page overlapping [addr, addr+size) owned (ready, no calls)? */
bool gm__pages_ready_locked(const gm__arena_t *a, uintptr_t addr, size_t size, size_t shift);
/* Can every page overlapping [addr, addr+size) be made owned for stream s
 * without a backend call (owned, or its own mapping's physical page is free
 * and its fence allows s)? */
bool gm__pages_cheap_locked(gm_pool_t *pool, const gm__arena_t *a, uintptr_t addr, size_t size,
                            const struct gm__stream *s);
/* Would serving the range unmap a page: one of its pages not owned, mapped
 * to a physical page another range owns? */
bool gm__pages_remap_locked(gm_pool_t *pool, const gm__arena_t *a, uintptr_t addr, size_t size);
/* Make every page overlapping [addr, addr+size) mapped, accessible and owned
 * for an allocation on stream s, taking free physical pages (mapped here
 * too), or new ones.  The range's pages must already be marked used.
 * asked: the caller's size (what gm_alloc was asked for), which only feeds
 * the growth budget and the refusal message.  GM_LIMIT / GM_OUT_OF_MEMORY
 * come with the message of gm__pages_refuse_locked; GM_NOT_READY when a
 * page must be remapped whose fence cannot be passed (a held stream): the
 * range is no good now, untouched address space is.  how (GM__MAP_*):
 * SOLO, a block that may be published (gm_alloc_shareable): every page gets
 * a handle of its own; an extent in the range goes back first, or, while
 * another block still uses it, GM_NOT_READY.  EXTENTS, a tagged block's
 * (its allocation, or a restore's piece of it): the pages wholly inside the
 * range that are mapped nowhere are made as extents where the provider
 * allows (pages.c: one handle of several pages, mapped once), so that an
 * offload gives them back with few calls.  Lock held. */
enum { GM__MAP_SOLO = 1u, GM__MAP_EXTENTS = 2u };
int gm__pages_ensure_mapped_locked(gm_pool_t *pool, gm__arena_t *a, uintptr_t addr, size_t size,
                                   size_t asked, struct gm__stream *s, unsigned how);
/* Does any page overlapping [addr, addr+size) of a lie under an extent
 * (whose handle covers more than the page)?  Lock held. */
bool gm__pages_in_extent_locked(gm_pool_t *pool, const gm__arena_t *a, uintptr_t addr, size_t size);
/* Stream state s is being forgotten: clear the (passed) fences naming it. */
void gm__pages_forget_stream_locked(gm_pool_t *pool, const struct gm__stream *s);
/* The growth budget for live bytes `live` (max of live and its peak):
 * *allow, reserved memory up to which new pages are made rather than free
 * ones reused, and *cap, the same for a page that lost its own physical
 * page to a range live at the same time.  From pool->slack_eff. */
void gm__pages_budget(const gm_pool_t *pool, uint64_t live, uint64_t *allow, uint64_t *cap);
/* Release free physical pages (oldest first, skipping pages a held stream
 * may still touch) until cached <= keep. Lock held. */
int gm__pages_trim_locked(gm_pool_t *pool, size_t keep, size_t *released);
/* Release the free physical pages mapped under [addr, addr + size) of a
 * (a failed allocation's range, given back): those no other place owns
 * whose fences have passed (no waiting here; drain the streams first), an
 * extent only whole and idle.  Bytes released in *released (may be NULL);
 * the first failure stops it.  Lock held. */
int gm__pages_release_range_locked(gm_pool_t *pool, gm__arena_t *a, uintptr_t addr, size_t size,
                                   size_t *released);
/* Count bytes against the pool limit (all heaps and registrable segments
 * together) before asking for them: false, nothing counted, when they would
 * pass it.  Any lock or none. */
bool gm__pages_limit_take(gm_pool_t *pool, size_t bytes);
void gm__pages_limit_put(gm_pool_t *pool, size_t bytes);
/* Create and map `bytes` of pages at the start of the large arena. */
int gm__pages_prefault_locked(gm_pool_t *pool, size_t bytes);
/* The physical handles of the n pages from page-aligned addr, all owned
 * (under live blocks): out[0..n).  GM_INTERNAL when a page is not (a caller
 * that holds the block live makes that impossible). */
int gm__pages_handles_locked(gm_pool_t *pool, uintptr_t addr, size_t n, gm__phys_t *out);
int gm__pages_check_locked(gm_pool_t *pool);
void gm__pages_fini(gm_pool_t *pool);
/* Offload: release the pages of block b (live, offloaded, or free) in which
 * nothing resident lies: every block overlapping the page is offloaded, or
 * free with its fence passed.  Such a page loses its owner and its physical
 * page goes back to the provider (unmapped everywhere first).  A page that
 * cannot be released stays cached (free) and the first error returns;
 * *released (optional) grows by the bytes given back, *kept (optional) by
 * the pages of b still mapped and owned (a resident block or a fence keeps
 * them).  The pages stay
 * marked used (the block is live): gm__pages_ensure_mapped_locked maps
 * them again.  Lock held. */
int gm__pages_evict_locked(gm_pool_t *pool, gm__block_t *b, size_t *released, size_t *kept);
/* The same for the pages wholly inside [b->addr + lo, b->addr + hi) of a
 * block b still resident, whose bytes there the caller has copied (an
 * offload's copy of a large block, piece by piece): they lose their owner
 * and go back.  b must be marked offloaded, or those pages mapped again,
 * before the lock is let go.  Lock held. */
int gm__pages_evict_span_locked(gm_pool_t *pool, gm__block_t *b, size_t lo, size_t hi,
                                size_t *released);

/* ---- defined in src/core/alloc.c -------------------------------------------- */

/* The churn controller's starting state: one heap's slack at reserve_slack
 * and a pool's window; with root->heaps_max > 1, a heap's slack at its
 * ceiling and a heap's window.  At creation. */
void gm__controller_init(gm_pool_t *pool);

/* Allocate size bytes (0 < size <= GM_MAX_REQUEST, checked by gm_alloc) on
 * stream state s; an OOM status with a message when nothing fits. */
/* align: GM_ALIGNMENT, or the page size for a block that owns whole pages
 * (gm_alloc_shareable: its size is then rounded up to whole pages). */
/* tag: the block's gm_tag_t (GM_TAG_NONE: none; a tagged block never goes
 * through the thread cache). */
int gm__alloc_locked(gm_pool_t *pool, size_t size, size_t align, gm__stream_t *s, gm_tag_t tag,
                     void **ptr);
/* The streams recorded on live block b are known to have passed (the
 * offload waited for them): forget them. */
void gm__block_drop_recorded_locked(gm_pool_t *pool, gm__block_t *b);
/* The block (live or free) whose range holds address p, NULL when p lies in
 * no arena of pool: a walk of the arena's blocks (error paths and sharing,
 * never per operation). */
gm__block_t *gm__block_at_locked(gm_pool_t *pool, uintptr_t p);
/* Free the live block at ptr on stream s; *freed: its caller's size.  A
 * pointer that is not a live block: GM_INVALID_POINTER or GM_DOUBLE_FREE
 * with a message, nothing changed.  A block held by sharing (b->shared):
 * GM_OK with *held set (held may be NULL only where no block can be
 * shared) and nothing done: the shared kind's free takes it
 * (gm__kind_shared, after the lock is dropped). */
int gm__free_locked(gm_pool_t *pool, void *ptr, gm__stream_t *s, size_t *freed, bool *held);
int gm__record_stream_locked(gm_pool_t *pool, void *ptr, gm__stream_t *s);
/* The state of stream `handle`, created on first use (NULL: out of host
 * memory).  Creating one may first forget idle streams (see gm__stream_t):
 * callers hold no other gm__stream_t pointer across this call. */
gm__stream_t *gm__stream_get_locked(gm_pool_t *pool, gm_stream_t handle);
/* Stream states held now (tests: bounded by the streams in use). */
size_t gm__stream_count_locked(gm_pool_t *pool);
/* Synchronize streams holding freed blocks and move those blocks to the
 * global index, so their pages can be unmapped. */
void gm__drain_streams_locked(gm_pool_t *pool);
/* Before a stream is destroyed: wait for it if it holds free blocks and move
 * them to the global index.  GM_NOT_READY etc. from the sync. */
int gm__stream_retire_locked(gm_pool_t *pool, gm_stream_t handle);
/* A retired state of `handle` (gm_stream_forget waited for that stream):
 * where a thread cache gives back a block freed on it before it was
 * forgotten.  Falls back to gm__stream_get_locked when out of host memory. */
gm__stream_t *gm__stream_forgotten_locked(gm_pool_t *pool, gm_stream_t handle);
/* After gm__arena_init: the whole arena becomes one free block of the
 * global index.  GM_NO_HOST_MEMORY when no block record can be had. */
int gm__alloc_arena_ready_locked(gm_pool_t *pool, gm__arena_t *a);
int gm__alloc_check_locked(gm_pool_t *pool);
/* Largest mapped free run and total free mapped bytes, for stats. */
void gm__alloc_free_summary_locked(gm_pool_t *pool, uint64_t *largest, uint64_t *free_blocks);
void gm__alloc_fini(gm_pool_t *pool);

/* ---- defined in src/offload/offload.c ---------------------------------------- */

/* GM__OFFLOADED_*: a live block's data is on the device (NONE), in its
 * host copy (COPIED), or was discarded (DISCARDED).  RESTORING, added to
 * either, marks a block a gm_restore has mapped and filled again but not
 * yet finished (offload.c, restore_all: the heap's lock is dropped between
 * the two): the offload's books still count it offloaded, but its pages
 * hold its data, so nothing may give them back. */
enum {
    GM__OFFLOADED_NONE = 0,
    GM__OFFLOADED_COPIED = 1,
    GM__OFFLOADED_DISCARDED = 2,
    GM__OFFLOADED_RESTORING = 4
};
/* Is live block b's data off the device (its pages free to go back)? */
static inline bool gm__block_off_device(const gm__block_t *b)
{
    return b->offloaded && !(b->offloaded & GM__OFFLOADED_RESTORING);
}
/* This thread's current tag (gm_tag_scope), and how many threads have one
 * set: while none has, gm_alloc skips the thread-local read (a call into
 * the dynamic loader from a shared library). */
extern _Thread_local gm_tag_t gm__tag_now;
extern _Atomic unsigned gm__tag_scopes;
static inline gm_tag_t gm__tag_current(void)
{
    if (GM_LIKELY(atomic_load_explicit(&gm__tag_scopes, memory_order_relaxed) == 0)) return GM_TAG_NONE;
    return gm__tag_now;
}
/* Root only: the offload state (copy streams, tag figures); made at pool
 * creation, freed at teardown (before the host pool: it frees nothing
 * there, host copies go with the host pool). */
int gm__offload_init(gm_pool_t *root);
void gm__offload_fini(gm_pool_t *root);
/* gm_pool_check's part: while no offload runs, no host memory touched
 * ahead for one waits unregistered.  Takes the offload lock only if free
 * (a running offload is not waited for).  No other lock held. */
int gm__offload_check(gm_pool_t *root);
/* A tagged block was made / is being freed (heap lock held): the tag's
 * figures; an offloaded block's host copy is freed. */
void gm__offload_note_alloc_locked(gm_pool_t *heap, gm__block_t *b);
void gm__offload_note_free_locked(gm_pool_t *heap, gm__block_t *b);
/* GM_POOL_EVICT: offload the least recently released evictable tag that
 * is not held and has resident blocks (never `except`).  No lock held.
 * True when a tag was offloaded (something may have been freed). */
bool gm__offload_evict_one(gm_pool_t *root, gm_tag_t except);
/* After the streams were drained (gm__pages_trim_locked): give back the
 * pages of offloaded blocks that nothing resident holds any more (a
 * neighbour freed since the offload), when pool->offl_dirty says some may
 * be.  Lock held. */
void gm__offload_trim_locked(gm_pool_t *heap);
/* Teardown of a heap (lock held, before its live table goes): the records
 * of its offloaded blocks' host segments are freed (not the host memory:
 * the host pool releases that). */
void gm__offload_heap_fini_locked(gm_pool_t *heap);
/* tag was made by gm_tag_get (GM_TAG_NONE counts as valid). */
bool gm__tag_valid(gm_tag_t tag);
/* tag's name ("" for none or an unknown one).  No lock. */
const char *gm__tag_name(gm_tag_t tag);
/* Is an offload (gm_offload, or an eviction) of tag in root under way?  It
 * is marked before the offload checks that no block of the tag is shared
 * and until its moves are over; a publish asks under the block's heap lock
 * and refuses (share.c), so the check and the moves are one step for it. */
bool gm__offload_tag_moving(gm_pool_t *root, gm_tag_t tag);
/* Tests only (NULL otherwise): called by an offload between its check that
 * the tag holds no shared block and its moves (offl->mu held, no heap
 * lock), so that a test can publish at that point. */
extern void (*gm__offload_test_hook)(gm_pool_t *root, gm_tag_t tag);

/* The first step of an allocation that found no room (segments.c), lock held:
 * the thread cache flushed, streams drained, free pages trimmed, and in the
 * root cached registrable segments given back; the bytes given back. */
size_t gm__pool_reclaim_locked(gm_pool_t *pool);

/* ---- defined in src/core/segments.c (root's lock held) ----------------------- */
/* gm_alloc_registrable's work: a cached segment that fits, or a new one. */
int gm__segs_alloc_locked(gm_pool_t *pool, size_t size, gm_stream_t stream, void **ptr);
/* gm_free, gm_block_size, gm_record_stream and the leak report: the
 * segment row, gm__kind_segment (core/kinds.h). */
int gm__segs_set_hooks_locked(gm_pool_t *pool, const gm_register_hooks_t *hooks);
/* Give every cached segment back; the bytes given back. */
size_t gm__segs_trim_locked(gm_pool_t *pool);
void gm__segs_fini(gm_pool_t *pool);

#endif /* GM_POOL_H */
