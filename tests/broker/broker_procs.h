/* SPDX-License-Identifier: Apache-2.0 */
/*
 * broker_procs.h — what the multi-process broker tests share on top of
 * broker_util.h: child processes on pipes (their CHECK counts come back to
 * the coordinator), a broker started in a child that closes the
 * coordinator's pipes (so a child's end of file is seen), patterns in
 * device blocks, the kernel's own count of the sim's pages a process holds
 * (memfd inodes in /proc/PID/fd and /proc/PID/maps), freezing processes
 * (SIGSTOP until every thread is stopped), a raw client of the wire format
 * (proto.h) and the broker's log.
 *
 * Include test.h and broker_util.h first.  The coordinator (main) makes no
 * pool unless a test says so; children make their own.
 */
#ifndef GM_TEST_BROKER_PROCS_H
#define GM_TEST_BROKER_PROCS_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>

#include "broker/proto.h"

#define BP_WAIT_MS 20000 /* a pipe message not there in this long: the other side hung */

/* Messages over the pipes (one uint64_t each; some carry a value in the
 * next one). */
enum { BP_GO = 1, BP_READY, BP_DONE, BP_STOP, BP_ACK, BP_NEXT, BP_VALUE, BP_FAIL = 0xFA11 };

static int bp_results = -1;   /* write end of the coordinator's result pipe */
static int bp_kid_out = -1;   /* this child's pipe to the coordinator */
static int bp_parent_fds[512];
static int bp_n_parent_fds;

/* A CHECK in a process that may be killed: a failure also goes over its
 * pipe at once, so the coordinator counts it. */
#define KCHECK(c)                                                              \
    do {                                                                       \
        int kc_ = (c);                                                         \
        if (kc_) {                                                             \
            test_passed_++;                                                    \
        } else {                                                               \
            test_failed_++;                                                    \
            fprintf(stderr, "%s:%d: pid %d: CHECK failed: %s\n", __FILE__,     \
                    __LINE__, (int)getpid(), #c);                              \
            if (bp_kid_out >= 0) bp_put(bp_kid_out, BP_FAIL);                  \
        }                                                                      \
    } while (0)

/* gm status check of the same kind, with the message. */
#define KCHECK_RC(expr, want)                                                  \
    do {                                                                       \
        int krc_ = (expr);                                                     \
        if (krc_ == (want)) {                                                  \
            test_passed_++;                                                    \
        } else {                                                               \
            test_failed_++;                                                    \
            fprintf(stderr, "%s:%d: pid %d: %s returned %d, want %d (%s)\n",   \
                    __FILE__, __LINE__, (int)getpid(), #expr, krc_, (int)(want), \
                    gm_last_error());                                          \
            if (bp_kid_out >= 0) bp_put(bp_kid_out, BP_FAIL);                  \
        }                                                                      \
    } while (0)

static inline uint64_t bp_below(uint64_t *s, uint64_t n) { return n ? rng_next(s) % n : 0; }

static inline int bp_is_cuda(void)
{
    const char *b = getenv("GPUMEM_BACKEND");
    return b && !strcmp(b, "cuda");
}

static inline int bp_put(int fd, uint64_t v)
{
    ssize_t n;
    do n = write(fd, &v, sizeof v);
    while (n < 0 && errno == EINTR);
    return n == (ssize_t)sizeof v ? 0 : -1;
}

/* One message within ms; -1 on end of file or timeout. */
static inline int bp_get(int fd, uint64_t *v, int ms)
{
    double end = now_ms() + ms;
    for (;;) {
        int left = (int)(end - now_ms());
        if (left < 0) left = 0;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, left);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        ssize_t n;
        do n = read(fd, v, sizeof *v);
        while (n < 0 && errno == EINTR);
        return n == (ssize_t)sizeof *v ? 0 : -1;
    }
}

/* ---- child processes ---------------------------------------------------------- */

