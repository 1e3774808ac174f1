/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_broker_idle.c — the broker's idle timeout after HELLO (docs/broker.md,
 * idle_timeout): a control connection that holds no pages and has said
 * nothing for idle_timeout seconds is closed, so idle connections cannot
 * keep a tenant's share of max_clients taken; one that holds pages is never
 * closed for being idle (its pages would go to others while it maps them);
 * and a closed pool's next allocation reconnects at once, without an error.
 *
 *   1  two pools of this process (two clients of one tenant), idle_timeout
 *      1 s: A keeps a block (pages leased), B frees and trims (holds
 *      nothing).  B's connection is closed (the tenant's clients 2 -> 1),
 *      A's is not, even well past the timeout.
 *   2  B allocates again: no error, the tenant has 2 clients, the block is
 *      usable; A allocates more, too.
 *   3  idle_timeout 0 (never): nothing is closed.
 * Waits are polls with generous deadlines (the timeout is a lower bound).
 */
#include "test.h"
#include "broker_util.h"

static char g_tenant[64];

/* Poll the tenant's client count until it is want (or 30 s pass). */
static uint64_t wait_clients(const test_broker_t *b, uint64_t want)
{
    uint64_t n = 0;
    for (int i = 0; i < 3000; i++) {
        n = tb_tenant(b, g_tenant).clients;
        if (n == want) break;
        sleep_ms(10);
    }
    return n;
}

static void start(test_broker_t *b, unsigned idle_s)
{
    tb_init(b);
    char extra[200];
    snprintf(extra, sizeof extra, "default_quota = 256MiB\nkeep_free = 64MiB\nidle_timeout = %u\n",
             idle_s);
    tb_config(b, "1GiB", extra);
    tb_start(b);
}

static void run(test_broker_t *bk, unsigned idle_s)
{
    test_broker_t b = *bk;

    gm_pool_t *a = NULL, *bp = NULL;
    CHECK_OK(tb_pool(&b, 8 * MiB, &a));
    CHECK_OK(tb_pool(&b, 8 * MiB, &bp));
    if (!a || !bp) {
        tb_cleanup(&b);
        return;
    }
    void *pa = NULL, *pb = NULL;
    CHECK_OK(gm_alloc(a, 4 * MiB, NULL, &pa));
    CHECK_OK(gm_alloc(bp, 4 * MiB, NULL, &pb));
    CHECK(tb_tenant(&b, g_tenant).clients == 2);
    CHECK_OK(gm_free(bp, pb, NULL));
    CHECK_OK(gm_trim(bp, 0, NULL)); /* B holds nothing now */
    CHECK(tb_tenant(&b, g_tenant).used == 8 * MiB); /* A's lease only */

    if (idle_s) {
        CHECK(wait_clients(&b, 1) == 1); /* B's connection closed */
        sleep_ms(2000 * idle_s);         /* well past the timeout: A stays */
        CHECK(tb_tenant(&b, g_tenant).clients == 1);
        CHECK(tb_file_has(b.log, "idle after HELLO, holding no pages"));
    } else {
        sleep_ms(2500);
        CHECK(tb_tenant(&b, g_tenant).clients == 2);
    }

    /* B's next allocation reconnects at once; A goes on. */
    pb = NULL;
    CHECK_OK(gm_alloc(bp, 4 * MiB, NULL, &pb));
    CHECK(pb != NULL);
    if (pb) {
        CHECK_OK(gm_memset(bp, pb, 0x3c, 4 * MiB, NULL));
        CHECK_OK(gm_stream_synchronize(bp, NULL));
    }
    CHECK(tb_tenant(&b, g_tenant).clients == 2);
    void *pa2 = NULL;
    CHECK_OK(gm_alloc(a, 12 * MiB, NULL, &pa2));
    CHECK_OK(gm_pool_check(a));
    CHECK_OK(gm_pool_check(bp));

    CHECK_OK(gm_free(a, pa, NULL));
    CHECK_OK(gm_free(a, pa2, NULL));
    if (pb) CHECK_OK(gm_free(bp, pb, NULL));
    gm_pool_destroy(a);
    gm_pool_destroy(bp);
    CHECK(wait_clients(&b, 0) == 0);
    CHECK(tb_tenant(&b, g_tenant).used == 0);
    tb_cleanup(&b);
}

int main(void)
{
    snprintf(g_tenant, sizeof g_tenant, "uid:%u", (unsigned)geteuid());
    /* Both brokers start before this process uses a device: on cuda a
     * child forked after the parent initialized the driver cannot use it. */
    test_broker_t b1, b0;
    start(&b1, 1);
    start(&b0, 0);
    run(&b1, 1);
    run(&b0, 0);
    return test_summary();
}
