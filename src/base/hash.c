/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hash.c — the one address -> pointer table (see hash.h).  The fold of the
 * key's second byte into the first keeps both 256-aligned addresses and
 * small integer handles spread.
 */
#include "base/hash.h"

#include <stdbool.h>

#include "base/internal.h"


static inline size_t hash_slot(uintptr_t key, size_t cap)
{
    uint64_t x = (uint64_t)key ^ ((uint64_t)key >> 8);
    return (size_t)((x * UINT64_C(0x9E3779B97F4A7C15)) >> 17) & (cap - 1);
}

/* On failure h is an empty table of capacity 0 (get/take must not be
 * called on it; gm__hash_reserve sizes it). */
int gm__hash_init(gm__hash_t *h, size_t cap)
{
    h->cap = 0;
    h->count = 0;
    h->keys = gm__calloc(cap, sizeof *h->keys);
    h->vals = gm__calloc(cap, sizeof *h->vals);
    if (!h->keys || !h->vals) {
        gm__free(h->keys);
        gm__free(h->vals);
        h->keys = NULL;
        h->vals = NULL;
        return GM_NO_HOST_MEMORY;
    }
    h->cap = cap;
    return GM_OK;
}

void gm__hash_fini(gm__hash_t *h)
{
    gm__free(h->keys);
    gm__free(h->vals);
    h->keys = NULL;
    h->vals = NULL;
}

static int hash_grow(gm__hash_t *h)
{
    gm__hash_t n;
    GM_CHECK(gm__hash_init(&n, h->cap * 2));
    for (size_t i = 0; i < h->cap; i++)
        if (h->keys[i]) {
            size_t j = hash_slot(h->keys[i], n.cap);
            while (n.keys[j]) j = (j + 1) & (n.cap - 1);
            n.keys[j] = h->keys[i];
            n.vals[j] = h->vals[i];
        }
    n.count = h->count;
    gm__hash_fini(h);
    *h = n;
    return GM_OK;
}

int gm__hash_reserve(gm__hash_t *h)
{
    if (GM_LIKELY((h->count + 1) * 2 <= h->cap)) return GM_OK;
    return h->cap ? hash_grow(h) : gm__hash_init(h, 1024);
}

int gm__hash_reserve_n(gm__hash_t *h, size_t n)
{
    if (n > SIZE_MAX / 4 - h->count)
        return gm__set_error(GM_NO_HOST_MEMORY, "hash table: %zu more keys is too many", n);
    if (!h->cap) GM_CHECK(gm__hash_init(h, 1024));
    while ((h->count + n) * 2 > h->cap) GM_CHECK(hash_grow(h));
    return GM_OK;
}

int gm__hash_put(gm__hash_t *h, uintptr_t key, void *val)
{
    GM_CHECK(gm__hash_reserve(h));
    size_t j = hash_slot(key, h->cap);
    while (h->keys[j]) j = (j + 1) & (h->cap - 1);
    h->keys[j] = key;
    h->vals[j] = val;
    h->count++;
    return GM_OK;
}

void **gm__hash_slot(const gm__hash_t *h, uintptr_t key)
{
    size_t j = hash_slot(key, h->cap);
    while (h->keys[j]) {
        if (h->keys[j] == key) return &h->vals[j];
        j = (j + 1) & (h->cap - 1);
    }
    return NULL;
}

void *gm__hash_get(const gm__hash_t *h, uintptr_t key)
{
    void **v = gm__hash_slot(h, key);
    return v ? *v : NULL;
}

/* Remove key; backward-shift deletion keeps probe chains intact. */
void *gm__hash_take(gm__hash_t *h, uintptr_t key)
{
    size_t mask = h->cap - 1, j = hash_slot(key, h->cap);
    while (h->keys[j] && h->keys[j] != key) j = (j + 1) & mask;
    if (!h->keys[j]) return NULL;
    void *val = h->vals[j];
    size_t hole = j;
    for (size_t k = (j + 1) & mask; h->keys[k]; k = (k + 1) & mask) {
        size_t home = hash_slot(h->keys[k], h->cap);
        /* Move k into the hole unless its home lies cyclically in (hole, k]. */
        bool stays = hole <= k ? (home > hole && home <= k) : (home > hole || home <= k);
        if (!stays) {
            h->keys[hole] = h->keys[k];
            h->vals[hole] = h->vals[k];
            hole = k;
        }
    }
    h->keys[hole] = 0;
    h->vals[hole] = NULL;
    h->count--;
    return val;
}

