/* generate.c — one generation's state (krt_gen) and the loop that runs one alone (krt_generate;
 * runtime/generate.h).
 *
 * Everything it allocates (the sampler, the stop strings, the decoded text,
 * the step arrays) is fallible: out of memory is reported as an error, and a
 * krt_generate that fails, however far it got, puts its sequence back to the
 * length it had (krt_session_seq_truncate): its blocks return to the pool. */
#include "runtime/generate.h"

#include <stdlib.h>
#include <string.h>

krt_gen_opts krt_gen_defaults(void)
{
    krt_gen_opts o = {.max_new = 128, .sampling = krt_sampler_defaults()};
    o.sampling.temperature = 0;
    return o;
}

krt_tok *krt_engine_tokenizer(const krt_engine *e, ks_diag *d)
{
    if (!e->tokenizer) {
        ks_error(d, e->path, "the engine holds no tokenizer; rebuild it with --tokenizer FILE, or give token ids");
        return NULL;
    }
    krt_tok *t = krt_tok_load_memory(d, e->path, e->tokenizer, e->tokenizer_len, (krt_tok_kind)e->tokenizer_kind);
    if (t) krt_tok_set_bos_eos(t, e->desc.bos, e->desc.n_eos ? e->desc.eos[0] : -1);
    return t;
}

int krt_gen_prompt(const krt_tok *tok, const krt_desc *desc, const char *text, krt_tok_ids *ids, ks_diag *d)
{
    size_t before = ids->len;
    if (krt_tok_encode(tok, text, strlen(text), KRT_TOK_ADD_SPECIAL, ids, d) != 0) return -1;
    if (ids->len > before) return 0;
    if (desc->bos < 0) {
        ks_error(d, "kiln", "the prompt is empty and the model has no BOS token to start from");
        return -1;
    }
    if (KS_TRY_GROW(ids->ids, ids->len + 1, ids->cap, (size_t)1 << 30) != 0)
        return ks_error_oom(d, "kiln", (ids->len + 1) * sizeof *ids->ids, "the prompt's token ids");
    ids->ids[ids->len++] = desc->bos;
    return 0;
}

/* ---- one generation's state ------------------------------------------------------------- */
struct krt_gen {
    krt_session *s;             /* the session */
    const krt_desc *desc;       /* its engine's description */
    krt_gen_opts o;             /* the options (the caller's stop strings not copied: they outlive the gen) */
    krt_gen_callbacks cb;       /* the callbacks */
    krt_gen_stats st;           /* counts and times */
    int seq;                    /* the sequence generated in */
    int have;                   /* its length before the prompt */
    int max_new;                /* o.max_new, or less where the context ends first */
    int done;                   /* 1: ended (st.end says why) */
    int stop;                   /* the stop string found, or -1 */
    int steps;                  /* tokens taken that were run after the first */
    double t0, t_first;         /* when it began; when the first token was taken */
    krt_sampler *sampler;       /* draws the next tokens */
    krt_tok_stream *stream;     /* decodes them, or NULL without a tokenizer */
    const char **stops;         /* [n_stops] the caller's stop strings, then the EOS ids' texts (owned) */
    int n_stops;                /* how many */
    int n_user_stops;           /* the caller's among them (the first ones) */
    ks_buf text;                /* the decoded text: the prompt's, then what was generated */
    size_t gen_text;            /* where the generated text starts in text */
    size_t emitted;             /* bytes of text handed to on_text */
    size_t checked;             /* bytes of the generated text searched for stop strings */
    int echoed;                 /* 1: the prompt's text went to on_text (o.echo_prompt) */
};

/* The stop strings: the caller's, then (unless ignore_eos) the text of each
 * end-of-sequence id that the tokenizer writes as a special token. 0, or -1
 * after reporting out of memory. */
