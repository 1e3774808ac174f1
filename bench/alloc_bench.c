/* SPDX-License-Identifier: Apache-2.0 */
/*
 * alloc_bench.c — the side-by-side allocator benchmark on a real GPU:
 * gpumem (gm_alloc/gm_free, cuda backend), cudaMalloc/cudaFree,
 * cudaMallocAsync/cudaFreeAsync on a warm pool that never releases, and
 * PyTorch's caching allocator through bench/torch_shim.cpp (loaded with
 * dlopen, so this file builds without libtorch).
 *
 * The one idea: every allocator is driven through the same four calls
 * (alloc, free, reset, stats) by the same loops over the same precomputed
 * operation sequences, and each process measures one allocator, so no
 * allocator's cache can disturb another's figures.  The driver script
 * (bench/run_alloc_bench.sh) runs this once per allocator and merges the
 * JSON parts.  See bench/README.md for what each measurement means.
 *
 * usage: alloc_bench --allocator gpumem|cudaMalloc|cudaMallocAsync|torch
 *                    [--name NAME] [--torch-shim LIB.so] [--traces DIR]
 *                    [--mix-ops N] [--seed N] [--json FILE] [--quick]
 */
#include <dirent.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "gpumem.h"
#include "lib/replay_step.h"
#include "lib/trace_read.h"
#include "mix.h"

#define MAX_TRACES 32
#define N_THREADS 16
#define TRACE_PASSES 3

/* ---- small helpers ------------------------------------------------------ */

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "alloc_bench: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

/* Every CUDA runtime call goes through this: a failure we cannot work around
 * ends the process (its partial JSON is already on disk). */
#define CK(call)                                                               \
    do {                                                                       \
        cudaError_t e_ = (call);                                               \
        if (e_ != cudaSuccess)                                                 \
            die("%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
    } while (0)

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ---- the allocators ---------------------------------------------------- */

/* One allocator under test.  alloc/free return 0 on success.  reset: every
 * block is already freed; give cached memory back and reset the peaks.
 * reserved_peak: bytes held from the device since the last reset (0 when the
 * allocator cannot say).  calls: a counter of driver calls (or its proxy)
 * that only grows; calls_label says what it counts. */
typedef struct allocator {
    const char *name;
    const char *calls_label;
    int (*alloc)(size_t size, cudaStream_t s, void **p);
    int (*free)(void *p, size_t size, cudaStream_t s);
    void (*reset)(void);
    uint64_t (*reserved_peak)(void);
    uint64_t (*allocated_peak)(void); /* the allocator's own figure; 0: none */
    uint64_t (*calls)(void);
    void (*track_calls)(int on);      /* optional: count only while on */
} allocator_t;

static int g_device;

/* gpumem */
static gm_pool_t *g_pool;
static unsigned g_heaps; /* 0: the environment's (GPUMEM_HEAPS, default 1) */
static double g_slack;   /* > 0: reserve_slack and reserve_slack_max (the thread run's third pass) */

static void gm_fail(const char *what, int rc)
{
    die("%s: %s (%s)", what, gm_errname(rc), gm_last_error());
}

static void gpumem_open(void)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    int rc = gm_config_from_env(&cfg);
    if (rc) gm_fail("gm_config_from_env", rc);
    cfg.backend = GM_BACKEND_CUDA;
    cfg.device = g_device;
    if (g_heaps) cfg.heaps = g_heaps;
    if (g_slack > 0) cfg.reserve_slack = cfg.reserve_slack_max = g_slack;
    if ((rc = gm_pool_create(&cfg, &g_pool))) gm_fail("gm_pool_create", rc);
}
static int gpumem_alloc(size_t n, cudaStream_t s, void **p) { return gm_alloc(g_pool, n, (gm_stream_t)s, p); }
static int gpumem_free(void *p, size_t n, cudaStream_t s) { (void)n; return gm_free(g_pool, p, (gm_stream_t)s); }
static void gpumem_reset(void)
{
    /* A fresh pool, as `gpumem replay` uses per trace. */
    CK(cudaDeviceSynchronize());
    gm_pool_destroy(g_pool);
    g_pool = NULL;
    gpumem_open();
}
static gm_stats_t gpumem_stats(void)
{
    gm_stats_t st = GM_STATS_INIT;
    int rc = gm_pool_stats(g_pool, &st);
    if (rc) gm_fail("gm_pool_stats", rc);
    return st;
}
static uint64_t gpumem_reserved_peak(void) { return gpumem_stats().reserved_peak; }
static uint64_t gpumem_allocated_peak(void) { return gpumem_stats().allocated_peak; }
static uint64_t gpumem_calls(void)
{
    gm_stats_t st = gpumem_stats();
    uint64_t n = 0;
    for (int k = 0; k < GM_CALL_COUNT; k++) n += st.backend_calls[k];
    return n;
}

/* Backend calls by kind between two snapshots, "map=3 set_access=3 ...". */
static void gpumem_kinds(const gm_stats_t *a, const gm_stats_t *b, char *buf, size_t cap)
{
    size_t at = 0;
    buf[0] = 0;
    for (int k = 0; k < GM_CALL_COUNT && at + 1 < cap; k++)
        if (b->backend_calls[k] != a->backend_calls[k])
            at += (size_t)snprintf(buf + at, cap - at, "%s%s=%llu", at ? " " : "", gm_call_name(k),
                                   (unsigned long long)(b->backend_calls[k] - a->backend_calls[k]));
    if (at >= cap) buf[cap - 1] = 0;
}

/* cudaMalloc: no cache; each alloc and each free is one driver call. */
static uint64_t cm_calls_n, cm_used_base, cm_used_peak;
static int cm_track_mem;
static int cm_alloc(size_t n, cudaStream_t s, void **p)
{
    (void)s;
    cudaError_t e = cudaMalloc(p, n);
    __atomic_add_fetch(&cm_calls_n, 1, __ATOMIC_RELAXED);
    if (e != cudaSuccess) { (void)cudaGetLastError(); return 1; }
    if (cm_track_mem) {
        size_t fr, tot;
        CK(cudaMemGetInfo(&fr, &tot));
        if (tot - fr > cm_used_peak) cm_used_peak = tot - fr;
    }
    return 0;
}
static int cm_free(void *p, size_t n, cudaStream_t s)
{
    (void)n, (void)s;
    __atomic_add_fetch(&cm_calls_n, 1, __ATOMIC_RELAXED);
    return cudaFree(p) != cudaSuccess;
}
static void cm_reset(void)
{
    size_t fr, tot;
    CK(cudaDeviceSynchronize());
    CK(cudaMemGetInfo(&fr, &tot));
    cm_used_base = cm_used_peak = tot - fr;
}
/* Device memory in use (cudaMemGetInfo) above the level at reset, tracked
 * only while cm_track_mem is set (trace replay); 0 otherwise. */
static uint64_t cm_reserved_peak(void) { return cm_track_mem ? cm_used_peak - cm_used_base : 0; }
static uint64_t cm_reserved_peak_saved;
static uint64_t cm_none(void) { return 0; }
static uint64_t cm_calls(void) { return __atomic_load_n(&cm_calls_n, __ATOMIC_RELAXED); }

