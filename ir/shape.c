/* shape.c — one shape rule per row of ir/ops.def: from operands and
 * attributes to the result's dtype and dims, or a message that names the op
 * and the shapes that disagree. */
#include "ir/ir.h"

#include <string.h>

typedef struct shape_ctx {
    const kir_graph *g; /* the graph */
    kir_val v;          /* the node being inferred */
    const kir_node *n;  /* its record */
    kir_dtype dtype;    /* result, filled by the rule */
    int ndim;           /* result rank */
    int64_t dims[KIR_MAX_DIMS]; /* result dims */
    ks_buf *err;        /* message on failure */
} shape_ctx;

static int fail(shape_ctx *c, const char *fmt, ...) KS_PRINTF(2, 3);
static int fail(shape_ctx *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ks_buf_printf(c->err, "%s: ", kir_op_table[c->n->op].name);
    ks_buf_vprintf(c->err, fmt, ap);
    va_end(ap);
    return -1;
}

/* Operand i, or NULL when absent. */
static const kir_node *operand(shape_ctx *c, int i)
{
    if (i >= c->n->nin || c->n->in[i] == KIR_NONE) return NULL;
    return &c->g->nodes[c->n->in[i]];
}

static const char *type_str(ks_buf *b, const kir_node *n)
{
    ks_buf_clear(b);
    kir_format_type(b, n);
    return ks_buf_cstr(b);
}

static int is_float(kir_dtype t) { return t == KIR_F32 || t == KIR_F16 || t == KIR_BF16; }

/* An activation: float, first dim T. */
static int want_activation(shape_ctx *c, const kir_node *x, const char *what)
{
    ks_buf b = KS_BUF_TRY;
    int bad = !is_float(x->dtype) || x->ndim < 1 || x->dims[0] != KIR_DIM_T;
    if (bad) fail(c, "%s must be a float tensor with T as its first dim, got %s", what, type_str(&b, x));
    ks_buf_free(&b);
    return bad ? -1 : 0;
}

/* The dtype of a value an op computes: where it is stored is a choice, not
 * a consequence of its operands' dtypes, so it is the node's own when that
 * is a float (f32 as built; lower_precision or an edited dump may make it
 * f16 or bf16), else f32. The arithmetic is f32 whatever the dtypes. */
static kir_dtype activation_dtype(const shape_ctx *c) { return is_float(c->n->dtype) ? c->n->dtype : KIR_F32; }

/* x's shape, computed anew: the node's own activation dtype. */
static void same_as(shape_ctx *c, const kir_node *x)
{
    c->dtype = activation_dtype(c);
    c->ndim = x->ndim;
    memcpy(c->dims, x->dims, sizeof c->dims);
}

/* x itself, seen another way (its bytes): x's dtype and shape. */
static void view_of(shape_ctx *c, const kir_node *x)
{
    same_as(c, x);
    c->dtype = x->dtype;
}


/* ---- the rules ------------------------------------------------------------------ */

static int kir_shape_input(shape_ctx *c)
{
    c->dtype = KIR_I32;
    c->ndim = 1;
    c->dims[0] = KIR_DIM_T;
    return 0;
}

static int kir_shape_weight(shape_ctx *c)
{
    /* a weight's declared type is the truth */
    c->dtype = c->n->dtype;
    c->ndim = c->n->ndim;
    memcpy(c->dims, c->n->dims, sizeof c->dims);
    for (int i = 0; i < c->ndim; i++)
        if (c->dims[i] <= 0) return fail(c, "weight dims must be positive constants");
    if (kir_dtype_is_quantized(c->dtype)) {
        if (c->ndim != 2) return fail(c, "quantized weights (%s) must be [N,K] matrices", kir_dtype_name(c->dtype));
        if (c->dtype == KIR_U4 && c->dims[1] % 2) return fail(c, "u4 weights pack two codes a byte: K must be even");
        return 0;
    }
    if (!is_float(c->dtype))
        return fail(c, "weights must be f32, f16 or bf16 (or quantized codes: u4, u8, i8, f8e4m3)");
    return 0;
}

