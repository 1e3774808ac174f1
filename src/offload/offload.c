/* SPDX-License-Identifier: Apache-2.0 */
/*
 * offload.c — tags, offload and restore: gm_tag_get, gm_tag_scope,
 * gm_offload, gm_restore, gm_tag_acquire / gm_tag_release, gm_tag_info, and
 * eviction under pressure (GM_POOL_EVICT).
 *
 * The one idea: an offloaded block stays a live block — same address, same
 * record in the live table, same stream — whose data sits in a host copy
 * and whose pages have been given back.  Its pages stay marked used, so no
 * other allocation is ever placed in its range; the page layer releases a
 * page only when nothing resident lies in it (gm__pages_evict_locked), and
 * a restore is the allocator's own "make this range mapped and owned"
 * (gm__pages_ensure_mapped_locked) followed by the copy back.  Pointers
 * therefore stay valid, and a page shared with a block of another tag is
 * simply not given back.
 *
 * Offload copies (copy_out_locked): in address order on one copy stream of
 * the pool's own (one stream reaches the copy engine's line rate), in
 * pieces of a sixteenth of the tag (one page to OFFL_MARK bytes) with an
 * event after each, into pinned host segments (one block of the host pool,
 * kind GM__HOST_OFFLOAD, per window of OFFL_WINDOW bytes of blocks; a
 * larger block has one of its own).  Each piece passed gives back the pages
 * it emptied, within a large block too, so device memory comes back while
 * the copy goes on and the last block does not give all its pages back
 * after its copy (that tail was the gap to line rate: about 26 us per 2 MiB
 * page, bench/results/...-vmm-probe.jsonl).  The segments are made by a
 * thread of the call's own, window after window: on a cold host pool,
 * touching and registering new pinned memory costs more than the copy, and
 * it overlaps the copies that way.  Restores copy in pieces of OFFL_PIECE
 * bytes on OFFL_STREAMS streams, a piece's pages mapped before its copy is
 * queued.  A segment goes back to the host pool with the last block copied
 * into it (restored or freed); the host pool keeps the registered memory
 * for the next offload (warm) until gm_host_trim.
 *
 * Order: an offload first waits for the given stream and for every stream
 * its blocks were allocated or recorded on, and drains the streams holding
 * freed blocks (a page shared with a free neighbour is released only once
 * that neighbour's stream has passed its free).  A restore's copies wait
 * for the given stream (pages it may still use are handed to it by the page
 * layer's fences) and the call returns once they are done.
 *
 * Locking: one offload, restore or eviction at a time per pool (offl->mu),
 * taken before a heap's lock; each heap is worked on under its own lock,
 * then the host lock inside host.c.  Tag figures are atomics of the root's
 * (changed under whichever heap lock holds the block).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/pool.h"
#include "host/host.h"

#define OFFL_STREAMS 4
#define OFFL_PIECE ((size_t)64 << 20)
#define OFFL_WINDOW ((size_t)128 << 20)
#define OFFL_MARK ((size_t)32 << 20)
#define OFFL_MARKS 32
#define OFFL_AHEAD_SLOW 3.0 /* touching ahead stops at a step this much slower */

/* ---- the process's tags ------------------------------------------------------ */

static pthread_mutex_t tags_mu = PTHREAD_MUTEX_INITIALIZER;
static char tag_names[GM_TAGS_MAX + 1][GM_TAG_NAME_MAX + 1];
static unsigned tag_flags[GM_TAGS_MAX + 1];
static _Atomic unsigned n_tags; /* tags 1..n_tags exist */

_Thread_local gm_tag_t gm__tag_now;
_Atomic unsigned gm__tag_scopes;

bool gm__tag_valid(gm_tag_t tag)
{
    return tag <= atomic_load_explicit(&n_tags, memory_order_acquire);
}

static unsigned tag_flags_of(gm_tag_t tag)
{
    return tag_flags[tag]; /* written before n_tags grew past it */
}

int gm_tag_get(const char *name, unsigned flags, gm_tag_t *tag)
{
    if (!tag) return gm__set_error(GM_INVALID_ARGUMENT, "gm_tag_get: tag is NULL");
    *tag = GM_TAG_NONE;
    if (!name || !name[0])
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_tag_get: a tag needs a name");
    size_t len = strnlen(name, GM_TAG_NAME_MAX + 1);
    if (len > GM_TAG_NAME_MAX)
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_tag_get: a tag's name is at most %u bytes",
                             GM_TAG_NAME_MAX);
    if (flags & ~(GM_TAG_DISCARD | GM_TAG_EVICTABLE))
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_tag_get: unknown flags %#x",
                             flags & ~(GM_TAG_DISCARD | GM_TAG_EVICTABLE));
    int rc = GM_OK;
    pthread_mutex_lock(&tags_mu);
    unsigned n = atomic_load_explicit(&n_tags, memory_order_relaxed);
    for (unsigned t = 1; t <= n; t++) {
        if (strcmp(tag_names[t], name) != 0) continue;
        if (tag_flags[t] != flags)
            rc = gm__set_error(GM_INVALID_ARGUMENT, "gm_tag_get: tag '%s' exists with flags %#x, "
                               "not %#x", name, tag_flags[t], flags);
        else
            *tag = t;
        goto out;
    }
    if (n >= GM_TAGS_MAX) {
        rc = gm__set_error(GM_LIMIT, "gm_tag_get: %u tags made already (GM_TAGS_MAX)", n);
        goto out;
    }
    memcpy(tag_names[n + 1], name, len + 1);
    tag_flags[n + 1] = flags;
    atomic_store_explicit(&n_tags, n + 1, memory_order_release);
    *tag = n + 1;
out:
    pthread_mutex_unlock(&tags_mu);
    return rc;
}

gm_tag_t gm_tag_scope(gm_tag_t tag)
{
    gm_tag_t old = gm__tag_now;
    if (!gm__tag_valid(tag)) return old;
    gm__tag_now = tag;
    if (old == GM_TAG_NONE && tag != GM_TAG_NONE)
        atomic_fetch_add_explicit(&gm__tag_scopes, 1, memory_order_relaxed);
    else if (old != GM_TAG_NONE && tag == GM_TAG_NONE)
        atomic_fetch_sub_explicit(&gm__tag_scopes, 1, memory_order_relaxed);
    return old;
}

/* ---- a pool's offload state ----------------------------------------------------- */

typedef struct tagstate {
    _Atomic uint64_t resident, resident_n;   /* requested bytes, blocks: every heap */
    _Atomic uint64_t offloaded, offloaded_n;
    uint64_t holds;                          /* offl->mu */
    uint64_t last_use;                       /* offl->tick at its last release/acquire */
    gm_stream_t release_stream;              /* its last release's stream */
    bool has_release_stream;
    uint64_t offloads, restores, evictions;  /* offl->mu */
    _Atomic bool moving;                     /* an offload of it is under way (set and
                                                cleared under offl->mu; read by a publish
                                                under a heap's lock: gm__offload_tag_moving) */
} tagstate_t;

struct gm__offload {
    pthread_mutex_t mu;
    gm_stream_t stream[OFFL_STREAMS];
    unsigned n_streams;
    gm__event_t start;                       /* a restore's copies wait for its stream */
    gm__event_t mark[OFFL_MARKS];            /* an offload's copies, piece by piece */
    uint64_t tick;
    tagstate_t tag[GM_TAGS_MAX + 1];
    /* A preparation made ahead on a thread (gm_offload_prepare with
     * GM_PREPARE_ASYNC): started and joined under mu; its sizes are the
     * thread's until joined, its status kept until gm_offload_prepare_wait. */
    pthread_t prep_th;
    bool prep_started, prep_ended;
    size_t *prep_sizes, prep_n;
    int prep_rc;
    char prep_msg[256];
};

