/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pool.c — one pool: its configuration, creation and teardown (which start
 * its host pool, copy engine and sysmem fallback), the public allocation
 * entry points, limits, trim, and the engine's hooks (which features hear
 * the engine's events).  What spans pools (the default and per-device pools,
 * fork, exit) is src/api/process.c, the registry src/core/registry.c;
 * statistics are src/observe/stats.c.
 *
 * A pool owns one backend context, two arenas of reserved address space
 * (small requests packed apart from large ones), the free indexes and the
 * live-block table.  One mutex guards all of it; every public function here
 * takes it (none is called with it held) and nothing below it blocks on
 * anything but backend calls, which only growth, trim and stream draining
 * make.
 *
 * Observers are reached through one inline call per event, defined in
 * src/observe/observe.h (gm__observe_alloc_locked, gm__observe_free_locked,
 * gm__observe_alloc_failure_locked ...), so gm_alloc and gm_free read "lock,
 * allocate, observe, unlock" and adding an observer never edits this file.
 * Pool creation and destruction tell the process layer (which registers the
 * pool and starts the observers the environment asks for); a failed
 * allocation goes through one slow path (alloc_slow_locked) that ends in the
 * out-of-memory report.
 *
 * Handles are checked before anything is touched (gm__pool_resolve: one
 * compare of pool->magic); a pool's struct is a mapping of its own, never
 * unmapped, so a destroyed handle stays readable and never names a later
 * pool.  After fork() the child marks the parent's pools dead (process.c).
 * gm_free, gm_block_size and gm_record_stream take a device block of the
 * arenas at once; any other pointer is one lookup in the root's address map,
 * and its memory kind's row (core/kinds.h) does the rest.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host/host.h"
#include "observe/observe.h"
#include "core/options.h"
#include "core/kinds.h"
#include "core/pool.h"
#include "share/share.h"
#include "broker/broker.h"

/* ---- creation and teardown ------------------------------------------------- */

/* The engine's hooks (pool.h): what the features hear from the engine. */
static void heap_made(gm_pool_t *h)
{
    if (h->root->mon) gm__monitor_attach(h); /* its own row in gpumem top */
}

static void heap_gone(gm_pool_t *h)
{
    gm__trace_pool_flush(h);
    gm__monitor_detach(h);
}

/* The broker client's reclaim, one heap (broker.h). */
static int broker_trim_locked(gm_pool_t *h, size_t keep, size_t *released)
{
    gm__tcache_reclaim_large_locked(h); /* large blocks threads' caches hold */
    int rc = gm__pages_trim_locked(h, keep, released);
    gm__observe_trimmed_locked(h);
    return rc;
}

static const gm__heap_hooks_t pool_hooks = {
    .tagged_alloc_locked = gm__offload_note_alloc_locked,
    .tagged_free_locked = gm__offload_note_free_locked,
    .offload_trim_locked = gm__offload_trim_locked,
    .heap_made = heap_made,
    .heap_gone = heap_gone,
    .trimmed_locked = gm__observe_trimmed_locked,
    .offload_fini_locked = gm__offload_heap_fini_locked,
    .observers_fini_locked = gm__observe_pool_fini_locked,
};

static int config_copy(const gm_pool_config_t *in, gm_pool_config_t *out)
{
    gm_pool_config_t d = GM_POOL_CONFIG_INIT;
    if (in->size < offsetof(gm_pool_config_t, backend) || in->version == 0 ||
        in->version > GM_POOL_CONFIG_VERSION)
        return gm__set_error(GM_INVALID_ARGUMENT,
                             "gm_pool_create: config has size %zu and version %u; initialise it "
                             "with GM_POOL_CONFIG_INIT", in->size, in->version);
    memcpy(&d, in, in->size < sizeof d ? in->size : sizeof d);
    d.size = sizeof d;
    d.version = GM_POOL_CONFIG_VERSION;
    if (!memchr(d.broker, '\0', sizeof d.broker))
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_pool_create: config's broker path is not "
                             "terminated within %zu bytes", sizeof d.broker);
    if (d.backend != GM_BACKEND_AUTO && d.backend != GM_BACKEND_SIM && d.backend != GM_BACKEND_CUDA)
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_pool_create: unknown backend %d",
                             (int)d.backend);
    if (d.device < 0)
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_pool_create: device %d", d.device);
    if (d.flags & ~(GM_POOL_SYSMEM_FALLBACK | GM_POOL_EVICT | GM_POOL_NCCL | GM_POOL_COMPRESSIBLE))
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_pool_create: unknown flags %#x", d.flags);
    if (d.sim_capacity == 0) d.sim_capacity = gm__option_sim_capacity();
    if (!(d.reserve_slack >= 0 && d.reserve_slack <= 1 && d.reserve_slack_max >= 0 &&
          d.reserve_slack_max <= 1 && d.churn_target >= 0 && d.churn_target <= 1e6 &&
          d.heap_slack_max >= 0 && d.heap_slack_max <= 1))
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_pool_create: reserve_slack %g, "
                             "reserve_slack_max %g and heap_slack_max %g must lie in [0, 1], "
                             "churn_target %g in [0, 1e6]", d.reserve_slack, d.reserve_slack_max,
                             d.heap_slack_max, d.churn_target);
    if (d.heaps == 0) { /* cfg.heaps 0: GPUMEM_HEAPS (1 to 64; its row refuses anything else) */
        uint64_t x;
        GM_CHECK(gm__option_read(GM_OPT_HEAPS, &x));
        d.heaps = x > 1 ? (unsigned)x : 1;
    }
    if (d.heaps > GM_HEAPS_MAX)
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_pool_create: heaps %u: at most %d",
                             d.heaps, GM_HEAPS_MAX);
    *out = d;
    return GM_OK;
}

