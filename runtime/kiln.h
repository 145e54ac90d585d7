/*
 * kiln.h — the kiln runtime's C API: load an engine that `kiln build` wrote,
 * run sequences through it, and generate text. This is the one header a
 * deployment includes, and libkiln the one library it links: after
 * `cmake --install build --prefix P` (README, "Deploying an engine"),
 *
 *     cc app.c $(PKG_CONFIG_PATH=P/lib/pkgconfig pkg-config --cflags --libs kiln)
 *
 * (libkiln.so brings what it needs; a self-contained program links
 * P/lib/libkiln.a in place of -lkiln, with the rest of `pkg-config --static
 * --libs kiln`: cJSON, PCRE2, libdl, libm, pthreads). A CUDA engine loads the
 * CUDA driver itself at run time. This header includes only the C standard's
 * <stddef.h> and <stdint.h>, and compiles as C and as C++.
 *
 * A tutorial (runtime/example/generate.c is the whole program):
 *
 *     char err[512];
 *     kiln_engine *e = kiln_engine_open("model.engine", err, sizeof err);
 *     if (!e) { fprintf(stderr, "%s", err); return 1; }
 *     kiln_session *s = kiln_session_new(e, NULL, err, sizeof err);
 *
 *     // text in, text out (the engine holds its tokenizer)
 *     kiln_generate_opts go = kiln_generate_defaults();
 *     go.max_new = 64; go.sampling.temperature = 0.8f; go.sampling.top_p = 0.95f; go.sampling.seed = 42;
 *     const char *stop[] = {"The end."};
 *     go.stop = stop; go.n_stop = 1;
 *     kiln_generate(s, 0, "Once upon a time", &go, print_piece, NULL, err, sizeof err);
 *
 *     // or token ids in, logits out: any number of sequences per step
 *     kiln_seq_add(s, 1, err, sizeof err);
 *     int32_t ids[] = {1, 415, 2804}, seqs[] = {1, 1, 1};
 *     float *logits = malloc(sizeof(float) * 3 * kiln_vocab_size(s));
 *     kiln_step(s, 3, ids, seqs, logits, err, sizeof err);
 *     kiln_seq_free(s, 1);
 *
 *     kiln_session_free(s);
 *     kiln_engine_close(e);
 *
 * Errors: every call that can fail returns NULL or -1 and writes a message
 * naming the file or the request (`model.engine: error: ...`) into err.
 * Running out of memory is such an error (`model.engine: error: out of
 * memory (allocating 1073741824 bytes for the KV cache: ...)`): the call
 * fails having changed nothing (a failed kiln_step appends nothing, a failed
 * kiln_generate leaves its sequence as it was, text already passed to
 * on_text aside), and the session goes on.
 * Threads: a session is used by one thread at a time; sessions of one engine
 * may run on different threads.
 *
 * Prefix: kiln_.
 */
#ifndef KILN_H
#define KILN_H

#include <stddef.h>
#include <stdint.h>

/* KILN_API marks the functions libkiln exports: the library is built with
 * hidden visibility (runtime/CMakeLists.txt), so these are the only symbols a
 * program can link against; the runtime's internals (krt_, kir_, ks_) stay
 * inside it. */
#if defined(__GNUC__) || defined(__clang__)
#define KILN_API __attribute__((visibility("default")))
#else
#define KILN_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_engine kiln_engine;
typedef struct kiln_session kiln_session;

/* Open and check an engine file (format, a checksum of every byte, the graph and its memory plan, weights). */
KILN_API kiln_engine *kiln_engine_open(const char *path, char *err, size_t err_len);
KILN_API void kiln_engine_close(kiln_engine *e);

typedef struct kiln_session_opts {
    int max_seqs;    /* sequences alive at once (ids 0..max_seqs-1); 0: 16 */
    int max_context; /* positions per sequence; 0: the model's context */
    int block_size;  /* KV-cache positions per block; 0: 16 */
    int n_blocks;    /* KV-cache blocks; 0: enough for max_seqs full sequences */
} kiln_session_opts;

KILN_API kiln_session *kiln_session_new(kiln_engine *e, const kiln_session_opts *o, char *err, size_t err_len);
KILN_API void kiln_session_free(kiln_session *s);

KILN_API int64_t kiln_vocab_size(const kiln_session *s);  /* logits per token */
KILN_API int kiln_max_context(const kiln_session *s);

/* Sequences: add an empty one, fork one (the new one shares the old one's
 * KV blocks until it writes), free one. */
KILN_API int kiln_seq_add(kiln_session *s, int seq, char *err, size_t err_len);
KILN_API int kiln_seq_fork(kiln_session *s, int src, int dst, char *err, size_t err_len);
KILN_API void kiln_seq_free(kiln_session *s, int seq);
KILN_API int kiln_seq_len(const kiln_session *s, int seq);

/* Append ids[i] to sequence seqs[i] (i < n) and run them as one step;
 * logits receives [n, vocab]. A failed step appends nothing. */
