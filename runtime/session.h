/*
 * session.h — running an engine: sequences, steps, next tokens.
 *
 * A session owns the KV cache sized from its options and the backend's state.
 * A step is a flat batch of tokens from any number of sequences; each token
 * is appended to its sequence, so its position is the sequence's length so far
 * (positions are assigned here, not by the caller). Prefill and decode tokens
 * of many sequences mix freely in one step.
 *
 *     krt_session *s = krt_session_new(engine, &opts, &d);
 *     krt_session_seq_add(s, 0, &d);
 *     krt_session_step(s, n, ids, seqs, logits, &d);          // logits out, all or nothing
 *
 *     // or: the next token of each sequence drawn where the logits are (on
 *     // the GPU only the ids come back), and a sequence that cannot go on
 *     // (out of KV blocks, past the context) fails alone
 *     krt_step_status st[n];
 *     krt_step_req r = {.n = n, .tokens = ids, .seq_ids = seqs, .samplers = smp, .next = next, .status = st};
 *     krt_session_run(s, &r, &d);
 *
 * KV cache size: opts.n_blocks when set; else, on a device, as many blocks
 * as kv_fraction of the memory free after the weights holds, at most enough
 * for max_seqs full sequences (the rest stays free for activations and
 * graphs); elsewhere enough for max_seqs full sequences.
 *
 * Prefix: krt_.
 */
#ifndef KILN_SESSION_H
#define KILN_SESSION_H

#include "runtime/backend.h"
#include "runtime/engine.h"
#include "runtime/kv/kv_cache.h"
#include "runtime/text/sampler.h"

#define KRT_KV_FRACTION_DEFAULT 0.9 /* of the device memory free after the weights */
#define KRT_GRAPH_TOKENS_DEFAULT 64 /* steps of at most this many tokens are replayed from CUDA graphs */

typedef struct krt_session_opts {
    int max_seqs;         /* sequences alive at once (ids 0..max_seqs-1); 0: 16 */
    int max_context;      /* positions per sequence; 0: the model's max_context param; more is an error */
    int block_size;       /* KV positions per block; 0: 16 */
    int n_blocks;         /* KV blocks; 0: sized as the header says */
    double kv_fraction;   /* (0, 1]: share of the free device memory the KV cache may take; 0: the default */
    int no_graphs;        /* 1: launch every kernel of every step (no CUDA graphs) */
    int graph_max_tokens; /* steps of at most this many tokens use graphs; 0: the default */
    int host_sampling;    /* 1: draw next tokens on the host even where the backend can on its device */
    int profile;          /* 1: the backend times its kernels (no CUDA graphs) for krt_session_profile */
    int no_kernel_overlap; /* 1: every kernel starts after the one before it has ended (no programmatic
                              dependent launch) */
} krt_session_opts;

typedef struct krt_session krt_session;

krt_session *krt_session_new(const krt_engine *e, const krt_session_opts *o, ks_diag *d);
void krt_session_free(krt_session *s);

const krt_desc *krt_session_desc(const krt_session *s); /* the engine's description */
int64_t krt_session_vocab(const krt_session *s);       /* elements per output row: desc->vocab */
int krt_session_max_context(const krt_session *s);
int krt_session_max_seqs(const krt_session *s); /* sequence ids are below it */
int krt_session_free_blocks(const krt_session *s); /* KV blocks a sequence can take */
int krt_session_block_size(const krt_session *s);  /* positions a KV block */
/* Prefix caching (runtime/kv/kv_cache.h): an empty sequence takes the cached blocks of its first blocks'
 * chain hashes (returns how many: its length is that many blocks); a sequence publishes a full block. */
int krt_session_seq_attach_cached(krt_session *s, int seq, const uint64_t *hashes, int n);
void krt_session_seq_publish(krt_session *s, int seq, int b, uint64_t hash);
krt_kv_prefix_stats krt_session_prefix_stats(const krt_session *s);
int krt_session_seq_add(krt_session *s, int seq, ks_diag *d);
int krt_session_seq_fork(krt_session *s, int src, int dst, ks_diag *d);
void krt_session_seq_free(krt_session *s, int seq);
/* Shorten seq to its first len positions (their KV rows stay); 0, or -1 when
 * it has no such sequence or fewer positions. Allocates nothing. */