int gm__offload_init(gm_pool_t *root)
{
    struct gm__offload *o = gm__calloc(1, sizeof *o);
    if (!o) return gm__set_error(GM_NO_HOST_MEMORY, "gm_pool_create: out of host memory");
    pthread_mutex_init(&o->mu, NULL);
    root->offl = o;
    return GM_OK;
}

static void prep_join_locked(struct gm__offload *o);

void gm__offload_fini(gm_pool_t *root)
{
    struct gm__offload *o = root->offl;
    if (!o) return;
    prep_join_locked(o); /* its memory goes with the host pool */
    int rc;
    for (unsigned i = 0; i < o->n_streams; i++) GM_BK(rc, root, stream_destroy, (root->bk, o->stream[i]));
    if (o->start) GM_BK(rc, root, event_destroy, (root->bk, o->start));
    for (unsigned i = 0; i < OFFL_MARKS; i++)
        if (o->mark[i]) GM_BK(rc, root, event_destroy, (root->bk, o->mark[i]));
    (void)rc;
    pthread_mutex_destroy(&o->mu);
    gm__free(o);
    root->offl = NULL;
}

/* The copy streams and events that are missing, made (offl->mu held). */
static int streams_ready(gm_pool_t *root, struct gm__offload *o)
{
    int rc;
    while (o->n_streams < OFFL_STREAMS) {
        GM_BK(rc, root, stream_create, (root->bk, &o->stream[o->n_streams]));
        if (rc != GM_OK) return rc;
        o->n_streams++;
    }
    if (!o->start) {
        GM_BK(rc, root, event_create, (root->bk, &o->start));
        if (rc != GM_OK) return rc;
    }
    for (unsigned i = 0; i < OFFL_MARKS; i++)
        if (!o->mark[i]) {
            GM_BK(rc, root, event_create, (root->bk, &o->mark[i]));
            if (rc != GM_OK) return rc;
        }
    return GM_OK;
}

void gm__offload_note_alloc_locked(gm_pool_t *heap, gm__block_t *b)
{
    tagstate_t *t = &heap->root->offl->tag[b->tag];
    atomic_fetch_add_explicit(&t->resident, b->requested, memory_order_relaxed);
    atomic_fetch_add_explicit(&t->resident_n, 1, memory_order_relaxed);
}

/* Host copies are carved from segments: one pinned block of the host pool
 * per window of an offload (a block larger than a window has one of its
 * own), so a tag of many small blocks costs a few large host allocations,
 * which a repeated offload finds again.  A segment goes back to the host
 * pool when the last block copied into it is restored or freed. */
typedef struct gm__offseg {
    void *base;
    size_t refs;                 /* offloaded blocks whose copy lies in it */
} offseg_t;

static offseg_t *seg_new(gm_pool_t *root, size_t bytes, int *rc)
{
    offseg_t *g = gm__calloc(1, sizeof *g);
    if (!g) {
        *rc = gm__set_error(GM_NO_HOST_MEMORY, "gm_offload: out of host memory");
        return NULL;
    }
    *rc = gm__host_alloc_kind(root, GM__HOST_OFFLOAD, bytes, NULL, &g->base, NULL);
    if (*rc != GM_OK) {
        gm__free(g);
        return NULL;
    }
    return g;
}

void gm__offload_heap_fini_locked(gm_pool_t *h)
{
    /* The host pool frees (or has freed) the memory itself: only the
     * segment records go here. */
    for (size_t i = 0; i < h->live.cap; i++) {
        if (!h->live.keys[i]) continue;
        gm__block_t *b = h->live.vals[i];
        if (!b->offloaded || !b->host_copy) continue;
        offseg_t *g = b->offseg;
        b->offseg = NULL;
        b->host_copy = NULL;
        if (g && --g->refs == 0) gm__free(g);
    }
}

static void seg_drop(gm_pool_t *root, offseg_t *g)
{
    if (!g || g->refs) return;
    if (gm__host_free_kind(root, GM__HOST_OFFLOAD, g->base, NULL) != GM_OK)
        gm__clear_error(); /* it was ours: the host pool keeps it until destroy */
    gm__free(g);
}

/* b stops being offloaded (restored, or freed): its share of its segment
 * goes back. */
static void forget_copy_locked(gm_pool_t *heap, gm__block_t *b)
{
    tagstate_t *t = &heap->root->offl->tag[b->tag];
    if (b->host_copy) {
        offseg_t *g = b->offseg;
        b->offseg = NULL;
        b->host_copy = NULL;
        if (GM_ALWAYS(g != NULL && g->refs > 0)) {
            g->refs--;
            seg_drop(heap->root, g);
        }
    }
    heap->st.offloaded -= b->requested;
    heap->st.active += b->size; /* on the device again (a free takes it off next) */
    atomic_fetch_sub_explicit(&t->offloaded, b->requested, memory_order_relaxed);
    atomic_fetch_sub_explicit(&t->offloaded_n, 1, memory_order_relaxed);
    b->offloaded = GM__OFFLOADED_NONE;
}

void gm__offload_note_free_locked(gm_pool_t *heap, gm__block_t *b)
{
    tagstate_t *t = &heap->root->offl->tag[b->tag];
    if (b->offloaded) {
        forget_copy_locked(heap, b);
        return;
    }
    atomic_fetch_sub_explicit(&t->resident, b->requested, memory_order_relaxed);
    atomic_fetch_sub_explicit(&t->resident_n, 1, memory_order_relaxed);
}

/* ---- the blocks of a tag in one heap --------------------------------------------- */

typedef struct blist {
    gm__block_t **b;
    size_t n, cap;
} blist_t;

static int by_addr(const void *x, const void *y)
{
    uintptr_t a = (*(gm__block_t *const *)x)->addr, b = (*(gm__block_t *const *)y)->addr;
    return a < b ? -1 : a > b;
}

/* The live blocks of `tag` in heap h (lock held) whose offloaded state is
 * `offloaded` (true: COPIED or DISCARDED), in address order. */
static int collect_locked(gm_pool_t *h, gm_tag_t tag, bool offloaded, blist_t *out)
{
    out->n = 0;
    for (size_t i = 0; i < h->live.cap; i++) {
        if (!h->live.keys[i]) continue;
        gm__block_t *b = h->live.vals[i];
        if (b->tag != tag || atomic_load_explicit(&b->tc_cached, memory_order_relaxed)) continue;
        if ((b->offloaded != GM__OFFLOADED_NONE) != offloaded) continue;
        if (out->n == out->cap) {
            size_t cap = out->cap ? out->cap * 2 : 64;
            gm__block_t **nb = realloc(out->b, cap * sizeof *nb);
            if (!nb) return gm__set_error(GM_NO_HOST_MEMORY, "gm_offload: out of host memory");
            out->b = nb;
            out->cap = cap;
        }
        out->b[out->n++] = b;
    }
    if (out->n > 1) qsort(out->b, out->n, sizeof out->b[0], by_addr);
    return GM_OK;
}

/* Wait for stream handle (each one once per call: seen[] holds them). */
static int sync_once(gm_pool_t *h, gm_stream_t handle, gm_stream_t *seen, size_t *n_seen, size_t cap)
{
    for (size_t i = 0; i < *n_seen; i++)
        if (seen[i] == handle) return GM_OK;
    int rc;
    GM_BK(rc, h, stream_sync, (h->bk, handle));
    if (rc != GM_OK) return rc;
    if (*n_seen < cap) seen[(*n_seen)++] = handle;
    return GM_OK;
}

