/*
 * test_random_graphs.c — the pass pipeline on random graphs, checked by the
 * interpreter: for each graph, the pipeline runs with the verifier after
 * every pass and every pass's output reads back to the same text; then the
 * unfused and the fused graph run the same steps (a prefill of two
 * sequences interleaved, then a decode step of both) and must give
 * bit-identical outputs and KV caches.
 *
 * The generator makes what the passes look for, at random and mixed with
 * everything else: matmuls sharing an input (with biases on all, some or
 * none, weights of mixed dtypes, unrelated nodes between them), elementwise
 * chains, residual adds, norms with one use or several, slices, concats,
 * attention blocks with grouped-query K/V and RoPE, dead nodes, and weights
 * declared far from their use. Nodes are made with kir_build
 * (tests/graph_build.h): a node the generator gets wrong aborts the test.
 * env: KILN_PASS_SEED, KILN_PASS_ROUNDS (defaults 7, 300).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/interp/interp.h"
#include "tests/check.h"
#include "tests/ir/ir_test.h"
#include "passes/derived_weight.h"
#include "passes/pipeline.h"
#include "tests/graph_build.h"

/* ---- random numbers ---------------------------------------------------------------------- */
static uint64_t next_u64(uint64_t *s)
{
    *s ^= *s << 13; /* xorshift64 (Marsaglia 2003) */
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}
static int below(uint64_t *s, int n) { return (int)(next_u64(s) % (uint64_t)n); }
static int chance(uint64_t *s, int percent) { return below(s, 100) < percent; }
static float uniform(uint64_t *s) { return (float)(next_u64(s) >> 40) / (float)(1 << 24) * 2.0f - 1.0f; }

/* ---- the generator ------------------------------------------------------------------------- */
enum { MAX_ACTS = 256 };

typedef struct gen {
    kir_graph *g;            /* the graph built */
    uint64_t *rng;           /* random state */
    kir_val acts[MAX_ACTS];  /* 2-D activations [T,N] to build on */
    int n_acts;              /* entries in acts */
    kir_val positions;       /* the positions input */
    int n_weights;           /* weights made, for names */
    int n_layers;            /* attention layers made */
} gen;

static const kir_node *N(const gen *s, kir_val v) { return kir_node_at(s->g, v); }

/* No location: the nodes come from no text. */
static const kir_loc nowhere = {UINT32_MAX, 0, 0};

static kir_val act(gen *s, kir_val v)
{
    if (s->n_acts < MAX_ACTS) s->acts[s->n_acts++] = v;
    return v;
}

static kir_val weight(gen *s, int ndim, int64_t d0, int64_t d1, int mixed)
{
    static const kir_dtype types[] = {KIR_F32, KIR_F32, KIR_F16, KIR_BF16};
    char name[32];
    snprintf(name, sizeof name, "w%d", s->n_weights++);
    int64_t dims[2] = {d0, d1};
    return kir_weight(s->g, name, mixed ? types[below(s->rng, 4)] : KIR_F32, ndim, dims, nowhere);
}

/* op(a) or op(a, b): an op without attributes. */
static kir_val node(gen *s, kir_op op, kir_val a, kir_val b) { return tb_op(s->g, op, nowhere, a, b); }

static kir_val pick(gen *s) { return s->acts[below(s->rng, s->n_acts)]; }
static int64_t width(const gen *s, kir_val v) { return N(s, v)->dims[1]; }

/* An activation as wide as v other than v, or KIR_NONE. */
static kir_val pick_like(gen *s, kir_val v)
{
    for (int tries = 0; tries < 12; tries++) {
        kir_val w = pick(s);
        if (w != v && width(s, w) == width(s, v)) return w;
    }
    return KIR_NONE;
}

static kir_val reshape(gen *s, kir_val x, int64_t a, int64_t b)
{
    int64_t shape[3] = {KIR_DIM_T, a, b};
    return tb_reshape_at(s->g, nowhere, x, b ? 3 : 2, shape);
}

