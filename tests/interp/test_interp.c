/*
 * test_interp.c — the reference interpreter (runtime/interp/interp.c, runtime/interp/interp_kernels.c).
 *
 * Each op runs in a tiny graph built with kir_build (tests/graph_build.h) and is compared
 * with a naive reference written here (in double where rounding matters).
 * RoPE frequencies with llama3 and linear scaling are pinned to values
 * computed once with numpy in float32, following Hugging Face's
 * _compute_default_rope_parameters / _compute_llama3_parameters step by
 * step (the script is at the end of this file). The last tests run a small
 * random two-layer Llama-like graph through the paged KV cache: one prefill,
 * token by token, two sequences interleaved in one step, and a fork, which
 * must all give the same logits; and they pin the step's error messages.
 */
#include "runtime/interp/interp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/interp/interp_kernels.h"
#include "tests/check.h"
#include "tests/graph_build.h"

/* |got - want| <= tol for n values; reports the first miss. */
static void check_close(const char *what, const float *got, const double *want, int64_t n, double tol)
{
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= tol)) {
            check_at(0, __FILE__, __LINE__, "%s: element %lld: got %.9g, want %.9g (|diff| %.3g > %.3g)", what,
                     (long long)i, (double)got[i], want[i], e, tol);
            return;
        }
    }
    checks++;
}

static void check_same(const char *what, const float *got, const float *want, int64_t n, double tol)
{
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - (double)want[i]);
        if (!(e <= tol)) {
            check_at(0, __FILE__, __LINE__, "%s: element %lld: got %.9g, want %.9g (|diff| %.3g > %.3g)", what,
                     (long long)i, (double)got[i], (double)want[i], e, tol);
            return;
        }
    }
    checks++;
}

/* ---- random numbers ------------------------------------------------------------- */
static uint32_t rng_state = 2463534242u;

static float uniform(float lo, float hi)
{
    rng_state ^= rng_state << 13; /* xorshift32 (Marsaglia 2003) */
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return lo + (hi - lo) * (float)(rng_state >> 8) / (float)(1 << 24);
}

static float *random_floats(int64_t n, float scale)
{
    float *p = ks_xmalloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) p[i] = uniform(-scale, scale);
    return p;
}

/* ---- building test graphs ---------------------------------------------------------- */
enum { TG_MAX_NODES = 512, TG_MAX_OWNED = 128 };

typedef struct tgraph {
    kir_graph *g;                    /* the graph */
    const void *w[TG_MAX_NODES];     /* data of each WEIGHT node */
    void *owned[TG_MAX_OWNED];       /* buffers this test allocated for weights */
    int n_owned;                     /* entries in owned */
    kir_val tokens, positions;       /* the inputs, KIR_NONE until used */
    int n_weights;                   /* weights made, for unique names */
    krt_desc desc;                   /* the graph's description, once tg_interp made one */
    int described;                   /* 1: desc holds one */
} tgraph;

static void tg_init(tgraph *t, const char *name)
{
    memset(t, 0, sizeof *t);
    t->g = kir_graph_new(name);
    t->tokens = t->positions = KIR_NONE;
    kir_param_int(t->g, "max_context", 1 << 20); /* the positions the tests use (70000 for RoPE) */
}

static void tg_free(tgraph *t)
{
    for (int i = 0; i < t->n_owned; i++) free(t->owned[i]);
    if (t->described) krt_desc_free(&t->desc);
    kir_graph_free(t->g);
}

/* Describe the graph once it is built (runtime/desc.h); 0 or -1 after
 * reporting. Later calls keep the description (interpreters point at it). */
static int tg_describe(tgraph *t, ks_diag *d)
{
    if (!t->described) t->described = krt_desc_init(&t->desc, t->g, t->g->name, d) == 0;
    return t->described ? 0 : -1;
}

/* An interpreter for the graph, over kv (may be NULL). */
static krt_interp *tg_interp(tgraph *t, krt_kv *kv, ks_diag *d)
{
    return tg_describe(t, d) == 0 ? krt_interp_new(&t->desc, t->w, kv, d) : NULL;
}

/* Each node sits on its own line of "test.kiln": line = value + 1, so
 * messages show which node they are about. */
static kir_loc tg_loc(tgraph *t) { return kir_loc_make(t->g, "test.kiln", (uint32_t)t->g->n_nodes + 1, 3); }

static void *tg_own(tgraph *t, void *p)
{
    KS_ASSERT(t->n_owned < TG_MAX_OWNED);
    t->owned[t->n_owned++] = p;
    return p;
}

static kir_val tg_weight(tgraph *t, kir_dtype dt, int ndim, const int64_t *dims, const void *data)
{
    char name[32];
    snprintf(name, sizeof name, "w%d", t->n_weights++);
    kir_val v = kir_weight(t->g, name, dt, ndim, dims, tg_loc(t));
    KS_ASSERT(v < TG_MAX_NODES);
    t->w[v] = data;
    return v;
}

static kir_val tg_weight2(tgraph *t, int64_t rows, int64_t cols, const float *data)
{
    int64_t dims[2] = {rows, cols};
    return tg_weight(t, KIR_F32, 2, dims, data);
}

static kir_val tg_weight1(tgraph *t, int64_t n, const float *data) { return tg_weight(t, KIR_F32, 1, &n, data); }

static kir_val tg_tokens(tgraph *t)
{
    if (t->tokens == KIR_NONE) t->tokens = kir_input(t->g, KIR_ROLE_TOKENS, tg_loc(t));
    return t->tokens;
}

static kir_val tg_positions(tgraph *t)
{
    if (t->positions == KIR_NONE) t->positions = kir_input(t->g, KIR_ROLE_POSITIONS, tg_loc(t));
    return t->positions;
}

/* Nodes without attributes, each on its own line (tg_loc). */
static kir_val tg_op1(tgraph *t, kir_op op, kir_val a) { return tb_op(t->g, op, tg_loc(t), a, KIR_NONE); }
static kir_val tg_op2(tgraph *t, kir_op op, kir_val a, kir_val b) { return tb_op(t->g, op, tg_loc(t), a, b); }

static kir_val tg_reshape(tgraph *t, kir_val x, int ndim, const int64_t *dims)
{
    return tb_reshape_at(t->g, tg_loc(t), x, ndim, dims);
}

/* An activation [T, dims...] holding rows[token id] for each token: the
 * table is an embedding the step's token ids index. */
static kir_val tg_activation(tgraph *t, int64_t n_rows, int ndim, const int64_t *dims, const float *rows)
{
    int64_t row = 1;
    for (int i = 1; i < ndim; i++) row *= dims[i];
    kir_val e = tg_op2(t, KIR_OP_EMBED, tg_weight2(t, n_rows, row, rows), tg_tokens(t));
    return ndim == 2 ? e : tg_reshape(t, e, ndim, dims);
}

static kir_val tg_output(tgraph *t, kir_val x) { return tb_output_at(t->g, tg_loc(t), x, "logits"); }

static kir_val tg_rope(tgraph *t, kir_val x, kir_word style, int64_t rot_dim, double theta, kir_word scaling,
                       double factor)
{
    kir_val pos = tg_positions(t);
    tb_rope_attrs r = {theta, style, rot_dim, scaling, factor, 1.0, 4.0, 8192};
    return tb_rope_at(t->g, tg_loc(t), x, pos, &r);
}

static kir_val tg_attention(tgraph *t, kir_val q, kir_val k, kir_val v, int layer, double scale, int window,
                            double softcap)
{
    return tb_attention_at(t->g, tg_loc(t), q, k, v, layer, scale, window, softcap);
}

/* A norm of x over w and b (either may be KIR_NONE) with every operand
 * slot written out, absent ones as `_`: rms_norm(x, _), layer_norm(x, _, _),
 * which the interpreter reads as it reads rms_norm(x). */
static kir_val tg_norm(tgraph *t, kir_op op, kir_val x, kir_val w, kir_val b, double eps)
{
    kir_val v = tb_norm_at(t->g, tg_loc(t), op, x, w, b, eps);
    return tb_pad_operands(t->g, v, op == KIR_OP_LAYER_NORM ? 3 : 2);
}

/* Run one step of graph t without a KV cache: token ids 0..T-1 unless
 * given, positions given or 0..T-1. out gets [T, row]. Returns the step's rc. */
