/* SPDX-License-Identifier: Apache-2.0 */
// vecadd.cu — an unmodified CUDA program for the preload test: vector adds
// on memory from cudaMalloc, cudaMallocAsync, cuMemAlloc (driver, by symbol)
// and cuMemAlloc obtained through cudaGetDriverEntryPointByVersion; checks the
// results.  With "limit MiB" it allocates 64 MiB blocks until one fails and
// reports where, then frees them and allocates again.
// Build: nvcc -O2 -o vecadd vecadd.cu -lcuda   (the runtime links statically)
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

__global__ void add(const float *a, const float *b, float *c, size_t n)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

static int check_add(float *a, float *b, float *c, size_t n, cudaStream_t s, const char *what)
{
    std::vector<float> ha(n), hb(n), hc(n);
    for (size_t i = 0; i < n; i++) { ha[i] = (float)i; hb[i] = 2.0f * (float)i; }
    cudaMemcpyAsync(a, ha.data(), n * 4, cudaMemcpyHostToDevice, s);
    cudaMemcpyAsync(b, hb.data(), n * 4, cudaMemcpyHostToDevice, s);
    add<<<(unsigned)((n + 255) / 256), 256, 0, s>>>(a, b, c, n);
    cudaMemcpyAsync(hc.data(), c, n * 4, cudaMemcpyDeviceToHost, s);
    if (cudaStreamSynchronize(s) != cudaSuccess) { printf("%s: %s\n", what, cudaGetErrorString(cudaGetLastError())); return 1; }
    for (size_t i = 0; i < n; i++)
        if (hc[i] != 3.0f * (float)i) { printf("%s: wrong result at %zu\n", what, i); return 1; }
    printf("%s: ok (%p %p %p)\n", what, (void *)a, (void *)b, (void *)c);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 2 && !strcmp(argv[1], "limit")) {
        size_t cap = strtoull(argv[2], 0, 10) << 20, got = 0;
        std::vector<void *> ps;
        for (;;) {
            void *p = nullptr;
            cudaError_t e = cudaMalloc(&p, 64 << 20);
            if (e != cudaSuccess) { printf("limit: allocation %zu failed after %zu MiB: %s\n", ps.size() + 1, got >> 20, cudaGetErrorName(e)); cudaGetLastError(); break; }
            ps.push_back(p); got += 64 << 20;
            if (got > 4 * cap + (1ull << 30)) { printf("limit: no failure after %zu MiB\n", got >> 20); break; }
        }
        for (void *p : ps) cudaFree(p);
        void *p = nullptr;
        cudaError_t e = cudaMalloc(&p, 64 << 20);
        printf("limit: after freeing, a new 64 MiB allocation %s\n", e == cudaSuccess ? "succeeds" : "fails");
        cudaFree(p);
        return (got <= cap && e == cudaSuccess) ? 0 : 1;
    }
    const size_t n = 1 << 22;
    int bad = 0;
    cudaStream_t s;
    cudaStreamCreate(&s);
    float *a, *b, *c;
    cudaMalloc(&a, n * 4); cudaMalloc(&b, n * 4); cudaMalloc(&c, n * 4);
    bad += check_add(a, b, c, n, s, "cudaMalloc");
    float *d;
    cudaMallocAsync(&d, n * 4, s);
    bad += check_add(a, b, d, n, s, "cudaMallocAsync");
    cudaFreeAsync(d, s);
    CUdeviceptr e = 0;
    if (cuMemAlloc(&e, n * 4) != CUDA_SUCCESS) { printf("cuMemAlloc failed\n"); bad++; }
    else { bad += check_add(a, b, (float *)e, n, s, "cuMemAlloc (symbol)"); cuMemFree(e); }
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuMemAlloc", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess || !fn) {
        printf("cudaGetDriverEntryPointByVersion(cuMemAlloc) failed\n"); bad++;
    } else {
        CUdeviceptr f = 0;
        if (((CUresult(*)(CUdeviceptr *, size_t))fn)(&f, n * 4) != CUDA_SUCCESS) { printf("entry-point cuMemAlloc failed\n"); bad++; }
        else { bad += check_add(a, b, (float *)f, n, s, "cuMemAlloc (entry point)"); cuMemFree(f); }
    }
    cudaFree(a); cudaFree(b); cudaFree(c);
    cudaStreamDestroy(s);
    printf("vecadd: %s\n", bad ? "FAIL" : "PASS");
    return bad ? 1 : 0;
}
