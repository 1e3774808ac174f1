/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mix.h — the random mix of the allocator benches (alloc_bench.c on a GPU,
 * sim_mix.c on the sim or a GPU), in one place so that both run the very
 * same sequence for a seed.
 *
 * A precomputed mix: op i picks slot[i] of MIX_SLOTS; a live slot is freed,
 * an empty one gets size[i] bytes (one op = one alloc or one free).  Slots
 * are uniform, sizes log-uniform over MIX_MIN .. max (MIX_MAX by default).
 * Link with -lm.
 */
#ifndef GM_BENCH_MIX_H
#define GM_BENCH_MIX_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define MIX_SLOTS 512
#define MIX_MIN (256.0)
#define MIX_MAX (64.0 * 1024 * 1024)

typedef struct mix {
    uint32_t *slot;
    uint64_t *size;
    size_t n;
} mix_t;

static inline uint64_t mix_rng_next(uint64_t *s) /* splitmix64 */
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* n ops from seed, sizes up to max bytes; false when out of host memory
 * (nothing to free then). */
static inline int mix_fill(mix_t *m, size_t n, uint64_t seed, double max)
{
    m->slot = malloc(n * sizeof *m->slot);
    m->size = malloc(n * sizeof *m->size);
    m->n = n;
    if (!m->slot || !m->size) {
        free(m->slot);
        free(m->size);
        return 0;
    }
    const double lo = log(MIX_MIN), hi = log(max);
    for (size_t i = 0; i < n; i++) {
        m->slot[i] = (uint32_t)(mix_rng_next(&seed) % MIX_SLOTS);
        double u = (double)(mix_rng_next(&seed) >> 11) * (1.0 / 9007199254740992.0);
        uint64_t sz = (uint64_t)exp(lo + (hi - lo) * u);
        m->size[i] = sz < 256 ? 256 : sz;
    }
    return 1;
}

static inline void mix_free(mix_t *m)
{
    free(m->slot);
    free(m->size);
    m->slot = NULL;
    m->size = NULL;
}

#endif /* GM_BENCH_MIX_H */
