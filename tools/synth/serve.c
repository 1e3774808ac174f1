/* SPDX-License-Identifier: Apache-2.0 */
/*
 * serve.c — kv_inference and kv_paged: an LLM server admitting requests of
 * random size, prefilling and decoding them in a shared batch, its KV cache
 * grown by copy (naive) or in 16-token blocks (paged).  Its decoder layer at
 * inference is shared with the pipeline (pipeline.c).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "synth/synth.h"

/* ---- a decoder layer at inference (shared by the servers and the pipeline) - */


/* The layer's front half for T tokens: norm, q/k/v projections, rotary
 * embedding.  h (the layer input) stays alive for the residual. */
void synth_layer_qkv(synth_t *s, const dims_t *m, uint64_t T, tensor_t *qr, tensor_t *kr,
                      tensor_t *v)
{
    uint64_t act = T * m->d * 2;
    tensor_t n1 = synth_talloc(s, act);
    tensor_t q = synth_talloc(s, act), k = synth_talloc(s, act);
    *v = synth_talloc(s, act);
    synth_tfree(s, &n1);
    *qr = synth_talloc(s, act);
    synth_tfree(s, &q);
    *kr = synth_talloc(s, act);
    synth_tfree(s, &k);
}

/* The back half: output projection, residual, norm, SwiGLU MLP, residual.
 * Frees attn and the layer input *h; *h becomes the layer output. */
void synth_layer_out(synth_t *s, const dims_t *m, uint64_t T, tensor_t *attn, tensor_t *h)
{
    uint64_t act = T * m->d * 2, wide = T * m->f * 2;
    tensor_t o = synth_talloc(s, act);
    synth_tfree(s, attn);
    tensor_t h1 = synth_talloc(s, act);
    synth_tfree(s, &o);
    synth_tfree(s, h);
    tensor_t n2 = synth_talloc(s, act);
    tensor_t gate = synth_talloc(s, wide), up = synth_talloc(s, wide);
    synth_tfree(s, &n2);
    tensor_t a = synth_talloc(s, wide);
    synth_tfree(s, &gate);
    tensor_t prod = synth_talloc(s, wide);
    synth_tfree(s, &a);
    synth_tfree(s, &up);
    tensor_t down = synth_talloc(s, act);
    synth_tfree(s, &prod);
    *h = synth_talloc(s, act);
    synth_tfree(s, &down);
    synth_tfree(s, &h1);
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
            if (!row[i].ptr) row[i] = synth_talloc(sv->s, block_bytes(&sv->m));
    }
}

/* Sample the next token of every sequence from fp32 logits [rows, vocab]. */
static void sample(server_t *sv, request_t *r)
{
    synth_t *s = sv->s;
    tensor_t probs = synth_talloc(s, r->b * sv->m.vocab * 4);
    r->next = synth_talloc(s, r->b * 8);
    synth_tfree(s, &probs);
}

/* The prompt's forward pass: a naive server computes attention with the full
 * [b, heads, p, p] score matrix; a paged one with a fused kernel. */