/* Everything but the handle's own memory, which is never unmapped (so a
 * stale handle stays readable and can never name a later pool): its pages
 * are given back and read as zeros, magic 0. */
static void pool_teardown(gm_pool_t *pool, uint64_t *blocks, uint64_t *bytes)
{
    gm__process_pool_destroying(pool);
    gm__broker_provider_stop(&pool->provider); /* its thread walks the heaps */
    gm__heaps_destroy(pool, blocks, bytes); /* unregistered: no walk reaches them */
    gm__offload_fini(pool);
    gm__copy_fini(pool);
    gm__sysmem_fini(pool);
    gm__host_fini(pool);
    gm__lock(&pool->lock);
    gm__managed_fini(pool);
    gm__segs_fini(pool);
    gm__kinds_fini(pool); /* after every kind's records */
    gm__pool_core_fini_locked(pool, blocks, bytes);
    if (pool->provider.ops && pool->provider.ops->destroy) {
        gm__unlock(&pool->lock);
        pool->provider.ops->destroy(pool->provider.ctx);
        gm__lock(&pool->lock);
        pool->provider.ops = NULL;
    }
    if (pool->bk) pool->ops->close(pool->bk);
    gm__unlock(&pool->lock);
    pthread_mutex_destroy(&pool->heaps_mu);
    gm__pool_map_dead(pool);
}

void gm_pool_destroy(gm_pool_t *pool)
{
    if (!pool || !gm__handle_in_arena(pool) || pool->magic != GM_POOL_MAGIC)
        return; /* see gm_pool_create's notes */
    gm__share_pool_destroy(pool); /* its servers and clients first: they use it */
    gm__lock(&pool->lock);
    size_t sn = 0, sbytes = 0;
    if (pool->sysmem) gm__sysmem_count_locked(pool, &sn, &sbytes);
    gm__unlock(&pool->lock);
    uint64_t n = 0, bytes = 0; /* live blocks of every heap */
    pool_teardown(pool, &n, &bytes);
    if (n + sn)
        gm__set_error(GM_OK, "gm_pool_destroy: %llu live allocations (%llu bytes) released with "
                      "the pool (%zu of them from the sysmem fallback)",
                      (unsigned long long)(n + sn), (unsigned long long)(bytes + sbytes), sn);
}

/* What the backend is opened with: the device, its peers, how pages are
 * made, and the sim's machine (read from the environment at each creation,
 * as the config is). */
static int backend_config(const gm_pool_t *pool, gm__backend_config_t *bc)
{
    memset(bc, 0, sizeof *bc);
    bc->device = pool->cfg.device;
    bc->sim_capacity = pool->cfg.sim_capacity;
    bc->peers = pool->cfg.peers;
    if (pool->cfg.flags & GM_POOL_NCCL) bc->phys_flags |= GM__PHYS_NCCL;
    if (pool->cfg.flags & GM_POOL_COMPRESSIBLE) bc->phys_flags |= GM__PHYS_COMPRESSIBLE;
    if (pool->backend_kind != GM_BACKEND_SIM) return GM_OK;
    uint64_t n, group, comp;
    GM_CHECK(gm__option_read(GM_OPT_SIM_DEVICES, &n));
    if (n < 1 || n > 32)
        return gm__set_error(GM_INVALID_ARGUMENT, "GPUMEM_SIM_DEVICES=%llu: the sim has 1 to 32 "
                             "devices", (unsigned long long)n);
    GM_CHECK(gm__option_read(GM_OPT_SIM_PEER_GROUP, &group));
    GM_CHECK(gm__option_read(GM_OPT_SIM_COMPRESSION, &comp));
    bc->sim_devices = (int)n;
    bc->sim_peer_group = (int)group;
    bc->sim_no_compression = comp == 0;
    return GM_OK;
}

/* The only list of the memory kinds (core/kinds.h), handed to the root's
 * address map at creation.  Order: the leak report's; the device block's
 * row first and the shared block's second (kinds.h says why). */
static const gm__kind_ops_t *const kind_rows[] = {
    &gm__kind_device,  &gm__kind_shared, &gm__kind_sysmem,   &gm__kind_managed,
    &gm__kind_segment, &gm__kind_host,   &gm__kind_internal, NULL,
};

