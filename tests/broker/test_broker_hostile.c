/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_broker_hostile.c — hostile clients speaking the broker's wire format
 * (src/broker/proto.h) badly over raw sockets: seeded garbage (before and
 * after HELLO), a short, an oversized and an empty message, a wrong magic or
 * version, descriptors attached, a LEASE or a RETURN before HELLO, a LEASE
 * of min 0, of min > count, of count 65 or 2^64-1, a request while a lease
 * waits, requests sent without reading the answers, RETURN of an id it does
 * not hold, of another client's ids, of its id twice, of no id, of ids
 * while holding none, UNADOPT of more than it adopted (a claim to keep
 * pages that the broker's lease record does not prove is booked as 0), or
 * without adopting, unknown types and a second HELLO, a viewer that says more
 * than STATS, HELLO with another page size (a refusal reply naming the
 * broker's page, then the end), an events HELLO with a wrong cookie or for
 * a client that has one, anything on a real events connection, a
 * connection that says nothing (dropped after 10 s, not before), and 200
 * connections at once that each lease a page.  Recorded only: a HELLO with
 * unterminated strings (proto.h calls it malformed; the broker reads no
 * client text) and a claim to keep 2^40 pages (whether others can lease
 * meanwhile).
 *
 * After each: the broker is alive (gm_broker_query), its log names the drop,
 * the hostile connection is closed, the pages it leased or claimed to keep
 * were taken back (the tenant's used is what the well-behaved pool in this
 * process holds), that pool still allocates, writes and reads, its
 * long-lived block keeps its pattern, and the broker holds as many
 * descriptors as before (keep_free 0: it keeps no page made; on cuda its
 * sockets only, since the driver opens descriptors of its own when it
 * likes).
 *
 * argv: [seed] (the garbage).  About 12 s: the silent connection's 10 s run
 * alongside the rest.
 */
// ctest-args: 0xbadc0de
#include "test.h"
#include "broker_util.h"
#include "broker_procs.h"

static unsigned long long g_seed = 0xbadc0de;
static test_broker_t g_b;
static char g_tenant[64];
static gm_pool_t *g_good;   /* the well-behaved pool */
static void *g_keep;        /* its block that lives through the test */
static uint64_t g_page;     /* the broker's page (from its refusal of a wrong one) */
static uint64_t g_base;     /* the tenant's used: g_keep's pages */
static int g_fd_base;       /* the broker's descriptors with only g_good connected */
static uint64_t g_rs;
static int g_cases;

#define KEEP_SIZE (4 * MiB)
#define KEEP_TAG 0x6001

/* ---- raw messages --------------------------------------------------------------- */

static int raw(void) { return tp_raw_connect(g_b.sock, 3000); }

static int send_msg(int fd, gm__broker_msg_t *m) { return tp_raw_send(fd, m, sizeof *m, NULL, 0); }

/* HELLO (adopt pages): the reply in *r; 1 when it says GM_OK. */
static int hello(int fd, uint64_t adopt, gm__broker_msg_t *r)
{
    gm__broker_msg_t m;
    bp_msg(&m, GM__BROKER_HELLO);
    m.pid = getpid();
    m.page_size = g_page;
    m.adopt = adopt;
    if (send_msg(fd, &m) != 0) return 0;
    return bp_raw_recv(fd, r, NULL, 0, NULL) == 1 && r->type == GM__BROKER_REPLY &&
           r->status == GM_OK;
}

/* LEASE min..count: the ids served (descriptors closed); -1 when refused or
 * no answer. */
static long lease(int fd, uint64_t min, uint64_t count, uint64_t *ids)
{
    gm__broker_msg_t m;
    bp_msg(&m, GM__BROKER_LEASE);
    m.min = min;
    m.count = count;
    if (send_msg(fd, &m) != 0) return -1;
    int fds[64];
    size_t nfds = 0;
    int k = bp_raw_recv(fd, &m, fds, 64, &nfds);
    for (size_t i = 0; i < nfds; i++) close(fds[i]);
    if (k != 1 || m.type != GM__BROKER_REPLY || m.status != GM_OK || m.count != nfds) return -1;
    for (size_t i = 0; i < nfds && ids; i++) ids[i] = m.ids[i];
    return (long)nfds;
}

/* The broker's descriptors that a leak of its own would show: all of them
 * on the sim; on cuda its sockets (the driver's descriptors come and go). */
static int broker_fds(void)
{
    return tp_fd_count_to(g_b.pid, bp_is_cuda() ? "socket:" : NULL);
}

static uint64_t used_now(void)
{
    gm_broker_tenant_t t;
    bp_tenant(&g_b, g_tenant, &t, NULL);
    return t.used;
}

/* ---- the checks after each case ---------------------------------------------------- */

/* The good pool allocates, writes, reads and frees; its block is intact;
 * then it holds g_keep only. */
static void good_pool_works(const char *name)
{
    void *p = NULL;
    int rc = gm_alloc(g_good, 6 * MiB, NULL, &p);
    if (rc != GM_OK) fprintf(stderr, "%s: the good pool: %s\n", name, gm_last_error());
    CHECK_OK(rc);
    if (rc == GM_OK) {
        uint64_t tag = 0x7000 + (uint64_t)g_cases;
        CHECK_OK(bp_fill(g_good, p, 6 * MiB, tag));
        CHECK(bp_same(g_good, p, 6 * MiB, tag));
        CHECK_OK(gm_free(g_good, p, NULL));
    }
    CHECK(bp_same(g_good, g_keep, KEEP_SIZE, KEEP_TAG));
    CHECK_OK(gm_trim(g_good, 0, NULL));
}

/* fd is dropped by the broker; the log has one more line with `logged`
 * (NULL: none expected); everything is back as it was. */
static void dropped(const char *name, int fd, const char *logged, int before)
{
    g_cases++;
    if (fd >= 0) { /* -1: closed already, or by this side */
        int closed = tp_raw_closed(fd, 60000);
        if (!closed) fprintf(stderr, "%s: the broker did not drop the connection\n", name);
        CHECK(closed);
        close(fd);
    }
    if (logged) {
        WAIT_FOR(bp_log_count(&g_b, logged) > before, 60000);
        int n = bp_log_count(&g_b, logged);
        if (n <= before) fprintf(stderr, "%s: the log does not say '%s'\n", name, logged);
        CHECK(n > before);
    }
    gm_broker_view_t v;
    CHECK(gm_broker_query(g_b.sock, &v) == GM_OK); /* alive */
    free(v.tenants);
    good_pool_works(name);
    WAIT_FOR(used_now() == g_base, 60000);
    uint64_t u = used_now();
    if (u != g_base)
        fprintf(stderr, "%s: the tenant holds %llu bytes, the good pool %llu\n", name,
                (unsigned long long)u, (unsigned long long)g_base);
    CHECK(u == g_base);
    gm_broker_tenant_t t;
    CHECK(bp_tenant(&g_b, g_tenant, &t, NULL) && t.clients == 1);
    int fds = -1;
    WAIT_FOR((fds = broker_fds()) == g_fd_base, 60000);
    if (fds != g_fd_base)
        fprintf(stderr, "%s: the broker holds %d descriptors, %d before\n", name, fds, g_fd_base);
    CHECK(fds == g_fd_base);
}

/* A raw connection that said HELLO and leased n pages (ids into ids). */
static int leased_client(uint64_t n, uint64_t *ids)
{
    int fd = raw();
    CHECK(fd >= 0);
    gm__broker_msg_t r;
    CHECK(hello(fd, 0, &r));
    CHECK(lease(fd, n, n, ids) == (long)n);
    CHECK(used_now() == g_base + n * g_page);
    return fd;
}

#define CASE(name, logged) int before_ = (logged) ? bp_log_count(&g_b, (logged)) : 0; \
    const char *name_ = (name), *logged_ = (logged)
#define DROPPED(fd) dropped(name_, (fd), logged_, before_)

/* ---- one bad message each ------------------------------------------------------------ */

#define HELD_ID UINT64_MAX /* in a case's ids: the first page the connection leased */

/* How a case's connection starts: new, after HELLO (adopting `adopt`
 * pages, which nothing proves: none are booked), or after HELLO and a lease
 * of 2 pages. */
enum { NEW = 0, LEASED = 1, HELLOED = 2 };

/* A connection that sends one message of `type`, changed as the fields say
 * (the rest as bp_msg makes it), and must be dropped with `logged` in the
 * log.  page: page_size = the broker's page; ids_upto: ids 1..ids_upto. */
typedef struct hcase {
    const char *name, *logged;
    int leased, type, page;
    uint16_t magic_xor, version_add;
    uint64_t min, count, ids[2];
    int ids_upto, adopt;
} hcase_t;

static const hcase_t bad_msgs[] = {
    {"a wrong magic", "bad magic or version", 0, GM__BROKER_HELLO, 1, .magic_xor = 1},
    {"a wrong version after HELLO", "bad magic or version", 1, GM__BROKER_STATS, 0, .version_add = 1},
    {"LEASE before HELLO", "the first message is not HELLO or STATS", 0, GM__BROKER_LEASE, 0,
     .min = 1, .count = 1},
    {"RETURN before HELLO", "the first message is not HELLO or STATS", 0, GM__BROKER_RETURN, 0,
     .count = 1, .ids = {1}},
    {"LEASE of min 0", "a lease of a wrong size", 1, GM__BROKER_LEASE, 0, .min = 0, .count = 4},
    {"LEASE of min > count", "a lease of a wrong size", 1, GM__BROKER_LEASE, 0, .min = 5, .count = 4},
    {"LEASE of count 65", "a lease of a wrong size", 1, GM__BROKER_LEASE, 0, .min = 1, .count = 65},
    {"LEASE of count 2^64-1", "a lease of a wrong size", 1, GM__BROKER_LEASE, 0, .min = 1,
     .count = UINT64_MAX},
    {"RETURN of an id it does not hold", "does not hold", 1, GM__BROKER_RETURN, 0, .count = 1,
     .ids = {1000000}},
    {"RETURN of its id twice", "does not hold", 1, GM__BROKER_RETURN, 0, .count = 2,
     .ids = {HELD_ID, HELD_ID}},
    {"RETURN of no id", "does not hold", 1, GM__BROKER_RETURN, 0, .count = 0},
    {"UNADOPT without adopting", "more adopted pages than it had", 1, GM__BROKER_UNADOPT, 0,
     .count = 1},
    {"type 0 after HELLO", "an unknown message type", 1, 0, .page = 1},
    {"type HELLO after HELLO", "an unknown message type", 1, GM__BROKER_HELLO, .page = 1},
    {"type RECLAIM after HELLO", "an unknown message type", 1, GM__BROKER_RECLAIM, .page = 1},
    {"type REPLY after HELLO", "an unknown message type", 1, GM__BROKER_REPLY, .page = 1},
    {"type 99 after HELLO", "an unknown message type", 1, 99, .page = 1},
    /* The good pool's pages are among ids 1..16: good_pool_works checks its block after. */
    {"RETURN of ids without holding any", "does not hold", HELLOED, GM__BROKER_RETURN, 0,
     .count = 16, .ids_upto = 16},
    {"UNADOPT of more than it adopted", "more adopted pages than it had", HELLOED,
     GM__BROKER_UNADOPT, 0, .count = 1, .adopt = 2},
};

static void bad_msg(const hcase_t *c)
{
    CASE(c->name, c->logged);
    uint64_t ids[2];
    int fd = c->leased == LEASED ? leased_client(2, ids) : raw();
    gm__broker_msg_t m;
    if (c->leased == HELLOED) {
        CHECK(hello(fd, (uint64_t)c->adopt, &m));
        if (c->adopt) CHECK(m.adopt == 0 && m.used == g_base);
    }
    bp_msg(&m, c->type);
    m.magic ^= c->magic_xor;
    m.version = (uint16_t)(m.version + c->version_add);
    if (c->page) m.page_size = g_page;
    m.min = c->min;
    m.count = c->count;
    for (int i = 0; i < 2; i++) m.ids[i] = c->ids[i] == HELD_ID ? ids[0] : c->ids[i];
    for (int i = 0; i < c->ids_upto; i++) m.ids[i] = (uint64_t)i + 1;
    CHECK(send_msg(fd, &m) == 0);
    DROPPED(fd);
}

/* ---- main ---------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    if (argc > 1) g_seed = strtoull(argv[1], NULL, 0);
    printf("test_broker_hostile: seed %#llx (backend %s)\n", g_seed, bp_is_cuda() ? "cuda" : "sim");
    fflush(stdout);
    signal(SIGPIPE, SIG_IGN);
    g_rs = g_seed;
    double t_start = now_ms();
    snprintf(g_tenant, sizeof g_tenant, "uid:%u", (unsigned)geteuid());
    tb_init(&g_b);
    tb_config(&g_b, "1GiB", "keep_free = 0\n");
    bp_start(&g_b);

    /* A connection that says nothing: dropped after 10 s (checked at the end). */
    int silent = raw();
    double silent_t0 = now_ms();
    CHECK(silent >= 0);

    /* HELLO with another page size: a refusal that names the broker's page. */
    {
        int fd = raw();
        CHECK(fd >= 0);
        gm__broker_msg_t m, r;
        bp_msg(&m, GM__BROKER_HELLO);
        m.page_size = 4096;
        CHECK(send_msg(fd, &m) == 0);
        CHECK(bp_raw_recv(fd, &r, NULL, 0, NULL) == 1);
        CHECK(r.type == GM__BROKER_REPLY && r.status == GM_INVALID_STATE);
        CHECK(memchr(r.text, 0, sizeof r.text) && strstr(r.text, "leases pages of"));
        g_page = r.page_size;
        CHECK(g_page >= 4096 && (g_page & (g_page - 1)) == 0);
        CHECK(tp_raw_closed(fd, 60000));
        close(fd);
        if (g_page < 4096) g_page = 2 * MiB;
    }

    CHECK_OK(tb_pool(&g_b, 2 * g_page, &g_good));
    REQUIRE(g_good != NULL);
    CHECK_OK(gm_alloc(g_good, KEEP_SIZE, NULL, &g_keep));
    REQUIRE(g_keep != NULL);
    CHECK_OK(bp_fill(g_good, g_keep, KEEP_SIZE, KEEP_TAG));
    CHECK_OK(gm_trim(g_good, 0, NULL));
    g_base = (KEEP_SIZE + g_page - 1) / g_page * g_page;
    WAIT_FOR(used_now() == g_base, 60000);
    CHECK(used_now() == g_base);
    sleep_ms(20);
    g_fd_base = broker_fds();

    /* The raw client itself: HELLO, LEASE, RETURN work as the library does. */
    {
        uint64_t ids[4];
        int fd = leased_client(3, ids);
        gm__broker_msg_t m;
        bp_msg(&m, GM__BROKER_RETURN);
        m.count = 1;
        m.ids[0] = ids[1];
        CHECK(send_msg(fd, &m) == 0);
        WAIT_FOR(used_now() == g_base + 2 * g_page, 60000);
        CHECK(used_now() == g_base + 2 * g_page);
        close(fd); /* a plain close: no line in the log needed */
        CASE("a plain close", NULL);
        DROPPED(-1);
    }

    /* Garbage, new connection and after HELLO. */
    for (int after_hello = 0; after_hello < 2; after_hello++) {
        CASE(after_hello ? "garbage after HELLO" : "garbage", "malformed message");
        uint64_t ids[2];
        int fd = after_hello ? leased_client(2, ids) : raw();
        unsigned char junk[700];
        size_t n = 1 + bp_below(&g_rs, sizeof junk);
        for (size_t i = 0; i < n; i++) junk[i] = (unsigned char)rng_next(&g_rs);
        CHECK(tp_raw_send(fd, junk, n, NULL, 0) == 0);
        DROPPED(fd);
    }
    {
        CASE("a short message", "malformed message");
        uint64_t ids[2];
        int fd = leased_client(2, ids);
        gm__broker_msg_t m;
        bp_msg(&m, GM__BROKER_STATS);
        CHECK(tp_raw_send(fd, &m, sizeof m - 1, NULL, 0) == 0);
        DROPPED(fd);
    }
    {
        CASE("an oversized message", "malformed message");
        uint64_t ids[2];
        int fd = leased_client(2, ids);
        unsigned char big[sizeof(gm__broker_msg_t) + 100];
        memset(big, 0, sizeof big);
        gm__broker_msg_t m;
        bp_msg(&m, GM__BROKER_STATS);
        memcpy(big, &m, sizeof m);
        CHECK(tp_raw_send(fd, big, sizeof big, NULL, 0) == 0);
        DROPPED(fd);
    }
    {
        CASE("an empty message", NULL);
        uint64_t ids[2];
        int fd = leased_client(2, ids);
        CHECK(tp_raw_send(fd, "", 0, NULL, 0) == 0);
        DROPPED(fd);
    }
    for (size_t i = 0; i < sizeof bad_msgs / sizeof bad_msgs[0]; i++) bad_msg(&bad_msgs[i]);
    for (int after_hello = 0; after_hello < 2; after_hello++) {
        CASE(after_hello ? "descriptors after HELLO" : "descriptors with HELLO",
             "malformed message");
        uint64_t ids[2];
        int fd = after_hello ? leased_client(2, ids) : raw();
        int dn = open("/dev/null", O_RDONLY | O_CLOEXEC);
        int fds[3] = {dn, dn, dn};
        gm__broker_msg_t m;
        bp_msg(&m, after_hello ? GM__BROKER_STATS : GM__BROKER_HELLO);
        m.page_size = g_page;
        CHECK(tp_raw_send(fd, &m, sizeof m, fds, 3) == 0);
        close(dn);
        DROPPED(fd);
    }
    {
        /* proto.h counts an unterminated text as malformed; the broker reads
         * no text of a client, so this is recorded only. */
        int fd = raw();
        gm__broker_msg_t m, r;
        bp_msg(&m, GM__BROKER_HELLO);
        m.page_size = g_page;
        memset(m.tenant, 'T', sizeof m.tenant);
        memset(m.text, 'X', sizeof m.text);
        CHECK(send_msg(fd, &m) == 0);
        int k = bp_raw_recv(fd, &r, NULL, 0, NULL);
        printf("a HELLO with unterminated strings: %s\n",
               k == 1 && r.status == GM_OK ? "accepted (proto.h says malformed)" : "refused");
        close(fd);
        CASE("unterminated strings", NULL);
        DROPPED(-1);
    }
    {
        /* The good pool's pages have small ids: a client that names them. */
        for (uint64_t other = 1; other <= 8; other++) {
            CASE("RETURN of another client's id", "does not hold");
            uint64_t ids[2];
            int fd = leased_client(2, ids);
            if (other == ids[0] || other == ids[1]) {
                close(fd);
                dropped(name_, -1, NULL, 0);
                continue;
            }
            gm__broker_msg_t m;
            bp_msg(&m, GM__BROKER_RETURN);
            m.count = 2;
            m.ids[0] = ids[0];
            m.ids[1] = other;
            CHECK(send_msg(fd, &m) == 0);
            DROPPED(fd);
        }
    }
    {
        CASE("a viewer that says HELLO", "a viewer sent more than STATS");
        int fd = raw();
        gm__broker_msg_t m, r;
        bp_msg(&m, GM__BROKER_STATS);
        m.first = 1000000; /* past the table: the count only */
        CHECK(send_msg(fd, &m) == 0);
        CHECK(bp_raw_recv(fd, &r, NULL, 0, NULL) == 1 && r.status == GM_OK && r.count >= 1 &&
              r.tenant[0] == '\0');
        bp_msg(&m, GM__BROKER_HELLO);
        m.page_size = g_page;
        CHECK(send_msg(fd, &m) == 0);
        DROPPED(fd);
    }
    {
        CASE("an events HELLO with a wrong cookie", "an events connection naming no client");
        int fd = raw(), e = raw();
        gm__broker_msg_t r, m;
        CHECK(hello(fd, 0, &r));
        bp_msg(&m, GM__BROKER_HELLO);
        m.flags = GM__BROKER_FLAG_EVENTS;
        m.client = r.client;
        m.cookie = r.cookie ^ 0x10;
        CHECK(send_msg(e, &m) == 0);
        CHECK(tp_raw_closed(e, 60000));
        close(e);
        /* Its control connection was not hurt. */
        CHECK(lease(fd, 1, 1, NULL) == 1);
        close(fd);
        DROPPED(-1);
    }
    {
        CASE("an events HELLO for a client that has one", "an events connection naming no client");
        int fd = raw(), e = raw(), e2 = raw();
        gm__broker_msg_t r, m, er;
        CHECK(hello(fd, 0, &r));
        bp_msg(&m, GM__BROKER_HELLO);
        m.flags = GM__BROKER_FLAG_EVENTS;
        m.client = r.client;
        m.cookie = r.cookie;
        CHECK(send_msg(e, &m) == 0);
        CHECK(bp_raw_recv(e, &er, NULL, 0, NULL) == 1 && er.status == GM_OK);
        CHECK(send_msg(e2, &m) == 0);
        CHECK(tp_raw_closed(e2, 60000));
        close(e2);
        CHECK(lease(fd, 1, 1, NULL) == 1); /* not hurt */
        close(e);
        close(fd);
        DROPPED(-1);
    }
    {
        CASE("anything on the events connection", "spoke on its events connection");
        int fd = raw(), e = raw();
        gm__broker_msg_t r, m, er;
        CHECK(hello(fd, 0, &r));
        CHECK(lease(fd, 3, 3, NULL) == 3);
        bp_msg(&m, GM__BROKER_HELLO);
        m.flags = GM__BROKER_FLAG_EVENTS;
        m.client = r.client;
        m.cookie = r.cookie;
        CHECK(send_msg(e, &m) == 0);
        CHECK(bp_raw_recv(e, &er, NULL, 0, NULL) == 1 && er.status == GM_OK);
        bp_msg(&m, GM__BROKER_STATS);
        CHECK(send_msg(e, &m) == 0);
        /* The client is dropped: both of its connections end. */
        CHECK(tp_raw_closed(e, 60000));
        close(e);
        DROPPED(fd);
    }
    {
        /* Requests without reading the answers: the broker never blocks on
         * a peer; once the peer's queue is full it is dropped. */
        CASE("requests without reading the answers", "send failed");
        uint64_t ids[2];
        int fd = leased_client(2, ids);
        gm__broker_msg_t m;
        bp_msg(&m, GM__BROKER_STATS);
        int sent = 0;
        double end = now_ms() + 3000;
        while (now_ms() < end && sent < 100000) {
            if (send(fd, &m, sizeof m, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)sizeof m) {
                sent++;
                continue;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK) break; /* dropped */
            sleep_us(500);
        }
        CHECK(sent > 10);
        /* The broker answers others meanwhile. */
        gm_broker_view_t v;
        CHECK(gm_broker_query(g_b.sock, &v) == GM_OK);
        free(v.tenants);
        DROPPED(fd);
    }
    {
        /* A lease that must wait (the device is full but 2 pages: another
         * connection leased the rest), then another request before the
         * answer. */
        CASE("a request while its lease waits", "a lease while its lease waits");
        gm_broker_view_t v;
        CHECK(gm_broker_query(g_b.sock, &v) == GM_OK);
        uint64_t cap = v.capacity / g_page;
        free(v.tenants);
        int filler = raw();
        gm__broker_msg_t r, m;
        CHECK(hello(filler, 0, &r));
        for (uint64_t left = cap - g_base / g_page - 2; left;) {
            uint64_t k = left < 64 ? left : 64;
            long got = lease(filler, k, k, NULL);
            CHECK(got == (long)k);
            if (got != (long)k) break;
            left -= k;
        }
        int fd = raw();
        CHECK(hello(fd, 0, &r));
        bp_msg(&m, GM__BROKER_LEASE);
        m.min = m.count = 8;
        CHECK(send_msg(fd, &m) == 0);
        CHECK(send_msg(fd, &m) == 0);
        CHECK(tp_raw_closed(fd, 60000));
        close(fd);
        close(filler);
        DROPPED(-1);
    }
    {
        /* No process keeps more pages than the device has: such a
         * greeting is dropped, and the good pool still allocates. */
        CASE("a huge claim of kept pages", "more pages than the device has");
        int fd = raw();
        gm__broker_msg_t r;
        CHECK(!hello(fd, (uint64_t)1 << 40, &r));
        DROPPED(fd);
    }

    /* The silent connection. */
    {
        CASE("a connection that says nothing", "said nothing for 10 s");
        /* Not before its 10 s (the broker's promise); when after is the
         * machine's load: the deadline only catches "never". */
        int closed = tp_raw_closed(silent, (int)(70000 - (now_ms() - silent_t0)));
        double s = (now_ms() - silent_t0) / 1e3;
        printf("the silent connection was dropped after %.2f s\n", s);
        CHECK(closed && s >= 9.9);
        g_fd_base--; /* it was open when the count was taken */
        DROPPED(silent);
    }

    /* 200 connections at once, each leasing a page. */
    {
        enum { N = 200 };
        int fds[N];
        int opened = 0, helloed = 0, leased = 0;
        for (int i = 0; i < N; i++) {
            fds[i] = raw();
            opened += fds[i] >= 0;
        }
        CHECK(opened == N);
        gm__broker_msg_t m, r;
        bp_msg(&m, GM__BROKER_HELLO);
        m.page_size = g_page;
        for (int i = 0; i < N; i++)
            if (fds[i] >= 0) CHECK(send_msg(fds[i], &m) == 0);
        for (int i = 0; i < N; i++)
            if (fds[i] >= 0)
                helloed += bp_raw_recv(fds[i], &r, NULL, 0, NULL) == 1 && r.status == GM_OK;
        CHECK(helloed == N);
        for (int i = 0; i < N; i++)
            if (fds[i] >= 0) leased += lease(fds[i], 1, 1, NULL) == 1;
        CHECK(leased == N);
        gm_broker_tenant_t t;
        CHECK(bp_tenant(&g_b, g_tenant, &t, NULL));
        CHECK(t.clients == N + 1 && t.used == g_base + (uint64_t)N * g_page);
        good_pool_works("200 connections");
        int peak_fds = broker_fds();
        CHECK(tp_fd_count_to(g_b.pid, "socket:") >= N + 1); /* theirs and the good pool's */
        for (int i = 0; i < N; i++)
            if (fds[i] >= 0) close(fds[i]);
        printf("200 connections: the broker held %d descriptors with them, %d before\n", peak_fds,
               g_fd_base);
        CHECK(peak_fds >= g_fd_base + N);
        CASE("200 connections closed", NULL);
        DROPPED(-1);
    }

    /* The well-behaved pool's block kept its data throughout. */
    CHECK(bp_same(g_good, g_keep, KEEP_SIZE, KEEP_TAG));
    CHECK_OK(gm_free(g_good, g_keep, NULL));
    CHECK_OK(gm_pool_check(g_good));
    gm_pool_destroy(g_good);
    WAIT_FOR(used_now() == 0, 60000);
    CHECK(used_now() == 0);
    CHECK(tb_stop(&g_b, SIGTERM) == 0);
    printf("%d cases, %.2f s\n", g_cases, (now_ms() - t_start) / 1e3);
    if (test_failed_) bp_log_dump(&g_b);
    tb_cleanup(&g_b);
    return test_summary();
}
