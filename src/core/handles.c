/* SPDX-License-Identifier: Apache-2.0 */
/*
 * handles.c — where every pool and heap struct lives, and the engine state
 * each of them has: the handle arena (a struct is a slot of a reserved
 * range, so a handle is checked by its address before it is read), a new
 * struct's empty state, its death, and the engine's set-up and (lock held)
 * tear-down of one heap: live table, streams, arenas, pages, thread caches.
 * Used by pool.c (the root) and heaps.c (the others); the features' part of
 * a tear-down is heard through the pool's hooks (pool.h).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/pool.h"

/* LeakSanitizer scans globals, stacks and heap blocks, not anonymous
 * mappings: a pool's mapping is declared a root so that what it points to
 * (and what the process keeps at exit: the library's own pools) is not
 * reported as leaked.  Weak: NULL outside sanitizer builds. */
extern void __lsan_register_root_region(const void *p, size_t size) __attribute__((weak));
extern void __lsan_unregister_root_region(const void *p, size_t size) __attribute__((weak));

static size_t pool_map_size(void)
{
    long pg = sysconf(_SC_PAGESIZE);
    size_t page = pg > 4096 ? (size_t)pg : 4096; /* slots start 4 KiB-aligned (pool.h) */
    return GM_ALIGN_UP(sizeof(struct gm_pool), page);
}

uint64_t gm__pool_next_gen(void)
{
    static _Atomic uint64_t made;
    return atomic_fetch_add_explicit(&made, 1, memory_order_relaxed) + 1;
}

/* ---- the handle arena ------------------------------------------------------
 *
 * Every pool and heap struct is a slot of one of a few address ranges
 * reserved (PROT_NONE) for them: a handle is checked by its address before a
 * byte of it is read, so a pointer that never was a pool (0x1, a freed
 * malloc block, a stack address, an unmapped page) is refused without
 * touching it.  Slots are handed out in order and never given back once
 * handed out (a destroyed pool's slot stays readable and reads magic 0), so
 * a stale handle never names a later pool.  Chunk 0's start and length are
 * what the inline fast path (gm__pool_resolve) compares; later chunks, made when one
 * fills, are checked by the slow path.  handles_mu guards the hand-out; the
 * bounds are published with release stores after a slot is mapped. */
#define HANDLE_CHUNKS 64
#define HANDLE_CHUNK_SLOTS 4096

/* chunk 0: its start, and its 4 KiB units handed out (pool.h) */
_Atomic uintptr_t gm__handles_lo, gm__handles_units;
static struct {
    _Atomic uintptr_t base, end; /* reserved at base; [base, end) handed out */
} chunks[HANDLE_CHUNKS];
static size_t n_chunks;
static void *spare; /* a slot made for a pool whose creation failed */
static pthread_mutex_t handles_mu = PTHREAD_MUTEX_INITIALIZER;

/* A slot's worth of address space, mapped read-write; NULL when out of
 * address space or host memory (handles_mu held). */