/* cudaMallocAsync on the device's default pool, release threshold UINT64_MAX. */
static cudaMemPool_t g_mempool;
static int ma_track;
static uint64_t ma_growths, ma_last_reserved;
static uint64_t ma_attr(enum cudaMemPoolAttr a)
{
    uint64_t v = 0;
    CK(cudaMemPoolGetAttribute(g_mempool, a, &v));
    return (uint64_t)v;
}
static void ma_open(void)
{
    CK(cudaDeviceGetDefaultMemPool(&g_mempool, g_device));
    uint64_t thr = UINT64_MAX;
    CK(cudaMemPoolSetAttribute(g_mempool, cudaMemPoolAttrReleaseThreshold, &thr));
}
static int ma_alloc(size_t n, cudaStream_t s, void **p)
{
    cudaError_t e = cudaMallocAsync(p, n, s);
    if (e != cudaSuccess) { (void)cudaGetLastError(); return 1; }
    if (ma_track) {
        uint64_t r = ma_attr(cudaMemPoolAttrReservedMemCurrent);
        if (r > ma_last_reserved) ma_growths++;
        ma_last_reserved = r;
    }
    return 0;
}
static int ma_free(void *p, size_t n, cudaStream_t s) { (void)n; return cudaFreeAsync(p, s) != cudaSuccess; }
static void ma_reset(void)
{
    CK(cudaDeviceSynchronize());
    CK(cudaMemPoolTrimTo(g_mempool, 0));
    uint64_t zero = 0;
    CK(cudaMemPoolSetAttribute(g_mempool, cudaMemPoolAttrReservedMemHigh, &zero));
    CK(cudaMemPoolSetAttribute(g_mempool, cudaMemPoolAttrUsedMemHigh, &zero));
}
static uint64_t ma_reserved_peak(void) { return ma_attr(cudaMemPoolAttrReservedMemHigh); }
static uint64_t ma_used_peak(void) { return ma_attr(cudaMemPoolAttrUsedMemHigh); }
static uint64_t ma_calls(void) { return ma_growths; }
static void ma_track_calls(int on)
{
    ma_track = on;
    ma_last_reserved = ma_attr(cudaMemPoolAttrReservedMemCurrent);
}

/* torch, through the shim (bench/torch_shim.cpp). */
static struct {
    int (*init)(int device);
    int (*alloc)(size_t n, void *stream, void **p);
    int (*free)(void *p);
    void (*reset)(void);
    void (*stats)(uint64_t out[6]); /* reserved peak, allocated peak, requested peak,
                                       segments allocated, segments freed, alloc retries */
    const char *(*config)(void);
} ts;
static uint64_t ts_stat(int i)
{
    uint64_t v[6];
    ts.stats(v);
    return v[i];
}
static int torch_alloc(size_t n, cudaStream_t s, void **p) { return ts.alloc(n, (void *)s, p); }
static int torch_free(void *p, size_t n, cudaStream_t s) { (void)n, (void)s; return ts.free(p); }
static void torch_reset(void) { CK(cudaDeviceSynchronize()); ts.reset(); }
static uint64_t torch_reserved_peak(void) { return ts_stat(0); }
static uint64_t torch_allocated_peak(void) { return ts_stat(1); }
static uint64_t torch_calls(void) { return ts_stat(3) + ts_stat(4); }
static void torch_load(const char *lib)
{
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) die("dlopen %s: %s", lib, dlerror());
#define SYM(field, name)                                                       \
    do {                                                                       \
        *(void **)&ts.field = dlsym(h, name);                                  \
        if (!ts.field) die("%s: no symbol %s", lib, name);                     \
    } while (0)
    SYM(init, "torch_shim_init");
    SYM(alloc, "torch_shim_alloc");
    SYM(free, "torch_shim_free");
    SYM(reset, "torch_shim_reset");
    SYM(stats, "torch_shim_stats");
    SYM(config, "torch_shim_config");
#undef SYM
    if (ts.init(g_device)) die("torch_shim_init failed");
}

static allocator_t A;

/* ---- JSON part ---------------------------------------------------------- */

/* The figures this process measured; -1 = not measured. */
static const size_t pair_sizes[] = {512, 64 << 10, 2 << 20, 64 << 20, (size_t)1 << 30};
static const char *pair_names[] = {"512B", "64KiB", "2MiB", "64MiB", "1GiB"};
#define N_PAIR (sizeof pair_sizes / sizeof pair_sizes[0])
static double r_pair[N_PAIR];
static double r_mix_ns = -1, r_mix_cold_ns = -1, r_mix_ratio = -1, r_mix_ratio_own = -1;
static uint64_t r_mix_ops, r_mix_req_peak, r_mix_res_peak;
static double r_t1_ops = -1, r_t16_ops = -1;
static unsigned r_heaps;                                  /* gpumem: heaps of the thread run */
static double r_t16_calls[3] = {-1, -1, -1};              /* gpumem: backend calls in a timed 16-thread run, median of the rounds */
static double r_t16_calls_first[3] = {-1, -1, -1};        /* ... in the first timed round */
/* The 16-thread speedups: the median of THREAD_ROUNDS timed rounds (each
 * one thread's ops/s, then 16 threads'), the first round's (the figure of
 * earlier runs: the second run of each), and every round's; [0] gpumem's
 * one heap, [1] the leading figure (gpumem: 16 heaps; the other
 * allocators: theirs), [2] gpumem's 16 heaps with THREAD_SLACK. */
#define THREAD_ROUNDS 7 /* ALLOC_BENCH_THREAD_ROUNDS overrides it */
#define MAX_ROUNDS 16
static int thread_rounds = THREAD_ROUNDS;
/* Untimed runs of each (one thread, then 16) before the rounds: they warm
 * the caches and let a pool grow to what the threads need.  Their speedups
 * are kept (threads16_speedup_warmups) but are not the figure. */
#define THREAD_WARMUPS 3 /* ALLOC_BENCH_THREAD_WARMUPS overrides it */
static int thread_warmups = THREAD_WARMUPS;
static double r_sp_warm[MAX_ROUNDS];
static double r_sp[3] = {-1, -1, -1}, r_sp_first[3] = {-1, -1, -1};
static double r_sp_rounds[3][MAX_ROUNDS];
static double r_ceil = -1, r_ceil_rounds[MAX_ROUNDS];          /* host ceiling: median, rounds */
/* The rates each round's speedups divide, ops/s: the leading pass's one
 * thread and 16 threads, and the ceiling loop's (which of the two moves
 * when a round's speedup does). */
static double r_one_rounds[MAX_ROUNDS], r_all_rounds[MAX_ROUNDS];
static double r_ceil1_rounds[MAX_ROUNDS], r_ceil16_rounds[MAX_ROUNDS];
/* The same speedups over one thread's mean rate on each of 16 CPUs (see
 * cpus_find): gpumem's 16 heaps (or the allocator), the ceiling loop, and
 * the one over the other; medians of the rounds, and every round's. */
static double r_sp_cpu = -1, r_sp_cpu_rounds[MAX_ROUNDS];
static double r_ceil_cpu = -1, r_ceil_cpu_rounds[MAX_ROUNDS];
static double r_of_ceil_cpu = -1, r_of_ceil_cpu_rounds[MAX_ROUNDS];
static double r_cpu_one[N_THREADS][MAX_ROUNDS], r_cpu_ceil[N_THREADS][MAX_ROUNDS];
static int cpu_list[N_THREADS], n_cpus; /* 0: fewer than 16 CPUs, or not measured */
/* ALLOC_BENCH_PIN=1: thread t runs on cpu_list[t] only, the allocator's and the ceiling
 * loop's alike (with n_cpus). */
static int pin_threads;
/* Each round's speedup over the ceiling measured in the same round, and
 * their median: threads16_of_ceiling. */
static double r_of_ceil = -1, r_of_ceil_rounds[MAX_ROUNDS];
#define THREAD_SLACK 0.12 /* ALLOC_BENCH_THREAD_SLACK overrides it */
static double thread_slack = THREAD_SLACK;
/* gpumem: the pool's reserved peak over the sum of the threads' requested
 * peaks, after the timed 16-thread run, per pass */
