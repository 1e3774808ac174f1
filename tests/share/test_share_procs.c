/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_share_procs.c — sharing between real processes: lifecycles and
 * faults (kill -9 on either side).  Every role runs in a process of its own
 * and makes its own pool; a process forks its helpers before it makes any
 * pool (a pool or a server of the parent is unusable in a fork child), and
 * they coordinate over pipes.  The coordinator (main) makes no pool at all.
 *
 *   a  one exporter, 4 importers: bytes, tokens, ranges, writes back, stats
 *   b  importers killed (-9) while holding 100 names, and at random moments
 *      of import/release loops: the exporter's exported_bytes / peers go to
 *      0 within 1 s, its descriptors return to their count, and its blocks
 *      are freed for real after gm_free + unpublish (both orders)
 *   c  the exporter killed (-9) while an importer maps its memory (idle, or
 *      in the middle of an import loop on another thread): the mapping
 *      stays valid and writable, release works, a new import is GM_IO at
 *      once, imports == 0; the next exporter replaces the stale socket
 *   d  the exporter frees blocks that are imported: GM_OK, then
 *      GM_DOUBLE_FREE; the importer reads the old bytes while the exporter
 *      allocates and writes new blocks; held_for_peers_bytes until the last
 *      peer lets go (and, while still published, until unpublish)
 *   e  1000 publish / import / release cycles: no descriptor leaked on
 *      either side, every figure back to 0
 *   f  read-only imports: writes through them fail on the sim (recorded
 *      only, on cuda)
 *   g  a second gm_free of a freed, imported block, racing the server
 *      thread's handling of the last release: always GM_DOUBLE_FREE, and a
 *      block the owner allocates meanwhile stays its own
 *
 * Deterministic given the seed (argv[1], default below): the kill points,
 * sizes and orders come from it.  Each child's CHECK counts come back to the
 * coordinator over a pipe; a child that is killed on purpose reports its
 * failures over its own pipe first.
 */
// ctest-valgrind: skip
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpumem.h"
#include "test.h"
#include "share_util.h"
#include "lib/procs.h"

#define MiB ((size_t)1 << 20)

/* Messages over the pipes (one uint64_t each); a failed KCHECK sends TP_FAIL. */
enum { M_GO = 1, M_READY, M_VERIFIED, M_WRITE, M_WRITTEN, M_RELEASE, M_RELEASED, M_DONE,
       M_HOLDING, M_STARTED, M_CHECK, M_CHECKED, M_ACK, M_END };

static unsigned long long g_seed = 0x5ea7c0de2024ull;
static const char *g_tmp = "/tmp";

#define RQ(c) do { if (!(c)) { CHECK(c); return; } } while (0)

/* ---- small helpers ---------------------------------------------------------- */

static uint64_t rng_below(uint64_t *s, uint64_t n) { return rng_next(s) % n; }

static size_t page_of(gm_pool_t *p)
{
    gm_device_info_t d = GM_DEVICE_INFO_INIT;
    if (gm_pool_device_info(p, &d) != GM_OK) return 0;
    return d.granularity;
}

static gm_share_stats_t sstats(gm_pool_t *p)
{
    gm_share_stats_t s = GM_SHARE_STATS_INIT;
    CHECK_OK(gm_share_stats(p, &s));
    return s;
}

static void sock_path(char *out, size_t cap, const char *what)
{
    snprintf(out, cap, "%s/gm-sp-%s-%d.sock", g_tmp, what, (int)getpid());
    unlink(out);
}

/* Device [src, +n) all `v`. */
static int all_is(gm_pool_t *p, const void *src, unsigned char v, size_t n)
{
    unsigned char *h = malloc(n);
    if (!h) return 0;
    int ok = gm_memcpy(p, h, src, n, NULL) == GM_OK && gm_stream_synchronize(p, NULL) == GM_OK;
    for (size_t i = 0; ok && i < n; i++) ok = h[i] == v;
    free(h);
    return ok;
}

/* ---- a: one exporter, several importers ------------------------------------- */

#define A_KIDS 4
typedef struct {
    char path[108];
    unsigned tag;
    size_t size, mid_off, mid_len;
    int idx;
} a_arg_t;

static void a_importer(tp_link_t *l, void *argp)
{
    a_arg_t *a = argp;
    uint64_t v;
    RQ(tp_get(l->in, &v, TP_WAIT_MS) == 0 && v == M_GO);
    gm_pool_t *pool = test_pool(256 * MiB, 0);
    RQ(pool != NULL);
    size_t page = page_of(pool);
    gm_share_client_t *cli = NULL;
    RQ(gm_share_connect(pool, a->path, &cli) == GM_OK);
    void *p = NULL, *m = NULL;
    size_t n = 0;
    int acc = -1;
    CHECK_OK(gm_share_import(cli, "a-blk", NULL, &p, &n, &acc));
    RQ(p != NULL);
    CHECK(n == a->size && acc == GM_SHARE_READ_WRITE && (uintptr_t)p % page == 0);
    CHECK(sh_same(pool, p, a->tag, 0, a->size));
    CHECK_RC(gm_share_import(cli, "a-mid", "nope", &m, NULL, NULL), GM_DENIED);
    CHECK_RC(gm_share_import(cli, "a-mid", NULL, &m, NULL, NULL), GM_DENIED);
    CHECK_OK(gm_share_import(cli, "a-mid", "tok-a", &m, &n, &acc));
    RQ(m != NULL);
    CHECK(n == a->mid_len && acc == GM_SHARE_READ_WRITE &&
          (uintptr_t)m % page == a->mid_off % page);
    CHECK(sh_same(pool, m, a->tag, a->mid_off, a->mid_len));
    size_t mid_pages = (a->mid_off + a->mid_len + page - 1) / page - a->mid_off / page;
    gm_share_stats_t s = sstats(pool);
    CHECK(s.imports == 2 && s.imported_bytes == (a->size / page + mid_pages) * page);
    tp_put(l->out, M_VERIFIED);
    RQ(tp_get(l->in, &v, TP_WAIT_MS) == 0 && v == M_WRITE);
    /* A marker of its own near the end of the block, through its mapping. */
    CHECK_OK(gm_memset(pool, (char *)p + a->size - 4096 + (size_t)a->idx * 64, 0xA0 + a->idx, 64,
                       NULL));
    CHECK_OK(gm_stream_synchronize(pool, NULL));
    tp_put(l->out, M_WRITTEN);
    RQ(tp_get(l->in, &v, TP_WAIT_MS) == 0 && v == M_RELEASE);
    /* Every importer's marker is visible to every other one. */
    for (int i = 0; i < A_KIDS; i++)
        CHECK(all_is(pool, (char *)p + a->size - 4096 + (size_t)i * 64, 0xA0 + i, 64));
    CHECK_OK(gm_share_release(cli, m, NULL));
    CHECK_OK(gm_share_release(cli, p, NULL));
    CHECK_RC(gm_share_release(cli, p, NULL), GM_INVALID_POINTER);
    s = sstats(pool);
    CHECK(s.imports == 0 && s.imported_bytes == 0);
    CHECK_OK(gm_share_disconnect(cli));
    gm_pool_destroy(pool);
    tp_put(l->out, M_DONE);
}

