/* SPDX-License-Identifier: Apache-2.0 */
/*
 * share_bench.c — sharing GPU memory between processes (gm_share_*), timed
 * between real processes.
 *
 *   import_us           an importer connects and imports one 1 GiB block
 *                       (gm_share_connect + gm_share_import, until it
 *                       returns mapped); median and p90 of 9 runs
 *   import_64_us        64 blocks of 16 MiB published under one name
 *                       (gm_share_publish_ranges) and imported in one
 *                       request (gm_share_import_ranges); median of 5;
 *                       _names_us: the same blocks, a name each, 64 imports
 *                       on one connection
 *   weight_sync_s       8 GiB of "weights" as one gm_alloc_shareable buffer
 *                       of 512 tensors, published under one name: from the
 *                       start of gm_share_publish in the exporter until the
 *                       importer has imported it and read one byte of every
 *                       tensor back; _per_tensor_s: 512 blocks under one
 *                       name; _per_name_s: 512 blocks, 512 names
 *   dead_importer_reclaim_ms   an importer holding an unpublished, freed
 *                       1 GiB block is killed (-9): from the exporter being
 *                       told until held_for_peers_bytes == 0 and the block
 *                       is gone from live_blocks; median of 5
 *   dead_exporter_reclaim_ms   the exporter is killed (-9) while an importer
 *                       maps its 1 GiB block: from kill() until the importer
 *                       has released it and the device's free memory is back
 *                       within 64 MiB of what it was before the exporter
 *                       allocated; median of 3
 *   readonly_enforced   an importer of a GM_SHARE_READ_ONLY name tries
 *                       gm_memset on it (in a child of its own: on a GPU the
 *                       fault may poison its context)
 *   legacy_ipc_open_us  cuda backend only: cuIpcOpenMemHandle of a 1 GiB
 *                       cuMemAlloc block (the CUDA driver API through
 *                       dlopen, declared here: no CUDA headers needed)
 *
 * Process rules: the coordinator (main) never makes a pool or a CUDA
 * context; it forks every exporter and importer fresh (each makes its own
 * pool), talks to them over pipes (every read bounded by PIPE_WAIT_MS) and
 * collects their figures.  Times that cross processes are CLOCK_MONOTONIC,
 * which is system-wide.  A child that fails sends the step and
 * gm_last_error() before it exits; the coordinator reports it, kills the
 * run's other children and goes on; the exit status is then 1.  Children
 * die with the coordinator (PR_SET_PDEATHSIG) and by alarm() at worst.
 *
 * Backend: GPUMEM_BACKEND=sim gives the sim (capacity 16 GiB unless
 * GPUMEM_SIM_CAPACITY says otherwise), unset gives GM_BACKEND_AUTO (cuda on
 * a GPU machine).  SHARE_BENCH_QUICK=1 scales the weight sync down to
 * 1 GiB.
 *
 * usage: share_bench [--json FILE] [--md FILE] [--command TEXT]
 *   JSON on stdout without --json; Markdown only with --md.
 *   bench/run_share_bench.sh builds and runs it on the GPU machine.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pipe2, strsignal (CMake defines it for the whole tree) */
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpumem.h"

#define BENCH_NAME "share_bench"
#define BENCH_ERROR_LEN 520
#include "bench_util.h"
#include "lib/procs.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

#ifndef PIPE_WAIT_MS
#define PIPE_WAIT_MS 120000  /* a message not there in this long: the other side hung */
#endif
#define CHILD_ALARM_S 900    /* a child still alive after this long dies (SIGALRM) */
#define RECLAIM_WAIT_S 20.0  /* reclaim polls give up after this long (a result, not a failure) */
#define POLL_US 100          /* reclaim poll period */

#define IMPORT_RUNS 9
#define IMPORT64_RUNS 5
#define IMPORT64_BLOCKS 64
#define DEAD_IMPORTER_RUNS 5
#define DEAD_EXPORTER_RUNS 3
#define LEGACY_PAIRS 9
#define TENSORS 512
#define SLACK_BYTES (64 * MiB) /* dead exporter: free memory back within this */

/* ---- small helpers ---------------------------------------------------------- */

/* Copy the string in src[scap] into dst[cap], cut to fit, always
 * terminated (src need not be: it may come from a pipe). */
static void copy_str(char *dst, size_t cap, const char *src, size_t scap)
{
    if (cap == 0) return;
    size_t n = strnlen(src, cap - 1 < scap ? cap - 1 : scap);
    memcpy(dst, src, n);
    dst[n] = 0;
}

static bool quick(void) { return env_on("SHARE_BENCH_QUICK"); }

/* The fill byte of tensor i (never 0: a missing mapping reads as zeros on
 * the sim's fresh pages). */
static unsigned char tensor_byte(int i) { return (unsigned char)(1 + (i * 37) % 251); }

/* ---- messages over the pipes ------------------------------------------------ */

enum {
    M_READY = 1, /* child -> parent: set up, waiting */
    M_GO,        /* parent -> child: start (t, u[], blob as the step needs) */
    M_RESULT,    /* child -> parent: figures in v[] / u[] / text */
    M_PUBLISHED, /* exporter -> parent: t = when gm_share_publish started */
    M_IMPORTED,  /* importer -> parent: holds its import now */
    M_FREE,      /* parent -> exporter: unpublish and gm_free */
    M_FREED,     /* exporter -> parent */
    M_KILLED,    /* parent -> survivor: the other side was killed at t */
    M_CHECK,     /* parent -> exporter: read the block back */
    M_DONE,      /* parent -> child: finish and exit */
    M_INFO,      /* info child -> parent */
    M_FAIL,      /* child -> parent: text = the step and the error */
};

typedef struct msg {
    int32_t type, rc;
    double t;             /* a CLOCK_MONOTONIC time, seconds */
    double v[16];
    uint64_t u[4];
    unsigned char blob[64];
    char text[400];
} msg_t;
/* One write each, never split (PIPE_BUF is at least 512 by POSIX, 4096 on Linux). */
_Static_assert(sizeof(msg_t) <= 4096, "a message fits one atomic pipe write");

static void msg_init(msg_t *m, int type)
{
    memset(m, 0, sizeof *m);
    m->type = type;
}

static int write_msg(int fd, const msg_t *m)
{
    ssize_t n;
    do n = write(fd, m, sizeof *m);
    while (n < 0 && errno == EINTR);
    return n == (ssize_t)sizeof *m ? 0 : -1;
}

/* 0: a message; 1: timeout; 2: end of file; -1: an error (errno). */
static int read_msg(int fd, msg_t *m, int wait_ms)
{
    size_t got = 0;
    double deadline = now() + wait_ms / 1e3;
    while (got < sizeof *m) {
        int left = (int)((deadline - now()) * 1e3);
        if (left < 0) return 1;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, left);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) return 1;
        ssize_t n = read(fd, (char *)m + got, sizeof *m - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -1;
        if (n == 0) return 2;
        got += (size_t)n;
    }
    return 0;
}

/* ---- the child's side ------------------------------------------------------- */

static int g_in = -1, g_out = -1; /* a child's pipes from and to the parent */
static const char *g_role = "coordinator";

static void child_send(msg_t *m)
{
    if (write_msg(g_out, m) != 0) _exit(3); /* the parent is gone */
}

/* The step that failed (and gm_last_error()) to the coordinator over the
 * pipe, then exit 1; CK (bench_util.h) calls it. */
static void child_fail(const char *fmt, ...)
{
    msg_t m;
    msg_init(&m, M_FAIL);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m.text, sizeof m.text, fmt, ap);
    va_end(ap);
    /* The coordinator prints it; here only when it cannot be told. */
    if (write_msg(g_out, &m) != 0)
        fprintf(stderr, "share_bench %s (pid %d): FAILED %s\n", g_role, (int)getpid(), m.text);
    _exit(1);
}

/* The parent's next message, which must be of `type`. */
static void child_wait(int type, msg_t *m, const char *what)
{
    int r = read_msg(g_in, m, PIPE_WAIT_MS);
    if (r == 2) _exit(3); /* the parent is gone */
    if (r == 1) child_fail("waiting for the coordinator (%s): nothing in %d s", what, PIPE_WAIT_MS / 1000);
    if (r != 0) child_fail("waiting for the coordinator (%s): %s", what, strerror(errno));
    if (m->type != type) child_fail("waiting for the coordinator (%s): message %d, not %d", what, m->type, type);
}

static void child_tell(int type)
{
    msg_t m;
    msg_init(&m, type);
    child_send(&m);
}

/* This process's pool: GPUMEM_BACKEND=sim -> the sim (16 GiB unless
 * GPUMEM_SIM_CAPACITY is set), unset -> AUTO, anything else as the
 * environment says. */
static gm_pool_t *child_pool(void)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    CK(gm_config_from_env(&cfg), "gm_config_from_env");
    if (env_is("GPUMEM_BACKEND", "sim")) {
        cfg.backend = GM_BACKEND_SIM;
        if (!getenv("GPUMEM_SIM_CAPACITY")) cfg.sim_capacity = 16 * GiB;
    } else if (!getenv("GPUMEM_BACKEND") || !*getenv("GPUMEM_BACKEND")) {
        cfg.backend = GM_BACKEND_AUTO;
    }
    gm_pool_t *pool;
    CK(gm_pool_create(&cfg, &pool), "gm_pool_create");
    return pool;
}

/* A child's first steps: its pool (and a stream into *s, unless s is
 * NULL), READY told, then the coordinator's GO read into *m (`go`: what the
 * child waits for, for the errors). */
static gm_pool_t *child_start(gm_stream_t *s, msg_t *m, const char *go)
{
    gm_pool_t *pool = child_pool();
    if (s) CK(gm_stream_create(pool, s), "gm_stream_create");
    child_tell(M_READY);
    child_wait(M_GO, m, go);
    return pool;
}

/* Poll done(arg) every POLL_US from t0 on, until it holds (true) or
 * RECLAIM_WAIT_S have gone by (false); *t1: when the last poll ended. */
static bool poll_until(bool (*done)(void *arg), void *arg, double t0, double *t1)
{
    for (;;) {
        bool ok = done(arg);
        *t1 = now();
        if (ok) return true;
        if (*t1 - t0 > RECLAIM_WAIT_S) return false;
        sleep_us(POLL_US);
    }
}

