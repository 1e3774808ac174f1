/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gpumem.h — the whole public API of gpumem, a caching, stream-ordered GPU
 * memory manager built on 2 MiB physical pages mapped into reserved virtual
 * address space.
 *
 * Conventions: every function that can fail returns an int status (GM_OK == 0)
 * and hands results back through trailing out-parameters, the object first.
 * On failure gm_last_error() holds a detailed, per-thread message.  Structs
 * that cross the ABI (config, stats, device info) start with `size` and
 * `version`; initialise them with the *_INIT macros.
 */
#ifndef GPUMEM_H
#define GPUMEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define GM_API __attribute__((visibility("default")))
#else
#define GM_API
#endif

/* ------------------------------------------------------------------------ */
/* Version                                                                  */
/* ------------------------------------------------------------------------ */

/* The one definition of gpumem's version: CMakeLists.txt reads these lines
 * (project version, libgpumem.so.X.Y.Z with SONAME libgpumem.so.X), the
 * Python package reads GM_VERSION_STRING, and tests/install/version_test.sh
 * checks that all of them, `gpumem --version` and CHANGELOG.md agree.  Keep
 * each on one line: GM_VERSION_STRING is "MAJOR.MINOR.PATCH".  Before 1.0 a
 * minor version may change the API and the ABI. */
#define GM_VERSION_MAJOR 0
#define GM_VERSION_MINOR 1
#define GM_VERSION_PATCH 0
#define GM_VERSION_STRING "0.1.0"

/* The version of the library loaded at run time (GM_VERSION_STRING of the
 * header it was built with), which may differ from the header compiled in. */
GM_API const char *gm_version(void);

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */
/* ------------------------------------------------------------------------ */

/* X(NAME, value, description).  0 is success; errors are positive. */
#define GM_ERRNO_MAP(X)                                                        \
    X(OK,               0,  "success")                                         \
    X(INVALID_ARGUMENT, 1,  "invalid argument")                                \
    X(OUT_OF_MEMORY,    2,  "out of device memory")                            \
    X(LIMIT,            3,  "pool limit reached")                              \
    X(INVALID_POINTER,  4,  "pointer was not allocated by this pool")          \
    X(DOUBLE_FREE,      5,  "pointer was already freed")                       \
    X(NOT_SUPPORTED,    6,  "operation not supported by this backend")         \
    X(NO_DEVICE,        7,  "no usable device")                                \
    X(BACKEND,          8,  "backend (driver) call failed")                    \
    X(NOT_READY,        9,  "work not complete yet")                           \
    X(PARSE,            10, "malformed input")                                 \
    X(IO,               11, "input/output error")                              \
    X(NO_HOST_MEMORY,   12, "out of host memory")                              \
    X(INTERNAL,         13, "internal error (a bug in gpumem)")                \
    X(INVALID_STATE,    14, "object not usable in this process or state")         \
    X(DENIED,           15, "refused by the other side's access policy")

enum {
#define GM__ERR_ENUM(name, value, desc) GM_##name = value,
    GM_ERRNO_MAP(GM__ERR_ENUM)
#undef GM__ERR_ENUM
    GM_ERRNO_COUNT
};

/* Short description of a status ("out of device memory"). Never NULL. */
GM_API const char *gm_strerror(int status);
/* The status's name ("GM_OUT_OF_MEMORY"). Never NULL. */
GM_API const char *gm_errname(int status);
/* Detailed message for the last error of this thread ("" when none). */
GM_API const char *gm_last_error(void);

/* ------------------------------------------------------------------------ */
/* Streams and backends                                                     */
/* ------------------------------------------------------------------------ */

/* A CUstream / cudaStream_t; NULL = the default stream.  On the sim backend
 * any value names a stream. */
typedef void *gm_stream_t;

typedef enum gm_backend_kind {
    GM_BACKEND_AUTO = 0, /* cuda when an NVIDIA driver is installed, sim only when
                            none is: see gm_pool_create */
    GM_BACKEND_SIM  = 1, /* host memory with the same VMM semantics */
    GM_BACKEND_CUDA = 2  /* the CUDA driver API, loaded at run time */
} gm_backend_kind_t;

/* Backend call kinds, counted in stats and targeted by fault injection.
 * X(name) */
#define GM_CALL_KINDS(X)                                                       \
    X(va_reserve) X(va_free) X(phys_create) X(phys_release) X(map) X(unmap)    \
    X(set_access) X(export_fd) X(import_fd) X(mem_alloc) X(mem_free)           \
    X(event_create) X(event_destroy) X(event_record) X(event_query)            \
    X(event_sync) X(stream_sync) X(memcpy) X(memset) X(stream_create)          \
    X(stream_destroy)                                                          \
    X(host_register) X(host_unregister) X(host_device_pointer)                 \
    X(stream_wait_event) X(prefetch) X(advise)

typedef enum gm_call {
#define GM__CALL_ENUM(name) GM_CALL_##name,
    GM_CALL_KINDS(GM__CALL_ENUM)
#undef GM__CALL_ENUM
    GM_CALL_COUNT
} gm_call_t;

/* "map", "set_access", … ; NULL for an unknown kind. */
GM_API const char *gm_call_name(int kind);
/* The kind named `name`, or -1. */
GM_API int gm_call_from_name(const char *name);

/* ------------------------------------------------------------------------ */
/* Pools                                                                    */
/* ------------------------------------------------------------------------ */

typedef struct gm_pool gm_pool_t;

#define GM_POOL_CONFIG_VERSION 6