/* Wait for `stream` and for every stream the blocks of bl were allocated
 * or recorded on (each once).  Lock held. */
static int sync_blocks_locked(gm_pool_t *h, const blist_t *bl, gm_stream_t stream)
{
    gm_stream_t seen[64];
    size_t n_seen = 0;
    GM_CHECK(sync_once(h, stream, seen, &n_seen, 64));
    for (size_t i = 0; i < bl->n; i++) {
        const gm__block_t *b = bl->b[i];
        /* A forgotten stream's work was waited for then (its handle may
         * be gone). */
        if (!b->owner->retired) GM_CHECK(sync_once(h, b->owner->handle, seen, &n_seen, 64));
        for (const gm__recorded_t *r = b->recorded; r; r = r->next)
            if (!r->stream->retired) GM_CHECK(sync_once(h, r->stream->handle, seen, &n_seen, 64));
    }
    return GM_OK;
}

/* Queue the copy of n bytes in pieces over the copy streams (*next: the
 * stream the next piece goes to). */
static int copy_pieces(gm_pool_t *root, struct gm__offload *o, uintptr_t dst, uintptr_t src,
                       size_t n, unsigned *next)
{
    for (size_t off = 0; off < n;) {
        size_t len = n - off < OFFL_PIECE ? n - off : OFFL_PIECE;
        int rc;
        gm_stream_t st = o->stream[*next % o->n_streams];
        GM_BK(rc, root, memcpy, (root->bk, dst + off, src + off, len, st));
        if (rc != GM_OK) return rc;
        *next += 1;
        off += len;
    }
    return GM_OK;
}

/* Every copy stream idle (after a failure: nothing of ours in flight).
 * Best effort: the first error is returned, each stream is tried. */
static int streams_idle(gm_pool_t *root, struct gm__offload *o)
{
    int first = GM_OK, rc;
    for (unsigned i = 0; i < o->n_streams; i++) {
        GM_BK(rc, root, stream_sync, (root->bk, o->stream[i]));
        if (rc != GM_OK && first == GM_OK) first = rc;
    }
    return first;
}

/* ---- offload ------------------------------------------------------------------------ */

typedef struct result {
    uint64_t blocks, bytes, released; /* moved by this call */
} result_t;

/* b's copy is complete (or discarded): it is offloaded. */
static void offloaded_locked(gm_pool_t *h, gm__block_t *b, void *copy, offseg_t *seg,
                             result_t *res)
{
    tagstate_t *t = &h->root->offl->tag[b->tag];
    b->offloaded = copy ? GM__OFFLOADED_COPIED : GM__OFFLOADED_DISCARDED;
    b->host_copy = copy;
    b->offseg = copy ? seg : NULL;
    if (copy) seg->refs++;
    h->st.offloaded += b->requested;
    h->st.active -= b->size; /* active counts what is on the device */
    h->st.offload_count++;
    if (copy) h->st.offload_bytes_total += b->requested;
    atomic_fetch_sub_explicit(&t->resident, b->requested, memory_order_relaxed);
    atomic_fetch_sub_explicit(&t->resident_n, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&t->offloaded, b->requested, memory_order_relaxed);
    atomic_fetch_add_explicit(&t->offloaded_n, 1, memory_order_relaxed);
    res->blocks++;
    res->bytes += b->requested;
}

/* Release what can be released of blocks[lo, hi); the first error.  A
 * page kept (a resident neighbour, a fence) is looked at again by a later
 * trim once a neighbour's free may have changed that. */
static int evict_range_locked(gm_pool_t *h, gm__block_t **blocks, size_t lo, size_t hi,
                              result_t *res)
{
    int first = GM_OK;
    size_t kept = 0;
    for (size_t i = lo; i < hi; i++) {
        size_t rel = 0;
        int rc = gm__pages_evict_locked(h, blocks[i], &rel, &kept);
        res->released += rel;
        if (rc != GM_OK && first == GM_OK) first = rc;
    }
    if (kept || first != GM_OK) h->offl_dirty = true;
    return first;
}

void gm__offload_trim_locked(gm_pool_t *h)
{
    h->offl_dirty = false;
    size_t kept = 0;
    int first = GM_OK;
    for (size_t i = 0; i < h->live.cap; i++) {
        if (!h->live.keys[i]) continue;
        gm__block_t *b = h->live.vals[i];
        if (!gm__block_off_device(b)) continue; /* resident, or being restored */
        int rc = gm__pages_evict_locked(h, b, NULL, &kept);
        if (rc != GM_OK && first == GM_OK) first = rc;
    }
    if (first != GM_OK) {
        h->offl_dirty = true;
        gm__clear_error(); /* a trim gives back what it can */
    }
}

/* Does heap h hold a block of tag that sharing holds (lock taken here)? */
static bool tag_shared(gm_pool_t *h, gm_tag_t tag, void **which)
{
    bool found = false;
    gm__lock(&h->lock);
    for (size_t i = 0; i < h->live.cap && !found; i++) {
        if (!h->live.keys[i]) continue;
        gm__block_t *b = h->live.vals[i];
        if (b->tag == tag && b->shared) {
            found = true;
            *which = (void *)b->addr;
        }
    }
    gm__unlock(&h->lock);
    return found;
}

/* A point in an offload's copies: every byte before byte `off` of block
 * `blk` (in the call's address order) is copied once its event has passed. */
typedef struct mark {
    size_t blk, off;
} mark_t;

/* One offload's copies in one heap (offload_heap).  Host copies are placed
 * window by window: the blocks [win_end[w-1], win_end[w]) share segment w.
 * The segments are made by a thread of the call's own (segmaker_main), in
 * window order, while this thread queues copies and gives pages back: on
 * a cold host pool, touching and registering new pinned memory is the
 * larger cost, and it overlaps the copies that way. */
typedef struct ocopy {
    gm_pool_t *root, *h;
    struct gm__offload *o;
    const blist_t *bl;
    result_t *res;
    void **copies;             /* per block: its host copy */
    offseg_t **segs;           /* per block: the segment it lies in */
    size_t n_win, *win_end, *win_bytes;
    offseg_t **wseg;           /* per window: made (mu) */
    size_t piece;              /* bytes between marks */
    size_t fin, fin_off;       /* blocks [0, fin) offloaded; bytes of bl->b[fin] given back */
    size_t qb, qoff;           /* copies queued: blocks [0, qb) and qoff bytes of bl->b[qb] */
    mark_t ring[OFFL_MARKS];
    unsigned r_head, r_n;
    /* The segment maker (mu and cv live while it is started). */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
    bool started, stop;        /* stop: mu */
    size_t made;               /* windows [0, made) done, made or failed (mu) */
    int mk_rc;                 /* its failure, at window made - 1 (mu) */
    char mk_msg[256];
} ocopy_t;

/* Touching one window's new memory while the segment maker registers the
 * window before it. */
typedef struct prep_job {
    gm_pool_t *root;
    size_t csize;
} prep_job_t;

static void *prep_main(void *arg)
{
    prep_job_t *j = arg;
    gm__host_prepare(j->root, j->csize);
    return NULL;
}

