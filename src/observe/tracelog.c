/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tracelog.c — recording every allocate / free / allocate failure of the
 * process as an RMM logging CSV (Thread,Time,Action,Pointer,Size,Stream),
 * the format of observe/trace.h, whose row writer formats every row; gzip'd
 * when the path ends in ".gz".
 *
 * The one idea: the allocation path only appends a 40-byte binary record to
 * its pool's buffer, under the pool lock it already holds (so a pool's
 * records are in the order its operations happened).  A full buffer is
 * handed to a writer thread, which formats and writes it; gm_trace_stop,
 * pool destruction and process exit hand over the partial buffers and wait
 * for the file to have them.  Times are time-stamp-counter ticks, turned
 * into seconds since the start by the writer.
 *
 * Call sites: with leak tracking on, an allocation's first frames travel
 * with its record, and the writer adds a line "ROW,BYTES,SITE" to the side
 * file PATH.sites (ROW: the allocate row's number among the data rows, from
 * 1), symbolized there.  The CSV itself stays exactly RMM's format.
 *
 * Start and stop: one mutex (life_mu) is held for the whole of
 * gm_trace_start and gm_trace_stop, so the writer thread's life (create,
 * stop, join, file close) is changed by one caller at a time, from any
 * number of threads; a stop with no trace running is a no-op.  Lock order:
 * life_mu, then the registry, then a pool's lock, then mu.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#ifdef GM_HAVE_ZLIB
#include <zlib.h>
#endif

#include "observe/observe.h"

#define BUF_RECORDS 4096
#define SITE_FRAMES 4
#define SITE 4u /* flag in rec_t.action: sites[i] holds the call site */

typedef struct rec {
    uint64_t tick;
    uint64_t ptr;
    uint64_t size;
    uint64_t stream;
    uint32_t thread;
    uint32_t action;
} rec_t;

struct gm__trace_buf {
    struct gm__trace_buf *next;  /* in the writer's queue */
    uint64_t gen;                /* the trace it belongs to */
    size_t n;
    void *(*sites)[SITE_FRAMES]; /* per record, allocated when first needed;
                                    valid where the record's action has SITE */
    rec_t r[BUF_RECORDS];
};


static void buf_free(struct gm__trace_buf *b)
{
    if (!b) return;
    gm__free(b->sites);
    gm__free(b);
}

static pthread_mutex_t life_mu = PTHREAD_MUTEX_INITIALIZER; /* start/stop, whole */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;  /* everything below */
static pthread_cond_t cv_work = PTHREAD_COND_INITIALIZER;
static pthread_cond_t cv_done = PTHREAD_COND_INITIALIZER;
static struct gm__trace_buf *queue_head, *queue_tail;
#define MAX_SPARE 8
static struct gm__trace_buf *spares; /* recycled buffers (a list through next):
                                        no malloc, no page faults in steady state */
static int n_spares;
static uint64_t gen;                 /* current trace; 0 = none yet */
static bool writer_busy, writer_stop, writer_running;
static pthread_t writer;
static FILE *file;
static FILE *sites_file;             /* PATH.sites, opened at the first site */
static uint64_t rows_written;
#ifdef GM_HAVE_ZLIB
static gzFile gz;
#endif
static uint64_t start_tick;
static double ns_per_tick;
static char path_now[1024];
static int write_error;              /* errno of the first failed write */

static _Thread_local uint32_t my_tid;

static uint32_t thread_id(void)
{
    if (GM_UNLIKELY(!my_tid)) my_tid = (uint32_t)syscall(SYS_gettid);
    return my_tid;
}

/* ---- the writer thread ----------------------------------------------------------- */

static void out_write(const char *s, size_t n)
{
    size_t w = 0;
#ifdef GM_HAVE_ZLIB
    if (gz) {
        w = gzwrite(gz, s, (unsigned)n) > 0 ? n : 0;
        if (w != n && !write_error) write_error = EIO;
        return;
    }
#endif
    if (file) w = fwrite(s, 1, n, file);
    if (w != n && !write_error) write_error = errno ? errno : EIO;
}

