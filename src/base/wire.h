/* SPDX-License-Identifier: Apache-2.0 */
/*
 * wire.h — the one way gpumem talks to another process: whole fixed-size
 * messages over a Unix-domain SOCK_SEQPACKET socket, with file descriptors
 * (SCM_RIGHTS) attached.  Sharing (src/share/share.c) and the broker (its
 * client, src/broker/client.c, and its daemon, tools/lib/broker.c) use it;
 * each has its own message struct and checks its own fields.
 *
 * A receive is all or nothing: a message whose length is not exactly the
 * expected size, that was truncated, or that carries more descriptors than
 * the caller takes is malformed, and every descriptor it carried is closed.
 */
#ifndef GM_WIRE_H
#define GM_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Most descriptors one message carries. */
#define GM__WIRE_FDS_MAX 64

/* Send len bytes of msg with fds[0..nfds) attached (nfds <= GM__WIRE_FDS_MAX).
 * flags: MSG_DONTWAIT for a server that must not block on a slow peer.
 * GM_OK, or GM_IO with a message naming `who`. */
int gm__wire_send(int fd, const void *msg, size_t len, const int *fds, size_t nfds, int flags,
                  const char *who);

/* The same as one sendmsg(2) (MSG_NOSIGNAL added, EINTR retried), the
 * control message built in ctl[0..ctl_cap) (aligned for a struct cmsghdr,
 * room for CMSG_SPACE of nfds descriptors): what sendmsg returned, errno
 * set when -1.  For a caller that attaches more than GM__WIRE_FDS_MAX. */
ssize_t gm__wire_sendmsg(int fd, const void *msg, size_t len, const int *fds, size_t nfds,
                         int flags, void *ctl, size_t ctl_cap);

/* Receive one message of exactly len bytes into msg; descriptors attached
 * go to fds[0..*nfds) (at most cap; fds NULL takes none).  GM_OK; GM_IO when
 * the peer closed (*closed set) or the socket failed; GM_NOT_READY when the
 * socket's receive timeout passed ("no answer in timeout_s s"); GM_PARSE
 * when malformed (descriptors closed).  A message the peer sent before it
 * closed is delivered even when the close reset the connection. */
int gm__wire_recv(int fd, void *msg, size_t len, int *fds, size_t cap, size_t *nfds,
                  bool *closed, int timeout_s, const char *who);

/* The peer's credentials (SO_PEERCRED).  GM_OK or GM_IO. */
int gm__wire_peer(int fd, pid_t *pid, uid_t *uid, gid_t *gid);

/* A path free for a new listening socket: nothing there, or a stale socket
 * owned by this uid that nobody listens on (removed).  A live listener or
 * any other file: GM_INVALID_STATE.  `fn` names the caller in messages. */
int gm__wire_claim_path(const char *fn, const char *path);

/* path is usable as a socket address: GM_OK or GM_INVALID_ARGUMENT. */
int gm__wire_check_path(const char *fn, const char *path);

/* Connect a SOCK_SEQPACKET socket to path with send and receive timeouts of
 * timeout_s seconds (set before connecting, so a listener that never
 * accepts cannot hold the caller).  GM_OK with *fd (close-on-exec), or
 * GM_IO / GM_DENIED (no permission) / GM_INVALID_ARGUMENT naming fn. */
int gm__wire_connect(const char *fn, const char *path, int timeout_s, int *fd);

#endif /* GM_WIRE_H */
