/* SPDX-License-Identifier: Apache-2.0 */
/*
 * process.c — what the library keeps for the whole process: the list of
 * every pool (for fork), the per-device pools and the default pool, the
 * exit handler, and the start of the environment-driven observers
 * (GPUMEM_TRACE, GPUMEM_LEAK_CHECK, the monitor segment) at the first pool.
 * The handle check that turns a NULL pool into the default one and the
 * registry of pools the observability features walk are one floor down, in
 * src/core/registry.c, so that the features use them without calling up.
 *
 * The one idea: a pool (pool.c) knows nothing of the other pools; whatever
 * spans pools or outlives them lives here or in the registry.
 *
 * Locking: small mutexes, each taken alone and briefly: pools_mu (the fork
 * list), device_mutex (creating a device pool; it calls gm_pool_create,
 * which takes the registry's lock), exit_mu, and the registry's lock
 * (registry.c).  Lock order: the registry's lock, then a pool's lock, then
 * the trace lock.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/options.h"
#include "broker/broker.h"
#include "core/pool.h"
#include "share/share.h"
#include "observe/observe.h"

/* ---- every pool of the process, fork --------------------------------------- */

/* Every pool created and not destroyed, in a list under pools_mu (taken
 * alone, briefly; never with a pool lock held).  The list lets the fork
 * handler mark the parent's pools dead in the child. */
static pthread_mutex_t pools_mu = PTHREAD_MUTEX_INITIALIZER;
static gm_pool_t *pools_head;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* The exit handler, installed with the first pool (exit_mu). */
static pthread_mutex_t exit_mu = PTHREAD_MUTEX_INITIALIZER;
static bool exit_handler_installed;
static pid_t owner_pid; /* the process that installed the exit handler */

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

static void library_pools_atfork_child(void);

/* fork(): the prepare handler holds pools_mu so that the child gets a whole
 * list; the child marks every pool on it dead (GM_POOL_FORKED) without
 * touching their locks, which other threads of the parent may have held, and
 * forgets the library's own pools, the registry and the monitor segment, so
 * that pools it creates are its own.  The dead pools stay on the list (the
 * child never frees them: their memory is the parent's picture). */
static void atfork_prepare(void)
{
    gm__share_atfork_prepare(); /* sharing's lock first: a server thread may hold it */
    pthread_mutex_lock(&pools_mu);
}
static void atfork_parent(void)
{
    pthread_mutex_unlock(&pools_mu);
    gm__share_atfork_parent();
}
static void atfork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    pools_mu = fresh;
    gm__share_atfork_child();
    for (gm_pool_t *p = pools_head; p; p = p->all_next) {
        p->magic = GM_POOL_FORKED;
        gm__broker_atfork_child(&p->provider);
    }
    library_pools_atfork_child();
    gm__registry_atfork_child();
    pthread_mutex_t fresh_exit = PTHREAD_MUTEX_INITIALIZER;
    exit_mu = fresh_exit;
    gm__monitor_atfork_child();
    gm__options_atfork_child();
    gm__tcache_atfork_child();
}

static void atfork_install(void) { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); }

void gm__process_init(void)
{
    pthread_once(&atfork_once, atfork_install);
}

/* A NULL pool given to an entry point of any floor is the default pool: the
 * handle check (core/registry.c) makes it through this maker, handed down
 * when the library is loaded. */
__attribute__((constructor)) static void default_maker_install(void)
{
    gm__registry_set_default(gm_default_pool);
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
static void library_pools_atfork_child(void)
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

/* ---- the registry, the exit handler, the observers' start ------------------ */

/* At exit: the leak report (which may end the process with
 * GM_LEAK_EXIT_STATUS, so the segment goes first), the trace's last rows.
 * A child forked without exec runs the same handler: it leaves the
 * parent's segment, trace and leaks alone. */
static void at_exit(void)
{
    if (getpid() != owner_pid) return;
    gm__monitor_unlink();
    gm_trace_stop();
    gm__leak_at_exit();
}

void gm__process_pool_created(gm_pool_t *pool)
{
    bool first = false;
    pools_link(pool);
    (void)gm__registry_add(pool); /* no room: an unlisted pool, observed less */
    pthread_mutex_lock(&exit_mu);
    if (!exit_handler_installed) {
        exit_handler_installed = true;
        owner_pid = getpid();
        first = true;
        atexit(at_exit);
    }
    pthread_mutex_unlock(&exit_mu);
    /* The environment-driven observers start with the first pool, so a
     * process that never makes one never opens a trace or a segment. */
    if (first) {
        gm__leak_init_env();
        const char *t = gm__option_str(GM_OPT_TRACE);
        if (t && gm_trace_start(t) != GM_OK)
            fprintf(stderr, "gpumem: GPUMEM_TRACE=%s: %s\n", t, gm_last_error());
    }
    gm__monitor_attach(pool);
    gm__lock(&pool->lock);
    gm__monitor_publish_locked(pool);
    gm__unlock(&pool->lock);
    gm__clear_error();
}

void gm__process_pool_destroying(gm_pool_t *pool)
{
    pools_unlink(pool);
    if (!pool->registered) return;
    if (gm__leak_reporting()) {
        uint64_t bytes = 0, count = 0;
        gm__leak_report_stderr(pool, &bytes, &count);
    }
    gm__trace_pool_flush(pool);
    gm__monitor_detach(pool);
    if (gm__registry_remove(pool)) gm__monitor_unlink();
}
