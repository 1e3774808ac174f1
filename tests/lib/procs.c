/* SPDX-License-Identifier: Apache-2.0 */
/*
 * procs.c — the multi-process harness of the tests and benches (procs.h):
 * children on pipes, deadlines, kill -9 and reaping, the kernel's view of a
 * process, and a raw peer of the wire format.  Written once here so that a
 * fix to a deadline or to reaping lands in one place.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpumem.h"
#include "base/wire.h"
#include "lib/procs.h"

int tp_kid_out = -1;

static int results_wr = -1;     /* write end of the coordinator's result pipe */
static int parent_fds[512];     /* the parent's ends of its children's pipes */
static int n_parent_fds;
static pid_t kids[1024];        /* children not yet reaped, for tp_kill_all */
static int n_kids;

/* ---- time and messages --------------------------------------------------- */

double tp_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

void tp_sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

int tp_put(int fd, uint64_t v)
{
    ssize_t n;
    do n = write(fd, &v, sizeof v);
    while (n < 0 && errno == EINTR);
    return n == (ssize_t)sizeof v ? 0 : -1;
}

/* poll fd for input until end (ms on tp_now_ms's clock): 1 ready, 0 not. */
static int ready_by(int fd, double end)
{
    for (;;) {
        int left = (int)(end - tp_now_ms());
        if (left < 0) left = 0;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, left);
        if (r < 0 && errno == EINTR) continue;
        return r > 0;
    }
}

int tp_get(int fd, uint64_t *v, int ms)
{
    if (!ready_by(fd, tp_now_ms() + ms)) return -1;
    ssize_t n;
    do n = read(fd, v, sizeof *v);
    while (n < 0 && errno == EINTR);
    return n == (ssize_t)sizeof *v ? 0 : -1;
}

/* ---- children -------------------------------------------------------------- */

void tp_results_init(int *rd)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) {
        perror("pipe");
        exit(1);
    }
    *rd = p[0];
    results_wr = p[1];
}

void tp_results_add(int rd, unsigned long *passed, unsigned long *failed)
{
    unsigned long r[2];
    while (read(rd, r, sizeof r) == (ssize_t)sizeof r) {
        *passed += r[0];
        *failed += r[1];
    }
}

void tp_child_report_exit(unsigned long passed, unsigned long failed)
{
    unsigned long r[2] = {passed, failed};
    if (results_wr >= 0 && write(results_wr, r, sizeof r) != (ssize_t)sizeof r)
        fprintf(stderr, "pid %d: cannot report\n", (int)getpid());
    fflush(stdout);
    fflush(stderr);
    _exit(failed ? 1 : 0);
}

void tp_child_setup(void)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    for (int i = 0; i < n_parent_fds; i++) close(parent_fds[i]);
    n_parent_fds = 0;
    n_kids = 0;
}

void tp_results_forget(void) { results_wr = -1; }

static void kid_forget(pid_t pid)
{
    for (int i = 0; i < n_kids; i++)
        if (kids[i] == pid) kids[i--] = kids[--n_kids];
}

tp_kid_t tp_spawn_with(void (*run)(tp_child_fn, tp_link_t *, void *), tp_child_fn fn, void *arg)
{
    tp_kid_t k = {-1, -1, -1, 0};
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
        tp_child_setup();
        close(a[1]);
        close(b[0]);
        tp_link_t l = {a[0], b[1]};
        tp_kid_out = b[1];
        run(fn, &l, arg);
        _exit(0); /* run ends with tp_child_exit */
    }
    close(a[0]);
    close(b[1]);
    if (pid < 0) {
        close(a[1]);
        close(b[0]);
        return k;
    }
    k = (tp_kid_t){pid, a[1], b[0], 0};
    if (n_parent_fds + 2 <= (int)(sizeof parent_fds / sizeof *parent_fds)) {
        parent_fds[n_parent_fds++] = a[1];
        parent_fds[n_parent_fds++] = b[0];
    }
    if (n_kids < (int)(sizeof kids / sizeof *kids)) kids[n_kids++] = pid;
    return k;
}

void tp_kid_close(tp_kid_t *k)
{
    for (int i = 0; i < n_parent_fds; i++)
        if (parent_fds[i] == k->to || parent_fds[i] == k->from)
            parent_fds[i--] = parent_fds[--n_parent_fds];
    if (k->to >= 0) close(k->to);
    if (k->from >= 0) close(k->from);
    k->to = k->from = -1;
}