static kir_val rope(gen *s, kir_val x)
{
    tb_rope_attrs r = tb_rope_plain(N(s, x)->dims[2]);
    r.style = chance(s->rng, 50) ? KIR_ROPE_STYLE_HALVES : KIR_ROPE_STYLE_PAIRS;
    return tb_rope_at(s->g, nowhere, x, s->positions, &r);
}

/* Matmuls of one input, each maybe with a bias, maybe with other nodes
 * between them; their weights maybe declared first, all together. */
static void siblings(gen *s)
{
    kir_val x = pick(s);
    int n = 1 + below(s->rng, 3), early = chance(s->rng, 40), all_bias = chance(s->rng, 50);
    kir_val w[3];
    int64_t k = width(s, x), widths[3];
    for (int i = 0; i < n; i++) {
        widths[i] = 2 * (1 + below(s->rng, 4));
        if (early) w[i] = weight(s, 2, widths[i], k, 1);
    }
    for (int i = 0; i < n; i++) {
        if (!early) w[i] = weight(s, 2, widths[i], k, 1);
        kir_val m = node(s, KIR_OP_MATMUL, x, w[i]);
        if (all_bias || chance(s->rng, 30)) {
            kir_val b = weight(s, 1, widths[i], 0, 0);
            m = node(s, KIR_OP_ADD, m, b);
        }
        act(s, m);
        if (chance(s->rng, 30)) act(s, node(s, KIR_OP_SILU, pick(s), KIR_NONE));
    }
}

/* q, k, v from one input (grouped-query K/V, maybe RoPE), attention, back to 2-D. */
static void attention(gen *s)
{
    kir_val x = pick(s);
    int64_t k = width(s, x), kv_heads = 1 + below(s->rng, 2), dv = chance(s->rng, 50) ? 4 : 2;
    kir_val q = reshape(s, node(s, KIR_OP_MATMUL, x, weight(s, 2, 8, k, 0)), 2, 4);
    kir_val kk = reshape(s, node(s, KIR_OP_MATMUL, x, weight(s, 2, kv_heads * 4, k, 0)), kv_heads, 4);
    kir_val v = reshape(s, node(s, KIR_OP_MATMUL, x, weight(s, 2, kv_heads * dv, k, 0)), kv_heads, dv);
    if (chance(s->rng, 70)) {
        q = rope(s, q);
        kk = rope(s, kk);
    }
    int64_t window = chance(s->rng, 20) ? 2 : 0;
    kir_val a = tb_attention_at(s->g, nowhere, q, kk, v, s->n_layers++, 0.5, window, 0.0);
    act(s, reshape(s, a, 2 * dv, 0));
}

