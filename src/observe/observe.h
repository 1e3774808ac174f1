/* SPDX-License-Identifier: Apache-2.0 */
/*
 * observe.h — private declarations of the observability files: the registry
 * of pools and process statistics (stats.c), the trace recorder
 * (tracelog.c), the leak tracker (leak.c), the out-of-memory report
 * (oom.c) and the shared statistics segment read by `gpumem top` and
 * `gpumem metrics` (monitor.c).
 *
 * The one idea: the allocation path pays one predictable branch per feature
 * that is off, and a few stores under the lock it already holds for one that
 * is on.  Formatting, symbolizing, writing files and walking structures
 * happen on other threads or at report time.
 */
#ifndef GM_OBSERVE_H
#define GM_OBSERVE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/pool.h"
#include "observe/trace.h"

struct gm__leak_table;
struct gm__trace_buf;
struct gm__mon_slot;

/* ---- defined in src/observe/stats.c ---------------------------------------------- */

/* Called at the end of a successful gm_pool_create (no lock held): registers
 * the pool, and at the first pool applies GPUMEM_TRACE, GPUMEM_LEAK_CHECK and
 * the monitor segment, and installs the exit handler. */
void gm__observe_pool_created(gm_pool_t *pool);
/* Called first thing in gm_pool_destroy (no lock held): leak report when leak
 * checking is on, trace flush, monitor slot release, unregistration.  A pool
 * that was never registered is fine. */
void gm__observe_pool_destroying(gm_pool_t *pool);
/* Call fn on every registered pool, holding the registry lock (not the pools'
 * locks).  Lock order: registry, then a pool's lock, then the trace lock. */
void gm__registry_foreach(void (*fn)(gm_pool_t *pool, void *arg), void *arg);
/* In a child of fork() (pool.c's handler): an empty registry with a fresh
 * lock; the parent's pools are not the child's to report. */
void gm__registry_atfork_child(void);
/* Fill *s from pool (lock held): the counters plus the derived fields. */
void gm__stats_snapshot_locked(gm_pool_t *pool, gm_stats_t *s);

/* ---- defined in src/observe/tracelog.c ------------------------------------------- */

extern atomic_int gm__trace_on;
/* Append one record (action: GM__TRACE_ALLOC / _FREE / _ALLOC_FAIL of
 * trace.h) to the pool's buffer.  Pool lock held; no syscall, no formatting
 * except when a buffer fills (then a hand-over to the writer thread). */
void gm__trace_record_slow_locked(gm_pool_t *pool, int action, uintptr_t ptr, size_t size,
                                  gm_stream_t stream);
static inline void gm__trace_record_locked(gm_pool_t *pool, int action, uintptr_t ptr,
                                           size_t size, gm_stream_t stream)
{
    if (GM_UNLIKELY(atomic_load_explicit(&gm__trace_on, memory_order_relaxed)))
        gm__trace_record_slow_locked(pool, action, ptr, size, stream);
}
/* With leak tracking on: the call stack of the allocation just recorded
 * (the pool's last record), written to the side file PATH.sites. */
void gm__trace_site_locked(gm_pool_t *pool, void *const *frames, int n);
/* Hand the pool's buffer to the writer and wait until the file has it
 * (pool lock NOT held). */
void gm__trace_pool_flush(gm_pool_t *pool);
/* Free the pool's buffer (pool being destroyed, after the flush). */
void gm__trace_pool_fini(gm_pool_t *pool);

/* ---- defined in src/observe/leak.c ----------------------------------------------- */

extern atomic_int gm__leak_on;
/* Capture the caller's stack into frames (GM_LEAK_MAX_FRAMES); the count. */
int gm__leak_capture(void **frames);
/* Remember / forget the stack of a live allocation.  Pool lock held.  Out of
 * host memory for the table only loses that stack. */
void gm__leak_add_locked(gm_pool_t *pool, uintptr_t ptr, void *const *frames, int n);
void gm__leak_del_locked(gm_pool_t *pool, uintptr_t ptr);
/* The recorded stack of ptr (NULL, *n = 0 when none).  Pool lock held. */
void *const *gm__leak_stack_locked(gm_pool_t *pool, uintptr_t ptr, int *n);
/* The first frame outside libgpumem, symbolized as "fn+0x12 (object)" into
 * buf; "" when unknown.  Never allocates. */
void gm__leak_site(void *const *frames, int n, char *buf, size_t cap);
/* addr as "sym (object) at function file:line" (addr2line, when installed:
 * starts a process; never on an allocation path). */
void gm__leak_describe(void *addr, char *buf, size_t cap);
/* Index of the first frame outside libgpumem (dladdr: not on a hot path). */
int gm__leak_first_user_frame(void *const *frames, int n);
void gm__leak_fini(gm_pool_t *pool);
/* Print the pool's leaks on stderr (leak checking on); count them. */
void gm__leak_report_stderr(gm_pool_t *pool, uint64_t *bytes, uint64_t *count);
/* Are leaks printed at pool destruction (GPUMEM_LEAK_CHECK, or tracking on)? */
bool gm__leak_reporting(void);
/* Read GPUMEM_LEAK_CHECK (first pool). */
void gm__leak_init_env(void);
/* At exit: report every registered pool's leaks; exit status. */
void gm__leak_at_exit(void);

/* ---- defined in src/observe/oom.c ------------------------------------------------ */

/* The final out-of-memory report: counts the OOM, records an `allocate
 * failure` trace row, and sets the last error (status GM_OUT_OF_MEMORY or
 * GM_LIMIT per rc) to the full report.  Pool lock held; never allocates. */
int gm__oom_report_locked(gm_pool_t *pool, size_t size, gm_stream_t stream, int rc,
                          const char *reason);

/* ---- defined in src/observe/monitor.c -------------------------------------------- */

/* The shared segment (/dev/shm/gpumem.<pid>, or $GPUMEM_MONITOR_DIR). */
void gm__monitor_attach(gm_pool_t *pool);   /* no lock held */
void gm__monitor_detach(gm_pool_t *pool);   /* no lock held */
void gm__monitor_unlink(void);              /* exit, last pool */
/* In a child of fork(): forget the parent's segment (its pools are dead
 * here); the child's first pool creates the child's own file. */
void gm__monitor_atfork_child(void);
/* Copy the pool's counters into its slot (a seqlock write).  Only the
 * counters allocate and free change, unless reserved or mapped moved or
 * gm__monitor_invalidate_locked asked for a full copy.  backend_ns is kept
 * odd (| 1) so that 0 can mean "copy everything next time". */
void gm__monitor_publish_slow_locked(gm_pool_t *pool);
void gm__monitor_invalidate_locked(gm_pool_t *pool);
static inline void gm__monitor_publish_locked(gm_pool_t *pool)
{
    if (GM_LIKELY(pool->mon != NULL)) gm__monitor_publish_slow_locked(pool);
}

/* The segment's layout is observe/monitor_seg.h; its reader (gpumem top,
 * gpumem metrics) is tools/lib/monitor_read.h, outside the library. */

#endif /* GM_OBSERVE_H */
