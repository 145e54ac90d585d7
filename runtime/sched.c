/* sched.c — continuous batching over one session (runtime/sched.h).
 *
 * A request's tokens are one array: its prompt, then each token its
 * generation takes; `ran` of them are in its sequence's KV cache. A running
 * request always has tokens left to run: the whole prompt at first, then the
 * one token just taken — or, after a preemption (ran back to 0), all of
 * them, recomputed. Each step runs a chunk of every running request's
 * tokens left (decoding ones first, then prompts, in arrival order, within
 * the budget); a chunk that reaches the end of its request's tokens draws
 * the next one there, which the generation then takes.
 *
 * Everything allocated is fallible: out of memory fails the request it
 * concerns (or the submit), not the scheduler. */
#include "runtime/sched.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { LP_STEP = 64 }; /* tokens a step at most while a request wants log probabilities */

typedef struct req {
    int id;                   /* krt_sched_submit's answer */
    krt_gen *gen;             /* its generation: NULL until it first runs */
    krt_gen_opts o;           /* the caller's options (stop strings not copied) */
    krt_gen_callbacks cb;     /* its callbacks */
    krt_sched_done_fn done;   /* and the end's */
    void *done_ctx;
    int32_t *ids;             /* [n_ids] the prompt, then each token taken */
    int n_ids, n_prompt;
    size_t cap;
    int ran;                  /* tokens of ids in its sequence */
    int seq;                  /* its sequence while it runs; -1 while it waits */
    uint64_t *hashes;         /* [n_hashed] the chain hashes of ids' first full blocks (prefix caching) */
    int n_hashed;
    size_t hash_cap;
    int published;            /* blocks of its sequence published (or taken from the cache) */
    int at, m;                /* its chunk in the step being built: tokens [at, at + m) (m 0: none) */
    int lp_top;               /* logprobs: -1 none, else the alternatives wanted (krt_sched_logprobs) */
    krt_sched_logprob_fn lp_fn;
    void *lp_ctx;
    int cancelled;            /* krt_sched_cancel asked while a step ran */
    int ended;                /* its done was called: to be removed */
} req;

struct krt_sched {
    krt_session *s;
    const krt_tok *tok;
    int max_batch, budget;    /* the options, settled */
    int prefix_cache;         /* 1: requests share their prompts' full KV blocks */
    int block_size;           /* the KV cache's */
    req **reqs;               /* [n_reqs] in arrival order (a preempted one keeps its place: ahead of later ones) */
    int n_reqs;
    size_t cap;
    uint8_t *seq_used;        /* [max_seqs] sequences in use */
    int max_seqs;
    int next_id;
    int in_step;              /* 1 while krt_sched_step runs (callbacks may cancel) */
    krt_sched_counts counts;
    /* a step's arrays, [budget] each */
    int32_t *tokens, *seq_ids, *next;
    krt_sampler **samplers;
    krt_step_status *status;
    float *logits;            /* [LP_STEP, vocab] for the steps while a request wants logprobs; NULL until then */
};

/* ---- a request's end ---------------------------------------------------------------------------- */
static void release_seq(krt_sched *q, req *r)
{
    if (r->seq < 0) return;
    krt_session_seq_free(q->s, r->seq);
    q->seq_used[r->seq] = 0;
    r->seq = -1;
}

/* The request ends: its text flushed (when it finished), done called, its sequence freed. */
static void end_req(krt_sched *q, req *r, const char *error)
{
    if (r->ended) return;
    r->ended = 1;
    static const krt_gen_stats none;
    ks_buf msg = KS_BUF_TRY;
    ks_diag d = {.quiet = 1, .log = &msg};
    if (!error && r->gen && krt_gen_finish(r->gen, &d) != 0) error = msg.len ? ks_buf_cstr(&msg) : "out of memory";
    release_seq(q, r);
    if (r->done) r->done(r->done_ctx, r->id, r->gen ? krt_gen_stats_of(r->gen) : &none, error);
    ks_buf_free(&msg);
}

