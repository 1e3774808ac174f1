/* SPDX-License-Identifier: Apache-2.0 */
/*
 * offload_bench.c — tags, offload and restore (docs/offload.md) timed on one
 * device: how fast a tag's blocks go to pinned host memory and come back,
 * against the plain DMA rate of pinned memory, and how much device memory an
 * offload really gives back.
 *
 *   pinned_ceiling_GBps  {"d2h", "h2d"}: gm_memcpy between a gm_host_alloc
 *                        buffer (pinned, from the pool's host pool) and a
 *                        device block of the same size (the smaller of 1 GiB
 *                        and the largest --sizes), on a stream, synchronized;
 *                        median of --reps after one untimed copy each way.
 *                        d2h is the direction of an offload, h2d a restore's.
 *   offload_GBps, restore_GBps   per size ({"1GiB": x, "16GiB": y}): a tag of
 *                        that many bytes in blocks of --block bytes (256 MiB;
 *                        the last one smaller when the size is no multiple),
 *                        each filled with gm_memset (a byte of its own) and a
 *                        64-byte marker written at both ends; gm_offload,
 *                        then gm_restore, wall clock (both calls return when
 *                        done); the median of --reps warm cycles (the host
 *                        pool holds the pinned memory of the cycle before).
 *                        The data is checked (markers and sampled runs of
 *                        every block, read back with gm_memcpy_d2h) after the
 *                        first restore and after the last.
 *   offload_cold_GBps    per size: the first offload of a fresh pool (its
 *                        host pool empty: the pinned memory is registered
 *                        during the offload); restore_first_GBps the restore
 *                        right after it.
 *   gpu_freed_fraction   per size: (device free memory after the cold offload
 *                        - before) / tag bytes, the driver's figure
 *                        (gm_device_info_t.free_memory: cuMemGetInfo; the sim's
 *                        capacity - pages made); gpu_freed_fraction_reserved:
 *                        the same with the pool's stats.reserved.
 *   prepare_s, offload_prepared_s, offload_prepared_GBps,
 *   offload_prepared_host_registers   per size: after the warm cycles the host
 *                        pool is emptied (gm_host_trim), gm_offload_prepare
 *                        makes the tag's pinned memory ahead, then the first
 *                        offload runs (its own registrations counted: 0 when
 *                        the preparation made all it needs), then a restore
 *                        and a data check.
 *   offload_mixed_GBps, restore_mixed_GBps   the same warm cycles for a tag of
 *                        --mixed bytes (default: the smallest size) in blocks
 *                        of mixed sizes (64 KiB .. 64 MiB, log-uniform, odd
 *                        sizes, so blocks share pages).
 *
 * Each size runs in a pool of its own (gm_config_from_env, so GPUMEM_BACKEND
 * picks the backend; sim: every copy is a host memmove, a smoke test of this
 * program with small sizes), destroyed after it so the next one starts cold.
 * GB/s are 1e9 bytes of the tag (bytes requested) per second.
 *
 * usage: offload_bench [--sizes 1GiB,16GiB] [--block 256MiB] [--reps 5]
 *                      [--mixed SIZE|0] [--json FILE] [--md FILE]
 *                      [--command TEXT] [--deadline S]
 *   Sizes take a suffix K, M, G, T (binary: KiB, MiB, GiB; "B"/"iB" optional).
 *   Without --json the JSON goes to stdout after the table.  --deadline S: a
 *   size whose runs might not end within S seconds of the start is skipped
 *   (a failure) so the results are written in time.
 *   bench/run_offload_bench.sh runs it.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* strsignal in bench_util.h (CMake defines it for the whole tree) */
#endif
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpumem.h"

#define BENCH_NAME "offload_bench"
#include "bench_util.h"

#define KiB ((uint64_t)1 << 10)
#define MiB ((uint64_t)1 << 20)
#define GiB ((uint64_t)1 << 30)

#define MAX_SIZES 8
#define MAX_REPS 50
#define MARK 64                 /* bytes of each marker */
#define SAMPLE 4096             /* bytes of each sampled run */
#define CEILING_MAX GiB         /* the pinned ceiling's buffer, at most */
#define MIXED_MIN (64 * KiB)
#define MIXED_MAX (64 * MiB)
#define RATE_GUESS 5e9          /* bytes/s assumed before anything was timed (--deadline) */

/* One process, no children: child_fail (which CK calls) is never reached
 * through our code, but bench_util.h's pool_stats() refers to it. */
static void child_fail(const char *fmt, ...)
{
    char line[BENCH_ERROR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    add_error("%s", line);
    exit(1);
}

/* A gm call that must succeed: else the failure is recorded and the
 * enclosing function jumps to `out` (its cleanup). */
#define TRY(expr, step)                                                              \
    do {                                                                             \
        int try_ = (expr);                                                           \
        if (try_ != GM_OK) {                                                         \
            add_error("%s: %s: %s (%s)", r->label, step, gm_errname(try_),           \
                      gm_last_error());                                              \
            goto out;                                                                \
        }                                                                            \
    } while (0)

/* ---- sizes ---------------------------------------------------------------------- */

/* "1GiB", "256M", "64MiB", "4096": bytes; 0 when it is no size. */
static uint64_t parse_size(const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0) return 0;
    uint64_t scale = 1;
    switch (toupper((unsigned char)*end)) {
    case 'K': scale = KiB; end++; break;
    case 'M': scale = MiB; end++; break;
    case 'G': scale = GiB; end++; break;
    case 'T': scale = GiB << 10; end++; break;
    default: break;
    }
    if (scale > 1 && (*end == 'i' || *end == 'I')) end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return 0;
    double b = v * (double)scale;
    return b >= 1 && b < 1e18 ? (uint64_t)b : 0;
}

