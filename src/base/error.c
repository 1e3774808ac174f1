/* SPDX-License-Identifier: Apache-2.0 */
/*
 * error.c — status names and descriptions, the names of backend call kinds,
 * the per-thread last-error message, the internal-assert handler and the
 * version string.
 *
 * The one idea: reporting an error must never fail or allocate, because it
 * is used on out-of-memory paths.  Names and descriptions are generated from
 * GM_ERRNO_MAP (one table, as libuv does), call-kind names from
 * GM_CALL_KINDS (so a backend names the call it fails without linking the
 * backend selector), and the message lives in a fixed thread-local buffer,
 * like dlerror().  Nothing here takes a lock.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/internal.h"

/* Longer messages are truncated; callers keep them to a line or two, except
 * the out-of-memory report. */
#define ERROR_CAP 2048 /* room for the OOM report (src/observe/oom.c) */

static _Thread_local char last_error[ERROR_CAP];

const char *gm_version(void)
{
    return GM_VERSION_STRING;
}

const char *gm_strerror(int status)
{
    switch (status) {
#define GM__ERR_DESC(name, value, desc)                                        \
    case GM_##name:                                                            \
        return desc;
        GM_ERRNO_MAP(GM__ERR_DESC)
#undef GM__ERR_DESC
    default:
        return "unknown error";
    }
}

const char *gm_errname(int status)
{
    switch (status) {
#define GM__ERR_NAME(name, value, desc)                                        \
    case GM_##name:                                                            \
        return "GM_" #name;
        GM_ERRNO_MAP(GM__ERR_NAME)
#undef GM__ERR_NAME
    default:
        return "GM_UNKNOWN";
    }
}

static const char *const call_names[GM_CALL_COUNT] = {
#define GM__CALL_NAME(name) #name,
    GM_CALL_KINDS(GM__CALL_NAME)
#undef GM__CALL_NAME
};

const char *gm_call_name(int kind)
{
    if (kind < 0 || kind >= GM_CALL_COUNT) return NULL;
    return call_names[kind];
}

int gm_call_from_name(const char *name)
{
    if (name == NULL) return -1;
    for (int k = 0; k < GM_CALL_COUNT; k++)
        if (strcmp(call_names[k], name) == 0) return k;
    return -1;
}

const char *gm_last_error(void)
{
    return last_error;
}

int gm__set_errorv(int status, const char *fmt, va_list ap)
{
    /* Format into a scratch buffer first: a caller may pass gm_last_error()
     * itself as an argument to add context to the previous message, and
     * vsnprintf must not read from the buffer it writes. */
    char scratch[ERROR_CAP];
    if (fmt == NULL) {
        scratch[0] = '\0';
    } else if (vsnprintf(scratch, sizeof scratch, fmt, ap) < 0) {
        snprintf(scratch, sizeof scratch, "%s (message could not be formatted)",
                 gm_strerror(status));
    }
    memcpy(last_error, scratch, sizeof last_error);
    return status;
}

int gm__set_error(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    gm__set_errorv(status, fmt, ap);
    va_end(ap);
    return status;
}

void gm__clear_error(void)
{
    last_error[0] = '\0';
}

void gm__assert_fail(const char *expr, const char *file, int line)
{
    /* Only internal invariants reach here (debug builds): a bug in gpumem,
     * not something the caller can handle, so stopping is right. */
    fprintf(stderr, "gpumem: %s:%d: internal assertion failed: %s\n", file, line, expr);
    fflush(stderr);
    abort();
}
