/*
 * numerics.h — arithmetic that the reference interpreter and the code
 * generators must share exactly: one definition, used by both, so that a
 * generated kernel computes what the reference computes.
 *
 * Prefix: kir_.
 */
#ifndef KILN_IR_NUMERICS_H
#define KILN_IR_NUMERICS_H

#include "ir/ir.h"

#define KIR_PI 3.14159265358979323846

/* The rotation frequencies of ROPE node v (rot_dim/2 floats into inv_freq,
 * radians per position), from its theta and scaling attributes. Hugging
 * Face computes them in float32 (_compute_default_rope_parameters,
 * _compute_llama3_parameters); this follows its operations one by one so
 * that the angles match. */
void kir_rope_inv_freq(const kir_graph *g, kir_val v, int rot_dim, float *inv_freq);

#endif
