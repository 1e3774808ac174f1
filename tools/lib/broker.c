/* SPDX-License-Identifier: Apache-2.0 */
/*
 * broker.c — `gpumem broker`: one process owns a GPU's memory and leases it
 * to the processes that use gpumem, tenant by tenant, within quotas.
 *
 * The one idea: the broker is the only one that makes physical pages
 * (phys_create on its own backend context), so a quota is exact by
 * construction: a tenant holds what it was leased and nothing else, however
 * many processes it runs at once.  Its books are one single-threaded poll
 * loop, so two requests never race.
 *
 *   pages    every page the broker made: its handle, its exported descriptor
 *            (made once, sent again at each lease; SCM_RIGHTS duplicates it)
 *            and its holder (a client, or none: on the free list).
 *   tenants  from the config: who (uids, groups, a cgroup prefix), quota,
 *            guaranteed minimum; a process no rule matches gets a tenant of
 *            its uid ("uid:1000") with default_quota.  Books: used (pages
 *            leased plus pages adopted), peak, refusals, reclaims.
 *   clients  one per process (control connection + events connection).
 *            A closed control connection (exit, kill -9) puts every page
 *            leased on it back on the free list at once.
 *
 * A lease that fits neither the quota nor the device waits (at most
 * reclaim_ms) while the broker asks clients holding pages for their unused
 * ones (RECLAIM on their events connection); pages that hold data are never
 * taken.  Then it is served or refused with the reason.
 *
 * Signals: SIGHUP reloads the config (a bad one is logged and the old one
 * kept); SIGTERM and SIGINT stop the broker: clients keep the pages they
 * map and a later broker adopts them.
 */
#include "lib/broker.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "base/internal.h"
#include "broker/broker.h"
#include "broker/proto.h"
#include "core/options.h"
#include "observe/monitor_seg.h"
#include "base/wire.h"

#define MAX_RULE_IDS 16
#define LOG_BURST 64 /* lines per minute before the log is throttled */

/* ---- configuration ------------------------------------------------------------ */

typedef struct tenant_cfg {
    char name[GM__BROKER_NAME_MAX];
    uid_t uids[MAX_RULE_IDS];
    size_t n_uids;
    gid_t gids[MAX_RULE_IDS];
    size_t n_gids;
    char cgroup[256];
    uint64_t quota, guaranteed; /* bytes; quota UINT64_MAX: none */
} tenant_cfg_t;

enum { SCRUB_TENANT, SCRUB_ALWAYS, SCRUB_NEVER };

typedef struct bcfg {
    char socket[108];
    gm_backend_kind_t backend;
    int device;
    uint64_t capacity;       /* 0: the device's free memory at start */
    uint64_t default_quota;  /* UINT64_MAX: none (the device) */
    uint64_t keep_free;      /* free pages kept made, bytes */
    int scrub;               /* SCRUB_*: when a page is zeroed before a lease */
    unsigned reclaim_ms;
    unsigned idle_s;         /* a control connection holding no pages and silent this
                                long is closed (its process reconnects at its next
                                lease); 0: never */
    unsigned max_clients;
    unsigned socket_mode;
    char stats_file[PATH_MAX];
    /* Tenants made at run time (a Slurm job's): who may make them besides
     * root and the broker's uid, where their doors go, and how long one
     * stays after its job's anchor processes are gone and nothing uses it. */
    uid_t admins[MAX_RULE_IDS];
    size_t n_admins;
    char job_dir[80];
    unsigned job_grace_s;
    tenant_cfg_t *tenants;
    size_t n_tenants;
} bcfg_t;

static void cfg_defaults(bcfg_t *c)
{
    memset(c, 0, sizeof *c);
    c->backend = GM_BACKEND_AUTO;
    c->default_quota = UINT64_MAX;
    c->keep_free = (uint64_t)2 << 30;
    c->reclaim_ms = 500;
    c->idle_s = 300;
    c->max_clients = 1024;
    c->socket_mode = 0666;
    c->job_grace_s = 10;
}

static void cfg_free(bcfg_t *c)
{
    free(c->tenants);
    c->tenants = NULL;
    c->n_tenants = 0;
}

/* s as text safe on a terminal and in a log: printable ASCII kept, other
 * bytes as \xHH, at most cap - 4 bytes then "...".  For values echoed in
 * error messages (a config line, an option). */
static const char *shown(const char *s, char *buf, size_t cap)
{
    size_t o = 0;
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        bool plain = ch >= 0x20 && ch < 0x7f;
        if (o + (plain ? 1 : 4) + 4 > cap) break; /* "..." and the NUL stay */
        if (plain) buf[o++] = (char)ch;
        else o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", ch);
    }
    if (*s) {
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o] = '\0';
    return buf;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n'))
        s[--n] = '\0';
    return s;
}

static int parse_bytes(const char *v, uint64_t *out)
{
    if (!strcmp(v, "none") || !strcmp(v, "unlimited")) {
        *out = UINT64_MAX;
        return 0;
    }
    size_t s;
    if (gm__parse_size(v, &s) != GM_OK) return -1;
    *out = s;
    return 0;
}

static int parse_uint(const char *v, unsigned base, unsigned long max, unsigned long *out)
{
    char *end;
    errno = 0;
    unsigned long x = strtoul(v, &end, (int)base);
    if (errno || end == v || *end || x > max || v[0] == '-') return -1;
    *out = x;
    return 0;
}

/* What each key of the config (and its option) accepts, for the message
 * that refuses a value. */
static const char *accepted(const char *key)
{
    static const struct {
        const char *key, *what;
    } rules[] = {
        {"backend", "auto, sim or cuda"},
        {"device", "a device ordinal from 0 to 1024"},
        {"capacity", "a size such as 70GiB (units B, KiB, MiB, GiB, TiB)"},
        {"default_quota", "a size such as 8GiB (units B, KiB, MiB, GiB, TiB), none for no quota, "
                          "or 0 to refuse processes no tenant matches"},
        {"quota", "a size such as 40GiB (units B, KiB, MiB, GiB, TiB), or none"},
        {"guaranteed", "a size such as 10GiB (units B, KiB, MiB, GiB, TiB)"},
        {"keep_free", "a size such as 2GiB (units B, KiB, MiB, GiB, TiB), or none to keep all"},
        {"scrub", "tenant, always or never"},
        {"reclaim_ms", "milliseconds from 0 to 5000"},
        {"idle_timeout", "seconds from 0 (never) to 86400"},
        {"max_clients", "a number from 1 to 65536"},
        {"socket_mode", "an octal mode such as 0660"},
        {"job_grace", "seconds from 0 to 3600"},
    };
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
        if (!strcmp(rules[i].key, key)) return rules[i].what;
    return "see docs/broker.md";
}

/* "alice, 1001" -> uids (names through getpwnam). */
static int parse_ids(char *v, bool groups, tenant_cfg_t *t, char *err, size_t cap)
{
    for (char *save = NULL, *tok = strtok_r(v, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        tok = trim(tok);
        if (!*tok) continue;
        unsigned long id;
        if (parse_uint(tok, 10, UINT_MAX - 1, &id) != 0) {
            if (groups) {
                struct group *g = getgrnam(tok);
                if (!g) return snprintf(err, cap, "no group named '%s'", tok), -1;
                id = g->gr_gid;
            } else {
                struct passwd *p = getpwnam(tok);
                if (!p) return snprintf(err, cap, "no user named '%s'", tok), -1;
                id = p->pw_uid;
            }
        }
        if (groups) {
            if (t->n_gids == MAX_RULE_IDS) return snprintf(err, cap, "more than %d groups", MAX_RULE_IDS), -1;
            t->gids[t->n_gids++] = (gid_t)id;
        } else {
            if (t->n_uids == MAX_RULE_IDS) return snprintf(err, cap, "more than %d users", MAX_RULE_IDS), -1;
            t->uids[t->n_uids++] = (uid_t)id;
        }
    }
    return 0;
}

static const char *file_kind(mode_t m)
{
    return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISSOCK(m) ? "a socket"
         : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device"
         : S_ISLNK(m) ? "a symbolic link" : "not a file";
}

/* Open the config at path for reading: a regular file only.  Opened with
 * O_NONBLOCK (a FIFO's open does not wait for a writer: the broker's loop
 * reopens it at SIGHUP) and O_NOFOLLOW (path is resolved at start), then
 * checked with fstat.  NULL with err naming the path and what it is. */
static FILE *cfg_open(const char *path, char *err, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY);
    struct stat st;
    if (fd < 0) {
        int e = errno;
        if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode))
            snprintf(err, cap, "%s: %s, not a regular file", path, file_kind(st.st_mode));
        else snprintf(err, cap, "%s: %s", path, strerror(e));
        return NULL;
    }
    if (fstat(fd, &st) != 0) {
        snprintf(err, cap, "%s: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, cap, "%s: %s, not a regular file", path, file_kind(st.st_mode));
        close(fd);
        return NULL;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    FILE *f = fdopen(fd, "re");
    if (!f) {
        snprintf(err, cap, "%s: %s", path, strerror(errno));
        close(fd);
    }
    return f;
}

/* Parse the config file at path into c (defaults first).  0, or -1 with
 * err saying "LINE: what". */
static int cfg_load(const char *path, bcfg_t *c, char *err, size_t cap)
{
    FILE *f = cfg_open(path, err, cap);
    if (!f) return -1;
    char line[1024], why[256];
    int lineno = 0, rc = 0;
    tenant_cfg_t *t = NULL;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        why[0] = '\0';
        if (!strchr(line, '\n') && !feof(f)) {
            snprintf(why, sizeof why, "line longer than %zu bytes", sizeof line - 2);
            goto bad;
        }
        char *hash = strchr(line, '#');
        if (hash) *hash = '\0';
        char *s = trim(line);
        if (!*s) continue;
        if (*s == '[') {
            char *close_b = strchr(s, ']');
            if (!close_b || close_b[1]) {
                snprintf(why, sizeof why, "a section is [tenant NAME]");
                goto bad;
            }
            *close_b = '\0';
            char *body = trim(s + 1);
            if (strncmp(body, "tenant", 6) != 0 || (body[6] != ' ' && body[6] != '\t')) {
                snprintf(why, sizeof why, "a section is [tenant NAME]");
                goto bad;
            }
            char *name = trim(body + 6);
            size_t n = strlen(name);
            if (n == 0 || n >= GM__BROKER_NAME_MAX || strncmp(name, "uid:", 4) == 0) {
                snprintf(why, sizeof why, "tenant names are 1 to %d characters, not uid:N",
                         GM__BROKER_NAME_MAX - 1);
                goto bad;
            }
            for (size_t i = 0; i < n; i++)
                if (!(name[i] == '-' || name[i] == '_' || name[i] == '.' ||
                      (name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'z') ||
                      (name[i] >= 'A' && name[i] <= 'Z'))) {
                    char sh[96];
                    snprintf(why, sizeof why, "tenant name '%s': letters, digits, - _ . only",
                             shown(name, sh, sizeof sh));
                    goto bad;
                }
            for (size_t i = 0; i < c->n_tenants; i++)
                if (!strcmp(c->tenants[i].name, name)) {
                    snprintf(why, sizeof why, "tenant '%s' twice", name);
                    goto bad;
                }
            tenant_cfg_t *nt = realloc(c->tenants, (c->n_tenants + 1) * sizeof *nt);
            if (!nt) {
                snprintf(why, sizeof why, "out of memory");
                goto bad;
            }
            c->tenants = nt;
            t = &c->tenants[c->n_tenants++];
            memset(t, 0, sizeof *t);
            snprintf(t->name, sizeof t->name, "%s", name);
            t->quota = UINT64_MAX;
            continue;
        }
        char *eq = strchr(s, '=');
        if (!eq) {
            snprintf(why, sizeof why, "expected KEY = VALUE");
            goto bad;
        }
        *eq = '\0';
        char *k = trim(s), *v = trim(eq + 1);
        unsigned long u;
        if (t) {
            if (!strcmp(k, "users")) {
                if (parse_ids(v, false, t, why, sizeof why)) goto bad;
            } else if (!strcmp(k, "groups")) {
                if (parse_ids(v, true, t, why, sizeof why)) goto bad;
            } else if (!strcmp(k, "cgroup")) {
                if (v[0] != '/' || strlen(v) >= sizeof t->cgroup) {
                    snprintf(why, sizeof why, "cgroup is a path like /system.slice/x.service");
                    goto bad;
                }
                snprintf(t->cgroup, sizeof t->cgroup, "%s", v);
            } else if (!strcmp(k, "quota")) {
                if (parse_bytes(v, &t->quota)) goto badval;
            } else if (!strcmp(k, "guaranteed")) {
                if (parse_bytes(v, &t->guaranteed) || t->guaranteed == UINT64_MAX) goto badval;
            } else {
                snprintf(why, sizeof why, "unknown tenant key '%s' (users, groups, cgroup, quota, "
                         "guaranteed)", k);
                goto bad;
            }
            continue;
        }
        if (!strcmp(k, "socket")) {
            if (gm__wire_check_path("socket", v) != GM_OK || v[0] != '/') {
                snprintf(why, sizeof why, "socket is an absolute path of at most 107 bytes");
                goto bad;
            }
            snprintf(c->socket, sizeof c->socket, "%s", v);
        } else if (!strcmp(k, "backend")) {
            if (gm__parse_backend(v, &c->backend) != GM_OK) goto badval;
        } else if (!strcmp(k, "device")) {
            if (parse_uint(v, 10, 1024, &u)) goto badval;
            c->device = (int)u;
        } else if (!strcmp(k, "capacity")) {
            if (parse_bytes(v, &c->capacity) || c->capacity == UINT64_MAX) goto badval;
        } else if (!strcmp(k, "default_quota")) {
            if (parse_bytes(v, &c->default_quota)) goto badval;
        } else if (!strcmp(k, "keep_free")) {
            if (parse_bytes(v, &c->keep_free)) goto badval;
        } else if (!strcmp(k, "scrub")) {
            if (!strcmp(v, "tenant")) c->scrub = SCRUB_TENANT;
            else if (!strcmp(v, "always")) c->scrub = SCRUB_ALWAYS;
            else if (!strcmp(v, "never")) c->scrub = SCRUB_NEVER;
            else goto badval;
        } else if (!strcmp(k, "reclaim_ms")) {
            /* Below the 10 s a process waits for an answer. */
            if (parse_uint(v, 10, 5000, &u)) goto badval;
            c->reclaim_ms = (unsigned)u;
        } else if (!strcmp(k, "idle_timeout")) {
            if (parse_uint(v, 10, 86400, &u)) goto badval;
            c->idle_s = (unsigned)u;
        } else if (!strcmp(k, "max_clients")) {
            if (parse_uint(v, 10, 65536, &u) || u == 0) goto badval;
            c->max_clients = (unsigned)u;
        } else if (!strcmp(k, "socket_mode")) {
            if (parse_uint(v, 8, 0777, &u)) goto badval;
            c->socket_mode = (unsigned)u;
        } else if (!strcmp(k, "stats_file")) {
            snprintf(c->stats_file, sizeof c->stats_file, "%s", v);
        } else if (!strcmp(k, "admins")) {
            tenant_cfg_t who;
            memset(&who, 0, sizeof who);
            if (parse_ids(v, false, &who, why, sizeof why)) goto bad;
            memcpy(c->admins, who.uids, sizeof c->admins);
            c->n_admins = who.n_uids;
        } else if (!strcmp(k, "job_dir")) {
            /* The door of a job's tenant is job_dir/NAME/sock (a socket
             * address: 107 bytes at most, checked when a tenant is made). */
            if (v[0] != '/' || strlen(v) >= sizeof c->job_dir - 1) {
                snprintf(why, sizeof why, "job_dir is an absolute path of at most %zu bytes",
                         sizeof c->job_dir - 2);
                goto bad;
            }
            snprintf(c->job_dir, sizeof c->job_dir, "%s", v);
        } else if (!strcmp(k, "job_grace")) {
            if (parse_uint(v, 10, 3600, &u)) goto badval;
            c->job_grace_s = (unsigned)u;
        } else {
            snprintf(why, sizeof why, "unknown key '%s'", k);
            goto bad;
        }
        continue;
    badval:
        {
            char sh[64];
            snprintf(why, sizeof why, "'%s' is not a valid %s: give %s", shown(v, sh, sizeof sh),
                     k, accepted(k));
        }
    bad:
        snprintf(err, cap, "%s:%d: %s", path, lineno, why);
        rc = -1;
        break;
    }
    fclose(f);
    return rc;
}

/* ---- state ---------------------------------------------------------------------- */

typedef struct page {
    gm__phys_t h;
    int fd;          /* exported once */
    uint32_t holder; /* client slot + 1; 0: free */
    uint32_t last;   /* tenant + 1 of its last lease; 0: never leased */
    uint32_t next;   /* free list (index + 1) */
    bool clean;      /* zero since it last held data: no lease needs to zero it */
} page_t;

