/*
 * test_session.c — the session's step API on any backend: failures that stay
 * with their sequence, draws of next tokens, and (on a device) CUDA graphs.
 *
 *   test_session              tinystories-656k built for the CPU (from
 *                             $KILN_SHARED): the reference interpreter
 *   test_session ENGINE       that engine through its backend (a CUDA engine:
 *                             on a GPU, or the CPU stand-in for libcuda that
 *                             tests/cuda/cuda_runtime.sh sets up)
 *   test_session ENGINE --batch-of-41   the batch of 41 (below) alone
 *
 * Checks, each with its expected messages or values held here:
 *  - out of KV blocks: the sequence that needs a block fails alone
 *    (KRT_STEP_OUT_OF_BLOCKS, nothing appended, its logits row untouched),
 *    the other's logits are bitwise those of running it alone; without a
 *    status array the whole step fails with a pinned message;
 *  - past the context, a bad token id, an unknown sequence: the same, each
 *    with its status and its message; session options out of range;
 *  - draws: every next token drawn in a step (on the device where the
 *    backend draws) equals what the CPU sampler draws from the same logits
 *    with the same seed, for greedy, temperature, top-k and top-p; a second
 *    run gives the same ids; on a device, 512 draws from one distribution
 *    land within a total-variation distance of 0.12 of the CPU sampler's
 *    probabilities;
 *  - on a device, graphs: the same steps with and without CUDA graphs give
 *    bitwise equal logits (steps of 1-64 tokens replayed, a larger one eager);
 *  - batch invariance: a sequence decoded alone and among 7 and 31 other sequences of other
 *    lengths and ids gives bitwise equal logits (steps of up to 32 tokens: the decode kernels);
 *    on a device, among 40 within 1e-4, or four half ulps in fast precision (steps past the decode
 *    kernels' 32 tokens and the prefill attention's threshold, on the decode attention kernel);
 *  - the tap sees the step's values.
 * The last lines summarize the figures (bench/gpu_runtime_check.sh keeps them).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compiler/driver.h"
#include "runtime/text/sampler.h"
#include "runtime/session.h"
#include "tests/check.h"
#include "tests/session/test_engine.h"

static const krt_engine *engine; /* the engine under test */
static int64_t vocab;            /* its logits per token */
static int on_device;            /* 1: its backend runs on a device (draws and graphs there) */

static krt_session *session(const krt_session_opts *o)
{
    ks_diag d = {0};
    krt_session *s = krt_session_new(engine, o, &d);
    if (!s) {
        fprintf(stderr, "cannot open a session\n");
        exit(1);
    }
    return s;
}

/* Token ids valid for the model under test: 3 + (37 i mod 450), or mod vocab - 3 where the vocabulary
 * has fewer than 453 ids (gemma2-tiny's 256). */
static int32_t tok(int i) { return (int32_t)(3 + (i * 37) % (vocab < 453 ? vocab - 3 : 450)); }

/* Run n tokens of one sequence; 0 or -1. */
static int prefill(krt_session *s, int seq, int n, int first, float *logits)
{
    ks_diag d = {0};
    int32_t *ids = ks_xmalloc(sizeof *ids * (size_t)n), *seqs = ks_xmalloc(sizeof *seqs * (size_t)n);
    for (int i = 0; i < n; i++) ids[i] = tok(first + i), seqs[i] = seq;
    float *out = logits ? logits : ks_xmalloc(sizeof(float) * (size_t)n * (size_t)vocab);
    int rc = krt_session_step(s, n, ids, seqs, out, &d);
    if (!logits) free(out);
    free(ids);
    free(seqs);
    return rc;
}

static int bitwise_equal(const float *a, const float *b, size_t n) { return memcmp(a, b, sizeof(float) * n) == 0; }

