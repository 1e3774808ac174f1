/* SPDX-License-Identifier: Apache-2.0 */
/*
 * procs.h — the one multi-process harness of the tests and the benches
 * (tests/lib/procs.c, the static library gpumem_testprocs).  A coordinator
 * forks children that talk to it over a pair of pipes in typed messages (one
 * uint64_t each); it waits for a message or a child with a deadline that is
 * generous (TP_WAIT_MS: a hang, not a slow machine), kills a child with -9
 * at a point of its choosing, and reaps.  A child's CHECK counts come back
 * over one result pipe when it exits, and a child that is killed on purpose
 * sends each failure at once (KCHECK), so nothing it saw is lost.  Also: the
 * kernel's count of a process's descriptors and of the sim's pages it holds
 * (memfd inodes in /proc/PID/fd and /proc/PID/maps), freezing processes
 * (SIGSTOP until every thread stopped), and a raw peer of the wire format
 * that sends any bytes, malformed bodies included, through the library's
 * own send (gm__wire_send), for the hostile tests.
 *
 * A test includes test.h first: the static inline part at the end (KCHECK,
 * tp_spawn, tp_expect, tp_kill) counts in the program's own CHECK counters;
 * a bench, without test.h, uses the rest, which is in procs.c.
 */
#ifndef GM_TEST_PROCS_H
#define GM_TEST_PROCS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <unistd.h>

/* A pipe message not there in this long: the other side hung.  Generous:
 * on a GPU under a loaded ctest -j, a child's CUDA start-up alone can take
 * many seconds; only a hang should ever reach it. */
#define TP_WAIT_MS 120000
#define TP_FAIL 0xFA11u  /* the message a child sends for a failed KCHECK */

typedef struct tp_kid { pid_t pid; int to, from; int fails; } tp_kid_t; /* the parent's side */
typedef struct tp_link { int in, out; } tp_link_t;                     /* the child's side */
typedef void (*tp_child_fn)(tp_link_t *, void *);

extern int tp_kid_out; /* in a child: its pipe to the parent; -1 elsewhere */

/* ---- time and messages --------------------------------------------------- */

double tp_now_ms(void); /* CLOCK_MONOTONIC, milliseconds */
void tp_sleep_us(long us);
int tp_put(int fd, uint64_t v);          /* 0 or -1 */
int tp_get(int fd, uint64_t *v, int ms); /* one message within ms: 0, or -1 (end of file, timeout) */

/* ---- children -------------------------------------------------------------- */

/* The coordinator's result pipe: *rd is its read end (non-blocking). */
void tp_results_init(int *rd);
/* Add the counts that children sent so far to *passed and *failed. */
void tp_results_add(int rd, unsigned long *passed, unsigned long *failed);
/* In a child: send the counts, flush, _exit (1 when failed). */
void tp_child_report_exit(unsigned long passed, unsigned long failed) __attribute__((noreturn));
/* In a new child: die with the parent, close the parent's ends of every
 * other child's pipes (else their end of file never comes), forget the
 * parent's children. */
void tp_child_setup(void);
/* In a child that reports nothing (a broker, say): drop the result pipe. */
void tp_results_forget(void);

/* fork a child that runs run(fn, link, arg) (see tp_spawn); pid -1 when no
 * child could be made.  The child is killed by tp_kill_all. */
tp_kid_t tp_spawn_with(void (*run)(tp_child_fn, tp_link_t *, void *), tp_child_fn fn, void *arg);
/* Close the parent's ends of k's pipes. */
void tp_kid_close(tp_kid_t *k);
/* Wait for pid at most ms, kill it (-9) after: its wait status, or -1. */
int tp_wait(pid_t pid, int ms);
int tp_exited_ok(int st); /* exit status 0 */
/* The next message from k within ms into *v, a TP_FAIL on the way counted
 * in k->fails: 0, or -1 (none came). */
int tp_next_msg(tp_kid_t *k, uint64_t *v, int ms);
/* The next message from k is want (a TP_FAIL on the way is counted in
 * k->fails): 1, or 0 with what came on stderr. */
