/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_offload_publish_race.c — a publish that comes while its block's tag
 * is being offloaded (issue 42, finding 6).  docs/offload.md: a tag holding
 * a published block is refused whole, and an offloaded block is never
 * published; the offload's check for shared blocks and its moves must
 * therefore be one step for a publish.
 *
 *   1  deterministic: gm__offload_test_hook publishes a block of the tag at
 *      the point between the offload's check and its moves.  Either the
 *      publish is refused (GM_INVALID_STATE, saying the tag is being
 *      offloaded) and the tag is offloaded, or the publish succeeds and the
 *      offload is refused whole (GM_NOT_SUPPORTED, nothing moved); never
 *      both succeed.  gm_pool_check passes, and the name, once published,
 *      imports (another pool of this process) with the block's bytes.
 *   2  gm_pool_check notices a publication over a block marked offloaded
 *      (made by hand: the library no longer makes one).
 *   3  a race without the hook: one thread offloads and restores the tag,
 *      another publishes a block of it, imports it, checks its bytes,
 *      releases and unpublishes; the two go round for round (400 rounds,
 *      fewer in slow builds); every publish that succeeded imports, and the
 *      block publishes and imports once they are done.
 *
 * argv: none.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>

#include "core/pool.h"
#include "offload_util.h"
#include "../share/share_util.h"

static gm_share_server_t *g_srv;
static void *g_pub;
static size_t g_pub_n;
static int g_hook_rc = -1, g_hook_calls;
static char g_hook_msg[512];

static void publish_hook(gm_pool_t *root, gm_tag_t tag)
{
    (void)root;
    (void)tag;
    g_hook_calls++;
    g_hook_rc = gm_share_publish(g_srv, "race", g_pub, g_pub_n, GM_SHARE_READ_WRITE, NULL, NULL);
    snprintf(g_hook_msg, sizeof g_hook_msg, "%s", gm_last_error());
}

static gm_pool_t *importer_pool(void)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = test_backend();
    cfg.sim_capacity = (size_t)256 << 20;
    return pool_from(&cfg);
}

/* Import name through cli into imp and compare its bytes with block b's
 * pattern; 1 when the import worked and matches. */
static int import_matches(gm_share_client_t *cli, gm_pool_t *imp, const char *name,
                          const tblock_t *b, size_t off, size_t n)
{
    void *q = NULL;
    size_t got = 0;
    int rc = gm_share_import(cli, name, NULL, &q, &got, NULL);
    if (rc != GM_OK) {
        fprintf(stderr, "  import of '%s': %s (%s)\n", name, gm_errname(rc), gm_last_error());
        return 0;
    }
    int ok = got == n;
    if (ok && scratch(b->n)) {
        pattern(scratch_a, b->n, b->seed);
        ok = dev_equal(imp, q, scratch_a + off, n, NULL, "imported");
    }
    if (gm_share_release(cli, q, NULL) != GM_OK) ok = 0;
    return ok;
}

/* ---- 1 and 2 --------------------------------------------------------------------- */

