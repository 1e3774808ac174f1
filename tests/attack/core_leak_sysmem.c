/* SPDX-License-Identifier: Apache-2.0 */
/*
 * core_leak_sysmem.c — attacks the leak check: a leaked block that the
 * sysmem fallback served through gm_alloc was missing from gm_leak_report
 * and from the exit report (GPUMEM_LEAK_CHECK=error exited 0), and
 * gm_pool_destroy with live blocks left no leak note in gm_last_error()
 * although the header promises one.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpumem.h"
#include "../test.h"

#define MiB ((size_t)1 << 20)

static gm_pool_t *new_pool(void) { return sim_pool(64 * MiB, GM_POOL_SYSMEM_FALLBACK); }

/* In a fresh child (no pool made yet in this process): leak one sysmem
 * block with GPUMEM_LEAK_CHECK=error and return from main's path. */
static void child_leaks(void)
{
    setenv("GPUMEM_LEAK_CHECK", "error", 1);
    gm_pool_t *pool = new_pool();
    if (!pool) _exit(2);
    void *dev, *sys;
    if (gm_alloc(pool, 48 * MiB, NULL, &dev) != GM_OK) _exit(3);
    if (gm_alloc(pool, 32 * MiB, NULL, &sys) != GM_OK) _exit(4);
    if (gm_free(pool, dev, NULL) != GM_OK) _exit(5);
    if (pool_stats_of(pool).sysmem_count != 1) _exit(6);
    fflush(NULL);
    exit(0); /* the exit check must find the sysmem block */
}

int main(void)
{
    /* First, before any pool exists here (the exit check is the first
     * pool's process's). */
    fflush(NULL);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) child_leaks();
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == GM_LEAK_EXIT_STATUS);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != GM_LEAK_EXIT_STATUS)
        fprintf(stderr, "child status %#x\n", status);

    gm_pool_t *pool = new_pool();
    REQUIRE(pool != NULL);
    void *dev, *sys;
    CHECK_OK(gm_alloc(pool, 48 * MiB, NULL, &dev));
    CHECK_OK(gm_alloc(pool, 32 * MiB, NULL, &sys));
    CHECK(pool_stats_of(pool).sysmem_count == 1);
    CHECK_OK(gm_free(pool, dev, NULL));
    char buf[8192], want[64];
    CHECK_OK(gm_leak_report(pool, buf, sizeof buf, NULL));
    snprintf(want, sizeof want, "Leaked %zu bytes at %#lx", 32 * MiB, (unsigned long)(uintptr_t)sys);
    CHECK(strstr(buf, want) != NULL);
    CHECK(strstr(buf, "in 1 allocations") != NULL);
    CHECK_OK(gm_leak_report(NULL, buf, sizeof buf, NULL));
    CHECK(strstr(buf, want) != NULL);

    /* Destroying it with the block live leaves a note. */
    void *more;
    CHECK_OK(gm_alloc(pool, 3 * MiB, NULL, &more));
    gm_pool_destroy(pool);
    const char *note = gm_last_error();
    CHECK(strstr(note, "2 live allocations") != NULL);
    CHECK(strstr(note, "1 of them from the sysmem fallback") != NULL);
    if (!strstr(note, "2 live allocations")) fprintf(stderr, "note: \"%s\"\n", note);
    return test_summary();
}