typedef struct bp_kid { pid_t pid; int to, from; } bp_kid_t; /* the coordinator's side */
typedef struct bp_link { int in, out; } bp_link_t;          /* the child's side */

static inline void bp_child_exit(void)
{
    unsigned long r[2] = {test_passed_, test_failed_};
    if (bp_results >= 0 && write(bp_results, r, sizeof r) != (ssize_t)sizeof r)
        fprintf(stderr, "pid %d: cannot report\n", (int)getpid());
    fflush(stdout);
    fflush(stderr);
    _exit(test_failed_ ? 1 : 0);
}

/* The result pipe: every child's CHECK counts arrive there. */
static inline void bp_results_init(int *rd)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) {
        perror("pipe");
        exit(1);
    }
    *rd = p[0];
    bp_results = p[1];
}

static inline void bp_drain_results(int rd)
{
    unsigned long r[2];
    while (read(rd, r, sizeof r) == (ssize_t)sizeof r) {
        test_passed_ += r[0];
        test_failed_ += r[1];
    }
}

/* In a new child: forget the coordinator's pipes, die with it. */
static inline void bp_child_setup(void)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    for (int i = 0; i < bp_n_parent_fds; i++) close(bp_parent_fds[i]);
    bp_n_parent_fds = 0;
    test_passed_ = test_failed_ = 0;
}

/* fork a child running fn(link, arg), then bp_child_exit. */
static inline bp_kid_t bp_spawn(void (*fn)(bp_link_t *, void *), void *arg)
{
    bp_kid_t k = {-1, -1, -1};
    int a[2], b[2];
    if (pipe2(a, O_CLOEXEC) != 0) return k;
    if (pipe2(b, O_CLOEXEC) != 0) {
        close(a[0]);
        close(a[1]);
        return k;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        bp_child_setup();
        close(a[1]);
        close(b[0]);
        bp_link_t l = {a[0], b[1]};
        bp_kid_out = b[1];
        fn(&l, arg);
        bp_child_exit();
    }
    close(a[0]);
    close(b[1]);
    if (pid < 0) {
        close(a[1]);
        close(b[0]);
        return k;
    }
    k = (bp_kid_t){pid, a[1], b[0]};
    if (bp_n_parent_fds + 2 <= (int)(sizeof bp_parent_fds / sizeof *bp_parent_fds)) {
        bp_parent_fds[bp_n_parent_fds++] = a[1];
        bp_parent_fds[bp_n_parent_fds++] = b[0];
    }
    return k;
}

static inline void bp_kid_close(bp_kid_t *k)
{
    for (int i = 0; i < bp_n_parent_fds; i++)
        if (bp_parent_fds[i] == k->to || bp_parent_fds[i] == k->from)
            bp_parent_fds[i--] = bp_parent_fds[--bp_n_parent_fds];
    if (k->to >= 0) close(k->to);
    if (k->from >= 0) close(k->from);
    k->to = k->from = -1;
}

/* Wait for pid at most ms (kill it after): its wait status, or -1. */
static inline int bp_wait(pid_t pid, int ms)
{
    int st;
    double end = now_ms() + ms;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) return st;
        if (r < 0) return -1;
        if (now_ms() > end) break;
        sleep_us(2000);
    }
    fprintf(stderr, "pid %d hung: killed\n", (int)pid);
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
}

static inline int bp_exited_ok(int st) { return st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0; }

/* The next message from k is want (failure counted, with what came). */
static inline int bp_expect(bp_kid_t *k, uint64_t want)
{
    uint64_t v = 0;
    int r;
    /* A failure it reported on the way is counted through the result pipe. */
    while ((r = bp_get(k->from, &v, BP_WAIT_MS)) == 0 && v == BP_FAIL && want != BP_FAIL) {}
    int ok = r == 0 && v == want;
    if (!ok)
        fprintf(stderr, "expected message %llu from pid %d, got %s %llu\n",
                (unsigned long long)want, (int)k->pid, r ? "nothing" : "",
                (unsigned long long)v);
    CHECK(ok);
    return ok;
}

