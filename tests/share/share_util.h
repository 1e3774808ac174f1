/* SPDX-License-Identifier: Apache-2.0 */
/*
 * share_util.h — what the multi-process sharing tests share: a monotonic clock, sleeps, a bounded wait, and the count of
 * this process's open descriptors (the leak check of every fault test).
 */
#ifndef GM_TEST_SHARE_UTIL_H
#define GM_TEST_SHARE_UTIL_H

#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <time.h>

#include "../test.h" /* rng_next */

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

/* Open descriptors of this process (the directory's own one not counted). */
static inline int fd_count(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) if (e->d_name[0] != '.') n++;
    closedir(d);
    return n - 1;
}

#endif /* GM_TEST_SHARE_UTIL_H */
