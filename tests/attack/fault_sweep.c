/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fault_sweep.c — every failure point of a representative workload, in turn.
 *
 * Promise (CONVENTIONS.md, "Errors"; include/gpumem.h): the library never
 * crashes or aborts on an error the caller can handle, answers a failed host
 * allocation or backend call with a clean status and message, loses nothing,
 * and keeps its pool consistent.  The workload: pool create, a created
 * stream, allocations of several sizes on two streams, fills,
 * gm_record_stream, frees, trim, stats and their JSON, pinned host
 * allocations and copies, the sysmem fallback (an allocation over the limit
 * served from pinned host memory, recorded on a second stream and freed),
 * staged (pageable) copies both ways, trace start and
 * stop, leak tracking and its report, stream destroy, pool destroy, and
 * loading back the trace file it wrote.
 *
 * Sweep 1: for n = 1, 2, 3, ... the n-th host allocation of the library
 * fails (gm__malloc_fail_nth); stops at the first run in which no failure was
 * injected, i.e. when n is past the workload's last allocation.
 * Sweep 2: for every backend call kind, for n = 1, 2, ... the n-th call of
 * that kind fails, counted from the backend's open (so pool creation is
 * covered); stops for that kind at the first run with no injected failure.
 *
 * Each run checks: every call returns GM_OK or a clean error (a host, device
 * or backend status with a message); gm_pool_check passes before the pool is
 * destroyed; once all blocks are freed the stats show none; after the pool
 * is destroyed the library holds no more host blocks than before the run
 * (gm__malloc_live), which finds leaks without a sanitizer (ASan and
 * valgrind check the rest).  Under valgrind (GM_UNDER_VALGRIND) each sweep
 * takes every 5th n only; with GM_DEBUG >= 3 the backend sweeps run with
 * fewer small blocks.
 *
 * Backend-neutral: it uses the backend's fail_nth (the sim's, or the cuda
 * backend's driver-call injector); a backend without it: "skipped".
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>

#include "gpumem.h"
#include "../test.h"
#include "../lib/checks.h"
#include "backend/backend.h"
#include "base/internal.h"
#include "lib/trace_read.h"

#define MiB ((size_t)1 << 20)
#define NBLK 6
#define MANY 1100     /* > one slab of block descriptors, > half the live table */
#define MANY_HOST 300 /* > one slab of host block descriptors */

static gm_pool_config_t base_cfg;
/* The trace (and the call-site file the recorder writes beside it, PATH.sites)
 * go to a private directory under $TMPDIR, removed at the end: a file left
 * there makes the removal, and the test, fail. */
static char trace_dir[256];
static char trace_path[320];
static unsigned long runs;
static int verbose; /* GM_SWEEP_VERBOSE=1: name each run on stderr */
static int many_n = MANY; /* small blocks per run */

/* GM_OK, or an error a caller can handle (GM_IO too: the trace file), with
 * a message. */
static int clean(int rc) { return rc_clean(rc, GM_IO); }

#define CLEAN(expr)                                                            \
    do {                                                                       \
        int rc_ = (expr);                                                      \
        if (clean(rc_)) {                                                      \
            test_passed_++;                                                    \
        } else {                                                               \
            test_failed_++;                                                    \
            fprintf(stderr, "%s:%d: run %lu (%s): %s returned %s (%s)\n",      \
                    __FILE__, __LINE__, runs, what, #expr, gm_errname(rc_),    \
                    gm_last_error());                                          \
        }                                                                      \
    } while (0)

