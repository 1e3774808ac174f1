/* SPDX-License-Identifier: Apache-2.0 */
/*
 * obs_monitor_writer.c — attacks the monitor file's promise (src/observe/monitor.c,
 * docs/observability.md): the file gpumem.<pid> in a shared directory is
 * created safely, and failing to create it never fails or crashes the pool.
 * Each case runs a child process that plants something hostile at its own
 * name (or fills the directory), then creates a pool, allocates and frees;
 * the child must exit cleanly (before: overwritten victim files, SIGBUS).
 *
 *   symlink      gpumem.<pid> -> a victim file: the victim is untouched.
 *   precreated   a 0666 file at the name, then truncated by its "owner"
 *                after the pool started: no SIGBUS, the file never opened.
 *   other_user   (root only) a root-owned 0666 file at the name in a sticky
 *                directory, the child running as nobody: never opened or
 *                truncated; the pool works without a monitor and says so
 *                once on stderr.
 *   full         (needs a private mount namespace) a full tmpfs: no SIGBUS,
 *                the pool works and says so once.
 *   fresh        the file made is regular, ours, mode 0644 or stricter, the
 *                size of a segment, and no temporary file is left behind;
 *                in a private directory and in the default, /dev/shm (only
 *                this process's own names are looked at there).
 */

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpumem.h"
#include "../test.h"

static char base[256];

/* A pool used a little: 0 when everything worked. */
static int use_pool(int truncate_fd)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = GM_BACKEND_SIM;
    cfg.sim_capacity = (size_t)64 << 20;
    gm_pool_t *pool = NULL, *pool2 = NULL;
    if (gm_pool_create(&cfg, &pool) != GM_OK) return 10;
    if (gm_pool_create(&cfg, &pool2) != GM_OK) return 11;
    if (truncate_fd >= 0 && ftruncate(truncate_fd, 0) != 0) return 12;
    for (int i = 0; i < 50; i++) {
        void *p = NULL;
        if (gm_alloc(pool, 4096 + (size_t)i * 4096, NULL, &p) != GM_OK) return 13;
        if (gm_free(pool, p, NULL) != GM_OK) return 14;
    }
    gm_pool_destroy(pool2);
    gm_pool_destroy(pool);
    return 0;
}

/* Run case fn in a child with stderr to errpath; its exit status, or 100 +
 * the signal that killed it. */
static int run_child(int (*fn)(const char *dir), const char *dir, const char *errpath)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) dup2(fd, 2);
        if (strcmp(dir, "/dev/shm")) setenv("GPUMEM_MONITOR_DIR", dir, 1);
        else unsetenv("GPUMEM_MONITOR_DIR"); /* the default */
        unsetenv("GPUMEM_MONITOR");
        _exit(fn(dir));
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid) return 99;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + WTERMSIG(st);
}

static int count_in(const char *path, const char *needle)
{
    char buf[4096];
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    int c = 0;
    for (const char *p = buf; (p = strstr(p, needle)); p++) c++;
    return c;
}

static int read_file(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    return (int)n;
}

static void mkdirp(const char *d, mode_t mode)
{
    mkdir(d, 0700);
    chmod(d, mode);
}

/* ---- cases (in the child) --------------------------------------------------------- */

static int case_symlink(const char *dir)
{
    char victim[512], name[512];
    snprintf(victim, sizeof victim, "%s.victim", dir);
    snprintf(name, sizeof name, "%s/gpumem.%d", dir, (int)getpid());
    if (symlink(victim, name) != 0) return 20;
    return use_pool(-1);
}

/* Make this process's monitor file dir/gpumem.PID before the library does,
 * writable by all, holding `junk`: 0 and its descriptor, or the case's exit
 * code (20: not created, 21: not written). */
static int precreate(const char *dir, const char *junk, int *fd)
{
    char name[512];
    snprintf(name, sizeof name, "%s/gpumem.%d", dir, (int)getpid());
    *fd = open(name, O_RDWR | O_CREAT | O_EXCL, 0666);
    if (*fd < 0) return 20;
    fchmod(*fd, 0666);
    size_t n = strlen(junk);
    if (write(*fd, junk, n) != (ssize_t)n) return 21;
    return 0;
}

static int case_precreated(const char *dir)
{
    int fd, rc = precreate(dir, "junk-of-another", &fd);
    if (rc) return rc;
    rc = use_pool(fd); /* truncated while the pool is alive */
    /* Never opened with O_TRUNC: before the "owner" truncated it, its bytes
     * were its own (checked through its size: 0 now, by our truncate). */
    close(fd);
    return rc;
}

static int case_other_user(const char *dir)
{
    int fd, rc = precreate(dir, "root's data", &fd);
    if (rc) return rc;
    close(fd);
    if (setgid(65534) != 0 || setuid(65534) != 0) return 22;
    return use_pool(-1);
}

