// SPDX-License-Identifier: Apache-2.0
/*
 * multigpu_bench.cu — several GPUs (docs/multigpu.md) measured on two
 * devices of one machine: peer access to gpumem pages against cudaMalloc
 * memory with peer access enabled, NCCL all-reduce on gpumem buffers
 * registered through the pool's register hooks against NCCL's own
 * ncclMemAlloc buffers and unregistered cudaMalloc buffers, the cost of the
 * extra access grants, and compressible memory.  Built by nvcc on the GPU
 * machine (scripts/device/multigpu.sh), not by CMake: it needs kernels and
 * NCCL, which CI machines lack.  NCCL is loaded at run time
 * (dlopen("libnccl.so.2")), so no NCCL header is needed.
 *
 *   peer_copy_GBps              1 GiB from a gpumem block on GPU 0 (pool with
 *                               peers = {1}) to one on GPU 1, cudaMemcpyAsync
 *                               on a GPU 1 stream; median of 10, interleaved
 *                               with the cudaMalloc copies
 *   cudamalloc_peer_copy_GBps   the same between cudaMalloc buffers with
 *                               cudaDeviceEnablePeerAccess both ways
 *   peer_kernel_GBps, cudamalloc_peer_kernel_GBps   the same copy done by a
 *                               kernel on GPU 1 reading GPU 0's memory
 *   no_peer_kernel              what a kernel on GPU 1 reading a gpumem block
 *                               of a pool without peers gets (a child process
 *                               runs it: the fault ends its CUDA context)
 *   access_grant_ms_per_GiB     {"own": …, "one_peer": …}: gm_alloc of 4 GiB
 *                               in 64 MiB blocks in a fresh pool (pages made,
 *                               mapped, access set), wall ms per GiB
 *   allreduce_busbw_GBps        {"gpumem_registered", "gpumem_plain",
 *                               "ncclMemAlloc", "cudaMalloc"} x {"1MiB",
 *                               "64MiB", "1GiB"}: out-of-place float sum over
 *                               2 ranks (one process, ncclCommInitAll), bus
 *                               bandwidth = size / time * 2(n-1)/n, median of
 *                               3 runs of N iterations after 5 warm-up ones.
 *                               gpumem_registered: gm_alloc_registrable from
 *                               GM_POOL_NCCL pools whose register hook calls
 *                               ncclCommRegister; ncclMemAlloc: registered
 *                               too; gpumem_plain (gm_alloc blocks, one
 *                               handle per page) and cudaMalloc: unregistered
 *   allreduce_correct           every kind's result checked (sum of ranks)
 *   compression_supported       gm_pool_create with GM_POOL_COMPRESSIBLE
 *   compression                 D2D copy GB/s of 1 GiB of zeros and of random
 *                               bytes, compressible pool against a plain one
 *
 * usage: multigpu_bench [--json FILE] [--md FILE] [--command TEXT]
 */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "gpumem.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

static std::vector<std::string> g_errors;

static void fail(const char *what, const char *detail)
{
    char line[600];
    snprintf(line, sizeof line, "%s: %s", what, detail);
    fprintf(stderr, "multigpu_bench: %s\n", line);
    g_errors.push_back(line);
}

