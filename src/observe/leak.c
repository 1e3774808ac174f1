/* SPDX-License-Identifier: Apache-2.0 */
/*
 * leak.c — the leak tracker: a call stack per live allocation, and the leak
 * report ("Leaked N bytes at 0x..." + stack, then "LEAK SUMMARY: ...") at
 * pool destruction, at process exit and through gm_leak_report().
 *
 * The one idea: pay for stacks only when asked (GPUMEM_LEAK_CHECK), capture
 * them with glibc's backtrace() before taking the pool lock (it walks the
 * unwind tables: about a microsecond, see docs/observability.md), keep the
 * raw return addresses in a per-pool table (base/hash.h), and turn them
 * into names only when a report is printed (dladdr; addr2line for file:line
 * in the stderr reports when it is installed).  The sizes and addresses of a
 * report come from the pool's own live table, so gm_leak_report works with
 * tracking off too.
 */
#include <dlfcn.h>
#include <execinfo.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/kinds.h"
#include "core/options.h"
#include "observe/observe.h"

static int leak_mode;        /* 0 off, 1 report, 2 report and exit status */
static atomic_int leaked_at_destroy; /* a pool destroyed with leaks (mode 2) */

/* The stack of one live allocation.  The entries are kept densely in one
 * array (grown by doubling, so tracking costs no host allocation per
 * block); the pool's table (base/hash.h) maps an address to its entry's
 * index + 1, and a deletion moves the last entry into the hole. */
typedef struct leak_entry {
    uintptr_t ptr;
    int n;
    void *frames[GM_LEAK_MAX_FRAMES];
} leak_entry_t;

struct gm__leak_table {
    gm__hash_t index;        /* address -> (void *)(entry index + 1) */
    leak_entry_t *e;
    size_t count, cap;
};

/* ---- capture and table ------------------------------------------------------ */

int gm__leak_capture(void **frames)
{
    int n = backtrace(frames, GM_LEAK_MAX_FRAMES);
    return n > 0 ? n : 0;
}

static leak_entry_t *entry_of(const struct gm__leak_table *t, uintptr_t ptr)
{
    uintptr_t i = (uintptr_t)gm__hash_get(&t->index, ptr);
    return i ? &t->e[i - 1] : NULL;
}

/* Out of host memory, the allocation simply goes untracked. */
void gm__leak_add_locked(gm_pool_t *pool, uintptr_t ptr, void *const *frames, int n)
{
    struct gm__leak_table *t = pool->leaks;
    if (!t) {
        t = pool->leaks = gm__calloc(1, sizeof *t);
        if (!t) return;
    }
    leak_entry_t *e = t->index.cap ? entry_of(t, ptr) : NULL;
    if (!e) {
        if (gm__hash_reserve(&t->index) != GM_OK) return;
        if (t->count == t->cap) {
            size_t cap = t->cap ? t->cap * 2 : 256;
            leak_entry_t *grown = gm__realloc(t->e, cap * sizeof *grown);
            if (!grown) return;
            t->e = grown;
            t->cap = cap;
        }
        e = &t->e[t->count++];
        e->ptr = ptr;
        /* cannot fail: room reserved */
        (void)gm__hash_put(&t->index, ptr, (void *)(uintptr_t)t->count);
    }
    e->n = n;
    memcpy(e->frames, frames, (size_t)n * sizeof frames[0]);
}

void gm__leak_del_locked(gm_pool_t *pool, uintptr_t ptr)
{
    struct gm__leak_table *t = pool->leaks;
    if (!t || !t->count) return;
    uintptr_t i = (uintptr_t)gm__hash_take(&t->index, ptr);
    if (!i) return;
    leak_entry_t *last = &t->e[t->count - 1];
    if (i != t->count) { /* move the last entry into the hole */
        t->e[i - 1] = *last;
        void **slot = gm__hash_slot(&t->index, last->ptr);
        gm_assert_internal(slot != NULL);
        *slot = (void *)i;
    }
    t->count--;
}

void *const *gm__leak_stack_locked(gm_pool_t *pool, uintptr_t ptr, int *n)
{
    struct gm__leak_table *t = pool->leaks;
    *n = 0;
    if (!t || !t->count) return NULL;
    leak_entry_t *e = entry_of(t, ptr);
    if (!e) return NULL;
    *n = e->n;
    return e->frames;
}

void gm__leak_fini(gm_pool_t *pool)
{
    struct gm__leak_table *t = pool->leaks;
    if (!t) return;
    gm__hash_fini(&t->index);
    gm__free(t->e);
    gm__free(t);
    pool->leaks = NULL;
}

/* ---- symbols -------------------------------------------------------------------- */

/* Is addr inside libgpumem (the .so, or the executable it is linked into
 * statically)?  Frames there are the allocator's own and not shown. */
static bool ours(void *addr)
{
    Dl_info self, it;
    /* Any function of the library names its object; this file's own keeps
     * the leak tracker from calling up into the entry points (src/FLOORS). */
    if (!dladdr((void *)gm__leak_capture, &self) || !dladdr(addr, &it)) return false;
    if (it.dli_fbase != self.dli_fbase) return false;
    /* libgpumem.so: every frame in it.  Linked statically into a program:
     * only the gm_ functions, when the program exports its symbols. */
    if (self.dli_fname && strstr(self.dli_fname, "libgpumem")) return true;
    return it.dli_sname && !strncmp(it.dli_sname, "gm_", 3);
}

