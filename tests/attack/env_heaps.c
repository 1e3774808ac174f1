/* SPDX-License-Identifier: Apache-2.0 */
/*
 * env_heaps.c — GPUMEM_HEAPS outside its range.
 *
 * Promise (README.md, Environment; src/core/options.c): GPUMEM_HEAPS is a
 * number of heaps from 1 to 64, and a value the library cannot use is
 * refused by gm_config_from_env (and by gm_pool_create, which reads it when
 * cfg.heaps is 0) with GM_INVALID_ARGUMENT and a message naming the
 * variable, the value and the range.  Before, GPUMEM_HEAPS=0 was accepted
 * silently (a pool of one heap) and 65 only failed later, in gm_pool_create.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpumem.h"
#include "../test.h"

static void refused(const char *v)
{
    gm_pool_config_t cfg;
    setenv("GPUMEM_HEAPS", v, 1);
    int rc = gm_config_from_env(&cfg);
    CHECK_RC(rc, GM_INVALID_ARGUMENT);
    const char *e = gm_last_error();
    char want[64];
    snprintf(want, sizeof want, "GPUMEM_HEAPS=\"%s\"", v);
    bool ok = rc != GM_OK && strstr(e, want) && strstr(e, "1 to 64");
    if (!ok) fprintf(stderr, "GPUMEM_HEAPS=%s: %s\n", v, rc == GM_OK ? "accepted" : e);
    CHECK(ok);

    /* A pool created with cfg.heaps 0 ("GPUMEM_HEAPS") reads it and fails
     * with the same message; so does one created from the environment. */
    gm_pool_config_t c = GM_POOL_CONFIG_INIT;
    c.backend = GM_BACKEND_SIM;
    c.sim_capacity = (size_t)64 << 20;
    c.heaps = 0;
    gm_pool_t *pool = NULL;
    CHECK_RC(gm_pool_create(&c, &pool), GM_INVALID_ARGUMENT);
    CHECK(pool == NULL && strstr(gm_last_error(), "GPUMEM_HEAPS") != NULL);
    if (pool) gm_pool_destroy(pool);
    pool = NULL;
    CHECK_RC(gm_pool_create(NULL, &pool), GM_INVALID_ARGUMENT);
    CHECK(pool == NULL && strstr(gm_last_error(), "GPUMEM_HEAPS") != NULL);
    if (pool) gm_pool_destroy(pool);
}

static void accepted(const char *v, unsigned want)
{
    gm_pool_config_t cfg;
    setenv("GPUMEM_HEAPS", v, 1);
    CHECK_OK(gm_config_from_env(&cfg));
    CHECK(cfg.heaps == want);
}

int main(void)
{
    setenv("GPUMEM_BACKEND", "sim", 1);
    setenv("GPUMEM_SIM_CAPACITY", "64MiB", 1);
    refused("0");
    refused("-1");
    refused("65");
    refused("1048576");
    refused("99999999999999999999");
    refused("4x");
    refused("two");
    accepted("1", 1);
    accepted("2", 2);
    accepted("64", 64);
    unsetenv("GPUMEM_HEAPS");
    gm_pool_config_t cfg;
    CHECK_OK(gm_config_from_env(&cfg));
    CHECK(cfg.heaps == 1);
    return test_summary();
}
