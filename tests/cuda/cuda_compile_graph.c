/*
 * cuda_compile_graph.c — kernel sharing on a model's graph without its
 * weights (e.g. Llama-3-8B's shape: models/llama.kiln with
 * tests/data/llama3-8b-config.json, which no checkpoint in the tests has):
 * compiles the description, runs every pass, generates the CUDA source,
 * checks that it holds at most MAX_DISTINCT distinct kernels (layers share
 * theirs) and that its fused epilogues' rows do no per-column work, and
 * compiles it with NVRTC for each architecture of TARGET (sm_90 as sm_90a
 * with the matmuls' gemm90 variants, as kcu_build does). Prints
 *
 *   graph llama (bf16 weights): 32 layers, 578 launches, 19 distinct kernels, 51234 bytes of source
 *     k_matmul_fused_..: T > 64: the norm, then k_matmul_fused_.._g90_128, 48 column tiles, ...
 *
 * It times nothing: bench/compile_time measures the same compile by stage.
 * usage: cuda_compile_graph MODEL.kiln CONFIG.json TARGET DTYPE MAX_DISTINCT [SOURCE.cu]
 * (SOURCE.cu: where to write the generated CUDA C, to read it or compile it with nvcc -Xptxas -v)
 * Exit 1 when a check fails, 77 without NVRTC.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cuda/kcu.h"
#include "compiler/driver.h"
#include "tests/check.h"

/* Distinct kernel names in meta. */
static int distinct_kernels(const krt_cuda_meta *m)
{
    int n = 0;
    for (int i = 0; i < m->n_kernels; i++) {
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = strcmp(m->kernels[i].name, m->kernels[j].name) == 0;
        n += !seen;
    }
    return n;
}

/* Occurrences of needle in [p, end). */
static int count_in(const char *p, const char *end, const char *needle)
{
    int n = 0;
    for (const char *q = strstr(p, needle); q && q < end; q = strstr(q + 1, needle)) n++;
    return n;
}

/* The fused epilogues' rows (kcu_emit_group.c: apply, after the column step): no branch around a
 * node (`continue`), no rotation frequency read (the column step reads it, once), and one sincos a
 * row at most for all the rotations of a group (Llama's q and k share it). Returns how many rows
 * bodies it read. */
static int check_epilogue_rows(const char *src)
{
    int n = 0;
    for (const char *p = strstr(src, " void apply(long long t, float v0, float v1, const col &c"); p;
         p = strstr(p + 1, " void apply(long long t, float v0, float v1, const col &c")) {
        const char *end = strstr(p, " void run(");
        if (!CHECK_MSG(end != NULL, "an apply without its run")) break;
        CHECK_MSG(count_in(p, end, "continue;") == 0, "a branch around a node in apply: %.80s", p);
        CHECK_MSG(count_in(p, end, "_inv_freq") == 0, "a rotation frequency read in apply, each row");
        CHECK_MSG(count_in(p, end, "sincosf(") + count_in(p, end, "sincos((double)") <= 1,
                  "more than one sincos a row in an epilogue");
        n++;
    }
    return n;
}

/* The tile width the sm_90a variant of kernel k runs for a step of T tokens (the runtime's pick;
 * its last launch, "<name>_g90_<width>"), or 0 when none does. */
static int g90_width_at(const krt_cuda_kernel *k, int64_t T)
{
    const krt_cuda_variant *pick = krt_cuda_pick_variant(k, KCU_GEMM90_ARCH, T);
    if (!pick || pick->n_launches < 1) return 0;
    const char *at = strstr(pick->launches[pick->n_launches - 1].name, "_g90_");
    return at ? atoi(at + 5) : 0;
}

/* Llama-3-8B's matmuls (K, N) and the widths the tile rule gives them at 512, 1024 and 2048 tokens:
 * each the fastest of the five widths measured alone on the H200 (bench/RESULTS.md #10 step 11; q,k,v
 * at 1024 ran 697 TFLOP/s at 192 against 579 at 256, the width the ascending-only rule kept). */
static const struct {
    int64_t K, N;
    int w512, w1024, w2048;
} llama8b_widths[] = {{4096, 6144, 192, 192, 256}, {4096, 4096, 128, 256, 256}, {4096, 28672, 224, 256, 256},
                      {14336, 4096, 128, 256, 256}};

