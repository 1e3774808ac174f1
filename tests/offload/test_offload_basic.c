/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_offload_basic.c — tags, offload and restore through the public API
 * (include/gpumem.h, "Tags, offload and restore"), one promise at a time:
 *   - gm_tag_get: same name same tag, other flags refused, bad names, the
 *     GM_TAGS_MAX limit; gm_tag_scope returns the previous tag and ignores
 *     unknown ones; gm_alloc_tagged overrides the scope;
 *   - offload of a tag with blocks of many sizes (256 B to 9 MiB, below and
 *     above 1 MiB and 2 MiB pages, odd sizes) interleaved with untagged
 *     blocks and blocks of another tag, on three streams: the stats
 *     (offloaded, reserved, host memory, counters), gm_tag_info, the other
 *     blocks untouched, the pool consistent; gm_restore brings back every
 *     byte at the same addresses;
 *   - a pool holding only tagged memory gives all of its pages back;
 *   - gm_free of an offloaded block (its host copy goes), double free;
 *   - allocation into an offloaded tag; blocks freed into a thread cache;
 *   - discard mode (GM_TAG_DISCARD and GM_OFFLOAD_DISCARD): no copy, no host
 *     memory, usable memory after the restore;
 *   - invalid arguments, acquire/release counting, refusal of a tag with a
 *     published block (GM_NOT_SUPPORTED, nothing moved), per-pool tags,
 *     destroying a pool with offloaded blocks.
 * Device memory is only touched through gm_memset / gm_memcpy_h2d / d2h.
 * Runs on the test backend (sim, or a GPU with GPUMEM_TEST_BACKEND=cuda);
 * the checks that an offloaded page is really unmapped are sim only.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpumem.h"
#include "../test.h"
#include "offload_util.h"

#define ALIGN_UP(x, a) (((x) + (a) - 1) / (a) * (a))
#define PAGE ((size_t)2 << 20)

static int on_sim;
static unsigned tags_made; /* distinct names this program made */

static gm_tag_t new_tag(const char *name, unsigned flags)
{
    gm_tag_t t = GM_TAG_NONE;
    int rc = gm_tag_get(name, flags, &t);
    CHECK_OK(rc);
    CHECK(t != GM_TAG_NONE);
    if (rc == GM_OK) tags_made++;
    return t;
}

/* ---- tag names, flags, scope ------------------------------------------------- */

static gm_tag_t tag_a, tag_b, tag_kv;

static void test_tags(gm_pool_t *pool)
{
    tag_a = new_tag("basic.weights", 0);
    tag_b = new_tag("basic.other", 0);
    tag_kv = new_tag("basic.kv", GM_TAG_DISCARD);
    CHECK(tag_a != tag_b && tag_a != tag_kv && tag_b != tag_kv);

    gm_tag_t t = 12345;
    CHECK_OK(gm_tag_get("basic.weights", 0, &t));
    CHECK(t == tag_a);
    CHECK_OK(gm_tag_get("basic.kv", GM_TAG_DISCARD, &t));
    CHECK(t == tag_kv);
    /* Same name, other flags. */
    t = 12345;
    CHECK_RC(gm_tag_get("basic.weights", GM_TAG_DISCARD, &t), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_tag_get("basic.weights", GM_TAG_EVICTABLE, &t), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_tag_get("basic.kv", 0, &t), GM_INVALID_ARGUMENT);
    CHECK(gm_last_error()[0] != '\0');
    /* Names are exact: another spelling is another tag. */
    gm_tag_t t2 = new_tag("basic.weights ", 0);
    CHECK(t2 != tag_a);
    gm_tag_t t3 = new_tag("Basic.weights", 0);
    CHECK(t3 != tag_a && t3 != t2);

    /* Bad names and arguments. */
    char name[GM_TAG_NAME_MAX + 2];
    memset(name, 'n', sizeof name);
    name[GM_TAG_NAME_MAX + 1] = '\0'; /* 64 bytes */
    CHECK_RC(gm_tag_get(name, 0, &t), GM_INVALID_ARGUMENT);
    name[GM_TAG_NAME_MAX] = '\0'; /* 63 bytes: the longest */
    gm_tag_t tlong = new_tag(name, 0);
    CHECK_RC(gm_tag_get(NULL, 0, &t), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_tag_get("", 0, &t), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_tag_get("basic.x", 0, NULL), GM_INVALID_ARGUMENT);
    /* Flags other than the GM_TAG_* ones: refused like unknown pool flags. */
    CHECK_RC(gm_tag_get("basic.badflags", 0x80, &t), GM_INVALID_ARGUMENT);

    /* gm_tag_info: name and flags, in a pool where the tag has nothing. */
    gm_tag_info_t ti = tag_info_of(pool, tag_kv);
    CHECK(strcmp(ti.name, "basic.kv") == 0);
    CHECK(ti.flags == GM_TAG_DISCARD);
    CHECK(ti.resident_blocks == 0 && ti.resident_bytes == 0 && ti.offloaded_blocks == 0 &&
          ti.offloaded_bytes == 0 && ti.holds == 0 && ti.offloads == 0 && ti.restores == 0 &&
          ti.evictions == 0);
    ti = tag_info_of(pool, tlong);
    CHECK(strlen(ti.name) == GM_TAG_NAME_MAX && strcmp(ti.name, name) == 0);
    CHECK(tag_info_of(pool, tag_a).flags == 0);
    gm_tag_t tev = new_tag("basic.evictable", GM_TAG_EVICTABLE | GM_TAG_DISCARD);
    CHECK(tag_info_of(pool, tev).flags == (GM_TAG_EVICTABLE | GM_TAG_DISCARD));

    /* Scope: returns the previous tag; unknown tags are ignored. */
    CHECK(gm_tag_scope(GM_TAG_NONE) == GM_TAG_NONE); /* a fresh thread has none */
    CHECK(gm_tag_scope(tag_a) == GM_TAG_NONE);
    CHECK(gm_tag_scope(tag_b) == tag_a);
    CHECK(gm_tag_scope(0xdeadbeefu) == tag_b); /* ignored: tag_b stays */
    CHECK(gm_tag_scope(GM_TAGS_MAX + 7) == tag_b);
    CHECK(gm_tag_scope(tag_a) == tag_b);
    CHECK(gm_tag_scope(GM_TAG_NONE) == tag_a);
    CHECK(gm_tag_scope(GM_TAG_NONE) == GM_TAG_NONE);
}

/* gm_alloc takes the scope's tag, gm_alloc_tagged its own (NONE: none). */
static void test_alloc_tagged(gm_pool_t *pool)
{
    void *p[6] = {0};
    gm_tag_t old = gm_tag_scope(tag_a);
    CHECK(old == GM_TAG_NONE);
    CHECK_OK(gm_alloc(pool, 1000, NULL, &p[0]));               /* tag_a (scope) */
    CHECK_OK(gm_alloc(pool, 3 * MiB + 5, NULL, &p[1]));        /* tag_a (scope) */
    CHECK_OK(gm_alloc_tagged(pool, 2000, NULL, tag_b, &p[2])); /* tag_b */
    CHECK_OK(gm_alloc_tagged(pool, 3000, NULL, GM_TAG_NONE, &p[3])); /* untagged */
    CHECK(gm_tag_scope(GM_TAG_NONE) == tag_a);
    CHECK_OK(gm_alloc(pool, 4000, NULL, &p[4]));               /* untagged */
    CHECK_OK(gm_alloc_tagged(pool, 5000, NULL, tag_a, &p[5])); /* tag_a */
    gm_tag_info_t a = tag_info_of(pool, tag_a), b = tag_info_of(pool, tag_b);
    CHECK(a.resident_blocks == 3 && a.resident_bytes == 1000 + 3 * MiB + 5 + 5000);
    CHECK(b.resident_blocks == 1 && b.resident_bytes == 2000);
    CHECK(a.offloaded_blocks == 0 && a.offloaded_bytes == 0);

    /* Unknown tag: refused, nothing allocated. */
    void *q = (void *)1;
    uint64_t live = pool_stats_of(pool).live_blocks;
    CHECK_RC(gm_alloc_tagged(pool, 100, NULL, 0xdeadbeefu, &q), GM_INVALID_ARGUMENT);
    CHECK(pool_stats_of(pool).live_blocks == live);
    /* Size 0: NULL and GM_OK, as gm_alloc. */
    q = (void *)1;
    CHECK_OK(gm_alloc_tagged(pool, 0, NULL, tag_a, &q));
    CHECK(q == NULL);
    CHECK(tag_info_of(pool, tag_a).resident_blocks == 3);

    for (int i = 0; i < 6; i++) CHECK_OK(gm_free(pool, p[i], NULL));
    a = tag_info_of(pool, tag_a);
    b = tag_info_of(pool, tag_b);
    CHECK(a.resident_blocks == 0 && a.resident_bytes == 0);
    CHECK(b.resident_blocks == 0 && b.resident_bytes == 0);
    CHECK_OK(gm_pool_check(pool));
}