static void *segmaker_main(void *arg)
{
    ocopy_t *c = arg;
    /* On a cold host pool, window w+1's new memory is touched (CPU work,
     * gm__host_prepare) while window w's registers (the driver's): the first
     * window is touched alone, then each registration has the next touch
     * beside it.  Whether a window needs new memory is asked before the
     * registration that holds the host lock starts. */
    gm__host_prepare(c->root, gm__host_prepare_size(c->root, c->win_bytes[0]));
    /* A guard: in a few early runs on fresh virtual machines, touching and
     * registering at once became 6-9 times slower after the first GiB (an
     * H100 VM: 60-100 ms per 256 MiB for each, against 7-11; a 16 GiB cold
     * offload took 4-5.6 s, against 0.8-1.5 s without touching ahead on
     * such machines).  So each step (a registration with the next touch
     * beside it) is timed, and once one takes more than OFFL_AHEAD_SLOW
     * times the fastest so far per byte, the rest of this offload makes its
     * windows one after the other.  (Seen once in an early run: it stopped
     * the touching after the seventh window, but the windows made one after
     * the other stayed slow, 30-70 ms each, and 16 GiB took 2.5 s: it bounds
     * the overlap's part, not the machine's.) */
    bool ahead = true;
    double best = 0; /* ns per byte of the fastest step */
    for (size_t w = 0; w < c->n_win; w++) {
        pthread_mutex_lock(&c->mu);
        bool stop = c->stop;
        pthread_mutex_unlock(&c->mu);
        if (stop) break;
        prep_job_t job = {c->root, 0};
        if (ahead && w + 1 < c->n_win) job.csize = gm__host_prepare_size(c->root, c->win_bytes[w + 1]);
        pthread_t th;
        uint64_t t0 = gm__now_ns();
        bool prep = job.csize && pthread_create(&th, NULL, prep_main, &job) == 0;
        int rc = GM_OK;
        offseg_t *g = seg_new(c->root, c->win_bytes[w], &rc);
        pthread_mutex_lock(&c->mu);
        c->wseg[w] = g;
        if (!g) {
            c->mk_rc = rc;
            snprintf(c->mk_msg, sizeof c->mk_msg, "%s", gm_last_error());
            gm__clear_error();
        }
        c->made = w + 1;
        pthread_cond_signal(&c->cv);
        pthread_mutex_unlock(&c->mu);
        if (prep) {
            pthread_join(th, NULL);
            double per = (double)(gm__now_ns() - t0) / (double)c->win_bytes[w];
            if (best > 0 && per > OFFL_AHEAD_SLOW * best) ahead = false;
            if (best == 0 || per < best) best = per;
        }
        if (!g) break;
    }
    return NULL;
}

/* Window w's segment, waited for (made here when no thread makes them);
 * NULL with the error set on failure. */
static offseg_t *seg_take(ocopy_t *c, size_t w, int *rc)
{
    if (!c->started) {
        c->wseg[w] = seg_new(c->root, c->win_bytes[w], rc);
        return c->wseg[w];
    }
    pthread_mutex_lock(&c->mu);
    while (c->made <= w) pthread_cond_wait(&c->cv, &c->mu);
    offseg_t *g = c->wseg[w];
    if (!g) *rc = gm__set_error(c->mk_rc, "%s", c->mk_msg);
    pthread_mutex_unlock(&c->mu);
    return g;
}

/* The maker stopped; the segments no offloaded block uses go back. */
static void segmaker_end(ocopy_t *c)
{
    if (c->started) {
        pthread_mutex_lock(&c->mu);
        c->stop = true;
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->th, NULL);
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->mu);
        gm__host_prepared_drop(c->root); /* touched ahead, not taken (a failure, or a stop) */
    }
    for (size_t w = 0; w < c->n_win; w++) seg_drop(c->root, c->wseg[w]);
}

/* The copies up to mark m are done: the blocks before it are offloaded
 * (fin moves on) and their pages given back; of block m.blk, when its copy
 * is all queued, the pages up to m.off go back now. */
static void finish_upto_locked(ocopy_t *c, mark_t m)
{
    gm_pool_t *h = c->h;
    for (; c->fin < m.blk; c->fin++, c->fin_off = 0) {
        offloaded_locked(h, c->bl->b[c->fin], c->copies[c->fin], c->segs[c->fin], c->res);
        if (evict_range_locked(h, c->bl->b, c->fin, c->fin + 1, c->res) != GM_OK)
            gm__clear_error(); /* tried again at the end */
    }
    if (c->fin == m.blk && c->fin < c->qb && m.off > c->fin_off) {
        size_t rel = 0;
        if (gm__pages_evict_span_locked(h, c->bl->b[c->fin], c->fin_off, m.off, &rel) != GM_OK) {
            gm__clear_error(); /* what stays goes back with the whole block */
            h->offl_dirty = true;
        }
        c->res->released += rel;
        c->fin_off = m.off;
    }
}

/* Finish the oldest mark in flight once its copies are done: waited for,
 * or (wait false) only if done already (GM_NOT_READY if not). */
static int mark_pop_locked(ocopy_t *c, bool wait)
{
    int rc;
    if (wait)
        GM_BK(rc, c->root, event_sync, (c->root->bk, c->o->mark[c->r_head]));
    else
        GM_BK(rc, c->root, event_query, (c->root->bk, c->o->mark[c->r_head]));
    if (rc != GM_OK) return rc;
    finish_upto_locked(c, c->ring[c->r_head]);
    c->r_head = (c->r_head + 1) % OFFL_MARKS;
    c->r_n--;
    return GM_OK;
}

/* Is window w's segment made (or its making failed) already? */
static bool seg_made(ocopy_t *c, size_t w)
{
    if (!c->started) return false;
    pthread_mutex_lock(&c->mu);
    bool made = c->made > w;
    pthread_mutex_unlock(&c->mu);
    return made;
}

/* Finish the marks whose copies are done, waiting for none, until window
 * w's segment is made: its copies are queued first. */
static int marks_done_locked(ocopy_t *c, size_t w)
{
    while (c->r_n && !seg_made(c, w)) {
        int rc = mark_pop_locked(c, false);
        if (rc == GM_NOT_READY) {
            gm__clear_error();
            return GM_OK;
        }
        if (rc != GM_OK) return rc;
    }
    return GM_OK;
}

/* Place the windows: blocks in address order, at most OFFL_WINDOW bytes of
 * them per window (a larger block has one of its own). */
static int plan_windows(ocopy_t *c)
{
    const blist_t *bl = c->bl;
    c->win_end = calloc(bl->n, sizeof *c->win_end);
    c->win_bytes = calloc(bl->n, sizeof *c->win_bytes);
    c->wseg = calloc(bl->n, sizeof *c->wseg);
    c->copies = calloc(bl->n, sizeof *c->copies);
    c->segs = calloc(bl->n, sizeof *c->segs);
    if (!c->win_end || !c->win_bytes || !c->wseg || !c->copies || !c->segs)
        return gm__set_error(GM_NO_HOST_MEMORY, "gm_offload: out of host memory");
    size_t total = 0;
    for (size_t i = 0; i < bl->n;) {
        size_t bytes = 0;
        while (i < bl->n) {
            size_t n = GM_ALIGN_UP(bl->b[i]->requested, GM_ALIGNMENT);
            if (bytes && bytes + n > OFFL_WINDOW) break;
            bytes += n;
            total += bl->b[i]->requested;
            i++;
        }
        c->win_bytes[c->n_win] = bytes;
        c->win_end[c->n_win++] = i;
    }
    /* Pieces: a sixteenth of the tag's bytes, from one page to OFFL_MARK. */
    c->piece = GM_ALIGN_UP(total / 16, c->h->page);
    if (c->piece < c->h->page) c->piece = c->h->page;
    if (c->piece > OFFL_MARK) c->piece = OFFL_MARK;
    return GM_OK;
}

/* What plan_windows (and the copies) allocated for c. */
static void plan_free(ocopy_t *c)
{
    free(c->copies);
    free(c->segs);
    free(c->win_end);
    free(c->win_bytes);
    free(c->wseg);
}

