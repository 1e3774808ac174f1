/* SPDX-License-Identifier: Apache-2.0 */
/*
 * options.c — the one table of GPUMEM_* environment variables, their
 * parsers, gm_config_from_env, and the cached values of the process rows.
 *
 * The one idea: a variable is a row (name, type, default, doc), and the
 * row's type is its parser.  Adding one is a row here and a getter call where
 * it is used; `gpumem info --options` and the error message of a bad value
 * come from the same row, so the documentation cannot drift from the code.
 * This is the only file of the library that calls getenv.
 *
 * Locking: gm_config_from_env reads the environment at each call and keeps
 * no state (but the once-only arming of GPUMEM_MALLOC_FAIL_NTH, an atomic
 * flag).  The process rows are read under pthread_once into static storage
 * that is never written again, so getters are lock-free after the first
 * call.  Reading allocates nothing (fixed buffers): the host allocation seam
 * counts the same allocations as before options were cached.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <pwd.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/internal.h"
#include "core/options.h"

typedef enum {
    T_BACKEND, T_INT, T_SIZE, T_SIZE_OR_MAX,
    T_HEAPS,           /* an integer from 1 to 64 (GM_HEAPS_MAX): 0 heaps is not a pool */
    T_FLAG,            /* "1" sets the row's bit of the config's flags, "0" clears it */
    T_PEERS,           /* all | none | a list of device ordinals 0..63: a bit mask */
    T_FRACTION,        /* a number from 0 to 1 (a double, its bits in the uint64_t) */
    T_RATE,            /* a number from 0 to 1e6 (the same) */
    T_MALLOC_FAIL_NTH, /* not a config field: arms gm__malloc_fail_nth once */
    /* process rows: every value is accepted */
    T_PATH,            /* a string */
    T_CFG_PATH,        /* a socket path copied into a config char array */
    T_SWITCH,          /* "0": 0, anything else: 1 */
    T_LEAK,            /* "0": 0, "error": 2, anything else: 1 */
    T_TORCH_OOM,       /* "null": 1, anything else: 0 (throw) */
    T_USER             /* empty, a uid or a user name (shown INVALID when it names no user) */
} opt_type_t;

#define CFG(field) true, offsetof(gm_pool_config_t, field), 0
#define FLAG(bit) true, offsetof(gm_pool_config_t, flags), (bit)
#define PROC false, 0, 0