/* The JSON key of a size: "16GiB", "64MiB", "1536KiB", "1000B". */
static void size_label(char *buf, size_t cap, uint64_t b)
{
    if (b % GiB == 0) snprintf(buf, cap, "%" PRIu64 "GiB", b / GiB);
    else if (b % MiB == 0) snprintf(buf, cap, "%" PRIu64 "MiB", b / MiB);
    else if (b % KiB == 0) snprintf(buf, cap, "%" PRIu64 "KiB", b / KiB);
    else snprintf(buf, cap, "%" PRIu64 "B", b);
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ---- what the device says ------------------------------------------------------- */

static info_t g_info; /* of the first pool made */

static void take_info(gm_pool_t *pool)
{
    gm_device_info_t di = GM_DEVICE_INFO_INIT;
    if (g_info.ok || gm_pool_device_info(pool, &di) != GM_OK) return;
    g_info.ok = true;
    snprintf(g_info.device_name, sizeof g_info.device_name, "%s", di.device_name);
    snprintf(g_info.backend_name, sizeof g_info.backend_name, "%s", di.backend_name);
    g_info.backend = (int)di.backend;
    g_info.device = di.device;
    g_info.driver_version = di.driver_version;
    g_info.total_memory = di.total_memory;
    g_info.free_memory = di.free_memory;
    g_info.granularity = di.granularity;
}

/* The device's free memory now (the driver's figure); NAN when unknown. */
static double device_free(gm_pool_t *pool)
{
    gm_device_info_t di = GM_DEVICE_INFO_INIT;
    return gm_pool_device_info(pool, &di) == GM_OK ? (double)di.free_memory : NAN;
}

static int make_pool(gm_pool_t **pool, gm_stream_t *stream)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    int rc = gm_config_from_env(&cfg);
    if (rc != GM_OK) return rc;
    if ((rc = gm_pool_create(&cfg, pool)) != GM_OK) return rc;
    take_info(*pool);
    if ((rc = gm_stream_create(*pool, stream)) != GM_OK) {
        gm_pool_destroy(*pool);
        *pool = NULL;
    }
    return rc;
}

static void drop_pool(gm_pool_t *pool, gm_stream_t stream)
{
    if (!pool) return;
    gm_stream_synchronize(pool, stream);
    if (stream) gm_stream_destroy(pool, stream);
    gm_host_trim(pool, 0, NULL);
    gm_trim(pool, 0, NULL);
    gm_pool_destroy(pool);
}

/* ---- the pinned ceiling ----------------------------------------------------------- */

typedef struct ceiling {
    bool ran;
    uint64_t bytes;
    int n;
    double d2h_s[MAX_REPS], h2d_s[MAX_REPS];
    double d2h_GBps, h2d_GBps;
    char label[16];
} ceiling_t;

static void run_ceiling(ceiling_t *r, uint64_t bytes, int reps)
{
    gm_pool_t *pool = NULL;
    gm_stream_t s = NULL;
    void *host = NULL, *dev = NULL;
    snprintf(r->label, sizeof r->label, "ceiling");
    r->bytes = bytes;
    r->d2h_GBps = r->h2d_GBps = NAN;
    TRY(make_pool(&pool, &s), "pool");
    TRY(gm_host_alloc(pool, bytes, s, &host), "gm_host_alloc");
    TRY(gm_alloc(pool, bytes, s, &dev), "gm_alloc");
    memset(host, 0x5a, bytes); /* touched, as an offload's copies are */
    TRY(gm_memset(pool, dev, 0xa5, bytes, s), "gm_memset");
    TRY(gm_stream_synchronize(pool, s), "gm_stream_synchronize");
    for (int k = -1; k < reps; k++) { /* k = -1: untimed */
        double t0 = now();
        TRY(gm_memcpy(pool, host, dev, bytes, s), "gm_memcpy d2h");
        TRY(gm_stream_synchronize(pool, s), "gm_stream_synchronize");
        double t1 = now();
        TRY(gm_memcpy(pool, dev, host, bytes, s), "gm_memcpy h2d");
        TRY(gm_stream_synchronize(pool, s), "gm_stream_synchronize");
        double t2 = now();
        if (k >= 0) {
            r->d2h_s[k] = t1 - t0;
            r->h2d_s[k] = t2 - t1;
            r->n = k + 1;
        }
    }
    r->ran = true;
    r->d2h_GBps = (double)bytes / median_of(r->d2h_s, r->n) / 1e9;
    r->h2d_GBps = (double)bytes / median_of(r->h2d_s, r->n) / 1e9;
    if (((unsigned char *)host)[bytes / 2] != 0xa5) add_error("ceiling: the d2h copy did not arrive");
out:
    if (pool) {
        if (dev) gm_free(pool, dev, s);
        if (host) gm_host_free(pool, host, s);
    }
    drop_pool(pool, s);
}

/* ---- a tag: fill, check, offload, restore --------------------------------------- */

typedef struct run {
    bool ran, mixed;
    uint64_t bytes;              /* the tag's bytes (requested) */
    char label[32];              /* the JSON key: "16GiB" */
    int nblocks;
    uint64_t min_block, max_block;
    double cold_off_s, first_res_s;
    int n;
    double off_s[MAX_REPS], res_s[MAX_REPS];
    double off_GBps, res_GBps, cold_GBps, first_res_GBps;
    double free_before, free_after, reserved_before, reserved_after;
    double warm_free_before, warm_free_after; /* around the last warm offload */
    double host_reserved_after, host_reserved_end;
    double warm_host_registers;  /* host_register calls during the warm cycles (0: warm) */
    /* The first sleep with its pinned memory made ahead: after the warm
     * cycles, gm_host_trim(0) empties the host pool again, then
     * gm_offload_prepare (timed), the offload (timed; its registrations
     * counted: 0 when the preparation made all it needs), the restore. */
    double prep_s, prep_off_s, prep_off_GBps, prep_off_registers;
    double frac_free, frac_reserved, frac_free_warm;
    bool info_ok;
    gm_tag_info_t info_off, info_end;
    gm_stats_t st_end;
    int data_first, data_last; /* 1 ok, 0 wrong, -1 not checked */
    uint64_t bad_blocks;
    double seconds;
} run_t;