typedef struct tenant {
    tenant_cfg_t cfg;
    bool configured;   /* a rule of the config (else made for a uid) */
    uint64_t used, peak; /* pages */
    uint64_t refusals, reclaims, clients, cached;
    /* A wait for its other processes' unused pages that ended with nothing
     * given back: the next lease over quota is refused at once instead of
     * waiting again, until one of its processes returns a page. */
    bool futile;
    /* Made at run time by an admin (ADMIN_CREATE: a Slurm job's tenant).
     * Its processes come in through its door only, a socket in a directory
     * of mode 0700 owned by the job's uid; one is let in when its uid is
     * the job's and its ancestry reaches an anchor (a process of the job
     * the admin named, with its start time: a reused pid is another one).
     * gone: removed (the slot is reused once no client refers to it). */
    bool runtime, gone;
    uid_t job_uid;
    gid_t job_gid;
    uint64_t job_id;
    int door_fd;
    char door[108];
    struct {
        pid_t pid;
        uint64_t start;
    } anchors[16];
    size_t n_anchors;
    bool anchored;       /* had an anchor once: reaped when they are all gone */
    uint64_t orphan_ns;  /* since when it has no live anchor and no client */
    /* A job step's tenant (ADMIN_CREATE with GM__BROKER_FLAG_CARVE): its
     * quota and guarantee were taken from the job's tenant carved_from and
     * go back to it when this one is removed, so that
     *   job's quota + the quotas of its steps' tenants == the job's grant
     * and the job's processes and its steps' together hold at most that. */
    char carved_from[GM__BROKER_NAME_MAX];
    uint64_t carved, carved_guaranteed; /* bytes */
    uint64_t ooms;       /* refusals because the device was full (in refusals too) */
} tenant_t;

enum { C_FREE, C_NEW, C_CONTROL, C_VIEWER };

typedef struct client {
    int state;
    int fd, efd;
    pid_t pid;
    uid_t uid;
    gid_t gid;
    uint64_t start;         /* its process's start time (the record's key with pid) */
    /* The tenant its connection counts against (conn_limit_ok): decided at
     * accept; a control connection's is then its tenant's name. */
    char owner[GM__BROKER_NAME_MAX];
    bool over;              /* let in past the limits as an events connection */
    uint32_t door;          /* came in through the door of tenant door - 1; 0: the socket */
    uint64_t number, cookie;
    size_t tenant;
    uint64_t pages, adopted, cached;
    uint64_t recorded;      /* pages + adopted as the lease record last said */
    uint64_t first_ns;      /* when a new connection arrived */
    uint64_t last_ns;       /* a control connection: its last message */
    /* a lease waiting for room */
    bool pending;
    uint64_t want_min, want_max, deadline_ns;
} client_t;

/* A process that held pages when the last broker run wrote its lease
 * record (record_load): what it may still claim to keep ("adopt"). */
typedef struct kept {
    pid_t pid;
    uid_t uid;
    uint64_t start, pages;
    /* Booked to tenant - 1 before the process says anything (a process of
     * a job whose tenant came back from the jobs file: jobs_load), so a job
     * cannot lease its grant twice across a restart; 0: not booked. */
    size_t tenant;
} kept_t;

typedef struct broker {
    bcfg_t cfg;
    char config_path[PATH_MAX];
    /* the device */
    const gm__backend_ops_t *ops;
    void *bk;
    gm__bk_calls_t bk_calls;
    gm__backend_info_t info;
    size_t page;
    uint64_t cap_pages;
    uintptr_t win;     /* address space where pages are mapped to be zeroed */
    uint64_t scrubbed; /* pages zeroed */
    bool fresh_zero;   /* the backend's new pages read as zero (the sim: a new memfd each) */
    uint64_t zero_ns;  /* recent cost of zeroing one page (bounds the zeroing per turn) */
    uint64_t idle_zero_after_ns; /* zeroing free pages while idle failed: not before */
    /* books */
    page_t *pages;
    size_t n_pages, cap_pages_arr;
    uint32_t free_head;  /* made pages no one holds, clean (index + 1) */
    uint32_t dirty_head; /* made pages no one holds that held data since (index + 1) */
    uint64_t n_dirty;    /* pages on dirty_head's list (counted in n_free too) */
    uint32_t dead_head;  /* slots of released pages (index + 1) */
    uint64_t n_free, n_made;
    uint64_t leased;   /* pages held by clients, adopted ones included */
    bool futile;       /* the same for a full device (any return clears it) */
    tenant_t *tenants;
    size_t n_tenants;
    client_t *clients;
    size_t n_clients;
    uint64_t next_number, generation;
    int lfd;
    uint64_t started_ns, last_stats_ns, last_reap_ns;
    unsigned log_count;
    uint64_t log_window_ns;
    bool dirty;
    /* The lease record (record_write): <socket>.leases */
    char record_path[PATH_MAX];
    char boot_id[40];
    kept_t *kept;          /* claims the last run's record allows, not yet made */
    size_t n_kept;
    bool record_dirty;     /* a page went back since the last record */
    char record_why[512], stats_why[512]; /* the last failure logged (said once) */
} broker_t;

static volatile sig_atomic_t g_stop, g_reload;
static int g_sigpipe[2] = {-1, -1};

static void on_signal(int sig)
{
    int saved = errno;
    if (sig == SIGHUP) g_reload = 1;
    else g_stop = 1;
    if (g_sigpipe[1] >= 0) {
        ssize_t w = write(g_sigpipe[1], "s", 1);
        (void)w;
    }
    errno = saved;
}

static void logf_(broker_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(broker_t *b, const char *fmt, ...)
{
    uint64_t now = gm__now_ns();
    if (now - b->log_window_ns > 60000000000ull) {
        if (b->log_count > LOG_BURST)
            fprintf(stderr, "gpumem broker: %u log lines left out in the last minute\n",
                    b->log_count - LOG_BURST);
        b->log_window_ns = now;
        b->log_count = 0;
    }
    if (++b->log_count > LOG_BURST) return;
    char buf[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "gpumem broker: %s\n", buf);
}

static uint64_t bytes_to_pages(const broker_t *b, uint64_t bytes)
{
    return bytes == UINT64_MAX ? UINT64_MAX : bytes / b->page;
}

/* ---- tenants -------------------------------------------------------------------- */

/* Does the process's cgroup (v2 path, or any v1 hierarchy's) lie under prefix? */
static bool cgroup_under(pid_t pid, const char *prefix)
{
    char p[64], line[1024];
    snprintf(p, sizeof p, "/proc/%d/cgroup", (int)pid);
    FILE *f = fopen(p, "re");
    if (!f) return false;
    size_t n = strlen(prefix);
    bool hit = false;
    while (!hit && fgets(line, sizeof line, f)) {
        char *path = strchr(line, ':');
        if (path) path = strchr(path + 1, ':');
        if (!path) continue;
        path = trim(path + 1);
        if (!strncmp(path, prefix, n) && (path[n] == '\0' || path[n] == '/' || prefix[n - 1] == '/'))
            hit = true;
    }
    fclose(f);
    return hit;
}

static bool in_group(uid_t uid, gid_t gid, gid_t want)
{
    if (gid == want) return true;
    struct passwd *pw = getpwuid(uid);
    if (!pw) return false;
    gid_t groups[64];
    int n = 64;
    if (getgrouplist(pw->pw_name, pw->pw_gid, groups, &n) < 0) return false;
    for (int i = 0; i < n; i++)
        if (groups[i] == want) return true;
    return false;
}

static bool rule_matches(const tenant_cfg_t *t, pid_t pid, uid_t uid, gid_t gid)
{
    if (!t->n_uids && !t->n_gids && !t->cgroup[0]) return false;
    if (t->n_uids) {
        bool ok = false;
        for (size_t i = 0; i < t->n_uids; i++) ok |= t->uids[i] == uid;
        if (!ok) return false;
    }
    if (t->n_gids) {
        bool ok = false;
        for (size_t i = 0; i < t->n_gids && !ok; i++) ok = in_group(uid, gid, t->gids[i]);
        if (!ok) return false;
    }
    if (t->cgroup[0] && !cgroup_under(pid, t->cgroup)) return false;
    return true;
}

static ssize_t tenant_find(broker_t *b, const char *name)
{
    for (size_t i = 0; i < b->n_tenants; i++)
        if (!b->tenants[i].gone && !strcmp(b->tenants[i].cfg.name, name)) return (ssize_t)i;
    return -1;
}

static ssize_t tenant_add(broker_t *b, const tenant_cfg_t *cfg, bool configured)
{
    /* A removed tenant's slot once nothing refers to it; the pages it held
     * last are then marked as of no tenant, so they are zeroed before the
     * new tenant of the slot gets them. */
    for (size_t i = 0; i < b->n_tenants; i++) {
        tenant_t *t = &b->tenants[i];
        if (!t->gone || t->clients || t->used) continue;
        bool held = false;
        for (size_t k = 0; k < b->n_clients && !held; k++)
            held = b->clients[k].state != C_FREE &&
                   (b->clients[k].door == i + 1 ||
                    (b->clients[k].state == C_CONTROL && b->clients[k].tenant == i));
        if (held) continue;
        for (size_t p = 0; p < b->n_pages; p++)
            if (b->pages[p].last == i + 1) b->pages[p].last = 0;
        memset(t, 0, sizeof *t);
        t->door_fd = -1;
        t->cfg = *cfg;
        t->configured = configured;
        return (ssize_t)i;
    }
    tenant_t *nt = realloc(b->tenants, (b->n_tenants + 1) * sizeof *nt);
    if (!nt) return -1;
    b->tenants = nt;
    tenant_t *t = &b->tenants[b->n_tenants];
    memset(t, 0, sizeof *t);
    t->door_fd = -1;
    t->cfg = *cfg;
    t->configured = configured;
    return (ssize_t)b->n_tenants++;
}

/* The tenant of a process: the first rule that matches, else "uid:N" with
 * default_quota (none with default_quota 0: -2). */
static ssize_t tenant_of(broker_t *b, const bcfg_t *cfg, pid_t pid, uid_t uid, gid_t gid)
{
    for (size_t i = 0; i < b->n_tenants; i++)
        if (b->tenants[i].configured && rule_matches(&b->tenants[i].cfg, pid, uid, gid))
            return (ssize_t)i;
    char name[GM__BROKER_NAME_MAX];
    snprintf(name, sizeof name, "uid:%u", (unsigned)uid);
    ssize_t i = tenant_find(b, name);
    if (cfg->default_quota == 0) return -2;
    if (i >= 0) {
        b->tenants[i].cfg.quota = cfg->default_quota;
        return i;
    }
    tenant_cfg_t c = {.quota = cfg->default_quota};
    snprintf(c.name, sizeof c.name, "%s", name);
    return tenant_add(b, &c, false);
}

/* Pages the other tenants are promised and do not hold yet. */
static uint64_t promised_to_others(const broker_t *b, size_t t)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < b->n_tenants; i++) {
        if (i == t) continue;
        uint64_t g = bytes_to_pages(b, b->tenants[i].cfg.guaranteed);
        if (g > b->tenants[i].used) sum += g - b->tenants[i].used;
    }
    return sum;
}

/* ---- pages -------------------------------------------------------------------- */

/* A page for holder: a clean free one first, then one that held data (the
 * lease decides whether it must be zeroed), else a new one. */
static int page_take(broker_t *b, uint32_t holder, uint64_t *id)
{
    uint32_t *head = b->free_head ? &b->free_head : b->dirty_head ? &b->dirty_head : NULL;
    if (head) {
        uint32_t i = *head - 1;
        *head = b->pages[i].next;
        if (head == &b->dirty_head) b->n_dirty--;
        b->pages[i].holder = holder;
        b->n_free--;
        *id = i + 1;
        return GM_OK;
    }
    if (b->n_made >= b->cap_pages)
        return gm__set_error(GM_OUT_OF_MEMORY, "the broker's capacity is reached");
    if (b->n_pages == b->cap_pages_arr) {
        size_t cap = b->cap_pages_arr ? b->cap_pages_arr * 2 : 1024;
        page_t *np = realloc(b->pages, cap * sizeof *np);
        if (!np) return gm__set_error(GM_NO_HOST_MEMORY, "out of host memory");
        b->pages = np;
        b->cap_pages_arr = cap;
    }
    /* A slot of a released page first, else a new one. */
    size_t slot = b->dead_head ? b->dead_head - 1 : b->n_pages;
    gm__phys_t h;
    int rc;
    GM_BK(rc, b, phys_create, (b->bk, b->page, &h));
    if (rc != GM_OK) return rc;
    int fd;
    GM_BK(rc, b, export_fd, (b->bk, h, &fd));
    if (rc != GM_OK) {
        int r;
        GM_BK(r, b, phys_release, (b->bk, h));
        (void)r;
        return rc;
    }
    if (slot == b->n_pages) b->n_pages++;
    else b->dead_head = b->pages[slot].next;
    b->pages[slot] = (page_t){.h = h, .fd = fd, .holder = holder, .clean = b->fresh_zero};
    b->n_made++;
    *id = slot + 1;
    return GM_OK;
}

/* A page back on a free list (clean: zero since it last held data; else it
 * goes on the dirty list), or released past keep_free. */
static void page_put_as(broker_t *b, uint64_t id, bool clean)
{
    page_t *p = &b->pages[id - 1];
    p->holder = 0;
    p->clean = clean;
    if ((b->n_free + 1) * b->page > b->cfg.keep_free) {
        int rc;
        close(p->fd);
        p->fd = -1;
        GM_BK(rc, b, phys_release, (b->bk, p->h));
        if (rc != GM_OK) logf_(b, "releasing a page failed: %s", gm_last_error());
        b->n_made--;
        p->next = b->dead_head;
        b->dead_head = (uint32_t)id;
        return;
    }
    uint32_t *head = clean ? &b->free_head : &b->dirty_head;
    p->next = *head;
    *head = (uint32_t)id;
    b->n_dirty += !clean;
    b->n_free++;
}

/* A page a client held (it may hold the client's data). */
static void page_put(broker_t *b, uint64_t id) { page_put_as(b, id, false); }

/* ---- files the broker writes ------------------------------------------------------ */

/* Replace the file at path with text[0..n) (mode for a new file), never
 * writing through a name another user could have planted: path's directory
 * must belong to root or this uid and be writable by no one else unless it
 * is sticky; the text goes into a fresh file of an unguessable name made
 * there (O_CREAT|O_EXCL|O_NOFOLLOW, checked with fstat), which is then
 * renamed onto path (a symlink or a file planted at path is replaced as a
 * name and never opened; in a sticky directory another user's file stays
 * and the rename fails).  0, or -1 with why. */
static int file_replace(const char *path, const char *text, size_t n, mode_t mode, char *why,
                        size_t cap)
{
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!*base || !strcmp(base, ".") || !strcmp(base, ".."))
        return snprintf(why, cap, "%.300s is not a file name", path), -1;
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return snprintf(why, cap, "directory %.300s: %s", dir, strerror(errno)), -1;
    struct stat st;
    uid_t me = geteuid();
    if (fstat(dfd, &st) != 0) {
        snprintf(why, cap, "directory %.300s: %s", dir, strerror(errno));
        close(dfd);
        return -1;
    }
    if (st.st_uid != 0 && st.st_uid != me) {
        snprintf(why, cap, "directory %.300s belongs to uid %u, neither root nor this broker's uid %u",
                 dir, (unsigned)st.st_uid, (unsigned)me);
        close(dfd);
        return -1;
    }
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX)) {
        snprintf(why, cap, "directory %.300s is writable by others and not sticky (mode %04o)", dir,
                 (unsigned)(st.st_mode & 07777));
        close(dfd);
        return -1;
    }
    char tmp[NAME_MAX + 1];
    int fd = -1, err = 0;
    for (int tries = 0; tries < 8 && fd < 0; tries++) {
        uint64_t r;
        if (getentropy(&r, sizeof r) != 0) r = gm__now_ns() * 0x9e3779b97f4a7c15ull + (uint64_t)tries;
        snprintf(tmp, sizeof tmp, ".%.200s.%016" PRIx64 ".tmp", base, r);
        fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
        err = errno;
        if (fd < 0 && err != EEXIST) break;
    }
    if (fd < 0) {
        snprintf(why, cap, "creating a file in %.300s: %s", dir, strerror(err));
        close(dfd);
        return -1;
    }
    const char *what = NULL;
    if (fstat(fd, &st) != 0) {
        what = "fstat";
        err = errno;
    } else if (!S_ISREG(st.st_mode) || st.st_uid != me || st.st_size != 0) {
        what = "not a fresh file of this uid";
        err = EPERM;
    }
    for (size_t off = 0; !what && off < n;) {
        ssize_t w = write(fd, text + off, n - off);
        if (w > 0) off += (size_t)w;
        else if (w < 0 && errno == EINTR) continue;
        else {
            what = "write";
            err = w < 0 ? errno : EIO;
        }
    }
    if (close(fd) != 0 && !what) {
        what = "close";
        err = errno;
    }
    if (!what && renameat(dfd, tmp, dfd, base) != 0) {
        what = "rename into place";
        err = errno;
    }
    if (what) {
        unlinkat(dfd, tmp, 0);
        snprintf(why, cap, "%s: %s", what, strerror(err));
    }
    close(dfd);
    return what ? -1 : 0;
}

