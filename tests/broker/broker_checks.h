/* SPDX-License-Identifier: Apache-2.0 */
/*
 * broker_checks.h — small steps the broker tests share on top of
 * broker_util.h that need no harness of children: a broker started for
 * this user's tenant, and the check of a status a child reported (its
 * gm_last_error stayed in the child, so the check names both statuses).
 *
 * Include test.h and broker_util.h first.
 */
#ifndef GM_TEST_BROKER_CHECKS_H
#define GM_TEST_BROKER_CHECKS_H

/* A fresh broker b of capacity with the extra config lines (tb_config),
 * started; this user's tenant name ("uid:N") written to tenant. */
static inline void bc_start_mine(test_broker_t *b, const char *capacity, const char *extra,
                                 char *tenant, size_t cap)
{
    tb_init(b);
    snprintf(tenant, cap, "uid:%u", (unsigned)geteuid());
    tb_config(b, capacity, extra);
    tb_start(b);
}

/* A child's status rc is want (gm_last_error here says nothing of it). */
#define CHECK_KID_RC(rc, want)                                                 \
    do {                                                                       \
        int krc_ = (rc);                                                       \
        if (krc_ != (want))                                                    \
            fprintf(stderr, "%s:%d: the child's allocation: %s, want %s\n",    \
                    __FILE__, __LINE__, gm_strerror(krc_), gm_strerror(want)); \
        CHECK(krc_ == (want));                                                 \
    } while (0)

#endif /* GM_TEST_BROKER_CHECKS_H */
