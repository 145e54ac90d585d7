/* kiln_api.c — the public C API (runtime/kiln.h) over the engine, session,
 * tokenizer and sampler modules. */
#include "runtime/kiln.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/text/sampler.h"
#include "runtime/session.h"
#include "runtime/text/tokenizer.h"

struct kiln_engine {
    krt_engine *engine; /* the mapped, checked engine */
    krt_tok *tok;       /* its tokenizer, or NULL */
};

struct kiln_session {
    kiln_engine *e;     /* not owned */
    krt_session *s;     /* owned */
};

/* Collect a call's messages, then copy them into the caller's buffer. */
typedef struct api_diag {
    ks_diag d;   /* quiet; logs into buf */
    ks_buf buf;  /* the messages */
} api_diag;

static void api_diag_init(api_diag *a)
{
    memset(a, 0, sizeof *a);
    a->d.quiet = 1;
    a->d.log = &a->buf;
}

static int api_diag_done(api_diag *a, char *err, size_t err_len)
{
    int bad = a->d.errors > 0;
    if (err && err_len) {
        size_t n = a->buf.len < err_len - 1 ? a->buf.len : err_len - 1;
        if (n) memcpy(err, a->buf.data, n);
        err[n] = 0;
    }
    ks_buf_free(&a->buf);
    return bad ? -1 : 0;
}

kiln_engine *kiln_engine_open(const char *path, char *err, size_t err_len)
{
    api_diag a;
    api_diag_init(&a);
    kiln_engine *e = ks_xcalloc(1, sizeof *e);
    e->engine = krt_engine_open(path, &a.d);
    if (e->engine && e->engine->tokenizer) {
        e->tok = krt_tok_load_memory(&a.d, path, e->engine->tokenizer, e->engine->tokenizer_len,
                                     (krt_tok_kind)e->engine->tokenizer_kind);
        if (e->tok)
            krt_tok_set_bos_eos(e->tok, (int32_t)krt_engine_param_int(e->engine, "bos_token_id", -1),
                                (int32_t)krt_engine_param_int(e->engine, "eos_token_id", -1));
    }
    if (api_diag_done(&a, err, err_len) != 0) {
        kiln_engine_close(e);
        return NULL;
    }
    return e;
}

void kiln_engine_close(kiln_engine *e)
{
    if (!e) return;
    krt_tok_free(e->tok);
    krt_engine_close(e->engine);
    free(e);
}

kiln_session *kiln_session_new(kiln_engine *e, const kiln_session_opts *o, char *err, size_t err_len)
{
    api_diag a;
    api_diag_init(&a);
    krt_session_opts so = {0};
    if (o)
        so = (krt_session_opts){
            .max_seqs = o->max_seqs, .max_context = o->max_context, .block_size = o->block_size, .n_blocks = o->n_blocks};
    krt_session *s = krt_session_new(e->engine, &so, &a.d);
    if (api_diag_done(&a, err, err_len) != 0) {
        krt_session_free(s);
        return NULL;
    }
    kiln_session *k = ks_xcalloc(1, sizeof *k);
    k->e = e;
    k->s = s;
    return k;
}

void kiln_session_free(kiln_session *s)
{
    if (!s) return;
    krt_session_free(s->s);
    free(s);
}

int64_t kiln_vocab_size(const kiln_session *s) { return krt_session_vocab(s->s); }
int kiln_max_context(const kiln_session *s) { return krt_session_max_context(s->s); }

int kiln_seq_add(kiln_session *s, int seq, char *err, size_t err_len)
{
    api_diag a;
    api_diag_init(&a);
    krt_session_seq_add(s->s, seq, &a.d);
    return api_diag_done(&a, err, err_len);
}

int kiln_seq_fork(kiln_session *s, int src, int dst, char *err, size_t err_len)
{
    api_diag a;
    api_diag_init(&a);
    krt_session_seq_fork(s->s, src, dst, &a.d);
    return api_diag_done(&a, err, err_len);
}

void kiln_seq_free(kiln_session *s, int seq) { krt_session_seq_free(s->s, seq); }
int kiln_seq_len(const kiln_session *s, int seq) { return krt_session_seq_len(s->s, seq); }

int kiln_step(kiln_session *s, int n, const int32_t *ids, const int32_t *seqs, float *logits, char *err,
              size_t err_len)
{
    api_diag a;
    api_diag_init(&a);
    krt_session_step(s->s, n, ids, seqs, logits, &a.d);
    return api_diag_done(&a, err, err_len);
}

