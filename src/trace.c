/*
 * trace.c — reads RMM logging CSV traces (plain or gzip) into gm__trace_t.
 *
 * The whole input is decompressed into memory, then scanned once, line by
 * line, with hand-written field parsers (no sscanf, no strtoull: inputs are
 * not NUL-terminated and every malformed byte must give "FILE:LINE: why").
 * Pointers are turned into dense slot ids through an open-addressing hash map
 * (linear probing, backward-shift deletion, so no tombstones build up over a
 * long trace), and freed slot ids are reused from a stack, which keeps the
 * slot count equal to the peak number of live allocations.  Nothing is kept
 * from a failed parse: every error path frees what was built.
 */
#include "trace.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#ifdef GM_HAVE_ZLIB
#include <zlib.h>
#endif

static const char header_names[6][8] = {"Thread", "Time", "Action",
                                        "Pointer", "Size", "Stream"};

const char *gm__trace_action_name(int action)
{
    switch (action) {
    case GM__TRACE_ALLOC: return "allocate";
    case GM__TRACE_FREE: return "free";
    case GM__TRACE_ALLOC_FAIL: return "allocate failure";
    default: return "?";
    }
}

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

typedef struct parser {
    gm__trace_t *t;
    const char *name;
    size_t line;
    size_t ops_cap, streams_cap;
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
    gm__trace_t *t = p->t;
    if (t->n_ops == p->ops_cap) {
        void *ops = grow(t->ops, &p->ops_cap, t->n_ops + 1, sizeof *t->ops);
        if (!ops)
            return gm__set_error(GM_NO_HOST_MEMORY, "%s: out of host memory for %zu ops",
                                 p->name, t->n_ops + 1);
        t->ops = ops;
    }
    t->ops[t->n_ops++] = *op;
    return GM_OK;
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
    } else {
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
        op->slot = GM__TRACE_NO_SLOT;
        return push_op(p, op);
    }
    uint32_t slot = p->ptr_slot.vals[cell];
    map_remove_at(&p->ptr_slot, cell);
    p->free_slots[p->n_free_slots++] = slot; /* capacity >= n_slots */
    if (op->size != p->slot_size[slot]) t->free_size_mismatches++;
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

static int parse_text(parser_t *p, const char *data, size_t len)
{
    const char *s = data, *end = data + len;
    int have_header = 0;
    if (len >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) s += 3; /* UTF-8 BOM */
    while (s < end) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        const char *e = nl ? nl : end;
        p->line++;
        if (!is_blank(s, (size_t)(e - s))) {
            if (have_header) {
                GM_CHECK(parse_row(p, s, (size_t)(e - s)));
            } else {
                GM_CHECK(parse_header(p, s, (size_t)(e - s)));
                have_header = 1;
            }
        }
        s = nl ? nl + 1 : end;
    }
    p->t->lines = p->line;
    if (!have_header)
        return gm__set_error(GM_PARSE, "%s: empty trace: no header line "
                                       "'Thread,Time,Action,Pointer,Size,Stream'", p->name);
    return GM_OK;
}

/* ---- gzip ------------------------------------------------------------- */

static int is_gzip(const char *data, size_t len)
{
    return len >= 2 && (unsigned char)data[0] == 0x1f && (unsigned char)data[1] == 0x8b;
}

#ifdef GM_HAVE_ZLIB
/* Inflate every gzip member of data into a fresh buffer (*out, *out_len).
 * Bytes after the last member that are not another member are ignored, as
 * gzip(1) does. */
