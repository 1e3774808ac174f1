/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_share_uid.c — who may connect: peers of another user, checked by the
 * socket file's mode and by the server's SO_PEERCRED policy.  Children made
 * with fork() before this process touches the device take another uid/gid
 * (so this needs root; skipped otherwise) and make pools of their own:
 *   - uid nobody against the default policy (socket 0600): GM_DENIED;
 *   - against allow_gid G (socket 0660, group G): a peer whose primary gid is
 *     G is admitted and imports; one that reaches the socket through a
 *     supplementary group G but whose primary gid is not G passes the file's
 *     mode and is refused by the server's policy: GM_DENIED with the reason,
 *     counted in peers_refused, no descriptor.
 */
// ctest-valgrind: skip
#include <grp.h>
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
#define GROUP_G 54321
#define GROUP_H 54322

/* In the child: become uid NOBODY with primary gid `gid` and, when sup >= 0,
 * the supplementary group sup; connect to path and import "w".  Exit codes:
 * 10 + the connect status, or 50 + the import status, or 0 when imported. */
static void child(const char *path, gid_t gid, long sup, const char *expect_text)
{
    gid_t groups[1] = {(gid_t)sup};
    if (setgroups(sup >= 0 ? 1 : 0, groups) != 0 || setgid(gid) != 0 || setuid(NOBODY) != 0)
        _exit(3);
    gm_pool_t *pool = test_pool(256 * MiB, 0);
    if (!pool) _exit(4);
    gm_share_client_t *cli = NULL;
    int rc = gm_share_connect(pool, path, &cli);
    if (rc != GM_OK) {
        if (expect_text && !strstr(gm_last_error(), expect_text)) {
            fprintf(stderr, "child: refusal without '%s': %s\n", expect_text, gm_last_error());
            _exit(5);
        }
        _exit(10 + rc);
    }
    void *p = NULL;
    rc = gm_share_import(cli, "w", NULL, &p, NULL, NULL);
    if (rc != GM_OK) _exit(50 + rc);
    unsigned char b = 0;
    if (gm_memcpy(pool, &b, p, 1, NULL) != GM_OK || b != 0x33) _exit(6);
    if (gm_share_release(cli, p, NULL) != GM_OK || gm_share_disconnect(cli) != GM_OK) _exit(7);
    gm_pool_destroy(pool);
    _exit(0);
}

/* A child made before this process touches the device (a CUDA context does
 * not survive fork()): it waits for the word on its pipe, then runs child(). */
typedef struct kid_arg { const char *path; gid_t gid; long sup; const char *expect_text; } kid_arg_t;

static void run_kid(tp_child_fn unused, tp_link_t *l, void *argp)
{
    (void)unused;
    kid_arg_t *a = argp;
    uint64_t go;
    if (tp_get(l->in, &go, 600000) != 0) _exit(2);
    child(a->path, a->gid, a->sup, a->expect_text);
}

static tp_kid_t spawn(const char *path, gid_t gid, long sup, const char *expect_text)
{
    kid_arg_t a = {path, gid, sup, expect_text};
    return tp_spawn_with(run_kid, NULL, &a);
}

/* Let k go and wait for it: its exit code, -1 when it did not exit. */
static int run(tp_kid_t k) { return tp_go_and_wait(&k, 600000); }

int main(void)
{
    if (geteuid() != 0) {
        printf("skipped: taking another uid needs root\n");
        return 77;
    }
    char dir[] = "/tmp/gm-share-uid-XXXXXX";
    REQUIRE(mkdtemp(dir) != NULL);
    REQUIRE(chmod(dir, 0755) == 0); /* the directory is no obstacle; the socket is */
    char p1[128], p2[128];
    snprintf(p1, sizeof p1, "%s/default.sock", dir);
    snprintf(p2, sizeof p2, "%s/group.sock", dir);

    tp_kid_t other = spawn(p1, NOBODY, -1, NULL);
    tp_kid_t member = spawn(p2, GROUP_G, -1, NULL);
    tp_kid_t sup_only = spawn(p2, GROUP_H, GROUP_G, "may not connect");

    gm_pool_t *pool = test_pool(256 * MiB, 0);
    REQUIRE(pool != NULL);
    void *buf = NULL;
    REQUIRE(gm_alloc_shareable(pool, 4 * MiB, NULL, &buf) == GM_OK);
    CHECK_OK(gm_memset(pool, buf, 0x33, 4 * MiB, NULL));
    gm_share_server_t *s1 = NULL, *s2 = NULL;
    REQUIRE(gm_share_listen(pool, p1, NULL, &s1) == GM_OK);
    gm_share_policy_t pol = GM_SHARE_POLICY_INIT;
    pol.allow_gid = GROUP_G;
    REQUIRE(gm_share_listen(pool, p2, &pol, &s2) == GM_OK);
    struct stat st1, st2;
    CHECK(stat(p1, &st1) == 0 && (st1.st_mode & 0777) == 0600);
    CHECK(stat(p2, &st2) == 0 && (st2.st_mode & 0777) == 0660 && st2.st_gid == GROUP_G);
    CHECK_OK(gm_share_publish(s1, "w", buf, 4 * MiB, GM_SHARE_READ_ONLY, NULL, NULL));
    CHECK_OK(gm_share_publish(s2, "w", buf, 4 * MiB, GM_SHARE_READ_ONLY, NULL, NULL));

    /* Another user, default policy: the socket's mode stops it. */
    CHECK(run(other) == 10 + GM_DENIED);
    /* Primary gid G: admitted, imports, reads. */
    CHECK(run(member) == 0);
    /* Through a supplementary group only: the file lets it in, the policy
     * (the peer's credentials: uid and primary gid) does not. */
    gm_share_stats_t before = GM_SHARE_STATS_INIT, after = GM_SHARE_STATS_INIT;
    CHECK_OK(gm_share_stats(pool, &before));
    CHECK(run(sup_only) == 10 + GM_DENIED);
    CHECK_OK(gm_share_stats(pool, &after));
    CHECK(after.peers_refused == before.peers_refused + 1);
    CHECK(after.exported_bytes == 0 && after.imports == 0);

    CHECK_OK(gm_share_close(s1));
    CHECK_OK(gm_share_close(s2));
    CHECK_OK(gm_free(pool, buf, NULL));
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
    rmdir(dir);
    return test_summary();
}
