/* SPDX-License-Identifier: Apache-2.0 */
/*
 * monitor.c — the shared statistics segment read by `gpumem top` and
 * `gpumem metrics`: one small file per process, /dev/shm/gpumem.<pid> (or
 * $GPUMEM_MONITOR_DIR/gpumem.<pid>), mapped shared, holding a header (pid,
 * start time, command, the names of the stats fields) and one slot per pool
 * with a copy of its counters.
 *
 * The one idea: no syscall per operation.  The counters are copied into the
 * slot under the pool lock after every allocate, free and trim (a few
 * hundred bytes of stores), framed by a sequence number that is odd while a
 * copy is in progress (a seqlock), so readers in other processes get a
 * consistent copy without any lock.  The file is created with the first
 * pool, removed with the last one and at exit; readers skip (and remove)
 * files whose process is gone or whose pid now belongs to another process
 * (its start time in /proc/<pid>/stat differs).  GPUMEM_MONITOR=0 turns it
 * off.
 *
 * The directory is shared with other users (/dev/shm is world-writable), so
 * a name there is never trusted.  The writer creates a fresh file under a
 * temporary name (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0644), checks with fstat
 * that it is a regular file of ours, gives it its blocks with
 * posix_fallocate (a full /dev/shm is then an error here, never a SIGBUS at
 * a later store), maps it, fills it, and renames it onto gpumem.<pid>: a
 * symlink or another user's file planted at that name is replaced as a name
 * (or, in a sticky directory, the rename fails) and never opened.  When the
 * file cannot be made, the pool works without it and the process says so
 * once on stderr.  Readers open with O_NONBLOCK|O_NOFOLLOW, accept only
 * regular files of their own user or root of exactly the segment's size,
 * read() a private copy (a file truncated meanwhile gives a short read, not
 * a SIGBUS), validate every field, and turn the strings into printable
 * ASCII: what a view holds is safe to print anywhere.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/options.h"
#include "observe/observe.h"

/* Seqlock fences.  On x86 stores are not reordered with stores, nor loads
 * with loads, so a compiler barrier is enough (and TSan builds reject
 * atomic_thread_fence); elsewhere a real fence. */
#if defined(__x86_64__) || defined(__i386__)
#define SEQ_FENCE(order) atomic_signal_fence(order)
#else
#define SEQ_FENCE(order) atomic_thread_fence(order)
#endif

#define MON_MAGIC 0x314d454d55504d47ull /* "GMPUMEM1" little-endian */
#define MON_VERSION 1
#define MON_SLOTS 16

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

static const char *const field_names[] = {
#define GM__MON_NAME(name, desc) #name,
    GM_STAT_FIELDS(GM__MON_NAME)
#undef GM__MON_NAME
};
#define N_FIELDS (sizeof field_names / sizeof field_names[0])
_Static_assert(N_FIELDS <= GM_MON_MAX_FIELDS, "raise GM_MON_MAX_FIELDS");

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static mon_seg_t *seg;
static double ns_per_tick;       /* read once at attach: no pthread_once per op */
static char seg_path[512];
static bool failure_said;         /* the "no monitor file" note, once */

static const char *dir(void)
{
    return gm__option_str(GM_OPT_MONITOR_DIR);
}

static uint64_t start_time_of(int pid, char *comm, size_t cap)
{
    char p[64], text[1024];
    snprintf(p, sizeof p, "/proc/%d/stat", pid);
    FILE *f = fopen(p, "r");
    if (!f) return 0;
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    char *open = strchr(text, '('), *close = strrchr(text, ')');
    if (!open || !close) return 0;
    if (comm) snprintf(comm, cap, "%.*s", (int)(close - open - 1), open + 1);
    /* Fields after the command: state is field 3, starttime field 22. */
    char *s = close + 2;
    for (int field = 3; field < 22 && s; field++) {
        s = strchr(s, ' ');
        if (s) s++;
    }
    return s ? strtoull(s, NULL, 10) : 0;
}

