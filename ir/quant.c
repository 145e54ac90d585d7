/* quant.c — quantized weights in the graph (ir/ir.h, "quantized weights"):
 * the float matrix a part stands for, and the verifier's check that a
 * quantized matmul's codes, scales and zero points are parts of one
 * quantization. */
#include "ir/quant.h"

#include <math.h>
#include <string.h>

int kir_weight_quant_part(const kir_graph *g, kir_val w)
{
    return g->nodes[w].op == KIR_OP_WEIGHT && kir_attr_has(g, w, KIR_A_WEIGHT_QUANT);
}

void kir_quant_data_dims(const kir_graph *g, kir_val w, int64_t dims[2])
{
    const kir_node *n = kir_node_at(g, w);
    KS_ASSERT(n->ndim == 2);
    dims[0] = n->dims[0];
    dims[1] = n->dims[1];
    if (kir_attr_word(g, w, KIR_A_WEIGHT_QUANT) != KIR_QUANT_PART_CODES) {
        dims[0] *= kir_attr_int(g, w, KIR_A_WEIGHT_BLOCK_ROWS);
        dims[1] *= kir_attr_int(g, w, KIR_A_WEIGHT_GROUP);
    }
}

kir_dtype kir_quant_codes_dtype(const kir_graph *g, kir_val w)
{
    const char *t = kir_attr_str(g, w, KIR_A_WEIGHT_QTYPE);
    int d = t ? kir_dtype_lookup(t) : -1;
    return d >= 0 && kir_dtype_is_quantized((kir_dtype)d) ? (kir_dtype)d : KIR_DTYPE_COUNT;
}

void kir_quant_layout_of(const kir_graph *g, kir_val m, kir_quant_layout *q)
{
    const kir_node *n = kir_node_at(g, m);
    KS_ASSERT(n->op == KIR_OP_MATMUL && n->nin >= 3);
    kir_quant_layout_of_part(g, n->in[1], kir_node_at(g, n->in[2])->dtype, q);
}

void kir_quant_layout_of_part(const kir_graph *g, kir_val w, kir_dtype scale_dtype, kir_quant_layout *q)
{
    KS_ASSERT(kir_weight_quant_part(g, w));
    int64_t dims[2];
    kir_quant_data_dims(g, w, dims);
    *q = (kir_quant_layout){
        .codes = kir_quant_codes_dtype(g, w),
        .scale = scale_dtype,
        .rows = dims[0],
        .cols = dims[1],
        .block_rows = kir_attr_int(g, w, KIR_A_WEIGHT_BLOCK_ROWS),
        .group = kir_attr_int(g, w, KIR_A_WEIGHT_GROUP),
        .asym = (int)kir_attr_int(g, w, KIR_A_WEIGHT_ASYM),
    };
    KS_ASSERT(q->codes != KIR_DTYPE_COUNT && q->group > 0 && q->block_rows > 0);
}

int64_t kir_quant_blocks(const kir_quant_layout *q) { return (q->rows / q->block_rows) * (q->cols / q->group); }
uint64_t kir_quant_codes_bytes(const kir_quant_layout *q) { return kir_dtype_bytes(q->codes, (uint64_t)(q->rows * q->cols)); }
uint64_t kir_quant_scale_bytes(const kir_quant_layout *q) { return kir_dtype_bytes(q->scale, (uint64_t)kir_quant_blocks(q)); }
uint64_t kir_quant_zero_bytes(const kir_quant_layout *q) { return q->asym ? (uint64_t)kir_quant_blocks(q) : 0; }

float kir_quant_scale(const kir_quant_layout *q, const void *scale, int64_t i)