static void role_a(void)
{
    tp_kid_t k[A_KIDS];
    a_arg_t args[A_KIDS];
    char path[108];
    sock_path(path, sizeof path, "a");
    for (int i = 0; i < A_KIDS; i++) {
        args[i] = (a_arg_t){.tag = 5, .size = 8 * MiB, .mid_off = 3 * MiB + 123,
                            .mid_len = MiB + 7, .idx = i};
        memcpy(args[i].path, path, sizeof path);
        k[i] = tp_spawn(a_importer, &args[i]);
        RQ(k[i].pid > 0);
    }
    gm_pool_t *pool = test_pool(256 * MiB, 0);
    RQ(pool != NULL);
    size_t page = page_of(pool);
    RQ(page > 0);
    gm_stats_t base = pool_stats_of(pool);
    void *blk = NULL;
    RQ(gm_alloc_shareable(pool, 8 * MiB, NULL, &blk) == GM_OK);
    CHECK_OK(sh_fill(pool, blk, 5, 0, 8 * MiB));
    gm_share_server_t *srv = NULL;
    RQ(gm_share_listen(pool, path, NULL, &srv) == GM_OK);
    CHECK_OK(gm_share_publish(srv, "a-blk", blk, 8 * MiB, GM_SHARE_READ_WRITE, NULL, NULL));
    CHECK_OK(gm_share_publish(srv, "a-mid", (char *)blk + args[0].mid_off, args[0].mid_len,
                              GM_SHARE_READ_WRITE, "tok-a", NULL));
    int fd1 = fd_count();
    for (int i = 0; i < A_KIDS; i++) tp_put(k[i].to, M_GO);
    int ok = 1;
    for (int i = 0; i < A_KIDS; i++) ok &= tp_expect(&k[i], M_VERIFIED);
    size_t mid_pages = (args[0].mid_off + args[0].mid_len + page - 1) / page -
                       args[0].mid_off / page;
    gm_share_stats_t s = sstats(pool);
    if (ok) {
        CHECK(s.peers == A_KIDS);
        CHECK(s.exported_bytes == A_KIDS * (8 * MiB / page + mid_pages) * page);
        CHECK(s.published == 2 && s.published_bytes == 8 * MiB + args[0].mid_len);
    }
    for (int i = 0; i < A_KIDS; i++) tp_put(k[i].to, M_WRITE);
    for (int i = 0; i < A_KIDS; i++) tp_expect(&k[i], M_WRITTEN);
    /* The importers' writes are in the exporter's memory; nothing else moved. */
    for (int i = 0; i < A_KIDS; i++)
        CHECK(all_is(pool, (char *)blk + 8 * MiB - 4096 + (size_t)i * 64, 0xA0 + i, 64));
    CHECK(sh_same(pool, blk, 5, 0, 8 * MiB - 4096));
    CHECK(sh_same(pool, (char *)blk + 8 * MiB - 4096 + A_KIDS * 64, 5, 8 * MiB - 4096 + A_KIDS * 64,
               4096 - A_KIDS * 64));
    for (int i = 0; i < A_KIDS; i++) tp_put(k[i].to, M_RELEASE);
    for (int i = 0; i < A_KIDS; i++) {
        tp_expect(&k[i], M_DONE);
        CHECK(tp_exited_ok(tp_wait(k[i].pid, TP_WAIT_MS)));
    }
    WAIT_FOR(sstats(pool).exported_bytes == 0 && sstats(pool).peers == 0, 60000);
    s = sstats(pool);
    CHECK(s.exported_bytes == 0 && s.peers == 0 && s.peers_dropped == 0 && s.peers_refused == 0);
    WAIT_FOR(fd_count() == fd1, 60000);
    CHECK(fd_count() == fd1);
    CHECK_OK(gm_share_unpublish(srv, "a-blk"));
    CHECK_OK(gm_share_unpublish(srv, "a-mid"));
    CHECK_OK(gm_free(pool, blk, NULL));
    gm_stats_t st = pool_stats_of(pool);
    CHECK(st.live_blocks == base.live_blocks && st.allocated == base.allocated);
    CHECK_OK(gm_share_close(srv));
    CHECK(access(path, F_OK) != 0);
    for (int i = 0; i < A_KIDS; i++) tp_kid_close(&k[i]);
    gm_pool_destroy(pool);
}

/* ---- b: importers killed ---------------------------------------------------- */

#define B_NAMES 100
#define B_BLOCKS 4
#define B_BLOCK_PAGES 4
#define B_HOLD_KIDS 3
#define B_LOOP_KIDS 12
typedef struct {
    int blk;
    size_t off, len;
    int access, token;
} b_name_t;
typedef struct {
    char path[108];
    uint64_t seed;
    int loop;
    b_name_t names[B_NAMES];
} b_arg_t;

static void b_name(char *out, int i) { snprintf(out, 16, "h%03d", i); }
static void b_token(char *out, int i) { snprintf(out, 16, "tk%03d", i); }

/* Import name i (its token when it has one), checking head and tail. */
static int b_import(gm_pool_t *pool, gm_share_client_t *cli, const b_arg_t *a, int i, void **p,
                    int verify)
{
    char nm[16], tk[16];
    b_name(nm, i);
    b_token(tk, i);
    size_t n = 0;
    int acc = -1;
    int rc = gm_share_import(cli, nm, a->names[i].token ? tk : NULL, p, &n, &acc);
    if (rc != GM_OK) {
        fprintf(stderr, "pid %d: import %s: %s\n", (int)getpid(), nm, gm_last_error());
        return rc;
    }
    const b_name_t *b = &a->names[i];
    if (n != b->len || acc != b->access) return GM_INTERNAL;
    if (verify) {
        size_t k = b->len < 64 ? b->len : 64;
        if (!sh_same(pool, *p, 60 + b->blk, b->off, k)) return GM_INTERNAL;
        if (!sh_same(pool, (char *)*p + b->len - k, 60 + b->blk, b->off + b->len - k, k))
            return GM_INTERNAL;
    }
    return GM_OK;
}

