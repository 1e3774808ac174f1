/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pages.c — physical pages behind the pool's address space.
 *
 * An arena is one reservation of virtual address space cut into pages of the
 * device's granularity (2 MiB).  A physical page is created when the pool
 * must grow, mapped where a block needs it, and from then on it is only ever
 * *added* to other places: a physical page may be mapped at several virtual
 * pages at once, and belongs ("is owned") to at most one of them — the one
 * whose range holds live data or in-flight work.  When a range becomes free
 * (and its stream has passed the free), its pages give up ownership but keep
 * their mappings; the physical page joins the free list and can serve another
 * range by being mapped there too.  When the first range is used again, its
 * old mapping is still in place and, if the physical page is free by then,
 * taking it back costs nothing.  A training step that repeats therefore
 * settles into a state with no backend call, while reserved memory follows
 * the pages that live data touches (reserved ≈ live), not the union of every
 * place the step ever used.
 *
 * When a range needs a page, it comes, in this order, from: its own mapping
 * (its physical page is free); a new physical page while reserved memory
 * stays within a small budget over the live peak (or a slightly larger one
 * for a page whose physical page a range live at the same time has taken); a
 * free physical page, mapped here as well (see pick_free for which); a free
 * page after draining the streams; a new page up to the limit.  A mapping
 * whose physical page another range owns is unmapped first.  Mappings are
 * capped (a page mapped at too many places is thinned out), so the address
 * space never fills with stale ones.
 *
 * A page may be unmapped only when it is not owned: an owned page may hold
 * live data or be touched by queued work.  A page becomes unowned when the
 * free block around it is made (alloc.c's freed()), with a fence: the stream
 * that freed it and that stream's free number, none in the global index
 * (whose blocks come from streams known to have passed their frees).  Before
 * another stream's range takes or unmaps the page, the fence must have
 * passed (an event, else a wait: fence_wait, pick_free).
 *
 * A restore maps the pages wholly inside a block as extents: one handle of
 * several pages, whose pages serve their own place only and go back
 * together (the "extents" section below).
 *
 * Physical pages are obtained from and given back to the pool's page
 * provider (provider.h: the local backend, one call per handle, or a
 * broker), and nowhere else.  This file keeps reserved memory's books and
 * is the one place that applies the pool limit (gm__pages_limit_allows)
 * and words the refusal that ends an allocation (gm__pages_refuse_locked);
 * docs/pages.md has the contract.
 *
 * Costs (H100): create 7.4 µs, map 0.5 µs, set access ~19 µs per handle in
 * the range, unmap 13.9 µs, release 9.3 µs.  One set_access covers each run
 * of pages mapped together.
 *
 * Every function here expects the pool lock to be held.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/pool.h"

/* Growth budget (gm__pages_budget): new physical pages are created rather
 * than free ones reused while reserved stays within
 * max(live, live peak) * (1 + slack/2) + GROW_SLACK_PAGES pages; pages
 * that lose their physical page to a range live at the same time may grow
 * the pool up to max(live, live peak) * (1 + slack).  slack is the pool's
 * effective reserve slack (pool.c's controller, between reserve_slack and
 * reserve_slack_max). */
#ifndef GROW_SLACK_PAGES
#define GROW_SLACK_PAGES 2
#endif
/* Mappings allowed beyond one per physical page, before stale ones are
 * unmapped: MAP_SLACK_MUL x physical pages + MAP_SLACK_MIN. */
#ifndef MAP_SLACK_MUL
#define MAP_SLACK_MUL 3
#endif
#define MAP_SLACK_MIN 1024

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

static inline gm__arena_t *arena_of(gm_pool_t *pool, uint32_t gid, size_t *p)
{
    gm__arena_t *a = &pool->arena[0];
    for (int c = 1; c < GM_CLASS_COUNT; c++)
        if (gid >= pool->arena[c].gid_base) a = &pool->arena[c];
    *p = gid - a->gid_base;
    return a;
}

/* Is the physical page mapped at VA page p of a (mapped) an extent's? */
static inline bool is_ext(const gm_pool_t *pool, const gm__arena_t *a, size_t p)
{
    return pool->phys[a->pid[p]].ext != GM_NONE;
}

/* ---- the free list of physical pages (oldest first) ---------------------- */

/* An extent's pages are never on the list: they serve their own place only. */
static void lru_push(gm_pool_t *pool, uint32_t id)
{
    gm__ppage_t *pp = &pool->phys[id];
    if (pp->ext != GM_NONE) return;
    pp->lru_next = GM_NONE;
    pp->lru_prev = pool->lru_tail;
    if (pool->lru_tail != GM_NONE) pool->phys[pool->lru_tail].lru_next = id;
    else pool->lru_head = id;
    pool->lru_tail = id;
    pool->n_free_phys++;
}

static void lru_remove(gm_pool_t *pool, uint32_t id)
{
    gm__ppage_t *pp = &pool->phys[id];
    if (pp->ext != GM_NONE) return;
    if (pp->lru_prev != GM_NONE) pool->phys[pp->lru_prev].lru_next = pp->lru_next;
    else pool->lru_head = pp->lru_next;
    if (pp->lru_next != GM_NONE) pool->phys[pp->lru_next].lru_prev = pp->lru_prev;
    else pool->lru_tail = pp->lru_prev;
    pp->lru_prev = pp->lru_next = GM_NONE;
    pool->n_free_phys--;
}

/* ---- physical pages ------------------------------------------------------ */

/* The pool limit applies to the reserved memory of all its heaps together
 * (root->fam_reserved, see heaps.c), registrable segments included: bytes
 * are counted there before they are asked for, atomically, so heaps growing
 * at once never pass the limit. */
bool gm__pages_limit_take(gm_pool_t *pool, size_t bytes)
{
    gm_pool_t *r = pool->root;
    uint64_t cur = atomic_load_explicit(&r->fam_reserved, memory_order_relaxed);
    do {
        if (!gm__pages_limit_allows(pool, cur, bytes)) return false;
    } while (!atomic_compare_exchange_weak_explicit(&r->fam_reserved, &cur, cur + bytes,
                                                    memory_order_relaxed, memory_order_relaxed));
    uint64_t now = cur + bytes, pk = atomic_load_explicit(&r->fam_reserved_peak, memory_order_relaxed);
    while (now > pk && !atomic_compare_exchange_weak_explicit(&r->fam_reserved_peak, &pk, now,
                                                              memory_order_relaxed, memory_order_relaxed)) {
    }
    return true;
}

void gm__pages_limit_put(gm_pool_t *pool, size_t bytes)
{
    atomic_fetch_sub_explicit(&pool->root->fam_reserved, bytes, memory_order_relaxed);
}

/* Room in the page tables for k more physical page ids (dead ones are
 * reused first); false when host memory runs out. */
static bool ids_room(gm_pool_t *pool, uint32_t k)
{
    if (pool->n_dead >= k || pool->n_phys_ids + (k - pool->n_dead) <= pool->cap_phys) return true;
    uint32_t cap = pool->cap_phys ? pool->cap_phys : 1024;
    while (cap < pool->n_phys_ids + k) cap *= 2;
    gm__ppage_t *ph = gm__realloc(pool->phys, cap * sizeof *ph);
    if (ph) pool->phys = ph;
    uint32_t *dd = ph ? gm__realloc(pool->dead_ids, cap * sizeof *dd) : NULL;
    if (dd) pool->dead_ids = dd;
    if (!ph || !dd) return false;
    pool->cap_phys = cap;
    return true;
}

/* A fresh record for a physical page (ids_room said yes). */
static uint32_t id_take(gm_pool_t *pool, gm__phys_t h)
{
    uint32_t id = pool->n_dead ? pool->dead_ids[--pool->n_dead] : pool->n_phys_ids++;
    gm__ppage_t *pp = &pool->phys[id];
    memset(pp, 0, sizeof *pp);
    pp->handle = h;
    pp->owner = GM_NONE;
    pp->first_va = GM_NONE;
    pp->last_va = GM_NONE;
    pp->ext = GM_NONE;
    pp->live = 1;
    return id;
}

static void reserved_add(gm_pool_t *pool, size_t bytes)
{
    pool->st.reserved += bytes;
    if (pool->st.reserved > pool->st.reserved_peak) pool->st.reserved_peak = pool->st.reserved;
}

/* Obtain a physical page from the provider; it starts free, mapped nowhere.
 * Past the pool limit: GM_LIMIT with no message (see gm__pages_limit_allows). */
static int phys_create(gm_pool_t *pool, uint32_t *out)
{
    int rc;
    if (!gm__pages_limit_take(pool, pool->page)) return GM_LIMIT;
    if (!ids_room(pool, 1)) {
        gm__pages_limit_put(pool, pool->page);
        return gm__set_error(GM_NO_HOST_MEMORY, "gm_alloc: out of host memory for the page tables");
    }
    gm__phys_t h;
    size_t got = 0;
    rc = pool->provider.ops->obtain(pool->provider.ctx, pool->page, 1, &h, &got);
    if (rc != GM_OK) {
        gm__pages_limit_put(pool, pool->page);
        return rc;
    }
    gm_assert_internal(got == 1);
    uint32_t id = id_take(pool, h);
    lru_push(pool, id);
    reserved_add(pool, pool->page);
    *out = id;
    return GM_OK;
}

int gm__pages_refuse_locked(gm_pool_t *pool, int rc, size_t size)
{
    /* A provider with its own reason (a tenant's quota, a broker that is
     * gone) says it in place of the pool's two. */
    char why[160] = "";
    if (pool->provider.ops->describe)
        pool->provider.ops->describe(pool->provider.ctx, why, sizeof why);
    char a[32], r[32], l[32], f[32];
    /* With heaps, the pool's reserved memory is all of theirs. */
    uint64_t reserved = atomic_load_explicit(&pool->root->fam_reserved, memory_order_relaxed);
    return gm__set_error(rc == GM_LIMIT ? GM_LIMIT : GM_OUT_OF_MEMORY,
                         "gm_alloc: cannot allocate %zu bytes: %s; allocated %s, reserved %s, "
                         "limit %s, device free %s",
                         size,
                         why[0] ? why
                         : rc == GM_LIMIT && pool->cfg.limit ? "the pool limit is reached"
                                                             : "out of device memory",
                         gm__fmt_bytes(pool->st.allocated, a, sizeof a),
                         gm__fmt_bytes(reserved, r, sizeof r),
                         gm__fmt_bytes(pool->limit, l, sizeof l),
                         gm__fmt_bytes(reserved < pool->info.total_memory
                                           ? pool->info.total_memory - reserved : 0, f, sizeof f));
}

/* Map physical page id at VA page p of a. */
static int va_map(gm_pool_t *pool, gm__arena_t *a, size_t p, uint32_t id)
{
    int rc;
    gm__ppage_t *pp = &pool->phys[id];
    gm_assert_internal(pp->live && !bit_get(a->mapped, p) && !bit_get(a->owned, p));
    GM_BK(rc, pool, map, (pool->bk, a->base + (p << pool->page_shift), pool->page, pp->handle));
    if (rc != GM_OK) return rc;
    uint32_t gid = a->gid_base + (uint32_t)p;
    bit_set(a->mapped, p);
    a->pid[p] = id;
    a->alias_prev[p] = GM_NONE;
    a->alias_next[p] = pp->first_va;
    if (pp->first_va != GM_NONE) {
        size_t q;
        gm__arena_t *b = arena_of(pool, pp->first_va, &q);
        b->alias_prev[q] = gid;
    }
    pp->first_va = gid;
    pp->n_maps++;
    a->n_mapped++;
    pool->n_maps++;
    pool->st.mapped += pool->page;
    return GM_OK;
}

static void va_forget(gm_pool_t *pool, gm__arena_t *a, size_t p);

/* Unmap VA page p of a (not an extent's: those go whole, ext_release): an
 * owned page may hold live data or queued work. */
static int va_unmap(gm_pool_t *pool, gm__arena_t *a, size_t p)
{
    int rc;
    gm_assert_internal(bit_get(a->mapped, p) && !bit_get(a->owned, p) && !is_ext(pool, a, p));
    GM_BK(rc, pool, unmap, (pool->bk, a->base + (p << pool->page_shift), pool->page));
    if (rc != GM_OK) return rc;
    va_forget(pool, a, p);
    return GM_OK;
}

/* The books of an unmapped VA page p of a. */
static void va_forget(gm_pool_t *pool, gm__arena_t *a, size_t p)
{
    gm__ppage_t *pp = &pool->phys[a->pid[p]];
    uint32_t prev = a->alias_prev[p], next = a->alias_next[p];
    size_t q;
    if (prev != GM_NONE) arena_of(pool, prev, &q)->alias_next[q] = next;
    else pp->first_va = next;
    if (next != GM_NONE) arena_of(pool, next, &q)->alias_prev[q] = prev;
    pp->n_maps--;
    if (pp->last_va == a->gid_base + (uint32_t)p) pp->last_va = GM_NONE;
    a->fence_s[p] = NULL;
    bit_clear(a->mapped, p);
    a->pid[p] = GM_NONE;
    a->n_mapped--;
    pool->n_maps--;
    pool->st.mapped -= pool->page;
}

static inline bool fence_done(const gm__arena_t *a, size_t p);

/* ---- extents --------------------------------------------------------------
 *
 * The driver charges per physical allocation, not per byte: making a GiB
 * of 2 MiB handles (create, map, set access) costs 16-19 ms on an H100,
 * of 32 MiB handles about 1 ms, and giving it back 13-15 ms against 1.1
 * (bench/results/2026-11-26-NVIDIA-H100-80GB-HBM3-vmm-handles.md).  So a
 * tagged block (its allocation, and each restore; GM__MAP_EXTENTS) has the
 * pages wholly inside it that are mapped nowhere made as extents: one handle of EXT_MIN..EXT_MAX pages, mapped once, with one
 * page record per page (ext names the first).  CUDA maps a handle only
 * whole, so an extent's page is never mapped elsewhere, never unmapped
 * alone and never on the free list: freed, it waits for its own place to
 * be used again (taking it back costs nothing, like any page's own
 * mapping).  The extent goes back to the provider whole, once all its
 * pages are free: when an offload evicts its last page, at a trim, or when
 * the pool needs a page and has no free one (ext_release_idle).  Only
 * providers with GM__PROVIDER_EXTENTS (the local one) make them; pages
 * under an extent are never published to another process. */
#ifndef EXT_MIN
#define EXT_MIN 4
#endif
#ifndef EXT_MAX
#define EXT_MAX 16
#endif

/* An extent's pages are chained through lru_next (never on the free list),
 * from its first page, in address order. */

/* Are all pages of extent head free, and (with fences) are the fences of
 * their places passed (no call)? */
static bool ext_idle(gm_pool_t *pool, uint32_t head, bool fences)
{
    for (uint32_t id = head; id != GM_NONE; id = pool->phys[id].lru_next) {
        const gm__ppage_t *pp = &pool->phys[id];
        if (pp->owner != GM_NONE) return false;
        if (fences && pp->first_va != GM_NONE) {
            size_t q;
            const gm__arena_t *a = arena_of(pool, pp->first_va, &q);
            if (!fence_done(a, q)) return false;
        }
    }
    return true;
}

/* Make an extent of k pages at VA pages [p, p + k) of a (mapped nowhere,
 * none owned), and own them.  GM_LIMIT (no message) past the pool limit;
 * on a failure nothing changed, except when access could not be set and
 * the mapping could not be undone either: then the extent is made, owned
 * by nobody (trim or the pool's end tries again), and the status returns. */
static int ext_create(gm_pool_t *pool, gm__arena_t *a, size_t p, uint32_t k)
{
    int rc;
    size_t bytes = (size_t)k << pool->page_shift;
    uintptr_t va = a->base + (p << pool->page_shift);
    if (!gm__pages_limit_take(pool, bytes)) return GM_LIMIT;
    if (!ids_room(pool, k)) {
        gm__pages_limit_put(pool, bytes);
        return gm__set_error(GM_NO_HOST_MEMORY, "gm_restore: out of host memory for the page tables");
    }
    gm__phys_t h;
    size_t got = 0;
    rc = pool->provider.ops->obtain(pool->provider.ctx, bytes, 1, &h, &got);
    if (rc != GM_OK) {
        gm__pages_limit_put(pool, bytes);
        return rc;
    }
    GM_BK(rc, pool, map, (pool->bk, va, bytes, h));
    if (rc == GM_OK) {
        GM_BK(rc, pool, set_access, (pool->bk, va, bytes, 0));
        if (rc != GM_OK) {
            int r2;
            GM_BK(r2, pool, unmap, (pool->bk, va, bytes));
            if (r2 != GM_OK) {
                /* Mapped and no way to unmap it: keep it as an extent,
                 * free; trim or the pool's end tries again. */
                gm__clear_error();
                gm__set_error(rc, "gm_restore: setting access to %zu bytes at %#" PRIxPTR
                              " failed and the mapping stays", bytes, va);
                goto books;
            }
        }
    }
    if (rc != GM_OK) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", gm_last_error());
        size_t done = 0;
        if (pool->provider.ops->give_back(pool->provider.ctx, &h, 1, &done) != GM_OK)
            gm__clear_error(); /* a leak the backend's close reports */
        gm__pages_limit_put(pool, bytes);
        return gm__set_error(rc, "%s", msg);
    }
books:;
    uint32_t head = GM_NONE, prev = GM_NONE;
    for (uint32_t i = 0; i < k; i++) {
        uint32_t id = id_take(pool, h);
        if (i == 0) {
            head = id;
            pool->phys[id].ext_n = k;
        } else {
            pool->phys[prev].lru_next = id;
        }
        prev = id;
        pool->phys[id].ext = head;
        pool->phys[id].lru_next = pool->phys[id].lru_prev = GM_NONE;
        uint32_t gid = a->gid_base + (uint32_t)(p + i);
        gm__ppage_t *pp = &pool->phys[id];
        pp->first_va = gid;
        pp->n_maps = 1;
        bit_set(a->mapped, p + i);
        a->pid[p + i] = id;
        a->alias_prev[p + i] = a->alias_next[p + i] = GM_NONE;
        a->fence_s[p + i] = NULL;
        if (rc == GM_OK) {
            pp->owner = gid;
            bit_set(a->owned, p + i);
        }
    }
    a->n_mapped += k;
    pool->n_maps += k;
    pool->st.mapped += bytes;
    pool->n_ext++;
    reserved_add(pool, bytes);
    return rc;
}

