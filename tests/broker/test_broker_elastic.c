/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_broker_elastic.c — a full device, the broker's RECLAIM, and the
 * config's reload.  Every client is a child process driven over a pipe
 * (allocate, free, check, trim).
 *
 *   a  capacity 256 MiB.  P1 keeps a 16 MiB block with a pattern, allocates
 *      200 MiB and frees it without trimming (its pool keeps the pages).  P2
 *      allocates 200 MiB: it succeeds because the broker asks P1 for its
 *      unused pages (the tenant's reclaims count it); P1's block keeps its
 *      pattern and P1 still allocates.  (Recorded only, on the sim: whether
 *      P2's new pages still hold P1's old bytes.)
 *   b  P3 asks for more than the capacity less the live data: GM_OUT_OF_MEMORY
 *      saying the device is full, within a bound of reclaim_ms (the time is
 *      printed); nobody's data is touched.
 *   c  SIGHUP: a lower default_quota shows in gm_broker_query within 1 s and
 *      a lease over it is GM_LIMIT naming the tenant; a new [tenant] for this
 *      uid takes the processes over with their pages (the uid tenant holds
 *      nothing after); a broken config (an unknown key, a bad size,
 *      guarantees beyond the capacity) is logged and the one in force stays;
 *      a new capacity waits for a restart (logged).
 *   d  (root only: two uids) guaranteed: a tenant guaranteed 128 MiB of 256;
 *      another one fills the device: it gets the rest, no more
 *      (GM_OUT_OF_MEMORY naming the promise), and the guaranteed tenant
 *      then gets its 128 MiB at once.
 *   e  a broker that answers a lease only after the client's 10 s receive
 *      timeout (it is stopped with SIGSTOP meanwhile; reclaim_ms itself may
 *      not exceed 5 s): the allocation fails with GM_IO, the client stays
 *      connected, the late answer's pages are taken at its next request,
 *      and the pages it maps are never leased to the other process (which
 *      gets what is free and no more; the first one's block keeps its
 *      pattern after the other one allocates and writes).  About 12 s.
 *
 * argv: [seed] (the patterns; the steps are fixed).
 */
// ctest-args: 0xe1a57
#include <grp.h>

#include "test.h"
#include "broker_util.h"
#include "broker_procs.h"
#include "broker_checks.h"

#define PAGE (2 * MiB)
#define SLOTS 64

static unsigned long long g_seed = 0xe1a57;
static test_broker_t g_b;
static char g_tenant[64];

enum { OP_ALLOC = 100, OP_FREE, OP_CHECK, OP_TRIM, OP_RESERVED, OP_EXIT };
/* Reply flags of OP_ALLOC: what the error said. */
enum { F_QUOTA = 1, F_FULL = 2, F_PROMISED = 4, F_TENANT = 8 };

typedef struct ekid {
    size_t lease, release_threshold;
    long uid;
} ekid_t;

/* ---- the child: a pool that does what it is told ---------------------------------- */

static void client(tp_link_t *l, void *argp)
{
    ekid_t *a = argp;
    if (bp_become(a->uid) != 0) return;
    gm_pool_t *pool = bp_kid_pool(&g_b, a->lease, a->release_threshold);
    if (!pool) return;
    char tenant[80];
    if (a->uid >= 0) snprintf(tenant, sizeof tenant, "'uid:%ld'", a->uid);
    else snprintf(tenant, sizeof tenant, "'%.60s'", g_tenant);
    void *blk[SLOTS] = {0};
    size_t sz[SLOTS] = {0};
    uint64_t tag[SLOTS] = {0};
    tp_put(l->out, BP_READY);
    for (;;) {
        uint64_t op, x, y, z;
        if (tp_get(l->in, &op, 600000) || tp_get(l->in, &x, TP_WAIT_MS) ||
            tp_get(l->in, &y, TP_WAIT_MS) || tp_get(l->in, &z, TP_WAIT_MS))
            return;
        if (op == OP_ALLOC) { /* x size, y tag, z a tag to look for first */
            size_t s = bp_free_slot(blk, SLOTS);
            void *p = NULL;
            double t0 = now_ms();
            int rc = s < SLOTS ? gm_alloc(pool, x, NULL, &p) : GM_LIMIT;
            uint64_t us = (uint64_t)((now_ms() - t0) * 1000), flags = 0, left = 0;
            if (rc != GM_OK) {
                const char *e = gm_last_error();
                flags |= strstr(e, "over its quota") ? F_QUOTA : 0;
                flags |= strstr(e, "device is full") ? F_FULL : 0;
                flags |= strstr(e, "promised to other tenants") ? F_PROMISED : 0;
                flags |= strstr(e, tenant) ? F_TENANT : 0;
                if (getenv("GM_TEST_VERBOSE")) fprintf(stderr, "pid %d: %s\n", (int)getpid(), e);
            } else {
                if (z && !bp_is_cuda()) {
                    /* Pages that start with a page of an earlier holder's
                     * 200 MiB block of tag z (sim: readable). */
                    const unsigned char *c = p;
                    for (size_t o = (PAGE - (uintptr_t)p % PAGE) % PAGE; o + 8 <= x; o += PAGE) {
                        uint64_t w;
                        memcpy(&w, c + o, 8);
                        for (size_t j = 0; j < 100; j++)
                            if (w == bp_word(z, j * PAGE)) {
                                left++;
                                break;
                            }
                    }
                }
                bp_keep(pool, blk, sz, tag, s, p, x, y);
            }
            tp_put(l->out, (uint64_t)rc);
            tp_put(l->out, us);
            tp_put(l->out, rc == GM_OK ? (uint64_t)s : 0);
            tp_put(l->out, flags);
            tp_put(l->out, left);
        } else if (op == OP_FREE || op == OP_CHECK) {
            tp_put(l->out, (uint64_t)bp_slot_check(pool, blk, sz, tag, SLOTS, x, op == OP_FREE));
        } else if (op == OP_TRIM) {
            tp_put(l->out, (uint64_t)gm_trim(pool, 0, NULL));
        } else if (op == OP_RESERVED) {
            gm_stats_t st = GM_STATS_INIT;
            KCHECK_RC(gm_pool_stats(pool, &st), GM_OK);
            tp_put(l->out, st.reserved);
        } else { /* OP_EXIT, or an op it does not know */
            bp_child_last(l, pool, blk, sz, tag, SLOTS, op == OP_EXIT);
            return;
        }
    }
}

/* ---- the coordinator's side ---------------------------------------------------------- */

typedef struct areply { int rc; double ms; uint64_t slot, flags, left; } areply_t;

/* The child's next answer (a lease may wait): at most 60 s. */
static uint64_t get1(tp_kid_t *k) { return tp_answer(k, 60000); }

static void send_op(tp_kid_t *k, uint64_t op, uint64_t x, uint64_t y, uint64_t z)
{
    tp_put(k->to, op);
    tp_put(k->to, x);
    tp_put(k->to, y);
    tp_put(k->to, z);
}

static areply_t do_alloc(tp_kid_t *k, size_t size, uint64_t tag, uint64_t peek)
{
    send_op(k, OP_ALLOC, size, tag, peek);
    areply_t r;
    r.rc = (int)get1(k);
    r.ms = (double)get1(k) / 1000.0;
    r.slot = get1(k);
    r.flags = get1(k);
    r.left = get1(k);
    return r;
}

static int do_op(tp_kid_t *k, uint64_t op, uint64_t x)
{
    send_op(k, op, x, 0, 0);
    return (int)get1(k);
}

static uint64_t reserved(tp_kid_t *k)
{
    send_op(k, OP_RESERVED, 0, 0, 0);
    return get1(k);
}

static void finish(tp_kid_t *k)
{
    send_op(k, OP_EXIT, 0, 0, 0);
    tp_finish(k, BP_DONE, 60000);
}

static void write_config(const char *capacity, const char *extra)
{
    tb_config(&g_b, capacity, extra);
}

/* The end of a part: the broker stopped (its log shown when a check has
 * failed) and its directory gone; the part's time printed. */
static void stop_broker(const char *part, double t0)
{
    CHECK(tb_stop(&g_b, SIGTERM) == 0);
    if (test_failed_) bp_log_dump(&g_b);
    tb_cleanup(&g_b);
    printf("%s: %.2f s\n", part, (now_ms() - t0) / 1e3);
    fflush(stdout);
}

/* SIGHUP, then wait until the log has one more line with `says`. */
static int reload(const char *says)
{
    int before = bp_log_count(&g_b, says);
    CHECK(kill(g_b.pid, SIGHUP) == 0);
    WAIT_FOR(bp_log_count(&g_b, says) > before, 2000);
    int ok = bp_log_count(&g_b, says) > before;
    if (!ok) fprintf(stderr, "after SIGHUP the log does not say '%s'\n", says);
    CHECK(ok);
    return ok;
}

/* ---- a, b, c ------------------------------------------------------------------------ */

static void role_elastic(int rd)
{
    double t0 = now_ms();
    uint64_t rs = g_seed;
    uint64_t tk = rng_next(&rs) | 1, tx = rng_next(&rs) | 1, t2 = rng_next(&rs) | 1;
    tb_init(&g_b);
    write_config("256MiB", "");
    bp_start(&g_b);
    ekid_t a1 = {4 * PAGE, SIZE_MAX, -1};
    tp_kid_t p1 = tp_spawn(client, &a1), p2 = tp_spawn(client, &a1), p3 = tp_spawn(client, &a1);
    CHECK(p1.pid > 0 && p2.pid > 0 && p3.pid > 0);
    if (!tp_expect(&p1, BP_READY) || !tp_expect(&p2, BP_READY) || !tp_expect(&p3, BP_READY))
        return;

    /* a: P1 keeps 16 MiB of data and 200 MiB of free pages. */
    areply_t k1 = do_alloc(&p1, 16 * MiB, tk, 0);
    CHECK_KID_RC(k1.rc, GM_OK);
    areply_t x1 = do_alloc(&p1, 200 * MiB, tx, 0);
    CHECK_KID_RC(x1.rc, GM_OK);
    CHECK(do_op(&p1, OP_FREE, x1.slot) == 1);
    CHECK(reserved(&p1) == 216 * MiB);
    WAIT_FOR(tb_tenant(&g_b, g_tenant).used == 216 * MiB, 1000);
    gm_broker_tenant_t t = tb_tenant(&g_b, g_tenant);
    CHECK(t.used == 216 * MiB);
    uint64_t reclaims0 = t.reclaims;
    /* P2 needs 200 MiB: only by taking P1's unused pages back. */
    areply_t x2 = do_alloc(&p2, 200 * MiB, t2, tx);
    CHECK_KID_RC(x2.rc, GM_OK);
    printf("a: P2's 200 MiB with P1's free pages taken back: %.1f ms\n", x2.ms);
    if (!bp_is_cuda())
        printf("a: (recorded only) pages of P2's new block that still held P1's old data: "
               "%llu of 100\n", (unsigned long long)x2.left);
    t = tb_tenant(&g_b, g_tenant);
    CHECK(t.reclaims > reclaims0);
    CHECK(t.used <= 256 * MiB);
    /* P1 gave back free pages (as many as each lease asked for), never its
     * block's. */
    uint64_t r1 = reserved(&p1);
    CHECK(r1 >= 16 * MiB && r1 <= 56 * MiB);
    CHECK(do_op(&p1, OP_CHECK, k1.slot) == 1); /* data pages are never taken */
    CHECK(do_op(&p2, OP_CHECK, x2.slot) == 1);
    areply_t s1 = do_alloc(&p1, 2 * MiB, tk + 1, 0); /* P1 still allocates */
    CHECK_KID_RC(s1.rc, GM_OK);
    CHECK(do_op(&p1, OP_FREE, s1.slot) == 1);
    CHECK(do_op(&p1, OP_TRIM, 0) == GM_OK);
    CHECK(do_op(&p2, OP_TRIM, 0) == GM_OK);
    WAIT_FOR(tb_tenant(&g_b, g_tenant).used == 216 * MiB, 1000);
    CHECK(tb_tenant(&g_b, g_tenant).used == 216 * MiB); /* the two blocks: 108 of 128 pages */

    /* b: more than the capacity less the live data. */
    gm_broker_view_t v;
    CHECK(gm_broker_query(g_b.sock, &v) == GM_OK);
    free(v.tenants);
    areply_t big = do_alloc(&p3, 48 * MiB, 0x3, 0);
    CHECK_KID_RC(big.rc, GM_OUT_OF_MEMORY);
    CHECK(big.flags & F_FULL);
    printf("b: 48 MiB with 40 MiB free: GM_OUT_OF_MEMORY after %.1f ms (reclaim_ms 300)\n",
           big.ms);
    /* Each refused lease waits reclaim_ms once; the OOM path asks again a
     * bounded number of times. */
    CHECK(big.ms <= 4 * 300 + 1000);
    CHECK(do_op(&p3, OP_TRIM, 0) == GM_OK);
    CHECK(do_op(&p1, OP_CHECK, k1.slot) == 1);
    CHECK(do_op(&p2, OP_CHECK, x2.slot) == 1);
    areply_t fit = do_alloc(&p3, 32 * MiB, 0x4, 0); /* what fits, fits */
    CHECK_KID_RC(fit.rc, GM_OK);
    CHECK(do_op(&p3, OP_FREE, fit.slot) == 1);
    CHECK(do_op(&p3, OP_TRIM, 0) == GM_OK);
    WAIT_FOR(tb_tenant(&g_b, g_tenant).used == 216 * MiB, 1000);

    /* c: reloads. */
    write_config("256MiB", "default_quota = 64MiB\n");
    double th = now_ms();
    reload("reloaded");
    WAIT_FOR(tb_tenant(&g_b, g_tenant).quota == 64 * MiB, 1000);
    double quota_ms = now_ms() - th;
    CHECK(tb_tenant(&g_b, g_tenant).quota == 64 * MiB);
    if (tb_tenant(&g_b, g_tenant).quota == 64 * MiB)
        printf("c: the new default_quota showed after %.1f ms\n", quota_ms);
    else
        fprintf(stderr, "c: after SIGHUP the connected processes' uid tenant still has quota %llu "
                "(default_quota now 64 MiB)\n", (unsigned long long)tb_tenant(&g_b, g_tenant).quota);
    CHECK(quota_ms <= 1000);
    areply_t q = do_alloc(&p3, 4 * MiB, 0x5, 0);
    CHECK_KID_RC(q.rc, GM_LIMIT);
    CHECK((q.flags & F_QUOTA) && (q.flags & F_TENANT));
    if (q.rc == GM_OK) CHECK(do_op(&p3, OP_FREE, q.slot) == 1);
    CHECK(do_op(&p3, OP_TRIM, 0) == GM_OK);
    WAIT_FOR(tb_tenant(&g_b, g_tenant).used == 216 * MiB, 1000);
    CHECK(tb_tenant(&g_b, g_tenant).used == 216 * MiB); /* a lower quota takes nothing away */
    CHECK(do_op(&p2, OP_CHECK, x2.slot) == 1);
    CHECK(do_op(&p3, OP_TRIM, 0) == GM_OK);

    /* A tenant of its own for this uid: the processes move with their pages. */
    char extra[300];
    snprintf(extra, sizeof extra, "default_quota = 64MiB\n[tenant elastic]\nusers = %u\n"
             "quota = 240MiB\n", (unsigned)geteuid());
    write_config("256MiB", extra);
    reload("reloaded, 1 tenants");
    WAIT_FOR(tb_tenant(&g_b, "elastic").clients == 3, 1000);
    t = tb_tenant(&g_b, "elastic");
    CHECK(t.clients == 3 && t.used == 216 * MiB && t.quota == 240 * MiB);
    t = tb_tenant(&g_b, g_tenant);
    CHECK(t.clients == 0 && t.used == 0);
    q = do_alloc(&p3, 4 * MiB, 0x6, 0);
    CHECK_KID_RC(q.rc, GM_OK);
    CHECK(do_op(&p3, OP_FREE, q.slot) == 1);
    CHECK(do_op(&p3, OP_TRIM, 0) == GM_OK);
    WAIT_FOR(tb_tenant(&g_b, "elastic").used == 216 * MiB, 1000);

    /* Broken configs: logged, the one in force stays. */
    const char *broken[] = {"default_quota = 64MiB\nfrobnicate = 1\n",
                            "default_quota = lots\n",
                            "[tenant big]\nusers = 4242\nguaranteed = 300MiB\n"};
    for (size_t i = 0; i < sizeof broken / sizeof broken[0]; i++) {
        write_config("256MiB", broken[i]);
        reload("the config in force stays");
        sleep_ms(20);
        t = tb_tenant(&g_b, "elastic");
        CHECK(t.clients == 3 && t.quota == 240 * MiB);
        CHECK(tb_tenant(&g_b, g_tenant).quota == 64 * MiB);
        CHECK(tb_tenant(&g_b, "big").name[0] == '\0');
    }
    CHECK(bp_log_count(&g_b, "frobnicate") == 1);
    CHECK(bp_log_count(&g_b, "exceeds the capacity") == 1);
    /* The capacity changes only at a restart. */
    write_config("512MiB", extra);
    reload("change only at a restart");
    CHECK(gm_broker_query(g_b.sock, &v) == GM_OK && v.capacity == 256 * MiB);
    free(v.tenants);
    CHECK(kill(g_b.pid, 0) == 0); /* alive after every SIGHUP */

    CHECK(do_op(&p1, OP_CHECK, k1.slot) == 1);
    finish(&p1);
    finish(&p2);
    finish(&p3);
    tp_results_drain(rd);
    WAIT_FOR(tb_tenant(&g_b, "elastic").clients == 0, 2000);
    t = tb_tenant(&g_b, "elastic");
    CHECK(t.used == 0 && t.clients == 0);
    stop_broker("a-c", t0);
}

/* ---- d: guaranteed ------------------------------------------------------------------ */

static void role_guaranteed(int rd)
{
    if (geteuid() != 0) {
        printf("d (guaranteed): skipped: two tenants need two uids, and children take other "
               "uids only as root (every process of one uid is one tenant here: this "
               "test's cgroup rules cannot tell them apart)\n");
        return;
    }
    double t0 = now_ms();
    tb_init(&g_b);
    CHECK(chmod(g_b.dir, 0755) == 0);
    write_config("256MiB", "[tenant gold]\nusers = 61011\nguaranteed = 128MiB\n");
    bp_start(&g_b);
    ekid_t ag = {4 * PAGE, SIZE_MAX, 61011}, ao = {4 * PAGE, SIZE_MAX, 61012};
    tp_kid_t g = tp_spawn(client, &ag), o = tp_spawn(client, &ao);
    CHECK(g.pid > 0 && o.pid > 0);
    if (!tp_expect(&g, BP_READY) || !tp_expect(&o, BP_READY)) return;
    /* The other tenant takes what it can, 8 MiB at a time. */
    int got = 0;
    areply_t r;
    for (int i = 0; i < 40; i++) {
        r = do_alloc(&o, 8 * MiB, 0x100 + (uint64_t)i, 0);
        if (r.rc != GM_OK) break;
        got++;
    }
    CHECK_KID_RC(r.rc, GM_OUT_OF_MEMORY);
    CHECK(r.flags & F_PROMISED);
    printf("d: the other tenant got %d MiB of 256 (128 guaranteed to gold)\n", got * 8);
    CHECK(got * 8 * MiB <= 128 * MiB && got * 8 * MiB >= 120 * MiB);
    CHECK(do_op(&o, OP_TRIM, 0) == GM_OK);
    gm_broker_tenant_t t = tb_tenant(&g_b, "uid:61012");
    CHECK(t.used <= 128 * MiB);
    /* gold gets its 128 MiB at once: nobody is asked to give anything back
     * (the reclaim count; its time is printed, not judged: TSan is slow). */
    uint64_t reclaims0 = tb_tenant(&g_b, "uid:61012").reclaims;
    r = do_alloc(&g, 128 * MiB, 0x200, 0);
    CHECK_KID_RC(r.rc, GM_OK);
    printf("d: gold's 128 MiB: %.1f ms\n", r.ms);
    CHECK(tb_tenant(&g_b, "uid:61012").reclaims == reclaims0);
    t = tb_tenant(&g_b, "gold");
    CHECK(t.used == 128 * MiB && t.guaranteed == 128 * MiB);
    finish(&g);
    finish(&o);
    tp_results_drain(rd);
    WAIT_FOR(tb_tenant(&g_b, "gold").clients == 0 && tb_tenant(&g_b, "uid:61012").clients == 0, 2000);
    CHECK(tb_tenant(&g_b, "gold").used == 0 && tb_tenant(&g_b, "uid:61012").used == 0);
    stop_broker("d", t0);
}

/* ---- e: a lease that waits longer than the client's receive timeout ---------- */

static void role_long_wait(int rd)
{
    /* A client whose lease is answered after its receive timeout must still
     * be the broker's client when the answer comes, and what it maps must
     * stay its own. */
    double t0 = now_ms();
    tb_init(&g_b);
    write_config("32MiB", "reclaim_ms = 300\n");
    bp_start(&g_b);
    ekid_t a = {PAGE, SIZE_MAX, -1};
    tp_kid_t v = tp_spawn(client, &a), h = tp_spawn(client, &a);
    CHECK(v.pid > 0 && h.pid > 0);
    if (!tp_expect(&v, BP_READY) || !tp_expect(&h, BP_READY)) return;
    areply_t vb = do_alloc(&v, 14 * MiB, 0xe1, 0), hb = do_alloc(&h, 8 * MiB, 0xe2, 0);
    CHECK_KID_RC(vb.rc, GM_OK);
    CHECK_KID_RC(hb.rc, GM_OK);
    /* The broker stops; V's next 4 MiB needs a lease, which is not answered
     * before V's 10 s timeout. */
    CHECK(kill(g_b.pid, SIGSTOP) == 0);
    send_op(&v, OP_ALLOC, 4 * MiB, 0xe3, 0);
    areply_t r;
    r.rc = (int)get1(&v);
    r.ms = (double)get1(&v) / 1000.0;
    r.slot = get1(&v);
    r.flags = get1(&v);
    r.left = get1(&v);
    printf("e: a lease the stopped broker did not answer: %s after %.1f s\n", gm_strerror(r.rc),
           r.ms / 1e3);
    CHECK_KID_RC(r.rc, GM_IO);
    CHECK(r.ms >= 9000);
    CHECK(kill(g_b.pid, SIGCONT) == 0);
    /* The broker answers now: V holds those pages by its books. */
    WAIT_FOR(tb_tenant(&g_b, g_tenant).used >= 24 * MiB, 3000);
    CHECK(bp_log_count(&g_b, "disconnected") == 0 && bp_log_count(&g_b, "dropped") == 0);
    /* H takes what is free (32 MiB less V's 14, H's 8 and V's late page),
     * and never V's pages. */
    areply_t h2 = do_alloc(&h, 16 * MiB, 0xe4, 0);
    CHECK_KID_RC(h2.rc, GM_OUT_OF_MEMORY);
    /* V's next request takes the late answer (the one page it asked for;
     * H took every other free page): served from it. */
    areply_t v2 = do_alloc(&v, 2 * MiB, 0xe5, 0);
    CHECK_KID_RC(v2.rc, GM_OK);
    int intact = do_op(&v, OP_CHECK, vb.slot) == 1;
    if (!intact) fprintf(stderr, "e: V's block was overwritten\n");
    CHECK(intact);
    if (v2.rc == GM_OK) CHECK(do_op(&v, OP_CHECK, v2.slot) == 1);
    CHECK(do_op(&h, OP_CHECK, hb.slot) == 1);
    finish(&v);
    finish(&h);
    tp_results_drain(rd);
    WAIT_FOR(tb_tenant(&g_b, g_tenant).clients == 0, 2000);
    CHECK(tb_tenant(&g_b, g_tenant).used == 0);
    stop_broker("e", t0);
}

int main(int argc, char **argv)
{
    if (argc > 1) g_seed = strtoull(argv[1], NULL, 0);
    printf("test_broker_elastic: seed %#llx (backend %s)\n", g_seed, bp_is_cuda() ? "cuda" : "sim");
    int rd = bp_coordinator(g_tenant, sizeof g_tenant);
    role_elastic(rd);
    role_guaranteed(rd);
    role_long_wait(rd);
    tp_results_drain(rd);
    return test_summary();
}
