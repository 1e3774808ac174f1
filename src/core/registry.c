/* SPDX-License-Identifier: Apache-2.0 */
/*
 * registry.c — the pools of the process as the features below the entry
 * points see them: the handle check (gm__pool_resolve_slow) and the registry
 * of pools the observers walk (process statistics, leak reports, trace
 * flushes).  It sits with the engine so that a feature (host, offload,
 * share, observe) checks a handle and walks the pools without calling up
 * into the entry points' floor (src/FLOORS).
 *
 * The one thing it cannot do by itself is make the default pool (that is
 * gm_pool_create's work, in the floor above): process.c hands it the maker
 * when the library is loaded (gm__registry_set_default), and a NULL pool
 * given to any entry point goes through it.
 *
 * Locking: registry_mu, taken alone and briefly, except in
 * gm__registry_foreach, which holds it while fn takes a pool's lock.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "core/pool.h"

static int (*default_pool)(gm_pool_t **pool);

void gm__registry_set_default(int (*fn)(gm_pool_t **pool)) { default_pool = fn; }

int gm__pool_resolve_slow(gm_pool_t **pool, const char *fn)
{
    if (!*pool) {
        if (GM_LIKELY(default_pool != NULL)) return default_pool(pool);
        return gm__set_error(GM_INVALID_STATE, "%s: pool NULL and no default pool in this "
                             "program (gm_default_pool is not linked in)", fn);
    }
    if (!gm__handle_in_arena(*pool))
        return gm__set_error(GM_INVALID_ARGUMENT, "%s: %p is not a pool handle (no pool of this "
                             "process was ever made at that address)", fn, (void *)*pool);
    uint64_t m = (*pool)->magic;
    if (m == GM_POOL_MAGIC) return GM_OK;
    if (m == GM_POOL_FORKED)
        return gm__set_error(GM_INVALID_STATE, "%s: pool %p belongs to the parent process (this "
                             "process is a child of fork()); create a new pool here", fn,
                             (void *)*pool);
    return gm__set_error(GM_INVALID_ARGUMENT, "%s: %p is not a live pool (destroyed, or not a "
                         "pool)", fn, (void *)*pool);
}

/* ---- the registry ------------------------------------------------------------ */

/* A small array under registry_mu.  A pool the array had no room for is
 * still a pool, observed less. */
static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static gm_pool_t **registry;
static size_t n_registry, cap_registry;

bool gm__registry_add(gm_pool_t *pool)
{
    pthread_mutex_lock(&registry_mu);
    if (n_registry == cap_registry) {
        size_t cap = cap_registry ? cap_registry * 2 : 8;
        gm_pool_t **r = gm__realloc(registry, cap * sizeof *r);
        if (r) {
            registry = r;
            cap_registry = cap;
        }
    }
    if (n_registry < cap_registry) { /* else: an unlisted pool, observed less */
        registry[n_registry++] = pool;
        pool->registered = true;
    }
    pthread_mutex_unlock(&registry_mu);
    return pool->registered;
}

bool gm__registry_remove(gm_pool_t *pool)
{
    bool last;
    pthread_mutex_lock(&registry_mu);
    for (size_t i = 0; i < n_registry; i++) {
        if (registry[i] == pool) {
            registry[i] = registry[--n_registry];
            break;
        }
    }
    pool->registered = false;
    last = n_registry == 0;
    pthread_mutex_unlock(&registry_mu);
    return last;
}

/* In a child of fork(): an empty registry with a fresh lock; the parent's
 * pools are not the child's to report. */
void gm__registry_atfork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    registry_mu = fresh;
    n_registry = 0;
}

void gm__registry_foreach(void (*fn)(gm_pool_t *pool, void *arg), void *arg)
{
    pthread_mutex_lock(&registry_mu);
    for (size_t i = 0; i < n_registry; i++) fn(registry[i], arg);
    pthread_mutex_unlock(&registry_mu);
}