static int kir_shape_embed(shape_ctx *c)
{
    const kir_node *tab = operand(c, 0), *ids = operand(c, 1);
    ks_buf b = KS_BUF_TRY, b2 = KS_BUF_TRY;
    int rc = 0;
    if (!tab || !ids)
        rc = fail(c, "needs a table and token ids");
    else if (tab->ndim != 2 || tab->dims[0] <= 0 || tab->dims[1] <= 0 || !is_float(tab->dtype))
        rc = fail(c, "table must be a [rows,dim] float weight, got %s", type_str(&b, tab));
    else if (ids->dtype != KIR_I32 || ids->ndim != 1 || ids->dims[0] != KIR_DIM_T)
        rc = fail(c, "ids must be i32[T], got %s", type_str(&b2, ids));
    else {
        c->dtype = activation_dtype(c);
        c->ndim = 2;
        c->dims[0] = KIR_DIM_T;
        c->dims[1] = tab->dims[1];
    }
    ks_buf_free(&b);
    ks_buf_free(&b2);
    return rc;
}

/* The scheme a quantized weight's codes take: u4 w4a16; u8 w8a16; i8 w8a16 or w8a8; f8e4m3 fp8. */
static int quant_fits(kir_dtype codes, kir_word q)
{
    switch (codes) {
    case KIR_U4: return q == KIR_QUANT_W4A16;
    case KIR_U8: return q == KIR_QUANT_W8A16;
    case KIR_I8: return q == KIR_QUANT_W8A16 || q == KIR_QUANT_W8A8;
    case KIR_F8E4M3: return q == KIR_QUANT_FP8;
    default: return q == KIR_QUANT_NONE;
    }
}

/* A quantized matmul's scale[N/r,K/g] and zero points (u8, the scale's dims; u4 and u8 codes only). */
static int check_quant_operands(shape_ctx *c, const kir_node *w, ks_buf *b)
{
    const kir_node *scale = operand(c, 2), *zero = operand(c, 3);
    if (!scale) return fail(c, "a quantized weight (%s) needs its scales", type_str(b, w));
    if (scale->ndim != 2 || !is_float(scale->dtype) || scale->dims[0] <= 0 || scale->dims[1] <= 0 ||
        w->dims[0] % scale->dims[0] || w->dims[1] % scale->dims[1])
        return fail(c, "scales must be a float [N/r,K/g] whose blocks divide the weight's %lldx%lld, got %s",
                    (long long)w->dims[0], (long long)w->dims[1], type_str(b, scale));
    if (!zero) return 0;
    if (w->dtype != KIR_U4 && w->dtype != KIR_U8)
        return fail(c, "zero points go with u4 or u8 codes, not %s", kir_dtype_name(w->dtype));
    if (zero->dtype != KIR_U8 || zero->ndim != 2 || zero->dims[0] != scale->dims[0] || zero->dims[1] != scale->dims[1])
        return fail(c, "zero points must be u8[%lld,%lld] (a scale's blocks), got %s", (long long)scale->dims[0],
                    (long long)scale->dims[1], type_str(b, zero));
    return 0;
}

static int kir_shape_matmul(shape_ctx *c)
{
    const kir_node *x = operand(c, 0), *w = operand(c, 1);
    if (!x || !w) return fail(c, "needs an input and a weight");
    if (want_activation(c, x, "input")) return -1;
    ks_buf b = KS_BUF_TRY, b2 = KS_BUF_TRY;
    int rc = 0;
    kir_word q = kir_attr_word(c->g, c->v, KIR_A_MATMUL_QUANT);
    int quantized = kir_dtype_is_quantized(w->dtype);
    if (x->ndim != 2)
        rc = fail(c, "input must be [T,K], got %s", type_str(&b, x));
    else if (w->ndim != 2 || w->dims[0] == KIR_DIM_T || w->dims[1] == KIR_DIM_T || !(is_float(w->dtype) || quantized))
        rc = fail(c, "weight must be a [N,K] float or quantized matrix, got %s", type_str(&b, w));
    else if (x->dims[1] != w->dims[1])
        rc = fail(c, "inner dimensions differ: %s x %s", type_str(&b, x), type_str(&b2, w));
    else if (!quant_fits(w->dtype, q))
        rc = fail(c, "quant=%s does not multiply a %s weight", kir_word_table[q].text, kir_dtype_name(w->dtype));
    else if (!quantized && c->n->nin > 2)
        rc = fail(c, "scales and zero points go with a quantized weight, not %s", type_str(&b, w));
    else if (quantized && check_quant_operands(c, w, &b) != 0)
        rc = -1;
    else {
        c->dtype = activation_dtype(c);
        c->ndim = 2;
        c->dims[0] = KIR_DIM_T;
        c->dims[1] = w->dims[0];
    }
    ks_buf_free(&b);
    ks_buf_free(&b2);
    return rc;
}

