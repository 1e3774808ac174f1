/* SPDX-License-Identifier: Apache-2.0 */
/*
 * slurm.c — the commands a Slurm site uses around the broker (docs/slurm.md):
 * `gpumem gres-conf` prints the node's gres.conf line (its GPU memory, less
 * what the site keeps back, as a count-only generic resource) and
 * `gpumem broker-admin` makes and removes a broker's tenants at run time,
 * as the SPANK plugin does for each job (tools/lib/broker_admin.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/internal.h"
#include "cli.h"
#include "gpumem.h"
#include "lib/broker_admin.h"

void gm_cli_gres_conf_usage(FILE *out)
{
    fprintf(out,
            "usage: gpumem gres-conf [--backend auto|sim|cuda] [--device N] [--keep BYTES]\n"
            "                        [--node NAME] [--unit MiB|B]\n\n"
            "Print the gres.conf line that tells Slurm this node's GPU memory, as the\n"
            "count-only generic resource gpumem: the memory of every device (or of device\n"
            "N, the one the node's broker serves), less --keep\n"
            "per device (what the site keeps back: the driver's context, other users), in\n"
            "MiB (the default; jobs ask --gres=gpumem:16384) or bytes (--unit B; jobs ask\n"
            "--gres=gpumem:16G).  The plugin's unit= must say the same.  Also prints the\n"
            "slurm.conf node line's Gres= value as a comment.\n");
}

int gm_cli_gres_conf(int argc, char **argv)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    if (gm_config_from_env(&cfg) != GM_OK) {
        fprintf(stderr, "gpumem gres-conf: %s\n", gm_last_error());
        return 2;
    }
    cfg.broker[0] = '\0'; /* the device itself, never a broker's share of it */
    size_t keep = 0;
    int unit_mib = 1, only = -1;
    char node[256];
    if (gethostname(node, sizeof node) != 0) snprintf(node, sizeof node, "localhost");
    node[sizeof node - 1] = '\0';
    char *dot = strchr(node, '.');
    if (dot) *dot = '\0';
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v;
        if ((v = gm_cli_option(argc, argv, &i, "backend", &missing))) {
            if (gm_cli_parse_backend(v, &cfg.backend)) return 2;
        } else if ((v = gm_cli_option(argc, argv, &i, "keep", &missing))) {
            if (gm__parse_size(v, &keep) != GM_OK) {
                fprintf(stderr, "gpumem gres-conf: --keep '%s' is not valid: give a size such as "
                        "2GiB\n", v);
                return 2;
            }
        } else if ((v = gm_cli_option(argc, argv, &i, "device", &missing))) {
            char *end;
            long d = strtol(v, &end, 10);
            if (!*v || *end || d < 0 || d > 1024) {
                fprintf(stderr, "gpumem gres-conf: --device '%s' is not valid: give 0 to 1024\n", v);
                return 2;
            }
            only = (int)d;
        } else if ((v = gm_cli_option(argc, argv, &i, "node", &missing))) {
            snprintf(node, sizeof node, "%s", v);
        } else if ((v = gm_cli_option(argc, argv, &i, "unit", &missing))) {
            if (!strcmp(v, "MiB")) unit_mib = 1;
            else if (!strcmp(v, "B")) unit_mib = 0;
            else {
                fprintf(stderr, "gpumem gres-conf: --unit '%s' is not valid: give MiB or B\n", v);
                return 2;
            }
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            gm_cli_gres_conf_usage(stdout);
            return 0;
        } else {
            if (!missing) fprintf(stderr, "gpumem gres-conf: unknown argument '%s'\n", argv[i]);
            gm_cli_gres_conf_usage(stderr);
            return 2;
        }
    }
    unsigned long long total = 0;
    int count = 1;
    for (int d = only >= 0 ? only : 0; d < count; d++) {
        cfg.device = d;
        gm_pool_t *pool = NULL;
        gm_device_info_t di = GM_DEVICE_INFO_INIT;
        if (gm_pool_create(&cfg, &pool) != GM_OK || gm_pool_device_info(pool, &di) != GM_OK) {
            fprintf(stderr, "gpumem gres-conf: device %d: %s\n", d, gm_last_error());
            if (pool) gm_pool_destroy(pool);
            return 1;
        }
        gm_pool_destroy(pool);
        count = only >= 0 ? only + 1 : di.device_count > 0 ? di.device_count : 1;
        if (di.total_memory <= keep) {
            fprintf(stderr, "gpumem gres-conf: device %d has %zu bytes, no more than --keep %zu\n",
                    d, di.total_memory, keep);
            return 1;
        }
        total += di.total_memory - keep;
    }
    unsigned long long n = unit_mib ? total >> 20 : total;
    printf("# slurm.conf: NodeName=%s ... Gres=gpumem:%llu   (GresTypes=gpumem)\n", node, n);
    printf("NodeName=%s Name=gpumem Count=%llu\n", node, n);
    return 0;
}

