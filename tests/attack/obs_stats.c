/* SPDX-License-Identifier: Apache-2.0 */
/*
 * obs_stats.c — attacks two promises of the stats section of gpumem.h:
 *
 * 1. gm_stats_t is a versioned struct: a caller built against an older,
 *    smaller gm_stats_t passes its own `size`, and the library touches no
 *    byte beyond it.  gm_pool_stats honours that; gm_stats_json must too
 *    (it prints only the fields that fit).  The struct is placed right
 *    before a PROT_NONE page, so a read past `size` is a crash, not luck.
 * 2. gm_process_stats: largest_free_block is the largest of any pool, and
 *    fragmentation_ppm is recomputed from the summed figures (it is not a
 *    sum of ratios, and neither field borrows the other).
 */
#include <stddef.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gpumem.h"
#include "../test.h"

static void test_json_small_struct(gm_pool_t *pool)
{
    long page = sysconf(_SC_PAGESIZE);
    char *m = mmap(NULL, 2 * (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        CHECK(!"mmap");
        return;
    }
    CHECK(mprotect(m + page, (size_t)page, PROT_NONE) == 0);
    /* An "old" gm_stats_t that ends after `cached`. */
    size_t old_size = offsetof(gm_stats_t, cached) + sizeof(uint64_t);
    gm_stats_t *st = (gm_stats_t *)(m + page - old_size);
    st->size = old_size;
    st->version = 1;
    CHECK_OK(gm_pool_stats(pool, st));
    CHECK(st->size == old_size);
    char buf[4096];
    size_t len = 0;
    CHECK_OK(gm_stats_json(st, buf, sizeof buf, &len));
    CHECK(strstr(buf, "\"allocated\":") != NULL);
    CHECK(strstr(buf, "\"cached\":") != NULL);
    CHECK(strstr(buf, "\"alloc_count\"") == NULL);   /* beyond size */
    CHECK(strstr(buf, "\"backend_calls\"") == NULL); /* beyond size */
    CHECK(len == strlen(buf));
    CHECK(buf[0] == '{' && buf[len - 1] == '}');

    /* A struct that was never initialised (size too small for a header). */
    st = (gm_stats_t *)(m + page - sizeof(size_t));
    st->size = 3;
    CHECK_RC(gm_stats_json(st, buf, sizeof buf, &len), GM_INVALID_ARGUMENT);

    /* The whole struct: every field and backend_calls. */
    gm_stats_t full = GM_STATS_INIT;
    CHECK_OK(gm_pool_stats(pool, &full));
    CHECK_OK(gm_stats_json(&full, buf, sizeof buf, &len));
    CHECK(strstr(buf, "\"copy_direct_bytes\":") != NULL);
    CHECK(strstr(buf, "\"backend_calls\":{") != NULL);
    munmap(m, 2 * (size_t)page);
}

/* Many small blocks with every other one freed: a pool whose largest free
 * block is small and whose fragmentation is high. */
static void fragment(gm_pool_t *pool, void **ptrs, int n)
{
    for (int i = 0; i < n; i++) CHECK_OK(gm_alloc(pool, 512, NULL, &ptrs[i]));
    for (int i = 0; i < n; i += 2) CHECK_OK(gm_free(pool, ptrs[i], NULL));
}

static void test_process_stats(void)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = GM_BACKEND_SIM;
    cfg.sim_capacity = (size_t)256 << 20;
    gm_pool_t *a = pool_from(&cfg), *b = pool_from(&cfg);
    if (!a || !b) {
        CHECK(!"pools");
        return;
    }
    enum { N = 256 };
    static void *pa[N], *pb[N];
    fragment(a, pa, N);
    fragment(b, pb, N);
    gm_stats_t sa = pool_stats_of(a), sb = pool_stats_of(b), sp = GM_STATS_INIT;
    CHECK_OK(gm_process_stats(&sp));
    uint64_t largest = sa.largest_free_block > sb.largest_free_block ? sa.largest_free_block
                                                                     : sb.largest_free_block;
    CHECK(sp.largest_free_block == largest);
    CHECK(sp.mapped == sa.mapped + sb.mapped);
    CHECK(sp.active == sa.active + sb.active);
    CHECK(sp.fragmentation_ppm <= 1000000);
    uint64_t free_mapped = sp.mapped > sp.active ? sp.mapped - sp.active : 0;
    uint64_t want = free_mapped && largest < free_mapped
                        ? (uint64_t)(1e6 * (1.0 - (double)largest / (double)free_mapped))
                        : 0;
    CHECK(sp.fragmentation_ppm == want);
    if (sp.largest_free_block != largest || sp.fragmentation_ppm != want)
        fprintf(stderr, "process: largest %llu frag %llu; want %llu %llu (pools %llu/%llu, %llu/%llu)\n",
                (unsigned long long)sp.largest_free_block, (unsigned long long)sp.fragmentation_ppm,
                (unsigned long long)largest, (unsigned long long)want,
                (unsigned long long)sa.largest_free_block, (unsigned long long)sa.fragmentation_ppm,
                (unsigned long long)sb.largest_free_block, (unsigned long long)sb.fragmentation_ppm);
    for (int i = 1; i < N; i += 2) {
        gm_free(a, pa[i], NULL);
        gm_free(b, pb[i], NULL);
    }
    gm_pool_destroy(a);
    gm_pool_destroy(b);
}

int main(void)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = GM_BACKEND_SIM;
    cfg.sim_capacity = (size_t)256 << 20;
    gm_pool_t *pool = pool_from(&cfg);
    REQUIRE(pool != NULL);
    void *p = NULL;
    CHECK_OK(gm_alloc(pool, 1 << 20, NULL, &p));
    test_json_small_struct(pool);
    gm_free(pool, p, NULL);
    gm_pool_destroy(pool);
    test_process_stats();
    return test_summary();
}