typedef struct gm_pool_config {
    size_t size;                /* sizeof(gm_pool_config_t) */
    unsigned version;           /* GM_POOL_CONFIG_VERSION */
    gm_backend_kind_t backend;  /* GM_BACKEND_AUTO: see gm_pool_create */
    int device;                 /* device ordinal */
    size_t initial_reserve;     /* bytes mapped at creation (rounded up to pages) */
    size_t limit;               /* hard cap on reserved bytes; 0 = device memory */
    size_t release_threshold;   /* cached bytes kept mapped after a free;
                                   SIZE_MAX = keep all until gm_trim */
    size_t sim_capacity;        /* sim backend: device size; 0 = GPUMEM_SIM_CAPACITY or 80 GiB */
    unsigned flags;             /* GM_POOL_* flags (see "Host memory"); others must be 0 */
    unsigned copy_threads;      /* staged copies: worker threads; 0 = GPUMEM_COPY_THREADS or min(12, 3*cores/4) */
    size_t copy_chunk;          /* staged copies: staging buffer size; 0 = 2 MiB */
    /* Version 2: the memory/churn trade-off.  Reserved memory may exceed the
     * live peak by the reserve slack (a fraction of it, plus two pages)
     * before free pages are remapped instead of new ones made.  The pool
     * starts at reserve_slack; when a window of 32 Ki allocations makes more
     * than churn_target remapping calls (map, unmap, event, sync) per 1000
     * operations, the slack grows by steps of 0.004 up to reserve_slack_max, and
     * after 512 Ki allocations without one it shrinks back by a step.  While so
     * churning, a pool that one stream allocates from places a large block
     * where no page must be remapped, when such a free range is at hand
     * (docs/pages.md, "Placement while churning").  A KV-cache server that
     * wants no remaps sets reserve_slack_max near 0.12.  A window that
     * remapped k times the target raises the slack by k steps (at most 16),
     * so such a ceiling is reached within a few windows. */
    double reserve_slack;       /* default 1/64 (GPUMEM_RESERVE_SLACK) */
    double reserve_slack_max;   /* default 0.018 (GPUMEM_RESERVE_SLACK_MAX) */
    double churn_target;        /* calls per 1000 ops, default 1 (GPUMEM_CHURN_TARGET) */
    /* Version 3: heaps for programs that allocate from many threads at once.
     * 1 (the default): one heap, one lock, the least memory.  N > 1 (at most
     * 64): each thread allocates from one of N heaps (threads are given them
     * in turn), each with its own lock, address space and pages, so threads
     * on different heaps never wait for each other; a block may be freed by
     * any thread.  Costs memory: each heap keeps its own free pages and
     * reserve slack.  For threads that each allocate and free their own
     * memory; where one thread frees what another allocated at every step
     * (PyTorch's autograd thread), pages move between heaps all the time
     * (see docs/design.md, "Heaps").  Ignored (one heap) while
     * leak checking or tracing is on at creation, or with
     * GM_POOL_SYSMEM_FALLBACK.  0: GPUMEM_HEAPS. */
    unsigned heaps;
    /* Version 4: a machine broker (`gpumem broker`, docs/broker.md).  A
     * socket path here makes the pool lease its physical pages from the
     * broker instead of making them with the driver, so the broker's tenant
     * quota applies; "" (the default): the driver.  gm_pool_create fails
     * when the broker cannot be reached or refuses the process.  With
     * GM_POOL_CONFIG_INIT: GPUMEM_BROKER through gm_config_from_env. */
    char broker[108];
    size_t broker_lease;        /* bytes per lease request; 0: 64 MiB (GPUMEM_BROKER_LEASE) */
    /* Version 5: several GPUs (docs/multigpu.md).  The devices whose kernels
     * and copies may read and write every page of the pool besides its own:
     * bit d for device ordinal d (the pool's own bit is ignored),
     * GM_PEERS_ALL for every other device of the machine, 0 (the default)
     * for none.  Pages mapped later get the same access.  gm_pool_create
     * fails with GM_NOT_SUPPORTED, naming the pair, when a device cannot
     * reach the pool's (cuDeviceCanAccessPeer), and with GM_NO_DEVICE when a
     * named device does not exist.  With GM_POOL_CONFIG_INIT: GPUMEM_PEERS
     * (all, none, or a list of ordinals such as 0,1,3). */
    uint64_t peers;
    /* Version 6: with heaps > 1, each heap's reserve slack ceiling (the
     * larger of this and reserve_slack_max applies).  Heaps trade memory for
     * speed, so a heap starts at this ceiling, not at reserve_slack, and its
     * controller steps it down after quiet windows (of 4 Ki allocations: a
     * heap sees one thread's share of the work) and back up when pages move.
     * A random mix on 16 heaps settles near 1.13x the threads' requested
     * peaks with almost no page churn, where the one-heap ceiling keeps 1.03x
     * and remaps pages all the time; two heaps under PyTorch training hold
     * what one heap holds there (docs/pages.md).  0: heaps stay within
     * reserve_slack_max, starting at reserve_slack.  Default 0.2
     * (GPUMEM_HEAP_SLACK_MAX). */
    double heap_slack_max;
} gm_pool_config_t;

/* gm_pool_config_t.peers: every other device of the machine. */
#define GM_PEERS_ALL UINT64_MAX

#define GM_POOL_CONFIG_INIT                                                    \
    { sizeof(gm_pool_config_t), GM_POOL_CONFIG_VERSION, GM_BACKEND_AUTO, 0,    \
      0, 0, SIZE_MAX, 0, 0u, 0u, 0, 0.015625, 0.018, 1.0, 1u, "", 0, 0, 0.2 }

/* Fill *cfg with the defaults, overridden by the environment (GPUMEM_BACKEND,
 * GPUMEM_LIMIT, GPUMEM_SIM_CAPACITY, GPUMEM_RELEASE_THRESHOLD, GPUMEM_DEVICE,
 * GPUMEM_RESERVE_SLACK, GPUMEM_RESERVE_SLACK_MAX, GPUMEM_CHURN_TARGET,
 * GPUMEM_HEAPS, GPUMEM_HEAP_SLACK_MAX, GPUMEM_BROKER, GPUMEM_BROKER_LEASE, GPUMEM_PEERS, GPUMEM_NCCL,
 * GPUMEM_COMPRESSIBLE; the
 * whole table: gpumem info --options). */
GM_API int gm_config_from_env(gm_pool_config_t *cfg);

/* Create a pool.  cfg NULL: gm_config_from_env().
 * Backend AUTO takes the sim only when no NVIDIA driver is installed
 * (dlopen("libcuda.so.1") fails, or it is the CUDA toolkit's stub library),
 * and then writes one line saying so on stderr, once per process (ask for
 * GM_BACKEND_SIM, e.g. GPUMEM_BACKEND=sim, to use the sim without it).  When
 * a driver is installed, AUTO means cuda: a device it cannot use (an ordinal
 * that does not exist, no device visible, cuInit failing, an old driver)
 * fails with GM_NO_DEVICE and a message naming the device and the reason, a
 * device without virtual memory management with GM_NOT_SUPPORTED; host
 * memory is never handed out in a GPU's place.  `gpumem info` shows what
 * each backend's probe found.
 *
 * Handles are checked: every function taking a pool answers
 * GM_INVALID_ARGUMENT for a destroyed pool or a pointer that is not a pool,
 * readable or not (pools live in address ranges the library reserves, so a
 * handle is checked by its address before a byte of it is read), never
 * touching freed memory.  A pool's handle is never reused by a later pool (a
 * destroyed pool keeps its struct's few pages of address space, not memory).
 *
 * fork(): the pools of the parent are unusable in the child.  Every call on
 * one there returns GM_INVALID_STATE at once (never waits on a lock another
 * parent thread held at the fork, never hands out memory the parent maps);
 * gm_pool_destroy of one is a no-op.  The child may create new pools, which
 * get pages of their own; gm_default_pool and gm_device_pool create the
 * child's own pools on first use.  The child's pools are not counted in the
 * parent's `gpumem top` row (the child gets a monitor file of its own). */
GM_API int gm_pool_create(const gm_pool_config_t *cfg, gm_pool_t **pool);
/* Destroy a pool and give all of its memory back.  Live allocations
 * (device blocks and sysmem-fallback blocks) are released with it, and
 * gm_last_error() then reads "gm_pool_destroy: N live allocations (B bytes)
 * released with the pool"; with none it is left alone.  NULL, a destroyed
 * pool or a parent's pool in a child of fork() is a no-op. */
GM_API void gm_pool_destroy(gm_pool_t *pool);
/* The process-default pool, created on first use from the environment. */
GM_API int gm_default_pool(gm_pool_t **pool);
/* The pool of device ordinal `device` (0..63), created on first use from the
 * environment (gm_config_from_env) with `device` set; thread-safe.  The
 * default pool is the pool of its device.  Pools from gm_default_pool and
 * gm_device_pool belong to the library: never pass them to gm_pool_destroy. */
GM_API int gm_device_pool(int device, gm_pool_t **pool);

/* Change the hard limit (0 = device memory).  Does not release memory. */
GM_API int gm_pool_set_limit(gm_pool_t *pool, size_t limit);

/* Give cached memory back to the device until at most `keep` bytes of cached
 * (mapped but unused) memory remain.  Waits for pending stream work on the
 * pages it releases.  *released (optional) receives the bytes given back. */
GM_API int gm_trim(gm_pool_t *pool, size_t keep, size_t *released);

