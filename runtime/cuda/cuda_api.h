/*
 * cuda_api.h — the few CUDA driver API functions the CUDA backend calls,
 * loaded from libcuda.so.1 with dlopen when a CUDA engine is run. kiln has
 * no link-time dependency on CUDA: a binary built anywhere starts where
 * there is no driver, and says so only when asked to run on a GPU.
 *
 * The types mirror cuda.h's (stable since CUDA 4; the _v2 entry points are
 * the ones cuda.h maps its names to). Only what the backend needs is here.
 *
 * Prefix: krt_cuda_.
 */
#ifndef KILN_CUDA_API_H
#define KILN_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

#include "support/support.h"

typedef int krt_cu_result;              /* CUresult: 0 is CUDA_SUCCESS */
typedef int krt_cu_device;              /* CUdevice */
typedef uint64_t krt_cu_ptr;            /* CUdeviceptr */
typedef struct krt_cu_ctx_ *krt_cu_ctx; /* CUcontext */
typedef struct krt_cu_mod_ *krt_cu_mod; /* CUmodule */
typedef struct krt_cu_fn_ *krt_cu_fn;   /* CUfunction */
typedef struct krt_cu_stream_ *krt_cu_stream;         /* CUstream */
typedef struct krt_cu_graph_ *krt_cu_graph;           /* CUgraph: a captured sequence of launches */
typedef struct krt_cu_graph_exec_ *krt_cu_graph_exec; /* CUgraphExec: one instantiated for launching */
typedef struct krt_cu_event_ *krt_cu_event;           /* CUevent: a point in a stream's work, timed */

/* CUdevice_attribute values used here. */
enum {
    KRT_CU_ATTR_CC_MAJOR = 75, /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */
    KRT_CU_ATTR_CC_MINOR = 76, /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR */
};

/* CUtensorMap: the description of a tensor that TMA (cp.async.bulk.tensor,
 * sm_90) copies boxes of, made on the host by cuTensorMapEncodeTiled and
 * passed to a kernel by value (a __grid_constant__ parameter, 128 bytes). */
typedef struct krt_cu_tmap {
    _Alignas(128) uint64_t opaque[16];
} krt_cu_tmap;

/* cuTensorMapEncodeTiled's enums (CUtensorMapDataType, ...Swizzle, ...) and
 * CUfunction_attribute values used here. */
enum {
    KRT_CU_TMAP_UINT8 = 0,                      /* CU_TENSOR_MAP_DATA_TYPE_UINT8 (one-byte codes) */
    KRT_CU_TMAP_FLOAT16 = 6,                    /* CU_TENSOR_MAP_DATA_TYPE_FLOAT16 */
    KRT_CU_TMAP_FLOAT32 = 7,                    /* CU_TENSOR_MAP_DATA_TYPE_FLOAT32 */
    KRT_CU_TMAP_BFLOAT16 = 9,                   /* CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 */
    KRT_CU_TMAP_INTERLEAVE_NONE = 0,            /* CU_TENSOR_MAP_INTERLEAVE_NONE */
    KRT_CU_TMAP_SWIZZLE_128B = 3,               /* CU_TENSOR_MAP_SWIZZLE_128B */
    KRT_CU_TMAP_L2_256B = 3,                    /* CU_TENSOR_MAP_L2_PROMOTION_L2_256B */
    KRT_CU_TMAP_OOB_ZERO = 0,                   /* CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE: zeros past the edges */
    KRT_CU_FUNC_MAX_DYNAMIC_SHARED_BYTES = 8,   /* CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES */
    KRT_CU_FUNC_PREFERRED_SHARED_CARVEOUT = 9,  /* CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT */
};

/* cuLaunchKernelEx's CUlaunchAttribute (an id, padding to 8 bytes, a 64-byte union of values) and
 * CUlaunchConfig; the one attribute used here: CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
 * whose value (an int, non-zero) lets the kernel start before the one ahead of it in the stream ends
 * (programmatic dependent launch, sm_90: the kernel waits for it with griddepcontrol.wait). */
