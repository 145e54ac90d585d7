/* numerics.c — shared arithmetic (ir/numerics.h). */
#include "ir/numerics.h"

#include <ctype.h>
#include <math.h>
#include <string.h>

/* The formulas as text (the preprocessor's # writes each as it reads in ops.def). */
static const struct {
    const char *text;  /* the expression over `a` */
    int in_double;     /* 1: `a` is a double */
    const char *what;  /* what it computes */
    const char *half;  /* the expression in float, for a value stored as bf16 or f16 */
} formulas[KIR_OP_COUNT] = {
#define KIR_FORMULA(OP, TYPE, what, expr, half) [KIR_OP_##OP] = {#expr, sizeof(TYPE) == sizeof(double), what, #half},
#include "ir/ops.def"
};

int kir_has_formula(kir_op op) { return op < KIR_OP_COUNT && formulas[op].text != NULL; }

static const struct {
    const char *text; /* the expression over `a` and `b` */
    const char *what; /* what it computes */
} binaries[KIR_OP_COUNT] = {
#define KIR_BINARY(OP, what, expr) [KIR_OP_##OP] = {#expr, what},
#include "ir/ops.def"
};

int kir_has_binary(kir_op op) { return op < KIR_OP_COUNT && binaries[op].text != NULL; }

/* text into out with each whole identifier `a` written as a_text and `b` as b_text (b_text NULL: `b`
 * stays, as in a unary formula); not inside another identifier (exp, tanh) */
static void write_operands(const char *text, const char *a_text, const char *b_text, ks_buf *out)
{
    for (const char *p = text; *p; p++) {
        int ident_before = p > text && (isalnum((unsigned char)p[-1]) || p[-1] == '_');
        int ident_after = isalnum((unsigned char)p[1]) || p[1] == '_';
        if (!ident_before && !ident_after && *p == 'a')
            ks_buf_puts(out, a_text);
        else if (!ident_before && !ident_after && *p == 'b' && b_text)
            ks_buf_puts(out, b_text);
        else
            ks_buf_put(out, p, 1);
    }
}

void kir_binary_write(kir_op op, const char *a_text, const char *b_text, ks_buf *out, const char **what)
{
    KS_ASSERT(kir_has_binary(op));
    write_operands(binaries[op].text, a_text, b_text, out);
    if (what) *what = binaries[op].what;
}

void kir_formula_write(kir_op op, int half, const char *operand, ks_buf *out, int *in_double, const char **what)
{
    KS_ASSERT(kir_has_formula(op));
    write_operands(half ? formulas[op].half : formulas[op].text, operand, NULL, out);
    if (in_double) *in_double = !half && formulas[op].in_double;
    if (what) *what = formulas[op].what;
}

float kir_alibi_slope(int64_t n_heads, int64_t h)
{
    int64_t p = 1;
    while (p * 2 <= n_heads) p *= 2;
    /* torch.pow(float32 base, int32 k): the float base raised in double and rounded (exact for the
     * powers of two that power-of-two head counts give) */
    if (h < p) return (float)pow((double)(float)pow(2.0, -pow(2.0, -(log2((double)p) - 3.0))), (double)(h + 1));
    const float extra = (float)pow(2.0, -pow(2.0, -(log2((double)(2 * p)) - 3.0)));
    return (float)pow((double)extra, (double)(2 * (h - p) + 1));
}

int kir_rope_by_length(const kir_graph *g, kir_val v, int64_t *short_up_to)
{
    *short_up_to = kir_attr_int(g, v, KIR_A_ROPE_ORIGINAL_MAX_POSITIONS);
    return kir_rope_scaling_by_length(kir_attr_word(g, v, KIR_A_ROPE_SCALING));
}