/* One run of the workload.  `what` names the injected fault. */
static void workload(const char *what)
{
    static const size_t sizes[NBLK] = {256, 4096, 100000, 3 * MiB, 9 * MiB, 700};
    void *p[NBLK] = {0};
    static void *many[MANY];
    memset(many, 0, sizeof many);
    gm_pool_t *pool = NULL;
    runs++;

    CLEAN(gm_leak_tracking(1));
    int rc = gm_pool_create(&base_cfg, &pool);
    CLEAN(rc);
    if (rc != GM_OK) {
        CLEAN(gm_leak_tracking(0));
        return;
    }
    int traced = gm_trace_start(trace_path) == GM_OK;

    gm_stream_t S = NULL, T = NULL;
    int made_t = gm_stream_create(pool, &T) == GM_OK;
    if (!made_t) T = NULL; /* the default stream plays both parts */
    gm_stream_t st[NBLK] = {S, T, S, T, S, T};

    for (int i = 0; i < NBLK; i++) {
        CLEAN(gm_alloc(pool, sizes[i], st[i], &p[i]));
        if (p[i]) CLEAN(gm_memset(pool, p[i], i + 1, sizes[i] < 8192 ? sizes[i] : 8192, st[i]));
    }
    if (p[0]) CLEAN(gm_record_stream(pool, p[0], T));
    for (int i = 0; i < NBLK; i += 2)
        if (p[i]) {
            CLEAN(gm_free(pool, p[i], st[i]));
            p[i] = NULL;
        }
    /* Enough small blocks to grow the block slabs and the live table. */
    for (int i = 0; i < many_n; i++) {
        CLEAN(gm_alloc(pool, 512, i & 1 ? T : S, &many[i]));
        if (i % 100 == 0 && many[i]) CLEAN(gm_record_stream(pool, many[i], i & 1 ? S : T));
    }
    for (int i = 0; i < many_n; i++)
        if (many[i]) CLEAN(gm_free(pool, many[i], i & 1 ? T : S));
    size_t released = 0;
    CLEAN(gm_trim(pool, 0, &released));
    CLEAN(gm_alloc(pool, 5000, T, &p[0]));

    gm_stats_t stats = GM_STATS_INIT;
    char json[8192];
    CLEAN(gm_pool_stats(pool, &stats));
    CLEAN(gm_stats_json(&stats, json, sizeof json, NULL));

    /* The sysmem fallback: no device memory may be added, so a request
     * needing a new page is served from pinned host memory. */
    void *sys = NULL;
    CLEAN(gm_pool_set_limit(pool, stats.reserved ? stats.reserved : 1));
    CLEAN(gm_alloc(pool, 3 * MiB, T, &sys));
    if (sys) {
        CLEAN(gm_record_stream(pool, sys, S));
        CLEAN(gm_memset(pool, sys, 7, 4096, T));
        CLEAN(gm_free(pool, sys, T));
    }
    CLEAN(gm_pool_set_limit(pool, 0));

    /* Pinned host memory and copies. */
    void *h1 = NULL, *h2 = NULL;
    CLEAN(gm_host_alloc(pool, 1000, S, &h1));
    CLEAN(gm_host_alloc(pool, 2 * MiB, T, &h2));
    if (h1 && p[1]) CLEAN(gm_memcpy(pool, h1, p[1], 1000, T));
    if (h2 && p[3]) CLEAN(gm_memcpy(pool, p[3], h2, 2 * MiB, T));
    CLEAN(gm_host_free(pool, h1, T));
    CLEAN(gm_host_free(pool, h2, T));
    for (int i = 0; i < MANY_HOST; i++) CLEAN(gm_host_alloc(pool, 300, i & 1 ? T : S, &many[i]));
    for (int i = 0; i < MANY_HOST; i++) CLEAN(gm_host_free(pool, many[i], i & 1 ? S : T));
    CLEAN(gm_host_trim(pool, 0, NULL));

    /* Staged copies from and to pageable memory. */
    size_t n = 3 * MiB;
    unsigned char *buf = malloc(n);
    if (buf && p[3]) {
        memset(buf, 0x3c, n);
        CLEAN(gm_memcpy_h2d(pool, p[3], buf, n, T));
        CLEAN(gm_memcpy_d2h(pool, buf, p[3], n, T));
    }
    free(buf);

    char report[4096];
    size_t len = 0;
    rc = gm_leak_report(pool, report, sizeof report, &len);
    CHECK(clean(rc) || rc == GM_INVALID_ARGUMENT); /* cut: a valid answer */

    rc = gm_pool_check(pool);
    CHECK_OK(rc);
    if (rc != GM_OK) fprintf(stderr, "  run %lu (%s)\n", runs, what);

    int all_freed = 1;
    for (int i = 0; i < NBLK; i++)
        if (p[i]) {
            rc = gm_free(pool, p[i], st[i]);
            CLEAN(rc);
            if (rc != GM_OK) all_freed = 0;
        }
    if (all_freed) {
        stats = (gm_stats_t)GM_STATS_INIT;
        if (gm_pool_stats(pool, &stats) == GM_OK)
            CHECK(stats.allocated == 0 && stats.live_blocks == 0);
    }
    CHECK_OK(gm_pool_check(pool));
    if (made_t) CLEAN(gm_stream_destroy(pool, T));
    if (traced) CLEAN(gm_trace_stop());
    gm_pool_destroy(pool);
    CLEAN(gm_leak_tracking(0));
    if (traced) { /* read back what it wrote, as the replay tools do */
        gm__trace_t t;
        memset(&t, 0, sizeof t);
        rc = gm__trace_load(trace_path, &t);
        CHECK(clean(rc) || rc == GM_PARSE);
        if (rc == GM_OK) CLEAN(gm__trace_check(&t));
        gm__trace_free(&t);
    }
}