/* The message a diag kept, its last newline dropped, for a done callback */
static const char *diag_text(ks_buf *b)
{
    if (b->failed || !b->len) return "out of memory";
    while (b->len && b->data[b->len - 1] == '\n') b->data[--b->len] = 0;
    return ks_buf_cstr(b);
}

/* Remove the requests that ended (and end the cancelled ones first). */
static void reap(krt_sched *q)
{
    int k = 0;
    for (int i = 0; i < q->n_reqs; i++) {
        req *r = q->reqs[i];
        if (r->cancelled) end_req(q, r, "cancelled");
        if (!r->ended) {
            q->reqs[k++] = r;
            continue;
        }
        krt_gen_free(r->gen);
        free(r->ids);
        free(r->hashes);
        free(r);
    }
    q->n_reqs = k;
}

/* ---- the scheduler ------------------------------------------------------------------------------ */
void krt_sched_free(krt_sched *q)
{
    if (!q) return;
    for (int i = 0; i < q->n_reqs; i++) q->reqs[i]->cancelled = 1;
    q->in_step = 0;
    reap(q);
    free(q->reqs);
    free(q->seq_used);
    free(q->tokens);
    free(q->seq_ids);
    free(q->next);
    free(q->samplers);
    free(q->status);
    free(q->logits);
    free(q);
}

krt_sched *krt_sched_new(krt_session *s, const krt_tok *tok, const krt_sched_opts *o, ks_diag *d)
{
    const krt_sched_opts none = {0};
    if (!o) o = &none;
    const krt_desc *desc = krt_session_desc(s);
    const int max_seqs = krt_session_max_seqs(s), largest = (int)desc->plan.max_tokens;
    if (o->max_batch < 0 || o->token_budget < 0) {
        ks_error(d, "kiln", "the scheduler's batch and token budget must be positive (or 0: the defaults)");
        return NULL;
    }
    krt_sched *q = ks_try_calloc(1, sizeof *q);
    if (!q) return ks_error_oom(d, "kiln", sizeof *q, "the scheduler"), NULL;
    q->s = s;
    q->tok = tok;
    q->max_seqs = max_seqs;
    q->max_batch = o->max_batch && o->max_batch < max_seqs ? o->max_batch : max_seqs;
    q->budget = o->token_budget && o->token_budget < largest ? o->token_budget : largest;
    q->prefix_cache = !o->no_prefix_cache;
    q->block_size = krt_session_block_size(s);
    const size_t n = (size_t)q->budget;
    q->seq_used = ks_try_calloc((size_t)max_seqs, 1);
    q->tokens = ks_try_calloc(n, sizeof *q->tokens);
    q->seq_ids = ks_try_calloc(n, sizeof *q->seq_ids);
    q->next = ks_try_calloc(n, sizeof *q->next);
    q->samplers = ks_try_calloc(n, sizeof *q->samplers);
    q->status = ks_try_calloc(n, sizeof *q->status);
    if (!q->seq_used || !q->tokens || !q->seq_ids || !q->next || !q->samplers || !q->status) {
        ks_error_oom(d, "kiln", n * 40, "the scheduler's step");
        krt_sched_free(q);
        return NULL;
    }
    return q;
}

int krt_sched_submit(krt_sched *q, const int32_t *prompt, int n_prompt, const krt_gen_opts *o,
                     const krt_gen_callbacks *cb, krt_sched_done_fn done, void *done_ctx, ks_diag *d)
{
    const int ctx = krt_session_max_context(q->s);
    if (n_prompt < 1 || n_prompt > ctx) {
        ks_error(d, "kiln", "a prompt of %d tokens: it needs 1 to %d (the context)", n_prompt, ctx);
        return -1;
    }
    if (KS_TRY_GROW(q->reqs, (size_t)q->n_reqs + 1, q->cap, (size_t)1 << 24) != 0)
        return ks_error_oom(d, "kiln", ((size_t)q->n_reqs + 1) * sizeof *q->reqs, "the request queue");
    req *r = ks_try_calloc(1, sizeof *r);
    int32_t *ids = ks_try_malloc(sizeof *ids * (size_t)(n_prompt + 16));
    if (!r || !ids) {
        free(r);
        free(ids);
        return ks_error_oom(d, "kiln", sizeof *r + sizeof *ids * (size_t)(n_prompt + 16), "a request");
    }
    memcpy(ids, prompt, sizeof *ids * (size_t)n_prompt);
    *r = (req){.id = q->next_id++, .o = *o, .done = done, .done_ctx = done_ctx, .ids = ids, .n_ids = n_prompt, .lp_top = -1,
               .cap = (size_t)n_prompt + 16, .n_prompt = n_prompt, .seq = -1};
    if (cb) r->cb = *cb;
    if (q->next_id < 0) q->next_id = 0; /* after 2^31 requests */
    q->reqs[q->n_reqs++] = r;
    return r->id;
}