typedef struct tagmem {
    size_t n;
    void **ptr;
    uint64_t *size;
} tagmem_t;

static unsigned char block_byte(size_t i) { return (unsigned char)(1 + (i * 131 + 7) % 255); }

/* The 64-byte marker at `which` end (0 start, 1 end) of block i. */
static void marker(unsigned char *m, size_t i, int which, uint64_t size)
{
    uint64_t x = (uint64_t)i * 0x100000001b3ull ^ (uint64_t)which << 62 ^ size;
    for (int k = 0; k < MARK; k += 8) {
        uint64_t v = splitmix64(&x);
        memcpy(m + k, &v, 8);
    }
}

static int fill(gm_pool_t *pool, gm_stream_t s, const tagmem_t *t)
{
    unsigned char m[MARK];
    for (size_t i = 0; i < t->n; i++) {
        int rc = gm_memset(pool, t->ptr[i], block_byte(i), t->size[i], s);
        if (rc != GM_OK) return rc;
        if (t->size[i] < 4 * MARK) continue;
        for (int w = 0; w < 2; w++) {
            marker(m, i, w, t->size[i]);
            char *at = (char *)t->ptr[i] + (w ? t->size[i] - MARK : 0);
            if ((rc = gm_memcpy_h2d(pool, at, m, MARK, s)) != GM_OK) return rc;
        }
    }
    return gm_stream_synchronize(pool, s);
}

/* Markers and two sampled runs of every block, read back from the device.
 * *bad: blocks whose data differ.  Non-zero: a read failed. */
static int check(gm_pool_t *pool, gm_stream_t s, const tagmem_t *t, uint64_t seed, uint64_t *bad)
{
    static unsigned char buf[SAMPLE];
    unsigned char m[MARK];
    *bad = 0;
    for (size_t i = 0; i < t->n; i++) {
        uint64_t size = t->size[i];
        unsigned char v = block_byte(i);
        bool ok = true;
        bool marks = size >= 4 * MARK;
        if (marks)
            for (int w = 0; w < 2 && ok; w++) {
                marker(m, i, w, size);
                int rc = gm_memcpy_d2h(pool, buf, (char *)t->ptr[i] + (w ? size - MARK : 0), MARK, s);
                if (rc != GM_OK) return rc;
                ok = memcmp(buf, m, MARK) == 0;
            }
        /* runs between the markers: one in the middle, one at random */
        uint64_t lo = marks ? MARK : 0, hi = marks ? size - MARK : size;
        uint64_t len = hi - lo < SAMPLE ? hi - lo : SAMPLE;
        for (int k = 0; k < 2 && ok && len; k++) {
            uint64_t span = hi - lo - len;
            uint64_t off = lo + (k == 0 ? span / 2 : span ? splitmix64(&seed) % (span + 1) : 0);
            int rc = gm_memcpy_d2h(pool, buf, (char *)t->ptr[i] + off, len, s);
            if (rc != GM_OK) return rc;
            for (uint64_t j = 0; j < len; j++)
                if (buf[j] != v) {
                    ok = false;
                    break;
                }
        }
        if (!ok) (*bad)++;
    }
    return GM_OK;
}

/* The blocks of a tag of `bytes`: --block each, or mixed sizes. */
static int plan(tagmem_t *t, uint64_t bytes, uint64_t block, bool mixed)
{
    size_t cap = 64;
    t->n = 0;
    t->size = malloc(cap * sizeof *t->size);
    if (!t->size) return -1;
    uint64_t seed = 0x0ff10adull ^ bytes, left = bytes;
    while (left) {
        uint64_t b;
        if (mixed) {
            double u = (double)(splitmix64(&seed) >> 11) / 9007199254740992.0;
            b = (uint64_t)exp(log((double)MIXED_MIN) + u * (log((double)MIXED_MAX) - log((double)MIXED_MIN)));
            b += splitmix64(&seed) % 4096; /* odd sizes: blocks share pages */
        } else {
            b = block;
        }
        if (b > left || left - b < (mixed ? MIXED_MIN : 1)) b = left;
        if (t->n == cap) {
            uint64_t *p = realloc(t->size, 2 * cap * sizeof *p);
            if (!p) return -1;
            t->size = p;
            cap *= 2;
        }
        t->size[t->n++] = b;
        left -= b;
    }
    t->ptr = calloc(t->n, sizeof *t->ptr);
    return t->ptr ? 0 : -1;
}

