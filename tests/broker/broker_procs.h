/* SPDX-License-Identifier: Apache-2.0 */
/*
 * broker_procs.h — what the multi-process broker tests share on top of
 * broker_util.h and the harness of tests/lib/procs.h (children on pipes,
 * kill -9, the kernel's count of descriptors and sim pages, freezing, a raw
 * peer of the wire format): the pipe messages of the broker tests, a broker
 * started in a child that closes the coordinator's pipes (so a child's end
 * of file is seen), patterns in device blocks, the broker's books against
 * the pages the kernel sees, a raw broker message, and the broker's log.
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
#include <grp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>

#include "broker/proto.h"
#include "lib/procs.h"

/* Messages over the pipes (one uint64_t each; some carry a value in the
 * next one); a failed KCHECK sends TP_FAIL. */
enum { BP_GO = 1, BP_READY, BP_DONE, BP_STOP, BP_ACK, BP_NEXT, BP_VALUE };

static inline uint64_t bp_below(uint64_t *s, uint64_t n) { return n ? rng_next(s) % n : 0; }

static inline int bp_is_cuda(void)
{
    const char *b = getenv("GPUMEM_BACKEND");
    return b && !strcmp(b, "cuda");
}

/* ---- the broker ------------------------------------------------------------- */

/* In the broker's child: forget the coordinator's pipes (else a kid's end
 * of file would never come) and die with the coordinator. */
