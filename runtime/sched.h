/*
 * sched.h — continuous batching: many generations share each step of one
 * session (the server's scheduler, usable without it).
 *
 *     krt_sched *q = krt_sched_new(session, tok, &opts, &d);
 *     int id = krt_sched_submit(q, prompt_ids, n, &gen_opts, &callbacks, &d);  // any time
 *     while (krt_sched_busy(q)) krt_sched_step(q, &d);                          // one step each
 *     krt_sched_cancel(q, id);                                                  // any time
 *     krt_sched_free(q);
 *
 * Each request is one generation (runtime/generate.h's krt_gen: its
 * sampler, stop strings, end-of-sequence, text and callbacks), in a sequence
 * of its own while it runs. A step (krt_sched_step) holds, in the order the
 * requests arrived:
 *  - the next token of every running request that is decoding (one each);
 *  - then chunks of the prompts still to run, as many tokens as the step's
 *    budget leaves (opts.token_budget; chunked prefill: a long prompt runs
 *    over several steps beside the decoding ones, which it does not stall);
 * waiting requests join as sequences and batch room free up (opts.max_batch),
 * finished and cancelled ones leave at once: their sequences' blocks return
 * to the KV cache.
 *
 * Preemption: when the KV cache has no block for a request's tokens
 * (krt_session_run's KRT_STEP_OUT_OF_BLOCKS; blocks go to the requests in
 * arrival order, so the newest miss first), its sequence is freed and it
 * goes back to the head of the queue; when it runs again, it recomputes
 * its prompt and the tokens it generated in prefill steps, then goes on.
 * Its generation's state (sampler, text) is kept, so its text is the text
 * it would have had. A request that the whole cache cannot hold fails with
 * an error; every other admitted request finishes.
 *
 * Prefix caching (unless opts.no_prefix_cache): a running request publishes
 * each full block of its sequence under the chain hash of its tokens, and a
 * request that joins takes the published blocks of its tokens' first full
 * blocks instead of running them (all but its last token, whose logits draw
 * the next one); published blocks that no sequence holds stay cached until
 * the KV cache needs them, least recently released first
 * (runtime/kv/kv_cache.h). A preempted request, joining again, finds its own
 * blocks there if they were not taken meanwhile.
 *
 * Threads: one thread at a time calls into a krt_sched (the server's loop).
 *
 * Prefix: krt_sched_.
 */
#ifndef KILN_RUNTIME_SCHED_H
#define KILN_RUNTIME_SCHED_H

#include <stdint.h>

#include "runtime/generate.h"

typedef struct krt_sched_opts {
    int max_batch;    /* requests running at once; 0: the session's sequences (at most) */
    int token_budget; /* tokens a step at most; 0: the engine's largest step (its plan's max_tokens) */
    int no_prefix_cache; /* 1: no request takes another's KV blocks */
} krt_sched_opts;

/* A request's end: its generation's counts and why it ended, or error (NULL when it finished: the
 * message of what failed it, "cancelled" when it was). Called once per request, from
 * krt_sched_step or krt_sched_cancel; the request is gone after it. */
typedef void (*krt_sched_done_fn)(void *ctx, int id, const krt_gen_stats *st, const char *error);

typedef struct krt_sched krt_sched;

/* tok may be NULL (requests without text). */
krt_sched *krt_sched_new(krt_session *s, const krt_tok *tok, const krt_sched_opts *o, ks_diag *d);
void krt_sched_free(krt_sched *q); /* requests still there end as cancelled */

/* Queue a request: prompt ids (copied), its generation's options (the stop strings must outlive it)
 * and callbacks, and done (may be NULL) with done_ctx. Returns its id (>= 0), or -1 after reporting
 * (an empty prompt or one longer than the context, out of memory). */
int krt_sched_submit(krt_sched *q, const int32_t *prompt, int n_prompt, const krt_gen_opts *o,
                     const krt_gen_callbacks *cb, krt_sched_done_fn done, void *done_ctx, ks_diag *d);

/* Log probabilities of request id's generated tokens (OpenAI's logprobs): before each token is taken,
 * fn gets it, its log probability under the model's distribution (log_softmax of its logits row, before
 * any temperature), and the `top` (0 to KRT_SCHED_MAX_TOP) most likely ids with theirs, most likely
 * first. Asks each step that holds the request for its logits rows (on a GPU they come back). Set before
 * the request's first step; 0, or -1 when there is no such request or top is out of range. */
enum { KRT_SCHED_MAX_TOP = 20 };
typedef void (*krt_sched_logprob_fn)(void *ctx, int32_t token, float logprob, const int32_t *top_ids,
                                     const float *top_logprobs, int n_top);
int krt_sched_logprobs(krt_sched *q, int id, int top, krt_sched_logprob_fn fn, void *ctx);

/* End request id now (its done gets "cancelled"); 0, or -1 when there is no such request. */
int krt_sched_cancel(krt_sched *q, int id);

/* Run one step of the requests there are (none: returns at once). 0, or -1 after reporting when the
 * step itself failed (then every request in it has ended with that error; the scheduler goes on). */
int krt_sched_step(krt_sched *q, ks_diag *d);

/* 1 while requests are waiting or running. */
int krt_sched_busy(const krt_sched *q);

/* What a step leaves: for reports and the server's metrics. */
typedef struct krt_sched_counts {
    int waiting;            /* requests queued, not running */
    int running;            /* requests with a sequence */
    long steps;             /* steps run */
    long preemptions;       /* requests sent back to the queue for want of KV blocks */
    long prefill_tokens;    /* prompt (and recomputed) tokens run */
    long decode_tokens;     /* generated tokens run */
    long cached_tokens;     /* prompt (and recomputed) tokens taken from the prefix cache instead of run */
    long prefix_lookups;    /* KV blocks looked up in the prefix cache (runtime/kv/kv_cache.h) */
    long prefix_hits;       /* of those, found */
} krt_sched_counts;
krt_sched_counts krt_sched_counts_of(const krt_sched *q);

#endif