int tp_wait(pid_t pid, int ms)
{
    int st;
    double end = tp_now_ms() + ms;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            kid_forget(pid);
            return st;
        }
        if (r < 0) return -1;
        if (tp_now_ms() > end) break;
        tp_sleep_us(2000);
    }
    fprintf(stderr, "pid %d hung: killed\n", (int)pid);
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    kid_forget(pid);
    return -1;
}

int tp_go_and_wait(tp_kid_t *k, int ms)
{
    if (k->pid <= 0 || tp_put(k->to, 1) != 0) return -1;
    tp_kid_close(k);
    int st = tp_wait(k->pid, ms);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int tp_exited_ok(int st) { return st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0; }

int tp_next_msg(tp_kid_t *k, uint64_t *v, int ms)
{
    int r;
    /* A failure reported on the way is kept for tp_fails. */
    while ((r = tp_get(k->from, v, ms)) == 0 && *v == TP_FAIL) k->fails++;
    return r;
}

int tp_expect_msg(tp_kid_t *k, uint64_t want, int ms)
{
    uint64_t v = 0;
    int r = want == TP_FAIL ? tp_get(k->from, &v, ms) : tp_next_msg(k, &v, ms);
    int ok = r == 0 && v == want;
    if (!ok)
        fprintf(stderr, "pid %d: expected message %llu from pid %d, got %s%llu\n", (int)getpid(),
                (unsigned long long)want, (int)k->pid, r ? "nothing " : "",
                (unsigned long long)v);
    return ok;
}

int tp_fails(tp_kid_t *k)
{
    uint64_t v;
    while (k->from >= 0 && tp_get(k->from, &v, 0) == 0) k->fails += v == TP_FAIL;
    return k->fails;
}

tp_killed_t tp_kill9(tp_kid_t *k)
{
    tp_killed_t r = {0, 0, 0, 0};
    r.sent = kill(k->pid, SIGKILL) == 0;
    int st = -1;
    r.reaped = waitpid(k->pid, &st, 0) == k->pid;
    kid_forget(k->pid);
    r.by_kill = r.reaped && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
    if (r.reaped && !r.by_kill)
        fprintf(stderr, "pid %d ended before the kill (status %#x)\n", (int)k->pid, st);
    r.fails = tp_fails(k);
    return r;
}

int tp_role_run(const char *name, void (*run)(void (*)(void)), void (*fn)(void), int rd, int ms,
                unsigned long *passed, unsigned long *failed)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        run(fn);
        _exit(0); /* run ends with tp_child_exit */
    }
    if (pid < 0) return -2;
    int st = -1;
    double end = tp_now_ms() + ms;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) break;
        if (tp_now_ms() > end) {
            fprintf(stderr, "%s: hung; killed\n", name);
            kill(-pid, SIGKILL);
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            st = -1;
            break;
        }
        tp_results_add(rd, passed, failed);
        tp_sleep_us(5000);
    }
    /* Helpers of the role that outlived it (none should). */
    kill(-pid, SIGKILL);
    tp_results_add(rd, passed, failed);
    return st;
}

void tp_track(pid_t pid)
{
    if (pid > 0 && n_kids < (int)(sizeof kids / sizeof *kids)) kids[n_kids++] = pid;
}

void tp_untrack(pid_t pid) { kid_forget(pid); }

void tp_kill_all(void)
{
    for (int i = 0; i < n_kids; i++) kill(kids[i], SIGKILL);
    for (int i = 0; i < n_kids; i++) waitpid(kids[i], NULL, 0);
    n_kids = 0;
}

static void kill_all_on_signal(int sig)
{
    for (int i = 0; i < n_kids; i++) kill(kids[i], SIGKILL);
    signal(sig, SIG_DFL);
    raise(sig);
}

void tp_kill_all_at_exit(void)
{
    static int done;
    if (done++) return;
    atexit(tp_kill_all);
    signal(SIGINT, kill_all_on_signal);
    signal(SIGTERM, kill_all_on_signal);
    signal(SIGHUP, kill_all_on_signal);
}

/* ---- what the kernel sees ------------------------------------------------------ */

int tp_fd_count(pid_t pid) { return tp_fd_count_to(pid, NULL); }

