/* SPDX-License-Identifier: Apache-2.0 */
/*
 * util.c — small host-side helpers with no state: the monotonic clock, size
 * parsing for configuration ("80GiB") and human-readable byte counts for
 * reports ("12.66 GiB").
 *
 * The one idea: sizes are binary both ways.  People type binary sizes ("2M"
 * is 2 MiB, as in every allocator setting they know), and we print them with
 * the IEC unit spelled out (KiB, MiB, GiB, ...), so a printed figure reads
 * back as the same quantity when pasted into a setting ("8.00 GiB" is
 * exactly what GPUMEM_LIMIT=8GiB means).  Machine-readable outputs (JSON,
 * Prometheus) never go through here: they carry plain byte counts.  Parsing
 * is exact integer arithmetic (no floating point), so "1.5G" is exactly
 * 1610612736 and overflow is always detected.
 *
 * It also owns the library's one door to host memory: every malloc, calloc,
 * realloc, strdup and free in src/ goes through gm__malloc and its family, so
 * that a test can make the n-th host allocation fail (gm__malloc_fail_nth, or
 * GPUMEM_MALLOC_FAIL_NTH read with the other options in pool.c) and check that
 * every caller answers with a clean error and loses nothing.  The countdown is
 * one atomic: no lock, and nothing else here allocates.
 */
#include <ctype.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/internal.h"

uint64_t gm__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static double ns_per_tick = 1.0;
static pthread_once_t calibrate_once = PTHREAD_ONCE_INIT;

static void calibrate(void)
{
    if (GM_TICKS_ARE_NS) return;
    uint64_t t0 = gm__now_ns(), k0 = gm__ticks(), t1, k1;
    do {
        t1 = gm__now_ns();
        k1 = gm__ticks();
    } while (t1 - t0 < 1000000);
    if (k1 > k0) ns_per_tick = (double)(t1 - t0) / (double)(k1 - k0);
}

double gm__ns_per_tick(void)
{
    pthread_once(&calibrate_once, calibrate);
    return ns_per_tick;
}

/* The binary multiple named by unit letter c, or 0 for an unknown letter. */
static uint64_t unit_multiple(char c)
{
    switch (tolower((unsigned char)c)) {
    case 'k': return (uint64_t)1 << 10;
    case 'm': return (uint64_t)1 << 20;
    case 'g': return (uint64_t)1 << 30;
    case 't': return (uint64_t)1 << 40;
    case 'p': return (uint64_t)1 << 50;
    case 'e': return (uint64_t)1 << 60;
    default: return 0;
    }
}

/* Fraction digits beyond this are ignored (they cannot change the result by
 * a whole byte for any multiple up to 2^60). */
#define MAX_FRACTION_DIGITS 18

int gm__parse_size(const char *s, size_t *out)
{
    if (s == NULL || out == NULL)
        return gm__set_error(GM_INVALID_ARGUMENT, "parse size: NULL argument");

    const char *p = s;
    while (isspace((unsigned char)*p)) p++;

    /* Integer part. */
    if (!isdigit((unsigned char)*p)) goto bad;
    uint64_t whole = 0;
    for (; isdigit((unsigned char)*p); p++) {
        if (__builtin_mul_overflow(whole, 10u, &whole) ||
            __builtin_add_overflow(whole, (uint64_t)(*p - '0'), &whole))
            goto overflow;
    }

    /* Optional fraction: digits kept as frac / 10^frac_digits. */
    uint64_t frac = 0, frac_scale = 1;
    int has_fraction = 0;
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p)) goto bad;
        has_fraction = 1;
        for (int n = 0; isdigit((unsigned char)*p); p++, n++) {
            if (n < MAX_FRACTION_DIGITS) {
                frac = frac * 10 + (uint64_t)(*p - '0');
                frac_scale *= 10;
            }
        }
    }

    /* Optional unit: one space at most, then K/M/G/T/P/E with an optional
     * "i" and an optional "B", or a lone "B". Case-insensitive. */
    if (*p == ' ' && p[1] != '\0' && !isspace((unsigned char)p[1])) p++;
    uint64_t mult = 1;
    if (*p != '\0' && !isspace((unsigned char)*p)) {
        if (*p == 'b' || *p == 'B') {
            p++;
        } else {
            mult = unit_multiple(*p);
            if (mult == 0) goto bad;
            p++;
            if (*p == 'i' || *p == 'I') {
                p++;
                if (*p != 'b' && *p != 'B') goto bad; /* "Mi" alone is odd */
            }
            if (*p == 'b' || *p == 'B') p++;
        }
    }
    while (isspace((unsigned char)*p)) p++;
    if (*p != '\0') goto bad;
    if (has_fraction && mult == 1) {
        return gm__set_error(GM_INVALID_ARGUMENT,
                             "invalid size \"%.64s\": a fraction needs a unit (k, M, G, ...)", s);
    }

    /* whole * mult + floor(frac * mult / frac_scale), without overflow:
     * frac < frac_scale <= 10^18 and mult <= 2^60, so split mult's product
     * through 128-bit arithmetic. */
    uint64_t bytes;
    if (__builtin_mul_overflow(whole, mult, &bytes)) goto overflow;
    unsigned __int128 part = (unsigned __int128)frac * mult / frac_scale;
    if (part > UINT64_MAX || __builtin_add_overflow(bytes, (uint64_t)part, &bytes))
        goto overflow;
    if (bytes > SIZE_MAX) goto overflow;
    *out = (size_t)bytes;
    return GM_OK;

