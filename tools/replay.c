/* SPDX-License-Identifier: Apache-2.0 */
/*
 * replay.c — `gpumem replay`: run recorded allocation traces through a fresh
 * pool each and report how much memory the pool held against what the trace
 * needed (reserved peak / live peak), how fast it answered, and which
 * backend (driver) calls it made.
 *
 * The one idea: measure the allocator, not the tool.  Every file is read
 * once before anything runs (a bad file fails fast with exit 2, and its trace
 * bugs are reported, or with --strict refused, before any replay); then each
 * pass reads it again through the streaming reader (tools/lib/trace_read.h), a chunk of
 * ops at a time, so memory stays bounded however long the trace.  The ops
 * are already dense slot ids, so the timed loop over a chunk is array
 * indexing plus gm_alloc/gm_free, with one clock read on each side of the
 * chunk: reading and parsing are not timed.
 * Stats are read just outside that loop, so backend_ns, backend calls and
 * modeled device time are those of the trace's own ops: pool creation and
 * the frees of what a pass leaves live are not counted.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "gpumem.h"
#include "base/internal.h"
#include "lib/replay_step.h"
#include "lib/trace_read.h"

#define PROGRESS_MIN_OPS 100000u      /* show progress for longer replays ... */
#define PROGRESS_MIN_NS 1000000000u   /* ... or ones running longer than 1 s */
#define PROGRESS_EVERY_NS 100000000u  /* redraw at most 10 times a second */

typedef struct options {
    int json;
    int strict;
    gm_backend_kind_t backend;
    size_t capacity;
    unsigned long repeat;
} options_t;

/* What one trace's replay measured (over all passes). */
typedef struct result {
    char backend[16];
    uint64_t ops;                   /* ops replayed: n_ops * repeat */
    uint64_t wall_ns, backend_ns, modeled_ns; /* inside the timed loops */
    uint64_t reserved_peak;
    uint64_t calls[GM_CALL_COUNT];  /* inside the timed loops */
    uint64_t steady_calls;          /* inside the loops of passes 2..N */
    uint64_t steady_wall_ns, steady_backend_ns; /* the same loops' times */
    uint64_t failed_allocs, failed_frees;
    char first_failure[256];
} result_t;

void gm_cli_replay_usage(FILE *out)
{
    fprintf(out,
            "usage: gpumem replay [--json] [--strict] [--backend sim|cuda|auto]\n"
            "                     [--capacity BYTES] [--repeat N] TRACE...\n\n"
            "Replay RMM logging CSV traces (Thread,Time,Action,Pointer,Size,Stream; plain\n"
            "or gzip) through a fresh pool each, single-threaded, and report ops, live\n"
            "peak, reserved peak, their ratio, ns per op (total, and allocator = total\n"
            "minus time inside backend calls), backend calls, modeled device time and\n"
            "failed allocations.\n\n"
            "  --json          one JSON object per trace per line\n"
            "  --strict        trace bugs (double or unknown frees, allocates of a live\n"
            "                  pointer, frees whose size differs from the allocate's)\n"
            "                  are errors: exit 2 before any replay; without it they are\n"
            "                  one warning line per trace on stderr, and replayed as\n"
            "                  the trace reader resolves them (docs/workloads.md)\n"
            "  --backend B     sim (default), cuda or auto\n"
            "  --capacity B    sim device size, e.g. 16GiB (default: the sim's own)\n"
            "  --repeat N      replay each trace N times in the same pool, freeing what a\n"
            "                  pass leaves live; steady_backend_calls = calls in passes 2..N\n"
            "                  (each pass reads the file again: memory stays bounded)\n\n"
            "Progress goes to stderr when it is a terminal.  Exit status: 0 ok, 1 a\n"
            "pool could not be made, 2 bad usage, an unreadable or malformed trace, or\n"
            "trace bugs under --strict.\n");
}

static uint64_t udiff(uint64_t after, uint64_t before) { return after > before ? after - before : 0; }

/* The progress line, redrawn in place; erased with "\r\033[K" at the end. */
typedef struct progress {
    int on;          /* stderr is a terminal */
    int shown;       /* something to erase */
    uint64_t start, last;
} progress_t;