static int run_plain(tgraph *t, int n, const int32_t *tokens, const int32_t *positions, float *out, ks_buf *log)
{
    int32_t tok[64], pos[64], seq[64];
    KS_ASSERT(n <= 64);
    for (int i = 0; i < n; i++) {
        tok[i] = tokens ? tokens[i] : i;
        pos[i] = positions ? positions[i] : i;
        seq[i] = 0;
    }
    ks_diag d = {.log = log, .quiet = log != NULL};
    krt_interp *it = tg_interp(t, NULL, &d);
    if (!it) return -2;
    krt_step st = {n, tok, pos, seq};
    int rc = krt_interp_step(it, &st, out, &d);
    krt_interp_free(it);
    return rc;
}

/* ---- embed ------------------------------------------------------------------------- */
static void test_embed(void)
{
    tgraph t;
    tg_init(&t, "embed");
    float table[5 * 3];
    for (int i = 0; i < 15; i++) table[i] = (float)i * 0.5f;
    tg_output(&t, tg_op2(&t, KIR_OP_EMBED, tg_weight2(&t, 5, 3, table), tg_tokens(&t)));
    int32_t tokens[4] = {4, 0, 2, 2};
    float out[12];
    CHECK(run_plain(&t, 4, tokens, NULL, out, NULL) == 0);
    for (int i = 0; i < 4; i++) CHECK(memcmp(out + 3 * i, table + 3 * tokens[i], 3 * sizeof(float)) == 0);

    /* Ids index the table: the description says so (the session checks steps against it). */
    ks_diag d = {0};
    CHECK(tg_describe(&t, &d) == 0 && t.desc.n_token_ids == 5 && t.desc.vocab == 3);
    tg_free(&t);

    /* Learned positions index their own table (GPT-2's wpe): the context must fit it. */
    tg_init(&t, "wpe");
    tg_output(&t, tg_op2(&t, KIR_OP_EMBED, tg_weight2(&t, 4, 3, table), tg_positions(&t)));
    ks_buf log = {0};
    d = (ks_diag){.log = &log, .quiet = 1};
    CHECK(tg_describe(&t, &d) == -1);
    CHECK_STR(ks_buf_cstr(&log), "wpe: error: a context of 1048576 positions is over the 4 rows of the position table\n");
    kir_param_int(t.g, "max_context", 4);
    int32_t pos[2] = {2, 3};
    CHECK(run_plain(&t, 2, NULL, pos, out, NULL) == 0);
    CHECK(memcmp(out, table + 6, 6 * sizeof(float)) == 0);
    ks_buf_free(&log);
    tg_free(&t);
}

/* ---- matmul ------------------------------------------------------------------------ */
/* x [T,K] times w [N,K] (data in dtype dt) into out [T,N]; 0 or the step's rc. */
static int run_matmul(int64_t n_tok, int64_t k, int64_t n, const float *x, const void *w, kir_dtype dt, float *out)
{
    tgraph t;
    tg_init(&t, "matmul");
    int64_t xd[2] = {KIR_DIM_T, k}, wd[2] = {n, k};
    kir_val xv = tg_activation(&t, n_tok, 2, xd, x);
    tg_output(&t, tg_op2(&t, KIR_OP_MATMUL, xv, tg_weight(&t, dt, 2, wd, w)));
    int rc = run_plain(&t, (int)n_tok, NULL, NULL, out, NULL);
    tg_free(&t);
    return rc;
}

/* x [T,K] times w [N,K] in weight dtype dt; compared with a double reference
 * within float32's accumulation error. Half-precision weights give the bits
 * of the f32 weights they convert to (the interpreter converts a tile at a
 * time, in each thread). */
static void matmul_case(int64_t n_tok, int64_t k, int64_t n, kir_dtype dt)
{
    tgraph t;
    tg_init(&t, "matmul");
    float *x = tg_own(&t, random_floats(n_tok * k, 1.0f));
    float *w = tg_own(&t, random_floats(n * k, 1.0f));
    uint16_t *half = tg_own(&t, ks_xmalloc(sizeof(uint16_t) * (size_t)(n * k)));
    for (int64_t i = 0; i < n * k; i++) {
        if (dt == KIR_F16) {
            half[i] = ks_f32_to_f16(w[i]);
            w[i] = ks_f16_to_f32(half[i]);
        } else if (dt == KIR_BF16) {
            half[i] = ks_f32_to_bf16(w[i]);
            w[i] = ks_bf16_to_f32(half[i]);
        }
    }
    float *out = ks_xmalloc(sizeof(float) * (size_t)(n_tok * n));
    double *want = ks_xmalloc(sizeof(double) * (size_t)(n_tok * n));
    CHECK(run_matmul(n_tok, k, n, x, dt == KIR_F32 ? (const void *)w : (const void *)half, dt, out) == 0);
    double worst = 0.0;
    for (int64_t r = 0; r < n_tok; r++)
        for (int64_t c = 0; c < n; c++) {
            double s = 0.0, mag = 0.0;
            for (int64_t i = 0; i < k; i++) {
                s += (double)x[r * k + i] * w[c * k + i];
                mag += fabs((double)x[r * k + i] * w[c * k + i]);
            }
            want[r * n + c] = s;
            double e = fabs(out[r * n + c] - s) / ((double)k * 6e-8 * mag + 1e-30);
            if (e > worst) worst = e;
        }
    CHECK_MSG(worst <= 1.0, "matmul %lldx%lldx%lld %s: error %.3g of the float32 bound", (long long)n_tok,
              (long long)k, (long long)n, kir_dtype_name(dt), worst);
    if (dt != KIR_F32) {
        float *f32_out = ks_xmalloc(sizeof(float) * (size_t)(n_tok * n));
        CHECK(run_matmul(n_tok, k, n, x, w, KIR_F32, f32_out) == 0);
        CHECK(memcmp(out, f32_out, sizeof(float) * (size_t)(n_tok * n)) == 0);
        free(f32_out);
    }

    /* Row by row (one token per step, no threads) gives the same bits as all
     * rows at once (threads when large). */
    float *row = ks_xmalloc(sizeof(float) * (size_t)n);
    int64_t xd[2] = {KIR_DIM_T, k}, wd[2] = {n, k};
    kir_val xv = tg_activation(&t, n_tok, 2, xd, x);
    tg_output(&t, tg_op2(&t, KIR_OP_MATMUL, xv, tg_weight(&t, dt, 2, wd, dt == KIR_F32 ? (const void *)w : (const void *)half)));
    for (int64_t r = 0; r < n_tok; r++) {
        int32_t id = (int32_t)r;
        CHECK(run_plain(&t, 1, &id, NULL, row, NULL) == 0);
        CHECK(memcmp(row, out + r * n, sizeof(float) * (size_t)n) == 0);
    }
    free(row);
    free(out);
    free(want);
    tg_free(&t);
}

static void test_matmul(void)
{
    matmul_case(3, 5, 4, KIR_F32);
    matmul_case(3, 17, 9, KIR_F16);
    matmul_case(2, 33, 7, KIR_BF16);
    matmul_case(40, 130, 513, KIR_F32);  /* 2.7M multiply-adds: split over threads */
    /* f16 and bf16 weights: read in place by fewer than 4 rows of x (row by
     * row below too), converted a tile at a time for more */
    matmul_case(40, 130, 513, KIR_BF16); /* each thread converts its own columns */
    matmul_case(3, 1000, 300, KIR_F16);  /* tiles of 65 rows of w, and a shorter last one */
    matmul_case(5, 1000, 300, KIR_F16);
    matmul_case(20, 600, 513, KIR_BF16); /* threads, each with several tiles */
    matmul_case(2, 70001, 3, KIR_F16);   /* a row of w larger than a tile: one row at a time */
    matmul_case(4, 70001, 3, KIR_BF16);
}

