/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_copy.c — staged copies between pageable host memory and the device:
 * data at many sizes and misalignments, both paths (direct and staged), bad
 * input, a held caller stream, every backend call of the staged path failing
 * in turn (clean error, the next copy works, nothing leaks), and the host
 * side's throughput on the sim printed (a figure, not a check).
 * Needs the sim backend (fault injection, held streams).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpumem.h"
#include "../test.h"
#include "../lib/checks.h"

#define MiB ((size_t)1 << 20)

static gm_pool_t *new_pool(unsigned threads, size_t chunk)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = GM_BACKEND_SIM;
    cfg.sim_capacity = 512 * MiB;
    cfg.copy_threads = threads;
    cfg.copy_chunk = chunk;
    return pool_from(&cfg);
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = (unsigned char)(x >> 24);
    }
}

/* Round trips at sizes around the direct/staged threshold and the piece
 * sizes, from and to unaligned pageable buffers and device offsets. */
static void test_round_trips(void)
{
    gm_pool_t *pool = new_pool(3, 64 << 10);
    if (!pool) { CHECK(0); return; }
    const size_t max = 5 * MiB + 4096;
    unsigned char *src = malloc(max + 64), *dst = malloc(max + 64);
    void *dev;
    CHECK_OK(gm_alloc(pool, max + 64, NULL, &dev));
    if (!src || !dst || !dev) { CHECK(0); free(src); free(dst); gm_pool_destroy(pool); return; }
    const size_t sizes[] = {1, 255, 4096, 256 << 10, (256 << 10) + 1, 300001, MiB, 3 * MiB + 17,
                            max};
    unsigned seed = 1;
    int ok = 1;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        for (size_t off = 0; off < 3; off++) {
            size_t n = sizes[i], so = off * 7, dof = off * 13, ho = off * 3;
            fill(src + so, n, seed++);
            memset(dst, 0, max + 64);
            CHECK_OK(gm_memcpy_h2d(pool, (char *)dev + dof, src + so, n, NULL));
            CHECK_OK(gm_memcpy_d2h(pool, dst + ho, (char *)dev + dof, n, NULL));
            ok &= memcmp(dst + ho, src + so, n) == 0;
            ok &= dst[ho + n] == 0 && (ho == 0 || dst[ho - 1] == 0);
        }
    }
    CHECK(ok);
    gm_stats_t st = pool_stats_of(pool);
    CHECK(st.copy_staged_bytes > 0 && st.copy_direct_bytes > 0);
    printf("staged %llu bytes, direct %llu bytes\n", (unsigned long long)st.copy_staged_bytes,
           (unsigned long long)st.copy_direct_bytes);
    /* 3 workers x 2 staging buffers of 64 KiB, from the host pool. */
    CHECK(st.host_allocated == 6 * (64 << 10));

    /* A pinned host buffer goes straight through, even when large. */
    void *pinned;
    CHECK_OK(gm_host_alloc(pool, 2 * MiB, NULL, &pinned));
    uint64_t staged0 = pool_stats_of(pool).copy_staged_bytes;
    fill(pinned, 2 * MiB, 99);
    CHECK_OK(gm_memcpy_h2d(pool, dev, pinned, 2 * MiB, NULL));
    CHECK_OK(gm_memcpy_d2h(pool, dst, dev, 2 * MiB, NULL));
    CHECK(memcmp(dst, pinned, 2 * MiB) == 0);
    CHECK(pool_stats_of(pool).copy_staged_bytes == staged0 + 2 * MiB); /* the d2h to dst was staged */
    CHECK_OK(gm_host_free(pool, pinned, NULL));

    /* Bad input. */
    CHECK_RC(gm_memcpy_h2d(pool, NULL, src, 10, NULL), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_memcpy_d2h(pool, dst, NULL, 10, NULL), GM_INVALID_ARGUMENT);
    CHECK_OK(gm_memcpy_h2d(pool, NULL, NULL, 0, NULL));
    CHECK_RC(gm_memcpy_h2d(pool, src + 10, src, 100, NULL), GM_INVALID_ARGUMENT);
    CHECK(strstr(gm_last_error(), "overlap") != NULL);
    CHECK_RC(gm_memcpy_h2d(pool, (void *)(uintptr_t)-16, src, 100, NULL), GM_INVALID_ARGUMENT);

    CHECK_OK(gm_free(pool, dev, NULL));
    free(src);
    free(dst);
    gm_pool_destroy(pool);
}

/* A held caller stream: h2d is ordered on it and returns; d2h's small path
 * syncs the stream, which the sim reports as not ready. */
