/*
 * numerics.h — arithmetic that the reference interpreter and the code
 * generators must share exactly: one definition, used by both, so that a
 * generated kernel computes what the reference computes.
 *
 * Prefix: kir_.
 */
#ifndef KILN_IR_NUMERICS_H
#define KILN_IR_NUMERICS_H

#include <math.h>

#include "ir/ir.h"

#define KIR_PI 3.14159265358979323846

/* The unary elementwise ops of ir/ops.def's KIR_FORMULA lines as C:
 * kir_unary_SILU(x) etc. and, for a node with half_math (fast precision),
 * kir_unary_half_SILU(x) etc., for the interpreter. */
#define KIR_FORMULA(OP, TYPE, what, expr, half)                                                                     \
    static inline float kir_unary_##OP(float x)                                                                     \
    {                                                                                                               \
        const TYPE a = (TYPE)x;                                                                                     \
        return (float)(expr);                                                                                       \
    }                                                                                                               \
    static inline float kir_unary_half_##OP(float a) { return (half); }
#include "ir/ops.def"

/* The same formula as text, for the code generators: the KIR_FORMULA of op
 * (which must have one), its half form when `half` (the node's half_math),
 * with each `a` written as `operand`. *in_double gets 1 when
 * the formula computes in double (operand must then be a double
 * expression, and the result is cast back to float), 0 in float; *what
 * what it computes. */
void kir_formula_write(kir_op op, int half, const char *operand, ks_buf *out, int *in_double, const char **what);
/* 1 when op has a KIR_FORMULA line. */
int kir_has_formula(kir_op op);

/* The binary elementwise ops of ir/ops.def's KIR_BINARY lines as C: kir_binary_ADD(a, b) etc. */
#define KIR_BINARY(OP, what, expr)                                                                                  \
    static inline float kir_binary_##OP(float a, float b) { return (expr); }
#include "ir/ops.def"
/* The same as text for the code generators: the KIR_BINARY of op (which must have one) with each `a`
 * written as a_text and each `b` as b_text (each may appear more than once: operands without side
 * effects); *what what it computes. */
void kir_binary_write(kir_op op, const char *a_text, const char *b_text, ks_buf *out, const char **what);
/* 1 when op has a KIR_BINARY line. */
int kir_has_binary(kir_op op);

/* ALiBi's slope of head h of n_heads (Press et al. 2022, as transformers' build_alibi_tensor computes it
 * in float32): for the largest power of two p <= n_heads, heads 0 .. p-1 take base^1 .. base^p with
 * base = 2^(-8 / p), the heads past p the odd powers of 2^(-4 / p). */
float kir_alibi_slope(int64_t n_heads, int64_t h);

/* The rotation frequencies of ROPE node v (rot_dim/2 floats into inv_freq,
 * radians per position), from its theta and scaling attributes, for a
 * token whose sequence is seq_len long through the step (longrope and
 * dynamic scaling read it: kir_rope_by_length; the others ignore it).
 * Hugging Face computes them in float32 (_compute_default_rope_parameters,
 * _compute_llama3_parameters, ...); this follows its operations one by one
 * so that the angles match. */
void kir_rope_inv_freq(const kir_graph *g, kir_val v, int rot_dim, int64_t seq_len, float *inv_freq);
/* 1 when ROPE node v's frequencies depend on its token's sequence length
 * (longrope, dynamic: its third operand), and the longest length at which
 * they are those of a sequence of length 1 (original_max_positions). */
int kir_rope_by_length(const kir_graph *g, kir_val v, int64_t *short_up_to);

#endif
