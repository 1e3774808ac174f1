/* SPDX-License-Identifier: Apache-2.0 */
/*
 * obs_bench.c — what observability costs per operation: alloc+free pairs on
 * a sim pool in a steady state (no backend calls after the warm-up), with
 * the feature named on the command line on:
 *   off      nothing (GPUMEM_MONITOR=0 in the environment to drop the
 *            shared-segment copy too; bench/obs_bench.sh runs both)
 *   trace    gm_trace_start(PATH) (argument 2, default $TMPDIR/obs_bench.csv)
 *   trace.gz the same, gzip'd
 *   leak     gm_leak_tracking(1): a stack per allocation
 * Prints one JSON line: mode, pairs, and per operation (an alloc or a free;
 * a pair is two), each the median of BATCHES batches: wall ns, CPU ns of the
 * calling thread (what the caller pays; on a busy machine the steadier
 * figure, since time spent descheduled is not counted) and CPU ns of the
 * whole process (adds the trace writer thread's formatting and writing).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpumem.h"

#define BATCHES 7
#define LIVE 64

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static double cpu_ns(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "off";
    long pairs = argc > 3 ? atol(argv[3]) : 200000;
    char path[512];
    const char *tmp = getenv("TMPDIR");
    if (argc > 2 && strcmp(argv[2], "-")) snprintf(path, sizeof path, "%s", argv[2]);
    else snprintf(path, sizeof path, "%s/obs_bench.csv%s", tmp && *tmp ? tmp : "/tmp",
                  strcmp(mode, "trace.gz") ? "" : ".gz");
    /* The environment's pool (GPUMEM_BACKEND=cuda on a GPU), sim by default. */
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    if (gm_config_from_env(&cfg) != GM_OK) {
        fprintf(stderr, "obs_bench: %s\n", gm_last_error());
        return 1;
    }
    if (!getenv("GPUMEM_BACKEND")) cfg.backend = GM_BACKEND_SIM;
    if (!getenv("GPUMEM_SIM_CAPACITY")) cfg.sim_capacity = (size_t)4 << 30;
    gm_pool_t *pool;
    if (gm_pool_create(&cfg, &pool) != GM_OK) {
        fprintf(stderr, "obs_bench: %s\n", gm_last_error());
        return 1;
    }
    gm_device_info_t di = GM_DEVICE_INFO_INIT;
    gm_pool_device_info(pool, &di);
    if (!strncmp(mode, "trace", 5) && gm_trace_start(path) != GM_OK) {
        fprintf(stderr, "obs_bench: %s\n", gm_last_error());
        return 1;
    }
    if (!strcmp(mode, "leak")) gm_leak_tracking(1);

    /* A working set of LIVE blocks of mixed sizes; each step frees one and
     * allocates the same size again (a steady state: no backend calls). */
    static const size_t sizes[] = {512, 4096, 65536, 1 << 20, 3 << 20, 256, 100000, 8 << 20};
    void *live[LIVE];
    for (int i = 0; i < LIVE; i++) gm_alloc(pool, sizes[i % 8], NULL, &live[i]);
    double ns[BATCHES], tns[BATCHES], pns[BATCHES];
    for (int b = -1; b < BATCHES; b++) {
        double t0 = now_ns(), c0 = cpu_ns(CLOCK_THREAD_CPUTIME_ID);
        double p0 = cpu_ns(CLOCK_PROCESS_CPUTIME_ID);
        for (long i = 0; i < pairs; i++) {
            int k = (int)(i % LIVE);
            gm_free(pool, live[k], NULL);
            if (gm_alloc(pool, sizes[k % 8], NULL, &live[k]) != GM_OK) {
                fprintf(stderr, "obs_bench: %s\n", gm_last_error());
                return 1;
            }
        }
        if (!strncmp(mode, "trace", 5)) gm_trace_start(path); /* flush: the writer's share counts */
        if (b >= 0) {
            ns[b] = (now_ns() - t0) / (2.0 * (double)pairs);
            tns[b] = (cpu_ns(CLOCK_THREAD_CPUTIME_ID) - c0) / (2.0 * (double)pairs);
            pns[b] = (cpu_ns(CLOCK_PROCESS_CPUTIME_ID) - p0) / (2.0 * (double)pairs);
        }
    }
    qsort(ns, BATCHES, sizeof ns[0], cmp);
    qsort(tns, BATCHES, sizeof tns[0], cmp);
    qsort(pns, BATCHES, sizeof pns[0], cmp);
    for (int i = 0; i < LIVE; i++) gm_free(pool, live[i], NULL);
    if (!strncmp(mode, "trace", 5)) gm_trace_stop();
    gm_stats_t st = GM_STATS_INIT;
    gm_pool_stats(pool, &st);
    unsigned long long calls = 0;
    for (int k = 0; k < GM_CALL_COUNT; k++) calls += st.backend_calls[k];
    gm_pool_destroy(pool);
    const char *mon = getenv("GPUMEM_MONITOR");
    printf("{\"backend\":\"%s\",\"mode\":\"%s\",\"monitor\":%s,\"pairs_per_batch\":%ld,\"batches\":%d,"
           "\"wall_ns_per_op\":%.1f,\"thread_cpu_ns_per_op\":%.1f,"
           "\"process_cpu_ns_per_op\":%.1f,\"backend_calls\":%llu}\n",
           di.backend_name, mode, mon && !strcmp(mon, "0") ? "false" : "true", pairs, BATCHES, ns[BATCHES / 2],
           tns[BATCHES / 2], pns[BATCHES / 2], (unsigned long long)calls);
    if (!strncmp(mode, "trace", 5)) remove(path);
    return 0;
}
