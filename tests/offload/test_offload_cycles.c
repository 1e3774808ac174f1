/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_offload_cycles.c — data across many offload/restore cycles of three
 * tags with work on several streams.
 *
 * Every block (three tags and untagged ones) has a host mirror of what it
 * must hold.  Each cycle queues fills, partial uploads and device-to-device
 * copies on the streams the blocks were recorded on, applying each to the
 * mirrors; offloads one or two tags on one stream; churns untagged memory
 * (and now and then frees an offloaded block or allocates into an offloaded
 * tag); restores on another stream; and compares every byte of every
 * resident block with its mirror.  The pool's counters (offloaded,
 * offload_count, restore_count, offload/restore_bytes_total) and gm_tag_info
 * are checked against the model after every call.
 *
 * Held streams (sim): an offload whose blocks have work in flight on a held
 * stream, or whose own stream is held, cannot wait for it: it must fail
 * with nothing moved and nothing lost, and succeed once the hold is
 * released.  A held stream that none of the tag's blocks uses must not stop
 * the offload.
 *
 * Arguments: [cycles] [seed]; default 200 cycles (fewer under sanitizers).
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpumem.h"
#include "../test.h"
#include "offload_util.h"

#define NSTREAMS 4 /* created ones; NULL is the fifth */
#define NTAGS 3
#define PER_TAG 6
#define NUNTAGGED 6
#define MAXB (NTAGS * PER_TAG + NUNTAGGED + 64)
#define ALIGN_UP(x, a) (((x) + (a) - 1) / (a) * (a))

typedef struct mblock {
    void *p;
    size_t n;
    int tag;          /* index into tags[], -1: untagged */
    int offloaded;    /* per the model */
    unsigned char *m; /* mirror */
} mblock_t;

static gm_pool_t *pool;
static gm_stream_t streams[NSTREAMS + 1];
static gm_tag_t tags[NTAGS];
static mblock_t blk[MAXB];
static int nblk;
static uint64_t rng;
static int on_sim;
static unsigned long cycle_no;

/* The model's counters. */
static uint64_t want_offload_count, want_restore_count;
static uint64_t off_lo, off_hi, res_lo, res_hi; /* bytes_total bounds: requested .. aligned */
static uint64_t tag_offloads[NTAGS], tag_restores[NTAGS];

static const size_t tag_sizes[PER_TAG] = {256, 4000, 100000, 700000, MiB + 333, 2 * MiB + 1};

static gm_stream_t any_stream(void) { return streams[rng_next(&rng) % (NSTREAMS + 1)]; }

static int add_block(size_t n, int tag)
{
    if (nblk >= MAXB) return -1;
    mblock_t *b = &blk[nblk];
    memset(b, 0, sizeof *b);
    b->n = n;
    b->tag = tag;
    b->m = malloc(n);
    if (!b->m) return -1;
    gm_stream_t s = any_stream();
    int rc = gm_alloc_tagged(pool, n, s, tag >= 0 ? tags[tag] : GM_TAG_NONE, &b->p);
    CHECK_OK(rc);
    if (rc != GM_OK) {
        free(b->m);
        return -1;
    }
    /* Used on every stream. */
    for (int i = 0; i <= NSTREAMS; i++)
        if (streams[i] != s) CHECK_OK(gm_record_stream(pool, b->p, streams[i]));
    pattern(b->m, n, rng_next(&rng));
    CHECK_OK(gm_memcpy_h2d(pool, b->p, b->m, n, s));
    CHECK_OK(gm_stream_synchronize(pool, s));
    return nblk++;
}

static void drop_block(int i, gm_stream_t s)
{
    CHECK_OK(gm_free(pool, blk[i].p, s));
    free(blk[i].m);
    blk[i] = blk[--nblk];
}

/* Queue random work on the resident blocks, on streams chosen per block;
 * a copy goes between two blocks given the same stream.  sync: wait for
 * every stream at the end (else the next gm_offload must). */
