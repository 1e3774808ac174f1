/* SPDX-License-Identifier: Apache-2.0 */
/*
 * trace_read.h — the trace reader of the tools (the CLI, the benchmarks, the
 * tests and the fuzz target; not part of libgpumem): RMM logging CSV
 * (src/observe/trace.h defines the format) parsed into a compact array of
 * operations that replay tools walk without touching text again, either all
 * at once (gm__trace_load/parse) or a bounded chunk at a time (the streaming
 * reader, for traces of any length).
 *
 * Pointers become dense slot ids: an allocate takes the most recently freed
 * slot (or a new one when none is free) and a free gives its slot back, so
 * n_slots is the largest number of allocations live at once and a replayer
 * needs only an array of n_slots pointers.
 *
 * Trace bugs are kept, counted (with the line of the first of each kind) and
 * never fatal here (`gpumem replay --strict` refuses them):
 *   - a free of a pointer that is not live (never allocated, or freed twice)
 *     stays an op with slot GM__TRACE_NO_SLOT (unknown_frees);
 *   - an allocate of a pointer that is already live implicitly frees the
 *     earlier allocation: a synthetic free op (same slot, earlier size and
 *     stream, this row's thread and time) is inserted before the allocate, so
 *     every consumer sees consistent ops (dup_allocs; n_ops counts it).
 */
#ifndef GM_TOOLS_TRACE_READ_H
#define GM_TOOLS_TRACE_READ_H

#include <stddef.h>
#include <stdint.h>

#include "observe/trace.h"

#define GM__TRACE_NO_SLOT UINT32_MAX
/* Distinct streams one trace may name.  Each stream a pool sees costs it a
 * free index of its own (about 21 KiB), so a trace naming 65 535 streams made
 * a replay hold 1.3 GB; 1 024 (about 21 MiB) is far above what programs use
 * (recorded PyTorch traces name 1-8) and a trace naming more is refused with
 * the line of the first stream over the limit.  Dense ids are 16 bits. */
#define GM__TRACE_MAX_STREAMS 1024u

/* One event.  For a free of a live pointer, size is the size that pointer was
 * allocated with (the row's own size is only compared: free_size_mismatches);
 * for an unknown free or an allocate failure it is the row's size. */
typedef struct gm__trace_op {
    uint64_t size;
    uint64_t time_ns;  /* from the Time column */
    uint32_t slot;     /* dense pointer id, < n_slots, or GM__TRACE_NO_SLOT */
    uint32_t thread;   /* the Thread column as written */
    uint16_t stream;   /* dense stream id: streams[stream] is the value */
    uint8_t action;    /* GM__TRACE_* */
} gm__trace_op_t;

/* Accounting, checked by gm__trace_check:
 *   sum(alloc sizes) - sum(sizes of frees with a slot) == live_final
 *   live_peak == max over the ops of that running sum
 *   n_ops == rows + dup_allocs
 *   n_allocs + n_frees + alloc_failures == n_ops  (frees include unknown and
 *   synthetic ones)                                                        */
typedef struct gm__trace {
    char *name;              /* path or name given (owned) */
    gm__trace_op_t *ops;
    size_t n_ops;
    uint32_t n_slots;        /* max allocations live at once */
    uint32_t n_streams;      /* distinct Stream values, <= GM__TRACE_MAX_STREAMS */
    uint64_t *streams;       /* dense id -> Stream value, in order of first use */
    uint64_t live_peak;      /* max over time of the sum of live sizes */
    uint64_t live_final;     /* live bytes after the last op */
    uint64_t live_final_count; /* allocations still live after the last op */
    uint64_t n_allocs;
    uint64_t n_frees;
    uint64_t alloc_failures; /* `allocate failure` rows */
    uint64_t unknown_frees;  /* frees of a pointer not live */
    uint64_t dup_allocs;     /* allocates of a pointer already live */
    uint64_t free_size_mismatches; /* frees whose size differs from the allocate's */
    uint64_t double_frees;   /* of unknown_frees: frees of a pointer freed before and not
                                allocated since (a bounded memory of 2^18 freed pointers:
                                past it, one freed long ago counts as unknown only) */
    size_t lines;            /* lines read, header and blank ones included */
    /* Line (1-based) of the first row of each trace bug; 0 when none. */
    size_t first_unknown_free_line;  /* a free of a pointer never allocated */
    size_t first_double_free_line;
    size_t first_dup_alloc_line;
    size_t first_size_mismatch_line;
} gm__trace_t;

/* ---- defined in tools/lib/trace_read.c ---- */

/* Read and parse a trace file, keeping every op.  GM_IO when it cannot be
 * read, GM_PARSE with "FILE:LINE: what is wrong" (a line longer than 4096
 * bytes is one: no trace has them, a binary file or a gzip bomb does),
 * GM_NO_HOST_MEMORY.  On any error *t is left
 * empty (safe to gm__trace_free) and nothing leaks. */
int gm__trace_load(const char *path, gm__trace_t *t);
/* Parse len bytes (plain or gzip) named `name` in messages.  data need not be
 * NUL-terminated.  Same errors and guarantees as gm__trace_load; gzip input
 * in a build without zlib is GM_NOT_SUPPORTED ("... built without zlib"). */
int gm__trace_parse(const char *data, size_t len, const char *name, gm__trace_t *t);
/* The streaming reader: the same parse, handed out a chunk of ops at a time,
 * so memory stays bounded (a few MB) however long the trace is.  Open fails
 * like gm__trace_load (GM_IO ...).  Each gm__trace_next gives the next
 * GM__TRACE_CHUNK_OPS or so ops in *ops (valid until the next call), *n == 0
 * at the end; a malformed line is GM_PARSE when the reader gets to it.
 * gm__trace_header is the trace so far (counts, n_slots, n_streams, streams;
 * ops NULL), final once next gave 0.  gm__trace_close frees the reader and
 * moves that header into *header (NULL: dropped; gm__trace_free it). */
#define GM__TRACE_CHUNK_OPS 65536u
typedef struct gm__trace_reader gm__trace_reader_t;
int gm__trace_open(const char *path, gm__trace_reader_t **r);
int gm__trace_next(gm__trace_reader_t *r, const gm__trace_op_t **ops, size_t *n);
const gm__trace_t *gm__trace_header(const gm__trace_reader_t *r);
void gm__trace_close(gm__trace_reader_t *r, gm__trace_t *header);
/* Release everything; leaves *t empty.  NULL or an empty trace is a no-op. */
void gm__trace_free(gm__trace_t *t);
/* Walk the ops and verify the accounting above and every slot's life cycle.
 * GM_INTERNAL with a message naming the first broken rule. */
int gm__trace_check(const gm__trace_t *t);

#endif /* GM_TOOLS_TRACE_READ_H */
