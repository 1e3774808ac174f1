/*
 * pages.c — physical pages behind the pool's address space.
 *
 * An arena is one reservation of virtual address space cut into pages of the
 * device's granularity (2 MiB).  A page is mapped on the first allocation
 * that touches it and then stays mapped while cached, so a repeating workload
 * reaches a state where it makes no backend call at all.  When a range needs
 * pages, they come, in this order, from: spare (created, unmapped) handles;
 * new handles, while reserved memory stays within a small budget over the
 * live bytes; empty pages elsewhere, unmapped and mapped here ("stealing");
 * new handles past the budget, up to the limit.  Stealing is what keeps
 * reserved close to live: a page freed inside a hole is never stranded.
 *
 * A page may be unmapped only when it is "empty": mapped and wholly inside a
 * free block of the global index.  Blocks reach the global index only after
 * the stream that freed them was synchronized (alloc.c's drain), so no queued
 * work can touch an unmapped page.
 *
 * Costs (H100): create 7.4 µs, map 0.5 µs, set access ~19 µs per handle in
 * the range, unmap 13.9 µs, release 9.3 µs.  One set_access covers each run
 * of pages mapped together; stealing one page costs ~34 µs, so it belongs to
 * growth, never to the steady state.
 *
 * Every function here expects the pool lock to be held.
 */
#include <stdlib.h>
#include <string.h>

#include "pool.h"

/* Growth budget: new handles are created without looking for empty pages
 * while reserved stays within max(live, live peak) * (1 + 1/GROW_SLACK_DIV)
 * + GROW_SLACK_PAGES pages.
 * Beyond it, empty pages are reused first.  The slack avoids moving pages
 * back and forth in a steady state; it is small enough to keep the peak
 * ratio reserved/live under 1.02. */
#ifndef GROW_SLACK_DIV
#define GROW_SLACK_DIV 128
#endif
#ifndef GROW_SLACK_PAGES
#define GROW_SLACK_PAGES 4
#endif

void gm__bk_account(gm_pool_t *pool, int kind, uint64_t t0)
{
    pool->st.backend_calls[kind]++;
    pool->st.backend_ns += gm__now_ns() - t0;
}

/* ---- bitmaps ------------------------------------------------------------ */

static inline uint64_t word_mask(size_t lo, size_t hi) /* bits [lo, hi) of a word, hi <= 64 */
{
    uint64_t m = hi >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << hi) - 1);
    return m & ~(((uint64_t)1 << lo) - 1);
}

static inline bool bit_get(const uint64_t *bits, size_t i)
{
    return (bits[i >> 6] >> (i & 63)) & 1;
}

static inline void bit_set(uint64_t *bits, size_t i) { bits[i >> 6] |= (uint64_t)1 << (i & 63); }
static inline void bit_clear(uint64_t *bits, size_t i) { bits[i >> 6] &= ~((uint64_t)1 << (i & 63)); }

/* Are all bits [p0, p1) set? */
static bool range_all_set(const uint64_t *bits, size_t p0, size_t p1)
{
    while (p0 < p1) {
        size_t w = p0 >> 6, lo = p0 & 63;
        size_t hi = (p1 - (w << 6)) < 64 ? (p1 - (w << 6)) : 64;
        uint64_t m = word_mask(lo, hi);
        if ((bits[w] & m) != m) return false;
        p0 = (w << 6) + hi;
    }
    return true;
}

bool gm__pages_mapped_locked(const gm__arena_t *a, uintptr_t addr, size_t size, size_t shift)
{
    size_t p0 = (addr - a->base) >> shift;
    size_t p1 = ((addr + size - 1 - a->base) >> shift) + 1;
    if (GM_LIKELY(p1 - p0 == 1)) return bit_get(a->mapped, p0);
    return range_all_set(a->mapped, p0, p1);
}

/* ---- arenas ------------------------------------------------------------- */

