/*
 * derived_weight.h — the data of a derived WEIGHT node, from its sources.
 *
 * fuse_sibling_matmuls merges matmuls that share an input into one matmul
 * over a NEW weight whose data is the concatenation of theirs. Such a node
 * carries its recipe in three attributes:
 *
 *     %7 : f32[384,256] = weight() {name="wq[0]+wk[0]+wv[0]", derive="concat0",
 *                                   sources="wq[0],wk[0],wv[0]", rows=[256,64,64]}
 *
 *   derive   how the data derives: "concat0", the sources one after another
 *            along dim 0 (rows of [out,in] matrices, elements of 1-D biases);
 *            "concat1", along dim 1: for each index of dim 0, each source's
 *            rows of it in turn (stacked experts [E,N,K]: expert e's gate
 *            rows, then its up rows); "offset", its one source plus the
 *            weight's `offset`; "smooth", its one source (a norm's gain)
 *            divided by the smoothing vector of the quantized weight named
 *            by `smooth_of` (quantize's --calib smoothing: the engine
 *            builder computes it, compiler/smooth.c; kp_derive_weight not);
 *   sources  the `name`s of the source weights, comma-separated (they need
 *            not be in the graph any more);
 *   rows     how many rows of dim 0 (concat1: of dim 1) each source gives.
 *
 * A source has the derived node's dtype and its dims but the first (concat1:
 * the second), which is rows[i]. The engine builder and the tests both compute derived data
 * with kp_derive_weight, one implementation:
 *
 *     kp_weight_recipe r;
 *     if (kp_weight_recipe_of(g, w, &arena, &r) != 0) ...   // malformed (kir_verify says why)
 *     for (size_t i = 0; i < r.n_sources; i++) src[i] = data_of(r.names[i]);  // r.bytes[i] bytes each
 *     kp_derive_weight(g, w, &r, src, out);                  // out: bytes of w
 *
 * Prefix: kp_ (passes).
 */
#ifndef KILN_PASSES_DERIVED_WEIGHT_H
#define KILN_PASSES_DERIVED_WEIGHT_H

#include <stddef.h>
#include <stdint.h>

#include "ir/ir.h"
#include "support/support.h"

typedef struct kp_weight_recipe {
    size_t n_sources;   /* 0: not a derived weight */
    const char **names; /* [n_sources] the sources' weight names, in the arena given */
    int64_t *rows;      /* [n_sources] rows of dim 0 (concat1: dim 1) each source gives */
    size_t *bytes;      /* [n_sources] bytes of each source's data, in the weight's dtype */
} kp_weight_recipe;

/* Whether WEIGHT node w is derived (has a `derive` attribute). */
int kp_weight_is_derived(const kir_graph *g, kir_val w);

/* Read w's recipe into r (its arrays in arena). Returns 0 (n_sources = 0
 * for a plain weight), or -1 when the recipe is malformed: an unknown
 * derive, names and rows that disagree, rows that do not add up to dim 0.
 * kir_verify reports those with the reason. */
int kp_weight_recipe_of(const kir_graph *g, kir_val w, ks_arena *arena, kp_weight_recipe *r);

/* Write w's data (kir_elems(w, 1) elements of its dtype) into out from the
 * sources' data: sources[i] holds r->bytes[i] bytes. For a part of a
 * quantization (ir/ir.h, "quantized weights") the recipe derives the float
 * matrix it quantizes, in f32 (sources read as f32; kir_quant_data_dims),
 * which kp_quantize (passes/quantize.h) then makes the part of. */
void kp_derive_weight(const kir_graph *g, kir_val w, const kp_weight_recipe *r, const void *const *sources, void *out);

#endif