/* Give extent head back (all its pages free, their fences passed): one
 * unmap, one give-back.  On a failed unmap it stays as it was; on a failed
 * give-back it stays reserved, mapped nowhere, and the next trim (or the
 * pool's end) tries again. */
static int ext_release(gm_pool_t *pool, uint32_t head)
{
    int rc;
    gm__ppage_t *hp = &pool->phys[head];
    size_t bytes = (size_t)hp->ext_n << pool->page_shift;
    gm_assert_internal(hp->ext == head && ext_idle(pool, head, false));
    if (hp->first_va != GM_NONE) {
        size_t p;
        gm__arena_t *a = arena_of(pool, hp->first_va, &p);
        GM_BK(rc, pool, unmap, (pool->bk, a->base + (p << pool->page_shift), bytes));
        if (rc != GM_OK) return rc;
        for (uint32_t id = head; id != GM_NONE; id = pool->phys[id].lru_next, p++) {
            gm_assert_internal(a->pid[p] == id);
            va_forget(pool, a, p);
        }
    }
    size_t done = 0;
    rc = pool->provider.ops->give_back(pool->provider.ctx, &hp->handle, 1, &done);
    if (rc != GM_OK) return rc;
    for (uint32_t id = head, next; id != GM_NONE; id = next) {
        next = pool->phys[id].lru_next;
        pool->phys[id].live = 0;
        pool->dead_ids[pool->n_dead++] = id;
    }
    pool->n_ext--;
    pool->st.reserved -= bytes;
    gm__pages_limit_put(pool, bytes);
    return GM_OK;
}

