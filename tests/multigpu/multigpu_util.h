/* SPDX-License-Identifier: Apache-2.0 */
/*
 * multigpu_util.h — what the multi-device tests share: the byte patterns
 * written through one device's pool and read back through another's, and
 * the end of a test that used two pools.  Include gpumem.h and test.h first.
 */
#ifndef GM_TEST_MULTIGPU_UTIL_H
#define GM_TEST_MULTIGPU_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* n pattern bytes: the top byte of each step of a 32-bit LCG started at x
 * (each test derives x from its seed in a way of its own). */
static inline void lcg_bytes(unsigned char *p, size_t n, uint32_t x)
{
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = (unsigned char)(x >> 24);
    }
}

/* Both pools pass gm_pool_check, then are destroyed, first before second. */
static inline void check_and_destroy_pools(gm_pool_t *first, gm_pool_t *second)
{
    CHECK_OK(gm_pool_check(first));
    CHECK_OK(gm_pool_check(second));
    gm_pool_destroy(first);
    gm_pool_destroy(second);
}

#endif /* GM_TEST_MULTIGPU_UTIL_H */
