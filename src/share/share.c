/* SPDX-License-Identifier: Apache-2.0 */
/*
 * share.c — publishing blocks to other processes and importing theirs.
 *
 * Exporter.  A server is a socket and one thread of the library that answers
 * peers (share.h has the exchange).  Publishing a range pins its block: the
 * block gets `shared` set and a hold here (one reference per publication and
 * one per peer mapping).  A gm_free of a held block only marks it freed by
 * its owner (after waiting for the freeing stream); the last reference to go
 * frees it for real, on the NULL stream, whose work cannot touch it.  A held
 * block is live, so its pages stay owned: trim, thinning and page moves never
 * touch them (pages.c only moves pages of free ranges).  A peer that dies
 * closes its socket, which drops its references; the exporter needs to do
 * nothing.
 *
 * Importer.  Each page arrives as a descriptor, is imported as a handle of
 * the importer's own backend and mapped into an address range of its own;
 * the whole range then gets access once (read-only for a read-only name).
 * The physical memory lives while any process holds a handle to it, so an
 * import stays valid when the exporter frees the block or dies.
 *
 * Locks: g_mu guards every server's, client's and hold's books; a heap's lock
 * may be taken under it, never the other way round.  No socket call that can
 * block and no backend call runs under g_mu.  A client's own calls are
 * serialized by its mutex.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "core/kinds.h"
#include "core/pool.h"
#include "observe/observe.h"
#include "share/share.h"
#include "base/wire.h"

/* A connected client that sends nothing for this long while the server
 * waits on it is not waited for; a client waits this long for an answer. */
#define SHARE_TIMEOUT_S 10
/* Most mappings one peer may hold at once. */
#define MAX_RECS_PER_PEER 65536

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

/* A block pinned by sharing: one per block, any number of servers. */
typedef struct hold {
    struct hold *next;
    gm_pool_t *root, *heap;
    uintptr_t base;
    size_t bytes;       /* the block's size */
    unsigned refs;      /* publications + peer mappings */
    bool owner_freed;   /* gm_free'd: freed at refs == 0 */
} hold_t;

/* One published range: its pages are pages [page_first, +npages) of the
 * publication's page sequence (what an importer maps, in one piece). */
typedef struct range {
    uintptr_t ptr, va0;  /* published start; its first page */
    size_t size, npages, page_first;
    hold_t *hold;        /* its block's */
} range_t;

/* A publication's ranges, shared by the publication and the peer mappings
 * made of it (refs); each of them holds one reference on each range's hold. */
typedef struct shape {
    unsigned refs;
    size_t n, npages, bytes;
    range_t r[];
} shape_t;

typedef struct pub {
    struct pub *next;
    char name[GM__SHARE_NAME_MAX];
    char token[GM__SHARE_NAME_MAX];
    int access;
    shape_t *shape;
} pub_t;

/* One peer's mapping of a publication (it lives on after an unpublish). */
typedef struct rec {
    struct rec *next;
    uint64_t id;
    shape_t *shape;
} rec_t;

typedef struct peer {
    int fd;
    pid_t pid;
    uid_t uid;
    rec_t *recs;
    size_t n_recs;
} peer_t;

struct gm_share_server {
    struct gm_share_server *next; /* g_servers */
    pid_t pid;                    /* the process it serves in (not a fork child) */
    gm_pool_t *root;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    int lfd, wake[2];
    pthread_t thread;
    bool running;
    gm_share_policy_t pol;
    uid_t uid;
    pub_t *pubs;
    peer_t *peers;
    size_t n_peers, cap_peers;
    uint64_t next_id;
    uint64_t published, published_bytes, exported_bytes, refused, dropped;
    unsigned logged;              /* lines written by log_line */
    _Atomic bool stop;
};

struct imp {
    struct imp *next;
    char name[GM__SHARE_NAME_MAX];
    uint64_t id;
    uintptr_t va;
    size_t npages;
    gm__phys_t *handles;
    void *ptr;                  /* ranges[0].ptr: the import's name in release */
    gm_share_range_t *ranges;   /* where each published range lies here */
    size_t nranges;
    int access;
    unsigned refs;
};

typedef struct imp imp_t;

struct gm_share_client {
    struct gm_share_client *next; /* g_clients */
    pid_t pid;                    /* the process that connected */
    gm_pool_t *root;
    int fd;
    bool gone;          /* the server closed the connection */
    pthread_mutex_t mu;
    imp_t *imps;
    uint64_t imports, imported_bytes; /* read under g_mu, written under both */
};

static hold_t *g_holds;
static gm_share_server_t *g_servers;
static gm_share_client_t *g_clients;

static void monitor_update(gm_pool_t *pool);
static int imp_destroy(gm_share_client_t *cli, imp_t *imp);

/* ---- messages --------------------------------------------------------------- */

static void msg_init(gm__share_msg_t *m, int type)
{
    memset(m, 0, sizeof *m);
    m->magic = GM__SHARE_MAGIC;
    m->version = GM__SHARE_VERSION;
    m->type = (uint16_t)type;
}

static bool terminated(const char *s, size_t cap) { return memchr(s, '\0', cap) != NULL; }

/* The pool's free of a block sharing held (gm__free_held_locked, api/pool.c),
 * handed down at pool creation (gm__share_set_free) so that sharing does
 * not call up into the entry points (src/FLOORS).  Set before any pool, and
 * so any hold, exists. */
static _Atomic(gm__share_free_fn) free_held_fn; /* every pool creation stores the same */

void gm__share_set_free(gm__share_free_fn fn)
{
    atomic_store_explicit(&free_held_fn, fn, memory_order_release);
}

static int free_held(gm_pool_t *heap, void *ptr, gm_stream_t stream, bool *again)
{
    return atomic_load_explicit(&free_held_fn, memory_order_acquire)(heap, ptr, stream, again);
}

/* gm_stream_synchronize's work, without calling up into the entry points:
 * the same handle check and message, the same backend call. */
static int sync_stream(gm_pool_t *root, gm_stream_t stream)
{
    int rc;
    GM_CHECK(gm__pool_resolve(&root, "gm_stream_synchronize"));
    GM_BK(rc, root, stream_sync, (root->bk, stream));
    return rc;
}

/* One message with fds[0..nfds) attached (wire.h).  flags: MSG_DONTWAIT
 * for the server. */
static int msg_send(int fd, const gm__share_msg_t *m, const int *fds, size_t nfds, int flags)
{
    return gm__wire_send(fd, m, sizeof *m, fds, nfds, flags, "share");
}

/* Receive one message; descriptors attached go to fds[0..*nfds) (cap of
 * them; more, or any with fds NULL, are closed and make it malformed).
 * GM_OK, GM_IO (closed: *closed set; or an error), GM_PARSE (malformed). */
static int msg_recv(int fd, gm__share_msg_t *m, int *fds, size_t cap, size_t *nfds, bool *closed)
{
    int rc = gm__wire_recv(fd, m, sizeof *m, fds, cap, nfds, closed, SHARE_TIMEOUT_S, "share");
    if (rc == GM_NOT_READY) return gm__set_error(GM_IO, "%s", gm_last_error()); /* a timeout */
    if (rc != GM_OK) return rc;
    if (m->magic != GM__SHARE_MAGIC || m->version != GM__SHARE_VERSION ||
        !terminated(m->name, sizeof m->name) || !terminated(m->token, sizeof m->token) ||
        !terminated(m->text, sizeof m->text)) {
        for (size_t i = 0; i < *nfds; i++) close(fds[i]);
        *nfds = 0;
        return gm__set_error(GM_PARSE, "share: malformed message (bad magic, version or text)");
    }
    return GM_OK;
}

/* ---- holds (g_mu held) ------------------------------------------------------ */

static hold_t *hold_find(gm_pool_t *root, uintptr_t base)
{
    for (hold_t *h = g_holds; h; h = h->next)
        if (h->root == root && h->base == base) return h;
    return NULL;
}

/* One reference less.  At none the block is let go: its `shared` mark is
 * cleared and, when its owner freed it, it is freed, both under its heap's
 * lock, so no gm_free of the owner can come between the two.  The record
 * goes to *to_free (for the caller to free, and to update the monitor,
 * once g_mu is dropped). */
static void hold_unref(hold_t *h, hold_t **to_free)
{
    gm_assert(h->refs > 0);
    if (--h->refs) return;
    for (hold_t **pp = &g_holds; *pp; pp = &(*pp)->next)
        if (*pp == h) { *pp = h->next; break; }
    gm__lock(&h->heap->lock);
    gm__block_t *b = gm__hash_get(&h->heap->live, h->base);
    if (b) b->shared = 0;
    bool held;
    if (b && h->owner_freed && free_held(h->heap, (void *)h->base, NULL, &held) != GM_OK)
        gm__clear_error();
    gm__unlock(&h->heap->lock);
    h->next = *to_free;
    *to_free = h;
}