/* ---- elementwise ---------------------------------------------------------------------- */
static void test_binary(void)
{
    enum { T = 3 };
    float *a = random_floats(T * 6, 2.0f), *b_act = random_floats(T * 6, 2.0f);
    float *b3 = random_floats(3, 2.0f), *b23 = random_floats(6, 2.0f);
    /* NaNs in either operand: max and min keep them (torch.maximum, torch.minimum), as the others do */
    a[4] = NAN, b_act[7] = NAN, b3[1] = NAN, b23[5] = NAN;
    static const kir_op ops[5] = {KIR_OP_ADD, KIR_OP_SUB, KIR_OP_MUL, KIR_OP_MAX, KIR_OP_MIN};
    for (int o = 0; o < 5; o++) {
        for (int form = 0; form < 3; form++) {
            tgraph t;
            tg_init(&t, "binary");
            int64_t dims[3] = {KIR_DIM_T, 2, 3};
            kir_val av = tg_activation(&t, T, 3, dims, a), bv;
            int64_t nb;
            const float *b;
            if (form == 0) {
                bv = tg_weight1(&t, 3, b3); /* [3] over [T,2,3] */
                b = b3, nb = 3;
            } else if (form == 1) {
                int64_t d2[2] = {2, 3};
                bv = tg_weight(&t, KIR_F32, 2, d2, b23); /* [2,3] */
                b = b23, nb = 6;
            } else {
                /* an activation of the same shape: a second table of the same ids */
                bv = tg_activation(&t, T, 3, dims, b_act);
                b = b_act, nb = T * 6;
            }
            tg_output(&t, tg_op2(&t, ops[o], av, bv));
            float out[T * 6];
            CHECK(run_plain(&t, T, NULL, NULL, out, NULL) == 0);
            for (int i = 0; i < T * 6; i++) {
                float x = a[i], y = b[i % nb];
                float want = ops[o] == KIR_OP_ADD   ? x + y
                             : ops[o] == KIR_OP_SUB ? x - y
                             : ops[o] == KIR_OP_MUL ? x * y
                             : isnan(x) || isnan(y) ? NAN
                             : ops[o] == KIR_OP_MAX ? fmaxf(x, y)
                                                    : fminf(x, y);
                CHECK(isnan(want) ? isnan(out[i]) : out[i] == want);
            }
            tg_free(&t);
        }
    }
    free(a);
    free(b_act);
    free(b3);
    free(b23);
}

static double ref_unary(kir_op op, double x)
{
    switch (op) {
    case KIR_OP_SCALE: return x * (double)0.37f;
    case KIR_OP_SILU: return x / (1.0 + exp(-x));
    case KIR_OP_GELU: return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case KIR_OP_GELU_TANH: return 0.5 * x * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
    case KIR_OP_RELU: return x > 0 ? x : 0;
    case KIR_OP_TANH: return tanh(x);
    case KIR_OP_EXP: return exp(x);
    case KIR_OP_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case KIR_OP_CLAMP: return x < -1.25 ? -1.25 : x > 2.5 ? 2.5 : x;
    default: KS_UNREACHABLE();
    }
}

static void test_unary(void)
{
    enum { T = 4, R = 10 };
    float *x = random_floats(T * R, 4.0f);
    x[0] = 0.0f;
    x[1] = -0.0f;
    x[2] = -20.0f;
    x[3] = 20.0f;
    static const kir_op ops[] = {KIR_OP_SCALE, KIR_OP_SILU, KIR_OP_GELU,    KIR_OP_GELU_TANH, KIR_OP_RELU,
                                 KIR_OP_TANH,  KIR_OP_EXP,  KIR_OP_SIGMOID, KIR_OP_CLAMP,     KIR_OP_SCALE};
    enum { N_OPS = sizeof ops / sizeof ops[0] };
    for (int o = 0; o < N_OPS; o++) {
        tgraph t;
        tg_init(&t, "unary");
        int64_t dims[2] = {KIR_DIM_T, R};
        kir_val xv = tg_activation(&t, T, 2, dims, x);
        const int shifted = o == N_OPS - 1; /* the last: a scale with a shift, x 0.37 + 1.5 */
        kir_setting shift[2] = {KIR_WITH_FLOAT(KIR_A_SCALE_VALUE, 0.37), KIR_WITH_FLOAT(KIR_A_SCALE_SHIFT, 1.5)};
        kir_setting bounds[2] = {KIR_WITH_FLOAT(KIR_A_CLAMP_MIN, -1.25), KIR_WITH_FLOAT(KIR_A_CLAMP_MAX, 2.5)};
        kir_val v = shifted                     ? tb_build(t.g, KIR_OP_SCALE, tg_loc(&t), &xv, 1, shift, 2)
                    : ops[o] == KIR_OP_SCALE ? tb_scale_at(t.g, tg_loc(&t), xv, 0.37)
                    : ops[o] == KIR_OP_CLAMP ? tb_build(t.g, KIR_OP_CLAMP, tg_loc(&t), &xv, 1, bounds, 2)
                                             : tg_op1(&t, ops[o], xv);
        tg_output(&t, v);
        float out[T * R];
        double want[T * R];
        CHECK(run_plain(&t, T, NULL, NULL, out, NULL) == 0);
        for (int i = 0; i < T * R; i++)
            want[i] = shifted ? (double)(x[i] * 0.37f + 1.5f) : (double)(float)ref_unary(ops[o], x[i]); /* as stored */
        check_close(kir_op_table[ops[o]].name, out, want, T * R, 2e-6);
        tg_free(&t);
    }
    free(x);
}

/* softmax over the last dim against double: rows of ordinary values, large ones (e^x overflows without
 * the maximum taken first), one with a NaN and one of -inf (NaNs, as torch.softmax) */
static void test_softmax(void)
{
    enum { T = 4, R = 9 };
    float *x = random_floats(T * R, 3.0f);
    x[R + 2] = 100.0f, x[R + 5] = 95.0f;
    x[2 * R + 4] = NAN;
    for (int i = 0; i < R; i++) x[3 * R + i] = -INFINITY;
    tgraph t;
    tg_init(&t, "softmax");
    int64_t dims[2] = {KIR_DIM_T, R};
    tg_output(&t, tg_op1(&t, KIR_OP_SOFTMAX, tg_activation(&t, T, 2, dims, x)));
    float out[T * R];
    CHECK(run_plain(&t, T, NULL, NULL, out, NULL) == 0);
    double want[2 * R];
    for (int r = 0; r < 2; r++) {
        double m = -INFINITY, s = 0.0;
        for (int i = 0; i < R; i++) m = fmax(m, x[r * R + i]);
        for (int i = 0; i < R; i++) s += exp((double)x[r * R + i] - m);
        for (int i = 0; i < R; i++) want[r * R + i] = exp((double)x[r * R + i] - m) / s;
    }
    check_close("softmax", out, want, 2 * R, 1e-6);
    int nans = 0;
    for (int i = 2 * R; i < T * R; i++) nans += isnan(out[i]) != 0;
    CHECK(nans == 2 * R);
    tg_free(&t);
    free(x);
}

/* ---- norms ------------------------------------------------------------------------------- */
static void test_norms(void)
{
    enum { T = 3, H = 2, D = 7 };
    float *x = random_floats(T * H * D, 3.0f), *w = random_floats(D, 2.0f), *b = random_floats(D, 1.0f);
    for (int i = 0; i < D; i++) x[i] += 5.0f; /* a row far from zero mean */
    for (int form = 0; form < 5; form++) {
        /* 0: rms(x,w)  1: rms(x)  2: ln(x,w,b)  3: ln(x)  4: ln(x,_,b) */
        int layer = form >= 2;
        int has_w = form == 0 || form == 2, has_b = form == 2 || form == 4;
        tgraph t;
        tg_init(&t, "norm");
        int64_t dims[3] = {KIR_DIM_T, H, D};
        kir_val xv = tg_activation(&t, T, 3, dims, x);
        kir_val wv = has_w ? tg_weight1(&t, D, w) : KIR_NONE, bv = has_b ? tg_weight1(&t, D, b) : KIR_NONE;
        double eps = layer ? 1e-5 : 1e-6;
        tg_output(&t, tg_norm(&t, layer ? KIR_OP_LAYER_NORM : KIR_OP_RMS_NORM, xv, wv, bv, eps));
        float out[T * H * D];
        double want[T * H * D];
        CHECK(run_plain(&t, T, NULL, NULL, out, NULL) == 0);
        for (int r = 0; r < T * H; r++) {
            const float *xr = x + r * D;
            double mean = 0, ss = 0;
            for (int i = 0; i < D; i++) mean += xr[i];
            mean /= D;
            for (int i = 0; i < D; i++) ss += layer ? (xr[i] - mean) * (xr[i] - mean) : (double)xr[i] * xr[i];
            double inv = 1.0 / sqrt(ss / D + eps);
            for (int i = 0; i < D; i++) {
                double y = layer ? (xr[i] - mean) * inv : xr[i] * inv;
                if (has_w) y *= w[i];
                if (has_b) y += b[i];
                want[r * D + i] = y;
            }
        }
        check_close(layer ? "layer_norm" : "rms_norm", out, want, T * H * D, 2e-6);
        tg_free(&t);
    }
    free(x);
    free(w);
    free(b);
}

