/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_offload_faults.c — every backend call of gm_offload and gm_restore
 * failing in turn, and the resource failures the header names.
 *
 * Sweep: for every backend call kind k and n = 1, 2, 3, ... the n-th call
 * of kind k made by gm_offload (then, separately, by gm_restore) fails
 * (gm_sim_fail_nth), until an attempt makes fewer than n calls of kind k
 * (the fault did not fire).  After each attempt: a clean status (GM_OK, or
 * an error with a message), gm_pool_check passes, the tag's figures add up
 * (resident + offloaded = all its blocks; a failed restore leaves the whole
 * tag offloaded, "all or nothing"), the resident blocks hold their data;
 * then with the fault disarmed the call is made again and must succeed, and
 * after the restore every byte of every block is checked.  The pinned host
 * pool is trimmed before every offload so that its growth (host_register,
 * host_device_pointer) is swept too.  At the end everything is freed and
 * trimmed: no device page and no pinned host memory may remain beyond the
 * copy engine's staging buffers (measured before the sweep).
 *
 * Then: pinned host memory running out (host_register failing) part way
 * through an offload, again and again: an error, the copied blocks
 * offloaded, the others resident with their data, and a retry finishes;
 * the same at either window of a two-window tag, whose second window's
 * memory is touched ahead (nothing touched ahead may be left behind);
 * a restore with too little device memory (a small sim device filled by
 * other allocations) or under a pool limit: GM_OUT_OF_MEMORY / GM_LIMIT,
 * the tag still wholly offloaded, the data intact once memory is there.
 * Sim only (fault injection and a small device).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpumem.h"
#include "../test.h"
#include "../lib/checks.h"
#include "offload_util.h"

#define MAXB 40

static gm_pool_t *pool;
static gm_stream_t S;
static gm_tag_t T, U;
static tblock_t b[MAXB];
static size_t nb;
static const char *what_now = "";
static unsigned long attempts;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int clean(int rc) { return rc_clean(rc, GM_NOT_READY); }

/* The tag's figures agree with the table; each block's state is read from
 * gm_tag_info only in sum, so: resident + offloaded == all, and the pool's
 * `offloaded` is the tag's offloaded bytes.  *all_off / *all_res: the tag
 * is wholly offloaded / resident. */
static void tag_consistent(gm_tag_t tag, int *all_off, int *all_res)
{
    size_t count = 0, bytes = tag_bytes(b, nb, tag, &count);
    gm_tag_info_t ti = tag_info_of(pool, tag);
    gm_stats_t st = pool_stats_of(pool);
    int ok = ti.resident_blocks + ti.offloaded_blocks == count &&
             ti.resident_bytes + ti.offloaded_bytes == bytes && st.offloaded == ti.offloaded_bytes;
    if (!ok)
        fprintf(stderr, "  %s (attempt %lu): tag %u: resident %" PRIu64 "/%" PRIu64
                ", offloaded %" PRIu64 "/%" PRIu64 ", want %zu/%zu in all; stats.offloaded %"
                PRIu64 "\n", what_now, attempts, (unsigned)tag, ti.resident_blocks,
                ti.resident_bytes, ti.offloaded_blocks, ti.offloaded_bytes, count, bytes,
                st.offloaded);
    CHECK(ok);
    if (all_off) *all_off = ti.resident_blocks == 0 && ti.offloaded_blocks == count;
    if (all_res) *all_res = ti.offloaded_blocks == 0 && ti.resident_blocks == count;
}

/* Blocks of other tags and untagged ones always hold their data; the tag's
 * own only when it is wholly resident (which block went first is the
 * implementation's business). */
static int check_others(gm_tag_t tag)
{
    int ok = 1;
    for (size_t i = 0; i < nb; i++)
        if (b[i].p && b[i].tag != tag &&
            !dev_check(pool, b[i].p, b[i].n, b[i].seed, b[i].stream, what_now))
            ok = 0;
    return ok;
}

