/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_kinds.c — every kind of memory gm_free takes (a device block, a block
 * held by sharing, a sysmem-fallback block, managed memory, a registrable
 * segment) is sized, recorded on streams, listed in the leak report and
 * freed through the same entry points, and gm_record_stream has one rule for
 * all of them: any number of distinct streams (nine here; a sysmem block
 * used to refuse a ninth and managed memory any).  Pinned host memory is
 * refused by all three with GM_INVALID_ARGUMENT.  The kinds whose free waits
 * on the host for recorded streams (sysmem, managed, segments) leave the
 * block live while one of them cannot finish.  Needs the sim backend.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpumem.h"
#include "../test.h"

#define MiB ((size_t)1 << 20)
#define NSTREAMS 9

enum { DEVICE, SHARED, SYSMEM, MANAGED, SEGMENT, NKINDS };
static const char *const kind_names[NKINDS] = {"device", "shared", "sysmem", "managed", "segment"};

static char report[1 << 16];

/* Whether the leak report of pool lists a leak of `size` bytes at p. */
static int listed(gm_pool_t *pool, const void *p, size_t size)
{
    size_t len = 0;
    if (gm_leak_report(pool, report, sizeof report, &len) != GM_OK) return -1;
    char line[96];
    snprintf(line, sizeof line, "Leaked %zu bytes at %#lx\n", size, (unsigned long)(uintptr_t)p);
    return strstr(report, line) != NULL;
}

static int leaked_count(gm_pool_t *pool)
{
    size_t len = 0;
    if (gm_leak_report(pool, report, sizeof report, &len) != GM_OK) return -1;
    const char *s = strstr(report, "LEAK SUMMARY: ");
    unsigned long long bytes, n;
    if (!s || sscanf(s, "LEAK SUMMARY: %llu bytes leaked in %llu allocations", &bytes, &n) != 2)
        return -1;
    return (int)n;
}

