/* SPDX-License-Identifier: Apache-2.0 */
/*
 * broker_bench.c — the machine broker (`gpumem broker`, tools/lib/broker.c)
 * timed and checked with real processes.
 *
 *   quota_overshoot_bytes  CLIENTS processes (32 by default) allocate and
 *                       free at random under one tenant quota (1 GiB on a
 *                       GPU, 256 MiB on the sim; blocks of 1 to 32 pages,
 *                       at most RACE_SLOTS each, one given back after each
 *                       refusal) for 5 s (--race-seconds), far more than
 *                       the quota in all; how far the tenant ever got over
 *                       its quota, by three counts:
 *                         books   the broker's own: its tenant row polled
 *                                 (gm_broker_query) all the time, and the
 *                                 peak it keeps
 *                         clients what the clients hold by their own
 *                                 counters, at moments when every client is
 *                                 stopped (SIGSTOP): pages imported minus
 *                                 pages released (the import_fd and
 *                                 phys_release calls that gm_pool_stats
 *                                 counts, read without the pool's lock:
 *                                 the pool's reserved bytes plus its stock
 *                                 of leased pages), published by a thread
 *                                 of each client in shared memory; a lower
 *                                 bound that needs no trust in timing (see
 *                                 freeze_once)
 *                         kernel  sim only: at the same moments, the
 *                                 distinct memfd inodes named
 *                                 "/memfd:gpumem-sim-page" in
 *                                 /proc/PID/fd of every client (each page
 *                                 is one memfd; a client holds a descriptor
 *                                 for each page it holds)
 *                       each max(observed - quota, 0); the figure is the
 *                       largest.  Also checked: no page in two clients at
 *                       once (sim), the kernel count never above the
 *                       broker's books, the tenant back to 0 at the end,
 *                       and that the race pressed on the quota (refusals).
 *                       BROKER_BENCH_SELFTEST=1 checks the checker: the
 *                       broker gets 1.5 times the quota the counts are
 *                       judged against, and every count must see it.
 *   lease_us            a pool with broker_lease = 64 MiB (one lease = 32
 *                       pages of 2 MiB) allocates 64 MiB with an empty
 *                       stock: gm_alloc's wall time (the lease's socket
 *                       round trip, 32 imports, the map); the pool is
 *                       trimmed between runs (gm_trim(0) empties the stock
 *                       too).  Median and p90 of LEASE_RUNS after a warm-up;
 *                       warm = the broker's free list holds made pages
 *                       (keep_free 1 GiB), cold (lease_cold_us) = keep_free
 *                       0, every lease makes its pages.  For comparison:
 *                       the same in a pool without a broker (lease_local_us)
 *   reclaim_ms          a client holding RECLAIM bytes (1 GiB on a GPU,
 *                       256 MiB on the sim, written with gm_memset) is
 *                       killed with SIGKILL: from kill() until the broker's
 *                       tenant row is back to what it was before the client
 *                       started (polled every 200 µs); median and max of
 *                       RECLAIM_RUNS
 *   steady_alloc_ns     one process, two pools: one leasing from a broker,
 *                       one without (steady_alloc_ns_local); alloc+free
 *                       pairs of 512 B, 64 KiB and 2 MiB once warm: median
 *                       over 21 batches of 2000 pairs, the two pools
 *                       alternating batch by batch; steady_alloc_ratio =
 *                       the median over the batches of broker / local (two
 *                       batches run back to back), "no slower" = every
 *                       ratio <= STEADY_TOLERANCE
 *
 * Process rules (as in share_bench.c): the coordinator (main) never makes a
 * pool or a CUDA context; every broker (gm_cli_broker, the code of `gpumem
 * broker`, with a config file of its own in a fresh directory) and every
 * client is a forked child.  Children report through one shared-memory
 * block; every wait is bounded; a child that fails writes the step and
 * gm_last_error() there and exits 1; the coordinator records it, kills what
 * is left of that part and goes on; the exit status is then 1.  Children
 * die with the coordinator (PR_SET_PDEATHSIG) and by alarm() at worst.
 *
 * Backend: GPUMEM_BACKEND=sim gives the sim, unset gives GM_BACKEND_AUTO
 * (cuda on a GPU machine); the brokers use the backend the first pool got.
 *
 * usage: broker_bench [--out DIR] [--json FILE] [--md FILE] [--command TEXT]
 *                     [--clients N] [--race-seconds S] [--quota BYTES]
 *                     [--parts race,lease,reclaim,steady] [--quick] [--deadline S]
 *   --quick: 2 s of race, 10 lease runs, 3 reclaim runs; --deadline S: a
 *   part that might not end within S s of the start is skipped (a failure)
 *   so the results are written in time.
 *   --out DIR writes DIR/broker.json and DIR/broker.md; without --out or
 *   --json the JSON goes to stdout.  bench/run_broker_bench.sh runs it.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pipe2, strsignal (CMake defines it for the whole tree) */
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpumem.h"
#include "internal.h" /* the pool's backend-call counters, read without its lock */
#include "lib/broker.h"

#define BENCH_NAME "broker_bench"
#include "bench_util.h"
#include "lib/procs.h"

#define MiB ((uint64_t)1 << 20)
#define GiB ((uint64_t)1 << 30)

#define MAX_CLIENTS 256
#define NV 160                /* doubles a child can report */
#define CHILD_ALARM_S 600     /* a child still alive after this long dies (SIGALRM) */
#define READY_WAIT_S 240.0    /* children making their pools (32 CUDA contexts at once) */
#define DONE_WAIT_S 120.0
#define BROKER_WAIT_S 60.0    /* a broker answering its first query */
#define RECLAIM_WAIT_S 20.0   /* reclaim polls give up after this long (recorded) */
#define POLL_US 200           /* the broker's books polled this often */
#define LEASE_BYTES (64 * MiB)
#define LEASE_RUNS 30
#define RECLAIM_RUNS 10
#define STEADY_BATCHES 21
#define STEADY_PAIRS 2000
#define STEADY_TOLERANCE 1.05 /* "no slower": broker / local at most this */
#define FREEZE_EVERY_MS 25    /* race: all clients stopped and counted this often */
#define REPORT_EVERY_US 500   /* race: a client's counters published this often */
#define RACE_SLOTS 3          /* race: blocks a client holds at most */
#define RACE_RECLAIM_MS 20    /* race: the broker's reclaim_ms (how long a lease over the quota waits) */
#define TENANT "bench"

/* ---- small helpers ---------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ---- shared memory between the coordinator and its children ------------------ */

enum { S_START, S_READY, S_DONE, S_FAILED };

typedef struct slot {
    _Atomic int state;
    /* race: written by the client's reporter thread only; seq is odd while
     * it writes (imports/releases: the pool's import_fd and phys_release
     * calls, as gm_pool_stats counts them). */
    _Atomic uint64_t seq, imports, releases;
    /* race: written by the client's main thread */
    _Atomic uint64_t ops, allocs, limit_refusals, oom_refusals, trims;
    /* results, written before state becomes S_DONE / S_READY */
    double v[NV];
    uint64_t u[16];
    char name[128], name2[32];
    char err[512];
} slot_t;

typedef struct shared {
    _Atomic int go, stop;
    slot_t slot[MAX_CLIENTS];
} shared_t;

static shared_t *g_sh;
static int g_slot = -1;      /* a child's slot */
static gm_backend_kind_t g_backend = GM_BACKEND_AUTO; /* what children's pools ask for */

static void slot_reset(int i)
{
    slot_t *s = &g_sh->slot[i];
    memset(s, 0, sizeof *s);
    atomic_store(&s->state, S_START);
}

/* ---- the child's side --------------------------------------------------------- */

/* The step that failed (and gm_last_error()) into the child's slot, then
 * exit 1; CK (bench_util.h) calls it. */
static void child_fail(const char *fmt, ...)
{
    slot_t *s = &g_sh->slot[g_slot];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, sizeof s->err, fmt, ap);
    va_end(ap);
    atomic_store(&s->state, S_FAILED);
    _exit(1);
}

/* A pool of this process: leasing from the broker on sock (lease bytes per
 * lease, 0: GPUMEM_BROKER_LEASE or the default), or without a broker (sock
 * NULL).  The sim gets
 * 16 GiB of its own unless GPUMEM_SIM_CAPACITY says otherwise. */
static gm_pool_t *make_pool(const char *sock, size_t lease)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    CK(gm_config_from_env(&cfg), "gm_config_from_env");
    cfg.backend = g_backend;
    if (g_backend == GM_BACKEND_SIM && !getenv("GPUMEM_SIM_CAPACITY")) cfg.sim_capacity = 16 * GiB;
    snprintf(cfg.broker, sizeof cfg.broker, "%s", sock ? sock : "");
    if (lease) cfg.broker_lease = lease; /* else GPUMEM_BROKER_LEASE, or the default */
    gm_pool_t *pool;
    CK(gm_pool_create(&cfg, &pool), sock ? "gm_pool_create (with the broker)" : "gm_pool_create");
    return pool;
}

/* ---- the coordinator's side --------------------------------------------------- */

static char g_dir[80]; /* sockets, configs, logs (short: socket paths fit 108 bytes) */

static void remove_dir(void)
{
    if (!g_dir[0]) return;
    DIR *d = opendir(g_dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)))
            if (e->d_name[0] != '.') unlinkat(dirfd(d), e->d_name, 0);
        closedir(d);
    }
    rmdir(g_dir);
    g_dir[0] = 0;
}

/* At the coordinator's exit (after its children are killed: tests/lib/procs). */
static void cleanup(void)
{
    if (getpid() != g_coordinator) return;
    remove_dir();
}

typedef struct kid {
    pid_t pid;     /* 0: none, or reaped */
    int slot;
    int status;    /* wait status once reaped */
    bool reaped;
} kid_t;

