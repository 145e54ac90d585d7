/*
 * flops.h — the arithmetic a node does in a step: the one place that says
 * how many floating-point operations (a multiply-add counts two) each op
 * costs, for profiles' TFLOP/s (runtime/cuda/cuda_profile.c) and whoever
 * else weighs a graph.
 *
 *   matmul     (x[T,K], w[N,K]): 2·T·K·N
 *   attention  (q[T,H,DK], k, v[T,KH,DV]): 2·H·(DK + DV) per attended position
 *              of each token (its scores q·k and its share of the p·v sums),
 *              a token at position p attending min(p + 1, window) positions
 *              (window 0: p + 1), as runtime/step.h says: causal, counted
 *              exactly, no masked work
 *   the others (elementwise, norms, rope, embed, views, kv_write): 0; they
 *              are bound by memory, and their few operations an element are
 *              left out
 *
 * Prefix: kir_.
 */
#ifndef KILN_IR_FLOPS_H
#define KILN_IR_FLOPS_H

#include "ir/ir.h"

/* The operations node v of g does in a step of T tokens at positions[0..T)
 * (read by attention only; may be NULL for a graph without one). */
double kir_node_flops(const kir_graph *g, kir_val v, int64_t T, const int32_t *positions);

#endif
