/* SPDX-License-Identifier: Apache-2.0 */
/*
 * trace_read.c — reads RMM logging CSV traces (plain or gzip) into
 * gm__trace_t, for the tools (the library writes traces but never reads them).
 *
 * The input is read in bounded pieces (64 KiB of file, 64 KiB of inflated
 * text at a time; a line cut by a piece's end waits in a MAX_LINE buffer), so
 * neither a long trace nor a gzip bomb makes it hold more than the ops it
 * hands out: all of them for gm__trace_load/parse, one chunk at a time for
 * the streaming reader (gm__trace_open/next).  Lines are parsed with
 * hand-written field parsers (no sscanf, no strtoull: inputs are
 * not NUL-terminated and every malformed byte must give "FILE:LINE: why").
 * Pointers are turned into dense slot ids through an open-addressing hash map
 * (linear probing, backward-shift deletion, so no tombstones build up over a
 * long trace), and freed slot ids are reused from a stack, which keeps the
 * slot count equal to the peak number of live allocations.  Nothing is kept
 * from a failed parse: every error path frees what was built.
 */
#include "lib/trace_read.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/internal.h"

#ifdef GM_HAVE_ZLIB
#include <zlib.h>
#endif

static const char header_names[6][8] = {"Thread", "Time", "Action",
                                        "Pointer", "Size", "Stream"};

/* ---- small helpers ---------------------------------------------------- */

static char *copy_string(const char *s)
{
    size_t n = strlen(s) + 1;
    char *c = gm__malloc(n);
    if (c) memcpy(c, s, n);
    return c;
}

/* The array p (capacity *cap elements of elem bytes) with room for `need`
 * (need >= 1), capacity doubling: the new array, or NULL with p untouched. */
static void *grow(void *p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return p;
    size_t n = *cap ? *cap : 16;
    while (n < need) {
        if (n > SIZE_MAX / 2) return NULL;
        n *= 2;
    }
    if (n > SIZE_MAX / elem) return NULL;
    void *q = gm__realloc(p, n * elem);
    if (q) *cap = n;
    return q;
}

static int lower(int c) { return (c >= 'A' && c <= 'Z') ? c + ('a' - 'A') : c; }

static int equals_nocase(const char *s, size_t n, const char *word)
{
    size_t i = 0;
    for (; i < n && word[i]; i++)
        if (lower((unsigned char)s[i]) != lower((unsigned char)word[i])) return 0;
    return i == n && word[i] == '\0';
}

/* A field quoted for an error message: at most cap - 4 bytes, unprintable bytes
 * shown as '?', so a binary input cannot garble the terminal. */
static const char *quote(const char *s, size_t n, char *buf, size_t cap)
{
    size_t max = cap - 4, o = 0; /* room for "..." and NUL */
    for (size_t i = 0; i < n && o < max; i++) {
        unsigned char c = (unsigned char)s[i];
        buf[o++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    if (o < n) {
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o] = '\0';
    return buf;
}

static int mul_add(uint64_t a, uint64_t b, uint64_t c, uint64_t *out) /* a*b+c */
{
    if (b && a > UINT64_MAX / b) return 0;
    if (a * b > UINT64_MAX - c) return 0;
    *out = a * b + c;
    return 1;
}

/* ---- number parsers: NULL when ok, else a static reason --------------- */

static const char out_of_range[] = "out of range";

static const char *parse_dec(const char *s, size_t n, uint64_t *out)
{
    if (n == 0) return "empty";
    if (s[0] == '-') return "negative";
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned d = (unsigned)(unsigned char)s[i] - '0';
        if (d > 9) return "not a decimal number";
        /* v * 10 + d <= UINT64_MAX, without a division on the hot path */
        if (v >= UINT64_MAX / 10 && (v > UINT64_MAX / 10 || d > UINT64_MAX % 10))
            return out_of_range;
        v = v * 10 + d;
    }
    *out = v;
    return NULL;
}

static const char *parse_hex(const char *s, size_t n, uint64_t *out)
{
    if (n >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        s += 2;
        n -= 2;
    }
    if (n == 0) return "empty";
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        int c = lower((unsigned char)s[i]);
        unsigned d;
        if (c >= '0' && c <= '9')
            d = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            d = (unsigned)(c - 'a' + 10);
        else
            return "not a hex number";
        if (v >> 60) return out_of_range;
        v = (v << 4) | d;
    }
    *out = v;
    return NULL;
}

/* Decimal, or hex with a 0x prefix. */
static const char *parse_int(const char *s, size_t n, uint64_t *out)
{
    if (n >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) return parse_hex(s, n, out);
    return parse_dec(s, n, out);
}

/* [[H:]M:]S[.fraction] in ns; a plain number is seconds.  Fraction digits
 * past nanoseconds are ignored. */
