/* SPDX-License-Identifier: Apache-2.0 */
/*
 * observe.h — private declarations of the observability files: pool and
 * process statistics (stats.c; the registry of pools they walk is
 * src/core/registry.c), the trace recorder
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
/* The sharing figures of pool (the root) into its slot: gm_share_stats's
 * exported_bytes, imported_bytes, held_for_peers_bytes.  Takes the lock. */
void gm__monitor_share(gm_pool_t *pool, uint64_t exported, uint64_t imported, uint64_t held);
static inline void gm__monitor_publish_locked(gm_pool_t *pool)
{
    if (GM_LIKELY(pool->mon != NULL)) gm__monitor_publish_slow_locked(pool);
}
/* After an allocate or a free that succeeded: the slot is written when pages
 * moved (reserved or mapped changed), when allocated moved by 64 KiB or
 * 1/1024 of itself since the last write, and at least every
 * GM_MON_EVERY operations; else not (a seqlock write per operation was a
 * fifth of an alloc+free pair).  So `gpumem top` and `gpumem metrics` lag a
 * pool by at most that much. */
#define GM_MON_EVERY 32
static inline void gm__monitor_note_op_locked(gm_pool_t *pool)
{
    if (GM_UNLIKELY(pool->mon == NULL)) return;
    uint64_t a = pool->st.allocated, p = pool->mon_allocated;
    uint64_t moved = a > p ? a - p : p - a;
    uint64_t near = p >> 10 > 65536 ? p >> 10 : 65536;
    if (pool->mon_countdown <= 1 || moved >= near || pool->st.reserved != pool->mon_reserved ||
        pool->st.mapped != pool->mon_mapped)
        gm__monitor_publish_slow_locked(pool); /* resets the countdown */
    else
        pool->mon_countdown--;
}

/* The segment's layout is observe/monitor_seg.h; its reader (gpumem top,
 * gpumem metrics) is tools/lib/monitor_read.h, outside the library. */

/* ---- one call per event ----------------------------------------------------------- */

/* What pool.c calls, one inline per event, so that gm_alloc and gm_free read
 * "lock, allocate, observe, unlock" and a new observer edits this section
 * and its own file, never pool.c.  Each costs what the calls it replaces
 * cost: a predictable branch per feature that is off (a relaxed load of
 * gm__trace_on, a NULL test of pool->leaks or pool->mon). */

/* Before the pool lock is taken for an allocation: the caller's stack when
 * leak tracking is on (unwinding is slow), else 0 frames. */
static inline int gm__observe_alloc_begin(void **frames)
{
    if (GM_UNLIKELY(atomic_load_explicit(&gm__leak_on, memory_order_relaxed)))
        return gm__leak_capture(frames);
    return 0;
}

/* gm_alloc's outcome rc (ptr: the block when rc == GM_OK), pool lock held:
 * the counter, the trace row, the leak stack (and its trace site), the
 * monitor slot (after a failure too). */
static inline void gm__observe_alloc_locked(gm_pool_t *pool, int rc, void *ptr, size_t size,
                                            gm_stream_t stream, void *const *frames, int n_frames)
{
    if (GM_LIKELY(rc == GM_OK)) {
        pool->st.allocated_total += size;
        gm__trace_record_locked(pool, GM__TRACE_ALLOC, (uintptr_t)ptr, size, stream);
        if (GM_UNLIKELY(n_frames)) {
            gm__leak_add_locked(pool, (uintptr_t)ptr, frames, n_frames);
            if (atomic_load_explicit(&gm__trace_on, memory_order_relaxed))
                gm__trace_site_locked(pool, frames, n_frames);
        }
        gm__monitor_note_op_locked(pool);
    } else {
        gm__monitor_publish_locked(pool); /* an OOM counts */
    }
}

/* A first allocation attempt failed and the slow path starts (pool lock
 * held): counted, and the monitor slot will be copied whole. */
static inline void gm__observe_alloc_retry_locked(gm_pool_t *pool)
{
    pool->st.alloc_failures++;
    gm__monitor_invalidate_locked(pool);
}

/* The allocation failed for good: the out-of-memory report (oom.c), whose
 * status is returned.  Pool lock held. */
static inline int gm__observe_alloc_failure_locked(gm_pool_t *pool, size_t size,
                                                   gm_stream_t stream, int rc, const char *reason)
{
    return gm__oom_report_locked(pool, size, stream, rc, reason);
}

/* gm_free's outcome rc (size: the caller's size of the freed block), pool
 * lock held: the counter, the trace row, the leak stack, the monitor slot. */
static inline void gm__observe_free_locked(gm_pool_t *pool, int rc, void *ptr, size_t size,
                                           gm_stream_t stream)
{
    if (GM_LIKELY(rc == GM_OK)) {
        pool->st.freed_total += size;
        gm__trace_record_locked(pool, GM__TRACE_FREE, (uintptr_t)ptr, size, stream);
        if (GM_UNLIKELY(pool->leaks != NULL)) gm__leak_del_locked(pool, (uintptr_t)ptr);
        gm__monitor_note_op_locked(pool);
    }
}

/* Pages went back to the device (a trim), pool lock held: the monitor slot
 * is copied whole. */
static inline void gm__observe_trimmed_locked(gm_pool_t *pool)
{
    gm__monitor_invalidate_locked(pool);
    gm__monitor_publish_locked(pool);
}

/* The pool is being torn down, pool lock held, after the process layer's
 * flush (gm__process_pool_destroying): the per-pool state of the observers. */
static inline void gm__observe_pool_fini_locked(gm_pool_t *pool)
{
    gm__leak_fini(pool);
    gm__trace_pool_fini(pool);
}

#endif /* GM_OBSERVE_H */
