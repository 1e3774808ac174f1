/* SPDX-License-Identifier: Apache-2.0 */
/*
 * oom.c — out-of-memory handlers and the out-of-memory report.
 *
 * The one idea: when an allocation finally fails, the message must answer
 * "why did this OOM?" on its own: what was asked, what the device and the
 * pool hold, how much of that is cached or fragmented, what the limit is,
 * and which live allocations are the largest (with their call sites when
 * leak tracking records stacks).  It is built on the stack, in fixed
 * buffers, with the pool lock held: reporting never allocates.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "broker/broker.h"
#include "observe/observe.h"

/* ---- handlers ------------------------------------------------------------------ */

int gm_set_oom_handler(gm_pool_t *pool, gm_oom_handler_t fn, void *user)
{
    if (!fn) return gm__set_error(GM_INVALID_ARGUMENT, "gm_set_oom_handler: fn is NULL");
    GM_CHECK(gm__pool_resolve(&pool, "gm_set_oom_handler"));
    int rc = GM_OK;
    gm__lock(&pool->lock);
    for (unsigned i = 0; i < pool->n_oom_handlers; i++)
        if (pool->oom_handlers[i].fn == fn && pool->oom_handlers[i].user == user)
            rc = gm__set_error(GM_INVALID_ARGUMENT,
                               "gm_set_oom_handler: this handler and user pointer are already set");
    if (rc == GM_OK && pool->n_oom_handlers == GM_OOM_MAX_HANDLERS)
        rc = gm__set_error(GM_LIMIT, "gm_set_oom_handler: a pool has at most %d handlers",
                           GM_OOM_MAX_HANDLERS);
    if (rc == GM_OK) {
        pool->oom_handlers[pool->n_oom_handlers].fn = fn;
        pool->oom_handlers[pool->n_oom_handlers].user = user;
        pool->n_oom_handlers++;
    }
    gm__unlock(&pool->lock);
    return rc;
}

int gm_remove_oom_handler(gm_pool_t *pool, gm_oom_handler_t fn, void *user)
{
    GM_CHECK(gm__pool_resolve(&pool, "gm_remove_oom_handler"));
    int rc = gm__set_error(GM_INVALID_ARGUMENT, "gm_remove_oom_handler: no such handler");
    gm__lock(&pool->lock);
    for (unsigned i = 0; i < pool->n_oom_handlers; i++) {
        if (pool->oom_handlers[i].fn == fn && pool->oom_handlers[i].user == user) {
            memmove(&pool->oom_handlers[i], &pool->oom_handlers[i + 1],
                    (pool->n_oom_handlers - i - 1) * sizeof pool->oom_handlers[0]);
            pool->n_oom_handlers--;
            rc = GM_OK;
            break;
        }
    }
    gm__unlock(&pool->lock);
    if (rc == GM_OK) gm__clear_error();
    return rc;
}

/* ---- the report ------------------------------------------------------------------ */

typedef struct out {
    char *buf;
    size_t cap, at;
} out_t;

GM_PRINTF(2, 3) static void put(out_t *o, const char *fmt, ...)
{
    if (o->at >= o->cap) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->buf + o->at, o->cap - o->at, fmt, ap);
    va_end(ap);
    if (n > 0) o->at += (size_t)n < o->cap - o->at ? (size_t)n : o->cap - o->at - 1;
}

#define TOP_N 5

