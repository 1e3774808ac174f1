/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_share_hostile.c — a hostile peer against a share server.  The server
 * runs in this process (its own thread); the peer is a raw AF_UNIX
 * SOCK_SEQPACKET socket speaking the wire format of src/share/share.h badly:
 * wrong sizes, magic, version, type, unterminated strings, descriptors
 * attached, PAGES outside what it imported, imports left half-way, more
 * connections than max_peers, requests without reading the replies, and
 * seeded random garbage.  After each: a well-behaved client still imports,
 * peers_dropped grew by one for a malformed message (and only then), and
 * once the hostile socket is closed the server holds no descriptor more
 * than before.  Also the rules of gm_share_listen for what is at its path
 * (a file, a link, a directory, live listeners, stale sockets, a listener
 * whose accept queue is full), the name/token checks on both sides, a
 * server out of descriptors (it must not spin), and children of fork()
 * made while the server is busy (their own pools must work: no lock of the
 * parent's server thread may be copied held).
 *
 * Deterministic given the seed (argv[1]); the random part is the garbage.
 * The fork test is a race by nature: it forks 40 children while busy peers
 * keep the server thread in and out of its lock (pinned to another CPU).
 */
// ctest-valgrind: skip
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/sockios.h>

#include "gpumem.h"
#include "share/share.h"
#include "test.h"
#include "share_util.h"
#include "lib/procs.h"

#define MiB ((size_t)1 << 20)
#define G_SIZE (4 * MiB)
/* How long the server may take to do what a test waits for (a peer gone,
 * its mappings let go, a request read): generous, since the wait ends as
 * soon as it is done and the server's pace is the machine's (the whole suite
 * at ctest -j6 on two cores, a sanitizer build).  A wait for the server to
 * get through a flood gives up only once it has made no progress for this
 * long. */
#define SERVER_MS 60000
#define G_TAG 77u

static unsigned long long g_seed = 0x4057113ull;
static char g_path[108];
static gm_pool_t *sp, *cp; /* the server's pool, the good client's pool */
static gm_share_server_t *srv;
static int g_fd_base;
static size_t g_page;
static void *g_good;

/* ---- helpers ---------------------------------------------------------------- */

static double cpu_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static gm_share_stats_t sstats(gm_pool_t *p)
{
    gm_share_stats_t s = GM_SHARE_STATS_INIT;
    CHECK_OK(gm_share_stats(p, &s));
    return s;
}

static void msg_init(gm__share_msg_t *m, int type)
{
    memset(m, 0, sizeof *m);
    m->magic = GM__SHARE_MAGIC;
    m->version = GM__SHARE_VERSION;
    m->type = (uint16_t)type;
}

static void msg_import(gm__share_msg_t *m, const char *name, const char *token)
{
    msg_init(m, GM__SHARE_IMPORT);
    snprintf(m->name, sizeof m->name, "%s", name);
    if (token) snprintf(m->token, sizeof m->token, "%s", token);
}

/* buf[0..len) with nfds descriptors attached, as a hostile peer sends it
 * (tests/lib/procs.h); 0 or -1. */
static int send_raw(int fd, const void *buf, size_t len, const int *fds, int nfds)
{
    return tp_raw_send(fd, buf, len, fds, (size_t)nfds);
}

static int send_msg(int fd, const gm__share_msg_t *m) { return send_raw(fd, m, sizeof *m, NULL, 0); }

/* One message within ms: its size (0: closed), -1 (timeout or error).
 * Descriptors attached go to fds (cap) or are closed; their number in *nfds. */
static ssize_t recv_msg(int fd, gm__share_msg_t *m, int *fds, int cap, int *nfds, int ms)
{
    size_t n = 0;
    ssize_t r = tp_raw_recv(fd, m, sizeof *m, fds, (size_t)cap, &n, ms);
    if (nfds) *nfds = (int)n;
    return r;
}

/* Connect a raw peer; *status: the greeting's status (-1: none). */
static int raw_connect(const char *path, int *status)
{
    *status = -1;
    int fd = tp_raw_connect(path, 60000);
    if (fd < 0) return -1;
    gm__share_msg_t m;
    if (recv_msg(fd, &m, NULL, 0, NULL, 2000) == (ssize_t)sizeof m &&
        m.type == GM__SHARE_REPLY && m.magic == GM__SHARE_MAGIC)
        *status = m.status;
    return fd;
}

/* The server hangs up on fd within ms (replies before that are read). */
static int wait_closed(int fd, int ms)
{
    double end = now_ms() + ms;
    for (;;) {
        int left = (int)(end - now_ms());
        if (left < 0) return 0;
        gm__share_msg_t m;
        int nf = 0;
        ssize_t n = recv_msg(fd, &m, NULL, 0, &nf, left);
        if (n == 0) return 1;
        if (n < 0 && now_ms() >= end) return 0;
    }
}

/* A raw IMPORT answered: the id (0: refused or no answer). */
static uint64_t raw_import(int fd, const char *name, const char *token, gm__share_msg_t *out)
{
    gm__share_msg_t m;
    msg_import(&m, name, token);
    if (send_msg(fd, &m) != 0) return 0;
    if (recv_msg(fd, &m, NULL, 0, NULL, 2000) != (ssize_t)sizeof m) return 0;
    if (out) *out = m;
    return m.type == GM__SHARE_REPLY && m.status == GM_OK ? m.id : 0;
}

/* A well-behaved client imports "good" and reads it. */
static int good_works(void)
{
    gm_share_client_t *c = NULL;
    int rc = gm_share_connect(cp, g_path, &c);
    if (rc != GM_OK) {
        fprintf(stderr, "good client: connect: %d %s\n", rc, gm_last_error());
        return 0;
    }
    void *p = NULL;
    size_t n = 0;
    int ok = 1;
    rc = gm_share_import(c, "good", NULL, &p, &n, NULL);
    if (rc != GM_OK) {
        fprintf(stderr, "good client: import: %d %s\n", rc, gm_last_error());
        ok = 0;
    } else {
        ok = n == G_SIZE && sh_same(cp, p, G_TAG, 0, 4096) &&
             sh_same(cp, (char *)p + G_SIZE - 4096, G_TAG, G_SIZE - 4096, 4096);
        if (gm_share_release(c, p, NULL) != GM_OK) ok = 0;
    }
    if (gm_share_disconnect(c) != GM_OK) ok = 0;
    return ok;
}

/* After a hostile peer is gone: the server works, dropped grew by
 * want_drop, no peer, no mapping, no descriptor left. */
static void settle(const char *what, uint64_t dropped0, int want_drop)
{
    WAIT_FOR(sstats(sp).peers == 0, SERVER_MS); /* room under max_peers */
    int ok = good_works();
    if (!ok) fprintf(stderr, "%s: the good client failed\n", what);
    CHECK(ok);
    WAIT_FOR(sstats(sp).peers == 0 && sstats(sp).exported_bytes == 0, SERVER_MS);
    gm_share_stats_t s = sstats(sp);
    if (s.peers || s.exported_bytes || s.peers_dropped != dropped0 + (uint64_t)want_drop)
        fprintf(stderr, "%s: peers %llu exported %llu dropped %llu (want %llu)\n", what,
                (unsigned long long)s.peers, (unsigned long long)s.exported_bytes,
                (unsigned long long)s.peers_dropped,
                (unsigned long long)(dropped0 + (uint64_t)want_drop));
    CHECK(s.peers == 0 && s.exported_bytes == 0);
    CHECK(s.peers_dropped == dropped0 + (uint64_t)want_drop);
    WAIT_FOR(fd_count() == g_fd_base, SERVER_MS);
    if (fd_count() != g_fd_base)
        fprintf(stderr, "%s: %d descriptors, %d before\n", what, fd_count(), g_fd_base);
    CHECK(fd_count() == g_fd_base);
}

/* A raw connection to the server, checked; the peers the server has
 * dropped so far, read just before, in *d0 (where settle starts). */
static int raw_peer(uint64_t *d0)
{
    *d0 = sstats(sp).peers_dropped;
    int st;
    int fd = raw_connect(g_path, &st);
    CHECK(fd >= 0 && st == GM_OK);
    return fd;
}

/* One hostile connection: send buf (with descriptors), the server must
 * hang up; then settle. */
static void one_raw(const char *what, const void *buf, size_t len, const int *fds, int nfds,
                    int want_drop)
{
    uint64_t d0;
    int fd = raw_peer(&d0);
    if (fd < 0) return;
    CHECK(send_raw(fd, buf, len, fds, nfds) == 0);
    int closed = wait_closed(fd, 2000);
    if (!closed) fprintf(stderr, "%s: the server kept the connection\n", what);
    CHECK(closed);
    close(fd);
    settle(what, d0, want_drop);
}

static void one_msg(const char *what, const gm__share_msg_t *m)
{
    one_raw(what, m, sizeof *m, NULL, 0, 1);
}

/* A peer that imports "good" first (the import is live), then sends m
 * (m->id is set to the import's id when m->id == 1). */
static void after_import(const char *what, gm__share_msg_t m, int want_drop)
{
    uint64_t d0;
    int fd = raw_peer(&d0);
    if (fd < 0) return;
    gm__share_msg_t r;
    memset(&r, 0, sizeof r);
    uint64_t id = raw_import(fd, "good", NULL, &r);
    CHECK(id != 0 && r.npages == G_SIZE / g_page && r.size == G_SIZE && r.offset == 0);
    WAIT_FOR(sstats(sp).exported_bytes == G_SIZE, SERVER_MS);
    CHECK(sstats(sp).exported_bytes == G_SIZE);
    if (m.id == 1) m.id = id;
    CHECK(send_msg(fd, &m) == 0);
    if (want_drop) {
        int closed = wait_closed(fd, 2000);
        if (!closed) fprintf(stderr, "%s: the server kept the connection\n", what);
        CHECK(closed);
    }
    close(fd);
    settle(what, d0, want_drop);
}

/* Descriptors we attach: copies of a pipe's write end.  Once every copy is
 * closed (ours and any the server received), the read end sees EOF. */
static void with_fds(const char *what, const gm__share_msg_t *m, int nfds)
{
    int pp[2];
    CHECK(pipe2(pp, O_CLOEXEC) == 0);
    int fds[253];
    for (int i = 0; i < nfds; i++) fds[i] = pp[1];
    uint64_t d0;
    int fd = raw_peer(&d0);
    CHECK(send_raw(fd, m, sizeof *m, fds, nfds) == 0);
    close(pp[1]);
    int closed = wait_closed(fd, 2000);
    if (!closed) fprintf(stderr, "%s: the server kept the connection\n", what);
    CHECK(closed);
    close(fd);
    /* Every copy the server was handed is closed again. */
    struct pollfd p = {.fd = pp[0], .events = POLLIN};
    char c;
    int eof = poll(&p, 1, 1000) == 1 && read(pp[0], &c, 1) == 0;
    if (!eof) fprintf(stderr, "%s: a descriptor passed to the server is still open\n", what);
    CHECK(eof);
    close(pp[0]);
    settle(what, d0, 1);
}

/* ---- gm_share_listen on a path whose listener never accepts ------------------ */

/* In a child made before this process has any pool: a foreign listener at
 * the path with a full accept queue.  gm_share_listen must say
 * GM_INVALID_STATE (a live server is there), not wait forever. */
static void full_backlog_child(const char *path)
{
    int l = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, 0) != 0) _exit(3);
    for (int i = 0; i < 16; i++) { /* fill the accept queue */
        int c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (connect(c, (struct sockaddr *)&a, sizeof a) != 0) break;
    }
    gm_pool_t *p = test_pool(64 * MiB, 0);
    if (!p) _exit(4);
    gm_share_server_t *s = NULL;
    int rc = gm_share_listen(p, path, NULL, &s);
    _exit(rc == GM_INVALID_STATE ? 0 : 5);
}