/* The failures k reported over its pipe (BP_FAIL), other messages dropped. */
static inline int bp_fails(bp_kid_t *k)
{
    int n = 0;
    uint64_t v;
    while (bp_get(k->from, &v, 0) == 0) n += v == BP_FAIL;
    return n;
}

/* Kill k (-9) and reap it; its reported failures count. */
static inline void bp_kill(bp_kid_t *k)
{
    CHECK(kill(k->pid, SIGKILL) == 0);
    int st = -1;
    CHECK(waitpid(k->pid, &st, 0) == k->pid);
    if (!(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL))
        fprintf(stderr, "pid %d ended before the kill (status %#x)\n", (int)k->pid, st);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    CHECK(bp_fails(k) == 0);
    bp_kid_close(k);
}

/* ---- the broker ------------------------------------------------------------- */

/* In the broker's child: forget the coordinator's pipes (else a kid's end
 * of file would never come) and die with the coordinator. */
static inline void bp_broker_prep(void)
{
    bp_child_setup();
    bp_results = -1;
}

/* tb_start, with bp_broker_prep in the broker's child. */
static inline void bp_start(test_broker_t *b) { tb_start_with(b, bp_broker_prep); }

/* A pool of the broker with a lease and a release threshold. */
static inline int bp_pool(const test_broker_t *b, size_t lease, size_t release_threshold,
                          gm_pool_t **pool)
{
    gm_pool_config_t cfg;
    gm_config_from_env(&cfg);
    snprintf(cfg.broker, sizeof cfg.broker, "%s", b->sock);
    cfg.broker_lease = lease;
    cfg.release_threshold = release_threshold;
    return gm_pool_create(&cfg, pool);
}

/* The number of open descriptors of a process (-1: gone). */
static inline int bp_fd_count(pid_t pid)
{
    char p[64];
    snprintf(p, sizeof p, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(p);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Occurrences of text in the broker's log. */
static inline int bp_log_count(const test_broker_t *b, const char *text)
{
    FILE *f = fopen(b->log, "r");
    if (!f) return 0;
    char line[2048];
    int n = 0;
    while (fgets(line, sizeof line, f)) n += strstr(line, text) != NULL;
    fclose(f);
    return n;
}

static inline void bp_log_dump(const test_broker_t *b)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "echo '--- broker log:' >&2; tail -n 40 '%s' >&2", b->log);
    if (system(cmd)) {}
}

/* The broker's row of the tenant, and whether the query worked. */
static inline int bp_tenant(const test_broker_t *b, const char *name, gm_broker_tenant_t *out,
                            gm_broker_view_t *whole)
{
    memset(out, 0, sizeof *out);
    gm_broker_view_t v;
    if (gm_broker_query(b->sock, &v) != GM_OK) return 0;
    for (size_t i = 0; i < v.n; i++)
        if (!strcmp(v.tenants[i].name, name)) *out = v.tenants[i];
    if (whole) {
        *whole = v;
        whole->tenants = NULL;
        whole->n = 0;
    }
    free(v.tenants);
    return 1;
}

/* A view of the broker that two readings in a row agree on (the rows of a
 * query are read one by one, so only a quiet broker gives a consistent
 * table): 1, or 0 when it did not settle within ms.  Free v->tenants. */
static inline int bp_quiet_view(const test_broker_t *b, gm_broker_view_t *v, int ms)
{
    gm_broker_view_t a, c;
    memset(v, 0, sizeof *v);
    if (gm_broker_query(b->sock, &a) != GM_OK) return 0;
    double end = now_ms() + ms;
    for (;;) {
        sleep_us(2000);
        if (gm_broker_query(b->sock, &c) != GM_OK) {
            free(a.tenants);
            return 0;
        }
        int same = a.n == c.n && a.device_used == c.device_used;
        for (size_t i = 0; same && i < a.n; i++)
            same = !strcmp(a.tenants[i].name, c.tenants[i].name) &&
                   a.tenants[i].used == c.tenants[i].used &&
                   a.tenants[i].clients == c.tenants[i].clients &&
                   a.tenants[i].cached == c.tenants[i].cached;
        free(a.tenants);
        a = c;
        if (same) {
            *v = a;
            return 1;
        }
        if (now_ms() > end) {
            free(a.tenants);
            return 0;
        }
    }
}

