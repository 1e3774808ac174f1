/* SPDX-License-Identifier: Apache-2.0 */
/*
 * spank_gpumem.c — the Slurm side of the broker (docs/slurm.md): each job
 * gets a tenant in its node's broker with the GPU memory Slurm granted it
 * there, and nothing more.
 *
 * The one idea: Slurm decides who gets how much (the count-only generic
 * resource gpumem, placed by slurmctld across nodes); the broker enforces
 * it (it is the only one that makes pages).  This plugin carries the
 * grant from one to the other and ties the job's processes to it:
 *
 *   slurm_spank_init_post_opt (slurmstepd, root, every step of the job on
 *     this node): asks the controller for the job's grant on this node
 *     (slurm_load_job: gres_detail_str of this node, "gpumem(CNT:N)"; a job
 *     is told nothing of a count-only resource), makes the job's tenant
 *     "job_<id>" in the broker with that quota, guaranteed, and names this
 *     slurmstepd as an anchor: only processes that descend from it (of the
 *     job's uid) are let in at the tenant's door.  Sets GPUMEM_BROKER to the
 *     door in the job's environment.  A job that asked for no gpumem gets
 *     the site's policy (no_request=refuse: the step fails with the reason;
 *     no_request=SIZE: that quota).
 *   slurm_spank_job_epilog (slurmd, root, at the end of the job however it
 *     ended): removes the tenant; the broker drops its processes and takes
 *     every page back, and logs the job's peak and refusals.  If the epilog
 *     never comes (slurmd restarted at the wrong time), the broker removes
 *     a tenant whose anchors are gone after its job_grace.
 *
 * plugstack.conf:
 *   required /usr/local/lib/gpumem/spank_gpumem.so broker=/run/gpumem/broker.sock
 *            [unit=MiB|B] [no_request=refuse|SIZE] [guarantee=yes|no]
 * (%n in broker= is the node's name: several slurmd on one host, each with
 * its broker.)
 * Links only the admin client (tools/lib/broker_admin.c); the Slurm
 * functions resolve from the daemon that loads the plugin.
 */
#include <ctype.h>
#include <stdarg.h>
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

#include "lib/broker_admin.h"

SPANK_PLUGIN(gpumem, 1);

typedef struct opts {
    char broker[108];
    int unit_mib;          /* counts in MiB (else bytes) */
    int refuse;            /* a job without a gpumem request is refused */
    uint64_t default_bytes; /* else its quota */
    int guarantee;
} opts_t;

/* "12G", "512MiB", "1048576" -> bytes. */
static int parse_size(const char *v, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v || v[0] == '-') return -1;
    uint64_t mul = 1;
    switch (toupper((unsigned char)*end)) {
    case '\0': break;
    case 'K': mul = 1ull << 10; break;
    case 'M': mul = 1ull << 20; break;
    case 'G': mul = 1ull << 30; break;
    case 'T': mul = 1ull << 40; break;
    default: return -1;
    }
    if (*end) {
        end++;
        if (!strcasecmp(end, "iB") || !strcasecmp(end, "B")) end += strlen(end);
    }
    if (*end || (mul > 1 && x > UINT64_MAX / mul)) return -1;
    *out = x * mul;
    return 0;
}

static int opts_parse(int ac, char **av, opts_t *o, char *err, size_t cap)
{
    memset(o, 0, sizeof *o);
    snprintf(o->broker, sizeof o->broker, "/run/gpumem/broker.sock");
    o->unit_mib = 1;
    o->refuse = 1;
    o->guarantee = 1;
    for (int i = 0; i < ac; i++) {
        const char *a = av[i];
        if (!strncmp(a, "broker=", 7) && a[7] == '/' && strlen(a + 7) < sizeof o->broker)
            snprintf(o->broker, sizeof o->broker, "%s", a + 7);
        else if (!strcmp(a, "unit=MiB")) o->unit_mib = 1;
        else if (!strcmp(a, "unit=B")) o->unit_mib = 0;
        else if (!strcmp(a, "no_request=refuse")) o->refuse = 1;
        else if (!strncmp(a, "no_request=", 11) && parse_size(a + 11, &o->default_bytes) == 0)
            o->refuse = 0;
        else if (!strcmp(a, "guarantee=yes")) o->guarantee = 1;
        else if (!strcmp(a, "guarantee=no")) o->guarantee = 0;
        else
            return snprintf(err, cap, "plugstack.conf argument '%s' is not understood: give "
                            "broker=/absolute/socket, unit=MiB|B, no_request=refuse|SIZE, "
                            "guarantee=yes|no", a), -1;
    }
    return 0;
}