/* One more holder of sh: a reference on each range's hold (g_mu held). */
static void shape_ref(shape_t *sh)
{
    sh->refs++;
    for (size_t i = 0; i < sh->n; i++) sh->r[i].hold->refs++;
}

static void shape_unref(shape_t *sh, hold_t **to_free)
{
    for (size_t i = 0; i < sh->n; i++) hold_unref(sh->r[i].hold, to_free);
    if (--sh->refs == 0) gm__free(sh);
}

/* The hold records hold_unref let go (g_mu not held). */
static void holds_free(hold_t *list)
{
    while (list) {
        hold_t *next = list->next;
        if (list->owner_freed) monitor_update(list->root);
        gm__free(list);
        list = next;
    }
}

/* The hold went between gm_free's unlock and g_mu: an ordinary free now,
 * unless the block was published again meanwhile (*again). */
static int free_let_go(gm_pool_t *heap, void *ptr, gm_stream_t stream, bool *again)
{
    gm__lock(&heap->lock);
    int rc = free_held(heap, ptr, stream, again);
    gm__unlock(&heap->lock);
    return rc;
}

/* gm_free of a block held by sharing (the shared row's free; heap: the heap
 * that holds ptr, no lock held): wait for `stream`, then mark the hold
 * freed by its owner; the last peer to let go frees it (hold_unref). */
static int shared_free(gm_pool_t *heap, gm__kind_rec_t *rec, void *ptr, gm_stream_t stream,
                       size_t *size)
{
    (void)rec, (void)size;
    gm_pool_t *root = heap->root;
    bool again = true;
    int rc = GM_OK;
    while (again) {
        pthread_mutex_lock(&g_mu);
        hold_t *h = hold_find(root, (uintptr_t)ptr);
        if (!h) {
            /* The last reference went between the two locks: free it now. */
            pthread_mutex_unlock(&g_mu);
            rc = free_let_go(heap, ptr, stream, &again);
            continue;
        }
        if (h->owner_freed) {
            pthread_mutex_unlock(&g_mu);
            return gm__set_error(GM_DOUBLE_FREE, "gm_free: %p was already freed (it is kept "
                                 "while other processes map it)", ptr);
        }
        pthread_mutex_unlock(&g_mu);
        /* The block's last use on `stream` is over before it is marked: the
         * real free comes later, on a stream that has nothing queued for it. */
        rc = sync_stream(root, stream);
        if (rc != GM_OK) return rc;
        pthread_mutex_lock(&g_mu);
        h = hold_find(root, (uintptr_t)ptr);
        if (h && !h->owner_freed) {
            h->owner_freed = true;
        } else if (h) {
            rc = gm__set_error(GM_DOUBLE_FREE, "gm_free: %p was already freed (it is kept while "
                               "other processes map it)", ptr);
        }
        pthread_mutex_unlock(&g_mu);
        /* Let go meanwhile: an ordinary free (the stream has nothing queued). */
        if (!h) {
            rc = free_let_go(heap, ptr, stream, &again);
            continue;
        }
        monitor_update(root);
        again = false;
    }
    return rc;
}

/* A device block published or mapped by another process (b->shared): its
 * record is the device block's, in the arenas, so gm_free finds it by the
 * arena's test and the live table, and only its free is this row's,
 * deferred: the free waits for its stream and the block stays live until
 * the last peer lets go.  gm_block_size, gm_record_stream and the leak
 * report take it as the device row does. */
const gm__kind_ops_t gm__kind_shared = {
    .name = "a device block held by sharing",
    .flags = GM__KIND_GM_ALLOC | GM__KIND_FREE_UNLOCKED,
    .free = shared_free,
};

/* ---- the server ------------------------------------------------------------- */

/* One line on stderr for a refused or dropped peer: at most LOG_LINES per
 * server, so a hostile peer cannot flood the log (the counters of
 * gm_share_stats go on counting).  Called by the server thread only. */
#define LOG_LINES 16
static void log_line(gm_share_server_t *srv, const char *fmt, ...) GM_PRINTF(2, 3);
static void log_line(gm_share_server_t *srv, const char *fmt, ...)
{
    if (srv->logged > LOG_LINES) return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (srv->logged++ < LOG_LINES) fprintf(stderr, "gpumem share %s: %s\n", srv->path, line);
    else fprintf(stderr, "gpumem share %s: further refusals and drops are only counted "
                 "(gm_share_stats)\n", srv->path);
}

/* Drop peer i: its mappings' references, its socket (g_mu held). */
static void peer_drop_locked(gm_share_server_t *srv, size_t i, hold_t **to_free)
{
    peer_t *p = &srv->peers[i];
    while (p->recs) {
        rec_t *r = p->recs;
        p->recs = r->next;
        srv->exported_bytes -= r->shape->npages * srv->root->page;
        shape_unref(r->shape, to_free);
        gm__free(r);
    }
    close(p->fd);
    srv->peers[i] = srv->peers[--srv->n_peers];
}

static void reply_error(gm_share_server_t *srv, int fd, int status, const char *fmt, ...)
    GM_PRINTF(4, 5);
static void reply_error(gm_share_server_t *srv, int fd, int status, const char *fmt, ...)
{
    (void)srv;
    gm__share_msg_t m;
    msg_init(&m, GM__SHARE_REPLY);
    m.status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m.text, sizeof m.text, fmt, ap);
    va_end(ap);
    if (msg_send(fd, &m, NULL, 0, MSG_DONTWAIT) != GM_OK) gm__clear_error();
}

static bool policy_allows(const gm_share_server_t *srv, uid_t uid, gid_t gid)
{
    if (uid == srv->uid || uid == 0) return true;
    if (srv->pol.flags & GM_SHARE_ANY_UID) return true;
    return srv->pol.allow_gid >= 0 && (long)gid == srv->pol.allow_gid;
}

/* Returns false when accepting must pause: out of descriptors or memory
 * (the connection stays queued; polling the socket meanwhile would spin). */
static bool accept_peer(gm_share_server_t *srv)
{
    int fd = accept4(srv->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0)
        return !(errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM);
    struct ucred cr;
    socklen_t len = sizeof cr;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0) {
        close(fd);
        return true;
    }
    pthread_mutex_lock(&g_mu);
    unsigned max = srv->pol.max_peers ? srv->pol.max_peers : 64;
    if (!policy_allows(srv, cr.uid, cr.gid)) {
        srv->refused++;
        pthread_mutex_unlock(&g_mu);
        reply_error(srv, fd, GM_DENIED, "uid %u (pid %d) may not connect: the server of uid %u "
                    "admits %s", (unsigned)cr.uid, (int)cr.pid, (unsigned)srv->uid,
                    srv->pol.allow_gid >= 0 ? "its own uid and its group" : "its own uid only");
        log_line(srv, "refused pid %d uid %u gid %u (policy)", (int)cr.pid, (unsigned)cr.uid,
                 (unsigned)cr.gid);
        close(fd);
        return true;
    }
    /* Slots kept for the server's own uid (and root) when others may
     * connect: a quarter of max_peers (at least one, when there are two or
     * more), so peers of other uids holding every slot cannot lock out the
     * owner's importers. */
    if (cr.uid != srv->uid && cr.uid != 0) {
        size_t others = 0;
        for (size_t i = 0; i < srv->n_peers; i++)
            others += srv->peers[i].uid != srv->uid && srv->peers[i].uid != 0;
        unsigned keep = max < 2 ? 0 : max / 4 ? max / 4 : 1;
        if (others >= max - keep) {
            srv->refused++;
            pthread_mutex_unlock(&g_mu);
            reply_error(srv, fd, GM_LIMIT, "the server has %zu peers of other uids than its own "
                        "(%u), the most it admits: %u of its %u slots are kept for its own uid",
                        others, (unsigned)srv->uid, keep, max);
            log_line(srv, "refused pid %d uid %u: %zu peers of other uids already", (int)cr.pid,
                     (unsigned)cr.uid, others);
            close(fd);
            return true;
        }
    }
    if (srv->n_peers < max && srv->n_peers == srv->cap_peers) {
        size_t ncap = srv->cap_peers ? 2 * srv->cap_peers : 8;
        peer_t *np = realloc(srv->peers, ncap * sizeof *np);
        if (np) {
            srv->peers = np;
            srv->cap_peers = ncap;
        }
    }
    if (srv->n_peers >= max || srv->n_peers == srv->cap_peers) {
        srv->refused++;
        pthread_mutex_unlock(&g_mu);
        reply_error(srv, fd, GM_LIMIT, "the server has %zu peers already", srv->n_peers);
        close(fd);
        return true;
    }
    srv->peers[srv->n_peers++] = (peer_t){.fd = fd, .pid = cr.pid, .uid = cr.uid};
    pthread_mutex_unlock(&g_mu);
    gm__share_msg_t m;
    msg_init(&m, GM__SHARE_REPLY);
    m.status = GM_OK;
    m.pid = getpid();
    if (msg_send(fd, &m, NULL, 0, MSG_DONTWAIT) != GM_OK) gm__clear_error();
    return true;
}

