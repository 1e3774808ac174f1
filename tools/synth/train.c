/* SPDX-License-Identifier: Apache-2.0 */
/*
 * train.c — vit_train and varbatch_train: a training loop under autocast
 * with AdamW (ViT-L/16 with its batch size changing every few steps; a GPT
 * whose batch x sequence length changes every step).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "synth/synth.h"

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
    tr->g[i] = synth_talloc(tr->s, tr->psize[i]);
    synth_tfree(tr->s, low);
}

/* Autocast linear: the fp32 weight cast to bf16 (the copy is saved for
 * backward), the bias cast too (not saved), y = x W^T + b in bf16. */
static tensor_t linear_fwd(trainer_t *tr, uint64_t T, uint64_t in, uint64_t out, size_t bi,
                           tensor_t *wc)
{
    synth_t *s = tr->s;
    *wc = synth_talloc(s, out * in * 2);
    tensor_t bc = tr->psize[bi] ? synth_talloc(s, out * 2) : NONE;
    tensor_t y = synth_talloc(s, T * out * 2);
    synth_tfree(s, &bc);
    return y;
}

/* Its backward: grad of the input (bf16), of the weight and bias; then the
 * saved input (x may be NULL when another op still holds it), the weight
 * copy and the incoming grad are released. */
static tensor_t linear_bwd(trainer_t *tr, uint64_t T, uint64_t in, uint64_t out, size_t wi,
                           size_t bi, tensor_t *dy, tensor_t *x, tensor_t *wc)
{
    synth_t *s = tr->s;
    tensor_t dx = synth_talloc(s, T * in * 2);
    tensor_t dw = synth_talloc(s, out * in * 2);
    tensor_t db = tr->psize[bi] ? synth_talloc(s, out * 2) : NONE;
    if (x) synth_tfree(s, x);
    synth_tfree(s, wc);
    synth_tfree(s, dy);
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
        tensor_t out = synth_talloc(s, full);
        *a = synth_talloc(s, T * 4);
        *b = synth_talloc(s, T * 4);
        return out;
    }
    tensor_t sq = synth_talloc(s, full);
    tensor_t var = synth_talloc(s, T * 4);
    synth_tfree(s, &sq);
    *a = synth_talloc(s, T * 4); /* rsqrt(var + eps) */
    synth_tfree(s, &var);
    *b = synth_talloc(s, full); /* x * rstd */
    return synth_talloc(s, full); /* weight * that */
}

/* Its backward: frees dy, the saved state and the norm's input x; sets the
 * weight (and bias) grads; returns the grad of x (fp32). */
