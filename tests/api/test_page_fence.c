/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_page_fence.c — pages are released at the free, fenced by the freeing
 * stream: while that stream's work may still run (a held sim stream), its
 * freed physical pages serve no other stream; once it has passed, they do.
 * Also the pool options of the memory/churn trade-off are checked.
 * Sim only (holding a stream is the sim's).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "gpumem.h"
#include "../test.h"

#define MIB ((size_t)1 << 20)

/* A page whose physical page another range took must be remapped before
 * its range is used again; while the work of the freeing stream may still
 * use that mapping (held), it is not unmapped (the sim fails an unmap under
 * work in flight): the allocation is served elsewhere or refused cleanly,
 * and once the stream has passed, the remap happens. */
static void remap_waits_for_the_stream(void)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = GM_BACKEND_SIM;
    cfg.sim_capacity = (size_t)1 << 30;
    cfg.reserve_slack = cfg.reserve_slack_max = 0.0;
    cfg.limit = 8 * MIB;
    gm_pool_t *pool = NULL;
    CHECK_OK(gm_pool_create(&cfg, &pool));
    if (!pool) return;
    gm_stream_t s;
    CHECK_OK(gm_stream_create(pool, &s));
    void *a = NULL, *g = NULL, *c = NULL, *d = NULL;
    CHECK_OK(gm_alloc(pool, 4 * MIB, s, &a));
    CHECK_OK(gm_alloc(pool, 2 * MIB, s, &g)); /* keeps a's range apart */
    CHECK_OK(gm_sim_hold_stream(pool, s, 1));
    CHECK_OK(gm_memset(pool, a, 0x11, 4 * MIB, s)); /* in flight over a */
    CHECK_OK(gm_free(pool, a, s));
    /* c does not fit in a's range: fresh addresses, a's pages (same stream:
     * no wait needed) plus one new page, at the limit. */
    CHECK_OK(gm_alloc(pool, 6 * MIB, s, &c));
    gm_stats_t st0 = pool_stats_of(pool);
    CHECK(st0.reserved == 8 * MIB);
    /* d fits a's range, whose pages now map c's: remapping them would pull
     * them from under the held work.  Refused (the limit holds) or served
     * elsewhere, never with an unmap under the work. */
    int rc = gm_alloc(pool, 4 * MIB, s, &d);
    CHECK(rc == GM_OK || rc == GM_LIMIT || rc == GM_OUT_OF_MEMORY);
    CHECK(strstr(gm_last_error(), "stream-rule violation") == NULL);
    CHECK_OK(gm_pool_check(pool));
    if (rc == GM_OK) CHECK_OK(gm_free(pool, d, s));
    d = NULL;
    /* Passed: the same request is served again from a's range. */
    CHECK_OK(gm_sim_hold_stream(pool, s, 0));
    CHECK_OK(gm_free(pool, c, s));
    CHECK_OK(gm_alloc(pool, 4 * MIB, s, &d));
    CHECK_OK(gm_pool_check(pool));
    CHECK_OK(gm_free(pool, d, s));
    CHECK_OK(gm_free(pool, g, s));
    CHECK_OK(gm_stream_destroy(pool, s));
    gm_pool_destroy(pool);
}

int main(void)
{
    if (test_backend() != GM_BACKEND_SIM) {
        printf("test_page_fence: sim only, skipped\n");
        return 77;
    }
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = GM_BACKEND_SIM;
    cfg.sim_capacity = (size_t)1 << 30;
    /* Out-of-range knobs are refused with a clear error. */
    cfg.reserve_slack = -0.1;
    gm_pool_t *pool = NULL;
    CHECK_RC(gm_pool_create(&cfg, &pool), GM_INVALID_ARGUMENT);
    CHECK(strstr(gm_last_error(), "reserve_slack") != NULL);
    cfg.reserve_slack = 0.0;
    cfg.reserve_slack_max = 2.0;
    CHECK_RC(gm_pool_create(&cfg, &pool), GM_INVALID_ARGUMENT);
    /* No slack: growth stops at the live peak plus two pages. */
    cfg.reserve_slack_max = 0.0;
    CHECK_OK(gm_pool_create(&cfg, &pool));
    if (!pool) return test_summary();

    gm_stream_t s, t;
    CHECK_OK(gm_stream_create(pool, &s));
    CHECK_OK(gm_stream_create(pool, &t));

    /* Work on s is in flight over a and its pages: free a on s. */
    void *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    CHECK_OK(gm_sim_hold_stream(pool, s, 1));
    CHECK_OK(gm_alloc(pool, 8 * MIB, s, &a));
    CHECK_OK(gm_memset(pool, a, 0x5a, 8 * MIB, s));
    CHECK_OK(gm_free(pool, a, s));
    gm_stats_t st0 = pool_stats_of(pool);
    CHECK(st0.reserved == 8 * MIB);

    /* t may not take a's pages while s is held: it gets new ones. */
    CHECK_OK(gm_alloc(pool, 8 * MIB, t, &b));
    gm_stats_t st1 = pool_stats_of(pool);
    CHECK(st1.pages_stolen == st0.pages_stolen);
    CHECK(st1.reserved == 16 * MIB);
    /* The fence was asked (an event on s), not ignored. */
    CHECK(st1.backend_calls[GM_CALL_event_record] > st0.backend_calls[GM_CALL_event_record]);
    CHECK_OK(gm_pool_check(pool));

    /* s itself may reuse its own freed pages at once (its queue orders it). */
    CHECK_OK(gm_alloc(pool, 8 * MIB, s, &c));
    gm_stats_t st2 = pool_stats_of(pool);
    CHECK(st2.reserved == 16 * MIB);
    CHECK_OK(gm_free(pool, c, s));

    /* Once s has passed, its free pages (or its freed range, moved to
     * every stream) serve t: no growth. */
    CHECK_OK(gm_sim_hold_stream(pool, s, 0));
    CHECK_OK(gm_alloc(pool, 8 * MIB, t, &d));
    gm_stats_t st3 = pool_stats_of(pool);
    CHECK(st3.reserved == 16 * MIB);
    CHECK(st3.backend_calls[GM_CALL_phys_create] == st2.backend_calls[GM_CALL_phys_create]);
    CHECK_OK(gm_pool_check(pool));

    CHECK_OK(gm_free(pool, b, t));
    CHECK_OK(gm_free(pool, d, t));
    CHECK_OK(gm_pool_check(pool));
    CHECK_OK(gm_stream_destroy(pool, s));
    CHECK_OK(gm_stream_destroy(pool, t));
    gm_pool_destroy(pool);
    remap_waits_for_the_stream();
    return test_summary();
}
