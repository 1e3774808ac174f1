/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_multigpu_device.c — peer access and registrable segments between two
 * devices, on whichever backend the tests run on (the sim's devices, or two
 * GPUs with GPUMEM_TEST_BACKEND=cuda; skipped with fewer than two).
 *
 * A pool of device 0 with peers {1} and one of device 1 with peers {0}
 * report those peers; a block of device 0 is filled there, copied by device
 * 1 (a copy queued through the device-1 pool reads device 0's pages) and
 * read back byte for byte; device 1 writes into device 0's memory and device
 * 0 reads it; pages mapped after the first ones are granted too (a second,
 * larger block); a registrable segment of device 0 is registered once by the
 * hooks, read by device 1, kept when freed and handed back for a request of
 * nearly its size without another registration, and deregistered by
 * gm_trim.  GM_PEERS_ALL grants every other device; GM_POOL_COMPRESSIBLE is
 * made where the device compresses and refused with GM_NOT_SUPPORTED where
 * it does not; GM_POOL_NCCL pages are exportable as file descriptors.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpumem.h"
#include "../test.h"
#include "multigpu_util.h"

#define MiB ((size_t)1 << 20)

static gm_pool_t *pool_on(int device, uint64_t peers, unsigned flags, int *rc)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = test_backend();
    cfg.sim_capacity = (size_t)2 << 30;
    cfg.device = device;
    cfg.peers = peers;
    cfg.flags = flags;
    gm_pool_t *p = NULL;
    *rc = gm_pool_create(&cfg, &p);
    return p;
}

static gm_device_info_t info_of(gm_pool_t *p)
{
    gm_device_info_t di = GM_DEVICE_INFO_INIT;
    CHECK_OK(gm_pool_device_info(p, &di));
    return di;
}

/* dev_src (allocated from one pool) -> dev_dst through pool `via`, then
 * both read back to the host through `via`: equal to the pattern. */
static int copy_check(gm_pool_t *src_pool, void *src, gm_pool_t *via, void *dst, size_t n,
                      int seed)
{
    unsigned char *pat = malloc(n), *back = malloc(n);
    if (!pat || !back) {
        free(pat);
        free(back);
        return 0;
    }
    for (size_t i = 0; i < n; i++) pat[i] = (unsigned char)(i * 31 + (size_t)seed);
    int ok = gm_memcpy(src_pool, src, pat, n, NULL) == GM_OK &&
             gm_stream_synchronize(src_pool, NULL) == GM_OK &&
             gm_memcpy(via, dst, src, n, NULL) == GM_OK &&
             gm_stream_synchronize(via, NULL) == GM_OK &&
             gm_memcpy(via, back, dst, n, NULL) == GM_OK &&
             gm_stream_synchronize(via, NULL) == GM_OK;
    if (!ok) fprintf(stderr, "copy_check: %s\n", gm_last_error());
    ok = ok && memcmp(pat, back, n) == 0;
    free(pat);
    free(back);
    return ok;
}

static int n_reg, n_dereg;
static int reg(void *user, void *ptr, size_t size, void **handle)
{
    (void)user, (void)size;
    n_reg++;
    *handle = ptr;
    return GM_OK;
}
static void dereg(void *user, void *ptr, size_t size, void *handle)
{
    (void)user, (void)size;
    if (handle == ptr) n_dereg++;
}

