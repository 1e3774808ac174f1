/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_observe.c — observability through the public API: the stats fields
 * and their JSON, process stats and peak resets, the out-of-memory slow path
 * (report contents, a handler that frees and retries, one that declines,
 * handler bookkeeping), the leak report with and without stack tracking, a
 * child process with a planted leak under GPUMEM_LEAK_CHECK=1 and =error,
 * and the trace file's rows.
 *
 * Also a helper for the CLI tests: `test_observe hold` creates a pool,
 * allocates 3 MiB and 5 MiB, prints "ready" and holds them until stdin
 * closes (tests/obs/top_metrics.sh reads it with gpumem top and metrics).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpumem.h"
#include "../test.h"

#define MiB ((size_t)1 << 20)

static const char *self_path;

/* ---- stats ------------------------------------------------------------------ */

static void test_stats(void)
{
    gm_pool_t *a = test_pool(256 * MiB, 0), *b = test_pool(256 * MiB, 0);
    if (!a || !b) {
        CHECK(!"pools");
        gm_pool_destroy(a);
        gm_pool_destroy(b);
        return;
    }
    gm_stats_t p0 = GM_STATS_INIT;
    CHECK_OK(gm_process_stats(&p0));
    void *x, *y, *z;
    CHECK_OK(gm_alloc(a, 1000, NULL, &x));       /* small: 1024 active, shares a page */
    CHECK_OK(gm_alloc(a, 3 * MiB, NULL, &y));
    CHECK_OK(gm_alloc(b, 5 * MiB, NULL, &z));
    gm_stats_t sa = pool_stats_of(a), sb = pool_stats_of(b);
    CHECK(sa.allocated == 1000 + 3 * MiB);
    CHECK(sa.active == 1024 + 3 * MiB);
    CHECK(sa.allocated_total == 1000 + 3 * MiB);
    CHECK(sa.inactive_split > 0);                /* the rest of the small block's page */
    CHECK(sa.cached == sa.reserved - sa.active);
    CHECK(sb.allocated == 5 * MiB);

    gm_stats_t p = GM_STATS_INIT;
    CHECK_OK(gm_process_stats(&p));
    CHECK(p.allocated - p0.allocated == sa.allocated + sb.allocated);
    CHECK(p.alloc_count - p0.alloc_count == 3);
    CHECK(p.largest_free_block >= sa.largest_free_block);

    CHECK_OK(gm_free(a, y, NULL));
    sa = pool_stats_of(a);
    CHECK(sa.freed_total == 3 * MiB);
    CHECK(sa.allocated_peak == 1000 + 3 * MiB);
    CHECK_OK(gm_process_reset_peaks());
    sa = pool_stats_of(a);
    CHECK(sa.allocated_peak == 1000);

    char json[4096];
    size_t len = 0;
    CHECK_OK(gm_stats_json(&sa, json, sizeof json, &len));
    CHECK(strstr(json, "\"inactive_split\":") != NULL);
    CHECK(strstr(json, "\"allocated_total\":1000") == NULL); /* total kept 3 MiB + 1000 */
    CHECK(strstr(json, "\"freed_total\":3145728") != NULL);
    CHECK(strstr(json, "\"oom_handler_calls\":0") != NULL);
    CHECK(len == strlen(json));

    gm_stats_t bad = GM_STATS_INIT;
    bad.size = 4;
    CHECK_RC(gm_process_stats(&bad), GM_INVALID_ARGUMENT);
    CHECK_OK(gm_free(a, x, NULL));
    CHECK_OK(gm_free(b, z, NULL));
    gm_pool_destroy(a);
    gm_pool_destroy(b);
}

/* ---- out of memory ------------------------------------------------------------ */

typedef struct frees {
    gm_pool_t *pool;
    void *ptrs[64];
    int n;
    int calls;
    int decline;
} frees_t;

/* Free half of what the caller holds (like halving a batch), ask for a retry. */
static int free_half(gm_pool_t *pool, size_t size, gm_stream_t stream, void *user)
{
    frees_t *f = user;
    (void)size;
    (void)stream;
    f->calls++;
    if (f->decline || pool != f->pool) return 0;
    int half = f->n / 2;
    for (int i = half; i < f->n; i++) gm_free(pool, f->ptrs[i], NULL);
    f->n = half;
    return 1;
}

static int count_only(gm_pool_t *pool, size_t size, gm_stream_t stream, void *user)
{
    (void)pool;
    (void)size;
    (void)stream;
    ++*(int *)user;
    return 0;
}