kir_broadcast kir_binary_broadcast(const kir_node *a, const kir_node *b)
{
    int suffix = b->ndim <= a->ndim;
    for (int i = 0; suffix && i < b->ndim; i++) suffix = b->dims[b->ndim - 1 - i] == a->dims[a->ndim - 1 - i];
    if (suffix) return KIR_BROADCAST_SUFFIX;
    int row = b->ndim == a->ndim && a->ndim >= 2 && b->dims[b->ndim - 1] == 1;
    for (int i = 0; row && i < a->ndim - 1; i++) row = b->dims[i] == a->dims[i];
    return row ? KIR_BROADCAST_ROW : KIR_BROADCAST_NONE;
}

int kir_concat_repeats(const kir_node *n, const kir_node *a)
{
    for (int d = 1; d + 1 < n->ndim; d++)
        if (a->dims[d] != n->dims[d]) return 1;
    return 0;
}

static int kir_shape_binary(shape_ctx *c)
{
    const kir_node *a = operand(c, 0), *b = operand(c, 1);
    if (!a || !b) return fail(c, "needs two operands");
    if (want_activation(c, a, "first operand")) return -1;
    ks_buf s1 = KS_BUF_TRY, s2 = KS_BUF_TRY;
    int ok = is_float(b->dtype) && kir_binary_broadcast(a, b) != KIR_BROADCAST_NONE;
    int rc = 0;
    if (!ok)
        rc = fail(c, "shapes do not broadcast: %s and %s", type_str(&s1, a), type_str(&s2, b));
    else
        same_as(c, a);
    ks_buf_free(&s1);
    ks_buf_free(&s2);
    return rc;
}

/* An i32 [T,k] operand of indices: a topk's over rows of at most `bound` values (what they index has
 * `bound` entries: every index is in range, whatever the values ranked). */
static int want_indices(shape_ctx *c, const kir_node *idx, int64_t bound, const char *what)
{
    ks_buf b = KS_BUF_TRY;
    int rc = 0;
    if (idx->dtype != KIR_I32 || idx->ndim != 2 || idx->dims[0] != KIR_DIM_T || idx->dims[1] < 1)
        rc = fail(c, "%s must be i32[T,k] indices (topk's), got %s", what, type_str(&b, idx));
    else if (idx->op != KIR_OP_TOPK || idx->nin < 1 || idx->in[0] == KIR_NONE)
        rc = fail(c, "%s must be a topk's", what);
    else {
        const kir_node *ranked = &c->g->nodes[idx->in[0]];
        int64_t width = ranked->ndim ? ranked->dims[ranked->ndim - 1] : 0;
        if (width > bound)
            rc = fail(c, "%s rank %lld values a row, but index only %lld", what, (long long)width, (long long)bound);
    }
    ks_buf_free(&b);
    return rc;
}

/* sum: the last dim summed, kept as 1 */
static int kir_shape_row_sum(shape_ctx *c)
{
    const kir_node *x = operand(c, 0);
    if (!x) return fail(c, "needs an operand");
    if (want_activation(c, x, "operand")) return -1;
    if (x->ndim < 2) return fail(c, "operand needs a dim after T");
    same_as(c, x);
    c->dims[c->ndim - 1] = 1;
    return 0;
}

/* topk: x[T,N] -> i32[T,k], k <= N */
static int kir_shape_topk(shape_ctx *c)
{
    const kir_node *x = operand(c, 0);
    if (!x) return fail(c, "needs an operand");
    if (want_activation(c, x, "operand")) return -1;
    ks_buf b = KS_BUF_TRY;
    int64_t k = kir_attr_int(c->g, c->v, KIR_A_TOPK_K);
    int rc = 0;
    if (x->ndim != 2)
        rc = fail(c, "operand must be [T,N], got %s", type_str(&b, x));
    else if (k < 1 || k > x->dims[1])
        rc = fail(c, "k = %lld must be from 1 to the %lld values of a row of %s", (long long)k, (long long)x->dims[1],
                  type_str(&b, x));
    else {
        c->dtype = KIR_I32;
        c->ndim = 2;
        c->dims[0] = KIR_DIM_T;
        c->dims[1] = k;
    }
    ks_buf_free(&b);
    return rc;
}