/* ---- data in blocks ------------------------------------------------------------ */

/* The 8-byte word at offset off of a block tagged tag. */
static inline uint64_t bp_word(uint64_t tag, size_t off)
{
    uint64_t z = tag * 0x9E3779B97F4A7C15ull + off;
    return z ^ (z >> 29) ^ 0x5bd1e995ull;
}

#define BP_STRIDE 512 /* one word per this many bytes on the sim */

/* Write block [p, +n) (n >= 8) with tag's pattern: on the sim through the
 * pointer (a word every BP_STRIDE bytes and the last one), on cuda through
 * gm_memset (the tag's byte) and a word at both ends through gm_memcpy. */
static inline int bp_fill(gm_pool_t *pool, void *p, size_t n, uint64_t tag)
{
    if (!bp_is_cuda()) {
        unsigned char *c = p;
        for (size_t o = 0; o + 8 <= n; o += BP_STRIDE) {
            uint64_t w = bp_word(tag, o);
            memcpy(c + o, &w, 8);
        }
        uint64_t w = bp_word(tag, n - 8);
        memcpy(c + n - 8, &w, 8);
        return GM_OK;
    }
    int rc = gm_memset(pool, p, (int)(tag & 0xff), n, NULL);
    uint64_t a = bp_word(tag, 0), z = bp_word(tag, n - 8);
    if (rc == GM_OK) rc = gm_memcpy(pool, p, &a, 8, NULL);
    if (rc == GM_OK) rc = gm_memcpy(pool, (char *)p + n - 8, &z, 8, NULL);
    if (rc == GM_OK) rc = gm_stream_synchronize(pool, NULL);
    return rc;
}

/* Does [p, +n) hold tag's pattern (as bp_fill wrote it)?  1 or 0 (says where). */
static inline int bp_same(gm_pool_t *pool, const void *p, size_t n, uint64_t tag)
{
    if (!bp_is_cuda()) {
        const unsigned char *c = p;
        for (size_t o = 0; o + 8 <= n; o += BP_STRIDE) {
            uint64_t w;
            memcpy(&w, c + o, 8);
            if (w != bp_word(tag, o)) {
                fprintf(stderr, "pid %d: block %p (%zu bytes, tag %#llx): word at %zu is %#llx, "
                        "want %#llx\n", (int)getpid(), p, n, (unsigned long long)tag, o,
                        (unsigned long long)w, (unsigned long long)bp_word(tag, o));
                return 0;
            }
        }
        uint64_t w;
        memcpy(&w, c + n - 8, 8);
        return w == bp_word(tag, n - 8);
    }
    uint64_t a = 0, z = 0;
    unsigned char mid[4096];
    size_t m = n - 16 < sizeof mid ? n - 16 : sizeof mid;
    int ok = gm_memcpy(pool, &a, p, 8, NULL) == GM_OK &&
             gm_memcpy(pool, &z, (const char *)p + n - 8, 8, NULL) == GM_OK &&
             (m == 0 || gm_memcpy(pool, mid, (const char *)p + n / 2 - m / 2, m, NULL) == GM_OK) &&
             gm_stream_synchronize(pool, NULL) == GM_OK;
    ok = ok && a == bp_word(tag, 0) && z == bp_word(tag, n - 8);
    for (size_t i = 0; ok && i < m; i++) ok = mid[i] == (unsigned char)(tag & 0xff);
    if (!ok) fprintf(stderr, "pid %d: block %p (%zu bytes, tag %#llx) changed\n", (int)getpid(), p,
                     n, (unsigned long long)tag);
    return ok;
}