KILN_API int kiln_step(kiln_session *s, int n, const int32_t *ids, const int32_t *seqs, float *logits, char *err,
                       size_t err_len);

typedef struct kiln_sampling {
    float temperature;        /* 0: greedy */
    int32_t top_k;            /* 0: off */
    float top_p;              /* 1: off */
    float repetition_penalty; /* 1: off */
    uint64_t seed;            /* same seed, same text */
} kiln_sampling;

KILN_API kiln_sampling kiln_sampling_greedy(void);

typedef struct kiln_generate_opts {
    int max_new;              /* tokens to generate at most (the context's end may stop earlier) */
    kiln_sampling sampling;   /* how the next tokens are drawn */
    const char *const *stop;  /* [n_stop] stop strings, or NULL: generation ends where the text shows one, and
                                 the text before it is the output */
    int n_stop;               /* how many */
    int ignore_eos;           /* 1: go on past the model's end-of-sequence tokens */
} kiln_generate_opts;

/* max_new 128, greedy, no stop strings, stop at end of sequence. */
KILN_API kiln_generate_opts kiln_generate_defaults(void);

/* Called with each piece of decoded text as it is generated (whole UTF-8
 * characters only, special tokens left out); return nonzero to stop. */
typedef int (*kiln_text_fn)(void *ctx, const char *text, size_t len);

/* Tokenize prompt (BOS and other special tokens as the model's tokenizer
 * adds them; an empty prompt starts from BOS), run it in sequence seq
 * (added if absent; a sequence that holds tokens already is continued), and
 * generate (o NULL: the defaults), stopping at o->max_new tokens, at any of
 * the model's end-of-sequence tokens (or their text), at a stop string, or
 * at the context's end (its last position is used). A prompt longer than
 * the engine's largest step is run in several steps. The next tokens are
 * drawn where the logits are (on a GPU only their ids come back). Returns
 * the number of tokens generated, or -1 (logits that are NaN or infinite
 * are an error too); after -1 the sequence is as it was before the call
 * (one the call added is gone). */
KILN_API int kiln_generate(kiln_session *s, int seq, const char *prompt, const kiln_generate_opts *o,
                           kiln_text_fn on_text, void *ctx, char *err, size_t err_len);

/* Many generations at once (continuous batching). A scheduler runs requests
 * together in its session's steps: each kiln_scheduler_step runs one step
 * of every running request (the next token of the decoding ones, chunks of
 * the prompts within the token budget); requests join as sequences and KV
 * blocks free up, and leave when they end; when the KV cache runs out of
 * blocks, the newest are preempted and recomputed later (their text is
 * what it would have been). While a scheduler lives, it owns its session's
 * sequences: make no other calls on them.
 *
 *     kiln_scheduler *q = kiln_scheduler_new(s, 0, 0, err, sizeof err);
 *     kiln_submit(q, "Once upon a time", &go, print_a, NULL, done, NULL, err, sizeof err);
 *     kiln_submit(q, "The little dog", &go, print_b, NULL, done, NULL, err, sizeof err);
 *     while (kiln_scheduler_busy(q)) kiln_scheduler_step(q, err, sizeof err);
 *     kiln_scheduler_free(q);
 */
typedef struct kiln_scheduler kiln_scheduler;

/* A request's end, once: the tokens it generated, and error NULL, or its message ("cancelled" when
 * kiln_cancel ended it). */
typedef void (*kiln_done_fn)(void *ctx, int request, int generated, const char *error);

/* max_batch: requests running at once (0: the session's max_seqs); token_budget: tokens a step (0: the
 * engine's largest step). */
KILN_API kiln_scheduler *kiln_scheduler_new(kiln_session *s, int max_batch, int token_budget, char *err,
                                            size_t err_len);
KILN_API void kiln_scheduler_free(kiln_scheduler *q); /* requests left end as cancelled */

/* Queue a prompt (tokenized as kiln_generate's; o NULL: the defaults; its stop strings must outlive the
 * request). on_text gets its text as it is generated, done its end. Returns the request's id (>= 0), or
 * -1 (an empty or too long prompt, bad options). */
KILN_API int kiln_submit(kiln_scheduler *q, const char *prompt, const kiln_generate_opts *o, kiln_text_fn on_text,
                         void *ctx, kiln_done_fn done, void *done_ctx, char *err, size_t err_len);
/* End a request now (its done gets "cancelled"); callable from its callbacks. 0, or -1: no such request. */
KILN_API int kiln_cancel(kiln_scheduler *q, int request);
/* One step; 0, or -1 when the step itself failed (its requests end with the error; the scheduler goes on). */
KILN_API int kiln_scheduler_step(kiln_scheduler *q, char *err, size_t err_len);
/* 1 while requests wait or run. */
KILN_API int kiln_scheduler_busy(const kiln_scheduler *q);

#ifdef __cplusplus
}
#endif
#endif