static pub_t *pub_find(gm_share_server_t *srv, const char *name)
{
    for (pub_t *p = srv->pubs; p; p = p->next)
        if (strcmp(p->name, name) == 0) return p;
    return NULL;
}

/* Tokens are compared in time that does not depend on where they differ. */
static bool token_ok(const char *want, const char *got)
{
    unsigned char diff = 0;
    for (size_t i = 0; i < GM__SHARE_NAME_MAX; i++) diff |= (unsigned char)(want[i] ^ got[i]);
    return diff == 0;
}

/* IMPORT: a mapping record for the peer and the publication's shape. */
static void on_import(gm_share_server_t *srv, peer_t *p, gm__share_msg_t *m)
{
    char tok[GM__SHARE_NAME_MAX] = {0};
    snprintf(tok, sizeof tok, "%s", m->token);
    pthread_mutex_lock(&g_mu);
    pub_t *pub = pub_find(srv, m->name);
    int status = GM_OK;
    char why[160] = "";
    if (!pub) {
        status = GM_INVALID_ARGUMENT;
        snprintf(why, sizeof why, "no memory is published under '%s'", m->name);
    } else if (!token_ok(pub->token, tok)) {
        status = GM_DENIED;
        snprintf(why, sizeof why, "wrong token for '%s'", m->name);
    } else if (p->n_recs >= MAX_RECS_PER_PEER) {
        status = GM_LIMIT;
        snprintf(why, sizeof why, "this peer holds %d mappings already", MAX_RECS_PER_PEER);
    }
    rec_t *r = status == GM_OK ? gm__calloc(1, sizeof *r) : NULL;
    if (status == GM_OK && !r) {
        status = GM_NO_HOST_MEMORY;
        snprintf(why, sizeof why, "the server is out of host memory");
    }
    gm__share_msg_t out;
    msg_init(&out, GM__SHARE_REPLY);
    if (status == GM_OK) {
        shape_t *sh = pub->shape;
        r->id = ++srv->next_id;
        r->shape = sh;
        r->next = p->recs;
        p->recs = r;
        p->n_recs++;
        shape_ref(sh);
        srv->exported_bytes += sh->npages * srv->root->page;
        out.id = r->id;
        out.size = sh->r[0].size; /* the first range; RANGES tells the others */
        out.offset = sh->r[0].ptr - sh->r[0].va0;
        out.page_size = srv->root->page;
        out.npages = sh->npages;
        out.nranges = (uint32_t)sh->n;
        out.device = srv->root->cfg.device;
        out.access = (uint32_t)pub->access;
    } else {
        out.status = status;
        snprintf(out.text, sizeof out.text, "%s", why);
    }
    pthread_mutex_unlock(&g_mu);
    if (msg_send(p->fd, &out, NULL, 0, MSG_DONTWAIT) != GM_OK) gm__clear_error();
    if (status == GM_OK) monitor_update(srv->root);
}

static rec_t *rec_find(peer_t *p, uint64_t id, rec_t ***link)
{
    for (rec_t **pp = &p->recs; *pp; pp = &(*pp)->next)
        if ((*pp)->id == id) {
            if (link) *link = pp;
            return *pp;
        }
    return NULL;
}

/* PAGES: the descriptors of count pages from first.  Returns false when the
 * peer is to be dropped (a request outside its mapping). */
static bool on_pages(gm_share_server_t *srv, peer_t *p, gm__share_msg_t *m)
{
    pthread_mutex_lock(&g_mu);
    rec_t *r = rec_find(p, m->id, NULL);
    shape_t *sh = r ? r->shape : NULL;
    bool ok = r && m->count >= 1 && m->count <= GM__SHARE_FDS_MAX && m->first < sh->npages &&
              m->count <= sh->npages - m->first;
    /* The record holds the blocks live, so the shape and the pages stay;
     * the page tables are read under each heap's lock. */
    pthread_mutex_unlock(&g_mu);
    if (!ok) return false;
    gm__phys_t h[GM__SHARE_FDS_MAX];
    int fds[GM__SHARE_FDS_MAX];
    size_t n = 0, count = (size_t)m->count, page = srv->root->page;
    int rc = GM_OK;
    size_t lo = 0, hi = sh->n; /* the range holding page `first` */
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (sh->r[mid].page_first <= m->first) lo = mid;
        else hi = mid;
    }
    for (size_t got = 0, ri = lo; rc == GM_OK && got < count; ri++) {
        const range_t *g = &sh->r[ri];
        size_t at = (size_t)m->first + got - g->page_first;
        size_t run = g->npages - at < count - got ? g->npages - at : count - got;
        gm_pool_t *heap = g->hold->heap;
        gm__lock(&heap->lock);
        rc = gm__pages_handles_locked(heap, g->va0 + at * page, run, h + got);
        gm__unlock(&heap->lock);
        got += run;
    }
    gm_pool_t *heap = srv->root;
    for (; rc == GM_OK && n < count; n++) {
        GM_BK(rc, heap, export_fd, (heap->bk, h[n], &fds[n]));
        if (rc != GM_OK) break;
    }
    gm__share_msg_t out;
    msg_init(&out, GM__SHARE_REPLY);
    if (rc == GM_OK) {
        out.nfds = (uint32_t)count;
        out.first = m->first;
        out.count = m->count;
    } else {
        out.status = rc;
        snprintf(out.text, sizeof out.text, "%s", gm_last_error());
        gm__clear_error();
    }
    if (msg_send(p->fd, &out, fds, rc == GM_OK ? count : 0, MSG_DONTWAIT) != GM_OK)
        gm__clear_error();
    for (size_t i = 0; i < n; i++) close(fds[i]);
    return true;
}

/* RANGES: where ranges [first, first + count) lie in the page sequence. */
static bool on_ranges(gm_share_server_t *srv, peer_t *p, gm__share_msg_t *m)
{
    gm__share_msg_t out;
    msg_init(&out, GM__SHARE_REPLY);
    pthread_mutex_lock(&g_mu);
    rec_t *r = rec_find(p, m->id, NULL);
    bool ok = r && m->count >= 1 && m->count <= GM__SHARE_RANGES_PER_MSG &&
              m->first < r->shape->n && m->count <= r->shape->n - m->first;
    if (ok) {
        for (size_t i = 0; i < m->count; i++) {
            const range_t *g = &r->shape->r[m->first + i];
            out.rng[i][0] = g->page_first;
            out.rng[i][1] = g->ptr - g->va0;
            out.rng[i][2] = g->size;
        }
        out.first = m->first;
        out.count = m->count;
    }
    pthread_mutex_unlock(&g_mu);
    if (ok && msg_send(p->fd, &out, NULL, 0, MSG_DONTWAIT) != GM_OK) gm__clear_error();
    (void)srv;
    return ok;
}

