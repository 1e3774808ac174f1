/* SPDX-License-Identifier: Apache-2.0 */
/*
 * select.c — the table of backends and the choice between them.
 *
 * The one idea: the core never asks which device it runs on; it asks this
 * file for a gm__backend_ops_t once, at pool creation, and from then on only
 * calls through that table.  AUTO means "the real device when its probe says
 * it is usable, else the simulator", and the reason for the choice is kept so
 * that `gpumem info` and gm_pool_device_info can say why.  The environment is
 * not read here (the pool reads it and passes the kind in).  No lock; the
 * only state: the flag that keeps AUTO's sim notice to one line a process,
 * and the fault-injection plumbing shared by the backends that have fail_nth
 * (countdowns armed for the next open, and a count of injected failures),
 * kept in atomics.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "base/internal.h"

/* ---- fault injection shared by the backends ---- */

static _Atomic unsigned long open_faults[GM_CALL_COUNT];
static _Atomic unsigned long injected_total;

void gm__backend_fail_at_open(int kind, unsigned long n)
{
    if (kind >= 0 && kind < GM_CALL_COUNT) atomic_store(&open_faults[kind], n);
}

void gm__backend_take_open_faults(unsigned long n[GM_CALL_COUNT])
{
    for (int k = 0; k < GM_CALL_COUNT; k++) n[k] = atomic_exchange(&open_faults[k], 0);
}

void gm__backend_note_injected(void)
{
    atomic_fetch_add(&injected_total, 1);
}

unsigned long gm__backend_injected(void)
{
    return atomic_load(&injected_total);
}

/* The backends this build knows, by kind. AUTO tries them in this order and
 * takes the first whose probe succeeds; the sim is last and always usable. */
static const struct {
    gm_backend_kind_t kind;
    const gm__backend_ops_t *ops;
} backend_table[] = {
    {GM_BACKEND_CUDA, &gm__backend_cuda},
    {GM_BACKEND_SIM, &gm__backend_sim},
};
#define BACKEND_COUNT (sizeof backend_table / sizeof backend_table[0])

/* Append s to the string in dst[cap], truncating. */
static void append(char *dst, size_t cap, const char *s)
{
    size_t len = strlen(dst), n = strlen(s);
    if (len + 1 >= cap) return;
    if (n > cap - len - 1) n = cap - len - 1;
    memcpy(dst + len, s, n);
    dst[len + n] = '\0';
}

/* Probe one backend; a backend without a probe counts as unusable. */
static int probe_backend(const gm__backend_ops_t *ops, int device, char *why, size_t cap)
{
    if (ops->probe == NULL) {
        snprintf(why, cap, "backend has no probe");
        return GM_NO_DEVICE;
    }
    why[0] = '\0';
    int rc = ops->probe(device, why, cap);
    if (rc != GM_OK && why[0] == '\0') snprintf(why, cap, "%s", gm_strerror(rc));
    return rc;
}

/* The one line AUTO writes when it ends on the sim for want of a driver:
 * once per process, since every pool of the process takes the same path. */
static void announce_sim_once(const char *reasons)
{
    static atomic_flag said = ATOMIC_FLAG_INIT;
    if (atomic_flag_test_and_set(&said)) return;
    fprintf(stderr, "gpumem: backend auto: %s; using the sim (host memory, not a GPU); "
                    "GPUMEM_BACKEND=sim asks for it and silences this line\n", reasons);
    fflush(stderr);
}