static void b_importer(tp_link_t *l, void *argp)
{
    b_arg_t *a = argp;
    uint64_t v;
    RQ(tp_get(l->in, &v, 60000) == 0 && v == M_GO);
    uint64_t rng = a->seed;
    gm_pool_t *pool = test_pool(256 * MiB, 0);
    RQ(pool != NULL);
    size_t page = page_of(pool);
    gm_share_client_t *cli = NULL;
    int rc = gm_share_connect(pool, a->path, &cli);
    KCHECK(rc == GM_OK);
    if (rc != GM_OK) return;
    void *p[B_NAMES] = {0};
    if (!a->loop) {
        /* Hold every name (a third of them twice), then wait for the kill. */
        size_t want = 0;
        for (int i = 0; i < B_NAMES; i++) {
            KCHECK(b_import(pool, cli, a, i, &p[i], rng_below(&rng, 4) == 0) == GM_OK);
            const b_name_t *b = &a->names[i];
            want += ((b->off + b->len + page - 1) / page - b->off / page) * page;
        }
        for (int i = 0; i < B_NAMES; i += 3) {
            void *q = NULL;
            KCHECK(b_import(pool, cli, a, i, &q, 0) == GM_OK && q == p[i]);
        }
        gm_share_stats_t s = sstats(pool);
        KCHECK(s.imports == B_NAMES && s.imported_bytes == want);
        tp_put(l->out, M_HOLDING);
        tp_get(l->in, &v, 60000); /* killed meanwhile */
        return;
    }
    /* Import and release at random until killed. */
    int held[B_NAMES] = {0};
    tp_put(l->out, M_STARTED);
    for (long it = 0; it < 10000000; it++) {
        int i = (int)rng_below(&rng, B_NAMES);
        if (held[i] < 2 && rng_below(&rng, 3) != 0) {
            void *q = NULL;
            int r2 = b_import(pool, cli, a, i, &q, rng_below(&rng, 8) == 0);
            KCHECK(r2 == GM_OK && (!held[i] || q == p[i]));
            if (r2 != GM_OK) break;
            p[i] = q;
            held[i]++;
        } else if (held[i]) {
            KCHECK(gm_share_release(cli, p[i], NULL) == GM_OK);
            held[i]--;
        }
    }
    gm_share_disconnect(cli);
    gm_pool_destroy(pool);
}

static void role_b(void)
{
    uint64_t rng = g_seed ^ 0xB;
    static b_arg_t arg; /* the layout of the names, the same for every kid */
    sock_path(arg.path, sizeof arg.path, "b");
    /* The layout is in units of a page of 2 MiB (the sim's and CUDA's usual
     * granularity); checked against the real page below. */
    const size_t pg = 2 * MiB, bsize = B_BLOCK_PAGES * pg;
    for (int i = 0; i < B_NAMES; i++) {
        b_name_t *b = &arg.names[i];
        b->blk = (int)rng_below(&rng, B_BLOCKS);
        b->off = (size_t)rng_below(&rng, bsize - 1);
        size_t room = bsize - b->off, cap = room < 3 * pg ? room : 3 * pg;
        b->len = 1 + (size_t)rng_below(&rng, cap);
        b->access = (int)rng_below(&rng, 2);
        b->token = rng_below(&rng, 3) == 0;
    }
    tp_kid_t k[B_HOLD_KIDS + B_LOOP_KIDS];
    uint64_t kill_after_us[B_HOLD_KIDS + B_LOOP_KIDS];
    for (int j = 0; j < B_HOLD_KIDS + B_LOOP_KIDS; j++) {
        arg.seed = rng_next(&rng);
        arg.loop = j >= B_HOLD_KIDS;
        kill_after_us[j] = arg.loop ? rng_below(&rng, 40000) : rng_below(&rng, 5000);
        k[j] = tp_spawn(b_importer, &arg);
        RQ(k[j].pid > 0);
    }
    gm_pool_t *pool = test_pool(256 * MiB, 0);
    RQ(pool != NULL);
    size_t page = page_of(pool);
    if (page != pg) {
        printf("b: page of %zu bytes, not 2 MiB: skipped\n", page);
        for (int j = 0; j < B_HOLD_KIDS + B_LOOP_KIDS; j++) tp_kill(&k[j]);
        gm_pool_destroy(pool);
        return;
    }
    gm_stats_t base = pool_stats_of(pool);
    void *blk[B_BLOCKS];
    for (int b = 0; b < B_BLOCKS; b++) {
        RQ(gm_alloc_shareable(pool, bsize, NULL, &blk[b]) == GM_OK);
        CHECK_OK(sh_fill(pool, blk[b], 60 + b, 0, bsize));
    }
    gm_share_server_t *srv = NULL;
    RQ(gm_share_listen(pool, arg.path, NULL, &srv) == GM_OK);
    size_t all_bytes = 0;
    for (int i = 0; i < B_NAMES; i++) {
        char nm[16], tk[16];
        b_name(nm, i);
        b_token(tk, i);
        const b_name_t *b = &arg.names[i];
        CHECK_OK(gm_share_publish(srv, nm, (char *)blk[b->blk] + b->off, b->len, b->access,
                                  b->token ? tk : NULL, NULL));
        all_bytes += ((b->off + b->len + page - 1) / page - b->off / page) * page;
    }
    int fd_base = fd_count();
    double worst = 0;
    for (int j = 0; j < B_HOLD_KIDS + B_LOOP_KIDS; j++) {
        tp_put(k[j].to, M_GO);
        if (j < B_HOLD_KIDS) {
            if (!tp_expect(&k[j], M_HOLDING)) { tp_kill(&k[j]); continue; }
            gm_share_stats_t s = sstats(pool);
            CHECK(s.peers == 1 && s.exported_bytes == all_bytes);
        } else {
            if (!tp_expect(&k[j], M_STARTED)) { tp_kill(&k[j]); continue; }
        }
        sleep_us((long)kill_after_us[j]);
        tp_kill(&k[j]);
        double t0 = now_ms();
        WAIT_FOR(sstats(pool).exported_bytes == 0 && sstats(pool).peers == 0, 60000);
        double dt = now_ms() - t0;
        if (dt > worst) worst = dt;
        gm_share_stats_t s = sstats(pool);
        if (s.exported_bytes || s.peers)
            fprintf(stderr, "b: kid %d killed after %llu us: exported %llu peers %llu after 1 s\n",
                    j, (unsigned long long)kill_after_us[j], (unsigned long long)s.exported_bytes,
                    (unsigned long long)s.peers);
        CHECK(s.exported_bytes == 0 && s.peers == 0);
        CHECK(s.peers_dropped == 0 && s.held_for_peers_bytes == 0);
        tp_kid_close(&k[j]);
        int want = fd_base - 2 * (j + 1);
        WAIT_FOR(fd_count() == want, 60000);
        if (fd_count() != want) fprintf(stderr, "b: %d descriptors, want %d\n", fd_count(), want);
        CHECK(fd_count() == want);
    }
    printf("b: %d importers killed; the exporter let go within %.1f ms at worst\n",
           B_HOLD_KIDS + B_LOOP_KIDS, worst);
    /* Blocks 0 and 1: freed while published (kept), then unpublished.
     * Blocks 2 and 3: unpublished, then freed. */
    gm_stats_t before = pool_stats_of(pool);
    for (int b = 0; b < 2; b++) {
        CHECK_OK(gm_free(pool, blk[b], NULL));
        CHECK_RC(gm_free(pool, blk[b], NULL), GM_DOUBLE_FREE);
    }
    gm_stats_t st = pool_stats_of(pool);
    CHECK(st.live_blocks == before.live_blocks);
    gm_share_stats_t s = sstats(pool);
    CHECK(s.held_for_peers_bytes == 2 * bsize);
    for (int i = 0; i < B_NAMES; i++) {
        char nm[16];
        b_name(nm, i);
        CHECK_OK(gm_share_unpublish(srv, nm));
    }
    s = sstats(pool);
    CHECK(s.published == 0 && s.published_bytes == 0 && s.held_for_peers_bytes == 0);
    st = pool_stats_of(pool);
    CHECK(st.live_blocks == base.live_blocks + 2);
    for (int b = 2; b < B_BLOCKS; b++) CHECK_OK(gm_free(pool, blk[b], NULL));
    st = pool_stats_of(pool);
    CHECK(st.live_blocks == base.live_blocks && st.allocated == base.allocated);
    CHECK_OK(gm_share_close(srv));
    CHECK(access(arg.path, F_OK) != 0);
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
}