/* One message from peer i; false: drop it. */
static bool on_message(gm_share_server_t *srv, size_t i, hold_t **to_free)
{
    peer_t *p = &srv->peers[i];
    gm__share_msg_t m;
    size_t nfds;
    bool closed;
    int rc = msg_recv(p->fd, &m, NULL, 0, &nfds, &closed);
    if (rc != GM_OK) {
        if (!closed && rc == GM_PARSE) {
            pthread_mutex_lock(&g_mu);
            srv->dropped++;
            pthread_mutex_unlock(&g_mu);
            log_line(srv, "dropped pid %d uid %u: %s", (int)p->pid, (unsigned)p->uid,
                     gm_last_error());
        }
        gm__clear_error();
        return false;
    }
    switch (m.type) {
    case GM__SHARE_IMPORT:
        on_import(srv, p, &m);
        return true;
    case GM__SHARE_PAGES:
        if (on_pages(srv, p, &m)) return true;
        break;
    case GM__SHARE_RANGES:
        if (on_ranges(srv, p, &m)) return true;
        break;
    case GM__SHARE_RELEASE: {
        pthread_mutex_lock(&g_mu);
        rec_t **link;
        rec_t *r = rec_find(p, m.id, &link);
        if (r) {
            *link = r->next;
            p->n_recs--;
            srv->exported_bytes -= r->shape->npages * srv->root->page;
            shape_unref(r->shape, to_free);
            gm__free(r);
        }
        pthread_mutex_unlock(&g_mu);
        if (r) return true;
        break;
    }
    default:
        break;
    }
    pthread_mutex_lock(&g_mu);
    srv->dropped++;
    pthread_mutex_unlock(&g_mu);
    log_line(srv, "dropped pid %d uid %u: unexpected request (type %u, id %" PRIu64 ")",
             (int)p->pid, (unsigned)p->uid, (unsigned)m.type, m.id);
    return false;
}

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void *server_main(void *arg)
{
    gm_share_server_t *srv = arg;
    struct pollfd *pfd = NULL;
    size_t cap = 0;
    uint64_t pause_until = 0; /* accepting paused till then (out of descriptors), ns */
    while (!atomic_load(&srv->stop)) {
        pthread_mutex_lock(&g_mu);
        size_t n = srv->n_peers;
        if (n + 2 > cap) {
            struct pollfd *np = realloc(pfd, (n + 2) * sizeof *np);
            if (np) { pfd = np; cap = n + 2; }
        }
        size_t k = n + 2 <= cap ? n : (cap >= 2 ? cap - 2 : 0);
        if (pfd) {
            pfd[0] = (struct pollfd){.fd = srv->wake[0], .events = POLLIN};
            pfd[1] = (struct pollfd){.fd = pause_until ? -1 : srv->lfd, .events = POLLIN};
            for (size_t i = 0; i < k; i++)
                pfd[2 + i] = (struct pollfd){.fd = srv->peers[i].fd, .events = POLLIN};
        }
        pthread_mutex_unlock(&g_mu);
        if (!pfd) { usleep(10000); continue; }
        int wait_ms = -1;
        if (pause_until) {
            uint64_t now = now_ns();
            wait_ms = now >= pause_until ? 0 : (int)((pause_until - now) / 1000000 + 1);
        }
        int r = poll(pfd, k + 2, wait_ms);
        if (pause_until && now_ns() >= pause_until) pause_until = 0; /* accept again */
        if (r <= 0) continue;
        if (pfd[0].revents) {
            char buf[64];
            while (read(srv->wake[0], buf, sizeof buf) > 0) {}
            continue;
        }
        if ((pfd[1].revents & POLLIN) && !accept_peer(srv)) pause_until = now_ns() + 100000000;
        /* Peers only leave here, so pfd[2 + i] is still peers[i] (walked
         * from the top: a drop moves the last peer into i). */
        for (size_t i = k; i-- > 0;) {
            if (!pfd[2 + i].revents) continue;
            hold_t *to_free = NULL;
            uint64_t before = srv->exported_bytes; /* written by this thread only */
            if (!on_message(srv, i, &to_free)) {
                pthread_mutex_lock(&g_mu);
                peer_drop_locked(srv, i, &to_free);
                pthread_mutex_unlock(&g_mu);
            }
            holds_free(to_free);
            if (srv->exported_bytes < before) monitor_update(srv->root);
        }
    }
    free(pfd);
    return NULL;
}

static int claim_path(const char *path) { return gm__wire_claim_path("gm_share_listen", path); }

static int check_path(const char *fn, const char *path) { return gm__wire_check_path(fn, path); }

int gm_share_listen(gm_pool_t *pool, const char *path, const gm_share_policy_t *policy,
                    gm_share_server_t **server)
{
    if (!server) return gm__set_error(GM_INVALID_ARGUMENT, "gm_share_listen: server is NULL");
    *server = NULL;
    GM_CHECK(gm__pool_resolve(&pool, __func__));
    GM_CHECK(check_path(__func__, path));
    gm_share_policy_t pol = GM_SHARE_POLICY_INIT;
    if (policy) {
        if (policy->size < sizeof pol || policy->version != GM_SHARE_POLICY_VERSION)
            return gm__set_error(GM_INVALID_ARGUMENT, "gm_share_listen: policy of size %zu "
                                 "version %u (initialize it with GM_SHARE_POLICY_INIT)",
                                 policy->size, policy->version);
        if (policy->flags & ~GM_SHARE_ANY_UID)
            return gm__set_error(GM_INVALID_ARGUMENT, "gm_share_listen: unknown policy flags %#x",
                                 policy->flags);
        pol = *policy;
    }
    GM_CHECK(claim_path(path));
    gm_share_server_t *srv = gm__calloc(1, sizeof *srv);
    if (!srv) return gm__set_error(GM_NO_HOST_MEMORY, "gm_share_listen: out of host memory");
    srv->root = pool;
    srv->pid = getpid();
    srv->pol = pol;
    srv->uid = geteuid();
    srv->lfd = srv->wake[0] = srv->wake[1] = -1;
    memcpy(srv->path, path, strlen(path) + 1);
    int rc = GM_OK;
    srv->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (srv->lfd < 0 || pipe2(srv->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        rc = gm__set_error(GM_IO, "gm_share_listen: %s", strerror(errno));
        goto fail;
    }
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    memcpy(a.sun_path, path, strlen(path) + 1);
    mode_t mode = (pol.flags & GM_SHARE_ANY_UID) ? 0666 : pol.allow_gid >= 0 ? 0660 : 0600;
    /* Made with the final mode, not widened after: no window in which a
     * process the policy refuses could connect by the file's mode. */
    mode_t old = umask(0777 & ~mode);
    int b = bind(srv->lfd, (struct sockaddr *)&a, sizeof a);
    int err = errno;
    umask(old);
    if (b != 0) {
        rc = gm__set_error(err == EADDRINUSE ? GM_INVALID_STATE : GM_IO,
                           "gm_share_listen: bind %s: %s", path, strerror(err));
        goto fail;
    }
    if (pol.allow_gid >= 0 && chown(path, (uid_t)-1, (gid_t)pol.allow_gid) != 0) {
        rc = gm__set_error(GM_IO, "gm_share_listen: chown %s to gid %ld: %s", path,
                           pol.allow_gid, strerror(errno));
        unlink(path);
        goto fail;
    }
    if (listen(srv->lfd, 64) != 0) {
        rc = gm__set_error(GM_IO, "gm_share_listen: listen %s: %s", path, strerror(errno));
        unlink(path);
        goto fail;
    }
    if (pthread_create(&srv->thread, NULL, server_main, srv) != 0) {
        rc = gm__set_error(GM_IO, "gm_share_listen: cannot start the server thread");
        unlink(path);
        goto fail;
    }
    srv->running = true;
    pthread_mutex_lock(&g_mu);
    srv->next = g_servers;
    g_servers = srv;
    pthread_mutex_unlock(&g_mu);
    *server = srv;
    return GM_OK;
fail:
    if (srv->lfd >= 0) close(srv->lfd);
    if (srv->wake[0] >= 0) close(srv->wake[0]);
    if (srv->wake[1] >= 0) close(srv->wake[1]);
    gm__free(srv);
    return rc;
}

static bool server_known_locked(const gm_share_server_t *srv)
{
    for (gm_share_server_t *s = g_servers; s; s = s->next)
        if (s == srv) return s->pid == getpid();
    return false;
}

static int check_name(const char *fn, const char *name, const char *what)
{
    if (!name) return gm__set_error(GM_INVALID_ARGUMENT, "%s: %s is NULL", fn, what);
    size_t n = strnlen(name, GM__SHARE_NAME_MAX);
    if (n == 0 || n >= GM__SHARE_NAME_MAX)
        return gm__set_error(GM_INVALID_ARGUMENT, "%s: %s must have 1 to %d characters", fn,
                             what, GM__SHARE_NAME_MAX - 1);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)name[i] < 0x21 || (unsigned char)name[i] > 0x7e)
            return gm__set_error(GM_INVALID_ARGUMENT, "%s: %s has a character that is not "
                                 "printable ASCII (byte %zu)", fn, what, i);
    return GM_OK;
}