static int progress_due(progress_t *pg, uint64_t work)
{
    if (!pg->on) return 0;
    uint64_t now = gm__now_ns();
    if ((work > PROGRESS_MIN_OPS || now - pg->start > PROGRESS_MIN_NS) &&
        now - pg->last >= PROGRESS_EVERY_NS) {
        pg->last = now;
        pg->shown = 1;
        return 1;
    }
    return 0;
}

static void progress_erase(progress_t *pg)
{
    if (pg->shown) fprintf(stderr, "\r\033[K");
    fflush(stderr);
    pg->shown = 0;
}

static void show_progress(const char *name, unsigned long pass, unsigned long passes,
                          size_t done, size_t n)
{
    int pct = n ? (int)(100.0 * (double)done / (double)n) : 100;
    if (passes > 1)
        fprintf(stderr, "\rreplay %s: pass %lu/%lu %3d%%", name, pass + 1, passes, pct);
    else
        fprintf(stderr, "\rreplay %s: %3d%%", name, pct);
    fflush(stderr);
}

static void note_failure(result_t *r, const char *what, int rc)
{
    if (r->failed_allocs + r->failed_frees == 1)
        snprintf(r->first_failure, sizeof r->first_failure, "%s: %s: %s", what, gm_errname(rc),
                 gm_last_error());
}

/* The ops of one chunk through the pool: the timed loop (replay_step and
 * the pool's two calls inline into it). */
static void replay_chunk(replay_pool_t *tg, const gm__trace_op_t *ops, size_t n,
                         const replay_slots_t *sl, result_t *r)
{
    for (size_t i = 0; i < n; i++) {
        int rc = replay_step(sl, &ops[i], replay_pool_alloc, replay_pool_free, tg);
        if (GM_UNLIKELY(rc != GM_OK)) {
            if (ops[i].action == GM__TRACE_ALLOC) {
                r->failed_allocs++;
                note_failure(r, "allocate", rc);
            } else {
                r->failed_frees++;
                note_failure(r, "free", rc);
            }
        }
    }
}

/* Replay the trace t describes (read before: n_slots, n_streams, streams)
 * through a new pool, reading the file again for each pass.  0; 1 when no
 * pool could be made; 2 when the file no longer reads as it did. */