static double r_t16_reserved_ratio[3] = {-1, -1, -1};
static uint64_t r_thread_ops;
static int n_traces;
static char *r_trace_name[MAX_TRACES];
static double r_trace_ratio[MAX_TRACES];
static double r_trace_steady[MAX_TRACES];
static uint64_t r_trace_live[MAX_TRACES], r_trace_res[MAX_TRACES];
static const char *json_path;
static char g_gpu[256];
static const char *g_notes = "";
static char r_mix_kinds[512], r_trace_kinds[MAX_TRACES][512];
static double r_mix_warm_calls = -1, r_mix_backend_ms = -1;
static double r_mix_p50 = -1, r_mix_p99 = -1, r_mix_max = -1;

static void jnum(FILE *f, double v)
{
    if (v < 0 || v != v) fprintf(f, "null");
    else fprintf(f, "%.6g", v);
}

/* ,"key":[v[0],...,v[n-1]], or nulls where measured is false. */
static void jlist(FILE *f, const char *key, const double *v, int n, bool measured)
{
    fprintf(f, ",\"%s\":[", key);
    for (int i = 0; i < n; i++) {
        fprintf(f, "%s", i ? "," : "");
        jnum(f, measured ? v[i] : -1);
    }
    fprintf(f, "]");
}

/* A figure measured per round: "key" (the median of the rounds; -1 when
 * not measured) and "key_rounds" (every round's). */
static void jfigure(FILE *f, const char *key, double med, const double *rounds)
{
    char k[96];
    fprintf(f, ",\"%s\":", key);
    jnum(f, med);
    snprintf(k, sizeof k, "%s_rounds", key);
    jlist(f, k, rounds, thread_rounds, med > 0);
}

/* The median of v[0..n-1] (n >= 1); v is left as it is. */
static double median(const double *v, int n)
{
    double w[MAX_ROUNDS];
    memcpy(w, v, (size_t)n * sizeof *w);
    for (int i = 1; i < n; i++) /* insertion sort: n <= MAX_ROUNDS */
        for (int j = i; j > 0 && w[j - 1] > w[j]; j--) {
            double t = w[j];
            w[j] = w[j - 1];
            w[j - 1] = t;
        }
    return n % 2 ? w[n / 2] : (w[n / 2 - 1] + w[n / 2]) / 2;
}

/* ,"key":{"one_heap":v[0],"heaps":v[1],"heaps_slack":v[2]} (the thread passes) */
static void jpasses(FILE *f, const char *key, const double v[3])
{
    static const char *pass[3] = {"one_heap", "heaps", "heaps_slack"};
    fprintf(f, ",\"%s\":{", key);
    for (int k = 0; k < 3; k++) {
        fprintf(f, "%s\"%s\":", k ? "," : "", pass[k]);
        jnum(f, v[k]);
    }
    fprintf(f, "}");
}

static void write_json(void)
{
    if (!json_path) return;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", json_path);
    FILE *f = fopen(tmp, "w");
    if (!f) die("cannot write %s", tmp);
    fprintf(f, "{\"allocator\":\"%s\",\"gpu\":\"%s\",\"notes\":\"%s\",\n", A.name, g_gpu, g_notes);
    fprintf(f, " \"pair_ns\":{");
    for (size_t i = 0; i < N_PAIR; i++) {
        fprintf(f, "%s\"%s\":", i ? "," : "", pair_names[i]);
        jnum(f, r_pair[i]);
    }
    fprintf(f, "},\n \"mix_ns_per_op\":");
    jnum(f, r_mix_ns);
    fprintf(f, ",\"mix_p50_ns\":");
    jnum(f, r_mix_p50);
    fprintf(f, ",\"mix_p99_ns\":");
    jnum(f, r_mix_p99);
    fprintf(f, ",\"mix_max_ns\":");
    jnum(f, r_mix_max);
    fprintf(f, ",\"mix_cold_ns_per_op\":");
    jnum(f, r_mix_cold_ns);
    fprintf(f, ",\"mix_ops\":%llu,\"mix_ratio\":", (unsigned long long)r_mix_ops);
    jnum(f, r_mix_ratio);
    fprintf(f, ",\"mix_ratio_vs_own_allocated\":");
    jnum(f, r_mix_ratio_own);
    fprintf(f, ",\"mix_requested_peak\":%llu,\"mix_reserved_peak\":%llu,\n",
            (unsigned long long)r_mix_req_peak, (unsigned long long)r_mix_res_peak);
    fprintf(f, " \"threads\":{\"ops_per_thread\":%llu,\"one_thread_ops_per_s\":",
            (unsigned long long)r_thread_ops);
    jnum(f, r_t1_ops);
    fprintf(f, ",\"sixteen_threads_ops_per_s\":");
    jnum(f, r_t16_ops);
    fprintf(f, ",\"rounds\":%d,\"warmups\":%d},\"threads16_speedup\":", thread_rounds, thread_warmups);
    jnum(f, r_sp[1]);
    fprintf(f, ",\"threads16_speedup_first_round\":");
    jnum(f, r_sp_first[1]);
    jlist(f, "threads16_speedup_rounds", r_sp_rounds[1], thread_rounds, r_sp[1] > 0);
    jlist(f, "threads16_speedup_warmups", r_sp_warm, thread_warmups, r_sp[1] > 0);
    fprintf(f, ",\"threads16_heaps\":%u,\"threads16_speedup_one_heap\":", r_heaps);
    jnum(f, r_sp[0]);
    fprintf(f, ",\"threads16_speedup_slack\":");
    jnum(f, r_sp[2]);
    fprintf(f, ",\"threads16_slack\":%g", thread_slack);
    jpasses(f, "threads16_reserved_over_requested", r_t16_reserved_ratio);
    jpasses(f, "threads16_backend_calls", r_t16_calls);
    jpasses(f, "threads16_backend_calls_first_round", r_t16_calls_first);
    jfigure(f, "host_parallel_ceiling", r_ceil, r_ceil_rounds);
    jfigure(f, "threads16_of_ceiling", r_of_ceil, r_of_ceil_rounds);
    jlist(f, "threads16_one_thread_ops_rounds", r_one_rounds, thread_rounds, r_sp[1] > 0);
    jlist(f, "threads16_sixteen_threads_ops_rounds", r_all_rounds, thread_rounds, r_sp[1] > 0);
    jlist(f, "host_ceiling_one_thread_ops_rounds", r_ceil1_rounds, thread_rounds, r_ceil > 0);
    jlist(f, "host_ceiling_sixteen_threads_ops_rounds", r_ceil16_rounds, thread_rounds, r_ceil > 0);
    jfigure(f, "threads16_speedup_cpu_mean", r_sp_cpu, r_sp_cpu_rounds);
    jfigure(f, "host_parallel_ceiling_cpu_mean", r_ceil_cpu, r_ceil_cpu_rounds);
    jfigure(f, "threads16_of_ceiling_cpu_mean", r_of_ceil_cpu, r_of_ceil_cpu_rounds);
    double per_cpu[N_THREADS], per_cpu_ceil[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        per_cpu[i] = i < n_cpus ? median(r_cpu_one[i], thread_rounds) : -1;
        per_cpu_ceil[i] = i < n_cpus ? median(r_cpu_ceil[i], thread_rounds) : -1;
    }
    jlist(f, "one_thread_ops_per_cpu", per_cpu, n_cpus, r_sp_cpu > 0);
    jlist(f, "ceiling_one_thread_ops_per_cpu", per_cpu_ceil, n_cpus, r_sp_cpu > 0);
    fprintf(f, ",\n \"trace_ratio\":{");
    for (int i = 0; i < n_traces; i++) {
        fprintf(f, "%s\"%s\":", i ? "," : "", r_trace_name[i]);
        jnum(f, r_trace_ratio[i]);
    }
    fprintf(f, "},\"trace_peaks\":{");
    for (int i = 0; i < n_traces; i++)
        fprintf(f, "%s\"%s\":{\"live\":%llu,\"reserved\":%llu}", i ? "," : "", r_trace_name[i],
                (unsigned long long)r_trace_live[i], (unsigned long long)r_trace_res[i]);
    fprintf(f, "},\n \"steady_state_driver_calls_by_trace\":{");
    for (int i = 0; i < n_traces; i++) {
        fprintf(f, "%s\"%s\":", i ? "," : "", r_trace_name[i]);
        jnum(f, r_trace_steady[i]);
    }
    double total = 0;
    int any = 0;
    for (int i = 0; i < n_traces; i++)
        if (r_trace_steady[i] >= 0) total += r_trace_steady[i], any = 1;
    fprintf(f, "},\"steady_state_driver_calls\":");
    jnum(f, any ? total : -1);
    fprintf(f, ",\"steady_state_calls_label\":\"%s\",\n \"mix_warm_driver_calls\":", A.calls_label);
    jnum(f, r_mix_warm_calls);
    fprintf(f, ",\"gpumem_mix_warm_calls_by_kind\":\"%s\",\"gpumem_mix_warm_backend_ms\":", r_mix_kinds);
    jnum(f, r_mix_backend_ms);
    fprintf(f, ",\"gpumem_steady_calls_by_kind\":{");
    for (int i = 0; i < n_traces; i++)
        fprintf(f, "%s\"%s\":\"%s\"", i ? "," : "", r_trace_name[i], r_trace_kinds[i]);
    fprintf(f, "}}\n");
    if (fclose(f)) die("cannot write %s", tmp);
    if (rename(tmp, json_path)) die("cannot rename %s", tmp);
}