/* ---- failures that stay with their sequence ----------------------------------------------------- */
static void test_out_of_blocks(void)
{
    sink k;
    sink_init(&k);
    /* three blocks of four positions: sequence 0 takes two, sequence 1 one with a place left */
    krt_session_opts o = {.max_seqs = 4, .block_size = 4, .n_blocks = 3, .max_context = 32};
    krt_session *s = session(&o);
    CHECK(krt_session_seq_add(s, 0, &k.d) == 0 && krt_session_seq_add(s, 1, &k.d) == 0);
    CHECK(prefill(s, 0, 8, 0, NULL) == 0 && prefill(s, 1, 3, 100, NULL) == 0);
    int32_t ids[2] = {tok(8), tok(103)}, seqs[2] = {0, 1};
    float *out = ks_xmalloc(sizeof(float) * 2 * (size_t)vocab);

    /* all or nothing: the step fails, nothing is appended */
    CHECK(krt_session_step(s, 2, ids, seqs, out, &k.d) == -1);
    CHECK_LOG(&k, "kiln: error: sequence 0: out of KV cache blocks (0 of 3 blocks free)\n");
    CHECK(krt_session_seq_len(s, 0) == 8 && krt_session_seq_len(s, 1) == 3);

    /* with statuses: sequence 0 fails alone, sequence 1 goes on */
    for (size_t i = 0; i < 2 * (size_t)vocab; i++) out[i] = 12345.0f;
    krt_step_status st[2] = {KRT_STEP_FAILED, KRT_STEP_FAILED};
    krt_step_req r = {.n = 2, .tokens = ids, .seq_ids = seqs, .logits = out, .status = st};
    CHECK(krt_session_run(s, &r, &k.d) == 0);
    CHECK_STR(sink_text(&k), "");
    CHECK(st[0] == KRT_STEP_OUT_OF_BLOCKS && st[1] == KRT_STEP_OK);
    CHECK_STR(krt_step_status_text(st[0]), "out of KV-cache blocks");
    CHECK(krt_session_seq_len(s, 0) == 8 && krt_session_seq_len(s, 1) == 4);
    int untouched = 1;
    for (int64_t i = 0; i < vocab; i++) untouched &= out[i] == 12345.0f;
    CHECK(untouched);

    /* sequence 1 alone, in a session with room: the same logits, bit for bit */
    krt_session_opts big = {.max_seqs = 4, .block_size = 4, .n_blocks = 16, .max_context = 32};
    krt_session *alone = session(&big);
    float *want = ks_xmalloc(sizeof(float) * (size_t)vocab);
    CHECK(krt_session_seq_add(alone, 1, &k.d) == 0 && prefill(alone, 1, 3, 100, NULL) == 0);
    CHECK(krt_session_step(alone, 1, &ids[1], &seqs[1], want, &k.d) == 0);
    CHECK(bitwise_equal(out + vocab, want, (size_t)vocab));
    krt_session_free(alone);

    /* every token failing is no error: nothing runs */
    st[0] = st[1] = KRT_STEP_OK;
    int32_t both0[2] = {0, 0};
    r.seq_ids = both0;
    CHECK(krt_session_run(s, &r, &k.d) == 0 && st[0] == KRT_STEP_OUT_OF_BLOCKS && st[1] == KRT_STEP_OUT_OF_BLOCKS);
    CHECK(krt_session_seq_len(s, 0) == 8);

    /* blocks come back with a freed sequence, and sequence 0 goes on */
    krt_session_seq_free(s, 1);
    r.n = 1;
    r.seq_ids = seqs;
    CHECK(krt_session_run(s, &r, &k.d) == 0 && st[0] == KRT_STEP_OK && krt_session_seq_len(s, 0) == 9);
    CHECK_STR(sink_text(&k), "");
    free(want);
    free(out);
    krt_session_free(s);
    ks_buf_free(&k.log);
}