static void queue_work(int sync)
{
    gm_stream_t of[MAXB];
    for (int i = 0; i < nblk; i++) of[i] = any_stream();
    for (int i = 0; i < nblk; i++) {
        mblock_t *b = &blk[i];
        if (b->offloaded) continue;
        size_t off = rng_next(&rng) % b->n;
        size_t len = 1 + rng_next(&rng) % (b->n - off);
        switch (rng_next(&rng) % 3) {
        case 0: {
            int v = (int)(rng_next(&rng) & 0xff);
            CHECK_OK(gm_memset(pool, (char *)b->p + off, v, len, of[i]));
            memset(b->m + off, v, len);
            break;
        }
        case 1: {
            unsigned char *tmp = malloc(len);
            if (!tmp) break;
            pattern(tmp, len, rng_next(&rng));
            CHECK_OK(gm_memcpy_h2d(pool, (char *)b->p + off, tmp, len, of[i]));
            memcpy(b->m + off, tmp, len);
            free(tmp);
            break;
        }
        default:
            for (int j = 0; j < nblk; j++) {
                mblock_t *c = &blk[j];
                if (j == i || c->offloaded || of[j] != of[i]) continue;
                size_t n = len < c->n ? len : c->n;
                CHECK_OK(gm_memcpy(pool, (char *)b->p + off, c->p, n, of[i]));
                memcpy(b->m + off, c->m, n);
                break;
            }
        }
    }
    if (sync)
        for (int i = 0; i <= NSTREAMS; i++) CHECK_OK(gm_stream_synchronize(pool, streams[i]));
}

static int verify(const char *what)
{
    int ok = 1;
    for (int i = 0; i < nblk; i++) {
        if (blk[i].offloaded) continue;
        char label[128];
        snprintf(label, sizeof label, "cycle %lu, %s, block %d (tag %d)", cycle_no, what, i,
                 blk[i].tag);
        if (!dev_equal(pool, blk[i].p, blk[i].m, blk[i].n, any_stream(), label)) ok = 0;
    }
    return ok;
}

/* The model's figures of tag t. */
static void model_tag(int t, uint64_t *rb, uint64_t *rn, uint64_t *ob, uint64_t *on,
                      uint64_t *oaligned, uint64_t *raligned)
{
    *rb = *rn = *ob = *on = 0;
    if (oaligned) *oaligned = 0;
    if (raligned) *raligned = 0;
    for (int i = 0; i < nblk; i++) {
        if (blk[i].tag != t) continue;
        if (blk[i].offloaded) {
            *ob += blk[i].n;
            (*on)++;
            if (oaligned) *oaligned += ALIGN_UP(blk[i].n, GM_ALIGNMENT);
        } else {
            *rb += blk[i].n;
            (*rn)++;
            if (raligned) *raligned += ALIGN_UP(blk[i].n, GM_ALIGNMENT);
        }
    }
}