static void run_tag(run_t *r, uint64_t bytes, uint64_t block, int reps, bool mixed)
{
    gm_pool_t *pool = NULL;
    gm_stream_t s = NULL;
    tagmem_t t = {0};
    double start = now();
    r->bytes = bytes;
    r->mixed = mixed;
    size_label(r->label, sizeof r->label, bytes);
    r->off_GBps = r->res_GBps = r->cold_GBps = r->first_res_GBps = NAN;
    r->free_before = r->free_after = r->reserved_before = r->reserved_after = NAN;
    r->warm_free_before = r->warm_free_after = r->frac_free_warm = NAN;
    r->host_reserved_after = r->host_reserved_end = r->frac_free = r->frac_reserved = NAN;
    r->cold_off_s = r->first_res_s = r->warm_host_registers = NAN;
    r->prep_s = r->prep_off_s = r->prep_off_GBps = r->prep_off_registers = NAN;
    r->data_first = r->data_last = -1;
    gm_tag_info_t ti = GM_TAG_INFO_INIT;
    r->info_off = r->info_end = ti;
    gm_stats_t st0 = GM_STATS_INIT;
    r->st_end = st0;

    if (plan(&t, bytes, block, mixed) != 0) {
        add_error("%s: no host memory for the plan", r->label);
        goto out;
    }
    r->nblocks = (int)t.n;
    r->min_block = r->max_block = t.size[0];
    for (size_t i = 0; i < t.n; i++) {
        if (t.size[i] < r->min_block) r->min_block = t.size[i];
        if (t.size[i] > r->max_block) r->max_block = t.size[i];
    }
    char name[GM_TAG_NAME_MAX + 1];
    snprintf(name, sizeof name, "offload-bench-%s%s", mixed ? "mixed-" : "", r->label);
    gm_tag_t tag;
    TRY(gm_tag_get(name, 0, &tag), "gm_tag_get");
    TRY(make_pool(&pool, &s), "pool");
    for (size_t i = 0; i < t.n; i++) TRY(gm_alloc_tagged(pool, t.size[i], s, tag, &t.ptr[i]), "gm_alloc_tagged");
    TRY(fill(pool, s, &t), "fill");

    /* cold: the pool's first offload, its host pool empty */
    gm_stats_t st = GM_STATS_INIT;
    TRY(gm_pool_stats(pool, &st), "gm_pool_stats");
    if (st.host_reserved != 0)
        add_error("%s: the fresh pool holds %" PRIu64 " bytes of pinned memory before the cold "
                  "offload (not cold)", r->label, st.host_reserved);
    r->reserved_before = (double)st.reserved;
    r->free_before = device_free(pool);
    double t0 = now();
    TRY(gm_offload(pool, tag, 0, s), "gm_offload (cold)");
    r->cold_off_s = now() - t0;
    r->free_after = device_free(pool);
    TRY(gm_pool_stats(pool, &st), "gm_pool_stats");
    r->reserved_after = (double)st.reserved;
    r->host_reserved_after = (double)st.host_reserved;
    r->frac_free = (r->free_after - r->free_before) / (double)bytes;
    r->frac_reserved = (r->reserved_before - r->reserved_after) / (double)bytes;
    TRY(gm_tag_info(pool, tag, &r->info_off), "gm_tag_info");
    r->info_ok = true;
    if (r->info_off.offloaded_bytes != bytes || r->info_off.resident_blocks != 0 ||
        r->info_off.offloaded_blocks != t.n)
        add_error("%s: after gm_offload gm_tag_info says %" PRIu64 " blocks (%" PRIu64
                  " bytes) offloaded, %" PRIu64 " resident; want %zu (%" PRIu64 " bytes), 0",
                  r->label, r->info_off.offloaded_blocks, r->info_off.offloaded_bytes,
                  r->info_off.resident_blocks, t.n, bytes);
    if (st.offloaded != bytes)
        add_error("%s: stats.offloaded %" PRIu64 " after gm_offload, want %" PRIu64, r->label,
                  st.offloaded, bytes);
    t0 = now();
    TRY(gm_restore(pool, tag, s), "gm_restore (first)");
    r->first_res_s = now() - t0;
    uint64_t bad;
    TRY(check(pool, s, &t, 1, &bad), "reading the data back");
    r->data_first = bad == 0;
    r->bad_blocks = bad;
    if (bad) add_error("%s: after the first restore %" PRIu64 " of %zu blocks hold wrong data",
                       r->label, bad, t.n);
    r->cold_GBps = (double)bytes / r->cold_off_s / 1e9;
    r->first_res_GBps = (double)bytes / r->first_res_s / 1e9;

    /* warm cycles */
    TRY(gm_pool_stats(pool, &st), "gm_pool_stats");
    uint64_t registers = st.backend_calls[GM_CALL_host_register];
    for (int k = 0; k < reps; k++) {
        TRY(gm_stream_synchronize(pool, s), "gm_stream_synchronize");
        if (k == reps - 1) r->warm_free_before = device_free(pool);
        t0 = now();
        TRY(gm_offload(pool, tag, 0, s), "gm_offload");
        double t1 = now();
        if (k == reps - 1) r->warm_free_after = device_free(pool);
        double t2 = now();
        TRY(gm_restore(pool, tag, s), "gm_restore");
        double t3 = now();
        r->off_s[k] = t1 - t0;
        r->res_s[k] = t3 - t2;
        r->n = k + 1;
    }
    if (r->n) {
        r->off_GBps = (double)bytes / median_of(r->off_s, r->n) / 1e9;
        r->res_GBps = (double)bytes / median_of(r->res_s, r->n) / 1e9;
        r->frac_free_warm = (r->warm_free_after - r->warm_free_before) / (double)bytes;
    }
    TRY(check(pool, s, &t, 2, &bad), "reading the data back");
    r->data_last = bad == 0;
    if (bad > r->bad_blocks) r->bad_blocks = bad;
    if (bad) add_error("%s: after the last restore %" PRIu64 " of %zu blocks hold wrong data",
                       r->label, bad, t.n);
    TRY(gm_tag_info(pool, tag, &r->info_end), "gm_tag_info");
    if (r->info_end.resident_bytes != bytes || r->info_end.offloaded_blocks != 0)
        add_error("%s: after the last restore gm_tag_info says %" PRIu64 " bytes resident, %"
                  PRIu64 " blocks offloaded; want %" PRIu64 ", 0", r->label,
                  r->info_end.resident_bytes, r->info_end.offloaded_blocks, bytes);
    TRY(gm_pool_stats(pool, &r->st_end), "gm_pool_stats");
    r->host_reserved_end = (double)r->st_end.host_reserved;
    r->warm_host_registers = (double)(r->st_end.backend_calls[GM_CALL_host_register] - registers);
    r->ran = true;

    /* prepared: a cold host pool again, its memory made ahead of the offload */
    if (!mixed) {
        TRY(gm_stream_synchronize(pool, s), "gm_stream_synchronize");
        TRY(gm_host_trim(pool, 0, NULL), "gm_host_trim");
        t0 = now();
        TRY(gm_offload_prepare(pool, tag, 0), "gm_offload_prepare");
        r->prep_s = now() - t0;
        TRY(gm_pool_stats(pool, &st), "gm_pool_stats");
        registers = st.backend_calls[GM_CALL_host_register];
        t0 = now();
        TRY(gm_offload(pool, tag, 0, s), "gm_offload (prepared)");
        r->prep_off_s = now() - t0;
        TRY(gm_pool_stats(pool, &st), "gm_pool_stats");
        r->prep_off_registers = (double)(st.backend_calls[GM_CALL_host_register] - registers);
        r->prep_off_GBps = (double)bytes / r->prep_off_s / 1e9;
        TRY(gm_restore(pool, tag, s), "gm_restore (prepared)");
        TRY(check(pool, s, &t, 2, &bad), "reading the data back");
        if (bad) {
            r->data_last = 0;
            add_error("%s: after the prepared cycle %" PRIu64 " of %zu blocks hold wrong data",
                      r->label, bad, t.n);
        }
    }
out:
    if (pool) {
        for (size_t i = 0; i < t.n; i++)
            if (t.ptr && t.ptr[i]) {
                int rc = gm_free(pool, t.ptr[i], s);
                if (rc != GM_OK) {
                    add_error("%s: gm_free: %s (%s)", r->label, gm_errname(rc), gm_last_error());
                    break;
                }
            }
    }
    drop_pool(pool, s);
    free(t.ptr);
    free(t.size);
    r->seconds = now() - start;
}