/* ---- 1. alloc+free pair latency ---------------------------------------- */

static void bench_pairs(cudaStream_t s, int slow)
{
    const int per_batch = slow ? 5 : 2000, batches = 21;
    double *v = malloc(sizeof(double) * batches);
    if (!v) die("out of host memory");
    for (size_t i = 0; i < N_PAIR; i++) {
        int bad = 0;
        for (int b = -1; b < batches && !bad; b++) { /* batch -1 warms up */
            uint64_t t0 = now_ns();
            for (int k = 0; k < per_batch; k++) {
                void *p = NULL;
                if (A.alloc(pair_sizes[i], s, &p) || A.free(p, pair_sizes[i], s)) { bad = 1; break; }
            }
            uint64_t t1 = now_ns();
            if (b >= 0) v[b] = (double)(t1 - t0) / per_batch;
        }
        if (bad) {
            fprintf(stderr, "%s: pair %s failed\n", A.name, pair_names[i]);
            r_pair[i] = -1;
            continue;
        }
        qsort(v, batches, sizeof *v, cmp_double);
        r_pair[i] = v[batches / 2];
        printf("  pair %-6s %10.1f ns\n", pair_names[i], r_pair[i]);
    }
    free(v);
    CK(cudaStreamSynchronize(s));
    write_json();
}

/* ---- 2. random mix -------------------------------------------------------- */

/* The mix of bench/mix.h; ALLOC_BENCH_MIX_MAX: a smaller largest size, for
 * diagnosis (the committed results use the default). */
static mix_t mix_make(size_t n, uint64_t seed)
{
    const char *mm = getenv("ALLOC_BENCH_MIX_MAX");
    double mix_max = mm && atof(mm) >= MIX_MIN ? atof(mm) : MIX_MAX;
    mix_t m;
    if (!mix_fill(&m, n, seed, mix_max)) die("out of host memory");
    return m;
}

typedef struct mix_run {
    const mix_t *m;
    cudaStream_t s;
    uint32_t *lat;               /* non-NULL: each op's own time, ns (saturated) */
    uint64_t ops, wall_ns, req_peak, t_start, t_end;
    int failed;
    pthread_barrier_t *bar;
} mix_run_t;

/* Run the mix; frees whatever is left live afterwards (outside the timing). */
static void mix_exec(mix_run_t *r)
{
    void *ptr[MIX_SLOTS] = {0};
    uint64_t sz[MIX_SLOTS] = {0};
    uint64_t live = 0, peak = 0;
    const mix_t *m = r->m;
    r->failed = 0;
    if (r->bar) pthread_barrier_wait(r->bar);
    uint64_t t0 = now_ns();
    size_t i;
    for (i = 0; i < m->n; i++) {
        uint32_t k = m->slot[i];
        uint64_t o0 = r->lat ? now_ns() : 0;
        if (ptr[k]) {
            if (A.free(ptr[k], sz[k], r->s)) { r->failed = 1; break; }
            ptr[k] = NULL;
            live -= sz[k];
        } else {
            if (A.alloc(m->size[i], r->s, &ptr[k])) { r->failed = 1; ptr[k] = NULL; break; }
            sz[k] = m->size[i];
            live += sz[k];
            if (live > peak) peak = live;
        }
        if (r->lat) {
            uint64_t d = now_ns() - o0;
            r->lat[i] = d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
        }
    }
    uint64_t t1 = now_ns();
    r->t_start = t0, r->t_end = t1;
    r->ops = i;
    r->wall_ns = t1 - t0;
    r->req_peak = peak;
    for (int k = 0; k < MIX_SLOTS; k++)
        if (ptr[k] && A.free(ptr[k], sz[k], r->s)) r->failed = 1;
}

static void bench_mix(cudaStream_t s, size_t nops, uint64_t seed, int cm)
{
    mix_t m = mix_make(nops, seed);
    mix_run_t r = {.m = &m, .s = s};
    /* Cold run from a trimmed allocator: the memory figures. */
    A.reset();
    mix_exec(&r);
    CK(cudaStreamSynchronize(s));
    if (r.failed) {
        fprintf(stderr, "%s: mix failed after %llu ops\n", A.name, (unsigned long long)r.ops);
        goto out;
    }
    r_mix_ops = nops;
    r_mix_cold_ns = (double)r.wall_ns / (double)r.ops;
    r_mix_req_peak = r.req_peak;
    if (cm) {
        r_mix_ratio = 1.0; /* by definition: cudaMalloc holds exactly what is live */
        r_mix_ns = r_mix_cold_ns;
        r_mix_res_peak = r.req_peak;
    } else {
        r_mix_res_peak = A.reserved_peak();
        r_mix_ratio = (double)r_mix_res_peak / (double)r.req_peak;
        uint64_t own = A.allocated_peak();
        if (own) r_mix_ratio_own = (double)r_mix_res_peak / (double)own;
        /* Warm run, same sequence: the speed. */
        gm_stats_t g0 = GM_STATS_INIT, g1 = GM_STATS_INIT;
        if (g_pool) g0 = gpumem_stats();
        if (A.track_calls) A.track_calls(1);
        uint64_t c0 = A.calls();
        mix_exec(&r);
        r_mix_warm_calls = (double)(A.calls() - c0);
        if (A.track_calls) A.track_calls(0);
        if (g_pool) {
            g1 = gpumem_stats();
            gpumem_kinds(&g0, &g1, r_mix_kinds, sizeof r_mix_kinds);
            r_mix_backend_ms = (double)(g1.backend_ns - g0.backend_ns) / 1e6;
            printf("  gpumem warm mix backend calls: %.0f (%s), %.1f ms inside the backend\n", r_mix_warm_calls,
                   r_mix_kinds, r_mix_backend_ms);
        }
        CK(cudaStreamSynchronize(s));
        if (r.failed) {
            fprintf(stderr, "%s: warm mix failed\n", A.name);
            goto out;
        }
        r_mix_ns = (double)r.wall_ns / (double)r.ops;
        /* A third run of the same sequence, each op timed on its own (the
         * clock reads cost ~20-40 ns per op, so this run is not the ns/op
         * figure): the latency distribution, p50 / p99 / max. */
        uint32_t *lat = malloc(nops * sizeof *lat);
        if (lat) {
            r.lat = lat;
            mix_exec(&r);
            r.lat = NULL;
            CK(cudaStreamSynchronize(s));
            if (!r.failed && r.ops) {
                qsort(lat, r.ops, sizeof *lat, cmp_u32);
                r_mix_p50 = lat[r.ops / 2];
                r_mix_p99 = lat[(size_t)((double)r.ops * 0.99)];
                r_mix_max = lat[r.ops - 1];
                printf("  mix latency per op: p50 %.0f ns, p99 %.0f ns, max %.0f ns\n", r_mix_p50,
                       r_mix_p99, r_mix_max);
            }
            free(lat);
        }
    }
    printf("  mix: %zu ops, %.1f ns/op warm (%.1f cold), reserved peak %.3f GB / requested peak %.3f GB = %.4f\n",
           nops, r_mix_ns, r_mix_cold_ns, r_mix_res_peak / 1e9, r_mix_req_peak / 1e9, r_mix_ratio);
out:
    mix_free(&m);
    write_json();
}