/* Do the pool's figures agree with the model? */
static void check_model(const char *what)
{
    gm_stats_t st = pool_stats_of(pool);
    uint64_t offloaded = 0;
    int bad = 0;
    for (int t = 0; t < NTAGS; t++) {
        uint64_t rb, rn, ob, on;
        model_tag(t, &rb, &rn, &ob, &on, NULL, NULL);
        offloaded += ob;
        gm_tag_info_t ti = tag_info_of(pool, tags[t]);
        if (ti.resident_bytes != rb || ti.resident_blocks != rn || ti.offloaded_bytes != ob ||
            ti.offloaded_blocks != on || ti.offloads != tag_offloads[t] ||
            ti.restores != tag_restores[t]) {
            bad = 1;
            fprintf(stderr, "  cycle %lu, %s: tag %d: resident %" PRIu64 "/%" PRIu64
                    " (want %" PRIu64 "/%" PRIu64 "), offloaded %" PRIu64 "/%" PRIu64
                    " (want %" PRIu64 "/%" PRIu64 "), offloads %" PRIu64 " (want %" PRIu64
                    "), restores %" PRIu64 " (want %" PRIu64 ")\n",
                    cycle_no, what, t, ti.resident_blocks, ti.resident_bytes, rn, rb,
                    ti.offloaded_blocks, ti.offloaded_bytes, on, ob, ti.offloads,
                    tag_offloads[t], ti.restores, tag_restores[t]);
        }
    }
    if (st.offloaded != offloaded || st.offload_count != want_offload_count ||
        st.restore_count != want_restore_count || st.offload_bytes_total < off_lo ||
        st.offload_bytes_total > off_hi || st.restore_bytes_total < res_lo ||
        st.restore_bytes_total > res_hi) {
        bad = 1;
        fprintf(stderr, "  cycle %lu, %s: stats offloaded %" PRIu64 " (want %" PRIu64
                "), offload_count %" PRIu64 " (want %" PRIu64 "), restore_count %" PRIu64
                " (want %" PRIu64 "), offload_bytes_total %" PRIu64 " (want %" PRIu64 "..%" PRIu64
                "), restore_bytes_total %" PRIu64 " (want %" PRIu64 "..%" PRIu64 ")\n",
                cycle_no, what, st.offloaded, offloaded, st.offload_count, want_offload_count,
                st.restore_count, want_restore_count, st.offload_bytes_total, off_lo, off_hi,
                st.restore_bytes_total, res_lo, res_hi);
    }
    CHECK(!bad);
}

/* Offload (offload 1) or restore (0) tag t on stream s, and move the
 * model's blocks and figures with it when it succeeds. */
static int do_move(int t, gm_stream_t s, int offload)
{
    uint64_t rb, rn, ob, on, oal, ral;
    model_tag(t, &rb, &rn, &ob, &on, &oal, &ral);
    int rc = offload ? gm_offload(pool, tags[t], 0, s) : gm_restore(pool, tags[t], s);
    CHECK_OK(rc);
    if (rc != GM_OK) return rc;
    for (int i = 0; i < nblk; i++)
        if (blk[i].tag == t) blk[i].offloaded = offload;
    if (offload) {
        want_offload_count += rn;
        off_lo += rb;
        off_hi += ral;
        if (rn) tag_offloads[t]++;
    } else {
        want_restore_count += on;
        res_lo += ob;
        res_hi += oal;
        if (on) tag_restores[t]++;
    }
    return rc;
}

static int do_offload(int t, gm_stream_t s) { return do_move(t, s, 1); }
static int do_restore(int t, gm_stream_t s) { return do_move(t, s, 0); }

static int first_of_tag(int t, int offloaded)
{
    for (int i = 0; i < nblk; i++)
        if (blk[i].tag == t && blk[i].offloaded == offloaded) return i;
    return -1;
}