void kir_rope_inv_freq(const kir_graph *g, kir_val v, int rot_dim, int64_t seq_len, float *inv_freq)
{
    /* Every step below is one float32 operation of HF's code, in its order:
     *   inv_freq = 1.0 / (base ** (arange(0, dim, 2).float() / dim))
     * and for "llama3" (_compute_llama3_parameters), with Python scalars
     * taking the tensor's float32 type. */
    float base = (float)kir_attr_float(g, v, KIR_A_ROPE_THETA);
    kir_word scaling = kir_attr_word(g, v, KIR_A_ROPE_SCALING);
    double factor = kir_attr_float(g, v, KIR_A_ROPE_FACTOR);
    const int64_t orig_max = kir_attr_int(g, v, KIR_A_ROPE_ORIGINAL_MAX_POSITIONS);
    if (scaling == KIR_ROPE_SCALING_DYNAMIC && seq_len > orig_max) {
        /* _compute_dynamic_ntk_parameters with seq_len a tensor (dynamic_rope_update): in float32,
         *   base * ((factor * seq_len / max_position_embeddings) - (factor - 1)) ** (dim / (dim - 2)) */
        float grow = (float)seq_len * (float)factor / (float)orig_max - (float)(factor - 1.0);
        float scaled = (float)pow((double)grow, (double)(float)((double)rot_dim / (double)(rot_dim - 2)));
        base = base * scaled;
    }
    /* longrope (_compute_longrope_parameters): 1.0 / (ext_factors * base ** (arange(0, dim, 2) / dim)),
     * the long factors for a sequence past original_max_position_embeddings, in float32 (the others:
     * a factor of 1, the same bits) */
    uint32_t n_ext = 0;
    const double *ext = scaling != KIR_ROPE_SCALING_LONGROPE ? NULL
                        : kir_attr_floats(g, v, seq_len > orig_max ? KIR_A_ROPE_LONG_FACTOR : KIR_A_ROPE_SHORT_FACTOR,
                                          &n_ext);
    KS_ASSERT(!ext || n_ext == (uint32_t)(rot_dim / 2)); /* the shape rule */
    for (int j = 0; j < rot_dim / 2; j++) {
        float e = (float)(2 * j) / (float)rot_dim;
        float p = (float)pow((double)base, (double)e);
        inv_freq[j] = 1.0f / ((ext ? (float)ext[j] : 1.0f) * p);
    }
    if (scaling == KIR_ROPE_SCALING_LINEAR) {
        for (int j = 0; j < rot_dim / 2; j++) inv_freq[j] = inv_freq[j] / (float)factor;
    } else if (scaling == KIR_ROPE_SCALING_LLAMA3) {
        double low = kir_attr_float(g, v, KIR_A_ROPE_LOW_FREQ_FACTOR);
        double high = kir_attr_float(g, v, KIR_A_ROPE_HIGH_FREQ_FACTOR);
        double orig = (double)orig_max;
        float low_wavelen = (float)(orig / low), high_wavelen = (float)(orig / high);
        for (int j = 0; j < rot_dim / 2; j++) {
            float inv = inv_freq[j];
            float wavelen = (float)(2.0 * KIR_PI) / inv;
            float scaled = wavelen > low_wavelen ? inv / (float)factor : inv;
            if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
                float smooth = ((float)orig / wavelen - (float)low) / (float)(high - low);
                scaled = (1.0f - smooth) * scaled / (float)factor + smooth * scaled;
            }
            inv_freq[j] = scaled;
        }
    } else if (scaling == KIR_ROPE_SCALING_YARN) {
        /* _compute_yarn_parameters: the correction range in double (Python floats), the ramp and the
         * blend in float32 (torch), as HF computes them */
        double beta_fast = kir_attr_float(g, v, KIR_A_ROPE_BETA_FAST), beta_slow = kir_attr_float(g, v, KIR_A_ROPE_BETA_SLOW);
        double orig = (double)orig_max, b = (double)base;
        double lo = (rot_dim * log(orig / (beta_fast * 2 * KIR_PI))) / (2 * log(b));
        double hi = (rot_dim * log(orig / (beta_slow * 2 * KIR_PI))) / (2 * log(b));
        if (kir_attr_int(g, v, KIR_A_ROPE_TRUNCATE)) lo = floor(lo), hi = ceil(hi);
        if (lo < 0) lo = 0;
        if (hi > rot_dim - 1) hi = rot_dim - 1;
        if (lo == hi) hi += 0.001; /* as HF: no singularity */
        for (int j = 0; j < rot_dim / 2; j++) {
            float e = (float)(2 * j) / (float)rot_dim;
            float pos_freq = (float)pow((double)base, (double)e);
            float extrapolation = 1.0f / pos_freq, interpolation = 1.0f / ((float)factor * pos_freq);
            float ramp = ((float)j - (float)lo) / (float)(hi - lo);
            ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
            float extra = 1.0f - ramp;
            inv_freq[j] = interpolation * (1.0f - extra) + extrapolation * extra;
        }
    }
}
