/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_util.h — what the multi-process benchmarks (share_bench.c,
 * broker_bench.c) share: a monotonic clock and sleeps, medians and
 * quantiles, switches from the environment, the coordinator's list of
 * failures, a forked child's first steps and how a child ended, and the JSON
 * and Markdown writers with the head and tail every result file has.
 *
 * Define BENCH_NAME (the bench's name: the prefix of what it says on stderr)
 * and, where a failure keeps other than 600 bytes, BENCH_ERROR_LEN before
 * including it, once, after the system headers (_GNU_SOURCE for strsignal).
 * The bench defines child_fail() (CK calls it in a child: report the failed
 * step, exit 1) and the coordinator sets g_coordinator before it forks.
 */
#ifndef GM_BENCH_UTIL_H
#define GM_BENCH_UTIL_H

#ifndef BENCH_NAME
#error "define BENCH_NAME (the bench's name) before including bench_util.h"
#endif
#ifndef BENCH_ERROR_LEN
#define BENCH_ERROR_LEN 600
#endif

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpumem.h"

/* ---- time: CLOCK_MONOTONIC seconds (system-wide: comparable between processes) ---- */

static inline double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* ---- statistics of runs: NAN when there are none; v is not reordered ---------- */

static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The q-quantile with linear interpolation between order statistics (as
 * numpy.percentile does; q = 0.5 is the median). */
static inline double quantile_of(const double *v, int n, double q)
{
    if (n <= 0) return NAN;
    double *s = malloc((size_t)n * sizeof *s);
    if (!s) return NAN;
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    double x = q * (n - 1);
    int i = (int)x;
    double r = i >= n - 1 ? s[n - 1] : s[i] + (x - i) * (s[i + 1] - s[i]);
    free(s);
    return r;
}

static inline double median_of(const double *v, int n) { return quantile_of(v, n, 0.5); }

static inline double max_of(const double *v, int n)
{
    double m = NAN;
    for (int i = 0; i < n; i++)
        if (isnan(m) || v[i] > m) m = v[i];
    return m;
}

/* ---- the environment and the process's limits ---------------------------------- */

/* The variable is set to exactly `value`. */
static inline bool env_is(const char *name, const char *value)
{
    const char *v = getenv(name);
    return v && strcmp(v, value) == 0;
}

/* A switch: set, not empty and not "0". */
static inline bool env_on(const char *name)
{
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

/* TMPDIR, or /tmp when it is unset, empty or too long for a socket path
 * (108 bytes) with a file name after it. */
static inline const char *bench_tmpdir(void)
{
    const char *tmp = getenv("TMPDIR");
    return !tmp || !*tmp || strlen(tmp) > 60 ? "/tmp" : tmp;
}

/* The sim holds one descriptor per 2 MiB page (an 8 GiB buffer: 4096): the
 * soft limit of open files up to the hard one. */
static inline void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* ---- the coordinator's failures: said on stderr, kept for the results ---------- */

#define MAX_ERRORS 64
static char g_errors[MAX_ERRORS][BENCH_ERROR_LEN];
static int g_nerrors;

static inline void add_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void add_error(const char *fmt, ...)
{
    char line[BENCH_ERROR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, BENCH_NAME ": FAILED %s\n", line);
    if (g_nerrors < MAX_ERRORS) memcpy(g_errors[g_nerrors++], line, sizeof line);
}

/* ---- children: forked by the coordinator, each runs a child_fn and exits -------- */

typedef void (*child_fn)(const void *arg);

static pid_t g_coordinator; /* the coordinator's pid (main sets it) */

/* Defined by the bench: a child's failed step (and gm_last_error()) to the
 * coordinator, then _exit(1). */
static void child_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* A gm call that must succeed; its step and gm_last_error() go to the
 * coordinator otherwise. */
#define CK(expr, step)                                                         \
    do {                                                                       \
        int ck_ = (expr);                                                      \
        if (ck_ != GM_OK)                                                      \
            child_fail("%s: %s (%s)", step, gm_errname(ck_), gm_last_error()); \
    } while (0)

static inline gm_stats_t pool_stats(gm_pool_t *pool)
{
    gm_stats_t st = GM_STATS_INIT;
    CK(gm_pool_stats(pool, &st), "gm_pool_stats");
    return st;
}

/* The coordinator: its children killed on SIGINT, SIGTERM and SIGHUP (by
 * on_signal), a write to a closed pipe an error, not a death. */
static inline void bench_coordinator_signals(void (*on_signal)(int))
{
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);
    signal(SIGPIPE, SIG_IGN);
}

/* A child's first steps after fork: the coordinator's handlers undone, dead
 * with the coordinator (PR_SET_PDEATHSIG; exit 3 when it is gone already),
 * by alarm() after alarm_s at worst, and the open files limit raised. */
static inline void bench_child_init(unsigned alarm_s)
{
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != g_coordinator) _exit(3);
    alarm(alarm_s);
    raise_nofile();
}

