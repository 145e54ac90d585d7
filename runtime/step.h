/*
 * step.h — what a backend runs: one step of a flat batch of tokens.
 *
 * Execution model: a step processes a flat batch of tokens from any number
 * of sequences; token i has tokens[i], positions[i] and seq_ids[i].
 * ATTENTION writes each token's K and V into the paged KV cache at the row
 * of (seq, position), then attends causally over positions [lo, position] of
 * the same sequence (lo from the sliding window), reading through the cache.
 * A graph may split that write off: KV_WRITE writes the rows of its layer
 * (and passes k through), and an ATTENTION with write_kv=0 only reads.
 * The session (runtime/session.c) checks every step and reserves its
 * positions in the cache (krt_kv_seq_reserve) before a backend runs it, so
 * positions earlier in the same step are visible.
 *
 * Prefix: krt_.
 */
#ifndef KILN_RUNTIME_STEP_H
#define KILN_RUNTIME_STEP_H

#include <stdint.h>

#include "ir/ir.h"

typedef struct krt_step {
    int n_tokens;             /* tokens in this step */
    const int32_t *tokens;    /* [n_tokens] token ids */
    const int32_t *positions; /* [n_tokens] positions in their sequences */
    const int32_t *seq_ids;   /* [n_tokens] sequence of each token */
} krt_step;

/* A tap sees every float value of a step as it is computed: node v's data,
 * [n_tokens, row elems]. For `kiln verify`, which compares a fused graph's
 * values with the unfused graph's. */
typedef void (*krt_tap_fn)(void *ctx, kir_val v, const float *data, int n_tokens);

#endif
