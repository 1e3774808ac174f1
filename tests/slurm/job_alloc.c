/* SPDX-License-Identifier: Apache-2.0 */
/*
 * job_alloc.c — a job's process for tests/slurm/slurm_test.sh: a pool made
 * from the environment (GPUMEM_BROKER, set by the SPANK plugin) allocates
 * BYTES in 32 MiB blocks, says what it got ("ok pid N bytes B" or "fail pid
 * N bytes B: <the library's error>", then "job tenant T", GPUMEM_TENANT as
 * the plugin set it), and with --hold keeps the memory until it is killed
 * (--hold MS: for MS milliseconds, then exits).  Exit 0 when all of it was allocated, 1 otherwise.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpumem.h"

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: job_alloc BYTES [--hold [MS]]\n");
        return 2;
    }
    unsigned long long want = strtoull(argv[1], NULL, 10);
    int hold = argc > 2 && !strcmp(argv[2], "--hold");
    long hold_ms = hold && argc > 3 ? strtol(argv[3], NULL, 10) : -1;
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    gm_pool_t *pool = NULL;
    if (gm_config_from_env(&cfg) != GM_OK || gm_pool_create(&cfg, &pool) != GM_OK) {
        printf("fail pid %d bytes 0: %s\n", (int)getpid(), gm_last_error());
        fflush(stdout);
        return 1;
    }
    const size_t block = (size_t)32 << 20;
    unsigned long long got = 0;
    int rc = 0;
    while (got < want) {
        size_t n = want - got < block ? (size_t)(want - got) : block;
        void *p;
        if (gm_alloc(pool, n, NULL, &p) != GM_OK) {
            printf("fail pid %d bytes %llu: %s\n", (int)getpid(), got, gm_last_error());
            rc = 1;
            break;
        }
        got += n;
    }
    if (!rc) printf("ok pid %d bytes %llu\n", (int)getpid(), got);
    printf("job tenant %s\n", getenv("GPUMEM_TENANT") ? getenv("GPUMEM_TENANT") : "(none)");
    fflush(stdout);
    if (hold && hold_ms >= 0) {
        struct timespec ts = {hold_ms / 1000, (hold_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    } else if (hold) {
        for (;;) pause();
    }
    gm_pool_destroy(pool);
    return rc;
}
