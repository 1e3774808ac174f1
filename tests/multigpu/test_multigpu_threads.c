/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_multigpu_threads.c — four sim devices driven by four threads at once,
 * the way a data-parallel job drives its GPUs: each rank thread creates the
 * pool of its own device (peers = GM_PEERS_ALL) and a stream of its own, and
 * the ranks run ring all-reduces over a registrable buffer: a reduce-scatter
 * (each round a rank writes one chunk into the next rank's receive buffer
 * through its own pool — a peer write — and the receiver adds it into its
 * own chunk) and an all-gather (each round a rank writes a reduced chunk
 * straight into the next rank's buffer), with a barrier between rounds.
 * After every all-reduce every rank checks every element against the sum
 * of all ranks' values.  Meanwhile two more threads allocate, write through
 * another device's pool (peer writes into fresh pages), read back, free and
 * trim registrable segments of two of the pools, with counting register
 * hooks installed: the access grants of pages mapped and unmapped while
 * other devices copy.  At the end: each pool passes gm_pool_check, every
 * registration was deregistered once the pools are gone, and nothing is
 * left registrable.  Sized for TSan: a few hundred rounds, 64 KiB buffers.
 * Sim only.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpumem.h"
#include "../test.h"

#define MiB ((size_t)1 << 20)
#define N 4            /* ranks = devices */
#define CH 2           /* threads churning segments */
#define C 4096         /* uint32 elements per chunk */
#define ITER 100       /* all-reduces: 2 * (N - 1) copy rounds each */
#define CHURN_MAX 400  /* churn iterations at most per thread */

static gm_pool_t *pools[N];
static uint32_t *gdata[N], *grecv[N]; /* each rank's buffers, for its neighbour */
static pthread_barrier_t ranks_bar; /* the ranks */
static pthread_barrier_t all_bar;   /* ranks and churners */
static atomic_int ranks_done;
static atomic_long reg_calls, dereg_calls, reg_bytes;

typedef struct rank_result {
    int setup_ok;
    long copy_errors;      /* failed library calls */
    long bad_elements;     /* wrong sums */
    long rounds;
    int info_ok;
    int check_ok;
    char msg[256];
} rank_result_t;

typedef struct churn_result {
    long iters, bad, errors;
    char msg[256];
} churn_result_t;

static rank_result_t rres[N];
static churn_result_t cres[CH];

static int hook_reg(void *user, void *ptr, size_t size, void **handle)
{
    (void)user;
    atomic_fetch_add(&reg_calls, 1);
    atomic_fetch_add(&reg_bytes, (long)size);
    *handle = ptr;
    return GM_OK;
}

static void hook_dereg(void *user, void *ptr, size_t size, void *handle)
{
    (void)user;
    atomic_fetch_add(&dereg_calls, 1);
    atomic_fetch_sub(&reg_bytes, (long)size);
    if (handle != ptr) atomic_fetch_add(&reg_bytes, 1 << 30); /* visible as a mismatch */
}

static uint32_t value(int rank, int it, int chunk, int j)
{
    return (uint32_t)(rank + 1) * 1000003u + (uint32_t)it * 7919u + (uint32_t)chunk * 131u +
           (uint32_t)j;
}

static uint32_t sum_of(int it, int chunk, int j)
{
    uint32_t s = 0;
    for (int r = 0; r < N; r++) s += value(r, it, chunk, j);
    return s;
}

static void note(char *msg, const char *what)
{
    if (!msg[0]) snprintf(msg, 256, "%s: %s", what, gm_last_error());
}

static void *rank_main(void *arg)
{
    int r = (int)(intptr_t)arg;
    rank_result_t *res = &rres[r];
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = GM_BACKEND_SIM;
    cfg.sim_capacity = (size_t)1 << 30;
    cfg.device = r;
    cfg.peers = GM_PEERS_ALL;
    gm_pool_t *pool = NULL;
    gm_stream_t s = NULL;
    uint32_t *data = NULL, *recv = NULL;
    uint32_t *host = malloc(N * C * sizeof *host), *tmp = malloc(C * sizeof *tmp);
    int ok = host && tmp;
    if (ok && gm_pool_create(&cfg, &pool) != GM_OK) ok = 0, note(res->msg, "gm_pool_create");
    if (ok && r % 2 == 1) { /* the churned pools count registrations */
        gm_register_hooks_t k = {hook_reg, hook_dereg, NULL};
        if (gm_pool_set_register_hooks(pool, &k) != GM_OK) ok = 0, note(res->msg, "hooks");
    }
    if (ok && gm_stream_create(pool, &s) != GM_OK) ok = 0, note(res->msg, "gm_stream_create");
    if (ok && gm_alloc_registrable(pool, N * C * sizeof *data, s, (void **)&data) != GM_OK)
        ok = 0, note(res->msg, "gm_alloc_registrable");
    if (ok && gm_alloc(pool, C * sizeof *recv, s, (void **)&recv) != GM_OK)
        ok = 0, note(res->msg, "gm_alloc");
    if (ok) {
        gm_device_info_t di = GM_DEVICE_INFO_INIT;
        res->info_ok = gm_pool_device_info(pool, &di) == GM_OK && di.device == r &&
                       di.device_count == N && di.peers == (0xfu & ~(1u << r));
    }
    pools[r] = pool;
    gdata[r] = data;
    grecv[r] = recv;
    res->setup_ok = ok;
    pthread_barrier_wait(&all_bar); /* every pool exists (or the test fails) */
    int all_ok = 1;
    for (int i = 0; i < N; i++) all_ok &= rres[i].setup_ok;
    if (!all_ok) goto end;

    const size_t cb = C * sizeof(uint32_t); /* chunk bytes */
    const int next = (r + 1) % N;
    for (int it = 0; it < ITER; it++) {
        for (int c = 0; c < N; c++)
            for (int j = 0; j < C; j++) host[c * C + j] = value(r, it, c, j);
        if (gm_memcpy(pool, data, host, N * cb, s) != GM_OK) res->copy_errors++;
        pthread_barrier_wait(&ranks_bar);
        /* Reduce-scatter. */
        for (int st = 0; st < N - 1; st++) {
            int send = ((r - st) % N + N) % N;
            /* The peer write: into the next rank's receive buffer. */
            if (gm_memcpy(pool, grecv[next], data + (size_t)send * C, cb, s) != GM_OK) {
                res->copy_errors++;
                note(res->msg, "peer write (reduce-scatter)");
            }
            if (gm_stream_synchronize(pool, s) != GM_OK) res->copy_errors++;
            pthread_barrier_wait(&ranks_bar);
            int got = ((r - 1 - st) % N + N) % N;
            if (gm_memcpy(pool, tmp, recv, cb, s) != GM_OK) res->copy_errors++;
            if (gm_memcpy(pool, host, data + (size_t)got * C, cb, s) != GM_OK) res->copy_errors++;
            for (int j = 0; j < C; j++) host[j] += tmp[j];
            if (gm_memcpy(pool, data + (size_t)got * C, host, cb, s) != GM_OK) res->copy_errors++;
            if (gm_stream_synchronize(pool, s) != GM_OK) res->copy_errors++;
            pthread_barrier_wait(&ranks_bar);
            res->rounds++;
        }
        /* All-gather: rank r holds the sum of chunk r + 1. */
        for (int st = 0; st < N - 1; st++) {
            int send = (r + 1 - st + N) % N;
            if (gm_memcpy(pool, gdata[next] + (size_t)send * C,
                          data + (size_t)send * C, cb, s) != GM_OK) {
                res->copy_errors++;
                note(res->msg, "peer write (all-gather)");
            }
            if (gm_stream_synchronize(pool, s) != GM_OK) res->copy_errors++;
            pthread_barrier_wait(&ranks_bar);
            res->rounds++;
        }
        memset(host, 0, N * cb);
        if (gm_memcpy(pool, host, data, N * cb, s) != GM_OK) res->copy_errors++;
        for (int c = 0; c < N; c++)
            for (int j = 0; j < C; j++)
                if (host[c * C + j] != sum_of(it, c, j)) {
                    if (!res->bad_elements)
                        snprintf(res->msg, sizeof res->msg, "iteration %d chunk %d [%d]: %u, "
                                 "want %u", it, c, j, host[c * C + j], sum_of(it, c, j));
                    res->bad_elements++;
                }
    }
end:
    atomic_fetch_add(&ranks_done, 1);
    pthread_barrier_wait(&all_bar); /* the churners are done with the pools */
    if (pool) {
        res->check_ok = gm_pool_check(pool) == GM_OK;
        if (!res->check_ok) note(res->msg, "gm_pool_check");
        if (data && gm_free(pool, data, s) != GM_OK) res->copy_errors++;
        if (recv && gm_free(pool, recv, s) != GM_OK) res->copy_errors++;
        if (s && gm_stream_destroy(pool, s) != GM_OK) res->copy_errors++;
    }
    pthread_barrier_wait(&all_bar); /* nobody copies into this pool any more */
    gm_pool_destroy(pool);
    free(host);
    free(tmp);
    return NULL;
}

/* Churn registrable segments of pools[p]: write through the next device's
 * pool (a peer write into pages just mapped), read back through p's own,
 * free, now and then trim (pages unmapped while the ranks copy). */
static void *churn_main(void *arg)
{
    int k = (int)(intptr_t)arg;
    churn_result_t *res = &cres[k];
    pthread_barrier_wait(&all_bar);
    int all_ok = 1;
    for (int i = 0; i < N; i++) all_ok &= rres[i].setup_ok;
    const int p = 2 * k + 1, q = (p + 1) % N;
    gm_pool_t *own = pools[p], *peer = pools[q];
    enum { PAT = 64 * 1024 };
    unsigned char *w = malloc(PAT), *rd = malloc(PAT);
    if (!w || !rd) all_ok = 0, res->errors++;
    uint32_t x = 12345u + (uint32_t)k;
    while (all_ok && res->iters < CHURN_MAX && atomic_load(&ranks_done) < N) {
        x = x * 1664525u + 1013904223u;
        size_t size = (1 + (x >> 28) % 3) * MiB + (x >> 8) % 4096;
        void *seg = NULL;
        if (gm_alloc_registrable(own, size, NULL, &seg) != GM_OK || !seg) {
            res->errors++;
            note(res->msg, "gm_alloc_registrable");
            break;
        }
        for (int i = 0; i < PAT; i++) w[i] = (unsigned char)(x >> (i % 24)) ^ (unsigned char)i;
        char *tail = (char *)seg + size - PAT;
        int rc = gm_memcpy(peer, seg, w, PAT, NULL);            /* device q writes */
        if (rc == GM_OK) rc = gm_memcpy(peer, tail, seg, PAT, NULL); /* q copies within p's */
        if (rc == GM_OK) rc = gm_memcpy(own, rd, tail, PAT, NULL);   /* p reads */
        if (rc != GM_OK) {
            res->errors++;
            note(res->msg, "churn copy");
        } else if (memcmp(rd, w, PAT) != 0) {
            res->bad++;
        }
        if (gm_free(own, seg, NULL) != GM_OK) res->errors++, note(res->msg, "gm_free");
        if (res->iters % 8 == 7 && gm_trim(own, 0, NULL) != GM_OK)
            res->errors++, note(res->msg, "gm_trim");
        res->iters++;
    }
    if (all_ok && gm_trim(own, 0, NULL) != GM_OK) res->errors++;
    free(w);
    free(rd);
    pthread_barrier_wait(&all_bar); /* done with the pools */
    pthread_barrier_wait(&all_bar);
    return NULL;
}

int main(void)
{
    setenv("GPUMEM_SIM_DEVICES", "4", 1);
    unsetenv("GPUMEM_SIM_PEER_GROUP");
    REQUIRE(pthread_barrier_init(&ranks_bar, NULL, N) == 0);
    REQUIRE(pthread_barrier_init(&all_bar, NULL, N + CH) == 0);
    pthread_t rt[N], ct[CH];
    for (int r = 0; r < N; r++)
        REQUIRE(pthread_create(&rt[r], NULL, rank_main, (void *)(intptr_t)r) == 0);
    for (int k = 0; k < CH; k++)
        REQUIRE(pthread_create(&ct[k], NULL, churn_main, (void *)(intptr_t)k) == 0);
    for (int r = 0; r < N; r++) pthread_join(rt[r], NULL);
    for (int k = 0; k < CH; k++) pthread_join(ct[k], NULL);

    for (int r = 0; r < N; r++) {
        rank_result_t *res = &rres[r];
        if (res->msg[0]) fprintf(stderr, "rank %d: %s\n", r, res->msg);
        CHECK(res->setup_ok);
        CHECK(res->info_ok);
        CHECK(res->copy_errors == 0);
        CHECK(res->bad_elements == 0);
        CHECK(res->rounds == (long)ITER * 2 * (N - 1));
        CHECK(res->check_ok);
    }
    long churned = 0;
    for (int k = 0; k < CH; k++) {
        churn_result_t *res = &cres[k];
        if (res->msg[0]) fprintf(stderr, "churn %d: %s\n", k, res->msg);
        CHECK(res->errors == 0);
        CHECK(res->bad == 0);
        churned += res->iters;
    }
    CHECK(churned > 0);
    /* Every segment of the hooked pools was registered once and deregistered
     * once (cached ones by gm_trim, the rest by gm_pool_destroy). */
    long regs = atomic_load(&reg_calls), deregs = atomic_load(&dereg_calls);
    printf("%ld churn iterations, %ld registrations, %ld deregistrations\n", churned, regs,
           deregs);
    CHECK(regs > 2 && regs == deregs);
    CHECK(atomic_load(&reg_bytes) == 0);
    /* The process holds nothing registrable any more. */
    gm_stats_t ps = GM_STATS_INIT;
    CHECK_OK(gm_process_stats(&ps));
    CHECK(ps.registrable_reserved == 0 && ps.registrable_allocated == 0);
    pthread_barrier_destroy(&ranks_bar);
    pthread_barrier_destroy(&all_bar);
    unsetenv("GPUMEM_SIM_DEVICES");
    return test_summary();
}