/* Held streams (sim only). */
static void held_streams(int t)
{
    gm_stream_t H = streams[1 + rng_next(&rng) % NSTREAMS];
    int i = first_of_tag(t, 0);
    if (i < 0) return;
    mblock_t *b = &blk[i];
    gm_stats_t st0 = pool_stats_of(pool);

    /* Work on one of the tag's blocks in flight on a held stream. */
    CHECK_OK(gm_sim_hold_stream(pool, H, 1));
    CHECK_OK(gm_memset(pool, b->p, 0x77, b->n, H));
    memset(b->m, 0x77, b->n);
    int rc = gm_offload(pool, tags[t], 0, streams[0]);
    CHECK(rc != GM_OK);
    if (rc != GM_OK) CHECK(gm_last_error()[0] != '\0');
    if (rc == GM_OK) { /* the model follows what happened, then the checks fail */
        fprintf(stderr, "  cycle %lu: offload ignored work in flight on held stream %p\n",
                cycle_no, H);
        for (int j = 0; j < nblk; j++)
            if (blk[j].tag == t) blk[j].offloaded = 1;
        CHECK_OK(gm_sim_hold_stream(pool, H, 0));
        return;
    }
    CHECK_OK(gm_pool_check(pool));
    gm_stats_t st1 = pool_stats_of(pool);
    CHECK(st1.offloaded == st0.offloaded && st1.offload_count == st0.offload_count);
    check_model("offload refused (held block stream)");
    CHECK_OK(gm_sim_hold_stream(pool, H, 0));
    CHECK(verify("after a refused offload"));
    CHECK_OK(do_offload(t, streams[0]));
    check_model("offload after the hold");
    CHECK_OK(do_restore(t, streams[2]));
    CHECK(verify("restore after the hold"));

    /* The offload's own stream held (a stream none of the blocks uses). */
    gm_stream_t P = NULL;
    CHECK_OK(gm_stream_create(pool, &P));
    CHECK_OK(gm_sim_hold_stream(pool, P, 1));
    rc = gm_offload(pool, tags[t], 0, P);
    CHECK(rc != GM_OK);
    if (rc == GM_OK) {
        fprintf(stderr, "  cycle %lu: offload did not wait for its own held stream\n", cycle_no);
        for (int j = 0; j < nblk; j++)
            if (blk[j].tag == t) blk[j].offloaded = 1;
    }
    CHECK_OK(gm_pool_check(pool));
    check_model("offload refused (held own stream)");
    CHECK_OK(gm_sim_hold_stream(pool, P, 0));
    if (rc != GM_OK) CHECK_OK(do_offload(t, P));
    check_model("offload after the own stream's hold");
    CHECK_OK(do_restore(t, P));
    CHECK(verify("restore after the own stream's hold"));
    CHECK_OK(gm_stream_destroy(pool, P));

    /* A held stream that no block of the tag uses: no reason to wait. */
    gm_stream_t U = NULL;
    void *u = NULL;
    CHECK_OK(gm_stream_create(pool, &U));
    CHECK_OK(gm_alloc_tagged(pool, 3 * MiB, U, GM_TAG_NONE, &u));
    CHECK_OK(gm_sim_hold_stream(pool, U, 1));
    CHECK_OK(gm_memset(pool, u, 0x42, 3 * MiB, U));
    rc = gm_offload(pool, tags[t], 0, streams[1]);
    CHECK_OK(rc);
    if (rc == GM_OK) {
        for (int j = 0; j < nblk; j++)
            if (blk[j].tag == t && !blk[j].offloaded) {
                blk[j].offloaded = 1;
                want_offload_count++;
                off_lo += blk[j].n;
                off_hi += ALIGN_UP(blk[j].n, GM_ALIGNMENT);
            }
        tag_offloads[t]++;
    }
    check_model("offload beside an unrelated held stream");
    CHECK_OK(gm_sim_hold_stream(pool, U, 0));
    CHECK(dev_check_byte(pool, u, 3 * MiB, 0x42, U, "unrelated block"));
    CHECK_OK(gm_free(pool, u, U));
    CHECK_OK(gm_stream_destroy(pool, U));
    CHECK_OK(do_restore(t, NULL));
    CHECK(verify("restore after the unrelated hold"));
    CHECK_OK(gm_pool_check(pool));
}