/* ---- c: the exporter killed ------------------------------------------------- */

#define C_ROUNDS 6
#define C_X (8 * MiB)
#define C_Y (4 * MiB)
typedef struct { char path[108]; unsigned tag; } c_arg_t;

static void c_exporter(tp_link_t *l, void *argp)
{
    c_arg_t *a = argp;
    uint64_t v;
    if (tp_get(l->in, &v, 60000) != 0 || v != M_GO) return; /* not needed */
    gm_pool_t *pool = test_pool(256 * MiB, 0);
    RQ(pool != NULL);
    void *x = NULL, *y = NULL;
    RQ(gm_alloc_shareable(pool, C_X, NULL, &x) == GM_OK);
    RQ(gm_alloc_shareable(pool, C_Y, NULL, &y) == GM_OK);
    CHECK_OK(sh_fill(pool, x, a->tag, 0, C_X));
    CHECK_OK(sh_fill(pool, y, a->tag + 1, 0, C_Y));
    gm_share_server_t *srv = NULL;
    /* The socket of the previous round's exporter (killed) is still there. */
    int rc = gm_share_listen(pool, a->path, NULL, &srv);
    KCHECK(rc == GM_OK);
    if (rc != GM_OK) fprintf(stderr, "c: listen: %s\n", gm_last_error());
    RQ(rc == GM_OK);
    CHECK_OK(gm_share_publish(srv, "x", x, C_X, GM_SHARE_READ_WRITE, NULL, NULL));
    CHECK_OK(gm_share_publish(srv, "y", y, C_Y, GM_SHARE_READ_ONLY, NULL, NULL));
    tp_put(l->out, M_READY);
    tp_get(l->in, &v, 60000); /* killed meanwhile */
}

typedef struct {
    gm_pool_t *pool;
    gm_share_client_t *cli;
    unsigned tag;
    atomic_int done;
    int last_rc, bad;
    long ops;
    double worst_ms;
} c_loop_t;

/* Import and release "y" until an import fails (the exporter died). */
static void *c_loop(void *arg)
{
    c_loop_t *L = arg;
    for (;;) {
        double t0 = now_ms();
        void *q = NULL;
        size_t n = 0;
        int rc = gm_share_import(L->cli, "y", NULL, &q, &n, NULL);
        double dt = now_ms() - t0;
        if (dt > L->worst_ms) L->worst_ms = dt;
        if (rc != GM_OK) { L->last_rc = rc; break; }
        L->ops++;
        if (n != C_Y || !sh_same(L->pool, (char *)q + (L->ops % 64) * 4096, L->tag + 1,
                              (L->ops % 64) * 4096, 256))
            L->bad++;
        if (gm_share_release(L->cli, q, NULL) != GM_OK) { L->bad++; break; }
    }
    atomic_store(&L->done, 1);
    return NULL;
}

static void role_c(void)
{
    uint64_t rng = g_seed ^ 0xC;
    tp_kid_t k[C_ROUNDS];
    c_arg_t args[C_ROUNDS];
    char path[108];
    sock_path(path, sizeof path, "c"); /* the same path every round */
    for (int r = 0; r < C_ROUNDS; r++) {
        memcpy(args[r].path, path, sizeof path);
        args[r].tag = 20 + 2 * (unsigned)r;
        k[r] = tp_spawn(c_exporter, &args[r]);
        RQ(k[r].pid > 0);
    }
    gm_pool_t *pool = test_pool(256 * MiB, 0);
    RQ(pool != NULL);
    int modes[2] = {0, 0};
    for (int r = 0; r < C_ROUNDS; r++) {
        int mode = r < 2 ? r : (int)rng_below(&rng, 2); /* both modes at least once */
        long delay = (long)rng_below(&rng, 20000);
        modes[mode]++;
        unsigned tag = args[r].tag;
        int fd0 = fd_count();
        tp_put(k[r].to, M_GO);
        if (!tp_expect(&k[r], M_READY)) { tp_kill(&k[r]); continue; }
        gm_share_client_t *cli = NULL;
        CHECK_OK(gm_share_connect(pool, path, &cli));
        if (!cli) { tp_kill(&k[r]); continue; }
        void *x = NULL, *x2 = NULL, *y = NULL;
        size_t n = 0;
        int acc = -1;
        CHECK_OK(gm_share_import(cli, "x", NULL, &x, &n, &acc));
        CHECK_OK(gm_share_import(cli, "x", NULL, &x2, NULL, NULL));
        CHECK(x && x2 == x && n == C_X && acc == GM_SHARE_READ_WRITE);
        CHECK(x && sh_same(pool, x, tag, 0, C_X));
        CHECK_OK(gm_share_import(cli, "y", NULL, &y, &n, &acc));
        CHECK(y && n == C_Y && acc == GM_SHARE_READ_ONLY);
        if (x) CHECK_OK(gm_memset(pool, (char *)x + 4096, 0x5c, 100, NULL));
        c_loop_t L = {.pool = pool, .cli = cli, .tag = tag};
        pthread_t th;
        int threaded = 0;
        if (mode == 1) {
            if (y) CHECK_OK(gm_share_release(cli, y, NULL));
            y = NULL;
            threaded = pthread_create(&th, NULL, c_loop, &L) == 0;
            CHECK(threaded);
            sleep_us(delay);
        }
        /* The exporter dies while this process maps its memory. */
        tp_kill(&k[r]);
        if (threaded) {
            WAIT_FOR(atomic_load(&L.done), 60000);
            CHECK(atomic_load(&L.done));
            if (atomic_load(&L.done)) {
                pthread_join(th, NULL);
                if (L.last_rc != GM_IO)
                    fprintf(stderr, "c: the import after the exporter died: %d (%s)\n",
                            L.last_rc, gm_last_error());
                CHECK(L.last_rc == GM_IO);
                CHECK(L.bad == 0);
                CHECK(L.worst_ms < 3000);
            }
        }
        /* The mapping stays: the bytes are there and it still takes writes. */
        if (x) {
            CHECK(sh_same(pool, x, tag, 0, 4096));
            CHECK(all_is(pool, (char *)x + 4096, 0x5c, 100));
            CHECK(sh_same(pool, (char *)x + 4196, tag, 4196, C_X - 4196));
            CHECK_OK(gm_memset(pool, (char *)x + C_X - 100, 0x3d, 100, NULL));
            CHECK(all_is(pool, (char *)x + C_X - 100, 0x3d, 100));
        }
        if (y) CHECK(sh_same(pool, y, tag + 1, 0, C_Y));
        /* New imports: GM_IO, at once. */
        void *t = NULL;
        double t0 = now_ms();
        CHECK_RC(gm_share_import(cli, "y-new", NULL, &t, NULL, NULL), GM_IO);
        CHECK(now_ms() - t0 < 2000);
        CHECK(t == NULL);
        if (x) {
            CHECK_OK(gm_share_release(cli, x, NULL));
            CHECK_OK(gm_share_release(cli, x, NULL));
            CHECK_RC(gm_share_release(cli, x, NULL), GM_INVALID_POINTER);
        }
        if (y) CHECK_OK(gm_share_release(cli, y, NULL));
        t0 = now_ms();
        CHECK_RC(gm_share_import(cli, "x", NULL, &t, NULL, NULL), GM_IO);
        CHECK(now_ms() - t0 < 2000);
        gm_share_stats_t s = sstats(pool);
        CHECK(s.imports == 0 && s.imported_bytes == 0);
        /* Nobody listens on the (stale) socket any more. */
        gm_share_client_t *c2 = NULL;
        t0 = now_ms();
        CHECK(gm_share_connect(pool, path, &c2) != GM_OK && c2 == NULL);
        CHECK(now_ms() - t0 < 2000);
        CHECK_OK(gm_share_disconnect(cli));
        tp_kid_close(&k[r]);
        int want = fd0 - 2;
        if (fd_count() != want) fprintf(stderr, "c: %d descriptors, want %d\n", fd_count(), want);
        CHECK(fd_count() == want);
    }
    printf("c: %d exporters killed (%d idle, %d during an import loop)\n", C_ROUNDS, modes[0],
           modes[1]);
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
    unlink(path);
}