/* What the coordinator learns from its first child's pool (gm_pool_device_info). */
typedef struct info {
    bool ok;
    char device_name[128], backend_name[32];
    int backend, device, driver_version;
    uint64_t total_memory, free_memory, granularity;
} info_t;

/* A wait status in words. */
static inline void describe_status(int st, char *buf, size_t cap)
{
    if (WIFEXITED(st)) snprintf(buf, cap, "exited with status %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st)) snprintf(buf, cap, "killed by signal %d (%s)%s", WTERMSIG(st),
                                       strsignal(WTERMSIG(st)),
                                       WTERMSIG(st) == SIGALRM ? ": its alarm ran out" : "");
    else snprintf(buf, cap, "status %#x", st);
}

/* ---- JSON: NAN and infinities are null, whole numbers have no decimals ---------- */

static inline void jstr(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p == '\n') fputs("\\n", f);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

static inline void jnum(FILE *f, double v)
{
    if (isnan(v) || isinf(v)) fputs("null", f);
    else if (fabs(v) < 1e15 && v == (double)(int64_t)v) fprintf(f, "%" PRId64, (int64_t)v);
    else fprintf(f, "%.6g", v);
}

static inline void jarr(FILE *f, const double *v, int n)
{
    fputc('[', f);
    for (int i = 0; i < n; i++) {
        if (i) fputc(',', f);
        jnum(f, v[i]);
    }
    fputc(']', f);
}

/* < 0: null (not measured) */
static inline void jbool(FILE *f, int v) { fputs(v < 0 ? "null" : v ? "true" : "false", f); }

/* ,"key": then the value */
static inline void jkey(FILE *f, const char *key) { fprintf(f, ",\"%s\":", key); }

static inline void jfield(FILE *f, const char *key, double v)
{
    jkey(f, key);
    jnum(f, v);
}

static inline void jfield_arr(FILE *f, const char *key, const double *v, int n)
{
    jkey(f, key);
    jarr(f, v, n);
}

/* < 0: null (not measured) */
static inline void jfield_bool(FILE *f, const char *key, int v)
{
    jkey(f, key);
    jbool(f, v);
}

/* NULL: null */
static inline void jfield_str(FILE *f, const char *key, const char *s)
{
    jkey(f, key);
    if (s) jstr(f, s); else fputs("null", f);
}

/* The first fields of every result: {"date", "command", "gpu", "backend",
 * "driver_version" (the last three null when no pool was made: !ok),
 * "commit"; the bench's fields follow. */
static inline void jhead(FILE *f, const char *date, const char *command, bool ok,
                         const char *gpu, const char *backend, int driver_version,
                         const char *commit)
{
    fputs("{\"date\":", f);
    jstr(f, date);
    jkey(f, "command");
    jstr(f, command);
    jkey(f, "gpu");
    if (ok) jstr(f, gpu); else fputs("null", f);
    jkey(f, "backend");
    if (ok) jstr(f, backend); else fputs("null", f);
    jkey(f, "driver_version");
    if (ok) jnum(f, driver_version); else fputs("null", f);
    jkey(f, "commit");
    jstr(f, commit);
}

/* The end of every result: closes the object open last, then "errors" (the
 * failures) and the whole. */
static inline void jerrors_end(FILE *f)
{
    fputs("},\"errors\":[", f);
    for (int i = 0; i < g_nerrors; i++) {
        if (i) fputc(',', f);
        jstr(f, g_errors[i]);
    }
    fputs("]}\n", f);
}

/* ---- Markdown: "—" for NAN, runs as a list -------------------------------------- */

static inline void fmt_num(char *buf, size_t cap, double v, const char *fmt)
{
    if (isnan(v)) snprintf(buf, cap, "—");
    else snprintf(buf, cap, fmt, v);
}

