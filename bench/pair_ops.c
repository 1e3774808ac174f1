/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pair_ops.c — a fixed number of alloc+free pairs of one size on one stream,
 * for counting instructions per pair under callgrind
 * (bench/behaviour_check.sh runs it at two counts and takes the difference,
 * so that start-up and pool creation cancel).  The timed figure of the same
 * loop on a GPU is alloc_bench's pair_ns.
 *
 * usage: pair_ops [--size BYTES] [--pairs N] [--backend sim|cuda]
 *   one pool (options from the environment, backend sim unless told),
 *   one stream from gm_stream_create, one warm-up pair, then N pairs.
 *
 *   cc -O2 -Iinclude bench/pair_ops.c build/libgpumem.a -lm -lpthread -ldl -lz -o pair_ops
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpumem.h"

static void die(const char *what)
{
    fprintf(stderr, "pair_ops: %s: %s\n", what, gm_last_error());
    exit(1);
}

int main(int argc, char **argv)
{
    size_t size = 512;
    unsigned long long pairs = 10000;
    gm_backend_kind_t backend = GM_BACKEND_SIM;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--size")) size = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--pairs")) pairs = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--backend"))
            backend = !strcmp(argv[i + 1], "cuda") ? GM_BACKEND_CUDA : GM_BACKEND_SIM;
        else {
            fprintf(stderr, "pair_ops: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (size == 0) {
        fprintf(stderr, "pair_ops: --size must be > 0\n");
        return 2;
    }
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    if (gm_config_from_env(&cfg) != GM_OK) die("gm_config_from_env");
    cfg.backend = backend;
    gm_pool_t *pool;
    gm_stream_t stream;
    void *p;
    if (gm_pool_create(&cfg, &pool) != GM_OK) die("gm_pool_create");
    if (gm_stream_create(pool, &stream) != GM_OK) die("gm_stream_create");
    /* The warm-up pair makes the pool reserve and map what the loop reuses. */
    if (gm_alloc(pool, size, stream, &p) != GM_OK) die("gm_alloc");
    if (gm_free(pool, p, stream) != GM_OK) die("gm_free");
    for (unsigned long long i = 0; i < pairs; i++) {
        if (gm_alloc(pool, size, stream, &p) != GM_OK) die("gm_alloc");
        if (gm_free(pool, p, stream) != GM_OK) die("gm_free");
    }
    gm_stream_destroy(pool, stream);
    gm_pool_destroy(pool);
    return 0;
}
