/* SPDX-License-Identifier: Apache-2.0 */
/*
 * client.c — the broker page provider: a pool whose physical pages come from
 * `gpumem broker` (docs/broker.md) instead of the driver.
 *
 * The one idea: the broker leases pages in batches and the provider keeps
 * them in a local stock, so the pool's page layer (pages.c) sees the same
 * obtain/give_back it sees with the local provider, and the socket round
 * trip happens once per lease (GPUMEM_BROKER_LEASE, 64 MiB by default), not
 * per page.  Each leased page arrives as a descriptor, is imported with the
 * pool's backend (import_fd) and closed; the handle then behaves like one of
 * phys_create's.
 *
 *   stock    leased handles the pool does not hold: obtain takes from it,
 *            give_back puts into it; past two leases it gives the oldest
 *            back to the broker down to one lease; gm_trim and a broker's
 *            RECLAIM empty it.
 *   held     handle -> broker page id (with the connection's epoch) of every
 *            page the pool holds; a page of an earlier epoch was kept across
 *            a broker restart ("adopted"): it is released here and the
 *            broker is told (UNADOPT) when it booked the page (the new
 *            broker books only what its lease record proves: adopt_booked).
 *   events   a thread listening on the second connection: RECLAIM asks for
 *            cached pages; it empties the stock and trims the pool's free
 *            pages (the trim the pool gave at init, under each heap's lock), which
 *            come back through give_back and go to the broker.
 *
 * Locks: a heap's lock, then mu (obtain and give_back are called with a
 * heap's lock held, by pages.c); the events thread takes a heap's lock only
 * without mu.  mu serializes the control connection.
 *
 * A broker that goes away: requests fail with GM_IO and the reason until a
 * reconnect succeeds (tried at each request, at most every 100 ms); pages
 * the pool holds stay mapped and are adopted by the next broker run.  A
 * page given back to the broker is released here first, so a page is never
 * mapped in two tenants' processes at once by this library.
 */
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/hash.h"
#include "broker/broker.h"
#include "broker/proto.h"
#include "core/options.h"
#include "core/pool.h"
#include "base/wire.h"

#define TIMEOUT_S 10
#define RECONNECT_GAP_NS 100000000ull
#define ID_BITS 48
#define ID_MASK ((1ull << ID_BITS) - 1)

struct gm__broker_client {
    gm__broker_trim_fn trim_locked; /* gives a heap's free pages back (the pool's) */
    pthread_mutex_t mu;
    gm_pool_t *pool;           /* the root */
    char path[108];
    int fd, efd;               /* control, events; -1 when closed */
    int retired_efd;           /* an events connection replaced by a reconnect:
                                  the events thread closes it (it may be polling it) */
    int wake[2];               /* 'x': the events thread stops; 'r': efd changed */
    pthread_t thr;
    bool thr_started;
    uint64_t client, cookie, generation;
    uint64_t adopt_booked;     /* held pages of earlier epochs the broker booked
                                  (its HELLO reply): the ones UNADOPT names */
    unsigned epoch;            /* bumped at each (re)connect */
    bool owed;                 /* a lease was sent and its answer not read yet */
    uint64_t last_try_ns;
    size_t lease_pages;
    bool at_quota;             /* the last lease was refused for the tenant's quota */
    /* stock */
    gm__phys_t *stock_h;
    uint64_t *stock_id;
    size_t n_stock, cap_stock;
    /* held: handle -> id | epoch << ID_BITS */
    gm__hash_t held;
    size_t n_held;
    /* what the broker said */
    char tenant[GM__BROKER_NAME_MAX];
    uint64_t quota, used;
    char why[512];
    /* counters */
    _Atomic uint64_t leases, leased_pages, returned_pages, reclaims, lease_ns;
};

/* ---- messages --------------------------------------------------------------- */

static void msg_init(gm__broker_msg_t *m, int type)
{
    memset(m, 0, sizeof *m);
    m->magic = GM__BROKER_MAGIC;
    m->version = GM__BROKER_VERSION;
    m->type = (uint16_t)type;
}