static void test_oom(void)
{
    gm_pool_t *pool = test_pool(64 * MiB, 0);
    if (!pool) {
        CHECK(!"pool");
        return;
    }
    frees_t f = {.pool = pool};
    /* Fill: 14 blocks of 4 MiB (56 MiB) plus a tail. */
    for (int i = 0; i < 14; i++) CHECK_OK(gm_alloc(pool, 4 * MiB, NULL, &f.ptrs[f.n++]));
    void *big = NULL;
    /* On a GPU the 64 MiB is a limit we set: GM_LIMIT; on sim the device. */
    int sim = test_backend() == GM_BACKEND_SIM;
    int oom = sim ? GM_OUT_OF_MEMORY : GM_LIMIT;
    CHECK_RC(gm_alloc(pool, 24 * MiB, NULL, &big), oom);
    CHECK(big == NULL);
    const char *m = gm_last_error();
    CHECK(strstr(m, "cannot allocate 24.00 MiB (25165824 bytes)") != NULL);
    CHECK(strstr(m, "device 0 (") != NULL);
    CHECK(strstr(m, "): total ") != NULL);       /* device total */
    if (sim) CHECK(strstr(m, "total 64.00 MiB") != NULL);
    CHECK(strstr(m, ", free ") != NULL);         /* device free */
    CHECK(strstr(m, "allocated 56.00 MiB") != NULL);
    CHECK(strstr(m, "reserved ") != NULL);
    CHECK(strstr(m, "cached ") != NULL);
    CHECK(strstr(m, "largest free block ") != NULL);
    CHECK(strstr(m, "limit ") != NULL);
    CHECK(strstr(m, "the largest:") != NULL);
    int listed = 0;
    for (const char *p = m; (p = strstr(p, "4.00 MiB at 0x")); p++) listed++;
    CHECK(listed == 5);
    if (listed != 5) fprintf(stderr, "report:\n%s\n", m);
    gm_stats_t st = pool_stats_of(pool);
    CHECK(st.oom_count == 1);
    CHECK(st.alloc_failures == 1);

    /* A handler that declines: still OOM, called once per failure. */
    int counted = 0;
    CHECK_OK(gm_set_oom_handler(pool, count_only, &counted));
    CHECK_RC(gm_set_oom_handler(pool, count_only, &counted), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_alloc(pool, 24 * MiB, NULL, &big), oom);
    CHECK(counted == 1);
    CHECK(strstr(gm_last_error(), "OOM handlers 1") != NULL);

    /* Then one that frees half and asks for a retry: served. */
    CHECK_OK(gm_set_oom_handler(pool, free_half, &f));
    CHECK_OK(gm_alloc(pool, 24 * MiB, NULL, &big));
    CHECK(big != NULL);
    CHECK(f.calls == 1 && f.n == 7);
    CHECK(counted == 2); /* the first handler ran first and declined */
    st = pool_stats_of(pool);
    CHECK(st.retries == 1);
    CHECK(st.oom_count == 2);
    CHECK(st.oom_handler_calls == 3);

    /* Removal; the limit path reports too. */
    CHECK_OK(gm_remove_oom_handler(pool, count_only, &counted));
    CHECK_RC(gm_remove_oom_handler(pool, count_only, &counted), GM_INVALID_ARGUMENT);
    f.decline = 1;
    CHECK_OK(gm_pool_set_limit(pool, 32 * MiB));
    void *more = NULL;
    int rc = gm_alloc(pool, 40 * MiB, NULL, &more);
    CHECK(rc == GM_LIMIT);
    CHECK(strstr(gm_last_error(), "limit 32.00 MiB (pool limit)") != NULL);
    CHECK(counted == 2);
    CHECK_RC(gm_set_oom_handler(pool, NULL, NULL), GM_INVALID_ARGUMENT);

    CHECK_OK(gm_free(pool, big, NULL));
    for (int i = 0; i < f.n; i++) CHECK_OK(gm_free(pool, f.ptrs[i], NULL));
    gm_pool_destroy(pool);
}

/* ---- leaks ------------------------------------------------------------------ */

static __attribute__((noinline)) void *plant_leak(gm_pool_t *pool, size_t n)
{
    void *p = NULL;
    CHECK_OK(gm_alloc(pool, n, NULL, &p));
    return p;
}