/* ---- d: the exporter frees what is imported --------------------------------- */

typedef struct { char path[108]; } d_arg_t;
#define D_A (8 * MiB)
#define D_B (4 * MiB)

static void d_importer(tp_link_t *l, void *argp)
{
    d_arg_t *a = argp;
    uint64_t v;
    RQ(tp_get(l->in, &v, TP_WAIT_MS) == 0 && v == M_GO);
    gm_pool_t *pool = test_pool(256 * MiB, 0);
    RQ(pool != NULL);
    gm_share_client_t *cli = NULL;
    RQ(gm_share_connect(pool, a->path, &cli) == GM_OK);
    void *pa = NULL, *pb = NULL;
    CHECK_OK(gm_share_import(cli, "d-a", NULL, &pa, NULL, NULL));
    CHECK_OK(gm_share_import(cli, "d-b", NULL, &pb, NULL, NULL));
    RQ(pa && pb);
    CHECK(sh_same(pool, pa, 10, 0, D_A) && sh_same(pool, pb, 11, 0, D_B));
    tp_put(l->out, M_VERIFIED);
    RQ(tp_get(l->in, &v, TP_WAIT_MS) == 0 && v == M_CHECK);
    /* Freed by the owner, who wrote new blocks since: the old bytes. */
    CHECK(sh_same(pool, pa, 10, 0, D_A));
    CHECK(sh_same(pool, pb, 11, 0, D_B));
    tp_put(l->out, M_CHECKED);
    RQ(tp_get(l->in, &v, TP_WAIT_MS) == 0 && v == M_RELEASE);
    CHECK_OK(gm_share_release(cli, pa, NULL));
    tp_put(l->out, M_RELEASED);
    RQ(tp_get(l->in, &v, TP_WAIT_MS) == 0 && v == M_RELEASE);
    CHECK(sh_same(pool, pb, 11, 0, D_B));
    CHECK_OK(gm_share_release(cli, pb, NULL));
    tp_put(l->out, M_RELEASED);
    RQ(tp_get(l->in, &v, TP_WAIT_MS) == 0 && v == M_END);
    CHECK_OK(gm_share_disconnect(cli));
    gm_pool_destroy(pool);
    tp_put(l->out, M_DONE);
}

static void role_d(void)
{
    d_arg_t arg;
    sock_path(arg.path, sizeof arg.path, "d");
    tp_kid_t k = tp_spawn(d_importer, &arg);
    RQ(k.pid > 0);
    gm_pool_t *pool = test_pool(512 * MiB, 0);
    RQ(pool != NULL);
    gm_stats_t base = pool_stats_of(pool);
    void *a = NULL, *b = NULL;
    RQ(gm_alloc_shareable(pool, D_A, NULL, &a) == GM_OK);
    RQ(gm_alloc_shareable(pool, D_B, NULL, &b) == GM_OK);
    CHECK_OK(sh_fill(pool, a, 10, 0, D_A));
    CHECK_OK(sh_fill(pool, b, 11, 0, D_B));
    gm_share_server_t *srv = NULL;
    RQ(gm_share_listen(pool, arg.path, NULL, &srv) == GM_OK);
    CHECK_OK(gm_share_publish(srv, "d-a", a, D_A, GM_SHARE_READ_WRITE, NULL, NULL));
    CHECK_OK(gm_share_publish(srv, "d-b", b, D_B, GM_SHARE_READ_ONLY, NULL, NULL));
    tp_put(k.to, M_GO);
    RQ(tp_expect(&k, M_VERIFIED));
    gm_stats_t s0 = pool_stats_of(pool);
    CHECK_OK(gm_free(pool, a, NULL));
    CHECK_RC(gm_free(pool, a, NULL), GM_DOUBLE_FREE);
    CHECK_OK(gm_free(pool, b, NULL));
    CHECK_RC(gm_free(pool, b, NULL), GM_DOUBLE_FREE);
    gm_stats_t st = pool_stats_of(pool);
    CHECK(st.live_blocks == s0.live_blocks && st.allocated == s0.allocated);
    gm_share_stats_t s = sstats(pool);
    CHECK(s.held_for_peers_bytes == D_A + D_B);
    /* "d-a" is now held by the importer alone; "d-b" stays published. */
    CHECK_OK(gm_share_unpublish(srv, "d-a"));
    CHECK_RC(gm_free(pool, a, NULL), GM_DOUBLE_FREE);
    s = sstats(pool);
    CHECK(s.held_for_peers_bytes == D_A + D_B && s.published == 1);
    /* New blocks, written all over: none lands on the held pages. */
    enum { NEW = 8 };
    void *nb[NEW];
    size_t new_bytes = 0;
    for (int i = 0; i < NEW; i++) {
        size_t sz = i % 2 ? 8 * MiB : 3 * MiB + 4096 * (size_t)i;
        nb[i] = NULL;
        CHECK_OK(i % 2 ? gm_alloc_shareable(pool, sz, NULL, &nb[i]) : gm_alloc(pool, sz, NULL, &nb[i]));
        if (!nb[i]) continue;
        new_bytes += sz;
        uintptr_t p = (uintptr_t)nb[i];
        CHECK(p + sz <= (uintptr_t)a || p >= (uintptr_t)a + D_A);
        CHECK(p + sz <= (uintptr_t)b || p >= (uintptr_t)b + D_B);
        CHECK_OK(gm_memset(pool, nb[i], 0xEE, sz, NULL));
    }
    CHECK_OK(gm_stream_synchronize(pool, NULL));
    tp_put(k.to, M_CHECK);
    tp_expect(&k, M_CHECKED);
    s = sstats(pool);
    CHECK(s.held_for_peers_bytes == D_A + D_B);
    st = pool_stats_of(pool);
    CHECK(st.live_blocks == s0.live_blocks + NEW);
    /* The importer lets go of "d-a": freed for real. */
    tp_put(k.to, M_RELEASE);
    tp_expect(&k, M_RELEASED);
    /* (the server thread frees it just after it stops counting it as held) */
    WAIT_FOR(sstats(pool).held_for_peers_bytes == D_B &&
             pool_stats_of(pool).live_blocks == s0.live_blocks + NEW - 1, 60000);
    s = sstats(pool);
    CHECK(s.held_for_peers_bytes == D_B);
    st = pool_stats_of(pool);
    CHECK(st.live_blocks == s0.live_blocks + NEW - 1);
    CHECK(st.allocated == s0.allocated + new_bytes - D_A);
    /* ... and of "d-b", still published: kept until unpublished. */
    tp_put(k.to, M_RELEASE);
    tp_expect(&k, M_RELEASED);
    WAIT_FOR(sstats(pool).exported_bytes == 0, 60000);
    s = sstats(pool);
    CHECK(s.exported_bytes == 0 && s.held_for_peers_bytes == D_B);
    CHECK(pool_stats_of(pool).live_blocks == s0.live_blocks + NEW - 1);
    CHECK_OK(gm_share_unpublish(srv, "d-b"));
    s = sstats(pool);
    CHECK(s.held_for_peers_bytes == 0 && s.published == 0);
    st = pool_stats_of(pool);
    CHECK(st.live_blocks == s0.live_blocks + NEW - 2);
    CHECK(gm_free(pool, b, NULL) != GM_OK); /* freed for real now */
    tp_put(k.to, M_END);
    tp_expect(&k, M_DONE);
    CHECK(tp_exited_ok(tp_wait(k.pid, TP_WAIT_MS)));
    for (int i = 0; i < NEW; i++) if (nb[i]) CHECK_OK(gm_free(pool, nb[i], NULL));
    st = pool_stats_of(pool);
    CHECK(st.live_blocks == base.live_blocks && st.allocated == base.allocated);
    CHECK_OK(gm_pool_check(pool));
    CHECK_OK(gm_share_close(srv));
    tp_kid_close(&k);
    gm_pool_destroy(pool);
}