/* ------------------------------------------------------------------------ */
/* Allocation                                                               */
/* ------------------------------------------------------------------------ */

/* Every block is aligned to at least GM_ALIGNMENT bytes. */
#define GM_ALIGNMENT 256u

/* Allocate `size` bytes usable on `stream`.  pool NULL: the process-default
 * pool.  size 0 returns a NULL pointer and GM_OK. */
GM_API int gm_alloc(gm_pool_t *pool, size_t size, gm_stream_t stream, void **ptr);
/* Free: the block is reusable at once on `stream` (pass the stream the last
 * work on it was queued on); other streams reuse it only after that work is
 * done.  NULL ptr is a no-op.  A pointer from gm_host_alloc (or any pinned
 * memory of the host pool) is GM_INVALID_ARGUMENT and nothing is freed; the
 * same holds for gm_block_size and gm_record_stream. */
GM_API int gm_free(gm_pool_t *pool, void *ptr, gm_stream_t stream);
/* Declare that ptr is used on `stream` too (like PyTorch's record_stream):
 * after it is freed, it is not reused anywhere before that stream's work
 * queued until the free has completed.  One rule for every kind of memory:
 * each distinct stream is kept until the free, with no limit
 * (GM_NO_HOST_MEMORY when the host has no room for the record; the
 * allocating stream needs none).  What gm_free does with them, by kind:
 *   - a block of gm_alloc / gm_alloc_shareable in device memory: gm_free
 *     does not wait; it orders the reuse with an event recorded on each
 *     stream, else waits for the stream; when the backend fails both, the
 *     block stays pending (reused by no stream, not counted as allocated)
 *     and later calls try again;
 *   - a sysmem-fallback block, managed memory (gm_alloc_managed), a
 *     registrable segment (gm_alloc_registrable): gm_free waits on the host
 *     for each recorded stream but its own; when one cannot finish, its
 *     status is returned and the block stays live (free it again later);
 *   - pinned host memory: GM_INVALID_ARGUMENT, nothing recorded.
 * A freed block (or a cached segment) is GM_INVALID_POINTER or
 * GM_DOUBLE_FREE. */
GM_API int gm_record_stream(gm_pool_t *pool, void *ptr, gm_stream_t stream);
/* The requested size of a live block (*size) — for plug-ins and checks. */
GM_API int gm_block_size(gm_pool_t *pool, const void *ptr, size_t *size);

/* ------------------------------------------------------------------------ */
/* Device work (for tests, staging and tools)                               */
/* ------------------------------------------------------------------------ */

/* Copy n bytes (device or host addresses; unified addressing) on stream. */
GM_API int gm_memcpy(gm_pool_t *pool, void *dst, const void *src, size_t n, gm_stream_t stream);
GM_API int gm_memset(gm_pool_t *pool, void *dst, int value, size_t n, gm_stream_t stream);
GM_API int gm_stream_synchronize(gm_pool_t *pool, gm_stream_t stream);
/* A new stream of the pool's device (a non-blocking CUstream on cuda, a
 * token on sim), and its destruction.  Streams from the CUDA runtime,
 * PyTorch or CuPy work just as well wherever a gm_stream_t is taken. */
GM_API int gm_stream_create(gm_pool_t *pool, gm_stream_t *stream);
/* Before a stream that gpumem has seen is destroyed: when the pool (or its
 * host pool) holds blocks freed on it, wait for the stream's work and make
 * them reusable by every stream, so that no event is recorded on the stream
 * again; when live blocks were allocated or recorded on it, wait for its
 * work too, and never name it to the backend again (their gm_free,
 * gm_offload and the stream rule count its work as done).  Call it before destroying a stream yourself (cudaStreamDestroy,
 * a CuPy stream going away); gm_stream_destroy calls it.  A stream with work
 * held in flight (sim) gives GM_NOT_READY and stays known. */
GM_API int gm_stream_forget(gm_pool_t *pool, gm_stream_t stream);
/* Bookkeeping per stream is bounded: a pool keeps state for the streams that
 * hold its memory (free blocks not yet reusable by all, live blocks, pending
 * frees); the state of an idle stream is dropped (at gm_stream_forget, or by
 * a sweep when many new streams appear), so handles may come and go. */
GM_API int gm_stream_destroy(gm_pool_t *pool, gm_stream_t stream);

/* ------------------------------------------------------------------------ */
/* Device information                                                       */
/* ------------------------------------------------------------------------ */

#define GM_DEVICE_INFO_VERSION 2

/* gm_device_info_t.handle_types: how a page may be shared (CUDA's values). */
#define GM_HANDLE_POSIX_FD 0x1u /* a file descriptor (sharing, the broker, NCCL on one node) */
#define GM_HANDLE_FABRIC 0x8u   /* a fabric handle (NCCL across nodes over NVLink, MNNVL) */

typedef struct gm_device_info {
    size_t size;
    unsigned version;
    gm_backend_kind_t backend;   /* the backend actually in use */
    char backend_name[16];       /* "sim", "cuda" */
    char backend_reason[128];    /* why this backend was chosen */
    char device_name[128];
    int device;
    int driver_version;          /* e.g. 13000; 0 for sim */
    size_t total_memory;
    size_t free_memory;
    size_t granularity;          /* physical page size */
    int vmm_supported;           /* 1: pages + VA; 0: plain allocations */
    /* Version 2: several GPUs. */
    int device_count;            /* devices of the machine the backend sees */
    uint64_t peers;              /* devices granted access to the pool's pages (bit d) */
    unsigned handle_types;       /* GM_HANDLE_* of every page */
    int rdma_capable;            /* pages made GPUDirect-RDMA capable */
    int compression_supported;   /* the device can compress (GM_POOL_COMPRESSIBLE) */
    int compressible;            /* the pool's pages are compressible */
    size_t granularity_recommended; /* the driver's recommended allocation size and alignment
                                       (gm_alloc_registrable segments are made of it) */
} gm_device_info_t;

#ifdef __cplusplus
#define GM_DEVICE_INFO_INIT { sizeof(gm_device_info_t), GM_DEVICE_INFO_VERSION }
#else
#define GM_DEVICE_INFO_INIT { .size = sizeof(gm_device_info_t), .version = GM_DEVICE_INFO_VERSION }
#endif

GM_API int gm_pool_device_info(gm_pool_t *pool, gm_device_info_t *info);

/* ------------------------------------------------------------------------ */
/* Statistics                                                               */
/* ------------------------------------------------------------------------ */

/* X(name, description).  Every field is a uint64_t of bytes or a count.
 * This list drives the struct and the JSON output. */
