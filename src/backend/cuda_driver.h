/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuda_driver.h — our own declarations of the small part of the CUDA driver
 * API that the cuda backend uses: handle types, the enum values we name, the
 * struct layouts the VMM calls read, and one function-pointer type per entry
 * point.  The idea: libcuda.so.1 is loaded at run time (dlopen +
 * cuGetProcAddress), so the project builds with no CUDA toolkit at all; the
 * names follow the driver's own so cuda.c reads like driver code.
 *
 * Values and layouts were checked against the CUDA 13.0 toolkit header while
 * writing this; the static assertions at the end pin the layouts that cross
 * the ABI.  Two files include it: src/backend/cuda.c, and preload/preload.c,
 * which takes the types, status codes and cuGetProcAddress flags (CUresult,
 * CUdeviceptr, CUstream, CU_GET_PROC_ADDRESS_* ...) for the driver entry
 * points it interposes, never the function table.  Add a declaration here
 * only when one of them starts using it.
 */
#ifndef GM_CUDA_DRIVER_H
#define GM_CUDA_DRIVER_H

#include <stddef.h>
#include <stdint.h>

/* The driver ABI version we ask cuGetProcAddress for: entry points keep the
 * signatures they had in CUDA 12.0 even on newer drivers. */
#define GM_CUDA_ABI_VERSION 12000

/* ---- scalar and opaque handle types ------------------------------------- */

typedef uint64_t cuuint64_t;
typedef int CUdevice;                           /* device ordinal handle */
typedef unsigned long long CUdeviceptr;         /* a device virtual address */
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;           /* same object as cudaStream_t */
typedef struct CUevent_st *CUevent;

/* ---- status codes (only those the backend names) ------------------------ */

typedef enum CUresult_enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_STUB_LIBRARY = 34,
    CUDA_ERROR_DEVICE_UNAVAILABLE = 46,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_DEVICE_NOT_LICENSED = 102,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_SYSTEM_NOT_READY = 802,
    CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803,
    CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE = 804,
    CUDA_ERROR_UNKNOWN = 999,
    CUDA_RESULT_FORCE_INT_ = 0x7fffffff
} CUresult;

/* ---- enums ------------------------------------------------------------- */

/* Managed memory (CUDA 12.0 ABI of cuMemPrefetchAsync / cuMemAdvise):
 * cuMemAllocManaged's flag, the CPU as a "device", the advice we give. */
#define CU_MEM_ATTACH_GLOBAL 0x1
#define CU_DEVICE_CPU (-1)
#define CU_MEM_ADVISE_SET_PREFERRED_LOCATION 3
#define CU_MEM_ADVISE_SET_ACCESSED_BY 5

/* cuMemHostRegister flags */
#define CU_MEMHOSTREGISTER_PORTABLE 0x01
#define CU_MEMHOSTREGISTER_DEVICEMAP 0x02

typedef enum CUdevice_attribute_enum {
    CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
    CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103,
    CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED = 107,
    CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED = 110,
    CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED = 128,
    CU_DEVICE_ATTRIBUTE_FORCE_INT_ = 0x7fffffff
} CUdevice_attribute;

/* Flags of cuEventCreate. */
typedef enum CUevent_flags_enum {
    CU_EVENT_DEFAULT = 0x0,
    CU_EVENT_DISABLE_TIMING = 0x2
} CUevent_flags;

/* Search flags of cuGetProcAddress: LEGACY_STREAM resolves the entry points
 * whose stream 0 is the legacy default stream (what cudaStream_t 0 means in
 * a program built the default way). */
typedef enum CUdriverProcAddress_flags_enum {
    CU_GET_PROC_ADDRESS_DEFAULT = 0,
    CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1 << 0,
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 1 << 1
} CUdriverProcAddress_flags;

typedef enum CUdriverProcAddressQueryResult_enum {
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2
} CUdriverProcAddressQueryResult;

typedef enum CUmemAllocationHandleType_enum {
    CU_MEM_HANDLE_TYPE_NONE = 0x0,
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1,
    CU_MEM_HANDLE_TYPE_FABRIC = 0x8,
    CU_MEM_HANDLE_TYPE_MAX = 0x7fffffff
} CUmemAllocationHandleType;