static void test_context_and_ids(void)
{
    sink k;
    sink_init(&k);
    krt_session_opts o = {.max_seqs = 4, .max_context = 8};
    krt_session *s = session(&o);
    CHECK(krt_session_seq_add(s, 0, &k.d) == 0 && krt_session_seq_add(s, 1, &k.d) == 0 &&
          krt_session_seq_add(s, 2, &k.d) == 0);
    CHECK(prefill(s, 0, 8, 0, NULL) == 0 && prefill(s, 1, 2, 50, NULL) == 0);
    float *out = ks_xmalloc(sizeof(float) * 4 * (size_t)vocab);
    int32_t bad = (int32_t)krt_session_vocab(s) + 5000;
    ks_buf want = {0};

    /* all or nothing, one message each */
    int32_t one = tok(9), zero = 0, three = 3;
    CHECK(krt_session_step(s, 1, &one, &zero, out, &k.d) == -1);
    CHECK_LOG(&k, "kiln: error: sequence 0: position 8 is past the context of 8 tokens\n");
    int32_t seq1 = 1;
    CHECK(krt_session_step(s, 1, &bad, &seq1, out, &k.d) == -1);
    ks_buf_printf(&want, "kiln: error: token id %d is out of range (the vocabulary has %lld ids)\n", bad,
                  (long long)krt_session_vocab(s));
    CHECK_LOG(&k, ks_buf_cstr(&want));
    CHECK(krt_session_step(s, 1, &one, &three, out, &k.d) == -1);
    CHECK_LOG(&k, "kiln: error: sequence 3 does not exist\n");
    /* more tokens than the engine's memory plan holds (kiln run prefills such prompts in steps) */
    if (engine->desc.plan.planned) {
        int big = (int)engine->desc.plan.max_tokens + 1;
        int32_t *many = ks_xcalloc((size_t)big, sizeof *many), *mseq = ks_xcalloc((size_t)big, sizeof *mseq);
        CHECK(krt_session_step(s, big, many, mseq, NULL, &k.d) == -1);
        want.len = 0;
        ks_buf_printf(&want, "kiln: error: a step of %d tokens is more than the %d the engine's memory plan holds\n",
                      big, big - 1);
        CHECK_LOG(&k, ks_buf_cstr(&want));
        free(many);
        free(mseq);
    }
    CHECK(krt_session_seq_len(s, 0) == 8 && krt_session_seq_len(s, 1) == 2 && krt_session_seq_len(s, 2) == 0);

    /* with statuses: each sequence with its own outcome; sequence 1 runs */
    int32_t ids[4] = {tok(9), tok(52), bad, tok(1)}, seqs[4] = {0, 1, 2, 3};
    krt_step_status st[4];
    krt_step_req r = {.n = 4, .tokens = ids, .seq_ids = seqs, .logits = out, .status = st};
    CHECK(krt_session_run(s, &r, &k.d) == 0);
    CHECK(st[0] == KRT_STEP_OVER_CONTEXT && st[1] == KRT_STEP_OK && st[2] == KRT_STEP_BAD_TOKEN &&
          st[3] == KRT_STEP_NO_SEQUENCE);
    CHECK(krt_session_seq_len(s, 0) == 8 && krt_session_seq_len(s, 1) == 3 && krt_session_seq_len(s, 2) == 0);
    CHECK_STR(sink_text(&k), "");
    krt_session_free(s);

    /* options the engine cannot have */
    int limit = engine->desc.max_context;
    krt_session_opts too_long = {.max_context = limit + 1};
    CHECK(krt_session_new(engine, &too_long, &k.d) == NULL);
    want.len = 0;
    ks_buf_printf(&want, "kiln: error: a context of %d positions is over the engine's limit of %d\n", limit + 1, limit);
    CHECK_LOG(&k, ks_buf_cstr(&want));
    krt_session_opts frac = {.kv_fraction = 1.5};
    CHECK(krt_session_new(engine, &frac, &k.d) == NULL);
    CHECK_STR(sink_text(&k), "kiln: error: the KV-cache fraction of free device memory must be in (0, 1] (got 1.5)\n");
    ks_buf_free(&want);
    free(out);
    ks_buf_free(&k.log);
}

/* ---- draws --------------------------------------------------------------------------------------- */
/* The sampler settings the draws cycle through. */
static const struct {
    float temperature;
    int top_k;
    float top_p;
} configs[] = {
    {0, 0, 1},     {1, 0, 1},      {0.8f, 40, 1},  {1, 0, 0.9f},
    {0.7f, 50, 0.95f}, {1.5f, 0, 0.5f}, {1, 1, 1}, {1.2f, 5, 0.8f},
};
enum { N_CONFIGS = sizeof configs / sizeof configs[0] };

static krt_sampler *make_sampler(int config, uint64_t seed)
{
    krt_sampler_config c = krt_sampler_defaults();
    c.temperature = configs[config].temperature;
    c.top_k = configs[config].top_k;
    c.top_p = configs[config].top_p;
    c.seed = seed;
    ks_diag d = {0};
    krt_sampler *s = krt_sampler_new(&d, &c, (int32_t)vocab);
    KS_ASSERT(s);
    return s;
}