/* Give back extents whose pages are all free, past their fences, until
 * `want` bytes went back.  Bytes given back in *got; the first failure
 * stops it. */
static int ext_release_idle(gm_pool_t *pool, size_t want, size_t *got)
{
    *got = 0;
    for (uint32_t id = 0; id < pool->n_phys_ids && pool->n_ext && *got < want; id++) {
        const gm__ppage_t *pp = &pool->phys[id];
        if (!pp->live || pp->ext != id || !ext_idle(pool, id, true)) continue;
        size_t bytes = (size_t)pp->ext_n << pool->page_shift;
        GM_CHECK(ext_release(pool, id));
        *got += bytes;
    }
    return GM_OK;
}

static bool fence_wait(gm_pool_t *pool, gm__arena_t *a, size_t p);

/* Give back extent head, all of whose pages are free, once the work that
 * may still use them has passed (an event, else a wait); GM_NOT_READY when
 * that cannot be known. */
static int ext_wait_release(gm_pool_t *pool, uint32_t head, const char *fn)
{
    for (uint32_t m = head; m != GM_NONE; m = pool->phys[m].lru_next) {
        if (pool->phys[m].first_va == GM_NONE) continue;
        size_t q;
        gm__arena_t *o = arena_of(pool, pool->phys[m].first_va, &q);
        if (!fence_wait(pool, o, q))
            return gm__set_error(GM_NOT_READY, "%s: pages stay cached: work still queued on "
                                 "another stream may use them", fn);
    }
    return ext_release(pool, head);
}

/* Release a free physical page: unmap it everywhere, then give it back to
 * the provider (an extent's page: the whole extent, once all of it is
 * free).  On a failed unmap or give-back it stays (free, perhaps partly
 * mapped) and the error returns. */
static int phys_release(gm_pool_t *pool, uint32_t id)
{
    int rc;
    gm__ppage_t *pp = &pool->phys[id];
    gm_assert_internal(pp->live && pp->owner == GM_NONE);
    if (pp->ext != GM_NONE) return ext_release(pool, pp->ext);
    while (pp->first_va != GM_NONE) {
        size_t q;
        gm__arena_t *b = arena_of(pool, pp->first_va, &q);
        GM_CHECK(va_unmap(pool, b, q));
    }
    size_t done = 0;
    rc = pool->provider.ops->give_back(pool->provider.ctx, &pp->handle, 1, &done);
    if (rc != GM_OK) return rc;
    lru_remove(pool, id);
    pp->live = 0;
    pool->dead_ids[pool->n_dead++] = id;
    pool->st.reserved -= pool->page;
    gm__pages_limit_put(pool, pool->page);
    return GM_OK;
}

/* VA page p of a takes the free physical page mapped there. */
static inline void own(gm_pool_t *pool, gm__arena_t *a, size_t p)
{
    uint32_t id = a->pid[p];
    gm_assert_internal(bit_get(a->mapped, p) && !bit_get(a->owned, p) &&
                       pool->phys[id].owner == GM_NONE);
    lru_remove(pool, id);
    pool->phys[id].owner = a->gid_base + (uint32_t)p;
    pool->phys[id].last_va = GM_NONE;
    a->fence_s[p] = NULL;
    bit_set(a->owned, p);
}

/* ---- fences (see gm__arena_t) -------------------------------------------- */

/* May VA page p (unowned, mapped) be unmapped now, without a call? */
static inline bool fence_done(const gm__arena_t *a, size_t p)
{
    const gm__stream_t *f = a->fence_s[p];
    return !f || f->done_seq >= a->fence_seq[p];
}

/* The fence guarding free physical page id: the stream (NULL: none) and,
 * in *seq, its free number. */
static inline gm__stream_t *phys_fence(gm_pool_t *pool, uint32_t id, uint64_t *seq)
{
    uint32_t g = pool->phys[id].last_va;
    if (g == GM_NONE) return NULL;
    size_t q;
    gm__arena_t *b = arena_of(pool, g, &q);
    *seq = b->fence_seq[q];
    return b->fence_s[q];
}