/* fork(), the output flushed first: in the coordinator the child's pid,
 * tracked (tests/lib/procs kills it at exit), or -1 (recorded: `what`
 * could not fork); 0 in the child. */
static pid_t fork_tracked(const char *what)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) add_error("%s: fork: %s", what, strerror(errno));
    if (pid > 0) tp_track(pid);
    return pid;
}

/* Fork a child that runs fn(arg) in slot `slot` and exits.  -1 (recorded)
 * on failure. */
static int spawn(kid_t *k, int slot, child_fn fn, const void *arg, const char *ctx)
{
    memset(k, 0, sizeof *k);
    k->slot = slot;
    slot_reset(slot);
    pid_t pid = fork_tracked(ctx);
    if (pid < 0) return -1;
    if (pid == 0) {
        g_slot = slot;
        signal(SIGPIPE, SIG_DFL);
        bench_child_init(CHILD_ALARM_S);
        fn(arg);
        _exit(0);
    }
    k->pid = pid;
    return 0;
}

static void mark_reaped(kid_t *k, int st)
{
    tp_untrack(k->pid);
    k->reaped = true;
    k->status = st;
    k->pid = 0;
}

/* Kill -9 and reap (no-op for none). */
static void kill_kid(kid_t *k)
{
    if (k->pid <= 0) return;
    kill(k->pid, SIGCONT);
    kill(k->pid, SIGKILL);
    int st = 0;
    while (waitpid(k->pid, &st, 0) < 0 && errno == EINTR) {}
    mark_reaped(k, st);
}

/* Reap the child if it has exited, without waiting: 1 when it had, 0 when
 * it runs, -1 when waitpid failed (errno). */
static int reap_if_exited(kid_t *k)
{
    int st = 0;
    pid_t r = waitpid(k->pid, &st, WNOHANG);
    if (r != k->pid) return r < 0 ? -1 : 0;
    mark_reaped(k, st);
    return 1;
}

/* After `end`: the child killed, and recorded as not having done `what` in
 * timeout_s; true.  Before it: false. */
static bool overdue(kid_t *k, double end, double timeout_s, const char *ctx, const char *what)
{
    if (now() <= end) return false;
    add_error("%s: child %d (pid %d) %s in %.0f s (killed)", ctx, k->slot, (int)k->pid, what,
              timeout_s);
    kill_kid(k);
    return true;
}

/* How the child ended, in words ("is gone" when it was not reaped here). */
static void how_it_ended(const kid_t *k, char *how, size_t cap)
{
    snprintf(how, cap, "is gone");
    if (k->reaped) describe_status(k->status, how, cap);
}

/* Wait until the child's slot reaches `want`.  0, or -1 (recorded, the
 * child killed) when it failed, exited or did not get there in time. */
static int wait_state(kid_t *k, int want, double timeout_s, const char *ctx)
{
    slot_t *s = &g_sh->slot[k->slot];
    double end = now() + timeout_s;
    for (;;) {
        int st = atomic_load(&s->state);
        if (st == want) return 0;
        if (st == S_FAILED) {
            add_error("%s: child %d failed at %.500s", ctx, k->slot, s->err);
            kill_kid(k);
            return -1;
        }
        if (k->pid > 0 && reap_if_exited(k) == 1) continue; /* its last word may be in the slot */
        if (k->pid <= 0) {
            char how[128];
            how_it_ended(k, how, sizeof how);
            add_error("%s: child %d %s while the coordinator waited for it", ctx, k->slot, how);
            return -1;
        }
        if (overdue(k, end, timeout_s, ctx, "did not get there")) return -1;
        sleep_us(500);
    }
}

/* Wait for the child to exit (timeout_s at most); 0 when it exited with 0. */
static int finish(kid_t *k, double timeout_s, const char *ctx)
{
    double end = now() + timeout_s;
    while (k->pid > 0) {
        int r = reap_if_exited(k);
        if (r == 1) break;
        if (r < 0 && errno != EINTR) {
            add_error("%s: waitpid: %s", ctx, strerror(errno));
            tp_untrack(k->pid);
            k->pid = 0;
            return -1;
        }
        if (overdue(k, end, timeout_s, ctx, "did not exit")) return -1;
        sleep_us(1000);
    }
    if (k->reaped && WIFEXITED(k->status) && WEXITSTATUS(k->status) == 0) return 0;
    char how[128];
    how_it_ended(k, how, sizeof how);
    slot_t *s = &g_sh->slot[k->slot];
    add_error("%s: child %d %s at its end%s%.400s", ctx, k->slot, how,
              s->err[0] ? ": " : "", s->err);
    return -1;
}

/* ---- the brokers ----------------------------------------------------------------- */

typedef struct broker {
    pid_t pid;
    char sock[108], conf[200], log[200], stats[200];
    const char *name;
} broker_t;

/* The last bytes of the broker's log, on one line. */
static void log_tail(const broker_t *b, char *buf, size_t cap)
{
    buf[0] = 0;
    FILE *f = fopen(b->log, "r");
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    long from = n > (long)cap - 1 ? n - (long)cap + 1 : 0;
    fseek(f, from, SEEK_SET);
    size_t got = fread(buf, 1, cap - 1, f);
    buf[got] = 0;
    fclose(f);
    for (char *p = buf; *p; p++)
        if (*p == '\n') *p = '|';
}

/* The tenant row TENANT of the broker on b (and its device figures).  0, or
 * -1 when the query failed or the row is missing. */
static int books(const broker_t *b, gm_broker_tenant_t *t, gm_broker_view_t *whole)
{
    gm_broker_view_t v;
    if (gm_broker_query(b->sock, &v) != GM_OK) return -1;
    int rc = -1;
    for (size_t i = 0; i < v.n; i++)
        if (!strcmp(v.tenants[i].name, TENANT)) {
            *t = v.tenants[i];
            rc = 0;
        }
    free(v.tenants);
    v.tenants = NULL;
    v.n = 0;
    if (whole) *whole = v;
    return rc;
}

/* Start a broker (a forked gm_cli_broker) with one tenant TENANT for this
 * user: quota bytes; capacity bytes of device; keep_free bytes (< 0: the
 * broker's default); reclaim_ms (< 0: default).  0 once it answers. */
static int broker_start(broker_t *b, const char *name, uint64_t quota, uint64_t capacity,
                        long long keep_free, int reclaim_ms, int device, const char *backend)
{
    memset(b, 0, sizeof *b);
    b->name = name;
    snprintf(b->sock, sizeof b->sock, "%s/%s.sock", g_dir, name);
    snprintf(b->conf, sizeof b->conf, "%s/%s.conf", g_dir, name);
    snprintf(b->log, sizeof b->log, "%s/%s.log", g_dir, name);
    snprintf(b->stats, sizeof b->stats, "%s/%s.json", g_dir, name);
    FILE *f = fopen(b->conf, "w");
    if (!f) {
        add_error("broker %s: cannot write %s: %s", name, b->conf, strerror(errno));
        return -1;
    }
    fprintf(f, "# broker_bench, part %s\nsocket = %s\nbackend = %s\ndevice = %d\ncapacity = %" PRIu64
            "\nstats_file = %s\n", name, b->sock, backend, device, capacity, b->stats);
    if (keep_free >= 0) fprintf(f, "keep_free = %lld\n", keep_free);
    if (reclaim_ms >= 0) fprintf(f, "reclaim_ms = %d\n", reclaim_ms);
    fprintf(f, "[tenant %s]\nusers = %u\nquota = %" PRIu64 "\n", TENANT, (unsigned)geteuid(), quota);
    if (fclose(f) != 0) {
        add_error("broker %s: cannot write %s", name, b->conf);
        return -1;
    }
    char what[64];
    snprintf(what, sizeof what, "broker %s", name);
    pid_t pid = fork_tracked(what);
    if (pid < 0) return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != g_coordinator) _exit(3);
        signal(SIGINT, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        if (!freopen(b->log, "w", stderr)) _exit(4);
        setvbuf(stderr, NULL, _IOLBF, 0);
        raise_nofile();
        static char a0[] = "broker", a1[] = "--config";
        char *argv[] = {a0, a1, b->conf, NULL};
        _exit(gm_cli_broker(3, argv));
    }
    b->pid = pid;
    double end = now() + BROKER_WAIT_S;
    for (;;) {
        gm_broker_tenant_t t;
        memset(&t, 0, sizeof t);
        if (books(b, &t, NULL) == 0) {
            if (t.quota != quota) {
                add_error("broker %s: its tenant row says quota %" PRIu64 ", the config %" PRIu64,
                          name, t.quota, quota);
            }
            return 0;
        }
        int st;
        char tail[400];
        if (waitpid(pid, &st, WNOHANG) == pid) {
            tp_untrack(pid);
            b->pid = 0;
            char how[128];
            describe_status(st, how, sizeof how);
            log_tail(b, tail, sizeof tail);
            add_error("broker %s %s before it answered; its log: %s", name, how, tail);
            return -1;
        }
        if (now() > end) {
            log_tail(b, tail, sizeof tail);
            add_error("broker %s did not answer in %.0f s (%s); its log: %s", name, BROKER_WAIT_S,
                      gm_last_error(), tail);
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            tp_untrack(pid);
            b->pid = 0;
            return -1;
        }
        sleep_us(2000);
    }
}

/* SIGTERM, then SIGKILL after 15 s; a status other than 0 is recorded. */
static void broker_stop(broker_t *b)
{
    if (b->pid <= 0) return;
    kill(b->pid, SIGTERM);
    double end = now() + 15;
    int st = 0;
    bool killed = false;
    for (;;) {
        pid_t r = waitpid(b->pid, &st, WNOHANG);
        if (r == b->pid) break;
        if (r < 0 && errno != EINTR) break;
        if (!killed && now() > end) {
            kill(b->pid, SIGKILL);
            killed = true;
        }
        sleep_us(1000);
    }
    tp_untrack(b->pid);
    b->pid = 0;
    if (killed || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        char how[128], tail[400];
        describe_status(st, how, sizeof how);
        log_tail(b, tail, sizeof tail);
        add_error("broker %s %s after SIGTERM%s; its log: %s", b->name, how,
                  killed ? " (it did not stop in 15 s: killed)" : "", tail);
    }
}

