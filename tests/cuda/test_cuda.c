/*
 * test_cuda.c — the CUDA code generator and backend where there is no GPU:
 *  - the launch table of a small graph (kernels, grids, arguments, aliases),
 *    and that cuda.meta reads back to the same text;
 *  - damaged cuda.meta, bad targets, the choice of a cubin for a device;
 *  - extra engine sections written and read back, and their name checks;
 *  - the cubin cache (kcu_cache.c, KILN_CUDA_CACHE): hits, misses, a damaged
 *    entry, and kcu_build reading from it;
 *  - the backend's errors, pinned: no libcuda; a damaged memory plan (a
 *    value past the arena, a view that the plan puts apart from what it
 *    views), found before the driver is loaded; and, through the CPU
 *    stand-in for libcuda (emu_libcuda.so, $KILN_EMU_LIB), an engine whose
 *    architectures the device does not run, and a missing cubin.
 *
 * Also a helper for tests/cuda/cuda_build.sh:
 *   test_cuda --check-engine ENGINE DTYPE ARCH...   the engine's CUDA sections, and its
 *       weights all of DTYPE (f32, bf16, f16), stored at that size per element
 *   test_cuda --compare A.f32 B.f32 TOL       max|a-b| / max|b| <= TOL
 *   test_cuda --fork-check ENGINE REFERENCE   forked sequences (copy-on-write of a
 *       shared, half-filled KV block) on ENGINE give REFERENCE's logits within 1e-5
 */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/cuda/kcu.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/session.h"
#include "tests/check.h"
#include "tests/graph_build.h"

/* ---- a small graph: embed, rms_norm, matmul, reshape, rope, attention, output ------------- */
/* Where every computed node of these graphs is (the graphs' weights and inputs may be elsewhere). */
static kir_loc small_loc(kir_graph *g) { return kir_loc_make(g, "small.kiln", 1, 1); }

/* op(a) or op(a, b) at small_loc, without attributes. */
static kir_val add_node(kir_graph *g, kir_op op, kir_val a, kir_val b) { return tb_op(g, op, small_loc(g), a, b); }

static kir_graph *small_graph(void)
{
    kir_graph *g = kir_graph_new("small");
    kir_loc at = small_loc(g);
    int64_t tab[2] = {16, 8}, norm[1] = {8}, wq[2] = {8, 8};
    kir_val emb = kir_weight(g, "embed", KIR_F32, 2, tab, at);           /* %0 */
    kir_val tokens = kir_input(g, KIR_ROLE_TOKENS, at);                  /* %1 */
    kir_val x = add_node(g, KIR_OP_EMBED, emb, tokens);                  /* %2 */
    kir_val nw = kir_weight(g, "norm", KIR_F32, 1, norm, at);            /* %3 */
    kir_val h = tb_norm_at(g, at, KIR_OP_RMS_NORM, x, nw, KIR_NONE, 1e-5); /* %4 */
    kir_val w = kir_weight(g, "wq", KIR_F32, 2, wq, at);                 /* %5 */
    kir_val q = add_node(g, KIR_OP_MATMUL, h, w);                        /* %6 */
    int64_t shape[3] = {KIR_DIM_T, 2, 4};
    kir_val q3 = tb_reshape_at(g, at, q, 3, shape);                      /* %7 */
    kir_val pos = kir_input(g, KIR_ROLE_POSITIONS, at);                  /* %8 */
    tb_rope_attrs rope = tb_rope_plain(4);
    kir_val r = tb_rope_at(g, at, q3, pos, &rope);                       /* %9 */
    kir_val att = tb_attention_at(g, at, r, r, q3, 0, 0.5, 0, 0.0);      /* %10 */
    int64_t shape2[2] = {KIR_DIM_T, 8};
    kir_val flat = tb_reshape_at(g, at, att, 2, shape2);                 /* %11 */
    tb_output_at(g, at, flat, "logits");                                 /* %12 */
    return g;
}

/* The meta of the small graph, each kernel name's hash of its text as #
 * (mask_names): the names change with any change to a kernel's text. */
static const char small_meta[] =
    "{\"format\":\"kiln-cuda-2\",\"archs\":[\"sm_80\",\"sm_90\"],\"output\":10,\"pdl\":true,\"aliases\":[[7,6],[11,10],[12,10]],"
    "\"kernels\":["
    "{\"name\":\"k_embed_#\",\"node\":2,\"block\":256,\"grid\":[[8,0,256],[0,1,1],[0,1,1]],"
    "\"args\":[\"T\",\"value:0\",\"value:1\",\"value:2\"]},"
    "{\"name\":\"k_rms_norm_#\",\"node\":4,\"block\":32,\"grid\":[[1,0,1],[0,1,1],[0,1,1]],"
    "\"args\":[\"T\",\"value:2\",\"value:3\",\"value:4\"]},"
    "{\"name\":\"k_matmul_#\",\"node\":6,\"block\":256,\"large\":{\"name\":\"k_matmul_#_large\",\"above\":32},\"grid\":[[0,8,16],[0,1,1],[0,1,1]],"
    "\"args\":[\"T\",\"value:4\",\"value:5\",\"value:6\"]},"
    "{\"name\":\"k_rope_#\",\"node\":9,\"block\":256,\"grid\":[[8,0,256],[0,1,1],[0,1,1]],"
    "\"args\":[\"T\",\"value:6\",\"value:8\",\"value:9\"]},"
    "{\"name\":\"k_attention_kv_write_#\",\"node\":10,\"block\":256,\"grid\":[[16,0,256],[0,1,1],[0,1,1]],"
    "\"args\":[\"T\",\"value:9\",\"value:6\",\"kv_k:0\",\"kv_v:0\",\"slots\"]},"
    "{\"name\":\"k_attention_#\",\"node\":10,\"block\":256,\"grid\":[[1,0,1],[0,2,1],[0,8,1]],"
    "\"args\":[\"T\",\"value:9\",\"kv_k:0\",\"kv_v:0\",\"value:10\",\"positions\",\"table_off\",\"tables\","
    "\"block_size\"]}]}";

