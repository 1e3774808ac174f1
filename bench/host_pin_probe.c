/* SPDX-License-Identifier: Apache-2.0 */
/*
 * host_pin_probe.c — how fast can pinned host memory be had from nothing?
 * A cold offload (docs/offload.md) first makes its host segments, so their
 * making bounds it.  Four ways, each making SIZE bytes in 256 MiB chunks,
 * then copying SIZE bytes of device memory into them twice:
 *
 *   touch_register   mmap (explicit huge pages, else transparent ones),
 *                    touched by N threads, then cuMemHostRegister
 *                    (what the host pool does today)
 *   register         mmap with transparent huge pages, cuMemHostRegister
 *                    with no touching (the driver faults the pages in)
 *   host_alloc       cuMemHostAlloc
 *   vmm_host         cuMemCreate of host memory (CU_MEM_LOCATION_TYPE_HOST_NUMA),
 *                    mapped with cuMemMap, access for the device and the host
 *   par_register     as touch_register, but all chunks touched first, then
 *                    registered by one thread per chunk at once
 *   pipelined        as touch_register, but chunk i+1 is touched (by N-1
 *                    threads) while chunk i is registered
 *   pipe_copy        as pipelined, and each chunk's copy from the device is
 *                    queued as soon as it is registered: make_ms is then the
 *                    time until all the data is in host memory (a cold
 *                    offload's host side, less its device page releases)
 *
 *   stage            no pinned memory of SIZE at all: the device copies into
 *                    a ring of STAGE_SLOTS pinned slots of STAGE_SLOT bytes
 *                    (made during the measurement), and N-1 threads copy
 *                    each slot out into fresh pageable memory; make_ms is
 *                    the time until all the data is there (the copies
 *                    after it are then from pageable memory)
 *
 * PROBE_CHUNK_MiB (default 256) sets the chunk size; PROBE_NO_THP=1 asks for
 * no huge pages (neither MAP_HUGETLB nor MADV_HUGEPAGE).
 *
 * Not part of the build; one line of JSON per measurement:
 *   cc -O2 -o host_pin_probe bench/host_pin_probe.c -I$CUDA/include -lcuda -lpthread
 *   ./host_pin_probe [SIZE_MiB [ROUNDS [WAYS]]]   (WAYS: a bit mask, default all)
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "probe.h"

/* A failed driver call fails the way being measured (the others go on). */
#define CK(x)                                                                              \
    do {                                                                                   \
        if (!probe_ok((x), #x, __FILE__, __LINE__)) return -1;                             \
    } while (0)

static size_t CHUNK = (size_t)256 << 20; /* PROBE_CHUNK_MiB */
#define MAX_CHUNKS 1024

enum { TOUCH_REGISTER, REGISTER, HOST_ALLOC, VMM_HOST, PAR_REGISTER, PIPELINED, PIPE_COPY, STAGE, N_WAYS };
static const char *way_name[N_WAYS] = {"touch_register", "register", "host_alloc", "vmm_host",
                                       "par_register", "pipelined", "pipe_copy", "stage"};

typedef struct chunk {
    void *p;
    CUdeviceptr va;
    CUmemGenericAllocationHandle h;
    int hugetlb;
    int rc; /* what registering it returned (par_register, pipelined) */
} chunk_t;

static CUdevice dev;
static CUcontext g_ctx; /* made current on the registering threads */
static int g_threads;

static int g_no_thp; /* PROBE_NO_THP=1: neither huge page kind asked for */

static void *map_thp(size_t n, int *hugetlb)
{
    void *p = MAP_FAILED;
    if (!g_no_thp) p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
    *hugetlb = p != MAP_FAILED;
    if (p == MAP_FAILED) {
        p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return NULL;
        if (!g_no_thp) (void)madvise(p, n, MADV_HUGEPAGE);
    }
    return p;
}

static int make(int way, chunk_t *c)
{
    memset(c, 0, sizeof *c);
    switch (way) {
    case TOUCH_REGISTER:
        if (!(c->p = map_thp(CHUNK, &c->hugetlb))) return -1;
        probe_touch(c->p, CHUNK, g_threads);
        CK(cuMemHostRegister(c->p, CHUNK, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
        c->va = (CUdeviceptr)(uintptr_t)c->p;
        return 0;
    case REGISTER:
        c->p = mmap(NULL, CHUNK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (c->p == MAP_FAILED) return -1;
        (void)madvise(c->p, CHUNK, MADV_HUGEPAGE);
        CK(cuMemHostRegister(c->p, CHUNK, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
        c->va = (CUdeviceptr)(uintptr_t)c->p;
        return 0;
    case HOST_ALLOC:
        CK(cuMemHostAlloc(&c->p, CHUNK, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
        c->va = (CUdeviceptr)(uintptr_t)c->p;
        return 0;
    case VMM_HOST: {
        CUmemAllocationProp prop = {0};
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
        prop.location.id = 0;
        CK(cuMemAddressReserve(&c->va, CHUNK, 0, 0, 0));
        CK(cuMemCreate(&c->h, CHUNK, &prop, 0));
        CK(cuMemMap(c->va, CHUNK, 0, c->h, 0));
        CUmemAccessDesc acc[2] = {{{CU_MEM_LOCATION_TYPE_DEVICE, (int)dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE},
                                  {{CU_MEM_LOCATION_TYPE_HOST_NUMA, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE}};
        CK(cuMemSetAccess(c->va, CHUNK, acc, 2));
        c->p = (void *)(uintptr_t)c->va;
        return 0;
    }
    }
    return -1;
}

static int unmake(int way, chunk_t *c)
{
    switch (way) {
    case TOUCH_REGISTER:
    case REGISTER:
    case PAR_REGISTER:
    case PIPELINED:
    case PIPE_COPY:
        CK(cuMemHostUnregister(c->p));
        munmap(c->p, CHUNK);
        return 0;
    case HOST_ALLOC:
        CK(cuMemFreeHost(c->p));
        return 0;
    case STAGE:
        return 0; /* one mapping, unmapped by the caller */
    case VMM_HOST:
        CK(cuMemUnmap(c->va, CHUNK));
        CK(cuMemRelease(c->h));
        CK(cuMemAddressFree(c->va, CHUNK));
        return 0;
    }
    return -1;
}

/* Register chunk arg (a chunk_t) in g_ctx: its rc says how that went. */
static void *reg_main(void *arg)
{
    chunk_t *c = arg;
    c->rc = cuCtxSetCurrent(g_ctx);
    if (c->rc == CUDA_SUCCESS)
        c->rc = cuMemHostRegister(c->p, CHUNK, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
    c->va = (CUdeviceptr)(uintptr_t)c->p;
    return NULL;
}

static void *touch_chunk_main(void *arg)
{
    chunk_t *c = arg;
    probe_touch(c->p, CHUNK, g_threads > 2 ? g_threads - 1 : 1);
    return NULL;
}

/* The two ways that make all chunks together; 0 or -1. */
static int make_batch(int way, chunk_t *c, size_t n, CUdeviceptr src, CUstream st)
{
    for (size_t i = 0; i < n; i++) {
        memset(&c[i], 0, sizeof c[i]);
        if (!(c[i].p = map_thp(CHUNK, &c[i].hugetlb))) return -1;
    }
    if (way == PAR_REGISTER) {
        static pthread_t th[MAX_CHUNKS];
        for (size_t i = 0; i < n; i++) probe_touch(c[i].p, CHUNK, g_threads);
        for (size_t i = 0; i < n; i++)
            if (pthread_create(&th[i], NULL, reg_main, &c[i])) return -1;
        int bad = 0;
        for (size_t i = 0; i < n; i++) {
            pthread_join(th[i], NULL);
            bad |= c[i].rc != 0;
        }
        return bad ? -1 : 0;
    }
    /* PIPELINED */
    probe_touch(c[0].p, CHUNK, g_threads);
    for (size_t i = 0; i < n; i++) {
        pthread_t th;
        int started = i + 1 < n && pthread_create(&th, NULL, touch_chunk_main, &c[i + 1]) == 0;
        reg_main(&c[i]);
        if (way == PIPE_COPY && !c[i].rc) CK(cuMemcpyAsync(c[i].va, src + i * CHUNK, CHUNK, st));
        if (started) pthread_join(th, NULL);
        else if (i + 1 < n) touch_chunk_main(&c[i + 1]);
        if (c[i].rc) return -1;
    }
    if (way == PIPE_COPY) CK(cuStreamSynchronize(st));
    return 0;
}

/* ---- stage: a pinned ring and threads copying out of it ---- */
#define STAGE_SLOTS 4
#define STAGE_SLOT ((size_t)32 << 20)

typedef struct stage_ctl {
    pthread_barrier_t go, done;
    char *src, *dst; /* this round's slot and destination */
    size_t n;
    int workers;
    int quit;
} stage_ctl_t;

typedef struct stage_worker {
    stage_ctl_t *ctl;
    int id;
} stage_worker_t;

static void *stage_main(void *arg)
{
    stage_worker_t *w = arg;
    stage_ctl_t *c = w->ctl;
    for (;;) {
        pthread_barrier_wait(&c->go);
        if (c->quit) return NULL;
        size_t per = (c->n / (size_t)c->workers + 4095) & ~(size_t)4095;
        size_t lo = per * (size_t)w->id;
        if (lo < c->n) memcpy(c->dst + lo, c->src + lo, lo + per > c->n ? c->n - lo : per);
        pthread_barrier_wait(&c->done);
    }
}

/* Make SIZE bytes of host data from the device through the ring; the data
 * lands in c[0] (one pageable mapping of all of it). */
static int stage_run(chunk_t *c, size_t bytes, CUdeviceptr src, CUstream st)
{
    static stage_ctl_t ctl;
    static stage_worker_t w[PROBE_TOUCH_MAX];
    static pthread_t th[PROBE_TOUCH_MAX];
    char *ring = NULL;
    CUevent ev[STAGE_SLOTS];
    int workers = g_threads > 2 ? g_threads - 1 : 1;
    memset(c, 0, sizeof *c);
    ring = mmap(NULL, STAGE_SLOTS * STAGE_SLOT, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ring == MAP_FAILED) return -1;
    probe_touch(ring, STAGE_SLOTS * STAGE_SLOT, g_threads);
    CK(cuMemHostRegister(ring, STAGE_SLOTS * STAGE_SLOT, CU_MEMHOSTREGISTER_PORTABLE));
    c->p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (c->p == MAP_FAILED) return -1;
    (void)madvise(c->p, bytes, MADV_HUGEPAGE);
    c->va = (CUdeviceptr)(uintptr_t)c->p;
    for (int i = 0; i < STAGE_SLOTS; i++) CK(cuEventCreate(&ev[i], CU_EVENT_DISABLE_TIMING));
    ctl.workers = workers;
    ctl.quit = 0;
    pthread_barrier_init(&ctl.go, NULL, (unsigned)workers + 1);
    pthread_barrier_init(&ctl.done, NULL, (unsigned)workers + 1);
    for (int i = 0; i < workers; i++) {
        w[i] = (stage_worker_t){&ctl, i};
        pthread_create(&th[i], NULL, stage_main, &w[i]);
    }
    size_t n = (bytes + STAGE_SLOT - 1) / STAGE_SLOT, queued = 0;
    for (; queued < n && queued < STAGE_SLOTS; queued++) {
        size_t len = bytes - queued * STAGE_SLOT < STAGE_SLOT ? bytes - queued * STAGE_SLOT : STAGE_SLOT;
        CK(cuMemcpyAsync((CUdeviceptr)(uintptr_t)(ring + (queued % STAGE_SLOTS) * STAGE_SLOT),
                         src + queued * STAGE_SLOT, len, st));
        CK(cuEventRecord(ev[queued % STAGE_SLOTS], st));
    }
    for (size_t k = 0; k < n; k++) {
        CK(cuEventSynchronize(ev[k % STAGE_SLOTS]));
        ctl.src = ring + (k % STAGE_SLOTS) * STAGE_SLOT;
        ctl.dst = (char *)c->p + k * STAGE_SLOT;
        ctl.n = bytes - k * STAGE_SLOT < STAGE_SLOT ? bytes - k * STAGE_SLOT : STAGE_SLOT;
        pthread_barrier_wait(&ctl.go);
        pthread_barrier_wait(&ctl.done);
        if (queued < n) {
            size_t len = bytes - queued * STAGE_SLOT < STAGE_SLOT ? bytes - queued * STAGE_SLOT : STAGE_SLOT;
            CK(cuMemcpyAsync((CUdeviceptr)(uintptr_t)(ring + (queued % STAGE_SLOTS) * STAGE_SLOT),
                             src + queued * STAGE_SLOT, len, st));
            CK(cuEventRecord(ev[queued % STAGE_SLOTS], st));
            queued++;
        }
    }
    ctl.quit = 1;
    pthread_barrier_wait(&ctl.go);
    for (int i = 0; i < workers; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&ctl.go);
    pthread_barrier_destroy(&ctl.done);
    for (int i = 0; i < STAGE_SLOTS; i++) cuEventDestroy(ev[i]);
    CK(cuMemHostUnregister(ring));
    munmap(ring, STAGE_SLOTS * STAGE_SLOT);
    for (size_t i = 0; i < bytes; i += 4093) /* the data arrived (src is 0x5a) */
        if (((unsigned char *)c->p)[i] != 0x5a) return -1;
    return 0;
}

static int one(int way, size_t n_chunks, CUdeviceptr src, CUstream st, int round)
{
    static chunk_t c[MAX_CHUNKS];
    double t0 = now_ms();
    if (way == STAGE) {
        if (stage_run(&c[0], n_chunks * CHUNK, src, st)) return -1;
        for (size_t i = 1; i < n_chunks; i++) c[i] = c[0], c[i].p = (char *)c[0].p + i * CHUNK,
                                             c[i].va = (CUdeviceptr)(uintptr_t)c[i].p;
    } else if (way == PAR_REGISTER || way == PIPELINED || way == PIPE_COPY) {
        if (make_batch(way, c, n_chunks, src, st)) return -1;
    } else {
        for (size_t i = 0; i < n_chunks; i++)
            if (make(way, &c[i])) return -1;
    }
    double t1 = now_ms();
    double copy_ms[2];
    for (int k = 0; k < 2; k++) {
        double a = now_ms();
        for (size_t i = 0; i < n_chunks; i++) CK(cuMemcpyAsync(c[i].va, src + i * CHUNK, CHUNK, st));
        CK(cuStreamSynchronize(st));
        copy_ms[k] = now_ms() - a;
    }
    /* The data arrived: the host reads what the device wrote. */
    unsigned char probe = ((volatile unsigned char *)c[n_chunks - 1].p)[CHUNK - 1];
    double t2 = now_ms();
    for (size_t i = 0; i < n_chunks; i++) CK(unmake(way, &c[i]));
    if (way == STAGE) munmap(c[0].p, n_chunks * CHUNK);
    double t3 = now_ms();
    double bytes = (double)(n_chunks * CHUNK);
    printf("{\"way\":\"%s\",\"round\":%d,\"bytes\":%.0f,\"threads\":%d,\"hugetlb\":%d,\"make_ms\":%.2f,"
           "\"chunk_MiB\":%zu,\"no_thp\":%d,\"make_GBps\":%.2f,\"copy1_GBps\":%.2f,\"copy2_GBps\":%.2f,\"free_ms\":%.2f,\"probe\":%u}\n",
           way_name[way], round, bytes, g_threads, c[0].hugetlb, t1 - t0, CHUNK >> 20, g_no_thp, bytes / (t1 - t0) / 1e6,
           bytes / copy_ms[0] / 1e6, bytes / copy_ms[1] / 1e6, t3 - t2, probe);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 0) : 1024;
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    unsigned ways = argc > 3 ? (unsigned)strtoul(argv[3], NULL, 0) : ~0u;
    g_no_thp = getenv("PROBE_NO_THP") && atoi(getenv("PROBE_NO_THP"));
    const char *ch = getenv("PROBE_CHUNK_MiB");
    if (ch && strtoul(ch, NULL, 0)) CHUNK = (size_t)strtoul(ch, NULL, 0) << 20;
    size_t n_chunks = (mib << 20) / CHUNK;
    if (n_chunks < 1 || n_chunks > MAX_CHUNKS) return 2;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    g_threads = cpus > 2 ? (int)cpus - 1 : 1;
    if (g_threads > PROBE_TOUCH_MAX) g_threads = PROBE_TOUCH_MAX;
    CUcontext ctx;
    CUstream st;
    CUdeviceptr src;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx))
        return 1;
    g_ctx = ctx;
    if (cuStreamCreate(&st, CU_STREAM_NON_BLOCKING) || cuMemAlloc(&src, n_chunks * CHUNK) ||
        cuMemsetD8(src, 0x5a, n_chunks * CHUNK))
        return 1;
    for (int r = 0; r < rounds; r++)
        for (int w = 0; w < N_WAYS; w++) {
            int way = (w + r) % N_WAYS; /* each way first once in a while */
            if (!(ways >> way & 1)) continue;
            if (one(way, n_chunks, src, st, r))
                printf("{\"way\":\"%s\",\"round\":%d,\"failed\":true}\n", way_name[way], r);
        }
    return 0;
}