static void prefill(server_t *sv, request_t *r)
{
    synth_t *s = sv->s;
    const dims_t *m = &sv->m;
    uint64_t b = r->b, p = r->prompt, T = b * p, act = T * m->d * 2;
    tensor_t ids = synth_talloc(s, T * 8), pos = synth_talloc(s, T * 8);
    tensor_t mask = sv->paged ? NONE : synth_talloc(s, b * p * p * 2);
    tensor_t cos = synth_talloc(s, T * m->hd * 2), sin = synth_talloc(s, T * m->hd * 2);
    tensor_t h = synth_talloc(s, act);
    synth_tfree(s, &ids);
    for (unsigned l = 0; l < m->layers; l++) {
        tensor_t qr, kr, v, attn;
        synth_layer_qkv(s, m, T, &qr, &kr, &v);
        if (sv->paged) {
            paged_grow(sv, r, l, p);
            attn = synth_talloc(s, act);
            synth_tfree(s, &qr);
            synth_tfree(s, &kr);
            synth_tfree(s, &v);
        } else {
            uint64_t scores = b * m->heads * p * p;
            r->k[l] = synth_talloc(s, act); /* [b, heads, p, hd], contiguous */
            synth_tfree(s, &kr);
            r->v[l] = synth_talloc(s, act);
            synth_tfree(s, &v);
            tensor_t sc = synth_talloc(s, scores * 2);
            tensor_t masked = synth_talloc(s, scores * 2);
            synth_tfree(s, &sc);
            tensor_t pf = synth_talloc(s, scores * 4); /* softmax in fp32 */
            synth_tfree(s, &masked);
            tensor_t pb = synth_talloc(s, scores * 2);
            synth_tfree(s, &pf);
            tensor_t ao = synth_talloc(s, act);
            synth_tfree(s, &pb);
            synth_tfree(s, &qr);
            attn = synth_talloc(s, act); /* transpose back, contiguous */
            synth_tfree(s, &ao);
        }
        synth_layer_out(s, m, T, &attn, &h);
        idle(s, 20 + T / 64);
    }
    synth_tfree(s, &cos);
    synth_tfree(s, &sin);
    synth_tfree(s, &mask);
    synth_tfree(s, &pos);
    tensor_t nf = synth_talloc(s, act);
    synth_tfree(s, &h);
    tensor_t last = synth_talloc(s, b * m->d * 2); /* the last position of each sequence */
    synth_tfree(s, &nf);
    tensor_t logits = synth_talloc(s, b * m->vocab * 2);
    synth_tfree(s, &last);
    tensor_t lf = synth_talloc(s, b * m->vocab * 4);
    synth_tfree(s, &logits);
    sample(sv, r);
    synth_tfree(s, &lf);
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
    tensor_t ids = synth_talloc(s, B * 8);
    for (unsigned i = 0; i < sv->n_active; i++) synth_tfree(s, &sv->active[i]->next);
    tensor_t pos = synth_talloc(s, B * 8), table = NONE, lens = NONE, slots = NONE;
    if (sv->paged) {
        table = synth_talloc(s, B * max_blocks * 4);
        lens = synth_talloc(s, B * 4);
        slots = synth_talloc(s, B * 8);
    }
    tensor_t cos = synth_talloc(s, B * m->hd * 2), sin = synth_talloc(s, B * m->hd * 2);
    tensor_t h = synth_talloc(s, act);
    synth_tfree(s, &ids);
    tensor_t outs[SRV_MAX_ACTIVE];
    for (unsigned l = 0; l < m->layers; l++) {
        tensor_t qr, kr, v, attn;
        synth_layer_qkv(s, m, B, &qr, &kr, &v);
        if (sv->paged) {
            for (unsigned i = 0; i < sv->n_active; i++)
                paged_grow(sv, sv->active[i], l, sv->active[i]->len + 1);
            attn = synth_talloc(s, act);
        } else {
            for (unsigned i = 0; i < sv->n_active; i++) {
                request_t *r = sv->active[i];
                uint64_t n = r->len + 1, kv = r->b * n * m->d * 2, sc = r->b * m->heads * n;
                tensor_t k = synth_talloc(s, kv);
                synth_tfree(s, &r->k[l]);
                r->k[l] = k;
                tensor_t vv = synth_talloc(s, kv);
                synth_tfree(s, &r->v[l]);
                r->v[l] = vv;
                tensor_t scores = synth_talloc(s, sc * 2);
                tensor_t pf = synth_talloc(s, sc * 4);
                synth_tfree(s, &scores);
                tensor_t pb = synth_talloc(s, sc * 2);
                synth_tfree(s, &pf);
                outs[i] = synth_talloc(s, r->b * m->d * 2);
                synth_tfree(s, &pb);
            }
            attn = synth_talloc(s, act); /* torch.cat of the requests' outputs */
            for (unsigned i = 0; i < sv->n_active; i++) synth_tfree(s, &outs[i]);
        }
        synth_tfree(s, &qr);
        synth_tfree(s, &kr);
        synth_tfree(s, &v);
        synth_layer_out(s, m, B, &attn, &h);
        idle(s, 15);
    }
    synth_tfree(s, &cos);
    synth_tfree(s, &sin);
    synth_tfree(s, &pos);
    synth_tfree(s, &table);
    synth_tfree(s, &lens);
    synth_tfree(s, &slots);
    tensor_t nf = synth_talloc(s, act);
    synth_tfree(s, &h);
    tensor_t logits = synth_talloc(s, B * m->vocab * 2);
    synth_tfree(s, &nf);
    tensor_t lf = synth_talloc(s, B * m->vocab * 4);
    synth_tfree(s, &logits);
    for (unsigned i = 0; i < sv->n_active; i++) sample(sv, sv->active[i]);
    synth_tfree(s, &lf);
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
        for (uint64_t i = 0; i < sv->m.layers * r->b * r->max_blocks; i++)
            synth_tfree(s, &r->blocks[i]);
    } else {
        for (unsigned l = 0; l < sv->m.layers; l++) {
            synth_tfree(s, &r->k[l]);
            synth_tfree(s, &r->v[l]);
        }
    }
    synth_tfree(s, &r->next);
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
    sv.w[nw++] = synth_talloc(s, m->vocab * d * 2);
    for (unsigned l = 0; l < m->layers; l++) {
        const uint64_t sizes[LW_COUNT] = {d, d * d, d * d, d * d, d * d, d, f * d, f * d, d * f};
        for (int i = 0; i < LW_COUNT; i++) sv.w[nw++] = synth_talloc(s, sizes[i] * 2);
    }
    sv.w[nw++] = synth_talloc(s, d * 2);
    sv.w[nw++] = synth_talloc(s, m->vocab * d * 2);
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
    for (size_t i = 0; i < nw; i++) synth_tfree(s, &sv.w[i]);
    free(sv.w);
}

void synth_kv_inference(synth_t *s) { run_server(s, 0); }
void synth_kv_paged(synth_t *s) { run_server(s, 1); }
