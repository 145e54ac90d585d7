/*
 * test_sched.c — continuous batching (runtime/sched.h) on the reference
 * interpreter, against krt_generate run alone: TinyStories-656K built for the
 * CPU from $KILN_SHARED (or the ENGINE given).
 *
 * Checks, each against what the same request gives alone (its own session):
 *  - 32 requests at once, prompts of 1 to 94 tokens and 1 to 40 new tokens,
 *    greedy, in steps of at most 48 tokens (prompts run in chunks beside the
 *    decoding ones): every request's ids and text exactly;
 *  - seeded sampling (temperature, top-k, top-p, each its seed): the same;
 *  - a KV cache of 24 blocks of 16 positions for 12 requests that need about
 *    70 together: requests are preempted and recomputed (the count says so),
 *    and every one finishes with its exact text;
 *  - a request cancelled after its third token: its done says "cancelled",
 *    the others finish as alone, and every sequence is gone at the end;
 *  - prefix caching: requests that share a prompt's first blocks take them
 *    from the cache (counted) and give what they give alone; with the cache
 *    off, nothing is taken;
 *  - stop strings and end of sequence end requests as alone;
 *  - a request the whole cache cannot hold fails with its message, the
 *    others finish; a prompt past the context is refused at submit;
 *  - runtime/kiln.h's scheduler: three text prompts at once give
 *    kiln_generate's texts, a cancelled one says so.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/kiln.h"
#include "runtime/sched.h"
#include "tests/check.h"
#include "tests/session/test_engine.h"

static const krt_engine *engine;
static krt_tok *tok;

enum { MAX_REQ = 40 };

/* What a request produced: its ids, its text, how it ended. */
typedef struct outcome {
    int32_t ids[256];
    int n;
    ks_buf text;
    int done;            /* its done was called (scheduler), or it returned (alone) */
    char error[160];     /* done's error, "" when none */
    krt_gen_end end;
    int cancel_after;    /* > 0: cancel the request after this many tokens (scheduler) */
    krt_sched *q;        /* for the cancel */
    int id;
} outcome;

static int on_token(void *ctx, int32_t id)
{
    outcome *o = ctx;
    if (o->n < 256) o->ids[o->n++] = id;
    if (o->cancel_after && o->n == o->cancel_after) krt_sched_cancel(o->q, o->id);
    return 0;
}

static int on_text(void *ctx, const char *text, size_t len)
{
    ks_buf_put(&((outcome *)ctx)->text, text, len);
    return 0;
}

static void on_done(void *ctx, int id, const krt_gen_stats *st, const char *error)
{
    outcome *o = ctx;
    CHECK(o->id == id);
    CHECK_MSG(!o->done, "request %d ended twice", id);
    o->done = 1;
    o->end = st->end;
    snprintf(o->error, sizeof o->error, "%s", error ? error : "");
}

/* The requests of a test: prompt i of len[i] ids, its options. */
typedef struct batch {
    int n;
    int32_t prompts[MAX_REQ][128];
    int len[MAX_REQ];
    krt_gen_opts o[MAX_REQ];
} batch;

static krt_session *session(int max_seqs, int n_blocks)
{
    ks_diag d = {0};
    krt_session_opts so = {.max_seqs = max_seqs, .n_blocks = n_blocks};
    krt_session *s = krt_session_new(engine, &so, &d);
    if (!s) exit(1);
    return s;
}

/* Each request alone, in a session of its own. */
static void run_alone(const batch *b, outcome *out)
{
    for (int i = 0; i < b->n; i++) {
        krt_session *s = session(1, 0);
        ks_diag d = {0};
        memset(&out[i], 0, sizeof out[i]);
        krt_session_seq_add(s, 0, &d);
        krt_gen_callbacks cb = {.on_text = on_text, .on_token = on_token, .ctx = &out[i]};
        krt_gen_stats st;
        int rc = krt_generate(s, 0, tok, b->prompts[i], b->len[i], &b->o[i], &cb, &st, &d);
        CHECK_MSG(rc >= 0, "request %d alone failed", i);
        out[i].done = 1;
        out[i].end = st.end;
        krt_session_free(s);
    }
}

