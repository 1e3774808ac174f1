/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vmm_probe.c — what the driver charges for the steps of an offload, each
 * alone and side by side: giving back 2 MiB pages (unmap + release, page by
 * page or one unmap over a run of pages), growing pinned host memory
 * (touching with N threads, registering), and whether those steps slow each
 * other or a device-to-host copy down.  Not part of the build: the offload
 * design reads its figures (docs/offload.md, bench/results/).
 *
 *   cc -O2 -o vmm_probe bench/vmm_probe.c -I$CUDA/include -lcuda -lpthread
 *   ./vmm_probe            # one line of JSON per measurement
 *   ./vmm_probe handles    # only the physical allocation size probe (F)
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

#include "probe.h"

#define CK PROBE_CK

static CUdevice dev;
static size_t gran;

typedef struct run {
    CUdeviceptr va;
    size_t n;
    CUmemGenericAllocationHandle h[1024];
} run_t;

static double make_run(run_t *r, size_t n)
{
    CUmemAllocationProp p = probe_device_prop(dev);
    r->n = n;
    CK(cuMemAddressReserve(&r->va, n * gran, 0, 0, 0));
    double t0 = now_ms();
    for (size_t i = 0; i < n; i++) {
        CK(cuMemCreate(&r->h[i], gran, &p, 0));
        CK(cuMemMap(r->va + i * gran, gran, 0, r->h[i], 0));
    }
    CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, (int)dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CK(cuMemSetAccess(r->va, n * gran, &d, 1));
    CK(cuMemsetD8(r->va, 1, n * gran));
    CK(cuCtxSynchronize());
    return now_ms() - t0;
}

/* mode 0: unmap+release page by page; 1: all unmaps then all releases;
 * 2: one unmap over the run, then the releases; 3: release first, then one unmap. */
static double drop_run(run_t *r, int mode, double *t_unmap, int *ranged_rc)
{
    double t0 = now_ms(), t1;
    *ranged_rc = 0;
    if (mode == 0) {
        for (size_t i = 0; i < r->n; i++) {
            CK(cuMemUnmap(r->va + i * gran, gran));
            CK(cuMemRelease(r->h[i]));
        }
        t1 = now_ms();
    } else if (mode == 1) {
        for (size_t i = 0; i < r->n; i++) CK(cuMemUnmap(r->va + i * gran, gran));
        t1 = now_ms();
        for (size_t i = 0; i < r->n; i++) CK(cuMemRelease(r->h[i]));
    } else if (mode == 2) {
        CUresult rc = cuMemUnmap(r->va, r->n * gran);
        *ranged_rc = (int)rc;
        if (rc != CUDA_SUCCESS)
            for (size_t i = 0; i < r->n; i++) CK(cuMemUnmap(r->va + i * gran, gran));
        t1 = now_ms();
        for (size_t i = 0; i < r->n; i++) CK(cuMemRelease(r->h[i]));
    } else {
        for (size_t i = 0; i < r->n; i++) CK(cuMemRelease(r->h[i]));
        t1 = now_ms();
        CUresult rc = cuMemUnmap(r->va, r->n * gran);
        *ranged_rc = (int)rc;
        if (rc != CUDA_SUCCESS)
            for (size_t i = 0; i < r->n; i++) CK(cuMemUnmap(r->va + i * gran, gran));
    }
    double t2 = now_ms();
    *t_unmap = t1 - t0;
    CK(cuMemAddressFree(r->va, r->n * gran));
    return t2 - t0;
}

/* F. 1 GiB of device memory made of physical allocations of one size, 2 MiB
 * to 1 GiB: the time to create them, map them, give the device access to
 * the whole range (one call), and give them back (unmap each, release
 * each).  Does one page per handle cost what a restore pays? */