/* ---- weights in half precision ---------------------------------------------------------- */
/* Bytes the interpreter of graph t allocates for weights (krt_interp_weight_bytes). */
static size_t weight_bytes(tgraph *t)
{
    ks_diag d = {0};
    krt_interp *it = tg_interp(t, NULL, &d);
    CHECK(it != NULL);
    size_t bytes = it ? krt_interp_weight_bytes(it) : 0;
    krt_interp_free(it);
    return bytes;
}

/* Every f16 and bf16 bit pattern, read through an embedding table: the
 * bits ks_f16_to_f32 / ks_bf16_to_f32 give (NaN payloads too); rows of 1025
 * take the vectorized blocks of 8 and the tail. A table at an odd address is
 * copied once (to 2-byte alignment), and reads the same. */
static void test_half_conversion(void)
{
    enum { ROWS = 64, DIM = 1025, N = ROWS * DIM };
    uint16_t *bits = ks_xmalloc(sizeof(uint16_t) * N + 1);
    float *want = ks_xmalloc(sizeof(float) * N), *out = ks_xmalloc(sizeof(float) * N);
    int32_t ids[ROWS];
    for (int i = 0; i < ROWS; i++) ids[i] = ROWS - 1 - i;
    for (int i = 0; i < N; i++) bits[i] = (uint16_t)(i * 7 + 3); /* every value of 16 bits (7 is odd), and more */
    for (int dt = KIR_F16; dt <= KIR_BF16; dt++) {
        for (int r = 0; r < ROWS; r++)
            for (int i = 0; i < DIM; i++) {
                uint16_t h = bits[ids[r] * DIM + i];
                want[r * DIM + i] = dt == KIR_F16 ? ks_f16_to_f32(h) : ks_bf16_to_f32(h);
            }
        tgraph t;
        tg_init(&t, "half");
        int64_t dims[2] = {ROWS, DIM};
        kir_val table = tg_weight(&t, (kir_dtype)dt, 2, dims, bits);
        tg_output(&t, tg_op2(&t, KIR_OP_EMBED, table, tg_tokens(&t)));
        CHECK(weight_bytes(&t) == 0);
        memset(out, 0, sizeof(float) * N);
        CHECK(run_plain(&t, ROWS, ids, NULL, out, NULL) == 0);
        CHECK(memcmp(out, want, sizeof(float) * N) == 0);

        /* the same bytes one byte further on: copied, 2 bytes per element */
        char *odd = tg_own(&t, ks_xmalloc(sizeof(uint16_t) * N + 1)) + 1;
        memcpy(odd, bits, sizeof(uint16_t) * N);
        t.w[table] = odd;
        CHECK(weight_bytes(&t) == sizeof(uint16_t) * N);
        memset(out, 0, sizeof(float) * N);
        CHECK(run_plain(&t, ROWS, ids, NULL, out, NULL) == 0);
        CHECK(memcmp(out, want, sizeof(float) * N) == 0);
        tg_free(&t);
    }
    free(bits);
    free(want);
    free(out);
}

/* Every kernel that reads a weight (embed, rms_norm and layer_norm weights
 * and bias, matmul, the second operand of add, sub and mul), with f16 and
 * bf16 weights: read in place (no bytes allocated for them), and the same
 * bits as the graph with f32 weights of the same values. */
static void half_graph(tgraph *t, kir_dtype dt, const float *const *f32, uint16_t *const *half)
{
    enum { V = 11, D = 37, N = 901 };
    static const int64_t sizes[7][2] = {{V, D}, {D, 0}, {D, 0}, {D, 0}, {N, D}, {N, 0}, {N, 0}};
    kir_val w[7];
    for (int i = 0; i < 7; i++) {
        const void *data = dt == KIR_F32 ? (const void *)f32[i] : (const void *)half[i];
        w[i] = tg_weight(t, dt, sizes[i][1] ? 2 : 1, sizes[i], data);
    }
    kir_val x = tg_op2(t, KIR_OP_EMBED, w[0], tg_tokens(t));
    x = tg_norm(t, KIR_OP_RMS_NORM, x, w[1], KIR_NONE, 1e-5);
    x = tg_norm(t, KIR_OP_LAYER_NORM, x, w[2], w[3], 1e-5);
    x = tg_op2(t, KIR_OP_MATMUL, x, w[4]); /* 64 tokens: 2.1M multiply-adds, over threads */
    x = tg_op2(t, KIR_OP_ADD, x, w[5]);
    x = tg_op2(t, KIR_OP_SUB, x, w[6]);
    x = tg_op2(t, KIR_OP_MUL, x, w[5]);
    tg_output(t, x);
}

static void test_half_weights(void)
{
    enum { V = 11, D = 37, N = 901, T = 64 };
    static const int64_t elems[7] = {V * D, D, D, D, N * D, N, N};
    int32_t ids[T];
    for (int i = 0; i < T; i++) ids[i] = (i * 5) % V;
    for (int dt = KIR_F16; dt <= KIR_BF16; dt++) {
        float *f32[7];
        uint16_t *half[7];
        for (int i = 0; i < 7; i++) {
            f32[i] = random_floats(elems[i], i == 1 || i == 2 ? 2.0f : 1.0f);
            half[i] = ks_xmalloc(sizeof(uint16_t) * (size_t)elems[i]);
            for (int64_t j = 0; j < elems[i]; j++) {
                half[i][j] = dt == KIR_F16 ? ks_f32_to_f16(f32[i][j]) : ks_f32_to_bf16(f32[i][j]);
                f32[i][j] = dt == KIR_F16 ? ks_f16_to_f32(half[i][j]) : ks_bf16_to_f32(half[i][j]);
            }
        }
        tgraph th, tf;
        tg_init(&th, "half");
        tg_init(&tf, "f32");
        half_graph(&th, (kir_dtype)dt, (const float *const *)f32, half);
        half_graph(&tf, KIR_F32, (const float *const *)f32, half);
        CHECK(weight_bytes(&th) == 0 && weight_bytes(&tf) == 0);
        float *got = ks_xmalloc(sizeof(float) * T * N), *want = ks_xmalloc(sizeof(float) * T * N);
        CHECK(run_plain(&th, T, ids, NULL, got, NULL) == 0);
        CHECK(run_plain(&tf, T, ids, NULL, want, NULL) == 0);
        CHECK(memcmp(got, want, sizeof(float) * T * N) == 0);
        CHECK(run_plain(&th, 1, ids, NULL, got, NULL) == 0); /* one token: no threads */
        CHECK(memcmp(got, want, sizeof(float) * N) == 0);
        free(got);
        free(want);
        for (int i = 0; i < 7; i++) {
            free(f32[i]);
            free(half[i]);
        }
        tg_free(&th);
        tg_free(&tf);
    }
}

/* ---- views ---------------------------------------------------------------------------------- */
static void test_views(void)
{
    enum { T = 3 };
    float *x = random_floats(T * 6, 1.0f), *y = random_floats(T * 2, 1.0f);
    tgraph t;
    tg_init(&t, "views");
    int64_t d6[2] = {KIR_DIM_T, 6}, d23[3] = {KIR_DIM_T, 2, 3}, d2[2] = {KIR_DIM_T, 2};
    kir_val xv = tg_activation(&t, T, 2, d6, x);
    kir_val r = tg_reshape(&t, tg_reshape(&t, xv, 3, d23), 2, d6); /* there and back */
    kir_val s = tb_slice_at(t.g, tg_loc(&t), r, 1, 4); /* [T,3] = x[:, 1:4] */
    kir_val yv = tg_activation(&t, T, 2, d2, y);
    kir_val parts[3] = {yv, s, yv};
    tg_output(&t, tb_build(t.g, KIR_OP_CONCAT, tg_loc(&t), parts, 3, NULL, 0)); /* [T,7] = y | x[:,1:4] | y */
    float out[T * 7];
    CHECK(run_plain(&t, T, NULL, NULL, out, NULL) == 0);
    for (int i = 0; i < T; i++) {
        const float want[7] = {y[2 * i], y[2 * i + 1], x[6 * i + 1], x[6 * i + 2], x[6 * i + 3], y[2 * i], y[2 * i + 1]};
        CHECK(memcmp(out + 7 * i, want, sizeof want) == 0);
    }
    tg_free(&t);
    free(x);
    free(y);
}