/* ---- the coordinator's side ------------------------------------------------- */

typedef struct child {
    pid_t pid;      /* 0: none, or reaped */
    int to, from;   /* pipes to and from it */
    const char *role;
} child_t;

/* Its pipes closed; it is none. */
static void forget_kid(child_t *c)
{
    tp_kid_t k = {c->pid, c->to, c->from, 0};
    tp_kid_close(&k);
    c->to = c->from = -1;
    c->pid = 0;
}

/* Kill -9 and reap (no-op for none). */
static void kill_kid(child_t *c)
{
    if (c->pid > 0) {
        kill(c->pid, SIGKILL);
        while (waitpid(c->pid, NULL, 0) < 0 && errno == EINTR) {}
        tp_untrack(c->pid);
    }
    forget_kid(c);
}

/* What spawn's child runs (tests/lib/procs.h forks it, with the pipes). */
static struct { const char *role; child_fn fn; const void *arg; } g_spawn;

static void spawned(tp_child_fn unused, tp_link_t *l, void *unused_arg)
{
    (void)unused;
    (void)unused_arg;
    g_in = l->in;
    g_out = l->out;
    g_role = g_spawn.role;
    bench_child_init(CHILD_ALARM_S);
    g_spawn.fn(g_spawn.arg);
    _exit(0);
}

/* Fork a child that runs fn(arg) and exits.  -1 (recorded) on failure. */
static int spawn(child_t *c, const char *role, child_fn fn, const void *arg, const char *ctx)
{
    c->role = role;
    g_spawn.role = role;
    g_spawn.fn = fn;
    g_spawn.arg = arg;
    fflush(NULL);
    tp_kid_t k = tp_spawn_with(spawned, NULL, NULL);
    c->pid = k.pid > 0 ? k.pid : 0;
    c->to = k.to;
    c->from = k.from;
    if (k.pid > 0) return 0;
    add_error("%s: fork or pipe: %s", ctx, strerror(errno));
    return -1;
}

/* The child's next message, which must be of `type`; -1 (recorded, the
 * child killed) otherwise. */
static int expect(child_t *c, int type, msg_t *m, const char *ctx, const char *step)
{
    int r = read_msg(c->from, m, PIPE_WAIT_MS);
    if (r == 0 && m->type == type) return 0;
    if (r == 0 && m->type == M_FAIL) {
        add_error("%s: %s (pid %d) failed at %s", ctx, c->role, (int)c->pid, m->text);
    } else if (r == 0) {
        add_error("%s: %s sent message %d while the coordinator waited for %s", ctx, c->role,
                  m->type, step);
    } else if (r == 1) {
        add_error("%s: %s (pid %d) sent nothing in %d s while the coordinator waited for %s "
                  "(killed)", ctx, c->role, (int)c->pid, PIPE_WAIT_MS / 1000, step);
    } else if (r == 2) {
        int st = 0;
        char how[128] = "gone";
        if (c->pid > 0 && waitpid(c->pid, &st, 0) == c->pid) {
            describe_status(st, how, sizeof how);
            tp_untrack(c->pid);
            c->pid = 0;
        }
        add_error("%s: %s %s while the coordinator waited for %s", ctx, c->role, how, step);
    } else {
        add_error("%s: reading from %s: %s", ctx, c->role, strerror(errno));
    }
    kill_kid(c);
    return -1;
}

static int tell(child_t *c, msg_t *m, const char *ctx)
{
    if (write_msg(c->to, m) == 0) return 0;
    add_error("%s: writing to %s (pid %d): %s", ctx, c->role, (int)c->pid, strerror(errno));
    kill_kid(c);
    return -1;
}

static int tell_type(child_t *c, int type, const char *ctx)
{
    msg_t m;
    msg_init(&m, type);
    return tell(c, &m, ctx);
}

/* Wait for the child to exit (PIPE_WAIT_MS at most); status 0 or -1. */
static int finish(child_t *c, const char *ctx)
{
    if (c->pid <= 0) return 0;
    int st = tp_wait(c->pid, PIPE_WAIT_MS);
    if (st == -1) {
        add_error("%s: %s (pid %d) did not exit in %d s (killed), or was not a child", ctx,
                  c->role, (int)c->pid, PIPE_WAIT_MS / 1000);
        forget_kid(c);
        return -1;
    }
    c->pid = 0;
    forget_kid(c);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
    char how[128];
    describe_status(st, how, sizeof how);
    /* A failing child has said why already: its message is in the errors. */
    add_error("%s: %s %s at its end", ctx, c->role, how);
    return -1;
}

static int g_sock_seq;

static void sock_path(char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/gm-share-bench-%d-%d.sock", bench_tmpdir(), (int)getpid(), g_sock_seq++);
}

/* What both children of a run are given: the socket and what the exporter
 * shares on it, which the importer imports. */
typedef struct share_arg {
    char path[108];     /* the exporter's socket (pair_start names it) */
    int nblocks;        /* blocks, each published under its own name "b<i>"
                           (weights: one block, "weights") */
    size_t block;       /* bytes per block (the importer checks each) */
    int access;         /* GM_SHARE_READ_WRITE / GM_SHARE_READ_ONLY */
    int tensors;        /* > 0: fill tensor i of the buffer(s) with tensor_byte(i);
                           the importer checks one byte of each */
    int fill_byte;      /* >= 0: fill every block with it (when tensors == 0) */
    int grouped;        /* publish every block under one name, "group"
                           (gm_share_publish_ranges), not one name each */
    int device;         /* legacy IPC: the CUDA device */
} share_arg_t;

/* One run's exporter and importer, and the socket between them.
 * pair_close kills what is left of them and removes the socket. */
typedef struct pair {
    const char *ctx, *path;
    child_t e, i;
} pair_t;

/* Fork the exporter (efn) and the importer (ifn) of a run, both given a
 * (its socket named first), and wait until both are READY (the exporter's
 * message in *m; e_ready: what the exporter does until then).  -1
 * (recorded) on failure; pair_close either way. */
static int pair_start(pair_t *p, const char *ctx, share_arg_t *a, child_fn efn, const char *e_ready,
                      child_fn ifn, msg_t *m)
{
    msg_t im;
    sock_path(a->path, sizeof a->path);
    *p = (pair_t){.ctx = ctx, .path = a->path};
    p->e = p->i = (child_t){.pid = 0, .to = -1, .from = -1};
    if (spawn(&p->e, "exporter", efn, a, ctx)) return -1;
    if (spawn(&p->i, "importer", ifn, a, ctx)) return -1;
    if (expect(&p->e, M_READY, m, ctx, e_ready)) return -1;
    return expect(&p->i, M_READY, &im, ctx, "the importer's setup");
}

/* Tell the child `type`, then read its answer, which must be `reply`,
 * into *m (step: what the child does in between).  -1 (recorded, the child
 * killed) on failure. */
static int ask(child_t *c, int type, int reply, msg_t *m, const char *ctx, const char *step)
{
    if (tell_type(c, type, ctx)) return -1;
    return expect(c, reply, m, ctx, step);
}

/* The importer's exit, then the exporter told DONE (with `result`: its
 * M_RESULT read into *m, `result` being what it reports) and its exit. */
static int pair_finish(pair_t *p, msg_t *m, const char *result)
{
    if (finish(&p->i, p->ctx)) return -1;
    if (result ? ask(&p->e, M_DONE, M_RESULT, m, p->ctx, result) : tell_type(&p->e, M_DONE, p->ctx))
        return -1;
    return finish(&p->e, p->ctx);
}

static int pair_close(pair_t *p, int rc)
{
    kill_kid(&p->e);
    kill_kid(&p->i);
    unlink(p->path); /* legacy IPC: never made (ENOENT) */
    return rc;
}

/* ---- the info child ----------------------------------------------------------- */

static void info_main(const void *arg)
{
    (void)arg;
    gm_pool_t *pool = child_pool();
    gm_device_info_t di = GM_DEVICE_INFO_INIT;
    CK(gm_pool_device_info(pool, &di), "gm_pool_device_info");
    msg_t m;
    msg_init(&m, M_INFO);
    copy_str(m.text, sizeof m.text, di.device_name, sizeof di.device_name);
    copy_str((char *)m.blob, sizeof m.blob, di.backend_name, sizeof di.backend_name);
    m.v[0] = di.backend;
    m.v[1] = di.device;
    m.v[2] = di.driver_version;
    m.u[0] = di.total_memory;
    m.u[1] = di.free_memory;
    m.u[2] = di.granularity;
    child_send(&m);
    gm_pool_destroy(pool);
}

static int run_info(info_t *out)
{
    const char *ctx = "device info";
    child_t c;
    msg_t m;
    if (spawn(&c, "info child", info_main, NULL, ctx)) return -1;
    if (expect(&c, M_INFO, &m, ctx, "the device info")) return -1;
    copy_str(out->device_name, sizeof out->device_name, m.text, sizeof m.text);
    copy_str(out->backend_name, sizeof out->backend_name, (const char *)m.blob, sizeof m.blob);
    out->backend = (int)m.v[0];
    out->device = (int)m.v[1];
    out->driver_version = (int)m.v[2];
    out->total_memory = m.u[0];
    out->free_memory = m.u[1];
    out->granularity = m.u[2];
    out->ok = true;
    return finish(&c, ctx);
}

/* ---- exporters ------------------------------------------------------------------ */

typedef struct exporter {
    gm_pool_t *pool;
    gm_stream_t stream;
    gm_share_server_t *srv;
    void **blocks;
} exporter_t;