static void test_full_backlog(void)
{
    char path[108];
    snprintf(path, sizeof path, "%s/gm-sh-bk-%d.sock", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getpid());
    unlink(path);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) full_backlog_child(path);
    CHECK(pid > 0);
    if (pid < 0) return;
    int st = -1, done = 0;
    double end = now_ms() + SERVER_MS;
    while (now_ms() < end && !(done = waitpid(pid, &st, WNOHANG) == pid)) sleep_ms(5);
    if (!done) {
        fprintf(stderr, "gm_share_listen on a path whose listener's accept queue is full: no "
                        "answer in %d s (blocked in connect)\n", SERVER_MS / 1000);
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    CHECK(done && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    unlink(path);
}

/* ---- the listener's path ---------------------------------------------------- */

static void test_listen_paths(void)
{
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char p[108];
    gm_share_server_t *s2 = NULL;

    /* A regular file: refused, untouched. */
    snprintf(p, sizeof p, "%s/gm-sh-file-%d", tmp, (int)getpid());
    FILE *f = fopen(p, "w");
    CHECK(f != NULL);
    if (f) { fputs("precious\n", f); fclose(f); }
    chmod(p, 0640);
    CHECK_RC(gm_share_listen(cp, p, NULL, &s2), GM_INVALID_STATE);
    CHECK(s2 == NULL);
    struct stat st;
    char buf[32] = {0};
    f = fopen(p, "r");
    CHECK(f && fgets(buf, sizeof buf, f) && strcmp(buf, "precious\n") == 0);
    if (f) fclose(f);
    CHECK(lstat(p, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0777) == 0640);

    /* A symbolic link to it: refused; link and file untouched. */
    char l[108];
    snprintf(l, sizeof l, "%s/gm-sh-link-%d", tmp, (int)getpid());
    unlink(l);
    CHECK(symlink(p, l) == 0);
    CHECK_RC(gm_share_listen(cp, l, NULL, &s2), GM_INVALID_STATE);
    CHECK(lstat(l, &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(lstat(p, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 9);
    unlink(l);
    unlink(p);

    /* A directory. */
    snprintf(p, sizeof p, "%s/gm-sh-dir-%d", tmp, (int)getpid());
    rmdir(p);
    CHECK(mkdir(p, 0700) == 0);
    CHECK_RC(gm_share_listen(cp, p, NULL, &s2), GM_INVALID_STATE);
    CHECK(lstat(p, &st) == 0 && S_ISDIR(st.st_mode));
    rmdir(p);

    /* The live server's own path: refused, and it keeps serving. */
    uint64_t d0 = sstats(sp).peers_dropped;
    CHECK_RC(gm_share_listen(cp, g_path, NULL, &s2), GM_INVALID_STATE);
    CHECK_RC(gm_share_listen(sp, g_path, NULL, &s2), GM_INVALID_STATE);
    CHECK(access(g_path, F_OK) == 0);
    settle("listen on the live path", d0, 0);

    /* Other live listeners (not gpumem): a stream one, a seqpacket one. */
    snprintf(p, sizeof p, "%s/gm-sh-live-%d.sock", tmp, (int)getpid());
    for (int type = 0; type < 2; type++) {
        unlink(p);
        int fd = socket(AF_UNIX, (type ? SOCK_SEQPACKET : SOCK_STREAM) | SOCK_CLOEXEC, 0);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        snprintf(a.sun_path, sizeof a.sun_path, "%s", p);
        CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 8) == 0);
        CHECK_RC(gm_share_listen(cp, p, NULL, &s2), GM_INVALID_STATE);
        CHECK(lstat(p, &st) == 0 && S_ISSOCK(st.st_mode));
        close(fd);
        unlink(p);
    }

    /* Stale sockets (bound, closed, never unlinked): replaced. */
    for (int type = 0; type < 2; type++) {
        unlink(p);
        int fd = socket(AF_UNIX, (type ? SOCK_SEQPACKET : SOCK_STREAM) | SOCK_CLOEXEC, 0);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        snprintf(a.sun_path, sizeof a.sun_path, "%s", p);
        CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
        if (type) CHECK(listen(fd, 8) == 0);
        close(fd);
        CHECK(lstat(p, &st) == 0 && S_ISSOCK(st.st_mode));
        s2 = NULL;
        CHECK_OK(gm_share_listen(cp, p, NULL, &s2));
        if (!s2) continue;
        /* It serves: cp publishes, sp's client imports. */
        void *blk = NULL;
        CHECK_OK(gm_alloc_shareable(cp, 2 * MiB, NULL, &blk));
        CHECK_OK(sh_fill(cp, blk, 91, 0, 2 * MiB));
        CHECK_OK(gm_share_publish(s2, "stale", blk, 2 * MiB, GM_SHARE_READ_ONLY, NULL, NULL));
        gm_share_client_t *c = NULL;
        CHECK_OK(gm_share_connect(sp, p, &c));
        void *q = NULL;
        if (c) {
            CHECK_OK(gm_share_import(c, "stale", NULL, &q, NULL, NULL));
            if (q) CHECK(sh_same(sp, q, 91, 0, 2 * MiB));
            CHECK_OK(gm_share_disconnect(c));
        }
        CHECK_OK(gm_share_close(s2));
        CHECK(access(p, F_OK) != 0);
        CHECK_OK(gm_free(cp, blk, NULL));
        CHECK_OK(gm_trim(cp, 0, NULL));
    }

    /* Paths that are not paths. */
    CHECK_RC(gm_share_listen(cp, NULL, NULL, &s2), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_share_listen(cp, "", NULL, &s2), GM_INVALID_ARGUMENT);
    char longp[200];
    memset(longp, 'x', sizeof longp - 1);
    longp[0] = '/';
    longp[sizeof longp - 1] = 0;
    CHECK_RC(gm_share_listen(cp, longp, NULL, &s2), GM_INVALID_ARGUMENT);
    gm_share_client_t *c = NULL;
    CHECK_RC(gm_share_connect(cp, longp, &c), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_share_connect(cp, NULL, &c), GM_INVALID_ARGUMENT);
    CHECK(c == NULL);
    gm_share_policy_t bad = GM_SHARE_POLICY_INIT;
    bad.version = 99;
    CHECK_RC(gm_share_listen(cp, p, &bad, &s2), GM_INVALID_ARGUMENT);
    CHECK(access(p, F_OK) != 0);
}

/* ---- names and tokens ------------------------------------------------------- */

static void test_names(void)
{
    gm_share_client_t *c = NULL;
    CHECK_OK(gm_share_connect(cp, g_path, &c));
    if (!c) return;
    void *p = NULL;
    uint64_t d0 = sstats(sp).peers_dropped;

    CHECK_RC(gm_share_import(c, "no-such-name", NULL, &p, NULL, NULL), GM_INVALID_ARGUMENT);
    CHECK(strstr(gm_last_error(), "no-such-name") != NULL);
    CHECK(p == NULL);
    CHECK_RC(gm_share_import(c, "tok", "wrong", &p, NULL, NULL), GM_DENIED);
    CHECK(strstr(gm_last_error(), "tok") != NULL);
    CHECK_RC(gm_share_import(c, "tok", NULL, &p, NULL, NULL), GM_DENIED);
    CHECK_RC(gm_share_import(c, "tok", "", &p, NULL, NULL), GM_DENIED);
    CHECK_RC(gm_share_import(c, "tok", "t0k3", &p, NULL, NULL), GM_DENIED);
    CHECK_RC(gm_share_import(c, "tok", "t0k3nn", &p, NULL, NULL), GM_DENIED);
    /* Refusals leave the connection usable. */
    size_t n = 0;
    int acc = -1;
    CHECK_OK(gm_share_import(c, "tok", "t0k3n", &p, &n, &acc));
    CHECK(p && n == MiB && acc == GM_SHARE_READ_ONLY);
    if (p) CHECK(sh_same(cp, p, G_TAG, MiB + 5, MiB));
    if (p) CHECK_OK(gm_share_release(c, p, NULL));

    char n63[64], n64[65];
    memset(n63, 'a', 63);
    n63[63] = 0;
    memset(n64, 'b', 64);
    n64[64] = 0;
    const char *bad[] = {NULL, "", n64, "has space", "tab\there", "del\x7f", "caf\xc3\xa9",
                         "\x01"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        p = (void *)1;
        CHECK_RC(gm_share_import(c, bad[i], NULL, &p, NULL, NULL), GM_INVALID_ARGUMENT);
        CHECK(p == NULL);
        CHECK_RC(gm_share_publish(srv, bad[i], NULL, 1, GM_SHARE_READ_WRITE, NULL, NULL),
                 GM_INVALID_ARGUMENT);
        CHECK_RC(gm_share_unpublish(srv, bad[i]), GM_INVALID_ARGUMENT);
    }
    /* Tokens: at most 63 printable characters. */
    CHECK_RC(gm_share_import(c, "tok", n64, &p, NULL, NULL), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_share_import(c, "tok", "with space", &p, NULL, NULL), GM_INVALID_ARGUMENT);

    /* The longest name works end to end. */
    void *blk = NULL;
    CHECK_OK(gm_alloc_shareable(sp, 2 * MiB, NULL, &blk));
    CHECK_OK(sh_fill(sp, blk, 93, 0, 2 * MiB));
    CHECK_RC(gm_share_publish(srv, n64, blk, 2 * MiB, GM_SHARE_READ_WRITE, NULL, NULL),
             GM_INVALID_ARGUMENT);
    CHECK_RC(gm_share_publish(srv, "x", blk, 2 * MiB, GM_SHARE_READ_WRITE, n64, NULL),
             GM_INVALID_ARGUMENT);
    CHECK_OK(gm_share_publish(srv, n63, blk, 2 * MiB, GM_SHARE_READ_WRITE, n63, NULL));
    CHECK_OK(gm_share_import(c, n63, n63, &p, &n, NULL));
    CHECK(p && n == 2 * MiB);
    if (p) CHECK(sh_same(cp, p, 93, 0, 2 * MiB));
    if (p) CHECK_OK(gm_share_release(c, p, NULL));
    CHECK_OK(gm_share_unpublish(srv, n63));
    CHECK_RC(gm_share_unpublish(srv, n63), GM_INVALID_ARGUMENT);
    CHECK_RC(gm_share_import(c, n63, n63, &p, NULL, NULL), GM_INVALID_ARGUMENT);
    CHECK_OK(gm_share_disconnect(c));
    WAIT_FOR(sstats(sp).exported_bytes == 0, SERVER_MS);
    CHECK_OK(gm_free(sp, blk, NULL));
    CHECK_OK(gm_trim(sp, 0, NULL)); /* its page's descriptor too (sim) */

    /* Names the client API refuses, sent raw: a refusal, not a crash, and
     * the peer is not dropped for asking. */
    int st;
    int fd = raw_connect(g_path, &st);
    CHECK(fd >= 0 && st == GM_OK);
    const char *raw[] = {"has space", "\x01\x02", "", n63};
    for (size_t i = 0; fd >= 0 && i < sizeof raw / sizeof *raw; i++) {
        gm__share_msg_t r;
        memset(&r, 0, sizeof r);
        uint64_t id = raw_import(fd, raw[i], NULL, &r);
        CHECK(id == 0 && r.type == GM__SHARE_REPLY && r.status == GM_INVALID_ARGUMENT);
        CHECK(memchr(r.text, 0, sizeof r.text) != NULL);
    }
    gm__share_msg_t r;
    CHECK(fd >= 0 && raw_import(fd, "good", NULL, &r) != 0);
    if (fd >= 0) close(fd);
    settle("names", d0, 0);
}

/* ---- the hostile peers ------------------------------------------------------ */

static void test_malformed(void)
{
    gm__share_msg_t m;
    unsigned char big[sizeof m + 1];

    msg_import(&m, "good", NULL);
    one_raw("one byte short", &m, sizeof m - 1, NULL, 0, 1);
    memcpy(big, &m, sizeof m);
    big[sizeof m] = 0;
    one_raw("one byte long", big, sizeof big, NULL, 0, 1);
    one_raw("one byte", &m, 1, NULL, 0, 1);
    unsigned char *huge = calloc(1, 65536);
    if (huge) {
        memcpy(huge, &m, sizeof m);
        one_raw("64 KiB", huge, 65536, NULL, 0, 1);
        free(huge);
    }
    {
        /* An empty message reads like the end of the connection: the peer
         * goes; whether it is counted as dropped is not asked. */
        uint64_t d0;
        int fd = raw_peer(&d0);
        CHECK(send_raw(fd, &m, 0, NULL, 0) == 0);
        CHECK(wait_closed(fd, 2000));
        close(fd);
        printf("an empty message: the peer is gone, %s\n",
               sstats(sp).peers_dropped > d0 ? "counted as dropped" : "not counted as dropped");
        settle("empty message", d0, (int)(sstats(sp).peers_dropped - d0));
    }

    msg_import(&m, "good", NULL);
    m.magic = 0x47534d48u;
    one_msg("bad magic", &m);
    msg_import(&m, "good", NULL);
    m.magic = 0;
    one_msg("zero magic", &m);
    msg_import(&m, "good", NULL);
    m.version = 0;
    one_msg("version 0", &m);
    msg_import(&m, "good", NULL);
    m.version = GM__SHARE_VERSION + 1;
    one_msg("version 2", &m);
    msg_import(&m, "good", NULL);
    m.version = 0xffff;
    one_msg("version 0xffff", &m);
    const uint16_t types[] = {0, GM__SHARE_HELLO, GM__SHARE_REPLY, 7, 99, 0xffff};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        char what[64];
        snprintf(what, sizeof what, "type %u", types[i]);
        msg_import(&m, "good", NULL);
        m.type = types[i];
        one_msg(what, &m);
    }
    msg_import(&m, "good", NULL);
    memset(m.name, 'A', sizeof m.name);
    one_msg("unterminated name", &m);
    msg_import(&m, "good", NULL);
    memset(m.token, 'B', sizeof m.token);
    one_msg("unterminated token", &m);
    msg_import(&m, "good", NULL);
    memset(m.text, 'C', sizeof m.text);
    one_msg("unterminated text", &m);

    /* Descriptors attached: to a good IMPORT, a RELEASE; one, many, too many. */
    msg_import(&m, "good", NULL);
    with_fds("IMPORT with a descriptor", &m, 1);
    with_fds("IMPORT with 64 descriptors", &m, 64);
    with_fds("IMPORT with 200 descriptors", &m, 200);
    msg_init(&m, GM__SHARE_PAGES);
    m.id = 1;
    m.count = 1;
    with_fds("PAGES with a descriptor", &m, 3);

    /* Requests about imports it never made. */
    const uint64_t ids[] = {0, 1, 12345, UINT64_MAX};
    for (size_t i = 0; i < sizeof ids / sizeof *ids; i++) {
        char what[64];
        snprintf(what, sizeof what, "PAGES of id %llu never imported", (unsigned long long)ids[i]);
        msg_init(&m, GM__SHARE_PAGES);
        m.id = ids[i];
        m.count = 1;
        one_msg(what, &m);
        snprintf(what, sizeof what, "RELEASE of id %llu never imported",
                 (unsigned long long)ids[i]);
        msg_init(&m, GM__SHARE_RELEASE);
        m.id = ids[i];
        one_msg(what, &m);
        snprintf(what, sizeof what, "RANGES of id %llu never imported",
                 (unsigned long long)ids[i]);
        msg_init(&m, GM__SHARE_RANGES);
        m.id = ids[i];
        m.count = 1;
        one_msg(what, &m);
    }

    /* PAGES outside the import (m.id = 1: the import's id). */
    uint64_t np = G_SIZE / g_page;
    struct { const char *what; uint64_t first, count, id; } bad[] = {
        {"PAGES count 0", 0, 0, 1},
        {"PAGES count 1000", 0, 1000, 1},
        {"PAGES count 65", 0, GM__SHARE_FDS_MAX + 1, 1},
        {"PAGES count 2^64-1", 0, UINT64_MAX, 1},
        {"PAGES first = npages", np, 1, 1},
        {"PAGES first 2^64-1", UINT64_MAX, 1, 1},
        {"PAGES past the end", 1, np, 1},
        {"PAGES first 2^63 count 2^63", (uint64_t)1 << 63, (uint64_t)1 << 63, 1},
        {"PAGES of the next id", 0, 1, 0},
    };
    /* RANGES outside the import ("good" is one range). */
    struct { const char *what; uint64_t first, count, id; } badr[] = {
        {"RANGES count 0", 0, 0, 1},
        {"RANGES count 17", 0, GM__SHARE_RANGES_PER_MSG + 1, 1},
        {"RANGES count 1000", 0, 1000, 1},
        {"RANGES first 1", 1, 1, 1},
        {"RANGES first 2^64-1", UINT64_MAX, 1, 1},
        {"RANGES of another id", 0, 1, 0},
    };
    for (size_t i = 0; i < sizeof badr / sizeof *badr; i++) {
        msg_init(&m, GM__SHARE_RANGES);
        m.first = badr[i].first;
        m.count = badr[i].count;
        m.id = badr[i].id ? badr[i].id : 1000000;
        after_import(badr[i].what, m, 1);
    }
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        msg_init(&m, GM__SHARE_PAGES);
        m.first = bad[i].first;
        m.count = bad[i].count;
        m.id = bad[i].id;
        if (m.id == 0) m.id = 1000000; /* not its import */
        after_import(bad[i].what, m, 1);
    }
    /* A RELEASE twice: the second one is of nothing. */
    {
        uint64_t d0;
        int fd = raw_peer(&d0);
        uint64_t id = raw_import(fd, "good", NULL, NULL);
        CHECK(id != 0);
        msg_init(&m, GM__SHARE_RELEASE);
        m.id = id;
        CHECK(send_msg(fd, &m) == 0);
        WAIT_FOR(sstats(sp).exported_bytes == 0, SERVER_MS);
        CHECK(sstats(sp).exported_bytes == 0 && sstats(sp).peers == 1);
        CHECK(send_msg(fd, &m) == 0);
        CHECK(wait_closed(fd, 2000));
        close(fd);
        settle("RELEASE twice", d0, 1);
    }
    /* Several imports held, then garbage: every one of them is let go. */
    {
        uint64_t d0;
        int fd = raw_peer(&d0);
        for (int i = 0; i < 3; i++) CHECK(raw_import(fd, "good", NULL, NULL) != 0);
        CHECK(raw_import(fd, "tok", "t0k3n", NULL) != 0);
        WAIT_FOR(sstats(sp).exported_bytes == 3 * G_SIZE + 2 * g_page, SERVER_MS);
        CHECK(sstats(sp).exported_bytes == 3 * G_SIZE + 2 * g_page);
        msg_import(&m, "good", NULL);
        m.magic ^= 1;
        CHECK(send_msg(fd, &m) == 0);
        CHECK(wait_closed(fd, 2000));
        close(fd);
        settle("imports, then garbage", d0, 1);
    }
}