enum { KRT_CU_LAUNCH_ATTR_PROGRAMMATIC_SERIALIZATION = 6 };
typedef struct krt_cu_launch_attr {
    int id;
    char pad[4];
    union {
        char bytes[64];
        int value;
    } u;
} krt_cu_launch_attr;
typedef struct krt_cu_launch_config {
    unsigned grid[3], block[3], shared_bytes;
    krt_cu_stream stream;
    krt_cu_launch_attr *attrs;
    unsigned n_attrs;
} krt_cu_launch_config;

/* Flags and modes used here, as cuda.h spells them. */
enum {
    KRT_CU_STREAM_NON_BLOCKING = 1,        /* CU_STREAM_NON_BLOCKING: no implicit sync with the legacy stream */
    KRT_CU_CAPTURE_MODE_THREAD_LOCAL = 1,  /* CU_STREAM_CAPTURE_MODE_THREAD_LOCAL */
    KRT_CU_ERROR_OUT_OF_MEMORY = 2,        /* CUDA_ERROR_OUT_OF_MEMORY */
    KRT_CU_EVENT_DEFAULT = 0,              /* CU_EVENT_DEFAULT: an event that records its time */
};

typedef struct krt_cuda_api {
    void *lib;  /* the dlopen handle */
    krt_cu_result (*cuInit)(unsigned flags);
    krt_cu_result (*cuDeviceGetCount)(int *count);
    krt_cu_result (*cuDeviceGet)(krt_cu_device *dev, int ordinal);
    krt_cu_result (*cuDeviceGetAttribute)(int *value, int attribute, krt_cu_device dev);
    krt_cu_result (*cuDeviceGetName)(char *name, int len, krt_cu_device dev);
    krt_cu_result (*cuDevicePrimaryCtxRetain)(krt_cu_ctx *ctx, krt_cu_device dev);
    krt_cu_result (*cuDevicePrimaryCtxRelease)(krt_cu_device dev);
    krt_cu_result (*cuCtxSetCurrent)(krt_cu_ctx ctx);
    krt_cu_result (*cuMemAlloc)(krt_cu_ptr *p, size_t bytes);
    krt_cu_result (*cuMemFree)(krt_cu_ptr p);
    krt_cu_result (*cuMemsetD8)(krt_cu_ptr p, unsigned char value, size_t n);
    krt_cu_result (*cuMemcpyHtoD)(krt_cu_ptr dst, const void *src, size_t bytes);
    krt_cu_result (*cuMemcpyDtoH)(void *dst, krt_cu_ptr src, size_t bytes);
    krt_cu_result (*cuMemcpyDtoD)(krt_cu_ptr dst, krt_cu_ptr src, size_t bytes);
    krt_cu_result (*cuModuleLoadData)(krt_cu_mod *mod, const void *image);
    krt_cu_result (*cuModuleUnload)(krt_cu_mod mod);
    krt_cu_result (*cuModuleGetFunction)(krt_cu_fn *fn, krt_cu_mod mod, const char *name);
    krt_cu_result (*cuLaunchKernel)(krt_cu_fn fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                    unsigned bz, unsigned shared_bytes, void *stream, void **params, void **extra);
    krt_cu_result (*cuMemGetInfo)(size_t *free_bytes, size_t *total_bytes);
    krt_cu_result (*cuStreamCreate)(krt_cu_stream *stream, unsigned flags);
    krt_cu_result (*cuStreamDestroy)(krt_cu_stream stream);
    krt_cu_result (*cuStreamSynchronize)(krt_cu_stream stream);
    krt_cu_result (*cuMemcpyHtoDAsync)(krt_cu_ptr dst, const void *src, size_t bytes, krt_cu_stream stream);
    krt_cu_result (*cuMemcpyDtoHAsync)(void *dst, krt_cu_ptr src, size_t bytes, krt_cu_stream stream);
    krt_cu_result (*cuMemcpyDtoDAsync)(krt_cu_ptr dst, krt_cu_ptr src, size_t bytes, krt_cu_stream stream);
    krt_cu_result (*cuMemsetD8Async)(krt_cu_ptr p, unsigned char value, size_t n, krt_cu_stream stream);
    krt_cu_result (*cuStreamBeginCapture)(krt_cu_stream stream, int mode);
    krt_cu_result (*cuStreamEndCapture)(krt_cu_stream stream, krt_cu_graph *graph);
    krt_cu_result (*cuGraphInstantiateWithFlags)(krt_cu_graph_exec *exec, krt_cu_graph graph,
                                                 unsigned long long flags);
    krt_cu_result (*cuGraphLaunch)(krt_cu_graph_exec exec, krt_cu_stream stream);
    krt_cu_result (*cuGraphExecDestroy)(krt_cu_graph_exec exec);
    krt_cu_result (*cuGraphDestroy)(krt_cu_graph graph);
    krt_cu_result (*cuEventCreate)(krt_cu_event *event, unsigned flags);
    krt_cu_result (*cuEventRecord)(krt_cu_event event, krt_cu_stream stream);
    krt_cu_result (*cuEventElapsedTime)(float *ms, krt_cu_event start, krt_cu_event end);
    krt_cu_result (*cuEventDestroy)(krt_cu_event event);
    krt_cu_result (*cuGetErrorName)(krt_cu_result r, const char **name);
    krt_cu_result (*cuGetErrorString)(krt_cu_result r, const char **text);
    /* optional (NULL when the driver lacks them: CUDA 12.0 and later have all three) */
    krt_cu_result (*cuFuncSetAttribute)(krt_cu_fn fn, int attribute, int value);
    krt_cu_result (*cuLaunchKernelEx)(const krt_cu_launch_config *config, krt_cu_fn fn, void **params, void **extra);
    krt_cu_result (*cuTensorMapEncodeTiled)(krt_cu_tmap *map, int dtype, unsigned rank, void *base,
                                            const uint64_t *dims, const uint64_t *strides, const unsigned *box,
                                            const unsigned *elem_strides, int interleave, int swizzle,
                                            int l2_promotion, int oob_fill);
} krt_cuda_api;

