/* SPDX-License-Identifier: Apache-2.0 */
/*
 * replay_step.h — one trace op applied to an allocator: the step that
 * `gpumem replay`, `gpumem report` and bench/alloc_bench.c each loop over.
 * It owns the slot table (the block, size and stream of each live slot of a
 * trace read by lib/trace_read.h) and the rules of a replay: failure rows
 * and unknown frees are skipped, an allocate fills its slot (NULL when it
 * failed), a free releases the slot's block on the free's own stream, and a
 * free whose allocate failed is skipped.
 *
 * The one idea: replay measures nanoseconds per op, so the step must cost
 * nothing of its own.  It is static inline, and the allocator's two calls
 * are passed as functions the caller defines static inline too: at a call
 * with those constants the compiler inlines the step and turns the calls
 * into direct ones (no call through a pointer per op that a hand-written
 * loop would not have).  A caller whose allocator is itself behind a pointer
 * (alloc_bench's table) keeps exactly that one indirect call.
 */
#ifndef GM_TOOLS_REPLAY_STEP_H
#define GM_TOOLS_REPLAY_STEP_H

#include <stddef.h>
#include <stdint.h>

#include "gpumem.h"
#include "lib/trace_read.h"

/* Per slot (n_slots of the trace, each array calloc'd by the caller): the
 * live block or NULL, its size and the dense stream of its allocate (what
 * an end-of-pass free of what the trace left live needs). */
typedef struct replay_slots {
    void **ptr;
    uint64_t *size;
    uint16_t *stream;
} replay_slots_t;

/* The allocator: 0 or an error code; stream is the op's dense stream id
 * (the caller's ctx maps it to a real stream). */
typedef int (*replay_alloc_fn)(void *ctx, uint64_t size, uint16_t stream, void **p);
typedef int (*replay_free_fn)(void *ctx, void *p, uint64_t size, uint16_t stream);

/* Apply op.  Returns what the allocator returned (0 when the op asked
 * nothing of it); which call failed is op->action. */
static inline int replay_step(const replay_slots_t *sl, const gm__trace_op_t *op,
                              replay_alloc_fn alloc, replay_free_fn release, void *ctx)
{
    if (op->slot == GM__TRACE_NO_SLOT) return 0; /* unknown free, failure row */
    if (op->action == GM__TRACE_ALLOC) {
        void *p = NULL;
        int rc = alloc(ctx, op->size, op->stream, &p);
        sl->ptr[op->slot] = rc == 0 ? p : NULL;
        sl->size[op->slot] = op->size;
        sl->stream[op->slot] = op->stream;
        return rc;
    }
    void *p = sl->ptr[op->slot];
    if (!p) return 0; /* its allocate failed */
    sl->ptr[op->slot] = NULL;
    /* A free of a live slot carries the size it was allocated with. */
    return release(ctx, p, op->size, op->stream);
}

/* The allocator of `gpumem replay` and `gpumem report`: a gpumem pool, on
 * the trace's streams (ctx: a replay_pool_t). */
typedef struct replay_pool {
    gm_pool_t *pool;
    gm_stream_t *streams; /* dense stream id -> stream */
} replay_pool_t;

static inline int replay_pool_alloc(void *ctx, uint64_t size, uint16_t stream, void **p)
{
    const replay_pool_t *rp = ctx;
    return gm_alloc(rp->pool, (size_t)size, rp->streams[stream], p);
}

static inline int replay_pool_free(void *ctx, void *p, uint64_t size, uint16_t stream)
{
    const replay_pool_t *rp = ctx;
    (void)size;
    return gm_free(rp->pool, p, rp->streams[stream]);
}

#endif /* GM_TOOLS_REPLAY_STEP_H */
