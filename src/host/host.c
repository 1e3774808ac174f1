/* SPDX-License-Identifier: Apache-2.0 */
/*
 * host.c — the pinned host pool: gm_host_alloc / gm_host_free / gm_host_trim.
 *
 * Page-locking host memory is slow (cudaHostAlloc: 551 ms per GiB, 716 us for
 * a 4 KiB pair; registering touched memory: 46.7 ms per GiB), so the pool
 * registers large chunks (>= HOST_CHUNK_MIN, huge-page backed when the system
 * allows, placed on the device's NUMA node when there are several) once, and
 * carves them with a two-level segregated-fit index, like the device
 * allocator: an allocation and a free are a few list operations under one
 * lock, no system call.
 *
 * Streams: a block freed on stream S goes to S's own free index and is reused
 * at once by allocations on S (S's queue orders the reuse after the earlier
 * copies); other streams get it only after an event recorded on S, after the
 * free, has completed ("reclaim"), which moves it to the global index.
 *
 * Waste: requests of HOST_LARGE and more get a chunk of their own (64 KiB
 * rounding), reused whole only by requests it fits within 1/32; smaller ones
 * are carved from shared 32 MiB chunks.  When the pool must grow, it first
 * gives back wholly free chunks until unused pinned memory is at most 1/40 of
 * what is in use, so memory held stays close to memory requested.
 *
 * Owners: every block carries the kind it was allocated for (gm_host_alloc,
 * a staging buffer, a sysmem-fallback block; host.h), and a free names the
 * kind it expects, so no entry point can release another's block.
 *
 * Accounting (checked by host_check_locked in debug builds):
 *   reserved  == sum of chunk sizes
 *   in_use    == sum of live blocks' sizes
 *   allocated == sum of live blocks' requested sizes
 *   the blocks of a chunk tile it in address order; a free block sits in
 *   exactly one index (that of its owner), and no two adjacent free blocks
 *   have the same owner (they are merged).
 *
 * Locking: one lock per pool's host side (host->lock), taken by every entry
 * point here; backend calls made under it are growth, trim and reclaim only.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "host/host.h"

#define HOST_UNIT ((size_t)GM_ALIGNMENT)        /* block sizes are multiples of this */
#define HOST_CHUNK_ALIGN ((size_t)2 << 20)      /* chunks: whole huge pages */
#define HOST_CHUNK_MIN ((size_t)32 << 20)       /* chunk of small blocks */
#define HOST_LARGE ((size_t)1 << 20)            /* from here on: a chunk of its own */
#define HOST_LARGE_ALIGN ((size_t)64 << 10)     /* sizes of dedicated chunks */
#define HOST_UNUSED_DIV 40                      /* growth keeps unused <= in_use / 40 */
#define HOST_LARGE_FIT 32                       /* a large block serves requests within 1/32 */
enum { CLS_SMALL = 0, CLS_LARGE = 1 };
#define HFL 40                                  /* first-level classes */
#define HSL_BITS 3
#define HSL (1u << HSL_BITS)                    /* second-level classes */
#define OWNER_GLOBAL 0u
#define SLAB_BLOCKS 256

#ifndef MPOL_PREFERRED
#define MPOL_PREFERRED 1
#endif

typedef struct hchunk {
    uintptr_t base;
    size_t size;
    int cls;                     /* CLS_SMALL: carved; CLS_LARGE: one block, never split */
    uintptr_t dev;               /* device address of base */
    struct hblk *first;
    struct hchunk *next;
} hchunk_t;

typedef struct hblk {
    uintptr_t addr;
    size_t size;                 /* multiple of HOST_UNIT */
    size_t requested;            /* live: the caller's size */
    struct hblk *prev, *next;    /* address order in the chunk */
    struct hblk *fprev, *fnext;  /* free list */
    hchunk_t *chunk;
    uint64_t seq;                /* free in a stream index: that stream's free_seq then */
    uint32_t owner;              /* free: index of the owning stream (0: global) */
    uint32_t bucket;
    uint8_t free;
    uint8_t kind;                /* live: GM__HOST_USER / _STAGING / _SYSMEM (host.h) */
} hblk_t;

/* Invariant: bit fl of fl_bits <=> sl_bits[fl] != 0; bit sl of sl_bits[fl]
 * <=> heads[fl][sl] != NULL. */
