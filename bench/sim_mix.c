/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sim_mix.c — the random mix of bench/alloc_bench.c on the sim backend, for
 * machines without a GPU: what a policy change does to the backend calls
 * and the reserved memory (exact on the sim).  With --backend cuda, the same
 * passes on the GPU, for timing many passes of two builds side by side.
 *
 * usage: sim_mix [--ops N] [--passes N] [--seed N] [--threads N] [--backend sim|cuda]
 *                [--null-stream 1]  (the default stream instead of one made by gm_stream_create)
 *   one thread (default): one pool, one stream, the same mix N passes over;
 *     a line per pass: backend calls by kind, reserved peak
 *   --threads N: a pool of N heaps (--heaps M: M), N threads each with its own stream and
 *     mix (seed + 1000 + t, as alloc_bench), two passes of thread 0 alone,
 *     then the passes with all N at once
 * The pool takes its options from the environment (GPUMEM_RESERVE_SLACK, ...).
 *
 *   cc -O2 -Iinclude bench/sim_mix.c build/libgpumem.a -lm -lpthread -ldl -lz -o sim_mix
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpumem.h"
#include "mix.h"

#define MAX_THREADS 64

static size_t n_ops = 400000;
static gm_pool_t *pool;
static mix_t mixes[MAX_THREADS];
static uint64_t req_peak[MAX_THREADS]; /* each thread's requested-bytes peak, last pass */
static gm_stream_t streams[MAX_THREADS];

static void die(const char *what)
{
    fprintf(stderr, "sim_mix: %s: %s\n", what, gm_last_error());
    exit(1);
}

/* alloc_bench's mix (bench/mix.h). */
static mix_t mix_make(uint64_t seed)
{
    mix_t m;
    if (!mix_fill(&m, n_ops, seed, MIX_MAX)) die("out of host memory");
    return m;
}

static void mix_run(int t)
{
    void *ptr[MIX_SLOTS] = {0};
    const mix_t *m = &mixes[t];
    uint64_t live = 0, peak = 0, sz[MIX_SLOTS] = {0};
    for (size_t i = 0; i < n_ops; i++) {
        uint32_t k = m->slot[i];
        if (ptr[k]) {
            if (gm_free(pool, ptr[k], streams[t]) != GM_OK) die("gm_free");
            ptr[k] = NULL;
            live -= sz[k];
        } else if (gm_alloc(pool, m->size[i], streams[t], &ptr[k]) != GM_OK) {
            die("gm_alloc");
        } else {
            sz[k] = m->size[i];
            live += sz[k];
            if (live > peak) peak = live;
        }
    }
    req_peak[t] = peak;
    for (int k = 0; k < MIX_SLOTS; k++)
        if (ptr[k] && gm_free(pool, ptr[k], streams[t]) != GM_OK) die("gm_free");
}

/* Workers live for the whole run, so each keeps the heap it was given. */
static pthread_barrier_t go, done;
static int running, quit;

static void *worker(void *arg)
{
    int t = (int)(intptr_t)arg;
    for (;;) {
        pthread_barrier_wait(&go);
        if (quit) return NULL;
        if (t < running) mix_run(t);
        pthread_barrier_wait(&done);
    }
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static gm_stats_t stats(void)
{
    gm_stats_t st = GM_STATS_INIT;
    if (gm_pool_stats(pool, &st) != GM_OK) die("gm_pool_stats");
    return st;
}

/* A pass's calls by kind, its reserved peak, and its wall time per operation
 * (of every thread together; the sim's own calls cost little, so this is
 * mostly the allocator's CPU time, and as noisy as the machine). */
static void report(const char *what, int pass, const gm_stats_t *a, const gm_stats_t *b,
                   double secs, size_t ops, int threads)
{
    uint64_t total = 0, req = 0;
    for (int t = 0; t < threads; t++) req += req_peak[t];
    printf("%s pass %d: %.1f ns/op, calls", what, pass, secs * 1e9 / (double)ops);
    for (int k = 0; k < GM_CALL_COUNT; k++) {
        uint64_t d = b->backend_calls[k] - a->backend_calls[k];
        total += d;
        if (d) printf(" %s=%llu", gm_call_name(k), (unsigned long long)d);
    }
    printf(" total=%llu backend_ms=%.1f reserved_peak=%.3f GB requested_peak=%.3f GB\n",
           (unsigned long long)total, (double)(b->backend_ns - a->backend_ns) / 1e6,
           (double)b->reserved_peak / 1e9, (double)req / 1e9);
}

static void pass_all(int n, const char *what, int pass)
{
    running = n;
    gm_stats_t a = stats();
    double t0 = now_s();
    pthread_barrier_wait(&go);
    pthread_barrier_wait(&done);
    double t1 = now_s();
    gm_stats_t b = stats();
    report(what, pass, &a, &b, t1 - t0, n_ops * (size_t)n, n);
}

int main(int argc, char **argv)
{
    int passes = 4, threads = 0, null_stream = 0, heaps = -1;
    gm_backend_kind_t backend = GM_BACKEND_SIM;
    uint64_t seed = 12345;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--ops")) n_ops = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--passes")) passes = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seed")) seed = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--null-stream")) null_stream = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--heaps")) heaps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--backend"))
            backend = !strcmp(argv[i + 1], "cuda") ? GM_BACKEND_CUDA : GM_BACKEND_SIM;
        else {
            fprintf(stderr, "sim_mix: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (n_ops == 0 || passes < 1 || threads < 0 || threads > MAX_THREADS) {
        fprintf(stderr, "sim_mix: --ops > 0, --passes >= 1, --threads 0..%d\n", MAX_THREADS);
        return 2;
    }
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    if (gm_config_from_env(&cfg) != GM_OK) die("gm_config_from_env");
    cfg.backend = backend;
    if (threads) cfg.heaps = (unsigned)threads;
    if (heaps > 0) cfg.heaps = (unsigned)heaps;
    if (gm_pool_create(&cfg, &pool) != GM_OK) die("gm_pool_create");
    int n = threads ? threads : 1;
    for (int t = 0; t < n; t++) {
        mixes[t] = mix_make(threads ? seed + 1000 + (uint64_t)t : seed);
        if (!null_stream && gm_stream_create(pool, &streams[t]) != GM_OK) die("gm_stream_create");
    }
    if (!threads) {
        for (int p = 0; p < passes; p++) {
            gm_stats_t a = stats();
            double t0 = now_s();
            mix_run(0);
            double t1 = now_s();
            gm_stats_t b = stats();
            report("mix", p, &a, &b, t1 - t0, n_ops, 1);
        }
    } else {
        pthread_t th[MAX_THREADS];
        pthread_barrier_init(&go, NULL, (unsigned)n + 1);
        pthread_barrier_init(&done, NULL, (unsigned)n + 1);
        for (int t = 0; t < n; t++)
            if (pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t)) die("pthread_create");
        for (int p = 0; p < 2; p++) pass_all(1, "1 thread", p);
        for (int p = 0; p < passes; p++) pass_all(n, "all threads", p);
        quit = 1;
        pthread_barrier_wait(&go);
        for (int t = 0; t < n; t++) pthread_join(th[t], NULL);
    }
    for (int t = 0; t < n; t++) {
        if (streams[t]) gm_stream_destroy(pool, streams[t]);
        mix_free(&mixes[t]);
    }
    gm_pool_destroy(pool);
    return 0;
}