#define GM_STAT_FIELDS(X)                                                      \
    X(allocated,          "bytes requested by live allocations")               \
    X(allocated_peak,     "peak of allocated")                                 \
    X(active,             "bytes in live blocks on the device (aligned sizes; offloaded ones are not)") \
    X(active_peak,        "peak of active")                                    \
    X(reserved,           "physical bytes held from the device")               \
    X(reserved_peak,      "peak of reserved")                                  \
    X(mapped,             "address space with a page mapped (a page can be mapped at several places)") \
    X(cached,             "reserved bytes not in live blocks")                 \
    X(alloc_count,        "successful allocations")                            \
    X(free_count,         "successful frees")                                  \
    X(live_blocks,        "allocations not yet freed")                         \
    X(free_blocks,        "free ranges in the address space")                  \
    X(largest_free_block, "largest free range whose pages are all mapped")     \
    X(fragmentation_ppm,  "1 - largest_free_block / free mapped bytes, in ppm") \
    X(oom_count,          "allocations that failed for lack of memory")        \
    X(retries,            "allocations served after reclaiming memory")        \
    X(pages_stolen,       "free physical pages mapped at a new place to serve a range") \
    X(inactive_split,     "free bytes in pages shared with other blocks (cannot be released)") \
    X(allocated_total,    "bytes requested by all successful allocations so far") \
    X(freed_total,        "bytes requested by all successful frees so far")   \
    X(alloc_failures,     "allocations that entered the slow path (trim, retry, handlers)") \
    X(oom_handler_calls,  "calls of out-of-memory handlers")                   \
    X(backend_ns,         "wall time spent inside backend calls")              \
    X(modeled_device_ns,  "sim backend: modeled device time of its calls")    \
    X(host_reserved,      "pinned host bytes held (registered chunks)")        \
    X(host_reserved_peak, "peak of host_reserved")                             \
    X(host_allocated,     "bytes requested by live gm_host_alloc blocks (staging included)") \
    X(host_allocated_peak, "peak of host_allocated")                           \
    X(host_alloc_count,   "successful gm_host_alloc calls")                    \
    X(sysmem_allocated,   "bytes of live device allocations served from host memory (fallback)") \
    X(sysmem_allocated_peak, "peak of sysmem_allocated")                       \
    X(sysmem_count,       "device allocations ever served from host memory")   \
    X(copy_staged_bytes,  "bytes moved by staged gm_memcpy_h2d/d2h copies")    \
    X(copy_direct_bytes,  "bytes moved by small gm_memcpy_h2d/d2h copies (one backend copy)") \
    X(offloaded,          "bytes requested by live blocks now offloaded to host memory (in allocated too)") \
    X(offload_count,      "blocks copied (or discarded) to host memory by gm_offload or eviction") \
    X(restore_count,      "blocks brought back by gm_restore") \
    X(offload_bytes_total, "bytes moved to host memory by offloads so far") \
    X(restore_bytes_total, "bytes moved back to the device by restores so far") \
    X(evictions,          "tags offloaded by the pool itself to serve an allocation (GM_POOL_EVICT)") \
    X(managed_allocated,  "bytes of live managed allocations (gm_alloc_managed; not in allocated)") \
    X(managed_allocated_peak, "peak of managed_allocated")                     \
    X(managed_count,      "successful gm_alloc_managed calls")                \
    X(registrable_reserved, "bytes of registrable segments, live and cached (not in reserved)") \
    X(registrable_allocated, "bytes requested by live gm_alloc_registrable blocks (not in allocated)") \
    X(registrable_count,  "successful gm_alloc_registrable calls")

#define GM_STATS_VERSION 1

typedef struct gm_stats {
    size_t size;
    unsigned version;
#define GM__STAT_MEMBER(name, desc) uint64_t name;
    GM_STAT_FIELDS(GM__STAT_MEMBER)
#undef GM__STAT_MEMBER
    uint64_t backend_calls[GM_CALL_COUNT];
} gm_stats_t;

#ifdef __cplusplus
#define GM_STATS_INIT { sizeof(gm_stats_t), GM_STATS_VERSION }
#else
#define GM_STATS_INIT { .size = sizeof(gm_stats_t), .version = GM_STATS_VERSION }
#endif

GM_API int gm_pool_stats(gm_pool_t *pool, gm_stats_t *stats);
/* Reset the *_peak fields to the current values. */
GM_API int gm_pool_reset_peaks(gm_pool_t *pool);
/* Write the stats as one JSON object into buf (always NUL-terminated when
 * cap > 0); *len (optional) receives the length it needed.  Only the fields
 * that lie within stats->size are read and printed (an older, smaller
 * gm_stats_t gives its own fields; backend_calls only when the whole array
 * fits); a size smaller than the header is GM_INVALID_ARGUMENT. */
GM_API int gm_stats_json(const gm_stats_t *stats, char *buf, size_t cap, size_t *len);

/* Walk every internal structure of the pool and check its invariants.
 * GM_INTERNAL with a message naming the broken one. */
GM_API int gm_pool_check(gm_pool_t *pool);

/* ------------------------------------------------------------------------ */
/* Observability                                                            */
/* ------------------------------------------------------------------------ */

/* Names PyTorch users know, and ours (docs/observability.md has the table):
 *   torch "allocated_bytes"      == our `active`    (aligned bytes of live blocks)
 *   torch "requested_bytes"      == our `allocated` (what callers asked for)
 *   torch "reserved_bytes"       == our `reserved`
 *   torch "inactive_split_bytes" == our `inactive_split`
 *   torch "num_alloc_retries"    == our `retries`;  "num_ooms" == `oom_count`. */

/* Sum of the stats of every live pool of this process (peaks are the sums of
 * the pools' peaks, so an upper bound of the process peak).  Two fields are
 * not sums: largest_free_block is the largest of any pool, and
 * fragmentation_ppm is 1 - largest_free_block / (mapped - active) over the
 * process figures.  Pools register
 * themselves at creation and leave at destruction. */
GM_API int gm_process_stats(gm_stats_t *stats);
/* gm_pool_reset_peaks on every pool of the process. */
GM_API int gm_process_reset_peaks(void);

/* Out-of-memory handlers.  When an allocation cannot be served even after
 * the pool has drained its streams and trimmed its cache, each handler of the
 * pool is called in the order they were added, WITHOUT the pool lock held (a
 * handler may free memory of this pool, or of others).  Return non-zero to
 * ask for a retry of the allocation (after freeing something), 0 to decline.
 * The first handler that asks for a retry stops the round; the allocation is
 * retried; if it fails again the round restarts, at most GM_OOM_MAX_ROUNDS
 * times.  Inside a handler, allocations on the pool whose handlers are
 * running (from the same thread) do not call the handlers again: they
 * succeed or fail as if the pool had none.  When every handler declines, the allocation fails with
 * GM_OUT_OF_MEMORY (or GM_LIMIT) and the full OOM report in gm_last_error(). */
typedef int (*gm_oom_handler_t)(gm_pool_t *pool, size_t size, gm_stream_t stream, void *user);
#define GM_OOM_MAX_HANDLERS 8
#define GM_OOM_MAX_ROUNDS 4
/* Add a handler (pool NULL: the default pool).  The same (fn, user) pair
 * added twice is GM_INVALID_ARGUMENT; more than GM_OOM_MAX_HANDLERS: GM_LIMIT. */
GM_API int gm_set_oom_handler(gm_pool_t *pool, gm_oom_handler_t fn, void *user);
/* Remove the handler added with the same (fn, user); GM_INVALID_ARGUMENT when
 * there is none.  Does not wait for a call of it already running. */
GM_API int gm_remove_oom_handler(gm_pool_t *pool, gm_oom_handler_t fn, void *user);

/* Allocation tracing in RMM's logging CSV (Thread,Time,Action,Pointer,Size,
 * Stream), gzip'd when path ends in ".gz" (and zlib was found at build time).
 * Process-wide: every pool's allocate / free / allocate failure is recorded.
 * GPUMEM_TRACE=PATH starts it when the first pool is created.  Records go to
 * per-pool binary buffers under the pool lock; a background thread formats
 * and writes them.  Stop flushes everything and closes the file; the file is
 * also complete after a pool is destroyed or at process exit.  Both may be
 * called from any number of threads at once: calls are serialized, start
 * while a trace runs stops that trace first (the last start wins), and stop
 * with no trace running is a no-op returning GM_OK. */
