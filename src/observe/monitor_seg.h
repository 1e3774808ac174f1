/* SPDX-License-Identifier: Apache-2.0 */
/*
 * monitor_seg.h — the layout of the shared statistics segment, the one
 * thing the writer (src/observe/monitor.c, in the library) and the reader
 * (tools/lib/monitor_read.c, behind `gpumem top` and `gpumem metrics`) must
 * agree on: the header (magic, version, pid, start time, command, field
 * names), the per-pool slots with their seqlock, and how a process is
 * identified across pid reuse (its start time in /proc/<pid>/stat).
 *
 * The one idea: the file is a format, like the trace CSV of trace.h, so it
 * is described once, here; a change of layout bumps MON_VERSION and readers
 * of another version skip the file.
 */
#ifndef GM_OBSERVE_MONITOR_SEG_H
#define GM_OBSERVE_MONITOR_SEG_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GM_MON_MAX_FIELDS 64 /* stats fields a segment can hold */
#define GM_MON_NAME 32       /* bytes of a field name, terminator included */

#define MON_MAGIC 0x314d454d55504d47ull /* "GMPUMEM1" little-endian */
#define MON_VERSION 1
#define MON_SLOTS 16

/* One pool's copy of its counters; seq is odd while the writer is in it. */
struct gm__mon_slot {
    _Atomic uint64_t seq;        /* odd while being written */
    uint32_t in_use;
    int32_t device;
    char backend[16];
    uint64_t values[GM_MON_MAX_FIELDS];
};

typedef struct mon_seg {
    uint64_t magic;
    uint32_t version, size;
    int32_t pid;
    uint32_t n_fields;
    uint64_t start_time;         /* field 22 of /proc/<pid>/stat */
    char command[64];
    char names[GM_MON_MAX_FIELDS][GM_MON_NAME];
    struct gm__mon_slot slots[MON_SLOTS];
} mon_seg_t;

/* The start time of process pid (field 22 of /proc/<pid>/stat), 0 when it
 * cannot be read.  The writer stores its own; a reader compares it with
 * the live process's, so a file whose pid was reused is seen as stale. */
static inline uint64_t gm__mon_start_time(int pid)
{
    char p[64], text[1024];
    snprintf(p, sizeof p, "/proc/%d/stat", pid);
    FILE *f = fopen(p, "r");
    if (!f) return 0;
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    /* The command, in parentheses, may itself hold spaces and ')'. */
    char *close = strrchr(text, ')');
    if (!strchr(text, '(') || !close) return 0;
    /* Fields after the command: state is field 3, starttime field 22. */
    char *s = close + 2;
    for (int field = 3; field < 22 && s; field++) {
        s = strchr(s, ' ');
        if (s) s++;
    }
    return s ? strtoull(s, NULL, 10) : 0;
}

#endif /* GM_OBSERVE_MONITOR_SEG_H */
