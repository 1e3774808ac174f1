/* SPDX-License-Identifier: Apache-2.0 */
/*
 * backend.h — the backend contract: the only place a device is touched.
 *
 * It mirrors the CUDA virtual memory management API: reserve virtual address
 * ranges, create physical handles of N x granularity, map a whole handle at an
 * address (offset 0, as CUDA requires), set access, unmap exactly what one map
 * call mapped, release.  Events and stream sync carry the cross-stream reuse
 * rule; memcpy/memset serve tests and staging.  Backends are chosen through
 * the table in select.c, never by #ifdef in the core.  The contract holds
 * what the library calls (plus export_fd/import_fd, kept for sharing); the
 * core reaches phys_create/phys_release only through its page provider
 * (src/core/provider.h), every other member through GM_BK below.
 *
 * Every member returns a gm status; on failure it has already set the
 * per-thread message with gm__set_error() (naming the driver's own error where
 * there is one).  Members are called with the pool lock held or not, as the
 * caller needs: a backend keeps its own state thread-safe.
 */
#ifndef GM_BACKEND_H
#define GM_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include <stdatomic.h>

#include "gpumem.h"
#include "base/internal.h"

typedef uint64_t gm__phys_t;  /* physical allocation handle */
typedef uint64_t gm__event_t; /* event handle */

/* phys_flags: how every physical page of the context is made. */
#define GM__PHYS_NCCL 0x1u         /* the handle types and flags NCCL's own allocations use:
                                      fabric handles where the device and system allow them,
                                      GPUDirect RDMA where the device allows it */
#define GM__PHYS_COMPRESSIBLE 0x2u /* the driver's generic compression; open refuses it
                                      where the device lacks it */

/* peers: every other device of the machine (open resolves it). */
#define GM__PEERS_ALL UINT64_MAX

typedef struct gm__backend_config {
    int device;
    size_t sim_capacity; /* sim: bytes of "device" memory */
    /* Devices (bit d: ordinal d, d < 64) that get the same access as the
     * device itself to every range set_access covers; the device's own bit
     * is ignored.  open fails (GM_NOT_SUPPORTED, naming the pair) when one
     * of them cannot reach the device's memory, GM_NO_DEVICE when one does
     * not exist (but with GM__PEERS_ALL, which takes the devices there are). */
    uint64_t peers;
    unsigned phys_flags; /* GM__PHYS_* */
    /* sim: devices of the machine (0: 32, the most), size of the groups of
     * consecutive devices that reach each other (0: all do), and whether
     * compression is refused (1) as on a device without it. */
    int sim_devices;
    int sim_peer_group;
    int sim_no_compression;
} gm__backend_config_t;

typedef struct gm__backend_info {
    char name[128];          /* device name */
    int driver_version;
    size_t total_memory;
    size_t free_memory;
    size_t granularity;      /* physical page size, a power of two */
    size_t granularity_recommended; /* the driver's recommended size and alignment of an
                                       allocation (a multiple of granularity) */
    int vmm_supported;
    int numa_node;           /* host NUMA node nearest the device; -1 unknown */
    int device_count;        /* devices of the machine */
    uint64_t peers;          /* devices granted access with set_access (resolved) */
    unsigned phys_flags;     /* GM__PHYS_* in force */
    unsigned handle_types;   /* GM_HANDLE_* of every physical page */
    int compression_supported;
    int rdma_capable;        /* pages made GPUDirect-RDMA capable */
} gm__backend_info_t;

/* set_access flags */
#define GM__ACCESS_READ_ONLY 0x1u

/* host_register flags */
#define GM__HOST_DEVICEMAP 0x1u /* the device may address the memory (host_device_pointer) */

