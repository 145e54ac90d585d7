/* kcu_nvrtc.c — compiling the generated source into cubins with NVRTC
 * (built when CMake finds libnvrtc; kcu_no_nvrtc.c stands in otherwise). */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <nvrtc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "codegen/cuda/kcu.h"

int kcu_have_nvrtc(void) { return 1; }

int kcu_nvrtc_version(int *major, int *minor, int *lo_arch, int *hi_arch)
{
    *major = *minor = *lo_arch = *hi_arch = 0;
    if (nvrtcVersion(major, minor) != NVRTC_SUCCESS) return -1;
    int n = 0;
    if (nvrtcGetNumSupportedArchs(&n) == NVRTC_SUCCESS && n > 0) {
        int *list = ks_xmalloc(sizeof *list * (size_t)n);
        if (nvrtcGetSupportedArchs(list) == NVRTC_SUCCESS) {
            *lo_arch = *hi_arch = list[0];
            for (int i = 1; i < n; i++) {
                if (list[i] < *lo_arch) *lo_arch = list[i];
                if (list[i] > *hi_arch) *hi_arch = list[i];
            }
        }
        free(list);
    }
    return 0;
}

/* The number NN of "sm_NN" or "sm_NNa" (the arch-specific target: wgmma,
 * setmaxnreg; its cubin runs on compute capability N.N alone), or -1 when
 * arch is of neither form. */
static int arch_number(const char *arch)
{
    if (strncmp(arch, "sm_", 3) != 0 || !arch[3]) return -1;
    int v = 0;
    for (const char *p = arch + 3; *p; p++) {
        if (*p == 'a' && p > arch + 3 && !p[1]) break;
        if (*p < '0' || *p > '9' || v > 10000) return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

/* Is sm_<number> one NVRTC compiles for? Reports the ones it does when not. */
static int check_supported(int number, const char *arch, ks_diag *d)
{
    int n = 0;
    if (nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n <= 0) return 0; /* cannot tell: let compile decide */
    int *list = ks_xmalloc(sizeof *list * (size_t)n);
    int found = 0;
    if (nvrtcGetSupportedArchs(list) == NVRTC_SUCCESS) {
        for (int i = 0; i < n; i++) found |= list[i] == number;
    } else {
        found = 1;
    }
    if (!found) {
        int major = 0, minor = 0;
        nvrtcVersion(&major, &minor);
        ks_buf known = {0};
        for (int i = 0; i < n; i++) ks_buf_printf(&known, "%ssm_%d", i ? ", " : "", list[i]);
        ks_error(d, "kiln", "target %s: NVRTC %d.%d cannot compile for it (it knows %s)", arch, major, minor,
                 ks_buf_cstr(&known));
        ks_buf_free(&known);
    }
    free(list);
    return found ? 0 : -1;
}

/* NVRTC's options besides -arch. --fmad=false: no contraction into fused
 * multiply-adds, so every kernel rounds as the reference interpreter does (kcu.h). */
static const char *const options[] = {"--fmad=false", "--std=c++17"};
enum { N_OPTIONS = sizeof options / sizeof options[0] };

void kcu_compile_id(const char *arch, ks_buf *id)
{
    int major = 0, minor = 0;
    nvrtcVersion(&major, &minor);
    ks_buf_printf(id, "nvrtc %d.%d -arch=%s", major, minor, arch);
    for (int i = 0; i < N_OPTIONS; i++) ks_buf_printf(id, " %s", options[i]);
    /* the library itself: its version names no patch release, whose cubins may differ */
    Dl_info lib;
    struct stat st;
    if (dladdr((void *)nvrtcVersion, &lib) && lib.dli_fname && stat(lib.dli_fname, &st) == 0)
        ks_buf_printf(id, " (%s: %lld bytes, modified %lld)", lib.dli_fname, (long long)st.st_size,
                      (long long)st.st_mtime);
}

int kcu_compile(const char *src, const char *src_name, const char *arch, ks_buf *cubin, ks_diag *d)
{
    int number = arch_number(arch);
    if (number < 0) {
        ks_error(d, "kiln", "target %s: not an architecture of the form sm_NN or sm_NNa", arch);
        return -1;
    }
    if (check_supported(number, arch, d) != 0) return -1;
    nvrtcProgram prog;
    nvrtcResult r = nvrtcCreateProgram(&prog, src, src_name, 0, NULL, NULL);
    if (r != NVRTC_SUCCESS) {
        ks_error(d, "kiln", "NVRTC: cannot create a program: %s", nvrtcGetErrorString(r));
        return -1;
    }
    char arch_opt[32];
    snprintf(arch_opt, sizeof arch_opt, "-arch=%s", arch);
    const char *opts[1 + N_OPTIONS] = {arch_opt};
    for (int i = 0; i < N_OPTIONS; i++) opts[1 + i] = options[i];
    r = nvrtcCompileProgram(prog, 1 + N_OPTIONS, opts);
    int rc = 0;
    if (r != NVRTC_SUCCESS) {
        /* the generated source does not compile: kiln's bug, with the log to show it */
        size_t log_size = 0;
        nvrtcGetProgramLogSize(prog, &log_size);
        char *log = ks_xmalloc(log_size + 1);
        log[0] = 0;
        nvrtcGetProgramLog(prog, log);
        log[log_size] = 0;
        ks_error(d, src_name, "NVRTC could not compile the generated kernels for %s (%s):\n%s", arch,
                 nvrtcGetErrorString(r), log);
        free(log);
        rc = -1;
    } else {
        size_t size = 0;
        r = nvrtcGetCUBINSize(prog, &size);
        char *bytes = r == NVRTC_SUCCESS && size ? ks_xmalloc(size) : NULL;
        if (bytes && nvrtcGetCUBIN(prog, bytes) == NVRTC_SUCCESS) {
            ks_buf_put(cubin, bytes, size);
        } else {
            ks_error(d, src_name, "NVRTC produced no cubin for %s", arch);
            rc = -1;
        }
        free(bytes);
    }
    nvrtcDestroyProgram(&prog);
    return rc;
}