static void write_site(uint64_t row, uint64_t size, void *const *frames)
{
    if (!sites_file) {
        char p[sizeof path_now + 8];
        snprintf(p, sizeof p, "%s.sites", path_now);
        sites_file = fopen(p, "w");
        if (!sites_file) return;
        fputs("Row,Bytes,Site\n", sites_file);
    }
    /* One addr2line per distinct call site: a small cache. */
    static struct {
        void *addr;
        char text[240];
    } cache[256];
    /* The allocating frame and its caller: "f at a.c:7 < g at a.c:14". */
    char site[512] = "";
    size_t at = 0;
    for (int k = 0; k < 2 && frames[k]; k++) {
        void *a = frames[k];
        size_t h = ((uintptr_t)a >> 4) % 256;
        if (cache[h].addr != a) {
            cache[h].addr = a;
            gm__leak_describe(a, cache[h].text, sizeof cache[h].text);
        }
        int n = snprintf(site + at, sizeof site - at, "%s%s", k ? " < " : "", cache[h].text);
        if (n > 0) at += (size_t)n < sizeof site - at ? (size_t)n : sizeof site - at - 1;
    }
    for (char *c = site; *c; c++)
        if (*c == ',' || *c == '\n') *c = ';';
    fprintf(sites_file, "%llu,%llu,%s\n", (unsigned long long)row, (unsigned long long)size, site);
}

static void format_buf(const struct gm__trace_buf *b)
{
    char text[64 * 1024];
    char *p = text;
    for (size_t i = 0; i < b->n; i++) {
        const rec_t *r = &b->r[i];
        uint64_t ns = r->tick >= start_tick
                          ? (uint64_t)((double)(r->tick - start_tick) * ns_per_tick)
                          : 0;
        /* The row format is trace.h's (seconds.nanoseconds, hex stream); it
         * writes an unknown action as `allocate`. */
        p = gm__trace_format_row(p, GM__TRACE_ROW_SECONDS, r->thread, ns,
                                 (int)(r->action & ~SITE), r->ptr, r->size, r->stream);
        rows_written++;
        if ((r->action & SITE) && b->sites) write_site(rows_written, r->size, b->sites[i]);
        if ((size_t)(text + sizeof text - p) < GM__TRACE_ROW_MAX) {
            out_write(text, (size_t)(p - text));
            p = text;
        }
    }
    if (p > text) out_write(text, (size_t)(p - text));
}

