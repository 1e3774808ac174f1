/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench/internal.h — the one door from a benchmark into the library's
 * internals.  Benches use the public header (gpumem.h); a study that must
 * read what the API does not show includes this file instead of src/
 * headers, so that when the library's private layout moves only this file
 * follows it.
 *
 * Today one study needs it: broker_bench reads the pool's backend-call
 * counters (the counts gm_pool_stats reports as backend_calls) without
 * taking the pool's lock, because a client that waits for a lease holds
 * that lock for up to the broker's reclaim_ms and the reading must not wait
 * with it.
 */
#ifndef GM_BENCH_INTERNAL_H
#define GM_BENCH_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>

#include "gpumem.h"
#include "core/pool.h"

/* The pool's count of page imports (import_fd) and page releases
 * (phys_release) so far, read without its lock (atomics). */
static inline void bench_pool_page_calls(gm_pool_t *pool, uint64_t *imports, uint64_t *releases)
{
    gm__bk_calls_t *c = &pool->bk_calls;
    *imports = atomic_load(&c->count[GM_CALL_import_fd]);
    *releases = atomic_load(&c->count[GM_CALL_phys_release]);
}

#endif /* GM_BENCH_INTERNAL_H */
