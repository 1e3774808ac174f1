/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_broker_quota.c — a tenant's quota is exact while many client
 * processes race for it.
 *
 *   1  one tenant (this uid, default_quota 192 MiB, reclaim_ms 10), 32
 *      processes with small leases (4-8 MiB; half of them give pages back at
 *      every free, the other half keep them until the broker asks) allocate
 *      and free 2-40 MiB blocks for a few seconds (a refused one frees one of
 *      its blocks half of the time).  The broker's books, read every
 *      millisecond or so: used <= quota; at the end peak <= quota.  The
 *      kernel's own count (sim): every ~250 ms all clients are stopped
 *      (SIGSTOP, until every thread is) and the distinct sim pages (memfd
 *      inodes, open or mapped) they hold are counted: at most the quota, and
 *      at most what the quiet broker then says the tenant holds (a page
 *      reaches a process only after the broker counted it and leaves it
 *      before the broker is told); the device's leased total is the sum of
 *      the tenants' used.  A refusal is GM_LIMIT naming the tenant and its
 *      quota; none is GM_OUT_OF_MEMORY (the device is far from full).  Every
 *      block's pattern is checked before it is freed.  At the end the
 *      tenant's used, cached and clients are 0, in the stats file too, and no
 *      client was dropped.
 *   2  (root only: children take other uids) three tenants at once: two
 *      configured ones (one with a guaranteed minimum) and a uid tenant of
 *      default_quota, on a device smaller than their quotas together: each
 *      tenant's used <= its quota, the kernel count per tenant too, and with
 *      everyone stopped sum(max(used, guaranteed)) <= capacity.
 *
 * (The rows of gm_broker_query are read one by one: only a quiet broker's
 * table adds up, so sums are checked with everyone stopped.)
 *
 * argv: [seed] [processes] [seconds].  Deterministic given the seed (sizes,
 * orders); the interleaving is the machine's.
 */
// ctest-args: 0x9107a
#include <grp.h>

#include "test.h"
#include "broker_util.h"
#include "broker_procs.h"

#define PAGE (2 * MiB)
#define MAX_KIDS 64
#define MAX_LIVE 12
/* How long past their time the children go on waiting for the stop, and
 * the coordinator for them: the same, so that on a loaded machine (freezing
 * 32 processes under TSan can take seconds) neither gives up first. */
#define STOP_WAIT_MS 60000

static unsigned long long g_seed = 0x9107a;
static test_broker_t g_b;

typedef struct qkid {
    int idx;
    uint64_t seed;
    size_t lease, release_threshold;
    int ms;
    long uid;             /* -1: this one's */
    char tenant[64];      /* the tenant it expects to be in */
    char quota_text[32];  /* how the refusal prints the quota */
} qkid_t;

