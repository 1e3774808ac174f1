/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_broker_zero.c — the broker's one thread does not zero pages while
 * clients wait on it when it need not (issue 42: under a burst of 48
 * processes of one tenant on a loaded 2-core machine, some got "broker: no
 * answer in 10 s"; the loop zeroed every new page before its first lease,
 * 64 MiB per process, on the host for the sim).
 *
 *   fresh    on the sim a new page is a new memfd, zero by the kernel: a
 *            process leases 64 MiB of new pages and reads zeros, and the
 *            broker zeroed nothing (its stats file's "scrubbed" stays 0;
 *            it was 64 MiB).  On cuda new pages are still zeroed, so this
 *            part only reads.
 *   idle     scrub = always: a process fills 32 MiB, frees it and gives the
 *            pages back; with no one asking, the broker zeroes those free
 *            pages between requests ("scrubbed" reaches 32 MiB with no
 *            lease; it stayed 0 until the next lease); the next process
 *            reads zeros and its lease zeroes nothing more.
 *   burst    48 processes of one tenant each lease 64 MiB at once: every
 *            one is served, and on the sim the broker zeroed nothing.
 *
 * Every process is forked before any touches the device.  Waits are for
 * the stats file to say so, with deadlines far above what they take.
 */
#include "test.h"
#include "broker_util.h"

#define FRESH (64 * MiB)
#define SIZE (32 * MiB)
#define BURST 48

#define REQUIRE_V(cond)                                                        \
    do {                                                                       \
        CHECK(cond);                                                           \
        if (!(cond)) return;                                                   \
    } while (0)

static bool on_sim(void)
{
    const char *e = getenv("GPUMEM_BACKEND");
    return !e || strcmp(e, "cuda") != 0;
}

/* A number of the broker's stats file ("key": N); -1 when not there. */
static long long stat_of(const test_broker_t *b, const char *key)
{
    char buf[8192], pat[64];
    FILE *f = fopen(b->stats, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(buf, pat);
    return p ? strtoll(p + strlen(pat), NULL, 10) : -1;
}

/* Lease size bytes, count the bytes not zero among the first `check`
 * (written to out), keep the pages until told (a byte on hold) when
 * hold >= 0. */
static int reader_n(const test_broker_t *b, size_t size, size_t check, int out, int hold)
{
    gm_pool_t *pool;
    void *p;
    if (tb_pool(b, size, &pool) != GM_OK || gm_alloc(pool, size, NULL, &p) != GM_OK) {
        fprintf(stderr, "reader: %s\n", gm_last_error());
        return 1;
    }
    unsigned long long nonzero = 0;
    if (check) {
        unsigned char *h = malloc(check);
        if (!h || gm_memcpy(pool, h, p, check, NULL) != GM_OK ||
            gm_stream_synchronize(pool, NULL) != GM_OK)
            return 1;
        for (size_t i = 0; i < check; i++) nonzero += h[i] != 0;
        free(h);
    }
    if (write(out, &nonzero, sizeof nonzero) != sizeof nonzero) return 1;
    char c;
    if (hold >= 0 && read(hold, &c, 1) != 1) return 1;
    gm_pool_destroy(pool);
    return 0;
}

static int reader(const test_broker_t *b, size_t size, int out, int hold)
{
    return reader_n(b, size, size, out, hold);
}

/* Fill SIZE bytes with 0xa5, wait for a byte on hold, free, give the pages
 * back. */
static int writer(const test_broker_t *b, int hold)
{
    gm_pool_t *pool;
    void *p;
    if (tb_pool(b, SIZE, &pool) != GM_OK || gm_alloc(pool, SIZE, NULL, &p) != GM_OK) return 1;
    if (gm_memset(pool, p, 0xa5, SIZE, NULL) != GM_OK || gm_stream_synchronize(pool, NULL) != GM_OK)
        return 1;
    char c;
    if (read(hold, &c, 1) != 1) return 1;
    if (gm_free(pool, p, NULL) != GM_OK || gm_trim(pool, 0, NULL) != GM_OK) return 1;
    gm_pool_destroy(pool);
    return 0;
}

static int wait_child(pid_t pid)
{
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* A reader of size bytes (reader) forked on the pipes pfd and hold: it
 * read only zeros.  Its pid; it holds its pages until a byte on hold. */
static pid_t read_zeros(const test_broker_t *b, size_t size, const int pfd[2], const int hold[2])
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) _exit(reader(b, size, pfd[1], hold[0]));
    unsigned long long nonzero = ~0ull;
    CHECK(read(pfd[0], &nonzero, sizeof nonzero) == sizeof nonzero);
    CHECK(nonzero == 0);
    return pid;
}

/* Let the reader pid go (a byte on hold) and see it exit 0. */
static void release(pid_t pid, const int hold[2])
{
    CHECK(write(hold[1], "x", 1) == 1);
    CHECK(wait_child(pid) == 0);
}

/* The pipes closed, the broker stopped and its directory gone. */
static void finish(test_broker_t *b, const int pfd[2], const int hold[2])
{
    close(pfd[0]);
    close(pfd[1]);
    close(hold[0]);
    close(hold[1]);
    CHECK(tb_stop(b, SIGTERM) == 0);
    tb_cleanup(b);
}

