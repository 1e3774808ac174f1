/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_broker_cli.c — `gpumem broker`'s command line and config file
 * (gm_cli_broker, run in a child with its output in files): --help and -h
 * exit 0 with the usage on stdout; each mistake in a config file (an
 * unknown key, a bad size or number, no socket, a tenant twice, a bad
 * section or tenant name, an unknown tenant key, a missing '=', an overlong
 * line, ...) exits 2 with a message naming the file and the line; bad
 * options exit 2; --check of a good config prints it and exits 0; a second
 * broker on the socket of a live one, or on a path that is not a socket,
 * cannot start (exit 1) and leaves the live one alone; guarantees beyond
 * the capacity do not start.
 */
#include "test.h"
#include "broker_util.h"

static test_broker_t g_b;
static char g_out[128], g_err[128];

/* Run gm_cli_broker(args) in a child; its exit status (-1: it did not end
 * within 5 s, so it was killed: a mistake taken for a config that works). */
static int cli(char **args)
{
    int argc = 0;
    while (args[argc]) argc++;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(g_out, "w", stdout) || !freopen(g_err, "w", stderr)) _exit(99);
        int rc = gm_cli_broker(argc, args);
        fflush(NULL);
        _exit(rc);
    }
    int st = 0;
    double end = now_ms() + 5000;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (now_ms() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            fprintf(stderr, "gm_cli_broker(%s ...) kept running\n", args[1] ? args[1] : "");
            return -1;
        }
        sleep_ms(2);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
}

/* A config mistake: the config's body (its socket line first when
 * with_socket), the line named (0: none) and what stderr says. */
typedef struct mistake {
    const char *what;
    int with_socket;
    const char *body;
    int line;
    const char *says;
} mistake_t;

static const mistake_t mistakes[] = {
    {"unknown key", 1, "backend = sim\nfrobnicate = 3\n", 3, "unknown key 'frobnicate'"},
    {"bad size", 1, "capacity = 12XB\n", 2, "'12XB' is not a valid capacity"},
    {"negative size", 1, "\n# a comment\ndefault_quota = -5MiB\n", 4, "is not a valid default_quota"},
    {"no socket", 0, "backend = sim\ncapacity = 1GiB\n", 0, "no socket"},
    {"relative socket", 0, "socket = b.sock\n", 1, "socket is an absolute path"},
    {"tenant twice", 1, "[tenant a]\nquota = 1GiB\n\n[tenant b]\n[tenant a]\n", 6, "tenant 'a' twice"},
    {"section", 1, "[tenants a]\n", 2, "a section is [tenant NAME]"},
    {"section without a name", 1, "[tenant]\n", 2, "a section is [tenant NAME]"},
    {"section not closed", 1, "[tenant a\n", 2, "a section is [tenant NAME]"},
    {"tenant named uid:N", 1, "[tenant uid:5]\n", 2, "not uid:N"},
    {"tenant name characters", 1, "[tenant a/b]\n", 2, "letters, digits"},
    {"unknown tenant key", 1, "[tenant a]\nusers = 0\nsize = 3\n", 4, "unknown tenant key 'size'"},
    {"a top key in a tenant", 1, "[tenant a]\ncapacity = 1GiB\n", 3, "unknown tenant key 'capacity'"},
    {"no '='", 1, "capacity 1GiB\n", 2, "expected KEY = VALUE"},
    {"reclaim_ms too big", 1, "reclaim_ms = 60001\n", 2, "not a valid reclaim_ms"},
    {"max_clients 0", 1, "max_clients = 0\n", 2, "not a valid max_clients"},
    {"socket_mode not octal", 1, "socket_mode = 0999\n", 2, "not a valid socket_mode"},
    {"device", 1, "device = -1\n", 2, "not a valid device"},
    {"backend", 1, "backend = opencl\n", 2, "not a valid backend"},
    {"no such user", 1, "[tenant a]\nusers = no-such-user-here\n", 3, "no user named 'no-such-user-here'"},
    {"no such group", 1, "[tenant a]\ngroups = no-such-group-here\n", 3, "no group named 'no-such-group-here'"},
    {"relative cgroup", 1, "[tenant a]\ncgroup = system.slice\n", 3, "cgroup is a path"},
    {"guaranteed none", 1, "[tenant a]\nguaranteed = none\n", 3, "not a valid guaranteed"},
    {"capacity none", 1, "capacity = none\n", 2, "not a valid capacity"},
};

/* A config with mistake m: exit 2, stderr naming "b.conf:LINE: " and
 * saying m->says. */
static void bad_config(const mistake_t *m)
{
    char text[4096];
    snprintf(text, sizeof text, "%s%s%s", m->with_socket ? "socket = " : "",
             m->with_socket ? g_b.sock : "", m->with_socket ? "\n" : "");
    strncat(text, m->body, sizeof text - strlen(text) - 1);
    write_file(g_b.config, text);
    char *args[] = {"broker", "--config", g_b.config, NULL};
    int rc = cli(args);
    char where[160];
    snprintf(where, sizeof where, "b.conf:%d: ", m->line);
    int named = m->line ? tb_file_has(g_err, where) : 1;
    int said = tb_file_has(g_err, m->says);
    if (rc != 2 || !named || !said) {
        fprintf(stderr, "%s: exit %d, want 2, with '%s' and '%s'; stderr:\n", m->what, rc,
                m->line ? where : "", m->says);
        char cmd[300];
        snprintf(cmd, sizeof cmd, "cat '%s' >&2", g_err);
        if (system(cmd)) {}
    }
    CHECK(rc == 2);
    CHECK(named);
    CHECK(said);
    /* --check says the same. */
    char *cargs[] = {"broker", "--config", g_b.config, "--check", NULL};
    CHECK(cli(cargs) == 2);
}

