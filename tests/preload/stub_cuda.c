/* SPDX-License-Identifier: Apache-2.0 */
/*
 * stub_cuda.c — a stand-in libcuda.so.1 for the preload tests: the driver
 * entry points the preload library routes, answering with sentinel pointers
 * (0xd0000000 + n * 4096) so a test can tell the stub's memory from
 * gpumem's, and counting what reaches it.  Never touches a GPU.
 *
 * It is also just enough of a driver for gpumem's cuda backend to load and
 * probe (tests/attack/backend_*.sh): cuInit answers STUB_CUDA_INIT (a
 * CUresult, default 0), the driver sees STUB_CUDA_DEVICES devices (default
 * 1) without virtual memory management, and every other entry point the
 * backend requires exists and fails with CUDA_ERROR_NOT_SUPPORTED.  Those
 * are file-local, reachable only through cuGetProcAddress, so that nothing
 * the preload library interposes changes.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define API __attribute__((visibility("default")))
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUstream;

static unsigned long next_ptr;
static unsigned long allocs, frees;
static CUdeviceptr last_freed;

/* Calls inside this library to an exported name would bind to the preload
 * library's definition too: the stub's own allocation is file-local. */
static CUresult stub_alloc(CUdeviceptr *p, size_t size)
{
    (void)size;
    *p = 0xd0000000ull + 4096ull * ++next_ptr;
    allocs++;
    return 0;
}
API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size)
{
    return stub_alloc(p, size);
}
API CUresult cuMemFree_v2(CUdeviceptr p)
{
    frees++;
    last_freed = p;
    return 0;
}
API CUresult cuMemAllocAsync(CUdeviceptr *p, size_t size, CUstream s)
{
    (void)s;
    return cuMemAlloc_v2(p, size);
}
API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s)
{
    (void)s;
    return cuMemFree_v2(p);
}
static CUresult legacy_alloc(unsigned int *p, unsigned int size)
{
    (void)size;
    *p = 0x1000u;
    allocs++;
    return 0;
}
API CUresult cuMemAlloc(unsigned int *p, unsigned int size) __attribute__((alias("legacy_alloc")));
API CUresult cuMemFree(unsigned int p)
{
    (void)p;
    frees++;
    return 0;
}
API CUresult cuCtxGetDevice(int *dev)
{
    *dev = 0;
    return 0;
}
API CUresult cuDriverGetVersion(int *v)
{
    *v = 13000;
    return 0;
}

/* ---- the driver as the cuda backend's probe sees it ---- */

static int env_int(const char *name, int def)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : def;
}
static CUresult drv_init(unsigned flags)
{
    (void)flags;
    return env_int("STUB_CUDA_INIT", 0);
}
static CUresult drv_error_name(CUresult r, const char **name)
{
    switch (r) {
    case 0: *name = "CUDA_SUCCESS"; break;
    case 34: *name = "CUDA_ERROR_STUB_LIBRARY"; break;
    case 100: *name = "CUDA_ERROR_NO_DEVICE"; break;
    case 101: *name = "CUDA_ERROR_INVALID_DEVICE"; break;
    case 801: *name = "CUDA_ERROR_NOT_SUPPORTED"; break;
    default: *name = "CUDA_ERROR_UNKNOWN"; break;
    }
    return 0;
}
static CUresult drv_error_string(CUresult r, const char **text)
{
    (void)r;
    *text = "stub libcuda";
    return 0;
}
static CUresult drv_device_count(int *n)
{
    *n = env_int("STUB_CUDA_DEVICES", 1);
    return 0;
}
static CUresult drv_device_get(int *dev, int ordinal)
{
    if (ordinal < 0 || ordinal >= env_int("STUB_CUDA_DEVICES", 1)) return 101;
    *dev = ordinal;
    return 0;
}
static CUresult drv_device_name(char *name, int len, int dev)
{
    snprintf(name, (size_t)len, "stub device %d", dev);
    return 0;
}
static CUresult drv_device_attribute(int *value, int attribute, int dev)
{
    (void)attribute, (void)dev;
    *value = 0; /* no VMM, no fd sharing, nothing */
    return 0;
}
static CUresult drv_unsupported(void)
{
    return 801; /* CUDA_ERROR_NOT_SUPPORTED */
}
/* Required by the backend, never reached by a probe: one answer for all. */
static const char *const unsupported_names[] = {
    "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease", "cuCtxGetCurrent",
    "cuCtxSetCurrent", "cuMemGetInfo", "cuEventCreate", "cuEventDestroy", "cuEventRecord",
    "cuEventQuery", "cuEventSynchronize", "cuStreamSynchronize", "cuStreamCreate",
    "cuStreamDestroy", "cuMemcpyAsync", "cuMemsetD8Async",
};