int main(int argc, char **argv)
{
    if (argc != 6 && argc != 7) {
        fprintf(stderr, "usage: cuda_compile_graph MODEL.kiln|CHECKPOINT_DIR CONFIG.json TARGET DTYPE MAX_DISTINCT [SOURCE.cu]\n");
        return 2;
    }
    if (!kcu_have_nvrtc()) {
        printf("skipped: built without NVRTC\n");
        return 77;
    }
    int max_distinct = atoi(argv[5]);
    ks_diag d = {0};
    kd_inputs in = {.input = argv[1], .config = argv[2], .dtype = argv[4]};
    kd_model m;
    /* a checkpoint folder: its tensors' shapes (the headers: nothing of the data is read), which say which
     * optional weights are present (a model with optional weights: DeepSeek-V3's shape from a sparse file) */
    if (!CHECK(kd_model_load(&in, ks_is_dir(argv[1]), &m, &d) == 0 && kd_optimize(&in, &m, &d) == 0)) {
        kd_model_free(&m);
        return check_finish("cuda_compile_graph");
    }
    const kir_graph *g = kd_graph(&m);
    int layers = 0;
    for (size_t v = 0; v < g->n_nodes; v++) layers += g->nodes[v].op == KIR_OP_ATTENTION;

    krt_cuda_meta meta = {0};
    ks_buf src = {0};
    ks_arena arena = {0};
    const char **archs = NULL;
    /* as kcu_build: a target with sm_90 compiles it as sm_90a, with the matmuls' gemm90 variants */
    int n_archs = kcu_parse_target(argv[3], &arena, &archs, &d);
    CHECK(n_archs > 0);
    ks_buf choices = {0};
    kcu_options opt = {.choices = &choices};
    kcu_target_options(archs, n_archs, 1, &opt);
    if (CHECK(kcu_generate_with(g, &opt, &src, &meta, &d) == 0)) {
        int distinct = distinct_kernels(&meta);
        printf("graph %s (%s weights): %d layers, %d launches, %d distinct kernels, %zu bytes of source\n", g->name,
               argv[4], layers, meta.n_kernels, distinct, src.len);
        CHECK_MSG(distinct <= max_distinct, "%d distinct kernels, more than %d: kernels are not shared across layers",
                  distinct, max_distinct);
        CHECK_MSG(check_epilogue_rows(ks_buf_cstr(&src)) > 0, "no fused epilogue with a column step");
        /* the gemm90 tiles chosen, once a kernel (kcu_options.choices, what kiln build --stats prints) */
        printf("%s", ks_buf_cstr(&choices));
        if (argc == 7) { /* the generated source, to read or to compile with nvcc -Xptxas -v */
            FILE *f = fopen(argv[6], "wb");
            CHECK_MSG(f && fwrite(src.data, 1, src.len, f) == src.len && fclose(f) == 0, "writing %s", argv[6]);
        }
        for (int i = 0; i < meta.n_kernels; i++)
            for (int j = 0; j < meta.kernels[i].n_variants; j++) {
                const krt_cuda_variant *v = &meta.kernels[i].variants[j];
                const krt_cuda_launch *l = &v->launches[v->n_launches - 1];
                /* a token tile is 128 rows: 2048 tokens are 16 tiles, 2049 are 17; in clusters of two
                   (grid x 2, y the pairs) 18, the last pair's second tile past the tokens */
                const int pairs = krt_cuda_launch_grid_dim(l, 0, 1) == 2;
                const int64_t t2048 = pairs ? 2 * krt_cuda_launch_grid_dim(l, 1, 2048) : krt_cuda_launch_grid_dim(l, 0, 2048),
                              t2049 = pairs ? 2 * krt_cuda_launch_grid_dim(l, 1, 2049) : krt_cuda_launch_grid_dim(l, 0, 2049);
                CHECK_MSG(t2048 == 16 && t2049 == (pairs ? 18 : 17), "%s: %lld token tiles for 2048 tokens, %lld for 2049",
                          l->name, (long long)t2048, (long long)t2049);
            }
        enum { N_PINNED = sizeof llama8b_widths / sizeof llama8b_widths[0] };
        int found[N_PINNED] = {0}; /* launches of each of Llama-3-8B's matmuls (llama8b_widths) */
        for (int i = 0; i < meta.n_kernels; i++) {
            const kir_node *mn = kir_node_at(g, meta.kernels[i].node);
            if (mn->op != KIR_OP_MATMUL || !meta.kernels[i].n_variants) continue;
            const int64_t K = kir_node_at(g, mn->in[1])->dims[1], N = mn->dims[mn->ndim - 1];
            for (size_t s = 0; s < N_PINNED; s++) {
                if (llama8b_widths[s].K != K || llama8b_widths[s].N != N) continue;
                found[s]++;
                const int w[3] = {g90_width_at(&meta.kernels[i], 512), g90_width_at(&meta.kernels[i], 1024),
                                  g90_width_at(&meta.kernels[i], 2048)};
                CHECK_MSG(w[0] == llama8b_widths[s].w512 && w[1] == llama8b_widths[s].w1024 &&
                              w[2] == llama8b_widths[s].w2048,
                          "%s (%lld -> %lld): tiles %d, %d, %d wide at 512, 1024, 2048 tokens; want %d, %d, %d",
                          meta.kernels[i].name, (long long)K, (long long)N, w[0], w[1], w[2], llama8b_widths[s].w512,
                          llama8b_widths[s].w1024, llama8b_widths[s].w2048);
            }
        }
        /* Llama-3-8B's config pins all four (so that a broken match cannot pass by checking none) */
        for (int s = 0; s < N_PINNED && strstr(argv[2], "llama3-8b"); s++)
            CHECK_MSG(found[s] > 0, "no gemm90 matmul %lld -> %lld in Llama-3-8B's graph", (long long)llama8b_widths[s].K,
                      (long long)llama8b_widths[s].N);
        for (int i = 0; i < n_archs; i++) {
            ks_buf cubin = {0};
            CHECK_MSG(kcu_compile(ks_buf_cstr(&src), "graph.cu", archs[i], &cubin, &d) == 0 && cubin.len > 0,
                      "NVRTC %s", archs[i]);
            ks_buf_free(&cubin);
        }
    }
    ks_arena_free(&arena);
    ks_buf_free(&src);
    ks_buf_free(&choices);
    krt_cuda_meta_free(&meta);
    kd_model_free(&m);
    return check_finish("cuda_compile_graph");
}