/* Pool, stream, server, blocks (filled, the stream synchronized). */
static void exporter_setup(const share_arg_t *a, exporter_t *x)
{
    x->pool = child_pool();
    CK(gm_stream_create(x->pool, &x->stream), "gm_stream_create");
    x->blocks = calloc((size_t)a->nblocks, sizeof *x->blocks);
    if (!x->blocks) child_fail("calloc: out of host memory");
    for (int i = 0; i < a->nblocks; i++) {
        char step[96];
        snprintf(step, sizeof step, "gm_alloc_shareable(%zu bytes, block %d of %d)", a->block, i,
                 a->nblocks);
        CK(gm_alloc_shareable(x->pool, a->block, x->stream, &x->blocks[i]), step);
    }
    if (a->tensors > 0) {
        /* Tensor t lies at offset t * tsz of the whole (one buffer, or
         * nblocks buffers of one tensor each). */
        size_t total = a->block * (size_t)a->nblocks, tsz = total / (size_t)a->tensors;
        for (int t = 0; t < a->tensors; t++) {
            size_t off = (size_t)t * tsz;
            char *p = (char *)x->blocks[off / a->block] + off % a->block;
            CK(gm_memset(x->pool, p, tensor_byte(t), tsz, x->stream), "gm_memset (tensor fill)");
        }
    } else if (a->fill_byte >= 0) {
        for (int i = 0; i < a->nblocks; i++)
            CK(gm_memset(x->pool, x->blocks[i], a->fill_byte, a->block, x->stream), "gm_memset (fill)");
    }
    CK(gm_stream_synchronize(x->pool, x->stream), "gm_stream_synchronize (after the fill)");
    CK(gm_share_listen(x->pool, a->path, NULL, &x->srv), "gm_share_listen");
}

static void exporter_publish_all(const share_arg_t *a, exporter_t *x)
{
    if (a->grouped) {
        gm_share_range_t *rs = calloc((size_t)a->nblocks, sizeof *rs);
        if (!rs) child_fail("calloc: out of host memory");
        for (int i = 0; i < a->nblocks; i++) rs[i] = (gm_share_range_t){x->blocks[i], a->block};
        CK(gm_share_publish_ranges(x->srv, "group", rs, (size_t)a->nblocks, a->access, NULL,
                                   x->stream), "gm_share_publish_ranges('group')");
        free(rs);
        return;
    }
    for (int i = 0; i < a->nblocks; i++) {
        char name[32], step[64];
        snprintf(name, sizeof name, "b%d", i);
        snprintf(step, sizeof step, "gm_share_publish('%s')", name);
        CK(gm_share_publish(x->srv, name, x->blocks[i], a->block, a->access, NULL, x->stream), step);
    }
}

/* exporter_setup, every block published (when `publish`), READY told,
 * then the coordinator's next message, of `type`, read into *m (`what`:
 * what it waits for, for the errors).  Returns the run's share_arg_t. */
static const share_arg_t *exporter_start(const void *arg, exporter_t *x, bool publish, int type,
                                         msg_t *m, const char *what)
{
    const share_arg_t *a = arg;
    exporter_setup(a, x);
    if (publish) exporter_publish_all(a, x);
    child_tell(M_READY);
    child_wait(type, m, what);
    return a;
}

/* The server closed, the blocks not freed yet (NULL: freed) freed, the
 * stream and the pool destroyed. */
static void exporter_teardown(const share_arg_t *a, exporter_t *x)
{
    CK(gm_share_close(x->srv), "gm_share_close");
    for (int i = 0; i < a->nblocks; i++)
        if (x->blocks[i]) CK(gm_free(x->pool, x->blocks[i], x->stream), "gm_free");
    CK(gm_stream_destroy(x->pool, x->stream), "gm_stream_destroy");
    gm_pool_destroy(x->pool);
    free(x->blocks);
}

/* Publish everything, serve until DONE; then report the driver time its
 * server spent meanwhile (export_fd for the importer's pages). */
static void exporter_serve_main(const void *arg)
{
    const share_arg_t *a = arg;
    exporter_t x;
    msg_t m;
    exporter_setup(a, &x);
    exporter_publish_all(a, &x);
    gm_stats_t s0 = pool_stats(x.pool);
    child_tell(M_READY);
    child_wait(M_DONE, &m, "the end");
    gm_stats_t s1 = pool_stats(x.pool);
    msg_init(&m, M_RESULT);
    m.v[0] = (double)(s1.backend_ns - s0.backend_ns) / 1e3;
    m.v[1] = (double)(s1.backend_calls[GM_CALL_export_fd] - s0.backend_calls[GM_CALL_export_fd]);
    child_send(&m);
    exporter_teardown(a, &x);
}

/* Weight sync: publish at GO (t = when gm_share_publish started), serve
 * until DONE. */
static void exporter_weights_main(const void *arg)
{
    exporter_t x;
    msg_t m;
    const share_arg_t *a = exporter_start(arg, &x, false, M_GO, &m, "the start");
    double t0 = now();
    if (a->nblocks == 1) {
        CK(gm_share_publish(x.srv, "weights", x.blocks[0], a->block, a->access, NULL, x.stream),
           "gm_share_publish('weights')");
    } else {
        exporter_publish_all(a, &x);
    }
    double t1 = now();
    msg_init(&m, M_PUBLISHED);
    m.t = t0;
    m.v[0] = t1 - t0;
    child_send(&m);
    child_wait(M_DONE, &m, "the end");
    exporter_teardown(a, &x);
}

static void stats_now(gm_pool_t *pool, gm_share_stats_t *ss, gm_stats_t *ps)
{
    *ss = (gm_share_stats_t)GM_SHARE_STATS_INIT;
    *ps = (gm_stats_t)GM_STATS_INIT;
    CK(gm_share_stats(pool, ss), "gm_share_stats");
    CK(gm_pool_stats(pool, ps), "gm_pool_stats");
}

/* The dead importer's block, freed by the exporter while the importer
 * held it: its pool let it go (the figures read into *ss, *ps). */
typedef struct held {
    gm_pool_t *pool;
    gm_share_stats_t *ss;
    gm_stats_t *ps;
    uint64_t live_before;
} held_t;

static bool held_released(void *arg)
{
    held_t *h = arg;
    stats_now(h->pool, h->ss, h->ps);
    return h->ss->held_for_peers_bytes == 0 && h->ps->live_blocks < h->live_before;
}

/* Dead importer: publish; at FREE unpublish and gm_free (the block is held
 * for the peer); at KILLED time until the pool let it go. */
static void exporter_dead_importer_main(const void *arg)
{
    exporter_t x;
    msg_t m;
    const share_arg_t *a = exporter_start(arg, &x, true, M_FREE, &m, "the free");
    gm_share_stats_t ss;
    gm_stats_t ps;
    stats_now(x.pool, &ss, &ps);
    uint64_t live_before = ps.live_blocks;
    /* Unpublished first: a published block stays held by its publication. */
    CK(gm_share_unpublish(x.srv, "b0"), "gm_share_unpublish");
    CK(gm_free(x.pool, x.blocks[0], x.stream), "gm_free (of the imported block)");
    x.blocks[0] = NULL;
    stats_now(x.pool, &ss, &ps);
    if (ss.held_for_peers_bytes < a->block)
        child_fail("after gm_free of the imported block: held_for_peers_bytes %llu, expected "
                    ">= %zu (is the importer's mapping not counted?)",
                    (unsigned long long)ss.held_for_peers_bytes, a->block);
    if (ps.live_blocks != live_before)
        child_fail("after gm_free of the imported block: live_blocks %llu -> %llu (the held "
                    "block should stay live)", (unsigned long long)live_before,
                    (unsigned long long)ps.live_blocks);
    msg_init(&m, M_FREED);
    m.u[0] = ss.held_for_peers_bytes;
    m.u[1] = ps.live_blocks;
    m.u[2] = ss.peers;
    child_send(&m);
    child_wait(M_KILLED, &m, "the kill");
    double t0 = now(), t_kill = m.t, t1 = t0;
    held_t held = {x.pool, &ss, &ps, live_before};
    bool reached = poll_until(held_released, &held, t0, &t1);
    msg_init(&m, M_RESULT);
    m.v[0] = (t1 - t0) * 1e3;
    m.v[1] = (t1 - t_kill) * 1e3;
    m.v[2] = reached;
    m.u[0] = ss.held_for_peers_bytes;
    m.u[1] = ps.live_blocks;
    m.u[2] = ss.peers;
    child_send(&m);
    child_wait(M_DONE, &m, "the end");
    exporter_teardown(a, &x);
}

/* Dead exporter: at GO read the free memory, allocate and publish; then
 * wait to be killed. */
static void exporter_dead_main(const void *arg)
{
    const share_arg_t *a = arg;
    msg_t m;
    gm_stream_t s;
    gm_pool_t *pool = child_start(&s, &m, "the start");
    gm_device_info_t di = GM_DEVICE_INFO_INIT;
    CK(gm_pool_device_info(pool, &di), "gm_pool_device_info (baseline)");
    size_t baseline = di.free_memory;
    void *p;
    CK(gm_alloc_shareable(pool, a->block, s, &p), "gm_alloc_shareable");
    CK(gm_memset(pool, p, 0x3c, a->block, s), "gm_memset");
    CK(gm_stream_synchronize(pool, s), "gm_stream_synchronize");
    gm_share_server_t *srv;
    CK(gm_share_listen(pool, a->path, NULL, &srv), "gm_share_listen");
    CK(gm_share_publish(srv, "b0", p, a->block, GM_SHARE_READ_WRITE, NULL, s), "gm_share_publish");
    gm_device_info_t d2 = GM_DEVICE_INFO_INIT;
    CK(gm_pool_device_info(pool, &d2), "gm_pool_device_info (after the allocation)");
    msg_init(&m, M_PUBLISHED);
    m.u[0] = baseline;
    m.u[1] = d2.free_memory;
    child_send(&m);
    child_wait(M_DONE, &m, "the kill"); /* never comes: killed */
    _exit(0);
}

/* Read-only: publish a filled block read-only; at CHECK read it back. */
static void exporter_readonly_main(const void *arg)
{
    exporter_t x;
    msg_t m;
    const share_arg_t *a = exporter_start(arg, &x, true, M_CHECK, &m, "the check");
    unsigned char buf[4096];
    CK(gm_memcpy(x.pool, buf, x.blocks[0], sizeof buf, x.stream), "gm_memcpy (read back)");
    CK(gm_stream_synchronize(x.pool, x.stream), "gm_stream_synchronize (read back)");
    int intact = 1;
    for (size_t i = 0; i < sizeof buf; i++)
        if (buf[i] != (unsigned char)a->fill_byte) { intact = 0; break; }
    msg_init(&m, M_RESULT);
    m.v[0] = intact;
    child_send(&m);
    child_wait(M_DONE, &m, "the end");
    exporter_teardown(a, &x);
}

