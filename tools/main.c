/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gpumem.c — the `gpumem` command: main, the subcommand table, `help`,
 * `--version`, the `info` subcommand and the small helpers subcommands share.
 *
 * The one idea: main only dispatches.  Each subcommand lives in its own file
 * behind one entry point declared in cli.h, parses its own options and
 * returns the exit status (0 ok, 1 the work failed, 2 bad usage or input),
 * so adding one is a row in `commands` below and nothing else here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cli.h"
#include "core/options.h"
#include "gpumem.h"
#include "base/internal.h"

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    void (*usage)(FILE *out);
    const char *summary;
} command_t;

static const command_t commands[] = {
    {"replay", gm_cli_replay, gm_cli_replay_usage,
     "replay allocation traces (RMM CSV) through a pool and report its efficiency"},
    {"synth", gm_cli_synth, gm_cli_synth_usage,
     "write a synthetic trace of a workload (LLM serving, ViT, pipelines ...)"},
    {"info", gm_cli_info, gm_cli_info_usage, "show the backend and device a pool uses"},
    {"report", gm_cli_report, gm_cli_report_usage,
     "write a self-contained HTML report of a trace (timeline, block map, sizes)"},
    {"top", gm_cli_top, gm_cli_top_usage, "live view of every process using gpumem"},
    {"metrics", gm_cli_metrics, gm_cli_metrics_usage,
     "print every gpumem process's counters in Prometheus text format"},
    {"broker", gm_cli_broker, gm_cli_broker_usage,
     "own a GPU's memory and lease it to processes within tenant quotas"},
    {"broker-admin", gm_cli_broker_admin, gm_cli_broker_admin_usage,
     "make or remove a broker's tenant at run time (a Slurm job's)"},
    {"gres-conf", gm_cli_gres_conf, gm_cli_gres_conf_usage,
     "print the Slurm gres.conf line for this node's GPU memory"},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *out)
{
    fprintf(out, "usage: gpumem COMMAND [OPTIONS]\n\ncommands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(out, "  %-8s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "  %-8s %s\n", "help", "show this help, or a command's: gpumem help replay");
    fprintf(out, "\n  gpumem --version    print the version\n"
                 "\nexit status: 0 ok, 1 the work failed, 2 bad usage or input\n");
}

static const command_t *find_command(const char *name)
{
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (strcmp(commands[i].name, name) == 0) return &commands[i];
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--version") == 0) {
        printf("gpumem %s\n", gm_version());
        return 0;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        if (argc > 2) {
            const command_t *c = find_command(argv[2]);
            if (!c) {
                fprintf(stderr, "gpumem: unknown command '%s'\n", argv[2]);
                usage(stderr);
                return 2;
            }
            c->usage(stdout);
        } else {
            usage(stdout);
        }
        return 0;
    }
    const command_t *c = find_command(cmd);
    if (!c) {
        fprintf(stderr, "gpumem: unknown %s '%s'\n", cmd[0] == '-' ? "option" : "command", cmd);
        usage(stderr);
        return 2;
    }
    return c->run(argc - 1, argv + 1);
}

/* ---- shared helpers --------------------------------------------------- */

const char *gm_cli_option(int argc, char **argv, int *i, const char *name, int *missing)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, "--", 2) != 0 || strncmp(a + 2, name, n) != 0) return NULL;
    if (a[2 + n] == '=') return a + 3 + n;
    if (a[2 + n] != '\0') return NULL;
    if (*i + 1 >= argc) {
        fprintf(stderr, "gpumem: option --%s needs a value\n", name);
        *missing = 1;
        return NULL;
    }
    return argv[++*i];
}

int gm_cli_parse_backend(const char *s, gm_backend_kind_t *kind)
{
    if (gm__parse_backend(s, kind) == GM_OK) return 0; /* the library's parser (options.c) */
    fprintf(stderr, "gpumem: unknown backend '%s' (auto, sim or cuda)\n", s);
    return -1;
}

void gm_cli_json_string(FILE *out, const char *s)
{
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(out, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(out, "\\u%04x", *p);
        else
            fputc(*p, out);
    }
    fputc('"', out);
}

/* ---- info ------------------------------------------------------------- */

void gm_cli_info_usage(FILE *out)
{
    fprintf(out, "usage: gpumem info [--backend auto|sim|cuda] [--device N]\n"
                 "       gpumem info --options\n\n"
                 "Create a pool on the backend (default: GPUMEM_BACKEND, GPUMEM_DEVICE,\n"
                 "else auto and device 0) and print the backend, why it was chosen,\n"
                 "what probing each backend found, and the device.  auto (the default)\n"
                 "takes cuda when an NVIDIA driver is installed and the sim only when none\n"
                 "is; a driver that cannot serve the device is an error, not the sim.\n"
                 "Exit status 1 when that backend cannot be used here.\n\n"
                 "--options prints every GPUMEM_* environment variable the library reads:\n"
                 "its value here, whether that is the default or from the environment,\n"
                 "and what it does (exit status 1 when a value is not valid).\n");
}

