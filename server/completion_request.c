/* completion_request.c — parsing a POST /v1/completions body (server/completion_request.h). */
#include "server/completion_request.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/support.h"

static int refuse(char *msg, size_t msg_len, int status, const char *fmt, ...) KS_PRINTF(4, 5);
static int refuse(char *msg, size_t msg_len, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, msg_len, fmt, ap);
    va_end(ap);
    return status;
}

void ksv_completion_free(ksv_completion *c)
{
    free(c->prompt);
    free(c->ids);
    for (int i = 0; i < c->n_stops; i++) free(c->stops[i]);
    for (int i = 0; i < c->n_messages; i++) free(c->messages[i].role), free(c->messages[i].content);
    free(c->messages);
    memset(c, 0, sizeof *c);
}

/* A copy of a JSON string's text; NULL out of memory. */
static char *dup_text(const char *s)
{
    size_t n = strlen(s);
    char *p = ks_try_malloc(n + 1);
    if (p) memcpy(p, s, n + 1);
    return p;
}

/* A number field in [lo, hi] into *out (absent: left as it is). 0, or 400 with the message. */
static int number(const cJSON *root, const char *name, double lo, double hi, double *out, char *msg, size_t msg_len)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!j || cJSON_IsNull(j)) return 0;
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble) || j->valuedouble < lo || j->valuedouble > hi)
        return refuse(msg, msg_len, 400, "'%s' must be a number from %g to %g", name, lo, hi);
    *out = j->valuedouble;
    return 0;
}

/* An integer field in [lo, hi]. */
static int integer(const cJSON *root, const char *name, double lo, double hi, double *out, char *msg, size_t msg_len)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!j || cJSON_IsNull(j)) return 0;
    if (!cJSON_IsNumber(j) || j->valuedouble != floor(j->valuedouble) || j->valuedouble < lo || j->valuedouble > hi)
        return refuse(msg, msg_len, 400, "'%s' must be an integer from %.0f to %.0f", name, lo, hi);
    *out = j->valuedouble;
    return 0;
}

/* A boolean field. */
static int boolean(const cJSON *root, const char *name, int *out, char *msg, size_t msg_len)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!j || cJSON_IsNull(j)) return 0;
    if (!cJSON_IsBool(j)) return refuse(msg, msg_len, 400, "'%s' must be true or false", name);
    *out = cJSON_IsTrue(j);
    return 0;
}

static int prompt_of(const cJSON *root, const ksv_limits *lim, ksv_completion *c, char *msg, size_t msg_len)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!p) return refuse(msg, msg_len, 400, "'prompt' is required");
    if (cJSON_IsString(p)) {
        c->prompt = dup_text(p->valuestring);
        return c->prompt ? 0 : refuse(msg, msg_len, 503, "out of memory for the prompt");
    }
    if (!cJSON_IsArray(p))
        return refuse(msg, msg_len, 400, "'prompt' must be a string or an array of token ids");
    const int n = cJSON_GetArraySize(p);
    if (n == 0) return refuse(msg, msg_len, 400, "'prompt' is an empty array");
    if (cJSON_IsString(p->child) || cJSON_IsArray(p->child))
        return refuse(msg, msg_len, 400, "'prompt' holds several prompts; send one a request");
    if (n > lim->max_context)
        return refuse(msg, msg_len, 413, "'prompt' has %d tokens, more than the model's context of %d", n,
                      lim->max_context);
    c->ids = ks_try_malloc(sizeof *c->ids * (size_t)n);
    if (!c->ids) return refuse(msg, msg_len, 503, "out of memory for the prompt");
    int i = 0;
    for (const cJSON *e = p->child; e; e = e->next, i++) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 ||
            e->valuedouble >= (double)lim->vocab)
            return refuse(msg, msg_len, 400, "'prompt'[%d] is not a token id from 0 to %lld", i,
                          (long long)lim->vocab - 1);
        c->ids[i] = (int32_t)e->valuedouble;
    }
    c->n_ids = n;
    return 0;
}

static int stops_of(const cJSON *root, ksv_completion *c, char *msg, size_t msg_len)
{
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (!s || cJSON_IsNull(s)) return 0;
    if (cJSON_IsString(s)) {
        if (!s->valuestring[0]) return 0;
        c->stops[0] = dup_text(s->valuestring);
        if (!c->stops[0]) return refuse(msg, msg_len, 503, "out of memory for 'stop'");
        c->n_stops = 1;
        return 0;
    }
    if (!cJSON_IsArray(s) || cJSON_GetArraySize(s) > KSV_MAX_STOPS)
        return refuse(msg, msg_len, 400, "'stop' must be a string or an array of at most %d strings", KSV_MAX_STOPS);
    for (const cJSON *e = s->child; e; e = e->next) {
        if (!cJSON_IsString(e)) return refuse(msg, msg_len, 400, "'stop' holds something that is not a string");
        if (!e->valuestring[0]) continue;
        c->stops[c->n_stops] = dup_text(e->valuestring);
        if (!c->stops[c->n_stops]) return refuse(msg, msg_len, 503, "out of memory for 'stop'");
        c->n_stops++;
    }
    return 0;
}

/* A message's content as text: a string, or the "text" of its parts joined */
static int content_of(const cJSON *m, int i, ks_buf *b, char *msg, size_t msg_len)
{
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (cJSON_IsString(c)) {
        ks_buf_puts(b, c->valuestring);
        return 0;
    }
    if (cJSON_IsNull(c) || !c) return 0; /* an assistant's turn with no text */
    if (!cJSON_IsArray(c)) return refuse(msg, msg_len, 400, "'messages'[%d].content must be a string or a list of parts", i);
    for (const cJSON *part = c->child; part; part = part->next) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type"), *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 || !cJSON_IsString(text))
            return refuse(msg, msg_len, 400, "'messages'[%d].content holds a part that is not text (only text is served)", i);
        ks_buf_puts(b, text->valuestring);
    }
    return 0;
}

