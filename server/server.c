/* server.c — `kiln serve` (server/server.h).
 *
 * A request (ksv_req) is shared by its connection's thread and the engine
 * thread, each holding a reference; the last to let go frees it. Everything
 * they share is read and written under the server's mutex: the inbox, the
 * request's text and end, the counters. The engine thread runs the
 * scheduler's steps without the mutex; the scheduler's callbacks take it to
 * hand text over. */
#include "server/server.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/generate.h"
#include "runtime/sched.h"
#include "server/chat_template.h"
#include "server/completion_request.h"

ksv_opts ksv_defaults(void)
{
    return (ksv_opts){.host = "127.0.0.1", .port = 8000, .max_batch = 32, .max_queue = 256, .model = "kiln",
                      .max_body = 1 << 20, .idle_timeout = 30, .max_connections = 512};
}

/* ---- latency histograms (Prometheus) ---- */
enum { N_BUCKETS = 12 };
static const double bucket_le[N_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
typedef struct histogram {
    long counts[N_BUCKETS + 1]; /* the last: past every bound */
    double sum;
    long n;
} histogram;
static void observe(histogram *h, double s)
{
    int b = 0;
    while (b < N_BUCKETS && s > bucket_le[b]) b++;
    h->counts[b]++;
    h->sum += s;
    h->n++;
}

/* A generated token's log probability and its alternatives (logprobs), their texts in the request's
 * lp_text at off, len */
typedef struct lp_entry {
    float logprob;
    uint32_t off, len;
    int n_top;
    float top_lp[KRT_SCHED_MAX_TOP];
    uint32_t top_off[KRT_SCHED_MAX_TOP], top_len[KRT_SCHED_MAX_TOP];
} lp_entry;

typedef struct ksv_req {
    int refs;                 /* the connection's and the engine's */
    ksv_completion c;         /* the parsed body */
    long num;                 /* its number: "cmpl-NUM", the default seed */
    time_t created;
    double t_arrived, t_last; /* when it came; its last token */
    int accepted;             /* the engine took it (tokenized, queued): a stream may start */
    int sched_id;             /* the scheduler's id, -1 before */
    int n_prompt;             /* its prompt's tokens */
    ks_buf text;              /* the text so far */
    size_t sent;              /* bytes of text a stream has sent */
    int done;                 /* it ended: end, st and error hold */
    int status;               /* an error's HTTP status (0: none) */
    char error[256];
    krt_gen_stats st;
    int cancel;               /* the connection is gone: the engine cancels it */
    ks_buf out;               /* a stream's bytes not yet handed to libmicrohttpd */
    size_t out_at;
    int stream_end;           /* 1: the last chunk and [DONE] are in out */
    int chat;                 /* a /v1/chat/completions request: its messages rendered, chat answers */
    lp_entry *lp;             /* [n_lp] the generated tokens' log probabilities (c.logprobs >= 0) */
    int n_lp;
    size_t lp_cap;
    int lp_sent;              /* of them, in a stream's chunks already */
    ks_buf lp_text;           /* their texts */
    int role_sent;            /* a chat stream's first chunk (the role) went out */
    struct ksv_req *next;     /* in the inbox */
    struct ksv_server *srv;
} ksv_req;

typedef struct ksv_server {
    const krt_engine *e;
    krt_session *s;
    const krt_tok *tok;
    ksv_opts o;
    krt_sched *q;
    ksv_tpl *tpl;        /* the engine's chat template, or NULL: no /v1/chat/completions */
    char *bos_text, *eos_text; /* what the template renders as bos_token, eos_token */
    pthread_mutex_t mu;
    pthread_cond_t work; /* the engine waits for requests */
    pthread_cond_t out;  /* connections wait for text */
    ksv_req *inbox, *inbox_tail;
    ksv_req **active;    /* [n_active] submitted to the scheduler, not ended (engine thread's) */
    int n_active;
    size_t active_cap;
    int queued;          /* requests accepted and not ended (for max_queue) */
    long next_num;
    int stopping;        /* the engine loop has ended: requests are refused */
    /* metrics */
    long by_status[6];   /* 200, 400, 401, 404/405, 413, 429 */
    long prompt_tokens, completion_tokens;
    krt_sched_counts counts;
    int kv_used, kv_total;
    histogram ttft, itl;
} ksv_server;

static void req_release(ksv_req *r) /* under mu */
{
    if (--r->refs > 0) return;
    ksv_completion_free(&r->c);
    ks_buf_free(&r->text);
    ks_buf_free(&r->out);
    ks_buf_free(&r->lp_text);
    free(r->lp);
    free(r);
}

/* ---- the engine thread ---------------------------------------------------------------------------- */
static int on_token(void *ctx, int32_t id)
{
    (void)id;
    ksv_req *r = ctx;
    ksv_server *srv = r->srv;
    const double now = ks_now_seconds();
    pthread_mutex_lock(&srv->mu);
    if (r->t_last == 0) observe(&srv->ttft, now - r->t_arrived);
    else observe(&srv->itl, now - r->t_last);
    r->t_last = now;
    pthread_mutex_unlock(&srv->mu);
    return 0;
}

static int on_text(void *ctx, const char *text, size_t len)
{
    ksv_req *r = ctx;
    pthread_mutex_lock(&r->srv->mu);
    ks_buf_put(&r->text, text, len);
    pthread_cond_broadcast(&r->srv->out);
    pthread_mutex_unlock(&r->srv->mu);
    return 0;
}

/* A token's text (its piece alone, special tokens written) into r->lp_text: its offset and length */
static void lp_piece(ksv_server *srv, ksv_req *r, int32_t id, uint32_t *off, uint32_t *len)
{
    *off = (uint32_t)r->lp_text.len;
    if (srv->tok) krt_tok_decode(srv->tok, &id, 1, 0, &r->lp_text);
    *len = (uint32_t)(r->lp_text.len - *off);
}

/* The scheduler's log probabilities of r's next token (engine thread) */
static void on_logprob(void *ctx, int32_t token, float logprob, const int32_t *top_ids, const float *top_lps, int n_top)
{
    ksv_req *r = ctx;
    ksv_server *srv = r->srv;
    pthread_mutex_lock(&srv->mu);
    if (KS_TRY_GROW(r->lp, (size_t)r->n_lp + 1, r->lp_cap, (size_t)1 << 24) == 0) {
        lp_entry *e = &r->lp[r->n_lp++];
        e->logprob = logprob;
        e->n_top = n_top;
        lp_piece(srv, r, token, &e->off, &e->len);
        for (int k = 0; k < n_top; k++) {
            e->top_lp[k] = top_lps[k];
            lp_piece(srv, r, top_ids[k], &e->top_off[k], &e->top_len[k]);
        }
    }
    pthread_mutex_unlock(&srv->mu);
}

/* r ends (under mu): its end, or its error with status */
static void finish(ksv_server *srv, ksv_req *r, const krt_gen_stats *st, int status, const char *error)
{
    r->done = 1;
    if (st) r->st = *st;
    r->status = status;
    if (error) snprintf(r->error, sizeof r->error, "%s", error);
    srv->queued--;
    if (!status) srv->prompt_tokens += r->n_prompt, srv->completion_tokens += r->st.generated;
    pthread_cond_broadcast(&srv->out);
    req_release(r); /* the engine's reference */
}

static void on_done(void *ctx, int id, const krt_gen_stats *st, const char *error)
{
    (void)id;
    ksv_req *r = ctx;
    ksv_server *srv = r->srv;
    for (int i = 0; i < srv->n_active; i++)
        if (srv->active[i] == r) srv->active[i] = srv->active[--srv->n_active];
    pthread_mutex_lock(&srv->mu);
    finish(srv, r, st, error && strcmp(error, "cancelled") != 0 ? 500 : 0, error);
    pthread_mutex_unlock(&srv->mu);
}

/* A request from the inbox: its prompt's ids, into the scheduler */
static void submit(ksv_server *srv, ksv_req *r)
{
    ks_buf msg = KS_BUF_TRY;
    ks_diag d = {.quiet = 1, .log = &msg};
    krt_tok_ids ids = {0};
    const int32_t *p = r->c.ids;
    int n = r->c.n_ids, status = 0;
    if (r->chat) {
        /* the messages through the chat template, then its text as the tokenizer cuts it, special tokens
           included and none added (the template writes BOS where the model wants it), as transformers'
           apply_chat_template does */
        ks_buf text = KS_BUF_TRY;
        ksv_tpl_message *ms = ks_try_calloc((size_t)r->c.n_messages, sizeof *ms);
        const ksv_tpl_vars vars = {.bos_token = srv->bos_text, .eos_token = srv->eos_text, .add_generation_prompt = 1};
        for (int i = 0; ms && i < r->c.n_messages; i++) ms[i] = (ksv_tpl_message){r->c.messages[i].role, r->c.messages[i].content};
        if (!ms) status = 503;
        else if (ksv_tpl_render(srv->tpl, ms, r->c.n_messages, &vars, &text, &d) != 0) status = 400;
        else if (krt_tok_encode(srv->tok, text.data ? text.data : "", text.len, 0, &ids, &d) != 0) status = 400;
        free(ms);
        ks_buf_free(&text);
        p = ids.ids, n = (int)ids.len;
        if (!status && n < 1) {
            ks_error(&d, "kiln", "the chat template rendered these messages as no tokens");
            status = 400;
        }
    } else if (!p) {
        if (krt_gen_prompt(srv->tok, &srv->e->desc, r->c.prompt, &ids, &d) != 0) status = 400;
        p = ids.ids, n = (int)ids.len;
    }
    const int ctx = krt_session_max_context(srv->s);
    if (!status && n > ctx) {
        ks_error(&d, "kiln", "the prompt has %d tokens, more than the model's context of %d", n, ctx);
        status = 413;
    }
    krt_gen_opts o = krt_gen_defaults();
    o.max_new = r->c.max_tokens ? r->c.max_tokens : ctx;
    o.sampling.temperature = (float)r->c.temperature;
    o.sampling.top_p = (float)r->c.top_p;
    o.sampling.top_k = r->c.top_k;
    o.sampling.seed = r->c.has_seed ? r->c.seed : (uint64_t)r->num;
    o.stops = (const char *const *)r->c.stops;
    o.n_stops = r->c.n_stops;
    o.echo_prompt = r->c.echo;
    o.ignore_eos = r->c.ignore_eos;
    krt_gen_callbacks cb = {.on_text = on_text, .on_token = on_token, .ctx = r};
    int id = -1;
    if (!status && KS_TRY_GROW(srv->active, (size_t)srv->n_active + 1, srv->active_cap, (size_t)1 << 20) != 0) {
        ks_error_oom(&d, "kiln", 0, "the active requests");
        status = 503;
    }
    if (!status) {
        id = krt_sched_submit(srv->q, p, n, &o, &cb, on_done, r, &d);
        if (id < 0) status = 400;
        else if (r->c.logprobs >= 0) krt_sched_logprobs(srv->q, id, r->c.logprobs, on_logprob, r);
    }
    pthread_mutex_lock(&srv->mu);
    r->n_prompt = n;
    r->accepted = 1;
    r->sched_id = id;
    if (status) {
        while (msg.len && msg.data[msg.len - 1] == '\n') msg.data[--msg.len] = 0;
        const char *m = msg.len ? ks_buf_cstr(&msg) : "the request could not be run";
        const char *e = strstr(m, "error: ");
        finish(srv, r, NULL, status, e ? e + 7 : m);
    } else {
        srv->active[srv->n_active++] = r;
        pthread_cond_broadcast(&srv->out);
    }
    pthread_mutex_unlock(&srv->mu);
    krt_tok_ids_free(&ids);
    ks_buf_free(&msg);
}

static void engine_loop(ksv_server *srv, volatile sig_atomic_t *stop)
{
    while (!*stop) {
        pthread_mutex_lock(&srv->mu);
        if (!srv->inbox && !krt_sched_busy(srv->q)) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += 200 * 1000000L; /* the stop flag is looked at five times a second */
            if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&srv->work, &srv->mu, &until);
        }
        ksv_req *in = srv->inbox;
        srv->inbox = srv->inbox_tail = NULL;
        /* the requests whose connections are gone */
        int cancels[64], n_cancel = 0;
        for (int i = 0; i < srv->n_active && n_cancel < 64; i++)
            if (srv->active[i]->cancel) cancels[n_cancel++] = srv->active[i]->sched_id;
        pthread_mutex_unlock(&srv->mu);
        while (in) {
            ksv_req *next = in->next;
            submit(srv, in);
            in = next;
        }
        for (int i = 0; i < n_cancel; i++) krt_sched_cancel(srv->q, cancels[i]);
        if (krt_sched_busy(srv->q)) {
            ks_diag d = {.quiet = 1};
            krt_sched_step(srv->q, &d);
        }
        const krt_sched_counts c = krt_sched_counts_of(srv->q);
        const int free_blocks = krt_session_free_blocks(srv->s);
        pthread_mutex_lock(&srv->mu);
        srv->counts = c;
        srv->kv_used = srv->kv_total - free_blocks;
        pthread_mutex_unlock(&srv->mu);
    }
}

