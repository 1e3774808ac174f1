/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_placement.c — while a pool churns (its controller saw more remapping
 * than the churn target), a large allocation whose best-fit block would
 * remap a page takes, when there is one, a free block that needs no
 * backend call (alloc.c, place_churning).
 *
 * The same random mix of one stream runs in two pools that differ only in
 * the churn target: one the controller can never find churning (no
 * placement change, and the reserve slack fixed in both), one with the
 * default target.  The second must make far fewer backend calls in the
 * warm pass, for about the same memory, and both pools pass gm_pool_check
 * after every pass.  Sim only: the call counts are the sim's, exact and
 * the same on every run.  Not under valgrind (a policy test of 4.8 million
 * operations); under a sanitizer, or with the whole-pool validators
 * (GM_DEBUG >= 3), on one shorter mix (see below).
 */
// ctest-valgrind: skip
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpumem.h"
#include "../test.h"

/* Under a sanitizer (the ASan phase also builds with GM_DEBUG=3) or with
 * the validators, the library checks the whole pool after every operation,
 * and that is nearly all the time this test takes: one mix only, and the
 * first third of it (33 000 operations a pass, against 100 000).  The
 * checks are the same: the controller finds this mix churning by the third
 * pass (a shorter one, or two passes, it does not: the calls then come out
 * equal), and the call counts are exact, so the numbers are the sim's on
 * every run and in every build: 3 523 calls with best fit always, 1 118
 * with placement while churning. */
#if UNDER_SANITIZER || GM_DEBUG >= 3
#define OPS 33000
#define SHORT_MIX 1
#endif

#include "policy_mix.h"

#define PASSES 3
#ifdef SHORT_MIX
static const uint64_t seeds[] = {5};
#else
static const uint64_t seeds[] = {1, 2, 3, 4, 5, 6, 7, 8};
#endif

typedef struct result {
    uint64_t warm_calls; /* backend calls of the last pass */
    uint64_t reserved_peak;
} result_t;

static result_t run_pool(const mix_t *m, double churn_target)
{
    result_t r = {0, 0};
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = GM_BACKEND_SIM;
    cfg.sim_capacity = (size_t)8 << 30;
    cfg.reserve_slack_max = cfg.reserve_slack; /* the slack stays put: placement alone differs */
    cfg.churn_target = churn_target;
    gm_stats_t b = GM_STATS_INIT;
    if (mix_passes(&cfg, m, PASSES, true, false, &r.warm_calls, &b)) r.reserved_peak = b.reserved_peak;
    return r;
}

int main(void)
{
    if (test_backend() != GM_BACKEND_SIM) {
        printf("test_placement: sim only, skipped\n");
        return 77;
    }
    static mix_t m;
    uint64_t fixed_sum = 0, placed_sum = 0;
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        uint64_t seed = seeds[i];
        mix_make(&m, seed);
        result_t fixed = run_pool(&m, 1e6); /* never churning: best fit always */
        result_t placed = run_pool(&m, 1.0);
        printf("seed %llu: warm-pass backend calls %llu with best fit always, %llu with "
               "placement while churning; reserved peak %.1f / %.1f MiB\n",
               (unsigned long long)seed, (unsigned long long)fixed.warm_calls,
               (unsigned long long)placed.warm_calls, (double)fixed.reserved_peak / 1048576.0,
               (double)placed.reserved_peak / 1048576.0);
        /* The mix churns at this slack (else there is nothing to compare),
         * the placement never makes it notably worse, and memory stays. */
        CHECK(fixed.warm_calls > 1000);
        CHECK(placed.warm_calls * 20 <= fixed.warm_calls * 21);
        CHECK((double)placed.reserved_peak <= (double)fixed.reserved_peak * 1.02);
        fixed_sum += fixed.warm_calls;
        placed_sum += placed.warm_calls;
    }
    /* Over the mixes (measured: 40 314 and 24 507 calls over all eight;
     * 5 646 and 2 906 for seed 4 alone; the short mix of seed 5: 3 523 and
     * 1 118). */
    printf("these seeds: %llu calls with best fit always, %llu with placement while churning\n",
           (unsigned long long)fixed_sum, (unsigned long long)placed_sum);
    CHECK(placed_sum * 4 < fixed_sum * 3);
    return test_summary();
}
