/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cli.h — what the `gpumem` command's files share: one entry point per
 * subcommand and the few helpers more than one of them needs.
 *
 * A subcommand is a function `int gm_cli_NAME(int argc, char **argv)` that
 * receives argv[0] == "NAME" and returns the process exit status:
 *   0 success, 1 the work failed (backend unusable, …), 2 bad usage or input.
 * It prints its own usage (gm_cli_NAME_usage) on stderr with exit 2 for an
 * unknown option, and on stdout with exit 0 for -h/--help.  To add one,
 * declare both functions here and add a row to the table in gpumem.c.
 */
#ifndef GM_CLI_H
#define GM_CLI_H

#include <stdio.h>

#include "gpumem.h"

/* ---- subcommands ------------------------------------------------------ */

int gm_cli_info(int argc, char **argv);       /* gpumem.c */
void gm_cli_info_usage(FILE *out);
int gm_cli_replay(int argc, char **argv);     /* replay.c */
void gm_cli_replay_usage(FILE *out);
int gm_cli_synth(int argc, char **argv);      /* synth.c */
void gm_cli_synth_usage(FILE *out);          /* synth/kinds.c, with the generator */
/* Generate the synthetic trace KIND as RMM CSV text into a malloc'd buffer
 * (*text, *len bytes); deterministic for (kind, seed, scale).  0 ok, -1 an
 * unknown kind, -2 out of host memory.  gm_cli_synth_kinds: the kinds, NULL
 * at the end. */
int gm_cli_synth_generate(const char *kind, unsigned long long seed, double scale, char **text,
                          size_t *len);
extern const char *const gm_cli_synth_kinds[];

int gm_cli_report(int argc, char **argv);     /* report.c */
void gm_cli_report_usage(FILE *out);
int gm_cli_top(int argc, char **argv);        /* top.c */
void gm_cli_top_usage(FILE *out);
int gm_cli_metrics(int argc, char **argv);    /* metrics.c */
void gm_cli_metrics_usage(FILE *out);

int gm_cli_broker(int argc, char **argv);     /* lib/broker.c */
void gm_cli_broker_usage(FILE *out);
int gm_cli_broker_admin(int argc, char **argv); /* slurm.c */
void gm_cli_broker_admin_usage(FILE *out);
int gm_cli_gres_conf(int argc, char **argv);  /* slurm.c */
void gm_cli_gres_conf_usage(FILE *out);

/* ---- shared helpers (gpumem.c) ---------------------------------------- */

/* The value of option `name` at argv[*i]: "--name=VALUE" or "--name VALUE"
 * (advancing *i).  NULL when argv[*i] is not that option; when the value is
 * missing, prints an error and sets *missing. */
const char *gm_cli_option(int argc, char **argv, int *i, const char *name, int *missing);
/* "auto", "sim", "cuda" -> *kind; -1 (after printing an error) otherwise. */
int gm_cli_parse_backend(const char *s, gm_backend_kind_t *kind);
/* Write s as a JSON string literal, quotes included. */
void gm_cli_json_string(FILE *out, const char *s);

#endif /* GM_CLI_H */
