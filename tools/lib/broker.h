/* SPDX-License-Identifier: Apache-2.0 */
/*
 * broker.h — `gpumem broker`, the machine's owner of a GPU's memory
 * (broker.c; wire format src/broker/proto.h; the user's side docs/broker.md).
 * In libgpumem_tools, not in libgpumem.so, so tests can run a broker in a
 * forked child.
 */
#ifndef GM_TOOLS_BROKER_H
#define GM_TOOLS_BROKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The whole daemon: argv[0] == "broker".  Runs until SIGTERM/SIGINT; exit
 * status 0, 1 (could not start), 2 (bad usage or config). */
int gm_cli_broker(int argc, char **argv);
void gm_cli_broker_usage(FILE *out);

/* A tenant row as the broker reports it (STATS), in bytes. */
typedef struct gm_broker_tenant {
    char name[64];
    uint64_t quota, guaranteed, used, peak, cached, refusals, clients, reclaims;
} gm_broker_tenant_t;

typedef struct gm_broker_view {
    uint64_t capacity, device_used;
    int64_t pid;
    size_t n;
    gm_broker_tenant_t *tenants; /* malloc'd; free() */
} gm_broker_view_t;

/* Ask the broker on path for its tenant table (`gpumem top --broker`,
 * `gpumem metrics --broker`).  GM_OK, or an error with gm_last_error(). */
int gm_broker_query(const char *path, gm_broker_view_t *out);

/* The view as a table (gpumem top), a JSON object, or Prometheus series
 * (gpumem metrics; HELP/TYPE lines included). */
void gm_broker_print_table(FILE *out, const char *path, const gm_broker_view_t *v);
void gm_broker_print_json(FILE *out, const gm_broker_view_t *v);
void gm_broker_print_metrics(FILE *out, const gm_broker_view_t *v);
/* s (an error that may quote what a broker sent) safe to print: printable
 * ASCII kept, other bytes as \xHH, cut to cap - 1 bytes; returns buf. */
const char *gm_broker_safe_text(const char *s, char *buf, size_t cap);

#endif /* GM_TOOLS_BROKER_H */
