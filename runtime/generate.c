/* generate.c — the generation loop (runtime/generate.h).
 *
 * Everything it allocates (the sampler, the stop strings, the decoded text,
 * the step arrays) is fallible: out of memory is reported as an error, and a
 * call that fails, however far it got, puts its sequence back to the length
 * it had (krt_session_seq_truncate): its blocks return to the pool. */
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

/* ---- the loop's state --------------------------------------------------------------- */
typedef struct gen {
    krt_session *s;             /* the session */
    const krt_desc *desc;       /* its engine's description */
    const krt_gen_opts *o;      /* the options */
    const krt_gen_callbacks *cb; /* the callbacks (never NULL here) */
    krt_gen_stats *st;          /* counts and times */
    int seq;                    /* the sequence generated in */
    krt_sampler *sampler;       /* draws the next tokens */
    krt_tok_stream *stream;     /* decodes them, or NULL without a tokenizer */
    const char **stops;         /* [n_stops] the caller's stop strings, then the EOS ids' texts (owned) */
    int n_stops;                /* how many */
    int n_user_stops;           /* the caller's among them (the first ones) */
    ks_buf text;                /* the decoded text: the prompt's, then what was generated */
    size_t gen_text;            /* where the generated text starts in text */
    size_t emitted;             /* bytes of text handed to on_text */
    size_t checked;             /* bytes of the generated text searched for stop strings */
    int32_t *seq_ids;           /* [chunk] seq, for the steps */
    int32_t *next;              /* [chunk] the ids drawn */
    krt_sampler **samplers;     /* [chunk] the sampler for the last prompt token, else NULL */
} gen;

/* One step, timed into the stats. */
static int timed_run(gen *g, const krt_step_req *req, ks_diag *d)
{
    double t0 = ks_now_seconds();
    int rc = krt_session_run(g->s, req, d);
    double t = ks_now_seconds() - t0;
    krt_gen_times *tm = &g->st->times[req->n > KRT_PROFILE_DECODE_TOKENS];
    if (rc == 0) {
        if (tm->steps == 0 || t < tm->min) tm->min = t;
        if (tm->steps == 0 || t > tm->max) tm->max = t;
        tm->steps++;
        tm->tokens += req->n;
        tm->total += t;
    }
    return rc;
}

/* The stop strings: the caller's, then (unless ignore_eos) the text of each
 * end-of-sequence id that the tokenizer writes as a special token. 0, or -1
 * after reporting out of memory. */
static int collect_stops(gen *g, const krt_tok *tok, ks_diag *d)
{
    const krt_gen_opts *o = g->o;
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
 * ends generation: *stop gets which), or up to the bytes that may begin
 * one. Returns nonzero when on_text asks to stop. */
static int emit_text(gen *g, int flush, int *stop)
{
    ks_buf *t = &g->text;
    size_t at = 0, end = t->len;
    *stop = -1;
    if (g->n_stops) {
        int which = krt_sampler_stop_find(g->stops, (size_t)g->n_stops, t->data + g->gen_text, t->len - g->gen_text,
                                          g->checked, &at);
        g->checked = t->len - g->gen_text;
        if (which >= 0) {
            *stop = which;
            end = t->len = g->gen_text + at; /* the stop string itself is not output */
        } else if (!flush) {
            end -= krt_sampler_stop_holdback(g->stops, (size_t)g->n_stops, t->data + g->gen_text, t->len - g->gen_text);
        }
    }
    if (end <= g->emitted) return 0;
    int rc = g->cb->on_text ? g->cb->on_text(g->cb->ctx, t->data + g->emitted, end - g->emitted) : 0;
    g->emitted = end;
    return rc;
}

/* The prefill: the prompt in steps the engine takes; the first new token
 * is drawn from its last row into *first (-1 when none is wanted). */
static int prefill(gen *g, const int32_t *prompt, int n, int want, int32_t *first, ks_diag *d)
{
    int chunk = g->desc->plan.max_tokens < n ? (int)g->desc->plan.max_tokens : n;
    int64_t vocab = g->desc->vocab;
    *first = -1;
    for (int at = 0; at < n; at += chunk) {
        int m = n - at < chunk ? n - at : chunk, last = at + m == n;
        g->samplers[m - 1] = last && want ? g->sampler : NULL;
        krt_step_req req = {
            .n = m,
            .tokens = prompt + at,
            .seq_ids = g->seq_ids,
            .logits = g->o->prompt_logits ? g->o->prompt_logits + (size_t)at * (size_t)vocab : NULL,
            .samplers = g->samplers,
            .next = g->next,
        };
        if (timed_run(g, &req, d) != 0) return -1;
        if (last) *first = g->next[m - 1];
        g->samplers[m - 1] = NULL;
    }
    return 0;
}

static void gen_free(gen *g)
{
    krt_sampler_free(g->sampler);
    krt_tok_stream_free(g->stream);
    for (int i = g->n_user_stops; g->stops && i < g->n_stops; i++) free((char *)g->stops[i]);
    free(g->stops);
    ks_buf_free(&g->text);
    free(g->seq_ids);
    free(g->next);
    free(g->samplers);
}

