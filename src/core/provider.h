/* SPDX-License-Identifier: Apache-2.0 */
/*
 * provider.h — the page-provider seam: where a pool's physical pages come
 * from and where they go back.
 *
 * The one idea: the page layer (pages.c) decides *when* it needs a physical
 * page and what to do with it (map, own, alias, thin, trim); a provider only
 * decides *whether* it can have one and hands over a handle.  pages.c calls
 * nothing else to get or return pages, so a different source of pages is a
 * different provider, chosen once at pool creation, and nothing above it
 * changes.  The whole contract is in docs/pages.md; in short:
 *
 *   - pages.c keeps the books: it counts reserved memory (one page per handle
 *     obtained, minus one per handle given back) and enforces the pool limit
 *     before asking (gm__pages_limit_allows); a provider enforces only what
 *     it alone knows (a tenant's quota, a device's capacity);
 *   - a refusal is a status (GM_LIMIT for a quota, GM_OUT_OF_MEMORY for a
 *     full device, anything else for a failure) with a message set; pages.c
 *     turns a refusal into the allocation's OOM message, adding what
 *     `describe` says (e.g. "tenant 'ci' over quota: 40 GiB of 40 GiB");
 *   - every member is called with the pool lock held and must not call back
 *     into the pool; a provider keeps its own state thread-safe.
 *
 * Providers:
 *   - local (provider.c): the pool's own backend, one phys_create /
 *     phys_release per handle (a page, or a restore's extent of several)
 *     through GM_BK, so the backend call counts and the fault injection
 *     (fail_nth on phys_create/phys_release) are exactly those of the page
 *     layer before the seam existed.  The only provider with extents.
 *   - broker (src/broker/client.c): ctx holds the Unix sockets to the
 *     machine's broker and a local stock of leased handles; obtain serves
 *     from the stock and leases many pages per round trip when it runs dry
 *     (import_fd of each descriptor received), give_back returns handles to
 *     the stock and gives the oldest back past two leases; a quota refusal
 *     is GM_LIMIT and describe names the tenant.  The broker's requests to
 *     give cached pages back arrive on the provider's own thread, which
 *     takes each heap's lock and trims (gm__pages_trim_locked).  All heaps
 *     of a pool share the root's broker provider.
 *   - sharing (src/share/) needs no provider: pages imported from another
 *     process are made with import_fd into an address range of the importer's
 *     own, outside the arenas; exported pages stay under live (held) blocks,
 *     which trim, thinning and page moves never touch.
 * gm_pool_create installs the broker provider when the config names a
 * broker socket (cfg.broker, GPUMEM_BROKER), the local one otherwise.
 */
#ifndef GM_PROVIDER_H
#define GM_PROVIDER_H

#include <stddef.h>

#include "backend/backend.h"

/* What a provider's pages are (gm__page_provider_ops_t.flags). */
#define GM__PROVIDER_SHARED 0x1u   /* one ctx serves every heap of a pool (thread-safe);
                                      else each heap gets its own */
#define GM__PROVIDER_LEASED 0x2u   /* pages go to others after this process: never
                                      published by sharing */
#define GM__PROVIDER_QUOTA 0x4u    /* a GM_LIMIT refusal is a limit someone set (a
                                      tenant's quota), reported as GM_LIMIT */
#define GM__PROVIDER_EXTENTS 0x8u  /* obtain also takes page_size = k pages, n = 1:
                                      one handle of k pages (pages.c's extents) */

typedef struct gm__page_provider_ops {
    const char *name; /* "local"; for messages */
    unsigned flags;   /* GM__PROVIDER_* */

    /* Obtain n pages of page_size bytes each (page_size: the pool's
     * granularity, or with GM__PROVIDER_EXTENTS a multiple of it and n = 1):
     * handles[0..n).  GM_OK with *got == n; on failure a status
     * with its message set, and *got < n pages that were obtained all the
     * same (the caller owns them).  The pool limit was checked by the caller
     * for all n; a provider refuses only for its own reasons.  Each handle is
     * mapped nowhere, and the caller maps and releases it through the pool's
     * backend (map/unmap/set_access as usual). */
    int (*obtain)(void *ctx, size_t page_size, size_t n, gm__phys_t *handles, size_t *got);
    /* Give back n handles (each as obtained: a page, or an extent's one
     * handle).  Precondition: each is mapped nowhere and holds no
     * data anyone needs.  GM_OK with *done == n; on failure the status with
     * its message set, handles[0..*done) were given back and the others are
     * still the caller's. */
    int (*give_back)(void *ctx, const gm__phys_t *handles, size_t n, size_t *done);
    /* Optional (NULL: nothing to add): one line on why the last refusal
     * happened, for the OOM message ("tenant 'ci' over quota ..."), into
     * buf[cap]; "" when there is nothing to say. */
    void (*describe)(void *ctx, char *buf, size_t cap);
    /* Optional: give back whatever the provider keeps aside (the broker's
     * stock of leased pages), at gm_trim.  Called without any pool lock. */
    void (*flush)(void *ctx);
    /* Optional: at pool destroy, after every page was given back and before
     * the backend closes.  No pool lock held. */
    void (*destroy)(void *ctx);
} gm__page_provider_ops_t;

/* A provider and its context, held by value in the pool. */
typedef struct gm__page_provider {
    const gm__page_provider_ops_t *ops;
    void *ctx;
} gm__page_provider_t;

/* ---- defined in src/core/provider.c ---- */
/* The local provider: the pool's own backend, one call per page; ctx is the
 * pool (its ops, bk and bk_calls), which must outlive the provider. */
void gm__provider_local_init(gm__page_provider_t *p, gm_pool_t *pool);

#endif /* GM_PROVIDER_H */