GM_API int gm_trace_start(const char *path);
GM_API int gm_trace_stop(void);

/* Leak check.  With GPUMEM_LEAK_CHECK=1 (or =error) every allocation records
 * its call stack (glibc backtrace, at most GM_LEAK_MAX_FRAMES frames);
 * symbols are resolved only when reporting.  At pool destruction and at
 * process exit each live allocation is printed on stderr as
 *   Leaked N bytes at 0xADDR
 *       #0 0x... function+0x12 (object)
 * followed by "LEAK SUMMARY: X bytes leaked in Y allocations".  With
 * GPUMEM_LEAK_CHECK=error, a process that leaked exits with status
 * GM_LEAK_EXIT_STATUS (fresh leaks found by the exit check; see the docs). */
#define GM_LEAK_MAX_FRAMES 16
#define GM_LEAK_EXIT_STATUS 23
/* Turn stack recording on or off for allocations made from now on
 * (enabled != 0); what GPUMEM_LEAK_CHECK=1 does at the first pool. */
GM_API int gm_leak_tracking(int enabled);
/* The leak report of `pool` (NULL: every pool of the process) as text into
 * buf (always NUL-terminated when cap > 0); *len (optional) receives the
 * length it needed.  Without tracking, stacks read "(stack not recorded)".
 * GM_INVALID_ARGUMENT when the text did not fit (it is cut). */
GM_API int gm_leak_report(gm_pool_t *pool, char *buf, size_t cap, size_t *len);

/* ------------------------------------------------------------------------ */
/* Host memory                                                              */
/* ------------------------------------------------------------------------ */

/* Pool flag: when device memory is exhausted (or the pool limit reached),
 * gm_alloc serves the request from pinned host memory mapped for the device
 * ("sysmem") instead of failing.  Such blocks are slow (every device access
 * crosses PCIe), so they are never silent: stats count them apart
 * (sysmem_allocated, sysmem_count) and they are not part of `allocated`.
 * gm_free, gm_block_size and gm_record_stream take them like any block.
 * Environment: GPUMEM_SYSMEM_FALLBACK=1. */
#define GM_POOL_SYSMEM_FALLBACK 0x1u
/* Pool flag: before an allocation fails for lack of device memory, offload
 * the least recently released GM_TAG_EVICTABLE tag that no gm_tag_acquire
 * holds, and retry (docs/offload.md).  Environment: GPUMEM_EVICT=1. */
#define GM_POOL_EVICT 0x2u
/* Pool flag: make every physical page the way NCCL's ncclMemAlloc makes its
 * own (a POSIX fd handle, plus a fabric handle where the device and system
 * allow it; GPUDirect RDMA capable where the device allows it), so NCCL can
 * register gpumem blocks (docs/multigpu.md).  Environment: GPUMEM_NCCL=1. */
#define GM_POOL_NCCL 0x4u
/* Pool flag: every physical page compressible (the driver's generic
 * compression).  gm_pool_create fails with GM_NOT_SUPPORTED on a device
 * without it.  Environment: GPUMEM_COMPRESSIBLE=1. */
#define GM_POOL_COMPRESSIBLE 0x8u

/* Pinned (page-locked, device-mapped) host memory from the pool's host pool:
 * large chunks registered once with the driver, carved per request, reused
 * without a driver call.  Same stream rule as device memory: a block freed
 * on `stream` is reused at once by allocations on that stream, and by other
 * streams only after the work queued on `stream` before the free is done.
 * Blocks are aligned to GM_ALIGNMENT.  size 0 gives NULL and GM_OK. */
GM_API int gm_host_alloc(gm_pool_t *pool, size_t size, gm_stream_t stream, void **ptr);
/* NULL is a no-op.  A block of gm_alloc (device memory, or a block the
 * sysmem fallback served from this host pool) or pinned memory the library
 * uses itself: GM_INVALID_ARGUMENT, nothing freed.  Anything else not from
 * gm_host_alloc: GM_INVALID_POINTER. */
GM_API int gm_host_free(gm_pool_t *pool, void *ptr, gm_stream_t stream);
/* Give whole free chunks of pinned memory back to the system until at most
 * `keep` bytes of unused pinned memory remain; *released (optional). */
GM_API int gm_host_trim(gm_pool_t *pool, size_t keep, size_t *released);

/* Copies between pageable (ordinary) host memory and device memory, ordered
 * on `stream` like any work queued there.  Large copies are pipelined
 * through pinned staging buffers by worker threads while the DMA engine
 * runs; small ones (and pinned host buffers from gm_host_alloc) are one
 * backend copy.  Buffer rules:
 *   gm_memcpy_h2d returns once every byte of src has been read: src may be
 *   reused or freed at once.  dst (device) holds the data for work queued
 *   on `stream` after the call; gm_stream_synchronize(pool, stream) waits
 *   for it from the host.
 *   gm_memcpy_d2h waits for the work queued on `stream` before it, and
 *   returns once dst (host) holds the data: complete on return.
 * src and dst must not overlap each other; overlapping device ranges of
 * successive copies on one stream are ordered by the stream. */
GM_API int gm_memcpy_h2d(gm_pool_t *pool, void *dst, const void *src, size_t n, gm_stream_t stream);
GM_API int gm_memcpy_d2h(gm_pool_t *pool, void *dst, const void *src, size_t n, gm_stream_t stream);

/* Managed (unified) memory: the driver's own oversubscription
 * (cuMemAllocManaged), for programs that would rather run slower than stop
 * when the device is full.  Its pages migrate between host and device on
 * demand, on the driver's terms, so it is not part of the pool's pages:
 * neither the pool limit nor `allocated` counts it; stats count it apart
 * (managed_allocated, managed_allocated_peak, managed_count) and leak
 * reports list it.  flags:
 *   GM_MANAGED_PREFER_DEVICE  advise the driver to keep its pages on the
 *                             pool's device, and map them for the device
 *                             wherever they are;
 *   GM_MANAGED_PREFETCH       migrate the pages to the device, queued on
 *                             `stream` (its work after the call finds them
 *                             there).
 * Free it with gm_free (which waits for the device to finish with it, as
 * cuMemFree does); gm_block_size gives its size.  size 0: NULL and GM_OK. */
#define GM_MANAGED_PREFER_DEVICE 0x1u
#define GM_MANAGED_PREFETCH 0x2u
GM_API int gm_alloc_managed(gm_pool_t *pool, size_t size, unsigned flags, gm_stream_t stream,
                            void **ptr);
/* Migrate [ptr, ptr+size) of a managed allocation to the device (to_host 0)
 * or to host memory, queued on `stream`. */
GM_API int gm_managed_prefetch(gm_pool_t *pool, void *ptr, size_t size, int to_host,
                               gm_stream_t stream);

/* ------------------------------------------------------------------------ */
/* Sharing memory between processes (docs/sharing.md)                        */
/* ------------------------------------------------------------------------ */

/* A block whose pages hold nothing else: it starts at a page boundary and
 * its size is rounded up to whole pages (gm_device_info_t.granularity).
 * Free it with gm_free.  Only such memory can be published: another process
 * that maps a page sees all of it, so a page shared with other blocks would
 * expose them. */
GM_API int gm_alloc_shareable(gm_pool_t *pool, size_t size, gm_stream_t stream, void **ptr);

typedef struct gm_share_server gm_share_server_t;
typedef struct gm_share_client gm_share_client_t;

