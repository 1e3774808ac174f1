/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_offload_extents.c — a tagged block's allocation and its restores map
 * the pages wholly inside it as extents (one physical allocation of several
 * pages: pages.c), and what follows from that, through the public API:
 *   - the allocation and each restore of a 64 MiB tagged block make a
 *     handful of physical allocations, not one per 2 MiB page, and each
 *     offload gives them back with as few calls; every byte survives, the pool stays consistent, and
 *     cycles neither grow reserved memory nor leak;
 *   - a freed restored block's memory is reused in place, given back by
 *     gm_trim, and given back before the pool grows past its budget;
 *   - gm_alloc_shareable memory never lies on an extent, so it can always be
 *     published (the extent goes back first, or untouched address space is
 *     taken); publishing pages of a tagged block that lie on an extent
 *     (fresh or restored) is refused clearly;
 *   - a backend call that fails while an extent is made or given back (map,
 *     set_access, phys_create, unmap, phys_release) fails the call clearly,
 *     the data stays safe, and a later call finishes the work.
 * Device memory is only touched through gm_memcpy / gm_memset.  Runs on the
 * test backend (sim, or a GPU with GPUMEM_TEST_BACKEND=cuda; fail_nth works
 * on both).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpumem.h"
#include "../test.h"
#include "offload_util.h"

#define PAGE ((size_t)2 << 20)
#define BIG (64 * MiB + 4097) /* 33 pages, at least 31 wholly inside */

/* A pool of 1 GiB; NULL, with a failed CHECK, when it cannot be made. */
static gm_pool_t *extents_pool(void)
{
    gm_pool_t *pool = offload_pool((size_t)1 << 30);
    CHECK(pool != NULL);
    return pool;
}

static uint64_t calls(gm_pool_t *pool, int kind)
{
    return pool_stats_of(pool).backend_calls[kind];
}

/* Three blocks: untagged, tagged BIG with the tag called `tag` (the same
 * tag for the same name), untagged; filled.  Returns the tag. */
static gm_tag_t layout(gm_pool_t *pool, const char *tag, tblock_t b[3], uint64_t seed)
{
    gm_tag_t t = GM_TAG_NONE;
    CHECK_OK(gm_tag_get(tag, 0, &t));
    b[0] = (tblock_t){NULL, MiB, GM_TAG_NONE, seed, NULL};
    b[1] = (tblock_t){NULL, BIG, t, seed + 1, NULL};
    b[2] = (tblock_t){NULL, MiB + 17, GM_TAG_NONE, seed + 2, NULL};
    for (int i = 0; i < 3; i++) {
        CHECK_OK(gm_alloc_tagged(pool, b[i].n, NULL, b[i].tag, &b[i].p));
        CHECK_OK(dev_fill(pool, b[i].p, b[i].n, b[i].seed, NULL));
    }
    return t;
}

/* Free the tagged block of a layout (b[1].p is NULL after): where it was. */
static void *free_tagged(gm_pool_t *pool, tblock_t b[3])
{
    void *where = b[1].p;
    CHECK_OK(gm_free(pool, b[1].p, NULL));
    b[1].p = NULL;
    return where;
}

/* Offload and restore tag t, so that the layout's tagged block lies on
 * extents, then free that block: where it was. */
static void *free_restored(gm_pool_t *pool, gm_tag_t t, tblock_t b[3])
{
    CHECK_OK(gm_offload(pool, t, 0, NULL));
    CHECK_OK(gm_restore(pool, t, NULL));
    return free_tagged(pool, b);
}

static void free_all(gm_pool_t *pool, tblock_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (b[i].p) {
            CHECK_OK(gm_free(pool, b[i].p, NULL));
            b[i].p = NULL;
        }
}

/* ---- a restore makes few physical allocations, the offload gives them back ---- */

