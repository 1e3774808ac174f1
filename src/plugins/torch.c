/* SPDX-License-Identifier: Apache-2.0 */
/*
 * torch.c — the PyTorch pluggable-allocator entry points: the functions that
 * torch.cuda.memory.CUDAPluggableAllocator loads from libgpumem.so
 * (gm_torch_alloc, gm_torch_free) and the hooks PyTorch lets a plugged
 * allocator set from Python (empty_cache, record_stream, memory fraction).
 *
 * The idea: PyTorch's own caching layer is bypassed, so every tensor is one
 * gm_alloc on the pool of its device (gm_device_pool) and the stream PyTorch
 * names; gpumem's stream rule replaces PyTorch's.  One thing PyTorch does not
 * do for a plugged allocator is check the pointer it gets back: a NULL from
 * the allocation function becomes a tensor at address 0 and the next kernel
 * faults.  So on failure gm_torch_alloc throws a C++ std::runtime_error
 * through the C++ caller, using the Itanium C++ ABI entry points of the
 * libstdc++ already loaded in the process (__cxa_allocate_exception,
 * __cxa_throw, std::runtime_error's constructor); PyTorch turns it into a
 * Python RuntimeError whose text begins "CUDA out of memory" and names
 * gpumem.  GPUMEM_TORCH_OOM=null returns NULL instead (for a PyTorch that
 * checks); without libstdc++ in the process, NULL is all we can do.  This
 * file is compiled with -fexceptions so the throw can unwind through it.
 *
 * Nothing here takes a lock of its own: pools are thread-safe and the ABI
 * lookups run under pthread_once.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/options.h"
#include "core/pool.h"
#include "plugins/plugins.h"

/* ---- throwing std::runtime_error from C ------------------------------------ */

typedef void *(*cxa_allocate_fn)(size_t);
typedef void (*cxa_throw_fn)(void *, void *, void (*)(void *));
typedef void (*runtime_error_ctor_fn)(void *, const char *);

static struct {
    cxa_allocate_fn allocate;
    cxa_throw_fn throw_;
    runtime_error_ctor_fn ctor;
    void (*dtor)(void *);
    void *typeinfo;
    int usable;
} cxx;

static pthread_once_t cxx_once = PTHREAD_ONCE_INIT;
static int oom_mode_null; /* GPUMEM_TORCH_OOM=null */

static void *cxx_sym(void *lib, const char *name)
{
    void *p = lib ? dlsym(lib, name) : NULL;
    return p ? p : dlsym(RTLD_DEFAULT, name);
}

static void cxx_load(void)
{
    oom_mode_null = gm__option_num(GM_OPT_TORCH_OOM) != 0;
    /* Only a libstdc++ that is already loaded (PyTorch's): never load one. */
    void *lib = dlopen("libstdc++.so.6", RTLD_NOW | RTLD_NOLOAD);
    void *a = cxx_sym(lib, "__cxa_allocate_exception");
    void *t = cxx_sym(lib, "__cxa_throw");
    void *c = cxx_sym(lib, "_ZNSt13runtime_errorC1EPKc");
    void *d = cxx_sym(lib, "_ZNSt13runtime_errorD1Ev");
    void *ti = cxx_sym(lib, "_ZTISt13runtime_error");
    memcpy(&cxx.allocate, &a, sizeof a);
    memcpy(&cxx.throw_, &t, sizeof t);
    memcpy(&cxx.ctor, &c, sizeof c);
    memcpy(&cxx.dtor, &d, sizeof d);
    cxx.typeinfo = ti;
    cxx.usable = a && t && c && d && ti;
    /* The handle stays open: the process keeps libstdc++ anyway. */
}

/* Throws std::runtime_error(msg) into the C++ caller when the process has
 * libstdc++ and GPUMEM_TORCH_OOM is not "null"; returns otherwise. */
static void throw_runtime_error(const char *msg)
{
    pthread_once(&cxx_once, cxx_load);
    if (oom_mode_null || !cxx.usable) return;
    /* sizeof(std::runtime_error) is 16 on LP64 libstdc++; room to spare. */
    void *e = cxx.allocate(64);
    cxx.ctor(e, msg); /* copies msg */
    cxx.throw_(e, cxx.typeinfo, cxx.dtor);
}

/* ---- the allocator functions ---------------------------------------------- */

static _Atomic unsigned long free_errors;