/* ---- e: many cycles --------------------------------------------------------- */

#define E_CYCLES 1000
typedef struct { char path[108]; } e_arg_t;

static void e_importer(tp_link_t *l, void *argp)
{
    e_arg_t *a = argp;
    uint64_t v;
    RQ(tp_get(l->in, &v, TP_WAIT_MS) == 0 && v == M_GO);
    gm_pool_t *pool = test_pool(256 * MiB, 0);
    RQ(pool != NULL);
    int fd0 = fd_count();
    gm_share_client_t *cli = NULL;
    RQ(gm_share_connect(pool, a->path, &cli) == GM_OK);
    int bad = 0;
    for (;;) {
        uint64_t w, size;
        if (tp_get(l->in, &w, TP_WAIT_MS) != 0) { CHECK(!"no word"); break; }
        if (w == M_END) break;
        if (tp_get(l->in, &size, TP_WAIT_MS) != 0) { CHECK(!"no size"); break; }
        unsigned long i = (unsigned long)(w >> 8);
        int access = (int)(w >> 1 & 1), tok = (int)(w & 1);
        char nm[16];
        snprintf(nm, sizeof nm, "e%lu", i % 7);
        void *p = NULL, *p2 = NULL;
        size_t n = 0;
        int acc = -1;
        int rc = gm_share_import(cli, nm, tok ? "tk" : NULL, &p, &n, &acc);
        if (rc != GM_OK || n != size || acc != access) {
            if (bad++ < 5) fprintf(stderr, "e: cycle %lu: import %s: %d %s\n", i, nm, rc,
                                   gm_last_error());
            tp_put(l->out, TP_FAIL);
            continue;
        }
        uint64_t stamp[2] = {0, 0}, tail[2] = {0, 0};
        if (gm_memcpy(pool, stamp, p, sizeof stamp, NULL) != GM_OK ||
            gm_memcpy(pool, tail, (char *)p + size - sizeof tail, sizeof tail, NULL) != GM_OK ||
            gm_stream_synchronize(pool, NULL) != GM_OK || stamp[0] != i ||
            stamp[1] != (i ^ g_seed) || tail[0] != ~(uint64_t)i || tail[1] != size)
            bad++;
        if (i % 5 == 0) {
            if (gm_share_import(cli, nm, tok ? "tk" : NULL, &p2, NULL, NULL) != GM_OK || p2 != p)
                bad++;
            if (gm_share_release(cli, p, NULL) != GM_OK) bad++;
        }
        if (gm_share_release(cli, p, NULL) != GM_OK) bad++;
        if (i % 100 == 99) { /* a new connection now and then */
            if (gm_share_disconnect(cli) != GM_OK) bad++;
            cli = NULL;
            if (gm_share_connect(pool, a->path, &cli) != GM_OK) { bad++; tp_put(l->out, TP_FAIL); break; }
        }
        tp_put(l->out, M_ACK);
    }
    CHECK(bad == 0);
    if (cli) CHECK_OK(gm_share_disconnect(cli));
    gm_share_stats_t s = sstats(pool);
    CHECK(s.imports == 0 && s.imported_bytes == 0);
    int fd1 = fd_count();
    if (fd1 != fd0) fprintf(stderr, "e: importer has %d descriptors, had %d\n", fd1, fd0);
    CHECK(fd1 == fd0);
    gm_pool_destroy(pool);
    tp_put(l->out, M_DONE);
}