/* "fn+0x12 (object)" or "0xaddr (object+0xoff)". Never allocates. */
static void symbolize(void *addr, char *buf, size_t cap)
{
    Dl_info di;
    if (dladdr(addr, &di) && di.dli_fname) {
        const char *obj = strrchr(di.dli_fname, '/');
        obj = obj ? obj + 1 : di.dli_fname;
        if (di.dli_sname)
            snprintf(buf, cap, "%s+%#lx (%s)", di.dli_sname,
                     (unsigned long)((uintptr_t)addr - (uintptr_t)di.dli_saddr), obj);
        else
            snprintf(buf, cap, "%s+%#lx", obj,
                     (unsigned long)((uintptr_t)addr - (uintptr_t)di.dli_fbase));
    } else {
        snprintf(buf, cap, "%p", addr);
    }
}

/* The frames worth showing: skip the allocator's own. */
static int first_user_frame(void *const *frames, int n)
{
    /* A sanitizer's backtrace interceptor may come first: skip up to two
     * frames that are not ours before ours begin, then ours. */
    int i = 0;
    while (i < n && i < 2 && !ours(frames[i])) i++;
    if (i == n || !ours(frames[i])) i = 0;
    while (i < n && ours(frames[i])) i++;
    return i < n ? i : 0;
}

int gm__leak_first_user_frame(void *const *frames, int n) { return first_user_frame(frames, n); }

void gm__leak_site(void *const *frames, int n, char *buf, size_t cap)
{
    if (cap) buf[0] = '\0';
    if (n <= 0) return;
    symbolize(frames[first_user_frame(frames, n)], buf, cap);
}

/* file:line of addr by addr2line, when installed (stderr reports only). */
static bool addr2line(void *addr, char *buf, size_t cap)
{
    static int have = -1;
    if (have < 0) have = access("/usr/bin/addr2line", X_OK) == 0;
    Dl_info di;
    if (!have || !dladdr(addr, &di) || !di.dli_fname) return false;
    char cmd[1024];
    /* A return address points after the call: look up the byte before it. */
    uintptr_t off = (uintptr_t)addr - 1;
    const char *exe = di.dli_fname;
    char self[512];
    if (!exe[0] || strchr(exe, '\'')) {
        ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
        if (k <= 0) return false;
        self[k] = '\0';
        exe = self;
    }
    /* Position-independent objects: the offset from the load address. */
    off -= (uintptr_t)di.dli_fbase;
    snprintf(cmd, sizeof cmd, "/usr/bin/addr2line -f -e '%s' %#lx 2>/dev/null", exe,
             (unsigned long)off);
    FILE *p = popen(cmd, "r");
    if (!p) return false;
    char fn[256], line[512];
    bool ok = fgets(fn, sizeof fn, p) && fgets(line, sizeof line, p);
    pclose(p);
    if (!ok) return false;
    fn[strcspn(fn, "\n")] = '\0';
    line[strcspn(line, "\n")] = '\0';
    if (!strncmp(line, "??", 2) && !strncmp(fn, "??", 2)) return false;
    size_t a = strlen(fn) < cap - 1 ? strlen(fn) : cap - 1;
    memcpy(buf, fn, a);
    buf[a] = '\0';
    if (a + 1 < cap) {
        buf[a] = ' ';
        size_t b = strlen(line) < cap - a - 2 ? strlen(line) : cap - a - 2;
        memcpy(buf + a + 1, line, b);
        buf[a + 1 + b] = '\0';
    }
    return true;
}

void gm__leak_describe(void *addr, char *buf, size_t cap)
{
    char sym[256], line[512];
    symbolize(addr, sym, sizeof sym);
    if (addr2line(addr, line, sizeof line)) snprintf(buf, cap, "%.120s at %.120s", sym, line);
    else snprintf(buf, cap, "%s", sym);
}

/* ---- reports ------------------------------------------------------------------- */

typedef struct out {
    char *buf;   /* NULL: count only */
    size_t cap, at;
    FILE *f;     /* or print here */
    bool lines;  /* add file:line (stderr reports) */
} out_t;

GM_PRINTF(2, 3) static void put(out_t *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (o->f) {
        vfprintf(o->f, fmt, ap);
    } else {
        int n = vsnprintf(o->buf ? o->buf + (o->at < o->cap ? o->at : o->cap) : NULL,
                          o->at < o->cap ? o->cap - o->at : 0, fmt, ap);
        if (n > 0) o->at += (size_t)n;
    }
    va_end(ap);
}

typedef struct one_arg {
    gm_pool_t *pool;
    out_t *o;
    uint64_t *bytes, *count;
} one_arg_t;