int main(void)
{
    gm_pool_t *pool = sim_pool(64 * MiB, GM_POOL_SYSMEM_FALLBACK);
    REQUIRE(pool != NULL);
    gm_stream_t st[NSTREAMS];
    for (int i = 0; i < NSTREAMS; i++) REQUIRE(gm_stream_create(pool, &st[i]) == GM_OK);

    void *p[NKINDS] = {0};
    const size_t size[NKINDS] = {40 * MiB + 5, 2 * MiB, 32 * MiB + 3, MiB + 7, 3 * MiB + 1};
    CHECK_OK(gm_alloc_registrable(pool, size[SEGMENT], NULL, &p[SEGMENT]));
    CHECK_OK(gm_alloc_managed(pool, size[MANAGED], 0, NULL, &p[MANAGED]));
    CHECK_OK(gm_alloc_shareable(pool, size[SHARED], NULL, &p[SHARED]));
    CHECK_OK(gm_alloc(pool, size[DEVICE], NULL, &p[DEVICE]));
    CHECK_OK(gm_alloc(pool, size[SYSMEM], NULL, &p[SYSMEM])); /* past the device: the fallback */
    REQUIRE(pool_stats_of(pool).sysmem_count == 1);
    for (int k = 0; k < NKINDS; k++) REQUIRE(p[k] != NULL);

    char path[108];
    snprintf(path, sizeof path, "%s/gm-kinds-%d.sock", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getpid());
    unlink(path);
    gm_share_server_t *srv = NULL;
    REQUIRE(gm_share_listen(pool, path, NULL, &srv) == GM_OK);
    CHECK_OK(gm_share_publish(srv, "kinds", p[SHARED], size[SHARED], GM_SHARE_READ_WRITE, NULL,
                              NULL));

    void *host = NULL;
    CHECK_OK(gm_host_alloc(pool, 4096, NULL, &host));

    /* Sizes, nine streams each, the leak report: the same for every kind. */
    for (int k = 0; k < NKINDS; k++) {
        size_t sz = 0;
        CHECK_OK(gm_block_size(pool, p[k], &sz));
        if (sz != size[k]) fprintf(stderr, "%s: block size %zu, expected %zu\n", kind_names[k], sz,
                                   size[k]);
        CHECK(sz == size[k]);
        for (int i = 0; i < NSTREAMS; i++) {
            int rc = gm_record_stream(pool, p[k], st[i]);
            if (rc != GM_OK)
                fprintf(stderr, "%s: gm_record_stream of stream %d: %d (%s)\n", kind_names[k],
                        i + 1, rc, gm_last_error());
            CHECK(rc == GM_OK);
            CHECK_OK(gm_record_stream(pool, p[k], st[i])); /* again: nothing new */
        }
        CHECK(listed(pool, p[k], size[k]) == 1);
    }
    CHECK(leaked_count(pool) == NKINDS);
    CHECK_OK(gm_pool_check(pool));

    /* Pinned host memory: not gm_free's, nothing done. */
    size_t hs = 0;
    CHECK_RC(gm_free(pool, host, NULL), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_block_size(pool, host, &hs), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_record_stream(pool, host, st[0]), GM_INVALID_ARGUMENT);
    CHECK(strstr(gm_last_error(), "gm_host_free") != NULL);
    CHECK(listed(pool, host, 4096) == 0);

    /* A recorded stream that cannot finish: the kinds whose free waits for
     * their streams keep the block live, and a later free succeeds. */
    CHECK_OK(gm_sim_hold_stream(pool, st[4], 1));
    for (int k = SYSMEM; k <= SEGMENT; k++) {
        int rc = gm_free(pool, p[k], NULL);
        CHECK(rc == GM_NOT_READY);
        size_t sz = 0;
        CHECK_OK(gm_block_size(pool, p[k], &sz));
        CHECK(sz == size[k]);
    }
    CHECK_OK(gm_sim_hold_stream(pool, st[4], 0));

    /* gm_free of each kind; then it is gone (the shared block once its
     * publication goes). */
    for (int k = 0; k < NKINDS; k++) {
        int rc = gm_free(pool, p[k], st[0]);
        if (rc != GM_OK) fprintf(stderr, "%s: gm_free: %d (%s)\n", kind_names[k], rc, gm_last_error());
        CHECK(rc == GM_OK);
    }
    CHECK(leaked_count(pool) == 1);
    CHECK(listed(pool, p[SHARED], size[SHARED]) == 1);
    size_t sz = 0;
    CHECK_OK(gm_block_size(pool, p[SHARED], &sz)); /* held while published */
    for (int k = 0; k < NKINDS; k++) {
        if (k == SHARED) continue;
        CHECK_RC(gm_block_size(pool, p[k], &sz), GM_INVALID_POINTER);
        int rc = gm_free(pool, p[k], NULL);
        CHECK(rc == GM_INVALID_POINTER || rc == GM_DOUBLE_FREE);
    }
    CHECK_RC(gm_free(pool, p[SHARED], NULL), GM_DOUBLE_FREE);
    CHECK_OK(gm_pool_check(pool));
    CHECK_OK(gm_share_unpublish(srv, "kinds"));
    CHECK_RC(gm_block_size(pool, p[SHARED], &sz), GM_INVALID_POINTER);
    CHECK(leaked_count(pool) == 0);
    gm_stats_t s = pool_stats_of(pool);
    CHECK(s.allocated == 0 && s.sysmem_allocated == 0 && s.managed_allocated == 0 &&
          s.registrable_allocated == 0);
    CHECK_OK(gm_pool_check(pool));

    CHECK_OK(gm_host_free(pool, host, NULL));
    CHECK_OK(gm_share_close(srv));
    for (int i = 0; i < NSTREAMS; i++) CHECK_OK(gm_stream_destroy(pool, st[i]));
    gm_pool_destroy(pool);
    return test_summary();
}