/* One run, checking that the library's host blocks came back. */
static void run_checked(const char *what)
{
    long before = gm__malloc_live();
    if (verbose) fprintf(stderr, "run %lu: %s\n", runs + 1, what);
    workload(what);
    long after = gm__malloc_live();
    if (after != before)
        fprintf(stderr, "run %lu (%s): %ld host blocks before, %ld after\n", runs, what, before,
                after);
    CHECK(after == before);
}

/* Remove the trace and its call-site file, then the directory: anything else
 * left in it is named, removed, and fails the test. */
static void remove_trace_dir(void)
{
    char sites[340];
    snprintf(sites, sizeof sites, "%s.sites", trace_path);
    unlink(trace_path);
    unlink(sites);
    if (rmdir(trace_dir) == 0) return;
    DIR *d = opendir(trace_dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char p[600];
        snprintf(p, sizeof p, "%s/%s", trace_dir, e->d_name);
        fprintf(stderr, "left behind: %s\n", p);
        unlink(p);
    }
    if (d) closedir(d);
    CHECK(!"the sweep left files in its trace directory");
    rmdir(trace_dir);
}

int main(void)
{
    int vg = getenv("GM_UNDER_VALGRIND") != NULL;
    verbose = getenv("GM_SWEEP_VERBOSE") != NULL;
    unsigned long stride = vg ? 5 : 1;
    const char *tmp = getenv("TMPDIR");
    snprintf(trace_dir, sizeof trace_dir, "%s/gm_fault_sweep.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    REQUIRE(mkdtemp(trace_dir) != NULL);
    snprintf(trace_path, sizeof trace_path, "%s/trace.csv", trace_dir);

    REQUIRE(gm_config_from_env(&base_cfg) == GM_OK);
    base_cfg.sim_capacity = (size_t)512 << 20;
    base_cfg.copy_threads = 1;
    base_cfg.copy_chunk = 1 * MiB;
    base_cfg.flags |= GM_POOL_SYSMEM_FALLBACK;

    /* Does the backend inject faults? */
    gm_pool_t *probe = NULL;
    REQUIRE(gm_pool_create(&base_cfg, &probe) == GM_OK);
    int rc = gm_sim_fail_nth(probe, GM_CALL_map, 0);
    gm_pool_destroy(probe);
    if (rc == GM_NOT_SUPPORTED) {
        printf("skipped: the backend has no fail_nth\n");
        return 77; /* ctest: skipped */
    }

    /* Warm-up: process-wide state (registries, the trace writer's buffers)
     * is made once; a clean run must also pass. */
    workload("warm-up");
    run_checked("no fault");

    /* Sweep 1: host allocations. */
    unsigned long n, last = 0;
    int done = 0;
    for (n = 1; n < 100000 && !done; n += stride) {
        char what[64];
        snprintf(what, sizeof what, "host allocation #%lu fails", n);
        unsigned long before = gm__malloc_failures();
        gm__malloc_fail_nth(n);
        run_checked(what);
        gm__malloc_fail_nth(0);
        if (gm__malloc_failures() == before) done = 1;
        else last = n;
    }
    CHECK(done);
    CHECK(last > 10); /* the sweep really went through the workload */
    printf("host allocations: swept n = 1..%lu (step %lu), %lu runs so far\n", last, stride,
           runs);

    /* Sweep 2: every backend call kind.  Builds that validate the whole
     * pool after every mutation (GM_DEBUG >= 3, the ASan phase) take fewer
     * small blocks here: the slab growth they exercise is a host
     * allocation, swept above. */
#if GM_DEBUG >= 3
    many_n = 64;
#endif
    for (int k = 0; k < GM_CALL_COUNT; k++) {
        done = 0;
        last = 0;
        for (n = 1; n < 100000 && !done; n += stride) {
            char what[64];
            snprintf(what, sizeof what, "%s #%lu fails", gm_call_name(k), n);
            unsigned long before = gm__backend_injected();
            gm__backend_fail_at_open(k, n);
            run_checked(what);
            gm__backend_fail_at_open(k, 0);
            if (gm__backend_injected() == before) done = 1;
            else last = n;
        }
        CHECK(done);
        printf("%s: swept n = 1..%lu\n", gm_call_name(k), last);
    }
    printf("%lu runs\n", runs);
    remove_trace_dir();
    return test_summary();
}
