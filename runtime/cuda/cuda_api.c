/* cuda_api.c — loading libcuda with dlopen (runtime/cuda/cuda_api.h). */
#include "runtime/cuda/cuda_api.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

/* cuda.h's CUlaunchAttribute and CUlaunchConfig, as the driver reads them (LP64) */
_Static_assert(sizeof(krt_cu_launch_attr) == 72 && offsetof(krt_cu_launch_attr, u) == 8,
               "krt_cu_launch_attr must match CUlaunchAttribute");
_Static_assert(offsetof(krt_cu_launch_config, shared_bytes) == 24 && offsetof(krt_cu_launch_config, stream) == 32 &&
                   offsetof(krt_cu_launch_config, attrs) == 40 && offsetof(krt_cu_launch_config, n_attrs) == 48,
               "krt_cu_launch_config must match CUlaunchConfig");

/* Entry points, as exported by libcuda, and where each goes. */
#define API_ENTRY(field, symbol) {symbol, offsetof(krt_cuda_api, field), 0}
#define API_OPTIONAL(field, symbol) {symbol, offsetof(krt_cuda_api, field), 1}
static const struct {
    const char *symbol; /* the exported name */
    size_t offset;      /* the field of krt_cuda_api it fills */
    int optional;       /* 1: left NULL when missing (the CPU stand-in, older drivers) */
} entries[] = {
    API_ENTRY(cuInit, "cuInit"),
    API_ENTRY(cuDeviceGetCount, "cuDeviceGetCount"),
    API_ENTRY(cuDeviceGet, "cuDeviceGet"),
    API_ENTRY(cuDeviceGetAttribute, "cuDeviceGetAttribute"),
    API_ENTRY(cuDeviceGetName, "cuDeviceGetName"),
    API_ENTRY(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
    API_ENTRY(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
    API_ENTRY(cuCtxSetCurrent, "cuCtxSetCurrent"),
    API_ENTRY(cuMemAlloc, "cuMemAlloc_v2"),
    API_ENTRY(cuMemFree, "cuMemFree_v2"),
    API_ENTRY(cuMemsetD8, "cuMemsetD8_v2"),
    API_ENTRY(cuMemcpyHtoD, "cuMemcpyHtoD_v2"),
    API_ENTRY(cuMemcpyDtoH, "cuMemcpyDtoH_v2"),
    API_ENTRY(cuMemcpyDtoD, "cuMemcpyDtoD_v2"),
    API_ENTRY(cuModuleLoadData, "cuModuleLoadData"),
    API_ENTRY(cuModuleUnload, "cuModuleUnload"),
    API_ENTRY(cuModuleGetFunction, "cuModuleGetFunction"),
    API_ENTRY(cuLaunchKernel, "cuLaunchKernel"),
    API_ENTRY(cuMemGetInfo, "cuMemGetInfo_v2"),
    API_ENTRY(cuStreamCreate, "cuStreamCreate"),
    API_ENTRY(cuStreamDestroy, "cuStreamDestroy_v2"),
    API_ENTRY(cuStreamSynchronize, "cuStreamSynchronize"),
    API_ENTRY(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
    API_ENTRY(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
    API_ENTRY(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"),
    API_ENTRY(cuMemsetD8Async, "cuMemsetD8Async"),
    API_ENTRY(cuStreamBeginCapture, "cuStreamBeginCapture_v2"),
    API_ENTRY(cuStreamEndCapture, "cuStreamEndCapture"),
    API_ENTRY(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags"),
    API_ENTRY(cuGraphLaunch, "cuGraphLaunch"),
    API_ENTRY(cuGraphExecDestroy, "cuGraphExecDestroy"),
    API_ENTRY(cuGraphDestroy, "cuGraphDestroy"),
    API_ENTRY(cuEventCreate, "cuEventCreate"),
    API_ENTRY(cuEventRecord, "cuEventRecord"),
    API_ENTRY(cuEventElapsedTime, "cuEventElapsedTime"),
    API_ENTRY(cuEventDestroy, "cuEventDestroy_v2"),
    API_ENTRY(cuGetErrorName, "cuGetErrorName"),
    API_ENTRY(cuGetErrorString, "cuGetErrorString"),
    API_OPTIONAL(cuFuncSetAttribute, "cuFuncSetAttribute"),
    API_OPTIONAL(cuTensorMapEncodeTiled, "cuTensorMapEncodeTiled"),
    API_OPTIONAL(cuLaunchKernelEx, "cuLaunchKernelEx"),
};

int krt_cuda_api_load(krt_cuda_api *api, ks_diag *d)
{
    memset(api, 0, sizeof *api);
    const char *name = getenv("KILN_CUDA_LIB");
    if (!name || !name[0]) name = "libcuda.so.1";
    api->lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!api->lib) {
        const char *why = dlerror();
        ks_error(d, "cuda", "cannot load the NVIDIA driver library %s (%s): running a CUDA engine needs an NVIDIA "
                            "GPU and its driver",
                 name, why ? why : "unknown reason");
        return -1;
    }
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
        void *sym = dlsym(api->lib, entries[i].symbol);
        if (!sym && entries[i].optional) continue;
        if (!sym) {
            ks_error(d, "cuda", "%s has no %s: the NVIDIA driver is too old or the library is not libcuda", name,
                     entries[i].symbol);
            krt_cuda_api_unload(api);
            return -1;
        }
        /* POSIX: a function's address from dlsym converts to its pointer type */
        memcpy((char *)api + entries[i].offset, &sym, sizeof sym);
    }
    return 0;
}

int krt_cuda_driver_check(ks_diag *d)
{
    krt_cuda_api api;
    return krt_cuda_api_load(&api, d); /* not unloaded: see cuda_api.h */
}

void krt_cuda_api_unload(krt_cuda_api *api)
{
    if (api->lib) dlclose(api->lib);
    memset(api, 0, sizeof *api);
}

void krt_cuda_describe(const krt_cuda_api *api, krt_cu_result r, ks_buf *b)
{
    const char *name = NULL, *text = NULL;
    if (api->cuGetErrorName) api->cuGetErrorName(r, &name);
    if (api->cuGetErrorString) api->cuGetErrorString(r, &text);
    if (name && text)
        ks_buf_printf(b, "%s: %s", name, text);
    else
        ks_buf_printf(b, "CUDA error %d", r);
}

int krt_cuda_verror(const krt_cuda_api *api, ks_diag *d, krt_cu_result r, const char *fmt, va_list ap)
{
    ks_buf msg = KS_BUF_TRY;
    ks_buf_vprintf(&msg, fmt, ap);
    ks_buf_puts(&msg, ": ");
    krt_cuda_describe(api, r, &msg);
    ks_error(d, "cuda", "%s", ks_buf_cstr(&msg));
    ks_buf_free(&msg);
    return -1;
}

int krt_cuda_error(const krt_cuda_api *api, ks_diag *d, krt_cu_result r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    krt_cuda_verror(api, d, r, fmt, ap);
    va_end(ap);
    return -1;
}

int krt_cuda_pick_arch(const char *const *archs, int n, int major, int minor)
{
    int best = -1, best_minor = -1;
    for (int i = 0; i < n; i++) {
        const char *a = archs[i];
        if (strncmp(a, "sm_", 3) != 0) continue;
        char *end;
        long v = strtol(a + 3, &end, 10);
        /* sm_NNa: arch-specific features (sm_90a's wgmma), for NN's compute capability alone */
        int specific = end[0] == 'a' && end[1] == 0;
        if (end == a + 3 || (*end && !specific) || v < 10) continue;
        int amaj = (int)(v / 10), amin = (int)(v % 10);
        if (amaj != major || amin > minor || (specific && amin != minor)) continue;
        int score = 2 * amin + specific; /* the exact minor; of two, the arch-specific one */
        if (score > best_minor) best = i, best_minor = score;
    }
    return best;
}