/* ---- importers ------------------------------------------------------------------ */

/* Import the blocks of a: ptrs[0..nblocks), each checked to be a->block long. */
static void import_all(const share_arg_t *a, gm_share_client_t *cli, void **ptrs)
{
    if (a->grouped) {
        gm_share_range_t *rs = calloc((size_t)a->nblocks, sizeof *rs);
        size_t n = 0;
        if (!rs) child_fail("calloc: out of host memory");
        CK(gm_share_import_ranges(cli, "group", NULL, rs, (size_t)a->nblocks, &n, NULL),
           "gm_share_import_ranges('group')");
        if (n != (size_t)a->nblocks) child_fail("'group': %zu ranges, expected %d", n, a->nblocks);
        for (int i = 0; i < a->nblocks; i++) {
            if (rs[i].size != a->block)
                child_fail("'group' range %d: size %zu, expected %zu", i, rs[i].size, a->block);
            ptrs[i] = rs[i].ptr;
        }
        free(rs);
        return;
    }
    for (int i = 0; i < a->nblocks; i++) {
        char name[32];
        size_t size = 0;
        if (a->nblocks == 1 && a->tensors > 0) snprintf(name, sizeof name, "weights");
        else snprintf(name, sizeof name, "b%d", i);
        int rc = gm_share_import(cli, name, NULL, &ptrs[i], &size, NULL);
        if (rc != GM_OK)
            child_fail("gm_share_import('%s', %d of %d): %s (%s)", name, i + 1, a->nblocks,
                        gm_errname(rc), gm_last_error());
        if (size != a->block)
            child_fail("gm_share_import('%s'): size %zu, expected %zu", name, size, a->block);
    }
}

/* Release what import_all imported (a group: its first range releases all). */
static void release_all(const share_arg_t *a, gm_share_client_t *cli, void **ptrs, gm_stream_t s)
{
    for (int i = 0; i < (a->grouped ? 1 : a->nblocks); i++)
        CK(gm_share_release(cli, ptrs[i], s), "gm_share_release");
}

/* Connect to a->path and import "b0", checked to be a->block long (its
 * access into *access unless that is NULL). */
static gm_share_client_t *import_b0(gm_pool_t *pool, const share_arg_t *a, void **p, int *access)
{
    gm_share_client_t *cli;
    size_t size = 0;
    CK(gm_share_connect(pool, a->path, &cli), "gm_share_connect");
    CK(gm_share_import(cli, "b0", NULL, p, &size, access), "gm_share_import('b0')");
    if (size != a->block) child_fail("gm_share_import('b0'): size %zu, expected %zu", size, a->block);
    return cli;
}

/* The importer's end: disconnected, its stream (unless NULL) and pool destroyed. */
static void importer_close(gm_pool_t *pool, gm_share_client_t *cli, gm_stream_t s)
{
    CK(gm_share_disconnect(cli), "gm_share_disconnect");
    if (s) CK(gm_stream_destroy(pool, s), "gm_stream_destroy");
    gm_pool_destroy(pool);
}

/* Connect + import every name, timed (until the last import returns). */
static void importer_import_main(const void *arg)
{
    const share_arg_t *a = arg;
    msg_t m;
    void **ptrs = calloc((size_t)a->nblocks, sizeof *ptrs);
    if (!ptrs) child_fail("calloc: out of host memory");
    gm_pool_t *pool = child_start(NULL, &m, "the start");
    gm_share_client_t *cli;
    gm_stats_t s0 = pool_stats(pool);
    double t0 = now();
    CK(gm_share_connect(pool, a->path, &cli), "gm_share_connect");
    double t1 = now();
    import_all(a, cli, ptrs);
    double t2 = now();
    gm_stats_t s1 = pool_stats(pool);
    msg_init(&m, M_RESULT);
    m.v[0] = (t2 - t0) * 1e6;
    m.v[1] = (t1 - t0) * 1e6;
    /* The driver's share of it: the importer's backend calls. */
    m.v[2] = (double)(s1.backend_ns - s0.backend_ns) / 1e3;
    m.v[3] = (double)(s1.backend_calls[GM_CALL_import_fd] - s0.backend_calls[GM_CALL_import_fd]);
    m.v[4] = (double)(s1.backend_calls[GM_CALL_map] - s0.backend_calls[GM_CALL_map]);
    m.v[5] = (double)(s1.backend_calls[GM_CALL_set_access] - s0.backend_calls[GM_CALL_set_access]);
    child_send(&m);
    release_all(a, cli, ptrs, NULL);
    importer_close(pool, cli, NULL);
    free(ptrs);
}

/* Weight sync: at GO (t = the exporter's publish start) connect, import,
 * read one byte (the last) of every tensor back, check them. */
static void importer_weights_main(const void *arg)
{
    const share_arg_t *a = arg;
    msg_t m;
    void **ptrs = calloc((size_t)a->nblocks, sizeof *ptrs);
    unsigned char *got = calloc((size_t)a->tensors, 1);
    if (!ptrs || !got) child_fail("calloc: out of host memory");
    gm_stream_t s;
    gm_pool_t *pool = child_start(&s, &m, "the publish");
    double t_pub = m.t, t_told = now();
    gm_share_client_t *cli;
    CK(gm_share_connect(pool, a->path, &cli), "gm_share_connect");
    import_all(a, cli, ptrs);
    double t_imported = now();
    size_t total = a->block * (size_t)a->nblocks, tsz = total / (size_t)a->tensors;
    for (int t = 0; t < a->tensors; t++) {
        size_t off = (size_t)t * tsz + tsz - 1;
        const char *p = (const char *)ptrs[off / a->block] + off % a->block;
        CK(gm_memcpy(pool, &got[t], p, 1, s), "gm_memcpy (one byte of a tensor)");
    }
    CK(gm_stream_synchronize(pool, s), "gm_stream_synchronize (after the checks)");
    double t_end = now();
    for (int t = 0; t < a->tensors; t++)
        if (got[t] != tensor_byte(t))
            child_fail("tensor %d of the import reads %#x, the exporter wrote %#x", t, got[t],
                        tensor_byte(t));
    msg_init(&m, M_RESULT);
    m.v[0] = t_end - t_pub;
    m.v[1] = t_imported - t_told;   /* connect + imports */
    m.v[2] = t_end - t_imported;    /* the byte checks */
    m.v[3] = t_told - t_pub;        /* publish + the message's way here */
    child_send(&m);
    release_all(a, cli, ptrs, s);
    importer_close(pool, cli, s);
    free(ptrs);
    free(got);
}

/* Dead importer: import, say so, wait to be killed. */
static void importer_hold_main(const void *arg)
{
    const share_arg_t *a = arg;
    msg_t m;
    void *p;
    import_b0(child_start(NULL, &m, "the start"), a, &p, NULL);
    child_tell(M_IMPORTED);
    child_wait(M_DONE, &m, "the kill"); /* never comes: killed */
    _exit(0);
}

/* The dead exporter's memory: the device's free memory (read into
 * free_now) is back to `want`. */
typedef struct free_back {
    gm_pool_t *pool;
    size_t want, free_now;
} free_back_t;

static bool free_is_back(void *arg)
{
    free_back_t *b = arg;
    gm_device_info_t d = GM_DEVICE_INFO_INIT;
    CK(gm_pool_device_info(b->pool, &d), "gm_pool_device_info (poll)");
    b->free_now = d.free_memory;
    return b->free_now >= b->want;
}

/* Dead exporter: import; at KILLED (t = kill(), u[0] = the free memory
 * before the exporter allocated) release and poll the free memory. */
static void importer_dead_exporter_main(const void *arg)
{
    const share_arg_t *a = arg;
    msg_t m;
    gm_stream_t s;
    gm_pool_t *pool = child_start(&s, &m, "the start");
    void *p;
    gm_share_client_t *cli = import_b0(pool, a, &p, NULL);
    gm_device_info_t di = GM_DEVICE_INFO_INIT;
    CK(gm_pool_device_info(pool, &di), "gm_pool_device_info (imported)");
    msg_init(&m, M_IMPORTED);
    m.u[0] = di.free_memory;
    child_send(&m);
    child_wait(M_KILLED, &m, "the kill");
    double t_kill = m.t, t_told = now();
    size_t baseline = m.u[0], want = baseline > SLACK_BYTES ? baseline - SLACK_BYTES : 0;
    CK(gm_share_release(cli, p, s), "gm_share_release (after the exporter died)");
    double t_released = now(), t1 = t_released;
    free_back_t back = {pool, want, 0};
    bool reached = poll_until(free_is_back, &back, t_released, &t1);
    size_t free_now = back.free_now;
    msg_init(&m, M_RESULT);
    m.v[0] = (t1 - t_kill) * 1e3;
    m.v[1] = (t_released - t_told) * 1e3; /* gm_share_release */
    m.v[2] = (t_told - t_kill) * 1e3;     /* waitpid + the message */
    m.v[3] = reached;
    m.u[0] = free_now;
    m.u[1] = di.free_memory;
    child_send(&m);
    /* The connection is dead: a new import must fail with GM_IO. */
    void *q;
    size_t size = 0;
    int rc = gm_share_import(cli, "b0", NULL, &q, &size, NULL);
    if (rc == GM_OK) child_fail("gm_share_import after the exporter died returned GM_OK");
    importer_close(pool, cli, s);
}