static const char *parse_time(const char *s, size_t n, uint64_t *ns)
{
    const char *e = s + n, *dot = memchr(s, '.', n);
    const char *int_end = dot ? dot : e;
    uint64_t secs = 0;
    int parts = 0;
    const char *p = s;
    for (;;) {
        const char *colon = memchr(p, ':', (size_t)(int_end - p));
        const char *q = colon ? colon : int_end;
        uint64_t v;
        const char *why = parse_dec(p, (size_t)(q - p), &v);
        if (why) return why == out_of_range ? why : "not a time";
        if (++parts > 3) return "not a time";
        if (!mul_add(secs, parts == 1 ? 1 : 60, v, &secs)) return out_of_range;
        if (!colon) break;
        p = colon + 1;
    }
    uint64_t frac = 0;
    if (dot) {
        size_t digits = (size_t)(e - dot - 1);
        if (digits == 0) return "not a time";
        for (size_t i = 0; i < digits; i++) {
            unsigned d = (unsigned)(unsigned char)dot[1 + i] - '0';
            if (d > 9) return "not a time";
            if (i < 9) frac = frac * 10 + d;
        }
        for (size_t i = digits; i < 9; i++) frac *= 10;
    }
    if (!mul_add(secs, 1000000000u, frac, ns)) return out_of_range;
    return NULL;
}

/* ---- u64 -> u32 hash map ---------------------------------------------- */

/* Private, not the library's gm__hash: that table keeps key 0 for "empty",
 * and here 0 is a real key (the default stream is Stream 0; a trace may log
 * pointer 0); the parser also removes by cell after a find (one probe run
 * per row, on the replay's load path), which gm__hash's take-by-key would
 * make two. */

#define MAP_EMPTY UINT32_MAX

typedef struct u64map {
    uint64_t *keys;
    uint32_t *vals; /* MAP_EMPTY marks a free cell */
    size_t mask;    /* capacity - 1; capacity a power of two */
    unsigned shift; /* 64 - log2(capacity) */
    size_t count;
} u64map_t;

static size_t map_home(const u64map_t *m, uint64_t key)
{
    /* Fibonacci hashing: the high bits of the product mix every key bit,
     * which matters because pointers share their low (alignment) bits. */
    return (size_t)((key * UINT64_C(0x9E3779B97F4A7C15)) >> m->shift);
}

static int map_init(u64map_t *m, unsigned log2cap)
{
    size_t cap = (size_t)1 << log2cap;
    m->keys = gm__malloc(cap * sizeof *m->keys);
    m->vals = gm__malloc(cap * sizeof *m->vals);
    if (!m->keys || !m->vals) {
        gm__free(m->keys);
        gm__free(m->vals);
        m->keys = NULL;
        m->vals = NULL;
        return GM_NO_HOST_MEMORY;
    }
    for (size_t i = 0; i < cap; i++) m->vals[i] = MAP_EMPTY;
    m->mask = cap - 1;
    m->shift = 64 - log2cap;
    m->count = 0;
    return GM_OK;
}

static void map_destroy(u64map_t *m)
{
    gm__free(m->keys);
    gm__free(m->vals);
    m->keys = NULL;
    m->vals = NULL;
}

/* Cell index holding key, or SIZE_MAX. */
static size_t map_find(const u64map_t *m, uint64_t key)
{
    for (size_t i = map_home(m, key);; i = (i + 1) & m->mask) {
        if (m->vals[i] == MAP_EMPTY) return SIZE_MAX;
        if (m->keys[i] == key) return i;
    }
}

static void map_put_new(u64map_t *m, uint64_t key, uint32_t val)
{
    size_t i = map_home(m, key);
    while (m->vals[i] != MAP_EMPTY) i = (i + 1) & m->mask;
    m->keys[i] = key;
    m->vals[i] = val;
    m->count++;
}

/* Insert a key known to be absent, doubling at half load. */
static int map_insert(u64map_t *m, uint64_t key, uint32_t val)
{
    if ((m->count + 1) * 2 > m->mask + 1) {
        u64map_t bigger;
        if (m->shift <= 1) return GM_NO_HOST_MEMORY;
        GM_CHECK(map_init(&bigger, 64 - m->shift + 1));
        for (size_t i = 0; i <= m->mask; i++)
            if (m->vals[i] != MAP_EMPTY) map_put_new(&bigger, m->keys[i], m->vals[i]);
        map_destroy(m);
        *m = bigger;
    }
    map_put_new(m, key, val);
    return GM_OK;
}

/* Empty cell i, then pull later cells of the same probe run back so that
 * every key stays reachable from its home without tombstones. */
