/* SPDX-License-Identifier: Apache-2.0 */
/*
 * host_bw_probe.c — do zeroing fresh host memory and a device-to-host copy
 * compete for the host's memory?  A cold offload (docs/offload.md) does both
 * at once: the kernel zeroes each new page at its first touch, and the copy
 * then writes it.  For SIZE bytes (default 1 GiB), each round measures:
 *
 *   touch        fresh memory (mmap, transparent huge pages) touched by
 *                N threads (cores - 1, as the host pool does): the kernel's
 *                zeroing, alone
 *   fill         the same memory, touched already, written whole by N
 *                threads (memset): plain write bandwidth, no faults
 *   copy         cuMemcpyDtoHAsync of SIZE into a pinned buffer made before
 *                the rounds, alone
 *   register     cuMemHostRegister of a touched SIZE, alone
 *   touch+copy   the copy queued, then fresh memory touched while it runs:
 *                the time until both are done, and each one's own time
 *   fill+copy    the same with memset of touched memory
 *   register+copy  the same with cuMemHostRegister of touched memory
 *   touch+register  touched memory registered while fresh memory is touched
 *                (by N - 1 threads, one being the registering one's): what
 *                a maker of pinned memory could overlap
 *
 * If the two share a bandwidth, touch+copy takes about touch + copy; if
 * not, about the longer of the two.
 *
 * Not part of the build; one line of JSON per measurement:
 *   cc -O2 -o host_bw_probe bench/host_bw_probe.c -I$CUDA/include -lcuda -lpthread
 *   ./host_bw_probe [SIZE_MiB [ROUNDS]]
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "probe.h"

#define CK PROBE_CK

static int g_threads;
static size_t g_size;

static char *fresh(void) { return probe_host_map(g_size); }

static void *fill_main(void *arg)
{
    probe_job_t *j = arg;
    memset(j->p, 0x5a, j->n);
    return NULL;
}

static void fill(char *p)
{
    probe_parallel(p, g_size, g_threads, fill_main);
}

/* A register of g_size bytes at p timed on a thread of its own, in ctx:
 * how long it took and whether it succeeded. */
typedef struct reg_arg {
    double ms;
    int ok;
    CUcontext ctx;
    char *p;
} reg_arg_t;

static void *reg_main(void *arg)
{
    reg_arg_t *r = arg;
    if (cuCtxSetCurrent(r->ctx) != CUDA_SUCCESS) return NULL;
    double t0 = now_ms();
    r->ok = probe_ok(cuMemHostRegister(r->p, g_size, 0), "cuMemHostRegister", __FILE__, __LINE__);
    r->ms = now_ms() - t0;
    return NULL;
}

enum { TOUCH, FILL, REGISTER };
static const char *what_name[] = {"touch", "fill", "register"};

/* One host-side job on a region of its own; returns ms. */
static double host_job(int what)
{
    char *p = fresh();
    if (what != TOUCH) probe_touch(p, g_size, g_threads);
    double t0 = now_ms();
    if (what == TOUCH) probe_touch(p, g_size, g_threads);
    else if (what == FILL) fill(p);
    else CK(cuMemHostRegister(p, g_size, 0));
    double t = now_ms() - t0;
    if (what == REGISTER) CK(cuMemHostUnregister(p));
    munmap(p, g_size);
    return t;
}

static void report(const char *name, int round, double ms, double host_ms, double copy_ms)
{
    printf("{\"name\":\"%s\",\"round\":%d,\"size_MiB\":%zu,\"threads\":%d,\"ms\":%.3f,"
           "\"GBps\":%.2f", name, round, g_size >> 20, g_threads, ms, (double)g_size / ms / 1e6);
    if (host_ms >= 0) printf(",\"host_ms\":%.3f,\"copy_ms\":%.3f", host_ms, copy_ms);
    printf("}\n");
    fflush(stdout);
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 0) : 1024;
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    g_size = mib << 20;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    g_threads = cpus > 2 ? (int)cpus - 1 : 1;
    if (g_threads > PROBE_TOUCH_MAX) g_threads = PROBE_TOUCH_MAX;
    CUdevice dev;
    CUcontext ctx;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CUdeviceptr src;
    CK(cuMemAlloc(&src, g_size));
    CK(cuMemsetD8(src, 7, g_size));
    void *pinned;
    CK(cuMemHostAlloc(&pinned, g_size, 0));
    memset(pinned, 0, g_size);
    CUstream st;
    CUevent e0, e1;
    CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    CK(cuEventCreate(&e0, 0));
    CK(cuEventCreate(&e1, 0));
    CK(cuMemcpyDtoH(pinned, src, g_size)); /* warm-up */

    for (int r = 0; r < rounds; r++) {
        /* alone */
        CK(cuEventRecord(e0, st));
        CK(cuMemcpyDtoHAsync(pinned, src, g_size, st));
        CK(cuEventRecord(e1, st));
        CK(cuEventSynchronize(e1));
        float cms = 0;
        CK(cuEventElapsedTime(&cms, e0, e1));
        report("copy", r, cms, -1, -1);
        for (int w = TOUCH; w <= REGISTER; w++) report(what_name[w], r, host_job(w), -1, -1);
        /* at once: the copy queued first, the host job started right after */
        for (int w = TOUCH; w <= REGISTER; w++) {
            char *p = fresh();
            if (w != TOUCH) probe_touch(p, g_size, g_threads);
            double t0 = now_ms();
            CK(cuEventRecord(e0, st));
            CK(cuMemcpyDtoHAsync(pinned, src, g_size, st));
            CK(cuEventRecord(e1, st));
            double h0 = now_ms();
            if (w == TOUCH) probe_touch(p, g_size, g_threads);
            else if (w == FILL) fill(p);
            else CK(cuMemHostRegister(p, g_size, 0));
            double hms = now_ms() - h0;
            CK(cuEventSynchronize(e1));
            double total = now_ms() - t0;
            float c = 0;
            CK(cuEventElapsedTime(&c, e0, e1));
            char name[32];
            snprintf(name, sizeof name, "%s+copy", what_name[w]);
            report(name, r, total, hms, c);
            if (w == REGISTER) CK(cuMemHostUnregister(p));
            munmap(p, g_size);
        }
    }
    /* touch+register: region b touched by N - 1 threads while region a
     * (touched before) is registered on a thread of its own. */
    for (int r = 0; r < rounds; r++) {
        char *a = fresh(), *b = fresh();
        probe_touch(a, g_size, g_threads);
        reg_arg_t ra = {.ctx = ctx, .p = a};
        pthread_t th;
        double t0 = now_ms();
        pthread_create(&th, NULL, reg_main, &ra);
        double h0 = now_ms();
        probe_touch(b, g_size, g_threads > 1 ? g_threads - 1 : 1);
        double tms = now_ms() - h0;
        pthread_join(th, NULL);
        double total = now_ms() - t0;
        printf("{\"name\":\"touch+register\",\"round\":%d,\"size_MiB\":%zu,\"threads\":%d,"
               "\"ms\":%.3f,\"touch_ms\":%.3f,\"register_ms\":%.3f,\"ok\":%d}\n", r, g_size >> 20,
               g_threads - 1, total, tms, ra.ms, ra.ok);
        fflush(stdout);
        if (ra.ok) CK(cuMemHostUnregister(a));
        munmap(a, g_size);
        munmap(b, g_size);
    }
    return 0;
}