/* A file not written: logged once per reason (last: the reason said last,
 * cleared by a success), not at every second. */
static void say_not_written(broker_t *b, char *last, size_t cap, const char *what,
                            const char *path, const char *why)
{
    char line[sizeof b->stats_why];
    snprintf(line, sizeof line, "%s", why);
    if (!strcmp(last, line)) return;
    snprintf(last, cap, "%s", line);
    logf_(b, "%s %s not written: %s", what, path, why);
}

/* ---- the lease record ------------------------------------------------------------ */
/*
 * Pages a process kept across a broker restart ("adopt" in its HELLO) are
 * booked only as far as the broker's own record proves them, never on the
 * process's word: <socket>.leases, written by the broker (file_replace,
 * mode 0600) before a lease reply leaves and, when pages come back, with
 * the stats (at most once a second), so it never says less than a live
 * process holds.  One line per process: pid, start time, uid, pages (leased
 * and adopted).  A new broker loads it before it listens (a regular file of
 * its own uid that no one else may write, of this boot and page size), and
 * a claim is booked up to what the line of that process (pid and start
 * time: a reused pid is another process; and uid) allows; the rest is not
 * booked, and the HELLO reply's `adopt` says how much was.
 */
#define RECORD_MAGIC "gpumem broker lease record 1"

static void boot_id_read(char *out, size_t cap)
{
    out[0] = '\0';
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (!f) return;
    if (fgets(out, (int)cap, f)) out[strcspn(out, "\n")] = '\0';
    else out[0] = '\0';
    fclose(f);
}

/* Pages of kept entry e booked ahead to its tenant (jobs_load), n of them
 * no longer: its process claimed them or is gone. */
static void kept_unbook(broker_t *b, kept_t *e, uint64_t n)
{
    tenant_t *t = &b->tenants[e->tenant - 1];
    t->used -= n < t->used ? n : t->used;
    b->leased -= n < b->leased ? n : b->leased;
    t->futile = b->futile = false;
    b->dirty = true;
}

/* Load the last run's record into b->kept (at start, before listening). */
static void record_load(broker_t *b)
{
    snprintf(b->record_path, sizeof b->record_path, "%s.leases", b->cfg.socket);
    boot_id_read(b->boot_id, sizeof b->boot_id);
    int fd = open(b->record_path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        if (errno != ENOENT)
            logf_(b, "lease record %s: %s; pages processes kept are not booked", b->record_path,
                  strerror(errno));
        return;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
        (st.st_mode & 022) || st.st_size > (64 << 20)) {
        logf_(b, "lease record %s is not a file of this broker's uid %u that only it may "
              "write; ignored: pages processes kept are not booked", b->record_path,
              (unsigned)geteuid());
        close(fd);
        return;
    }
    FILE *f = fdopen(fd, "re");
    if (!f) {
        close(fd);
        return;
    }
    char line[256], want[96];
    int ok = fgets(line, sizeof line, f) && !strcmp(trim(line), RECORD_MAGIC);
    snprintf(want, sizeof want, "boot %s", b->boot_id);
    ok = ok && b->boot_id[0] && fgets(line, sizeof line, f) && !strcmp(trim(line), want);
    snprintf(want, sizeof want, "page %zu", b->page);
    ok = ok && fgets(line, sizeof line, f) && !strcmp(trim(line), want);
    uint64_t total = 0;
    while (ok && fgets(line, sizeof line, f)) {
        int pid;
        unsigned uid;
        unsigned long long start, pages;
        char extra;
        if (sscanf(line, "%d %llu %u %llu %c", &pid, &start, &uid, &pages, &extra) != 4 ||
            pid <= 0 || !start || !pages || pages > b->info.total_memory / b->page) {
            ok = 0;
            break;
        }
        size_t i = 0;
        while (i < b->n_kept && !(b->kept[i].pid == pid && b->kept[i].start == start)) i++;
        if (i == b->n_kept) {
            kept_t *nk = realloc(b->kept, (b->n_kept + 1) * sizeof *nk);
            if (!nk) break;
            b->kept = nk;
            b->kept[b->n_kept++] = (kept_t){.pid = pid, .uid = uid, .start = start};
        }
        if (b->kept[i].uid != uid) ok = 0;
        b->kept[i].pages += pages;
        total += pages;
    }
    fclose(f);
    if (!ok) {
        logf_(b, "lease record %s is of another boot, device or format; ignored", b->record_path);
        free(b->kept);
        b->kept = NULL;
        b->n_kept = 0;
        return;
    }
    if (b->n_kept)
        logf_(b, "lease record: %zu processes may keep %" PRIu64 " pages from the last run",
              b->n_kept, total);
}

/* Write the record now: every client's pages, and what processes still
 * alive may claim from the last run. */
static void record_write(broker_t *b)
{
    if (!b->record_path[0]) return;
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    if (!f) return;
    fprintf(f, "%s\nboot %s\npage %zu\n", RECORD_MAGIC, b->boot_id, b->page);
    for (size_t i = 0; i < b->n_clients; i++) {
        const client_t *c = &b->clients[i];
        if (c->state == C_CONTROL && c->start && c->pages + c->adopted)
            fprintf(f, "%d %" PRIu64 " %u %" PRIu64 "\n", (int)c->pid, c->start,
                    (unsigned)c->uid, c->pages + c->adopted);
    }
    size_t k = 0;
    for (size_t i = 0; i < b->n_kept; i++) {
        kept_t *e = &b->kept[i];
        if (!e->pages || gm__mon_start_time((int)e->pid) != e->start) { /* gone */
            if (e->tenant && e->pages) kept_unbook(b, e, e->pages);
            continue;
        }
        fprintf(f, "%d %" PRIu64 " %u %" PRIu64 "\n", (int)e->pid, e->start, (unsigned)e->uid,
                e->pages);
        b->kept[k++] = *e;
    }
    b->n_kept = k;
    if (fclose(f) != 0) {
        free(text);
        return;
    }
    char why[512];
    if (file_replace(b->record_path, text, n, 0600, why, sizeof why) == 0) {
        for (size_t i = 0; i < b->n_clients; i++)
            b->clients[i].recorded = b->clients[i].pages + b->clients[i].adopted;
        b->record_dirty = false;
        b->record_why[0] = '\0';
    } else {
        say_not_written(b, b->record_why, sizeof b->record_why, "lease record", b->record_path,
                        why);
    }
    free(text);
}

/* Before c is sent pages: the record says at least what it will hold. */
static void record_ahead(broker_t *b, const client_t *c)
{
    if (c->pages + c->adopted > c->recorded) record_write(b);
}

/* Of the pages c's process claims to keep, those the last run's record
 * proves (taken from it). */
static uint64_t record_take(broker_t *b, const client_t *c, uint64_t claim)
{
    uint64_t got = 0;
    for (size_t i = 0; i < b->n_kept && got < claim; i++) {
        kept_t *e = &b->kept[i];
        if (!c->start || e->pid != c->pid || e->start != c->start || e->uid != c->uid) continue;
        uint64_t k = e->pages < claim - got ? e->pages : claim - got;
        if (e->tenant) kept_unbook(b, e, k); /* the client books them itself */
        e->pages -= k;
        got += k;
    }
    return got;
}

/* ---- clients ------------------------------------------------------------------ */

static size_t client_slot(const broker_t *b, const client_t *c) { return (size_t)(c - b->clients); }

static void send_msg(broker_t *b, client_t *c, int fd, gm__broker_msg_t *m, const int *fds,
                     size_t nfds);

static void client_drop(broker_t *b, client_t *c, const char *why)
{
    if (c->state == C_CONTROL) {
        uint32_t me = (uint32_t)client_slot(b, c) + 1;
        uint64_t back = 0;
        for (size_t i = 0; i < b->n_pages && back < c->pages; i++)
            if (b->pages[i].holder == me) {
                page_put(b, i + 1);
                back++;
            }
        tenant_t *t = &b->tenants[c->tenant];
        t->used -= c->pages + c->adopted;
        t->clients--;
        if (c->pages + c->adopted) t->futile = b->futile = false;
        t->cached -= c->cached < t->cached ? c->cached : t->cached;
        b->leased -= c->pages + c->adopted;
        if (c->pages + c->adopted) b->record_dirty = true;
        /* A process that gave everything back and left is not news. */
        if (why && (back || c->adopted || strcmp(why, "disconnected") != 0))
            logf_(b, "pid %d (tenant '%s'): %s; %" PRIu64 " pages back", (int)c->pid,
                  t->cfg.name, why, back + c->adopted);
        b->dirty = true;
    } else if (why && strcmp(why, "disconnected") != 0 &&
               (c->state == C_NEW || c->state == C_VIEWER)) {
        logf_(b, "pid %d%s: %s", (int)c->pid, c->state == C_VIEWER ? " (a viewer)" : "", why);
    }
    if (c->fd >= 0) close(c->fd);
    if (c->efd >= 0) close(c->efd);
    memset(c, 0, sizeof *c);
    c->fd = c->efd = -1;
    c->state = C_FREE;
}

static void reply_init(broker_t *b, gm__broker_msg_t *m, const client_t *c, int status)
{
    memset(m, 0, sizeof *m);
    m->magic = GM__BROKER_MAGIC;
    m->version = GM__BROKER_VERSION;
    m->type = GM__BROKER_REPLY;
    m->status = status;
    m->pid = getpid();
    m->device = b->cfg.device;
    m->page_size = b->page;
    m->generation = b->generation;
    if (c && c->state == C_CONTROL) {
        const tenant_t *t = &b->tenants[c->tenant];
        snprintf(m->tenant, sizeof m->tenant, "%s", t->cfg.name);
        m->quota = t->cfg.quota;
        m->guaranteed = t->cfg.guaranteed;
        m->used = t->used * b->page;
        m->peak = t->peak * b->page;
    }
}

/* Send without blocking; a peer that cannot take it is dropped. */
static void send_msg(broker_t *b, client_t *c, int fd, gm__broker_msg_t *m, const int *fds,
                     size_t nfds)
{
    m->nfds = (uint32_t)nfds;
    if (gm__wire_send(fd, m, sizeof *m, fds, nfds, MSG_DONTWAIT, "broker") != GM_OK) {
        char why[300];
        snprintf(why, sizeof why, "%.280s", gm_last_error());
        gm__clear_error();
        client_drop(b, c, why);
    }
}

static char *fmt(uint64_t bytes, char *buf)
{
    if (bytes == UINT64_MAX) return strcpy(buf, "no limit");
    return (char *)gm__fmt_bytes(bytes, buf, 32);
}

/* Zero pages ids[0..n) (n <= GM__BROKER_IDS) before they go to another
 * tenant: mapped side by side in the broker's window, set to zero on the
 * device, unmapped.  GM_OK or the backend's error (nothing stays mapped). */
static int scrub(broker_t *b, const uint64_t *ids, size_t n)
{
    int rc = GM_OK, r;
    size_t mapped = 0;
    uint64_t t0 = gm__now_ns();
    for (; mapped < n; mapped++) {
        GM_BK(rc, b, map, (b->bk, b->win + mapped * b->page, b->page, b->pages[ids[mapped] - 1].h));
        if (rc != GM_OK) break;
    }
    if (rc == GM_OK) GM_BK(rc, b, set_access, (b->bk, b->win, n * b->page, 0));
    if (rc == GM_OK) GM_BK(rc, b, memset, (b->bk, b->win, 0, n * b->page, NULL));
    if (rc == GM_OK) GM_BK(rc, b, stream_sync, (b->bk, NULL));
    char err[256] = "";
    if (rc != GM_OK) snprintf(err, sizeof err, "%s", gm_last_error());
    for (size_t i = 0; i < mapped; i++) {
        GM_BK(r, b, unmap, (b->bk, b->win + i * b->page, b->page));
        if (r != GM_OK && rc == GM_OK) {
            rc = r;
            snprintf(err, sizeof err, "%s", gm_last_error());
        }
    }
    if (rc != GM_OK) return gm__set_error(rc, "%s", err);
    b->scrubbed += n;
    if (n) {
        uint64_t per = (gm__now_ns() - t0) / n + 1;
        b->zero_ns = b->zero_ns ? (3 * b->zero_ns + per) / 4 : per;
    }
    return GM_OK;
}

/* The loop is single-threaded: while it zeroes pages it answers no one.
 * Zeroing runs at the device's speed on a GPU (tens of microseconds a page,
 * mostly mapping) but at the host's on the sim, and at a share of it on a
 * loaded machine: a lease of 64 pages could hold every other client for
 * seconds (issue 42: "no answer in 10 s" under a burst).  So one turn zeroes
 * at most what fits in ZERO_TURN_NS at the recent cost per page. */
#define ZERO_TURN_NS 10000000ull

static uint64_t zero_budget(const broker_t *b)
{
    if (!b->zero_ns) return GM__BROKER_IDS;
    uint64_t n = ZERO_TURN_NS / b->zero_ns;
    return n < 1 ? 1 : n > GM__BROKER_IDS ? GM__BROKER_IDS : n;
}

/* scrub = always: zero free pages that held data while no request waits, so
 * that leases find clean ones.  One budget's worth per call. */
static void zero_idle(broker_t *b)
{
    uint64_t ids[GM__BROKER_IDS];
    size_t n = 0, budget = zero_budget(b);
    while (n < budget && b->dirty_head) {
        uint32_t i = b->dirty_head - 1;
        b->dirty_head = b->pages[i].next;
        b->n_dirty--;
        b->n_free--;
        ids[n++] = i + 1;
    }
    int rc = scrub(b, ids, n);
    if (rc != GM_OK) {
        logf_(b, "zeroing free pages failed: %s (tried again in a second)", gm_last_error());
        gm__clear_error();
        b->idle_zero_after_ns = gm__now_ns() + 1000000000ull;
    }
    for (size_t k = 0; k < n; k++) page_put_as(b, ids[k], rc == GM_OK);
    b->dirty = true;
}

/* Refuse c's lease with status and the reason (counted for its tenant). */
static void refuse(broker_t *b, client_t *c, int status, const char *fmt_, ...)
    __attribute__((format(printf, 4, 5)));
static void refuse(broker_t *b, client_t *c, int status, const char *fmt_, ...)
{
    gm__broker_msg_t m;
    reply_init(b, &m, c, status);
    va_list ap;
    va_start(ap, fmt_);
    vsnprintf(m.text, sizeof m.text, fmt_, ap);
    va_end(ap);
    b->tenants[c->tenant].refusals++;
    b->tenants[c->tenant].ooms += status == GM_OUT_OF_MEMORY;
    c->pending = false;
    send_msg(b, c, c->fd, &m, NULL, 0);
}