/* ---- the main offload/restore round ------------------------------------------- */

static const size_t a_sizes[] = {
    256, 777, 4096, 64 * KiB + 8, 300000, MiB - 256, MiB, MiB + 4097,
    2 * MiB, 3 * MiB + 5, 5 * MiB, 6 * MiB, 9 * MiB + 123, 100, 2 * MiB - 1};
#define NA (sizeof a_sizes / sizeof a_sizes[0])
static const size_t other_sizes[] = {512, 3 * MiB + 77, 8192, 1500000, 333, 2 * MiB, 70000};
#define NOTHER (sizeof other_sizes / sizeof other_sizes[0])

static void test_round(gm_pool_t *pool)
{
    gm_stream_t S, T;
    CHECK_OK(gm_stream_create(pool, &S));
    CHECK_OK(gm_stream_create(pool, &T));
    gm_stream_t streams[3] = {NULL, S, T};
    tblock_t b[3 * NA];
    size_t nb = 0;
    uint64_t seed = 100;
    for (size_t i = 0; i < NA; i++) {
        gm_stream_t s = streams[i % 3];
        tblock_t x = {NULL, a_sizes[i], tag_a, seed++, s};
        CHECK_OK(gm_alloc_tagged(pool, x.n, s, tag_a, &x.p));
        b[nb++] = x;
        /* Neighbours: untagged and tag_b, alternating, sharing pages. */
        tblock_t y = {NULL, other_sizes[i % NOTHER], i % 2 ? tag_b : GM_TAG_NONE, seed++,
                      streams[(i + 1) % 3]};
        CHECK_OK(gm_alloc_tagged(pool, y.n, y.stream, y.tag, &y.p));
        b[nb++] = y;
        if (i % 4 == 3) { /* some by the scope */
            tblock_t z = {NULL, 4096 + i * 1000, tag_a, seed++, s};
            gm_tag_t old = gm_tag_scope(tag_a);
            CHECK_OK(gm_alloc(pool, z.n, s, &z.p));
            gm_tag_scope(old);
            b[nb++] = z;
        }
    }
    for (size_t i = 0; i < nb; i++) {
        if (!b[i].p) continue;
        CHECK_OK(dev_fill(pool, b[i].p, b[i].n, b[i].seed, b[i].stream));
        /* Also used on another stream. */
        CHECK_OK(gm_record_stream(pool, b[i].p, streams[(i + 2) % 3]));
    }
    CHECK(check_all(pool, b, nb, "before offload"));
    size_t na = 0, bytes_a = tag_bytes(b, nb, tag_a, &na);
    size_t nbb = 0, bytes_b = tag_bytes(b, nb, tag_b, &nbb);
    size_t aligned_a = 0;
    for (size_t i = 0; i < nb; i++)
        if (b[i].tag == tag_a) aligned_a += ALIGN_UP(b[i].n, GM_ALIGNMENT);

    gm_tag_info_t ti = tag_info_of(pool, tag_a);
    CHECK(ti.resident_blocks == na && ti.resident_bytes == bytes_a);
    CHECK(ti.offloaded_blocks == 0 && ti.offloaded_bytes == 0);
    gm_stats_t st0 = pool_stats_of(pool);
    CHECK(st0.offloaded == 0);

    /* Offload, on stream S (the blocks were queued on all three). */
    CHECK_OK(gm_offload(pool, tag_a, 0, S));
    CHECK_OK(gm_pool_check(pool));
    gm_stats_t st1 = pool_stats_of(pool);
    CHECK(st1.offloaded == bytes_a);
    CHECK(st1.allocated == st0.allocated); /* offloaded blocks stay allocated */
    CHECK(st1.live_blocks == st0.live_blocks);
    CHECK(st1.reserved < st0.reserved);
    /* At least the pages wholly inside the 9 MiB, 6 MiB and 5 MiB blocks. */
    CHECK(st0.reserved - st1.reserved >= 3 * PAGE);
    CHECK(st1.offload_count - st0.offload_count == na);
    CHECK(st1.offload_bytes_total - st0.offload_bytes_total >= bytes_a);
    CHECK(st1.offload_bytes_total - st0.offload_bytes_total <= aligned_a);
    CHECK(st1.restore_count == st0.restore_count);
    CHECK(st1.host_allocated - st0.host_allocated >= bytes_a); /* the host copies */
    CHECK(st1.evictions == 0);
    /* Derived figures stay sane: cached is "reserved bytes not in live
     * blocks", so at most reserved (no wrap-around below zero). */
    CHECK(st1.cached <= st1.reserved);
    CHECK(st1.active <= st0.active);
    CHECK(st1.fragmentation_ppm <= 1000000);
    if (st1.cached > st1.reserved)
        fprintf(stderr, "  offload: stats cached %" PRIu64 " > reserved %" PRIu64 " (active %"
                PRIu64 ")\n", st1.cached, st1.reserved, st1.active);
    if (st1.offloaded != bytes_a || st1.reserved >= st0.reserved)
        fprintf(stderr, "  offload: offloaded %" PRIu64 " (want %zu), reserved %" PRIu64
                " -> %" PRIu64 "\n", st1.offloaded, bytes_a, st0.reserved, st1.reserved);
    ti = tag_info_of(pool, tag_a);
    CHECK(ti.resident_blocks == 0 && ti.resident_bytes == 0);
    CHECK(ti.offloaded_blocks == na && ti.offloaded_bytes == bytes_a);
    CHECK(ti.offloads == 1 && ti.restores == 0 && ti.evictions == 0 && ti.holds == 0);
    gm_tag_info_t tb = tag_info_of(pool, tag_b);
    CHECK(tb.resident_blocks == nbb && tb.resident_bytes == bytes_b && tb.offloaded_blocks == 0);
    /* The blocks are still live: their sizes are known. */
    size_t bs = 0;
    CHECK_OK(gm_block_size(pool, b[0].p, &bs));
    CHECK(bs == b[0].n);
    /* Untagged and tag_b blocks are untouched. */
    int ok = 1;
    for (size_t i = 0; i < nb; i++)
        if (b[i].tag != tag_a && !dev_check(pool, b[i].p, b[i].n, b[i].seed, b[i].stream,
                                           "other blocks after offload"))
            ok = 0;
    CHECK(ok);
    /* And can be rewritten (their pages stayed). */
    for (size_t i = 0; i < nb; i++)
        if (b[i].tag != tag_a) {
            b[i].seed += 1000;
            CHECK_OK(dev_fill(pool, b[i].p, b[i].n, b[i].seed, b[i].stream));
        }
    /* Offloading again moves nothing and is no error. */
    CHECK_OK(gm_offload(pool, tag_a, 0, NULL));
    CHECK(pool_stats_of(pool).offload_count == st1.offload_count);
    CHECK(tag_info_of(pool, tag_a).offloads == 1);

    /* Restore, on T: the same pointers hold the same bytes. */
    CHECK_OK(gm_restore(pool, tag_a, T));
    CHECK_OK(gm_pool_check(pool));
    gm_stats_t st2 = pool_stats_of(pool);
    CHECK(st2.offloaded == 0);
    CHECK(st2.allocated == st0.allocated);
    CHECK(st2.restore_count - st1.restore_count == na);
    CHECK(st2.restore_bytes_total - st1.restore_bytes_total >= bytes_a);
    CHECK(st2.restore_bytes_total - st1.restore_bytes_total <= aligned_a);
    CHECK(st2.host_allocated == st0.host_allocated); /* host copies freed */
    /* ... into the host pool, which keeps the pinned memory for the next
     * offload until gm_host_trim. */
    CHECK(st2.host_reserved >= st0.host_reserved + bytes_a);
    CHECK(st2.reserved >= st0.reserved - 2 * PAGE);
    ti = tag_info_of(pool, tag_a);
    CHECK(ti.resident_blocks == na && ti.resident_bytes == bytes_a);
    CHECK(ti.offloaded_blocks == 0 && ti.offloaded_bytes == 0);
    CHECK(ti.offloads == 1 && ti.restores == 1);
    CHECK(check_all(pool, b, nb, "after restore"));
    /* Restoring with nothing offloaded: GM_OK, nothing counted. */
    CHECK_OK(gm_restore(pool, tag_a, NULL));
    CHECK(tag_info_of(pool, tag_a).restores == 1);
    CHECK(pool_stats_of(pool).restore_count == st2.restore_count);
    /* A tag that has nothing in this pool. */
    CHECK_OK(gm_offload(pool, tag_kv, 0, NULL));
    CHECK_OK(gm_restore(pool, tag_kv, NULL));
    CHECK(tag_info_of(pool, tag_kv).offloads == 0);

    /* The restored memory is ordinary memory again: rewrite, offload again
     * (on the default stream), restore, check. */
    for (size_t i = 0; i < nb; i++)
        if (b[i].tag == tag_a) {
            b[i].seed += 7777;
            CHECK_OK(dev_fill(pool, b[i].p, b[i].n, b[i].seed, b[i].stream));
        }
    gm_stats_t st4 = pool_stats_of(pool);
    CHECK_OK(gm_offload(pool, tag_a, 0, NULL));
    gm_stats_t st5 = pool_stats_of(pool);
    CHECK(st5.offloaded == bytes_a);
    /* Warm: the pinned memory kept from the first offload serves it. */
    CHECK(st5.backend_calls[GM_CALL_host_register] == st4.backend_calls[GM_CALL_host_register]);
    CHECK(st5.host_reserved == st4.host_reserved);
    if (st5.backend_calls[GM_CALL_host_register] != st4.backend_calls[GM_CALL_host_register] ||
        st5.host_reserved != st4.host_reserved)
        fprintf(stderr, "  second offload of the same blocks: %" PRIu64 " new host_register "
                "and %" PRIu64 " host_unregister calls, host_reserved %" PRIu64 " -> %" PRIu64
                " (host_allocated %" PRIu64 " -> %" PRIu64 ")\n",
                st5.backend_calls[GM_CALL_host_register] - st4.backend_calls[GM_CALL_host_register],
                st5.backend_calls[GM_CALL_host_unregister] - st4.backend_calls[GM_CALL_host_unregister],
                st4.host_reserved, st5.host_reserved, st4.host_allocated, st5.host_allocated);
    CHECK_OK(gm_restore(pool, tag_a, NULL));
    CHECK(check_all(pool, b, nb, "second round"));
    size_t released = 0;
    CHECK_OK(gm_host_trim(pool, 0, &released));
    CHECK(released >= bytes_a / 2);
    CHECK(pool_stats_of(pool).host_reserved + released == st5.host_reserved);
    ti = tag_info_of(pool, tag_a);
    CHECK(ti.offloads == 2 && ti.restores == 2);

    for (size_t i = 0; i < nb; i++) CHECK_OK(gm_free(pool, b[i].p, b[i].stream));
    CHECK_OK(gm_pool_check(pool));
    gm_stats_t st3 = pool_stats_of(pool);
    CHECK(st3.allocated == 0 && st3.live_blocks == 0 && st3.offloaded == 0);
    CHECK_OK(gm_stream_destroy(pool, S));
    CHECK_OK(gm_stream_destroy(pool, T));
}