static void map_remove_at(u64map_t *m, size_t i)
{
    size_t j = i;
    for (;;) {
        j = (j + 1) & m->mask;
        if (m->vals[j] == MAP_EMPTY) break;
        size_t h = map_home(m, m->keys[j]);
        /* The entry at j may move to i unless its home lies cyclically in
         * (i, j]: then i is before its home and it must stay. */
        int home_between = (i <= j) ? (h > i && h <= j) : (h > i || h <= j);
        if (!home_between) {
            m->keys[i] = m->keys[j];
            m->vals[i] = m->vals[j];
            i = j;
        }
    }
    m->vals[i] = MAP_EMPTY;
    m->count--;
}

/* ---- the parser ------------------------------------------------------- */

/* Longest line accepted: RMM rows are under 100 bytes; a longer "line" is
 * not a trace (a binary file, a gzip bomb of one endless line) and must not
 * make us buffer it. */
#define MAX_LINE 4096
/* Freed pointers remembered to tell a double free from an unknown one: a
 * bounded set (a few MB at most); past it, a double free of a pointer freed
 * long ago counts as unknown only. */
#define MAX_DEAD_PTRS ((size_t)1 << 18)

typedef struct parser {
    gm__trace_t *t;
    const char *name;
    size_t line;
    size_t streams_cap;
    gm__trace_op_t *buf;   /* ops parsed and not yet handed out */
    size_t buf_n, buf_cap;
    int have_header;
    int started;           /* some input seen (the BOM check is done) */
    size_t carry_n;        /* bytes of a line cut by a block end, in carry */
    char carry[MAX_LINE];
    u64map_t dead;         /* freed pointers not allocated since (bounded) */
    u64map_t ptr_slot;     /* live pointer -> slot */
    u64map_t stream_id;    /* Stream value -> dense id */
    uint32_t *free_slots;  /* stack of slot ids ready for reuse */
    size_t n_free_slots, free_slots_cap;
    uint64_t *slot_size;   /* per slot: size of its live allocation */
    uint16_t *slot_stream; /* per slot: its stream */
    size_t slot_size_cap, slot_stream_cap;
    uint64_t live;
} parser_t;

