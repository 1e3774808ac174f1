/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_observe_trace.c — the trace recorder (src/observe/tracelog.c) read back by the
 * tools' reader (tools/lib/trace_read.c): plain and gzip files, several threads
 * on several pools at once (each pool's rows must stay in its own order, so
 * the reader finds no unknown frees or duplicate allocations), buffers that
 * fill many times over, a restart of the trace, and the accounting the
 * reader checks (gm__trace_check).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpumem.h"
#include "lib/trace_read.h"
#include "../test.h"

#define THREADS 3
#define ROUNDS 3000 /* > one 4096-record buffer per pool */

typedef struct work {
    gm_pool_t *pool;
    unsigned seed;
    uint64_t allocs, frees, bytes_live;
} work_t;

static void *run(void *arg)
{
    work_t *w = arg;
    void *live[16] = {0};
    size_t sizes[16] = {0};
    for (int i = 0; i < ROUNDS; i++) {
        unsigned k = (w->seed = w->seed * 1103515245u + 12345u) >> 16;
        int s = (int)(k % 16);
        if (live[s]) {
            if (gm_free(w->pool, live[s], NULL) == GM_OK) w->frees++;
            w->bytes_live -= sizes[s];
            live[s] = NULL;
        } else {
            sizes[s] = 256 + (k % 5000) * 64;
            if (gm_alloc(w->pool, sizes[s], NULL, &live[s]) == GM_OK) {
                w->allocs++;
                w->bytes_live += sizes[s];
            }
        }
    }
    /* Leave some live: the reader's live_final must match. */
    for (int s = 0; s < 8; s++)
        if (live[s]) {
            gm_free(w->pool, live[s], NULL);
            w->frees++;
            w->bytes_live -= sizes[s];
        }
    return NULL;
}

static void one_round(const char *path)
{
    gm_pool_t *pools[THREADS] = {0};
    work_t w[THREADS];
    pthread_t th[THREADS];
    CHECK_OK(gm_trace_start(path));
    for (int t = 0; t < THREADS; t++) {
        gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
        cfg.backend = GM_BACKEND_SIM;
        cfg.sim_capacity = (size_t)1 << 30;
        CHECK_OK(gm_pool_create(&cfg, &pools[t]));
        w[t] = (work_t){pools[t], 17u + (unsigned)t, 0, 0, 0};
    }
    for (int t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, run, &w[t]);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    /* One pool destroyed while tracing (its rows must be flushed then)... */
    uint64_t allocs = 0, frees = 0, live = 0;
    for (int t = 0; t < THREADS; t++) {
        allocs += w[t].allocs;
        frees += w[t].frees;
        live += w[t].bytes_live;
    }
    gm_pool_destroy(pools[0]);
    frees += 0; /* destroying does not trace frees of what was live */
    CHECK_OK(gm_trace_stop());
    for (int t = 1; t < THREADS; t++) gm_pool_destroy(pools[t]);

    gm__trace_t tr;
    int rc = gm__trace_load(path, &tr);
    CHECK_OK(rc);
    if (rc != GM_OK) return;
    CHECK_OK(gm__trace_check(&tr));
    CHECK(tr.n_allocs == allocs);
    CHECK(tr.n_frees == frees);
    CHECK(tr.unknown_frees == 0);
    CHECK(tr.dup_allocs == 0);
    CHECK(tr.alloc_failures == 0);
    CHECK(tr.live_final == live);
    if (tr.n_allocs != allocs || tr.live_final != live)
        fprintf(stderr, "%s: allocs %llu/%llu frees %llu/%llu live %llu/%llu\n", path,
                (unsigned long long)tr.n_allocs, (unsigned long long)allocs,
                (unsigned long long)tr.n_frees, (unsigned long long)frees,
                (unsigned long long)tr.live_final, (unsigned long long)live);
    gm__trace_free(&tr);
}

int main(void)
{
    char path[256];
    const char *tmp = getenv("TMPDIR");
    tmp = tmp && *tmp ? tmp : "/tmp";
    snprintf(path, sizeof path, "%s/gm_obs_trace_%d.csv", tmp, (int)getpid());
    one_round(path);
    one_round(path); /* a restart truncates and starts over */
    remove(path);
#ifdef GM_HAVE_ZLIB
    snprintf(path, sizeof path, "%s/gm_obs_trace_%d.csv.gz", tmp, (int)getpid());
    one_round(path);
    remove(path);
#else
    snprintf(path, sizeof path, "%s/gm_obs_trace_%d.csv.gz", tmp, (int)getpid());
    CHECK_RC(gm_trace_start(path), GM_NOT_SUPPORTED);
#endif
    return test_summary();
}