int gm_pool_create(const gm_pool_config_t *cfg, gm_pool_t **out)
{
    int rc;
    if (!out) return gm__set_error(GM_INVALID_ARGUMENT, "gm_pool_create: pool is NULL");
    *out = NULL;
    gm__process_init();
    /* A mapping of its own, never unmapped: see pool_teardown. */
    gm_pool_t *pool = gm__pool_map_new(NULL);
    if (!pool) return gm__set_error(GM_NO_HOST_MEMORY, "gm_pool_create: out of host memory");
    pool->hooks = &pool_hooks;
    atomic_store_explicit(&pool->heap[0], pool, memory_order_relaxed);
    atomic_store_explicit(&pool->n_heaps, 1, memory_order_relaxed);
    pthread_mutex_init(&pool->heaps_mu, NULL);

    if (cfg) GM_CHECK_GOTO(config_copy(cfg, &pool->cfg), rc, fail);
    else GM_CHECK_GOTO(gm_config_from_env(&pool->cfg), rc, fail);
    if (cfg == NULL) GM_CHECK_GOTO(config_copy(&pool->cfg, &pool->cfg), rc, fail);

    GM_CHECK_GOTO(gm__backend_select(pool->cfg.backend, pool->cfg.device, &pool->ops,
                                     &pool->backend_kind, pool->backend_reason,
                                     sizeof pool->backend_reason), rc, fail);
    gm__backend_config_t bc;
    GM_CHECK_GOTO(backend_config(pool, &bc), rc, fail);
    GM_CHECK_GOTO(pool->ops->open(&bc, &pool->bk), rc, fail);
    GM_CHECK_GOTO(pool->ops->info(pool->bk, &pool->info), rc, fail);
    if (!pool->info.vmm_supported) {
        rc = gm__set_error(GM_NOT_SUPPORTED, "gm_pool_create: device %d (%s) has no virtual "
                           "memory management support; gpumem needs it",
                           pool->cfg.device, pool->info.name);
        goto fail;
    }
    pool->page = pool->info.granularity;
    if (pool->page < 4096 || (pool->page & (pool->page - 1))) {
        rc = gm__set_error(GM_BACKEND, "gm_pool_create: backend granularity %zu is not a power "
                           "of two", pool->page);
        goto fail;
    }
    pool->page_shift = (unsigned)__builtin_ctzll(pool->page);
    gm__provider_local_init(&pool->provider, pool);
    if (pool->cfg.broker[0])
        GM_CHECK_GOTO(gm__broker_provider_init(&pool->provider, pool, broker_trim_locked), rc, fail);
    pool->limit = pool->info.total_memory;
    if (pool->cfg.limit && pool->cfg.limit < pool->limit) pool->limit = pool->cfg.limit;

    GM_CHECK_GOTO(gm__kinds_init(pool, kind_rows), rc, fail);
    gm__share_set_free(gm__free_held_locked);
    GM_CHECK_GOTO(gm__host_init(pool), rc, fail);
    GM_CHECK_GOTO(gm__copy_init(pool), rc, fail);
    GM_CHECK_GOTO(gm__offload_init(pool), rc, fail);
    /* Address space is cheap: room for the whole device several times over,
     * so holes never force a failure while physical pages are free. */
    size_t total = GM_ALIGN_UP(pool->info.total_memory, pool->page);
    GM_CHECK_GOTO(gm__pool_core_init(pool, total * 2, total * 4), rc, fail);
    if (pool->cfg.initial_reserve) {
        rc = gm__pages_prefault_locked(pool, pool->cfg.initial_reserve);
        if (rc != GM_OK) {
            gm__set_error(rc, "gm_pool_create: initial reserve of %zu bytes failed: %s",
                          pool->cfg.initial_reserve, gm_last_error());
            goto fail;
        }
    }
    pool->magic = GM_POOL_MAGIC;
    gm__process_pool_created(pool);
    /* Heaps only where every operation needs no view of the whole pool:
     * leak stacks, a trace in order, the sysmem fallback live in the root. */
    if (pool->cfg.heaps > 1 && !pool->leaks && !gm__leak_reporting() &&
        !atomic_load_explicit(&gm__trace_on, memory_order_relaxed) &&
        !(pool->cfg.flags & GM_POOL_SYSMEM_FALLBACK))
        pool->heaps_max = pool->cfg.heaps;
    gm__controller_init(pool); /* once heaps_max is known: it picks the window */
    gm__clear_error();
    *out = pool;
    return GM_OK;
fail:;
    uint64_t nb = 0, nbytes = 0;
    pool_teardown(pool, &nb, &nbytes);
    gm__pool_map_unused(pool); /* never handed out: no stale handle can exist */
    return rc;
}

#define resolve(pool) gm__pool_resolve((pool), __func__)

/* ---- allocation ------------------------------------------------------------ */

#if GM_DEBUG >= 3
#define VALIDATE_LOCKED(pool)                                                  \
    do {                                                                       \
        if (gm__alloc_check_locked(pool) != GM_OK) {                           \
            fprintf(stderr, "gpumem: pool check failed: %s\n", gm_last_error()); \
            gm_assert_expensive(0);                                            \
        }                                                                      \
    } while (0)
#else
#define VALIDATE_LOCKED(pool) ((void)0)
#endif

/* The pools whose out-of-memory handlers this thread is running (nested
 * when a handler allocates on another pool whose handlers run too).  An
 * allocation on one of them does not call its handlers again. */
#define OOM_NEST_MAX 8
static _Thread_local gm_pool_t *oom_running[OOM_NEST_MAX];
static _Thread_local unsigned oom_depth;

static bool oom_handlers_running(const gm_pool_t *pool)
{
    for (unsigned i = 0; i < oom_depth; i++)
        if (oom_running[i] == pool) return true;
    return oom_depth == OOM_NEST_MAX; /* deeper: no more handlers at all */
}

/* One more attempt of the slow path (lock held; the stream state is looked
 * up again, since the lock may have been dropped).  Returns whether it is
 * over: *rc GM_OK (served), or a failure that is not a lack of memory;
 * otherwise *rc is the refusal and reason holds its message. */
static bool retry_locked(gm_pool_t *pool, size_t size, size_t align, gm_stream_t stream,
                         gm_tag_t tag, void **ptr, int *rc, char *reason, size_t cap)
{
    gm__stream_t *s = gm__stream_get_locked(pool, stream);
    if (!s) {
        *rc = gm__set_error(GM_NO_HOST_MEMORY, "gm_alloc: out of host memory for a stream");
        return true;
    }
    *rc = gm__alloc_locked(pool, size, align, s, tag, ptr);
    if (*rc != GM_OUT_OF_MEMORY && *rc != GM_LIMIT) return true;
    snprintf(reason, cap, "%s", gm_last_error());
    return false;
}

/* Everything after a failed first attempt, lock held (released around the
 * handlers and while other heaps give pages back).  The steps, each
 * followed by a retry:
 *   1. drain the streams and trim the cache (free pages go back to the
 *      device, so a large range can get fresh ones); with heaps, then the
 *      other heaps do the same;
 *   2. the user's out-of-memory handlers (the root's), called without the lock;
 *   3. a last resort (see below);
 * then the report.  `retries` counts allocations served by a retry,
 * `alloc_failures` the entries here, `oom_count` (in oom.c) the failures. */