static int msg_recv(int fd, gm__broker_msg_t *m, int *fds, size_t cap, size_t *nfds, bool *closed)
{
    GM_CHECK(gm__wire_recv(fd, m, sizeof *m, fds, cap, nfds, closed, TIMEOUT_S, "broker"));
    if (m->magic != GM__BROKER_MAGIC || m->version != GM__BROKER_VERSION ||
        !memchr(m->tenant, 0, sizeof m->tenant) || !memchr(m->text, 0, sizeof m->text) ||
        m->nfds != *nfds) {
        for (size_t i = 0; i < *nfds; i++) close(fds[i]);
        *nfds = 0;
        return gm__set_error(GM_PARSE, "broker: malformed message from the broker");
    }
    return GM_OK;
}

/* Leased pages this process keeps aside, for the broker's books (mu held). */
static uint64_t cached_pages(gm__broker_client_t *c)
{
    return c->n_stock;
}

static void close_conn(gm__broker_client_t *c)
{
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
}

/* ---- connection ------------------------------------------------------------- */

int gm__broker_check_server(int fd, const char *path)
{
    uid_t peer;
    if (gm__wire_peer(fd, NULL, &peer, NULL) != GM_OK)
        return gm__set_error(GM_IO, "the broker on %s: %s", path, gm_last_error());
    uid_t me = geteuid();
    const char *name = gm__option_str(GM_OPT_BROKER_UID);
    unsigned user = 0;
    bool named = name && gm__parse_user(name, &user) == GM_OK;
    if (peer == 0 || peer == me || (named && peer == (uid_t)user)) return GM_OK;
    char want[160];
    if (named)
        snprintf(want, sizeof want, "root, this process's uid %u or the broker user %u "
                 "(GPUMEM_BROKER_UID=%.40s)", (unsigned)me, user, name);
    else if (name)
        snprintf(want, sizeof want, "root or this process's uid %u (GPUMEM_BROKER_UID=\"%.40s\" "
                 "names no user)", (unsigned)me, name);
    else
        snprintf(want, sizeof want, "root or this process's uid %u (nor a broker user: "
                 "GPUMEM_BROKER_UID is unset)", (unsigned)me);
    return gm__set_error(GM_DENIED, "the server on %s runs as uid %u, not as %s: it is not "
                         "trusted as a broker", path, (unsigned)peer, want);
}

/* A refusal the broker sent before closing a connection it turned away
 * (when a send to it failed): GM_OK when there was none to read. */
static int turned_away(gm__broker_client_t *c, int fd)
{
    gm__broker_msg_t m;
    bool closed;
    size_t nfds;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 0) != 1 || msg_recv(fd, &m, NULL, 0, &nfds, &closed) != GM_OK ||
        m.type != GM__BROKER_REPLY || m.status == GM_OK)
        return GM_OK;
    return gm__set_error(m.status > 0 && m.status < GM_ERRNO_COUNT ? m.status : GM_IO,
                         "the broker on %s refused this process: %s", c->path, m.text);
}

/* HELLO on a new connection (its server's credentials checked first: no
 * byte goes to, or is taken from, a server of another uid); the reply in
 * *m. */
static int hello(gm__broker_client_t *c, int fd, unsigned flags, uint64_t adopt, gm__broker_msg_t *m)
{
    GM_CHECK(gm__broker_check_server(fd, c->path));
    msg_init(m, GM__BROKER_HELLO);
    m->flags = flags;
    m->pid = getpid();
    m->device = c->pool->cfg.device;
    m->page_size = c->pool->page;
    m->adopt = adopt;
    m->client = c->client;
    m->cookie = c->cookie;
    int rc = gm__wire_send(fd, m, sizeof *m, NULL, 0, 0, "broker");
    if (rc != GM_OK) {
        char err[256];
        snprintf(err, sizeof err, "%s", gm_last_error());
        GM_CHECK(turned_away(c, fd));
        return gm__set_error(rc, "%s", err);
    }
    bool closed;
    size_t nfds;
    rc = msg_recv(fd, m, NULL, 0, &nfds, &closed);
    if (rc == GM_NOT_READY) return gm__set_error(GM_IO, "%s", gm_last_error());
    if (rc != GM_OK) return rc;
    if (m->type != GM__BROKER_REPLY)
        return gm__set_error(GM_PARSE, "broker: HELLO answered with type %u", m->type);
    if (m->status != GM_OK)
        return gm__set_error(m->status > 0 && m->status < GM_ERRNO_COUNT ? m->status : GM_IO,
                             "the broker on %s refused this process: %s", c->path, m->text);
    return GM_OK;
}

