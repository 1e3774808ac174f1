/* SPDX-License-Identifier: Apache-2.0 */
/*
 * stub_cudart.c — a stand-in CUDA runtime (libcudart.so.13) for the preload
 * tests: cudaMalloc & co. answering with sentinel pointers (0xe0000000 +
 * n * 4096) and counting what reaches them.  Never touches a GPU.
 */
#include <stddef.h>
#include <stdint.h>

#define API __attribute__((visibility("default")))
typedef int cudaError_t;

static unsigned long next_ptr;
static unsigned long allocs, frees;
static void *last_freed;

/* File-local: a call to the exported name would bind to the preload's. */
static cudaError_t stub_alloc(void **p, size_t size)
{
    (void)size;
    *p = (void *)(uintptr_t)(0xe0000000ull + 4096ull * ++next_ptr);
    allocs++;
    return 0;
}
API cudaError_t cudaMalloc(void **p, size_t size)
{
    return stub_alloc(p, size);
}
API cudaError_t cudaFree(void *p)
{
    frees++;
    last_freed = p;
    return 0;
}
API cudaError_t cudaMallocAsync(void **p, size_t size, void *stream)
{
    (void)stream;
    return cudaMalloc(p, size);
}
API cudaError_t cudaFreeAsync(void *p, void *stream)
{
    (void)stream;
    return cudaFree(p);
}
API cudaError_t cudaGetDevice(int *dev)
{
    *dev = 0;
    return 0;
}
API void stub_cudart_counts(unsigned long *a, unsigned long *f, void **last)
{
    *a = allocs;
    *f = frees;
    *last = last_freed;
}
API void *stub_cudart_foreign_alloc(void)
{
    void *p;
    stub_alloc(&p, 4096);
    return p;
}