/* gather: (x[T,N], idx i32[T,k]) -> [T,k] */
static int kir_shape_gather(shape_ctx *c)
{
    const kir_node *x = operand(c, 0), *idx = operand(c, 1);
    if (!x || !idx) return fail(c, "needs values and indices");
    if (want_activation(c, x, "values")) return -1;
    if (x->ndim != 2) {
        ks_buf b = KS_BUF_TRY;
        fail(c, "values must be [T,N], got %s", type_str(&b, x));
        ks_buf_free(&b);
        return -1;
    }
    if (want_indices(c, idx, x->dims[1], "indices")) return -1;
    same_as(c, x);
    c->dims[1] = idx->dims[1];
    return 0;
}

/* expert_matmul: (x[T,K] or [T,k,K], w[E,N,K], idx i32[T,k], b[E,N]?) -> [T,k,N]; without indices
 * (x[T,E,K], w[E,N,K]) -> [T,E,N], row j through matrix j (MLA's per-head projections) */
static int kir_shape_expert_matmul(shape_ctx *c)
{
    const kir_node *x = operand(c, 0), *w = operand(c, 1), *idx = operand(c, 2), *bias = operand(c, 3);
    if (!x || !w) return fail(c, "needs an input and expert weights");
    if (!idx && c->n->nin > 2) return fail(c, "a bias needs the indices (without them, a matrix a row of x)");
    if (want_activation(c, x, "input")) return -1;
    ks_buf b = KS_BUF_TRY, b2 = KS_BUF_TRY;
    int64_t k = idx ? idx->dims[1] : x->ndim == 3 ? x->dims[1] : 0;
    int rc = 0;
    if (w->ndim != 3 || !is_float(w->dtype) || w->dims[0] == KIR_DIM_T)
        rc = fail(c, "expert weights must be a [E,N,K] float weight, got %s", type_str(&b, w));
    else if (idx && want_indices(c, idx, w->dims[0], "indices"))
        rc = -1;
    else if (!idx && !(x->ndim == 3 && x->dims[1] == w->dims[0]))
        rc = fail(c, "without indices the input must be [T,%lld,K] (a row for each of the %lld matrices), got %s",
                  (long long)w->dims[0], (long long)w->dims[0], type_str(&b, x));
    else if (!(x->ndim == 2 || (x->ndim == 3 && x->dims[1] == k)))
        rc = fail(c, "input must be [T,K] or [T,%lld,K] (a row for each of the %lld experts chosen), got %s",
                  (long long)k, (long long)k, type_str(&b, x));
    else if (x->dims[x->ndim - 1] != w->dims[2])
        rc = fail(c, "inner dimensions differ: %s x %s", type_str(&b, x), type_str(&b2, w));
    else if (bias && (bias->ndim != 2 || bias->dims[0] != w->dims[0] || bias->dims[1] != w->dims[1] ||
                      !is_float(bias->dtype)))
        rc = fail(c, "bias must be [%lld,%lld] (a row for each expert), got %s", (long long)w->dims[0],
                  (long long)w->dims[1], type_str(&b, bias));
    else {
        c->dtype = activation_dtype(c);
        c->ndim = 3;
        c->dims[0] = KIR_DIM_T;
        c->dims[1] = k;
        c->dims[2] = w->dims[1];
    }
    ks_buf_free(&b);
    ks_buf_free(&b2);
    return rc;
}

/* expert_sum: (y[T,k,N], g[T,k]) -> [T,N] */
static int kir_shape_expert_sum(shape_ctx *c)
{
    const kir_node *y = operand(c, 0), *g = operand(c, 1);
    if (!y || !g) return fail(c, "needs values and their weights");
    if (want_activation(c, y, "values") || want_activation(c, g, "weights")) return -1;
    ks_buf b = KS_BUF_TRY, b2 = KS_BUF_TRY;
    int rc = 0;
    if (y->ndim != 3)
        rc = fail(c, "values must be [T,k,N], got %s", type_str(&b, y));
    else if (g->ndim != 2 || g->dims[1] != y->dims[1])
        rc = fail(c, "weights must be [T,%lld] (one for each row of %s), got %s", (long long)y->dims[1],
                  type_str(&b, y), type_str(&b2, g));
    else {
        c->dtype = activation_dtype(c);
        c->ndim = 2;
        c->dims[0] = KIR_DIM_T;
        c->dims[1] = y->dims[2];
    }
    ks_buf_free(&b);
    ks_buf_free(&b2);
    return rc;
}