typedef struct hidx {
    uint64_t fl_bits;
    uint8_t sl_bits[HFL];
    hblk_t *heads[HFL][HSL];
    size_t count, bytes;
} hidx_t;

typedef struct hstream {
    gm_stream_t handle;
    hidx_t idx[2];               /* by chunk class */
    uint64_t free_seq;           /* frees into idx so far */
    uint64_t ev_seq;             /* free_seq when ev was recorded */
    gm__event_t ev;              /* 0 until first needed */
    bool ev_pending;
} hstream_t;

struct gm__host {
    gm__lock_t lock;
    hchunk_t *chunks;
    hstream_t **streams;         /* [0] is the global index */
    uint32_t n_streams, cap_streams;
    uint32_t last;               /* lookup cache */
    gm__hash_t live;             /* addr -> live block (sized at the first allocation) */
    hblk_t *spare;               /* recycled descriptors */
    void **slabs;
    size_t n_slabs, cap_slabs;
    int numa_node;               /* device's node, or -1 */
    int numa_nodes;              /* online nodes */
    uint64_t reserved, reserved_peak, allocated, allocated_peak, alloc_count;
    uint64_t in_use;             /* sum of live block sizes */
};

/* ---- size classes ------------------------------------------------------------- */

static inline unsigned log2z(size_t x)
{
    return 63u - (unsigned)__builtin_clzll((unsigned long long)x);
}

/* Bucket of a block of u units (u >= 1): every block in it has >= its floor. */
static inline void bucket_of(size_t u, unsigned *fl, unsigned *sl)
{
    if (u < HSL) {
        *fl = 0;
        *sl = (unsigned)u;
        return;
    }
    unsigned l = log2z(u);
    *fl = l - HSL_BITS + 1;
    *sl = (unsigned)(u >> (l - HSL_BITS)) & (HSL - 1);
}

static void idx_insert(hidx_t *x, hblk_t *b)
{
    unsigned fl, sl;
    bucket_of(b->size / HOST_UNIT, &fl, &sl);
    b->bucket = fl * HSL + sl;
    b->fprev = NULL;
    b->fnext = x->heads[fl][sl];
    if (b->fnext) b->fnext->fprev = b;
    x->heads[fl][sl] = b;
    x->sl_bits[fl] |= (uint8_t)(1u << sl);
    x->fl_bits |= 1ull << fl;
    x->count++;
    x->bytes += b->size;
}

static void idx_remove(hidx_t *x, hblk_t *b)
{
    unsigned fl = b->bucket / HSL, sl = b->bucket % HSL;
    if (b->fprev) b->fprev->fnext = b->fnext;
    else x->heads[fl][sl] = b->fnext;
    if (b->fnext) b->fnext->fprev = b->fprev;
    if (!x->heads[fl][sl]) {
        x->sl_bits[fl] &= (uint8_t)~(1u << sl);
        if (!x->sl_bits[fl]) x->fl_bits &= ~(1ull << fl);
    }
    x->count--;
    x->bytes -= b->size;
}

/* A free block of at least u units, or NULL.  Looks in the class that holds
 * only blocks big enough, and above. */
static hblk_t *idx_find(const hidx_t *x, size_t u)
{
    if (!x->count) return NULL;
    size_t r = u < HSL ? u : u + ((size_t)1 << (log2z(u) - HSL_BITS)) - 1;
    unsigned fl, sl;
    bucket_of(r, &fl, &sl);
    if (fl >= HFL) return NULL;
    unsigned sbits = x->sl_bits[fl] & (unsigned)(~0u << sl);
    if (!sbits) {
        uint64_t fbits = fl + 1 < 64 ? x->fl_bits & (~0ull << (fl + 1)) : 0;
        if (!fbits) {
            /* The exact class may still hold one that fits. */
            bucket_of(u, &fl, &sl);
            for (hblk_t *b = x->heads[fl][sl]; b; b = b->fnext)
                if (b->size >= u * HOST_UNIT) return b;
            return NULL;
        }
        fl = (unsigned)__builtin_ctzll(fbits);
        sbits = x->sl_bits[fl];
    }
    return x->heads[fl][__builtin_ctz(sbits)];
}

/* ---- descriptors and the live table ---------------------------------------------- */

