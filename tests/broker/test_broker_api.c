/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_broker_api.c — one process against a broker: leases, the quota
 * refusal through the OOM path, trim, the stock, pool destroy, a pool with
 * heaps, a broker that is not there, and sharing refused on leased pages.
 */
#include "test.h"
#include "broker_util.h"
#include "broker_checks.h"

static char g_tenant[64];
static int g_go[2], g_ready[2];
static pid_t g_client;

/* The client of the fork case: waits for "go", leases 32 MiB, forks a child
 * that only sleeps, says the child's pid, waits to be killed. */
static void forking_client(const test_broker_t *b)
{
    char c;
    if (read(g_go[0], &c, 1) != 1) _exit(1);
    gm_pool_t *cp = NULL;
    void *a = NULL;
    if (tb_pool(b, 0, &cp) != GM_OK || gm_alloc(cp, 32 * MiB, NULL, &a) != GM_OK) _exit(1);
    pid_t kid = fork();
    if (kid == 0) {
        sleep(5);
        _exit(0);
    }
    char pidbuf[32];
    int n = snprintf(pidbuf, sizeof pidbuf, "%d\n", (int)kid);
    if (write(g_ready[1], pidbuf, (size_t)n) != n) _exit(1);
    pause();
    _exit(0);
}

int main(void)
{
    test_broker_t b;
    bc_start_mine(&b, "1GiB", "default_quota = 256MiB\nkeep_free = 64MiB\n", g_tenant,
                  sizeof g_tenant);
    if (pipe(g_go) != 0 || pipe(g_ready) != 0) return 1;
    fflush(NULL);
    g_client = fork();
    if (g_client == 0) forking_client(&b);

    /* No broker at a path: pool creation fails and says so. */
    {
        gm_pool_config_t cfg;
        gm_config_from_env(&cfg);
        snprintf(cfg.broker, sizeof cfg.broker, "%.60s/none.sock", b.dir);
        gm_pool_t *p = NULL;
        CHECK_RC(gm_pool_create(&cfg, &p), GM_IO);
        CHECK(strstr(gm_last_error(), "none.sock") != NULL);
    }

    gm_pool_t *pool = NULL;
    CHECK_OK(tb_pool(&b, 16 * MiB, &pool));
    void *p = NULL;
    CHECK_OK(gm_alloc(pool, 4 * MiB, NULL, &p));
    CHECK_OK(gm_memset(pool, p, 0x5a, 4 * MiB, NULL)); /* device memory: not host-addressable on cuda */
    CHECK_OK(gm_stream_synchronize(pool, NULL));
    gm_broker_tenant_t t = tb_tenant(&b, g_tenant);
    CHECK(t.used == 16 * MiB); /* one lease */
    CHECK(t.quota == 256 * MiB);
    CHECK(t.clients == 1);

    /* Up to the quota, then the quota refusal, through gm_alloc's OOM path. */
    void *q = NULL;
    CHECK_OK(gm_alloc(pool, 200 * MiB, NULL, &q));
    void *r = NULL;
    CHECK_RC(gm_alloc(pool, 64 * MiB, NULL, &r), GM_LIMIT);
    CHECK(strstr(gm_last_error(), "over its quota") != NULL);
    CHECK(strstr(gm_last_error(), g_tenant) != NULL);
    /* The report speaks of the broker's memory, not of this process's own
     * view of the device (which it does not use). */
    CHECK(strstr(gm_last_error(), "leased from the broker") != NULL);
    CHECK(strstr(gm_last_error(), "limit none (device memory") == NULL);
    CHECK(strstr(gm_last_error(), "): total ") == NULL);
    if (strstr(gm_last_error(), "): total ")) fprintf(stderr, "%s\n", gm_last_error());
    t = tb_tenant(&b, g_tenant);
    CHECK(t.used <= 256 * MiB);
    CHECK(t.refusals >= 1);
    CHECK_OK(gm_pool_check(pool));

    /* Free and trim: everything goes back to the broker. */
    CHECK_OK(gm_free(pool, q, NULL));
    size_t released = 0;
    CHECK_OK(gm_trim(pool, 0, &released));
    /* Returns need no answer: the broker may read them after a query. */
    WAIT_FOR(tb_tenant(&b, g_tenant).used == 4 * MiB, 2000);
    t = tb_tenant(&b, g_tenant);
    CHECK(t.used == 4 * MiB);
    /* The first block still holds its data. */
    unsigned char last = 0;
    CHECK_OK(gm_memcpy(pool, &last, (unsigned char *)p + 4 * MiB - 1, 1, NULL));
    CHECK_OK(gm_stream_synchronize(pool, NULL));
    CHECK(last == 0x5a);
    CHECK_OK(gm_free(pool, p, NULL));
    CHECK_OK(gm_trim(pool, 0, NULL));
    WAIT_FOR(tb_tenant(&b, g_tenant).used == 0, 2000);
    t = tb_tenant(&b, g_tenant);
    CHECK(t.used == 0);

    /* Sharing leased pages is refused. */
    {
        void *s = NULL;
        CHECK_OK(gm_alloc_shareable(pool, 2 * MiB, NULL, &s));
        char path[100];
        snprintf(path, sizeof path, "%.60s/share.sock", b.dir);
        gm_share_server_t *srv = NULL;
        CHECK_OK(gm_share_listen(pool, path, NULL, &srv));
        CHECK_RC(gm_share_publish(srv, "x", s, 2 * MiB, GM_SHARE_READ_WRITE, NULL, NULL),
                 GM_NOT_SUPPORTED);
        CHECK_OK(gm_share_close(srv));
        CHECK_OK(gm_free(pool, s, NULL));
    }

    gm_pool_destroy(pool);
    WAIT_FOR(tb_tenant(&b, g_tenant).clients == 0, 2000);
    t = tb_tenant(&b, g_tenant);
    CHECK(t.used == 0 && t.clients == 0);

    /* Heaps share one connection. */
    {
        gm_pool_config_t cfg;
        gm_config_from_env(&cfg);
        snprintf(cfg.broker, sizeof cfg.broker, "%s", b.sock);
        cfg.heaps = 4;
        gm_pool_t *hp = NULL;
        CHECK_OK(gm_pool_create(&cfg, &hp));
        void *a = NULL;
        CHECK_OK(gm_alloc(hp, 8 * MiB, NULL, &a));
        CHECK_OK(gm_free(hp, a, NULL));
        CHECK_OK(gm_pool_check(hp));
        gm_pool_destroy(hp);
        WAIT_FOR(tb_tenant(&b, g_tenant).clients == 0, 2000);
        CHECK(tb_tenant(&b, g_tenant).used == 0);
    }

    /* A client that forked (a data loader's workers) and is then killed:
     * its child must not keep the lease alive.  (It was forked before this
     * process touched the device: a CUDA process cannot fork a CUDA user.) */
    {
        CHECK(write(g_go[1], "g", 1) == 1);
        char buf[32] = {0};
        ssize_t n = read(g_ready[0], buf, sizeof buf - 1);
        CHECK(n > 0);
        pid_t kid = n > 0 ? atoi(buf) : 0;
        CHECK(kid > 0);
        CHECK(tb_tenant(&b, g_tenant).used >= 32 * MiB);
        double t0 = now_ms();
        kill(g_client, SIGKILL);
        waitpid(g_client, NULL, 0);
        WAIT_FOR(tb_tenant(&b, g_tenant).used == 0, 3000);
        double took = now_ms() - t0;
        CHECK(tb_tenant(&b, g_tenant).used == 0);
        CHECK(took < 1000);
        printf("a killed client with a forked child: its pages back in %.1f ms\n", took);
        if (kid > 0) kill(kid, SIGKILL);
    }

    CHECK(tb_stop(&b, SIGTERM) == 0);
    tb_cleanup(&b);
    return test_summary();
}