static int case_full(const char *dir)
{
    if (unshare(CLONE_NEWNS) != 0 &&
        unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0)
        return 77;
    if (mount("none", "/", "none", MS_REC | MS_PRIVATE, NULL) != 0) return 77;
    if (mount("tmpfs", dir, "tmpfs", 0, "size=64k") != 0) return 77;
    char fill[512];
    snprintf(fill, sizeof fill, "%s/filler", dir);
    int fd = open(fill, O_WRONLY | O_CREAT, 0600);
    if (fd < 0) return 23;
    char block[4096] = {0};
    while (write(fd, block, sizeof block) > 0) {}
    close(fd);
    return use_pool(-1);
}

static int case_fresh(const char *dir)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = GM_BACKEND_SIM;
    cfg.sim_capacity = (size_t)64 << 20;
    gm_pool_t *pool = NULL;
    if (gm_pool_create(&cfg, &pool) != GM_OK) return 10;
    char name[512];
    snprintf(name, sizeof name, "%s/gpumem.%d", dir, (int)getpid());
    struct stat sb;
    int rc = 0;
    if (lstat(name, &sb) != 0) rc = 30;
    else if (!S_ISREG(sb.st_mode)) rc = 31;
    else if (sb.st_uid != geteuid()) rc = 32;
    else if (sb.st_mode & 0022) rc = 33;
    else if (sb.st_size < 1024) rc = 34;
    char tmp_prefix[64];
    snprintf(tmp_prefix, sizeof tmp_prefix, ".gpumem.%d.", (int)getpid());
    DIR *d = opendir(dir);
    struct dirent *e;
    int temps = 0;
    while (d && (e = readdir(d)))
        if (!strncmp(e->d_name, tmp_prefix, strlen(tmp_prefix))) temps++;
    if (d) closedir(d);
    if (!rc && temps) rc = 35; /* a temporary file left behind */
    gm_pool_destroy(pool);
    if (!rc && access(name, F_OK) == 0) rc = 36; /* removed with the last pool */
    return rc;
}

int main(void)
{
    snprintf(base, sizeof base, "%s/gm_obs_mon.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    REQUIRE(mkdtemp(base) != NULL);
    char dir[300], err[300], victim[320], buf[256];

    /* symlink */
    snprintf(dir, sizeof dir, "%s/symlink", base);
    mkdirp(dir, 0700);
    snprintf(victim, sizeof victim, "%s.victim", dir);
    FILE *f = fopen(victim, "w");
    REQUIRE(f != NULL);
    fputs("precious", f);
    fclose(f);
    snprintf(err, sizeof err, "%s/symlink.err", base);
    CHECK(run_child(case_symlink, dir, err) == 0);
    CHECK(read_file(victim, buf, sizeof buf) == 8 && !strcmp(buf, "precious"));

    /* precreated */
    snprintf(dir, sizeof dir, "%s/pre", base);
    mkdirp(dir, 0700);
    snprintf(err, sizeof err, "%s/pre.err", base);
    int rc = run_child(case_precreated, dir, err);
    CHECK(rc == 0);
    if (rc) fprintf(stderr, "precreated: child status %d\n", rc);

    /* fresh */
    snprintf(dir, sizeof dir, "%s/fresh", base);
    mkdirp(dir, 0700);
    snprintf(err, sizeof err, "%s/fresh.err", base);
    rc = run_child(case_fresh, dir, err);
    CHECK(rc == 0);
    if (rc) fprintf(stderr, "fresh: child status %d\n", rc);
    CHECK(count_in(err, "no monitor file") == 0);
    if (access("/dev/shm", W_OK) == 0) {
        rc = run_child(case_fresh, "/dev/shm", err);
        CHECK(rc == 0);
        if (rc) fprintf(stderr, "fresh in /dev/shm: child status %d\n", rc);
    }

    /* other user (root only: a test as an ordinary user cannot own a file
     * of another user) */
    if (geteuid() == 0) {
        snprintf(dir, sizeof dir, "%s/sticky", base);
        mkdirp(dir, 01777);
        chmod(base, 0755);
        snprintf(err, sizeof err, "%s/sticky.err", base);
        rc = run_child(case_other_user, dir, err);
        CHECK(rc == 0);
        if (rc) fprintf(stderr, "other_user: child status %d\n", rc);
        /* The root-owned file at the name: still root's, with its bytes. */
        DIR *d = opendir(dir);
        struct dirent *e;
        int found = 0;
        while (d && (e = readdir(d))) {
            if (strncmp(e->d_name, "gpumem.", 7)) continue;
            char p[600];
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            found++;
            CHECK(read_file(p, buf, sizeof buf) == 11 && !strcmp(buf, "root's data"));
        }
        if (d) closedir(d);
        CHECK(found == 1);
        CHECK(count_in(err, "no monitor file") == 1);
    } else {
        printf("SKIP other_user: needs root to plant a file of another user\n");
    }

    /* full */
    snprintf(dir, sizeof dir, "%s/full", base);
    mkdirp(dir, 0700);
    snprintf(err, sizeof err, "%s/full.err", base);
    rc = run_child(case_full, dir, err);
    if (rc == 77) {
        printf("SKIP full: no private mount namespace here\n");
    } else {
        CHECK(rc == 0);
        if (rc) fprintf(stderr, "full: child status %d\n", rc);
        CHECK(count_in(err, "no monitor file") == 1); /* once for two pools */
    }

    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
    CHECK(system(cmd) == 0);
    return test_summary();
}
