/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lock.h — the pool lock: a three-state futex mutex (0 free, 1 held,
 * 2 held with sleepers).  Taking a free lock is one atomic exchange and
 * releasing an uncontended one is one exchange, about half the cost of a
 * pthread mutex on the allocation hot path; a contended waiter spins briefly,
 * then sleeps in the kernel, so a lock held across a slow backend call
 * (mapping pages) costs the waiters no CPU.
 */
#ifndef GM_LOCK_H
#define GM_LOCK_H

#include <linux/futex.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/internal.h"

typedef struct gm__lock {
    _Atomic int state;
} gm__lock_t;

#define GM__LOCK_INIT { 0 }

static inline void gm__futex(_Atomic int *addr, int op, int val)
{
    syscall(SYS_futex, (int *)addr, op | FUTEX_PRIVATE_FLAG, val, NULL, NULL, 0);
}

static inline void gm__lock_slow(gm__lock_t *l)
{
    for (int i = 0; i < 100; i++) {
        int expect = 0;
        if (atomic_load_explicit(&l->state, memory_order_relaxed) == 0 &&
            atomic_compare_exchange_weak_explicit(&l->state, &expect, 1, memory_order_acquire,
                                                  memory_order_relaxed))
            return;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
    /* Announce a sleeper (2) and sleep while it stays held. */
    while (atomic_exchange_explicit(&l->state, 2, memory_order_acquire) != 0)
        gm__futex(&l->state, FUTEX_WAIT, 2);
}

static inline void gm__lock(gm__lock_t *l)
{
    int expect = 0;
    if (GM_LIKELY(atomic_compare_exchange_strong_explicit(&l->state, &expect, 1,
                                                          memory_order_acquire,
                                                          memory_order_relaxed)))
        return;
    gm__lock_slow(l);
}

static inline void gm__unlock(gm__lock_t *l)
{
    if (GM_UNLIKELY(atomic_exchange_explicit(&l->state, 0, memory_order_release) == 2))
        gm__futex(&l->state, FUTEX_WAKE, 1);
}

#endif /* GM_LOCK_H */