static void quota_kid(tp_link_t *l, void *argp)
{
    qkid_t *a = argp;
    if (bp_become(a->uid) != 0) return;
    uint64_t rs = a->seed;
    gm_pool_t *pool = NULL;
    int rc = bp_child_pool(l, &g_b, a->lease, a->release_threshold, &pool);
    if (rc != GM_OK) return;
    uint64_t v;
    if (tp_get(l->in, &v, TP_WAIT_MS) != 0 || v != BP_GO) {
        KCHECK(!"no go");
        return;
    }
    void *blk[MAX_LIVE];
    size_t sz[MAX_LIVE];
    uint64_t tag[MAX_LIVE];
    size_t n = 0;
    uint64_t allocs = 0, limits = 0, ooms = 0, frees = 0, ntag = (uint64_t)a->idx << 32;
    double end = now_ms() + a->ms;
    for (;;) {
        if (now_ms() >= end) {
            /* Time is up; the work goes on until the parent has read the
             * books often enough (a slow or loaded machine reads them less
             * often), and it says stop. */
            uint64_t m;
            if (tp_get(l->in, &m, 0) == 0) {
                KCHECK(m == BP_STOP);
                break;
            }
            if (now_ms() >= end + STOP_WAIT_MS) {
                KCHECK(!"no stop");
                break;
            }
        }
        uint64_t r = bp_below(&rs, 100);
        int do_free = n && r >= 55 && r < 97;
        if (n < MAX_LIVE && (r < 55 || n == 0)) {
            size_t size = (2 + bp_below(&rs, 39)) * MiB - bp_below(&rs, 3) * 4096;
            void *p = NULL;
            rc = gm_alloc(pool, size, NULL, &p);
            if (rc == GM_OK) {
                allocs++;
                tag[n] = ++ntag;
                KCHECK_RC(bp_fill(pool, p, size, tag[n]), GM_OK);
                blk[n] = p;
                sz[n++] = size;
                continue;
            }
            if (rc == GM_LIMIT) {
                limits++;
                const char *e = gm_last_error();
                int named = strstr(e, "over its quota") && strstr(e, a->tenant) &&
                            strstr(e, a->quota_text);
                if (!named) fprintf(stderr, "pid %d: refusal: %s\n", (int)getpid(), e);
                KCHECK(named);
            } else if (rc == GM_OUT_OF_MEMORY) {
                ooms++;
            } else {
                KCHECK_RC(rc, GM_OK);
            }
            /* Refused: make room for the others now and then, else wait. */
            do_free = n && bp_below(&rs, 2);
            if (!do_free) {
                sleep_us(200 + bp_below(&rs, 1000));
                continue;
            }
        }
        if (do_free) {
            bp_drop(pool, blk, sz, tag, &n, bp_below(&rs, n));
            frees++;
        } else {
            KCHECK_RC(gm_trim(pool, bp_below(&rs, 3) * 8 * MiB, NULL), GM_OK);
        }
    }
    bp_child_done(l, pool, blk, sz, tag, n);
    tp_put(l->out, allocs);
    tp_put(l->out, limits);
    tp_put(l->out, ooms);
    tp_put(l->out, frees);
}

/* One tenant as the run knows it. */
typedef struct qten {
    char name[64];
    uint64_t quota, guaranteed;
    /* what was seen */
    uint64_t max_used, max_kernel, over, kernel_over, kernel_above_books;
} qten_t;

/* Readings of the broker's books, and (sim) freezes that compare them with
 * the kernel's counts, a run makes at least: the children work on past
 * their time until the parent has made them. */
#define MIN_QUERIES 20
#define MIN_FREEZES 3