/* Try to serve c's lease.  1 served or refused (replied), 0 must wait. */
static int lease_try(broker_t *b, client_t *c, bool final)
{
    tenant_t *t = &b->tenants[c->tenant];
    uint64_t q = bytes_to_pages(b, t->cfg.quota);
    uint64_t room_q = q == UINT64_MAX ? UINT64_MAX : q > t->used ? q - t->used : 0;
    uint64_t promised = promised_to_others(b, c->tenant);
    uint64_t taken = b->leased + promised;
    uint64_t room_d = b->cap_pages > taken ? b->cap_pages - taken : 0;
    uint64_t room = room_q < room_d ? room_q : room_d;
    gm__broker_msg_t m;
    if (room >= c->want_min) {
        uint64_t n = c->want_max < room ? c->want_max : room;
        int fds[GM__BROKER_IDS];
        reply_init(b, &m, c, GM_OK);
        uint64_t got = 0;
        uint32_t me = (uint32_t)client_slot(b, c) + 1;
        while (got < n) {
            uint64_t id = 0;
            if (page_take(b, me, &id) != GM_OK) break;
            m.ids[got] = id;
            fds[got++] = b->pages[id - 1].fd;
        }
        if (got < c->want_min) {
            /* The device itself is full (other users of the GPU). */
            char err[200];
            snprintf(err, sizeof err, "%.190s", gm_last_error());
            for (uint64_t i = 0; i < got; i++) page_put_as(b, m.ids[i], b->pages[m.ids[i] - 1].clean);
            if (!final) return 0;
            refuse(b, c, GM_OUT_OF_MEMORY, "the broker could not make pages: %s", err);
            return 1;
        }
        /* A page that may hold another tenant's data (or any data, with
         * scrub = always) is zeroed first, unless it is clean.  Past the
         * turn's budget (but never below want_min pages) the pages that
         * would need zeroing go back: the lease is served smaller, the
         * loop answers the others, and the client asks again. */
        uint64_t dirty[GM__BROKER_IDS], clean_n = 0;
        size_t nd = 0;
        for (uint64_t i = 0; i < got; i++) {
            page_t *p = &b->pages[m.ids[i] - 1];
            clean_n += !(!p->clean && (b->cfg.scrub == SCRUB_ALWAYS ||
                                       (b->cfg.scrub == SCRUB_TENANT && p->last != c->tenant + 1)));
        }
        uint64_t budget = zero_budget(b);
        if (clean_n + budget < c->want_min) budget = c->want_min - clean_n;
        uint64_t kept = 0;
        for (uint64_t i = 0; i < got; i++) {
            page_t *p = &b->pages[m.ids[i] - 1];
            bool zero = !p->clean && (b->cfg.scrub == SCRUB_ALWAYS ||
                                      (b->cfg.scrub == SCRUB_TENANT && p->last != c->tenant + 1));
            if (zero && nd == budget) {
                page_put_as(b, m.ids[i], false);
                continue;
            }
            if (zero) dirty[nd++] = m.ids[i];
            m.ids[kept] = m.ids[i];
            fds[kept++] = fds[i];
        }
        got = kept;
        if (nd && scrub(b, dirty, nd) != GM_OK) {
            char err[200];
            snprintf(err, sizeof err, "%.190s", gm_last_error());
            logf_(b, "zeroing pages failed: %s", err);
            for (uint64_t i = 0; i < got; i++) page_put_as(b, m.ids[i], b->pages[m.ids[i] - 1].clean);
            refuse(b, c, GM_OUT_OF_MEMORY, "the broker could not zero pages: %s", err);
            return 1;
        }
        for (uint64_t i = 0; i < got; i++) {
            b->pages[m.ids[i] - 1].last = (uint32_t)c->tenant + 1;
            b->pages[m.ids[i] - 1].clean = false; /* the client may write it */
        }
        c->pages += got;
        t->used += got;
        if (t->used > t->peak) t->peak = t->used;
        b->leased += got;
        m.count = got;
        m.used = t->used * b->page;
        m.peak = t->peak * b->page;
        c->pending = false;
        b->dirty = true;
        record_ahead(b, c); /* the record proves these pages before they leave */
        send_msg(b, c, c->fd, &m, fds, got);
        return 1;
    }
    if (!final) return 0;
    char a[32], bq[32], cc[32], d[32];
    if (room_q < c->want_min) {
        t->futile = true;
        refuse(b, c, GM_LIMIT,
               "tenant '%s' is over its quota: it holds %s of %s (this process %s) and asked "
               "for %s more", t->cfg.name, fmt(t->used * b->page, a), fmt(t->cfg.quota, bq),
               fmt((c->pages + c->adopted) * b->page, cc), fmt(c->want_min * b->page, d));
    } else {
        b->futile = true;
        char e[32], f[32];
        refuse(b, c, GM_OUT_OF_MEMORY,
               "the broker's device is full: %s of %s leased, %s promised to other tenants; "
               "tenant '%s' holds %s and asked for %s more", fmt(b->leased * b->page, a),
               fmt(b->cap_pages * b->page, bq), fmt(promised * b->page, cc), t->cfg.name,
               fmt(t->used * b->page, e), fmt(c->want_min * b->page, f));
    }
    return 1;
}

/* Ask clients that hold pages for their unused ones: over quota, the
 * tenant's own other processes; a full device, everyone else. */
static size_t reclaim_ask(broker_t *b, client_t *c)
{
    tenant_t *t = &b->tenants[c->tenant];
    uint64_t q = bytes_to_pages(b, t->cfg.quota);
    bool quota_bound = q != UINT64_MAX && t->used + c->want_min > q;
    /* The last wait got nothing and nothing came back since: do not wait. */
    if (quota_bound ? t->futile : b->futile) return 0;
    size_t asked = 0;
    for (size_t i = 0; i < b->n_clients; i++) {
        client_t *o = &b->clients[i];
        if (o == c || o->state != C_CONTROL || o->efd < 0 || o->pages == 0) continue;
        if (quota_bound && o->tenant != c->tenant) continue;
        gm__broker_msg_t m;
        memset(&m, 0, sizeof m);
        m.magic = GM__BROKER_MAGIC;
        m.version = GM__BROKER_VERSION;
        m.type = GM__BROKER_RECLAIM;
        m.count = c->want_min;
        if (gm__wire_send(o->efd, &m, sizeof m, NULL, 0, MSG_DONTWAIT, "broker") != GM_OK) {
            gm__clear_error();
            continue; /* busy: it may still give back */
        }
        b->tenants[o->tenant].reclaims++;
        asked++;
    }
    return asked;
}

static void serve_pending(broker_t *b)
{
    for (size_t i = 0; i < b->n_clients; i++) {
        client_t *c = &b->clients[i];
        if (c->state == C_CONTROL && c->pending) lease_try(b, c, false);
    }
}

static bool ids_ok(const broker_t *b, const client_t *c, const gm__broker_msg_t *m)
{
    uint32_t me = (uint32_t)client_slot(b, c) + 1;
    if (m->count == 0 || m->count > GM__BROKER_IDS || m->count > c->pages) return false;
    for (uint64_t i = 0; i < m->count; i++) {
        uint64_t id = m->ids[i];
        if (id == 0 || id > b->n_pages || b->pages[id - 1].holder != me) return false;
        for (uint64_t j = 0; j < i; j++)
            if (m->ids[j] == id) return false;
    }
    return true;
}

static void set_cached(broker_t *b, client_t *c, uint64_t cached)
{
    tenant_t *t = &b->tenants[c->tenant];
    if (cached > c->pages) cached = c->pages;
    t->cached = t->cached - (c->cached < t->cached ? c->cached : t->cached) + cached;
    c->cached = cached;
}

static void on_hello(broker_t *b, client_t *c, gm__broker_msg_t *in)
{
    gm__broker_msg_t m;
    if (in->flags & GM__BROKER_FLAG_EVENTS) {
        /* Attach to the control connection it names, of the same process. */
        for (size_t i = 0; i < b->n_clients; i++) {
            client_t *o = &b->clients[i];
            if (o->state == C_CONTROL && o->number == in->client && o->cookie == in->cookie &&
                o->pid == c->pid && o->efd < 0) {
                o->efd = c->fd;
                c->fd = -1;
                reply_init(b, &m, o, GM_OK);
                send_msg(b, o, o->efd, &m, NULL, 0);
                c->state = C_FREE;
                client_drop(b, c, NULL);
                return;
            }
        }
        client_drop(b, c, "an events connection naming no client of its process");
        return;
    }
    if (in->page_size != b->page) {
        reply_init(b, &m, NULL, GM_INVALID_STATE);
        snprintf(m.text, sizeof m.text, "this broker leases pages of %zu bytes, the process's "
                 "pool uses %" PRIu64, b->page, in->page_size);
        send_msg(b, c, c->fd, &m, NULL, 0);
        client_drop(b, c, NULL);
        return;
    }
    /* Through a tenant's door: that tenant (checked at accept). */
    ssize_t t = c->door ? (ssize_t)c->door - 1 : tenant_of(b, &b->cfg, c->pid, c->uid, c->gid);
    if (t < 0) {
        reply_init(b, &m, NULL, t == -2 ? GM_DENIED : GM_NO_HOST_MEMORY);
        snprintf(m.text, sizeof m.text, t == -2 ? "no tenant of the broker's config matches uid "
                 "%u, and default_quota is 0" : "the broker is out of host memory",
                 (unsigned)c->uid);
        send_msg(b, c, c->fd, &m, NULL, 0);
        client_drop(b, c, t == -2 ? "refused: no tenant matches" : NULL);
        return;
    }
    c->state = C_CONTROL;
    c->tenant = (size_t)t;
    c->last_ns = gm__now_ns();
    c->number = ++b->next_number;
    uint64_t r;
    if (getentropy(&r, sizeof r) != 0) r = gm__now_ns() * 0x9e3779b97f4a7c15ull;
    c->cookie = r | 1;
    tenant_t *tn = &b->tenants[t];
    tn->clients++;
    /* Pages it kept across a restart count as far as the last run's lease
     * record proves them (record_take; never refused, the rest not
     * booked); no process holds more than the device. */
    if (in->adopt > b->info.total_memory / b->page) {
        c->state = C_NEW;
        tn->clients--;
        client_drop(b, c, "dropped: it claims to hold more pages than the device has");
        return;
    }
    uint64_t adopt = in->adopt ? record_take(b, c, in->adopt) : 0;
    c->adopted = adopt;
    tn->used += adopt;
    if (tn->used > tn->peak) tn->peak = tn->used;
    b->leased += adopt;
    if (adopt == in->adopt && adopt)
        logf_(b, "pid %d (tenant '%s') kept %" PRIu64 " pages from an earlier broker run",
              (int)c->pid, tn->cfg.name, adopt);
    else if (adopt < in->adopt)
        logf_(b, "pid %d (tenant '%s') claims to keep %" PRIu64 " pages from an earlier broker "
              "run; the lease record proves %" PRIu64 ": only those are booked", (int)c->pid,
              tn->cfg.name, in->adopt, adopt);
    reply_init(b, &m, c, GM_OK);
    m.client = c->number;
    m.cookie = c->cookie;
    m.adopt = adopt; /* what was booked: the process tells of no more (UNADOPT) */
    b->dirty = true;
    send_msg(b, c, c->fd, &m, NULL, 0);
}

static void on_stats(broker_t *b, client_t *c, gm__broker_msg_t *in)
{
    gm__broker_msg_t m;
    reply_init(b, &m, NULL, GM_OK);
    /* Removed tenants are not shown: row k is the k-th tenant in use. */
    size_t live = 0, at = b->n_tenants;
    for (size_t i = 0; i < b->n_tenants; i++)
        if (!b->tenants[i].gone && live++ == in->first) at = i;
    m.count = live;
    m.capacity = b->cap_pages * b->page;
    m.device_used = b->leased * b->page;
    if (at < b->n_tenants) {
        const tenant_t *t = &b->tenants[at];
        m.first = in->first;
        snprintf(m.tenant, sizeof m.tenant, "%s", t->cfg.name);
        m.quota = t->cfg.quota;
        m.guaranteed = t->cfg.guaranteed;
        m.used = t->used * b->page;
        m.peak = t->peak * b->page;
        m.cached_bytes = t->cached * b->page;
        m.refusals = t->refusals;
        m.min = t->ooms;
        m.clients = t->clients;
        m.reclaims = t->reclaims;
    }
    send_msg(b, c, c->fd, &m, NULL, 0);
}

/* ---- tenants made at run time (a Slurm job's) -------------------------------- */
/*
 * An admin (root, the broker's uid, or a user of `admins`) makes a tenant
 * for a job (ADMIN_CREATE) and removes it (ADMIN_REMOVE) when the job ends.
 * The tenant's processes come in through its door: a socket of its own,
 * job_dir/NAME/sock, in a directory of mode 0700 owned by the job's uid (so
 * other users cannot even reach it).  A process of the same user is not
 * stopped by the mode, so the broker also checks, at accept, that the
 * process belongs to the job: its uid is the job's and one of its
 * ancestors is an anchor, a process the admin named (the job step's
 * slurmstepd), alive with the start time it had when it was named.  A
 * process of another job of that user descends from another slurmstepd
 * and is turned away.  Anchor processes cannot be faked: a process cannot
 * choose its parent.
 *
 * The tenants and their anchors are kept in <socket>.jobs (file_replace,
 * 0600) so that a broker restarted while jobs run opens the same doors
 * again.  A tenant whose anchors are all gone and that no process uses is
 * removed after job_grace seconds (a job whose end the admin never
 * reported: slurmd restarted, the node's epilog lost).
 */
#define JOBS_MAGIC "gpumem broker jobs 1"

/* The parent of pid (field 4 of /proc/<pid>/stat), 0 when unknown. */
static pid_t parent_of(pid_t pid)
{
    char p[64], text[1024];
    snprintf(p, sizeof p, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(p, "re");
    if (!f) return 0;
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    char *close_p = strrchr(text, ')');
    int ppid = 0;
    if (!close_p || sscanf(close_p + 1, " %*c %d", &ppid) != 1) return 0;
    return (pid_t)ppid;
}

static bool anchor_alive(const tenant_t *t, size_t i)
{
    return gm__mon_start_time((int)t->anchors[i].pid) == t->anchors[i].start;
}

/* pid or one of its ancestors is a live anchor of t. */
static bool ancestry_reaches(const tenant_t *t, pid_t pid)
{
    for (int depth = 0; pid > 1 && depth < 128; depth++) {
        for (size_t i = 0; i < t->n_anchors; i++)
            if (t->anchors[i].pid == pid && anchor_alive(t, i)) return true;
        pid = parent_of(pid);
    }
    return false;
}

static bool is_admin(const broker_t *b, uid_t uid)
{
    if (uid == 0 || uid == geteuid()) return true;
    for (size_t i = 0; i < b->cfg.n_admins; i++)
        if (b->cfg.admins[i] == uid) return true;
    return false;
}

static void door_close(broker_t *b, tenant_t *t)
{
    (void)b;
    if (t->door_fd >= 0) close(t->door_fd);
    t->door_fd = -1;
    if (t->door[0]) {
        unlink(t->door);
        char dir[sizeof t->door];
        snprintf(dir, sizeof dir, "%s", t->door);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = '\0', rmdir(dir);
    }
    t->door[0] = '\0';
}

/* Open t's door: job_dir (made root's or the broker's, 0755, if missing),
 * job_dir/NAME (0700, the job's uid), job_dir/NAME/sock (0600, the job's
 * uid).  0, or -1 with why. */
static int door_open(broker_t *b, tenant_t *t, char *why, size_t cap)
{
    const char *jd = b->cfg.job_dir;
    if (!jd[0]) return snprintf(why, cap, "the broker has no job_dir in its config: it cannot "
                                "open doors for tenants made at run time"), -1;
    char dir[sizeof t->door + 80], path[sizeof dir + 8];
    snprintf(dir, sizeof dir, "%s/%s", jd, t->cfg.name);
    snprintf(path, sizeof path, "%s/sock", dir);
    if (strlen(path) >= sizeof t->door)
        return snprintf(why, cap, "the door %s is longer than a socket address (107 bytes)",
                        path), -1;
    struct stat st;
    if (mkdir(jd, 0755) != 0 && errno != EEXIST)
        return snprintf(why, cap, "job_dir %s: %s", jd, strerror(errno)), -1;
    if (lstat(jd, &st) != 0 || !S_ISDIR(st.st_mode) || (st.st_uid != 0 && st.st_uid != geteuid()) ||
        (st.st_mode & 022))
        return snprintf(why, cap, "job_dir %s must be a directory of root or the broker's uid "
                        "that no one else may write", jd), -1;
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return snprintf(why, cap, "door directory %s: %s", dir, strerror(errno)), -1;
    if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return snprintf(why, cap, "door directory %s is not a directory", dir), -1;
    unlink(path); /* a stale door of an earlier run */
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return snprintf(why, cap, "socket: %s", strerror(errno)), -1;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    _Static_assert(sizeof t->door <= sizeof a.sun_path, "a door fits a socket address");
    size_t plen = strlen(path); /* < sizeof t->door: checked above */
    memcpy(a.sun_path, path, plen + 1);
    mode_t old = umask(0177);
    int r = bind(fd, (struct sockaddr *)&a, sizeof a);
    umask(old);
    const char *what = r != 0 ? "bind" : NULL;
    int err = errno;
    bool mine = t->job_uid == geteuid();
    /* lchown: after a restart the door's directory is already the job
     * user's, who could put a link where the socket was just bound; a
     * root broker must not give that link's target away. */
    if (!what && !mine && (lchown(path, t->job_uid, t->job_gid) != 0 ||
                           lchown(dir, t->job_uid, t->job_gid) != 0))
        what = "chown", err = errno;
    if (!what && fchmodat(AT_FDCWD, dir, 0700, AT_SYMLINK_NOFOLLOW) != 0) what = "chmod", err = errno;
    if (!what && listen(fd, 128) != 0) what = "listen", err = errno;
    if (what) {
        close(fd);
        unlink(path);
        rmdir(dir);
        return snprintf(why, cap, "door %s: %s: %s", path, what, strerror(err)), -1;
    }
    t->door_fd = fd;
    memcpy(t->door, path, plen + 1);
    return 0;
}

/* Write <socket>.jobs: every tenant made at run time, with its anchors. */
static void jobs_write(broker_t *b)
{
    if (!b->record_path[0]) return;
    char path[PATH_MAX + 8];
    snprintf(path, sizeof path, "%s.jobs", b->cfg.socket);
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    if (!f) return;
    fprintf(f, "%s\n", JOBS_MAGIC);
    for (size_t i = 0; i < b->n_tenants; i++) {
        const tenant_t *t = &b->tenants[i];
        if (!t->runtime || t->gone) continue;
        fprintf(f, "%s %u %u %" PRIu64 " %" PRIu64 " %" PRIu64 " %d", t->cfg.name,
                (unsigned)t->job_uid, (unsigned)t->job_gid, t->job_id,
                t->cfg.quota, t->cfg.guaranteed,
                t->anchored ? 1 : 0);
        for (size_t k = 0; k < t->n_anchors; k++)
            fprintf(f, " %d:%" PRIu64, (int)t->anchors[k].pid, t->anchors[k].start);
        if (t->carved_from[0])
            fprintf(f, " from=%s:%" PRIu64 ":%" PRIu64, t->carved_from, t->carved,
                    t->carved_guaranteed);
        fputc('\n', f);
    }
    if (fclose(f) != 0) {
        free(text);
        return;
    }
    char why[512];
    if (file_replace(path, text, n, 0600, why, sizeof why) != 0)
        logf_(b, "jobs file %s not written: %s; a restarted broker will not know its jobs", path,
              why);
    free(text);
}

static void tenant_remove(broker_t *b, size_t ti, const char *why);

/* Read <socket>.jobs at start: each job's tenant again, with its door. */
static void jobs_load(broker_t *b)
{
    char path[PATH_MAX + 8];
    snprintf(path, sizeof path, "%s.jobs", b->cfg.socket);
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
        (st.st_mode & 022) || st.st_size > (16 << 20)) {
        logf_(b, "jobs file %s is not a file of this broker's uid that only it may write; "
              "ignored", path);
        close(fd);
        return;
    }
    FILE *f = fdopen(fd, "re");
    if (!f) {
        close(fd);
        return;
    }
    char line[2048];
    size_t n = 0;
    if (fgets(line, sizeof line, f) && !strcmp(trim(line), JOBS_MAGIC)) {
        while (fgets(line, sizeof line, f)) {
            tenant_cfg_t c;
            memset(&c, 0, sizeof c);
            char name[GM__BROKER_NAME_MAX];
            unsigned uid, gid;
            unsigned long long job, quota, guaranteed;
            int anchored, used = 0;
            if (sscanf(line, "%63s %u %u %llu %llu %llu %d%n", name, &uid, &gid, &job, &quota,
                       &guaranteed, &anchored, &used) != 7 || tenant_find(b, name) >= 0)
                continue;
            snprintf(c.name, sizeof c.name, "%s", name);
            /* As written: a quota of 0 stays 0 (a job's tenant that gave
             * all it had to its steps, or a job without a request). */
            c.quota = quota;
            c.guaranteed = guaranteed;
            ssize_t ti = tenant_add(b, &c, false);
            if (ti < 0) break;
            tenant_t *t = &b->tenants[ti];
            t->runtime = true;
            t->job_uid = uid;
            t->job_gid = gid;
            t->job_id = job;
            t->anchored = anchored != 0;
            char *s = line + used, *end;
            while (t->n_anchors < 16) {
                long pid = strtol(s, &end, 10);
                if (end == s || *end != ':') break;
                unsigned long long start = strtoull(end + 1, &s, 10);
                t->anchors[t->n_anchors].pid = (pid_t)pid;
                t->anchors[t->n_anchors++].start = start;
            }
            /* A step's tenant: what it took from its job's (given back at
             * its removal; the job's line already has the rest). */
            char from[GM__BROKER_NAME_MAX];
            unsigned long long carved, carved_g;
            if (sscanf(s, " from=%63[^:]:%llu:%llu", from, &carved, &carved_g) == 3) {
                snprintf(t->carved_from, sizeof t->carved_from, "%s", from);
                t->carved = carved;
                t->carved_guaranteed = carved_g;
            }
            char why[512];
            if (door_open(b, t, why, sizeof why) != 0) {
                logf_(b, "tenant '%s' of the jobs file: %s; removed", t->cfg.name, why);
                tenant_remove(b, (size_t)ti, NULL);
                continue;
            }
            n++;
        }
    }
    fclose(f);
    /* Pages a job's processes kept from the last run count against the
     * job at once, not only when the process next speaks. */
    uint64_t booked = 0;
    for (size_t k = 0; k < b->n_kept; k++) {
        kept_t *e = &b->kept[k];
        for (size_t i = 0; i < b->n_tenants && !e->tenant; i++) {
            tenant_t *t = &b->tenants[i];
            if (!t->runtime || t->gone || e->uid != t->job_uid || !e->pages ||
                gm__mon_start_time((int)e->pid) != e->start || !ancestry_reaches(t, e->pid))
                continue;
            e->tenant = i + 1;
            t->used += e->pages;
            if (t->used > t->peak) t->peak = t->used;
            b->leased += e->pages;
            booked += e->pages;
        }
    }
    if (n) logf_(b, "jobs file: %zu tenants made at run time are back, doors open; %" PRIu64
                 " pages their processes kept are booked to them", n, booked);
}

