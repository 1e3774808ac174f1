/* SPDX-License-Identifier: Apache-2.0 */
/*
 * proto.h — the broker's wire format, shared by the client provider
 * (src/broker/client.c, in the library) and the daemon (tools/lib/broker.c,
 * `gpumem broker`).  docs/broker.md has the user's side.
 *
 * Every message is one gm__broker_msg_t, whole, over a SOCK_SEQPACKET Unix
 * socket (base/wire.h).  A client process opens two connections:
 *
 *   control (client asks, broker answers; the client's pool lock may be held
 *   while it waits, so the broker answers every request promptly or, for a
 *   lease it must first make room for, within reclaim_ms):
 *     HELLO  pid device page_size adopt -> REPLY client cookie generation
 *                                          tenant quota page_size adopt
 *                                          (the kept pages it booked)
 *     LEASE  min count cached           -> REPLY count=n nfds=n ids[0..n)
 *                                          (n from min to count), or a
 *                                          refusal: GM_LIMIT (quota) /
 *                                          GM_OUT_OF_MEMORY (device) + text
 *     RETURN count ids cached           (no reply) pages the client let go
 *     UNADOPT count cached              (no reply) adopted pages let go
 *     STATS  first                      -> REPLY count=tenants, first..; one
 *                                          tenant per reply (text = name)
 *                                          (min = its refusals when the
 *                                          device was full)
 *   admin (a privileged caller: root, the broker's own uid or a user of the
 *   config's `admins`, checked with SO_PEERCRED; anyone else is refused):
 *     ADMIN_CREATE tenant quota guaranteed count=uid min=gid first=job
 *                  pid=anchor            -> REPLY text=the tenant's door
 *                  (a socket in a directory of mode 0700 owned by uid; a
 *                  process connecting there is the tenant's when its uid is
 *                  uid and its ancestry reaches an anchor process, e.g. the
 *                  job step's slurmstepd).  Again for the same tenant and
 *                  job: adds the anchor, sets the quota (less what its
 *                  steps' tenants hold of it).
 *                  flags=CARVE text=the job's tenant: a job step's tenant
 *                  whose quota (and guarantee, as far as the job's has
 *                  one) is taken from the job's tenant, refused (GM_LIMIT)
 *                  past what the job's processes do not hold, and given
 *                  back when it is removed (the job's removal removes its
 *                  steps' first); the REPLY has flags=CARVE (a broker that
 *                  does not carve answers without it).
 *     ADMIN_REMOVE tenant                -> REPLY the tenant's last figures
 *                  (count = its refusals when the device was full);
 *                  its processes are dropped (every page back), its door
 *                  removed.
 *   events (the broker speaks, the client's thread listens):
 *     HELLO flags=EVENTS client cookie  -> REPLY
 *     RECLAIM count                     the broker wants count pages back
 *                                       if they are cached (unused)
 *
 * Descriptors travel only broker -> client, attached to a LEASE reply
 * (at most GM__BROKER_IDS of them).  A page is named by the broker's id
 * (never 0).  "Adopted" pages are those a client kept across a broker
 * restart: a new broker counts them (HELLO adopt) against the tenant and
 * the device as far as its lease record proves them (the REPLY's adopt),
 * and the client tells it when it lets one of those go (UNADOPT); the
 * client releases kept pages itself, which frees them, since the broker
 * that made them is gone.
 *
 * Before its first message the client checks that the server runs as
 * root, as its own uid or as the broker user (GPUMEM_BROKER_UID).  A
 * connection the broker turns away (max_clients, or its tenant's half of
 * them) gets a REPLY with the reason, then the end.
 *
 * A message that is not exactly one well-formed message (size, magic,
 * version, type, terminated text, no descriptor attached towards the
 * broker, ids the client holds) ends the connection, and the broker takes
 * back every page leased on it.
 */
#ifndef GM_BROKER_PROTO_H
#define GM_BROKER_PROTO_H

#include <stdint.h>

#define GM__BROKER_MAGIC 0x4b524247u /* "GBRK" */
#define GM__BROKER_VERSION 1
#define GM__BROKER_IDS 64   /* page ids (and descriptors) per message */
#define GM__BROKER_NAME_MAX 64
#define GM__BROKER_TEXT_MAX 256

enum {
    GM__BROKER_HELLO = 1,
    GM__BROKER_LEASE = 2,
    GM__BROKER_RETURN = 3,
    GM__BROKER_UNADOPT = 4,
    GM__BROKER_STATS = 5,
    GM__BROKER_RECLAIM = 6,
    GM__BROKER_REPLY = 7,
    GM__BROKER_ADMIN_CREATE = 8, /* version 1 brokers drop a connection that sends these */
    GM__BROKER_ADMIN_REMOVE = 9,
};

#define GM__BROKER_FLAG_EVENTS 0x1u /* HELLO: this is the events connection */
#define GM__BROKER_FLAG_CARVE 0x2u  /* ADMIN_CREATE: a step's tenant out of text's */

typedef struct gm__broker_msg {
    uint32_t magic;       /* GM__BROKER_MAGIC */
    uint16_t version;     /* GM__BROKER_VERSION */
    uint16_t type;        /* GM__BROKER_* */
    int32_t status;       /* REPLY: a gm status */
    uint32_t nfds;        /* descriptors attached (LEASE reply only) */
    uint32_t flags;       /* HELLO: GM__BROKER_FLAG_* */
    int32_t device;       /* HELLO: the client's device; REPLY: the broker's */
    int64_t pid;          /* HELLO: the client's pid; REPLY: the broker's */
    uint64_t client;      /* HELLO reply / events HELLO: the client's number */
    uint64_t cookie;      /* HELLO reply / events HELLO: proves the events
                             connection belongs to that client */
    uint64_t generation;  /* HELLO reply: this broker run (random) */
    uint64_t page_size;   /* HELLO: the pool's page; REPLY: the broker's */
    uint64_t min;         /* LEASE: fewest pages that will do */
    uint64_t count;       /* LEASE: most pages wanted; RETURN/UNADOPT: ids or
                             pages; RECLAIM: pages wanted; REPLY: pages sent
                             or tenants */
    uint64_t adopt;       /* HELLO: pages kept from an earlier broker run */
    uint64_t cached;      /* client -> broker: pages it holds unused */
    uint64_t first;       /* STATS: the first tenant wanted */
    /* REPLY (HELLO, refusals, STATS): a tenant's figures, in bytes */
    uint64_t quota, guaranteed, used, peak, cached_bytes, refusals, clients, reclaims;
    uint64_t capacity, device_used; /* STATS reply: the broker's device */
    uint64_t ids[GM__BROKER_IDS];
    char tenant[GM__BROKER_NAME_MAX];
    char text[GM__BROKER_TEXT_MAX]; /* REPLY: the reason of a refusal */
} gm__broker_msg_t;

#endif /* GM_BROKER_PROTO_H */
