/* SPDX-License-Identifier: Apache-2.0 */
/*
 * broker_util.h — what the broker tests share: a broker run in a child
 * (the `gpumem broker` program named by GM_TEST_CLI, else gm_cli_broker in
 * the fork), its socket in a fresh directory, and pools that lease from it.
 */
#ifndef GM_TEST_BROKER_UTIL_H
#define GM_TEST_BROKER_UTIL_H

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpumem.h"
#include "lib/broker.h"
#include "../share/share_util.h"

#define MiB ((size_t)1 << 20)

typedef struct test_broker {
    char dir[64];
    char sock[100];
    char stats[100];
    char config[100];
    char log[100];
    pid_t pid;
} test_broker_t;

/* A fresh directory for the socket, the config and the log. */
static inline void tb_init(test_broker_t *b)
{
    memset(b, 0, sizeof *b);
    const char *tmp = getenv("TMPDIR");
    snprintf(b->dir, sizeof b->dir, "%.40s/gmbrk.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(b->dir)) {
        perror("mkdtemp");
        exit(1);
    }
    snprintf(b->sock, sizeof b->sock, "%.60s/b.sock", b->dir);
    snprintf(b->stats, sizeof b->stats, "%.60s/b.json", b->dir);
    snprintf(b->config, sizeof b->config, "%.60s/b.conf", b->dir);
    snprintf(b->log, sizeof b->log, "%.60s/b.log", b->dir);
}

/* Write the config file (text after the socket/backend/stats lines). */
static inline void tb_config(test_broker_t *b, const char *capacity, const char *extra)
{
    FILE *f = fopen(b->config, "w");
    if (!f) {
        perror("config");
        exit(1);
    }
    fprintf(f, "socket = %s\nbackend = %s\ncapacity = %s\nstats_file = %s\nreclaim_ms = 300\n%s",
            b->sock, getenv("GPUMEM_BACKEND") && !strcmp(getenv("GPUMEM_BACKEND"), "cuda")
                         ? "cuda" : "sim", capacity, b->stats, extra ? extra : "");
    fclose(f);
}

/* In a child: `gpumem broker ARGS...` (argv[0] is "broker"), never
 * returning.  The program itself where the build names it (GM_TEST_CLI): a
 * fork of a process that has already used CUDA cannot use CUDA, and under
 * TSan a fork of a threaded process was seen to miss its signals.  Run by
 * hand without GM_TEST_CLI (or in a build that did not make the program),
 * the same code runs in this fork. */
static inline void tb_broker_exec(char **argv) __attribute__((noreturn));
static inline void tb_broker_exec(char **argv)
{
    const char *cli = getenv("GM_TEST_CLI");
    int argc = 0;
    while (argv[argc]) argc++;
    if (cli && *cli && access(cli, X_OK) == 0) {
        char *xargv[16] = {"gpumem"};
        for (int i = 0; i < argc && i < 14; i++) xargv[i + 1] = argv[i];
        execv(cli, xargv);
        fprintf(stderr, "tb_broker_exec: cannot run %s: %s\n", cli, strerror(errno));
        _exit(127);
    }
    int rc = gm_cli_broker(argc, argv);
    fflush(NULL);
    _exit(rc);
}

/* Start the broker on the config (its child first runs prep, when not
 * NULL); wait until it answers. */
static inline void tb_start_with(test_broker_t *b, void (*prep)(void))
{
    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        /* Dies with the test: a test that crashes must not leave a broker
         * holding ctest's output pipe (ctest would wait for it forever). */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(1);
        if (prep) prep();
        FILE *l = freopen(b->log, "a", stderr);
        (void)l;
        setvbuf(stderr, NULL, _IONBF, 0); /* freopen made it buffered: _exit would lose it */
        char *argv[] = {"broker", "--config", b->config, NULL};
        tb_broker_exec(argv);
    }
    b->pid = pid;
    gm_broker_view_t v;
    int ok = 0;
    /* Generous: on a GPU under a loaded ctest -j, the broker's CUDA
     * start-up and its first pages can take many seconds; the deadline only
     * catches a broker that never answers. */
    for (int i = 0; i < 60000 && !ok; i++) {
        if (gm_broker_query(b->sock, &v) == GM_OK) {
            free(v.tenants);
            ok = 1;
        } else {
            int st;
            if (waitpid(pid, &st, WNOHANG) == pid) break;
            sleep_ms(2);
        }
    }
    if (!ok) {
        fprintf(stderr, "the broker did not start; its log:\n");
        char cmd[400];
        snprintf(cmd, sizeof cmd, "cat %s >&2", b->log);
        if (system(cmd)) {}
        exit(1);
    }
}

static inline void tb_start(test_broker_t *b) { tb_start_with(b, NULL); }

/* Stop it: sig (SIGTERM or SIGKILL); returns its exit status or 128+sig. */
static inline int tb_stop(test_broker_t *b, int sig)
{
    if (b->pid <= 0) return -1;
    kill(b->pid, sig);
    int st = 0;
    /* A broker that does not stop in 60 s is killed (and the caller sees
     * 128 + SIGKILL): under TSan a broker forked after this process started
     * threads was seen never to run its SIGTERM handler, and a test must
     * fail or go on, not hang. */
    pid_t got = 0;
    for (int i = 0; i < 6000 && (got = waitpid(b->pid, &st, WNOHANG)) == 0; i++) sleep_ms(10);
    if (got == 0) {
        fprintf(stderr, "tb_stop: broker pid %d did not stop on signal %d in 60 s: SIGKILL\n",
                (int)b->pid, sig);
        kill(b->pid, SIGKILL);
        waitpid(b->pid, &st, 0);
    }
    b->pid = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static inline void tb_cleanup(test_broker_t *b)
{
    if (b->pid > 0) tb_stop(b, SIGKILL);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", b->dir);
    if (system(cmd)) {}
}

/* A pool that leases from the broker (lease bytes per request; 0: default). */
static inline int tb_pool(const test_broker_t *b, size_t lease, gm_pool_t **pool)
{
    gm_pool_config_t cfg;
    gm_config_from_env(&cfg);
    snprintf(cfg.broker, sizeof cfg.broker, "%s", b->sock);
    cfg.broker_lease = lease;
    return gm_pool_create(&cfg, pool);
}

/* The broker's row of tenant name (zeros when absent). */
static inline gm_broker_tenant_t tb_tenant(const test_broker_t *b, const char *name)
{
    gm_broker_tenant_t r;
    memset(&r, 0, sizeof r);
    gm_broker_view_t v;
    if (gm_broker_query(b->sock, &v) != GM_OK) return r;
    for (size_t i = 0; i < v.n; i++)
        if (!strcmp(v.tenants[i].name, name)) r = v.tenants[i];
    free(v.tenants);
    return r;
}

/* Does the file (its first 8 KiB) hold text? */
static inline int tb_file_has(const char *path, const char *text)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, text) != NULL;
}

#endif /* GM_TEST_BROKER_UTIL_H */
