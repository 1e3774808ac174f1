/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_managed.c — managed memory (gm_alloc_managed): usable by device
 * copies and fills, sized and freed like any block, counted apart in the
 * stats (not in allocated, not under the pool limit), prefetch and advice
 * reach the backend, wrong pointers and wrong entry points are refused, and
 * a failing driver call leaves nothing allocated.  test_basic runs on the
 * test backend (GPUMEM_TEST_BACKEND=cuda: a GPU), test_faults on the sim.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpumem.h"
#include "../test.h"

#define MiB ((size_t)1 << 20)

static void test_basic(void)
{
    gm_pool_t *pool = test_pool(64 * MiB, 16 * MiB);
    if (!pool) { CHECK(0); return; }
    /* Beyond the device and the limit: managed memory oversubscribes. */
    CHECK_OK(gm_pool_set_limit(pool, 16 * MiB));
    void *m = NULL;
    size_t n = 96 * MiB + 123;
    CHECK_OK(gm_alloc_managed(pool, n, GM_MANAGED_PREFER_DEVICE | GM_MANAGED_PREFETCH, NULL, &m));
    CHECK(m != NULL);
    gm_stats_t st = pool_stats_of(pool);
    CHECK(st.managed_allocated == n && st.managed_count == 1 && st.managed_allocated_peak == n);
    CHECK(st.allocated == 0);
    CHECK(st.backend_calls[GM_CALL_mem_alloc] == 1);
    CHECK(st.backend_calls[GM_CALL_advise] == 2 && st.backend_calls[GM_CALL_prefetch] == 1);
    size_t sz = 0;
    CHECK_OK(gm_block_size(pool, m, &sz));
    CHECK(sz == n);

    /* Device work reaches it; the host sees the bytes. */
    CHECK_OK(gm_memset(pool, m, 0x5a, n, NULL));
    CHECK_OK(gm_stream_synchronize(pool, NULL));
    unsigned char *host = malloc(4096);
    CHECK_OK(gm_memcpy_d2h(pool, host, (char *)m + n - 4096, 4096, NULL));
    int same = 1;
    for (int i = 0; i < 4096; i++) same &= host[i] == 0x5a;
    CHECK(same);
    free(host);

    CHECK_OK(gm_managed_prefetch(pool, (char *)m + MiB, 8 * MiB, 1, NULL));
    CHECK_OK(gm_managed_prefetch(pool, m, n, 0, NULL));
    CHECK_RC(gm_managed_prefetch(pool, (char *)m + n - 10, 4096, 0, NULL), GM_INVALID_POINTER);
    int local;
    CHECK_RC(gm_managed_prefetch(pool, &local, 4, 0, NULL), GM_INVALID_POINTER);
    CHECK_RC(gm_managed_prefetch(pool, NULL, 4, 0, NULL), GM_INVALID_ARGUMENT);

    /* Wrong entry points and pointers. */
    CHECK_RC(gm_host_free(pool, m, NULL), GM_INVALID_POINTER);
    CHECK_RC(gm_free(pool, (char *)m + 256, NULL), GM_INVALID_POINTER);
    CHECK(pool_stats_of(pool).managed_allocated == n);

    CHECK_OK(gm_free(pool, m, NULL));
    st = pool_stats_of(pool);
    CHECK(st.managed_allocated == 0 && st.managed_allocated_peak == n);
    CHECK(st.backend_calls[GM_CALL_mem_free] == 1);
    CHECK(gm_free(pool, m, NULL) != GM_OK); /* already freed */
    CHECK(pool_stats_of(pool).backend_calls[GM_CALL_mem_free] == 1);

    /* Arguments. */
    CHECK_RC(gm_alloc_managed(pool, 1, 0x80, NULL, &m), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_alloc_managed(pool, 1, 0, NULL, NULL), GM_INVALID_ARGUMENT);
    CHECK_OK(gm_alloc_managed(pool, 0, 0, NULL, &m));
    CHECK(m == NULL);
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
}

static void test_faults(void)
{
    gm_pool_t *pool = sim_pool(64 * MiB, 0);
    if (!pool) { CHECK(0); return; }
    void *m = (void *)1;
    CHECK_OK(gm_sim_fail_nth(pool, GM_CALL_mem_alloc, 1));
    CHECK_RC(gm_alloc_managed(pool, MiB, 0, NULL, &m), GM_BACKEND);
    CHECK(m == NULL);
    CHECK(strstr(gm_last_error(), "gm_alloc_managed") != NULL);
    /* Advice or prefetch failing: the memory goes back, nothing counted. */
    int kinds[] = {GM_CALL_advise, GM_CALL_prefetch};
    for (int k = 0; k < 2; k++) {
        CHECK_OK(gm_sim_fail_nth(pool, kinds[k], 1));
        CHECK_RC(gm_alloc_managed(pool, MiB, GM_MANAGED_PREFER_DEVICE | GM_MANAGED_PREFETCH, NULL, &m),
                 GM_BACKEND);
        CHECK(m == NULL);
    }
    gm_stats_t st = pool_stats_of(pool);
    CHECK(st.managed_allocated == 0 && st.managed_count == 0);
    CHECK(st.backend_calls[GM_CALL_mem_free] == 2);
    /* A failing free keeps the block: a later free succeeds. */
    CHECK_OK(gm_alloc_managed(pool, MiB, 0, NULL, &m));
    CHECK_OK(gm_sim_fail_nth(pool, GM_CALL_mem_free, 1));
    CHECK_RC(gm_free(pool, m, NULL), GM_BACKEND);
    CHECK(pool_stats_of(pool).managed_allocated == MiB);
    CHECK_OK(gm_free(pool, m, NULL));
    CHECK(pool_stats_of(pool).managed_allocated == 0);
    /* Left at destroy: freed with the pool. */
    CHECK_OK(gm_alloc_managed(pool, 3 * MiB, 0, NULL, &m));
    gm_pool_destroy(pool);
}

int main(void)
{
    test_basic();
    test_faults();
    return test_summary();
}