int krt_sched_logprobs(krt_sched *q, int id, int top, krt_sched_logprob_fn fn, void *ctx)
{
    if (top < 0 || top > KRT_SCHED_MAX_TOP || !fn) return -1;
    for (int i = 0; i < q->n_reqs; i++) {
        req *r = q->reqs[i];
        if (r->id != id || r->ended) continue;
        r->lp_top = top, r->lp_fn = fn, r->lp_ctx = ctx;
        return 0;
    }
    return -1;
}

/* The log probability of token in a logits row (log_softmax, in double) and the top most likely ids with
 * theirs, to r's callback */
static void give_logprobs(const krt_sched *q, const req *r, const float *row, int32_t token)
{
    const int64_t vocab = krt_session_vocab(q->s);
    double mx = -INFINITY, sum = 0;
    for (int64_t v = 0; v < vocab; v++) mx = row[v] > mx ? row[v] : mx;
    for (int64_t v = 0; v < vocab; v++) sum += exp((double)row[v] - mx);
    const double lse = mx + log(sum);
    int32_t ids[KRT_SCHED_MAX_TOP];
    float lps[KRT_SCHED_MAX_TOP];
    int n = 0;
    for (int64_t v = 0; v < vocab && r->lp_top > 0; v++) { /* insertion into the top list, ties to the lower id */
        if (n == r->lp_top && row[v] <= row[ids[n - 1]]) continue;
        int k = n < r->lp_top ? n++ : n - 1;
        while (k > 0 && row[ids[k - 1]] < row[v]) ids[k] = ids[k - 1], k--;
        ids[k] = (int32_t)v;
    }
    for (int k = 0; k < n; k++) lps[k] = (float)((double)row[ids[k]] - lse);
    r->lp_fn(r->lp_ctx, token, (float)((double)row[token] - lse), ids, lps, n);
}

int krt_sched_cancel(krt_sched *q, int id)
{
    for (int i = 0; i < q->n_reqs; i++) {
        req *r = q->reqs[i];
        if (r->id != id || r->ended) continue;
        r->cancelled = 1;
        if (!q->in_step) reap(q); /* inside a step: at its end */
        return 0;
    }
    return -1;
}

int krt_sched_busy(const krt_sched *q) { return q->n_reqs > 0; }

krt_sched_counts krt_sched_counts_of(const krt_sched *q)
{
    krt_sched_counts c = q->counts;
    const krt_kv_prefix_stats ps = krt_session_prefix_stats(q->s);
    c.prefix_lookups = ps.lookups, c.prefix_hits = ps.hits;
    c.waiting = c.running = 0;
    for (int i = 0; i < q->n_reqs; i++) {
        if (q->reqs[i]->ended) continue;
        if (q->reqs[i]->seq >= 0) c.running++;
        else c.waiting++;
    }
    return c;
}

/* ---- prefix caching ---------------------------------------------------------------------------- */
/* The chain hashes of r's first `blocks` full blocks of ids (krt_kv_chain_hash); -1 out of memory. */
static int hash_blocks(krt_sched *q, req *r, int blocks)
{
    if (blocks <= r->n_hashed) return 0;
    if (KS_TRY_GROW(r->hashes, (size_t)blocks, r->hash_cap, (size_t)1 << 24) != 0) return -1;
    const int bs = q->block_size;
    for (int b = r->n_hashed; b < blocks; b++)
        r->hashes[b] = krt_kv_chain_hash(b ? r->hashes[b - 1] : 0, r->ids + (size_t)b * (size_t)bs, bs);
    r->n_hashed = blocks;
    return 0;
}