/* The live block of heap holding [p, p + n) (lock held), or a refusal. */
static int publishable_locked(gm_pool_t *heap, uintptr_t p, size_t n, gm__block_t **out)
{
    gm__block_t *b = gm__block_at_locked(heap, p);
    if (!b)
        return gm__set_error(GM_INVALID_POINTER, "gm_share_publish: %p was not allocated by this "
                             "pool", (void *)p);
    if (b->free || b->pending || atomic_load(&b->tc_cached))
        return gm__set_error(GM_INVALID_POINTER, "gm_share_publish: %p lies in free memory",
                             (void *)p);
    if (b->offloaded)
        return gm__set_error(GM_INVALID_STATE, "gm_share_publish: %p is offloaded (gm_offload): "
                             "restore its tag first", (void *)p);
    /* Its tag's offload has checked that nothing of the tag is shared and
     * is moving it: published now, it would be moved under its importers. */
    if (gm__offload_tag_moving(heap->root, b->tag))
        return gm__set_error(GM_INVALID_STATE, "gm_share_publish: %p belongs to tag '%s', which "
                             "is being offloaded (gm_offload, or an eviction) right now: restore "
                             "the tag once that is over, then publish", (void *)p,
                             gm__tag_name(b->tag));
    if (n > b->addr + b->requested - p)
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_share_publish: [%p, +%zu) goes past the "
                             "end of its block (%p, %zu bytes)", (void *)p, n, (void *)b->addr,
                             b->requested);
    uintptr_t lo = p & ~(uintptr_t)(heap->page - 1);
    uintptr_t hi = GM_ALIGN_UP(p + n, heap->page);
    if (lo < b->addr || hi > b->addr + b->size)
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_share_publish: the pages under [%p, +%zu) "
                             "hold other blocks too; allocate memory to publish with "
                             "gm_alloc_shareable", (void *)p, n);
    if (gm__pages_in_extent_locked(heap, b->arena, lo, hi - lo))
        return gm__set_error(GM_NOT_SUPPORTED, "gm_share_publish: the pages under [%p, +%zu) were "
                             "mapped as one physical allocation (a tagged block's, at its "
                             "allocation or restore), which another process cannot map page by "
                             "page; allocate memory to publish with gm_alloc_shareable", (void *)p, n);
    *out = b;
    return GM_OK;
}

int gm_share_publish_ranges(gm_share_server_t *srv, const char *name,
                            const gm_share_range_t *ranges, size_t n, int access,
                            const char *token, gm_stream_t stream)
{
    GM_CHECK(check_name(__func__, name, "name"));
    if (token && *token) GM_CHECK(check_name(__func__, token, "token"));
    if (!ranges || n == 0 || n > GM_SHARE_RANGES_MAX)
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_share_publish: %zu ranges (1 to %d)", n,
                             GM_SHARE_RANGES_MAX);
    for (size_t i = 0; i < n; i++)
        if (!ranges[i].ptr || ranges[i].size == 0)
            return gm__set_error(GM_INVALID_ARGUMENT, "gm_share_publish: range %zu is empty", i);
    if (access != GM_SHARE_READ_WRITE && access != GM_SHARE_READ_ONLY)
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_share_publish: access %d (use "
                             "GM_SHARE_READ_WRITE or GM_SHARE_READ_ONLY)", access);
    pthread_mutex_lock(&g_mu);
    bool known = srv && server_known_locked(srv);
    gm_pool_t *root = known ? srv->root : NULL;
    pthread_mutex_unlock(&g_mu);
    if (!known) return gm__set_error(GM_INVALID_ARGUMENT, "gm_share_publish: not an open server");
    /* A broker hands this process's pages to another tenant once it lets
     * them go or dies; a peer's mapping of them would outlive that. */
    if (root->provider.ops->flags & GM__PROVIDER_LEASED)
        return gm__set_error(GM_NOT_SUPPORTED, "gm_share_publish: the pool leases its pages from "
                             "a broker, which gives them to other tenants after this process; "
                             "publish from a pool without a broker");
    /* What was written on stream is in memory before anyone can map it. */
    GM_CHECK(sync_stream(root, stream));

    size_t page = root->page;
    pub_t *pub = gm__calloc(1, sizeof *pub);
    shape_t *sh = gm__calloc(1, sizeof *sh + n * sizeof(range_t));
    hold_t **fresh = gm__calloc(n, sizeof *fresh); /* a hold record ready per range */
    int rc = GM_OK;
    for (size_t i = 0; fresh && i < n; i++)
        if (!(fresh[i] = gm__calloc(1, sizeof(hold_t)))) break;
    if (!pub || !sh || !fresh || !fresh[n - 1]) {
        rc = gm__set_error(GM_NO_HOST_MEMORY, "gm_share_publish: out of host memory");
        goto out_free;
    }
    pthread_mutex_lock(&g_mu);
    if (!server_known_locked(srv)) {
        rc = gm__set_error(GM_INVALID_ARGUMENT, "gm_share_publish: not an open server");
        goto out;
    }
    if (pub_find(srv, name)) {
        rc = gm__set_error(GM_INVALID_ARGUMENT, "gm_share_publish: '%s' is published already",
                           name);
        goto out;
    }
    /* Each range is checked and held under its heap's lock, so no gm_free
     * can come between the two; a refused range lets go of those before. */
    hold_t *undone = NULL;
    size_t i;
    for (i = 0; i < n; i++) {
        uintptr_t ptr = (uintptr_t)ranges[i].ptr;
        gm_pool_t *heap = gm__heap_of(root, ranges[i].ptr);
        gm__lock(&heap->lock);
        gm__block_t *b = NULL;
        rc = publishable_locked(heap, ptr, ranges[i].size, &b);
        hold_t *h = rc == GM_OK ? hold_find(root, b->addr) : NULL;
        if (h && h->owner_freed)
            rc = gm__set_error(GM_INVALID_POINTER, "gm_share_publish: %p was freed",
                               ranges[i].ptr);
        if (rc == GM_OK) {
            if (!h) {
                h = fresh[i];
                fresh[i] = NULL;
                *h = (hold_t){.next = g_holds, .root = root, .heap = heap, .base = b->addr,
                              .bytes = b->size};
                g_holds = h;
            }
            h->refs++; /* the publication's reference on this range */
            b->shared = 1;
            /* A thread cache that knew the block must ask the locked path now. */
            atomic_store_explicit(&b->tc_gen, ++heap->tc_next, memory_order_release);
        }
        gm__unlock(&heap->lock);
        if (rc != GM_OK) break;
        range_t *g = &sh->r[i];
        g->ptr = ptr;
        g->va0 = ptr & ~(uintptr_t)(page - 1);
        g->size = ranges[i].size;
        g->npages = (GM_ALIGN_UP(ptr + g->size, page) - g->va0) / page;
        g->page_first = sh->npages;
        g->hold = h;
        sh->npages += g->npages;
        sh->bytes += g->size;
    }
    if (rc != GM_OK) {
        if (n > 1) {
            char why[GM__SHARE_TEXT_MAX];
            snprintf(why, sizeof why, "%s", gm_last_error());
            gm__set_error(rc, "range %zu: %s", i, why);
        }
        for (size_t k = 0; k < i; k++) hold_unref(sh->r[k].hold, &undone);
        pthread_mutex_unlock(&g_mu);
        holds_free(undone); /* none was freed by its owner: only records */
        goto out_free;
    }
    sh->n = n;
    sh->refs = 1; /* the publication (its hold references were taken above) */
    snprintf(pub->name, sizeof pub->name, "%s", name);
    if (token) snprintf(pub->token, sizeof pub->token, "%s", token);
    pub->access = access;
    pub->shape = sh;
    pub->next = srv->pubs;
    srv->pubs = pub;
    srv->published++;
    srv->published_bytes += sh->bytes;
    pub = NULL;
    sh = NULL;
out:
    pthread_mutex_unlock(&g_mu);
out_free:
    gm__free(pub);
    gm__free(sh);
    for (size_t k = 0; fresh && k < n; k++) gm__free(fresh[k]);
    gm__free(fresh);
    return rc;
}

int gm_share_publish(gm_share_server_t *srv, const char *name, void *ptr, size_t size, int access,
                     const char *token, gm_stream_t stream)
{
    if (!ptr || size == 0)
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_share_publish: empty range");
    gm_share_range_t r = {ptr, size};
    return gm_share_publish_ranges(srv, name, &r, 1, access, token, stream);
}

/* Take pub out of srv (g_mu held). */
static void pub_remove_locked(gm_share_server_t *srv, pub_t *pub, hold_t **to_free)
{
    for (pub_t **pp = &srv->pubs; *pp; pp = &(*pp)->next)
        if (*pp == pub) { *pp = pub->next; break; }
    srv->published--;
    srv->published_bytes -= pub->shape->bytes;
    shape_unref(pub->shape, to_free);
    gm__free(pub);
}

int gm_share_unpublish(gm_share_server_t *srv, const char *name)
{
    GM_CHECK(check_name(__func__, name, "name"));
    hold_t *to_free = NULL;
    int rc = GM_OK;
    pthread_mutex_lock(&g_mu);
    pub_t *pub = srv && server_known_locked(srv) ? pub_find(srv, name) : NULL;
    if (pub) pub_remove_locked(srv, pub, &to_free);
    else if (!srv || !server_known_locked(srv))
        rc = gm__set_error(GM_INVALID_ARGUMENT, "gm_share_unpublish: not an open server");
    else
        rc = gm__set_error(GM_INVALID_ARGUMENT, "gm_share_unpublish: '%s' is not published", name);
    pthread_mutex_unlock(&g_mu);
    holds_free(to_free);
    return rc;
}

