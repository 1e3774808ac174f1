/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_broker_offload.c — offload under a broker's quota: the pages an
 * offload gives back go back to the broker (the tenant's use drops once
 * the pool trims its stock), so another allocation fits in the quota the
 * sleeping tag held; a restore that the quota cannot hold fails with
 * GM_LIMIT naming the tenant, the tag stays offloaded with its data, and
 * once room is made the restore maps the same addresses with the same bytes.
 */
#include "test.h"
#include "broker_util.h"
#include "broker_checks.h"

static char g_tenant[64];

static int fill(gm_pool_t *pool, void *p, size_t n, unsigned char v)
{
    int rc = gm_memset(pool, p, v, n, NULL);
    return rc == GM_OK ? gm_stream_synchronize(pool, NULL) : rc;
}

/* First, middle and last byte of [p, p+n) equal v. */
static int holds(gm_pool_t *pool, const void *p, size_t n, unsigned char v)
{
    size_t at[3] = {0, n / 2, n - 1};
    for (int i = 0; i < 3; i++) {
        unsigned char c = 0;
        if (gm_memcpy_d2h(pool, &c, (const unsigned char *)p + at[i], 1, NULL) != GM_OK) return 0;
        if (c != v) return 0;
    }
    return 1;
}

int main(void)
{
    test_broker_t b;
    bc_start_mine(&b, "512MiB", "default_quota = 64MiB\n", g_tenant, sizeof g_tenant);

    gm_pool_t *pool = NULL;
    CHECK_OK(tb_pool(&b, 8 * MiB, &pool));
    if (!pool) {
        tb_cleanup(&b);
        return test_summary();
    }
    gm_tag_t w;
    CHECK_OK(gm_tag_get("broker.weights", 0, &w));
    void *a = NULL, *c = NULL, *u = NULL;
    CHECK_OK(gm_alloc_tagged(pool, 24 * MiB, NULL, w, &a));
    CHECK_OK(gm_alloc_tagged(pool, 20 * MiB + 4096, NULL, w, &c));
    CHECK_OK(fill(pool, a, 24 * MiB, 0x3c));
    CHECK_OK(fill(pool, c, 20 * MiB + 4096, 0xc3));

    /* The quota is taken: more is refused. */
    CHECK_RC(gm_alloc(pool, 32 * MiB, NULL, &u), GM_LIMIT);
    CHECK(strstr(gm_last_error(), g_tenant) != NULL);

    /* Asleep: the pages go back to the broker once the pool trims its stock. */
    CHECK_OK(gm_offload(pool, w, 0, NULL));
    CHECK_OK(gm_trim(pool, 0, NULL));
    WAIT_FOR(tb_tenant(&b, g_tenant).used == 0, 2000);
    CHECK(tb_tenant(&b, g_tenant).used == 0);
    CHECK_OK(gm_alloc(pool, 32 * MiB, NULL, &u));
    CHECK_OK(fill(pool, u, 32 * MiB, 0x77));

    /* Waking needs 46 MiB more than the quota has left: refused, nothing lost. */
    CHECK_RC(gm_restore(pool, w, NULL), GM_LIMIT);
    CHECK(strstr(gm_last_error(), "stays offloaded") != NULL);
    gm_tag_info_t ti = GM_TAG_INFO_INIT;
    CHECK_OK(gm_tag_info(pool, w, &ti));
    CHECK(ti.offloaded_blocks == 2 && ti.resident_blocks == 0);
    CHECK_OK(gm_pool_check(pool));
    CHECK(tb_tenant(&b, g_tenant).used <= 64 * MiB);

    /* Room made: the same addresses, the same bytes. */
    CHECK_OK(gm_free(pool, u, NULL));
    CHECK_OK(gm_trim(pool, 0, NULL));
    CHECK_OK(gm_restore(pool, w, NULL));
    CHECK(holds(pool, a, 24 * MiB, 0x3c));
    CHECK(holds(pool, c, 20 * MiB + 4096, 0xc3));
    CHECK_OK(gm_tag_info(pool, w, &ti));
    CHECK(ti.offloaded_blocks == 0 && ti.resident_blocks == 2);
    CHECK(tb_tenant(&b, g_tenant).used <= 64 * MiB);
    CHECK_OK(gm_pool_check(pool));

    CHECK_OK(gm_free(pool, a, NULL));
    CHECK_OK(gm_free(pool, c, NULL));
    gm_pool_destroy(pool);
    WAIT_FOR(tb_tenant(&b, g_tenant).clients == 0, 2000);
    CHECK(tb_tenant(&b, g_tenant).used == 0);
    tb_cleanup(&b);
    return test_summary();
}