static void test_well_formed_raw(void)
{
    gm__share_msg_t m;
    /* A whole import by hand: the descriptors come, one per page. */
    {
        uint64_t d0;
        int fd = raw_peer(&d0);
        gm__share_msg_t r;
        uint64_t id = raw_import(fd, "good", NULL, &r);
        CHECK(id != 0 && r.page_size == g_page && r.npages == G_SIZE / g_page);
        msg_init(&m, GM__SHARE_PAGES);
        m.id = id;
        m.first = 0;
        m.count = r.npages;
        CHECK(send_msg(fd, &m) == 0);
        int fds[GM__SHARE_FDS_MAX], nf = 0;
        ssize_t n = recv_msg(fd, &r, fds, GM__SHARE_FDS_MAX, &nf, 2000);
        CHECK(n == (ssize_t)sizeof r && r.status == GM_OK && r.nfds == m.count &&
              (uint64_t)nf == m.count);
        for (int i = 0; i < nf; i++) {
            struct stat st2;
            if (test_backend() == GM_BACKEND_SIM)
                CHECK(fstat(fds[i], &st2) == 0 && S_ISREG(st2.st_mode) &&
                      (size_t)st2.st_size == g_page);
            close(fds[i]);
        }
        /* Where its one range lies: page 0, offset 0, the whole size. */
        msg_init(&m, GM__SHARE_RANGES);
        m.id = id;
        m.count = 1;
        CHECK(send_msg(fd, &m) == 0);
        gm__share_msg_t rr;
        n = recv_msg(fd, &rr, NULL, 0, &nf, 2000);
        CHECK(n == (ssize_t)sizeof rr && rr.status == GM_OK && nf == 0 && rr.rng[0][0] == 0 &&
              rr.rng[0][1] == 0 && rr.rng[0][2] == G_SIZE);
        /* The same pages again, one at a time, and the last alone. */
        for (uint64_t first = 0; first < r.npages; first++) {
            msg_init(&m, GM__SHARE_PAGES);
            m.id = id;
            m.first = first;
            m.count = 1;
            CHECK(send_msg(fd, &m) == 0);
            gm__share_msg_t r2;
            n = recv_msg(fd, &r2, fds, GM__SHARE_FDS_MAX, &nf, 2000);
            CHECK(n == (ssize_t)sizeof r2 && r2.status == GM_OK && nf == 1);
            for (int i = 0; i < nf; i++) close(fds[i]);
        }
        msg_init(&m, GM__SHARE_RELEASE);
        m.id = id;
        CHECK(send_msg(fd, &m) == 0);
        WAIT_FOR(sstats(sp).exported_bytes == 0, SERVER_MS);
        CHECK(sstats(sp).exported_bytes == 0);
        close(fd);
        settle("a raw import", d0, 0);
    }
    /* Mid-import: IMPORT, then the peer goes without a PAGES. */
    {
        msg_init(&m, GM__SHARE_IMPORT); /* after_import sends m: nothing here */
        uint64_t d0;
        int fd = raw_peer(&d0);
        for (int i = 0; i < 5; i++) CHECK(raw_import(fd, "good", NULL, NULL) != 0);
        WAIT_FOR(sstats(sp).exported_bytes == 5 * G_SIZE, SERVER_MS);
        CHECK(sstats(sp).exported_bytes == 5 * G_SIZE && sstats(sp).peers == 1);
        close(fd);
        settle("IMPORT, then gone", d0, 0);
    }
    /* Mid-PAGES: half the pages taken, then gone (shutdown, then close). */
    {
        uint64_t d0;
        int fd = raw_peer(&d0);
        uint64_t id = raw_import(fd, "good", NULL, NULL);
        msg_init(&m, GM__SHARE_PAGES);
        m.id = id;
        m.count = 1;
        CHECK(send_msg(fd, &m) == 0);
        CHECK(send_msg(fd, &m) == 0); /* the reply of this one is never read */
        gm__share_msg_t r;
        int nf = 0;
        CHECK(recv_msg(fd, &r, NULL, 0, &nf, 2000) == (ssize_t)sizeof r && nf == 1);
        shutdown(fd, SHUT_WR);
        CHECK(wait_closed(fd, 2000));
        close(fd);
        settle("PAGES, then gone", d0, 0);
    }
}