static int alloc_slow_locked(gm_pool_t *pool, size_t size, size_t align, gm_stream_t stream,
                             gm_tag_t tag, void **ptr, int rc)
{
    gm__observe_alloc_retry_locked(pool);
    char reason[256];
    snprintf(reason, sizeof reason, "%s", gm_last_error());

    (void)gm__pool_reclaim_locked(pool);
    if (retry_locked(pool, size, align, stream, tag, ptr, &rc, reason, sizeof reason)) goto over;
    if (gm__heaps_reclaim_others(pool) && retry_locked(pool, size, align, stream, tag, ptr, &rc, reason, sizeof reason))
        goto over;

    /* GM_POOL_EVICT: offload evictable tags nobody holds, least recently
     * released first, until the request fits (offload.c; the lock is
     * dropped meanwhile, as for the handlers). */
    gm_pool_t *root = pool->root;
    if (root->cfg.flags & GM_POOL_EVICT) {
        for (;;) {
            gm__unlock(&pool->lock);
            bool evicted = gm__offload_evict_one(root, tag);
            gm__lock(&pool->lock);
            if (!evicted) break;
            if (retry_locked(pool, size, align, stream, tag, ptr, &rc, reason, sizeof reason)) goto over;
        }
    }

    /* The handlers are the root's, called with the root: the user's handle.
     * They are copied under the root's lock (gm_set_oom_handler and
     * gm_remove_oom_handler change them under it): the root copies them
     * before it drops its own, a heap takes the root's once its own is
     * dropped. */
    bool nested = oom_handlers_running(root);
    for (int round = 0; round < GM_OOM_MAX_ROUNDS && !nested; round++) {
        struct gm__oom_handler h[GM_OOM_MAX_HANDLERS];
        unsigned n = 0;
        if (root == pool) {
            n = root->n_oom_handlers;
            memcpy(h, root->oom_handlers, n * sizeof h[0]);
            gm__unlock(&pool->lock);
        } else {
            gm__unlock(&pool->lock);
            gm__lock(&root->lock);
            n = root->n_oom_handlers;
            memcpy(h, root->oom_handlers, n * sizeof h[0]);
            gm__unlock(&root->lock);
        }
        int again = 0;
        unsigned calls = 0;
        oom_running[oom_depth++] = root;
        for (unsigned i = 0; i < n && !again; i++, calls++)
            again = h[i].fn(root, size, stream, h[i].user);
        oom_depth--;
        gm__lock(&pool->lock);
        pool->st.oom_handler_calls += calls;
        if (!again) break;
        if (retry_locked(pool, size, align, stream, tag, ptr, &rc, reason, sizeof reason)) goto over;
    }

    /* The last resort: pinned host memory the device can address (opt-in,
     * counted apart in stats, announced on stderr; src/host/sysmem.c). */
    if ((pool->cfg.flags & GM_POOL_SYSMEM_FALLBACK) && align == GM_ALIGNMENT) {
        gm__stream_t *s = gm__stream_get_locked(pool, stream);
        if (s && gm__sysmem_alloc_locked(pool, size, s, ptr, rc) == GM_OK) return GM_OK;
        snprintf(reason, sizeof reason, "%s", gm_last_error());
    }

    return gm__observe_alloc_failure_locked(pool, size, stream, rc, reason);
over:
    if (rc != GM_OK) return rc;
    pool->st.retries++;
    gm__clear_error();
    return GM_OK;
}

/* gm_alloc and gm_alloc_shareable: align is GM_ALIGNMENT (the thread cache
 * may serve it) or the page size (a block of whole pages). */
static inline __attribute__((always_inline)) int alloc_impl(gm_pool_t *pool, size_t size,
                                                            size_t align, gm_stream_t stream,
                                                            gm_tag_t tag, void **ptr)
{
    pool = gm__heap_self(pool);
    if (align == GM_ALIGNMENT && tag == GM_TAG_NONE && gm__tcache_may_serve(size)) {
        if (gm__tcache_alloc(pool, size, stream, ptr) == GM_OK) return GM_OK;
        gm__tcache_prepare(pool);
    }
    void *frames[GM_LEAK_MAX_FRAMES];
    int n_frames = gm__observe_alloc_begin(frames);
    gm__lock(&pool->lock);
    gm__tcache_release_large_locked(pool);
    int rc;
    /* A request no pool of this limit could ever hold fails before any work
     * (the limit rule is the page layer's, gm__pages_limit_allows). */
    if (GM_UNLIKELY(!gm__pages_limit_allows(pool, 0, size) || size > GM_MAX_REQUEST)) {
        char a[32], why[160];
        bool over_device = size > pool->info.total_memory || size > GM_MAX_REQUEST;
        size_t cap = over_device ? pool->info.total_memory : pool->limit;
        snprintf(why, sizeof why, "%zu bytes is more than the %s (%s)", size,
                 over_device ? "device's memory" : "pool limit", gm__fmt_bytes(cap, a, sizeof a));
        rc = gm__observe_alloc_failure_locked(pool, size, stream,
                                              over_device ? GM_OUT_OF_MEMORY : GM_LIMIT, why);
        gm__unlock(&pool->lock);
        return rc;
    }
    gm__stream_t *s = gm__stream_get_locked(pool, stream);
    rc = s ? gm__alloc_locked(pool, size, align, s, tag, ptr)
           : gm__set_error(GM_NO_HOST_MEMORY, "gm_alloc: out of host memory for a stream");
    if (GM_UNLIKELY(rc == GM_OUT_OF_MEMORY || rc == GM_LIMIT))
        rc = alloc_slow_locked(pool, size, align, stream, tag, ptr, rc);
    gm__observe_alloc_locked(pool, rc, *ptr, size, stream, frames, n_frames);
    VALIDATE_LOCKED(pool);
    gm__unlock(&pool->lock);
    return rc;
}