static tensor_t norm_bwd(trainer_t *tr, uint64_t T, tensor_t *dy, tensor_t *a, tensor_t *b,
                         tensor_t *x, size_t wi, size_t bi)
{
    synth_t *s = tr->s;
    uint64_t full = T * tr->d * 4;
    if (tr->vit) {
        tensor_t dx = synth_talloc(s, full);
        tr->g[wi] = synth_talloc(s, tr->psize[wi]);
        tr->g[bi] = synth_talloc(s, tr->psize[bi]);
        synth_tfree(s, dy);
        synth_tfree(s, a);
        synth_tfree(s, b);
        synth_tfree(s, x);
        return dx;
    }
    tensor_t dn = synth_talloc(s, full); /* dy * weight */
    tensor_t dwt = synth_talloc(s, full); /* dy * normalized, summed into the weight grad */
    tr->g[wi] = synth_talloc(s, tr->psize[wi]);
    synth_tfree(s, &dwt);
    synth_tfree(s, dy);
    synth_tfree(s, b);
    tensor_t dxa = synth_talloc(s, full); /* dn * rstd */
    tensor_t drt = synth_talloc(s, full); /* dn * x, summed */
    tensor_t dr = synth_talloc(s, T * 4);
    synth_tfree(s, &drt);
    synth_tfree(s, &dn);
    tensor_t dvar = synth_talloc(s, T * 4);
    synth_tfree(s, &dr);
    synth_tfree(s, a);
    tensor_t dsq = synth_talloc(s, full);
    synth_tfree(s, &dvar);
    tensor_t dxb = synth_talloc(s, full);
    synth_tfree(s, &dsq);
    synth_tfree(s, x);
    tensor_t dx = synth_talloc(s, full);
    synth_tfree(s, &dxa);
    synth_tfree(s, &dxb);
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
    sv->ln1b = synth_talloc(s, act);
    synth_tfree(s, &out);
    sv->qkv = linear_fwd(tr, T, d, 3 * d, pb(l, PB_QKVB), &sv->wqkv);
    if (tr->vit) {
        uint64_t sc = B * tr->heads * S * S;
        sv->qs = synth_talloc(s, act); /* q * scale */
        tensor_t scores = synth_talloc(s, sc * 2);
        tensor_t sf = synth_talloc(s, sc * 4); /* softmax runs in fp32 */
        synth_tfree(s, &scores);
        sv->probs = synth_talloc(s, sc * 4);
        synth_tfree(s, &sf);
        sv->probs_b = synth_talloc(s, sc * 2);
        tensor_t ao = synth_talloc(s, act);
        sv->attn = synth_talloc(s, act); /* transpose + reshape: a contiguous copy */
        synth_tfree(s, &ao);
    } else {
        tensor_t rot = synth_talloc(s, act); /* rotate_half(q) */
        sv->qr = synth_talloc(s, act);
        synth_tfree(s, &rot);
        rot = synth_talloc(s, act);
        sv->kr = synth_talloc(s, act);
        synth_tfree(s, &rot);
        sv->attn = synth_talloc(s, act);
        sv->lse = synth_talloc(s, B * tr->heads * S * 4);
    }
    tensor_t proj = linear_fwd(tr, T, d, d, pb(l, PB_OB), &sv->wo);
    sv->x1 = synth_talloc(s, T * d * 4); /* x + proj, promoted to fp32 */
    synth_tfree(s, &proj);
    out = norm_fwd(tr, T, &sv->n2a, &sv->n2b);
    sv->ln2b = synth_talloc(s, act);
    synth_tfree(s, &out);
    tensor_t h2;
    if (tr->vit) {
        sv->h1 = linear_fwd(tr, T, d, f, pb(l, PB_FC1B), &sv->w1);
        sv->g = synth_talloc(s, T * f * 2); /* gelu */
        h2 = linear_fwd(tr, T, f, d, pb(l, PB_FC2B), &sv->w2);
    } else {
        sv->h1 = linear_fwd(tr, T, d, f, pb(l, PB_FC1B), &sv->w1); /* gate */
        sv->up = linear_fwd(tr, T, d, f, pb(l, PB_FC1B), &sv->wup);
        sv->sg = synth_talloc(s, T * f * 2); /* silu(gate) */
        sv->prod = synth_talloc(s, T * f * 2);
        h2 = linear_fwd(tr, T, f, d, pb(l, PB_FC2B), &sv->w2);
    }
    tensor_t x2 = synth_talloc(s, T * d * 4);
    synth_tfree(s, &h2);
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
    tensor_t dh2 = synth_talloc(s, act); /* the residual's grad cast to bf16 */
    tensor_t dln2b;
    if (tr->vit) {
        tensor_t dg = linear_bwd(tr, T, f, d, pb(l, PB_FC2W), pb(l, PB_FC2B), &dh2,
                                 &sv->g, &sv->w2);
        tensor_t dh1 = synth_talloc(s, T * f * 2);
        synth_tfree(s, &dg);
        synth_tfree(s, &sv->h1);
        dln2b = linear_bwd(tr, T, d, f, pb(l, PB_FC1W), pb(l, PB_FC1B), &dh1, &sv->ln2b,
                           &sv->w1);
    } else {
        tensor_t dprod = linear_bwd(tr, T, f, d, pb(l, PB_FC2W), pb(l, PB_FC2B), &dh2,
                                    &sv->prod, &sv->w2);
        tensor_t dsg = synth_talloc(s, T * f * 2), dup = synth_talloc(s, T * f * 2);
        synth_tfree(s, &dprod);
        synth_tfree(s, &sv->sg);
        synth_tfree(s, &sv->up);
        tensor_t dgate = synth_talloc(s, T * f * 2);
        synth_tfree(s, &dsg);
        synth_tfree(s, &sv->h1);
        tensor_t da = linear_bwd(tr, T, d, f, pb(l, PB_UPW), pb(l, PB_FC1B), &dup, NULL,
                                 &sv->wup);
        tensor_t db = linear_bwd(tr, T, d, f, pb(l, PB_FC1W), pb(l, PB_FC1B), &dgate,
                                 &sv->ln2b, &sv->w1);
        dln2b = synth_talloc(s, act); /* the two grads of the shared input, summed */
        synth_tfree(s, &da);
        synth_tfree(s, &db);
    }
    tensor_t dln2 = synth_talloc(s, T * d * 4);
    synth_tfree(s, &dln2b);
    tensor_t dx1p = norm_bwd(tr, T, &dln2, &sv->n2a, &sv->n2b, &sv->x1, pb(l, PB_N2W),
                             pb(l, PB_N2B));
    tensor_t dx1 = synth_talloc(s, T * d * 4); /* + the residual path */
    synth_tfree(s, &dx1p);
    synth_tfree(s, dx2);
    tensor_t dproj = synth_talloc(s, act);
    /* ViT: the attention output is the projection's alone; GPT: flash
     * attention saved it too, so its backward releases it. */
    tensor_t dattn = linear_bwd(tr, T, d, d, pb(l, PB_OW), pb(l, PB_OB), &dproj,
                                tr->vit ? &sv->attn : NULL, &sv->wo);
    tensor_t dq, dk, dv;
    if (tr->vit) {
        uint64_t sc = B * tr->heads * S * S;
        tensor_t dpb = synth_talloc(s, sc * 2);
        dv = synth_talloc(s, act);
        synth_tfree(s, &dattn);
        synth_tfree(s, &sv->probs_b);
        tensor_t dpf = synth_talloc(s, sc * 4);
        synth_tfree(s, &dpb);
        tensor_t dsf = synth_talloc(s, sc * 4);
        synth_tfree(s, &dpf);
        synth_tfree(s, &sv->probs);
        tensor_t dsb = synth_talloc(s, sc * 2);
        synth_tfree(s, &dsf);
        tensor_t dqs = synth_talloc(s, act);
        dk = synth_talloc(s, act);
        synth_tfree(s, &dsb);
        synth_tfree(s, &sv->qs);
        dq = synth_talloc(s, act);
        synth_tfree(s, &dqs);
    } else {
        tensor_t acc = synth_talloc(s, T * d * 4), sd = synth_talloc(s, B * tr->heads * S * 4);
        tensor_t dq0 = synth_talloc(s, act), dk0 = synth_talloc(s, act);
        dv = synth_talloc(s, act);
        synth_tfree(s, &acc);
        synth_tfree(s, &sd);
        synth_tfree(s, &dattn);
        synth_tfree(s, &sv->attn);
        synth_tfree(s, &sv->lse);
        synth_tfree(s, &sv->qr);
        synth_tfree(s, &sv->kr);
        tensor_t rot = synth_talloc(s, act);
        dq = synth_talloc(s, act);
        synth_tfree(s, &rot);
        synth_tfree(s, &dq0);
        rot = synth_talloc(s, act);
        dk = synth_talloc(s, act);
        synth_tfree(s, &rot);
        synth_tfree(s, &dk0);
    }
    tensor_t dqkv = synth_talloc(s, 3 * act);
    synth_tfree(s, &dq);
    synth_tfree(s, &dk);
    synth_tfree(s, &dv);
    synth_tfree(s, &sv->qkv);
    tensor_t dln1b = linear_bwd(tr, T, d, 3 * d, pb(l, PB_QKVW), pb(l, PB_QKVB), &dqkv,
                                &sv->ln1b, &sv->wqkv);
    tensor_t dln1 = synth_talloc(s, T * d * 4);
    synth_tfree(s, &dln1b);
    tensor_t dxp = norm_bwd(tr, T, &dln1, &sv->n1a, &sv->n1b, x, pb(l, PB_N1W),
                            pb(l, PB_N1B));
    tensor_t dx = synth_talloc(s, T * d * 4);
    synth_tfree(s, &dxp);
    synth_tfree(s, &dx1);
    idle(s, T / 16);
    return dx;
}