static void *writer_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    for (;;) {
        while (!queue_head && !writer_stop) pthread_cond_wait(&cv_work, &mu);
        if (!queue_head && writer_stop) break;
        struct gm__trace_buf *b = queue_head;
        queue_head = b->next;
        if (!queue_head) queue_tail = NULL;
        writer_busy = true;
        bool current = b->gen == gen;
        pthread_mutex_unlock(&mu);
        if (current) format_buf(b); /* file and gen change only while the queue is empty */
        pthread_mutex_lock(&mu);
        writer_busy = false;
        if (n_spares < MAX_SPARE) {
            b->next = spares;
            spares = b;
            n_spares++;
            b = NULL;
        }
        pthread_cond_broadcast(&cv_done);
        if (b) {
            pthread_mutex_unlock(&mu);
            buf_free(b);
            pthread_mutex_lock(&mu);
        }
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

/* mu held: push b to the writer. */
static void enqueue(struct gm__trace_buf *b)
{
    b->next = NULL;
    if (queue_tail) queue_tail->next = b;
    else queue_head = b;
    queue_tail = b;
    pthread_cond_signal(&cv_work);
}

/* mu held: wait until the writer has written everything queued. */
static void wait_drained(void)
{
    while (queue_head || writer_busy) pthread_cond_wait(&cv_done, &mu);
}

/* ---- recording ------------------------------------------------------------------- */

void gm__trace_record_slow_locked(gm_pool_t *pool, int action, uintptr_t ptr, size_t size,
                                  gm_stream_t stream)
{
    struct gm__trace_buf *b = pool->trace_buf;
    uint64_t g = __atomic_load_n(&gen, __ATOMIC_ACQUIRE);
    if (GM_UNLIKELY(!b || b->n == BUF_RECORDS || b->gen != g)) {
        pthread_mutex_lock(&mu);
        if (b && b->n && b->gen == gen) enqueue(b);
        else buf_free(b);
        b = spares;
        if (b) {
            spares = b->next;
            n_spares--;
        }
        g = gen;
        pthread_mutex_unlock(&mu);
        if (!b) {
            b = gm__malloc(sizeof *b);
            if (b) b->sites = NULL;
        }
        pool->trace_buf = b;
        if (!b) return; /* out of host memory: this record is lost */
        b->n = 0;
        b->gen = g;
    }
    rec_t *r = &b->r[b->n++];
    r->tick = gm__ticks();
    r->ptr = ptr;
    r->size = size;
    r->stream = (uint64_t)(uintptr_t)stream;
    r->thread = thread_id();
    r->action = (uint32_t)action;
}

void gm__trace_site_locked(gm_pool_t *pool, void *const *frames, int n)
{
    struct gm__trace_buf *b = pool->trace_buf;
    if (!b || !b->n || b->r[b->n - 1].action != GM__TRACE_ALLOC) return;
    if (!b->sites) {
        b->sites = gm__calloc(BUF_RECORDS, sizeof b->sites[0]);
        if (!b->sites) return;
    }
    int k = gm__leak_first_user_frame(frames, n);
    for (int j = 0; j < SITE_FRAMES; j++) b->sites[b->n - 1][j] = k + j < n ? frames[k + j] : NULL;
    b->r[b->n - 1].action |= SITE;
}

void gm__trace_pool_flush(gm_pool_t *pool)
{
    gm__lock(&pool->lock);
    struct gm__trace_buf *b = pool->trace_buf;
    pool->trace_buf = NULL;
    gm__unlock(&pool->lock);
    pthread_mutex_lock(&mu);
    if (b && b->n && b->gen == gen && writer_running) {
        enqueue(b);
        b = NULL;
        wait_drained();
        if (file) fflush(file);
#ifdef GM_HAVE_ZLIB
        if (gz) gzflush(gz, Z_SYNC_FLUSH);
#endif
    }
    pthread_mutex_unlock(&mu);
    buf_free(b);
}

void gm__trace_pool_fini(gm_pool_t *pool)
{
    buf_free(pool->trace_buf);
    pool->trace_buf = NULL;
}

/* ---- start and stop --------------------------------------------------------------- */

/* Hand a heap's buffer to the writer. */
static void collect_heap(gm_pool_t *pool)
{
    gm__lock(&pool->lock);
    struct gm__trace_buf *b = pool->trace_buf;
    pool->trace_buf = NULL;
    gm__unlock(&pool->lock);
    if (!b) return;
    pthread_mutex_lock(&mu);
    if (b->n && b->gen == gen) enqueue(b);
    else buf_free(b);
    pthread_mutex_unlock(&mu);
}

static void collect(gm_pool_t *root, void *arg)
{
    (void)arg;
    gm_pool_t *h;
    for (unsigned i = 0; (h = gm__heap_next(root, &i));) collect_heap(h);
}

static int close_file_locked(void)
{
    int rc = 0;
    if (sites_file) {
        if (fclose(sites_file) != 0) rc = errno ? errno : EIO;
        sites_file = NULL;
    }
#ifdef GM_HAVE_ZLIB
    if (gz) {
        if (gzclose(gz) != Z_OK) rc = EIO;
        gz = NULL;
    }
#endif
    if (file) {
        if (fclose(file) != 0) rc = errno ? errno : EIO;
        file = NULL;
    }
    return rc;
}

/* life_mu held: stop the writer, close the file. */
static int stop_life_locked(void)
{
    if (!atomic_exchange(&gm__trace_on, 0)) return GM_OK;
    if (!writer_running) return GM_OK;
    gm__registry_foreach(collect, NULL);
    pthread_mutex_lock(&mu);
    wait_drained();
    writer_stop = true;
    pthread_cond_signal(&cv_work);
    pthread_mutex_unlock(&mu);
    pthread_join(writer, NULL);
    pthread_mutex_lock(&mu);
    writer_running = false;
    writer_stop = false;
    int err = close_file_locked();
    if (!err) err = write_error;
    while (spares) {
        struct gm__trace_buf *n = spares->next;
        buf_free(spares);
        spares = n;
    }
    n_spares = 0;
    pthread_mutex_unlock(&mu);
    if (err)
        return gm__set_error(GM_IO, "gm_trace_stop: writing %s failed: %s", path_now, strerror(err));
    return GM_OK;
}

/* Takes life_mu (and, inside, the registry, pool locks and mu). */
int gm_trace_stop(void)
{
    pthread_mutex_lock(&life_mu);
    int rc = stop_life_locked();
    pthread_mutex_unlock(&life_mu);
    return rc;
}

/* A child forked while tracing has no writer thread, and the file is the
 * parent's: it stops tracing without writing or closing anything (closing
 * would write the parent's buffered rows a second time). */
static void atfork_child(void)
{
    atomic_store(&gm__trace_on, 0);
    pthread_mutex_init(&life_mu, NULL);
    pthread_mutex_init(&mu, NULL);
    queue_head = queue_tail = NULL;
    writer_running = writer_busy = writer_stop = false;
    file = NULL;
    sites_file = NULL;
#ifdef GM_HAVE_ZLIB
    gz = NULL;
#endif
    gen++; /* buffers the pools hold now belong to no trace */
}

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void install_atfork(void) { pthread_atfork(NULL, NULL, atfork_child); }

int gm_trace_start(const char *path)
{
    pthread_once(&atfork_once, install_atfork);
    if (!path || !*path) return gm__set_error(GM_INVALID_ARGUMENT, "gm_trace_start: no path");
    if (strlen(path) >= sizeof path_now)
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_trace_start: path too long");
    size_t n = strlen(path);
    bool gzip = n > 3 && !strcmp(path + n - 3, ".gz");
#ifndef GM_HAVE_ZLIB
    if (gzip)
        return gm__set_error(GM_NOT_SUPPORTED, "gm_trace_start: %s: this build has no zlib for "
                             "gzip output; use a path without .gz", path);
#endif
    pthread_mutex_lock(&life_mu);
    int rc = stop_life_locked();
    if (rc != GM_OK) {
        pthread_mutex_unlock(&life_mu);
        return rc;
    }
    pthread_mutex_lock(&mu);
    const char *header = GM__TRACE_HEADER_LINE;
#ifdef GM_HAVE_ZLIB
    if (gzip) {
        gz = gzopen(path, "wb1");
        if (!gz) rc = gm__set_error(GM_IO, "gm_trace_start: cannot create %s: %s", path, strerror(errno));
    } else
#endif
    {
        file = fopen(path, "w");
        if (!file) rc = gm__set_error(GM_IO, "gm_trace_start: cannot create %s: %s", path, strerror(errno));
    }
    if (rc == GM_OK) {
        snprintf(path_now, sizeof path_now, "%s", path);
        write_error = 0;
        rows_written = 0;
        char sp[sizeof path_now + 8];
        snprintf(sp, sizeof sp, "%s.sites", path);
        remove(sp); /* an old side file would not match this trace */
        out_write(header, strlen(header));
        ns_per_tick = gm__ns_per_tick();
        start_tick = gm__ticks();
        if (pthread_create(&writer, NULL, writer_main, NULL) != 0) {
            close_file_locked();
            rc = gm__set_error(GM_IO, "gm_trace_start: cannot start the writer thread");
        } else {
            writer_running = true;
            __atomic_store_n(&gen, gen + 1, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&mu);
    if (rc == GM_OK) atomic_store(&gm__trace_on, 1);
    pthread_mutex_unlock(&life_mu);
    return rc;
}