static hblk_t *blk_new(struct gm__host *h)
{
    if (!h->spare) {
        if (h->n_slabs == h->cap_slabs) {
            size_t nc = h->cap_slabs ? h->cap_slabs * 2 : 16;
            void **ns = gm__realloc(h->slabs, nc * sizeof *ns);
            if (!ns) return NULL;
            h->slabs = ns;
            h->cap_slabs = nc;
        }
        hblk_t *slab = gm__calloc(SLAB_BLOCKS, sizeof *slab);
        if (!slab) return NULL;
        h->slabs[h->n_slabs++] = slab;
        for (int i = SLAB_BLOCKS - 1; i >= 0; i--) {
            slab[i].fnext = h->spare;
            h->spare = &slab[i];
        }
    }
    hblk_t *b = h->spare;
    h->spare = b->fnext;
    memset(b, 0, sizeof *b);
    return b;
}

static void blk_release(struct gm__host *h, hblk_t *b)
{
    b->fnext = h->spare;
    h->spare = b;
}

/* The pool's hash table (alloc.c); empty until the first allocation. */
static hblk_t *table_get(struct gm__host *h, uintptr_t key)
{
    return h->live.cap ? gm__hash_get(&h->live, key) : NULL;
}

static hblk_t *table_take(struct gm__host *h, uintptr_t key)
{
    return h->live.cap ? gm__hash_take(&h->live, key) : NULL;
}

/* ---- streams ------------------------------------------------------------------------ */

/* The index of stream `handle`'s state, made on first use; 0 only for none
 * (out of memory). */
static uint32_t stream_slot(struct gm__host *h, gm_stream_t handle)
{
    if (h->last && h->streams[h->last]->handle == handle) return h->last;
    for (uint32_t i = 1; i < h->n_streams; i++)
        if (h->streams[i]->handle == handle) return h->last = i;
    if (h->n_streams == h->cap_streams) {
        uint32_t nc = h->cap_streams * 2;
        hstream_t **ns = gm__realloc(h->streams, nc * sizeof *ns);
        if (!ns) return 0;
        h->streams = ns;
        h->cap_streams = nc;
    }
    hstream_t *s = gm__calloc(1, sizeof *s);
    if (!s) return 0;
    s->handle = handle;
    h->streams[h->n_streams] = s;
    return h->last = h->n_streams++;
}

/* Insert free block b into the index of `owner`, merged with free neighbours
 * of the same owner. */
static void free_insert(struct gm__host *h, hblk_t *b, uint32_t owner, uint64_t seq)
{
    hidx_t *x = &h->streams[owner]->idx[b->chunk->cls];
    b->free = 1;
    b->owner = owner;
    b->seq = seq;
    hblk_t *p = b->prev, *n = b->next;
    if (p && p->free && p->owner == owner) {
        idx_remove(x, p);
        p->size += b->size;
        p->next = n;
        if (n) n->prev = p;
        if (b->seq > p->seq) p->seq = b->seq;
        blk_release(h, b);
        b = p;
    }
    if (n && n->free && n->owner == owner) {
        idx_remove(x, n);
        b->size += n->size;
        b->next = n->next;
        if (n->next) n->next->prev = b;
        if (n->seq > b->seq) b->seq = n->seq;
        blk_release(h, n);
    }
    idx_insert(x, b);
}

/* Move the free blocks of s freed up to sequence `upto` to the global index.
 * Host lock held.  Returns blocks moved. */
static size_t migrate_locked(struct gm__host *h, hstream_t *s, uint64_t upto)
{
    size_t moved = 0;
    for (unsigned fl = 0; fl < HFL * 2; fl++) {
        hidx_t *x = &s->idx[fl / HFL];
        for (unsigned sl = 0; sl < HSL; sl++) {
            hblk_t *b = x->heads[fl % HFL][sl];
            while (b) {
                hblk_t *nx = b->fnext;
                if (b->seq <= upto) {
                    idx_remove(x, b);
                    free_insert(h, b, OWNER_GLOBAL, 0);
                    moved++;
                }
                b = nx;
            }
        }
    }
    return moved;
}

/* Move blocks of other streams whose frees are known complete to the global
 * index.  Records an event on each stream holding blocks (once per batch of
 * frees) and asks whether it is done; never waits.  Backend failures here
 * only mean nothing moves: the error is cleared.  Returns blocks moved. */