/* r's sequence takes the cached blocks of its tokens but the last (which must run: its logits draw the
 * next token) */
static void attach_cached(krt_sched *q, req *r)
{
    r->published = 0;
    if (!q->prefix_cache || hash_blocks(q, r, (r->n_ids - 1) / q->block_size) != 0) return;
    const int got = krt_session_seq_attach_cached(q->s, r->seq, r->hashes, (r->n_ids - 1) / q->block_size);
    r->ran = got * q->block_size;
    r->published = got;
    q->counts.cached_tokens += r->ran;
}

/* The full blocks r's step wrote, published for later requests */
static void publish(krt_sched *q, req *r)
{
    const int full = r->ran / q->block_size;
    if (!q->prefix_cache || full <= r->published || hash_blocks(q, r, full) != 0) return;
    for (int b = r->published; b < full; b++) krt_session_seq_publish(q->s, r->seq, b, r->hashes[b]);
    r->published = full;
}

/* ---- a step ------------------------------------------------------------------------------------- */
/* Waiting requests join, in arrival order, while the batch and the sequences have room and the KV cache
 * has the blocks of their tokens (and the one after), besides a block for each running request to grow
 * by: a request admitted without them would only be preempted again. The first that does not fit stops
 * the others behind it (arrival order), unless nothing runs: then it joins anyway (and fails if the whole
 * cache cannot hold it). */
static void admit(krt_sched *q)
{
    int running = 0;
    for (int i = 0; i < q->n_reqs; i++) running += q->reqs[i]->seq >= 0;
    const int bs = krt_session_kv_info(q->s)->block_size;
    int free_blocks = krt_session_free_blocks(q->s) - running;
    for (int i = 0; i < q->n_reqs && running < q->max_batch; i++) {
        req *r = q->reqs[i];
        if (r->seq >= 0 || r->ended) continue;
        const int need = (r->n_ids + 1 + bs - 1) / bs;
        if (running > 0 && need > free_blocks) break;
        free_blocks -= need;
        int seq = 0;
        while (seq < q->max_seqs && q->seq_used[seq]) seq++;
        if (seq == q->max_seqs) break;
        ks_buf msg = KS_BUF_TRY;
        ks_diag d = {.quiet = 1, .log = &msg};
        if (krt_session_seq_add(q->s, seq, &d) != 0) {
            end_req(q, r, diag_text(&msg));
            ks_buf_free(&msg);
            continue;
        }
        q->seq_used[seq] = 1;
        r->seq = seq;
        r->ran = 0;
        running++;
        attach_cached(q, r);
        if (!r->gen) {
            r->gen = krt_gen_new(q->s, seq, q->tok, r->ids, r->n_prompt, &r->o, &r->cb, &d);
            if (!r->gen) end_req(q, r, diag_text(&msg));
        }
        ks_buf_free(&msg);
    }
}

/* Put tokens [ran, ran + m) of r into the step at *n, the last drawing where it ends r's tokens. */
static void put_chunk(krt_sched *q, req *r, int m, int *n)
{
    r->at = *n;
    r->m = m;
    for (int j = 0; j < m; j++) {
        const int i = *n + j;
        q->tokens[i] = r->ids[r->ran + j];
        q->seq_ids[i] = r->seq;
        q->samplers[i] = r->ran + j == r->n_ids - 1 ? krt_gen_sampler(r->gen) : NULL;
    }
    *n += m;
}

/* The token r's generation drew: taken, appended to its tokens or ending it. */
static void take(krt_sched *q, req *r, int32_t token)
{
    ks_buf msg = KS_BUF_TRY;
    ks_diag d = {.quiet = 1, .log = &msg};
    int rc = krt_gen_take(r->gen, token, &d);
    if (rc == 0 && KS_TRY_GROW(r->ids, (size_t)r->n_ids + 1, r->cap, (size_t)1 << 28) != 0)
        rc = ks_error_oom(&d, "kiln", ((size_t)r->n_ids + 1) * sizeof *r->ids, "a request's tokens");
    if (rc == 0) r->ids[r->n_ids++] = token;
    else end_req(q, r, rc < 0 ? diag_text(&msg) : NULL);
    ks_buf_free(&msg);
}

