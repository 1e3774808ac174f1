/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_offload_restore_window.c — a restore maps and fills a tag's blocks
 * heap by heap, then marks them resident, and drops each heap's lock in
 * between (all or nothing across heaps).  Any trim of a heap in that window
 * used to give back the pages just filled, because the blocks still read as
 * offloaded; gm_restore then returned GM_OK over unmapped memory.  Two ways
 * in (both found by attacking the API):
 *   - several heaps under a pool limit: the restore's own reclaim of the
 *     other heaps' free pages trimmed a heap it had restored already;
 *   - gm_trim on another thread, looping, while one thread offloads and
 *     restores a tag whose blocks share pages with untagged neighbours.
 * Every restore that returns GM_OK must leave every block's bytes readable
 * and intact, and gm_pool_check must pass.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "offload_util.h"

/* ---- several heaps under a pool limit --------------------------------------- */

static const size_t heap_sz[2] = {300, 12 * MiB + 1};

typedef struct heap_job {
    gm_pool_t *pool;
    gm_tag_t tag;
    int t;
    void *blk[2], *untagged;
    int rc;
} heap_job_t;

/* Each thread is given a heap of its own at its first allocation. */
static void *heap_job_main(void *arg)
{
    heap_job_t *j = arg;
    for (int i = 0; i < 2 && j->rc == GM_OK; i++) {
        j->rc = gm_alloc_tagged(j->pool, heap_sz[i], NULL, j->tag, &j->blk[i]);
        if (j->rc == GM_OK) j->rc = dev_fill(j->pool, j->blk[i], heap_sz[i], 10 * j->t + i, NULL);
    }
    if (j->rc == GM_OK) j->rc = gm_alloc(j->pool, (size_t)(j->t + 1) * MiB, NULL, &j->untagged);
    scratch_free();
    return NULL;
}

static void heaps_under_limit(void)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = test_backend(); /* GPUMEM_TEST_BACKEND */
    cfg.sim_capacity = 256 * MiB;
    cfg.heaps = 2;
    gm_pool_t *pool = pool_from(&cfg);
    gm_tag_t tag;
    if (!pool || gm_tag_get("window_heaps", 0, &tag) != GM_OK) {
        CHECK(pool != NULL && !"tag");
        if (pool) gm_pool_destroy(pool);
        return;
    }
    heap_job_t jobs[2];
    for (int t = 0; t < 2; t++) {
        jobs[t] = (heap_job_t){pool, tag, t, {NULL, NULL}, NULL, GM_OK};
        pthread_t th;
        if (pthread_create(&th, NULL, heap_job_main, &jobs[t]) == 0) pthread_join(th, NULL);
        else jobs[t].rc = GM_INTERNAL;
        CHECK_OK(jobs[t].rc);
    }
    CHECK_OK(gm_offload(pool, tag, 0, NULL));
    gm_stats_t st = GM_STATS_INIT;
    CHECK_OK(gm_pool_stats(pool, &st));
    int restored = 0, refused = 0;
    for (size_t lim = st.reserved; lim <= 64 * MiB && !restored; lim += 2 * MiB) {
        CHECK_OK(gm_pool_set_limit(pool, lim));
        int rc = gm_restore(pool, tag, NULL);
        if (rc == GM_LIMIT) {
            refused++;
            gm_tag_info_t ti = tag_info_of(pool, tag);
            CHECK(ti.resident_blocks == 0); /* all or nothing */
            continue;
        }
        CHECK_OK(rc);
        restored = 1;
        CHECK_OK(gm_pool_check(pool));
        CHECK_OK(gm_pool_set_limit(pool, 0));
        for (int t = 0; t < 2; t++)
            for (int i = 0; i < 2; i++)
                CHECK(dev_check(pool, jobs[t].blk[i], heap_sz[i], 10 * t + i, NULL, "restored under a limit"));
    }
    CHECK(restored);
    printf("two heaps: %d restores refused by the limit, then one returned GM_OK\n", refused);
    for (int t = 0; t < 2; t++) {
        for (int i = 0; i < 2; i++) CHECK_OK(gm_free(pool, jobs[t].blk[i], NULL));
        CHECK_OK(gm_free(pool, jobs[t].untagged, NULL));
    }
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
}

/* ---- a trim on another thread ------------------------------------------------ */

static atomic_int trim_stop;
static atomic_uint trims;

static void *trimmer(void *arg)
{
    gm_pool_t *pool = arg;
    while (!atomic_load(&trim_stop)) {
        size_t released = 0;
        if (gm_trim(pool, 0, &released) == GM_OK) atomic_fetch_add(&trims, 1);
    }
    return NULL;
}

static void trim_beside(void)
{
    static const size_t sz[3] = {300, 3 * MiB + 1, MiB + 5};
    gm_pool_t *pool = test_pool(256 * MiB, 0);
    gm_tag_t tag;
    if (!pool || gm_tag_get("window_trim", 0, &tag) != GM_OK) {
        CHECK(pool != NULL && !"tag");
        if (pool) gm_pool_destroy(pool);
        return;
    }
    void *blk[3], *untagged[3];
    for (int i = 0; i < 3; i++) { /* tagged blocks with untagged neighbours: pages shared */
        CHECK_OK(gm_alloc_tagged(pool, sz[i], NULL, tag, &blk[i]));
        CHECK_OK(dev_fill(pool, blk[i], sz[i], 100 + i, NULL));
        CHECK_OK(gm_alloc(pool, 1000, NULL, &untagged[i]));
    }
    atomic_store(&trim_stop, 0);
    pthread_t th;
    int up = pthread_create(&th, NULL, trimmer, pool) == 0;
    CHECK(up);
    int rounds = scaled(300, 20), bad = 0, r;
    for (r = 0; r < rounds && !bad; r++) {
        int rc = gm_offload(pool, tag, 0, NULL);
        CHECK_OK(rc);
        if (rc != GM_OK) break;
        rc = gm_restore(pool, tag, NULL);
        CHECK_OK(rc);
        if (rc != GM_OK) break;
        for (int i = 0; i < 3; i++)
            if (!dev_check(pool, blk[i], sz[i], 100 + i, NULL, "restored beside a trim")) bad = 1;
    }
    CHECK(!bad);
    atomic_store(&trim_stop, 1);
    if (up) pthread_join(th, NULL);
    CHECK_OK(gm_pool_check(pool));
    printf("one heap: %d offload/restore rounds beside %u trims\n", r, atomic_load(&trims));
    for (int i = 0; i < 3; i++) {
        CHECK_OK(gm_free(pool, blk[i], NULL));
        CHECK_OK(gm_free(pool, untagged[i], NULL));
    }
    gm_pool_destroy(pool);
}

int main(void)
{
    heaps_under_limit();
    trim_beside();
    scratch_free();
    return test_summary();
}