static void *slot_new_locked(void)
{
    size_t sz = pool_map_size();
    if (spare) {
        void *m = spare;
        spare = NULL;
        return m;
    }
    size_t c = n_chunks ? n_chunks - 1 : 0;
    uintptr_t base = atomic_load_explicit(&chunks[c].base, memory_order_relaxed);
    uintptr_t end = atomic_load_explicit(&chunks[c].end, memory_order_relaxed);
    if (!base || end - base == (uintptr_t)HANDLE_CHUNK_SLOTS * sz) {
        if (n_chunks == HANDLE_CHUNKS) return NULL;
        void *r = mmap(NULL, HANDLE_CHUNK_SLOTS * sz, PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (r == MAP_FAILED) return NULL;
        c = n_chunks++;
        base = end = (uintptr_t)r;
        atomic_store_explicit(&chunks[c].end, end, memory_order_relaxed);
        atomic_store_explicit(&chunks[c].base, base, memory_order_release);
        if (c == 0) atomic_store_explicit(&gm__handles_lo, base, memory_order_release);
    }
    void *m = mmap((void *)end, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                   -1, 0);
    if (m == MAP_FAILED) return NULL;
    atomic_store_explicit(&chunks[c].end, end + sz, memory_order_release);
    if (c == 0)
        atomic_store_explicit(&gm__handles_units, (end + sz - base) >> GM_HANDLE_UNIT_SHIFT,
                              memory_order_release);
    return m;
}

bool gm__handle_in_arena(const void *p)
{
    size_t sz = pool_map_size();
    uintptr_t a = (uintptr_t)p;
    for (size_t c = 0; c < HANDLE_CHUNKS; c++) {
        uintptr_t base = atomic_load_explicit(&chunks[c].base, memory_order_acquire);
        if (!base) break;
        uintptr_t end = atomic_load_explicit(&chunks[c].end, memory_order_acquire);
        if (a >= base && a < end) return (a - base) % sz == 0;
    }
    return false;
}

/* NULL when out of host memory. */
gm_pool_t *gm__pool_map_new(gm_pool_t *root)
{
    pthread_mutex_lock(&handles_mu);
    void *mem = slot_new_locked();
    pthread_mutex_unlock(&handles_mu);
    if (!mem) return NULL;
    if (__lsan_register_root_region) __lsan_register_root_region(mem, pool_map_size());
    gm_pool_t *pool = mem;
    pool->st.size = sizeof pool->st;
    pool->st.version = GM_STATS_VERSION;
    pool->global.is_global = true;
    pool->lru_head = pool->lru_tail = GM_NONE;
    pool->tc_gen = gm__pool_next_gen();
    pool->root = root ? root : pool;
    pool->heaps_max = 1;
    return pool;
}

/* The struct's pages are given back and read as zeros (magic 0); the
 * address space stays, so a stale pointer never names a later pool. */
void gm__pool_map_dead(gm_pool_t *pool)
{
    pool->magic = 0;
    if (__lsan_unregister_root_region) __lsan_unregister_root_region(pool, pool_map_size());
    madvise(pool, pool_map_size(), MADV_DONTNEED);
}

/* A slot never handed out to a caller (its pool's creation failed; the
 * teardown already made it dead: zeroed, no longer a LeakSanitizer root):
 * kept for the next pool. */
void gm__pool_map_unused(gm_pool_t *pool)
{
    pthread_mutex_lock(&handles_mu);
    if (!spare) spare = pool; /* else it stays a dead slot, read as magic 0 */
    pthread_mutex_unlock(&handles_mu);
}

/* What every heap has (the root and the others): the live table, the
 * stream states with the default stream's, and the two arenas of small_va
 * and large_va bytes of address space, each one free block. */
int gm__pool_core_init(gm_pool_t *pool, size_t small_va, size_t large_va)
{
    GM_CHECK(gm__hash_init(&pool->live, 1024));
    GM_CHECK(gm__hash_init(&pool->streams.of, 16));
    if (!gm__stream_get_locked(pool, NULL))
        return gm__set_error(GM_NO_HOST_MEMORY, "gm_pool_create: out of host memory");
    GM_CHECK(gm__arena_init(pool, &pool->arena[GM_CLASS_SMALL], GM_CLASS_SMALL, small_va, 0));
    GM_CHECK(gm__arena_init(pool, &pool->arena[GM_CLASS_LARGE], GM_CLASS_LARGE, large_va,
                            (uint32_t)pool->arena[GM_CLASS_SMALL].npages));
    for (int c = 0; c < GM_CLASS_COUNT; c++) GM_CHECK(gm__alloc_arena_ready_locked(pool, &pool->arena[c]));
    return GM_OK;
}

/* Undo gm__pool_core_init, however far it got (lock held, or the struct
 * not yet seen by anyone): every thread cache bound to it drops it. */
void gm__pool_core_fini_locked(gm_pool_t *pool, uint64_t *blocks, uint64_t *bytes)
{
    if (pool->live.cap && pool->hooks && pool->hooks->offload_fini_locked)
        pool->hooks->offload_fini_locked(pool);
    gm_stats_t left = {.allocated = pool->st.allocated, .live_blocks = pool->live.count};
    gm__tcache_adjust_locked(pool, &left); /* cached blocks were freed by the program */
    *blocks += left.live_blocks;
    *bytes += left.allocated;
    gm__tcache_pool_fini_locked(pool);
    pool->tc_gen = 0;
    if (pool->hooks && pool->hooks->observers_fini_locked) pool->hooks->observers_fini_locked(pool);
    gm__pages_fini(pool);
    for (int c = 0; c < GM_CLASS_COUNT; c++) gm__arena_fini(pool, &pool->arena[c]);
    gm__alloc_fini(pool);
}