static void test_few_calls(void)
{
    gm_pool_t *pool = extents_pool();
    if (!pool) return;
    tblock_t b[3];
    /* A tagged block is made of extents at its allocation too: the two
     * small untagged blocks take a page or two, the tagged one a handful. */
    uint64_t f0 = calls(pool, GM_CALL_phys_create);
    gm_tag_t t = layout(pool, "extents.few", b, 100);
    uint64_t fresh = calls(pool, GM_CALL_phys_create) - f0;
    CHECK(fresh >= 3 && fresh <= 7);
    if (fresh > 7) fprintf(stderr, "  allocation: %" PRIu64 " phys_create (want 3..7)\n", fresh);
    uint64_t r00 = calls(pool, GM_CALL_phys_release);
    CHECK_OK(gm_offload(pool, t, 0, NULL));
    uint64_t first = calls(pool, GM_CALL_phys_release) - r00;
    CHECK(first >= 2 && first <= 5);
    if (first > 5) fprintf(stderr, "  first offload: %" PRIu64 " phys_release (want 2..5)\n", first);
    gm_stats_t off = pool_stats_of(pool);

    uint64_t c0 = calls(pool, GM_CALL_phys_create), a0 = calls(pool, GM_CALL_set_access);
    uint64_t m0 = calls(pool, GM_CALL_map);
    CHECK_OK(gm_restore(pool, t, NULL));
    uint64_t created = calls(pool, GM_CALL_phys_create) - c0;
    uint64_t access = calls(pool, GM_CALL_set_access) - a0, maps = calls(pool, GM_CALL_map) - m0;
    /* 31+ pages inside: two extents (16 + 15 or so) and at most two edge
     * pages; one page at a time would be 31+ of each. */
    CHECK(created >= 2 && created <= 5);
    CHECK(maps == created && access <= created);
    if (created > 5 || maps != created)
        fprintf(stderr, "  restore of %zu bytes: %" PRIu64 " phys_create, %" PRIu64 " map, %" PRIu64
                " set_access (want 2..5 each)\n", (size_t)BIG, created, maps, access);
    CHECK(check_all(pool, b, 3, "restored as extents"));
    CHECK_OK(gm_pool_check(pool));
    gm_stats_t on = pool_stats_of(pool);
    CHECK(on.reserved - off.reserved >= BIG - 2 * PAGE);

    /* The offload after it: one unmap and one release per extent. */
    uint64_t r0 = calls(pool, GM_CALL_phys_release), u0 = calls(pool, GM_CALL_unmap);
    CHECK_OK(gm_offload(pool, t, 0, NULL));
    uint64_t released = calls(pool, GM_CALL_phys_release) - r0, unmaps = calls(pool, GM_CALL_unmap) - u0;
    CHECK(released >= 2 && released <= 5 && unmaps <= released);
    if (released > 5)
        fprintf(stderr, "  offload: %" PRIu64 " phys_release, %" PRIu64 " unmap (want 2..5)\n",
                released, unmaps);
    gm_stats_t again = pool_stats_of(pool);
    CHECK(again.reserved == off.reserved);
    CHECK_OK(gm_pool_check(pool));

    /* Cycles with new data each time: no growth, every byte. */
    int cycles = scaled(20, 3);
    for (int c = 0; c < cycles; c++) {
        CHECK_OK(gm_restore(pool, t, NULL));
        CHECK(check_all(pool, b, 3, "cycle"));
        b[1].seed = 1000 + (uint64_t)c;
        CHECK_OK(dev_fill(pool, b[1].p, b[1].n, b[1].seed, NULL));
        CHECK_OK(gm_offload(pool, t, 0, NULL));
        CHECK(pool_stats_of(pool).reserved == off.reserved);
    }
    CHECK_OK(gm_restore(pool, t, NULL));
    CHECK(check_all(pool, b, 3, "after cycles"));
    CHECK_OK(gm_pool_check(pool));
    free_all(pool, b, 3);
    CHECK_OK(gm_trim(pool, 0, NULL));
    CHECK(pool_stats_of(pool).reserved == 0);
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
}

/* ---- freed extents: reused in place, trimmed, given back under pressure ---- */

