/* SPDX-License-Identifier: Apache-2.0 */
/*
 * top.c — `gpumem top`: a live view of every process on this machine that
 * uses gpumem, one line per pool: pid, command, device, backend, allocated,
 * reserved, cached, peak, OOMs.
 *
 * The one idea: nothing to connect to.  Each process publishes its pools'
 * counters in a small shared segment (src/observe/monitor.c); this command only
 * reads those files, like top reads /proc, and refreshes.  The files may be
 * hostile: the reader (lib/monitor_read.h) hands over only printable ASCII
 * strings and checked field names, and JSON strings are quoted here.
 */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <unistd.h>

#include "cli.h"
#include "base/internal.h"
#include "lib/broker.h"
#include "lib/monitor_read.h"

void gm_cli_top_usage(FILE *out)
{
    fprintf(out,
            "usage: gpumem top [--once] [--json] [--interval SECONDS]\n\n"
            "Show every process using gpumem on this machine, one line per pool:\n"
            "pid, command, device, backend, allocated (requested bytes), reserved,\n"
            "cached, reserved peak, OOMs, bytes other processes map (exported), bytes\n"
            "mapped from other processes (imported).  Refreshes every second (q or\n"
            "Ctrl-C quits).\n"
            "Processes publish their counters in $GPUMEM_MONITOR_DIR or /dev/shm\n"
            "(gpumem.<pid>); files of dead processes are ignored and removed.\n\n"
            "  --once          print one snapshot and exit (also without a terminal)\n"
            "  --json          one JSON array of processes (implies --once)\n"
            "  --interval S    seconds between refreshes, 0.1 to 3600 (default 1)\n"
            "  --broker PATH   also show the tenants of the broker on PATH (default:\n"
            "                  $GPUMEM_BROKER when set); with --json: {\"processes\": [...],\n"
            "                  \"broker\": {...}}\n");
}

typedef struct row_arg {
    FILE *out;
    int json;
    int count;
} row_arg_t;

static void print_json(const gm__mon_proc_view_t *v, row_arg_t *a)
{
    fprintf(a->out, "%s{\"pid\":%d,\"command\":", a->count ? "," : "", v->pid);
    gm_cli_json_string(a->out, v->command);
    fprintf(a->out, ",\"pools\":[");
    for (unsigned i = 0; i < v->n_pools; i++) {
        const gm__mon_pool_view_t *p = &v->pools[i];
        fprintf(a->out, "%s{\"device\":%d,\"backend\":", i ? "," : "", p->device);
        gm_cli_json_string(a->out, p->backend);
        for (unsigned f = 0; f < v->n_fields; f++) {
            fputc(',', a->out);
            gm_cli_json_string(a->out, v->names[f]);
            fprintf(a->out, ":%llu", (unsigned long long)p->values[f]);
        }
        fprintf(a->out, "}");
    }
    fprintf(a->out, "]}");
}

static void print_row(const gm__mon_proc_view_t *v, void *arg)
{
    row_arg_t *a = arg;
    if (a->json) {
        print_json(v, a);
    } else {
        for (unsigned i = 0; i < v->n_pools; i++) {
            const gm__mon_pool_view_t *p = &v->pools[i];
            char al[32], re[32], ca[32], pk[32], ex[32], im[32];
            fprintf(a->out, "%7d %-16.16s %3d %-5s %11s %11s %11s %11s %6llu %11s %11s\n", v->pid,
                    v->command, p->device, p->backend,
                    gm__fmt_bytes(gm__monitor_value(v, p, "allocated"), al, sizeof al),
                    gm__fmt_bytes(gm__monitor_value(v, p, "reserved"), re, sizeof re),
                    gm__fmt_bytes(gm__monitor_value(v, p, "cached"), ca, sizeof ca),
                    gm__fmt_bytes(gm__monitor_value(v, p, "reserved_peak"), pk, sizeof pk),
                    (unsigned long long)gm__monitor_value(v, p, "oom_count"),
                    gm__fmt_bytes(gm__monitor_value(v, p, "share_exported"), ex, sizeof ex),
                    gm__fmt_bytes(gm__monitor_value(v, p, "share_imported"), im, sizeof im));
        }
    }
    a->count++;
}

static const char *g_broker; /* --broker, or GPUMEM_BROKER */