static void setup_blocks(void)
{
    static const size_t tsz_full[] = {256, 5000, 64 * KiB + 8, MiB - 256, MiB + 300,
                                      2 * MiB, 3 * MiB + 5, 5 * MiB, 700, 12 * MiB + 4099};
    static const size_t usz_full[] = {1000, 2 * MiB + 77, 300000, 512};
    /* Slow builds: the same kinds of blocks (below, at and above 1 and 2
     * MiB, odd sizes), less data to copy and check per attempt. */
    static const size_t tsz_small[] = {256, 5000, 64 * KiB + 8, MiB - 256, MiB + 300,
                                       2 * MiB + 5, 700, 12 * MiB + 4099};
    static const size_t usz_small[] = {1000, 600000, 300000, 512};
    int small = slow_factor() > 1;
    const size_t *tsz = small ? tsz_small : tsz_full, *usz = small ? usz_small : usz_full;
    size_t ntsz = small ? sizeof tsz_small / sizeof tsz_small[0] : sizeof tsz_full / sizeof tsz_full[0];
    size_t nusz = sizeof usz_full / sizeof usz_full[0];
    uint64_t seed = 1;
    nb = 0;
    for (size_t i = 0; i < ntsz; i++) {
        gm_stream_t s = i % 2 ? S : NULL;
        b[nb] = (tblock_t){NULL, tsz[i], T, seed++, s};
        CHECK_OK(gm_alloc_tagged(pool, tsz[i], s, T, &b[nb].p));
        CHECK_OK(gm_record_stream(pool, b[nb].p, i % 2 ? NULL : S));
        nb++;
        if (i < nusz) {
            gm_tag_t t = i % 2 ? U : GM_TAG_NONE;
            b[nb] = (tblock_t){NULL, usz[i], t, seed++, s};
            CHECK_OK(gm_alloc_tagged(pool, usz[i], s, t, &b[nb].p));
            nb++;
        }
    }
    for (size_t i = 0; i < nb; i++) CHECK_OK(dev_fill(pool, b[i].p, b[i].n, b[i].seed, b[i].stream));
    CHECK(check_all(pool, b, nb, "setup"));
}

/* One attempt of `op` (0 offload, 1 restore) with the n-th call of `kind`
 * failing.  Returns whether the fault fired. */
static int attempt(int op, int kind, unsigned long n)
{
    char what[96];
    snprintf(what, sizeof what, "%s, %s #%lu fails", op ? "restore" : "offload",
             gm_call_name(kind), n);
    what_now = what;
    attempts++;
    int off, res;
    if (op == 0) {
        CHECK_OK(gm_host_trim(pool, 0, NULL)); /* the offload must grow the host pool */
    } else {
        CHECK_OK(gm_offload(pool, T, 0, S));
        tag_consistent(T, &off, NULL);
        CHECK(off);
    }
    gm_stats_t st0 = pool_stats_of(pool);
    CHECK_OK(gm_sim_fail_nth(pool, kind, n));
    int rc = op ? gm_restore(pool, T, S) : gm_offload(pool, T, 0, S);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", gm_last_error());
    gm_stats_t st1 = pool_stats_of(pool);
    CHECK_OK(gm_sim_fail_nth(pool, kind, 0));
    int fired = st1.backend_calls[kind] - st0.backend_calls[kind] >= n ||
                strstr(msg, "injected failure") != NULL;
    if (!clean(rc)) {
        test_failed_++;
        fprintf(stderr, "  %s: returned %s (%s)\n", what, gm_errname(rc), msg);
    } else {
        test_passed_++;
    }
    if (rc != GM_OK && !fired) {
        test_failed_++;
        fprintf(stderr, "  %s: failed with no fault injected: %s (%s)\n", what,
                gm_errname(rc), msg);
    }
    int prc = gm_pool_check(pool);
    CHECK_OK(prc);
    if (prc != GM_OK) fprintf(stderr, "  (%s)\n", what);
    tag_consistent(T, &off, &res);
    if (op == 1 && rc != GM_OK) {
        /* All or nothing. */
        if (!off) fprintf(stderr, "  %s: failed restore left the tag partly resident\n", what);
        CHECK(off);
    }
    if (op == 0 && rc == GM_OK) CHECK(off);
    if (op == 1 && rc == GM_OK) CHECK(res);
    CHECK(check_others(T));
    if (res) CHECK(check_all(pool, b, nb, what));

    /* Disarmed: finish the work, then check every byte. */
    if (op == 0) {
        int rc2 = gm_offload(pool, T, 0, S);
        CHECK_OK(rc2);
        tag_consistent(T, &off, NULL);
        CHECK(off);
        if (rc2 != GM_OK || !off) fprintf(stderr, "  %s: the retried offload did not finish\n", what);
    }
    int rc3 = gm_restore(pool, T, NULL);
    CHECK_OK(rc3);
    if (rc3 != GM_OK) fprintf(stderr, "  (%s: the retried restore)\n", what);
    tag_consistent(T, NULL, &res);
    CHECK(res);
    int ok = check_all(pool, b, nb, what);
    CHECK(ok);
    if (!ok) fprintf(stderr, "  data lost at: %s (first status %s: %s)\n", what, gm_errname(rc), msg);
    CHECK_OK(gm_pool_check(pool));
    /* Pages a failed release left cached go at the next trim. */
    CHECK_OK(gm_trim(pool, 0, NULL));
    return fired;
}