/* ---- rope ------------------------------------------------------------------------------------ */
/* Pinned with numpy float32 (script at the end of the file): theta 500000,
 * head_dim 16; llama3 factor 8, low 1, high 4, original 8192 puts rotations
 * 0-3 above the high-frequency wavelength (unchanged), 4 in between
 * (smoothed) and 5-7 below the low-frequency one (divided by 8). */
static const float pin_llama3[8] = {1.0f, 0.193922758f, 0.0376060307f, 0.00729266508f,
                                    0.000524846022f, 3.42810235e-05f, 6.64786967e-06f, 1.28917316e-06f};
static const float pin_linear4[8] = {0.25f, 0.0484806895f, 0.00940150768f, 0.00182316627f,
                                     0.000353553361f, 6.85620471e-05f, 1.32957393e-05f, 2.57834631e-06f};
/* cos and sin of the llama3 angles float32(pos) * inv_freq at three positions. */
static const int32_t pin_pos[3] = {1, 77, 3000};
static const float pin_cos[3][8] = {
    {0.540302277f, 0.981255829f, 0.99929297f, 0.999973416f, 0.999999881f, 1.0f, 1.0f, 1.0f},
    {-0.0309750326f, -0.713783562f, -0.969911754f, 0.846438587f, 0.999183476f, 0.999996543f, 0.999999881f, 1.0f},
    {-0.975682199f, -0.839948177f, 0.961264312f, -0.993604898f, -0.00374177611f, 0.994716287f, 0.999801159f,
     0.999992549f},
};
static const float pin_sin[3][8] = {
    {0.841470957f, 0.192709595f, 0.0375971682f, 0.00729260035f, 0.000524846022f, 3.42810235e-05f, 6.64786967e-06f,
     1.28917316e-06f},
    {0.999520183f, 0.700366378f, 0.243456706f, 0.53248632f, 0.0404021442f, 0.0026396357f, 0.00051188597f,
     9.92663336e-05f},
    {0.219189972f, -0.542666614f, -0.275628239f, 0.112912722f, 0.999993026f, 0.102661878f, 0.0199422874f,
     0.00386751001f},
};

static void test_rope_scaling(void)
{
    tgraph t;
    tg_init(&t, "rope");
    /* x = (1,...,1, 0,...,0) per head: halves rotation j gives (cos_j, sin_j). */
    float table[16];
    for (int i = 0; i < 16; i++) table[i] = i < 8 ? 1.0f : 0.0f;
    int64_t d3[3] = {KIR_DIM_T, 1, 16};
    kir_val x = tg_activation(&t, 1, 3, d3, table);
    kir_val r = tg_rope(&t, x, KIR_ROPE_STYLE_HALVES, 16, 500000.0, KIR_ROPE_SCALING_LLAMA3, 8.0);
    tg_output(&t, r);

    float inv[8];
    kir_rope_inv_freq(t.g, r, 16, 1, inv);
    CHECK(memcmp(inv, pin_llama3, sizeof inv) == 0);
    for (int j = 0; j < 8; j++)
        if (inv[j] != pin_llama3[j]) fprintf(stderr, "llama3 inv_freq[%d]: %.9g, pinned %.9g\n", j, inv[j], pin_llama3[j]);

    int32_t tok[3] = {0, 0, 0};
    float out[3 * 16];
    CHECK(run_plain(&t, 3, tok, pin_pos, out, NULL) == 0);
    for (int p = 0; p < 3; p++) {
        check_same("llama3 cos", out + 16 * p, pin_cos[p], 8, 1e-6);
        check_same("llama3 sin", out + 16 * p + 8, pin_sin[p], 8, 1e-6);
    }
    kir_attr_set_word(t.g, r, KIR_A_ROPE_SCALING, KIR_ROPE_SCALING_LINEAR);
    kir_attr_set_float(t.g, r, KIR_A_ROPE_FACTOR, 4.0);
    kir_rope_inv_freq(t.g, r, 16, 1, inv);
    CHECK(memcmp(inv, pin_linear4, sizeof inv) == 0);
    tg_free(&t);
}

/* halves rotates (j, j+rot/2), pairs rotates (2j, 2j+1): with the input's
 * elements moved accordingly, the two give the same numbers. The part of a
 * head past rot_dim passes through. */
static void test_rope_halves_pairs(void)
{
    enum { T = 4, H = 2, D = 12, ROT = 8, HALF = ROT / 2 };
    float *x = random_floats(T * H * D, 1.0f), *xp = ks_xmalloc(sizeof(float) * T * H * D);
    for (int r = 0; r < T * H; r++) {
        for (int j = 0; j < HALF; j++) {
            xp[r * D + 2 * j] = x[r * D + j];
            xp[r * D + 2 * j + 1] = x[r * D + j + HALF];
        }
        for (int i = ROT; i < D; i++) xp[r * D + i] = x[r * D + i];
    }
    int32_t pos[T] = {0, 5, 1000, 70000};
    float out_h[T * H * D], out_p[T * H * D];
    int64_t d3[3] = {KIR_DIM_T, H, D};
    for (int style = 0; style < 2; style++) {
        tgraph t;
        tg_init(&t, "rope");
        kir_val xv = tg_activation(&t, T, 3, d3, style ? xp : x);
        tg_output(&t, tg_rope(&t, xv, style ? KIR_ROPE_STYLE_PAIRS : KIR_ROPE_STYLE_HALVES, ROT, 10000.0, KIR_ROPE_SCALING_NONE, 1.0));
        CHECK(run_plain(&t, T, NULL, pos, style ? out_p : out_h, NULL) == 0);
        tg_free(&t);
    }
    double want[T * H * D];
    for (int tk = 0; tk < T; tk++)
        for (int h = 0; h < H; h++) {
            int r = tk * H + h;
            for (int j = 0; j < HALF; j++) {
                CHECK(out_p[r * D + 2 * j] == out_h[r * D + j]);
                CHECK(out_p[r * D + 2 * j + 1] == out_h[r * D + j + HALF]);
                /* the textbook formula in double */
                double a = pos[tk] * pow(10000.0, -2.0 * j / ROT);
                double x0 = x[r * D + j], x1 = x[r * D + j + HALF];
                want[r * D + j] = x0 * cos(a) - x1 * sin(a);
                want[r * D + j + HALF] = x1 * cos(a) + x0 * sin(a);
            }
            for (int i = ROT; i < D; i++) {
                CHECK(out_h[r * D + i] == x[r * D + i]);
                CHECK(out_p[r * D + i] == x[r * D + i]);
                want[r * D + i] = x[r * D + i];
            }
        }
    /* The angle is a float32 product of a float32 frequency (at most 1):
     * it is off the exact one by a few float32 roundings of pos. */
    for (int tk = 0; tk < T; tk++)
        check_close("rope halves", out_h + tk * H * D, want + tk * H * D, H * D, 1e-6 + 4e-7 * pos[tk]);
    free(x);
    free(xp);
}

/* ---- attention ---------------------------------------------------------------------------- */
typedef struct attn_case {
    int window;      /* sliding window, 0: none */
    double softcap;  /* 0: none */
    double scale;    /* score scale */
} attn_case;

/* q, k, v are rows of tables indexed by token id; tokens of two sequences
 * are interleaved in one step. */
