/* SPDX-License-Identifier: Apache-2.0 */
/*
 * report.c — `gpumem report TRACE -o report.html`: one self-contained HTML
 * page (inline CSS, JavaScript and SVG; nothing fetched) with the timeline
 * of live and reserved bytes, the block map at the live peak, a histogram of
 * allocation sizes and, when present, the top allocation sites.
 *
 * The one idea: the trace gives the live bytes; the reserved bytes and the
 * block addresses come from replaying it through a fresh sim pool, exactly
 * as `gpumem replay` does.  Long traces are cut into at most MAX_POINTS
 * buckets, each keeping its maximum, so every peak survives the thinning.
 * The page (tools/report/page.html, embedded at build time) draws the data
 * and runs its own consistency checks, writing "ok" into #checks and the
 * title, which the headless-browser test reads.
 *
 * Strings from files (the trace's name, the call sites of TRACE.sites) are
 * data inside the page's <script>: script_string escapes them for a JSON
 * string that is also inert HTML, so no file can end the script or add
 * markup.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "gpumem.h"
#include "base/internal.h"
#include "core/pool.h"
#include "report_page.h"
#include "lib/replay_step.h"
#include "lib/trace_read.h"

#define MAX_POINTS 2000
#define GAP_CAP ((uint64_t)64 << 20)

void gm_cli_report_usage(FILE *out)
{
    fprintf(out,
            "usage: gpumem report [--capacity BYTES] [--no-replay] TRACE -o REPORT.html\n\n"
            "Write one self-contained HTML file about an RMM CSV trace (plain or gzip):\n"
            "live and reserved bytes over time (reserved: replayed through a sim pool),\n"
            "the block map at the live peak, a histogram of allocation sizes, the top\n"
            "allocation sites when the trace has them (TRACE.sites, written next to a\n"
            "trace recorded with GPUMEM_LEAK_CHECK=1).  Progress goes to stderr.\n\n"
            "  -o, --output F  the HTML file to write (required)\n"
            "  --capacity B    sim device size for the replay (default: the sim's own)\n"
            "  --no-replay     skip the replay (no reserved line, no block map)\n");
}

typedef struct blk {
    uint64_t addr, size;
} blk_t;

static int cmp_blk(const void *a, const void *b)
{
    const blk_t *x = a, *y = b;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* Call sites from the side file TRACE.sites ("Row,Bytes,Site", written by
 * the trace recorder under GPUMEM_LEAK_CHECK): bytes and allocations per
 * site, aggregated in a small open-addressing table. */
#define SITE_SLOTS 4096
typedef struct site {
    char *name;
    uint64_t bytes, count;
} site_t;

static int cmp_site(const void *a, const void *b)
{
    const site_t *x = a, *y = b;
    return x->bytes < y->bytes ? 1 : x->bytes > y->bytes ? -1 : 0;
}

static size_t load_sites(const char *trace, site_t *tab, uint64_t *rows)
{
    char path[4096];
    snprintf(path, sizeof path, "%s.sites", trace);
    FILE *f = fopen(path, "r");
    *rows = 0;
    if (!f) return 0;
    char line[2048];
    size_t n = 0;
    while (fgets(line, sizeof line, f)) {
        char *c1 = strchr(line, ','), *c2 = c1 ? strchr(c1 + 1, ',') : NULL;
        if (!c2 || !strncmp(line, "Row,", 4)) continue;
        char *name = c2 + 1;
        name[strcspn(name, "\r\n")] = '\0';
        uint64_t bytes = strtoull(c1 + 1, NULL, 10), h = 1469598103934665603ull;
        for (const char *q = name; *q; q++) h = (h ^ (unsigned char)*q) * 1099511628211ull;
        size_t j = (size_t)(h % SITE_SLOTS);
        while (tab[j].name && strcmp(tab[j].name, name)) j = (j + 1) % SITE_SLOTS;
        if (!tab[j].name) {
            if (n == SITE_SLOTS - 1) continue; /* full: the rest are not counted */
            tab[j].name = strdup(name);
            if (!tab[j].name) continue;
            n++;
        }
        tab[j].bytes += bytes;
        tab[j].count++;
        ++*rows;
    }
    fclose(f);
    qsort(tab, SITE_SLOTS, sizeof *tab, cmp_site);
    return n;
}

