/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_freemem.c — the free-memory engine (src/core/freemem.h) on its own,
 * with no pool: the segregated-fit index under both search policies against
 * a brute-force scan, a region's blocks through take / release / migrate
 * (merging, splitting, the stream rule's sequence numbers, absorbing global
 * neighbours), and the stream-state registry.  Nothing here makes a backend
 * call, so the pool argument is NULL.
 */
#include "core/pool.h"
#include "../test.h"

#define U ((size_t)1 << GM_UNIT_SHIFT)

static unsigned rng_state = 12345;
static unsigned rnd(unsigned n)
{
    rng_state = rng_state * 1103515245u + 12345u;
    return (rng_state >> 8) % n;
}

/* Every block in idx, by walking every bucket. */
static size_t walk(const gm__freeidx_t *idx, gm__block_t **out, size_t max)
{
    size_t n = 0;
    for (unsigned fl = 0; fl < GM_FL_COUNT; fl++)
        for (unsigned sl = 0; sl < GM_SL_COUNT; sl++)
            for (gm__block_t *b = idx->heads[fl][sl]; b; b = b->fnext)
                if (n < max) out[n++] = b;
    return n;
}

static void test_index(unsigned slb)
{
    static gm__block_t blk[400];
    static gm__stream_t owner;
    memset(&owner, 0, sizeof owner);
    owner.is_global = true;
    gm__freeidx_t *idx = &owner.idx[GM_CLASS_SMALL];
    for (size_t i = 0; i < 400; i++) {
        blk[i] = (gm__block_t){.addr = (i + 1) << 30, .size = (1 + rnd(1u << (rnd(14) + 1))) * U,
                               .free = 1, .owner = &owner};
        gm__fm_insert(idx, &blk[i], slb);
    }
    CHECK(idx->count == 400);
    for (size_t i = 0; i < 400; i++) CHECK(gm__fm_check_free(&blk[i], slb) == GM_OK);
    for (int round = 0; round < 2000; round++) {
        size_t want = (1 + rnd(1u << (rnd(15) + 1))) * U;
        gm__block_t *all[400];
        size_t n = walk(idx, all, 400), fits = 0, fits_above = 0;
        uint32_t own = gm__fm_bucket(want, slb);
        for (size_t i = 0; i < n; i++) {
            fits += all[i]->size >= want;
            fits_above += all[i]->bucket > own;
        }
        gm__block_t *best = gm__fm_find_best(idx, want, slb);
        gm__block_t *good = gm__fm_find_good(idx, want, slb);
        /* A block found fits.  "Good fit" finds one whenever one fits; best
         * fit compares only a few of the request's own bucket, but always
         * finds one when a higher bucket holds any. */
        CHECK(!best || best->size >= want);
        CHECK(best || fits_above == 0);
        CHECK((good != NULL) == (fits > 0) && (!good || good->size >= want));
        if (round % 3 == 0 && best) {
            gm__fm_remove(idx, best);
            best->size = (1 + rnd(4096)) * U;
            gm__fm_insert(idx, best, slb);
        }
    }
    size_t bytes = 0;
    gm__block_t *all[400];
    size_t n = walk(idx, all, 400);
    for (size_t i = 0; i < n; i++) bytes += all[i]->size;
    CHECK(n == idx->count && bytes == idx->bytes);
    for (size_t i = 0; i < n; i++) CHECK(gm__fm_check_free(all[i], slb) == GM_OK);
    for (size_t i = 0; i < n; i++) gm__fm_remove(idx, all[i]);
    CHECK(idx->count == 0 && idx->bytes == 0 && idx->fl_bits == 0);
}

