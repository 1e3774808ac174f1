/* SPDX-License-Identifier: Apache-2.0 */
/*
 * internal.h — private declarations shared by the library's files, grouped
 * under the file that defines them.  Nothing here is part of the ABI; only
 * gm_* symbols are exported (see gpumem.map).
 */
#ifndef GM_INTERNAL_H
#define GM_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpumem.h"

#if defined(__GNUC__)
#define GM_LIKELY(x) __builtin_expect(!!(x), 1)
#define GM_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define GM_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define GM_HIDDEN __attribute__((visibility("hidden")))
#else
#define GM_LIKELY(x) (x)
#define GM_UNLIKELY(x) (x)
#define GM_PRINTF(a, b)
#define GM_HIDDEN
#endif

/* ---- checks ----------------------------------------------------------- */

/* Propagate a non-zero status. */
#define GM_CHECK(expr)                                                         \
    do {                                                                       \
        int gm__rc_ = (expr);                                                  \
        if (GM_UNLIKELY(gm__rc_ != GM_OK)) return gm__rc_;                     \
    } while (0)
/* Store a non-zero status in rc and jump to the cleanup label. */
#define GM_CHECK_GOTO(expr, rc, label)                                         \
    do {                                                                       \
        (rc) = (expr);                                                         \
        if (GM_UNLIKELY((rc) != GM_OK)) goto label;                            \
    } while (0)

/* Assert levels.  gm_assert: cheap, on in debug builds (GM_DEBUG >= 1).
 * gm_assert_internal: GM_DEBUG >= 2.  gm_assert_expensive (whole-structure
 * validators after each mutation): GM_DEBUG >= 3. */
#ifndef GM_DEBUG
#define GM_DEBUG 0
#endif
void gm__assert_fail(const char *expr, const char *file, int line);
#define GM__ASSERT(x) ((x) ? (void)0 : gm__assert_fail(#x, __FILE__, __LINE__))
#if GM_DEBUG >= 1
#define gm_assert(x) GM__ASSERT(x)
#else
#define gm_assert(x) ((void)0)
#endif
#if GM_DEBUG >= 2
#define gm_assert_internal(x) GM__ASSERT(x)
#else
#define gm_assert_internal(x) ((void)0)
#endif
#if GM_DEBUG >= 3
#define gm_assert_expensive(x) GM__ASSERT(x)
#else
#define gm_assert_expensive(x) ((void)0)
#endif

/* Kept in release builds (SQLite's ALWAYS/NEVER): in debug builds a failure
 * asserts; in release the condition is returned so the caller can recover. */
#if GM_DEBUG >= 1
#define GM_ALWAYS(x) (GM__ASSERT(x), 1)
#define GM_NEVER(x) (GM__ASSERT(!(x)), 0)
#else
#define GM_ALWAYS(x) (!!(x))
#define GM_NEVER(x) (!!(x))
#endif

/* ---- defined in src/base/error.c ------------------------------------------- */

/* Set this thread's last-error message and return status.  Never allocates. */
int gm__set_error(int status, const char *fmt, ...) GM_PRINTF(2, 3);
int gm__set_errorv(int status, const char *fmt, va_list ap);
void gm__clear_error(void);

/* ---- defined in src/base/util.c -------------------------------------------- */

uint64_t gm__now_ns(void);                         /* CLOCK_MONOTONIC */
/* Nanoseconds per gm__ticks() unit, measured once (about a millisecond, the
 * first time it is asked for). */
double gm__ns_per_tick(void);

/* A cheap time stamp for timing backend calls: the time-stamp counter where
 * the CPU has an invariant one (x86-64: ~7 ns against ~30 ns for
 * clock_gettime in a VM), else the monotonic clock in ns.  Only differences
 * mean anything; gm__ns_per_tick() converts them. */
#if defined(__x86_64__)
static inline uint64_t gm__ticks(void) { return __builtin_ia32_rdtsc(); }
#define GM_TICKS_ARE_NS 0
#else
static inline uint64_t gm__ticks(void) { return gm__now_ns(); }
#define GM_TICKS_ARE_NS 1
#endif
/* The library's host allocations, all of them: the C library's functions,
 * except that the armed one fails (returns NULL, changing nothing).  Every
 * caller turns NULL into GM_NO_HOST_MEMORY (or its own clean failure) and
 * leaks nothing. */
void *gm__malloc(size_t size);
void *gm__calloc(size_t n, size_t size);
void *gm__realloc(void *p, size_t size);
char *gm__strdup(const char *s);
void gm__free(void *p);
/* Make the n-th next host allocation of the library fail (1 = the very next,
 * counted over all threads); 0 disarms.  Only that one fails. */
void gm__malloc_fail_nth(unsigned long n);
/* How many allocations gm__malloc_fail_nth has made fail so far. */
unsigned long gm__malloc_failures(void);
/* Blocks from the functions above not freed yet (a leak check for tests). */
long gm__malloc_live(void);

/* Parse "123", "4k", "2MiB", "1.5G", "80GiB" (binary multiples) into bytes. */
int gm__parse_size(const char *s, size_t *out);
/* Format bytes as "12.66 GiB" style (IEC binary units) into buf; returns buf. */
const char *gm__fmt_bytes(uint64_t bytes, char *buf, size_t cap);

#define GM_ALIGN_UP(x, a) (((x) + ((a) - 1)) & ~((uintptr_t)(a) - 1))
#define GM_ALIGN_DOWN(x, a) ((x) & ~((uintptr_t)(a) - 1))

#endif /* GM_INTERNAL_H */
