/* SPDX-License-Identifier: Apache-2.0 */
/*
 * host_bench.c — host memory side by side: gpumem's pinned host pool and
 * staged pageable copies against the CUDA runtime in the same process.
 *
 *   peers (CUDA runtime): cudaMemcpy from/to pageable (malloc) and pinned
 *     (cudaHostAlloc) memory at 256 MiB and 1 GiB, and at the small sizes;
 *     a 4 KiB cudaHostAlloc + cudaFreeHost pair.
 *   gpumem: gm_memcpy_h2d / gm_memcpy_d2h from/to the same pageable buffer,
 *     4 KiB ... 1 GiB (H2D timed until gm_stream_synchronize returns); a
 *     4 KiB gm_host_alloc + gm_host_free pair; host_overhead_ratio = pinned
 *     memory held at peak / bytes requested at peak, over a mixed-size
 *     workload on a pool of its own.
 *
 * Every figure is the median of several timed repetitions after a warm-up.
 * Writes one JSON object (--json FILE) with the keys of the results file and
 * a "details" object; prints a readable summary.  Built by
 * bench/run_host_bench.sh against libgpumem.a and libcudart.  With
 * -DHOST_BENCH_NO_CUDA it builds without the toolkit and measures only
 * gpumem's side on the backend GPUMEM_BACKEND picks (sim: a smoke test of
 * this program and the host-side figures; copies then are host memmoves).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpumem.h"
#ifndef HOST_BENCH_NO_CUDA
#include <cuda_runtime.h>
#endif

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)
#define REPS 5

static int failures;

#define GM_OK_OR(expr, what)                                                   \
    do {                                                                       \
        int rc_ = (expr);                                                      \
        if (rc_ != GM_OK) {                                                    \
            fprintf(stderr, "FAILED %s: %s (%s)\n", what, gm_errname(rc_),     \
                    gm_last_error());                                          \
            failures++;                                                        \
            return -1;                                                         \
        }                                                                      \
    } while (0)

#ifndef HOST_BENCH_NO_CUDA
#define CUDA_OK_OR(expr, what)                                                 \
    do {                                                                       \
        cudaError_t e_ = (expr);                                               \
        if (e_ != cudaSuccess) {                                               \
            fprintf(stderr, "FAILED %s: %s\n", what, cudaGetErrorString(e_));  \
            failures++;                                                        \
            return -1;                                                         \
        }                                                                      \
    } while (0)
#endif

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static const size_t copy_sizes[] = {4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 256 * MiB, 1 * GiB};
#define N_SIZES (sizeof copy_sizes / sizeof copy_sizes[0])

typedef struct results {
    double gm_h2d[N_SIZES], gm_d2h[N_SIZES];       /* GB/s, staged, pageable */
    double cu_h2d[N_SIZES], cu_d2h[N_SIZES];       /* GB/s, cudaMemcpy pageable */
    double cu_pin_h2d[N_SIZES], cu_pin_d2h[N_SIZES]; /* cudaMemcpy pinned */
    double gm_pin_h2d[N_SIZES], gm_pin_d2h[N_SIZES]; /* gm_memcpy from gm_host_alloc */
    double gm_pair_ns, cu_pair_ns;
    double ratio, req_peak, held_peak, registers;
    double gm_pair_mixed_ns;
} results_t;

static size_t max_size = 1 * GiB;

static int reps_for(size_t n)
{
    return n >= 256 * MiB ? REPS : n >= MiB ? 21 : 101;
}

