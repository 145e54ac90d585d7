/* cmd_serve.c — `kiln serve`: the engine behind an OpenAI-compatible HTTP server (server/server.h). */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "runtime/generate.h"
#ifdef KILN_HAVE_SERVER
#include "server/server.h"
#endif

static const char serve_help[] =
    "usage: kiln serve ENGINE [--host 127.0.0.1] [--port 8000] [--max-batch N] [--max-queue N]\n"
    "                  [--api-key KEY] [--model NAME] [--kv-blocks N | --kv-fraction F]\n"
    "\n"
    "Answer OpenAI-style requests over HTTP/1.1 until interrupted (SIGINT, SIGTERM):\n"
    "POST /v1/completions (prompt text or token ids, max_tokens, temperature, top_p,\n"
    "top_k, seed, stop, stream, echo), GET /v1/models, /health and /metrics\n"
    "(Prometheus). Requests share each step of the engine (continuous batching):\n"
    "prompts run in chunks beside the decoding ones, full KV blocks of one prompt\n"
    "serve the next that starts alike (prefix caching), and when the KV cache runs\n"
    "out, the newest requests wait and are recomputed. A bad request gets its HTTP\n"
    "status and an OpenAI error object; the others are served on.\n"
    "\n"
    "  --host ADDR          IPv4 address to listen on (default 127.0.0.1)\n"
    "  --port N             port (default 8000; 0: any free one, printed)\n"
    "  --max-batch N        requests running at once (default 32)\n"
    "  --max-queue N        requests waiting at most; more are answered 429 (default 256)\n"
    "  --api-key KEY        answer 401 unless a request says `Authorization: Bearer KEY`\n"
    "  --model NAME         the model's name in answers and /v1/models (default: the engine's file)\n"
    "  --kv-blocks N        KV-cache blocks of 16 positions (default: enough for every running request's\n"
    "                       full context on the CPU; on a GPU --kv-fraction of the free memory)\n"
    "  --kv-fraction F      GPU: the KV cache's share of the memory free after the weights (default 0.9)\n";

#ifdef KILN_HAVE_SERVER
static volatile sig_atomic_t stop_flag;
static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}
#endif

int kc_cmd_serve(int argc, char **argv)
{
    const char *pos[1], *host = NULL, *port = NULL, *max_batch = NULL, *max_queue = NULL, *api_key = NULL,
               *model = NULL, *kv_blocks = NULL, *kv_fraction = NULL;
    int n_pos = 0;
    const kc_option opts[] = {
        {"--host", 1, &host, NULL},           {"--port", 1, &port, NULL},
        {"--max-batch", 1, &max_batch, NULL}, {"--max-queue", 1, &max_queue, NULL},
        {"--api-key", 1, &api_key, NULL},     {"--model", 1, &model, NULL},
        {"--kv-blocks", 1, &kv_blocks, NULL}, {"--kv-fraction", 1, &kv_fraction, NULL},
        {NULL, 0, NULL, NULL},
    };
    int rc = kc_parse_args(argc, argv, opts, pos, 1, &n_pos, serve_help);
    if (rc) return rc < 0 ? 2 : 0;
    if (n_pos != 1) {
        fprintf(stderr, "kiln serve: error: give one engine file\n%s", serve_help);
        return 2;
    }
#ifndef KILN_HAVE_SERVER
    (void)host, (void)port, (void)max_batch, (void)max_queue, (void)api_key, (void)model, (void)kv_blocks,
        (void)kv_fraction;
    fprintf(stderr, "kiln serve: error: this kiln was built without the server (cmake -DKILN_SERVER=ON, with "
                    "libmicrohttpd)\n");
    return 1;
#else
    ksv_opts o = ksv_defaults();
    int64_t v;
    double f = 0;
    if (host) o.host = host;
    if (port) {
        if (kc_parse_int("serve", "--port", port, 0, 65535, &v)) return 2;
        o.port = (int)v;
    }
    if (max_batch) {
        if (kc_parse_int("serve", "--max-batch", max_batch, 1, 4096, &v)) return 2;
        o.max_batch = (int)v;
    }
    if (max_queue) {
        if (kc_parse_int("serve", "--max-queue", max_queue, 1, 1000000, &v)) return 2;
        o.max_queue = (int)v;
    }
    o.api_key = api_key;
    o.model = model ? model : pos[0];
    krt_session_opts so = {.max_seqs = o.max_batch};
    if (kv_blocks) {
        if (kc_parse_int("serve", "--kv-blocks", kv_blocks, 1, 1 << 30, &v)) return 2;
        so.n_blocks = (int)v;
    }
    if (kv_fraction) {
        if (kc_parse_number("serve", "--kv-fraction", kv_fraction, 1e-6, 1, &f)) return 2;
        so.kv_fraction = f;
    }
    ks_diag d = {0};
    krt_engine *e = krt_engine_open(pos[0], &d);
    krt_session *s = e && !d.errors ? krt_session_new(e, &so, &d) : NULL;
    krt_tok *tok = s && e->tokenizer ? krt_engine_tokenizer(e, &d) : NULL;
    rc = 1;
    if (s && !d.errors) {
        struct sigaction sa = {0};
        sa.sa_handler = on_signal;
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        signal(SIGPIPE, SIG_IGN); /* a client gone mid-answer is a failed write, not the end */
        rc = ksv_serve(e, s, tok, &o, &stop_flag, &d) == 0 ? 0 : 1;
        if (rc == 0) fprintf(stderr, "kiln serve: stopped\n");
    }
    krt_tok_free(tok);
    krt_session_free(s);
    krt_engine_close(e);
    return rc;
#endif
}