static size_t reclaim_locked(gm_pool_t *pool, uint32_t except)
{
    struct gm__host *h = pool->host;
    size_t moved = 0;
    for (uint32_t i = 1; i < h->n_streams; i++) {
        hstream_t *s = h->streams[i];
        if (i == except || !(s->idx[0].count + s->idx[1].count)) continue;
        int rc;
        if (!s->ev_pending) {
            if (!s->ev) {
                GM_BK(rc, pool, event_create, (pool->bk, &s->ev));
                if (rc != GM_OK) {
                    s->ev = 0;
                    gm__clear_error();
                    continue;
                }
            }
            GM_BK(rc, pool, event_record, (pool->bk, s->ev, s->handle));
            if (rc != GM_OK) {
                gm__clear_error();
                continue;
            }
            s->ev_seq = s->free_seq;
            s->ev_pending = true;
        }
        GM_BK(rc, pool, event_query, (pool->bk, s->ev));
        if (rc != GM_OK) {
            if (rc != GM_NOT_READY) gm__clear_error();
            continue;
        }
        s->ev_pending = false;
        moved += migrate_locked(h, s, s->ev_seq);
    }
    return moved;
}

/* Before `handle` is destroyed (gm_stream_destroy): no event may be recorded
 * on it again, so wait for it if it holds free blocks and hand them to every
 * stream.  Takes the host lock. */
int gm__host_stream_retire(gm_pool_t *pool, gm_stream_t handle)
{
    struct gm__host *h = pool->host;
    int rc = GM_OK;
    if (!h) return GM_OK;
    gm__lock(&h->lock);
    for (uint32_t i = 1; i < h->n_streams; i++) {
        hstream_t *s = h->streams[i];
        if (s->handle != handle || !(s->idx[0].count + s->idx[1].count)) continue;
        GM_BK(rc, pool, stream_sync, (pool->bk, handle));
        if (rc == GM_OK) migrate_locked(h, s, UINT64_MAX);
        break;
    }
    gm__unlock(&h->lock);
    return rc;
}

/* ---- chunks -------------------------------------------------------------------------- */

