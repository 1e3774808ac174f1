/* SPDX-License-Identifier: Apache-2.0 */
/*
 * trace.h — the allocation trace format, RMM's logging CSV, and its one row
 * writer.  Everything that writes a trace row (the library's recorder,
 * observe/tracelog.c, and `gpumem synth`) formats it here, so the format is
 * defined in one place; the reader is not part of the library and lives with
 * the tools (tools/lib/trace_read.h).
 *
 * Format: a header `Thread,Time,Action,Pointer,Size,Stream` (spaces around
 * names allowed), then one row per event:
 *   thread  decimal or 0x-hex integer, at most 2^32-1
 *   time    HH:MM:SS.fraction, or a plain number of seconds (fraction allowed)
 *   action  allocate | free | allocate failure
 *   pointer hex, with or without 0x (ignored on `allocate failure` rows)
 *   size    decimal bytes
 *   stream  decimal or 0x-hex integer (0 = the default stream)
 * Plain text or gzip (recognised by its magic bytes).  CRLF line ends, blank
 * lines and a last line without a newline are accepted.
 *
 * The row writer is static inline and formats digits by hand, without
 * printf: both writers format millions of rows in their hot loops (snprintf
 * with a double costs several hundred ns a row), and the style argument is a
 * constant at each call, so each writer compiles to its own straight line.
 */
#ifndef GM_TRACE_H
#define GM_TRACE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum {
    GM__TRACE_ALLOC = 0,      /* `allocate` */
    GM__TRACE_FREE = 1,       /* `free` */
    GM__TRACE_ALLOC_FAIL = 2  /* `allocate failure` (pointer ignored) */
};

/* The header line every trace starts with. */
#define GM__TRACE_HEADER_LINE "Thread,Time,Action,Pointer,Size,Stream\n"

/* "allocate", "free", "allocate failure"; "?" for anything else. */
static inline const char *gm__trace_action_name(int action)
{
    switch (action) {
    case GM__TRACE_ALLOC: return "allocate";
    case GM__TRACE_FREE: return "free";
    case GM__TRACE_ALLOC_FAIL: return "allocate failure";
    default: return "?";
    }
}

/* How a row writes Time and Stream (the reader takes both forms alike):
 *   GM__TRACE_ROW_SECONDS  Time "S.nnnnnnnnn" (seconds and nanoseconds),
 *                          Stream in 0x-hex: the recorder (tracelog.c);
 *   GM__TRACE_ROW_CLOCK    Time "HH:MM:SS.uuuuuu" (a clock, microseconds),
 *                          Stream in decimal: `gpumem synth`, as RMM logs. */
enum { GM__TRACE_ROW_SECONDS = 0, GM__TRACE_ROW_CLOCK = 1 };

/* The longest row gm__trace_format_row writes, with margin: room a caller
 * keeps free in its buffer before each call. */
#define GM__TRACE_ROW_MAX 160

/* x in decimal, at least `width` digits (zero-padded); returns the end. */
static inline char *gm__trace_put_dec(char *p, uint64_t x, int width)
{
    char tmp[24];
    int k = 0;
    do {
        tmp[k++] = (char)('0' + x % 10);
        x /= 10;
    } while (x || k < width);
    while (k) *p++ = tmp[--k];
    return p;
}

/* x in hex, lower case, without a prefix; returns the end. */
static inline char *gm__trace_put_hex(char *p, uint64_t x)
{
    char tmp[16];
    int k = 0;
    do {
        tmp[k++] = "0123456789abcdef"[x & 15];
        x >>= 4;
    } while (x);
    while (k) *p++ = tmp[--k];
    return p;
}

/* Write one row, newline included, at p (GM__TRACE_ROW_MAX bytes free; no
 * NUL is written) and return its end.  action is a GM__TRACE_* value (an
 * unknown one is written as `allocate`); time_ns counts from the trace's
 * start (GM__TRACE_ROW_CLOCK writes it to the microsecond). */
static inline char *gm__trace_format_row(char *p, int style, uint32_t thread, uint64_t time_ns,
                                         int action, uint64_t ptr, uint64_t size,
                                         uint64_t stream)
{
    static const char *const names[] = {"allocate", "free", "allocate failure"};
    static const size_t lens[] = {8, 4, 16};
    unsigned a = action >= 0 && action < 3 ? (unsigned)action : 0;
    p = gm__trace_put_dec(p, thread, 1);
    *p++ = ',';
    if (style == GM__TRACE_ROW_CLOCK) {
        uint64_t us = time_ns / 1000;
        p = gm__trace_put_dec(p, us / 3600000000ull, 2);
        *p++ = ':';
        p = gm__trace_put_dec(p, us / 60000000ull % 60, 2);
        *p++ = ':';
        p = gm__trace_put_dec(p, us / 1000000 % 60, 2);
        *p++ = '.';
        p = gm__trace_put_dec(p, us % 1000000, 6);
    } else {
        p = gm__trace_put_dec(p, time_ns / 1000000000u, 1);
        *p++ = '.';
        p = gm__trace_put_dec(p, time_ns % 1000000000u, 9);
    }
    *p++ = ',';
    memcpy(p, names[a], lens[a]);
    p += lens[a];
    *p++ = ',';
    *p++ = '0';
    *p++ = 'x';
    p = gm__trace_put_hex(p, ptr);
    *p++ = ',';
    p = gm__trace_put_dec(p, size, 1);
    *p++ = ',';
    if (style == GM__TRACE_ROW_CLOCK) {
        p = gm__trace_put_dec(p, stream, 1);
    } else {
        *p++ = '0';
        *p++ = 'x';
        p = gm__trace_put_hex(p, stream);
    }
    *p++ = '\n';
    return p;
}

#endif /* GM_TRACE_H */
