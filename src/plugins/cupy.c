/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cupy.c — gpumem as CuPy's allocator with no Python in the path: the malloc
 * and free that cupy.cuda.memory.CFunctionAllocator calls from its Cython
 * code (gm_cupy_malloc, gm_cupy_free), so an allocation costs a C call, not a
 * Python function (docs/python.md, "CuPy").
 *
 * The idea: CuPy's C allocator interface passes no stream, but gpumem's
 * stream rule needs one.  gpumem.cupy hands us CuPy's own C function for the
 * current stream (get_current_stream_ptr, from the module's Cython C-API
 * table) in the hooks, and we remember each block's stream until its free,
 * as CuPy's own pool frees a block to the stream it was made on.  Errors are
 * raised as Python exceptions through the C API calls in the hooks: CuPy's
 * Cython caller checks for one when the pointer comes back as -1.
 *
 * Locking: `mu` guards the table of live blocks; it is never held across a
 * gpumem call.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "base/hash.h"
#include "core/pool.h"
#include "plugins/plugins.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
/* live block address -> its stream + 1 (so the legacy stream 0 is not NULL) */
static gm__hash_t streams;
static _Atomic unsigned long free_errors;

#define RAISED ((void *)(intptr_t)-1)

/* This thread has had the device made current (gm_cupy_malloc). */
static _Thread_local bool thread_adopted;

static int hooks_usable(const gm_cupy_hooks_t *h)
{
    return h && h->size >= sizeof(gm_cupy_hooks_t) && h->version == GM_CUPY_HOOKS_VERSION &&
           h->current_stream;
}

/* Sets the Python exception for a failed allocation; returns RAISED. */
static void *raise_error(const gm_cupy_hooks_t *h, int rc, size_t size, int device, gm_pool_t *pool)
{
    if (!h->build_value || !h->set_object) return RAISED;
    void *value;
    void *type;
    if ((rc == GM_OUT_OF_MEMORY || rc == GM_LIMIT) && h->oom_type) {
        gm_stats_t st = GM_STATS_INIT;
        if (!pool || gm_pool_stats(pool, &st) != GM_OK) st.reserved = 0;
        value = h->build_value("(nn)", (ssize_t)size, (ssize_t)st.reserved);
        type = h->oom_type;
    } else {
        char msg[512];
        snprintf(msg, sizeof msg, "gpumem: allocating %zu bytes for CuPy on device %d: %s: %s", size,
                 device, gm_errname(rc), gm_last_error());
        value = h->build_value("(s)", msg);
        type = h->error_type;
    }
    if (value && type) h->set_object(type, value);
    if (value && h->decref) h->decref(value);
    return RAISED;
}

void *gm_cupy_malloc(void *hooks, size_t size, int device)
{
    const gm_cupy_hooks_t *h = hooks;
    if (size == 0) return NULL;
    if (GM_UNLIKELY(!hooks_usable(h))) {
        gm__set_error(GM_INVALID_ARGUMENT, "gm_cupy_malloc: hooks missing, of another version, or "
                      "without current_stream");
        return h && h->size >= sizeof(gm_cupy_hooks_t) ? raise_error(h, GM_INVALID_ARGUMENT, size,
                                                                     device, NULL)
                                                       : RAISED;
    }
    gm_stream_t stream = (gm_stream_t)h->current_stream();
    gm_pool_t *pool = NULL;
    void *ptr = NULL;
    int rc = gm_device_pool(device, &pool);
    if (GM_UNLIKELY(!thread_adopted) && rc == GM_OK) {
        /* CuPy's own pool leaves the device current on the thread (its
         * cudaMalloc does); on a thread where nothing is, each runtime call
         * CuPy makes per allocation (cudaGetDevice, the current stream)
         * cost about a microsecond more (H100, 2026-11-26). */
        thread_adopted = true;
        if (pool->ops->adopt_thread && pool->ops->adopt_thread(pool->bk) != GM_OK) gm__clear_error();
    }
    if (GM_LIKELY(rc == GM_OK)) rc = gm_alloc(pool, size, stream, &ptr);
    if (GM_UNLIKELY(rc != GM_OK)) return raise_error(h, rc, size, device, pool);
    pthread_mutex_lock(&mu);
    rc = gm__hash_put(&streams, (uintptr_t)ptr, (void *)((uintptr_t)stream + 1));
    pthread_mutex_unlock(&mu);
    if (GM_UNLIKELY(rc != GM_OK)) {
        (void)gm_free(pool, ptr, stream);
        return raise_error(h, GM_NO_HOST_MEMORY, size, device, pool);
    }
    return ptr;
}

void gm_cupy_free(void *hooks, void *ptr, int device)
{
    (void)hooks;
    if (!ptr) return;
    pthread_mutex_lock(&mu);
    void *v = streams.cap ? gm__hash_take(&streams, (uintptr_t)ptr) : NULL;
    pthread_mutex_unlock(&mu);
    gm_pool_t *pool = NULL;
    int rc = v ? gm_device_pool(device, &pool) : GM_INVALID_POINTER;
    if (rc == GM_OK) rc = gm_free(pool, ptr, (gm_stream_t)((uintptr_t)v - 1));
    if (GM_UNLIKELY(rc != GM_OK)) /* called from CuPy's destructors */
        gm__plugin_free_failed(&free_errors, "gm_cupy_free", ptr, device,
                               v ? gm_last_error() : "not a block gm_cupy_malloc handed out");
}
