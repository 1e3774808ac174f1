/* SPDX-License-Identifier: Apache-2.0 */
/*
 * policy_mix.h — the random mix the page-policy tests run (test_placement,
 * test_controller): SLOTS slots, each operation frees the slot's block or
 * allocates one of a size over 256 B .. 64 MiB, each power of two as likely
 * (uniform within it), so most large ones span several 2 MiB pages.  OPS
 * operations a pass: about 50 000 allocations.  Include after ../test.h.
 */
#ifndef GM_TEST_POLICY_MIX_H
#define GM_TEST_POLICY_MIX_H

#include <stddef.h>
#include <stdint.h>

#include "gpumem.h"

#define SLOTS 512
#define OPS 100000

typedef struct mix {
    uint32_t slot[OPS];
    size_t size[OPS];
} mix_t;

static inline void mix_make(mix_t *m, uint64_t seed)
{
    for (size_t i = 0; i < OPS; i++) {
        m->slot[i] = (uint32_t)(rng_next(&seed) % SLOTS);
        size_t lo = (size_t)256 << (rng_next(&seed) % 18);
        m->size[i] = lo + (size_t)(rng_next(&seed) % lo);
    }
}

/* Backend calls of every kind so far. */
static inline uint64_t calls_of(const gm_stats_t *st)
{
    uint64_t n = 0;
    for (int k = 0; k < GM_CALL_COUNT; k++) n += st->backend_calls[k];
    return n;
}

#endif /* GM_TEST_POLICY_MIX_H */
