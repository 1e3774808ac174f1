/* SPDX-License-Identifier: Apache-2.0 */
/*
 * synth.c — `gpumem synth`: write a synthetic allocation trace (RMM logging
 * CSV) for a workload the recorded traces do not cover: an LLM server whose
 * KV cache grows naively or in pages, vision-transformer training, a long
 * pipeline over many streams, GPT training whose batch shape changes every
 * step.  docs/workloads.md describes each kind and why it is hard.
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
 * The generator (gm_cli_synth_generate) writes into memory and needs nothing
 * from the rest of the CLI; tests/unit/test_synth.c compiles this file with
 * GM_SYNTH_GENERATOR_ONLY to test it without the command around it.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "gpumem.h"
#include "observe/trace.h"

#ifndef GM_SYNTH_GENERATOR_ONLY
#include "base/internal.h"
#include "lib/trace_read.h"
#ifdef GM_HAVE_ZLIB
#include <zlib.h>
#endif
#endif

/* ---- the trace writer ------------------------------------------------------ */

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
static uint64_t mix(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rnd(synth_t *s) { return mix(&s->rng); }
static uint64_t rnd_below(synth_t *s, uint64_t n) { return n ? rnd(s) % n : 0; }
static uint64_t rnd_between(synth_t *s, uint64_t lo, uint64_t hi) /* inclusive */
{
    return hi > lo ? lo + rnd_below(s, hi - lo + 1) : lo;
}
static double rnd_unit(synth_t *s) { return (double)(rnd(s) >> 11) * (1.0 / 9007199254740992.0); }
/* lo..hi, most draws near lo: lo + (hi - lo) * u^k (a long tail, like request
 * and sequence lengths in practice). */
static uint64_t rnd_skewed(synth_t *s, uint64_t lo, uint64_t hi, int k)
{
    double u = rnd_unit(s), p = u;
    for (int i = 1; i < k; i++) p *= u;
    return lo + (uint64_t)((double)(hi - lo) * p + 0.5);
}

/* base * scale rounded to a multiple of `multiple`, at least `min` multiples. */
static uint64_t scaled(const synth_t *s, uint64_t base, uint64_t multiple, uint64_t min)
{
    uint64_t n = (uint64_t)((double)base * s->scale / (double)multiple + 0.5);
    return (n < min ? min : n) * multiple;
}

static int reserve(synth_t *s, size_t more)
{
    if (s->nomem) return -1;
    if (s->cap - s->len >= more) return 0;
    size_t cap = s->cap ? s->cap : 1u << 20;
    while (cap - s->len < more) cap *= 2;
    char *b = realloc(s->buf, cap);
    if (!b) {
        s->nomem = 1;
        return -1;
    }
    s->buf = b;
    s->cap = cap;
    return 0;
}

static void write_text(synth_t *s, const char *text)
{
    size_t n = strlen(text);
    if (reserve(s, n + 1)) return;
    memcpy(s->buf + s->len, text, n + 1);
    s->len += n;
}

/* Write one op: the clock moves on by the time the framework took to get
 * here (more for larger outputs: the kernel that fills them).  The row is
 * trace.h's (a clock to the microsecond, decimal stream). */
static void emit(synth_t *s, int action, uint64_t ptr, uint64_t size, unsigned stream,
                 unsigned thread)
{
    if (reserve(s, GM__TRACE_ROW_MAX)) return;
    if (action == OP_ALLOC) {
        s->clock_us += 2 + mix(&s->time_rng) % 6 + (size >> 23);
        s->live += size;
        if (s->live > s->live_peak) s->live_peak = s->live;
    } else {
        s->clock_us += 1 + mix(&s->time_rng) % 2;
        s->live -= size;
    }
    s->ops++;
    char *p = gm__trace_format_row(s->buf + s->len, GM__TRACE_ROW_CLOCK, thread,
                                   s->clock_us * 1000, action, ptr, size, stream);
    s->len = (size_t)(p - s->buf);
}

static void put_op(synth_t *s, int action, uint64_t ptr, uint64_t size)
{
    queue_t *q = s->queue;
    if (!q) {
        emit(s, action, ptr, size, s->stream, s->thread);
        return;
    }
    if (q->n == q->cap) {
        size_t cap = q->cap ? q->cap * 2 : 1024;
        event_t *e = realloc(q->ev, cap * sizeof *e);
        if (!e) {
            s->nomem = 1;
            return;
        }
        q->ev = e;
        q->cap = cap;
    }
    q->ev[q->n++] = (event_t){ptr, size, (uint8_t)action, (uint8_t)s->stream, (uint8_t)s->thread};
}

/* Wall time passing with no allocation (kernels running, host waiting). */
static void idle(synth_t *s, uint64_t us) { s->clock_us += us; }

/* Allocate a tensor of `bytes` on the current stream; 0 bytes: none. */
static tensor_t talloc(synth_t *s, uint64_t bytes)
{
    if (bytes == 0) return NONE;
    tensor_t t = {PTR_BASE + s->next_id++ * PTR_STEP,
                  (bytes + ROUND_BYTES - 1) / ROUND_BYTES * ROUND_BYTES};
    put_op(s, OP_ALLOC, t.ptr, t.size);
    return t;
}

/* Free a tensor on the current stream (none: nothing happens). */
static void tfree(synth_t *s, tensor_t *t)
{
    if (!t->ptr) return;
    put_op(s, OP_FREE, t->ptr, t->size);
    *t = NONE;
}

/* ---- a decoder layer at inference (shared by the servers and the pipeline) - */

/* Dimensions of a transformer (bytes computed from them). */
typedef struct dims {
    uint64_t d, heads, hd, f, vocab, layers;
} dims_t;

/* The layer's front half for T tokens: norm, q/k/v projections, rotary
 * embedding.  h (the layer input) stays alive for the residual. */
static void layer_qkv(synth_t *s, const dims_t *m, uint64_t T, tensor_t *qr, tensor_t *kr,
                      tensor_t *v)
{
    uint64_t act = T * m->d * 2;
    tensor_t n1 = talloc(s, act);
    tensor_t q = talloc(s, act), k = talloc(s, act);
    *v = talloc(s, act);
    tfree(s, &n1);
    *qr = talloc(s, act);
    tfree(s, &q);
    *kr = talloc(s, act);
    tfree(s, &k);
}

/* The back half: output projection, residual, norm, SwiGLU MLP, residual.
 * Frees attn and the layer input *h; *h becomes the layer output. */
static void layer_out(synth_t *s, const dims_t *m, uint64_t T, tensor_t *attn, tensor_t *h)
{
    uint64_t act = T * m->d * 2, wide = T * m->f * 2;
    tensor_t o = talloc(s, act);
    tfree(s, attn);
    tensor_t h1 = talloc(s, act);
    tfree(s, &o);
    tfree(s, h);
    tensor_t n2 = talloc(s, act);
    tensor_t gate = talloc(s, wide), up = talloc(s, wide);
    tfree(s, &n2);
    tensor_t a = talloc(s, wide);
    tfree(s, &gate);
    tensor_t prod = talloc(s, wide);
    tfree(s, &a);
    tfree(s, &up);
    tensor_t down = talloc(s, act);
    tfree(s, &prod);
    *h = talloc(s, act);
    tfree(s, &down);
    tfree(s, &h1);
}

/* ---- kv_inference, kv_paged: an LLM server ---------------------------------- */

#define SRV_MAX_ACTIVE 16
#define BLOCK_TOKENS 16

enum { LW_ATTN_NORM, LW_Q, LW_K, LW_V, LW_O, LW_MLP_NORM, LW_GATE, LW_UP, LW_DOWN, LW_COUNT };

typedef struct request {
    uint64_t b, prompt, gen; /* sequences, prompt tokens, tokens to generate */
    uint64_t len, done;      /* tokens in the cache, tokens generated */
    uint64_t kv_bytes;       /* what its cache will hold at the end (admission) */
    tensor_t *k, *v;         /* naive: per layer, [b, heads, len, hd] */
    tensor_t *blocks;        /* paged: [layer][seq][block] */
    uint64_t max_blocks, n_blocks;
    tensor_t next;           /* sampled token ids, [b] int64 */
} request_t;

typedef struct server {
    synth_t *s;
    dims_t m;
    int paged;
    uint64_t max_batch, max_tokens, max_active, n_requests;
    uint64_t kv_budget, kv_used;
    tensor_t *w;
    size_t nw;
    request_t *active[SRV_MAX_ACTIVE];
    unsigned n_active;
} server_t;

static uint64_t block_bytes(const dims_t *m) { return 2 * BLOCK_TOKENS * m->d * 2; }

static request_t *request_new(server_t *sv)
{
    synth_t *s = sv->s;
    request_t *r = calloc(1, sizeof *r);
    if (!r) {
        s->nomem = 1;
        return NULL;
    }
    r->b = rnd_skewed(s, 1, sv->max_batch, 3);
    r->prompt = rnd_skewed(s, 8, 2048, 2);
    if (r->b * r->prompt > sv->max_tokens) r->prompt = sv->max_tokens / r->b;
    if (r->prompt < 8) r->prompt = 8;
    r->gen = rnd_skewed(s, 4, 128, 2);
    const dims_t *m = &sv->m;
    uint64_t total = r->prompt + r->gen;
    r->max_blocks = (total + BLOCK_TOKENS - 1) / BLOCK_TOKENS;
    if (sv->paged) {
        r->kv_bytes = m->layers * r->b * r->max_blocks * block_bytes(m);
        r->blocks = calloc(m->layers * r->b * r->max_blocks, sizeof *r->blocks);
    } else {
        r->kv_bytes = m->layers * 2 * r->b * total * m->d * 2;
        r->k = calloc(m->layers, sizeof *r->k);
        r->v = calloc(m->layers, sizeof *r->v);
    }
    if (sv->paged ? !r->blocks : !r->k || !r->v) s->nomem = 1;
    return r;
}

static void request_free(request_t *r)
{
    if (!r) return;
    free(r->k);
    free(r->v);
    free(r->blocks);
    free(r);
}

/* Paged: give every sequence of r a new block in layer l when its tokens
 * reach `upto` (the block manager allocates on demand). */
static void paged_grow(server_t *sv, request_t *r, unsigned l, uint64_t upto)
{
    uint64_t need = (upto + BLOCK_TOKENS - 1) / BLOCK_TOKENS;
    for (uint64_t q = 0; q < r->b; q++) {
        tensor_t *row = &r->blocks[((uint64_t)l * r->b + q) * r->max_blocks];
        for (uint64_t i = 0; i < need && i < r->max_blocks; i++)
            if (!row[i].ptr) row[i] = talloc(sv->s, block_bytes(&sv->m));
    }
}

/* Sample the next token of every sequence from fp32 logits [rows, vocab]. */
static void sample(server_t *sv, request_t *r)
{
    synth_t *s = sv->s;
    tensor_t probs = talloc(s, r->b * sv->m.vocab * 4);
    r->next = talloc(s, r->b * 8);
    tfree(s, &probs);
}

/* The prompt's forward pass: a naive server computes attention with the full
 * [b, heads, p, p] score matrix; a paged one with a fused kernel. */
static void prefill(server_t *sv, request_t *r)
{
    synth_t *s = sv->s;
    const dims_t *m = &sv->m;
    uint64_t b = r->b, p = r->prompt, T = b * p, act = T * m->d * 2;
    tensor_t ids = talloc(s, T * 8), pos = talloc(s, T * 8);
    tensor_t mask = sv->paged ? NONE : talloc(s, b * p * p * 2);
    tensor_t cos = talloc(s, T * m->hd * 2), sin = talloc(s, T * m->hd * 2);
    tensor_t h = talloc(s, act);
    tfree(s, &ids);
    for (unsigned l = 0; l < m->layers; l++) {
        tensor_t qr, kr, v, attn;
        layer_qkv(s, m, T, &qr, &kr, &v);
        if (sv->paged) {
            paged_grow(sv, r, l, p);
            attn = talloc(s, act);
            tfree(s, &qr);
            tfree(s, &kr);
            tfree(s, &v);
        } else {
            uint64_t scores = b * m->heads * p * p;
            r->k[l] = talloc(s, act); /* [b, heads, p, hd], contiguous */
            tfree(s, &kr);
            r->v[l] = talloc(s, act);
            tfree(s, &v);
            tensor_t sc = talloc(s, scores * 2);
            tensor_t masked = talloc(s, scores * 2);
            tfree(s, &sc);
            tensor_t pf = talloc(s, scores * 4); /* softmax in fp32 */
            tfree(s, &masked);
            tensor_t pb = talloc(s, scores * 2);
            tfree(s, &pf);
            tensor_t ao = talloc(s, act);
            tfree(s, &pb);
            tfree(s, &qr);
            attn = talloc(s, act); /* transpose back, contiguous */
            tfree(s, &ao);
        }
        layer_out(s, m, T, &attn, &h);
        idle(s, 20 + T / 64);
    }
    tfree(s, &cos);
    tfree(s, &sin);
    tfree(s, &mask);
    tfree(s, &pos);
    tensor_t nf = talloc(s, act);
    tfree(s, &h);
    tensor_t last = talloc(s, b * m->d * 2); /* the last position of each sequence */
    tfree(s, &nf);
    tensor_t logits = talloc(s, b * m->vocab * 2);
    tfree(s, &last);
    tensor_t lf = talloc(s, b * m->vocab * 4);
    tfree(s, &logits);
    sample(sv, r);
    tfree(s, &lf);
    r->len = p;
}

/* One decode step of every active request, batched through the dense layers;
 * attention and the cache per request.  The naive cache grows by one token:
 * a new K and V of len+1 (torch.cat), the old ones freed. */
static void decode_step(server_t *sv)
{
    synth_t *s = sv->s;
    const dims_t *m = &sv->m;
    uint64_t B = 0, max_blocks = 0;
    for (unsigned i = 0; i < sv->n_active; i++) {
        B += sv->active[i]->b;
        if (sv->active[i]->max_blocks > max_blocks) max_blocks = sv->active[i]->max_blocks;
    }
    uint64_t act = B * m->d * 2;
    tensor_t ids = talloc(s, B * 8);
    for (unsigned i = 0; i < sv->n_active; i++) tfree(s, &sv->active[i]->next);
    tensor_t pos = talloc(s, B * 8), table = NONE, lens = NONE, slots = NONE;
    if (sv->paged) {
        table = talloc(s, B * max_blocks * 4);
        lens = talloc(s, B * 4);
        slots = talloc(s, B * 8);
    }
    tensor_t cos = talloc(s, B * m->hd * 2), sin = talloc(s, B * m->hd * 2);
    tensor_t h = talloc(s, act);
    tfree(s, &ids);
    tensor_t outs[SRV_MAX_ACTIVE];
    for (unsigned l = 0; l < m->layers; l++) {
        tensor_t qr, kr, v, attn;
        layer_qkv(s, m, B, &qr, &kr, &v);
        if (sv->paged) {
            for (unsigned i = 0; i < sv->n_active; i++)
                paged_grow(sv, sv->active[i], l, sv->active[i]->len + 1);
            attn = talloc(s, act);
        } else {
            for (unsigned i = 0; i < sv->n_active; i++) {
                request_t *r = sv->active[i];
                uint64_t n = r->len + 1, kv = r->b * n * m->d * 2, sc = r->b * m->heads * n;
                tensor_t k = talloc(s, kv);
                tfree(s, &r->k[l]);
                r->k[l] = k;
                tensor_t vv = talloc(s, kv);
                tfree(s, &r->v[l]);
                r->v[l] = vv;
                tensor_t scores = talloc(s, sc * 2);
                tensor_t pf = talloc(s, sc * 4);
                tfree(s, &scores);
                tensor_t pb = talloc(s, sc * 2);
                tfree(s, &pf);
                outs[i] = talloc(s, r->b * m->d * 2);
                tfree(s, &pb);
            }
            attn = talloc(s, act); /* torch.cat of the requests' outputs */
            for (unsigned i = 0; i < sv->n_active; i++) tfree(s, &outs[i]);
        }
        tfree(s, &qr);
        tfree(s, &kr);
        tfree(s, &v);
        layer_out(s, m, B, &attn, &h);
        idle(s, 15);
    }
    tfree(s, &cos);
    tfree(s, &sin);
    tfree(s, &pos);
    tfree(s, &table);
    tfree(s, &lens);
    tfree(s, &slots);
    tensor_t nf = talloc(s, act);
    tfree(s, &h);
    tensor_t logits = talloc(s, B * m->vocab * 2);
    tfree(s, &nf);
    tensor_t lf = talloc(s, B * m->vocab * 4);
    tfree(s, &logits);
    for (unsigned i = 0; i < sv->n_active; i++) sample(sv, sv->active[i]);
    tfree(s, &lf);
    for (unsigned i = 0; i < sv->n_active; i++) {
        sv->active[i]->len++;
        sv->active[i]->done++;
    }
}

/* A finished request: its cache goes back, layer by layer. */
static void retire(server_t *sv, request_t *r)
{
    synth_t *s = sv->s;
    if (sv->paged) {
        for (uint64_t i = 0; i < sv->m.layers * r->b * r->max_blocks; i++) tfree(s, &r->blocks[i]);
    } else {
        for (unsigned l = 0; l < sv->m.layers; l++) {
            tfree(s, &r->k[l]);
            tfree(s, &r->v[l]);
        }
    }
    tfree(s, &r->next);
    sv->kv_used -= r->kv_bytes;
}

/* Continuous batching: each step, a waiting request may arrive and is
 * admitted (prefilled) while a slot and the KV budget allow; then every
 * active request decodes one token; finished ones leave. */
static void run_server(synth_t *s, int paged)
{
    server_t sv = {.s = s, .paged = paged};
    dims_t *m = &sv.m;
    m->d = scaled(s, 4096, 128, 1);
    m->hd = 128;
    m->heads = m->d / m->hd;
    m->f = scaled(s, 11008, 128, 1);
    m->vocab = 32000;
    m->layers = scaled(s, 6, 1, 2);
    sv.max_batch = scaled(s, 16, 1, 1);
    sv.max_tokens = sv.max_batch * 512;
    sv.max_active = paged ? 16 : 8;
    sv.n_requests = paged ? 52 : 44;

    /* Weights, bf16, in module order: embedding, layers, norm, lm_head. */
    sv.nw = 3 + (size_t)m->layers * LW_COUNT;
    sv.w = calloc(sv.nw, sizeof *sv.w);
    if (!sv.w) {
        s->nomem = 1;
        return;
    }
    uint64_t d = m->d, f = m->f, weights = 0;
    size_t nw = 0;
    sv.w[nw++] = talloc(s, m->vocab * d * 2);
    for (unsigned l = 0; l < m->layers; l++) {
        const uint64_t sizes[LW_COUNT] = {d, d * d, d * d, d * d, d * d, d, f * d, f * d, d * f};
        for (int i = 0; i < LW_COUNT; i++) sv.w[nw++] = talloc(s, sizes[i] * 2);
    }
    sv.w[nw++] = talloc(s, d * 2);
    sv.w[nw++] = talloc(s, m->vocab * d * 2);
    for (size_t i = 0; i < nw; i++) weights += sv.w[i].size;
    sv.kv_budget = weights;
    idle(s, 2000000);

    request_t *waiting = NULL;
    uint64_t started = 0;
    while (!s->nomem && (started < sv.n_requests || sv.n_active > 0)) {
        if (sv.n_active == 0) idle(s, 1000 + rnd_below(s, 200000)); /* no traffic */
        while (started < sv.n_requests && sv.n_active < sv.max_active) {
            if (!waiting && !(waiting = request_new(&sv))) break;
            if (s->nomem) break;
            if (sv.n_active > 0 && (sv.kv_used + waiting->kv_bytes > sv.kv_budget ||
                                    rnd_unit(s) > 0.2))
                break; /* not arrived yet, or no room: it waits */
            sv.kv_used += waiting->kv_bytes;
            prefill(&sv, waiting);
            sv.active[sv.n_active++] = waiting;
            waiting = NULL;
            started++;
        }
        if (s->nomem || sv.n_active == 0) break;
        decode_step(&sv);
        idle(s, 40 + rnd_below(s, 200)); /* host: sampling, detokenizing */
        for (unsigned i = 0; i < sv.n_active;) {
            request_t *r = sv.active[i];
            if (r->done < r->gen) {
                i++;
                continue;
            }
            retire(&sv, r);
            request_free(r);
            sv.active[i] = sv.active[--sv.n_active];
        }
    }
    for (unsigned i = 0; i < sv.n_active; i++) {
        retire(&sv, sv.active[i]);
        request_free(sv.active[i]);
    }
    request_free(waiting);
    for (size_t i = 0; i < nw; i++) tfree(s, &sv.w[i]);
    free(sv.w);
}

static void gen_kv_inference(synth_t *s) { run_server(s, 0); }
static void gen_kv_paged(synth_t *s) { run_server(s, 1); }

/* ---- vit_train, varbatch_train: a training loop ----------------------------- */

/* Parameters of one block (0 bytes where the architecture has none). */
enum { PB_N1W, PB_N1B, PB_QKVW, PB_QKVB, PB_OW, PB_OB, PB_N2W, PB_N2B,
       PB_FC1W, PB_FC1B, PB_UPW, PB_FC2W, PB_FC2B, PB_COUNT };
/* Before the blocks: ViT patch weight, patch bias, cls token, pos embedding;
 * GPT token embedding.  After: final norm weight and bias, head weight, bias. */
enum { PE_COUNT = 4, PF_NW = 0, PF_NB, PF_HEADW, PF_HEADB, PF_COUNT };

/* What a block's forward keeps for its backward. */
typedef struct saved {
    tensor_t n1a, n1b, ln1b, wqkv, qkv;
    tensor_t qs, probs, probs_b;   /* ViT: materialized attention */
    tensor_t qr, kr, lse;          /* GPT: rotary q and k, flash statistics */
    tensor_t attn, wo, x1;
    tensor_t n2a, n2b, ln2b;
    tensor_t w1, h1, g;            /* ViT: fc1 out, gelu out */
    tensor_t wup, up, sg, prod;    /* GPT: SwiGLU (h1 = gate) */
    tensor_t w2;
} saved_t;

typedef struct trainer {
    synth_t *s;
    int vit;      /* ViT: LayerNorm, biases, GELU, materialized attention;
                     else Llama-style: RMSNorm, SwiGLU, rotary, flash attention */
    uint64_t d, heads, hd, f, layers, vocab; /* vocab: classes for ViT */
    size_t np;
    uint64_t *psize;            /* fp32 bytes per parameter, 0 = absent */
    tensor_t *p, *g, *m, *v, *tmp; /* params, grads, AdamW states, foreach temps */
    saved_t *sv;                /* per block */
} trainer_t;

static size_t pb(uint64_t l, int i) { return PE_COUNT + (size_t)l * PB_COUNT + (size_t)i; }
static size_t pf(const trainer_t *tr, int i) { return PE_COUNT + (size_t)tr->layers * PB_COUNT + (size_t)i; }

/* .grad of parameter i, made fp32 from a bf16 grad (the autocast cast's
 * backward) that is then dropped. */
static void grad_from(trainer_t *tr, size_t i, tensor_t *low)
{
    tr->g[i] = talloc(tr->s, tr->psize[i]);
    tfree(tr->s, low);
}

/* Autocast linear: the fp32 weight cast to bf16 (the copy is saved for
 * backward), the bias cast too (not saved), y = x W^T + b in bf16. */
static tensor_t linear_fwd(trainer_t *tr, uint64_t T, uint64_t in, uint64_t out, size_t bi,
                           tensor_t *wc)
{
    synth_t *s = tr->s;
    *wc = talloc(s, out * in * 2);
    tensor_t bc = tr->psize[bi] ? talloc(s, out * 2) : NONE;
    tensor_t y = talloc(s, T * out * 2);
    tfree(s, &bc);
    return y;
}

/* Its backward: grad of the input (bf16), of the weight and bias; then the
 * saved input (x may be NULL when another op still holds it), the weight
 * copy and the incoming grad are released. */
static tensor_t linear_bwd(trainer_t *tr, uint64_t T, uint64_t in, uint64_t out, size_t wi,
                           size_t bi, tensor_t *dy, tensor_t *x, tensor_t *wc)
{
    synth_t *s = tr->s;
    tensor_t dx = talloc(s, T * in * 2);
    tensor_t dw = talloc(s, out * in * 2);
    tensor_t db = tr->psize[bi] ? talloc(s, out * 2) : NONE;
    if (x) tfree(s, x);
    tfree(s, wc);
    tfree(s, dy);
    grad_from(tr, wi, &dw);
    if (db.ptr) grad_from(tr, bi, &db);
    return dx;
}

/* Norm of the fp32 residual stream (autocast runs norms in fp32): returns
 * the fp32 output; *a, *b what backward needs.  LayerNorm: mean and rstd.
 * RMSNorm written out as eager code does (pow, mean, rsqrt, mul, mul). */
static tensor_t norm_fwd(trainer_t *tr, uint64_t T, tensor_t *a, tensor_t *b)
{
    synth_t *s = tr->s;
    uint64_t full = T * tr->d * 4;
    if (tr->vit) {
        tensor_t out = talloc(s, full);
        *a = talloc(s, T * 4);
        *b = talloc(s, T * 4);
        return out;
    }
    tensor_t sq = talloc(s, full);
    tensor_t var = talloc(s, T * 4);
    tfree(s, &sq);
    *a = talloc(s, T * 4); /* rsqrt(var + eps) */
    tfree(s, &var);
    *b = talloc(s, full); /* x * rstd */
    return talloc(s, full); /* weight * that */
}

/* Its backward: frees dy, the saved state and the norm's input x; sets the
 * weight (and bias) grads; returns the grad of x (fp32). */
static tensor_t norm_bwd(trainer_t *tr, uint64_t T, tensor_t *dy, tensor_t *a, tensor_t *b,
                         tensor_t *x, size_t wi, size_t bi)
{
    synth_t *s = tr->s;
    uint64_t full = T * tr->d * 4;
    if (tr->vit) {
        tensor_t dx = talloc(s, full);
        tr->g[wi] = talloc(s, tr->psize[wi]);
        tr->g[bi] = talloc(s, tr->psize[bi]);
        tfree(s, dy);
        tfree(s, a);
        tfree(s, b);
        tfree(s, x);
        return dx;
    }
    tensor_t dn = talloc(s, full); /* dy * weight */
    tensor_t dwt = talloc(s, full); /* dy * normalized, summed into the weight grad */
    tr->g[wi] = talloc(s, tr->psize[wi]);
    tfree(s, &dwt);
    tfree(s, dy);
    tfree(s, b);
    tensor_t dxa = talloc(s, full); /* dn * rstd */
    tensor_t drt = talloc(s, full); /* dn * x, summed */
    tensor_t dr = talloc(s, T * 4);
    tfree(s, &drt);
    tfree(s, &dn);
    tensor_t dvar = talloc(s, T * 4);
    tfree(s, &dr);
    tfree(s, a);
    tensor_t dsq = talloc(s, full);
    tfree(s, &dvar);
    tensor_t dxb = talloc(s, full);
    tfree(s, &dsq);
    tfree(s, x);
    tensor_t dx = talloc(s, full);
    tfree(s, &dxa);
    tfree(s, &dxb);
    return dx;
}

/* One block's forward over B sequences of S tokens; x (fp32 [T, d]) is kept
 * (the norm saved it); returns the block's output. */
static tensor_t block_fwd(trainer_t *tr, uint64_t l, uint64_t B, uint64_t S, saved_t *sv)
{
    synth_t *s = tr->s;
    uint64_t T = B * S, d = tr->d, f = tr->f, act = T * d * 2;
    memset(sv, 0, sizeof *sv);
    tensor_t out = norm_fwd(tr, T, &sv->n1a, &sv->n1b);
    sv->ln1b = talloc(s, act);
    tfree(s, &out);
    sv->qkv = linear_fwd(tr, T, d, 3 * d, pb(l, PB_QKVB), &sv->wqkv);
    if (tr->vit) {
        uint64_t sc = B * tr->heads * S * S;
        sv->qs = talloc(s, act); /* q * scale */
        tensor_t scores = talloc(s, sc * 2);
        tensor_t sf = talloc(s, sc * 4); /* softmax runs in fp32 */
        tfree(s, &scores);
        sv->probs = talloc(s, sc * 4);
        tfree(s, &sf);
        sv->probs_b = talloc(s, sc * 2);
        tensor_t ao = talloc(s, act);
        sv->attn = talloc(s, act); /* transpose + reshape: a contiguous copy */
        tfree(s, &ao);
    } else {
        tensor_t rot = talloc(s, act); /* rotate_half(q) */
        sv->qr = talloc(s, act);
        tfree(s, &rot);
        rot = talloc(s, act);
        sv->kr = talloc(s, act);
        tfree(s, &rot);
        sv->attn = talloc(s, act);
        sv->lse = talloc(s, B * tr->heads * S * 4);
    }
    tensor_t proj = linear_fwd(tr, T, d, d, pb(l, PB_OB), &sv->wo);
    sv->x1 = talloc(s, T * d * 4); /* x + proj, promoted to fp32 */
    tfree(s, &proj);
    out = norm_fwd(tr, T, &sv->n2a, &sv->n2b);
    sv->ln2b = talloc(s, act);
    tfree(s, &out);
    tensor_t h2;
    if (tr->vit) {
        sv->h1 = linear_fwd(tr, T, d, f, pb(l, PB_FC1B), &sv->w1);
        sv->g = talloc(s, T * f * 2); /* gelu */
        h2 = linear_fwd(tr, T, f, d, pb(l, PB_FC2B), &sv->w2);
    } else {
        sv->h1 = linear_fwd(tr, T, d, f, pb(l, PB_FC1B), &sv->w1); /* gate */
        sv->up = linear_fwd(tr, T, d, f, pb(l, PB_FC1B), &sv->wup);
        sv->sg = talloc(s, T * f * 2); /* silu(gate) */
        sv->prod = talloc(s, T * f * 2);
        h2 = linear_fwd(tr, T, f, d, pb(l, PB_FC2B), &sv->w2);
    }
    tensor_t x2 = talloc(s, T * d * 4);
    tfree(s, &h2);
    idle(s, T / 32);
    return x2;
}

/* Its backward: takes the grad of the block output (freed), frees what the
 * forward saved and the block input x; returns the grad of x. */
static tensor_t block_bwd(trainer_t *tr, uint64_t l, uint64_t B, uint64_t S, saved_t *sv,
                          tensor_t *dx2, tensor_t *x)
{
    synth_t *s = tr->s;
    uint64_t T = B * S, d = tr->d, f = tr->f, act = T * d * 2;
    tensor_t dh2 = talloc(s, act); /* the residual's grad cast to bf16 */
    tensor_t dln2b;
    if (tr->vit) {
        tensor_t dg = linear_bwd(tr, T, f, d, pb(l, PB_FC2W), pb(l, PB_FC2B), &dh2,
                                 &sv->g, &sv->w2);
        tensor_t dh1 = talloc(s, T * f * 2);
        tfree(s, &dg);
        tfree(s, &sv->h1);
        dln2b = linear_bwd(tr, T, d, f, pb(l, PB_FC1W), pb(l, PB_FC1B), &dh1, &sv->ln2b,
                           &sv->w1);
    } else {
        tensor_t dprod = linear_bwd(tr, T, f, d, pb(l, PB_FC2W), pb(l, PB_FC2B), &dh2,
                                    &sv->prod, &sv->w2);
        tensor_t dsg = talloc(s, T * f * 2), dup = talloc(s, T * f * 2);
        tfree(s, &dprod);
        tfree(s, &sv->sg);
        tfree(s, &sv->up);
        tensor_t dgate = talloc(s, T * f * 2);
        tfree(s, &dsg);
        tfree(s, &sv->h1);
        tensor_t da = linear_bwd(tr, T, d, f, pb(l, PB_UPW), pb(l, PB_FC1B), &dup, NULL,
                                 &sv->wup);
        tensor_t db = linear_bwd(tr, T, d, f, pb(l, PB_FC1W), pb(l, PB_FC1B), &dgate,
                                 &sv->ln2b, &sv->w1);
        dln2b = talloc(s, act); /* the two grads of the shared input, summed */
        tfree(s, &da);
        tfree(s, &db);
    }
    tensor_t dln2 = talloc(s, T * d * 4);
    tfree(s, &dln2b);
    tensor_t dx1p = norm_bwd(tr, T, &dln2, &sv->n2a, &sv->n2b, &sv->x1, pb(l, PB_N2W),
                             pb(l, PB_N2B));
    tensor_t dx1 = talloc(s, T * d * 4); /* + the residual path */
    tfree(s, &dx1p);
    tfree(s, dx2);
    tensor_t dproj = talloc(s, act);
    /* ViT: the attention output is the projection's alone; GPT: flash
     * attention saved it too, so its backward releases it. */
    tensor_t dattn = linear_bwd(tr, T, d, d, pb(l, PB_OW), pb(l, PB_OB), &dproj,
                                tr->vit ? &sv->attn : NULL, &sv->wo);
    tensor_t dq, dk, dv;
    if (tr->vit) {
        uint64_t sc = B * tr->heads * S * S;
        tensor_t dpb = talloc(s, sc * 2);
        dv = talloc(s, act);
        tfree(s, &dattn);
        tfree(s, &sv->probs_b);
        tensor_t dpf = talloc(s, sc * 4);
        tfree(s, &dpb);
        tensor_t dsf = talloc(s, sc * 4);
        tfree(s, &dpf);
        tfree(s, &sv->probs);
        tensor_t dsb = talloc(s, sc * 2);
        tfree(s, &dsf);
        tensor_t dqs = talloc(s, act);
        dk = talloc(s, act);
        tfree(s, &dsb);
        tfree(s, &sv->qs);
        dq = talloc(s, act);
        tfree(s, &dqs);
    } else {
        tensor_t acc = talloc(s, T * d * 4), sd = talloc(s, B * tr->heads * S * 4);
        tensor_t dq0 = talloc(s, act), dk0 = talloc(s, act);
        dv = talloc(s, act);
        tfree(s, &acc);
        tfree(s, &sd);
        tfree(s, &dattn);
        tfree(s, &sv->attn);
        tfree(s, &sv->lse);
        tfree(s, &sv->qr);
        tfree(s, &sv->kr);
        tensor_t rot = talloc(s, act);
        dq = talloc(s, act);
        tfree(s, &rot);
        tfree(s, &dq0);
        rot = talloc(s, act);
        dk = talloc(s, act);
        tfree(s, &rot);
        tfree(s, &dk0);
    }
    tensor_t dqkv = talloc(s, 3 * act);
    tfree(s, &dq);
    tfree(s, &dk);
    tfree(s, &dv);
    tfree(s, &sv->qkv);
    tensor_t dln1b = linear_bwd(tr, T, d, 3 * d, pb(l, PB_QKVW), pb(l, PB_QKVB), &dqkv,
                                &sv->ln1b, &sv->wqkv);
    tensor_t dln1 = talloc(s, T * d * 4);
    tfree(s, &dln1b);
    tensor_t dxp = norm_bwd(tr, T, &dln1, &sv->n1a, &sv->n1b, x, pb(l, PB_N1W),
                            pb(l, PB_N1B));
    tensor_t dx = talloc(s, T * d * 4);
    tfree(s, &dxp);
    tfree(s, &dx1);
    idle(s, T / 16);
    return dx;
}

/* clip_grad_norm_ (foreach norms, stacked, one total) and a foreach AdamW
 * step: state made at the first step, one sqrt temporary per parameter. */
static void optimizer_step(trainer_t *tr)
{
    synth_t *s = tr->s;
    for (size_t i = 0; i < tr->np; i++) tr->tmp[i] = tr->g[i].ptr ? talloc(s, 4) : NONE;
    tensor_t stacked = talloc(s, tr->np * 4);
    for (size_t i = 0; i < tr->np; i++) tfree(s, &tr->tmp[i]);
    tensor_t total = talloc(s, 4);
    tfree(s, &stacked);
    tensor_t coef = talloc(s, 4), clamped = talloc(s, 4);
    tfree(s, &coef);
    tfree(s, &clamped);
    tfree(s, &total);
    for (size_t i = 0; i < tr->np; i++) {
        if (!tr->psize[i] || tr->m[i].ptr) continue;
        tr->m[i] = talloc(s, tr->psize[i]);
        tr->v[i] = talloc(s, tr->psize[i]);
    }
    for (size_t i = 0; i < tr->np; i++) tr->tmp[i] = talloc(s, tr->psize[i]);
    idle(s, 500);
    for (size_t i = 0; i < tr->np; i++) tfree(s, &tr->tmp[i]);
}

static int trainer_init(trainer_t *tr, synth_t *s, int vit)
{
    memset(tr, 0, sizeof *tr);
    tr->s = s;
    tr->vit = vit;
    if (vit) { /* ViT-L/16 at 224 px */
        tr->d = scaled(s, 1024, 64, 1);
        tr->hd = 64;
        tr->f = 4 * tr->d;
        tr->layers = scaled(s, 24, 1, 2);
        tr->vocab = 1000;
    } else { /* a Llama-style GPT */
        tr->d = scaled(s, 1280, 128, 1);
        tr->hd = 128;
        tr->f = scaled(s, 3456, 128, 1);
        tr->layers = scaled(s, 12, 1, 2);
        tr->vocab = 32000;
    }
    tr->heads = tr->d / tr->hd;
    tr->np = PE_COUNT + (size_t)tr->layers * PB_COUNT + PF_COUNT;
    tr->psize = calloc(tr->np, sizeof *tr->psize);
    tr->p = calloc(tr->np, sizeof *tr->p);
    tr->g = calloc(tr->np, sizeof *tr->g);
    tr->m = calloc(tr->np, sizeof *tr->m);
    tr->v = calloc(tr->np, sizeof *tr->v);
    tr->tmp = calloc(tr->np, sizeof *tr->tmp);
    tr->sv = calloc(tr->layers, sizeof *tr->sv);
    if (!tr->psize || !tr->p || !tr->g || !tr->m || !tr->v || !tr->tmp || !tr->sv) {
        s->nomem = 1;
        return -1;
    }
    uint64_t d = tr->d, f = tr->f, *ps = tr->psize;
    if (vit) {
        ps[0] = d * 768 * 4; /* patch projection: 3 x 16 x 16 -> d */
        ps[1] = d * 4;
        ps[2] = d * 4;       /* cls token */
        ps[3] = 197 * d * 4; /* position embedding */
    } else {
        ps[0] = tr->vocab * d * 4;
    }
    for (uint64_t l = 0; l < tr->layers; l++) {
        uint64_t *b = &ps[pb(l, 0)];
        b[PB_N1W] = b[PB_N2W] = d * 4;
        b[PB_QKVW] = 3 * d * d * 4;
        b[PB_OW] = d * d * 4;
        b[PB_FC1W] = f * d * 4;
        b[PB_FC2W] = d * f * 4;
        if (vit) {
            b[PB_N1B] = b[PB_N2B] = b[PB_OB] = b[PB_FC2B] = d * 4;
            b[PB_QKVB] = 3 * d * 4;
            b[PB_FC1B] = f * 4;
        } else {
            b[PB_UPW] = f * d * 4;
        }
    }
    ps[pf(tr, PF_NW)] = d * 4;
    ps[pf(tr, PF_HEADW)] = tr->vocab * d * 4;
    if (vit) {
        ps[pf(tr, PF_NB)] = d * 4;
        ps[pf(tr, PF_HEADB)] = tr->vocab * 4;
    }
    for (size_t i = 0; i < tr->np; i++) tr->p[i] = talloc(s, ps[i]); /* model.to("cuda") */
    return 0;
}

static void trainer_done(trainer_t *tr)
{
    synth_t *s = tr->s;
    if (tr->p && tr->g && tr->m && tr->v) {
        for (size_t i = 0; i < tr->np; i++) tfree(s, &tr->g[i]);
        for (size_t i = 0; i < tr->np; i++) {
            tfree(s, &tr->m[i]);
            tfree(s, &tr->v[i]);
        }
        for (size_t i = 0; i < tr->np; i++) tfree(s, &tr->p[i]);
    }
    free(tr->psize);
    free(tr->p);
    free(tr->g);
    free(tr->m);
    free(tr->v);
    free(tr->tmp);
    free(tr->sv);
}

/* One training step over B sequences of S tokens (ViT: S = 197).  data[0..1]
 * are the loader's tensors: the new batch is copied in before the previous
 * one is released, as `for x, y in loader` does. */
static void train_step(trainer_t *tr, uint64_t B, uint64_t S, tensor_t data[2])
{
    synth_t *s = tr->s;
    uint64_t d = tr->d, T = B * S;
    for (size_t i = 0; i < tr->np; i++) tfree(s, &tr->g[i]); /* zero_grad(set_to_none) */
    tensor_t in = talloc(s, tr->vit ? B * 3 * 224 * 224 * 4 : T * 8);
    tensor_t labels = talloc(s, tr->vit ? B * 8 : T * 8);
    tfree(s, &data[0]);
    tfree(s, &data[1]);
    data[0] = in;
    data[1] = labels;

    /* embedding */
    tensor_t x, wpc = NONE, imb = NONE;
    if (tr->vit) {
        imb = talloc(s, B * 3 * 224 * 224 * 2); /* autocast: conv input in bf16 */
        tensor_t co = linear_fwd(tr, B * 196, 768, d, 1, &wpc);
        tensor_t x0 = talloc(s, T * d * 4); /* cat(cls, patches), promoted to fp32 */
        tfree(s, &co);
        x = talloc(s, T * d * 4); /* + pos_embed */
        tfree(s, &x0);
    } else {
        x = talloc(s, T * d * 4);
    }

    /* blocks: each output is the next input; inputs stay saved */
    tensor_t *xs = calloc(tr->layers + 1, sizeof *xs);
    if (!xs) {
        s->nomem = 1;
        return;
    }
    xs[0] = x;
    for (uint64_t l = 0; l < tr->layers; l++) xs[l + 1] = block_fwd(tr, l, B, S, &tr->sv[l]);

    /* head and loss (cross entropy in fp32) */
    uint64_t rows = tr->vit ? B : T, V = tr->vocab;
    tensor_t na, nb, wh;
    tensor_t out = norm_fwd(tr, T, &na, &nb);
    tensor_t hb = talloc(s, rows * d * 2); /* ViT: the cls rows only */
    tfree(s, &out);
    tensor_t logits = linear_fwd(tr, rows, d, V, pf(tr, PF_HEADB), &wh);
    tensor_t lf = talloc(s, rows * V * 4);
    tfree(s, &logits);
    tensor_t lsm = talloc(s, rows * V * 4);
    tfree(s, &lf);
    tensor_t loss = talloc(s, 4);
    idle(s, 200);

    /* backward */
    tensor_t dloss = talloc(s, 4);
    tensor_t dlsm = talloc(s, rows * V * 4);
    tfree(s, &dloss);
    tensor_t dlf = talloc(s, rows * V * 4);
    tfree(s, &dlsm);
    tfree(s, &lsm);
    tensor_t dlog = talloc(s, rows * V * 2);
    tfree(s, &dlf);
    tensor_t dhb = linear_bwd(tr, rows, d, V, pf(tr, PF_HEADW), pf(tr, PF_HEADB), &dlog, &hb, &wh);
    tensor_t dh = talloc(s, rows * d * 4);
    tfree(s, &dhb);
    if (tr->vit) { /* select backward: a zero [T, d] grad with the cls rows set */
        tensor_t full = talloc(s, T * d * 4);
        tfree(s, &dh);
        dh = full;
    }
    tensor_t dx = norm_bwd(tr, T, &dh, &na, &nb, &xs[tr->layers], pf(tr, PF_NW), pf(tr, PF_NB));
    for (uint64_t l = tr->layers; l-- > 0;)
        dx = block_bwd(tr, l, B, S, &tr->sv[l], &dx, &xs[l]);
    if (tr->vit) {
        tr->g[3] = talloc(s, tr->psize[3]); /* pos_embed: summed over the batch */
        tensor_t dco = talloc(s, B * 196 * d * 2);
        tr->g[2] = talloc(s, tr->psize[2]);
        tfree(s, &dx);
        tensor_t dw = talloc(s, d * 768 * 2), db = talloc(s, d * 2);
        tfree(s, &imb);
        tfree(s, &wpc);
        tfree(s, &dco);
        grad_from(tr, 0, &dw);
        grad_from(tr, 1, &db);
    } else {
        tr->g[0] = talloc(s, tr->psize[0]); /* dense embedding grad */
        tfree(s, &dx);
    }
    tfree(s, &loss);
    free(xs);

    optimizer_step(tr);
    idle(s, 1000 + rnd_below(s, 5000)); /* logging, the loader */
}

/* ViT-L/16 on 224 px images, bf16 autocast, AdamW; the batch size changes
 * every few steps (8..36 images at scale 1). */
static void gen_vit_train(synth_t *s)
{
    trainer_t tr;
    tensor_t data[2] = {NONE, NONE};
    if (trainer_init(&tr, s, 1) == 0) {
        idle(s, 3000000);
        uint64_t B = 0, left = 0;
        for (int step = 0; step < 36 && !s->nomem; step++) {
            if (left == 0) {
                B = scaled(s, 4 * rnd_between(s, 2, 8), 1, 1);
                left = rnd_between(s, 2, 5);
            }
            left--;
            train_step(&tr, B, 197, data);
        }
        tfree(s, &data[0]);
        tfree(s, &data[1]);
    }
    trainer_done(&tr);
}

/* A Llama-style GPT with batch x length changing every step: lengths from a
 * long-tailed distribution, as many sequences as fit a token budget. */
static void gen_varbatch_train(synth_t *s)
{
    trainer_t tr;
    tensor_t data[2] = {NONE, NONE};
    if (trainer_init(&tr, s, 0) == 0) {
        idle(s, 3000000);
        uint64_t max_tokens = scaled(s, 6144, 64, 1), max_batch = scaled(s, 16, 1, 1);
        for (int step = 0; step < 48 && !s->nomem; step++) {
            uint64_t S = rnd_skewed(s, 64, 4096, 2);
            if (S > max_tokens) S = max_tokens;
            uint64_t fit = max_tokens / S;
            uint64_t B = rnd_between(s, 1, fit < max_batch ? fit : max_batch);
            train_step(&tr, B, S, data);
        }
        tfree(s, &data[0]);
        tfree(s, &data[1]);
    }
    trainer_done(&tr);
}

/* ---- multistream: a pipeline over many streams -------------------------------- */

#define MS_STAGES 6            /* compute stages: streams 1..6, threads 0..5 */
#define MS_COMM_STREAM 7       /* collectives, weight refreshes: thread 6 */
#define MS_COPY_STREAM 8       /* device-to-host copies of results: thread 7 */
#define MS_QUEUES (MS_STAGES + 2)

enum { MW_NORM1, MW_QKV, MW_O, MW_NORM2, MW_GATE, MW_UP, MW_DOWN, MW_COUNT };

typedef struct microbatch {
    uint64_t T, b;     /* tokens, sequences */
    tensor_t h;        /* hidden state handed from stage to stage */
    tensor_t out;      /* the last stage's result, for the copy thread */
} microbatch_t;

typedef struct pipeline {
    synth_t *s;
    dims_t m;
    uint64_t layers_per_stage, n_weights[MS_STAGES];
    tensor_t *w[MS_STAGES];
    tensor_t *fresh;             /* a refreshed copy of one stage's weights */
    int fresh_stage;
    tensor_t gathered;           /* a large buffer from the comm thread ... */
    int gathered_stage;          /* ... that this stage consumes */
    queue_t q[MS_QUEUES];
} pipeline_t;

static void ms_use(pipeline_t *pl, int k)
{
    synth_t *s = pl->s;
    s->queue = &pl->q[k];
    s->thread = (unsigned)k;
    s->stream = k < MS_STAGES ? (unsigned)k + 1 : k == MS_STAGES ? MS_COMM_STREAM : MS_COPY_STREAM;
}

/* Stage k's weights, in the order of its modules. */
static void ms_weights(pipeline_t *pl, int k, tensor_t *w)
{
    synth_t *s = pl->s;
    const dims_t *m = &pl->m;
    uint64_t d = m->d, f = m->f;
    size_t n = 0;
    if (k == 0) w[n++] = talloc(s, m->vocab * d * 2);
    for (uint64_t l = 0; l < pl->layers_per_stage; l++) {
        const uint64_t sizes[MW_COUNT] = {d, 3 * d * d, d * d, d, f * d, f * d, d * f};
        for (int i = 0; i < MW_COUNT; i++) w[n++] = talloc(s, sizes[i] * 2);
    }
    if (k == MS_STAGES - 1) w[n++] = talloc(s, d * 2);
}

/* Stage k runs microbatch mb on its own stream: the first stage embeds the
 * tokens, every stage runs its layers (freeing the hidden state it was
 * handed, on its stream), the last one pools the result. */
static void ms_stage(pipeline_t *pl, int k, microbatch_t *mb)
{
    synth_t *s = pl->s;
    const dims_t *m = &pl->m;
    uint64_t T = mb->T;
    ms_use(pl, k);
    if (k == 0) {
        tensor_t ids = talloc(s, T * 8);
        mb->h = talloc(s, T * m->d * 2);
        tfree(s, &ids);
    }
    tensor_t ws = NONE;
    if (rnd_below(s, 100) < 2) /* a rare op that wants a big workspace */
        ws = talloc(s, scaled(s, rnd_between(s, 256, 1536), 1, 1) << 20);
    for (uint64_t l = 0; l < pl->layers_per_stage; l++) {
        tensor_t qr, kr, v;
        layer_qkv(s, m, T, &qr, &kr, &v);
        tensor_t attn = talloc(s, T * m->d * 2);
        tfree(s, &qr);
        tfree(s, &kr);
        tfree(s, &v);
        layer_out(s, m, T, &attn, &mb->h);
    }
    tfree(s, &ws);
    if (pl->gathered.ptr && pl->gathered_stage == k) tfree(s, &pl->gathered);
    if (pl->fresh && pl->fresh_stage == k) { /* adopt refreshed weights */
        for (uint64_t i = 0; i < pl->n_weights[k]; i++) {
            tfree(s, &pl->w[k][i]);
            pl->w[k][i] = pl->fresh[i];
        }
        free(pl->fresh);
        pl->fresh = NULL;
    }
    if (k == MS_STAGES - 1) {
        tensor_t nf = talloc(s, T * m->d * 2);
        tfree(s, &mb->h);
        mb->out = talloc(s, mb->b * m->d * 4); /* pooled fp32 embeddings */
        tfree(s, &nf);
    }
}

/* Write the queued ops, threads interleaved in random runs of 1..8 ops. */
static void ms_flush(pipeline_t *pl)
{
    synth_t *s = pl->s;
    for (;;) {
        int ready[MS_QUEUES], n = 0;
        for (int k = 0; k < MS_QUEUES; k++)
            if (pl->q[k].head < pl->q[k].n) ready[n++] = k;
        if (n == 0) break;
        queue_t *q = &pl->q[ready[rnd_below(s, (uint64_t)n)]];
        for (uint64_t run = 1 + rnd_below(s, 8); run > 0 && q->head < q->n; run--) {
            const event_t *e = &q->ev[q->head++];
            emit(s, e->action, e->ptr, e->size, e->stream, e->thread);
        }
    }
    for (int k = 0; k < MS_QUEUES; k++) pl->q[k].n = pl->q[k].head = 0;
}

/* Each tick, stage k works on microbatch t - k, all stages at once; results
 * are freed by the copy thread on its stream; now and then the comm thread
 * brings in a large buffer, or a refreshed copy of a stage's weights, that
 * the stage frees or adopts on its own stream. */
static void gen_multistream(synth_t *s)
{
    pipeline_t pl;
    memset(&pl, 0, sizeof pl);
    pl.s = s;
    dims_t *m = &pl.m;
    m->d = scaled(s, 3072, 128, 1);
    m->hd = 128;
    m->heads = m->d / m->hd;
    m->f = scaled(s, 8192, 128, 1);
    m->vocab = 32000;
    pl.layers_per_stage = scaled(s, 4, 1, 1);
    const uint64_t n_mb = 340, max_batch = scaled(s, 16, 1, 1), max_tokens = max_batch * 512;
    microbatch_t *mbs = calloc(n_mb, sizeof *mbs);
    int ok = mbs != NULL;
    for (int k = 0; k < MS_STAGES && ok; k++) {
        pl.n_weights[k] = pl.layers_per_stage * MW_COUNT + (k == 0) + (k == MS_STAGES - 1);
        ok = (pl.w[k] = calloc(pl.n_weights[k], sizeof *pl.w[k])) != NULL;
    }
    if (!ok) {
        s->nomem = 1;
        goto out;
    }
    for (uint64_t i = 0; i < n_mb; i++) {
        mbs[i].b = rnd_skewed(s, 1, max_batch, 2);
        uint64_t len = rnd_skewed(s, 32, 2048, 2);
        if (mbs[i].b * len > max_tokens) len = max_tokens / mbs[i].b;
        mbs[i].T = mbs[i].b * len;
    }
    for (int k = 0; k < MS_STAGES; k++) {
        ms_use(&pl, k);
        ms_weights(&pl, k, pl.w[k]);
    }
    ms_flush(&pl);
    idle(s, 1000000);

    uint64_t next_gather = 20 + rnd_below(s, 40), next_refresh = 60 + rnd_below(s, 60);
    for (uint64_t t = 0; t < n_mb + MS_STAGES + 1 && !s->nomem; t++) {
        if (t >= MS_STAGES && t - MS_STAGES < n_mb) {
            ms_use(&pl, MS_STAGES + 1); /* results of the last tick go to the host */
            tfree(s, &mbs[t - MS_STAGES].out);
        }
        if (t == next_gather && !pl.gathered.ptr && t < n_mb) {
            ms_use(&pl, MS_STAGES);
            pl.gathered = talloc(s, scaled(s, rnd_between(s, 512, 1024), 1, 1) << 20);
            pl.gathered_stage = (int)rnd_below(s, MS_STAGES);
            next_gather = t + 20 + rnd_below(s, 40);
        }
        if (t == next_refresh && !pl.fresh && t < n_mb) {
            int k = (int)rnd_below(s, MS_STAGES);
            pl.fresh = calloc(pl.n_weights[k], sizeof *pl.fresh);
            if (!pl.fresh) {
                s->nomem = 1;
                break;
            }
            ms_use(&pl, MS_STAGES);
            ms_weights(&pl, k, pl.fresh);
            pl.fresh_stage = k;
            next_refresh = t + 60 + rnd_below(s, 60);
        }
        ms_flush(&pl); /* what the comm and copy threads queued comes first */
        for (int k = 0; k < MS_STAGES; k++)
            if (t >= (uint64_t)k && t - (uint64_t)k < n_mb) ms_stage(&pl, k, &mbs[t - (uint64_t)k]);
        ms_flush(&pl);
        idle(s, 2000 + rnd_below(s, 3000)); /* the stages' kernels run */
    }
    /* Shut down: whatever a stage did not consume, then the weights. */
    for (int k = 0; k < MS_STAGES; k++) {
        ms_use(&pl, k);
        if (pl.gathered_stage == k) tfree(s, &pl.gathered);
        if (pl.fresh && pl.fresh_stage == k)
            for (uint64_t i = 0; i < pl.n_weights[k]; i++) tfree(s, &pl.fresh[i]);
        for (uint64_t i = 0; i < pl.n_weights[k]; i++) tfree(s, &pl.w[k][i]);
    }
    ms_flush(&pl);
out:
    s->queue = NULL;
    for (int k = 0; k < MS_STAGES; k++) free(pl.w[k]);
    for (int k = 0; k < MS_QUEUES; k++) free(pl.q[k].ev);
    free(pl.fresh);
    free(mbs);
}

/* ---- the kinds ------------------------------------------------------------- */

typedef struct kind {
    const char *name;
    void (*generate)(synth_t *s);
    const char *summary;
} kind_t;

static const kind_t kinds[] = {
    {"kv_inference", gen_kv_inference,
     "LLM server, KV cache grown one token at a time by copy (torch.cat)"},
    {"kv_paged", gen_kv_paged, "LLM server, KV cache grown in 16-token blocks (paged)"},
    {"vit_train", gen_vit_train, "ViT-L/16 training, AdamW, batch size changing every few steps"},
    {"multistream", gen_multistream,
     "6-stage pipeline on streams 1..8, buffers freed by the next stage"},
    {"varbatch_train", gen_varbatch_train,
     "GPT training, batch x sequence length changing every step"},
};
#define N_KINDS (sizeof kinds / sizeof kinds[0])

const char *const gm_cli_synth_kinds[] = {"kv_inference", "kv_paged", "vit_train",
                                          "multistream", "varbatch_train", NULL};

int gm_cli_synth_generate(const char *kind, unsigned long long seed, double scale, char **text,
                          size_t *len)
{
    *text = NULL;
    *len = 0;
    const kind_t *k = NULL;
    for (size_t i = 0; i < N_KINDS; i++)
        if (strcmp(kinds[i].name, kind) == 0) k = &kinds[i];
    if (!k) return -1;
    synth_t s;
    memset(&s, 0, sizeof s);
    s.scale = scale;
    /* Different kinds draw from different streams even with one seed. */
    s.rng = seed ^ 0x5851f42d4c957f2dull * (uint64_t)(k - kinds + 1);
    s.time_rng = ~seed;
    write_text(&s, GM__TRACE_HEADER_LINE);
    k->generate(&s);
    if (s.nomem) {
        free(s.buf);
        return -2;
    }
    *text = s.buf;
    *len = s.len;
    return 0;
}

#ifndef GM_SYNTH_GENERATOR_ONLY
/* ---- the command ------------------------------------------------------------- */

void gm_cli_synth_usage(FILE *out)
{
    fprintf(out, "usage: gpumem synth KIND [--seed N] [--scale X] -o FILE\n\n"
                 "Write a synthetic allocation trace (RMM logging CSV) modelling how a\n"
                 "framework allocates while running KIND; the same KIND, seed and scale\n"
                 "always give the same file.  FILE ending in .gz is gzip'd; - is stdout.\n\n"
                 "kinds:\n");
    for (size_t i = 0; i < N_KINDS; i++) fprintf(out, "  %-15s %s\n", kinds[i].name, kinds[i].summary);
    fprintf(out, "\n  --seed N        random seed (default 1)\n"
                 "  --scale X       multiply model and batch dimensions (default 1, from\n"
                 "                  0.01 to 4; at 1 each trace peaks at 2..16 GB live)\n"
                 "  -o, --output F  where to write\n\n"
                 "See docs/workloads.md for what each kind models.\n");
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Write len bytes to path (gzip when it ends in .gz, stdout for "-"). */
static int write_output(const char *path, const char *data, size_t len)
{
    if (strcmp(path, "-") == 0) {
        if (fwrite(data, 1, len, stdout) != len || fflush(stdout) != 0) {
            fprintf(stderr, "gpumem synth: cannot write to standard output\n");
            return 1;
        }
        return 0;
    }
    if (ends_with(path, ".gz")) {
#ifdef GM_HAVE_ZLIB
        gzFile gz = gzopen(path, "wb6");
        if (!gz) {
            fprintf(stderr, "gpumem synth: cannot open %s\n", path);
            return 1;
        }
        size_t done = 0;
        while (done < len) {
            unsigned n = len - done > (1u << 30) ? 1u << 30 : (unsigned)(len - done);
            if (gzwrite(gz, data + done, n) != (int)n) break;
            done += n;
        }
        if (gzclose(gz) != Z_OK || done != len) {
            fprintf(stderr, "gpumem synth: cannot write %s\n", path);
            return 1;
        }
        return 0;
#else
        fprintf(stderr, "gpumem synth: %s: gzip output needs a build with zlib; "
                        "write a plain .csv\n", path);
        return 2;
#endif
    }
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "gpumem synth: cannot open %s\n", path);
        return 1;
    }
    int bad = fwrite(data, 1, len, f) != len;
    if (fclose(f) != 0) bad = 1;
    if (bad) {
        fprintf(stderr, "gpumem synth: cannot write %s\n", path);
        return 1;
    }
    return 0;
}