/* Read-only: read the import back, then try to write it. */
static void importer_readonly_main(const void *arg)
{
    const share_arg_t *a = arg;
    msg_t m;
    gm_stream_t s;
    gm_pool_t *pool = child_start(&s, &m, "the start");
    int fill = (int)m.u[0];
    void *p;
    int access = -1;
    import_b0(pool, a, &p, &access);
    unsigned char buf[4096];
    int rc = gm_memcpy(pool, buf, p, sizeof buf, s);
    if (rc == GM_OK) rc = gm_stream_synchronize(pool, s);
    int read_ok = rc == GM_OK;
    char read_err[200] = "";
    if (!read_ok) snprintf(read_err, sizeof read_err, "%s (%s)", gm_errname(rc), gm_last_error());
    for (size_t i = 0; read_ok && i < sizeof buf; i++)
        if (buf[i] != (unsigned char)fill) {
            read_ok = 0;
            snprintf(read_err, sizeof read_err, "byte %zu reads %#x, not %#x", i, buf[i], fill);
        }
    /* The write attempt: either call failing counts. */
    int rc_set = gm_memset(pool, p, 0xee, sizeof buf, s);
    char err[300] = "";
    if (rc_set != GM_OK) snprintf(err, sizeof err, "gm_memset: %s (%s)", gm_errname(rc_set), gm_last_error());
    int rc_sync = gm_stream_synchronize(pool, s);
    if (rc_sync != GM_OK && !*err)
        snprintf(err, sizeof err, "gm_stream_synchronize: %s (%s)", gm_errname(rc_sync), gm_last_error());
    msg_init(&m, M_RESULT);
    m.v[0] = rc_set != GM_OK || rc_sync != GM_OK;
    m.v[1] = read_ok;
    m.v[2] = access;
    m.v[3] = rc_set;
    m.v[4] = rc_sync;
    copy_str(m.text, sizeof m.text, err, sizeof err);
    copy_str((char *)m.blob, sizeof m.blob, read_err, sizeof read_err);
    child_send(&m);
    /* No clean-up: after a device fault this process's context is unusable. */
    _exit(0);
}

/* ---- legacy CUDA IPC (driver API through dlopen) -------------------------------- */

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef struct { char reserved[64]; } CUipcMemHandle;
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 0x1

typedef struct cu {
    CUresult (*Init)(unsigned);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*IpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
    CUresult (*IpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned);
    CUresult (*IpcCloseMemHandle)(CUdeviceptr);
    CUresult (*GetErrorString)(CUresult, const char **);
} cu_t;

static const char *cu_err(const cu_t *cu, CUresult r)
{
    const char *s = NULL;
    if (cu->GetErrorString && cu->GetErrorString(r, &s) == 0 && s) return s;
    return "unknown CUDA error";
}

#define CU_CK(cu, expr, step)                                                  \
    do {                                                                       \
        CUresult cr_ = (expr);                                                 \
        if (cr_ != 0) child_fail("%s: CUresult %d (%s)", step, cr_, cu_err(cu, cr_)); \
    } while (0)

/* dlopen libcuda.so.1, the symbols, cuInit, the primary context of device. */
static void cu_open(cu_t *cu, int device)
{
    memset(cu, 0, sizeof *cu);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) child_fail("dlopen libcuda.so.1: %s", dlerror());
#define CU_SYM(field, name)                                                    \
    do {                                                                       \
        void *s_ = dlsym(lib, name);                                           \
        if (!s_) child_fail("dlsym %s: %s", name, dlerror());                 \
        memcpy(&cu->field, &s_, sizeof s_);                                    \
    } while (0)
    CU_SYM(GetErrorString, "cuGetErrorString");
    CU_SYM(Init, "cuInit");
    CU_SYM(DeviceGet, "cuDeviceGet");
    CU_SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    CU_SYM(CtxSetCurrent, "cuCtxSetCurrent");
    CU_SYM(MemAlloc, "cuMemAlloc_v2");
    CU_SYM(MemFree, "cuMemFree_v2");
    CU_SYM(IpcGetMemHandle, "cuIpcGetMemHandle");
    CU_SYM(IpcOpenMemHandle, "cuIpcOpenMemHandle_v2");
    CU_SYM(IpcCloseMemHandle, "cuIpcCloseMemHandle");
#undef CU_SYM
    CUdevice dev;
    CUcontext ctx;
    CU_CK(cu, cu->Init(0), "cuInit");
    CU_CK(cu, cu->DeviceGet(&dev, device), "cuDeviceGet");
    CU_CK(cu, cu->DevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    CU_CK(cu, cu->CtxSetCurrent(ctx), "cuCtxSetCurrent");
}

static void legacy_exporter_main(const void *arg)
{
    const share_arg_t *a = arg;
    cu_t cu;
    msg_t m;
    cu_open(&cu, a->device);
    CUdeviceptr d;
    CUipcMemHandle h;
    CU_CK(&cu, cu.MemAlloc(&d, a->block), "cuMemAlloc_v2 (1 GiB)");
    CU_CK(&cu, cu.IpcGetMemHandle(&h, d), "cuIpcGetMemHandle");
    msg_init(&m, M_READY);
    memcpy(m.blob, &h, sizeof h);
    child_send(&m);
    child_wait(M_DONE, &m, "the end");
    CU_CK(&cu, cu.MemFree(d), "cuMemFree_v2");
}

static void legacy_importer_main(const void *arg)
{
    const share_arg_t *a = arg;
    cu_t cu;
    msg_t m;
    cu_open(&cu, a->device);
    child_tell(M_READY);
    child_wait(M_GO, &m, "the handle");
    CUipcMemHandle h;
    memcpy(&h, m.blob, sizeof h);
    msg_init(&m, M_RESULT);
    for (int i = 0; i < LEGACY_PAIRS; i++) {
        CUdeviceptr d;
        double t0 = now();
        CU_CK(&cu, cu.IpcOpenMemHandle(&d, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), "cuIpcOpenMemHandle_v2");
        double t1 = now();
        CU_CK(&cu, cu.IpcCloseMemHandle(d), "cuIpcCloseMemHandle");
        m.v[i] = (t1 - t0) * 1e6;
    }
    child_send(&m);
}

/* ---- the measurements (coordinator) -------------------------------------------- */

/* The parts of a weight sync, in seconds: the whole; the importer's connect
 * and imports; its byte checks; from the publish's start until the importer
 * was told; the publish call(s). */
enum { WS_TOTAL, WS_IMPORT, WS_CHECK, WS_PUBLISH, WS_PUBLISH_CALL, WS_PARTS };

/* Their JSON keys: one name, per tensor (the totals head the results). */
static const char *const k_ws_keys[2][WS_PARTS] = {
    {"weight_sync_s", "weight_sync_import_s", "weight_sync_check_s",
     "weight_sync_publish_to_importer_s", "weight_sync_publish_call_s"},
    {"weight_sync_per_tensor_s", "weight_sync_per_tensor_import_s", "weight_sync_per_tensor_check_s",
     "weight_sync_per_tensor_publish_to_importer_s", "weight_sync_per_tensor_publish_calls_s"},
};

/* The figures that head the results (from the runs, at the end). */
typedef struct headline {
    double import_us, import_p90_us, import_64_us, weight_sync_s, weight_sync_per_tensor_s;
    double import_64_names_us, weight_sync_per_name_s;
    double di_ms, de_ms, legacy_us, legacy_first_us;
} headline_t;

typedef struct results {
    info_t info;
    double import_runs[IMPORT_RUNS], import_connect_runs[IMPORT_RUNS];
    double import_bk_imp[IMPORT_RUNS], import_bk_exp[IMPORT_RUNS]; /* driver µs per side */
    double import_calls[4];   /* import_fd, map, set_access, export_fd of the last run */
    int n_import;
    double import64_runs[IMPORT64_RUNS];
    int n_import64;
    double import64n_runs[IMPORT64_RUNS]; /* the same 64 blocks, a name each */
    int n_import64n;
    double wsn;                           /* weight sync, per tensor, a name each */
    size_t weight_bytes, tensor_bytes;
    double ws[WS_PARTS], wst[WS_PARTS];  /* weight sync: one name; per tensor */
    double di_runs[DEAD_IMPORTER_RUNS], di_from_kill[DEAD_IMPORTER_RUNS];
    int n_di, di_timeouts;
    double de_runs[DEAD_EXPORTER_RUNS], de_release[DEAD_EXPORTER_RUNS], de_wait[DEAD_EXPORTER_RUNS];
    double de_baseline[DEAD_EXPORTER_RUNS], de_after_alloc[DEAD_EXPORTER_RUNS];
    double de_imported[DEAD_EXPORTER_RUNS], de_final[DEAD_EXPORTER_RUNS];
    int n_de, de_timeouts;
    char de_note[600];
    int ro_enforced, ro_read_ok, ro_intact, ro_access; /* -1: not measured */
    char ro_error[400], ro_read_error[64];
    double legacy_runs[LEGACY_PAIRS];
    int n_legacy;
    char legacy_note[300];
    headline_t head;
} results_t;

/* import_us / import_64_us: a fresh exporter with nblocks published blocks
 * and a fresh importer per run. */
/* bd (optional): importer backend µs, import_fd calls, map calls, set_access
 * calls, exporter backend µs, export_fd calls. */
static int run_import(const char *ctx, int nblocks, size_t block, int grouped, double *us,
                      double *connect_us, double bd[6])
{
    pair_t p;
    msg_t m;
    int rc = -1;
    share_arg_t a = {.nblocks = nblocks, .block = block, .access = GM_SHARE_READ_WRITE,
                     .fill_byte = -1, .grouped = grouped};
    if (pair_start(&p, ctx, &a, exporter_serve_main, "the exporter's publish", importer_import_main, &m) ||
        ask(&p.i, M_GO, M_RESULT, &m, ctx, "the import"))
        goto out;
    *us = m.v[0];
    if (connect_us) *connect_us = m.v[1];
    if (bd) for (int k = 0; k < 4; k++) bd[k] = m.v[2 + k];
    if (pair_finish(&p, &m, "the exporter's figures")) goto out;
    if (bd) bd[4] = m.v[0], bd[5] = m.v[1];
    rc = 0;
out:
    return pair_close(&p, rc);
}

/* weight_sync: one buffer (per_tensor false) or TENSORS blocks, these under
 * one name (grouped) or one name each; out: its parts. */
static int run_weights(const char *ctx, bool per_tensor, int grouped, size_t bytes,
                       double out[WS_PARTS])
{
    int nb = per_tensor ? TENSORS : 1;
    pair_t p;
    msg_t m;
    int rc = -1;
    share_arg_t a = {.nblocks = nb, .block = bytes / (size_t)nb, .access = GM_SHARE_READ_ONLY,
                     .tensors = TENSORS, .fill_byte = -1, .grouped = grouped};
    if (pair_start(&p, ctx, &a, exporter_weights_main, "the exporter's allocation and fill",
                   importer_weights_main, &m) ||
        ask(&p.e, M_GO, M_PUBLISHED, &m, ctx, "the publish"))
        goto out;
    out[WS_PUBLISH_CALL] = m.v[0];
    double t_pub = m.t;
    msg_init(&m, M_GO);
    m.t = t_pub;
    if (tell(&p.i, &m, ctx)) goto out;
    if (expect(&p.i, M_RESULT, &m, ctx, "the import and the checks")) goto out;
    for (int k = 0; k < WS_PUBLISH_CALL; k++) out[k] = m.v[k];
    if (pair_finish(&p, &m, NULL)) goto out;
    rc = 0;
out:
    return pair_close(&p, rc);
}

