/* SPDX-License-Identifier: Apache-2.0 */
/*
 * monitor_read.h — the reader of the shared statistics segments that
 * libgpumem's processes publish (src/observe/monitor.c writes them, in the
 * layout of src/observe/monitor_seg.h): one view per live process, for
 * `gpumem top`, `gpumem metrics` and the tests.  A tool, not part of
 * libgpumem.
 *
 * The one idea: a segment is another process's file, maybe another user's,
 * so nothing read from it is trusted: a view holds only validated fields,
 * and its strings are printable ASCII (others replaced by '?'), field names
 * match [a-z0-9_]+: safe to print on a terminal, in JSON or Prometheus
 * labels with the usual quoting.
 */
#ifndef GM_TOOLS_MONITOR_READ_H
#define GM_TOOLS_MONITOR_READ_H

#include <stdint.h>

#include "observe/monitor_seg.h"

typedef struct gm__mon_pool_view {
    int slot;                    /* the pool's slot in its process's file */
    int device;
    char backend[16];
    uint64_t values[GM_MON_MAX_FIELDS];
} gm__mon_pool_view_t;

typedef struct gm__mon_proc_view {
    int pid;
    char command[64];
    unsigned n_fields;
    char names[GM_MON_MAX_FIELDS][GM_MON_NAME];
    unsigned n_pools;
    gm__mon_pool_view_t pools[MON_SLOTS];
} gm__mon_proc_view_t;

/* Read every live process's segment in the monitor directory
 * (GPUMEM_MONITOR_DIR, default /dev/shm); remove stale ones of this user
 * (dead pid, or a pid reused by another process).  Only regular files owned
 * by this user or root are read.  Calls fn per process.  Returns the number
 * of processes, or -1 with errno when the directory cannot be read. */
int gm__monitor_scan(void (*fn)(const gm__mon_proc_view_t *v, void *arg), void *arg);

/* The value of field `name` in a pool view (0 when the field is unknown). */
uint64_t gm__monitor_value(const gm__mon_proc_view_t *v, const gm__mon_pool_view_t *p,
                           const char *name);

#endif /* GM_TOOLS_MONITOR_READ_H */