/* Is tenant i a live step tenant carved from tenant ti? */
static bool carved_from(const broker_t *b, size_t i, size_t ti)
{
    const tenant_t *s = &b->tenants[i];
    return i != ti && s->runtime && !s->gone && s->carved_from[0] &&
           !strcmp(s->carved_from, b->tenants[ti].cfg.name);
}

/* Remove the step tenants carved from ti (a job that ends ends its steps);
 * each gives its share back to ti. */
static void steps_remove(broker_t *b, size_t ti)
{
    for (size_t i = 0; i < b->n_tenants; i++)
        if (carved_from(b, i, ti)) tenant_remove(b, i, "its job's tenant was removed");
}

/* Remove runtime tenant ti: its steps' tenants first, its processes
 * dropped (every page back), its door closed; a step's tenant gives its
 * quota and guarantee back to its job's.  why: logged with its figures
 * (NULL: quietly). */
static void tenant_remove(broker_t *b, size_t ti, const char *why)
{
    steps_remove(b, ti);
    tenant_t *t = &b->tenants[ti];
    uint64_t dropped = 0, held = t->used;
    for (size_t i = 0; i < b->n_clients; i++) {
        client_t *c = &b->clients[i];
        if (c->state == C_FREE) continue;
        if (c->door == ti + 1 || (c->state == C_CONTROL && c->tenant == ti)) {
            dropped += c->state == C_CONTROL;
            client_drop(b, c, "its tenant was removed");
        }
    }
    for (size_t k = 0; k < b->n_kept; k++)
        if (b->kept[k].tenant == ti + 1) {
            kept_unbook(b, &b->kept[k], b->kept[k].pages);
            b->kept[k].tenant = 0;
        }
    door_close(b, t);
    ssize_t job = t->carved_from[0] ? tenant_find(b, t->carved_from) : -1;
    if (job >= 0) {
        tenant_t *j = &b->tenants[job];
        if (j->cfg.quota != UINT64_MAX) j->cfg.quota += t->carved;
        j->cfg.guaranteed += t->carved_guaranteed;
        j->futile = false;
    }
    if (why) {
        char a[32], q[32], h[32];
        logf_(b, "tenant '%s' (job %" PRIu64 ") removed: %s; peak %s of quota %s, %s held at "
              "the end, %" PRIu64 " refusals (%" PRIu64 " out of device memory), %" PRIu64
              " processes dropped%s%s", t->cfg.name, t->job_id, why, fmt(t->peak * b->page, a),
              fmt(t->cfg.quota, q), fmt(held * b->page, h), t->refusals, t->ooms, dropped,
              job >= 0 ? "; its quota back to " : "", job >= 0 ? b->tenants[job].cfg.name : "");
    }
    t->gone = true;
    t->cfg.guaranteed = 0;
    t->n_anchors = 0;
    b->dirty = true;
    jobs_write(b);
}

/* Drop the tenants of jobs that are gone (their anchors dead, no process
 * connected) for job_grace seconds.  Called about once a second. */
static void jobs_reap(broker_t *b, uint64_t now)
{
    /* Kept pages booked ahead whose process ended without coming back. */
    for (size_t k = 0; k < b->n_kept; k++) {
        kept_t *e = &b->kept[k];
        if (e->tenant && e->pages && gm__mon_start_time((int)e->pid) != e->start) {
            kept_unbook(b, e, e->pages);
            e->pages = 0;
            e->tenant = 0;
        }
    }
    for (size_t i = 0; i < b->n_tenants; i++) {
        tenant_t *t = &b->tenants[i];
        if (!t->runtime || t->gone || !t->anchored) continue;
        size_t k = 0;
        for (size_t a = 0; a < t->n_anchors; a++)
            if (anchor_alive(t, a)) t->anchors[k++] = t->anchors[a];
        if (k != t->n_anchors) {
            t->n_anchors = k;
            jobs_write(b);
        }
        bool steps = false; /* a job's tenant lives while its steps' do */
        for (size_t j = 0; j < b->n_tenants && !steps && !k; j++) steps = carved_from(b, j, i);
        if (k || t->clients || steps) {
            t->orphan_ns = 0;
            continue;
        }
        if (!t->orphan_ns) t->orphan_ns = now;
        else if (now - t->orphan_ns >= (uint64_t)b->cfg.job_grace_s * 1000000000ull)
            tenant_remove(b, i, "its job's processes are gone and no one removed it");
    }
}

/* ADMIN_CREATE / ADMIN_REMOVE from c (a new connection or a viewer). */
static void on_admin(broker_t *b, client_t *c, gm__broker_msg_t *in)
{
    gm__broker_msg_t m;
    reply_init(b, &m, NULL, GM_OK);
    c->state = C_VIEWER;
    c->first_ns = gm__now_ns();
    const char *name = in->tenant;
    char sh[96];
    if (c->door || !is_admin(b, c->uid)) {
        m.status = GM_DENIED;
        snprintf(m.text, sizeof m.text, "uid %u may not make or remove tenants: only root, the "
                 "broker's uid %u and the config's admins may", (unsigned)c->uid,
                 (unsigned)geteuid());
        logf_(b, "pid %d uid %u: refused an admin request", (int)c->pid, (unsigned)c->uid);
        send_msg(b, c, c->fd, &m, NULL, 0);
        return;
    }
    ssize_t ti = tenant_find(b, name);
    if (in->type == GM__BROKER_ADMIN_REMOVE) {
        if (ti < 0 || !b->tenants[ti].runtime) {
            m.status = GM_INVALID_ARGUMENT;
            snprintf(m.text, sizeof m.text, ti < 0 ? "no tenant '%s'" :
                     "tenant '%s' is of the config, not made at run time",
                     shown(name, sh, sizeof sh));
        } else {
            steps_remove(b, (size_t)ti); /* their quotas back: the job's figures whole */
            tenant_t *t = &b->tenants[ti];
            snprintf(m.tenant, sizeof m.tenant, "%s", t->cfg.name);
            m.quota = t->cfg.quota;
            m.used = t->used * b->page;
            m.peak = t->peak * b->page;
            m.refusals = t->refusals;
            m.count = t->ooms;
            m.clients = t->clients;
            tenant_remove(b, (size_t)ti, "removed by its admin");
        }
        send_msg(b, c, c->fd, &m, NULL, 0);
        return;
    }
    /* ADMIN_CREATE */
    size_t n = strlen(name);
    bool name_ok = n > 0 && n < GM__BROKER_NAME_MAX && strncmp(name, "uid:", 4) != 0;
    for (size_t i = 0; i < n && name_ok; i++)
        name_ok = name[i] == '-' || name[i] == '_' || name[i] == '.' ||
                  (name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'z') ||
                  (name[i] >= 'A' && name[i] <= 'Z');
    uint64_t quota = in->quota, guaranteed = in->guaranteed;
    bool carve = in->flags & GM__BROKER_FLAG_CARVE;
    ssize_t ji = carve ? tenant_find(b, in->text) : -1; /* the job's tenant a step carves from */
    char sh2[96];
    if (in->flags & ~GM__BROKER_FLAG_CARVE) {
        m.status = GM_INVALID_ARGUMENT;
        snprintf(m.text, sizeof m.text, "unknown flags 0x%x in a create", (unsigned)in->flags);
    } else if (carve != (in->text[0] != '\0')) {
        m.status = GM_INVALID_ARGUMENT;
        snprintf(m.text, sizeof m.text, carve ? "a step's tenant must name its job's tenant" :
                 "a create names a job's tenant but does not carve from it");
    } else if (carve && (ji < 0 || !b->tenants[ji].runtime || b->tenants[ji].carved_from[0] ||
                         (size_t)ji == (size_t)ti)) {
        m.status = GM_INVALID_ARGUMENT;
        snprintf(m.text, sizeof m.text, "no job's tenant '%s' to carve a step's tenant from",
                 shown(in->text, sh2, sizeof sh2));
    } else if (carve && (b->tenants[ji].job_uid != in->count || b->tenants[ji].job_id != in->first)) {
        m.status = GM_INVALID_STATE;
        snprintf(m.text, sizeof m.text, "tenant '%s' is not this job's",
                 shown(in->text, sh2, sizeof sh2));
    } else if (ti >= 0 && b->tenants[ti].runtime &&
               (carve ? strcmp(b->tenants[ti].carved_from, in->text) != 0 ||
                            b->tenants[ti].carved != quota
                      : b->tenants[ti].carved_from[0] != '\0')) {
        m.status = GM_INVALID_STATE;
        snprintf(m.text, sizeof m.text, "tenant '%s' exists with another grant or job's tenant",
                 shown(name, sh, sizeof sh));
    } else if (!name_ok) {
        m.status = GM_INVALID_ARGUMENT;
        snprintf(m.text, sizeof m.text, "tenant name '%s': 1 to 63 letters, digits, - _ .",
                 shown(name, sh, sizeof sh));
    } else if (in->count > UINT32_MAX - 1 || in->min > UINT32_MAX - 1 || in->pid < 0) {
        m.status = GM_INVALID_ARGUMENT;
        snprintf(m.text, sizeof m.text, "a uid, gid or anchor pid out of range");
    } else if (guaranteed > quota) {
        m.status = GM_INVALID_ARGUMENT;
        snprintf(m.text, sizeof m.text, "guaranteed exceeds the quota");
    } else if (ti >= 0 && (!b->tenants[ti].runtime || b->tenants[ti].job_uid != in->count ||
                           b->tenants[ti].job_id != in->first)) {
        m.status = GM_INVALID_STATE;
        snprintf(m.text, sizeof m.text, "tenant '%s' exists and is not this job's",
                 shown(name, sh, sizeof sh));
    }
    uint64_t anchor_start = in->pid ? gm__mon_start_time((int)in->pid) : 0;
    if (m.status == GM_OK && in->pid && !anchor_start) {
        m.status = GM_INVALID_ARGUMENT;
        snprintf(m.text, sizeof m.text, "anchor pid %lld is not running", (long long)in->pid);
    }
    uint64_t carved = 0, carved_g = 0; /* a job's tenant: what its steps hold of its grant */
    for (size_t i = 0; ti >= 0 && i < b->n_tenants; i++)
        if (carved_from(b, i, (size_t)ti))
            carved += b->tenants[i].carved, carved_g += b->tenants[i].carved_guaranteed;
    if (m.status == GM_OK && carve && ti < 0) {
        /* The step's grant comes out of what the job has not used: the
         * job's processes keep what they hold, within what is left. */
        tenant_t *j = &b->tenants[ji];
        uint64_t held = j->used * b->page;
        uint64_t left = j->cfg.quota == UINT64_MAX ? UINT64_MAX
                        : j->cfg.quota > held ? j->cfg.quota - held : 0;
        if (quota > left) {
            char a[32], q[32], g[32], h[32];
            m.status = GM_LIMIT;
            snprintf(m.text, sizeof m.text, "tenant '%s' has %s left of its quota %s (%s held by "
                     "its processes): a step's tenant '%s' of %s does not fit", j->cfg.name,
                     fmt(left, a), fmt(j->cfg.quota, q), fmt(held, h), shown(name, sh, sizeof sh),
                     fmt(quota, g));
        }
        if (guaranteed > j->cfg.guaranteed) guaranteed = j->cfg.guaranteed;
    } else if (m.status == GM_OK && !carve) {
        /* Guarantees promised together fit the capacity: one that does not
         * is cut to what is left (logged), never refused, since the tenant
         * of a job that ended while its remover could not reach the broker
         * keeps its guarantee until it is reaped, and the scheduler may
         * already have given its share to the next job. */
        uint64_t promised = 0, cap = b->cap_pages * b->page;
        for (size_t i = 0; i < b->n_tenants; i++)
            if (!b->tenants[i].gone && (ssize_t)i != ti && !(ti >= 0 && carved_from(b, i, (size_t)ti)))
                promised += b->tenants[i].cfg.guaranteed;
        if (promised + guaranteed > cap) {
            char a[32], q[32], g[32], h[32];
            uint64_t left = promised < cap ? cap - promised : 0;
            logf_(b, "tenant '%s': guarantee cut from %s to %s: %s of the capacity %s is "
                  "promised to other tenants", name, fmt(guaranteed, g), fmt(left, h),
                  fmt(promised, a), fmt(cap, q));
            guaranteed = left;
        }
    }
    if (m.status != GM_OK) {
        logf_(b, "admin uid %u: create refused: %s", (unsigned)c->uid, m.text);
        send_msg(b, c, c->fd, &m, NULL, 0);
        return;
    }
    bool fresh = ti < 0;
    if (fresh) {
        tenant_cfg_t tc;
        memset(&tc, 0, sizeof tc);
        snprintf(tc.name, sizeof tc.name, "%s", name);
        ti = tenant_add(b, &tc, false);
        if (ti < 0) {
            m.status = GM_NO_HOST_MEMORY;
            snprintf(m.text, sizeof m.text, "the broker is out of host memory");
            send_msg(b, c, c->fd, &m, NULL, 0);
            return;
        }
        tenant_t *t = &b->tenants[ti];
        t->runtime = true;
        t->job_uid = (uid_t)in->count;
        t->job_gid = (gid_t)in->min;
        t->job_id = in->first;
        if (carve) {
            /* Taken from the job's tenant now, given back at removal. */
            tenant_t *j = &b->tenants[ji];
            snprintf(t->carved_from, sizeof t->carved_from, "%s", j->cfg.name);
            t->carved = quota;
            t->carved_guaranteed = guaranteed;
            t->cfg.quota = quota;
            t->cfg.guaranteed = guaranteed;
            if (j->cfg.quota != UINT64_MAX) j->cfg.quota -= quota;
            j->cfg.guaranteed -= guaranteed;
            j->anchored = true; /* reaped once neither it nor its steps live */
        }
        char why[GM__BROKER_TEXT_MAX];
        if (door_open(b, t, why, sizeof why) != 0) {
            if (carve) { /* back to the job */
                tenant_t *j = &b->tenants[ji];
                if (j->cfg.quota != UINT64_MAX) j->cfg.quota += t->carved;
                j->cfg.guaranteed += t->carved_guaranteed;
            }
            t->gone = true;
            m.status = GM_IO;
            snprintf(m.text, sizeof m.text, "%s", why);
            logf_(b, "admin uid %u: create of tenant '%s' failed: %s", (unsigned)c->uid, name, why);
            send_msg(b, c, c->fd, &m, NULL, 0);
            return;
        }
    }
    tenant_t *t = &b->tenants[ti];
    if (!carve) {
        /* A job's grant again: what its steps hold of it stays theirs. */
        t->cfg.quota = quota == UINT64_MAX ? quota : quota > carved ? quota - carved : 0;
        t->cfg.guaranteed = guaranteed > carved_g ? guaranteed - carved_g : 0;
        if (t->cfg.guaranteed > t->cfg.quota) t->cfg.guaranteed = t->cfg.quota;
    }
    t->futile = false;
    if (in->pid) {
        bool have = false;
        for (size_t i = 0; i < t->n_anchors && !have; i++)
            have = t->anchors[i].pid == (pid_t)in->pid && t->anchors[i].start == anchor_start;
        if (!have) {
            /* Room for a new one: dead anchors make way. */
            size_t k = 0;
            for (size_t i = 0; i < t->n_anchors; i++)
                if (anchor_alive(t, i)) t->anchors[k++] = t->anchors[i];
            t->n_anchors = k;
            if (k == 16) memmove(t->anchors, t->anchors + 1, 15 * sizeof t->anchors[0]), k = 15;
            t->anchors[k].pid = (pid_t)in->pid;
            t->anchors[k].start = anchor_start;
            t->n_anchors = k + 1;
        }
        t->anchored = true;
        t->orphan_ns = 0;
    }
    char q[32];
    if (fresh && carve)
        logf_(b, "tenant '%s' made for a step of job %" PRIu64 " (uid %u): quota %s taken from "
              "tenant '%s' (%s left to it), door %s", name, t->job_id, (unsigned)t->job_uid,
              fmt(quota, q), t->carved_from, fmt(b->tenants[ji].cfg.quota, sh2), t->door);
    else if (fresh)
        logf_(b, "tenant '%s' made for job %" PRIu64 " (uid %u): quota %s, door %s", name,
              t->job_id, (unsigned)t->job_uid, fmt(quota, q), t->door);
    jobs_write(b);
    b->dirty = true;
    snprintf(m.tenant, sizeof m.tenant, "%s", t->cfg.name);
    snprintf(m.text, sizeof m.text, "%s", t->door);
    m.quota = t->cfg.quota;
    m.guaranteed = t->cfg.guaranteed;
    m.used = t->used * b->page;
    m.flags = carve ? GM__BROKER_FLAG_CARVE : 0; /* a broker that carves says so */
    send_msg(b, c, c->fd, &m, NULL, 0);
}