static void test_held_stream(void)
{
    gm_pool_t *pool = new_pool(2, 64 << 10);
    if (!pool) { CHECK(0); return; }
    gm_stream_t S;
    CHECK_OK(gm_stream_create(pool, &S));
    const size_t n = MiB + 5;
    unsigned char *a = malloc(n), *b = malloc(n);
    void *dev;
    CHECK_OK(gm_alloc(pool, n, S, &dev));
    if (!a || !b || !dev) { CHECK(0); free(a); free(b); gm_pool_destroy(pool); return; }
    fill(a, n, 5);
    CHECK_OK(gm_sim_hold_stream(pool, S, 1));
    CHECK_OK(gm_memcpy_h2d(pool, dev, a, n, S));
    CHECK_RC(gm_stream_synchronize(pool, S), GM_NOT_READY);
    CHECK_RC(gm_memcpy_d2h(pool, b, dev, 1000, S), GM_NOT_READY);
    CHECK_OK(gm_sim_hold_stream(pool, S, 0));
    CHECK_OK(gm_memcpy_d2h(pool, b, dev, n, S));
    CHECK(memcmp(a, b, n) == 0);
    CHECK_OK(gm_free(pool, dev, S));
    CHECK_OK(gm_stream_destroy(pool, S));
    free(a);
    free(b);
    gm_pool_destroy(pool);
}

/* Each backend call of the staged path fails once: the copy reports it, the
 * next copy works and is correct. */
static void test_faults(void)
{
    const int kinds[] = {GM_CALL_event_create, GM_CALL_stream_create, GM_CALL_host_register,
                         GM_CALL_event_record, GM_CALL_stream_wait_event, GM_CALL_memcpy,
                         GM_CALL_event_sync};
    const size_t n = 2 * MiB + 3;
    unsigned char *a = malloc(n), *b = malloc(n);
    if (!a || !b) { CHECK(0); free(a); free(b); return; }
    fill(a, n, 11);
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        for (int dir = 0; dir < 2; dir++) {
            gm_pool_t *pool = new_pool(2, 64 << 10);
            if (!pool) { CHECK(0); continue; }
            void *dev;
            CHECK_OK(gm_alloc(pool, n, NULL, &dev));
            if (dir == 1) CHECK_OK(gm_memcpy_h2d(pool, dev, a, n, NULL)); /* starts the workers */
            CHECK_OK(gm_sim_fail_nth(pool, kinds[k], dir == 1 && kinds[k] == GM_CALL_memcpy ? 3 : 1));
            int rc = dir == 0 ? gm_memcpy_h2d(pool, dev, a, n, NULL) : gm_memcpy_d2h(pool, b, dev, n, NULL);
            int setup_only = dir == 1 && (kinds[k] == GM_CALL_event_create ||
                                          kinds[k] == GM_CALL_stream_create ||
                                          kinds[k] == GM_CALL_host_register);
            if (setup_only) {
                /* The workers exist already: those calls are not made again. */
                CHECK_OK(rc);
                CHECK_OK(gm_sim_fail_nth(pool, kinds[k], 0));
            } else {
                if (rc != GM_BACKEND)
                    fprintf(stderr, "%s dir %d: rc %d\n", gm_call_name(kinds[k]), dir, rc);
                CHECK(rc == GM_BACKEND);
                CHECK(strstr(gm_last_error(), "injected failure") != NULL);
            }
            memset(b, 0, n);
            CHECK_OK(gm_memcpy_h2d(pool, dev, a, n, NULL));
            CHECK_OK(gm_memcpy_d2h(pool, b, dev, n, NULL));
            CHECK(memcmp(a, b, n) == 0);
            CHECK_OK(gm_free(pool, dev, NULL));
            gm_pool_destroy(pool);
        }
    }
    free(a);
    free(b);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The host side of the pipeline on this machine: wall-clock GB/s of staged
 * copies through the sim (whose "DMA" is a memmove too). Printed only. */
static void test_print_throughput(void)
{
    gm_pool_t *pool = new_pool(0, 0);
    if (!pool) { CHECK(0); return; }
    const size_t n = 64 * MiB;
    unsigned char *a = malloc(n);
    void *dev;
    CHECK_OK(gm_alloc(pool, n, NULL, &dev));
    if (!a || !dev) { CHECK(0); free(a); gm_pool_destroy(pool); return; }
    memset(a, 3, n);
    CHECK_OK(gm_memcpy_h2d(pool, dev, a, n, NULL)); /* warm-up: workers, staging */
    double t0 = now_s();
    CHECK_OK(gm_memcpy_h2d(pool, dev, a, n, NULL));
    double t1 = now_s();
    CHECK_OK(gm_memcpy_d2h(pool, a, dev, n, NULL));
    double t2 = now_s();
    CHECK_OK(gm_memcpy(pool, dev, a, n, NULL));
    double t3 = now_s();
    printf("sim, 64 MiB: staged h2d %.2f GB/s, staged d2h %.2f GB/s, one plain copy %.2f GB/s "
           "(wall clock, host memory bandwidth of this machine)\n",
           (double)n / (t1 - t0) / 1e9, (double)n / (t2 - t1) / 1e9, (double)n / (t3 - t2) / 1e9);
    CHECK_OK(gm_free(pool, dev, NULL));
    free(a);
    gm_pool_destroy(pool);
}

int main(void)
{
    static void (*const tests[])(void) = {test_round_trips, test_held_stream, test_faults,
                                          test_print_throughput};
    return sim_tests_main("test_copy", tests, sizeof tests / sizeof tests[0]);
}