int krt_sched_step(krt_sched *q, ks_diag *d)
{
    admit(q);
    /* decoding requests (one token left) first, then the others' chunks, in arrival order; while a running
       request wants log probabilities, steps of at most LP_STEP tokens (their logits rows come back: a
       vocabulary of 128k is half a megabyte a row) */
    int n = 0, budget = q->budget;
    for (int i = 0; i < q->n_reqs; i++) {
        q->reqs[i]->m = 0;
        if (q->reqs[i]->seq >= 0 && !q->reqs[i]->ended && q->reqs[i]->lp_top >= 0 && budget > LP_STEP) budget = LP_STEP;
    }
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < q->n_reqs && n < budget; i++) {
            req *r = q->reqs[i];
            const int left = r->n_ids - r->ran;
            if (r->seq < 0 || r->ended || (pass == 0) != (left == 1)) continue;
            put_chunk(q, r, left < budget - n ? left : budget - n, &n);
        }
    if (n == 0) {
        reap(q);
        return 0;
    }
    /* the logits rows come back when a request of the step wants log probabilities */
    int want_logits = 0;
    for (int i = 0; i < q->n_reqs; i++) want_logits |= q->reqs[i]->m > 0 && q->reqs[i]->lp_top >= 0;
    if (want_logits && !q->logits) {
        q->logits = ks_try_malloc(sizeof *q->logits * (size_t)LP_STEP * (size_t)krt_session_vocab(q->s));
        if (!q->logits) {
            for (int i = 0; i < q->n_reqs; i++)
                if (q->reqs[i]->m > 0 && q->reqs[i]->lp_top >= 0) end_req(q, q->reqs[i], "out of memory for log probabilities");
            reap(q);
            return 0; /* the others run next step */
        }
    }
    q->in_step = 1;
    krt_step_req step = {.n = n, .tokens = q->tokens, .seq_ids = q->seq_ids, .samplers = q->samplers, .next = q->next,
                         .status = q->status, .logits = want_logits ? q->logits : NULL};
    int rc = krt_session_run(q->s, &step, d);
    q->counts.steps += rc == 0;
    /* the outcomes: one out of KV blocks is preempted (it waits at the head of the queue, and nothing is
       admitted before it: it runs again once blocks come free), or, when its tokens are more than the whole
       cache holds, fails */
    for (int i = q->n_reqs - 1; i >= 0; i--) {
        req *r = q->reqs[i];
        if (!r->m || r->cancelled || r->ended) continue;
        const krt_step_status st = rc == 0 ? q->status[r->at] : KRT_STEP_FAILED;
        if (st == KRT_STEP_OK) {
            if (r->m == 1 && r->ran >= r->n_prompt) q->counts.decode_tokens++;
            else q->counts.prefill_tokens += r->m;
            r->ran += r->m;
            publish(q, r);
            const int last = r->at + r->m - 1;
            if (q->samplers[last] && r->lp_top >= 0 && q->next[last] >= 0)
                give_logprobs(q, r, q->logits + (size_t)last * (size_t)krt_session_vocab(q->s), q->next[last]);
            if (q->samplers[last]) take(q, r, q->next[last]);
            continue;
        }
        /* out of blocks: preempted, unless the whole cache could not hold its tokens (it never runs then) */
        const int need = (r->ran + r->m + q->block_size - 1) / q->block_size;
        if (st == KRT_STEP_OUT_OF_BLOCKS && need <= krt_session_kv_info(q->s)->n_blocks) {
            release_seq(q, r); /* its blocks back to the cache; its tokens recomputed when it runs again */
            r->ran = 0;
            q->counts.preemptions++;
            continue;
        }
        end_req(q, r, st == KRT_STEP_OUT_OF_BLOCKS ? "the KV cache cannot hold this request's tokens"
                      : st == KRT_STEP_FAILED  ? "the step failed"
                                               : krt_step_status_text(st));
    }
    q->in_step = 0;
    reap(q);
    return rc;
}