/* GM_PARSE with "NAME:LINE: what" for the line being parsed. */
static int parse_error(parser_t *p, const char *fmt, ...) GM_PRINTF(2, 3);
static int parse_error(parser_t *p, const char *fmt, ...)
{
    char what[192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return gm__set_error(GM_PARSE, "%s:%zu: %s", p->name, p->line, what);
}

static int push_op(parser_t *p, const gm__trace_op_t *op)
{
    if (p->buf_n == p->buf_cap) {
        void *ops = grow(p->buf, &p->buf_cap, p->buf_n + 1, sizeof *p->buf);
        if (!ops)
            return gm__set_error(GM_NO_HOST_MEMORY, "%s: out of host memory for %zu ops",
                                 p->name, p->buf_n + 1);
        p->buf = ops;
    }
    p->buf[p->buf_n++] = *op;
    p->t->n_ops++;
    return GM_OK;
}

/* The first line of each kind of trace bug, for the warnings. */
static void note_first(size_t *first, size_t line)
{
    if (*first == 0) *first = line;
}

static int stream_dense_id(parser_t *p, uint64_t value, uint16_t *id)
{
    gm__trace_t *t = p->t;
    size_t i = map_find(&p->stream_id, value);
    if (i != SIZE_MAX) {
        *id = (uint16_t)p->stream_id.vals[i];
        return GM_OK;
    }
    if (t->n_streams >= GM__TRACE_MAX_STREAMS)
        return parse_error(p, "more than %u distinct streams", GM__TRACE_MAX_STREAMS);
    uint64_t *streams = grow(t->streams, &p->streams_cap, (size_t)t->n_streams + 1,
                             sizeof *t->streams);
    if (streams) t->streams = streams;
    if (!streams || map_insert(&p->stream_id, value, t->n_streams))
        return gm__set_error(GM_NO_HOST_MEMORY, "%s: out of host memory", p->name);
    t->streams[t->n_streams] = value;
    *id = (uint16_t)t->n_streams++;
    return GM_OK;
}

/* A new slot id: the most recently freed one, else the next unused id. */
static int take_slot(parser_t *p, uint32_t *slot)
{
    gm__trace_t *t = p->t;
    if (p->n_free_slots) {
        *slot = p->free_slots[--p->n_free_slots];
        return GM_OK;
    }
    if (t->n_slots == GM__TRACE_NO_SLOT)
        return parse_error(p, "more than %u allocations live at once", GM__TRACE_NO_SLOT - 1);
    size_t need = (size_t)t->n_slots + 1;
    uint64_t *size = grow(p->slot_size, &p->slot_size_cap, need, sizeof *p->slot_size);
    if (size) p->slot_size = size;
    uint16_t *stream = grow(p->slot_stream, &p->slot_stream_cap, need, sizeof *p->slot_stream);
    if (stream) p->slot_stream = stream;
    uint32_t *free_slots = grow(p->free_slots, &p->free_slots_cap, need, sizeof *p->free_slots);
    if (free_slots) p->free_slots = free_slots;
    if (!size || !stream || !free_slots)
        return gm__set_error(GM_NO_HOST_MEMORY, "%s: out of host memory", p->name);
    *slot = t->n_slots++;
    return GM_OK;
}

static int on_allocate(parser_t *p, gm__trace_op_t *op, uint64_t ptr)
{
    gm__trace_t *t = p->t;
    uint32_t slot = 0;
    size_t cell = map_find(&p->ptr_slot, ptr);
    if (cell != SIZE_MAX) {
        /* The pointer is live: the trace lost a free.  Free the earlier
         * block implicitly, in this slot, and reuse the slot. */
        slot = p->ptr_slot.vals[cell];
        gm__trace_op_t f = *op;
        f.action = GM__TRACE_FREE;
        f.slot = slot;
        f.size = p->slot_size[slot];
        f.stream = p->slot_stream[slot];
        GM_CHECK(push_op(p, &f));
        p->live -= f.size;
        t->live_final_count--;
        t->n_frees++;
        t->dup_allocs++;
        note_first(&t->first_dup_alloc_line, p->line);
    } else {
        size_t dead = map_find(&p->dead, ptr);
        if (dead != SIZE_MAX) map_remove_at(&p->dead, dead);
        GM_CHECK(take_slot(p, &slot));
        if (map_insert(&p->ptr_slot, ptr, slot))
            return gm__set_error(GM_NO_HOST_MEMORY, "%s: out of host memory", p->name);
    }
    if (op->size > UINT64_MAX - p->live)
        return parse_error(p, "live bytes exceed 2^64");
    p->live += op->size;
    if (p->live > t->live_peak) t->live_peak = p->live;
    t->live_final_count++;
    t->n_allocs++;
    p->slot_size[slot] = op->size;
    p->slot_stream[slot] = op->stream;
    op->slot = slot;
    return push_op(p, op);
}

static int on_free(parser_t *p, gm__trace_op_t *op, uint64_t ptr)
{
    gm__trace_t *t = p->t;
    size_t cell = map_find(&p->ptr_slot, ptr);
    t->n_frees++;
    if (cell == SIZE_MAX) {
        t->unknown_frees++;
        if (map_find(&p->dead, ptr) != SIZE_MAX) {
            t->double_frees++;
            note_first(&t->first_double_free_line, p->line);
        } else {
            note_first(&t->first_unknown_free_line, p->line);
        }
        op->slot = GM__TRACE_NO_SLOT;
        return push_op(p, op);
    }
    uint32_t slot = p->ptr_slot.vals[cell];
    map_remove_at(&p->ptr_slot, cell);
    p->free_slots[p->n_free_slots++] = slot; /* capacity >= n_slots */
    if (p->dead.count < MAX_DEAD_PTRS && map_insert(&p->dead, ptr, 0) != GM_OK)
        return gm__set_error(GM_NO_HOST_MEMORY, "%s: out of host memory", p->name);
    if (op->size != p->slot_size[slot]) {
        t->free_size_mismatches++;
        note_first(&t->first_size_mismatch_line, p->line);
    }
    op->size = p->slot_size[slot];
    op->slot = slot;
    p->live -= op->size;
    t->live_final_count--;
    return push_op(p, op);
}

static void trim(const char **s, size_t *n)
{
    while (*n && (**s == ' ' || **s == '\t')) (*s)++, (*n)--;
    while (*n && ((*s)[*n - 1] == ' ' || (*s)[*n - 1] == '\t' || (*s)[*n - 1] == '\r')) (*n)--;
}

/* Split [s, s+n) on commas into exactly 6 trimmed fields; the count found
 * (a plain loop: fields are a few bytes, too short for memchr to pay). */
static int split_fields(const char *s, size_t n, const char *f[6], size_t len[6])
{
    int k = 0;
    size_t start = 0;
    for (size_t i = 0;; i++) {
        if (i == n || s[i] == ',') {
            if (k == 6) return 7;
            f[k] = s + start;
            len[k] = i - start;
            trim(&f[k], &len[k]);
            k++;
            if (i == n) return k;
            start = i + 1;
        }
    }
}

static int parse_header(parser_t *p, const char *s, size_t n)
{
    const char *f[6];
    size_t len[6];
    char q[40];
    int k = split_fields(s, n, f, len);
    int ok = k == 6;
    for (int i = 0; ok && i < 6; i++) ok = equals_nocase(f[i], len[i], header_names[i]);
    if (ok) return GM_OK;
    if (n && s[0] >= '0' && s[0] <= '9')
        return parse_error(p, "no header: the first line must be "
                              "'Thread,Time,Action,Pointer,Size,Stream'");
    return parse_error(p, "bad header \"%s\": expected 'Thread,Time,Action,Pointer,Size,Stream'",
                       quote(s, n, q, sizeof q));
}

static int parse_row(parser_t *p, const char *s, size_t n)
{
    const char *f[6];
    size_t len[6];
    char q[40];
    const char *why;
    uint64_t v, ptr = 0;
    gm__trace_op_t op = {0};

    int k = split_fields(s, n, f, len);
    if (k != 6) return parse_error(p, "expected 6 columns, found %s%d", k > 6 ? "more than " : "",
                                   k > 6 ? 6 : k);

    if ((why = parse_int(f[0], len[0], &v)) || (v > UINT32_MAX && (why = out_of_range)))
        return parse_error(p, "bad thread \"%s\": %s", quote(f[0], len[0], q, sizeof q), why);
    op.thread = (uint32_t)v;

    if ((why = parse_time(f[1], len[1], &op.time_ns)))
        return parse_error(p, "bad time \"%s\": %s", quote(f[1], len[1], q, sizeof q), why);

    if (equals_nocase(f[2], len[2], "allocate"))
        op.action = GM__TRACE_ALLOC;
    else if (equals_nocase(f[2], len[2], "free"))
        op.action = GM__TRACE_FREE;
    else if (equals_nocase(f[2], len[2], "allocate failure"))
        op.action = GM__TRACE_ALLOC_FAIL;
    else
        return parse_error(p, "unknown action \"%s\" (allocate, free, allocate failure)",
                           quote(f[2], len[2], q, sizeof q));

    /* A failed allocation has no pointer; whatever the logger wrote there
     * ("0x0", "(nil)", nothing) is ignored. */
    if (op.action != GM__TRACE_ALLOC_FAIL && (why = parse_hex(f[3], len[3], &ptr)))
        return parse_error(p, "bad pointer \"%s\": %s", quote(f[3], len[3], q, sizeof q), why);

    if ((why = parse_dec(f[4], len[4], &op.size)))
        return parse_error(p, "bad size \"%s\": %s", quote(f[4], len[4], q, sizeof q), why);

    if ((why = parse_int(f[5], len[5], &v)))
        return parse_error(p, "bad stream \"%s\": %s", quote(f[5], len[5], q, sizeof q), why);
    GM_CHECK(stream_dense_id(p, v, &op.stream));

    switch (op.action) {
    case GM__TRACE_ALLOC: return on_allocate(p, &op, ptr);
    case GM__TRACE_FREE: return on_free(p, &op, ptr);
    default:
        p->t->alloc_failures++;
        op.slot = GM__TRACE_NO_SLOT;
        return push_op(p, &op);
    }
}

static int is_blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return 0;
    return 1;
}