static int replay_trace(const gm__trace_t *t, const options_t *o, result_t *r)
{
    /* The environment's pool options apply (GPUMEM_RESERVE_SLACK_MAX ...);
     * the backend and capacity are the command line's. */
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    gm_pool_t *pool = NULL;
    progress_t pg = {isatty(STDERR_FILENO), 0, gm__now_ns(), 0};
    memset(r, 0, sizeof *r);
    int crc = gm_config_from_env(&cfg);
    cfg.backend = o->backend;
    cfg.sim_capacity = o->capacity;
    if (crc != GM_OK || gm_pool_create(&cfg, &pool) != GM_OK) {
        fprintf(stderr, "error: %s: cannot create a pool: %s\n", t->name, gm_last_error());
        return 1;
    }
    gm_device_info_t di = GM_DEVICE_INFO_INIT;
    if (gm_pool_device_info(pool, &di) == GM_OK)
        snprintf(r->backend, sizeof r->backend, "%s", di.backend_name);

    size_t n_slots = t->n_slots ? t->n_slots : 1;
    void **ptrs = calloc(n_slots, sizeof *ptrs);            /* live block per slot */
    uint64_t *slot_size = calloc(n_slots, sizeof *slot_size);
    uint16_t *slot_stream = calloc(n_slots, sizeof *slot_stream);
    gm_stream_t *streams = calloc(t->n_streams ? t->n_streams : 1, sizeof *streams);
    gm__trace_reader_t *reader = NULL;
    int rc = 1;
    const replay_slots_t slots = {ptrs, slot_size, slot_stream};
    replay_pool_t target = {pool, streams};
    if (!ptrs || !slot_size || !slot_stream || !streams) {
        fprintf(stderr, "error: %s: out of host memory\n", t->name);
        goto done;
    }
    /* Stream 0 is the default stream; every other value gets a stream of
     * its own from the backend (a real CUstream on cuda). */
    for (uint32_t s = 0; s < t->n_streams; s++) {
        if (t->streams[s] && gm_stream_create(pool, &streams[s]) != GM_OK) {
            fprintf(stderr, "error: %s: cannot create a stream: %s\n", t->name, gm_last_error());
            goto done;
        }
    }

    uint64_t total_ops = (uint64_t)t->n_ops * o->repeat;
    for (unsigned long pass = 0; pass < o->repeat; pass++) {
        gm_stats_t before = GM_STATS_INIT, after = GM_STATS_INIT;
        uint64_t wall = 0;
        size_t done_ops = 0;
        if (gm__trace_open(t->name, &reader) != GM_OK) {
            fprintf(stderr, "error: %s\n", gm_last_error());
            rc = 2;
            goto done;
        }
        gm_pool_stats(pool, &before);
        for (;;) {
            const gm__trace_op_t *ops;
            size_t n;
            if (gm__trace_next(reader, &ops, &n) != GM_OK) {
                fprintf(stderr, "error: %s\n", gm_last_error());
                rc = 2;
                goto done;
            }
            if (n == 0) break;
            const gm__trace_t *h = gm__trace_header(reader);
            if (h->n_slots > t->n_slots || h->n_streams > t->n_streams) {
                fprintf(stderr, "error: %s: the file changed since it was read\n", t->name);
                rc = 2;
                goto done;
            }
            uint64_t t0 = gm__now_ns();
            replay_chunk(&target, ops, n, &slots, r);
            wall += gm__now_ns() - t0;
            done_ops += n;
            if (done_ops < t->n_ops && progress_due(&pg, total_ops))
                show_progress(t->name, pass, o->repeat, done_ops, t->n_ops);
        }
        gm_pool_stats(pool, &after);
        int changed = gm__trace_header(reader)->n_ops != t->n_ops;
        gm__trace_close(reader, NULL);
        reader = NULL;
        if (changed) {
            fprintf(stderr, "error: %s: the file changed since it was read\n", t->name);
            rc = 2;
            goto done;
        }

        r->wall_ns += wall;
        r->backend_ns += udiff(after.backend_ns, before.backend_ns);
        if (pass > 0) {
            r->steady_wall_ns += wall;
            r->steady_backend_ns += udiff(after.backend_ns, before.backend_ns);
        }
        r->modeled_ns += udiff(after.modeled_device_ns, before.modeled_device_ns);
        for (int k = 0; k < GM_CALL_COUNT; k++) {
            uint64_t d = udiff(after.backend_calls[k], before.backend_calls[k]);
            r->calls[k] += d;
            if (pass > 0) r->steady_calls += d;
        }
        /* End of pass: free what the trace left live, on its own stream. */
        for (size_t s = 0; s < t->n_slots; s++) {
            if (!ptrs[s]) continue;
            int rc = gm_free(pool, ptrs[s], streams[slot_stream[s]]);
            if (rc != GM_OK) {
                r->failed_frees++;
                note_failure(r, "free", rc);
            }
            ptrs[s] = NULL;
        }
    }

    gm_stats_t end = GM_STATS_INIT;
    gm_pool_stats(pool, &end);
    r->reserved_peak = end.reserved_peak;
    r->ops = total_ops;
    rc = 0;
done:
    progress_erase(&pg);
    gm__trace_close(reader, NULL);
    for (uint32_t s = 0; streams && s < t->n_streams; s++)
        if (streams[s]) gm_stream_destroy(pool, streams[s]);
    free(ptrs);
    free(slot_size);
    free(slot_stream);
    free(streams);
    gm_pool_destroy(pool);
    return rc;
}

/* Read a trace through once, keeping only its header (counts, slots,
 * streams): what the replay needs to know before it starts. */
static int read_trace(const char *path, gm__trace_t *t)
{
    gm__trace_reader_t *reader;
    memset(t, 0, sizeof *t);
    GM_CHECK(gm__trace_open(path, &reader));
    progress_t pg = {isatty(STDERR_FILENO), 0, gm__now_ns(), 0};
    for (;;) {
        const gm__trace_op_t *ops;
        size_t n;
        int rc = gm__trace_next(reader, &ops, &n);
        if (rc != GM_OK) {
            progress_erase(&pg);
            gm__trace_close(reader, NULL);
            return rc;
        }
        if (n == 0) break;
        if (progress_due(&pg, 0)) {
            fprintf(stderr, "\rreading %s: %zu ops", path, gm__trace_header(reader)->n_ops);
            fflush(stderr);
        }
    }
    progress_erase(&pg);
    gm__trace_close(reader, t);
    return GM_OK;
}