static bool over_limit(broker_t *b, client_t *c);

/* One message from c's control connection (or a new one). */
/* A control connection that holds nothing (no pages leased or adopted, no
 * lease waiting) and has said nothing for idle_timeout seconds takes a slot
 * for nothing: it is closed.  Closing costs its process nothing (there are no
 * pages to take back; its next lease reconnects), and a tenant cannot keep
 * its share of max_clients filled with idle connections. */
static bool idle_drop_due(const broker_t *b, const client_t *c, uint64_t now)
{
    return b->cfg.idle_s && !c->pending && c->pages == 0 && c->adopted == 0 &&
           now - c->last_ns >= (uint64_t)b->cfg.idle_s * 1000000000ull;
}

static void on_message(broker_t *b, client_t *c)
{
    gm__broker_msg_t m;
    size_t nfds;
    bool closed;
    c->last_ns = gm__now_ns();
    int rc = gm__wire_recv(c->fd, &m, sizeof m, NULL, 0, &nfds, &closed, 0, "broker");
    if (rc == GM_NOT_READY) { /* woken with nothing to read after all */
        gm__clear_error();
        return;
    }
    if (rc != GM_OK) {
        char why[300];
        if (closed) snprintf(why, sizeof why, "disconnected");
        else snprintf(why, sizeof why, "dropped: %.280s", gm_last_error());
        gm__clear_error();
        client_drop(b, c, c->state == C_NEW && closed ? NULL : why);
        return;
    }
    const char *bad = NULL;
    if (m.magic != GM__BROKER_MAGIC || m.version != GM__BROKER_VERSION)
        bad = "bad magic or version";
    else if (!memchr(m.tenant, 0, sizeof m.tenant) || !memchr(m.text, 0, sizeof m.text))
        bad = "unterminated text";
    else if (c->state == C_NEW) {
        if (c->over && !(m.type == GM__BROKER_HELLO && (m.flags & GM__BROKER_FLAG_EVENTS)) &&
            over_limit(b, c))
            return;
        if (m.type == GM__BROKER_HELLO) return on_hello(b, c, &m);
        if (m.type == GM__BROKER_ADMIN_CREATE || m.type == GM__BROKER_ADMIN_REMOVE)
            return on_admin(b, c, &m);
        if (m.type == GM__BROKER_STATS) {
            c->state = C_VIEWER;
            c->first_ns = gm__now_ns();
            return on_stats(b, c, &m);
        }
        bad = "the first message is not HELLO or STATS";
    } else if (c->state == C_VIEWER) {
        c->first_ns = gm__now_ns(); /* idle since */
        if (m.type == GM__BROKER_STATS) return on_stats(b, c, &m);
        if (m.type == GM__BROKER_ADMIN_CREATE || m.type == GM__BROKER_ADMIN_REMOVE)
            return on_admin(b, c, &m);
        bad = "a viewer sent more than STATS";
    } else if (c->pending && m.type == GM__BROKER_LEASE) {
        bad = "a lease while its lease waits";
    } else {
        switch (m.type) {
        case GM__BROKER_LEASE:
            if (m.min == 0 || m.min > m.count || m.count > GM__BROKER_IDS) {
                bad = "a lease of a wrong size";
                break;
            }
            set_cached(b, c, m.cached);
            c->want_min = m.min;
            c->want_max = m.count;
            c->pending = true;
            if (lease_try(b, c, false)) return;
            if (reclaim_ask(b, c) == 0) {
                lease_try(b, c, true);
                return;
            }
            c->deadline_ns = gm__now_ns() + (uint64_t)b->cfg.reclaim_ms * 1000000ull;
            return;
        case GM__BROKER_RETURN:
            if (!ids_ok(b, c, &m)) {
                bad = "it returned pages it does not hold";
                break;
            }
            for (uint64_t i = 0; i < m.count; i++) page_put(b, m.ids[i]);
            c->pages -= m.count;
            b->tenants[c->tenant].used -= m.count;
            b->tenants[c->tenant].futile = b->futile = false;
            b->leased -= m.count;
            set_cached(b, c, m.cached);
            b->dirty = true;
            serve_pending(b);
            return;
        case GM__BROKER_UNADOPT:
            if (m.count == 0 || m.count > c->adopted) {
                bad = "it let go of more adopted pages than it had";
                break;
            }
            c->adopted -= m.count;
            b->tenants[c->tenant].used -= m.count;
            b->tenants[c->tenant].futile = b->futile = false;
            b->leased -= m.count;
            b->dirty = true;
            serve_pending(b);
            return;
        case GM__BROKER_STATS: return on_stats(b, c, &m);
        default: bad = "an unknown message type"; break;
        }
    }
    char why[128];
    snprintf(why, sizeof why, "dropped: %s", bad);
    client_drop(b, c, why);
}

/* The tenant a connection of (pid, uid, gid) counts against before its
 * HELLO: the first configured rule that matches, else "uid:N". */
static void owner_of(const broker_t *b, pid_t pid, uid_t uid, gid_t gid,
                     char out[GM__BROKER_NAME_MAX])
{
    for (size_t i = 0; i < b->n_tenants; i++)
        if (b->tenants[i].configured && rule_matches(&b->tenants[i].cfg, pid, uid, gid)) {
            snprintf(out, GM__BROKER_NAME_MAX, "%s", b->tenants[i].cfg.name);
            return;
        }
    snprintf(out, GM__BROKER_NAME_MAX, "uid:%u", (unsigned)uid);
}

/* The most connections one tenant may hold: half of max_clients (at least
 * one), so a tenant that opens connections without end leaves the other
 * half to the others. */
static size_t tenant_conn_limit(const broker_t *b)
{
    return b->cfg.max_clients / 2 ? b->cfg.max_clients / 2 : 1;
}

/* The connections other than self: all of them (live), those counted
 * against owner (mine), and of process pid the control connections without
 * their events connection yet (halves) and the new ones (fresh). */
typedef struct conn_count {
    size_t live, mine, halves, fresh;
} conn_count_t;

static conn_count_t conn_count(const broker_t *b, const client_t *self, pid_t pid,
                               const char *owner)
{
    conn_count_t n = {0, 0, 0, 0};
    for (size_t i = 0; i < b->n_clients; i++) {
        const client_t *o = &b->clients[i];
        if (o->state == C_FREE || o == self) continue;
        n.live++;
        const char *name = o->state == C_CONTROL ? b->tenants[o->tenant].cfg.name : o->owner;
        n.mine += !strcmp(name, owner);
        if (o->pid == pid) {
            n.halves += o->state == C_CONTROL && o->efd < 0;
            n.fresh += o->state == C_NEW;
        }
    }
    return n;
}

/* Why one more connection of owner may not stay (n: the others), or NULL. */
static const char *conn_refusal(const broker_t *b, const conn_count_t *n, const char *owner,
                                char *buf, size_t cap)
{
    if (n->live >= b->cfg.max_clients) {
        snprintf(buf, cap, "broker full: max_clients %u connections are open",
                 b->cfg.max_clients);
        return buf;
    }
    if (n->mine >= tenant_conn_limit(b)) {
        snprintf(buf, cap, "turned away: tenant '%s' has %zu connections, the limit (half of "
                 "max_clients %u)", owner, n->mine, b->cfg.max_clients);
        return buf;
    }
    return NULL;
}

/* Send a refusal (why) on a connection turned away, then close it: the
 * process reads it as the answer to its first message (base/wire.c reads
 * a message a peer sent before closing even when the close reset the
 * connection). */
static void turn_away(broker_t *b, int fd, pid_t pid, uid_t uid, const char *why)
{
    gm__broker_msg_t m;
    reply_init(b, &m, NULL, GM_DENIED);
    snprintf(m.text, sizeof m.text, "%s", why);
    if (gm__wire_send(fd, &m, sizeof m, NULL, 0, MSG_DONTWAIT, "broker") != GM_OK)
        gm__clear_error();
    close(fd);
    logf_(b, "pid %d uid %u: %s", (int)pid, (unsigned)uid, why);
}

/* A connection let in past the limits as the events connection of its
 * process said something else first: turned away, unless there is room
 * now.  True when it was. */
static bool over_limit(broker_t *b, client_t *c)
{
    conn_count_t n = conn_count(b, c, c->pid, c->owner);
    char why[GM__BROKER_TEXT_MAX];
    if (!conn_refusal(b, &n, c->owner, why, sizeof why)) {
        c->over = false;
        return false;
    }
    turn_away(b, c->fd, c->pid, c->uid, why);
    c->fd = -1;
    client_drop(b, c, NULL);
    return true;
}

/* A connection on the broker's socket (door 0) or on the door of tenant
 * door - 1, where only a process of its job is let in: the job's uid (or
 * root) and an anchor among its ancestors. */
static void on_accept(broker_t *b, int lfd, uint32_t door)
{
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    pid_t pid;
    uid_t uid;
    gid_t gid;
    if (gm__wire_peer(fd, &pid, &uid, &gid) != GM_OK) {
        gm__clear_error();
        close(fd);
        return;
    }
    char owner[GM__BROKER_NAME_MAX], why[GM__BROKER_TEXT_MAX];
    if (door) {
        const tenant_t *t = &b->tenants[door - 1];
        if (uid != t->job_uid && uid != 0) {
            snprintf(why, sizeof why, "refused at the door of tenant '%s' (job %" PRIu64 "): "
                     "uid %u is not the job's uid %u", t->cfg.name, t->job_id, (unsigned)uid,
                     (unsigned)t->job_uid);
            turn_away(b, fd, pid, uid, why);
            return;
        }
        if (!ancestry_reaches(t, pid)) {
            snprintf(why, sizeof why, "refused at the door of tenant '%s' (job %" PRIu64 "): "
                     "pid %d is not a process of the job (no anchor among its ancestors)",
                     t->cfg.name, t->job_id, (int)pid);
            turn_away(b, fd, pid, uid, why);
            return;
        }
        snprintf(owner, sizeof owner, "%s", t->cfg.name);
    } else {
        owner_of(b, pid, uid, gid, owner);
    }
    /* Past the limits, the events connection of a process of the owner's
     * that is connecting (its control connection is in, without one) is
     * still let in, one per such connection, so that a process never gets
     * half a client; it is turned away if it turns out to be anything else
     * (over_limit). */
    conn_count_t n = conn_count(b, NULL, pid, owner);
    const char *refusal = conn_refusal(b, &n, owner, why, sizeof why);
    if (refusal && n.halves <= n.fresh) {
        turn_away(b, fd, pid, uid, refusal);
        return;
    }
    size_t slot = b->n_clients;
    for (size_t i = 0; i < b->n_clients && slot == b->n_clients; i++)
        if (b->clients[i].state == C_FREE) slot = i;
    if (slot == b->n_clients) {
        client_t *nc = realloc(b->clients, (b->n_clients + 1) * sizeof *nc);
        if (!nc) {
            close(fd);
            return;
        }
        b->clients = nc;
        b->n_clients++;
    }
    client_t *c = &b->clients[slot];
    memset(c, 0, sizeof *c);
    c->fd = fd;
    c->efd = -1;
    c->state = C_NEW;
    c->over = refusal != NULL;
    c->first_ns = gm__now_ns();
    c->pid = pid;
    c->uid = uid;
    c->gid = gid;
    c->start = gm__mon_start_time((int)pid);
    c->door = door;
    snprintf(c->owner, sizeof c->owner, "%s", owner);
}

/* ---- stats file --------------------------------------------------------------- */

/* The stats file (and the lease record, when pages came back since it was
 * last written): both through file_replace, so a root broker never writes
 * through a link planted in the file's directory. */
static void write_stats(broker_t *b)
{
    for (size_t i = 0; i < b->n_clients && !b->record_dirty; i++)
        b->record_dirty = b->clients[i].pages + b->clients[i].adopted < b->clients[i].recorded;
    if (b->record_dirty) record_write(b);
    if (!b->cfg.stats_file[0]) return;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) {
        logf_(b, "stats file %s: %s", b->cfg.stats_file, strerror(errno));
        return;
    }
    size_t clients = 0;
    for (size_t i = 0; i < b->n_clients; i++) clients += b->clients[i].state == C_CONTROL;
    fprintf(f, "{\"pid\": %d, \"generation\": \"%016" PRIx64 "\", \"page_size\": %zu, "
            "\"capacity\": %" PRIu64 ", \"leased\": %" PRIu64 ", \"made\": %" PRIu64
            ", \"free\": %" PRIu64 ", \"scrubbed\": %" PRIu64 ", \"clients\": %zu, "
            "\"uptime_s\": %.1f, \"tenants\": [",
            (int)getpid(), b->generation, b->page, b->cap_pages * b->page, b->leased * b->page,
            b->n_made * b->page, b->n_free * b->page, b->scrubbed * b->page, clients,
            (double)(gm__now_ns() - b->started_ns) / 1e9);
    for (size_t i = 0, shown_rows = 0; i < b->n_tenants; i++) {
        const tenant_t *t = &b->tenants[i];
        if (t->gone) continue;
        fprintf(f, "%s\n  {\"name\": \"%s\", \"quota\": %" PRIu64 ", \"guaranteed\": %" PRIu64
                ", \"used\": %" PRIu64 ", \"peak\": %" PRIu64 ", \"cached\": %" PRIu64
                ", \"refusals\": %" PRIu64 ", \"reclaims\": %" PRIu64 ", \"clients\": %" PRIu64 "}",
                shown_rows++ ? "," : "", t->cfg.name, t->cfg.quota == UINT64_MAX ? 0 : t->cfg.quota,
                t->cfg.guaranteed, t->used * b->page, t->peak * b->page, t->cached * b->page,
                t->refusals, t->reclaims, t->clients);
    }
    fprintf(f, "]}\n");
    if (fclose(f) != 0) {
        logf_(b, "stats file %s: out of host memory", b->cfg.stats_file);
        free(text);
        return;
    }
    char why[512];
    if (file_replace(b->cfg.stats_file, text, len, 0644, why, sizeof why) == 0)
        b->stats_why[0] = '\0';
    else
        say_not_written(b, b->stats_why, sizeof b->stats_why, "stats file", b->cfg.stats_file, why);
    free(text);
}