static int snapshot(FILE *out, int json)
{
    row_arg_t a = {out, json, 0};
    if (json && g_broker) fprintf(out, "{\"processes\": ");
    if (json) fprintf(out, "[");
    else
        fprintf(out, "%7s %-16s %3s %-5s %11s %11s %11s %11s %6s %11s %11s\n", "PID", "COMMAND",
                "DEV", "BACK", "ALLOCATED", "RESERVED", "CACHED", "PEAK", "OOMS", "EXPORTED",
                "IMPORTED");
    int n = gm__monitor_scan(print_row, &a);
    if (json) fprintf(out, "]%s", g_broker ? "" : "\n");
    if (n < 0) {
        fprintf(stderr, "gpumem top: cannot read the monitor directory: %s\n", strerror(errno));
        return 1;
    }
    if (!json && n == 0) fprintf(out, "(no process is using gpumem)\n");
    if (!g_broker) return 0;
    gm_broker_view_t v;
    int rc = gm_broker_query(g_broker, &v);
    if (json) {
        fprintf(out, ", \"broker\": ");
        if (rc == GM_OK) gm_broker_print_json(out, &v);
        else fprintf(out, "null");
        fprintf(out, "}\n");
    } else if (rc == GM_OK) {
        fprintf(out, "\n");
        gm_broker_print_table(out, g_broker, &v);
    } else {
        char why[512];
        fprintf(out, "\nbroker %s: %s\n", g_broker,
                gm_broker_safe_text(gm_last_error(), why, sizeof why));
    }
    free(v.tenants);
    return rc == GM_OK ? 0 : 1;
}

/* Refresh period bounds: below 0.1 s top would spin; above an hour it is
 * not a live view.  NaN fails every comparison, so it is tested first. */
#define MIN_INTERVAL 0.1
#define MAX_INTERVAL 3600.0

static int parse_interval(const char *v, double *out)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || errno == ERANGE || !isfinite(x) || x < MIN_INTERVAL || x > MAX_INTERVAL)
        return -1;
    *out = x;
    return 0;
}

static volatile sig_atomic_t stop;
static void on_signal(int sig) { (void)sig; stop = 1; }

int gm_cli_top(int argc, char **argv)
{
    int once = 0, json = 0, missing = 0;
    double interval = 1.0;
    g_broker = getenv("GPUMEM_BROKER");
    if (g_broker && !*g_broker) g_broker = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            gm_cli_top_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--once")) {
            once = 1;
        } else if (!strcmp(argv[i], "--json")) {
            json = once = 1;
        } else if ((v = gm_cli_option(argc, argv, &i, "broker", &missing))) {
            g_broker = v;
        } else if ((v = gm_cli_option(argc, argv, &i, "interval", &missing))) {
            if (parse_interval(v, &interval) != 0) {
                fprintf(stderr, "gpumem top: --interval '%s': give seconds from %g to %g, e.g. 0.5\n",
                        v, MIN_INTERVAL, MAX_INTERVAL);
                return 2;
            }
        } else {
            if (!missing) fprintf(stderr, "gpumem top: unknown option '%s'\n", argv[i]);
            gm_cli_top_usage(stderr);
            return 2;
        }
    }
    if (once || !isatty(STDOUT_FILENO)) return snapshot(stdout, json);

    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    struct termios saved;
    /* Keys are read only when top owns the terminal: a process outside the
     * terminal's foreground group that changes its modes or reads it is
     * stopped (SIGTTOU/SIGTTIN), and would draw nothing until continued. */
    int tty_in = isatty(STDIN_FILENO) && tcgetpgrp(STDIN_FILENO) == getpgrp() &&
                 tcgetattr(STDIN_FILENO, &saved) == 0;
    if (tty_in) {
        struct termios raw = saved;
        raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
        tcsetattr(STDIN_FILENO, TCSANOW, &raw);
    }
    int rc = 0;
    while (!stop) {
        printf("\033[H\033[2J");
        printf("gpumem top — every %.1f s, q to quit\n\n", interval);
        rc = snapshot(stdout, 0);
        fflush(stdout);
        if (rc) break;
        struct pollfd pfd = {STDIN_FILENO, POLLIN, 0};
        int r = poll(tty_in ? &pfd : NULL, tty_in ? 1 : 0, (int)(interval * 1000));
        if (r > 0) {
            char c;
            if (read(STDIN_FILENO, &c, 1) == 1 && (c == 'q' || c == 'Q')) break;
        }
    }
    if (tty_in) tcsetattr(STDIN_FILENO, TCSANOW, &saved);
    return rc;
}