int krt_session_seq_truncate(krt_session *s, int seq, int len);
int krt_session_seq_len(const krt_session *s, int seq);

/* How the KV cache was sized, for kiln run's report. */
typedef struct krt_kv_info {
    int n_blocks;          /* blocks in the pool */
    int block_size;        /* positions per block */
    size_t bytes;          /* K and V storage of all layers */
    int on_device;         /* 1: in device memory */
    int from_free_memory;  /* 1: n_blocks came from the device's free memory (and fraction) */
    double fraction;       /* the share of free memory allowed */
    size_t free_bytes;     /* free device memory before the cache was allocated */
    char device[128];      /* the device's name, when on_device */
} krt_kv_info;
const krt_kv_info *krt_session_kv_info(const krt_session *s);

/* The backend's profile of the steps so far (opts.profile: a table of its
 * kernels' times, operations and TFLOP/s per kind of step), appended to
 * out; with ceiling_tflops > 0 each rate's fraction of that ceiling too (0:
 * none). Returns 0, or -1 when the backend keeps none (the interpreter: time
 * whole steps instead). */
int krt_session_profile(const krt_session *s, double ceiling_tflops, ks_buf *out);

/* Append tokens[i] to sequence seq_ids[i] for i < n and run them; out gets
 * [n, vocab] logits. On error (bad token id, unknown sequence, out of KV
 * blocks, over the context, out of memory) nothing is appended and -1 is
 * returned after reporting. */
int krt_session_step(krt_session *s, int n, const int32_t *tokens, const int32_t *seq_ids, float *out,
                     ks_diag *d);

/* What became of each token of a krt_session_run. */
typedef enum krt_step_status {
    KRT_STEP_OK = 0,          /* ran */
    KRT_STEP_NO_SEQUENCE,     /* its sequence does not exist */
    KRT_STEP_BAD_TOKEN,       /* a token id of its sequence is out of range */
    KRT_STEP_OVER_CONTEXT,    /* its sequence would grow past the context */
    KRT_STEP_OUT_OF_BLOCKS,   /* the KV cache had no free block for its sequence */
    KRT_STEP_FAILED,          /* the step itself failed (reported): nothing ran */
} krt_step_status;

/* "out of KV-cache blocks", ... */
const char *krt_step_status_text(krt_step_status st);

typedef struct krt_step_req {
    int n;                          /* tokens */
    const int32_t *tokens;          /* [n] token ids */
    const int32_t *seq_ids;         /* [n] the sequence of each */
    float *logits;                  /* [n, vocab] out, or NULL when only next tokens are wanted */
    krt_sampler *const *samplers;   /* [n] or NULL: draw a next token from token i's logits with samplers[i]
                                       (NULL entries: none); a sampler serves one token per step */
    int32_t *next;                  /* [n] out with samplers: the ids drawn; -1 where none: the row has a NaN or
                                       infinite logit (on the host and on a device alike) */
    krt_step_status *status;        /* [n] out, or NULL: all or nothing, as krt_session_step */
} krt_step_req;

/* One step. With status, a sequence that cannot take its tokens (unknown,
 * a bad id, past the context, out of KV blocks — blocks are handed out in
 * the order the sequences first appear) gets that status on each of its
 * tokens and nothing appended, and the others run: 0 then, even if some
 * failed, and -1 (after reporting, KRT_STEP_FAILED everywhere, nothing
 * appended) only when the step itself fails. Without status, any failure is
 * reported and fails the whole step. Rows of failed tokens in logits are
 * left as they were. */
int krt_session_run(krt_session *s, const krt_step_req *r, ks_diag *d);

/* Every f32 value the backend computes is shown to tap after each step
 * (runtime/step.h); NULL turns it off. -1 after reporting when the backend
 * cannot. */
int krt_session_set_tap(krt_session *s, krt_tap_fn tap, void *ctx, ks_diag *d);

/* 1 when next tokens are drawn on the backend's device. */
int krt_session_draws_on_device(const krt_session *s);

/* Index of the largest logit (the first on ties, as torch.argmax). */
int32_t krt_argmax(const float *logits, int64_t n);


#endif
