/* SPDX-License-Identifier: Apache-2.0 */
/*
 * core_handles.c — attacks the pool handle: gm_alloc (and friends) on a
 * destroyed pool was a use-after-free, and on a pointer that is not a pool it
 * spun forever on a "lock" of garbage.  Both must be GM_INVALID_ARGUMENT, at
 * once, touching no freed memory (ASan / valgrind phases), and a destroyed
 * handle must never come to name a later pool.  A pointer that cannot be
 * read at all (0x1, an unmapped or PROT_NONE page, the inside of a live
 * pool) is refused by its address alone: it used to crash.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gpumem.h"
#include "../test.h"

#define MiB ((size_t)1 << 20)

static gm_pool_t *new_pool(void) { return sim_pool(64 * MiB, 0); }

static void all_refuse(gm_pool_t *p)
{
    void *ptr = (void *)0x1234;
    size_t size;
    gm_stats_t st = GM_STATS_INIT;
    CHECK_RC(gm_alloc(p, 4096, NULL, &ptr), GM_INVALID_ARGUMENT);
    CHECK(ptr == NULL);
    CHECK_RC(gm_free(p, (void *)0x1000, NULL), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_block_size(p, (void *)0x1000, &size), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_record_stream(p, (void *)0x1000, NULL), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_trim(p, 0, NULL), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_pool_set_limit(p, 0), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_pool_check(p), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_pool_stats(p, &st), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_host_alloc(p, 4096, NULL, &ptr), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_host_free(p, (void *)0x1000, NULL), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_stream_forget(p, (gm_stream_t)0x5), GM_INVALID_ARGUMENT);
    char buf[64];
    CHECK_RC(gm_leak_report(p, buf, sizeof buf, NULL), GM_INVALID_ARGUMENT);
    gm_pool_destroy(p); /* a no-op, not a second teardown */
}

int main(void)
{
    alarm(60); /* a spin on a garbage lock fails the test instead of hanging it */
    gm_pool_t *pool = new_pool();
    REQUIRE(pool != NULL);
    void *a;
    CHECK_OK(gm_alloc(pool, MiB, NULL, &a));
    gm_pool_destroy(pool);
    all_refuse(pool);

    /* A later pool never gets the destroyed handle. */
    gm_pool_t *again = new_pool();
    REQUIRE(again != NULL);
    CHECK(again != pool);
    CHECK_RC(gm_alloc(pool, 4096, NULL, &a), GM_INVALID_ARGUMENT);
    CHECK_OK(gm_alloc(again, 4096, NULL, &a));
    CHECK_OK(gm_free(again, a, NULL));
    gm_pool_destroy(again);

    /* Garbage: readable bytes that are no pool (all ones: a "held" lock). */
    size_t n = 64 * 1024;
    void *junk = malloc(n);
    REQUIRE(junk != NULL);
    memset(junk, 0xff, n);
    all_refuse((gm_pool_t *)junk);
    memset(junk, 0, n);
    all_refuse((gm_pool_t *)junk);
    free(junk);

    /* Garbage that cannot be read at all: each must be refused without a
     * byte of it being touched (a read would be SIGSEGV and end the test). */
    long pg = sysconf(_SC_PAGESIZE);
    void *hole = mmap(NULL, (size_t)pg, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(hole != MAP_FAILED);
    void *gone = mmap(NULL, (size_t)pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(gone != MAP_FAILED);
    REQUIRE(munmap(gone, (size_t)pg) == 0);
    gm_pool_t *live = new_pool();
    REQUIRE(live != NULL);
    gm_pool_t *unreadable[] = {
        (gm_pool_t *)(uintptr_t)1, (gm_pool_t *)(uintptr_t)0x1000, (gm_pool_t *)(uintptr_t)-4096,
        (gm_pool_t *)(uintptr_t)0xdeadbeefcafe, hole, gone,
        (gm_pool_t *)((char *)live + 8), /* inside a live pool: not a handle */
    };
    for (size_t i = 0; i < sizeof unreadable / sizeof *unreadable; i++) all_refuse(unreadable[i]);
    CHECK(strstr(gm_last_error(), "not a pool") != NULL);
    CHECK_OK(gm_alloc(live, 4096, NULL, &a)); /* the live one still works */
    CHECK_OK(gm_free(live, a, NULL));
    gm_pool_destroy(live);
    munmap(hole, (size_t)pg);
    return test_summary();
}