int gm_alloc(gm_pool_t *pool, size_t size, gm_stream_t stream, void **ptr)
{
    if (GM_UNLIKELY(!ptr)) return gm__set_error(GM_INVALID_ARGUMENT, "gm_alloc: ptr is NULL");
    *ptr = NULL;
    GM_CHECK(resolve(&pool));
    if (GM_UNLIKELY(size == 0)) return GM_OK;
    return alloc_impl(pool, size, GM_ALIGNMENT, stream, gm__tag_current(), ptr);
}

int gm_alloc_tagged(gm_pool_t *pool, size_t size, gm_stream_t stream, gm_tag_t tag, void **ptr)
{
    if (!ptr) return gm__set_error(GM_INVALID_ARGUMENT, "gm_alloc_tagged: ptr is NULL");
    *ptr = NULL;
    GM_CHECK(resolve(&pool));
    if (!gm__tag_valid(tag))
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_alloc_tagged: tag %u was not made by "
                             "gm_tag_get", (unsigned)tag);
    if (size == 0) return GM_OK;
    return alloc_impl(pool, size, GM_ALIGNMENT, stream, tag, ptr);
}

int gm_alloc_shareable(gm_pool_t *pool, size_t size, gm_stream_t stream, void **ptr)
{
    if (!ptr) return gm__set_error(GM_INVALID_ARGUMENT, "gm_alloc_shareable: ptr is NULL");
    *ptr = NULL;
    GM_CHECK(resolve(&pool));
    if (size == 0) return GM_OK;
    if (size > GM_MAX_REQUEST - pool->page)
        return gm__set_error(GM_OUT_OF_MEMORY, "gm_alloc_shareable: %zu bytes is more than the "
                             "device's memory", size);
    return alloc_impl(pool, size, pool->page, stream, GM_TAG_NONE, ptr); /* never tagged: never moved */
}

int gm_alloc_managed(gm_pool_t *pool, size_t size, unsigned flags, gm_stream_t stream, void **ptr)
{
    if (!ptr) return gm__set_error(GM_INVALID_ARGUMENT, "gm_alloc_managed: ptr is NULL");
    *ptr = NULL;
    GM_CHECK(resolve(&pool));
    if (flags & ~(GM_MANAGED_PREFER_DEVICE | GM_MANAGED_PREFETCH))
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_alloc_managed: unknown flags %#x", flags);
    if (size == 0) return GM_OK;
    if (size > GM_MAX_REQUEST)
        return gm__set_error(GM_OUT_OF_MEMORY, "gm_alloc_managed: %zu bytes is more than any "
                             "machine has", size);
    gm__lock(&pool->lock);
    int rc = gm__managed_alloc_locked(pool, size, flags, stream, ptr);
    gm__unlock(&pool->lock);
    return rc;
}

int gm_alloc_registrable(gm_pool_t *pool, size_t size, gm_stream_t stream, void **ptr)
{
    if (!ptr) return gm__set_error(GM_INVALID_ARGUMENT, "gm_alloc_registrable: ptr is NULL");
    *ptr = NULL;
    GM_CHECK(resolve(&pool));
    if (size == 0) return GM_OK;
    if (size > GM_MAX_REQUEST)
        return gm__set_error(GM_OUT_OF_MEMORY, "gm_alloc_registrable: %zu bytes is more than any "
                             "machine has", size);
    gm__lock(&pool->lock);
    int rc = gm__segs_alloc_locked(pool, size, stream, ptr);
    gm__unlock(&pool->lock);
    return rc;
}

int gm_pool_set_register_hooks(gm_pool_t *pool, const gm_register_hooks_t *hooks)
{
    GM_CHECK(resolve(&pool));
    gm__lock(&pool->lock);
    int rc = gm__segs_set_hooks_locked(pool, hooks);
    gm__unlock(&pool->lock);
    return rc;
}

int gm_managed_prefetch(gm_pool_t *pool, void *ptr, size_t size, int to_host, gm_stream_t stream)
{
    if (!ptr) return gm__set_error(GM_INVALID_ARGUMENT, "gm_managed_prefetch: ptr is NULL");
    GM_CHECK(resolve(&pool));
    gm__lock(&pool->lock);
    int rc = gm__managed_prefetch_locked(pool, ptr, size, to_host, stream);
    gm__unlock(&pool->lock);
    return rc;
}

/* ---- who owns a pointer ----------------------------------------------------- */

/* The device row: a live block of the arenas (gm_alloc, gm_alloc_tagged,
 * gm_alloc_shareable), reached by the range test (gm__heap_holds) and the
 * live table, never through the address map.  gm_free of one is
 * free_entry_locked's first branch (the fast path, written out there). */
static int device_free(gm_pool_t *pool, gm__kind_rec_t *rec, void *ptr, gm_stream_t stream,
                       size_t *size)
{
    (void)rec;
    gm__stream_t *s = gm__stream_get_locked(pool, stream);
    bool held = false;
    int rc = s ? gm__free_locked(pool, ptr, s, size, &held)
               : gm__set_error(GM_NO_HOST_MEMORY, "gm_free: out of host memory for a stream");
    gm_assert_internal(!held); /* the shared row's, reached first */
    return rc;
}

static int device_size(gm_pool_t *pool, const gm__kind_rec_t *rec, const void *ptr, size_t *size)
{
    (void)rec;
    gm__block_t *b = gm__hash_get(&pool->live, (uintptr_t)ptr);
    if (!b || atomic_load_explicit(&b->tc_cached, memory_order_relaxed)) return GM_INVALID_POINTER;
    *size = b->requested;
    return GM_OK;
}

static int device_record(gm_pool_t *pool, gm__kind_rec_t *rec, void *ptr, gm_stream_t stream)
{
    (void)rec;
    gm__stream_t *s = gm__stream_get_locked(pool, stream);
    return s ? gm__record_stream_locked(pool, ptr, s)
             : gm__set_error(GM_NO_HOST_MEMORY, "gm_record_stream: out of host memory");
}