int tp_fd_count_to(pid_t pid, const char *prefix)
{
    char p[64];
    snprintf(p, sizeof p, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(p);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (prefix) {
            char link[64 + 256], target[256];
            snprintf(link, sizeof link, "%s/%.255s", p, e->d_name);
            ssize_t len = readlink(link, target, sizeof target - 1);
            if (len < 0) continue; /* closed meanwhile */
            target[len] = '\0';
            if (strncmp(target, prefix, strlen(prefix)) != 0) continue;
        }
        n++;
    }
    closedir(d);
    return n;
}

static void inodes_add(tp_inodes_t *s, uint64_t ino)
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

void tp_inodes_free(tp_inodes_t *s)
{
    free(s->v);
    s->v = NULL;
    s->n = s->cap = 0;
}

int tp_sim_pages_of(pid_t pid, tp_inodes_t *s)
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
        if (strncmp(link, TP_SIM_PAGE, strlen(TP_SIM_PAGE)) != 0) continue;
        struct stat st;
        if (stat(q, &st) == 0) inodes_add(s, (uint64_t)st.st_ino);
    }
    closedir(d);
    snprintf(p, sizeof p, "/proc/%d/maps", (int)pid);
    FILE *f = fopen(p, "r");
    if (!f) return -1;
    char line[600];
    while (fgets(line, sizeof line, f)) {
        if (!strstr(line, TP_SIM_PAGE)) continue;
        unsigned long long ino = 0;
        /* start-end perms offset dev inode path */
        if (sscanf(line, "%*s %*s %*s %*s %llu", &ino) == 1 && ino) inodes_add(s, ino);
    }
    fclose(f);
    return 0;
}

int tp_all_stopped(pid_t pid)
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

int tp_freeze(const pid_t *pids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (pids[i] > 0) kill(pids[i], SIGSTOP);
    double end = tp_now_ms() + 5000;
    for (size_t i = 0; i < n; i++) {
        while (pids[i] > 0 && !tp_all_stopped(pids[i])) {
            if (tp_now_ms() > end) return 0;
            tp_sleep_us(200);
        }
    }
    return 1;
}

void tp_thaw(const pid_t *pids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (pids[i] > 0) kill(pids[i], SIGCONT);
}

/* ---- a raw peer of the wire format --------------------------------------------- */

int tp_raw_connect(const char *path, int ms)
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

int tp_raw_send(int fd, const void *buf, size_t len, const int *fds, size_t nfds)
{
    if (nfds <= GM__WIRE_FDS_MAX)
        return gm__wire_send(fd, buf, len, fds, nfds, 0, "raw peer") == GM_OK ? 0 : -1;
    /* More descriptors than the library ever attaches: only a hostile peer
     * sends these, in a control buffer of this harness's size. */
    if (nfds > TP_RAW_FDS_MAX) return -1;
    union {
        char b[CMSG_SPACE(sizeof(int) * TP_RAW_FDS_MAX)];
        struct cmsghdr align;
    } u;
    return gm__wire_sendmsg(fd, buf, len, fds, nfds, 0, u.b, sizeof u.b) == (ssize_t)len ? 0 : -1;
}

ssize_t tp_raw_recv(int fd, void *buf, size_t len, int *fds, size_t cap, size_t *nfds, int ms)
{
    if (nfds) *nfds = 0;
    if (ms >= 0 && !ready_by(fd, tp_now_ms() + ms)) return -1;
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    union {
        char b[CMSG_SPACE(sizeof(int) * TP_RAW_FDS_MAX)];
        struct cmsghdr align;
    } u;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b,
                        .msg_controllen = sizeof u.b};
    ssize_t n;
    do n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | (ms >= 0 ? MSG_DONTWAIT : 0));
    while (n < 0 && errno == EINTR);
    int saved = errno;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); n >= 0 && c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        int *in = (int *)CMSG_DATA(c);
        for (size_t i = 0; i < k; i++) {
            if (fds && nfds && *nfds < cap) fds[(*nfds)++] = in[i];
            else close(in[i]);
            if (!fds && nfds) (*nfds)++;
        }
    }
    errno = saved;
    if (n < 0) return errno == ECONNRESET ? 0 : -1;
    return n;
}

int tp_raw_closed(int fd, int ms)
{
    double end = tp_now_ms() + ms;
    for (;;) {
        if (!ready_by(fd, end)) return 0;
        char m[4096];
        int k = (int)tp_raw_recv(fd, m, sizeof m, NULL, 0, NULL, 0);
        if (k == 0) return 1;
        if (k == -1 && errno != EAGAIN) return 1;
    }
}
