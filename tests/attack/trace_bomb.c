/* SPDX-License-Identifier: Apache-2.0 */
/*
 * trace_bomb.c — attacks the trace reader's promise (tools/lib/trace_read.h) that a
 * hostile file cannot make it hold memory out of proportion to the trace:
 *   - a gzip bomb that inflates to one endless "line" is refused with a
 *     clear "line longer than 4096 bytes" error, in memory and from a file,
 *     after inflating only a little of it;
 *   - a gzip bomb of blank lines (a valid, empty trace) is read through in
 *     bounded memory (its peak RSS does not grow with it);
 *   - the streaming reader hands a long trace out in bounded chunks.
 * The hostile inputs are made here with zlib (no committed files); sizes
 * scale down under valgrind (GM_UNDER_VALGRIND=1).
 */
#if !defined(_POSIX_C_SOURCE) && !defined(_GNU_SOURCE)
#define _POSIX_C_SOURCE 200809L /* mkstemp, close */
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/internal.h"
#include "test.h"
#include "lib/trace_read.h"

#ifdef GM_HAVE_ZLIB
#include <zlib.h>

#define HEADER "Thread,Time,Action,Pointer,Size,Stream\n"

/* CHECK, and leave this (void) test function when it fails; cond is
 * evaluated once. */
#define CHECK_OR_RETURN(cond)                                                  \
    do {                                                                       \
        int ok_ = (cond) ? 1 : 0;                                              \
        CHECK(ok_);                                                            \
        if (!ok_) return;                                                      \
    } while (0)

/* gzip of HEADER followed by n bytes of c; *len its size. */
static unsigned char *make_bomb(size_t n, char c, size_t *len)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    if (deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 9, Z_DEFAULT_STRATEGY) != Z_OK) return NULL;
    size_t cap = n / 512 + 4096;
    unsigned char *out = malloc(cap);
    char block[1 << 16];
    memset(block, c, sizeof block);
    if (!out) return NULL;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    z.next_in = (unsigned char *)(uintptr_t)HEADER;
    z.avail_in = (uInt)strlen(HEADER);
    int ok = deflate(&z, Z_NO_FLUSH) == Z_OK;
    for (size_t done = 0; ok && done < n; done += sizeof block) {
        size_t k = n - done < sizeof block ? n - done : sizeof block;
        z.next_in = (unsigned char *)block;
        z.avail_in = (uInt)k;
        ok = deflate(&z, Z_NO_FLUSH) == Z_OK && z.avail_out > 0;
    }
    ok = ok && deflate(&z, Z_FINISH) == Z_STREAM_END;
    *len = cap - z.avail_out;
    deflateEnd(&z);
    if (!ok) {
        free(out);
        return NULL;
    }
    return out;
}

static long max_rss_kb(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

static int write_file(char *path, const unsigned char *data, size_t len)
{
    int fd = mkstemp(path);
    if (fd < 0) return -1;
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        close(fd);
        return -1;
    }
    int ok = fwrite(data, 1, len, f) == len;
    return fclose(f) == 0 && ok ? 0 : -1;
}

static void test_endless_line(size_t n)
{
    size_t len = 0;
    unsigned char *bomb = make_bomb(n, 'A', &len);
    CHECK_OR_RETURN(bomb != NULL);
    printf("endless line: %zu bytes of gzip inflate to %zu\n", len, n);

    gm__trace_t t;
    int rc = gm__trace_parse((const char *)bomb, len, "bomb.gz", &t);
    CHECK_RC(rc, GM_PARSE);
    CHECK(strstr(gm_last_error(), "bomb.gz:2: line longer than 4096 bytes") != NULL);
    if (rc == GM_OK) gm__trace_free(&t);

    char path[] = "/tmp/gm_trace_bomb_XXXXXX";
    CHECK_OR_RETURN(write_file(path, bomb, len) == 0);
    CHECK_RC(gm__trace_load(path, &t), GM_PARSE);
    CHECK(strstr(gm_last_error(), ":2: line longer than 4096 bytes") != NULL);

    gm__trace_reader_t *r = NULL;
    CHECK_OK(gm__trace_open(path, &r));
    if (r) {
        const gm__trace_op_t *ops;
        size_t k;
        CHECK_RC(gm__trace_next(r, &ops, &k), GM_PARSE);
        CHECK(strstr(gm_last_error(), "line longer than") != NULL);
        gm__trace_close(r, NULL);
    }
    remove(path);
    free(bomb);
}