static void attention_case(const attn_case *ac)
{
    enum { T = 9, H = 4, KH = 2, D = 4, DV = 3 };
    static const int32_t seq[T] = {0, 1, 0, 0, 1, 0, 1, 0, 0};
    static const int32_t pos[T] = {0, 0, 1, 2, 1, 3, 2, 4, 5};
    int32_t tok[T];
    for (int i = 0; i < T; i++) tok[i] = i;
    float *q = random_floats(T * H * D, 1.5f), *k = random_floats(T * KH * D, 1.5f), *v = random_floats(T * KH * DV, 1.0f);
    tgraph t;
    tg_init(&t, "attention");
    int64_t dq[3] = {KIR_DIM_T, H, D}, dk[3] = {KIR_DIM_T, KH, D}, dv[3] = {KIR_DIM_T, KH, DV};
    kir_val qv = tg_activation(&t, T, 3, dq, q), kv_ = tg_activation(&t, T, 3, dk, k), vv = tg_activation(&t, T, 3, dv, v);
    tg_output(&t, tg_attention(&t, qv, kv_, vv, 0, ac->scale, ac->window, ac->softcap));

    ks_diag d = {0};
    CHECK(tg_describe(&t, &d) == 0);
    int n_layers = t.desc.n_kv_layers;
    const krt_kv_layer *layers = t.desc.kv_layers;
    CHECK(n_layers == 1 && layers[0].kv_heads == KH && layers[0].head_dim_k == D && layers[0].head_dim_v == DV);
    krt_kv_config cfg = {n_layers, layers, 2, 16, 2, 32, sizeof(float), 0};
    krt_kv *kv = krt_kv_new(&cfg, &krt_kv_host_storage, &d);
    const char *why;
    CHECK(krt_kv_seq_add(kv, 0, &why) == 0 && krt_kv_seq_add(kv, 1, &why) == 0);
    CHECK(krt_kv_seq_reserve(kv, 0, 6, &why) == 0 && krt_kv_seq_reserve(kv, 1, 3, &why) == 0);
    krt_interp *it = tg_interp(&t, kv, &d);
    float out[T * H * DV];
    krt_step st = {T, tok, pos, seq};
    CHECK(it && krt_interp_step(it, &st, out, &d) == 0);

    double want[T * H * DV];
    for (int i = 0; i < T; i++) {
        int lo = ac->window > 0 && pos[i] - ac->window + 1 > 0 ? pos[i] - ac->window + 1 : 0;
        for (int h = 0; h < H; h++) {
            int kh = h / (H / KH);
            double s[T], m = -INFINITY, sum = 0;
            int n_keys = 0, key[T];
            for (int j = 0; j < T; j++) {
                if (seq[j] != seq[i] || pos[j] < lo || pos[j] > pos[i]) continue;
                double dot = 0;
                for (int e = 0; e < D; e++) dot += (double)q[(i * H + h) * D + e] * k[(j * KH + kh) * D + e];
                dot *= ac->scale;
                if (ac->softcap > 0) dot = ac->softcap * tanh(dot / ac->softcap);
                key[n_keys] = j;
                s[n_keys++] = dot;
                if (dot > m) m = dot;
            }
            for (int j = 0; j < n_keys; j++) sum += s[j] = exp(s[j] - m);
            for (int e = 0; e < DV; e++) {
                double o = 0;
                for (int j = 0; j < n_keys; j++) o += s[j] / sum * v[(key[j] * KH + kh) * DV + e];
                want[(i * H + h) * DV + e] = o;
            }
        }
    }
    char what[64];
    snprintf(what, sizeof what, "attention window %d softcap %g", ac->window, ac->softcap);
    check_close(what, out, want, T * H * DV, 2e-6);

    /* K and V rows went into the cache at their slots. */
    const float *kc = krt_kv_k(kv, 0), *vc = krt_kv_v(kv, 0);
    for (int i = 0; i < T; i++) {
        int64_t slot = krt_kv_slot(kv, seq[i], pos[i]);
        CHECK(memcmp(kc + slot * KH * D, k + i * KH * D, sizeof(float) * KH * D) == 0);
        CHECK(memcmp(vc + slot * KH * DV, v + i * KH * DV, sizeof(float) * KH * DV) == 0);
    }
    krt_interp_free(it);
    krt_kv_free(kv);
    free(q);
    free(k);
    free(v);
    tg_free(&t);
}

static void test_attention(void)
{
    static const attn_case cases[] = {
        {0, 0.0, 0.5},    /* plain causal, GQA */
        {3, 0.0, 0.5},    /* sliding window of 3 */
        {0, 1.5, 0.9},    /* softcap */
        {2, 2.0, 0.7},    /* both */
        {1, 0.0, 0.5},    /* window 1: a token sees itself only */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) attention_case(&cases[i]);
}

/* ---- a small Llama-like model through the KV cache ------------------------------------------ */
enum { LM_VOCAB = 50, LM_HIDDEN = 32, LM_HEADS = 4, LM_KV_HEADS = 2, LM_HEAD_DIM = 8, LM_FFN = 48, LM_LAYERS = 2 };

static kir_val lm_matrix(tgraph *t, int64_t rows, int64_t cols, float scale)
{
    return tg_weight2(t, rows, cols, tg_own(t, random_floats(rows * cols, scale)));
}

static kir_val lm_ones_ish(tgraph *t, int64_t n)
{
    float *w = tg_own(t, random_floats(n, 0.2f));
    for (int64_t i = 0; i < n; i++) w[i] += 1.0f;
    return tg_weight1(t, n, w);
}

/* Layer 0: halves RoPE with llama3 scaling, full causal attention. Layer 1:
 * pairs RoPE, a sliding window of 5 and a softcap. */
static void build_llama(tgraph *t)
{
    tg_init(t, "llama");
    int64_t d_q[3] = {KIR_DIM_T, LM_HEADS, LM_HEAD_DIM}, d_kv[3] = {KIR_DIM_T, LM_KV_HEADS, LM_HEAD_DIM};
    int64_t d_flat[2] = {KIR_DIM_T, LM_HEADS * LM_HEAD_DIM};
    kir_val x = tg_op2(t, KIR_OP_EMBED, lm_matrix(t, LM_VOCAB, LM_HIDDEN, 1.0f), tg_tokens(t));
    float s = 1.0f / sqrtf((float)LM_HIDDEN);
    for (int l = 0; l < LM_LAYERS; l++) {
        kir_val h = tg_norm(t, KIR_OP_RMS_NORM, x, lm_ones_ish(t, LM_HIDDEN), KIR_NONE, 1e-5);
        kir_val q = tg_op2(t, KIR_OP_MATMUL, h, lm_matrix(t, LM_HEADS * LM_HEAD_DIM, LM_HIDDEN, 2 * s));
        kir_val k = tg_op2(t, KIR_OP_MATMUL, h, lm_matrix(t, LM_KV_HEADS * LM_HEAD_DIM, LM_HIDDEN, 2 * s));
        kir_val v = tg_op2(t, KIR_OP_MATMUL, h, lm_matrix(t, LM_KV_HEADS * LM_HEAD_DIM, LM_HIDDEN, 2 * s));
        q = tg_reshape(t, q, 3, d_q);
        k = tg_reshape(t, k, 3, d_kv);
        v = tg_reshape(t, v, 3, d_kv);
        kir_word style = l == 0 ? KIR_ROPE_STYLE_HALVES : KIR_ROPE_STYLE_PAIRS;
        kir_word scaling = l == 0 ? KIR_ROPE_SCALING_LLAMA3 : KIR_ROPE_SCALING_NONE;
        q = tg_rope(t, q, style, LM_HEAD_DIM, 500.0, scaling, 8.0);
        k = tg_rope(t, k, style, LM_HEAD_DIM, 500.0, scaling, 8.0);
        kir_val a = tg_attention(t, q, k, v, l, 1.0 / sqrt((double)LM_HEAD_DIM), l == 1 ? 5 : 0, l == 1 ? 3.0 : 0.0);
        a = tg_reshape(t, a, 2, d_flat);
        x = tg_op2(t, KIR_OP_ADD, x, tg_op2(t, KIR_OP_MATMUL, a, lm_matrix(t, LM_HIDDEN, LM_HEADS * LM_HEAD_DIM, s)));
        kir_val h2 = tg_norm(t, KIR_OP_RMS_NORM, x, lm_ones_ish(t, LM_HIDDEN), KIR_NONE, 1e-5);
        kir_val gate = tg_op2(t, KIR_OP_MATMUL, h2, lm_matrix(t, LM_FFN, LM_HIDDEN, 2 * s));
        kir_val up = tg_op2(t, KIR_OP_MATMUL, h2, lm_matrix(t, LM_FFN, LM_HIDDEN, 2 * s));
        kir_val act = tg_op2(t, KIR_OP_MUL, tg_op1(t, KIR_OP_SILU, gate), up);
        x = tg_op2(t, KIR_OP_ADD, x, tg_op2(t, KIR_OP_MATMUL, act, lm_matrix(t, LM_HIDDEN, LM_FFN, 1.0f / sqrtf(LM_FFN))));
    }
    kir_val xf = tg_norm(t, KIR_OP_RMS_NORM, x, lm_ones_ish(t, LM_HIDDEN), KIR_NONE, 1e-5);
    tg_output(t, tg_op2(t, KIR_OP_MATMUL, xf, lm_matrix(t, LM_VOCAB, LM_HIDDEN, 2 * s)));
}