static int kir_shape_unary(shape_ctx *c)
{
    const kir_node *x = operand(c, 0);
    if (!x) return fail(c, "needs an operand");
    if (want_activation(c, x, "operand")) return -1;
    same_as(c, x);
    return 0;
}

/* clamp: a unary op whose bounds are in order (the backends apply min, then max) */
static int kir_shape_clamp(shape_ctx *c)
{
    double lo = kir_attr_float(c->g, c->v, KIR_A_CLAMP_MIN), hi = kir_attr_float(c->g, c->v, KIR_A_CLAMP_MAX);
    if (lo > hi) return fail(c, "min %g is above max %g", lo, hi);
    return kir_shape_unary(c);
}

static int kir_shape_norm(shape_ctx *c)
{
    const kir_node *x = operand(c, 0);
    if (!x) return fail(c, "needs an operand");
    if (want_activation(c, x, "operand")) return -1;
    int64_t d = x->dims[x->ndim - 1];
    if (d == KIR_DIM_T) return fail(c, "cannot normalize over T");
    for (int i = 1; i < c->n->nin; i++) {
        const kir_node *w = operand(c, i);
        if (!w) continue;
        if (w->ndim != 1 || w->dims[0] != d || !is_float(w->dtype)) {
            ks_buf s1 = KS_BUF_TRY, s2 = KS_BUF_TRY;
            fail(c, "%s %s does not match the normalized dim of %s", i == 1 ? "weight" : "bias",
                 type_str(&s1, w), type_str(&s2, x));
            ks_buf_free(&s1);
            ks_buf_free(&s2);
            return -1;
        }
    }
    same_as(c, x);
    return 0;
}

static int kir_shape_reshape(shape_ctx *c)
{
    const kir_node *x = operand(c, 0);
    if (!x) return fail(c, "needs an operand");
    if (want_activation(c, x, "operand")) return -1;
    uint32_t n = 0;
    const int64_t *shape = kir_attr_ints(c->g, c->v, KIR_A_RESHAPE_SHAPE, &n);
    if (!shape) return fail(c, "needs a shape=[T,...] attribute");
    if (n < 1 || n > KIR_MAX_DIMS || shape[0] != KIR_DIM_T)
        return fail(c, "shape must start with T and have at most %d dims", KIR_MAX_DIMS);
    int64_t elems = 1;
    for (uint32_t i = 1; i < n; i++) {
        if (shape[i] <= 0 || shape[i] > ((int64_t)1 << 40)) return fail(c, "shape dims must be positive");
        if (elems > ((int64_t)1 << 48) / shape[i]) return fail(c, "shape has too many elements"); /* no overflow */
        elems *= shape[i];
    }
    if (elems != kir_row_elems(x)) {
        ks_buf s1 = KS_BUF_TRY, s2 = KS_BUF_TRY;
        kir_format_dims(&s2, (int)n, shape);
        fail(c, "element counts differ: %s to %s", type_str(&s1, x), ks_buf_cstr(&s2));
        ks_buf_free(&s1);
        ks_buf_free(&s2);
        return -1;
    }
    c->dtype = x->dtype; /* a view of x's bytes */
    c->ndim = (int)n;
    for (int i = 0; i < c->ndim; i++) c->dims[i] = shape[i];
    return 0;
}

static int kir_shape_slice(shape_ctx *c)
{
    const kir_node *x = operand(c, 0);
    if (!x) return fail(c, "needs an operand");
    if (want_activation(c, x, "operand")) return -1;
    int64_t d = x->dims[x->ndim - 1];
    int64_t s = kir_attr_int(c->g, c->v, KIR_A_SLICE_START), e = kir_attr_int(c->g, c->v, KIR_A_SLICE_END);
    if (x->ndim < 2 || s < 0 || e <= s || e > d) {
        ks_buf b = KS_BUF_TRY;
        fail(c, "range [%lld,%lld) outside the last dim of %s", (long long)s, (long long)e, type_str(&b, x));
        ks_buf_free(&b);
        return -1;
    }
    same_as(c, x);
    c->dims[c->ndim - 1] = e - s;
    return 0;
}