static int messages_of(const cJSON *root, ksv_completion *c, char *msg, size_t msg_len)
{
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!ms) return refuse(msg, msg_len, 400, "'messages' is required");
    const int n = cJSON_IsArray(ms) ? cJSON_GetArraySize(ms) : -1;
    if (n < 1 || n > KSV_MAX_MESSAGES)
        return refuse(msg, msg_len, 400, "'messages' must be a list of 1 to %d messages", KSV_MAX_MESSAGES);
    c->messages = ks_try_calloc((size_t)n, sizeof *c->messages);
    if (!c->messages) return refuse(msg, msg_len, 503, "out of memory for the messages");
    int i = 0;
    for (const cJSON *m = ms->child; m; m = m->next, i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role) || !role->valuestring[0])
            return refuse(msg, msg_len, 400, "'messages'[%d] needs a \"role\"", i);
        ks_buf b = KS_BUF_TRY;
        int rc = content_of(m, i, &b, msg, msg_len);
        c->messages[i].role = dup_text(role->valuestring);
        c->messages[i].content = rc || b.failed ? NULL : dup_text(b.len ? ks_buf_cstr(&b) : "");
        c->n_messages = i + 1;
        ks_buf_free(&b);
        if (rc) return rc;
        if (!c->messages[i].role || !c->messages[i].content) return refuse(msg, msg_len, 503, "out of memory for the messages");
    }
    return 0;
}

static int fields(const cJSON *root, const ksv_limits *lim, ksv_completion *c, int chat, char *msg, size_t msg_len)
{
    if (!cJSON_IsObject(root)) return refuse(msg, msg_len, 400, "the body must be a JSON object");
    int rc = chat ? messages_of(root, c, msg, msg_len) : prompt_of(root, lim, c, msg, msg_len);
    double max_tokens = 16, top_k = 0, seed = -1, n = 1, best_of = 1;
    if (chat) {
        max_tokens = 0; /* a chat goes on to its end by default */
        if (!rc) rc = integer(root, "max_completion_tokens", 0, (double)lim->max_context, &max_tokens, msg, msg_len);
    }
    c->temperature = 1.0;
    c->top_p = 1.0;
    if (!rc) rc = integer(root, "max_tokens", 0, (double)lim->max_context, &max_tokens, msg, msg_len);
    if (!rc) rc = number(root, "temperature", 0, 2, &c->temperature, msg, msg_len);
    if (!rc) rc = number(root, "top_p", 0, 1, &c->top_p, msg, msg_len);
    if (!rc && c->top_p <= 0) rc = refuse(msg, msg_len, 400, "'top_p' must be above 0");
    if (!rc) rc = integer(root, "top_k", 0, (double)lim->vocab, &top_k, msg, msg_len);
    if (!rc) rc = integer(root, "seed", 0, 9007199254740991.0, &seed, msg, msg_len); /* 2^53 - 1 */
    if (!rc) rc = integer(root, "n", 1, 1, &n, msg, msg_len);
    if (!rc) rc = integer(root, "best_of", 1, 1, &best_of, msg, msg_len);
    if (!rc) rc = boolean(root, "stream", &c->stream, msg, msg_len);
    if (!rc && !chat) rc = boolean(root, "echo", &c->echo, msg, msg_len);
    if (!rc) rc = boolean(root, "ignore_eos", &c->ignore_eos, msg, msg_len);
    if (!rc) rc = stops_of(root, c, msg, msg_len);
    /* log probabilities: a completion's "logprobs": N; a chat's "logprobs": true with "top_logprobs": N */
    double lp = -1, top = 0;
    int want = 0;
    if (!chat && !rc) rc = integer(root, "logprobs", 0, 20, &lp, msg, msg_len);
    if (chat && !rc) rc = boolean(root, "logprobs", &want, msg, msg_len);
    if (chat && !rc) rc = integer(root, "top_logprobs", 0, 20, &top, msg, msg_len);
    if (chat && !rc && top > 0 && !want) rc = refuse(msg, msg_len, 400, "'top_logprobs' needs \"logprobs\": true");
    c->logprobs = chat ? (want ? (int)top : -1) : (int)lp;
    c->max_tokens = (int)max_tokens;
    c->top_k = (int)top_k;
    c->has_seed = seed >= 0;
    c->seed = seed >= 0 ? (uint64_t)seed : 0;
    return rc;
}

static int parse(const char *body, size_t len, const ksv_limits *lim, ksv_completion *c, int chat, char *msg,
                 size_t msg_len)
{
    memset(c, 0, sizeof *c);
    if (len > lim->max_body)
        return refuse(msg, msg_len, 413, "the body has %zu bytes, more than the %zu this server takes", len, lim->max_body);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!root) {
        size_t at = end && end >= body && end <= body + len ? (size_t)(end - body) : 0;
        return refuse(msg, msg_len, 400, "malformed JSON at byte %zu of the body", at);
    }
    int rc = fields(root, lim, c, chat, msg, msg_len);
    cJSON_Delete(root);
    if (rc) ksv_completion_free(c);
    return rc;
}

int ksv_completion_parse(const char *body, size_t len, const ksv_limits *lim, ksv_completion *c, char *msg,
                         size_t msg_len)
{
    return parse(body, len, lim, c, 0, msg, msg_len);
}

int ksv_chat_parse(const char *body, size_t len, const ksv_limits *lim, ksv_completion *c, char *msg, size_t msg_len)
{
    return parse(body, len, lim, c, 1, msg, msg_len);
}