static void random_step(gen *s)
{
    kir_val a = pick(s);
    switch (below(s->rng, 11)) {
    case 0:
    case 1: siblings(s); return;
    case 2: {
        static const kir_op unary[] = {KIR_OP_SILU, KIR_OP_GELU,    KIR_OP_GELU_TANH, KIR_OP_RELU,
                                       KIR_OP_TANH, KIR_OP_SIGMOID, KIR_OP_SOFTMAX};
        act(s, node(s, unary[below(s->rng, 7)], a, KIR_NONE));
        return;
    }
    case 3: { /* residual add, SwiGLU-like mul, sub, max, min */
        kir_val b = pick_like(s, a);
        if (b == KIR_NONE) return;
        static const kir_op binary[] = {KIR_OP_ADD, KIR_OP_MUL, KIR_OP_SUB, KIR_OP_MAX, KIR_OP_MIN};
        act(s, node(s, binary[below(s->rng, 5)], a, b));
        return;
    }
    case 4: { /* a norm, sometimes of a fresh residual sum */
        if (chance(s->rng, 40)) {
            kir_val b = pick_like(s, a);
            if (b != KIR_NONE) a = act(s, node(s, KIR_OP_ADD, b, a));
        }
        kir_op op = chance(s->rng, 50) ? KIR_OP_RMS_NORM : KIR_OP_LAYER_NORM;
        kir_val w = chance(s->rng, 70) ? weight(s, 1, width(s, a), 0, 0) : KIR_NONE;
        kir_val v = tb_norm_at(s->g, nowhere, op, a, w, KIR_NONE, 1e-5);
        /* a layer_norm ends in an absent operand written out, as IR text may have it: (a, w, _) or (a, _) */
        if (op == KIR_OP_LAYER_NORM) tb_pad_operands(s->g, v, kir_node_at(s->g, v)->nin + 1);
        act(s, v);
        return;
    }
    case 5: { /* slice */
        int64_t w = width(s, a);
        if (w < 2) return;
        int64_t start = below(s->rng, (int)w - 1), end = start + 1 + below(s->rng, (int)(w - start - 1));
        act(s, tb_slice_at(s->g, nowhere, a, start, end));
        return;
    }
    case 6: attention(s); return;
    case 7: { /* concat of two, kept narrow */
        kir_val b = pick(s);
        act(s, node(s, KIR_OP_CONCAT, a, width(s, a) + width(s, b) <= 32 ? b : KIR_NONE));
        return;
    }
    case 8: { /* a dead node and an unused weight */
        node(s, KIR_OP_RELU, a, KIR_NONE);
        weight(s, 1, 4, 0, 0);
        return;
    }
    case 9: { /* a bias add on anything */
        act(s, node(s, KIR_OP_ADD, a, weight(s, 1, width(s, a), 0, 0)));
        return;
    }
    default: {
        act(s, tb_scale_at(s->g, nowhere, a, 0.5));
        return;
    }
    }
}

static kir_graph *random_graph(uint64_t *rng)
{
    gen s = {.g = kir_graph_new("random"), .rng = rng};
    kir_val tokens = kir_input(s.g, KIR_ROLE_TOKENS, nowhere);
    s.positions = kir_input(s.g, KIR_ROLE_POSITIONS, nowhere);
    kir_val table = weight(&s, 2, 32, 8 + 4 * below(rng, 3), 0);
    act(&s, node(&s, KIR_OP_EMBED, table, tokens));
    int steps = 4 + below(rng, 30);
    for (int i = 0; i < steps; i++) random_step(&s);
    tb_output_at(s.g, nowhere, s.acts[s.n_acts - 1], "logits");
    return s.g;
}

/* ---- weights ------------------------------------------------------------------------------ */

/* Random data for every plain weight of g, in its dtype (heap, per node). */
static void **random_weights(const kir_graph *g, uint64_t *rng)
{
    void **w = calloc(g->n_nodes, sizeof *w);
    for (size_t v = 0; v < g->n_nodes; v++) {
        const kir_node *n = &g->nodes[v];
        if (n->op != KIR_OP_WEIGHT) continue;
        size_t ne = (size_t)kir_elems(n, 1);
        uint8_t *data = malloc(ne * kir_dtype_size(n->dtype));
        for (size_t i = 0; i < ne; i++) {
            float f = uniform(rng);
            uint16_t h;
            switch (n->dtype) {
            case KIR_F32: memcpy(data + 4 * i, &f, 4); break;
            case KIR_F16: h = ks_f32_to_f16(f); memcpy(data + 2 * i, &h, 2); break;
            case KIR_BF16: h = ks_f32_to_bf16(f); memcpy(data + 2 * i, &h, 2); break;
            default: KS_UNREACHABLE();
            }
        }
        w[v] = data;
    }
    return w;
}

/* The weights of the fused graph: plain ones by name from base's, derived
 * ones with kp_derive_weight. */
