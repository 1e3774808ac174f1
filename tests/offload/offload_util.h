/* SPDX-License-Identifier: Apache-2.0 */
/*
 * offload_util.h — what the offload tests share: seeded byte patterns that
 * are written to device blocks and checked back through the public copy
 * calls only (never a host access to device memory), a table of test blocks
 * with their expected contents, tag figures, and the scale-down rule for
 * the slow builds (ASan with whole-structure validators, TSan).
 */
#ifndef GM_TEST_OFFLOAD_UTIL_H
#define GM_TEST_OFFLOAD_UTIL_H

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpumem.h"
#include "test.h"

#define MiB ((size_t)1 << 20)
#define KiB ((size_t)1 << 10)

/* How much slower this build is than the normal one, roughly: iteration
 * counts are divided by it.  GM_OFFLOAD_SLOW=N overrides. */
static inline int slow_factor(void)
{
    const char *e = getenv("GM_OFFLOAD_SLOW");
    if (e && atoi(e) >= 1) return atoi(e);
    int f = 1;
    if (UNDER_SANITIZER) f = 5;
#if defined(__SANITIZE_THREAD__)
    f = 10;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
    f = 10;
#endif
#endif
    if (getenv("GM_UNDER_VALGRIND")) f *= 10;
    return f;
}

static inline int scaled(int n, int min)
{
    int v = n / slow_factor();
    return v < min ? min : v;
}

static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The pattern of `seed`: byte j is byte (j % 8) of word j / 8. */
static inline void pattern(void *buf, size_t n, uint64_t seed)
{
    unsigned char *b = buf;
    uint64_t k0 = mix64(seed * 0x9E3779B97F4A7C15ull + 1);
    size_t words = n / 8;
    for (size_t w = 0; w < words; w++) {
        uint64_t v = k0 ^ (w * 0xD1B54A32D192ED03ull);
        v ^= v >> 29;
        memcpy(b + w * 8, &v, 8);
    }
    if (n % 8) {
        uint64_t v = k0 ^ (words * 0xD1B54A32D192ED03ull);
        v ^= v >> 29;
        memcpy(b + words * 8, &v, n % 8);
    }
}

/* Scratch buffers for fills and checks (one per thread). */
static _Thread_local unsigned char *scratch_a, *scratch_b;
static _Thread_local size_t scratch_cap;

static inline int scratch(size_t n)
{
    if (n <= scratch_cap) return 1;
    free(scratch_a);
    free(scratch_b);
    scratch_a = malloc(n);
    scratch_b = malloc(n);
    scratch_cap = scratch_a && scratch_b ? n : 0;
    return scratch_cap != 0;
}

static inline void scratch_free(void)
{
    free(scratch_a);
    free(scratch_b);
    scratch_a = scratch_b = NULL;
    scratch_cap = 0;
}

/* Write pattern `seed` into device block p of n bytes on `stream`. */
static inline int dev_fill(gm_pool_t *pool, void *p, size_t n, uint64_t seed, gm_stream_t stream)
{
    if (!n) return GM_OK;
    if (!scratch(n)) return GM_NO_HOST_MEMORY;
    pattern(scratch_a, n, seed);
    return gm_memcpy_h2d(pool, p, scratch_a, n, stream);
}

/* Copy device [p, p + n) into host buffer `want`'s twin and compare: 1 when
 * equal; else 0 with the first difference on stderr (labelled `what`). */
static inline int dev_equal(gm_pool_t *pool, const void *p, const unsigned char *want, size_t n,
                            gm_stream_t stream, const char *what)
{
    if (!n) return 1;
    unsigned char *got = malloc(n);
    if (!got) return 0;
    memset(got, 0xa5, n);
    int rc = gm_memcpy_d2h(pool, got, p, n, stream);
    int ok = rc == GM_OK && memcmp(got, want, n) == 0;
    if (!ok) {
        if (rc != GM_OK) {
            fprintf(stderr, "  %s: d2h of %p (%zu bytes) failed: %s (%s)\n", what, p, n,
                    gm_errname(rc), gm_last_error());
        } else {
            size_t i = 0, bad = 0;
            while (i < n && got[i] == want[i]) i++;
            for (size_t j = i; j < n; j++) bad += got[j] != want[j];
            fprintf(stderr, "  %s: block %p (%zu bytes): %zu bytes differ, first at +%zu "
                    "(got %#x want %#x)\n", what, p, n, bad, i, got[i], want[i]);
        }
    }
    free(got);
    return ok;
}

/* Does device block p of n bytes hold pattern `seed` (by_byte 0), or byte
 * `value` everywhere (by_byte 1)? */
static inline int dev_holds(gm_pool_t *pool, const void *p, size_t n, int by_byte, uint64_t seed,
                            int value, gm_stream_t stream, const char *what)
{
    if (!n) return 1;
    if (!scratch(n)) return 0;
    if (by_byte)
        memset(scratch_b, value, n);
    else
        pattern(scratch_b, n, seed);
    return dev_equal(pool, p, scratch_b, n, stream, what);
}

static inline int dev_check(gm_pool_t *pool, const void *p, size_t n, uint64_t seed,
                            gm_stream_t stream, const char *what)
{
    return dev_holds(pool, p, n, 0, seed, 0, stream, what);
}

static inline int dev_check_byte(gm_pool_t *pool, const void *p, size_t n, int value,
                                 gm_stream_t stream, const char *what)
{
    return dev_holds(pool, p, n, 1, 0, value, stream, what);
}

/* One test block: where, how big, which tag, what it holds. */
typedef struct tblock {
    void *p;
    size_t n;
    gm_tag_t tag;
    uint64_t seed;
    gm_stream_t stream; /* allocated on */
} tblock_t;

/* A pool on the test backend of `capacity` bytes (on a GPU: a limit of
 * that size) with two copy threads; NULL, with the reason on stderr. */
static inline gm_pool_t *offload_pool(size_t capacity)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = test_backend();
    cfg.sim_capacity = capacity;
    cfg.limit = cfg.backend == GM_BACKEND_SIM ? 0 : capacity;
    cfg.copy_threads = 2;
    return pool_from(&cfg);
}

static inline gm_tag_info_t tag_info_of(gm_pool_t *pool, gm_tag_t tag)
{
    gm_tag_info_t ti = GM_TAG_INFO_INIT;
    int rc = gm_tag_info(pool, tag, &ti);
    CHECK_OK(rc);
    if (rc != GM_OK) {
        memset(&ti, 0, sizeof ti);
        ti.resident_blocks = ti.offloaded_blocks = UINT64_MAX; /* fails any count check */
    }
    return ti;
}

/* Sum of requested sizes and count of the blocks of `tag` in b[0..n). */
static inline size_t tag_bytes(const tblock_t *b, size_t n, gm_tag_t tag, size_t *count)
{
    size_t sum = 0, c = 0;
    for (size_t i = 0; i < n; i++)
        if (b[i].p && b[i].tag == tag) {
            sum += b[i].n;
            c++;
        }
    if (count) *count = c;
    return sum;
}

/* Does every live block of the table hold its pattern?  Each is read on
 * the stream it was allocated on. */
static inline int check_all(gm_pool_t *pool, const tblock_t *b, size_t n, const char *what)
{
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        if (!b[i].p) continue;
        char label[160];
        snprintf(label, sizeof label, "%s, block %zu (tag %u)", what, i, (unsigned)b[i].tag);
        if (!dev_check(pool, b[i].p, b[i].n, b[i].seed, b[i].stream, label)) ok = 0;
    }
    return ok;
}

#endif /* GM_TEST_OFFLOAD_UTIL_H */
