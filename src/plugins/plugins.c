/* SPDX-License-Identifier: Apache-2.0 */
/*
 * plugins.c — the reporting the framework plug-ins share (plugins.h).
 */
#include <stdatomic.h>
#include <stdio.h>

#include "plugins/plugins.h"

void gm__plugin_free_failed(_Atomic unsigned long *count, const char *fn, const void *ptr, int device,
                            const char *why)
{
    if (atomic_fetch_add(count, 1) < 8)
        fprintf(stderr, "gpumem: %s(%p, device %d): %s\n", fn, ptr, device, why);
}