/* mu held: say once on stderr why this process has no monitor file. */
static void say_no_monitor_locked(const char *path, const char *what, int err)
{
    if (failure_said) return;
    failure_said = true;
    fprintf(stderr, "gpumem: no monitor file %s (%s: %s); gpumem top and gpumem metrics will "
            "not show this process\n", path, what, strerror(err));
}

/* mu held: create the segment (see the file comment: a fresh file under a
 * temporary name, checked, sized, filled, then renamed into place). */
static void create_locked(void)
{
    if (!gm__option_num(GM_OPT_MONITOR)) return;
    const char *d = dir();
    int pid = (int)getpid();
    int n = snprintf(seg_path, sizeof seg_path, "%s/gpumem.%d", d, pid);
    char tmp[sizeof seg_path + 32];
    if (n < 0 || (size_t)n >= sizeof seg_path) {
        say_no_monitor_locked(d, "directory name too long", ENAMETOOLONG);
        return;
    }
    int fd = -1, err = 0;
    const char *what = "create";
    for (int tries = 0; tries < 8 && fd < 0; tries++) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        snprintf(tmp, sizeof tmp, "%s/.gpumem.%d.%lx.tmp", d, pid,
                 (unsigned long)(ts.tv_nsec ^ ((unsigned long)ts.tv_sec << 20)) + (unsigned long)tries);
        fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        err = errno;
        if (fd < 0 && err != EEXIST) break;
    }
    if (fd < 0) {
        say_no_monitor_locked(seg_path, what, err);
        return;
    }
    void *m = MAP_FAILED;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        what = "fstat";
        err = errno;
    } else if (!S_ISREG(sb.st_mode) || sb.st_uid != geteuid() || (sb.st_mode & 022) ||
               sb.st_size != 0) {
        what = "not a fresh regular file of this user";
        err = EPERM;
    } else if ((err = posix_fallocate(fd, 0, sizeof(mon_seg_t))) != 0) {
        what = "allocate"; /* posix_fallocate returns the error */
    } else if ((m = mmap(NULL, sizeof(mon_seg_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) ==
               MAP_FAILED) {
        what = "mmap";
        err = errno;
    }
    close(fd);
    if (m == MAP_FAILED) {
        unlink(tmp);
        say_no_monitor_locked(seg_path, what, err);
        return;
    }
    mon_seg_t *sg = m;
    sg->version = MON_VERSION;
    sg->size = sizeof *sg;
    sg->pid = (int32_t)pid;
    sg->n_fields = (uint32_t)N_FIELDS;
    sg->start_time = start_time_of(pid, NULL, 0);
    /* The full command line's first word beats the 15-byte comm. */
    FILE *f = fopen("/proc/self/cmdline", "r");
    if (f) {
        size_t k = fread(sg->command, 1, sizeof sg->command - 1, f);
        fclose(f);
        sg->command[k] = '\0';
        const char *base = strrchr(sg->command, '/');
        if (base) memmove(sg->command, base + 1, strlen(base + 1) + 1);
    }
    for (size_t i = 0; i < N_FIELDS; i++)
        snprintf(sg->names[i], GM_MON_NAME, "%s", field_names[i]);
    __atomic_store_n(&sg->magic, MON_MAGIC, __ATOMIC_RELEASE);
    /* Onto the public name: replaces a stale file of ours, a planted
     * symlink or a file at that name as a directory entry, never writing
     * into it; in a sticky directory (/dev/shm) another user's file stays
     * and the rename fails. */
    if (rename(tmp, seg_path) != 0) {
        err = errno;
        unlink(tmp);
        munmap(m, sizeof(mon_seg_t));
        say_no_monitor_locked(seg_path, "rename into place", err);
        return;
    }
    seg = sg;
}

void gm__monitor_attach(gm_pool_t *pool)
{
    double npt = gm__ns_per_tick();
    pthread_mutex_lock(&mu);
    ns_per_tick = npt;
    if (!seg) create_locked();
    if (seg) {
        for (int i = 0; i < MON_SLOTS; i++) {
            struct gm__mon_slot *s = &seg->slots[i];
            if (s->in_use) continue;
            s->in_use = 1;
            s->device = pool->cfg.device;
            snprintf(s->backend, sizeof s->backend, "%s", pool->ops->name);
            gm__lock(&pool->lock);
            pool->mon = s;
            gm__unlock(&pool->lock);
            break;
        }
    }
    pthread_mutex_unlock(&mu);
}

void gm__monitor_detach(gm_pool_t *pool)
{
    pthread_mutex_lock(&mu);
    gm__lock(&pool->lock);
    struct gm__mon_slot *s = pool->mon;
    pool->mon = NULL;
    gm__unlock(&pool->lock);
    if (s && seg) {
        memset(s->values, 0, sizeof s->values);
        s->in_use = 0;
    }
    pthread_mutex_unlock(&mu);
}

void gm__monitor_unlink(void)
{
    pthread_mutex_lock(&mu);
    if (seg) {
        /* Pools may still point into it at exit: keep the mapping, drop the
         * name (only ours: a forked child shares the mapping, not the name). */
        if (seg->pid == (int32_t)getpid()) unlink(seg_path);
        for (int i = 0; i < MON_SLOTS; i++)
            if (seg->slots[i].in_use) goto keep;
        munmap(seg, sizeof *seg);
    keep:
        seg = NULL;
    }
    pthread_mutex_unlock(&mu);
}

void gm__monitor_atfork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    mu = fresh;
    seg = NULL; /* the parent's mapping stays, unused: its pools are dead here */
}