/* May free physical page id serve a range of stream s, without a call? */
static inline bool phys_ok(gm_pool_t *pool, uint32_t id, const gm__stream_t *s)
{
    uint64_t seq = 0;
    const gm__stream_t *f = phys_fence(pool, id, &seq);
    return !f || f == s || f->done_seq >= seq;
}

/* Can VA page p (not owned) be owned for stream s at no cost: its own
 * mapping's physical page is free and its fence allows s? */
static inline bool takes_back(gm_pool_t *pool, const gm__arena_t *a, size_t p,
                              const gm__stream_t *s)
{
    return bit_get(a->mapped, p) && pool->phys[a->pid[p]].owner == GM_NONE &&
           phys_ok(pool, a->pid[p], s);
}

/* Wait (an event, else a stream sync) until VA page p's fence has passed;
 * false when it cannot be known (a backend failure). */
static bool fence_wait(gm_pool_t *pool, gm__arena_t *a, size_t p)
{
    if (fence_done(a, p)) return true;
    return gm__fm_passed(pool, a->fence_s[p], a->fence_seq[p], true);
}

void gm__pages_forget_stream_locked(gm_pool_t *pool, const gm__stream_t *s)
{
    for (int c = 0; c < GM_CLASS_COUNT; c++) {
        gm__arena_t *a = &pool->arena[c];
        if (!a->mapped) continue;
        size_t words = (a->npages + 63) / 64;
        for (size_t w = 0; w < words; w++)
            for (uint64_t m = a->mapped[w] & ~a->owned[w]; m; m &= m - 1) {
                size_t p = (w << 6) + (size_t)__builtin_ctzll(m);
                if (a->fence_s[p] == s) {
                    gm_assert_internal(s->done_seq >= a->fence_seq[p]);
                    a->fence_s[p] = NULL;
                }
            }
    }
}

/* ---- arenas ------------------------------------------------------------- */

int gm__arena_init(gm_pool_t *pool, gm__arena_t *a, int cls, size_t size, uint32_t gid_base)
{
    int rc;
    memset(a, 0, sizeof *a);
    a->cls = cls;
    a->size = GM_ALIGN_UP(size, pool->page);
    a->npages = a->size >> pool->page_shift;
    a->gid_base = gid_base;
    size_t words = (a->npages + 63) / 64;
    a->mapped = gm__calloc(words, sizeof(uint64_t));
    a->used = gm__calloc(words, sizeof(uint64_t));
    a->owned = gm__calloc(words, sizeof(uint64_t));
    a->pid = gm__malloc(a->npages * sizeof(uint32_t));
    a->alias_next = gm__malloc(a->npages * sizeof(uint32_t));
    a->alias_prev = gm__malloc(a->npages * sizeof(uint32_t));
    a->fence_s = gm__calloc(a->npages, sizeof *a->fence_s);
    a->fence_seq = gm__calloc(a->npages, sizeof *a->fence_seq);
    if (!a->mapped || !a->used || !a->owned || !a->pid || !a->alias_next || !a->alias_prev ||
        !a->fence_s || !a->fence_seq ||
        (uint64_t)gid_base + a->npages >= GM_NONE) {
        rc = gm__set_error(GM_NO_HOST_MEMORY, "gm_pool_create: out of host memory for page tables");
        goto fail;
    }
    memset(a->pid, 0xff, a->npages * sizeof(uint32_t));
    GM_BK(rc, pool, va_reserve, (pool->bk, a->size, pool->page, &a->base));
    if (rc != GM_OK) {
        a->base = 0;
        goto fail;
    }
    return GM_OK; /* its first block: gm__alloc_arena_ready_locked */
fail:
    gm__arena_fini(pool, a);
    return rc;
}

/* Give the reservation and the page tables back; also undoes a partial
 * gm__arena_init.  Normally gm__pages_fini unmapped every page; when an
 * unmap failed there (a backend failure), pages are still mapped in the
 * range and the driver would refuse to free it (cuMemAddressFree:
 * CUDA_ERROR_INVALID_VALUE, seen under fault injection on an H100), so the
 * reservation is left to the backend's close rather than freed in error. */
void gm__arena_fini(gm_pool_t *pool, gm__arena_t *a)
{
    int rc = GM_OK;
    if (a->base && a->n_mapped == 0) GM_BK(rc, pool, va_free, (pool->bk, a->base, a->size));
    (void)rc;
    gm__free(a->mapped);
    gm__free(a->used);
    gm__free(a->owned);
    gm__free(a->pid);
    gm__free(a->alias_next);
    gm__free(a->alias_prev);
    gm__free(a->fence_s);
    gm__free(a->fence_seq);
    memset(a, 0, sizeof *a);
}

/* Unmap every page and release every physical page: the pool is going away,
 * live or not, so ownership no longer matters; errors cannot be retried. */
void gm__pages_fini(gm_pool_t *pool)
{
    for (int c = 0; c < GM_CLASS_COUNT; c++) {
        gm__arena_t *a = &pool->arena[c];
        if (!a->mapped) continue;
        memset(a->owned, 0, ((a->npages + 63) / 64) * sizeof(uint64_t));
    }
    for (uint32_t id = 0; id < pool->n_phys_ids; id++) {
        gm__ppage_t *pp = &pool->phys[id];
        if (pp->live && pp->owner != GM_NONE) {
            pp->owner = GM_NONE;
            lru_push(pool, id);
        }
    }
    for (uint32_t id = 0; id < pool->n_phys_ids; id++)
        if (pool->phys[id].live && phys_release(pool, id) != GM_OK) gm__clear_error();
    gm__free(pool->phys);
    gm__free(pool->dead_ids);
    pool->phys = NULL;
    pool->dead_ids = NULL;
}

/* ---- used marks ---------------------------------------------------------- */

void gm__pages_mark_used_locked(gm__arena_t *a, uintptr_t addr, size_t size, size_t shift)
{
    size_t p0 = (addr - a->base) >> shift;
    size_t p1 = ((addr + size - 1 - a->base) >> shift) + 1;
    if (GM_LIKELY(p1 - p0 == 1)) {
        bit_set(a->used, p0);
        return;
    }
    while (p0 < p1) {
        size_t w = p0 >> 6, lo = p0 & 63;
        size_t hi = (p1 - (w << 6)) < 64 ? (p1 - (w << 6)) : 64;
        a->used[w] |= word_mask(lo, hi);
        p0 = (w << 6) + hi;
    }
}

void gm__pages_mark_unused_locked(gm_pool_t *pool, gm__arena_t *a, uintptr_t addr, size_t size,
                                  gm__stream_t *fs, uint64_t fseq)
{
    size_t shift = pool->page_shift;
    uintptr_t lo_addr = GM_ALIGN_UP(addr - a->base, pool->page);
    uintptr_t hi_addr = GM_ALIGN_DOWN(addr + size - a->base, pool->page);
    if (hi_addr <= lo_addr) return;
    size_t p0 = lo_addr >> shift, p1 = hi_addr >> shift;
    while (p0 < p1) {
        size_t w = p0 >> 6, lo = p0 & 63;
        size_t hi = (p1 - (w << 6)) < 64 ? (p1 - (w << 6)) : 64;
        uint64_t m = word_mask(lo, hi);
        /* Owned pages give their physical page back to the free list; the
         * freeing stream's queued work may still touch them: the fence. */
        for (uint64_t gone = m & a->owned[w]; gone; gone &= gone - 1) {
            size_t p = (w << 6) + (size_t)__builtin_ctzll(gone);
            gm__ppage_t *pp = &pool->phys[a->pid[p]];
            pp->owner = GM_NONE;
            pp->last_va = a->gid_base + (uint32_t)p;
            if (GM_UNLIKELY(pp->ext != GM_NONE)) pool->ext_unowned++;
            lru_push(pool, a->pid[p]);
            a->fence_s[p] = fs;
            a->fence_seq[p] = fseq;
        }
        /* In the global index every free has passed. */
        if (!fs)
            for (uint64_t f = m & a->mapped[w]; f; f &= f - 1)
                a->fence_s[(w << 6) + (size_t)__builtin_ctzll(f)] = NULL;
        a->owned[w] &= ~m;
        a->used[w] &= ~m;
        p0 = (w << 6) + hi;
    }
}