typedef struct lm_run {
    krt_kv *kv;         /* the cache */
    krt_interp *it;     /* the interpreter */
    ks_diag d;          /* diagnostics (quiet, into log) */
    ks_buf log;         /* messages */
} lm_run;

static void lm_open(lm_run *r, tgraph *t, int block_size, int n_blocks)
{
    memset(r, 0, sizeof *r);
    r->d = (ks_diag){.log = &r->log, .quiet = 1};
    CHECK(tg_describe(t, &r->d) == 0);
    krt_kv_config cfg = {t->desc.n_kv_layers, t->desc.kv_layers, block_size, n_blocks, 4, 64, sizeof(float), 0};
    r->kv = krt_kv_new(&cfg, &krt_kv_host_storage, &r->d);
    r->it = r->kv ? tg_interp(t, r->kv, &r->d) : NULL;
    CHECK(r->it != NULL);
    if (!r->it) fprintf(stderr, "%s", ks_buf_cstr(&r->log));
}

static void lm_close(lm_run *r)
{
    krt_interp_free(r->it);
    krt_kv_free(r->kv);
    ks_buf_free(&r->log);
}

/* One step of n tokens: reserves each token's position (each sequence grows
 * by its tokens in the step, in order), runs, and returns the step's rc. */
static int lm_step(lm_run *r, int n, const int32_t *tok, const int32_t *seq, float *out)
{
    int32_t pos[64];
    KS_ASSERT(n <= 64);
    for (int i = 0; i < n; i++) {
        const char *why;
        if (!krt_kv_seq_exists(r->kv, seq[i])) CHECK(krt_kv_seq_add(r->kv, seq[i], &why) == 0);
        pos[i] = krt_kv_seq_len(r->kv, seq[i]);
        CHECK(krt_kv_seq_reserve(r->kv, seq[i], pos[i] + 1, &why) == 0);
    }
    krt_step st = {n, tok, pos, seq};
    int rc = krt_interp_step(r->it, &st, out, &r->d);
    if (rc) fprintf(stderr, "%s", ks_buf_cstr(&r->log));
    return rc;
}

/* Logits of a whole sequence run as one prefill in a fresh cache. */
static void lm_prefill(tgraph *t, int n, const int32_t *tok, float *out)
{
    lm_run r;
    lm_open(&r, t, 4, 32);
    int32_t seq[64] = {0};
    CHECK(lm_step(&r, n, tok, seq, out) == 0);
    lm_close(&r);
}

enum { LM_N = 12 };

static void test_kv_consistency(void)
{
    tgraph t;
    build_llama(&t);
    static const int32_t toks_a[LM_N] = {1, 17, 42, 5, 5, 9, 33, 49, 0, 12, 27, 8};
    static const int32_t toks_b[9] = {3, 3, 44, 21, 7, 16, 38, 2, 30};
    float *ref_a = ks_xmalloc(sizeof(float) * LM_N * LM_VOCAB), *ref_b = ks_xmalloc(sizeof(float) * 9 * LM_VOCAB);
    float *out = ks_xmalloc(sizeof(float) * 64 * LM_VOCAB);
    /* (a) one prefill of each sequence */
    lm_prefill(&t, LM_N, toks_a, ref_a);
    lm_prefill(&t, 9, toks_b, ref_b);
    int finite = 1;
    for (int i = 0; i < LM_N * LM_VOCAB; i++) finite &= isfinite(ref_a[i]);
    CHECK(finite);

    /* (b) token by token through the cache */
    lm_run r;
    lm_open(&r, &t, 4, 32);
    for (int i = 0; i < LM_N; i++) {
        int32_t seq = 0;
        CHECK(lm_step(&r, 1, &toks_a[i], &seq, out) == 0);
        check_same("token by token", out, ref_a + i * LM_VOCAB, LM_VOCAB, 1e-5);
    }
    lm_close(&r);

    /* (c) two sequences interleaved in each step, in chunks of odd sizes */
    static const struct {
        int n;            /* tokens in the step */
        char who[8];      /* 'a' or 'b' per token, in step order */
    } steps[] = {{7, "aabaaba"}, {1, "b"}, {6, "bbaabb"}, {7, "aaaabab"}};
    lm_open(&r, &t, 3, 32);
    int next_a = 0, next_b = 0;
    for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
        int32_t tok[8], seq[8], idx[8];
        for (int i = 0; i < steps[s].n; i++) {
            int is_a = steps[s].who[i] == 'a';
            seq[i] = is_a ? 2 : 1; /* sequence ids need not follow the order of arrival */
            idx[i] = is_a ? next_a++ : next_b++;
            tok[i] = is_a ? toks_a[idx[i]] : toks_b[idx[i]];
        }
        CHECK(lm_step(&r, steps[s].n, tok, seq, out) == 0);
        for (int i = 0; i < steps[s].n; i++) {
            const float *want = (seq[i] == 2 ? ref_a : ref_b) + idx[i] * LM_VOCAB;
            check_same("interleaved", out + i * LM_VOCAB, want, LM_VOCAB, 1e-5);
        }
    }
    CHECK(next_a == LM_N && next_b == 9);
    lm_close(&r);

    /* (d) a fork: a 5-token prompt leaves a shared, half-full block of 4;
     * each branch continues differently and must see the prompt and only
     * its own tokens. */
    static const int32_t prompt_c[8] = {1, 17, 42, 5, 5, 10, 11, 13};   /* prompt + branch c */
    static const int32_t prompt_d[8] = {1, 17, 42, 5, 5, 40, 41, 47};   /* prompt + branch d */
    float ref_c[8 * LM_VOCAB], ref_d[8 * LM_VOCAB];
    lm_prefill(&t, 8, prompt_c, ref_c);
    lm_prefill(&t, 8, prompt_d, ref_d);
    lm_open(&r, &t, 4, 32);
    int32_t seq0[8] = {0, 0, 0, 0, 0, 0, 0, 0}, seq1[3] = {1, 1, 1};
    CHECK(lm_step(&r, 5, prompt_c, seq0, out) == 0);
    check_same("prompt", out, ref_c, 5 * LM_VOCAB, 1e-5);
    const char *why;
    CHECK(krt_kv_seq_fork(r.kv, 0, 1, &why) == 0);
    CHECK(lm_step(&r, 3, prompt_d + 5, seq1, out) == 0); /* the fork writes first: it copies the block */
    check_same("branch d", out, ref_d + 5 * LM_VOCAB, 3 * LM_VOCAB, 1e-5);
    for (int i = 5; i < 8; i++) {
        CHECK(lm_step(&r, 1, &prompt_c[i], seq0, out) == 0);
        check_same("branch c", out, ref_c + i * LM_VOCAB, LM_VOCAB, 1e-5);
    }
    lm_close(&r);

    free(ref_a);
    free(ref_b);
    free(out);
    tg_free(&t);
}

/* ---- errors ------------------------------------------------------------------------------------ */
/* Steps are checked by the session (tests/session); the interpreter checks
 * what it is given when it is created. */
