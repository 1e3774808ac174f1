/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_broker_print.c — what `gpumem top --broker` and `gpumem metrics
 * --broker` print when a broker sends hostile tenant names (a broker of
 * another version, or a program bound to the socket, may send any bytes):
 * escape sequences, quotes and backslashes, a newline followed by a made-up
 * series, JSON that closes the string and adds keys, bytes that are not
 * UTF-8, DEL and other control characters, an empty name, and two names
 * that a careless escaping would print alike.
 *
 * A fake broker (a thread on a socket of its own) answers STATS with them;
 * gm_broker_query reads them as top and metrics do, and each printer's
 * output is checked:
 *   table    only printable ASCII and newlines, one line per tenant, every
 *            name printed differently;
 *   JSON     parses (a small strict parser here), each tenant object has
 *            exactly its ten keys once, and each name decodes back to the
 *            bytes sent;
 *   metrics  every line a HELP, a TYPE or one series of a gpumem_broker_
 *            metric with one tenant label whose value uses only the text
 *            format's escapes; no injected series; per metric, as many
 *            distinct label values as tenants.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "test.h"
#include "gpumem.h"
#include "broker/proto.h"
#include "lib/broker.h"
#include "base/wire.h"

static const char *const names[] = {
    "\x1b[2J\x1b]0;owned\x07",                 /* clear the screen, set the title */
    "a\"b\\c",                                  /* a quote and a backslash */
    "x\"} 1\ngpumem_evil_total{a=\"b",          /* a Prometheus line of its own */
    "\", \"used\": 999, \"injected\": \"",      /* JSON keys of its own */
    "\xff\x80\xc3(",                            /* not UTF-8 */
    "\x7f\x01\r\t\x9b" "31m",                   /* DEL, controls, a C1 CSI */
    "",                                         /* empty */
    "\\x1b",                                    /* prints like an escaped ESC ... */
    "\x1b",                                     /* ... next to a real one */
    "train-1.a_b",                              /* a name the config allows */
};
#define N (sizeof names / sizeof names[0])

/* ---- the fake broker ------------------------------------------------------------- */

static int g_lfd = -1;

static void *fake_broker(void *arg)
{
    (void)arg;
    for (;;) {
        int fd = accept(g_lfd, NULL, NULL);
        if (fd < 0) return NULL;
        for (;;) {
            gm__broker_msg_t m;
            size_t nfds;
            bool closed;
            if (gm__wire_recv(fd, &m, sizeof m, NULL, 0, &nfds, &closed, 10, "fake") != GM_OK) break;
            uint64_t first = m.first;
            memset(&m, 0, sizeof m);
            m.magic = GM__BROKER_MAGIC;
            m.version = GM__BROKER_VERSION;
            m.type = GM__BROKER_REPLY;
            m.status = GM_OK;
            m.pid = getpid();
            m.count = N;
            m.capacity = (uint64_t)1 << 30;
            m.device_used = (uint64_t)1 << 20;
            if (first < N) {
                m.first = first;
                snprintf(m.tenant, sizeof m.tenant, "%s", names[first]);
                m.quota = first == 0 ? UINT64_MAX : (first + 1) << 20;
                m.used = first << 20;
                m.peak = first << 21;
                m.clients = first;
                m.refusals = first * 3;
            }
            if (gm__wire_send(fd, &m, sizeof m, NULL, 0, 0, "fake") != GM_OK) break;
        }
        close(fd);
    }
}

/* ---- a strict little JSON reader ---------------------------------------------------- */

typedef struct json {
    const char *p;
} json_t;

