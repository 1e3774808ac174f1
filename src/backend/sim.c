/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sim.c — the simulator backend: a "device" made of host memory that keeps
 * the semantics of the CUDA virtual memory management API, so everything above
 * the backend contract runs and is tested for real on any Linux machine.
 *
 * It owns, per opened context: the virtual address reservations, the physical
 * handles, the mappings between them, events and the "held" state of streams, the modeled device time and
 * the fault-injection countdowns.
 *
 * The one idea: a physical handle is a memfd, a reservation is an
 * mmap(PROT_NONE) of address space, and a map is mmap(MAP_FIXED|MAP_SHARED)
 * of the handle's memfd over part of a reservation.  So bytes written through
 * one mapping are visible through every other mapping of the same handle, in
 * this process or (after export_fd/import_fd) in another one, exactly as on a
 * GPU; untouched pages cost no RAM, so an 80 GiB "device" fits on a laptop.
 * Every call also checks the preconditions the driver would check (and some
 * it would only crash on), charges a modeled H100 time, and can be made to
 * fail on demand.  Work is synchronous; a stream can be "held" so that events
 * recorded on it stay incomplete until it is released — that is how the
 * cross-stream reuse rules are tested deterministically, without ever blocking.
 * The sim also checks that rule: it remembers the last SIM_FLIGHTS ranges of
 * device or registered host memory that copies and fills on held streams
 * touched ("in flight" until the hold is released), and fails a copy or fill
 * on another stream that touches one of them (one side writing) without
 * having waited (stream_wait_event) on an event recorded on that stream:
 * memory handed to a stream while another stream's work on it was pending.
 *
 * Capacity: phys_create counts against the capacity; imported
 * handles do not.  An imported handle is memory another context (usually
 * another process) created and already counted — on a real GPU too the
 * importer gets a reference to the exporter's physical allocation — so
 * counting it again would make two processes sharing one buffer look like
 * they use it twice.
 *
 * Limits of the host, not of the model: every physical handle holds one file
 * descriptor (open() raises RLIMIT_NOFILE's soft limit to the hard limit), and
 * every mapping is at least one kernel VMA (vm.max_map_count, 65530 by
 * default).  Both failures are reported with the setting to change.
 *
 * Locking: one mutex per context, taken by every member for its bookkeeping.
 * The data movement of memcpy/memset runs after the lock is dropped, so copies
 * from several threads overlap; the caller guarantees, as on a GPU, that the
 * memory is not unmapped meanwhile.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/backend.h"
#include "base/hash.h"
#include "base/internal.h"

/* A sim page (phys_create's memfd) is sealed once sized: it can neither
 * shrink nor grow, and no seal can be added (nor taken: seals never go).
 * import_fd accepts only a memfd with the first two, so a page mapped here
 * can never be cut short under the mapping by whoever sent it. */
#define SIM_PAGE_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

/* ------------------------------------------------------------------------ */
/* The cost model                                                            */
/* ------------------------------------------------------------------------ */

/* Modeled device time of one call, in ns, from the H100 measurements in
 * DESIGN.md.  "assumed": DESIGN.md gives no figure; a plausible small value
 * chosen here.  Size-dependent parts are the *_PER_* constants below. */
static const uint64_t call_cost_ns[GM_CALL_COUNT] = {
    [GM_CALL_va_reserve] = 2000,    /* assumed (cuMemAddressReserve) */
    [GM_CALL_va_free] = 2000,       /* assumed (cuMemAddressFree) */
    [GM_CALL_phys_create] = 7400,   /* cuMemCreate of 2 MiB; + PHYS_CREATE_PER_EXTRA_PAGE_NS */
    [GM_CALL_phys_release] = 9300,  /* cuMemRelease */
    [GM_CALL_map] = 500,            /* cuMemMap */
    [GM_CALL_unmap] = 13900,        /* cuMemUnmap */
    [GM_CALL_set_access] = 19200,   /* cuMemSetAccess, per handle in the range */
    [GM_CALL_export_fd] = 5000,     /* assumed (cuMemExportToShareableHandle) */
    [GM_CALL_import_fd] = 10000,    /* assumed (cuMemImportFromShareableHandle) */
    [GM_CALL_event_create] = 1000,  /* assumed */
    [GM_CALL_event_destroy] = 1000, /* assumed */
    [GM_CALL_event_record] = 2000,  /* assumed */
    [GM_CALL_event_query] = 500,    /* assumed */
    [GM_CALL_event_sync] = 1000,    /* assumed (work already complete) */
    [GM_CALL_stream_sync] = 2000,   /* assumed (work already complete) */
    [GM_CALL_memcpy] = 2000,        /* assumed launch cost; + bytes at the rates below */
    [GM_CALL_memset] = 2000,        /* assumed launch cost; + bytes at the rates below */
    [GM_CALL_stream_create] = 5000, /* assumed (cuStreamCreate) */
    [GM_CALL_stream_destroy] = 3000, /* assumed (cuStreamDestroy) */
    [GM_CALL_host_register] = 5000,  /* assumed fixed part; + HOST_REGISTER_PER_MIB_NS */
    [GM_CALL_host_unregister] = 5000, /* assumed fixed part; + HOST_UNREGISTER_PER_MIB_NS */
    [GM_CALL_host_device_pointer] = 500, /* assumed */
    [GM_CALL_stream_wait_event] = 1000,  /* assumed */
    [GM_CALL_mem_alloc] = 50000,    /* assumed (cuMemAllocManaged) */
    [GM_CALL_mem_free] = 50000,     /* assumed (cuMemFree) */
    [GM_CALL_prefetch] = 2000,      /* assumed launch cost; + bytes at the pageable H2D rate */
    [GM_CALL_advise] = 2000,        /* assumed */
};
/* cudaHostRegister of touched memory: 46.7 ms per GiB = 45.6 us per MiB.
 * Unregistering is assumed to cost a tenth of that. */
#define HOST_REGISTER_PER_MIB_NS 45605u
#define HOST_UNREGISTER_PER_MIB_NS 4560u
/* Copies between pageable (unregistered) host memory and the device:
 * 7.9 GB/s H2D and 12.2 GB/s D2H (cudaMemcpy, DESIGN.md), in bytes per 10 ns. */
#define PAGEABLE_H2D_BYTES_PER_10NS 79u
#define PAGEABLE_D2H_BYTES_PER_10NS 122u
/* 64 MiB as one handle costs 47 us for create+map+access (DESIGN.md), so a
 * create grows by (47 - 0.5 - 19.2 - 7.4) us / 31 extra pages ~ 0.63 us. */
#define PHYS_CREATE_PER_EXTRA_PAGE_NS 630u
/* Device-to-device copies: 2.93 TB/s counting read + write, i.e. 2930 bytes
 * moved per ns, and a copy of n bytes moves 2n.  A device memset writes n. */
#define DEVICE_BYTES_PER_NS 2930u
/* Host<->device over PCIe, pinned: 55.0 GB/s.  Host-to-host copies through
 * the "device" API are charged the same (assumed). */
#define HOST_BYTES_PER_NS 55u

/* ------------------------------------------------------------------------ */
/* Constants and state                                                       */
/* ------------------------------------------------------------------------ */

#define SIM_GRANULARITY ((size_t)2 << 20)
#define SIM_GRANULARITY_SHIFT 21
#define SIM_DEFAULT_CAPACITY ((size_t)80 << 30)
#define SIM_NAME "gpumem sim (host memory)"
#define SIM_MAGIC 0x53494d31u /* "SIM1": a live context */

/* Streams made by stream_create are tokens in a non-canonical x86-64 address
 * range (bits 63..48 = 0x5157), so they never collide with a real pointer or
 * with the small integers tests like to use as streams. */
#define SIM_STREAM_TOKEN_BASE ((uintptr_t)0x5157000000000000ull)
#define SIM_STREAM_TOKEN_MASK ((uintptr_t)0xffff000000000000ull)

/* Granule-map value: the mapping's slot, plus whether set_access was done
 * and whether it granted read-only access. */
#define GRANULE_ACCESS 0x80000000u
#define GRANULE_READ_ONLY 0x40000000u
#define GRANULE_MAPPING_MASK 0x3fffffffu

/* A growable array of fixed-size slots with a free list; slot ids are stable.
 * Invariant: live == count - nfree. */
typedef struct slots {
    unsigned char *items;
    size_t elem;      /* bytes per item */
    uint32_t count;   /* slots ever handed out (the high-water mark) */
    uint32_t cap;     /* slots allocated */
    uint32_t *free;   /* ids given back, a stack of nfree */
    uint32_t nfree;
} slots_t;

typedef struct handle {
    int fd;             /* the memfd (or the dup of an imported fd) */
    uint32_t gen;       /* bumped at release, so stale ids are caught */
    int in_use;
    int imported;       /* not counted in `created` */
    size_t size;
    uint32_t map_count; /* live mappings of this handle */
} handle_t;

typedef struct mapping {
    uintptr_t va;
    size_t size;
    uint32_t handle;    /* slot of the handle */
} mapping_t;

typedef struct event {
    uint32_t gen;
    int in_use;
    int recorded;
    int held;           /* the stream was held when the event was recorded */
    uint32_t stream;    /* index into streams (valid when held) */
    uint64_t hold_gen;  /* that stream's hold generation at record time */
} event_t;

/* A stream the caller held at least once, or made with stream_create.
 * hold_gen counts releases: an event recorded under hold generation g
 * completes when hold_gen != g.  An entry is never removed (events refer to
 * it by index); a destroyed stream's entry is reused by a later
 * stream_create, and its hold_gen keeps counting up so that old events stay
 * complete. */
typedef struct stream {
    gm_stream_t id;
    int held;
    int created;        /* made by stream_create and not destroyed */
    int dead;           /* destroyed: free for reuse, matches no id */
    uint64_t hold_gen;
} stream_t;

/* A reservation of address space. */
typedef struct region {
    uintptr_t start;
    size_t size;
    size_t mapped;      /* bytes mapped inside */
} region_t;

/* A host range made "pinned" by host_register: copies from/to it are charged
 * at the pinned rate, others at the pageable rates. */
typedef struct hostreg {
    uintptr_t start;
    size_t size;
    unsigned flags;
} hostreg_t;

/* Granule index (va >> 21) -> granule-map value, in the library's address
 * table (base/hash.h; key 0 is never used: address 0 is never mapped).  A
 * value v is stored as the pointer-sized integer v + 1, never NULL. */
typedef void *gslot_t;
typedef gm__hash_t gmap_t;

/* A copy or fill queued on a held stream, on device or registered host
 * memory: [lo, hi) is in flight until that stream's hold_gen moves on. */
typedef struct flight {
    uintptr_t lo, hi;
    uint32_t stream;    /* index into streams */
    uint64_t hold_gen;
    int write;
} flight_t;

/* stream_wait_event(waiter, ev) with ev pending on streams[on] at hold_gen:
 * the waiter's later work is ordered after that stream's work so far. */
typedef struct waited {
    gm_stream_t waiter;
    uint32_t on;
    uint64_t hold_gen;
} waited_t;

#define SIM_FLIGHTS 64 /* ranges remembered; the oldest is forgotten first */
#define SIM_WAITS 16

/* One simulated device.  Accounting, checked after every mutation in debug
 * builds:
 *   created == sum(size of live non-imported handles)
 *   created <= capacity
 *   granules.count * granularity == mapped_total == sum(region.mapped)
 *                                == sum(size of live mappings)
 *   mappings.live == sum(handle.map_count)
 */
typedef struct sim {
    uint32_t magic;
    pthread_mutex_t lock;
    size_t capacity;
    size_t granularity;
    size_t host_page;

    size_t created;
    size_t mapped_total;
    uint64_t modeled_ns;
    unsigned long fail_countdown[GM_CALL_COUNT]; /* 0 = disarmed */

    slots_t handles;  /* handle_t */
    slots_t mappings; /* mapping_t */
    slots_t events;   /* event_t */
    gmap_t granules;

    region_t *regions; /* sorted by start, non-overlapping */
    size_t nregions, regions_cap;

    stream_t *streams;
    size_t nstreams, streams_cap;
    uint64_t streams_made; /* tokens handed out by stream_create */

    hostreg_t *hostregs;   /* registered host ranges, sorted, non-overlapping */
    size_t nhostregs, hostregs_cap;

    hostreg_t *managed;    /* managed allocations (host memory here), in no order */
    size_t nmanaged, managed_cap;

    int device;                    /* ordinal on the sim's machine */
    int ndevices;                  /* devices of that machine */
    uint32_t peers;                /* devices granted access besides this one (bit d) */
    unsigned phys_flags;           /* GM__PHYS_* asked at open */
    int compression;               /* the device can compress */

    flight_t flights[SIM_FLIGHTS]; /* ring; stale entries are skipped */
    unsigned nflights;             /* entries written so far */
    waited_t waits[SIM_WAITS];     /* ring */
    unsigned nwaits;
} sim_t;

/* ------------------------------------------------------------------------ */
/* Small helpers                                                             */
/* ------------------------------------------------------------------------ */

static const char *errstr(int e, char *buf, size_t cap)
{
    /* GNU strerror_r (we build with _GNU_SOURCE): returns the string. */
    return strerror_r(e, buf, cap);
}

/* Read a small integer from a /proc file without allocating; -1 if unknown. */
static long read_proc_long(const char *path)
{
    char buf[32];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = '\0';
    return strtol(buf, NULL, 10);
}

static int grow_array(void **items, size_t *cap, size_t elem, size_t need)
{
    if (need <= *cap) return GM_OK;
    size_t ncap = *cap ? *cap : 16;
    while (ncap < need) ncap *= 2;
    void *p = gm__realloc(*items, ncap * elem);
    if (p == NULL)
        return gm__set_error(GM_NO_HOST_MEMORY, "sim: out of host memory for bookkeeping");
    *items = p;
    *cap = ncap;
    return GM_OK;
}

/* ---- slots -------------------------------------------------------------- */

static void slots_init(slots_t *s, size_t elem)
{
    memset(s, 0, sizeof *s);
    s->elem = elem;
}

static void slots_fini(slots_t *s)
{
    gm__free(s->items);
    gm__free(s->free);
    memset(s, 0, sizeof *s);
}

static void *slot_at(const slots_t *s, uint32_t i)
{
    return s->items + (size_t)i * s->elem;
}

/* Make sure slot_take cannot fail; call before any state change. */
static int slots_reserve(slots_t *s)
{
    if (s->nfree > 0 || s->count < s->cap) return GM_OK;
    if (s->cap >= GRANULE_MAPPING_MASK)
        return gm__set_error(GM_NO_HOST_MEMORY, "sim: too many live objects");
    uint32_t ncap = s->cap ? s->cap * 2 : 64;
    unsigned char *items = gm__realloc(s->items, (size_t)ncap * s->elem);
    if (items == NULL)
        return gm__set_error(GM_NO_HOST_MEMORY, "sim: out of host memory for bookkeeping");
    s->items = items;
    uint32_t *fr = gm__realloc(s->free, (size_t)ncap * sizeof *fr);
    if (fr == NULL)
        return gm__set_error(GM_NO_HOST_MEMORY, "sim: out of host memory for bookkeeping");
    s->free = fr;
    s->cap = ncap;
    return GM_OK;
}

/* Precondition: slots_reserve succeeded since the last take. The slot keeps
 * whatever a previous user left (so generations survive). */
static uint32_t slot_take(slots_t *s)
{
    if (s->nfree > 0) return s->free[--s->nfree];
    uint32_t i = s->count++;
    memset(slot_at(s, i), 0, s->elem);
    return i;
}

static void slot_put(slots_t *s, uint32_t i)
{
    s->free[s->nfree++] = i;
}

static uint32_t slots_live(const slots_t *s)
{
    return s->count - s->nfree;
}

/* Public ids: generation in the high half, slot + 1 in the low half, so 0 is
 * never a valid id and a released id stays invalid after the slot is reused. */
static uint64_t make_id(uint32_t gen, uint32_t slot)
{
    return ((uint64_t)gen << 32) | ((uint64_t)slot + 1);
}

/* ---- granule map ---------------------------------------------------------- */

static inline uint32_t gslot_val(const gslot_t *slot) { return (uint32_t)((uintptr_t)*slot - 1); }
static inline void gslot_set(gslot_t *slot, uint32_t val) { *slot = (void *)((uintptr_t)val + 1); }

static gslot_t *gmap_find(const gmap_t *m, uint64_t key)
{
    return m->cap ? gm__hash_slot(m, (uintptr_t)key) : NULL;
}

/* Precondition: room reserved, key absent. */
static void gmap_insert(gmap_t *m, uint64_t key, uint32_t val)
{
    int rc = gm__hash_put(m, (uintptr_t)key, (void *)((uintptr_t)val + 1));
    gm_assert_internal(rc == GM_OK);
    (void)rc;
}

/* Make room for `extra` more keys; the only gmap call that can fail. */
static int gmap_reserve(gmap_t *m, size_t extra)
{
    if (gm__hash_reserve_n(m, extra) != GM_OK)
        return gm__set_error(GM_NO_HOST_MEMORY, "sim: out of host memory for bookkeeping");
    return GM_OK;
}

/* ---- the machine: which device may touch which granule ----------------------- */

/* Several devices of one process share an address space, as CUDA's unified
 * addressing makes them, so a copy queued on device 1 may name device 0's
 * memory.  On a GPU that faults unless device 1 was granted access to the
 * mapping (cuMemSetAccess with its descriptor); here every granule that a
 * set_access made accessible is entered in one process-wide table, granule
 * -> (owner + 1) << 32 | mask of devices granted (| ACCESS_RO), and a copy
 * or fill of a context that touches a granule outside its own reservations
 * is checked against it.  A granule in no table is host memory.  Lock
 * order: a context's lock, then g_access_mu (never the other way). */
#define ACCESS_RO ((uint64_t)1 << 63)
#define SIM_MAX_DEVICES 32
#define SIM_DEFAULT_DEVICES 32

static pthread_mutex_t g_access_mu = PTHREAD_MUTEX_INITIALIZER;
static gm__hash_t g_access; /* capacity 0 until the first set_access */

/* Enter [first, first + n) granules as owned by sim's device, accessible to
 * it and its peers.  Precondition: sim->lock held. */
static int access_grant_locked(const sim_t *sim, uint64_t first, size_t n, bool ro)
{
    uint64_t v = ((uint64_t)(sim->device + 1) << 32) | sim->peers |
                 ((uint64_t)1 << sim->device) | (ro ? ACCESS_RO : 0);
    pthread_mutex_lock(&g_access_mu);
    int rc = gm__hash_reserve_n(&g_access, n);
    if (rc == GM_OK) {
        for (size_t g = 0; g < n; g++) {
            void **slot = gm__hash_slot(&g_access, (uintptr_t)(first + g));
            if (slot) *slot = (void *)(uintptr_t)v;
            else (void)gm__hash_put(&g_access, (uintptr_t)(first + g), (void *)(uintptr_t)v);
        }
    }
    pthread_mutex_unlock(&g_access_mu);
    if (rc != GM_OK)
        return gm__set_error(GM_NO_HOST_MEMORY, "sim: out of host memory for bookkeeping");
    return GM_OK;
}

/* Forget [first, first + n) granules (unmapped).  Precondition: sim->lock held. */
static void access_revoke_locked(uint64_t first, size_t n)
{
    pthread_mutex_lock(&g_access_mu);
    if (g_access.cap)
        for (size_t g = 0; g < n; g++) (void)gm__hash_take(&g_access, (uintptr_t)(first + g));
    pthread_mutex_unlock(&g_access_mu);
}

/* The table's value of granule g, 0 when it is in none. */
static uint64_t access_of(uint64_t g)
{
    pthread_mutex_lock(&g_access_mu);
    uint64_t v = g_access.cap ? (uint64_t)(uintptr_t)gm__hash_get(&g_access, (uintptr_t)g) : 0;
    pthread_mutex_unlock(&g_access_mu);
    return v;
}

/* May device d of `group`-sized peer groups reach device e's memory? */
static bool sim_can_reach(int d, int e, int group)
{
    return group <= 0 || d / group == e / group;
}

/* ---- regions ---------------------------------------------------------------- */

/* Index of the first region with start > addr. */
static size_t region_upper(const sim_t *sim, uintptr_t addr)
{
    size_t lo = 0, hi = sim->nregions;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (sim->regions[mid].start <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The region holding addr, or NULL. */
static region_t *region_containing(const sim_t *sim, uintptr_t addr)
{
    size_t i = region_upper(sim, addr);
    if (i == 0) return NULL;
    region_t *r = &sim->regions[i - 1];
    return addr - r->start < r->size ? r : NULL;
}

/* The first region overlapping [addr, addr + n), or NULL. */
static region_t *region_overlapping(const sim_t *sim, uintptr_t addr, size_t n)
{
    region_t *r = region_containing(sim, addr);
    if (r != NULL) return r;
    size_t i = region_upper(sim, addr);
    if (i < sim->nregions && sim->regions[i].start - addr < n) return &sim->regions[i];
    return NULL;
}

/* Precondition: regions_cap > nregions (grow_array done). */
static void region_insert(sim_t *sim, region_t r)
{
    size_t i = region_upper(sim, r.start);
    memmove(&sim->regions[i + 1], &sim->regions[i], (sim->nregions - i) * sizeof r);
    sim->regions[i] = r;
    sim->nregions++;
}

static void region_remove(sim_t *sim, region_t *r)
{
    size_t i = (size_t)(r - sim->regions);
    memmove(&sim->regions[i], &sim->regions[i + 1], (sim->nregions - i - 1) * sizeof *r);
    sim->nregions--;
}

/* ---- streams ---------------------------------------------------------------- */

static stream_t *stream_find(const sim_t *sim, gm_stream_t id)
{
    for (size_t i = 0; i < sim->nstreams; i++)
        if (!sim->streams[i].dead && sim->streams[i].id == id) return &sim->streams[i];
    return NULL;
}

/* A new entry for id: a dead one reused, or a new one.  NULL if out of
 * memory (the message is set). */
static stream_t *stream_add_locked(sim_t *sim, gm_stream_t id)
{
    stream_t *s = NULL;
    for (size_t i = 0; i < sim->nstreams && s == NULL; i++)
        if (sim->streams[i].dead) s = &sim->streams[i];
    if (s == NULL) {
        if (grow_array((void **)&sim->streams, &sim->streams_cap, sizeof(stream_t),
                       sim->nstreams + 1) != GM_OK)
            return NULL;
        s = &sim->streams[sim->nstreams++];
        s->hold_gen = 0;
    }
    s->id = id;
    s->held = 0;
    s->created = 0;
    s->dead = 0;
    return s;
}

/* Any value names a stream, except a token of a destroyed stream_create
 * stream: using that is the caller's bug, reported like the driver would. */
static int check_stream_locked(const sim_t *sim, const char *call, gm_stream_t stream)
{
    if (((uintptr_t)stream & SIM_STREAM_TOKEN_MASK) != SIM_STREAM_TOKEN_BASE) return GM_OK;
    const stream_t *s = stream_find(sim, stream);
    if (s != NULL && s->created) return GM_OK;
    return gm__set_error(GM_INVALID_ARGUMENT,
                         "sim: %s: stream %p was destroyed (or never created)", call, stream);
}

/* ------------------------------------------------------------------------ */
/* Common entry checks                                                       */
/* ------------------------------------------------------------------------ */

static void charge_locked(sim_t *sim, uint64_t ns)
{
    sim->modeled_ns += ns;
}

/* The armed failure of `kind`, if this call is the one: no state changes. */
static int injected_locked(sim_t *sim, int kind)
{
    if (sim->fail_countdown[kind] == 0) return 0;
    if (--sim->fail_countdown[kind] != 0) return 0;
    gm__set_error(GM_BACKEND, "sim: injected failure of %s", gm_call_name(kind));
    gm__backend_note_injected();
    return 1;
}

static void check_accounting_locked(const sim_t *sim)
{
    gm_assert(sim->created <= sim->capacity);
    gm_assert_internal(sim->granules.count * sim->granularity == sim->mapped_total);
    (void)sim;
}

/* Enter a member: validate ctx, lock, apply fault injection.  On GM_OK the
 * lock is held and *out is set (members still initialise their pointer:
 * newer compilers cannot see that it is set whenever it is used). */
static int enter(void *ctx, int kind, sim_t **out)
{
    sim_t *sim = ctx;
    if (sim == NULL || sim->magic != SIM_MAGIC)
        return gm__set_error(GM_INVALID_ARGUMENT, "sim: %s: invalid context %p",
                             gm_call_name(kind), ctx);
    pthread_mutex_lock(&sim->lock);
    if (injected_locked(sim, kind)) {
        pthread_mutex_unlock(&sim->lock);
        return GM_BACKEND;
    }
    *out = sim;
    return GM_OK;
}

/* Leave a member: check accounting, unlock, pass rc through. */
static int leave(sim_t *sim, int rc)
{
    check_accounting_locked(sim);
    pthread_mutex_unlock(&sim->lock);
    return rc;
}

static handle_t *handle_lookup_locked(sim_t *sim, gm__phys_t h, uint32_t *slot)
{
    uint64_t low = h & 0xffffffffu;
    if (low == 0 || low > sim->handles.count) return NULL;
    handle_t *hd = slot_at(&sim->handles, (uint32_t)(low - 1));
    if (!hd->in_use || hd->gen != (uint32_t)(h >> 32)) return NULL;
    if (slot) *slot = (uint32_t)(low - 1);
    return hd;
}

static event_t *event_lookup_locked(sim_t *sim, gm__event_t ev)
{
    uint64_t low = ev & 0xffffffffu;
    if (low == 0 || low > sim->events.count) return NULL;
    event_t *e = slot_at(&sim->events, (uint32_t)(low - 1));
    if (!e->in_use || e->gen != (uint32_t)(ev >> 32)) return NULL;
    return e;
}

/* Is the event's recorded work still "in flight"? */
static int event_pending_locked(const sim_t *sim, const event_t *e)
{
    if (!e->recorded || !e->held) return 0;
    return sim->streams[e->stream].hold_gen == e->hold_gen;
}

/* Replace [va, va + size) by fresh PROT_NONE reservation pages. */
static int rereserve(uintptr_t va, size_t size)
{
    void *p = mmap((void *)va, size, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    return p == MAP_FAILED ? -1 : 0;
}

/* gm__set_error for a failed mmap, explaining ENOMEM's usual cause here. */
static int mmap_error(const char *call, uintptr_t va, size_t size, int e)
{
    char eb[128];
    if (e == ENOMEM) {
        long max = read_proc_long("/proc/sys/vm/max_map_count");
        return gm__set_error(GM_OUT_OF_MEMORY,
                             "sim: %s: mmap of %zu bytes at %#" PRIxPTR " failed: %s; each "
                             "mapping is a kernel VMA and vm.max_map_count is %ld; raise it "
                             "(sysctl vm.max_map_count=...) for more pages",
                             call, size, va, errstr(e, eb, sizeof eb), max);
    }
    return gm__set_error(GM_BACKEND, "sim: %s: mmap of %zu bytes at %#" PRIxPTR " failed: %s",
                         call, size, va, errstr(e, eb, sizeof eb));
}

/* ------------------------------------------------------------------------ */
/* Contract: probe, open, close, info                                        */
/* ------------------------------------------------------------------------ */

/* Usable wherever memfd_create works (Linux >= 3.17, no seccomp ban). */
static int sim_probe(int device, char *why, size_t cap)
{
    char eb[128];
    if (device < 0) {
        if (why && cap) snprintf(why, cap, "device %d is negative", device);
        return GM_NO_DEVICE;
    }
    int fd = memfd_create("gpumem-sim-probe", MFD_CLOEXEC);
    if (fd < 0) {
        if (why && cap) snprintf(why, cap, "memfd_create failed: %s", errstr(errno, eb, sizeof eb));
        return GM_NO_DEVICE;
    }
    close(fd);
    if (why && cap) snprintf(why, cap, "host memory simulator");
    return GM_OK;
}

/* gm__backend_resolve_peers's question: may device d reach arg's device
 * (arg: {device, peer group size})? */
static int sim_reach(void *arg, int d, int *ok)
{
    const int *self_group = arg;
    *ok = sim_can_reach(d, self_group[0], self_group[1]);
    return GM_OK;
}

/* The device's place on the sim's machine: its ordinal among cfg's devices,
 * the peers it grants access to (each must reach it: GPUMEM_SIM_PEER_GROUP),
 * and whether the pages it is asked for can be made. */
static int open_machine(sim_t *sim, const gm__backend_config_t *cfg)
{
    int n = cfg && cfg->sim_devices ? cfg->sim_devices : SIM_DEFAULT_DEVICES;
    int group = cfg ? cfg->sim_peer_group : 0;
    sim->device = cfg ? cfg->device : 0;
    if (n < 1 || n > SIM_MAX_DEVICES)
        return gm__set_error(GM_INVALID_ARGUMENT, "sim: open: %d devices (GPUMEM_SIM_DEVICES): "
                             "1 to %d", n, SIM_MAX_DEVICES);
    if (sim->device >= n)
        return gm__set_error(GM_NO_DEVICE, "sim: device %d does not exist (%d device%s; "
                             "GPUMEM_SIM_DEVICES sets how many)", sim->device, n,
                             n == 1 ? "" : "s");
    sim->ndevices = n;
    char why[96];
    snprintf(why, sizeof why, "peer groups of %d devices: GPUMEM_SIM_PEER_GROUP", group);
    uint64_t peers;
    int self_group[2] = {sim->device, group};
    GM_CHECK(gm__backend_resolve_peers("sim", sim->device, n, cfg ? cfg->peers : 0, sim_reach,
                                       self_group, why, &peers));
    sim->peers = (uint32_t)peers;
    sim->compression = !(cfg && cfg->sim_no_compression);
    sim->phys_flags = cfg ? cfg->phys_flags : 0;
    if ((sim->phys_flags & GM__PHYS_COMPRESSIBLE) && !sim->compression)
        return gm__set_error(GM_NOT_SUPPORTED, "sim: device %d cannot compress memory "
                             "(GPUMEM_SIM_COMPRESSION=0)", sim->device);
    if (sim->phys_flags & ~(GM__PHYS_NCCL | GM__PHYS_COMPRESSIBLE))
        return gm__set_error(GM_INVALID_ARGUMENT, "sim: open: unknown page flags %#x",
                             sim->phys_flags);
    return GM_OK;
}

/* Precondition: cfg may be NULL (defaults: device 0 of 32).  Each open makes
 * a device context of its own (its own capacity and books); contexts of
 * different devices see each other's memory only where set_access granted
 * their device access. */
static int sim_open(const gm__backend_config_t *cfg, void **ctx)
{
    if (ctx == NULL) return gm__set_error(GM_INVALID_ARGUMENT, "sim: open: NULL ctx");
    *ctx = NULL;
    if (cfg != NULL && cfg->device < 0)
        return gm__set_error(GM_INVALID_ARGUMENT, "sim: open: device %d is negative",
                             cfg->device);
    sim_t *sim = gm__calloc(1, sizeof *sim);
    if (sim == NULL) return gm__set_error(GM_NO_HOST_MEMORY, "sim: open: out of host memory");
    if (pthread_mutex_init(&sim->lock, NULL) != 0) {
        gm__free(sim);
        return gm__set_error(GM_BACKEND, "sim: open: pthread_mutex_init failed");
    }
    int rc = open_machine(sim, cfg);
    if (rc != GM_OK) {
        pthread_mutex_destroy(&sim->lock);
        gm__free(sim);
        return rc;
    }
    sim->capacity = cfg != NULL && cfg->sim_capacity ? cfg->sim_capacity : SIM_DEFAULT_CAPACITY;
    sim->granularity = SIM_GRANULARITY;
    long pg = sysconf(_SC_PAGESIZE);
    sim->host_page = pg > 0 ? (size_t)pg : 4096;
    slots_init(&sim->handles, sizeof(handle_t));
    slots_init(&sim->mappings, sizeof(mapping_t));
    slots_init(&sim->events, sizeof(event_t));

    /* One fd per physical handle: let the process use all it may.  (Raising
     * the soft limit is what most servers do; select() users are unaffected
     * unless they really open more than FD_SETSIZE files.) */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
    gm__backend_take_open_faults(sim->fail_countdown);
    sim->magic = SIM_MAGIC;
    *ctx = sim;
    return GM_OK;
}

/* Precondition: everything created through ctx was released.  If not, it is
 * released here anyway (no fd or address space leaks), and debug builds say
 * so on stderr because it means the caller lost track of something. */
static void sim_close(void *ctx)
{
    sim_t *sim = ctx;
    if (sim == NULL || sim->magic != SIM_MAGIC) return;
    pthread_mutex_lock(&sim->lock);
    uint32_t live_handles = slots_live(&sim->handles);
    uint32_t live_mappings = slots_live(&sim->mappings);
    size_t nres = sim->nregions;
    for (size_t i = 0; i < sim->nregions; i++) {
        region_t *r = &sim->regions[i];
        access_revoke_locked(r->start >> SIM_GRANULARITY_SHIFT, r->size / sim->granularity);
        munmap((void *)r->start, r->size); /* also drops mappings inside */
    }
    for (uint32_t i = 0; i < sim->handles.count; i++) {
        handle_t *h = slot_at(&sim->handles, i);
        if (h->in_use) close(h->fd);
    }
#if GM_DEBUG >= 1
    if (live_handles || live_mappings || nres)
        fprintf(stderr,
                "gpumem sim: closed with %u handle(s), %u mapping(s), %zu reservation(s) "
                "still live; released them\n",
                live_handles, live_mappings, nres);
#else
    (void)live_handles, (void)live_mappings, (void)nres;
#endif
    for (size_t i = 0; i < sim->nmanaged; i++)
        munmap((void *)sim->managed[i].start, sim->managed[i].size);
    gm__free(sim->managed);
    slots_fini(&sim->handles);
    slots_fini(&sim->mappings);
    slots_fini(&sim->events);
    gm__hash_fini(&sim->granules);
    gm__free(sim->regions);
    gm__free(sim->streams);
#if GM_DEBUG >= 1
    if (sim->nhostregs)
        fprintf(stderr, "gpumem sim: closed with %zu host range(s) still registered\n",
                sim->nhostregs);
#endif
    gm__free(sim->hostregs);
    sim->magic = 0;
    pthread_mutex_unlock(&sim->lock);
    pthread_mutex_destroy(&sim->lock);
    gm__free(sim);
}

/* Precondition: out != NULL.  Not a call kind: never injected, costs nothing. */
static int sim_info(void *ctx, gm__backend_info_t *out)
{
    sim_t *sim = ctx;
    if (sim == NULL || sim->magic != SIM_MAGIC)
        return gm__set_error(GM_INVALID_ARGUMENT, "sim: info: invalid context %p", ctx);
    if (out == NULL) return gm__set_error(GM_INVALID_ARGUMENT, "sim: info: NULL out");
    pthread_mutex_lock(&sim->lock);
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", SIM_NAME);
    out->driver_version = 0;
    out->total_memory = sim->capacity;
    out->free_memory = sim->capacity - sim->created;
    out->granularity = sim->granularity;
    out->granularity_recommended = sim->granularity;
    out->vmm_supported = 1;
    out->numa_node = -1;
    out->device_count = sim->ndevices;
    out->peers = sim->peers;
    out->phys_flags = sim->phys_flags;
    out->handle_types = GM_HANDLE_POSIX_FD; /* a memfd: no fabric */
    out->compression_supported = sim->compression;
    out->rdma_capable = (sim->phys_flags & GM__PHYS_NCCL) != 0; /* modeled as a device that can */
    pthread_mutex_unlock(&sim->lock);
    return GM_OK;
}

/* ------------------------------------------------------------------------ */
/* Contract: virtual address space                                           */
/* ------------------------------------------------------------------------ */

/* Preconditions: size > 0 and a multiple of granularity; align 0 (meaning
 * granularity) or a power of two that is a multiple of granularity. */
static int sim_va_reserve(void *ctx, size_t size, size_t align, uintptr_t *va)
{
    sim_t *sim = NULL;
    GM_CHECK(enter(ctx, GM_CALL_va_reserve, &sim));
    int rc = GM_OK;
    if (va == NULL) {
        rc = gm__set_error(GM_INVALID_ARGUMENT, "sim: va_reserve: NULL va");
        goto out;
    }
    if (align == 0) align = sim->granularity;
    if (size == 0 || size % sim->granularity != 0) {
        rc = gm__set_error(GM_INVALID_ARGUMENT,
                           "sim: va_reserve: size %zu is not a positive multiple of the "
                           "granularity (%zu)", size, sim->granularity);
        goto out;
    }
    if ((align & (align - 1)) != 0 || align % sim->granularity != 0) {
        rc = gm__set_error(GM_INVALID_ARGUMENT,
                           "sim: va_reserve: alignment %zu is not a power of two multiple of "
                           "the granularity (%zu)", align, sim->granularity);
        goto out;
    }
    size_t over = size + align;
    if (over < size) {
        rc = gm__set_error(GM_OUT_OF_MEMORY, "sim: va_reserve: %zu bytes is too large", size);
        goto out;
    }
    GM_CHECK_GOTO(grow_array((void **)&sim->regions, &sim->regions_cap, sizeof(region_t),
                             sim->nregions + 1), rc, out);

    /* Over-reserve, then trim to the aligned range. */
    void *p = mmap(NULL, over, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        char eb[128];
        rc = gm__set_error(GM_OUT_OF_MEMORY,
                           "sim: va_reserve: cannot reserve %zu bytes of address space: %s",
                           size, errstr(errno, eb, sizeof eb));
        goto out;
    }
    uintptr_t base = (uintptr_t)p;
    uintptr_t start = GM_ALIGN_UP(base, align);
    size_t head = start - base, tail = over - head - size;
    if (head) munmap(p, head);
    if (tail) munmap((void *)(start + size), tail);

    region_insert(sim, (region_t){.start = start, .size = size, .mapped = 0});
    charge_locked(sim, call_cost_ns[GM_CALL_va_reserve]);
    *va = start;
out:
    return leave(sim, rc);
}

/* Preconditions: [va, va + size) is exactly one reservation and nothing is
 * mapped inside it. */
static int sim_va_free(void *ctx, uintptr_t va, size_t size)
{
    sim_t *sim = NULL;
    GM_CHECK(enter(ctx, GM_CALL_va_free, &sim));
    int rc = GM_OK;
    region_t *r = region_containing(sim, va);
    if (r == NULL || r->start != va) {
        rc = gm__set_error(GM_INVALID_ARGUMENT,
                           "sim: va_free: %#" PRIxPTR " is not the start of a reservation", va);
    } else if (r->size != size) {
        rc = gm__set_error(GM_INVALID_ARGUMENT,
                           "sim: va_free: size %zu does not match the reservation at %#" PRIxPTR
                           " (%zu bytes); free it whole", size, va, r->size);
    } else if (r->mapped != 0) {
        rc = gm__set_error(GM_INVALID_ARGUMENT,
                           "sim: va_free: %zu bytes are still mapped inside the reservation at "
                           "%#" PRIxPTR "; unmap them first", r->mapped, va);
    } else if (munmap((void *)va, size) != 0) {
        char eb[128];
        rc = gm__set_error(GM_BACKEND, "sim: va_free: munmap failed: %s",
                           errstr(errno, eb, sizeof eb));
    } else {
        region_remove(sim, r);
        charge_locked(sim, call_cost_ns[GM_CALL_va_free]);
    }
    return leave(sim, rc);
}

/* ------------------------------------------------------------------------ */
/* Contract: physical memory                                                 */
/* ------------------------------------------------------------------------ */

/* Preconditions: size > 0 and a multiple of granularity; h != NULL.  Fails
 * with GM_OUT_OF_MEMORY when the capacity would be exceeded, or when the
 * process runs out of file descriptors (one memfd per handle). */
static int sim_phys_create(void *ctx, size_t size, gm__phys_t *h)
{
    sim_t *sim = NULL;
    GM_CHECK(enter(ctx, GM_CALL_phys_create, &sim));
    int rc = GM_OK;
    char eb[128];
    if (h == NULL) {
        rc = gm__set_error(GM_INVALID_ARGUMENT, "sim: phys_create: NULL handle out-parameter");
        goto out;
    }
    if (size == 0 || size % sim->granularity != 0) {
        rc = gm__set_error(GM_INVALID_ARGUMENT,
                           "sim: phys_create: size %zu is not a positive multiple of the "
                           "granularity (%zu)", size, sim->granularity);
        goto out;
    }
    if (size > sim->capacity - sim->created) {
        rc = gm__set_error(GM_OUT_OF_MEMORY,
                           "sim: phys_create: out of device memory: requested %zu bytes, "
                           "capacity %zu, used %zu, free %zu",
                           size, sim->capacity, sim->created, sim->capacity - sim->created);
        goto out;
    }
    GM_CHECK_GOTO(slots_reserve(&sim->handles), rc, out);

    /* Sealable: once sized, it is sealed against shrinking and growing (see
     * SIM_PAGE_SEALS), the mark import_fd looks for. */
    int fd = memfd_create("gpumem-sim-page", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        int e = errno;
        if (e == EMFILE || e == ENFILE) {
            struct rlimit rl = {0, 0};
            getrlimit(RLIMIT_NOFILE, &rl);
            rc = gm__set_error(GM_OUT_OF_MEMORY,
                               "sim: phys_create: out of file descriptors (%s; %u handles live, "
                               "RLIMIT_NOFILE %llu): each physical handle is one memfd; raise "
                               "the limit with `ulimit -n`, or use larger pages",
                               errstr(e, eb, sizeof eb), slots_live(&sim->handles),
                               (unsigned long long)rl.rlim_cur);
        } else {
            rc = gm__set_error(e == ENOMEM ? GM_OUT_OF_MEMORY : GM_BACKEND,
                               "sim: phys_create: memfd_create failed: %s",
                               errstr(e, eb, sizeof eb));
        }
        goto out;
    }
    if (ftruncate(fd, (off_t)size) != 0) {
        int e = errno;
        close(fd);
        rc = gm__set_error(GM_OUT_OF_MEMORY, "sim: phys_create: ftruncate to %zu bytes failed: %s",
                           size, errstr(e, eb, sizeof eb));
        goto out;
    }
    if (fcntl(fd, F_ADD_SEALS, SIM_PAGE_SEALS) != 0) {
        int e = errno;
        close(fd);
        rc = gm__set_error(GM_BACKEND, "sim: phys_create: sealing the page's memfd failed: %s",
                           errstr(e, eb, sizeof eb));
        goto out;
    }

    uint32_t slot = slot_take(&sim->handles);
    handle_t *hd = slot_at(&sim->handles, slot);
    uint32_t gen = hd->gen + 1; /* survives slot reuse: stale ids stay invalid */
    if (gen == 0) gen = 1;
    *hd = (handle_t){.fd = fd, .gen = gen, .in_use = 1, .imported = 0, .size = size};
    sim->created += size;
    charge_locked(sim, call_cost_ns[GM_CALL_phys_create] +
                           (size / sim->granularity - 1) * PHYS_CREATE_PER_EXTRA_PAGE_NS);
    *h = make_id(gen, slot);
out:
    return leave(sim, rc);
}

/* Precondition: h is live and mapped nowhere. */
static int sim_phys_release(void *ctx, gm__phys_t h)
{
    sim_t *sim = NULL;
    GM_CHECK(enter(ctx, GM_CALL_phys_release, &sim));
    int rc = GM_OK;
    uint32_t slot;
    handle_t *hd = handle_lookup_locked(sim, h, &slot);
    if (hd == NULL) {
        rc = gm__set_error(GM_INVALID_ARGUMENT,
                           "sim: phys_release: invalid handle %#" PRIx64
                           " (never created or already released)", h);
    } else if (hd->map_count != 0) {
        rc = gm__set_error(GM_INVALID_ARGUMENT,
                           "sim: phys_release: handle %#" PRIx64 " is still mapped %u time(s); "
                           "unmap it first", h, hd->map_count);
    } else {
        close(hd->fd);
        hd->fd = -1;
        hd->in_use = 0;
        if (!hd->imported) sim->created -= hd->size;
        slot_put(&sim->handles, slot);
        charge_locked(sim, call_cost_ns[GM_CALL_phys_release]);
    }
    return leave(sim, rc);
}

/* ------------------------------------------------------------------------ */
/* Contract: mapping                                                         */
/* ------------------------------------------------------------------------ */

/* Preconditions: h is live; size equals h's size; va is granularity-aligned;
 * [va, va + size) lies inside one reservation and no part of it is mapped.
 * The mapping is PROT_NONE until set_access. */
static int sim_map(void *ctx, uintptr_t va, size_t size, gm__phys_t h)
{
    sim_t *sim = NULL;
    GM_CHECK(enter(ctx, GM_CALL_map, &sim));
    int rc = GM_OK;
    uint32_t hslot;
    handle_t *hd = handle_lookup_locked(sim, h, &hslot);
    region_t *r = region_containing(sim, va);
    if (hd == NULL) {
        rc = gm__set_error(GM_INVALID_ARGUMENT,
                           "sim: map: invalid handle %#" PRIx64
                           " (never created or already released)", h);
        goto out;
    }
    if (size != hd->size) {
        rc = gm__set_error(GM_INVALID_ARGUMENT,
                           "sim: map: size %zu differs from the handle's size %zu (a map "
                           "covers the whole handle)", size, hd->size);
        goto out;
    }
    if (va % sim->granularity != 0) {
        rc = gm__set_error(GM_INVALID_ARGUMENT,
                           "sim: map: address %#" PRIxPTR " is not aligned to the granularity "
                           "(%zu)", va, sim->granularity);
        goto out;
    }
    if (r == NULL || size > r->start + r->size - va) {
        rc = gm__set_error(GM_INVALID_ARGUMENT,
                           "sim: map: [%#" PRIxPTR ", +%zu) is not inside one reservation",
                           va, size);
        goto out;
    }
    size_t ngran = size / sim->granularity;
    for (size_t g = 0; g < ngran; g++) {
        uintptr_t a = va + g * sim->granularity;
        if (gmap_find(&sim->granules, a >> SIM_GRANULARITY_SHIFT) != NULL) {
            rc = gm__set_error(GM_INVALID_ARGUMENT,
                               "sim: map: %#" PRIxPTR " is already mapped; unmap it first", a);
            goto out;
        }
    }
    /* Everything that can fail for lack of host memory, before any change. */
    GM_CHECK_GOTO(gmap_reserve(&sim->granules, ngran), rc, out);
    GM_CHECK_GOTO(slots_reserve(&sim->mappings), rc, out);

    void *p = mmap((void *)va, size, PROT_NONE, MAP_SHARED | MAP_FIXED, hd->fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        (void)rereserve(va, size); /* a failed MAP_FIXED may have dropped the range */
        rc = mmap_error("map", va, size, e);
        goto out;
    }
    uint32_t m = slot_take(&sim->mappings);
    *(mapping_t *)slot_at(&sim->mappings, m) = (mapping_t){.va = va, .size = size, .handle = hslot};
    for (size_t g = 0; g < ngran; g++)
        gmap_insert(&sim->granules, (va >> SIM_GRANULARITY_SHIFT) + g, m);
    hd->map_count++;
    r->mapped += size;
    sim->mapped_total += size;
    charge_locked(sim, call_cost_ns[GM_CALL_map]);
out:
    return leave(sim, rc);
}

/* Preconditions: [va, va + size) is exactly the range of one earlier map
 * call; no work that touches it is still queued. */
static int sim_unmap(void *ctx, uintptr_t va, size_t size)
{
    sim_t *sim = NULL;
    GM_CHECK(enter(ctx, GM_CALL_unmap, &sim));
    int rc = GM_OK;
    gslot_t *gs = va % sim->granularity == 0
                      ? gmap_find(&sim->granules, va >> SIM_GRANULARITY_SHIFT) : NULL;
    if (gs == NULL) {
        rc = gm__set_error(GM_INVALID_ARGUMENT,
                           "sim: unmap: nothing is mapped at %#" PRIxPTR, va);
        goto out;
    }
    uint32_t m = gslot_val(gs) & GRANULE_MAPPING_MASK;
    mapping_t *mp = slot_at(&sim->mappings, m);
    if (mp->va != va || mp->size != size) {
        rc = gm__set_error(GM_INVALID_ARGUMENT,
                           "sim: unmap: [%#" PRIxPTR ", +%zu) is not the range of one map call "
                           "(the mapping there is [%#" PRIxPTR ", +%zu)); unmap it whole",
                           va, size, mp->va, mp->size);
        goto out;
    }
    /* The stream rule's other half: a mapping that work still in flight
     * uses must stay (a GPU would fault). */
    unsigned nf = sim->nflights < SIM_FLIGHTS ? sim->nflights : SIM_FLIGHTS;
    for (unsigned i = 0; i < nf; i++) {
        const flight_t *f = &sim->flights[i];
        const stream_t *owner = &sim->streams[f->stream];
        if (owner->hold_gen != f->hold_gen || owner->dead || !owner->held) continue;
        if (va >= f->hi || va + size <= f->lo) continue;
        rc = gm__set_error(GM_BACKEND,
                           "sim: unmap: stream-rule violation: [%#" PRIxPTR ", +%zu) is used by "
                           "work still in flight on held stream %p ([%#" PRIxPTR ", %#" PRIxPTR "))",
                           va, size, owner->id, f->lo, f->hi);
        goto out;
    }
    if (rereserve(va, size) != 0) {
        rc = mmap_error("unmap", va, size, errno);
        goto out;
    }
    size_t ngran = size / sim->granularity;
    access_revoke_locked(va >> SIM_GRANULARITY_SHIFT, ngran);
    for (size_t g = 0; g < ngran; g++) {
        /* One probe: values are stored as slot + 1, so never NULL when present. */
        void *was = gm__hash_take(&sim->granules, (uintptr_t)((va >> SIM_GRANULARITY_SHIFT) + g));
        gm_assert(was != NULL);
        (void)was;
    }
    handle_t *hd = slot_at(&sim->handles, mp->handle);
    hd->map_count--;
    region_t *r = region_containing(sim, va);
    gm_assert(r != NULL);
    if (r) r->mapped -= size;
    sim->mapped_total -= size;
    slot_put(&sim->mappings, m);
    charge_locked(sim, call_cost_ns[GM_CALL_unmap]);
out:
    return leave(sim, rc);
}

/* Preconditions: va and size granularity-aligned, size > 0; every granule of
 * [va, va + size) is mapped (the range may span several mappings). */
static int sim_set_access(void *ctx, uintptr_t va, size_t size, unsigned flags)
{
    sim_t *sim = NULL;
    GM_CHECK(enter(ctx, GM_CALL_set_access, &sim));
    int rc = GM_OK;
    if (size == 0 || va % sim->granularity != 0 || size % sim->granularity != 0 ||
        va + size < va) {
        rc = gm__set_error(GM_INVALID_ARGUMENT,
                           "sim: set_access: [%#" PRIxPTR ", +%zu) is not a non-empty, "
                           "granularity-aligned range", va, size);
        goto out;
    }
    size_t ngran = size / sim->granularity;
    uint64_t first = va >> SIM_GRANULARITY_SHIFT;
    uint64_t handles_in_range = 0;
    uint32_t prev = UINT32_MAX;
    for (size_t g = 0; g < ngran; g++) {
        gslot_t *s = gmap_find(&sim->granules, first + g);
        if (s == NULL) {
            rc = gm__set_error(GM_INVALID_ARGUMENT,
                               "sim: set_access: %#" PRIxPTR " (in [%#" PRIxPTR ", +%zu)) is "
                               "not mapped", va + g * sim->granularity, va, size);
            goto out;
        }
        uint32_t m = gslot_val(s) & GRANULE_MAPPING_MASK;
        if (m != prev) handles_in_range++;
        prev = m;
    }
    bool ro = flags & GM__ACCESS_READ_ONLY;
    if (mprotect((void *)va, size, ro ? PROT_READ : PROT_READ | PROT_WRITE) != 0) {
        char eb[128];
        rc = gm__set_error(GM_BACKEND, "sim: set_access: mprotect failed: %s",
                           errstr(errno, eb, sizeof eb));
        goto out;
    }
    GM_CHECK_GOTO(access_grant_locked(sim, first, ngran, ro), rc, out);
    for (size_t g = 0; g < ngran; g++) {
        gslot_t *s = gmap_find(&sim->granules, first + g);
        gslot_set(s, (gslot_val(s) & ~GRANULE_READ_ONLY) | GRANULE_ACCESS |
                         (ro ? GRANULE_READ_ONLY : 0));
    }
    charge_locked(sim, call_cost_ns[GM_CALL_set_access] * handles_in_range);
out:
    return leave(sim, rc);
}

/* ------------------------------------------------------------------------ */
/* Contract: sharing                                                         */
/* ------------------------------------------------------------------------ */

/* Used by sharing (not yet by the core): see backend.h. */

/* Preconditions: h live, fd != NULL.  *fd is a new descriptor (close-on-exec)
 * for the handle's memfd; the caller owns it. */
static int sim_export_fd(void *ctx, gm__phys_t h, int *fd)
{
    sim_t *sim = NULL;
    GM_CHECK(enter(ctx, GM_CALL_export_fd, &sim));
    int rc = GM_OK;
    handle_t *hd = handle_lookup_locked(sim, h, NULL);
    if (fd == NULL) {
        rc = gm__set_error(GM_INVALID_ARGUMENT, "sim: export_fd: NULL fd out-parameter");
    } else if (hd == NULL) {
        rc = gm__set_error(GM_INVALID_ARGUMENT,
                           "sim: export_fd: invalid handle %#" PRIx64, h);
    } else {
        int d = fcntl(hd->fd, F_DUPFD_CLOEXEC, 0);
        if (d < 0) {
            char eb[128];
            rc = gm__set_error(GM_BACKEND, "sim: export_fd: dup failed: %s%s",
                               errstr(errno, eb, sizeof eb),
                               errno == EMFILE ? " (raise the limit with `ulimit -n`)" : "");
        } else {
            *fd = d;
            charge_locked(sim, call_cost_ns[GM_CALL_export_fd]);
        }
    }
    return leave(sim, rc);
}

/* Preconditions: size a positive multiple of granularity.  fd must be an
 * exported handle: a sim page (a memfd of exactly size bytes sealed with
 * SIM_PAGE_SEALS); anything else is refused with GM_INVALID_ARGUMENT, since
 * a file the sender could shrink after the import would kill this process
 * with SIGBUS at the next access (a real exported handle cannot shrink
 * either).  The caller keeps ownership of fd; the new handle holds its own
 * duplicate.  Imported handles do not count against this context's
 * capacity (see the top). */
static int sim_import_fd(void *ctx, int fd, size_t size, gm__phys_t *h)
{
    sim_t *sim = NULL;
    GM_CHECK(enter(ctx, GM_CALL_import_fd, &sim));
    int rc = GM_OK;
    char eb[128];
    struct stat st;
    if (h == NULL) {
        rc = gm__set_error(GM_INVALID_ARGUMENT, "sim: import_fd: NULL handle out-parameter");
        goto out;
    }
    if (size == 0 || size % sim->granularity != 0) {
        rc = gm__set_error(GM_INVALID_ARGUMENT,
                           "sim: import_fd: size %zu is not a positive multiple of the "
                           "granularity (%zu)", size, sim->granularity);
        goto out;
    }
    if (fd < 0 || fstat(fd, &st) != 0) {
        rc = gm__set_error(GM_INVALID_ARGUMENT, "sim: import_fd: fd %d is not open: %s", fd,
                           fd < 0 ? "negative" : errstr(errno, eb, sizeof eb));
        goto out;
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != (uint64_t)size) {
        rc = gm__set_error(GM_INVALID_ARGUMENT,
                           "sim: import_fd: fd %d is not an exported handle of %zu bytes "
                           "(%s, %lld bytes)", fd, size,
                           S_ISREG(st.st_mode) ? "a file" : "not a file", (long long)st.st_size);
        goto out;
    }
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
        rc = gm__set_error(GM_INVALID_ARGUMENT,
                           "sim: import_fd: fd %d is not a page of the sim: %s; only a sealed "
                           "memfd (made by phys_create) is imported, since its sender could "
                           "shrink anything else under this process", fd,
                           seals < 0 ? "a file that takes no seals (not a memfd)"
                                     : "a file not sealed against shrinking and growing");
        goto out;
    }
    GM_CHECK_GOTO(slots_reserve(&sim->handles), rc, out);
    int d = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (d < 0) {
        int e = errno;
        rc = gm__set_error(e == EMFILE ? GM_OUT_OF_MEMORY : GM_BACKEND,
                           "sim: import_fd: dup failed: %s%s", errstr(e, eb, sizeof eb),
                           e == EMFILE ? " (raise the limit with `ulimit -n`)" : "");
        goto out;
    }
    uint32_t slot = slot_take(&sim->handles);
    handle_t *hd = slot_at(&sim->handles, slot);
    uint32_t gen = hd->gen + 1;
    if (gen == 0) gen = 1;
    *hd = (handle_t){.fd = d, .gen = gen, .in_use = 1, .imported = 1, .size = size};
    charge_locked(sim, call_cost_ns[GM_CALL_import_fd]);
    *h = make_id(gen, slot);
out:
    return leave(sim, rc);
}

/* ------------------------------------------------------------------------ */
/* Contract: events and streams                                              */
/* ------------------------------------------------------------------------ */

/* Precondition: ev != NULL.  A new event counts as complete until recorded. */
static int sim_event_create(void *ctx, gm__event_t *ev)
{
    sim_t *sim = NULL;
    GM_CHECK(enter(ctx, GM_CALL_event_create, &sim));
    int rc = GM_OK;
    if (ev == NULL) {
        rc = gm__set_error(GM_INVALID_ARGUMENT, "sim: event_create: NULL out-parameter");
        goto out;
    }
    GM_CHECK_GOTO(slots_reserve(&sim->events), rc, out);
    uint32_t slot = slot_take(&sim->events);
    event_t *e = slot_at(&sim->events, slot);
    uint32_t gen = e->gen + 1;
    if (gen == 0) gen = 1;
    *e = (event_t){.gen = gen, .in_use = 1};
    charge_locked(sim, call_cost_ns[GM_CALL_event_create]);
    *ev = make_id(gen, slot);
out:
    return leave(sim, rc);
}

/* Precondition: ev live. */
static int sim_event_destroy(void *ctx, gm__event_t ev)
{
    sim_t *sim = NULL;
    GM_CHECK(enter(ctx, GM_CALL_event_destroy, &sim));
    int rc = GM_OK;
    event_t *e = event_lookup_locked(sim, ev);
    if (e == NULL) {
        rc = gm__set_error(GM_INVALID_ARGUMENT, "sim: event_destroy: invalid event %#" PRIx64, ev);
    } else {
        e->in_use = 0;
        slot_put(&sim->events, (uint32_t)((ev & 0xffffffffu) - 1));
        charge_locked(sim, call_cost_ns[GM_CALL_event_destroy]);
    }
    return leave(sim, rc);
}

/* Precondition: ev live; any stream value.  Work is done at once, so the
 * event is complete unless the stream is held now (then it completes when
 * that hold is released). */
static int sim_event_record(void *ctx, gm__event_t ev, gm_stream_t stream)
{
    sim_t *sim = NULL;
    GM_CHECK(enter(ctx, GM_CALL_event_record, &sim));
    int rc = GM_OK;
    event_t *e = event_lookup_locked(sim, ev);
    if (e == NULL) {
        rc = gm__set_error(GM_INVALID_ARGUMENT, "sim: event_record: invalid event %#" PRIx64, ev);
    } else if ((rc = check_stream_locked(sim, "event_record", stream)) != GM_OK) {
        /* reported */
    } else {
        stream_t *s = stream_find(sim, stream);
        e->recorded = 1;
        e->held = s != NULL && s->held;
        e->stream = s != NULL ? (uint32_t)(s - sim->streams) : 0;
        e->hold_gen = s != NULL ? s->hold_gen : 0;
        charge_locked(sim, call_cost_ns[GM_CALL_event_record]);
    }
    return leave(sim, rc);
}

static int event_wait(void *ctx, gm__event_t ev, int kind)
{
    sim_t *sim = NULL;
    GM_CHECK(enter(ctx, kind, &sim));
    int rc = GM_OK;
    const char *call = gm_call_name(kind);
    event_t *e = event_lookup_locked(sim, ev);
    if (e == NULL) {
        rc = gm__set_error(GM_INVALID_ARGUMENT, "sim: %s: invalid event %#" PRIx64, call, ev);
        goto out;
    }
    charge_locked(sim, call_cost_ns[kind]);
    if (event_pending_locked(sim, e))
        rc = gm__set_error(GM_NOT_READY,
                           "sim: %s: event %#" PRIx64 " was recorded on stream %p while it was "
                           "held; it completes when the hold is released (the sim never blocks)",
                           call, ev, sim->streams[e->stream].id);
out:
    return leave(sim, rc);
}

/* Precondition: ev live.  GM_OK when complete, GM_NOT_READY when not. */
static int sim_event_query(void *ctx, gm__event_t ev)
{
    return event_wait(ctx, ev, GM_CALL_event_query);
}

/* Precondition: ev live.  Never blocks: GM_NOT_READY for a held stream. */
static int sim_event_sync(void *ctx, gm__event_t ev)
{
    return event_wait(ctx, ev, GM_CALL_event_sync);
}

/* Any stream value.  Never blocks: GM_NOT_READY while the stream is held. */
static int sim_stream_sync(void *ctx, gm_stream_t stream)
{
    sim_t *sim = NULL;
    GM_CHECK(enter(ctx, GM_CALL_stream_sync, &sim));
    int rc = check_stream_locked(sim, "stream_sync", stream);
    if (rc != GM_OK) return leave(sim, rc);
    stream_t *s = stream_find(sim, stream);
    charge_locked(sim, call_cost_ns[GM_CALL_stream_sync]);
    if (s != NULL && s->held)
        rc = gm__set_error(GM_NOT_READY,
                           "sim: stream_sync: stream %p is held; its work completes when the "
                           "hold is released (the sim never blocks)", stream);
    return leave(sim, rc);
}

/* Precondition: stream != NULL.  *stream is a new token (see
 * SIM_STREAM_TOKEN_BASE); work on it is synchronous like on any stream. */
static int sim_stream_create(void *ctx, gm_stream_t *stream)
{
    sim_t *sim = NULL;
    GM_CHECK(enter(ctx, GM_CALL_stream_create, &sim));
    int rc = GM_OK;
    if (stream == NULL) {
        rc = gm__set_error(GM_INVALID_ARGUMENT, "sim: stream_create: NULL out-parameter");
        return leave(sim, rc);
    }
    gm_stream_t id = (gm_stream_t)(SIM_STREAM_TOKEN_BASE |
                                   (uintptr_t)((sim->streams_made + 1) & 0xffffffffffffull));
    stream_t *s = stream_add_locked(sim, id);
    if (s == NULL) return leave(sim, GM_NO_HOST_MEMORY);
    s->created = 1;
    sim->streams_made++;
    charge_locked(sim, call_cost_ns[GM_CALL_stream_create]);
    *stream = id;
    return leave(sim, rc);
}

/* Precondition: stream came from stream_create and was not destroyed.  As on
 * a GPU, work already queued still completes: a hold on it is released, so
 * its pending events complete. */
static int sim_stream_destroy(void *ctx, gm_stream_t stream)
{
    sim_t *sim = NULL;
    GM_CHECK(enter(ctx, GM_CALL_stream_destroy, &sim));
    stream_t *s = stream_find(sim, stream);
    if (s == NULL || !s->created)
        return leave(sim, gm__set_error(GM_INVALID_ARGUMENT,
                                        "sim: stream_destroy: stream %p was not made by "
                                        "stream_create (or was destroyed already)", stream));
    if (s->held) s->hold_gen++;
    s->held = 0;
    s->created = 0;
    s->dead = 1;
    charge_locked(sim, call_cost_ns[GM_CALL_stream_destroy]);
    return leave(sim, GM_OK);
}

/* Not a call kind.  hold != 0: events recorded on `stream` from now on stay
 * incomplete until a call with hold == 0.  Holding a held stream, or
 * releasing one that is not held, changes nothing. */
static int sim_hold_stream(void *ctx, gm_stream_t stream, int hold)
{
    sim_t *sim = ctx;
    if (sim == NULL || sim->magic != SIM_MAGIC)
        return gm__set_error(GM_INVALID_ARGUMENT, "sim: hold_stream: invalid context %p", ctx);
    pthread_mutex_lock(&sim->lock);
    int rc = check_stream_locked(sim, "hold_stream", stream);
    stream_t *s = rc == GM_OK ? stream_find(sim, stream) : NULL;
    if (rc == GM_OK && s == NULL && hold) {
        s = stream_add_locked(sim, stream);
        if (s == NULL) rc = GM_NO_HOST_MEMORY;
    }
    if (s != NULL) {
        if (hold) {
            s->held = 1;
        } else if (s->held) {
            s->held = 0;
            s->hold_gen++;
        }
    }
    pthread_mutex_unlock(&sim->lock);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Contract: host memory                                                     */
/* ------------------------------------------------------------------------ */

/* Index of the first registered range with start > addr. */
static size_t hostreg_upper(const sim_t *sim, uintptr_t addr)
{
    size_t lo = 0, hi = sim->nhostregs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (sim->hostregs[mid].start <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Does one registered range hold all of [addr, addr + n)? */
static int hostreg_covers(const sim_t *sim, uintptr_t addr, size_t n)
{
    size_t i = hostreg_upper(sim, addr);
    if (i == 0) return 0;
    const hostreg_t *h = &sim->hostregs[i - 1];
    return addr - h->start < h->size && n <= h->size - (addr - h->start);
}

/* Preconditions (checked): p and size non-zero multiples of the host page;
 * the range overlaps no device range and no registered range.  The memory is
 * the caller's (already mapped); nothing is touched. */
static int sim_host_register(void *ctx, void *p, size_t size, unsigned flags)
{
    sim_t *sim = NULL;
    GM_CHECK(enter(ctx, GM_CALL_host_register, &sim));
    int rc = GM_OK;
    uintptr_t a = (uintptr_t)p;
    if (a == 0 || size == 0 || a % sim->host_page || size % sim->host_page || a + size < a ||
        (flags & ~GM__HOST_DEVICEMAP)) {
        rc = gm__set_error(GM_INVALID_ARGUMENT, "sim: host_register(%p, %zu, %#x): address and "
                           "size must be non-zero multiples of the host page %zu; flags 0 or "
                           "DEVICEMAP", p, size, flags, sim->host_page);
        goto out;
    }
    if (region_overlapping(sim, a, size) != NULL) {
        rc = gm__set_error(GM_INVALID_ARGUMENT, "sim: host_register(%p, %zu): overlaps device "
                           "memory", p, size);
        goto out;
    }
    size_t i = hostreg_upper(sim, a);
    if ((i > 0 && sim->hostregs[i - 1].start + sim->hostregs[i - 1].size > a) ||
        (i < sim->nhostregs && sim->hostregs[i].start - a < size)) {
        rc = gm__set_error(GM_INVALID_ARGUMENT, "sim: host_register(%p, %zu): overlaps a range "
                           "registered already", p, size);
        goto out;
    }
    GM_CHECK_GOTO(grow_array((void **)&sim->hostregs, &sim->hostregs_cap, sizeof(hostreg_t),
                             sim->nhostregs + 1), rc, out);
    memmove(&sim->hostregs[i + 1], &sim->hostregs[i], (sim->nhostregs - i) * sizeof(hostreg_t));
    sim->hostregs[i] = (hostreg_t){.start = a, .size = size, .flags = flags};
    sim->nhostregs++;
    charge_locked(sim, call_cost_ns[GM_CALL_host_register] + (size >> 20) * HOST_REGISTER_PER_MIB_NS);
out:
    return leave(sim, rc);
}

/* Precondition (checked): p starts a registered range. */
static int sim_host_unregister(void *ctx, void *p)
{
    sim_t *sim = NULL;
    GM_CHECK(enter(ctx, GM_CALL_host_unregister, &sim));
    int rc = GM_OK;
    size_t i = hostreg_upper(sim, (uintptr_t)p);
    if (i == 0 || sim->hostregs[i - 1].start != (uintptr_t)p) {
        rc = gm__set_error(GM_INVALID_ARGUMENT, "sim: host_unregister(%p): not the start of a "
                           "registered range", p);
    } else {
        size_t size = sim->hostregs[i - 1].size;
        memmove(&sim->hostregs[i - 1], &sim->hostregs[i],
                (sim->nhostregs - i) * sizeof(hostreg_t));
        sim->nhostregs--;
        charge_locked(sim, call_cost_ns[GM_CALL_host_unregister] +
                               (size >> 20) * HOST_UNREGISTER_PER_MIB_NS);
    }
    return leave(sim, rc);
}

/* Precondition (checked): p inside a range registered with DEVICEMAP.  The
 * sim's "device" addresses host memory directly: the same address. */
static int sim_host_device_pointer(void *ctx, void *p, uintptr_t *dptr)
{
    sim_t *sim = NULL;
    GM_CHECK(enter(ctx, GM_CALL_host_device_pointer, &sim));
    int rc = GM_OK;
    size_t i = hostreg_upper(sim, (uintptr_t)p);
    const hostreg_t *h = i ? &sim->hostregs[i - 1] : NULL;
    if (dptr == NULL || h == NULL || (uintptr_t)p - h->start >= h->size ||
        !(h->flags & GM__HOST_DEVICEMAP)) {
        rc = gm__set_error(GM_INVALID_ARGUMENT, "sim: host_device_pointer(%p): not inside a "
                           "range registered with DEVICEMAP", p);
    } else {
        *dptr = (uintptr_t)p;
        charge_locked(sim, call_cost_ns[GM_CALL_host_device_pointer]);
    }
    return leave(sim, rc);
}

/* ---- managed memory: host memory the sim's "device" reaches directly ---- */

/* The managed allocation holding [ptr, ptr+size), or -1. */
static long managed_find(const sim_t *sim, uintptr_t ptr, size_t size)
{
    for (size_t i = 0; i < sim->nmanaged; i++) {
        const hostreg_t *m = &sim->managed[i];
        if (ptr >= m->start && ptr - m->start < m->size && size <= m->size - (ptr - m->start))
            return (long)i;
    }
    return -1;
}

static int sim_managed_alloc(void *ctx, size_t size, uintptr_t *ptr)
{
    sim_t *sim = NULL;
    GM_CHECK(enter(ctx, GM_CALL_mem_alloc, &sim));
    int rc = GM_OK;
    size_t len = (size + sim->host_page - 1) / sim->host_page * sim->host_page;
    void *p = size ? mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
                   : MAP_FAILED;
    if (p == MAP_FAILED) {
        rc = gm__set_error(GM_OUT_OF_MEMORY, "sim: mem_alloc(%zu bytes): no host memory", size);
        goto out;
    }
    rc = grow_array((void **)&sim->managed, &sim->managed_cap, sizeof(hostreg_t), sim->nmanaged + 1);
    if (rc != GM_OK) {
        munmap(p, len);
        goto out;
    }
    sim->managed[sim->nmanaged++] = (hostreg_t){.start = (uintptr_t)p, .size = len};
    *ptr = (uintptr_t)p;
    charge_locked(sim, call_cost_ns[GM_CALL_mem_alloc]);
out:
    return leave(sim, rc);
}

static int sim_managed_free(void *ctx, uintptr_t ptr)
{
    sim_t *sim = NULL;
    GM_CHECK(enter(ctx, GM_CALL_mem_free, &sim));
    int rc = GM_OK;
    long i = managed_find(sim, ptr, 1);
    if (i < 0 || sim->managed[i].start != ptr) {
        rc = gm__set_error(GM_INVALID_ARGUMENT, "sim: mem_free(%#lx): not a managed allocation",
                           (unsigned long)ptr);
    } else {
        munmap((void *)ptr, sim->managed[i].size);
        sim->managed[i] = sim->managed[--sim->nmanaged];
        charge_locked(sim, call_cost_ns[GM_CALL_mem_free]);
    }
    return leave(sim, rc);
}

static int sim_prefetch(void *ctx, uintptr_t ptr, size_t size, int to_host, gm_stream_t stream)
{
    sim_t *sim = NULL;
    GM_CHECK(enter(ctx, GM_CALL_prefetch, &sim));
    int rc = GM_OK;
    (void)to_host;
    GM_CHECK_GOTO(check_stream_locked(sim, "prefetch", stream), rc, out);
    if (managed_find(sim, ptr, size) < 0)
        rc = gm__set_error(GM_INVALID_ARGUMENT, "sim: prefetch(%#lx, %zu): not inside a managed "
                           "allocation", (unsigned long)ptr, size);
    else
        charge_locked(sim, call_cost_ns[GM_CALL_prefetch] + (uint64_t)size * 10 / PAGEABLE_H2D_BYTES_PER_10NS);
out:
    return leave(sim, rc);
}

static int sim_advise(void *ctx, uintptr_t ptr, size_t size, int advice)
{
    sim_t *sim = NULL;
    GM_CHECK(enter(ctx, GM_CALL_advise, &sim));
    int rc = GM_OK;
    if (managed_find(sim, ptr, size) < 0 || (advice != 1 && advice != 2))
        rc = gm__set_error(GM_INVALID_ARGUMENT, "sim: advise(%#lx, %zu, %d): not inside a managed "
                           "allocation, or unknown advice", (unsigned long)ptr, size, advice);
    else
        charge_locked(sim, call_cost_ns[GM_CALL_advise]);
    return leave(sim, rc);
}

/* Precondition: ev live and recorded.  The sim runs work at once, so there
 * is nothing to order: it checks, charges, and returns. */
static int sim_stream_wait_event(void *ctx, gm_stream_t stream, gm__event_t ev)
{
    sim_t *sim = NULL;
    GM_CHECK(enter(ctx, GM_CALL_stream_wait_event, &sim));
    int rc = check_stream_locked(sim, "stream_wait_event", stream);
    if (rc == GM_OK && event_lookup_locked(sim, ev) == NULL)
        rc = gm__set_error(GM_INVALID_ARGUMENT, "sim: stream_wait_event: invalid event %#" PRIx64,
                           ev);
    if (rc == GM_OK) {
        const event_t *e = event_lookup_locked(sim, ev);
        if (event_pending_locked(sim, e)) {
            waited_t *w = &sim->waits[sim->nwaits++ % SIM_WAITS];
            *w = (waited_t){stream, e->stream, e->hold_gen};
        }
        charge_locked(sim, call_cost_ns[GM_CALL_stream_wait_event]);
    }
    return leave(sim, rc);
}

/* ---- the in-flight checker ------------------------------------------------- */

/* Has `stream` waited on an event of streams[on] recorded under hold_gen? */
static int waited_locked(const sim_t *sim, gm_stream_t stream, uint32_t on, uint64_t hold_gen)
{
    unsigned n = sim->nwaits < SIM_WAITS ? sim->nwaits : SIM_WAITS;
    for (unsigned i = 0; i < n; i++)
        if (sim->waits[i].waiter == stream && sim->waits[i].on == on &&
            sim->waits[i].hold_gen == hold_gen)
            return 1;
    return 0;
}

/* Is [addr, addr + n) memory whose reuse the stream rule governs? */
static int tracked_locked(const sim_t *sim, uintptr_t addr, size_t n, int device)
{
    return n != 0 && (device || hostreg_covers(sim, addr, n));
}

/* A copy or fill on `stream` touching [addr, addr + n): GM_BACKEND when a
 * held other stream's pending work touched it too (one of them writing) and
 * `stream` did not wait for that work. */
static int flight_check_locked(const sim_t *sim, const char *call, gm_stream_t stream,
                               uintptr_t addr, size_t n, int write)
{
    const stream_t *self = stream_find(sim, stream);
    unsigned count = sim->nflights < SIM_FLIGHTS ? sim->nflights : SIM_FLIGHTS;
    for (unsigned i = 0; i < count; i++) {
        const flight_t *f = &sim->flights[i];
        const stream_t *owner = &sim->streams[f->stream];
        if (owner == self || owner->hold_gen != f->hold_gen || owner->dead) continue;
        if (addr >= f->hi || addr + n <= f->lo || !(write || f->write)) continue;
        if (waited_locked(sim, stream, f->stream, f->hold_gen)) continue;
        return gm__set_error(GM_BACKEND,
                             "sim: %s: stream-rule violation: stream %p touches [%#" PRIxPTR
                             ", +%zu), which work still in flight on held stream %p uses "
                             "([%#" PRIxPTR ", %#" PRIxPTR "), %s), with no wait on it",
                             call, stream, addr, n, owner->id, f->lo, f->hi,
                             f->write ? "writing" : "reading");
    }
    return GM_OK;
}

/* Remember [addr, addr + n) as in flight when `stream` is held. */
static void flight_note_locked(sim_t *sim, gm_stream_t stream, uintptr_t addr, size_t n,
                               int write)
{
    const stream_t *s = stream_find(sim, stream);
    if (s == NULL || !s->held) return;
    flight_t *f = &sim->flights[sim->nflights++ % SIM_FLIGHTS];
    *f = (flight_t){addr, addr + n, (uint32_t)(s - sim->streams), s->hold_gen, write};
}

/* ------------------------------------------------------------------------ */
/* Contract: copies and fills                                                */
/* ------------------------------------------------------------------------ */

/* [addr, addr + n), outside sim's own reservations: host memory (*device =
 * 0) unless it is another context's device memory (1), which sim's device
 * may touch only where its owner granted it access (the destination
 * read-write). */
static int check_foreign_locked(const sim_t *sim, const char *call, const char *side,
                                uintptr_t addr, size_t n, int *device)
{
    uint64_t first = addr >> SIM_GRANULARITY_SHIFT;
    uint64_t last = (addr + n - 1) >> SIM_GRANULARITY_SHIFT;
    *device = 0;
    for (uint64_t g = first; g <= last; g++) {
        uint64_t v = access_of(g);
        if (v == 0) {
            if (*device)
                return gm__set_error(GM_INVALID_ARGUMENT, "sim: %s: %s range [%#" PRIxPTR
                                     ", +%zu) runs past mapped device memory at %#" PRIxPTR,
                                     call, side, addr, n, (uintptr_t)(g << SIM_GRANULARITY_SHIFT));
            continue;
        }
        int owner = (int)((v >> 32) & 0x7fffffff) - 1;
        if (g != first && !*device)
            return gm__set_error(GM_INVALID_ARGUMENT, "sim: %s: %s range [%#" PRIxPTR ", +%zu) "
                                 "runs from host memory into device %d's memory", call, side,
                                 addr, n, owner);
        *device = 1;
        if (!(v & ((uint64_t)1 << sim->device)))
            return gm__set_error(GM_BACKEND, "sim: %s: illegal address: device %d has no access "
                                 "to %s %#" PRIxPTR ", memory of device %d (grant it: "
                                 "gm_pool_config_t.peers, GPUMEM_PEERS)", call, sim->device,
                                 side, (uintptr_t)(g << SIM_GRANULARITY_SHIFT), owner);
        if ((v & ACCESS_RO) && strcmp(side, "destination") == 0)
            return gm__set_error(GM_BACKEND, "sim: %s: destination address %#" PRIxPTR
                                 " is mapped read-only", call,
                                 (uintptr_t)(g << SIM_GRANULARITY_SHIFT));
    }
    return GM_OK;
}

/* Is [addr, addr + n) device memory (*device = 1), host memory (0), or
 * invalid (an error: partly outside a region, or touching granules that are
 * unmapped or not yet accessible)? */
static int check_range_locked(sim_t *sim, const char *call, const char *side, uintptr_t addr,
                              size_t n, int *device)
{
    if (addr == 0 || addr + n < addr)
        return gm__set_error(GM_INVALID_ARGUMENT, "sim: %s: invalid %s range [%#" PRIxPTR
                             ", +%zu)", call, side, addr, n);
    region_t *r = region_overlapping(sim, addr, n);
    if (r == NULL) return check_foreign_locked(sim, call, side, addr, n, device);
    if (addr < r->start || n > r->start + r->size - addr)
        return gm__set_error(GM_INVALID_ARGUMENT,
                             "sim: %s: %s range [%#" PRIxPTR ", +%zu) crosses the edge of the "
                             "device range [%#" PRIxPTR ", +%zu)",
                             call, side, addr, n, r->start, r->size);
    *device = 1;
    uint64_t first = addr >> SIM_GRANULARITY_SHIFT;
    uint64_t last = (addr + n - 1) >> SIM_GRANULARITY_SHIFT;
    for (uint64_t g = first; g <= last; g++) {
        gslot_t *s = gmap_find(&sim->granules, g);
        if (s == NULL || !(gslot_val(s) & GRANULE_ACCESS))
            return gm__set_error(GM_INVALID_ARGUMENT,
                                 "sim: %s: %s address %#" PRIxPTR " is %s", call, side,
                                 (uintptr_t)(g << SIM_GRANULARITY_SHIFT),
                                 s == NULL ? "reserved but not mapped"
                                           : "mapped but not accessible (no set_access)");
        /* A device write through a read-only mapping is refused, as the
         * device refuses it (an illegal-address fault on a GPU). */
        if ((gslot_val(s) & GRANULE_READ_ONLY) && strcmp(side, "destination") == 0)
            return gm__set_error(GM_BACKEND, "sim: %s: destination address %#" PRIxPTR
                                 " is mapped read-only", call,
                                 (uintptr_t)(g << SIM_GRANULARITY_SHIFT));
    }
    return GM_OK;
}

/* Preconditions: device sides mapped and accessible; stream any value.
 * Synchronous: done when it returns (a held stream only delays events). */
static int sim_memcpy(void *ctx, uintptr_t dst, uintptr_t src, size_t n, gm_stream_t stream)
{
    sim_t *sim = NULL;
    GM_CHECK(enter(ctx, GM_CALL_memcpy, &sim));
    int rc = GM_OK, ddev = 0, sdev = 0;
    GM_CHECK_GOTO(check_stream_locked(sim, "memcpy", stream), rc, out);
    if (n != 0) {
        GM_CHECK_GOTO(check_range_locked(sim, "memcpy", "destination", dst, n, &ddev), rc, out);
        GM_CHECK_GOTO(check_range_locked(sim, "memcpy", "source", src, n, &sdev), rc, out);
        int dtr = tracked_locked(sim, dst, n, ddev), str = tracked_locked(sim, src, n, sdev);
        if (dtr) GM_CHECK_GOTO(flight_check_locked(sim, "memcpy", stream, dst, n, 1), rc, out);
        if (str) GM_CHECK_GOTO(flight_check_locked(sim, "memcpy", stream, src, n, 0), rc, out);
        if (dtr) flight_note_locked(sim, stream, dst, n, 1);
        if (str) flight_note_locked(sim, stream, src, n, 0);
    }
    uint64_t t = call_cost_ns[GM_CALL_memcpy];
    if (ddev && sdev)
        t += (uint64_t)n * 2 / DEVICE_BYTES_PER_NS;
    else if (ddev && !hostreg_covers(sim, src, n))
        t += (uint64_t)n * 10 / PAGEABLE_H2D_BYTES_PER_10NS;
    else if (sdev && !hostreg_covers(sim, dst, n))
        t += (uint64_t)n * 10 / PAGEABLE_D2H_BYTES_PER_10NS;
    else
        t += (uint64_t)n / HOST_BYTES_PER_NS;
    charge_locked(sim, t);
out:
    leave(sim, rc);
    if (rc == GM_OK && n != 0) memmove((void *)dst, (const void *)src, n);
    return rc;
}

/* Preconditions: as memcpy. */
static int sim_memset(void *ctx, uintptr_t dst, int value, size_t n, gm_stream_t stream)
{
    sim_t *sim = NULL;
    GM_CHECK(enter(ctx, GM_CALL_memset, &sim));
    int rc = GM_OK, ddev = 0;
    GM_CHECK_GOTO(check_stream_locked(sim, "memset", stream), rc, out);
    if (n != 0) {
        GM_CHECK_GOTO(check_range_locked(sim, "memset", "destination", dst, n, &ddev), rc, out);
        if (tracked_locked(sim, dst, n, ddev)) {
            GM_CHECK_GOTO(flight_check_locked(sim, "memset", stream, dst, n, 1), rc, out);
            flight_note_locked(sim, stream, dst, n, 1);
        }
    }
    charge_locked(sim, call_cost_ns[GM_CALL_memset] +
                           (uint64_t)n / (ddev ? DEVICE_BYTES_PER_NS : HOST_BYTES_PER_NS));
out:
    leave(sim, rc);
    if (rc == GM_OK && n != 0) memset((void *)dst, value, n);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Simulator controls                                                        */
/* ------------------------------------------------------------------------ */

static uint64_t sim_modeled_ns(void *ctx)
{
    sim_t *sim = ctx;
    if (sim == NULL || sim->magic != SIM_MAGIC) return 0;
    pthread_mutex_lock(&sim->lock);
    uint64_t ns = sim->modeled_ns;
    pthread_mutex_unlock(&sim->lock);
    return ns;
}

/* The n-th next call of `kind` (1 = the very next) fails with GM_BACKEND and
 * changes nothing; n = 0 disarms.  Kinds are independent. */
static int sim_fail_nth(void *ctx, int kind, unsigned long n)
{
    sim_t *sim = ctx;
    if (sim == NULL || sim->magic != SIM_MAGIC)
        return gm__set_error(GM_INVALID_ARGUMENT, "sim: fail_nth: invalid context %p", ctx);
    if (kind < 0 || kind >= GM_CALL_COUNT)
        return gm__set_error(GM_INVALID_ARGUMENT, "sim: fail_nth: unknown call kind %d", kind);
    pthread_mutex_lock(&sim->lock);
    sim->fail_countdown[kind] = n;
    pthread_mutex_unlock(&sim->lock);
    return GM_OK;
}

const gm__backend_ops_t gm__backend_sim = {
    .name = "sim",
    .probe = sim_probe,
    .open = sim_open,
    .close = sim_close,
    .info = sim_info,
    .va_reserve = sim_va_reserve,
    .va_free = sim_va_free,
    .phys_create = sim_phys_create,
    .phys_release = sim_phys_release,
    .map = sim_map,
    .unmap = sim_unmap,
    .set_access = sim_set_access,
    .export_fd = sim_export_fd,
    .import_fd = sim_import_fd,
    .event_create = sim_event_create,
    .event_destroy = sim_event_destroy,
    .event_record = sim_event_record,
    .event_query = sim_event_query,
    .event_sync = sim_event_sync,
    .stream_sync = sim_stream_sync,
    .stream_create = sim_stream_create,
    .stream_destroy = sim_stream_destroy,
    .memcpy = sim_memcpy,
    .memset = sim_memset,
    .host_register = sim_host_register,
    .host_unregister = sim_host_unregister,
    .host_device_pointer = sim_host_device_pointer,
    .stream_wait_event = sim_stream_wait_event,
    .mem_alloc = sim_managed_alloc,
    .mem_free = sim_managed_free,
    .prefetch = sim_prefetch,
    .advise = sim_advise,
    .modeled_ns = sim_modeled_ns,
    .fail_nth = sim_fail_nth,
    .hold_stream = sim_hold_stream,
};
