/* SPDX-License-Identifier: Apache-2.0 */
/*
 * preload.c — libgpumem_preload.so: gpumem under an unmodified program
 * (LD_PRELOAD=build/libgpumem_preload.so program ...).
 *
 * It owns the routing of a process's device allocations into gpumem's
 * per-device pools: cudaMalloc / cudaFree / cudaMallocAsync / cudaFreeAsync
 * (and their _ptsz forms) of a dynamically linked CUDA runtime, and the
 * driver's cuMemAlloc_v2 / cuMemFree_v2 / cuMemAllocAsync / cuMemFreeAsync
 * however the program reaches them: by symbol, through dlsym on libcuda's
 * handle, through cuGetProcAddress(_v2), or through the runtime's
 * cudaGetDriverEntryPoint(ByVersion).  GPUMEM_LIMIT caps the process (the
 * pools' limit); everything else is left alone, and a free of a pointer
 * gpumem did not hand out goes to the function the program would have
 * called.
 *
 * The idea: a CUDA runtime linked statically into the program (nvcc's
 * default) cannot be interposed by symbol, but it finds the driver with
 * dlopen("libcuda.so.1") + dlsym(handle, "cuGetProcAddress_v2") and takes
 * every driver entry point from there.  dlsym on a handle bypasses
 * LD_PRELOAD, so dlsym itself is interposed: a small assembly trampoline
 * asks pick() whether the lookup is one of ours (a name we route, on a
 * handle whose object really has it) and otherwise jumps straight into
 * glibc's dlsym, so the return address glibc sees is the caller's and
 * RTLD_NEXT keeps its meaning.  Our cuGetProcAddress calls the real one and
 * swaps in our functions for the names we route.
 *
 * Re-entrancy: gpumem's own cuda backend loads the driver the same way.
 * Every call into gpumem runs with the thread-local in_gm set; while it is,
 * pick() and our cuGetProcAddress hand out the real functions and our
 * allocation entry points forward to the driver (counted as "re-entered",
 * which GPUMEM_PRELOAD_VERBOSE=1 reports: it must stay 0).
 *
 * The unsuffixed exports cuMemAlloc / cuMemFree are the driver's legacy
 * 32-bit-pointer ABI: they are passed through, not routed (gpumem addresses
 * do not fit 32 bits).  The gpumem code linked into this library is hidden
 * (preload.map exports only the names below), so it is a separate instance
 * from a libgpumem.so the program may also load.
 */
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpumem.h"
#include "backend/cuda_driver.h"
#include "core/options.h"
#include "core/pool.h" /* gm__device_pool_peek (hidden, linked into this library) */

#define EXPORT __attribute__((visibility("default")))
#define HIDDEN __attribute__((visibility("hidden")))

typedef int cudaError_t;
typedef void *cudaStream_t;
enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2,
       cudaErrorInitializationError = 3 };

#define STREAM_PER_THREAD ((void *)(uintptr_t)0x2) /* CU_STREAM_PER_THREAD */
#define DRIVER_V2_VERSION 3020                     /* cuMemAlloc_v2 appeared in CUDA 3.2 */
#define GET_PROC_V2_VERSION 12000

/* ------------------------------------------------------------------------ */
/* Re-entrancy guard and counters                                           */
/* ------------------------------------------------------------------------ */

static __thread int in_gm __attribute__((tls_model("initial-exec")));

#define GM_ENTER() (in_gm++)
#define GM_LEAVE() (in_gm--)

static struct {
    _Atomic unsigned long allocs, frees, foreign_frees, oom, fallbacks, reentered, double_frees;
    _Atomic unsigned long long bytes;
    _Atomic int pool_warned;
} count;

static int verbose(void)
{
    return gm__option_num(GM_OPT_PRELOAD_VERBOSE) != 0;
}

/* ------------------------------------------------------------------------ */
/* The real dlsym, and the real functions behind the names we route        */
/* ------------------------------------------------------------------------ */

typedef void *(*dlsym_fn)(void *, const char *);
HIDDEN __attribute__((used)) dlsym_fn gm__preload_real_dlsym; /* read by the trampoline */