/* ---- answers ------------------------------------------------------------------------------------ */
static enum MHD_Result answer(struct MHD_Connection *con, ksv_server *srv, int status, const char *type,
                              const char *body, size_t len)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", type);
    enum MHD_Result rc = MHD_queue_response(con, (unsigned)status, resp);
    MHD_destroy_response(resp);
    pthread_mutex_lock(&srv->mu);
    const int slot = status == 200 ? 0 : status == 400 ? 1 : status == 401 ? 2 : status == 413 ? 4 : status == 429 ? 5 : 3;
    srv->by_status[slot]++;
    pthread_mutex_unlock(&srv->mu);
    return rc;
}

static enum MHD_Result answer_json(struct MHD_Connection *con, ksv_server *srv, int status, cJSON *j)
{
    char *text = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!text) return answer(con, srv, 503, "text/plain", "out of memory\n", 14);
    enum MHD_Result rc = answer(con, srv, status, "application/json", text, strlen(text));
    cJSON_free(text);
    return rc;
}

/* OpenAI's error object */
static enum MHD_Result answer_error(struct MHD_Connection *con, ksv_server *srv, int status, const char *message)
{
    cJSON *j = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(j, "error");
    cJSON_AddStringToObject(e, "message", message);
    cJSON_AddStringToObject(e, "type", status == 401 ? "authentication_error"
                                       : status == 429 ? "rate_limit_error"
                                       : status >= 500 ? "server_error"
                                                       : "invalid_request_error");
    cJSON_AddNullToObject(e, "param");
    cJSON_AddNullToObject(e, "code");
    return answer_json(con, srv, status, j);
}