static int run_dead_importer(const char *ctx, double *ms, double *from_kill, bool *reached)
{
    pair_t p;
    msg_t m;
    int rc = -1;
    share_arg_t a = {.nblocks = 1, .block = GiB, .access = GM_SHARE_READ_WRITE, .fill_byte = -1};
    if (pair_start(&p, ctx, &a, exporter_dead_importer_main, "the exporter's publish",
                   importer_hold_main, &m) ||
        ask(&p.i, M_GO, M_IMPORTED, &m, ctx, "the import") ||
        ask(&p.e, M_FREE, M_FREED, &m, ctx, "the unpublish and gm_free"))
        goto out;
    msg_init(&m, M_KILLED);
    m.t = now();
    kill(p.i.pid, SIGKILL);
    if (tell(&p.e, &m, ctx)) goto out;
    kill_kid(&p.i); /* reaps it */
    if (expect(&p.e, M_RESULT, &m, ctx, "the reclaim")) goto out;
    *ms = m.v[0];
    *from_kill = m.v[1];
    *reached = m.v[2] != 0;
    if (!*reached)
        fprintf(stderr, "share_bench: %s: not reclaimed in %.0f s: held_for_peers_bytes %llu, "
                "live_blocks %llu, peers %llu\n", ctx, RECLAIM_WAIT_S,
                (unsigned long long)m.u[0], (unsigned long long)m.u[1], (unsigned long long)m.u[2]);
    if (pair_finish(&p, &m, NULL)) goto out; /* the importer is reaped already */
    rc = 0;
out:
    return pair_close(&p, rc);
}

/* out: ms, release ms, baseline, free after alloc, free imported, final
 * free, reached, kill() to the importer told (waitpid + the pipe) ms */
static int run_dead_exporter(const char *ctx, double out[8])
{
    pair_t p;
    msg_t m;
    int rc = -1;
    share_arg_t a = {.nblocks = 1, .block = GiB};
    if (pair_start(&p, ctx, &a, exporter_dead_main, "the exporter's pool",
                   importer_dead_exporter_main, &m) ||
        ask(&p.e, M_GO, M_PUBLISHED, &m, ctx, "the allocation and publish"))
        goto out;
    uint64_t baseline = m.u[0];
    out[2] = (double)baseline;
    out[3] = (double)m.u[1];
    if (ask(&p.i, M_GO, M_IMPORTED, &m, ctx, "the import")) goto out;
    out[4] = (double)m.u[0];
    msg_init(&m, M_KILLED);
    m.u[0] = baseline;
    m.t = now();
    kill(p.e.pid, SIGKILL);
    kill_kid(&p.e); /* waitpid */
    if (tell(&p.i, &m, ctx)) goto out;
    if (expect(&p.i, M_RESULT, &m, ctx, "the release and the reclaim")) goto out;
    out[0] = m.v[0];
    out[1] = m.v[1];
    out[5] = (double)m.u[0];
    out[6] = m.v[3];
    out[7] = m.v[2];
    if (finish(&p.i, ctx)) goto out;
    rc = 0;
out:
    return pair_close(&p, rc);
}

static int run_readonly(results_t *r)
{
    const char *ctx = "readonly";
    const int fill = 0x5a;
    pair_t p;
    msg_t m;
    int rc = -1;
    share_arg_t a = {.nblocks = 1, .block = 4 * MiB, .access = GM_SHARE_READ_ONLY, .fill_byte = fill};
    if (pair_start(&p, ctx, &a, exporter_readonly_main, "the exporter's publish",
                   importer_readonly_main, &m))
        goto out;
    msg_init(&m, M_GO);
    m.u[0] = (uint64_t)fill;
    if (tell(&p.i, &m, ctx)) goto out;
    if (expect(&p.i, M_RESULT, &m, ctx, "the write attempt")) goto out;
    r->ro_enforced = m.v[0] != 0;
    r->ro_read_ok = m.v[1] != 0;
    r->ro_access = (int)m.v[2];
    copy_str(r->ro_error, sizeof r->ro_error, m.text, sizeof m.text);
    copy_str(r->ro_read_error, sizeof r->ro_read_error, (const char *)m.blob, sizeof m.blob);
    if (finish(&p.i, ctx)) goto out;
    if (ask(&p.e, M_CHECK, M_RESULT, &m, ctx, "the exporter's read back")) goto out;
    r->ro_intact = m.v[0] != 0;
    if (pair_finish(&p, &m, NULL)) goto out; /* the importer has exited already */
    rc = 0;
out:
    return pair_close(&p, rc);
}

/* The same pair of processes, without gpumem: the exporter's handle (its
 * READY) goes to the importer with GO. */
static int run_legacy(results_t *r)
{
    const char *ctx = "legacy_ipc";
    pair_t p;
    msg_t m, h;
    int rc = -1;
    share_arg_t a = {.device = r->info.device, .block = GiB};
    if (pair_start(&p, ctx, &a, legacy_exporter_main, "cuMemAlloc + cuIpcGetMemHandle",
                   legacy_importer_main, &h))
        goto out;
    h.type = M_GO;
    if (tell(&p.i, &h, ctx)) goto out;
    if (expect(&p.i, M_RESULT, &m, ctx, "the opens")) goto out;
    for (int k = 0; k < LEGACY_PAIRS; k++) r->legacy_runs[k] = m.v[k];
    r->n_legacy = LEGACY_PAIRS;
    if (pair_finish(&p, &m, NULL)) goto out;
    rc = 0;
out:
    return pair_close(&p, rc);
}

/* ---- output ----------------------------------------------------------------------- */

static void write_json(FILE *f, const void *results, const bench_label_t *l)
{
    const results_t *r = results;
    const headline_t *h = &r->head;
    jhead(f, l->date, l->command, r->info.ok, r->info.device_name, r->info.backend_name,
          r->info.driver_version, l->commit);
    jfield(f, "import_us", h->import_us);
    jfield(f, "import_p90_us", h->import_p90_us);
    jfield(f, "import_64_us", h->import_64_us);
    jfield(f, "weight_sync_s", h->weight_sync_s);
    jfield(f, "weight_sync_per_tensor_s", h->weight_sync_per_tensor_s);
    jfield(f, "import_64_names_us", h->import_64_names_us);
    jfield(f, "weight_sync_per_name_s", h->weight_sync_per_name_s);
    jfield(f, "weight_sync_bytes", r->weight_bytes);
    jfield(f, "dead_importer_reclaim_ms", h->di_ms);
    jfield(f, "dead_exporter_reclaim_ms", h->de_ms);
    jfield_str(f, "dead_exporter_reclaim_note", *r->de_note ? r->de_note : NULL);
    jfield_bool(f, "readonly_enforced", r->ro_enforced);
    jfield_str(f, "readonly_error", r->ro_enforced > 0 ? r->ro_error : NULL);
    jfield_bool(f, "readonly_read_ok", r->ro_read_ok);
    jfield(f, "legacy_ipc_open_us", h->legacy_us);
    jfield(f, "legacy_ipc_open_first_us", h->legacy_first_us);
    jfield_str(f, "legacy_ipc_note", *r->legacy_note ? r->legacy_note : NULL);
    fputs(",\"goals\":{\"weight_sync_s\":0.5,\"dead_importer_reclaim_ms\":1000,"
          "\"dead_exporter_reclaim_ms\":1000}", f);
    fputs(",\"details\":{\"import_runs_us\":", f);
    jarr(f, r->import_runs, r->n_import);
    jfield_arr(f, "import_connect_runs_us", r->import_connect_runs, r->n_import);
    jfield_arr(f, "import_importer_driver_runs_us", r->import_bk_imp, r->n_import);
    jfield_arr(f, "import_exporter_driver_runs_us", r->import_bk_exp, r->n_import);
    fputs(",\"import_driver_calls\":{\"import_fd\":", f);
    jnum(f, r->n_import ? r->import_calls[0] : NAN);
    jfield(f, "map", r->n_import ? r->import_calls[1] : NAN);
    jfield(f, "set_access", r->n_import ? r->import_calls[2] : NAN);
    jfield(f, "export_fd", r->n_import ? r->import_calls[3] : NAN);
    fputs("}", f);
    jfield_arr(f, "import_64_runs_us", r->import64_runs, r->n_import64);
    jfield(f, "weight_sync_tensor_bytes", r->tensor_bytes);
    for (int k = WS_IMPORT; k < WS_PARTS; k++) jfield(f, k_ws_keys[0][k], r->ws[k]);
    for (int k = WS_IMPORT; k < WS_PARTS; k++) jfield(f, k_ws_keys[1][k], r->wst[k]);
    jfield_arr(f, "dead_importer_runs_ms", r->di_runs, r->n_di);
    jfield_arr(f, "dead_importer_from_kill_runs_ms", r->di_from_kill, r->n_di);
    jfield(f, "dead_importer_timeouts", r->di_timeouts);
    jfield_arr(f, "dead_exporter_runs_ms", r->de_runs, r->n_de);
    jfield_arr(f, "dead_exporter_release_runs_ms", r->de_release, r->n_de);
    jfield_arr(f, "dead_exporter_waitpid_runs_ms", r->de_wait, r->n_de);
    jfield(f, "dead_exporter_timeouts", r->de_timeouts);
    jfield_arr(f, "dead_exporter_free_baseline_bytes", r->de_baseline, r->n_de);
    jfield_arr(f, "dead_exporter_free_after_alloc_bytes", r->de_after_alloc, r->n_de);
    jfield_arr(f, "dead_exporter_free_imported_bytes", r->de_imported, r->n_de);
    jfield_arr(f, "dead_exporter_free_final_bytes", r->de_final, r->n_de);
    jfield(f, "readonly_import_access", r->ro_access);
    jfield_bool(f, "readonly_data_intact", r->ro_intact);
    jfield_str(f, "readonly_read_error", *r->ro_read_error ? r->ro_read_error : NULL);
    jfield_arr(f, "legacy_ipc_open_runs_us", r->legacy_runs, r->n_legacy);
    jfield(f, "device_total_memory", r->info.total_memory);
    jfield(f, "page_bytes", r->info.granularity);
    jfield_bool(f, "quick", quick());
    jerrors_end(f);
}