typedef enum CUmemAccess_flags_enum {
    CU_MEM_ACCESS_FLAGS_PROT_NONE = 0x0,
    CU_MEM_ACCESS_FLAGS_PROT_READ = 0x1,
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3,
    CU_MEM_ACCESS_FLAGS_PROT_MAX = 0x7fffffff
} CUmemAccess_flags;

typedef enum CUmemLocationType_enum {
    CU_MEM_LOCATION_TYPE_INVALID = 0x0,
    CU_MEM_LOCATION_TYPE_DEVICE = 0x1,
    CU_MEM_LOCATION_TYPE_MAX = 0x7fffffff
} CUmemLocationType;

typedef enum CUmemAllocationType_enum {
    CU_MEM_ALLOCATION_TYPE_INVALID = 0x0,
    CU_MEM_ALLOCATION_TYPE_PINNED = 0x1,
    CU_MEM_ALLOCATION_TYPE_MAX = 0x7fffffff
} CUmemAllocationType;

typedef enum CUmemAllocationGranularity_flags_enum {
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0,
    CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 0x1
} CUmemAllocationGranularity_flags;

/* ---- structs read by the VMM calls --------------------------------------- */

#define CU_MEM_ALLOCATION_COMP_GENERIC 0x1

typedef struct CUmemLocation_st {
    CUmemLocationType type;
    int id; /* device ordinal when type is DEVICE */
} CUmemLocation;

typedef struct CUmemAllocationProp_st {
    CUmemAllocationType type;
    CUmemAllocationHandleType requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData; /* must be NULL on Linux */
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags; /* all zero: plain, non-compressible memory */
} CUmemAllocationProp;

typedef struct CUmemAccessDesc_st {
    CUmemLocation location;
    CUmemAccess_flags flags;
} CUmemAccessDesc;

/* ---- entry points ------------------------------------------------------ */

/* The two ways in: dlsym finds only these. */
typedef CUresult (*gm__pfn_cuGetProcAddress_v2)(const char *symbol, void **pfn, int cuda_version,
                                                cuuint64_t flags,
                                                CUdriverProcAddressQueryResult *status);
typedef CUresult (*gm__pfn_cuGetProcAddress)(const char *symbol, void **pfn, int cuda_version,
                                             cuuint64_t flags);

/*
 * Everything else, resolved through cuGetProcAddress by its base name.
 * X(name, required, (parameters)).  required 0: the symbol may be missing
 * (older driver) and stays NULL; the backend probes it before use.
 */