static void sweep(void)
{
    pool = sim_pool(512 * MiB, 0);
    if (!pool) { CHECK(0); return; }
    CHECK_OK(gm_stream_create(pool, &S));
    setup_blocks();
    CHECK_OK(gm_host_trim(pool, 0, NULL));
    gm_stats_t base = pool_stats_of(pool); /* staging buffers of the copy engine */

    for (int op = 0; op < 2; op++) {
        for (int k = 0; k < GM_CALL_COUNT; k++) {
            /* TSan (the slowest build) takes n = 1, 2, then every other. */
            unsigned long n = 1, last = 0, stride = slow_factor() >= 10 ? 2 : 1;
            while (n < 5000 && attempt(op, k, n)) {
                last = n;
                n += n < 2 ? 1 : stride;
            }
            CHECK(n < 5000);
            if (last) printf("%s: %s swept n = 1..%lu\n", op ? "restore" : "offload", gm_call_name(k), last);
        }
    }
    printf("%lu attempts\n", attempts);
    gm_stats_t st = pool_stats_of(pool);
    CHECK(st.offload_count > 0 && st.restore_count > 0);

    /* Nothing leaked: every block freed, caches trimmed. */
    for (size_t i = 0; i < nb; i++) CHECK_OK(gm_free(pool, b[i].p, b[i].stream));
    nb = 0;
    CHECK_OK(gm_stream_synchronize(pool, S));
    CHECK_OK(gm_trim(pool, 0, NULL));
    CHECK_OK(gm_host_trim(pool, 0, NULL));
    st = pool_stats_of(pool);
    CHECK(st.allocated == 0 && st.live_blocks == 0 && st.offloaded == 0);
    CHECK(st.reserved == 0);
    CHECK(st.host_allocated == base.host_allocated);
    CHECK(st.host_reserved == base.host_reserved);
    if (st.reserved || st.host_allocated != base.host_allocated ||
        st.host_reserved != base.host_reserved)
        fprintf(stderr, "  after the sweep: reserved %" PRIu64 ", host_allocated %" PRIu64
                " (staging %" PRIu64 "), host_reserved %" PRIu64 " (before %" PRIu64 ")\n",
                st.reserved, st.host_allocated, base.host_allocated, st.host_reserved,
                base.host_reserved);
    CHECK_OK(gm_pool_check(pool));
    CHECK_OK(gm_stream_destroy(pool, S));
    gm_pool_destroy(pool);
    pool = NULL;
}