/* Access granted to importers of a name. */
#define GM_SHARE_READ_WRITE 0
#define GM_SHARE_READ_ONLY 1

/* Who may connect to a server.  Default (NULL policy, or flags 0): peers
 * whose uid is the server's.  The socket file gets mode 0600, or 0660 with
 * allow_gid, or 0666 with GM_SHARE_ANY_UID. */
#define GM_SHARE_POLICY_VERSION 1
#define GM_SHARE_ANY_UID 0x1u  /* any local user (still subject to tokens) */
typedef struct gm_share_policy {
    size_t size;
    unsigned version;
    unsigned flags;        /* GM_SHARE_ANY_UID */
    long allow_gid;        /* >= 0: also peers whose gid is this one; -1: none */
    unsigned max_peers;    /* connections at once; 0 = 64 */
} gm_share_policy_t;
#ifdef __cplusplus
#define GM_SHARE_POLICY_INIT { sizeof(gm_share_policy_t), GM_SHARE_POLICY_VERSION, 0, -1, 0 }
#else
#define GM_SHARE_POLICY_INIT { .size = sizeof(gm_share_policy_t), \
                               .version = GM_SHARE_POLICY_VERSION, .allow_gid = -1 }
#endif

/* Serve pool's published memory on a Unix-domain socket at path (a thread
 * of the library answers peers).  A stale socket file left by a dead server
 * of the same user is replaced; a live server or any other file at path is
 * GM_INVALID_STATE. */
GM_API int gm_share_listen(gm_pool_t *pool, const char *path, const gm_share_policy_t *policy,
                           gm_share_server_t **server);
/* Publish [ptr, ptr + size) under name (1..63 printable characters) with
 * access GM_SHARE_READ_WRITE or GM_SHARE_READ_ONLY; token (NULL or "": none;
 * at most 63 characters) must then be presented by importers.  The range
 * lies in one live block of gm_alloc_shareable.  Work queued on `stream`
 * before the call completes first (the call waits for it), so importers see
 * the data written there.  From now on the block stays allocated while it is
 * published or imported: a gm_free of it returns GM_OK at once and the
 * memory is freed when the last importer lets go. */
GM_API int gm_share_publish(gm_share_server_t *server, const char *name, void *ptr, size_t size,
                            int access, const char *token, gm_stream_t stream);
/* Several ranges under one name, imported in one request (e.g. every
 * parameter of a model, each its own gm_alloc_shareable block): each range as
 * gm_share_publish's; at most GM_SHARE_RANGES_MAX. */
#define GM_SHARE_RANGES_MAX 65536
typedef struct gm_share_range {
    void *ptr;
    size_t size;
} gm_share_range_t;
GM_API int gm_share_publish_ranges(gm_share_server_t *server, const char *name,
                                   const gm_share_range_t *ranges, size_t n, int access,
                                   const char *token, gm_stream_t stream);
/* No new imports of name; current importers keep their mappings. */
GM_API int gm_share_unpublish(gm_share_server_t *server, const char *name);
/* Unpublish everything, drop every peer (their mappings stay valid in their
 * processes), stop the thread, remove the socket file.  NULL is a no-op.
 * gm_pool_destroy closes the pool's servers and clients itself. */
GM_API int gm_share_close(gm_share_server_t *server);

/* Connect to a server; the server's uid must be this process's (or root). */
GM_API int gm_share_connect(gm_pool_t *pool, const char *path, gm_share_client_t **client);
/* Map the memory published under name into this process: *ptr (its own
 * address), *size, *access (optional).  Importing a name again returns the
 * same mapping (counted; each import needs a release).  A read-only import
 * is mapped read-only on the device.  Unknown name, wrong token: the
 * server's refusal with its reason; a dead server: GM_IO. */
GM_API int gm_share_import(gm_share_client_t *client, const char *name, const char *token,
                           void **ptr, size_t *size, int *access);
/* Import a name of any number of ranges: out[0..*n) receive the ranges in
 * this process (all pages in one mapping, released with out[0].ptr).  cap
 * too small (or out NULL): GM_INVALID_ARGUMENT with *n set to the count and
 * nothing kept.  gm_share_import of a name of several ranges is refused. */
GM_API int gm_share_import_ranges(gm_share_client_t *client, const char *name, const char *token,
                                  gm_share_range_t *out, size_t cap, size_t *n, int *access);
/* Drop one import of ptr (as returned by gm_share_import); the last one
 * unmaps it after the work queued on `stream` completes (the call waits).
 * Works after the server is gone. */
GM_API int gm_share_release(gm_share_client_t *client, void *ptr, gm_stream_t stream);
/* Release every import (waiting for the device) and close.  NULL: no-op. */
GM_API int gm_share_disconnect(gm_share_client_t *client);

#define GM_SHARE_STATS_VERSION 1
typedef struct gm_share_stats {
    size_t size;
    unsigned version;
    uint64_t servers;          /* open servers of the pool */
    uint64_t published;        /* names published now */
    uint64_t published_bytes;  /* bytes under those names */
    uint64_t exported_bytes;   /* bytes mapped by peers now (per peer mapping) */
    uint64_t held_for_peers_bytes; /* blocks freed here, kept while peers map them */
    uint64_t peers;            /* connected peers */
    uint64_t peers_refused;    /* connections refused by the policy */
    uint64_t peers_dropped;    /* peers dropped for a malformed message */
    uint64_t imports;          /* distinct mappings imported by this pool's clients */
    uint64_t imported_bytes;   /* bytes of those mappings (whole pages) */
} gm_share_stats_t;
#ifdef __cplusplus
#define GM_SHARE_STATS_INIT { sizeof(gm_share_stats_t), GM_SHARE_STATS_VERSION }
#else
#define GM_SHARE_STATS_INIT { .size = sizeof(gm_share_stats_t), .version = GM_SHARE_STATS_VERSION }
#endif
GM_API int gm_share_stats(gm_pool_t *pool, gm_share_stats_t *stats);

/* ------------------------------------------------------------------------ */
/* Several GPUs: registrable memory (docs/multigpu.md)                       */
/* ------------------------------------------------------------------------ */

/* Peer access, NCCL's handle types and compression are pool settings:
 * gm_pool_config_t.peers (GPUMEM_PEERS), GM_POOL_NCCL (GPUMEM_NCCL) and
 * GM_POOL_COMPRESSIBLE (GPUMEM_COMPRESSIBLE); gm_pool_device_info says what
 * was granted. */

/* Memory for a communication library to register (NCCL's ncclCommRegister
 * or window registration): a segment, one physical allocation behind the
 * whole block (NCCL up to 2.28 registers nothing else), made with the pool's
 * page properties and mapped for its device and peers.  The pool's register
 * hook (gm_pool_set_register_hooks) is called once per segment made, not per
 * allocation.  gm_free keeps the segment mapped and registered in a cache;
 * a later gm_alloc_registrable whose size it fits (at most 1/8 larger) gets
 * it back without a driver call or a registration.  gm_trim gives cached
 * segments back (deregister hook first), as does a creation that finds no
 * room.  Registered memory never moves: segments carry no tag (gm_offload
 * never touches them) and live ones are never unmapped.  Same stream rule
 * as gm_alloc.  Counted against the pool limit, and in the stats apart
 * (registrable_reserved, registrable_allocated, registrable_count).  Slower
 * to make than gm_alloc blocks (a few driver calls per new segment): meant
 * for long-lived buffers and for allocators that carve tensors out of
 * segments (PyTorch's MemPool).  GM_NOT_SUPPORTED in a pool that leases its
 * pages from a broker.  size 0 gives NULL and GM_OK. */