int gm__backend_select(gm_backend_kind_t kind, int device, const gm__backend_ops_t **ops,
                       gm_backend_kind_t *chosen, char *why, size_t why_cap)
{
    char scratch[1];
    if (why == NULL || why_cap == 0) {
        why = scratch;
        why_cap = sizeof scratch;
    }
    why[0] = '\0';
    if (ops == NULL || chosen == NULL)
        return gm__set_error(GM_INVALID_ARGUMENT, "backend select: NULL out-parameter");
    if (device < 0)
        return gm__set_error(GM_INVALID_ARGUMENT, "backend select: device %d is negative",
                             device);

    if (kind == GM_BACKEND_AUTO) {
        /* Backends not installed are passed over, their reasons collected:
         * "cuda: <reason>; using sim".  An installed one that fails its
         * probe ends the choice: its device exists in the user's mind, and
         * host memory in its place would be a lie. */
        char reasons[256] = "";
        for (size_t i = 0; i < BACKEND_COUNT; i++) {
            char r[256];
            const gm__backend_ops_t *b = backend_table[i].ops;
            if (b->installed != NULL) {
                r[0] = '\0';
                if (b->installed(r, sizeof r) != GM_OK) {
                    if (reasons[0] != '\0') append(reasons, sizeof reasons, "; ");
                    append(reasons, sizeof reasons, b->name);
                    append(reasons, sizeof reasons, ": ");
                    append(reasons, sizeof reasons, r[0] ? r : "not installed");
                    continue;
                }
            }
            if (probe_backend(b, device, r, sizeof r) != GM_OK) {
                snprintf(why, why_cap, "%s: %s", b->name, r);
                return gm__set_error(GM_NO_DEVICE,
                                     "backend auto: %s is installed but device %d cannot be "
                                     "used: %s; not falling back to the sim (GPUMEM_BACKEND=sim "
                                     "asks for it)", b->name, device, r);
            }
            *ops = b;
            *chosen = backend_table[i].kind;
            if (reasons[0] != '\0') {
                snprintf(why, why_cap, "%s; using %s", reasons, b->name);
                if (backend_table[i].kind == GM_BACKEND_SIM) announce_sim_once(reasons);
            } else {
                snprintf(why, why_cap, "auto: %s device %d is usable", b->name, device);
            }
            return GM_OK;
        }
        snprintf(why, why_cap, "%s", reasons);
        return gm__set_error(GM_NO_DEVICE, "no usable backend: %s", reasons);
    }

    for (size_t i = 0; i < BACKEND_COUNT; i++) {
        if (backend_table[i].kind != kind) continue;
        const char *name = backend_table[i].ops->name;
        char r[256];
        if (probe_backend(backend_table[i].ops, device, r, sizeof r) != GM_OK) {
            snprintf(why, why_cap, "%s: %s", name, r);
            return gm__set_error(GM_NO_DEVICE, "%s backend unusable: %s", name, r);
        }
        *ops = backend_table[i].ops;
        *chosen = kind;
        snprintf(why, why_cap, "%s requested", name);
        return GM_OK;
    }
    return gm__set_error(GM_INVALID_ARGUMENT, "backend select: unknown backend kind %d",
                         (int)kind);
}

void gm__backend_describe(int device, const char *sep, char *out, size_t cap)
{
    if (out == NULL || cap == 0) return;
    out[0] = '\0';
    for (size_t i = 0; i < BACKEND_COUNT; i++) {
        const gm__backend_ops_t *b = backend_table[i].ops;
        char r[256] = "", line[320];
        if (b->installed != NULL && b->installed(r, sizeof r) != GM_OK) {
            snprintf(line, sizeof line, "%s: not installed (%s)", b->name, r);
        } else if (probe_backend(b, device, r, sizeof r) != GM_OK) {
            snprintf(line, sizeof line, "%s: installed, device %d not usable (%s)", b->name,
                     device, r);
        } else {
            snprintf(line, sizeof line, "%s: usable (%s)", b->name, r);
        }
        if (out[0] != '\0') append(out, cap, sep);
        append(out, cap, line);
    }
}

int gm__backend_resolve_peers(const char *name, int self, int ndevices, uint64_t want,
                              int (*reach)(void *arg, int d, int *ok), void *arg,
                              const char *why, uint64_t *out)
{
    *out = 0;
    for (int d = 0; d < 64; d++) {
        if (d == self || !(want & ((uint64_t)1 << d))) continue;
        if (d >= ndevices) {
            if (want == GM__PEERS_ALL) break;
            return gm__set_error(GM_NO_DEVICE, "%s: peer device %d does not exist (%d device%s)",
                                 name, d, ndevices, ndevices == 1 ? "" : "s");
        }
        int ok = 0;
        GM_CHECK(reach(arg, d, &ok));
        if (!ok)
            return gm__set_error(GM_NOT_SUPPORTED, "%s: device %d cannot access device %d's "
                                 "memory (%s); leave it out of the peers (GPUMEM_PEERS)", name, d,
                                 self, why);
        *out |= (uint64_t)1 << d;
    }
    return GM_OK;
}