static int kir_shape_concat(shape_ctx *c)
{
    const kir_node *first = operand(c, 0);
    if (!first) return fail(c, "needs operands");
    if (want_activation(c, first, "operand")) return -1;
    if (first->ndim < 2) return fail(c, "operands need a dim after T");
    same_as(c, first);
    /* the dims between T and the last: each operand's is the result's or 1 (repeated: MLA's one rotary
       key for every head) */
    for (int i = 1; i < c->n->nin; i++) {
        const kir_node *x = operand(c, i);
        if (!x || x->ndim != first->ndim) continue; /* reported below */
        for (int d = 1; d + 1 < x->ndim; d++)
            if (x->dims[d] > c->dims[d]) c->dims[d] = x->dims[d];
    }
    int64_t last = 0;
    for (int i = 0; i < c->n->nin; i++) {
        const kir_node *x = operand(c, i);
        if (!x) return fail(c, "operand %d missing", i + 1);
        int ok = x->ndim == first->ndim && is_float(x->dtype) && x->dims[0] == first->dims[0];
        for (int d = 1; ok && d + 1 < x->ndim; d++) ok = x->dims[d] == c->dims[d] || x->dims[d] == 1;
        if (!ok) {
            ks_buf s1 = KS_BUF_TRY, s2 = KS_BUF_TRY;
            fail(c, "operands differ in more than the last dim (a dim of 1 repeats): %s and %s", type_str(&s1, first),
                 type_str(&s2, x));
            ks_buf_free(&s1);
            ks_buf_free(&s2);
            return -1;
        }
        last += x->dims[x->ndim - 1];
    }
    c->dims[c->ndim - 1] = last;
    return 0;
}

static int kir_shape_rope(shape_ctx *c)
{
    const kir_node *x = operand(c, 0), *pos = operand(c, 1);
    if (!x || !pos) return fail(c, "needs a tensor and positions");
    if (want_activation(c, x, "operand")) return -1;
    ks_buf b = KS_BUF_TRY;
    int rc = 0;
    if (x->ndim != 3)
        rc = fail(c, "operand must be [T,heads,head_dim], got %s", type_str(&b, x));
    else if (pos->dtype != KIR_I32 || pos->ndim != 1 || pos->dims[0] != KIR_DIM_T)
        rc = fail(c, "positions must be i32[T], got %s", type_str(&b, pos));
    else {
        int64_t rot = kir_attr_int(c->g, c->v, KIR_A_ROPE_ROT_DIM);
        kir_word scaling = kir_attr_word(c->g, c->v, KIR_A_ROPE_SCALING);
        /* longrope's and dynamic's frequencies follow each token's sequence length in the step */
        const int by_length = kir_rope_scaling_by_length(scaling);
        const kir_node *len = c->n->nin > 2 ? operand(c, 2) : NULL;
        uint32_t n_short = 0, n_long = 0;
        (void)kir_attr_floats(c->g, c->v, KIR_A_ROPE_SHORT_FACTOR, &n_short);
        (void)kir_attr_floats(c->g, c->v, KIR_A_ROPE_LONG_FACTOR, &n_long);
        if (rot <= 0 || rot > x->dims[2] || rot % 2)
            rc = fail(c, "rot_dim %lld must be even and within head_dim %lld", (long long)rot, (long long)x->dims[2]);
        else if (by_length && !len)
            rc = fail(c, "%s scaling needs each token's sequence length (a third operand, seq_lengths)",
                      kir_word_table[scaling].text);
        else if (!by_length && c->n->nin > 2)
            rc = fail(c, "a third operand (seq_lengths) is read by longrope and dynamic scaling only, not %s",
                      kir_word_table[scaling].text);
        else if (len && (len->dtype != KIR_I32 || len->ndim != 1 || len->dims[0] != KIR_DIM_T))
            rc = fail(c, "seq_lengths must be i32[T], got %s", type_str(&b, len));
        else if (scaling == KIR_ROPE_SCALING_LONGROPE && (n_short != rot / 2 || n_long != rot / 2))
            rc = fail(c, "longrope needs short_factor and long_factor of rot_dim/2 = %lld numbers each, got %u and %u",
                      (long long)(rot / 2), n_short, n_long);
        else if (scaling != KIR_ROPE_SCALING_LONGROPE && (n_short || n_long))
            rc = fail(c, "short_factor and long_factor belong to longrope scaling, not %s", kir_word_table[scaling].text);
        else if (scaling == KIR_ROPE_SCALING_DYNAMIC && rot < 4)
            rc = fail(c, "dynamic scaling needs rot_dim of at least 4 (its base grows by rot_dim / (rot_dim - 2))");
        else
            same_as(c, x);
    }
    ks_buf_free(&b);
    return rc;
}

