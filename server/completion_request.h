/*
 * completion_request.h — the body of a POST /v1/completions (OpenAI's
 * completions API) as kiln serves it: parsed and checked, or refused with
 * the HTTP status and the message an OpenAI-style error object carries.
 *
 *     ksv_completion c;
 *     char msg[256];
 *     int status = ksv_completion_parse(body, len, &limits, &c, msg, sizeof msg);
 *     if (status) ... answer status with msg
 *     ksv_completion_free(&c);
 *
 * Fields (others are ignored, as OpenAI's servers do with unknown ones):
 *   prompt       a string, or an array of token ids (one prompt; a list of
 *                prompts is refused)
 *   max_tokens   tokens to generate, 0 to the context (default 16)
 *   temperature  0 to 2 (default 1; 0: greedy)
 *   top_p        (0, 1] (default 1); top_k (kiln's): 0 (off) or more
 *   seed         an integer from 0 (default: the request's number)
 *   stop         a string or up to 4 strings
 *   stream       true: server-sent events, a chunk a piece of text
 *   echo         true: the prompt's text before the completion
 *   ignore_eos   true: go on past the model's end-of-sequence tokens (vLLM's)
 *   logprobs     an integer 0 to 20: each generated token's log probability and that many
 *                alternatives (a chat: "logprobs": true and "top_logprobs" 0 to 20)
 *   n, best_of   1 or absent
 *
 * A chat (POST /v1/chat/completions, ksv_chat_parse) has "messages" instead
 * of "prompt": the server renders them with the model's chat template.
 *
 * Prefix: ksv_ (server).
 */
#ifndef KILN_SERVER_COMPLETION_REQUEST_H
#define KILN_SERVER_COMPLETION_REQUEST_H

#include <stddef.h>
#include <stdint.h>

enum { KSV_MAX_STOPS = 4, KSV_MAX_MESSAGES = 4096 };

/* A chat message: its role and its text (a content of parts: their "text" parts joined). */
typedef struct ksv_message {
    char *role, *content; /* owned */
} ksv_message;

typedef struct ksv_limits {
    int64_t vocab;      /* token ids are below it */
    int max_context;    /* positions a sequence; a prompt of ids may not pass it */
    size_t max_body;    /* bytes of a body at most (413 past it) */
} ksv_limits;

typedef struct ksv_completion {
    char *prompt;                  /* the text (owned), or NULL when ids are given */
    int32_t *ids;                  /* [n_ids] the prompt's token ids (owned), or NULL */
    int n_ids;
    int max_tokens;
    double temperature, top_p;
    int top_k;
    uint64_t seed;
    int has_seed;
    char *stops[KSV_MAX_STOPS];    /* owned */
    int n_stops;
    int stream, echo, ignore_eos;
    int logprobs;                  /* -1: none; else the alternatives wanted a token (0 to 20) */
    ksv_message *messages;         /* [n_messages] a chat's (ksv_chat_parse), owned; NULL for a completion */
    int n_messages;
} ksv_completion;

/* 0 and c filled, or an HTTP status (400 malformed JSON or field, 413 too long) with the message in msg
 * (c then holds nothing to free). */
int ksv_completion_parse(const char *body, size_t len, const ksv_limits *lim, ksv_completion *c, char *msg,
                         size_t msg_len);
/* The body of a POST /v1/chat/completions: "messages" (a list of {"role", "content"}: content a string,
 * or a list of parts whose "text" parts are joined) in place of "prompt" (and "echo"); the other fields as
 * a completion's, "max_completion_tokens" as "max_tokens". */
int ksv_chat_parse(const char *body, size_t len, const ksv_limits *lim, ksv_completion *c, char *msg, size_t msg_len);
void ksv_completion_free(ksv_completion *c);

#endif