/* A region of 64 units handed out and freed through the engine. */
static void test_region(bool take_global)
{
    gm__fm_policy_t pol = {.sl_bits = 3, .take_global = take_global};
    gm__slab_t slab = {.per_slab = 4};
    gm__stream_t global = {.is_global = true}, s = {.handle = (gm_stream_t)0x10};
    gm__block_t *first = gm__slab_new(&slab);
    CHECK(first != NULL);
    *first = (gm__block_t){.addr = 1 << 20, .size = 64 * U, .free = 1, .owner = &global};
    gm__fm_insert(&global.idx[0], first, pol.sl_bits);

    /* Four live blocks of 8 units, in address order, then 32 free units. */
    gm__block_t *live[4];
    for (int i = 0; i < 4; i++) {
        gm__block_t *b = gm__fm_find_good(&global.idx[0], 8 * U, pol.sl_bits);
        CHECK(b != NULL && gm__fm_take(&slab, pol.sl_bits, b, 8 * U, true) == GM_OK);
        live[i] = b;
    }
    CHECK(live[0]->addr == 1 << 20 && live[3]->next && live[3]->next->size == 32 * U);
    CHECK(global.idx[0].count == 1 && slab.n == 2);

    /* Freed on s: reusable by s only; 1 and 2 merge, 3 absorbs the global
     * tail only under take_global, and then not (it is the region's last). */
    gm__fm_release(NULL, &pol, &slab, live[1], &s);
    gm__block_t *m = gm__fm_release(NULL, &pol, &slab, live[2], &s);
    CHECK(m == live[1] && m->size == 16 * U && m->free_seq == 2 && s.idx[0].count == 1);
    gm__block_t *t = gm__fm_release(NULL, &pol, &slab, live[3], &s);
    CHECK(t == live[1] && t->size == 24 * U && t->free_seq == 3 && s.free_seq == 3);
    CHECK(t->next && t->next->owner == &global && t->next->size == 32 * U);

    /* live[0] on global: a global neighbour of a stream block stays apart. */
    gm__block_t *g = gm__fm_release(NULL, &pol, &slab, live[0], &global);
    CHECK(g == live[0] && g->size == 8 * U && g->next == t);
    if (take_global) {
        /* A stream free next to a global block (not the last) absorbs it. */
        gm__block_t *b = gm__fm_find_good(&s.idx[0], 8 * U, pol.sl_bits);
        CHECK(b == t && gm__fm_take(&slab, pol.sl_bits, b, 8 * U, true) == GM_OK);
        b = gm__fm_release(NULL, &pol, &slab, b, &s);
        CHECK(b->addr == 1 << 20 && b->size == 32 * U && b->owner == &s);
    }

    /* Migration moves what was freed up to a sequence number. */
    CHECK(gm__fm_migrate(NULL, &pol, &slab, &s, &global, 0) == 0 && gm__fm_held(&s) == 1);
    CHECK(gm__fm_migrate(NULL, &pol, &slab, &s, &global, UINT64_MAX) == 1);
    CHECK(gm__fm_held(&s) == 0 && global.idx[0].count == 1);
    gm__block_t *whole = gm__fm_find_best(&global.idx[0], 64 * U, pol.sl_bits);
    CHECK(whole && whole->addr == 1 << 20 && whole->size == 64 * U && !whole->next);
    gm__slab_fini(&slab);
}

static void test_registry(void)
{
    gm__streams_t r = {0};
    gm__stream_t *s[300];
    for (uintptr_t i = 0; i < 300; i++) {
        s[i] = gm__streams_add(&r, (gm_stream_t)i); /* handle 0: the NULL stream */
        CHECK(s[i] && s[i]->handle == (gm_stream_t)i);
    }
    CHECK(r.n == 300 && gm__streams_check(&r) == GM_OK);
    for (uintptr_t i = 0; i < 300; i += 3) gm__streams_forget(NULL, &r, s[i]);
    CHECK(r.n == 200 && gm__streams_check(&r) == GM_OK);
    for (uintptr_t i = 0; i < 300; i++)
        CHECK(gm__streams_find(&r, (gm_stream_t)i) == (i % 3 ? s[i] : NULL));
    gm__streams_fini(NULL, &r);
    CHECK(r.n == 0 && r.all == NULL);
}

int main(void)
{
    test_index(GM_SL_BITS);
    test_index(3);
    test_region(false);
    test_region(true);
    test_registry();
    return test_summary();
}
