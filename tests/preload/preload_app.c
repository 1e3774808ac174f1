/* SPDX-License-Identifier: Apache-2.0 */
/*
 * preload_app.c — an "unmodified program" for the preload tests.  It calls a
 * CUDA runtime it is linked against (the stub libcudart) the way PyTorch
 * does, and reaches the driver the way a statically linked runtime does
 * (dlopen("libcuda.so.1") + dlsym + cuGetProcAddress_v2).  The stubs answer
 * with sentinel pointers; under the preload library the routed calls must
 * return gpumem memory (GPUMEM_BACKEND=sim: host memory, written here),
 * frees of the stubs' own pointers must reach the stubs, other lookups must
 * pass through untouched, and GPUMEM_LIMIT must hold.
 *
 * usage: preload_app plain|preload|limit    (exit 0 when every check holds)
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int cudaError_t;
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
cudaError_t cudaMalloc(void **p, size_t size);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocAsync(void **p, size_t size, void *stream);
cudaError_t cudaFreeAsync(void *p, void *stream);
void stub_cudart_counts(unsigned long *a, unsigned long *f, void **last);
void *stub_cudart_foreign_alloc(void);

typedef CUresult (*get_proc_fn)(const char *, void **, int, unsigned long long, int *);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*alloc_async_fn)(CUdeviceptr *, size_t, void *);
typedef CUresult (*free_async_fn)(CUdeviceptr, void *);
typedef CUresult (*version_fn)(int *);
typedef void (*cuda_counts_fn)(unsigned long *, unsigned long *, CUdeviceptr *);
typedef CUdeviceptr (*foreign_fn)(void);
typedef void *(*legacy_addr_fn)(void);

#define MiB ((size_t)1 << 20)
static int failed;
#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "preload_app: %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            failed++;                                                                \
        }                                                                            \
    } while (0)

#define FN(type, p) ({ type f_; void *p_ = (p); memcpy(&f_, &p_, sizeof f_); f_; })
#define ADDR(fn) ({ void *p_; __typeof__(fn) *f_ = &(fn); memcpy(&p_, &f_, sizeof p_); p_; })

static int sentinel(uintptr_t p)
{
    return (p >= 0xd0000000u && p < 0xf0000000u);
}

static int touch(void *p, size_t n)
{
    memset(p, 0xab, n);
    return ((unsigned char *)p)[n - 1] == 0xab && ((unsigned char *)p)[0] == 0xab;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "preload";
    int plain = !strcmp(mode, "plain"), limit = !strcmp(mode, "limit");
    unsigned long a0, f0, a1, f1;
    void *last;

    /* The runtime, called by symbol. */
    stub_cudart_counts(&a0, &f0, &last);
    void *p = NULL;
    if (limit) {
        CHECK(cudaMalloc(&p, 16 * MiB) == 2); /* cudaErrorMemoryAllocation */
        CHECK(cudaMalloc(&p, 4 * MiB) == 0 && p && !sentinel((uintptr_t)p));
        CHECK(cudaFree(p) == 0);
    } else {
        CHECK(cudaMalloc(&p, MiB) == 0 && p != NULL);
        CHECK(plain ? sentinel((uintptr_t)p) : !sentinel((uintptr_t)p) && touch(p, MiB));
        CHECK(cudaFree(p) == 0);
        void *q = NULL;
        CHECK(cudaMallocAsync(&q, 3 * MiB, (void *)0x77) == 0 && q);
        CHECK(plain || (!sentinel((uintptr_t)q) && touch(q, 3 * MiB)));
        CHECK(cudaFreeAsync(q, (void *)0x77) == 0);
        stub_cudart_counts(&a1, &f1, &last);
        CHECK(plain ? a1 == a0 + 2 && f1 == f0 + 2 : a1 == a0 && f1 == f0);
        /* A pointer the runtime allocated itself: its free reaches it. */
        void *foreign = stub_cudart_foreign_alloc();
        CHECK(cudaFree(foreign) == 0);
        stub_cudart_counts(&a1, &f1, &last);
        CHECK(last == foreign);
        CHECK(cudaFree(NULL) == 0);
    }

    /* The driver, the way a statically linked runtime finds it. */
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "preload_app: %s\n", dlerror());
        return 1;
    }
    get_proc_fn gp = FN(get_proc_fn, dlsym(h, "cuGetProcAddress_v2"));
    cuda_counts_fn counts = FN(cuda_counts_fn, dlsym(h, "stub_cuda_counts"));
    foreign_fn foreign_alloc = FN(foreign_fn, dlsym(h, "stub_cuda_foreign_alloc"));
    legacy_addr_fn legacy_addr = FN(legacy_addr_fn, dlsym(h, "stub_cuda_legacy_addr"));
    CHECK(gp && counts && foreign_alloc && legacy_addr);
    if (!gp || !counts || !foreign_alloc || !legacy_addr) return 1;
    CUdeviceptr last_d;
    counts(&a0, &f0, &last_d);
    void *fa = NULL, *ff = NULL, *faa = NULL, *ffa = NULL;
    int st = -1;
    CHECK(gp("cuMemAlloc", &fa, 12000, 0, &st) == 0 && st == 0 && fa);
    CHECK(gp("cuMemFree", &ff, 12000, 0, &st) == 0 && ff);
    CHECK(gp("cuMemAllocAsync", &faa, 12000, 2 /* per-thread */, &st) == 0 && faa);
    CHECK(gp("cuMemFreeAsync", &ffa, 12000, 2, &st) == 0 && ffa);
    if (!fa || !ff || !faa || !ffa) return 1;
    CUdeviceptr d = 0;
    if (limit) {
        CHECK(FN(alloc_fn, fa)(&d, 16 * MiB) == 2); /* CUDA_ERROR_OUT_OF_MEMORY */
        CHECK(FN(alloc_fn, fa)(&d, 2 * MiB) == 0 && !sentinel(d));
        CHECK(FN(free_fn, ff)(d) == 0);
    } else {
        CHECK(FN(alloc_fn, fa)(&d, 2 * MiB) == 0 && d);
        CHECK(plain ? sentinel(d) : !sentinel(d) && touch((void *)(uintptr_t)d, 2 * MiB));
        CHECK(FN(free_fn, ff)(d) == 0);
        CHECK(FN(alloc_async_fn, faa)(&d, 5 * MiB, NULL) == 0 && d);
        CHECK(plain || (!sentinel(d) && touch((void *)(uintptr_t)d, 5 * MiB)));
        CHECK(FN(free_async_fn, ffa)(d, NULL) == 0);
        counts(&a1, &f1, &last_d);
        CHECK(plain ? a1 == a0 + 2 && f1 == f0 + 2 : a1 == a0 && f1 == f0);
        CUdeviceptr foreign = foreign_alloc();
        CHECK(FN(free_fn, ff)(foreign) == 0);
        counts(&a1, &f1, &last_d);
        CHECK(last_d == foreign);
        /* Directly by symbol on the handle. */
        alloc_fn direct = FN(alloc_fn, dlsym(h, "cuMemAlloc_v2"));
        CHECK(direct && direct(&d, MiB) == 0 && (plain ? sentinel(d) : !sentinel(d)));
        CHECK(FN(free_fn, dlsym(h, "cuMemFree_v2"))(d) == 0);
    }

    /* Everything else passes through. */
    void *ver = NULL;
    CHECK(gp("cuDriverGetVersion", &ver, 12000, 0, &st) == 0 && ver == dlsym(h, "cuDriverGetVersion"));
    int v = 0;
    CHECK(ver && FN(version_fn, ver)(&v) == 0 && v == 13000);
    CHECK(dlsym(h, "cuMemAlloc") == legacy_addr()); /* the legacy ABI is not routed */
    CHECK(dlsym(h, "no_such_symbol") == NULL);
    /* RTLD_NEXT keeps its meaning: the next cudaMalloc after this program is
     * the preload library's (or the stub runtime's without it), the one this
     * program's own calls bind to. */
    CHECK(dlsym(RTLD_NEXT, "cudaMalloc") == ADDR(cudaMalloc));
    CHECK(dlsym(RTLD_DEFAULT, "cudaMalloc") == ADDR(cudaMalloc));

    printf("preload_app %s: %s\n", mode, failed ? "FAIL" : "PASS");
    return failed ? 1 : 0;
}
