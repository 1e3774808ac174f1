/* SPDX-License-Identifier: Apache-2.0 */
/*
 * options.h — every GPUMEM_* environment variable the library reads, as one
 * table (options.c): name, type, default, one-line doc.  `gpumem info
 * --options` prints it; no other file of src/ or preload/ calls getenv.
 *
 * Two kinds of row.  Pool-configuration rows (GPUMEM_BACKEND ...
 * GPUMEM_MALLOC_FAIL_NTH) are read by gm_config_from_env, at every call, as
 * its public contract says; a bad value is its error.  Process rows
 * (GPUMEM_TRACE, GPUMEM_LEAK_CHECK, GPUMEM_MONITOR ...) are read once, at the
 * first getter call, and cached; a child of fork() reads them again at its
 * first use (gm__options_atfork_child), as it did when every file read the
 * environment itself.  Their parsers accept every value, as before.
 */
#ifndef GM_OPTIONS_H
#define GM_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpumem.h"

/* The rows, in table order (gm_config_from_env reports the first bad one). */
typedef enum gm__opt {
    GM_OPT_BACKEND,
    GM_OPT_DEVICE,
    GM_OPT_LIMIT,
    GM_OPT_INITIAL_RESERVE,
    GM_OPT_RELEASE_THRESHOLD,
    GM_OPT_RESERVE_SLACK,
    GM_OPT_RESERVE_SLACK_MAX,
    GM_OPT_CHURN_TARGET,
    GM_OPT_HEAPS,
    GM_OPT_HEAP_SLACK_MAX,
    GM_OPT_BROKER,
    GM_OPT_BROKER_LEASE,
    GM_OPT_SIM_CAPACITY,
    GM_OPT_SYSMEM_FALLBACK,
    GM_OPT_EVICT,
    GM_OPT_PEERS,
    GM_OPT_NCCL,
    GM_OPT_COMPRESSIBLE,
    GM_OPT_COPY_THREADS,
    GM_OPT_COPY_CHUNK,
    GM_OPT_MALLOC_FAIL_NTH,
    /* process rows: read once */
    GM_OPT_TRACE,
    GM_OPT_LEAK_CHECK,
    GM_OPT_MONITOR,
    GM_OPT_MONITOR_DIR,
    GM_OPT_TORCH_OOM,
    GM_OPT_TORCH_SHAREABLE,
    GM_OPT_PRELOAD_VERBOSE,
    GM_OPT_BROKER_UID,
    GM_OPT_SIM_DEVICES,
    GM_OPT_SIM_PEER_GROUP,
    GM_OPT_SIM_COMPRESSION,
    GM_OPT_COUNT
} gm__opt_t;

typedef struct gm__option {
    const char *name;            /* "GPUMEM_LIMIT" */
    int type;                    /* options.c's parser of the row */
    const char *def;             /* the default, as a user would write it */
    const char *doc;             /* one line */
    bool config;                 /* a gm_pool_config_t field (gm_config_from_env) */
    size_t offset;               /* config rows: where in gm_pool_config_t */
    unsigned bit;                /* flag rows: their GM_POOL_* bit of `flags` */
} gm__option_t;

/* The row of option o (o < GM_OPT_COUNT). */
const gm__option_t *gm__option(gm__opt_t o);
/* The environment's value of o right now, NULL when unset or empty (the
 * default applies); for `gpumem info --options`, not cached. */
const char *gm__option_env(gm__opt_t o);
/* Is v a valid value of o?  Has no effect (GPUMEM_MALLOC_FAIL_NTH is not
 * armed by checking it). */
bool gm__option_valid(gm__opt_t o, const char *v);

/* Typed getters of the process rows, read once (thread-safe), never failing:
 *   gm__option_str:  GPUMEM_TRACE (NULL when unset), GPUMEM_MONITOR_DIR
 *                    ("/dev/shm" when unset);
 *   gm__option_num:  GPUMEM_LEAK_CHECK (0 off, 1 on, 2 "error"),
 *                    GPUMEM_MONITOR and GPUMEM_PRELOAD_VERBOSE (1 unless "0"),
 *                    GPUMEM_TORCH_OOM (1 for "null"). */
const char *gm__option_str(gm__opt_t o);
uint64_t gm__option_num(gm__opt_t o);
/* Config row o's value now: the environment's, or the default when unset or
 * empty.  A bad value: GM_INVALID_ARGUMENT with the message every config
 * row gives ("GPUMEM_X=\"v\" is not valid: <doc>").  Arms nothing. */
int gm__option_read(gm__opt_t o, uint64_t *x);
/* The sim's device size for a config that leaves it 0: GPUMEM_SIM_CAPACITY
 * when set, valid and not 0, else the row's default (80 GiB, written only in
 * the table).  Read at each call (pool creation), like the other config rows. */
size_t gm__option_sim_capacity(void);
/* In a child of fork() (the process layer's handler): forget the cached
 * values; the child's first getter call reads its own environment. */
void gm__options_atfork_child(void);

/* The one parser of "auto" | "sim" | "cuda" (the CLI's --backend too):
 * GM_OK or GM_INVALID_ARGUMENT, no message. */
int gm__parse_backend(const char *s, gm_backend_kind_t *kind);
/* "auto", "sim", "cuda" for a kind; "?" for another value. */
const char *gm__backend_kind_name(gm_backend_kind_t kind);
/* A uid in decimal or a user name (looked up): GM_OK with *uid, or
 * GM_INVALID_ARGUMENT, no message.  GPUMEM_BROKER_UID's parser. */
int gm__parse_user(const char *s, unsigned *uid);
/* "all" (GM_PEERS_ALL), "none" (0) or a comma-separated list of device
 * ordinals 0..63 (their bits); GM_INVALID_ARGUMENT, no message, otherwise. */
int gm__parse_peers(const char *s, uint64_t *mask);

#endif /* GM_OPTIONS_H */