static const char *finish_reason(const krt_gen_stats *st)
{
    return st->end == KRT_GEN_MAX_NEW || st->end == KRT_GEN_CONTEXT ? "length" : "stop";
}

/* A completion object (non-stream: the whole text, usage; stream: one chunk) */
/* A token's text from lp_text as a JSON string */
static cJSON *lp_string(const ksv_req *r, uint32_t off, uint32_t len)
{
    char *t = ks_try_malloc((size_t)len + 1);
    if (t) memcpy(t, r->lp_text.data + off, len), t[len] = 0;
    cJSON *j = cJSON_CreateString(t ? t : "");
    free(t);
    return j;
}

/* Entries [from, to) of r's log probabilities: a completion's {"tokens", "token_logprobs", "top_logprobs",
 * "text_offset"}, a chat's {"content": [{"token", "logprob", "top_logprobs": [{"token", "logprob"}]}]} */
static cJSON *logprobs_json(const ksv_req *r, int from, int to)
{
    cJSON *j = cJSON_CreateObject();
    if (r->chat) {
        cJSON *content = cJSON_AddArrayToObject(j, "content");
        for (int i = from; i < to; i++) {
            const lp_entry *e = &r->lp[i];
            cJSON *t = cJSON_CreateObject(), *tops = cJSON_CreateArray();
            cJSON_AddItemToObject(t, "token", lp_string(r, e->off, e->len));
            cJSON_AddNumberToObject(t, "logprob", e->logprob);
            for (int k = 0; k < e->n_top; k++) {
                cJSON *a = cJSON_CreateObject();
                cJSON_AddItemToObject(a, "token", lp_string(r, e->top_off[k], e->top_len[k]));
                cJSON_AddNumberToObject(a, "logprob", e->top_lp[k]);
                cJSON_AddItemToArray(tops, a);
            }
            cJSON_AddItemToObject(t, "top_logprobs", tops);
            cJSON_AddItemToArray(content, t);
        }
        return j;
    }
    cJSON *tokens = cJSON_AddArrayToObject(j, "tokens"), *lps = cJSON_AddArrayToObject(j, "token_logprobs"),
          *tops = cJSON_AddArrayToObject(j, "top_logprobs"), *offs = cJSON_AddArrayToObject(j, "text_offset");
    size_t at = 0;
    for (int i = 0; i < from; i++) at += r->lp[i].len;
    for (int i = from; i < to; i++) {
        const lp_entry *e = &r->lp[i];
        cJSON_AddItemToArray(tokens, lp_string(r, e->off, e->len));
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(e->logprob));
        cJSON *alt = cJSON_CreateObject();
        for (int k = 0; k < e->n_top; k++) {
            char *t = ks_try_malloc((size_t)e->top_len[k] + 1);
            if (!t) continue;
            memcpy(t, r->lp_text.data + e->top_off[k], e->top_len[k]);
            t[e->top_len[k]] = 0;
            if (!cJSON_HasObjectItem(alt, t)) cJSON_AddNumberToObject(alt, t, e->top_lp[k]);
            free(t);
        }
        cJSON_AddItemToArray(tops, alt);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)at));
        at += e->len;
    }
    return j;
}