static void fresh(void)
{
    test_broker_t b;
    tb_init(&b);
    tb_config(&b, "256MiB", "keep_free = 256MiB\n");
    tb_start(&b);
    int pfd[2], hold[2];
    REQUIRE_V(pipe(pfd) == 0 && pipe(hold) == 0);
    pid_t pid = read_zeros(&b, FRESH, pfd, hold);
    /* The stats file is rewritten within a second of a change. */
    WAIT_FOR(stat_of(&b, "leased") >= (long long)FRESH, 30000);
    CHECK(stat_of(&b, "leased") >= (long long)FRESH);
    long long zeroed = stat_of(&b, "scrubbed");
    printf("fresh: a lease of %zu MiB of new pages; the broker zeroed %lld MiB\n", FRESH / MiB,
           zeroed / (long long)MiB);
    if (on_sim()) CHECK(zeroed == 0);
    release(pid, hold);
    finish(&b, pfd, hold);
}

static void idle(void)
{
    test_broker_t b;
    tb_init(&b);
    tb_config(&b, "256MiB", "scrub = always\nkeep_free = 256MiB\n");
    tb_start(&b);
    int wh[2];
    REQUIRE_V(pipe(wh) == 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) _exit(writer(&b, wh[0]));
    /* What was zeroed up to the writer's lease (its new pages, on cuda). */
    WAIT_FOR(stat_of(&b, "leased") >= (long long)SIZE, 30000);
    CHECK(stat_of(&b, "leased") >= (long long)SIZE);
    long long before = stat_of(&b, "scrubbed");
    release(pid, wh);
    close(wh[0]);
    close(wh[1]);
    char tenant[64];
    snprintf(tenant, sizeof tenant, "uid:%u", (unsigned)geteuid());
    WAIT_FOR(tb_tenant(&b, tenant).used == 0, 30000);
    CHECK(tb_tenant(&b, tenant).used == 0);
    /* No one asks for anything now: the free pages get zeroed meanwhile. */
    WAIT_FOR(stat_of(&b, "scrubbed") >= before + (long long)SIZE, 60000);
    long long zeroed = stat_of(&b, "scrubbed");
    printf("idle: %zu MiB given back; zeroed with no lease waiting: %lld MiB\n", SIZE / MiB,
           (zeroed - before) / (long long)MiB);
    CHECK(zeroed >= before + (long long)SIZE);
    int pfd[2], hold[2];
    REQUIRE_V(pipe(pfd) == 0 && pipe(hold) == 0);
    pid = read_zeros(&b, SIZE, pfd, hold);
    /* While the reader holds its pages (they are not zeroed again until it
     * gives them back): the file that shows its lease shows any zeroing
     * the lease did. */
    WAIT_FOR(stat_of(&b, "leased") >= (long long)SIZE, 30000);
    long long after = stat_of(&b, "scrubbed");
    printf("idle: the next lease of %zu MiB zeroed %lld MiB more\n", SIZE / MiB,
           (after - zeroed) / (long long)MiB);
    CHECK(stat_of(&b, "leased") >= (long long)SIZE);
    CHECK(after == zeroed);
    release(pid, hold);
    finish(&b, pfd, hold);
}

static void burst(void)
{
    test_broker_t b;
    tb_init(&b);
    char cap[32];
    snprintf(cap, sizeof cap, "%zuMiB", (size_t)BURST * 64 + 256);
    tb_config(&b, cap, "keep_free = 0\n");
    tb_start(&b);
    int pfd[2], hold[2];
    REQUIRE_V(pipe(pfd) == 0 && pipe(hold) == 0);
    pid_t pids[BURST];
    fflush(NULL);
    for (int i = 0; i < BURST; i++) {
        pids[i] = fork();
        if (pids[i] == 0) _exit(reader_n(&b, 64 * MiB, MiB, pfd[1], hold[0]));
    }
    int served = 0;
    for (int i = 0; i < BURST; i++) {
        unsigned long long nonzero = ~0ull;
        if (read(pfd[0], &nonzero, sizeof nonzero) == sizeof nonzero && nonzero == 0) served++;
    }
    WAIT_FOR(stat_of(&b, "leased") >= (long long)(BURST * 64 * MiB), 30000);
    long long zeroed = stat_of(&b, "scrubbed");
    for (int i = 0; i < BURST; i++) CHECK(write(hold[1], "x", 1) == 1);
    int ok = 0;
    for (int i = 0; i < BURST; i++) ok += wait_child(pids[i]) == 0;
    printf("burst: %d processes of one tenant at once: %d served (zeros read), %d exited 0; "
           "the broker zeroed %lld MiB\n", BURST, served, ok, zeroed / (long long)MiB);
    CHECK(served == BURST);
    CHECK(ok == BURST);
    if (on_sim()) CHECK(zeroed == 0);
    finish(&b, pfd, hold);
}

int main(void)
{
    fresh();
    idle();
    burst();
    return test_summary();
}