/* Median GB/s of gpumem's staged copies at each size. */
static int bench_gm_copies(gm_pool_t *pool, gm_stream_t s, unsigned char *host, void *dev,
                           void *pinned, results_t *r)
{
    for (size_t i = 0; i < N_SIZES; i++) {
        size_t n = copy_sizes[i];
        if (n > max_size) break;
        int reps = reps_for(n);
        double t[128], u[128], pt[128], pu[128];
        for (int k = -1; k < reps; k++) { /* k = -1: warm-up */
            double t0 = now();
            GM_OK_OR(gm_memcpy_h2d(pool, dev, host, n, s), "gm_memcpy_h2d");
            GM_OK_OR(gm_stream_synchronize(pool, s), "gm_stream_synchronize");
            double t1 = now();
            GM_OK_OR(gm_memcpy_d2h(pool, host, dev, n, s), "gm_memcpy_d2h");
            double t2 = now();
            double t3 = t2, t4 = t2, t5 = t2;
            if (pinned) {
                t3 = now();
                GM_OK_OR(gm_memcpy_h2d(pool, dev, pinned, n, s), "gm_memcpy_h2d pinned");
                GM_OK_OR(gm_stream_synchronize(pool, s), "gm_stream_synchronize");
                t4 = now();
                GM_OK_OR(gm_memcpy_d2h(pool, pinned, dev, n, s), "gm_memcpy_d2h pinned");
                t5 = now();
            }
            if (k >= 0) {
                t[k] = (double)n / (t1 - t0) / 1e9;
                u[k] = (double)n / (t2 - t1) / 1e9;
                pt[k] = pinned ? (double)n / (t4 - t3) / 1e9 : 0;
                pu[k] = pinned ? (double)n / (t5 - t4) / 1e9 : 0;
            }
        }
        r->gm_h2d[i] = median(t, reps);
        r->gm_d2h[i] = median(u, reps);
        r->gm_pin_h2d[i] = median(pt, reps);
        r->gm_pin_d2h[i] = median(pu, reps);
        printf("gpumem staged   %8zu KiB: H2D %6.2f GB/s  D2H %6.2f GB/s   (pinned pool buffer: "
               "%6.2f / %6.2f)\n", n / KiB, r->gm_h2d[i], r->gm_d2h[i], r->gm_pin_h2d[i],
               r->gm_pin_d2h[i]);
        fflush(stdout);
    }
    return 0;
}

/* Round trips through the staged and direct paths at unaligned offsets,
 * checked byte for byte: the figures count only if the data arrives. */
static int verify(gm_pool_t *pool, gm_stream_t s, void *dev)
{
    const size_t sizes[] = {1000, 300001, 64 * MiB + 12345};
    size_t cap = 64 * MiB + 12345 + 64;
    if (cap > max_size) cap = max_size;
    unsigned char *a = malloc(cap), *b = malloc(cap);
    int bad = 0;
    if (!a || !b) {
        free(a);
        free(b);
        fprintf(stderr, "FAILED verify: no host memory\n");
        failures++;
        return -1;
    }
    uint64_t x = 77;
    for (size_t i = 0; i < cap; i++) a[i] = (unsigned char)rnd(&x);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        if (n + 64 > cap) continue;
        memset(b, 0, cap);
        if (gm_memcpy_h2d(pool, (char *)dev + 3, a + 5, n, s) != GM_OK ||
            gm_memcpy_d2h(pool, b + 7, (char *)dev + 3, n, s) != GM_OK) {
            fprintf(stderr, "FAILED verify %zu: %s\n", n, gm_last_error());
            bad++;
        } else if (memcmp(a + 5, b + 7, n) != 0 || b[6] != 0 || b[7 + n] != 0) {
            fprintf(stderr, "FAILED verify %zu: data differs\n", n);
            bad++;
        }
    }
    printf("verify (h2d + d2h round trips, unaligned, 1000 B .. 64 MiB): %s\n", bad ? "FAILED" : "ok");
    failures += bad;
    free(a);
    free(b);
    return bad ? -1 : 0;
}

/* Median ns of a 4 KiB gm_host_alloc + gm_host_free pair, warm; and of a
 * pair in a mix of sizes (4 KiB .. 1 MiB, 64 live blocks). */
static int bench_gm_pair(gm_pool_t *pool, results_t *r)
{
    const int batches = 21, pairs = 100000;
    double v[21];
    void *p;
    GM_OK_OR(gm_host_alloc(pool, 4 * KiB, NULL, &p), "gm_host_alloc");
    GM_OK_OR(gm_host_free(pool, p, NULL), "gm_host_free");
    for (int b = 0; b < batches; b++) {
        double t0 = now();
        for (int i = 0; i < pairs; i++) {
            if (gm_host_alloc(pool, 4 * KiB, NULL, &p) != GM_OK || gm_host_free(pool, p, NULL) != GM_OK) {
                fprintf(stderr, "FAILED gm_host pair: %s\n", gm_last_error());
                failures++;
                return -1;
            }
        }
        v[b] = (now() - t0) / pairs * 1e9;
    }
    r->gm_pair_ns = median(v, batches);
    void *live[64] = {0};
    uint64_t s = 99;
    for (int b = 0; b < batches; b++) {
        double t0 = now();
        for (int i = 0; i < pairs; i++) {
            int k = (int)(rnd(&s) % 64);
            if (live[k]) GM_OK_OR(gm_host_free(pool, live[k], NULL), "gm_host_free");
            GM_OK_OR(gm_host_alloc(pool, 4 * KiB << (rnd(&s) % 9), NULL, &live[k]), "gm_host_alloc");
        }
        v[b] = (now() - t0) / pairs * 1e9;
    }
    for (int k = 0; k < 64; k++) GM_OK_OR(gm_host_free(pool, live[k], NULL), "gm_host_free");
    r->gm_pair_mixed_ns = median(v, batches);
    printf("gm_host_alloc+free pair: 4 KiB %.1f ns; mixed 4 KiB-1 MiB %.1f ns\n", r->gm_pair_ns,
           r->gm_pair_mixed_ns);
    return 0;
}