void gm_cli_broker_admin_usage(FILE *out)
{
    fprintf(out,
            "usage: gpumem broker-admin [--socket PATH] create-tenant NAME --quota BYTES\n"
            "                           [--guaranteed BYTES] [--uid UID] [--gid GID]\n"
            "                           [--job ID] [--anchor PID]\n"
            "       gpumem broker-admin [--socket PATH] remove-tenant NAME\n\n"
            "Make or remove a broker tenant at run time (root, the broker's uid or a user\n"
            "of its admins = line).  create-tenant prints the tenant's door, the socket its\n"
            "processes use (GPUMEM_BROKER): only processes of uid that descend from the\n"
            "anchor process are let in.  The socket is GPUMEM_BROKER's unless --socket.\n");
}

int gm_cli_broker_admin(int argc, char **argv)
{
    const char *sock = getenv("GPUMEM_BROKER"), *verb = NULL, *name = NULL;
    unsigned long long uid = getuid(), gid = getgid(), job = 0, anchor = 0;
    size_t quota = 0, guaranteed = 0;
    int have_quota = 0;
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v;
        unsigned long long *num = NULL;
        size_t *size = NULL;
        if ((v = gm_cli_option(argc, argv, &i, "socket", &missing))) sock = v;
        else if ((v = gm_cli_option(argc, argv, &i, "quota", &missing))) size = &quota, have_quota = 1;
        else if ((v = gm_cli_option(argc, argv, &i, "guaranteed", &missing))) size = &guaranteed;
        else if ((v = gm_cli_option(argc, argv, &i, "uid", &missing))) num = &uid;
        else if ((v = gm_cli_option(argc, argv, &i, "gid", &missing))) num = &gid;
        else if ((v = gm_cli_option(argc, argv, &i, "job", &missing))) num = &job;
        else if ((v = gm_cli_option(argc, argv, &i, "anchor", &missing))) num = &anchor;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            gm_cli_broker_admin_usage(stdout);
            return 0;
        } else if (!missing && argv[i][0] != '-' && !verb) verb = argv[i];
        else if (!missing && argv[i][0] != '-' && !name) name = argv[i];
        else {
            if (!missing) fprintf(stderr, "gpumem broker-admin: unknown argument '%s'\n", argv[i]);
            gm_cli_broker_admin_usage(stderr);
            return 2;
        }
        if (missing) return 2;
        if (size && gm__parse_size(v, size) != GM_OK) {
            fprintf(stderr, "gpumem broker-admin: '%s' is not a size such as 16GiB\n", v);
            return 2;
        }
        if (num) {
            char *end;
            *num = strtoull(v, &end, 10);
            if (!*v || *end || v[0] == '-' || *num > 0xfffffffeull) {
                fprintf(stderr, "gpumem broker-admin: '%s' is not a number\n", v);
                return 2;
            }
        }
    }
    int create = verb && !strcmp(verb, "create-tenant");
    if (!verb || !name || (!create && strcmp(verb, "remove-tenant") != 0) || (create && !have_quota)) {
        fprintf(stderr, "gpumem broker-admin: %s\n", !verb || !name ? "give create-tenant NAME "
                "--quota BYTES or remove-tenant NAME" : create ? "create-tenant needs --quota"
                : "the verbs are create-tenant and remove-tenant");
        gm_cli_broker_admin_usage(stderr);
        return 2;
    }
    if (!sock || !*sock) {
        fprintf(stderr, "gpumem broker-admin: no broker: give --socket PATH or set GPUMEM_BROKER\n");
        return 2;
    }
    gm_broker_admin_result_t r;
    char err[512];
    if (create) {
        if (gm_broker_admin_create(sock, name, quota, guaranteed, (uid_t)uid, (gid_t)gid, job,
                                   (pid_t)anchor, &r, err, sizeof err) != 0) {
            fprintf(stderr, "gpumem broker-admin: %s\n", err);
            return 1;
        }
        printf("%s\n", r.door);
        return 0;
    }
    if (gm_broker_admin_remove(sock, name, &r, err, sizeof err) != 0) {
        fprintf(stderr, "gpumem broker-admin: %s\n", err);
        return 1;
    }
    printf("tenant %s removed: peak %llu bytes, held %llu bytes, %llu refusals, %llu processes\n",
           name, (unsigned long long)r.peak, (unsigned long long)r.used,
           (unsigned long long)r.refusals, (unsigned long long)r.clients);
    return 0;
}