/* A run: kids[i] in tenant ten_of[i]; the broker must be running. */
static void run(const char *what, qkid_t *args, const int *ten_of, int nkids, qten_t *ten,
                int nten, uint64_t capacity, int one_tenant, int rd)
{
    uint64_t rs = g_seed ^ 0xf00d;
    double t0 = now_ms();
    tp_kid_t k[MAX_KIDS];
    pid_t pids[MAX_KIDS];
    for (int i = 0; i < nkids; i++) {
        k[i] = tp_spawn(quota_kid, &args[i]);
        pids[i] = k[i].pid;
        CHECK(k[i].pid > 0);
    }
    int ready = 1;
    for (int i = 0; i < nkids; i++) ready &= tp_expect(&k[i], BP_READY);
    if (!ready) bp_log_dump(&g_b);
    for (int i = 0; i < nkids; i++) tp_put(k[i].to, BP_GO);

    uint64_t queries = 0, freezes = 0, quiet = 0, failed_freezes = 0, sum_over = 0, query_fail = 0;
    double next_freeze = now_ms() + 150;
    int done[MAX_KIDS] = {0}, ndone = 0;
    uint64_t allocs = 0, limits = 0, ooms = 0, frees = 0;
    double deadline = now_ms() + args[0].ms + STOP_WAIT_MS;
    bool stopped = false;
    while (ndone < nkids && now_ms() < deadline) {
        tp_results_drain(rd);
        /* Enough readings of the books (and, on the sim, of the kernel's
         * counts): the children may end once their time is up. */
        if (!stopped && queries >= MIN_QUERIES && (bp_is_cuda() || freezes >= MIN_FREEZES)) {
            for (int i = 0; i < nkids; i++) tp_put(k[i].to, BP_STOP);
            stopped = true;
        }
        gm_broker_view_t v;
        if (gm_broker_query(g_b.sock, &v) == GM_OK) {
            queries++;
            for (int t = 0; t < nten; t++) {
                uint64_t used = 0;
                for (size_t j = 0; j < v.n; j++)
                    if (!strcmp(v.tenants[j].name, ten[t].name)) used = v.tenants[j].used;
                if (used > ten[t].max_used) ten[t].max_used = used;
                if (used > ten[t].quota) {
                    if (!ten[t].over)
                        fprintf(stderr, "%s: tenant %s holds %llu bytes, quota %llu\n", what,
                                ten[t].name, (unsigned long long)used,
                                (unsigned long long)ten[t].quota);
                    ten[t].over++;
                }
            }
            if (v.device_used > capacity) sum_over++;
            free(v.tenants);
        } else {
            /* (Said, so that a failure on a loaded machine tells why.) */
            if (query_fail++ < 3)
                fprintf(stderr, "%s: a broker query failed: %s\n", what, gm_last_error());
        }
        if (!bp_is_cuda() && now_ms() >= next_freeze) {
            /* The kernel's count, everyone stopped. */
            pid_t live[MAX_KIDS];
            for (int i = 0; i < nkids; i++) live[i] = done[i] ? 0 : pids[i];
            if (tp_freeze(live, (size_t)nkids)) {
                freezes++;
                /* The broker has read what was sent before the stop. */
                gm_broker_view_t w;
                int have = bp_quiet_view(&g_b, &w, 500);
                if (have) {
                    quiet++;
                    uint64_t sum = 0, sum_used = 0;
                    for (size_t j = 0; j < w.n; j++) {
                        uint64_t u = w.tenants[j].used, g = w.tenants[j].guaranteed;
                        sum += u > g ? u : g;
                        sum_used += u;
                    }
                    /* The device's books are the tenants' books; the
                     * guarantees not yet taken are kept free. */
                    if (sum_used != w.device_used || sum > capacity) {
                        fprintf(stderr, "%s: device %llu of %llu bytes used, with the guarantees "
                                "%llu:", what, (unsigned long long)w.device_used,
                                (unsigned long long)capacity, (unsigned long long)sum);
                        for (size_t j = 0; j < w.n; j++)
                            fprintf(stderr, " %s %llu/%llu", w.tenants[j].name,
                                    (unsigned long long)w.tenants[j].used,
                                    (unsigned long long)w.tenants[j].guaranteed);
                        fprintf(stderr, "\n");
                        sum_over++;
                    }
                }
                for (int t = 0; t < nten; t++) {
                    tp_inodes_t s = {0};
                    for (int i = 0; i < nkids; i++)
                        if (live[i] && ten_of[i] == t) tp_sim_pages_of(live[i], &s);
                    uint64_t kbytes = (uint64_t)s.n * PAGE, books = 0;
                    free(s.v);
                    if (kbytes > ten[t].max_kernel) ten[t].max_kernel = kbytes;
                    if (kbytes > ten[t].quota) {
                        fprintf(stderr, "%s: the kernel counts %llu bytes of tenant %s's pages "
                                "in its processes; quota %llu\n", what,
                                (unsigned long long)kbytes, ten[t].name,
                                (unsigned long long)ten[t].quota);
                        ten[t].kernel_over++;
                    }
                    for (size_t j = 0; have && j < w.n; j++)
                        if (!strcmp(w.tenants[j].name, ten[t].name)) books = w.tenants[j].used;
                    /* Pages reach a process only after the broker counted
                     * them, and leave it before it is told. */
                    if (have && kbytes > books) {
                        fprintf(stderr, "%s: the kernel counts %llu bytes of tenant %s's pages "
                                "in its processes; the broker %llu\n", what,
                                (unsigned long long)kbytes, ten[t].name,
                                (unsigned long long)books);
                        ten[t].kernel_above_books++;
                    }
                }
                if (have) free(w.tenants);
            } else {
                failed_freezes++;
            }
            tp_thaw(live, (size_t)nkids);
            next_freeze = now_ms() + 200 + (double)bp_below(&rs, 100);
        }
        for (int i = 0; i < nkids; i++) {
            if (done[i]) continue;
            uint64_t m;
            if (tp_get(k[i].from, &m, 0) != 0) continue;
            if (m == TP_FAIL) {
                continue; /* counted through the result pipe */
            }
            CHECK(m == BP_DONE);
            uint64_t x[4] = {0};
            for (int j = 0; j < 4; j++) CHECK(tp_get(k[i].from, &x[j], TP_WAIT_MS) == 0);
            allocs += x[0];
            limits += x[1];
            ooms += x[2];
            frees += x[3];
            CHECK(tp_exited_ok(tp_wait(k[i].pid, TP_WAIT_MS)));
            done[i] = 1;
            ndone++;
        }
        sleep_us(1000);
    }
    CHECK(ndone == nkids);
    for (int i = 0; i < nkids; i++) {
        if (!done[i]) {
            fprintf(stderr, "%s: pid %d did not finish\n", what, (int)k[i].pid);
            kill(k[i].pid, SIGKILL);
            tp_wait(k[i].pid, 1000);
        }
        tp_kid_close(&k[i]);
    }
    tp_results_drain(rd);
    printf("%s: %d processes, %llu allocations, %llu quota refusals, %llu device refusals, "
           "%llu frees; %llu readings of the books, %llu kernel counts (%llu missed)\n",
           what, nkids, (unsigned long long)allocs, (unsigned long long)limits,
           (unsigned long long)ooms, (unsigned long long)frees, (unsigned long long)queries,
           (unsigned long long)freezes, (unsigned long long)failed_freezes);
    CHECK(query_fail == 0);
    CHECK(queries >= MIN_QUERIES);
    CHECK(allocs >= 4); /* (slow builds, TSan: few, but some) */
    CHECK(limits > 0); /* a quota was reached, so the run tested something */
    if (one_tenant) CHECK(ooms == 0); /* the device is far from full */
    CHECK(sum_over == 0);
    if (!bp_is_cuda()) CHECK(freezes >= MIN_FREEZES && failed_freezes == 0 && quiet >= freezes / 2);
    for (int t = 0; t < nten; t++) {
        if (bp_is_cuda())
            printf("  tenant %s: quota %llu MiB, most used %llu MiB\n", ten[t].name,
                   (unsigned long long)(ten[t].quota / MiB),
                   (unsigned long long)(ten[t].max_used / MiB));
        else
            printf("  tenant %s: quota %llu MiB, most used %llu MiB (books), %llu MiB (kernel)\n",
                   ten[t].name, (unsigned long long)(ten[t].quota / MiB),
                   (unsigned long long)(ten[t].max_used / MiB),
                   (unsigned long long)(ten[t].max_kernel / MiB));
        CHECK(ten[t].over == 0);
        CHECK(ten[t].kernel_over == 0);
        CHECK(ten[t].kernel_above_books == 0);
        /* The quota was approached (within one lease of the largest ask). */
        if (one_tenant) CHECK(ten[t].max_used + 48 * MiB >= ten[t].quota);
        gm_broker_tenant_t row;
        CHECK(bp_tenant(&g_b, ten[t].name, &row, NULL));
        WAIT_FOR(bp_tenant(&g_b, ten[t].name, &row, NULL) && row.clients == 0 && row.used == 0,
                 2000);
        CHECK(row.used == 0);
        CHECK(row.clients == 0);
        CHECK(row.cached == 0);
        CHECK(row.peak <= ten[t].quota);
        CHECK(row.peak >= ten[t].max_used);
        CHECK(row.quota == ten[t].quota);
        if (one_tenant) CHECK(row.refusals > 0);
    }
    gm_broker_view_t v;
    CHECK(gm_broker_query(g_b.sock, &v) == GM_OK);
    CHECK(v.device_used == 0);
    free(v.tenants);
    printf("%s: %.2f s\n", what, (now_ms() - t0) / 1e3);
    fflush(stdout);
}