/* One line on stderr about t's trace bugs, if it has any: 1 if so. */
static int report_trace_bugs(const gm__trace_t *t, int strict)
{
    uint64_t unknown = t->unknown_frees - t->double_frees;
    if (!unknown && !t->double_frees && !t->dup_allocs && !t->free_size_mismatches) return 0;
    fprintf(stderr, "%s: %s: trace bugs:", strict ? "error" : "warning", t->name);
    const char *sep = " ";
    if (t->double_frees) {
        fprintf(stderr, "%s%llu double free%s (first on line %zu)", sep,
                (unsigned long long)t->double_frees, t->double_frees == 1 ? "" : "s",
                t->first_double_free_line);
        sep = ", ";
    }
    if (unknown) {
        fprintf(stderr, "%s%llu free%s of a pointer never allocated (first on line %zu)", sep,
                (unsigned long long)unknown, unknown == 1 ? "" : "s", t->first_unknown_free_line);
        sep = ", ";
    }
    if (t->dup_allocs) {
        fprintf(stderr, "%s%llu allocate%s of a live pointer (first on line %zu)", sep,
                (unsigned long long)t->dup_allocs, t->dup_allocs == 1 ? "" : "s",
                t->first_dup_alloc_line);
        sep = ", ";
    }
    if (t->free_size_mismatches) {
        fprintf(stderr, "%s%llu free%s whose size differs from the allocate's (first on line %zu)",
                sep, (unsigned long long)t->free_size_mismatches,
                t->free_size_mismatches == 1 ? "" : "s", t->first_size_mismatch_line);
    }
    fprintf(stderr, strict ? "\n" : "; replayed as: frees of dead pointers skipped, a live "
                                     "pointer freed before its new allocate, frees with the "
                                     "allocate's size\n");
    return 1;
}

static double per_op(uint64_t ns, uint64_t ops) { return ops ? (double)ns / (double)ops : 0.0; }
static double ratio_of(const gm__trace_t *t, const result_t *r)
{
    return t->live_peak ? (double)r->reserved_peak / (double)t->live_peak : 0.0;
}
static uint64_t allocator_ns(const result_t *r)
{
    return r->wall_ns > r->backend_ns ? r->wall_ns - r->backend_ns : 0;
}

static void print_json(const gm__trace_t *t, const result_t *r, const options_t *o)
{
    printf("{\"trace\":");
    gm_cli_json_string(stdout, t->name);
    printf(",\"backend\":");
    gm_cli_json_string(stdout, r->backend);
    printf(",\"ops\":%zu,\"repeat\":%lu,\"live_peak\":%llu,\"reserved_peak\":%llu", t->n_ops,
           o->repeat, (unsigned long long)t->live_peak, (unsigned long long)r->reserved_peak);
    if (t->live_peak)
        printf(",\"ratio\":%.3f", ratio_of(t, r));
    else
        printf(",\"ratio\":null");
    printf(",\"ns_per_op\":%.1f,\"allocator_ns_per_op\":%.1f,\"modeled_device_ms\":%.3f",
           per_op(r->wall_ns, r->ops), per_op(allocator_ns(r), r->ops), (double)r->modeled_ns / 1e6);
    printf(",\"backend_calls\":{");
    const char *sep = "";
    for (int k = 0; k < GM_CALL_COUNT; k++) {
        if (!r->calls[k]) continue;
        printf("%s\"%s\":%llu", sep, gm_call_name(k), (unsigned long long)r->calls[k]);
        sep = ",";
    }
    printf("}");
    if (o->repeat > 1) {
        uint64_t steady_ops = (uint64_t)t->n_ops * (o->repeat - 1);
        uint64_t alloc_ns = r->steady_wall_ns > r->steady_backend_ns
                                ? r->steady_wall_ns - r->steady_backend_ns : 0;
        printf(",\"steady_backend_calls\":%llu,\"steady_allocator_ns_per_op\":%.1f",
               (unsigned long long)r->steady_calls, per_op(alloc_ns, steady_ops));
    } else {
        printf(",\"steady_backend_calls\":null,\"steady_allocator_ns_per_op\":null");
    }
    printf(",\"failed_allocs\":%llu,\"unknown_frees\":%llu,\"allocate_failure_rows\":%llu"
           ",\"dup_allocs\":%llu",
           (unsigned long long)r->failed_allocs, (unsigned long long)t->unknown_frees,
           (unsigned long long)t->alloc_failures, (unsigned long long)t->dup_allocs);
    printf(",\"double_frees\":%llu,\"free_size_mismatches\":%llu,\"first_bug_lines\":{",
           (unsigned long long)t->double_frees, (unsigned long long)t->free_size_mismatches);
    sep = "";
    const struct { const char *name; size_t line; } bug_lines[] = {
        {"unknown_free", t->first_unknown_free_line}, {"double_free", t->first_double_free_line},
        {"dup_alloc", t->first_dup_alloc_line}, {"size_mismatch", t->first_size_mismatch_line}};
    for (size_t k = 0; k < sizeof bug_lines / sizeof bug_lines[0]; k++) {
        if (!bug_lines[k].line) continue;
        printf("%s\"%s\":%zu", sep, bug_lines[k].name, bug_lines[k].line);
        sep = ",";
    }
    printf("}");
    if (r->first_failure[0]) {
        printf(",\"first_failure\":");
        gm_cli_json_string(stdout, r->first_failure);
    }
    printf("}\n");
    fflush(stdout);
}