/* ---- output ------------------------------------------------------------------------ */

typedef struct results {
    ceiling_t ceiling;
    run_t runs[MAX_SIZES];
    int nruns;
    run_t mixed;
    uint64_t block;
    int reps;
    double seconds;
} results_t;

static double ratio(double a, double b) { return isnan(a) || isnan(b) || b == 0 ? NAN : a / b; }

/* ,"key":{"1GiB":x,...} over the runs, x the field at `off` (a double)
 * divided by `per` (1: as it is; NAN or 0: null) */
static void jper(FILE *f, const char *key, const results_t *res, size_t off, double per)
{
    jkey(f, key);
    fputc('{', f);
    for (int i = 0; i < res->nruns; i++) {
        if (i) fputc(',', f);
        jstr(f, res->runs[i].label);
        fputc(':', f);
        jnum(f, ratio(*(const double *)((const char *)&res->runs[i] + off), per));
    }
    fputc('}', f);
}

/* ,"key":{"label":v} of the mixed run m; {} when it was not made */
static void jmixed(FILE *f, const char *key, const run_t *m, double v)
{
    jkey(f, key);
    fputc('{', f);
    if (m->bytes) {
        jstr(f, m->label);
        fputc(':', f);
        jnum(f, v);
    }
    fputc('}', f);
}

static void jrun(FILE *f, const run_t *r, const ceiling_t *c)
{
    fputs("{\"ran\":", f);
    jbool(f, r->ran);
    jfield(f, "bytes", (double)r->bytes);
    jfield(f, "blocks", r->nblocks);
    jfield(f, "min_block_bytes", (double)r->min_block);
    jfield(f, "max_block_bytes", (double)r->max_block);
    jfield(f, "offload_GBps", r->off_GBps);
    jfield(f, "restore_GBps", r->res_GBps);
    jfield(f, "offload_cold_GBps", r->cold_GBps);
    jfield(f, "restore_first_GBps", r->first_res_GBps);
    jfield(f, "offload_of_ceiling", ratio(r->off_GBps, c->d2h_GBps));
    jfield(f, "restore_of_ceiling", ratio(r->res_GBps, c->h2d_GBps));
    jfield_arr(f, "offload_s", r->off_s, r->n);
    jfield_arr(f, "restore_s", r->res_s, r->n);
    jfield(f, "offload_cold_s", r->cold_off_s);
    jfield(f, "restore_first_s", r->first_res_s);
    jfield(f, "prepare_s", r->prep_s);
    jfield(f, "offload_prepared_s", r->prep_off_s);
    jfield(f, "offload_prepared_GBps", r->prep_off_GBps);
    jfield(f, "offload_prepared_host_registers", r->prep_off_registers);
    jfield(f, "device_free_before", r->free_before);
    jfield(f, "device_free_after", r->free_after);
    jfield(f, "reserved_before", r->reserved_before);
    jfield(f, "reserved_after", r->reserved_after);
    jfield(f, "gpu_freed_fraction", r->frac_free);
    jfield(f, "gpu_freed_fraction_reserved", r->frac_reserved);
    jfield(f, "gpu_freed_fraction_warm", r->frac_free_warm);
    jfield(f, "host_reserved_after_offload", r->host_reserved_after);
    jfield(f, "host_reserved_end", r->host_reserved_end);
    jfield(f, "warm_host_register_calls", r->warm_host_registers);
    jfield_bool(f, "data_ok_first_restore", r->data_first);
    jfield_bool(f, "data_ok_last_restore", r->data_last);
    jfield(f, "bad_blocks", (double)r->bad_blocks);
    if (r->info_ok) {
        const gm_tag_info_t *a = &r->info_off;
        fprintf(f, ",\"tag_after_offload\":{\"resident_blocks\":%" PRIu64 ",\"resident_bytes\":%" PRIu64
                   ",\"offloaded_blocks\":%" PRIu64 ",\"offloaded_bytes\":%" PRIu64 "}",
                a->resident_blocks, a->resident_bytes, a->offloaded_blocks, a->offloaded_bytes);
        a = &r->info_end;
        fprintf(f, ",\"tag_end\":{\"resident_blocks\":%" PRIu64 ",\"resident_bytes\":%" PRIu64
                   ",\"offloaded_blocks\":%" PRIu64 ",\"offloads\":%" PRIu64 ",\"restores\":%" PRIu64 "}",
                a->resident_blocks, a->resident_bytes, a->offloaded_blocks, a->offloads, a->restores);
    }
    if (r->ran) {
        const gm_stats_t *s = &r->st_end;
        fprintf(f, ",\"stats_end\":{\"offload_count\":%" PRIu64 ",\"restore_count\":%" PRIu64
                   ",\"offload_bytes_total\":%" PRIu64 ",\"restore_bytes_total\":%" PRIu64
                   ",\"offloaded\":%" PRIu64 ",\"reserved_peak\":%" PRIu64 ",\"host_reserved_peak\":%"
                   PRIu64 ",\"phys_create\":%" PRIu64 ",\"phys_release\":%" PRIu64 ",\"host_register\":%"
                   PRIu64 ",\"memcpy\":%" PRIu64 "}",
                s->offload_count, s->restore_count, s->offload_bytes_total, s->restore_bytes_total,
                s->offloaded, s->reserved_peak, s->host_reserved_peak,
                s->backend_calls[GM_CALL_phys_create], s->backend_calls[GM_CALL_phys_release],
                s->backend_calls[GM_CALL_host_register], s->backend_calls[GM_CALL_memcpy]);
    }
    jfield(f, "seconds", r->seconds);
    fputc('}', f);
}

