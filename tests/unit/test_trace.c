/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_trace.c — the RMM CSV trace reader (tools/lib/trace_read.c): good inputs in
 * every accepted spelling, slot reuse and the peak accounting, trace bugs that
 * are counted rather than fatal, one malformed input per error (each must
 * name its line), gzip, and a round trip of the shipped data/sample.csv.gz.
 */
#if !defined(_POSIX_C_SOURCE) && !defined(_GNU_SOURCE)
#define _POSIX_C_SOURCE 200809L /* mkstemp, close */
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"
#include "base/internal.h"
#include "lib/trace_read.h"

#ifdef GM_HAVE_ZLIB
#include <zlib.h>
#endif

/* CHECK, and leave this (void) test function when it fails. */
#define CHECK_OR_RETURN(cond)                                                  \
    do {                                                                       \
        CHECK(cond);                                                           \
        if (!(cond)) return;                                                   \
    } while (0)

#define HEADER "Thread,Time,Action,Pointer,Size,Stream\n"

static int parse_str(const char *text, gm__trace_t *t)
{
    return gm__trace_parse(text, strlen(text), "t.csv", t);
}

static int is_empty(const gm__trace_t *t)
{
    return t->ops == NULL && t->streams == NULL && t->name == NULL && t->n_ops == 0;
}

static void test_basic(void)
{
    gm__trace_t t;
    const char *text = " Thread , Time,Action ,Pointer,Size, Stream\r\n"
                       "7,00:00:01.000500,allocate,0x7f00aa000000,1024,0\r\n"
                       "\r\n"
                       "7,00:01:02.5,allocate,7f00aa000400,512,0x1234\r\n"
                       "  8 , 3 , free , 0x7f00aa000000 , 1024 , 0  \r\n"
                       "9,4.25,allocate failure,(nil),4096,4660\r\n"
                       "\n\n"
                       "9,5,free,0x7F00AA000400,512,0x1234"; /* no final newline */
    CHECK_OK(parse_str(text, &t));
    CHECK(t.n_ops == 5);
    CHECK(t.lines == 9);
    CHECK(t.n_slots == 2);
    CHECK(t.n_streams == 2);
    CHECK(t.n_streams == 2 && t.streams[0] == 0 && t.streams[1] == 0x1234);
    CHECK(t.live_peak == 1536);
    CHECK(t.live_final == 0 && t.live_final_count == 0);
    CHECK(t.n_allocs == 2 && t.n_frees == 2 && t.alloc_failures == 1);
    CHECK(t.unknown_frees == 0 && t.dup_allocs == 0 && t.free_size_mismatches == 0);
    CHECK(strcmp(t.name, "t.csv") == 0);
    if (t.n_ops == 5) {
        const gm__trace_op_t *op = t.ops;
        CHECK(op[0].action == GM__TRACE_ALLOC && op[0].size == 1024 && op[0].thread == 7);
        CHECK(op[0].time_ns == 1000500000u && op[0].stream == 0);
        CHECK(op[1].time_ns == 62500000000u && op[1].stream == 1);
        CHECK(op[1].slot != op[0].slot);
        CHECK(op[2].action == GM__TRACE_FREE && op[2].slot == op[0].slot && op[2].thread == 8);
        CHECK(op[2].time_ns == 3000000000u);
        CHECK(op[3].action == GM__TRACE_ALLOC_FAIL && op[3].slot == GM__TRACE_NO_SLOT);
        CHECK(op[3].size == 4096 && op[3].stream == 1 && op[3].time_ns == 4250000000u);
        CHECK(op[4].action == GM__TRACE_FREE && op[4].slot == op[1].slot);
    }
    CHECK_OK(gm__trace_check(&t));
    gm__trace_free(&t);
    CHECK(is_empty(&t));
    gm__trace_free(&t); /* twice is fine */
    gm__trace_free(NULL);

    /* A header alone is an empty but valid trace; so is a BOM before it. */
    CHECK_OK(parse_str("\xEF\xBB\xBF" "thread,time,action,pointer,size,stream", &t));
    CHECK(t.n_ops == 0 && t.n_slots == 0 && t.live_peak == 0);
    CHECK_OK(gm__trace_check(&t));
    gm__trace_free(&t);

    /* Fraction digits past nanoseconds are ignored; hex thread ids work. */
    CHECK_OK(parse_str(HEADER "0x10,0.1234567891,allocate,1,1,0\n", &t));
    CHECK(t.n_ops == 1 && t.ops[0].time_ns == 123456789u && t.ops[0].thread == 16);
    gm__trace_free(&t);
}

