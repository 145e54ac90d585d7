/*
 * test_quantize_weight.c — the numbers of quantized weights: e4m3 both ways
 * (support), the codes' packing and what they dequantize to (ir/quant.h),
 * round to nearest with its clipping search and GPTQ (passes/quantize_weight.h), a KV row as a
 * quantized cache holds it (kir_kv_round), the smoothed error AWQ's search compares.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes/quantize_weight.h"
#include "tests/check.h"

static void test_e4m3(void)
{
    int wrong = 0;
    for (int b = 0; b < 256; b++) {
        if ((b & 0x7f) == 0x7f) continue; /* NaN */
        float f = ks_e4m3_to_f32((uint8_t)b);
        uint8_t back = ks_f32_to_e4m3(f);
        wrong += back != b && !(f == 0 && (back & 0x7f) == 0);
    }
    CHECK(wrong == 0);
    CHECK(ks_e4m3_to_f32(0x7e) == 448.0f && ks_f32_to_e4m3(1e6f) == 0x7e && ks_f32_to_e4m3(-1e6f) == 0xfe);
    /* halfway between 1 (0x38) and 1.125 (0x39): to the even code */
    CHECK(ks_f32_to_e4m3(1.0625f) == 0x38 && ks_f32_to_e4m3(1.1875f) == 0x3a);
    CHECK(ks_e4m3_to_f32(0x01) == ldexpf(1.0f, -9) && isnan(ks_e4m3_to_f32(0x7f)));
}

/* A [rows, cols] matrix of pseudo-random values in (-1, 1), one column large (an outlier). */
static float *matrix(int64_t rows, int64_t cols, unsigned seed)
{
    float *w = malloc(sizeof(float) * (size_t)(rows * cols));
    for (int64_t i = 0; i < rows * cols; i++) {
        seed = seed * 1103515245u + 12345u;
        w[i] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
        if (i % cols == 3) w[i] *= 6;
    }
    return w;
}

static double error_of(const kir_quant_layout *q, const float *w, const void *codes, const void *scale, const void *zero)
{
    float *row = malloc(sizeof(float) * (size_t)q->cols);
    double e = 0;
    for (int64_t n = 0; n < q->rows; n++) {
        kir_dequantize_row(q, codes, scale, zero, n, row);
        for (int64_t k = 0; k < q->cols; k++) e += (double)(row[k] - w[n * q->cols + k]) * (row[k] - w[n * q->cols + k]);
    }
    free(row);
    return e;
}