typedef struct gm__backend_ops {
    const char *name; /* "sim", "cuda" */

    /* Can this backend run here?  GM_OK, or GM_NO_DEVICE with a message that
     * says why (used by AUTO and by `gpumem info`).  No state is kept. */
    int (*probe)(int device, char *why, size_t why_cap);
    /* Is this backend's runtime installed here at all (cuda: an NVIDIA
     * driver, whatever state it is in)?  GM_OK, or GM_NO_DEVICE with why
     * saying what was looked for.  Only a backend that is not installed may
     * be passed over by AUTO; one installed whose probe fails is an error.
     * NULL: always installed.  No state is kept beyond the probe's. */
    int (*installed)(char *why, size_t why_cap);

    /* Open a device context.  *ctx is the backend's own object. */
    int (*open)(const gm__backend_config_t *cfg, void **ctx);
    /* Close it.  Precondition: everything created through ctx was released. */
    void (*close)(void *ctx);
    int (*info)(void *ctx, gm__backend_info_t *out);

    /* Reserve [*va, *va+size) of address space, size and alignment multiples
     * of granularity.  No memory is committed. */
    int (*va_reserve)(void *ctx, size_t size, size_t align, uintptr_t *va);
    /* Precondition: nothing is mapped in the range. */
    int (*va_free)(void *ctx, uintptr_t va, size_t size);

    /* Create a physical allocation of size bytes (multiple of granularity),
     * exportable as a POSIX file descriptor where the device allows. */
    int (*phys_create)(void *ctx, size_t size, gm__phys_t *h);
    /* Precondition: h is not mapped anywhere. */
    int (*phys_release)(void *ctx, gm__phys_t h);

    /* Map all of h (size bytes, from offset 0) at va, inside a reservation.
     * The mapping is not accessible until set_access. */
    int (*map)(void *ctx, uintptr_t va, size_t size, gm__phys_t h);
    /* Unmap exactly one earlier map call's range.  Precondition: no queued
     * device work may still touch it. */
    int (*unmap)(void *ctx, uintptr_t va, size_t size);
    /* Grant the device of ctx, and the peers of its config, access over
     * mapped [va, va+size), which may span several handles: read/write, or
     * read-only with GM__ACCESS_READ_ONLY (a write through it faults or is
     * refused).  A device not granted access faults on the range. */
    int (*set_access)(void *ctx, uintptr_t va, size_t size, unsigned flags);

    /* Share a handle with another process as a file descriptor, passed over
     * a Unix socket by sharing (src/share/) and, later, the broker.
     * export_fd: precondition h is live (from phys_create or import_fd); it
     * returns a new descriptor the caller owns (and closes).  import_fd:
     * precondition fd came from export_fd (here or in another process) and
     * size equals the exporter's handle size; it does not take ownership of
     * fd, and the handle it makes is released with phys_release. */
    int (*export_fd)(void *ctx, gm__phys_t h, int *fd);
    int (*import_fd)(void *ctx, int fd, size_t size, gm__phys_t *h);

    int (*event_create)(void *ctx, gm__event_t *ev);
    int (*event_destroy)(void *ctx, gm__event_t ev);
    /* Record ev at the current end of stream's queue. */
    int (*event_record)(void *ctx, gm__event_t ev, gm_stream_t stream);
    /* GM_OK when the recorded work is complete, GM_NOT_READY when not. */
    int (*event_query)(void *ctx, gm__event_t ev);
    /* Wait for it.  The sim returns GM_NOT_READY for a held stream. */
    int (*event_sync)(void *ctx, gm__event_t ev);
    int (*stream_sync)(void *ctx, gm_stream_t stream);
    /* A new stream of the device; destroy: pending work still completes. */
    int (*stream_create)(void *ctx, gm_stream_t *stream);
    int (*stream_destroy)(void *ctx, gm_stream_t stream);

    /* Device-visible copies and fills (addresses of either side, unified). */
    int (*memcpy)(void *ctx, uintptr_t dst, uintptr_t src, size_t n, gm_stream_t stream);
    int (*memset)(void *ctx, uintptr_t dst, int value, size_t n, gm_stream_t stream);

    /* Page-lock host memory [p, p+size) (p and size multiples of the host
     * page, already mapped, not registered yet) so copies from and to it run
     * at DMA speed; GM__HOST_DEVICEMAP also maps it for the device.  The
     * range stays the caller's to unmap after host_unregister. */
    int (*host_register)(void *ctx, void *p, size_t size, unsigned flags);
    /* Precondition: p is the start of a registered range; no queued device
     * work may still touch it. */
    int (*host_unregister)(void *ctx, void *p);
    /* The device address of registered, device-mapped host address p. */
    int (*host_device_pointer)(void *ctx, void *p, uintptr_t *dptr);
    /* Work queued on `stream` after this call waits for ev's recorded work
     * (ev recorded already; on any stream of the device). */
    int (*stream_wait_event)(void *ctx, gm_stream_t stream, gm__event_t ev);

    /* Managed (unified) memory the driver migrates on demand: made and freed
     * (call kinds mem_alloc, mem_free); its pages moved to the device
     * (to_host 0) or to the host, queued on `stream` (prefetch); advice 1:
     * prefer the device as the pages' home, 2: the device accesses them
     * (mapped for it wherever they are) (advise).  Preconditions: [ptr,
     * ptr+size) inside one managed allocation. */
    int (*mem_alloc)(void *ctx, size_t size, uintptr_t *ptr);
    int (*mem_free)(void *ctx, uintptr_t ptr);
    int (*prefetch)(void *ctx, uintptr_t ptr, size_t size, int to_host, gm_stream_t stream);
    int (*advise)(void *ctx, uintptr_t ptr, size_t size, int advice);

    /* Optional (NULL when absent). */
    /* Sim: modeled device time of all calls so far, in ns. */
    uint64_t (*modeled_ns)(void *ctx);
    /* Fault injection: the n-th next call of `kind` on ctx (1 = the very
     * next) fails with GM_BACKEND, changing nothing, and is counted by
     * gm__backend_note_injected(); n = 0 disarms; kinds are independent.  A
     * backend that has it also applies, at open, the countdowns armed with
     * gm__backend_fail_at_open (gm__backend_take_open_faults).  The sim has
     * it; the cuda backend wraps its driver table with it. */
    int (*fail_nth)(void *ctx, int kind, unsigned long n);
    /* Sim: hold a stream in flight. */
    int (*hold_stream)(void *ctx, gm_stream_t stream, int hold);
    /* Make the device current on the calling thread when nothing is, as a
     * runtime allocation would (cuda: the primary context; a thread left
     * without one makes every later runtime call of the host program take
     * a slow path).  Not a counted call. */
    int (*adopt_thread)(void *ctx);
} gm__backend_ops_t;

