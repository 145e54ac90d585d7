/*
 * kiln.h — the kiln runtime's C API: load an engine that `kiln build` wrote,
 * run sequences through it, and generate text. This is the one header a
 * deployment includes; link libkiln_runtime (and what it needs: the kiln
 * support, IR and KV-cache libraries, cJSON, PCRE2; a CUDA engine loads the
 * CUDA driver itself at run time).
 *
 * A tutorial (runtime/example/generate.c is the whole program):
 *
 *     char err[512];
 *     kiln_engine *e = kiln_engine_open("model.engine", err, sizeof err);
 *     if (!e) { fprintf(stderr, "%s", err); return 1; }
 *     kiln_session *s = kiln_session_new(e, NULL, err, sizeof err);
 *
 *     // text in, text out (the engine holds its tokenizer)
 *     kiln_sampling smp = kiln_sampling_greedy();
 *     smp.temperature = 0.8f; smp.top_p = 0.95f; smp.seed = 42;
 *     kiln_generate(s, 0, "Once upon a time", 64, &smp, print_piece, NULL, err, sizeof err);
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
 * Threads: a session is used by one thread at a time; sessions of one engine
 * may run on different threads.
 *
 * Prefix: kiln_.
 */
#ifndef KILN_H
#define KILN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_engine kiln_engine;
typedef struct kiln_session kiln_session;

/* Open and check an engine file (format, a checksum of every byte, the graph and its memory plan, weights). */
kiln_engine *kiln_engine_open(const char *path, char *err, size_t err_len);
void kiln_engine_close(kiln_engine *e);

typedef struct kiln_session_opts {
    int max_seqs;    /* sequences alive at once (ids 0..max_seqs-1); 0: 16 */
    int max_context; /* positions per sequence; 0: the model's context */
    int block_size;  /* KV-cache positions per block; 0: 16 */
    int n_blocks;    /* KV-cache blocks; 0: enough for max_seqs full sequences */
} kiln_session_opts;

kiln_session *kiln_session_new(kiln_engine *e, const kiln_session_opts *o, char *err, size_t err_len);
void kiln_session_free(kiln_session *s);

int64_t kiln_vocab_size(const kiln_session *s);  /* logits per token */
int kiln_max_context(const kiln_session *s);

/* Sequences: add an empty one, fork one (the new one shares the old one's
 * KV blocks until it writes), free one. */
int kiln_seq_add(kiln_session *s, int seq, char *err, size_t err_len);
int kiln_seq_fork(kiln_session *s, int src, int dst, char *err, size_t err_len);
void kiln_seq_free(kiln_session *s, int seq);
int kiln_seq_len(const kiln_session *s, int seq);

/* Append ids[i] to sequence seqs[i] (i < n) and run them as one step;
 * logits receives [n, vocab]. A failed step appends nothing. */
int kiln_step(kiln_session *s, int n, const int32_t *ids, const int32_t *seqs, float *logits, char *err,
              size_t err_len);

typedef struct kiln_sampling {
    float temperature;        /* 0: greedy */
    int32_t top_k;            /* 0: off */
    float top_p;              /* 1: off */
    float repetition_penalty; /* 1: off */
    uint64_t seed;            /* same seed, same text */
} kiln_sampling;

kiln_sampling kiln_sampling_greedy(void);

/* Called with each piece of decoded text as it is generated (whole UTF-8
 * characters only); return nonzero to stop. */
typedef int (*kiln_text_fn)(void *ctx, const char *text, size_t len);

/* Tokenize prompt (BOS as the model expects), run it in sequence seq (added
 * if absent, which must be empty or absent), and generate up to max_new
 * tokens, stopping at the model's end-of-sequence token or the context's
 * end. Returns the number of tokens generated, or -1. */
int kiln_generate(kiln_session *s, int seq, const char *prompt, int max_new, const kiln_sampling *smp,
                  kiln_text_fn on_text, void *ctx, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif
#endif
