/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_offload_threads.c — offload and restore while other threads work.
 *
 * All threads first allocate blocks of one tag O (so with several heaps O's
 * blocks lie in every heap) and fill them.  Then one thread offloads and
 * restores O again and again, checking after each offload that the whole
 * tag went (gm_tag_info over all heaps) and after each restore every byte;
 * meanwhile each worker allocates and frees blocks of its own tag (through
 * gm_tag_scope) and untagged ones (gm_alloc_tagged with GM_TAG_NONE), with
 * their pages shared with everyone's in the one-heap pool, checks its data,
 * and now and then offloads and restores its own tag.  At the end every
 * tag's figures must match what the threads hold.  Run with one heap and
 * with four.  Thread failures are counted in atomics and checked by main.
 *
 * Arguments: [workers] [iterations] [seed]; defaults 3, 300, scaled down
 * under sanitizers (this test runs under TSan).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpumem.h"
#include "../test.h"
#include "offload_util.h"

#define MAXW 16
#define OPER 4     /* blocks of O per thread */
#define LIVE 16    /* live blocks per worker at most */

static atomic_ulong t_fail, t_pass;

#define TCHECK(cond, ...)                                                      \
    do {                                                                       \
        if (cond) {                                                            \
            atomic_fetch_add(&t_pass, 1);                                      \
        } else {                                                               \
            atomic_fetch_add(&t_fail, 1);                                      \
            fprintf(stderr, "%s:%d: thread check failed: %s: ", __FILE__,      \
                    __LINE__, #cond);                                          \
            fprintf(stderr, __VA_ARGS__);                                      \
            fprintf(stderr, "\n");                                             \
        }                                                                      \
    } while (0)

#define TOK(expr)                                                              \
    do {                                                                       \
        int trc_ = (expr);                                                     \
        TCHECK(trc_ == GM_OK, "%s: %s (%s)", #expr, gm_errname(trc_),          \
               gm_last_error());                                               \
    } while (0)

typedef struct ctx {
    gm_pool_t *pool;
    int nthreads; /* workers + the offloader (the last) */
    int iterations;
    uint64_t seed;
    gm_tag_t otag;
    gm_stream_t stream[MAXW + 1];
    gm_tag_t wtag[MAXW];
    tblock_t oblk[MAXW + 1][OPER];
    pthread_barrier_t bar;
    atomic_int workers_left;
} ctx_t;

typedef struct arg {
    ctx_t *c;
    int id;
} arg_t;

static int tinfo(gm_pool_t *pool, gm_tag_t tag, gm_tag_info_t *ti)
{
    *ti = (gm_tag_info_t)GM_TAG_INFO_INIT;
    int rc = gm_tag_info(pool, tag, ti);
    TCHECK(rc == GM_OK, "gm_tag_info: %s", gm_last_error());
    return rc;
}

/* Phase 1, every thread: its share of O's blocks. */
static void make_o_blocks(ctx_t *c, int id, gm_stream_t s, uint64_t *rng)
{
    static const size_t sizes[OPER] = {1000, 100 * KiB + 3, MiB + 5, 2 * MiB + 300};
    for (int k = 0; k < OPER; k++) {
        tblock_t *b = &c->oblk[id][k];
        *b = (tblock_t){NULL, sizes[k] + 16 * (size_t)id, c->otag, rng_next(rng), s};
        TOK(gm_alloc_tagged(c->pool, b->n, s, c->otag, &b->p));
        if (b->p) TOK(dev_fill(c->pool, b->p, b->n, b->seed, s));
        TOK(gm_stream_synchronize(c->pool, s));
    }
}

typedef struct wblock {
    void *p;
    size_t n;
    uint64_t seed;
    int tagged;
} wblock_t;

static size_t pick_size(uint64_t *rng)
{
    uint64_t r = rng_next(rng) % 100;
    if (r < 70) return 256 + rng_next(rng) % (64 * KiB);
    if (r < 95) return 64 * KiB + rng_next(rng) % MiB;
    return MiB + rng_next(rng) % (2 * MiB);
}

static void *worker(void *p)
{
    arg_t *a = p;
    ctx_t *c = a->c;
    gm_pool_t *pool = c->pool;
    uint64_t rng = c->seed * 31 + (uint64_t)a->id;
    gm_stream_t s = c->stream[a->id];
    TCHECK(gm_tag_scope(GM_TAG_NONE) == GM_TAG_NONE, "a new thread has no tag");
    make_o_blocks(c, a->id, s, &rng);
    pthread_barrier_wait(&c->bar);

    gm_tag_t mine = c->wtag[a->id];
    gm_tag_t old = gm_tag_scope(mine);
    TCHECK(old == GM_TAG_NONE, "scope was %u", (unsigned)old);
    wblock_t live[LIVE];
    int n = 0;
    for (int it = 0; it < c->iterations; it++) {
        uint64_t r = rng_next(&rng) % 10;
        if (r < 5 && n < LIVE) {
            wblock_t *w = &live[n];
            w->n = pick_size(&rng);
            w->tagged = (int)(rng_next(&rng) & 1);
            w->seed = rng_next(&rng);
            int rc = w->tagged ? gm_alloc(pool, w->n, s, &w->p)
                               : gm_alloc_tagged(pool, w->n, s, GM_TAG_NONE, &w->p);
            TCHECK(rc == GM_OK, "alloc %zu: %s", w->n, gm_last_error());
            if (rc != GM_OK) continue;
            TOK(dev_fill(pool, w->p, w->n, w->seed, s));
            n++;
        } else if (r < 8 && n > 0) {
            int i = (int)(rng_next(&rng) % (uint64_t)n);
            TCHECK(dev_check(pool, live[i].p, live[i].n, live[i].seed, s, "worker, before free"),
                   "worker %d, iteration %d", a->id, it);
            TOK(gm_free(pool, live[i].p, s));
            live[i] = live[--n];
        } else if (r < 9 && n > 0) {
            int i = (int)(rng_next(&rng) % (uint64_t)n);
            TCHECK(dev_check(pool, live[i].p, live[i].n, live[i].seed, s, "worker"),
                   "worker %d, iteration %d", a->id, it);
        } else if (it % 4 == 0) {
            /* Own tag to sleep and back. */
            size_t nt = 0, bytes = 0;
            for (int i = 0; i < n; i++)
                if (live[i].tagged) {
                    nt++;
                    bytes += live[i].n;
                }
            TOK(gm_offload(pool, mine, 0, s));
            gm_tag_info_t ti;
            if (tinfo(pool, mine, &ti) == GM_OK)
                TCHECK(ti.resident_blocks == 0 && ti.offloaded_blocks == nt &&
                           ti.offloaded_bytes == bytes,
                       "worker %d: after offload resident %" PRIu64 ", offloaded %" PRIu64
                       "/%" PRIu64 ", want 0, %zu/%zu", a->id, ti.resident_blocks,
                       ti.offloaded_blocks, ti.offloaded_bytes, nt, bytes);
            for (int i = 0; i < n; i++)
                if (!live[i].tagged)
                    TCHECK(dev_check(pool, live[i].p, live[i].n, live[i].seed, s,
                                     "worker, untagged beside own offload"),
                           "worker %d", a->id);
            TOK(gm_restore(pool, mine, s));
            if (tinfo(pool, mine, &ti) == GM_OK)
                TCHECK(ti.resident_blocks == nt && ti.offloaded_blocks == 0,
                       "worker %d: after restore resident %" PRIu64 ", offloaded %" PRIu64,
                       a->id, ti.resident_blocks, ti.offloaded_blocks);
            for (int i = 0; i < n; i++)
                TCHECK(dev_check(pool, live[i].p, live[i].n, live[i].seed, s,
                                 "worker, after own restore"),
                       "worker %d, iteration %d", a->id, it);
        }
    }
    /* The figures of the own tag, while still holding the blocks. */
    size_t nt = 0, bytes = 0;
    for (int i = 0; i < n; i++)
        if (live[i].tagged) {
            nt++;
            bytes += live[i].n;
        }
    gm_tag_info_t ti;
    if (tinfo(pool, mine, &ti) == GM_OK)
        TCHECK(ti.resident_blocks == nt && ti.resident_bytes == bytes && ti.offloaded_blocks == 0,
               "worker %d at the end: resident %" PRIu64 "/%" PRIu64 ", want %zu/%zu", a->id,
               ti.resident_blocks, ti.resident_bytes, nt, bytes);
    for (int i = 0; i < n; i++) {
        TCHECK(dev_check(pool, live[i].p, live[i].n, live[i].seed, s, "worker, at the end"),
               "worker %d", a->id);
        TOK(gm_free(pool, live[i].p, s));
    }
    TCHECK(gm_tag_scope(old) == mine, "scope changed under the thread");
    atomic_fetch_sub(&c->workers_left, 1);
    scratch_free();
    return NULL;
}

static void *offloader(void *p)
{
    arg_t *a = p;
    ctx_t *c = a->c;
    gm_pool_t *pool = c->pool;
    uint64_t rng = c->seed * 77 + 5;
    gm_stream_t s = c->stream[a->id];
    make_o_blocks(c, a->id, s, &rng);
    pthread_barrier_wait(&c->bar);

    /* Everything of O from now on is this thread's. */
    size_t count = (size_t)c->nthreads * OPER, bytes = 0;
    for (int t = 0; t < c->nthreads; t++)
        for (int k = 0; k < OPER; k++) {
            bytes += c->oblk[t][k].n;
            TOK(gm_record_stream(pool, c->oblk[t][k].p, s));
        }
    int rounds = 0;
    for (int it = 0; it < c->iterations / 4 || atomic_load(&c->workers_left) > 0; it++) {
        TOK(gm_offload(pool, c->otag, 0, it % 2 ? s : NULL));
        gm_tag_info_t ti;
        if (tinfo(pool, c->otag, &ti) == GM_OK)
            TCHECK(ti.resident_blocks == 0 && ti.offloaded_blocks == count &&
                       ti.offloaded_bytes == bytes,
                   "O after offload %d: resident %" PRIu64 ", offloaded %" PRIu64 "/%" PRIu64
                   ", want 0, %zu/%zu", it, ti.resident_blocks, ti.offloaded_blocks,
                   ti.offloaded_bytes, count, bytes);
        TOK(gm_restore(pool, c->otag, s));
        if (tinfo(pool, c->otag, &ti) == GM_OK)
            TCHECK(ti.resident_blocks == count && ti.offloaded_blocks == 0,
                   "O after restore %d: resident %" PRIu64, it, ti.resident_blocks);
        for (int t = 0; t < c->nthreads; t++)
            for (int k = 0; k < OPER; k++) {
                tblock_t *b = &c->oblk[t][k];
                TCHECK(dev_check(pool, b->p, b->n, b->seed, s, "O after restore"),
                       "round %d, block %d/%d", it, t, k);
                if (it % 3 == 0) { /* new contents for the next round */
                    b->seed = rng_next(&rng);
                    TOK(dev_fill(pool, b->p, b->n, b->seed, s));
                }
            }
        rounds++;
        if (rounds > 100000) break;
    }
    TOK(gm_stream_synchronize(pool, s));
    for (int t = 0; t < c->nthreads; t++)
        for (int k = 0; k < OPER; k++) {
            TOK(gm_free(pool, c->oblk[t][k].p, s));
            c->oblk[t][k].p = NULL;
        }
    scratch_free();
    return NULL;
}

static void run(unsigned heaps, int workers, int iterations, uint64_t seed)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = test_backend();
    cfg.sim_capacity = (size_t)1 << 30;
    cfg.limit = cfg.backend == GM_BACKEND_SIM ? 0 : (size_t)1 << 30;
    cfg.heaps = heaps;
    cfg.copy_threads = 2;
    gm_pool_t *pool = pool_from(&cfg);
    if (!pool) { CHECK(0); return; }
    static ctx_t c;
    memset(&c, 0, sizeof c);
    c.pool = pool;
    c.nthreads = workers + 1;
    c.iterations = iterations;
    c.seed = seed + heaps;
    atomic_store(&c.workers_left, workers);
    CHECK_OK(gm_tag_get("threads.o", 0, &c.otag));
    for (int i = 0; i < workers; i++) {
        char name[32];
        snprintf(name, sizeof name, "threads.w%d", i);
        CHECK_OK(gm_tag_get(name, 0, &c.wtag[i]));
    }
    for (int i = 0; i < c.nthreads; i++) CHECK_OK(gm_stream_create(pool, &c.stream[i]));
    pthread_barrier_init(&c.bar, NULL, (unsigned)c.nthreads);
    pthread_t th[MAXW + 1];
    arg_t args[MAXW + 1];
    int started = 0;
    for (int i = 0; i < c.nthreads; i++) {
        args[i] = (arg_t){&c, i};
        if (pthread_create(&th[i], NULL, i < workers ? worker : offloader, &args[i]) != 0) break;
        started++;
    }
    CHECK(started == c.nthreads);
    if (started != c.nthreads) {
        fprintf(stderr, "cannot start threads\n");
        exit(1);
    }
    for (int i = 0; i < c.nthreads; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&c.bar);
    for (int i = 0; i < c.nthreads; i++) CHECK_OK(gm_stream_destroy(pool, c.stream[i]));

    CHECK_OK(gm_pool_check(pool));
    gm_tag_info_t ti = GM_TAG_INFO_INIT;
    CHECK_OK(gm_tag_info(pool, c.otag, &ti));
    CHECK(ti.resident_blocks == 0 && ti.offloaded_blocks == 0 && ti.offloads > 0 &&
          ti.offloads == ti.restores);
    uint64_t o_offloads = ti.offloads;
    for (int i = 0; i < workers; i++) {
        ti = (gm_tag_info_t)GM_TAG_INFO_INIT;
        CHECK_OK(gm_tag_info(pool, c.wtag[i], &ti));
        CHECK(ti.resident_blocks == 0 && ti.offloaded_blocks == 0);
    }
    gm_stats_t st = pool_stats_of(pool);
    CHECK(st.allocated == 0 && st.live_blocks == 0 && st.offloaded == 0);
    CHECK(st.offload_count == st.restore_count);
    printf("heaps %u: %" PRIu64 " blocks offloaded and restored, O %" PRIu64 " times\n", heaps,
           st.offload_count, o_offloads);
    gm_pool_destroy(pool);
}

int main(int argc, char **argv)
{
    int workers = 3, iterations = scaled(300, 30);
    uint64_t seed = 0x7ead5;
    if (argc > 1) workers = atoi(argv[1]);
    if (argc > 2) iterations = atoi(argv[2]);
    if (argc > 3) seed = strtoull(argv[3], NULL, 0);
    if (workers < 1 || workers > MAXW || iterations < 4) {
        fprintf(stderr, "usage: %s [workers 1-%d] [iterations >= 4] [seed]\n", argv[0], MAXW);
        return 2;
    }
    run(1, workers, iterations, seed);
    run(4, workers, iterations, seed);
    CHECK(atomic_load(&t_fail) == 0);
    CHECK(atomic_load(&t_pass) > 0);
    printf("threads: %lu checks passed, %lu failed\n", (unsigned long)atomic_load(&t_pass),
           (unsigned long)atomic_load(&t_fail));
    return test_summary();
}
