/* version.c — what `kiln --version` says (compiler/version.h). */
#include "compiler/version.h"

#include "codegen/cuda/kcu.h"

void kd_version_describe(ks_buf *b)
{
    ks_buf_puts(b, "kiln " KD_VERSION "\n");
#if defined(__clang__)
    ks_buf_printf(b, "built with: clang %d.%d.%d, C%ld\n", __clang_major__, __clang_minor__, __clang_patchlevel__,
                  (long)__STDC_VERSION__ / 100 % 100);
#elif defined(__GNUC__)
    ks_buf_printf(b, "built with: gcc %d.%d.%d, C%ld\n", __GNUC__, __GNUC_MINOR__, __GNUC_PATCHLEVEL__,
                  (long)__STDC_VERSION__ / 100 % 100);
#else
    ks_buf_printf(b, "built with: an unknown C compiler, C%ld\n", (long)__STDC_VERSION__ / 100 % 100);
#endif
    int major, minor, lo, hi;
    if (kcu_nvrtc_version(&major, &minor, &lo, &hi) == 0)
        ks_buf_printf(b, "NVRTC: %d.%d (kiln build --target sm_%d to sm_%d)\n", major, minor, lo, hi);
    else
        ks_buf_puts(b, "NVRTC: none (CMake found no libnvrtc): kiln build --target sm_XX is not available\n");
}
