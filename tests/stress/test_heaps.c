/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_heaps.c — a pool with several heaps (gm_pool_config_t.heaps), many
 * threads at once.
 *
 * First the rules one can see from outside: threads are given heaps of
 * their own (their blocks lie in address ranges a device's size apart), a
 * block is freed by any thread, the pool limit holds for all heaps together
 * and an allocation that only fits once another heap gives its cached pages
 * back succeeds, gm_trim empties every heap, stats add up, a bad heap count
 * is refused.  Then the cross-stream reuse rule under random load with many
 * threads: each thread allocates and frees on streams of its own, holds and
 * releases them on the sim, hands some live blocks to other threads, which
 * check their data and free them on the owner's stream; every allocation is
 * checked against the ranges freed on held streams of any thread, while the
 * main thread runs gm_pool_check (every heap's invariants and the shared
 * limit figure) over and over.  The second part needs the sim (held
 * streams); the first runs on any backend (GPUMEM_TEST_BACKEND).
 *
 * usage: test_heaps [threads] [scale] [iterations] [seed]
 *   threads: workers of the random part (heaps: half as many, so heaps are
 *   shared too); iterations: operations per worker; scale: unused.
 */
// ctest-args: 8 1 3000 1
// ctest-valgrind: skip
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpumem.h"
#include "../test.h"

#define MiB ((size_t)1 << 20)
#define CAPACITY (512 * MiB)

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* ---- 1. the rules, a few threads ------------------------------------------------ */

typedef struct {
    gm_pool_t *pool;
    size_t size;
    void *ptr;
    int rc;
    int do_free;
} job_t;

static void *run_job(void *arg)
{
    job_t *j = arg;
    j->rc = gm_alloc(j->pool, j->size, NULL, &j->ptr);
    if (j->rc == GM_OK && j->do_free) j->rc = gm_free(j->pool, j->ptr, NULL);
    return NULL;
}

static void in_thread(job_t *j)
{
    pthread_t t;
    if (pthread_create(&t, NULL, run_job, j) != 0) {
        j->rc = -1;
        return;
    }
    pthread_join(t, NULL);
}

static void rules(void)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = test_backend();
    cfg.sim_capacity = CAPACITY;
    cfg.heaps = 65;
    gm_pool_t *bad = NULL;
    CHECK_RC(gm_pool_create(&cfg, &bad), GM_INVALID_ARGUMENT);
    CHECK(bad == NULL && strstr(gm_last_error(), "heaps") != NULL);

    cfg.heaps = 4;
    cfg.limit = 64 * MiB;
    gm_pool_t *pool = pool_from(&cfg);
    if (!pool) {
        CHECK(0);
        return;
    }
    /* Four threads, four heaps: address ranges a device apart. */
    job_t j[4];
    for (int i = 0; i < 4; i++) {
        j[i] = (job_t){.pool = pool, .size = 3 * MiB};
        in_thread(&j[i]);
        CHECK_OK(j[i].rc);
    }
    for (int a = 0; a < 4; a++)
        for (int b = a + 1; b < 4; b++) {
            uintptr_t x = (uintptr_t)j[a].ptr, y = (uintptr_t)j[b].ptr;
            CHECK((x > y ? x - y : y - x) >= CAPACITY);
        }
    gm_stats_t st = pool_stats_of(pool);
    CHECK(st.allocated == 12 * MiB && st.live_blocks == 4 && st.alloc_count == 4);
    size_t sz = 0;
    CHECK_OK(gm_block_size(pool, j[2].ptr, &sz));
    CHECK(sz == 3 * MiB);
    /* Freed here, by another thread than the one that made them. */
    for (int i = 0; i < 4; i++) CHECK_OK(gm_free(pool, j[i].ptr, NULL));
    CHECK_RC(gm_free(pool, j[1].ptr, NULL), GM_DOUBLE_FREE);
    CHECK_OK(gm_pool_check(pool));
    st = pool_stats_of(pool);
    CHECK(st.allocated == 0 && st.live_blocks == 0 && st.free_count == 4);

    /* The limit is the pool's: one heap caches 48 MiB, another then needs
     * 48 MiB, which fits only once the first gives its pages back. */
    job_t x = {.pool = pool, .size = 48 * MiB, .do_free = 1};
    in_thread(&x);
    CHECK_OK(x.rc);
    job_t y = {.pool = pool, .size = 48 * MiB};
    in_thread(&y);
    CHECK_OK(y.rc);
    CHECK(x.ptr != y.ptr);
    st = pool_stats_of(pool);
    CHECK(st.reserved <= cfg.limit && st.reserved_peak <= cfg.limit);
    CHECK(st.allocated == 48 * MiB);
    /* Nothing else fits now: refused, with the pool's figures. */
    job_t z = {.pool = pool, .size = 32 * MiB};
    in_thread(&z);
    CHECK_RC(z.rc, GM_LIMIT);
    CHECK_OK(gm_free(pool, y.ptr, NULL));
    size_t released = 0;
    CHECK_OK(gm_trim(pool, 0, &released));
    st = pool_stats_of(pool);
    CHECK(st.reserved == 0 && released >= 48 * MiB);
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
}