#define CU(expr)                                                               \
    do {                                                                       \
        cudaError_t e_ = (expr);                                               \
        if (e_ != cudaSuccess) {                                               \
            fail(#expr, cudaGetErrorString(e_));                               \
            return false;                                                      \
        }                                                                      \
    } while (0)
#define GM(expr)                                                               \
    do {                                                                       \
        int r_ = (expr);                                                       \
        if (r_ != GM_OK) {                                                     \
            fail(#expr, gm_last_error());                                      \
            return false;                                                      \
        }                                                                      \
    } while (0)

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double median(std::vector<double> v)
{
    if (v.empty()) return -1;
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---- NCCL, loaded at run time ------------------------------------------------ */

typedef struct ncclComm *ncclComm_t;
static struct {
    int (*GetVersion)(int *);
    int (*CommInitAll)(ncclComm_t *, int, const int *);
    int (*CommDestroy)(ncclComm_t);
    int (*AllReduce)(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t);
    int (*GroupStart)(void);
    int (*GroupEnd)(void);
    int (*CommRegister)(ncclComm_t, void *, size_t, void **);
    int (*CommDeregister)(ncclComm_t, void *);
    int (*MemAlloc)(void **, size_t);
    int (*MemFree)(void *);
    const char *(*GetErrorString)(int);
} nccl;
enum { NCCL_FLOAT32 = 7, NCCL_SUM = 0 };

static bool nccl_load(std::string &why)
{
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        why = dlerror();
        return false;
    }
#define SYM(f, name)                                                           \
    *(void **)&nccl.f = dlsym(h, name);                                        \
    if (!nccl.f) {                                                             \
        why = std::string("libnccl.so.2 lacks ") + name;                       \
        return false;                                                          \
    }
    SYM(GetVersion, "ncclGetVersion");
    SYM(CommInitAll, "ncclCommInitAll");
    SYM(CommDestroy, "ncclCommDestroy");
    SYM(AllReduce, "ncclAllReduce");
    SYM(GroupStart, "ncclGroupStart");
    SYM(GroupEnd, "ncclGroupEnd");
    SYM(CommRegister, "ncclCommRegister");
    SYM(CommDeregister, "ncclCommDeregister");
    SYM(MemAlloc, "ncclMemAlloc");
    SYM(MemFree, "ncclMemFree");
    SYM(GetErrorString, "ncclGetErrorString");
#undef SYM
    return true;
}

#define NC(expr)                                                               \
    do {                                                                       \
        int r_ = (expr);                                                       \
        if (r_ != 0) {                                                         \
            fail(#expr, nccl.GetErrorString(r_));                              \
            return false;                                                      \
        }                                                                      \
    } while (0)

/* ---- kernels ------------------------------------------------------------------- */

__global__ void copy_kernel(const float4 *__restrict__ src, float4 *__restrict__ dst, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

__global__ void fill_random(uint32_t *p, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 2654435761u ^ seed;
        x ^= x >> 16;
        x *= 0x7feb352du;
        x ^= x >> 15;
        p[i] = x;
    }
}

__global__ void fill_float(float *p, size_t n, float v)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = v;
}

/* ---- pools ------------------------------------------------------------------------ */

static bool make_pool(int dev, uint64_t peers, unsigned flags, gm_pool_t **pool)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    GM(gm_config_from_env(&cfg));
    cfg.backend = GM_BACKEND_CUDA;
    cfg.device = dev;
    cfg.peers = peers;
    cfg.flags |= flags;
    GM(gm_pool_create(&cfg, pool));
    return true;
}

/* ---- peer copies -------------------------------------------------------------------- */

struct peer_result {
    double ce = -1, kernel = -1;
    bool correct = false;
};

/* One copy of n bytes from src (device 0) to dst (device 1) on device 1's
 * stream s1: by the copy engine (kernel false) or by a kernel on device 1;
 * GB/s. */
static bool copy_once(void *src, void *dst, size_t n, cudaStream_t s1, bool kernel, int sms,
                      double *gbps)
{
    CU(cudaStreamSynchronize(s1));
    double t0 = now();
    if (kernel) {
        copy_kernel<<<sms * 4, 512, 0, s1>>>((const float4 *)src, (float4 *)dst, n / 16);
        CU(cudaGetLastError());
    } else {
        CU(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, s1));
    }
    CU(cudaStreamSynchronize(s1));
    *gbps = n / (now() - t0) / 1e9;
    return true;
}

/* GPU 0 -> GPU 1, 1 GiB: gpumem blocks (pools with each other as peers)
 * and cudaMalloc buffers (peer access enabled both ways), copies of the two
 * kinds interleaved so both see the same machine; median of 10 each after
 * one untimed. */