static void fill_tag(size_t count, size_t size)
{
    nb = 0;
    for (size_t i = 0; i < count; i++) {
        b[nb] = (tblock_t){NULL, size + 4096 * i, T, 300 + i, NULL};
        CHECK_OK(gm_alloc_tagged(pool, b[nb].n, NULL, T, &b[nb].p));
        CHECK_OK(dev_fill(pool, b[nb].p, b[nb].n, b[nb].seed, NULL));
        nb++;
    }
    b[nb] = (tblock_t){NULL, 1 * MiB + 5, GM_TAG_NONE, 399, NULL};
    CHECK_OK(gm_alloc(pool, b[nb].n, NULL, &b[nb].p));
    CHECK_OK(dev_fill(pool, b[nb].p, b[nb].n, b[nb].seed, NULL));
    nb++;
}

/* Every block freed, the pool checked and destroyed. */
static void drop_all(void)
{
    for (size_t i = 0; i < nb; i++) CHECK_OK(gm_free(pool, b[i].p, NULL));
    nb = 0;
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
    pool = NULL;
}

/* After an offload of T failed: a message, a consistent pool, T not wholly
 * offloaded, the other blocks untouched. */
static void failed_offload_ok(void)
{
    CHECK(gm_last_error()[0] != '\0');
    CHECK_OK(gm_pool_check(pool));
    int off, res;
    tag_consistent(T, &off, &res);
    CHECK(!off);
    CHECK(check_others(T));
}

/* Pinned host memory runs out part way, several times in a row. */
static void host_exhaustion(void)
{
    pool = sim_pool(512 * MiB, 0);
    if (!pool) { CHECK(0); return; }
    what_now = "host memory exhaustion";
    S = NULL;
    nb = 0;
    for (int i = 0; i < 4; i++) {
        b[nb] = (tblock_t){NULL, 12 * MiB + 1000 * (size_t)i, T, 100 + (uint64_t)i, NULL};
        CHECK_OK(gm_alloc_tagged(pool, b[nb].n, NULL, T, &b[nb].p));
        CHECK_OK(dev_fill(pool, b[nb].p, b[nb].n, b[nb].seed, NULL));
        nb++;
    }
    b[nb] = (tblock_t){NULL, 3 * MiB, GM_TAG_NONE, 200, NULL};
    CHECK_OK(gm_alloc(pool, b[nb].n, NULL, &b[nb].p));
    CHECK_OK(dev_fill(pool, b[nb].p, b[nb].n, b[nb].seed, NULL));
    nb++;
    CHECK_OK(gm_host_trim(pool, 0, NULL));
    int failures = 0;
    for (int round = 0; round < 3; round++) {
        CHECK_OK(gm_sim_fail_nth(pool, GM_CALL_host_register, 1));
        int rc = gm_offload(pool, T, 0, NULL);
        CHECK_OK(gm_sim_fail_nth(pool, GM_CALL_host_register, 0));
        if (rc == GM_OK) break; /* what was left fitted in pinned memory held already */
        failures++;
        CHECK(rc == GM_NO_HOST_MEMORY || rc == GM_BACKEND);
        if (rc != GM_NO_HOST_MEMORY && round == 0)
            fprintf(stderr, "  host exhaustion, round %d: %s (%s); the header names "
                    "GM_NO_HOST_MEMORY\n", round, gm_errname(rc), gm_last_error());
        failed_offload_ok();
        /* The resident ones still hold their data; which ones they are is
         * read by trying: a block that is resident reads back. */
        gm_tag_info_t ti = tag_info_of(pool, T);
        CHECK(ti.resident_blocks >= 1);
    }
    CHECK(failures >= 1);
    CHECK_OK(gm_offload(pool, T, 0, NULL));
    int off;
    tag_consistent(T, &off, NULL);
    CHECK(off);
    CHECK_OK(gm_restore(pool, T, NULL));
    CHECK(check_all(pool, b, nb, "after host exhaustion"));
    drop_all();
}

/* A tag of two windows (offload/offload.c places at most 128 MiB of blocks per
 * pinned segment): the second window's memory is touched ahead while the
 * first one's registers.  A cold offload registers one chunk per window
 * and nothing more; a registration failing at either window fails the
 * offload clearly, and no memory touched ahead is left behind
 * (gm_pool_check says so); the retry finishes with every byte. */