/* ---- the info child -------------------------------------------------------------- */

/* The backend for a broker's config: the one the first pool got. */
static const char *bk_name(const info_t *info)
{
    return info->backend == GM_BACKEND_CUDA ? "cuda" : info->backend == GM_BACKEND_SIM ? "sim" : "auto";
}

static void info_main(const void *arg)
{
    (void)arg;
    slot_t *s = &g_sh->slot[g_slot];
    gm_pool_t *pool = make_pool(NULL, 0);
    gm_device_info_t di = GM_DEVICE_INFO_INIT;
    CK(gm_pool_device_info(pool, &di), "gm_pool_device_info");
    snprintf(s->name, sizeof s->name, "%s", di.device_name);
    snprintf(s->name2, sizeof s->name2, "%s", di.backend_name);
    s->u[0] = (uint64_t)di.backend;
    s->u[1] = (uint64_t)di.device;
    s->u[2] = (uint64_t)di.driver_version;
    s->u[3] = di.total_memory;
    s->u[4] = di.free_memory;
    s->u[5] = di.granularity;
    gm_pool_destroy(pool);
    atomic_store(&s->state, S_DONE);
}

static int run_info(info_t *out)
{
    const char *ctx = "device info";
    kid_t k;
    if (spawn(&k, 0, info_main, NULL, ctx)) return -1;
    if (wait_state(&k, S_DONE, READY_WAIT_S, ctx)) return -1;
    slot_t *s = &g_sh->slot[0];
    snprintf(out->device_name, sizeof out->device_name, "%s", s->name);
    snprintf(out->backend_name, sizeof out->backend_name, "%s", s->name2);
    out->backend = (int)s->u[0];
    out->device = (int)s->u[1];
    out->driver_version = (int)s->u[2];
    out->total_memory = s->u[3];
    out->free_memory = s->u[4];
    out->granularity = s->u[5];
    out->ok = true;
    return finish(&k, 60, ctx);
}

/* ---- part 1: racing clients under one quota ------------------------------------ */

typedef struct race_arg {
    const char *sock;
    uint64_t quota, page;
} race_arg_t;

typedef struct reporter {
    gm_pool_t *pool;
    slot_t *s;
    _Atomic int quit;
} reporter_t;

/* Publish the pool's counters: seq odd while writing.  They are the ones
 * gm_pool_stats reports (backend_calls), read here without taking the
 * pool's lock: a client waiting for a lease holds that lock for up to the
 * broker's reclaim_ms, and the count must not wait for it.  The broker
 * provider makes every import and release of a leased page on the root
 * pool (src/broker/client.c), so the root's counters are the process's. */
static void report_now(reporter_t *r)
{
    uint64_t imp, rel;
    bench_pool_page_calls(r->pool, &imp, &rel);
    atomic_fetch_add(&r->s->seq, 1);
    atomic_store(&r->s->imports, imp);
    atomic_store(&r->s->releases, rel);
    atomic_fetch_add(&r->s->seq, 1);
}

static void *reporter_main(void *arg)
{
    reporter_t *r = arg;
    while (!atomic_load(&r->quit)) {
        report_now(r);
        sleep_us(REPORT_EVERY_US);
    }
    report_now(r);
    return NULL;
}

static void race_main(const void *arg)
{
    const race_arg_t *a = arg;
    slot_t *s = &g_sh->slot[g_slot];
    gm_pool_t *pool = make_pool(a->sock, 0);
    reporter_t rep = {.pool = pool, .s = s};
    pthread_t th;
    if (pthread_create(&th, NULL, reporter_main, &rep) != 0) child_fail("pthread_create failed");
    /* Sizes of 1 to 32 pages, none above a quarter of the quota. */
    uint64_t sizes[6];
    int nsizes = 0;
    for (uint64_t p = 1; p <= 32 && nsizes < 6; p *= 2)
        if (p * a->page <= a->quota / 4 || nsizes == 0) sizes[nsizes++] = p * a->page;
    void *live[RACE_SLOTS] = {0};
    uint64_t x = 0x5eed0000ull + (uint64_t)g_slot * 7919;
    atomic_store(&s->state, S_READY);
    while (!atomic_load(&g_sh->go) && !atomic_load(&g_sh->stop)) sleep_us(100);
    uint64_t ops = 0, allocs = 0, lim = 0, oom = 0, trims = 0;
    while (!atomic_load_explicit(&g_sh->stop, memory_order_relaxed)) {
        uint64_t r = splitmix64(&x);
        int i = (int)(r % RACE_SLOTS);
        if (live[i]) {
            CK(gm_free(pool, live[i], NULL), "gm_free");
            live[i] = NULL;
            if ((r >> 20) % 16 == 0) {
                CK(gm_trim(pool, 0, NULL), "gm_trim");
                trims++;
            }
        } else {
            uint64_t size = sizes[(r >> 32) % (uint64_t)nsizes];
            int rc = gm_alloc(pool, size, NULL, &live[i]);
            if (rc == GM_OK) allocs++;
            else if (rc == GM_LIMIT) lim++;
            else if (rc == GM_OUT_OF_MEMORY) oom++;
            else child_fail("gm_alloc of %" PRIu64 " bytes: %s (%s)", size, gm_errname(rc),
                            gm_last_error());
            if (rc != GM_OK) {
                /* Refused: give something back, as a program that shrinks
                 * its batch would, so the pages keep moving. */
                live[i] = NULL;
                int j = (int)((r >> 40) % RACE_SLOTS);
                if (live[j]) {
                    CK(gm_free(pool, live[j], NULL), "gm_free");
                    live[j] = NULL;
                }
            }
        }
        ops++;
        atomic_store_explicit(&s->ops, ops, memory_order_relaxed);
        atomic_store_explicit(&s->allocs, allocs, memory_order_relaxed);
        atomic_store_explicit(&s->limit_refusals, lim, memory_order_relaxed);
        atomic_store_explicit(&s->oom_refusals, oom, memory_order_relaxed);
        atomic_store_explicit(&s->trims, trims, memory_order_relaxed);
    }
    atomic_store(&rep.quit, 1);
    pthread_join(th, NULL);
    for (int i = 0; i < RACE_SLOTS; i++)
        if (live[i]) CK(gm_free(pool, live[i], NULL), "gm_free");
    CK(gm_pool_check(pool), "gm_pool_check");
    gm_pool_destroy(pool);
    atomic_store(&s->state, S_DONE);
}

typedef struct race_res {
    bool ran, kernel;               /* kernel: the sim's memfd count was taken */
    bool selftest;                  /* BROKER_BENCH_SELFTEST: the broker's quota is 1.5x */
    bool freeze_broken;             /* a client did not stop in time: no more freezes */
    int clients, ready;
    uint64_t quota, page, capacity;
    double seconds;
    uint64_t samples, query_failures, freezes, freezes_counted, freeze_timeouts;
    uint64_t books_max_used, books_peak;
    uint64_t counted_max, naive_max, counted_upper_max; /* clients' counters, bytes */
    uint64_t kernel_max, shared_pages_max, kernel_over_books_max;
    uint64_t refusals, reclaims, used_after;
    uint64_t ops, allocs, limit_refusals, oom_refusals, trims;
    double freeze_ms_median, freeze_ms_max;
    double over_books, over_clients, over_kernel; /* NAN: not measured */
} race_res_t;

typedef struct inode_ent {
    dev_t dev;
    ino_t ino;
    int who;
} inode_ent_t;

typedef struct ino_set {
    inode_ent_t *v;
    size_t n, cap;
} ino_set_t;

static int cmp_ino(const void *a, const void *b)
{
    const inode_ent_t *x = a, *y = b;
    if (x->dev != y->dev) return x->dev < y->dev ? -1 : 1;
    if (x->ino != y->ino) return x->ino < y->ino ? -1 : 1;
    return (x->who > y->who) - (x->who < y->who);
}

/* The sim's page memfds open in pid (a stopped client), into set. */
static int scan_fds(pid_t pid, int who, ino_set_t *set)
{
    static const char name[] = "/memfd:gpumem-sim-page";
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    if (!d) return -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char link[256];
        ssize_t k = readlinkat(dirfd(d), e->d_name, link, sizeof link - 1);
        if (k < 0) continue;
        link[k] = 0;
        if (strncmp(link, name, sizeof name - 1) != 0 ||
            (link[sizeof name - 1] != 0 && link[sizeof name - 1] != ' '))
            continue;
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, 0) != 0) continue;
        if (set->n == set->cap) {
            size_t cap = set->cap ? set->cap * 2 : 1024;
            inode_ent_t *nv = realloc(set->v, cap * sizeof *nv);
            if (!nv) break;
            set->v = nv;
            set->cap = cap;
        }
        set->v[set->n++] = (inode_ent_t){st.st_dev, st.st_ino, who};
    }
    closedir(d);
    return 0;
}

/* Wait until the client has stopped (SIGSTOP sent).  0, or -1 when it
 * exited (reaped) or did not stop in 10 s. */
static int wait_stopped(kid_t *k)
{
    double end = now() + 10;
    while (k->pid > 0) {
        int st = 0;
        pid_t r = waitpid(k->pid, &st, WUNTRACED | WNOHANG);
        if (r == k->pid) {
            if (WIFSTOPPED(st)) return 0;
            if (WIFEXITED(st) || WIFSIGNALED(st)) mark_reaped(k, st);
            return -1;
        }
        if (r < 0 && errno != EINTR) return -1;
        if (now() > end) return -1;
        sleep_us(50);
    }
    return -1;
}