/* Load the driver library: $KILN_CUDA_LIB if set (tests point it elsewhere),
 * else libcuda.so.1. Returns 0, or -1 after reporting what is missing (an
 * optional entry point missing is left NULL, not reported). */
int krt_cuda_api_load(krt_cuda_api *api, ks_diag *d);
void krt_cuda_api_unload(krt_cuda_api *api);

/* Whether the driver library loads, with every entry point (reported as
 * krt_cuda_api_load reports): for a command that would otherwise work for
 * seconds before it needs the GPU. The library stays loaded (libcuda does
 * not take well to being unloaded and loaded again), so the backend's own
 * krt_cuda_api_load later finds it at once. 0, or -1 after reporting. */
int krt_cuda_driver_check(ks_diag *d);

/* "CUDA_ERROR_OUT_OF_MEMORY: out of memory" for a result, into b. */
void krt_cuda_describe(const krt_cuda_api *api, krt_cu_result r, ks_buf *b);
/* Report `cuda: error: <fmt>: <the result described>`; returns -1. */
int krt_cuda_error(const krt_cuda_api *api, ks_diag *d, krt_cu_result r, const char *fmt, ...) KS_PRINTF(4, 5);
int krt_cuda_verror(const krt_cuda_api *api, ks_diag *d, krt_cu_result r, const char *fmt, va_list ap);

/* The architecture to run on a device of compute capability major.minor,
 * among archs ("sm_80", ...): the exact one, else the highest sm_<major><m>
 * with m <= minor (cubins run on later minors of their major); "sm_90a"
 * (arch-specific) fits 9.0 alone and is taken before "sm_90". Index into
 * archs, or -1 when none fits. */
int krt_cuda_pick_arch(const char *const *archs, int n, int major, int minor);

#endif