/* A 64-token prompt with a draw at every token (each its own settings and
 * seed), then 8 decode steps of 4 sequences forked from it: every id drawn
 * goes to ids, and is checked against the CPU sampler on the step's logits.
 * Returns the draws compared; *equal counts the equal ones. */
static int draw_run(int32_t *ids, int *equal)
{
    enum { PROMPT = 64, SEQS = 4, STEPS = 8 };
    krt_session_opts o = {.max_seqs = SEQS};
    krt_session *s = session(&o);
    ks_diag d = {0};
    krt_sampler *smp[PROMPT], *ref[PROMPT];
    for (int i = 0; i < PROMPT; i++) {
        smp[i] = make_sampler(i % N_CONFIGS, 1000 + (uint64_t)i);
        ref[i] = make_sampler(i % N_CONFIGS, 1000 + (uint64_t)i);
    }
    int32_t toks[PROMPT], seqs[PROMPT], next[PROMPT];
    for (int i = 0; i < PROMPT; i++) toks[i] = tok(i), seqs[i] = 0;
    float *logits = ks_xmalloc(sizeof(float) * PROMPT * (size_t)vocab);
    krt_step_req r = {.n = PROMPT, .tokens = toks, .seq_ids = seqs, .logits = logits, .samplers = smp, .next = next};
    int n = 0;
    *equal = 0;
    CHECK(krt_session_seq_add(s, 0, &d) == 0 && krt_session_run(s, &r, &d) == 0);
    for (int i = 0; i < PROMPT; i++, n++) {
        ids[n] = next[i];
        *equal += krt_sampler_sample(ref[i], logits + (size_t)i * vocab) == next[i];
    }
    for (int q = 1; q < SEQS; q++) CHECK(krt_session_seq_fork(s, 0, q, &d) == 0);
    for (int step = 0; step < STEPS; step++) {
        /* sequence q goes on with the id drawn for it, with sampler q's generator */
        for (int q = 0; q < SEQS; q++) toks[q] = step ? next[q] : next[PROMPT - 1 - q], seqs[q] = q;
        krt_step_req dr = {.n = SEQS, .tokens = toks, .seq_ids = seqs, .logits = logits, .samplers = smp, .next = next};
        CHECK(krt_session_run(s, &dr, &d) == 0);
        for (int q = 0; q < SEQS; q++, n++) {
            ids[n] = next[q];
            *equal += krt_sampler_sample(ref[q], logits + (size_t)q * vocab) == next[q];
        }
    }
    for (int i = 0; i < PROMPT; i++) krt_sampler_free(smp[i]), krt_sampler_free(ref[i]);
    free(logits);
    krt_session_free(s);
    return n;
}

/* 512 draws (temperature 1, top-k 8) from one row: 64 sequences with the
 * same one-token prompt per step, 8 steps, each draw with its own seed; the total
 * variation distance between their frequencies and the CPU sampler's
 * probabilities for that row. */