int tp_expect_msg(tp_kid_t *k, uint64_t want, int ms);
/* The failures k reported (TP_FAIL) so far, other messages dropped. */
int tp_fails(tp_kid_t *k);

/* Tell k to go on (a message 1), close its pipes and wait for it (ms at
 * most, tp_wait): its exit code, or -1 when it did not exit. */
int tp_go_and_wait(tp_kid_t *k, int ms);

/* What tp_kill9 saw: the kill was sent, the child reaped, its end was the
 * kill (not an exit before it), and the failures it reported. */
typedef struct tp_killed { int sent, reaped, by_kill, fails; } tp_killed_t;
tp_killed_t tp_kill9(tp_kid_t *k);

/* Run fn in a child of its own process group (the helpers it forks with
 * it) with run(fn) (see tp_role), at most ms: the counts its processes send
 * join *passed and *failed while it runs; after it the group is killed
 * (helpers that outlived it).  Its wait status, -1 when it hung (killed),
 * -2 when it could not be forked. */
int tp_role_run(const char *name, void (*run)(void (*)(void)), void (*fn)(void), int rd, int ms,
                unsigned long *passed, unsigned long *failed);

/* Add a child forked elsewhere to those tp_kill_all kills; forget one
 * reaped elsewhere. */
void tp_track(pid_t pid);
void tp_untrack(pid_t pid);

/* Kill (-9) and reap every child still running; at exit and on SIGINT,
 * SIGTERM and SIGHUP too after tp_kill_all_at_exit (for the benches). */
void tp_kill_all(void);
void tp_kill_all_at_exit(void);

/* ---- what the kernel sees ------------------------------------------------------ */

int tp_fd_count(pid_t pid); /* open descriptors of pid (-1: gone) */
/* Those whose target starts with prefix (e.g. "socket:"; NULL: all). */
int tp_fd_count_to(pid_t pid, const char *prefix);

typedef struct tp_inodes { uint64_t *v; size_t n, cap; } tp_inodes_t; /* a set */
#define TP_SIM_PAGE "/memfd:gpumem-sim-page"
/* Add the inode of every sim page (memfd) pid holds, open or mapped, to s.
 * -1 when /proc/PID is gone. */
int tp_sim_pages_of(pid_t pid, tp_inodes_t *s);
void tp_inodes_free(tp_inodes_t *s);

int tp_all_stopped(pid_t pid);                /* every thread stopped (or gone) */
int tp_freeze(const pid_t *pids, size_t n);   /* SIGSTOP them, wait until stopped: 1, or 0 */
void tp_thaw(const pid_t *pids, size_t n);    /* SIGCONT */

/* ---- a raw peer of the wire format --------------------------------------------- */

/* A SOCK_SEQPACKET connection to path (send and receive timeouts ms); -1. */
int tp_raw_connect(const char *path, int ms);
#define TP_RAW_FDS_MAX 253 /* the kernel's most descriptors in one message */
/* Send len bytes (any, not only a whole message) with nfds descriptors
 * attached (at most TP_RAW_FDS_MAX): through gm__wire_send up to the 64 it
 * takes, beyond that made here.  0 or -1. */
int tp_raw_send(int fd, const void *buf, size_t len, const int *fds, size_t nfds);
/* Receive one message into buf (len bytes at most) waiting at most ms
 * (-1: the socket's own timeout): its size (> 0), 0 when the peer closed,
 * -1 on a timeout or error.  Descriptors attached go to fds (cap of them,
 * the rest closed; fds NULL: all closed), their number in *nfds. */
ssize_t tp_raw_recv(int fd, void *buf, size_t len, int *fds, size_t cap, size_t *nfds, int ms);
/* Has the peer closed fd within ms (messages before that read and dropped)? */
int tp_raw_closed(int fd, int ms);

/* ---- the part that counts in the test program ---------------------------------- */
#ifdef GM_TEST_H

/* A CHECK in a process that may be killed: a failure also goes over its
 * pipe at once, so the coordinator counts it. */