static void test_new_errors(void)
{
    tgraph t;
    build_llama(&t);
    ks_buf log = {0};
    ks_diag d = {.log = &log, .quiet = 1};

    /* No KV cache for a graph with attention; the message is at the first attention node. */
    CHECK(tg_interp(&t, NULL, &d) == NULL);
    kir_val first_attn = 0;
    while (t.g->nodes[first_attn].op != KIR_OP_ATTENTION) first_attn++;
    char want[256];
    snprintf(want, sizeof want, "test.kiln:%u:3: error: attention: the graph has attention but no KV cache was given\n",
             (unsigned)first_attn + 1);
    CHECK_STR(ks_buf_cstr(&log), want);

    /* A cache laid out for another model. */
    krt_kv_layer wrong[2] = {{LM_KV_HEADS, LM_HEAD_DIM, LM_HEAD_DIM}, {1, LM_HEAD_DIM, LM_HEAD_DIM}};
    krt_kv_config cfg = {2, wrong, 4, 8, 1, 32, sizeof(float), 0};
    krt_kv *kv = krt_kv_new(&cfg, &krt_kv_host_storage, &d);
    log.len = 0;
    CHECK(tg_interp(&t, kv, &d) == NULL);
    kir_val second_attn = first_attn + 1;
    while (t.g->nodes[second_attn].op != KIR_OP_ATTENTION) second_attn++;
    snprintf(want, sizeof want,
             "test.kiln:%u:3: error: attention: layer 1 needs 2 KV heads of 8 (K) and 8 (V) elements; "
             "the KV cache has 1, 8 and 8\n",
             (unsigned)second_attn + 1);
    CHECK_STR(ks_buf_cstr(&log), want);
    krt_kv_free(kv);

    cfg.n_layers = 1;
    kv = krt_kv_new(&cfg, &krt_kv_host_storage, &d);
    log.len = 0;
    CHECK(tg_interp(&t, kv, &d) == NULL);
    snprintf(want, sizeof want, "test.kiln:%u:3: error: attention: layer 1 is not in the KV cache (it has 1 layers)\n",
             (unsigned)second_attn + 1);
    CHECK_STR(ks_buf_cstr(&log), want);
    krt_kv_free(kv);

    cfg.n_layers = 2;
    wrong[1] = wrong[0];
    cfg.elem_size = 2;
    kv = krt_kv_new(&cfg, &krt_kv_host_storage, &d);
    log.len = 0;
    CHECK(tg_interp(&t, kv, &d) == NULL);
    snprintf(want, sizeof want,
             "test.kiln:%u:3: error: attention: the KV cache holds 2-byte elements; the interpreter needs f32 (4 bytes)\n",
             (unsigned)first_attn + 1);
    CHECK_STR(ks_buf_cstr(&log), want);
    krt_kv_free(kv);

    /* A weight without data. */
    kir_val w5 = 0;
    while (t.g->nodes[w5].op != KIR_OP_WEIGHT || strcmp(kir_get_str(t.g, w5, "name", ""), "w5") != 0) w5++;
    const void *saved = t.w[w5];
    t.w[w5] = NULL;
    cfg.elem_size = sizeof(float);
    kv = krt_kv_new(&cfg, &krt_kv_host_storage, &d);
    log.len = 0;
    CHECK(tg_interp(&t, kv, &d) == NULL);
    snprintf(want, sizeof want, "test.kiln:%u:3: error: weight: 'w5' has no data\n", (unsigned)w5 + 1);
    CHECK_STR(ks_buf_cstr(&log), want);
    t.w[w5] = saved;
    krt_kv_free(kv);

    /* (Attribute values the ops do not accept are the verifier's: tests/ir/test_verify.c.) */
    cfg.elem_size = sizeof(float);
    kv = krt_kv_new(&cfg, &krt_kv_host_storage, &d);
    krt_interp *ok = tg_interp(&t, kv, &d); /* all restored */
    CHECK(ok != NULL);
    krt_interp_free(ok);
    krt_kv_free(kv);

    ks_buf_free(&log);
    tg_free(&t);
}

/* The description's KV layout: one entry per layer number; a number no
 * attention uses stores nothing. Its vocabulary: the output's row. */
static void test_layout_queries(void)
{
    tgraph t;
    tg_init(&t, "layout");
    float *q = random_floats(2 * 4 * 6, 1.0f), *k = random_floats(2 * 2 * 6, 1.0f), *v = random_floats(2 * 2 * 5, 1.0f);
    int64_t dq[3] = {KIR_DIM_T, 4, 6}, dk[3] = {KIR_DIM_T, 2, 6}, dv[3] = {KIR_DIM_T, 2, 5}, d20[2] = {KIR_DIM_T, 20};
    kir_val qv = tg_activation(&t, 2, 3, dq, q), kv_ = tg_activation(&t, 2, 3, dk, k), vv = tg_activation(&t, 2, 3, dv, v);
    kir_val a0 = tg_attention(&t, qv, kv_, vv, 0, 0.5, 0, 0.0);
    kir_val a2 = tg_attention(&t, qv, kv_, kv_, 2, 0.5, 0, 0.0);
    tg_output(&t, tg_op2(&t, KIR_OP_ADD, tg_reshape(&t, a0, 2, d20), tg_reshape(&t, tg_op1(&t, KIR_OP_RELU, a0), 2, d20)));
    (void)a2;
    ks_diag d = {0};
    CHECK(tg_describe(&t, &d) == 0);
    int n = t.desc.n_kv_layers;
    const krt_kv_layer *layers = t.desc.kv_layers;
    CHECK(n == 3);
    CHECK(layers[0].kv_heads == 2 && layers[0].head_dim_k == 6 && layers[0].head_dim_v == 5);
    CHECK(layers[1].kv_heads == 0 && layers[1].head_dim_k == 0 && layers[1].head_dim_v == 0);
    CHECK(layers[2].kv_heads == 2 && layers[2].head_dim_k == 6 && layers[2].head_dim_v == 6);
    CHECK(t.desc.vocab == 20);
    /* The cache accepts the hole and the interpreter runs over it. */
    krt_kv_config cfg = {n, layers, 4, 4, 1, 8, sizeof(float), 0};
    krt_kv *kv = krt_kv_new(&cfg, &krt_kv_host_storage, &d);
    CHECK(kv && krt_kv_k(kv, 1) == NULL);
    const char *why;
    CHECK(krt_kv_seq_add(kv, 0, &why) == 0 && krt_kv_seq_reserve(kv, 0, 2, &why) == 0);
    krt_interp *it = tg_interp(&t, kv, &d);
    int32_t tok[2] = {0, 1}, pos[2] = {0, 1}, seq[2] = {0, 0};
    krt_step st = {2, tok, pos, seq};
    float out[40];
    CHECK(it && krt_interp_step(it, &st, out, &d) == 0);
    krt_interp_free(it);
    krt_kv_free(kv);
    free(q);
    free(k);
    free(v);
    tg_free(&t);

    /* No attention: no layers. */
    tg_init(&t, "plain");
    float table[4] = {1, 2, 3, 4};
    tg_output(&t, tg_op2(&t, KIR_OP_EMBED, tg_weight2(&t, 2, 2, table), tg_tokens(&t)));
    CHECK(tg_describe(&t, &d) == 0 && t.desc.n_kv_layers == 0 && t.desc.kv_layers == NULL && t.desc.vocab == 2);
    tg_free(&t);
}

int main(void)
{
    test_embed();
    test_matmul();
    test_binary();
    test_unary();
    test_softmax();
    test_norms();
    test_half_conversion();
    test_half_weights();
    test_views();
    test_rope_scaling();
    test_rope_halves_pairs();
    test_attention();
    test_kv_consistency();
    test_new_errors();
    test_layout_queries();
    return check_finish("interp");
}

/*
 * The pinned RoPE values were computed with this numpy script (float32
 * throughout, as torch does for HF's rope init functions):
 *
 *   import numpy as np, math
 *   f32 = np.float32
 *   def default_inv(theta, dim):
 *       e = np.arange(0, dim, 2).astype(f32) / f32(dim)
 *       return f32(1.0) / np.power(f32(theta), e)
 *   def llama3(inv, factor, low, high, orig):
 *       low_wl, high_wl = f32(orig / low), f32(orig / high)
 *       wavelen = f32(2 * math.pi) / inv
 *       inv_l = np.where(wavelen > low_wl, inv / f32(factor), inv)
 *       smooth = (f32(orig) / wavelen - f32(low)) / f32(high - low)
 *       smoothed = (f32(1) - smooth) * inv_l / f32(factor) + smooth * inv_l
 *       med = ~(wavelen < high_wl) * ~(wavelen > low_wl)
 *       return np.where(med, smoothed, inv_l).astype(f32)
 *   inv = default_inv(500000.0, 16)
 *   l3 = llama3(inv, 8.0, 1.0, 4.0, 8192)          # pin_llama3
 *   lin = (inv / f32(4.0)).astype(f32)             # pin_linear4
 *   for pos in (1, 77, 3000):
 *       ang = (f32(pos) * l3).astype(f32)
 *       cos = np.cos(ang.astype(np.float64)).astype(f32)   # pin_cos, likewise pin_sin
 */