static double draw_distribution(void)
{
    enum { SEQS = 64, LEN = 1, ROUNDS = 8 };
    krt_session_opts o = {.max_seqs = SEQS};
    krt_session *s = session(&o);
    ks_diag d = {0};
    krt_sampler_config c = krt_sampler_defaults();
    c.top_k = 8;
    int32_t toks[SEQS * LEN], seqs[SEQS * LEN], next[SEQS * LEN];
    krt_sampler *smp[SEQS * LEN] = {0};
    float *logits = ks_xmalloc(sizeof(float) * SEQS * LEN * (size_t)vocab);
    int32_t *count = ks_xcalloc((size_t)vocab, sizeof *count);
    for (int round = 0; round < ROUNDS; round++) {
        for (int q = 0; q < SEQS; q++) {
            CHECK(krt_session_seq_add(s, q, &d) == 0);
            for (int j = 0; j < LEN; j++) toks[q * LEN + j] = tok(j), seqs[q * LEN + j] = q;
            c.seed = (uint64_t)(round * SEQS + q) * 7919u + 1;
            smp[q * LEN + LEN - 1] = krt_sampler_new(&d, &c, (int32_t)vocab);
        }
        krt_step_req r = {.n = SEQS * LEN, .tokens = toks, .seq_ids = seqs, .logits = round ? NULL : logits,
                          .samplers = smp, .next = next};
        CHECK(krt_session_run(s, &r, &d) == 0);
        for (int q = 0; q < SEQS; q++) {
            int32_t id = next[q * LEN + LEN - 1];
            if (id >= 0 && id < vocab) count[id]++;
            krt_sampler_free(smp[q * LEN + LEN - 1]);
            smp[q * LEN + LEN - 1] = NULL;
            krt_session_seq_free(s, q);
        }
    }
    /* the CPU sampler's probabilities for the row (the last prompt token of sequence 0) */
    krt_sampler *cpu = krt_sampler_new(&d, &c, (int32_t)vocab);
    int32_t *cand = ks_xmalloc(sizeof *cand * (size_t)vocab);
    double *prob = ks_xmalloc(sizeof *prob * (size_t)vocab), tv = 0, covered = 0;
    size_t nc = krt_sampler_candidates(cpu, logits + (size_t)(LEN - 1) * vocab, cand, prob);
    for (size_t k = 0; k < nc; k++) {
        double f = (double)count[cand[k]] / (SEQS * ROUNDS);
        tv += fabs(f - prob[k]);
        covered += f;
    }
    tv += 1 - covered; /* draws outside the candidates */
    tv /= 2;
    krt_sampler_free(cpu);
    free(cand);
    free(prob);
    free(count);
    free(logits);
    krt_session_free(s);
    return tv;
}

static void test_draws(void)
{
    enum { MAX_DRAWS = 64 + 8 * 4 };
    int32_t a[MAX_DRAWS], b[MAX_DRAWS];
    int equal_a = 0, equal_b = 0;
    int n = draw_run(a, &equal_a);
    int m = draw_run(b, &equal_b);
    CHECK(n == m && n == MAX_DRAWS);
    CHECK(equal_a == n && equal_b == n);
    int same = memcmp(a, b, sizeof a) == 0;
    CHECK(same);
    krt_session_opts o = {0};
    krt_session *s = session(&o);
    printf("draws (%s): %d of %d equal to the CPU sampler's (greedy, temperature, top-k, top-p); second run %s\n",
           krt_session_draws_on_device(s) ? "on the device" : "on the host", equal_a, n,
           same ? "identical" : "DIFFERENT");
    /* the distribution of draws on the host is the sampler's own (tests/sampler) */
    if (krt_session_draws_on_device(s)) {
        double tv = draw_distribution();
        CHECK(tv < 0.12);
        printf("draws: 512 from one row, total variation %.3f from the CPU sampler's probabilities\n", tv);
    }
    krt_session_free(s);
}

/* ---- graphs ------------------------------------------------------------------------------------------ */
/* A mix of steps: three prompts in one step, a fork, decode steps of 1-3
 * tokens, an 80-token step (eager; regrows the activations), decode again.
 * Appends every logit to out. */
static void graph_run(int no_graphs, ks_buf *out)
{
    krt_session_opts o = {.max_seqs = 4, .no_graphs = no_graphs};
    krt_session *s = session(&o);
    ks_diag d = {0};
    float *logits = ks_xmalloc(sizeof(float) * 96 * (size_t)vocab);
    int32_t ids[96], seqs[96];
    for (int q = 0; q < 3; q++) CHECK(krt_session_seq_add(s, q, &d) == 0);
    for (int i = 0; i < 20; i++) ids[i] = tok(i), seqs[i] = i % 3;
    CHECK(krt_session_step(s, 20, ids, seqs, logits, &d) == 0);
    ks_buf_put(out, logits, sizeof(float) * 20 * (size_t)vocab);
    CHECK(krt_session_seq_fork(s, 2, 3, &d) == 0);
    for (int step = 0; step < 12; step++) {
        int n = 1 + step % 4;
        for (int i = 0; i < n; i++) ids[i] = tok(step * 4 + i + 30), seqs[i] = i;
        if (step == 6) {
            /* a large step: 80 tokens of sequence 0 and one of the others */
            n = 83;
            for (int i = 0; i < n; i++) ids[i] = tok(i + 200), seqs[i] = i < 80 ? 0 : i - 79;
        }
        CHECK(krt_session_step(s, n, ids, seqs, logits, &d) == 0);
        ks_buf_put(out, logits, sizeof(float) * (size_t)n * (size_t)vocab);
    }
    free(logits);
    krt_session_free(s);
}