static void test_leak_report(void)
{
    gm_pool_t *pool = test_pool(64 * MiB, 0);
    if (!pool) {
        CHECK(!"pool");
        return;
    }
    void *a = plant_leak(pool, 12345);
    char buf[8192];
    size_t len = 0;
    CHECK_OK(gm_leak_report(pool, buf, sizeof buf, &len));
    CHECK(strstr(buf, "Leaked 12345 bytes at 0x") != NULL);
    CHECK(strstr(buf, "(stack not recorded") != NULL);
    CHECK(strstr(buf, "LEAK SUMMARY: 12345 bytes leaked in 1 allocations") != NULL);
    CHECK(len == strlen(buf));

    CHECK_OK(gm_leak_tracking(1));
    void *b = plant_leak(pool, 777);
    CHECK_OK(gm_leak_tracking(0));
    CHECK_OK(gm_leak_report(pool, buf, sizeof buf, &len));
    CHECK(strstr(buf, "Leaked 777 bytes at 0x") != NULL);
    CHECK(strstr(buf, "    #0 0x") != NULL);
    CHECK(strstr(buf, "test_observe") != NULL); /* the first frame is ours, not the library's */
    CHECK(strstr(buf, "LEAK SUMMARY: 13122 bytes leaked in 2 allocations") != NULL);

    /* Too small: cut, NUL-terminated, the needed length reported. */
    char tiny[16];
    CHECK_RC(gm_leak_report(pool, tiny, sizeof tiny, &len), GM_INVALID_ARGUMENT);
    CHECK(strlen(tiny) == sizeof tiny - 1 && len > sizeof tiny);

    /* All pools of the process include this one. */
    CHECK_OK(gm_leak_report(NULL, buf, sizeof buf, NULL));
    CHECK(strstr(buf, "Leaked 777 bytes") != NULL);

    CHECK_OK(gm_free(pool, a, NULL));
    CHECK_OK(gm_free(pool, b, NULL));
    CHECK_OK(gm_leak_report(pool, buf, sizeof buf, NULL));
    CHECK(strcmp(buf, "LEAK SUMMARY: 0 bytes leaked in 0 allocations\n") == 0);
    gm_pool_destroy(pool);
}