static void device_foreach(gm_pool_t *pool, gm__kind_each_fn fn, void *arg)
{
    for (size_t i = 0; i < pool->live.cap; i++) {
        if (!pool->live.keys[i]) continue;
        const gm__block_t *b = pool->live.vals[i];
        /* Freed by the program, waiting in a thread's cache: not live. */
        if (atomic_load_explicit(&b->tc_cached, memory_order_relaxed)) continue;
        fn(b->addr, b->requested, arg);
    }
}

/* gm_record_stream: the block is reused after the free only once the work
 * each recorded stream had queued by the free has completed (an event
 * recorded there, else a wait for the stream); until then it is pending,
 * and gm_free does not wait.  A block held by sharing lists as this row. */
const gm__kind_ops_t gm__kind_device = {
    .name = "a device block of gm_alloc",
    .flags = GM__KIND_GM_ALLOC,
    .free = device_free,
    .size = device_size,
    .record = device_record,
    .foreach = device_foreach,
};

/* ptr is no live allocation of gm_alloc's family: GM_INVALID_ARGUMENT for
 * memory of another entry point (nothing done), else rc (its message set
 * when `msg`, for the map's kinds that answered GM_INVALID_POINTER). */
static int not_ours(const gm__kind_ops_t *kind, const void *ptr, const char *fn, int rc,
                    const char *msg)
{
    if (kind && kind->free_with)
        return gm__set_error(GM_INVALID_ARGUMENT, "%s: %p is %s, not gm_alloc memory: nothing "
                             "was done%s%s%s", fn, ptr, kind->name,
                             *kind->free_with ? " (free it with " : "", kind->free_with,
                             *kind->free_with ? ")" : "");
    if (msg) gm__set_error(rc, "%s: %p %s", fn, ptr, msg);
    return rc;
}

/* The one lookup for a pointer outside the arenas (root's lock held). */
static const gm__kind_ops_t *map_kind(gm_pool_t *pool, const void *ptr, gm__kind_rec_t **rec)
{
    *rec = gm__kinds_find(pool, (uintptr_t)ptr);
    return *rec ? (*rec)->ops : NULL;
}

/* gm_free's work under the lock of the heap that holds ptr.  *defer: set to
 * a row whose free runs once the lock is dropped (GM__KIND_FREE_UNLOCKED:
 * a block held by sharing), the status then GM_OK and nothing done. */
static int free_entry_locked(gm_pool_t *pool, void *ptr, gm_stream_t stream,
                             const gm__kind_ops_t **defer)
{
    size_t size = 0;
    int rc;
    if (GM_LIKELY(gm__heap_holds(pool, (uintptr_t)ptr))) {
        /* The device row's free, written out: the fast path. */
        gm__stream_t *s = gm__stream_get_locked(pool, stream);
        bool held = false;
        rc = s ? gm__free_locked(pool, ptr, s, &size, &held)
               : gm__set_error(GM_NO_HOST_MEMORY, "gm_free: out of host memory for a stream");
        if (GM_UNLIKELY(held)) {
            *defer = &gm__kind_shared;
            return GM_OK;
        }
    } else {
        gm__kind_rec_t *rec;
        const gm__kind_ops_t *kind = map_kind(pool, ptr, &rec);
        if (kind && kind->free)
            rc = kind->free(pool, rec, ptr, stream, &size);
        else
            rc = not_ours(kind, ptr, "gm_free", GM_INVALID_POINTER, "was not allocated by this pool");
    }
    if (rc == GM_OK && pool->cfg.release_threshold != SIZE_MAX &&
        pool->st.reserved - pool->st.active > pool->cfg.release_threshold) {
        /* Giving memory back is best effort: the free itself succeeded. */
        if (gm__pages_trim_locked(pool, pool->cfg.release_threshold, NULL) != GM_OK)
            gm__clear_error();
    }
    /* After the trim, so the monitor slot is written once (a trim moved
     * `reserved`, which makes that one write a whole copy). */
    gm__observe_free_locked(pool, rc, ptr, size, stream);
    VALIDATE_LOCKED(pool);
    return rc;
}

int gm__free_held_locked(gm_pool_t *heap, void *ptr, gm_stream_t stream, bool *held)
{
    const gm__kind_ops_t *defer = NULL;
    int rc = free_entry_locked(heap, ptr, stream, &defer);
    *held = defer != NULL;
    return rc;
}

int gm_free(gm_pool_t *pool, void *ptr, gm_stream_t stream)
{
    if (!ptr) return GM_OK;
    GM_CHECK(resolve(&pool));
    pool = gm__heap_of(pool, ptr);
    int frc = gm__tcache_free(pool, ptr, stream);
    if (frc != GM_NOT_READY) return frc; /* taken, or a double free */
    gm__lock(&pool->lock);
    gm__tcache_release_large_locked(pool);
    const gm__kind_ops_t *defer = NULL;
    int rc = free_entry_locked(pool, ptr, stream, &defer);
    gm__unlock(&pool->lock);
    if (GM_UNLIKELY(defer != NULL)) {
        size_t size = 0;
        return defer->free(pool, NULL, ptr, stream, &size);
    }
    return rc;
}

int gm_record_stream(gm_pool_t *pool, void *ptr, gm_stream_t stream)
{
    if (!ptr) return gm__set_error(GM_INVALID_ARGUMENT, "gm_record_stream: ptr is NULL");
    GM_CHECK(resolve(&pool));
    pool = gm__heap_of(pool, ptr);
    gm__lock(&pool->lock);
    int rc;
    if (gm__heap_holds(pool, (uintptr_t)ptr)) {
        rc = gm__kind_device.record(pool, NULL, ptr, stream); /* the shared row's too */
    } else {
        gm__kind_rec_t *rec;
        const gm__kind_ops_t *kind = map_kind(pool, ptr, &rec);
        rc = kind && kind->record ? kind->record(pool, rec, ptr, stream) : GM_INVALID_POINTER;
        if (rc == GM_INVALID_POINTER)
            rc = not_ours(kind, ptr, "gm_record_stream", rc, "is not a live block of this pool");
        else if (rc == GM_OK)
            gm__clear_error();
    }
    gm__unlock(&pool->lock);
    return rc;
}

