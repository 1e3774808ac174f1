/* SPDX-License-Identifier: Apache-2.0 */
/*
 * offload_cold_probe.c — does a cold offload (host pool empty) go faster
 * when the tag's device pages lie on extents (several pages per physical
 * allocation, as gm_restore maps them) than on one allocation per page (as
 * a fresh gm_alloc maps them)?  A cold offload makes its pinned memory
 * while it gives device pages back, and the driver runs the two one after
 * the other (bench/results/...-vmm-handles.md).
 *
 * Each round, in a fresh pool: allocate the tag in 256 MiB blocks and fill
 * it; "fresh": time the first (cold) offload; restore; give the pinned
 * memory back (gm_host_trim); "extents": time the second cold offload.
 * Prints one JSON line per round.
 *
 * usage: offload_cold_probe MIB ROUNDS     (GPUMEM_BACKEND as usual)
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "gpumem.h"

#define BLOCK ((size_t)256 << 20)

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define CK(call)                                                                              \
    do {                                                                                      \
        int rc_ = (call);                                                                     \
        if (rc_ != GM_OK) {                                                                   \
            fprintf(stderr, "%s: %s (%s)\n", #call, gm_errname(rc_), gm_last_error());       \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

static uint64_t calls(gm_pool_t *p, gm_call_t k)
{
    gm_stats_t st = GM_STATS_INIT;
    CK(gm_pool_stats(p, &st));
    return st.backend_calls[k];
}

/* Time one offload of tag; the pinned pool must be empty. */
static double timed_offload(gm_pool_t *p, gm_tag_t tag, gm_stream_t s, uint64_t *released)
{
    gm_stats_t st = GM_STATS_INIT;
    CK(gm_pool_stats(p, &st));
    if (st.host_reserved) {
        fprintf(stderr, "not cold: %" PRIu64 " bytes pinned\n", st.host_reserved);
        exit(1);
    }
    uint64_t r0 = calls(p, GM_CALL_phys_release);
    double t0 = now();
    CK(gm_offload(p, tag, 0, s));
    double t = now() - t0;
    *released = calls(p, GM_CALL_phys_release) - r0;
    return t;
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? strtoull(argv[1], NULL, 10) : 1024;
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    size_t bytes = mib << 20, n = (bytes + BLOCK - 1) / BLOCK;
    void **ptr = calloc(n, sizeof *ptr);
    gm_tag_t tag;
    CK(gm_tag_get("cold-probe", 0, &tag));
    for (int r = 0; r < rounds; r++) {
        gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
        CK(gm_config_from_env(&cfg));
        gm_pool_t *p;
        gm_stream_t s;
        CK(gm_pool_create(&cfg, &p));
        CK(gm_stream_create(p, &s));
        for (size_t i = 0; i < n; i++) {
            size_t sz = i + 1 < n ? BLOCK : bytes - i * BLOCK;
            CK(gm_alloc_tagged(p, sz, s, tag, &ptr[i]));
            CK(gm_memset(p, ptr[i], (int)(i & 0xff), sz, s));
        }
        CK(gm_stream_synchronize(p, s));
        uint64_t rel_fresh, rel_ext;
        double fresh = timed_offload(p, tag, s, &rel_fresh);
        CK(gm_restore(p, tag, s));
        CK(gm_host_trim(p, 0, NULL));
        double ext = timed_offload(p, tag, s, &rel_ext);
        CK(gm_restore(p, tag, s));
        printf("{\"MiB\":%zu,\"round\":%d,\"fresh_GBps\":%.2f,\"fresh_releases\":%" PRIu64
               ",\"extents_GBps\":%.2f,\"extents_releases\":%" PRIu64 "}\n",
               mib, r, (double)bytes / fresh / 1e9, rel_fresh, (double)bytes / ext / 1e9, rel_ext);
        fflush(stdout);
        for (size_t i = 0; i < n; i++) CK(gm_free(p, ptr[i], s));
        CK(gm_stream_synchronize(p, s));
        CK(gm_stream_destroy(p, s));
        CK(gm_host_trim(p, 0, NULL));
        CK(gm_trim(p, 0, NULL));
        gm_pool_destroy(p);
    }
    free(ptr);
    return 0;
}