/* Copy the blocks of c->bl to host memory and give their pages back (h's
 * lock held).  The copies go in order on one copy stream (one stream
 * reaches the copy engine's line rate), in pieces of c->piece bytes with an
 * event after each, at most OFFL_MARKS of them ahead (pieces of OFFL_MARK
 * bytes: 1 GiB of copies in flight).  Each mark passed
 * finishes what lies before it: whole blocks are offloaded and their pages
 * given back, and of a block whose copy is all queued, the pages copied so
 * far go back at once (gm__pages_evict_span_locked), so that device memory
 * comes back while the copy goes on, even within one large block.
 * Returns the first error; c->fin: the blocks offloaded. */
static int copy_out_locked(ocopy_t *c)
{
    gm_pool_t *root = c->root;
    const blist_t *bl = c->bl;
    GM_CHECK(plan_windows(c));
    GM_CHECK(streams_ready(root, c->o));
    if (c->n_win > 1) {
        pthread_mutex_init(&c->mu, NULL);
        pthread_cond_init(&c->cv, NULL);
        c->started = pthread_create(&c->th, NULL, segmaker_main, c) == 0;
        if (!c->started) {
            pthread_cond_destroy(&c->cv);
            pthread_mutex_destroy(&c->mu);
        }
    }
    gm_stream_t cs = c->o->stream[0];
    size_t since_mark = 0, w = 0;
    int rc = GM_OK;
    while (c->qb < bl->n) {
        if (c->qb == (w ? c->win_end[w - 1] : 0)) {
            /* A new window.  Its segment may still be being made (touching
             * new memory keeps every core busy): the copies done so far are
             * finished, and this thread sleeps until the segment is there
             * rather than spin in an event wait.  Once it is there, its
             * copies are queued before anything else: while the maker
             * registers the next window, the driver makes this thread's
             * calls wait (a page given back, an event recorded: 7 ms at a
             * time on an H200), so they are queued in the gap between two
             * registrations, all at once (the ring holds a few windows of
             * marks), and the pages go back later. */
            GM_CHECK(marks_done_locked(c, w));
            offseg_t *g = seg_take(c, w, &rc);
            if (!g) return rc;
            size_t off = 0;
            for (size_t i = c->qb; i < c->win_end[w]; i++) {
                c->copies[i] = (char *)g->base + off;
                c->segs[i] = g;
                off += GM_ALIGN_UP(bl->b[i]->requested, GM_ALIGNMENT);
            }
            w++;
        }
        gm__block_t *b = bl->b[c->qb];
        size_t len = b->requested - c->qoff;
        if (len > c->piece - since_mark) len = c->piece - since_mark;
        GM_BK(rc, root, memcpy,
              (root->bk, (uintptr_t)c->copies[c->qb] + c->qoff, b->addr + c->qoff, len, cs));
        if (rc != GM_OK) return rc;
        c->qoff += len;
        since_mark += len;
        if (c->qoff == b->requested) c->qb++, c->qoff = 0;
        if (since_mark < c->piece && c->qb < bl->n) continue;
        if (c->r_n == OFFL_MARKS) GM_CHECK(mark_pop_locked(c, true));
        unsigned slot = (c->r_head + c->r_n) % OFFL_MARKS;
        GM_BK(rc, root, event_record, (root->bk, c->o->mark[slot], cs));
        if (rc != GM_OK) return rc;
        c->ring[slot] = (mark_t){c->qb, c->qoff};
        c->r_n++;
        since_mark = 0;
    }
    while (c->r_n) GM_CHECK(mark_pop_locked(c, true));
    return GM_OK;
}

/* Offload the resident blocks of tag in heap h (offl->mu held, h's lock
 * taken here). */
static int offload_heap(gm_pool_t *root, gm_pool_t *h, gm_tag_t tag, bool discard,
                        gm_stream_t stream, result_t *res)
{
    blist_t bl = {0}, old = {0};
    int rc = GM_OK;
    gm__lock(&h->lock);
    GM_CHECK_GOTO(collect_locked(h, tag, false, &bl), rc, out);
    GM_CHECK_GOTO(collect_locked(h, tag, true, &old), rc, out);
    if (bl.n == 0 && old.n == 0) goto out;

    /* The stream rule: the blocks' work first. */
    GM_CHECK_GOTO(sync_blocks_locked(h, &bl, stream), rc, out);
    gm__drain_streams_locked(h); /* free neighbours: past their frees */
    for (size_t i = 0; i < bl.n; i++) gm__block_drop_recorded_locked(h, bl.b[i]);

    ocopy_t c = {.root = root, .h = h, .o = root->offl, .bl = &bl, .res = res};
    if (discard) {
        for (size_t i = 0; i < bl.n; i++) offloaded_locked(h, bl.b[i], NULL, NULL, res);
        c.fin = bl.n;
    } else if (bl.n) {
        rc = copy_out_locked(&c);
    }
    if (rc != GM_OK) {
        /* Once no copy of ours runs, the blocks whose copies were all
         * queued are offloaded; the others stay resident.  Should the copy
         * stream itself fail, a block some of whose pages went back already
         * is offloaded all the same: its host copy is what is left of it. */
        char msg[256];
        snprintf(msg, sizeof msg, "%s", gm_last_error());
        size_t upto = c.fin_off ? c.fin + 1 : c.fin;
        if (c.copies && streams_idle(root, c.o) == GM_OK) upto = c.qb;
        for (size_t i = c.fin; i < upto; i++) offloaded_locked(h, bl.b[i], c.copies[i], c.segs[i], res);
        c.fin = upto;
        gm__clear_error();
        gm__set_error(rc, "gm_offload: %s; %zu of %zu blocks of tag '%s' offloaded, the others "
                      "still on the device, nothing lost", msg, c.fin, bl.n, tag_names[tag]);
    }
    segmaker_end(&c);
    plan_free(&c);
    /* Pages shared by neighbouring blocks of the tag, and those left by an
     * earlier call. */
    {
        int erc = evict_range_locked(h, bl.b, 0, c.fin, res);
        int erc2 = evict_range_locked(h, old.b, 0, old.n, res);
        if (rc == GM_OK) rc = erc != GM_OK ? erc : erc2;
    }
out:
    gm__unlock(&h->lock);
    free(bl.b);
    free(old.b);
    return rc;
}

/* The stream rule before anything moves, in every heap: `stream` and the
 * streams the tag's resident blocks were allocated or recorded on. */
static int sync_streams(gm_pool_t *h, gm_tag_t tag, gm_stream_t stream)
{
    blist_t bl = {0};
    int rc = GM_OK;
    gm__lock(&h->lock);
    GM_CHECK_GOTO(collect_locked(h, tag, false, &bl), rc, out);
    if (bl.n) rc = sync_blocks_locked(h, &bl, stream);
out:
    gm__unlock(&h->lock);
    free(bl.b);
    return rc;
}

void (*gm__offload_test_hook)(gm_pool_t *root, gm_tag_t tag);

bool gm__offload_tag_moving(gm_pool_t *root, gm_tag_t tag)
{
    return tag != GM_TAG_NONE && root->offl &&
           atomic_load_explicit(&root->offl->tag[tag].moving, memory_order_acquire);
}

const char *gm__tag_name(gm_tag_t tag)
{
    return gm__tag_valid(tag) ? tag_names[tag] : "";
}

/* The offload of tag, once it was seen to hold no shared block (offl->mu
 * held, the tag marked moving). */