static void test_slots_and_peak(void)
{
    gm__trace_t t;
    /* live: a=100; a+b=300; b=200; b+c=1200 (peak); c=1000; 0 */
    const char *text = HEADER "0,0,allocate,0xa,100,0\n"
                              "0,0,allocate,0xb,200,0\n"
                              "0,0,free,0xa,100,0\n"
                              "0,0,allocate,0xc,1000,0\n"
                              "0,0,free,0xb,200,0\n"
                              "0,0,free,0xc,1000,0\n"
                              "0,0,allocate,0xd,10,0\n";
    CHECK_OK(parse_str(text, &t));
    CHECK(t.n_slots == 2);
    CHECK(t.live_peak == 1200);
    CHECK(t.live_final == 10 && t.live_final_count == 1);
    if (t.n_ops == 7) {
        CHECK(t.ops[3].slot == t.ops[0].slot); /* c reuses a's slot */
        CHECK(t.ops[6].slot < 2);
    }
    CHECK_OK(gm__trace_check(&t));

    /* the validator notices a broken trace */
    if (t.n_ops == 7) {
        t.ops[2].slot = t.ops[1].slot; /* free b instead of a */
        CHECK(gm__trace_check(&t) == GM_INTERNAL);
        CHECK(strstr(gm_last_error(), "op 2:") != NULL);
        t.ops[2].slot = t.ops[0].slot;
        t.live_peak++;
        CHECK(gm__trace_check(&t) == GM_INTERNAL);
        t.live_peak--;
        CHECK_OK(gm__trace_check(&t));
    }
    gm__trace_free(&t);
}

static void test_trace_bugs(void)
{
    gm__trace_t t;
    const char *text = HEADER "0,0,allocate,0xa,100,0\n"
                              "0,0,free,0xdead,5,0\n"       /* never allocated */
                              "0,0,free,0xa,64,0\n"         /* size differs */
                              "0,0,free,0xa,100,0\n"        /* double free */
                              "0,0,allocate,0xb,10,0\n"
                              "0,0,allocate,0xb,30,3\n"     /* b still live */
                              "0,0,free,0xb,30,3\n";
    CHECK_OK(parse_str(text, &t));
    CHECK(t.unknown_frees == 2);
    CHECK(t.free_size_mismatches == 1);
    CHECK(t.dup_allocs == 1);
    CHECK(t.n_ops == 8); /* 7 rows + the implicit free of the first b */
    CHECK(t.live_peak == 100 && t.live_final == 0);
    if (t.n_ops == 8) {
        CHECK(t.ops[1].slot == GM__TRACE_NO_SLOT && t.ops[1].size == 5);
        CHECK(t.ops[2].size == 100); /* a free carries its allocate's size */
        CHECK(t.ops[3].slot == GM__TRACE_NO_SLOT);
        CHECK(t.ops[5].action == GM__TRACE_FREE && t.ops[5].slot == t.ops[4].slot);
        CHECK(t.ops[5].size == 10 && t.ops[5].stream == t.ops[4].stream);
        CHECK(t.ops[6].action == GM__TRACE_ALLOC && t.ops[6].slot == t.ops[4].slot);
        CHECK(t.ops[6].size == 30);
    }
    CHECK_OK(gm__trace_check(&t));
    gm__trace_free(&t);
}

/* Each malformed input must fail with GM_PARSE, name the line, say why,
 * and leave the trace empty. */
