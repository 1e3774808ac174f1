/* SPDX-License-Identifier: Apache-2.0 */
/*
 * writer.c — the synthetic generator's trace writer: ops become trace rows
 * (trace.h's row writer, in a growing buffer) or wait in a thread's queue
 * (multistream interleaves threads), and tensors are blocks with pointer ids
 * that are never reused, so every free names a live pointer.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "synth/synth.h"

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

void synth_write_text(synth_t *s, const char *text)
{
    size_t n = strlen(text);
    if (reserve(s, n + 1)) return;
    memcpy(s->buf + s->len, text, n + 1);
    s->len += n;
}

/* Write one op: the clock moves on by the time the framework took to get
 * here (more for larger outputs: the kernel that fills them).  The row is
 * trace.h's (a clock to the microsecond, decimal stream). */
void synth_emit(synth_t *s, int action, uint64_t ptr, uint64_t size, unsigned stream,
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
        synth_emit(s, action, ptr, size, s->stream, s->thread);
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


/* Allocate a tensor of `bytes` on the current stream; 0 bytes: none. */
tensor_t synth_talloc(synth_t *s, uint64_t bytes)
{
    if (bytes == 0) return NONE;
    tensor_t t = {PTR_BASE + s->next_id++ * PTR_STEP,
                  (bytes + ROUND_BYTES - 1) / ROUND_BYTES * ROUND_BYTES};
    put_op(s, OP_ALLOC, t.ptr, t.size);
    return t;
}

/* Free a tensor on the current stream (none: nothing happens). */
void synth_tfree(synth_t *s, tensor_t *t)
{
    if (!t->ptr) return;
    put_op(s, OP_FREE, t->ptr, t->size);
    *t = NONE;
}