static int offload_moving(gm_pool_t *root, gm_tag_t tag, unsigned flags, gm_stream_t stream,
                          result_t *res)
{
    bool discard = (flags & GM_OFFLOAD_DISCARD) || (tag_flags_of(tag) & GM_TAG_DISCARD);
    gm_pool_t *h;
    void *which = NULL;
    for (unsigned i = 0; (h = gm__heap_next(root, &i));)
        if (tag_shared(h, tag, &which))
            return gm__set_error(GM_NOT_SUPPORTED, "gm_offload: tag '%s' holds %p, which is shared "
                                 "with another process: shared memory is never moved; nothing was "
                                 "offloaded", tag_names[tag], which);
    /* From here to the end no block of the tag can be published: a publish
     * looks at the mark under the heap's lock, which each heap's check
     * above took after the mark was set. */
    void (*hook)(gm_pool_t *, gm_tag_t) = gm__offload_test_hook;
    if (hook) hook(root, tag);
    int rc = GM_OK;
    if (atomic_load_explicit(&root->n_heaps, memory_order_acquire) > 1) {
        for (unsigned i = 0; rc == GM_OK && (h = gm__heap_next(root, &i));)
            rc = sync_streams(h, tag, stream);
        if (rc != GM_OK) {
            char msg[256];
            snprintf(msg, sizeof msg, "%s", gm_last_error());
            return gm__set_error(rc, "gm_offload: %s; nothing was offloaded", msg);
        }
    }
    for (unsigned i = 0; rc == GM_OK && (h = gm__heap_next(root, &i));)
        rc = offload_heap(root, h, tag, discard, stream, res);
    return rc;
}

/* Offload tag in every heap, or refuse it whole (offl->mu held).  The tag
 * is marked moving first, so that the check for shared blocks and the
 * moves are one step for a publish (share.c refuses a block of a tag being
 * moved): a block published between them would be moved under its
 * importers. */
static int offload_all(gm_pool_t *root, gm_tag_t tag, unsigned flags, gm_stream_t stream,
                       result_t *res)
{
    tagstate_t *ts = &root->offl->tag[tag];
    atomic_store_explicit(&ts->moving, true, memory_order_seq_cst);
    int rc = offload_moving(root, tag, flags, stream, res);
    atomic_store_explicit(&ts->moving, false, memory_order_release);
    return rc;
}

static int check_tag(gm_tag_t tag, const char *fn)
{
    if (tag == GM_TAG_NONE || !gm__tag_valid(tag))
        return gm__set_error(GM_INVALID_ARGUMENT, "%s: %s", fn,
                             tag == GM_TAG_NONE ? "GM_TAG_NONE names no memory"
                                                : "the tag was not made by gm_tag_get");
    return GM_OK;
}

int gm_offload(gm_pool_t *pool, gm_tag_t tag, unsigned flags, gm_stream_t stream)
{
    GM_CHECK(gm__pool_resolve(&pool, "gm_offload"));
    GM_CHECK(check_tag(tag, "gm_offload"));
    if (flags & ~GM_OFFLOAD_DISCARD)
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_offload: unknown flags %#x", flags);
    gm_pool_t *root = pool->root;
    struct gm__offload *o = root->offl;
    result_t res = {0};
    pthread_mutex_lock(&o->mu);
    prep_join_locked(o); /* a preparation made ahead first: its memory serves */
    int rc = offload_all(root, tag, flags, stream, &res);
    if (res.blocks) o->tag[tag].offloads++;
    pthread_mutex_unlock(&o->mu);
    return rc;
}

/* ---- pinned host memory made ahead (gm_offload_prepare) ------------------------- */

/* The sizes of the segments the tag's offload would ask for now: its
 * windows in every heap (offl->mu held). */
static int prepare_sizes(gm_pool_t *root, gm_tag_t tag, size_t **out, size_t *n_out)
{
    size_t *v = NULL, n = 0;
    int rc = GM_OK;
    gm_pool_t *h;
    for (unsigned i = 0; rc == GM_OK && (h = gm__heap_next(root, &i));) {
        blist_t bl = {0};
        ocopy_t c = {.root = root, .h = h, .o = root->offl, .bl = &bl};
        gm__lock(&h->lock);
        rc = collect_locked(h, tag, false, &bl);
        if (rc == GM_OK && bl.n) rc = plan_windows(&c);
        if (rc == GM_OK && c.n_win) {
            size_t *nv = realloc(v, (n + c.n_win) * sizeof *v);
            if (!nv) rc = gm__set_error(GM_NO_HOST_MEMORY, "gm_offload_prepare: out of host memory");
            else {
                v = nv;
                memcpy(v + n, c.win_bytes, c.n_win * sizeof *v);
                n += c.n_win;
            }
        }
        gm__unlock(&h->lock);
        plan_free(&c);
        free(bl.b);
    }
    if (rc != GM_OK) {
        free(v);
        return rc;
    }
    *out = v;
    *n_out = n;
    return GM_OK;
}

/* Make the segments, all at once (so that none reuses another's memory),
 * and give them back to the host pool, which keeps them pinned and free
 * for the offload to find.  No pool lock held. */
static int prepare_make(gm_pool_t *root, const size_t *sizes, size_t n)
{
    size_t total = 0, made = 0;
    for (size_t i = 0; i < n; i++) total += sizes[i];
    offseg_t **segs = gm__calloc(n ? n : 1, sizeof *segs);
    if (!segs) return gm__set_error(GM_NO_HOST_MEMORY, "gm_offload_prepare: out of host memory");
    int rc = GM_OK;
    for (size_t i = 0; i < n && rc == GM_OK; i++)
        if ((segs[i] = seg_new(root, sizes[i], &rc))) made += sizes[i];
    char msg[256] = "";
    if (rc != GM_OK) snprintf(msg, sizeof msg, "%s", gm_last_error());
    for (size_t i = 0; i < n; i++) seg_drop(root, segs[i]);
    gm__free(segs);
    gm__host_keep_unused(root);
    if (rc != GM_OK)
        return gm__set_error(rc, "gm_offload_prepare: %s; %zu of %zu bytes made (they stay in "
                             "the pinned host pool)", msg, made, total);
    return GM_OK;
}

static void *prep_thread(void *arg)
{
    gm_pool_t *root = arg;
    struct gm__offload *o = root->offl;
    o->prep_rc = prepare_make(root, o->prep_sizes, o->prep_n);
    if (o->prep_rc != GM_OK) snprintf(o->prep_msg, sizeof o->prep_msg, "%s", gm_last_error());
    gm__clear_error();
    return NULL;
}

/* Let a preparation on a thread end (offl->mu held, or the pool going
 * away); its status stays for gm_offload_prepare_wait. */
static void prep_join_locked(struct gm__offload *o)
{
    if (!o->prep_started) return;
    pthread_join(o->prep_th, NULL);
    o->prep_started = false;
    o->prep_ended = true;
    free(o->prep_sizes);
    o->prep_sizes = NULL;
    o->prep_n = 0;
}

int gm_offload_prepare(gm_pool_t *pool, gm_tag_t tag, unsigned flags)
{
    GM_CHECK(gm__pool_resolve(&pool, "gm_offload_prepare"));
    GM_CHECK(check_tag(tag, "gm_offload_prepare"));
    if (flags & ~GM_PREPARE_ASYNC)
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_offload_prepare: unknown flags %#x", flags);
    gm_pool_t *root = pool->root;
    struct gm__offload *o = root->offl;
    if (tag_flags_of(tag) & GM_TAG_DISCARD) return GM_OK; /* nothing is copied */
    pthread_mutex_lock(&o->mu);
    prep_join_locked(o);
    o->prep_ended = false;
    o->prep_rc = GM_OK;
    size_t *sizes = NULL, n = 0;
    int rc = prepare_sizes(root, tag, &sizes, &n);
    if (rc == GM_OK && n && (flags & GM_PREPARE_ASYNC)) {
        o->prep_sizes = sizes;
        o->prep_n = n;
        o->prep_started = pthread_create(&o->prep_th, NULL, prep_thread, root) == 0;
        if (o->prep_started) sizes = NULL;
        else o->prep_sizes = NULL;
    }
    if (rc == GM_OK && sizes) rc = prepare_make(root, sizes, n); /* here, or no thread */
    pthread_mutex_unlock(&o->mu);
    free(sizes);
    return rc;
}