static void test_errors(void)
{
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"", "t.csv: empty trace"},
        {"\n\r\n  \n", "t.csv: empty trace"},
        {"0,0,allocate,0xa,1,0\n", "t.csv:1: no header"},
        {"Thread,Time,Action,Pointer,Size\n", "t.csv:1: bad header"},
        {"Thread,Time,Action,Pointer,Size,Stream,Extra\n", "t.csv:1: bad header"},
        {HEADER "0,0,allocate,0xa,1\n", "t.csv:2: expected 6 columns, found 5"},
        {HEADER "0,0,allocate,0xa,1,0,9\n", "t.csv:2: expected 6 columns, found more than 6"},
        {HEADER "\n0,0,allocate,0xa,12x,0\n", "t.csv:3: bad size \"12x\""},
        {HEADER "0,0,allocate,0xa,,0\n", "t.csv:2: bad size \"\": empty"},
        {HEADER "0,0,allocate,0xa,-5,0\n", "t.csv:2: bad size \"-5\": negative"},
        {HEADER "0,0,allocate,0xa,18446744073709551616,0\n", "t.csv:2: bad size"},
        {HEADER "0,0,allocate,0xa,99999999999999999999,0\n", "out of range"},
        {HEADER "0,0,allocated,0xa,1,0\n", "t.csv:2: unknown action \"allocated\""},
        {HEADER "0,0,allocate,0xzz,1,0\n", "t.csv:2: bad pointer \"0xzz\""},
        {HEADER "0,0,allocate,0x,1,0\n", "t.csv:2: bad pointer"},
        {HEADER "0,0,allocate,0x12345678901234567,1,0\n", "t.csv:2: bad pointer"},
        {HEADER "0,aa:bb,allocate,0xa,1,0\n", "t.csv:2: bad time \"aa:bb\""},
        {HEADER "0,1:2:3:4,allocate,0xa,1,0\n", "t.csv:2: bad time"},
        {HEADER "0,1.,allocate,0xa,1,0\n", "t.csv:2: bad time"},
        {HEADER "0,99999999999:00:00,allocate,0xa,1,0\n", "t.csv:2: bad time"},
        {HEADER "4294967296,0,allocate,0xa,1,0\n", "t.csv:2: bad thread"},
        {HEADER "x,0,allocate,0xa,1,0\n", "t.csv:2: bad thread"},
        {HEADER "0,0,allocate,0xa,1,s1\n", "t.csv:2: bad stream \"s1\""},
        {HEADER "0,0,allocate,0xa,1,\x01\xff\n", "t.csv:2: bad stream \"??\""},
        {HEADER "0,0,allocate,0xa,9223372036854775808,0\n"
                "0,0,allocate,0xb,9223372036854775808,0\n", "t.csv:3: live bytes exceed"},
        {HEADER "0,0,allocate,0xa,1,0\r\n0,0,free,0xa,1,0\r\n\r\n0,0,frees,0xa,1,0\r\n",
         "t.csv:5: unknown action \"frees\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gm__trace_t t;
        int rc = parse_str(cases[i].text, &t);
        CHECK(rc == GM_PARSE);
        CHECK(is_empty(&t));
        if (!strstr(gm_last_error(), cases[i].want)) {
            fprintf(stderr, "case %zu: message \"%s\" lacks \"%s\"\n", i, gm_last_error(),
                    cases[i].want);
            CHECK(0);
        }
        gm__trace_free(&t);
    }

    /* A long garbage field is quoted short. */
    char text[512];
    snprintf(text, sizeof text, HEADER "0,0,%0300d,1,1,0\n", 7);
    gm__trace_t t;
    CHECK(parse_str(text, &t) == GM_PARSE);
    CHECK(strlen(gm_last_error()) < 120);
    CHECK(strstr(gm_last_error(), "...\"") != NULL);

    CHECK(gm__trace_load("/nonexistent-dir/trace.csv", &t) == GM_IO);
    CHECK(strstr(gm_last_error(), "/nonexistent-dir/trace.csv") != NULL);
    CHECK(strstr(gm_last_error(), "No such file") != NULL);
    CHECK(is_empty(&t));
}

