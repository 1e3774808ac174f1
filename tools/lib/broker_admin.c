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
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "broker/proto.h"

static int request(const char *path, gm__broker_msg_t *m, gm_broker_admin_result_t *r, char *err,
                   size_t cap)
{
    memset(r, 0, sizeof *r);
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
    gm__broker_msg_t in;
    if (n == (ssize_t)sizeof *m) n = recv(fd, &in, sizeof in, 0);
    else n = -1;
    int e = errno;
    close(fd);
    if (n == 0 || (n < 0 && e == ECONNRESET))
        return snprintf(err, cap, "broker %s closed the connection: a broker older than the "
                        "admin messages?", path), -1;
    if (n < 0) return snprintf(err, cap, "broker %s: %s", path, strerror(e)), -1;
    if (n != (ssize_t)sizeof in || in.magic != GM__BROKER_MAGIC ||
        in.type != GM__BROKER_REPLY || !memchr(in.text, 0, sizeof in.text))
        return snprintf(err, cap, "broker %s answered nonsense", path), -1;
    r->status = in.status;
    r->quota = in.quota;
    r->used = in.used;
    r->peak = in.peak;
    r->refusals = in.refusals;
    r->clients = in.clients;
    if (in.status != 0) return snprintf(err, cap, "broker %s: %s", path, in.text), -1;
    snprintf(r->door, sizeof r->door, "%.107s", in.text);
    return 0;
}

int gm_broker_admin_create(const char *socket, const char *name, uint64_t quota,
                           uint64_t guaranteed, uid_t uid, gid_t gid, uint64_t job, pid_t anchor,
                           gm_broker_admin_result_t *r, char *err, size_t cap)
{
    gm__broker_msg_t m;
    memset(&m, 0, sizeof m);
    m.type = GM__BROKER_ADMIN_CREATE;
    snprintf(m.tenant, sizeof m.tenant, "%s", name);
    m.quota = quota;
    m.guaranteed = guaranteed;
    m.count = uid;
    m.min = gid;
    m.first = job;
    m.pid = anchor;
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