static int handles_probe(void)
{
    const size_t total = (size_t)1 << 30;
    static CUmemGenericAllocationHandle h[512];
    CUmemAllocationProp p = probe_device_prop(dev);
    CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, (int)dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    const size_t mib = (size_t)1 << 20;
    const size_t sizes[] = {2 * mib, 8 * mib, 32 * mib, 128 * mib, 512 * mib, 1024 * mib};
    for (int rep = 0; rep < 3; rep++)
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
            size_t hs = sizes[k] < gran ? gran : sizes[k], n = total / hs;
            CUdeviceptr va;
            CK(cuMemAddressReserve(&va, total, 0, 0, 0));
            double t0 = now_ms();
            for (size_t i = 0; i < n; i++) CK(cuMemCreate(&h[i], hs, &p, 0));
            double t1 = now_ms();
            for (size_t i = 0; i < n; i++) CK(cuMemMap(va + i * hs, hs, 0, h[i], 0));
            double t2 = now_ms();
            CK(cuMemSetAccess(va, total, &d, 1));
            double t3 = now_ms();
            CK(cuMemsetD8(va, 1, total));
            CK(cuCtxSynchronize());
            double t4 = now_ms();
            for (size_t i = 0; i < n; i++) CK(cuMemUnmap(va + i * hs, hs));
            double t5 = now_ms();
            for (size_t i = 0; i < n; i++) CK(cuMemRelease(h[i]));
            double t6 = now_ms();
            CK(cuMemAddressFree(va, total));
            printf("{\"probe\":\"handles\",\"rep\":%d,\"handle_bytes\":%zu,\"handles\":%zu,"
                   "\"create_ms\":%.3f,\"map_ms\":%.3f,\"set_access_ms\":%.3f,\"unmap_ms\":%.3f,"
                   "\"release_ms\":%.3f,\"make_ms\":%.3f,\"give_back_ms\":%.3f}\n",
                   rep, hs, n, t1 - t0, t2 - t1, t3 - t2, t5 - t4, t6 - t5, t3 - t0, t6 - t4);
            fflush(stdout);
        }
    return 0;
}

/* Work timed on a thread of its own while the main thread does other work:
 * touching a buffer with `threads` threads, or (threads 0) registering it. */
typedef struct bgjob {
    char *p;
    size_t n;
    int threads;
    CUcontext ctx;
    double ms;
} bgjob_t;

static void *bg_main(void *a)
{
    bgjob_t *j = a;
    CK(cuCtxSetCurrent(j->ctx));
    double t0 = now_ms();
    if (j->threads)
        probe_touch(j->p, j->n, j->threads);
    else
        CK(cuMemHostRegister(j->p, j->n, CU_MEMHOSTREGISTER_DEVICEMAP));
    j->ms = now_ms() - t0;
    return NULL;
}

/* A device-to-host copy of n bytes while job j runs on a thread: its ms. */
static double copy_during(char *dst, CUdeviceptr src, size_t n, CUstream st, bgjob_t *j)
{
    pthread_t th;
    double t0 = now_ms();
    CK(cuMemcpyDtoHAsync(dst, src, n, st));
    pthread_create(&th, NULL, bg_main, j);
    CK(cuStreamSynchronize(st));
    double ms = now_ms() - t0;
    pthread_join(th, NULL);
    return ms;
}