kiln_sampling kiln_sampling_greedy(void)
{
    kiln_sampling k = {.temperature = 0, .top_k = 0, .top_p = 1, .repetition_penalty = 1, .seed = 0};
    return k;
}

int kiln_generate(kiln_session *s, int seq, const char *prompt, int max_new, const kiln_sampling *smp,
                  kiln_text_fn on_text, void *ctx, char *err, size_t err_len)
{
    api_diag a;
    api_diag_init(&a);
    krt_tok *tok = s->e->tok;
    krt_tok_ids ids = {0};
    krt_sampler *sampler = NULL;
    krt_tok_stream *stream = NULL;
    float *logits = NULL;
    int32_t *seqs = NULL;
    int generated = 0;
    if (!tok) {
        ks_error(&a.d, s->e->engine->path, "the engine holds no tokenizer");
        goto done;
    }
    if (krt_tok_encode(tok, prompt, strlen(prompt), KRT_TOK_ADD_SPECIAL, &ids, &a.d) != 0) goto done;
    if (ids.len == 0) {
        if (krt_tok_bos(tok) < 0) {
            ks_error(&a.d, "kiln", "the prompt is empty and the model has no BOS token to start from");
            goto done;
        }
        KS_GROW(ids.ids, 1, ids.cap, 1, "token ids");
        ids.ids[ids.len++] = krt_tok_bos(tok);
    }
    if (krt_session_seq_len(s->s, seq) < 0 && krt_session_seq_add(s->s, seq, &a.d) != 0) goto done;
    int ctx_left = krt_session_max_context(s->s) - krt_session_seq_len(s->s, seq);
    if ((int)ids.len > ctx_left) {
        ks_error(&a.d, "kiln", "the prompt has %zu tokens, more than the %d the context has left", ids.len, ctx_left);
        goto done;
    }
    if (max_new > ctx_left - (int)ids.len) max_new = ctx_left - (int)ids.len;
    int64_t vocab = krt_session_vocab(s->s);
    kiln_sampling k = smp ? *smp : kiln_sampling_greedy();
    int32_t eos = (int32_t)krt_engine_param_int(s->e->engine, "eos_token_id", -1);
    krt_sampler_config cfg = krt_sampler_defaults();
    cfg.temperature = k.temperature;
    cfg.top_k = k.top_k;
    cfg.top_p = k.top_p;
    cfg.repetition_penalty = k.repetition_penalty;
    cfg.seed = k.seed;
    if (eos >= 0) cfg.stop_ids = &eos, cfg.n_stop_ids = 1;
    sampler = krt_sampler_new(&a.d, &cfg, (int32_t)vocab);
    if (!sampler) goto done;
    for (size_t i = 0; i < ids.len; i++) krt_sampler_accept(sampler, ids.ids[i]);
    logits = ks_xmalloc(sizeof(float) * (size_t)vocab * ids.len);
    seqs = ks_xmalloc(sizeof *seqs * ids.len);
    for (size_t i = 0; i < ids.len; i++) seqs[i] = seq;
    if (krt_session_step(s->s, (int)ids.len, ids.ids, seqs, logits, &a.d) != 0) goto done;
    stream = krt_tok_stream_new(tok, KRT_TOK_SKIP_SPECIAL);
    const float *last = logits + (ids.len - 1) * (size_t)vocab;
    ks_buf piece = {0};
    for (size_t i = 0; i < ids.len; i++) krt_tok_stream_push(stream, ids.ids[i], &piece); /* context for decoding */
    while (generated < max_new) {
        int32_t next = krt_sampler_sample(sampler, last);
        if (next < 0 || krt_sampler_is_stop_id(sampler, next)) break;
        generated++;
        piece.len = 0;
        krt_tok_stream_push(stream, next, &piece);
        if (piece.len && on_text && on_text(ctx, piece.data, piece.len)) break;
        if (generated == max_new) break;
        if (krt_session_step(s->s, 1, &next, &seq, logits, &a.d) != 0) break;
        last = logits;
    }
    piece.len = 0;
    krt_tok_stream_flush(stream, &piece);
    if (piece.len && on_text) on_text(ctx, piece.data, piece.len);
    ks_buf_free(&piece);
done:
    krt_tok_stream_free(stream);
    krt_sampler_free(sampler);
    krt_tok_ids_free(&ids);
    free(logits);
    free(seqs);
    return api_diag_done(&a, err, err_len) != 0 ? -1 : generated;
}