static void test_blank_lines(size_t n)
{
    size_t len = 0;
    unsigned char *bomb = make_bomb(n, '\n', &len);
    CHECK_OR_RETURN(bomb != NULL);
    long before = max_rss_kb();
    gm__trace_t t;
    CHECK_OK(gm__trace_parse((const char *)bomb, len, "blank.gz", &t));
    CHECK(t.n_ops == 0 && t.lines == n + 1);
    gm__trace_free(&t);
    long grew_kb = max_rss_kb() - before;
    printf("blank lines: %zu bytes of gzip inflate to %zu; peak RSS grew by %ld KiB\n", len, n,
           grew_kb);
    /* Reading whole would need n bytes; bounded reading needs a few 64 KiB
     * buffers.  RSS means little under a sanitizer or valgrind. */
    if (!UNDER_SANITIZER && !getenv("GM_UNDER_VALGRIND")) CHECK(grew_kb < (long)(n / 4 / 1024));
    free(bomb);
}

/* A long trace through the streaming reader: every chunk bounded, all the
 * ops there, the same header as gm__trace_load's. */
static void test_chunks(size_t rows)
{
    char path[] = "/tmp/gm_trace_chunks_XXXXXX";
    int fd = mkstemp(path);
    CHECK_OR_RETURN(fd >= 0);
    FILE *f = fdopen(fd, "w");
    CHECK_OR_RETURN(f != NULL);
    fputs(HEADER, f);
    for (size_t i = 0; i < rows; i++)
        fprintf(f, "1,%zu,%s,0x%zx,%zu,%zu\n", i, i % 2 ? "free" : "allocate",
                (size_t)0x1000 + (i / 2 % 7) * 0x100, (size_t)64 << (i / 2 % 5), i / 2 % 3);
    CHECK_OR_RETURN(fclose(f) == 0);

    gm__trace_t whole;
    CHECK_OK(gm__trace_load(path, &whole));
    gm__trace_reader_t *r = NULL;
    CHECK_OK(gm__trace_open(path, &r));
    CHECK_OR_RETURN(r != NULL);
    size_t total = 0, chunks = 0, max_chunk = 0, same = 1;
    for (;;) {
        const gm__trace_op_t *ops;
        size_t n;
        CHECK_OK(gm__trace_next(r, &ops, &n));
        if (n == 0) break;
        chunks++;
        if (n > max_chunk) max_chunk = n;
        for (size_t i = 0; i < n && total + i < whole.n_ops; i++)
            same &= memcmp(&ops[i], &whole.ops[total + i], sizeof ops[i]) == 0;
        total += n;
    }
    gm__trace_t h;
    gm__trace_close(r, &h);
    CHECK(total == rows && whole.n_ops == rows && same);
    CHECK(max_chunk <= 2 * GM__TRACE_CHUNK_OPS);
    CHECK(rows <= GM__TRACE_CHUNK_OPS || chunks > 1);
    CHECK(h.n_ops == whole.n_ops && h.live_peak == whole.live_peak && h.n_slots == whole.n_slots &&
          h.n_streams == whole.n_streams && h.lines == whole.lines && h.ops == NULL);
    printf("chunks: %zu rows in %zu chunks of at most %zu ops\n", rows, chunks, max_chunk);
    gm__trace_free(&h);
    gm__trace_free(&whole);
    remove(path);
}

int main(void)
{
    int vg = getenv("GM_UNDER_VALGRIND") != NULL;
    /* First: ru_maxrss is a high-water mark, so the RSS check goes before
     * anything else has used much memory. */
    test_blank_lines(vg ? (size_t)1 << 20 : (size_t)64 << 20);
    test_endless_line(vg ? (size_t)4 << 20 : (size_t)64 << 20);
    test_chunks(vg ? 20000 : 300000);
    return test_summary();
}
#else
int main(void)
{
    printf("skipped: built without zlib\n");
    return 77; /* ctest: skipped */
}
#endif