static void *events_main(void *arg);

/* Connect both connections (mu held, or before the client is shared).
 * adopt: pages the pool keeps from an earlier run. */
static int connect_locked(gm__broker_client_t *c, uint64_t adopt)
{
    int fd = -1, efd = -1, rc;
    gm__broker_msg_t m;
    GM_CHECK(gm__wire_connect("broker", c->path, TIMEOUT_S, &fd));
    c->client = c->cookie = 0;
    rc = hello(c, fd, 0, adopt, &m);
    if (rc != GM_OK) goto fail;
    if (m.page_size != c->pool->page) {
        rc = gm__set_error(GM_INVALID_STATE, "the broker on %s leases pages of %" PRIu64
                           " bytes; this pool's device uses %zu", c->path, m.page_size,
                           c->pool->page);
        goto fail;
    }
    c->client = m.client;
    c->cookie = m.cookie;
    c->generation = m.generation;
    /* Of the pages claimed, those the broker's lease record proved: the
     * others are released without telling it (it did not count them). */
    c->adopt_booked = m.adopt < adopt ? m.adopt : adopt;
    c->quota = m.quota;
    c->used = m.used;
    snprintf(c->tenant, sizeof c->tenant, "%s", m.tenant);
    rc = gm__wire_connect("broker", c->path, TIMEOUT_S, &efd);
    if (rc != GM_OK) goto fail;
    rc = hello(c, efd, GM__BROKER_FLAG_EVENTS, 0, &m);
    if (rc != GM_OK) goto fail;
    c->fd = fd;
    if (c->efd >= 0) {
        if (c->retired_efd >= 0) close(c->retired_efd); /* the thread is past it */
        c->retired_efd = c->efd;
    }
    c->efd = efd;
    c->epoch++;
    if (c->wake[1] >= 0) {
        ssize_t w = write(c->wake[1], "r", 1);
        (void)w;
    }
    return GM_OK;
fail:
    if (fd >= 0) close(fd);
    if (efd >= 0) close(efd);
    return rc;
}

/* Release handles locally (mapped nowhere) through the pool's backend. */
static void release_local(gm__broker_client_t *c, const gm__phys_t *h, size_t n)
{
    gm_pool_t *pool = c->pool;
    for (size_t i = 0; i < n; i++) {
        int rc;
        GM_BK(rc, pool, phys_release, (pool->bk, h[i]));
        if (rc != GM_OK) gm__clear_error();
    }
}

/* The reason given while the broker is away (what went wrong: err). */
static void say_gone(gm__broker_client_t *c, const char *err)
{
    char e[200];
    snprintf(e, sizeof e, "%s", err); /* err may be c->why or the thread's last error */
    snprintf(c->why, sizeof c->why, "the broker on %s is gone (%s); pages already held stay "
             "usable, new ones come when it is back", c->path, e);
}

/* The broker is gone: the stock goes (its pages were leased on the dead
 * connection), held pages become adopted at the next connection. */
static void lost_locked(gm__broker_client_t *c, const char *what)
{
    say_gone(c, what);
    close_conn(c);
    release_local(c, c->stock_h, c->n_stock);
    c->n_stock = 0;
}