/* One line, its end of line cut off: the header first, then rows. */
static int parse_line(parser_t *p, const char *s, size_t n)
{
    p->line++;
    if (is_blank(s, n)) return GM_OK;
    if (p->have_header) return parse_row(p, s, n);
    GM_CHECK(parse_header(p, s, n));
    p->have_header = 1;
    return GM_OK;
}

static int line_too_long(parser_t *p)
{
    p->line++;
    return parse_error(p, "line longer than %d bytes: not an RMM trace", MAX_LINE);
}

/* Parse the text in [data, data+len), the next piece of the input: every
 * complete line, and the cut one at the end kept in p->carry for the next
 * piece (or parse_finish).  Memory stays bounded by MAX_LINE whatever the
 * input. */
static int parse_piece(parser_t *p, const char *data, size_t len)
{
    const char *s = data, *end = data + len;
    if (!p->started && len > 0) {
        p->started = 1;
        if (len >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) s += 3; /* UTF-8 BOM */
    }
    while (s < end) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        const char *e = nl ? nl : end;
        size_t n = (size_t)(e - s);
        if (p->carry_n + n > MAX_LINE) return line_too_long(p);
        if (!nl) { /* the line goes on in the next piece */
            memcpy(p->carry + p->carry_n, s, n);
            p->carry_n += n;
            break;
        }
        if (p->carry_n) {
            memcpy(p->carry + p->carry_n, s, n);
            size_t whole = p->carry_n + n;
            p->carry_n = 0;
            GM_CHECK(parse_line(p, p->carry, whole));
        } else {
            GM_CHECK(parse_line(p, s, n));
        }
        s = nl + 1;
    }
    return GM_OK;
}