/* ---- 2. the stream rule, many threads ---------------------------------------------- */

#define STREAMS 2  /* per worker */
#define SLOTS 32   /* per worker */
#define MAX_GUARDED 8192
#define MAILBOX 64

typedef struct {
    uintptr_t lo, hi;
    int stream; /* global stream number */
    int all;
} guard_t;

typedef struct {
    void *ptr;
    size_t size;
    int stream;   /* global stream number it was allocated on */
    int recorded; /* global stream number, or -1 */
    unsigned char tag;
} blk_t;

static gm_pool_t *g_pool;
static int n_workers = 8, iterations = 3000;
static uint64_t g_seed;
static gm_stream_t *g_st;       /* n_workers * STREAMS */
static int *g_held;             /* under g_mu */
static unsigned *g_epoch;       /* under g_mu: holds begun */
static guard_t g_guards[MAX_GUARDED];
static int g_n_guards;
static blk_t g_mail[MAILBOX];
static int g_n_mail;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_ulong g_violations, g_corrupt, g_errors, g_allocs, g_ooms, g_remote;

static void err(const char *what, int rc)
{
    atomic_fetch_add(&g_errors, 1);
    fprintf(stderr, "test_heaps: %s failed: %d (%s)\n", what, rc, gm_last_error());
}

/* Check a block's data, free it on its stream, and guard its range while a
 * stream that used it stays held (only when the hold spanned the free). */
static void check_and_free(blk_t *b)
{
    unsigned char buf[64];
    size_t n = b->size < sizeof buf ? b->size : sizeof buf;
    int rc;
    if ((rc = gm_memcpy(g_pool, buf, b->ptr, n, g_st[b->stream])) != GM_OK) err("memcpy", rc);
    for (size_t i = 0; i < n; i++) if (buf[i] != b->tag) atomic_fetch_add(&g_corrupt, 1);
    if ((rc = gm_memcpy(g_pool, buf, (char *)b->ptr + b->size - n, n, g_st[b->stream])) != GM_OK)
        err("memcpy", rc);
    for (size_t i = 0; i < n; i++) if (buf[i] != b->tag) atomic_fetch_add(&g_corrupt, 1);
    int use[2] = {b->stream, b->recorded};
    int held0[2] = {0, 0};
    unsigned ep0[2] = {0, 0};
    pthread_mutex_lock(&g_mu);
    for (int k = 0; k < 2; k++)
        if (use[k] >= 0) held0[k] = g_held[use[k]], ep0[k] = g_epoch[use[k]];
    pthread_mutex_unlock(&g_mu);
    if ((rc = gm_free(g_pool, b->ptr, g_st[b->stream])) != GM_OK) err("free", rc);
    uintptr_t lo = (uintptr_t)b->ptr, hi = lo + b->size;
    pthread_mutex_lock(&g_mu);
    for (int k = 0; k < 2; k++)
        if (use[k] >= 0 && held0[k] && g_held[use[k]] && g_epoch[use[k]] == ep0[k] &&
            g_n_guards < MAX_GUARDED)
            g_guards[g_n_guards++] = (guard_t){lo, hi, use[k], k == 1};
    pthread_mutex_unlock(&g_mu);
    b->ptr = NULL;
}