/* A usable control connection (mu held): reconnect when it is gone. */
static int ensure_locked(gm__broker_client_t *c)
{
    if (c->fd >= 0) return GM_OK;
    uint64_t now = gm__now_ns();
    if (c->last_try_ns && now - c->last_try_ns < RECONNECT_GAP_NS)
        return gm__set_error(GM_IO, "%s", c->why);
    c->last_try_ns = now;
    int rc = connect_locked(c, c->n_held);
    if (rc != GM_OK) {
        say_gone(c, gm_last_error());
        return gm__set_error(GM_IO, "%s", c->why);
    }
    c->why[0] = '\0';
    return GM_OK;
}

/* ---- stock ------------------------------------------------------------------ */

static int stock_reserve(gm__broker_client_t *c, size_t more)
{
    if (c->n_stock + more <= c->cap_stock) return GM_OK;
    size_t cap = c->cap_stock ? c->cap_stock : 64;
    while (cap < c->n_stock + more) cap *= 2;
    gm__phys_t *h = gm__realloc(c->stock_h, cap * sizeof *h);
    if (h) c->stock_h = h;
    uint64_t *id = gm__realloc(c->stock_id, cap * sizeof *id);
    if (id) c->stock_id = id;
    if (!h || !id) return gm__set_error(GM_NO_HOST_MEMORY, "broker: out of host memory");
    c->cap_stock = cap;
    return GM_OK;
}

/* Give stock[0..n) back to the broker, 64 at a time: each batch released
 * here and taken off the stock first, then named to the broker.  A broker
 * that is gone takes nothing back (its books died with it): lost_locked
 * releases what is left of the stock. */
static void give_stock_locked(gm__broker_client_t *c, size_t n)
{
    if (n > c->n_stock) n = c->n_stock;
    while (n > 0 && c->n_stock > 0) {
        gm__broker_msg_t m;
        msg_init(&m, GM__BROKER_RETURN);
        size_t k = n < GM__BROKER_IDS ? n : GM__BROKER_IDS;
        release_local(c, c->stock_h, k);
        memcpy(m.ids, c->stock_id, k * sizeof *m.ids);
        memmove(c->stock_h, c->stock_h + k, (c->n_stock - k) * sizeof *c->stock_h);
        memmove(c->stock_id, c->stock_id + k, (c->n_stock - k) * sizeof *c->stock_id);
        c->n_stock -= k;
        n -= k;
        atomic_fetch_add_explicit(&c->returned_pages, k, memory_order_relaxed);
        if (c->fd < 0) continue;
        m.count = k;
        m.cached = c->n_stock;
        if (gm__wire_send(c->fd, &m, sizeof m, NULL, 0, 0, "broker") != GM_OK) {
            lost_locked(c, gm_last_error());
            gm__clear_error();
            return;
        }
    }
}

/* Read a lease's reply and take its pages into the stock (mu held): for the
 * lease just sent (min..count pages), or for one whose reply was late
 * (min 0: whatever the broker granted is ours by its books).  A reply that
 * does not come within the timeout leaves c->owed set and the connection
 * open: closing it would tell the broker this process is gone, and it
 * would lease the pages this process maps to someone else. */