static int kir_shape_attention(shape_ctx *c)
{
    const kir_node *q = operand(c, 0), *k = operand(c, 1), *v = operand(c, 2);
    const kir_node *sinks = c->n->nin > 3 ? operand(c, 3) : NULL;
    if (!q || !k || !v) return fail(c, "needs q, k and v");
    ks_buf s1 = KS_BUF_TRY, s2 = KS_BUF_TRY, s3 = KS_BUF_TRY;
    int rc = 0;
    if (want_activation(c, q, "q") || want_activation(c, k, "k") || want_activation(c, v, "v"))
        rc = -1;
    else if (q->ndim != 3 || k->ndim != 3 || v->ndim != 3)
        rc = fail(c, "q, k, v must be [T,heads,head_dim], got %s, %s, %s", type_str(&s1, q), type_str(&s2, k),
                  type_str(&s3, v));
    else if (q->dims[2] != k->dims[2] || k->dims[1] != v->dims[1] || q->dims[1] % k->dims[1] != 0)
        rc = fail(c, "q %s, k %s and v %s do not fit (head dims of q and k equal, heads of q a multiple of k's)",
                  type_str(&s1, q), type_str(&s2, k), type_str(&s3, v));
    else if (sinks && (sinks->ndim != 1 || sinks->dims[0] != q->dims[1] || !is_float(sinks->dtype)))
        rc = fail(c, "sinks %s must be [heads] of q %s: a logit a head", type_str(&s1, sinks), type_str(&s2, q));
    else {
        c->dtype = activation_dtype(c);
        c->ndim = 3;
        c->dims[0] = KIR_DIM_T;
        c->dims[1] = q->dims[1];
        c->dims[2] = v->dims[2];
    }
    ks_buf_free(&s1);
    ks_buf_free(&s2);
    ks_buf_free(&s3);
    return rc;
}

/* kv_write(k, v): K and V rows for the cache; its value is k, passed through. */
static int kir_shape_kv_write(shape_ctx *c)
{
    const kir_node *k = operand(c, 0), *v = operand(c, 1);
    if (!k || !v) return fail(c, "needs k and v");
    if (want_activation(c, k, "k") || want_activation(c, v, "v")) return -1;
    ks_buf s1 = KS_BUF_TRY, s2 = KS_BUF_TRY;
    int rc = 0;
    if (k->ndim != 3 || v->ndim != 3 || k->dims[1] != v->dims[1])
        rc = fail(c, "k and v must be [T,kv_heads,head_dim] with the same heads, got %s and %s", type_str(&s1, k),
                  type_str(&s2, v));
    else
        view_of(c, k);
    ks_buf_free(&s1);
    ks_buf_free(&s2);
    return rc;
}

static int kir_shape_output(shape_ctx *c)
{
    const kir_node *x = operand(c, 0);
    if (!x) return fail(c, "needs an operand");
    if (want_activation(c, x, "operand")) return -1;
    view_of(c, x);
    return 0;
}

typedef int (*shape_rule)(shape_ctx *c);
static const shape_rule shape_rules[KIR_OP_COUNT] = {
#define KIR_OP(NAME, text, min, max, shape, fuse, be) [KIR_OP_##NAME] = kir_shape_##shape,
#include "ir/ops.def"
#undef KIR_OP
};

int kir_infer(kir_graph *g, kir_val v, ks_buf *err)
{
    KS_ASSERT(v < g->n_nodes);
    kir_node *n = &g->nodes[v];
    shape_ctx c = {.g = g, .v = v, .n = n, .err = err};
    const kir_op_info *info = &kir_op_table[n->op];
    if (n->nin < info->min_inputs || n->nin > info->max_inputs)
        return fail(&c, "takes %d to %d operands, got %d", info->min_inputs, info->max_inputs, n->nin);
    for (int i = 0; i < n->nin; i++)
        if (n->in[i] != KIR_NONE && n->in[i] >= v) return fail(&c, "operand %d is not defined before use", i + 1);
    if (shape_rules[n->op](&c) != 0) return -1;
    n->dtype = c.dtype;
    n->ndim = (uint8_t)c.ndim;
    memset(n->dims, 0, sizeof n->dims);
    memcpy(n->dims, c.dims, sizeof(int64_t) * (size_t)c.ndim);
    return 0;
}