static void resolve_real_dlsym(void)
{
    if (__atomic_load_n(&gm__preload_real_dlsym, __ATOMIC_ACQUIRE)) return;
    /* glibc 2.34 moved dlsym into libc with a new version; older ones have
     * the first version of the architecture.  RTLD_NEXT: the next object
     * after us, i.e. glibc, not our own dlsym. */
    static const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0", NULL};
    void *p = NULL;
    for (int i = 0; !p && versions[i]; i++) p = dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    if (!p) {
        fprintf(stderr, "gpumem preload: cannot find glibc's dlsym; aborting\n");
        abort();
    }
    dlsym_fn f;
    memcpy(&f, &p, sizeof f);
    __atomic_store_n(&gm__preload_real_dlsym, f, __ATOMIC_RELEASE);
}

static void *real_sym(void *handle, const char *name)
{
    resolve_real_dlsym();
    return gm__preload_real_dlsym(handle, name);
}

/* Function pointers stored as void * (ISO C has no object<->function cast). */
#define AS_FN(type, p) ({ type f_; void *p_ = (p); memcpy(&f_, &p_, sizeof f_); f_; })
#define AS_PTR(fn) ({ void *p_; __typeof__(fn) f_ = (fn); memcpy(&p_, &f_, sizeof p_); p_; })

typedef CUresult (*get_proc_v2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*get_proc_v1_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*mem_alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*mem_free_fn)(CUdeviceptr);
typedef CUresult (*mem_alloc_async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*mem_free_async_fn)(CUdeviceptr, CUstream);
typedef CUresult (*ctx_get_device_fn)(CUdevice *);
typedef CUresult (*legacy_alloc_fn)(unsigned int *, unsigned int);
typedef CUresult (*legacy_free_fn)(unsigned int);
typedef cudaError_t (*rt_malloc_fn)(void **, size_t);
typedef cudaError_t (*rt_free_fn)(void *);
typedef cudaError_t (*rt_malloc_async_fn)(void **, size_t, cudaStream_t);
typedef cudaError_t (*rt_free_async_fn)(void *, cudaStream_t);
typedef cudaError_t (*rt_get_device_fn)(int *);
typedef cudaError_t (*rt_entry_fn)(const char *, void **, unsigned long long, int *);
typedef cudaError_t (*rt_entry_ver_fn)(const char *, void **, unsigned int, unsigned long long, int *);

/* One row per routed name: our function, and the real one (found lazily:
 * from a dlsym we intercepted, else the driver / a loaded runtime). */
enum {
    R_cuGetProcAddress, R_cuGetProcAddress_v2, R_cuMemAlloc_v2, R_cuMemFree_v2, R_cuMemAllocAsync,
    R_cuMemAllocAsync_ptsz, R_cuMemFreeAsync, R_cuMemFreeAsync_ptsz, R_cuCtxGetDevice, R_cuMemAlloc,
    R_cuMemFree, R_cudaMalloc, R_cudaFree, R_cudaMallocAsync, R_cudaMallocAsync_ptsz, R_cudaFreeAsync,
    R_cudaFreeAsync_ptsz, R_cudaGetDevice, R_cudaGetDriverEntryPoint, R_cudaGetDriverEntryPointByVersion,
    R_COUNT
};
static const char *const route_names[R_COUNT] = {
    "cuGetProcAddress", "cuGetProcAddress_v2", "cuMemAlloc_v2", "cuMemFree_v2", "cuMemAllocAsync",
    "cuMemAllocAsync_ptsz", "cuMemFreeAsync", "cuMemFreeAsync_ptsz", "cuCtxGetDevice", "cuMemAlloc",
    "cuMemFree", "cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaMallocAsync_ptsz", "cudaFreeAsync",
    "cudaFreeAsync_ptsz", "cudaGetDevice", "cudaGetDriverEntryPoint", "cudaGetDriverEntryPointByVersion",
};
/* Which rows dlsym swaps for ours (cuCtxGetDevice, cudaGetDevice and the
 * legacy names are only looked up, never replaced). */