/* ---- the kernel's count of the sim's pages --------------------------------------- */

typedef struct bp_inodes { uint64_t *v; size_t n, cap; } bp_inodes_t;

static inline void bp_inodes_add(bp_inodes_t *s, uint64_t ino)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->v[i] == ino) return;
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 256;
        s->v = realloc(s->v, s->cap * sizeof *s->v);
        if (!s->v) abort();
    }
    s->v[s->n++] = ino;
}

#define BP_SIM_PAGE "/memfd:gpumem-sim-page"

/* Add the inodes of every sim page (memfd) process pid holds, open or
 * mapped, to s.  -1 when /proc/PID is gone. */
static inline int bp_inodes_of(pid_t pid, bp_inodes_t *s)
{
    char p[64], link[300], q[400];
    snprintf(p, sizeof p, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(p);
    if (!d) return -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(q, sizeof q, "%s/%.255s", p, e->d_name);
        ssize_t n = readlink(q, link, sizeof link - 1);
        if (n <= 0) continue;
        link[n] = '\0';
        if (strncmp(link, BP_SIM_PAGE, strlen(BP_SIM_PAGE)) != 0) continue;
        struct stat st;
        if (stat(q, &st) == 0) bp_inodes_add(s, (uint64_t)st.st_ino);
    }
    closedir(d);
    snprintf(p, sizeof p, "/proc/%d/maps", (int)pid);
    FILE *f = fopen(p, "r");
    if (!f) return -1;
    char line[600];
    while (fgets(line, sizeof line, f)) {
        char *m = strstr(line, BP_SIM_PAGE);
        if (!m) continue;
        unsigned long long ino = 0;
        /* start-end perms offset dev inode path */
        if (sscanf(line, "%*s %*s %*s %*s %llu", &ino) == 1 && ino) bp_inodes_add(s, ino);
    }
    fclose(f);
    return 0;
}

/* Is every thread of pid stopped (or is it gone)? */
static inline int bp_all_stopped(pid_t pid)
{
    char p[64], q[400], buf[512];
    snprintf(p, sizeof p, "/proc/%d/task", (int)pid);
    DIR *d = opendir(p);
    if (!d) return 1;
    int ok = 1;
    struct dirent *e;
    while (ok && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(q, sizeof q, "%s/%.255s/stat", p, e->d_name);
        int fd = open(q, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n <= 0) continue;
        buf[n] = '\0';
        char *r = strrchr(buf, ')');
        if (r && r[1] == ' ') ok = r[2] == 'T' || r[2] == 't' || r[2] == 'Z' || r[2] == 'X';
    }
    closedir(d);
    return ok;
}

/* SIGSTOP every pid and wait until all their threads have stopped. */
static inline int bp_freeze(const pid_t *pids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (pids[i] > 0) kill(pids[i], SIGSTOP);
    double end = now_ms() + 5000;
    for (size_t i = 0; i < n; i++) {
        while (pids[i] > 0 && !bp_all_stopped(pids[i])) {
            if (now_ms() > end) return 0;
            sleep_us(200);
        }
    }
    return 1;
}

static inline void bp_thaw(const pid_t *pids, size_t n);

/* With every process of pids stopped and the broker quiet: does tenant's
 * used (*books) equal the pages the kernel sees them hold (*kernel)?  A
 * process stopped while a lease reply is on its way holds less than the
 * broker counts, so a few attempts, letting them run a moment in between;
 * still apart, the kernel must not see more than the books, nor the books
 * more than `slack` bytes (the replies that can be on their way) over the
 * kernel: a lost page adds up round after round, and a test's final
 * used == 0 check sees it.  Sim only (memfd pages). */