bool gm__pages_ready_locked(const gm__arena_t *a, uintptr_t addr, size_t size, size_t shift)
{
    size_t p0 = (addr - a->base) >> shift;
    size_t p1 = ((addr + size - 1 - a->base) >> shift) + 1;
    if (GM_LIKELY(p1 - p0 == 1)) return bit_get(a->owned, p0);
    return range_all_set(a->owned, p0, p1);
}

bool gm__pages_cheap_locked(gm_pool_t *pool, const gm__arena_t *a, uintptr_t addr, size_t size,
                            const gm__stream_t *s)
{
    size_t shift = pool->page_shift;
    size_t p0 = (addr - a->base) >> shift;
    size_t p1 = ((addr + size - 1 - a->base) >> shift) + 1;
    for (size_t p = p0; p < p1; p++) {
        if (!bit_get(a->owned, p) && !takes_back(pool, a, p, s)) return false;
    }
    return true;
}

bool gm__pages_remap_locked(gm_pool_t *pool, const gm__arena_t *a, uintptr_t addr, size_t size)
{
    size_t shift = pool->page_shift;
    size_t p0 = (addr - a->base) >> shift;
    size_t p1 = ((addr + size - 1 - a->base) >> shift) + 1;
    for (size_t p = p0; p < p1; p++)
        if (!bit_get(a->owned, p) && bit_get(a->mapped, p) && pool->phys[a->pid[p]].owner != GM_NONE)
            return true;
    return false;
}

/* ---- serving a range -------------------------------------------------------- */

/* Free physical pages looked at, oldest first, for one that may serve. */
#define PICK_SCAN 16

/* The oldest free physical page that may serve a range of stream s without
 * waiting (its fence allows s), or GM_NONE.  With ask, the fences of the
 * pages looked at are asked once (an event: no waiting) before giving up.
 * Oldest first: once pages are released at the free, the page given up
 * longest ago is the one least likely to be wanted back soon. */
static uint32_t pick_free(gm_pool_t *pool, const gm__stream_t *s, bool ask)
{
    uint32_t id = pool->lru_head;
    for (int k = 0; k < PICK_SCAN && id != GM_NONE; k++, id = pool->phys[id].lru_next)
        if (phys_ok(pool, id, s)) return id;
    if (!ask) return GM_NONE;
    const gm__stream_t *refused = NULL; /* asked already, not passed */
    id = pool->lru_head;
    for (int k = 0; k < PICK_SCAN && id != GM_NONE; k++, id = pool->phys[id].lru_next) {
        uint64_t seq = 0;
        gm__stream_t *f = phys_fence(pool, id, &seq);
        if (!f || f == s) return id;
        if (f == refused) continue;
        if (gm__fm_passed(pool, f, seq, false)) return id;
        refused = f;
    }
    return GM_NONE;
}

/* The reserved memory the growth budget is compared with: the pool's, over
 * all heaps (one heap: its own). */
static uint64_t budget_reserved(const gm_pool_t *pool)
{
    if (pool->root->heaps_max <= 1) return pool->st.reserved;
    return atomic_load_explicit(&pool->root->fam_reserved, memory_order_relaxed);
}

/* A physical page for a range of stream s being mapped: a new one while
 * reserved stays within `allow` (or within the conflict cap, for a page
 * that lost its own physical page to a range live at the same time: the
 * step needs one more page than the pool has), else the oldest free one
 * whose fence allows s (asking the fences once), else one after draining
 * the streams (waiting), else a new one up to the limit. */
static int take_phys(gm_pool_t *pool, uint32_t *id, uint64_t allow, uint64_t cap, bool *drained,
                     bool conflict, const gm__stream_t *s)
{
    uint64_t room = conflict && cap > allow ? cap : allow;
    if (budget_reserved(pool) + pool->page <= room) {
        int rc = phys_create(pool, id);
        if (rc == GM_OK) return GM_OK;
        if (rc != GM_LIMIT && rc != GM_OUT_OF_MEMORY) return rc;
    }
    if (pool->n_free_phys && (*id = pick_free(pool, s, true)) != GM_NONE) return GM_OK;
    if (!*drained) {
        *drained = true;
        gm__drain_streams_locked(pool);
        if (pool->n_free_phys && (*id = pick_free(pool, s, false)) != GM_NONE) return GM_OK;
    }
    /* Before growing past the budget, an extent nobody uses goes back
     * (its pages serve no other place).  The search looks at every page,
     * so it is made again only once an extent page lost its owner since
     * the last one that found none. */
    if (GM_UNLIKELY(pool->n_ext) && pool->ext_unowned != pool->ext_scanned) {
        size_t got = 0;
        if (ext_release_idle(pool, 1, &got) != GM_OK) gm__clear_error();
        else if (got == 0) pool->ext_scanned = pool->ext_unowned;
    }
    return phys_create(pool, id);
}

static int set_access_run(gm_pool_t *pool, gm__arena_t *a, size_t r0, size_t r1)
{
    int rc;
    GM_BK(rc, pool, set_access,
          (pool->bk, a->base + (r0 << pool->page_shift), (r1 - r0) << pool->page_shift, 0));
    if (rc == GM_OK) return GM_OK;
    /* Without access the run is useless: give its pages up and unmap them. */
    for (size_t p = r0; p < r1; p++) {
        if (bit_get(a->owned, p)) {
            bit_clear(a->owned, p);
            pool->phys[a->pid[p]].owner = GM_NONE;
            lru_push(pool, a->pid[p]);
        }
        if (va_unmap(pool, a, p) != GM_OK) gm__clear_error();
    }
    return rc;
}

/* Too many mappings: unmap unowned ones (stale aliases first) until under
 * the cap.  Best effort; a failed unmap just stops it. */
static void thin_mappings(gm_pool_t *pool)
{
    size_t cap = (size_t)MAP_SLACK_MUL * (pool->st.reserved >> pool->page_shift) + MAP_SLACK_MIN;
    if (pool->n_maps <= cap) return;
    size_t target = cap - cap / 8;
    for (int pass = 0; pass < 2 && pool->n_maps > target; pass++) {
        for (int c = 0; c < GM_CLASS_COUNT && pool->n_maps > target; c++) {
            gm__arena_t *a = &pool->arena[c];
            size_t words = (a->npages + 63) / 64;
            for (size_t k = 0; k < words && pool->n_maps > target; k++) {
                size_t w = (a->trim_hint + k) % words;
                for (uint64_t cand = a->mapped[w] & ~a->owned[w]; cand; cand &= cand - 1) {
                    size_t p = (w << 6) + (size_t)__builtin_ctzll(cand);
                    /* First pass: only pages whose physical page lives on
                     * elsewhere.  An extent's page is unmapped only with its
                     * extent. */
                    if (is_ext(pool, a, p)) continue;
                    if (pass == 0 && pool->phys[a->pid[p]].n_maps < 2) continue;
                    if (!fence_done(a, p)) continue; /* queued work may touch it */
                    if (va_unmap(pool, a, p) != GM_OK) {
                        gm__clear_error();
                        return;
                    }
                    a->trim_hint = w;
                    if (pool->n_maps <= target) return;
                }
            }
        }
    }
}

/* How many VA pages from p on, up to EXT_MAX and below whi, are neither
 * mapped nor owned: the extent that could be made there. */
static uint32_t ext_room(const gm__arena_t *a, size_t p, size_t whi)
{
    uint32_t k = 0;
    while (k < EXT_MAX && p + k < whi && !bit_get(a->mapped, p + k)) k++;
    return k;
}

/* extents: a tagged block's (GM__MAP_EXTENTS); solo: a block whose pages
 * must be one handle each (gm_alloc_shareable's, publishable). */
