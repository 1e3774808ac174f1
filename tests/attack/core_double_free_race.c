/* SPDX-License-Identifier: Apache-2.0 */
/*
 * core_double_free_race.c — attacks gm_free with the same pointer freed by
 * two threads at once: the thread that allocated it (whose free takes the
 * thread cache's path, no lock) and another one (whose free takes the
 * pool's lock).  Exactly one of the two must succeed and the other report
 * GM_DOUBLE_FREE.  Before the cache claimed the block with a
 * compare-and-swap, both could succeed, about once in 2 000 rounds on two
 * cores (the cache's check and its mark were two steps, and the locked free
 * fell between them), and the double free went unreported.
 *
 * Sizes: 512 B (the cache's bins) and 1 MiB (its one large slot), by turns.
 * The pool passes gm_pool_check at the end and holds no live block.  On the
 * sim or a GPU (test_backend()).
 */
// ctest-valgrind: skip
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>

#include "gpumem.h"
#include "../test.h"

#if UNDER_SANITIZER
#define ROUNDS 20000
#else
#define ROUNDS 200000
#endif

static gm_pool_t *pool;
static void *_Atomic victim;
static atomic_int go, done;
static atomic_int other_rc[ROUNDS + 1];

/* Wait until *v == want, spinning (both threads must free at the same
 * moment), yielding now and then in case the machine has one core. */
static void await(atomic_int *v, int want)
{
    for (unsigned n = 0; atomic_load(v) != want; n++)
        if ((n & 1023) == 1023) sched_yield();
}

static void *other(void *arg)
{
    (void)arg;
    for (int i = 1; i <= ROUNDS; i++) {
        await(&go, i);
        atomic_store(&other_rc[i], gm_free(pool, atomic_load(&victim), NULL));
        atomic_store(&done, i);
    }
    return NULL;
}

int main(void)
{
    pool = test_pool((size_t)1 << 30, 0); /* the sim, or the GPU under GPUMEM_TEST_BACKEND=cuda */
    CHECK(pool != NULL);
    if (!pool) return test_summary();
    pthread_t t;
    CHECK(pthread_create(&t, NULL, other, NULL) == 0);
    int both_ok = 0, neither = 0, wrong = 0;
    for (int i = 1; i <= ROUNDS; i++) {
        void *p = NULL;
        int rc = gm_alloc(pool, (i & 1) ? 512 : (size_t)1 << 20, NULL, &p);
        if (rc != GM_OK) {
            CHECK_OK(rc);
            p = NULL; /* the other thread's free of NULL succeeds: counted below */
        }
        atomic_store(&victim, p);
        atomic_store(&go, i);
        int mine = gm_free(pool, p, NULL);
        await(&done, i);
        int theirs = atomic_load(&other_rc[i]);
        if (!p) continue;
        if (mine == GM_OK && theirs == GM_OK) both_ok++;
        else if (mine != GM_OK && theirs != GM_OK) neither++;
        else if ((mine != GM_OK && mine != GM_DOUBLE_FREE) ||
                 (theirs != GM_OK && theirs != GM_DOUBLE_FREE)) wrong++;
    }
    pthread_join(t, NULL);
    printf("%d rounds: both succeeded %d, neither %d, another status %d\n", ROUNDS, both_ok,
           neither, wrong);
    CHECK(both_ok == 0);
    CHECK(neither == 0);
    CHECK(wrong == 0);
    CHECK_OK(gm_pool_check(pool));
    gm_stats_t st = pool_stats_of(pool);
    CHECK(st.live_blocks == 0);
    gm_pool_destroy(pool);
    return test_summary();
}
