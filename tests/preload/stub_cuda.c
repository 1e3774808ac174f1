/*
 * stub_cuda.c — a stand-in libcuda.so.1 for the preload tests: the driver
 * entry points the preload library routes, answering with sentinel pointers
 * (0xd0000000 + n * 4096) so a test can tell the stub's memory from
 * gpumem's, and counting what reaches it.  Never touches a GPU.
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

/* Handed out by cuGetProcAddress*, like the real driver's table. */
static void *lookup(const char *name, unsigned long long flags)
{
    void *fn = NULL;
    (void)flags;
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
