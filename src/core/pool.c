/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pool.c — pools: configuration, the environment table, creation and
 * teardown, the public allocation entry points, limits, trim, statistics.
 *
 * A pool owns one backend context, two arenas of reserved address space
 * (small requests packed apart from large ones), the free indexes and the
 * live-block table.  One mutex guards all of it; every public function here
 * takes it (none is called with it held) and nothing below it blocks on
 * anything but backend calls, which only growth, trim and stream draining
 * make.
 *
 * Observability hooks are one call each into the files of src/observe/observe.h:
 * pool creation and destruction register the pool, the allocation and free
 * paths record into the trace, the leak table and the monitor slot, and a
 * failed allocation goes through one slow path (alloc_slow_locked) that ends
 * in the out-of-memory report of src/observe/oom.c.
 *
 * Handles are checked before anything is touched (gm__pool_resolve: one
 * compare of pool->magic); a pool's struct is a mapping of its own, never
 * unmapped, so a destroyed handle stays readable and never names a later
 * pool.  After fork() the child marks the parent's pools dead (atfork_child).
 * Which entry point owns a pointer is decided in one place,
 * gm__owner_locked.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "host/host.h"
#include "observe/observe.h"
#include "core/options.h"
#include "core/pool.h"

/* ---- creation and teardown ------------------------------------------------- */

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
    if (d.backend != GM_BACKEND_AUTO && d.backend != GM_BACKEND_SIM && d.backend != GM_BACKEND_CUDA)
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_pool_create: unknown backend %d",
                             (int)d.backend);
    if (d.device < 0)
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_pool_create: device %d", d.device);
    if (d.flags & ~GM_POOL_SYSMEM_FALLBACK)
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_pool_create: unknown flags %#x", d.flags);
    if (d.sim_capacity == 0) d.sim_capacity = gm__option_sim_capacity();
    *out = d;
    return GM_OK;
}

/* ---- the pools of the process, handles, fork ------------------------------- */

/* Every pool created and not destroyed, in a list under pools_mu (taken
 * alone, briefly; never with a pool lock held).  The list lets the fork
 * handler mark the parent's pools dead in the child. */
static pthread_mutex_t pools_mu = PTHREAD_MUTEX_INITIALIZER;
static gm_pool_t *pools_head;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void pools_link(gm_pool_t *pool)
{
    pthread_mutex_lock(&pools_mu);
    pool->all_prev = NULL;
    pool->all_next = pools_head;
    if (pools_head) pools_head->all_prev = pool;
    pools_head = pool;
    pthread_mutex_unlock(&pools_mu);
}

static void pools_unlink(gm_pool_t *pool)
{
    pthread_mutex_lock(&pools_mu);
    if (pool->all_prev) pool->all_prev->all_next = pool->all_next;
    else if (pools_head == pool) pools_head = pool->all_next;
    if (pool->all_next) pool->all_next->all_prev = pool->all_prev;
    pool->all_prev = pool->all_next = NULL;
    pthread_mutex_unlock(&pools_mu);
}

static void reset_library_pools_in_child(void);

/* fork(): the prepare handler holds pools_mu so that the child gets a whole
 * list; the child marks every pool on it dead (GM_POOL_FORKED) without
 * touching their locks, which other threads of the parent may have held, and
 * forgets the library's own pools, the registry and the monitor segment, so
 * that pools it creates are its own.  The dead pools stay on the list (the
 * child never frees them: their memory is the parent's picture). */
static void atfork_prepare(void) { pthread_mutex_lock(&pools_mu); }
static void atfork_parent(void) { pthread_mutex_unlock(&pools_mu); }
static void atfork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    pools_mu = fresh;
    for (gm_pool_t *p = pools_head; p; p = p->all_next) p->magic = GM_POOL_FORKED;
    reset_library_pools_in_child();
    gm__registry_atfork_child();
    gm__monitor_atfork_child();
    gm__options_atfork_child();
}

static void atfork_install(void) { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); }