/* Human output: every cell formatted first, so columns fit their widest
 * cell; names left-aligned, numbers right-aligned. */
enum { COLS = 10 };
typedef char cell_t[40];

/* One line: the trace name (column 0, never cut to a cell), then the rest. */
static void print_row(const char *name, cell_t *row, const int *width)
{
    printf("%-*s", width[0], name);
    for (int c = 1; c < COLS; c++)
        printf(c == 1 ? "  %-*s" : "  %*s", width[c], row[c]);
    printf("\n");
}

static void print_table(const gm__trace_t *traces, const result_t *res, int n, const options_t *o)
{
    static const char *const head[COLS] = {"trace", "backend", "ops", "live peak",
                                           "reserved peak", "ratio", "ns/op", "alloc ns/op",
                                           "device ms", "failed"};
    if (n <= 0) return;
    cell_t *rows = calloc((size_t)n * COLS, sizeof *rows);
    int width[COLS] = {0};
    if (!rows) {
        fprintf(stderr, "error: out of host memory\n");
        return;
    }
    for (int i = 0; i < n; i++) {
        const gm__trace_t *t = &traces[i];
        const result_t *r = &res[i];
        cell_t *row = rows + (size_t)i * COLS;
        snprintf(row[1], sizeof row[1], "%s", r->backend);
        snprintf(row[2], sizeof row[2], "%zu", t->n_ops);
        gm__fmt_bytes(t->live_peak, row[3], sizeof row[3]);
        gm__fmt_bytes(r->reserved_peak, row[4], sizeof row[4]);
        if (t->live_peak)
            snprintf(row[5], sizeof row[5], "%.3f", ratio_of(t, r));
        else
            snprintf(row[5], sizeof row[5], "-");
        snprintf(row[6], sizeof row[6], "%.1f", per_op(r->wall_ns, r->ops));
        snprintf(row[7], sizeof row[7], "%.1f", per_op(allocator_ns(r), r->ops));
        snprintf(row[8], sizeof row[8], "%.3f", (double)r->modeled_ns / 1e6);
        snprintf(row[9], sizeof row[9], "%llu", (unsigned long long)r->failed_allocs);
    }
    for (int c = 0; c < COLS; c++) {
        width[c] = (int)strlen(head[c]);
        for (int i = 0; i < n; i++) {
            const char *cell = c == 0 ? traces[i].name : rows[(size_t)i * COLS + (size_t)c];
            int w = (int)strlen(cell);
            if (w > width[c]) width[c] = w;
        }
    }
    cell_t header[COLS];
    for (int c = 0; c < COLS; c++) snprintf(header[c], sizeof header[c], "%s", head[c]);
    print_row(head[0], header, width);
    for (int i = 0; i < n; i++) print_row(traces[i].name, rows + (size_t)i * COLS, width);
    free(rows);

    for (int i = 0; i < n; i++) {
        const gm__trace_t *t = &traces[i];
        const result_t *r = &res[i];
        printf("%s: backend calls:", t->name);
        int any = 0;
        for (int k = 0; k < GM_CALL_COUNT; k++) {
            if (!r->calls[k]) continue;
            printf("%s %s %llu", any ? "," : "", gm_call_name(k), (unsigned long long)r->calls[k]);
            any = 1;
        }
        if (!any) printf(" none");
        if (o->repeat > 1)
            printf("; in passes 2..%lu: %llu", o->repeat, (unsigned long long)r->steady_calls);
        if (t->unknown_frees)
            printf("; unknown frees skipped: %llu", (unsigned long long)t->unknown_frees);
        if (t->alloc_failures)
            printf("; allocate failure rows skipped: %llu", (unsigned long long)t->alloc_failures);
        if (t->dup_allocs)
            printf("; allocates of a live pointer (freed first): %llu",
                   (unsigned long long)t->dup_allocs);
        printf("\n");
    }
}

