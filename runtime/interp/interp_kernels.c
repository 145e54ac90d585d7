/*
 * interp_kernels.c — the reference interpreter's kernel for each op of
 * ir/ops.def, in float32 on the CPU.
 *
 * These define what every op computes; the backends are tested against
 * them. So they are written to be read and to be exact where that is cheap:
 *  - every output element is computed the same way whatever the number of
 *    tokens in the step or how a matmul is split over threads, so a prompt
 *    run at once and token by token gives bit-identical results;
 *  - matmul and the dot products of attention accumulate in float32, as
 *    the GPU backends do; row reductions (norms, the softmax's sum) and
 *    transcendental functions use double and round once;
 *  - weights are read where they lie, in their own dtype: f16 and bf16 are
 *    converted to float32 (exactly) as they are read, so the arithmetic is
 *    that of f32 weights of the same values, bit for bit.
 */
#include "runtime/interp/interp_kernels.h"

#include "ir/quant.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* M_PI is POSIX/XSI, not C11. */

static const kir_node *node_of(const krt_interp_exec *x, kir_val v) { return &x->g->nodes[v]; }
static int64_t elems_of(const krt_interp_exec *x, kir_val v) { return kir_elems(node_of(x, v), x->n_tokens); }
static int64_t last_dim(const kir_node *n) { return n->dims[n->ndim - 1]; }

/* ---- reading values of any float dtype ------------------------------------------
 * Computed values are float32; a weight keeps the dtype it is stored in
 * (f32, f16 or bf16), and kernels read it there. elem_f32 is the one way
 * to read an element of either as float32 (exactly); the loops over
 * elements (load_f32, which reads a row or a tile, and the matmul's dot
 * product) are written once and inlined for each dtype, so that the switch
 * folds away and gcc vectorizes them (at -O2 too: blocks of 8, then a tail). */
#define KRT_INLINE static inline __attribute__((always_inline))

KRT_INLINE float f32_of_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

KRT_INLINE uint32_t bits_of_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* IEEE binary16 as ks_f16_to_f32 gives it, to the bit (NaN payloads too).
 * In h << 16 shifted right by 3 (arithmetic, as gcc shifts a negative int)
 * the sign stays in place and the exponent and mantissa land in float32's
 * places; scaling by 2^(127-15) then rebiases the exponent exactly (a
 * subnormal m * 2^-24 too), and an all-ones exponent (inf, NaN) is set back
 * to all ones. Seven vector operations for four values on plain x86-64.
 * A subnormal is scaled from a subnormal float32: this assumes the default
 * floating-point environment (no denormals-are-zero), as the rest of the
 * interpreter's arithmetic does to be the reference. */
KRT_INLINE float f16_value(uint16_t h)
{
    uint32_t b = (uint32_t)((int32_t)((uint32_t)h << 16) >> 3) & 0x8fffe000u;
    uint32_t inf_nan = (b & 0x0f800000u) == 0x0f800000u ? 0x7f800000u : 0;
    return f32_of_bits(bits_of_f32(f32_of_bits(b) * 0x1p112f) | inf_nan);
}

/* Element i of data of float dtype dt; bfloat16 is the high half of a float32. */
KRT_INLINE float elem_f32(const void *data, int64_t i, kir_dtype dt)
{
    switch (dt) {
    case KIR_BF16:
        return f32_of_bits((uint32_t)((const uint16_t *)data)[i] << 16);
    case KIR_F16:
        return f16_value(((const uint16_t *)data)[i]);
    default:
        return ((const float *)data)[i];
    }
}

KRT_INLINE void to_f32_as(float *out, const void *in, int64_t n, kir_dtype dt)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) out[i + l] = elem_f32(in, i + l, dt);
    for (; i < n; i++) out[i] = elem_f32(in, i, dt);
}

/* Elements [first, first + n) of data (of float dtype dt) as float32: where
 * they lie for f32, else converted into buf (room for n floats). */
static const float *load_f32(const void *data, kir_dtype dt, int64_t first, int64_t n, float *buf)
{
    switch (dt) {
    case KIR_F32:
        return (const float *)data + first;
    case KIR_BF16:
        to_f32_as(buf, (const uint16_t *)data + first, n, KIR_BF16);
        return buf;
    case KIR_F16:
        to_f32_as(buf, (const uint16_t *)data + first, n, KIR_F16);
        return buf;
    default:
        KS_UNREACHABLE(); /* the weight shape rule allows float types only */
    }
}

/* Where value v lies, and the dtype it lies there in: a weight's own; every
 * other value as f32 (a half value holds f32 elements its dtype represents). */
static const void *data_of(const krt_interp_exec *x, kir_val v)
{
    return node_of(x, v)->op == KIR_OP_WEIGHT ? x->weights[v] : x->src[v];
}

static kir_dtype stored_dtype(const kir_node *n) { return n->op == KIR_OP_WEIGHT ? n->dtype : KIR_F32; }

/* All of operand v (a bias, a norm's weight: small) as float32, or NULL when
 * v is KIR_NONE: where it lies, or converted into buf (room for all of it:
 * krt_interp_scratch_sizes counts it). */
static const float *load_all_f32(const krt_interp_exec *x, kir_val v, float *buf)
{
    if (v == KIR_NONE) return NULL;
    const kir_node *n = node_of(x, v);
    return load_f32(data_of(x, v), stored_dtype(n), 0, elems_of(x, v), buf);
}

/* Floats of v converted by load_all_f32 (0: none, it is f32 or absent). */
static size_t conv_floats(const kir_graph *g, kir_val v)
{
    if (v == KIR_NONE || stored_dtype(&g->nodes[v]) == KIR_F32) return 0;
    return (size_t)kir_elems(&g->nodes[v], 1); /* a weight: no T */
}

/* ---- matmul --------------------------------------------------------------------
 * out[t,n] = dot(x[t,:], w[n,:]); both rows are contiguous in K. The dot
 * product keeps eight partial sums (so the compiler can vectorize it) added
 * in a fixed tree, which makes its result depend on the two rows' values
 * only: not on w's dtype, nor on whether w was converted before. */