/* All at once through a scheduler; returns its counts. */
static krt_sched_counts run_sched(const batch *b, outcome *out, krt_session *s, const krt_sched_opts *so,
                                  const int *cancel_after)
{
    ks_diag d = {0};
    krt_sched *q = krt_sched_new(s, tok, so, &d);
    if (!CHECK(q != NULL)) exit(1);
    for (int i = 0; i < b->n; i++) {
        memset(&out[i], 0, sizeof out[i]);
        out[i].q = q;
        out[i].cancel_after = cancel_after ? cancel_after[i] : 0;
        krt_gen_callbacks cb = {.on_text = on_text, .on_token = on_token, .ctx = &out[i]};
        out[i].id = krt_sched_submit(q, b->prompts[i], b->len[i], &b->o[i], &cb, on_done, &out[i], &d);
        CHECK(out[i].id >= 0);
    }
    int steps = 0;
    while (krt_sched_busy(q) && steps < 100000) {
        CHECK(krt_sched_step(q, &d) == 0);
        steps++;
    }
    krt_sched_counts c = krt_sched_counts_of(q);
    CHECK(c.waiting == 0 && c.running == 0);
    krt_sched_free(q);
    /* every sequence gone: its blocks back */
    for (int seq = 0; seq < krt_session_max_seqs(s); seq++) CHECK_MSG(krt_session_seq_len(s, seq) < 0, "sequence %d left", seq);
    return c;
}

/* The scheduler's outcomes equal the alone ones (but for requests cancelled). */
static void compare(const char *what, const batch *b, const outcome *alone, const outcome *got)
{
    int same = 0;
    for (int i = 0; i < b->n; i++) {
        CHECK_MSG(got[i].done, "%s: request %d never ended", what, i);
        if (got[i].cancel_after) continue;
        int ok = got[i].n == alone[i].n && memcmp(got[i].ids, alone[i].ids, sizeof(int32_t) * (size_t)got[i].n) == 0 &&
                 got[i].text.len == alone[i].text.len &&
                 memcmp(got[i].text.data, alone[i].text.data, got[i].text.len) == 0 && got[i].end == alone[i].end &&
                 !got[i].error[0];
        CHECK_MSG(ok, "%s: request %d: %d ids, end %d, error '%s' against %d ids, end %d alone; text '%s' against '%s'",
                  what, i, got[i].n, (int)got[i].end, got[i].error, alone[i].n, (int)alone[i].end,
                  ks_buf_cstr((ks_buf *)&got[i].text), ks_buf_cstr((ks_buf *)&alone[i].text));
        same += ok;
    }
    printf("%s: %d of %d requests as alone\n", what, same, b->n);
}

static void free_outcomes(outcome *o, int n)
{
    for (int i = 0; i < n; i++) ks_buf_free(&o[i].text);
}

/* n requests: prompt i a BOS and 3 + (37 i + 11 j) mod 1900 ids, lengths spread over 1..max_len */
static void make_batch(batch *b, int n, int max_len, int max_new_top)
{
    memset(b, 0, sizeof *b);
    b->n = n;
    for (int i = 0; i < n; i++) {
        b->len[i] = 1 + (i * 29) % max_len;
        b->prompts[i][0] = engine->desc.bos >= 0 ? engine->desc.bos : 1;
        for (int j = 1; j < b->len[i]; j++) b->prompts[i][j] = 3 + (37 * i + 11 * j) % 1900;
        b->o[i] = krt_gen_defaults();
        b->o[i].max_new = 1 + (i * 13) % max_new_top;
    }
}

static void test_greedy(void)
{
    static batch b;
    static outcome alone[MAX_REQ], got[MAX_REQ];
    make_batch(&b, 32, 94, 40);
    run_alone(&b, alone);
    krt_session *s = session(32, 0);
    krt_sched_opts so = {.token_budget = 48};
    krt_sched_counts c = run_sched(&b, got, s, &so, NULL);
    compare("32 greedy requests, steps of 48 tokens", &b, alone, got);
    CHECK(c.preemptions == 0);
    printf("  %ld steps, %ld prompt tokens, %ld decode tokens\n", c.steps, c.prefill_tokens, c.decode_tokens);
    krt_session_free(s);
    free_outcomes(alone, b.n);
    free_outcomes(got, b.n);
}

static void test_sampling(void)
{
    static batch b;
    static outcome alone[MAX_REQ], got[MAX_REQ];
    make_batch(&b, 12, 40, 30);
    for (int i = 0; i < b.n; i++) {
        b.o[i].sampling.temperature = 0.7f + 0.05f * (float)(i % 4);
        b.o[i].sampling.top_k = i % 3 ? 0 : 40;
        b.o[i].sampling.top_p = i % 2 ? 0.9f : 1.0f;
        b.o[i].sampling.seed = 1000 + (uint64_t)i;
    }
    run_alone(&b, alone);
    krt_session *s = session(8, 0); /* 12 requests, 8 at a time */
    krt_sched_counts c = run_sched(&b, got, s, NULL, NULL);
    compare("12 seeded sampled requests, 8 at a time", &b, alone, got);
    (void)c;
    krt_session_free(s);
    free_outcomes(alone, b.n);
    free_outcomes(got, b.n);
}

