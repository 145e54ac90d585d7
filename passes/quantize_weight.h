/*
 * quantize_weight.h — a float matrix's codes, scales and zero points, by
 * round to nearest (RTN), block by block (ir/quant.h says what they mean;
 * kir_dequantize_row reads them back):
 *   symmetric (no zero points): scale = amax / qmax (qmax: u4 7, u8 and i8
 *     127), code = clamp(rint(w / scale), -qmax, qmax) + the midpoint
 *     (u4 8, u8 128, i8 0);
 *   asymmetric: the block's range [min(w, 0), max(w, 0)] over 2^b - 1 steps
 *     (0 stays exact): scale = (max - min) / (2^b - 1), zero = rint(-min /
 *     scale), code = clamp(rint(w / scale) + zero, 0, 2^b - 1);
 *   integer codes clip: the range shrunk by 1%, 2%, ... 39% too, and the one
 *     with the smallest squared error (each column's weighted by an
 *     importance, when given) kept (GPTQ's and AWQ's clipping search);
 *   f8e4m3: scale = amax / 448, code = e4m3(w / scale), nearest even.
 * Each scale is rounded to the scale's dtype first and the codes computed
 * with the rounded scale, so that dequantizing gives what was chosen. A
 * block of zeros has scale 0 and codes that dequantize to 0.
 *
 *     kir_quant_layout q;
 *     kir_quant_layout_of_part(g, part, KIR_F16, &q);
 *     kp_quantize_matrix(&q, w, NULL, codes, scale, zero);   // w: f32 [q.rows, q.cols]; an output may be NULL
 *
 * The engine builder (compiler/optimize.c) and the tests share it.
 *
 * Prefix: kp_ (passes).
 */
#ifndef KILN_PASSES_QUANTIZE_WEIGHT_H
#define KILN_PASSES_QUANTIZE_WEIGHT_H

#include "ir/quant.h"

/* Quantize w (f32 [rows, cols]) into codes, scales and zero points (each may be NULL: not wanted).
 * importance: a weight for each column's squared error in the clipping search (the mean square of
 * the input x_k over a calibration text: the error of x w^T), or NULL for 1. */
void kp_quantize_matrix(const kir_quant_layout *q, const float *w, const float *importance, void *codes, void *scale,
                        void *zero);

/* The error of round to nearest (each block's range, no clipping search) of w's columns each times
 * s[k] (a smoothing: AWQ's search compares them), measured back in w's scale: the sum of importance[k]
 * (dequantized_nk / s_k - w_nk)^2 (importance NULL: 1). Threads by row blocks; the sum in their order. */
double kp_scaled_rtn_error(const kir_quant_layout *q, const float *w, const float *s, const float *importance);

/* GPTQ (Frantar et al., 2022): the codes chosen a column at a time, each rounding's error spread over
 * the columns still to come through the inverse of the input's gram matrix (gram [cols, cols]: the
 * mean of x^T x over a calibration text, damped by 10% of its mean diagonal: a text of a few thousand
 * tokens gives a noisy gram, and GPTQ's usual 1% measured worse, bench/RESULTS.md); the columns in act
 * order (largest diagonal first) with static groups: each group's scale and zero point from the row as
 * it is, by the clipping search with each column's error weighted by its input's mean square (the
 * gram's diagonal); f8e4m3 codes with each group's amax / 448 as its scale. A row a block
 * (block_rows 1) only: -1 (nothing written) for larger blocks or a gram that is not positive
 * definite. */
int kp_quantize_gptq(const kir_quant_layout *q, const float *w, const double *gram, void *codes, void *scale,
                     void *zero);

#endif