int gm_cli_synth(int argc, char **argv)
{
    const char *kind = NULL, *output = NULL;
    unsigned long long seed = 1;
    double scale = 1.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int missing = 0;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            gm_cli_synth_usage(stdout);
            return 0;
        } else if (strcmp(a, "-o") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "gpumem synth: option -o needs a value\n");
                goto usage;
            }
            output = argv[++i];
        } else if ((v = gm_cli_option(argc, argv, &i, "output", &missing))) {
            output = v;
        } else if ((v = gm_cli_option(argc, argv, &i, "seed", &missing))) {
            char *end;
            seed = strtoull(v, &end, 0);
            if (v[0] < '0' || v[0] > '9' || *end != '\0') {
                fprintf(stderr, "gpumem synth: --seed: expected a number, got '%s'\n", v);
                goto usage;
            }
        } else if ((v = gm_cli_option(argc, argv, &i, "scale", &missing))) {
            char *end;
            scale = strtod(v, &end);
            if (*v == '\0' || *end != '\0' || !(scale >= 0.01 && scale <= 4.0)) {
                fprintf(stderr, "gpumem synth: --scale: expected 0.01..4, got '%s'\n", v);
                goto usage;
            }
        } else if (a[0] != '-' && !kind && !missing) {
            kind = a;
        } else {
            if (!missing) fprintf(stderr, "gpumem synth: unexpected argument '%s'\n", a);
            goto usage;
        }
    }
    if (!kind || !output) {
        fprintf(stderr, "gpumem synth: %s\n", !kind ? "no KIND given" : "no -o FILE given");
        goto usage;
    }
