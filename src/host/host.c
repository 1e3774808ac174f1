/* SPDX-License-Identifier: Apache-2.0 */
/*
 * host.c — the pinned host pool: gm_host_alloc / gm_host_free / gm_host_trim.
 *
 * Page-locking host memory is slow (cudaHostAlloc: 551 ms per GiB, 716 us for
 * a 4 KiB pair; registering touched memory: 46.7 ms per GiB), so the pool
 * registers large chunks (>= HOST_CHUNK_MIN, huge-page backed when the system
 * allows, placed on the device's NUMA node when there are several) once, and
 * carves them through the free-memory engine (core/freemem.h) the device
 * allocator uses too: an allocation and a free are a few list operations
 * under one lock, no system call.  This file keeps only the host's policy:
 * chunks, huge pages, NUMA, registration, carving, giving chunks back.
 *
 * The host's engine policy: 8 buckets per power of two, searched "good fit"
 * (the request rounded up to a bucket whose every block fits); only blocks
 * of the same index merge.  Streams follow the engine's stream rule: a block
 * freed on stream S is reused at once by allocations on S and by others once
 * an event recorded on S after the free has completed ("reclaim").
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
 *   have the same owner (they are merged); a large chunk is one block.
 *
 * Locking: one lock per pool's host side (host->lock), taken by every entry
 * point here; backend calls made under it are growth, trim and reclaim only.
 */
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/kinds.h"
#include "host/host.h"

#define HOST_UNIT ((size_t)GM_ALIGNMENT)        /* block sizes are multiples of this */
#define HOST_CHUNK_ALIGN ((size_t)2 << 20)      /* chunks: whole huge pages */
#define HOST_CHUNK_MIN ((size_t)32 << 20)       /* chunk of small blocks */
#define HOST_LARGE ((size_t)1 << 20)            /* from here on: a chunk of its own */
#define HOST_LARGE_ALIGN ((size_t)64 << 10)     /* sizes of dedicated chunks */
#define HOST_UNUSED_DIV 40                      /* growth keeps unused <= in_use / 40 */
#define HOST_LARGE_FIT 32                       /* a large block serves requests within 1/32 */
#define HOST_SL_BITS 3                          /* second-level buckets: 8 per power of two */
#define HOST_PREP_MAX 2                         /* regions made ahead (gm__host_prepare) */
#define SLAB_BLOCKS 256

#ifndef MPOL_PREFERRED
#define MPOL_PREFERRED 1
#endif

/* A registered chunk: GM_CLASS_SMALL chunks are carved, a GM_CLASS_LARGE one
 * is one block, never split. */
typedef struct gm__hchunk {
    uintptr_t base;
    size_t size;
    int cls;
    uintptr_t dev;               /* device address of base */
    gm__block_t *first;
    struct gm__hchunk *next;
} hchunk_t;

struct gm__host {
    gm__lock_t lock;
    hchunk_t *chunks;
    gm__stream_t global;         /* blocks reusable by every stream */
    gm__streams_t streams;       /* per-stream states, never forgotten */
    gm__hash_t live;             /* addr -> live block (sized at the first allocation) */
    gm__slab_t blocks;           /* block records */
    int numa_node;               /* device's node, or -1 */
    int numa_nodes;              /* online nodes */
    uint64_t reserved, reserved_peak, allocated, allocated_peak, alloc_count;
    uint64_t in_use;             /* sum of live block sizes */
    uint64_t keep;               /* unused bytes growth leaves alone: a reserve
                                  * made ahead (gm__host_keep_unused; 0 after a trim) */
    /* Memory mapped and touched ahead of a chunk (gm__host_prepare), not
     * registered yet: the next new chunk of its size takes it. */
    struct host_prep {
        void *p;
        size_t size;
    } prep[HOST_PREP_MAX];
    unsigned n_prep;
};

