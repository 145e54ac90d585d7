/*
 * generate.h — the one generation loop: a prompt's ids in, a sequence's
 * continuation out, token by token. `kiln run`, runtime/kiln.h's
 * kiln_generate and the server all generate through it.
 *
 *     krt_tok *tok = krt_engine_tokenizer(engine, &d);          // BOS/EOS as the engine says
 *     krt_tok_ids ids = {0};
 *     krt_gen_prompt(tok, &engine->desc, "Once upon a time", &ids, &d);   // empty: [BOS]
 *     krt_gen_opts o = krt_gen_defaults();
 *     o.max_new = 64; o.sampling.temperature = 0.8f; o.stops = stops; o.n_stops = 1;
 *     krt_gen_callbacks cb = {.on_text = print, .ctx = NULL};
 *     krt_gen_stats st;
 *     krt_generate(session, 0, tok, ids.ids, (int)ids.len, &o, &cb, &st, &d);
 *
 * What it does, in order:
 *  - prefill: the prompt runs in steps of at most the engine's largest step
 *    (desc.plan.max_tokens: the memory plan's token count), so a prompt of
 *    any length up to the context runs; the prompt's logits go to
 *    o.prompt_logits when given;
 *  - decode: the next token is drawn from the last row's logits where they
 *    are (on a GPU only its id comes back: runtime/session.h), then run,
 *    until one of: max_new tokens; an end-of-sequence id of the engine
 *    (desc.eos, all of them), or the text of one (a model that spells
 *    "<|end_story|>" piece by piece ends as if it had drawn the token),
 *    unless o.ignore_eos; a stop string (o.stops; the text before it is
 *    the output); the context's end — its last position is usable: a model
 *    with a 128-position context generates 128 tokens after BOS; a callback
 *    asking to stop.
 *  - text: whole UTF-8 characters as they complete, special tokens left
 *    out, bytes that may begin a stop string held back until known.
 *  - logits that are NaN or infinite are an error, reported with the step,
 *    not a silent stop.
 *
 * Prefix: krt_gen_ (and krt_generate).
 */
#ifndef KILN_RUNTIME_GENERATE_H
#define KILN_RUNTIME_GENERATE_H

#include <stdint.h>

#include "runtime/session.h"
#include "runtime/text/sampler.h"
#include "runtime/text/tokenizer.h"

typedef struct krt_gen_opts {
    int max_new;                  /* tokens to generate at most (the context's end may stop it earlier) */
    krt_sampler_config sampling;  /* how next tokens are drawn */
    const char *const *stops;     /* [n_stops] stop strings (NUL-terminated), or NULL */
    int n_stops;                  /* how many */
    int ignore_eos;               /* 1: go on past end-of-sequence ids and their text */
    int echo_prompt;              /* 1: on_text gets the prompt's text first */
    float *prompt_logits;         /* [n_prompt, vocab] out: the prompt's logits, or NULL */
} krt_gen_opts;

/* max_new 128, greedy sampling (krt_sampler_defaults with temperature 0),
 * no stop strings, stop at EOS, no echo, no prompt logits. */
krt_gen_opts krt_gen_defaults(void);

typedef struct krt_gen_callbacks {
    /* Text as it completes (see the top); return nonzero to stop. */
    int (*on_text)(void *ctx, const char *text, size_t len);
    /* Each generated id, before its text; return nonzero to stop (the id
     * counts as generated). */
    int (*on_token)(void *ctx, int32_t id);
    void *ctx;                    /* passed to both */
} krt_gen_callbacks;

/* Why generation ended. */
typedef enum krt_gen_end {
    KRT_GEN_MAX_NEW,     /* max_new tokens */
    KRT_GEN_EOS,         /* an end-of-sequence id, or its text */
    KRT_GEN_STOP,        /* a stop string */
    KRT_GEN_CONTEXT,     /* the context is full */
    KRT_GEN_CALLBACK,    /* a callback asked to stop */
} krt_gen_end;

/* Host times of one kind of step: prefill (more than
 * KRT_PROFILE_DECODE_TOKENS tokens) or decode. */
