/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_share_slots.c — a server that admits any uid (GM_SHARE_ANY_UID,
 * max_peers 8) keeps slots for its own uid: a peer of another uid (nobody)
 * that connects again and again gets 6 connections and then GM_LIMIT saying
 * the rest are kept for the server's uid; with those 6 held, a process of
 * the server's own uid still connects twice and imports.  Children are made
 * before this process touches the device and take another uid (root
 * needed; skipped otherwise).
 */
// ctest-valgrind: skip
#include <grp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpumem.h"
#include "test.h"
#include "lib/procs.h"

#define MiB ((size_t)1 << 20)
#define NOBODY 65534
#define MAX_PEERS 8

static char g_path[128];

/* Connect until refused (at most 16); writes how many connected and
 * whether the refusal was GM_LIMIT naming the kept slots; holds the
 * connections until a byte comes on in; then imports through the first. */
static void kid(int in, int out, uid_t uid)
{
    if (uid != 0 && (setgroups(0, NULL) != 0 || setgid(uid) != 0 || setuid(uid) != 0)) _exit(3);
    uint64_t go;
    if (tp_get(in, &go, 600000) != 0) _exit(2);
    gm_pool_t *pool = test_pool(256 * MiB, 0);
    if (!pool) _exit(4);
    gm_share_client_t *cli[16];
    int n = 0, limit_said = 0;
    while (n < 16) {
        int rc = gm_share_connect(pool, g_path, &cli[n]);
        if (rc == GM_OK) {
            n++;
            continue;
        }
        printf("uid %u, connection %d: %s\n", (unsigned)uid, n + 1, gm_last_error());
        limit_said = rc == GM_LIMIT && strstr(gm_last_error(), "kept for its own uid") != NULL;
        break;
    }
    if (tp_put(out, (uint64_t)n) != 0 || tp_put(out, (uint64_t)limit_said) != 0) _exit(5);
    if (tp_get(in, &go, 600000) != 0) _exit(2);
    int status = 0;
    if (n > 0) {
        void *p = NULL;
        if (gm_share_import(cli[0], "w", NULL, &p, NULL, NULL) != GM_OK) status = 6;
        unsigned char b = 0;
        if (!status && (gm_memcpy(pool, &b, p, 1, NULL) != GM_OK || b != 0x5a)) status = 7;
        if (!status && gm_share_release(cli[0], p, NULL) != GM_OK) status = 8;
    }
    for (int i = 0; i < n; i++) gm_share_disconnect(cli[i]);
    gm_pool_destroy(pool);
    _exit(status);
}

static void run_kid(tp_child_fn unused, tp_link_t *l, void *uid)
{
    (void)unused;
    kid(l->in, l->out, *(uid_t *)uid);
}

/* A child (tests/lib/procs.h) that waits for the word to connect. */
static tp_kid_t spawn(uid_t uid) { return tp_spawn_with(run_kid, NULL, &uid); }

/* Let k connect; its count and whether it was refused for the kept slots. */
static int connect_all(tp_kid_t k, int *n, int *limit_said)
{
    uint64_t a = 0, b = 0;
    if (tp_put(k.to, 1) != 0 || tp_get(k.from, &a, 600000) != 0 || tp_get(k.from, &b, 600000) != 0)
        return -1;
    *n = (int)a;
    *limit_said = (int)b;
    return 0;
}

/* Let k import and end: its exit code, -1 when it did not exit. */
static int finish(tp_kid_t k) { return tp_go_and_wait(&k, 600000); }

int main(void)
{
    if (geteuid() != 0) {
        printf("skipped: taking another uid needs root\n");
        return 77;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    char dir[] = "/tmp/gm-share-slots-XXXXXX";
    REQUIRE(mkdtemp(dir) != NULL);
    REQUIRE(chmod(dir, 0755) == 0);
    snprintf(g_path, sizeof g_path, "%s/s.sock", dir);
    tp_kid_t other = spawn(NOBODY), own = spawn(0);
    REQUIRE(other.pid > 0 && own.pid > 0);

    gm_pool_t *pool = test_pool(256 * MiB, 0);
    REQUIRE(pool != NULL);
    void *buf = NULL;
    REQUIRE(gm_alloc_shareable(pool, 2 * MiB, NULL, &buf) == GM_OK);
    CHECK_OK(gm_memset(pool, buf, 0x5a, 2 * MiB, NULL));
    CHECK_OK(gm_stream_synchronize(pool, NULL));
    gm_share_policy_t pol = GM_SHARE_POLICY_INIT;
    pol.flags = GM_SHARE_ANY_UID;
    pol.max_peers = MAX_PEERS;
    gm_share_server_t *srv = NULL;
    REQUIRE(gm_share_listen(pool, g_path, &pol, &srv) == GM_OK);
    CHECK_OK(gm_share_publish(srv, "w", buf, 2 * MiB, GM_SHARE_READ_ONLY, NULL, NULL));

    int n = -1, said = 0;
    CHECK(connect_all(other, &n, &said) == 0);
    printf("another uid got %d of %d slots\n", n, MAX_PEERS);
    CHECK(n == MAX_PEERS - MAX_PEERS / 4 && said);
    /* The owner's uid still gets in, up to the slots kept for it. */
    int m = -1;
    CHECK(connect_all(own, &m, &said) == 0);
    printf("the server's own uid then got %d\n", m);
    CHECK(m == MAX_PEERS / 4);
    CHECK(finish(own) == 0);
    CHECK(finish(other) == 0);

    CHECK_OK(gm_share_close(srv));
    CHECK_OK(gm_free(pool, buf, NULL));
    gm_pool_destroy(pool);
    rmdir(dir);
    return test_summary();
}