/* A fresh pool holding only big tagged blocks gives back every page. */
static void test_only_tagged(void)
{
    gm_pool_t *pool = offload_pool((size_t)1 << 30);
    if (!pool) { CHECK(0); return; }
    static const size_t sizes[] = {4 * MiB, 6 * MiB, 2 * MiB, 8 * MiB, 5 * MiB + 100, 12 * MiB};
    enum { N = sizeof sizes / sizeof sizes[0] };
    tblock_t b[N];
    size_t whole = 0, bytes = 0;
    for (int i = 0; i < N; i++) {
        b[i] = (tblock_t){NULL, sizes[i], tag_a, 500 + i, NULL};
        CHECK_OK(gm_alloc_tagged(pool, sizes[i], NULL, tag_a, &b[i].p));
        CHECK_OK(dev_fill(pool, b[i].p, sizes[i], b[i].seed, NULL));
        whole += sizes[i] / PAGE * PAGE;
        bytes += sizes[i];
    }
    gm_stats_t st0 = pool_stats_of(pool);
    CHECK(st0.reserved >= whole);
    CHECK_OK(gm_offload(pool, tag_a, 0, NULL));
    gm_stats_t st1 = pool_stats_of(pool);
    CHECK(st1.reserved + whole <= st0.reserved);
    CHECK(st1.offloaded == bytes);
    /* Nothing resident is left: a trim gives back whatever was cached. */
    CHECK_OK(gm_trim(pool, 0, NULL));
    st1 = pool_stats_of(pool);
    CHECK(st1.reserved == 0);
    CHECK(st1.mapped == 0);
    if (st1.reserved || st1.mapped)
        fprintf(stderr, "  only tagged: reserved %" PRIu64 " mapped %" PRIu64 " after offload "
                "and trim (before: %" PRIu64 ")\n", st1.reserved, st1.mapped, st0.reserved);
    CHECK_OK(gm_pool_check(pool));
    if (on_sim) {
        /* The pages are really gone: the sim refuses a fill of them. */
        CHECK(gm_memset(pool, b[3].p, 0, 4096, NULL) != GM_OK);
        CHECK(gm_memset(pool, b[5].p, 0, 12 * MiB, NULL) != GM_OK);
    }
    CHECK_OK(gm_restore(pool, tag_a, NULL));
    CHECK(pool_stats_of(pool).reserved >= bytes);
    CHECK(check_all(pool, b, N, "only tagged, restored"));
    CHECK_OK(gm_pool_check(pool));
    for (int i = 0; i < N; i++) CHECK_OK(gm_free(pool, b[i].p, NULL));
    gm_pool_destroy(pool);
}