/* ---- configuration in force --------------------------------------------------- */

/* The tenants' guaranteed memory fits the capacity: GM_OK or
 * GM_INVALID_ARGUMENT with the figures. */
static int guarantees_fit(const bcfg_t *cfg, uint64_t capacity)
{
    uint64_t guaranteed = 0;
    for (size_t i = 0; i < cfg->n_tenants; i++) guaranteed += cfg->tenants[i].guaranteed;
    if (guaranteed <= capacity) return GM_OK;
    char a[32], c[32];
    return gm__set_error(GM_INVALID_ARGUMENT, "the tenants' guaranteed memory (%s) exceeds the "
                         "capacity (%s)", fmt(guaranteed, a), fmt(capacity, c));
}

/* Apply cfg's tenants (at start and at SIGHUP): books of a tenant kept by
 * name; every client's tenant decided again. */
static int apply_tenants(broker_t *b, bcfg_t *cfg)
{
    if (guarantees_fit(cfg, b->cap_pages * b->page) != GM_OK) {
        logf_(b, "%s", gm_last_error());
        return -1;
    }
    for (size_t i = 0; i < b->n_tenants; i++) b->tenants[i].configured = b->tenants[i].futile = false;
    b->futile = false;
    for (size_t i = 0; i < cfg->n_tenants; i++) {
        ssize_t t = tenant_find(b, cfg->tenants[i].name);
        if (t < 0) t = tenant_add(b, &cfg->tenants[i], true);
        if (t < 0) return -1;
        b->tenants[t].cfg = cfg->tenants[i];
        b->tenants[t].configured = true;
    }
    for (size_t i = 0; i < b->n_tenants; i++)
        if (!b->tenants[i].configured && !b->tenants[i].runtime && !b->tenants[i].gone) {
            b->tenants[i].cfg.quota = cfg->default_quota;
            b->tenants[i].cfg.guaranteed = 0;
        }
    for (size_t i = 0; i < b->n_clients; i++) {
        client_t *c = &b->clients[i];
        if (c->state != C_CONTROL || c->door) continue; /* a door's client stays its tenant's */
        ssize_t t = tenant_of(b, cfg, c->pid, c->uid, c->gid);
        if (t < 0 || (size_t)t == c->tenant) continue;
        tenant_t *from = &b->tenants[c->tenant], *to = &b->tenants[t];
        from->used -= c->pages + c->adopted;
        from->clients--;
        to->used += c->pages + c->adopted;
        to->clients++;
        if (to->used > to->peak) to->peak = to->used;
        c->tenant = (size_t)t;
    }
    return 0;
}

static void reload(broker_t *b)
{
    if (!b->config_path[0]) {
        logf_(b, "SIGHUP: no config file to reload");
        return;
    }
    bcfg_t n;
    cfg_defaults(&n);
    char err[512];
    if (cfg_load(b->config_path, &n, err, sizeof err) != 0) {
        logf_(b, "SIGHUP: %s; the config in force stays", err);
        cfg_free(&n);
        return;
    }
    if (strcmp(n.socket, b->cfg.socket) || n.device != b->cfg.device ||
        n.backend != b->cfg.backend || n.capacity != b->cfg.capacity)
        logf_(b, "SIGHUP: socket, backend, device and capacity change only at a restart");
    /* What a reload may change. */
    bcfg_t keep = b->cfg;
    keep.default_quota = n.default_quota;
    keep.keep_free = n.keep_free;
    keep.scrub = n.scrub;
    keep.reclaim_ms = n.reclaim_ms;
    keep.idle_s = n.idle_s;
    keep.max_clients = n.max_clients;
    memcpy(keep.stats_file, n.stats_file, sizeof keep.stats_file);
    keep.tenants = n.tenants;
    keep.n_tenants = n.n_tenants;
    if (apply_tenants(b, &keep) != 0) {
        logf_(b, "SIGHUP: the config in force stays");
        cfg_free(&n);
        return;
    }
    free(b->cfg.tenants);
    b->cfg = keep;
    b->dirty = true;
    logf_(b, "SIGHUP: %s reloaded, %zu tenants", b->config_path, n.n_tenants);
}

/* ---- the daemon ---------------------------------------------------------------- */

void gm_cli_broker_usage(FILE *out)
{
    fprintf(out,
            "usage: gpumem broker [--config FILE] [--socket PATH] [--backend auto|sim|cuda]\n"
            "                     [--device N] [--capacity BYTES] [--default-quota BYTES]\n"
            "                     [--stats-file PATH] [--check]\n\n"
            "Own a GPU's memory and lease it to processes that use gpumem, within each\n"
            "tenant's quota.  A process uses the broker when GPUMEM_BROKER names its socket.\n"
            "Runs in the foreground and logs on stderr; SIGHUP reloads the config file,\n"
            "SIGTERM stops it (processes keep the memory they map).  Options override the\n"
            "config file; --check reads the config, prints what it says and exits.\n"
            "docs/broker.md describes the file:\n\n"
            "  socket = /run/gpumem/broker.sock   capacity = 70GiB   default_quota = 8GiB\n"
            "  [tenant training]\n"
            "  users = alice, 1001    groups = ml    cgroup = /system.slice/train.service\n"
            "  quota = 40GiB          guaranteed = 10GiB\n\n"
            "Tenants made at run time by a scheduler (gpumem broker-admin, the Slurm plugin;\n"
            "docs/slurm.md):  admins = slurm   job_dir = /run/gpumem/jobs   job_grace = 10\n");
}

static int setup(broker_t *b)
{
    char why[256];
    GM_CHECK(gm__backend_select(b->cfg.backend, b->cfg.device, &b->ops, &b->cfg.backend, why,
                                sizeof why));
    gm__backend_config_t bc = {.device = b->cfg.device,
                               .sim_capacity = b->cfg.capacity ? b->cfg.capacity : 0};
    if (b->ops == NULL) return gm__set_error(GM_NO_DEVICE, "no backend");
    GM_CHECK(b->ops->open(&bc, &b->bk));
    GM_CHECK(b->ops->info(b->bk, &b->info));
    /* The sim makes each page a new memfd, which the kernel fills with
     * zeros: zeroing it again before its first lease only costs the loop
     * (and touches all its memory).  CUDA promises nothing of the kind. */
    b->fresh_zero = b->cfg.backend == GM_BACKEND_SIM;
    b->page = b->info.granularity;
    uint64_t cap = b->cfg.capacity ? b->cfg.capacity : b->info.free_memory;
    if (cap > b->info.total_memory) cap = b->info.total_memory;
    b->cap_pages = cap / b->page;
    if (b->cap_pages == 0)
        return gm__set_error(GM_INVALID_ARGUMENT, "capacity %" PRIu64 " is less than a page", cap);
    /* One descriptor per page made (two on the sim): raise the soft limit. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    {
        int rc;
        GM_BK(rc, b, va_reserve, (b->bk, (size_t)GM__BROKER_IDS * b->page, b->page, &b->win));
        if (rc != GM_OK) return rc;
    }
    record_load(b); /* before any process can claim what it kept */
    GM_CHECK(gm__wire_claim_path("gpumem broker", b->cfg.socket));
    b->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (b->lfd < 0) return gm__set_error(GM_IO, "socket: %s", strerror(errno));
    /* Bound and listening under a name of its own first, then renamed into
     * place: a client that sees the socket file can connect at once (a
     * file bound but not yet listening refuses connections).  Where that
     * name would not fit, or is taken, the socket's own path as before. */
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    char tmp[sizeof a.sun_path];
    int n = snprintf(tmp, sizeof tmp, "%s.%d.new", b->cfg.socket, (int)getpid());
    bool via_tmp = n > 0 && (size_t)n < sizeof tmp;
    snprintf(a.sun_path, sizeof a.sun_path, "%s", via_tmp ? tmp : b->cfg.socket);
    mode_t old = umask(0777 & ~b->cfg.socket_mode);
    int r = bind(b->lfd, (struct sockaddr *)&a, sizeof a);
    if (r != 0 && via_tmp) {
        via_tmp = false;
        snprintf(a.sun_path, sizeof a.sun_path, "%s", b->cfg.socket);
        r = bind(b->lfd, (struct sockaddr *)&a, sizeof a);
    }
    umask(old);
    if (r != 0) return gm__set_error(GM_IO, "bind %s: %s", b->cfg.socket, strerror(errno));
    /* Never through a link put where the socket was just bound (a root
     * broker would change the link's target). */
    fchmodat(AT_FDCWD, a.sun_path, b->cfg.socket_mode, AT_SYMLINK_NOFOLLOW);
    if (listen(b->lfd, 128) != 0) {
        int e = errno;
        if (via_tmp) unlink(tmp);
        return gm__set_error(GM_IO, "listen: %s", strerror(e));
    }
    if (via_tmp && rename(tmp, b->cfg.socket) != 0) {
        int e = errno;
        unlink(tmp);
        return gm__set_error(GM_IO, "rename %s to %s: %s", tmp, b->cfg.socket, strerror(e));
    }
    if (getentropy(&b->generation, sizeof b->generation) != 0) b->generation = gm__now_ns();
    return GM_OK;
}

static void teardown(broker_t *b)
{
    for (size_t i = 0; i < b->n_clients; i++)
        if (b->clients[i].state != C_FREE) client_drop(b, &b->clients[i], NULL);
    for (size_t i = 0; i < b->n_pages; i++) {
        if (b->pages[i].fd < 0) continue;
        close(b->pages[i].fd);
        int rc;
        GM_BK(rc, b, phys_release, (b->bk, b->pages[i].h));
        (void)rc;
    }
    for (size_t i = 0; i < b->n_tenants; i++)
        if (b->tenants[i].runtime && !b->tenants[i].gone && b->tenants[i].door_fd >= 0) {
            /* The socket file stays: the next run binds it again. */
            close(b->tenants[i].door_fd);
            b->tenants[i].door_fd = -1;
        }
    if (b->lfd >= 0) {
        close(b->lfd);
        unlink(b->cfg.socket);
    }
    if (b->win) {
        int rc;
        GM_BK(rc, b, va_free, (b->bk, b->win, (size_t)GM__BROKER_IDS * b->page));
        (void)rc;
    }
    if (b->bk) b->ops->close(b->bk);
    free(b->pages);
    free(b->clients);
    free(b->tenants);
    free(b->kept);
    cfg_free(&b->cfg);
}

static const char *opt(int argc, char **argv, int *i, const char *name, int *bad)
{
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n) != 0) return NULL;
    if (argv[*i][n] == '=') return argv[*i] + n + 1;
    if (argv[*i][n] != '\0') return NULL;
    if (*i + 1 >= argc) {
        fprintf(stderr, "gpumem broker: %s needs a value\n", name);
        *bad = 1;
        return NULL;
    }
    return argv[++*i];
}