static void role_e(void)
{
    uint64_t rng = g_seed ^ 0xE;
    e_arg_t arg;
    sock_path(arg.path, sizeof arg.path, "e");
    tp_kid_t k = tp_spawn(e_importer, &arg);
    RQ(k.pid > 0);
    gm_pool_t *pool = test_pool(256 * MiB, 0);
    RQ(pool != NULL);
    size_t page = page_of(pool);
    gm_share_server_t *srv = NULL;
    RQ(gm_share_listen(pool, arg.path, NULL, &srv) == GM_OK);
    gm_stats_t base = pool_stats_of(pool);
    CHECK_OK(gm_trim(pool, 0, NULL));
    int fd0 = fd_count();
    tp_put(k.to, M_GO);
    double t0 = now_ms();
    int done = 0, fails = 0;
    for (unsigned long i = 0; i < E_CYCLES; i++) {
        size_t size = page * (1 + (size_t)rng_below(&rng, 3)) - (size_t)rng_below(&rng, 4096);
        int access = (int)rng_below(&rng, 2), tok = (int)rng_below(&rng, 2);
        int free_first = (int)rng_below(&rng, 2);
        void *p = NULL;
        if (gm_alloc_shareable(pool, size, NULL, &p) != GM_OK) { CHECK(!"alloc"); break; }
        uint64_t stamp[2] = {i, i ^ g_seed}, tail[2] = {~(uint64_t)i, size};
        CHECK_OK(gm_memcpy(pool, p, stamp, sizeof stamp, NULL));
        CHECK_OK(gm_memcpy(pool, (char *)p + size - sizeof tail, tail, sizeof tail, NULL));
        char nm[16];
        snprintf(nm, sizeof nm, "e%lu", i % 7);
        int rc = gm_share_publish(srv, nm, p, size, access, tok ? "tk" : NULL, NULL);
        if (rc != GM_OK) { CHECK_OK(rc); break; }
        tp_put(k.to, (uint64_t)i << 8 | (uint64_t)access << 1 | (uint64_t)tok);
        tp_put(k.to, size);
        uint64_t v = 0;
        if (tp_get(k.from, &v, TP_WAIT_MS) != 0) { CHECK(!"no answer"); break; }
        fails += v == TP_FAIL;
        if (free_first) {
            CHECK_OK(gm_free(pool, p, NULL));
            CHECK_OK(gm_share_unpublish(srv, nm));
        } else {
            CHECK_OK(gm_share_unpublish(srv, nm));
            CHECK_OK(gm_free(pool, p, NULL));
        }
        done++;
    }
    tp_put(k.to, M_END);
    tp_expect(&k, M_DONE);
    CHECK(tp_exited_ok(tp_wait(k.pid, TP_WAIT_MS)));
    CHECK(done == E_CYCLES && fails == 0);
    double dt = now_ms() - t0;
    WAIT_FOR(sstats(pool).exported_bytes == 0 && sstats(pool).held_for_peers_bytes == 0 &&
             sstats(pool).peers == 0 && pool_stats_of(pool).live_blocks == base.live_blocks, 60000);
    gm_share_stats_t s = sstats(pool);
    CHECK(s.exported_bytes == 0 && s.held_for_peers_bytes == 0 && s.peers == 0 &&
          s.published == 0 && s.published_bytes == 0 && s.peers_dropped == 0);
    gm_stats_t st = pool_stats_of(pool);
    CHECK(st.live_blocks == base.live_blocks && st.allocated == base.allocated);
    tp_kid_close(&k);
    CHECK_OK(gm_trim(pool, 0, NULL));
    int fd1 = fd_count();
    if (fd1 != fd0 - 2) fprintf(stderr, "e: exporter has %d descriptors, want %d\n", fd1, fd0 - 2);
    CHECK(fd1 == fd0 - 2);
    printf("e: %d publish/import/release cycles in %.0f ms\n", done, dt);
    CHECK_OK(gm_pool_check(pool));
    CHECK_OK(gm_share_close(srv));
    gm_pool_destroy(pool);
}

/* ---- f: read-only imports --------------------------------------------------- */

typedef struct { char path[108]; } f_arg_t;

static void f_importer(tp_link_t *l, void *argp)
{
    f_arg_t *a = argp;
    int sim = test_backend() == GM_BACKEND_SIM;
    uint64_t v;
    RQ(tp_get(l->in, &v, TP_WAIT_MS) == 0 && v == M_GO);
    gm_pool_t *pool = test_pool(256 * MiB, 0);
    RQ(pool != NULL);
    gm_share_client_t *cli = NULL;
    RQ(gm_share_connect(pool, a->path, &cli) == GM_OK);
    void *ro = NULL, *rw = NULL;
    int acc = -1;
    CHECK_OK(gm_share_import(cli, "f-ro", NULL, &ro, NULL, &acc));
    RQ(ro != NULL);
    CHECK(acc == GM_SHARE_READ_ONLY);
    CHECK_OK(gm_share_import(cli, "f-rw", NULL, &rw, NULL, &acc));
    RQ(rw != NULL);
    CHECK(acc == GM_SHARE_READ_WRITE);
    CHECK(sh_same(pool, ro, 40, 0, 4 * MiB));
    /* Reading from it works, into device memory too. */
    CHECK_OK(gm_memcpy(pool, rw, ro, 64, NULL));
    CHECK_OK(gm_stream_synchronize(pool, NULL));
    CHECK(sh_same(pool, rw, 40, 0, 64));
    CHECK_OK(gm_memset(pool, (char *)rw + 64, 0x77, 64, NULL));
    CHECK_OK(gm_stream_synchronize(pool, NULL));
    /* Writes through the read-only mapping (last: on a GPU a faulting copy
     * may spoil the context). */
    unsigned char h[64];
    memset(h, 0x11, sizeof h);
    int rc1 = gm_memset(pool, ro, 0, 64, NULL);
    if (rc1 == GM_OK) rc1 = gm_stream_synchronize(pool, NULL);
    int rc2 = gm_memcpy(pool, (char *)ro + 100, h, sizeof h, NULL);
    if (rc2 == GM_OK) rc2 = gm_stream_synchronize(pool, NULL);
    int rc3 = gm_memcpy(pool, (char *)ro + 4096, rw, 64, NULL);
    if (rc3 == GM_OK) rc3 = gm_stream_synchronize(pool, NULL);
    printf("f: writes through a read-only import on %s: memset %s (%d), h2d %s (%d), "
           "d2d %s (%d)\n", sim ? "sim" : "cuda", rc1 ? "refused" : "DONE", rc1,
           rc2 ? "refused" : "DONE", rc2, rc3 ? "refused" : "DONE", rc3);
    if (sim) {
        CHECK(rc1 != GM_OK && rc2 != GM_OK && rc3 != GM_OK);
        CHECK(sh_same(pool, ro, 40, 0, 4 * MiB));
        CHECK_OK(gm_share_release(cli, ro, NULL));
        CHECK_OK(gm_share_release(cli, rw, NULL));
        CHECK_OK(gm_share_disconnect(cli));
    } else {
        gm_share_release(cli, ro, NULL);
        gm_share_release(cli, rw, NULL);
        gm_share_disconnect(cli);
    }
    gm_pool_destroy(pool);
    tp_put(l->out, M_DONE);
}