static const gm__option_t table[GM_OPT_COUNT] = {
    [GM_OPT_BACKEND] = {"GPUMEM_BACKEND", T_BACKEND, "auto",
                        "auto | sim | cuda (auto: cuda when a driver is installed, else sim)",
                        CFG(backend)},
    [GM_OPT_DEVICE] = {"GPUMEM_DEVICE", T_INT, "0", "device ordinal", CFG(device)},
    [GM_OPT_LIMIT] = {"GPUMEM_LIMIT", T_SIZE, "0",
                      "hard cap on reserved bytes, e.g. 8GiB (0: device memory)", CFG(limit)},
    [GM_OPT_INITIAL_RESERVE] = {"GPUMEM_INITIAL_RESERVE", T_SIZE, "0",
                                "bytes mapped when the pool is created", CFG(initial_reserve)},
    [GM_OPT_RELEASE_THRESHOLD] = {"GPUMEM_RELEASE_THRESHOLD", T_SIZE_OR_MAX, "max",
                                  "cached bytes kept after a free before giving memory back "
                                  "(max: keep all)", CFG(release_threshold)},
    [GM_OPT_RESERVE_SLACK] = {"GPUMEM_RESERVE_SLACK", T_FRACTION, "0.015625",
                              "reserved memory allowed over the live peak before free pages "
                              "are remapped, as a fraction (0 to 1)", CFG(reserve_slack)},
    [GM_OPT_RESERVE_SLACK_MAX] = {"GPUMEM_RESERVE_SLACK_MAX", T_FRACTION, "0.018",
                                  "the most the churn controller may raise the reserve slack "
                                  "to (0 to 1; below GPUMEM_RESERVE_SLACK: no raise)",
                                  CFG(reserve_slack_max)},
    [GM_OPT_CHURN_TARGET] = {"GPUMEM_CHURN_TARGET", T_RATE, "1",
                             "remapping calls per 1000 operations above which the reserve "
                             "slack grows and large blocks are placed where no page must be "
                             "remapped", CFG(churn_target)},
    [GM_OPT_HEAPS] = {"GPUMEM_HEAPS", T_HEAPS, "1",
                      "heaps threads allocate from (1 to 64; 1: one lock, the least memory; "
                      "more: threads allocating at once do not wait for each other)",
                      CFG(heaps)},
    [GM_OPT_HEAP_SLACK_MAX] = {"GPUMEM_HEAP_SLACK_MAX", T_FRACTION, "0.2",
                               "with more than one heap, each heap's reserve slack ceiling, where "
                               "it starts (0 to 1; the larger of this and "
                               "GPUMEM_RESERVE_SLACK_MAX applies)", CFG(heap_slack_max)},
    [GM_OPT_BROKER] = {"GPUMEM_BROKER", T_CFG_PATH, "",
                       "socket of a gpumem broker to lease physical pages from (empty: make "
                       "them with the driver)", CFG(broker)},
    [GM_OPT_BROKER_LEASE] = {"GPUMEM_BROKER_LEASE", T_SIZE, "64MiB",
                             "bytes leased from the broker per request (one to 64 pages)",
                             CFG(broker_lease)},
    [GM_OPT_SIM_CAPACITY] = {"GPUMEM_SIM_CAPACITY", T_SIZE, "80GiB",
                             "device size of the sim backend", CFG(sim_capacity)},
    [GM_OPT_SYSMEM_FALLBACK] = {"GPUMEM_SYSMEM_FALLBACK", T_FLAG, "0",
                                "1: serve allocations from mapped pinned host memory when device "
                                "memory runs out", FLAG(GM_POOL_SYSMEM_FALLBACK)},
    [GM_OPT_EVICT] = {"GPUMEM_EVICT", T_FLAG, "0",
                      "1: before an allocation fails, offload evictable tags nobody holds "
                      "(GM_POOL_EVICT)", FLAG(GM_POOL_EVICT)},
    [GM_OPT_PEERS] = {"GPUMEM_PEERS", T_PEERS, "none",
                      "devices that may read and write the pool's pages besides its own: all | "
                      "none | a list of ordinals such as 0,1,3", CFG(peers)},
    [GM_OPT_NCCL] = {"GPUMEM_NCCL", T_FLAG, "0",
                     "1: make pages the way ncclMemAlloc does, so NCCL can register blocks "
                     "(GM_POOL_NCCL)", FLAG(GM_POOL_NCCL)},
    [GM_OPT_COMPRESSIBLE] = {"GPUMEM_COMPRESSIBLE", T_FLAG, "0",
                             "1: compressible pages (GM_POOL_COMPRESSIBLE; refused where the "
                             "device cannot compress)", FLAG(GM_POOL_COMPRESSIBLE)},
    [GM_OPT_COPY_THREADS] = {"GPUMEM_COPY_THREADS", T_INT, "0",
                             "worker threads of staged host copies (0: min(12, 3*cores/4))",
                             CFG(copy_threads)},
    [GM_OPT_COPY_CHUNK] = {"GPUMEM_COPY_CHUNK", T_SIZE, "0",
                           "staging buffer size of staged host copies (0: 2MiB)", CFG(copy_chunk)},
    /* Read with the config rows (gm_config_from_env), so a bad value is an
     * error there; it fills no field. */
    [GM_OPT_MALLOC_FAIL_NTH] = {"GPUMEM_MALLOC_FAIL_NTH", T_MALLOC_FAIL_NTH, "0",
                                "testing: the n-th host allocation of the library, counted from "
                                "the first reading of the environment, fails (0: none)",
                                true, 0, 0},
    [GM_OPT_TRACE] = {"GPUMEM_TRACE", T_PATH, "",
                      "record every allocation of the process to this RMM CSV file (.gz: "
                      "gzip'd), from the first pool on", PROC},
    [GM_OPT_LEAK_CHECK] = {"GPUMEM_LEAK_CHECK", T_LEAK, "0",
                           "1: record call stacks, report leaks at pool destruction and exit; "
                           "error: also exit with status 23 after a leak", PROC},
    [GM_OPT_MONITOR] = {"GPUMEM_MONITOR", T_SWITCH, "1",
                        "0: no shared statistics file for gpumem top / metrics", PROC},
    [GM_OPT_MONITOR_DIR] = {"GPUMEM_MONITOR_DIR", T_PATH, "/dev/shm",
                            "directory of the shared statistics files (gpumem.<pid>)", PROC},
    [GM_OPT_TORCH_OOM] = {"GPUMEM_TORCH_OOM", T_TORCH_OOM, "throw",
                          "PyTorch plug-in out of memory: throw (std::runtime_error) | null "
                          "(return NULL)", PROC},
    [GM_OPT_TORCH_SHAREABLE] = {"GPUMEM_TORCH_SHAREABLE", T_SIZE, "0",
                                "PyTorch native allocator: tensors of at least this size get whole "
                                "pages, so torch.multiprocessing can share them (0: none)", PROC},
    [GM_OPT_PRELOAD_VERBOSE] = {"GPUMEM_PRELOAD_VERBOSE", T_SWITCH, "0",
                                "1: the preload library says where it routes and sums up at exit",
                                PROC},
    /* Read by the broker client (src/broker/client.c) at each connection
     * and by the CLI's broker queries. */
    [GM_OPT_BROKER_UID] = {"GPUMEM_BROKER_UID", T_USER, "",
                           "a uid or user name a broker may run as, besides root and this "
                           "process's own uid (empty: none)", PROC},
    /* Read at each pool creation of the sim (gm__option_read); a bad value
     * fails it. */
    [GM_OPT_SIM_DEVICES] = {"GPUMEM_SIM_DEVICES", T_INT, "32",
                            "devices of the sim backend's machine (1 to 32)", PROC},
    [GM_OPT_SIM_PEER_GROUP] = {"GPUMEM_SIM_PEER_GROUP", T_INT, "0",
                               "sim: devices reach each other's memory only within groups of "
                               "this many consecutive ordinals (0: all reach all)", PROC},
    [GM_OPT_SIM_COMPRESSION] = {"GPUMEM_SIM_COMPRESSION", T_SWITCH, "1",
                                "0: the sim's devices cannot compress memory", PROC},
};