/* gm_free of offloaded blocks; allocation into an offloaded tag. */
static void test_free_and_alloc_while_offloaded(gm_pool_t *pool)
{
    static const size_t sizes[] = {300, 64 * KiB, 3 * MiB + 5, 700000, 2 * MiB, 1000, 4 * MiB};
    enum { N = sizeof sizes / sizeof sizes[0] };
    tblock_t b[N + 4];
    size_t nb = 0;
    void *u = NULL;
    CHECK_OK(gm_alloc(pool, 5000, NULL, &u)); /* an untagged neighbour */
    for (int i = 0; i < N; i++) {
        b[nb] = (tblock_t){NULL, sizes[i], tag_a, 900 + i, NULL};
        CHECK_OK(gm_alloc_tagged(pool, sizes[i], NULL, tag_a, &b[nb].p));
        CHECK_OK(dev_fill(pool, b[nb].p, sizes[i], b[nb].seed, NULL));
        nb++;
    }
    size_t bytes = tag_bytes(b, nb, tag_a, NULL);
    CHECK_OK(gm_offload(pool, tag_a, 0, NULL));
    gm_stats_t st0 = pool_stats_of(pool);
    CHECK(st0.offloaded == bytes);

    /* Free a big and a small offloaded block: they go, with their copies. */
    int kill[2] = {2, 5};
    for (int k = 0; k < 2; k++) {
        tblock_t *x = &b[kill[k]];
        gm_stats_t s0 = pool_stats_of(pool);
        CHECK_OK(gm_free(pool, x->p, NULL));
        gm_stats_t s1 = pool_stats_of(pool);
        CHECK(s1.offloaded == s0.offloaded - x->n);
        CHECK(s1.allocated == s0.allocated - x->n);
        CHECK(s1.live_blocks == s0.live_blocks - 1);
        /* Its copy's share of a host segment goes back (the segment with
         * the last block copied into it). */
        CHECK(s1.host_allocated <= s0.host_allocated);
        CHECK_RC(gm_free(pool, x->p, NULL), GM_DOUBLE_FREE);
        size_t bs;
        CHECK(gm_block_size(pool, x->p, &bs) != GM_OK);
        x->p = NULL;
        CHECK_OK(gm_pool_check(pool));
    }
    bytes = tag_bytes(b, nb, tag_a, NULL);
    gm_tag_info_t ti = tag_info_of(pool, tag_a);
    CHECK(ti.offloaded_blocks == N - 2 && ti.offloaded_bytes == bytes);
    CHECK(ti.resident_blocks == 0);

    /* Allocate into the offloaded tag: resident, usable at once. */
    size_t newn[2] = {3 * MiB + 1, 500};
    size_t first_new = nb;
    for (int k = 0; k < 2; k++) {
        b[nb] = (tblock_t){NULL, newn[k], tag_a, 950 + k, NULL};
        CHECK_OK(gm_alloc_tagged(pool, newn[k], NULL, tag_a, &b[nb].p));
        CHECK_OK(dev_fill(pool, b[nb].p, newn[k], b[nb].seed, NULL));
        nb++;
    }
    ti = tag_info_of(pool, tag_a);
    CHECK(ti.resident_blocks == 2 && ti.resident_bytes == newn[0] + newn[1]);
    CHECK(ti.offloaded_blocks == N - 2 && ti.offloaded_bytes == bytes);
    CHECK(pool_stats_of(pool).offloaded == bytes);
    CHECK(check_all(pool, b + first_new, 2, "new blocks in an offloaded tag"));
    /* The restore brings back the old ones and leaves the new ones alone. */
    CHECK_OK(gm_restore(pool, tag_a, NULL));
    CHECK_OK(gm_pool_check(pool));
    ti = tag_info_of(pool, tag_a);
    CHECK(ti.resident_blocks == nb - 2 && ti.offloaded_blocks == 0);
    CHECK(check_all(pool, b, nb, "restore after alloc into offloaded tag"));

    /* Offload, allocate into it, offload again: the new block is taken too. */
    CHECK_OK(gm_offload(pool, tag_a, 0, NULL));
    b[nb] = (tblock_t){NULL, 2 * MiB + 300, tag_a, 990, NULL};
    CHECK_OK(gm_alloc_tagged(pool, b[nb].n, NULL, tag_a, &b[nb].p));
    CHECK_OK(dev_fill(pool, b[nb].p, b[nb].n, b[nb].seed, NULL));
    nb++;
    CHECK_OK(gm_offload(pool, tag_a, 0, NULL));
    ti = tag_info_of(pool, tag_a);
    CHECK(ti.resident_blocks == 0 && ti.offloaded_blocks == nb - 2);
    CHECK(ti.offloaded_bytes == tag_bytes(b, nb, tag_a, NULL));
    CHECK(pool_stats_of(pool).offloaded == tag_bytes(b, nb, tag_a, NULL));
    CHECK_OK(gm_restore(pool, tag_a, NULL));
    CHECK(check_all(pool, b, nb, "second offload took the new block"));
    CHECK_OK(gm_pool_check(pool));

    for (size_t i = 0; i < nb; i++) CHECK_OK(gm_free(pool, b[i].p, NULL));
    CHECK_OK(gm_free(pool, u, NULL));
    gm_stats_t st = pool_stats_of(pool);
    CHECK(st.allocated == 0 && st.offloaded == 0);
}

/* Small blocks freed into this thread's cache keep no tag: a block taken
 * back from the cache belongs to its new owner's tag, and an offload never
 * pulls the pages from under a block the cache hands out later. */
static void test_thread_cache(gm_pool_t *pool)
{
    enum { N = 8 };
    void *p[N], *q[N];
    /* Tagged blocks freed (to the cache), then untagged ones of the same
     * size on the same stream (likely the same addresses). */
    for (int i = 0; i < N; i++) CHECK_OK(gm_alloc_tagged(pool, 1000, NULL, tag_b, &p[i]));
    for (int i = 0; i < N; i++) CHECK_OK(gm_free(pool, p[i], NULL));
    gm_tag_info_t ti = tag_info_of(pool, tag_b);
    CHECK(ti.resident_blocks == 0 && ti.resident_bytes == 0);
    for (int i = 0; i < N; i++) {
        CHECK_OK(gm_alloc(pool, 1000, NULL, &q[i]));
        CHECK_OK(dev_fill(pool, q[i], 1000, 3000 + i, NULL));
    }
    CHECK(tag_info_of(pool, tag_b).resident_blocks == 0);
    CHECK_OK(gm_offload(pool, tag_b, 0, NULL));
    CHECK(pool_stats_of(pool).offloaded == 0);
    int ok = 1;
    for (int i = 0; i < N; i++) ok &= dev_check(pool, q[i], 1000, 3000 + i, NULL, "cache reuse");
    CHECK(ok);
    CHECK_OK(gm_restore(pool, tag_b, NULL));

    /* The other way: untagged freed, tagged taken from the cache. */
    for (int i = 0; i < N; i++) CHECK_OK(gm_free(pool, q[i], NULL));
    for (int i = 0; i < N; i++) {
        CHECK_OK(gm_alloc_tagged(pool, 1000, NULL, tag_b, &p[i]));
        CHECK_OK(dev_fill(pool, p[i], 1000, 4000 + i, NULL));
    }
    ti = tag_info_of(pool, tag_b);
    CHECK(ti.resident_blocks == N && ti.resident_bytes == N * 1000);
    CHECK_OK(gm_offload(pool, tag_b, 0, NULL));
    ti = tag_info_of(pool, tag_b);
    CHECK(ti.offloaded_blocks == N && ti.offloaded_bytes == N * 1000);
    CHECK(pool_stats_of(pool).offloaded == N * 1000);
    CHECK_OK(gm_restore(pool, tag_b, NULL));
    ok = 1;
    for (int i = 0; i < N; i++) ok &= dev_check(pool, p[i], 1000, 4000 + i, NULL, "tagged from cache");
    CHECK(ok);

    /* Tagged blocks freed to the cache, then the tag offloaded while they
     * wait there: a later allocation served from the cache must be usable
     * memory (its page not released under it). */
    void *big = NULL;
    CHECK_OK(gm_alloc_tagged(pool, 4 * MiB, NULL, tag_b, &big)); /* keeps the tag non-empty */
    CHECK_OK(dev_fill(pool, big, 4 * MiB, 4100, NULL));
    for (int i = 0; i < N; i++) CHECK_OK(gm_free(pool, p[i], NULL));
    CHECK_OK(gm_offload(pool, tag_b, 0, NULL));
    ti = tag_info_of(pool, tag_b);
    CHECK(ti.offloaded_blocks == 1 && ti.offloaded_bytes == 4 * MiB && ti.resident_blocks == 0);
    CHECK(pool_stats_of(pool).offloaded == 4 * MiB);
    for (int i = 0; i < N; i++) {
        CHECK_OK(gm_alloc(pool, 1000, NULL, &q[i]));
        CHECK_OK(gm_memset(pool, q[i], 0x3c, 1000, NULL));
        CHECK_OK(dev_fill(pool, q[i], 1000, 5000 + i, NULL));
    }
    ok = 1;
    for (int i = 0; i < N; i++) ok &= dev_check(pool, q[i], 1000, 5000 + i, NULL, "cache after offload");
    CHECK(ok);
    CHECK_OK(gm_restore(pool, tag_b, NULL));
    CHECK(dev_check(pool, big, 4 * MiB, 4100, NULL, "big of tag_b"));
    ok = 1;
    for (int i = 0; i < N; i++) ok &= dev_check(pool, q[i], 1000, 5000 + i, NULL, "cache after restore");
    CHECK(ok);
    for (int i = 0; i < N; i++) CHECK_OK(gm_free(pool, q[i], NULL));
    CHECK_OK(gm_free(pool, big, NULL));
    CHECK_OK(gm_pool_check(pool));
    gm_stats_t st = pool_stats_of(pool);
    CHECK(st.allocated == 0 && st.offloaded == 0 && st.live_blocks == 0);
}

