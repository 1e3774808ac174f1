/* SPDX-License-Identifier: Apache-2.0 */
/*
 * broker_admin.h — a privileged caller's side of the broker's admin
 * messages (src/broker/proto.h: ADMIN_CREATE, ADMIN_REMOVE): make and
 * remove tenants at run time.  broker_admin.c needs nothing but libc and
 * proto.h, so the Slurm plugin (contrib/slurm/spank_gpumem.c) compiles the
 * same file into a module that slurmstepd loads.
 */
#ifndef GM_TOOLS_BROKER_ADMIN_H
#define GM_TOOLS_BROKER_ADMIN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct gm_broker_admin_result {
    int status;           /* the broker's status (0: done) */
    char door[108];       /* create: the tenant's door (socket path) */
    uint64_t quota, used, peak, refusals, clients; /* bytes; remove: the last figures */
} gm_broker_admin_result_t;

/* Make (or, for the same job, refresh) tenant name with quota and
 * guaranteed bytes for the processes of job (uid, gid) that descend from
 * anchor (0: none yet).  0 with r->door, or -1 with err saying why (the
 * broker's reason when it refused, with r->status). */
int gm_broker_admin_create(const char *socket, const char *name, uint64_t quota,
                           uint64_t guaranteed, uid_t uid, gid_t gid, uint64_t job, pid_t anchor,
                           gm_broker_admin_result_t *r, char *err, size_t cap);

/* Remove tenant name: its processes are dropped, every page back.  0 with
 * its last figures in r, or -1 with err. */
int gm_broker_admin_remove(const char *socket, const char *name, gm_broker_admin_result_t *r,
                           char *err, size_t cap);

#endif /* GM_TOOLS_BROKER_ADMIN_H */