static void *worker(void *arg)
{
    int w = (int)(intptr_t)arg;
    uint64_t r = 0x9e3779b97f4a7c15ULL * (uint64_t)(w + 1) ^ g_seed;
    blk_t slots[SLOTS];
    memset(slots, 0, sizeof slots);
    for (int it = 0; it < iterations; it++) {
        unsigned action = (unsigned)(rnd(&r) % 32);
        if (action == 0) { /* toggle a hold of one of our streams */
            int s = w * STREAMS + (int)(rnd(&r) % STREAMS);
            pthread_mutex_lock(&g_mu);
            if (g_held[s]) { /* its work is done: its guarded ranges are free for all */
                int k = 0;
                for (int g = 0; g < g_n_guards; g++)
                    if (g_guards[g].stream != s) g_guards[k++] = g_guards[g];
                g_n_guards = k;
            } else {
                g_epoch[s]++;
            }
            g_held[s] = !g_held[s];
            int rc = gm_sim_hold_stream(g_pool, g_st[s], g_held[s]);
            pthread_mutex_unlock(&g_mu);
            if (rc != GM_OK) err("hold", rc);
            continue;
        }
        if (action == 1) { /* another thread's block: check it and free it */
            blk_t b = {0};
            pthread_mutex_lock(&g_mu);
            if (g_n_mail) b = g_mail[--g_n_mail];
            pthread_mutex_unlock(&g_mu);
            if (b.ptr) {
                check_and_free(&b);
                atomic_fetch_add(&g_remote, 1);
            }
            continue;
        }
        blk_t *sl = &slots[rnd(&r) % SLOTS];
        if (sl->ptr) {
            if (action == 2) { /* hand it over */
                pthread_mutex_lock(&g_mu);
                if (g_n_mail < MAILBOX) {
                    g_mail[g_n_mail++] = *sl;
                    sl->ptr = NULL;
                }
                pthread_mutex_unlock(&g_mu);
                if (!sl->ptr) continue;
            }
            check_and_free(sl);
            continue;
        }
        int s = w * STREAMS + (int)(rnd(&r) % STREAMS);
        size_t size = (size_t)256 << (rnd(&r) % 14); /* 256 B .. 2 MiB */
        size += rnd(&r) % size;
        void *p = NULL;
        int rc = gm_alloc(g_pool, size, g_st[s], &p);
        if (rc == GM_LIMIT || rc == GM_OUT_OF_MEMORY) {
            atomic_fetch_add(&g_ooms, 1);
            continue;
        }
        if (rc != GM_OK) {
            err("alloc", rc);
            continue;
        }
        atomic_fetch_add(&g_allocs, 1);
        pthread_mutex_lock(&g_mu);
        int k = 0;
        for (int g = 0; g < g_n_guards; g++) {
            guard_t *gd = &g_guards[g];
            bool overlap = (uintptr_t)p < gd->hi && (uintptr_t)p + size > gd->lo;
            if (overlap && (gd->all || gd->stream != s)) {
                atomic_fetch_add(&g_violations, 1);
                fprintf(stderr, "worker %d: stream %d got [%p, +%zu), freed on held stream %d\n",
                        w, s, p, size, gd->stream);
            }
            if (!overlap) g_guards[k++] = *gd; /* live again: no longer guarded */
        }
        g_n_guards = k;
        pthread_mutex_unlock(&g_mu);
        sl->ptr = p;
        sl->size = size;
        sl->stream = s;
        sl->tag = (unsigned char)(rnd(&r) | 1);
        sl->recorded = -1;
        if (rnd(&r) % 8 == 0) { /* also used on our other stream */
            int u = w * STREAMS + (s % STREAMS == 0);
            if ((rc = gm_record_stream(g_pool, p, g_st[u])) != GM_OK) err("record", rc);
            else sl->recorded = u;
        }
        if ((rc = gm_memset(g_pool, p, sl->tag, size, g_st[s])) != GM_OK) err("memset", rc);
    }
    /* Leave nothing held and nothing live of ours. */
    for (int i = 0; i < SLOTS; i++)
        if (slots[i].ptr) check_and_free(&slots[i]);
    return NULL;
}