static const unsigned char route_swapped[R_COUNT] = {
    [R_cuGetProcAddress] = 1, [R_cuGetProcAddress_v2] = 1, [R_cuMemAlloc_v2] = 1,
    [R_cuMemFree_v2] = 1, [R_cuMemAllocAsync] = 1, [R_cuMemAllocAsync_ptsz] = 1,
    [R_cuMemFreeAsync] = 1, [R_cuMemFreeAsync_ptsz] = 1, [R_cudaMalloc] = 1, [R_cudaFree] = 1,
    [R_cudaMallocAsync] = 1, [R_cudaMallocAsync_ptsz] = 1, [R_cudaFreeAsync] = 1,
    [R_cudaFreeAsync_ptsz] = 1, [R_cudaGetDriverEntryPoint] = 1,
    [R_cudaGetDriverEntryPointByVersion] = 1,
};
static void *_Atomic real_fn[R_COUNT];
static void *ours[R_COUNT]; /* filled by the constructor */

static int route_index(const char *name)
{
    if (!name || name[0] != 'c' || name[1] != 'u') return -1;
    for (int i = 0; i < R_COUNT; i++)
        if (strcmp(name, route_names[i]) == 0) return i;
    return -1;
}

static void remember_real(int k, void *p)
{
    void *none = NULL;
    if (p && p != ours[k]) atomic_compare_exchange_strong(&real_fn[k], &none, p);
}

/* The driver, loaded only when a routed driver call needs its real
 * functions (never in a program that does not use CUDA). */
static pthread_once_t driver_once = PTHREAD_ONCE_INIT;

static void load_driver(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    remember_real(R_cuGetProcAddress_v2, real_sym(lib, "cuGetProcAddress_v2"));
    remember_real(R_cuGetProcAddress, real_sym(lib, "cuGetProcAddress"));
    remember_real(R_cuMemAlloc, real_sym(lib, "cuMemAlloc"));
    remember_real(R_cuMemFree, real_sym(lib, "cuMemFree"));
    get_proc_v2_fn v2 = AS_FN(get_proc_v2_fn, atomic_load(&real_fn[R_cuGetProcAddress_v2]));
    get_proc_v1_fn v1 = AS_FN(get_proc_v1_fn, atomic_load(&real_fn[R_cuGetProcAddress]));
    static const struct { int row; const char *name; cuuint64_t flags; } want[] = {
        {R_cuMemAlloc_v2, "cuMemAlloc", CU_GET_PROC_ADDRESS_LEGACY_STREAM},
        {R_cuMemFree_v2, "cuMemFree", CU_GET_PROC_ADDRESS_LEGACY_STREAM},
        {R_cuMemAllocAsync, "cuMemAllocAsync", CU_GET_PROC_ADDRESS_LEGACY_STREAM},
        {R_cuMemAllocAsync_ptsz, "cuMemAllocAsync", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM},
        {R_cuMemFreeAsync, "cuMemFreeAsync", CU_GET_PROC_ADDRESS_LEGACY_STREAM},
        {R_cuMemFreeAsync_ptsz, "cuMemFreeAsync", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM},
        {R_cuCtxGetDevice, "cuCtxGetDevice", CU_GET_PROC_ADDRESS_LEGACY_STREAM},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        void *fn = NULL;
        CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        CUresult r = CUDA_ERROR_NOT_INITIALIZED;
        GM_ENTER(); /* our own cuGetProcAddress, if it is the one, hands out reals */
        if (v2) r = v2(want[i].name, &fn, GET_PROC_V2_VERSION, want[i].flags, &st);
        else if (v1) r = v1(want[i].name, &fn, GET_PROC_V2_VERSION, want[i].flags);
        GM_LEAVE();
        if (r != CUDA_SUCCESS || fn == ours[want[i].row]) fn = NULL;
        if (!fn) fn = real_sym(lib, route_names[want[i].row]);
        remember_real(want[i].row, fn);
    }
    /* Never dlclose'd, like gpumem's backend. */
}

static void *driver_real(int k)
{
    void *p = atomic_load_explicit(&real_fn[k], memory_order_acquire);
    if (p) return p;
    pthread_once(&driver_once, load_driver);
    return atomic_load_explicit(&real_fn[k], memory_order_acquire);
}

/* A runtime function of the program's CUDA runtime: seen through dlsym,
 * else the next definition after us, else the first loaded libcudart (one
 * loaded RTLD_LOCAL, as Python extensions load theirs, is not in the global
 * scope RTLD_NEXT searches).  The loader's list is only read under
 * dl_iterate_phdr; the library is opened after it returns. */