static const char *met(double v, double goal)
{
    if (isnan(v)) return "—";
    return v <= goal ? "yes" : "NO";
}

static void human_bytes(char *buf, size_t cap, double b)
{
    if (b >= (double)GiB) snprintf(buf, cap, "%.3g GiB", b / (double)GiB);
    else snprintf(buf, cap, "%.3g MiB", b / (double)MiB);
}

/* A row for what must hold: true, false, or "—" (v < 0: not measured). */
static void md_check_row(FILE *f, const char *label, int v)
{
    fprintf(f, "| %s | %s | true | %s |\n", label, v < 0 ? "—" : v ? "true" : "false",
            v < 0 ? "—" : v ? "yes" : "NO");
}

/* The parts of a weight sync (ws[WS_PARTS]) in ms, "%.3f" each. */
static void ws_ms(char ms[WS_PARTS][32], const double *ws)
{
    for (int k = 0; k < WS_PARTS; k++) fmt_num(ms[k], sizeof ms[k], ws[k] * 1e3, "%.3f");
}

static void write_md(FILE *f, const void *results, const bench_label_t *l)
{
    const results_t *r = results;
    const headline_t *h = &r->head;
    char a[64], label[96], wb[32], tb[32];
    human_bytes(wb, sizeof wb, (double)r->weight_bytes);
    human_bytes(tb, sizeof tb, (double)r->tensor_bytes);
    fprintf(f, "# Sharing between processes — %s, %s\n\n", r->info.ok ? r->info.device_name : "unknown device", l->date);
    fprintf(f, "- command: `%s`; code: commit %s; backend %s, driver %d; %d failure(s)\n", l->command,
            l->commit, r->info.ok ? r->info.backend_name : "unknown", r->info.driver_version, g_nerrors);
    fprintf(f, "- every run in fresh processes: the coordinator forks one exporter and one importer per "
               "run (before any pool or CUDA context exists in it), each makes its own pool; times "
               "that cross processes are CLOCK_MONOTONIC (system-wide)\n");
    fprintf(f, "- import: gm_share_connect + gm_share_import of one 1 GiB gm_alloc_shareable block, until "
               "gm_share_import returns (mapped); median and p90 (linear interpolation) of %d runs, a "
               "fresh importer and exporter each; release and disconnect not timed\n", IMPORT_RUNS);
    fprintf(f, "- import 64: 64 blocks of 16 MiB published under one name with gm_share_publish_ranges; "
               "gm_share_connect + one gm_share_import_ranges (one request, then the page-descriptor "
               "round trips); median of %d. Names: the same 64 blocks under 64 names, 64 "
               "gm_share_import calls on one connection\n", IMPORT64_RUNS);
    fprintf(f, "- weight sync: %s as one gm_alloc_shareable buffer of %d tensors of %s (each filled "
               "with gm_memset, the stream synchronized before the clock starts), published "
               "GM_SHARE_READ_ONLY under one name; from the start of gm_share_publish in the exporter "
               "until the importer has connected, imported it and read the last byte of every tensor "
               "with gm_memcpy (checked). Per tensor: %d blocks of %s under one name "
               "(gm_share_publish_ranges, gm_share_import_ranges); per name: the same under %d names, "
               "imported one by one on one connection; one run each%s\n",
            wb, TENSORS, tb, TENSORS, tb, TENSORS,
            quick() ? "; SHARE_BENCH_QUICK=1: scaled down from 8 GiB" : "");
    fprintf(f, "- dead importer: the importer maps a 1 GiB block; the exporter unpublishes it and "
               "gm_free's it (held for the peer: a still-published block would stay held by its "
               "publication); the coordinator kill -9's the importer and writes to the exporter's pipe "
               "at once; from the exporter reading that until held_for_peers_bytes == 0 and live_blocks "
               "dropped (polled every %d µs); median of %d\n", POLL_US, DEAD_IMPORTER_RUNS);
    fprintf(f, "- dead exporter: the exporter reads free_memory, allocates and publishes 1 GiB; the "
               "importer maps it; the coordinator kill -9's the exporter and waitpid's it, then tells the "
               "importer, which calls gm_share_release and polls gm_pool_device_info free_memory every "
               "%d µs until it is within 64 MiB of the exporter's reading; from kill(); median of %d\n",
            POLL_US, DEAD_EXPORTER_RUNS);
    fprintf(f, "- read-only: an importer of a GM_SHARE_READ_ONLY name (its own process) reads 4 KiB "
               "back, then tries gm_memset + gm_stream_synchronize on it; the exporter then reads its "
               "block back to see whether the bytes changed\n");
    fprintf(f, "- legacy IPC: cuMemAlloc 1 GiB + cuIpcGetMemHandle in one process, cuIpcOpenMemHandle "
               "timed in another (primary context made first), %d open/close pairs in one process: "
               "median, and the first (compare it with import_us, which is each importer's first "
               "import)\n\n", LEGACY_PAIRS);

    fprintf(f, "| figure | value | goal | met |\n|---|---:|---:|:---:|\n");
    md_figure(f, "import_us (1 GiB)", &h->import_us, 1, "%.0f", NULL, NULL);
    md_figure(f, "import_p90_us", &h->import_p90_us, 1, "%.0f", NULL, NULL);
    md_figure(f, "import_64_us (64 × 16 MiB under one name, one request)", &h->import_64_us, 1, "%.0f",
           NULL, NULL);
    md_figure(f, "import_64_names_us (the same 64 blocks, a name each)", &h->import_64_names_us, 1,
           "%.0f", NULL, NULL);
    snprintf(label, sizeof label, "weight_sync_s (%s, one name)", wb);
    md_figure(f, label, &h->weight_sync_s, 1, "%.4f", "0.5", met(h->weight_sync_s, 0.5));
    snprintf(label, sizeof label, "weight_sync_per_tensor_s (%d blocks under one name)", TENSORS);
    md_figure(f, label, &h->weight_sync_per_tensor_s, 1, "%.4f", NULL, NULL);
    snprintf(label, sizeof label, "weight_sync_per_name_s (%d blocks, a name each)", TENSORS);
    md_figure(f, label, &h->weight_sync_per_name_s, 1, "%.4f", NULL, NULL);
    md_figure(f, "dead_importer_reclaim_ms", &h->di_ms, 1, "%.2f", "1000", met(h->di_ms, 1000));
    fmt_num(a, sizeof a, h->de_ms, "%.2f");
    fprintf(f, "| dead_exporter_reclaim_ms | %s%s | 1000 | %s |\n", a, *r->de_note ? " (see note)" : "",
            met(h->de_ms, 1000));
    md_check_row(f, "readonly_enforced", r->ro_enforced);
    md_check_row(f, "readonly_read_ok", r->ro_read_ok);
    md_figure(f, "legacy_ipc_open_us (median; first)", (const double[]){h->legacy_us, h->legacy_first_us},
           2, "%.0f", NULL, NULL);
    fputc('\n', f);

    md_runs(f, "Runs — import µs: ", r->import_runs, r->n_import, "%.0f", "");
    md_runs(f, " (of which gm_share_connect: ", r->import_connect_runs, r->n_import, "%.0f", "");
    md_runs(f, "; driver calls in the importer: ", r->import_bk_imp, r->n_import, "%.0f", "");
    md_runs(f, "; in the exporter's server: ", r->import_bk_exp, r->n_import, "%.0f", "");
    if (r->n_import)
        fprintf(f, "; per run %.0f import_fd + %.0f map + %.0f set_access in the importer, %.0f "
                   "export_fd in the exporter", r->import_calls[0], r->import_calls[1],
                r->import_calls[2], r->import_calls[3]);
    fputc(')', f);
    md_runs(f, "; import 64 µs: ", r->import64_runs, r->n_import64, "%.0f", "");
    md_runs(f, "; dead importer ms: ", r->di_runs, r->n_di, "%.2f", "");
    md_runs(f, " (from kill(): ", r->di_from_kill, r->n_di, "%.2f", ")");
    md_runs(f, "; dead exporter ms: ", r->de_runs, r->n_de, "%.2f", "");
    md_runs(f, " (of which kill() to the importer told, waitpid included: ", r->de_wait, r->n_de,
            "%.2f", "");
    md_runs(f, "; gm_share_release: ", r->de_release, r->n_de, "%.2f", ")");
    md_runs(f, "; legacy opens µs: ", r->legacy_runs, r->n_legacy, "%.0f", ".\n\n");
    char one[WS_PARTS][32], per[WS_PARTS][32];
    ws_ms(one, r->ws);
    ws_ms(per, r->wst);
    fprintf(f, "Weight sync, one name (ms): the publish call %s (publish start to the importer told: "
               "%s), connect + import %s, the %d byte checks %s. ", one[WS_PUBLISH_CALL],
            one[WS_PUBLISH], one[WS_IMPORT], TENSORS, one[WS_CHECK]);
    fprintf(f, "Per tensor (ms): the %d publish calls %s (to the importer told: %s), connect + %d "
               "imports %s, checks %s.\n\n", TENSORS, per[WS_PUBLISH_CALL], per[WS_PUBLISH], TENSORS,
            per[WS_IMPORT], per[WS_CHECK]);
    if (r->ro_enforced >= 0)
        fprintf(f, "Read-only: import access %d (GM_SHARE_READ_ONLY = %d); write attempt: %s; exporter's "
                   "bytes %s afterwards.%s%s\n\n", r->ro_access, GM_SHARE_READ_ONLY,
                *r->ro_error ? r->ro_error : "no error (not enforced)",
                r->ro_intact < 0 ? "not checked" : r->ro_intact ? "unchanged" : "CHANGED",
                *r->ro_read_error ? " Read back failed: " : "", r->ro_read_error);
    if (*r->de_note) fprintf(f, "Dead exporter note: %s\n\n", r->de_note);
    if (*r->legacy_note) fprintf(f, "Legacy IPC note: %s\n\n", r->legacy_note);
    if (r->di_timeouts)
        fprintf(f, "Dead importer: %d run(s) not reclaimed within %.0f s (in the median at the "
                   "time they gave up: a lower bound).\n\n",
                r->di_timeouts, RECLAIM_WAIT_S);
    md_failures(f);
}