static void test_freed(void)
{
    gm_pool_t *pool = extents_pool();
    if (!pool) return;
    tblock_t b[3];
    gm_tag_t t = layout(pool, "extents.freed", b, 200);
    void *where = free_restored(pool, t, b);
    CHECK_OK(gm_pool_check(pool));
    /* The same size again, untagged: best fit puts it where it was, on the
     * extents' own mappings, with no backend call. */
    uint64_t c0 = calls(pool, GM_CALL_phys_create), m0 = calls(pool, GM_CALL_map);
    void *p = NULL;
    CHECK_OK(gm_alloc(pool, BIG, NULL, &p));
    if (p == where) {
        CHECK(calls(pool, GM_CALL_phys_create) == c0 && calls(pool, GM_CALL_map) == m0);
    } else {
        fprintf(stderr, "  note: the block came back at %p, not %p; reuse in place not checked\n",
                p, where);
    }
    CHECK_OK(gm_memset(pool, p, 0x5a, BIG, NULL));
    CHECK(dev_check_byte(pool, p, BIG, 0x5a, NULL, "reused in place"));
    CHECK_OK(gm_pool_check(pool));
    CHECK_OK(gm_free(pool, p, NULL));

    /* gm_trim gives idle extents back. */
    size_t got = 0;
    CHECK_OK(gm_trim(pool, 0, &got));
    gm_stats_t st = pool_stats_of(pool);
    CHECK(got >= BIG - 2 * PAGE);
    CHECK(st.reserved <= st.active + 2 * PAGE);
    CHECK_OK(gm_pool_check(pool));

    /* Under a tight limit: idle extents go back before an allocation fails. */
    CHECK_OK(gm_restore(pool, t, NULL)); /* nothing offloaded: a no-op */
    tblock_t c[3];
    layout(pool, "extents.freed", c, 300);
    free_restored(pool, t, c);
    st = pool_stats_of(pool);
    /* Elsewhere in the address space, 48 MiB must come from the extents'
     * memory: a limit that leaves no room to grow. */
    CHECK_OK(gm_pool_set_limit(pool, st.reserved));
    void *q[3] = {NULL, NULL, NULL};
    CHECK_OK(gm_alloc(pool, 4 * MiB, NULL, &q[0])); /* fills the free space left of it */
    CHECK_OK(gm_alloc(pool, 48 * MiB, NULL, &q[1]));
    CHECK_OK(gm_alloc(pool, 8 * MiB, NULL, &q[2]));
    CHECK(pool_stats_of(pool).reserved <= st.reserved);
    for (int i = 0; i < 3; i++) {
        CHECK_OK(gm_memset(pool, q[i], 0x11 * (i + 1), i == 0 ? 4 * MiB : i == 1 ? 48 * MiB : 8 * MiB,
                           NULL));
    }
    CHECK(check_all(pool, c, 3, "next to reused extents"));
    CHECK(check_all(pool, b, 3, "first blocks"));
    CHECK_OK(gm_pool_check(pool));
    for (int i = 0; i < 3; i++) CHECK_OK(gm_free(pool, q[i], NULL));
    CHECK_OK(gm_pool_set_limit(pool, 0));
    free_all(pool, b, 3);
    free_all(pool, c, 3);
    CHECK_OK(gm_trim(pool, 0, NULL));
    CHECK(pool_stats_of(pool).reserved == 0);
    gm_pool_destroy(pool);
}

/* A share server and the path of its socket. */
typedef struct server {
    gm_share_server_t *srv;
    char path[108];
} server_t;

/* A pool and a share server of its own (socket in TMPDIR named by `what`);
 * NULL, with a failed CHECK, when either cannot be made. */
