/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_synth.c — the synthetic trace generator behind `gpumem synth`
 * (tools/synth/): every kind parses back with the trace reader (tools/lib/trace_read.c)
 * into a well-formed trace (no unknown or mismatched frees, everything freed
 * at the end, sizes rounded to 512 B, time never going back, the streams the
 * kind promises), the same seed gives the same bytes and another seed other
 * bytes, scale makes the trace larger, and at scale 1 each kind stays within
 * the documented bounds (20k..300k ops, 2..16 GB live peak).
 *
 * The generator is a tool, not part of the library: this test links it from
 * libgpumem_tools.a (tools/synth/), without the command around it.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "test.h"
#include "base/internal.h"
#include "lib/trace_read.h"

static int generate(const char *kind, unsigned long long seed, double scale, char **text,
                    size_t *len)
{
    return gm_cli_synth_generate(kind, seed, scale, text, len);
}

/* Parse and check one generated trace; *t is left for the caller. */
static int load(const char *kind, unsigned long long seed, double scale, gm__trace_t *t)
{
    char *text = NULL;
    size_t len = 0;
    memset(t, 0, sizeof *t);
    int rc = generate(kind, seed, scale, &text, &len);
    CHECK(rc == 0);
    if (rc != 0) return -1;
    CHECK(len > 40 && memcmp(text, "Thread,Time,Action,Pointer,Size,Stream\n", 39) == 0);
    rc = gm__trace_parse(text, len, kind, t);
    CHECK_OK(rc);
    free(text);
    return rc == GM_OK ? 0 : -1;
}

static void test_well_formed(const char *kind)
{
    gm__trace_t t;
    if (load(kind, 7, 0.05, &t) != 0) return;
    CHECK_OK(gm__trace_check(&t));
    CHECK(t.n_ops > 1000);
    CHECK(t.n_allocs > 0 && t.n_allocs == t.n_frees); /* everything freed at the end */
    CHECK(t.live_final == 0 && t.live_final_count == 0);
    CHECK(t.unknown_frees == 0);
    CHECK(t.dup_allocs == 0);
    CHECK(t.alloc_failures == 0);
    CHECK(t.free_size_mismatches == 0);
    CHECK(t.live_peak > 0);
    int sizes_ok = 1, time_ok = 1, thread_ok = 1;
    uint64_t total = 0;
    for (size_t i = 0; i < t.n_ops; i++) {
        const gm__trace_op_t *op = &t.ops[i];
        if (op->size == 0 || op->size % 512 != 0) sizes_ok = 0;
        if (i > 0 && op->time_ns < t.ops[i - 1].time_ns) time_ok = 0;
        if (op->thread >= 8) thread_ok = 0;
        if (op->action == GM__TRACE_ALLOC) total += op->size;
    }
    CHECK(sizes_ok);
    CHECK(time_ok);
    CHECK(thread_ok);
    CHECK(t.live_peak <= total);
    if (strcmp(kind, "multistream") == 0) {
        CHECK(t.n_streams >= 4 && t.n_streams <= 8);
        int nonzero = 1;
        for (uint32_t i = 0; i < t.n_streams; i++)
            if (t.streams[i] == 0 || t.streams[i] > 8) nonzero = 0;
        CHECK(nonzero);
    } else {
        CHECK(t.n_streams == 1 && t.streams[0] == 0);
    }
    gm__trace_free(&t);
}

static void test_deterministic(const char *kind)
{
    char *a = NULL, *b = NULL, *c = NULL;
    size_t na = 0, nb = 0, nc = 0;
    CHECK(generate(kind, 42, 0.05, &a, &na) == 0);
    CHECK(generate(kind, 42, 0.05, &b, &nb) == 0);
    CHECK(generate(kind, 43, 0.05, &c, &nc) == 0);
    CHECK(a && b && na == nb && memcmp(a, b, na) == 0);
    CHECK(a && c && (na != nc || memcmp(a, c, na) != 0));
    free(a);
    free(b);
    free(c);
}

static void test_scale_grows(const char *kind)
{
    gm__trace_t small, large;
    if (load(kind, 3, 0.05, &small) != 0) return;
    if (load(kind, 3, 0.2, &large) == 0) {
        CHECK(large.live_peak > small.live_peak);
        gm__trace_free(&large);
    }
    gm__trace_free(&small);
}

/* The bounds docs/workloads.md promises at scale 1. */
static void test_scale_one_bounds(const char *kind)
{
    gm__trace_t t;
    if (load(kind, 1, 1.0, &t) != 0) return;
    CHECK(t.n_ops >= 20000 && t.n_ops <= 300000);
    CHECK(t.live_peak >= 2000000000ull && t.live_peak <= 16000000000ull);
    if (strcmp(kind, "multistream") == 0) CHECK(t.n_ops >= 200000);
    if (t.n_ops < 20000 || t.n_ops > 300000 || t.live_peak < 2000000000ull ||
        t.live_peak > 16000000000ull)
        fprintf(stderr, "%s: %zu ops, live peak %llu bytes\n", kind, t.n_ops,
                (unsigned long long)t.live_peak);
    gm__trace_free(&t);
}

static void test_unknown_kind(void)
{
    char *text = (char *)"x";
    size_t len = 1;
    CHECK(generate("no_such_kind", 1, 1.0, &text, &len) == -1);
    CHECK(text == NULL && len == 0);
}

int main(void)
{
    int n = 0;
    for (const char *const *k = gm_cli_synth_kinds; *k; k++, n++) {
        test_well_formed(*k);
        test_deterministic(*k);
        test_scale_grows(*k);
        test_scale_one_bounds(*k);
    }
    CHECK(n == 5);
    test_unknown_kind();
    return test_summary();
}