static int gunzip(const char *data, size_t len, const char *name, char **out, size_t *out_len)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, 15 + 16) != Z_OK)
        return gm__set_error(GM_NO_HOST_MEMORY, "%s: cannot start zlib", name);
    size_t cap = 0, n = 0;
    char *buf = NULL;
    const unsigned char *in = (const unsigned char *)data;
    size_t in_left = len;
    int rc = GM_OK;
    for (;;) {
        if (n == cap) {
            size_t want = cap ? cap + 1 : (len < SIZE_MAX / 8 ? len * 4 : len) + 4096;
            char *bigger = grow(buf, &cap, want, 1);
            if (!bigger) {
                rc = gm__set_error(GM_NO_HOST_MEMORY, "%s: out of host memory while inflating",
                                   name);
                break;
            }
            buf = bigger;
        }
        size_t in_chunk = in_left > UINT32_MAX ? UINT32_MAX : in_left;
        size_t out_chunk = cap - n > UINT32_MAX ? UINT32_MAX : cap - n;
        z.next_in = (unsigned char *)(uintptr_t)in;
        z.avail_in = (uInt)in_chunk;
        z.next_out = (unsigned char *)buf + n;
        z.avail_out = (uInt)out_chunk;
        int zr = inflate(&z, Z_NO_FLUSH);
        in += in_chunk - z.avail_in;
        in_left -= in_chunk - z.avail_in;
        n += out_chunk - z.avail_out;
        if (zr == Z_STREAM_END) {
            if (in_left >= 2 && in[0] == 0x1f && in[1] == 0x8b && inflateReset(&z) == Z_OK)
                continue; /* another member follows */
            break;
        }
        if (zr == Z_OK) continue;
        if (zr == Z_BUF_ERROR && in_left == 0 && z.avail_out != 0) {
            rc = gm__set_error(GM_PARSE, "%s: truncated gzip data", name);
            break;
        }
        if (zr == Z_BUF_ERROR) continue; /* needs more output space */
        if (zr == Z_MEM_ERROR)
            rc = gm__set_error(GM_NO_HOST_MEMORY, "%s: out of host memory while inflating", name);
        else
            rc = gm__set_error(GM_PARSE, "%s: corrupt gzip data (%s)", name,
                               z.msg ? z.msg : "zlib error");
        break;
    }
    inflateEnd(&z);
    if (rc != GM_OK) {
        gm__free(buf);
        return rc;
    }
    *out = buf;
    *out_len = n;
    return GM_OK;
}
#else
static int gunzip(const char *data, size_t len, const char *name, char **out, size_t *out_len)
{
    (void)data, (void)len, (void)out, (void)out_len;
    return gm__set_error(GM_NOT_SUPPORTED,
                         "%s: gzip-compressed input, but gpumem was built without zlib "
                         "(decompress it with gunzip first)", name);
}
#endif

/* ---- public (internal) API ------------------------------------------- */

void gm__trace_free(gm__trace_t *t)
{
    if (!t) return;
    gm__free(t->name);
    gm__free(t->ops);
    gm__free(t->streams);
    memset(t, 0, sizeof *t);
}

int gm__trace_parse(const char *data, size_t len, const char *name, gm__trace_t *t)
{
    int rc = GM_OK;
    char *inflated = NULL;
    parser_t p;
    memset(t, 0, sizeof *t);
    memset(&p, 0, sizeof p);
    if (!name) name = "trace";
    p.t = t;
    p.name = name;
    if (!data && len) return gm__set_error(GM_INVALID_ARGUMENT, "%s: no data", name);

    if (is_gzip(data, len)) {
        size_t n = 0;
        GM_CHECK(gunzip(data, len, name, &inflated, &n));
        data = inflated;
        len = n;
    }
    t->name = copy_string(name);
    if (!t->name || map_init(&p.ptr_slot, 10) || map_init(&p.stream_id, 4)) {
        rc = gm__set_error(GM_NO_HOST_MEMORY, "%s: out of host memory", name);
        goto out;
    }
    /* Rows are ~40-60 bytes; one early estimate avoids most regrowth. */
    t->ops = grow(NULL, &p.ops_cap, len / 48 + 16, sizeof *t->ops);
    if (!t->ops) {
        rc = gm__set_error(GM_NO_HOST_MEMORY, "%s: out of host memory", name);
        goto out;
    }
    GM_CHECK_GOTO(parse_text(&p, data, len), rc, out);
    t->live_final = p.live;

out:
    map_destroy(&p.stream_id);
    map_destroy(&p.ptr_slot);
    gm__free(p.free_slots);
    gm__free(p.slot_size);
    gm__free(p.slot_stream);
    gm__free(inflated);
    if (rc != GM_OK) gm__trace_free(t);
    return rc;
}

int gm__trace_load(const char *path, gm__trace_t *t)
{
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "rb");
    if (!f) return gm__set_error(GM_IO, "cannot open %s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t cap = 0, n = 0;
    int rc = GM_OK;
    for (;;) {
        if (n == cap) {
            char *bigger = grow(buf, &cap, cap ? cap + 1 : 1 << 16, 1);
            if (!bigger) {
                rc = gm__set_error(GM_NO_HOST_MEMORY, "%s: out of host memory", path);
                break;
            }
            buf = bigger;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f)) rc = gm__set_error(GM_IO, "cannot read %s: %s", path, strerror(errno));
            break;
        }
    }
    fclose(f);
    if (rc == GM_OK) rc = gm__trace_parse(buf, n, path, t);
    gm__free(buf);
    return rc;
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