static int lease_reply_locked(gm__broker_client_t *c, size_t min, size_t count, uint64_t t0)
{
    gm__broker_msg_t m;
    int fds[GM__BROKER_IDS];
    size_t nfds = 0;
    bool closed = false;
    int rc = msg_recv(c->fd, &m, fds, GM__BROKER_IDS, &nfds, &closed);
    if (rc == GM_NOT_READY) {
        c->owed = true;
        snprintf(c->why, sizeof c->why, "the broker on %s did not answer a lease in %d s; "
                 "its answer is taken at the next request", c->path, TIMEOUT_S);
        return gm__set_error(GM_IO, "%s", c->why);
    }
    if (rc != GM_OK) {
        lost_locked(c, gm_last_error());
        return gm__set_error(GM_IO, "%s", c->why);
    }
    c->owed = false;
    if (m.type != GM__BROKER_REPLY || (m.status == GM_OK && (m.count < min || m.count > count ||
                                                              nfds != m.count))) {
        for (size_t i = 0; i < nfds; i++) close(fds[i]);
        lost_locked(c, "it answered a lease out of turn");
        return gm__set_error(GM_IO, "%s", c->why);
    }
    c->quota = m.quota;
    c->used = m.used;
    if (m.status != GM_OK) {
        snprintf(c->why, sizeof c->why, "%.255s", m.text);
        return gm__set_error(m.status == GM_LIMIT ? GM_LIMIT : GM_OUT_OF_MEMORY, "%s", m.text);
    }
    /* Import every page; one that fails goes straight back. */
    gm_pool_t *pool = c->pool;
    size_t bad = 0;
    uint64_t bad_ids[GM__BROKER_IDS];
    for (size_t i = 0; i < nfds; i++) {
        gm__phys_t h;
        GM_BK(rc, pool, import_fd, (pool->bk, fds[i], pool->page, &h));
        close(fds[i]);
        if (rc != GM_OK) {
            bad_ids[bad++] = m.ids[i];
            continue;
        }
        c->stock_h[c->n_stock] = h;
        c->stock_id[c->n_stock++] = m.ids[i];
    }
    atomic_fetch_add_explicit(&c->leases, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->leased_pages, nfds - bad, memory_order_relaxed);
    if (t0) atomic_fetch_add_explicit(&c->lease_ns, gm__now_ns() - t0, memory_order_relaxed);
    if (bad) {
        char err[200];
        snprintf(err, sizeof err, "%s", gm_last_error());
        msg_init(&m, GM__BROKER_RETURN);
        memcpy(m.ids, bad_ids, bad * sizeof *bad_ids);
        m.count = bad;
        if (gm__wire_send(c->fd, &m, sizeof m, NULL, 0, 0, "broker") != GM_OK)
            lost_locked(c, gm_last_error());
        if (c->n_stock < min)
            return gm__set_error(GM_BACKEND, "broker: importing a leased page failed: %s", err);
    }
    return GM_OK;
}

/* One lease of min..count pages into the stock (mu held, connected). */
static int lease_locked(gm__broker_client_t *c, size_t min, size_t count)
{
    uint64_t t0 = gm__now_ns();
    GM_CHECK(stock_reserve(c, GM__BROKER_IDS));
    if (c->owed) {
        /* The last lease's answer first, if it has come by now. */
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        if (poll(&p, 1, 0) != 1) return gm__set_error(GM_IO, "%s", c->why);
        int rc = lease_reply_locked(c, 0, GM__BROKER_IDS, 0);
        if (rc != GM_OK && rc != GM_LIMIT && rc != GM_OUT_OF_MEMORY) return rc;
        gm__clear_error();
        if (c->n_stock >= min) return GM_OK;
        GM_CHECK(stock_reserve(c, GM__BROKER_IDS));
    }
    gm__broker_msg_t m;
    msg_init(&m, GM__BROKER_LEASE);
    m.min = min;
    m.count = count;
    m.cached = cached_pages(c);
    if (gm__wire_send(c->fd, &m, sizeof m, NULL, 0, 0, "broker") != GM_OK) {
        lost_locked(c, gm_last_error());
        return gm__set_error(GM_IO, "%s", c->why);
    }
    return lease_reply_locked(c, min, count, t0);
}

/* ---- provider ops (a heap's lock held) --------------------------------------- */

