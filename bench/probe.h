/* SPDX-License-Identifier: Apache-2.0 */
/*
 * probe.h — what the driver probes (vmm_probe.c, host_pin_probe.c,
 * host_bw_probe.c) share: a clock, a failed-call report, fresh host memory
 * and touching it with many threads, and the allocation properties of
 * device pages.  Header only; the probes
 * are built alone (see each file's head), not by the project's build.
 */
#ifndef GM_BENCH_PROBE_H
#define GM_BENCH_PROBE_H

#include <cuda.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

#define PROBE_TOUCH_MAX 64

static inline double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* r is CUDA_SUCCESS; else the call (expr, at file:line) is reported on
 * stderr and false returned. */
static inline bool probe_ok(CUresult r, const char *expr, const char *file, int line)
{
    if (r == CUDA_SUCCESS) return true;
    const char *s = NULL;
    cuGetErrorString(r, &s);
    fprintf(stderr, "%s:%d %s: %s\n", file, line, expr, s ? s : "?");
    return false;
}

/* A failed driver call ends the probe (for probes with nothing to go on to). */
#define PROBE_CK(x)                                                                        \
    do {                                                                                   \
        if (!probe_ok((x), #x, __FILE__, __LINE__)) exit(1);                               \
    } while (0)

/* A slice of host memory for one thread of probe_parallel. */
typedef struct probe_job {
    char *p;
    size_t n;
} probe_job_t;

/* Run fn on [p, p + n) cut into `threads` slices of whole 2 MiB (the
 * caller takes the first, and any a thread could not be started for). */
static inline void probe_parallel(char *p, size_t n, int threads, void *(*fn)(void *))
{
    pthread_t th[PROBE_TOUCH_MAX];
    probe_job_t job[PROBE_TOUCH_MAX] = {{NULL, 0}};
    bool started[PROBE_TOUCH_MAX] = {false};
    if (threads < 1) threads = 1;
    if (threads > PROBE_TOUCH_MAX) threads = PROBE_TOUCH_MAX;
    size_t slice = (n / (size_t)threads + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1);
    for (int i = 0; i < threads; i++) {
        size_t lo = (size_t)i * slice < n ? (size_t)i * slice : n;
        size_t hi = lo + slice < n ? lo + slice : n;
        job[i] = (probe_job_t){p + lo, hi - lo};
        if (i > 0 && job[i].n) started[i] = pthread_create(&th[i], NULL, fn, &job[i]) == 0;
    }
    for (int i = 0; i < threads; i++)
        if (i == 0 || !started[i]) fn(&job[i]);
    for (int i = 1; i < threads; i++)
        if (started[i]) pthread_join(th[i], NULL);
}

static void *probe_touch_main(void *arg)
{
    probe_job_t *j = arg;
    for (size_t o = 0; o < j->n; o += 4096) ((volatile char *)j->p)[o] = 1;
    return NULL;
}

/* Write one byte of every 4 KiB of [p, p + n) with `threads` threads. */
static inline void probe_touch(char *p, size_t n, int threads)
{
    probe_parallel(p, n, threads, probe_touch_main);
}

/* n bytes of fresh anonymous host memory, transparent huge pages asked
 * for; the probe ends when it cannot be mapped. */
static inline char *probe_host_map(size_t n)
{
    char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    (void)madvise(p, n, MADV_HUGEPAGE);
    return p;
}

/* Properties of pinned device memory of dev (cuMemCreate). */
static inline CUmemAllocationProp probe_device_prop(CUdevice dev)
{
    CUmemAllocationProp p = {0};
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = (int)dev;
    return p;
}

#endif /* GM_BENCH_PROBE_H */