static int online_nodes(void)
{
    char buf[128];
    int fd = open("/sys/devices/system/node/online", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 1;
    buf[n] = '\0';
    /* "0", "0-1", "0,2-3": more than one node iff it has '-' or ','. */
    return strpbrk(buf, "-,") ? 2 : 1;
}

/* Map `size` bytes (a multiple of 2 MiB) of host memory: explicit huge pages
 * when the system has them reserved, else transparent huge pages; preferred on
 * the device's NUMA node when there are several; touched, so registering only
 * pins. */
static void *chunk_map(struct gm__host *h, size_t size)
{
    void *p = MAP_FAILED;
    if (size % HOST_CHUNK_ALIGN == 0)
        p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
    if (p == MAP_FAILED) {
        p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
        (void)madvise(p, size, MADV_HUGEPAGE);
#endif
    }
    if (h->numa_node >= 0 && h->numa_node < 64 && h->numa_nodes > 1) {
        unsigned long mask = 1ul << h->numa_node;
        /* Best effort: a refused policy leaves the kernel's default. */
        (void)syscall(SYS_mbind, p, size, MPOL_PREFERRED, &mask, 64ul + 1, 0u);
    }
    for (size_t off = 0; off < size; off += 4096) ((volatile char *)p)[off] = 0;
    return p;
}

/* Give back wholly free chunks of the global index while unused pinned
 * memory would exceed 1/HOST_UNUSED_DIV of what is in use once `adding` more
 * is.  Best effort: a failing unregister leaves that chunk as it was. */
static void release_unused_locked(gm_pool_t *pool, size_t adding)
{
    struct gm__host *h = pool->host;
    uint64_t budget = (h->in_use + adding) / HOST_UNUSED_DIV;
    if (h->reserved - h->in_use > budget) reclaim_locked(pool, 0);
    for (hchunk_t **pc = &h->chunks; *pc && h->reserved - h->in_use > budget;) {
        hchunk_t *c = *pc;
        hblk_t *b = c->first;
        if (!(b->free && b->size == c->size && b->owner == OWNER_GLOBAL)) {
            pc = &c->next;
            continue;
        }
        int rc;
        GM_BK(rc, pool, host_unregister, (pool->bk, (void *)c->base));
        if (rc != GM_OK) {
            gm__clear_error();
            pc = &c->next;
            continue;
        }
        idx_remove(&h->streams[0]->idx[c->cls], b);
        blk_release(h, b);
        *pc = c->next;
        munmap((void *)c->base, c->size);
        h->reserved -= c->size;
        gm__free(c);
    }
}

/* A new chunk for a request of `need` bytes of class cls, its one free block
 * in the global index.  Host lock held. */
static int chunk_grow_locked(gm_pool_t *pool, size_t need, int cls, hblk_t **out)
{
    struct gm__host *h = pool->host;
    size_t size = cls == CLS_LARGE ? GM_ALIGN_UP(need, HOST_LARGE_ALIGN) : HOST_CHUNK_MIN;
    int rc;
    release_unused_locked(pool, need);
    hchunk_t *c = gm__calloc(1, sizeof *c);
    hblk_t *b = blk_new(h);
    if (!c || !b) {
        gm__free(c);
        if (b) blk_release(h, b);
        return gm__set_error(GM_NO_HOST_MEMORY, "gm_host_alloc: out of host memory for bookkeeping");
    }
    void *p = chunk_map(h, size);
    if (!p) {
        gm__free(c);
        blk_release(h, b);
        return gm__set_error(GM_NO_HOST_MEMORY, "gm_host_alloc: mmap of a %zu-byte chunk failed: %s",
                             size, strerror(errno));
    }
    GM_BK(rc, pool, host_register, (pool->bk, p, size, GM__HOST_DEVICEMAP));
    if (rc != GM_OK) goto fail_unmap;
    GM_BK(rc, pool, host_device_pointer, (pool->bk, p, &c->dev));
    if (rc != GM_OK) goto fail_unregister;
    c->base = (uintptr_t)p;
    c->size = size;
    c->cls = cls;
    c->first = b;
    c->next = h->chunks;
    h->chunks = c;
    b->addr = c->base;
    b->size = size;
    b->chunk = c;
    free_insert(h, b, OWNER_GLOBAL, 0);
    *out = b;
    h->reserved += size;
    if (h->reserved > h->reserved_peak) h->reserved_peak = h->reserved;
    return GM_OK;

fail_unregister: {
    char msg[256];
    snprintf(msg, sizeof msg, "%s", gm_last_error());
    int r2;
    GM_BK(r2, pool, host_unregister, (pool->bk, p));
    (void)r2;
    gm__set_error(rc, "%s", msg);
}
fail_unmap:
    munmap(p, size);
    gm__free(c);
    blk_release(h, b);
    return rc;
}

/* ---- init, fini ------------------------------------------------------------------------ */

int gm__host_init(gm_pool_t *pool)
{
    struct gm__host *h = gm__calloc(1, sizeof *h);
    if (!h) return gm__set_error(GM_NO_HOST_MEMORY, "gm_pool_create: out of host memory");
    h->streams = gm__calloc(4, sizeof *h->streams);
    if (h->streams) h->streams[0] = gm__calloc(1, sizeof **h->streams);
    if (!h->streams || !h->streams[0]) {
        if (h->streams) gm__free(h->streams[0]);
        gm__free(h->streams);
        gm__free(h);
        return gm__set_error(GM_NO_HOST_MEMORY, "gm_pool_create: out of host memory");
    }
    h->n_streams = 1;
    h->cap_streams = 4;
    h->numa_node = pool->info.numa_node;
    h->numa_nodes = online_nodes();
    pool->host = h;
    return GM_OK;
}

void gm__host_fini(gm_pool_t *pool)
{
    struct gm__host *h = pool->host;
    if (!h) return;
    int rc;
    for (hchunk_t *c = h->chunks, *n; c; c = n) {
        n = c->next;
        GM_BK(rc, pool, host_unregister, (pool->bk, (void *)c->base));
        if (rc != GM_OK) gm__clear_error(); /* nothing better to do at teardown */
        munmap((void *)c->base, c->size);
        gm__free(c);
    }
    for (uint32_t i = 0; i < h->n_streams; i++) {
        if (h->streams[i]->ev) {
            GM_BK(rc, pool, event_destroy, (pool->bk, h->streams[i]->ev));
            if (rc != GM_OK) gm__clear_error();
        }
        gm__free(h->streams[i]);
    }
    gm__free(h->streams);
    for (size_t i = 0; i < h->n_slabs; i++) gm__free(h->slabs[i]);
    gm__free(h->slabs);
    gm__hash_fini(&h->live);
    gm__free(h);
    pool->host = NULL;
}

/* ---- checks ---------------------------------------------------------------------------- */

#if GM_DEBUG >= 3
static void host_check_locked(struct gm__host *h)
{
    uint64_t reserved = 0, allocated = 0, in_use = 0;
    size_t live = 0, nfree = 0;
    for (hchunk_t *c = h->chunks; c; c = c->next) {
        reserved += c->size;
        uintptr_t at = c->base;
        gm_assert_expensive(c->cls == CLS_SMALL || (c->first && !c->first->next));
        for (hblk_t *b = c->first; b; b = b->next) {
            gm_assert_expensive(b->addr == at && b->chunk == c && b->size % HOST_UNIT == 0);
            at += b->size;
            if (b->free) {
                nfree++;
                gm_assert_expensive(b->owner < h->n_streams);
                gm_assert_expensive(!b->next || !b->next->free || b->next->owner != b->owner);
            } else {
                live++;
                allocated += b->requested;
                in_use += b->size;
            }
        }
        gm_assert_expensive(at == c->base + c->size);
    }
    size_t idx_count = 0;
    for (uint32_t i = 0; i < h->n_streams; i++)
        idx_count += h->streams[i]->idx[0].count + h->streams[i]->idx[1].count;
    gm_assert_expensive(reserved == h->reserved && allocated == h->allocated);
    gm_assert_expensive(live == h->live.count && nfree == idx_count && in_use == h->in_use);
}
#define HOST_CHECK(h) host_check_locked(h)
#else
#define HOST_CHECK(h) ((void)0)
#endif

/* ---- allocation ------------------------------------------------------------------------- */

#define resolve(pool) gm__pool_resolve((pool), __func__)

/* Take `u` units from free block b (in index of b->owner) as a live block. */
static hblk_t *carve_locked(struct gm__host *h, hblk_t *b, size_t u, size_t size)
{
    hidx_t *x = &h->streams[b->owner]->idx[b->chunk->cls];
    idx_remove(x, b);
    size_t want = u * HOST_UNIT;
    if (b->chunk->cls == CLS_SMALL && b->size - want >= HOST_UNIT) {
        hblk_t *r = blk_new(h);
        if (!r) {
            idx_insert(x, b);
            return NULL;
        }
        r->addr = b->addr + want;
        r->size = b->size - want;
        r->chunk = b->chunk;
        r->prev = b;
        r->next = b->next;
        if (b->next) b->next->prev = r;
        b->next = r;
        b->size = want;
        r->free = 1;
        r->owner = b->owner;
        r->seq = b->seq;
        idx_insert(x, r);
    }
    b->free = 0;
    b->requested = size;
    return b;
}

/* A free block of stream slot si's index of class cls for u units: for a
 * large request, only a whole chunk it fits within 1/HOST_LARGE_FIT (so big chunks are not
 * spent on smaller requests and stay releasable). */
static hblk_t *find_locked(struct gm__host *h, uint32_t si, int cls, size_t u)
{
    hblk_t *b = idx_find(&h->streams[si]->idx[cls], u);
    if (b && cls == CLS_LARGE && b->size / HOST_UNIT > u + u / HOST_LARGE_FIT) return NULL;
    return b;
}

int gm__host_alloc_kind(gm_pool_t *pool, int kind, size_t size, gm_stream_t stream, void **ptr,
                        uintptr_t *dptr)
{
    struct gm__host *h = pool->host;
    if (GM_UNLIKELY(size > GM_MAX_REQUEST))
        return gm__set_error(GM_NO_HOST_MEMORY, "gm_host_alloc: %zu bytes is more than any host has",
                             size);
    int cls = size >= HOST_LARGE ? CLS_LARGE : CLS_SMALL;
    size_t u = (cls == CLS_LARGE ? GM_ALIGN_UP(size, HOST_LARGE_ALIGN) : GM_ALIGN_UP(size, HOST_UNIT)) /
               HOST_UNIT;
    int rc = GM_OK;
    gm__lock(&h->lock);
    if (GM_UNLIKELY(gm__hash_reserve(&h->live) != GM_OK)) {
        rc = gm__set_error(GM_NO_HOST_MEMORY, "gm_host_alloc: out of host memory for bookkeeping");
        goto out;
    }
    uint32_t si = stream_slot(h, stream);
    if (GM_UNLIKELY(!si)) {
        rc = gm__set_error(GM_NO_HOST_MEMORY, "gm_host_alloc: out of host memory for a stream");
        goto out;
    }
    hblk_t *b = find_locked(h, si, cls, u);
    if (!b) b = find_locked(h, 0, cls, u);
    if (!b && reclaim_locked(pool, si)) b = find_locked(h, 0, cls, u);
    if (!b) {
        GM_CHECK_GOTO(chunk_grow_locked(pool, u * HOST_UNIT, cls, &b), rc, out);
    }
    if (!GM_ALWAYS(b != NULL) || !(b = carve_locked(h, b, u, size))) {
        rc = gm__set_error(GM_NO_HOST_MEMORY, "gm_host_alloc: out of host memory for bookkeeping");
        goto out;
    }
    (void)gm__hash_put(&h->live, b->addr, b); /* cannot fail: room reserved above */
    b->kind = (uint8_t)kind;
    h->in_use += b->size;
    h->allocated += size;
    if (h->allocated > h->allocated_peak) h->allocated_peak = h->allocated;
    h->alloc_count++;
    *ptr = (void *)b->addr;
    if (dptr) *dptr = b->chunk->dev + (b->addr - b->chunk->base);
out:
    HOST_CHECK(h);
    gm__unlock(&h->lock);
    return rc;
}

/* What a block of `kind` is, in gm__owner_name's words. */
static const char *kind_name(int kind)
{
    return gm__owner_name(kind == GM__HOST_USER     ? GM__OWNER_HOST
                          : kind == GM__HOST_SYSMEM ? GM__OWNER_SYSMEM
                                                    : GM__OWNER_INTERNAL);
}

int gm__host_free_kind(gm_pool_t *pool, int kind, void *ptr, gm_stream_t stream)
{
    struct gm__host *h = pool->host;
    const char *fn = kind == GM__HOST_USER ? "gm_host_free" : "gm_free";
    int rc = GM_OK;
    gm__lock(&h->lock);
    uint32_t si = stream_slot(h, stream);
    if (GM_UNLIKELY(!si)) {
        rc = gm__set_error(GM_NO_HOST_MEMORY, "%s: out of host memory for a stream", fn);
        goto out;
    }
    hblk_t *b = table_take(h, (uintptr_t)ptr);
    if (GM_UNLIKELY(b && b->kind != kind)) {
        (void)gm__hash_put(&h->live, b->addr, b); /* back where it was: room is there */
        rc = gm__set_error(GM_INVALID_ARGUMENT, "%s: %p is %s%s: nothing was freed", fn, ptr,
                           kind_name(b->kind),
                           b->kind == GM__HOST_SYSMEM ? " (free it with gm_free)" : "");
        goto out;
    }
    if (GM_UNLIKELY(!b)) {
        rc = gm__set_error(GM_INVALID_POINTER, "gm_host_free: %p is not a live block of this pool's "
                           "host memory (freed already, or never allocated by gm_host_alloc)", ptr);
        goto out;
    }
    h->allocated -= b->requested;
    h->in_use -= b->size;
    b->requested = 0;
    hstream_t *s = h->streams[si];
    free_insert(h, b, si, ++s->free_seq);
out:
    HOST_CHECK(h);
    gm__unlock(&h->lock);
    return rc;
}

int gm__host_alloc(gm_pool_t *pool, size_t size, gm_stream_t stream, void **ptr, uintptr_t *dptr)
{
    return gm__host_alloc_kind(pool, GM__HOST_STAGING, size, stream, ptr, dptr);
}

int gm__host_free(gm_pool_t *pool, void *ptr, gm_stream_t stream)
{
    return gm__host_free_kind(pool, GM__HOST_STAGING, ptr, stream);
}

int gm__host_kind(gm_pool_t *pool, const void *ptr)
{
    struct gm__host *h = pool->host;
    if (!h) return GM__HOST_NONE;
    gm__lock(&h->lock);
    hblk_t *b = table_get(h, (uintptr_t)ptr);
    int kind = b ? b->kind : GM__HOST_NONE;
    gm__unlock(&h->lock);
    return kind;
}

bool gm__host_is_pinned(gm_pool_t *pool, const void *p, size_t n)
{
    struct gm__host *h = pool->host;
    uintptr_t a = (uintptr_t)p;
    bool yes = false;
    gm__lock(&h->lock);
    for (hchunk_t *c = h->chunks; c && !yes; c = c->next)
        yes = a - c->base < c->size && n <= c->size - (a - c->base);
    gm__unlock(&h->lock);
    return yes;
}

int gm_host_alloc(gm_pool_t *pool, size_t size, gm_stream_t stream, void **ptr)
{
    if (GM_UNLIKELY(!ptr)) return gm__set_error(GM_INVALID_ARGUMENT, "gm_host_alloc: ptr is NULL");
    *ptr = NULL;
    GM_CHECK(resolve(&pool));
    if (GM_UNLIKELY(size == 0)) return GM_OK;
    return gm__host_alloc_kind(pool, GM__HOST_USER, size, stream, ptr, NULL);
}

int gm_host_free(gm_pool_t *pool, void *ptr, gm_stream_t stream)
{
    if (!ptr) return GM_OK;
    GM_CHECK(resolve(&pool));
    int rc = gm__host_free_kind(pool, GM__HOST_USER, ptr, stream);
    if (rc == GM_INVALID_POINTER) {
        /* Not the host pool's: device memory given to the wrong free? */
        gm__lock(&pool->lock);
        gm__owner_t owner = gm__owner_locked(pool, ptr, NULL);
        gm__unlock(&pool->lock);
        if (owner == GM__OWNER_DEVICE || owner == GM__OWNER_SYSMEM)
            rc = gm__set_error(GM_INVALID_ARGUMENT, "gm_host_free: %p is %s: nothing was freed "
                               "(free it with gm_free)", ptr, gm__owner_name(owner));
    }
    return rc;
}

int gm_host_trim(gm_pool_t *pool, size_t keep, size_t *released)
{
    GM_CHECK(resolve(&pool));
    struct gm__host *h = pool->host;
    size_t done = 0;
    int rc = GM_OK;
    gm__lock(&h->lock);
    reclaim_locked(pool, 0);
    size_t unused = 0;
    for (hchunk_t *c = h->chunks; c; c = c->next)
        if (c->first->free && c->first->size == c->size && c->first->owner == OWNER_GLOBAL)
            unused += c->size;
    for (hchunk_t **pc = &h->chunks; *pc && unused > keep;) {
        hchunk_t *c = *pc;
        hblk_t *b = c->first;
        if (!(b->free && b->size == c->size && b->owner == OWNER_GLOBAL)) {
            pc = &c->next;
            continue;
        }
        GM_BK(rc, pool, host_unregister, (pool->bk, (void *)c->base));
        if (rc != GM_OK) break; /* the chunk stays, whole and registered */
        idx_remove(&h->streams[0]->idx[c->cls], b);
        blk_release(h, b);
        *pc = c->next;
        munmap((void *)c->base, c->size);
        h->reserved -= c->size;
        unused -= c->size;
        done += c->size;
        gm__free(c);
    }
    HOST_CHECK(h);
    gm__unlock(&h->lock);
    if (released) *released = done;
    return rc;
}

void gm__host_stats(gm_pool_t *pool, gm_stats_t *s)
{
    struct gm__host *h = pool->host;
    if (!h) return;
    gm__lock(&h->lock);
    s->host_reserved = h->reserved;
    s->host_reserved_peak = h->reserved_peak;
    s->host_allocated = h->allocated;
    s->host_allocated_peak = h->allocated_peak;
    s->host_alloc_count = h->alloc_count;
    gm__unlock(&h->lock);
}

void gm__host_reset_peaks(gm_pool_t *pool)
{
    struct gm__host *h = pool->host;
    if (!h) return;
    gm__lock(&h->lock);
    h->reserved_peak = h->reserved;
    h->allocated_peak = h->allocated;
    gm__unlock(&h->lock);
}