static void test_hook(gm_pool_t *pool, gm_pool_t *imp, const char *path)
{
    gm_tag_t t;
    CHECK_OK(gm_tag_get("race.hook", 0, &t));
    /* 6 MiB: fewer whole pages than an extent takes, so they can be
     * published (docs/offload.md). */
    tblock_t b[2] = {{NULL, 6 * MiB, t, 0x6001, NULL}, {NULL, 3 * MiB + 300, t, 0x6002, NULL}};
    for (int i = 0; i < 2; i++) {
        CHECK_OK(gm_alloc_tagged(pool, b[i].n, NULL, t, &b[i].p));
        CHECK_OK(dev_fill(pool, b[i].p, b[i].n, b[i].seed, NULL));
    }
    size_t page = 2 * MiB;
    uintptr_t in = ((uintptr_t)b[0].p + page - 1) & ~(uintptr_t)(page - 1);
    size_t off = in - (uintptr_t)b[0].p;
    g_pub = (void *)in;
    g_pub_n = page;

    gm__offload_test_hook = publish_hook;
    int rc = gm_offload(pool, t, 0, NULL);
    gm__offload_test_hook = NULL;
    CHECK(g_hook_calls == 1);
    int published = g_hook_rc == GM_OK;
    if (published && rc == GM_OK)
        fprintf(stderr, "  a block published between the offload's check and its moves was "
                "offloaded\n");
    CHECK(!(published && rc == GM_OK));
    if (published) {
        CHECK_RC(rc, GM_NOT_SUPPORTED);
        CHECK(tag_info_of(pool, t).offloaded_blocks == 0);
    } else {
        CHECK_RC(g_hook_rc, GM_INVALID_STATE);
        CHECK(strstr(g_hook_msg, "being offloaded") != NULL);
        if (!strstr(g_hook_msg, "being offloaded")) fprintf(stderr, "  publish said: %s\n", g_hook_msg);
        CHECK_OK(rc);
        CHECK(tag_info_of(pool, t).offloaded_blocks == 2);
    }
    CHECK_OK(gm_pool_check(pool));

    gm_share_client_t *cli = NULL;
    CHECK_OK(gm_share_connect(imp, path, &cli));
    if (!published) {
        /* Offloaded: refused as such; restored, it publishes. */
        CHECK_RC(gm_share_publish(g_srv, "race", g_pub, g_pub_n, GM_SHARE_READ_WRITE, NULL, NULL),
                 GM_INVALID_STATE);
        CHECK_OK(gm_restore(pool, t, NULL));
        CHECK_OK(gm_share_publish(g_srv, "race", g_pub, g_pub_n, GM_SHARE_READ_WRITE, NULL, NULL));
    }
    if (cli) CHECK(import_matches(cli, imp, "race", &b[0], off, page));
    CHECK(check_all(pool, b, 2, "after the raced publish"));

    /* 2: a publication over a block marked offloaded is noticed. */
    gm_pool_t *heap = gm__heap_of(pool, b[0].p);
    gm__lock(&heap->lock);
    gm__block_t *blk = gm__block_at_locked(heap, (uintptr_t)b[0].p);
    uint8_t was = blk ? blk->offloaded : 0;
    if (blk) {
        blk->offloaded = GM__OFFLOADED_DISCARDED;
        heap->st.active -= blk->size; /* as an offload counts it: off the device */
    }
    gm__unlock(&heap->lock);
    CHECK(blk != NULL);
    int crc = gm_pool_check(pool);
    CHECK_RC(crc, GM_INTERNAL);
    CHECK(crc != GM_INTERNAL || strstr(gm_last_error(), "published") != NULL);
    if (crc == GM_INTERNAL && !strstr(gm_last_error(), "published"))
        fprintf(stderr, "  gm_pool_check said: %s\n", gm_last_error());
    gm__lock(&heap->lock);
    if (blk) {
        blk->offloaded = was;
        heap->st.active += blk->size;
    }
    gm__unlock(&heap->lock);
    CHECK_OK(gm_pool_check(pool));

    CHECK_OK(gm_share_unpublish(g_srv, "race"));
    if (cli) CHECK_OK(gm_share_disconnect(cli));
    for (int i = 0; i < 2; i++) CHECK_OK(gm_free(pool, b[i].p, NULL));
    CHECK_OK(gm_pool_check(pool));
}

/* ---- 3 ------------------------------------------------------------------------------ */

typedef struct race {
    gm_pool_t *pool, *imp;
    const char *path;
    gm_tag_t tag;
    tblock_t *b;
    uintptr_t in;
    size_t off;
    int rounds;
    double deadline_ms;                 /* a safety bound, far beyond the rounds' time */
    _Atomic int off_rounds, pub_rounds; /* rounds each side finished */
    _Atomic int publisher_done;
    /* counts */
    int offloads, offload_refused, off_bad;        /* the offloader's */
    int publishes, publish_refused, bad_imports, pub_bad; /* the publisher's */
} race_t;

/* Wait until the other side finished `want` rounds (or is done). */
static void wait_other(race_t *r, _Atomic int *other, int want)
{
    while (atomic_load(other) < want && !atomic_load(&r->publisher_done) && now_ms() < r->deadline_ms)
        sched_yield();
}

/* The two sides go in lockstep (round i of each starts once the other has
 * finished round i - 1), so each publish meets an offload or a restore
 * under way, whatever the machine's load. */
static void *offloader(void *arg)
{
    race_t *r = arg;
    for (int i = 0; !atomic_load(&r->publisher_done); i++) {
        wait_other(r, &r->pub_rounds, i);
        int rc = gm_offload(r->pool, r->tag, 0, NULL);
        if (rc == GM_OK) {
            r->offloads++;
            if (gm_restore(r->pool, r->tag, NULL) != GM_OK) r->off_bad++;
        } else if (rc == GM_NOT_SUPPORTED) {
            r->offload_refused++;
        } else {
            fprintf(stderr, "  gm_offload: %s (%s)\n", gm_errname(rc), gm_last_error());
            r->off_bad++;
        }
        atomic_fetch_add(&r->off_rounds, 1);
    }
    return NULL;
}

