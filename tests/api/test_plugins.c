/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_plugins.c — the entry points plug-ins use: per-device pools
 * (gm_device_pool, shared with gm_default_pool) and the PyTorch allocator
 * functions (gm_torch_*), on the backend the suite runs on.
 *
 * A failed gm_torch_alloc throws a C++ exception when libstdc++ is loaded
 * (it is under ASan), which a C program cannot catch: GPUMEM_TORCH_OOM=null
 * makes it return NULL here.  The throwing path is exercised by the PyTorch
 * run on the device machine.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpumem.h"
#include "../test.h"

#define MiB ((size_t)1 << 20)

int main(void)
{
    /* Pools come from the environment: a small sim device, so that
     * memcheck, which tracks every reserved byte, keeps up. */
    setenv("GPUMEM_SIM_CAPACITY", "4GiB", 0);
    setenv("GPUMEM_TORCH_OOM", "null", 1);
    gm_pool_t *d0 = NULL, *again = NULL, *def = NULL, *d1 = NULL;
    CHECK_OK(gm_device_pool(0, &d0));
    REQUIRE(d0 != NULL);
    CHECK_OK(gm_device_pool(0, &again));
    CHECK(again == d0);
    CHECK_OK(gm_default_pool(&def));
    CHECK(def == d0); /* GPUMEM_DEVICE unset: the default pool is device 0's */
    CHECK_RC(gm_device_pool(-1, &d1), GM_INVALID_ARGUMENT);
    CHECK(d1 == NULL);
    CHECK_RC(gm_device_pool(64, &d1), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_device_pool(0, NULL), GM_INVALID_ARGUMENT);

    gm_device_info_t info = GM_DEVICE_INFO_INIT;
    CHECK_OK(gm_pool_device_info(d0, &info));
    int sim = strcmp(info.backend_name, "sim") == 0;
    if (sim) {
        /* The sim has every ordinal: device 1 gets a pool of its own. */
        CHECK_OK(gm_device_pool(1, &d1));
        CHECK(d1 != NULL && d1 != d0);
    }

    /* gm_torch_alloc / gm_torch_free: blocks of the device's pool, on the
     * stream given. */
    gm_stream_t s = NULL, s2 = NULL; /* real streams: the suite may run on cuda */
    CHECK_OK(gm_stream_create(d0, &s));
    CHECK_OK(gm_stream_create(d0, &s2));
    void *p = gm_torch_alloc((ssize_t)(3 * MiB + 5), 0, s);
    REQUIRE(p != NULL);
    size_t size = 0;
    CHECK_OK(gm_block_size(d0, p, &size));
    CHECK(size == 3 * MiB + 5);
    CHECK_OK(gm_memset(d0, p, 0x5a, size, s));
    gm_torch_record_stream(p, s2);
    gm_torch_free(p, (ssize_t)size, 0, s);
    CHECK_RC(gm_block_size(d0, p, &size), GM_INVALID_POINTER);
    CHECK(gm_torch_alloc(0, 0, s) == NULL);
    CHECK(gm_torch_alloc(-5, 0, s) == NULL);
    CHECK(gm_torch_alloc(1, -1, s) == NULL); /* no such device: NULL */

    if (sim && d1) {
        void *q = gm_torch_alloc(4096, 1, NULL);
        REQUIRE(q != NULL);
        CHECK_OK(gm_block_size(d1, q, &size));
        CHECK_RC(gm_block_size(d0, q, &size), GM_INVALID_POINTER);
        gm_torch_free(q, 4096, 1, NULL);
    }

    /* Memory fraction: the pool's limit; over it, NULL (no libstdc++ here). */
    gm_torch_set_memory_fraction((double)(8 * MiB) / (double)info.total_memory, 0);
    void *big = gm_torch_alloc((ssize_t)(16 * MiB), 0, s);
    CHECK(big == NULL);
    void *fits = gm_torch_alloc((ssize_t)(4 * MiB), 0, s);
    CHECK(fits != NULL);
    gm_torch_free(fits, (ssize_t)(4 * MiB), 0, s);
    gm_torch_set_memory_fraction(1.0, 0);
    big = gm_torch_alloc((ssize_t)(16 * MiB), 0, s);
    CHECK(big != NULL);
    gm_torch_free(big, (ssize_t)(16 * MiB), 0, s);

    /* empty_cache gives every cached page back. */
    CHECK_OK(gm_stream_synchronize(d0, s));
    CHECK_OK(gm_stream_synchronize(d0, s2));
    gm_torch_empty_cache();
    gm_stats_t st = GM_STATS_INIT;
    CHECK_OK(gm_pool_stats(d0, &st));
    CHECK(st.allocated == 0);
    CHECK(st.reserved == 0);
    CHECK_OK(gm_pool_check(d0));
    CHECK_OK(gm_stream_destroy(d0, s));
    CHECK_OK(gm_stream_destroy(d0, s2));
    return test_summary();
}