static bool bench_peer(peer_result *gm_r, peer_result *cm_r)
{
    gm_pool_t *p0, *p1;
    if (!make_pool(0, 1u << 1, 0, &p0) || !make_pool(1, 1u << 0, 0, &p1)) return false;
    void *src[2], *dst[2];
    GM(gm_alloc(p0, GiB, NULL, &src[0]));
    GM(gm_alloc(p1, GiB, NULL, &dst[0]));
    CU(cudaSetDevice(0));
    CU(cudaMalloc(&src[1], GiB));
    cudaError_t e = cudaDeviceEnablePeerAccess(1, 0);
    if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) CU(e);
    CU(cudaMemset(src[0], 0x5a, GiB));
    CU(cudaMemset(src[1], 0x5a, GiB));
    CU(cudaDeviceSynchronize());
    CU(cudaSetDevice(1));
    CU(cudaMalloc(&dst[1], GiB));
    e = cudaDeviceEnablePeerAccess(0, 0);
    if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) CU(e);
    cudaStream_t s1;
    CU(cudaStreamCreate(&s1));
    int sms = 0;
    CU(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 1));
    std::vector<double> v[2][2]; /* [gpumem, cudaMalloc][copy engine, kernel] */
    for (int i = 0; i < 11; i++)
        for (int k = 0; k < 2; k++)
            for (int m = 0; m < 2; m++) {
                double g;
                if (!copy_once(src[m], dst[m], GiB, s1, k == 1, sms, &g)) return false;
                if (i) v[m][k].push_back(g);
            }
    peer_result *r[2] = {gm_r, cm_r};
    for (int m = 0; m < 2; m++) {
        unsigned char probe[256];
        CU(cudaMemcpy(probe, (char *)dst[m] + GiB - sizeof probe, sizeof probe, cudaMemcpyDeviceToHost));
        r[m]->correct = probe[0] == 0x5a && probe[255] == 0x5a;
        r[m]->ce = median(v[m][0]);
        r[m]->kernel = median(v[m][1]);
    }
    CU(cudaStreamDestroy(s1));
    CU(cudaFree(dst[1]));
    CU(cudaSetDevice(0));
    CU(cudaFree(src[1]));
    gm_free(p0, src[0], NULL);
    gm_free(p1, dst[0], NULL);
    gm_pool_destroy(p0);
    gm_pool_destroy(p1);
    return true;
}

/* The child's run: a kernel on GPU 1 reads a block of a pool of GPU 0 made
 * without peers.  Prints what CUDA said; exit 0 when the kernel ran without
 * an error (access without a grant), 3 when it failed. */
static int no_peer_child(void)
{
    gm_pool_t *p0;
    if (!make_pool(0, 0, 0, &p0)) return 2;
    void *src, *dst;
    if (gm_alloc(p0, 64 * MiB, NULL, &src) != GM_OK) return 2;
    if (cudaSetDevice(1) != cudaSuccess || cudaMalloc(&dst, 64 * MiB) != cudaSuccess) return 2;
    copy_kernel<<<64, 256>>>((const float4 *)src, (float4 *)dst, 64 * MiB / 16);
    cudaError_t e = cudaDeviceSynchronize();
    printf("%s\n", e == cudaSuccess ? "no error" : cudaGetErrorString(e));
    return e == cudaSuccess ? 0 : 3;
}

/* ---- access grants ------------------------------------------------------------------- */

static bool bench_grant(uint64_t peers, double *ms_per_gib)
{
    gm_pool_t *p;
    if (!make_pool(0, peers, 0, &p)) return false;
    std::vector<void *> v;
    double t0 = now();
    for (int i = 0; i < 64; i++) {
        void *b;
        GM(gm_alloc(p, 64 * MiB, NULL, &b));
        v.push_back(b);
    }
    double t = now() - t0;
    for (void *b : v) gm_free(p, b, NULL);
    gm_pool_destroy(p);
    *ms_per_gib = t * 1e3 / 4;
    return true;
}

/* ---- all-reduce ------------------------------------------------------------------------ */

enum { K_GM_REG, K_GM_PLAIN, K_NCCLMEM, K_CUDAMALLOC, K_N };
static const char *kind_name[K_N] = {"gpumem_registered", "gpumem_plain", "ncclMemAlloc", "cudaMalloc"};
static const size_t ar_sizes[3] = {MiB, 64 * MiB, GiB};
static const char *ar_size_name[3] = {"1MiB", "64MiB", "1GiB"};
static const int ar_iters[3] = {200, 40, 8};

static ncclComm_t g_comm[2];
static int g_registered[2]; /* hook calls that succeeded */

