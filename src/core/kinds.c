/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kinds.c — the table of memory kinds, the root's address map from
 * addresses outside the arenas to their kind's record, and the one rule
 * for gm_record_stream's streams (kinds.h says what each is for).
 *
 * Accounting (gm__kinds_check): every key of the map names a record whose
 * row is in the table; the rows' own checks compare their records with the
 * pool's figures.
 */
#include <stdio.h>
#include <string.h>

#include "core/kinds.h"

struct gm__kinds {
    gm__lock_t lock;             /* taken last */
    gm__hash_t map;              /* address -> gm__kind_rec_t */
    const gm__kind_ops_t *const *rows; /* the pool's list (kinds.h) */
};

int gm__kinds_init(gm_pool_t *root, const gm__kind_ops_t *const *rows)
{
    struct gm__kinds *k = gm__calloc(1, sizeof *k);
    if (!k) return gm__set_error(GM_NO_HOST_MEMORY, "gm_pool_create: out of host memory");
    if (gm__hash_init(&k->map, 64) != GM_OK) {
        gm__free(k);
        return gm__set_error(GM_NO_HOST_MEMORY, "gm_pool_create: out of host memory");
    }
    k->rows = rows;
    root->kinds = k;
    return GM_OK;
}

const gm__kind_ops_t *const *gm__kinds_rows(gm_pool_t *pool) { return pool->root->kinds->rows; }

void gm__kinds_fini(gm_pool_t *root)
{
    if (!root->kinds) return;
    gm__hash_fini(&root->kinds->map);
    gm__free(root->kinds);
    root->kinds = NULL;
}

int gm__kinds_add(gm_pool_t *pool, uintptr_t addr, gm__kind_rec_t *rec, const char *fn)
{
    struct gm__kinds *k = pool->root->kinds;
    gm__lock(&k->lock);
    int rc = gm__hash_put(&k->map, addr, rec);
    gm__unlock(&k->lock);
    if (rc != GM_OK)
        return gm__set_error(GM_NO_HOST_MEMORY, "%s: out of host memory for bookkeeping", fn);
    return GM_OK;
}

void gm__kinds_take(gm_pool_t *pool, uintptr_t addr)
{
    struct gm__kinds *k = pool->root->kinds;
    if (!k) return; /* teardown: the map went first */
    gm__lock(&k->lock);
    (void)gm__hash_take(&k->map, addr);
    gm__unlock(&k->lock);
}

gm__kind_rec_t *gm__kinds_find(gm_pool_t *pool, uintptr_t addr)
{
    struct gm__kinds *k = pool->root->kinds;
    gm__lock(&k->lock);
    gm__kind_rec_t *r = gm__hash_get(&k->map, addr);
    gm__unlock(&k->lock);
    return r;
}

const gm__kind_ops_t *gm__kind_of_locked(gm_pool_t *pool, const void *ptr, gm__kind_rec_t **rec)
{
    *rec = NULL;
    if (gm__heap_holds(pool, (uintptr_t)ptr)) {
        gm__block_t *b = gm__hash_get(&pool->live, (uintptr_t)ptr);
        if (!b || atomic_load_explicit(&b->tc_cached, memory_order_relaxed))
            return NULL; /* freed (perhaps waiting in a thread cache), or inside a block */
        return pool->root->kinds->rows[b->shared ? 1 : 0];
    }
    gm__kind_rec_t *r = gm__kinds_find(pool, (uintptr_t)ptr);
    if (!r) return NULL;
    *rec = r;
    return r->ops;
}

int gm__kinds_check(gm_pool_t *root)
{
    int rc = GM_OK;
    gm__lock(&root->lock);
    struct gm__kinds *k = root->kinds;
    gm__lock(&k->lock);
    for (size_t i = 0; i < k->map.cap && rc == GM_OK; i++) {
        if (!k->map.keys[i]) continue;
        const gm__kind_rec_t *r = k->map.vals[i];
        bool known = false;
        for (unsigned j = 0; k->rows[j] && !known; j++) known = r->ops == k->rows[j];
        if (!known)
            rc = gm__set_error(GM_INTERNAL, "kinds: address %#lx names a record of no kind",
                               (unsigned long)k->map.keys[i]);
    }
    gm__unlock(&k->lock);
    for (unsigned j = 0; k->rows[j] && rc == GM_OK; j++)
        if (k->rows[j]->check) rc = k->rows[j]->check(root);
    gm__unlock(&root->lock);
    return rc;
}

/* ---- recorded streams ------------------------------------------------------ */

int gm__recset_add(gm__recset_t *r, gm_stream_t stream, const char *fn)
{
    for (unsigned i = 0; i < r->n; i++)
        if (r->v[i] == stream) return GM_OK;
    if (r->n == r->cap) {
        unsigned cap = r->cap ? r->cap * 2 : 4;
        gm_stream_t *v = cap > r->cap ? gm__realloc(r->v, cap * sizeof *v) : NULL;
        if (!v) return gm__set_error(GM_NO_HOST_MEMORY, "%s: out of host memory", fn);
        r->v = v;
        r->cap = cap;
    }
    r->v[r->n++] = stream;
    return GM_OK;
}

int gm__recset_wait(gm_pool_t *pool, const gm__recset_t *r, gm_stream_t except)
{
    for (unsigned i = 0; i < r->n; i++) {
        if (r->v[i] == except) continue;
        int rc;
        GM_BK(rc, pool, stream_sync, (pool->bk, r->v[i]));
        if (rc != GM_OK) return rc;
    }
    return GM_OK;
}

void gm__recset_clear(gm__recset_t *r)
{
    gm__free(r->v);
    *r = (gm__recset_t){0};
}