int gm_offload_prepare_wait(gm_pool_t *pool)
{
    GM_CHECK(gm__pool_resolve(&pool, "gm_offload_prepare_wait"));
    struct gm__offload *o = pool->root->offl;
    pthread_mutex_lock(&o->mu);
    prep_join_locked(o);
    int rc = o->prep_ended ? o->prep_rc : GM_OK;
    char msg[sizeof o->prep_msg];
    snprintf(msg, sizeof msg, "%s", o->prep_msg);
    o->prep_ended = false;
    o->prep_rc = GM_OK;
    pthread_mutex_unlock(&o->mu);
    if (rc != GM_OK) return gm__set_error(rc, "%s", msg);
    return GM_OK;
}

int gm__offload_check(gm_pool_t *root)
{
    struct gm__offload *o = root->offl;
    if (!o || !root->host || pthread_mutex_trylock(&o->mu) != 0) return GM_OK;
    size_t n = gm__host_prepared_bytes(root);
    pthread_mutex_unlock(&o->mu);
    if (n)
        return gm__set_error(GM_INTERNAL, "%zu bytes of host memory touched ahead by an offload "
                             "were not given back", n);
    return GM_OK;
}

/* ---- restore ------------------------------------------------------------------------- */

/* Phase one of a restore in heap h: pages mapped and data copied back; the
 * blocks stay marked offloaded with their host copies (restore_finish or
 * restore_undo next).  On failure h is as it was. */
static int restore_map(gm_pool_t *root, gm_pool_t *h, gm_tag_t tag, gm_stream_t stream)
{
    struct gm__offload *o = root->offl;
    blist_t bl = {0};
    int rc = GM_OK;
    gm__lock(&h->lock);
    gm__tcache_release_large_locked(h); /* a locked operation of this thread: its large
                                         * cached block goes back first (tcache.h) */
    GM_CHECK_GOTO(collect_locked(h, tag, true, &bl), rc, out);
    if (bl.n == 0) goto out;
    gm__stream_t *s = gm__stream_get_locked(h, stream);
    if (!s) {
        rc = gm__set_error(GM_NO_HOST_MEMORY, "gm_restore: out of host memory for a stream");
        goto out;
    }
    /* Pages block by block, each block's copy queued once its pages are
     * mapped (the DMA runs while the next block is mapped).  A restore that
     * cannot have them all changes nothing: its pages are given back and
     * the host copies are still whole.  The copies run after the work
     * queued on `stream` (pages the page layer hands over may still be in
     * its use). */
    bool any_copy = false;
    for (size_t i = 0; i < bl.n; i++) any_copy |= bl.b[i]->host_copy != NULL;
    if (any_copy) {
        rc = streams_ready(root, o);
        if (rc == GM_OK) GM_BK(rc, root, event_record, (root->bk, o->start, stream));
        for (unsigned i = 0; rc == GM_OK && i < o->n_streams; i++)
            GM_BK(rc, root, stream_wait_event, (root->bk, o->stream[i], o->start));
        if (rc != GM_OK) goto out;
    }
    size_t mapped = 0;
    unsigned next = 0;
    for (; rc == GM_OK && mapped < bl.n; mapped++) {
        /* A piece's pages, then its copy: the first DMA starts after one
         * piece is mapped, not a whole block. */
        gm__block_t *b = bl.b[mapped];
        for (size_t off = 0; rc == GM_OK && off < b->size; off += OFFL_PIECE) {
            size_t len = b->size - off < OFFL_PIECE ? b->size - off : OFFL_PIECE;
            rc = gm__pages_ensure_mapped_locked(h, b->arena, b->addr + off, len, b->requested, s,
                                                    GM__MAP_EXTENTS);
            if (rc == GM_OK && b->host_copy && off < b->requested) {
                size_t n = b->requested - off < len ? b->requested - off : len;
                rc = copy_pieces(root, o, b->addr + off, (uintptr_t)b->host_copy + off, n, &next);
            }
        }
    }
    if (any_copy) {
        int r3 = streams_idle(root, o);
        if (rc == GM_OK) rc = r3;
    }
    bool copied = rc == GM_OK;
    /* Mapped and filled: until restore_finish (or restore_undo) takes the
     * heap's lock again, no trim may give these pages back. */
    for (size_t i = 0; copied && i < bl.n; i++) bl.b[i]->offloaded |= GM__OFFLOADED_RESTORING;
    if (!copied) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", gm_last_error());
        /* Give back what was mapped: the tag stays offloaded. */
        (void)evict_range_locked(h, bl.b, 0, mapped, &(result_t){0});
        gm__clear_error();
        rc = gm__set_error(rc, "gm_restore: tag '%s' stays offloaded (%zu blocks, data safe in host "
                           "memory): %s", tag_names[tag], bl.n, msg);
    }
out:
    gm__unlock(&h->lock);
    free(bl.b);
    return rc;
}

/* After restore_map in every heap: the blocks are resident, host copies
 * freed.  (offl->mu has been held throughout: the offloaded blocks of the
 * tag are those restore_map mapped, less any freed meanwhile.) */
static int restore_finish(gm_pool_t *root, gm_pool_t *h, gm_tag_t tag, result_t *res)
{
    blist_t bl = {0};
    int rc = GM_OK;
    gm__lock(&h->lock);
    GM_CHECK_GOTO(collect_locked(h, tag, true, &bl), rc, out);
    tagstate_t *t = &root->offl->tag[tag];
    for (size_t i = 0; i < bl.n; i++) {
        gm__block_t *b = bl.b[i];
        if (b->host_copy) h->st.restore_bytes_total += b->requested;
        h->st.restore_count++;
        res->blocks++;
        res->bytes += b->requested;
        forget_copy_locked(h, b);
        atomic_fetch_add_explicit(&t->resident, b->requested, memory_order_relaxed);
        atomic_fetch_add_explicit(&t->resident_n, 1, memory_order_relaxed);
    }
out:
    gm__unlock(&h->lock);
    free(bl.b);
    return rc;
}

/* A later heap failed: the pages restore_map mapped in h go back. */
static void restore_undo(gm_pool_t *h, gm_tag_t tag)
{
    blist_t bl = {0};
    gm__lock(&h->lock);
    if (collect_locked(h, tag, true, &bl) == GM_OK) {
        for (size_t i = 0; i < bl.n; i++) bl.b[i]->offloaded &= (uint8_t)~GM__OFFLOADED_RESTORING;
        (void)evict_range_locked(h, bl.b, 0, bl.n, &(result_t){0});
    }
    gm__unlock(&h->lock);
    free(bl.b);
}

/* All or nothing over the heaps: every heap's pages and copies first, then
 * the blocks become resident.  A heap short of pages first asks the other
 * heaps to give back their cached ones. */