typedef struct krt_gen_times {
    long steps;   /* steps run */
    long tokens;  /* their tokens */
    double total; /* seconds */
    double min;   /* the shortest step, seconds */
    double max;   /* the longest */
} krt_gen_times;

typedef struct krt_gen_stats {
    int prompt_tokens;        /* ids of the prompt */
    int generated;            /* tokens generated (an EOS id is not counted; the tokens whose text a stop
                                 string or an EOS text cut are) */
    krt_gen_end end;          /* why it ended */
    double first_token_s;     /* seconds from the start to the first generated token (the prefill) */
    double decode_s;          /* seconds from the first generated token to the end */
    krt_gen_times times[2];   /* [0] decode steps, [1] prefill steps */
} krt_gen_stats;

/* The engine's tokenizer with the engine's BOS/EOS, or NULL after
 * reporting that the engine holds none (a hint says how to pack one). */
krt_tok *krt_engine_tokenizer(const krt_engine *e, ks_diag *d);

/* The ids of a text prompt, with BOS and the other special tokens as the
 * model's tokenizer adds them; an empty prompt is [BOS] (an error when the
 * model has no BOS). Appends to ids. 0, or -1 after reporting. */
int krt_gen_prompt(const krt_tok *tok, const krt_desc *desc, const char *text, krt_tok_ids *ids, ks_diag *d);

/* One generation as a state machine, for a loop that runs many in one step
 * (runtime/sched.h) as krt_generate runs one: it owns the sampler, the
 * end-of-sequence and stop-string checks, the counts and the text; the loop
 * owns the steps.
 *
 *     krt_gen *g = krt_gen_new(s, seq, tok, prompt, n, &o, &cb, &d);
 *     // run the prompt (its last token with krt_gen_sampler(g)), then:
 *     while (krt_gen_take(g, next, &d) == 0)   // next: the id drawn
 *         // run `next` in seq with krt_gen_sampler(g) for the one after it
 *     krt_gen_finish(g, &d);                   // the rest of the text
 *     krt_gen_free(g);
 *
 * krt_gen_new checks what krt_generate checks (the sequence exists, a
 * prompt of at least one token that fits the context left) and reports;
 * NULL then. */
typedef struct krt_gen krt_gen;
krt_gen *krt_gen_new(krt_session *s, int seq, const krt_tok *tok, const int32_t *prompt, int n_prompt,
                     const krt_gen_opts *o, const krt_gen_callbacks *cb, ks_diag *d);
/* Draws g's next token; NULL once it has ended (or wants none: max_new 0). */
krt_sampler *krt_gen_sampler(krt_gen *g);
/* Take the token drawn after the prompt or after the last one (-1: none could be drawn, the logits were
 * not finite: an error): end of sequence, the callbacks, text and stop strings. 1 when generation has
 * ended (krt_gen_stats_of(g)->end says why; the token is not to be run), 0 when the token is to be run
 * next, -1 after reporting. */
int krt_gen_take(krt_gen *g, int32_t token, ks_diag *d);
int krt_gen_done(const krt_gen *g);
/* Ends it (if it had not): the held-back text flushed to on_text, the end and the times settled. 0, or -1
 * after reporting out of memory. */
int krt_gen_finish(krt_gen *g, ks_diag *d);
krt_gen_stats *krt_gen_stats_of(krt_gen *g);
int krt_gen_have(const krt_gen *g); /* the sequence's length before the prompt */
void krt_gen_free(krt_gen *g);

/* Generate in sequence seq of s (it must exist; generation continues after
 * what it holds) from the n_prompt ids of prompt (at least one). tok may be
 * NULL when no text is wanted (no on_text, no stop strings, no EOS text).
 * st (may be NULL) receives the counts and times. Returns the number of
 * tokens generated, or -1 after reporting (a prompt longer than the
 * context, a step that failed, logits that are not finite, out of memory),
 * the sequence then as it was before the call. */
int krt_generate(krt_session *s, int seq, const krt_tok *tok, const int32_t *prompt, int n_prompt,
                 const krt_gen_opts *o, const krt_gen_callbacks *cb, krt_gen_stats *st, ks_diag *d);

#endif
