/* SPDX-License-Identifier: Apache-2.0 */
/*
 * metrics.c — `gpumem metrics`: the counters of every gpumem process on this
 * machine in the Prometheus text exposition format, for a node exporter's
 * textfile collector or a scrape through any small HTTP wrapper.
 *
 * The one idea: the stats field list (GM_STAT_FIELDS) drives the output as
 * it drives the struct and the JSON; a name rule gives each field its type
 * and unit: fields ending in _count or _total, and retries, pages_stolen,
 * oom_handler_calls and alloc_failures are counters (`_total`); *_ns become
 * seconds counters; *_ppm a ratio gauge; bytes fields end in `_bytes`.
 *
 * Every series is unique: labels device, backend, command, pid and pool (the
 * pool's slot in its process).  Two processes of the same command, or two
 * pools of one process on one device, would otherwise print the same label
 * set twice, and a Prometheus textfile collector rejects the whole file.
 * docs/observability.md says why pid rather than summing per command.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "base/internal.h"
#include "lib/broker.h"
#include "lib/monitor_read.h"

void gm_cli_metrics_usage(FILE *out)
{
    fprintf(out,
            "usage: gpumem metrics\n\n"
            "Print the counters of every process using gpumem on this machine (see\n"
            "gpumem top) in Prometheus text exposition format: gpumem_<field>_bytes\n"
            "gauges, gpumem_<field>_total counters, labels device, backend, command,\n"
            "pid, pool (one series per pool of each process: never a duplicate).\n\n"
            "  --pid-labels    accepted for compatibility (pid labels are always on)\n"
            "  --broker PATH   also the tenants of the broker on PATH (default:\n"
            "                  $GPUMEM_BROKER when set): gpumem_broker_* series\n"
            "                  labelled tenant; a Slurm job's tenant (job_7, a\n"
            "                  step's job_7.3) also job=\"7\" (and step=\"3\")\n");
}

static const char *const descs[][2] = {
#define GM__MET_DESC(name, desc) {#name, desc},
    GM_STAT_FIELDS(GM__MET_DESC)
#undef GM__MET_DESC
};
#define N_DESCS (sizeof descs / sizeof descs[0])

static int ends(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* Metric name (into buf), type, and scale of a stats field. */
static void classify(const char *field, char *buf, size_t cap, const char **type, double *scale)
{
    *scale = 1;
    *type = "gauge";
    if (ends(field, "_ns")) {
        snprintf(buf, cap, "gpumem_%.*s_seconds_total", (int)strlen(field) - 3, field);
        *type = "counter";
        *scale = 1e-9;
    } else if (ends(field, "_ppm")) {
        snprintf(buf, cap, "gpumem_%.*s_ratio", (int)strlen(field) - 4, field);
        *scale = 1e-6;
    } else if (ends(field, "_count")) {
        snprintf(buf, cap, "gpumem_%.*s_total", (int)strlen(field) - 6, field);
        *type = "counter";
    } else if (ends(field, "_total")) {
        /* allocated_total, freed_total: bytes counters */
        snprintf(buf, cap, "gpumem_%.*s_bytes_total", (int)strlen(field) - 6, field);
        *type = "counter";
    } else if (!strcmp(field, "retries") || !strcmp(field, "pages_stolen") ||
               !strcmp(field, "oom_handler_calls") || !strcmp(field, "alloc_failures")) {
        snprintf(buf, cap, "gpumem_%s_total", field);
        *type = "counter";
    } else if (!strcmp(field, "live_blocks") || !strcmp(field, "free_blocks")) {
        snprintf(buf, cap, "gpumem_%s", field);
    } else {
        snprintf(buf, cap, "gpumem_%s_bytes", field);
    }
}

typedef struct proc_list {
    gm__mon_proc_view_t *v;
    size_t n, cap;
} proc_list_t;

static void keep(const gm__mon_proc_view_t *v, void *arg)
{
    proc_list_t *l = arg;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        gm__mon_proc_view_t *n = realloc(l->v, cap * sizeof *n);
        if (!n) return;
        l->v = n;
        l->cap = cap;
    }
    l->v[l->n++] = *v;
}

static void label_value(FILE *out, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\' || *s == '"') fprintf(out, "\\%c", *s);
        else if (*s == '\n') fputs("\\n", out);
        else fputc(*s, out);
    }
}

int gm_cli_metrics(int argc, char **argv)
{
    const char *broker = getenv("GPUMEM_BROKER");
    if (broker && !*broker) broker = NULL;
    int missing = 0;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            gm_cli_metrics_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--pid-labels")) {
            /* the default now */
        } else if ((v = gm_cli_option(argc, argv, &i, "broker", &missing))) {
            broker = v;
        } else {
            if (!missing) fprintf(stderr, "gpumem metrics: unknown option '%s'\n", argv[i]);
            gm_cli_metrics_usage(stderr);
            return 2;
        }
    }
    proc_list_t l = {0};
    if (gm__monitor_scan(keep, &l) < 0) {
        perror("gpumem metrics: cannot read the monitor directory");
        return 1;
    }
    printf("# HELP gpumem_processes Processes using gpumem on this machine.\n"
           "# TYPE gpumem_processes gauge\ngpumem_processes %zu\n", l.n);
    for (size_t f = 0; f < N_DESCS; f++) {
        char name[96];
        const char *type;
        double scale;
        classify(descs[f][0], name, sizeof name, &type, &scale);
        printf("# HELP %s %s.\n# TYPE %s %s\n", name, descs[f][1], name, type);
        for (size_t i = 0; i < l.n; i++) {
            const gm__mon_proc_view_t *v = &l.v[i];
            for (unsigned k = 0; k < v->n_pools; k++) {
                const gm__mon_pool_view_t *p = &v->pools[k];
                printf("%s{device=\"%d\",backend=\"", name, p->device);
                label_value(stdout, p->backend);
                printf("\",command=\"");
                label_value(stdout, v->command);
                printf("\",pid=\"%d\",pool=\"%d\"", v->pid, p->slot);
                uint64_t x = gm__monitor_value(v, p, descs[f][0]);
                if (scale == 1) printf("} %llu\n", (unsigned long long)x);
                else printf("} %.9g\n", (double)x * scale);
            }
        }
    }
    free(l.v);
    if (broker) {
        gm_broker_view_t v;
        if (gm_broker_query(broker, &v) != GM_OK) {
            char why[512];
            fprintf(stderr, "gpumem metrics: broker %s: %s\n", broker,
                    gm_broker_safe_text(gm_last_error(), why, sizeof why));
            return 1;
        }
        gm_broker_print_metrics(stdout, &v);
        free(v.tenants);
    }
    return 0;
}
