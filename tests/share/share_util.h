/* SPDX-License-Identifier: Apache-2.0 */
/*
 * share_util.h — what the multi-process sharing tests share: a monotonic clock, sleeps, a bounded wait, and the count of
 * this process's open descriptors (the leak check of every fault test).
 */
#ifndef GM_TEST_SHARE_UTIL_H
#define GM_TEST_SHARE_UTIL_H

#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "../test.h" /* rng_next */
#include "../lib/procs.h"

static inline double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static inline void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

static inline void sleep_ms(long ms) { sleep_us(ms * 1000); }

/* Wait until cond holds, at most ms milliseconds. */
#define WAIT_FOR(cond, ms)                                                     \
    do {                                                                       \
        double w0_ = now_ms();                                                 \
        while (!(cond) && now_ms() - w0_ < (ms)) sleep_us(1000);               \
    } while (0)

/* Open descriptors of this process; on cuda its sockets only: the driver
 * opens descriptors of its own when it likes (a leak of the sharing code's
 * pages shows on the sim, where a page is a descriptor). */
static inline int fd_count(void)
{
    const char *be = getenv("GPUMEM_BACKEND");
    if (be && !strcmp(be, "cuda")) return tp_fd_count_to(getpid(), "socket:");
    int n = tp_fd_count(getpid());
    return n < 0 ? n : n - 1; /* the listing's own descriptor */
}

#ifdef GPUMEM_H
/* The bytes the sharing tests write: byte i of a buffer tagged `tag`. */
static inline unsigned char sh_pat(unsigned tag, size_t i)
{
    return (unsigned char)(tag * 29u + i * 7u + (i >> 12) * 13u);
}

/* Device [dst, +n) := pattern tag from index off0. */
static inline int sh_fill(gm_pool_t *p, void *dst, unsigned tag, size_t off0, size_t n)
{
    unsigned char *h = malloc(n);
    if (!h) return GM_NO_HOST_MEMORY;
    for (size_t i = 0; i < n; i++) h[i] = sh_pat(tag, off0 + i);
    int rc = gm_memcpy(p, dst, h, n, NULL);
    if (rc == GM_OK) rc = gm_stream_synchronize(p, NULL);
    free(h);
    return rc;
}

/* Device [src, +n) holds pattern tag from index off0 (1), or not (0, the
 * first byte that differs on stderr). */
static inline int sh_same(gm_pool_t *p, const void *src, unsigned tag, size_t off0, size_t n)
{
    unsigned char *h = malloc(n);
    if (!h) return 0;
    int ok = gm_memcpy(p, h, src, n, NULL) == GM_OK && gm_stream_synchronize(p, NULL) == GM_OK;
    size_t bad = n;
    for (size_t i = 0; ok && i < n; i++)
        if (h[i] != sh_pat(tag, off0 + i)) {
            ok = 0;
            bad = i;
        }
    if (!ok && bad < n)
        fprintf(stderr, "pid %d: byte %zu of %p is %#x, want %#x\n", (int)getpid(), bad, src,
                h[bad], sh_pat(tag, off0 + bad));
    free(h);
    return ok;
}

/* gm_share_listen with the new server's thread on a CPU of its own (it
 * inherits this thread's CPUs when it starts) and this thread, after, on
 * another, when there are two: a race between the two then runs truly at
 * the same time.  *all: this thread's CPUs before (to restore); *split: 1
 * when pinned so.  Returns gm_share_listen's status. */
static inline int sh_listen_apart(gm_pool_t *pool, const char *path, gm_share_server_t **srv,
                                  cpu_set_t *all, int *split)
{
    cpu_set_t one;
    int cpus[2] = {-1, -1}, nc = 0;
    if (sched_getaffinity(0, sizeof *all, all) == 0)
        for (int c = 0; c < CPU_SETSIZE && nc < 2; c++)
            if (CPU_ISSET(c, all)) cpus[nc++] = c;
    *split = nc == 2;
    if (*split) {
        CPU_ZERO(&one);
        CPU_SET(cpus[1], &one);
        sched_setaffinity(0, sizeof one, &one);
    }
    int rc = gm_share_listen(pool, path, NULL, srv);
    if (*split) {
        CPU_ZERO(&one);
        CPU_SET(cpus[0], &one);
        sched_setaffinity(0, sizeof one, &one);
    }
    return rc;
}
#endif

#endif /* GM_TEST_SHARE_UTIL_H */