static int all_verified(const results_t *res)
{
    int v = -1;
    for (int i = 0; i <= res->nruns; i++) {
        const run_t *r = i < res->nruns ? &res->runs[i] : &res->mixed;
        if (!r->ran) continue;
        v = (v != 0) && r->data_first == 1 && r->data_last == 1;
    }
    return v;
}

static void write_json(FILE *f, const void *results, const bench_label_t *l)
{
    const results_t *res = results;
    const ceiling_t *c = &res->ceiling;
    jhead(f, l->date, l->command, g_info.ok, g_info.device_name, g_info.backend_name,
          g_info.driver_version, l->commit);
    jfield(f, "page_bytes", g_info.ok ? (double)g_info.granularity : NAN);
    jfield(f, "device_total_memory", g_info.ok ? (double)g_info.total_memory : NAN);
    jkey(f, "sizes");
    fputc('[', f);
    for (int i = 0; i < res->nruns; i++) {
        if (i) fputc(',', f);
        jstr(f, res->runs[i].label);
    }
    fputc(']', f);
    jfield(f, "block_bytes", (double)res->block);
    jfield(f, "reps", res->reps);
    fputs(",\"pinned_ceiling_GBps\":{\"d2h\":", f);
    jnum(f, c->d2h_GBps);
    jfield(f, "h2d", c->h2d_GBps);
    fputc('}', f);
    jfield(f, "pinned_ceiling_d2h_GBps", c->d2h_GBps);
    jfield(f, "pinned_ceiling_h2d_GBps", c->h2d_GBps);
    jfield(f, "pinned_ceiling_bytes", c->ran ? (double)c->bytes : NAN);
    jper(f, "offload_GBps", res, offsetof(run_t, off_GBps), 1);
    jper(f, "restore_GBps", res, offsetof(run_t, res_GBps), 1);
    jper(f, "offload_cold_GBps", res, offsetof(run_t, cold_GBps), 1);
    jper(f, "restore_first_GBps", res, offsetof(run_t, first_res_GBps), 1);
    jper(f, "gpu_freed_fraction", res, offsetof(run_t, frac_free), 1);
    jper(f, "gpu_freed_fraction_reserved", res, offsetof(run_t, frac_reserved), 1);
    jper(f, "offload_of_ceiling", res, offsetof(run_t, off_GBps), c->d2h_GBps);
    jper(f, "restore_of_ceiling", res, offsetof(run_t, res_GBps), c->h2d_GBps);
    const run_t *m = &res->mixed;
    jmixed(f, "offload_mixed_GBps", m, m->off_GBps);
    jmixed(f, "restore_mixed_GBps", m, m->res_GBps);
    jfield_bool(f, "verified", all_verified(res));
    fputs(",\"details\":{\"pinned_ceiling\":{\"d2h_s\":", f);
    jarr(f, c->d2h_s, c->n);
    jfield_arr(f, "h2d_s", c->h2d_s, c->n);
    fputs("},\"runs\":{", f);
    for (int i = 0; i < res->nruns; i++) {
        if (i) fputc(',', f);
        jstr(f, res->runs[i].label);
        fputc(':', f);
        jrun(f, &res->runs[i], c);
    }
    fputc('}', f);
    if (m->bytes) {
        jkey(f, "mixed");
        jrun(f, m, c);
    }
    jfield(f, "seconds", res->seconds);
    jerrors_end(f);
}

static const char *yes(int v) { return v < 0 ? "—" : v ? "yes" : "NO"; }

static void md_row(FILE *f, const run_t *r, const ceiling_t *c, const char *what)
{
    char a[32], b[32], cc[32], d[32], e[32], g[32], h[32];
    fmt_num(a, sizeof a, r->off_GBps, "%.2f");
    fmt_num(b, sizeof b, r->res_GBps, "%.2f");
    fmt_num(cc, sizeof cc, r->cold_GBps, "%.2f");
    fmt_num(d, sizeof d, r->first_res_GBps, "%.2f");
    fmt_num(e, sizeof e, ratio(r->off_GBps, c->d2h_GBps), "%.2f");
    fmt_num(g, sizeof g, ratio(r->res_GBps, c->h2d_GBps), "%.2f");
    fmt_num(h, sizeof h, r->frac_free, "%.3f");
    char fr[32];
    fmt_num(fr, sizeof fr, r->frac_reserved, "%.3f");
    fprintf(f, "| %s%s | %d | %s | %s | %s | %s | %s; %s | %s; %s | %s |\n", r->label, what,
            r->nblocks, a, b, cc, d, e, g, h, fr, yes(r->data_first == 1 && r->data_last == 1 ? 1 :
                                                     r->data_first < 0 && r->data_last < 0 ? -1 : 0));
}