static void test_max_peers(void)
{
    uint64_t d0 = sstats(sp).peers_dropped, r0 = sstats(sp).peers_refused;
    int fds[4], st;
    for (int i = 0; i < 4; i++) {
        fds[i] = raw_connect(g_path, &st);
        CHECK(fds[i] >= 0 && st == GM_OK);
    }
    WAIT_FOR(sstats(sp).peers == 4, SERVER_MS);
    CHECK(sstats(sp).peers == 4);
    /* The fifth: told why, and hung up on. */
    int fd5 = raw_connect(g_path, &st);
    CHECK(fd5 >= 0 && st == GM_LIMIT);
    if (fd5 >= 0) {
        CHECK(wait_closed(fd5, 2000));
        close(fd5);
    }
    gm_share_client_t *c = NULL;
    CHECK_RC(gm_share_connect(cp, g_path, &c), GM_LIMIT);
    CHECK(c == NULL);
    CHECK(strstr(gm_last_error(), "peers") != NULL);
    gm_share_stats_t s = sstats(sp);
    CHECK(s.peers == 4 && s.peers_refused == r0 + 2);
    /* Many more knocking at once: all answered and closed. */
    int extra[40];
    for (int i = 0; i < 40; i++) {
        extra[i] = raw_connect(g_path, &st);
        CHECK(extra[i] >= 0 && st == GM_LIMIT);
    }
    for (int i = 0; i < 40; i++) if (extra[i] >= 0) close(extra[i]);
    /* The four still get answers. */
    for (int i = 0; i < 4; i++) CHECK(fds[i] >= 0 && raw_import(fds[i], "good", NULL, NULL) != 0);
    for (int i = 0; i < 4; i++) if (fds[i] >= 0) close(fds[i]);
    settle("max_peers", d0, 0);
    CHECK(sstats(sp).peers_refused == r0 + 42);
}