static void ws(json_t *j)
{
    while (*j->p == ' ' || *j->p == '\n' || *j->p == '\t' || *j->p == '\r') j->p++;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* A string into out (bytes; \u00XX as the byte XX); false if malformed or
 * if it holds a raw control character or a byte outside ASCII. */
static bool jstring(json_t *j, char *out, size_t cap)
{
    size_t o = 0;
    ws(j);
    if (*j->p++ != '"') return false;
    for (;;) {
        unsigned char c = (unsigned char)*j->p++;
        if (c == '"') break;
        if (c < 0x20 || c >= 0x7f) return false;
        if (c == '\\') {
            char e = *j->p++;
            switch (e) {
            case '"': case '\\': case '/': c = (unsigned char)e; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'n': c = '\n'; break;
            case 'r': c = '\r'; break;
            case 't': c = '\t'; break;
            case 'u': {
                int v = 0;
                for (int k = 0; k < 4; k++) {
                    int h = hexval(*j->p++);
                    if (h < 0) return false;
                    v = v * 16 + h;
                }
                if (v > 0xff) return false; /* the printers write bytes only */
                c = (unsigned char)v;
                break;
            }
            default: return false;
            }
        }
        if (o + 1 >= cap) return false;
        out[o++] = (char)c;
    }
    out[o] = '\0';
    return true;
}

static bool jvalue(json_t *j, int depth);

static bool jnumber_or_null(json_t *j)
{
    ws(j);
    if (!strncmp(j->p, "null", 4)) {
        j->p += 4;
        return true;
    }
    const char *s = j->p;
    if (*j->p == '-') j->p++;
    while (*j->p >= '0' && *j->p <= '9') j->p++;
    return j->p > s && j->p[-1] != '-';
}

static bool jvalue(json_t *j, int depth)
{
    if (depth > 8) return false;
    ws(j);
    char buf[512];
    if (*j->p == '"') return jstring(j, buf, sizeof buf);
    if (*j->p == '[' || *j->p == '{') {
        char close = *j->p == '[' ? ']' : '}';
        bool obj = close == '}';
        j->p++;
        ws(j);
        if (*j->p == close) return j->p++, true;
        for (;;) {
            if (obj) {
                if (!jstring(j, buf, sizeof buf)) return false;
                ws(j);
                if (*j->p++ != ':') return false;
            }
            if (!jvalue(j, depth + 1)) return false;
            ws(j);
            if (*j->p == ',') {
                j->p++;
                continue;
            }
            return *j->p++ == close;
        }
    }
    return jnumber_or_null(j);
}

static const char *const tenant_keys[] = {"name", "clients", "used", "quota", "guaranteed",
                                          "peak", "cached", "refusals", "reclaims"};
#define N_KEYS (sizeof tenant_keys / sizeof tenant_keys[0])

/* One tenant object: each key once, nothing else; its name into name. */
static bool jtenant(json_t *j, char *name, size_t cap)
{
    int seen[N_KEYS] = {0};
    ws(j);
    if (*j->p++ != '{') return false;
    for (;;) {
        char key[64];
        if (!jstring(j, key, sizeof key)) return false;
        ws(j);
        if (*j->p++ != ':') return false;
        size_t k = 0;
        while (k < N_KEYS && strcmp(tenant_keys[k], key)) k++;
        if (k == N_KEYS || seen[k]++) {
            fprintf(stderr, "tenant object: key '%s' unknown or twice\n", key);
            return false;
        }
        if (k == 0) {
            if (!jstring(j, name, cap)) return false;
        } else if (!jnumber_or_null(j)) {
            return false;
        }
        ws(j);
        if (*j->p == ',') {
            j->p++;
            continue;
        }
        if (*j->p++ != '}') return false;
        break;
    }
    for (size_t k = 0; k < N_KEYS; k++)
        if (seen[k] != 1) return false;
    return true;
}

/* After a member of an object or array (*ok: it was read): true when a
 * ',' follows (taken: another member), else *ok becomes whether `close`
 * follows (taken). */
static bool jmore(json_t *j, bool *ok, char close)
{
    ws(j);
    if (*ok && *j->p == ',') {
        j->p++;
        return true;
    }
    *ok = *ok && *j->p++ == close;
    return false;
}

static void check_json(const char *text)
{
    json_t j = {text};
    char key[64], got[N][256];
    size_t n = 0;
    bool ok = true, tenants = false;
    ws(&j);
    ok = *j.p++ == '{';
    while (ok) {
        ok = jstring(&j, key, sizeof key);
        ws(&j);
        ok = ok && *j.p++ == ':';
        if (!ok) break;
        if (!strcmp(key, "tenants")) {
            tenants = true;
            ws(&j);
            ok = *j.p++ == '[';
            while (ok) {
                ok = n < N && jtenant(&j, got[n], sizeof got[n]);
                if (ok) n++;
                if (!jmore(&j, &ok, ']')) break;
            }
        } else {
            ok = jvalue(&j, 1);
        }
        if (!jmore(&j, &ok, '}')) break;
    }
    ws(&j);
    CHECK(ok);
    CHECK(*j.p == '\0');
    CHECK(tenants);
    CHECK(n == N);
    for (size_t i = 0; i < n && i < N; i++) {
        if (strcmp(got[i], names[i]) != 0)
            fprintf(stderr, "JSON name %zu does not decode to what the broker sent\n", i);
        CHECK(strcmp(got[i], names[i]) == 0);
    }
    if (!ok) fprintf(stderr, "JSON output: %s\n", text);
}

/* ---- the checks ------------------------------------------------------------------ */

static bool printable_lines(const char *s)
{
    for (; *s; s++)
        if (*s != '\n' && !((unsigned char)*s >= 0x20 && (unsigned char)*s < 0x7f)) return false;
    return true;
}

static size_t count_lines(const char *s)
{
    size_t n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* The name as the table shows it: printable ASCII but the backslash kept,
 * any other byte as \xHH (one-to-one: names never print alike). */
static void shown_name(const char *s, char *out, size_t cap)
{
    size_t o = 0;
    for (; *s && o + 5 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 0x20 && c < 0x7f && c != '\\') out[o++] = (char)c;
        else o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
    }
    out[o] = '\0';
}

static void check_table(const char *text)
{
    CHECK(printable_lines(text));
    if (!printable_lines(text)) fprintf(stderr, "table output holds unprintable bytes\n");
    CHECK(count_lines(text) == 2 + N);
    /* The rows after the two header lines, in the broker's order. */
    const char *p = strchr(text, '\n');
    p = p ? strchr(p + 1, '\n') : NULL;
    for (size_t i = 0; i < N; i++) {
        CHECK(p != NULL);
        if (!p) return;
        char want[300];
        shown_name(names[i], want, sizeof want);
        size_t n = strlen(want);
        bool ok = !strncmp(p + 1, want, n) && p[1 + n] == ' ';
        if (!ok) fprintf(stderr, "table row %zu does not start with '%s'\n", i, want);
        CHECK(ok);
        p = strchr(p + 1, '\n');
    }
    for (size_t a = 0; a < N; a++)
        for (size_t b = a + 1; b < N; b++) {
            char x[300], y[300];
            shown_name(names[a], x, sizeof x);
            shown_name(names[b], y, sizeof y);
            CHECK(strcmp(x, y) != 0);
        }
}

/* A series line: gpumem_broker_NAME{tenant="V"} NUMBER with V in the text
 * format's escaping; V (unescaped) into val.  false if not that shape. */
static bool series(const char *line, char *metric, size_t mcap, char *val, size_t vcap)
{
    const char *p = line;
    if (strncmp(p, "gpumem_broker_", 14)) return false;
    size_t m = 0;
    while ((*p >= 'a' && *p <= 'z') || *p == '_') {
        if (m + 1 >= mcap) return false;
        metric[m++] = *p++;
    }
    metric[m] = '\0';
    if (strncmp(p, "{tenant=\"", 9)) return false;
    p += 9;
    size_t o = 0;
    for (;;) {
        unsigned char c = (unsigned char)*p++;
        if (c == '"') break;
        if (c < 0x20 || c >= 0x7f) return false;
        if (c == '\\') {
            char e = *p++;
            if (e == 'n') c = '\n';
            else if (e == '\\' || e == '"') c = (unsigned char)e;
            else return false;
        }
        if (o + 1 >= vcap) return false;
        val[o++] = (char)c;
    }
    val[o] = '\0';
    if (*p++ != '}' || *p++ != ' ') return false;
    if (*p < '0' || *p > '9') return false;
    while (*p >= '0' && *p <= '9') p++;
    return *p == '\0';
}

static void check_metrics(const char *text)
{
    CHECK(printable_lines(text));
    char *copy = strdup(text);
    if (!copy) {
        CHECK(copy != NULL);
        return;
    }
    char metric[96], prev[96] = "", vals[N][256];
    size_t nv = 0, bad = 0, metrics = 0, per_metric_bad = 0;
    char *save = NULL;
    for (char *line = strtok_r(copy, "\n", &save);; line = strtok_r(NULL, "\n", &save)) {
        char val[256];
        bool is_series = line && series(line, metric, sizeof metric, val, sizeof val);
        /* A metric's series end: its label values must all differ. */
        if (!line || (is_series && strcmp(metric, prev) != 0)) {
            for (size_t a = 0; a < nv; a++)
                for (size_t b = a + 1; b < nv; b++) per_metric_bad += !strcmp(vals[a], vals[b]);
            if (prev[0]) metrics++;
            nv = 0;
            snprintf(prev, sizeof prev, "%s", is_series ? metric : "");
        }
        if (!line) break;
        if (!strncmp(line, "# HELP gpumem_broker_", 21) || !strncmp(line, "# TYPE gpumem_broker_", 21))
            continue;
        if (!strncmp(line, "gpumem_broker_capacity_bytes ", 29) ||
            !strncmp(line, "gpumem_broker_leased_bytes ", 27))
            continue;
        if (!is_series) {
            fprintf(stderr, "metrics: not a HELP, TYPE or series line: %s\n", line);
            bad++;
            continue;
        }
        if (nv < N) snprintf(vals[nv++], sizeof vals[0], "%s", val);
    }
    free(copy);
    CHECK(bad == 0);
    CHECK(per_metric_bad == 0);
    CHECK(metrics == 8);
    CHECK(strstr(text, "\ngpumem_evil") == NULL);
}

enum printer { TABLE, JSON, METRICS };

/* What a printer of gpumem broker (the table, --json, --metrics) wrote of
 * v, as a string to free; NULL when no memory stream could be opened. */
static char *printed(enum printer how, const char *path, const gm_broker_view_t *v)
{
    char *buf;
    size_t len;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    if (how == TABLE) gm_broker_print_table(f, path, v);
    else if (how == JSON) gm_broker_print_json(f, v);
    else gm_broker_print_metrics(f, v);
    fclose(f);
    return buf;
}

int main(void)
{
    char dir[] = "/tmp/gmbprint.XXXXXX", path[64];
    REQUIRE(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/b.sock", dir);
    g_lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    REQUIRE(g_lfd >= 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    REQUIRE(bind(g_lfd, (struct sockaddr *)&a, sizeof a) == 0);
    REQUIRE(listen(g_lfd, 8) == 0);
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, fake_broker, NULL) == 0);

    gm_broker_view_t v;
    CHECK_OK(gm_broker_query(path, &v));
    REQUIRE(v.n == N);
    for (size_t i = 0; i < N; i++) CHECK(strcmp(v.tenants[i].name, names[i]) == 0);

    static void (*const check[])(const char *) = {[TABLE] = check_table, [JSON] = check_json,
                                                  [METRICS] = check_metrics};
    for (enum printer how = TABLE; how <= METRICS; how++) {
        char *buf = printed(how, path, &v);
        REQUIRE(buf != NULL);
        check[how](buf);
        free(buf);
    }

    /* An error quoting what a broker sent is printed safe too. */
    char safe[64];
    gm_broker_safe_text("refused: \x1b[2J\n\xff", safe, sizeof safe);
    CHECK(printable_lines(safe) && !strchr(safe, '\n'));
    CHECK(strstr(safe, "refused: ") == safe);

    free(v.tenants);
    shutdown(g_lfd, SHUT_RDWR);
    close(g_lfd);
    pthread_join(th, NULL);
    unlink(path);
    rmdir(dir);
    return test_summary();
}