static int find_cudart(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    char *name = arg;
    if (!info->dlpi_name || !strstr(info->dlpi_name, "libcudart")) return 0;
    snprintf(name, 4096, "%s", info->dlpi_name);
    return 1;
}

static void *runtime_real(int k)
{
    void *p = atomic_load_explicit(&real_fn[k], memory_order_acquire);
    if (p) return p;
    p = real_sym(RTLD_NEXT, route_names[k]);
    if (!p) {
        static char name[4096];
        static pthread_mutex_t name_lock = PTHREAD_MUTEX_INITIALIZER;
        pthread_mutex_lock(&name_lock);
        name[0] = '\0';
        dl_iterate_phdr(find_cudart, name);
        void *h = name[0] ? dlopen(name, RTLD_LAZY | RTLD_NOLOAD) : NULL;
        pthread_mutex_unlock(&name_lock);
        if (h) {
            p = real_sym(h, route_names[k]);
            dlclose(h); /* drops the reference NOLOAD took; the library stays */
        }
    }
    remember_real(k, p);
    return atomic_load_explicit(&real_fn[k], memory_order_acquire);
}

/* ------------------------------------------------------------------------ */
/* Pools and ownership                                                      */
/* ------------------------------------------------------------------------ */

/* The device of the calling thread's current context (the runtime makes
 * the device's primary context current), else the runtime's device, else 0. */
static int current_device(int runtime)
{
    int dev = 0;
    if (runtime) {
        rt_get_device_fn get = AS_FN(rt_get_device_fn, runtime_real(R_cudaGetDevice));
        if (get && get(&dev) == cudaSuccess) return dev;
    }
    ctx_get_device_fn ctx = AS_FN(ctx_get_device_fn, driver_real(R_cuCtxGetDevice));
    CUdevice d = 0;
    if (ctx && ctx(&d) == CUDA_SUCCESS) return (int)d;
    return 0;
}

/* GM_OK and *ptr; or the gm status (OOM/limit: the caller reports it; any
 * other failure: the caller forwards to the real allocator). */
static int gm_allocate(int device, size_t size, void *stream, void **ptr)
{
    gm_pool_t *pool;
    static _Atomic unsigned long long announced; /* devices whose pool was reported */
    GM_ENTER();
    int rc = gm_device_pool(device, &pool);
    if (rc == GM_OK && device < 64 && !(atomic_load(&announced) & (1ull << device)) &&
        !(atomic_fetch_or(&announced, 1ull << device) & (1ull << device)) && verbose()) {
        gm_device_info_t info = GM_DEVICE_INFO_INIT;
        if (gm_pool_device_info(pool, &info) == GM_OK)
            fprintf(stderr, "gpumem preload: device %d: %s backend (%s), %s\n", device, info.backend_name,
                    info.device_name, info.backend_reason);
    }
    if (rc == GM_OK) rc = gm_alloc(pool, size, stream, ptr);
    if (rc != GM_OK && rc != GM_OUT_OF_MEMORY && rc != GM_LIMIT) {
        int expected = 0;
        if (atomic_compare_exchange_strong(&count.pool_warned, &expected, 1))
            fprintf(stderr, "gpumem preload: device %d: %s; allocations go to CUDA instead\n", device,
                    gm_last_error());
        atomic_fetch_add(&count.fallbacks, 1);
    } else if (rc == GM_OK) {
        atomic_fetch_add(&count.allocs, 1);
        atomic_fetch_add(&count.bytes, size);
    } else {
        atomic_fetch_add(&count.oom, 1);
        if (verbose()) fprintf(stderr, "gpumem preload: %zu bytes on device %d: %s\n", size, device,
                               gm_last_error());
    }
    GM_LEAVE();
    return rc;
}

/* 1: ptr was a live gpumem block and is freed; 0: it is not (a pointer of
 * the real allocator, or one of ours freed twice: both go on to the real
 * function, which rejects the latter). */