/* End of input: the last line if it had no newline, then the totals. */
static int parse_finish(parser_t *p)
{
    if (p->carry_n) {
        size_t n = p->carry_n;
        p->carry_n = 0;
        GM_CHECK(parse_line(p, p->carry, n));
    }
    p->t->lines = p->line;
    p->t->live_final = p->live;
    if (!p->have_header)
        return gm__set_error(GM_PARSE, "%s: empty trace: no header line "
                                       "'Thread,Time,Action,Pointer,Size,Stream'", p->name);
    return GM_OK;
}

static int parser_init(parser_t *p, gm__trace_t *t, const char *name)
{
    memset(t, 0, sizeof *t);
    memset(p, 0, sizeof *p);
    p->t = t;
    t->name = copy_string(name);
    p->name = t->name;
    if (!t->name || map_init(&p->ptr_slot, 10) || map_init(&p->stream_id, 4) ||
        map_init(&p->dead, 10)) {
        p->name = name;
        return gm__set_error(GM_NO_HOST_MEMORY, "%s: out of host memory", name);
    }
    return GM_OK;
}

/* Free the parser's own state (not t, not p->buf). */
static void parser_fini(parser_t *p)
{
    map_destroy(&p->dead);
    map_destroy(&p->stream_id);
    map_destroy(&p->ptr_slot);
    gm__free(p->free_slots);
    gm__free(p->slot_size);
    gm__free(p->slot_stream);
    p->free_slots = NULL;
    p->slot_size = NULL;
    p->slot_stream = NULL;
}

/* ---- input: a file or memory, plain or gzip, in bounded pieces ---------- */

#define RAW_BLOCK ((size_t)1 << 16)  /* bytes read from a file at a time */
#define TEXT_BLOCK ((size_t)1 << 16) /* bytes inflated at a time */

typedef struct source {
    const char *name;
    FILE *f;                  /* NULL: all input is in [in, in+in_left) */
    unsigned char *raw;       /* file: RAW_BLOCK bytes */
    const unsigned char *in;  /* input not consumed yet */
    size_t in_left;
    int eof;                  /* nothing beyond in_left */
    int kind;                 /* 0 undecided, 1 plain, 2 gzip */
    int member_done;          /* gzip: the current member ended */
    int z_pending;            /* gzip: inflate filled text: it may hold more */
    int z_open;
#ifdef GM_HAVE_ZLIB
    z_stream z;
#endif
    char *text;               /* gzip: TEXT_BLOCK bytes of inflated text */
} source_t;

static int is_gzip(const unsigned char *data, size_t len)
{
    return len >= 2 && data[0] == 0x1f && data[1] == 0x8b;
}

/* Read the next file block behind what is left (at most 1 byte: a gzip
 * magic cut in two). */
static int source_refill(source_t *src)
{
    if (!src->f) {
        src->eof = 1;
        return GM_OK;
    }
    if (src->in_left) memmove(src->raw, src->in, src->in_left);
    size_t got = fread(src->raw + src->in_left, 1, RAW_BLOCK - src->in_left, src->f);
    if (got == 0) {
        if (ferror(src->f))
            return gm__set_error(GM_IO, "cannot read %s: %s", src->name, strerror(errno));
        src->eof = 1;
    }
    src->in = src->raw;
    src->in_left += got;
    return GM_OK;
}

static void source_close(source_t *src)
{
#ifdef GM_HAVE_ZLIB
    if (src->z_open) inflateEnd(&src->z);
#endif
    src->z_open = 0;
    if (src->f) fclose(src->f);
    src->f = NULL;
    gm__free(src->raw);
    gm__free(src->text);
    src->raw = NULL;
    src->text = NULL;
}

static int source_open_file(source_t *src, const char *path)
{
    memset(src, 0, sizeof *src);
    src->name = path;
    src->f = fopen(path, "rb");
    if (!src->f) return gm__set_error(GM_IO, "cannot open %s: %s", path, strerror(errno));
    src->raw = gm__malloc(RAW_BLOCK);
    if (!src->raw) {
        source_close(src);
        return gm__set_error(GM_NO_HOST_MEMORY, "%s: out of host memory", path);
    }
    src->in = src->raw;
    return GM_OK;
}

static void source_open_memory(source_t *src, const char *data, size_t len, const char *name)
{
    memset(src, 0, sizeof *src);
    src->name = name;
    src->in = (const unsigned char *)data;
    src->in_left = len;
    src->eof = 1;
}

