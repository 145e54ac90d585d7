/*
 * session.h — running an engine: sequences, steps, greedy generation.
 *
 * A session owns the KV cache sized from its options and the backend's state.
 * A step is a flat batch of tokens from any number of sequences; each token
 * is appended to its sequence, so its position is the sequence's length so far
 * (positions are assigned here, not by the caller). Prefill and decode tokens
 * of many sequences mix freely in one step.
 *
 * Prefix: krt_.
 */
#ifndef KILN_SESSION_H
#define KILN_SESSION_H

#include "runtime/backend.h"
#include "runtime/engine.h"

typedef struct krt_session_opts {
    int max_seqs;     /* sequences alive at once (ids 0..max_seqs-1); 0: 16 */
    int max_context;  /* positions per sequence; 0: the model's max_context param */
    int block_size;   /* KV positions per block; 0: 16 */
    int n_blocks;     /* KV blocks; 0: enough for max_seqs full sequences */
} krt_session_opts;

typedef struct krt_session krt_session;

krt_session *krt_session_new(const krt_engine *e, const krt_session_opts *o, ks_diag *d);
void krt_session_free(krt_session *s);

int64_t krt_session_vocab(const krt_session *s);       /* elements per output row */
int krt_session_max_context(const krt_session *s);
int krt_session_seq_add(krt_session *s, int seq, ks_diag *d);
int krt_session_seq_fork(krt_session *s, int src, int dst, ks_diag *d);
void krt_session_seq_free(krt_session *s, int seq);
int krt_session_seq_len(const krt_session *s, int seq);

/* Append tokens[i] to sequence seq_ids[i] for i < n and run them; out gets
 * [n, vocab] logits. On error (bad token id, unknown sequence, out of KV
 * blocks, over the context) nothing is appended and -1 is returned after
 * reporting. */
int krt_session_step(krt_session *s, int n, const int32_t *tokens, const int32_t *seq_ids, float *out,
                     ks_diag *d);

/* Index of the largest logit (the first on ties, as torch.argmax). */
int32_t krt_argmax(const float *logits, int64_t n);

/* A model parameter stored in the engine's graph, or dflt. */
int64_t krt_engine_param_int(const krt_engine *e, const char *name, int64_t dflt);

#endif