static inline void bp_broker_prep(void)
{
    tp_child_setup();
    tp_results_forget();
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

/* ---- a child's first and last steps ---------------------------------------------- */

/* In a child: take uid as its uid and gid, with no other groups, when uid
 * >= 0 (and die with the parent again: the change clears that).  0, or -1
 * with the failure counted. */
static inline int bp_become(long uid)
{
    if (uid < 0) return 0;
    if (setgroups(0, NULL) != 0 || setgid((gid_t)uid) != 0 || setuid((uid_t)uid) != 0) {
        KCHECK(!"setuid");
        return -1;
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    return 0;
}

/* In a child: a pool of broker b (bp_pool), or NULL with the failure
 * counted. */
static inline gm_pool_t *bp_kid_pool(const test_broker_t *b, size_t lease,
                                     size_t release_threshold)
{
    gm_pool_t *pool = NULL;
    int rc = bp_pool(b, lease, release_threshold, &pool);
    KCHECK_RC(rc, GM_OK);
    return rc == GM_OK ? pool : NULL;
}

/* In a child: a pool of broker b (bp_pool); BP_READY sent when it is made.
 * GM_OK, or the failure (counted). */
static inline int bp_child_pool(tp_link_t *l, const test_broker_t *b, size_t lease,
                                size_t release_threshold, gm_pool_t **pool)
{
    int rc = bp_pool(b, lease, release_threshold, pool);
    KCHECK_RC(rc, GM_OK);
    if (rc == GM_OK) tp_put(l->out, BP_READY);
    return rc;
}

/* The coordinator's first steps: SIGPIPE ignored (a child gone while it
 * writes), this user's tenant name written to tenant (when not NULL), the
 * result pipe made; its read end. */
static inline int bp_coordinator(char *tenant, size_t cap)
{
    int rd;
    fflush(stdout);
    signal(SIGPIPE, SIG_IGN);
    if (tenant) snprintf(tenant, cap, "uid:%u", (unsigned)geteuid());
    tp_results_init(&rd);
    return rd;
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

/* The first empty one of a child's n slots of blocks (blk), n when every
 * one is taken. */
static inline size_t bp_free_slot(void *const *blk, size_t n)
{
    size_t s = 0;
    while (s < n && blk[s]) s++;
    return s;
}

/* Write tag t's pattern into a child's new block p of n bytes (bp_fill)
 * and keep the block in slot s of its blocks (blk, sz, tag). */
static inline void bp_keep(gm_pool_t *pool, void **blk, size_t *sz, uint64_t *tag, size_t s,
                           void *p, size_t n, uint64_t t)
{
    KCHECK_RC(bp_fill(pool, p, n, t), GM_OK);
    blk[s] = p;
    sz[s] = n;
    tag[s] = t;
}

/* Is there a block in slot x of a child's n slots, with its pattern?  1 or
 * 0 (counted).  With drop the block, when there, is freed and its slot
 * emptied. */
static inline int bp_slot_check(gm_pool_t *pool, void **blk, const size_t *sz, const uint64_t *tag,
                                size_t n, uint64_t x, int drop)
{
    int ok = x < n && blk[x] && bp_same(pool, blk[x], sz[x], tag[x]);
    KCHECK(ok);
    if (drop && x < n && blk[x]) {
        KCHECK_RC(gm_free(pool, blk[x], NULL), GM_OK);
        blk[x] = NULL;
    }
    return ok;
}

/* Free block i of a child's blocks (blk, sz, tag) once its pattern is
 * checked, and move the last of the *n into its place. */
static inline void bp_drop(gm_pool_t *pool, void **blk, size_t *sz, uint64_t *tag, size_t *n,
                           size_t i)
{
    KCHECK(bp_same(pool, blk[i], sz[i], tag[i]));
    KCHECK_RC(gm_free(pool, blk[i], NULL), GM_OK);
    blk[i] = blk[--*n];
    sz[i] = sz[*n];
    tag[i] = tag[*n];
}

/* Free each of the n blocks (NULL ones skipped) once its pattern is checked. */
static inline void bp_drop_all(gm_pool_t *pool, void **blk, const size_t *sz, const uint64_t *tag,
                               size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (blk[i]) {
            KCHECK(bp_same(pool, blk[i], sz[i], tag[i]));
            KCHECK_RC(gm_free(pool, blk[i], NULL), GM_OK);
        }
}

/* A child's last steps: its blocks freed (bp_drop_all), the pool checked and
 * destroyed, BP_DONE sent. */
static inline void bp_child_done(tp_link_t *l, gm_pool_t *pool, void **blk, const size_t *sz,
                                 const uint64_t *tag, size_t n)
{
    bp_drop_all(pool, blk, sz, tag, n);
    KCHECK_RC(gm_pool_check(pool), GM_OK);
    gm_pool_destroy(pool);
    tp_put(l->out, BP_DONE);
}

/* A child's op that is none of its own steps: its exit (is_exit: its
 * blocks checked and freed, the pool too, BP_DONE sent: bp_child_done), or
 * an op it does not know (a failure).  Either one ends the child. */
static inline void bp_child_last(tp_link_t *l, gm_pool_t *pool, void **blk, const size_t *sz,
                                 const uint64_t *tag, size_t n, int is_exit)
{
    if (is_exit) bp_child_done(l, pool, blk, sz, tag, n);
    else KCHECK(!"an unknown op");
}

/* ---- the kernel's count of the sim's pages --------------------------------------- */

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
            tp_thaw(pids, n);
            sleep_us(3000 + 2000 * attempt);
        }
        if (!tp_freeze(pids, n)) continue;
        gm_broker_view_t v;
        if (!bp_quiet_view(b, &v, 1000)) continue;
        *books = 0;
        for (size_t j = 0; j < v.n; j++)
            if (!strcmp(v.tenants[j].name, tenant)) *books = v.tenants[j].used;
        free(v.tenants);
        tp_inodes_t s = {0};
        for (size_t i = 0; i < n; i++)
            if (pids[i] > 0) tp_sim_pages_of(pids[i], &s);
        *kernel = (uint64_t)s.n * ((uint64_t)2 << 20); /* the sim's page */
        tp_inodes_free(&s);
        if (*books == *kernel) {
            tp_thaw(pids, n);
            return 1;
        }
    }
    tp_thaw(pids, n);
    return *kernel <= *books && *books - *kernel <= slack;
}

/* ---- a raw client of the wire format ------------------------------------------------ */

static inline void bp_msg(gm__broker_msg_t *m, int type)
{
    memset(m, 0, sizeof *m);
    m->magic = GM__BROKER_MAGIC;
    m->version = GM__BROKER_VERSION;
    m->type = (uint16_t)type;
}

/* Receive one broker message (the socket's own timeout): 1 a whole message
 * (descriptors into fds, at most cap, *nfds of them; more are closed), 0
 * the broker closed the connection, -1 a timeout or error, -2 a message of
 * another size. */
static inline int bp_raw_recv(int fd, gm__broker_msg_t *m, int *fds, size_t cap, size_t *nfds)
{
    ssize_t n = tp_raw_recv(fd, m, sizeof *m, fds, cap, nfds, -1);
    return n < 0 ? -1 : n == 0 ? 0 : n == (ssize_t)sizeof *m ? 1 : -2;
}

#endif /* GM_TEST_BROKER_PROCS_H */