int gm_share_close(gm_share_server_t *srv)
{
    if (!srv) return GM_OK;
    pthread_mutex_lock(&g_mu);
    bool known = false;
    for (gm_share_server_t **pp = &g_servers; *pp; pp = &(*pp)->next)
        if (*pp == srv && srv->pid == getpid()) { *pp = srv->next; known = true; break; }
    pthread_mutex_unlock(&g_mu);
    if (!known) return gm__set_error(GM_INVALID_ARGUMENT, "gm_share_close: not an open server");
    atomic_store(&srv->stop, true);
    ssize_t w;
    do w = write(srv->wake[1], "x", 1);
    while (w < 0 && errno == EINTR);
    pthread_join(srv->thread, NULL);
    hold_t *to_free = NULL;
    pthread_mutex_lock(&g_mu);
    while (srv->n_peers) peer_drop_locked(srv, srv->n_peers - 1, &to_free);
    while (srv->pubs) pub_remove_locked(srv, srv->pubs, &to_free);
    pthread_mutex_unlock(&g_mu);
    holds_free(to_free);
    close(srv->lfd);
    close(srv->wake[0]);
    close(srv->wake[1]);
    unlink(srv->path);
    free(srv->peers);
    gm__free(srv);
    return GM_OK;
}

/* ---- the client ------------------------------------------------------------- */

/* A request (client mutex held).  A failure ends the connection's use. */
static int req_send(gm_share_client_t *cli, const gm__share_msg_t *m)
{
    if (cli->gone)
        return gm__set_error(GM_IO, "share: the connection to the server is closed (the server "
                             "went away or broke the exchange)");
    int rc = msg_send(cli->fd, m, NULL, 0, 0);
    if (rc != GM_OK) cli->gone = true;
    return rc;
}

/* The next reply (client mutex held).  A refusal by the server is its status
 * with its reason; a lost, late or malformed answer leaves the exchange out
 * of step, so the connection is not used again (imports made so far stay
 * valid). */
static int rep_recv(gm_share_client_t *cli, gm__share_msg_t *m, int *fds, size_t cap,
                    size_t *nfds)
{
    bool closed = false;
    size_t got = 0;
    int rc = msg_recv(cli->fd, m, fds, cap, &got, &closed);
    if (nfds) *nfds = got;
    if (rc != GM_OK) {
        cli->gone = true;
        return rc;
    }
    if (m->type != GM__SHARE_REPLY) {
        for (size_t i = 0; i < got; i++) close(fds[i]);
        if (nfds) *nfds = 0;
        cli->gone = true;
        return gm__set_error(GM_PARSE, "share: the server answered with type %u", m->type);
    }
    if (m->status != GM_OK) {
        int st = m->status > 0 && m->status < GM_ERRNO_COUNT ? m->status : GM_IO;
        return gm__set_error(st, "share: the server refused: %s", m->text);
    }
    return GM_OK;
}

/* One request, one reply. */
static int roundtrip(gm_share_client_t *cli, gm__share_msg_t *m, int *fds, size_t cap,
                     size_t *nfds)
{
    if (nfds) *nfds = 0;
    GM_CHECK(req_send(cli, m));
    return rep_recv(cli, m, fds, cap, nfds);
}

int gm_share_connect(gm_pool_t *pool, const char *path, gm_share_client_t **client)
{
    if (!client) return gm__set_error(GM_INVALID_ARGUMENT, "gm_share_connect: client is NULL");
    *client = NULL;
    GM_CHECK(gm__pool_resolve(&pool, __func__));
    GM_CHECK(check_path(__func__, path));
    int fd;
    GM_CHECK(gm__wire_connect("gm_share_connect", path, SHARE_TIMEOUT_S, &fd));
    int rc;
    uid_t peer_uid;
    rc = gm__wire_peer(fd, NULL, &peer_uid, NULL);
    if (rc != GM_OK) {
        close(fd);
        return rc;
    }
    if (peer_uid != geteuid() && peer_uid != 0) {
        close(fd);
        return gm__set_error(GM_DENIED, "gm_share_connect: the server on %s runs as uid %u, "
                             "not as this process's uid %u (nor root)", path, (unsigned)peer_uid,
                             (unsigned)geteuid());
    }
    gm_share_client_t *cli = gm__calloc(1, sizeof *cli);
    if (!cli) {
        close(fd);
        return gm__set_error(GM_NO_HOST_MEMORY, "gm_share_connect: out of host memory");
    }
    cli->root = pool;
    cli->pid = getpid();
    cli->fd = fd;
    pthread_mutex_init(&cli->mu, NULL);
    /* The server's greeting: admitted, or why not. */
    gm__share_msg_t m;
    bool closed;
    size_t nfds;
    rc = msg_recv(fd, &m, NULL, 0, &nfds, &closed);
    if (rc == GM_OK && m.type != GM__SHARE_REPLY)
        rc = gm__set_error(GM_PARSE, "gm_share_connect: the server greeted with type %u", m.type);
    if (rc == GM_OK && m.status != GM_OK)
        rc = gm__set_error(m.status > 0 && m.status < GM_ERRNO_COUNT ? m.status : GM_IO,
                           "gm_share_connect: the server refused: %s", m.text);
    if (rc != GM_OK) {
        close(fd);
        pthread_mutex_destroy(&cli->mu);
        gm__free(cli);
        return rc;
    }
    pthread_mutex_lock(&g_mu);
    cli->next = g_clients;
    g_clients = cli;
    pthread_mutex_unlock(&g_mu);
    *client = cli;
    return GM_OK;
}

static bool client_known_locked(const gm_share_client_t *cli)
{
    for (gm_share_client_t *c = g_clients; c; c = c->next)
        if (c == cli) return c->pid == getpid();
    return false;
}

static bool client_known(const gm_share_client_t *cli)
{
    pthread_mutex_lock(&g_mu);
    bool k = cli && client_known_locked(cli);
    pthread_mutex_unlock(&g_mu);
    return k;
}

static void send_release(gm_share_client_t *cli, uint64_t id)
{
    if (cli->gone) return;
    gm__share_msg_t m;
    msg_init(&m, GM__SHARE_RELEASE);
    m.id = id;
    if (msg_send(cli->fd, &m, NULL, 0, MSG_DONTWAIT) != GM_OK) gm__clear_error();
}

/* Undo an import's address range of npages: its first nmapped pages
 * mapped, its first nh handles made.  The first failure's status (its
 * message set); the rest is undone all the same. */
static int unmap_import(gm_pool_t *pool, uintptr_t va, size_t npages, const gm__phys_t *h,
                        size_t nmapped, size_t nh)
{
    int rc = GM_OK, r2;
    size_t page = pool->page;
    for (size_t i = 0; i < nmapped; i++) {
        GM_BK(r2, pool, unmap, (pool->bk, va + i * page, page));
        if (r2 != GM_OK && rc == GM_OK) rc = r2;
    }
    for (size_t i = 0; i < nh; i++) {
        GM_BK(r2, pool, phys_release, (pool->bk, h[i]));
        if (r2 != GM_OK && rc == GM_OK) rc = r2;
    }
    GM_BK(r2, pool, va_free, (pool->bk, va, npages * page));
    return rc != GM_OK ? rc : r2;
}

