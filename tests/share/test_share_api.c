/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_share_api.c — sharing in one process: a server and a client on two
 * pools of the test backend (the importer maps the exporter's pages at
 * addresses of its own, exactly as another process would).  Covers the
 * rules of gpumem.h: shareable blocks, publish checks, the same mapping for
 * a second import, read-only imports, tokens, the held free, stats, and
 * teardown by gm_pool_destroy.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpumem.h"
#include "lib/monitor_read.h"
#include "test.h"

#define MiB ((size_t)1 << 20)

static size_t page_of(gm_pool_t *p)
{
    gm_device_info_t d = GM_DEVICE_INFO_INIT;
    if (gm_pool_device_info(p, &d) != GM_OK) return 0;
    return d.granularity;
}

static int fill(gm_pool_t *p, void *dst, unsigned char seed, size_t n)
{
    unsigned char *h = malloc(n);
    if (!h) return GM_NO_HOST_MEMORY;
    for (size_t i = 0; i < n; i++) h[i] = (unsigned char)(seed + i * 7);
    int rc = gm_memcpy(p, dst, h, n, NULL);
    free(h);
    return rc;
}

static int same(gm_pool_t *p, const void *src, unsigned char seed, size_t n)
{
    unsigned char *h = malloc(n);
    if (!h) return 0;
    int ok = gm_memcpy(p, h, src, n, NULL) == GM_OK;
    for (size_t i = 0; ok && i < n; i++) ok = h[i] == (unsigned char)(seed + i * 7);
    free(h);
    return ok;
}

/* The largest share_exported / share_imported this process shows in
 * `gpumem top` (its monitor rows). */
typedef struct { uint64_t exported, imported; int found; } top_row_t;
static void top_row(const gm__mon_proc_view_t *v, void *arg)
{
    top_row_t *r = arg;
    if (v->pid != getpid()) return;
    r->found = 1;
    for (unsigned i = 0; i < v->n_pools; i++) {
        uint64_t e = gm__monitor_value(v, &v->pools[i], "share_exported");
        uint64_t m = gm__monitor_value(v, &v->pools[i], "share_imported");
        if (e > r->exported) r->exported = e;
        if (m > r->imported) r->imported = m;
    }
}

static gm_share_stats_t sstats(gm_pool_t *p)
{
    gm_share_stats_t s = GM_SHARE_STATS_INIT;
    CHECK_OK(gm_share_stats(p, &s));
    return s;
}

