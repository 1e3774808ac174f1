/* SPDX-License-Identifier: Apache-2.0 */
// torch_shim.cpp — PyTorch's CUDA caching allocator behind a few C calls, so
// that bench/alloc_bench.c can load it with dlopen and drive it exactly like
// the other allocators.  Built by bench/run_alloc_bench.sh only where
// libtorch is found; links c10 and c10_cuda only.
//
// The one idea: go straight to c10::cuda::CUDACachingAllocator (raw alloc
// with a stream, raw delete, device stats), the same calls a tensor
// allocation ends in, without tensors or Python in the way.
#include <c10/cuda/CUDACachingAllocator.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

namespace alloc = c10::cuda::CUDACachingAllocator;

static c10::DeviceIndex g_device;
static std::string g_config;

extern "C" {

__attribute__((visibility("default"))) int torch_shim_init(int device)
{
    try {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0) return 1;
        g_device = static_cast<c10::DeviceIndex>(device);
        alloc::init(n);
        const char *env = std::getenv("PYTORCH_CUDA_ALLOC_CONF");
        g_config = env ? env : "(default)";
        return 0;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "torch_shim_init: %s\n", e.what());
        return 1;
    }
}

__attribute__((visibility("default"))) const char *torch_shim_config(void) { return g_config.c_str(); }

__attribute__((visibility("default"))) int torch_shim_alloc(size_t n, void *stream, void **p)
{
    try {
        *p = alloc::raw_alloc_with_stream(n, static_cast<cudaStream_t>(stream));
        return *p || n == 0 ? 0 : 1;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "torch_shim_alloc(%zu): %.300s\n", n, e.what());
        *p = nullptr;
        return 1;
    }
}

__attribute__((visibility("default"))) int torch_shim_free(void *p)
{
    try {
        alloc::raw_delete(p);
        return 0;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "torch_shim_free: %.300s\n", e.what());
        return 1;
    }
}

// Every block is already freed: give the cache back and reset the peaks.
__attribute__((visibility("default"))) void torch_shim_reset(void)
{
    alloc::emptyCache();
    alloc::resetPeakStats(g_device);
}

// out: reserved peak, allocated peak, requested peak (bytes), segments
// allocated, segments freed (cumulative counts), allocation retries.
__attribute__((visibility("default"))) void torch_shim_stats(uint64_t out[6])
{
    auto st = alloc::getDeviceStats(g_device);
    const size_t agg = 0; // StatType::AGGREGATE
    out[0] = static_cast<uint64_t>(st.reserved_bytes[agg].peak);
    out[1] = static_cast<uint64_t>(st.allocated_bytes[agg].peak);
    out[2] = static_cast<uint64_t>(st.requested_bytes[agg].peak);
    out[3] = static_cast<uint64_t>(st.segment[agg].allocated);
    out[4] = static_cast<uint64_t>(st.segment[agg].freed);
    out[5] = static_cast<uint64_t>(st.num_alloc_retries);
}

} // extern "C"
