/* SPDX-License-Identifier: Apache-2.0 */
/*
 * monitor.c — the writer of the shared statistics segment read by `gpumem
 * top` and `gpumem metrics`: one small file per process, /dev/shm/gpumem.<pid>
 * (or $GPUMEM_MONITOR_DIR/gpumem.<pid>), mapped shared, holding a header (pid,
 * start time, command, the names of the stats fields) and one slot per pool
 * with a copy of its counters (the layout: observe/monitor_seg.h).  The
 * reader is a tool, not part of the library: tools/lib/monitor_read.c.
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
 * once on stderr.  The reader trusts no file either (it validates every
 * field and prints only printable ASCII; see tools/lib/monitor_read.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/options.h"
#include "observe/monitor_seg.h"
#include "observe/observe.h"

/* Seqlock fences.  On x86 stores are not reordered with stores, nor loads
 * with loads, so a compiler barrier is enough (and TSan builds reject
 * atomic_thread_fence); elsewhere a real fence. */
#if defined(__x86_64__) || defined(__i386__)
#define SEQ_FENCE(order) atomic_signal_fence(order)
#else
#define SEQ_FENCE(order) atomic_thread_fence(order)
#endif

static const char *const field_names[] = {
#define GM__MON_NAME(name, desc) #name,
    GM_STAT_FIELDS(GM__MON_NAME)
#undef GM__MON_NAME
    /* Sharing (gm_share_stats), after the stats fields: written by
     * gm__monitor_share, not by the publish below. */
    "share_exported", "share_imported", "share_held",
};
#define N_FIELDS (sizeof field_names / sizeof field_names[0])
_Static_assert(N_FIELDS <= GM_MON_MAX_FIELDS, "raise GM_MON_MAX_FIELDS");

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static mon_seg_t *seg;
/* Set at every attach (always the same value), read by publishes under
 * their pool's lock, not this file's: an atomic, so the two never race. */
static _Atomic double ns_per_tick;
static char seg_path[512];
static bool failure_said;         /* the "no monitor file" note, once */

static const char *dir(void)
{
    return gm__option_str(GM_OPT_MONITOR_DIR);
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
    sg->start_time = gm__mon_start_time(pid);
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
    atomic_store_explicit(&ns_per_tick, npt, memory_order_relaxed);
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
        s->values[IDX(backend_ns)] = (uint64_t)((double)atomic_load_explicit(&pool->bk_calls.ticks, memory_order_relaxed) *
                                                       atomic_load_explicit(&ns_per_tick, memory_order_relaxed)) | 1;
        s->values[IDX(cached)] = st->reserved - st->active;
    }
    atomic_store_explicit(&s->seq, q + 2, memory_order_release);
    pool->mon_countdown = GM_MON_EVERY;
    pool->mon_allocated = st->allocated;
    pool->mon_reserved = st->reserved;
    pool->mon_mapped = st->mapped;
}

void gm__monitor_share(gm_pool_t *pool, uint64_t exported, uint64_t imported, uint64_t held)
{
    gm__lock(&pool->lock);
    struct gm__mon_slot *s = pool->mon;
    if (s) {
        size_t i = sizeof field_names / sizeof field_names[0] - 3;
        uint64_t q = atomic_load_explicit(&s->seq, memory_order_relaxed);
        atomic_store_explicit(&s->seq, q + 1, memory_order_relaxed);
        SEQ_FENCE(memory_order_release);
        s->values[i] = exported;
        s->values[i + 1] = imported;
        s->values[i + 2] = held;
        atomic_store_explicit(&s->seq, q + 2, memory_order_release);
    }
    gm__unlock(&pool->lock);
}

/* A full copy at the next publish (slow paths: trims, OOMs, peak resets). */
void gm__monitor_invalidate_locked(gm_pool_t *pool)
{
    if (pool->mon) pool->mon->values[IDX(backend_ns)] = 0;
}
