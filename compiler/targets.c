/* targets.c — the build targets (compiler/targets.h): the CPU (the engine's
 * graph and weights, run by the reference interpreter) and CUDA (kernels
 * generated and compiled with NVRTC: codegen/cuda). */
#include "compiler/targets.h"

#include <stdlib.h>
#include <string.h>

#include "codegen/cuda/kcu.h"
#include "runtime/cuda/cuda_api.h"

/* ---- cpu ----------------------------------------------------------------------------- */
static int cpu_matches(const char *spec) { return strcmp(spec, "cpu") == 0; }

/* ---- cuda ---------------------------------------------------------------------------- */
static void cuda_free(void *impl)
{
    kcu_parts *p = impl;
    kcu_parts_free(p);
    free(p);
}

/* kcu_build's hook, passed on as the target's step. */
typedef struct cuda_step_ctx {
    const kd_target_opts *o; /* the caller's hook */
} cuda_step_ctx;

static void cuda_on_compile(void *ctx, const char *archs)
{
    const kd_target_opts *o = ((const cuda_step_ctx *)ctx)->o;
    char what[160];
    snprintf(what, sizeof what, "compiling CUDA kernels for %s", archs);
    o->on_step(o->on_step_ctx, what);
}

static int cuda_build(const kir_graph *g, const char *spec, const kd_target_opts *o, kd_target_parts *parts,
                      ks_diag *d)
{
    kcu_parts *p = ks_xcalloc(1, sizeof *p);
    cuda_step_ctx ctx = {o};
    if (kcu_build(g, spec, o->emit_dir, o->on_step ? cuda_on_compile : NULL, &ctx, p, d) != 0) {
        cuda_free(p);
        return -1;
    }
    if (o->stats_out && p->choices.len) {
        fprintf(o->stats_out, "cuda: the kernels' tiles (kcu_gemm90), one line a distinct kernel:\n");
        for (const char *line = ks_buf_cstr(&p->choices); *line;) {
            const char *end = strchr(line, '\n');
            fprintf(o->stats_out, "  %.*s\n", (int)(end - line), line);
            line = end + 1;
        }
    }
    parts->sections = p->sections;
    parts->n_sections = p->n_sections;
    parts->meta_key = "cuda_archs";
    parts->meta_list = p->archs;
    parts->n_meta_list = p->n_archs;
    parts->impl = p;
    parts->free_impl = cuda_free;
    return 0;
}

/* ---- the table -------------------------------------------------------------------------- */
const kd_target kd_targets[] = {
    {"cpu", "cpu", cpu_matches, NULL, 0, NULL},
    {"cuda", "NVIDIA GPU architectures such as sm_90 or sm_80,sm_90", kcu_is_target, cuda_build, 1,
     krt_cuda_driver_check},
};
const size_t kd_target_count = sizeof kd_targets / sizeof kd_targets[0];

const kd_target *kd_target_for(const char *spec, ks_diag *d)
{
    if (!spec) spec = "cpu";
    for (size_t i = 0; i < kd_target_count; i++)
        if (kd_targets[i].matches(spec)) return &kd_targets[i];
    ks_buf known = {0};
    for (size_t i = 0; i < kd_target_count; i++)
        ks_buf_printf(&known, "%s%s", i == 0 ? "" : i + 1 == kd_target_count ? ", or " : ", ", kd_targets[i].spelling);
    ks_error(d, "kiln", "unknown target '%s' (known: %s)", spec, ks_buf_cstr(&known));
    ks_buf_free(&known);
    return NULL;
}

void kd_target_parts_free(kd_target_parts *p)
{
    if (p->free_impl) p->free_impl(p->impl);
    memset(p, 0, sizeof *p);
}