static void host_exhaustion_windows(void)
{
    pool = sim_pool(512 * MiB, 0);
    if (!pool) { CHECK(0); return; }
    what_now = "host memory exhaustion, two windows";
    S = NULL;
    fill_tag(4, 40 * MiB);
    for (unsigned long n = 1; n <= 2; n++) {
        CHECK_OK(gm_host_trim(pool, 0, NULL));
        CHECK_OK(gm_sim_fail_nth(pool, GM_CALL_host_register, n));
        int rc = gm_offload(pool, T, 0, NULL);
        CHECK_OK(gm_sim_fail_nth(pool, GM_CALL_host_register, 0));
        CHECK(rc == GM_NO_HOST_MEMORY || rc == GM_BACKEND);
        if (rc == GM_OK) fprintf(stderr, "  two windows: registration %lu failing did not fail the offload\n", n);
        failed_offload_ok();
        CHECK_OK(gm_restore(pool, T, NULL)); /* what was offloaded comes back */
        CHECK(check_all(pool, b, nb, what_now));
    }
    CHECK_OK(gm_host_trim(pool, 0, NULL));
    uint64_t r0 = pool_stats_of(pool).backend_calls[GM_CALL_host_register];
    CHECK_OK(gm_offload(pool, T, 0, NULL));
    uint64_t regs = pool_stats_of(pool).backend_calls[GM_CALL_host_register] - r0;
    CHECK(regs == 2);
    if (regs != 2) fprintf(stderr, "  two windows: %" PRIu64 " registrations (want 2)\n", regs);
    CHECK_OK(gm_pool_check(pool));
    CHECK_OK(gm_restore(pool, T, NULL));
    CHECK(check_all(pool, b, nb, what_now));
    drop_all();
}

/* Restore with the device full of other memory, then under a limit. */
static void restore_short(void)
{
    /* A 64 MiB device: the tag takes 3 x ~8 MiB. */
    pool = sim_pool(64 * MiB, 0);
    if (!pool) { CHECK(0); return; }
    what_now = "restore, device short";
    fill_tag(3, 8 * MiB);
    CHECK_OK(gm_offload(pool, T, 0, NULL));
    int off;
    tag_consistent(T, &off, NULL);
    CHECK(off);
    /* Fill the device with untagged 2 MiB blocks until it refuses. */
    void *filler[64];
    int nf = 0;
    while (nf < 64 && gm_alloc(pool, 2 * MiB, NULL, &filler[nf]) == GM_OK) nf++;
    CHECK(nf >= 10 && nf < 64);
    /* Leave 4 MiB free: not enough for the tag. */
    for (int k = 0; k < 2 && nf > 0; k++) CHECK_OK(gm_free(pool, filler[--nf], NULL));
    gm_stats_t st0 = pool_stats_of(pool);
    int rc = gm_restore(pool, T, NULL);
    CHECK(rc == GM_OUT_OF_MEMORY || rc == GM_LIMIT);
    if (rc != GM_OUT_OF_MEMORY && rc != GM_LIMIT)
        fprintf(stderr, "  restore on a full device: %s (%s)\n", gm_errname(rc), gm_last_error());
    CHECK(gm_last_error()[0] != '\0');
    CHECK_OK(gm_pool_check(pool));
    tag_consistent(T, &off, NULL);
    CHECK(off);
    gm_stats_t st1 = pool_stats_of(pool);
    CHECK(st1.offloaded == st0.offloaded);
    CHECK(st1.restore_count == st0.restore_count);
    CHECK(check_others(T));
    /* Try again: still short, still refused, still whole. */
    CHECK(gm_restore(pool, T, NULL) != GM_OK);
    tag_consistent(T, &off, NULL);
    CHECK(off);
    while (nf > 0) CHECK_OK(gm_free(pool, filler[--nf], NULL));
    CHECK_OK(gm_restore(pool, T, NULL));
    CHECK(check_all(pool, b, nb, "restore after the device was freed"));
    CHECK_OK(gm_pool_check(pool));
    for (size_t i = 0; i < nb; i++) CHECK_OK(gm_free(pool, b[i].p, NULL));
    gm_pool_destroy(pool);

    /* A pool limit below what the restore needs. */
    pool = sim_pool(1024 * MiB, 0);
    if (!pool) { CHECK(0); return; }
    what_now = "restore, pool limit";
    fill_tag(3, 8 * MiB);
    CHECK_OK(gm_offload(pool, T, 0, NULL));
    gm_stats_t st = pool_stats_of(pool);
    CHECK_OK(gm_pool_set_limit(pool, st.reserved + 2 * MiB));
    rc = gm_restore(pool, T, NULL);
    CHECK_RC(rc, GM_LIMIT);
    CHECK_OK(gm_pool_check(pool));
    tag_consistent(T, &off, NULL);
    CHECK(off);
    CHECK(pool_stats_of(pool).reserved <= st.reserved + 2 * MiB);
    CHECK(check_others(T));
    CHECK_OK(gm_pool_set_limit(pool, 0));
    CHECK_OK(gm_restore(pool, T, NULL));
    CHECK(check_all(pool, b, nb, "restore after the limit was lifted"));
    drop_all();
}