/* The entries of r's log probabilities that belong to its generated tokens (an end-of-sequence token drawn
 * last is not one) */
static int lp_count(const ksv_req *r)
{
    return r->done && r->n_lp > r->st.generated ? r->st.generated : r->n_lp;
}

static cJSON *completion_json(const ksv_server *srv, const ksv_req *r, const char *text, size_t len, const char *reason,
                              int usage, int lp_from, int lp_to)
{
    char id[32];
    snprintf(id, sizeof id, "%s-%ld", r->chat ? "chatcmpl" : "cmpl", r->num);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", id);
    cJSON_AddStringToObject(j, "object", !r->chat ? "text_completion" : r->c.stream ? "chat.completion.chunk" : "chat.completion");
    cJSON_AddNumberToObject(j, "created", (double)r->created);
    cJSON_AddStringToObject(j, "model", srv->o.model);
    cJSON *choices = cJSON_AddArrayToObject(j, "choices"), *c = cJSON_CreateObject();
    char *t = ks_try_malloc(len + 1);
    if (t) memcpy(t, text, len), t[len] = 0;
    if (!r->chat) {
        cJSON_AddStringToObject(c, "text", t ? t : "");
    } else { /* a chat: the message, or in a stream its delta (the role in the first chunk, nothing in the last) */
        cJSON *m = cJSON_AddObjectToObject(c, r->c.stream ? "delta" : "message");
        if (!r->c.stream || !r->role_sent) cJSON_AddStringToObject(m, "role", "assistant");
        if (!r->c.stream || len) cJSON_AddStringToObject(m, "content", t ? t : "");
    }
    free(t);
    cJSON_AddNumberToObject(c, "index", 0);
    if (r->c.logprobs >= 0) cJSON_AddItemToObject(c, "logprobs", logprobs_json(r, lp_from, lp_to));
    else cJSON_AddNullToObject(c, "logprobs");
    if (reason) cJSON_AddStringToObject(c, "finish_reason", reason);
    else cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToArray(choices, c);
    if (usage) {
        cJSON *u = cJSON_AddObjectToObject(j, "usage");
        cJSON_AddNumberToObject(u, "prompt_tokens", r->n_prompt);
        cJSON_AddNumberToObject(u, "completion_tokens", r->st.generated);
        cJSON_AddNumberToObject(u, "total_tokens", r->n_prompt + r->st.generated);
    }
    return j;
}