/* The stats file, once written again, says the tenant holds nothing. */
static int stats_file_idle(const char *name)
{
    FILE *f = fopen(g_b.stats, "r");
    if (!f) return 0;
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char key[100];
    snprintf(key, sizeof key, "\"name\": \"%s\"", name);
    char *t = strstr(buf, key);
    return t && strstr(buf, "\"leased\": 0,") && strstr(t, "\"used\": 0,") &&
           strstr(t, "\"clients\": 0}");
}

int main(int argc, char **argv)
{
    if (argc > 1) g_seed = strtoull(argv[1], NULL, 0);
    int nkids = argc > 2 ? atoi(argv[2]) : 32;
    double secs = argc > 3 ? atof(argv[3]) : 4.0;
    if (nkids < 2 || nkids > MAX_KIDS || secs <= 0) {
        fprintf(stderr, "usage: %s [seed] [processes 2-%d] [seconds]\n", argv[0], MAX_KIDS);
        return 2;
    }
    printf("test_broker_quota: seed %#llx, %d processes, %.1f s (backend %s)\n", g_seed, nkids,
           secs, bp_is_cuda() ? "cuda" : "sim");
    int rd = bp_coordinator(NULL, 0);
    uint64_t rs = g_seed;

    /* 1: one tenant. */
    tb_init(&g_b);
    tb_config(&g_b, "1GiB", "default_quota = 192MiB\nreclaim_ms = 10\n");
    bp_start(&g_b);
    qten_t ten1[1];
    memset(ten1, 0, sizeof ten1);
    snprintf(ten1[0].name, sizeof ten1[0].name, "uid:%u", (unsigned)geteuid());
    ten1[0].quota = 192 * MiB;
    qkid_t args[MAX_KIDS];
    int ten_of[MAX_KIDS];
    for (int i = 0; i < nkids; i++) {
        args[i] = (qkid_t){.idx = i, .seed = rng_next(&rs), .lease = (2 + bp_below(&rs, 3)) * PAGE,
                           .release_threshold = i % 2 ? 0 : SIZE_MAX, .ms = (int)(secs * 1000),
                           .uid = -1};
        snprintf(args[i].tenant, sizeof args[i].tenant, "'%.60s'", ten1[0].name);
        snprintf(args[i].quota_text, sizeof args[i].quota_text, "of 192.00 MiB");
        ten_of[i] = 0;
    }
    run("1 (one tenant, 192 MiB)", args, ten_of, nkids, ten1, 1, 1024 * MiB, 1, rd);
    WAIT_FOR(stats_file_idle(ten1[0].name), 3000);
    CHECK(stats_file_idle(ten1[0].name));
    CHECK(bp_log_count(&g_b, "dropped") == 0);
    CHECK(tb_stop(&g_b, SIGTERM) == 0);
    if (test_failed_) bp_log_dump(&g_b);
    tb_cleanup(&g_b);

    /* 2: three tenants by uid (root only). */
    if (geteuid() != 0) {
        printf("2 (three tenants): skipped, children cannot take other uids without root\n");
    } else {
        tb_init(&g_b);
        CHECK(chmod(g_b.dir, 0755) == 0); /* the other uids reach the socket */
        tb_config(&g_b, "256MiB",
                  "default_quota = 64MiB\nreclaim_ms = 10\n"
                  "[tenant alpha]\nusers = 61001\nquota = 160MiB\nguaranteed = 96MiB\n"
                  "[tenant beta]\nusers = 61002\nquota = 96MiB\n");
        bp_start(&g_b);
        qten_t ten[3];
        memset(ten, 0, sizeof ten);
        snprintf(ten[0].name, sizeof ten[0].name, "alpha");
        ten[0].quota = 160 * MiB;
        ten[0].guaranteed = 96 * MiB;
        snprintf(ten[1].name, sizeof ten[1].name, "beta");
        ten[1].quota = 96 * MiB;
        snprintf(ten[2].name, sizeof ten[2].name, "uid:61003");
        ten[2].quota = 64 * MiB;
        const char *qt[3] = {"of 160.00 MiB", "of 96.00 MiB", "of 64.00 MiB"};
        int n2 = nkids * 3 / 4;
        if (n2 < 3) n2 = 3;
        for (int i = 0; i < n2; i++) {
            int t = i % 3;
            args[i] = (qkid_t){.idx = i, .seed = rng_next(&rs),
                               .lease = (2 + bp_below(&rs, 3)) * PAGE,
                               .release_threshold = (i / 3) % 2 ? 0 : SIZE_MAX,
                               .ms = (int)(secs * 600), .uid = 61001 + t};
            snprintf(args[i].tenant, sizeof args[i].tenant, "'%.60s'", ten[t].name);
            snprintf(args[i].quota_text, sizeof args[i].quota_text, "%s", qt[t]);
            ten_of[i] = t;
        }
        run("2 (three tenants, 256 MiB device)", args, ten_of, n2, ten, 3, 256 * MiB, 0, rd);
        CHECK(bp_log_count(&g_b, "dropped") == 0);
        CHECK(tb_stop(&g_b, SIGTERM) == 0);
        if (test_failed_) bp_log_dump(&g_b);
        tb_cleanup(&g_b);
    }
    tp_results_drain(rd);
    return test_summary();
}