int gm_block_size(gm_pool_t *pool, const void *ptr, size_t *size)
{
    if (!ptr || !size) return gm__set_error(GM_INVALID_ARGUMENT, "gm_block_size: NULL argument");
    GM_CHECK(resolve(&pool));
    pool = gm__heap_of(pool, ptr);
    gm__lock(&pool->lock);
    gm__kind_rec_t *rec = NULL;
    const gm__kind_ops_t *kind = gm__heap_holds(pool, (uintptr_t)ptr)
                                     ? &gm__kind_device /* the shared row's too */
                                     : map_kind(pool, ptr, &rec);
    int rc = kind && kind->size ? kind->size(pool, rec, ptr, size) : GM_INVALID_POINTER;
    if (rc == GM_INVALID_POINTER)
        rc = not_ours(kind == &gm__kind_device ? NULL : kind, ptr, "gm_block_size", rc,
                      "is not a live block of this pool");
    gm__unlock(&pool->lock);
    return rc;
}

int gm_pool_set_limit(gm_pool_t *pool, size_t limit)
{
    GM_CHECK(resolve(&pool));
    size_t eff = limit && limit < pool->info.total_memory ? limit : pool->info.total_memory;
    gm_pool_t *h;
    pthread_mutex_lock(&pool->heaps_mu); /* a heap made meanwhile copies the new one */
    for (unsigned i = 0; (h = gm__heap_next(pool, &i));) {
        gm__lock(&h->lock);
        h->limit = eff;
        h->cfg.limit = limit;
        gm__unlock(&h->lock);
    }
    pthread_mutex_unlock(&pool->heaps_mu);
    return GM_OK;
}

int gm_trim(gm_pool_t *pool, size_t keep, size_t *released)
{
    GM_CHECK(resolve(&pool));
    /* With heaps, `keep` is shared out in heap order: each keeps what the
     * earlier ones left of it. */
    int rc = GM_OK;
    size_t total = 0;
    gm_pool_t *h;
    for (unsigned i = 0; (h = gm__heap_next(pool, &i));) {
        size_t got = 0;
        gm__lock(&h->lock);
        gm__tcache_flush_self_locked(h);
        gm__tcache_reclaim_large_locked(h); /* other threads' large cached blocks */
        int r = gm__pages_trim_locked(h, keep, &got);
        if (r != GM_OK && rc == GM_OK) rc = r;
        uint64_t cached = h->st.reserved - h->st.active;
        keep = cached < keep ? keep - (size_t)cached : 0;
        total += got;
        gm__observe_trimmed_locked(h);
        VALIDATE_LOCKED(h);
        gm__unlock(&h->lock);
    }
    /* Cached registrable segments (the root's) go back whole. */
    gm__lock(&pool->lock);
    total += gm__segs_trim_locked(pool);
    gm__unlock(&pool->lock);
    /* A broker's leased pages kept aside go back too. */
    if (pool->provider.ops->flush) pool->provider.ops->flush(pool->provider.ctx);
    if (released) *released = total;
    return rc;
}

/* ---- device work ------------------------------------------------------------- */

int gm_memcpy(gm_pool_t *pool, void *dst, const void *src, size_t n, gm_stream_t stream)
{
    int rc;
    if ((!dst || !src) && n) return gm__set_error(GM_INVALID_ARGUMENT, "gm_memcpy: NULL pointer");
    GM_CHECK(resolve(&pool));
    if (!n) return GM_OK;
    GM_BK(rc, pool, memcpy, (pool->bk, (uintptr_t)dst, (uintptr_t)src, n, stream));
    return rc;
}

int gm_memset(gm_pool_t *pool, void *dst, int value, size_t n, gm_stream_t stream)
{
    int rc;
    if (!dst && n) return gm__set_error(GM_INVALID_ARGUMENT, "gm_memset: NULL pointer");
    GM_CHECK(resolve(&pool));
    if (!n) return GM_OK;
    GM_BK(rc, pool, memset, (pool->bk, (uintptr_t)dst, value, n, stream));
    return rc;
}

int gm_stream_synchronize(gm_pool_t *pool, gm_stream_t stream)
{
    int rc;
    GM_CHECK(resolve(&pool));
    GM_BK(rc, pool, stream_sync, (pool->bk, stream));
    return rc;
}

int gm_stream_create(gm_pool_t *pool, gm_stream_t *stream)
{
    int rc;
    if (!stream) return gm__set_error(GM_INVALID_ARGUMENT, "gm_stream_create: stream is NULL");
    GM_CHECK(resolve(&pool));
    GM_BK(rc, pool, stream_create, (pool->bk, stream));
    return rc;
}

int gm_stream_destroy(gm_pool_t *pool, gm_stream_t stream)
{
    int rc;
    if (!stream) return gm__set_error(GM_INVALID_ARGUMENT, "gm_stream_destroy: the default stream "
                                      "cannot be destroyed");
    GM_CHECK(resolve(&pool));
    GM_CHECK(gm_stream_forget(pool, stream));
    GM_BK(rc, pool, stream_destroy, (pool->bk, stream));
    return rc;
}

