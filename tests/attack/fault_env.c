/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fault_env.c — GPUMEM_MALLOC_FAIL_NTH, the environment switch of the host
 * allocation seam.
 *
 * Promise (README.md, Environment): with GPUMEM_MALLOC_FAIL_NTH=n the n-th
 * host allocation of the library, counted from the first reading of the
 * environment, fails, and the call that made it answers GM_NO_HOST_MEMORY
 * with a message.  Reading the environment again does not re-arm it; a
 * malformed value is refused like any other option's.
 */
#include <stdio.h>
#include <stdlib.h>

#include "gpumem.h"
#include "../test.h"
#include "base/internal.h"

int main(void)
{
    gm_pool_config_t cfg;
    setenv("GPUMEM_MALLOC_FAIL_NTH", "-3", 1);
    CHECK_RC(gm_config_from_env(&cfg), GM_INVALID_ARGUMENT);

    setenv("GPUMEM_MALLOC_FAIL_NTH", "1", 1);
    unsigned long before = gm__malloc_failures();
    CHECK_OK(gm_config_from_env(&cfg));
    cfg.backend = GM_BACKEND_SIM;
    cfg.sim_capacity = (size_t)64 << 20;
    gm_pool_t *pool = NULL;
    /* The pool's own descriptor is its first host allocation. */
    CHECK_RC(gm_pool_create(&cfg, &pool), GM_NO_HOST_MEMORY);
    CHECK(pool == NULL);
    CHECK(gm__malloc_failures() == before + 1);

    /* Once only: a second reading does not arm it again. */
    CHECK_OK(gm_config_from_env(&cfg));
    cfg.backend = GM_BACKEND_SIM;
    cfg.sim_capacity = (size_t)64 << 20;
    CHECK_OK(gm_pool_create(&cfg, &pool));
    CHECK(gm__malloc_failures() == before + 1);
    gm_pool_destroy(pool);
    return test_summary();
}