const gm__option_t *gm__option(gm__opt_t o) { return &table[o]; }

const char *gm__option_env(gm__opt_t o)
{
    const char *v = getenv(table[o].name);
    return v && *v ? v : NULL;
}

/* ---- parsers -------------------------------------------------------------- */

int gm__parse_backend(const char *s, gm_backend_kind_t *kind)
{
    if (!strcmp(s, "auto")) *kind = GM_BACKEND_AUTO;
    else if (!strcmp(s, "sim")) *kind = GM_BACKEND_SIM;
    else if (!strcmp(s, "cuda")) *kind = GM_BACKEND_CUDA;
    else return GM_INVALID_ARGUMENT;
    return GM_OK;
}

int gm__parse_user(const char *s, unsigned *uid)
{
    char *end;
    errno = 0;
    unsigned long x = strtoul(s, &end, 10);
    if (*s >= '0' && *s <= '9' && !errno && !*end && x < UINT_MAX) {
        *uid = (unsigned)x;
        return GM_OK;
    }
    if (!*s) return GM_INVALID_ARGUMENT;
    struct passwd pw, *found = NULL;
    char buf[4096];
    if (getpwnam_r(s, &pw, buf, sizeof buf, &found) != 0 || !found) return GM_INVALID_ARGUMENT;
    *uid = (unsigned)found->pw_uid;
    return GM_OK;
}

int gm__parse_peers(const char *s, uint64_t *mask)
{
    if (!strcmp(s, "all")) {
        *mask = GM_PEERS_ALL;
        return GM_OK;
    }
    *mask = 0;
    if (!strcmp(s, "none")) return GM_OK;
    const char *p = s;
    for (;;) {
        if (*p < '0' || *p > '9') return GM_INVALID_ARGUMENT;
        unsigned d = 0;
        while (*p >= '0' && *p <= '9') {
            d = d * 10 + (unsigned)(*p++ - '0');
            if (d > 63) return GM_INVALID_ARGUMENT;
        }
        *mask |= (uint64_t)1 << d;
        if (*p == '\0') return GM_OK;
        if (*p++ != ',') return GM_INVALID_ARGUMENT;
    }
}

