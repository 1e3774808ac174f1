/* SPDX-License-Identifier: Apache-2.0 */
/*
 * share.h — sharing memory between processes: the wire format and the hooks
 * the pool calls.  docs/sharing.md has the user's side.
 *
 * A server (gm_share_listen) answers on a Unix-domain SOCK_SEQPACKET socket:
 * every message is one gm__share_msg_t, whole, so a message is never seen in
 * part.  Descriptors travel only from server to client, attached (SCM_RIGHTS)
 * to the reply of a PAGES request, at most GM__SHARE_FDS_MAX at a time; a
 * client asks for the next batch only after taking the last one, so no more
 * than one batch is ever in flight.  The exchange:
 *
 *   server -> client   REPLY to the connection (HELLO): status GM_OK, or
 *                      GM_DENIED with the reason, and the server closes
 *   client -> server   IMPORT name token     -> REPLY id size offset nranges
 *                                               page_size npages device access
 *   client -> server   RANGES id first count -> REPLY where ranges first..
 *                                               lie (publications of several
 *                                               ranges; up to 16 a reply)
 *   client -> server   PAGES id first count  -> REPLY nfds = count, with the
 *                                               pages' descriptors
 *   client -> server   RELEASE id            (no reply)
 *
 * A request that is not exactly one well-formed message (size, magic,
 * version, type, terminated strings, descriptors attached) ends the peer's
 * connection, and with it every import it held.
 */
#ifndef GM_SHARE_H
#define GM_SHARE_H

#include <stdbool.h>
#include <stdint.h>

#include "gpumem.h"

#define GM__SHARE_MAGIC 0x48534d47u /* "GMSH" */
#define GM__SHARE_VERSION 1
#define GM__SHARE_NAME_MAX 64       /* with the terminating NUL */
#define GM__SHARE_TEXT_MAX 256
#define GM__SHARE_FDS_MAX 64
#define GM__SHARE_RANGES_PER_MSG 16

enum {
    GM__SHARE_HELLO = 1,
    GM__SHARE_IMPORT = 2,
    GM__SHARE_PAGES = 3,
    GM__SHARE_RELEASE = 4,
    GM__SHARE_REPLY = 5,
    GM__SHARE_RANGES = 6,
};

typedef struct gm__share_msg {
    uint32_t magic;     /* GM__SHARE_MAGIC */
    uint16_t version;   /* GM__SHARE_VERSION */
    uint16_t type;      /* GM__SHARE_* */
    int32_t status;     /* REPLY: a gm status */
    uint32_t nfds;      /* REPLY to PAGES: descriptors attached */
    uint64_t id;        /* the import (the server's number) */
    uint64_t size;      /* published bytes */
    uint64_t offset;    /* published start - its first page */
    uint64_t page_size;
    uint64_t npages;
    uint64_t first;     /* PAGES: the first page wanted */
    uint64_t count;     /* PAGES: how many (1..GM__SHARE_FDS_MAX); RANGES: 1..16 */
    int32_t device;
    uint32_t access;    /* GM_SHARE_READ_WRITE / GM_SHARE_READ_ONLY */
    int64_t pid;        /* HELLO reply: the server's process */
    uint32_t nranges;   /* IMPORT reply: ranges of the publication (size and
                           offset above are the first one's) */
    uint32_t reserved;
    uint64_t rng[GM__SHARE_RANGES_PER_MSG][3]; /* RANGES reply: page_first,
                           offset in its first page, size; of ranges first.. */
    char name[GM__SHARE_NAME_MAX];
    char token[GM__SHARE_NAME_MAX];
    char text[GM__SHARE_TEXT_MAX]; /* REPLY: the reason of a refusal */
} gm__share_msg_t;

/* ---- defined in src/share/share.c ---- */
/* gm_free of a block the share layer holds (b->shared) is the shared row of
 * the memory kinds, gm__kind_shared (core/kinds.h), defined in share.c.
 * ---- defined in src/api/pool.c ---- */
/* Free ptr, a block of heap's arenas, on `stream` as gm_free does; heap's
 * lock held.  *held: the block is (again) marked shared, nothing done. */
int gm__free_held_locked(gm_pool_t *heap, void *ptr, gm_stream_t stream, bool *held);
/* How sharing reaches it: the pool hands it down at creation (sharing sits
 * below the entry points, src/FLOORS). */
typedef int (*gm__share_free_fn)(gm_pool_t *heap, void *ptr, gm_stream_t stream, bool *held);
void gm__share_set_free(gm__share_free_fn fn);

/* fork(): the prepare handler holds sharing's lock so that the child gets
 * whole books; the child forgets the parent's servers, clients and holds
 * (their threads and sockets are the parent's) without closing anything. */
void gm__share_atfork_prepare(void);
void gm__share_atfork_parent(void);
void gm__share_atfork_child(void);

/* gm_pool_check's part: every hold names a live block marked shared and
 * every block so marked has a hold; each server's counters match its books.
 * GM_INTERNAL with the broken one.  No lock held. */
int gm__share_check(gm_pool_t *pool);

/* Close every server and client of pool (the root), at its destroy. */
void gm__share_pool_destroy(gm_pool_t *pool);

#endif /* GM_SHARE_H */