/* Many allocations live at once, freed in a scrambled order: exercises the
 * pointer map's growth and its deletion without tombstones. */
static void test_many_live(void)
{
    enum { N = 50000 };
    size_t cap = (size_t)N * 2 * 48 + 64, len = 0;
    char *text = malloc(cap);
    CHECK_OR_RETURN(text);
    len += (size_t)snprintf(text + len, cap - len, HEADER);
    for (unsigned i = 0; i < N; i++)
        len += (size_t)snprintf(text + len, cap - len, "1,0,allocate,0x%llx,%u,0\n",
                                0x7f0000000000ull + (unsigned long long)i * 512, i + 1);
    for (unsigned k = 0; k < N; k++) {
        unsigned i = (unsigned)(((unsigned long long)k * 7919u) % N); /* 7919 prime: a permutation */
        len += (size_t)snprintf(text + len, cap - len, "1,0,free,0x%llx,%u,0\n",
                                0x7f0000000000ull + (unsigned long long)i * 512, i + 1);
    }
    gm__trace_t t;
    uint64_t t0 = gm__now_ns();
    int rc = gm__trace_parse(text, len, "many", &t);
    uint64_t t1 = gm__now_ns();
    CHECK_OK(rc);
    CHECK(t.n_ops == 2 * N && t.n_slots == N);
    CHECK(t.live_peak == (uint64_t)N * (N + 1) / 2 && t.live_final == 0);
    CHECK(t.unknown_frees == 0 && t.free_size_mismatches == 0);
    CHECK_OK(gm__trace_check(&t));
    printf("parsed %u lines in %.2f ms\n", 2 * N + 1, (double)(t1 - t0) / 1e6);
    gm__trace_free(&t);
    free(text);
}

#ifdef GM_HAVE_ZLIB
static void test_gzip(void)
{
    const char *text = HEADER "0,0,allocate,0xa,100,0\n0,0,free,0xa,100,0\n";
    char path[] = "/tmp/gm_test_trace_XXXXXX";
    int fd = mkstemp(path);
    CHECK_OR_RETURN(fd >= 0);
    close(fd);
    /* two gzip members back to back, as `cat a.gz b.gz` makes */
    gzFile gz = gzopen(path, "wb");
    CHECK_OR_RETURN(gz);
    gzwrite(gz, text, (unsigned)strlen(text));
    gzclose(gz);
    gz = gzopen(path, "ab");
    CHECK_OR_RETURN(gz);
    gzputs(gz, "0,0,allocate,0xb,7,0\n");
    gzclose(gz);

    gm__trace_t t;
    CHECK_OK(gm__trace_load(path, &t));
    CHECK(t.n_ops == 3 && t.live_peak == 100 && t.live_final == 7);
    CHECK(t.name && strcmp(t.name, path) == 0);
    gm__trace_free(&t);

    /* truncated and corrupted gzip data */
    FILE *f = fopen(path, "rb");
    CHECK_OR_RETURN(f);
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    remove(path);
    CHECK(gm__trace_parse(buf, 20, "cut.gz", &t) == GM_PARSE);
    CHECK(strstr(gm_last_error(), "cut.gz: truncated gzip") != NULL);
    CHECK(is_empty(&t));
    buf[12] ^= 0x55;
    buf[13] ^= 0x55;
    int rc = gm__trace_parse(buf, n, "bad.gz", &t);
    CHECK(rc == GM_PARSE);
    CHECK(strstr(gm_last_error(), "bad.gz") != NULL);
    gm__trace_free(&t);
    CHECK(gm__trace_parse("\x1f\x8b", 2, "tiny.gz", &t) == GM_PARSE);
}
#else
static void test_gzip(void)
{
    gm__trace_t t;
    CHECK(gm__trace_parse("\x1f\x8b\x08\x00", 4, "x.gz", &t) == GM_NOT_SUPPORTED);
    CHECK(strstr(gm_last_error(), "built without zlib") != NULL);
    CHECK(is_empty(&t));
}
#endif