/* ---- a stream ----------------------------------------------------------------------------------- */
static void put_event(ks_buf *out, cJSON *j)
{
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!text) return;
    ks_buf_printf(out, "data: %s\n\n", text);
    cJSON_free(text);
}

/* libmicrohttpd asks for the next bytes: the text that came since, as events; the end */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    ksv_req *r = cls;
    ksv_server *srv = r->srv;
    pthread_mutex_lock(&srv->mu);
    while (r->out_at == r->out.len) {
        r->out.len = r->out_at = 0;
        if (r->stream_end) {
            pthread_mutex_unlock(&srv->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (r->text.len > r->sent) {
            const int to = lp_count(r);
            put_event(&r->out, completion_json(srv, r, r->text.data + r->sent, r->text.len - r->sent, NULL, 0, r->lp_sent, to));
            r->sent = r->text.len;
            r->lp_sent = to;
            r->role_sent = 1;
        } else if (r->done) {
            if (r->status) {
                cJSON *j = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(j, "error");
                cJSON_AddStringToObject(e, "message", r->error);
                put_event(&r->out, j);
            } else {
                const int to = lp_count(r) > r->lp_sent ? lp_count(r) : r->lp_sent;
                put_event(&r->out, completion_json(srv, r, "", 0, finish_reason(&r->st), 1, r->lp_sent, to));
                r->lp_sent = to;
            }
            ks_buf_puts(&r->out, "data: [DONE]\n\n");
            r->stream_end = 1;
        } else {
            pthread_cond_wait(&srv->out, &srv->mu);
        }
    }
    size_t n = r->out.len - r->out_at < max ? r->out.len - r->out_at : max;
    memcpy(buf, r->out.data + r->out_at, n);
    r->out_at += n;
    pthread_mutex_unlock(&srv->mu);
    return (ssize_t)n;
}

/* The response is gone (sent, or the client went away): the connection's reference */
static void stream_free(void *cls)
{
    ksv_req *r = cls;
    ksv_server *srv = r->srv;
    pthread_mutex_lock(&srv->mu);
    if (!r->done) {
        r->cancel = 1; /* the client went away: the engine cancels it */
        pthread_cond_signal(&srv->work);
    }
    req_release(r);
    pthread_mutex_unlock(&srv->mu);
}

/* ---- requests ----------------------------------------------------------------------------------- */
typedef struct conn {
    ks_buf body;    /* the request's body so far */
    int too_large;  /* it passed max_body: the rest was dropped */
} conn;

static enum MHD_Result completions(struct MHD_Connection *con, ksv_server *srv, conn *cs, int chat)
{
    const krt_desc *desc = &srv->e->desc;
    ksv_limits lim = {desc->vocab, krt_session_max_context(srv->s), srv->o.max_body};
    char msg[256];
    if (cs->too_large)
        return answer_error(con, srv, 413, "the body is longer than this server takes");
    ksv_req *r = ks_try_calloc(1, sizeof *r);
    if (!r) return answer_error(con, srv, 503, "out of memory");
    int status = (chat ? ksv_chat_parse : ksv_completion_parse)(cs->body.data ? cs->body.data : "", cs->body.len, &lim,
                                                                 &r->c, msg, sizeof msg);
    if (!status && (r->c.prompt || chat) && !srv->tok)
        status = 400, snprintf(msg, sizeof msg, "the engine holds no tokenizer: send token ids to /v1/completions");
    if (!status && chat && !srv->tpl)
        status = 400, snprintf(msg, sizeof msg, "the model has no chat template (its tokenizer_config.json had none): "
                                                "use /v1/completions");
    if (status) {
        free(r);
        return answer_error(con, srv, status, msg);
    }
    r->refs = 2;
    r->chat = chat;
    r->srv = srv;
    r->sched_id = -1;
    r->created = time(NULL);
    r->t_arrived = ks_now_seconds();
    r->text.fallible = r->out.fallible = r->lp_text.fallible = 1;
    pthread_mutex_lock(&srv->mu);
    if (srv->queued >= srv->o.max_queue || srv->stopping) {
        const int stopping = srv->stopping;
        pthread_mutex_unlock(&srv->mu);
        ksv_completion_free(&r->c);
        free(r);
        return stopping ? answer_error(con, srv, 503, "the server is stopping")
                        : answer_error(con, srv, 429, "the server's queue is full; try again later");
    }
    srv->queued++;
    r->num = srv->next_num++;
    if (srv->inbox_tail) srv->inbox_tail->next = r;
    else srv->inbox = r;
    srv->inbox_tail = r;
    pthread_cond_signal(&srv->work);
    /* wait until the engine took it (a stream's headers say 200 only then), or, without a stream, its end */
    while (!(r->c.stream ? r->accepted : r->done)) pthread_cond_wait(&srv->out, &srv->mu);
    if (r->done && (r->status || !r->c.stream)) {
        const int st = r->status;
        cJSON *j = st ? NULL : completion_json(srv, r, r->text.data ? r->text.data : "", r->text.len, finish_reason(&r->st), 1,
                                               0, lp_count(r));
        char err[256];
        snprintf(err, sizeof err, "%s", r->error);
        req_release(r);
        pthread_mutex_unlock(&srv->mu);
        return st ? answer_error(con, srv, st, err) : answer_json(con, srv, 200, j);
    }
    pthread_mutex_unlock(&srv->mu);
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, r, stream_free);
    if (!resp) {
        stream_free(r);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    enum MHD_Result rc = MHD_queue_response(con, 200, resp);
    MHD_destroy_response(resp);
    pthread_mutex_lock(&srv->mu);
    srv->by_status[0]++;
    pthread_mutex_unlock(&srv->mu);
    return rc;
}

static enum MHD_Result metrics(struct MHD_Connection *con, ksv_server *srv)
{
    ks_buf b = KS_BUF_TRY;
    pthread_mutex_lock(&srv->mu);
    static const char *const codes[6] = {"200", "400", "401", "404", "413", "429"};
    ks_buf_puts(&b, "# HELP kiln_requests_total HTTP requests answered, by status.\n# TYPE kiln_requests_total counter\n");
    for (int i = 0; i < 6; i++) ks_buf_printf(&b, "kiln_requests_total{status=\"%s\"} %ld\n", codes[i], srv->by_status[i]);
    ks_buf_printf(&b,
                  "# TYPE kiln_prompt_tokens_total counter\nkiln_prompt_tokens_total %ld\n"
                  "# TYPE kiln_completion_tokens_total counter\nkiln_completion_tokens_total %ld\n"
                  "# TYPE kiln_queue_length gauge\nkiln_queue_length %d\n"
                  "# TYPE kiln_running_requests gauge\nkiln_running_requests %d\n"
                  "# TYPE kiln_kv_blocks_used gauge\nkiln_kv_blocks_used %d\n"
                  "# TYPE kiln_kv_blocks gauge\nkiln_kv_blocks %d\n"
                  "# TYPE kiln_preemptions_total counter\nkiln_preemptions_total %ld\n"
                  "# TYPE kiln_prefix_cache_lookups_total counter\nkiln_prefix_cache_lookups_total %ld\n"
                  "# TYPE kiln_prefix_cache_hits_total counter\nkiln_prefix_cache_hits_total %ld\n",
                  srv->prompt_tokens, srv->completion_tokens, srv->counts.waiting, srv->counts.running, srv->kv_used,
                  srv->kv_total, srv->counts.preemptions, srv->counts.prefix_lookups, srv->counts.prefix_hits);
    const struct { const char *name; const histogram *h; } hs[2] = {{"kiln_time_to_first_token_seconds", &srv->ttft},
                                                                     {"kiln_inter_token_seconds", &srv->itl}};
    for (int k = 0; k < 2; k++) {
        ks_buf_printf(&b, "# TYPE %s histogram\n", hs[k].name);
        long cum = 0;
        for (int i = 0; i <= N_BUCKETS; i++) {
            cum += hs[k].h->counts[i];
            if (i < N_BUCKETS) ks_buf_printf(&b, "%s_bucket{le=\"%g\"} %ld\n", hs[k].name, bucket_le[i], cum);
            else ks_buf_printf(&b, "%s_bucket{le=\"+Inf\"} %ld\n", hs[k].name, cum);
        }
        ks_buf_printf(&b, "%s_sum %.6f\n%s_count %ld\n", hs[k].name, hs[k].h->sum, hs[k].name, hs[k].h->n);
    }
    pthread_mutex_unlock(&srv->mu);
    enum MHD_Result rc = b.failed ? answer(con, srv, 503, "text/plain", "out of memory\n", 14)
                                  : answer(con, srv, 200, "text/plain; version=0.0.4", b.data, b.len);
    ks_buf_free(&b);
    return rc;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *con, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)version;
    ksv_server *srv = cls;
    conn *cs = *con_cls;
    if (!cs) { /* the headers: the body follows */
        cs = ks_try_calloc(1, sizeof *cs);
        if (!cs) return MHD_NO;
        cs->body.fallible = 1;
        *con_cls = cs;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cs->too_large && cs->body.len + *upload_size <= srv->o.max_body) ks_buf_put(&cs->body, upload, *upload_size);
        else cs->too_large = 1;
        if (cs->body.failed) cs->too_large = 1;
        *upload_size = 0;
        return MHD_YES;
    }
    if (srv->o.api_key) {
        const char *auth = MHD_lookup_connection_value(con, MHD_HEADER_KIND, "Authorization");
        if (!auth || strncmp(auth, "Bearer ", 7) != 0 || strcmp(auth + 7, srv->o.api_key) != 0)
            return answer_error(con, srv, 401, "a valid API key is required: Authorization: Bearer KEY");
    }
    const int get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0;
    if (strcmp(url, "/v1/completions") == 0 || strcmp(url, "/v1/chat/completions") == 0) {
        if (!post) return answer_error(con, srv, 405, "the completions endpoints take POST");
        return completions(con, srv, cs, url[4] == 'c' && url[5] == 'h');
    }
    if (strcmp(url, "/health") == 0 && get) return answer(con, srv, 200, "application/json", "{\"status\":\"ok\"}", 15);
    if (strcmp(url, "/metrics") == 0 && get) return metrics(con, srv);
    if (strcmp(url, "/v1/models") == 0 && get) {
        cJSON *j = cJSON_CreateObject(), *data = cJSON_AddArrayToObject(j, "data"), *m = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "object", "list");
        cJSON_AddStringToObject(m, "id", srv->o.model);
        cJSON_AddStringToObject(m, "object", "model");
        cJSON_AddNumberToObject(m, "created", 0);
        cJSON_AddStringToObject(m, "owned_by", "kiln");
        cJSON_AddNumberToObject(m, "max_model_len", krt_session_max_context(srv->s)); /* as vLLM says it */
        cJSON_AddNumberToObject(m, "vocab_size", (double)srv->e->desc.vocab);          /* token ids are below it */
        cJSON_AddItemToArray(data, m);
        return answer_json(con, srv, 200, j);
    }
    char msg[160];
    snprintf(msg, sizeof msg, "no such endpoint: %s %.100s", method, url);
    return answer_error(con, srv, 404, msg);
}

