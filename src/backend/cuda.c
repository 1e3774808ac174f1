/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuda.c — the CUDA driver backend: the backend contract (backend.h) carried
 * out with the driver's virtual memory management calls.
 *
 * It owns three things: the driver itself, loaded once per process
 * (dlopen("libcuda.so.1"), then every entry point through cuGetProcAddress at
 * one ABI version, never dlclose'd); one small immutable object per open
 * device (the retained primary context and what the device supports); and the
 * translation of every CUresult into a gpumem status plus a message naming the
 * call and the driver's own error name and text.  The idea: be the driver's
 * thinnest possible skin.  We use the device's *primary* context, the one the
 * CUDA runtime, PyTorch and CuPy use, so our memory and their kernels and
 * streams live in one context; each call makes that context current for its
 * duration and gives the thread back the context it had, so a program that
 * works on another device meanwhile is not disturbed.
 *
 * Fault injection (fail_nth, the same contract as the sim's): every driver
 * call a member makes goes through CU_CALL with the member's call kind, and
 * CU_CALL first asks the context's countdown for that kind whether this is
 * the armed call; if so, the driver is not called and the member fails as if
 * the driver had answered CUDA_ERROR_UNKNOWN, changing nothing.  So the fault
 * tests of tests/attack run unchanged on a GPU.
 *
 * Thread safety: no lock is taken anywhere.  The loader runs under
 * pthread_once; a device object is written only in open and read-only after,
 * except its fault countdowns, which are atomics; the driver is thread-safe
 * itself.  Nothing here sits on a hot path: the allocator calls the backend
 * only to grow, shrink or sync.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/internal.h"
#include "backend/cuda_driver.h"

/* Page size reported when the device has no VMM support: info fills every
 * field, though the pool refuses such a device (it needs VMM). */
#define NO_VMM_GRANULARITY ((size_t)2 << 20)

/* ------------------------------------------------------------------------ */
/* The driver, loaded once                                                  */
/* ------------------------------------------------------------------------ */

/* Every entry point we use; NULL until loaded, and optional ones may stay
 * NULL (see GM__CUDA_DRIVER_FUNCS). */
static struct {
#define DRIVER_MEMBER(name, required, params) gm__pfn_##name name;
    GM__CUDA_DRIVER_FUNCS(DRIVER_MEMBER)
#undef DRIVER_MEMBER
} drv;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int load_status = GM_NO_DEVICE; /* GM_OK once the driver is usable */
static char load_error[160];           /* why it is not, when it is not */
static int driver_absent = 1;          /* no NVIDIA driver here at all (see cuda_installed) */
static int have_vmm_calls;             /* every VMM entry point resolved */
static int have_fd_calls;              /* export/import resolved */

/* The two ways of looking symbols up: cuGetProcAddress_v2 (CUDA 12+) or the
 * original cuGetProcAddress (11.3+).  Written only inside load_driver. */
static gm__pfn_cuGetProcAddress_v2 get_proc_v2;
static gm__pfn_cuGetProcAddress get_proc_v1;

/* dlsym's object pointer to a function pointer, without the cast ISO C
 * frowns on. */
static void store_fn(void *slot, void *fn, size_t size)
{
    memcpy(slot, &fn, size);
}

static CUresult lookup_result; /* of the last lookup, for load_driver's message */

static void *lookup(const char *name)
{
    void *fn = NULL;
    CUresult r;
    if (get_proc_v2) {
        CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        r = get_proc_v2(name, &fn, GM_CUDA_ABI_VERSION, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &found);
        if (found != CU_GET_PROC_ADDRESS_SUCCESS) fn = NULL;
    } else {
        r = get_proc_v1(name, &fn, GM_CUDA_ABI_VERSION, CU_GET_PROC_ADDRESS_LEGACY_STREAM);
    }
    lookup_result = r;
    return r == CUDA_SUCCESS ? fn : NULL;
}

/* The pthread_once routine: fills drv, load_status and load_error.  It cannot
 * set a per-thread error (it runs on whichever thread came first); callers
 * copy load_error into their own. */
static void load_driver(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { /* driver_absent stays set: no driver is installed */
        const char *why = dlerror();
        if (!why || strstr(why, "No such file"))
            snprintf(load_error, sizeof load_error, "libcuda.so.1 not found (no NVIDIA driver)");
        else
            snprintf(load_error, sizeof load_error, "libcuda.so.1 failed to load: %s", why);
        return;
    }
    /* Never dlclose'd: driver threads and atexit handlers outlive us. */
    driver_absent = 0; /* from here on, a failure is a broken driver, not a missing one */
    store_fn(&get_proc_v2, dlsym(lib, "cuGetProcAddress_v2"), sizeof get_proc_v2);
    if (!get_proc_v2) store_fn(&get_proc_v1, dlsym(lib, "cuGetProcAddress"), sizeof get_proc_v1);
    if (!get_proc_v2 && !get_proc_v1) {
        snprintf(load_error, sizeof load_error,
                 "libcuda.so.1 has no cuGetProcAddress (driver older than CUDA 11.3)");
        return;
    }

    const char *missing = NULL;
#define RESOLVE(name, required, params)                                        \
    store_fn(&drv.name, lookup(#name), sizeof drv.name);                       \
    if (!drv.name && (required) && !missing) missing = #name;
    GM__CUDA_DRIVER_FUNCS(RESOLVE)
#undef RESOLVE
    if (missing) {
        if (lookup_result == CUDA_ERROR_STUB_LIBRARY) {
            driver_absent = 1;
            snprintf(load_error, sizeof load_error,
                     "libcuda.so.1 is the CUDA toolkit's stub library, not an NVIDIA driver");
        } else if (lookup_result != CUDA_SUCCESS)
            snprintf(load_error, sizeof load_error, "cuGetProcAddress(%s) failed: CUresult %d",
                     missing, (int)lookup_result);
        else
            snprintf(load_error, sizeof load_error, "libcuda.so.1 is too old: no %s", missing);
        return;
    }
    have_vmm_calls = drv.cuMemGetAllocationGranularity && drv.cuMemAddressReserve &&
                     drv.cuMemAddressFree && drv.cuMemCreate && drv.cuMemRelease && drv.cuMemMap &&
                     drv.cuMemUnmap && drv.cuMemSetAccess;
    have_fd_calls = drv.cuMemExportToShareableHandle && drv.cuMemImportFromShareableHandle;

    CUresult r = drv.cuInit(0);
    if (r == CUDA_ERROR_STUB_LIBRARY) {
        driver_absent = 1;
        snprintf(load_error, sizeof load_error,
                 "libcuda.so.1 is the CUDA toolkit's stub library, not an NVIDIA driver "
                 "(cuInit: CUDA_ERROR_STUB_LIBRARY)");
        return;
    }
    if (r != CUDA_SUCCESS) {
        const char *name = NULL;
        if (drv.cuGetErrorName(r, &name) != CUDA_SUCCESS || !name) name = "unknown CUresult";
        snprintf(load_error, sizeof load_error, "cuInit failed: %s (%d)", name, (int)r);
        return;
    }
    load_status = GM_OK;
}

/* GM_OK when the driver is loaded and initialised; else GM_NO_DEVICE with the
 * loader's message set for this thread. */
static int load(void)
{
    pthread_once(&load_once, load_driver);
    if (load_status != GM_OK) return gm__set_error(load_status, "cuda: %s", load_error);
    return GM_OK;
}

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */
/* ------------------------------------------------------------------------ */

static int status_of(CUresult r)
{
    switch (r) {
    case CUDA_SUCCESS:
        return GM_OK;
    case CUDA_ERROR_OUT_OF_MEMORY:
        return GM_OUT_OF_MEMORY;
    case CUDA_ERROR_NOT_READY:
        return GM_NOT_READY;
    case CUDA_ERROR_NOT_SUPPORTED:
        return GM_NOT_SUPPORTED;
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_STUB_LIBRARY:
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_DEVICE_NOT_LICENSED:
    case CUDA_ERROR_SYSTEM_NOT_READY:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
        return GM_NO_DEVICE;
    default:
        return GM_BACKEND;
    }
}

/* Set this thread's error for a failed driver call and return its status.
 * fmt describes the call ("cuMemCreate(2097152 bytes)").  Formats into stack
 * buffers only: never allocates. */
static int cu_fail(CUresult r, const char *fmt, ...) GM_PRINTF(2, 3);
static int cu_fail(CUresult r, const char *fmt, ...)
{
    char call[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(call, sizeof call, fmt, ap);
    va_end(ap);

    const char *name = NULL, *text = NULL;
    if (drv.cuGetErrorName(r, &name) != CUDA_SUCCESS) name = NULL;
    if (drv.cuGetErrorString(r, &text) != CUDA_SUCCESS) text = NULL;
    if (!name) return gm__set_error(status_of(r), "%s failed: CUresult %d", call, (int)r);
    return gm__set_error(status_of(r), "%s failed: %s (%s)", call, name,
                         text ? text : "no description");
}

/* ------------------------------------------------------------------------ */
/* The device object                                                        */
/* ------------------------------------------------------------------------ */

/* Written once by cuda_open, read-only afterwards (so shared freely between
 * threads).  primary holds one reference on the device's primary context,
 * dropped by cuda_close. */
typedef struct cuda_ctx {
    int ordinal;
    CUdevice device;
    CUcontext primary;
    int vmm;                               /* device + driver do VMM */
    CUmemAllocationHandleType handle_type; /* what phys_create asks for (bits) */
    CUmemAllocationProp prop;              /* every page's properties */
    int ndevices;                          /* devices visible */
    uint64_t peers;                        /* devices granted access besides this one */
    unsigned phys_flags;                   /* GM__PHYS_* asked at open */
    int compression;                       /* the device can compress */
    size_t granularity;
    size_t granularity_recommended;
    int driver_version;
    int numa_node;                         /* host node nearest the device, -1 unknown */
    char name[128];
    _Atomic unsigned long fail_countdown[GM_CALL_COUNT]; /* fail_nth; 0 = disarmed */
} cuda_ctx_t;

/* Is this call of `kind` the armed one?  Counts the countdown down; true
 * once, when it goes from 1 to 0. */
static int injected(cuda_ctx_t *c, int kind)
{
    _Atomic unsigned long *cd = &c->fail_countdown[kind];
    unsigned long n = atomic_load_explicit(cd, memory_order_relaxed);
    while (n != 0) {
        if (atomic_compare_exchange_weak(cd, &n, n - 1)) {
            if (n != 1) return 0;
            gm__backend_note_injected();
            return 1;
        }
    }
    return 0;
}

/* The properties of every physical allocation: pinned memory on this device,
 * exportable as a POSIX fd when the device can (handle_type), and with the
 * NCCL and compression flags open settled on. */
static CUmemAllocationProp alloc_prop(int ordinal, CUmemAllocationHandleType handle_type)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = handle_type;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal;
    return prop;
}

static int dev_attr(CUdevice dev, CUdevice_attribute a)
{
    int v = 0;
    return drv.cuDeviceGetAttribute(&v, a, dev) == CUDA_SUCCESS ? v : 0;
}

/* gm__backend_resolve_peers's question: may device d reach c's memory? */
static int cuda_reach(void *arg, int d, int *ok)
{
    const cuda_ctx_t *c = arg;
    if (!drv.cuDeviceCanAccessPeer)
        return gm__set_error(GM_NOT_SUPPORTED, "cuda: the driver lacks cuDeviceCanAccessPeer");
    CUdevice peer;
    CUresult r = drv.cuDeviceGet(&peer, d);
    if (r == CUDA_SUCCESS) r = drv.cuDeviceCanAccessPeer(ok, peer, c->device);
    if (r != CUDA_SUCCESS) return cu_fail(r, "cuDeviceCanAccessPeer(%d, %d)", d, c->ordinal);
    return GM_OK;
}

/* Settle the page properties for cfg's GM__PHYS_* flags (c->prop): NCCL's
 * (a fabric handle as well where a trial page of that kind can be made, as
 * ncclMemAlloc tries it; RDMA-capable where the device says so) and
 * compression (refused where the device lacks it or the driver does not
 * grant it to a trial page).  Precondition: the context is current. */
static int open_props(cuda_ctx_t *c, unsigned flags)
{
    c->prop = alloc_prop(c->ordinal, c->handle_type);
    c->phys_flags = flags;
    c->compression = dev_attr(c->device, CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED);
    if (flags & ~(GM__PHYS_NCCL | GM__PHYS_COMPRESSIBLE))
        return gm__set_error(GM_INVALID_ARGUMENT, "cuda: open: unknown page flags %#x", flags);
    if ((flags & GM__PHYS_COMPRESSIBLE) && !c->compression)
        return gm__set_error(GM_NOT_SUPPORTED, "cuda: device %d (%s) cannot compress memory "
                             "(CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED is 0)",
                             c->ordinal, c->name);
    if (flags & GM__PHYS_COMPRESSIBLE) c->prop.allocFlags.compressionType = CU_MEM_ALLOCATION_COMP_GENERIC;
    if (flags & GM__PHYS_NCCL) {
        if (dev_attr(c->device, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED))
            c->prop.allocFlags.gpuDirectRDMACapable = 1;
        if (dev_attr(c->device, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED))
            c->prop.requestedHandleTypes =
                (CUmemAllocationHandleType)(c->prop.requestedHandleTypes | CU_MEM_HANDLE_TYPE_FABRIC);
    }
    if (!(flags & (GM__PHYS_NCCL | GM__PHYS_COMPRESSIBLE))) return GM_OK;
    /* A trial page with these properties (its granularity first). */
    size_t gran = 0;
    CUresult r = drv.cuMemGetAllocationGranularity(&gran, &c->prop,
                                                   CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r != CUDA_SUCCESS) return cu_fail(r, "cuMemGetAllocationGranularity(device %d)", c->ordinal);
    CUmemGenericAllocationHandle h = 0;
    r = drv.cuMemCreate(&h, gran, &c->prop, 0);
    if (r != CUDA_SUCCESS && (c->prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC)) {
        /* No fabric on this system (no IMEX channel, say): what NCCL does. */
        c->prop.requestedHandleTypes =
            (CUmemAllocationHandleType)(c->prop.requestedHandleTypes & ~CU_MEM_HANDLE_TYPE_FABRIC);
        r = drv.cuMemCreate(&h, gran, &c->prop, 0);
    }
    if (r != CUDA_SUCCESS)
        return cu_fail(r, "cuMemCreate(trial page of %zu bytes, device %d%s%s)", gran, c->ordinal,
                       flags & GM__PHYS_NCCL ? ", NCCL handle types" : "",
                       flags & GM__PHYS_COMPRESSIBLE ? ", compressible" : "");
    int granted = 1;
    if ((flags & GM__PHYS_COMPRESSIBLE) && drv.cuMemGetAllocationPropertiesFromHandle) {
        CUmemAllocationProp got;
        memset(&got, 0, sizeof got);
        if (drv.cuMemGetAllocationPropertiesFromHandle(&got, h) == CUDA_SUCCESS)
            granted = got.allocFlags.compressionType == CU_MEM_ALLOCATION_COMP_GENERIC;
    }
    (void)drv.cuMemRelease(h);
    if (!granted)
        return gm__set_error(GM_NOT_SUPPORTED, "cuda: device %d (%s): the driver made a trial "
                             "page uncompressed although compression was asked for",
                             c->ordinal, c->name);
    c->handle_type = c->prop.requestedHandleTypes;
    return GM_OK;
}

/* Make c's primary context current on this thread for one backend call;
 * *prev receives what was current, for ctx_leave.  Cheap (a thread-local
 * read) when it already is. */
static int ctx_enter(const cuda_ctx_t *c, CUcontext *prev)
{
    CUresult r = drv.cuCtxGetCurrent(prev);
    if (r != CUDA_SUCCESS) return cu_fail(r, "cuCtxGetCurrent");
    if (*prev == c->primary) return GM_OK;
    r = drv.cuCtxSetCurrent(c->primary);
    if (r != CUDA_SUCCESS) return cu_fail(r, "cuCtxSetCurrent(device %d)", c->ordinal);
    return GM_OK;
}

static int cuda_adopt_thread(void *ctx)
{
    const cuda_ctx_t *c = ctx;
    CUcontext cur = NULL;
    CUresult r = drv.cuCtxGetCurrent(&cur);
    if (r != CUDA_SUCCESS) return cu_fail(r, "cuCtxGetCurrent");
    if (cur) return GM_OK;
    r = drv.cuCtxSetCurrent(c->primary);
    if (r != CUDA_SUCCESS) return cu_fail(r, "cuCtxSetCurrent(device %d)", c->ordinal);
    return GM_OK;
}

/* Give the thread back the context it had before ctx_enter.  A failure here
 * cannot be reported better than the call's own result, so it is ignored. */
static void ctx_leave(const cuda_ctx_t *c, CUcontext prev)
{
    if (prev != c->primary) (void)drv.cuCtxSetCurrent(prev);
}

/* Run one driver call `expr`, the call of kind GM_CALL_<kind>, with the
 * context current; on failure, report it described by the printf-style rest.
 * An armed fault (fail_nth) answers CUDA_ERROR_UNKNOWN instead of calling
 * the driver.  Used by every member below that issues exactly one driver
 * call. */
#define CU_CALL(c, kind, expr, ...)                                            \
    do {                                                                       \
        if (injected((c), GM_CALL_##kind))                                     \
            return cu_fail(CUDA_ERROR_UNKNOWN, "injected failure of " #kind    \
                           " (fail_nth), instead of " __VA_ARGS__);            \
        CU_CALL_UNCOUNTED(c, expr, __VA_ARGS__);                               \
    } while (0)
/* The same for a driver call that is no call kind (info): never injected. */
#define CU_CALL_UNCOUNTED(c, expr, ...)                                        \
    do {                                                                       \
        CUcontext prev_;                                                       \
        GM_CHECK(ctx_enter((c), &prev_));                                      \
        CUresult r_ = (expr);                                                  \
        ctx_leave((c), prev_);                                                 \
        if (r_ != CUDA_SUCCESS) return cu_fail(r_, __VA_ARGS__);               \
    } while (0)

/* Preconditions of the VMM members: a device that does VMM, and sizes that
 * are non-zero multiples of the granularity. */
static int check_vmm(const cuda_ctx_t *c, const char *what)
{
    if (!c->vmm)
        return gm__set_error(GM_NOT_SUPPORTED, "cuda: %s: device %d has no virtual memory management",
                             what, c->ordinal);
    return GM_OK;
}

static int check_pages(const cuda_ctx_t *c, const char *what, uintptr_t va, size_t size)
{
    if (size == 0 || size % c->granularity != 0 || va % c->granularity != 0)
        return gm__set_error(GM_INVALID_ARGUMENT,
                             "cuda: %s(%#lx, %zu bytes): address and size must be non-zero "
                             "multiples of the granularity %zu",
                             what, (unsigned long)va, size, c->granularity);
    return GM_OK;
}

/* ------------------------------------------------------------------------ */
/* Probe, open, close, info                                                 */
/* ------------------------------------------------------------------------ */

/* Checks that device `ordinal` exists; sets the error (GM_NO_DEVICE) if not.
 * Precondition: load() succeeded. */
static int check_ordinal(int ordinal)
{
    int count = 0;
    CUresult r = drv.cuDeviceGetCount(&count);
    if (r != CUDA_SUCCESS) return cu_fail(r, "cuDeviceGetCount");
    if (count == 0) return gm__set_error(GM_NO_DEVICE, "cuda: no CUDA device is visible");
    if (ordinal < 0 || ordinal >= count)
        return gm__set_error(GM_NO_DEVICE, "cuda: device %d does not exist (%d device%s visible)",
                             ordinal, count, count == 1 ? " is" : "s are");
    return GM_OK;
}

/* Preconditions: none; any thread, any number of times.  GM_OK when an NVIDIA
 * driver is installed: libcuda.so.1 loads and is not the toolkit's stub (the
 * driver may still be broken or see no device: probe says that).
 * GM_NO_DEVICE, with why saying what was probed, when there is none at all:
 * the only case in which AUTO may use the sim instead. */
static int cuda_installed(char *why, size_t why_cap)
{
    pthread_once(&load_once, load_driver);
    if (!driver_absent) {
        if (why && why_cap) snprintf(why, why_cap, "libcuda.so.1 loaded");
        return GM_OK;
    }
    if (why && why_cap) snprintf(why, why_cap, "%s", load_error);
    return GM_NO_DEVICE;
}

/* Preconditions: none; may be called any number of times from any thread.
 * Loads the driver on first use (process state, kept), but keeps no device
 * state.  On GM_OK, why says which device was found. */
static int cuda_probe(int ordinal, char *why, size_t why_cap)
{
    int rc = load();
    if (rc == GM_OK) rc = check_ordinal(ordinal);
    if (rc != GM_OK) {
        /* The message without our "cuda: " prefix: the caller names us. */
        char msg[256];
        const char *text = gm_last_error();
        if (strncmp(text, "cuda: ", 6) == 0) text += 6;
        snprintf(msg, sizeof msg, "%s", text);
        if (why && why_cap) snprintf(why, why_cap, "%s", msg);
        return rc == GM_NO_DEVICE ? rc : gm__set_error(GM_NO_DEVICE, "cuda: %s", msg);
    }
    if (why && why_cap) {
        CUdevice dev;
        char name[128] = "?";
        int version = 0;
        if (drv.cuDeviceGet(&dev, ordinal) == CUDA_SUCCESS)
            (void)drv.cuDeviceGetName(name, (int)sizeof name, dev);
        (void)drv.cuDriverGetVersion(&version);
        snprintf(why, why_cap, "cuda device %d: %s, driver %d.%d", ordinal, name, version / 1000,
                 version % 1000 / 10);
    }
    return GM_OK;
}

/* The host NUMA node the device hangs off, from its PCI bus id and sysfs
 * (/sys/bus/pci/devices/<id>/numa_node); -1 when unknown (one node, or no
 * cuDeviceGetPCIBusId). */
static int device_numa_node(CUdevice dev)
{
    char bus[64], path[160], buf[16];
    if (!drv.cuDeviceGetPCIBusId || drv.cuDeviceGetPCIBusId(bus, (int)sizeof bus, dev) != CUDA_SUCCESS)
        return -1;
    for (char *p = bus; *p; p++)
        if (*p >= 'A' && *p <= 'F') *p = (char)(*p - 'A' + 'a');
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/numa_node", bus);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int node = -1;
    if (fgets(buf, sizeof buf, f)) node = atoi(buf);
    fclose(f);
    return node >= 0 ? node : -1;
}

/* Preconditions: cfg->device is an ordinal probe accepted.  Retains the
 * primary context (activating it if no one had); *ctx is valid until
 * cuda_close. */
static int cuda_open(const gm__backend_config_t *cfg, void **ctx)
{
    int rc;
    CUresult r;
    *ctx = NULL;
    GM_CHECK(load());
    GM_CHECK(check_ordinal(cfg->device));
    int ndevices = 0;
    if ((r = drv.cuDeviceGetCount(&ndevices)) != CUDA_SUCCESS) return cu_fail(r, "cuDeviceGetCount");

    cuda_ctx_t *c = gm__calloc(1, sizeof *c);
    if (!c) return gm__set_error(GM_NO_HOST_MEMORY, "cuda: no memory for a device object");
    c->ordinal = cfg->device;
    c->ndevices = ndevices;
    unsigned long armed[GM_CALL_COUNT];
    gm__backend_take_open_faults(armed);
    for (int k = 0; k < GM_CALL_COUNT; k++) atomic_init(&c->fail_countdown[k], armed[k]);

    r = drv.cuDeviceGet(&c->device, c->ordinal);
    if (r != CUDA_SUCCESS) {
        rc = cu_fail(r, "cuDeviceGet(%d)", c->ordinal);
        goto fail_free;
    }
    r = drv.cuDeviceGetName(c->name, (int)sizeof c->name, c->device);
    if (r != CUDA_SUCCESS) {
        rc = cu_fail(r, "cuDeviceGetName(%d)", c->ordinal);
        goto fail_free;
    }
    r = drv.cuDriverGetVersion(&c->driver_version);
    if (r != CUDA_SUCCESS) {
        rc = cu_fail(r, "cuDriverGetVersion");
        goto fail_free;
    }

    int vmm = 0, fd = 0;
    if (have_vmm_calls) {
        r = drv.cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                     c->device);
        if (r != CUDA_SUCCESS) vmm = 0; /* an old driver that lacks the attribute */
    }
    if (vmm && have_fd_calls) {
        r = drv.cuDeviceGetAttribute(
            &fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, c->device);
        if (r != CUDA_SUCCESS) fd = 0;
    }
    c->vmm = vmm != 0;
    c->numa_node = device_numa_node(c->device);
    c->handle_type = fd ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;

    r = drv.cuDevicePrimaryCtxRetain(&c->primary, c->device);
    if (r != CUDA_SUCCESS) {
        rc = cu_fail(r, "cuDevicePrimaryCtxRetain(device %d)", c->ordinal);
        goto fail_free;
    }

    GM_CHECK_GOTO(gm__backend_resolve_peers("cuda", c->ordinal, c->ndevices, cfg->peers, cuda_reach,
                                            c, "cuDeviceCanAccessPeer: no", &c->peers),
                  rc, fail_release);
    c->prop = alloc_prop(c->ordinal, c->handle_type);
    c->granularity = NO_VMM_GRANULARITY;
    if (c->vmm) {
        CUcontext prev;
        GM_CHECK_GOTO(ctx_enter(c, &prev), rc, fail_release);
        rc = open_props(c, cfg->phys_flags);
        r = CUDA_SUCCESS;
        if (rc == GM_OK)
            r = drv.cuMemGetAllocationGranularity(&c->granularity, &c->prop,
                                                  CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        if (rc == GM_OK && r == CUDA_SUCCESS &&
            (drv.cuMemGetAllocationGranularity(&c->granularity_recommended, &c->prop,
                                               CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS ||
             c->granularity_recommended % c->granularity != 0))
            c->granularity_recommended = c->granularity;
        ctx_leave(c, prev);
        if (rc != GM_OK) goto fail_release;
        if (r != CUDA_SUCCESS) {
            rc = cu_fail(r, "cuMemGetAllocationGranularity(device %d)", c->ordinal);
            goto fail_release;
        }
        if (c->granularity == 0 || (c->granularity & (c->granularity - 1)) != 0) {
            rc = gm__set_error(GM_BACKEND, "cuda: granularity %zu of device %d is not a power of two",
                               c->granularity, c->ordinal);
            goto fail_release;
        }
    }
    *ctx = c;
    return GM_OK;

fail_release:
    (void)drv.cuDevicePrimaryCtxRelease(c->device);
fail_free:
    gm__free(c);
    return rc;
}

/* Precondition: everything created through ctx was released.  Drops our
 * reference on the primary context; the context lives on while the runtime
 * or another pool still holds it. */
static void cuda_close(void *ctx)
{
    cuda_ctx_t *c = ctx;
    if (!c) return;
    (void)drv.cuDevicePrimaryCtxRelease(c->device);
    gm__free(c);
}

/* Preconditions: none beyond an open ctx.  free_memory is the driver's
 * current figure for the whole device (other processes included). */
static int cuda_info(void *ctx, gm__backend_info_t *out)
{
    cuda_ctx_t *c = ctx;
    size_t free_bytes = 0, total_bytes = 0;
    CU_CALL_UNCOUNTED(c, drv.cuMemGetInfo(&free_bytes, &total_bytes), "cuMemGetInfo(device %d)",
                      c->ordinal);
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", c->name);
    out->driver_version = c->driver_version;
    out->total_memory = total_bytes;
    out->free_memory = free_bytes;
    out->granularity = c->granularity;
    out->granularity_recommended = c->granularity_recommended ? c->granularity_recommended
                                                              : c->granularity;
    out->vmm_supported = c->vmm;
    out->numa_node = c->numa_node;
    out->device_count = c->ndevices;
    out->peers = c->peers;
    out->phys_flags = c->phys_flags;
    out->handle_types = (unsigned)c->handle_type;
    out->compression_supported = c->compression;
    out->rdma_capable = c->prop.allocFlags.gpuDirectRDMACapable;
    return GM_OK;
}

/* ------------------------------------------------------------------------ */
/* Virtual address space and physical pages                                 */
/* ------------------------------------------------------------------------ */

/* Preconditions: size a non-zero multiple of the granularity; align 0 (means
 * the granularity) or a multiple of it. */
static int cuda_va_reserve(void *ctx, size_t size, size_t align, uintptr_t *va)
{
    cuda_ctx_t *c = ctx;
    GM_CHECK(check_vmm(c, "va_reserve"));
    GM_CHECK(check_pages(c, "va_reserve", 0, size));
    if (align % c->granularity != 0)
        return gm__set_error(GM_INVALID_ARGUMENT, "cuda: va_reserve: alignment %zu is not a multiple of %zu",
                             align, c->granularity);
    CUdeviceptr p = 0;
    CU_CALL(c, va_reserve, drv.cuMemAddressReserve(&p, size, align, 0, 0),
            "cuMemAddressReserve(%zu bytes, align %zu)", size, align);
    *va = (uintptr_t)p;
    return GM_OK;
}

/* Precondition: [va, va+size) is exactly one reservation and nothing is
 * mapped in it. */
static int cuda_va_free(void *ctx, uintptr_t va, size_t size)
{
    cuda_ctx_t *c = ctx;
    GM_CHECK(check_vmm(c, "va_free"));
    CU_CALL(c, va_free, drv.cuMemAddressFree((CUdeviceptr)va, size),
            "cuMemAddressFree(%#lx, %zu bytes)", (unsigned long)va, size);
    return GM_OK;
}

/* Precondition: size a non-zero multiple of the granularity.  The handle is
 * exportable as a POSIX fd when the device supports that. */
static int cuda_phys_create(void *ctx, size_t size, gm__phys_t *h)
{
    cuda_ctx_t *c = ctx;
    GM_CHECK(check_vmm(c, "phys_create"));
    GM_CHECK(check_pages(c, "phys_create", 0, size));
    CUmemGenericAllocationHandle handle = 0;
    CU_CALL(c, phys_create, drv.cuMemCreate(&handle, size, &c->prop, 0),
            "cuMemCreate(%zu bytes, device %d)", size, c->ordinal);
    *h = (gm__phys_t)handle;
    return GM_OK;
}

/* Precondition: h is not mapped anywhere (the driver would keep its memory
 * alive until the last unmap, hiding a leak). */
static int cuda_phys_release(void *ctx, gm__phys_t h)
{
    cuda_ctx_t *c = ctx;
    GM_CHECK(check_vmm(c, "phys_release"));
    CU_CALL(c, phys_release, drv.cuMemRelease((CUmemGenericAllocationHandle)h),
            "cuMemRelease(handle %#llx)", (unsigned long long)h);
    return GM_OK;
}

/* Preconditions: [va, va+size) lies in one reservation, is unmapped, and
 * size is h's whole size (CUDA maps from offset 0). */
static int cuda_map(void *ctx, uintptr_t va, size_t size, gm__phys_t h)
{
    cuda_ctx_t *c = ctx;
    GM_CHECK(check_vmm(c, "map"));
    GM_CHECK(check_pages(c, "map", va, size));
    CU_CALL(c, map, drv.cuMemMap((CUdeviceptr)va, size, 0, (CUmemGenericAllocationHandle)h, 0),
            "cuMemMap(%#lx, %zu bytes, handle %#llx)", (unsigned long)va, size,
            (unsigned long long)h);
    return GM_OK;
}

/* Preconditions: [va, va+size) is exactly what one map call mapped (the
 * driver rejects a sub-range), and no queued device work still touches it. */
static int cuda_unmap(void *ctx, uintptr_t va, size_t size)
{
    cuda_ctx_t *c = ctx;
    GM_CHECK(check_vmm(c, "unmap"));
    GM_CHECK(check_pages(c, "unmap", va, size));
    CU_CALL(c, unmap, drv.cuMemUnmap((CUdeviceptr)va, size), "cuMemUnmap(%#lx, %zu bytes)",
            (unsigned long)va, size);
    return GM_OK;
}

/* Precondition: every page of [va, va+size) is mapped; the range may span
 * several handles (one call for all of them is much cheaper). */
static int cuda_set_access(void *ctx, uintptr_t va, size_t size, unsigned flags)
{
    cuda_ctx_t *c = ctx;
    GM_CHECK(check_vmm(c, "set_access"));
    GM_CHECK(check_pages(c, "set_access", va, size));
    CUmemAccessDesc desc[64];
    size_t n = 0;
    bool ro = flags & GM__ACCESS_READ_ONLY;
    for (int d = -1; d < 64; d++) { /* the device itself first, then its peers */
        if (d >= 0 && !(c->peers & ((uint64_t)1 << d))) continue;
        memset(&desc[n], 0, sizeof desc[n]);
        desc[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        desc[n].location.id = d < 0 ? c->ordinal : d;
        desc[n].flags = ro ? CU_MEM_ACCESS_FLAGS_PROT_READ : CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        n++;
    }
    CU_CALL(c, set_access, drv.cuMemSetAccess((CUdeviceptr)va, size, desc, n),
            "cuMemSetAccess(%#lx, %zu bytes, device %d and %zu peer%s %s)", (unsigned long)va,
            size, c->ordinal, n - 1, n == 2 ? "" : "s", ro ? "read-only" : "read-write");
    return GM_OK;
}

/* ------------------------------------------------------------------------ */
/* Sharing between processes                                                */
/* ------------------------------------------------------------------------ */

/* Used by sharing (not yet by the core): see backend.h. */

static int check_fd_sharing(const cuda_ctx_t *c, const char *what)
{
    GM_CHECK(check_vmm(c, what));
    if (!(c->handle_type & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        return gm__set_error(GM_NOT_SUPPORTED,
                             "cuda: %s: device %d cannot share memory as POSIX file descriptors",
                             what, c->ordinal);
    return GM_OK;
}

/* Precondition: h came from phys_create on this ctx.  *fd is a new file
 * descriptor owned by the caller (close it when sent). */
static int cuda_export_fd(void *ctx, gm__phys_t h, int *fd)
{
    cuda_ctx_t *c = ctx;
    GM_CHECK(check_fd_sharing(c, "export_fd"));
    int out = -1;
    CU_CALL(c, export_fd,
            drv.cuMemExportToShareableHandle(&out, (CUmemGenericAllocationHandle)h,
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
            "cuMemExportToShareableHandle(handle %#llx, POSIX fd)", (unsigned long long)h);
    *fd = out;
    return GM_OK;
}

/* Precondition: fd came from export_fd (here or in another process).  The
 * fd stays the caller's; size is not needed by CUDA (the handle knows it). */
static int cuda_import_fd(void *ctx, int fd, size_t size, gm__phys_t *h)
{
    cuda_ctx_t *c = ctx;
    (void)size;
    GM_CHECK(check_fd_sharing(c, "import_fd"));
    if (fd < 0) return gm__set_error(GM_INVALID_ARGUMENT, "cuda: import_fd: bad descriptor %d", fd);
    CUmemGenericAllocationHandle handle = 0;
    CU_CALL(c, import_fd,
            drv.cuMemImportFromShareableHandle(&handle, (void *)(intptr_t)fd,
                                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            "cuMemImportFromShareableHandle(fd %d)", fd);
    *h = (gm__phys_t)handle;
    return GM_OK;
}

/* ------------------------------------------------------------------------ */
/* Events and streams                                                       */
/* ------------------------------------------------------------------------ */

static CUevent event_of(gm__event_t ev)
{
    return (CUevent)(uintptr_t)ev;
}

/* Preconditions: none.  Timing is off: these events only order work. */
static int cuda_event_create(void *ctx, gm__event_t *ev)
{
    cuda_ctx_t *c = ctx;
    CUevent e = NULL;
    CU_CALL(c, event_create, drv.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    *ev = (gm__event_t)(uintptr_t)e;
    return GM_OK;
}

/* Precondition: ev came from event_create.  Pending work it was recorded
 * after is not waited for (the driver frees the event when it completes). */
static int cuda_event_destroy(void *ctx, gm__event_t ev)
{
    cuda_ctx_t *c = ctx;
    CU_CALL(c, event_destroy, drv.cuEventDestroy(event_of(ev)), "cuEventDestroy");
    return GM_OK;
}

/* Preconditions: ev from event_create; stream NULL (the legacy default
 * stream) or a CUstream/cudaStream_t of this device's primary context. */
static int cuda_event_record(void *ctx, gm__event_t ev, gm_stream_t stream)
{
    cuda_ctx_t *c = ctx;
    CU_CALL(c, event_record, drv.cuEventRecord(event_of(ev), (CUstream)stream),
            "cuEventRecord(stream %p)", stream);
    return GM_OK;
}

/* Precondition: ev from event_create.  GM_NOT_READY is an answer, not a
 * failure: it leaves the thread's error message alone. */
static int cuda_event_query(void *ctx, gm__event_t ev)
{
    cuda_ctx_t *c = ctx;
    if (injected(c, GM_CALL_event_query))
        return cu_fail(CUDA_ERROR_UNKNOWN, "injected failure of event_query (fail_nth), "
                       "instead of cuEventQuery");
    CUcontext prev;
    GM_CHECK(ctx_enter(c, &prev));
    CUresult r = drv.cuEventQuery(event_of(ev));
    ctx_leave(c, prev);
    if (r == CUDA_SUCCESS) return GM_OK;
    if (r == CUDA_ERROR_NOT_READY) return GM_NOT_READY;
    return cu_fail(r, "cuEventQuery");
}

/* Precondition: ev from event_create.  Blocks until the work recorded before
 * it is done. */
static int cuda_event_sync(void *ctx, gm__event_t ev)
{
    cuda_ctx_t *c = ctx;
    CU_CALL(c, event_sync, drv.cuEventSynchronize(event_of(ev)), "cuEventSynchronize");
    return GM_OK;
}

/* Precondition: stream as for event_record. */
static int cuda_stream_sync(void *ctx, gm_stream_t stream)
{
    cuda_ctx_t *c = ctx;
    CU_CALL(c, stream_sync, drv.cuStreamSynchronize((CUstream)stream),
            "cuStreamSynchronize(stream %p)", stream);
    return GM_OK;
}

/* Non-blocking: the stream does not wait for the legacy default stream. */
static int cuda_stream_create(void *ctx, gm_stream_t *stream)
{
    cuda_ctx_t *c = ctx;
    CUstream s = NULL;
    CU_CALL(c, stream_create, drv.cuStreamCreate(&s, 0x1 /* CU_STREAM_NON_BLOCKING */),
            "cuStreamCreate");
    *stream = (gm_stream_t)s;
    return GM_OK;
}

/* Precondition: stream came from stream_create. */
static int cuda_stream_destroy(void *ctx, gm_stream_t stream)
{
    cuda_ctx_t *c = ctx;
    CU_CALL(c, stream_destroy, drv.cuStreamDestroy((CUstream)stream), "cuStreamDestroy(%p)",
            stream);
    return GM_OK;
}

/* ------------------------------------------------------------------------ */
/* Copies and fills                                                         */
/* ------------------------------------------------------------------------ */

/* Preconditions: both ranges are valid device memory or host memory
 * (unified addressing tells them apart); stream as for event_record.  Queued
 * on the stream: the caller syncs before reading a host destination. */
static int cuda_memcpy(void *ctx, uintptr_t dst, uintptr_t src, size_t n, gm_stream_t stream)
{
    cuda_ctx_t *c = ctx;
    if (n == 0) return GM_OK;
    CU_CALL(c, memcpy, drv.cuMemcpyAsync((CUdeviceptr)dst, (CUdeviceptr)src, n, (CUstream)stream),
            "cuMemcpyAsync(%#lx <- %#lx, %zu bytes, stream %p)", (unsigned long)dst,
            (unsigned long)src, n, stream);
    return GM_OK;
}

/* Preconditions: [dst, dst+n) is device memory (mapped and accessible);
 * stream as for event_record.  Only the low byte of value is used. */
static int cuda_memset(void *ctx, uintptr_t dst, int value, size_t n, gm_stream_t stream)
{
    cuda_ctx_t *c = ctx;
    if (n == 0) return GM_OK;
    CU_CALL(c, memset,
            drv.cuMemsetD8Async((CUdeviceptr)dst, (unsigned char)value, n, (CUstream)stream),
            "cuMemsetD8Async(%#lx, %#x, %zu bytes, stream %p)", (unsigned long)dst,
            (unsigned)(unsigned char)value, n, stream);
    return GM_OK;
}

/* ------------------------------------------------------------------------ */
/* Host memory                                                              */
/* ------------------------------------------------------------------------ */

static int check_host_calls(const char *what)
{
    if (!drv.cuMemHostRegister || !drv.cuMemHostUnregister || !drv.cuMemHostGetDevicePointer)
        return gm__set_error(GM_NOT_SUPPORTED, "cuda: %s: the driver lacks cuMemHostRegister", what);
    return GM_OK;
}

/* Preconditions: [p, p+size) mapped host memory, page aligned, not registered.
 * Always PORTABLE (every context may use it); DEVICEMAP on request. */
static int cuda_host_register(void *ctx, void *p, size_t size, unsigned flags)
{
    cuda_ctx_t *c = ctx;
    GM_CHECK(check_host_calls("host_register"));
    unsigned f = CU_MEMHOSTREGISTER_PORTABLE;
    if (flags & GM__HOST_DEVICEMAP) f |= CU_MEMHOSTREGISTER_DEVICEMAP;
    CU_CALL(c, host_register, drv.cuMemHostRegister(p, size, f),
            "cuMemHostRegister(%p, %zu bytes, %#x)", p, size, f);
    return GM_OK;
}

/* Precondition: p starts a range registered by host_register; no queued
 * work touches it. */
static int cuda_host_unregister(void *ctx, void *p)
{
    cuda_ctx_t *c = ctx;
    GM_CHECK(check_host_calls("host_unregister"));
    CU_CALL(c, host_unregister, drv.cuMemHostUnregister(p), "cuMemHostUnregister(%p)", p);
    return GM_OK;
}

/* Precondition: p inside a range registered with DEVICEMAP. */
static int cuda_host_device_pointer(void *ctx, void *p, uintptr_t *dptr)
{
    cuda_ctx_t *c = ctx;
    CUdeviceptr d = 0;
    GM_CHECK(check_host_calls("host_device_pointer"));
    CU_CALL(c, host_device_pointer, drv.cuMemHostGetDevicePointer(&d, p, 0),
            "cuMemHostGetDevicePointer(%p)", p);
    *dptr = (uintptr_t)d;
    return GM_OK;
}

/* ------------------------------------------------------------------------ */
/* Fault injection                                                          */
/* ------------------------------------------------------------------------ */

/* The n-th next driver call of `kind` on ctx (1 = the very next) fails with
 * CUDA_ERROR_UNKNOWN (GM_BACKEND) without reaching the driver; n = 0
 * disarms.  Kinds are independent.  Not a call kind itself. */
static int cuda_fail_nth(void *ctx, int kind, unsigned long n)
{
    cuda_ctx_t *c = ctx;
    if (c == NULL) return gm__set_error(GM_INVALID_ARGUMENT, "cuda: fail_nth: NULL context");
    if (kind < 0 || kind >= GM_CALL_COUNT)
        return gm__set_error(GM_INVALID_ARGUMENT, "cuda: fail_nth: unknown call kind %d", kind);
    atomic_store(&c->fail_countdown[kind], n);
    return GM_OK;
}

/* Preconditions: ev from event_create and recorded; stream as for
 * event_record. */
static int cuda_stream_wait_event(void *ctx, gm_stream_t stream, gm__event_t ev)
{
    cuda_ctx_t *c = ctx;
    if (!drv.cuStreamWaitEvent)
        return gm__set_error(GM_NOT_SUPPORTED, "cuda: the driver lacks cuStreamWaitEvent");
    CU_CALL(c, stream_wait_event, drv.cuStreamWaitEvent((CUstream)stream, event_of(ev), 0),
            "cuStreamWaitEvent(stream %p)", stream);
    return GM_OK;
}

/* ------------------------------------------------------------------------ */
/* Managed memory                                                           */
/* ------------------------------------------------------------------------ */

static int cuda_managed_alloc(void *ctx, size_t size, uintptr_t *ptr)
{
    cuda_ctx_t *c = ctx;
    if (!drv.cuMemAllocManaged || !drv.cuMemFree)
        return gm__set_error(GM_NOT_SUPPORTED, "cuda: the driver lacks cuMemAllocManaged");
    CUdeviceptr d = 0;
    CU_CALL(c, mem_alloc, drv.cuMemAllocManaged(&d, size, CU_MEM_ATTACH_GLOBAL),
            "cuMemAllocManaged(%zu bytes)", size);
    *ptr = (uintptr_t)d;
    return GM_OK;
}

static int cuda_managed_free(void *ctx, uintptr_t ptr)
{
    cuda_ctx_t *c = ctx;
    if (!drv.cuMemFree) return gm__set_error(GM_NOT_SUPPORTED, "cuda: the driver lacks cuMemFree");
    CU_CALL(c, mem_free, drv.cuMemFree((CUdeviceptr)ptr), "cuMemFree(%#lx)", (unsigned long)ptr);
    return GM_OK;
}

static int cuda_prefetch(void *ctx, uintptr_t ptr, size_t size, int to_host, gm_stream_t stream)
{
    cuda_ctx_t *c = ctx;
    if (!drv.cuMemPrefetchAsync)
        return gm__set_error(GM_NOT_SUPPORTED, "cuda: the driver lacks cuMemPrefetchAsync");
    CUdevice dst = to_host ? CU_DEVICE_CPU : c->device;
    CU_CALL(c, prefetch, drv.cuMemPrefetchAsync((CUdeviceptr)ptr, size, dst, (CUstream)stream),
            "cuMemPrefetchAsync(%#lx, %zu bytes, to %s, stream %p)", (unsigned long)ptr, size,
            to_host ? "host" : "device", stream);
    return GM_OK;
}

static int cuda_advise(void *ctx, uintptr_t ptr, size_t size, int advice)
{
    cuda_ctx_t *c = ctx;
    if (!drv.cuMemAdvise) return gm__set_error(GM_NOT_SUPPORTED, "cuda: the driver lacks cuMemAdvise");
    int a = advice == 1 ? CU_MEM_ADVISE_SET_PREFERRED_LOCATION : CU_MEM_ADVISE_SET_ACCESSED_BY;
    CU_CALL(c, advise, drv.cuMemAdvise((CUdeviceptr)ptr, size, a, c->device),
            "cuMemAdvise(%#lx, %zu bytes, advice %d)", (unsigned long)ptr, size, a);
    return GM_OK;
}

const gm__backend_ops_t gm__backend_cuda = {
    .name = "cuda",
    .probe = cuda_probe,
    .installed = cuda_installed,
    .open = cuda_open,
    .close = cuda_close,
    .info = cuda_info,
    .va_reserve = cuda_va_reserve,
    .va_free = cuda_va_free,
    .phys_create = cuda_phys_create,
    .phys_release = cuda_phys_release,
    .map = cuda_map,
    .unmap = cuda_unmap,
    .set_access = cuda_set_access,
    .export_fd = cuda_export_fd,
    .import_fd = cuda_import_fd,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_sync = cuda_event_sync,
    .stream_sync = cuda_stream_sync,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .memcpy = cuda_memcpy,
    .memset = cuda_memset,
    .host_register = cuda_host_register,
    .host_unregister = cuda_host_unregister,
    .host_device_pointer = cuda_host_device_pointer,
    .stream_wait_event = cuda_stream_wait_event,
    .mem_alloc = cuda_managed_alloc,
    .mem_free = cuda_managed_free,
    .prefetch = cuda_prefetch,
    .advise = cuda_advise,
    .modeled_ns = NULL, /* sim only */
    .fail_nth = cuda_fail_nth,
    .hold_stream = NULL, /* sim only */
    .adopt_thread = cuda_adopt_thread,
};