/*
 * Stop every client, count, let them go.
 *
 * The clients' count is a lower bound whatever the timing.  Per client,
 * I_A (imports as its reporter published them before the stop) <= I(stop),
 * and R_B (releases as its reporter read them after the SIGCONT: seq moved
 * on by two whole writes) >= R(stop); so max(I_A - R_B, 0) <= I(stop) -
 * R(stop), the leased pages the client had a handle of at the stop (its
 * reserved bytes plus its stock).  A client releases its handle before it
 * sends the RETURN, so no page has a handle in two clients unless the
 * broker leased it twice: the sum over the clients never counts a page
 * twice and never more than they held.  (An import that failed is counted
 * as an import with no page behind it: it could only make the count too
 * high, never hide an overshoot.)  A, without the bound, is reported too
 * ("published"): it can count a page twice, in the client that released
 * it and in the one that got it next.
 */
static void freeze_once(const broker_t *b, kid_t *kids, int n, race_res_t *r, ino_set_t *set,
                        double *freeze_ms, int *nfreeze)
{
    uint64_t a_seq[MAX_CLIENTS], a_imp[MAX_CLIENTS], a_rel[MAX_CLIENTS];
    bool stopped[MAX_CLIENTS];
    double t0 = now();
    for (int i = 0; i < n; i++)
        if (kids[i].pid > 0) kill(kids[i].pid, SIGSTOP);
    bool all = true;
    for (int i = 0; i < n; i++) {
        stopped[i] = kids[i].pid > 0 && wait_stopped(&kids[i]) == 0;
        if (kids[i].pid > 0 && !stopped[i]) {
            /* Its stop may still be reported later and be taken for the
             * next one's: no more freezes in this race. */
            all = false;
            r->freeze_broken = true;
        }
    }
    for (int i = 0; i < n; i++) {
        slot_t *s = &g_sh->slot[kids[i].slot];
        a_seq[i] = atomic_load(&s->seq);
        a_imp[i] = atomic_load(&s->imports);
        a_rel[i] = atomic_load(&s->releases);
    }
    uint64_t kernel = 0, shared = 0;
    bool kernel_ok = all && r->kernel;
    if (kernel_ok) {
        set->n = 0;
        for (int i = 0; i < n; i++)
            if (stopped[i] && scan_fds(kids[i].pid, i, set) != 0) kernel_ok = false;
        qsort(set->v, set->n, sizeof *set->v, cmp_ino);
        for (size_t j = 0; j < set->n;) {
            size_t e = j + 1;
            int whos = 1;
            while (e < set->n && set->v[e].dev == set->v[j].dev && set->v[e].ino == set->v[j].ino) {
                if (set->v[e].who != set->v[e - 1].who) whos++;
                e++;
            }
            kernel++;
            if (whos > 1) shared++;
            j = e;
        }
        kernel *= r->page;
    }
    gm_broker_tenant_t t;
    memset(&t, 0, sizeof t);
    bool have_books = books(b, &t, NULL) == 0;
    for (int i = 0; i < n; i++)
        if (kids[i].pid > 0) kill(kids[i].pid, SIGCONT);
    double ms = (now() - t0) * 1e3;
    if (*nfreeze < 4096) freeze_ms[(*nfreeze)++] = ms;
    r->freezes++;
    if (kernel_ok) {
        if (kernel > r->kernel_max) r->kernel_max = kernel;
        if (shared > r->shared_pages_max) r->shared_pages_max = shared;
        if (have_books && kernel > t.used && kernel - t.used > r->kernel_over_books_max)
            r->kernel_over_books_max = kernel - t.used;
    }
    if (have_books && t.used > r->books_max_used) r->books_max_used = t.used;
    if (!all) return;
    /* B: each reporter's counters read after the SIGCONT. */
    uint64_t lower = 0, naive = 0, upper = 0;
    double end = now() + 10;
    for (int i = 0; i < n; i++) {
        if (kids[i].pid <= 0) continue;
        slot_t *s = &g_sh->slot[kids[i].slot];
        uint64_t want = (a_seq[i] | 1) + 3;
        while (atomic_load(&s->seq) < want && now() < end && kids[i].pid > 0) sleep_us(50);
        if (atomic_load(&s->seq) < want) {
            r->freeze_timeouts++;
            return;
        }
        uint64_t b_imp = atomic_load(&s->imports), b_rel = atomic_load(&s->releases);
        if (a_imp[i] > b_rel) lower += a_imp[i] - b_rel;
        if (a_imp[i] > a_rel[i]) naive += a_imp[i] - a_rel[i];
        if (b_imp > a_rel[i]) upper += b_imp - a_rel[i];
    }
    r->freezes_counted++;
    lower *= r->page;
    naive *= r->page;
    upper *= r->page;
    if (lower > r->counted_max) r->counted_max = lower;
    if (naive > r->naive_max) r->naive_max = naive;
    if (upper > r->counted_upper_max) r->counted_upper_max = upper;
}

static void run_race(race_res_t *r, const info_t *info, int nclients, double seconds,
                     uint64_t quota, bool selftest)
{
    /* The self-test gives the broker half as much again as the quota the
     * counts are judged against: each count must then see an overshoot. */
    uint64_t broker_quota = selftest ? quota + quota / 2 / info->granularity * info->granularity : quota;
    const char *ctx = "race";
    memset(r, 0, sizeof *r);
    r->over_books = r->over_clients = r->over_kernel = NAN;
    r->page = info->granularity;
    r->quota = quota;
    r->capacity = 2 * broker_quota;
    r->selftest = selftest;
    r->clients = nclients;
    r->kernel = info->backend == GM_BACKEND_SIM;
    broker_t b;
    /* keep_free = the quota: pages given back stay made (the race is about
     * the books, not about making pages); a refused lease waits 20 ms for
     * the tenant's other processes to give pages back. */
    if (broker_start(&b, "race", broker_quota, r->capacity, (long long)broker_quota, RACE_RECLAIM_MS,
                     info->device, bk_name(info)))
        return;
    static kid_t kids[MAX_CLIENTS];
    race_arg_t a = {.sock = b.sock, .quota = quota, .page = r->page};
    atomic_store(&g_sh->go, 0);
    atomic_store(&g_sh->stop, 0);
    int n = 0;
    for (; n < nclients; n++)
        if (spawn(&kids[n], n, race_main, &a, ctx)) break;
    double ready_by = now() + READY_WAIT_S;
    for (int i = 0; i < n; i++) {
        double left = ready_by - now();
        if (wait_state(&kids[i], S_READY, left > 1 ? left : 1, "race: a client making its pool") == 0)
            r->ready++;
    }
    fprintf(stderr, "broker_bench: race: %d of %d clients ready, quota %" PRIu64 " MiB, %.1f s\n",
            r->ready, nclients, quota / MiB, seconds);
    ino_set_t set = {0};
    static double freeze_ms[4096];
    int nfreeze = 0;
    if (r->ready > 0) {
        r->ran = true;
        atomic_store(&g_sh->go, 1);
        double t0 = now(), next_freeze = t0 + FREEZE_EVERY_MS / 1e3;
        while (now() - t0 < seconds) {
            gm_broker_tenant_t t;
            memset(&t, 0, sizeof t);
            if (books(&b, &t, NULL) == 0) {
                r->samples++;
                if (t.used > r->books_max_used) r->books_max_used = t.used;
            } else {
                r->query_failures++;
            }
            if (now() >= next_freeze && !r->freeze_broken) {
                freeze_once(&b, kids, n, r, &set, freeze_ms, &nfreeze);
                next_freeze = now() + FREEZE_EVERY_MS / 1e3;
            }
            sleep_us(POLL_US);
        }
        r->seconds = now() - t0;
    }
    atomic_store(&g_sh->stop, 1);
    free(set.v);
    double done_by = now() + DONE_WAIT_S;
    for (int i = 0; i < n; i++)
        if (kids[i].pid > 0) kill(kids[i].pid, SIGCONT);
    for (int i = 0; i < n; i++) {
        if (kids[i].pid <= 0) continue;
        double left = done_by - now();
        if (wait_state(&kids[i], S_DONE, left > 1 ? left : 1, "race: a client finishing") == 0)
            finish(&kids[i], 60, "race: a client exiting");
    }
    for (int i = 0; i < n; i++) {
        slot_t *s = &g_sh->slot[i];
        r->ops += atomic_load(&s->ops);
        r->allocs += atomic_load(&s->allocs);
        r->limit_refusals += atomic_load(&s->limit_refusals);
        r->oom_refusals += atomic_load(&s->oom_refusals);
        r->trims += atomic_load(&s->trims);
    }
    gm_broker_tenant_t t;
    memset(&t, 0, sizeof t);
    double end = now() + 5;
    while (books(&b, &t, NULL) == 0 && (t.used != 0 || t.clients != 0) && now() < end) sleep_us(1000);
    if (books(&b, &t, NULL) == 0) {
        r->books_peak = t.peak;
        r->refusals = t.refusals;
        r->reclaims = t.reclaims;
        r->used_after = t.used;
        if (t.used != 0)
            add_error("race: every client has exited, and the broker's tenant still holds %" PRIu64
                      " bytes (%" PRIu64 " clients)", t.used, t.clients);
    } else {
        add_error("race: the broker did not answer at the end: %s", gm_last_error());
    }
    broker_stop(&b);
    r->freeze_ms_median = median_of(freeze_ms, nfreeze);
    r->freeze_ms_max = max_of(freeze_ms, nfreeze);
    if (!r->ran) return;
    uint64_t bmax = r->books_peak > r->books_max_used ? r->books_peak : r->books_max_used;
    r->over_books = bmax > quota ? (double)(bmax - quota) : 0;
    if (r->freezes_counted)
        r->over_clients = r->counted_max > quota ? (double)(r->counted_max - quota) : 0;
    if (r->kernel && r->freezes)
        r->over_kernel = r->kernel_max > quota ? (double)(r->kernel_max - quota) : 0;
    if (r->shared_pages_max)
        add_error("race: %" PRIu64 " page(s) were open in two clients at once (same memfd inode)",
                  r->shared_pages_max);
    if (r->kernel_over_books_max)
        add_error("race: the clients held %" PRIu64 " bytes more than the broker's books said",
                  r->kernel_over_books_max);
    if (selftest) {
        /* Every count must have seen the broker's larger quota in use. */
        if (!(r->over_books > 0) || !(r->over_clients > 0) || (r->kernel && !(r->over_kernel > 0)))
            add_error("race self-test: the broker's quota was %" PRIu64 " bytes, the counts were "
                      "judged against %" PRIu64 ", and not all of them saw an overshoot (books %.0f, "
                      "clients %.0f, kernel %.0f)", broker_quota, quota, r->over_books,
                      r->over_clients, r->over_kernel);
        else
            fprintf(stderr, "broker_bench: race self-test passed: every count saw the overshoot "
                    "(books %.0f, clients %.0f, kernel %.0f bytes)\n", r->over_books,
                    r->over_clients, r->over_kernel);
        return;
    }
    /* The race must have pressed on the quota, or it measured nothing. */
    if (bmax + LEASE_BYTES < quota || r->refusals == 0)
        add_error("race: the tenant never came near its quota (peak %" PRIu64 " of %" PRIu64
                  " bytes, %" PRIu64 " refusals): nothing was raced", bmax, quota, r->refusals);
    if (r->freeze_broken)
        add_error("race: a client did not stop within 10 s of SIGSTOP: the counts stopped there");
    if (r->freezes_counted == 0)
        add_error("race: no moment with every client stopped could be counted (%" PRIu64
                  " tries, %" PRIu64 " timeouts)", r->freezes, r->freeze_timeouts);
}