/* ---- main ------------------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr, "usage: share_bench [--json FILE] [--md FILE] [--command TEXT]\n"
                    "  GPUMEM_BACKEND=sim: the sim backend; unset: auto (cuda on a GPU machine)\n"
                    "  SHARE_BENCH_QUICK=1: weight sync at 1 GiB instead of 8 GiB\n");
}

int main(int argc, char **argv)
{
    const char *json_path = NULL, *md_path = NULL, *command_arg = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
        else if (!strcmp(argv[i], "--md") && i + 1 < argc) md_path = argv[++i];
        else if (!strcmp(argv[i], "--command") && i + 1 < argc) command_arg = argv[++i];
        else {
            usage();
            return 2;
        }
    }
    g_coordinator = getpid();
    signal(SIGPIPE, SIG_IGN);
    tp_kill_all_at_exit(); /* children killed at exit and on SIGINT, SIGTERM, SIGHUP */

    const char *const envs[] = {"GPUMEM_BACKEND", "SHARE_BENCH_QUICK", "GPUMEM_SIM_CAPACITY"};
    bench_label_t lbl;
    bench_label(&lbl, command_arg, envs, sizeof envs / sizeof envs[0], argc, argv);

    static results_t r;
    memset(&r, 0, sizeof r);
    r.ro_enforced = r.ro_read_ok = r.ro_intact = r.ro_access = -1;
    for (int k = 0; k < WS_PARTS; k++) r.ws[k] = r.wst[k] = NAN;
    r.wsn = NAN;
    r.weight_bytes = quick() ? GiB : 8 * GiB;
    r.tensor_bytes = r.weight_bytes / TENSORS;
    double t_start = now();

    if (run_info(&r.info) == 0)
        fprintf(stderr, "share_bench: %s backend, device %d \"%s\", driver %d, %.1f GiB, pages of %llu KiB\n",
                r.info.backend_name, r.info.device, r.info.device_name, r.info.driver_version,
                (double)r.info.total_memory / (double)GiB,
                (unsigned long long)(r.info.granularity >> 10));
    if (!r.info.ok) {
        add_error("no pool could be made: nothing measured");
    } else {
        char ctx[64];
        for (int k = 0; k < IMPORT_RUNS; k++) {
            snprintf(ctx, sizeof ctx, "import run %d", k + 1);
            double us, cus, bd[6];
            if (run_import(ctx, 1, GiB, 0, &us, &cus, bd) == 0) {
                r.import_bk_imp[r.n_import] = bd[0];
                r.import_bk_exp[r.n_import] = bd[4];
                r.import_calls[0] = bd[1], r.import_calls[1] = bd[2];
                r.import_calls[2] = bd[3], r.import_calls[3] = bd[5];
                r.import_runs[r.n_import] = us;
                r.import_connect_runs[r.n_import++] = cus;
                fprintf(stderr, "share_bench: %s: %.0f µs (connect %.0f µs; driver calls: importer "
                        "%.0f µs for %.0f import_fd + %.0f map + %.0f set_access, exporter %.0f µs "
                        "for %.0f export_fd)\n", ctx, us, cus, bd[0], bd[1], bd[2], bd[3], bd[4], bd[5]);
            }
        }
        for (int k = 0; k < IMPORT64_RUNS; k++) {
            snprintf(ctx, sizeof ctx, "import_64 run %d", k + 1);
            double us;
            if (run_import(ctx, IMPORT64_BLOCKS, 16 * MiB, 1, &us, NULL, NULL) == 0) {
                r.import64_runs[r.n_import64++] = us;
                fprintf(stderr, "share_bench: %s (one name, one request): %.0f µs\n", ctx, us);
            }
            if (run_import(ctx, IMPORT64_BLOCKS, 16 * MiB, 0, &us, NULL, NULL) == 0) {
                r.import64n_runs[r.n_import64n++] = us;
                fprintf(stderr, "share_bench: %s (64 names): %.0f µs\n", ctx, us);
            }
        }
        double w[WS_PARTS];
        if (run_weights("weight_sync (one name)", false, 0, r.weight_bytes, w) == 0) {
            memcpy(r.ws, w, sizeof w);
            fprintf(stderr, "share_bench: weight_sync %zu MiB, one name: %.4f s (import %.4f s, checks %.4f s)\n",
                    r.weight_bytes / MiB, w[0], w[1], w[2]);
        }
        if (run_weights("weight_sync (per tensor)", true, 1, r.weight_bytes, w) == 0) {
            memcpy(r.wst, w, sizeof w);
            fprintf(stderr, "share_bench: weight_sync %zu MiB, %d blocks under one name: %.4f s (import %.4f s, checks %.4f s)\n",
                    r.weight_bytes / MiB, TENSORS, w[0], w[1], w[2]);
        }
        if (run_weights("weight_sync (per tensor, a name each)", true, 0, r.weight_bytes, w) == 0) {
            r.wsn = w[0];
            fprintf(stderr, "share_bench: weight_sync %zu MiB, %d names: %.4f s (import %.4f s, checks %.4f s)\n",
                    r.weight_bytes / MiB, TENSORS, w[0], w[1], w[2]);
        }
        for (int k = 0; k < DEAD_IMPORTER_RUNS; k++) {
            snprintf(ctx, sizeof ctx, "dead_importer run %d", k + 1);
            double ms, fk;
            bool reached;
            if (run_dead_importer(ctx, &ms, &fk, &reached) == 0) {
                /* A run that timed out counts at its timeout (a lower bound). */
                r.di_runs[r.n_di] = ms;
                r.di_from_kill[r.n_di++] = fk;
                if (!reached) r.di_timeouts++;
                fprintf(stderr, "share_bench: %s: %.3f ms (from kill() %.3f ms)%s\n", ctx, ms, fk,
                        reached ? "" : " NOT RECLAIMED");
            }
        }
        for (int k = 0; k < DEAD_EXPORTER_RUNS; k++) {
            snprintf(ctx, sizeof ctx, "dead_exporter run %d", k + 1);
            double o[8];
            if (run_dead_exporter(ctx, o) == 0) {
                int n = r.n_de++;
                r.de_runs[n] = o[0];
                r.de_release[n] = o[1];
                r.de_wait[n] = o[7];
                r.de_baseline[n] = o[2];
                r.de_after_alloc[n] = o[3];
                r.de_imported[n] = o[4];
                r.de_final[n] = o[5];
                if (o[6] == 0) r.de_timeouts++;
                fprintf(stderr, "share_bench: %s: %.3f ms (release %.3f ms); free MiB: baseline %.0f, "
                        "after alloc %.0f, imported %.0f, final %.0f%s\n", ctx, o[0], o[1],
                        o[2] / (double)MiB, o[3] / (double)MiB, o[4] / (double)MiB, o[5] / (double)MiB,
                        o[6] != 0 ? "" : " NOT BACK");
            }
        }
        if (run_readonly(&r) == 0)
            fprintf(stderr, "share_bench: readonly: enforced %d (%s), read ok %d, exporter's bytes intact %d\n",
                    r.ro_enforced, r.ro_error, r.ro_read_ok, r.ro_intact);
        if (r.info.backend == GM_BACKEND_CUDA) {
            if (run_legacy(&r) == 0)
                fprintf(stderr, "share_bench: legacy IPC open: first %.0f µs, median %.0f µs\n",
                        r.legacy_runs[0], median_of(r.legacy_runs, r.n_legacy));
        } else {
            snprintf(r.legacy_note, sizeof r.legacy_note,
                     "not measured: the %s backend has no CUDA driver to open IPC handles with "
                     "(measured on the cuda backend only)", r.info.backend_name);
        }
    }

    /* The dead exporter's figure on the sim: its free memory is per process. */
    if (r.info.ok && r.info.backend != GM_BACKEND_CUDA && r.n_de > 0) {
        snprintf(r.de_note, sizeof r.de_note,
                 "%s backend: free_memory is each process's own simulated capacity minus the pages "
                 "it created itself; the exporter's allocation never shows in the importer's figure "
                 "(it does not change: baseline %.0f MiB, the importer read %.0f MiB while mapping), "
                 "so the condition holds at once and the figure is kill() -> waitpid -> pipe -> "
                 "gm_share_release -> one poll, not the device giving memory back",
                 r.info.backend_name, r.de_baseline[0] / (double)MiB, r.de_imported[0] / (double)MiB);
    } else if (r.de_timeouts) {
        snprintf(r.de_note, sizeof r.de_note,
                 "%d of %d runs: free_memory did not come back within 64 MiB of the baseline in "
                 "%.0f s after gm_share_release (the timed-out runs are in the median at their "
                 "timeout)", r.de_timeouts, r.n_de, RECLAIM_WAIT_S);
    }

    r.head = (headline_t){
        .import_us = median_of(r.import_runs, r.n_import),
        .import_p90_us = quantile_of(r.import_runs, r.n_import, 0.9),
        .import_64_us = median_of(r.import64_runs, r.n_import64),
        .weight_sync_s = r.ws[WS_TOTAL],
        .weight_sync_per_tensor_s = r.wst[WS_TOTAL],
        .import_64_names_us = median_of(r.import64n_runs, r.n_import64n),
        .weight_sync_per_name_s = r.wsn,
        .di_ms = median_of(r.di_runs, r.n_di),
        .de_ms = median_of(r.de_runs, r.n_de),
        .legacy_us = median_of(r.legacy_runs, r.n_legacy),
        .legacy_first_us = r.n_legacy ? r.legacy_runs[0] : NAN,
    };
    /* A median over fewer runs than asked for is still reported, and the
     * missing runs are among the errors. */
    fprintf(stderr, "share_bench: done in %.1f s, %d failure(s)\n", now() - t_start, g_nerrors);

    return bench_write(json_path, md_path, write_json, write_md, &r, &lbl);
}