static const gm__fm_policy_t HOST = {
    .sl_bits = HOST_SL_BITS,
    .take_global = false,
    .migrate_reversed = false,
    .reclaim_eager = false,
};

/* ---- the memory kinds' rows ---------------------------------------------------------- */

/* gm_host_alloc's blocks, and the library's own (staging buffers, offload
 * copies; a sysmem block's host side when its device address differs):
 * gm_free, gm_block_size and gm_record_stream refuse them.  Their records
 * are this file's blocks, under the host lock, so the address map names
 * each by one static record of its row. */
const gm__kind_ops_t gm__kind_host = {
    .name = "pinned host memory of gm_host_alloc",
    .free_with = "gm_host_free",
};
const gm__kind_ops_t gm__kind_internal = {
    .name = "pinned memory the library uses itself",
    .free_with = "",
};
static gm__kind_rec_t rec_user = {&gm__kind_host}, rec_internal = {&gm__kind_internal};

static gm__kind_rec_t *kind_rec(int kind)
{
    return kind == GM__HOST_USER ? &rec_user : &rec_internal;
}

/* ---- the live table ----------------------------------------------------------------- */

/* Empty until the first allocation. */
static gm__block_t *table_take(struct gm__host *h, uintptr_t key)
{
    return h->live.cap ? gm__hash_take(&h->live, key) : NULL;
}

/* ---- streams ------------------------------------------------------------------------ */

/* The state of stream `handle`, made on first use; NULL only when out of
 * memory. */
static gm__stream_t *host_stream(struct gm__host *h, gm_stream_t handle)
{
    gm__stream_t *s = gm__streams_find(&h->streams, handle);
    return s ? s : gm__streams_add(&h->streams, handle);
}

/* Move blocks of other streams whose frees are known complete to the global
 * index (the engine's reclaim step, never waiting; backend failures only
 * mean nothing moves).  Host lock held.  Returns blocks moved. */
