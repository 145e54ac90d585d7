/*
 * bench.h — timing an engine as a user meets it: time to first token for
 * prompts of given lengths, and decode time per token at batch 1, each
 * through the one generation loop (runtime/generate.h) that `kiln run`
 * and kiln.h use, with greedy draws where the logits are (on a GPU only the
 * ids come back). `kiln bench` is its command line; bench/prefill_bench.py
 * reads its JSON.
 *
 *     krt_bench_opts o = krt_bench_defaults();
 *     krt_bench_result r;
 *     if (krt_bench_run(session, &o, &r, &d) == 0) {
 *         krt_bench_table(&r, &text);         // for people
 *         krt_bench_json(&r, "x.engine", &json);   // for machines
 *     }
 *
 * What is timed, with CLOCK_MONOTONIC around the runtime's calls (a step
 * returns once its results are on the host: the CUDA backend synchronizes
 * its stream before a step returns):
 *  - time to first token of an N-token prompt: a fresh sequence, the N
 *    synthetic ids prefilled and the first new token drawn (krt_gen_stats'
 *    first_token_s). A prompt longer than the engine's largest step (its
 *    memory plan's tokens: kiln build --max-tokens) runs in several steps,
 *    as the generation loop runs it: `steps` says how many. A prompt longer
 *    than the session's context is skipped, with a note saying so.
 *  - decode: a fresh sequence, a prompt of decode_prompt tokens, then
 *    `decode` one-token steps; the time per token is those steps' time
 *    divided by their number.
 *  - batched decode (batches): B fresh sequences 0 .. B-1, each prefilled
 *    with the decode prompt (a step each), then `decode` steps of B tokens,
 *    one a sequence, each drawn greedily where the logits are
 *    (krt_session_run with a sampler a token); the time per step is those
 *    steps' time divided by their number.
 * Each measurement runs `warmup` times untimed (first-use costs: activation
 * memory, CUDA graph capture), then `reps` times; median and min of those.
 *
 * Prefix: krt_bench_.
 */
#ifndef KILN_RUNTIME_BENCH_H
#define KILN_RUNTIME_BENCH_H

#include "runtime/session.h"
#include "support/support.h"

enum {
    KRT_BENCH_MAX_PROMPTS = 16, /* prompt lengths one run measures at most */
    KRT_BENCH_MAX_REPS = 1000,  /* timed runs of one measurement at most */
    KRT_BENCH_MAX_BATCHES = 8,  /* batch sizes one run measures at most */
    KRT_BENCH_MAX_BATCH = 256,  /* sequences a batch at most */
};

typedef struct krt_bench_opts {
    int prompts[KRT_BENCH_MAX_PROMPTS]; /* prompt lengths, tokens, each at least 1 */
    int n_prompts;                      /* how many (0: no prefill measured) */
    int decode;                         /* decode steps to time at batch 1; 0: none */
    int decode_prompt;                  /* tokens of the prompt before them (at least 1) */
    int batches[KRT_BENCH_MAX_BATCHES]; /* batch sizes of the batched decode (2 .. KRT_BENCH_MAX_BATCH) */
    int n_batches;                      /* how many (0: none; needs decode > 0) */
    int warmup;                         /* untimed runs before each measurement */
    int reps;                           /* timed runs of each (1 to KRT_BENCH_MAX_REPS) */
} krt_bench_opts;

/* Prompts of 128, 512, 2048 and 8192 tokens; 128 decode steps after 16
 * tokens; 1 warm-up, 5 timed runs. */
krt_bench_opts krt_bench_defaults(void);

/* Median and min of a measurement's timed runs, milliseconds. */
typedef struct krt_bench_time {
    double median_ms; /* the median (of an even count: the mean of the middle two) */
    double min_ms;    /* the fastest run */
    double max_ms;    /* the slowest */
    double first_ms;  /* the first timed run (after the warm-up): with no warm-up, the process's first */
} krt_bench_time;

typedef struct krt_bench_prefill {
    int tokens;           /* the prompt's length */
    int ran;              /* 1: measured; 0: skipped (longer than the context) */
    int steps;            /* steps the prompt ran in: 1, or more when longer than the largest step */
    krt_bench_time ttft;  /* time to first token, when ran */
} krt_bench_prefill;