/* The options table (src/core/options.c), one row per variable. */
static int info_options(void)
{
    int bad = 0;
    printf("%-24s %-12s %-11s %s\n", "variable", "value", "from", "meaning");
    for (int i = 0; i < GM_OPT_COUNT; i++) {
        const gm__option_t *o = gm__option((gm__opt_t)i);
        const char *env = gm__option_env((gm__opt_t)i);
        const char *v = env ? env : o->def;
        bool ok = gm__option_valid((gm__opt_t)i, env);
        if (!ok) bad = 1;
        printf("%-24s %-12s %-11s %s\n", o->name, *v ? v : "(unset)",
               !env ? "default" : ok ? "environment" : "INVALID", o->doc);
    }
    return bad;
}

static const char *fmt_memory(size_t bytes, char *buf, size_t cap)
{
    char h[32];
    snprintf(buf, cap, "%s (%zu bytes)", gm__fmt_bytes(bytes, h, sizeof h), bytes);
    return buf;
}

int gm_cli_info(int argc, char **argv)
{
    /* The pool a program would get: the environment (GPUMEM_BACKEND,
     * GPUMEM_DEVICE ...), then the options. */
    /* Before the environment is applied: the table shows a bad value
     * instead of stopping at it. */
    if (argc == 2 && strcmp(argv[1], "--options") == 0) return info_options();
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    if (gm_config_from_env(&cfg) != GM_OK) {
        fprintf(stderr, "gpumem info: %s\n", gm_last_error());
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v;
        if ((v = gm_cli_option(argc, argv, &i, "backend", &missing))) {
            if (gm_cli_parse_backend(v, &cfg.backend)) return 2;
        } else if ((v = gm_cli_option(argc, argv, &i, "device", &missing))) {
            char *end;
            long d = strtol(v, &end, 10);
            if (*v == '\0' || *end != '\0' || d < 0 || d > 1024) {
                fprintf(stderr, "gpumem info: bad device '%s'\n", v);
                return 2;
            }
            cfg.device = (int)d;
        } else if (strcmp(argv[i], "--options") == 0) {
            fprintf(stderr, "gpumem info: --options takes no other argument\n");
            gm_cli_info_usage(stderr);
            return 2;
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            gm_cli_info_usage(stdout);
            return 0;
        } else {
            if (!missing) fprintf(stderr, "gpumem info: unknown argument '%s'\n", argv[i]);
            gm_cli_info_usage(stderr);
            return 2;
        }
    }

    /* What each backend's probe finds, shown whichever way the choice goes. */
    char probed[1024];
    gm__backend_describe(cfg.device, "\n                ", probed, sizeof probed);
    gm_pool_t *pool = NULL;
    if (gm_pool_create(&cfg, &pool) != GM_OK) {
        fprintf(stderr, "gpumem info: cannot use backend %s on device %d: %s\n",
                gm__backend_kind_name(cfg.backend), cfg.device, gm_last_error());
        fprintf(stderr, "probed:         %s\n", probed);
        return 1;
    }
    gm_device_info_t di = GM_DEVICE_INFO_INIT;
    if (gm_pool_device_info(pool, &di) != GM_OK) {
        fprintf(stderr, "gpumem info: %s\n", gm_last_error());
        gm_pool_destroy(pool);
        return 1;
    }
    gm_pool_destroy(pool);

    char buf[64], drv[32] = "none";
    if (di.driver_version > 0)
        snprintf(drv, sizeof drv, "%d.%d (%d)", di.driver_version / 1000,
                 di.driver_version % 1000 / 10, di.driver_version);
    printf("backend:        %s (%s)\n", di.backend_name, di.backend_reason);
    printf("probed:         %s\n", probed);
    printf("device:         %d: %s\n", di.device, di.device_name);
    printf("driver version: %s\n", drv);
    printf("total memory:   %s\n", fmt_memory(di.total_memory, buf, sizeof buf));
    printf("free memory:    %s\n", fmt_memory(di.free_memory, buf, sizeof buf));
    if (di.granularity && di.granularity % (1u << 20) == 0)
        printf("granularity:    %zu MiB\n", di.granularity >> 20);
    else
        printf("granularity:    %zu bytes\n", di.granularity);
    if (di.granularity_recommended != di.granularity)
        printf("recommended:    %zu MiB (registrable segments)\n", di.granularity_recommended >> 20);
    printf("VMM supported:  %s\n", di.vmm_supported ? "yes" : "no (plain allocations)");
    printf("devices:        %d\n", di.device_count);
    char peers[256] = "none";
    size_t n = 0;
    for (int d = 0; d < 64 && n < sizeof peers - 4; d++)
        if (di.peers & ((uint64_t)1 << d))
            n += (size_t)snprintf(peers + n, sizeof peers - n, "%s%d", n ? "," : "", d);
    printf("peers:          %s (GPUMEM_PEERS)\n", peers);
    printf("page handles:   %s%s%s\n", di.handle_types & GM_HANDLE_POSIX_FD ? "posix-fd" : "none",
           di.handle_types & GM_HANDLE_FABRIC ? " fabric" : "", di.rdma_capable ? ", RDMA capable" : "");
    printf("compression:    %s%s\n", di.compression_supported ? "supported" : "not supported",
           di.compressible ? ", pages compressible" : "");
    return 0;
}