/* o->broker with %n replaced by node: the socket of this node's broker. */
static void broker_path(const opts_t *o, const char *node, char *out, size_t cap)
{
    size_t n = 0;
    for (const char *s = o->broker; *s && n + 1 < cap; s++) {
        if (s[0] == '%' && s[1] == 'n') {
            n += (size_t)snprintf(out + n, cap - n, "%s", node);
            if (n >= cap) n = cap - 1;
            s++;
        } else {
            out[n++] = *s;
        }
    }
    out[n] = '\0';
}

/* This node's name: SLURMD_NODENAME of the job (or of the epilog). */
static void node_name(spank_t sp, char *node, size_t cap)
{
    node[0] = '\0';
    if (spank_getenv(sp, "SLURMD_NODENAME", node, (int)cap) == ESPANK_SUCCESS && node[0]) return;
    const char *e = getenv("SLURMD_NODENAME");
    if (e) snprintf(node, cap, "%s", e);
    else if (gethostname(node, cap) != 0) snprintf(node, cap, "localhost");
    node[cap - 1] = '\0';
}

/* The count of gpumem in text (gres_detail_str "gpumem(CNT:800)", or
 * tres_per_node "gres:gpumem:800" / "gres/gpumem=800"): 0 found, else -1. */
static int count_in(const char *text, uint64_t *count)
{
    for (const char *p = text ? strstr(text, "gpumem") : NULL; p; p = strstr(p + 6, "gpumem")) {
        if (p != text && p[-1] != ',' && p[-1] != ':' && p[-1] != '/' && p[-1] != ';') continue;
        const char *c = p + 6;
        if (!strncmp(c, "(CNT:", 5)) c += 5;
        else if (*c == ':' || *c == '=') c++;
        else continue;
        char *end;
        unsigned long long x = strtoull(c, &end, 10);
        if (end == c) continue;
        *count = x;
        return 0;
    }
    return -1;
}

/* The job's gpumem count on node (from the controller): 0 found (*count),
 * 1 the job asked for none here, -1 err.  The node's gres_detail_str says
 * what was allocated there; a job that has only just started may not have
 * it yet, so its per-node request (tres_per_node, the same for a count-only
 * resource) answers then. */
static int grant_of(uint32_t job, const char *node, uint64_t *count, char *err, size_t cap)
{
    job_info_msg_t *msg = NULL;
    if (slurm_load_job(&msg, job, SHOW_DETAIL) != 0 || !msg || msg->record_count < 1)
        return snprintf(err, cap, "job %u: slurm_load_job: %s", job,
                        slurm_strerror(slurm_get_errno())), -1;
    slurm_job_info_t *j = &msg->job_array[0];
    int rc = 1, idx = -1;
    hostlist_t hl = j->nodes ? slurm_hostlist_create(j->nodes) : NULL;
    if (hl) {
        idx = slurm_hostlist_find(hl, node);
        slurm_hostlist_destroy(hl);
    }
    if (idx < 0) {
        rc = -1;
        snprintf(err, cap, "job %u: node %s is not in its node list %s", job, node,
                 j->nodes ? j->nodes : "(none)");
    } else if ((uint32_t)idx < j->gres_detail_cnt && count_in(j->gres_detail_str[idx], count) == 0) {
        rc = 0;
    } else if (count_in(j->tres_per_node, count) == 0) {
        rc = 0;
    }
    slurm_free_job_info_msg(msg);
    return rc;
}

/* A step's own gpumem request on node (srun --gres=gpumem:N inside a
 * larger job; Slurm tells it only through the controller's step records):
 * 0 found (*count), 1 the step asked for none (it uses the job's), -1 err. */
static int step_request(uint32_t job, uint32_t step, uint64_t *count, char *err, size_t cap)
{
    job_step_info_response_msg_t *msg = NULL;
    if (slurm_get_job_steps(0, job, step, &msg, SHOW_ALL) != 0 || !msg)
        return snprintf(err, cap, "job %u step %u: slurm_get_job_steps: %s", job, step,
                        slurm_strerror(slurm_get_errno())), -1;
    int rc = 1;
    for (uint32_t i = 0; i < msg->job_step_count && rc == 1; i++) {
        job_step_info_t *s = &msg->job_steps[i];
        if (s->step_id.job_id == job && s->step_id.step_id == step &&
            count_in(s->tres_per_node, count) == 0)
            rc = 0;
    }
    slurm_free_job_step_info_response_msg(msg);
    return rc;
}