const char *gm__backend_kind_name(gm_backend_kind_t kind)
{
    switch (kind) {
    case GM_BACKEND_AUTO: return "auto";
    case GM_BACKEND_SIM: return "sim";
    case GM_BACKEND_CUDA: return "cuda";
    }
    return "?";
}

/* v (never empty: the default stands in) as a number of row o's type.
 * Config rows can fail; process rows never do. */
static int parse(const gm__option_t *o, const char *v, uint64_t *out)
{
    switch ((opt_type_t)o->type) {
    case T_BACKEND: {
        gm_backend_kind_t k;
        if (gm__parse_backend(v, &k) != GM_OK) return GM_INVALID_ARGUMENT;
        *out = (uint64_t)k;
        return GM_OK;
    }
    case T_INT:
    case T_HEAPS: {
        char *end;
        errno = 0;
        long x = strtol(v, &end, 10);
        if (errno || *end || end == v || x < 0 || x > 1 << 20) return GM_INVALID_ARGUMENT;
        if (o->type == T_HEAPS && (x < 1 || x > 64)) return GM_INVALID_ARGUMENT;
        *out = (uint64_t)x;
        return GM_OK;
    }
    case T_SIZE_OR_MAX:
        if (!strcmp(v, "max")) {
            *out = SIZE_MAX;
            return GM_OK;
        }
        /* fall through */
    case T_SIZE: {
        size_t s = 0;
        int rc = gm__parse_size(v, &s);
        if (rc == GM_OK) *out = s;
        return rc;
    }
    case T_MALLOC_FAIL_NTH: {
        char *end;
        errno = 0;
        unsigned long long n = strtoull(v, &end, 10);
        if (errno || *end || end == v || v[0] == '-') return GM_INVALID_ARGUMENT;
        *out = n;
        return GM_OK;
    }
    case T_PEERS:
        return gm__parse_peers(v, out);
    case T_FLAG:
        if (!strcmp(v, "1")) *out = 1;
        else if (!strcmp(v, "0")) *out = 0;
        else return GM_INVALID_ARGUMENT;
        return GM_OK;
    case T_FRACTION:
    case T_RATE: {
        char *end;
        errno = 0;
        double d = strtod(v, &end);
        double hi = o->type == T_FRACTION ? 1.0 : 1e6;
        if (errno || *end || end == v || !(d >= 0 && d <= hi)) return GM_INVALID_ARGUMENT;
        memcpy(out, &d, sizeof d);
        return GM_OK;
    }
    case T_PATH: *out = 0; return GM_OK;
    case T_CFG_PATH:
        *out = 0;
        return strlen(v) < sizeof(((gm_pool_config_t *)0)->broker) ? GM_OK : GM_INVALID_ARGUMENT;
    case T_SWITCH: *out = strcmp(v, "0") != 0; return GM_OK;
    case T_LEAK: *out = !strcmp(v, "0") ? 0 : !strcmp(v, "error") ? 2 : 1; return GM_OK;
    case T_TORCH_OOM: *out = strcmp(v, "null") == 0; return GM_OK;
    case T_USER: {
        unsigned uid = 0;
        *out = UINT64_MAX; /* none */
        if (!*v) return GM_OK;
        if (gm__parse_user(v, &uid) != GM_OK) return GM_INVALID_ARGUMENT;
        *out = uid;
        return GM_OK;
    }
    }
    return GM_INVALID_ARGUMENT;
}

bool gm__option_valid(gm__opt_t o, const char *v)
{
    uint64_t x;
    return parse(&table[o], v && *v ? v : table[o].def, &x) == GM_OK;
}

/* ---- gm_config_from_env: the config rows, read at each call ---------------- */

