/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_share_fake_page.c — a same-uid share server that sends something
 * other than a page (issue 42, finding 8).  On the sim a page is a memfd;
 * an importer that took any regular file of the page's size was killed by
 * SIGBUS once the sender cut the file short after the import.  The sim
 * imports only its own pages now: memfds sealed against shrinking and
 * growing, as phys_create makes them.
 *
 * A fake server (a thread speaking the wire format of src/share/share.h)
 * publishes one page, and on PAGES attaches a descriptor of each kind:
 *   regular    a regular file of the page's size
 *   unsealed   a memfd of the page's size, no seals
 *   grow-only  a memfd sealed against growing only
 *   sealed     a memfd sealed against shrinking and growing (the control:
 *              the fake server itself is right, so the refusals above are
 *              the seals' doing)
 * Each case runs in a child process: gm_share_import, then the sender
 * truncates what it sent to 0 bytes, then the importer reads the import if
 * it has one.  The first three: the import is refused with
 * GM_INVALID_ARGUMENT saying it is not a page of the sim, and the process
 * lives on (its pool still allocates; gm_pool_check passes).  The control:
 * the import works and reads the bytes the server wrote; its truncation
 * fails (the seal), and the read after it works.  The sim only (a GPU
 * driver checks its own handles).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpumem.h"
#include "share/share.h"
#include "base/wire.h"
#include "test.h"
#include "share_util.h"

enum { K_REGULAR, K_UNSEALED, K_GROW_ONLY, K_SEALED, K_COUNT };
static const char *const kind_name[K_COUNT] = {"regular", "unsealed", "grow-only", "sealed"};

#define FILL 0x5a

typedef struct fake {
    int lfd;
    int page_fd;     /* what PAGES sends (the sender keeps it to truncate) */
    size_t page;
    int device;
} fake_t;

static int reply(int fd, gm__share_msg_t *m, const int *fds, size_t nfds)
{
    m->magic = GM__SHARE_MAGIC;
    m->version = GM__SHARE_VERSION;
    m->type = GM__SHARE_REPLY;
    m->status = GM_OK;
    m->nfds = (uint32_t)nfds;
    return gm__wire_send(fd, m, sizeof *m, fds, nfds, 0, "fake");
}

/* One connection: greet, then answer IMPORT and PAGES until it closes. */
static void *fake_main(void *arg)
{
    fake_t *f = arg;
    int c = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0) return NULL;
    gm__share_msg_t m;
    memset(&m, 0, sizeof m);
    m.pid = getpid();
    if (reply(c, &m, NULL, 0) != GM_OK) goto out;
    for (;;) {
        gm__share_msg_t q;
        size_t nfds = 0;
        bool closed = false;
        if (gm__wire_recv(c, &q, sizeof q, NULL, 0, &nfds, &closed, 30, "fake") != GM_OK) break;
        memset(&m, 0, sizeof m);
        if (q.type == GM__SHARE_IMPORT) {
            m.id = 1;
            m.size = f->page;
            m.offset = 0;
            m.page_size = f->page;
            m.npages = 1;
            m.device = f->device;
            m.access = GM_SHARE_READ_WRITE;
            m.nranges = 1;
            if (reply(c, &m, NULL, 0) != GM_OK) break;
        } else if (q.type == GM__SHARE_PAGES) {
            m.id = q.id;
            m.first = q.first;
            m.count = q.count;
            if (reply(c, &m, &f->page_fd, 1) != GM_OK) break;
        } else if (q.type == GM__SHARE_RELEASE) {
            continue;
        } else {
            break;
        }
    }
out:
    close(c);
    return NULL;
}

/* The descriptor of `kind`, page bytes of FILL; -1 on failure. */
static int make_page(int kind, size_t page, char *tmpl)
{
    int fd;
    if (kind == K_REGULAR) {
        fd = mkstemp(tmpl);
        if (fd >= 0) unlink(tmpl);
    } else {
        fd = memfd_create("fake-page", MFD_CLOEXEC | (kind == K_UNSEALED ? 0 : MFD_ALLOW_SEALING));
    }
    if (fd < 0) return -1;
    if (ftruncate(fd, (off_t)page) != 0) goto bad;
    unsigned char *p = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) goto bad;
    memset(p, FILL, page);
    munmap(p, page);
    if (kind == K_GROW_ONLY && fcntl(fd, F_ADD_SEALS, F_SEAL_GROW) != 0) goto bad;
    if (kind == K_SEALED && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) goto bad;
    return fd;