static int obtain(void *ctx, size_t page_size, size_t n, gm__phys_t *handles, size_t *got)
{
    gm__broker_client_t *c = ctx;
    int rc = GM_OK;
    *got = 0;
    gm_assert(page_size == c->pool->page);
    pthread_mutex_lock(&c->mu);
    bool redialed = false;
    while (*got < n) {
        if (c->n_stock == 0) {
            rc = ensure_locked(c);
            if (rc != GM_OK) break;
            size_t want = n - *got;
            if (want > GM__BROKER_IDS) want = GM__BROKER_IDS;
            size_t ask = c->lease_pages > want ? c->lease_pages : want;
            if (ask > GM__BROKER_IDS) ask = GM__BROKER_IDS;
            rc = lease_locked(c, want, ask);
            if (rc == GM_IO && c->fd < 0 && !redialed) {
                /* The connection was found closed by this lease (before the
                 * events thread saw it): a broker closes one that held no
                 * pages and sat idle (idle_timeout), or it restarted.  Dial
                 * once more at once; a broker really gone fails that too. */
                redialed = true;
                c->last_try_ns = 0;
                gm__clear_error();
                continue;
            }
            /* At the quota, pages this process lets go of are the
             * tenant's other processes' to have: see give_back. */
            c->at_quota = rc == GM_LIMIT;
            if (rc != GM_OK) break;
        }
        rc = gm__hash_reserve(&c->held);
        if (rc != GM_OK) break;
        /* Newest first: the oldest stay in the stock to go back first. */
        size_t i = --c->n_stock;
        uint64_t v = c->stock_id[i] | ((uint64_t)(c->epoch & 0xffff) << ID_BITS);
        gm__hash_put(&c->held, (uintptr_t)c->stock_h[i], (void *)(uintptr_t)v);
        c->n_held++;
        handles[(*got)++] = c->stock_h[i];
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static int give_back(void *ctx, const gm__phys_t *handles, size_t n, size_t *done)
{
    gm__broker_client_t *c = ctx;
    int rc = GM_OK;
    size_t unadopt = 0;
    *done = 0;
    pthread_mutex_lock(&c->mu);
    for (size_t k = 0; k < n; k++) {
        uintptr_t v = (uintptr_t)gm__hash_get(&c->held, (uintptr_t)handles[k]);
        gm_assert_internal(v != 0);
        if ((v >> ID_BITS) != (c->epoch & 0xffff)) {
            /* Kept from an earlier broker run: ours to release. */
            int r;
            gm_pool_t *pool = c->pool;
            GM_BK(r, pool, phys_release, (pool->bk, handles[k]));
            if (r != GM_OK) {
                rc = r;
                break;
            }
            if (c->adopt_booked) {
                c->adopt_booked--;
                unadopt++;
            }
        } else {
            rc = stock_reserve(c, 1);
            if (rc != GM_OK) break;
            c->stock_h[c->n_stock] = handles[k];
            c->stock_id[c->n_stock++] = v & ID_MASK;
        }
        gm__hash_take(&c->held, (uintptr_t)handles[k]);
        c->n_held--;
        (*done)++;
    }
    if (unadopt && c->fd >= 0) {
        gm__broker_msg_t m;
        msg_init(&m, GM__BROKER_UNADOPT);
        m.count = unadopt;
        if (gm__wire_send(c->fd, &m, sizeof m, NULL, 0, 0, "broker") != GM_OK) {
            lost_locked(c, gm_last_error());
            gm__clear_error();
        }
    }
    /* Past two leases of stock, the oldest go back down to one lease.  Once
     * a lease was refused for the quota (and until one is granted), all of
     * it goes back: the pages a refused allocation had taken, given back by
     * the pool, would otherwise wait here while another process of the
     * tenant is refused for want of them (and the broker, which saw nothing
     * come back, refuses it without asking this one). */
    if (c->at_quota) give_stock_locked(c, c->n_stock);
    else if (c->n_stock > 2 * c->lease_pages) give_stock_locked(c, c->n_stock - c->lease_pages);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static void describe(void *ctx, char *buf, size_t cap)
{
    gm__broker_client_t *c = ctx;
    pthread_mutex_lock(&c->mu);
    snprintf(buf, cap, "%s", c->why);
    pthread_mutex_unlock(&c->mu);
}

static void flush(void *ctx)
{
    gm__broker_client_t *c = ctx;
    pthread_mutex_lock(&c->mu);
    give_stock_locked(c, c->n_stock);
    pthread_mutex_unlock(&c->mu);
}

static void destroy(void *ctx);

static const gm__page_provider_ops_t broker_ops = {
    .name = "broker",
    .flags = GM__PROVIDER_SHARED | GM__PROVIDER_LEASED | GM__PROVIDER_QUOTA,
    .obtain = obtain,
    .give_back = give_back,
    .describe = describe,
    .flush = flush,
    .destroy = destroy,
};

/* ---- the events thread ------------------------------------------------------- */

/* The broker wants `want` pages back: the stock first, then the pool's free
 * pages (trimmed heap by heap; they come back through give_back). */
static void reclaim(gm__broker_client_t *c, uint64_t want)
{
    atomic_fetch_add_explicit(&c->reclaims, 1, memory_order_relaxed);
    pthread_mutex_lock(&c->mu);
    size_t from_stock = c->n_stock;
    give_stock_locked(c, c->n_stock);
    pthread_mutex_unlock(&c->mu);
    if (from_stock >= want) return;
    uint64_t left = (want - from_stock) * c->pool->page;
    gm_pool_t *h;
    for (unsigned i = 0; left && (h = gm__heap_next(c->pool, &i));) {
        gm__lock(&h->lock);
        size_t cached = h->st.reserved - h->st.active, got = 0;
        size_t keep = cached > left ? cached - (size_t)left : 0;
        if (c->trim_locked(h, keep, &got) != GM_OK) gm__clear_error();
        gm__unlock(&h->lock);
        left = got >= left ? 0 : left - got;
    }
    flush(c);
}

static void *events_main(void *arg)
{
    gm__broker_client_t *c = arg;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        int efd = c->efd;
        pthread_mutex_unlock(&c->mu);
        struct pollfd p[2] = {{.fd = c->wake[0], .events = POLLIN}, {.fd = efd, .events = POLLIN}};
        int n = poll(p, efd >= 0 ? 2 : 1, -1);
        if (n < 0 && errno != EINTR) break;
        if (p[0].revents) {
            char cmd[16];
            ssize_t k = read(c->wake[0], cmd, sizeof cmd);
            if (k <= 0 || memchr(cmd, 'x', (size_t)k)) break;
            pthread_mutex_lock(&c->mu);
            if (c->retired_efd >= 0) close(c->retired_efd);
            c->retired_efd = -1;
            pthread_mutex_unlock(&c->mu);
            continue;
        }
        if (efd < 0 || !p[1].revents) continue;
        gm__broker_msg_t m;
        size_t nfds;
        bool closed;
        int rc = msg_recv(efd, &m, NULL, 0, &nfds, &closed);
        if (rc != GM_OK || m.type != GM__BROKER_RECLAIM) {
            gm__clear_error();
            /* The broker went away (or spoke nonsense): this connection is
             * done; the next request reconnects both. */
            pthread_mutex_lock(&c->mu);
            if (c->efd == efd) {
                close(efd);
                c->efd = -1;
                if (c->fd >= 0) lost_locked(c, "its connection closed");
            }
            pthread_mutex_unlock(&c->mu);
            continue;
        }
        reclaim(c, m.count);
    }
    return NULL;
}

/* ---- creation and teardown --------------------------------------------------- */

int gm__broker_provider_init(gm__page_provider_t *p, gm_pool_t *pool,
                             gm__broker_trim_fn trim_locked)
{
    gm__broker_client_t *c = gm__calloc(1, sizeof *c);
    if (!c) return gm__set_error(GM_NO_HOST_MEMORY, "gm_pool_create: out of host memory");
    pthread_mutex_init(&c->mu, NULL);
    c->pool = pool;
    c->trim_locked = trim_locked;
    c->fd = c->efd = c->retired_efd = -1;
    c->wake[0] = c->wake[1] = -1;
    snprintf(c->path, sizeof c->path, "%s", pool->cfg.broker);
    size_t lease = pool->cfg.broker_lease ? pool->cfg.broker_lease : GM__BROKER_LEASE_DEFAULT;
    c->lease_pages = (lease + pool->page - 1) / pool->page;
    if (c->lease_pages < 1) c->lease_pages = 1;
    if (c->lease_pages > GM__BROKER_IDS) c->lease_pages = GM__BROKER_IDS;
    int rc = gm__hash_init(&c->held, 1024);
    if (rc == GM_OK && pipe2(c->wake, O_CLOEXEC) != 0)
        rc = gm__set_error(GM_IO, "broker: pipe: %s", strerror(errno));
    if (rc == GM_OK) rc = connect_locked(c, 0);
    if (rc == GM_OK && pthread_create(&c->thr, NULL, events_main, c) != 0)
        rc = gm__set_error(GM_NO_HOST_MEMORY, "broker: cannot start its thread");
    if (rc != GM_OK) {
        char err[256];
        snprintf(err, sizeof err, "%s", gm_last_error());
        c->thr_started = false;
        destroy(c);
        return gm__set_error(rc, "gm_pool_create: broker %s: %s", pool->cfg.broker, err);
    }
    c->thr_started = true;
    p->ops = &broker_ops;
    p->ctx = c;
    return GM_OK;
}

void gm__broker_provider_stop(const gm__page_provider_t *p)
{
    if (!gm__broker_provider_is(p)) return;
    gm__broker_client_t *c = p->ctx;
    if (!c->thr_started) return;
    ssize_t w = write(c->wake[1], "x", 1);
    (void)w;
    pthread_join(c->thr, NULL);
    c->thr_started = false;
}

/* After the pool gave every page back: the stock goes to the broker, the
 * connections close (the broker takes back whatever is left). */
static void destroy(void *ctx)
{
    gm__broker_client_t *c = ctx;
    gm__page_provider_t p = {&broker_ops, c};
    gm__broker_provider_stop(&p);
    pthread_mutex_lock(&c->mu);
    give_stock_locked(c, c->n_stock);
    close_conn(c);
    if (c->efd >= 0) close(c->efd);
    if (c->retired_efd >= 0) close(c->retired_efd);
    c->efd = c->retired_efd = -1;
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < 2; i++)
        if (c->wake[i] >= 0) close(c->wake[i]);
    gm__hash_fini(&c->held);
    gm__free(c->stock_h);
    gm__free(c->stock_id);
    pthread_mutex_destroy(&c->mu);
    gm__free(c);
}

bool gm__broker_provider_is(const gm__page_provider_t *p) { return p->ops == &broker_ops; }

void gm__broker_atfork_child(const gm__page_provider_t *p)
{
    if (!gm__broker_provider_is(p)) return;
    gm__broker_client_t *c = p->ctx;
    /* The parent's connections: a child holding them open would keep the
     * parent's lease alive at the broker after the parent dies.  No lock:
     * the child has one thread, and the pool is dead in it. */
    int *fds[] = {&c->fd, &c->efd, &c->retired_efd, &c->wake[0], &c->wake[1]};
    for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++)
        if (*fds[i] >= 0) {
            close(*fds[i]);
            *fds[i] = -1;
        }
}

void gm__broker_provider_stats(const gm__page_provider_t *p, gm__broker_client_stats_t *s)
{
    memset(s, 0, sizeof *s);
    if (!gm__broker_provider_is(p)) return;
    gm__broker_client_t *c = p->ctx;
    pthread_mutex_lock(&c->mu);
    s->connected = c->fd >= 0;
    s->stock_pages = c->n_stock;
    s->held_pages = c->n_held;
    s->quota = c->quota;
    s->tenant_used = c->used;
    snprintf(s->tenant, sizeof s->tenant, "%s", c->tenant);
    pthread_mutex_unlock(&c->mu);
    s->leases = atomic_load_explicit(&c->leases, memory_order_relaxed);
    s->leased_pages = atomic_load_explicit(&c->leased_pages, memory_order_relaxed);
    s->returned_pages = atomic_load_explicit(&c->returned_pages, memory_order_relaxed);
    s->reclaims = atomic_load_explicit(&c->reclaims, memory_order_relaxed);
    s->lease_ns = atomic_load_explicit(&c->lease_ns, memory_order_relaxed);
}