static int reg_hook(void *user, void *ptr, size_t size, void **handle)
{
    ncclComm_t c = (ncclComm_t)user;
    int r = nccl.CommRegister(c, ptr, size, handle);
    if (r != 0) {
        fprintf(stderr, "ncclCommRegister(%p, %zu): %s\n", ptr, size, nccl.GetErrorString(r));
        return GM_BACKEND;
    }
    for (int d = 0; d < 2; d++)
        if (g_comm[d] == c) g_registered[d]++;
    return GM_OK;
}

static void dereg_hook(void *user, void *ptr, size_t size, void *handle)
{
    (void)ptr, (void)size;
    nccl.CommDeregister((ncclComm_t)user, handle);
}

struct ar_bufs {
    void *send[2], *recv[2];
    void *reg[2][2]; /* ncclMemAlloc: registration handles */
};

static bool ar_run(ar_bufs *b, size_t bytes, int iters, cudaStream_t *s, double *busbw, bool *correct)
{
    size_t count = bytes / sizeof(float);
    for (int d = 0; d < 2; d++) {
        CU(cudaSetDevice(d));
        fill_float<<<256, 256, 0, s[d]>>>((float *)b->send[d], count, (float)(d + 1));
        CU(cudaGetLastError());
    }
    auto once = [&]() -> bool {
        NC(nccl.GroupStart());
        for (int d = 0; d < 2; d++)
            NC(nccl.AllReduce(b->send[d], b->recv[d], count, NCCL_FLOAT32, NCCL_SUM, g_comm[d], s[d]));
        NC(nccl.GroupEnd());
        return true;
    };
    for (int i = 0; i < 5; i++)
        if (!once()) return false;
    for (int d = 0; d < 2; d++) CU(cudaStreamSynchronize(s[d]));
    std::vector<double> runs;
    for (int r = 0; r < 3; r++) {
        double t0 = now();
        for (int i = 0; i < iters; i++)
            if (!once()) return false;
        for (int d = 0; d < 2; d++) {
            CU(cudaSetDevice(d));
            CU(cudaStreamSynchronize(s[d]));
        }
        double t = (now() - t0) / iters;
        runs.push_back(bytes / t / 1e9 * 2.0 * (2 - 1) / 2);
    }
    *busbw = median(runs);
    float got[2] = {0, 0};
    for (int d = 0; d < 2; d++) {
        CU(cudaSetDevice(d));
        CU(cudaMemcpy(&got[d], (char *)b->recv[d] + bytes - sizeof(float), sizeof(float),
                      cudaMemcpyDeviceToHost));
    }
    *correct = got[0] == 3.0f && got[1] == 3.0f;
    return true;
}

static bool ar_alloc(int kind, gm_pool_t **pools, size_t bytes, ar_bufs *b)
{
    memset(b, 0, sizeof *b);
    for (int d = 0; d < 2; d++) {
        CU(cudaSetDevice(d));
        void **pp[2] = {&b->send[d], &b->recv[d]};
        for (int k = 0; k < 2; k++) {
            switch (kind) {
            case K_GM_REG: GM(gm_alloc_registrable(pools[d], bytes, NULL, pp[k])); break;
            case K_GM_PLAIN: GM(gm_alloc(pools[d], bytes, NULL, pp[k])); break;
            case K_NCCLMEM:
                NC(nccl.MemAlloc(pp[k], bytes));
                NC(nccl.CommRegister(g_comm[d], *pp[k], bytes, &b->reg[d][k]));
                break;
            default: CU(cudaMalloc(pp[k], bytes));
            }
        }
    }
    return true;
}

static bool ar_free(int kind, gm_pool_t **pools, ar_bufs *b)
{
    for (int d = 0; d < 2; d++) {
        CU(cudaSetDevice(d));
        CU(cudaDeviceSynchronize());
        void *pp[2] = {b->send[d], b->recv[d]};
        for (int k = 0; k < 2; k++) {
            if (!pp[k]) continue;
            switch (kind) {
            case K_GM_REG:
            case K_GM_PLAIN: GM(gm_free(pools[d], pp[k], NULL)); break;
            case K_NCCLMEM:
                NC(nccl.CommDeregister(g_comm[d], b->reg[d][k]));
                NC(nccl.MemFree(pp[k]));
                break;
            default: CU(cudaFree(pp[k]));
            }
        }
    }
    return true;
}

/* ---- compression -------------------------------------------------------------------- */