static int collect_stops(krt_gen *g, const krt_tok *tok, ks_diag *d)
{
    const krt_gen_opts *o = &g->o;
    int n_eos = o->ignore_eos || !tok ? 0 : g->desc->n_eos;
    g->stops = ks_try_calloc((size_t)(o->n_stops + n_eos + 1), sizeof *g->stops);
    if (!g->stops) return ks_error_oom(d, "kiln", (size_t)(o->n_stops + n_eos + 1) * sizeof *g->stops, "stop strings");
    for (int i = 0; i < o->n_stops; i++)
        if (o->stops[i] && o->stops[i][0]) g->stops[g->n_stops++] = o->stops[i];
    g->n_user_stops = g->n_stops;
    ks_buf text = KS_BUF_TRY;
    int rc = 0;
    for (int i = 0; i < n_eos && rc == 0; i++) {
        int32_t id = g->desc->eos[i];
        if (!krt_tok_is_special(tok, id)) continue;
        /* its text as decoding writes it ("▁<|end_story|>" decodes to " <|end_story|>"), trimmed */
        ks_buf_clear(&text);
        krt_tok_decode(tok, &id, 1, 0, &text);
        if (text.failed) {
            rc = ks_error_oom(d, "kiln", text.failed, "the text of an end-of-sequence token");
            break;
        }
        const char *a = ks_buf_cstr(&text), *b = a + text.len;
        while (a < b && (*a == ' ' || *a == '\n')) a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\n')) b--;
        if (a == b || memchr(a, 0, (size_t)(b - a))) continue;
        char *stop = ks_try_malloc((size_t)(b - a) + 1);
        if (!stop) {
            rc = ks_error_oom(d, "kiln", (size_t)(b - a) + 1, "the text of an end-of-sequence token");
            break;
        }
        memcpy(stop, a, (size_t)(b - a));
        stop[b - a] = 0;
        g->stops[g->n_stops++] = stop;
    }
    ks_buf_free(&text);
    return rc;
}

/* Hand on_text what is certain: the text up to a stop string found (which
 * ends generation: g->stop gets which), or up to the bytes that may begin
 * one. Returns nonzero when on_text asks to stop. */
static int emit_text(krt_gen *g, int flush)
{
    ks_buf *t = &g->text;
    size_t at = 0, end = t->len;
    if (g->n_stops) {
        int which = krt_sampler_stop_find(g->stops, (size_t)g->n_stops, t->data + g->gen_text, t->len - g->gen_text,
                                          g->checked, &at);
        g->checked = t->len - g->gen_text;
        if (which >= 0) {
            g->stop = which;
            end = t->len = g->gen_text + at; /* the stop string itself is not output */
        } else if (!flush) {
            end -= krt_sampler_stop_holdback(g->stops, (size_t)g->n_stops, t->data + g->gen_text, t->len - g->gen_text);
        }
    }
    if (end <= g->emitted) return 0;
    int rc = g->cb.on_text ? g->cb.on_text(g->cb.ctx, t->data + g->emitted, end - g->emitted) : 0;
    g->emitted = end;
    return rc;
}

void krt_gen_free(krt_gen *g)
{
    if (!g) return;
    krt_sampler_free(g->sampler);
    krt_tok_stream_free(g->stream);
    for (int i = g->n_user_stops; g->stops && i < g->n_stops; i++) free((char *)g->stops[i]);
    free(g->stops);
    ks_buf_free(&g->text);
    free(g);
}