/* Pinned bytes held at peak / bytes requested at peak, on a fresh pool: 256
 * slots, sizes log-uniform 4 KiB .. 64 MiB, 20000 random alloc/free. */
static int bench_overhead(results_t *r)
{
    gm_pool_t *pool;
    gm_pool_config_t cfg;
    GM_OK_OR(gm_config_from_env(&cfg), "gm_config_from_env");
    GM_OK_OR(gm_pool_create(&cfg, &pool), "gm_pool_create (overhead)");
    void *slot[256] = {0};
    size_t size[256] = {0};
    uint64_t s = 12345, live = 0, peak = 0;
    for (int i = 0; i < 20000; i++) {
        int k = (int)(rnd(&s) % 256);
        if (slot[k]) {
            if (gm_host_free(pool, slot[k], NULL) != GM_OK) break;
            live -= size[k];
            slot[k] = NULL;
        } else {
            double e = 12 + (double)(rnd(&s) % 14001) / 1000.0; /* 2^12 .. 2^26 */
            size[k] = (size_t)exp2(e);
            if (gm_host_alloc(pool, size[k], NULL, &slot[k]) != GM_OK) {
                fprintf(stderr, "FAILED overhead alloc of %zu: %s\n", size[k], gm_last_error());
                failures++;
                slot[k] = NULL;
                break;
            }
            live += size[k];
            if (live > peak) peak = live;
        }
    }
    gm_stats_t st = GM_STATS_INIT;
    GM_OK_OR(gm_pool_stats(pool, &st), "gm_pool_stats");
    for (int k = 0; k < 256; k++)
        if (slot[k]) (void)gm_host_free(pool, slot[k], NULL);
    gm_pool_destroy(pool);
    r->req_peak = (double)peak;
    r->held_peak = (double)st.host_reserved_peak;
    r->ratio = peak ? (double)st.host_reserved_peak / (double)peak : 0;
    r->registers = (double)st.backend_calls[GM_CALL_host_register];
    printf("host overhead: held peak %.3f GB / requested peak %.3f GB = %.4f (%.0f chunk "
           "registrations)\n", r->held_peak / 1e9, r->req_peak / 1e9, r->ratio, r->registers);
    return 0;
}

