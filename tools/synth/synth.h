/* SPDX-License-Identifier: Apache-2.0 */
/*
 * synth.h — the synthetic trace generator behind `gpumem synth`, shared by
 * its files: the generator state and its random numbers, the trace writer
 * (writer.c), one file per workload family (serve.c, train.c, pipeline.c) and
 * the kinds table (kinds.c).  The command around it is tools/synth.c.
 *
 * The one idea: model the framework, not a distribution of sizes.  Each kind
 * walks its model the way eager PyTorch runs it: weights allocated once;
 * every op's output allocated when the op runs and freed when its last user
 * is done; autocast's bf16 copies of fp32 weights; tensors saved for backward
 * and released in reverse; gradients re-created every step (zero_grad sets
 * them to None) and AdamW's state and foreach temporaries; sizes in real
 * shapes and dtypes, rounded up to 512 B as PyTorch's allocator does.
 * Randomness only picks what a real run varies (request sizes and lengths,
 * batch shapes, arrivals, how threads interleave), from a seeded generator,
 * so the same kind, seed and scale always give the same bytes.
 *
 * Adding a workload: one file with its synth_KIND(synth_t *) generator,
 * declared below, and one row in kinds.c.  The generator writes into memory
 * and needs nothing from the rest of the CLI (it is in libgpumem_tools.a,
 * which tests/unit/test_synth.c links).
 */
#ifndef GM_TOOLS_SYNTH_H
#define GM_TOOLS_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "observe/trace.h"

#define ROUND_BYTES 512u                 /* PyTorch rounds every block to 512 B */
#define PTR_BASE 0x7f0000000000ull       /* pointer ids: base + n * PTR_STEP, */
#define PTR_STEP 0x200ull                /* never reused, so unique while live */

enum { OP_ALLOC = GM__TRACE_ALLOC, OP_FREE = GM__TRACE_FREE }; /* trace.h's actions */

/* A tensor's block: ptr 0 = none (freeing it is a no-op). */
typedef struct tensor {
    uint64_t ptr, size;
} tensor_t;

static const tensor_t NONE = {0, 0};

/* An op waiting in a thread's queue (multistream interleaves threads). */
typedef struct event {
    uint64_t ptr, size;
    uint8_t action, stream, thread;
} event_t;

typedef struct queue {
    event_t *ev;
    size_t n, cap, head;
} queue_t;

/* Generator state.  Accounting: live == sum of sizes of the blocks allocated
 * and not yet freed, over the ops written so far (queued ops not included). */
typedef struct synth {
    char *buf;
    size_t len, cap;
    int nomem;               /* a host allocation failed: stop writing */
    uint64_t rng;            /* the workload's choices */
    uint64_t time_rng;       /* op timings, separate so they do not perturb choices */
    double scale;
    uint64_t clock_us;       /* Time column of the last op */
    uint64_t next_id;        /* pointer ids handed out */
    unsigned stream, thread; /* Stream and Thread of the ops being made */
    queue_t *queue;          /* non-NULL: ops go there instead of the buffer */
    uint64_t live, live_peak, ops;
} synth_t;

/* splitmix64: tiny, and the same numbers on every platform. */
static inline uint64_t mix(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rnd(synth_t *s) { return mix(&s->rng); }
static inline uint64_t rnd_below(synth_t *s, uint64_t n) { return n ? rnd(s) % n : 0; }
static inline uint64_t rnd_between(synth_t *s, uint64_t lo, uint64_t hi) /* inclusive */
{
    return hi > lo ? lo + rnd_below(s, hi - lo + 1) : lo;
}
static inline double rnd_unit(synth_t *s) { return (double)(rnd(s) >> 11) * (1.0 / 9007199254740992.0); }
/* lo..hi, most draws near lo: lo + (hi - lo) * u^k (a long tail, like request
 * and sequence lengths in practice). */
static inline uint64_t rnd_skewed(synth_t *s, uint64_t lo, uint64_t hi, int k)
{
    double u = rnd_unit(s), p = u;
    for (int i = 1; i < k; i++) p *= u;
    return lo + (uint64_t)((double)(hi - lo) * p + 0.5);
}

/* base * scale rounded to a multiple of `multiple`, at least `min` multiples. */
static inline uint64_t scaled(const synth_t *s, uint64_t base, uint64_t multiple, uint64_t min)
{
    uint64_t n = (uint64_t)((double)base * s->scale / (double)multiple + 0.5);
    return (n < min ? min : n) * multiple;
}

/* Wall time passing with no allocation (kernels running, host waiting). */
static inline void idle(synth_t *s, uint64_t us) { s->clock_us += us; }

/* Dimensions of a transformer (bytes computed from them). */
typedef struct dims {
    uint64_t d, heads, hd, f, vocab, layers;
} dims_t;

/* ---- defined in writer.c: the trace writer and tensors ---------------------- */

/* Append text (NUL-terminated) to the trace. */
void synth_write_text(synth_t *s, const char *text);
/* Write one op as a trace row now (the queued ops of multistream, when their
 * thread's turn comes); moves the clock and the live accounting. */
void synth_emit(synth_t *s, int action, uint64_t ptr, uint64_t size, unsigned stream,
                unsigned thread);
/* Allocate a tensor of `bytes` on the current stream; 0 bytes: none. */
tensor_t synth_talloc(synth_t *s, uint64_t bytes);
/* Free a tensor on the current stream (none: nothing happens). */
void synth_tfree(synth_t *s, tensor_t *t);

/* ---- defined in serve.c: a decoder layer at inference, the LLM servers ------ */

void synth_layer_qkv(synth_t *s, const dims_t *m, uint64_t T, tensor_t *qr, tensor_t *kr,
                     tensor_t *v);
void synth_layer_out(synth_t *s, const dims_t *m, uint64_t T, tensor_t *attn, tensor_t *h);
void synth_kv_inference(synth_t *s);
void synth_kv_paged(synth_t *s);

/* ---- defined in train.c: training loops ------------------------------------- */

void synth_vit_train(synth_t *s);
void synth_varbatch_train(synth_t *s);

/* ---- defined in pipeline.c: a pipeline over many streams -------------------- */

void synth_multistream(synth_t *s);

#endif /* GM_TOOLS_SYNTH_H */