static int ensure_mapped(gm_pool_t *pool, gm__arena_t *a, uintptr_t addr, size_t size,
                         size_t asked, gm__stream_t *s, bool extents, bool solo)
{
    size_t shift = pool->page_shift;
    size_t p0 = (addr - a->base) >> shift;
    size_t p1 = ((addr + size - 1 - a->base) >> shift) + 1;
    gm_assert_internal(range_all_set(a->used, p0, p1));
    if (GM_LIKELY(p1 - p0 == 1)) {
        if (bit_get(a->owned, p0)) return GM_OK;
        /* One page whose own mapping is free for s: take it back. */
        if (takes_back(pool, a, p0, s) && !(solo && is_ext(pool, a, p0))) {
            own(pool, a, p0);
            return GM_OK;
        }
    } else if (range_all_set(a->owned, p0, p1)) {
        return GM_OK;
    }

    /* First the pages whose own mapping is free: they cost nothing, and no
     * other page of the range should take their physical page.  Often that
     * is all the range needs. */
    for (size_t q = p0; q < p1; q++)
        if (!bit_get(a->owned, q) && takes_back(pool, a, q, s) && !(solo && is_ext(pool, a, q)))
            own(pool, a, q);
    if (p1 - p0 > 1 && range_all_set(a->owned, p0, p1)) return GM_OK;

    /* Pages that may be created before free ones are reused: a budget over
     * the larger of the live bytes and their peak so far (the slack is the
     * pool's, see gm__pages_budget).  With heaps, over the pool: the sum of
     * the heaps' peaks, plus what this request takes this heap past its own. */
    uint64_t live = pool->st.allocated + asked;
    if (pool->st.allocated_peak > live) live = pool->st.allocated_peak;
    if (pool->root->heaps_max > 1)
        live += atomic_load_explicit(&pool->root->fam_peak_sum, memory_order_relaxed) -
                pool->st.allocated_peak;
    uint64_t allow, cap;
    gm__pages_budget(pool, live, &allow, &cap);
    bool drained = false;

    /* Extents: only on pages wholly inside the range (a tagged block, or a
     * restore's piece of one), so that they go back with its offload. */
    extents = extents && (pool->provider.ops->flags & GM__PROVIDER_EXTENTS);
    size_t whi = (addr + size - a->base) >> shift;
    size_t wlo = GM_ALIGN_UP(addr - a->base, pool->page) >> shift;

    size_t run = SIZE_MAX; /* start of the current run of fresh mappings */
    int rc = GM_OK;
    size_t p;
    for (p = p0; p < p1; p++) {
        bool conflict = false;
        if (bit_get(a->owned, p)) goto run_break;
        if (bit_get(a->mapped, p)) {
            conflict = true;
            uint32_t old = a->pid[p], head = pool->phys[old].ext;
            if (pool->phys[old].owner == GM_NONE && !(solo && head != GM_NONE)) {
                /* Our old mapping, free, but another stream's work may still
                 * use its physical page: ask that stream once (no waiting),
                 * else map another page here. */
                uint64_t seq = 0;
                gm__stream_t *f = phys_fence(pool, old, &seq);
                if (!f || f == s || gm__fm_passed(pool, f, seq, false)) {
                    own(pool, a, p);
                    goto run_break;
                }
            }
            if (head != GM_NONE) {
                /* An extent's page serves this place alone: wait for it.
                 * A publishable block needs pages of its own instead: the
                 * extent goes back whole if nothing else uses it, else the
                 * caller takes untouched address space. */
                if (!solo) {
                    if (!fence_wait(pool, a, p)) {
                        rc = gm__set_error(GM_NOT_READY, "gm_alloc: the work of stream %p may "
                                           "still use a page of the range",
                                           (void *)a->fence_s[p]->handle);
                        break;
                    }
                    own(pool, a, p);
                    goto run_break;
                }
                if (!ext_idle(pool, head, false)) {
                    rc = gm__set_error(GM_NOT_READY, "gm_alloc: a page of the range belongs to "
                                       "a larger physical allocation still in use");
                    break;
                }
                rc = ext_wait_release(pool, head, "gm_alloc");
                if (rc != GM_OK) break;
                goto fresh;
            }
            /* Unmap, once the work queued before the free that left this
             * page unowned is done: an event, else a wait.  A stream that
             * cannot be waited for (held, or a failure) leaves the page as
             * it is: the caller takes untouched address space instead. */
            if (!fence_wait(pool, a, p)) {
                rc = gm__set_error(GM_NOT_READY, "gm_alloc: the work of stream %p may still "
                                   "use a page of the range", (void *)a->fence_s[p]->handle);
                break;
            }
            rc = va_unmap(pool, a, p);
            if (rc != GM_OK) break;
        }
    fresh:
        if (extents && !conflict && p >= wlo) {
            uint32_t k = ext_room(a, p, whi);
            if (k >= EXT_MIN && budget_reserved(pool) + ((uint64_t)k << shift) <= allow) {
                if (run != SIZE_MAX) {
                    rc = set_access_run(pool, a, run, p);
                    run = SIZE_MAX;
                    if (rc != GM_OK) break;
                }
                rc = ext_create(pool, a, p, k);
                if (rc == GM_OK) {
                    p += k - 1;
                    continue;
                }
                if (rc != GM_LIMIT && rc != GM_OUT_OF_MEMORY) break;
                /* The device (or the limit) has no room for a whole
                 * extent: page by page from here, as an allocation does. */
                gm__clear_error();
                extents = false;
                rc = GM_OK;
            }
        }
        uint32_t id;
        rc = take_phys(pool, &id, allow, cap, &drained, conflict, s);
        if (rc != GM_OK) break;
        if (pool->phys[id].n_maps) pool->st.pages_stolen++;
        rc = va_map(pool, a, p, id);
        if (rc != GM_OK) break;
        own(pool, a, p);
        if (run == SIZE_MAX) run = p;
        continue;
    run_break:
        if (run != SIZE_MAX) {
            int rc2 = set_access_run(pool, a, run, p);
            run = SIZE_MAX;
            if (rc2 != GM_OK) {
                rc = rc2;
                break;
            }
        }
    }
    if (run != SIZE_MAX) {
        int rc2 = set_access_run(pool, a, run, p);
        if (rc == GM_OK) rc = rc2;
    }
    /* On failure the caller frees the block again, which hands the pages it
     * took back to the free list. */
    if (rc == GM_LIMIT || rc == GM_OUT_OF_MEMORY) return gm__pages_refuse_locked(pool, rc, asked);
    if (rc != GM_OK) return rc;
    if (GM_UNLIKELY(pool->n_maps > (size_t)MAP_SLACK_MUL * (pool->st.reserved >> shift) + MAP_SLACK_MIN))
        thin_mappings(pool);
    return GM_OK;
}

int gm__pages_ensure_mapped_locked(gm_pool_t *pool, gm__arena_t *a, uintptr_t addr, size_t size,
                                   size_t asked, gm__stream_t *s, unsigned how)
{
    bool solo = how & GM__MAP_SOLO;
    return ensure_mapped(pool, a, addr, size, asked, s, !solo && (how & GM__MAP_EXTENTS), solo);
}

bool gm__pages_in_extent_locked(gm_pool_t *pool, const gm__arena_t *a, uintptr_t addr, size_t size)
{
    size_t p0 = (addr - a->base) >> pool->page_shift;
    size_t p1 = ((addr + size - 1 - a->base) >> pool->page_shift) + 1;
    for (size_t p = p0; p < p1; p++)
        if (bit_get(a->mapped, p) && is_ext(pool, a, p)) return true;
    return false;
}

int gm__pages_prefault_locked(gm_pool_t *pool, size_t bytes)
{
    gm__arena_t *a = &pool->arena[GM_CLASS_LARGE];
    size_t n = GM_ALIGN_UP(bytes, pool->page) >> pool->page_shift;
    if (n > a->npages) n = a->npages;
    int rc = GM_OK;
    size_t p;
    for (p = 0; p < n; p++) {
        uint32_t id;
        rc = phys_create(pool, &id);
        if (rc != GM_OK) break;
        rc = va_map(pool, a, p, id);
        if (rc != GM_OK) break;
    }
    if (p > 0) {
        int rc2 = set_access_run(pool, a, 0, p);
        if (rc == GM_OK) rc = rc2;
    }
    return rc;
}