/* Length of the valid UTF-8 sequence at p (1..4), or 0 when it is not one. */
static int utf8_len(const unsigned char *p)
{
    int n = p[0] < 0x80 ? 1 : (p[0] & 0xe0) == 0xc0 ? 2 : (p[0] & 0xf0) == 0xe0 ? 3
            : (p[0] & 0xf8) == 0xf0 ? 4 : 0;
    if (n == 2 && p[0] < 0xc2) return 0; /* overlong */
    for (int k = 1; k < n; k++)
        if ((p[k] & 0xc0) != 0x80) return 0;
    if (n == 3 && ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] >= 0xa0))) return 0;
    if (n == 4 && ((p[0] == 0xf0 && p[1] < 0x90) || p[0] > 0xf4 || (p[0] == 0xf4 && p[1] >= 0x90)))
        return 0;
    return n;
}

/* Write s as a JSON string literal safe inside an HTML <script>: besides
 * the quote and backslash, <, >, & (no "</script>", "<!--" or entity can
 * appear), U+2028/2029 (line ends to older JavaScript) and control
 * characters become \u escapes; bytes that are not UTF-8 become U+FFFD. */
static void script_string(FILE *out, const char *s)
{
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int n = utf8_len(p);
        if (n == 0) {
            fputs("\\ufffd", out);
            p++;
        } else if (n == 1) {
            if (*p == '"' || *p == '\\') fprintf(out, "\\%c", *p);
            else if (*p < 0x20 || *p == 0x7f || *p == '<' || *p == '>' || *p == '&')
                fprintf(out, "\\u%04x", *p);
            else fputc(*p, out);
            p++;
        } else if (n == 3 && p[0] == 0xe2 && p[1] == 0x80 && (p[2] == 0xa8 || p[2] == 0xa9)) {
            fprintf(out, "\\u%04x", p[2] == 0xa8 ? 0x2028 : 0x2029);
            p += 3;
        } else {
            fwrite(p, 1, (size_t)n, out);
            p += n;
        }
    }
    fputc('"', out);
}

static void progress(const char *what, size_t done, size_t n, int *shown)
{
    if (n < 200000) return;
    fprintf(stderr, "\rreport: %s %3d%%", what, (int)(100.0 * (double)done / (double)n));
    fflush(stderr);
    *shown = 1;
}

