/* SPDX-License-Identifier: Apache-2.0 */
/*
 * broker_admin.c — make and remove a broker's tenants at run time
 * (broker_admin.h).  One request, one reply, on a fresh connection to the
 * broker's socket; the server's credentials are checked first (root or
 * this process's uid), as the library's client does, so a socket another
 * user bound is never told a job's figures.  Only libc and proto.h: the
 * Slurm plugin links this file alone.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* struct ucred */
#endif
#include "lib/broker_admin.h"

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "broker/proto.h"

/* m to the broker on path, its one reply in *in: 0, or -1 with err. */
static int exchange(const char *path, gm__broker_msg_t *m, gm__broker_msg_t *in, char *err,
                    size_t cap)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (!path || !*path || strlen(path) >= sizeof a.sun_path)
        return snprintf(err, cap, "broker socket '%s' is not a socket path", path ? path : ""), -1;
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) return snprintf(err, cap, "socket: %s", strerror(errno)), -1;
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        snprintf(err, cap, "broker %s: %s (is gpumem broker running?)", path, strerror(errno));
        close(fd);
        return -1;
    }
    struct ucred cr;
    socklen_t len = sizeof cr;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0 ||
        (cr.uid != 0 && cr.uid != geteuid())) {
        snprintf(err, cap, "broker %s: the server runs as uid %u, not root or uid %u: not "
                 "trusted", path, (unsigned)cr.uid, (unsigned)geteuid());
        close(fd);
        return -1;
    }
    m->magic = GM__BROKER_MAGIC;
    m->version = GM__BROKER_VERSION;
    ssize_t n = send(fd, m, sizeof *m, MSG_NOSIGNAL);
    if (n == (ssize_t)sizeof *m) n = recv(fd, in, sizeof *in, 0);
    else n = -1;
    int e = errno;
    close(fd);
    if (n == 0 || (n < 0 && e == ECONNRESET))
        return snprintf(err, cap, "broker %s closed the connection: a broker older than the "
                        "admin messages?", path), -1;
    if (n < 0) return snprintf(err, cap, "broker %s: %s", path, strerror(e)), -1;
    if (n != (ssize_t)sizeof *in || in->magic != GM__BROKER_MAGIC ||
        in->type != GM__BROKER_REPLY || !memchr(in->text, 0, sizeof in->text) ||
        !memchr(in->tenant, 0, sizeof in->tenant))
        return snprintf(err, cap, "broker %s answered nonsense", path), -1;
    return 0;
}

static void figures(const gm__broker_msg_t *in, bool stats, gm_broker_admin_result_t *r)
{
    r->status = in->status;
    r->quota = in->quota;
    r->used = in->used;
    r->peak = in->peak;
    r->refusals = in->refusals;
    r->clients = in->clients;
    r->flags = in->flags;
    /* A STATS reply's count is the number of tenants; its min the OOMs. */
    r->ooms = stats ? in->min : in->count;
}

static int request(const char *path, gm__broker_msg_t *m, gm_broker_admin_result_t *r, char *err,
                   size_t cap)
{
    memset(r, 0, sizeof *r);
    gm__broker_msg_t in;
    if (exchange(path, m, &in, err, cap) != 0) return -1;
    figures(&in, false, r);
    if (in.status != 0) return snprintf(err, cap, "broker %s: %s", path, in.text), -1;
    snprintf(r->door, sizeof r->door, "%.107s", in.text);
    return 0;
}

/* An ADMIN_CREATE of tenant name for job (uid, gid), anchored on anchor. */
static void create_msg(gm__broker_msg_t *m, const char *name, uint64_t quota, uint64_t guaranteed,
                       uid_t uid, gid_t gid, uint64_t job, pid_t anchor)
{
    memset(m, 0, sizeof *m);
    m->type = GM__BROKER_ADMIN_CREATE;
    snprintf(m->tenant, sizeof m->tenant, "%s", name);
    m->quota = quota;
    m->guaranteed = guaranteed;
    m->count = uid;
    m->min = gid;
    m->first = job;
    m->pid = anchor;
}

int gm_broker_admin_create(const char *socket, const char *name, uint64_t quota,
                           uint64_t guaranteed, uid_t uid, gid_t gid, uint64_t job, pid_t anchor,
                           gm_broker_admin_result_t *r, char *err, size_t cap)
{
    gm__broker_msg_t m;
    create_msg(&m, name, quota, guaranteed, uid, gid, job, anchor);
    return request(socket, &m, r, err, cap);
}

int gm_broker_admin_remove(const char *socket, const char *name, gm_broker_admin_result_t *r,
                           char *err, size_t cap)
{
    gm__broker_msg_t m;
    memset(&m, 0, sizeof m);
    m.type = GM__BROKER_ADMIN_REMOVE;
    snprintf(m.tenant, sizeof m.tenant, "%s", name);
    return request(socket, &m, r, err, cap);
}

int gm_broker_admin_carve(const char *socket, const char *name, const char *job_tenant,
                          uint64_t quota, uint64_t guaranteed, uid_t uid, gid_t gid, uint64_t job,
                          pid_t anchor, gm_broker_admin_result_t *r, char *err, size_t cap)
{
    gm__broker_msg_t m;
    create_msg(&m, name, quota, guaranteed, uid, gid, job, anchor);
    m.flags = GM__BROKER_FLAG_CARVE;
    snprintf(m.text, sizeof m.text, "%s", job_tenant);
    if (request(socket, &m, r, err, cap) != 0) return -1;
    if (!(r->flags & GM__BROKER_FLAG_CARVE)) {
        /* A broker of before carving made a tenant of its own, beside the
         * job's: that would give the step more than the job's grant. */
        gm_broker_admin_result_t gone;
        char e2[8];
        gm_broker_admin_remove(socket, name, &gone, e2, sizeof e2);
        return snprintf(err, cap, "broker %s does not carve a step's tenant out of its job's "
                        "(a broker older than this plugin)", socket), -1;
    }
    return 0;
}

int gm_broker_admin_figures(const char *socket, const char *name, gm_broker_admin_result_t *r,
                            char *err, size_t cap)
{
    memset(r, 0, sizeof *r);
    for (uint64_t k = 0;; k++) {
        gm__broker_msg_t m, in;
        memset(&m, 0, sizeof m);
        m.type = GM__BROKER_STATS;
        m.first = k;
        if (exchange(socket, &m, &in, err, cap) != 0) return -1;
        if (k >= in.count || in.first != k)
            return snprintf(err, cap, "broker %s has no tenant '%s'", socket, name), -1;
        if (!strcmp(in.tenant, name)) {
            figures(&in, true, r);
            return 0;
        }
    }
}