int gm__pages_handles_locked(gm_pool_t *pool, uintptr_t addr, size_t n, gm__phys_t *out)
{
    for (int c = 0; c < GM_CLASS_COUNT; c++) {
        gm__arena_t *a = &pool->arena[c];
        if (addr < a->base || addr >= a->base + a->size) continue;
        size_t p0 = (addr - a->base) >> pool->page_shift, i = 0;
        for (; i < n && p0 + i < a->npages && bit_get(a->owned, p0 + i); i++) {
            if (is_ext(pool, a, p0 + i))
                return gm__set_error(GM_NOT_SUPPORTED, "pages: [%#" PRIxPTR ", +%zu pages) were "
                                     "restored as one physical allocation", addr, n);
            out[i] = pool->phys[a->pid[p0 + i]].handle;
        }
        if (i == n) return GM_OK;
        break;
    }
    return gm__set_error(GM_INTERNAL, "pages: [%#" PRIxPTR ", +%zu pages) is not under live blocks",
                         addr, n);
}

/* May free physical page id be released now: are the fences of all its
 * mappings passed (no call)? */
static bool releasable(gm_pool_t *pool, uint32_t id)
{
    for (uint32_t g = pool->phys[id].first_va; g != GM_NONE;) {
        size_t q;
        gm__arena_t *b = arena_of(pool, g, &q);
        if (!fence_done(b, q)) return false;
        g = b->alias_next[q];
    }
    return true;
}

int gm__pages_trim_locked(gm_pool_t *pool, size_t keep, size_t *released)
{
    size_t before = pool->st.reserved;
    int rc = GM_OK;
    gm__drain_streams_locked(pool);
    if (GM_UNLIKELY(pool->offl_dirty) && pool->hooks->offload_trim_locked)
        pool->hooks->offload_trim_locked(pool);
    /* Oldest first; a page some held stream may still touch stays. */
    uint32_t id = pool->lru_head;
    while (id != GM_NONE && pool->st.reserved - pool->st.active > keep) {
        uint32_t next = pool->phys[id].lru_next;
        if (releasable(pool, id)) {
            rc = phys_release(pool, id);
            if (rc != GM_OK) break;
        }
        id = next;
    }
    if (rc == GM_OK && pool->n_ext && pool->st.reserved - pool->st.active > keep) {
        size_t got = 0;
        rc = ext_release_idle(pool, pool->st.reserved - pool->st.active - keep, &got);
    }
    if (released) *released = before - pool->st.reserved;
    return rc;
}

int gm__pages_release_range_locked(gm_pool_t *pool, gm__arena_t *a, uintptr_t addr, size_t size,
                                   size_t *released)
{
    size_t before = pool->st.reserved;
    size_t shift = pool->page_shift;
    size_t p0 = (addr - a->base) >> shift;
    size_t p1 = ((addr + size - 1 - a->base) >> shift) + 1;
    int rc = GM_OK;
    for (size_t p = p0; p < p1 && rc == GM_OK; p++) {
        if (!bit_get(a->mapped, p) || bit_get(a->owned, p)) continue;
        uint32_t id = a->pid[p];
        const gm__ppage_t *pp = &pool->phys[id];
        if (pp->owner != GM_NONE) continue; /* it serves another place */
        if (pp->ext != GM_NONE) {
            /* An extent goes whole, once none of it is in use (its pages
             * are unmapped with it: the loop skips them after). */
            if (ext_idle(pool, pp->ext, true)) rc = ext_release(pool, pp->ext);
        } else if (releasable(pool, id)) {
            rc = phys_release(pool, id);
        }
    }
    if (released) *released = before - pool->st.reserved;
    return rc;
}

/* ---- offload (offload/offload.c) --------------------------------------------- */

/* May a block overlapping a page being evicted lie there?  Free and past
 * every fence (the global index, or its stream known to have passed its
 * free), or live and offloaded: nothing resident, no queued work on it. */
static bool evict_ok(const gm__block_t *x)
{
    if (x->free) return x->owner->is_global || x->owner->done_seq >= x->free_seq;
    return !x->pending && gm__block_off_device(x) &&
           !atomic_load_explicit(&x->tc_cached, memory_order_relaxed);
}

/* Every block overlapping VA page p of a (b is one of them) allows evicting it. */
static bool page_evictable(gm_pool_t *pool, const gm__arena_t *a, size_t p, const gm__block_t *b)
{
    uintptr_t lo = a->base + (p << pool->page_shift), hi = lo + pool->page;
    for (const gm__block_t *x = b; x && x->addr + x->size > lo; x = x->prev)
        if (!evict_ok(x)) return false;
    for (const gm__block_t *x = b->next; x && x->addr < hi; x = x->next)
        if (!evict_ok(x)) return false;
    return true;
}

/* Give back VA page p of a (mapped; evictable): its data is in host memory
 * now.  An owned page becomes free with no fence (the offload waited for
 * the blocks' streams); its physical page is released everywhere it is
 * mapped, once the work of the streams that freed those other places has
 * passed. */
static int evict_page(gm_pool_t *pool, gm__arena_t *a, size_t p, size_t *released)
{
    uint32_t id = a->pid[p];
    gm__ppage_t *pp = &pool->phys[id];
    if (bit_get(a->owned, p)) {
        bit_clear(a->owned, p);
        pp->owner = GM_NONE;
        pp->last_va = GM_NONE;
        a->fence_s[p] = NULL;
        if (pp->ext != GM_NONE) pool->ext_unowned++;
        lru_push(pool, id);
    } else if (pp->owner != GM_NONE) {
        return GM_OK; /* another range's page mapped here too: it stays there */
    }
    if (pp->ext != GM_NONE) {
        /* An extent goes back whole, with its last page in use. */
        uint32_t head = pp->ext;
        if (!ext_idle(pool, head, false)) return GM_OK;
        size_t bytes = (size_t)pool->phys[head].ext_n << pool->page_shift;
        int rc = ext_wait_release(pool, head, "gm_offload");
        if (rc == GM_OK && released) *released += bytes;
        return rc;
    }
    bool fenced = false;
    for (uint32_t g = pp->first_va; g != GM_NONE && !fenced;) {
        size_t q;
        gm__arena_t *o = arena_of(pool, g, &q);
        if (!fence_wait(pool, o, q)) fenced = true;
        g = o->alias_next[q];
    }
    int rc = fenced ? gm__set_error(GM_NOT_READY, "gm_offload: a page stays cached: work "
                                    "still queued on another stream may use it")
                    : phys_release(pool, id);
    if (rc == GM_OK && released) *released += pool->page;
    return rc;
}

int gm__pages_evict_locked(gm_pool_t *pool, gm__block_t *b, size_t *released, size_t *kept)
{
    gm__arena_t *a = b->arena;
    size_t shift = pool->page_shift;
    size_t p0 = (b->addr - a->base) >> shift;
    size_t p1 = ((b->addr + b->size - 1 - a->base) >> shift) + 1;
    int first = GM_OK;
    for (size_t p = p0; p < p1; p++) {
        if (!bit_get(a->mapped, p)) continue;
        if (!page_evictable(pool, a, p, b)) {
            if (kept && bit_get(a->owned, p)) (*kept)++;
            continue;
        }
        int rc = evict_page(pool, a, p, released);
        if (rc != GM_OK && first == GM_OK) first = rc;
    }
    return first;
}

int gm__pages_evict_span_locked(gm_pool_t *pool, gm__block_t *b, size_t lo, size_t hi,
                                size_t *released)
{
    gm__arena_t *a = b->arena;
    size_t shift = pool->page_shift;
    uintptr_t s = GM_ALIGN_UP(b->addr + lo, pool->page);
    uintptr_t e = (b->addr + (hi < b->size ? hi : b->size)) & ~(uintptr_t)(pool->page - 1);
    int first = GM_OK;
    for (uintptr_t va = s; va < e; va += pool->page) {
        size_t p = (va - a->base) >> shift;
        /* Wholly inside b: no other block lies in it, so b's own page
         * (owned, as b is live) holds nothing else. */
        if (!bit_get(a->mapped, p) || !bit_get(a->owned, p)) continue;
        int rc = evict_page(pool, a, p, released);
        if (rc != GM_OK && first == GM_OK) first = rc;
    }
    return first;
}