/* ---- part 2: lease latency --------------------------------------------------- */

typedef struct lease_arg {
    const char *sock;
    int runs;
    bool local_too;
} lease_arg_t;

/* runs (+1 untimed) of: gm_alloc 64 MiB in a pool with no pages, gm_free,
 * gm_trim(0).  us[], bk_us[] (time inside backend calls); *odd counts the
 * runs whose gm_alloc did not get exactly one lease's pages (imports for a
 * broker pool, phys_create without). */
static void lease_series(gm_pool_t *pool, bool broker, int runs, uint64_t page, double *us,
                         double *bk_us, uint64_t *odd)
{
    for (int r = -1; r < runs; r++) {
        gm_stats_t a = pool_stats(pool);
        if (a.reserved != 0) (*odd)++; /* not an empty pool: not one whole lease */
        void *p = NULL;
        double t0 = now();
        CK(gm_alloc(pool, LEASE_BYTES, NULL, &p), "gm_alloc 64 MiB");
        double t1 = now();
        gm_stats_t z = pool_stats(pool);
        int k = broker ? GM_CALL_import_fd : GM_CALL_phys_create;
        if (z.backend_calls[k] - a.backend_calls[k] != LEASE_BYTES / page) (*odd)++;
        if (r >= 0) {
            us[r] = (t1 - t0) * 1e6;
            bk_us[r] = (double)(z.backend_ns - a.backend_ns) / 1e3;
        }
        CK(gm_free(pool, p, NULL), "gm_free");
        CK(gm_trim(pool, 0, NULL), "gm_trim");
    }
}

static void lease_main(const void *arg)
{
    const lease_arg_t *a = arg;
    slot_t *s = &g_sh->slot[g_slot];
    gm_device_info_t di = GM_DEVICE_INFO_INIT;
    gm_pool_t *pool = make_pool(a->sock, LEASE_BYTES);
    CK(gm_pool_device_info(pool, &di), "gm_pool_device_info");
    lease_series(pool, true, a->runs, di.granularity, s->v, s->v + 40, &s->u[0]);
    gm_pool_destroy(pool);
    if (a->local_too) {
        pool = make_pool(NULL, 0);
        lease_series(pool, false, a->runs, di.granularity, s->v + 80, s->v + 120, &s->u[1]);
        gm_pool_destroy(pool);
    }
    atomic_store(&s->state, S_DONE);
}

typedef struct lease_res {
    int n, n_cold, n_local;
    double warm[40], warm_bk[40], cold[40], cold_bk[40], local[40], local_bk[40];
    uint64_t odd_warm, odd_cold, odd_local;
} lease_res_t;

static void run_lease(lease_res_t *r, const info_t *info, int runs)
{
    for (int cold = 0; cold < 2; cold++) {
        const char *ctx = cold ? "lease (cold)" : "lease (warm)";
        broker_t b;
        /* warm: made pages stay on the broker's free list; cold: none do */
        if (broker_start(&b, cold ? "lease-cold" : "lease-warm", 2 * GiB, 2 * GiB,
                         cold ? 0 : (long long)GiB, -1, info->device, bk_name(info)))
            continue;
        lease_arg_t a = {.sock = b.sock, .runs = runs, .local_too = !cold};
        kid_t k;
        if (spawn(&k, 0, lease_main, &a, ctx) == 0 &&
            wait_state(&k, S_DONE, READY_WAIT_S, ctx) == 0) {
            slot_t *s = &g_sh->slot[0];
            double *d = cold ? r->cold : r->warm, *dbk = cold ? r->cold_bk : r->warm_bk;
            memcpy(d, s->v, (size_t)runs * sizeof *d);
            memcpy(dbk, s->v + 40, (size_t)runs * sizeof *d);
            if (cold) {
                r->n_cold = runs;
                r->odd_cold = s->u[0];
            } else {
                r->n = runs;
                r->odd_warm = s->u[0];
                memcpy(r->local, s->v + 80, (size_t)runs * sizeof *d);
                memcpy(r->local_bk, s->v + 120, (size_t)runs * sizeof *d);
                r->n_local = runs;
                r->odd_local = s->u[1];
            }
            finish(&k, 60, ctx);
        }
        broker_stop(&b);
    }
    if (r->odd_warm || r->odd_cold)
        add_error("lease: %" PRIu64 " warm and %" PRIu64 " cold runs did not import exactly one "
                  "lease of pages in their gm_alloc", r->odd_warm, r->odd_cold);
}

/* ---- part 3: reclaim after kill -9 --------------------------------------------- */

typedef struct hold_arg {
    const char *sock;
    uint64_t bytes;
} hold_arg_t;

static void hold_main(const void *arg)
{
    const hold_arg_t *a = arg;
    slot_t *s = &g_sh->slot[g_slot];
    gm_pool_t *pool = make_pool(a->sock, 0);
    for (uint64_t off = 0; off < a->bytes; off += LEASE_BYTES) {
        void *p = NULL;
        uint64_t n = a->bytes - off < LEASE_BYTES ? a->bytes - off : LEASE_BYTES;
        CK(gm_alloc(pool, n, NULL, &p), "gm_alloc");
        CK(gm_memset(pool, p, 0x5a, n, NULL), "gm_memset");
    }
    CK(gm_stream_synchronize(pool, NULL), "gm_stream_synchronize");
    s->u[0] = pool_stats(pool).reserved;
    atomic_store(&s->state, S_READY);
    for (;;) pause(); /* killed (SIGKILL; SIGALRM at worst) */
}

typedef struct reclaim_res {
    int n, timeouts;
    uint64_t bytes;
    double ms[RECLAIM_RUNS], exit_ms[RECLAIM_RUNS];
} reclaim_res_t;

static void run_reclaim(reclaim_res_t *r, const info_t *info, uint64_t bytes, int runs)
{
    r->bytes = bytes;
    broker_t b;
    if (broker_start(&b, "reclaim", 2 * bytes, 4 * bytes, -1, -1, info->device, bk_name(info)))
        return;
    hold_arg_t a = {.sock = b.sock, .bytes = bytes};
    for (int run = 0; run < runs; run++) {
        char ctx[64];
        snprintf(ctx, sizeof ctx, "reclaim run %d", run + 1);
        gm_broker_tenant_t t;
        memset(&t, 0, sizeof t);
        if (books(&b, &t, NULL) != 0) {
            add_error("%s: the broker did not answer: %s", ctx, gm_last_error());
            break;
        }
        uint64_t base = t.used;
        kid_t k;
        if (spawn(&k, 0, hold_main, &a, ctx) || wait_state(&k, S_READY, READY_WAIT_S, ctx)) continue;
        if (books(&b, &t, NULL) != 0 || t.used < base + bytes) {
            add_error("%s: the client holds %" PRIu64 " bytes by its pool; the broker's books say "
                      "%" PRIu64 " (before it: %" PRIu64 ")", ctx, g_sh->slot[0].u[0], t.used, base);
            kill_kid(&k);
            continue;
        }
        double t0 = now(), t_exit = NAN, t_back = NAN;
        kill(k.pid, SIGKILL);
        while (now() - t0 < RECLAIM_WAIT_S) {
            if (isnan(t_exit) && k.pid > 0 && reap_if_exited(&k) == 1) t_exit = now();
            if (books(&b, &t, NULL) == 0 && t.used <= base) {
                t_back = now();
                break;
            }
            sleep_us(POLL_US);
        }
        if (k.pid > 0) {
            kill_kid(&k);
            t_exit = now();
        }
        if (isnan(t_back)) {
            r->timeouts++;
            add_error("%s: the broker's tenant did not drop back to %" PRIu64 " bytes in %.0f s "
                      "(holds %" PRIu64 ")", ctx, base, RECLAIM_WAIT_S, t.used);
            continue;
        }
        r->ms[r->n] = (t_back - t0) * 1e3;
        r->exit_ms[r->n++] = (t_exit - t0) * 1e3;
        fprintf(stderr, "broker_bench: %s: %.3f ms (the process reaped after %.3f ms)\n", ctx,
                (t_back - t0) * 1e3, (t_exit - t0) * 1e3);
    }
    broker_stop(&b);
}

/* ---- part 4: steady alloc+free ------------------------------------------------- */

