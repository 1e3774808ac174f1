/* SPDX-License-Identifier: Apache-2.0 */
/*
 * wire.c — whole messages with descriptors over SOCK_SEQPACKET (wire.h).
 */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/internal.h"
#include "base/wire.h"

ssize_t gm__wire_sendmsg(int fd, const void *msg, size_t len, const int *fds, size_t nfds,
                         int flags, void *ctl, size_t ctl_cap)
{
    struct iovec iov = {.iov_base = (void *)msg, .iov_len = len};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    gm_assert(CMSG_SPACE(sizeof(int) * nfds) <= ctl_cap || nfds == 0);
    if (nfds) {
        memset(ctl, 0, CMSG_SPACE(sizeof(int) * nfds));
        mh.msg_control = ctl;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
    }
    ssize_t n;
    do n = sendmsg(fd, &mh, flags | MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n;
}

int gm__wire_send(int fd, const void *msg, size_t len, const int *fds, size_t nfds, int flags,
                  const char *who)
{
    union {
        char buf[CMSG_SPACE(sizeof(int) * GM__WIRE_FDS_MAX)];
        struct cmsghdr align;
    } u;
    gm_assert(nfds <= GM__WIRE_FDS_MAX);
    ssize_t n = gm__wire_sendmsg(fd, msg, len, fds, nfds, flags, u.buf, sizeof u.buf);
    if (n == (ssize_t)len) return GM_OK;
    return gm__set_error(GM_IO, "%s: send failed: %s", who, n < 0 ? strerror(errno) : "short message");
}

int gm__wire_recv(int fd, void *msg, size_t len, int *fds, size_t cap, size_t *nfds,
                  bool *closed, int timeout_s, const char *who)
{
    struct iovec iov = {.iov_base = msg, .iov_len = len};
    union {
        char buf[CMSG_SPACE(sizeof(int) * GM__WIRE_FDS_MAX)];
        struct cmsghdr align;
    } u;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                        .msg_controllen = sizeof u.buf};
    *nfds = 0;
    *closed = false;
    ssize_t n;
    do n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    if (n < 0 && errno == ECONNRESET) {
        /* A peer that closed with our message unread resets the
         * connection, and the reset is reported before what it sent
         * first (a refusal, say): that message is still queued. */
        mh.msg_controllen = sizeof u.buf;
        mh.msg_flags = 0;
        do n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        while (n < 0 && errno == EINTR);
        if (n <= 0) {
            n = -1;
            errno = ECONNRESET;
        }
    }
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return gm__set_error(GM_NOT_READY, "%s: no answer in %d s", who, timeout_s);
        if (errno == ECONNRESET) *closed = true;
        return gm__set_error(GM_IO, "%s: receive failed: %s", who, strerror(errno));
    }
    bool bad = false;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        int *in = (int *)CMSG_DATA(c);
        for (size_t i = 0; i < k; i++) {
            if (fds && *nfds < cap) fds[(*nfds)++] = in[i];
            else {
                close(in[i]);
                bad = true;
            }
        }
    }
    if (n == 0 && !bad && *nfds == 0) {
        *closed = true;
        return gm__set_error(GM_IO, "%s: the other side closed the connection", who);
    }
    if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) bad = true;
    if (bad || n != (ssize_t)len) {
        for (size_t i = 0; i < *nfds; i++) close(fds[i]);
        *nfds = 0;
        return gm__set_error(GM_PARSE, "%s: malformed message (%zd bytes, %zu expected)", who, n,
                             len);
    }
    return GM_OK;
}

int gm__wire_peer(int fd, pid_t *pid, uid_t *uid, gid_t *gid)
{
    struct ucred cr;
    socklen_t len = sizeof cr;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0)
        return gm__set_error(GM_IO, "SO_PEERCRED: %s", strerror(errno));
    if (pid) *pid = cr.pid;
    if (uid) *uid = cr.uid;
    if (gid) *gid = cr.gid;
    return GM_OK;
}

int gm__wire_check_path(const char *fn, const char *path)
{
    if (!path || !*path) return gm__set_error(GM_INVALID_ARGUMENT, "%s: empty socket path", fn);
    if (strlen(path) >= sizeof(((struct sockaddr_un *)0)->sun_path))
        return gm__set_error(GM_INVALID_ARGUMENT, "%s: socket path longer than %zu bytes", fn,
                             sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
    return GM_OK;
}

int gm__wire_claim_path(const char *fn, const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) return GM_OK;
        return gm__set_error(GM_IO, "%s: %s: %s", fn, path, strerror(errno));
    }
    if (!S_ISSOCK(st.st_mode))
        return gm__set_error(GM_INVALID_STATE, "%s: %s exists and is not a socket", fn, path);
    if (st.st_uid != geteuid())
        return gm__set_error(GM_INVALID_STATE, "%s: %s is a socket of uid %u", fn, path,
                             (unsigned)st.st_uid);
    /* Non-blocking: a listener whose queue is full answers EAGAIN at once
     * instead of holding the probe (it is alive, so the path is taken). */
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return gm__set_error(GM_IO, "%s: socket: %s", fn, strerror(errno));
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    memcpy(a.sun_path, path, strlen(path) + 1);
    int c = connect(fd, (struct sockaddr *)&a, sizeof a);
    int err = errno;
    close(fd);
    if (c == 0 || err == EAGAIN || err == EINPROGRESS)
        return gm__set_error(GM_INVALID_STATE, "%s: a server is listening on %s", fn, path);
    if (err != ECONNREFUSED)
        return gm__set_error(GM_INVALID_STATE, "%s: %s: %s", fn, path, strerror(err));
    if (unlink(path) != 0 && errno != ENOENT)
        return gm__set_error(GM_IO, "%s: removing the stale %s: %s", fn, path, strerror(errno));
    return GM_OK;
}

int gm__wire_connect(const char *fn, const char *path, int timeout_s, int *out)
{
    *out = -1;
    GM_CHECK(gm__wire_check_path(fn, path));
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) return gm__set_error(GM_IO, "%s: socket: %s", fn, strerror(errno));
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    memcpy(a.sun_path, path, strlen(path) + 1);
    /* Timeouts first: they also bound connect() to a server whose queue is
     * full. */
    struct timeval tv = {.tv_sec = timeout_s};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        int e = errno;
        close(fd);
        return gm__set_error(e == EACCES ? GM_DENIED : GM_IO, "%s: %s: %s", fn, path,
                             strerror(e));
    }
    *out = fd;
    return GM_OK;
}