GM_API int gm_alloc_registrable(gm_pool_t *pool, size_t size, gm_stream_t stream, void **ptr);

typedef struct gm_register_hooks {
    /* Register [ptr, ptr + size), a new segment; *handle (optional) is
     * given back to deregister.  Anything but GM_OK fails the allocation
     * (or gm_pool_set_register_hooks), which then frees the segment. */
    int (*reg)(void *user, void *ptr, size_t size, void **handle);
    /* Deregister a segment reg accepted, before it is unmapped. */
    void (*deregister)(void *user, void *ptr, size_t size, void *handle);
    void *user;
} gm_register_hooks_t;

/* Install hooks (NULL or reg NULL: none).  Every segment the earlier hooks
 * registered is deregistered with them first; every existing segment, live
 * or cached, is then registered with the new ones (if one refuses, those
 * done are deregistered, no hooks are installed, and the refusal is
 * returned).  The hooks run with the pool's lock held: they must not call
 * gpumem on this pool.  The pool keeps a copy of *hooks. */
GM_API int gm_pool_set_register_hooks(gm_pool_t *pool, const gm_register_hooks_t *hooks);

/* ------------------------------------------------------------------------ */
/* Tags, offload and restore (docs/offload.md)                               */
/* ------------------------------------------------------------------------ */

/* A tag names a set of allocations that are put to sleep and woken
 * together: a model's weights, a KV cache.  gm_offload copies every live
 * block of a tag to pinned host memory and gives its device pages back (to
 * the driver, or to the broker); gm_restore takes pages again, maps them at
 * the *same* addresses and copies the data back, so every pointer the
 * program holds stays valid.  Between the two the blocks stay allocated
 * (gm_free works on them; host copies are carved from segments of up to
 * 128 MiB, each given back to the host pool with the last block copied
 * into it) but their memory must not
 * be touched on the device: GPUs raise no page fault for this memory, an
 * access is an illegal-address error.
 *
 * Tags are process-wide numbers made from names; 0 (GM_TAG_NONE) is "no
 * tag".  An allocation gets the tag given to gm_alloc_tagged, else its
 * thread's current tag (gm_tag_scope), so PyTorch, CuPy and programs under
 * the preload library tag memory without changing each call.  Never
 * tagged, so never moved: gm_alloc_shareable blocks (another process may
 * map their pages), imported memory, managed memory, sysmem-fallback
 * blocks. */
typedef uint32_t gm_tag_t;
#define GM_TAG_NONE 0u
#define GM_TAGS_MAX 1024u        /* tags a process may make */
#define GM_TAG_NAME_MAX 63u      /* bytes of a tag's name */
/* Tag flags (fixed when the tag is made):
 *   GM_TAG_DISCARD: the contents need not survive: gm_offload releases the
 *     pages without copying and gm_restore maps fresh pages (their contents
 *     are undefined), e.g. a KV cache that is rebuilt anyway;
 *   GM_TAG_EVICTABLE: a pool made with GM_POOL_EVICT may offload this tag by
 *     itself when an allocation would otherwise fail, but only while no
 *     gm_tag_acquire holds it (see there). */
#define GM_TAG_DISCARD 0x1u
#define GM_TAG_EVICTABLE 0x2u
/* The tag called `name` (1 to GM_TAG_NAME_MAX bytes), made on first use
 * with `flags`.  A later call with the same name returns the same tag; with
 * other flags it fails with GM_INVALID_ARGUMENT. GM_LIMIT past GM_TAGS_MAX. */
GM_API int gm_tag_get(const char *name, unsigned flags, gm_tag_t *tag);
/* Set this thread's current tag (GM_TAG_NONE: none) and return the previous
 * one, for scopes: `gm_tag_t old = gm_tag_scope(t); ...; gm_tag_scope(old);`.
 * An unknown tag is ignored (the current one stays and is returned). */
GM_API gm_tag_t gm_tag_scope(gm_tag_t tag);
/* gm_alloc with an explicit tag (GM_TAG_NONE: untagged, whatever the
 * thread's scope).  An allocation into a tag that is offloaded now is
 * resident as usual: gm_restore leaves it alone, gm_offload takes it. */
GM_API int gm_alloc_tagged(gm_pool_t *pool, size_t size, gm_stream_t stream, gm_tag_t tag,
                           void **ptr);
/* Offload flag: release without copying, as if the tag had GM_TAG_DISCARD. */
#define GM_OFFLOAD_DISCARD 0x1u
/* Put the tag's resident blocks of this pool to sleep.  First waits for
 * `stream` and for every stream the blocks were allocated or recorded on
 * (their queued work may still use them), then copies the blocks to pinned
 * host memory (the pool's host pool: pieces in flight on several streams)
 * and releases each device page once nothing resident lies in it (a page
 * shared with a block of another tag stays).  Returns when done.
 * Fails, with what was done in the message, and nothing lost:
 *   GM_NO_HOST_MEMORY  pinned host memory ran out: the blocks copied so far
 *                      are offloaded, the others still resident;
 *   GM_NOT_SUPPORTED   a block of the tag is shared with another process
 *                      (gm_share_publish / import): nothing moved;
 *   GM_BACKEND etc.    a copy or a stream failed: the blocks not yet
 *                      copied stay resident; a page that could not be
 *                      released stays cached (gm_trim releases it).
 * Calling it again finishes the work.  Holds the pool's lock while it runs
 * (other threads' allocations wait).  A held tag (gm_tag_acquire) is
 * offloaded all the same: holding only stops eviction. */
GM_API int gm_offload(gm_pool_t *pool, gm_tag_t tag, unsigned flags, gm_stream_t stream);
/* Make the pinned host memory of the tag's next gm_offload ahead of time,
 * so that a first sleep copies at the speed of a later one: pinning new
 * host memory (the kernel zeroes it, the driver registers it) otherwise
 * happens during the first offload and dominates it.  Sized from the tag's
 * resident blocks of this pool now, in the pieces the offload will ask
 * for; memory already free in the host pool counts.  The memory stays in
 * the pool's pinned host pool (host_reserved; the host pool's growth does
 * not give it back) until gm_host_trim; a tag that grows after the call
 * gets the rest pinned by its offload as usual.  A GM_TAG_DISCARD tag needs
 * none: GM_OK at once.
 * flags: GM_PREPARE_ASYNC makes it on a thread of the pool's and returns at
 *   once; gm_offload (of any tag), gm_offload_prepare and
 *   gm_offload_prepare_wait of this pool wait for it to end first.
 * When pinned memory cannot be made (GM_NO_HOST_MEMORY, or the backend's
 * status when the driver refuses a registration) the message says "N of M
 * bytes made", and what was made stays; GM_INVALID_ARGUMENT for an unknown
 * tag or flag. */
#define GM_PREPARE_ASYNC 0x1u
GM_API int gm_offload_prepare(gm_pool_t *pool, gm_tag_t tag, unsigned flags);
/* Wait for this pool's GM_PREPARE_ASYNC preparation, if one runs or ran
 * since the last wait: its status (GM_OK when none). */
