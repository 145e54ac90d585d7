/*
 * sampler.h — choosing the next token from a row of logits, and finding
 * stop strings in generated text (which ids end a sequence is the engine's
 * to say: runtime/desc.h).
 *
 * The order is Hugging Face generate()'s: repetition penalty over every id
 * seen so far (a logit > 0 is divided by the penalty, one < 0 multiplied),
 * then temperature, top-k, top-p, and a draw from what is left. Temperature
 * 0 is greedy: the arg max (the lowest id among equals), no draw.
 *
 * Randomness comes from the sampler's own generator (xorshift64*, seeded
 * through splitmix64), so one seed gives one sequence of tokens on every
 * platform, whatever else the process does.
 *
 *     krt_sampler_config cfg = krt_sampler_defaults();
 *     cfg.temperature = 0.8f; cfg.top_p = 0.95f; cfg.seed = 42;
 *     krt_sampler *s = krt_sampler_new(&d, &cfg, vocab_size);
 *     for each prompt id: krt_sampler_accept(s, id);      // for the repetition penalty
 *     int32_t next = krt_sampler_sample(s, logits);         // also accepts `next`
 *     ...
 *     krt_sampler_free(s);
 *
 * Stop strings: generated text is checked as it grows; the helpers say where
 * a stop string appears and how many trailing bytes to hold back because
 * they may be the start of one.
 *
 * Prefix: krt_sampler_ (runtime, sampling).
 */
#ifndef KILN_SAMPLER_H
#define KILN_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "support/support.h"

typedef struct krt_sampler_config {
    float temperature;        /* logits are divided by it; 0: greedy */
    int32_t top_k;            /* keep the k most likely ids (lowest id among equals); 0: all */
    float top_p;              /* keep the most likely ids while the probability before
                                 each is below top_p; 1: all */
    float repetition_penalty; /* > 1 makes seen ids less likely; 1: off */
    uint64_t seed;            /* the generator's seed */
} krt_sampler_config;

/* temperature 1, top_k 0, top_p 1, repetition_penalty 1, seed 0. */
krt_sampler_config krt_sampler_defaults(void);

typedef struct krt_sampler krt_sampler;

/* NULL after reporting a bad setting (`sampler: error: top_p must be in
 * [0, 1] (got 1.5)`) or a vocabulary size <= 0. */
krt_sampler *krt_sampler_new(ks_diag *d, const krt_sampler_config *cfg, int32_t vocab_size);
void krt_sampler_free(krt_sampler *s);
/* Forget the seen ids and restart the generator from seed. */
void krt_sampler_reset(krt_sampler *s, uint64_t seed);
/* Mark id as seen (prompt ids; sample() marks what it returns). */
void krt_sampler_accept(krt_sampler *s, int32_t id);
/* The next id from logits[vocab_size] (not modified). Returns -1 only when
 * every logit is NaN or -inf. */
int32_t krt_sampler_sample(krt_sampler *s, const float *logits);
/* The ids that would stay in the draw for these logits and how likely each
 * is (after penalty, temperature, top-k and top-p, renormalised), most
 * likely first; for tests and tools. Returns how many; ids/probs need
 * vocab_size entries. Greedy gives the one arg max with probability 1. */
size_t krt_sampler_candidates(krt_sampler *s, const float *logits, int32_t *ids, double *probs);
/* A uniform double in [0, 1) from the sampler's generator. */
double krt_sampler_uniform(krt_sampler *s);
/* The settings, and the generator's state, for a device that draws with
 * the same rules and generator (runtime/backend.h's krt_draw): it takes the
 * state, draws, and hands the state back with set_rng. */
const krt_sampler_config *krt_sampler_config_of(const krt_sampler *s);
uint64_t krt_sampler_rng(const krt_sampler *s);
void krt_sampler_set_rng(krt_sampler *s, uint64_t state);

/* ---- stop strings ------------------------------------------------------------
 * stops[0..n_stops) are NUL-terminated; empty ones are ignored. */

/* The stop string that text[0..len) ends with (the longest if several),
 * or -1. */
int krt_sampler_ends_with_stop(const char *const *stops, size_t n_stops, const char *text,
                               size_t len);
/* The first stop string occurrence in text[0..len) that ends after byte
 * `from` (the text before `from` was checked already): returns which stop
 * string and sets *at to where it starts (the text to keep is text[0..*at)),
 * or -1. */
int krt_sampler_stop_find(const char *const *stops, size_t n_stops, const char *text, size_t len,
                          size_t from, size_t *at);
/* How many bytes at the end of text[0..len) are a proper prefix of some
 * stop string: a streaming caller holds them back until it knows. */
size_t krt_sampler_stop_holdback(const char *const *stops, size_t n_stops, const char *text,
                                 size_t len);

#endif