int gm_stream_forget(gm_pool_t *pool, gm_stream_t stream)
{
    GM_CHECK(resolve(&pool));
    /* No event may be recorded on the stream after this: blocks freed on it
     * become everyone's first (after waiting for its work, if any). */
    int rc = GM_OK;
    gm_pool_t *h;
    for (unsigned i = 0; rc == GM_OK && (h = gm__heap_next(pool, &i));) {
        gm__lock(&h->lock);
        /* This thread's cached blocks go back first: one freed on the stream
         * must wait for it like any other. */
        gm__tcache_flush_self_locked(h);
        rc = gm__stream_retire_locked(h, stream);
        gm__unlock(&h->lock);
    }
    if (rc == GM_OK) rc = gm__host_stream_retire(pool, stream);
    if (rc != GM_OK)
        return gm__set_error(rc, "gm_stream_forget: waiting for the stream's work on memory "
                             "freed on it failed: %s", gm_last_error());
    return GM_OK;
}

/* ---- information and statistics ------------------------------------------------ */

int gm_pool_device_info(gm_pool_t *pool, gm_device_info_t *info)
{
    if (!info || info->size < offsetof(gm_device_info_t, backend))
        return gm__set_error(GM_INVALID_ARGUMENT,
                             "gm_pool_device_info: initialise info with GM_DEVICE_INFO_INIT");
    GM_CHECK(resolve(&pool));
    gm_device_info_t d = GM_DEVICE_INFO_INIT;
    gm__backend_info_t bi;
    gm__lock(&pool->lock);
    int rc = pool->ops->info(pool->bk, &bi);
    gm__unlock(&pool->lock);
    if (rc != GM_OK) return rc;
    d.backend = pool->backend_kind;
    snprintf(d.backend_name, sizeof d.backend_name, "%s", pool->ops->name);
    snprintf(d.backend_reason, sizeof d.backend_reason, "%s", pool->backend_reason);
    snprintf(d.device_name, sizeof d.device_name, "%s", bi.name);
    d.device = pool->cfg.device;
    d.driver_version = bi.driver_version;
    d.total_memory = bi.total_memory;
    d.free_memory = bi.free_memory;
    d.granularity = bi.granularity;
    d.vmm_supported = bi.vmm_supported;
    d.device_count = bi.device_count;
    d.peers = bi.peers;
    d.handle_types = bi.handle_types;
    d.rdma_capable = bi.rdma_capable;
    d.compression_supported = bi.compression_supported;
    d.compressible = (bi.phys_flags & GM__PHYS_COMPRESSIBLE) != 0;
    d.granularity_recommended = bi.granularity_recommended;
    size_t n = info->size < sizeof d ? info->size : sizeof d;
    memcpy(info, &d, n);
    info->size = n;
    return GM_OK;
}

int gm_pool_check(gm_pool_t *pool)
{
    GM_CHECK(resolve(&pool));
    /* Every heap at once (index order, the one place two heap locks are
     * held), so the limit's shared figure can be checked against them. */
    gm_pool_t *h;
    pthread_mutex_lock(&pool->heaps_mu); /* no heap is made meanwhile */
    for (unsigned i = 0; (h = gm__heap_next(pool, &i));) gm__lock(&h->lock);
    int rc = GM_OK;
    uint64_t sum = 0;
    for (unsigned i = 0; rc == GM_OK && (h = gm__heap_next(pool, &i));) {
        rc = gm__alloc_check_locked(h);
        if (rc == GM_OK && h->root != pool)
            rc = gm__set_error(GM_INTERNAL, "heap %u does not name its pool", i - 1);
        sum += h->st.reserved + h->st.registrable_reserved; /* segments count in the limit too */
    }
    uint64_t fam = atomic_load_explicit(&pool->fam_reserved, memory_order_relaxed);
    if (rc == GM_OK && fam != sum)
        rc = gm__set_error(GM_INTERNAL, "reserved memory of the pool's heaps is %llu bytes, "
                           "but the limit's figure says %llu", (unsigned long long)sum,
                           (unsigned long long)fam);
    uint64_t peaks = 0, fam_peaks = atomic_load_explicit(&pool->fam_peak_sum, memory_order_relaxed);
    for (unsigned i = 0; (h = gm__heap_next(pool, &i));) peaks += h->st.allocated_peak;
    if (rc == GM_OK && pool->heaps_max > 1 && fam_peaks != peaks)
        rc = gm__set_error(GM_INTERNAL, "allocated peaks of the pool's heaps sum to %llu bytes, "
                           "but the budget's figure says %llu", (unsigned long long)peaks,
                           (unsigned long long)fam_peaks);
    for (unsigned i = 0; (h = gm__heap_next(pool, &i));) gm__unlock(&h->lock);
    pthread_mutex_unlock(&pool->heaps_mu);
    if (rc == GM_OK) rc = gm__kinds_check(pool);
    if (rc == GM_OK) rc = gm__share_check(pool); /* its lock comes before a heap's */
    if (rc == GM_OK) rc = gm__offload_check(pool->root);
    return rc;
}

/* ---- sim controls ------------------------------------------------------------ */

int gm_sim_fail_nth(gm_pool_t *pool, int kind, unsigned long n)
{
    GM_CHECK(resolve(&pool));
    if (!pool->ops->fail_nth)
        return gm__set_error(GM_NOT_SUPPORTED, "gm_sim_fail_nth: the %s backend has no fault "
                             "injection", pool->ops->name);
    if (kind < 0 || kind >= GM_CALL_COUNT)
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_sim_fail_nth: unknown call kind %d", kind);
    return pool->ops->fail_nth(pool->bk, kind, n);
}

int gm_sim_hold_stream(gm_pool_t *pool, gm_stream_t stream, int hold)
{
    GM_CHECK(resolve(&pool));
    if (!pool->ops->hold_stream)
        return gm__set_error(GM_NOT_SUPPORTED, "gm_sim_hold_stream: the %s backend cannot hold "
                             "streams", pool->ops->name);
    return pool->ops->hold_stream(pool->bk, stream, hold);
}
