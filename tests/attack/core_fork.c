/* SPDX-License-Identifier: Apache-2.0 */
/*
 * core_fork.c — attacks fork(): (1) a child's allocations on a parent's pool
 * (sim) reused cached memfd pages that the parent still maps, so the child
 * wrote into the parent's memory; (2) a child forked while another thread
 * was inside the pool hung on the lock that thread held; (3) a child's new
 * pool was counted in the parent's `gpumem top` row.  Promised now: a
 * parent's pool is GM_INVALID_STATE in the child, at once; the child's own
 * pools get pages of their own and a monitor file of their own.
 */
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpumem.h"
#include "lib/monitor_read.h"
#include "../test.h"

#define MiB ((size_t)1 << 20)
#define REQUIRE_VOID(c) do { if (!(c)) { CHECK(c); return; } } while (0)

static gm_pool_t *new_pool(void)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = GM_BACKEND_SIM;
    cfg.sim_capacity = 64 * MiB;
    return pool_from(&cfg);
}

/* Wait for pid at most `secs`; kill it after.  Its exit code, or -1. */
static int wait_for(pid_t pid, int secs)
{
    int status;
    for (int i = 0; i < secs * 100; i++) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "child %d hung: killed\n", (int)pid);
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

/* The child's side of the pools: the parent's refuses, a new one works. */
static int child_checks(gm_pool_t *parent, void *parents_block)
{
    int bad = 0;
    void *p = NULL;
    int rc = gm_alloc(parent, MiB, NULL, &p);
    if (rc != GM_INVALID_STATE) {
        bad |= 1;
        if (rc == GM_OK && p) { /* show what it did: writes land in the parent */
            gm_memset(parent, p, 0x22, MiB, NULL);
            gm_stream_synchronize(parent, NULL);
        }
    }
    if (gm_free(parent, parents_block, NULL) != GM_INVALID_STATE) bad |= 2;
    gm_pool_t *mine = new_pool();
    if (!mine) return bad | 4;
    void *q = NULL;
    if (gm_alloc(mine, 5 * MiB, NULL, &q) != GM_OK) {
        bad |= 8;
    } else { /* fresh pages: writing them cannot reach the parent */
        if (gm_memset(mine, q, 0x33, 5 * MiB, NULL) != GM_OK) bad |= 8;
        if (gm_stream_synchronize(mine, NULL) != GM_OK) bad |= 8;
        if (gm_free(mine, q, NULL) != GM_OK) bad |= 8;
    }
    gm_pool_t *def = NULL;
    if (gm_default_pool(&def) != GM_OK || def == parent) {
        fprintf(stderr, "child: default pool: %s\n", gm_last_error());
        bad |= 16;
    }
    gm_pool_destroy(mine);
    return bad;
}

struct scan_arg {
    int pid, found;
    unsigned n_pools;
};

static void on_proc(const gm__mon_proc_view_t *v, void *arg)
{
    struct scan_arg *a = arg;
    if (v->pid != a->pid) return;
    a->found = 1;
    a->n_pools = v->n_pools;
}

