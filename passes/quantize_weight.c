/* quantize_weight.c — codes, scales and zero points of a quantized weight (passes/quantize_weight.h). */
#include "passes/quantize_weight.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A scale as stored (its dtype's rounding), and read back. */
static float round_scale(kir_dtype t, float s)
{
    switch (t) {
    case KIR_F16: return ks_f16_to_f32(ks_f32_to_f16(s));
    case KIR_BF16: return ks_bf16_to_f32(ks_f32_to_bf16(s));
    default: return s;
    }
}

static void store_scale(kir_dtype t, void *scale, int64_t i, float s)
{
    if (t == KIR_F32) {
        memcpy((uint8_t *)scale + 4 * i, &s, 4);
        return;
    }
    uint16_t h = t == KIR_F16 ? ks_f32_to_f16(s) : ks_f32_to_bf16(s);
    memcpy((uint8_t *)scale + 2 * i, &h, 2);
}

static void put_code(const kir_quant_layout *q, uint8_t *codes, int64_t at, int c)
{
    if (q->codes != KIR_U4) {
        codes[at] = (uint8_t)c;
        return;
    }
    uint8_t *b = &codes[at / 2];
    *b = at % 2 ? (uint8_t)((*b & 15) | (c << 4)) : (uint8_t)((*b & 0xf0) | c);
}

/* The codes of one block: rows [r0, r0 + block_rows), columns [c0, c0 + group). */
static void quantize_block(const kir_quant_layout *q, const float *w, int64_t r0, int64_t c0, uint8_t *codes, float *s_out,
                           int *z_out)
{
    float lo = 0, hi = 0, amax = 0;
    for (int64_t r = r0; r < r0 + q->block_rows; r++)
        for (int64_t c = c0; c < c0 + q->group; c++) {
            float x = w[r * q->cols + c];
            lo = x < lo ? x : lo;
            hi = x > hi ? x : hi;
        }
    amax = -lo > hi ? -lo : hi;
    const int bits = kir_dtype_bits(q->codes);
    float s;
    int zero = 0, cmin, cmax;
    if (q->codes == KIR_F8E4M3) {
        s = round_scale(q->scale, amax / 448.0f);
        cmin = cmax = 0;
    } else if (q->asym) {
        cmin = 0;
        cmax = (1 << bits) - 1;
        s = round_scale(q->scale, (hi - lo) / (float)cmax);
        if (s > 0) {
            float z = rintf(-lo / s);
            zero = z < 0 ? 0 : z > (float)cmax ? cmax : (int)z;
        }
    } else {
        cmax = (1 << (bits - 1)) - 1;
        cmin = -cmax;
        s = round_scale(q->scale, amax / (float)cmax);
    }
    const int mid = q->asym || q->codes == KIR_I8 || q->codes == KIR_F8E4M3 ? 0 : 1 << (bits - 1);
    for (int64_t r = r0; r < r0 + q->block_rows; r++)
        for (int64_t c = c0; c < c0 + q->group; c++) {
            float x = w[r * q->cols + c];
            int64_t at = r * q->cols + c;
            if (q->codes == KIR_F8E4M3) {
                codes[at] = s > 0 ? ks_f32_to_e4m3(x / s) : 0;
                continue;
            }
            int code = zero;
            if (s > 0) {
                float v = rintf(x / s) + (float)zero;
                code = v < (float)cmin ? cmin : v > (float)cmax ? cmax : (int)v;
            }
            put_code(q, codes, at, code + mid);
        }
    *s_out = s;
    *z_out = zero;
}

void kp_quantize_matrix(const kir_quant_layout *q, const float *w, void *codes, void *scale, void *zero)
{
    KS_ASSERT(q->rows % q->block_rows == 0 && q->cols % q->group == 0);
    uint8_t *tmp = codes ? NULL : ks_xmalloc(kir_quant_codes_bytes(q) ? kir_quant_codes_bytes(q) : 1);
    uint8_t *out = codes ? codes : tmp;
    const int64_t bc = q->cols / q->group;
    for (int64_t br = 0; br < q->rows / q->block_rows; br++)
        for (int64_t b = 0; b < bc; b++) {
            float s;
            int z;
            quantize_block(q, w, br * q->block_rows, b * q->group, out, &s, &z);
            if (scale) store_scale(q->scale, scale, br * bc + b, s);
            if (zero && q->asym) ((uint8_t *)zero)[br * bc + b] = (uint8_t)z;
        }
    free(tmp);
}