int gm_cli_report(int argc, char **argv)
{
    const char *in = NULL, *outpath = NULL;
    size_t capacity = 0;
    int replay = 1, missing = 0;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            gm_cli_report_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "-o") && i + 1 < argc) {
            outpath = argv[++i];
        } else if ((v = gm_cli_option(argc, argv, &i, "output", &missing))) {
            outpath = v;
        } else if ((v = gm_cli_option(argc, argv, &i, "capacity", &missing))) {
            if (gm__parse_size(v, &capacity) != GM_OK) {
                fprintf(stderr, "gpumem report: --capacity %s: give bytes, e.g. 16GiB\n", v);
                return 2;
            }
        } else if (!strcmp(argv[i], "--no-replay")) {
            replay = 0;
        } else if (argv[i][0] != '-' && !in) {
            in = argv[i];
        } else {
            if (!missing) fprintf(stderr, "gpumem report: unexpected argument '%s'\n", argv[i]);
            gm_cli_report_usage(stderr);
            return 2;
        }
    }
    if (!in || !outpath) {
        gm_cli_report_usage(stderr);
        return 2;
    }
    gm__trace_t t;
    if (gm__trace_load(in, &t) != GM_OK) {
        fprintf(stderr, "gpumem report: %s\n", gm_last_error());
        return 2;
    }
    int rc = 1, shown = 0;
    size_t n = t.n_ops;
    size_t per = n > MAX_POINTS ? (n + MAX_POINTS - 1) / MAX_POINTS : 1;
    size_t points = n ? (n + per - 1) / per : 1;
    uint64_t *live = calloc(points, sizeof *live), *res = calloc(points, sizeof *res);
    uint64_t *slot_size = calloc(t.n_slots ? t.n_slots : 1, sizeof *slot_size);
    void **ptrs = calloc(t.n_slots ? t.n_slots : 1, sizeof *ptrs);
    uint16_t *slot_stream = calloc(t.n_slots ? t.n_slots : 1, sizeof *slot_stream);
    gm_stream_t *streams = calloc(t.n_streams ? t.n_streams : 1, sizeof *streams);
    blk_t *blocks = calloc(t.n_slots ? t.n_slots : 1, sizeof *blocks);
    uint64_t hist[64] = {0};
    site_t *sites = calloc(SITE_SLOTS, sizeof *sites);
    uint64_t site_rows = 0;
    size_t n_sites = sites ? load_sites(in, sites, &site_rows) : 0;
    size_t n_blocks = 0, peak_op = 0;
    uint64_t reserved_peak = 0;
    gm_pool_t *pool = NULL;
    FILE *out = NULL;
    const replay_slots_t slots = {ptrs, slot_size, slot_stream};
    replay_pool_t target = {NULL, streams};
    if (!live || !res || !slot_size || !ptrs || !slot_stream || !streams || !blocks) {
        fprintf(stderr, "gpumem report: out of host memory\n");
        goto done;
    }
    if (replay) {
        gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
        cfg.backend = GM_BACKEND_SIM;
        cfg.sim_capacity = capacity;
        if (gm_pool_create(&cfg, &pool) != GM_OK) {
            fprintf(stderr, "gpumem report: cannot create a sim pool: %s\n", gm_last_error());
            goto done;
        }
        target.pool = pool;
        for (uint32_t s = 0; s < t.n_streams; s++)
            if (t.streams[s] && gm_stream_create(pool, &streams[s]) != GM_OK) {
                fprintf(stderr, "gpumem report: cannot create a stream: %s\n", gm_last_error());
                goto done;
            }
    }
    uint64_t cur = 0, failed = 0;
    bool peak_taken = false;
    for (size_t i = 0; i < n; i++) {
        const gm__trace_op_t *op = &t.ops[i];
        if (op->action == GM__TRACE_ALLOC) {
            cur += op->size;
            hist[op->size ? 63 - __builtin_clzll(op->size) : 0]++;
        } else if (op->action == GM__TRACE_FREE && op->slot != GM__TRACE_NO_SLOT) {
            cur -= op->size;
        }
        /* A failed free is not counted: the report shows reserved bytes. */
        if (pool && replay_step(&slots, op, replay_pool_alloc, replay_pool_free, &target) != GM_OK &&
            op->action == GM__TRACE_ALLOC)
            failed++;
        size_t k = i / per;
        if (cur > live[k]) live[k] = cur;
        if (pool) {
            /* The counter alone, after every op, through the pool's private
             * struct: the public API has no cheap read of it.  gm_pool_stats
             * walks every block (one call per point made a report 8 times
             * slower), a read per point misses the peaks between reads, and
             * gm_pool_reset_peaks, to take the pool's own peak per point,
             * changes the replay (the page budget grows from allocated_peak). */
            gm__lock(&pool->lock);
            uint64_t r = pool->st.reserved;
            gm__unlock(&pool->lock);
            if (r > res[k]) res[k] = r;
            if (r > reserved_peak) reserved_peak = r;
        }
        /* The block map: the first time the live bytes reach their peak. */
        if (!peak_taken && cur == t.live_peak && t.live_peak) {
            peak_taken = true;
            peak_op = i + 1;
            for (uint32_t s = 0; s < t.n_slots; s++)
                if (ptrs[s]) blocks[n_blocks++] = (blk_t){(uint64_t)(uintptr_t)ptrs[s], slot_size[s]};
        }
        if ((i & 0xffff) == 0) progress("replaying", i, n, &shown);
    }
    if (pool && failed)
        fprintf(stderr, "%sgpumem report: %llu allocations failed in the sim replay (raise "
                "--capacity); the reserved line and block map are incomplete\n",
                shown ? "\n" : "", (unsigned long long)failed), shown = 0;
    qsort(blocks, n_blocks, sizeof *blocks, cmp_blk);

    out = fopen(outpath, "w");
    if (!out) {
        fprintf(stderr, "%sgpumem report: cannot create %s\n", shown ? "\n" : "", outpath);
        goto done;
    }
    /* The page, with the data object in place of the DATA marker. */
    const char *page = (const char *)report_page;
    size_t page_len = sizeof report_page;
    const char *mark = "/*DATA*/";
    const char *at = NULL;
    for (size_t i = 0; i + strlen(mark) <= page_len; i++)
        if (!memcmp(page + i, mark, strlen(mark))) {
            at = page + i;
            break;
        }
    if (!at) {
        fprintf(stderr, "gpumem report: the embedded page has no data marker\n");
        goto done;
    }
    fwrite(page, 1, (size_t)(at - page), out);
    fprintf(out, "{\"name\":");
    const char *base = strrchr(in, '/');
    script_string(out, base ? base + 1 : in);
    fprintf(out, ",\"ops\":%zu,\"n_allocs\":%llu,\"n_frees\":%llu,\"alloc_failures\":%llu,"
            "\"live_peak\":%llu,\"live_final\":%llu,\"reserved_peak\":%llu,\"replayed\":%s,"
            "\"peak_op\":%zu,\"gap_cap\":%llu,\"live\":[",
            n, (unsigned long long)t.n_allocs, (unsigned long long)t.n_frees,
            (unsigned long long)t.alloc_failures, (unsigned long long)t.live_peak,
            (unsigned long long)t.live_final, (unsigned long long)reserved_peak,
            pool && !failed ? "true" : "false", peak_op, (unsigned long long)GAP_CAP);
    for (size_t k = 0; k < points; k++) fprintf(out, "%s%llu", k ? "," : "", (unsigned long long)live[k]);
    fprintf(out, "],\"reserved\":[");
    for (size_t k = 0; k < points; k++) fprintf(out, "%s%llu", k ? "," : "", (unsigned long long)res[k]);
    /* Addresses relative to the lowest block keep the numbers exact in JS. */
    uint64_t lo = n_blocks ? blocks[0].addr : 0;
    fprintf(out, "],\"blocks\":[");
    for (size_t k = 0; k < n_blocks; k++)
        fprintf(out, "%s[%llu,%llu]", k ? "," : "", (unsigned long long)(blocks[k].addr - lo),
                (unsigned long long)blocks[k].size);
    fprintf(out, "],\"hist\":[");
    int first = 1;
    for (int b = 0; b < 64; b++) {
        if (!hist[b]) continue;
        fprintf(out, "%s[%llu,%llu]", first ? "" : ",", 1ull << b, (unsigned long long)hist[b]);
        first = 0;
    }
    fprintf(out, "],\"site_rows\":%llu,\"sites\":[", (unsigned long long)site_rows);
    for (size_t k = 0; k < n_sites && k < 20; k++) {
        fprintf(out, "%s[", k ? "," : "");
        script_string(out, sites[k].name);
        fprintf(out, ",%llu,%llu]", (unsigned long long)sites[k].bytes,
                (unsigned long long)sites[k].count);
    }
    fprintf(out, "]}");
    fwrite(at + strlen(mark), 1, page_len - (size_t)(at + strlen(mark) - page), out);
    if (fclose(out) != 0) {
        out = NULL;
        fprintf(stderr, "gpumem report: writing %s failed\n", outpath);
        goto done;
    }
    out = NULL;
    if (shown) fprintf(stderr, "\rreport: done          \n");
    printf("wrote %s: %zu ops, live peak %llu bytes, reserved peak %llu bytes\n", outpath, n,
           (unsigned long long)t.live_peak, (unsigned long long)reserved_peak);
    rc = 0;
done:
    if (out) fclose(out);
    if (pool) {
        for (uint32_t s = 0; s < t.n_slots; s++)
            if (ptrs && ptrs[s]) gm_free(pool, ptrs[s], NULL);
        for (uint32_t s = 0; s < t.n_streams; s++)
            if (streams && streams[s]) gm_stream_destroy(pool, streams[s]);
        gm_pool_destroy(pool);
    }
    free(live);
    free(res);
    free(slot_size);
    free(ptrs);
    free(slot_stream);
    free(streams);
    free(blocks);
    if (sites)
        for (size_t k = 0; k < SITE_SLOTS; k++) free(sites[k].name);
    free(sites);
    gm__trace_free(&t);
    return rc;
}
