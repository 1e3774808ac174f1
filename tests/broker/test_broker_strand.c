/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_broker_strand.c — a failed over-quota allocation strands nothing
 * (issue 42, finding 7).
 *
 * One tenant (this uid, default_quota 512 MiB on a 2 GiB broker), two
 * processes A and B, each a child driven over a pipe.  Per round (release
 * threshold kept, then 0; default and small leases):
 *   1  A keeps a 192 MiB block with a pattern;
 *   2  A asks for 448 MiB: GM_LIMIT naming the quota;
 *   3  A holds no page for the failed attempt: its pool's reserved memory is
 *      its live block's, and the broker's books for the tenant are no more
 *      than that plus one lease (the provider's stock);
 *   4  B, which leased nothing before, allocates the rest of the quota
 *      (320 MiB) and writes it: GM_OK (before the fix the attempt's pages sat
 *      in A, mapped and unused, and B was refused "over its quota" at once);
 *   5  A's block keeps its pattern, B's too; both free and exit, the tenant
 *      holds nothing.
 *
 * argv: [seed] (the patterns; the steps are fixed).
 */
// ctest-args: 0x57a4d
#include "test.h"
#include "broker_util.h"
#include "broker_procs.h"
#include "broker_checks.h"

#define PAGE (2 * MiB)
#define QUOTA (512 * MiB)
#define SLOTS 8

static unsigned long long g_seed = 0x57a4d;
static test_broker_t g_b;
static char g_tenant[64];

enum { OP_ALLOC = 100, OP_FREE, OP_CHECK, OP_STATS, OP_EXIT };

typedef struct skid {
    size_t lease, release_threshold;
} skid_t;

/* ---- the child: a pool that does what it is told ---------------------------------- */

static void client(tp_link_t *l, void *argp)
{
    skid_t *a = argp;
    gm_pool_t *pool = bp_kid_pool(&g_b, a->lease, a->release_threshold);
    if (!pool) return;
    void *blk[SLOTS] = {0};
    size_t sz[SLOTS] = {0};
    uint64_t tag[SLOTS] = {0};
    tp_put(l->out, BP_READY);
    for (;;) {
        uint64_t op, x, y;
        if (tp_get(l->in, &op, 600000) || tp_get(l->in, &x, TP_WAIT_MS) ||
            tp_get(l->in, &y, TP_WAIT_MS))
            return;
        if (op == OP_ALLOC) { /* x size, y tag; replies rc, slot, 1 when the error names the quota */
            size_t s = bp_free_slot(blk, SLOTS);
            void *p = NULL;
            int rc = s < SLOTS ? gm_alloc(pool, x, NULL, &p) : GM_LIMIT;
            uint64_t quota = 0;
            if (rc != GM_OK) {
                const char *e = gm_last_error();
                quota = strstr(e, "over its quota") != NULL;
                if (getenv("GM_TEST_VERBOSE")) fprintf(stderr, "pid %d: %s\n", (int)getpid(), e);
            } else {
                bp_keep(pool, blk, sz, tag, s, p, x, y);
            }
            tp_put(l->out, (uint64_t)rc);
            tp_put(l->out, rc == GM_OK ? (uint64_t)s : 0);
            tp_put(l->out, quota);
        } else if (op == OP_FREE || op == OP_CHECK) {
            tp_put(l->out, (uint64_t)bp_slot_check(pool, blk, sz, tag, SLOTS, x, op == OP_FREE));
        } else if (op == OP_STATS) { /* reserved, active */
            gm_stats_t st = GM_STATS_INIT;
            KCHECK_RC(gm_pool_stats(pool, &st), GM_OK);
            KCHECK_RC(gm_pool_check(pool), GM_OK);
            tp_put(l->out, st.reserved);
            tp_put(l->out, st.active);
        } else { /* OP_EXIT, or an op it does not know */
            bp_child_last(l, pool, blk, sz, tag, SLOTS, op == OP_EXIT);
            return;
        }
    }
}

/* ---- the coordinator's side ---------------------------------------------------------- */

/* The child's next answer (a lease may wait): at most 60 s. */
static uint64_t get1(tp_kid_t *k) { return tp_answer(k, 60000); }

static void send_op(tp_kid_t *k, uint64_t op, uint64_t x, uint64_t y)
{
    tp_put(k->to, op);
    tp_put(k->to, x);
    tp_put(k->to, y);
}

typedef struct areply { int rc; uint64_t slot, quota; } areply_t;

static areply_t do_alloc(tp_kid_t *k, size_t size, uint64_t tag)
{
    send_op(k, OP_ALLOC, size, tag);
    areply_t r;
    r.rc = (int)get1(k);
    r.slot = get1(k);
    r.quota = get1(k);
    return r;
}

static int do_op(tp_kid_t *k, uint64_t op, uint64_t x)
{
    send_op(k, op, x, 0);
    return (int)get1(k);
}

static void stats_of(tp_kid_t *k, uint64_t *reserved, uint64_t *active)
{
    send_op(k, OP_STATS, 0, 0);
    *reserved = get1(k);
    *active = get1(k);
}

static void finish(tp_kid_t *k)
{
    send_op(k, OP_EXIT, 0, 0);
    tp_finish(k, BP_DONE, 60000);
}

static void round_(const char *what, size_t lease, size_t release_threshold, uint64_t *rs)
{
    size_t lease_eff = lease ? lease : 64 * MiB;
    skid_t ka = {lease, release_threshold};
    tp_kid_t a = tp_spawn(client, &ka), b = tp_spawn(client, &ka);
    CHECK(a.pid > 0 && b.pid > 0);
    if (!tp_expect(&a, BP_READY) || !tp_expect(&b, BP_READY)) return;
    uint64_t ta = rng_next(rs) | 1, tb = rng_next(rs) | 1;

    /* 1, 2: A's block, then an allocation past the quota. */
    areply_t keep = do_alloc(&a, 192 * MiB, ta);
    CHECK_KID_RC(keep.rc, GM_OK);
    areply_t over = do_alloc(&a, 448 * MiB, ta + 1);
    CHECK_KID_RC(over.rc, GM_LIMIT);
    CHECK(over.quota == 1);

    /* 3: nothing of the attempt stays with A. */
    uint64_t res = 0, act = 0;
    stats_of(&a, &res, &act);
    CHECK(act == 192 * MiB);
    if (res != 192 * MiB)
        fprintf(stderr, "%s: after the failed allocation A's pool holds %llu MiB for a %llu MiB "
                "block\n", what, (unsigned long long)(res / MiB), (unsigned long long)(act / MiB));
    CHECK(res == 192 * MiB);
    WAIT_FOR(tb_tenant(&g_b, g_tenant).used <= 192 * MiB + lease_eff, 2000);
    gm_broker_tenant_t t = tb_tenant(&g_b, g_tenant);
    if (t.used > 192 * MiB + lease_eff)
        fprintf(stderr, "%s: the broker books %llu MiB for the tenant; A holds %llu MiB\n", what,
                (unsigned long long)(t.used / MiB), (unsigned long long)(res / MiB));
    CHECK(t.used <= 192 * MiB + lease_eff);

    /* 4: B takes the rest of the quota. */
    areply_t rest = do_alloc(&b, QUOTA - 192 * MiB, tb);
    CHECK_KID_RC(rest.rc, GM_OK);
    t = tb_tenant(&g_b, g_tenant);
    CHECK(t.used <= QUOTA);
    printf("%s: A's attempt refused, A holds %llu MiB, B got the remaining %llu MiB: %s\n", what,
           (unsigned long long)(res / MiB), (unsigned long long)((QUOTA - 192 * MiB) / MiB),
           rest.rc == GM_OK ? "yes" : gm_strerror(rest.rc));

    /* 5: the data, then the end. */
    CHECK(do_op(&a, OP_CHECK, keep.slot) == 1);
    if (rest.rc == GM_OK) CHECK(do_op(&b, OP_CHECK, rest.slot) == 1);
    finish(&a);
    finish(&b);
    WAIT_FOR(tb_tenant(&g_b, g_tenant).used == 0, 2000);
    CHECK(tb_tenant(&g_b, g_tenant).used == 0);
}

int main(int argc, char **argv)
{
    if (argc > 1) g_seed = strtoull(argv[1], NULL, 0);
    printf("test_broker_strand: seed %#llx (backend %s)\n", g_seed, bp_is_cuda() ? "cuda" : "sim");
    int rd = bp_coordinator(g_tenant, sizeof g_tenant);
    uint64_t rs = g_seed;
    tb_init(&g_b);
    tb_config(&g_b, "2GiB", "default_quota = 512MiB\n");
    bp_start(&g_b);
    round_("kept pages, default lease", 0, SIZE_MAX, &rs);
    round_("release threshold 0, default lease", 0, 0, &rs);
    round_("release threshold 0, 8 MiB leases", 8 * MiB, 0, &rs);
    round_("kept pages, 8 MiB leases", 8 * MiB, SIZE_MAX, &rs);
    CHECK(tb_stop(&g_b, SIGTERM) == 0);
    tb_cleanup(&g_b);
    tp_results_drain(rd);
    return test_summary();
}