/* Discard: no copy, no host memory; the memory is usable after restore. */
static void discard_round(gm_pool_t *pool, gm_tag_t tag, unsigned flags, const char *what)
{
    static const size_t sizes[] = {4 * MiB, 1000, 3 * MiB + 9, 64 * KiB, 6 * MiB};
    enum { N = sizeof sizes / sizeof sizes[0] };
    tblock_t b[N], u[N];
    size_t bytes = 0;
    for (int i = 0; i < N; i++) {
        b[i] = (tblock_t){NULL, sizes[i], tag, 7000 + i, NULL};
        CHECK_OK(gm_alloc_tagged(pool, sizes[i], NULL, tag, &b[i].p));
        CHECK_OK(dev_fill(pool, b[i].p, sizes[i], b[i].seed, NULL));
        u[i] = (tblock_t){NULL, 1000 + 3000 * i, GM_TAG_NONE, 7100 + i, NULL};
        CHECK_OK(gm_alloc(pool, u[i].n, NULL, &u[i].p));
        CHECK_OK(dev_fill(pool, u[i].p, u[i].n, u[i].seed, NULL));
        bytes += sizes[i];
    }
    gm_stats_t st0 = pool_stats_of(pool);
    CHECK_OK(gm_offload(pool, tag, flags, NULL));
    CHECK_OK(gm_pool_check(pool));
    gm_stats_t st1 = pool_stats_of(pool);
    if (st1.backend_calls[GM_CALL_memcpy] != st0.backend_calls[GM_CALL_memcpy])
        fprintf(stderr, "  %s: offload made %" PRIu64 " copies\n", what,
                st1.backend_calls[GM_CALL_memcpy] - st0.backend_calls[GM_CALL_memcpy]);
    CHECK(st1.backend_calls[GM_CALL_memcpy] == st0.backend_calls[GM_CALL_memcpy]);
    CHECK(st1.host_allocated == st0.host_allocated);
    CHECK(st1.host_reserved == st0.host_reserved);
    CHECK(st1.reserved + 2 * PAGE <= st0.reserved); /* the 4 and 6 MiB blocks' pages at least */
    CHECK(st1.offload_count - st0.offload_count == N);
    CHECK(st1.allocated == st0.allocated);
    gm_tag_info_t ti = tag_info_of(pool, tag);
    CHECK(ti.resident_blocks == 0 && ti.resident_bytes == 0);
    CHECK(ti.offloads == 1);
    CHECK(check_all(pool, u, N, what)); /* neighbours kept */
    st1 = pool_stats_of(pool);
    CHECK_OK(gm_restore(pool, tag, NULL));
    CHECK_OK(gm_pool_check(pool));
    gm_stats_t st2 = pool_stats_of(pool);
    CHECK(st2.backend_calls[GM_CALL_memcpy] == st1.backend_calls[GM_CALL_memcpy]);
    CHECK(st2.host_allocated == st0.host_allocated);
    CHECK(st2.offloaded == 0);
    ti = tag_info_of(pool, tag);
    CHECK(ti.resident_blocks == N && ti.resident_bytes == bytes && ti.offloaded_blocks == 0);
    CHECK(ti.restores == 1);
    /* Usable: fills and copies work, and read back. */
    for (int i = 0; i < N; i++) {
        CHECK_OK(gm_memset(pool, b[i].p, 0x5d, b[i].n, NULL));
        CHECK(dev_check_byte(pool, b[i].p, b[i].n, 0x5d, NULL, what));
        b[i].seed += 50;
        CHECK_OK(dev_fill(pool, b[i].p, b[i].n, b[i].seed, NULL));
    }
    CHECK_OK(gm_memcpy(pool, b[0].p, b[4].p, 4 * MiB, NULL));
    b[0].seed = b[4].seed; /* b[0] now holds the first 4 MiB of b[4]'s pattern */
    CHECK(check_all(pool, b, N, what));
    CHECK(check_all(pool, u, N, what));
    for (int i = 0; i < N; i++) {
        CHECK_OK(gm_free(pool, b[i].p, NULL));
        CHECK_OK(gm_free(pool, u[i].p, NULL));
    }
}

static void test_discard(void)
{
    /* Fresh pools so that the tag counters start at 0. */
    gm_pool_t *pool = offload_pool((size_t)1 << 30);
    if (!pool) { CHECK(0); return; }
    discard_round(pool, tag_kv, 0, "GM_TAG_DISCARD");
    gm_pool_destroy(pool);
    pool = offload_pool((size_t)1 << 30);
    if (!pool) { CHECK(0); return; }
    discard_round(pool, tag_a, GM_OFFLOAD_DISCARD, "GM_OFFLOAD_DISCARD");
    gm_pool_destroy(pool);
}

/* ---- bad input, holds, per-pool state ---------------------------------------------- */