/* clip_grad_norm_ (foreach norms, stacked, one total) and a foreach AdamW
 * step: state made at the first step, one sqrt temporary per parameter. */
static void optimizer_step(trainer_t *tr)
{
    synth_t *s = tr->s;
    for (size_t i = 0; i < tr->np; i++) tr->tmp[i] = tr->g[i].ptr ? synth_talloc(s, 4) : NONE;
    tensor_t stacked = synth_talloc(s, tr->np * 4);
    for (size_t i = 0; i < tr->np; i++) synth_tfree(s, &tr->tmp[i]);
    tensor_t total = synth_talloc(s, 4);
    synth_tfree(s, &stacked);
    tensor_t coef = synth_talloc(s, 4), clamped = synth_talloc(s, 4);
    synth_tfree(s, &coef);
    synth_tfree(s, &clamped);
    synth_tfree(s, &total);
    for (size_t i = 0; i < tr->np; i++) {
        if (!tr->psize[i] || tr->m[i].ptr) continue;
        tr->m[i] = synth_talloc(s, tr->psize[i]);
        tr->v[i] = synth_talloc(s, tr->psize[i]);
    }
    for (size_t i = 0; i < tr->np; i++) tr->tmp[i] = synth_talloc(s, tr->psize[i]);
    idle(s, 500);
    for (size_t i = 0; i < tr->np; i++) synth_tfree(s, &tr->tmp[i]);
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
    for (size_t i = 0; i < tr->np; i++) tr->p[i] = synth_talloc(s, ps[i]); /* model.to("cuda") */
    return 0;
}