int gm_cli_replay(int argc, char **argv)
{
    options_t o = {0, 0, GM_BACKEND_SIM, 0, 1};
    gm__trace_t *traces = NULL;
    result_t *res = NULL;
    int n_files = 0, only_files = 0, status = 0, loaded = 0;
    char **files = calloc((size_t)argc, sizeof *files);
    if (!files) {
        fprintf(stderr, "error: out of host memory\n");
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int missing = 0;
        if (only_files || a[0] != '-') {
            files[n_files++] = argv[i];
        } else if (strcmp(a, "--") == 0) {
            only_files = 1;
        } else if (strcmp(a, "--json") == 0) {
            o.json = 1;
        } else if (strcmp(a, "--strict") == 0) {
            o.strict = 1;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            gm_cli_replay_usage(stdout);
            free(files);
            return 0;
        } else if ((v = gm_cli_option(argc, argv, &i, "backend", &missing))) {
            if (gm_cli_parse_backend(v, &o.backend)) goto usage;
        } else if ((v = gm_cli_option(argc, argv, &i, "capacity", &missing))) {
            if (gm__parse_size(v, &o.capacity) != GM_OK) {
                fprintf(stderr, "gpumem replay: --capacity: %s\n", gm_last_error());
                goto usage;
            }
        } else if ((v = gm_cli_option(argc, argv, &i, "repeat", &missing))) {
            char *end;
            unsigned long long n = strtoull(v, &end, 10);
            if (v[0] < '0' || v[0] > '9' || *end != '\0' || n < 1 || n > 1000000000ull) {
                fprintf(stderr, "gpumem replay: --repeat: expected a count from 1, got '%s'\n", v);
                goto usage;
            }
            o.repeat = (unsigned long)n;
        } else {
            if (!missing) fprintf(stderr, "gpumem replay: unknown option '%s'\n", a);
            goto usage;
        }
    }
    if (n_files == 0) {
        fprintf(stderr, "gpumem replay: no trace given\n");
        goto usage;
    }

    /* Read everything first: a malformed file, or a trace bug under
     * --strict, stops us before any replay. */
    traces = calloc((size_t)n_files, sizeof *traces);
    res = calloc((size_t)n_files, sizeof *res);
    if (!traces || !res) {
        fprintf(stderr, "error: out of host memory\n");
        status = 1;
        goto out;
    }
    for (; loaded < n_files; loaded++) {
        if (read_trace(files[loaded], &traces[loaded]) != GM_OK) {
            fprintf(stderr, "error: %s\n", gm_last_error());
            status = 2;
            goto out;
        }
    }
    int bugs = 0;
    for (int i = 0; i < n_files; i++) bugs += report_trace_bugs(&traces[i], o.strict);
    if (bugs && o.strict) {
        status = 2;
        goto out;
    }
    for (int i = 0; i < n_files; i++) {
        int rc = replay_trace(&traces[i], &o, &res[i]);
        if (rc != 0) {
            status = rc;
            goto out;
        }
        if (o.json) print_json(&traces[i], &res[i], &o);
        if (res[i].failed_allocs || res[i].failed_frees)
            fprintf(stderr, "warning: %s: %llu allocations and %llu frees failed; first: %s\n",
                    traces[i].name, (unsigned long long)res[i].failed_allocs,
                    (unsigned long long)res[i].failed_frees, res[i].first_failure);
    }
    if (!o.json) print_table(traces, res, n_files, &o);

out:
    for (int i = 0; i < loaded; i++) gm__trace_free(&traces[i]);
    free(traces);
    free(res);
    free(files);
    return status;

usage:
    gm_cli_replay_usage(stderr);
    free(files);
    return 2;
}