int gm__pool_resolve_slow(gm_pool_t **pool, const char *fn)
{
    if (!*pool) return gm_default_pool(pool);
    uint64_t m = (*pool)->magic;
    if (m == GM_POOL_MAGIC) return GM_OK;
    if (m == GM_POOL_FORKED)
        return gm__set_error(GM_INVALID_STATE, "%s: pool %p belongs to the parent process (this "
                             "process is a child of fork()); create a new pool here", fn,
                             (void *)*pool);
    return gm__set_error(GM_INVALID_ARGUMENT, "%s: %p is not a live pool (destroyed, or not a "
                         "pool)", fn, (void *)*pool);
}

/* LeakSanitizer scans globals, stacks and heap blocks, not anonymous
 * mappings: a pool's mapping is declared a root so that what it points to
 * (and what the process keeps at exit: the library's own pools) is not
 * reported as leaked.  Weak: NULL outside sanitizer builds. */
extern void __lsan_register_root_region(const void *p, size_t size) __attribute__((weak));
extern void __lsan_unregister_root_region(const void *p, size_t size) __attribute__((weak));

static size_t pool_map_size(void)
{
    long pg = sysconf(_SC_PAGESIZE);
    size_t page = pg > 0 ? (size_t)pg : 4096;
    return GM_ALIGN_UP(sizeof(struct gm_pool), page);
}

/* Everything but the handle's own memory, which is never unmapped (so a
 * stale handle stays readable and can never name a later pool): its pages
 * are given back and read as zeros, magic 0. */
static void pool_teardown(gm_pool_t *pool)
{
    gm__observe_pool_destroying(pool);
    gm__copy_fini(pool);
    gm__sysmem_fini(pool);
    gm__host_fini(pool);
    gm__lock(&pool->lock);
    gm__leak_fini(pool);
    gm__trace_pool_fini(pool);
    gm__pages_fini(pool);
    for (int c = 0; c < GM_CLASS_COUNT; c++) gm__arena_fini(pool, &pool->arena[c]);
    gm__alloc_fini(pool);
    if (pool->bk) pool->ops->close(pool->bk);
    gm__unlock(&pool->lock);
    pool->magic = 0;
    if (__lsan_unregister_root_region) __lsan_unregister_root_region(pool, pool_map_size());
    madvise(pool, pool_map_size(), MADV_DONTNEED);
}

void gm_pool_destroy(gm_pool_t *pool)
{
    if (!pool || pool->magic != GM_POOL_MAGIC) return; /* see gm_pool_create's notes */
    gm__lock(&pool->lock);
    uint64_t n = pool->live.count, bytes = pool->st.allocated;
    size_t sn = 0, sbytes = 0;
    if (pool->sysmem) gm__sysmem_count_locked(pool, &sn, &sbytes);
    gm__unlock(&pool->lock);
    pools_unlink(pool);
    pool_teardown(pool);
    if (n + sn)
        gm__set_error(GM_OK, "gm_pool_destroy: %llu live allocations (%llu bytes) released with "
                      "the pool (%zu of them from the sysmem fallback)",
                      (unsigned long long)(n + sn), (unsigned long long)(bytes + sbytes), sn);
}