static void test_preemption(void)
{
    static batch b;
    static outcome alone[MAX_REQ], got[MAX_REQ];
    make_batch(&b, 12, 60, 40);
    for (int i = 0; i < b.n; i++) b.o[i].max_new = 40 + i % 5, b.o[i].ignore_eos = 1;
    run_alone(&b, alone);
    krt_session *s = session(12, 24); /* 24 blocks of 16: ~5 of these requests at once */
    krt_sched_counts c = run_sched(&b, got, s, NULL, NULL);
    compare("12 requests in 24 KV blocks (preempted and recomputed)", &b, alone, got);
    CHECK_MSG(c.preemptions > 0, "no preemption happened");
    printf("  %ld preemptions, %ld recomputed tokens taken from the prefix cache\n", c.preemptions, c.cached_tokens);
    krt_session_free(s);
    free_outcomes(alone, b.n);
    free_outcomes(got, b.n);
}

/* 10 requests whose prompts share their first 70 tokens (4 blocks of 16), 3 at a time: the later ones take
 * the first's blocks from the prefix cache, and give what they give alone */
static void test_prefix_cache(void)
{
    static batch b;
    static outcome alone[MAX_REQ], got[MAX_REQ];
    make_batch(&b, 10, 30, 20);
    for (int i = 0; i < b.n; i++) {
        b.len[i] = 70 + 3 * i;
        for (int j = 1; j < b.len[i]; j++) b.prompts[i][j] = j < 70 ? 3 + (17 * j) % 1900 : 3 + (37 * i + 11 * j) % 1900;
    }
    run_alone(&b, alone);
    krt_session *s = session(3, 0);
    krt_sched_counts c = run_sched(&b, got, s, NULL, NULL);
    compare("10 requests sharing a 70-token prefix, 3 at a time", &b, alone, got);
    CHECK_MSG(c.cached_tokens >= 7 * 64, "%ld prompt tokens from the cache", c.cached_tokens);
    printf("  %ld of %ld prompt tokens from the prefix cache (%ld of %ld blocks found)\n", c.cached_tokens,
           c.cached_tokens + c.prefill_tokens, c.prefix_hits, c.prefix_lookups);
    /* the same without the cache: nothing taken */
    static outcome plain[MAX_REQ];
    krt_session_free(s);
    s = session(3, 0);
    krt_sched_opts so = {.no_prefix_cache = 1};
    c = run_sched(&b, plain, s, &so, NULL);
    compare("the same without the prefix cache", &b, alone, plain);
    CHECK(c.cached_tokens == 0 && c.prefix_lookups == 0);
    krt_session_free(s);
    free_outcomes(alone, b.n);
    free_outcomes(got, b.n);
    free_outcomes(plain, b.n);
}

static void test_cancel_and_stops(void)
{
    static batch b;
    static outcome alone[MAX_REQ], got[MAX_REQ];
    make_batch(&b, 6, 30, 40);
    b.o[1].max_new = 60;
    b.o[2].max_new = 200; /* to its end of sequence */
    run_alone(&b, alone);
    /* request 1's stop string: four bytes from the middle of its text alone, so that it stops there */
    static char stop[8];
    static const char *stops[1] = {stop};
    CHECK(alone[1].text.len > 8);
    memcpy(stop, alone[1].text.data + alone[1].text.len / 2, 4);
    b.o[1].stops = stops, b.o[1].n_stops = 1;
    free_outcomes(alone, b.n);
    run_alone(&b, alone);
    const int cancel_after[MAX_REQ] = {0, 0, 0, 3};
    krt_session *s = session(6, 0);
    run_sched(&b, got, s, NULL, cancel_after);
    compare("stop strings, end of sequence, a request cancelled", &b, alone, got);
    CHECK_STR(got[3].error, "cancelled");
    CHECK(got[3].n == 3);
    CHECK(alone[1].end == KRT_GEN_STOP);
    CHECK(alone[2].end == KRT_GEN_EOS);
    krt_session_free(s);
    free_outcomes(alone, b.n);
    free_outcomes(got, b.n);
}

