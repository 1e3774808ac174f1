/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_controller.c — the churn controller between the reserve slack and its
 * ceiling (alloc.c, controller_step): a window that remaps k times the churn
 * target raises the slack by k steps, so a ceiling set with
 * reserve_slack_max is reached within a few windows; and a pool of several
 * heaps, whose heaps each see one thread's share of the work, starts each
 * heap at its ceiling, heap_slack_max, and steps every 4 Ki allocations.
 *
 * One heap: the same random mix of one stream, three passes, in a pool whose
 * slack stays at the floor and in one allowed up to 0.12.  The second must
 * make a quarter of the first's calls or fewer in the third pass (before the
 * step grew with the churn, it took one window of 32 Ki allocations per
 * 0.004 and made as many), and keep within the ceiling.
 *
 * Heaps: four threads, each its own stream, heap and mix, three passes at
 * once, with heap_slack_max 0 (heaps stop at reserve_slack_max) and at its
 * default: the same, a quarter of the calls or fewer in the third pass, and
 * memory within the default ceiling over the summed peaks.  In the first
 * pass, at most a quarter of the unmaps (pages taken from other ranges):
 * heaps that started at reserve_slack made about half as many as at 0
 * (10 709 against 19 519) while their slack climbed; started at the
 * ceiling, about a seventeenth (1 111 against 19 368).
 *
 * Also: heap_slack_max outside [0, 1] is refused, and GPUMEM_HEAP_SLACK_MAX
 * reaches the config.  Sim only: the call counts are the sim's, exact and
 * the same on every run (the heaps' to within the threads' timing).  Not
 * under valgrind (a policy test of 3 million operations); under a
 * sanitizer, the one-heap part only.
 */
// ctest-valgrind: skip
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpumem.h"
#include "../test.h"

#include "policy_mix.h"

#define PASSES 3
#define THREADS 4
#define PAGE ((uint64_t)2 << 20)

typedef struct result {
    uint64_t last_calls;    /* backend calls of the last pass */
    uint64_t reserved_peak;
    uint64_t requested;     /* one heap: the pool's allocated peak; heaps: the threads' peaks summed */
    uint64_t first_unmaps;  /* heaps: unmap calls of the first pass (pages taken from other ranges) */
} result_t;

/* A sim device of `gib` GiB: the mix peaks near 2 GB a thread, and a
 * sanitizer build's checks after every operation cost in proportion to
 * the pool's address space, which is a few times the device's. */
static gm_pool_config_t base_config(unsigned gib)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = GM_BACKEND_SIM;
    cfg.sim_capacity = (size_t)gib << 30;
    return cfg;
}

static result_t one_heap(const mix_t *m, double slack_max)
{
    result_t r = {0, 0, 0, 0};
    gm_pool_config_t cfg = base_config(3);
    cfg.reserve_slack_max = slack_max;
    gm_stats_t b = GM_STATS_INIT;
    if (mix_passes(&cfg, m, PASSES, false, true, &r.last_calls, &b)) {
        r.reserved_peak = b.reserved_peak;
        r.requested = b.allocated_peak;
    }
    return r;
}

/* ---- heaps --------------------------------------------------------------- */

static gm_pool_t *hpool;
static mix_t *hmix[THREADS];
static uint64_t hpeak[THREADS];

static void *heap_thread(void *arg)
{
    int t = (int)(intptr_t)arg;
    gm_stream_t s;
    if (gm_stream_create(hpool, &s) != GM_OK) {
        CHECK(0);
        return NULL;
    }
    hpeak[t] = mix_run(hpool, s, hmix[t], false);
    CHECK_OK(gm_stream_destroy(hpool, s));
    return NULL;
}

static result_t heaps(double heap_slack_max)
{
    result_t r = {0, 0, 0, 0};
    gm_pool_config_t cfg = base_config(12);
    cfg.heaps = THREADS;
    cfg.heap_slack_max = heap_slack_max;
    CHECK_OK(gm_pool_create(&cfg, &hpool));
    if (!hpool) return r;
    for (int pass = 0; pass < PASSES; pass++) {
        gm_stats_t a = pool_stats_of(hpool);
        pthread_t th[THREADS];
        for (int t = 0; t < THREADS; t++)
            CHECK(pthread_create(&th[t], NULL, heap_thread, (void *)(intptr_t)t) == 0);
        r.requested = 0;
        for (int t = 0; t < THREADS; t++) {
            pthread_join(th[t], NULL);
            r.requested += hpeak[t];
        }
        CHECK_OK(gm_pool_check(hpool));
        gm_stats_t b = pool_stats_of(hpool);
        r.last_calls = calls_of(&b) - calls_of(&a);
        r.reserved_peak = b.reserved_peak;
        if (pass == 0) r.first_unmaps = b.backend_calls[GM_CALL_unmap] - a.backend_calls[GM_CALL_unmap];
    }
    gm_pool_destroy(hpool);
    hpool = NULL;
    return r;
}