#ifndef HOST_BENCH_NO_CUDA
static int bench_cuda(unsigned char *host, results_t *r)
{
    void *dev, *pin;
    CUDA_OK_OR(cudaMalloc(&dev, max_size), "cudaMalloc");
    CUDA_OK_OR(cudaHostAlloc(&pin, max_size, cudaHostAllocDefault), "cudaHostAlloc");
    memset(pin, 1, max_size);
    for (size_t i = 0; i < N_SIZES; i++) {
        size_t n = copy_sizes[i];
        if (n > max_size) break;
        int reps = reps_for(n);
        double a[128], b[128], c[128], d[128];
        for (int k = -1; k < reps; k++) {
            double t0 = now();
            CUDA_OK_OR(cudaMemcpy(dev, host, n, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
            double t1 = now();
            CUDA_OK_OR(cudaMemcpy(host, dev, n, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
            double t2 = now();
            CUDA_OK_OR(cudaMemcpy(dev, pin, n, cudaMemcpyHostToDevice), "cudaMemcpy pinned H2D");
            double t3 = now();
            CUDA_OK_OR(cudaMemcpy(pin, dev, n, cudaMemcpyDeviceToHost), "cudaMemcpy pinned D2H");
            double t4 = now();
            if (k >= 0) {
                a[k] = (double)n / (t1 - t0) / 1e9;
                b[k] = (double)n / (t2 - t1) / 1e9;
                c[k] = (double)n / (t3 - t2) / 1e9;
                d[k] = (double)n / (t4 - t3) / 1e9;
            }
        }
        r->cu_h2d[i] = median(a, reps);
        r->cu_d2h[i] = median(b, reps);
        r->cu_pin_h2d[i] = median(c, reps);
        r->cu_pin_d2h[i] = median(d, reps);
        printf("cudaMemcpy      %8zu KiB: pageable H2D %6.2f D2H %6.2f GB/s; pinned H2D %6.2f D2H "
               "%6.2f GB/s\n", n / KiB, r->cu_h2d[i], r->cu_d2h[i], r->cu_pin_h2d[i], r->cu_pin_d2h[i]);
        fflush(stdout);
    }
    CUDA_OK_OR(cudaFreeHost(pin), "cudaFreeHost");
    CUDA_OK_OR(cudaFree(dev), "cudaFree");
    /* cudaHostAlloc + cudaFreeHost of 4 KiB. */
    double v[5];
    for (int bt = -1; bt < 5; bt++) {
        double t0 = now();
        for (int i = 0; i < 40; i++) {
            void *p;
            CUDA_OK_OR(cudaHostAlloc(&p, 4 * KiB, cudaHostAllocDefault), "cudaHostAlloc 4 KiB");
            CUDA_OK_OR(cudaFreeHost(p), "cudaFreeHost 4 KiB");
        }
        if (bt >= 0) v[bt] = (now() - t0) / 40 * 1e9;
    }
    r->cu_pair_ns = median(v, 5);
    printf("cudaHostAlloc+cudaFreeHost pair, 4 KiB: %.0f ns\n", r->cu_pair_ns);
    return 0;
}
#endif

/* min over the sizes >= 256 MiB that were measured (the target's range). */
static double big_min(const double *v)
{
    double m = 0;
    for (size_t i = 0; i < N_SIZES; i++)
        if (copy_sizes[i] >= 256 * MiB && copy_sizes[i] <= max_size && v[i] > 0)
            m = m == 0 || v[i] < m ? v[i] : m;
    return m;
}

static void json_array(FILE *f, const char *name, const double *v)
{
    fprintf(f, "  \"%s\": {", name);
    const char *sep = "";
    for (size_t i = 0; i < N_SIZES && copy_sizes[i] <= max_size; i++) {
        fprintf(f, "%s\"%zu\": %.3f", sep, copy_sizes[i], v[i]);
        sep = ", ";
    }
    fprintf(f, "},\n");
}

int main(int argc, char **argv)
{
    const char *json = NULL, *gpu = "unknown", *date = "unknown", *command = "bench/run_host_bench.sh";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--gpu") && i + 1 < argc) gpu = argv[++i];
        else if (!strcmp(argv[i], "--date") && i + 1 < argc) date = argv[++i];
        else if (!strcmp(argv[i], "--command") && i + 1 < argc) command = argv[++i];
        else if (!strcmp(argv[i], "--max") && i + 1 < argc) max_size = (size_t)strtoull(argv[++i], NULL, 0) * MiB;
        else {
            fprintf(stderr, "usage: host_bench [--json FILE] [--gpu NAME] [--date D] [--command C] "
                            "[--max MiB]\n");
            return 2;
        }
    }
    results_t r;
    memset(&r, 0, sizeof r);
    unsigned char *host = malloc(max_size);
    if (!host) {
        fprintf(stderr, "FAILED: no %zu bytes of host memory\n", max_size);
        return 1;
    }
    memset(host, 7, max_size); /* touched: pageable, resident */

#ifndef HOST_BENCH_NO_CUDA
    if (cudaFree(0) != cudaSuccess) fprintf(stderr, "FAILED: CUDA runtime initialisation\n");
    bench_cuda(host, &r);
#endif

    gm_pool_t *pool = NULL;
    gm_pool_config_t cfg;
    int rc = gm_config_from_env(&cfg);
    if (rc == GM_OK) rc = gm_pool_create(&cfg, &pool);
    if (rc != GM_OK) {
        fprintf(stderr, "FAILED gm_pool_create: %s\n", gm_last_error());
        failures++;
    } else {
        gm_device_info_t info = GM_DEVICE_INFO_INIT;
        if (gm_pool_device_info(pool, &info) == GM_OK)
            printf("gpumem backend: %s (%s), device %s\n", info.backend_name, info.backend_reason,
                   info.device_name);
        gm_stream_t s = NULL;
        void *dev = NULL, *pinned = NULL;
        if (gm_stream_create(pool, &s) != GM_OK || gm_alloc(pool, max_size, s, &dev) != GM_OK ||
            gm_host_alloc(pool, max_size, s, &pinned) != GM_OK) {
            fprintf(stderr, "FAILED gpumem setup: %s\n", gm_last_error());
            failures++;
        } else {
            memset(pinned, 3, max_size);
            verify(pool, s, dev);
            bench_gm_copies(pool, s, host, dev, pinned, &r);
            gm_stats_t st = GM_STATS_INIT;
            if (gm_pool_stats(pool, &st) == GM_OK)
                printf("copy stats: staged %.3f GB, direct %.3f GB; pinned held %.3f GB\n",
                       (double)st.copy_staged_bytes / 1e9, (double)st.copy_direct_bytes / 1e9,
                       (double)st.host_reserved / 1e9);
        }
        if (pinned) (void)gm_host_free(pool, pinned, s);
        if (dev) (void)gm_free(pool, dev, s);
        (void)gm_stream_synchronize(pool, s);
        bench_gm_pair(pool, &r);
        if (s) (void)gm_stream_destroy(pool, s);
        gm_pool_destroy(pool);
    }
    bench_overhead(&r);

    double pin_h2d = big_min(r.cu_pin_h2d), pin_d2h = big_min(r.cu_pin_d2h);
#ifdef HOST_BENCH_NO_CUDA
    pin_h2d = big_min(r.gm_pin_h2d);
    pin_d2h = big_min(r.gm_pin_d2h);
#endif
    printf("\nsummary (>= 256 MiB, the lower of 256 MiB and 1 GiB):\n"
           "  pageable H2D: gpumem %.2f GB/s, cudaMemcpy %.2f GB/s\n"
           "  pageable D2H: gpumem %.2f GB/s, cudaMemcpy %.2f GB/s\n"
           "  pinned (cudaMemcpy from cudaHostAlloc): H2D %.2f, D2H %.2f GB/s\n"
           "  pinned pair 4 KiB: gpumem %.1f ns, cudaHostAlloc+cudaFreeHost %.0f ns\n"
           "  host overhead ratio %.4f\n  failures: %d\n",
           big_min(r.gm_h2d), big_min(r.cu_h2d), big_min(r.gm_d2h), big_min(r.cu_d2h), pin_h2d,
           pin_d2h, r.gm_pair_ns, r.cu_pair_ns, r.ratio, failures);
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            perror(json);
            return 1;
        }
        fprintf(f, "{\n  \"date\": \"%s\",\n  \"gpu\": \"%s\",\n  \"command\": \"%s\",\n", date, gpu,
                command);
        fprintf(f, "  \"pageable_h2d_GBps\": %.3f,\n  \"pageable_d2h_GBps\": %.3f,\n",
                big_min(r.gm_h2d), big_min(r.gm_d2h));
        fprintf(f, "  \"pinned_h2d_GBps\": %.3f,\n  \"pinned_d2h_GBps\": %.3f,\n", pin_h2d, pin_d2h);
        fprintf(f, "  \"cudaMemcpy_pageable_h2d_GBps\": %.3f,\n  \"cudaMemcpy_pageable_d2h_GBps\": %.3f,\n",
                big_min(r.cu_h2d), big_min(r.cu_d2h));
        fprintf(f, "  \"pinned_pool_pair_ns\": %.2f,\n  \"cudaHostAlloc_pair_ns\": %.1f,\n",
                r.gm_pair_ns, r.cu_pair_ns);
        fprintf(f, "  \"host_overhead_ratio\": %.4f,\n  \"details\": {\n", r.ratio);
        json_array(f, "gpumem_staged_h2d_GBps", r.gm_h2d);
        json_array(f, "gpumem_staged_d2h_GBps", r.gm_d2h);
        json_array(f, "gpumem_pinned_pool_h2d_GBps", r.gm_pin_h2d);
        json_array(f, "gpumem_pinned_pool_d2h_GBps", r.gm_pin_d2h);
        json_array(f, "cudaMemcpy_pageable_h2d_GBps", r.cu_h2d);
        json_array(f, "cudaMemcpy_pageable_d2h_GBps", r.cu_d2h);
        json_array(f, "cudaMemcpy_pinned_h2d_GBps", r.cu_pin_h2d);
        json_array(f, "cudaMemcpy_pinned_d2h_GBps", r.cu_pin_d2h);
        fprintf(f, "  \"pinned_pool_pair_mixed_ns\": %.2f,\n", r.gm_pair_mixed_ns);
        fprintf(f, "  \"overhead_requested_peak_bytes\": %.0f,\n  \"overhead_held_peak_bytes\": %.0f,\n",
                r.req_peak, r.held_peak);
        fprintf(f, "  \"overhead_chunk_registrations\": %.0f,\n", r.registers);
        fprintf(f, "  \"failures\": %d\n  }\n}\n", failures);
        fclose(f);
    }
    free(host);
    return failures ? 1 : 0;
}