/* The import itself, client mutex held. */
static int import_locked(gm_share_client_t *cli, const char *name, const char *token,
                         imp_t **out)
{
    gm_pool_t *pool = cli->root;
    gm__share_msg_t m;
    msg_init(&m, GM__SHARE_IMPORT);
    snprintf(m.name, sizeof m.name, "%s", name);
    if (token) snprintf(m.token, sizeof m.token, "%s", token);
    GM_CHECK(roundtrip(cli, &m, NULL, 0, NULL));
    uint64_t id = m.id;
    /* The server's word is checked before it is used: a server may lie. */
    size_t page = pool->page;
    size_t most = pool->info.total_memory > ((size_t)1 << 40) ? pool->info.total_memory
                                                               : ((size_t)1 << 40);
    if (m.page_size != page || m.npages == 0 || m.npages > most / page ||
        m.offset >= page || m.size == 0 || m.size > m.npages * page - m.offset ||
        m.access > GM_SHARE_READ_ONLY) {
        send_release(cli, id);
        return gm__set_error(GM_PARSE, "gm_share_import: '%s': the server described it as %"
                             PRIu64 " pages of %" PRIu64 " bytes, offset %" PRIu64 ", size %"
                             PRIu64 " (this device's page is %zu bytes)", name, m.npages,
                             m.page_size, m.offset, m.size, page);
    }
    if (m.device != pool->cfg.device) {
        send_release(cli, id);
        return gm__set_error(GM_NOT_SUPPORTED, "gm_share_import: '%s' is memory of device %d; "
                             "this pool is on device %d", name, (int)m.device, pool->cfg.device);
    }
    size_t npages = (size_t)m.npages, bytes = npages * page, nr = m.nranges;
    if (nr == 0 || nr > GM_SHARE_RANGES_MAX) {
        send_release(cli, id);
        return gm__set_error(GM_PARSE, "gm_share_import: '%s': the server said %zu ranges", name,
                             nr);
    }
    imp_t *imp = gm__calloc(1, sizeof *imp);
    gm__phys_t *h = gm__calloc(npages, sizeof *h);
    uint64_t(*rg)[3] = gm__calloc(nr, sizeof *rg); /* page_first, offset, size */
    int rc = GM_OK;
    uintptr_t va = 0;
    size_t nh = 0, nmapped = 0;
    if (!imp || !h || !rg || !(imp->ranges = gm__calloc(nr, sizeof *imp->ranges))) {
        rc = gm__set_error(GM_NO_HOST_MEMORY, "gm_share_import: out of host memory");
        goto fail;
    }
    rg[0][0] = 0;
    rg[0][1] = m.offset;
    rg[0][2] = m.size;
    for (size_t first = 1; first < nr;) { /* the others, 16 at a time */
        size_t count = nr - first < GM__SHARE_RANGES_PER_MSG ? nr - first
                                                             : GM__SHARE_RANGES_PER_MSG;
        gm__share_msg_t q;
        msg_init(&q, GM__SHARE_RANGES);
        q.id = id;
        q.first = first;
        q.count = count;
        rc = roundtrip(cli, &q, NULL, 0, NULL);
        if (rc == GM_OK && (q.first != first || q.count != count))
            rc = gm__set_error(GM_PARSE, "gm_share_import: '%s': ranges %" PRIu64 "+%" PRIu64
                               " for %zu+%zu", name, q.first, q.count, first, count);
        if (rc != GM_OK) goto fail;
        memcpy(rg[first], q.rng, count * sizeof *rg);
        first += count;
    }
    for (size_t i = 0; i < nr; i++) /* each inside the mapping */
        if (rg[i][0] >= npages || rg[i][1] >= page || rg[i][2] == 0 ||
            rg[i][2] > (npages - rg[i][0]) * page - rg[i][1]) {
            rc = gm__set_error(GM_PARSE, "gm_share_import: '%s': range %zu (page %" PRIu64
                               ", offset %" PRIu64 ", %" PRIu64 " bytes) lies outside the %zu "
                               "pages", name, i, rg[i][0], rg[i][1], rg[i][2], npages);
            goto fail;
        }
    GM_BK(rc, pool, va_reserve, (pool->bk, bytes, page, &va));
    if (rc != GM_OK) goto fail;
    /* Two batches in flight: the server exports the next while this side
     * imports and maps the last. */
    for (size_t sent = 0, first = 0; first < npages;) {
        while (sent < npages && sent - first < 2 * GM__SHARE_FDS_MAX) {
            gm__share_msg_t q;
            msg_init(&q, GM__SHARE_PAGES);
            q.id = id;
            q.first = sent;
            q.count = npages - sent < GM__SHARE_FDS_MAX ? npages - sent : GM__SHARE_FDS_MAX;
            if ((rc = req_send(cli, &q)) != GM_OK) goto fail;
            sent += q.count;
        }
        size_t count = npages - first < GM__SHARE_FDS_MAX ? npages - first : GM__SHARE_FDS_MAX;
        gm__share_msg_t q;
        int fds[GM__SHARE_FDS_MAX];
        size_t nfds = 0;
        rc = rep_recv(cli, &q, fds, GM__SHARE_FDS_MAX, &nfds);
        if (rc == GM_OK && (nfds != count || q.nfds != count || q.first != first))
            rc = gm__set_error(GM_PARSE, "gm_share_import: '%s': %zu descriptors for pages "
                               "%zu+%zu", name, nfds, first, count);
        for (size_t i = 0; i < nfds; i++) {
            if (rc == GM_OK) {
                GM_BK(rc, pool, import_fd, (pool->bk, fds[i], page, &h[nh]));
                if (rc == GM_OK) nh++;
            }
            if (rc == GM_OK) {
                GM_BK(rc, pool, map, (pool->bk, va + (first + i) * page, page, h[nh - 1]));
                if (rc == GM_OK) nmapped++;
            }
            close(fds[i]);
        }
        if (rc != GM_OK) {
            if (sent > first + count) cli->gone = true; /* answers still on their way */
            goto fail;
        }
        first += count;
    }
    GM_BK(rc, pool, set_access, (pool->bk, va, bytes,
                                 m.access == GM_SHARE_READ_ONLY ? GM__ACCESS_READ_ONLY : 0));
    if (rc != GM_OK) goto fail;
    snprintf(imp->name, sizeof imp->name, "%s", name);
    imp->id = id;
    imp->va = va;
    imp->npages = npages;
    imp->handles = h;
    for (size_t i = 0; i < nr; i++) {
        imp->ranges[i].ptr = (void *)(va + (uintptr_t)(rg[i][0] * page + rg[i][1]));
        imp->ranges[i].size = (size_t)rg[i][2];
    }
    imp->nranges = nr;
    imp->ptr = imp->ranges[0].ptr;
    imp->access = (int)m.access;
    imp->refs = 1;
    gm__free(rg);
    *out = imp;
    return GM_OK;
fail:
    if (va) {
        char why[GM__SHARE_TEXT_MAX];
        snprintf(why, sizeof why, "%s", gm_last_error());
        unmap_import(pool, va, npages, h, nmapped, nh);
        gm__set_error(rc, "%s", why);
    }
    send_release(cli, id);
    gm__free(h);
    gm__free(rg);
    if (imp) gm__free(imp->ranges);
    gm__free(imp);
    return rc;
}

/* Import name (or take one more reference on its import); the ranges into
 * out[0..cap) or, when they do not fit, their count in *n and nothing kept. */
static int import_any(gm_share_client_t *cli, const char *fn, const char *name,
                      const char *token, gm_share_range_t *out, size_t cap, size_t *n,
                      int *access)
{
    GM_CHECK(check_name(fn, name, "name"));
    if (token && *token) GM_CHECK(check_name(fn, token, "token"));
    if (!client_known(cli))
        return gm__set_error(GM_INVALID_ARGUMENT, "%s: not a connected client", fn);
    pthread_mutex_lock(&cli->mu);
    imp_t *imp = NULL;
    int rc = GM_OK;
    bool fresh = false;
    for (imp_t *i = cli->imps; i; i = i->next)
        if (strcmp(i->name, name) == 0) { imp = i; break; }
    if (!imp) {
        rc = import_locked(cli, name, token, &imp);
        fresh = rc == GM_OK;
    }
    if (fresh) {
        imp->next = cli->imps;
        cli->imps = imp;
        pthread_mutex_lock(&g_mu);
        cli->imports++;
        cli->imported_bytes += imp->npages * cli->root->page;
        pthread_mutex_unlock(&g_mu);
    }
    if (rc == GM_OK && (!out || imp->nranges > cap)) {
        *n = imp->nranges;
        rc = gm__set_error(GM_INVALID_ARGUMENT, "%s: '%s' holds %zu ranges (room for %zu)%s", fn,
                           name, imp->nranges, out ? cap : 0,
                           cap == 1 ? ": import it with gm_share_import_ranges" : "");
        if (fresh) { /* not kept: nothing maps it yet */
            cli->imps = imp->next;
            int r2 = imp_destroy(cli, imp);
            (void)r2;
        }
    } else if (rc == GM_OK) {
        if (fresh) monitor_update(cli->root);
        else imp->refs++;
        memcpy(out, imp->ranges, imp->nranges * sizeof *out);
        *n = imp->nranges;
        if (access) *access = imp->access;
    }
    pthread_mutex_unlock(&cli->mu);
    return rc;
}

int gm_share_import(gm_share_client_t *cli, const char *name, const char *token, void **ptr,
                    size_t *size, int *access)
{
    if (!ptr) return gm__set_error(GM_INVALID_ARGUMENT, "gm_share_import: ptr is NULL");
    *ptr = NULL;
    gm_share_range_t r;
    size_t n = 0;
    GM_CHECK(import_any(cli, "gm_share_import", name, token, &r, 1, &n, access));
    *ptr = r.ptr;
    if (size) *size = r.size;
    return GM_OK;
}

int gm_share_import_ranges(gm_share_client_t *cli, const char *name, const char *token,
                           gm_share_range_t *out, size_t cap, size_t *n, int *access)
{
    if (!n) return gm__set_error(GM_INVALID_ARGUMENT, "gm_share_import_ranges: n is NULL");
    *n = 0;
    return import_any(cli, "gm_share_import_ranges", name, token, out, cap, n, access);
}

/* Unmap and let go of imp (client mutex held; no queued work may touch it
 * any more); it is out of the list. */