int gm__arena_init(gm_pool_t *pool, gm__arena_t *a, int cls, size_t size)
{
    int rc;
    memset(a, 0, sizeof *a);
    a->cls = cls;
    a->size = GM_ALIGN_UP(size, pool->page);
    a->npages = a->size >> pool->page_shift;
    size_t words = (a->npages + 63) / 64;
    a->mapped = calloc(words, sizeof(uint64_t));
    a->used = calloc(words, sizeof(uint64_t));
    a->handle = calloc(a->npages, sizeof(gm__phys_t));
    gm__block_t *b = gm__block_new_locked(pool);
    if (!a->mapped || !a->used || !a->handle || !b) {
        rc = gm__set_error(GM_NO_HOST_MEMORY, "gm_pool_create: out of host memory for page tables");
        goto fail;
    }
    GM_BK(rc, pool, va_reserve, (pool->bk, a->size, pool->page, &a->base));
    if (rc != GM_OK) goto fail;
    /* The whole arena starts as one free block of the global index. */
    b->addr = a->base;
    b->size = a->size;
    b->arena = a;
    b->free = 1;
    b->owner = &pool->global;
    a->first = b;
    gm__freeidx_insert(&pool->global.idx[cls], b);
    return GM_OK;
fail:
    if (b) { b->fnext = pool->block_freelist; pool->block_freelist = b; }
    free(a->mapped);
    free(a->used);
    free(a->handle);
    a->mapped = a->used = NULL;
    a->handle = NULL;
    return rc;
}

/* Unmap and release every page, then the reservation.  Errors are ignored:
 * the pool is going away and nothing can be retried. */
void gm__arena_fini(gm_pool_t *pool, gm__arena_t *a)
{
    int rc;
    if (!a->mapped) return;
    for (size_t p = 0; p < a->npages; p++) {
        if (!bit_get(a->mapped, p)) continue;
        GM_BK(rc, pool, unmap, (pool->bk, a->base + (p << pool->page_shift), pool->page));
        if (rc == GM_OK) GM_BK(rc, pool, phys_release, (pool->bk, a->handle[p]));
    }
    if (a->base) GM_BK(rc, pool, va_free, (pool->bk, a->base, a->size));
    (void)rc;
    free(a->mapped);
    free(a->used);
    free(a->handle);
    a->mapped = a->used = NULL;
    a->handle = NULL;
}

/* ---- used marks ---------------------------------------------------------- */

void gm__pages_mark_used_locked(gm__arena_t *a, uintptr_t addr, size_t size, size_t shift)
{
    size_t p0 = (addr - a->base) >> shift;
    size_t p1 = ((addr + size - 1 - a->base) >> shift) + 1;
    if (GM_LIKELY(p1 - p0 == 1) && bit_get(a->used, p0)) return; /* common: already used */
    while (p0 < p1) {
        size_t w = p0 >> 6, lo = p0 & 63;
        size_t hi = (p1 - (w << 6)) < 64 ? (p1 - (w << 6)) : 64;
        uint64_t m = word_mask(lo, hi);
        uint64_t fresh = m & ~a->used[w];
        a->n_empty -= (size_t)__builtin_popcountll(fresh & a->mapped[w]);
        a->used[w] |= m;
        p0 = (w << 6) + hi;
    }
}

void gm__pages_mark_unused_locked(gm__arena_t *a, uintptr_t addr, size_t size, size_t shift)
{
    size_t page = (size_t)1 << shift;
    uintptr_t lo_addr = GM_ALIGN_UP(addr - a->base, page);
    uintptr_t hi_addr = GM_ALIGN_DOWN(addr + size - a->base, page);
    if (hi_addr <= lo_addr) return;
    size_t p0 = lo_addr >> shift, p1 = hi_addr >> shift;
    while (p0 < p1) {
        size_t w = p0 >> 6, lo = p0 & 63;
        size_t hi = (p1 - (w << 6)) < 64 ? (p1 - (w << 6)) : 64;
        uint64_t m = word_mask(lo, hi);
        uint64_t gone = m & a->used[w];
        a->n_empty += (size_t)__builtin_popcountll(gone & a->mapped[w]);
        a->used[w] &= ~m;
        p0 = (w << 6) + hi;
    }
}

