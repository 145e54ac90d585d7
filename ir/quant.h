/*
 * quant.h — the layout of a quantized weight and its dequantization: the one
 * definition of what its codes, scales and zero points mean (ir/ir.h,
 * "quantized weights"), read by the interpreter's reference matmul, the
 * engine builder and the tests; passes/quantize_weight.h makes them.
 *
 *     kir_quant_layout q;
 *     kir_quant_layout_of(g, matmul_node, &q);                  // from a quantized matmul
 *     kir_dequantize_row(&q, codes, scale, zero, n, row);       // row n as f32
 *
 * Prefix: kir_.
 */
#ifndef KILN_IR_QUANT_H
#define KILN_IR_QUANT_H

#include <stdint.h>

#include "ir/ir.h"

typedef struct kir_quant_layout {
    kir_dtype codes;     /* u4, u8, i8 or f8e4m3 */
    kir_dtype scale;     /* f32, f16 or bf16 */
    int64_t rows, cols;  /* the float matrix [N, K] */
    int64_t block_rows;  /* rows of a block (a scale's rows) */
    int64_t group;       /* columns of a block */
    int asym;            /* 1: zero points (u4, u8) */
} kir_quant_layout;

/* The layout of quantized matmul m's weight (operands codes, scale[, zero]). */
void kir_quant_layout_of(const kir_graph *g, kir_val m, kir_quant_layout *q);
/* The layout of the quantization WEIGHT node w is a part of, with scales of dtype scale_dtype (a codes
 * or zero part does not know its scale's dtype). */
void kir_quant_layout_of_part(const kir_graph *g, kir_val w, kir_dtype scale_dtype, kir_quant_layout *q);

/* Bytes of each part. */
uint64_t kir_quant_codes_bytes(const kir_quant_layout *q);
uint64_t kir_quant_scale_bytes(const kir_quant_layout *q);
uint64_t kir_quant_zero_bytes(const kir_quant_layout *q); /* 0 without zero points */
/* The number of blocks (scales). */
int64_t kir_quant_blocks(const kir_quant_layout *q);

/* Scale i of a scale part, as f32. */
float kir_quant_scale(const kir_quant_layout *q, const void *scale, int64_t i);

/* Row n of the float matrix the parts stand for, into out[cols] (zero NULL without zero points). */
void kir_dequantize_row(const kir_quant_layout *q, const void *codes, const void *scale, const void *zero, int64_t n,
                        float *out);

/* One KV head's row of n values (a position's K or V of that head) as a cache of dtype t holds it, in
 * place: f32 as it is; bf16, f16 rounded to nearest even; i8 and f8e4m3 (--kv-dtype int8, fp8) as
 * kir_quantize_row's codes times the row's own f32 scale. A scale a (position, head) never changes once
 * the row is written, so a cache block fills without requantizing what it holds. */
void kir_kv_round(kir_dtype t, float *row, int64_t n);

/* Row x[0..n) as 8-bit codes with its own scale s = amax / 127 (t KIR_I8: integers rint(x / s) in
 * [-127, 127], ties to even) or amax / 448 (KIR_F8E4M3: e4m3 values of x / s, nearest even): the codes'
 * values into q (q may be x); returns s (0 for a row of zeros, whose codes are 0). What the fp8 and
 * w8a8 matmuls do to x a token at a time (the interpreter; the CUDA backend's kcu_pro_xq) and a
 * quantized KV cache to a head's row (kir_kv_round). */
float kir_quantize_row(kir_dtype t, const float *x, int64_t n, float *q);

/* The code at [n,k] as a number: e4m3's value, an i8's, a u4's or u8's (minus the midpoint, 8 or 128,
 * when there are no zero points). */
static inline float kir_quant_code(const kir_quant_layout *q, const uint8_t *codes, int64_t n, int64_t k)
{
    int64_t at = n * q->cols + k;
    switch (q->codes) {
    case KIR_U4: {
        int c = at % 2 ? codes[at / 2] >> 4 : codes[at / 2] & 15;
        return (float)(q->asym ? c : c - 8);
    }
    case KIR_U8: return (float)(q->asym ? codes[at] : codes[at] - 128);
    case KIR_I8: return (float)(int8_t)codes[at];
    case KIR_F8E4M3: return ks_e4m3_to_f32(codes[at]);
    default: KS_UNREACHABLE();
    }
}

#endif
