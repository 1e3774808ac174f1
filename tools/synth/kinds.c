/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kinds.c — the synthetic workloads by name (one row each, its generator and
 * a line for the usage text) and gm_cli_synth_generate, which runs one into
 * memory: the generator's entry point for the command (tools/synth.c) and
 * the tests.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "synth/synth.h"

/* ---- the kinds ------------------------------------------------------------- */

typedef struct kind {
    const char *name;
    void (*generate)(synth_t *s);
    const char *summary;
} kind_t;

static const kind_t kinds[] = {
    {"kv_inference", synth_kv_inference,
     "LLM server, KV cache grown one token at a time by copy (torch.cat)"},
    {"kv_paged", synth_kv_paged, "LLM server, KV cache grown in 16-token blocks (paged)"},
    {"vit_train", synth_vit_train, "ViT-L/16 training, AdamW, batch size changing every few steps"},
    {"multistream", synth_multistream,
     "6-stage pipeline on streams 1..8, buffers freed by the next stage"},
    {"varbatch_train", synth_varbatch_train,
     "GPT training, batch x sequence length changing every step"},
};
#define N_KINDS (sizeof kinds / sizeof kinds[0])

const char *const gm_cli_synth_kinds[] = {"kv_inference", "kv_paged", "vit_train",
                                          "multistream", "varbatch_train", NULL};

int gm_cli_synth_generate(const char *kind, unsigned long long seed, double scale, char **text,
                          size_t *len)
{
    *text = NULL;
    *len = 0;
    const kind_t *k = NULL;
    for (size_t i = 0; i < N_KINDS; i++)
        if (strcmp(kinds[i].name, kind) == 0) k = &kinds[i];
    if (!k) return -1;
    synth_t s;
    memset(&s, 0, sizeof s);
    s.scale = scale;
    /* Different kinds draw from different streams even with one seed. */
    s.rng = seed ^ 0x5851f42d4c957f2dull * (uint64_t)(k - kinds + 1);
    s.time_rng = ~seed;
    synth_write_text(&s, GM__TRACE_HEADER_LINE);
    k->generate(&s);
    if (s.nomem) {
        free(s.buf);
        return -2;
    }
    *text = s.buf;
    *len = s.len;
    return 0;
}

void gm_cli_synth_usage(FILE *out)
{
    fprintf(out, "usage: gpumem synth KIND [--seed N] [--scale X] -o FILE\n\n"
                 "Write a synthetic allocation trace (RMM logging CSV) modelling how a\n"
                 "framework allocates while running KIND; the same KIND, seed and scale\n"
                 "always give the same file.  FILE ending in .gz is gzip'd; - is stdout.\n\n"
                 "kinds:\n");
    for (size_t i = 0; i < N_KINDS; i++) fprintf(out, "  %-15s %s\n", kinds[i].name, kinds[i].summary);
    fprintf(out, "\n  --seed N        random seed (default 1)\n"
                 "  --scale X       multiply model and batch dimensions (default 1, from\n"
                 "                  0.01 to 4; at 1 each trace peaks at 2..16 GB live)\n"
                 "  -o, --output F  where to write\n\n"
                 "See docs/workloads.md for what each kind models.\n");
}
