/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_broker_trust.c — what the broker and its clients believe of each
 * other, with processes of other uids (the test runs as root and its
 * children switch to unprivileged uids; exit 77 where it cannot):
 *
 *   a  an impostor: a broker of uid 65534 listening on the path.  A pool
 *      made there fails (GM_DENIED) naming the path, the impostor's uid and
 *      the uids it would trust, and the impostor never saw a HELLO (its
 *      table, read by a process that trusts it, has no tenant);
 *      `gpumem top/metrics --broker`'s query (gm_broker_query) is refused
 *      the same way.  A process that names uid 65534 (or its user name)
 *      as its broker user (GPUMEM_BROKER_UID) trusts it.
 *   b  the stats file: a symlink planted at the name the broker used to
 *      write through (<stats_file>.tmp) and one at the stats file's name
 *      point at victims: both victims stay unchanged and the stats file is a
 *      regular file of the broker's; a stats file in a directory others may
 *      write (mode 0777, not sticky) is not written, and the log says why.
 *   c  claims of kept pages: processes of a 64 MiB-quota tenant and of a
 *      tenant without quota say (HELLO adopt) they kept 512 MiB and the
 *      whole device from an earlier broker run; no lease record proves it,
 *      so nothing is booked (the quota tenant's used stays 0), and a tenant
 *      with a guarantee is served.  A lease recorded by one run is proven
 *      to the next (booked up to what was recorded, the rest not), and a
 *      record others could have written is ignored.
 *   d  connection slots (max_clients 8): a hostile tenant gets 4 (half) and
 *      then "turned away: tenant 'uid:65534' has 4 connections, the limit",
 *      through the library too; a guaranteed tenant is served meanwhile; a
 *      third tenant fills the rest and the next connection reads "broker
 *      full: max_clients 8".
 *
 * This process makes no pool (on cuda, the brokers it forks could not use
 * the device after it did); children make their own.
 */
#include <grp.h>
#include <pwd.h>

#include "test.h"
#include "broker_util.h"
#include "broker_procs.h"
#include "core/options.h"

#define PAGE (2 * MiB)
#define NOBODY 65534 /* the impostor, the hostile tenant */
#define SMALL 65533  /* a tenant with a 64 MiB quota */
#define GOLD 65532   /* a tenant with a guarantee */
#define THIRD 65531

static test_broker_t g_b;

static int become(uid_t uid)
{
    if (setgroups(0, NULL) != 0) return -1;
    if (setresgid(uid, uid, uid) != 0) return -1;
    return setresuid(uid, uid, uid);
}

/* Can this test change uid?  (A child tries.) */
static int can_switch(void)
{
    pid_t pid = fork();
    if (pid == 0) _exit(become(NOBODY) == 0 ? 0 : 1);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* The broker's page (a raw STATS; the reply names it). */
static uint64_t page_of(const char *sock)
{
    int fd = tp_raw_connect(sock, 5000);
    if (fd < 0) return 0;
    gm__broker_msg_t m;
    bp_msg(&m, GM__BROKER_STATS);
    m.first = 1u << 30;
    uint64_t page = 0;
    if (tp_raw_send(fd, &m, sizeof m, NULL, 0) == 0 && bp_raw_recv(fd, &m, NULL, 0, NULL) == 1)
        page = m.page_size;
    close(fd);
    return page;
}

/* A raw HELLO claiming adopt pages: the reply in *r; 1 a reply came.  A
 * refusal sent before a reset connection is read too. */
static int raw_hello(int fd, uint64_t page, uint64_t adopt, gm__broker_msg_t *r)
{
    gm__broker_msg_t m;
    bp_msg(&m, GM__BROKER_HELLO);
    m.pid = getpid();
    m.page_size = page;
    m.adopt = adopt;
    memset(r, 0, sizeof *r);
    tp_raw_send(fd, &m, sizeof m, NULL, 0); /* may fail: turned away and closed */
    for (int i = 0; i < 2; i++) {
        ssize_t n = recv(fd, r, sizeof *r, 0);
        if (n == (ssize_t)sizeof *r) return 1;
        if (!(n < 0 && errno == ECONNRESET)) return 0;
    }
    return 0;
}

/* ---- a: an impostor -------------------------------------------------------------- */

static void impostor_prep(void)
{
    bp_broker_prep();
    if (become(NOBODY) != 0) _exit(3);
}

/* With GPUMEM_BROKER_UID naming the impostor's uid: trusted. */
static void trusting_kid(tp_link_t *l, void *arg)
{
    (void)l;
    const char *value = arg;
    setenv("GPUMEM_BROKER_UID", value, 1);
    gm__options_atfork_child(); /* read it again, whatever the parent read */
    gm_pool_t *pool = NULL;
    int rc = tb_pool(&g_b, 0, &pool);
    KCHECK_RC(rc, GM_OK);
    if (rc != GM_OK) return;
    void *p = NULL;
    KCHECK_RC(gm_alloc(pool, 4 * MiB, NULL, &p), GM_OK);
    if (p) KCHECK_RC(gm_free(pool, p, NULL), GM_OK);
    gm_pool_destroy(pool);
}

/* The impostor's table, as a process that trusts it reads it: no tenant
 * (no HELLO ever reached it). */
static void count_kid(tp_link_t *l, void *arg)
{
    (void)l;
    (void)arg;
    setenv("GPUMEM_BROKER_UID", "65534", 1);
    gm__options_atfork_child();
    gm_broker_view_t v;
    int rc = gm_broker_query(g_b.sock, &v);
    KCHECK_RC(rc, GM_OK);
    if (rc != GM_OK) return;
    if (v.n) fprintf(stderr, "the impostor has %zu tenants, the first '%s'\n", v.n, v.tenants[0].name);
    KCHECK(v.n == 0 && v.device_used == 0);
    free(v.tenants);
}

/* Without GPUMEM_BROKER_UID: a pool there and a query are refused, naming
 * the path and the uids (in a child: this process makes no pool, so the
 * brokers it forks later can use the device). */
static void refused_kid(tp_link_t *l, void *arg)
{
    (void)l;
    (void)arg;
    unsetenv("GPUMEM_BROKER_UID");
    gm__options_atfork_child();
    gm_pool_t *pool = NULL;
    int rc = tb_pool(&g_b, 0, &pool);
    KCHECK_RC(rc, GM_DENIED);
    const char *e = gm_last_error();
    printf("a pool on an impostor's socket: %s\n", e);
    KCHECK(strstr(e, g_b.sock) && strstr(e, "uid 65534") && strstr(e, "uid 0"));
    if (rc == GM_OK) gm_pool_destroy(pool);
    gm_broker_view_t v;
    rc = gm_broker_query(g_b.sock, &v);
    KCHECK_RC(rc, GM_DENIED);
    KCHECK(strstr(gm_last_error(), g_b.sock) && strstr(gm_last_error(), "uid 65534"));
    if (rc == GM_OK) free(v.tenants);
}

static void run_kid(void (*fn)(tp_link_t *, void *), void *arg)
{
    tp_kid_t k = tp_spawn(fn, arg);
    CHECK(k.pid > 0);
    if (k.pid <= 0) return;
    CHECK(tp_exited_ok(tp_wait(k.pid, 60000)));
    tp_kid_close(&k);
}

/* BP_STOP to two children waiting for it, then each must exit 0 within 30 s. */
static void stop_two(tp_kid_t *a, tp_kid_t *b)
{
    tp_put(a->to, BP_STOP);
    tp_put(b->to, BP_STOP);
    CHECK(tp_exited_ok(tp_wait(a->pid, 30000)));
    CHECK(tp_exited_ok(tp_wait(b->pid, 30000)));
    tp_kid_close(a);
    tp_kid_close(b);
}

/* An impostor broker in g_b, started by hand (tb_start's query would,
 * rightly, refuse it), its log unbuffered when asked: 1 once its socket
 * takes connections, 0 (counted) when it never did. */
static int start_impostor(int unbuffered_log)
{
    tb_init(&g_b);
    CHECK(chmod(g_b.dir, 01777) == 0); /* the impostor makes its socket and files there */
    tb_config(&g_b, "256MiB", "");
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        impostor_prep();
        FILE *l = freopen(g_b.log, "a", stderr);
        (void)l;
        if (unbuffered_log) setvbuf(stderr, NULL, _IONBF, 0);
        char *argv[] = {"broker", "--config", g_b.config, NULL};
        _exit(gm_cli_broker(3, argv));
    }
    g_b.pid = pid;
    int up = 0;
    for (int i = 0; i < 5000 && !up; i++) {
        int fd = tp_raw_connect(g_b.sock, 1000);
        if (fd >= 0) {
            close(fd);
            up = 1;
        } else {
            sleep_ms(2);
        }
    }
    CHECK(up);
    return up;
}

static void part_a(void)
{
    if (!start_impostor(1)) {
        bp_log_dump(&g_b);
        tb_cleanup(&g_b);
        return;
    }
    struct stat st;
    CHECK(stat(g_b.sock, &st) == 0 && st.st_uid == NOBODY);

    /* Trusted where it is named, by uid or by name. */
    run_kid(trusting_kid, "65534");
    struct passwd *pw = getpwuid(NOBODY);
    if (pw) run_kid(trusting_kid, pw->pw_name);

    run_kid(refused_kid, NULL);
    gm_broker_view_t v;
    int rc = gm_broker_query(g_b.sock, &v);
    CHECK_RC(rc, GM_DENIED);
    if (rc == GM_OK) free(v.tenants);
    tb_cleanup(&g_b);

    /* An impostor no one ever trusted: its table stays empty. */
    start_impostor(0);
    for (int i = 0; i < 3; i++) run_kid(refused_kid, NULL);
    run_kid(count_kid, NULL);
    tb_cleanup(&g_b);
}

/* ---- b: the stats file ------------------------------------------------------------- */

static void part_b(void)
{
    tb_init(&g_b);
    char victim[200], victim2[200], tmp[200];
    snprintf(victim, sizeof victim, "%s/victim", g_b.dir);
    snprintf(victim2, sizeof victim2, "%s/victim2", g_b.dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", g_b.stats);
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(i ? victim2 : victim, "w");
        CHECK(f != NULL);
        if (f) {
            fputs("precious\n", f);
            fclose(f);
        }
    }
    CHECK(symlink(victim, tmp) == 0);
    CHECK(symlink(victim2, g_b.stats) == 0);
    tb_config(&g_b, "256MiB", "");
    tb_start(&g_b);
    /* Written at start. */
    struct stat st;
    WAIT_FOR(lstat(g_b.stats, &st) == 0 && S_ISREG(st.st_mode), 5000);
    CHECK(lstat(g_b.stats, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid());
    CHECK(tb_file_has(g_b.stats, "\"capacity\""));
    CHECK(tb_file_has(victim, "precious\n") && !tb_file_has(victim, "capacity"));
    CHECK(tb_file_has(victim2, "precious\n") && !tb_file_has(victim2, "capacity"));
    CHECK(lstat(tmp, &st) == 0 && S_ISLNK(st.st_mode)); /* never touched */
    CHECK(stat(victim, &st) == 0 && st.st_size == 9);
    tb_stop(&g_b, SIGTERM);
    CHECK(tb_file_has(victim, "precious\n") && stat(victim, &st) == 0 && st.st_size == 9);
    tb_cleanup(&g_b);

    /* A directory others may write: the stats file is not written there. */
    tb_init(&g_b);
    char open_dir[200], stats[220], extra[300];
    snprintf(open_dir, sizeof open_dir, "%s/open", g_b.dir);
    CHECK(mkdir(open_dir, 0777) == 0 && chmod(open_dir, 0777) == 0);
    snprintf(stats, sizeof stats, "%s/b.json", open_dir);
    snprintf(extra, sizeof extra, "stats_file = %s\n", stats);
    tb_config(&g_b, "256MiB", extra); /* the later stats_file line wins */
    tb_start(&g_b);
    WAIT_FOR(bp_log_count(&g_b, "writable by others") > 0, 5000);
    CHECK(bp_log_count(&g_b, "writable by others") == 1);
    CHECK(access(stats, F_OK) != 0);
    tb_stop(&g_b, SIGTERM);
    CHECK(access(stats, F_OK) != 0);
    if (test_failed_) bp_log_dump(&g_b);
    tb_cleanup(&g_b);
}

/* ---- c: claims of kept pages ------------------------------------------------------------ */

typedef struct claim { uid_t uid; uint64_t adopt, page; } claim_t;

/* Claims to keep adopt pages, holds the connection until told to stop. */
static void claimer(tp_link_t *l, void *arg)
{
    claim_t *c = arg;
    KCHECK(become(c->uid) == 0);
    int fd = tp_raw_connect(g_b.sock, 5000);
    KCHECK(fd >= 0);
    gm__broker_msg_t r;
    int got = fd >= 0 && raw_hello(fd, c->page, c->adopt, &r);
    KCHECK(got && r.type == GM__BROKER_REPLY && r.status == GM_OK);
    if (got) {
        if (r.adopt || r.used)
            fprintf(stderr, "uid %u claimed %llu pages: booked %llu, the tenant uses %llu bytes\n",
                    (unsigned)c->uid, (unsigned long long)c->adopt, (unsigned long long)r.adopt,
                    (unsigned long long)r.used);
        KCHECK(r.adopt == 0 && r.used == 0);
    }
    tp_put(l->out, BP_READY);
    uint64_t v;
    tp_get(l->in, &v, TP_WAIT_MS);
    if (fd >= 0) close(fd);
}

/* The guaranteed tenant: a pool that allocates and writes 128 MiB. */
static void gold_kid(tp_link_t *l, void *arg)
{
    (void)l;
    (void)arg;
    KCHECK(become(GOLD) == 0);
    gm_pool_t *pool = NULL;
    int rc = tb_pool(&g_b, 0, &pool);
    KCHECK_RC(rc, GM_OK);
    if (rc != GM_OK) return;
    void *p = NULL;
    rc = gm_alloc(pool, 128 * MiB, NULL, &p);
    KCHECK_RC(rc, GM_OK);
    if (p) {
        KCHECK_RC(bp_fill(pool, p, 128 * MiB, 0x901d), GM_OK);
        KCHECK(bp_same(pool, p, 128 * MiB, 0x901d));
        KCHECK_RC(gm_free(pool, p, NULL), GM_OK);
    }
    gm_pool_destroy(pool);
}

static void part_c(void)
{
    tb_init(&g_b);
    CHECK(chmod(g_b.dir, 0755) == 0); /* the children reach the socket */
    char extra[300];
    snprintf(extra, sizeof extra,
             "default_quota = none\n[tenant small]\nusers = %d\nquota = 64MiB\n"
             "[tenant gold]\nusers = %d\nguaranteed = 256MiB\n", SMALL, GOLD);
    tb_config(&g_b, "1GiB", extra);
    bp_start(&g_b);
    uint64_t page = page_of(g_b.sock);
    CHECK(page == PAGE || (bp_is_cuda() && page));
    if (!page) return;
    claim_t small = {SMALL, (512 * MiB) / page, page};
    claim_t hog = {NOBODY, (1024 * MiB) / page, page};
    tp_kid_t ks = tp_spawn(claimer, &small), kh = tp_spawn(claimer, &hog);
    tp_expect(&ks, BP_READY);
    tp_expect(&kh, BP_READY);
    gm_broker_view_t v;
    CHECK(bp_quiet_view(&g_b, &v, 5000));
    uint64_t small_used = UINT64_MAX;
    for (size_t i = 0; i < v.n; i++)
        if (!strcmp(v.tenants[i].name, "small")) small_used = v.tenants[i].used;
    printf("claims of 512 MiB (64 MiB quota) and 1 GiB kept: the small tenant is booked %llu "
           "bytes, the device %llu\n", (unsigned long long)small_used,
           (unsigned long long)v.device_used);
    CHECK(small_used == 0 && v.device_used == 0);
    free(v.tenants);
    CHECK(bp_log_count(&g_b, "the lease record proves 0") == 2);
    /* A guaranteed tenant is served while they hold their claims. */
    run_kid(gold_kid, NULL);
    stop_two(&ks, &kh);

    /* A lease the record holds is proven to the next run: this process
     * leases 3 pages, the broker is killed, a new one books 3 of a claim
     * of 10. */
    int fd = tp_raw_connect(g_b.sock, 5000);
    gm__broker_msg_t r;
    CHECK(fd >= 0 && raw_hello(fd, page, 0, &r) && r.status == GM_OK);
    bp_msg(&r, GM__BROKER_LEASE);
    r.min = r.count = 3;
    int fds[64];
    size_t nfds = 0;
    CHECK(tp_raw_send(fd, &r, sizeof r, NULL, 0) == 0);
    CHECK(bp_raw_recv(fd, &r, fds, 64, &nfds) == 1 && r.status == GM_OK && nfds == 3);
    for (size_t i = 0; i < nfds; i++) close(fds[i]);
    tb_stop(&g_b, SIGKILL);
    close(fd);
    bp_start(&g_b);
    fd = tp_raw_connect(g_b.sock, 5000);
    CHECK(fd >= 0 && raw_hello(fd, page, 10, &r) && r.status == GM_OK);
    CHECK(r.adopt == 3 && r.used == 3 * page);
    CHECK(bp_log_count(&g_b, "claims to keep 10 pages from an earlier broker run; the lease "
                              "record proves 3") == 1);
    /* It lets go of them: 3, not 10. */
    bp_msg(&r, GM__BROKER_UNADOPT);
    r.count = 3;
    CHECK(tp_raw_send(fd, &r, sizeof r, NULL, 0) == 0);
    gm_broker_tenant_t t;
    char me[32];
    snprintf(me, sizeof me, "uid:%u", (unsigned)geteuid());
    WAIT_FOR(bp_tenant(&g_b, me, &t, NULL) && t.used == 0, 3000);
    CHECK(bp_tenant(&g_b, me, &t, NULL) && t.used == 0);

    /* A record another uid could have written is not believed. */
    bp_msg(&r, GM__BROKER_LEASE);
    r.min = r.count = 2;
    CHECK(tp_raw_send(fd, &r, sizeof r, NULL, 0) == 0);
    nfds = 0;
    CHECK(bp_raw_recv(fd, &r, fds, 64, &nfds) == 1 && r.status == GM_OK && nfds == 2);
    for (size_t i = 0; i < nfds; i++) close(fds[i]);
    tb_stop(&g_b, SIGKILL);
    close(fd);
    char record[200];
    snprintf(record, sizeof record, "%s.leases", g_b.sock);
    CHECK(chmod(record, 0666) == 0);
    bp_start(&g_b);
    fd = tp_raw_connect(g_b.sock, 5000);
    CHECK(fd >= 0 && raw_hello(fd, page, 2, &r) && r.status == GM_OK);
    CHECK(r.adopt == 0 && r.used == 0);
    CHECK(bp_log_count(&g_b, "that only it may write; ignored") == 1);
    close(fd);
    tb_stop(&g_b, SIGTERM);
    if (test_failed_) bp_log_dump(&g_b);
    tb_cleanup(&g_b);
}

/* ---- d: connection slots ----------------------------------------------------------------- */

typedef struct flood { uid_t uid; uint64_t page; const char *want; } flood_t;

/* Open connections (each says HELLO) until one is turned away: how many
 * were served (reported), the refusal's text must hold f->want; then the
 * library's pool creation is refused with it too; hold them until told. */
static void flooder(tp_link_t *l, void *arg)
{
    flood_t *f = arg;
    KCHECK(become(f->uid) == 0);
    int fds[16], n = 0, refused = 0;
    while (n < 16) {
        int fd = tp_raw_connect(g_b.sock, 5000);
        KCHECK(fd >= 0);
        if (fd < 0) break;
        gm__broker_msg_t r;
        int got = raw_hello(fd, f->page, 0, &r);
        KCHECK(got);
        if (got && r.status == GM_OK) {
            fds[n++] = fd;
            continue;
        }
        if (got) printf("uid %u, connection %d: %s\n", (unsigned)f->uid, n + 1, r.text);
        KCHECK(got && r.status == GM_DENIED && strstr(r.text, f->want));
        close(fd);
        refused = 1;
        break;
    }
    KCHECK(refused);
    gm_pool_t *pool = NULL;
    int rc = tb_pool(&g_b, 0, &pool);
    KCHECK_RC(rc, GM_DENIED);
    if (rc != GM_OK) {
        printf("uid %u, a pool: %s\n", (unsigned)f->uid, gm_last_error());
        KCHECK(strstr(gm_last_error(), f->want) != NULL);
        KCHECK(strstr(gm_last_error(), "reset") == NULL);
    } else {
        gm_pool_destroy(pool);
    }
    tp_put(l->out, BP_VALUE);
    tp_put(l->out, (uint64_t)n);
    uint64_t v;
    tp_get(l->in, &v, TP_WAIT_MS);
    for (int i = 0; i < n; i++) close(fds[i]);
}

static void part_d(void)
{
    tb_init(&g_b);
    CHECK(chmod(g_b.dir, 0755) == 0);
    char extra[300];
    snprintf(extra, sizeof extra, "max_clients = 8\n[tenant gold]\nusers = %d\n"
             "guaranteed = 256MiB\n", GOLD);
    tb_config(&g_b, "1GiB", extra);
    bp_start(&g_b);
    uint64_t page = page_of(g_b.sock);
    CHECK(page != 0);
    flood_t hostile = {NOBODY, page, "turned away: tenant 'uid:65534' has 4 connections, the limit"};
    tp_kid_t kh = tp_spawn(flooder, &hostile);
    uint64_t n = 0;
    CHECK(tp_expect(&kh, BP_VALUE) && tp_get(kh.from, &n, TP_WAIT_MS) == 0);
    printf("the hostile tenant holds %llu connections of 8\n", (unsigned long long)n);
    CHECK(n == 4);
    /* The guaranteed tenant is served meanwhile. */
    run_kid(gold_kid, NULL);
    /* A third tenant takes what is left: then the broker is full. */
    flood_t third = {THIRD, page, "broker full: max_clients 8"};
    tp_kid_t kt = tp_spawn(flooder, &third);
    uint64_t m = 0;
    CHECK(tp_expect(&kt, BP_VALUE) && tp_get(kt.from, &m, TP_WAIT_MS) == 0);
    printf("a third tenant then holds %llu connections\n", (unsigned long long)m);
    CHECK(m >= 1 && m <= 4);
    stop_two(&kh, &kt);
    CHECK(bp_log_count(&g_b, "turned away: tenant 'uid:65534'") >= 2);
    CHECK(bp_log_count(&g_b, "broker full: max_clients 8") >= 2);
    tb_stop(&g_b, SIGTERM);
    if (test_failed_) bp_log_dump(&g_b);
    tb_cleanup(&g_b);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    int results;
    tp_results_init(&results);
    if (!can_switch()) {
        printf("test_broker_trust: cannot change uid here (not root): skipped\n");
        return 77;
    }
    part_a();
    part_b();
    part_c();
    part_d();
    tp_results_drain(results);
    return test_summary();
}
