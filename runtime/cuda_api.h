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

/* CUdevice_attribute values used here. */
enum {
    KRT_CU_ATTR_CC_MAJOR = 75, /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */
    KRT_CU_ATTR_CC_MINOR = 76, /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR */
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
    krt_cu_result (*cuGetErrorName)(krt_cu_result r, const char **name);
    krt_cu_result (*cuGetErrorString)(krt_cu_result r, const char **text);
} krt_cuda_api;

/* Load the driver library: $KILN_CUDA_LIB if set (tests point it elsewhere),
 * else libcuda.so.1. Returns 0, or -1 after reporting what is missing. */
int krt_cuda_api_load(krt_cuda_api *api, ks_diag *d);
void krt_cuda_api_unload(krt_cuda_api *api);

/* "CUDA_ERROR_OUT_OF_MEMORY: out of memory" for a result, into b. */
void krt_cuda_describe(const krt_cuda_api *api, krt_cu_result r, ks_buf *b);

/* The architecture to run on a device of compute capability major.minor,
 * among archs ("sm_80", ...): the exact one, else the highest sm_<major><m>
 * with m <= minor (cubins run on later minors of their major). Index into
 * archs, or -1 when none fits. */
int krt_cuda_pick_arch(const char *const *archs, int n, int major, int minor);

#endif