int gm_pool_create(const gm_pool_config_t *cfg, gm_pool_t **out)
{
    int rc;
    if (!out) return gm__set_error(GM_INVALID_ARGUMENT, "gm_pool_create: pool is NULL");
    *out = NULL;
    pthread_once(&atfork_once, atfork_install);
    /* A mapping of its own, never unmapped: see pool_teardown. */
    void *mem = mmap(NULL, pool_map_size(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
    if (mem == MAP_FAILED) return gm__set_error(GM_NO_HOST_MEMORY, "gm_pool_create: out of host memory");
    gm_pool_t *pool = mem;
    if (__lsan_register_root_region) __lsan_register_root_region(pool, pool_map_size());
    pool->st.size = sizeof pool->st;
    pool->st.version = GM_STATS_VERSION;
    pool->global.is_global = true;
    pool->lru_head = pool->lru_tail = GM_NONE;

    if (cfg) GM_CHECK_GOTO(config_copy(cfg, &pool->cfg), rc, fail);
    else GM_CHECK_GOTO(gm_config_from_env(&pool->cfg), rc, fail);
    if (cfg == NULL) GM_CHECK_GOTO(config_copy(&pool->cfg, &pool->cfg), rc, fail);

    GM_CHECK_GOTO(gm__backend_select(pool->cfg.backend, pool->cfg.device, &pool->ops,
                                     &pool->backend_kind, pool->backend_reason,
                                     sizeof pool->backend_reason), rc, fail);
    gm__backend_config_t bc = {.device = pool->cfg.device, .sim_capacity = pool->cfg.sim_capacity};
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
    pool->limit = pool->info.total_memory;
    if (pool->cfg.limit && pool->cfg.limit < pool->limit) pool->limit = pool->cfg.limit;

    GM_CHECK_GOTO(gm__hash_init(&pool->live, 1024), rc, fail);
    GM_CHECK_GOTO(gm__hash_init(&pool->streams.of, 16), rc, fail);
    GM_CHECK_GOTO(gm__host_init(pool), rc, fail);
    if (!gm__stream_get_locked(pool, NULL)) {
        rc = gm__set_error(GM_NO_HOST_MEMORY, "gm_pool_create: out of host memory");
        goto fail;
    }
    /* Address space is cheap: room for the whole device several times over,
     * so holes never force a failure while physical pages are free. */
    size_t total = GM_ALIGN_UP(pool->info.total_memory, pool->page);
    GM_CHECK_GOTO(gm__arena_init(pool, &pool->arena[GM_CLASS_SMALL], GM_CLASS_SMALL, total * 2, 0),
                  rc, fail);
    GM_CHECK_GOTO(gm__arena_init(pool, &pool->arena[GM_CLASS_LARGE], GM_CLASS_LARGE, total * 4,
                                 (uint32_t)pool->arena[GM_CLASS_SMALL].npages),
                  rc, fail);
    for (int c = 0; c < GM_CLASS_COUNT; c++)
        GM_CHECK_GOTO(gm__alloc_arena_ready_locked(pool, &pool->arena[c]), rc, fail);
    if (pool->cfg.initial_reserve) {
        rc = gm__pages_prefault_locked(pool, pool->cfg.initial_reserve);
        if (rc != GM_OK) {
            gm__set_error(rc, "gm_pool_create: initial reserve of %zu bytes failed: %s",
                          pool->cfg.initial_reserve, gm_last_error());
            goto fail;
        }
    }
    pool->magic = GM_POOL_MAGIC;
    pools_link(pool);
    gm__observe_pool_created(pool);
    gm__clear_error();
    *out = pool;
    return GM_OK;
fail:
    pool_teardown(pool);
    munmap(pool, pool_map_size()); /* never handed out: no stale handle can exist */
    return rc;
}

/* ---- per-device pools ------------------------------------------------------ */

/* One pool per device ordinal, created on first use from the environment
 * with `device` set, and kept for the life of the process: plug-ins (PyTorch,
 * CuPy, the preload library) and the default pool all share it.  Readers
 * take the fast path (one acquire load); creation runs under device_mutex, so
 * two threads asking for a new device at once create one pool.  A failed
 * creation is not remembered: the next call tries again. */
#define GM_MAX_DEVICE_POOLS 64
static gm_pool_t *_Atomic device_pools[GM_MAX_DEVICE_POOLS];
static pthread_mutex_t device_mutex = PTHREAD_MUTEX_INITIALIZER;

int gm_device_pool(int device, gm_pool_t **pool)
{
    if (!pool) return gm__set_error(GM_INVALID_ARGUMENT, "gm_device_pool: pool is NULL");
    *pool = NULL;
    if (device < 0 || device >= GM_MAX_DEVICE_POOLS)
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_device_pool: device %d is not in [0, %d)",
                             device, GM_MAX_DEVICE_POOLS);
    gm_pool_t *p = atomic_load_explicit(&device_pools[device], memory_order_acquire);
    if (GM_LIKELY(p != NULL)) {
        *pool = p;
        return GM_OK;
    }
    int rc = GM_OK;
    pthread_mutex_lock(&device_mutex);
    p = atomic_load_explicit(&device_pools[device], memory_order_relaxed);
    if (!p) {
        gm_pool_config_t cfg;
        rc = gm_config_from_env(&cfg);
        if (rc == GM_OK) {
            cfg.device = device;
            rc = gm_pool_create(&cfg, &p);
        }
        if (rc == GM_OK) atomic_store_explicit(&device_pools[device], p, memory_order_release);
    }
    pthread_mutex_unlock(&device_mutex);
    if (rc != GM_OK) return rc;
    *pool = p;
    return GM_OK;
}

gm_pool_t *gm__device_pool_peek(int device)
{
    if (device < 0 || device >= GM_MAX_DEVICE_POOLS) return NULL;
    return atomic_load_explicit(&device_pools[device], memory_order_acquire);
}

int gm__device_pool_count(void)
{
    return GM_MAX_DEVICE_POOLS;
}

/* The default pool is the pool of GPUMEM_DEVICE (0 when unset).  Its
 * outcome, success or failure, is decided once. */
static pthread_once_t default_once = PTHREAD_ONCE_INIT;
static gm_pool_t *default_pool;
static int default_rc;
static char default_msg[256];

static void default_create(void)
{
    gm_pool_config_t cfg;
    default_rc = gm_config_from_env(&cfg);
    if (default_rc == GM_OK) default_rc = gm_device_pool(cfg.device, &default_pool);
    if (default_rc != GM_OK) snprintf(default_msg, sizeof default_msg, "%s", gm_last_error());
}

int gm_default_pool(gm_pool_t **pool)
{
    if (!pool) return gm__set_error(GM_INVALID_ARGUMENT, "gm_default_pool: pool is NULL");
    pthread_once(&default_once, default_create);
    *pool = default_pool;
    if (default_rc != GM_OK)
        return gm__set_error(default_rc, "the default pool could not be created: %s", default_msg);
    return GM_OK;
}

/* In a child of fork(): the library's pools are the parent's; the child
 * gets its own on first use. */
static void reset_library_pools_in_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    device_mutex = fresh;
    for (int i = 0; i < GM_MAX_DEVICE_POOLS; i++)
        atomic_store_explicit(&device_pools[i], NULL, memory_order_relaxed);
    pthread_once_t once = PTHREAD_ONCE_INIT;
    default_once = once;
    default_pool = NULL;
    default_rc = GM_OK;
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

/* Everything after a failed first attempt, lock held (released around the
 * handlers).  The steps, each followed by a retry:
 *   1. drain the streams and trim the cache (free pages go back to the
 *      device, so a large range can get fresh ones);
 *   2. the user's out-of-memory handlers, called without the lock;
 *   3. a last resort (see below);
 * then the report.  `retries` counts allocations served by a retry,
 * `alloc_failures` the entries here, `oom_count` (in oom.c) the failures. */
static int alloc_slow_locked(gm_pool_t *pool, size_t size, gm_stream_t stream, void **ptr, int rc)
{
    pool->st.alloc_failures++;
    gm__monitor_invalidate_locked(pool);
    char reason[256];
    snprintf(reason, sizeof reason, "%s", gm_last_error());

    gm__drain_streams_locked(pool);
    if (gm__pages_trim_locked(pool, 0, NULL) != GM_OK) gm__clear_error();
    gm__stream_t *s = gm__stream_get_locked(pool, stream);
    if (!s) return gm__set_error(GM_NO_HOST_MEMORY, "gm_alloc: out of host memory for a stream");
    rc = gm__alloc_locked(pool, size, s, ptr);
    if (rc == GM_OK) goto served;
    if (rc != GM_OUT_OF_MEMORY && rc != GM_LIMIT) return rc;
    snprintf(reason, sizeof reason, "%s", gm_last_error());

    bool nested = oom_handlers_running(pool);
    for (int round = 0; round < GM_OOM_MAX_ROUNDS && pool->n_oom_handlers && !nested; round++) {
        struct gm__oom_handler h[GM_OOM_MAX_HANDLERS];
        unsigned n = pool->n_oom_handlers;
        memcpy(h, pool->oom_handlers, n * sizeof h[0]);
        int again = 0;
        unsigned calls = 0;
        gm__unlock(&pool->lock);
        oom_running[oom_depth++] = pool;
        for (unsigned i = 0; i < n && !again; i++, calls++)
            again = h[i].fn(pool, size, stream, h[i].user);
        oom_depth--;
        gm__lock(&pool->lock);
        pool->st.oom_handler_calls += calls;
        if (!again) break;
        s = gm__stream_get_locked(pool, stream);
        if (!s) return gm__set_error(GM_NO_HOST_MEMORY, "gm_alloc: out of host memory for a stream");
        rc = gm__alloc_locked(pool, size, s, ptr);
        if (rc == GM_OK) goto served;
        if (rc != GM_OUT_OF_MEMORY && rc != GM_LIMIT) return rc;
        snprintf(reason, sizeof reason, "%s", gm_last_error());
    }

    /* The last resort: pinned host memory the device can address (opt-in,
     * counted apart in stats, announced on stderr; src/host/sysmem.c). */
    if (pool->cfg.flags & GM_POOL_SYSMEM_FALLBACK) {
        s = gm__stream_get_locked(pool, stream);
        if (s && gm__sysmem_alloc_locked(pool, size, s, ptr, rc) == GM_OK) return GM_OK;
        snprintf(reason, sizeof reason, "%s", gm_last_error());
    }

    return gm__oom_report_locked(pool, size, stream, rc, reason);
served:
    pool->st.retries++;
    gm__clear_error();
    return GM_OK;
}

int gm_alloc(gm_pool_t *pool, size_t size, gm_stream_t stream, void **ptr)
{
    if (GM_UNLIKELY(!ptr)) return gm__set_error(GM_INVALID_ARGUMENT, "gm_alloc: ptr is NULL");
    *ptr = NULL;
    GM_CHECK(resolve(&pool));
    if (GM_UNLIKELY(size == 0)) return GM_OK;
    void *frames[GM_LEAK_MAX_FRAMES];
    int n_frames = 0;
    if (GM_UNLIKELY(atomic_load_explicit(&gm__leak_on, memory_order_relaxed)))
        n_frames = gm__leak_capture(frames); /* before the lock: unwinding is slow */
    gm__lock(&pool->lock);
    int rc;
    if (GM_UNLIKELY(size > pool->limit || size > GM_MAX_REQUEST)) {
        char a[32], why[160];
        bool over_device = size > pool->info.total_memory || size > GM_MAX_REQUEST;
        size_t cap = over_device ? pool->info.total_memory : pool->limit;
        snprintf(why, sizeof why, "%zu bytes is more than the %s (%s)", size,
                 over_device ? "device's memory" : "pool limit", gm__fmt_bytes(cap, a, sizeof a));
        rc = gm__oom_report_locked(pool, size, stream, over_device ? GM_OUT_OF_MEMORY : GM_LIMIT,
                                   why);
        gm__unlock(&pool->lock);
        return rc;
    }
    gm__stream_t *s = gm__stream_get_locked(pool, stream);
    rc = s ? gm__alloc_locked(pool, size, s, ptr)
           : gm__set_error(GM_NO_HOST_MEMORY, "gm_alloc: out of host memory for a stream");
    if (GM_UNLIKELY(rc == GM_OUT_OF_MEMORY || rc == GM_LIMIT))
        rc = alloc_slow_locked(pool, size, stream, ptr, rc);
    if (GM_LIKELY(rc == GM_OK)) {
        pool->st.allocated_total += size;
        gm__trace_record_locked(pool, GM__TRACE_ALLOC, (uintptr_t)*ptr, size, stream);
        if (GM_UNLIKELY(n_frames)) {
            gm__leak_add_locked(pool, (uintptr_t)*ptr, frames, n_frames);
            if (atomic_load_explicit(&gm__trace_on, memory_order_relaxed))
                gm__trace_site_locked(pool, frames, n_frames);
        }
    }
    gm__monitor_publish_locked(pool);
    VALIDATE_LOCKED(pool);
    gm__unlock(&pool->lock);
    return rc;
}

/* ---- who owns a pointer ----------------------------------------------------- */

gm__owner_t gm__owner_locked(gm_pool_t *pool, const void *ptr, size_t *size)
{
    gm__block_t *b = gm__hash_get(&pool->live, (uintptr_t)ptr);
    if (b) {
        if (size) *size = b->requested;
        return GM__OWNER_DEVICE;
    }
    size_t sz;
    if (pool->sysmem && gm__sysmem_size_locked(pool, ptr, size ? size : &sz) == GM_OK)
        return GM__OWNER_SYSMEM;
    switch (gm__host_kind(pool, ptr)) {
    case GM__HOST_USER: return GM__OWNER_HOST;
    case GM__HOST_SYSMEM: /* the host side of a sysmem block, not what gm_alloc gave */
    case GM__HOST_STAGING: return GM__OWNER_INTERNAL;
    default: return GM__OWNER_UNKNOWN;
    }
}

const char *gm__owner_name(gm__owner_t o)
{
    switch (o) {
    case GM__OWNER_DEVICE: return "a device block of gm_alloc";
    case GM__OWNER_SYSMEM: return "a gm_alloc block served by the sysmem fallback";
    case GM__OWNER_HOST: return "pinned host memory of gm_host_alloc";
    case GM__OWNER_INTERNAL: return "pinned memory the library uses itself";
    default: return "not a live block of this pool";
    }
}

/* ptr is not a live device block: a sysmem block (its size in *size) is
 * handled by the caller, who gets rc back; memory of another kind is the
 * wrong entry point. */
static int wrong_entry_locked(gm_pool_t *pool, const void *ptr, const char *fn, int rc,
                              gm__owner_t *owner, size_t *size)
{
    *owner = gm__owner_locked(pool, ptr, size);
    if (*owner == GM__OWNER_HOST || *owner == GM__OWNER_INTERNAL)
        return gm__set_error(GM_INVALID_ARGUMENT, "%s: %p is %s, not gm_alloc memory: nothing "
                             "was done%s", fn, ptr, gm__owner_name(*owner),
                             *owner == GM__OWNER_HOST ? " (free it with gm_host_free)" : "");
    return rc;
}

int gm_free(gm_pool_t *pool, void *ptr, gm_stream_t stream)
{
    if (!ptr) return GM_OK;
    GM_CHECK(resolve(&pool));
    gm__lock(&pool->lock);
    gm__stream_t *s = gm__stream_get_locked(pool, stream);
    size_t size = 0;
    int rc = s ? gm__free_locked(pool, ptr, s, &size)
               : gm__set_error(GM_NO_HOST_MEMORY, "gm_free: out of host memory for a stream");
    if (GM_UNLIKELY(rc == GM_INVALID_POINTER || rc == GM_DOUBLE_FREE)) {
        gm__owner_t owner;
        rc = wrong_entry_locked(pool, ptr, "gm_free", rc, &owner, &size);
        if (owner == GM__OWNER_SYSMEM) rc = gm__sysmem_free_locked(pool, ptr, s, rc);
    }
    if (GM_LIKELY(rc == GM_OK)) {
        pool->st.freed_total += size;
        gm__trace_record_locked(pool, GM__TRACE_FREE, (uintptr_t)ptr, size, stream);
        if (GM_UNLIKELY(pool->leaks != NULL)) gm__leak_del_locked(pool, (uintptr_t)ptr);
    }
    if (rc == GM_OK && pool->cfg.release_threshold != SIZE_MAX &&
        pool->st.reserved - pool->st.active > pool->cfg.release_threshold) {
        /* Giving memory back is best effort: the free itself succeeded. */
        if (gm__pages_trim_locked(pool, pool->cfg.release_threshold, NULL) != GM_OK)
            gm__clear_error();
    }
    gm__monitor_publish_locked(pool);
    VALIDATE_LOCKED(pool);
    gm__unlock(&pool->lock);
    return rc;
}

int gm_record_stream(gm_pool_t *pool, void *ptr, gm_stream_t stream)
{
    if (!ptr) return gm__set_error(GM_INVALID_ARGUMENT, "gm_record_stream: ptr is NULL");
    GM_CHECK(resolve(&pool));
    gm__lock(&pool->lock);
    gm__stream_t *s = gm__stream_get_locked(pool, stream);
    int rc = s ? gm__record_stream_locked(pool, ptr, s)
               : gm__set_error(GM_NO_HOST_MEMORY, "gm_record_stream: out of host memory");
    if (rc == GM_INVALID_POINTER || rc == GM_DOUBLE_FREE) {
        gm__owner_t owner;
        rc = wrong_entry_locked(pool, ptr, "gm_record_stream", rc, &owner, NULL);
        if (owner == GM__OWNER_SYSMEM) rc = gm__sysmem_record_locked(pool, ptr, s, rc);
    }
    gm__unlock(&pool->lock);
    return rc;
}

int gm_block_size(gm_pool_t *pool, const void *ptr, size_t *size)
{
    if (!ptr || !size) return gm__set_error(GM_INVALID_ARGUMENT, "gm_block_size: NULL argument");
    GM_CHECK(resolve(&pool));
    int rc = GM_OK;
    gm__lock(&pool->lock);
    gm__block_t *b = gm__hash_get(&pool->live, (uintptr_t)ptr);
    if (b) {
        *size = b->requested;
    } else {
        gm__owner_t owner;
        rc = wrong_entry_locked(pool, ptr, "gm_block_size", GM_INVALID_POINTER, &owner, size);
        if (owner == GM__OWNER_SYSMEM) rc = GM_OK;
        else if (rc == GM_INVALID_POINTER)
            gm__set_error(rc, "gm_block_size: %p is not a live block of this pool", ptr);
    }
    gm__unlock(&pool->lock);
    return rc;
}

int gm_pool_set_limit(gm_pool_t *pool, size_t limit)
{
    GM_CHECK(resolve(&pool));
    gm__lock(&pool->lock);
    pool->limit = limit && limit < pool->info.total_memory ? limit : pool->info.total_memory;
    pool->cfg.limit = limit;
    gm__unlock(&pool->lock);
    return GM_OK;
}

int gm_trim(gm_pool_t *pool, size_t keep, size_t *released)
{
    GM_CHECK(resolve(&pool));
    gm__lock(&pool->lock);
    int rc = gm__pages_trim_locked(pool, keep, released);
    gm__monitor_invalidate_locked(pool);
    gm__monitor_publish_locked(pool);
    VALIDATE_LOCKED(pool);
    gm__unlock(&pool->lock);
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
    gm__lock(&pool->lock);
    int rc = gm__stream_retire_locked(pool, stream);
    gm__unlock(&pool->lock);
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
    size_t n = info->size < sizeof d ? info->size : sizeof d;
    memcpy(info, &d, n);
    info->size = n;
    return GM_OK;
}

int gm_pool_check(gm_pool_t *pool)
{
    GM_CHECK(resolve(&pool));
    gm__lock(&pool->lock);
    int rc = gm__alloc_check_locked(pool);
    gm__unlock(&pool->lock);
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