bad:
    return gm__set_error(GM_INVALID_ARGUMENT,
                         "invalid size \"%.64s\": expected a number with an optional "
                         "unit, like 4096, 4k, 2MiB, 1.5G or 80GB (binary multiples)", s);
overflow:
    return gm__set_error(GM_INVALID_ARGUMENT, "invalid size \"%.64s\": too large", s);
}

const char *gm__fmt_bytes(uint64_t bytes, char *buf, size_t cap)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (buf == NULL || cap == 0) return buf;
    if (bytes < 1024) {
        snprintf(buf, cap, "%u B", (unsigned)bytes);
        return buf;
    }
    /* Pick the unit whose value, rounded to two decimals, stays below 1024,
     * so 1048575 prints "1.00 MiB" and not "1024.00 KiB". */
    double v = (double)bytes;
    size_t u = 0;
    v /= 1024.0;
    while (u + 1 < sizeof units / sizeof units[0] && v >= 1023.995) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, cap, "%.2f %s", v, units[u]);
    return buf;
}

/* ---- host allocations: the one seam ----------------------------------------- */

static _Atomic unsigned long malloc_countdown; /* 0 = disarmed */
static _Atomic unsigned long malloc_injected;  /* failures injected so far */
static _Atomic long malloc_live;               /* blocks allocated and not freed */

void gm__malloc_fail_nth(unsigned long n)
{
    atomic_store(&malloc_countdown, n);
}

unsigned long gm__malloc_failures(void)
{
    return atomic_load(&malloc_injected);
}

/* Is this allocation the armed one?  Counts it down; true once, at 1 -> 0. */
static bool injected(void)
{
    unsigned long n = atomic_load_explicit(&malloc_countdown, memory_order_relaxed);
    while (n != 0) {
        if (atomic_compare_exchange_weak(&malloc_countdown, &n, n - 1)) {
            if (n != 1) return false;
            atomic_fetch_add(&malloc_injected, 1);
            return true;
        }
    }
    return false;
}

long gm__malloc_live(void)
{
    return atomic_load(&malloc_live);
}

/* p from an allocation that made a new block: count it. */
static void *counted(void *p)
{
    if (p) atomic_fetch_add_explicit(&malloc_live, 1, memory_order_relaxed);
    return p;
}

void *gm__malloc(size_t size)
{
    return injected() ? NULL : counted(malloc(size));
}

void *gm__calloc(size_t n, size_t size)
{
    return injected() ? NULL : counted(calloc(n, size));
}

void *gm__realloc(void *p, size_t size)
{
    if (injected()) return NULL;
    if (p == NULL) return counted(realloc(p, size));
    void *q = realloc(p, size);
    if (q == NULL && size == 0) atomic_fetch_sub_explicit(&malloc_live, 1, memory_order_relaxed);
    return q;
}

char *gm__strdup(const char *s)
{
    return injected() ? NULL : counted(strdup(s));
}

void gm__free(void *p)
{
    if (p) atomic_fetch_sub_explicit(&malloc_live, 1, memory_order_relaxed);
    free(p);
}