KRT_INLINE float dot_as(const float *a, const void *b, int64_t n, kir_dtype dt)
{
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[i + l] * elem_f32(b, i + l, dt);
    for (int l = 0; i < n; i++, l++) acc[l] += a[i] * elem_f32(b, i, dt);
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

static float dot(const float *a, const float *b, int64_t n) { return dot_as(a, b, n, KIR_F32); }

/* a (float32) with b of dtype dt, read where it lies. */
static float dot_weight(const float *a, const void *b, int64_t n, kir_dtype dt)
{
    switch (dt) {
    case KIR_BF16:
        return dot_as(a, b, n, KIR_BF16);
    case KIR_F16:
        return dot_as(a, b, n, KIR_F16);
    default:
        return dot_as(a, b, n, KIR_F32);
    }
}

/* A quantized weight (ir/quant.h): its parts, and whether x is quantized too, a token at a time. */
typedef struct quant_weight {
    kir_quant_layout q; /* its layout */
    const void *scale;  /* its scales */
    const void *zero;   /* its zero points, or NULL */
    kir_word scheme;    /* the matmul's quant: fp8 and w8a8 quantize x's rows (kir_quantize_row) */
} quant_weight;

typedef struct matmul_job {
    const float *x;    /* [rows, k] */
    const void *w;     /* [n, k] in w_dtype */
    kir_dtype w_dtype; /* f32, f16 or bf16; or a quantized weight's codes (quant) */
    const quant_weight *quant; /* a quantized weight's parts and scheme, or NULL */
    float *out;        /* [rows, n] */
    float *buf;        /* [tile_floats(k)] this job's tile of w as float32 (converting), or NULL */
    int64_t rows;      /* rows of x */
    int64_t k;         /* inner dim */
    int64_t n;         /* rows of w: columns of out */
    int64_t n0, n1;    /* the columns [n0, n1) this job computes */
} matmul_job;

/* Bytes of w, as float32, kept hot while every row of x passes over them (about L2). */
enum { MATMUL_W_TILE_BYTES = 256 * 1024 };

/* Rows of x from which an f16 or bf16 tile of w is converted to float32
 * once, then read by every row. With fewer (a decode step has one), the dot
 * product reads w where it lies, converting as it goes: a tile converted
 * first would be written and read back for one use, which measured slower
 * than f32 weights (bench/RESULTS.md, "CPU interpreter: half-precision
 * weights"). */
enum { MATMUL_CONVERT_ROWS = 4 };

/* Rows of w in a tile, for inner dim k, and the floats a converted tile takes. */
static int64_t tile_rows(int64_t k)
{
    int64_t tile = MATMUL_W_TILE_BYTES / (int64_t)sizeof(float) / k;
    return tile < 1 ? 1 : tile;
}
static size_t tile_floats(int64_t k) { return (size_t)(tile_rows(k) * k); }
/* A quantized weight's: its tile dequantized, and a row of x quantized (fp8, w8a8). */
static size_t quant_tile_floats(int64_t k) { return tile_floats(k) + (size_t)k; }

/* matmul_columns of a quantized weight: each tile dequantized (kir_dequantize_row), then every row
 * of x against it; fp8 and w8a8 take x's row quantized (kir_quantize_row) and scale the product back. */
static void quant_columns(const matmul_job *j, int64_t tile)
{
    const quant_weight *qw = j->quant;
    float *xq = j->buf + tile_floats(j->k);
    const int quant_x = qw->scheme == KIR_QUANT_FP8 || qw->scheme == KIR_QUANT_W8A8;
    for (int64_t c0 = j->n0; c0 < j->n1; c0 += tile) {
        int64_t c1 = c0 + tile < j->n1 ? c0 + tile : j->n1;
        for (int64_t c = c0; c < c1; c++)
            kir_dequantize_row(&qw->q, j->w, qw->scale, qw->zero, c, j->buf + (c - c0) * j->k);
        for (int64_t t = 0; t < j->rows; t++) {
            const float *xr = j->x + t * j->k;
            float sx = 1;
            if (quant_x) sx = kir_quantize_row(qw->scheme == KIR_QUANT_FP8 ? KIR_F8E4M3 : KIR_I8, xr, j->k, xq), xr = xq;
            float *o = j->out + t * j->n;
            for (int64_t c = c0; c < c1; c++) o[c] = dot(xr, j->buf + (c - c0) * j->k, j->k) * sx;
        }
    }
}

/* A tile of w's rows at a time, then every row of x against it. */
static void matmul_columns(const matmul_job *j)
{
    int64_t tile = tile_rows(j->k);
    if (tile > j->n1 - j->n0) tile = j->n1 - j->n0;
    int convert = j->w_dtype != KIR_F32 && j->rows >= MATMUL_CONVERT_ROWS;
    float *buf = j->buf;
    if (j->quant) { /* the reference dequantization: a tile of rows as float32 */
        quant_columns(j, tile);
        return;
    }
    size_t row_bytes = kir_dtype_size(j->w_dtype) * (size_t)j->k;
    for (int64_t c0 = j->n0; c0 < j->n1; c0 += tile) {
        int64_t c1 = c0 + tile < j->n1 ? c0 + tile : j->n1;
        /* w's rows [c0, c1), in place or as float32 */
        const void *wt = (const char *)j->w + (size_t)c0 * row_bytes;
        kir_dtype wt_dtype = j->w_dtype;
        size_t wt_row = row_bytes;
        if (convert) {
            wt = load_f32(j->w, j->w_dtype, c0 * j->k, (c1 - c0) * j->k, buf);
            wt_dtype = KIR_F32;
            wt_row = sizeof(float) * (size_t)j->k;
        }
        for (int64_t t = 0; t < j->rows; t++) {
            const float *xr = j->x + t * j->k;
            float *o = j->out + t * j->n;
            for (int64_t c = c0; c < c1; c++)
                o[c] = dot_weight(xr, (const char *)wt + (size_t)(c - c0) * wt_row, j->k, wt_dtype);
        }
    }
}

static void *matmul_worker(void *p)
{
    matmul_columns(p);
    return NULL;
}

/* Multiply-adds below which threads cost more than they save. */
#define MATMUL_THREAD_MIN_MACS ((int64_t)1 << 21)
enum { MATMUL_MAX_THREADS = 16 };

/* tiles: [n_threads * tile_floats(k)] for f16/bf16 weights (NULL for f32). */
static void matmul(const float *xs, const void *w, kir_dtype w_dtype, const quant_weight *quant, float *out,
                   int64_t rows, int64_t k, int64_t n, int n_threads, float *tiles, size_t tile)
{
    matmul_job jobs[MATMUL_MAX_THREADS];
    pthread_t tid[MATMUL_MAX_THREADS];
    int started[MATMUL_MAX_THREADS] = {0};
    int nt = rows * k * n >= MATMUL_THREAD_MIN_MACS ? n_threads : 1; /* tiles has room for n_threads */
    if (nt > MATMUL_MAX_THREADS) nt = MATMUL_MAX_THREADS;
    if (nt > n) nt = (int)n;
    if (nt < 1) nt = 1;
    for (int i = 0; i < nt; i++)
        jobs[i] = (matmul_job){xs, w, w_dtype, quant, out, tiles ? tiles + (size_t)i * tile : NULL, rows, k, n, n * i / nt,
                               n * (i + 1) / nt};
    /* Split by columns: each element is one dot(), whoever computes it. A
     * thread that cannot start leaves its columns to this one. */
    for (int i = 1; i < nt; i++) started[i] = pthread_create(&tid[i], NULL, matmul_worker, &jobs[i]) == 0;
    matmul_columns(&jobs[0]);
    for (int i = 1; i < nt; i++) {
        if (started[i])
            pthread_join(tid[i], NULL);
        else
            matmul_columns(&jobs[i]);
    }
}

static void run_matmul(const krt_interp_exec *x, kir_val v)
{
    const kir_node *n = node_of(x, v);
    const kir_node *w = node_of(x, n->in[1]);
    int64_t k = w->dims[1], cols = w->dims[0];
    quant_weight qw, *quant = NULL;
    if (n->nin > 2) {
        kir_quant_layout_of(x->g, v, &qw.q);
        qw.scale = data_of(x, n->in[2]);
        qw.zero = n->nin > 3 && n->in[3] != KIR_NONE ? data_of(x, n->in[3]) : NULL;
        qw.scheme = kir_attr_word(x->g, v, KIR_A_MATMUL_QUANT);
        quant = &qw;
    }
    matmul(x->src[n->in[0]], data_of(x, n->in[1]), w->dtype, quant, x->dst[v], elems_of(x, n->in[0]) / k, k, cols,
           x->n_threads, w->dtype != KIR_F32 ? x->scratch->tiles : NULL, x->scratch->tile);
}

/* ---- embedding ------------------------------------------------------------------ */
static void run_embed(const krt_interp_exec *x, kir_val v)
{
    const kir_node *n = node_of(x, v);
    const kir_node *table = node_of(x, n->in[0]);
    const void *data = data_of(x, n->in[0]);
    const int32_t *ids = x->ints[n->in[1]];
    int64_t dim = table->dims[1];
    /* ids were checked against the table's rows before the step */
    for (int64_t t = 0; t < x->n_tokens; t++) {
        float *o = x->dst[v] + t * dim;
        const float *row = load_f32(data, table->dtype, (int64_t)ids[t] * dim, dim, o);
        if (row != o) memcpy(o, row, sizeof(float) * (size_t)dim);
    }
}

/* ---- elementwise ------------------------------------------------------------------ */
/* The second operand's shape is a suffix of the first's: it repeats over the
 * first's leading dims; or (KIR_BROADCAST_ROW) it holds one value a row of
 * the first, which repeats along the row. */
static void run_binary(const krt_interp_exec *x, kir_val v)
{
    const kir_node *n = node_of(x, v);
    const float *pa = x->src[n->in[0]], *pb = load_all_f32(x, n->in[1], x->scratch->conv);
    float *o = x->dst[v];
    int64_t na = elems_of(x, n->in[0]), nb = elems_of(x, n->in[1]);
    const int row = kir_binary_broadcast(node_of(x, n->in[0]), node_of(x, n->in[1])) == KIR_BROADCAST_ROW;
    const int64_t d = row ? last_dim(node_of(x, n->in[0])) : nb;
    for (int64_t i = 0; i < na; i += d) {
        switch (n->op) {
            /* the arithmetic of ir/ops.def's KIR_BINARY lines */
#define KIR_BINARY(OP, what, expr)                                                                                  \
    case KIR_OP_##OP:                                                                                               \
        if (row)                                                                                                    \
            for (int64_t j = 0; j < d; j++) o[i + j] = kir_binary_##OP(pa[i + j], pb[i / d]);                       \
        else                                                                                                        \
            for (int64_t j = 0; j < nb; j++) o[i + j] = kir_binary_##OP(pa[i + j], pb[j]);                          \
        break;
#include "ir/ops.def"
        case KIR_OP_MASKED_FILL: { /* value where the mask is not 0 */
            const float fill = (float)kir_attr_float(x->g, v, KIR_A_MASKED_FILL_VALUE);
            if (row)
                for (int64_t j = 0; j < d; j++) o[i + j] = pb[i / d] != 0.0f ? fill : pa[i + j];
            else
                for (int64_t j = 0; j < nb; j++) o[i + j] = pb[j] != 0.0f ? fill : pa[i + j];
            break;
        }
        default:
            KS_UNREACHABLE();
        }
    }
}

static void run_unary(const krt_interp_exec *x, kir_val v)
{
    const kir_node *n = node_of(x, v);
    const float *a = x->src[n->in[0]];
    float *o = x->dst[v];
    int64_t ne = elems_of(x, v);
    switch (n->op) {
    case KIR_OP_SCALE: {
        float s = (float)kir_attr_float(x->g, v, KIR_A_SCALE_VALUE), sh = (float)kir_attr_float(x->g, v, KIR_A_SCALE_SHIFT);
        if (sh != 0.0f)
            for (int64_t i = 0; i < ne; i++) o[i] = a[i] * s + sh;
        else
            for (int64_t i = 0; i < ne; i++) o[i] = a[i] * s;
        break;
    }
    case KIR_OP_CLAMP: { /* NaN stays NaN (no comparison holds), as torch.clamp */
        float lo = (float)kir_attr_float(x->g, v, KIR_A_CLAMP_MIN), hi = (float)kir_attr_float(x->g, v, KIR_A_CLAMP_MAX);
        for (int64_t i = 0; i < ne; i++) o[i] = a[i] < lo ? lo : a[i] > hi ? hi : a[i];
        break;
    }
        /* the formulas of ir/ops.def, the ones the code generators write */
        /* (half_math, fast precision: the formula's half form, in float) */
#define KIR_FORMULA(OP, TYPE, what, expr, half)                                                                     \
    case KIR_OP_##OP:                                                                                               \
        if (kir_attr_int(x->g, v, KIR_A_ANY_HALF_MATH))                                                                 \
            for (int64_t i = 0; i < ne; i++) o[i] = kir_unary_half_##OP(a[i]);                                     \
        else                                                                                                        \
            for (int64_t i = 0; i < ne; i++) o[i] = kir_unary_##OP(a[i]);                                          \
        break;
#include "ir/ops.def"
    default:
        KS_UNREACHABLE();
    }
}

/* ---- norms: over the last dim -------------------------------------------------------- */
/* Operand i of n (a weight or a bias), or KIR_NONE when absent. */
static kir_val optional_operand(const kir_node *n, int i) { return i < n->nin ? n->in[i] : KIR_NONE; }

/* RMSNorm (Zhang & Sennrich 2019) as HF's LlamaRMSNorm: x / sqrt(mean(x^2) + eps), then * w. */
static void run_rms_norm(const krt_interp_exec *x, kir_val v)
{
    const kir_node *n = node_of(x, v);
    const float *a = x->src[n->in[0]], *w = load_all_f32(x, optional_operand(n, 1), x->scratch->conv);
    float *o = x->dst[v];
    int64_t d = last_dim(n), rows = elems_of(x, v) / d;
    double eps = kir_attr_float(x->g, v, KIR_A_RMS_NORM_EPS);
    for (int64_t r = 0; r < rows; r++) {
        const float *ar = a + r * d;
        float *orow = o + r * d;
        double ss = 0.0;
        for (int64_t i = 0; i < d; i++) ss += (double)ar[i] * ar[i];
        double inv = 1.0 / sqrt(ss / (double)d + eps);
        for (int64_t i = 0; i < d; i++) {
            float y = (float)(ar[i] * inv);
            orow[i] = w ? y * w[i] : y;
        }
    }
}

/* softmax over the last dim: the row's maximum (a NaN kept: ir/ops.def's max), then e^(x - max) over
 * their sum, in double; a row of -inf or with a NaN gives NaNs, as torch.softmax. */
static void run_softmax(const krt_interp_exec *x, kir_val v)
{
    const kir_node *n = node_of(x, v);
    const float *a = x->src[n->in[0]];
    float *o = x->dst[v];
    int64_t d = last_dim(n), rows = elems_of(x, v) / d;
    for (int64_t r = 0; r < rows; r++) {
        const float *ar = a + r * d;
        float m = -INFINITY;
        for (int64_t i = 0; i < d; i++) m = kir_binary_MAX(ar[i], m);
        double s = 0.0;
        for (int64_t i = 0; i < d; i++) s += exp((double)ar[i] - (double)m);
        for (int64_t i = 0; i < d; i++) o[r * d + i] = (float)(exp((double)ar[i] - (double)m) / s);
    }
}

/* ---- routing: sums, top-k, gathers and the experts' matmuls ------------------------------- */
/* The sum of each row over the last dim, in order, in double, rounded once. */
static void run_sum(const krt_interp_exec *x, kir_val v)
{
    const kir_node *n = node_of(x, v), *a = node_of(x, n->in[0]);
    const float *pa = x->src[n->in[0]];
    int64_t d = last_dim(a), rows = elems_of(x, v);
    for (int64_t r = 0; r < rows; r++) {
        double s = 0.0;
        for (int64_t i = 0; i < d; i++) s += pa[r * d + i];
        x->dst[v][r] = (float)s;
    }
}

/* amax, amin: each row's largest or smallest over the last dim, in order, with max's and min's
 * rule (ir/ops.def's KIR_BINARY: a NaN of either kept). */
static void run_extreme(const krt_interp_exec *x, kir_val v)
{
    const kir_node *n = node_of(x, v), *a = node_of(x, n->in[0]);
    const float *pa = x->src[n->in[0]];
    int64_t d = last_dim(a), rows = elems_of(x, v);
    const int largest = n->op == KIR_OP_AMAX;
    for (int64_t r = 0; r < rows; r++) {
        float m = pa[r * d];
        for (int64_t i = 1; i < d; i++) {
            const float e = pa[r * d + i];
            m = largest ? ((m != m || m > e) ? m : e) : ((m != m || m < e) ? m : e);
        }
        x->dst[v][r] = m;
    }
}

/* 1 when a (at index i) ranks above b (at index j): the larger, a NaN above every number (as
 * torch.topk), equal values by the lower index. */
static int ranks_above(float a, int64_t i, float b, int64_t j)
{
    if (a != a || b != b) return a != a && (b == b || i < j);
    return a > b || (a == b && i < j);
}

/* The indices of each row's k largest values, largest first (ranks_above's order): k passes of a
 * selection, each taking the best value not yet taken (k is a few experts). */
static void run_topk(const krt_interp_exec *x, kir_val v)
{
    const kir_node *n = node_of(x, v), *a = node_of(x, n->in[0]);
    const float *pa = x->src[n->in[0]];
    int32_t *o = (int32_t *)x->dst[v];
    int64_t d = last_dim(a), k = last_dim(n);
    for (int64_t t = 0; t < x->n_tokens; t++) {
        const float *row = pa + t * d;
        int32_t *ot = o + t * k;
        for (int64_t j = 0; j < k; j++) {
            int64_t best = -1;
            for (int64_t i = 0; i < d; i++) {
                int taken = 0;
                for (int64_t q = 0; q < j && !taken; q++) taken = ot[q] == i;
                if (!taken && (best < 0 || ranks_above(row[i], i, row[best], best))) best = i;
            }
            ot[j] = (int32_t)best;
        }
    }
}

/* out[t,j] = x[t, idx[t,j]] (the indices are a topk's over a row no wider than x's: ir/shape.c). */
static void run_gather(const krt_interp_exec *x, kir_val v)
{
    const kir_node *n = node_of(x, v), *a = node_of(x, n->in[0]);
    const float *pa = x->src[n->in[0]];
    const int32_t *idx = (const int32_t *)x->src[n->in[1]];
    int64_t d = last_dim(a), k = last_dim(n);
    for (int64_t t = 0; t < x->n_tokens; t++)
        for (int64_t j = 0; j < k; j++) x->dst[v][t * k + j] = pa[t * d + idx[t * k + j]];
}

/* out[t,j,:] = w[e] x_t (+ b[e]) with e = idx[t,j] (without idx, j), where x_t is x's row t (x[T,K]:
 * each chosen expert takes the token's row) or row (t,j) (x[T,k,K]); each element one dot product in the
 * matmul's order. */
static void run_expert_matmul(const krt_interp_exec *x, kir_val v)
{
    const kir_node *n = node_of(x, v), *in = node_of(x, n->in[0]), *w = node_of(x, n->in[1]);
    const float *px = x->src[n->in[0]];
    const int32_t *idx = n->nin > 2 ? (const int32_t *)x->src[n->in[2]] : NULL; /* none: row j, matrix j */
    kir_val bv = optional_operand(n, 3);
    const void *wd = data_of(x, n->in[1]), *bd = bv != KIR_NONE ? data_of(x, bv) : NULL;
    kir_dtype bt = bv != KIR_NONE ? stored_dtype(node_of(x, bv)) : KIR_F32;
    int64_t k = n->dims[1], cols = w->dims[1], depth = w->dims[2];
    size_t row_bytes = kir_dtype_size(w->dtype) * (size_t)depth;
    for (int64_t t = 0; t < x->n_tokens; t++)
        for (int64_t j = 0; j < k; j++) {
            int64_t e = idx ? idx[t * k + j] : j;
            const float *xr = px + (in->ndim == 3 ? t * k + j : t) * depth;
            const char *we = (const char *)wd + (size_t)e * (size_t)cols * row_bytes;
            float *o = x->dst[v] + (t * k + j) * cols;
            for (int64_t c = 0; c < cols; c++) {
                o[c] = dot_weight(xr, we + (size_t)c * row_bytes, depth, w->dtype);
                if (bd) o[c] += elem_f32(bd, e * cols + c, bt);
            }
        }
}

/* out[t,:] = the sum over j of g[t,j] y[t,j,:], j in order, in float. */
static void run_expert_sum(const krt_interp_exec *x, kir_val v)
{
    const kir_node *n = node_of(x, v), *y = node_of(x, n->in[0]);
    const float *py = x->src[n->in[0]], *pg = x->src[n->in[1]];
    int64_t k = y->dims[1], cols = y->dims[2];
    for (int64_t t = 0; t < x->n_tokens; t++) {
        float *o = x->dst[v] + t * cols;
        for (int64_t c = 0; c < cols; c++) {
            float s = 0.0f;
            for (int64_t j = 0; j < k; j++) s += pg[t * k + j] * py[(t * k + j) * cols + c];
            o[c] = s;
        }
    }
}

/* LayerNorm with the biased variance, as torch.nn.LayerNorm. */
static void run_layer_norm(const krt_interp_exec *x, kir_val v)
{
    const kir_node *n = node_of(x, v);
    const float *a = x->src[n->in[0]];
    kir_val wv = optional_operand(n, 1), bv = optional_operand(n, 2);
    float *conv = x->scratch->conv; /* the weight's conversion, then the bias's */
    const float *w = load_all_f32(x, wv, conv), *b = load_all_f32(x, bv, conv + conv_floats(x->g, wv));
    float *o = x->dst[v];
    int64_t d = last_dim(n), rows = elems_of(x, v) / d;
    double eps = kir_attr_float(x->g, v, KIR_A_RMS_NORM_EPS);
    for (int64_t r = 0; r < rows; r++) {
        const float *ar = a + r * d;
        float *orow = o + r * d;
        double mean = 0.0, var = 0.0;
        for (int64_t i = 0; i < d; i++) mean += ar[i];
        mean /= (double)d;
        for (int64_t i = 0; i < d; i++) var += ((double)ar[i] - mean) * ((double)ar[i] - mean);
        double inv = 1.0 / sqrt(var / (double)d + eps);
        for (int64_t i = 0; i < d; i++) {
            float y = (float)(((double)ar[i] - mean) * inv);
            if (w) y *= w[i];
            if (b) y += b[i];
            orow[i] = y;
        }
    }
}

/* ---- views: reshape, slice, concat (copies here; a backend may alias) ------------------ */
static void run_reshape(const krt_interp_exec *x, kir_val v)
{
    const kir_node *n = node_of(x, v);
    /* under a memory plan a reshape aliases its operand: nothing to move */
    if (x->dst[v] != x->src[n->in[0]]) memcpy(x->dst[v], x->src[n->in[0]], sizeof(float) * (size_t)elems_of(x, v));
}

static void run_slice(const krt_interp_exec *x, kir_val v)
{
    const kir_node *n = node_of(x, v);
    int64_t d_in = last_dim(node_of(x, n->in[0])), d = last_dim(n);
    int64_t start = kir_attr_int(x->g, v, KIR_A_SLICE_START), rows = elems_of(x, v) / d;
    const float *a = x->src[n->in[0]];
    for (int64_t r = 0; r < rows; r++) memcpy(x->dst[v] + r * d, a + r * d_in + start, sizeof(float) * (size_t)d);
}

/* Row r of concat node n (every dim but the last, row-major) as a row of operand a, whose dims of 1
 * between T and the last repeat. */
static int64_t concat_row(const kir_node *n, const kir_node *a, int64_t r)
{
    int64_t src = 0, scale = 1;
    for (int d = n->ndim - 2; d >= 1; d--) {
        int64_t j = r % n->dims[d];
        r /= n->dims[d];
        if (a->dims[d] != 1) src += j * scale;
        scale *= a->dims[d];
    }
    return src + r * scale; /* r is the token now */
}

static void run_concat(const krt_interp_exec *x, kir_val v)
{
    const kir_node *n = node_of(x, v);
    int64_t d = last_dim(n), rows = elems_of(x, v) / d, at = 0;
    for (int i = 0; i < n->nin; i++) {
        const kir_node *an = node_of(x, n->in[i]);
        int64_t di = last_dim(an);
        const float *a = x->src[n->in[i]];
        for (int64_t r = 0; r < rows; r++)
            memcpy(x->dst[v] + r * d + at, a + concat_row(n, an, r) * di, sizeof(float) * (size_t)di);
        at += di;
    }
}

/* ---- rotary position embedding (Su et al. 2021) ------------------------------------------ */

/* The angle of rotation j at position pos: HF multiplies in float32; the
 * cosine and sine are taken in double and rounded once (with half_math,
 * fast precision: in float). */
static void run_rope(const krt_interp_exec *x, kir_val v)
{
    const kir_node *n = node_of(x, v);
    const krt_interp_rope *rp = &x->rope[v];
    const float *a = x->src[n->in[0]];
    const int32_t *pos = x->ints[n->in[1]];
    float *o = x->dst[v];
    int64_t heads = n->dims[1], d = n->dims[2];
    int half = rp->rot_dim / 2;
    float *cs = x->scratch->rope, *freq_at = cs + 2 * half; /* [2 * half], [half] */
    const int half_math = (int)kir_attr_int(x->g, v, KIR_A_ANY_HALF_MATH);
    /* yarn's attention factor: cos and sin times it, in float, as HF's rotary embedding scales them */
    const float af = (float)kir_attr_float(x->g, v, KIR_A_ROPE_ATTENTION_FACTOR);
    const int32_t *len = rp->by_length ? x->ints[n->in[2]] : NULL;
    int32_t freq_len = 0; /* the sequence length freq_at holds the frequencies of; 0: none */
    for (int64_t t = 0; t < x->n_tokens; t++) {
        const float *inv_freq = rp->inv_freq;
        if (len && len[t] > rp->short_up_to) { /* longrope's long factors, dynamic's grown base */
            if (len[t] != freq_len) kir_rope_inv_freq(x->g, v, rp->rot_dim, len[t], freq_at);
            freq_len = len[t];
            inv_freq = freq_at;
        }
        for (int j = 0; j < half; j++) {
            float angle = (float)pos[t] * inv_freq[j];
            cs[2 * j] = half_math ? cosf(angle) : (float)cos((double)angle);
            cs[2 * j + 1] = half_math ? sinf(angle) : (float)sin((double)angle);
            if (af != 1.0f) cs[2 * j] *= af, cs[2 * j + 1] *= af;
        }
        for (int64_t h = 0; h < heads; h++) {
            const float *xr = a + (t * heads + h) * d;
            float *orow = o + (t * heads + h) * d;
            for (int j = 0; j < half; j++) {
                int i0 = rp->pairs ? 2 * j : j, i1 = rp->pairs ? 2 * j + 1 : j + half;
                float c = cs[2 * j], s = cs[2 * j + 1], x0 = xr[i0], x1 = xr[i1];
                orow[i0] = x0 * c - x1 * s;
                orow[i1] = x1 * c + x0 * s;
            }
            for (int64_t i = rp->rot_dim; i < d; i++) orow[i] = xr[i];
        }
    }
}

/* ---- attention through the paged KV cache --------------------------------------------- */

/* p[0..n) rounded to nearest even in dtype t, kept as float32 (the
 * interpreter stores every value as f32: a half value is one whose f32
 * elements are all representable in its dtype). */
static void round_to(kir_dtype t, float *p, size_t n)
{
    if (t == KIR_BF16)
        for (size_t i = 0; i < n; i++) p[i] = ks_bf16_to_f32(ks_f32_to_bf16(p[i]));
    else if (t == KIR_F16)
        for (size_t i = 0; i < n; i++) p[i] = ks_f16_to_f32(ks_f32_to_f16(p[i]));
}

/* Each token's K row (krow floats) and V row (vrow floats) of kv_heads heads into the cache of `layer`,
 * at the slot of its (sequence, position), each head's part as the cache's dtype (node v's kv_dtype)
 * holds it (kir_kv_round: rounded to a half dtype, or the values of a quantized cache's codes). */
static void write_kv_rows(const krt_interp_exec *x, kir_val v, int layer, const float *k, const float *vv, int64_t krow,
                          int64_t vrow, int64_t kv_heads)
{
    float *kc = krt_kv_k(x->kv, layer), *vc = krt_kv_v(x->kv, layer); /* vc NULL: V in the K rows (v_in_k) */
    const krt_step *st = x->step;
    kir_dtype t = kir_kv_dtype(x->g, v);
    for (int64_t t_ = 0; t_ < x->n_tokens; t_++) {
        int64_t slot = krt_kv_slot(x->kv, st->seq_ids[t_], st->positions[t_]);
        memcpy(kc + slot * krow, k + t_ * krow, sizeof(float) * (size_t)krow);
        if (vc) memcpy(vc + slot * vrow, vv + t_ * vrow, sizeof(float) * (size_t)vrow);
        for (int64_t h = 0; h < kv_heads; h++) {
            kir_kv_round(t, kc + slot * krow + h * (krow / kv_heads), krow / kv_heads);
            if (vc) kir_kv_round(t, vc + slot * vrow + h * (vrow / kv_heads), vrow / kv_heads);
        }
    }
}

/* x rounded to half dtype t (bf16 or f16). */
static float round1(kir_dtype t, float x)
{
    return t == KIR_BF16 ? ks_bf16_to_f32(ks_f32_to_bf16(x)) : ks_f16_to_f32(ks_f32_to_f16(x));
}

/* dot(a, b) with each element of b rounded to half dtype t first (dot_as's order). */
static float dot_round(const float *a, const float *b, int64_t n, kir_dtype t)
{
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[i + l] * round1(t, b[i + l]);
    for (int l = 0; i < n; i++, l++) acc[l] += a[i] * round1(t, b[i]);
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* kv_write(k, v): the rows into the cache; its value is k. */
static void run_kv_write(const krt_interp_exec *x, kir_val v)
{
    const kir_node *n = node_of(x, v);
    const kir_node *kn = node_of(x, n->in[0]), *vn = node_of(x, n->in[1]);
    int layer = (int)kir_attr_int(x->g, v, KIR_A_ATTENTION_LAYER);
    write_kv_rows(x, v, layer, x->src[n->in[0]], x->src[n->in[1]], kir_row_elems(kn), kir_row_elems(vn), kn->dims[1]);
    if (x->dst[v] != x->src[n->in[0]]) memcpy(x->dst[v], x->src[n->in[0]], sizeof(float) * (size_t)elems_of(x, v));
}

static void run_attention(const krt_interp_exec *x, kir_val v)
{
    const kir_node *n = node_of(x, v);
    const kir_node *qn = node_of(x, n->in[0]), *kn = node_of(x, n->in[1]), *vn = node_of(x, n->in[2]);
    const float *q = x->src[n->in[0]], *k = x->src[n->in[1]], *vv = x->src[n->in[2]];
    float *o = x->dst[v];
    int64_t heads = qn->dims[1], dk = qn->dims[2], kv_heads = kn->dims[1], dv = vn->dims[2];
    int64_t group = heads / kv_heads, krow = kv_heads * dk, vrow = kv_heads * dv;
    int layer = (int)kir_attr_int(x->g, v, KIR_A_ATTENTION_LAYER);
    float scale = (float)kir_attr_float(x->g, v, KIR_A_ATTENTION_SCALE);
    int64_t window = kir_attr_int(x->g, v, KIR_A_ATTENTION_WINDOW);
    float softcap = (float)kir_attr_float(x->g, v, KIR_A_ATTENTION_SOFTCAP);
    float *kc = krt_kv_k(x->kv, layer), *vc = krt_kv_v(x->kv, layer);
    /* V in the K rows (v_in_k, passes/share_kv.c): each head's first dv values of its K row */
    const int v_in_k = kir_attr_int(x->g, v, KIR_A_ATTENTION_V_IN_K) != 0;
    const int64_t vstride = v_in_k ? krow : vrow, vhead = v_in_k ? dk : dv;
    if (v_in_k) vc = kc;
    const int alibi = kir_attr_int(x->g, v, KIR_A_ATTENTION_ALIBI) != 0;
    /* sinks: a logit a head that every row's softmax holds besides its positions', with no value (gpt-oss;
     * transformers puts it among the scores, the maximum over both) */
    const float *sinks = load_all_f32(x, optional_operand(n, 3), x->scratch->conv);
    const krt_step *st = x->step;
    /* a half cache (fast precision): the GPU's attention kernels multiply p and v on tensor cores, p
     * (relative to the row's maximum so far) rounded to the cache's dtype and the sum of the unrounded
     * ones dividing after (kcu_flash_attention, kcu_flash90, kcu_flash_decode); the same here, relative
     * to the row's maximum, which the GPU's running maximum mostly is from the first positions on */
    const kir_dtype kvt = kir_kv_dtype(x->g, v);
    /* a cache of codes under half q (fast precision) goes through the same kernels, each code times its
     * row's scale rounded to q's dtype as it is staged (kcu_fa_chunk): mt that dtype, and K's and V's
     * values rounded to it as they are read (rk); in exact precision a cache of codes' values multiply in f32 */
    const int codes = kvt == KIR_I8 || kvt == KIR_F8E4M3;
    const kir_dtype mt = kvt == KIR_BF16 || kvt == KIR_F16                       ? kvt
                         : codes && (qn->dtype == KIR_BF16 || qn->dtype == KIR_F16) ? qn->dtype
                                                                                    : KIR_F32;
    const int half = mt != KIR_F32, rk = half && codes;

    /* 1. Every token's K and V go into the cache first, so tokens later in
     *    the step see the earlier ones of their sequence; with write_kv=0 a
     *    kv_write earlier in the schedule has put them there. */
    if (kir_attr_int(x->g, v, KIR_A_ATTENTION_WRITE_KV)) write_kv_rows(x, v, layer, k, vv, krow, vrow, kv_heads);
    /* 2. Each token attends to positions [lo, pos] of its sequence (the scratch has room for the step's
     *    largest position + 1). */
    int64_t *slots = x->scratch->slots;
    float *score = x->scratch->score;
    for (int64_t t = 0; t < x->n_tokens; t++) {
        int seq = st->seq_ids[t], pos = st->positions[t];
        int lo = window > 0 && pos - window + 1 > 0 ? (int)(pos - window + 1) : 0;
        int len = pos - lo + 1;
        for (int j = 0; j < len; j++) slots[j] = krt_kv_slot(x->kv, seq, lo + j);
        for (int64_t h = 0; h < heads; h++) {
            const float *qh = q + (t * heads + h) * dk;
            int64_t kh = h / group;
            float m = -INFINITY;
            const float slope = alibi ? kir_alibi_slope(heads, h) : 0.0f;
            for (int j = 0; j < len; j++) {
                const float *kj = kc + slots[j] * krow + kh * dk;
                float s = (rk ? dot_round(qh, kj, dk, mt) : dot(qh, kj, dk)) * scale;
                if (softcap > 0.0f) s = softcap * (float)tanh((double)(s / softcap));
                if (alibi) s += slope * (float)(lo + j); /* the key's position */
                score[j] = s;
                if (s > m) m = s;
            }
            if (sinks && sinks[h] > m) m = sinks[h];
            double sum = 0.0;
            for (int j = 0; j < len; j++) {
                score[j] = (float)exp((double)(score[j] - m));
                sum += score[j];
            }
            if (sinks) sum += (float)exp((double)(sinks[h] - m));
            float *oh = o + (t * heads + h) * dv;
            memset(oh, 0, sizeof(float) * (size_t)dv);
            /* a half cache: p v on half operands, the exponentials rounded and the sum of the unrounded
             * ones dividing after; else p normalized first, in f32 */
            if (half) round_to(mt, score, (size_t)len);
            for (int j = 0; j < len; j++) {
                float p = half ? score[j] : (float)(score[j] / sum);
                const float *vj = vc + slots[j] * vstride + kh * vhead;
                if (rk)
                    for (int64_t i = 0; i < dv; i++) oh[i] += p * round1(mt, vj[i]);
                else
                    for (int64_t i = 0; i < dv; i++) oh[i] += p * vj[i];
            }
            if (half)
                for (int64_t i = 0; i < dv; i++) oh[i] = (float)(oh[i] / sum);
        }
    }
}

/* ---- the scratch ------------------------------------------------------------------------- */
void krt_interp_scratch_sizes(const kir_graph *g, size_t *conv, size_t *tile, size_t *rope)
{
    *conv = *tile = *rope = 0;
    for (size_t i = 0; i < g->n_nodes; i++) {
        const kir_node *n = &g->nodes[i];
        size_t c = 0;
        switch (n->op) {
        case KIR_OP_ADD:
        case KIR_OP_SUB:
        case KIR_OP_MUL:
        case KIR_OP_MAX:
        case KIR_OP_MIN:
        case KIR_OP_DIV:
        case KIR_OP_MASKED_FILL:
        case KIR_OP_GE:
        case KIR_OP_GT:
        case KIR_OP_RMS_NORM:
            c = conv_floats(g, optional_operand(n, 1));
            break;
        case KIR_OP_LAYER_NORM:
            c = conv_floats(g, optional_operand(n, 1)) + conv_floats(g, optional_operand(n, 2));
            break;
        case KIR_OP_ATTENTION: /* its sinks */
            c = conv_floats(g, optional_operand(n, 3));
            break;
        case KIR_OP_MATMUL:
            if (n->nin > 2 && quant_tile_floats(g->nodes[n->in[1]].dims[1]) > *tile)
                *tile = quant_tile_floats(g->nodes[n->in[1]].dims[1]);
            else if (g->nodes[n->in[1]].dtype != KIR_F32 && tile_floats(g->nodes[n->in[1]].dims[1]) > *tile)
                *tile = tile_floats(g->nodes[n->in[1]].dims[1]);
            break;
        case KIR_OP_ROPE: { /* cos and sin, and the frequencies of a longer sequence: rot_dim * 3/2 */
            size_t r = (size_t)kir_attr_int(g, (kir_val)i, KIR_A_ROPE_ROT_DIM);
            if (r + r / 2 > *rope) *rope = r + r / 2;
            break;
        }
        default:
            break;
        }
        if (c > *conv) *conv = c;
    }
}

/* ---- results ------------------------------------------------------------------------------ */
static void run_output(const krt_interp_exec *x, kir_val v)
{
    const kir_node *n = node_of(x, v);
    memcpy(x->dst[v], x->src[n->in[0]], sizeof(float) * (size_t)elems_of(x, v));
}

/* A switch without a default: -Wswitch (in -Wall) names any op of
 * ir/ops.def that has no kernel here. */
static void run_node(const krt_interp_exec *x, kir_val v)
{
    switch (node_of(x, v)->op) {
    case KIR_OP_INPUT:  /* bound to the step's arrays */
    case KIR_OP_WEIGHT: /* bound to the weights */
        return;
    case KIR_OP_EMBED:
        run_embed(x, v);
        return;
    case KIR_OP_MATMUL:
        run_matmul(x, v);
        return;
#define KIR_BINARY(OP, what, expr) case KIR_OP_##OP: /* the binary ops of ir/ops.def */
#include "ir/ops.def"
    case KIR_OP_MASKED_FILL:
        run_binary(x, v);
        return;
    case KIR_OP_SCALE:
    case KIR_OP_CLAMP:
#define KIR_FORMULA(OP, TYPE, what, expr, half) case KIR_OP_##OP: /* the unary ops of ir/ops.def's formulas */
#include "ir/ops.def"
        run_unary(x, v);
        return;
    case KIR_OP_SOFTMAX:
        run_softmax(x, v);
        return;
    case KIR_OP_SUM:
        run_sum(x, v);
        return;
    case KIR_OP_AMAX:
    case KIR_OP_AMIN:
        run_extreme(x, v);
        return;
    case KIR_OP_TOPK:
        run_topk(x, v);
        return;
    case KIR_OP_GATHER:
        run_gather(x, v);
        return;
    case KIR_OP_EXPERT_MATMUL:
        run_expert_matmul(x, v);
        return;
    case KIR_OP_EXPERT_SUM:
        run_expert_sum(x, v);
        return;
    case KIR_OP_RMS_NORM:
        run_rms_norm(x, v);
        return;
    case KIR_OP_LAYER_NORM:
        run_layer_norm(x, v);
        return;
    case KIR_OP_RESHAPE:
        run_reshape(x, v);
        return;
    case KIR_OP_SLICE:
        run_slice(x, v);
        return;
    case KIR_OP_CONCAT:
        run_concat(x, v);
        return;
    case KIR_OP_ROPE:
        run_rope(x, v);
        return;
    case KIR_OP_ATTENTION:
        run_attention(x, v);
        return;
    case KIR_OP_KV_WRITE:
        run_kv_write(x, v);
        return;
    case KIR_OP_OUTPUT:
        run_output(x, v);
        return;
    case KIR_OP_COUNT:
        break;
    }
    KS_UNREACHABLE();
}

void krt_interp_exec_node(const krt_interp_exec *x, kir_val v)
{
    run_node(x, v);
    const kir_node *n = node_of(x, v);
    /* a half value (lower_precision): what a kernel stores of it */
    if (x->dst[v] && (n->dtype == KIR_BF16 || n->dtype == KIR_F16)) round_to(n->dtype, x->dst[v], (size_t)elems_of(x, v));
}