int main(void)
{
    tb_init(&g_b);
    snprintf(g_out, sizeof g_out, "%.60s/out.txt", g_b.dir);
    snprintf(g_err, sizeof g_err, "%.60s/err.txt", g_b.dir);

    /* --help, -h. */
    {
        char *a1[] = {"broker", "--help", NULL}, *a2[] = {"broker", "-h", NULL};
        CHECK(cli(a1) == 0 && tb_file_has(g_out, "usage: gpumem broker"));
        CHECK(cli(a2) == 0 && tb_file_has(g_out, "usage: gpumem broker"));
        CHECK(tb_file_has(g_out, "[tenant "));
    }

    /* Config mistakes: exit 2, naming the line. */
    for (size_t i = 0; i < sizeof mistakes / sizeof mistakes[0]; i++) bad_config(&mistakes[i]);
    {
        char body[2100];
        memset(body, 'x', sizeof body);
        memcpy(body, "stats_file = /tmp/", 18);
        body[sizeof body - 2] = '\n';
        body[sizeof body - 1] = '\0';
        bad_config(&(mistake_t){"an overlong line", 1, body, 2, "line longer than"});
    }

    /* Bad options: exit 2. */
    {
        char *a1[] = {"broker", "--frob", NULL};
        CHECK(cli(a1) == 2 && tb_file_has(g_err, "unknown option '--frob'"));
        char *a2[] = {"broker", "--socket", "rel.sock", NULL};
        CHECK(cli(a2) == 2);
        char *a3[] = {"broker", "--socket", g_b.sock, "--capacity", "lots", NULL};
        CHECK(cli(a3) == 2);
        char *a4[] = {"broker", "--config", "/nonexistent/b.conf", NULL};
        CHECK(cli(a4) == 2 && tb_file_has(g_err, "/nonexistent/b.conf"));
        char *a5[] = {"broker", "--config", NULL};
        CHECK(cli(a5) == 2 && tb_file_has(g_err, "needs a value"));
        char *a6[] = {"broker", NULL};
        CHECK(cli(a6) == 2 && tb_file_has(g_err, "no socket"));
    }

    /* --check of a good config: what it says, exit 0, nothing started. */
    {
        tb_config(&g_b, "1GiB", "default_quota = 8GiB\n[tenant t1]\nusers = 0, 1\nquota = 512MiB\n"
                                "guaranteed = 128MiB\n");
        char *a[] = {"broker", "--config", g_b.config, "--check", NULL};
        CHECK(cli(a) == 0);
        CHECK(tb_file_has(g_out, "tenant t1: 2 users") && tb_file_has(g_out, "quota 512.00 MiB"));
        struct stat st;
        CHECK(stat(g_b.sock, &st) != 0);
    }

    /* Guarantees beyond the capacity: the broker does not start. */
    {
        tb_config(&g_b, "256MiB", "[tenant a]\nusers = 0\nguaranteed = 200MiB\n"
                                  "[tenant b]\nusers = 1\nguaranteed = 100MiB\n");
        char *a[] = {"broker", "--config", g_b.config, NULL};
        int rc = cli(a);
        CHECK(rc == 1 || rc == 2);
        CHECK(tb_file_has(g_err, "exceeds the capacity"));
        /* --check finds it too (docs/broker.md: the guarantees together may
         * not exceed the capacity; --check exits 2 when something is wrong). */
        char *b[] = {"broker", "--config", g_b.config, "--check", NULL};
        rc = cli(b);
        if (rc == 0) fprintf(stderr, "--check passes a config whose guarantees exceed its "
                             "capacity\n");
        CHECK(rc == 2);
    }

    /* A live broker: a second one on its socket cannot start; nor one on a
     * path that is a file; the live one goes on. */
    {
        tb_config(&g_b, "1GiB", "");
        tb_start(&g_b);
        char *a[] = {"broker", "--config", g_b.config, NULL};
        CHECK(cli(a) == 1 && tb_file_has(g_err, "listening"));
        gm_broker_view_t v;
        CHECK(gm_broker_query(g_b.sock, &v) == GM_OK && v.pid == g_b.pid);
        free(v.tenants);
        CHECK(kill(g_b.pid, 0) == 0);

        char file[128];
        snprintf(file, sizeof file, "%.60s/plain", g_b.dir);
        write_file(file, "not a socket\n");
        char *b[] = {"broker", "--socket", file, "--backend", "sim", "--capacity", "64MiB", NULL};
        CHECK(cli(b) == 1 && tb_file_has(g_err, "not a socket"));
        CHECK(tb_file_has(file, "not a socket")); /* left alone */

        /* Last (a child forked after this process used the device could not
         * open it on cuda): the live broker still serves. */
        gm_pool_t *pool = NULL;
        CHECK_OK(tb_pool(&g_b, 0, &pool));
        void *p = NULL;
        CHECK_OK(gm_alloc(pool, MiB, NULL, &p));
        CHECK_OK(gm_free(pool, p, NULL));
        gm_pool_destroy(pool);
        CHECK(tb_stop(&g_b, SIGTERM) == 0);
    }

    tb_cleanup(&g_b);
    return test_summary();
}
