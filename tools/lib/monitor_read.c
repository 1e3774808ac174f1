/* SPDX-License-Identifier: Apache-2.0 */
/*
 * monitor_read.c — the reader half of the shared statistics segment:
 * `gpumem top` and `gpumem metrics` scan the monitor directory and get one
 * validated view per live process (monitor_read.h).  The writer is
 * src/observe/monitor.c in the library; both follow the layout of
 * src/observe/monitor_seg.h.
 *
 * The one idea: the directory is shared with other users, so a file there is
 * hostile until checked.  Files are opened with O_NONBLOCK|O_NOFOLLOW,
 * accepted only as regular files of this user or root of exactly the
 * segment's size, read() into a private copy (a file truncated meanwhile
 * gives a short read, never a SIGBUS), every header field validated, and
 * the strings turned into printable ASCII.  A pool's slot is read under the
 * writer's seqlock with pread: the slot, then its sequence number again.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/internal.h"
#include "core/options.h"
#include "lib/monitor_read.h"

/* The directory the library writes its segments to (the same option). */
static const char *dir(void)
{
    return gm__option_str(GM_OPT_MONITOR_DIR);
}

uint64_t gm__monitor_value(const gm__mon_proc_view_t *v, const gm__mon_pool_view_t *p,
                           const char *name)
{
    for (unsigned i = 0; i < v->n_fields; i++)
        if (!strcmp(v->names[i], name)) return p->values[i];
    return 0;
}

/* A stats field name as we write them: [a-z0-9_]+, terminated in the buffer. */
static bool valid_name(const char *s, size_t cap)
{
    size_t n = strnlen(s, cap);
    if (n == 0 || n == cap) return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
            return false;
    return true;
}

/* Copy src (cap bytes, maybe unterminated) into dst as printable ASCII: any
 * control character, DEL or non-ASCII byte becomes '?', so a command name
 * cannot move the cursor, clear the screen or break a line or a JSON or
 * Prometheus string. */
static void printable_copy(char *dst, const char *src, size_t cap)
{
    size_t i = 0;
    for (; i + 1 < cap && src[i]; i++)
        dst[i] = (unsigned char)src[i] < 0x20 || (unsigned char)src[i] >= 0x7f ? '?' : src[i];
    dst[i] = '\0';
}

/* n bytes at off, all of them (a file truncated meanwhile: false). */
static bool pread_all(int fd, void *buf, size_t n, off_t off)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, off + (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        got += (size_t)r;
    }
    return true;
}

/* Read one segment into *v through the private copy m.  The file is another
 * process's, maybe another user's: opened without following links or
 * blocking (a FIFO), accepted only as a regular file of this user or root of
 * exactly a segment's size, read with pread (never mapped, so truncation
 * cannot raise SIGBUS), every header field checked. */
static bool read_seg(const char *path, int name_pid, gm__mon_proc_view_t *v, mon_seg_t *m)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return false;
    struct stat sb;
    uid_t me = geteuid();
    bool ok = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && (sb.st_uid == me || sb.st_uid == 0) &&
              sb.st_size == (off_t)sizeof(mon_seg_t) && pread_all(fd, m, sizeof *m, 0);
    if (!ok) {
        close(fd);
        return false;
    }
    ok = m->magic == MON_MAGIC && m->version == MON_VERSION && m->size == sizeof(mon_seg_t) &&
         m->n_fields > 0 && m->n_fields <= GM_MON_MAX_FIELDS;
    for (unsigned i = 0; ok && i < m->n_fields; i++) ok = valid_name(m->names[i], GM_MON_NAME);
    if (!ok) { /* not a segment of ours (junk, a copy, a forgery): left alone */
        close(fd);
        return false;
    }
    memset(v, 0, sizeof *v);
    v->pid = m->pid;
    printable_copy(v->command, m->command, sizeof v->command);
    v->n_fields = m->n_fields;
    for (unsigned i = 0; i < v->n_fields; i++) memcpy(v->names[i], m->names[i], GM_MON_NAME);
    /* The process must be the one named, alive and the same one (pids are
     * reused). */
    bool live = m->pid == name_pid && !(kill(m->pid, 0) != 0 && errno == ESRCH) &&
                gm__mon_start_time(m->pid) == m->start_time;
    if (!live) {
        close(fd);
        /* Stale (its process is gone) or a copied file: removed when ours. */
        if (sb.st_uid == me) unlink(path);
        return false;
    }
    for (int i = 0; i < MON_SLOTS && v->n_pools < sizeof v->pools / sizeof v->pools[0]; i++) {
        struct gm__mon_slot *s = &m->slots[i];
        if (!s->in_use) continue;
        off_t off = (off_t)offsetof(mon_seg_t, slots) + (off_t)i * (off_t)sizeof *s;
        /* The seqlock, through pread: the slot (seq first), then seq again. */
        bool got = false;
        for (int tries = 0; tries < 100; tries++) {
            if (!pread_all(fd, s, sizeof *s, off)) break; /* truncated meanwhile */
            uint64_t q0 = atomic_load_explicit(&s->seq, memory_order_relaxed), q1;
            got = true; /* after 100 busy tries: the last copy, as before */
            if (q0 & 1) continue;
            if (!pread_all(fd, &q1, sizeof q1, off)) {
                got = false;
                break;
            }
            if (q1 == q0) break;
        }
        if (!got || !s->in_use) continue;
        gm__mon_pool_view_t *p = &v->pools[v->n_pools];
        memcpy(p->values, s->values, sizeof p->values);
        p->slot = i;
        p->device = s->device;
        printable_copy(p->backend, s->backend, sizeof p->backend);
        v->n_pools++;
    }
    close(fd);
    return true;
}

int gm__monitor_scan(void (*fn)(const gm__mon_proc_view_t *v, void *arg), void *arg)
{
    DIR *d = opendir(dir());
    if (!d) return -1;
    int n = 0;
    gm__mon_proc_view_t *v = gm__malloc(sizeof *v);
    mon_seg_t *m = gm__malloc(sizeof *m);
    if (!v || !m) {
        gm__free(v);
        gm__free(m);
        closedir(d);
        errno = ENOMEM;
        return -1;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "gpumem.", 7) != 0) continue;
        char *end;
        long pid = strtol(e->d_name + 7, &end, 10);
        if (*end || end == e->d_name + 7 || pid <= 0 || pid > INT32_MAX) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir(), e->d_name);
        if (!read_seg(path, (int)pid, v, m)) continue;
        fn(v, arg);
        n++;
    }
    closedir(d);
    gm__free(v);
    gm__free(m);
    return n;
}