static void test_invalid(gm_pool_t *pool)
{
    gm_tag_info_t ti = GM_TAG_INFO_INIT;
    gm_tag_t never = 0xdeadbeefu;
    /* Tag none or never made. */
    CHECK_RC(gm_offload(pool, GM_TAG_NONE, 0, NULL), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_offload(pool, never, 0, NULL), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_restore(pool, GM_TAG_NONE, NULL), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_restore(pool, never, NULL), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_tag_acquire(pool, GM_TAG_NONE, NULL), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_tag_acquire(pool, never, NULL), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_tag_release(pool, GM_TAG_NONE, NULL), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_tag_release(pool, never, NULL), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_tag_info(pool, GM_TAG_NONE, &ti), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_tag_info(pool, never, &ti), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_tag_info(pool, GM_TAGS_MAX + 1, &ti), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_tag_info(pool, tag_a, NULL), GM_INVALID_ARGUMENT);
    gm_tag_info_t small = GM_TAG_INFO_INIT;
    small.size = 4;
    CHECK_RC(gm_tag_info(pool, tag_a, &small), GM_INVALID_ARGUMENT);
    /* Unknown offload flags. */
    CHECK_RC(gm_offload(pool, tag_a, 0x80, NULL), GM_INVALID_ARGUMENT);

    /* Release without a hold (an evictable tag: the protocol's own). */
    gm_tag_t tag_h = new_tag("basic.held", GM_TAG_EVICTABLE);
    CHECK_RC(gm_tag_release(pool, tag_h, NULL), GM_INVALID_STATE);
    CHECK_OK(gm_tag_acquire(pool, tag_h, NULL));
    CHECK_OK(gm_tag_acquire(pool, tag_h, NULL));
    CHECK(tag_info_of(pool, tag_h).holds == 2);
    CHECK_OK(gm_tag_release(pool, tag_h, NULL));
    CHECK(tag_info_of(pool, tag_h).holds == 1);
    /* A held tag is offloaded all the same; acquire restores. */
    void *p = NULL;
    CHECK_OK(gm_alloc_tagged(pool, 3 * MiB, NULL, tag_h, &p));
    CHECK_OK(dev_fill(pool, p, 3 * MiB, 8000, NULL));
    CHECK_OK(gm_offload(pool, tag_h, 0, NULL));
    ti = tag_info_of(pool, tag_h);
    CHECK(ti.offloaded_blocks == 1 && ti.resident_blocks == 0 && ti.holds == 1);
    CHECK_OK(gm_tag_acquire(pool, tag_h, NULL)); /* restores */
    ti = tag_info_of(pool, tag_h);
    CHECK(ti.offloaded_blocks == 0 && ti.resident_blocks == 1 && ti.holds == 2);
    CHECK(ti.restores == 1);
    CHECK(dev_check(pool, p, 3 * MiB, 8000, NULL, "acquire restored"));
    CHECK_OK(gm_tag_release(pool, tag_h, NULL));
    CHECK_OK(gm_tag_release(pool, tag_h, NULL));
    CHECK(tag_info_of(pool, tag_h).holds == 0);
    CHECK_RC(gm_tag_release(pool, tag_h, NULL), GM_INVALID_STATE);
    CHECK(tag_info_of(pool, tag_h).holds == 0);
    CHECK_OK(gm_free(pool, p, NULL));

    /* A destroyed pool, and something that is not a pool. */
    gm_pool_t *dead = offload_pool(256 * MiB);
    if (dead) {
        gm_pool_destroy(dead);
        CHECK_RC(gm_offload(dead, tag_a, 0, NULL), GM_INVALID_ARGUMENT);
        CHECK_RC(gm_restore(dead, tag_a, NULL), GM_INVALID_ARGUMENT);
        CHECK_RC(gm_tag_acquire(dead, tag_a, NULL), GM_INVALID_ARGUMENT);
        CHECK_RC(gm_tag_release(dead, tag_a, NULL), GM_INVALID_ARGUMENT);
        CHECK_RC(gm_tag_info(dead, tag_a, &ti), GM_INVALID_ARGUMENT);
        void *q = (void *)1;
        CHECK_RC(gm_alloc_tagged(dead, 100, NULL, tag_a, &q), GM_INVALID_ARGUMENT);
    }
    /* Readable zeroes, aligned as a pool would be. */
    void *fake = aligned_alloc(4096, 64 * KiB);
    if (fake) {
        memset(fake, 0, 64 * KiB);
        gm_pool_t *notpool = (gm_pool_t *)fake;
        CHECK_RC(gm_offload(notpool, tag_a, 0, NULL), GM_INVALID_ARGUMENT);
        CHECK_RC(gm_restore(notpool, tag_a, NULL), GM_INVALID_ARGUMENT);
        CHECK_RC(gm_tag_acquire(notpool, tag_a, NULL), GM_INVALID_ARGUMENT);
        CHECK_RC(gm_tag_info(notpool, tag_a, &ti), GM_INVALID_ARGUMENT);
        free(fake);
    }
    /* NULL pool: not tested; the header's rule for every entry point is
     * "NULL = the process-default pool", which would be created here. */
    CHECK_OK(gm_pool_check(pool));
}

/* Tags are process-wide, their blocks per pool: offloading in one pool
 * leaves another pool's blocks of the same tag resident.  Destroying a pool
 * with offloaded blocks releases them (ASan: no leak). */
static void test_two_pools(gm_pool_t *pool)
{
    gm_pool_t *other = offload_pool(512 * MiB);
    if (!other) { CHECK(0); return; }
    tblock_t x = {NULL, 3 * MiB + 17, tag_a, 8100, NULL}, y = {NULL, 5 * MiB, tag_a, 8101, NULL};
    CHECK_OK(gm_alloc_tagged(pool, x.n, NULL, tag_a, &x.p));
    CHECK_OK(gm_alloc_tagged(other, y.n, NULL, tag_a, &y.p));
    CHECK_OK(dev_fill(pool, x.p, x.n, x.seed, NULL));
    CHECK_OK(dev_fill(other, y.p, y.n, y.seed, NULL));
    CHECK_OK(gm_offload(pool, tag_a, 0, NULL));
    CHECK(tag_info_of(pool, tag_a).offloaded_blocks == 1);
    gm_tag_info_t ti = tag_info_of(other, tag_a);
    CHECK(ti.resident_blocks == 1 && ti.resident_bytes == y.n && ti.offloaded_blocks == 0);
    CHECK(pool_stats_of(other).offloaded == 0);
    gm_stats_t ps = GM_STATS_INIT;
    CHECK_OK(gm_process_stats(&ps));
    CHECK(ps.offloaded >= x.n); /* the sum over the pools of the process */
    CHECK(dev_check(other, y.p, y.n, y.seed, NULL, "other pool"));
    CHECK_OK(gm_offload(other, tag_a, 0, NULL));
    CHECK(tag_info_of(other, tag_a).offloaded_blocks == 1);
    /* Destroyed with the block offloaded. */
    gm_pool_destroy(other);
    CHECK_OK(gm_restore(pool, tag_a, NULL));
    CHECK(dev_check(pool, x.p, x.n, x.seed, NULL, "first pool"));
    CHECK_OK(gm_free(pool, x.p, NULL));
    CHECK_OK(gm_pool_check(pool));
}