static inline int bp_books_match_kernel(const test_broker_t *b, const char *tenant,
                                        const pid_t *pids, size_t n, uint64_t slack,
                                        uint64_t *books, uint64_t *kernel)
{
    for (int attempt = 0; attempt < 10; attempt++) {
        if (attempt) {
            bp_thaw(pids, n);
            sleep_us(3000 + 2000 * attempt);
        }
        if (!bp_freeze(pids, n)) continue;
        gm_broker_view_t v;
        if (!bp_quiet_view(b, &v, 1000)) continue;
        *books = 0;
        for (size_t j = 0; j < v.n; j++)
            if (!strcmp(v.tenants[j].name, tenant)) *books = v.tenants[j].used;
        free(v.tenants);
        bp_inodes_t s = {0};
        for (size_t i = 0; i < n; i++)
            if (pids[i] > 0) bp_inodes_of(pids[i], &s);
        *kernel = (uint64_t)s.n * ((uint64_t)2 << 20); /* the sim's page */
        free(s.v);
        if (*books == *kernel) {
            bp_thaw(pids, n);
            return 1;
        }
    }
    bp_thaw(pids, n);
    return *kernel <= *books && *books - *kernel <= slack;
}

static inline void bp_thaw(const pid_t *pids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (pids[i] > 0) kill(pids[i], SIGCONT);
}

/* ---- a raw client of the wire format ------------------------------------------------ */

static inline void bp_msg(gm__broker_msg_t *m, int type)
{
    memset(m, 0, sizeof *m);
    m->magic = GM__BROKER_MAGIC;
    m->version = GM__BROKER_VERSION;
    m->type = (uint16_t)type;
}

/* A SOCK_SEQPACKET connection to the broker (receive timeout ms); -1 when
 * it cannot be made. */
static inline int bp_raw_connect(const char *path, int ms)
{
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Send len bytes (any, not only a message) with fds attached: 0 or -1. */
static inline int bp_raw_send(int fd, const void *buf, size_t len, const int *fds, size_t nfds)
{
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    union {
        char buf[CMSG_SPACE(sizeof(int) * 64)];
        struct cmsghdr align;
    } u;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (nfds) {
        memset(&u, 0, sizeof u);
        mh.msg_control = u.buf;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
    }
    ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL);
    return n == (ssize_t)len ? 0 : -1;
}

/* Receive one message: 1 a whole message (descriptors into fds, at most
 * cap, *nfds of them; more are closed), 0 the broker closed the
 * connection, -1 a timeout or error, -2 a message of another size. */
static inline int bp_raw_recv(int fd, gm__broker_msg_t *m, int *fds, size_t cap, size_t *nfds)
{
    struct iovec iov = {.iov_base = m, .iov_len = sizeof *m};
    union {
        char buf[CMSG_SPACE(sizeof(int) * 64)];
        struct cmsghdr align;
    } u;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                        .msg_controllen = sizeof u.buf};
    if (nfds) *nfds = 0;
    ssize_t n;
    do n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); n >= 0 && c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        int *in = (int *)CMSG_DATA(c);
        for (size_t i = 0; i < k; i++) {
            if (fds && nfds && *nfds < cap) fds[(*nfds)++] = in[i];
            else close(in[i]);
        }
    }
    if (n < 0) return errno == ECONNRESET ? 0 : -1;
    if (n == 0) return 0;
    return n == (ssize_t)sizeof *m ? 1 : -2;
}

/* Has the broker closed fd (end of file within ms)? */
static inline int bp_raw_closed(int fd, int ms)
{
    double end = now_ms() + ms;
    for (;;) {
        int left = (int)(end - now_ms());
        if (left < 0) left = 0;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, left);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return 0;
        gm__broker_msg_t m;
        size_t nfds = 0;
        int fds[64];
        int k = bp_raw_recv(fd, &m, fds, 64, &nfds);
        for (size_t i = 0; i < nfds; i++) close(fds[i]);
        if (k == 0) return 1;
        if (k == -1 && errno != EAGAIN) return 1;
    }
}

#endif /* GM_TEST_BROKER_PROCS_H */