static void completed(void *cls, struct MHD_Connection *con, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)cls, (void)con, (void)toe;
    conn *cs = *con_cls;
    if (!cs) return;
    ks_buf_free(&cs->body);
    free(cs);
    *con_cls = NULL;
}

/* The engine's chat template (runtime/engine.h's KRT_CHAT_TEMPLATE_SECTION), parsed: 0 (none is fine),
 * or -1 after reporting one that does not parse (at ENGINE:chat_template:LINE:COL). */
static int load_template(ksv_server *srv, ks_diag *d)
{
    size_t size = 0;
    const char *text = krt_engine_section_data(srv->e, KRT_CHAT_TEMPLATE_SECTION, &size);
    if (!text) return 0;
    cJSON *j = cJSON_ParseWithLength(text, size);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "template"), *b = cJSON_GetObjectItemCaseSensitive(j, "bos_token"),
                *e = cJSON_GetObjectItemCaseSensitive(j, "eos_token");
    int rc = -1;
    if (!cJSON_IsString(t)) {
        ks_error(d, srv->e->path, "damaged chat_template section");
    } else {
        char name[512];
        snprintf(name, sizeof name, "%s:chat_template", srv->e->path);
        srv->tpl = ksv_tpl_parse(t->valuestring, strlen(t->valuestring), name, d);
        srv->bos_text = ks_xstrdup(cJSON_IsString(b) ? b->valuestring : "");
        srv->eos_text = ks_xstrdup(cJSON_IsString(e) ? e->valuestring : "");
        rc = srv->tpl ? 0 : -1;
    }
    cJSON_Delete(j);
    return rc;
}