/* Flood helpers: the server's progress, read again and again. */
static int g_outq_fd = -1;
static uint64_t exported_now(void) { return sstats(sp).exported_bytes; }
static uint64_t outq_now(void) /* bytes we sent that the server has not read yet */
{
    int q = -1;
    return g_outq_fd >= 0 && ioctl(g_outq_fd, SIOCOUTQ, &q) == 0 && q >= 0 ? (uint64_t)q : UINT64_MAX;
}

/* Wait until value() == want; give up (0) only after SERVER_MS in which the
 * value did not change: the server is then stuck, not slow. */
static int wait_progress_u64(uint64_t (*value)(void), uint64_t want)
{
    uint64_t last = value();
    double idle_since = now_ms();
    while (last != want) {
        if (now_ms() - idle_since > SERVER_MS) {
            fprintf(stderr, "the server made no progress in %d ms: at %llu, want %llu\n",
                    SERVER_MS, (unsigned long long)last, (unsigned long long)want);
            return 0;
        }
        sleep_us(1000);
        uint64_t v = value();
        if (v != last) {
            last = v;
            idle_since = now_ms();
        }
    }
    return 1;
}

/* Send m over fd up to want times without reading a reply; sending stops
 * only once the server has taken no request for SERVER_MS (how fast it
 * reads is the machine's business).  How many were sent. */