bad:
    close(fd);
    return -1;
}

/* The child: exit 0 when the case went as it should, 1 when a check failed
 * (a SIGBUS kills it instead). */
static int run_case(int kind)
{
    test_passed_ = test_failed_ = 0; /* the parent's counts are the parent's */
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = GM_BACKEND_SIM;
    cfg.sim_capacity = (size_t)256 << 20;
    gm_pool_t *pool = NULL;
    REQUIRE(gm_pool_create(&cfg, &pool) == GM_OK);
    gm_device_info_t di = GM_DEVICE_INFO_INIT;
    REQUIRE(gm_pool_device_info(pool, &di) == GM_OK);
    fake_t f = {.lfd = -1, .page_fd = -1, .page = di.granularity, .device = cfg.device};
    char tmpl[160];
    snprintf(tmpl, sizeof tmpl, "%s/gm-fake-page-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    f.page_fd = make_page(kind, f.page, tmpl);
    REQUIRE(f.page_fd >= 0);

    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s/gm-fake-%d.sock",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    unlink(a.sun_path);
    f.lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    REQUIRE(f.lfd >= 0 && bind(f.lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(f.lfd, 4) == 0);
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, fake_main, &f) == 0);

    gm_share_client_t *cli = NULL;
    REQUIRE(gm_share_connect(pool, a.sun_path, &cli) == GM_OK);
    void *p = NULL;
    size_t n = 0;
    int rc = gm_share_import(cli, "fake", NULL, &p, &n, NULL);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", gm_last_error());
    /* The sender cuts what it sent short. */
    int cut = ftruncate(f.page_fd, 0);
    unsigned char *buf = malloc(f.page);
    REQUIRE(buf != NULL);
    if (kind == K_SEALED) {
        CHECK_OK(rc);
        CHECK(cut != 0); /* the seal holds */
        CHECK(n == f.page);
        if (rc == GM_OK) {
            memset(buf, 0, f.page);
            CHECK_OK(gm_memcpy_d2h(pool, buf, p, f.page, NULL));
            CHECK(buf[0] == FILL && buf[f.page - 1] == FILL);
            CHECK_OK(gm_share_release(cli, p, NULL));
        }
    } else {
        if (rc == GM_OK) {
            fprintf(stderr, "  %s: the import was accepted; reading it after the sender truncated "
                    "the file (a SIGBUS may end this process)\n", kind_name[kind]);
            CHECK_OK(gm_memcpy_d2h(pool, buf, p, f.page, NULL));
            gm_share_release(cli, p, NULL);
        }
        CHECK_RC(rc, GM_INVALID_ARGUMENT);
        CHECK(strstr(msg, "not a page of the sim") != NULL);
        if (!strstr(msg, "not a page of the sim")) fprintf(stderr, "  %s: %s\n", kind_name[kind], msg);
        CHECK(cut == 0);
    }
    free(buf);
    CHECK_OK(gm_share_disconnect(cli));
    pthread_join(th, NULL);
    /* The process and its pool live on. */
    void *q = NULL;
    CHECK_OK(gm_alloc(pool, 3 << 20, NULL, &q));
    CHECK_OK(gm_free(pool, q, NULL));
    CHECK_OK(gm_pool_check(pool));
    gm_pool_destroy(pool);
    close(f.page_fd);
    close(f.lfd);
    unlink(a.sun_path);
    return test_summary();
}

int main(void)
{
    if (test_backend() != GM_BACKEND_SIM) {
        printf("test_share_fake_page: the sim's pages only; skipped on this backend\n");
        return 77;
    }
    for (int k = 0; k < K_COUNT; k++) {
        fflush(NULL);
        pid_t pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0) exit(run_case(k) ? 1 : 0);
        int st = 0;
        REQUIRE(waitpid(pid, &st, 0) == pid);
        int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
        if (!ok)
            fprintf(stderr, "%s: the importer %s %d\n", kind_name[k],
                    WIFSIGNALED(st) ? "was killed by signal" : "exited with",
                    WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
        else
            printf("%s: %s\n", kind_name[k], k == K_SEALED ? "imported and read" : "refused, alive");
        CHECK(ok);
    }
    return test_summary();
}