krt_gen *krt_gen_new(krt_session *s, int seq, const krt_tok *tok, const int32_t *prompt, int n_prompt,
                     const krt_gen_opts *o, const krt_gen_callbacks *cb, ks_diag *d)
{
    int have = krt_session_seq_len(s, seq), ctx = krt_session_max_context(s);
    if (have < 0) {
        ks_error(d, "kiln", "sequence %d does not exist", seq);
        return NULL;
    }
    if (n_prompt < 1) {
        ks_error(d, "kiln", "a prompt needs at least one token");
        return NULL;
    }
    if (n_prompt > ctx - have) {
        ks_error(d, "kiln", "the prompt has %d tokens, more than the %d the context has left", n_prompt, ctx - have);
        return NULL;
    }
    krt_gen *g = ks_try_calloc(1, sizeof *g);
    if (!g) return ks_error_oom(d, "kiln", sizeof *g, "a generation"), NULL;
    *g = (krt_gen){.s = s, .desc = krt_session_desc(s), .o = *o, .seq = seq, .have = have, .stop = -1};
    if (cb) g->cb = *cb;
    g->text.fallible = 1;
    g->st.prompt_tokens = n_prompt;
    g->st.end = KRT_GEN_MAX_NEW;
    /* the last generated token is drawn, never run: a full context takes ctx - have - n_prompt + 1 */
    int room = ctx - have - n_prompt + 1;
    g->max_new = o->max_new < room ? o->max_new : room;
    if (g->max_new < 0) g->max_new = 0;
    g->done = g->max_new == 0;
    g->sampler = krt_sampler_new(d, &o->sampling, (int32_t)g->desc->vocab);
    if (!g->sampler) {
        krt_gen_free(g);
        return NULL;
    }
    for (int i = 0; i < n_prompt; i++) krt_sampler_accept(g->sampler, prompt[i]);
    if (collect_stops(g, tok, d) != 0) {
        krt_gen_free(g);
        return NULL;
    }
    if (tok) {
        g->stream = krt_tok_stream_new(tok, KRT_TOK_SKIP_SPECIAL);
        for (int i = 0; g->stream && i < n_prompt; i++)
            krt_tok_stream_push(g->stream, prompt[i], &g->text); /* context for decoding */
        if (!g->stream || g->text.failed) {
            ks_error_oom(d, "kiln", g->text.failed, "decoding the prompt's text");
            krt_gen_free(g);
            return NULL;
        }
        g->gen_text = g->text.len;
        g->emitted = o->echo_prompt ? 0 : g->text.len;
    }
    g->t0 = g->t_first = ks_now_seconds();
    return g;
}

krt_sampler *krt_gen_sampler(krt_gen *g) { return g->done ? NULL : g->sampler; }
int krt_gen_have(const krt_gen *g) { return g->have; }
int krt_gen_done(const krt_gen *g) { return g->done; }
krt_gen_stats *krt_gen_stats_of(krt_gen *g) { return &g->st; }

/* The prompt's text, once, when echoed (before the first token's) */
static void echo(krt_gen *g)
{
    if (g->echoed || !g->o.echo_prompt) return;
    g->echoed = 1;
    if (emit_text(g, 0)) g->done = 1, g->st.end = KRT_GEN_CALLBACK;
}

int krt_gen_take(krt_gen *g, int32_t token, ks_diag *d)
{
    echo(g);
    if (g->done) return 1;
    if (g->st.generated == 0) g->t_first = ks_now_seconds();
    if (token < 0) {
        ks_error(d, "kiln", "the model's logits are NaN or infinite after %d tokens of sequence %d: no next token",
                 g->have + g->st.prompt_tokens + g->steps, g->seq);
        return -1;
    }
    if (!g->o.ignore_eos && krt_desc_is_eos(g->desc, token)) {
        g->st.end = KRT_GEN_EOS;
        return g->done = 1;
    }
    g->st.generated++;
    if (g->cb.on_token && g->cb.on_token(g->cb.ctx, token)) g->st.end = KRT_GEN_CALLBACK;
    if (g->stream) {
        krt_tok_stream_push(g->stream, token, &g->text);
        if (g->text.failed) return ks_error_oom(d, "kiln", g->text.failed, "the generated text");
        if (emit_text(g, 0)) g->st.end = KRT_GEN_CALLBACK;
        if (g->stop >= 0) g->st.end = g->stop < g->n_user_stops ? KRT_GEN_STOP : KRT_GEN_EOS;
    }
    if (g->st.end != KRT_GEN_MAX_NEW || g->st.generated == g->max_new) return g->done = 1;
    g->steps++;
    return 0;
}

int krt_gen_finish(krt_gen *g, ks_diag *d)
{
    echo(g);
    g->done = 1;
    int rc = 0;
    if (g->st.end == KRT_GEN_MAX_NEW && g->max_new < g->o.max_new && g->st.generated == g->max_new)
        g->st.end = KRT_GEN_CONTEXT;
    if (g->stream && g->stop < 0 && g->st.end != KRT_GEN_CALLBACK) {
        krt_tok_stream_flush(g->stream, &g->text);
        if (g->text.failed)
            rc = ks_error_oom(d, "kiln", g->text.failed, "the generated text");
        else
            emit_text(g, 1);
    }
    double t_end = ks_now_seconds();
    g->st.first_token_s = (g->st.generated ? g->t_first : t_end) - g->t0;
    g->st.decode_s = g->st.generated ? t_end - g->t_first : 0;
    return rc;
}