/* ---- physical pages ------------------------------------------------------ */

static size_t total_empty(const gm_pool_t *pool)
{
    size_t n = 0;
    for (int c = 0; c < GM_CLASS_COUNT; c++) n += pool->arena[c].n_empty;
    return n;
}

static int spare_push(gm_pool_t *pool, gm__phys_t h)
{
    if (pool->n_spare == pool->cap_spare) {
        size_t cap = pool->cap_spare ? pool->cap_spare * 2 : 64;
        gm__phys_t *s = realloc(pool->spare, cap * sizeof *s);
        if (!s) return GM_NO_HOST_MEMORY;
        pool->spare = s;
        pool->cap_spare = cap;
    }
    pool->spare[pool->n_spare++] = h;
    return GM_OK;
}

static int create_page(gm_pool_t *pool, gm__phys_t *h)
{
    int rc;
    if (pool->st.reserved + pool->page > pool->limit) return GM_LIMIT;
    GM_BK(rc, pool, phys_create, (pool->bk, pool->page, h));
    if (rc != GM_OK) return rc;
    pool->st.reserved += pool->page;
    if (pool->st.reserved > pool->st.reserved_peak) pool->st.reserved_peak = pool->st.reserved;
    return GM_OK;
}

/* Find an empty page, scanning down from the arena's hint. */
static bool find_empty(gm__arena_t *a, size_t *page)
{
    if (a->n_empty == 0) return false;
    size_t words = (a->npages + 63) / 64;
    size_t start = a->steal_hint < words ? a->steal_hint : words - 1;
    for (size_t k = 0; k < words; k++) {
        size_t w = (start + words - k) % words;
        uint64_t cand = a->mapped[w] & ~a->used[w];
        if (cand) {
            *page = (w << 6) + 63 - (size_t)__builtin_clzll(cand);
            a->steal_hint = w;
            return true;
        }
    }
    return false;
}

/* Unmap one empty page and hand its physical handle to the caller. */
static int steal_page(gm_pool_t *pool, gm__phys_t *h)
{
    for (int c = GM_CLASS_COUNT - 1; c >= 0; c--) {
        gm__arena_t *a = &pool->arena[c];
        size_t p;
        if (!find_empty(a, &p)) continue;
        int rc;
        GM_BK(rc, pool, unmap, (pool->bk, a->base + (p << pool->page_shift), pool->page));
        if (rc != GM_OK) return rc;
        bit_clear(a->mapped, p);
        a->n_mapped--;
        a->n_empty--;
        pool->st.mapped -= pool->page;
        pool->st.pages_stolen++;
        *h = a->handle[p];
        return GM_OK;
    }
    return GM_OUT_OF_MEMORY;
}

/* One physical page for a range being mapped. *budget is how many pages may
 * still be created without looking for empty ones; *drained says whether the
 * streams were already drained during this request. */
static int take_page(gm_pool_t *pool, gm__phys_t *h, size_t *budget, bool *drained)
{
    int rc;
    if (pool->n_spare) {
        *h = pool->spare[--pool->n_spare];
        return GM_OK;
    }
    if (*budget) {
        rc = create_page(pool, h);
        if (rc == GM_OK) {
            (*budget)--;
            return GM_OK;
        }
        if (rc != GM_LIMIT && rc != GM_OUT_OF_MEMORY) return rc;
        *budget = 0;
    }
    if (total_empty(pool) == 0 && !*drained) {
        *drained = true;
        gm__drain_streams_locked(pool);
    }
    if (total_empty(pool) > 0) return steal_page(pool, h);
    return create_page(pool, h);
}

