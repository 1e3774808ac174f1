/* SPDX-License-Identifier: Apache-2.0 */
/*
 * broker.h — the broker page provider's hooks (client.c); the wire format
 * is proto.h, the daemon tools/lib/broker.c, the user's side docs/broker.md.
 */
#ifndef GM_BROKER_H
#define GM_BROKER_H

#include <stdbool.h>
#include <stdint.h>

#include "core/provider.h"

/* Bytes asked for per lease when the pool's config says 0. */
#define GM__BROKER_LEASE_DEFAULT ((size_t)64 << 20)

typedef struct gm__broker_client gm__broker_client_t;

typedef struct gm__broker_client_stats {
    bool connected;
    uint64_t stock_pages;    /* leased, not held by the pool */
    uint64_t held_pages;     /* held by the pool */
    uint64_t quota;          /* the tenant's, bytes (as of the last answer) */
    uint64_t tenant_used;    /* the tenant's use, bytes (idem) */
    uint64_t leases, leased_pages, returned_pages, reclaims, lease_ns;
    char tenant[64];
} gm__broker_client_stats_t;

/* How the events thread gives a heap's free pages back when the broker
 * reclaims (heap lock held): down to `keep` bytes of unused reserve, the
 * bytes given back in *released, and whoever watches the heap told.  The
 * pool passes it at init, so the client calls no engine or observer by name. */
typedef int (*gm__broker_trim_fn)(gm_pool_t *heap, size_t keep, size_t *released);

/* Install the broker provider in pool (the root; cfg.broker names the
 * socket): connects, says hello, starts the events thread.  On failure the
 * pool keeps its provider and the error says why (GM_IO: no broker there;
 * GM_DENIED: refused; GM_INVALID_STATE: another page size). */
int gm__broker_provider_init(gm__page_provider_t *p, gm_pool_t *pool,
                             gm__broker_trim_fn trim_locked);
bool gm__broker_provider_is(const gm__page_provider_t *p);
/* Stop the events thread (it walks the pool's heaps): first thing at pool
 * destroy.  Nothing for another provider. */
void gm__broker_provider_stop(const gm__page_provider_t *p);
/* In a fork child: close the parent pool's broker connections (p of a
 * pool that is dead in the child), so the broker sees the parent go when it
 * does.  Nothing for another provider. */
void gm__broker_atfork_child(const gm__page_provider_t *p);
/* The server on fd (connected to path) may be trusted as a broker: its
 * SO_PEERCRED uid is root, this process's effective uid, or the broker user
 * GPUMEM_BROKER_UID names.  GM_OK, else GM_DENIED naming path, the server's
 * uid and what was expected (GM_IO when the credentials cannot be read).
 * Every connection of the provider, and the CLI's queries, check it before
 * sending or reading a byte. */
int gm__broker_check_server(int fd, const char *path);
/* Zeroes for another provider. */
void gm__broker_provider_stats(const gm__page_provider_t *p, gm__broker_client_stats_t *s);

#endif /* GM_BROKER_H */