/* ---- krt_generate: one generation, its steps one after the other --------------------------- */
/* One step, timed into the stats. */
static int timed_run(krt_session *s, krt_gen_stats *st, const krt_step_req *req, ks_diag *d)
{
    double t0 = ks_now_seconds();
    int rc = krt_session_run(s, req, d);
    double t = ks_now_seconds() - t0;
    krt_gen_times *tm = &st->times[req->n > KRT_PROFILE_DECODE_TOKENS];
    if (rc == 0) {
        if (tm->steps == 0 || t < tm->min) tm->min = t;
        if (tm->steps == 0 || t > tm->max) tm->max = t;
        tm->steps++;
        tm->tokens += req->n;
        tm->total += t;
    }
    return rc;
}

int krt_generate(krt_session *s, int seq, const krt_tok *tok, const int32_t *prompt, int n_prompt,
                 const krt_gen_opts *o, const krt_gen_callbacks *cb, krt_gen_stats *st, ks_diag *d)
{
    if (st) memset(st, 0, sizeof *st);
    krt_gen *g = krt_gen_new(s, seq, tok, prompt, n_prompt, o, cb, d);
    if (!g) return -1;
    krt_gen_stats *gs = krt_gen_stats_of(g);
    const krt_desc *desc = krt_session_desc(s);
    const int64_t vocab = desc->vocab;
    /* the prefill: the prompt in steps the engine takes; the first new token drawn from its last row */
    const int chunk = desc->plan.max_tokens < n_prompt ? (int)desc->plan.max_tokens : n_prompt;
    int32_t *seq_ids = ks_try_calloc((size_t)chunk, sizeof *seq_ids), *next = ks_try_calloc((size_t)chunk, sizeof *next);
    krt_sampler **samplers = ks_try_calloc((size_t)chunk, sizeof *samplers);
    int rc = 0;
    if (!seq_ids || !next || !samplers)
        rc = ks_error_oom(d, "kiln", (size_t)chunk * (2 * sizeof(int32_t) + sizeof(krt_sampler *)), "the prompt's steps");
    for (int i = 0; rc == 0 && i < chunk; i++) seq_ids[i] = seq;
    int32_t token = -1;
    for (int at = 0; rc == 0 && at < n_prompt; at += chunk) {
        int m = n_prompt - at < chunk ? n_prompt - at : chunk, last = at + m == n_prompt;
        samplers[m - 1] = last ? krt_gen_sampler(g) : NULL;
        krt_step_req req = {
            .n = m,
            .tokens = prompt + at,
            .seq_ids = seq_ids,
            .logits = o->prompt_logits ? o->prompt_logits + (size_t)at * (size_t)vocab : NULL,
            .samplers = samplers,
            .next = next,
        };
        rc = timed_run(s, gs, &req, d);
        if (last) token = next[m - 1];
        samplers[m - 1] = NULL;
    }
    /* decode: each token taken, then run for the next */
    while (rc == 0) {
        int r = krt_gen_take(g, token, d);
        if (r != 0) {
            rc = r < 0 ? -1 : 0;
            break;
        }
        int32_t in = token;
        krt_sampler *smp = krt_gen_sampler(g);
        krt_step_req step = {.n = 1, .tokens = &in, .seq_ids = &seq_ids[0], .samplers = &smp, .next = &token};
        rc = timed_run(s, gs, &step, d);
    }
    if (rc == 0) rc = krt_gen_finish(g, d);
    if (rc != 0) krt_session_seq_truncate(s, seq, krt_gen_have(g)); /* as it was before the call */
    const int generated = gs->generated;
    if (st) *st = *gs;
    free(seq_ids);
    free(next);
    free(samplers);
    krt_gen_free(g);
    return rc == 0 ? generated : -1;
}