/* The step's tenant this slurmstepd made (removed at the step's end). */
static char g_step_tenant[64], g_step_sock[108];

static void say(spank_t sp, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(spank_t sp, const char *fmt, ...)
{
    (void)sp;
    char buf[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    slurm_error("gpumem: %s", buf);
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
    if (!spank_remote(sp)) return 0;
    opts_t o;
    char err[640];
    if (opts_parse(ac, av, &o, err, sizeof err) != 0) {
        say(sp, "%s", err);
        return -1;
    }
    uint32_t job = 0, step = 0;
    uid_t uid = 0;
    gid_t gid = 0;
    if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS) {
        say(sp, "cannot learn the job's id and user from Slurm");
        return -1;
    }
    spank_get_item(sp, S_JOB_STEPID, &step);
    char node[256], sock[108];
    node_name(sp, node, sizeof node);
    broker_path(&o, node, sock, sizeof sock);
    uint64_t count = 0, quota;
    int g = grant_of(job, node, &count, err, sizeof err);
    if (g < 0) {
        say(sp, "job %u on %s: %s; the job's tenant is not made", job, node, err);
        return -1;
    }
    if (g == 1) {
        if (o.refuse && step != SLURM_BATCH_SCRIPT) {
            say(sp, "job %u asked for no GPU memory (give --gres=gpumem:N): this site refuses "
                "jobs without a gpumem request on %s", job, node);
            return -1;
        }
        /* A batch step that fails to start makes slurmctld drain the node:
         * it starts with a tenant of quota 0 instead, so that every lease
         * fails naming the job (a job_submit rule refuses at submission). */
        quota = o.refuse ? 0 : o.default_bytes;
        if (o.refuse)
            say(sp, "job %u asked for no GPU memory (give --gres=gpumem:N): its tenant on %s "
                "gets a quota of 0", job, node);
    } else {
        quota = o.unit_mib ? count << 20 : count;
    }
    /* A step of its own smaller request gets a tenant of it, carved out of
     * the job's (the job's tenant made first, without this step daemon as
     * an anchor: the step's processes cannot come in at the job's door). */
    uint64_t scount = 0, squota = 0;
    int own = 0;
    if (g == 0 && step != SLURM_BATCH_SCRIPT && step != SLURM_EXTERN_CONT) {
        int sr = step_request(job, step, &scount, err, sizeof err);
        if (sr < 0) {
            say(sp, "job %u step %u on %s: %s; the step's tenant is not made", job, step, node,
                err);
            return -1;
        }
        squota = o.unit_mib ? scount << 20 : scount;
        if (sr == 0 && squota > quota) {
            say(sp, "job %u step %u on %s asks for %" PRIu64 " bytes of GPU memory; the job "
                "has %" PRIu64 " here", job, step, node, squota, quota);
            return -1;
        }
        own = sr == 0 && squota < quota;
    }
    char name[64];
    snprintf(name, sizeof name, "job_%u", job);
    gm_broker_admin_result_t r;
    if (gm_broker_admin_create(sock, name, quota, o.guarantee ? quota : 0, uid, gid, job,
                               own ? 0 : getpid(), &r, err, sizeof err) != 0) {
        say(sp, "job %u on %s: the broker did not make its tenant: %s", job, node, err);
        return -1;
    }
    if (own) {
        char sname_[64];
        snprintf(sname_, sizeof sname_, "job_%u.%u", job, step);
        if (gm_broker_admin_carve(sock, sname_, name, squota, o.guarantee ? squota : 0, uid, gid,
                                  job, getpid(), &r, err, sizeof err) != 0) {
            say(sp, "job %u step %u on %s: the step's %" PRIu64 " bytes of GPU memory are not "
                "given: %s", job, step, node, squota, err);
            return -1;
        }
        snprintf(g_step_tenant, sizeof g_step_tenant, "%s", sname_);
        snprintf(g_step_sock, sizeof g_step_sock, "%s", sock);
        snprintf(name, sizeof name, "%s", sname_);
        quota = squota;
    }
    if (spank_setenv(sp, "GPUMEM_BROKER", r.door, 1) != ESPANK_SUCCESS) {
        say(sp, "job %u: cannot set GPUMEM_BROKER in its environment", job);
        return -1;
    }
    spank_setenv(sp, "GPUMEM_TENANT", name, 1);
    char sname[16];
    if (step == SLURM_BATCH_SCRIPT) snprintf(sname, sizeof sname, "batch");
    else if (step == SLURM_EXTERN_CONT) snprintf(sname, sizeof sname, "extern");
    else snprintf(sname, sizeof sname, "%u", step);
    slurm_info("gpumem: job %u step %s on %s: tenant %s, quota %" PRIu64 " bytes, door %s", job,
               sname, node, name, quota, r.door);
    return 0;
}

/* A step's end (slurmstepd): a step that had its own tenant gives its
 * quota back to the job's, and its figures go to the node log.  The batch
 * step's end is the job's: its figures go to the job's error output (the
 * batch step daemon's stderr) as well. */
int slurm_spank_exit(spank_t sp, int ac, char **av)
{
    if (!spank_remote(sp)) return 0;
    uint32_t job = 0, step = 0;
    spank_get_item(sp, S_JOB_ID, &job);
    spank_get_item(sp, S_JOB_STEPID, &step);
    char err[640];
    gm_broker_admin_result_t r;
    if (g_step_tenant[0]) {
        if (gm_broker_admin_remove(g_step_sock, g_step_tenant, &r, err, sizeof err) == 0)
            slurm_info("gpumem: job %u step %u ended: tenant %s removed, its quota back to "
                       "job_%u; peak %" PRIu64 " bytes of quota %" PRIu64 ", held at the end %"
                       PRIu64 ", %" PRIu64 " refusals (%" PRIu64 " out of device memory)", job,
                       step, g_step_tenant, job, r.peak, r.quota, r.used, r.refusals, r.ooms);
        else if (r.status) /* gone already (the job's end, or reaped) */
            slurm_info("gpumem: job %u step %u: removing tenant %s: %s", job, step,
                       g_step_tenant, err);
        g_step_tenant[0] = '\0';
        return 0;
    }
    if (step != SLURM_BATCH_SCRIPT) return 0;
    opts_t o;
    if (opts_parse(ac, av, &o, err, sizeof err) != 0) return 0;
    char name[64], node[256], sock[108];
    snprintf(name, sizeof name, "job_%u", job);
    node_name(sp, node, sizeof node);
    broker_path(&o, node, sock, sizeof sock);
    if (gm_broker_admin_figures(sock, name, &r, err, sizeof err) != 0) return 0;
    fprintf(stderr, "gpumem: job %u on %s: peak %" PRIu64 " bytes of GPU memory of its grant %"
            PRIu64 ", held at the end %" PRIu64 ", %" PRIu64 " allocations refused (%" PRIu64
            " out of device memory)\n", job, node, r.peak, r.quota, r.used, r.refusals, r.ooms);
    fflush(stderr);
    return 0;
}

/* Never fails: a failed epilog drains the node, and the broker reaps a
 * tenant its admin did not remove. */
int slurm_spank_job_epilog(spank_t sp, int ac, char **av)
{
    opts_t o;
    char err[640];
    if (opts_parse(ac, av, &o, err, sizeof err) != 0) {
        say(sp, "%s", err);
        return 0;
    }
    uint32_t job = 0;
    if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS) return 0;
    char name[64], node[256], sock[108];
    snprintf(name, sizeof name, "job_%u", job);
    node_name(sp, node, sizeof node);
    broker_path(&o, node, sock, sizeof sock);
    gm_broker_admin_result_t r;
    if (gm_broker_admin_remove(sock, name, &r, err, sizeof err) != 0) {
        /* No tenant: the job made none here (refused, or no step ran). */
        if (r.status == 0) say(sp, "job %u: removing its tenant: %s", job, err);
        return 0;
    }
    slurm_info("gpumem: job %u ended: tenant %s removed, peak %" PRIu64 " bytes of quota %" PRIu64
               ", held at the end %" PRIu64 ", %" PRIu64 " refusals (%" PRIu64 " out of device "
               "memory)", job, name, r.peak, r.quota, r.used, r.refusals, r.ooms);
    return 0;
}