static int send_unread(int fd, const gm__share_msg_t *m, int want)
{
    int sent = 0;
    double end = now_ms() + SERVER_MS;
    while (fd >= 0 && sent < want && now_ms() < end) {
        ssize_t n = send(fd, m, sizeof *m, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n == (ssize_t)sizeof *m) {
            sent++;
            end = now_ms() + SERVER_MS;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) break;
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        poll(&p, 1, 100);
    }
    return sent;
}

/* Requests without reading the replies: the server must not block on us. */
static void test_flood(void)
{
    uint64_t d0 = sstats(sp).peers_dropped;
    int st;
    /* a: IMPORTs, none of the replies read. */
    int fa = raw_connect(g_path, &st);
    CHECK(fa >= 0 && st == GM_OK);
    enum { NIMP = 3000, NPAGES = 2000 };
    gm__share_msg_t m;
    msg_import(&m, "good", NULL);
    int sent = send_unread(fa, &m, NIMP);
    CHECK(sent == NIMP);
    wait_progress_u64(&exported_now, (uint64_t)sent * G_SIZE);
    CHECK(sstats(sp).exported_bytes == (uint64_t)sent * G_SIZE);
    /* b: PAGES of a real import, none of the replies (each with its
     * descriptors) read. */
    int fb = raw_connect(g_path, &st);
    CHECK(fb >= 0 && st == GM_OK);
    uint64_t id = fb >= 0 ? raw_import(fb, "good", NULL, NULL) : 0;
    CHECK(id != 0);
    msg_init(&m, GM__SHARE_PAGES);
    m.id = id;
    m.count = G_SIZE / g_page;
    int sentb = send_unread(fb, &m, NPAGES);
    CHECK(sentb == NPAGES);
    /* Until the server has read every request we sent (as long as it gets
     * on with them). */
    g_outq_fd = fb;
    CHECK(fb >= 0 && wait_progress_u64(&outq_now, 0));
    int outq = (int)outq_now();
    CHECK(outq == 0);
    /* Meanwhile a good client is served. */
    gm_share_client_t *c = NULL;
    CHECK_OK(gm_share_connect(cp, g_path, &c));
    void *p = NULL;
    if (c) {
        CHECK_OK(gm_share_import(c, "good", NULL, &p, NULL, NULL));
        if (p) CHECK(sh_same(cp, p, G_TAG, 0, 4096));
        CHECK_OK(gm_share_disconnect(c));
    }
    WAIT_FOR(sstats(sp).peers == 2, SERVER_MS);
    /* The server kept no descriptor of the replies it could not deliver:
     * two peers (theirs) and our two sockets. */
    WAIT_FOR(fd_count() == g_fd_base + 4, SERVER_MS);
    if (fd_count() != g_fd_base + 4)
        fprintf(stderr, "flood: %d descriptors, want %d\n", fd_count(), g_fd_base + 4);
    CHECK(fd_count() == g_fd_base + 4);
    /* The replies that did come: read, their descriptors counted. */
    int replies = 0, got_fds = 0;
    for (;;) {
        gm__share_msg_t r;
        int nf = 0;
        ssize_t n = recv_msg(fb, &r, NULL, 0, &nf, 0);
        if (n <= 0) break;
        replies++;
        got_fds += nf;
    }
    CHECK(replies >= 1 && got_fds == replies * (int)m.count);
    /* The connection still works in order: one more request, one answer. */
    gm__share_msg_t r;
    CHECK(fb >= 0 && raw_import(fb, "no-such", NULL, &r) == 0 && r.status == GM_INVALID_ARGUMENT);
    printf("flood: %d IMPORTs and %d PAGES sent unread; %d PAGES replies were delivered\n",
           sent, sentb, replies);
    CHECK(sstats(sp).peers_dropped == d0);
    if (fa >= 0) close(fa);
    if (fb >= 0) close(fb);
    settle("flood", d0, 0);
}

