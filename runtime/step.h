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
#include "runtime/kv/kv_cache.h"

typedef struct krt_step {
    int n_tokens;             /* tokens in this step */
    const int32_t *tokens;    /* [n_tokens] token ids */
    const int32_t *positions; /* [n_tokens] positions in their sequences */
    const int32_t *seq_ids;   /* [n_tokens] sequence of each token */
} krt_step;

/* The input seq_lengths of a step (longrope and dynamic RoPE read it): each
 * token's sequence's length through the step, which is its length in the KV
 * cache: the session reserves a step's positions, each sequence's counted on
 * from its length, before a backend runs it (so, as Hugging Face's
 * max(position_ids) + 1 over a forward of one sequence). Without a cache (a
 * graph without attention), a token's position + 1. */
static inline void krt_step_seq_lengths(const krt_step *st, const krt_kv *kv, int32_t *out)
{
    for (int i = 0; i < st->n_tokens; i++)
        out[i] = kv ? (int32_t)krt_kv_seq_len(kv, st->seq_ids[i]) : st->positions[i] + 1;
}

/* A tap sees every float value of a step as it is computed: node v's data,
 * [n_tokens, row elems]. For `kiln verify`, which compares a fused graph's
 * values with the unfused graph's. */
typedef void (*krt_tap_fn)(void *ctx, kir_val v, const float *data, int n_tokens);

#endif
