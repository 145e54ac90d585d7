/* kiln_api.c — the public C API (runtime/kiln.h) over the engine, session,
 * tokenizer and sampler modules.
 *
 * Out of memory anywhere below is an error like any other (every module
 * under these calls allocates fallibly: support/support.h): the call
 * returns NULL or -1 with the message, having left nothing half done (a
 * failed open or new frees what it made, a failed step appends nothing, a
 * failed generate leaves its sequence as it found it). The messages are
 * collected in a fallible buffer; if even that runs out, the caller still
 * gets a line saying so. */
#include "runtime/kiln.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/generate.h"
#include "runtime/sched.h"

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
    ks_buf buf;  /* the messages (fallible) */
} api_diag;

static void api_diag_init(api_diag *a)
{
    memset(a, 0, sizeof *a);
    a->d.quiet = 1;
    a->buf.fallible = 1;
    a->d.log = &a->buf;
}

/* Append n bytes of text to err[0..*at), as many as fit with its NUL. */
static void err_put(char *err, size_t err_len, size_t *at, const char *text, size_t n)
{
    if (n > err_len - 1 - *at) n = err_len - 1 - *at;
    if (n) memcpy(err + *at, text, n);
    *at += n;
    err[*at] = 0;
}

static int api_diag_done(api_diag *a, char *err, size_t err_len)
{
    static const char lost[] = "kiln: error: out of memory (a message could not be kept)\n";
    int bad = a->d.errors > 0;
    if (err && err_len) {
        size_t at = 0;
        err[0] = 0;
        err_put(err, err_len, &at, a->buf.data ? a->buf.data : "", a->buf.len);
        if (a->buf.failed) err_put(err, err_len, &at, lost, sizeof lost - 1);
    }
    ks_buf_free(&a->buf);
    return bad ? -1 : 0;
}