static void role_f(void)
{
    f_arg_t arg;
    sock_path(arg.path, sizeof arg.path, "f");
    tp_kid_t k = tp_spawn(f_importer, &arg);
    RQ(k.pid > 0);
    gm_pool_t *pool = test_pool(256 * MiB, 0);
    RQ(pool != NULL);
    void *a = NULL, *b = NULL;
    RQ(gm_alloc_shareable(pool, 4 * MiB, NULL, &a) == GM_OK);
    RQ(gm_alloc_shareable(pool, 2 * MiB, NULL, &b) == GM_OK);
    CHECK_OK(sh_fill(pool, a, 40, 0, 4 * MiB));
    CHECK_OK(sh_fill(pool, b, 41, 0, 2 * MiB));
    gm_share_server_t *srv = NULL;
    RQ(gm_share_listen(pool, arg.path, NULL, &srv) == GM_OK);
    CHECK_OK(gm_share_publish(srv, "f-ro", a, 4 * MiB, GM_SHARE_READ_ONLY, NULL, NULL));
    CHECK_OK(gm_share_publish(srv, "f-rw", b, 2 * MiB, GM_SHARE_READ_WRITE, NULL, NULL));
    tp_put(k.to, M_GO);
    tp_expect(&k, M_DONE);
    CHECK(tp_exited_ok(tp_wait(k.pid, TP_WAIT_MS)));
    int intact = sh_same(pool, a, 40, 0, 4 * MiB);
    if (test_backend() == GM_BACKEND_SIM) CHECK(intact);
    else printf("f: the read-only block is %s\n", intact ? "intact" : "CHANGED");
    CHECK(sh_same(pool, b, 40, 0, 64) && all_is(pool, (char *)b + 64, 0x77, 64));
    CHECK(sh_same(pool, (char *)b + 128, 41, 128, 2 * MiB - 128));
    WAIT_FOR(sstats(pool).exported_bytes == 0, 60000);
    CHECK(sstats(pool).exported_bytes == 0);
    CHECK_OK(gm_share_close(srv));
    CHECK_OK(gm_free(pool, a, NULL));
    CHECK_OK(gm_free(pool, b, NULL));
    tp_kid_close(&k);
    gm_pool_destroy(pool);
}

/* ---- g: a second gm_free racing the last release ---------------------------- */

/* The owner freed a block a peer maps (GM_OK: kept), then frees it again,
 * over and over, while the peer's last release is being handled by the
 * server thread.  Every one of those frees is GM_DOUBLE_FREE: none may
 * free the block, and none may free a block the owner allocated after it.
 * One process (the server thread is the other party); a client of a second
 * pool does the release, as another process would. */
#define G_TRIALS 1000
static void role_g(void)
{
    char path[108];
    sock_path(path, sizeof path, "g");
    gm_pool_t *pool = test_pool(256 * MiB, 0), *ipool = test_pool(256 * MiB, 0);
    RQ(pool && ipool);
    size_t page = page_of(pool);
    /* The server thread on one CPU, this thread on another: the release's
     * wake-up would otherwise put the server thread on this thread's CPU,
     * where the two seldom run at the same time. */
    cpu_set_t all;
    int split;
    gm_share_server_t *srv = NULL;
    int lrc = sh_listen_apart(pool, path, &srv, &all, &split);
    if (!split) printf("g: one CPU only: the race is unlikely to show\n");
    RQ(lrc == GM_OK);
    gm_share_client_t *cli = NULL;
    RQ(gm_share_connect(ipool, path, &cli) == GM_OK);
    gm_stats_t base = pool_stats_of(pool);
    int ok_frees = 0, lost = 0, trials = 0;
    for (int t = 0; t < G_TRIALS; t++) {
        void *a = NULL, *p = NULL, *b = NULL;
        if (gm_alloc_shareable(pool, page, NULL, &a) != GM_OK) { CHECK(!"alloc"); break; }
        if (gm_share_publish(srv, "g", a, page, GM_SHARE_READ_WRITE, NULL, NULL) != GM_OK ||
            gm_share_import(cli, "g", NULL, &p, NULL, NULL) != GM_OK ||
            gm_share_unpublish(srv, "g") != GM_OK) {
            CHECK(!"publish/import/unpublish");
            break;
        }
        int frc = gm_free(pool, a, NULL);
        if (frc != GM_OK) {
            fprintf(stderr, "g: trial %d: the first gm_free: %s\n", t, gm_last_error());
            CHECK_OK(frc);
            break;
        }
        trials++;
        if (gm_share_release(cli, p, NULL) != GM_OK) { CHECK(!"release"); break; }
        gm_share_stats_t s = GM_SHARE_STATS_INIT;
        for (;;) {
            int rc = gm_free(pool, a, NULL);
            if (rc == GM_OK) {
                /* Freed twice: the owner may now get the address again. */
                ok_frees++;
                CHECK_OK(gm_alloc_shareable(pool, page, NULL, &b));
                break;
            }
            if (gm_share_stats(pool, &s) != GM_OK || s.held_for_peers_bytes == 0) break;
        }
        double end = now_ms() + 1000;
        while (gm_share_stats(pool, &s) == GM_OK && s.held_for_peers_bytes && now_ms() < end) {}
        sleep_us(50);
        if (b) {
            size_t bs = 0;
            int r1 = gm_block_size(pool, b, &bs), r2 = gm_free(pool, b, NULL);
            if (r1 != GM_OK || r2 != GM_OK) {
                if (lost++ < 3)
                    fprintf(stderr, "g: trial %d: the owner's new block %p (the old one was %p) "
                            "was freed under it: gm_free: %s\n", t, b, a, gm_last_error());
            }
        }
    }
    if (ok_frees)
        fprintf(stderr, "g: %d of %d second gm_free calls returned GM_OK (not GM_DOUBLE_FREE); "
                "%d new blocks at the same address were freed by the server thread\n",
                ok_frees, trials, lost);
    printf("g: %d trials, %d second frees returned GM_OK, %d new blocks lost\n", trials,
           ok_frees, lost);
    CHECK(trials == G_TRIALS);
    CHECK(ok_frees == 0);
    CHECK(lost == 0);
    WAIT_FOR(pool_stats_of(pool).live_blocks == base.live_blocks, 60000);
    gm_stats_t st = pool_stats_of(pool);
    CHECK(st.live_blocks == base.live_blocks && st.allocated == base.allocated);
    CHECK_OK(gm_pool_check(pool));
    CHECK_OK(gm_share_disconnect(cli));
    CHECK_OK(gm_share_close(srv));
    gm_pool_destroy(ipool);
    gm_pool_destroy(pool);
}

/* ---- the coordinator -------------------------------------------------------- */

int main(int argc, char **argv)
{
    if (argc > 1) g_seed = strtoull(argv[1], NULL, 0);
    const char *t = getenv("TMPDIR");
    if (t && *t && strlen(t) < 60) g_tmp = t;
    printf("test_share_procs: seed %#llx (backend %s)\n", g_seed,
           test_backend() == GM_BACKEND_SIM ? "sim" : "cuda");
    signal(SIGPIPE, SIG_IGN);
    int rd;
    tp_results_init(&rd);
    tp_role("a (4 importers)", role_a, rd, 120000);
    tp_role("b (importers killed)", role_b, rd, 120000);
    tp_role("c (exporters killed)", role_c, rd, 120000);
    tp_role("d (free while imported)", role_d, rd, 120000);
    tp_role("e (cycles)", role_e, rd, 120000);
    tp_role("f (read-only)", role_f, rd, 120000);
    tp_role("g (double free racing the last release)", role_g, rd, 120000);
    return test_summary();
}