static bool copy_rate(gm_pool_t *p, bool random, double *gbps)
{
    void *a, *b;
    GM(gm_alloc(p, GiB, NULL, &a));
    GM(gm_alloc(p, GiB, NULL, &b));
    CU(cudaSetDevice(0));
    if (random) fill_random<<<1024, 256>>>((uint32_t *)a, GiB / 4, 12345);
    else CU(cudaMemset(a, 0, GiB));
    CU(cudaDeviceSynchronize());
    std::vector<double> v;
    for (int i = 0; i < 11; i++) {
        double t0 = now();
        CU(cudaMemcpyAsync(b, a, GiB, cudaMemcpyDeviceToDevice, 0));
        CU(cudaDeviceSynchronize());
        if (i) v.push_back(2.0 * GiB / (now() - t0) / 1e9); /* read + write */
    }
    *gbps = median(v);
    gm_free(p, a, NULL);
    gm_free(p, b, NULL);
    return true;
}

/* ---- main -------------------------------------------------------------------------------- */

static void jnum(FILE *f, double v)
{
    if (v < 0) fputs("null", f);
    else fprintf(f, "%.2f", v);
}

static void jstr(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', f);
        if ((unsigned char)*s >= 0x20) fputc(*s, f);
    }
    fputc('"', f);
}