int main(int argc, char **argv)
{
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    char name[128];
    CK(cuDeviceGetName(name, sizeof name, dev));
    CUmemAllocationProp p = probe_device_prop(dev);
    CK(cuMemGetAllocationGranularity(&gran, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    printf("{\"probe\":\"device\",\"name\":\"%s\",\"granularity\":%zu}\n", name, gran);

    if (argc > 1 && !strcmp(argv[1], "handles")) return handles_probe();

    /* A. Giving back 128 pages (256 MiB), each way, three times. */
    static const char *mode_name[4] = {"unmap+release per page", "all unmaps, then releases",
                                       "one ranged unmap, then releases", "releases, then one ranged unmap"};
    for (int rep = 0; rep < 3; rep++)
        for (int mode = 0; mode < 4; mode++) {
            run_t r;
            double mk = make_run(&r, 128), first;
            int rrc;
            double all = drop_run(&r, mode, &first, &rrc);
            printf("{\"probe\":\"give_back\",\"pages\":128,\"mode\":\"%s\",\"make_ms\":%.2f,\"first_step_ms\":%.2f,"
                   "\"total_ms\":%.2f,\"ranged_unmap_rc\":%d}\n", mode_name[mode], mk, first, all, rrc);
        }

    /* B. Pinned host growth: touch with N threads, register, unregister. */
    size_t sizes[2] = {(size_t)256 << 20, (size_t)1 << 30};
    int thr[4] = {1, 4, 8, 16};
    for (int s = 0; s < 2; s++)
        for (int t = 0; t < 4; t++) {
            char *h = probe_host_map(sizes[s]);
            double t0 = now_ms();
            probe_touch(h, sizes[s], thr[t]);
            double t1 = now_ms();
            CK(cuMemHostRegister(h, sizes[s], CU_MEMHOSTREGISTER_DEVICEMAP));
            double t2 = now_ms();
            CK(cuMemHostUnregister(h));
            double t3 = now_ms();
            munmap(h, sizes[s]);
            double t4 = now_ms();
            printf("{\"probe\":\"host_grow\",\"bytes\":%zu,\"threads\":%d,\"touch_ms\":%.2f,\"register_ms\":%.2f,"
                   "\"unregister_ms\":%.2f,\"munmap_ms\":%.2f}\n", sizes[s], thr[t], t1 - t0, t2 - t1, t3 - t2,
                   t4 - t3);
        }
    {   /* register untouched */
        char *h = probe_host_map(sizes[0]);
        double t0 = now_ms();
        CK(cuMemHostRegister(h, sizes[0], CU_MEMHOSTREGISTER_DEVICEMAP));
        printf("{\"probe\":\"host_register_untouched\",\"bytes\":%zu,\"register_ms\":%.2f}\n", sizes[0],
               now_ms() - t0);
        CK(cuMemHostUnregister(h));
        munmap(h, sizes[0]);
    }

    /* C. Side by side. */
    CUstream st;
    CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    size_t cb = (size_t)256 << 20;
    char *pin = probe_host_map(cb);
    probe_touch(pin, cb, 16);
    CK(cuMemHostRegister(pin, cb, CU_MEMHOSTREGISTER_DEVICEMAP));
    CUdeviceptr d;
    CK(cuMemAlloc(&d, cb));
    for (int rep = 0; rep < 3; rep++) {
        /* C1: copy alone. */
        double t0 = now_ms();
        CK(cuMemcpyDtoHAsync(pin, d, cb, st));
        CK(cuStreamSynchronize(st));
        double alone = now_ms() - t0;
        /* C2: copy while 16 threads touch a fresh 256 MiB. */
        char *h = probe_host_map(cb);
        bgjob_t tj = {h, cb, 16, ctx, 0};
        double with_touch = copy_during(pin, d, cb, st, &tj);
        pthread_t th;
        /* C3: give back 128 pages while another thread registers h. */
        run_t r;
        make_run(&r, 128);
        bgjob_t rj = {h, cb, 0, ctx, 0};
        pthread_create(&th, NULL, bg_main, &rj);
        int rrc;
        double first, gb = drop_run(&r, 0, &first, &rrc);
        pthread_join(th, NULL);
        /* C4: copy while registering (a second fresh buffer). */
        char *h2 = probe_host_map(cb);
        probe_touch(h2, cb, 16);
        bgjob_t rj2 = {h2, cb, 0, ctx, 0};
        double with_reg = copy_during(pin, d, cb, st, &rj2);
        printf("{\"probe\":\"side_by_side\",\"copy_alone_ms\":%.2f,\"copy_GBps\":%.1f,\"copy_with_touch_ms\":%.2f,"
               "\"touch_during_copy_ms\":%.2f,\"give_back_128_during_register_ms\":%.2f,\"register_ms\":%.2f,"
               "\"copy_with_register_ms\":%.2f,\"register2_ms\":%.2f}\n", alone, cb / alone / 1e6, with_touch,
               tj.ms, gb, rj.ms, with_reg, rj2.ms);
        CK(cuMemHostUnregister(h));
        CK(cuMemHostUnregister(h2));
        munmap(h, cb);
        munmap(h2, cb);
    }
    CK(cuMemHostUnregister(pin));
    munmap(pin, cb);
    CK(cuMemFree(d));
    return 0;
}