#define IDX(field) (offsetof(gm_stats_t, field) / 8 - offsetof(gm_stats_t, allocated) / 8)

void gm__monitor_publish_slow_locked(gm_pool_t *pool)
{
    struct gm__mon_slot *s = pool->mon;
    const gm_stats_t *st = &pool->st;
    uint64_t q = atomic_load_explicit(&s->seq, memory_order_relaxed);
    atomic_store_explicit(&s->seq, q + 1, memory_order_relaxed);
    SEQ_FENCE(memory_order_release);
    if (GM_LIKELY(s->values[IDX(reserved)] == st->reserved && s->values[IDX(mapped)] == st->mapped &&
                  s->values[IDX(backend_ns)] != 0)) {
        /* No page moved: only the counters an allocate or a free changes. */
        s->values[IDX(allocated)] = st->allocated;
        s->values[IDX(allocated_peak)] = st->allocated_peak;
        s->values[IDX(active)] = st->active;
        s->values[IDX(active_peak)] = st->active_peak;
        s->values[IDX(cached)] = st->reserved - st->active;
        s->values[IDX(alloc_count)] = st->alloc_count;
        s->values[IDX(free_count)] = st->free_count;
        s->values[IDX(live_blocks)] = st->live_blocks;
        s->values[IDX(allocated_total)] = st->allocated_total;
        s->values[IDX(freed_total)] = st->freed_total;
        s->values[IDX(oom_count)] = st->oom_count;
    } else {
        size_t i = 0;
#define GM__MON_COPY(name, desc) s->values[i++] = st->name;
        GM_STAT_FIELDS(GM__MON_COPY)
#undef GM__MON_COPY
        s->values[IDX(backend_ns)] = (uint64_t)((double)atomic_load_explicit(&pool->bk_calls.ticks, memory_order_relaxed) * ns_per_tick) | 1;
        s->values[IDX(cached)] = st->reserved - st->active;
    }
    atomic_store_explicit(&s->seq, q + 2, memory_order_release);
}

/* A full copy at the next publish (slow paths: trims, OOMs, peak resets). */
void gm__monitor_invalidate_locked(gm_pool_t *pool)
{
    if (pool->mon) pool->mon->values[IDX(backend_ns)] = 0;
}

/* ---- readers ------------------------------------------------------------------- */

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
                start_time_of(m->pid, NULL, 0) == m->start_time;
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