void gm__pages_budget(const gm_pool_t *pool, uint64_t live, uint64_t *allow, uint64_t *cap)
{
    uint64_t extra = (uint64_t)((double)live * pool->slack_eff);
    uint64_t pages = (uint64_t)GROW_SLACK_PAGES * pool->page;
    *cap = live + extra + pages;
    *allow = live + extra / 2 + pages;
}

int gm__pages_check_locked(gm_pool_t *pool)
{
    size_t maps = 0, live = 0, free_phys = 0, n_ext = 0;
    for (int c = 0; c < GM_CLASS_COUNT; c++) {
        gm__arena_t *a = &pool->arena[c];
        size_t mapped = 0;
        for (size_t p = 0; p < a->npages; p++) {
            bool m = bit_get(a->mapped, p), o = bit_get(a->owned, p);
            mapped += m;
            if (m != (a->pid[p] != GM_NONE))
                return gm__set_error(GM_INTERNAL, "arena %d: page %zu mapped bit disagrees", c, p);
            if (o && (!m || pool->phys[a->pid[p]].owner != a->gid_base + p))
                return gm__set_error(GM_INTERNAL, "arena %d: page %zu owned but its physical page "
                                     "is not its own", c, p);
            if (o && !bit_get(a->used, p))
                return gm__set_error(GM_INTERNAL, "arena %d: page %zu owned but unused", c, p);
        }
        if (mapped != a->n_mapped)
            return gm__set_error(GM_INTERNAL, "arena %d: %zu pages mapped, counter says %zu", c,
                                 mapped, a->n_mapped);
        maps += mapped;
        /* used must match its definition, and live blocks must own their pages. */
        for (gm__block_t *b = a->first; b; b = b->next) {
            size_t q0 = (b->addr - a->base) >> pool->page_shift;
            size_t q1 = ((b->addr + b->size - 1 - a->base) >> pool->page_shift) + 1;
            if (b->free) {
                /* Wholly inside: unused and unowned, with a fence that is
                 * none (global), passed, or the owner's. */
                uintptr_t lo = GM_ALIGN_UP(b->addr - a->base, pool->page) >> pool->page_shift;
                uintptr_t hi = GM_ALIGN_DOWN(b->addr + b->size - a->base, pool->page) >> pool->page_shift;
                for (uintptr_t p = lo; p < hi; p++) {
                    if (bit_get(a->used, p))
                        return gm__set_error(GM_INTERNAL, "arena %d: page %zu inside a free "
                                             "block is marked used", c, (size_t)p);
                    if (bit_get(a->mapped, p) && !fence_done(a, p) &&
                        (b->owner->is_global || a->fence_s[p] != b->owner))
                        return gm__set_error(GM_INTERNAL, "arena %d: page %zu inside a free block "
                                             "of %s is fenced on another stream", c, (size_t)p,
                                             b->owner->is_global ? "the global index" : "a stream");
                }
                /* Pages it shares with other blocks are used. */
                for (size_t p = q0; p < q1; p++)
                    if ((p < lo || p >= hi) && !bit_get(a->used, p))
                        return gm__set_error(GM_INTERNAL, "arena %d: page %zu shared by a free "
                                             "block is not marked used", c, p);
                continue;
            }
            for (size_t p = q0; p < q1; p++) {
                if (!bit_get(a->used, p))
                    return gm__set_error(GM_INTERNAL, "arena %d: page %zu under a live block is "
                                         "not marked used", c, p);
                /* An offloaded block's pages may be given back. */
                if (!bit_get(a->owned, p) && !gm__block_off_device(b))
                    return gm__set_error(GM_INTERNAL, "arena %d: page %zu under a live block at "
                                         "%#lx is not owned", c, p, (unsigned long)b->addr);
            }
        }
    }
    if (maps != pool->n_maps || maps * pool->page != pool->st.mapped)
        return gm__set_error(GM_INTERNAL, "%zu mappings, counters say %zu", maps, pool->n_maps);
    size_t alias_total = 0;
    for (uint32_t id = 0; id < pool->n_phys_ids; id++) {
        gm__ppage_t *pp = &pool->phys[id];
        if (!pp->live) continue;
        live++;
        if (pp->owner == GM_NONE && pp->ext == GM_NONE) free_phys++;
        if (pp->ext == id) {
            /* An extent: ext_n pages chained from here, one handle, mapped
             * all at consecutive places or (given back half way) nowhere. */
            n_ext++;
            uint32_t k = 0, m = id;
            size_t q0 = 0;
            gm__arena_t *b0 = pp->first_va != GM_NONE ? arena_of(pool, pp->first_va, &q0) : NULL;
            for (; m != GM_NONE && k <= pp->ext_n; m = pool->phys[m].lru_next, k++) {
                const gm__ppage_t *mp = &pool->phys[m];
                if (!mp->live || mp->ext != id || mp->handle != pp->handle)
                    return gm__set_error(GM_INTERNAL, "extent %u: page %u is not one of its own", id, m);
                if (b0 ? (mp->n_maps != 1 || b0->pid[q0 + k] != m) : mp->n_maps != 0)
                    return gm__set_error(GM_INTERNAL, "extent %u: page %u is not mapped at its place",
                                         id, m);
            }
            if (k != pp->ext_n || m != GM_NONE)
                return gm__set_error(GM_INTERNAL, "extent %u: %u pages chained, %u counted", id, k,
                                     pp->ext_n);
        } else if (pp->ext != GM_NONE && (pp->ext >= pool->n_phys_ids || !pool->phys[pp->ext].live ||
                                          pool->phys[pp->ext].ext != pp->ext)) {
            return gm__set_error(GM_INTERNAL, "physical page %u: its extent %u is gone", id, pp->ext);
        }
        if (pp->last_va != GM_NONE) {
            size_t q;
            gm__arena_t *b = arena_of(pool, pp->last_va, &q);
            if (pp->owner != GM_NONE || b->pid[q] != id || bit_get(b->owned, q))
                return gm__set_error(GM_INTERNAL, "physical page %u: its last owner %u does not "
                                     "map it unowned", id, pp->last_va);
        }
        size_t n = 0;
        for (uint32_t g = pp->first_va; g != GM_NONE && n <= pp->n_maps; n++) {
            size_t q;
            gm__arena_t *b = arena_of(pool, g, &q);
            if (b->pid[q] != id)
                return gm__set_error(GM_INTERNAL, "physical page %u: alias list is broken", id);
            g = b->alias_next[q];
        }
        if (n != pp->n_maps)
            return gm__set_error(GM_INTERNAL, "physical page %u: %zu mappings listed, %u counted",
                                 id, n, pp->n_maps);
        alias_total += n;
    }
    if (n_ext != pool->n_ext)
        return gm__set_error(GM_INTERNAL, "%zu extents, counter says %u", n_ext, pool->n_ext);
    if (alias_total != maps)
        return gm__set_error(GM_INTERNAL, "alias lists hold %zu mappings, arenas %zu", alias_total, maps);
    if (free_phys != pool->n_free_phys)
        return gm__set_error(GM_INTERNAL, "%zu free physical pages, list says %u", free_phys,
                             pool->n_free_phys);
    size_t n = 0;
    for (uint32_t id = pool->lru_head; id != GM_NONE && n <= free_phys; id = pool->phys[id].lru_next, n++)
        if (pool->phys[id].owner != GM_NONE || !pool->phys[id].live || pool->phys[id].ext != GM_NONE)
            return gm__set_error(GM_INTERNAL, "physical page %u on the free list is not free", id);
    if (n != free_phys)
        return gm__set_error(GM_INTERNAL, "free list holds %zu pages, %zu are free", n, free_phys);
    if (live * pool->page != pool->st.reserved)
        return gm__set_error(GM_INTERNAL, "reserved %lu != %zu physical pages",
                             (unsigned long)pool->st.reserved, live);
    return GM_OK;
}