/* Every call the library makes into a backend goes through GM_BK: counted
 * per kind and timed, in relaxed atomics, so it is accounted the same
 * whether the caller holds the pool lock, the host lock or none.  `owner` is
 * anything with `ops`, `bk` and `bk_calls` members (the pool).  The counts
 * are the backend_calls and backend_ns of gm_pool_stats. */
typedef struct gm__bk_calls {
    _Atomic uint64_t count[GM_CALL_COUNT];
    _Atomic uint64_t ticks;      /* time inside backend calls, gm__ticks() units */
} gm__bk_calls_t;

static inline void gm__bk_account(gm__bk_calls_t *c, int kind, uint64_t t0)
{
    atomic_fetch_add_explicit(&c->count[kind], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->ticks, gm__ticks() - t0, memory_order_relaxed);
}

#define GM_BK(rc, owner, kind, args)                                           \
    do {                                                                       \
        uint64_t gm__t0_ = gm__ticks();                                        \
        (rc) = (owner)->ops->kind args;                                        \
        gm__bk_account(&(owner)->bk_calls, GM_CALL_##kind, gm__t0_);           \
    } while (0)

/* ---- defined in src/backend/sim.c ---- */
extern const gm__backend_ops_t gm__backend_sim;
/* ---- defined in src/backend/cuda.c ---- */
extern const gm__backend_ops_t gm__backend_cuda;

/* ---- defined in src/backend/select.c ---- */
/* The peers a backend is opened with, for every backend: `want` (bits, or
 * GM__PEERS_ALL) without `self`; each must be below `ndevices`
 * (GM_NO_DEVICE naming it; GM__PEERS_ALL takes the devices there are) and
 * reach self's memory: reach(arg, d, &ok) answers (or fails, its message
 * set); a device that cannot is GM_NOT_SUPPORTED, naming both and `why`.
 * `name`: the backend's, for the messages.  *out: the resolved bits. */
int gm__backend_resolve_peers(const char *name, int self, int ndevices, uint64_t want,
                              int (*reach)(void *arg, int d, int *ok), void *arg,
                              const char *why, uint64_t *out);
/* Fault injection that reaches the backend calls made while a pool is
 * created: the next context opened by a backend with fail_nth starts with
 * countdown n for `kind` (as if fail_nth(ctx, kind, n) were its first call);
 * n = 0 disarms.  One-shot: the open takes all armed countdowns.  For tests. */
void gm__backend_fail_at_open(int kind, unsigned long n);
/* At open: move the armed countdowns into n[GM_CALL_COUNT] (0 = none). */
void gm__backend_take_open_faults(unsigned long n[GM_CALL_COUNT]);
/* A backend injected a failure / how many were injected in this process. */
void gm__backend_note_injected(void);
unsigned long gm__backend_injected(void);

/* Resolve AUTO, probe, and return the ops for `kind`; `why` says why.  AUTO
 * takes the first backend in the table that is installed and whose probe
 * passes; a backend that is installed but fails its probe stops the choice
 * with GM_NO_DEVICE (never a quiet fallback to the sim).  When AUTO ends on
 * the sim because nothing else is installed, one line says so on stderr, once
 * per process. */
int gm__backend_select(gm_backend_kind_t kind, int device, const gm__backend_ops_t **ops,
                       gm_backend_kind_t *chosen, char *why, size_t why_cap);
/* Describe, one "name: finding" per backend separated by sep, what probing
 * each backend for `device` finds (installed or not, usable or not), into
 * out[cap].  For `gpumem info`.  May overwrite the thread's last error. */
void gm__backend_describe(int device, const char *sep, char *out, size_t cap);

#endif /* GM_BACKEND_H */