kiln_engine *kiln_engine_open(const char *path, char *err, size_t err_len)
{
    api_diag a;
    api_diag_init(&a);
    kiln_engine *e = ks_try_calloc(1, sizeof *e);
    if (!e) {
        ks_error_oom(&a.d, path, sizeof *e, "the engine");
        api_diag_done(&a, err, err_len);
        return NULL;
    }
    e->engine = krt_engine_open(path, &a.d);
    if (e->engine && e->engine->tokenizer) e->tok = krt_engine_tokenizer(e->engine, &a.d);
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
    kiln_session *k = s ? ks_try_calloc(1, sizeof *k) : NULL;
    if (s && !k) ks_error_oom(&a.d, e->engine->path, sizeof *k, "a session");
    if (api_diag_done(&a, err, err_len) != 0) {
        krt_session_free(s);
        free(k);
        return NULL;
    }
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

kiln_generate_opts kiln_generate_defaults(void)
{
    kiln_generate_opts o = {.max_new = 128, .sampling = kiln_sampling_greedy()};
    return o;
}

/* on_text through the API's callback type */
typedef struct text_sink {
    kiln_text_fn fn; /* the caller's */
    void *ctx;       /* its context */
} text_sink;

static int text_to_caller(void *ctx, const char *text, size_t len)
{
    text_sink *t = ctx;
    return t->fn ? t->fn(t->ctx, text, len) : 0;
}

/* The generation loop's options from the API's; -1 after reporting bad stop strings. */
static int gen_opts_of(const kiln_generate_opts *k, krt_gen_opts *g, ks_diag *d)
{
    if (k->n_stop < 0 || (k->n_stop > 0 && !k->stop)) {
        ks_error(d, "kiln", "n_stop is %d but the stop strings are %s", k->n_stop, k->stop ? "given" : "NULL");
        return -1;
    }
    *g = krt_gen_defaults();
    g->max_new = k->max_new;
    g->sampling.temperature = k->sampling.temperature;
    g->sampling.top_k = k->sampling.top_k;
    g->sampling.top_p = k->sampling.top_p;
    g->sampling.repetition_penalty = k->sampling.repetition_penalty;
    g->sampling.seed = k->sampling.seed;
    g->stops = k->stop;
    g->n_stops = k->n_stop;
    g->ignore_eos = k->ignore_eos;
    return 0;
}

int kiln_generate(kiln_session *s, int seq, const char *prompt, const kiln_generate_opts *o, kiln_text_fn on_text,
                  void *ctx, char *err, size_t err_len)
{
    api_diag a;
    api_diag_init(&a);
    kiln_generate_opts k = o ? *o : kiln_generate_defaults();
    krt_tok_ids ids = {0};
    int generated = -1, had = krt_session_seq_len(s->s, seq); /* -1: the call adds the sequence */
    krt_gen_opts g;
    if (!s->e->tok) {
        ks_error(&a.d, s->e->engine->path, "the engine holds no tokenizer");
    } else if (gen_opts_of(&k, &g, &a.d) == 0 &&
               krt_gen_prompt(s->e->tok, &s->e->engine->desc, prompt ? prompt : "", &ids, &a.d) == 0 &&
               (krt_session_seq_len(s->s, seq) >= 0 || krt_session_seq_add(s->s, seq, &a.d) == 0)) {
        text_sink sink = {on_text, ctx};
        krt_gen_callbacks cb = {.on_text = text_to_caller, .ctx = &sink};
        generated = krt_generate(s->s, seq, s->e->tok, ids.ids, (int)ids.len, &g, &cb, NULL, &a.d);
        /* krt_generate left the sequence as it found it; one added here goes again */
        if (generated < 0 && had < 0) krt_session_seq_free(s->s, seq);
    }
    krt_tok_ids_free(&ids);
    return api_diag_done(&a, err, err_len) != 0 ? -1 : generated;
}

/* ---- the scheduler ------------------------------------------------------------------------------ */
struct kiln_scheduler {
    kiln_session *s; /* not owned */
    krt_sched *q;    /* owned */
};

/* A request's callbacks through the API's types (owned by the request: freed at its end) */
typedef struct api_req {
    text_sink sink;
    kiln_done_fn done;
    void *done_ctx;
} api_req;

static void done_to_caller(void *ctx, int id, const krt_gen_stats *st, const char *error)
{
    api_req *r = ctx;
    if (r->done) r->done(r->done_ctx, id, st->generated, error);
    free(r);
}

kiln_scheduler *kiln_scheduler_new(kiln_session *s, int max_batch, int token_budget, char *err, size_t err_len)
{
    api_diag a;
    api_diag_init(&a);
    kiln_scheduler *k = ks_try_calloc(1, sizeof *k);
    if (!k) ks_error_oom(&a.d, s->e->engine->path, sizeof *k, "a scheduler");
    krt_sched_opts o = {.max_batch = max_batch, .token_budget = token_budget};
    if (k) k->q = krt_sched_new(s->s, s->e->tok, &o, &a.d);
    if (api_diag_done(&a, err, err_len) != 0) {
        free(k);
        return NULL;
    }
    k->s = s;
    return k;
}

void kiln_scheduler_free(kiln_scheduler *q)
{
    if (!q) return;
    krt_sched_free(q->q);
    free(q);
}

int kiln_submit(kiln_scheduler *q, const char *prompt, const kiln_generate_opts *o, kiln_text_fn on_text, void *ctx,
                kiln_done_fn done, void *done_ctx, char *err, size_t err_len)
{
    api_diag a;
    api_diag_init(&a);
    kiln_generate_opts k = o ? *o : kiln_generate_defaults();
    const kiln_engine *e = q->s->e;
    krt_tok_ids ids = {0};
    krt_gen_opts g;
    int id = -1;
    api_req *r = NULL;
    if (!e->tok) {
        ks_error(&a.d, e->engine->path, "the engine holds no tokenizer");
    } else if (gen_opts_of(&k, &g, &a.d) == 0 &&
               krt_gen_prompt(e->tok, &e->engine->desc, prompt ? prompt : "", &ids, &a.d) == 0) {
        r = ks_try_calloc(1, sizeof *r);
        if (!r) {
            ks_error_oom(&a.d, "kiln", sizeof *r, "a request");
        } else {
            *r = (api_req){{on_text, ctx}, done, done_ctx};
            krt_gen_callbacks cb = {.on_text = text_to_caller, .ctx = &r->sink};
            id = krt_sched_submit(q->q, ids.ids, (int)ids.len, &g, &cb, done_to_caller, r, &a.d);
            if (id < 0) free(r);
        }
    }
    krt_tok_ids_free(&ids);
    return api_diag_done(&a, err, err_len) != 0 ? -1 : id;
}

int kiln_cancel(kiln_scheduler *q, int request) { return krt_sched_cancel(q->q, request); }

int kiln_scheduler_step(kiln_scheduler *q, char *err, size_t err_len)
{
    api_diag a;
    api_diag_init(&a);
    krt_sched_step(q->q, &a.d);
    return api_diag_done(&a, err, err_len);
}

int kiln_scheduler_busy(const kiln_scheduler *q) { return krt_sched_busy(q->q); }