#ifndef GM_HAVE_ZLIB
    if (ends_with(output, ".gz")) return write_output(output, "", 0); /* says why not */
#endif

    char *text;
    size_t len;
    int rc = gm_cli_synth_generate(kind, seed, scale, &text, &len);
    if (rc == -1) {
        fprintf(stderr, "gpumem synth: unknown kind '%s'\n", kind);
        goto usage;
    }
    if (rc != 0) {
        fprintf(stderr, "gpumem synth: out of host memory\n");
        return 1;
    }
    /* Read it back as replay will: a trace we cannot parse is our bug. */
    gm__trace_t t;
    if (gm__trace_parse(text, len, kind, &t) != GM_OK || gm__trace_check(&t) != GM_OK) {
        fprintf(stderr, "gpumem synth: internal error: the %s trace does not read back: %s\n",
                kind, gm_last_error());
        gm__trace_free(&t);
        free(text);
        return 1;
    }
    char peak[32];
    fprintf(stderr, "gpumem synth: %s (seed %llu, scale %g): %zu ops, live peak %s, %u stream%s -> %s\n",
            kind, seed, scale, t.n_ops, gm__fmt_bytes(t.live_peak, peak, sizeof peak),
            t.n_streams, t.n_streams == 1 ? "" : "s", output);
    gm__trace_free(&t);
    rc = write_output(output, text, len);
    free(text);
    return rc;

usage:
    gm_cli_synth_usage(stderr);
    return 2;
}
#endif /* GM_SYNTH_GENERATOR_ONLY */