int main(int argc, char **argv)
{
    const char *json = NULL, *md = NULL, *command = "bench/multigpu_bench";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-peer-child")) return no_peer_child();
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--md") && i + 1 < argc) md = argv[++i];
        else if (!strcmp(argv[i], "--command") && i + 1 < argc) command = argv[++i];
        else {
            fprintf(stderr, "usage: multigpu_bench [--json FILE] [--md FILE] [--command TEXT]\n");
            return 2;
        }
    }
    /* Before CUDA starts here: the child that faults. */
    char no_peer[256] = "not run";
    int no_peer_faulted = -1;
    {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "/proc/%d/exe --no-peer-child 2>&1", (int)getpid());
        FILE *p = popen(cmd, "r");
        if (p) {
            if (!fgets(no_peer, sizeof no_peer, p)) snprintf(no_peer, sizeof no_peer, "no output");
            no_peer[strcspn(no_peer, "\n")] = 0;
            int st = pclose(p);
            no_peer_faulted = WIFEXITED(st) && WEXITSTATUS(st) == 3;
        }
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 2) {
        fprintf(stderr, "multigpu_bench: needs two GPUs (%d visible)\n", ndev);
        return 1;
    }
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    int p01 = 0, p10 = 0;
    cudaDeviceCanAccessPeer(&p01, 0, 1);
    cudaDeviceCanAccessPeer(&p10, 1, 0);

    peer_result gp, cp;
    bool peer_ok = bench_peer(&gp, &cp);
    double grant_own = -1, grant_peer = -1;
    bool grant_ok = bench_grant(0, &grant_own) && bench_grant(1u << 1, &grant_peer);

    /* All-reduce. */
    double busbw[K_N][3];
    bool correct[K_N][3];
    for (int k = 0; k < K_N; k++)
        for (int s = 0; s < 3; s++) busbw[k][s] = -1, correct[k][s] = false;
    std::string nccl_why;
    int nccl_version = 0;
    bool nccl_ok = nccl_load(nccl_why);
    gm_device_info_t di0 = GM_DEVICE_INFO_INIT;
    if (!nccl_ok) fail("NCCL", nccl_why.c_str());
    if (nccl_ok) {
        nccl.GetVersion(&nccl_version);
        int devs[2] = {0, 1};
        gm_pool_t *pools[2] = {NULL, NULL};
        cudaStream_t s[2];
        if (nccl.CommInitAll(g_comm, 2, devs) != 0) {
            fail("ncclCommInitAll", "failed");
            nccl_ok = false;
        }
        for (int d = 0; nccl_ok && d < 2; d++) {
            cudaSetDevice(d);
            cudaStreamCreate(&s[d]);
            if (!make_pool(d, 1u << (1 - d), GM_POOL_NCCL, &pools[d])) nccl_ok = false;
            gm_register_hooks_t hooks = {reg_hook, dereg_hook, g_comm[d]};
            if (nccl_ok && gm_pool_set_register_hooks(pools[d], &hooks) != GM_OK) {
                fail("gm_pool_set_register_hooks", gm_last_error());
                nccl_ok = false;
            }
        }
        if (nccl_ok) gm_pool_device_info(pools[0], &di0);
        for (int k = 0; nccl_ok && k < K_N; k++)
            for (int z = 0; z < 3; z++) {
                ar_bufs b;
                printf("multigpu_bench: all-reduce %s %s\n", kind_name[k], ar_size_name[z]); /* in NCCL's stream */
                bool ok = ar_alloc(k, pools, ar_sizes[z], &b) &&
                          ar_run(&b, ar_sizes[z], ar_iters[z], s, &busbw[k][z], &correct[k][z]);
                ar_free(k, pools, &b);
                if (!ok) break;
            }
        for (int d = 0; d < 2; d++) {
            if (pools[d]) {
                gm_pool_set_register_hooks(pools[d], NULL);
                gm_pool_destroy(pools[d]);
            }
        }
        if (nccl_ok)
            for (int d = 0; d < 2; d++) nccl.CommDestroy(g_comm[d]);
    }

    /* Compression. */
    gm_pool_t *pc = NULL, *pp = NULL;
    bool comp_supported = false;
    char comp_why[300] = "";
    double comp[2][2] = {{-1, -1}, {-1, -1}}; /* [compressible][random] */
    {
        gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
        gm_config_from_env(&cfg);
        cfg.backend = GM_BACKEND_CUDA;
        cfg.flags |= GM_POOL_COMPRESSIBLE;
        int rc = gm_pool_create(&cfg, &pc);
        comp_supported = rc == GM_OK;
        if (rc != GM_OK) snprintf(comp_why, sizeof comp_why, "%s", gm_last_error());
        if (make_pool(0, 0, 0, &pp)) {
            for (int r = 0; r < 2; r++) {
                copy_rate(pp, r, &comp[0][r]);
                if (pc) copy_rate(pc, r, &comp[1][r]);
            }
        }
        if (pc) gm_pool_destroy(pc);
        if (pp) gm_pool_destroy(pp);
    }

    /* Results. */
    time_t t = time(NULL);
    char date[32];
    strftime(date, sizeof date, "%Y-%m-%d", gmtime(&t));
    const char *commit = getenv("GM_COMMIT");
    FILE *f = json ? fopen(json, "w") : stdout;
    if (!f) return 1;
    fprintf(f, "{\"bench\":\"multigpu\",\"date\":\"%s\",\"command\":", date);
    jstr(f, command);
    fprintf(f, ",\"commit\":");
    jstr(f, commit ? commit : "unknown");
    fprintf(f, ",\"gpu\":");
    jstr(f, prop.name);
    fprintf(f, ",\"gpus\":%d,\"can_access_peer\":%s,\"nccl_version\":%d", ndev,
            p01 && p10 ? "true" : "false", nccl_version);
    fprintf(f, ",\"peer_copy_GBps\":");
    jnum(f, peer_ok ? gp.ce : -1);
    fprintf(f, ",\"cudamalloc_peer_copy_GBps\":");
    jnum(f, peer_ok ? cp.ce : -1);
    fprintf(f, ",\"peer_kernel_GBps\":");
    jnum(f, peer_ok ? gp.kernel : -1);
    fprintf(f, ",\"cudamalloc_peer_kernel_GBps\":");
    jnum(f, peer_ok ? cp.kernel : -1);
    fprintf(f, ",\"peer_copy_correct\":%s", peer_ok && gp.correct && cp.correct ? "true" : "false");
    fprintf(f, ",\"no_peer_kernel\":{\"faulted\":%s,\"cuda_said\":",
            no_peer_faulted < 0 ? "null" : no_peer_faulted ? "true" : "false");
    jstr(f, no_peer);
    fprintf(f, "},\"access_grant_ms_per_GiB\":{\"own\":");
    jnum(f, grant_ok ? grant_own : -1);
    fprintf(f, ",\"one_peer\":");
    jnum(f, grant_ok ? grant_peer : -1);
    fprintf(f, "},\"nccl_pool\":{\"handle_types\":%u,\"rdma_capable\":%d,\"granularity\":%zu,"
            "\"granularity_recommended\":%zu,\"registered_segments\":%d}",
            di0.handle_types, di0.rdma_capable, di0.granularity, di0.granularity_recommended,
            g_registered[0] + g_registered[1]);
    fprintf(f, ",\"allreduce_busbw_GBps\":{");
    for (int k = 0; k < K_N; k++) {
        fprintf(f, "%s\"%s\":{", k ? "," : "", kind_name[k]);
        for (int z = 0; z < 3; z++) {
            fprintf(f, "%s\"%s\":", z ? "," : "", ar_size_name[z]);
            jnum(f, busbw[k][z]);
        }
        fputc('}', f);
    }
    bool all_correct = nccl_ok;
    for (int k = 0; k < K_N; k++)
        for (int z = 0; z < 3; z++) all_correct = all_correct && correct[k][z];
    fprintf(f, "},\"allreduce_correct\":%s", all_correct ? "true" : "false");
    fprintf(f, ",\"compression_supported\":%s,\"compression\":{", comp_supported ? "true" : "false");
    fprintf(f, "\"plain_zeros_GBps\":");
    jnum(f, comp[0][0]);
    fprintf(f, ",\"plain_random_GBps\":");
    jnum(f, comp[0][1]);
    fprintf(f, ",\"compressible_zeros_GBps\":");
    jnum(f, comp[1][0]);
    fprintf(f, ",\"compressible_random_GBps\":");
    jnum(f, comp[1][1]);
    fprintf(f, ",\"why_not\":");
    jstr(f, comp_why);
    fprintf(f, "},\"ok\":%s,\"errors\":[", g_errors.empty() ? "true" : "false");
    for (size_t i = 0; i < g_errors.size(); i++) {
        if (i) fputc(',', f);
        jstr(f, g_errors[i].c_str());
    }
    fprintf(f, "]}\n");
    if (json) fclose(f);

    if (md) {
        FILE *m = fopen(md, "w");
        if (m) {
            fprintf(m, "# Several GPUs: %s x%d, %s\n\n", prop.name, ndev, date);
            fprintf(m, "Command: `%s`; commit %s; NCCL %d.\n\n", command, commit ? commit : "unknown",
                    nccl_version);
            fprintf(m, "| peer copy, 1 GiB, GPU 0 to GPU 1 | gpumem (peers) | cudaMalloc (peer access) |\n|---|---|---|\n");
            fprintf(m, "| copy engine, GB/s | %.1f | %.1f |\n", gp.ce, cp.ce);
            fprintf(m, "| kernel on GPU 1, GB/s | %.1f | %.1f |\n\n", gp.kernel, cp.kernel);
            fprintf(m, "A kernel on GPU 1 reading a gpumem block of a pool without peers: %s (%s).\n\n",
                    no_peer_faulted > 0 ? "faults" : no_peer_faulted == 0 ? "runs" : "not run", no_peer);
            fprintf(m, "Access grants, 4 GiB in 64 MiB blocks in a fresh pool: %.1f ms/GiB own device only, "
                    "%.1f ms/GiB with one peer.\n\n", grant_own, grant_peer);
            fprintf(m, "| all-reduce bus bandwidth, GB/s | 1 MiB | 64 MiB | 1 GiB |\n|---|---|---|---|\n");
            for (int k = 0; k < K_N; k++)
                fprintf(m, "| %s | %.1f | %.1f | %.1f |\n", kind_name[k], busbw[k][0], busbw[k][1],
                        busbw[k][2]);
            fprintf(m, "\nResults correct: %s.  Segments registered through the hooks: %d.\n\n",
                    all_correct ? "yes" : "NO", g_registered[0] + g_registered[1]);
            fprintf(m, "Compression supported: %s%s%s.  D2D copy of 1 GiB (read + write), GB/s: plain "
                    "zeros %.0f, plain random %.0f, compressible zeros %.0f, compressible random %.0f.\n",
                    comp_supported ? "yes" : "no", comp_supported ? "" : " — ", comp_why, comp[0][0],
                    comp[0][1], comp[1][0], comp[1][1]);
            if (!g_errors.empty()) {
                fprintf(m, "\nFailures:\n");
                for (auto &e : g_errors) fprintf(m, "- %s\n", e.c_str());
            }
            fclose(m);
        }
    }
    return g_errors.empty() ? 0 : 1;
}