int main(void)
{
    if (test_backend() != GM_BACKEND_SIM) {
        printf("test_controller: sim only, skipped\n");
        return 77;
    }
    /* The knob is checked. */
    gm_pool_config_t cfg = base_config(1);
    gm_pool_t *pool = NULL;
    cfg.heap_slack_max = 1.5;
    CHECK_RC(gm_pool_create(&cfg, &pool), GM_INVALID_ARGUMENT);
    CHECK(strstr(gm_last_error(), "heap_slack_max") != NULL);
    cfg.heap_slack_max = -0.5;
    CHECK_RC(gm_pool_create(&cfg, &pool), GM_INVALID_ARGUMENT);
    CHECK(setenv("GPUMEM_HEAP_SLACK_MAX", "0.3", 1) == 0);
    CHECK_OK(gm_config_from_env(&cfg));
    CHECK(cfg.heap_slack_max == 0.3);
    CHECK(setenv("GPUMEM_HEAP_SLACK_MAX", "2", 1) == 0);
    CHECK_RC(gm_config_from_env(&cfg), GM_INVALID_ARGUMENT);
    CHECK(strstr(gm_last_error(), "GPUMEM_HEAP_SLACK_MAX") != NULL);
    CHECK(unsetenv("GPUMEM_HEAP_SLACK_MAX") == 0);
    CHECK_OK(gm_config_from_env(&cfg));
    CHECK(cfg.heap_slack_max == 0.2);

    static mix_t m[THREADS];
    for (int t = 0; t < THREADS; t++) mix_make(&m[t], 1001 + (uint64_t)t);

    /* One heap. */
    gm_pool_config_t d = GM_POOL_CONFIG_INIT;
    result_t floor = one_heap(&m[0], d.reserve_slack); /* no raise */
    result_t knob = one_heap(&m[0], 0.12);
    printf("one heap, third pass: %llu calls at the floor, %llu with reserve_slack_max 0.12; "
           "reserved peak %.3f / %.3f of the allocated peak\n",
           (unsigned long long)floor.last_calls, (unsigned long long)knob.last_calls,
           (double)floor.reserved_peak / (double)floor.requested,
           (double)knob.reserved_peak / (double)knob.requested);
    CHECK(floor.last_calls > 1000); /* the mix churns at the floor, else nothing to compare */
    CHECK(knob.last_calls * 4 <= floor.last_calls);
    CHECK(knob.reserved_peak <= (uint64_t)((double)knob.requested * 1.12) + 3 * PAGE);

    /* Heaps.  Under a sanitizer the library checks the whole pool after
     * every operation (GM_DEBUG=3): the one-heap part only. */
    if (UNDER_SANITIZER) return test_summary();
    for (int t = 0; t < THREADS; t++) hmix[t] = &m[t];
    result_t low = heaps(0.0); /* heaps stop at reserve_slack_max */
    result_t dflt = heaps(d.heap_slack_max);
    printf("%d heaps, third pass: %llu calls with heap_slack_max 0, %llu at its default %g; "
           "reserved peak %.3f / %.3f of the threads' requested peaks summed; first pass: "
           "%llu / %llu unmaps\n", THREADS,
           (unsigned long long)low.last_calls, (unsigned long long)dflt.last_calls,
           d.heap_slack_max, (double)low.reserved_peak / (double)low.requested,
           (double)dflt.reserved_peak / (double)dflt.requested,
           (unsigned long long)low.first_unmaps, (unsigned long long)dflt.first_unmaps);
    CHECK(low.last_calls > 1000);
    CHECK(dflt.last_calls * 4 <= low.last_calls);
    CHECK(dflt.first_unmaps * 4 <= low.first_unmaps);
    CHECK(dflt.reserved_peak <=
          (uint64_t)((double)dflt.requested * (1.0 + d.heap_slack_max)) + 3 * THREADS * PAGE);
    return test_summary();
}