static size_t reclaim_locked(gm_pool_t *pool, const gm__stream_t *except)
{
    struct gm__host *h = pool->host;
    size_t moved = 0;
    for (size_t i = 0; i < h->streams.n; i++)
        if (h->streams.all[i] != except)
            moved += gm__fm_reclaim(pool, &HOST, &h->blocks, h->streams.all[i], &h->global);
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
    gm__stream_t *s = gm__streams_find(&h->streams, handle);
    if (s && gm__fm_held(s)) rc = gm__fm_sync_migrate(pool, &HOST, &h->blocks, s, &h->global);
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

/* Touching fresh memory (the kernel zeroes each page) is most of the cost
 * of a new chunk: 120 ms per GiB on one thread against 17 ms to register it
 * once touched (H200 host, transparent huge pages).  Large chunks are
 * touched by several threads: 16 reach about 60 GB/s. */
#define TOUCH_PARALLEL_MIN ((size_t)64 << 20)
#define TOUCH_THREADS_MAX 16

typedef struct touch_job {
    char *p;
    size_t n;
} touch_job_t;

static void touch_range(char *p, size_t n)
{
    for (size_t off = 0; off < n; off += 4096) ((volatile char *)p)[off] = 0;
}

static void *touch_main(void *arg)
{
    touch_job_t *j = arg;
    touch_range(j->p, j->n);
    return NULL;
}

static void touch_all(char *p, size_t size)
{
    /* One core is left to the caller's other threads (an offload's copies
     * go on meanwhile): a thread sharing a core would finish its slice
     * last, and every touch waits for the slowest. */
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    size_t t = cpus > 2 ? (size_t)cpus - 1 : cpus > 1 ? (size_t)cpus : 1;
    if (t > TOUCH_THREADS_MAX) t = TOUCH_THREADS_MAX;
    if (size < TOUCH_PARALLEL_MIN || t == 1) {
        touch_range(p, size);
        return;
    }
    pthread_t th[TOUCH_THREADS_MAX];
    touch_job_t job[TOUCH_THREADS_MAX];
    bool started[TOUCH_THREADS_MAX] = {false};
    size_t slice = GM_ALIGN_UP(size / t, HOST_CHUNK_ALIGN);
    for (size_t i = 0; i < t; i++) {
        size_t lo = i * slice < size ? i * slice : size;
        size_t hi = lo + slice < size ? lo + slice : size;
        job[i] = (touch_job_t){p + lo, hi - lo};
        /* The caller takes the first slice, and any thread that cannot start. */
        if (i > 0 && job[i].n) started[i] = pthread_create(&th[i], NULL, touch_main, &job[i]) == 0;
    }
    for (size_t i = 0; i < t; i++)
        if (i == 0 || !started[i]) touch_range(job[i].p, job[i].n);
    for (size_t i = 1; i < t; i++)
        if (started[i]) pthread_join(th[i], NULL);
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
    touch_all(p, size);
    return p;
}

/* Is chunk c one free block of the global index (so it can be given back)? */
static bool chunk_unused(const struct gm__host *h, const hchunk_t *c)
{
    const gm__block_t *b = c->first;
    return b->free && b->size == c->size && b->owner == &h->global;
}

/* Give back unused chunks, in list order, until `excess` bytes are given
 * back (or none is left); adds what was given back to *released.  A chunk
 * whose unregister fails stays, whole and registered: with stop_on_failure
 * the pass ends there with that status; else its message is cleared and
 * the pass goes on. */
static int release_chunks_locked(gm_pool_t *pool, uint64_t excess, bool stop_on_failure,
                                 size_t *released)
{
    struct gm__host *h = pool->host;
    for (hchunk_t **pc = &h->chunks; *pc && excess > 0;) {
        hchunk_t *c = *pc;
        if (!chunk_unused(h, c)) {
            pc = &c->next;
            continue;
        }
        int rc;
        GM_BK(rc, pool, host_unregister, (pool->bk, (void *)c->base));
        if (rc != GM_OK) {
            if (stop_on_failure) return rc;
            gm__clear_error();
            pc = &c->next;
            continue;
        }
        gm__fm_remove(&h->global.idx[c->cls], c->first);
        gm__slab_release(&h->blocks, c->first);
        *pc = c->next;
        munmap((void *)c->base, c->size);
        h->reserved -= c->size;
        *released += c->size;
        excess = excess > c->size ? excess - c->size : 0;
        gm__free(c);
    }
    return GM_OK;
}

/* Give back unused chunks while unused pinned memory would exceed
 * 1/HOST_UNUSED_DIV of what is in use once `adding` more is.  Best effort. */
static void release_unused_locked(gm_pool_t *pool, size_t adding)
{
    struct gm__host *h = pool->host;
    uint64_t budget = (h->in_use + adding) / HOST_UNUSED_DIV + h->keep;
    if (h->reserved - h->in_use <= budget) return;
    reclaim_locked(pool, NULL);
    size_t released = 0;
    (void)release_chunks_locked(pool, h->reserved - h->in_use - budget, false, &released);
}

/* The class of a request of `size` bytes, and its size in HOST_UNITs. */
static int size_class(size_t size, size_t *u)
{
    int cls = size >= HOST_LARGE ? GM_CLASS_LARGE : GM_CLASS_SMALL;
    *u = (cls == GM_CLASS_LARGE ? GM_ALIGN_UP(size, HOST_LARGE_ALIGN) : GM_ALIGN_UP(size, HOST_UNIT)) /
         HOST_UNIT;
    return cls;
}

/* The size of a new chunk for a request of `need` bytes of class cls. */
static size_t chunk_size(size_t need, int cls)
{
    return cls == GM_CLASS_LARGE ? GM_ALIGN_UP(need, HOST_LARGE_ALIGN) : HOST_CHUNK_MIN;
}

/* A new chunk for a request of `need` bytes of class cls, its one free block
 * in the global index.  Host lock held. */
static int chunk_grow_locked(gm_pool_t *pool, size_t need, int cls, gm__block_t **out)
{
    struct gm__host *h = pool->host;
    size_t size = chunk_size(need, cls);
    int rc;
    release_unused_locked(pool, need);
    hchunk_t *c = gm__calloc(1, sizeof *c);
    gm__block_t *b = gm__slab_new(&h->blocks);
    if (!c || !b) {
        gm__free(c);
        if (b) gm__slab_release(&h->blocks, b);
        return gm__set_error(GM_NO_HOST_MEMORY, "gm_host_alloc: out of host memory for bookkeeping");
    }
    void *p = NULL;
    for (unsigned i = 0; i < h->n_prep && !p; i++)
        if (h->prep[i].size == size) {
            p = h->prep[i].p;
            h->prep[i] = h->prep[--h->n_prep];
        }
    if (!p) p = chunk_map(h, size);
    if (!p) {
        gm__free(c);
        gm__slab_release(&h->blocks, b);
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
    b->cls = (uint8_t)cls;
    gm__fm_seed(&HOST, b, &h->global);
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
    gm__slab_release(&h->blocks, b);
    return rc;
}

/* ---- init, fini ------------------------------------------------------------------------ */

int gm__host_init(gm_pool_t *pool)
{
    struct gm__host *h = gm__calloc(1, sizeof *h);
    if (!h) return gm__set_error(GM_NO_HOST_MEMORY, "gm_pool_create: out of host memory");
    h->global.is_global = true;
    h->blocks.per_slab = SLAB_BLOCKS;
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
    for (unsigned i = 0; i < h->n_prep; i++) munmap(h->prep[i].p, h->prep[i].size);
    gm__streams_fini(pool, &h->streams);
    gm__slab_fini(&h->blocks);
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
        gm_assert_expensive(c->cls == GM_CLASS_SMALL || (c->first && !c->first->next));
        for (gm__block_t *b = c->first; b; b = b->next) {
            gm_assert_expensive(b->addr == at && b->chunk == c && b->cls == c->cls &&
                                b->size % HOST_UNIT == 0);
            at += b->size;
            if (b->free) {
                nfree++;
                gm_assert_expensive(gm__fm_check_free(b, HOST.sl_bits) == GM_OK);
                gm_assert_expensive(!b->next || !b->next->free || b->next->owner != b->owner);
            } else {
                live++;
                allocated += b->requested;
                in_use += b->size;
            }
        }
        gm_assert_expensive(at == c->base + c->size);
    }
    size_t idx_count = gm__fm_held(&h->global);
    for (size_t i = 0; i < h->streams.n; i++) idx_count += gm__fm_held(h->streams.all[i]);
    gm_assert_expensive(gm__streams_check(&h->streams) == GM_OK);
    gm_assert_expensive(reserved == h->reserved && allocated == h->allocated);
    gm_assert_expensive(live == h->live.count && nfree == idx_count && in_use == h->in_use);
}
#define HOST_CHECK(h) host_check_locked(h)
#else
#define HOST_CHECK(h) ((void)0)
#endif

/* ---- allocation ------------------------------------------------------------------------- */

#define resolve(pool) gm__pool_resolve((pool), __func__)

/* Take `u` units from free block b (in its owner's index) as a live block:
 * a small chunk's block is split, a large chunk stays one block.  NULL when
 * out of memory for the rest's record. */
static gm__block_t *carve_locked(struct gm__host *h, gm__block_t *b, size_t u, size_t size)
{
    gm_assert_internal(b->free && b->cls == b->chunk->cls);
    if (gm__fm_take(&h->blocks, HOST.sl_bits, b, u * HOST_UNIT, b->cls == GM_CLASS_SMALL) != GM_OK)
        return NULL;
    b->requested = size;
    return b;
}

/* A free block of s's index of class cls for u units: for a large request,
 * only a whole chunk it fits within 1/HOST_LARGE_FIT (so big chunks are not
 * spent on smaller requests and stay releasable). */
static gm__block_t *find_locked(gm__stream_t *s, int cls, size_t u)
{
    /* A large chunk serves requests within 1/32 of its size: the tightest
     * one is looked for (a good fit would skip a chunk of exactly this size
     * sitting in the bucket below, and an offload that repeats would then
     * register new memory each time). */
    if (cls == GM_CLASS_LARGE) {
        gm__block_t *b = gm__fm_find_best(&s->idx[cls], u * HOST_UNIT, HOST.sl_bits);
        return b && b->size / HOST_UNIT <= u + u / HOST_LARGE_FIT ? b : NULL;
    }
    return gm__fm_find_good(&s->idx[cls], u * HOST_UNIT, HOST.sl_bits);
}

int gm__host_alloc_kind(gm_pool_t *pool, int kind, size_t size, gm_stream_t stream, void **ptr,
                        uintptr_t *dptr)
{
    struct gm__host *h = pool->host;
    gm_assert_internal(kind == GM__HOST_USER || kind == GM__HOST_STAGING || kind == GM__HOST_SYSMEM ||
                       kind == GM__HOST_OFFLOAD);
    if (GM_UNLIKELY(size > GM_MAX_REQUEST))
        return gm__set_error(GM_NO_HOST_MEMORY, "gm_host_alloc: %zu bytes is more than any host has",
                             size);
    size_t u;
    int cls = size_class(size, &u);
    int rc = GM_OK;
    gm__lock(&h->lock);
    if (GM_UNLIKELY(gm__hash_reserve(&h->live) != GM_OK)) {
        rc = gm__set_error(GM_NO_HOST_MEMORY, "gm_host_alloc: out of host memory for bookkeeping");
        goto out;
    }
    gm__stream_t *s = host_stream(h, stream);
    if (GM_UNLIKELY(!s)) {
        rc = gm__set_error(GM_NO_HOST_MEMORY, "gm_host_alloc: out of host memory for a stream");
        goto out;
    }
    gm__block_t *b = find_locked(s, cls, u);
    if (!b) b = find_locked(&h->global, cls, u);
    if (!b && reclaim_locked(pool, s)) b = find_locked(&h->global, cls, u);
    if (!b) {
        GM_CHECK_GOTO(chunk_grow_locked(pool, u * HOST_UNIT, cls, &b), rc, out);
    }
    if (!GM_ALWAYS(b != NULL) || !(b = carve_locked(h, b, u, size))) {
        rc = gm__set_error(GM_NO_HOST_MEMORY, "gm_host_alloc: out of host memory for bookkeeping");
        goto out;
    }
    (void)gm__hash_put(&h->live, b->addr, b); /* cannot fail: room reserved above */
    /* The host side of a sysmem block is in the map as the sysmem row's. */
    if (kind != GM__HOST_SYSMEM &&
        GM_UNLIKELY((rc = gm__kinds_add(pool, b->addr, kind_rec(kind), "gm_host_alloc")) != GM_OK)) {
        (void)gm__hash_take(&h->live, b->addr);
        b->requested = 0;
        gm__fm_release(pool, &HOST, &h->blocks, b, s);
        goto out;
    }
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

size_t gm__host_prepare_size(gm_pool_t *pool, size_t size)
{
    struct gm__host *h = pool->host;
    if (size == 0 || size > GM_MAX_REQUEST) return 0;
    size_t u;
    int cls = size_class(size, &u);
    gm__lock(&h->lock);
    bool need = h->n_prep < HOST_PREP_MAX && !find_locked(&h->global, cls, u);
    for (size_t i = 0; need && i < h->streams.n; i++)
        if (find_locked(h->streams.all[i], cls, u)) need = false;
    gm__unlock(&h->lock);
    return need ? chunk_size(u * HOST_UNIT, cls) : 0; /* as chunk_grow_locked makes it */
}

void gm__host_prepare(gm_pool_t *pool, size_t csize)
{
    struct gm__host *h = pool->host;
    if (csize == 0) return;
    void *p = chunk_map(h, csize); /* the long part, with no lock held */
    if (!p) return;                /* the chunk's own mmap will say why */
    gm__lock(&h->lock);
    if (h->n_prep < HOST_PREP_MAX) {
        h->prep[h->n_prep++] = (struct host_prep){p, csize};
        p = NULL;
    }
    gm__unlock(&h->lock);
    if (p) munmap(p, csize);
}

void gm__host_prepared_drop(gm_pool_t *pool)
{
    struct gm__host *h = pool->host;
    struct host_prep prep[HOST_PREP_MAX];
    gm__lock(&h->lock);
    unsigned n = h->n_prep;
    memcpy(prep, h->prep, sizeof prep);
    h->n_prep = 0;
    gm__unlock(&h->lock);
    for (unsigned i = 0; i < n; i++) munmap(prep[i].p, prep[i].size);
}

size_t gm__host_prepared_bytes(gm_pool_t *pool)
{
    struct gm__host *h = pool->host;
    size_t n = 0;
    gm__lock(&h->lock);
    for (unsigned i = 0; i < h->n_prep; i++) n += h->prep[i].size;
    gm__unlock(&h->lock);
    return n;
}

/* What a block of `kind` is, in its memory kind's words. */
static const char *kind_name(int kind)
{
    return kind == GM__HOST_SYSMEM ? gm__kind_sysmem.name : kind_rec(kind)->ops->name;
}

int gm__host_free_kind(gm_pool_t *pool, int kind, void *ptr, gm_stream_t stream)
{
    struct gm__host *h = pool->host;
    const char *fn = kind == GM__HOST_USER ? "gm_host_free" : "gm_free";
    int rc = GM_OK;
    gm__lock(&h->lock);
    gm__stream_t *s = host_stream(h, stream);
    if (GM_UNLIKELY(!s)) {
        rc = gm__set_error(GM_NO_HOST_MEMORY, "%s: out of host memory for a stream", fn);
        goto out;
    }
    gm__block_t *b = table_take(h, (uintptr_t)ptr);
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
    if (kind != GM__HOST_SYSMEM) gm__kinds_take(pool, (uintptr_t)ptr);
    h->allocated -= b->requested;
    h->in_use -= b->size;
    b->requested = 0;
    gm__fm_release(pool, &HOST, &h->blocks, b, s);
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
        gm_pool_t *h = gm__heap_of(pool, ptr);
        gm__kind_rec_t *rec;
        gm__lock(&h->lock);
        const gm__kind_ops_t *kind = gm__kind_of_locked(h, ptr, &rec);
        gm__unlock(&h->lock);
        if (kind && (kind->flags & GM__KIND_GM_ALLOC))
            rc = gm__set_error(GM_INVALID_ARGUMENT, "gm_host_free: %p is %s: nothing was freed "
                               "(free it with gm_free)", ptr, kind->name);
    }
    return rc;
}

void gm__host_keep_unused(gm_pool_t *pool)
{
    struct gm__host *h = pool->host;
    gm__lock(&h->lock);
    if (h->reserved - h->in_use > h->keep) h->keep = h->reserved - h->in_use;
    gm__unlock(&h->lock);
}

int gm_host_trim(gm_pool_t *pool, size_t keep, size_t *released)
{
    GM_CHECK(resolve(&pool));
    struct gm__host *h = pool->host;
    size_t done = 0;
    int rc = GM_OK;
    gm__lock(&h->lock);
    reclaim_locked(pool, NULL);
    size_t unused = 0;
    for (hchunk_t *c = h->chunks; c; c = c->next)
        if (chunk_unused(h, c)) unused += c->size;
    if (unused > keep) rc = release_chunks_locked(pool, unused - keep, true, &done);
    h->keep = 0; /* a reserve made ahead is given back like the rest */
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
