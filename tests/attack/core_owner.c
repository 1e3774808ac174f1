/* SPDX-License-Identifier: Apache-2.0 */
/*
 * core_owner.c — attacks "gm_free, gm_block_size and gm_record_stream take
 * [sysmem] blocks like any block" and "gm_host_free: anything not from
 * gm_host_alloc is refused": memory handed to the wrong free must be refused
 * with GM_INVALID_ARGUMENT and nothing released.  Before the owner lookup,
 * gm_host_free released a sysmem-fallback block of gm_alloc, gm_host_alloc
 * handed the same live bytes out again, and the owner's gm_free then
 * released the other block.
 */
#include <stdint.h>
#include <string.h>

#include "gpumem.h"
#include "../test.h"

#define MiB ((size_t)1 << 20)

static gm_pool_t *new_pool(void) { return sim_pool(64 * MiB, GM_POOL_SYSMEM_FALLBACK); }

static int overlap(const void *a, size_t na, const void *b, size_t nb)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + nb && y < x + na;
}

int main(void)
{
    gm_pool_t *pool = new_pool();
    REQUIRE(pool != NULL);
    void *dev, *sys, *host;
    CHECK_OK(gm_alloc(pool, 48 * MiB, NULL, &dev));
    CHECK_OK(gm_alloc(pool, 32 * MiB, NULL, &sys)); /* past the device: sysmem */
    gm_stats_t st = pool_stats_of(pool);
    REQUIRE(st.sysmem_count == 1 && st.sysmem_allocated == 32 * MiB);

    /* A sysmem block given to gm_host_free: refused, still live. */
    CHECK_RC(gm_host_free(pool, sys, NULL), GM_INVALID_ARGUMENT);
    CHECK(strstr(gm_last_error(), "gm_free") != NULL);
    st = pool_stats_of(pool);
    CHECK(st.sysmem_allocated == 32 * MiB);
    size_t size = 0;
    CHECK_OK(gm_block_size(pool, sys, &size));
    CHECK(size == 32 * MiB);
    /* So gm_host_alloc cannot hand its bytes out again. */
    CHECK_OK(gm_host_alloc(pool, 32 * MiB, NULL, &host));
    CHECK(host != NULL && !overlap(host, 32 * MiB, sys, 32 * MiB));

    /* A gm_host_alloc block given to the device entry points: refused. */
    gm_stats_t before = pool_stats_of(pool);
    CHECK_RC(gm_free(pool, host, NULL), GM_INVALID_ARGUMENT);
    CHECK(strstr(gm_last_error(), "gm_host_free") != NULL);
    CHECK_RC(gm_block_size(pool, host, &size), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_record_stream(pool, host, (gm_stream_t)0x77), GM_INVALID_ARGUMENT);
    gm_stats_t after = pool_stats_of(pool);
    CHECK(after.host_allocated == before.host_allocated);
    CHECK(after.sysmem_allocated == before.sysmem_allocated);

    /* A device block given to gm_host_free: refused, still live. */
    CHECK_RC(gm_host_free(pool, dev, NULL), GM_INVALID_ARGUMENT);
    CHECK_OK(gm_block_size(pool, dev, &size));
    CHECK(size == 48 * MiB);

    /* Each through its own entry point: fine, once. */
    CHECK_OK(gm_free(pool, sys, NULL));
    CHECK(pool_stats_of(pool).sysmem_allocated == 0);
    CHECK(pool_stats_of(pool).host_allocated == 32 * MiB);
    CHECK_OK(gm_host_free(pool, host, NULL));
    CHECK(pool_stats_of(pool).host_allocated == 0);
    CHECK_RC(gm_host_free(pool, host, NULL), GM_INVALID_POINTER);
    CHECK_OK(gm_free(pool, dev, NULL));
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
    return test_summary();
}