static void test_graphs(void)
{
    ks_buf with = {0}, without = {0};
    graph_run(0, &with);
    graph_run(1, &without);
    int same = with.len == without.len && with.len > 0 && memcmp(with.data, without.data, with.len) == 0;
    CHECK(same);
    printf("graphs: %zu logits of 13 steps (1-83 tokens) %s with and without CUDA graphs\n",
           with.len / sizeof(float), same ? "bitwise equal" : "DIFFER");
    ks_buf_free(&with);
    ks_buf_free(&without);
}

/* ---- batch invariance ------------------------------------------------------------------------------- */
/* Sequence 0's logits over INV_DECODE one-token steps after a 7-token prompt, alone (others 0) or
 * with `others` more sequences in each step (prompts of 1 to 23 tokens, other ids; sequence 0's
 * token in the middle of the step), into rows [INV_DECODE][vocab]. */
enum { INV_DECODE = 3, INV_PROMPT = 7 };
static void invariance_run(int others, float *rows)
{
    krt_session_opts o = {.max_seqs = others + 1};
    krt_session *s = session(&o);
    ks_diag d = {0};
    const int n = others + 1, me = others / 2; /* the step's slot of sequence 0 */
    for (int q = 1; q <= others; q++)
        CHECK(krt_session_seq_add(s, q, &d) == 0 && prefill(s, q, 1 + (q * 5) % 23, 300 + 11 * q, NULL) == 0);
    CHECK(krt_session_seq_add(s, 0, &d) == 0 && prefill(s, 0, INV_PROMPT, 0, NULL) == 0);
    float *logits = ks_xmalloc(sizeof(float) * (size_t)n * (size_t)vocab);
    int32_t *ids = ks_xmalloc(sizeof *ids * (size_t)n), *seqs = ks_xmalloc(sizeof *seqs * (size_t)n);
    for (int step = 0; step < INV_DECODE; step++) {
        for (int i = 0, q = 1; i < n; i++) {
            if (i == me) {
                ids[i] = tok(100 + step), seqs[i] = 0;
            } else {
                ids[i] = tok(200 + 7 * q + step), seqs[i] = q;
                q++;
            }
        }
        CHECK(krt_session_step(s, n, ids, seqs, logits, &d) == 0);
        memcpy(rows + (size_t)step * (size_t)vocab, logits + (size_t)me * (size_t)vocab, sizeof(float) * (size_t)vocab);
    }
    free(ids);
    free(seqs);
    free(logits);
    krt_session_free(s);
}

/* A sequence's logits do not depend on the other sequences in its steps or on their number: decoded
 * alone, among 7 others and among 31 bitwise equal (steps of up to 32 tokens take the CUDA
 * backend's decode matmuls, kcu_matmul_tc or _small, whose sums a token do not depend on the step,
 * and its attention keeps one layout for them: codegen/cuda/kcu.h's KCU_DECODE_T). */