/* Run `self mode` with GPUMEM_LEAK_CHECK=check; its stderr into err. */
static int run_child(const char *mode, const char *check, char *err, size_t cap)
{
    int fds[2];
    if (pipe(fds) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        setenv("GPUMEM_LEAK_CHECK", check, 1);
        execl(self_path, self_path, mode, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    size_t at = 0;
    ssize_t n;
    while ((n = read(fds[0], err + at, cap - 1 - at)) > 0) at += (size_t)n;
    err[at] = '\0';
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int child_leak(void)
{
    gm_pool_t *pool = test_pool(64 * MiB, 0);
    if (!pool) return 3;
    void *keep = plant_leak(pool, 4096);
    void *gone = plant_leak(pool, 8192);
    gm_free(pool, gone, NULL);
    (void)keep;
    return 0; /* exit without freeing or destroying: the exit check reports it */
}

static void test_leak_child(void)
{
    static char err[65536];
    int st = run_child("child-leak", "1", err, sizeof err);
    CHECK(st == 0);
    CHECK(strstr(err, "Leaked 4096 bytes at 0x") != NULL);
    CHECK(strstr(err, "Leaked 8192") == NULL);
    CHECK(strstr(err, "LEAK SUMMARY: 4096 bytes leaked in 1 allocations") != NULL);
    /* The stack names the function that leaked (addr2line, when installed)
     * or at least the program. */
    if (access("/usr/bin/addr2line", X_OK) == 0) CHECK(strstr(err, "plant_leak") != NULL);
    CHECK(strstr(err, "test_observe") != NULL);
    if (test_failed_) fprintf(stderr, "child stderr:\n%s\n", err);

    st = run_child("child-leak", "error", err, sizeof err);
    CHECK(st == GM_LEAK_EXIT_STATUS);
    CHECK(strstr(err, "LEAK SUMMARY: 4096 bytes leaked in 1 allocations") != NULL);

    /* No leak, error mode: status unchanged. */
    st = run_child("child-clean", "error", err, sizeof err);
    CHECK(st == 0);
    CHECK(strstr(err, "LEAK SUMMARY: 0 bytes leaked in 0 allocations") != NULL);
}

static int child_clean(void)
{
    gm_pool_t *pool = test_pool(64 * MiB, 0);
    if (!pool) return 3;
    void *p = plant_leak(pool, 4096);
    gm_free(pool, p, NULL);
    gm_pool_destroy(pool);
    return 0;
}

/* ---- the trace file ------------------------------------------------------------ */

static void test_trace_rows(void)
{
    char path[256];
    const char *tmp = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/gm_observe_%d.csv", tmp && *tmp ? tmp : "/tmp", (int)getpid());
    CHECK_RC(gm_trace_start(""), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_trace_start("/nonexistent-dir/x.csv"), GM_IO);
    CHECK_OK(gm_trace_start(path));
    gm_pool_t *pool = test_pool(64 * MiB, 0);
    if (!pool) {
        CHECK(!"pool");
        gm_trace_stop();
        return;
    }
    void *p[3];
    CHECK_OK(gm_alloc(pool, 1000, NULL, &p[0]));
    CHECK_OK(gm_alloc(pool, 2 * MiB, (gm_stream_t)0x42, &p[1]));
    CHECK_OK(gm_free(pool, p[0], NULL));
    int rc = gm_alloc(pool, 128 * MiB, NULL, &p[2]);
    CHECK(rc == GM_OUT_OF_MEMORY || rc == GM_LIMIT);
    CHECK_OK(gm_free(pool, p[1], (gm_stream_t)0x42));
    CHECK_OK(gm_trace_stop());
    CHECK_OK(gm_trace_stop()); /* twice is fine */
    void *after;
    CHECK_OK(gm_alloc(pool, 1000, NULL, &after)); /* not recorded */
    CHECK_OK(gm_free(pool, after, NULL));
    gm_pool_destroy(pool);

    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    if (!f) return;
    char line[256], want[64];
    CHECK(fgets(line, sizeof line, f) && !strcmp(line, "Thread,Time,Action,Pointer,Size,Stream\n"));
    int rows = 0, ok = 0;
    while (fgets(line, sizeof line, f)) {
        rows++;
        char *c = strchr(line, ',');
        c = c ? strchr(c + 1, ',') : NULL;
        if (!c) continue;
        c++;
        switch (rows) {
        case 1: snprintf(want, sizeof want, "allocate,%p,1000,0x0\n", p[0]); break;
        case 2: snprintf(want, sizeof want, "allocate,%p,2097152,0x42\n", p[1]); break;
        case 3: snprintf(want, sizeof want, "free,%p,1000,0x0\n", p[0]); break;
        case 4: snprintf(want, sizeof want, "allocate failure,0x0,134217728,0x0\n"); break;
        case 5: snprintf(want, sizeof want, "free,%p,2097152,0x42\n", p[1]); break;
        default: want[0] = '\0';
        }
        if (!strcmp(c, want)) ok++;
        else fprintf(stderr, "row %d: got %s want %s", rows, c, want);
    }
    fclose(f);
    CHECK(rows == 5);
    CHECK(ok == 5);
    remove(path);

    /* With leak tracking on, call sites go to PATH.sites, one per allocate row. */
    CHECK_OK(gm_leak_tracking(1));
    CHECK_OK(gm_trace_start(path));
    pool = test_pool(64 * MiB, 0);
    if (!pool) {
        CHECK(!"pool");
        gm_trace_stop();
        gm_leak_tracking(0);
        return;
    }
    void *q1 = plant_leak(pool, 4096), *q2 = plant_leak(pool, 8192);
    CHECK_OK(gm_free(pool, q1, NULL));
    CHECK_OK(gm_free(pool, q2, NULL));
    CHECK_OK(gm_trace_stop());
    CHECK_OK(gm_leak_tracking(0));
    gm_pool_destroy(pool);
    char sites[300];
    snprintf(sites, sizeof sites, "%s.sites", path);
    f = fopen(sites, "r");
    CHECK(f != NULL);
    if (!f) return;
    rows = 0;
    int named = 0;
    CHECK(fgets(line, sizeof line, f) && !strcmp(line, "Row,Bytes,Site\n"));
    while (fgets(line, sizeof line, f)) {
        rows++;
        if (strstr(line, "test_observe")) named++;
        if (rows == 1) CHECK(!strncmp(line, "1,4096,", 7));
        if (rows == 2) CHECK(!strncmp(line, "2,8192,", 7));
    }
    fclose(f);
    CHECK(rows == 2);
    CHECK(named == 2);
    remove(sites);
    remove(path);
}

int main(int argc, char **argv)
{
    self_path = argv[0];
    if (argc > 1 && !strcmp(argv[1], "child-leak")) return child_leak();
    if (argc > 1 && !strcmp(argv[1], "child-clean")) return child_clean();
    if (argc > 1 && !strcmp(argv[1], "hold")) {
        gm_pool_t *pool = test_pool(256 * MiB, 0);
        void *a = NULL, *b = NULL;
        if (!pool || gm_alloc(pool, 3 * MiB, NULL, &a) || gm_alloc(pool, 5 * MiB, NULL, &b))
            return 3;
        printf("ready %d\n", (int)getpid());
        fflush(stdout);
        char c;
        while (read(0, &c, 1) > 0) {}
        gm_free(pool, a, NULL);
        gm_free(pool, b, NULL);
        gm_pool_destroy(pool);
        return 0;
    }
    test_stats();
    test_oom();
    test_leak_report();
    test_leak_child();
    test_trace_rows();
    return test_summary();
}