/* A cold start: the engine file on disk to the first token. The caller times the engine's opening
 * (krt_engine_open reads every byte of the file for its checksum: the file's read rate) and the
 * session's creation (the weights to the device); krt_bench_run the first prompt's first run. */
typedef struct krt_bench_cold {
    int measured;           /* 1 when the caller set open_s and session_s */
    double open_s;          /* krt_engine_open: the file read and checked */
    uint64_t engine_bytes;  /* the file's size */
    double session_s;       /* krt_session_new */
    int prompt_tokens;      /* the first run's prompt (0: none ran) */
    double first_token_ms;  /* its time to first token: the engine's first step */
} krt_bench_cold;

typedef struct krt_bench_result {
    char device[128];         /* the GPU's name, or "cpu" for an engine the interpreter runs */
    const char *weight_dtype; /* "f32", "bf16", "f16" (static) */
    int64_t vocab;            /* logits per token */
    int max_context;          /* the session's positions per sequence */
    int64_t max_step_tokens;  /* the engine's largest step (its memory plan's tokens) */
    int warmup, reps;         /* as asked */
    krt_bench_prefill prefill[KRT_BENCH_MAX_PROMPTS]; /* one per prompt length, in the order asked */
    int n_prefill;            /* how many */
    int decode;               /* decode steps timed per run; 0: none */
    int decode_prompt;        /* the prompt's tokens before them */
    krt_bench_time decode_per_token; /* ms per decode step (per token at batch 1), when decode > 0 */
    int batches[KRT_BENCH_MAX_BATCHES];            /* the batched decode's sizes, in the order asked */
    krt_bench_time batch_step[KRT_BENCH_MAX_BATCHES]; /* ms per step of each (a token of every sequence) */
    int batch_ran[KRT_BENCH_MAX_BATCHES];          /* 1: measured; 0: skipped, its sequences outgrow the cache */
    int64_t batch_blocks[KRT_BENCH_MAX_BATCHES];   /* the KV-cache blocks each batch's sequences need */
    int n_batches;                                 /* how many */
    int kv_blocks, kv_block_size;                  /* the session's KV cache: blocks, positions a block */
    size_t kv_bytes;                               /* its bytes */
    krt_bench_cold cold;                           /* from the file to the first token */
} krt_bench_result;

/* Measure (see the top) in s, which must hold no sequence 0 .. the largest
 * batch - 1 (the runs use them and free them) and take that many sequences.
 * Options out of range and a decode that does not fit the context
 * (decode_prompt + decode positions) are errors, reported before anything
 * runs; so is a failed step. A batch whose sequences (decode_prompt +
 * decode positions each) need more KV-cache blocks than the session's cache
 * holds is skipped, not run, and noted: on a smaller GPU the others are
 * still measured. 0, or -1 after reporting. */
int krt_bench_run(krt_session *s, const krt_bench_opts *o, krt_bench_result *r, ks_diag *d);

/* The results as a table, with notes for the skipped prompts and the ones
 * run in several steps, appended to out. */
void krt_bench_table(const krt_bench_result *r, const char *engine, ks_buf *out);

/* The results as one JSON object (the field names live here and nowhere
 * else: bench/prefill_bench.py reads them), appended to out with a newline:
 *
 *   {"kiln_bench": 1, "engine": PATH, "device": NAME, "weight_dtype": "bf16", "vocab": V,
 *    "max_context": C, "max_step_tokens": M, "warmup": W, "reps": R,
 *    "prefill": [{"tokens": N, "ran": true, "steps": S, "ttft_ms_median": T, "ttft_ms_min": T,
 *                 "tokens_per_s": X, "note": TEXT or null}, ...],
 *    "decode": {"prompt_tokens": P, "tokens": N, "ms_per_token_median": T, "ms_per_token_min": T,
 *               "tokens_per_s": X} or null,
 *    "decode_batch": [{"batch": B, "ran": true, "steps": N, "ms_per_step_median": T, "ms_per_step_min": T,
 *                      "tokens_per_s": X, "note": TEXT or null}, ...]}
 *
 * A skipped prompt has "ran": false, "steps": 0 and null times; a skipped
 * batch "ran": false, null times and a note saying what it needs. 0, or -1
 * after reporting out of memory. */
int krt_bench_json(const krt_bench_result *r, const char *engine, ks_buf *out, ks_diag *d);

#endif