/* The repository root: GM_SOURCE_DIR when the build defines it, else derived
 * from this file's path (tests/unit/test_trace.c), else the working dir. */
static const char *find_sample(char *buf, size_t cap)
{
    const char *tail = "tests/unit/test_trace.c";
#ifdef GM_SOURCE_DIR
    snprintf(buf, cap, "%s/data/sample.csv.gz", GM_SOURCE_DIR);
    if (access(buf, R_OK) == 0) return buf;
#endif
    const char *file = __FILE__;
    size_t n = strlen(file), tn = strlen(tail);
    if (n >= tn && strcmp(file + n - tn, tail) == 0) {
        snprintf(buf, cap, "%.*sdata/sample.csv.gz", (int)(n - tn), file);
        if (access(buf, R_OK) == 0) return buf;
    }
    static const char *const rel[] = {"data/sample.csv.gz", "../data/sample.csv.gz",
                                      "../../data/sample.csv.gz"};
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
        snprintf(buf, cap, "%s", rel[i]);
        if (access(buf, R_OK) == 0) return buf;
    }
    return NULL;
}

/* Parse the shipped sample, write its ops back out as CSV (slot ids as
 * pointers, which are unique while live) and parse that: same trace. */
static void test_sample_round_trip(void)
{
    char path[4096];
    if (!find_sample(path, sizeof path)) {
        printf("skipped: data/sample.csv.gz not found\n");
        return;
    }
    gm__trace_t t, u;
    uint64_t t0 = gm__now_ns();
    int rc = gm__trace_load(path, &t);
    uint64_t t1 = gm__now_ns();
#ifndef GM_HAVE_ZLIB
    CHECK(rc == GM_NOT_SUPPORTED);
    printf("skipped: the sample is gzip'd and this build has no zlib\n");
    return;
#endif
    CHECK_OK(rc);
    if (rc != GM_OK) return;
    printf("sample: %zu ops, loaded in %.2f ms\n", t.n_ops, (double)(t1 - t0) / 1e6);
    CHECK(t.n_ops == 10169);
    CHECK(t.live_peak == 3192592912u); /* 3.19 GB, the traces' README */
    CHECK(t.unknown_frees == 0 && t.dup_allocs == 0 && t.alloc_failures == 0);
    CHECK_OK(gm__trace_check(&t));

    size_t cap = t.n_ops * 96 + 64, len = 0;
    char *text = malloc(cap);
    CHECK_OR_RETURN(text);
    len += (size_t)snprintf(text + len, cap - len, HEADER);
    for (size_t i = 0; i < t.n_ops; i++) {
        const gm__trace_op_t *op = &t.ops[i];
        len += (size_t)snprintf(text + len, cap - len, "%u,%llu.%09llu,%s,0x%llx,%llu,%llu\n",
                                op->thread, (unsigned long long)(op->time_ns / 1000000000u),
                                (unsigned long long)(op->time_ns % 1000000000u),
                                gm__trace_action_name(op->action),
                                (unsigned long long)op->slot * 256 + 0x10000,
                                (unsigned long long)op->size,
                                (unsigned long long)t.streams[op->stream]);
    }
    CHECK_OK(gm__trace_parse(text, len, "again", &u));
    CHECK(u.n_ops == t.n_ops && u.n_slots == t.n_slots && u.live_peak == t.live_peak);
    CHECK(u.live_final == t.live_final && u.n_streams == t.n_streams);
    size_t same = 0;
    for (size_t i = 0; i < t.n_ops && i < u.n_ops; i++) {
        const gm__trace_op_t *a = &t.ops[i], *b = &u.ops[i];
        same += a->size == b->size && a->time_ns == b->time_ns && a->slot == b->slot &&
                a->thread == b->thread && a->stream == b->stream && a->action == b->action;
    }
    CHECK(same == t.n_ops);
    gm__trace_free(&u);
    gm__trace_free(&t);
    free(text);
}

int main(void)
{
    test_basic();
    test_slots_and_peak();
    test_trace_bugs();
    test_errors();
    test_many_live();
    test_gzip();
    test_sample_round_trip();
    return test_summary();
}