/* ---- 3. 16 threads, each on its own stream ----------------------------- */

/* The workers live for a whole pass (a program's threads outlive their
 * allocations): worker t always runs mix t on stream t, so with heaps it
 * always meets the heap it was given at its first allocation. */
static struct workers {
    pthread_t th[N_THREADS];
    mix_run_t r[N_THREADS];
    pthread_barrier_t go, done, start;
    int nt, quit;
} W;

static void *worker_main(void *arg)
{
    int t = (int)(intptr_t)arg;
    for (;;) {
        pthread_barrier_wait(&W.go);
        if (W.quit) return NULL;
        if (t < W.nt) mix_exec(&W.r[t]);
        pthread_barrier_wait(&W.done);
    }
}

static void workers_start(mix_t *mixes, cudaStream_t *streams)
{
    memset(&W, 0, sizeof W);
    if (pthread_barrier_init(&W.go, NULL, N_THREADS + 1) || pthread_barrier_init(&W.done, NULL, N_THREADS + 1))
        die("pthread_barrier_init");
    for (int t = 0; t < N_THREADS; t++) {
        W.r[t] = (mix_run_t){.m = &mixes[t], .s = streams[t]};
        if (pthread_create(&W.th[t], NULL, worker_main, (void *)(intptr_t)t)) die("pthread_create");
    }
}

static void workers_stop(void)
{
    W.quit = 1;
    pthread_barrier_wait(&W.go);
    for (int t = 0; t < N_THREADS; t++) pthread_join(W.th[t], NULL);
    pthread_barrier_destroy(&W.go);
    pthread_barrier_destroy(&W.done);
}

/* Run workers 0..nt-1 at once over their own mixes; aggregate ops/s or -1. */
static double run_threads(int nt, cudaStream_t *streams)
{
    if (pthread_barrier_init(&W.start, NULL, (unsigned)nt)) die("pthread_barrier_init");
    W.nt = nt;
    for (int t = 0; t < nt; t++) W.r[t].bar = &W.start;
    pthread_barrier_wait(&W.go);
    pthread_barrier_wait(&W.done);
    uint64_t t0 = UINT64_MAX, t1 = 0, ops = 0;
    int failed = 0;
    for (int t = 0; t < nt; t++) {
        if (W.r[t].t_start < t0) t0 = W.r[t].t_start;
        if (W.r[t].t_end > t1) t1 = W.r[t].t_end;
        ops += W.r[t].ops;
        failed |= W.r[t].failed;
    }
    pthread_barrier_destroy(&W.start);
    for (int t = 0; t < nt; t++) CK(cudaStreamSynchronize(streams[t]));
    return failed ? -1 : (double)ops * 1e9 / (double)(t1 - t0);
}

/* The host's own ceiling for trivially parallel code: the mix loop of
 * mix_exec with the allocator taken out (each op flips a slot between
 * empty and a size), over the same sequences, many rounds so that a run
 * lasts tens of milliseconds. */
#define CEIL_ROUNDS 200
/* The runs of one thread on each CPU in turn: shorter (about 30 ms). */
#define CEIL_ROUNDS_CPU 50
typedef struct ceil_run {
    const mix_t *m;
    int rounds;
    pthread_barrier_t *bar;
    uint64_t t_start, t_end, ops, sink;
} ceil_run_t;

static void *ceil_thread(void *arg)
{
    ceil_run_t *r = arg;
    uint64_t slot[MIX_SLOTS] = {0};
    uint64_t live = 0, peak = 0;
    pthread_barrier_wait(r->bar);
    r->t_start = now_ns();
    for (int round = 0; round < r->rounds; round++)
        for (size_t i = 0; i < r->m->n; i++) {
            uint32_t k = r->m->slot[i];
            if (slot[k]) {
                live -= slot[k];
                slot[k] = 0;
            } else {
                slot[k] = r->m->size[i];
                live += slot[k];
                if (live > peak) peak = live;
            }
        }
    r->t_end = now_ns();
    r->ops = (uint64_t)r->rounds * r->m->n;
    r->sink = peak + live;
    return NULL;
}

/* The set of CPU c alone. */
static cpu_set_t cpu_only(int c)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(c, &set);
    return set;
}

/* cpu >= 0: the one thread (nt == 1) runs on that CPU only; cpu < 0 with
 * ALLOC_BENCH_PIN: thread t on cpu_list[t]. */
static double run_ceiling_on(int nt, mix_t *mixes, int cpu)
{
    pthread_t th[N_THREADS];
    ceil_run_t r[N_THREADS];
    pthread_barrier_t bar;
    pthread_attr_t attr;
    if (pthread_barrier_init(&bar, NULL, (unsigned)nt) || pthread_attr_init(&attr))
        die("pthread_barrier_init");
    for (int t = 0; t < nt; t++) {
        r[t] = (ceil_run_t){.m = &mixes[t], .rounds = cpu >= 0 ? CEIL_ROUNDS_CPU : CEIL_ROUNDS, .bar = &bar};
        int c = cpu >= 0 ? cpu : pin_threads && n_cpus ? cpu_list[t] : -1;
        if (c >= 0) {
            cpu_set_t set = cpu_only(c);
            if (pthread_attr_setaffinity_np(&attr, sizeof set, &set)) die("pthread_attr_setaffinity_np");
        }
        if (pthread_create(&th[t], &attr, ceil_thread, &r[t])) die("pthread_create");
    }
    pthread_attr_destroy(&attr);
    uint64_t t0 = UINT64_MAX, t1 = 0, ops = 0, sink = 0;
    for (int t = 0; t < nt; t++) {
        pthread_join(th[t], NULL);
        if (r[t].t_start < t0) t0 = r[t].t_start;
        if (r[t].t_end > t1) t1 = r[t].t_end;
        ops += r[t].ops;
        sink += r[t].sink;
    }
    pthread_barrier_destroy(&bar);
    if (sink == 1) printf(" "); /* keep the loop */
    return (double)ops * 1e9 / (double)(t1 - t0);
}

static double run_ceiling(int nt, mix_t *mixes) { return run_ceiling_on(nt, mixes, -1); }

/* ---- one thread on each CPU ---------------------------------------------------
 *
 * On these hosts one thread's rate depends on the CPU it lands on (and the
 * moment): in one process, rounds read 4.2-5.2 or 7.1-7.3 million ops/s for
 * gpumem's one thread while 16 threads held 62-66 M together.  A speedup
 * over one thread on whichever CPU it got swings with that.  So each round
 * also runs the one thread (worker 0, its mix and stream) once on each of
 * the first 16 CPUs the process may use, and the ceiling loop's one thread
 * likewise: 16 threads at perfect scaling would do the sum of those rates,
 * so the round's second speedup is the 16-thread rate over their mean. */