static int gm_release(void *ptr, void *stream)
{
    int ours_ = 0;
    GM_ENTER();
    for (int d = 0; d < 64 && !ours_; d++) {
        /* Only pools that exist: gm_device_pool would create one. */
        gm_pool_t *pool = gm__device_pool_peek(d);
        size_t size;
        if (!pool) continue;
        if (gm_block_size(pool, ptr, &size) != GM_OK) continue;
        ours_ = 1;
        if (gm_free(pool, ptr, stream) == GM_OK) atomic_fetch_add(&count.frees, 1);
        else atomic_fetch_add(&count.double_frees, 1);
    }
    GM_LEAVE();
    return ours_;
}

/* ------------------------------------------------------------------------ */
/* Driver entry points                                                      */
/* ------------------------------------------------------------------------ */

static CUresult drv_alloc(CUdeviceptr *dptr, size_t size, CUstream stream, int row, int async)
{
    if (!dptr) return CUDA_ERROR_INVALID_VALUE;
    if (in_gm) { /* gpumem's backend itself: must not happen, see header */
        atomic_fetch_add(&count.reentered, 1);
        void *r = driver_real(row);
        if (!r) return CUDA_ERROR_NOT_INITIALIZED;
        return async ? AS_FN(mem_alloc_async_fn, r)(dptr, size, stream) : AS_FN(mem_alloc_fn, r)(dptr, size);
    }
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    int device = current_device(0);
    void *p = NULL;
    int rc = gm_allocate(device, size, stream, &p);
    if (rc == GM_OK) {
        *dptr = (CUdeviceptr)(uintptr_t)p;
        return CUDA_SUCCESS;
    }
    if (rc == GM_OUT_OF_MEMORY || rc == GM_LIMIT) return CUDA_ERROR_OUT_OF_MEMORY;
    void *r = driver_real(row);
    if (!r) return CUDA_ERROR_NOT_INITIALIZED;
    return async ? AS_FN(mem_alloc_async_fn, r)(dptr, size, stream) : AS_FN(mem_alloc_fn, r)(dptr, size);
}

static CUresult drv_free(CUdeviceptr dptr, CUstream stream, int row, int async)
{
    if (!in_gm && dptr && gm_release((void *)(uintptr_t)dptr, stream)) return CUDA_SUCCESS;
    if (in_gm) atomic_fetch_add(&count.reentered, 1);
    else if (dptr) atomic_fetch_add(&count.foreign_frees, 1);
    void *r = driver_real(row);
    if (!r) return CUDA_ERROR_NOT_INITIALIZED;
    return async ? AS_FN(mem_free_async_fn, r)(dptr, stream) : AS_FN(mem_free_fn, r)(dptr);
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
    return drv_alloc(dptr, size, NULL, R_cuMemAlloc_v2, 0);
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    return drv_free(dptr, NULL, R_cuMemFree_v2, 0);
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream stream)
{
    return drv_alloc(dptr, size, stream, R_cuMemAllocAsync, 1);
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream stream)
{
    return drv_alloc(dptr, size, stream ? stream : STREAM_PER_THREAD, R_cuMemAllocAsync_ptsz, 1);
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream)
{
    return drv_free(dptr, stream, R_cuMemFreeAsync, 1);
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream)
{
    return drv_free(dptr, stream ? stream : STREAM_PER_THREAD, R_cuMemFreeAsync_ptsz, 1);
}

/* The legacy 32-bit-pointer ABI: passed through (see the header). */
EXPORT CUresult cuMemAlloc(unsigned int *dptr, unsigned int size)
{
    legacy_alloc_fn r = AS_FN(legacy_alloc_fn, driver_real(R_cuMemAlloc));
    return r ? r(dptr, size) : CUDA_ERROR_NOT_INITIALIZED;
}

EXPORT CUresult cuMemFree(unsigned int dptr)
{
    legacy_free_fn r = AS_FN(legacy_free_fn, driver_real(R_cuMemFree));
    return r ? r(dptr) : CUDA_ERROR_NOT_INITIALIZED;
}

