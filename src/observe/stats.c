/* SPDX-License-Identifier: Apache-2.0 */
/*
 * stats.c — statistics of a pool and of the process, and the JSON form of
 * them.  The process figures walk the registry of src/core/registry.c.
 *
 * The one idea: counters are plain fields kept under the pool lock by the
 * code that changes them; everything derived (cached, largest free block,
 * fragmentation, inactive split) is computed only when someone asks, so the
 * allocation path never pays for a statistic.
 */
#include <stdio.h>
#include <string.h>

#include "host/host.h"
#include "observe/observe.h"

/* ---- one pool ------------------------------------------------------------------ */

/* Free bytes in pages a free block shares with its neighbours: the parts of
 * free blocks outside their whole pages.  Trimming cannot give them back
 * while the neighbours live (PyTorch's "inactive split"). */
static uint64_t inactive_split_locked(gm_pool_t *pool)
{
    uint64_t sum = 0;
    for (int c = 0; c < GM_CLASS_COUNT; c++) {
        for (gm__block_t *b = pool->arena[c].first; b; b = b->next) {
            if (!b->free) continue;
            uintptr_t lo = GM_ALIGN_UP(b->addr, pool->page);
            uintptr_t hi = GM_ALIGN_DOWN(b->addr + b->size, pool->page);
            sum += hi > lo ? b->size - (hi - lo) : b->size;
        }
    }
    return sum;
}

void gm__stats_snapshot_locked(gm_pool_t *pool, gm_stats_t *s)
{
    *s = pool->st;
    gm__tcache_adjust_locked(pool, s); /* what thread caches hold is freed */
    for (int k = 0; k < GM_CALL_COUNT; k++)
        s->backend_calls[k] = atomic_load_explicit(&pool->bk_calls.count[k], memory_order_relaxed);
    s->backend_ns = (uint64_t)((double)atomic_load_explicit(&pool->bk_calls.ticks, memory_order_relaxed) *
                               gm__ns_per_tick());
    gm__alloc_free_summary_locked(pool, &s->largest_free_block, &s->free_blocks);
    s->inactive_split = inactive_split_locked(pool);
    s->cached = s->reserved - s->active;
    uint64_t free_mapped = s->mapped > s->active ? s->mapped - s->active : 0;
    s->fragmentation_ppm =
        free_mapped && s->largest_free_block < free_mapped
            ? (uint64_t)(1e6 * (1.0 - (double)s->largest_free_block / (double)free_mapped))
            : 0;
    s->modeled_device_ns = pool->ops->modeled_ns ? pool->ops->modeled_ns(pool->bk) : 0;
    s->size = sizeof *s;
    s->version = GM_STATS_VERSION;
}

/* The pinned host pool and the copy engine keep their own counters under
 * their own locks (src/host/host.c, src/host/copy.c); read them without the pool lock. */
static void host_stats(gm_pool_t *pool, gm_stats_t *s)
{
    gm__host_stats(pool, s);
    gm__copy_stats(pool, s);
}

static int stats_out(const gm_stats_t *s, gm_stats_t *stats)
{
    size_t n = stats->size < sizeof *s ? stats->size : sizeof *s;
    memcpy(stats, s, n);
    stats->size = n;
    return GM_OK;
}

/* Sum s into *sum (the additive fields); *largest: the largest free block. */
static void stats_add(gm_stats_t *sum, const gm_stats_t *s, uint64_t *largest)
{
#define GM__STAT_ADD(name, desc) sum->name += s->name;
    GM_STAT_FIELDS(GM__STAT_ADD)
#undef GM__STAT_ADD
    for (int k = 0; k < GM_CALL_COUNT; k++) sum->backend_calls[k] += s->backend_calls[k];
    if (s->largest_free_block > *largest) *largest = s->largest_free_block;
}

/* The fields a sum cannot give: largest_free_block (the largest of any
 * part: one allocation is served by one) and fragmentation_ppm (the
 * per-pool formula over the summed figures). */