static int set_access_run(gm_pool_t *pool, gm__arena_t *a, size_t r0, size_t r1)
{
    int rc;
    GM_BK(rc, pool, set_access,
          (pool->bk, a->base + (r0 << pool->page_shift), (r1 - r0) << pool->page_shift));
    if (rc == GM_OK) return GM_OK;
    /* Undo the run: its pages cannot be used without access. */
    for (size_t p = r0; p < r1; p++) {
        int rc2;
        GM_BK(rc2, pool, unmap, (pool->bk, a->base + (p << pool->page_shift), pool->page));
        if (rc2 != GM_OK) continue; /* stays mapped (and counted); trim retries */
        bit_clear(a->mapped, p);
        a->n_mapped--;
        pool->st.mapped -= pool->page;
        if (spare_push(pool, a->handle[p]) != GM_OK) {
            GM_BK(rc2, pool, phys_release, (pool->bk, a->handle[p]));
            if (rc2 == GM_OK) pool->st.reserved -= pool->page;
        }
    }
    return rc;
}

int gm__pages_ensure_mapped_locked(gm_pool_t *pool, gm__arena_t *a, uintptr_t addr, size_t size,
                                   size_t requested)
{
    size_t shift = pool->page_shift;
    size_t p0 = (addr - a->base) >> shift;
    size_t p1 = ((addr + size - 1 - a->base) >> shift) + 1;
    if (GM_LIKELY(p1 - p0 == 1) && bit_get(a->mapped, p0)) return GM_OK;
    if (range_all_set(a->mapped, p0, p1)) return GM_OK;

    /* Pages that may be created before empty ones are reused. */
    /* Pages that may be created before empty ones are reused: a budget over
     * the larger of the live bytes and their peak so far, so a step that
     * repeats a known peak does not move pages it will need again. */
    uint64_t live = pool->st.allocated + requested;
    if (pool->st.allocated_peak > live) live = pool->st.allocated_peak;
    uint64_t allow = live + live / GROW_SLACK_DIV + (uint64_t)GROW_SLACK_PAGES * pool->page;
    size_t budget = allow > pool->st.reserved ? (size_t)((allow - pool->st.reserved) >> shift) : 0;
    bool drained = false;

    size_t run = SIZE_MAX; /* start of the current run of freshly mapped pages */
    int rc = GM_OK;
    for (size_t p = p0; p < p1; p++) {
        if (bit_get(a->mapped, p)) {
            if (run != SIZE_MAX) {
                GM_CHECK(set_access_run(pool, a, run, p));
                run = SIZE_MAX;
            }
            continue;
        }
        gm__phys_t h;
        rc = take_page(pool, &h, &budget, &drained);
        if (rc != GM_OK) break;
        GM_BK(rc, pool, map, (pool->bk, a->base + (p << shift), pool->page, h));
        if (rc != GM_OK) {
            if (spare_push(pool, h) != GM_OK) {
                int rc2;
                GM_BK(rc2, pool, phys_release, (pool->bk, h));
                if (rc2 == GM_OK) pool->st.reserved -= pool->page;
            }
            break;
        }
        bit_set(a->mapped, p);
        a->handle[p] = h;
        a->n_mapped++;
        pool->st.mapped += pool->page;
        if (!bit_get(a->used, p)) a->n_empty++; /* cannot happen: range is used */
        if (run == SIZE_MAX) run = p;
    }
    if (run != SIZE_MAX) {
        /* Pages mapped before a failure still get access: they are valid
         * cached pages now, and trim can give them back. */
        size_t end = run;
        while (end < p1 && bit_get(a->mapped, end)) end++;
        int rc2 = set_access_run(pool, a, run, end);
        if (rc == GM_OK) rc = rc2;
    }
    return rc;
}