/* Ours for a routed name the real lookup found; *pfn unchanged otherwise. */
static void swap_proc(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    if (in_gm || !symbol || !pfn || !*pfn) return;
    int per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    int k = -1;
    if (!strcmp(symbol, "cuMemAlloc") || !strcmp(symbol, "cuMemAlloc_v2"))
        k = version >= DRIVER_V2_VERSION || symbol[10] ? R_cuMemAlloc_v2 : -1;
    else if (!strcmp(symbol, "cuMemFree") || !strcmp(symbol, "cuMemFree_v2"))
        k = version >= DRIVER_V2_VERSION || symbol[9] ? R_cuMemFree_v2 : -1;
    else if (!strcmp(symbol, "cuMemAllocAsync"))
        k = per_thread ? R_cuMemAllocAsync_ptsz : R_cuMemAllocAsync;
    else if (!strcmp(symbol, "cuMemFreeAsync"))
        k = per_thread ? R_cuMemFreeAsync_ptsz : R_cuMemFreeAsync;
    else if (!strcmp(symbol, "cuGetProcAddress"))
        k = version >= GET_PROC_V2_VERSION ? R_cuGetProcAddress_v2 : R_cuGetProcAddress;
    if (k < 0) return;
    remember_real(k, *pfn);
    *pfn = ours[k];
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status)
{
    get_proc_v2_fn r = AS_FN(get_proc_v2_fn, driver_real(R_cuGetProcAddress_v2));
    if (!r) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = r(symbol, pfn, version, flags, status);
    if (rc == CUDA_SUCCESS && (!status || *status == CU_GET_PROC_ADDRESS_SUCCESS))
        swap_proc(symbol, pfn, version, flags);
    return rc;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    get_proc_v1_fn r = AS_FN(get_proc_v1_fn, driver_real(R_cuGetProcAddress));
    if (!r) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = r(symbol, pfn, version, flags);
    if (rc == CUDA_SUCCESS) swap_proc(symbol, pfn, version, flags);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Runtime entry points (a dynamically linked libcudart)                    */
/* ------------------------------------------------------------------------ */

static cudaError_t rt_alloc(void **ptr, size_t size, cudaStream_t stream, int row, int async)
{
    if (!ptr) return cudaErrorInvalidValue;
    if (in_gm) atomic_fetch_add(&count.reentered, 1);
    else if (size == 0) {
        *ptr = NULL;
        return cudaSuccess;
    } else {
        void *p = NULL;
        int rc = gm_allocate(current_device(1), size, stream, &p);
        if (rc == GM_OK) {
            *ptr = p;
            return cudaSuccess;
        }
        if (rc == GM_OUT_OF_MEMORY || rc == GM_LIMIT) return cudaErrorMemoryAllocation;
    }
    void *r = runtime_real(row);
    if (!r) return cudaErrorInitializationError;
    return async ? AS_FN(rt_malloc_async_fn, r)(ptr, size, stream) : AS_FN(rt_malloc_fn, r)(ptr, size);
}

static cudaError_t rt_free(void *ptr, cudaStream_t stream, int row, int async)
{
    if (!in_gm && ptr && gm_release(ptr, stream)) return cudaSuccess;
    if (in_gm) atomic_fetch_add(&count.reentered, 1);
    else if (ptr) atomic_fetch_add(&count.foreign_frees, 1);
    void *r = runtime_real(row);
    if (r) return async ? AS_FN(rt_free_async_fn, r)(ptr, stream) : AS_FN(rt_free_fn, r)(ptr);
    if (!ptr) return cudaSuccess;
    /* No runtime to hand it to: the driver frees what the runtime allocated. */
    CUresult c = async ? drv_free((CUdeviceptr)(uintptr_t)ptr, stream, R_cuMemFreeAsync, 1)
                       : drv_free((CUdeviceptr)(uintptr_t)ptr, NULL, R_cuMemFree_v2, 0);
    return c == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

EXPORT cudaError_t cudaMalloc(void **ptr, size_t size)
{
    return rt_alloc(ptr, size, NULL, R_cudaMalloc, 0);
}

EXPORT cudaError_t cudaFree(void *ptr)
{
    return rt_free(ptr, NULL, R_cudaFree, 0);
}

EXPORT cudaError_t cudaMallocAsync(void **ptr, size_t size, cudaStream_t stream)
{
    return rt_alloc(ptr, size, stream, R_cudaMallocAsync, 1);
}

EXPORT cudaError_t cudaMallocAsync_ptsz(void **ptr, size_t size, cudaStream_t stream)
{
    return rt_alloc(ptr, size, stream ? stream : STREAM_PER_THREAD, R_cudaMallocAsync_ptsz, 1);
}

EXPORT cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream)
{
    return rt_free(ptr, stream, R_cudaFreeAsync, 1);
}

EXPORT cudaError_t cudaFreeAsync_ptsz(void *ptr, cudaStream_t stream)
{
    return rt_free(ptr, stream ? stream : STREAM_PER_THREAD, R_cudaFreeAsync_ptsz, 1);
}

/* The runtime asks the driver's cuGetProcAddress, which it found through
 * dlsym (ours already); this catches a runtime that found it otherwise. */
EXPORT cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **pfn, unsigned long long flags,
                                           int *status)
{
    rt_entry_fn r = AS_FN(rt_entry_fn, runtime_real(R_cudaGetDriverEntryPoint));
    if (!r) return cudaErrorInitializationError;
    cudaError_t rc = r(symbol, pfn, flags, status);
    if (rc == cudaSuccess && (!status || *status == 0)) swap_proc(symbol, pfn, GET_PROC_V2_VERSION, flags);
    return rc;
}

EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **pfn, unsigned int version,
                                                    unsigned long long flags, int *status)
{
    rt_entry_ver_fn r = AS_FN(rt_entry_ver_fn, runtime_real(R_cudaGetDriverEntryPointByVersion));
    if (!r) return cudaErrorInitializationError;
    cudaError_t rc = r(symbol, pfn, version, flags, status);
    if (rc == cudaSuccess && (!status || *status == 0)) swap_proc(symbol, pfn, (int)version, flags);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* dlsym                                                                    */
/* ------------------------------------------------------------------------ */

/* Called by the trampoline for every dlsym in the process: ours for a
 * routed name on a handle whose object has it, NULL to let glibc answer. */
HIDDEN __attribute__((used)) void *gm__preload_dlsym_pick(void *handle, const char *name)
{
    resolve_real_dlsym();
    if (in_gm || handle == RTLD_NEXT || handle == RTLD_DEFAULT) return NULL;
    int k = route_index(name);
    if (k < 0 || !route_swapped[k]) return NULL;
    void *real = gm__preload_real_dlsym(handle, name);
    if (!real || real == ours[k]) return NULL;
    remember_real(k, real);
    return ours[k];
}

#if defined(__x86_64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, @function\n"
        "dlsym:\n"
        "  .cfi_startproc\n"
        "  endbr64\n"
        "  pushq %rdi\n"
        "  .cfi_adjust_cfa_offset 8\n"
        "  pushq %rsi\n"
        "  .cfi_adjust_cfa_offset 8\n"
        "  subq $8, %rsp\n"
        "  .cfi_adjust_cfa_offset 8\n"
        "  call gm__preload_dlsym_pick\n"
        "  addq $8, %rsp\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  popq %rsi\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  popq %rdi\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  testq %rax, %rax\n"
        "  jz 1f\n"
        "  ret\n"
        "1:\n"
        "  jmp *gm__preload_real_dlsym(%rip)\n"
        "  .cfi_endproc\n"
        ".size dlsym, .-dlsym\n");
#define HAVE_DLSYM_TRAMPOLINE 1
#elif defined(__aarch64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, %function\n"
        ".p2align 2\n"
        "dlsym:\n"
        "  .cfi_startproc\n"
        "  hint #34\n" /* bti c */
        "  stp x29, x30, [sp, #-32]!\n"
        "  .cfi_def_cfa_offset 32\n"
        "  .cfi_offset 29, -32\n"
        "  .cfi_offset 30, -24\n"
        "  mov x29, sp\n"
        "  stp x0, x1, [sp, #16]\n"
        "  bl gm__preload_dlsym_pick\n"
        "  mov x2, x0\n"
        "  ldp x0, x1, [sp, #16]\n"
        "  ldp x29, x30, [sp], #32\n"
        "  .cfi_def_cfa_offset 0\n"
        "  cbz x2, 1f\n"
        "  mov x0, x2\n"
        "  ret\n"
        "1:\n"
        "  adrp x16, gm__preload_real_dlsym\n"
        "  ldr x16, [x16, #:lo12:gm__preload_real_dlsym]\n"
        "  br x16\n"
        "  .cfi_endproc\n"
        ".size dlsym, .-dlsym\n");
