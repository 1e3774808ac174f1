/* SPDX-License-Identifier: Apache-2.0 */
/*
 * consumer.c — a program of a gpumem user, built by tests/install/install_test.sh
 * against an installed gpumem (pkg-config and find_package): the public
 * header only, a pool on the sim backend, one allocation, its stats.  Prints
 * "consumer: ok VERSION" and exits 0 when everything worked.
 */
#include <stdio.h>
#include <string.h>

#include <gpumem.h>

int main(void)
{
    if (strcmp(gm_version(), GM_VERSION_STRING) != 0) {
        fprintf(stderr, "consumer: header %s, library %s\n", GM_VERSION_STRING, gm_version());
        return 1;
    }
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = GM_BACKEND_SIM;
    cfg.sim_capacity = (size_t)1 << 30;
    gm_pool_t *pool;
    if (gm_pool_create(&cfg, &pool) != GM_OK) {
        fprintf(stderr, "consumer: %s\n", gm_last_error());
        return 1;
    }
    void *p = NULL;
    int rc = gm_alloc(pool, (size_t)3 << 20, NULL, &p);
    gm_stats_t st = GM_STATS_INIT;
    if (rc == GM_OK) rc = gm_pool_stats(pool, &st);
    if (rc == GM_OK && st.allocated < ((size_t)3 << 20)) rc = GM_INTERNAL;
    if (rc == GM_OK) rc = gm_free(pool, p, NULL);
    if (rc != GM_OK) fprintf(stderr, "consumer: %s: %s\n", gm_errname(rc), gm_last_error());
    gm_pool_destroy(pool);
    if (rc != GM_OK) return 1;
    printf("consumer: ok %s\n", gm_version());
    return 0;
}