static void cpus_find(void)
{
    cpu_set_t set;
    n_cpus = 0;
    if (sched_getaffinity(0, sizeof set, &set)) return;
    int n = 0;
    for (int c = 0; c < CPU_SETSIZE && n < N_THREADS; c++)
        if (CPU_ISSET(c, &set)) cpu_list[n++] = c;
    if (n == N_THREADS) n_cpus = n;
}

/* Worker t allowed on cpu only (cpu < 0: on every CPU the process may use,
 * or its own with ALLOC_BENCH_PIN). */
static void worker_pin(int t, int cpu)
{
    cpu_set_t set;
    if (cpu < 0 && pin_threads && n_cpus) cpu = cpu_list[t];
    if (cpu >= 0) set = cpu_only(cpu);
    else if (sched_getaffinity(0, sizeof set, &set)) die("sched_getaffinity");
    if (pthread_setaffinity_np(W.th[t], sizeof set, &set)) die("pthread_setaffinity_np");
}

static void bench_threads(size_t per_thread, uint64_t seed)
{
    mix_t mixes[N_THREADS];
    cudaStream_t streams[N_THREADS];
    for (int t = 0; t < N_THREADS; t++) {
        mixes[t] = mix_make(per_thread, seed + 1000 + (uint64_t)t);
        CK(cudaStreamCreateWithFlags(&streams[t], cudaStreamNonBlocking));
    }
    r_thread_ops = per_thread;
    const char *pc = getenv("ALLOC_BENCH_PER_CPU");
    if (!pc || atoi(pc) != 0) cpus_find(); /* else n_cpus stays 0: not measured */
    const char *pn = getenv("ALLOC_BENCH_PIN");
    pin_threads = pn && atoi(pn) != 0;
    if (pin_threads && !n_cpus) printf("  ALLOC_BENCH_PIN: fewer than 16 CPUs (or ALLOC_BENCH_PER_CPU=0): not pinned\n");
    /* gpumem runs three passes: its default (one heap); a heap per thread
     * (gm_pool_config_t.heaps = 16), the figure the JSON leads with; and
     * that with a reserve slack of THREAD_SLACK (less page churn, more
     * memory).  Each pass: fresh pool, fresh workers. */
    const char *ts = getenv("ALLOC_BENCH_THREAD_SLACK");
    if (ts && atof(ts) > 0) thread_slack = atof(ts);
    char slack_name[64];
    snprintf(slack_name, sizeof slack_name, " (16 heaps, slack %g)", thread_slack);
    const char *pass_name[3] = {" (1 heap)", " (16 heaps)", slack_name};
    const char *tr = getenv("ALLOC_BENCH_THREAD_ROUNDS");
    if (tr && atoi(tr) >= 1) thread_rounds = atoi(tr) < MAX_ROUNDS ? atoi(tr) : MAX_ROUNDS;
    const char *tw = getenv("ALLOC_BENCH_THREAD_WARMUPS");
    if (tw && atoi(tw) >= 1) thread_warmups = atoi(tw) < MAX_ROUNDS ? atoi(tw) : MAX_ROUNDS;
    for (int pass = 0; pass < (g_pool ? 3 : 1); pass++) {
        if (g_pool) g_heaps = pass ? N_THREADS : 1, g_slack = pass == 2 ? thread_slack : 0;
        A.reset();
        workers_start(mixes, streams);
        if (pin_threads && n_cpus)
            for (int t = 0; t < N_THREADS; t++) worker_pin(t, -1);
        /* thread_warmups untimed runs of each first, to warm the caches
         * (and, for gpumem, to let the pool grow to what the threads need);
         * then the timed rounds, each one thread alone and then all 16. */
        double one[MAX_ROUNDS] = {0}, all[MAX_ROUNDS] = {0}, sp[MAX_ROUNDS] = {0}, calls[MAX_ROUNDS] = {0};
        bool ok = true;
        for (int w = 0; w < thread_warmups && ok; w++) {
            double w1 = run_threads(1, streams), w16 = w1 > 0 ? run_threads(N_THREADS, streams) : -1;
            ok = w1 > 0 && w16 > 0;
            if (ok && (!g_pool || pass == 1)) r_sp_warm[w] = w16 / w1;
        }
        /* The leading pass measures the host's ceiling in each round too,
         * just before the allocator's runs, so that each round's speedup is
         * set against the ceiling of the same moment: these hosts run fast
         * or slow by turns. */
        bool lead = !g_pool || pass == 1;
        if (lead) {
            (void)run_ceiling(1, mixes);
            (void)run_ceiling(N_THREADS, mixes);
        }
        gm_stats_t g0 = GM_STATS_INIT, g1 = GM_STATS_INIT;
        for (int r = 0; r < thread_rounds && ok; r++) {
            if (lead) {
                double c1 = run_ceiling(1, mixes), c16 = run_ceiling(N_THREADS, mixes);
                r_ceil_rounds[r] = c16 / c1;
                r_ceil1_rounds[r] = c1;
                r_ceil16_rounds[r] = c16;
            }
            one[r] = run_threads(1, streams);
            if (g_pool) g0 = gpumem_stats();
            all[r] = one[r] > 0 ? run_threads(N_THREADS, streams) : -1;
            ok = one[r] > 0 && all[r] > 0;
            sp[r] = ok ? all[r] / one[r] : -1;
            if (g_pool) g1 = gpumem_stats(); /* before the per-CPU runs: the timed run's calls */
            if (lead && ok && n_cpus) { /* one thread on each CPU, after the timed runs */
                double so = 0, sc = 0;
                for (int i = 0; i < n_cpus && ok; i++) {
                    worker_pin(0, cpu_list[i]);
                    r_cpu_one[i][r] = run_threads(1, streams);
                    r_cpu_ceil[i][r] = run_ceiling_on(1, mixes, cpu_list[i]);
                    ok = r_cpu_one[i][r] > 0;
                    so += r_cpu_one[i][r];
                    sc += r_cpu_ceil[i][r];
                }
                worker_pin(0, -1);
                if (ok) {
                    r_sp_cpu_rounds[r] = all[r] / (so / n_cpus);
                    r_ceil_cpu_rounds[r] = r_ceil16_rounds[r] / (sc / n_cpus);
                    r_of_ceil_cpu_rounds[r] = r_sp_cpu_rounds[r] / r_ceil_cpu_rounds[r];
                }
            }
            calls[r] = -1;
            if (g_pool) {
                uint64_t c = 0;
                for (int k = 0; k < GM_CALL_COUNT; k++) c += g1.backend_calls[k] - g0.backend_calls[k];
                calls[r] = (double)c;
                char kinds[512];
                gpumem_kinds(&g0, &g1, kinds, sizeof kinds);
                printf("    16 threads, round %d: %s; %.1f ms inside the backend (all threads)\n", r,
                       kinds, (double)(g1.backend_ns - g0.backend_ns) / 1e6);
            }
        }
        if (g_pool && ok) {
            uint64_t req = 0;
            for (int t = 0; t < N_THREADS; t++) req += W.r[t].req_peak;
            if (req) r_t16_reserved_ratio[pass] = (double)g1.reserved_peak / (double)req;
            printf("    16 threads: reserved peak %.3f GB over the threads' requested peaks summed %.3f GB: "
                   "%.3f\n", (double)g1.reserved_peak / 1e9, (double)req / 1e9, r_t16_reserved_ratio[pass]);
            r_t16_calls[pass] = median(calls, thread_rounds);
            r_t16_calls_first[pass] = calls[0];
        }
        workers_stop();
        if (!ok) {
            fprintf(stderr, "%s: thread mix failed\n", A.name);
            continue;
        }
        double m1 = median(one, thread_rounds), m16 = median(all, thread_rounds);
        double msp = median(sp, thread_rounds);
        int rp = g_pool ? pass : 1; /* the figure the JSON leads with: gpumem's heaps */
        r_sp[rp] = msp;
        r_sp_first[rp] = sp[0];
        memcpy(r_sp_rounds[rp], sp, sizeof sp);
        if (rp == 1) {
            r_t1_ops = m1, r_t16_ops = m16, r_heaps = g_pool ? g_heaps : 0;
            memcpy(r_one_rounds, one, sizeof one);
            memcpy(r_all_rounds, all, sizeof all);
        }
        printf("  threads%s: median of %d rounds: 1 thread %.0f ops/s, 16 threads %.0f ops/s, "
               "speedup %.2f (rounds:", g_pool ? pass_name[pass] : "", thread_rounds, m1, m16, msp);
        for (int r = 0; r < thread_rounds; r++) printf(" %.2f", sp[r]);
        printf(")\n");
        if (g_pool) printf("    backend calls in a timed 16-thread run: median %.0f, first round %.0f\n",
                           r_t16_calls[pass], r_t16_calls_first[pass]);
    }
    g_heaps = 0;
    g_slack = 0;
    A.reset(); /* while the streams live: torch's expandable segments sync them */
    if (r_sp[1] > 0) {
        r_ceil = median(r_ceil_rounds, thread_rounds);
        for (int r = 0; r < thread_rounds; r++) r_of_ceil_rounds[r] = r_sp_rounds[1][r] / r_ceil_rounds[r];
        r_of_ceil = median(r_of_ceil_rounds, thread_rounds);
        printf("  host ceiling (the loop without an allocator, in the rounds of the%s run): median %.2f "
               "(rounds:", g_pool ? " 16-heap" : "", r_ceil);
        for (int r = 0; r < thread_rounds; r++) printf(" %.2f", r_ceil_rounds[r]);
        printf("); each round's speedup over its ceiling: median %.3f (rounds:", r_of_ceil);
        for (int r = 0; r < thread_rounds; r++) printf(" %.3f", r_of_ceil_rounds[r]);
        printf(")\n  rates by round, million ops/s (1 thread / 16 threads), allocator:");
        for (int r = 0; r < thread_rounds; r++) printf(" %.2f/%.1f", r_one_rounds[r] / 1e6, r_all_rounds[r] / 1e6);
        printf("; ceiling loop:");
        for (int r = 0; r < thread_rounds; r++) printf(" %.0f/%.0f", r_ceil1_rounds[r] / 1e6, r_ceil16_rounds[r] / 1e6);
        printf("\n");
        if (n_cpus) {
            r_sp_cpu = median(r_sp_cpu_rounds, thread_rounds);
            r_ceil_cpu = median(r_ceil_cpu_rounds, thread_rounds);
            r_of_ceil_cpu = median(r_of_ceil_cpu_rounds, thread_rounds);
            printf("  over one thread's mean rate on each of the %d CPUs: speedup median %.2f (rounds:",
                   n_cpus, r_sp_cpu);
            for (int r = 0; r < thread_rounds; r++) printf(" %.2f", r_sp_cpu_rounds[r]);
            printf("), host ceiling %.2f (rounds:", r_ceil_cpu);
            for (int r = 0; r < thread_rounds; r++) printf(" %.2f", r_ceil_cpu_rounds[r]);
            printf("), of ceiling %.3f (rounds:", r_of_ceil_cpu);
            for (int r = 0; r < thread_rounds; r++) printf(" %.3f", r_of_ceil_cpu_rounds[r]);
            printf(")\n  one thread by CPU, million ops/s, median of the rounds (allocator / ceiling loop):");
            for (int i = 0; i < n_cpus; i++)
                printf(" %d:%.2f/%.0f", cpu_list[i], median(r_cpu_one[i], thread_rounds) / 1e6,
                       median(r_cpu_ceil[i], thread_rounds) / 1e6);
            printf("\n");
        }
    }
    for (int t = 0; t < N_THREADS; t++) {
        CK(cudaStreamDestroy(streams[t]));
        mix_free(&mixes[t]);
    }
    write_json();
}