#ifdef GM_HAVE_ZLIB
/* Inflate some of the input into src->text and parse it. */
static int pump_gzip(source_t *src, parser_t *p)
{
    if (!src->z_open) {
        memset(&src->z, 0, sizeof src->z);
        src->text = gm__malloc(TEXT_BLOCK);
        if (!src->text || inflateInit2(&src->z, 15 + 16) != Z_OK)
            return gm__set_error(GM_NO_HOST_MEMORY, "%s: cannot start zlib", src->name);
        src->z_open = 1;
    }
    if (src->member_done) {
        if (src->in_left < 2 && !src->eof) return source_refill(src);
        if (is_gzip(src->in, src->in_left) && inflateReset(&src->z) == Z_OK) {
            src->member_done = 0; /* another member follows, as `cat a.gz b.gz` makes */
        } else {
            src->in_left = 0; /* bytes after the last member are ignored, as gzip(1) does */
            src->eof = 1;
            return GM_OK;
        }
    }
    size_t in_chunk = src->in_left > UINT32_MAX ? UINT32_MAX : src->in_left;
    src->z.next_in = (unsigned char *)(uintptr_t)src->in;
    src->z.avail_in = (uInt)in_chunk;
    src->z.next_out = (unsigned char *)src->text;
    src->z.avail_out = (uInt)TEXT_BLOCK;
    int zr = inflate(&src->z, Z_NO_FLUSH);
    size_t used = in_chunk - src->z.avail_in;
    src->in += used;
    src->in_left -= used;
    size_t made = TEXT_BLOCK - src->z.avail_out;
    src->z_pending = src->z.avail_out == 0;
    if (zr == Z_STREAM_END) src->member_done = 1;
    else if (zr == Z_MEM_ERROR)
        return gm__set_error(GM_NO_HOST_MEMORY, "%s: out of host memory while inflating",
                             src->name);
    else if (zr != Z_OK && zr != Z_BUF_ERROR)
        return gm__set_error(GM_PARSE, "%s: corrupt gzip data (%s)", src->name,
                             src->z.msg ? src->z.msg : "zlib error");
    return made ? parse_piece(p, src->text, made) : GM_OK;
}
#else
static int pump_gzip(source_t *src, parser_t *p)
{
    (void)p;
    return gm__set_error(GM_NOT_SUPPORTED,
                         "%s: gzip-compressed input, but gpumem was built without zlib "
                         "(decompress it with gunzip first)", src->name);
}
#endif

/* Parse input until at least `want` ops are buffered or the input ends;
 * *done set at its end (after parse_finish). */
static int pump(source_t *src, parser_t *p, size_t want, int *done)
{
    *done = 0;
    while (p->buf_n < want) {
        if (src->kind == 2 && src->z_pending && !src->member_done) {
            GM_CHECK(pump_gzip(src, p));
            continue;
        }
        if (src->in_left == 0 || (src->kind == 0 && src->in_left < 2 && !src->eof)) {
            if (!src->eof) {
                GM_CHECK(source_refill(src));
                continue;
            }
            if (src->in_left == 0) {
                if (src->kind == 2 && !src->member_done)
                    return gm__set_error(GM_PARSE, "%s: truncated gzip data", src->name);
                GM_CHECK(parse_finish(p));
                *done = 1;
                return GM_OK;
            }
        }
        if (src->kind == 0) src->kind = is_gzip(src->in, src->in_left) ? 2 : 1;
        if (src->kind == 2) {
            GM_CHECK(pump_gzip(src, p));
        } else {
            /* Plain text: a file block, or all of a memory input at once
             * (its lines are parsed in place). */
            const char *piece = (const char *)src->in;
            size_t n = src->in_left;
            src->in_left = 0;
            GM_CHECK(parse_piece(p, piece, n));
        }
    }
    return GM_OK;
}

/* ---- public (internal) API ------------------------------------------- */

void gm__trace_free(gm__trace_t *t)
{
    if (!t) return;
    gm__free(t->name);
    gm__free(t->ops);
    gm__free(t->streams);
    memset(t, 0, sizeof *t);
}

/* Everything at once: ops kept in t->ops. */
static int parse_all(source_t *src, const char *name, gm__trace_t *t)
{
    parser_t *p = gm__malloc(sizeof *p);
    if (!p) {
        memset(t, 0, sizeof *t);
        source_close(src);
        return gm__set_error(GM_NO_HOST_MEMORY, "%s: out of host memory", name);
    }
    int done = 0, rc = parser_init(p, t, name);
    if (rc == GM_OK) rc = pump(src, p, SIZE_MAX, &done);
    parser_fini(p);
    source_close(src);
    if (rc == GM_OK) {
        t->ops = p->buf;
    } else {
        gm__free(p->buf);
        gm__trace_free(t);
    }
    gm__free(p);
    return rc;
}

int gm__trace_parse(const char *data, size_t len, const char *name, gm__trace_t *t)
{
    source_t src;
    if (!name) name = "trace";
    if (!data && len) {
        memset(t, 0, sizeof *t);
        return gm__set_error(GM_INVALID_ARGUMENT, "%s: no data", name);
    }
    source_open_memory(&src, data, len, name);
    return parse_all(&src, name, t);
}

