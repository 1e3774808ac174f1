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
    uint64_t ooms;        /* remove, figures: refusals because the device was full */
    unsigned flags;       /* the reply's (create: GM__BROKER_FLAG_CARVE when it carved) */
} gm_broker_admin_result_t;

/* Make (or, for the same job, refresh) tenant name with quota and
 * guaranteed bytes for the processes of job (uid, gid) that descend from
 * anchor (0: none yet).  0 with r->door, or -1 with err saying why (the
 * broker's reason when it refused, with r->status). */
int gm_broker_admin_create(const char *socket, const char *name, uint64_t quota,
                           uint64_t guaranteed, uid_t uid, gid_t gid, uint64_t job, pid_t anchor,
                           gm_broker_admin_result_t *r, char *err, size_t cap);

/* Make (or refresh) tenant name for a step of job: its quota and up to
 * guaranteed bytes are taken from job_tenant (the job's, made first) and
 * go back to it when name is removed.  Refused (-1, r->status GM_LIMIT)
 * when the job's tenant has not quota bytes left that its processes do not
 * hold; a broker that does not carve is told to remove what it made, and
 * -1 says so.  Else as gm_broker_admin_create. */
int gm_broker_admin_carve(const char *socket, const char *name, const char *job_tenant,
                          uint64_t quota, uint64_t guaranteed, uid_t uid, gid_t gid, uint64_t job,
                          pid_t anchor, gm_broker_admin_result_t *r, char *err, size_t cap);

/* The figures of tenant name now (the broker's STATS, asked by anyone the
 * broker lets see them): 0, or -1 with err (no such tenant, or no answer). */
int gm_broker_admin_figures(const char *socket, const char *name, gm_broker_admin_result_t *r,
                            char *err, size_t cap);

/* Remove tenant name: its processes are dropped, every page back.  0 with
 * its last figures in r, or -1 with err. */
int gm_broker_admin_remove(const char *socket, const char *name, gm_broker_admin_result_t *r,
                           char *err, size_t cap);

#endif /* GM_TOOLS_BROKER_ADMIN_H */