{
    if (q->scale == KIR_F32) {
        float f;
        memcpy(&f, (const uint8_t *)scale + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, (const uint8_t *)scale + 2 * i, 2);
    return q->scale == KIR_F16 ? ks_f16_to_f32(h) : ks_bf16_to_f32(h);
}

void kir_dequantize_row(const kir_quant_layout *q, const void *codes, const void *scale, const void *zero, int64_t n,
                       float *out)
{
    const int64_t bc = q->cols / q->group, br = n / q->block_rows;
    for (int64_t b = 0; b < bc; b++) {
        const float s = kir_quant_scale(q, scale, br * bc + b);
        const float z = q->asym ? (float)((const uint8_t *)zero)[br * bc + b] : 0.0f;
        const int64_t k0 = b * q->group, k1 = k0 + q->group;
        const uint8_t *c = (const uint8_t *)codes;
        /* kir_quant_code's cases, each its own loop (the interpreter's matmul dequantizes every weight of a step) */
        switch (q->codes) {
        case KIR_U4: {
            const float m = q->asym ? z : z + 8.0f;
            for (int64_t k = k0; k < k1; k++) {
                const int64_t at = n * q->cols + k;
                out[k] = ((float)(at % 2 ? c[at / 2] >> 4 : c[at / 2] & 15) - m) * s;
            }
            break;
        }
        case KIR_U8: {
            const float m = q->asym ? z : z + 128.0f;
            for (int64_t k = k0; k < k1; k++) out[k] = ((float)c[n * q->cols + k] - m) * s;
            break;
        }
        case KIR_I8:
            for (int64_t k = k0; k < k1; k++) out[k] = (float)(int8_t)c[n * q->cols + k] * s;
            break;
        default:
            for (int64_t k = k0; k < k1; k++) out[k] = (kir_quant_code(q, codes, n, k) - z) * s;
            break;
        }
    }
}

/* Whether two weights' attribute `a` are equal (both absent too). */
static int same_attr(const kir_graph *g, kir_val a, kir_val b, const char *key)
{
    const kir_attr *x = kir_get(g, a, key), *y = kir_get(g, b, key);
    if (!x || !y) return !x && !y;
    if (x->kind != y->kind) return 0;
    switch (x->kind) {
    case KIR_ATTR_INT: return x->u.i == y->u.i;
    case KIR_ATTR_FLOAT: return x->u.f == y->u.f;
    case KIR_ATTR_STR: return strcmp(x->u.s, y->u.s) == 0;
    case KIR_ATTR_INTS:
        return x->u.ints.n == y->u.ints.n && (!x->u.ints.n || !memcmp(x->u.ints.v, y->u.ints.v, x->u.ints.n * sizeof *x->u.ints.v));
    case KIR_ATTR_FLOATS:
        return x->u.floats.n == y->u.floats.n &&
               (!x->u.floats.n || !memcmp(x->u.floats.v, y->u.floats.v, x->u.floats.n * sizeof *x->u.floats.v));
    }
    return 0;
}

/* What is wrong with part w of a quantization (one message), or NULL. */
static const char *part_problem(const kir_graph *g, kir_val w, ks_buf *why)
{
    const kir_node *n = kir_node_at(g, w);
    kir_word part = kir_attr_word(g, w, KIR_A_WEIGHT_QUANT);
    kir_dtype codes = kir_quant_codes_dtype(g, w);
    if (codes == KIR_DTYPE_COUNT) return "qtype must name the codes' dtype: u4, u8, i8 or f8e4m3";
    if (!kir_attr_has(g, w, KIR_A_WEIGHT_DERIVE))
        return "a quantized weight's part derives from float data: it needs derive, sources and rows";
    if (n->ndim != 2) return "a quantized weight's part is a matrix";
    if (!kir_attr_has(g, w, KIR_A_WEIGHT_GROUP)) return "a quantized weight's part needs its group";
    int asym = (int)kir_attr_int(g, w, KIR_A_WEIGHT_ASYM);
    if (asym && codes != KIR_U4 && codes != KIR_U8) return "zero points (asym=1) go with u4 or u8 codes";
    int64_t dims[2];
    kir_quant_data_dims(g, w, dims);
    int64_t group = kir_attr_int(g, w, KIR_A_WEIGHT_GROUP), rows = kir_attr_int(g, w, KIR_A_WEIGHT_BLOCK_ROWS);
    if (dims[1] % group || dims[0] % rows) {
        ks_buf_printf(why, "blocks of %lld rows and %lld columns do not divide the %lldx%lld weight", (long long)rows,
                      (long long)group, (long long)dims[0], (long long)dims[1]);
        return ks_buf_cstr(why);
    }
    switch (part) {
    case KIR_QUANT_PART_CODES:
        if (n->dtype != codes) return "the codes' dtype must be the qtype";
        break;
    case KIR_QUANT_PART_SCALE:
        if (n->dtype != KIR_F32 && n->dtype != KIR_F16 && n->dtype != KIR_BF16) return "scales are f32, f16 or bf16";
        break;
    case KIR_QUANT_PART_ZERO:
        if (n->dtype != KIR_U8 || !asym) return "zero points are u8, of a quantization with asym=1";
        break;
    default:
        return "quant must be codes, scale or zero";
    }
    return NULL;
}

int kir_verify_quant(const kir_graph *g, ks_diag *d, const char *what)
{
    int errors = 0;
    ks_buf why = {0};
    for (size_t i = 0; i < g->n_nodes; i++) {
        kir_val v = (kir_val)i;
        const kir_node *n = kir_node_at(g, v);
        const char *p = NULL;
        ks_buf_clear(&why);
        if (kir_weight_quant_part(g, v)) {
            p = part_problem(g, v, &why);
        } else if (n->op == KIR_OP_WEIGHT && kir_dtype_is_quantized(n->dtype)) {
            p = "quantized codes are the part quant=codes of a quantization";
        } else if (n->op == KIR_OP_MATMUL && n->nin > 2) {
            static const kir_word parts[3] = {KIR_QUANT_PART_CODES, KIR_QUANT_PART_SCALE, KIR_QUANT_PART_ZERO};
            static const char *const same[] = {"derive", "sources", "rows", "offset", "qtype", "group", "block_rows", "asym"};
            kir_val w = n->in[1];
            for (int k = 1; !p && k < n->nin; k++) {
                kir_val o = n->in[k];
                if (o == KIR_NONE || !kir_weight_quant_part(g, o) || kir_attr_word(g, o, KIR_A_WEIGHT_QUANT) != parts[k - 1]) {
                    ks_buf_printf(&why, "operand %d must be a weight's %s (a weight with quant=%s)", k + 1,
                                  kir_word_table[parts[k - 1]].text, kir_word_table[parts[k - 1]].text);
                    p = ks_buf_cstr(&why);
                }
                for (size_t a = 0; !p && a < sizeof same / sizeof *same; a++)
                    if (!same_attr(g, w, o, same[a])) {
                        ks_buf_printf(&why, "operand %d (%%%u) is not a part of the quantization of %%%u: its %s differs",
                                      k + 1, (unsigned)o, (unsigned)w, same[a]);
                        p = ks_buf_cstr(&why);
                    }
            }
            if (!p && kir_attr_int(g, w, KIR_A_WEIGHT_ASYM) != (n->nin > 3 && n->in[3] != KIR_NONE))
                p = "a quantization with zero points (asym=1) is multiplied with them, one without, without";
        }
        if (p) errors++, kir_node_error(d, g, v, what, "%s", p);
    }
    ks_buf_free(&why);
    return errors;
}

void kir_kv_round(kir_dtype t, float *row, int64_t n)
{
    switch (t) {
    case KIR_BF16:
        for (int64_t i = 0; i < n; i++) row[i] = ks_bf16_to_f32(ks_f32_to_bf16(row[i]));
        return;
    case KIR_F16:
        for (int64_t i = 0; i < n; i++) row[i] = ks_f16_to_f32(ks_f32_to_f16(row[i]));
        return;
    case KIR_I8:
    case KIR_F8E4M3: {
        const float s = kir_quantize_row(t, row, n, row);
        for (int64_t i = 0; i < n; i++) row[i] *= s;
        return;
    }
    default: return;
    }
}

float kir_quantize_row(kir_dtype t, const float *x, int64_t n, float *q)
{
    KS_ASSERT(t == KIR_I8 || t == KIR_F8E4M3);
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    const float s = amax / (t == KIR_I8 ? 127.0f : 448.0f);
    for (int64_t i = 0; i < n; i++) {
        if (!(s > 0.0f)) {
            q[i] = 0.0f;
            continue;
        }
        const float c = x[i] / s;
        q[i] = t == KIR_I8 ? fminf(fmaxf(rintf(c), -127.0f), 127.0f) : ks_e4m3_to_f32(ks_f32_to_e4m3(c));
    }
    return s;
}