static void stream_rule(unsigned long seed)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = GM_BACKEND_SIM;
    cfg.sim_capacity = CAPACITY;
    cfg.limit = 96 * MiB;
    cfg.heaps = n_workers > 1 ? (unsigned)(n_workers + 1) / 2 : 1;
    g_pool = pool_from(&cfg);
    if (!g_pool) {
        CHECK(0);
        return;
    }
    int ns = n_workers * STREAMS;
    g_st = calloc((size_t)ns, sizeof *g_st);
    g_held = calloc((size_t)ns, sizeof *g_held);
    g_epoch = calloc((size_t)ns, sizeof *g_epoch);
    if (!g_st || !g_held || !g_epoch) {
        CHECK(0);
        return;
    }
    for (int i = 0; i < ns; i++) CHECK_OK(gm_stream_create(g_pool, &g_st[i]));
    g_seed = (uint64_t)seed * 0x2545f4914f6cdd1dULL;
    pthread_t *th = calloc((size_t)n_workers, sizeof *th);
    for (int w = 0; w < n_workers; w++)
        CHECK(pthread_create(&th[w], NULL, worker, (void *)(intptr_t)w) == 0);
    /* Meanwhile: every heap's invariants, over and over. */
    unsigned long checks = 0, bad_checks = 0;
    for (int w = 0; w < n_workers; w++) {
        while (pthread_tryjoin_np(th[w], NULL) != 0) {
            if (gm_pool_check(g_pool) != GM_OK) {
                bad_checks++;
                fprintf(stderr, "test_heaps: gm_pool_check: %s\n", gm_last_error());
            }
            checks++;
            gm_stats_t st = pool_stats_of(g_pool);
            if (st.reserved > cfg.limit) bad_checks++;
        }
    }
    free(th);
    /* The mailbox's leftovers, then every hold released. */
    for (int i = 0; i < g_n_mail; i++) check_and_free(&g_mail[i]);
    g_n_mail = 0;
    for (int s = 0; s < ns; s++)
        if (g_held[s]) CHECK_OK(gm_sim_hold_stream(g_pool, g_st[s], 0));
    CHECK(bad_checks == 0);
    CHECK(checks > 0);
    CHECK(atomic_load(&g_errors) == 0);
    CHECK(atomic_load(&g_violations) == 0);
    CHECK(atomic_load(&g_corrupt) == 0);
    CHECK(atomic_load(&g_allocs) > (unsigned long)(n_workers * iterations) / 8);
    CHECK(n_workers < 2 || atomic_load(&g_remote) > 0);
    CHECK_OK(gm_pool_check(g_pool));
    gm_stats_t st = pool_stats_of(g_pool);
    CHECK(st.allocated == 0 && st.live_blocks == 0);
    CHECK(st.reserved <= cfg.limit && st.reserved_peak <= cfg.limit);
    CHECK(st.alloc_count == st.free_count);
    printf("test_heaps: %d threads on %u heaps: %lu allocations (%lu freed by another thread), "
           "%lu refused under the limit, %lu pool checks meanwhile\n",
           n_workers, cfg.heaps, atomic_load(&g_allocs), atomic_load(&g_remote),
           atomic_load(&g_ooms), checks);
    for (int i = 0; i < ns; i++) CHECK_OK(gm_stream_destroy(g_pool, g_st[i]));
    CHECK_OK(gm_trim(g_pool, 0, NULL));
    st = pool_stats_of(g_pool);
    CHECK(st.reserved == 0);
    if (st.reserved) { char js[8192]; gm_stats_json(&st, js, sizeof js, NULL); fprintf(stderr, "%s\n", js); }
    gm_pool_destroy(g_pool);
    free(g_st);
    free(g_held);
    free(g_epoch);
}

int main(int argc, char **argv)
{
    int scale = 1;
    unsigned long seed = 1;
    int rc = stress_args(argc, argv, &n_workers, &scale, &iterations, &seed, 1);
    if (rc) return rc;
    rules();
    if (test_backend() == GM_BACKEND_SIM) stream_rule(seed);
    else printf("test_heaps: the stream-rule part needs held streams (the sim); not run\n");
    return test_summary();
}