static void *publisher(void *arg)
{
    race_t *r = arg;
    gm_share_client_t *cli = NULL;
    if (gm_share_connect(r->imp, r->path, &cli) != GM_OK) {
        fprintf(stderr, "  connect: %s\n", gm_last_error());
        r->pub_bad++;
        atomic_store(&r->publisher_done, 1);
        return NULL;
    }
    for (int i = 0; i < r->rounds && now_ms() < r->deadline_ms; i++) {
        wait_other(r, &r->off_rounds, i);
        int rc = gm_share_publish(g_srv, "spin", (void *)r->in, 2 * MiB, GM_SHARE_READ_WRITE,
                                  NULL, NULL);
        if (rc == GM_OK) {
            r->publishes++;
            if (!import_matches(cli, r->imp, "spin", r->b, r->off, 2 * MiB)) r->bad_imports++;
            if (gm_share_unpublish(g_srv, "spin") != GM_OK) r->pub_bad++;
        } else if (rc == GM_INVALID_STATE) {
            r->publish_refused++; /* offloaded, or being offloaded */
        } else {
            fprintf(stderr, "  publish: %s (%s)\n", gm_errname(rc), gm_last_error());
            r->pub_bad++;
            break;
        }
        atomic_fetch_add(&r->pub_rounds, 1);
    }
    gm_share_disconnect(cli);
    scratch_free(); /* this thread's */
    atomic_store(&r->publisher_done, 1);
    return NULL;
}

static void test_race(gm_pool_t *pool, gm_pool_t *imp, const char *path)
{
    gm_tag_t t;
    CHECK_OK(gm_tag_get("race.spin", 0, &t));
    tblock_t b = {NULL, 6 * MiB, t, 0x6100, NULL};
    CHECK_OK(gm_alloc_tagged(pool, b.n, NULL, t, &b.p));
    CHECK_OK(dev_fill(pool, b.p, b.n, b.seed, NULL));
    race_t r = {.pool = pool, .imp = imp, .path = path, .tag = t, .b = &b};
    r.in = ((uintptr_t)b.p + 2 * MiB - 1) & ~(uintptr_t)(2 * MiB - 1);
    r.off = r.in - (uintptr_t)b.p;
    r.rounds = scaled(400, 40);
    r.deadline_ms = now_ms() + 120000;
    pthread_t a, p;
    CHECK(pthread_create(&a, NULL, offloader, &r) == 0);
    CHECK(pthread_create(&p, NULL, publisher, &r) == 0);
    pthread_join(p, NULL);
    pthread_join(a, NULL);
    printf("race: %d offloads (%d refused: published), %d publishes (%d refused: offloaded), "
           "%d imports failed\n", r.offloads, r.offload_refused, r.publishes, r.publish_refused,
           r.bad_imports);
    CHECK(r.bad_imports == 0);
    CHECK(r.off_bad == 0 && r.pub_bad == 0);
    CHECK_OK(gm_pool_check(pool));
    if (tag_info_of(pool, t).offloaded_blocks) CHECK_OK(gm_restore(pool, t, NULL));
    /* Quiet again: the block publishes and imports. */
    gm_share_client_t *cli = NULL;
    CHECK_OK(gm_share_connect(imp, path, &cli));
    CHECK_OK(gm_share_publish(g_srv, "spin", (void *)r.in, 2 * MiB, GM_SHARE_READ_WRITE, NULL, NULL));
    if (cli) CHECK(import_matches(cli, imp, "spin", &b, r.off, 2 * MiB));
    CHECK_OK(gm_share_unpublish(g_srv, "spin"));
    if (cli) CHECK_OK(gm_share_disconnect(cli));
    CHECK(check_all(pool, &b, 1, "after the race"));
    CHECK_OK(gm_free(pool, b.p, NULL));
    CHECK_OK(gm_pool_check(pool));
}

int main(void)
{
    gm_pool_t *pool = offload_pool((size_t)1 << 30);
    REQUIRE(pool != NULL);
    gm_pool_t *imp = importer_pool();
    REQUIRE(imp != NULL);
    char path[108];
    snprintf(path, sizeof path, "%s/gm-offl-race-%d.sock",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    unlink(path);
    REQUIRE(gm_share_listen(pool, path, NULL, &g_srv) == GM_OK);
    test_hook(pool, imp, path);
    test_race(pool, imp, path);
    CHECK_OK(gm_share_close(g_srv));
    unlink(path);
    gm_pool_destroy(imp);
    gm_pool_destroy(pool);
    scratch_free();
    return test_summary();
}