int gm__trace_load(const char *path, gm__trace_t *t)
{
    source_t src;
    memset(t, 0, sizeof *t);
    GM_CHECK(source_open_file(&src, path));
    return parse_all(&src, path, t);
}

struct gm__trace_reader {
    source_t src;
    parser_t p;
    gm__trace_t t;
    int done;
};

int gm__trace_open(const char *path, gm__trace_reader_t **out)
{
    *out = NULL;
    gm__trace_reader_t *r = gm__calloc(1, sizeof *r);
    if (!r) return gm__set_error(GM_NO_HOST_MEMORY, "%s: out of host memory", path);
    int rc = source_open_file(&r->src, path);
    if (rc == GM_OK) {
        rc = parser_init(&r->p, &r->t, path);
        if (rc != GM_OK) source_close(&r->src);
    }
    if (rc != GM_OK) {
        parser_fini(&r->p);
        gm__trace_free(&r->t);
        gm__free(r);
        return rc;
    }
    *out = r;
    return GM_OK;
}

int gm__trace_next(gm__trace_reader_t *r, const gm__trace_op_t **ops, size_t *n)
{
    *ops = NULL;
    *n = 0;
    r->p.buf_n = 0;
    if (r->done) return GM_OK;
    GM_CHECK(pump(&r->src, &r->p, GM__TRACE_CHUNK_OPS, &r->done));
    *ops = r->p.buf;
    *n = r->p.buf_n;
    return GM_OK;
}

const gm__trace_t *gm__trace_header(const gm__trace_reader_t *r)
{
    return &r->t;
}

void gm__trace_close(gm__trace_reader_t *r, gm__trace_t *header)
{
    if (!r) return;
    parser_fini(&r->p);
    source_close(&r->src);
    gm__free(r->p.buf);
    if (header) *header = r->t;
    else gm__trace_free(&r->t);
    gm__free(r);
}

int gm__trace_check(const gm__trace_t *t)
{
    const char *name = t->name ? t->name : "trace";
    uint64_t *size = NULL;
    unsigned char *live = NULL;
    if (t->n_slots) {
        size = gm__calloc(t->n_slots, sizeof *size);
        live = gm__calloc(t->n_slots, 1);
        if (!size || !live) {
            gm__free(size);
            gm__free(live);
            return gm__set_error(GM_NO_HOST_MEMORY, "%s: out of host memory", name);
        }
    }
    uint64_t bytes = 0, peak = 0, count = 0, max_count = 0;
    uint64_t allocs = 0, frees = 0, fails = 0, unknown = 0;
    const char *broken = NULL;
    size_t i;
    for (i = 0; i < t->n_ops; i++) {
        const gm__trace_op_t *op = &t->ops[i];
        if (op->stream >= t->n_streams) {
            broken = "stream id out of range";
            break;
        }
        switch (op->action) {
        case GM__TRACE_ALLOC:
            allocs++;
            if (op->slot >= t->n_slots) broken = "allocate without a valid slot";
            else if (live[op->slot]) broken = "allocate into a live slot";
            else if (op->size > UINT64_MAX - bytes) broken = "live bytes overflow";
            else {
                live[op->slot] = 1;
                size[op->slot] = op->size;
                bytes += op->size;
                if (bytes > peak) peak = bytes;
                if (++count > max_count) max_count = count;
            }
            break;
        case GM__TRACE_FREE:
            frees++;
            if (op->slot == GM__TRACE_NO_SLOT) unknown++;
            else if (op->slot >= t->n_slots || !live[op->slot]) broken = "free of a dead slot";
            else if (size[op->slot] != op->size) broken = "free size differs from its allocate";
            else {
                live[op->slot] = 0;
                bytes -= op->size;
                count--;
            }
            break;
        case GM__TRACE_ALLOC_FAIL:
            fails++;
            if (op->slot != GM__TRACE_NO_SLOT) broken = "allocate failure with a slot";
            break;
        default: broken = "unknown action";
        }
        if (broken) break;
    }
    gm__free(size);
    gm__free(live);
    if (broken)
        return gm__set_error(GM_INTERNAL, "%s: op %zu: %s", name, i, broken);
    if (peak != t->live_peak || bytes != t->live_final || count != t->live_final_count)
        return gm__set_error(GM_INTERNAL, "%s: live bytes accounting differs from the ops", name);
    if (max_count != t->n_slots)
        return gm__set_error(GM_INTERNAL, "%s: n_slots %u, but %llu live at most", name,
                             t->n_slots, (unsigned long long)max_count);
    if (allocs != t->n_allocs || frees != t->n_frees || fails != t->alloc_failures ||
        unknown != t->unknown_frees || allocs + frees + fails != t->n_ops)
        return gm__set_error(GM_INTERNAL, "%s: op counts differ from the ops", name);
    return GM_OK;
}