static void **fused_weights(const kir_graph *base_g, void **base, const kir_graph *g)
{
    void **w = calloc(g->n_nodes, sizeof *w);
    for (size_t v = 0; v < g->n_nodes; v++) {
        const kir_node *n = &g->nodes[v];
        if (n->op != KIR_OP_WEIGHT) continue;
        ks_arena arena = {0};
        kp_weight_recipe r;
        CHECK(kp_weight_recipe_of(g, (kir_val)v, &arena, &r) == 0);
        size_t n_names = r.n_sources ? r.n_sources : 1;
        const void **src = calloc(n_names, sizeof *src);
        for (size_t i = 0; i < n_names; i++) {
            const char *name = r.n_sources ? r.names[i] : kir_get_str(g, (kir_val)v, "name", "");
            for (size_t b = 0; b < base_g->n_nodes && !src[i]; b++) {
                const char *bname = kir_get_str(base_g, (kir_val)b, "name", "");
                if (base_g->nodes[b].op == KIR_OP_WEIGHT && strcmp(bname, name) == 0) src[i] = base[b];
            }
            CHECK(src[i] != NULL);
        }
        size_t bytes = (size_t)kir_elems(n, 1) * kir_dtype_size(n->dtype);
        w[v] = malloc(bytes);
        if (r.n_sources)
            kp_derive_weight(g, (kir_val)v, &r, src, w[v]);
        else if (src[0])
            memcpy(w[v], src[0], bytes);
        free(src);
        ks_arena_free(&arena);
    }
    return w;
}

static void free_weights(const kir_graph *g, void **w)
{
    for (size_t v = 0; v < g->n_nodes; v++) free(w[v]);
    free(w);
}

/* ---- running ------------------------------------------------------------------------------- */

/* Run g: a prefill of 5 tokens of two sequences interleaved, then a decode
 * step of both; out gets both steps' outputs, cache every layer's K and V
 * rows of the 7 positions. Returns floats written to out, or -1. */
static int64_t run(const kir_graph *g, void **w, float *out, float *cache, ks_buf *log)
{
    ks_diag d = {.log = log, .quiet = 1};
    krt_desc desc;
    if (krt_desc_init(&desc, g, "random", &d) != 0) return -1;
    int n_layers = desc.n_kv_layers;
    const krt_kv_layer *layers = desc.kv_layers;
    krt_kv_config cfg = {n_layers, layers, 4, 8, 2, 16, sizeof(float), 0};
    krt_kv *kv = n_layers ? krt_kv_new(&cfg, &krt_kv_host_storage, &d) : NULL;
    krt_interp *it = krt_interp_new(&desc, (const void *const *)w, kv, &d);
    int64_t row = desc.vocab, written = -1;
    const char *why = NULL;
    if (it && (!kv || (krt_kv_seq_add(kv, 0, &why) == 0 && krt_kv_seq_add(kv, 1, &why) == 0 &&
                       krt_kv_seq_reserve(kv, 0, 4, &why) == 0 && krt_kv_seq_reserve(kv, 1, 3, &why) == 0))) {
        int32_t tok[7] = {3, 17, 5, 30, 11, 8, 21}, pos[7] = {0, 0, 1, 1, 2, 3, 2}, seq[7] = {0, 1, 0, 1, 0, 0, 1};
        krt_step a = {5, tok, pos, seq}, b = {2, tok + 5, pos + 5, seq + 5};
        if (krt_interp_step(it, &a, out, &d) == 0 && krt_interp_step(it, &b, out + 5 * row, &d) == 0)
            written = 7 * row;
        size_t at = 0;
        for (int l = 0; l < n_layers && kv; l++) {
            int64_t krow = (int64_t)layers[l].kv_heads * layers[l].head_dim_k;
            int64_t vrow = (int64_t)layers[l].kv_heads * layers[l].head_dim_v;
            for (int t = 0; t < 7; t++) {
                int64_t slot = krt_kv_slot(kv, seq[t], pos[t]);
                memcpy(cache + at, (float *)krt_kv_k(kv, l) + slot * krow, sizeof(float) * (size_t)krow);
                at += (size_t)krow;
                memcpy(cache + at, (float *)krt_kv_v(kv, l) + slot * vrow, sizeof(float) * (size_t)vrow);
                at += (size_t)vrow;
            }
        }
    }
    krt_interp_free(it);
    krt_kv_free(kv);
    krt_desc_free(&desc);
    return written;
}