/* Seeded garbage: random bytes, and well-formed headers with random fields. */
static void test_garbage(uint64_t seed)
{
    uint64_t rng = seed;
    uint64_t d0 = sstats(sp).peers_dropped;
    int conns = 0;
    for (int i = 0; i < 300; i++) {
        int st;
        int fd = raw_connect(g_path, &st);
        CHECK(fd >= 0 && st == GM_OK);
        if (fd < 0) continue;
        conns++;
        /* Made first, sent after: what is drawn does not depend on when the
         * server hangs up. */
        int nmsg = 1 + (int)(rng_next(&rng) % 3);
        unsigned char bufs[3][sizeof(gm__share_msg_t) + 64];
        size_t lens[3];
        for (int k = 0; k < nmsg; k++) {
            unsigned char *buf = bufs[k];
            size_t len;
            uint64_t kind = rng_next(&rng) % 4;
            if (kind == 0) { /* random bytes, random length */
                len = 1 + rng_next(&rng) % sizeof bufs[0];
                for (size_t j = 0; j < len; j++) buf[j] = (unsigned char)rng_next(&rng);
            } else { /* a header that passes, random fields */
                gm__share_msg_t m;
                msg_init(&m, (int)(1 + rng_next(&rng) % 6));
                m.id = rng_next(&rng) % 4 ? rng_next(&rng) % 8 : rng_next(&rng);
                m.first = rng_next(&rng) % 4 ? rng_next(&rng) % 4 : rng_next(&rng);
                m.count = rng_next(&rng) % 4 ? rng_next(&rng) % 70 : rng_next(&rng);
                m.status = (int32_t)rng_next(&rng);
                m.nfds = (uint32_t)rng_next(&rng);
                const char *names[] = {"good", "tok", "nope", ""};
                snprintf(m.name, sizeof m.name, "%s", names[rng_next(&rng) % 4]);
                if (rng_next(&rng) % 3 == 0) snprintf(m.token, sizeof m.token, "t0k3n");
                if (kind == 3) { /* one field corrupted */
                    size_t at = rng_next(&rng) % sizeof m;
                    ((unsigned char *)&m)[at] ^= (unsigned char)(1 + rng_next(&rng) % 255);
                }
                memcpy(buf, &m, sizeof m);
                len = sizeof m;
            }
            lens[k] = len;
        }
        for (int k = 0; k < nmsg; k++)
            if (send_raw(fd, bufs[k], lens[k], NULL, 0) != 0) break;
        /* Then a request that is answered (if the peer is still there), and
         * everything read up to its answer or the hang-up: the server has
         * seen all of it, and no reply is left unread (closing with unread
         * replies would end the server's side with ECONNRESET instead). */
        gm__share_msg_t q, r;
        msg_import(&q, "zz-sync", NULL);
        send_msg(fd, &q);
        int nf, synced = 0;
        for (;;) {
            ssize_t n = recv_msg(fd, &r, NULL, 0, &nf, 2000);
            if (n <= 0) { synced = n == 0; break; }
            if (n == (ssize_t)sizeof r && r.type == GM__SHARE_REPLY &&
                memchr(r.text, 0, sizeof r.text) && strstr(r.text, "zz-sync")) {
                synced = 1;
                break;
            }
        }
        CHECK(synced);
        close(fd);
    }
    CHECK(conns == 300);
    WAIT_FOR(sstats(sp).peers == 0, SERVER_MS); /* every message read */
    uint64_t dropped = sstats(sp).peers_dropped - d0;
    printf("garbage: %d connections, %llu dropped for a malformed request\n", conns,
           (unsigned long long)dropped);
    CHECK(dropped > 0 && dropped <= 300);
    settle("garbage", d0, (int)dropped);
    WAIT_FOR(sstats(sp).peers_dropped == d0 + dropped, 10); /* no drop after the fact */
    CHECK(sstats(sp).peers_dropped == d0 + dropped);
}

/* The server at the descriptor limit: accept fails (EMFILE) while a peer
 * waits; the server thread must not spin on the listening socket. */
