/* SPDX-License-Identifier: Apache-2.0 */
/*
 * heaps.c — several heaps in one pool, so that threads allocating at once do
 * not wait for each other.
 *
 * The one idea: a heap is a whole pool engine (its own lock, arenas of its
 * own address space, streams, free indexes, physical pages and counters) that
 * is not a handle.  A pool made with cfg.heaps = N > 1 is heap 0, the root;
 * the first N - 1 threads after it that allocate get heaps 1..N-1, made at
 * their first allocation, and later threads are given heaps in turn.  A free
 * finds its heap by address: each heap's arenas are disjoint reservations,
 * so the owner is the heap whose range holds the pointer (the thread's own
 * heap is tried first; a pointer in no heap goes to the root, whose checks
 * word the error).  A block may be freed on any thread; a free from another
 * thread takes the owning heap's lock.
 *
 * What the heaps share: the backend (its context is thread-safe), the pool
 * limit, applied to the sum of their reserved memory (fam_reserved, an
 * atomic each heap changes when it obtains or gives back a page), and the
 * root's out-of-memory handlers, monitor, registry entry and host pools.
 * What they do not share: free physical pages.  A heap keeps its own until
 * it trims; an allocation that would fail in one heap first makes every
 * other heap drain its streams and give its free pages back
 * (gm__heaps_reclaim_others), and then retries.  So N heaps may hold up to N
 * reserve slacks and N sets of partly used pages: the price of never taking
 * a shared lock on the allocation path.  docs/design.md, "Heaps".
 *
 * Lock order: a heap's lock is never held while another heap's is taken,
 * but by gm_pool_check, which takes them all in index order.  heaps_mu (the
 * root's) is taken with no heap lock held, or under none but its own.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "core/pool.h"

_Thread_local struct gm__heap_binding gm__heap_bound;

/* Make a heap of root (heaps_mu held). */
static gm_pool_t *heap_make(gm_pool_t *root)
{
    gm_pool_t *h = gm__pool_map_new(root);
    if (!h) return NULL;
    h->hooks = root->hooks;
    h->cfg = root->cfg;
    h->cfg.initial_reserve = 0;
    h->ops = root->ops;
    h->bk = root->bk;
    h->backend_kind = root->backend_kind;
    memcpy(h->backend_reason, root->backend_reason, sizeof h->backend_reason);
    h->info = root->info;
    h->page = root->page;
    h->page_shift = root->page_shift;
    gm__lock(&root->lock);
    h->limit = root->limit;
    gm__unlock(&root->lock);
    gm__controller_init(h);
    gm__provider_local_init(&h->provider, h);
    /* One broker connection for the whole pool (its provider is thread-safe). */
    if (root->provider.ops->flags & GM__PROVIDER_SHARED) h->provider = root->provider;
    /* Less address space than the root's: a heap serves one thread's share. */
    size_t total = GM_ALIGN_UP(h->info.total_memory, h->page);
    if (gm__pool_core_init(h, total, total * 2) != GM_OK) {
        uint64_t none = 0, zero = 0;
        gm__pool_core_fini_locked(h, &none, &zero); /* no one sees it yet */
        gm__pool_map_dead(h);
        return NULL;
    }
    h->magic = GM_HEAP_MAGIC;
    if (h->hooks->heap_made) h->hooks->heap_made(h); /* e.g. its own row in gpumem top */
    return h;
}

/* The heaps this thread was given in other pools lately, so that a thread
 * using two pools by turns keeps its heap in each. */
#define BOUND_MORE 4
static _Thread_local struct gm__heap_binding bound_more[BOUND_MORE];
static _Thread_local unsigned bound_next;

static gm_pool_t *bind(gm_pool_t *root, gm_pool_t *h)
{
    struct gm__heap_binding *b = &gm__heap_bound;
    if (b->root && b->root != root) bound_more[bound_next++ % BOUND_MORE] = *b;
    b->root = root;
    b->gen = root->tc_gen;
    b->heap = h;
    return h;
}

gm_pool_t *gm__heap_self_slow(gm_pool_t *root)
{
    for (unsigned i = 0; i < BOUND_MORE; i++) {
        struct gm__heap_binding *m = &bound_more[i];
        if (m->root == root && m->gen == root->tc_gen) {
            gm_pool_t *h = m->heap;
            m->root = NULL;
            return bind(root, h);
        }
    }
    gm_pool_t *h = root;
    pthread_mutex_lock(&root->heaps_mu);
    unsigned idx = root->next_heap++ % root->heaps_max;
    if (idx != 0) {
        h = atomic_load_explicit(&root->heap[idx], memory_order_relaxed);
        if (!h) {
            h = heap_make(root);
            if (h) {
                atomic_store_explicit(&root->heap[idx], h, memory_order_release);
                if (atomic_load_explicit(&root->n_heaps, memory_order_relaxed) <= idx)
                    atomic_store_explicit(&root->n_heaps, idx + 1, memory_order_release);
            } else {
                h = root; /* no memory for a heap: share the root's */
                gm__clear_error();
            }
        }
    }
    pthread_mutex_unlock(&root->heaps_mu);
    return bind(root, h);
}

void gm__heaps_destroy(gm_pool_t *root, uint64_t *blocks, uint64_t *bytes)
{
    unsigned m = atomic_load_explicit(&root->n_heaps, memory_order_acquire);
    for (unsigned i = 1; i < m; i++) {
        gm_pool_t *h = atomic_load_explicit(&root->heap[i], memory_order_acquire);
        if (!h) continue;
        atomic_store_explicit(&root->heap[i], NULL, memory_order_release);
        if (h->hooks->heap_gone) h->hooks->heap_gone(h);
        gm__lock(&h->lock);
        gm__pool_core_fini_locked(h, blocks, bytes);
        gm__unlock(&h->lock);
        gm__pool_map_dead(h);
    }
    atomic_store_explicit(&root->n_heaps, 1, memory_order_release);
}

bool gm__heaps_reclaim_others(gm_pool_t *h)
{
    gm_pool_t *root = h->root, *o;
    if (atomic_load_explicit(&root->n_heaps, memory_order_acquire) <= 1) return false;
    size_t got = 0;
    gm__unlock(&h->lock);
    for (unsigned i = 0; (o = gm__heap_next(root, &i));) {
        if (o == h) continue;
        gm__lock(&o->lock);
        gm__tcache_reclaim_large_locked(o);
        gm__drain_streams_locked(o);
        size_t r = 0;
        if (gm__pages_trim_locked(o, 0, &r) != GM_OK) gm__clear_error();
        got += r;
        if (o->hooks->trimmed_locked) o->hooks->trimmed_locked(o);
        gm__unlock(&o->lock);
    }
    gm__lock(&h->lock);
    return got > 0;
}
