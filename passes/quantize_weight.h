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
 *   f8e4m3: scale = amax / 448, code = e4m3(w / scale), nearest even.
 * Each scale is rounded to the scale's dtype first and the codes computed
 * with the rounded scale, so that dequantizing gives what was chosen. A
 * block of zeros has scale 0 and codes that dequantize to 0.
 *
 *     kir_quant_layout q;
 *     kir_quant_layout_of_part(g, part, KIR_F16, &q);
 *     kp_quantize_matrix(&q, w, codes, scale, zero);   // w: f32 [q.rows, q.cols]; an output may be NULL
 *
 * The engine builder (compiler/optimize.c) and the tests share it.
 *
 * Prefix: kp_ (passes).
 */
#ifndef KILN_PASSES_QUANTIZE_WEIGHT_H
#define KILN_PASSES_QUANTIZE_WEIGHT_H

#include "ir/quant.h"

/* Quantize w (f32 [rows, cols]) into codes, scales and zero points (each may be NULL: not wanted). */
void kp_quantize_matrix(const kir_quant_layout *q, const float *w, void *codes, void *scale, void *zero);

#endif