static void write_md(FILE *f, const void *results, const bench_label_t *l)
{
    const results_t *res = results;
    const ceiling_t *c = &res->ceiling;
    char a[32], b[32];
    fprintf(f, "# Offload and restore — %s, %s\n\n", g_info.ok ? g_info.device_name : "unknown device",
            l->date);
    fprintf(f, "- command: `%s`; code: commit %s; backend %s, driver %d; pages of %" PRIu64
               " KiB; %d failure(s)\n", l->command, l->commit, g_info.ok ? g_info.backend_name : "unknown",
            g_info.driver_version, g_info.granularity >> 10, g_nerrors);
    size_label(a, sizeof a, res->block);
    fprintf(f, "- each size: a pool of its own, one tag of that many bytes in blocks of %s "
               "(gm_alloc_tagged, gm_memset, 64-byte markers at both ends); cold = the pool's first "
               "gm_offload (host pool empty: pinned memory registered during it) and the restore after "
               "it; warm = median of %d gm_offload + gm_restore cycles (wall clock; both calls return "
               "when done); the data checked after the first and the last restore (markers and two "
               "4 KiB runs of every block, gm_memcpy_d2h)\n", a, res->reps);
    size_label(a, sizeof a, c->bytes);
    fprintf(f, "- pinned ceiling: gm_memcpy between a %s gm_host_alloc buffer and a device block, on a "
               "stream, synchronized; median of %d; GB/s = 1e9 bytes/s of the tag's bytes\n", a, c->n);
    fprintf(f, "- freed fraction: (device free memory after the cold offload - before) / tag bytes "
               "(driver: cuMemGetInfo; sim: capacity - pages made); then the same with the pool's "
               "`reserved`\n");
    if (res->mixed.bytes)
        fprintf(f, "- mixed: blocks of %" PRIu64 " KiB .. %" PRIu64 " KiB (log-uniform, odd sizes: "
                   "blocks share pages)\n", res->mixed.min_block >> 10, res->mixed.max_block >> 10);
    fputc('\n', f);
    fmt_num(a, sizeof a, c->d2h_GBps, "%.2f");
    fmt_num(b, sizeof b, c->h2d_GBps, "%.2f");
    fprintf(f, "Pinned ceiling: d2h %s GB/s, h2d %s GB/s.\n\n", a, b);
    fprintf(f, "| tag | blocks | offload GB/s | restore GB/s | offload cold GB/s | first restore GB/s "
               "| of ceiling (offload; restore) | GPU freed (driver; reserved) | data ok |\n"
               "|---|---:|---:|---:|---:|---:|---:|---:|:---:|\n");
    for (int i = 0; i < res->nruns; i++) md_row(f, &res->runs[i], c, "");
    if (res->mixed.bytes) md_row(f, &res->mixed, c, " mixed");
    fputc('\n', f);
    for (int i = 0; i <= res->nruns; i++) {
        const run_t *r = i < res->nruns ? &res->runs[i] : &res->mixed;
        if (!r->n) continue;
        char runs[600], runs2[600];
        fmt_runs(runs, sizeof runs, r->off_s, r->n, "%.4f");
        fmt_runs(runs2, sizeof runs2, r->res_s, r->n, "%.4f");
        fprintf(f, "- %s%s: offload s %s; restore s %s; cold offload %.4f s, first restore %.4f s; "
                   "pinned held after the cold offload %.0f MiB; pinned registrations during the "
                   "warm cycles %.0f\n", r->label, r->mixed ? " mixed" : "", runs, runs2, r->cold_off_s,
                r->first_res_s, r->host_reserved_after / (double)MiB, r->warm_host_registers);
        if (!r->mixed && !isnan(r->prep_s))
            fprintf(f, "- %s: pinned memory made ahead (gm_offload_prepare) %.4f s, then the first "
                       "offload %.4f s (%.2f GB/s, %.0f pinned registrations of its own)\n",
                    r->label, r->prep_s, r->prep_off_s, r->prep_off_GBps, r->prep_off_registers);
    }
    fputc('\n', f);
    md_failures(f);
}