static void test_schemes(void)
{
    const int64_t rows = 8, cols = 64;
    float *w = matrix(rows, cols, 7);
    struct { kir_dtype codes, scale; int64_t group; int asym; double max_rms; } cases[] = {
        {KIR_U4, KIR_F16, 32, 1, 0.25}, {KIR_U4, KIR_F16, 64, 0, 0.35}, {KIR_I8, KIR_F16, 64, 0, 0.02},
        {KIR_U8, KIR_F32, 16, 1, 0.01}, {KIR_F8E4M3, KIR_F32, 64, 0, 0.1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        kir_quant_layout q = {cases[c].codes, cases[c].scale, rows, cols, 1, cases[c].group, cases[c].asym};
        uint8_t *codes = calloc(1, kir_quant_codes_bytes(&q)), *scale = calloc(1, kir_quant_scale_bytes(&q));
        uint8_t *zero = q.asym ? calloc(1, kir_quant_zero_bytes(&q)) : NULL;
        kp_quantize_matrix(&q, w, NULL, codes, scale, zero);
        double rms = sqrt(error_of(&q, w, codes, scale, zero) / (double)(rows * cols));
        CHECK_MSG(rms < cases[c].max_rms, "case %zu: rms error %g", c, rms);
        free(codes);
        free(scale);
        free(zero);
    }
    /* u4 packing: element 2i in the low nibble; symmetric codes around 8; a block of zeros stays 0 */
    kir_quant_layout q = {KIR_U4, KIR_F32, 1, 4, 1, 4, 0};
    float x[4] = {0, 0, 0, 0}, back[4] = {1, 1, 1, 1};
    uint8_t codes[2];
    float s = -1;
    kp_quantize_matrix(&q, x, NULL, codes, &s, NULL);
    kir_dequantize_row(&q, codes, &s, NULL, 0, back);
    CHECK(s == 0 && codes[0] == 0x88 && codes[1] == 0x88 && back[0] == 0 && back[3] == 0);
    float y[4] = {-7, 7, 1, -1};
    kp_quantize_matrix(&q, y, NULL, codes, &s, NULL);
    CHECK(s == 1 && codes[0] == (1 | 15 << 4) && codes[1] == (9 | 7 << 4));
    free(w);
}

/* GPTQ: on inputs whose columns correlate, the product's error over those inputs is below round to
 * nearest's. */
static void test_gptq(void)
{
    const int64_t rows = 16, cols = 32, n = 256;
    float *w = matrix(rows, cols, 11), *x = matrix(n, cols, 5);
    for (int64_t t = 0; t < n; t++) /* correlate neighbouring columns */
        for (int64_t k = 1; k < cols; k++) x[t * cols + k] = 0.6f * x[t * cols + k - 1] + 0.4f * x[t * cols + k];
    double *gram = calloc((size_t)(cols * cols), sizeof(double));
    for (int64_t t = 0; t < n; t++)
        for (int64_t i = 0; i < cols; i++)
            for (int64_t j = 0; j < cols; j++) gram[i * cols + j] += (double)x[t * cols + i] * x[t * cols + j] / (double)n;
    /* u4 in groups of 16 with zero points; f8e4m3 with a scale a row */
    const kir_quant_layout layouts[2] = {{KIR_U4, KIR_F16, rows, cols, 1, 16, 1}, {KIR_F8E4M3, KIR_F32, rows, cols, 1, cols, 0}};
    for (int l = 0; l < 2; l++) {
        const kir_quant_layout q = layouts[l];
        double out_err[2];
        for (int gptq = 0; gptq < 2; gptq++) {
            uint8_t *codes = calloc(1, kir_quant_codes_bytes(&q)), *scale = calloc(1, kir_quant_scale_bytes(&q));
            uint8_t *zero = calloc(1, kir_quant_zero_bytes(&q) ? kir_quant_zero_bytes(&q) : 1);
            if (gptq)
                CHECK(kp_quantize_gptq(&q, w, gram, codes, scale, zero) == 0);
            else
                kp_quantize_matrix(&q, w, NULL, codes, scale, zero);
            float *row = malloc(sizeof(float) * (size_t)cols);
            out_err[gptq] = 0;
            for (int64_t r = 0; r < rows; r++) {
                kir_dequantize_row(&q, codes, scale, q.asym ? zero : NULL, r, row);
                for (int64_t t = 0; t < n; t++) {
                    double d = 0;
                    for (int64_t k = 0; k < cols; k++) d += (double)x[t * cols + k] * (row[k] - w[r * cols + k]);
                    out_err[gptq] += d * d;
                }
            }
            free(row);
            free(codes);
            free(scale);
            free(zero);
        }
        CHECK_MSG(out_err[1] < 0.8 * out_err[0], "%s: GPTQ's output error %g, round to nearest's %g",
                  kir_dtype_name(q.codes), out_err[1], out_err[0]);
    }
    kir_quant_layout blocks = {KIR_F8E4M3, KIR_F32, rows, cols, 8, cols, 0}; /* blocks of 8 rows: not GPTQ's */
    CHECK(kp_quantize_gptq(&blocks, w, gram, NULL, NULL, NULL) == -1);
    free(gram);
    free(w);
    free(x);
}

/* kir_kv_round: a head's row as an i8 or f8e4m3 cache gives it back: codes times the row's own scale. */
static void test_kv_round(void)
{
    float r[4] = {1.0f, -0.5f, 0.25f, 0.0f};
    kir_kv_round(KIR_I8, r, 4); /* scale 1/127: 127, -63.5 -> -64 (ties to even), 31.75 -> 32, 0 */
    CHECK(r[0] == 1.0f && r[1] == -64.0f / 127.0f && r[2] == 32.0f / 127.0f && r[3] == 0.0f);
    float f[3] = {448.0f, 1.0625f, -3.0f};
    kir_kv_round(KIR_F8E4M3, f, 3); /* scale 1: e4m3's own values, 1.0625 to the even 1 */
    CHECK(f[0] == 448.0f && f[1] == 1.0f && f[2] == -3.0f);
    float z[2] = {0.0f, 0.0f}, h[2] = {1.0f / 3.0f, 2.0f};
    kir_kv_round(KIR_I8, z, 2);
    kir_kv_round(KIR_BF16, h, 2);
    CHECK(z[0] == 0.0f && z[1] == 0.0f && h[0] == ks_bf16_to_f32(ks_f32_to_bf16(1.0f / 3.0f)) && h[1] == 2.0f);
}

/* kp_scaled_rtn_error: with s = 1 the error of round to nearest without clipping; a smoothing that gives
 * the outlier column (3) finer steps relative to its importance changes it, measured in w's scale. */
static void test_scaled_error(void)
{
    const int64_t rows = 4, cols = 32;
    float *w = matrix(rows, cols, 3), s[32], imp[32];
    for (int k = 0; k < cols; k++) s[k] = 1.0f, imp[k] = 1.0f;
    kir_quant_layout q = {KIR_U4, KIR_F32, rows, cols, 1, cols, 0};
    double e1 = kp_scaled_rtn_error(&q, w, s, imp), e = 0;
    for (int64_t n = 0; n < rows; n++) { /* by hand: amax / 7, codes in [-7, 7] */
        float amax = 0;
        for (int64_t k = 0; k < cols; k++) amax = fabsf(w[n * cols + k]) > amax ? fabsf(w[n * cols + k]) : amax;
        const float sc = amax / 7.0f;
        for (int64_t k = 0; k < cols; k++) {
            const double dq = (double)rintf(w[n * cols + k] * (1.0f / sc)) * sc - w[n * cols + k];
            e += dq * dq;
        }
    }
    CHECK_MSG(fabs(e1 - e) <= 1e-9 * e, "scaled error %g, by hand %g", e1, e);
    for (int k = 0; k < cols; k++) s[k] = k == 3 ? 0.25f : 1.0f; /* the outlier shrunk: the others' steps finer */
    CHECK(kp_scaled_rtn_error(&q, w, s, imp) != e1);
    free(w);
}

int main(void)
{
    test_e4m3();
    test_schemes();
    test_gptq();
    test_kv_round();
    test_scaled_error();
    return check_finish("test_quantize_weight");
}
