/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pipeline.c — multistream: a 6-stage inference pipeline on streams 1..8,
 * each stage a thread whose ops are queued and interleaved, buffers freed by
 * the next stage, plus collectives, weight refreshes and host copies.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "synth/synth.h"

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
    if (k == 0) w[n++] = synth_talloc(s, m->vocab * d * 2);
    for (uint64_t l = 0; l < pl->layers_per_stage; l++) {
        const uint64_t sizes[MW_COUNT] = {d, 3 * d * d, d * d, d, f * d, f * d, d * f};
        for (int i = 0; i < MW_COUNT; i++) w[n++] = synth_talloc(s, sizes[i] * 2);
    }
    if (k == MS_STAGES - 1) w[n++] = synth_talloc(s, d * 2);
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
        tensor_t ids = synth_talloc(s, T * 8);
        mb->h = synth_talloc(s, T * m->d * 2);
        synth_tfree(s, &ids);
    }
    tensor_t ws = NONE;
    if (rnd_below(s, 100) < 2) /* a rare op that wants a big workspace */
        ws = synth_talloc(s, scaled(s, rnd_between(s, 256, 1536), 1, 1) << 20);
    for (uint64_t l = 0; l < pl->layers_per_stage; l++) {
        tensor_t qr, kr, v;
        synth_layer_qkv(s, m, T, &qr, &kr, &v);
        tensor_t attn = synth_talloc(s, T * m->d * 2);
        synth_tfree(s, &qr);
        synth_tfree(s, &kr);
        synth_tfree(s, &v);
        synth_layer_out(s, m, T, &attn, &mb->h);
    }
    synth_tfree(s, &ws);
    if (pl->gathered.ptr && pl->gathered_stage == k) synth_tfree(s, &pl->gathered);
    if (pl->fresh && pl->fresh_stage == k) { /* adopt refreshed weights */
        for (uint64_t i = 0; i < pl->n_weights[k]; i++) {
            synth_tfree(s, &pl->w[k][i]);
            pl->w[k][i] = pl->fresh[i];
        }
        free(pl->fresh);
        pl->fresh = NULL;
    }
    if (k == MS_STAGES - 1) {
        tensor_t nf = synth_talloc(s, T * m->d * 2);
        synth_tfree(s, &mb->h);
        mb->out = synth_talloc(s, mb->b * m->d * 4); /* pooled fp32 embeddings */
        synth_tfree(s, &nf);
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
            synth_emit(s, e->action, e->ptr, e->size, e->stream, e->thread);
        }
    }
    for (int k = 0; k < MS_QUEUES; k++) pl->q[k].n = pl->q[k].head = 0;
}

/* Each tick, stage k works on microbatch t - k, all stages at once; results
 * are freed by the copy thread on its stream; now and then the comm thread
 * brings in a large buffer, or a refreshed copy of a stage's weights, that
 * the stage frees or adopts on its own stream. */
void synth_multistream(synth_t *s)
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
            synth_tfree(s, &mbs[t - MS_STAGES].out);
        }
        if (t == next_gather && !pl.gathered.ptr && t < n_mb) {
            ms_use(&pl, MS_STAGES);
            pl.gathered = synth_talloc(s, scaled(s, rnd_between(s, 512, 1024), 1, 1) << 20);
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
        if (pl.gathered_stage == k) synth_tfree(s, &pl.gathered);
        if (pl.fresh && pl.fresh_stage == k)
            for (uint64_t i = 0; i < pl.n_weights[k]; i++) synth_tfree(s, &pl.fresh[i]);
        for (uint64_t i = 0; i < pl.n_weights[k]; i++) synth_tfree(s, &pl.w[k][i]);
    }
    ms_flush(&pl);
out:
    s->queue = NULL;
    for (int k = 0; k < MS_STAGES; k++) free(pl.w[k]);
    for (int k = 0; k < MS_QUEUES; k++) free(pl.q[k].ev);
    free(pl.fresh);
    free(mbs);
}