/* ---- 4. trace replay ------------------------------------------------------ */

static const char *base_name(const char *path)
{
    const char *b = strrchr(path, '/');
    return b ? b + 1 : path;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The allocator under test, for replay_step (ctx: the trace's streams).  A
 * is a table of pointers: one indirect call per op, as before. */
static inline int bench_alloc(void *ctx, uint64_t size, uint16_t stream, void **p)
{
    return A.alloc(size, ((cudaStream_t *)ctx)[stream], p);
}

static inline int bench_free(void *ctx, void *p, uint64_t size, uint16_t stream)
{
    return A.free(p, size, ((cudaStream_t *)ctx)[stream]);
}

/* Replay t `passes` times; the reserved peak covers every pass, the call
 * counter passes 2..N.  0 on success. */
static int replay(const gm__trace_t *t, int passes, uint64_t *res_peak, double *steady, uint64_t deadline_s,
                  char *kinds, size_t kinds_cap)
{
    gm_stats_t g0 = GM_STATS_INIT, g1 = GM_STATS_INIT;
    void **ptr = calloc(t->n_slots ? t->n_slots : 1, sizeof *ptr);
    uint64_t *psz = calloc(t->n_slots ? t->n_slots : 1, sizeof *psz);
    uint16_t *pst = calloc(t->n_slots ? t->n_slots : 1, sizeof *pst);
    cudaStream_t *st = calloc(t->n_streams ? t->n_streams : 1, sizeof *st);
    if (!ptr || !psz || !pst || !st) die("out of host memory");
    const replay_slots_t slots = {ptr, psz, pst};
    for (uint32_t i = 0; i < t->n_streams; i++)
        if (t->streams[i]) CK(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking));
    A.reset();
    int rc = 0;
    uint64_t c0 = 0, start = now_ns();
    for (int pass = 0; pass < passes && !rc; pass++) {
        if (pass == 1) {
            if (A.track_calls) A.track_calls(1);
            c0 = A.calls();
            if (g_pool) g0 = gpumem_stats();
        }
        for (size_t i = 0; i < t->n_ops; i++) {
            const gm__trace_op_t *op = &t->ops[i];
            if (replay_step(&slots, op, bench_alloc, bench_free, st) != 0) {
                rc = 1;
                if (op->action == GM__TRACE_ALLOC) {
                    fprintf(stderr, "%s: %s: allocation of %llu bytes failed (op %zu)\n", A.name, t->name,
                            (unsigned long long)op->size, i);
                    break;
                }
            }
            if ((i & 1023) == 0 && (now_ns() - start) / 1000000000u > deadline_s) {
                fprintf(stderr, "%s: %s: over %llu s, stopped\n", A.name, t->name, (unsigned long long)deadline_s);
                rc = 2;
                break;
            }
        }
        /* End of pass: free what the trace left live, on its own stream. */
        for (uint32_t k = 0; k < t->n_slots; k++)
            if (ptr[k]) {
                if (A.free(ptr[k], psz[k], st[pst[k]])) rc = 1;
                ptr[k] = NULL;
            }
        CK(cudaDeviceSynchronize());
    }
    *steady = (!rc && passes > 1) ? (double)(A.calls() - c0) : -1;
    if (A.track_calls) A.track_calls(0);
    *res_peak = A.reserved_peak();
    cm_reserved_peak_saved = *res_peak;
    if (g_pool && !rc && passes > 1) {
        g1 = gpumem_stats();
        gpumem_kinds(&g0, &g1, kinds, kinds_cap);
    }
    A.reset(); /* while the streams live: torch's expandable segments sync them */
    for (uint32_t i = 0; i < t->n_streams; i++)
        if (st[i]) CK(cudaStreamDestroy(st[i]));
    free(ptr), free(psz), free(pst), free(st);
    return rc;
}

static void bench_traces(const char *dir, int cm)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "alloc_bench: no trace folder %s\n", dir);
        return;
    }
    char *files[MAX_TRACES];
    int nf = 0;
    struct dirent *e;
    while ((e = readdir(d)) && nf < MAX_TRACES) {
        size_t l = strlen(e->d_name);
        if ((l > 4 && !strcmp(e->d_name + l - 4, ".csv")) || (l > 7 && !strcmp(e->d_name + l - 7, ".csv.gz"))) {
            char *p = malloc(strlen(dir) + l + 2);
            if (!p) die("out of host memory");
            sprintf(p, "%s/%s", dir, e->d_name);
            files[nf++] = p;
        }
    }
    closedir(d);
    qsort(files, nf, sizeof *files, cmp_str);
    for (int i = 0; i < nf; i++) {
        gm__trace_t t;
        int rc = gm__trace_load(files[i], &t);
        if (rc) die("%s: %s (%s)", files[i], gm_errname(rc), gm_last_error());
        char *name = strdup(base_name(files[i]));
        if (!name) die("out of host memory");
        char *dot = strstr(name, ".csv");
        if (dot) *dot = 0;
        int k = n_traces++;
        r_trace_name[k] = name;
        r_trace_live[k] = t.live_peak;
        uint64_t res = 0;
        double steady = -1;
        if (cm) {
            /* One pass, memory measured with cudaMemGetInfo after each
             * cudaMalloc; the steady calls are every alloc and free of
             * passes 2..3 by definition. */
            cm_track_mem = 1;
            rc = replay(&t, 1, &res, &steady, 40, r_trace_kinds[k], sizeof r_trace_kinds[k]);
            res = cm_reserved_peak_saved;
            cm_track_mem = 0;
            uint64_t n = 0;
            for (size_t j = 0; j < t.n_ops; j++)
                if (t.ops[j].slot != GM__TRACE_NO_SLOT) n++;
            steady = rc ? -1 : (double)(n * (TRACE_PASSES - 1));
        } else {
            rc = replay(&t, TRACE_PASSES, &res, &steady, 60, r_trace_kinds[k], sizeof r_trace_kinds[k]);
        }
        r_trace_res[k] = res;
        r_trace_ratio[k] = (!rc && t.live_peak) ? (double)res / (double)t.live_peak : -1;
        r_trace_steady[k] = steady;
        printf("  trace %-22s live peak %.3f GB reserved peak %.3f GB ratio %.4f steady calls %.0f%s %s\n", name,
               t.live_peak / 1e9, res / 1e9, r_trace_ratio[k], steady, rc ? " (FAILED)" : "", r_trace_kinds[k]);
        fflush(stdout);
        gm__trace_free(&t);
        free(files[i]);
        write_json();
    }
}