int main(void)
{
    gm_pool_t *exp = test_pool((size_t)1 << 30, 0), *imp = test_pool((size_t)1 << 30, 0);
    REQUIRE(exp && imp);
    size_t page = page_of(exp);
    REQUIRE(page > 0);
    char path[108];
    snprintf(path, sizeof path, "%s/gm-share-api-%d.sock",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    unlink(path);

    /* Shareable blocks own their pages. */
    void *a = NULL, *b = NULL, *small = NULL;
    CHECK_OK(gm_alloc(exp, 1000, NULL, &small)); /* something before it */
    CHECK_OK(gm_alloc_shareable(exp, 3 * MiB, NULL, &a));
    CHECK(a && (uintptr_t)a % page == 0);
    size_t bs = 0;
    CHECK_OK(gm_block_size(exp, a, &bs));
    CHECK(bs == 3 * MiB); /* the size asked for; its pages are all its own */
    CHECK_OK(gm_alloc(exp, 5 * MiB + 512, NULL, &b)); /* an ordinary block */
    CHECK_RC(gm_alloc_shareable(exp, 1, NULL, NULL), GM_INVALID_ARGUMENT);
    void *z = (void *)1;
    CHECK_OK(gm_alloc_shareable(exp, 0, NULL, &z));
    CHECK(z == NULL);
    CHECK_OK(fill(exp, a, 11, 3 * MiB));

    gm_share_server_t *srv = NULL;
    CHECK_RC(gm_share_listen(exp, "", NULL, &srv), GM_INVALID_ARGUMENT);
    gm_share_policy_t bad = GM_SHARE_POLICY_INIT;
    bad.flags = 0x80;
    CHECK_RC(gm_share_listen(exp, path, &bad, &srv), GM_INVALID_ARGUMENT);
    REQUIRE(gm_share_listen(exp, path, NULL, &srv) == GM_OK);

    /* Publish: names, access, ranges. */
    CHECK_RC(gm_share_publish(srv, "", a, MiB, GM_SHARE_READ_WRITE, NULL, NULL), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_share_publish(srv, "has space", a, MiB, GM_SHARE_READ_WRITE, NULL, NULL),
             GM_INVALID_ARGUMENT);
    CHECK_RC(gm_share_publish(srv, "w", a, MiB, 7, NULL, NULL), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_share_publish(srv, "w", a, 0, GM_SHARE_READ_WRITE, NULL, NULL), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_share_publish(srv, "w", a, 4 * MiB, GM_SHARE_READ_WRITE, NULL, NULL),
             GM_INVALID_ARGUMENT); /* past the block's end */
    CHECK_RC(gm_share_publish(srv, "w", small, 100, GM_SHARE_READ_WRITE, NULL, NULL),
             GM_INVALID_ARGUMENT); /* its page holds other blocks */
    CHECK_RC(gm_share_publish(srv, "w", (void *)0x1000, 100, GM_SHARE_READ_WRITE, NULL, NULL),
             GM_INVALID_POINTER);
    CHECK_OK(gm_share_publish(srv, "weights", a, 3 * MiB, GM_SHARE_READ_WRITE, NULL, NULL));
    CHECK_RC(gm_share_publish(srv, "weights", a, MiB, GM_SHARE_READ_WRITE, NULL, NULL),
             GM_INVALID_ARGUMENT); /* taken */
    /* A range inside the block, read-only, with a token. */
    CHECK_OK(gm_share_publish(srv, "tail", (char *)a + MiB + 100, MiB, GM_SHARE_READ_ONLY,
                              "s3cret", NULL));
    gm_share_stats_t s = sstats(exp);
    CHECK(s.servers == 1 && s.published == 2 && s.published_bytes == 4 * MiB && s.exported_bytes == 0);

    /* Import. */
    gm_share_client_t *cli = NULL;
    REQUIRE(gm_share_connect(imp, path, &cli) == GM_OK);
    void *p = NULL, *p2 = NULL, *t = NULL;
    size_t n = 0;
    int acc = -1;
    CHECK_OK(gm_share_import(cli, "weights", NULL, &p, &n, &acc));
    CHECK(p && n == 3 * MiB && acc == GM_SHARE_READ_WRITE && p != a);
    CHECK(same(imp, p, 11, 3 * MiB));
    CHECK_OK(gm_share_import(cli, "weights", NULL, &p2, NULL, NULL));
    CHECK(p2 == p); /* the same mapping, counted */
    CHECK_RC(gm_share_import(cli, "nothing", NULL, &t, NULL, NULL), GM_INVALID_ARGUMENT);
    CHECK(strstr(gm_last_error(), "nothing") != NULL);
    CHECK_RC(gm_share_import(cli, "tail", "wrong", &t, NULL, NULL), GM_DENIED);
    CHECK_RC(gm_share_import(cli, "tail", NULL, &t, NULL, NULL), GM_DENIED);
    CHECK_OK(gm_share_import(cli, "tail", "s3cret", &t, &n, &acc));
    CHECK(t && n == MiB && acc == GM_SHARE_READ_ONLY && (uintptr_t)t % page == (MiB + 100) % page);
    /* The same bytes as the exporter's at that offset. */
    unsigned char x = 0, y = 0;
    CHECK_OK(gm_memcpy(imp, &x, t, 1, NULL));
    CHECK_OK(gm_memcpy(exp, &y, (char *)a + MiB + 100, 1, NULL));
    CHECK(x == y);
    /* Writes: through the read-write import they reach the exporter. */
    CHECK_OK(gm_memset(imp, p, 0x5a, 64, NULL));
    CHECK_OK(gm_memcpy(exp, &y, a, 1, NULL));
    CHECK(y == 0x5a);
    if (test_backend() == GM_BACKEND_SIM) {
        /* ... through the read-only one they are refused. */
        CHECK(gm_memset(imp, t, 0, 1, NULL) != GM_OK);
    }
    s = sstats(exp);
    /* whole pages: "weights" covers 3 MiB, "tail" 1 MiB across a page edge */
    size_t wp = (3 * MiB + page - 1) / page, tp = (MiB + 100) / page == (2 * MiB + 99) / page ? 1 : 2;
    CHECK(s.peers == 1 && s.exported_bytes == (wp + tp) * page);
    gm_share_stats_t si = sstats(imp);
    CHECK(si.imports == 2 && si.imported_bytes == (wp + tp) * page);
    /* gpumem top shows both sides (when the monitor file could be made). */
    top_row_t row = {0};
    gm__monitor_scan(top_row, &row);
    if (row.found) CHECK(row.exported == (wp + tp) * page && row.imported == (wp + tp) * page);

    CHECK_OK(gm_pool_check(exp)); /* holds and counters while memory is shared */
    CHECK_OK(gm_pool_check(imp));
    /* The owner frees a block others map: kept until they let go. */
    gm_stats_t before = pool_stats_of(exp);
    CHECK_OK(gm_free(exp, a, NULL));
    CHECK_RC(gm_free(exp, a, NULL), GM_DOUBLE_FREE);
    CHECK_RC(gm_share_publish(srv, "again", a, MiB, GM_SHARE_READ_WRITE, NULL, NULL),
             GM_INVALID_POINTER);
    gm_stats_t after = pool_stats_of(exp);
    CHECK(after.live_blocks == before.live_blocks);
    s = sstats(exp);
    CHECK(s.held_for_peers_bytes == 4 * MiB);
    /* New blocks do not land on its pages. */
    void *c = NULL;
    CHECK_OK(gm_alloc_shareable(exp, 4 * MiB, NULL, &c));
    CHECK_OK(fill(exp, c, 99, 4 * MiB));
    CHECK(same(imp, (char *)p + 64, (unsigned char)(11 + 64 * 7), 1000));
    CHECK_OK(gm_share_unpublish(srv, "weights"));
    CHECK_RC(gm_share_unpublish(srv, "weights"), GM_INVALID_ARGUMENT);
    CHECK_OK(gm_share_unpublish(srv, "tail"));
    void *t2 = NULL;
    CHECK_OK(gm_share_import(cli, "tail", "s3cret", &t2, NULL, NULL));
    CHECK(t2 == t); /* imported already: the same mapping, no new request */
    CHECK_OK(gm_share_release(cli, t, NULL));
    CHECK_OK(gm_share_release(cli, t, NULL));
    CHECK_RC(gm_share_release(cli, t, NULL), GM_INVALID_POINTER);
    after = pool_stats_of(exp);
    CHECK(after.live_blocks == before.live_blocks + 1); /* still mapped by "weights" */
    CHECK_OK(gm_share_release(cli, p, NULL));
    CHECK(same(imp, (char *)p + 64, (unsigned char)(11 + 64 * 7), 1000)); /* one import left */
    CHECK_OK(gm_share_release(cli, p, NULL));
    /* The server drops the mapping when its message arrives. */
    for (int i = 0; i < 2000 && sstats(exp).exported_bytes; i++) usleep(1000);
    s = sstats(exp);
    CHECK(s.exported_bytes == 0 && s.held_for_peers_bytes == 0 && s.published == 0);
    after = pool_stats_of(exp);
    CHECK(after.live_blocks == before.live_blocks); /* a freed, c added */
    si = sstats(imp);
    CHECK(si.imports == 0 && si.imported_bytes == 0);
    CHECK_OK(gm_pool_check(exp));

    /* A published block that is never imported is freed at unpublish. */
    void *d = NULL;
    CHECK_OK(gm_alloc_shareable(exp, MiB, NULL, &d));
    CHECK_OK(gm_share_publish(srv, "d", d, MiB, GM_SHARE_READ_WRITE, NULL, NULL));
    gm_stats_t b2 = pool_stats_of(exp);
    CHECK_OK(gm_free(exp, d, NULL));
    CHECK(pool_stats_of(exp).live_blocks == b2.live_blocks);
    CHECK_OK(gm_share_unpublish(srv, "d"));
    CHECK(pool_stats_of(exp).live_blocks == b2.live_blocks - 1);

    /* Several blocks under one name, imported in one request. */
    {
        enum { NB = 40 };
        void *blk[NB];
        gm_share_range_t rs[NB], got[NB];
        for (int i = 0; i < NB; i++) {
            size_t sz = (size_t)(i % 3 + 1) * MiB + 4096 * (size_t)i;
            CHECK_OK(gm_alloc_shareable(exp, sz, NULL, &blk[i]));
            CHECK_OK(fill(exp, blk[i], (unsigned char)i, sz));
            rs[i].ptr = blk[i];
            rs[i].size = sz;
        }
        rs[NB - 1].ptr = (char *)blk[NB - 1] + 4096; /* a range inside its block */
        rs[NB - 1].size -= 8192;
        CHECK_RC(gm_share_publish_ranges(srv, "model", rs, 0, GM_SHARE_READ_ONLY, NULL, NULL),
                 GM_INVALID_ARGUMENT);
        gm_share_range_t badr[2] = {rs[0], {small, 100}};
        CHECK_RC(gm_share_publish_ranges(srv, "model", badr, 2, GM_SHARE_READ_ONLY, NULL, NULL),
                 GM_INVALID_ARGUMENT);
        CHECK(strstr(gm_last_error(), "range 1") != NULL);
        CHECK(sstats(exp).published == 0); /* nothing held by the refused one */
        CHECK_OK(gm_share_publish_ranges(srv, "model", rs, NB, GM_SHARE_READ_ONLY, NULL, NULL));
        gm_share_client_t *c2 = NULL;
        gm_pool_t *imp2 = test_pool((size_t)1 << 30, 0);
        REQUIRE(imp2 && gm_share_connect(imp2, path, &c2) == GM_OK);
        size_t nr = 0;
        void *one = NULL;
        CHECK_RC(gm_share_import(c2, "model", NULL, &one, NULL, NULL), GM_INVALID_ARGUMENT);
        CHECK(strstr(gm_last_error(), "gm_share_import_ranges") != NULL);
        CHECK_RC(gm_share_import_ranges(c2, "model", NULL, got, 3, &nr, NULL), GM_INVALID_ARGUMENT);
        CHECK(nr == NB);
        CHECK(sstats(imp2).imports == 0);
        int acc2 = -1;
        CHECK_OK(gm_share_import_ranges(c2, "model", NULL, got, NB, &nr, &acc2));
        CHECK(nr == NB && acc2 == GM_SHARE_READ_ONLY);
        int all = 1;
        for (int i = 0; i < NB; i++) {
            size_t off = i == NB - 1 ? 4096 : 0;
            all &= got[i].size == rs[i].size && (uintptr_t)got[i].ptr % page == off % page;
            all &= same(imp2, got[i].ptr, (unsigned char)(i + off * 7), got[i].size);
        }
        CHECK(all);
        CHECK_OK(gm_pool_check(exp));
        for (int i = 0; i < NB; i++) CHECK_OK(gm_free(exp, blk[i], NULL)); /* held */
        CHECK_OK(gm_pool_check(exp));
        CHECK_OK(gm_share_unpublish(srv, "model"));
        CHECK(sstats(exp).held_for_peers_bytes > 0);
        CHECK_OK(gm_share_release(c2, got[0].ptr, NULL));
        for (int i = 0; i < 2000 && sstats(exp).held_for_peers_bytes; i++) usleep(1000);
        CHECK(sstats(exp).held_for_peers_bytes == 0 && sstats(exp).exported_bytes == 0);
        CHECK_OK(gm_share_disconnect(c2));
        gm_pool_destroy(imp2);
        CHECK_OK(gm_pool_check(exp));
    }

    /* Another listener on the same path is refused; so is a plain file. */
    gm_share_server_t *srv2 = NULL;
    CHECK_RC(gm_share_listen(exp, path, NULL, &srv2), GM_INVALID_STATE);
    /* A path that cannot be made: a clear error naming it, nothing left. */
    CHECK_RC(gm_share_listen(exp, "/nonexistent-gm-share-dir/s.sock", NULL, &srv2), GM_IO);
    CHECK(strstr(gm_last_error(), "/nonexistent-gm-share-dir/s.sock") != NULL && srv2 == NULL);

    /* Teardown: a pool destroyed with servers and clients open. */
    void *e = NULL, *q = NULL;
    CHECK_OK(gm_alloc_shareable(exp, 2 * MiB, NULL, &e));
    CHECK_OK(gm_share_publish(srv, "e", e, 2 * MiB, GM_SHARE_READ_WRITE, NULL, NULL));
    CHECK_OK(gm_share_import(cli, "e", NULL, &q, NULL, NULL));
    gm_pool_destroy(imp); /* disconnects cli, unmapping q */
    CHECK_RC(gm_share_import(cli, "e", NULL, &q, NULL, NULL), GM_INVALID_ARGUMENT);
    for (int i = 0; i < 2000 && sstats(exp).peers; i++) usleep(1000);
    CHECK(sstats(exp).peers == 0 && sstats(exp).exported_bytes == 0);
    CHECK_OK(gm_free(exp, b, NULL));
    CHECK_OK(gm_free(exp, c, NULL));
    CHECK_OK(gm_free(exp, small, NULL));
    gm_pool_destroy(exp); /* closes srv; "e" is released with the pool */
    CHECK(access(path, F_OK) != 0);
    CHECK_RC(gm_share_close(srv), GM_INVALID_ARGUMENT);
    CHECK_OK(gm_share_close(NULL));
    CHECK_OK(gm_share_disconnect(NULL));
    return test_summary();
}