static int after_pass(void *ctx, const kp_pass *pass, const kir_graph *g, const kp_pass_stats *st, ks_diag *d)
{
    (void)ctx, (void)st, (void)d;
    ks_buf a = {0}, b = {0}, log = {0};
    kir_print(g, &a);
    kir_graph *back = kt_parse("after.ir", ks_buf_cstr(&a), &log);
    if (back) kir_print(back, &b);
    int same = back && a.len == b.len && memcmp(a.data, b.data, a.len) == 0;
    if (!same) fprintf(stderr, "after %s: the text does not read back the same\n", pass->name);
    CHECK(same);
    kir_graph_free(back);
    ks_buf_free(&a);
    ks_buf_free(&b);
    ks_buf_free(&log);
    return 0;
}

int main(void)
{
    const char *seed_env = getenv("KILN_PASS_SEED"), *rounds_env = getenv("KILN_PASS_ROUNDS");
    uint64_t seed = seed_env ? strtoull(seed_env, NULL, 10) : 7;
    int rounds = rounds_env ? atoi(rounds_env) : 300;
    size_t kernels_before = 0, kernels_after = 0, merged = 0;
    enum { MAX_FLOATS = 1 << 16 };
    float *oa = malloc(sizeof(float) * MAX_FLOATS), *ob = malloc(sizeof(float) * MAX_FLOATS);
    float *ca = calloc(MAX_FLOATS, sizeof(float)), *cb = calloc(MAX_FLOATS, sizeof(float));
    for (int i = 0; i < rounds; i++) {
        uint64_t rng = seed * 6364136223846793005ull + (uint64_t)i * 1442695040888963407ull + 1;
        int before = failures;
        kir_graph *g = random_graph(&rng);
        ks_buf log = {0};
        ks_diag d = {.log = &log, .quiet = 1};
        CHECK(kir_verify(g, &d, "random") == 0);
        kir_graph *f = kir_graph_clone(g);
        kp_options opt = {.verify = 1, .after = after_pass};
        kp_pass_stats *st = NULL;
        size_t n_st = 0;
        CHECK(kp_run_pipeline(&f, &opt, &st, &n_st, &d) == 0);
        if (n_st) merged += st[0].fusions;
        free(st);
        kernels_before += kp_count_kernels(g);
        kernels_after += kp_count_kernels(f);
        void **wa = random_weights(g, &rng), **wb = fused_weights(g, wa, f);
        int64_t na = run(g, wa, oa, ca, &log), nb = run(f, wb, ob, cb, &log);
        CHECK(na > 0 && na == nb && na < MAX_FLOATS);
        if (na > 0 && na == nb) {
            CHECK(memcmp(oa, ob, sizeof(float) * (size_t)na) == 0);
            CHECK(memcmp(ca, cb, sizeof(float) * MAX_FLOATS) == 0);
        }
        if (failures != before) {
            ks_buf text = {0};
            kir_print(g, &text);
            fprintf(stderr, "round %d (KILN_PASS_SEED=%llu): %s\n--- graph:\n%s", i, (unsigned long long)seed,
                    ks_buf_cstr(&log), ks_buf_cstr(&text));
            ks_buf_free(&text);
            i = rounds; /* one failing graph is enough to read */
        }
        free_weights(g, wa);
        free_weights(f, wb);
        kir_graph_free(g);
        kir_graph_free(f);
        ks_buf_free(&log);
    }
    printf("%d random graphs: %zu kernels unfused, %zu fused; %zu sibling sets merged\n", rounds, kernels_before,
           kernels_after, merged);
    free(oa);
    free(ob);
    free(ca);
    free(cb);
    return check_finish("test_random_graphs");
}
