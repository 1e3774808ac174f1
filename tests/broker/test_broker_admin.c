/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_broker_admin.c — tenants made at run time (the Slurm plugin's side
 * of the broker, docs/slurm.md): an admin makes a job's tenant with a
 * quota and an anchor process; the tenant's door is a socket in a
 * directory of mode 0700; a process that descends from the anchor leases
 * there within the quota (an allocation past it fails naming the tenant);
 * a process that does not (another job of the same user) is turned away
 * at the door; a guarantee past the capacity is cut to what is left; a user who is not an admin cannot make tenants (as root:
 * a child that became nobody); bad requests are refused with the reason;
 * removing the tenant drops its processes and takes every page back; a
 * tenant whose anchors are gone is removed after job_grace; a broker
 * restarted while a job runs opens its door again and counts what the
 * job's process kept.
 */
#include "test.h"
#include "broker_util.h"
#include "lib/broker_admin.h"

static test_broker_t g_b;
static char g_jobs[100];

/* `gpumem broker --config` of text with --check, in a child: its exit
 * status, its stderr in err. */
static int check_config(const char *text, char *err, size_t cap)
{
    char path[128], out[128];
    snprintf(path, sizeof path, "%.60s/check.conf", g_b.dir);
    snprintf(out, sizeof out, "%.60s/check.err", g_b.dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "socket = %.60s/c.sock\nbackend = sim\n%s", g_b.dir, text);
    fclose(f);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(out, "w", stderr) || !freopen("/dev/null", "w", stdout)) _exit(99);
        char *argv[] = {"broker", "--config", path, "--check", NULL};
        tb_broker_exec(argv);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    err[0] = '\0';
    f = fopen(out, "r");
    if (f) {
        size_t n = fread(err, 1, cap - 1, f);
        err[n] = '\0';
        fclose(f);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int pool_at(const char *door, gm_pool_t **pool)
{
    gm_pool_config_t cfg;
    gm_config_from_env(&cfg);
    snprintf(cfg.broker, sizeof cfg.broker, "%s", door);
    cfg.broker_lease = 8 * MiB;
    return gm_pool_create(&cfg, pool);
}

/* A child that only sleeps (an anchor of another job); killed by the test. */
static pid_t sleeper(void)
{
    fflush(NULL);
    pid_t p = fork();
    if (p == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        for (;;) pause();
    }
    return p;
}

int main(void)
{
    tb_init(&g_b);
    snprintf(g_jobs, sizeof g_jobs, "%.60s/jobs", g_b.dir);
    char extra[256];
    snprintf(extra, sizeof extra, "default_quota = 0\nkeep_free = 0\njob_dir = %s\njob_grace = 1\n",
             g_jobs);
    tb_config(&g_b, "256MiB", extra);
    tb_start(&g_b);
    char err[512];
    gm_broker_admin_result_t r;

    /* A job's tenant, anchored on this process. */
    CHECK(gm_broker_admin_create(g_b.sock, "job_7", 64 * MiB, 0, getuid(), getgid(), 7, getpid(),
                                 &r, err, sizeof err) == 0);
    char want[160];
    snprintf(want, sizeof want, "%s/job_7/sock", g_jobs);
    CHECK(!strcmp(r.door, want));
    struct stat st;
    char dir[160];
    snprintf(dir, sizeof dir, "%s/job_7", g_jobs);
    CHECK(stat(dir, &st) == 0 && (st.st_mode & 0777) == 0700 && st.st_uid == getuid());
    CHECK(tb_tenant(&g_b, "job_7").quota == 64 * MiB);
    /* Again for the same job: refreshed, same door. */
    CHECK(gm_broker_admin_create(g_b.sock, "job_7", 64 * MiB, 0, getuid(), getgid(), 7, getpid(),
                                 &r, err, sizeof err) == 0 && !strcmp(r.door, want));

    /* Bad requests, each with its reason. */
    CHECK(gm_broker_admin_create(g_b.sock, "job_7", 64 * MiB, 0, getuid(), getgid(), 8, getpid(),
                                 &r, err, sizeof err) != 0 && strstr(err, "not this job's"));
    CHECK(gm_broker_admin_create(g_b.sock, "a/b", MiB, 0, getuid(), getgid(), 9, 0, &r, err,
                                 sizeof err) != 0 && strstr(err, "tenant name"));
    /* A guarantee past the capacity is cut to what is left, not refused. */
    CHECK(gm_broker_admin_create(g_b.sock, "job_9", 512 * MiB, 512 * MiB, getuid(), getgid(), 9, 0,
                                 &r, err, sizeof err) == 0);
    CHECK(tb_tenant(&g_b, "job_9").guaranteed == 256 * MiB);
    CHECK(gm_broker_admin_create(g_b.sock, "job_10", 64 * MiB, 64 * MiB, getuid(), getgid(), 10, 0,
                                 &r, err, sizeof err) == 0);
    CHECK(tb_tenant(&g_b, "job_10").guaranteed == 0);
    CHECK(gm_broker_admin_remove(g_b.sock, "job_9", &r, err, sizeof err) == 0);
    CHECK(gm_broker_admin_remove(g_b.sock, "job_10", &r, err, sizeof err) == 0);
    CHECK(gm_broker_admin_remove(g_b.sock, "job_404", &r, err, sizeof err) != 0 &&
          strstr(err, "no tenant 'job_404'"));
    CHECK(gm_broker_admin_create(g_b.sock, "job_9", MiB, 0, getuid(), getgid(), 9, 999999999, &r,
                                 err, sizeof err) != 0 && strstr(err, "not running"));

    /* A process of the job leases within its quota; past it, the error
     * names the tenant. */
    gm_pool_t *pool = NULL;
    CHECK_OK(pool_at(want, &pool));
    void *p = NULL, *q = NULL;
    if (pool) {
        CHECK_OK(gm_alloc(pool, 48 * MiB, NULL, &p));
        CHECK_RC(gm_alloc(pool, 32 * MiB, NULL, &q), GM_LIMIT);
        CHECK(strstr(gm_last_error(), "tenant 'job_7' is over its quota") != NULL);
    }
    gm_broker_tenant_t t = tb_tenant(&g_b, "job_7");
    CHECK(t.used >= 48 * MiB && t.used <= 64 * MiB && t.peak <= 64 * MiB);

    /* Another job of the same user (its anchor a process this one does not
     * descend from): this process is turned away at that job's door. */
    pid_t other = sleeper();
    char door8[160];
    CHECK(gm_broker_admin_create(g_b.sock, "job_8", 32 * MiB, 0, getuid(), getgid(), 8, other, &r,
                                 err, sizeof err) == 0);
    snprintf(door8, sizeof door8, "%s", r.door);
    gm_pool_t *intruder = NULL;
    CHECK(pool_at(door8, &intruder) != GM_OK);
    CHECK(strstr(gm_last_error(), "not a process of the job") != NULL);
    if (intruder) gm_pool_destroy(intruder);

    /* Not an admin: root's child turned nobody cannot make a tenant. */
    if (getuid() == 0) {
        chmod(g_b.dir, 0755); /* nobody may reach the socket */
        fflush(NULL);
        pid_t c = fork();
        if (c == 0) {
            if (setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
            char e[512];
            gm_broker_admin_result_t rr;
            int rc = gm_broker_admin_create(g_b.sock, "job_x", MiB, 0, 65534, 65534, 1, 0, &rr, e,
                                            sizeof e);
            if (rc == 0 || !strstr(e, "may not make or remove tenants")) {
                fprintf(stderr, "as nobody: rc %d: %s\n", rc, e);
                _exit(1);
            }
            _exit(0);
        }
        int st = 0;
        waitpid(c, &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }

    /* The anchor of job_8 dies and no one removes it: gone after job_grace. */
    kill(other, SIGKILL);
    waitpid(other, NULL, 0);
    double end = now_ms() + 10000;
    while (tb_tenant(&g_b, "job_8").quota && now_ms() < end) sleep_ms(20);
    CHECK(tb_tenant(&g_b, "job_8").quota == 0);
    CHECK(stat(door8, &st) != 0);

    /* Restart while the job runs: the door opens again, the pages this
     * process kept count against the job at once. */
    CHECK(tb_stop(&g_b, SIGTERM) == 0);
    tb_start(&g_b);
    t = tb_tenant(&g_b, "job_7");
    CHECK(t.quota == 64 * MiB && t.used >= 48 * MiB);
    CHECK(stat(want, &st) == 0 && S_ISSOCK(st.st_mode));

    /* Removed: its processes dropped, every page back. */
    CHECK(gm_broker_admin_remove(g_b.sock, "job_7", &r, err, sizeof err) == 0);
    CHECK(r.peak >= 48 * MiB && r.peak <= 64 * MiB);
    gm_broker_view_t v;
    CHECK_OK(gm_broker_query(g_b.sock, &v));
    CHECK(v.device_used == 0);
    for (size_t i = 0; i < v.n; i++) CHECK(strncmp(v.tenants[i].name, "job_", 4) != 0);
    free(v.tenants);
    CHECK(stat(want, &st) != 0);
    if (pool) {
        if (p) gm_free(pool, p, NULL);
        gm_pool_destroy(pool);
    }

    /* The config's keys for run-time tenants: bad values named. */
    char msg[1024];
    CHECK(check_config("job_dir = /run/gpumem/jobs\nadmins = 0\njob_grace = 5\n", msg,
                       sizeof msg) == 0);
    CHECK(check_config("job_grace = 99999\n", msg, sizeof msg) == 2 &&
          strstr(msg, "'99999' is not a valid job_grace"));
    CHECK(check_config("job_dir = relative/jobs\n", msg, sizeof msg) == 2 &&
          strstr(msg, "job_dir is an absolute path"));
    CHECK(check_config("admins = no-such-user-here\n", msg, sizeof msg) == 2 &&
          strstr(msg, "no user named 'no-such-user-here'"));

    /* A broker without job_dir says so. */
    tb_stop(&g_b, SIGTERM);
    tb_config(&g_b, "256MiB", "default_quota = 0\n");
    tb_start(&g_b);
    CHECK(gm_broker_admin_create(g_b.sock, "job_5", MiB, 0, getuid(), getgid(), 5, 0, &r, err,
                                 sizeof err) != 0 && strstr(err, "no job_dir"));
    tb_cleanup(&g_b);
    return test_summary();
}