static void test_emfile(void)
{
    struct rlimit old;
    CHECK(getrlimit(RLIMIT_NOFILE, &old) == 0);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    CHECK(fd >= 0);
    if (fd < 0) return;
    /* The lowest free number: nothing below it is free. */
    int lowest = open("/dev/null", O_RDONLY | O_CLOEXEC);
    CHECK(lowest >= 0);
    close(lowest);
    struct rlimit lim = old;
    lim.rlim_cur = (rlim_t)lowest;
    CHECK(setrlimit(RLIMIT_NOFILE, &lim) == 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", g_path);
    int c = connect(fd, (struct sockaddr *)&a, sizeof a); /* needs no new descriptor */
    sleep_ms(50);
    double c0 = cpu_ms(), w0 = now_ms();
    sleep_ms(400);
    double cpu = cpu_ms() - c0, wall = now_ms() - w0;
    CHECK(setrlimit(RLIMIT_NOFILE, &old) == 0);
    CHECK(c == 0);
    printf("emfile: the server used %.0f ms of CPU in %.0f ms while it could not accept\n", cpu,
           wall);
    if (cpu > wall / 10)
        fprintf(stderr, "emfile: the server thread spins while accept fails with EMFILE\n");
    CHECK(cpu <= wall / 10);
    /* With descriptors again, the waiting peer is let in. */
    gm__share_msg_t m;
    CHECK(recv_msg(fd, &m, NULL, 0, NULL, 2000) == (ssize_t)sizeof m && m.status == GM_OK);
    close(fd);
    settle("EMFILE", sstats(sp).peers_dropped, 0);
}

/* A peer that keeps the server busy: IMPORT, RELEASE, again, until told. */
static atomic_int g_flood_stop;
static atomic_long g_busy_ops;
static void *busy_peer(void *arg)
{
    int fd = *(int *)arg;
    while (!atomic_load(&g_flood_stop)) {
        uint64_t id = raw_import(fd, "good", NULL, NULL);
        if (!id) break;
        atomic_fetch_add(&g_busy_ops, 1);
        gm__share_msg_t m;
        msg_init(&m, GM__SHARE_RELEASE);
        m.id = id;
        if (send_msg(fd, &m) != 0) break;
    }
    return NULL;
}

/* What a child of fork() may do (gpumem.h): make pools of its own and use
 * them, here to import from its parent's server.  The parent is busy
 * serving while it forks (a peer imports and releases without a pause).
 * A child must not hang on a lock that a thread of the parent held at the
 * fork. */
enum { FORK_KIDS = 40, BUSY = 3 };
static void fork_child(const char *path)
{
    alarm(20); /* never left behind */
    /* A sim pool: CUDA cannot be used in a child forked after the parent
     * initialized it, and the point here is the share layer's own state. */
    int sim = test_backend() == GM_BACKEND_SIM;
    gm_pool_t *p = sim_pool(64 * MiB, 0);
    if (!p) _exit(3);
    gm_share_client_t *c = NULL;
    if (gm_share_connect(p, path, &c) != GM_OK) _exit(4);
    if (sim) { /* the parent's memory is sim memory too: import it */
        void *q = NULL;
        size_t n = 0;
        if (gm_share_import(c, "good", NULL, &q, &n, NULL) != GM_OK || n != G_SIZE) _exit(5);
        if (!sh_same(p, q, G_TAG, 0, 4096)) _exit(6);
        if (gm_share_release(c, q, NULL) != GM_OK) _exit(7);
    }
    if (gm_share_disconnect(c) != GM_OK) _exit(8);
    gm_share_stats_t s = GM_SHARE_STATS_INIT;
    if (gm_share_stats(p, &s) != GM_OK || s.imports != 0) _exit(9);
    gm_pool_destroy(p);
    _exit(0);
}

static void test_fork_while_serving(void)
{
    char path2[sizeof g_path + 2];
    snprintf(path2, sizeof path2, "%s2", g_path);
    /* The new server's thread on a CPU of its own (it inherits this thread's
     * CPUs), the forks on another: a fork then copies the lock as that
     * thread has it at that moment. */
    cpu_set_t all;
    int split;
    gm_share_server_t *s2 = NULL;
    int lrc = sh_listen_apart(sp, path2, &s2, &all, &split); /* room for every child */
    CHECK_OK(lrc);
    if (!s2) {
        if (split) sched_setaffinity(0, sizeof all, &all);
        return;
    }
    CHECK_OK(gm_share_publish(s2, "good", g_good, G_SIZE, GM_SHARE_READ_ONLY, NULL, NULL));
    /* Busy peers on both servers (two server threads at work). */
    int st, fd[BUSY];
    pthread_t th[BUSY];
    int running[BUSY];
    atomic_store(&g_flood_stop, 0);
    for (int i = 0; i < BUSY; i++) {
        fd[i] = raw_connect(path2, &st);
        CHECK(fd[i] >= 0 && st == GM_OK);
        running[i] = fd[i] >= 0 && pthread_create(&th[i], NULL, busy_peer, &fd[i]) == 0;
        CHECK(running[i]);
    }
    sleep_ms(50);
    pid_t kids[FORK_KIDS];
    for (int i = 0; i < FORK_KIDS; i++) {
        fflush(stdout);
        fflush(stderr);
        kids[i] = fork();
        if (kids[i] == 0) fork_child(path2);
        sleep_ms(2);
    }
    int hung = 0, failed = 0;
    double end = now_ms() + SERVER_MS;
    for (int i = 0; i < FORK_KIDS; i++) {
        if (kids[i] < 0) { failed++; continue; }
        int ws = -1;
        pid_t r = 0;
        while ((r = waitpid(kids[i], &ws, WNOHANG)) == 0 && now_ms() < end) sleep_ms(5);
        if (r != kids[i]) {
            kill(kids[i], SIGKILL);
            waitpid(kids[i], &ws, 0);
            hung++;
        } else if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
            fprintf(stderr, "fork child %d: status %#x\n", i, ws);
            failed++;
        }
    }
    atomic_store(&g_flood_stop, 1);
    for (int i = 0; i < BUSY; i++) {
        if (running[i]) pthread_join(th[i], NULL);
        if (fd[i] >= 0) close(fd[i]);
    }
    printf("fork while serving: %d children, %d hung, %d failed (%ld imports by the busy "
           "peers)\n", FORK_KIDS, hung, failed, atomic_load(&g_busy_ops));
    if (hung)
        fprintf(stderr, "fork while serving: %d of %d children hung (a lock of the parent's "
                        "server thread, copied held)\n", hung, FORK_KIDS);
    CHECK(hung == 0);
    CHECK(failed == 0);
    CHECK_OK(gm_share_close(s2));
    CHECK(access(path2, F_OK) != 0);
    if (split) sched_setaffinity(0, sizeof all, &all);
    settle("fork while serving", sstats(sp).peers_dropped, 0);
}

int main(int argc, char **argv)
{
    if (argc > 1) g_seed = strtoull(argv[1], NULL, 0);
    printf("test_share_hostile: seed %#llx (backend %s)\n", g_seed,
           test_backend() == GM_BACKEND_SIM ? "sim" : "cuda");
    signal(SIGPIPE, SIG_IGN);
    /* First, while this process has no pool: a child of its own. */
    test_full_backlog();

    sp = test_pool(256 * MiB, 0);
    cp = test_pool(256 * MiB, 0);
    REQUIRE(sp && cp);
    gm_device_info_t di = GM_DEVICE_INFO_INIT;
    REQUIRE(gm_pool_device_info(sp, &di) == GM_OK);
    g_page = di.granularity;
    REQUIRE(g_page > 0 && G_SIZE % g_page == 0);
    snprintf(g_path, sizeof g_path, "%s/gm-sh-hostile-%d.sock",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    unlink(g_path);
    void *g = NULL;
    REQUIRE(gm_alloc_shareable(sp, G_SIZE, NULL, &g) == GM_OK);
    g_good = g;
    REQUIRE(sh_fill(sp, g, G_TAG, 0, G_SIZE) == GM_OK);
    gm_share_policy_t pol = GM_SHARE_POLICY_INIT;
    pol.max_peers = 4;
    REQUIRE(gm_share_listen(sp, g_path, &pol, &srv) == GM_OK);
    REQUIRE(gm_share_publish(srv, "good", g, G_SIZE, GM_SHARE_READ_WRITE, NULL, NULL) == GM_OK);
    /* [MiB + 5, 2 MiB + 5): two pages */
    REQUIRE(gm_share_publish(srv, "tok", (char *)g + MiB + 5, MiB, GM_SHARE_READ_ONLY, "t0k3n",
                             NULL) == GM_OK);
    REQUIRE(good_works());
    WAIT_FOR(sstats(sp).peers == 0, SERVER_MS);
    g_fd_base = fd_count();

    double t0 = now_ms();
    test_malformed();
    test_well_formed_raw();
    test_names();
    test_max_peers();
    test_flood();
    test_garbage(g_seed);
    test_listen_paths();
    test_emfile();
    test_fork_while_serving();

    gm_share_stats_t s = sstats(sp);
    CHECK(s.published == 2 && s.exported_bytes == 0 && s.peers == 0 && s.held_for_peers_bytes == 0);
    CHECK_OK(gm_share_close(srv));
    CHECK(access(g_path, F_OK) != 0);
    CHECK_OK(gm_free(sp, g, NULL));
    CHECK_OK(gm_pool_check(sp));
    gm_pool_destroy(cp);
    gm_pool_destroy(sp);
    printf("hostile peers: %.2f s\n", (now_ms() - t0) / 1e3);
    return test_summary();
}
