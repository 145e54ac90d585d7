/*
 * server.h — `kiln serve`: an OpenAI-compatible HTTP/1.1 server over one
 * session's scheduler (runtime/sched.h), on libmicrohttpd.
 *
 *     ksv_opts o = ksv_defaults();
 *     o.port = 8000;
 *     ksv_serve(engine, session, tok, &o, &stop, &d);   // until stop becomes nonzero
 *
 * Threads: the calling thread runs the engine — it takes new requests from
 * an inbox, tokenizes them, submits them to the scheduler and runs its
 * steps; libmicrohttpd runs a thread per connection (at most
 * opts.max_connections), which parses the request, queues it and waits for
 * its text, one mutex between them. A bad request is answered with its
 * status and an OpenAI-style error object; the others are served on.
 *
 * Endpoints:
 *   POST /v1/completions  (server/completion_request.h's fields; stream: true
 *                         answers server-sent events, `data: {...}` a piece of
 *                         text, then a chunk with finish_reason, then
 *                         `data: [DONE]`)
 *   POST /v1/chat/completions  "messages" rendered by the engine's chat template
 *                         (server/chat_template.h; kiln build keeps the checkpoint's),
 *                         answered as chat.completion (a stream: chat.completion.chunk
 *                         deltas, the role first)
 *   GET  /v1/models       the one model
 *   GET  /health          {"status":"ok"}
 *   GET  /metrics         Prometheus text: requests by status, tokens,
 *                         queue, running batch, KV blocks in use,
 *                         prefix-cache lookups and hits, time-to-first-token
 *                         and per-token latency histograms
 * Errors: 400 malformed JSON or field, 401 without the key when one is set
 * (`Authorization: Bearer KEY`), 404 another path, 405 another method, 413
 * a body or prompt too long, 429 the queue full.
 *
 * Prefix: ksv_ (server).
 */
#ifndef KILN_SERVER_H
#define KILN_SERVER_H

#include <signal.h>
#include <stddef.h>

#include "runtime/session.h"
#include "runtime/text/tokenizer.h"

typedef struct ksv_opts {
    const char *host;       /* the address to listen on: "127.0.0.1" */
    int port;               /* 0: any free one (printed) */
    int max_batch;          /* requests running at once (the session's sequences bound it) */
    int max_queue;          /* requests waiting at most; past it: 429 */
    const char *api_key;    /* NULL: none asked */
    const char *model;      /* the model's name in answers */
    size_t max_body;        /* bytes a request body at most */
    int idle_timeout;       /* seconds a connection may idle */
    int max_connections;    /* connections at once */
} ksv_opts;

/* 127.0.0.1:8000, a batch of 32, a queue of 256, no key, bodies of 1 MiB, 30 s idle, 512 connections. */
ksv_opts ksv_defaults(void);

/* Serve until *stop is nonzero (a signal handler sets it); prints `kiln serve: listening on
 * http://HOST:PORT` on stderr once it listens. 0, or -1 after reporting (the address cannot be had). */
int ksv_serve(const krt_engine *e, krt_session *s, const krt_tok *tok, const ksv_opts *o,
              volatile sig_atomic_t *stop, ks_diag *d);

#endif