/* Is s (n bytes) 12 lower-case hex digits? */
static int is_hash(const char *s, size_t n)
{
    if (n != 12) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

/* text with the hash of every kernel name ("k_op_<12 hex>\"") replaced by #. */
static void mask_names(const char *text, ks_buf *out)
{
    for (const char *p = text; *p;) {
        const char *q = strchr(p, '"');
        size_t len = q ? (size_t)(q - p) : strlen(p);
        size_t tail = len >= 6 && strncmp(p + len - 6, "_large", 6) == 0 ? 6 : 0; /* a kernel's _large variant */
        const char *us = len >= 14 + tail ? p + len - tail - 13 : NULL;
        size_t keep = len;
        if (q && us && *us == '_' && is_hash(us + 1, 12) && strncmp(p, "k_", 2) == 0) keep = len - tail - 12;
        ks_buf_put(out, p, keep);
        if (keep != len) {
            ks_buf_puts(out, "#");
            ks_buf_put(out, p + len - tail, tail);
        }
        if (!q) break;
        ks_buf_puts(out, "\"");
        p = q + 1;
    }
}

/* Distinct kernel names of a meta. */
static int distinct_names(const krt_cuda_meta *m)
{
    int n = 0;
    for (int i = 0; i < m->n_kernels; i++) {
        int seen = 0;
        for (int j = 0; j < i; j++) seen |= strcmp(m->kernels[i].name, m->kernels[j].name) == 0;
        n += !seen;
    }
    return n;
}

/* Occurrences of needle in hay. */
static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

/* Two "layers" of norm + matmul over f32 weights, then a third matmul over
 * bf16 weights: the layers share their kernels, the bf16 one does not. */
static kir_graph *layered_graph(void)
{
    kir_graph *g = kir_graph_new("layered");
    kir_loc at = kir_loc_make(g, "layered.kiln", 1, 1);
    int64_t tab[2] = {16, 64}, norm[1] = {64}, wd[2] = {64, 64};
    kir_val x = add_node(g, KIR_OP_EMBED, kir_weight(g, "embed", KIR_F32, 2, tab, at), kir_input(g, KIR_ROLE_TOKENS, at));
    for (int l = 0; l < 3; l++) {
        char name[16];
        snprintf(name, sizeof name, "norm%d", l);
        kir_val nw = kir_weight(g, name, KIR_F32, 1, norm, at);
        kir_val h = tb_norm_at(g, small_loc(g), KIR_OP_RMS_NORM, x, nw, KIR_NONE, 1e-5);
        snprintf(name, sizeof name, "w%d", l);
        x = add_node(g, KIR_OP_MATMUL, h, kir_weight(g, name, l == 2 ? KIR_BF16 : KIR_F32, 2, wd, at));
    }
    tb_output_at(g, small_loc(g), x, "logits");
    return g;
}

static void test_generate(void)
{
    kir_graph *g = small_graph();
    sink s;
    sink_init(&s);
    krt_cuda_meta meta = {0};
    ks_buf src = {0}, text = {0}, again = {0}, masked = {0};
    CHECK(kcu_generate(g, &src, &meta, &s.d) == 0);
    CHECK_STR(sink_text(&s), "");
    const char *archs[2] = {"sm_80", "sm_90"};
    meta.archs = archs;
    meta.n_archs = 2;
    krt_cuda_meta_write(&meta, &text);
    mask_names(ks_buf_cstr(&text), &masked);
    CHECK_STR(ks_buf_cstr(&masked), small_meta);
    /* the matmul's signature and the comment above it, as a reader of --emit-source sees them */
    ks_buf want = {0};
    ks_buf_printf(&want,
                  "/* matmul: x w^T with f32 weights, fp32 sums (4-element loads; a warp for 2 rows when T <= 32) -> "
                  "f32[T,8] */\n"
                  "extern \"C\" __global__ void __launch_bounds__(256, 2) %s(int T, const float *__restrict__ x, const "
                  "float *__restrict__ w, float *__restrict__ out)\n{\n"
                  "    KCU_PDL_ENTER();\n"
                  "    kcu_matmul_small<float, 8, 8, 2>(T, x, w, kcu_pro_none(), kcu_epi_store<8>{out});\n}\n",
                  meta.kernels[2].name);
    CHECK(strstr(ks_buf_cstr(&src), ks_buf_cstr(&want)));
    want.len = 0;
    ks_buf_printf(&want, "__device__ const float %s_inv_freq[2] = {\n    1.0f, 0.00999999978f,\n};", meta.kernels[3].name);
    CHECK(strstr(ks_buf_cstr(&src), ks_buf_cstr(&want)));
    /* the device templates come first, verbatim */
    CHECK(strstr(ks_buf_cstr(&src), kcu_prelude) != NULL);

    /* reads back, and writes again to the same text */
    krt_cuda_meta back;
    CHECK(krt_cuda_meta_parse(text.data, text.len, "x.engine", &back, &s.d) == 0);
    krt_cuda_meta_write(&back, &again);
    CHECK_STR(ks_buf_cstr(&again), ks_buf_cstr(&text));
    CHECK(back.pdl == 1); /* every kernel opens with KCU_PDL_ENTER (engines before it: no "pdl", 0) */
    CHECK(back.n_kernels == 6 && krt_cuda_grid_dim(&back.kernels[2], 0, 5, 0) == 1 &&
          krt_cuda_grid_dim(&back.kernels[2], 0, 33, 0) == 1 && krt_cuda_grid_dim(&back.kernels[0], 0, 33, 0) == 2);
    krt_cuda_meta_free(&back);
    meta.archs = NULL;
    krt_cuda_meta_free(&meta);
    ks_buf_free(&src);
    ks_buf_free(&text);
    ks_buf_free(&again);
    ks_buf_free(&masked);
    ks_buf_free(&s.log);
    kir_graph_free(g);

    /* shared kernels: the two f32 layers launch the same two kernels (the third layer's norm prefetches
     * bf16 weights, fewer bytes: another text; kcu_l2_ahead, asked for: it is off by default) */
    g = layered_graph();
    sink_init(&s);
    krt_cuda_meta m2 = {0};
    const kcu_options ahead = {.l2_ahead_mb = 32};
    CHECK(kcu_generate_with(g, &ahead, &src, &m2, &s.d) == 0);
    CHECK_STR(sink_text(&s), "");
    CHECK(m2.n_kernels == 7 && distinct_names(&m2) == 5);
    if (m2.n_kernels == 7) {
        CHECK(strcmp(m2.kernels[1].name, m2.kernels[3].name) == 0 && strcmp(m2.kernels[1].name, m2.kernels[5].name) != 0);
        CHECK(strcmp(m2.kernels[2].name, m2.kernels[4].name) == 0 && strcmp(m2.kernels[2].name, m2.kernels[6].name) != 0);
        CHECK(m2.kernels[3].node == 8 && m2.kernels[3].args[1].index == 6 && m2.kernels[3].args[2].index == 7);
        /* the norm's last parameter: the next matmul's weight, prefetched into L2 before the norm waits */
        CHECK(m2.kernels[3].n_args == 5 && m2.kernels[3].args[4].index == 9);
        CHECK(count_of(ks_buf_cstr(&src), "    kcu_l2_ahead(ahead, 16384LL); /* the next matmul's weights */\n"
                                          "    KCU_PDL_ENTER();\n") == 2); /* the embedding's kernel too */
        /* each distinct kernel is in the source once */
        CHECK(count_of(ks_buf_cstr(&src), "__global__") == 7); /* and the two matmuls' _large variants */
        want.len = 0;
        ks_buf_printf(&want,
                      "void __launch_bounds__(256, 2) %s(int T, const float *__restrict__ x, const kcu_bf16 "
                      "*__restrict__ w, float *__restrict__ out)\n{\n    KCU_PDL_ENTER();\n"
                      "    kcu_matmul_small<kcu_bf16, 64, 64, 2>(T, x, w, "
                      "kcu_pro_none(), kcu_epi_store<64>{out});\n}\n",
                      m2.kernels[6].name);
        CHECK(strstr(ks_buf_cstr(&src), ks_buf_cstr(&want)));
    }
    krt_cuda_meta_free(&m2);
    ks_buf_free(&src);
    ks_buf_free(&s.log);
    kir_graph_free(g);

    /* an embedding table of f16 weights is read through kcu_f() */
    kir_graph *h = kir_graph_new("half");
    int64_t dims[2] = {4, 4};
    kir_val w = kir_weight(h, "w", KIR_F16, 2, dims, kir_loc_make(h, "half.kiln", 3, 7));
    kir_val tok = kir_input(h, KIR_ROLE_TOKENS, kir_loc_make(h, "half.kiln", 4, 7));
    kir_val e = add_node(h, KIR_OP_EMBED, w, tok);
    tb_output_at(h, small_loc(h), e, "logits");
    sink_init(&s);
    krt_cuda_meta m3 = {0};
    CHECK(kcu_generate(h, &src, &m3, &s.d) == 0);
    CHECK_STR(sink_text(&s), "");
    CHECK(strstr(ks_buf_cstr(&src), "(int T, const kcu_f16 *__restrict__ table, const int *__restrict__ ids, float "
                                    "*__restrict__ out)\n"));
    CHECK(strstr(ks_buf_cstr(&src), "    out[i] = kcu_f(table[(long long)ids[i / 4] * 4 + i % 4]);\n"));
    krt_cuda_meta_free(&m3);
    ks_buf_free(&src);
    ks_buf_free(&want);
    ks_buf_free(&s.log);
    kir_graph_free(h);
}

static void expect_meta_error(const char *text, const char *want)
{
    sink s;
    sink_init(&s);
    krt_cuda_meta m;
    CHECK(krt_cuda_meta_parse(text, strlen(text), "x.engine", &m, &s.d) == -1);
    CHECK_STR(sink_text(&s), want);
    ks_buf_free(&s.log);
}

static void test_meta_errors(void)
{
    expect_meta_error("[1]", "x.engine: error: damaged cuda.meta: not a JSON object\n");
    expect_meta_error("{\"format\":\"kiln-cuda-0\"}", "x.engine: error: damaged cuda.meta: format is not \"kiln-cuda-2\"\n");
    expect_meta_error("{\"format\":\"kiln-cuda-1\",\"archs\":[\"sm_90\"],\"output\":1,\"aliases\":[],"
                      "\"kernels\":[{\"name\":\"k\",\"node\":1,\"block\":32,\"grid\":[[0,1,1],[0,1,1],[0,1,1]],"
                      "\"args\":[\"T\",\"vals:3\"]}]}",
                      "x.engine: error: damaged cuda.meta: unknown kernel argument 'vals:3'\n");
    expect_meta_error("{\"format\":\"kiln-cuda-1\",\"archs\":[\"sm_90\"],\"output\":1,\"aliases\":[],"
                      "\"kernels\":[{\"name\":\"k\",\"node\":1,\"block\":2000,\"grid\":[],\"args\":[]}]}",
                      "x.engine: error: damaged cuda.meta: kernel block must be an integer in [0, 1025)\n");
    expect_meta_error("{\"format\":\"kiln-cuda-2\",\"archs\":[\"sm_90\"],\"output\":1,\"pdl\":1,\"aliases\":[],"
                      "\"kernels\":[]}",
                      "x.engine: error: damaged cuda.meta: pdl is not true or false\n");
    expect_meta_error("{\"format\":\"kiln-cuda-2\",\"archs\":[\"sm_90\"],\"output\":1,\"aliases\":[],"
                      "\"kernels\":[{\"name\":\"k\",\"node\":1,\"block\":32,\"large\":{\"name\":\"k_large\",\"above\":32,"
                      "\"per_seq\":1},\"grid\":[[0,1,1],[0,1,1],[0,1,1]],\"args\":[\"T\"]}]}",
                      "x.engine: error: damaged cuda.meta: kernel k: large.per_seq must be true or false\n");
}

/* A grid dim with a cap (a mixture of experts' grouped matmul: min(T k, experts) blocks): written back as
 * it was read (three numbers where there is no cap), its blocks capped; a dim of five numbers refused. */
static void test_grid_cap(void)
{
    static const char capped[] =
        "{\"format\":\"kiln-cuda-2\",\"archs\":[\"sm_90\"],\"output\":1,\"aliases\":[],\"kernels\":["
        "{\"name\":\"k\",\"node\":1,\"block\":256,\"grid\":[[0,12,1],[8,0,1,128],[0,1,1]],\"args\":[\"T\"]}]}";
    sink s;
    sink_init(&s);
    krt_cuda_meta m;
    CHECK(krt_cuda_meta_parse(capped, strlen(capped), "x.engine", &m, &s.d) == 0);
    if (m.n_kernels == 1) {
        CHECK(krt_cuda_grid_dim(&m.kernels[0], 1, 1, 0) == 8);     /* 1 token, 8 choices: 8 blocks */
        CHECK(krt_cuda_grid_dim(&m.kernels[0], 1, 16, 0) == 128);  /* 128: the cap reached */
        CHECK(krt_cuda_grid_dim(&m.kernels[0], 1, 32, 0) == 128);  /* 256 capped at 128 */
        CHECK(krt_cuda_grid_dim(&m.kernels[0], 0, 32, 0) == 12);   /* no cap */
        ks_buf again = {0};
        krt_cuda_meta_write(&m, &again);
        CHECK(strstr(ks_buf_cstr(&again), "\"grid\":[[0,12,1],[8,0,1,128],[0,1,1]]") != NULL);
        ks_buf_free(&again);
    }
    krt_cuda_meta_free(&m);
    ks_buf_free(&s.log);
    expect_meta_error("{\"format\":\"kiln-cuda-2\",\"archs\":[\"sm_90\"],\"output\":1,\"aliases\":[],"
                      "\"kernels\":[{\"name\":\"k\",\"node\":1,\"block\":32,\"grid\":[[0,1,1],[8,0,1,128,1],[0,1,1]],"
                      "\"args\":[\"T\"]}]}",
                      "x.engine: error: damaged cuda.meta: kernel k: a grid dim needs [t, c, div] or [t, c, div, cap]\n");
}

/* A kernel with variants for sm_90a (the gemm90 matmul, after a norm's own kernel above 64 tokens,
 * a wider tile above 4096): written, read back, written again to the same text; which runs when. */
static const char variant_meta[] =
    "{\"format\":\"kiln-cuda-2\",\"archs\":[\"sm_80\",\"sm_90a\"],\"output\":6,\"aliases\":[],\"kernels\":["
    "{\"name\":\"k6\",\"node\":6,\"block\":256,\"large\":{\"name\":\"k6_large\",\"above\":8},"
    "\"grid\":[[0,8,16],[0,1,1],[0,1,1]],\"args\":[\"T\",\"value:2\",\"value:5\",\"value:6\"],"
    "\"variants\":["
    "{\"arch\":\"sm_90a\",\"above\":64,\"launches\":["
    "{\"name\":\"k4_rms_norm\",\"block\":64,\"smem\":0,\"grid\":[[1,0,1],[0,1,1],[0,1,1]],"
    "\"args\":[\"T\",\"value:2\",\"value:3\",\"value:4\"]},"
    "{\"name\":\"k6_g90_128\",\"block\":384,\"smem\":197632,\"grid\":[[1,127,128],[0,48,1],[0,1,1]],"
    "\"args\":[\"T\",\"tmap:4:128\",\"tmap:5:64\",\"value:6\"]}]},"
    "{\"arch\":\"sm_90a\",\"above\":4096,\"launches\":["
    "{\"name\":\"k6_g90_256\",\"block\":384,\"smem\":197632,\"grid\":[[1,127,128],[0,24,1],[0,1,1]],"
    "\"args\":[\"T\",\"tmap:4:128\",\"tmap:5:64\",\"value:6\"]}]}]}]}";

static void test_variants(void)
{
    sink s;
    sink_init(&s);
    krt_cuda_meta m;
    ks_buf again = {0};
    if (CHECK(krt_cuda_meta_parse(variant_meta, strlen(variant_meta), "x.engine", &m, &s.d) == 0)) {
        krt_cuda_meta_write(&m, &again);
        CHECK_STR(ks_buf_cstr(&again), variant_meta);
        const krt_cuda_kernel *k = &m.kernels[0];
        CHECK(k->n_variants == 2 && k->variants[0].n_launches == 2 && k->variants[0].launches[1].smem == 197632);
        const krt_cuda_arg *a = &k->variants[0].launches[1].args[2];
        CHECK(a->kind == KRT_CUDA_ARG_TMAP && a->index == 5 && a->box == 64);
        /* which runs: sm_80 never takes them; sm_90a above 64 and above 4096 */
        CHECK(krt_cuda_pick_variant(k, "sm_80", 5000) == NULL);
        CHECK(krt_cuda_pick_variant(k, "sm_90a", 64) == NULL);
        CHECK(krt_cuda_pick_variant(k, "sm_90a", 65) == &k->variants[0]);
        CHECK(krt_cuda_pick_variant(k, "sm_90a", 4096) == &k->variants[0]);
        CHECK(krt_cuda_pick_variant(k, "sm_90a", 4097) == &k->variants[1]);
        CHECK(krt_cuda_launch_grid_dim(&k->variants[0].launches[1], 0, 129) == 2 &&
              krt_cuda_launch_grid_dim(&k->variants[0].launches[1], 1, 129) == 48);
        krt_cuda_meta_free(&m);
    }
    CHECK_STR(sink_text(&s), "");
    ks_buf_free(&again);
    ks_buf_free(&s.log);
    /* a kiln-cuda-1 meta reads (no variants); variants in one are damage, as is a bad tensor map */
    static const char v1[] = "{\"format\":\"kiln-cuda-1\",\"archs\":[\"sm_90\"],\"output\":1,\"aliases\":[],"
                             "\"kernels\":[{\"name\":\"k\",\"node\":1,\"block\":32,\"grid\":[[0,1,1],[0,1,1],[0,1,1]],"
                             "\"args\":[\"T\"]}]}";
    sink_init(&s);
    if (CHECK(krt_cuda_meta_parse(v1, strlen(v1), "x.engine", &m, &s.d) == 0)) {
        CHECK(m.kernels[0].n_variants == 0 && krt_cuda_pick_variant(&m.kernels[0], "sm_90", 100) == NULL);
        krt_cuda_meta_free(&m);
    }
    ks_buf_free(&s.log);
    expect_meta_error("{\"format\":\"kiln-cuda-1\",\"archs\":[\"sm_90\"],\"output\":1,\"aliases\":[],"
                      "\"kernels\":[{\"name\":\"k\",\"node\":1,\"block\":32,\"grid\":[[0,1,1],[0,1,1],[0,1,1]],"
                      "\"args\":[\"T\"],\"variants\":[]}]}",
                      "x.engine: error: damaged cuda.meta: kernel k: variants in a kiln-cuda-1 meta\n");
    expect_meta_error("{\"format\":\"kiln-cuda-2\",\"archs\":[\"sm_90a\"],\"output\":1,\"aliases\":[],"
                      "\"kernels\":[{\"name\":\"k\",\"node\":1,\"block\":32,\"grid\":[[0,1,1],[0,1,1],[0,1,1]],"
                      "\"args\":[\"T\"],\"variants\":[{\"arch\":\"sm_90a\",\"above\":8,\"launches\":["
                      "{\"name\":\"g\",\"block\":384,\"smem\":0,\"grid\":[[0,1,1],[0,1,1],[0,1,1]],"
                      "\"args\":[\"tmap:4:12\"]}]}]}]}",
                      "x.engine: error: damaged cuda.meta: unknown kernel argument 'tmap:4:12'\n");
    expect_meta_error("{\"format\":\"kiln-cuda-2\",\"archs\":[\"sm_90a\"],\"output\":1,\"aliases\":[],"
                      "\"kernels\":[{\"name\":\"k\",\"node\":1,\"block\":32,\"grid\":[[0,1,1],[0,1,1],[0,1,1]],"
                      "\"args\":[\"T\"],\"variants\":[{\"arch\":\"sm_90a\",\"above\":8,\"launches\":[]}]}]}",
                      "x.engine: error: damaged cuda.meta: kernel k: a variant needs 1 to 4 launches\n");
}

/* kcu_gemm90's column tiles (codegen/cuda/kcu_emit_g90.c) and the tile rule. */
static void test_g90_tiles(void)
{
    enum { N = 1024 };
    int64_t partner[N];
    kcu_g90_tiles t;
    /* neighbours (out-proj, down): plain tiles, no table; N odd leaves a single last column */
    for (int c = 0; c < N; c++) partner[c] = c ^ 1;
    CHECK(kcu_g90_plan_tiles(partner, N, 256, &t) == 0 && t.plain && t.nt == 4 && t.nbox == 1 && !t.table);
    partner[N - 2] = -1; /* N - 1 columns: the last alone */
    CHECK(kcu_g90_plan_tiles(partner, N - 1, 192, &t) == 0 && t.plain && t.nt == 6);
    /* gate/up: c with c + 512: tiles of 64 gate rows and the 64 up rows at the same place */
    for (int c = 0; c < N / 2; c++) partner[c] = c + N / 2, partner[c + N / 2] = c;
    if (CHECK(kcu_g90_plan_tiles(partner, N, 128, &t) == 0 && !t.plain && t.nbox == 2 && t.nt == 8)) {
        CHECK(t.table[0] == 1 && t.table[1] == 0 && t.table[2] == 512);
        CHECK(t.table[3 * 7] == 1 && t.table[3 * 7 + 1] == 448 && t.table[3 * 7 + 2] == 960);
    }
    free(t.table);
    /* q and k of heads of 128 rotated by halves (j with j + 64), then v: split tiles, then neighbours */
    for (int c = 0; c < N; c++) partner[c] = c < 768 ? (c % 128 < 64 ? c + 64 : c - 64) : c ^ 1;
    if (CHECK(kcu_g90_plan_tiles(partner, N, 256, &t) == 0 && !t.plain && t.nbox == 4 && t.nt == 4)) {
        static const int want[] = {1, 0, 128, 64, 192, 1, 256, 384, 320, 448, 1, 512, 640, 576, 704,
                                   0, 768, 832, 896, 960};
        CHECK(memcmp(t.table, want, sizeof want) == 0);
    }
    free(t.table);
    /* heads of 8 rotated by halves: boxes of 4 rows would be needed: no tiles */
    for (int c = 0; c < N; c++) partner[c] = c % 8 < 4 ? c + 4 : c - 4;
    CHECK(kcu_g90_plan_tiles(partner, N, 128, &t) == -1);
    /* the rule: the least waves (of 132 tiles) x width / efficiency. Llama-3-8B's q,k,v (96, 48, 33, -, 24
     * tiles): 64 at 65 tokens (96 tiles: 1 wave), 192 at 512 (132 tiles: 1 wave), 256 at 2048 (384: 3) */
    const int qkv[5] = {96, 48, 33, 0, 24};
    CHECK(kcu_g90_pick_bn(65, qkv) == 64 && kcu_g90_pick_bn(512, qkv) == 192 && kcu_g90_pick_bn(2048, qkv) == 256);
    /* o (64, 32, 22, 19, 16 tiles): 64 up to 256 tokens (a wave of 128 tiles), 128 at 512 */
    const int o[5] = {64, 32, 22, 19, 16};
    CHECK(kcu_g90_pick_bn(128, o) == 64 && kcu_g90_pick_bn(256, o) == 64 && kcu_g90_pick_bn(512, o) == 128 &&
          kcu_g90_pick_bn(2048, o) == 256);
    /* gate/up (448, 224, 150, 128, 112 tiles): 224 at 512 (512 tiles, 4 waves, where 256 takes 4 too), 256 at 2048 */
    const int gate_up[5] = {448, 224, 150, 128, 112};
    CHECK(kcu_g90_pick_bn(512, gate_up) == 224 && kcu_g90_pick_bn(2048, gate_up) == 256);
    const int lm_head[5] = {2004, 1002, 668, 573, 501};
    CHECK(kcu_g90_pick_bn(65, lm_head) == 256);
    const int no256[5] = {0, 48, 32, 0, 0}; /* 192 at 2048: 512 tiles in 4 waves where 128's 768 take 6 */
    CHECK(kcu_g90_pick_bn(2048, no256) == 192 && kcu_g90_stages(256) == 4 && kcu_g90_stages(224) == 5 &&
          kcu_g90_stages(128) == 6);
}

/* The decode matmul's plan (kcu_plan_gemv): R 4 columns a warp where the columns give every SM 1.25
 * blocks of 32 — Llama-3-8B's q,k,v (6144), gate/up (28672) and head (128256) —, R 2 below (o and
 * down: 4096); a block 8 R columns, two blocks an SM. */
static void test_gemv_plan(void)
{
    CHECK(kcu_plan_gemv(6144).rows == 4 && kcu_plan_gemv(28672).rows == 4 && kcu_plan_gemv(128256).rows == 4);
    CHECK(kcu_plan_gemv(4096).rows == 2 && kcu_plan_gemv(5279).rows == 2 && kcu_plan_gemv(5280).rows == 4);
    CHECK(kcu_plan_gemv(6144).cols == 32 && kcu_plan_gemv(4096).cols == 16 && kcu_plan_gemv(4096).per_sm == 2);
}

static void expect_target(const char *target, int want_n, const char *want_err)
{
    sink s;
    sink_init(&s);
    ks_arena a = {0};
    const char **archs = NULL;
    CHECK(kcu_parse_target(target, &a, &archs, &s.d) == want_n);
    CHECK_STR(sink_text(&s), want_err);
    ks_arena_free(&a);
    ks_buf_free(&s.log);
}

static void test_targets(void)
{
    CHECK(kcu_is_target("sm_90") && kcu_is_target("sm_80,sm_90") && !kcu_is_target("cpu") && !kcu_is_target("cuda"));
    expect_target("sm_80,sm_90", 2, "");
    expect_target("sm_90,sm_9x", -1,
                  "kiln: error: --target sm_90,sm_9x: 'sm_9x' is not a CUDA architecture of the form sm_NN (e.g. sm_90)\n");
    expect_target("sm_90,", -1,
                  "kiln: error: --target sm_90,: '' is not a CUDA architecture of the form sm_NN (e.g. sm_90)\n");
    expect_target("sm_90,sm_90", -1, "kiln: error: --target sm_90,sm_90: sm_90 is listed twice\n");

    const char *archs[] = {"sm_80", "sm_86", "sm_90"};
    CHECK(krt_cuda_pick_arch(archs, 3, 9, 0) == 2);
    CHECK(krt_cuda_pick_arch(archs, 3, 8, 9) == 1); /* sm_86 runs on 8.9 */
    CHECK(krt_cuda_pick_arch(archs, 3, 8, 0) == 0);
    CHECK(krt_cuda_pick_arch(archs, 3, 7, 5) == -1);
    CHECK(krt_cuda_pick_arch(archs, 3, 10, 0) == -1); /* cubins do not cross majors */
    /* sm_90a (the gemm90 kernels) runs on 9.0 alone, before sm_90 */
    const char *a90[] = {"sm_80", "sm_90a"}, *both[] = {"sm_90a", "sm_90"}, *a86[] = {"sm_86a"};
    CHECK(krt_cuda_pick_arch(a90, 2, 9, 0) == 1 && krt_cuda_pick_arch(a90, 2, 9, 1) == -1);
    CHECK(krt_cuda_pick_arch(both, 2, 9, 0) == 0 && krt_cuda_pick_arch(both, 2, 9, 2) == 1);
    CHECK(krt_cuda_pick_arch(a86, 1, 8, 9) == -1 && krt_cuda_pick_arch(a86, 1, 8, 6) == 0);
    const char *big[] = {"sm_100", "sm_120"};
    CHECK(krt_cuda_pick_arch(big, 2, 12, 0) == 1 && krt_cuda_pick_arch(big, 2, 10, 3) == 0);
}

/* ---- engines with extra sections --------------------------------------------------------- */
static int fill_ramp(void *ctx, kir_val node, void *dst, size_t nbytes, ks_diag *d)
{
    (void)ctx;
    (void)d;
    float *f = dst;
    for (size_t i = 0; i < nbytes / sizeof(float); i++) f[i] = (float)(node + 1) * 0.01f * (float)(i % 7);
    return 0;
}

/* Write the small graph as an engine for `target` with the given extra sections. */
static int write_engine(const char *path, const kir_graph *g, const char *target, const krt_engine_section *extra,
                        size_t n_extra, ks_diag *d)
{
    char meta[128];
    snprintf(meta, sizeof meta, "{\"target\": \"%s\", \"dtype\": \"f32\"}", target);
    krt_engine_spec spec = {.graph = g, .meta_json = meta, .fill = fill_ramp, .extra = extra, .n_extra = n_extra};
    return krt_engine_write(path, &spec, d);
}

static char work_dir[64];

static char *work_path(const char *name) { return ks_path_join(work_dir, name); }

static void test_sections(void)
{
    kir_graph *g = small_graph();
    sink s;
    sink_init(&s);
    char *path = work_path("sections.engine");
    const char blob[] = "\x7f" "ELF and more";
    krt_engine_section extra[2] = {{"cuda.meta", "{}", 2}, {"cuda.sm_90", blob, sizeof blob}};
    CHECK(write_engine(path, g, "cpu", extra, 2, &s.d) == 0);
    krt_engine *e = krt_engine_open(path, &s.d);
    CHECK(e != NULL);
    if (e) {
        size_t size = 0;
        const char *m = krt_engine_section_data(e, "cuda.meta", &size);
        CHECK(m && size == 2 && memcmp(m, "{}", 2) == 0);
        const char *b = krt_engine_section_data(e, "cuda.sm_90", &size);
        CHECK(b && size == sizeof blob && memcmp(b, blob, size) == 0);
        CHECK(krt_engine_section_data(e, "cuda.sm_80", &size) == NULL && size == 0);
        CHECK(krt_engine_section_data(e, "graph", &size) != NULL && size > 0);
        krt_engine_close(e);
    }
    CHECK_STR(sink_text(&s), "");
    krt_engine_section clash[1] = {{"weights", "x", 1}};
    CHECK(write_engine(path, g, "cpu", clash, 1, &s.d) == -1);
    krt_engine_section longname[1] = {{"cuda.sm_90_and_more", "x", 1}};
    CHECK(write_engine(path, g, "cpu", longname, 1, &s.d) == -1);
    ks_buf want = {0};
    ks_buf_printf(&want,
                  "%s: error: cannot add section 'weights': empty, longer than 15 bytes, or taken\n"
                  "%s: error: cannot add section 'cuda.sm_90_and_more': empty, longer than 15 bytes, or taken\n",
                  path, path);
    CHECK_STR(sink_text(&s), ks_buf_cstr(&want));
    ks_buf_free(&want);
    unlink(path);
    free(path);
    ks_buf_free(&s.log);
    kir_graph_free(g);
}

/* ---- the backend's errors ---------------------------------------------------------------- */
/* A session over a CUDA engine of the small graph whose cuda.meta lists
 * `archs`, with a fake cubin for sm_90 when with_cubin; the messages go to s. */
static void open_session_planned(const char *archs_json, int with_cubin, void (*plan)(kir_graph *g), sink *s)
{
    kir_graph *g = small_graph();
    krt_cuda_meta meta = {0};
    ks_buf src = {0}, text = {0};
    CHECK(kcu_generate(g, &src, &meta, &s->d) == 0);
    if (plan) plan(g);
    krt_cuda_meta_write(&meta, &text);
    /* swap in the archs (the writer put none) */
    const char *at = strstr(ks_buf_cstr(&text), "\"archs\":[]");
    KS_ASSERT(at);
    ks_buf fixed = {0};
    ks_buf_put(&fixed, text.data, (size_t)(at - text.data));
    ks_buf_printf(&fixed, "\"archs\":%s", archs_json);
    ks_buf_puts(&fixed, at + strlen("\"archs\":[]"));
    krt_engine_section extra[2] = {{"cuda.meta", fixed.data, fixed.len}, {"cuda.sm_90", "not a cubin", 11}};
    char *path = work_path("x.engine");
    CHECK(write_engine(path, g, "cuda", extra, with_cubin ? 2 : 1, &s->d) == 0);
    /* a plan that does not fit is refused when the engine opens (its
     * description), the rest when the session opens the backend */
    krt_engine *e = krt_engine_open(path, &s->d);
    CHECK(e != NULL || s->d.errors > 0); /* a damaged plan is refused at open, with a message the caller pins */
    krt_session *ses = e ? krt_session_new(e, NULL, &s->d) : NULL;
    CHECK(ses == NULL);
    krt_session_free(ses);
    krt_engine_close(e);
    unlink(path);
    free(path);
    krt_cuda_meta_free(&meta);
    ks_buf_free(&src);
    ks_buf_free(&text);
    ks_buf_free(&fixed);
    kir_graph_free(g);
}

static void open_session(const char *archs_json, int with_cubin, sink *s)
{
    open_session_planned(archs_json, with_cubin, NULL, s);
}

/* A memory plan for the small graph at 4 tokens, by hand (the inputs 64
 * bytes each, every computed value 128; views at their operand's bytes),
 * with one fault or none. */
static void set_plan(kir_graph *g, int64_t arena, int64_t view_at)
{
    static const kir_val own[] = {2, 4, 6, 9, 10};
    kir_attr_set_int(g, 1, KIR_A_ANY_MEM_OFFSET, 0);  /* tokens */
    kir_attr_set_int(g, 8, KIR_A_ANY_MEM_OFFSET, 64); /* positions */
    for (int i = 0; i < 5; i++) kir_attr_set_int(g, own[i], KIR_A_ANY_MEM_OFFSET, 128 + 128 * i);
    kir_attr_set_int(g, 7, KIR_A_ANY_MEM_OFFSET, view_at); /* a view of %6, at 384 */
    kir_attr_set_int(g, 11, KIR_A_ANY_MEM_OFFSET, 640);    /* views of %10 */
    kir_attr_set_int(g, 12, KIR_A_ANY_MEM_OFFSET, 640);
    for (kir_val v = 7; v <= 12; v += v == 7 ? 4 : 1) kir_attr_set_int(g, v, KIR_A_ANY_MEM_ALIAS, 1);
    kir_param_int(g, "mem.max_tokens", 4);
    kir_param_int(g, "mem.arena_bytes", arena);
}
static void plan_sound(kir_graph *g) { set_plan(g, 768, 384); }
static void plan_past_arena(kir_graph *g) { set_plan(g, 640, 384); }
static void plan_apart(kir_graph *g) { set_plan(g, 768, 0); }

/* A damaged plan is refused when the engine opens (kir_verify checks every
 * plan a graph carries), before the backend's own checks of it, which it
 * makes redundant, and before the driver is loaded; a sound one gets as far
 * as the driver. */
static void test_plan_errors(const char *path)
{
    sink s;
    ks_buf want = {0};
    sink_init(&s);
    open_session_planned("[\"sm_90\"]", 1, plan_sound, &s);
    CHECK_STR(sink_text(&s), "cuda: error: cannot load the NVIDIA driver library /nonexistent/libcuda.so.1 "
                             "(/nonexistent/libcuda.so.1: cannot open shared object file: No such file or "
                             "directory): running a CUDA engine needs an NVIDIA GPU and its driver\n");
    ks_buf_free(&s.log);
    sink_init(&s);
    open_session_planned("[\"sm_90\"]", 1, plan_past_arena, &s);
    ks_buf_printf(&want, "small.kiln:1:1: error: node %%10 (attention): mem.offset 640 + 128 bytes at 4 tokens is past "
                         "mem.arena_bytes 640\n"
                         "%s: error: damaged: its graph does not parse or verify\n", path);
    CHECK_STR(sink_text(&s), ks_buf_cstr(&want));
    ks_buf_free(&s.log);
    sink_init(&s);
    open_session_planned("[\"sm_90\"]", 1, plan_apart, &s);
    want.len = 0;
    ks_buf_printf(&want, "small.kiln:1:1: error: node %%7 (reshape): a view of %%6, so at its bytes [384,512), but at "
                         "[0,128)\n"
                         "%s: error: damaged: its graph does not parse or verify\n", path);
    CHECK_STR(sink_text(&s), ks_buf_cstr(&want));
    ks_buf_free(&s.log);
    ks_buf_free(&want);
}

/* ---- the build: the architectures compiled at once ---------------------------------------- */
static void test_build_archs(void)
{
    if (!kcu_have_nvrtc()) {
        printf("note: built without NVRTC: kcu_build's compiles are not checked\n");
        return;
    }
    kir_graph *g = small_graph();
    sink s;
    sink_init(&s);
    kcu_parts p;
    /* each cubin is what kcu_compile gives for that architecture alone (the emitted source) */
    if (CHECK(kcu_build(g, "sm_80,sm_90", work_dir, NULL, NULL, &p, &s.d) == 0)) {
        CHECK(p.n_archs == 2 && p.n_sections == 3);
        char *cu = work_path("small.cu");
        char *src = ks_read_file(&s.d, cu, NULL);
        for (int i = 0; src && i < p.n_archs; i++) {
            ks_buf alone = {0};
            CHECK(kcu_compile(src, "small.cu", p.archs[i], &alone, &s.d) == 0);
            CHECK_MSG(alone.len > 0 && alone.len == p.cubins[i].len &&
                          memcmp(alone.data, p.cubins[i].data, alone.len) == 0,
                      "%s: the build's cubin differs from a compile alone", p.archs[i]);
            ks_buf_free(&alone);
        }
        CHECK(src != NULL);
        free(src);
        unlink(cu);
        free(cu);
        kcu_parts_free(&p);
    }
    CHECK_STR(sink_text(&s), "");
    /* a failure: the messages of the first failing architecture, as a build in turn would stop there */
    CHECK(kcu_build(g, "sm_10,sm_20", NULL, NULL, NULL, &p, &s.d) == -1);
    CHECK(s.d.errors == 1 && p.cubins == NULL && p.n_sections == 0);
    CHECK_MSG(strncmp(sink_text(&s), "kiln: error: target sm_10: NVRTC ", 33) == 0 && !strstr(sink_text(&s), "sm_20:"),
              "got: %s", sink_text(&s));
    sink_free(&s);
    kir_graph_free(g);
}

/* kcu_cache: a hit gives back the bytes put for the same source and architecture; another
 * architecture, another source (a prefix of it, say) or a damaged entry is a miss; kcu_build
 * reads its cubins from KILN_CUDA_CACHE's folder (bytes no NVRTC made, to show they came from
 * there) and compiles what is not there. */
static void test_cubin_cache(void)
{
    char *dir = work_path("cache");
    const char *src = "extern \"C\" __global__ void k(float *x) { x[0] = 1; }\n";
    ks_buf put = {0}, got = {0};
    ks_buf_put(&put, "cubin\0bytes", 11);
    CHECK(kcu_cache_get(dir, src, "sm_80", &got) == 0 && got.len == 0); /* no folder yet */
    kcu_cache_put(dir, src, "sm_80", &put);
    CHECK(kcu_cache_get(dir, src, "sm_80", &got) == 1 && got.len == put.len && memcmp(got.data, put.data, put.len) == 0);
    ks_buf_clear(&got);
    CHECK(kcu_cache_get(dir, src, "sm_90", &got) == 0 && got.len == 0);
    char shorter[64];
    snprintf(shorter, sizeof shorter, "%.*s", (int)strlen(src) - 2, src);
    CHECK(kcu_cache_get(dir, shorter, "sm_80", &got) == 0 && got.len == 0);
    /* the one entry, cut short: a miss */
    DIR *dh = opendir(dir);
    struct dirent *de;
    int entries = 0;
    while (dh && (de = readdir(dh))) {
        if (de->d_name[0] == '.') continue;
        char *path = ks_path_join(dir, de->d_name);
        CHECK(truncate(path, 20) == 0);
        free(path);
        entries++;
    }
    if (dh) closedir(dh);
    CHECK(entries == 1);
    CHECK(kcu_cache_get(dir, src, "sm_80", &got) == 0 && got.len == 0);

    if (kcu_have_nvrtc()) {
        /* the small graph's source as kcu_build compiles it (emitted by a build for sm_10, which
         * NVRTC refuses before compiling; plain sm_90, without gemm90's variants: the same source
         * for both), then a build for sm_80,sm_90 with made-up bytes in the cache for both: no
         * NVRTC compile, and the engine holds the cache's bytes */
        kir_graph *g = small_graph();
        sink s;
        sink_init(&s);
        kcu_parts p;
        char *emit = work_path("emit");
        setenv("KILN_CUDA_GEMM90", "0", 1);
        CHECK(kcu_build(g, "sm_10", emit, NULL, NULL, &p, &s.d) == -1);
        char *cu = ks_path_join(emit, "small.cu");
        char *full = ks_read_file(&s.d, cu, NULL);
        ks_buf put90 = {0};
        ks_buf_put(&put90, "sm_90 bytes", 11);
        if (CHECK(full != NULL)) {
            kcu_cache_put(dir, full, "sm_80", &put);
            kcu_cache_put(dir, full, "sm_90", &put90);
        }
        sink_free(&s);
        sink_init(&s);
        setenv("KILN_CUDA_CACHE", dir, 1);
        if (CHECK(kcu_build(g, "sm_80,sm_90", NULL, NULL, NULL, &p, &s.d) == 0)) {
            CHECK_MSG(p.cubins[0].len == put.len && memcmp(p.cubins[0].data, put.data, put.len) == 0,
                      "sm_80's cubin is not the cache's");
            CHECK_MSG(p.cubins[1].len == put90.len && memcmp(p.cubins[1].data, put90.data, put90.len) == 0,
                      "sm_90's cubin is not the cache's");
            kcu_parts_free(&p);
        }
        unsetenv("KILN_CUDA_CACHE");
        unsetenv("KILN_CUDA_GEMM90");
        CHECK_STR(sink_text(&s), "");
        unlink(cu);
        rmdir(emit);
        free(cu);
        free(emit);
        free(full);
        ks_buf_free(&put90);
        sink_free(&s);
        kir_graph_free(g);
    }
    /* empty the folder: what the build stored, and the damaged entry */
    dh = opendir(dir);
    while (dh && (de = readdir(dh))) {
        if (de->d_name[0] == '.') continue;
        char *path = ks_path_join(dir, de->d_name);
        unlink(path);
        free(path);
    }
    if (dh) closedir(dh);
    CHECK(rmdir(dir) == 0);
    ks_buf_free(&put);
    ks_buf_free(&got);
    free(dir);
}

static void test_backend_errors(void)
{
    sink s;
    sink_init(&s);
    setenv("KILN_CUDA_LIB", "/nonexistent/libcuda.so.1", 1);
    open_session("[\"sm_90\"]", 1, &s);
    CHECK_STR(sink_text(&s), "cuda: error: cannot load the NVIDIA driver library /nonexistent/libcuda.so.1 "
                             "(/nonexistent/libcuda.so.1: cannot open shared object file: No such file or "
                             "directory): running a CUDA engine needs an NVIDIA GPU and its driver\n");
    ks_buf_free(&s.log);
    char *engine = work_path("x.engine");
    test_plan_errors(engine);
    free(engine);

    const char *emu = getenv("KILN_EMU_LIB");
    if (!emu) {
        printf("KILN_EMU_LIB not set: the errors seen through the libcuda stand-in are not checked\n");
        return;
    }
    setenv("KILN_CUDA_LIB", emu, 1);
    char *path = work_path("x.engine");
    ks_buf want = {0};

    sink_init(&s);
    setenv("KILN_EMU_CC", "7.5", 1);
    open_session("[\"sm_80\",\"sm_90\"]", 1, &s);
    ks_buf_printf(&want, "%s: error: the engine holds kernels for sm_80, sm_90; the GPU (kiln CPU emulator) is "
                         "sm_75, which runs none of them: rebuild the engine with --target sm_75\n",
                  path);
    CHECK_STR(sink_text(&s), ks_buf_cstr(&want));
    ks_buf_free(&s.log);

    sink_init(&s);
    setenv("KILN_EMU_CC", "9.0", 1);
    open_session("[\"sm_90\"]", 0, &s);
    want.len = 0;
    ks_buf_printf(&want, "%s: error: damaged: cuda.meta lists sm_90 but there is no 'cuda.sm_90' section\n", path);
    CHECK_STR(sink_text(&s), ks_buf_cstr(&want));
    ks_buf_free(&s.log);

    sink_init(&s);
    setenv("KILN_EMU_KERNELS", "/nonexistent/kernels.so", 1);
    open_session("[\"sm_90\"]", 1, &s);
    CHECK_STR(sink_text(&s), "cuda: error: cannot load the engine's sm_90 kernels: CUDA_ERROR_INVALID_VALUE: "
                             "invalid argument\n");
    ks_buf_free(&s.log);
    ks_buf_free(&want);
    free(path);
}

/* ---- helpers for cuda_build.sh ---------------------------------------------------------------- */
static int check_engine(int argc, char **argv)
{
    ks_diag d = {0};
    krt_engine *e = krt_engine_open(argv[2], &d);
    if (!e) return 1;
    int bad = 0;
    ks_buf scratch = {0};
    const char *target = krt_engine_meta(e, "target", "", &scratch);
    if (strcmp(target, "cuda") != 0) fprintf(stderr, "target is '%s', not cuda\n", target), bad = 1;
    const char *want_dtype = argv[3];
    const char *dtype = krt_engine_meta(e, "dtype", "", &scratch);
    if (strcmp(dtype, want_dtype) != 0) fprintf(stderr, "dtype is '%s', not %s\n", dtype, want_dtype), bad = 1;
    /* every weight of the dtype, packed at its size (plus alignment padding) */
    uint64_t elems = 0, bytes = 0;
    size_t n_weights = 0;
    for (size_t v = 0; v < e->graph->n_nodes; v++) {
        const kir_node *n = &e->graph->nodes[v];
        if (n->op != KIR_OP_WEIGHT) continue;
        if (strcmp(kir_dtype_name(n->dtype), want_dtype) != 0) {
            fprintf(stderr, "weight %%%zu is %s, not %s\n", v, kir_dtype_name(n->dtype), want_dtype);
            bad = 1;
        }
        elems += (uint64_t)kir_elems(n, 1);
        bytes += (uint64_t)kir_elems(n, 1) * kir_dtype_size(n->dtype);
        n_weights++;
    }
    if (e->weight_bytes < bytes || e->weight_bytes > bytes + (uint64_t)KRT_WEIGHT_ALIGN * n_weights) {
        fprintf(stderr, "the weights section holds %llu bytes for %llu bytes of weights\n",
                (unsigned long long)e->weight_bytes, (unsigned long long)bytes);
        bad = 1;
    }
    printf("%s: %s weights, %llu elements in %llu bytes;", argv[2], want_dtype, (unsigned long long)elems,
           (unsigned long long)e->weight_bytes);
    size_t size = 0;
    const char *text = krt_engine_section_data(e, KRT_CUDA_META_SECTION, &size);
    krt_cuda_meta meta;
    if (!text || krt_cuda_meta_parse(text, size, argv[2], &meta, &d) != 0) {
        fprintf(stderr, "no readable cuda.meta\n");
        bad = 1;
    } else {
        if (meta.n_archs != argc - 4) fprintf(stderr, "cuda.meta lists %d archs, expected %d\n", meta.n_archs, argc - 4), bad = 1;
        printf(" %d launches of %d kernels;", meta.n_kernels, distinct_names(&meta));
        krt_cuda_meta_free(&meta);
    }
    for (int i = 4; i < argc; i++) {
        ks_buf name = {0};
        /* a target's sm_90 is built as sm_90a (kcu_build: the gemm90 kernels) */
        ks_buf_printf(&name, "cuda.%s", strcmp(argv[i], "sm_90") == 0 ? KCU_GEMM90_ARCH : argv[i]);
        const uint8_t *cubin = krt_engine_section_data(e, ks_buf_cstr(&name), &size);
        if (!cubin || size < 64 || memcmp(cubin, "\x7f" "ELF", 4) != 0) {
            fprintf(stderr, "no ELF cubin in section %s\n", ks_buf_cstr(&name));
            bad = 1;
        } else {
            printf(" %s %zu bytes;", ks_buf_cstr(&name), size);
        }
        ks_buf_free(&name);
    }
    printf("\n");
    ks_buf_free(&scratch);
    krt_engine_close(e);
    return bad;
}

static float *read_floats(const char *path, size_t *n)
{
    ks_diag d = {0};
    size_t len = 0;
    char *bytes = ks_read_file(&d, path, &len);
    if (!bytes) return NULL;
    *n = len / sizeof(float);
    return (float *)bytes;
}

static int compare(char **argv)
{
    size_t na = 0, nb = 0;
    float *a = read_floats(argv[2], &na), *b = read_floats(argv[3], &nb);
    double tol = atof(argv[4]), maxd = 0, maxb = 0;
    int rc = 1;
    if (a && b && na == nb && na > 0) {
        for (size_t i = 0; i < na; i++) {
            double dd = fabs((double)a[i] - b[i]);
            if (!(dd <= maxd)) maxd = dd; /* NaN propagates */
            if (fabs(b[i]) > maxb) maxb = fabs(b[i]);
        }
        double rel = maxd / (maxb > 0 ? maxb : 1);
        printf("%zu logits: max|a-b|/max|b| = %.3g (tolerance %g)\n", na, rel, tol);
        rc = rel <= tol ? 0 : 1;
    } else {
        fprintf(stderr, "cannot compare %s (%zu floats) with %s (%zu floats)\n", argv[2], na, argv[3], nb);
    }
    free(a);
    free(b);
    return rc;
}

/* Prefill 6 tokens in sequence 0 with blocks of 4 positions (the second
 * block half full), fork it twice, and decode the three sequences together
 * with different tokens: the forks' first writes copy the shared block.
 * Appends every step's logits to out; 0 or -1 after reporting. */
static int fork_run(const char *path, ks_buf *out)
{
    ks_diag d = {0};
    krt_engine *e = krt_engine_open(path, &d);
    krt_session_opts opts = {.max_seqs = 4, .block_size = 4};
    krt_session *s = e ? krt_session_new(e, &opts, &d) : NULL;
    int rc = s ? 0 : -1;
    int64_t vocab = s ? krt_session_vocab(s) : 0;
    float *logits = ks_xmalloc(sizeof(float) * 6 * (size_t)(vocab ? vocab : 1));
    const int32_t prompt[6] = {1, 7, 12, 31, 5, 9}, zeros[6] = {0};
    if (!rc) rc = krt_session_seq_add(s, 0, &d) || krt_session_step(s, 6, prompt, zeros, logits, &d);
    if (!rc) ks_buf_put(out, logits, sizeof(float) * 6 * (size_t)vocab);
    if (!rc) rc = krt_session_seq_fork(s, 0, 1, &d);
    const int32_t t1[2] = {40, 41}, s1[2] = {0, 1};
    if (!rc) rc = krt_session_step(s, 2, t1, s1, logits, &d);
    if (!rc) ks_buf_put(out, logits, sizeof(float) * 2 * (size_t)vocab);
    if (!rc) rc = krt_session_seq_fork(s, 1, 2, &d);
    const int32_t t2[4] = {3, 8, 15, 2}, s2[4] = {2, 0, 1, 2};
    for (int step = 0; step < 3 && !rc; step++) {
        rc = krt_session_step(s, 4, t2, s2, logits, &d);
        if (!rc) ks_buf_put(out, logits, sizeof(float) * 4 * (size_t)vocab);
    }
    free(logits);
    krt_session_free(s);
    krt_engine_close(e);
    return rc ? -1 : 0;
}

static int fork_check(char **argv)
{
    ks_buf got = {0}, want = {0};
    int rc = 1;
    if (fork_run(argv[2], &got) == 0 && fork_run(argv[3], &want) == 0 && got.len == want.len && got.len > 0) {
        const float *a = (const float *)got.data, *b = (const float *)want.data;
        double maxd = 0, maxb = 0;
        for (size_t i = 0; i < got.len / sizeof(float); i++) {
            double dd = fabs((double)a[i] - b[i]);
            if (!(dd <= maxd)) maxd = dd;
            if (fabs(b[i]) > maxb) maxb = fabs(b[i]);
        }
        double rel = maxd / (maxb > 0 ? maxb : 1);
        printf("forked sequences, %zu logits: max|a-b|/max|b| = %.3g\n", got.len / sizeof(float), rel);
        rc = rel <= 1e-5 ? 0 : 1;
    }
    ks_buf_free(&got);
    ks_buf_free(&want);
    return rc;
}

/* kcu_options.flash_prefill: the attention's _large variant is the tensor-core prefill, in two plans:
 * 32-token warps (two m16 tiles each, 8 a head, 1 head a block: 256 tokens a block) and, for steps
 * where those would leave SMs idle (kcu_fa_few_blocks), 16-token warps (128 tokens a block), on the
 * short plan's grid ([ceil(T / 128), H / HB], the long plan's extra blocks return at once) with the
 * larger dynamic shared memory of the two (the long plan's q rows, 256, and two K and two V tiles of
 * 64 positions, rows of head_dim 4 padded to 24 elements: 24576 bytes), kept through cuda.meta;
 * off, nothing changes. */
static void test_flash_option(void)
{
    kir_graph *g = small_graph();
    sink s;
    sink_init(&s);
    krt_cuda_meta meta = {0}, back = {0};
    ks_buf src = {0}, text = {0}, masked = {0};
    kcu_options opt = {.flash_prefill = 1};
    CHECK(kcu_generate_with(g, &opt, &src, &meta, &s.d) == 0);
    CHECK_STR(sink_text(&s), "");
    const char *archs[1] = {"sm_90"};
    meta.archs = archs;
    meta.n_archs = 1;
    krt_cuda_meta_write(&meta, &text);
    mask_names(ks_buf_cstr(&text), &masked);
    CHECK(strstr(ks_buf_cstr(&masked), "{\"name\":\"k_attention_#\",\"node\":10,\"block\":256,\"large\":{\"name\":"
                                        "\"k_attention_#_large\",\"above\":32,\"per_seq\":true,\"grid\":[[0,2,1],[1,0,128],[0,1,1]],"
                                        "\"smem\":24576},"
                                        "\"grid\":[[1,0,1],[0,2,1],[0,8,1]],") != NULL);
    CHECK(strstr(ks_buf_cstr(&src), "if (kcu_fa_few_blocks(T, 256, 2))\n"
                                    "        kcu_flash_attention<kcu_bf16, float, float, float, 2, 2, 4, 4, 1, 8, 1, 64, 2, 0>") !=
          NULL);
    CHECK(strstr(ks_buf_cstr(&src), "    else\n"
                                    "        kcu_flash_attention<kcu_bf16, float, float, float, 2, 2, 4, 4, 1, 8, 2, 64, 2, 0>") !=
          NULL);
    if (CHECK(krt_cuda_meta_parse(text.data, text.len, "x.engine", &back, &s.d) == 0) && CHECK(back.n_kernels == 6)) {
        const krt_cuda_kernel *k = &back.kernels[5];
        /* chosen by the step's longest sequence: a prompt of 33 tokens takes the prefill kernel, 33
         * sequences of one token each (batched decode) the decode one, so a sequence's attention
         * is computed the same way whatever shares its step */
        CHECK(k->large_per_seq && krt_cuda_large(k, 33, 33) && !krt_cuda_large(k, 33, 1) && !krt_cuda_large(k, 300, 32));
        CHECK(krt_cuda_grid_dim(k, 0, 32, 0) == 32 && krt_cuda_grid_dim(k, 1, 32, 0) == 2);   /* today's kernel */
        CHECK(krt_cuda_grid_dim(k, 0, 300, 0) == 300);
        /* the prefill: head groups on x, token tiles on y (blocks start x first: longest rows first) */
        CHECK(krt_cuda_grid_dim(k, 1, 33, 1) == 1 && krt_cuda_grid_dim(k, 1, 300, 1) == 3);
        CHECK(krt_cuda_grid_dim(k, 0, 300, 1) == 2 && k->smem_large == 24576);
    }
    krt_cuda_meta_free(&back);
    meta.archs = NULL;
    krt_cuda_meta_free(&meta);
    ks_buf_free(&src);
    ks_buf_free(&text);
    ks_buf_free(&masked);
    ks_buf_free(&s.log);
    kir_graph_free(g);
}

/* kcu_matmul_tc's plan: one wave of one block an SM (Llama-3-8B's J), and its ring of shared memory
 * (what the targets' least opt-in leaves beside the static 40 kB, up to 112 kB: sm_80 and sm_90 alike),
 * kept through cuda.meta as the kernel's "smem". */
static void test_tc_plan(void)
{
    const kcu_options sm90 = {.smem_optin = kcu_arch_smem_optin("sm_90")}, sm80 = {.smem_optin = kcu_arch_smem_optin("sm_80")};
    const kcu_options sm89 = {.smem_optin = kcu_arch_smem_optin("sm_89")}, two = {.smem_optin = sm90.smem_optin, .tc_per_sm = 2};
    kcu_gemv_plan p = kcu_plan_gemv_tc(6144, 1, &sm90);
    CHECK(p.tc == 1 && p.rows == 3 && p.cols == 48 && p.per_sm == 1 && p.ring == 112 * 1024);
    CHECK(kcu_plan_gemv_tc(28672, 1, &sm90).rows == 14 && kcu_plan_gemv_tc(4096, 0, &sm90).rows == 2);
    CHECK(kcu_plan_gemv_tc(128256, 1, &sm90).rows == 61 && kcu_plan_gemv_tc(16, 0, &sm90).rows == 1);
    CHECK(kcu_plan_gemv_tc(6144, 1, &sm80).ring == 112 * 1024 && kcu_plan_gemv_tc(6144, 1, &sm89).ring == 48 * 1024);
    CHECK(kcu_plan_gemv(4096).ring == 0 && sm89.smem_optin >= KCU_TC_MIN_OPTIN && kcu_arch_smem_optin("sm_75") < KCU_TC_MIN_OPTIN);
    const kcu_gemv_plan p2 = kcu_plan_gemv_tc(6144, 1, &two); /* KILN_CUDA_TC_PER_SM=2 */
    CHECK(p2.per_sm == 2 && p2.rows == 2 && p2.ring == 64 * 1024);
    krt_cuda_meta meta = {0}, back = {0};
    krt_cuda_kernel k = {.name = "k_mm", .node = 3, .block = 256, .smem = p.ring};
    k.grid[0][1] = 6144, k.grid[0][2] = p.cols, k.grid[1][1] = k.grid[1][2] = k.grid[2][1] = k.grid[2][2] = 1;
    const char *archs[1] = {"sm_90"};
    meta.archs = archs, meta.n_archs = 1, meta.kernels = &k, meta.n_kernels = 1;
    ks_buf text = {0};
    krt_cuda_meta_write(&meta, &text);
    CHECK(strstr(ks_buf_cstr(&text), "{\"name\":\"k_mm\",\"node\":3,\"block\":256,\"smem\":114688,") != NULL);
    sink s;
    sink_init(&s);
    if (CHECK(krt_cuda_meta_parse(text.data, text.len, "x.engine", &back, &s.d) == 0) && CHECK(back.n_kernels == 1))
        CHECK(back.kernels[0].smem == 114688 && back.kernels[0].smem_large == 0);
    krt_cuda_meta_free(&back);
    ks_buf_free(&text);
    ks_buf_free(&s.log);
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--fork-check") == 0) return fork_check(argv);
    if (argc >= 5 && strcmp(argv[1], "--check-engine") == 0) return check_engine(argc, argv);
    if (argc == 5 && strcmp(argv[1], "--compare") == 0) return compare(argv);
    snprintf(work_dir, sizeof work_dir, "/tmp/kiln_cuda_test.XXXXXX");
    if (!mkdtemp(work_dir)) return 1;
    test_generate();
    test_flash_option();
    test_tc_plan();
    test_meta_errors();
    test_grid_cap();
    test_targets();
    test_variants();
    test_g90_tiles();
    test_gemv_plan();
    test_sections();
    test_build_archs();
    test_cubin_cache();
    test_backend_errors();
    rmdir(work_dir);
    return check_finish("test_cuda");
}