int gm_cli_broker(int argc, char **argv)
{
    broker_t b;
    memset(&b, 0, sizeof b);
    b.lfd = -1;
    cfg_defaults(&b.cfg);
    const char *config = NULL, *sock = NULL, *backend = NULL, *device = NULL, *capacity = NULL,
               *dquota = NULL, *stats = NULL;
    bool check = false;
    for (int i = 1; i < argc; i++) {
        int bad = 0;
        const char *v;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            gm_cli_broker_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--check")) check = true;
        else if ((v = opt(argc, argv, &i, "--config", &bad))) config = v;
        else if ((v = opt(argc, argv, &i, "--socket", &bad))) sock = v;
        else if ((v = opt(argc, argv, &i, "--backend", &bad))) backend = v;
        else if ((v = opt(argc, argv, &i, "--device", &bad))) device = v;
        else if ((v = opt(argc, argv, &i, "--capacity", &bad))) capacity = v;
        else if ((v = opt(argc, argv, &i, "--default-quota", &bad))) dquota = v;
        else if ((v = opt(argc, argv, &i, "--stats-file", &bad))) stats = v;
        else {
            if (!bad) fprintf(stderr, "gpumem broker: unknown option '%s'\n", argv[i]);
            gm_cli_broker_usage(stderr);
            return 2;
        }
    }
    char err[512];
    if (config) {
        if (!realpath(config, b.config_path)) {
            fprintf(stderr, "gpumem broker: %s: %s\n", config, strerror(errno));
            return 2;
        }
        if (cfg_load(b.config_path, &b.cfg, err, sizeof err) != 0) {
            fprintf(stderr, "gpumem broker: %s\n", err);
            cfg_free(&b.cfg);
            return 2;
        }
    }
    /* Each bad value named with its option and what the option accepts. */
    unsigned long u = 0;
    const char *bad_opt = NULL, *bad_val = NULL, *want = NULL;
    if (sock && (gm__wire_check_path("--socket", sock) != GM_OK || sock[0] != '/'))
        bad_opt = "--socket", bad_val = sock, want = "an absolute path of at most 107 bytes";
    else if (backend && gm__parse_backend(backend, &b.cfg.backend) != GM_OK)
        bad_opt = "--backend", bad_val = backend, want = accepted("backend");
    else if (device && parse_uint(device, 10, 1024, &u) != 0)
        bad_opt = "--device", bad_val = device, want = accepted("device");
    else if (capacity && (parse_bytes(capacity, &b.cfg.capacity) || b.cfg.capacity == UINT64_MAX))
        bad_opt = "--capacity", bad_val = capacity, want = accepted("capacity");
    else if (dquota && parse_bytes(dquota, &b.cfg.default_quota))
        bad_opt = "--default-quota", bad_val = dquota, want = accepted("default_quota");
    else if (stats && strlen(stats) >= sizeof b.cfg.stats_file)
        bad_opt = "--stats-file", bad_val = stats, want = "a path shorter than PATH_MAX";
    gm__clear_error();
    if (bad_opt) {
        char sh[80];
        fprintf(stderr, "gpumem broker: %s '%s' is not valid: give %s\n", bad_opt,
                shown(bad_val, sh, sizeof sh), want);
        cfg_free(&b.cfg);
        return 2;
    }
    if (sock) snprintf(b.cfg.socket, sizeof b.cfg.socket, "%s", sock);
    if (device) b.cfg.device = (int)u;
    if (stats) snprintf(b.cfg.stats_file, sizeof b.cfg.stats_file, "%s", stats);
    if (!b.cfg.socket[0]) {
        fprintf(stderr, "gpumem broker: no socket: give --socket PATH or socket = in the config\n");
        cfg_free(&b.cfg);
        return 2;
    }

    if (check) {
        char a[32], q[32], k[32];
        if (b.cfg.capacity && guarantees_fit(&b.cfg, b.cfg.capacity) != GM_OK) {
            fprintf(stderr, "gpumem broker: %s: %s\n", b.config_path[0] ? b.config_path : "options",
                    gm_last_error());
            cfg_free(&b.cfg);
            return 2;
        }
        static const char *const scrubs[] = {"tenant", "always", "never"};
        printf("socket %s, backend %s, device %d, capacity %s, default_quota %s, keep_free %s, "
               "scrub %s, reclaim_ms %u, idle_timeout %u s, max_clients %u, socket_mode %04o\n",
               b.cfg.socket,
               gm__backend_kind_name(b.cfg.backend), b.cfg.device,
               b.cfg.capacity ? fmt(b.cfg.capacity, a) : "the device's free memory",
               fmt(b.cfg.default_quota, q), fmt(b.cfg.keep_free, k), scrubs[b.cfg.scrub],
               b.cfg.reclaim_ms, b.cfg.idle_s, b.cfg.max_clients, b.cfg.socket_mode);
        if (b.cfg.job_dir[0] || b.cfg.n_admins)
            printf("run-time tenants: job_dir %s, job_grace %u s, %zu admins besides root and "
                   "uid %u\n", b.cfg.job_dir[0] ? b.cfg.job_dir : "none (no doors can be made)",
                   b.cfg.job_grace_s, b.cfg.n_admins, (unsigned)geteuid());
        for (size_t i = 0; i < b.cfg.n_tenants; i++) {
            const tenant_cfg_t *t = &b.cfg.tenants[i];
            printf("tenant %s: %zu users, %zu groups, cgroup %s, quota %s, guaranteed %s\n",
                   t->name, t->n_uids, t->n_gids, t->cgroup[0] ? t->cgroup : "any",
                   fmt(t->quota, a), fmt(t->guaranteed, q));
        }
        cfg_free(&b.cfg);
        return 0;
    }
    if (pipe2(g_sigpipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        fprintf(stderr, "gpumem broker: pipe: %s\n", strerror(errno));
        return 1;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGHUP, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    g_stop = g_reload = 0;
    b.started_ns = gm__now_ns();
    if (setup(&b) != GM_OK || apply_tenants(&b, &b.cfg) != 0) {
        fprintf(stderr, "gpumem broker: cannot start: %s\n", gm_last_error());
        teardown(&b);
        return 1;
    }
    jobs_load(&b); /* the tenants of running jobs, made by an admin before a restart */
    char c1[32], c2[32];
    logf_(&b, "pid %d serving %s: %s device %d (%s), capacity %s in pages of %s, %zu tenants%s",
          (int)getpid(), b.cfg.socket, b.ops->name, b.cfg.device, b.info.name,
          fmt(b.cap_pages * b.page, c1), fmt(b.page, c2), b.cfg.n_tenants,
          b.cfg.default_quota == 0 ? "; other processes are refused" : "");
    write_stats(&b);

    struct pollfd *pfd = NULL;
    size_t *who = NULL;
    int status = 0;
    while (!g_stop) {
        if (g_reload) {
            g_reload = 0;
            reload(&b);
        }
        size_t cap = 2 + 2 * b.n_clients + b.n_tenants;
        struct pollfd *np = realloc(pfd, cap * sizeof *np);
        size_t *nw = realloc(who, cap * sizeof *nw);
        if (np) pfd = np;
        if (nw) who = nw;
        if (!np || !nw) {
            logf_(&b, "out of host memory");
            status = 1;
            break;
        }
        size_t n = 0;
        pfd[n++] = (struct pollfd){.fd = g_sigpipe[0], .events = POLLIN};
        pfd[n++] = (struct pollfd){.fd = b.lfd, .events = POLLIN};
        /* The doors of tenants made at run time: who[] holds the tenant. */
        size_t doors = n;
        for (size_t i = 0; i < b.n_tenants; i++)
            if (!b.tenants[i].gone && b.tenants[i].door_fd >= 0) {
                who[n] = i;
                pfd[n++] = (struct pollfd){.fd = b.tenants[i].door_fd, .events = POLLIN};
            }
        size_t clients_at = n;
        uint64_t now = gm__now_ns(), next = now + 1000000000ull;
        for (size_t i = 0; i < b.n_clients; i++) {
            client_t *c = &b.clients[i];
            if (c->state == C_FREE) continue;
            if (c->pending && c->deadline_ns < next) next = c->deadline_ns;
            if ((c->state == C_NEW || c->state == C_VIEWER) && c->first_ns + 10000000000ull < next)
                next = c->first_ns + 10000000000ull;
            who[n] = i * 2;
            pfd[n++] = (struct pollfd){.fd = c->fd, .events = POLLIN};
            if (c->efd >= 0) {
                who[n] = i * 2 + 1;
                pfd[n++] = (struct pollfd){.fd = c->efd, .events = POLLIN};
            }
        }
        int ms = next > now ? (int)((next - now) / 1000000ull) + 1 : 0;
        /* Free pages to zero while idle: look for requests without waiting,
         * and zero a turn's worth when there are none. */
        bool idle_zero = b.cfg.scrub == SCRUB_ALWAYS && b.n_dirty > 0 &&
                         now >= b.idle_zero_after_ns;
        if (idle_zero) ms = 0;
        int r = poll(pfd, n, ms);
        if (r < 0 && errno != EINTR) {
            logf_(&b, "poll: %s", strerror(errno));
            status = 1;
            break;
        }
        if (r > 0) {
            if (pfd[0].revents) {
                char buf[64];
                while (read(g_sigpipe[0], buf, sizeof buf) > 0) {}
            }
            for (size_t k = clients_at; k < n; k++) {
                if (!pfd[k].revents) continue;
                client_t *c = &b.clients[who[k] / 2];
                if (c->state == C_FREE) continue;
                if (who[k] % 2 == 0) {
                    if (pfd[k].fd == c->fd) on_message(&b, c);
                } else if (pfd[k].fd == c->efd) {
                    /* The events connection only listens: anything or a
                     * close there ends the client. */
                    char byte;
                    ssize_t got = recv(c->efd, &byte, 1, MSG_DONTWAIT | MSG_PEEK);
                    client_drop(&b, c, got > 0 ? "dropped: it spoke on its events connection"
                                               : "disconnected");
                }
            }
            if (pfd[1].revents) on_accept(&b, b.lfd, 0);
            for (size_t k = doors; k < clients_at; k++) {
                tenant_t *t = &b.tenants[who[k]];
                if (pfd[k].revents && !t->gone && t->door_fd == pfd[k].fd)
                    on_accept(&b, t->door_fd, (uint32_t)who[k] + 1);
            }
        } else if (r == 0 && idle_zero) {
            zero_idle(&b);
        }
        now = gm__now_ns();
        for (size_t i = 0; i < b.n_clients; i++) {
            client_t *c = &b.clients[i];
            if (c->state == C_CONTROL && c->pending && c->deadline_ns <= now) lease_try(&b, c, true);
            else if (c->state == C_CONTROL && idle_drop_due(&b, c, now))
                client_drop(&b, c, "idle after HELLO, holding no pages: closed (it reconnects "
                                   "at its next lease)");
            else if (c->state == C_NEW && c->first_ns + 10000000000ull <= now)
                client_drop(&b, c, "said nothing for 10 s");
            else if (c->state == C_VIEWER && c->first_ns + 10000000000ull <= now)
                client_drop(&b, c, NULL); /* an idle viewer */
        }
        if (now - b.last_reap_ns > 1000000000ull) {
            jobs_reap(&b, now);
            b.last_reap_ns = now;
        }
        if (b.dirty && now - b.last_stats_ns > 1000000000ull) {
            write_stats(&b);
            b.last_stats_ns = now;
            b.dirty = false;
        }
    }
    write_stats(&b);
    logf_(&b, "stopping: %" PRIu64 " pages leased to running processes stay theirs",
          b.leased);
    free(pfd);
    free(who);
    teardown(&b);
    close(g_sigpipe[0]);
    close(g_sigpipe[1]);
    g_sigpipe[0] = g_sigpipe[1] = -1;
    return status;
}

/* ---- the viewer's side ---------------------------------------------------------- */

int gm_broker_query(const char *path, gm_broker_view_t *out)
{
    memset(out, 0, sizeof *out);
    int fd;
    GM_CHECK(gm__wire_connect("gpumem broker query", path, 5, &fd));
    /* Who answers is checked before a byte is sent or believed. */
    int rc = gm__broker_check_server(fd, path);
    for (uint64_t first = 0; rc == GM_OK; first++) {
        gm__broker_msg_t m;
        memset(&m, 0, sizeof m);
        m.magic = GM__BROKER_MAGIC;
        m.version = GM__BROKER_VERSION;
        m.type = GM__BROKER_STATS;
        m.first = first;
        size_t nfds;
        bool closed;
        rc = gm__wire_send(fd, &m, sizeof m, NULL, 0, 0, "broker");
        /* A broker that turned this connection away sent its reason first. */
        int sent = rc;
        if (rc == GM_OK || first == 0)
            rc = gm__wire_recv(fd, &m, sizeof m, NULL, 0, &nfds, &closed, 5, "broker");
        if (rc != GM_OK) break;
        if (m.magic == GM__BROKER_MAGIC && m.type == GM__BROKER_REPLY && m.status != GM_OK &&
            memchr(m.text, 0, sizeof m.text)) {
            rc = gm__set_error(m.status > 0 && m.status < GM_ERRNO_COUNT ? m.status : GM_IO,
                               "the broker on %s refused this query: %s", path, m.text);
            break;
        }
        if (sent != GM_OK) {
            rc = gm__set_error(GM_IO, "the broker on %s: a query could not be sent", path);
            break;
        }
        if (m.magic != GM__BROKER_MAGIC || m.type != GM__BROKER_REPLY || m.status != GM_OK ||
            !memchr(m.tenant, 0, sizeof m.tenant) || m.count > 65536) {
            rc = gm__set_error(GM_PARSE, "the broker on %s answered nonsense", path);
            break;
        }
        out->capacity = m.capacity;
        out->device_used = m.device_used;
        out->pid = m.pid;
        if (first >= m.count) break;
        gm_broker_tenant_t *nt = realloc(out->tenants, (out->n + 1) * sizeof *nt);
        if (!nt) {
            rc = gm__set_error(GM_NO_HOST_MEMORY, "out of host memory");
            break;
        }
        out->tenants = nt;
        gm_broker_tenant_t *t = &out->tenants[out->n++];
        snprintf(t->name, sizeof t->name, "%s", m.tenant);
        t->quota = m.quota;
        t->guaranteed = m.guaranteed;
        t->used = m.used;
        t->peak = m.peak;
        t->cached = m.cached_bytes;
        t->refusals = m.refusals;
        t->clients = m.clients;
        t->reclaims = m.reclaims;
    }
    close(fd);
    if (rc != GM_OK) {
        free(out->tenants);
        memset(out, 0, sizeof *out);
    }
    return rc;
}

/* ---- printing what a broker sent ------------------------------------------------ *
 *
 * A broker of another version, or a program bound to the socket, may send
 * any bytes as a tenant name.  The printers never write them raw: a name is
 * printed in its shown form (printable ASCII kept, a backslash and any other
 * byte as \xHH: one-to-one, so two names never print the same) on a terminal
 * and in a Prometheus label (where \ and " are escaped again, as the text
 * format asks); a JSON string escapes quotes, backslashes and every byte
 * outside printable ASCII as \u00HH. */

static void name_shown(const char *s, char *buf, size_t cap)
{
    size_t o = 0;
    for (; *s && o + 5 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch >= 0x20 && ch < 0x7f && ch != '\\') buf[o++] = (char)ch;
        else o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", ch);
    }
    buf[o] = '\0';
}

static void json_name(FILE *out, const char *s)
{
    fputc('"', out);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(out, "\\%c", ch);
        else if (ch >= 0x20 && ch < 0x7f) fputc(ch, out);
        else fprintf(out, "\\u%04x", ch);
    }
    fputc('"', out);
}

static void label_value(FILE *out, const char *shown_name)
{
    for (const char *s = shown_name; *s; s++) {
        if (*s == '\\' || *s == '"') fputc('\\', out);
        fputc(*s, out);
    }
}

/* The labels of a Slurm job's tenant (docs/slurm.md): `job_7` gives
 * ,job="7"; a step's `job_7.3` ,job="7",step="3" (digits only, nothing to
 * escape); any other name nothing. */
static void job_labels(FILE *out, const char *name)
{
    if (strncmp(name, "job_", 4) != 0) return;
    const char *j = name + 4, *e = j;
    while (*e >= '0' && *e <= '9') e++;
    const char *st = *e == '.' ? e + 1 : e, *se = st;
    while (*se >= '0' && *se <= '9') se++;
    if (e == j || e - j > 20 || *se || (*e == '.' && (se == st || se - st > 20))) return;
    fprintf(out, ",job=\"%.*s\"", (int)(e - j), j);
    if (*e == '.') fprintf(out, ",step=\"%.*s\"", (int)(se - st), st);
}

const char *gm_broker_safe_text(const char *s, char *buf, size_t cap)
{
    if (cap < 8) return cap ? (buf[0] = '\0', buf) : buf;
    return shown(s, buf, cap);
}

static const char *q_or_none(uint64_t q, char *buf)
{
    return q == UINT64_MAX ? "none" : gm__fmt_bytes(q, buf, 32);
}

void gm_broker_print_table(FILE *out, const char *path, const gm_broker_view_t *v)
{
    char a[32], b[32], c[32], d[32], e[32];
    fprintf(out, "broker %s (pid %lld): %s of %s leased\n", path, (long long)v->pid,
            gm__fmt_bytes(v->device_used, a, sizeof a), gm__fmt_bytes(v->capacity, b, sizeof b));
    fprintf(out, "%-24s %7s %11s %11s %11s %11s %11s %8s %8s\n", "TENANT", "PROCS", "USED", "QUOTA",
            "GUARANTEED", "PEAK", "CACHED", "REFUSED", "RECLAIMS");
    for (size_t i = 0; i < v->n; i++) {
        const gm_broker_tenant_t *t = &v->tenants[i];
        char name[4 * sizeof t->name + 1];
        name_shown(t->name, name, sizeof name);
        fprintf(out, "%-24s %7llu %11s %11s %11s %11s %11s %8llu %8llu\n", name,
                (unsigned long long)t->clients, gm__fmt_bytes(t->used, a, sizeof a),
                q_or_none(t->quota, b), gm__fmt_bytes(t->guaranteed, c, sizeof c),
                gm__fmt_bytes(t->peak, d, sizeof d), gm__fmt_bytes(t->cached, e, sizeof e),
                (unsigned long long)t->refusals, (unsigned long long)t->reclaims);
    }
}

void gm_broker_print_json(FILE *out, const gm_broker_view_t *v)
{
    fprintf(out, "{\"pid\": %lld, \"capacity\": %llu, \"leased\": %llu, \"tenants\": [",
            (long long)v->pid, (unsigned long long)v->capacity,
            (unsigned long long)v->device_used);
    for (size_t i = 0; i < v->n; i++) {
        const gm_broker_tenant_t *t = &v->tenants[i];
        fprintf(out, "%s{\"name\": ", i ? ", " : "");
        json_name(out, t->name);
        /* No quota: null (it used to print "null0"). */
        char quota[24];
        if (t->quota == UINT64_MAX) snprintf(quota, sizeof quota, "null");
        else snprintf(quota, sizeof quota, "%llu", (unsigned long long)t->quota);
        fprintf(out, ", \"clients\": %llu, \"used\": %llu, \"quota\": %s, "
                "\"guaranteed\": %llu, \"peak\": %llu, \"cached\": %llu, \"refusals\": %llu, "
                "\"reclaims\": %llu}", (unsigned long long)t->clients,
                (unsigned long long)t->used, quota, (unsigned long long)t->guaranteed,
                (unsigned long long)t->peak, (unsigned long long)t->cached,
                (unsigned long long)t->refusals, (unsigned long long)t->reclaims);
    }
    fprintf(out, "]}");
}

void gm_broker_print_metrics(FILE *out, const gm_broker_view_t *v)
{
    fprintf(out, "# HELP gpumem_broker_capacity_bytes Device memory the broker may lease.\n"
                 "# TYPE gpumem_broker_capacity_bytes gauge\ngpumem_broker_capacity_bytes %llu\n"
                 "# HELP gpumem_broker_leased_bytes Device memory leased to processes.\n"
                 "# TYPE gpumem_broker_leased_bytes gauge\ngpumem_broker_leased_bytes %llu\n",
            (unsigned long long)v->capacity, (unsigned long long)v->device_used);
    static const struct {
        const char *name, *type, *help;
        size_t off;
    } rows[] = {
        {"gpumem_broker_tenant_used_bytes", "gauge", "Device memory a tenant holds.",
         offsetof(gm_broker_tenant_t, used)},
        {"gpumem_broker_tenant_quota_bytes", "gauge", "A tenant's quota (absent: none).",
         offsetof(gm_broker_tenant_t, quota)},
        {"gpumem_broker_tenant_guaranteed_bytes", "gauge", "A tenant's guaranteed minimum.",
         offsetof(gm_broker_tenant_t, guaranteed)},
        {"gpumem_broker_tenant_peak_bytes", "gauge", "The most a tenant held.",
         offsetof(gm_broker_tenant_t, peak)},
        {"gpumem_broker_tenant_cached_bytes", "gauge", "Leased memory a tenant's processes keep unused.",
         offsetof(gm_broker_tenant_t, cached)},
        {"gpumem_broker_tenant_processes", "gauge", "A tenant's connected processes.",
         offsetof(gm_broker_tenant_t, clients)},
        {"gpumem_broker_tenant_refusals_total", "counter", "Leases refused to a tenant.",
         offsetof(gm_broker_tenant_t, refusals)},
        {"gpumem_broker_tenant_reclaims_total", "counter",
         "Requests to a tenant's processes to give unused memory back.",
         offsetof(gm_broker_tenant_t, reclaims)},
    };
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        fprintf(out, "# HELP %s %s\n# TYPE %s %s\n", rows[r].name, rows[r].help, rows[r].name,
                rows[r].type);
        for (size_t i = 0; i < v->n; i++) {
            uint64_t x;
            memcpy(&x, (const char *)&v->tenants[i] + rows[r].off, sizeof x);
            if (x == UINT64_MAX) continue;
            char name[4 * sizeof v->tenants[i].name + 1];
            name_shown(v->tenants[i].name, name, sizeof name);
            fprintf(out, "%s{tenant=\"", rows[r].name);
            label_value(out, name);
            fputc('"', out);
            job_labels(out, v->tenants[i].name);
            fprintf(out, "} %llu\n", (unsigned long long)x);
        }
    }
}