int ksv_serve(const krt_engine *e, krt_session *s, const krt_tok *tok, const ksv_opts *o, volatile sig_atomic_t *stop,
              ks_diag *d)
{
    ksv_server srv = {.e = e, .s = s, .tok = tok, .o = *o};
    if (load_template(&srv, d) != 0) {
        ksv_tpl_free(srv.tpl);
        free(srv.bos_text);
        free(srv.eos_text);
        return -1;
    }
    krt_sched_opts so = {.max_batch = o->max_batch};
    srv.q = krt_sched_new(s, tok, &so, d);
    if (!srv.q) {
        ksv_tpl_free(srv.tpl);
        free(srv.bos_text);
        free(srv.eos_text);
        return -1;
    }
    srv.kv_total = krt_session_kv_info(s)->n_blocks;
    pthread_mutex_init(&srv.mu, NULL);
    pthread_cond_init(&srv.work, NULL);
    pthread_cond_init(&srv.out, NULL);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port)};
    int rc = -1;
    struct MHD_Daemon *daemon = NULL;
    if (inet_pton(AF_INET, o->host, &addr.sin_addr) != 1) {
        ks_error(d, "kiln serve", "--host '%s' is not an IPv4 address", o->host);
    } else {
        daemon = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL,
                                  handle, &srv, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                                  MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)o->idle_timeout,
                                  MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_connections,
                                  MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024, /* headers and buffers */
                                  MHD_OPTION_NOTIFY_COMPLETED, completed, NULL, MHD_OPTION_END);
        if (!daemon) ks_error(d, "kiln serve", "cannot listen on %s:%d (in use, or not this machine's)", o->host, o->port);
    }
    if (daemon) {
        const union MHD_DaemonInfo *info = MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_BIND_PORT);
        fprintf(stderr, "kiln serve: listening on http://%s:%u\n", o->host, info ? (unsigned)info->port : (unsigned)o->port);
        fflush(stderr);
        engine_loop(&srv, stop);
        /* every request ends before the connections' threads are joined (they wait on them): those in the
           scheduler as cancelled, those in the inbox refused; new ones are refused from now on */
        pthread_mutex_lock(&srv.mu);
        srv.stopping = 1;
        pthread_mutex_unlock(&srv.mu);
        krt_sched_free(srv.q);
        srv.q = NULL;
        pthread_mutex_lock(&srv.mu);
        while (srv.inbox) {
            ksv_req *r = srv.inbox;
            srv.inbox = r->next;
            r->accepted = 1;
            finish(&srv, r, NULL, 503, "the server is stopping");
        }
        pthread_mutex_unlock(&srv.mu);
        MHD_stop_daemon(daemon);
        rc = 0;
    }
    krt_sched_free(srv.q);
    free(srv.active);
    ksv_tpl_free(srv.tpl);
    free(srv.bos_text);
    free(srv.eos_text);
    pthread_cond_destroy(&srv.out);
    pthread_cond_destroy(&srv.work);
    pthread_mutex_destroy(&srv.mu);
    return rc;
}