/* ---- main ------------------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr,
            "usage: offload_bench [--sizes 1GiB,16GiB] [--block 256MiB] [--reps 5]\n"
            "                     [--mixed SIZE|0] [--json FILE] [--md FILE] [--command TEXT]\n"
            "                     [--deadline S]\n"
            "  sizes: K, M, G, T suffixes (binary); --mixed: a tag of blocks of mixed sizes\n"
            "  (default: the smallest size; 0: none); without --json the JSON goes to stdout\n"
            "  GPUMEM_BACKEND=sim: the sim backend (use small sizes); unset: auto\n");
}

int main(int argc, char **argv)
{
    const char *json_path = NULL, *md_path = NULL, *command_arg = NULL;
    const char *sizes_arg = "1GiB,16GiB", *mixed_arg = NULL;
    uint64_t block = 256 * MiB;
    int reps = 5;
    double deadline = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
        else if (!strcmp(argv[i], "--md") && i + 1 < argc) md_path = argv[++i];
        else if (!strcmp(argv[i], "--command") && i + 1 < argc) command_arg = argv[++i];
        else if (!strcmp(argv[i], "--sizes") && i + 1 < argc) sizes_arg = argv[++i];
        else if (!strcmp(argv[i], "--mixed") && i + 1 < argc) mixed_arg = argv[++i];
        else if (!strcmp(argv[i], "--block") && i + 1 < argc) {
            if (!(block = parse_size(argv[++i]))) {
                fprintf(stderr, BENCH_NAME ": --block: not a size: %s\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--deadline") && i + 1 < argc) deadline = atof(argv[++i]);
        else {
            usage();
            return 2;
        }
    }
    if (reps < 1 || reps > MAX_REPS) {
        fprintf(stderr, BENCH_NAME ": --reps is 1 to %d\n", MAX_REPS);
        return 2;
    }
    static results_t res;
    res.block = block;
    res.reps = reps;
    uint64_t sizes[MAX_SIZES];
    int nsizes = 0;
    {
        char buf[512];
        snprintf(buf, sizeof buf, "%s", sizes_arg);
        for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            uint64_t b = parse_size(tok);
            if (!b || nsizes == MAX_SIZES) {
                fprintf(stderr, BENCH_NAME ": --sizes: %s\n", b ? "too many sizes" : "not a size");
                return 2;
            }
            sizes[nsizes++] = b;
        }
        if (!nsizes) {
            usage();
            return 2;
        }
    }
    uint64_t mixed = sizes[0];
    for (int i = 1; i < nsizes; i++)
        if (sizes[i] < mixed) mixed = sizes[i];
    if (mixed_arg) mixed = strcmp(mixed_arg, "0") == 0 ? 0 : parse_size(mixed_arg);
    if (mixed_arg && !mixed && strcmp(mixed_arg, "0") != 0) {
        fprintf(stderr, BENCH_NAME ": --mixed: not a size: %s\n", mixed_arg);
        return 2;
    }
    g_coordinator = getpid();
    raise_nofile(); /* the sim holds a descriptor per page */
    const char *const envs[] = {"GPUMEM_BACKEND", "GPUMEM_SIM_CAPACITY"};
    bench_label_t lbl;
    bench_label(&lbl, command_arg, envs, sizeof envs / sizeof envs[0], argc, argv);
    double t_start = now();

    uint64_t biggest = 0;
    for (int i = 0; i < nsizes; i++)
        if (sizes[i] > biggest) biggest = sizes[i];
    run_ceiling(&res.ceiling, biggest < CEILING_MAX ? biggest : CEILING_MAX, reps);
    if (g_info.ok)
        fprintf(stderr, BENCH_NAME ": %s backend, device %d \"%s\", driver %d, %.1f GiB (%.1f free)\n",
                g_info.backend_name, g_info.device, g_info.device_name, g_info.driver_version,
                (double)g_info.total_memory / (double)GiB, (double)g_info.free_memory / (double)GiB);
    fprintf(stderr, BENCH_NAME ": pinned ceiling (%" PRIu64 " MiB): d2h %.2f GB/s, h2d %.2f GB/s\n",
            res.ceiling.bytes >> 20, res.ceiling.d2h_GBps, res.ceiling.h2d_GBps);

    double rate = !isnan(res.ceiling.d2h_GBps) && res.ceiling.d2h_GBps > 0 ? res.ceiling.d2h_GBps * 1e9 / 2
                                                                          : RATE_GUESS;
    for (int i = 0; i < nsizes; i++) {
        run_t *r = &res.runs[res.nruns++];
        /* a cold cycle, the warm ones, the fill and the checks */
        double guess = (double)sizes[i] * (2.0 * reps + 6) / rate;
        if (deadline > 0 && now() - t_start + guess > deadline) {
            r->bytes = sizes[i];
            size_label(r->label, sizeof r->label, sizes[i]);
            r->off_GBps = r->res_GBps = r->cold_GBps = r->first_res_GBps = NAN;
            r->frac_free = r->frac_reserved = NAN;
            r->data_first = r->data_last = -1;
            add_error("%s skipped: it might not end within --deadline %.0f s (%.0f s gone, about "
                      "%.0f s needed)", r->label, deadline, now() - t_start, guess);
            continue;
        }
        run_tag(r, sizes[i], block, reps, false);
        fprintf(stderr, BENCH_NAME ": %s: offload %.2f GB/s, restore %.2f GB/s (warm); cold "
                "offload %.2f GB/s; freed %.3f (reserved %.3f); data %s; %.1f s\n", r->label,
                r->off_GBps, r->res_GBps, r->cold_GBps, r->frac_free, r->frac_reserved,
                yes(r->data_first == 1 && r->data_last == 1), r->seconds);
        if (r->ran && r->n) rate = (double)sizes[i] * (2.0 * reps + 2) / r->seconds;
    }
    if (mixed) {
        run_t *r = &res.mixed;
        double guess = (double)mixed * (2.0 * reps + 6) / rate;
        if (deadline > 0 && now() - t_start + guess > deadline) {
            r->bytes = mixed;
            size_label(r->label, sizeof r->label, mixed);
            r->off_GBps = r->res_GBps = r->cold_GBps = r->first_res_GBps = NAN;
            r->frac_free = r->frac_reserved = NAN;
            r->data_first = r->data_last = -1;
            add_error("mixed %s skipped: it might not end within --deadline %.0f s", r->label, deadline);
        } else {
            run_tag(r, mixed, block, reps, true);
            fprintf(stderr, BENCH_NAME ": %s mixed (%d blocks): offload %.2f GB/s, restore %.2f GB/s "
                    "(warm); data %s\n", r->label, r->nblocks, r->off_GBps, r->res_GBps,
                    yes(r->data_first == 1 && r->data_last == 1));
        }
    }
    res.seconds = now() - t_start;
    fprintf(stderr, BENCH_NAME ": done in %.1f s, %d failure(s)\n", res.seconds, g_nerrors);

    /* the readable table */
    write_md(stdout, &res, &lbl);
    fflush(stdout);
    return bench_write(json_path, md_path, write_json, write_md, &res, &lbl);
}