/* A function pointer as the void * cuGetProcAddress hands out. */
static void *as_object(void (*f)(void))
{
    void *p;
    memcpy(&p, &f, sizeof p);
    return p;
}

/* Handed out by cuGetProcAddress*, like the real driver's table. */
static void *lookup(const char *name, unsigned long long flags)
{
    void *fn = NULL;
    (void)flags;
#define STUB_DRV(sym, f) if (!strcmp(name, sym)) return as_object((void (*)(void))f);
    STUB_DRV("cuInit", drv_init)
    STUB_DRV("cuGetErrorName", drv_error_name)
    STUB_DRV("cuGetErrorString", drv_error_string)
    STUB_DRV("cuDeviceGetCount", drv_device_count)
    STUB_DRV("cuDeviceGet", drv_device_get)
    STUB_DRV("cuDeviceGetName", drv_device_name)
    STUB_DRV("cuDeviceGetAttribute", drv_device_attribute)
#undef STUB_DRV
    for (size_t i = 0; i < sizeof unsupported_names / sizeof *unsupported_names; i++)
        if (!strcmp(name, unsupported_names[i])) return as_object((void (*)(void))drv_unsupported);
    if (!strcmp(name, "cuMemAlloc")) { CUresult (*f)(CUdeviceptr *, size_t) = cuMemAlloc_v2; memcpy(&fn, &f, sizeof fn); }
    else if (!strcmp(name, "cuMemFree")) { CUresult (*f)(CUdeviceptr) = cuMemFree_v2; memcpy(&fn, &f, sizeof fn); }
    else if (!strcmp(name, "cuMemAllocAsync")) { CUresult (*f)(CUdeviceptr *, size_t, CUstream) = cuMemAllocAsync; memcpy(&fn, &f, sizeof fn); }
    else if (!strcmp(name, "cuMemFreeAsync")) { CUresult (*f)(CUdeviceptr, CUstream) = cuMemFreeAsync; memcpy(&fn, &f, sizeof fn); }
    else if (!strcmp(name, "cuCtxGetDevice")) { CUresult (*f)(int *) = cuCtxGetDevice; memcpy(&fn, &f, sizeof fn); }
    else if (!strcmp(name, "cuDriverGetVersion")) { CUresult (*f)(int *) = cuDriverGetVersion; memcpy(&fn, &f, sizeof fn); }
    return fn;
}

API CUresult cuGetProcAddress_v2(const char *name, void **pfn, int version, unsigned long long flags,
                                 int *status);
API CUresult cuGetProcAddress(const char *name, void **pfn, int version, unsigned long long flags)
{
    if (getenv("STUB_CUDA_TRACE")) {
        Dl_info info;
        const char *caller = dladdr(__builtin_return_address(0), &info) && info.dli_fname ? info.dli_fname : "?";
        fprintf(stderr, "stub libcuda: cuGetProcAddress(%s, %d, %llu) from %s\n", name, version, flags, caller);
    }
    *pfn = lookup(name, flags);
    if (!*pfn && !strcmp(name, "cuGetProcAddress")) {
        CUresult (*f)(const char *, void **, int, unsigned long long, int *) = cuGetProcAddress_v2;
        memcpy(pfn, &f, sizeof *pfn);
    }
    return *pfn ? 0 : 500; /* CUDA_ERROR_NOT_FOUND */
}
API CUresult cuGetProcAddress_v2(const char *name, void **pfn, int version, unsigned long long flags,
                                 int *status)
{
    if (getenv("STUB_CUDA_TRACE")) {
        Dl_info info;
        const char *caller = dladdr(__builtin_return_address(0), &info) && info.dli_fname ? info.dli_fname : "?";
        fprintf(stderr, "stub libcuda: cuGetProcAddress_v2(%s) from %s\n", name, caller);
    }
    CUresult r = cuGetProcAddress(name, pfn, version, flags);
    if (status) *status = r == 0 ? 0 : 1;
    return r;
}

/* For the test: counters, and a pointer the "driver" allocated itself. */
API void stub_cuda_counts(unsigned long *a, unsigned long *f, CUdeviceptr *last)
{
    *a = allocs;
    *f = frees;
    *last = last_freed;
}

/* A pointer this "driver" allocated itself (not through a routed call). */
API CUdeviceptr stub_cuda_foreign_alloc(void)
{
    CUdeviceptr p;
    stub_alloc(&p, 4096);
    return p;
}
API void *stub_cuda_legacy_addr(void)
{
    CUresult (*f)(unsigned int *, unsigned int) = legacy_alloc; /* = cuMemAlloc here */
    void *p;
    memcpy(&p, &f, sizeof p);
    return p;
}