#define HAVE_DLSYM_TRAMPOLINE 1
#endif
/* Elsewhere dlsym is not interposed: a statically linked runtime then
 * bypasses gpumem (documented in docs/python.md). */

/* ------------------------------------------------------------------------ */
/* Setup and the exit report                                                */
/* ------------------------------------------------------------------------ */

__attribute__((constructor)) static void preload_init(void)
{
    resolve_real_dlsym();
    ours[R_cuGetProcAddress] = AS_PTR(&cuGetProcAddress);
    ours[R_cuGetProcAddress_v2] = AS_PTR(&cuGetProcAddress_v2);
    ours[R_cuMemAlloc_v2] = AS_PTR(&cuMemAlloc_v2);
    ours[R_cuMemFree_v2] = AS_PTR(&cuMemFree_v2);
    ours[R_cuMemAllocAsync] = AS_PTR(&cuMemAllocAsync);
    ours[R_cuMemAllocAsync_ptsz] = AS_PTR(&cuMemAllocAsync_ptsz);
    ours[R_cuMemFreeAsync] = AS_PTR(&cuMemFreeAsync);
    ours[R_cuMemFreeAsync_ptsz] = AS_PTR(&cuMemFreeAsync_ptsz);
    ours[R_cuMemAlloc] = AS_PTR(&cuMemAlloc);
    ours[R_cuMemFree] = AS_PTR(&cuMemFree);
    ours[R_cudaMalloc] = AS_PTR(&cudaMalloc);
    ours[R_cudaFree] = AS_PTR(&cudaFree);
    ours[R_cudaMallocAsync] = AS_PTR(&cudaMallocAsync);
    ours[R_cudaMallocAsync_ptsz] = AS_PTR(&cudaMallocAsync_ptsz);
    ours[R_cudaFreeAsync] = AS_PTR(&cudaFreeAsync);
    ours[R_cudaFreeAsync_ptsz] = AS_PTR(&cudaFreeAsync_ptsz);
    ours[R_cudaGetDriverEntryPoint] = AS_PTR(&cudaGetDriverEntryPoint);
    ours[R_cudaGetDriverEntryPointByVersion] = AS_PTR(&cudaGetDriverEntryPointByVersion);
}

__attribute__((destructor)) static void preload_report(void)
{
    if (!verbose()) return;
    unsigned long seen = atomic_load(&count.allocs) + atomic_load(&count.foreign_frees) +
                         atomic_load(&count.oom) + atomic_load(&count.fallbacks) +
                         atomic_load(&count.reentered) + atomic_load(&count.double_frees);
    if (!seen) return; /* a process that used no CUDA memory (a shell, ...) */
    fprintf(stderr,
            "gpumem preload: %lu allocations (%llu bytes) served by gpumem, %lu freed, %lu foreign "
            "frees passed on, %lu out of memory, %lu sent to CUDA (no pool), %lu bad frees, "
            "%lu re-entered\n",
            atomic_load(&count.allocs), (unsigned long long)atomic_load(&count.bytes),
            atomic_load(&count.frees), atomic_load(&count.foreign_frees), atomic_load(&count.oom),
            atomic_load(&count.fallbacks), atomic_load(&count.double_frees),
            atomic_load(&count.reentered));
    GM_ENTER();
    for (int d = 0; d < 64; d++) {
        gm_pool_t *pool = gm__device_pool_peek(d);
        if (!pool) continue;
        /* Stats only: no driver call (the driver may be shutting down). */
        gm_stats_t st = GM_STATS_INIT;
        if (gm_pool_stats(pool, &st) != GM_OK) continue;
        fprintf(stderr,
                "gpumem preload: device %d: allocated_peak %llu, reserved_peak %llu, "
                "live %llu bytes in %llu blocks at exit\n",
                d, (unsigned long long)st.allocated_peak,
                (unsigned long long)st.reserved_peak, (unsigned long long)st.allocated,
                (unsigned long long)st.live_blocks);
    }
    GM_LEAVE();
}