/* A tag holding a published block is refused whole: nothing moves. */
static void test_shared_refused(gm_pool_t *pool)
{
    gm_tag_t t = new_tag("basic.shared", 0);
    char path[108];
    snprintf(path, sizeof path, "%s/gm-offload-basic-%d.sock",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    unlink(path);
    gm_share_server_t *srv = NULL;
    int rc = gm_share_listen(pool, path, NULL, &srv);
    CHECK_OK(rc);
    if (rc != GM_OK) return;
    tblock_t b[3];
    b[0] = (tblock_t){NULL, 6 * MiB, t, 8200, NULL};
    b[1] = (tblock_t){NULL, 4 * MiB + 100, t, 8201, NULL};
    b[2] = (tblock_t){NULL, 2 * MiB, t, 8202, NULL};
    /* gm_alloc_shareable is never tagged (the header), even under a scope. */
    gm_tag_t old = gm_tag_scope(t);
    void *sh = NULL;
    CHECK_OK(gm_alloc_shareable(pool, 2 * MiB, NULL, &sh));
    gm_tag_scope(old);
    CHECK(tag_info_of(pool, t).resident_blocks == 0);
    CHECK_OK(gm_free(pool, sh, NULL));
    /* A tagged block whose whole pages can be published all the same. */
    CHECK_OK(gm_alloc_tagged(pool, b[0].n, NULL, t, &b[0].p));
    CHECK_OK(gm_alloc_tagged(pool, b[1].n, NULL, t, &b[1].p));
    CHECK_OK(gm_alloc_tagged(pool, b[2].n, NULL, t, &b[2].p));
    for (int i = 0; i < 3; i++) CHECK_OK(dev_fill(pool, b[i].p, b[i].n, b[i].seed, NULL));
    gm_tag_info_t ti = tag_info_of(pool, t);
    CHECK(ti.resident_blocks == 3);
    if (ti.resident_blocks != 3) {
        fprintf(stderr, "  gm_alloc_shareable under gm_tag_scope: the tag holds %" PRIu64
                " blocks, want 3 (the shareable block was not tagged); the refusal of a "
                "tag with a published block cannot be reached, skipped\n", ti.resident_blocks);
        CHECK_OK(gm_share_close(srv));
        for (int i = 0; i < 3; i++) CHECK_OK(gm_free(pool, b[i].p, NULL));
        unlink(path);
        return;
    }
    /* Shareable but not published: an ordinary block, offloaded. */
    CHECK_OK(gm_offload(pool, t, 0, NULL));
    CHECK(tag_info_of(pool, t).offloaded_blocks == 3);
    CHECK_OK(gm_restore(pool, t, NULL));
    CHECK(check_all(pool, b, 3, "shareable, unpublished"));
    /* Published: refused, nothing moved. */
    /* The whole pages inside b[0] (6 MiB holds at least two). */
    uintptr_t page = 2 * MiB, in = ((uintptr_t)b[0].p + page - 1) & ~(page - 1);
    CHECK_OK(gm_share_publish(srv, "offload-basic", (void *)in, page, GM_SHARE_READ_WRITE, NULL, NULL));
    gm_stats_t st0 = pool_stats_of(pool);
    CHECK_RC(gm_offload(pool, t, 0, NULL), GM_NOT_SUPPORTED);
    CHECK(gm_last_error()[0] != '\0');
    gm_stats_t st1 = pool_stats_of(pool);
    CHECK(st1.offloaded == 0 && st1.offload_count == st0.offload_count);
    CHECK(st1.reserved == st0.reserved);
    ti = tag_info_of(pool, t);
    CHECK(ti.resident_blocks == 3 && ti.offloaded_blocks == 0);
    CHECK(ti.offloads == 1);
    CHECK(check_all(pool, b, 3, "published tag refused"));
    CHECK_OK(gm_pool_check(pool));
    /* Also with the discard flag. */
    CHECK_RC(gm_offload(pool, t, GM_OFFLOAD_DISCARD, NULL), GM_NOT_SUPPORTED);
    CHECK(tag_info_of(pool, t).resident_blocks == 3);
    CHECK(check_all(pool, b, 3, "published tag refused (discard)"));
    /* Once the server is closed and the block freed, the rest offloads. */
    CHECK_OK(gm_share_close(srv));
    CHECK_OK(gm_free(pool, b[0].p, NULL));
    b[0].p = NULL;
    CHECK_OK(gm_offload(pool, t, 0, NULL));
    ti = tag_info_of(pool, t);
    CHECK(ti.offloaded_blocks == 2 && ti.resident_blocks == 0);
    CHECK_OK(gm_restore(pool, t, NULL));
    CHECK(check_all(pool, b, 3, "after unpublish"));
    CHECK_OK(gm_free(pool, b[1].p, NULL));
    CHECK_OK(gm_free(pool, b[2].p, NULL));
    CHECK_OK(gm_pool_check(pool));
    unlink(path);
}

/* While a tag sleeps, other allocations never land in its blocks' ranges
 * (a restore maps them at the same addresses), even when they take the free
 * rest of a page the offload gave back; a trim in between changes nothing. */
static void test_no_overlap(gm_pool_t *pool)
{
    enum { NT = 10, NU = 160 };
    tblock_t t[NT];
    static tblock_t u[NU];
    uint64_t rng = 42;
    for (int i = 0; i < NT; i++) {
        size_t n = 1000 + rng_next(&rng) % (3 * MiB);
        t[i] = (tblock_t){NULL, n, tag_a, 9000 + (uint64_t)i, NULL};
        CHECK_OK(gm_alloc_tagged(pool, n, NULL, tag_a, &t[i].p));
        CHECK_OK(dev_fill(pool, t[i].p, n, t[i].seed, NULL));
    }
    CHECK_OK(gm_offload(pool, tag_a, 0, NULL));
    CHECK_OK(gm_trim(pool, 0, NULL));
    int overlaps = 0;
    for (int i = 0; i < NU; i++) {
        size_t n = rng_next(&rng) % 4 == 0 ? MiB + rng_next(&rng) % (3 * MiB)
                                          : 256 + rng_next(&rng) % (200 * KiB);
        u[i] = (tblock_t){NULL, n, GM_TAG_NONE, 9100 + (uint64_t)i, NULL};
        CHECK_OK(gm_alloc(pool, n, NULL, &u[i].p));
        if (!u[i].p) continue;
        CHECK_OK(dev_fill(pool, u[i].p, n, u[i].seed, NULL));
        uintptr_t lo = (uintptr_t)u[i].p, hi = lo + n;
        for (int j = 0; j < NT; j++) {
            uintptr_t tlo = (uintptr_t)t[j].p, thi = tlo + t[j].n;
            if (lo < thi && tlo < hi) {
                overlaps++;
                fprintf(stderr, "  block %p+%zu lies in offloaded block %p+%zu\n", u[i].p, n,
                        t[j].p, t[j].n);
            }
        }
        if (i == NU / 2) CHECK_OK(gm_trim(pool, 0, NULL));
    }
    CHECK(overlaps == 0);
    CHECK_OK(gm_pool_check(pool));
    CHECK(tag_info_of(pool, tag_a).offloaded_blocks == NT);
    CHECK_OK(gm_restore(pool, tag_a, NULL));
    CHECK(check_all(pool, t, NT, "restored beside new blocks"));
    CHECK(check_all(pool, u, NU, "new blocks after the restore"));
    /* Free every other new block, offload and restore again. */
    for (int i = 0; i < NU; i += 2) {
        CHECK_OK(gm_free(pool, u[i].p, NULL));
        u[i].p = NULL;
    }
    CHECK_OK(gm_offload(pool, tag_a, 0, NULL));
    CHECK(check_all(pool, u, NU, "new blocks beside the second offload"));
    CHECK_OK(gm_restore(pool, tag_a, NULL));
    CHECK(check_all(pool, t, NT, "second restore"));
    for (int i = 0; i < NU; i++) CHECK_OK(gm_free(pool, u[i].p, NULL));
    for (int i = 0; i < NT; i++) CHECK_OK(gm_free(pool, t[i].p, NULL));
    CHECK_OK(gm_pool_check(pool));
}

/* Sim: a tagged block shares a page with a neighbour freed on a held
 * stream (its work still in flight over the page).  The offload may not
 * unmap that page under the work: it succeeds (the page stays) or fails
 * cleanly; nothing is lost, and once the stream passes a trim frees it. */
static void test_free_neighbour_in_flight(void)
{
    gm_pool_t *pool = offload_pool(512 * MiB);
    if (!pool) { CHECK(0); return; }
    gm_stream_t H;
    CHECK_OK(gm_stream_create(pool, &H));
    void *y = NULL, *x = NULL;
    CHECK_OK(gm_alloc(pool, MiB, H, &y));                 /* the neighbour, first in the page */
    CHECK_OK(gm_alloc_tagged(pool, 512 * KiB, NULL, tag_a, &x)); /* likely the same page */
    CHECK_OK(dev_fill(pool, x, 512 * KiB, 9500, NULL));
    CHECK_OK(gm_sim_hold_stream(pool, H, 1));
    CHECK_OK(gm_memset(pool, y, 0x44, MiB, H));
    CHECK_OK(gm_free(pool, y, H));
    int rc = gm_offload(pool, tag_a, 0, NULL);
    CHECK(rc == GM_OK || rc == GM_NOT_READY || rc == GM_BACKEND);
    CHECK(strstr(gm_last_error(), "stream-rule violation") == NULL);
    CHECK_OK(gm_pool_check(pool));
    gm_tag_info_t ti = tag_info_of(pool, tag_a);
    CHECK(ti.resident_blocks + ti.offloaded_blocks == 1);
    CHECK_OK(gm_sim_hold_stream(pool, H, 0));
    if (rc != GM_OK) CHECK_OK(gm_offload(pool, tag_a, 0, NULL));
    CHECK_OK(gm_trim(pool, 0, NULL));
    gm_stats_t st = pool_stats_of(pool);
    CHECK(st.reserved == 0);
    if (st.reserved)
        fprintf(stderr, "  free neighbour in flight: offload said %s; after the stream passed, "
                "a second offload and gm_trim(0): reserved %" PRIu64 ", mapped %" PRIu64
                ", live blocks %" PRIu64 " (all offloaded)\n", gm_errname(rc), st.reserved,
                st.mapped, st.live_blocks);
    CHECK_OK(gm_restore(pool, tag_a, NULL));
    CHECK(dev_check(pool, x, 512 * KiB, 9500, NULL, "beside a neighbour freed in flight"));
    CHECK_OK(gm_free(pool, x, NULL));
    CHECK_OK(gm_stream_destroy(pool, H));
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
}

/* A pool that gives memory back at every free (release_threshold 0), and
 * the new stats fields in the JSON output. */
static void test_release_threshold_and_json(void)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = test_backend();
    cfg.sim_capacity = 512 * MiB;
    cfg.limit = cfg.backend == GM_BACKEND_SIM ? 0 : 512 * MiB;
    cfg.release_threshold = 0;
    gm_pool_t *pool = pool_from(&cfg);
    if (!pool) { CHECK(0); return; }
    tblock_t b[4];
    static const size_t sz[4] = {3 * MiB + 1, 700, 2 * MiB, 100 * KiB};
    void *u = NULL;
    for (int i = 0; i < 4; i++) {
        b[i] = (tblock_t){NULL, sz[i], tag_a, 9600 + (uint64_t)i, NULL};
        CHECK_OK(gm_alloc_tagged(pool, sz[i], NULL, tag_a, &b[i].p));
        CHECK_OK(dev_fill(pool, b[i].p, sz[i], b[i].seed, NULL));
        if (i == 1) CHECK_OK(gm_alloc(pool, 5000, NULL, &u));
    }
    CHECK_OK(gm_offload(pool, tag_a, 0, NULL));
    CHECK_OK(gm_free(pool, u, NULL)); /* a free that trims, with the tag asleep */
    CHECK_OK(gm_free(pool, b[1].p, NULL)); /* an offloaded block freed */
    b[1].p = NULL;
    /* The small neighbour may still sit in this thread's cache of small
     * blocks (live in the pool's eyes) until a trim flushes it. */
    gm_stats_t st;
    CHECK_OK(gm_trim(pool, 0, NULL));
    st = pool_stats_of(pool);
    CHECK(st.reserved == 0);
    if (st.reserved)
        fprintf(stderr, "  release_threshold 0: and after gm_trim(0): reserved %" PRIu64 "\n",
                st.reserved);
    CHECK(st.offloaded == sz[0] + sz[2] + sz[3]);
    char json[16384];
    size_t len = 0;
    CHECK_OK(gm_stats_json(&st, json, sizeof json, &len));
    char want[64];
    snprintf(want, sizeof want, "\"offloaded\":%" PRIu64, st.offloaded);
    const char *fields[] = {"\"offload_count\"", "\"restore_count\"", "\"offload_bytes_total\"",
                            "\"restore_bytes_total\"", "\"evictions\""};
    int has = strstr(json, "\"offloaded\"") != NULL;
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) has &= strstr(json, fields[i]) != NULL;
    CHECK(has);
    if (strstr(json, want) == NULL && strstr(json, "\"offloaded\": ") == NULL)
        fprintf(stderr, "  JSON has no %s: %.300s\n", want, json);
    CHECK_OK(gm_restore(pool, tag_a, NULL));
    CHECK(check_all(pool, b, 4, "release_threshold 0"));
    for (int i = 0; i < 4; i++) CHECK_OK(gm_free(pool, b[i].p, NULL));
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
}