static int imp_destroy(gm_share_client_t *cli, imp_t *imp)
{
    gm_pool_t *pool = cli->root;
    size_t page = pool->page;
    int rc = unmap_import(pool, imp->va, imp->npages, imp->handles, imp->npages, imp->npages);
    send_release(cli, imp->id);
    pthread_mutex_lock(&g_mu);
    cli->imports--;
    cli->imported_bytes -= imp->npages * page;
    pthread_mutex_unlock(&g_mu);
    monitor_update(pool);
    gm__free(imp->handles);
    gm__free(imp->ranges);
    gm__free(imp);
    return rc;
}

int gm_share_release(gm_share_client_t *cli, void *ptr, gm_stream_t stream)
{
    if (!client_known(cli))
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_share_release: not a connected client");
    pthread_mutex_lock(&cli->mu);
    int rc = GM_OK;
    imp_t **pp = &cli->imps;
    while (*pp && (*pp)->ptr != ptr) pp = &(*pp)->next;
    imp_t *imp = *pp;
    if (!imp) {
        rc = gm__set_error(GM_INVALID_POINTER, "gm_share_release: %p is not an import of this "
                           "client (released already?)", ptr);
    } else if (imp->refs > 1) {
        imp->refs--;
    } else {
        /* Synchronize first: a failure leaves the import as it was. */
        rc = sync_stream(cli->root, stream);
        if (rc == GM_OK) {
            *pp = imp->next;
            rc = imp_destroy(cli, imp);
        }
    }
    pthread_mutex_unlock(&cli->mu);
    return rc;
}

int gm_share_disconnect(gm_share_client_t *cli)
{
    if (!cli) return GM_OK;
    pthread_mutex_lock(&g_mu);
    bool known = false;
    for (gm_share_client_t **pp = &g_clients; *pp; pp = &(*pp)->next)
        if (*pp == cli && cli->pid == getpid()) { *pp = cli->next; known = true; break; }
    pthread_mutex_unlock(&g_mu);
    if (!known)
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_share_disconnect: not a connected client");
    pthread_mutex_lock(&cli->mu);
    int rc = GM_OK;
    while (cli->imps) {
        imp_t *imp = cli->imps;
        cli->imps = imp->next;
        int r2 = imp_destroy(cli, imp);
        if (r2 != GM_OK && rc == GM_OK) rc = r2;
    }
    pthread_mutex_unlock(&cli->mu);
    close(cli->fd);
    pthread_mutex_destroy(&cli->mu);
    gm__free(cli);
    return rc;
}

/* ---- stats and teardown ----------------------------------------------------- */

static void stats_locked(gm_pool_t *pool, gm_share_stats_t *s)
{
    for (gm_share_server_t *v = g_servers; v; v = v->next) {
        if (v->root != pool) continue;
        s->servers++;
        s->published += v->published;
        s->published_bytes += v->published_bytes;
        s->exported_bytes += v->exported_bytes;
        s->peers += v->n_peers;
        s->peers_refused += v->refused;
        s->peers_dropped += v->dropped;
    }
    for (hold_t *h = g_holds; h; h = h->next)
        if (h->root == pool && h->owner_freed) s->held_for_peers_bytes += h->bytes;
    for (gm_share_client_t *c = g_clients; c; c = c->next) {
        if (c->root != pool) continue;
        s->imports += c->imports;
        s->imported_bytes += c->imported_bytes;
    }
}

/* The figures `gpumem top` shows, after they changed (no lock held). */
static void monitor_update(gm_pool_t *pool)
{
    gm_share_stats_t s = GM_SHARE_STATS_INIT;
    pthread_mutex_lock(&g_mu);
    stats_locked(pool, &s);
    pthread_mutex_unlock(&g_mu);
    gm__monitor_share(pool, s.exported_bytes, s.imported_bytes, s.held_for_peers_bytes);
}

int gm_share_stats(gm_pool_t *pool, gm_share_stats_t *st)
{
    if (!st) return gm__set_error(GM_INVALID_ARGUMENT, "gm_share_stats: stats is NULL");
    if (st->size < sizeof *st || st->version != GM_SHARE_STATS_VERSION)
        return gm__set_error(GM_INVALID_ARGUMENT, "gm_share_stats: stats of size %zu version %u "
                             "(initialize it with GM_SHARE_STATS_INIT)", st->size, st->version);
    GM_CHECK(gm__pool_resolve(&pool, __func__));
    gm_share_stats_t s = GM_SHARE_STATS_INIT;
    pthread_mutex_lock(&g_mu);
    stats_locked(pool, &s);
    pthread_mutex_unlock(&g_mu);
    *st = s;
    return GM_OK;
}

int gm__share_check(gm_pool_t *root)
{
    int rc = GM_OK;
    pthread_mutex_lock(&g_mu);
    gm_pool_t *h;
    for (unsigned i = 0; rc == GM_OK && (h = gm__heap_next(root, &i));) {
        size_t holds = 0, marked = 0;
        gm__lock(&h->lock);
        for (hold_t *x = g_holds; x && rc == GM_OK; x = x->next) {
            if (x->root != root || x->heap != h) continue;
            holds++;
            gm__block_t *b = gm__hash_get(&h->live, x->base);
            if (!b || !b->shared || x->refs == 0 || b->size != x->bytes)
                rc = gm__set_error(GM_INTERNAL, "share: the hold on %p (%u references) names %s",
                                   (void *)x->base, x->refs,
                                   !b ? "no live block" : !b->shared ? "an unmarked block"
                                   : x->refs == 0 ? "a block nobody holds" : "a block of another size");
            /* What is published is on the device: never offloaded, every
             * page under it mapped (an importer maps those pages). */
            else if (b->offloaded || !gm__pages_ready_locked(b->arena, b->addr, b->size,
                                                             h->page_shift))
                rc = gm__set_error(GM_INTERNAL, "share: the published block %p (%u references) "
                                   "%s", (void *)x->base, x->refs,
                                   b->offloaded ? "is offloaded: its pages went back under its "
                                                  "importers"
                                                : "has pages that are not mapped");
        }
        for (int c = 0; c < GM_CLASS_COUNT; c++)
            for (gm__block_t *b = h->arena[c].first; b; b = b->next)
                marked += !b->free && !b->pending && b->shared;
        gm__unlock(&h->lock);
        if (rc == GM_OK && holds != marked)
            rc = gm__set_error(GM_INTERNAL, "share: heap %u has %zu blocks marked shared and %zu "
                               "holds", i - 1, marked, holds);
    }
    for (gm_share_server_t *v = g_servers; v && rc == GM_OK; v = v->next) {
        if (v->root != root) continue;
        uint64_t n = 0, bytes = 0, exported = 0;
        for (pub_t *p = v->pubs; p; p = p->next) n++, bytes += p->shape->bytes;
        for (size_t k = 0; k < v->n_peers; k++) {
            size_t recs = 0;
            for (rec_t *r = v->peers[k].recs; r; r = r->next, recs++)
                exported += r->shape->npages * root->page;
            if (recs != v->peers[k].n_recs)
                rc = gm__set_error(GM_INTERNAL, "share: peer %zu of %s holds %zu mappings, counted "
                                   "%zu", k, v->path, recs, v->peers[k].n_recs);
        }
        if (rc == GM_OK && (n != v->published || bytes != v->published_bytes ||
                            exported != v->exported_bytes))
            rc = gm__set_error(GM_INTERNAL, "share: %s counts %llu names, %llu bytes, %llu "
                               "exported; its books say %llu, %llu, %llu", v->path,
                               (unsigned long long)v->published,
                               (unsigned long long)v->published_bytes,
                               (unsigned long long)v->exported_bytes, (unsigned long long)n,
                               (unsigned long long)bytes, (unsigned long long)exported);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

void gm__share_atfork_prepare(void) { pthread_mutex_lock(&g_mu); }
void gm__share_atfork_parent(void) { pthread_mutex_unlock(&g_mu); }
void gm__share_atfork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    g_mu = fresh;
    /* The records stay allocated (the parent's picture); the child's pools
     * are new, so nothing here refers to them. */
    g_servers = NULL;
    g_clients = NULL;
    g_holds = NULL;
}

void gm__share_pool_destroy(gm_pool_t *pool)
{
    for (;;) {
        pthread_mutex_lock(&g_mu);
        gm_share_server_t *srv = g_servers;
        while (srv && srv->root != pool) srv = srv->next;
        gm_share_client_t *cli = srv ? NULL : g_clients;
        while (cli && cli->root != pool) cli = cli->next;
        pthread_mutex_unlock(&g_mu);
        if (srv) gm_share_close(srv);
        else if (cli) gm_share_disconnect(cli);
        else break;
    }
    gm__clear_error();
}