/* "a, b, c" (each with fmt), cut to fit; "none" for no runs. */
static inline void fmt_runs(char *buf, size_t cap, const double *v, int n, const char *fmt)
{
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < n && k + 1 < cap; i++) {
        char one[32];
        snprintf(one, sizeof one, fmt, v[i]);
        k += (size_t)snprintf(buf + k, cap - k, "%s%s", i ? ", " : "", one);
    }
    if (n == 0) snprintf(buf, cap, "none");
}

/* before, the runs v[0..n) as fmt_runs writes them (each with fmt), after. */
static inline void md_runs(FILE *f, const char *before, const double *v, int n, const char *fmt,
                           const char *after)
{
    char runs[1200];
    fmt_runs(runs, sizeof runs, v, n, fmt);
    fprintf(f, "%s%s%s", before, runs, after);
}

/* A row of the figures' table, "| label | v[0]; v[1]… | goal | met |": each
 * value with fmt ("—" for NAN); goal NULL: none (and no met). */
static inline void md_figure(FILE *f, const char *label, const double *v, int n, const char *fmt,
                          const char *goal, const char *met)
{
    fprintf(f, "| %s | ", label);
    for (int i = 0; i < n; i++) {
        char a[64];
        fmt_num(a, sizeof a, v[i], fmt);
        fprintf(f, "%s%s", i ? "; " : "", a);
    }
    if (goal) fprintf(f, " | %s | %s |\n", goal, met);
    else fputs(" | | |\n", f);
}

/* The failures as a list, when there were any. */
static inline void md_failures(FILE *f)
{
    if (!g_nerrors) return;
    fprintf(f, "Failures:\n\n");
    for (int i = 0; i < g_nerrors; i++) fprintf(f, "- %s\n", g_errors[i]);
    fputc('\n', f);
}

/* ---- main: what the results are labelled with, and the files they go to -------- */

/* What the results are labelled with: the command (`arg`, from --command,
 * else the set ones of envs[n] as "NAME=value " and then argv), today (UTC,
 * YYYY-MM-DD) and the commit (GM_COMMIT, or "unknown"). */
typedef struct bench_label {
    char command[1024], date[32];
    const char *commit;
} bench_label_t;

static inline void bench_label(bench_label_t *l, const char *arg, const char *const *envs, size_t n,
                               int argc, char **argv)
{
    const size_t cap = sizeof l->command;
    char *buf = l->command;
    buf[0] = 0;
    if (arg) {
        snprintf(buf, cap, "%s", arg);
    } else {
        size_t k = 0;
        for (size_t e = 0; e < n; e++)
            if (getenv(envs[e]) && k < cap)
                k += (size_t)snprintf(buf + k, cap - k, "%s=%s ", envs[e], getenv(envs[e]));
        for (int i = 0; i < argc && k < cap; i++)
            k += (size_t)snprintf(buf + k, cap - k, "%s%s", i ? " " : "", argv[i]);
    }
    time_t tt = time(NULL);
    struct tm tmv;
    gmtime_r(&tt, &tmv);
    strftime(l->date, sizeof l->date, "%Y-%m-%d", &tmv);
    const char *commit = getenv("GM_COMMIT");
    l->commit = commit && *commit ? commit : "unknown";
}

/* path opened for writing; NULL (said, *status = 1) when it cannot be. */
static inline FILE *bench_open(const char *path, int *status)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, BENCH_NAME ": cannot write %s: %s\n", path, strerror(errno));
        *status = 1;
    }
    return f;
}

/* Closes f unless it is stdout; *status = 1 when what was written did not
 * all get there. */
static inline void bench_close(FILE *f, int *status)
{
    if (f != stdout && fclose(f) != 0) *status = 1;
}

/* A bench's writer of one result file: f, its results, their label. */
typedef void (*bench_writer_fn)(FILE *f, const void *results, const bench_label_t *l);

/* The result files: json(f, results, l) into json_path (stdout without one,
 * or when it cannot be written), then md(...) into md_path when there is
 * one.  The exit status: 1 after failures or a file not all written, else 0. */
static inline int bench_write(const char *json_path, const char *md_path, bench_writer_fn json,
                              bench_writer_fn md, const void *results, const bench_label_t *l)
{
    int status = g_nerrors ? 1 : 0;
    FILE *jf = json_path ? bench_open(json_path, &status) : stdout;
    if (!jf) jf = stdout;
    json(jf, results, l);
    bench_close(jf, &status);
    FILE *mf = md_path ? bench_open(md_path, &status) : NULL;
    if (mf) {
        md(mf, results, l);
        bench_close(mf, &status);
    }
    return status;
}

#endif /* GM_BENCH_UTIL_H */