int main(int argc, char **argv)
{
    int cycles = scaled(200, 12);
    uint64_t seed = 0x0ff10ad;
    if (argc > 1) cycles = atoi(argv[1]);
    if (argc > 2) seed = strtoull(argv[2], NULL, 0);
    if (cycles < 1) {
        fprintf(stderr, "usage: %s [cycles >= 1] [seed]\n", argv[0]);
        return 2;
    }
    rng = seed;
    on_sim = test_backend() == GM_BACKEND_SIM;

    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = test_backend();
    cfg.sim_capacity = 512 * MiB;
    cfg.limit = on_sim ? 0 : 512 * MiB;
    cfg.copy_threads = 2;
    pool = pool_from(&cfg);
    REQUIRE(pool != NULL);
    streams[0] = NULL;
    for (int i = 1; i <= NSTREAMS; i++) CHECK_OK(gm_stream_create(pool, &streams[i]));
    static const char *names[NTAGS] = {"cycles.weights", "cycles.kv", "cycles.optimizer"};
    for (int t = 0; t < NTAGS; t++) CHECK_OK(gm_tag_get(names[t], 0, &tags[t]));

    /* Interleaved: tagged blocks of every tag next to untagged ones. */
    for (int k = 0; k < PER_TAG; k++) {
        for (int t = 0; t < NTAGS; t++) add_block(tag_sizes[(k + t) % PER_TAG] + 16 * t, t);
        if (k < NUNTAGGED) add_block(1000 + rng_next(&rng) % (3 * MiB / 2), -1);
    }
    REQUIRE(nblk == NTAGS * PER_TAG + NUNTAGGED);
    CHECK(verify("start"));
    check_model("start");

    void *churn[16] = {0};
    size_t churn_n[16] = {0};
    int data_ok = 1;
    for (int c = 0; c < cycles; c++) {
        cycle_no = (unsigned long)c;
        queue_work(0);
        /* One or two tags to sleep, on one stream. */
        int t1 = c % NTAGS, t2 = (c % 5 == 0) ? (c + 1) % NTAGS : -1;
        gm_stream_t so = any_stream();
        do_offload(t1, so);
        if (t2 >= 0) do_offload(t2, any_stream());
        check_model("after offload");
        CHECK_OK(gm_pool_check(pool));
        /* The others still hold their data and take work. */
        queue_work(1);
        /* Churn of untagged memory. */
        for (int k = 0; k < 4; k++) {
            int j = (int)(rng_next(&rng) % 16);
            if (churn[j]) {
                CHECK_OK(gm_free(pool, churn[j], NULL));
                churn[j] = NULL;
            } else {
                churn_n[j] = 256 + rng_next(&rng) % (4 * MiB);
                CHECK_OK(gm_alloc(pool, churn_n[j], NULL, &churn[j]));
                if (churn[j]) CHECK_OK(gm_memset(pool, churn[j], j, churn_n[j], NULL));
            }
        }
        /* Now and then: free an offloaded block, allocate into the
         * offloaded tag (resident; the restore leaves it alone). */
        if (c % 7 == 3) {
            int i = first_of_tag(t1, 1);
            if (i >= 0 && nblk > NTAGS * 3) drop_block(i, any_stream());
            int nb = add_block(tag_sizes[rng_next(&rng) % PER_TAG] + 8 * (size_t)c, t1);
            CHECK(nb >= 0);
            check_model("free/alloc while offloaded");
        }
        gm_stream_t sr = any_stream();
        do_restore(t1, sr);
        if (t2 >= 0) do_restore(t2, any_stream());
        check_model("after restore");
        CHECK_OK(gm_pool_check(pool));
        if (!verify("after restore")) {
            data_ok = 0;
            CHECK(0);
            break; /* the first broken cycle tells it */
        }
        if (on_sim && c % 50 == 25) held_streams(c % NTAGS);
    }
    CHECK(data_ok);
    printf("%d cycles, %" PRIu64 " blocks offloaded, %" PRIu64 " restored\n", cycles,
           want_offload_count, want_restore_count);

    for (int j = 0; j < 16; j++)
        if (churn[j]) CHECK_OK(gm_free(pool, churn[j], NULL));
    while (nblk > 0) drop_block(nblk - 1, NULL);
    gm_stats_t st = pool_stats_of(pool);
    CHECK(st.allocated == 0 && st.live_blocks == 0 && st.offloaded == 0);
    CHECK_OK(gm_pool_check(pool));
    for (int i = 1; i <= NSTREAMS; i++) CHECK_OK(gm_stream_destroy(pool, streams[i]));
    gm_pool_destroy(pool);
    scratch_free();
    return test_summary();
}