static gm_pool_t *pool_and_server(const char *what, server_t *s)
{
    gm_pool_t *pool = extents_pool();
    s->srv = NULL;
    if (!pool) return NULL;
    snprintf(s->path, sizeof s->path, "%s/gm-offload-extents-%s-%d.sock",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", what, (int)getpid());
    unlink(s->path);
    int rc = gm_share_listen(pool, s->path, NULL, &s->srv);
    CHECK_OK(rc);
    if (rc != GM_OK) {
        gm_pool_destroy(pool);
        return NULL;
    }
    return pool;
}

/* Close the server, free what is left, check that every page went back. */
static void server_and_pool_done(gm_pool_t *pool, server_t *s, void **ptrs, size_t n_ptrs,
                                 tblock_t *b, size_t nb)
{
    CHECK_OK(gm_share_close(s->srv));
    unlink(s->path);
    for (size_t i = 0; i < n_ptrs; i++) CHECK_OK(gm_free(pool, ptrs[i], NULL));
    free_all(pool, b, nb);
    CHECK_OK(gm_trim(pool, 0, NULL));
    CHECK(pool_stats_of(pool).reserved == 0);
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
}

/* A note (not a failure: best fit decides) when the block p, named `what`,
 * lies outside the freed BIG block at `where`. */
static void note_if_outside(const char *what, const void *p, const void *where)
{
    if ((uintptr_t)p < (uintptr_t)where || (uintptr_t)p >= (uintptr_t)where + BIG)
        fprintf(stderr, "  note: the %s lies at %p, outside the freed block %p\n", what, p, where);
}

/* ---- shareable memory never lies on an extent ------------------------------ */

static void test_shareable(void)
{
    server_t s;
    gm_pool_t *pool = pool_and_server("idle", &s);
    if (!pool) return;
    tblock_t b[3];
    gm_tag_t t = layout(pool, "extents.share", b, 400);
    /* Pages of the tagged block, fresh and then restored: one physical
     * allocation for many pages, which a peer could not map page by page. */
    uintptr_t in = ((uintptr_t)b[1].p + 4 * PAGE) & ~(PAGE - 1);
    CHECK_RC(gm_share_publish(s.srv, "ext.fresh", (void *)in, 2 * PAGE, GM_SHARE_READ_WRITE, NULL,
                              NULL), GM_NOT_SUPPORTED);
    CHECK(strstr(gm_last_error(), "tagged block") != NULL);
    CHECK_OK(gm_offload(pool, t, 0, NULL));
    CHECK_OK(gm_restore(pool, t, NULL));
    CHECK_RC(gm_share_publish(s.srv, "ext.refused", (void *)in, 2 * PAGE, GM_SHARE_READ_WRITE, NULL,
                              NULL), GM_NOT_SUPPORTED);
    CHECK(strstr(gm_last_error(), "tagged block") != NULL);
    CHECK(check_all(pool, b, 3, "publish refused"));
    CHECK_OK(gm_pool_check(pool));

    /* Freed, the same range serves shareable memory: the extents go back
     * first and every page gets a handle of its own. */
    void *where = free_tagged(pool, b);
    void *sh = NULL;
    CHECK_OK(gm_alloc_shareable(pool, 32 * MiB, NULL, &sh));
    note_if_outside("shareable block", sh, where);
    CHECK_OK(gm_memset(pool, sh, 0x77, 32 * MiB, NULL));
    CHECK_OK(gm_share_publish(s.srv, "ext.sh1", sh, 32 * MiB, GM_SHARE_READ_WRITE, NULL, NULL));
    CHECK_OK(gm_pool_check(pool));

    server_and_pool_done(pool, &s, &sh, 1, b, 3);
}

/* An extent partly in use by another block: a shareable block never lies
 * on it (the page layer refuses the range and untouched address space is
 * taken). */
static void test_shareable_partial(void)
{
    server_t s;
    gm_pool_t *pool = pool_and_server("partial", &s);
    if (!pool) return;
    tblock_t c[3];
    gm_tag_t t = layout(pool, "extents.share.partial", c, 500);
    void *where = free_restored(pool, t, c);
    /* Best fit puts both in the freed range (the only free space but the
     * arena's untouched end): the small block on the first extent's first
     * pages, the shareable one after it, on the rest of that extent. */
    void *small = NULL, *sh2 = NULL;
    CHECK_OK(gm_alloc(pool, 3 * MiB, NULL, &small));
    CHECK_OK(gm_memset(pool, small, 0x33, 3 * MiB, NULL));
    CHECK_OK(gm_alloc_shareable(pool, 24 * MiB, NULL, &sh2));
    note_if_outside("small block", small, where);
    CHECK_OK(gm_memset(pool, sh2, 0x44, 24 * MiB, NULL));
    CHECK_OK(gm_share_publish(s.srv, "ext.sh2", sh2, 24 * MiB, GM_SHARE_READ_WRITE, NULL, NULL));
    CHECK(dev_check_byte(pool, small, 3 * MiB, 0x33, NULL, "small block on the extent"));
    CHECK(dev_check_byte(pool, sh2, 24 * MiB, 0x44, NULL, "shareable block"));
    CHECK(check_all(pool, c, 3, "neighbours"));
    CHECK_OK(gm_pool_check(pool));
    void *left[2] = {sh2, small};
    server_and_pool_done(pool, &s, left, 2, c, 3);
}

/* ---- a failing call while an extent is made or given back --------------------- */

/* Call kind `kind` fails for its nth call: during the restore that makes
 * extents (at_offload false) or during the offload after it, which gives
 * them back (true). */
static void one_fault(int kind, unsigned long nth, bool at_offload, uint64_t seed)
{
    gm_pool_t *pool = extents_pool();
    if (!pool) return;
    char name[64];
    snprintf(name, sizeof name, "extents.fault.%s.%d", at_offload ? "o" : "r", kind);
    tblock_t b[3];
    gm_tag_t t = layout(pool, name, b, seed);
    CHECK_OK(gm_offload(pool, t, 0, NULL));
    gm_stats_t off = pool_stats_of(pool);
    if (at_offload) CHECK_OK(gm_restore(pool, t, NULL));
    CHECK_OK(gm_sim_fail_nth(pool, kind, nth));
    int rc = at_offload ? gm_offload(pool, t, 0, NULL) : gm_restore(pool, t, NULL);
    CHECK_OK(gm_sim_fail_nth(pool, kind, 0));
    CHECK(rc == GM_OK || rc == GM_BACKEND);
    if (rc != GM_OK && !at_offload) CHECK(strstr(gm_last_error(), "stays offloaded") != NULL);
    if (rc != GM_OK || at_offload) {
        /* Offloaded either way, the data safe in host memory: a failed
         * restore gives back what it took; a page the offload could not
         * give back stays cached until the next trim. */
        CHECK(tag_info_of(pool, t).offloaded_blocks == 1);
        CHECK_OK(gm_pool_check(pool));
        CHECK_OK(gm_trim(pool, 0, NULL));
        CHECK(pool_stats_of(pool).reserved <= off.reserved);
        CHECK_OK(gm_restore(pool, t, NULL));
    }
    CHECK(check_all(pool, b, 3, gm_call_name(kind)));
    CHECK_OK(gm_pool_check(pool));
    free_all(pool, b, 3);
    CHECK_OK(gm_trim(pool, 0, NULL));
    CHECK(pool_stats_of(pool).reserved == 0);
    gm_pool_destroy(pool);
}

static void test_faults(void)
{
    static const int restore_kinds[] = {GM_CALL_phys_create, GM_CALL_map, GM_CALL_set_access};
    static const int offload_kinds[] = {GM_CALL_unmap, GM_CALL_phys_release};
    for (unsigned long nth = 1; nth <= 3; nth++) {
        for (size_t k = 0; k < sizeof restore_kinds / sizeof *restore_kinds; k++)
            one_fault(restore_kinds[k], nth, false, 600 + k * 10 + nth);
        for (size_t k = 0; k < sizeof offload_kinds / sizeof *offload_kinds; k++)
            one_fault(offload_kinds[k], nth, true, 700 + k * 10 + nth);
    }
}

int main(void)
{
    test_few_calls();
    test_freed();
    test_shareable();
    test_shareable_partial();
    test_faults();
    scratch_free();
    return test_summary();
}