/* One leaked allocation (of any kind of memory the caller has to free). */
static void report_block_locked(uintptr_t addr, size_t size, void *arg)
{
    one_arg_t *a = arg;
    gm_pool_t *pool = a->pool;
    out_t *o = a->o;
    uint64_t *count = a->count;
    put(o, "Leaked %zu bytes at %#lx\n", size, (unsigned long)addr);
    *a->bytes += size;
    *count += 1;
    {
        int n;
        void *const *fr = gm__leak_stack_locked(pool, addr, &n);
        if (!fr) {
            put(o, "    (stack not recorded: run with GPUMEM_LEAK_CHECK=1)\n");
            return;
        }
        for (int k = first_user_frame(fr, n), d = 0; k < n; k++, d++) {
            char sym[256], line[512];
            symbolize(fr[k], sym, sizeof sym);
            if (o->lines && *count <= 64 && addr2line(fr[k], line, sizeof line))
                put(o, "    #%d %p %s at %s\n", d, fr[k], sym, line);
            else
                put(o, "    #%d %p %s\n", d, fr[k], sym);
        }
    }
}

/* One pool's leaks (a heap or the root), lock held: kind by kind, in the
 * table's order. */
static void report_pool_locked(gm_pool_t *pool, out_t *o, uint64_t *bytes, uint64_t *count)
{
    one_arg_t a = {pool, o, bytes, count};
    const gm__kind_ops_t *const *rows = gm__kinds_rows(pool);
    for (unsigned k = 0; rows[k]; k++)
        if (rows[k]->foreach) rows[k]->foreach(pool, report_block_locked, &a);
}

static void count_one(uintptr_t addr, size_t size, void *arg)
{
    (void)addr, (void)size;
    (*(size_t *)arg)++;
}

typedef struct all_arg {
    out_t *o;
    uint64_t bytes, count;
} all_arg_t;

static void report_one(gm_pool_t *pool, void *arg)
{
    all_arg_t *a = arg;
    gm_pool_t *h;
    for (unsigned i = 0; (h = gm__heap_next(pool, &i));) {
        gm__lock(&h->lock);
        report_pool_locked(h, a->o, &a->bytes, &a->count);
        gm__unlock(&h->lock);
    }
}

int gm_leak_report(gm_pool_t *pool, char *buf, size_t cap, size_t *len)
{
    if (!buf && cap) return gm__set_error(GM_INVALID_ARGUMENT, "gm_leak_report: buf is NULL");
    if (pool) GM_CHECK(gm__pool_resolve(&pool, "gm_leak_report"));
    out_t o = {buf, cap, 0, NULL, false};
    all_arg_t a = {&o, 0, 0};
    if (pool) report_one(pool, &a);
    else gm__registry_foreach(report_one, &a);
    put(&o, "LEAK SUMMARY: %llu bytes leaked in %llu allocations\n", (unsigned long long)a.bytes,
        (unsigned long long)a.count);
    if (len) *len = o.at;
    if (cap && o.at >= cap) {
        buf[cap - 1] = '\0';
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_leak_report: needs %zu bytes, got %zu",
                             o.at + 1, cap);
    }
    return GM_OK;
}

void gm__leak_report_stderr(gm_pool_t *pool, uint64_t *bytes, uint64_t *count)
{
    out_t o = {NULL, 0, 0, stderr, true};
    *bytes = *count = 0;
    gm__lock(&pool->lock);
    size_t n = 0;
    const gm__kind_ops_t *const *rows = gm__kinds_rows(pool);
    for (unsigned k = 0; rows[k]; k++)
        if (rows[k]->foreach) rows[k]->foreach(pool, count_one, &n);
    bool any = n > 0;
    if (any) report_pool_locked(pool, &o, bytes, count);
    gm__unlock(&pool->lock);
    if (!any) return;
    fprintf(stderr, "LEAK SUMMARY: %llu bytes leaked in %llu allocations (pool destroyed)\n",
            (unsigned long long)*bytes, (unsigned long long)*count);
    if (leak_mode == 2) atomic_store(&leaked_at_destroy, 1);
}

bool gm__leak_reporting(void) { return leak_mode || atomic_load(&gm__leak_on); }

int gm_leak_tracking(int enabled)
{
    if (enabled) {
        void *warm[4];
        backtrace(warm, 4); /* the first call loads the unwinder: not inside an allocation */
    }
    atomic_store(&gm__leak_on, enabled ? 1 : 0);
    return GM_OK;
}

void gm__leak_init_env(void)
{
    int mode = (int)gm__option_num(GM_OPT_LEAK_CHECK);
    if (!mode) return;
    leak_mode = mode;
    gm_leak_tracking(1);
}

void gm__leak_at_exit(void)
{
    if (!leak_mode) return;
    out_t o = {NULL, 0, 0, stderr, true};
    all_arg_t a = {&o, 0, 0};
    gm__registry_foreach(report_one, &a);
    fprintf(stderr, "LEAK SUMMARY: %llu bytes leaked in %llu allocations\n",
            (unsigned long long)a.bytes, (unsigned long long)a.count);
    if (leak_mode == 2 && (a.count || atomic_load(&leaked_at_destroy))) {
        fflush(NULL);
        _exit(GM_LEAK_EXIT_STATUS);
    }
}