static void trainer_done(trainer_t *tr)
{
    synth_t *s = tr->s;
    if (tr->p && tr->g && tr->m && tr->v) {
        for (size_t i = 0; i < tr->np; i++) synth_tfree(s, &tr->g[i]);
        for (size_t i = 0; i < tr->np; i++) {
            synth_tfree(s, &tr->m[i]);
            synth_tfree(s, &tr->v[i]);
        }
        for (size_t i = 0; i < tr->np; i++) synth_tfree(s, &tr->p[i]);
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
    for (size_t i = 0; i < tr->np; i++) synth_tfree(s, &tr->g[i]); /* zero_grad(set_to_none) */
    tensor_t in = synth_talloc(s, tr->vit ? B * 3 * 224 * 224 * 4 : T * 8);
    tensor_t labels = synth_talloc(s, tr->vit ? B * 8 : T * 8);
    synth_tfree(s, &data[0]);
    synth_tfree(s, &data[1]);
    data[0] = in;
    data[1] = labels;

    /* embedding */
    tensor_t x, wpc = NONE, imb = NONE;
    if (tr->vit) {
        imb = synth_talloc(s, B * 3 * 224 * 224 * 2); /* autocast: conv input in bf16 */
        tensor_t co = linear_fwd(tr, B * 196, 768, d, 1, &wpc);
        tensor_t x0 = synth_talloc(s, T * d * 4); /* cat(cls, patches), promoted to fp32 */
        synth_tfree(s, &co);
        x = synth_talloc(s, T * d * 4); /* + pos_embed */
        synth_tfree(s, &x0);
    } else {
        x = synth_talloc(s, T * d * 4);
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
    tensor_t hb = synth_talloc(s, rows * d * 2); /* ViT: the cls rows only */
    synth_tfree(s, &out);
    tensor_t logits = linear_fwd(tr, rows, d, V, pf(tr, PF_HEADB), &wh);
    tensor_t lf = synth_talloc(s, rows * V * 4);
    synth_tfree(s, &logits);
    tensor_t lsm = synth_talloc(s, rows * V * 4);
    synth_tfree(s, &lf);
    tensor_t loss = synth_talloc(s, 4);
    idle(s, 200);

    /* backward */
    tensor_t dloss = synth_talloc(s, 4);
    tensor_t dlsm = synth_talloc(s, rows * V * 4);
    synth_tfree(s, &dloss);
    tensor_t dlf = synth_talloc(s, rows * V * 4);
    synth_tfree(s, &dlsm);
    synth_tfree(s, &lsm);
    tensor_t dlog = synth_talloc(s, rows * V * 2);
    synth_tfree(s, &dlf);
    tensor_t dhb = linear_bwd(tr, rows, d, V, pf(tr, PF_HEADW), pf(tr, PF_HEADB), &dlog, &hb, &wh);
    tensor_t dh = synth_talloc(s, rows * d * 4);
    synth_tfree(s, &dhb);
    if (tr->vit) { /* select backward: a zero [T, d] grad with the cls rows set */
        tensor_t full = synth_talloc(s, T * d * 4);
        synth_tfree(s, &dh);
        dh = full;
    }
    tensor_t dx = norm_bwd(tr, T, &dh, &na, &nb, &xs[tr->layers], pf(tr, PF_NW), pf(tr, PF_NB));
    for (uint64_t l = tr->layers; l-- > 0;)
        dx = block_bwd(tr, l, B, S, &tr->sv[l], &dx, &xs[l]);
    if (tr->vit) {
        tr->g[3] = synth_talloc(s, tr->psize[3]); /* pos_embed: summed over the batch */
        tensor_t dco = synth_talloc(s, B * 196 * d * 2);
        tr->g[2] = synth_talloc(s, tr->psize[2]);
        synth_tfree(s, &dx);
        tensor_t dw = synth_talloc(s, d * 768 * 2), db = synth_talloc(s, d * 2);
        synth_tfree(s, &imb);
        synth_tfree(s, &wpc);
        synth_tfree(s, &dco);
        grad_from(tr, 0, &dw);
        grad_from(tr, 1, &db);
    } else {
        tr->g[0] = synth_talloc(s, tr->psize[0]); /* dense embedding grad */
        synth_tfree(s, &dx);
    }
    synth_tfree(s, &loss);
    free(xs);

    optimizer_step(tr);
    idle(s, 1000 + rnd_below(s, 5000)); /* logging, the loader */
}

/* ViT-L/16 on 224 px images, bf16 autocast, AdamW; the batch size changes
 * every few steps (8..36 images at scale 1). */
void synth_vit_train(synth_t *s)
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
        synth_tfree(s, &data[0]);
        synth_tfree(s, &data[1]);
    }
    trainer_done(&tr);
}

/* A Llama-style GPT with batch x length changing every step: lengths from a
 * long-tailed distribution, as many sequences as fit a token budget. */
void synth_varbatch_train(synth_t *s)
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
        synth_tfree(s, &data[0]);
        synth_tfree(s, &data[1]);
    }
    trainer_done(&tr);
}
