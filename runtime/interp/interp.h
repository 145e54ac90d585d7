/*
 * interp.h — the reference interpreter: executes any verified kir_graph in
 * float32 on the CPU (weights of any float dtype are read as they are
 * stored). It is the numerical reference for every backend.
 *
 * Execution model: a step processes a flat batch of tokens from any number
 * of sequences; token i has tokens[i], positions[i] and seq_ids[i].
 * ATTENTION writes each token's K and V into the paged KV cache at the row
 * of (seq, position), then attends causally over positions [lo, position] of
 * the same sequence (lo from the sliding window), reading through the cache.
 * A graph may split that write off: KV_WRITE writes the rows of its layer
 * (and passes k through), and an ATTENTION with write_kv=0 only reads.
 * The caller has reserved the positions in the cache (krt_kv_seq_reserve)
 * before the step, so positions earlier in the same step are visible.
 *
 * Prefix: kir_.
 */
#ifndef KILN_RUNTIME_INTERP_H
#define KILN_RUNTIME_INTERP_H

#include "ir/ir.h"
#include "runtime/kv/kv_cache.h"

typedef struct krt_step {
    int n_tokens;             /* tokens in this step */
    const int32_t *tokens;    /* [n_tokens] token ids */
    const int32_t *positions; /* [n_tokens] positions in their sequences */
    const int32_t *seq_ids;   /* [n_tokens] sequence of each token */
} krt_step;

typedef struct krt_interp krt_interp;

/* weights[v] points at the data of WEIGHT node v (in its node's dtype),
 * NULL for other nodes; the pointers must outlive the interpreter.
 * NULL after reporting. */
krt_interp *krt_interp_new(const kir_graph *g, const void *const *weights, krt_kv *kv, ks_diag *d);
void krt_interp_free(krt_interp *it);

/* Bytes the interpreter allocated for copies of weights. The kernels read
 * weights where they lie, in their own dtype (f32, f16, bf16: half
 * precision is converted to f32 as it is read, exactly), so this is 0
 * unless some weight's data was not aligned to its elements (4 bytes for
 * f32, 2 for f16 and bf16), which is copied once here. An engine's weights
 * are aligned: it reads them from the engine's mapping. */
size_t krt_interp_weight_bytes(const krt_interp *it);

/* The KV-cache layout the graph needs (one krt_kv_layer per `layer` of an
 * ATTENTION or KV_WRITE); *n_layers receives their count. Caller frees the
 * array. */
krt_kv_layer *krt_kv_layers_of(const kir_graph *g, int *n_layers);

/* Run one step; out receives the OUTPUT value, [n_tokens, row_elems].
 * Returns 0, or -1 after reporting (bad token id, position past the cache). */
int krt_interp_step(krt_interp *it, const krt_step *step, float *out, ks_diag *d);

/* A tap sees every float value as soon as it is computed: node v's data,
 * [n_tokens, row elems] (valid until the next node runs). For `kiln verify`,
 * which compares a fused graph's values with the unfused graph's. */
typedef void (*krt_tap_fn)(void *ctx, kir_val v, const float *data, int n_tokens);
void krt_interp_set_tap(krt_interp *it, krt_tap_fn tap, void *ctx);

/* Elements per token of the graph's OUTPUT (the vocabulary for logits). */
int64_t krt_output_row_elems(const kir_graph *g);

#endif