int gm__pages_prefault_locked(gm_pool_t *pool, size_t bytes)
{
    gm__arena_t *a = &pool->arena[GM_CLASS_LARGE];
    size_t n = GM_ALIGN_UP(bytes, pool->page) >> pool->page_shift;
    if (n > a->npages) n = a->npages;
    int rc = GM_OK;
    size_t p;
    for (p = 0; p < n; p++) {
        gm__phys_t h;
        rc = create_page(pool, &h);
        if (rc != GM_OK) break;
        GM_BK(rc, pool, map, (pool->bk, a->base + (p << pool->page_shift), pool->page, h));
        if (rc != GM_OK) {
            int rc2;
            GM_BK(rc2, pool, phys_release, (pool->bk, h));
            if (rc2 == GM_OK) pool->st.reserved -= pool->page;
            break;
        }
        bit_set(a->mapped, p);
        a->handle[p] = h;
        a->n_mapped++;
        a->n_empty++; /* inside the arena's free block: empty */
        pool->st.mapped += pool->page;
    }
    if (p > 0) {
        int rc2 = set_access_run(pool, a, 0, p);
        if (rc == GM_OK) rc = rc2;
    }
    return rc;
}

int gm__pages_trim_locked(gm_pool_t *pool, size_t keep, size_t *released)
{
    size_t before = pool->st.reserved;
    int rc = GM_OK;
    gm__drain_streams_locked(pool);
    while (pool->st.reserved - pool->st.active > keep) {
        gm__phys_t h;
        if (pool->n_spare) {
            h = pool->spare[pool->n_spare - 1];
        } else if (total_empty(pool) > 0) {
            rc = steal_page(pool, &h);
            if (rc != GM_OK) break;
            pool->st.pages_stolen--; /* a release, not a move */
            if (spare_push(pool, h) != GM_OK) { /* keep it findable */
                rc = GM_NO_HOST_MEMORY;
                break;
            }
        } else {
            break;
        }
        GM_BK(rc, pool, phys_release, (pool->bk, h));
        if (rc != GM_OK) break;
        pool->n_spare--;
        pool->st.reserved -= pool->page;
    }
    if (released) *released = before - pool->st.reserved;
    return rc;
}

int gm__pages_check_locked(gm_pool_t *pool, gm__arena_t *a)
{
    size_t words = (a->npages + 63) / 64, mapped = 0, empty = 0;
    for (size_t w = 0; w < words; w++) {
        mapped += (size_t)__builtin_popcountll(a->mapped[w]);
        empty += (size_t)__builtin_popcountll(a->mapped[w] & ~a->used[w]);
    }
    if (mapped != a->n_mapped)
        return gm__set_error(GM_INTERNAL, "arena %d: %zu pages mapped, counter says %zu", a->cls,
                             mapped, a->n_mapped);
    if (empty != a->n_empty)
        return gm__set_error(GM_INTERNAL, "arena %d: %zu empty pages, counter says %zu", a->cls,
                             empty, a->n_empty);
    /* used must match its definition: not wholly inside one global free block. */
    size_t page = pool->page;
    for (gm__block_t *b = a->first; b; b = b->next) {
        bool global_free = b->free && b->owner == &pool->global;
        uintptr_t lo = GM_ALIGN_UP(b->addr - a->base, page) >> pool->page_shift;
        uintptr_t hi = GM_ALIGN_DOWN(b->addr + b->size - a->base, page) >> pool->page_shift;
        if (global_free) {
            for (uintptr_t p = lo; p < hi; p++)
                if (bit_get(a->used, p))
                    return gm__set_error(GM_INTERNAL, "arena %d: page %zu inside a global free "
                                         "block at %#lx is marked used", a->cls, (size_t)p,
                                         (unsigned long)b->addr);
        } else {
            size_t q0 = (b->addr - a->base) >> pool->page_shift;
            size_t q1 = ((b->addr + b->size - 1 - a->base) >> pool->page_shift) + 1;
            for (size_t p = q0; p < q1; p++) {
                if (!bit_get(a->used, p))
                    return gm__set_error(GM_INTERNAL, "arena %d: page %zu under a %s block at "
                                         "%#lx is not marked used", a->cls, p,
                                         b->free ? "stream-owned free" : "live",
                                         (unsigned long)b->addr);
                if (!b->free && !bit_get(a->mapped, p))
                    return gm__set_error(GM_INTERNAL, "arena %d: page %zu under live block at "
                                         "%#lx is not mapped", a->cls, p, (unsigned long)b->addr);
            }
        }
    }
    return GM_OK;
}
