/* SPDX-License-Identifier: Apache-2.0 */
/*
 * core_oom_handlers_threads.c — attacks gm_set_oom_handler and
 * gm_remove_oom_handler, which the header lets a program call at any time,
 * while other threads' allocations fail and call the handlers.  A pool of
 * one heap read its handler table with no lock held once its own lock was
 * dropped for the handlers, while the two calls changed it under that lock
 * (a data race: TSan, which runs this test in `make test`, reported it).
 * Also checks that a handler registered for the whole run is called on every
 * failure, with the pool's handle, on one heap and on four.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "gpumem.h"
#include "../test.h"

#define MiB ((size_t)1 << 20)
static atomic_int stop;
static atomic_uint kept_calls, churn_calls;
static gm_pool_t *the_pool;

static int kept(gm_pool_t *pool, size_t size, gm_stream_t s, void *user)
{
    (void)size, (void)s, (void)user;
    if (pool == the_pool) atomic_fetch_add(&kept_calls, 1);
    return 0;
}

static int churning(gm_pool_t *pool, size_t size, gm_stream_t s, void *user)
{
    (void)pool, (void)size, (void)s, (void)user;
    atomic_fetch_add(&churn_calls, 1);
    return 0;
}

/* Adds and removes a handler until told to stop; counts what failed. */
static void *setter(void *arg)
{
    unsigned *bad = arg;
    while (!atomic_load(&stop)) {
        if (gm_set_oom_handler(the_pool, churning, (void *)1) != GM_OK && ++*bad == 1)
            fprintf(stderr, "gm_set_oom_handler: %s\n", gm_last_error());
        if (gm_remove_oom_handler(the_pool, churning, (void *)1) != GM_OK && ++*bad == 1)
            fprintf(stderr, "gm_remove_oom_handler: %s\n", gm_last_error());
    }
    return NULL;
}

typedef struct {
    unsigned failures_seen, wrong_rc;
} failer_t;

/* Allocations that cannot fit: each one runs the handlers. */
static void *failer(void *arg)
{
    failer_t *f = arg;
    for (int i = 0; i < (UNDER_SANITIZER ? 300 : 3000); i++) {
        void *p = NULL;
        int rc = gm_alloc(the_pool, 2 * MiB, NULL, &p);
        if (rc == GM_LIMIT) f->failures_seen++;
        else f->wrong_rc++;
        if (p) gm_free(the_pool, p, NULL);
    }
    return NULL;
}

static void run(unsigned heaps)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = test_backend(); /* GPUMEM_TEST_BACKEND */
    cfg.sim_capacity = 256 * MiB;
    cfg.limit = 4 * MiB;
    cfg.heaps = heaps;
    the_pool = pool_from(&cfg);
    if (!the_pool) {
        CHECK(the_pool != NULL);
        return;
    }
    void *hold = NULL;
    CHECK_OK(gm_alloc(the_pool, 3 * MiB, NULL, &hold)); /* the limit leaves 1 MiB */
    CHECK_OK(gm_set_oom_handler(the_pool, kept, NULL));
    atomic_store(&stop, 0);
    atomic_store(&kept_calls, 0);
    unsigned bad = 0;
    failer_t f[2] = {{0, 0}, {0, 0}};
    pthread_t ts, tf[2];
    int setter_up = pthread_create(&ts, NULL, setter, &bad) == 0;
    CHECK(setter_up);
    if (!setter_up) goto out;
    int nf = 0;
    while (nf < 2 && pthread_create(&tf[nf], NULL, failer, &f[nf]) == 0) nf++;
    CHECK(nf == 2);
    for (int i = 0; i < nf; i++) pthread_join(tf[i], NULL);
    atomic_store(&stop, 1);
    pthread_join(ts, NULL);
    CHECK(bad == 0);
    CHECK(f[0].wrong_rc == 0 && f[1].wrong_rc == 0);
    /* The kept handler ran at least once per failure (the library may give
     * it more than one round). */
    CHECK(atomic_load(&kept_calls) >= f[0].failures_seen + f[1].failures_seen);
    CHECK_OK(gm_remove_oom_handler(the_pool, kept, NULL));
    CHECK_OK(gm_pool_check(the_pool));
out:
    gm_free(the_pool, hold, NULL);
    gm_pool_destroy(the_pool);
    printf("heaps %u: %u + %u failed allocations, kept handler %u calls, churning one %u\n", heaps,
           f[0].failures_seen, f[1].failures_seen, atomic_load(&kept_calls), atomic_load(&churn_calls));
}

int main(void)
{
    run(1);
    run(4);
    return test_summary();
}
