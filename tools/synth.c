/* SPDX-License-Identifier: Apache-2.0 */
/*
 * synth.c — `gpumem synth`: write a synthetic allocation trace (RMM logging
 * CSV) for a workload the recorded traces do not cover: an LLM server whose
 * KV cache grows naively or in pages, vision-transformer training, a long
 * pipeline over many streams, GPT training whose batch shape changes every
 * step.  docs/workloads.md describes each kind and why it is hard.
 *
 * This file is the command only: options, reading the trace back (a trace
 * we cannot parse is our bug) and writing it out.  The generator, one file
 * per workload family, is tools/synth/ (synth.h says how it models a
 * framework), built into libgpumem_tools.a with the trace reader.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "gpumem.h"
#include "base/internal.h"
#include "lib/trace_read.h"
#ifdef GM_HAVE_ZLIB
#include <zlib.h>
#endif

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Write len bytes to path (gzip when it ends in .gz, stdout for "-"). */
static int write_output(const char *path, const char *data, size_t len)
{
    if (strcmp(path, "-") == 0) {
        errno = 0;
        if (fwrite(data, 1, len, stdout) != len || fflush(stdout) != 0) {
            fprintf(stderr, "gpumem synth: cannot write to standard output: %s\n",
                    strerror(errno ? errno : EIO));
            return 1;
        }
        return 0;
    }
    if (ends_with(path, ".gz")) {
#ifdef GM_HAVE_ZLIB
        errno = 0;
        gzFile gz = gzopen(path, "wb6");
        if (!gz) {
            fprintf(stderr, "gpumem synth: cannot open %s: %s\n", path,
                    errno ? strerror(errno) : "out of memory");
            return 1;
        }
        size_t done = 0;
        int e = 0;
        while (done < len) {
            unsigned n = len - done > (1u << 30) ? 1u << 30 : (unsigned)(len - done);
            errno = 0;
            if (gzwrite(gz, data + done, n) != (int)n) {
                e = errno;
                break;
            }
            done += n;
        }
        errno = 0;
        if (gzclose(gz) != Z_OK && !e) e = errno ? errno : EIO;
        if (e || done != len) {
            fprintf(stderr, "gpumem synth: cannot write %s: %s\n", path, strerror(e ? e : EIO));
            return 1;
        }
        return 0;
#else
        fprintf(stderr, "gpumem synth: %s: gzip output needs a build with zlib; "
                        "write a plain .csv\n", path);
        return 2;
#endif
    }
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "gpumem synth: cannot open %s: %s\n", path, strerror(errno));
        return 1;
    }
    int e = 0;
    if (fwrite(data, 1, len, f) != len) e = errno ? errno : EIO;
    if (fclose(f) != 0 && !e) e = errno ? errno : EIO;
    if (e) {
        fprintf(stderr, "gpumem synth: cannot write %s: %s\n", path, strerror(e));
        return 1;
    }
    return 0;
}

int gm_cli_synth(int argc, char **argv)
{
    const char *kind = NULL, *output = NULL;
    unsigned long long seed = 1;
    double scale = 1.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int missing = 0;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            gm_cli_synth_usage(stdout);
            return 0;
        } else if (strcmp(a, "-o") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "gpumem synth: option -o needs a value\n");
                goto usage;
            }
            output = argv[++i];
        } else if ((v = gm_cli_option(argc, argv, &i, "output", &missing))) {
            output = v;
        } else if ((v = gm_cli_option(argc, argv, &i, "seed", &missing))) {
            char *end;
            seed = strtoull(v, &end, 0);
            if (v[0] < '0' || v[0] > '9' || *end != '\0') {
                fprintf(stderr, "gpumem synth: --seed: expected a number, got '%s'\n", v);
                goto usage;
            }
        } else if ((v = gm_cli_option(argc, argv, &i, "scale", &missing))) {
            char *end;
            scale = strtod(v, &end);
            if (*v == '\0' || *end != '\0' || !(scale >= 0.01 && scale <= 4.0)) {
                fprintf(stderr, "gpumem synth: --scale: expected 0.01..4, got '%s'\n", v);
                goto usage;
            }
        } else if (a[0] != '-' && !kind && !missing) {
            kind = a;
        } else {
            if (!missing) fprintf(stderr, "gpumem synth: unexpected argument '%s'\n", a);
            goto usage;
        }
    }
    if (!kind || !output) {
        fprintf(stderr, "gpumem synth: %s\n", !kind ? "no KIND given" : "no -o FILE given");
        goto usage;
    }
#ifndef GM_HAVE_ZLIB
    if (ends_with(output, ".gz")) return write_output(output, "", 0); /* says why not */
#endif

    char *text;
    size_t len;
    int rc = gm_cli_synth_generate(kind, seed, scale, &text, &len);
    if (rc == -1) {
        fprintf(stderr, "gpumem synth: unknown kind '%s'\n", kind);
        goto usage;
    }
    if (rc != 0) {
        fprintf(stderr, "gpumem synth: out of host memory\n");
        return 1;
    }
    /* Read it back as replay will: a trace we cannot parse is our bug. */
    gm__trace_t t;
    if (gm__trace_parse(text, len, kind, &t) != GM_OK || gm__trace_check(&t) != GM_OK) {
        fprintf(stderr, "gpumem synth: internal error: the %s trace does not read back: %s\n",
                kind, gm_last_error());
        gm__trace_free(&t);
        free(text);
        return 1;
    }
    /* Written first: the summary line says the file is there. */
    rc = write_output(output, text, len);
    free(text);
    if (rc == 0) {
        char peak[32];
        fprintf(stderr, "gpumem synth: %s (seed %llu, scale %g): %zu ops, live peak %s, "
                "%u stream%s -> %s\n", kind, seed, scale, t.n_ops,
                gm__fmt_bytes(t.live_peak, peak, sizeof peak), t.n_streams,
                t.n_streams == 1 ? "" : "s", output);
    }
    gm__trace_free(&t);
    return rc;

usage:
    gm_cli_synth_usage(stderr);
    return 2;
}