static const uint64_t k_steady_sizes[3] = {512, 64 << 10, 2 << 20};
static const char *const k_steady_names[3] = {"512B", "64KiB", "2MiB"};

static double steady_batch(gm_pool_t *pool, uint64_t size)
{
    double t0 = now();
    for (int i = 0; i < STEADY_PAIRS; i++) {
        void *p;
        CK(gm_alloc(pool, size, NULL, &p), "gm_alloc");
        CK(gm_free(pool, p, NULL), "gm_free");
    }
    return (now() - t0) * 1e9 / STEADY_PAIRS;
}

static uint64_t calls_of(const gm_stats_t *st)
{
    uint64_t n = 0;
    for (int k = 0; k < GM_CALL_COUNT; k++) n += st->backend_calls[k];
    return n;
}

static void steady_main(const void *arg)
{
    const char *sock = arg;
    slot_t *s = &g_sh->slot[g_slot];
    gm_pool_t *pb = make_pool(sock, 0), *pl = make_pool(NULL, 0);
    double tb[3][STEADY_BATCHES], tl[3][STEADY_BATCHES];
    for (int k = 0; k < 3; k++)
        for (int w = 0; w < 2; w++) {
            steady_batch(pb, k_steady_sizes[k]);
            steady_batch(pl, k_steady_sizes[k]);
        }
    gm_stats_t b0 = pool_stats(pb), l0 = pool_stats(pl);
    for (int b = 0; b < STEADY_BATCHES; b++)
        for (int k = 0; k < 3; k++) {
            if (b % 2) {
                tb[k][b] = steady_batch(pb, k_steady_sizes[k]);
                tl[k][b] = steady_batch(pl, k_steady_sizes[k]);
            } else {
                tl[k][b] = steady_batch(pl, k_steady_sizes[k]);
                tb[k][b] = steady_batch(pb, k_steady_sizes[k]);
            }
        }
    gm_stats_t b1 = pool_stats(pb), l1 = pool_stats(pl);
    for (int k = 0; k < 3; k++) {
        s->v[k] = median_of(tb[k], STEADY_BATCHES);
        s->v[3 + k] = median_of(tl[k], STEADY_BATCHES);
        s->v[6 + k] = quantile_of(tb[k], STEADY_BATCHES, 0.9);
        s->v[9 + k] = quantile_of(tl[k], STEADY_BATCHES, 0.9);
        /* The two pools' batches of one round ran back to back: their
         * ratio cancels what drifts on the machine between rounds. */
        double ratio[STEADY_BATCHES];
        for (int b = 0; b < STEADY_BATCHES; b++) ratio[b] = tb[k][b] / tl[k][b];
        s->v[12 + k] = median_of(ratio, STEADY_BATCHES);
    }
    s->u[0] = calls_of(&b1) - calls_of(&b0);
    s->u[1] = calls_of(&l1) - calls_of(&l0);
    gm_pool_destroy(pb);
    gm_pool_destroy(pl);
    atomic_store(&s->state, S_DONE);
}

typedef struct steady_res {
    bool ok;
    double broker[3], local[3], broker_p90[3], local_p90[3], ratio[3];
    uint64_t broker_calls, local_calls;
} steady_res_t;

static void run_steady(steady_res_t *r, const info_t *info)
{
    const char *ctx = "steady";
    broker_t b;
    if (broker_start(&b, "steady", 2 * GiB, 2 * GiB, -1, -1, info->device, bk_name(info)))
        return;
    kid_t k;
    if (spawn(&k, 0, steady_main, b.sock, ctx) == 0 &&
        wait_state(&k, S_DONE, READY_WAIT_S, ctx) == 0) {
        slot_t *s = &g_sh->slot[0];
        for (int i = 0; i < 3; i++) {
            r->broker[i] = s->v[i];
            r->local[i] = s->v[3 + i];
            r->broker_p90[i] = s->v[6 + i];
            r->local_p90[i] = s->v[9 + i];
            r->ratio[i] = s->v[12 + i];
        }
        r->broker_calls = s->u[0];
        r->local_calls = s->u[1];
        r->ok = true;
        finish(&k, 60, ctx);
    }
    broker_stop(&b);
}

/* ---- output ------------------------------------------------------------------- */

/* {"512B": x, "64KiB": y, "2MiB": z} */
static void jsizes(FILE *f, const char *key, const double *v, bool ok)
{
    jkey(f, key);
    if (!ok) {
        fputs("null", f);
        return;
    }
    fputc('{', f);
    for (int k = 0; k < 3; k++) {
        fprintf(f, "%s\"%s\":", k ? "," : "", k_steady_names[k]);
        jnum(f, v[k]);
    }
    fputc('}', f);
}

typedef struct results {
    info_t info;
    bool quick;
    char parts[128];
    race_res_t race;
    lease_res_t lease;
    reclaim_res_t reclaim;
    steady_res_t steady;
    /* headline */
    double overshoot, lease_us, lease_p90, cold_us, cold_p90, local_us, reclaim_ms, reclaim_max;
    double ratio[3];
    int no_slower; /* -1: not measured */
    int lease_runs, reclaim_runs;
} results_t;

static int met_le(double v, double goal) { return isnan(v) ? -1 : v <= goal; }

/* A figure of the kernel's count: NAN when it was not taken (not the sim). */
static double kernel_fig(const race_res_t *ra, uint64_t v) { return ra->kernel ? (double)v : NAN; }

static void write_json(FILE *f, const void *results, const bench_label_t *l)
{
    const results_t *r = results;
    const race_res_t *ra = &r->race;
    const lease_res_t *le = &r->lease;
    const reclaim_res_t *rc = &r->reclaim;
    const steady_res_t *st = &r->steady;
    jhead(f, l->date, l->command, r->info.ok, r->info.device_name, r->info.backend_name,
          r->info.driver_version, l->commit);
    jfield(f, "page_bytes", r->info.granularity);
    jfield(f, "clients", ra->ran ? ra->ready : NAN);
    jfield(f, "clients_asked", ra->ran ? ra->clients : NAN);
    jfield(f, "quota_bytes", ra->ran ? (double)ra->quota : NAN);
    jfield(f, "quota_overshoot_bytes", r->overshoot);
    jfield(f, "quota_overshoot_books_bytes", ra->over_books);
    jfield(f, "quota_overshoot_clients_bytes", ra->over_clients);
    jfield(f, "quota_overshoot_kernel_bytes", ra->over_kernel);
    jfield(f, "lease_us", r->lease_us);
    jfield(f, "lease_p90_us", r->lease_p90);
    jfield(f, "lease_cold_us", r->cold_us);
    jfield(f, "lease_cold_p90_us", r->cold_p90);
    jfield(f, "lease_local_us", r->local_us);
    jfield(f, "reclaim_ms", r->reclaim_ms);
    jfield(f, "reclaim_max_ms", r->reclaim_max);
    jfield(f, "reclaim_bytes", rc->n ? (double)rc->bytes : NAN);
    jsizes(f, "steady_alloc_ns", st->broker, st->ok);
    jsizes(f, "steady_alloc_ns_local", st->local, st->ok);
    jsizes(f, "steady_alloc_ratio", r->ratio, st->ok);
    jfield_bool(f, "steady_alloc_no_slower", r->no_slower);
    fprintf(f, ",\"goals\":{\"quota_overshoot_bytes\":0,\"reclaim_ms\":1000,"
               "\"steady_alloc_ratio\":%.2f}", STEADY_TOLERANCE);
    fputs(",\"meets\":{\"quota_overshoot_bytes\":", f);
    jbool(f, isnan(r->overshoot) ? -1 : r->overshoot == 0);
    jfield_bool(f, "reclaim_ms", met_le(r->reclaim_ms, 1000));
    jfield_bool(f, "reclaim_max_ms", met_le(r->reclaim_max, 1000));
    jfield_bool(f, "steady_alloc_no_slower", r->no_slower);
    fputs("}", f);
    fputs(",\"details\":{\"parts\":", f);
    jstr(f, r->parts);
    jfield_bool(f, "quick", r->quick);
    fputs(",\"race\":{\"ran\":", f);
    jbool(f, ra->ran);
    jfield(f, "clients_ready", ra->ready);
    jfield(f, "seconds", ra->seconds);
    jfield(f, "capacity_bytes", ra->capacity);
    jfield(f, "books_samples", ra->samples);
    jfield(f, "books_query_failures", ra->query_failures);
    jfield(f, "books_max_used_bytes", ra->books_max_used);
    jfield(f, "books_peak_bytes", ra->books_peak);
    jfield(f, "freezes", ra->freezes);
    jfield(f, "freezes_counted", ra->freezes_counted);
    jfield(f, "freeze_timeouts", ra->freeze_timeouts);
    jfield(f, "freeze_ms_median", ra->freeze_ms_median);
    jfield(f, "freeze_ms_max", ra->freeze_ms_max);
    jfield(f, "clients_counted_max_bytes", ra->counted_max);
    jfield(f, "clients_published_max_bytes", ra->naive_max);
    jfield(f, "clients_upper_bound_max_bytes", ra->counted_upper_max);
    jfield_bool(f, "selftest", ra->selftest);
    jfield(f, "reclaim_ms_config", RACE_RECLAIM_MS);
    jfield_bool(f, "kernel_count", ra->kernel);
    jfield(f, "kernel_max_bytes", kernel_fig(ra, ra->kernel_max));
    jfield(f, "kernel_shared_pages_max", kernel_fig(ra, ra->shared_pages_max));
    jfield(f, "kernel_over_books_max_bytes", kernel_fig(ra, ra->kernel_over_books_max));
    jfield(f, "refusals", ra->refusals);
    jfield(f, "reclaims", ra->reclaims);
    jfield(f, "used_after_bytes", ra->used_after);
    jfield(f, "client_ops", ra->ops);
    jfield(f, "client_allocs", ra->allocs);
    jfield(f, "client_limit_refusals", ra->limit_refusals);
    jfield(f, "client_oom_refusals", ra->oom_refusals);
    jfield(f, "client_trims", ra->trims);
    fputs("},\"lease\":{\"bytes\":", f);
    jnum(f, (double)LEASE_BYTES);
    jfield_arr(f, "warm_runs_us", le->warm, le->n);
    jfield_arr(f, "warm_backend_runs_us", le->warm_bk, le->n);
    jfield_arr(f, "cold_runs_us", le->cold, le->n_cold);
    jfield_arr(f, "cold_backend_runs_us", le->cold_bk, le->n_cold);
    jfield_arr(f, "local_runs_us", le->local, le->n_local);
    jfield_arr(f, "local_backend_runs_us", le->local_bk, le->n_local);
    jfield(f, "warm_backend_us", median_of(le->warm_bk, le->n));
    jfield(f, "cold_backend_us", median_of(le->cold_bk, le->n_cold));
    jfield(f, "local_backend_us", median_of(le->local_bk, le->n_local));
    jfield(f, "odd_runs_warm", le->odd_warm);
    jfield(f, "odd_runs_cold", le->odd_cold);
    jfield(f, "odd_runs_local", le->odd_local);
    fputs("},\"reclaim\":{\"runs_ms\":", f);
    jarr(f, rc->ms, rc->n);
    jfield_arr(f, "exit_runs_ms", rc->exit_ms, rc->n);
    jfield(f, "timeouts", rc->timeouts);
    fputs("},\"steady\":{\"pairs_per_batch\":", f);
    jnum(f, STEADY_PAIRS);
    jfield(f, "batches", STEADY_BATCHES);
    jsizes(f, "broker_p90_ns", st->broker_p90, st->ok);
    jsizes(f, "local_p90_ns", st->local_p90, st->ok);
    jfield(f, "broker_backend_calls", st->ok ? (double)st->broker_calls : NAN);
    jfield(f, "local_backend_calls", st->ok ? (double)st->local_calls : NAN);
    fputs("},\"device_total_memory\":", f);
    jnum(f, (double)r->info.total_memory);
    jerrors_end(f);
}