int krt_generate(krt_session *s, int seq, const krt_tok *tok, const int32_t *prompt, int n_prompt,
                 const krt_gen_opts *o, const krt_gen_callbacks *cb, krt_gen_stats *st, ks_diag *d)
{
    static const krt_gen_callbacks no_callbacks;
    krt_gen_stats own;
    gen g = {.s = s, .desc = krt_session_desc(s), .o = o, .cb = cb ? cb : &no_callbacks, .st = st ? st : &own, .seq = seq};
    g.text.fallible = 1;
    memset(g.st, 0, sizeof *g.st);
    g.st->prompt_tokens = n_prompt;
    int have = krt_session_seq_len(s, seq), ctx = krt_session_max_context(s);
    if (have < 0) {
        ks_error(d, "kiln", "sequence %d does not exist", seq);
        return -1;
    }
    if (n_prompt < 1) {
        ks_error(d, "kiln", "a prompt needs at least one token");
        return -1;
    }
    if (n_prompt > ctx - have) {
        ks_error(d, "kiln", "the prompt has %d tokens, more than the %d the context has left", n_prompt, ctx - have);
        return -1;
    }
    /* the last generated token is drawn, never run: a full context takes ctx - have - n_prompt + 1 */
    int room = ctx - have - n_prompt + 1, max_new = o->max_new < room ? o->max_new : room;
    if (max_new < 0) max_new = 0;
    g.sampler = krt_sampler_new(d, &o->sampling, (int32_t)g.desc->vocab);
    if (!g.sampler) return -1;
    for (int i = 0; i < n_prompt; i++) krt_sampler_accept(g.sampler, prompt[i]);
    if (collect_stops(&g, tok, d) != 0) {
        gen_free(&g);
        return -1;
    }
    if (tok) {
        g.stream = krt_tok_stream_new(tok, KRT_TOK_SKIP_SPECIAL);
        for (int i = 0; g.stream && i < n_prompt; i++)
            krt_tok_stream_push(g.stream, prompt[i], &g.text); /* context for decoding */
        if (!g.stream || g.text.failed) {
            ks_error_oom(d, "kiln", g.text.failed, "decoding the prompt's text");
            gen_free(&g);
            return -1;
        }
        g.gen_text = g.text.len;
        g.emitted = o->echo_prompt ? 0 : g.text.len;
    }
    int chunk = g.desc->plan.max_tokens < n_prompt ? (int)g.desc->plan.max_tokens : n_prompt;
    g.seq_ids = ks_try_calloc((size_t)chunk, sizeof *g.seq_ids);
    g.next = ks_try_calloc((size_t)chunk, sizeof *g.next);
    g.samplers = ks_try_calloc((size_t)chunk, sizeof *g.samplers);
    if (!g.seq_ids || !g.next || !g.samplers) {
        ks_error_oom(d, "kiln", (size_t)chunk * (2 * sizeof(int32_t) + sizeof(krt_sampler *)), "the prompt's steps");
        gen_free(&g);
        return -1;
    }
    for (int i = 0; i < chunk; i++) g.seq_ids[i] = seq;

    int stop = -1, rc = 0;
    double t0 = ks_now_seconds(), t_first = t0;
    int32_t token = -1;
    g.st->end = KRT_GEN_MAX_NEW;
    if (prefill(&g, prompt, n_prompt, max_new > 0, &token, d) != 0) {
        krt_session_seq_truncate(s, seq, have); /* the chunks that ran go again */
        gen_free(&g);
        return -1;
    }
    if (o->echo_prompt && emit_text(&g, 0, &stop)) g.st->end = KRT_GEN_CALLBACK;
    int steps = 0;
    while (g.st->end == KRT_GEN_MAX_NEW && g.st->generated < max_new) {
        if (g.st->generated == 0) t_first = ks_now_seconds();
        if (token < 0) {
            ks_error(d, "kiln", "the model's logits are NaN or infinite after %d tokens of sequence %d: no next token",
                     have + n_prompt + steps, seq);
            rc = -1;
            break;
        }
        if (!o->ignore_eos && krt_desc_is_eos(g.desc, token)) {
            g.st->end = KRT_GEN_EOS;
            break;
        }
        g.st->generated++;
        if (g.cb->on_token && g.cb->on_token(g.cb->ctx, token)) g.st->end = KRT_GEN_CALLBACK;
        if (g.stream) {
            krt_tok_stream_push(g.stream, token, &g.text);
            if (g.text.failed) {
                rc = ks_error_oom(d, "kiln", g.text.failed, "the generated text");
                break;
            }
            if (emit_text(&g, 0, &stop)) g.st->end = KRT_GEN_CALLBACK;
            if (stop >= 0) g.st->end = stop < g.n_user_stops ? KRT_GEN_STOP : KRT_GEN_EOS;
        }
        if (g.st->end != KRT_GEN_MAX_NEW || g.st->generated == max_new) break;
        int32_t in = token;
        krt_sampler *smp = g.sampler;
        krt_step_req step = {.n = 1, .tokens = &in, .seq_ids = &g.seq_ids[0], .samplers = &smp, .next = &token};
        if (timed_run(&g, &step, d) != 0) {
            rc = -1;
            break;
        }
        steps++;
    }
    if (rc == 0 && g.st->end == KRT_GEN_MAX_NEW && max_new < o->max_new && g.st->generated == max_new)
        g.st->end = KRT_GEN_CONTEXT;
    if (rc == 0 && g.stream && stop < 0 && g.st->end != KRT_GEN_CALLBACK) {
        krt_tok_stream_flush(g.stream, &g.text);
        if (g.text.failed)
            rc = ks_error_oom(d, "kiln", g.text.failed, "the generated text");
        else
            emit_text(&g, 1, &stop);
    }
    if (rc != 0) krt_session_seq_truncate(s, seq, have); /* as it was before the call */
    double t_end = ks_now_seconds();
    g.st->first_token_s = (g.st->generated ? t_first : t_end) - t0;
    g.st->decode_s = g.st->generated ? t_end - t_first : 0;
    gen_free(&g);
    return rc == 0 ? g.st->generated : -1;
}
