/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_broker_steps.c — a job step's own tenant, carved out of its job's
 * (ADMIN_CREATE with GM__BROKER_FLAG_CARVE; the Slurm plugin's `srun
 * --gres=gpumem:N` inside a larger job, docs/slurm.md).  The step's quota
 * is taken from the job's tenant while the step lives, so the job's and
 * its steps' processes together hold at most the job's grant: each is held
 * to its own part (an allocation past it fails naming that tenant); a step
 * that asks for more than the job has left is refused with the figures; a
 * refreshed job keeps its steps' parts out; the step's removal (or its
 * reaping once its anchor is gone) gives its part back; the job's removal
 * removes its steps first and reports the whole grant; a restarted broker
 * keeps the carving.  Malformed carve requests are refused with the reason
 * (or, with unterminated text, the connection ends).  The job's tenants get
 * job= (and step=) labels in the Prometheus output; the figures of a
 * removed tenant include the refusals when the device was full.
 */
#include <sys/socket.h>
#include <sys/un.h>

#include "test.h"
#include "broker_util.h"
#include "broker/proto.h"
#include "lib/broker_admin.h"

static test_broker_t g_b;
static char g_jobs[100];

/* A pool that leases at door (a tenant's), 8 MiB at a time. */
static int pool_at(const char *door, gm_pool_t **pool)
{
    test_broker_t at = g_b;
    snprintf(at.sock, sizeof at.sock, "%s", door);
    return tb_pool(&at, 8 * MiB, pool);
}

/* An ADMIN_CREATE built by hand (flags, text as given): the broker's reply
 * status and text in why; -1 when it ended the connection instead. */
static int raw_create(const char *name, uint32_t flags, const char *text, size_t text_len,
                      char *why, size_t cap)
{
    gm__broker_msg_t m, in;
    memset(&m, 0, sizeof m);
    m.magic = GM__BROKER_MAGIC;
    m.version = GM__BROKER_VERSION;
    m.type = GM__BROKER_ADMIN_CREATE;
    m.flags = flags;
    snprintf(m.tenant, sizeof m.tenant, "%s", name);
    memcpy(m.text, text, text_len < sizeof m.text ? text_len : sizeof m.text);
    m.quota = 8 * MiB;
    m.count = getuid();
    m.min = getgid();
    m.first = 7;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", g_b.sock);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0) close(fd);
        snprintf(why, cap, "cannot connect");
        return -2;
    }
    ssize_t n = send(fd, &m, sizeof m, MSG_NOSIGNAL);
    if (n == (ssize_t)sizeof m) n = recv(fd, &in, sizeof in, 0);
    close(fd);
    if (n != (ssize_t)sizeof in) {
        snprintf(why, cap, "(connection ended)");
        return -1;
    }
    in.text[sizeof in.text - 1] = '\0';
    snprintf(why, cap, "%s", in.text);
    return in.status;
}

/* The Prometheus text of the broker's tenants. */
static char *metrics_text(void)
{
    gm_broker_view_t v;
    if (gm_broker_query(g_b.sock, &v) != GM_OK) return NULL;
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    if (f) {
        gm_broker_print_metrics(f, &v);
        fclose(f);
    }
    free(v.tenants);
    return text;
}

/* Wait (at most 10 s) until tenant name is gone from the broker. */
static bool gone_soon(const char *name)
{
    double end = now_ms() + 10000;
    while (tb_tenant(&g_b, name).quota && now_ms() < end) sleep_ms(20);
    return tb_tenant(&g_b, name).quota == 0;
}

int main(void)
{
    uid_t u = getuid();
    gid_t g = getgid();
    char err[512], extra[256];
    gm_broker_admin_result_t r;
    /* 256 MiB; doors under jobs/; a step whose daemon is gone reaped after 1 s. */
    tb_init(&g_b);
    snprintf(g_jobs, sizeof g_jobs, "%.60s/jobs", g_b.dir);
    snprintf(extra, sizeof extra, "job_dir = %s\njob_grace = 1\ndefault_quota = 0\nkeep_free = 0\n",
             g_jobs);
    tb_config(&g_b, "256MiB", extra);
    tb_start(&g_b);

    /* Job 7: 64 MiB, 32 of them guaranteed; its process holds 16 MiB. */
    CHECK(gm_broker_admin_create(g_b.sock, "job_7", 64 * MiB, 32 * MiB, u, g, 7, getpid(), &r,
                                 err, sizeof err) == 0);
    char job_door[108];
    snprintf(job_door, sizeof job_door, "%s", r.door);
    gm_pool_t *jp = NULL, *sp = NULL;
    void *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(pool_at(job_door, &jp));
    if (jp) CHECK_OK(gm_alloc(jp, 16 * MiB, NULL, &a));

    /* Step 1 asks for 32 MiB: carved out of the job's 64. */
    CHECK(gm_broker_admin_carve(g_b.sock, "job_7.1", "job_7", 32 * MiB, 32 * MiB, u, g, 7,
                                getpid(), &r, err, sizeof err) == 0);
    char step_door[108];
    snprintf(step_door, sizeof step_door, "%s", r.door);
    char want[160];
    snprintf(want, sizeof want, "%s/job_7.1/sock", g_jobs);
    CHECK(!strcmp(step_door, want));
    gm_broker_tenant_t jt = tb_tenant(&g_b, "job_7"), st = tb_tenant(&g_b, "job_7.1");
    CHECK(jt.quota == 32 * MiB && st.quota == 32 * MiB);
    CHECK(jt.guaranteed == 0 && st.guaranteed == 32 * MiB);
    /* Again for the same step: refreshed, nothing carved twice. */
    CHECK(gm_broker_admin_carve(g_b.sock, "job_7.1", "job_7", 32 * MiB, 32 * MiB, u, g, 7,
                                getpid(), &r, err, sizeof err) == 0 && !strcmp(r.door, want));
    CHECK(tb_tenant(&g_b, "job_7").quota == 32 * MiB);
    /* The job's grant again (another step of it starts): its step's part stays out. */
    CHECK(gm_broker_admin_create(g_b.sock, "job_7", 64 * MiB, 32 * MiB, u, g, 7, getpid(), &r,
                                 err, sizeof err) == 0);
    CHECK(tb_tenant(&g_b, "job_7").quota == 32 * MiB && r.quota == 32 * MiB);

    /* Each held to its part: the step 32 MiB, the job the 32 left. */
    CHECK_OK(pool_at(step_door, &sp));
    if (sp) {
        CHECK_OK(gm_alloc(sp, 24 * MiB, NULL, &b));
        CHECK_RC(gm_alloc(sp, 16 * MiB, NULL, &c), GM_LIMIT);
        CHECK(strstr(gm_last_error(), "tenant 'job_7.1' is over its quota") != NULL);
    }
    if (jp) {
        void *x = NULL;
        CHECK_RC(gm_alloc(jp, 24 * MiB, NULL, &x), GM_LIMIT);
        CHECK(strstr(gm_last_error(), "tenant 'job_7' is over its quota") != NULL);
    }
    jt = tb_tenant(&g_b, "job_7");
    st = tb_tenant(&g_b, "job_7.1");
    CHECK(jt.used + st.used <= 64 * MiB && jt.peak <= jt.quota && st.peak <= st.quota);

    /* Labels for Prometheus: job= and step=, the tenant label as before. */
    char *text = metrics_text();
    CHECK(text && strstr(text, "gpumem_broker_tenant_quota_bytes{tenant=\"job_7\",job=\"7\"} "));
    CHECK(text && strstr(text, "gpumem_broker_tenant_used_bytes{tenant=\"job_7.1\",job=\"7\","
                               "step=\"1\"} "));
    free(text);

    /* More than the job has left (32 MiB of quota, 16 held): refused with
     * the figures, nothing carved. */
    CHECK(gm_broker_admin_carve(g_b.sock, "job_7.2", "job_7", 24 * MiB, 0, u, g, 7, getpid(), &r,
                                err, sizeof err) != 0 && r.status == GM_LIMIT);
    CHECK(strstr(err, "tenant 'job_7' has 16.00 MiB left of its quota 32.00 MiB (16.00 MiB held "
                      "by its processes)") != NULL);
    CHECK(strstr(err, "'job_7.2' of 24.00 MiB does not fit") != NULL);
    CHECK(tb_tenant(&g_b, "job_7.2").quota == 0 && tb_tenant(&g_b, "job_7").quota == 32 * MiB);

    /* Bad carve requests, each with its reason. */
    CHECK(gm_broker_admin_carve(g_b.sock, "job_7.2", "job_404", MiB, 0, u, g, 7, getpid(), &r,
                                err, sizeof err) != 0 && strstr(err, "no job's tenant 'job_404'"));
    CHECK(gm_broker_admin_carve(g_b.sock, "job_7.2", "job_7.1", MiB, 0, u, g, 7, getpid(), &r,
                                err, sizeof err) != 0 && strstr(err, "no job's tenant 'job_7.1'"));
    CHECK(gm_broker_admin_carve(g_b.sock, "job_8.1", "job_7", MiB, 0, u, g, 8, getpid(), &r, err,
                                sizeof err) != 0 && strstr(err, "'job_7' is not this job's"));
    CHECK(gm_broker_admin_carve(g_b.sock, "job_7.1", "job_7", 16 * MiB, 0, u, g, 7, getpid(), &r,
                                err, sizeof err) != 0 && strstr(err, "exists with another grant"));
    CHECK(gm_broker_admin_carve(g_b.sock, "job_7", "job_7", MiB, 0, u, g, 7, getpid(), &r, err,
                                sizeof err) != 0 && strstr(err, "no job's tenant 'job_7'"));
    CHECK(gm_broker_admin_create(g_b.sock, "job_7.1", 8 * MiB, 0, u, g, 7, getpid(), &r, err,
                                 sizeof err) != 0 && strstr(err, "exists with another grant"));
    /* Malformed messages: a carve without its job's tenant, a job's tenant
     * without the carve flag, an unknown flag: refused; text without its
     * end: the connection ends. */
    char why[300];
    CHECK(raw_create("job_7.5", GM__BROKER_FLAG_CARVE, "", 1, why, sizeof why) ==
          GM_INVALID_ARGUMENT && strstr(why, "must name its job's tenant"));
    CHECK(raw_create("job_7.5", 0, "job_7", 6, why, sizeof why) == GM_INVALID_ARGUMENT &&
          strstr(why, "does not carve"));
    CHECK(raw_create("job_7.5", 0x4, "", 1, why, sizeof why) == GM_INVALID_ARGUMENT &&
          strstr(why, "unknown flags 0x4"));
    char unterminated[GM__BROKER_TEXT_MAX];
    memset(unterminated, 'j', sizeof unterminated);
    CHECK(raw_create("job_7.5", GM__BROKER_FLAG_CARVE, unterminated, sizeof unterminated, why,
                     sizeof why) == -1);
    CHECK(tb_tenant(&g_b, "job_7.5").quota == 0 && tb_tenant(&g_b, "job_7").quota == 32 * MiB);

    /* The step ends: its part back to the job (quota and guarantee), its
     * process dropped, its pages back. */
    CHECK(gm_broker_admin_remove(g_b.sock, "job_7.1", &r, err, sizeof err) == 0);
    CHECK(r.quota == 32 * MiB && r.peak >= 24 * MiB && r.peak <= 32 * MiB && r.refusals >= 1);
    jt = tb_tenant(&g_b, "job_7");
    CHECK(jt.quota == 64 * MiB && jt.guaranteed == 32 * MiB);
    gm_broker_view_t v;
    CHECK_OK(gm_broker_query(g_b.sock, &v));
    CHECK(v.device_used == jt.used);
    free(v.tenants);
    CHECK(tb_file_has(g_b.log, "tenant 'job_7.1' (job 7) removed: removed by its admin; peak"));
    CHECK(tb_file_has(g_b.log, "its quota back to job_7"));
    if (sp) {
        gm_pool_destroy(sp); /* its connection is gone: nothing to give back */
        sp = NULL;
    }

    /* A step whose daemon dies and no one removes it: reaped after
     * job_grace, its part back; the job stays (its own anchor lives). */
    fflush(NULL);
    pid_t d = fork(); /* a step daemon's stand-in, killed below */
    if (d == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        pause();
        _exit(0);
    }
    CHECK(gm_broker_admin_carve(g_b.sock, "job_7.2", "job_7", 16 * MiB, 0, u, g, 7, d, &r, err,
                                sizeof err) == 0);
    CHECK(tb_tenant(&g_b, "job_7").quota == 48 * MiB);
    kill(d, SIGKILL);
    waitpid(d, NULL, 0);
    CHECK(gone_soon("job_7.2"));
    CHECK(tb_tenant(&g_b, "job_7").quota == 64 * MiB);

    /* A broker restarted while a step runs keeps the carving and gives the
     * step's part back when it ends. */
    CHECK(gm_broker_admin_carve(g_b.sock, "job_7.3", "job_7", 16 * MiB, 0, u, g, 7, getpid(), &r,
                                err, sizeof err) == 0);
    CHECK(tb_stop(&g_b, SIGTERM) == 0);
    tb_start(&g_b);
    CHECK(tb_tenant(&g_b, "job_7").quota == 48 * MiB && tb_tenant(&g_b, "job_7.3").quota == 16 * MiB);
    CHECK(gm_broker_admin_remove(g_b.sock, "job_7.3", &r, err, sizeof err) == 0);
    CHECK(tb_tenant(&g_b, "job_7").quota == 64 * MiB);

    /* The job ends with a step still there: the step goes first, the job's
     * figures are its whole grant; nothing is left. */
    CHECK(gm_broker_admin_carve(g_b.sock, "job_7.4", "job_7", 16 * MiB, 0, u, g, 7, getpid(), &r,
                                err, sizeof err) == 0);
    CHECK(gm_broker_admin_remove(g_b.sock, "job_7", &r, err, sizeof err) == 0);
    CHECK(r.quota == 64 * MiB && r.peak >= 16 * MiB);
    CHECK(tb_tenant(&g_b, "job_7.4").quota == 0);
    CHECK(tb_file_has(g_b.log, "tenant 'job_7.4' (job 7) removed: its job's tenant was removed"));
    CHECK(tb_file_has(g_b.log, "tenant 'job_7' (job 7) removed: removed by its admin; peak"));
    CHECK_OK(gm_broker_query(g_b.sock, &v));
    CHECK(v.device_used == 0);
    for (size_t i = 0; i < v.n; i++) CHECK(strncmp(v.tenants[i].name, "job_", 4) != 0);
    free(v.tenants);
    if (jp) {
        gm_pool_destroy(jp);
        jp = NULL;
    }

    /* Accounting: a job refused because the device is full has its OOMs
     * counted apart from its refusals, in the removal's figures and log. */
    CHECK(gm_broker_admin_create(g_b.sock, "job_9", 1024 * MiB, 0, u, g, 9, getpid(), &r, err,
                                 sizeof err) == 0);
    gm_pool_t *big = NULL;
    CHECK_OK(pool_at(r.door, &big));
    if (big) {
        void *x = NULL;
        CHECK_RC(gm_alloc(big, 300 * MiB, NULL, &x), GM_OUT_OF_MEMORY);
    }
    CHECK(gm_broker_admin_figures(g_b.sock, "job_9", &r, err, sizeof err) == 0 && r.ooms >= 1 &&
          r.refusals >= r.ooms && r.quota == 1024 * MiB);
    CHECK(gm_broker_admin_figures(g_b.sock, "job_404", &r, err, sizeof err) != 0 &&
          strstr(err, "no tenant 'job_404'"));
    CHECK(gm_broker_admin_remove(g_b.sock, "job_9", &r, err, sizeof err) == 0 && r.ooms >= 1);
    CHECK(tb_file_has(g_b.log, "held at the end"));
    CHECK(tb_file_has(g_b.log, " out of device memory)"));
    if (big) gm_pool_destroy(big);
    (void)a;
    (void)b;
    tb_cleanup(&g_b);
    return test_summary();
}