#define KCHECK(c) TP_KILLABLE_(CHECK(c))
/* gm status check of the same kind, with the message. */
#define KCHECK_RC(expr, want) TP_KILLABLE_(CHECK_RC(expr, want))
#define TP_KILLABLE_(check)                                                    \
    do {                                                                       \
        unsigned long kf_ = test_failed_;                                      \
        check;                                                                 \
        if (test_failed_ != kf_) tp_child_failed_();                           \
    } while (0)

/* A failed KCHECK in a child: which process, and TP_FAIL to the parent. */
static inline void tp_child_failed_(void)
{
    fprintf(stderr, "  (in pid %d)\n", (int)getpid());
    if (tp_kid_out >= 0) tp_put(tp_kid_out, TP_FAIL);
}

/* In a child: report this program's counts and _exit. */
static inline void tp_child_exit(void) { tp_child_report_exit(test_passed_, test_failed_); }

static inline void tp_run_child_(tp_child_fn fn, tp_link_t *l, void *arg)
{
    test_passed_ = test_failed_ = 0;
    fn(l, arg);
    tp_child_exit();
}

/* fork a child running fn(link, arg), its counts from zero, then
 * tp_child_exit.  The caller must not have made a pool yet (a pool of the
 * parent is unusable in a fork child). */
static inline tp_kid_t tp_spawn(tp_child_fn fn, void *arg) { return tp_spawn_with(tp_run_child_, fn, arg); }

static inline void tp_role_child_(void (*fn)(void))
{
    test_passed_ = test_failed_ = 0;
    fn();
    tp_child_exit();
}

/* Run the role fn in a process of its own (tp_role_run, at most ms), the
 * counts of all its processes joining this program's; CHECK that it was
 * forked and exited 0, and print how long it took. */
static inline void tp_role(const char *name, void (*fn)(void), int rd, int ms)
{
    double t0 = tp_now_ms();
    int st = tp_role_run(name, tp_role_child_, fn, rd, ms, &test_passed_, &test_failed_);
    CHECK(st != -2);
    if (st == -2) return;
    if (!tp_exited_ok(st)) fprintf(stderr, "%s: the role process ended with status %#x\n", name, st);
    CHECK(tp_exited_ok(st));
    printf("%s: %.2f s\n", name, (tp_now_ms() - t0) / 1e3);
    fflush(stdout);
}

/* The counts children sent so far join this program's. */
static inline void tp_results_drain(int rd) { tp_results_add(rd, &test_passed_, &test_failed_); }

/* The next message from k within ms (tp_next_msg); UINT64_MAX, with a
 * failed CHECK, when none came. */
static inline uint64_t tp_answer(tp_kid_t *k, int ms)
{
    uint64_t v = 0;
    if (tp_next_msg(k, &v, ms) == 0) return v;
    fprintf(stderr, "no answer from pid %d\n", (int)k->pid);
    CHECK(!"an answer");
    return UINT64_MAX;
}

/* CHECK that k's next message (within ms) is done and that it then exits 0
 * (TP_WAIT_MS at most); its pipes closed. */
static inline void tp_finish(tp_kid_t *k, uint64_t done, int ms)
{
    CHECK(tp_answer(k, ms) == done);
    CHECK(tp_exited_ok(tp_wait(k->pid, TP_WAIT_MS)));
    tp_kid_close(k);
}

/* CHECK that the next message from k is want. */
static inline int tp_expect(tp_kid_t *k, uint64_t want)
{
    int ok = tp_expect_msg(k, want, TP_WAIT_MS);
    CHECK(ok);
    return ok;
}

/* Kill k (-9) and reap it, CHECKing each step; its reported failures count.
 * Then its pipes are closed. */
static inline void tp_kill(tp_kid_t *k)
{
    tp_killed_t r = tp_kill9(k);
    CHECK(r.sent);
    CHECK(r.reaped);
    CHECK(r.by_kill);
    CHECK(r.fails == 0);
    tp_kid_close(k);
}
#endif /* GM_TEST_H */

#endif /* GM_TEST_PROCS_H */
