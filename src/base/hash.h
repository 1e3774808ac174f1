/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hash.h — the library's one address -> pointer table (hash.c): live device
 * and host blocks by address, stream states by handle, leak stacks by
 * address, the sim backend's granules by number.
 *
 * The one idea: open addressing with linear probing at a load of at most
 * one half, and backward-shift deletion, so there are no tombstones and a
 * lookup touches one or two cache lines.  Key 0 marks an empty slot (no
 * caller has a key 0: addresses and handles are never NULL), and a NULL
 * value reads as "absent".  Callers lock.
 */
#ifndef GM_HASH_H
#define GM_HASH_H

#include <stddef.h>
#include <stdint.h>

typedef struct gm__hash {
    uintptr_t *keys;             /* 0 = empty */
    void **vals;
    size_t cap;                  /* power of two, or 0 before the first reserve */
    size_t count;
} gm__hash_t;

/* A table of cap slots (a power of two).  On failure h is an empty table of
 * capacity 0: get/take/slot must not be called on it; gm__hash_reserve
 * sizes it. */
int gm__hash_init(gm__hash_t *h, size_t cap);
void gm__hash_fini(gm__hash_t *h);
/* Room for one more key (a table of capacity 0 gets its first 1024 slots). */
int gm__hash_reserve(gm__hash_t *h);
/* Room for n more keys at once: after GM_OK, n puts cannot fail. */
int gm__hash_reserve_n(gm__hash_t *h, size_t n);
/* Insert a key that is absent (the caller knows it is). */
int gm__hash_put(gm__hash_t *h, uintptr_t key, void *val);
/* The value of key, or NULL. */
void *gm__hash_get(const gm__hash_t *h, uintptr_t key);
/* Where key's value is stored (to change it in place), or NULL. */
void **gm__hash_slot(const gm__hash_t *h, uintptr_t key);
/* Remove key and return its value, or NULL when it is absent. */
void *gm__hash_take(gm__hash_t *h, uintptr_t key);

#endif /* GM_HASH_H */