static void test_too_large(void)
{
    static batch b;
    static outcome got[MAX_REQ];
    make_batch(&b, 3, 10, 5);
    b.len[1] = 100; /* 100 + 40 positions: 9 blocks of 16, in a cache of 4 */
    for (int j = 1; j < 100; j++) b.prompts[1][j] = 3 + j;
    b.o[1].max_new = 40;
    krt_session *s = session(3, 4);
    run_sched(&b, got, s, NULL, NULL);
    CHECK_STR(got[1].error, "the KV cache cannot hold this request's tokens");
    CHECK(!got[0].error[0] && !got[2].error[0] && got[0].n > 0 && got[2].n > 0);
    /* a prompt past the context is refused at submit */
    ks_diag d = {.quiet = 1};
    krt_sched *q = krt_sched_new(s, tok, NULL, &d);
    static int32_t big[1 << 12];
    krt_gen_opts o = krt_gen_defaults();
    CHECK(krt_sched_submit(q, big, krt_session_max_context(s) + 1, &o, NULL, NULL, NULL, &d) == -1);
    CHECK(d.errors == 1);
    krt_sched_free(q);
    krt_session_free(s);
    free_outcomes(got, b.n);
}

/* ---- through runtime/kiln.h ---------------------------------------------------------------------- */
typedef struct api_out {
    ks_buf text;
    int generated;
    char error[64];
    int ended;
} api_out;

static int api_text(void *ctx, const char *text, size_t len)
{
    ks_buf_put(&((api_out *)ctx)->text, text, len);
    return 0;
}

static void api_done(void *ctx, int request, int generated, const char *error)
{
    (void)request;
    api_out *o = ctx;
    o->ended++;
    o->generated = generated;
    snprintf(o->error, sizeof o->error, "%s", error ? error : "");
}

static void test_api(const char *path)
{
    static const char *const prompts[3] = {"Once upon a time", "The little dog", "Lily wanted to"};
    char err[512];
    kiln_engine *e = kiln_engine_open(path, err, sizeof err);
    if (!CHECK(e != NULL)) return;
    kiln_session *s = kiln_session_new(e, NULL, err, sizeof err);
    kiln_generate_opts go = kiln_generate_defaults();
    go.max_new = 24;
    api_out alone[3], got[4];
    memset(alone, 0, sizeof alone);
    memset(got, 0, sizeof got);
    for (int i = 0; i < 3; i++) {
        CHECK(kiln_generate(s, 0, prompts[i], &go, api_text, &alone[i], err, sizeof err) > 0);
        kiln_seq_free(s, 0);
    }
    kiln_scheduler *q = kiln_scheduler_new(s, 0, 0, err, sizeof err);
    if (!CHECK(q != NULL)) return;
    int ids[4];
    for (int i = 0; i < 4; i++)
        ids[i] = kiln_submit(q, prompts[i % 3], &go, api_text, &got[i], api_done, &got[i], err, sizeof err);
    CHECK(ids[0] >= 0 && ids[3] >= 0 && kiln_cancel(q, ids[3]) == 0 && kiln_cancel(q, 12345) == -1);
    while (kiln_scheduler_busy(q)) CHECK(kiln_scheduler_step(q, err, sizeof err) == 0);
    for (int i = 0; i < 3; i++) {
        CHECK(got[i].ended == 1 && !got[i].error[0] && got[i].generated == 24);
        CHECK_TEXT("kiln_submit's text", ks_buf_cstr(&got[i].text), ks_buf_cstr(&alone[i].text));
    }
    CHECK(got[3].ended == 1);
    CHECK_STR(got[3].error, "cancelled");
    kiln_scheduler_free(q);
    kiln_session_free(s);
    kiln_engine_close(e);
    for (int i = 0; i < 4; i++) ks_buf_free(&got[i].text);
    for (int i = 0; i < 3; i++) ks_buf_free(&alone[i].text);
    printf("runtime/kiln.h's scheduler: 3 prompts as kiln_generate gives them, one cancelled\n");
}

int main(int argc, char **argv)
{
    ks_diag d = {0};
    test_engine te;
    krt_engine *e = test_engine_open(argc == 2 ? argv[1] : NULL, &te, &d);
    if (!e) return 1;
    engine = e;
    tok = krt_engine_tokenizer(e, &d);
    if (!tok) return 1;
    test_greedy();
    test_sampling();
    test_preemption();
    test_prefix_cache();
    test_cancel_and_stops();
    test_too_large();
    test_api(te.path);
    krt_tok_free(tok);
    test_engine_close(&te, e);
    return check_finish("sched");
}