/* ---- main ----------------------------------------------------------------- */

int main(int argc, char **argv)
{
    const char *which = NULL, *name = NULL, *shim = NULL, *traces = NULL;
    size_t mix_ops = 400000;
    uint64_t seed = 12345;
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick")) { quick = 1; continue; }
        if (!v) die("%s needs a value", a);
        i++;
        if (!strcmp(a, "--allocator")) which = v;
        else if (!strcmp(a, "--name")) name = v;
        else if (!strcmp(a, "--torch-shim")) shim = v;
        else if (!strcmp(a, "--traces")) traces = v;
        else if (!strcmp(a, "--json")) json_path = v;
        else if (!strcmp(a, "--mix-ops")) mix_ops = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--seed")) seed = strtoull(v, NULL, 10);
        else die("unknown option %s", a);
    }
    if (!which) die("usage: alloc_bench --allocator gpumem|cudaMalloc|cudaMallocAsync|torch [--name N] "
                    "[--torch-shim LIB] [--traces DIR] [--mix-ops N] [--seed N] [--json FILE] [--quick]");
    for (size_t i = 0; i < N_PAIR; i++) r_pair[i] = -1;

    CK(cudaGetDevice(&g_device));
    CK(cudaFree(0)); /* create the primary context */
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, g_device));
    snprintf(g_gpu, sizeof g_gpu, "%s", prop.name);

    int cm = 0;
    if (!strcmp(which, "gpumem")) {
        gpumem_open();
        gm_device_info_t info = GM_DEVICE_INFO_INIT;
        int rc = gm_pool_device_info(g_pool, &info);
        if (rc) gm_fail("gm_pool_device_info", rc);
        if (info.backend != GM_BACKEND_CUDA) die("gpumem pool is not on the cuda backend: %s", info.backend_reason);
        A = (allocator_t){"gpumem", "gm_pool_stats backend_calls (all kinds), passes 2..3",
                          gpumem_alloc, gpumem_free, gpumem_reset, gpumem_reserved_peak,
                          gpumem_allocated_peak, gpumem_calls, NULL};
    } else if (!strcmp(which, "cudaMalloc")) {
        cm = 1;
        A = (allocator_t){"cudaMalloc", "every cudaMalloc and cudaFree of passes 2..3 (by definition; one pass replayed)",
                          cm_alloc, cm_free, cm_reset, cm_reserved_peak, cm_none, cm_calls, NULL};
        g_notes = "mix capped at 20000 ops, threads at 1000 ops per thread; mix ratio 1.0 by definition; "
                  "trace reserved peak = cudaMemGetInfo used-memory peak above the start";
    } else if (!strcmp(which, "cudaMallocAsync")) {
        ma_open();
        A = (allocator_t){"cudaMallocAsync",
                          "proxy: cudaMallocAsync calls after which ReservedMemCurrent grew, passes 2..3",
                          ma_alloc, ma_free, ma_reset, ma_reserved_peak, ma_used_peak, ma_calls, ma_track_calls};
    } else if (!strcmp(which, "torch")) {
        if (!shim) die("--allocator torch needs --torch-shim LIB.so");
        torch_load(shim);
        A = (allocator_t){"torch", "proxy: segment allocations + segment frees (DeviceStats.segment), passes 2..3",
                          torch_alloc, torch_free, torch_reset, torch_reserved_peak, torch_allocated_peak,
                          torch_calls, NULL};
        printf("torch allocator config: %s\n", ts.config());
    } else {
        die("unknown allocator %s", which);
    }
    if (name) A.name = name;
    printf("== %s on %s\n", A.name, g_gpu);
    fflush(stdout);

    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    if (quick) mix_ops = mix_ops < 20000 ? mix_ops : 20000;
    size_t per_thread = quick ? 2000 : 100000;
    if (cm) {
        mix_ops = mix_ops < 20000 ? mix_ops : 20000;
        per_thread = 1000;
    }
    write_json();
    bench_mix(s, mix_ops, seed, cm);
    fflush(stdout);
    /* ALLOC_BENCH_MIX_ONLY=1: the mix alone (for many runs side by side). */
    const char *mix_only = getenv("ALLOC_BENCH_MIX_ONLY");
    if (mix_only && atoi(mix_only)) {
        A.reset();
        CK(cudaStreamDestroy(s));
        if (g_pool) gm_pool_destroy(g_pool);
        return 0;
    }
    bench_threads(per_thread, seed);
    fflush(stdout);
    A.reset();
    bench_pairs(s, cm);
    fflush(stdout);
    if (traces) bench_traces(traces, cm);
    A.reset();
    CK(cudaStreamDestroy(s));
    if (g_pool) gm_pool_destroy(g_pool);
    write_json();
    printf("== %s done\n", A.name);
    return 0;
}