/* The failure of an allocation of either kind: thrown (or NULL). */
static void *alloc_failed(int rc, ssize_t size, int device)
{
    char msg[512];
    char a[32];
    snprintf(msg, sizeof msg, "%s: tried to allocate %s on device %d: %s: %s",
             rc == GM_OUT_OF_MEMORY || rc == GM_LIMIT ? "CUDA out of memory (gpumem)"
                                                      : "gpumem: allocation failed",
             gm__fmt_bytes((size_t)size, a, sizeof a), device, gm_errname(rc), gm_last_error());
    throw_runtime_error(msg);
    return NULL;
}

void *gm_torch_alloc(ssize_t size, int device, gm_stream_t stream)
{
    if (size <= 0) return NULL;
    gm_pool_t *pool;
    void *ptr = NULL;
    int rc = gm_device_pool(device, &pool);
    if (GM_LIKELY(rc == GM_OK)) rc = gm_alloc(pool, (size_t)size, stream, &ptr);
    if (GM_LIKELY(rc == GM_OK)) return ptr;
    return alloc_failed(rc, size, device);
}

void *gm_torch_alloc_registrable(ssize_t size, int device, gm_stream_t stream)
{
    if (size <= 0) return NULL;
    gm_pool_t *pool;
    void *ptr = NULL;
    int rc = gm_device_pool(device, &pool);
    if (rc == GM_OK) rc = gm_alloc_registrable(pool, (size_t)size, stream, &ptr);
    if (rc == GM_OK) return ptr;
    return alloc_failed(rc, size, device);
}

void gm_torch_free(void *ptr, ssize_t size, int device, gm_stream_t stream)
{
    (void)size;
    if (!ptr) return;
    gm_pool_t *pool;
    int rc = gm_device_pool(device, &pool);
    if (rc == GM_OK) rc = gm_free(pool, ptr, stream);
    if (GM_UNLIKELY(rc != GM_OK)) /* PyTorch calls this from destructors */
        gm__plugin_free_failed(&free_errors, "gm_torch_free", ptr, device, gm_last_error());
}

/* Finds the pool holding live block ptr among the created device pools. */
static gm_pool_t *pool_of(const void *ptr)
{
    for (int d = 0; d < gm__device_pool_count(); d++) {
        gm_pool_t *p = gm__device_pool_peek(d);
        size_t size;
        if (p && gm_block_size(p, ptr, &size) == GM_OK) return p;
    }
    return NULL;
}

void gm_torch_empty_cache(void)
{
    for (int d = 0; d < gm__device_pool_count(); d++) {
        gm_pool_t *p = gm__device_pool_peek(d);
        if (p && gm_trim(p, 0, NULL) != GM_OK)
            fprintf(stderr, "gpumem: empty_cache on device %d: %s\n", d, gm_last_error());
    }
}

void gm_torch_record_stream(void *ptr, gm_stream_t stream)
{
    gm_pool_t *p = ptr ? pool_of(ptr) : NULL;
    if (!p) {
        fprintf(stderr, "gpumem: record_stream(%p): not a live gpumem block\n", ptr);
        return;
    }
    if (gm_record_stream(p, ptr, stream) != GM_OK)
        fprintf(stderr, "gpumem: record_stream(%p, %p): %s\n", ptr, stream, gm_last_error());
}

void gm_torch_set_memory_fraction(double fraction, int device)
{
    gm_pool_t *p;
    gm_device_info_t info = GM_DEVICE_INFO_INIT;
    if (gm_device_pool(device, &p) != GM_OK || gm_pool_device_info(p, &info) != GM_OK) {
        fprintf(stderr, "gpumem: set_per_process_memory_fraction(%g, %d): %s\n", fraction, device,
                gm_last_error());
        return;
    }
    /* 1 and above: the whole device (limit 0); 0 and below: nothing fits. */
    size_t limit = 0;
    if (!(fraction >= 1.0)) {
        limit = fraction > 0 ? (size_t)(fraction * (double)info.total_memory) : 0;
        if (limit == 0) limit = 1;
    }
    (void)gm_pool_set_limit(p, limit);
}

int gm_torch_shareable_min(size_t *bytes)
{
    if (!bytes) return gm__set_error(GM_INVALID_ARGUMENT, "gm_torch_shareable_min: bytes is NULL");
    uint64_t v = 0;
    GM_CHECK(gm__option_read(GM_OPT_TORCH_SHAREABLE, &v));
    *bytes = (size_t)v;
    return GM_OK;
}