/* Several heaps: the tag's blocks lie in three heaps; the device has room
 * for one block only.  The restore is all or nothing over the whole pool. */
typedef struct hjob {
    tblock_t *x;
    int rc;
} hjob_t;

static void *heap_alloc(void *p)
{
    hjob_t *j = p;
    j->rc = gm_alloc_tagged(pool, j->x->n, NULL, j->x->tag, &j->x->p);
    if (j->rc == GM_OK) j->rc = dev_fill(pool, j->x->p, j->x->n, j->x->seed, NULL);
    if (j->rc == GM_OK) j->rc = gm_stream_synchronize(pool, NULL);
    scratch_free();
    return NULL;
}

/* The pool over heaps (global `pool`): a sim pool of `capacity` bytes with four heaps,
 * *first a small block in this thread's heap; then the table is three
 * blocks of tag T, block i of size + i * step bytes holding pattern
 * seed + i, each allocated (and filled) by a thread of its own, so in a
 * heap of its own.  0, with a failed CHECK, when the pool cannot be made. */
static int setup_heaps(size_t capacity, void **first, size_t size, size_t step, uint64_t seed)
{
    gm_pool_config_t cfg = sim_config(capacity);
    cfg.heaps = 4;
    cfg.copy_threads = 1;
    pool = pool_from(&cfg);
    if (!pool) { CHECK(0); return 0; }
    *first = NULL;
    CHECK_OK(gm_alloc(pool, 1000, NULL, first)); /* this thread's heap */
    nb = 0;
    for (int i = 0; i < 3; i++) {
        b[nb] = (tblock_t){NULL, size + step * (size_t)i, T, seed + (uint64_t)i, NULL};
        hjob_t j = {&b[nb], -1};
        pthread_t th;
        CHECK(pthread_create(&th, NULL, heap_alloc, &j) == 0);
        pthread_join(th, NULL);
        CHECK_OK(j.rc);
        nb++;
    }
    return 1;
}