int main(void)
{
    int rc;
    gm_pool_t *probe = pool_on(0, 0, 0, &rc);
    if (!probe) {
        printf("test_multigpu_device: no pool (%s), skipped\n", gm_last_error());
        return 77;
    }
    int ndev = info_of(probe).device_count;
    gm_pool_destroy(probe);
    if (ndev < 2) {
        printf("test_multigpu_device: %d device(s), skipped\n", ndev);
        return 77;
    }

    gm_pool_t *p0 = pool_on(0, 1u << 1, GM_POOL_NCCL, &rc);
    REQUIRE(p0 != NULL);
    gm_pool_t *p1 = pool_on(1, 1u << 0, 0, &rc);
    REQUIRE(p1 != NULL);
    gm_device_info_t d0 = info_of(p0), d1 = info_of(p1);
    CHECK(d0.peers == 2 && d1.peers == 1);
    CHECK(d0.device == 0 && d1.device == 1);
    CHECK(d0.handle_types & GM_HANDLE_POSIX_FD);

    /* Device 1 reads device 0's block; device 1 writes into device 0's. */
    void *a0 = NULL, *a1 = NULL, *b0 = NULL;
    CHECK_OK(gm_alloc(p0, 24 * MiB + 4096, NULL, &a0));
    CHECK_OK(gm_alloc(p1, 24 * MiB + 4096, NULL, &a1));
    REQUIRE(a0 && a1);
    CHECK(copy_check(p0, a0, p1, a1, 24 * MiB + 4096, 1));
    CHECK(copy_check(p1, a1, p0, a0, 24 * MiB + 4096, 2)); /* a1 -> a0 through device 0 */
    CHECK(copy_check(p1, a1, p1, a0, 24 * MiB + 4096, 3)); /* device 1 writes device 0's */
    /* Pages mapped later are granted as well. */
    CHECK_OK(gm_alloc(p0, 96 * MiB, NULL, &b0));
    REQUIRE(b0 != NULL);
    CHECK(copy_check(p0, (char *)b0 + 64 * MiB, p1, a1, 16 * MiB, 4));

    /* A registrable segment: registered once, read by the peer, cached. */
    gm_register_hooks_t hooks = {reg, dereg, NULL};
    CHECK_OK(gm_pool_set_register_hooks(p0, &hooks));
    void *s0 = NULL, *s1 = NULL;
    CHECK_OK(gm_alloc_registrable(p0, 8 * MiB, NULL, &s0));
    REQUIRE(s0 != NULL);
    CHECK(n_reg == 1);
    CHECK(copy_check(p0, s0, p1, a1, 8 * MiB, 5));
    CHECK_OK(gm_free(p0, s0, NULL));
    CHECK_OK(gm_alloc_registrable(p0, 8 * MiB - 100, NULL, &s1));
    CHECK(s1 == s0 && n_reg == 1);
    CHECK(copy_check(p0, s1, p1, a1, 8 * MiB - 100, 6));
    CHECK_OK(gm_free(p0, s1, NULL));
    gm_stats_t st = pool_stats_of(p0);
    CHECK(st.registrable_reserved == 8 * MiB && st.registrable_allocated == 0 &&
          st.registrable_count == 2);
    CHECK_OK(gm_trim(p0, 0, NULL));
    CHECK(n_dereg == 1);
    st = pool_stats_of(p0);
    CHECK(st.registrable_reserved == 0);

    CHECK_OK(gm_free(p0, a0, NULL));
    CHECK_OK(gm_free(p0, b0, NULL));
    CHECK_OK(gm_free(p1, a1, NULL));
    check_and_destroy_pools(p0, p1);

    /* Every other device. */
    gm_pool_t *pa = pool_on(1, GM_PEERS_ALL, 0, &rc);
    if (pa) {
        uint64_t want = (ndev >= 64 ? UINT64_MAX : (((uint64_t)1 << ndev) - 1)) & ~(uint64_t)2;
        CHECK(info_of(pa).peers == want);
        gm_pool_destroy(pa);
    } else {
        /* Only where some device cannot reach device 1: said so. */
        CHECK(rc == GM_NOT_SUPPORTED && strstr(gm_last_error(), "cannot access") != NULL);
    }

    /* Compression where the device has it, a clear refusal where not. */
    gm_pool_t *plain = pool_on(0, 0, 0, &rc);
    REQUIRE(plain != NULL);
    int can = info_of(plain).compression_supported;
    gm_pool_t *pc = pool_on(0, 0, GM_POOL_COMPRESSIBLE, &rc);
    if (can) {
        CHECK_OK(rc);
        if (pc) {
            CHECK(info_of(pc).compressible == 1);
            void *c = NULL, *d = NULL;
            CHECK_OK(gm_alloc(pc, 4 * MiB, NULL, &c));
            CHECK_OK(gm_alloc(plain, 4 * MiB, NULL, &d));
            if (c && d) CHECK(copy_check(pc, c, plain, d, 4 * MiB, 7));
            gm_free(pc, c, NULL);
            gm_free(plain, d, NULL);
        }
    } else {
        CHECK(pc == NULL && rc == GM_NOT_SUPPORTED);
    }
    gm_pool_destroy(pc);
    gm_pool_destroy(plain);
    return test_summary();
}