/* large_only: the batch of 41 alone (test_session ENGINE --batch-of-41) */
static void test_batch_invariance(int large_only)
{
    float *alone = ks_xmalloc(sizeof(float) * INV_DECODE * (size_t)vocab);
    float *among = ks_xmalloc(sizeof(float) * INV_DECODE * (size_t)vocab);
    invariance_run(0, alone);
    const int sizes[2] = {7, 31};
    for (int k = 0; k < 2 && !large_only; k++) {
        invariance_run(sizes[k], among);
        int same = bitwise_equal(alone, among, INV_DECODE * (size_t)vocab);
        double worst = 0, scale = 0;
        for (size_t i = 0; i < INV_DECODE * (size_t)vocab; i++) {
            if (fabs((double)among[i] - alone[i]) > worst) worst = fabs((double)among[i] - alone[i]);
            if (fabs(alone[i]) > scale) scale = fabs(alone[i]);
        }
        CHECK(same);
        printf("batch invariance: %d decode steps among %d other sequences %s alone", INV_DECODE, sizes[k],
               same ? "bitwise equal to" : "DIFFER from");
        if (!same) printf(" (max|d|/max %.2g)", scale > 0 ? worst / scale : 0.0);
        printf("\n");
    }
    if (on_device) {
        /* among 40 others: 41 one-token steps, over the prefill attention's 32 tokens, stay on the decode
         * attention kernel (chosen by the step's longest sequence, not its size), replayed from a graph;
         * the matmuls take the prefill kernels there (another order), so close rather than equal: within
         * 1e-4 of the largest logit where the values between kernels are f32, within four half ulps where
         * they are bf16 or f16 (fast precision: another order flips a rounding of a value now and then) */
        double tol = engine->desc.kv_dtype == KIR_BF16 ? 4.0 / 256 : engine->desc.kv_dtype == KIR_F16 ? 4.0 / 2048 : 1e-4;
        /* fp8 and w8a8 quantize x a token at a time: another order's last bit moves an element of x across a
         * code boundary now and then, a whole step (e4m3: 1/16 of it), so a tenth of the largest logit */
        const kir_graph *g = engine->desc.graph;
        for (size_t v = 0; v < g->n_nodes; v++)
            if (g->nodes[v].op == KIR_OP_MATMUL && g->nodes[v].nin > 2) {
                const kir_word q = kir_attr_word(g, (kir_val)v, KIR_A_MATMUL_QUANT);
                if (q == KIR_QUANT_FP8 || q == KIR_QUANT_W8A8) tol = 0.1;
            }
        /* a KV cache of codes likewise: a k or v element across a code boundary moves a step (int8: 1/127 of
         * its row's amax; fp8: 1/16 of it) */
        if (engine->desc.kv_dtype == KIR_I8 || engine->desc.kv_dtype == KIR_F8E4M3) tol = 0.1;
        invariance_run(40, among);
        double worst = 0, scale = 0;
        for (size_t i = 0; i < INV_DECODE * (size_t)vocab; i++) {
            double dv = fabs((double)among[i] - alone[i]);
            if (dv > worst) worst = dv;
            if (fabs(alone[i]) > scale) scale = fabs(alone[i]);
        }
        CHECK_MSG(worst <= tol * scale, "among 40 others: max|d| %g of max %g (limit %g of it)", worst, scale, tol);
        printf("batch of 41: %d decode steps among 40 other sequences within %.2g of alone (max|d|/max)\n", INV_DECODE,
               scale > 0 ? worst / scale : 0.0);
    }
    free(alone);
    free(among);
}

/* ---- the tap --------------------------------------------------------------------------------------- */
static void count_value(void *ctx, kir_val v, const float *data, int n_tokens)
{
    (void)v;
    (void)data;
    *(int *)ctx += n_tokens == 3;
}

static void test_tap(void)
{
    krt_session_opts o = {.max_seqs = 1};
    krt_session *s = session(&o);
    ks_diag d = {0};
    int seen = 0;
    CHECK(krt_session_set_tap(s, count_value, &seen, &d) == 0);
    CHECK(krt_session_seq_add(s, 0, &d) == 0 && prefill(s, 0, 3, 0, NULL) == 0);
    CHECK(seen > 5);
    krt_session_free(s);
}

int main(int argc, char **argv)
{
    ks_diag d = {0};
    const int large_only = argc == 3 && strcmp(argv[2], "--batch-of-41") == 0;
    test_engine te;
    krt_engine *e = test_engine_open(argc == 2 || large_only ? argv[1] : NULL, &te, &d);
    if (!e) return 1;
    engine = e;
    krt_session *probe = session(NULL);
    vocab = krt_session_vocab(probe);
    on_device = krt_session_kv_info(probe)->on_device;
    krt_session_free(probe);
    if (large_only) {
        test_batch_invariance(1);
        test_engine_close(&te, e);
        return check_finish("session");
    }
    test_out_of_blocks();
    test_context_and_ids();
    test_draws();
    if (on_device) test_graphs(); /* the interpreter has no graphs */
    test_batch_invariance(0);
    test_tap();
    printf("failures: out of blocks, context, bad id, unknown sequence: %s\n",
           failures ? "see above" : "each failed alone, the others ran");
    test_engine_close(&te, e);
    return check_finish("session");
}
