/* SPDX-License-Identifier: Apache-2.0 */
/*
 * host.h — private declarations of the host-memory side of a pool: the
 * pinned host pool (host.c), the staged copy engine (copy.c) and the sysmem
 * fallback (sysmem.c).  Each keeps its own lock, taken after the pool lock
 * when both are held (pool lock -> sysmem -> host); none calls back into the
 * pool's device allocator.
 */
#ifndef GM_HOST_H
#define GM_HOST_H

#include <stdatomic.h>

#include "core/pool.h"

/* ---- defined in src/host/host.c ---------------------------------------------- */

int gm__host_init(gm_pool_t *pool);
/* Unregister and unmap every chunk (live blocks included).  No lock held. */
void gm__host_fini(gm_pool_t *pool);
/* Every block of the host pool is tagged with its owner at allocation, and
 * a free names the owner it expects: a block of another owner is left alone
 * (GM_INVALID_ARGUMENT), so gm_host_free cannot release a sysmem block nor a
 * staging buffer. */
enum { GM__HOST_NONE = -1, GM__HOST_USER = 0, GM__HOST_STAGING = 1, GM__HOST_SYSMEM = 2,
       GM__HOST_OFFLOAD = 3 /* host copies of offloaded blocks (offload/offload.c) */ };
/* Allocate pinned, device-mapped host memory for `kind`; *dptr (optional)
 * receives the device address of the block.  Takes the host lock. */
int gm__host_alloc_kind(gm_pool_t *pool, int kind, size_t size, gm_stream_t stream, void **ptr,
                        uintptr_t *dptr);
int gm__host_free_kind(gm_pool_t *pool, int kind, void *ptr, gm_stream_t stream);
/* Making pinned memory ahead (an offload's segment maker, offload/offload.c):
 * touching new memory (the kernel zeroes it) is CPU work and registering it
 * is the driver's, so one region can be touched while another registers.
 * gm__host_prepare_size: the size of the chunk an allocation of `size`
 * bytes would need now, or 0 when a free block would serve it (or enough
 * regions wait already); takes the host lock briefly, so ask it before
 * starting a registration of one's own.  gm__host_prepare: map and touch
 * that many bytes with no lock held; the next new chunk of that size only
 * registers them.  Best effort and silent: a failure leaves the chunk to be
 * made as usual.  gm__host_prepared_drop gives back the regions no chunk
 * took (gm__host_fini does too); gm__host_prepared_bytes: their size. */
size_t gm__host_prepare_size(gm_pool_t *pool, size_t size);
void gm__host_prepare(gm_pool_t *pool, size_t csize);
void gm__host_prepared_drop(gm_pool_t *pool);
size_t gm__host_prepared_bytes(gm_pool_t *pool);
/* Let the unused pinned memory there is now stay when the host pool grows
 * (a reserve made ahead, gm_offload_prepare), until gm_host_trim. */
void gm__host_keep_unused(gm_pool_t *pool);
/* Staging buffers (copy.c): GM__HOST_STAGING. */
int gm__host_alloc(gm_pool_t *pool, size_t size, gm_stream_t stream, void **ptr, uintptr_t *dptr);
int gm__host_free(gm_pool_t *pool, void *ptr, gm_stream_t stream);
/* Is [p, p+n) inside one live pinned block?  Takes the host lock. */
bool gm__host_is_pinned(gm_pool_t *pool, const void *p, size_t n);
/* Before a stream is destroyed: wait for it if the host pool holds blocks
 * freed on it, and make them everyone's.  Takes the host lock. */
int gm__host_stream_retire(gm_pool_t *pool, gm_stream_t handle);
/* Add the host side's counters to *s (host_*, backend calls and time).
 * Takes the host lock (the pool lock may be held). */
void gm__host_stats(gm_pool_t *pool, gm_stats_t *s);
/* Reset the host peaks (gm_pool_reset_peaks).  Takes the host lock. */
void gm__host_reset_peaks(gm_pool_t *pool);

/* ---- defined in src/host/copy.c ---------------------------------------------- */

/* The engine's state (workers start on the first staged copy). */
int gm__copy_init(gm_pool_t *pool);
/* Stop the workers and free the staging buffers.  No lock held. */
void gm__copy_fini(gm_pool_t *pool);
void gm__copy_stats(gm_pool_t *pool, gm_stats_t *s);

/* ---- defined in src/host/sysmem.c -------------------------------------------- */

/* The fallback: serve `size` bytes from mapped pinned host memory.  Called by
 * gm_alloc with the pool lock held after device memory ran out, only when the
 * pool has GM_POOL_SYSMEM_FALLBACK.  GM_OK, or the original OOM status rc. */
int gm__sysmem_alloc_locked(gm_pool_t *pool, size_t size, gm__stream_t *s, void **ptr, int rc);
/* gm_free, gm_block_size, gm_record_stream and the leak report: the sysmem
 * row, gm__kind_sysmem (core/kinds.h). */
/* Live sysmem blocks: how many, their bytes. */
void gm__sysmem_count_locked(gm_pool_t *pool, size_t *count, size_t *bytes);
void gm__sysmem_fini(gm_pool_t *pool);

/* ---- defined in src/host/managed.c -------------------------------------------- */

/* Root's lock held for all of these. */
int gm__managed_alloc_locked(gm_pool_t *pool, size_t size, unsigned flags, gm_stream_t stream,
                             void **ptr);
/* gm_free, gm_block_size, gm_record_stream and the leak report: the managed
 * row, gm__kind_managed (core/kinds.h). */
int gm__managed_prefetch_locked(gm_pool_t *pool, void *ptr, size_t size, int to_host,
                                gm_stream_t stream);
void gm__managed_fini(gm_pool_t *pool);

#endif /* GM_HOST_H */
