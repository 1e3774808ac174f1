/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_broker_scrub.c — a page the broker leases again does not carry its
 * last holder's data to another tenant.  One process fills 32 MiB with a
 * pattern, frees it and gives the pages back; the next process leases the
 * same pages and reads them:
 *   scrub = always   every byte is zero (the pages are zeroed at each lease);
 *   scrub = never    the pattern is still there (so the check can fail);
 *   scrub = tenant   (the default) the same tenant gets its own data back
 *                    unzeroed, at no cost.
 * (Two tenants need two uids: with a single uid, "always" stands in for a
 * change of tenant, which takes the same path.)  Every process is forked
 * before any touches the device.
 */
#include "test.h"
#include "broker_util.h"

#define SIZE (32 * MiB)

/* Fill SIZE bytes with 0xa5, free, give the pages back: exit 0 when done. */
static int writer(const test_broker_t *b)
{
    gm_pool_t *pool;
    void *p;
    if (tb_pool(b, SIZE, &pool) != GM_OK || gm_alloc(pool, SIZE, NULL, &p) != GM_OK) return 1;
    if (gm_memset(pool, p, 0xa5, SIZE, NULL) != GM_OK || gm_stream_synchronize(pool, NULL) != GM_OK)
        return 1;
    if (gm_free(pool, p, NULL) != GM_OK || gm_trim(pool, 0, NULL) != GM_OK) return 1;
    gm_pool_destroy(pool);
    return 0;
}

/* Lease SIZE bytes and count the bytes that are not zero: exit status 0,
 * the count on the pipe. */
static int reader(const test_broker_t *b, int out)
{
    gm_pool_t *pool;
    void *p;
    if (tb_pool(b, SIZE, &pool) != GM_OK || gm_alloc(pool, SIZE, NULL, &p) != GM_OK) return 1;
    unsigned char *h = malloc(SIZE);
    if (!h || gm_memcpy(pool, h, p, SIZE, NULL) != GM_OK || gm_stream_synchronize(pool, NULL) != GM_OK)
        return 1;
    unsigned long long nonzero = 0;
    for (size_t i = 0; i < SIZE; i++) nonzero += h[i] != 0;
    free(h);
    gm_pool_destroy(pool);
    return write(out, &nonzero, sizeof nonzero) == sizeof nonzero ? 0 : 1;
}

static int run_child(int (*fn)(const test_broker_t *, int), const test_broker_t *b, int out)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) _exit(fn(b, out));
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static int writer_fn(const test_broker_t *b, int out) { (void)out; return writer(b); }

/* Bytes the reader finds not zero after the writer, under `scrub`. */
static long long after_writer(const char *scrub)
{
    test_broker_t b;
    tb_init(&b);
    char extra[64];
    snprintf(extra, sizeof extra, "scrub = %s\n", scrub);
    tb_config(&b, "64MiB", extra);
    tb_start(&b);
    int pfd[2];
    long long n = -1;
    if (pipe(pfd) == 0) {
        CHECK(run_child(writer_fn, &b, -1) == 0);
        char tenant[64];
        snprintf(tenant, sizeof tenant, "uid:%u", (unsigned)geteuid());
        WAIT_FOR(tb_tenant(&b, tenant).used == 0, 2000);
        CHECK(tb_tenant(&b, tenant).used == 0);
        CHECK(run_child(reader, &b, pfd[1]) == 0);
        unsigned long long got;
        if (read(pfd[0], &got, sizeof got) == sizeof got) n = (long long)got;
        close(pfd[0]);
        close(pfd[1]);
    }
    CHECK(tb_stop(&b, SIGTERM) == 0);
    tb_cleanup(&b);
    return n;
}

int main(void)
{
    long long always = after_writer("always");
    long long never = after_writer("never");
    long long tenant = after_writer("tenant");
    printf("bytes not zero in a lease after another process's data: always %lld, never %lld, "
           "tenant (the same tenant) %lld, of %zu\n", always, never, tenant, SIZE);
    CHECK(always == 0);
    CHECK(never == (long long)SIZE);
    CHECK(tenant == (long long)SIZE);
    return test_summary();
}
