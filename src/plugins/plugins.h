/* SPDX-License-Identifier: Apache-2.0 */
/*
 * plugins.h — what the framework plug-ins (torch.c, cupy.c) share.
 */
#ifndef GM_PLUGINS_H
#define GM_PLUGINS_H

/* A free that failed inside a framework's destructor, where stderr is the
 * only way out: the first few per counter are printed ("gpumem: FN(PTR,
 * device D): WHY"), the rest only counted.  Takes no lock. */
void gm__plugin_free_failed(_Atomic unsigned long *count, const char *fn, const void *ptr, int device,
                            const char *why);

#endif /* GM_PLUGINS_H */