static void stats_finish(gm_stats_t *s, uint64_t largest)
{
    s->largest_free_block = largest;
    uint64_t free_mapped = s->mapped > s->active ? s->mapped - s->active : 0;
    s->fragmentation_ppm =
        free_mapped && s->largest_free_block < free_mapped
            ? (uint64_t)(1e6 * (1.0 - (double)s->largest_free_block / (double)free_mapped))
            : 0;
    s->size = sizeof *s;
    s->version = GM_STATS_VERSION;
}

/* A pool's figures: its heaps' summed (each read under its own lock, one
 * after the other).  reserved_peak is the pool's own (the limit's figure),
 * the other peaks are sums of the heaps' peaks, so an upper bound. */
static void pool_snapshot(gm_pool_t *pool, gm_stats_t *out)
{
    gm__lock(&pool->lock);
    gm__stats_snapshot_locked(pool, out);
    gm__unlock(&pool->lock);
    if (atomic_load_explicit(&pool->n_heaps, memory_order_acquire) <= 1) return;
    uint64_t largest = out->largest_free_block;
    gm_pool_t *h;
    for (unsigned i = 1; (h = gm__heap_next(pool, &i));) {
        gm_stats_t s;
        gm__lock(&h->lock);
        gm__stats_snapshot_locked(h, &s);
        gm__unlock(&h->lock);
        s.modeled_device_ns = 0; /* the root's backend, read once */
        stats_add(out, &s, &largest);
    }
    /* The heaps were read one after the other while pages may move between
     * them: the pool's own figure is exact. */
    /* (Registrable segments count in the limit's figure but not in reserved.) */
    uint64_t fam = atomic_load_explicit(&pool->fam_reserved, memory_order_relaxed);
    uint64_t segs = out->registrable_reserved;
    out->reserved = fam > segs ? fam - segs : 0;
    out->cached = out->reserved > out->active ? out->reserved - out->active : 0;
    fam = atomic_load_explicit(&pool->fam_reserved_peak, memory_order_relaxed);
    out->reserved_peak = fam > segs ? fam - segs : 0;
    if (out->reserved_peak < out->reserved) out->reserved_peak = out->reserved;
    stats_finish(out, largest);
}

int gm_pool_stats(gm_pool_t *pool, gm_stats_t *stats)
{
    if (!stats || stats->size < offsetof(gm_stats_t, allocated))
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_pool_stats: initialise stats with GM_STATS_INIT");
    GM_CHECK(gm__pool_resolve(&pool, "gm_pool_stats"));
    gm_stats_t s;
    pool_snapshot(pool, &s);
    host_stats(pool, &s);
    return stats_out(&s, stats);
}

static void reset_peaks_locked(gm_pool_t *pool)
{
    /* What thread caches hold was freed by the program. */
    gm_stats_t now = {.allocated = pool->st.allocated, .active = pool->st.active};
    gm__tcache_adjust_locked(pool, &now);
    gm__fam_peak_add(pool, (int64_t)now.allocated - (int64_t)pool->st.allocated_peak);
    pool->st.allocated_peak = now.allocated;
    pool->st.active_peak = now.active;
    pool->st.reserved_peak = pool->st.reserved;
    pool->st.sysmem_allocated_peak = pool->st.sysmem_allocated;
    if (pool->root == pool)
        atomic_store_explicit(&pool->fam_reserved_peak,
                              atomic_load_explicit(&pool->fam_reserved, memory_order_relaxed),
                              memory_order_relaxed);
    gm__monitor_invalidate_locked(pool);
    gm__monitor_publish_locked(pool);
}

int gm_pool_reset_peaks(gm_pool_t *pool)
{
    GM_CHECK(gm__pool_resolve(&pool, "gm_pool_reset_peaks"));
    gm_pool_t *h;
    for (unsigned i = 0; (h = gm__heap_next(pool, &i));) {
        gm__lock(&h->lock);
        reset_peaks_locked(h);
        gm__unlock(&h->lock);
    }
    gm__host_reset_peaks(pool);
    return GM_OK;
}