/* Sim: a tagged allocation served from pinned host memory by the sysmem
 * fallback is not device memory: an offload must not lose or break it. */
static void test_sysmem_tagged(void)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = GM_BACKEND_SIM;
    cfg.sim_capacity = 512 * MiB;
    cfg.limit = 8 * MiB;
    cfg.flags = GM_POOL_SYSMEM_FALLBACK;
    gm_pool_t *pool = pool_from(&cfg);
    if (!pool) { CHECK(0); return; }
    tblock_t b[2] = {{NULL, 6 * MiB, tag_a, 9700, NULL}, {NULL, 5 * MiB, tag_a, 9701, NULL}};
    CHECK_OK(gm_alloc_tagged(pool, b[0].n, NULL, tag_a, &b[0].p)); /* device */
    CHECK_OK(gm_alloc_tagged(pool, b[1].n, NULL, tag_a, &b[1].p)); /* over the limit: sysmem */
    CHECK(pool_stats_of(pool).sysmem_allocated == b[1].n);
    for (int i = 0; i < 2; i++) CHECK_OK(dev_fill(pool, b[i].p, b[i].n, b[i].seed, NULL));
    int rc = gm_offload(pool, tag_a, 0, NULL);
    CHECK_OK(rc);
    CHECK_OK(gm_pool_check(pool));
    CHECK(dev_check(pool, b[1].p, b[1].n, b[1].seed, NULL, "sysmem block beside an offload"));
    CHECK_OK(gm_restore(pool, tag_a, NULL));
    CHECK(check_all(pool, b, 2, "sysmem and device blocks of one tag"));
    for (int i = 0; i < 2; i++) CHECK_OK(gm_free(pool, b[i].p, NULL));
    gm_stats_t st = pool_stats_of(pool);
    CHECK(st.allocated == 0 && st.sysmem_allocated == 0 && st.offloaded == 0);
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
}

/* GM_TAGS_MAX names per process; past it GM_LIMIT, old names still work. */
static void test_tag_limit(void)
{
    char name[32];
    unsigned made = 0;
    int rc = GM_OK;
    for (unsigned i = 0; i < 2 * GM_TAGS_MAX && rc == GM_OK; i++) {
        snprintf(name, sizeof name, "basic.limit.%u", i);
        gm_tag_t t;
        rc = gm_tag_get(name, 0, &t);
        if (rc == GM_OK) made++;
    }
    CHECK_RC(rc, GM_LIMIT);
    CHECK(tags_made + made == GM_TAGS_MAX);
    if (tags_made + made != GM_TAGS_MAX)
        fprintf(stderr, "  tag limit: %u tags made in all, want %u\n", tags_made + made,
                GM_TAGS_MAX);
    gm_tag_t t = 0;
    CHECK_OK(gm_tag_get("basic.weights", 0, &t));
    CHECK(t == tag_a);
    CHECK_OK(gm_tag_get("basic.limit.0", 0, &t));
    CHECK_RC(gm_tag_get("basic.one-more", 0, &t), GM_LIMIT);
}

int main(void)
{
    on_sim = test_backend() == GM_BACKEND_SIM;
    gm_pool_t *pool = offload_pool((size_t)1 << 30);
    REQUIRE(pool != NULL);
    test_tags(pool);
    test_alloc_tagged(pool);
    test_round(pool);
    test_only_tagged();
    test_free_and_alloc_while_offloaded(pool);
    test_thread_cache(pool);
    test_discard();
    test_invalid(pool);
    test_two_pools(pool);
    test_shared_refused(pool);
    test_no_overlap(pool);
    test_release_threshold_and_json();
    if (on_sim) {
        test_free_neighbour_in_flight();
        test_sysmem_tagged();
    }
    gm_stats_t st = pool_stats_of(pool);
    CHECK(st.allocated == 0 && st.live_blocks == 0 && st.offloaded == 0);
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
    test_tag_limit();
    scratch_free();
    return test_summary();
}
