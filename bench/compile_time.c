/*
 * compile_time.c — how long kiln takes to compile a model for CUDA, by stage:
 * loading and the passes, generating the CUDA source, and NVRTC for each
 * architecture of TARGET, one after another (kiln build compiles them at
 * once, a thread each; this times each alone). Needs no weights, so a
 * description with a config alone measures a large model's graph
 * (Llama-3-8B: models/llama.kiln with
 * tests/data/llama3-8b-config.json, which tests/cuda's cuda_compile_llama8b
 * compiles without timing it). A measurement, not a test: tests assert no
 * speed (bench/RESULTS.md keeps the figures).
 *
 * usage: compile_time MODEL(.kiln or checkpoint folder) [CONFIG.json|-] [TARGET] [DTYPE]
 *        (defaults: the config beside the weights, sm_80,sm_90, f32)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codegen/cuda/kcu.h"
#include "compiler/driver.h"
#include "runtime/cuda/cuda_draw.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 5) {
        fprintf(stderr, "usage: compile_time MODEL [CONFIG.json|-] [TARGET] [DTYPE]\n");
        return 2;
    }
    if (!kcu_have_nvrtc()) {
        fprintf(stderr, "compile_time: this kiln was built without NVRTC\n");
        return 1;
    }
    const char *config = argc > 2 && strcmp(argv[2], "-") != 0 ? argv[2] : NULL;
    const char *target = argc > 3 ? argv[3] : "sm_80,sm_90", *dtype = argc > 4 ? argv[4] : "f32";
    ks_diag d = {0};
    kd_inputs in = {.input = argv[1], .config = config, .dtype = dtype};
    kd_model m;
    double t0 = now_s();
    if (kd_model_load(&in, 0, &m, &d) != 0 || kd_optimize(&in, &m, &d) != 0) {
        kd_model_free(&m);
        return 1;
    }
    krt_cuda_meta meta = {0};
    ks_buf src = {0};
    double t1 = now_s();
    int rc = kcu_generate(kd_graph(&m), &src, &meta, &d);
    if (rc == 0) ks_buf_puts(&src, krt_cuda_draw_source); /* as kcu_build compiles it */
    double t2 = now_s();
    ks_arena arena = {0};
    const char **archs = NULL;
    int n_archs = rc == 0 ? kcu_parse_target(target, &arena, &archs, &d) : -1;
    printf("%s (%s weights): %d launches, %zu bytes of source; load and passes %.2f s; generate %.3f s;", argv[1],
           dtype, meta.n_kernels, src.len, t1 - t0, t2 - t1);
    for (int i = 0; i < n_archs && rc == 0; i++) {
        ks_buf cubin = {0};
        double a = now_s();
        rc = kcu_compile(ks_buf_cstr(&src), "graph.cu", archs[i], &cubin, &d);
        printf(" NVRTC %s %.2f s (%zu-byte cubin);", archs[i], now_s() - a, cubin.len);
        ks_buf_free(&cubin);
    }
    printf(" total %.2f s\n", now_s() - t0);
    ks_arena_free(&arena);
    ks_buf_free(&src);
    krt_cuda_meta_free(&meta);
    kd_model_free(&m);
    return rc == 0 && n_archs > 0 ? 0 : 1;
}
