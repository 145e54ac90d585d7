/* kcu_no_nvrtc.c — stands in for kcu_nvrtc.c when CMake found no NVRTC: the
 * code generator still works (kiln ir, --emit-source), compiling reports. */
#include "codegen/cuda/kcu.h"

int kcu_have_nvrtc(void) { return 0; }

int kcu_nvrtc_version(int *major, int *minor, int *lo_arch, int *hi_arch)
{
    *major = *minor = *lo_arch = *hi_arch = 0;
    return -1;
}

int kcu_compile(const char *src, const char *src_name, const char *arch, ks_buf *cubin, ks_diag *d)
{
    (void)src;
    (void)src_name;
    (void)cubin;
    ks_error(d, "kiln", "target %s: this kiln was built without NVRTC (CMake found no libnvrtc), so it cannot "
                        "compile CUDA kernels",
             arch);
    return -1;
}

void kcu_compile_id(const char *arch, ks_buf *id) { ks_buf_printf(id, "no nvrtc -arch=%s", arch); }
