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
#include <unistd.h>

#include "observe.h"

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

static const char *dir(void)
{
    const char *d = getenv("GPUMEM_MONITOR_DIR");
    return d && *d ? d : "/dev/shm";
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

/* mu held: create the segment. */
static void create_locked(void)
{
    const char *v = getenv("GPUMEM_MONITOR");
    if (v && !strcmp(v, "0")) return;
    snprintf(seg_path, sizeof seg_path, "%s/gpumem.%d", dir(), (int)getpid());
    int fd = open(seg_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return; /* no /dev/shm: the process just is not visible to top */
    if (ftruncate(fd, sizeof(mon_seg_t)) != 0) {
        close(fd);
        unlink(seg_path);
        return;
    }
    void *m = mmap(NULL, sizeof(mon_seg_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        unlink(seg_path);
        return;
    }
    seg = m;
    seg->version = MON_VERSION;
    seg->size = sizeof *seg;
    seg->pid = (int32_t)getpid();
    seg->n_fields = (uint32_t)N_FIELDS;
    seg->start_time = start_time_of(seg->pid, NULL, 0);
    /* The full command line's first word beats the 15-byte comm. */
    FILE *f = fopen("/proc/self/cmdline", "r");
    if (f) {
        size_t n = fread(seg->command, 1, sizeof seg->command - 1, f);
        fclose(f);
        seg->command[n] = '\0';
        const char *base = strrchr(seg->command, '/');
        if (base) memmove(seg->command, base + 1, strlen(base + 1) + 1);
    }
    for (size_t i = 0; i < N_FIELDS; i++)
        snprintf(seg->names[i], GM_MON_NAME, "%s", field_names[i]);
    __atomic_store_n(&seg->magic, MON_MAGIC, __ATOMIC_RELEASE);
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
        s->values[IDX(backend_ns)] = (uint64_t)((double)pool->backend_ticks * ns_per_tick) | 1;
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

static bool read_seg(const char *path, int name_pid, gm__mon_proc_view_t *v)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || (size_t)sb.st_size < sizeof(mon_seg_t)) {
        close(fd);
        return false;
    }
    const mon_seg_t *m = mmap(NULL, sizeof(mon_seg_t), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return false;
    bool ok = __atomic_load_n(&m->magic, __ATOMIC_ACQUIRE) == MON_MAGIC &&
              m->version == MON_VERSION && m->n_fields <= GM_MON_MAX_FIELDS;
    if (ok) {
        memset(v, 0, sizeof *v);
        v->pid = m->pid;
        memcpy(v->command, m->command, sizeof v->command);
        v->command[sizeof v->command - 1] = '\0';
        v->n_fields = m->n_fields;
        memcpy(v->names, m->names, sizeof v->names);
        for (unsigned i = 0; i < v->n_fields; i++) v->names[i][GM_MON_NAME - 1] = '\0';
        /* The process must be alive and the same one (pids are reused). */
        if (m->pid != name_pid) ok = false; /* a copied or corrupt file */
        else if (kill(m->pid, 0) != 0 && errno == ESRCH) ok = false;
        else if (start_time_of(m->pid, NULL, 0) != m->start_time) ok = false;
        for (int i = 0; ok && i < MON_SLOTS; i++) {
            const struct gm__mon_slot *s = &m->slots[i];
            if (!s->in_use) continue;
            gm__mon_pool_view_t *p = &v->pools[v->n_pools];
            for (int tries = 0; tries < 100; tries++) {
                uint64_t q0 = atomic_load_explicit(&s->seq, memory_order_acquire);
                if (q0 & 1) continue;
                memcpy(p->values, (const void *)s->values, sizeof p->values);
                SEQ_FENCE(memory_order_acquire);
                if (atomic_load_explicit(&s->seq, memory_order_relaxed) == q0) break;
            }
            p->device = s->device;
            memcpy(p->backend, s->backend, sizeof p->backend);
            p->backend[sizeof p->backend - 1] = '\0';
            v->n_pools++;
        }
        if (!ok) {
            munmap((void *)m, sizeof(mon_seg_t));
            unlink(path); /* stale: its process is gone */
            return false;
        }
    }
    munmap((void *)m, sizeof(mon_seg_t));
    return ok;
}

int gm__monitor_scan(void (*fn)(const gm__mon_proc_view_t *v, void *arg), void *arg)
{
    DIR *d = opendir(dir());
    if (!d) return -1;
    int n = 0;
    gm__mon_proc_view_t *v = gm__malloc(sizeof *v);
    if (!v) {
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
        if (!read_seg(path, (int)pid, v)) continue;
        fn(v, arg);
        n++;
    }
    closedir(d);
    gm__free(v);
    return n;
}