static int restore_all(gm_pool_t *root, gm_tag_t tag, gm_stream_t stream, result_t *res)
{
    gm_pool_t *heaps[GM_HEAPS_MAX], *h;
    unsigned n = 0;
    for (unsigned i = 0; n < GM_HEAPS_MAX && (h = gm__heap_next(root, &i));) heaps[n++] = h;
    int rc = GM_OK;
    unsigned k;
    for (k = 0; k < n && rc == GM_OK; k++) {
        rc = restore_map(root, heaps[k], tag, stream);
        if ((rc == GM_OUT_OF_MEMORY || rc == GM_LIMIT) && n > 1) {
            /* The allocator's own step: the other heaps give their free pages back. */
            char why[512];
            snprintf(why, sizeof why, "%s", gm_last_error());
            gm__lock(&heaps[k]->lock);
            bool got = gm__heaps_reclaim_others(heaps[k]);
            gm__unlock(&heaps[k]->lock);
            if (got) rc = restore_map(root, heaps[k], tag, stream);
            else gm__set_error(rc, "%s", why);
        }
    }
    if (rc != GM_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", gm_last_error());
        for (unsigned j = 0; j + 1 < k; j++) restore_undo(heaps[j], tag); /* heaps[k-1] failed */
        return gm__set_error(rc, "%s", msg);
    }
    for (unsigned j = 0; j < n && rc == GM_OK; j++) rc = restore_finish(root, heaps[j], tag, res);
    return rc;
}

/* Restore, making room by eviction when the pool may (offl->mu held). */
static int restore_evicting(gm_pool_t *root, gm_tag_t tag, gm_stream_t stream, result_t *res);

/* gm_restore, and gm_tag_acquire (hold: the tag is held once restored). */
static int restore_entry(gm_pool_t *pool, gm_tag_t tag, gm_stream_t stream, bool hold,
                         const char *fn)
{
    GM_CHECK(gm__pool_resolve(&pool, fn));
    GM_CHECK(check_tag(tag, fn));
    gm_pool_t *root = pool->root;
    struct gm__offload *o = root->offl;
    result_t res = {0};
    pthread_mutex_lock(&o->mu);
    int rc = restore_evicting(root, tag, stream, &res);
    if (res.blocks) o->tag[tag].restores++;
    if (rc == GM_OK && hold) {
        o->tag[tag].holds++;
        o->tag[tag].last_use = ++o->tick;
    }
    pthread_mutex_unlock(&o->mu);
    return rc;
}

int gm_restore(gm_pool_t *pool, gm_tag_t tag, gm_stream_t stream)
{
    return restore_entry(pool, tag, stream, false, "gm_restore");
}

/* ---- eviction ---------------------------------------------------------------------------- */

/* The victim: evictable, not held, resident blocks, least recently used. */
static gm_tag_t pick_victim(struct gm__offload *o, gm_tag_t except)
{
    unsigned n = atomic_load_explicit(&n_tags, memory_order_acquire);
    gm_tag_t best = GM_TAG_NONE;
    for (gm_tag_t t = 1; t <= n; t++) {
        tagstate_t *ts = &o->tag[t];
        if (t == except || !(tag_flags_of(t) & GM_TAG_EVICTABLE) || ts->holds) continue;
        if (!atomic_load_explicit(&ts->resident_n, memory_order_relaxed)) continue;
        if (best == GM_TAG_NONE || ts->last_use < o->tag[best].last_use) best = t;
    }
    return best;
}

/* offl->mu held.  A victim that cannot be moved (shared, a failure) goes
 * to the back of the line and the next one is tried. */
static bool evict_one_locked(gm_pool_t *root, gm_tag_t except)
{
    struct gm__offload *o = root->offl;
    char keep[256];
    snprintf(keep, sizeof keep, "%s", gm_last_error());
    bool moved = false;
    unsigned tries = atomic_load_explicit(&n_tags, memory_order_acquire);
    for (unsigned k = 0; k < tries && !moved; k++) {
        gm_tag_t t = pick_victim(o, except);
        if (t == GM_TAG_NONE) break;
        tagstate_t *ts = &o->tag[t];
        result_t res = {0};
        (void)offload_all(root, t, 0, ts->has_release_stream ? ts->release_stream : NULL, &res);
        ts->last_use = ++o->tick;
        if (res.blocks) {
            moved = true;
            ts->evictions++;
            ts->offloads++;
            gm__lock(&root->lock);
            root->st.evictions++;
            gm__unlock(&root->lock);
        }
    }
    gm__clear_error();
    gm__set_error(GM_OK, "%s", keep); /* the allocation's message, not the eviction's */
    return moved;
}

bool gm__offload_evict_one(gm_pool_t *root, gm_tag_t except)
{
    struct gm__offload *o = root->offl;
    pthread_mutex_lock(&o->mu);
    bool done = evict_one_locked(root, except);
    pthread_mutex_unlock(&o->mu);
    return done;
}

static int restore_evicting(gm_pool_t *root, gm_tag_t tag, gm_stream_t stream, result_t *res)
{
    for (;;) {
        int rc = restore_all(root, tag, stream, res);
        if ((rc != GM_OUT_OF_MEMORY && rc != GM_LIMIT) || !(root->cfg.flags & GM_POOL_EVICT))
            return rc;
        char msg[512];
        snprintf(msg, sizeof msg, "%s", gm_last_error());
        if (!evict_one_locked(root, tag)) return gm__set_error(rc, "%s", msg);
    }
}

int gm_tag_acquire(gm_pool_t *pool, gm_tag_t tag, gm_stream_t stream)
{
    return restore_entry(pool, tag, stream, true, "gm_tag_acquire");
}

int gm_tag_release(gm_pool_t *pool, gm_tag_t tag, gm_stream_t stream)
{
    GM_CHECK(gm__pool_resolve(&pool, "gm_tag_release"));
    GM_CHECK(check_tag(tag, "gm_tag_release"));
    struct gm__offload *o = pool->root->offl;
    int rc = GM_OK;
    pthread_mutex_lock(&o->mu);
    tagstate_t *ts = &o->tag[tag];
    if (ts->holds == 0) {
        rc = gm__set_error(GM_INVALID_STATE, "gm_tag_release: tag '%s' is not held (no "
                           "gm_tag_acquire to match)", tag_names[tag]);
    } else {
        ts->holds--;
        ts->last_use = ++o->tick;
        ts->release_stream = stream;
        ts->has_release_stream = true;
    }
    pthread_mutex_unlock(&o->mu);
    return rc;
}

int gm_tag_info(gm_pool_t *pool, gm_tag_t tag, gm_tag_info_t *info)
{
    if (!info || info->size < offsetof(gm_tag_info_t, flags))
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_tag_info: initialise info with GM_TAG_INFO_INIT");
    GM_CHECK(gm__pool_resolve(&pool, "gm_tag_info"));
    GM_CHECK(check_tag(tag, "gm_tag_info"));
    struct gm__offload *o = pool->root->offl;
    gm_tag_info_t v;
    memset(&v, 0, sizeof v);
    v.size = sizeof v;
    v.version = GM_TAG_INFO_VERSION;
    snprintf(v.name, sizeof v.name, "%s", tag_names[tag]);
    v.flags = tag_flags_of(tag);
    pthread_mutex_lock(&o->mu);
    tagstate_t *ts = &o->tag[tag];
    v.resident_blocks = atomic_load_explicit(&ts->resident_n, memory_order_relaxed);
    v.resident_bytes = atomic_load_explicit(&ts->resident, memory_order_relaxed);
    v.offloaded_blocks = atomic_load_explicit(&ts->offloaded_n, memory_order_relaxed);
    v.offloaded_bytes = atomic_load_explicit(&ts->offloaded, memory_order_relaxed);
    v.holds = ts->holds;
    v.offloads = ts->offloads;
    v.restores = ts->restores;
    v.evictions = ts->evictions;
    pthread_mutex_unlock(&o->mu);
    size_t n = info->size < sizeof v ? info->size : sizeof v;
    memcpy(info, &v, n);
    info->size = n;
    return GM_OK;
}