static const char *yes(int v) { return v < 0 ? "—" : v ? "yes" : "NO"; }

static void mib(char *buf, size_t cap, double b)
{
    if (isnan(b)) snprintf(buf, cap, "—");
    else if (b >= (double)GiB) snprintf(buf, cap, "%.3g GiB", b / (double)GiB);
    else snprintf(buf, cap, "%.4g MiB", b / (double)MiB);
}

static void write_md(FILE *f, const void *results, const bench_label_t *l)
{
    const results_t *r = results;
    char a[64], b[64], c[64];
    const race_res_t *ra = &r->race;
    const lease_res_t *le = &r->lease;
    const reclaim_res_t *rc = &r->reclaim;
    const steady_res_t *st = &r->steady;
    fprintf(f, "# Broker — %s, %s\n\n", r->info.ok ? r->info.device_name : "unknown device", l->date);
    fprintf(f, "- command: `%s`; code: commit %s; backend %s, driver %d; pages of %" PRIu64
               " KiB; %d failure(s)\n", l->command, l->commit, r->info.ok ? r->info.backend_name : "unknown",
            r->info.driver_version, r->info.granularity >> 10, g_nerrors);
    fprintf(f, "- every broker is `gpumem broker`'s code (gm_cli_broker) in a forked process with a "
               "config file of its own, one tenant for this user; every client a forked process with "
               "its own pool (`cfg.broker` = the socket); times are CLOCK_MONOTONIC\n");
    if (ra->ran) {
        mib(a, sizeof a, (double)ra->quota);
        fprintf(f, "- quota race: %d processes allocate and free at random (1 to 32 pages, at most %d "
                   "blocks each, one freed after each refusal, a gm_trim(0) now and then) under one "
                   "tenant quota of %s (the broker's reclaim_ms %d) for %.1f s; the broker's tenant "
                   "row polled every %d µs (%" PRIu64 " samples) plus the peak it keeps; every %d ms "
                   "all clients SIGSTOPped (%" PRIu64 " times, %" PRIu64 " counted, median %.2f ms "
                   "stopped) and counted: the clients' own counters (pages imported - pages "
                   "released, i.e. reserved + the stock of leased pages; gm_pool_stats's import_fd "
                   "and phys_release calls, published by a thread of each client; a lower bound: "
                   "imports published before the stop minus releases read after the SIGCONT)%s; "
                   "overshoot = max(count - quota, 0), the largest of the counts%s\n",
                ra->clients, RACE_SLOTS, a, RACE_RECLAIM_MS, ra->seconds, POLL_US, ra->samples,
                FREEZE_EVERY_MS, ra->freezes, ra->freezes_counted, ra->freeze_ms_median,
                ra->kernel ? " and the kernel's (distinct memfd inodes \"/memfd:gpumem-sim-page\" in "
                             "/proc/PID/fd of all clients)" : "",
                ra->selftest ? "; SELF-TEST: the broker's quota was 1.5 times the quota judged, "
                               "the overshoot is expected" : "");
    }
    if (le->n || le->n_cold)
        fprintf(f, "- lease: a pool with broker_lease = 64 MiB allocates 64 MiB with no pages and an "
                   "empty stock (gm_trim(0) between runs): gm_alloc's wall time, one lease of %" PRIu64
                   " pages (round trip, imports, map); median and p90 of %d after one untimed run; "
                   "warm: keep_free 1 GiB (pages made once, reused), cold: keep_free 0 (each lease "
                   "makes its pages); local: the same in a pool without a broker (phys_create)\n",
                r->info.granularity ? LEASE_BYTES / r->info.granularity : 0, r->lease_runs);
    if (rc->n) {
        mib(a, sizeof a, (double)rc->bytes);
        fprintf(f, "- reclaim: a client holds %s (64 MiB blocks, gm_memset) and is killed with "
                   "SIGKILL; from kill() until the broker's tenant row is back to its level before "
                   "the client (gm_broker_query every %d µs); median and max of %d\n", a, POLL_US,
                r->reclaim_runs);
    }
    if (st->ok)
        fprintf(f, "- steady: one process, one pool leasing from a broker and one without; "
                   "alloc+free pairs once warm, median over %d batches of %d pairs, the pools "
                   "alternating batch by batch; \"no slower\": broker / local ≤ %.2f for every "
                   "size\n", STEADY_BATCHES, STEADY_PAIRS, STEADY_TOLERANCE);
    fputc('\n', f);

    fprintf(f, "| figure | value | goal | met |\n|---|---:|---:|:---:|\n");
    char label[64];
    snprintf(label, sizeof label, "quota_overshoot_bytes (%d clients)", ra->clients);
    md_figure(f, label, &r->overshoot, 1, "%.0f", "0", yes(isnan(r->overshoot) ? -1 : r->overshoot == 0));
    md_figure(f, "— by the books; the clients' counters; the kernel",
           (const double[]){ra->over_books, ra->over_clients, ra->over_kernel}, 3, "%.0f", NULL, NULL);
    md_figure(f, "lease_us (64 MiB, warm; p90)", (const double[]){r->lease_us, r->lease_p90}, 2, "%.0f",
           NULL, NULL);
    md_figure(f, "lease_cold_us (p90)", (const double[]){r->cold_us, r->cold_p90}, 2, "%.0f", NULL, NULL);
    md_figure(f, "lease_local_us (no broker)", &r->local_us, 1, "%.0f", NULL, NULL);
    md_figure(f, "reclaim_ms (median; max)", (const double[]){r->reclaim_ms, r->reclaim_max}, 2, "%.2f",
           "1000", yes(met_le(r->reclaim_max, 1000)));
    for (int k = 0; k < 3; k++) {
        fmt_num(a, sizeof a, st->ok ? st->broker[k] : NAN, "%.1f");
        fmt_num(b, sizeof b, st->ok ? st->local[k] : NAN, "%.1f");
        fmt_num(c, sizeof c, st->ok ? r->ratio[k] : NAN, "%.3f");
        fprintf(f, "| steady_alloc_ns %s (broker; local; ratio) | %s; %s; %s | ≤ %.2f | %s |\n",
                k_steady_names[k], a, b, c, STEADY_TOLERANCE,
                yes(st->ok ? r->ratio[k] <= STEADY_TOLERANCE : -1));
    }
    fputc('\n', f);

    if (ra->ran) {
        char q1[32], q2[32], q3[32], q4[32], q5[32];
        mib(q1, sizeof q1, (double)ra->books_peak);
        mib(q2, sizeof q2, (double)ra->books_max_used);
        mib(q3, sizeof q3, (double)ra->counted_max);
        mib(q4, sizeof q4, (double)ra->naive_max);
        mib(q5, sizeof q5, kernel_fig(ra, ra->kernel_max));
        fprintf(f, "Race: the broker's peak %s (largest sample %s); the clients' counters at most "
                   "%s (as published, not bounded: %s); the kernel at most %s; %" PRIu64
                   " refusals and %" PRIu64 " reclaim requests by the books; the clients made %"
                PRIu64 " operations, %" PRIu64 " allocations, %" PRIu64 " quota refusals "
                "(GM_LIMIT), %" PRIu64 " device refusals, %" PRIu64 " trims.",
                q1, q2, q3, q4, q5, ra->refusals, ra->reclaims, ra->ops, ra->allocs,
                ra->limit_refusals, ra->oom_refusals, ra->trims);
        if (ra->kernel)
            fprintf(f, " Pages open in two clients at once: %" PRIu64 " at most; the kernel's "
                       "count above the books by %" PRIu64 " bytes at most.", ra->shared_pages_max,
                    ra->kernel_over_books_max);
        fprintf(f, " After every client exited, the tenant held %" PRIu64 " bytes.\n\n", ra->used_after);
    }
    md_runs(f, "Runs — lease warm µs: ", le->warm, le->n, "%.0f", "");
    fmt_num(a, sizeof a, median_of(le->warm_bk, le->n), "%.0f");
    fprintf(f, " (inside backend calls, median: %s)", a);
    md_runs(f, "; cold µs: ", le->cold, le->n_cold, "%.0f", "");
    md_runs(f, "; local µs: ", le->local, le->n_local, "%.0f", "");
    md_runs(f, "; reclaim ms: ", rc->ms, rc->n, "%.2f", "");
    md_runs(f, " (kill() to the process reaped: ", rc->exit_ms, rc->n, "%.2f", ")");
    if (st->ok)
        fprintf(f, "; backend calls in the timed steady batches: broker pool %" PRIu64 ", local %" PRIu64,
                st->broker_calls, st->local_calls);
    fprintf(f, ".\n\n");
    md_failures(f);
}

