/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kinds.h — the memory kinds: every kind of memory a pool hands out, and
 * what gm_free, gm_block_size, gm_record_stream, the leak report and
 * gm_pool_check do with a pointer of that kind.
 *
 * The one idea: a pointer is either inside the pool's arenas (a device block
 * of the engine: gm__heap_holds, one range test) or it is a key of the
 * root's one address map (kinds.c), whose value is the kind's record.  So
 * who owns a pointer is one lookup, and what is done with it is the row of
 * its kind (gm__kind_ops_t), the way a page provider's row says where pages
 * come from (provider.h).  The table of rows, pool.c's kind_rows, is the
 * only place that lists the kinds; each row lives in the file that keeps
 * that kind's records.  A new kind (an imported extent, a CUDA-graph pool,
 * an engine-sleep door) is one row in its own file, one line in the table,
 * and gm__kinds_add / gm__kinds_take where its records are made and freed.
 *
 * gm_record_stream, for every kind that takes it, has one rule for the
 * streams it is given (written once, gm__recset_t below): each distinct
 * stream is kept until the block is freed, with no limit (out of host memory
 * is GM_NO_HOST_MEMORY, nothing recorded); the stream the block was made on
 * and the stream of the free need no record.  What the free then does with
 * them is the kind's, said in its row (`record`).
 *
 * Locking: the map has its own lock, taken last (after a heap's lock or the
 * host pool's); a row's members run with the root's lock held unless the
 * row says GM__KIND_FREE_UNLOCKED, and must not call back into gm_free.
 */
#ifndef GM_KINDS_H
#define GM_KINDS_H

#include "core/pool.h"

typedef struct gm__kind_ops gm__kind_ops_t;

/* The head of a kind's record, the value the address map holds: the row of
 * its kind first.  A kind whose records are guarded by a lock of its own
 * (the host pool's) maps its addresses to one static record per row, so
 * that a lookup never reads a record another thread may be freeing. */
typedef struct gm__kind_rec {
    const gm__kind_ops_t *ops;
} gm__kind_rec_t;

/* What the leak report and a row's foreach are given: one live allocation
 * its owner still has to free. */
typedef void (*gm__kind_each_fn)(uintptr_t addr, size_t size, void *arg);

#define GM__KIND_FREE_UNLOCKED 0x1u /* `free` is called after the heap's lock is
                                       dropped (the shared kind's own lock comes
                                       before it) */
#define GM__KIND_GM_ALLOC 0x2u      /* handed out by gm_alloc: gm_host_free names
                                       gm_free for it */

struct gm__kind_ops {
    const char *name;      /* in messages: "managed memory of gm_alloc_managed" */
    /* The entry point that frees it when that is not gm_free ("gm_host_free"),
     * "" for memory the library uses itself, NULL for gm_free.  A kind with
     * free_with set is refused by gm_free, gm_block_size and gm_record_stream
     * with GM_INVALID_ARGUMENT, nothing done, and has no free/size/record. */
    const char *free_with;
    unsigned flags;        /* GM__KIND_* */
    /* gm_free of ptr (rec: its record, NULL for the arena's kinds) on
     * `stream`: GM_OK with *size the caller's size, or a status with its
     * message and the block still live (a later free may succeed). */
    int (*free)(gm_pool_t *pool, gm__kind_rec_t *rec, void *ptr, gm_stream_t stream, size_t *size);
    /* gm_block_size: the caller's size; GM_INVALID_POINTER (no message
     * needed) when the record is not live (a cached segment). */
    int (*size)(gm_pool_t *pool, const gm__kind_rec_t *rec, const void *ptr, size_t *size);
    /* gm_record_stream: note `stream` (gm__recset_add's rule); the meaning,
     * what gm_free does with it, is the row's comment.  GM_INVALID_POINTER
     * (no message needed) when the record is not live. */
    int (*record)(gm_pool_t *pool, gm__kind_rec_t *rec, void *ptr, gm_stream_t stream);
    /* Every live allocation of this kind in `pool` (a heap or the root),
     * for the leak report.  NULL: none to list (the library's own memory). */
    void (*foreach)(gm_pool_t *pool, gm__kind_each_fn fn, void *arg);
    /* gm_pool_check's part, the root's lock held: GM_OK, or GM_INTERNAL
     * with a message.  NULL: nothing of its own to check. */
    int (*check)(gm_pool_t *pool);
};

/* ---- the table (kinds.c) -------------------------------------------------- */

/* The rows, in the leak report's order, NULL-terminated: the pool's
 * (api/pool.c lists them and hands the list to gm__kinds_init, so that this
 * floor names no row of a floor above it, src/FLOORS).  The first row is
 * the device block's, the second the shared block's: the two kinds a
 * pointer inside the arenas can be. */
const gm__kind_ops_t *const *gm__kinds_rows(gm_pool_t *pool);

/* The rows themselves, each defined beside its records. */
extern const gm__kind_ops_t gm__kind_device;   /* api/pool.c */
extern const gm__kind_ops_t gm__kind_shared;   /* share/share.c */
extern const gm__kind_ops_t gm__kind_sysmem;   /* host/sysmem.c */
extern const gm__kind_ops_t gm__kind_managed;  /* host/managed.c */
extern const gm__kind_ops_t gm__kind_segment;  /* core/segments.c */
extern const gm__kind_ops_t gm__kind_host;     /* host/host.c: gm_host_alloc's */
extern const gm__kind_ops_t gm__kind_internal; /* host/host.c: staging, offload copies */

/* ---- the address map (kinds.c) -------------------------------------------- */

/* At pool creation (the root; rows: the pool's list, see gm__kinds_rows)
 * and destruction, after every kind's fini. */
int gm__kinds_init(gm_pool_t *root, const gm__kind_ops_t *const *rows);
void gm__kinds_fini(gm_pool_t *root);
/* addr (absent) now names rec: GM_OK, or GM_NO_HOST_MEMORY with a message
 * naming fn and nothing changed. */
int gm__kinds_add(gm_pool_t *pool, uintptr_t addr, gm__kind_rec_t *rec, const char *fn);
/* addr names nothing any more (it may be absent). */
void gm__kinds_take(gm_pool_t *pool, uintptr_t addr);
/* The record addr names in the root's map, or NULL: the one lookup for a
 * pointer outside the arenas. */
gm__kind_rec_t *gm__kinds_find(gm_pool_t *pool, uintptr_t addr);
/* Who owns ptr: the arena's kinds (device, shared: *rec NULL) for a live
 * block of `pool`'s arenas (a heap's lock held), else the map's answer;
 * NULL for no live allocation of the pool. */
const gm__kind_ops_t *gm__kind_of_locked(gm_pool_t *pool, const void *ptr, gm__kind_rec_t **rec);
/* Every row's check, the root's lock taken here. */
int gm__kinds_check(gm_pool_t *root);

/* ---- the recorded streams, one rule for every kind (kinds.c) --------------- */

typedef struct gm__recset {
    gm_stream_t *v;
    unsigned n, cap;
} gm__recset_t;

/* Note `stream` (once).  GM_OK, or GM_NO_HOST_MEMORY naming fn. */
int gm__recset_add(gm__recset_t *r, gm_stream_t stream, const char *fn);
/* Wait on the host for every stream noted but `except` (the free's):
 * GM_OK, or the first failure (its message set; the set is kept, so a
 * retried free waits again). */
int gm__recset_wait(gm_pool_t *pool, const gm__recset_t *r, gm_stream_t except);
/* Forget the streams (after a free, or when a record is reused). */
void gm__recset_clear(gm__recset_t *r);

#endif /* GM_KINDS_H */