/* ---- the process ------------------------------------------------------------------ */

typedef struct process_sum {
    gm_stats_t sum;
    uint64_t largest; /* the largest free block of any pool */
} process_sum_t;

static void add_pool(gm_pool_t *pool, void *arg)
{
    process_sum_t *ps = arg;
    gm_stats_t s;
    pool_snapshot(pool, &s);
    host_stats(pool, &s);
    stats_add(&ps->sum, &s, &ps->largest);
}

/* Not additive: largest_free_block is the largest block of any pool (one
 * allocation is served by one pool), and fragmentation_ppm is recomputed
 * from the process figures with the per-pool formula: 1 - largest free block
 * / (mapped - active), over all pools. */
int gm_process_stats(gm_stats_t *stats)
{
    if (!stats || stats->size < offsetof(gm_stats_t, allocated))
        return gm__set_error(GM_INVALID_ARGUMENT,
                             "gm_process_stats: initialise stats with GM_STATS_INIT");
    process_sum_t ps;
    memset(&ps, 0, sizeof ps);
    gm__registry_foreach(add_pool, &ps);
    gm_stats_t s = ps.sum;
    stats_finish(&s, ps.largest);
    return stats_out(&s, stats);
}

static void reset_pool(gm_pool_t *pool, void *arg)
{
    (void)arg;
    gm_pool_reset_peaks(pool);
}

int gm_process_reset_peaks(void)
{
    gm__registry_foreach(reset_pool, NULL);
    return GM_OK;
}

/* ---- JSON ------------------------------------------------------------------------- */

/* Does field (at offset off, n bytes) lie inside the caller's struct? */
#define FITS(st, off, n) ((off) + (n) <= (st)->size)

int gm_stats_json(const gm_stats_t *st, char *buf, size_t cap, size_t *len)
{
    if (!st || (!buf && cap)) return gm__set_error(GM_INVALID_ARGUMENT, "gm_stats_json: NULL argument");
    /* A versioned struct: only the bytes the caller's `size` covers are
     * read, so an older, smaller gm_stats_t prints its own fields and no
     * more (a newer, larger one prints the fields this library knows). */
    if (st->size < offsetof(gm_stats_t, allocated))
        return gm__set_error(GM_INVALID_ARGUMENT,
                             "gm_stats_json: stats->size %zu is too small (initialise with GM_STATS_INIT)",
                             st->size);
    size_t at = 0;
#define PUT(...)                                                               \
    do {                                                                       \
        int n_ = snprintf(buf ? buf + (at < cap ? at : cap) : NULL,            \
                          at < cap ? cap - at : 0, __VA_ARGS__);               \
        if (n_ > 0) at += (size_t)n_;                                          \
    } while (0)
    const char *sep = "";
    PUT("{");
#define GM__STAT_JSON(name, desc)                                              \
    if (FITS(st, offsetof(gm_stats_t, name), sizeof st->name)) {               \
        PUT("%s\"" #name "\":%llu", sep, (unsigned long long)st->name);        \
        sep = ",";                                                             \
    }
    GM_STAT_FIELDS(GM__STAT_JSON)
#undef GM__STAT_JSON
    if (!FITS(st, offsetof(gm_stats_t, backend_calls), sizeof st->backend_calls)) {
        PUT("}");
        goto done;
    }
    PUT(",\"backend_calls\":{");
    sep = "";
    for (int k = 0; k < GM_CALL_COUNT; k++) {
        PUT("%s\"%s\":%llu", sep, gm_call_name(k), (unsigned long long)st->backend_calls[k]);
        sep = ",";
    }
    PUT("}}");
done:
#undef PUT
    if (len) *len = at;
    if (cap && at >= cap) {
        buf[cap - 1] = '\0';
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_stats_json: needs %zu bytes, got %zu", at + 1, cap);
    }
    return GM_OK;
}
