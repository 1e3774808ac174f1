/* SPDX-License-Identifier: Apache-2.0 */
// static_app.cu — a program built by nvcc, whose CUDA runtime is linked in
// statically (nvcc's default) and so cannot be interposed by symbol.  Run
// under the preload library with the stub libcuda.so.1 and STUB_CUDA_TRACE=1,
// the stub reports who calls its cuGetProcAddress_v2: the preload library
// (the runtime found the driver through the interposed dlsym), not this
// program.  The stub is no real driver, so cudaMalloc itself fails.
#include <cuda_runtime.h>
#include <cstdio>

int main()
{
    void *p = nullptr;
    cudaError_t e = cudaMalloc(&p, 1 << 20);
    std::printf("static_app: cudaMalloc returned %d\n", (int)e);
    return 0;
}