/* ---- main ------------------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr,
            "usage: broker_bench [--out DIR] [--json FILE] [--md FILE] [--command TEXT]\n"
            "                    [--clients N] [--race-seconds S] [--quota BYTES]\n"
            "                    [--parts race,lease,reclaim,steady] [--quick] [--deadline S]\n"
            "  --out DIR: DIR/broker.json and DIR/broker.md\n"
            "  --deadline S: a part that might not end within S seconds of the start is\n"
            "    skipped (recorded as a failure), so the results are written in time\n"
            "  GPUMEM_BACKEND=sim: the sim backend; unset: auto (cuda on a GPU machine)\n"
            "  BROKER_BENCH_SELFTEST=1: the race's broker gets 1.5x the quota the counts are\n"
            "    judged against; every count must see an overshoot (checks the checker)\n");
}

static bool has_part(const char *parts, const char *p)
{
    size_t n = strlen(p);
    for (const char *s = parts; (s = strstr(s, p)); s += n)
        if ((s == parts || s[-1] == ',') && (s[n] == 0 || s[n] == ',')) return true;
    return false;
}

int main(int argc, char **argv)
{
    const char *json_path = NULL, *md_path = NULL, *command_arg = NULL, *out_dir = NULL;
    const char *parts = "race,lease,reclaim,steady";
    int nclients = 32;
    double race_s = -1;
    uint64_t quota = 0;
    bool quick = false;
    double deadline = 0; /* seconds; 0: none */
    bool selftest = env_on("BROKER_BENCH_SELFTEST");
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
        else if (!strcmp(argv[i], "--md") && i + 1 < argc) md_path = argv[++i];
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) out_dir = argv[++i];
        else if (!strcmp(argv[i], "--command") && i + 1 < argc) command_arg = argv[++i];
        else if (!strcmp(argv[i], "--clients") && i + 1 < argc) nclients = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--race-seconds") && i + 1 < argc) race_s = atof(argv[++i]);
        else if (!strcmp(argv[i], "--quota") && i + 1 < argc) quota = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--parts") && i + 1 < argc) parts = argv[++i];
        else if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--deadline") && i + 1 < argc) deadline = atof(argv[++i]);
        else {
            usage();
            return 2;
        }
    }
    if (nclients < 1 || nclients > MAX_CLIENTS) {
        fprintf(stderr, "broker_bench: --clients is 1 to %d\n", MAX_CLIENTS);
        return 2;
    }
    char json_buf[4096], md_buf[4096];
    if (out_dir) {
        if (mkdir(out_dir, 0777) != 0 && errno != EEXIST) {
            fprintf(stderr, "broker_bench: mkdir %s: %s\n", out_dir, strerror(errno));
            return 2;
        }
        snprintf(json_buf, sizeof json_buf, "%s/broker.json", out_dir);
        snprintf(md_buf, sizeof md_buf, "%s/broker.md", out_dir);
        if (!json_path) json_path = json_buf;
        if (!md_path) md_path = md_buf;
    }
    g_coordinator = getpid();
    if (env_is("GPUMEM_BACKEND", "sim")) g_backend = GM_BACKEND_SIM;
    else if (env_is("GPUMEM_BACKEND", "cuda")) g_backend = GM_BACKEND_CUDA;
    g_sh = mmap(NULL, sizeof *g_sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (g_sh == MAP_FAILED) {
        fprintf(stderr, "broker_bench: mmap: %s\n", strerror(errno));
        return 1;
    }
    snprintf(g_dir, sizeof g_dir, "%s/gmbb.XXXXXX", bench_tmpdir());
    if (!mkdtemp(g_dir)) {
        fprintf(stderr, "broker_bench: mkdtemp %s: %s\n", g_dir, strerror(errno));
        return 1;
    }
    atexit(cleanup);
    signal(SIGPIPE, SIG_IGN);
    tp_kill_all_at_exit(); /* children killed at exit (before cleanup) and on SIGINT, SIGTERM, SIGHUP */
    raise_nofile();

    const char *const envs[] = {"GPUMEM_BACKEND", "GPUMEM_SIM_CAPACITY", "BROKER_BENCH_SELFTEST"};
    bench_label_t lbl;
    bench_label(&lbl, command_arg, envs, sizeof envs / sizeof envs[0], argc, argv);

    static results_t r;
    memset(&r, 0, sizeof r);
    r.quick = quick;
    snprintf(r.parts, sizeof r.parts, "%s", parts);
    r.race.over_books = r.race.over_clients = r.race.over_kernel = NAN;
    r.no_slower = -1;
    double t_start = now();

    if (run_info(&r.info) == 0) {
        fprintf(stderr, "broker_bench: %s backend, device %d \"%s\", driver %d, %.1f GiB, pages of "
                "%" PRIu64 " KiB\n", r.info.backend_name, r.info.device, r.info.device_name,
                r.info.driver_version, (double)r.info.total_memory / (double)GiB,
                r.info.granularity >> 10);
    }
    if (!r.info.ok || r.info.granularity == 0) {
        add_error("no pool could be made: nothing measured");
    } else {
        g_backend = (gm_backend_kind_t)r.info.backend;
        bool cuda = r.info.backend == GM_BACKEND_CUDA;
        if (!quota) quota = cuda ? GiB : 256 * MiB;
        quota -= quota % r.info.granularity;
        if (race_s < 0) race_s = quick ? 2 : 5;
        uint64_t hold = cuda ? GiB : 256 * MiB;
        int lease_runs = quick ? 10 : LEASE_RUNS, reclaim_runs = quick ? 3 : RECLAIM_RUNS;
        r.lease_runs = lease_runs;
        r.reclaim_runs = reclaim_runs;
        /* A part starts only if its usual length fits before the deadline. */
#define FITS(part, secs)                                                                   \
    (has_part(parts, part) &&                                                              \
     (deadline <= 0 || now() - t_start + (secs) <= deadline ||                             \
      (add_error("part %s skipped: it might not end within --deadline %.0f s (%.0f s gone)", \
                 part, deadline, now() - t_start), 0)))
        if (FITS("race", race_s + (cuda ? 40 : 15))) {
            run_race(&r.race, &r.info, nclients, race_s, quota, selftest);
            fprintf(stderr, "broker_bench: race: %d clients, quota %" PRIu64 " bytes: peak by the "
                    "books %" PRIu64 ", clients' count %" PRIu64 ", kernel %" PRIu64 " (%" PRIu64
                    " freezes); %" PRIu64 " refusals\n", r.race.clients, quota, r.race.books_peak,
                    r.race.counted_max, r.race.kernel_max, r.race.freezes_counted, r.race.refusals);
        }
        if (FITS("lease", cuda ? 20 : 5)) {
            run_lease(&r.lease, &r.info, lease_runs);
            fprintf(stderr, "broker_bench: lease 64 MiB: warm %.0f µs, cold %.0f µs, local %.0f µs\n",
                    median_of(r.lease.warm, r.lease.n), median_of(r.lease.cold, r.lease.n_cold),
                    median_of(r.lease.local, r.lease.n_local));
        }
        if (FITS("reclaim", reclaim_runs * (cuda ? 3 : 1))) run_reclaim(&r.reclaim, &r.info, hold, reclaim_runs);
        if (FITS("steady", cuda ? 15 : 5)) {
            run_steady(&r.steady, &r.info);
            if (r.steady.ok)
                fprintf(stderr, "broker_bench: steady ns (broker/local): 512 B %.1f/%.1f, 64 KiB "
                        "%.1f/%.1f, 2 MiB %.1f/%.1f\n", r.steady.broker[0], r.steady.local[0],
                        r.steady.broker[1], r.steady.local[1], r.steady.broker[2], r.steady.local[2]);
        }
    }

    /* headline */
    double o = NAN;
    const double overs[3] = {r.race.over_books, r.race.over_clients, r.race.over_kernel};
    for (int i = 0; i < 3; i++)
        if (!isnan(overs[i]) && (isnan(o) || overs[i] > o)) o = overs[i];
    r.overshoot = o;
    r.lease_us = median_of(r.lease.warm, r.lease.n);
    r.lease_p90 = quantile_of(r.lease.warm, r.lease.n, 0.9);
    r.cold_us = median_of(r.lease.cold, r.lease.n_cold);
    r.cold_p90 = quantile_of(r.lease.cold, r.lease.n_cold, 0.9);
    r.local_us = median_of(r.lease.local, r.lease.n_local);
    r.reclaim_ms = median_of(r.reclaim.ms, r.reclaim.n);
    r.reclaim_max = max_of(r.reclaim.ms, r.reclaim.n);
    if (r.steady.ok) {
        r.no_slower = 1;
        for (int k = 0; k < 3; k++) {
            r.ratio[k] = r.steady.ratio[k];
            if (!(r.ratio[k] <= STEADY_TOLERANCE)) r.no_slower = 0;
        }
    }
    fprintf(stderr, "broker_bench: done in %.1f s, %d failure(s)\n", now() - t_start, g_nerrors);

    return bench_write(json_path, md_path, write_json, write_md, &r, &lbl);
}
