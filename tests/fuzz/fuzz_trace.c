/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_trace.c — libFuzzer target for the trace reader: any bytes, plain or
 * gzip, go through gm__trace_parse.  Beyond "no crash, no leak, no undefined
 * behaviour" (the sanitizers' part) it checks the reader's own promises:
 * a parsed trace passes gm__trace_check (slots, peaks and counts agree with
 * the ops), and a failed parse leaves the trace empty with a message that
 * names the input.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpumem.h"
#include "lib/trace_read.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gm__trace_t t;
    int rc = gm__trace_parse((const char *)data, size, "fuzz", &t);
    if (rc == GM_OK) {
        if (gm__trace_check(&t) != GM_OK) abort();
    } else {
        if (t.ops || t.streams || t.name || t.n_ops) abort();
        if (strncmp(gm_last_error(), "fuzz:", 5) != 0) abort();
    }
    gm__trace_free(&t);
    return 0;
}