static void restore_short_heaps(void)
{
    void *first;
    if (!setup_heaps(64 * MiB, &first, 6 * MiB, 0, 500)) return;
    what_now = "restore over heaps, device short";
    CHECK_OK(gm_offload(pool, T, 0, NULL));
    int off;
    tag_consistent(T, &off, NULL);
    CHECK(off);
    CHECK_OK(gm_trim(pool, 0, NULL));
    /* Live filler in this thread's heap, leaving room for about one block. */
    void *filler[40];
    int nf = 0;
    gm_stats_t st = pool_stats_of(pool);
    size_t room = 64 * MiB - st.reserved;
    while (nf < 40 && room >= 10 * MiB && gm_alloc(pool, 2 * MiB, NULL, &filler[nf]) == GM_OK) {
        nf++;
        room -= 2 * MiB;
    }
    int rc = gm_restore(pool, T, NULL);
    CHECK(rc == GM_OUT_OF_MEMORY || rc == GM_LIMIT);
    gm_tag_info_t ti = tag_info_of(pool, T);
    CHECK(ti.resident_blocks == 0 && ti.offloaded_blocks == 3);
    if (rc == GM_OK || ti.resident_blocks)
        fprintf(stderr, "  restore over heaps with room for one block: %s, the tag is now %"
                PRIu64 " resident, %" PRIu64 " offloaded (want all or nothing)\n",
                gm_errname(rc), ti.resident_blocks, ti.offloaded_blocks);
    CHECK_OK(gm_pool_check(pool));
    while (nf > 0) CHECK_OK(gm_free(pool, filler[--nf], NULL));
    CHECK_OK(gm_trim(pool, 0, NULL));
    CHECK_OK(gm_restore(pool, T, NULL));
    CHECK(check_all(pool, b, nb, "restore over heaps, after the filler went"));
    CHECK_OK(gm_free(pool, first, NULL));
    drop_all();
}

/* Several heaps, one block's stream held: the offload first waits for every
 * stream of the tag's blocks, so it fails before anything moves. */
static void offload_held_heaps(void)
{
    void *first;
    if (!setup_heaps(256 * MiB, &first, 3 * MiB, 100, 600)) return;
    what_now = "offload over heaps, a stream held";
    gm_stream_t H;
    CHECK_OK(gm_stream_create(pool, &H));
    CHECK_OK(gm_record_stream(pool, b[2].p, H)); /* the last heap's block */
    CHECK_OK(gm_sim_hold_stream(pool, H, 1));
    CHECK_OK(gm_memset(pool, b[2].p, 0x19, 4096, H));
    unsigned char *want = malloc(b[2].n);
    int rc = gm_offload(pool, T, 0, NULL);
    CHECK(rc != GM_OK);
    gm_tag_info_t ti = tag_info_of(pool, T);
    CHECK(ti.resident_blocks == 3 && ti.offloaded_blocks == 0);
    if (ti.resident_blocks != 3)
        fprintf(stderr, "  offload over heaps with a held stream: %s, the tag is now %" PRIu64
                " resident, %" PRIu64 " offloaded (want nothing moved)\n", gm_errname(rc),
                ti.resident_blocks, ti.offloaded_blocks);
    CHECK_OK(gm_pool_check(pool));
    CHECK_OK(gm_sim_hold_stream(pool, H, 0));
    CHECK_OK(gm_offload(pool, T, 0, NULL));
    CHECK_OK(gm_restore(pool, T, NULL));
    if (want) {
        pattern(want, b[2].n, b[2].seed);
        memset(want, 0x19, 4096);
        CHECK(dev_equal(pool, b[2].p, want, b[2].n, NULL, what_now));
        free(want);
    }
    CHECK(check_all(pool, b, 2, what_now));
    for (size_t i = 0; i < nb; i++) CHECK_OK(gm_free(pool, b[i].p, NULL));
    nb = 0;
    CHECK_OK(gm_free(pool, first, NULL));
    CHECK_OK(gm_stream_destroy(pool, H));
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
    pool = NULL;
}

int main(void)
{
    if (test_backend() != GM_BACKEND_SIM) {
        printf("test_offload_faults: sim only, skipped\n");
        return 77;
    }
    REQUIRE(gm_tag_get("faults.t", 0, &T) == GM_OK);
    REQUIRE(gm_tag_get("faults.u", 0, &U) == GM_OK);
    double t0 = now_s();
    sweep();
    double t1 = now_s();
    host_exhaustion();
    host_exhaustion_windows();
    restore_short();
    restore_short_heaps();
    offload_held_heaps();
    printf("sweep %.1f s, the rest %.1f s\n", t1 - t0, now_s() - t1);
    scratch_free();
    return test_summary();
}