/* Store the parsed value x of config row o into d. */
static void apply(const gm__option_t *o, uint64_t x, gm_pool_config_t *d)
{
    char *base = (char *)d + o->offset;
    switch ((opt_type_t)o->type) {
    case T_BACKEND: *(gm_backend_kind_t *)(void *)base = (gm_backend_kind_t)x; break;
    case T_INT: *(int *)(void *)base = (int)x; break;
    case T_HEAPS: *(unsigned *)(void *)base = (unsigned)x; break;
    case T_SIZE:
    case T_SIZE_OR_MAX: *(size_t *)(void *)base = (size_t)x; break;
    case T_FRACTION:
    case T_RATE: memcpy(base, &x, sizeof(double)); break;
    case T_PEERS: *(uint64_t *)(void *)base = x; break;
    case T_FLAG:
        if (x) *(unsigned *)(void *)base |= o->bit;
        else *(unsigned *)(void *)base &= ~o->bit;
        break;
    case T_CFG_PATH: {
        const char *v = getenv(o->name);
        snprintf(base, sizeof(((gm_pool_config_t *)0)->broker), "%s", v ? v : "");
        break;
    }
    case T_MALLOC_FAIL_NTH: {
        static atomic_flag armed = ATOMIC_FLAG_INIT;
        if (x != 0 && !atomic_flag_test_and_set(&armed)) gm__malloc_fail_nth((unsigned long)x);
        break;
    }
    default: break;
    }
}

int gm__option_read(gm__opt_t i, uint64_t *x)
{
    const gm__option_t *o = &table[i];
    const char *v = getenv(o->name);
    if (!v || !*v) v = o->def;
    if (parse(o, v, x) != GM_OK)
        return gm__set_error(GM_INVALID_ARGUMENT, "%s=\"%s\" is not valid: %s", o->name, v,
                             o->doc);
    return GM_OK;
}

int gm_config_from_env(gm_pool_config_t *cfg)
{
    if (!cfg) return gm__set_error(GM_INVALID_ARGUMENT, "gm_config_from_env: cfg is NULL");
    gm_pool_config_t d = GM_POOL_CONFIG_INIT;
    for (int i = 0; i < GM_OPT_COUNT; i++) {
        uint64_t x;
        if (!table[i].config) continue;
        GM_CHECK(gm__option_read((gm__opt_t)i, &x));
        apply(&table[i], x, &d);
    }
    *cfg = d;
    return GM_OK;
}

/* ---- the process rows, read once ------------------------------------------- */

/* Strings are copied (a later setenv may free the environment's), into
 * buffers of PATH_MAX: a longer value, which no path can be, keeps the
 * environment's own pointer. */
#define STR_CAP 4096
static pthread_once_t once = PTHREAD_ONCE_INIT;
static uint64_t num[GM_OPT_COUNT];
static const char *str[GM_OPT_COUNT];
static char str_buf[GM_OPT_COUNT][STR_CAP];

static void read_once(void)
{
    for (int i = 0; i < GM_OPT_COUNT; i++) {
        const gm__option_t *o = &table[i];
        if (o->config) continue;
        const char *v = getenv(o->name);
        if (!v || !*v) v = o->def;
        if (parse(o, v, &num[i]) != GM_OK) num[i] = 0;
        size_t n = strlen(v);
        if (n < STR_CAP) {
            memcpy(str_buf[i], v, n + 1);
            v = str_buf[i];
        }
        str[i] = *v ? v : NULL;
    }
}

const char *gm__option_str(gm__opt_t o)
{
    pthread_once(&once, read_once);
    return str[o];
}

uint64_t gm__option_num(gm__opt_t o)
{
    pthread_once(&once, read_once);
    return num[o];
}

size_t gm__option_sim_capacity(void)
{
    /* A config row, read at each pool creation (as configs are): a bad or
     * zero value falls back to the default quietly, as it always did. */
    const gm__option_t *o = &table[GM_OPT_SIM_CAPACITY];
    uint64_t x = 0;
    const char *v = getenv(o->name);
    if (!v || parse(o, v, &x) != GM_OK || x == 0) parse(o, o->def, &x);
    return (size_t)x;
}

void gm__options_atfork_child(void)
{
    pthread_once_t fresh = PTHREAD_ONCE_INIT;
    once = fresh;
}