/* (1) and (3). */
static void test_pages_and_monitor(void)
{
    gm_pool_t *pool = new_pool();
    if (!pool) { CHECK(0); return; }
    void *a, *y;
    CHECK_OK(gm_alloc(pool, MiB, NULL, &a));
    CHECK_OK(gm_memset(pool, a, 0x11, MiB, NULL));
    CHECK_OK(gm_alloc(pool, MiB, NULL, &y));
    CHECK_OK(gm_memset(pool, y, 0x11, MiB, NULL));
    CHECK_OK(gm_stream_synchronize(pool, NULL));
    CHECK_OK(gm_free(pool, y, NULL)); /* cached: what the child would reuse */

    int ready[2], go[2];
    REQUIRE_VOID(pipe(ready) == 0 && pipe(go) == 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int bad = child_checks(pool, a);
        /* Keep a pool of the child's alive while the parent looks at top. */
        gm_pool_t *held = new_pool();
        void *h = NULL;
        if (!held || gm_alloc(held, 7 * MiB, NULL, &h) != GM_OK) bad |= 32;
        char c = 1;
        if (write(ready[1], &c, 1) != 1 || read(go[0], &c, 1) != 1) bad |= 64;
        if (held) {
            gm_free(held, h, NULL);
            gm_pool_destroy(held);
        }
        _exit(bad);
    }
    CHECK(pid > 0);
    if (pid < 0) return;
    char c;
    CHECK(read(ready[0], &c, 1) == 1);
    struct scan_arg sa = {(int)getpid(), 0, 0};
    gm__monitor_scan(on_proc, &sa);
    CHECK(sa.found);
    CHECK(sa.n_pools == 1); /* the child's pools are not in our row */
    if (sa.n_pools != 1) fprintf(stderr, "parent's row shows %u pools\n", sa.n_pools);
    c = 1;
    CHECK(write(go[1], &c, 1) == 1);
    int code = wait_for(pid, 60);
    CHECK(code == 0);
    if (code) fprintf(stderr, "child said %d\n", code);
    close(ready[0]); close(ready[1]); close(go[0]); close(go[1]);

    /* The parent's memory is untouched: its live block, and its cached one. */
    unsigned char *buf = malloc(MiB);
    REQUIRE_VOID(buf != NULL);
    CHECK_OK(gm_memcpy(pool, buf, a, MiB, NULL));
    CHECK_OK(gm_stream_synchronize(pool, NULL));
    size_t wrong = 0;
    for (size_t i = 0; i < MiB; i++) wrong += buf[i] != 0x11; /* not 0x22, not 0x33 */
    CHECK(wrong == 0);
    void *y2;
    CHECK_OK(gm_alloc(pool, MiB, NULL, &y2));
    CHECK_OK(gm_memcpy(pool, buf, y2, MiB, NULL));
    CHECK_OK(gm_stream_synchronize(pool, NULL));
    size_t child_bytes = 0;
    for (size_t i = 0; i < MiB; i++) child_bytes += buf[i] == 0x22 || buf[i] == 0x33;
    CHECK(child_bytes == 0);
    free(buf);
    CHECK_OK(gm_free(pool, y2, NULL));
    CHECK_OK(gm_free(pool, a, NULL));
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
}

/* (2): fork while a thread hammers the pool (and the registry). */
static atomic_int stop;

static void *hammer(void *arg)
{
    gm_pool_t *pool = arg;
    unsigned i = 0;
    while (!atomic_load(&stop)) {
        void *p;
        if (gm_alloc(pool, 4096 + (i++ % 64) * 4096, NULL, &p) == GM_OK) gm_free(pool, p, NULL);
        if (i % 16 == 0) {
            gm_stats_t st = GM_STATS_INIT;
            gm_process_stats(&st);
        }
    }
    return NULL;
}

static void test_fork_while_busy(void)
{
    gm_pool_t *pool = new_pool();
    if (!pool) { CHECK(0); return; }
    pthread_t t;
    REQUIRE_VOID(pthread_create(&t, NULL, hammer, pool) == 0);
    int forks = getenv("GM_UNDER_VALGRIND") ? 3 : 20;
    void *a;
    CHECK_OK(gm_alloc(pool, MiB, NULL, &a));
    for (int k = 0; k < forks; k++) {
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) _exit(child_checks(pool, a));
        CHECK(pid > 0);
        if (pid < 0) break;
        int code = wait_for(pid, 60);
        CHECK(code == 0);
        if (code) {
            fprintf(stderr, "fork %d: child said %d\n", k, code);
            break;
        }
    }
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    CHECK_OK(gm_free(pool, a, NULL));
    gm_pool_destroy(pool);
}

int main(void)
{
    char dir[] = "/tmp/gm_core_fork.XXXXXX";
    if (!mkdtemp(dir)) return 1;
    setenv("GPUMEM_MONITOR_DIR", dir, 1);
    setenv("GPUMEM_MONITOR", "1", 1);
    setenv("GPUMEM_BACKEND", "sim", 1); /* the child's default pool: small */
    setenv("GPUMEM_SIM_CAPACITY", "64MiB", 1);
    test_pages_and_monitor();
    test_fork_while_busy();
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char path[600];
        while ((e = readdir(d)))
            if (e->d_name[0] != '.') {
                snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
                unlink(path);
            }
        closedir(d);
    }
    rmdir(dir);
    return test_summary();
}