#define GM__CUDA_DRIVER_FUNCS(X)                                                                   \
    X(cuGetErrorName, 1, (CUresult error, const char **name))                                      \
    X(cuGetErrorString, 1, (CUresult error, const char **text))                                    \
    X(cuInit, 1, (unsigned int flags))                                                             \
    X(cuDriverGetVersion, 1, (int *version))                                                       \
    X(cuDeviceGetCount, 1, (int *count))                                                           \
    X(cuDeviceGet, 1, (CUdevice *device, int ordinal))                                             \
    X(cuDeviceGetName, 1, (char *name, int len, CUdevice device))                                  \
    X(cuDeviceGetAttribute, 1, (int *value, CUdevice_attribute attribute, CUdevice device))        \
    X(cuDevicePrimaryCtxRetain, 1, (CUcontext *ctx, CUdevice device))                              \
    X(cuDevicePrimaryCtxRelease, 1, (CUdevice device))                                             \
    X(cuCtxGetCurrent, 1, (CUcontext *ctx))                                                        \
    X(cuCtxSetCurrent, 1, (CUcontext ctx))                                                         \
    X(cuMemGetInfo, 1, (size_t *free_bytes, size_t *total_bytes))                                  \
    X(cuEventCreate, 1, (CUevent *event, unsigned int flags))                                      \
    X(cuEventDestroy, 1, (CUevent event))                                                          \
    X(cuEventRecord, 1, (CUevent event, CUstream stream))                                          \
    X(cuEventQuery, 1, (CUevent event))                                                            \
    X(cuEventSynchronize, 1, (CUevent event))                                                      \
    X(cuStreamSynchronize, 1, (CUstream stream))                                                   \
    X(cuStreamCreate, 1, (CUstream *stream, unsigned int flags))                                   \
    X(cuStreamDestroy, 1, (CUstream stream))                                                       \
    X(cuMemcpyAsync, 1, (CUdeviceptr dst, CUdeviceptr src, size_t size, CUstream stream))          \
    X(cuMemsetD8Async, 1, (CUdeviceptr dst, unsigned char value, size_t count, CUstream stream))   \
    X(cuMemGetAllocationGranularity, 0,                                                            \
      (size_t *granularity, const CUmemAllocationProp *prop,                                       \
       CUmemAllocationGranularity_flags option))                                                   \
    X(cuMemAddressReserve, 0,                                                                      \
      (CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr hint,                          \
       unsigned long long flags))                                                                  \
    X(cuMemAddressFree, 0, (CUdeviceptr ptr, size_t size))                                         \
    X(cuMemCreate, 0,                                                                              \
      (CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,          \
       unsigned long long flags))                                                                  \
    X(cuMemRelease, 0, (CUmemGenericAllocationHandle handle))                                      \
    X(cuMemMap, 0,                                                                                 \
      (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,           \
       unsigned long long flags))                                                                  \
    X(cuMemUnmap, 0, (CUdeviceptr ptr, size_t size))                                               \
    X(cuMemSetAccess, 0,                                                                           \
      (CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count))                   \
    X(cuMemExportToShareableHandle, 0,                                                             \
      (void *shareable, CUmemGenericAllocationHandle handle, CUmemAllocationHandleType type,        \
       unsigned long long flags))                                                                  \
    X(cuMemImportFromShareableHandle, 0,                                                           \
      (CUmemGenericAllocationHandle *handle, void *os_handle, CUmemAllocationHandleType type)) \
    X(cuMemHostRegister, 0, (void *p, size_t bytesize, unsigned int flags))                        \
    X(cuMemHostUnregister, 0, (void *p))                                                           \
    X(cuMemHostGetDevicePointer, 0, (CUdeviceptr *dptr, void *p, unsigned int flags))              \
    X(cuStreamWaitEvent, 0, (CUstream stream, CUevent event, unsigned int flags))                  \
    X(cuDeviceGetPCIBusId, 0, (char *bus_id, int len, CUdevice device))                          \
    X(cuMemAllocManaged, 0, (CUdeviceptr *dptr, size_t bytesize, unsigned int flags))             \
    X(cuMemFree, 0, (CUdeviceptr dptr))                                                            \
    X(cuMemPrefetchAsync, 0, (CUdeviceptr dptr, size_t count, CUdevice dst, CUstream stream))     \
    X(cuMemAdvise, 0, (CUdeviceptr dptr, size_t count, int advice, CUdevice device))              \
    X(cuDeviceCanAccessPeer, 0, (int *can_access, CUdevice device, CUdevice peer))                 \
    X(cuMemGetAllocationPropertiesFromHandle, 0,                                                   \
      (CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle))

#define GM__CUDA_PFN_TYPEDEF(name, required, params) typedef CUresult(*gm__pfn_##name) params;
GM__CUDA_DRIVER_FUNCS(GM__CUDA_PFN_TYPEDEF)
#undef GM__CUDA_PFN_TYPEDEF

/* ---- layout checks (LP64 Linux, the only ABI the backend loads on) ------ */

#if defined(__LP64__)
_Static_assert(sizeof(CUresult) == 4, "CUresult is a 32-bit enum");
_Static_assert(sizeof(CUmemLocation) == 8, "CUmemLocation layout");
_Static_assert(offsetof(CUmemAllocationProp, location) == 8, "CUmemAllocationProp layout");
_Static_assert(offsetof(CUmemAllocationProp, win32HandleMetaData) == 16,
               "CUmemAllocationProp layout");
_Static_assert(offsetof(CUmemAllocationProp, allocFlags) == 24, "CUmemAllocationProp layout");
_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp layout");
_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc layout");
#endif

#endif /* GM_CUDA_DRIVER_H */