int gm__oom_report_locked(gm_pool_t *pool, size_t size, gm_stream_t stream, int rc,
                          const char *reason)
{
    /* GM_LIMIT only for a limit the user set; the device's size is OOM. */
    /* A provider's quota (a broker tenant's) is a limit set too. */
    bool broker = gm__broker_provider_is(&pool->provider);
    bool quota = pool->provider.ops->flags & GM__PROVIDER_QUOTA;
    int status = rc == GM_LIMIT && (pool->cfg.limit || quota) ? GM_LIMIT : GM_OUT_OF_MEMORY;
    if (reason && !strncmp(reason, "gm_alloc: ", 10)) reason += 10;
    pool->st.oom_count++;
    gm__trace_record_locked(pool, GM__TRACE_ALLOC_FAIL, 0, size, stream);

    gm_stats_t st;
    gm__stats_snapshot_locked(pool, &st);
    gm__backend_info_t bi;
    bool have_info = pool->ops->info(pool->bk, &bi) == GM_OK;

    /* The largest live blocks: one pass over the live table. */
    gm__block_t *top[TOP_N] = {0};
    for (size_t i = 0; i < pool->live.cap; i++) {
        if (!pool->live.keys[i]) continue;
        gm__block_t *b = pool->live.vals[i];
        for (int k = 0; k < TOP_N; k++) {
            if (!top[k] || b->requested > top[k]->requested) {
                memmove(&top[k + 1], &top[k], (size_t)(TOP_N - 1 - k) * sizeof top[0]);
                top[k] = b;
                break;
            }
        }
    }

    char msg[2000];
    out_t o = {msg, sizeof msg, 0};
    char b1[32], b2[32], b3[32], b4[32], b5[32];
    put(&o, "gm_alloc: out of memory: cannot allocate %s (%zu bytes) on stream %p (%s)\n",
        gm__fmt_bytes(size, b1, sizeof b1), size, stream, reason ? reason : "");
    if (broker) /* the pages are the broker's: this process's view of the device says nothing */
        put(&o, "  device memory leased from the broker on %s (its device's total and free are in "
            "`gpumem top --broker`)\n", pool->cfg.broker);
    else if (have_info)
        put(&o, "  device %d (%s, %s): total %s, free %s\n", pool->cfg.device, pool->ops->name,
            bi.name, gm__fmt_bytes(bi.total_memory, b1, sizeof b1),
            gm__fmt_bytes(bi.free_memory, b2, sizeof b2));
    put(&o, "  pool: allocated %s (requested), active %s, reserved %s, cached %s\n",
        gm__fmt_bytes(st.allocated, b1, sizeof b1), gm__fmt_bytes(st.active, b2, sizeof b2),
        gm__fmt_bytes(st.reserved, b3, sizeof b3), gm__fmt_bytes(st.cached, b4, sizeof b4));
    put(&o, "  largest free block %s, fragmentation %.1f%%, inactive split %s\n",
        gm__fmt_bytes(st.largest_free_block, b1, sizeof b1), (double)st.fragmentation_ppm / 1e4,
        gm__fmt_bytes(st.inactive_split, b5, sizeof b5));
    if (pool->cfg.limit)
        put(&o, "  limit %s (pool limit)\n", gm__fmt_bytes(pool->limit, b1, sizeof b1));
    else if (broker)
        put(&o, "  limit none of the pool's own (the tenant's quota below applies)\n");
    else
        put(&o, "  limit none (device memory, %s)\n", gm__fmt_bytes(pool->limit, b1, sizeof b1));
    if (broker) {
        gm__broker_client_stats_t bs;
        gm__broker_provider_stats(&pool->provider, &bs);
        char b2[32], b3[32], b4[32];
        put(&o, "  broker %s: tenant '%s', quota %s, the tenant holds %s, this process %s "
            "(%llu leased pages kept aside)\n", pool->cfg.broker, bs.tenant,
            bs.quota == UINT64_MAX ? "none" : gm__fmt_bytes(bs.quota, b2, sizeof b2),
            gm__fmt_bytes(bs.tenant_used, b3, sizeof b3),
            gm__fmt_bytes((bs.held_pages + bs.stock_pages) * pool->page, b4, sizeof b4),
            (unsigned long long)bs.stock_pages);
    }
    put(&o, "  reserve slack %.4f in force (from %.4f, up to %.4f; GPUMEM_RESERVE_SLACK[_MAX])\n",
        pool->slack_eff, pool->cfg.reserve_slack, pool->cfg.reserve_slack_max);
    put(&o, "  live allocations %llu; the largest:\n", (unsigned long long)st.live_blocks);
    for (int k = 0; k < TOP_N && top[k]; k++) {
        char site[256] = "";
        int n = 0;
        void *const *fr = gm__leak_stack_locked(pool, top[k]->addr, &n);
        if (fr) gm__leak_site(fr, n, site, sizeof site);
        put(&o, "    %s at %#lx%s%s\n", gm__fmt_bytes(top[k]->requested, b1, sizeof b1),
            (unsigned long)top[k]->addr, site[0] ? " from " : "", site);
    }
    if (top[0] && !pool->leaks)
        put(&o, "    (call sites: run with GPUMEM_LEAK_CHECK=1)\n");
    put(&o, "  OOM handlers %u; ooms so far %llu", pool->n_oom_handlers,
        (unsigned long long)pool->st.oom_count);
    return gm__set_error(status, "%s", msg);
}