GM_API int gm_offload_prepare_wait(gm_pool_t *pool);
/* Wake the tag's offloaded blocks of this pool: pages are obtained and
 * mapped at the blocks' own addresses, the data is copied back, the host
 * copies are freed (their pinned memory stays in the host pool for the
 * next offload; gm_host_trim gives it back).  Work queued on `stream` after
 * the call sees the data (the call returns once it is in place).
 * All or nothing: when the pages cannot all be had (GM_OUT_OF_MEMORY,
 * GM_LIMIT, with the usual message), or a copy fails, the tag stays
 * offloaded with its data safe in host memory, and a later call may try
 * again.  Nothing offloaded: GM_OK at once. */
GM_API int gm_restore(gm_pool_t *pool, gm_tag_t tag, gm_stream_t stream);
/* Eviction's protocol for GM_TAG_EVICTABLE tags: acquire restores the tag
 * if it was offloaded and holds it (a count): the pool never evicts a held
 * tag.  Release drops one hold; the tag's work queued on `stream` before
 * the release is waited for before any eviction.  Use such a tag's memory
 * only between the two.  Release without a hold: GM_INVALID_STATE. */
GM_API int gm_tag_acquire(gm_pool_t *pool, gm_tag_t tag, gm_stream_t stream);
GM_API int gm_tag_release(gm_pool_t *pool, gm_tag_t tag, gm_stream_t stream);

#define GM_TAG_INFO_VERSION 1
typedef struct gm_tag_info {
    size_t size;                 /* sizeof(gm_tag_info_t) */
    unsigned version;            /* GM_TAG_INFO_VERSION */
    char name[GM_TAG_NAME_MAX + 1];
    unsigned flags;              /* GM_TAG_* */
    uint64_t resident_blocks;    /* live blocks of the tag on the device */
    uint64_t resident_bytes;     /* their sizes (requested) */
    uint64_t offloaded_blocks;   /* live blocks of the tag in host memory */
    uint64_t offloaded_bytes;
    uint64_t holds;              /* gm_tag_acquire minus gm_tag_release */
    uint64_t offloads, restores, evictions; /* calls that moved something */
} gm_tag_info_t;
#ifdef __cplusplus
#define GM_TAG_INFO_INIT { sizeof(gm_tag_info_t), GM_TAG_INFO_VERSION }
#else
#define GM_TAG_INFO_INIT { .size = sizeof(gm_tag_info_t), .version = GM_TAG_INFO_VERSION }
#endif
/* The tag's figures in this pool (all heaps). */
GM_API int gm_tag_info(gm_pool_t *pool, gm_tag_t tag, gm_tag_info_t *info);

/* ------------------------------------------------------------------------ */
/* PyTorch pluggable allocator (torch.cuda.memory.CUDAPluggableAllocator)    */
/* ------------------------------------------------------------------------ */

#include <sys/types.h> /* ssize_t */

/* The two functions PyTorch loads:
 *   CUDAPluggableAllocator("libgpumem.so", "gm_torch_alloc", "gm_torch_free")
 * One pool per device (gm_device_pool), gpumem's stream rule.  On failure
 * gm_torch_alloc throws a C++ std::runtime_error("CUDA out of memory
 * (gpumem): ...") into its caller when libstdc++ is loaded in the process
 * (PyTorch ignores a NULL from a plugged allocator); with
 * GPUMEM_TORCH_OOM=null, or without libstdc++, it returns NULL.  Size 0
 * returns NULL.  Meant to be called by PyTorch: a C caller sets
 * GPUMEM_TORCH_OOM=null (read once, at the first failure). */
GM_API void *gm_torch_alloc(ssize_t size, int device, gm_stream_t stream);
GM_API void gm_torch_free(void *ptr, ssize_t size, int device, gm_stream_t stream);
/* gm_torch_alloc for registrable segments (gm_alloc_registrable on the
 * device pool), freed with gm_torch_free: the allocator of a
 * torch.cuda.MemPool whose segments NCCL can register
 * (gpumem.torch.nccl_mem_pool(), docs/multigpu.md). */
GM_API void *gm_torch_alloc_registrable(ssize_t size, int device, gm_stream_t stream);
/* Hooks settable on PyTorch's allocator object from Python:
 * set_reset_fn (torch.cuda.empty_cache: gm_trim of every device pool),
 * set_record_stream_fn (Tensor.record_stream: gm_record_stream),
 * set_memory_fraction_fn (torch.cuda.set_per_process_memory_fraction: the
 * pool's limit).  Errors go to stderr: PyTorch gives them no way back. */
GM_API void gm_torch_empty_cache(void);
GM_API void gm_torch_record_stream(void *ptr, gm_stream_t stream);
GM_API void gm_torch_set_memory_fraction(double fraction, int device);
/* GPUMEM_TORCH_SHAREABLE as the library reads every size (docs/options.md):
 * *bytes = the smallest tensor the native allocator makes shareable (0:
 * none, also when unset).  A malformed value: GM_INVALID_ARGUMENT, saying
 * so. */
GM_API int gm_torch_shareable_min(size_t *bytes);

/* ------------------------------------------------------------------------ */
/* CuPy allocator without Python (cupy.cuda.memory.CFunctionAllocator)      */
/* ------------------------------------------------------------------------ */

/* What gm_cupy_malloc needs from the process, filled by gpumem.cupy:
 * CuPy's current stream, and the Python C API calls that raise an exception
 * into CuPy (which checks for one when the allocation returns (void *)-1).
 * The functions are called with the GIL held, as CuPy calls the allocator. */
#define GM_CUPY_HOOKS_VERSION 1
typedef struct gm_cupy_hooks {
    size_t size;                                   /* sizeof(gm_cupy_hooks_t) */
    unsigned version;                              /* GM_CUPY_HOOKS_VERSION */
    intptr_t (*current_stream)(void);              /* cupy.cuda.stream's get_current_stream_ptr */
    void *(*build_value)(const char *format, ...); /* Py_BuildValue */
    void (*set_object)(void *type, void *value);   /* PyErr_SetObject */
    void (*decref)(void *object);                  /* Py_DecRef */
    void *oom_type;    /* raised as oom_type(size, reserved) when memory is short:
                          cupy.cuda.memory.OutOfMemoryError */
    void *error_type;  /* raised as error_type(message) otherwise */
} gm_cupy_hooks_t;

/* CuPy's malloc and free (CFunctionAllocator(hooks, gm_cupy_malloc,
 * gm_cupy_free, owner)): gm_alloc on the pool of `device` and CuPy's current
 * stream; the free goes to the stream the block was allocated on.  On
 * failure gm_cupy_malloc sets the Python exception through the hooks and
 * returns (void *)-1.  Size 0 returns NULL.  A free of a pointer it did not
 * hand out is reported on stderr and ignored (CuPy frees from destructors). */
GM_API void *gm_cupy_malloc(void *hooks, size_t size, int device);
GM_API void gm_cupy_free(void *hooks, void *ptr, int device);

/* ------------------------------------------------------------------------ */
/* Sim backend controls (testing); GM_NOT_SUPPORTED on other backends       */
/* ------------------------------------------------------------------------ */

/* Make the n-th next call of `kind` (1 = the very next) fail with
 * GM_BACKEND, changing nothing; 0 disarms.  Also on the cuda backend, where
 * the armed driver call is not made and answers CUDA_ERROR_UNKNOWN. */
GM_API int gm_sim_fail_nth(gm_pool_t *pool, int kind, unsigned long n);
/* hold != 0: work queued on `stream` stays "in flight" (its events do not
 * complete, synchronizing it fails with GM_NOT_READY) until released. */
GM_API int gm_sim_hold_stream(gm_pool_t *pool, gm_stream_t stream, int hold);

#ifdef __cplusplus
}
#endif

#endif /* GPUMEM_H */
