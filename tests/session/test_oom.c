/*
 * test_oom.c — out of memory inside runtime/kiln.h's calls is an error the
 * caller gets back, never a crash, a leak or half-changed state.
 *
 * On tinystories-656k built for the CPU (from $KILN_SHARED), one run is
 *
 *     kiln_engine_open -> kiln_session_new -> kiln_seq_add(0) -> kiln_step
 *     (2 tokens of sequence 0) -> kiln_seq_fork(0, 2) -> kiln_step (1 token of
 *     sequence 2) -> kiln_generate (sequence 1, a short prompt, 4 tokens) ->
 *     kiln_session_free -> kiln_engine_close
 *
 * (few tokens: the run is repeated twice per allocation, over 1000 times, and
 * the sanitizer build runs the model unoptimized)
 *
 * and the test runs it once with every allocation succeeding, then again
 * for n = 1, 2, 3, ... with allocation n made to fail (support's
 * ks_alloc_fail_after), until a run meets no failure: every allocation of
 * the run has failed once. Each time, the call that met the failure must
 * return NULL or -1 with "out of memory" in its message; with memory back,
 * the state it left must be the state before it: a failed open or new left
 * nothing (the ASan build that tests/run.sh runs checks no leak), a failed
 * step appended nothing and a failed generate left its sequence as it was,
 * so the same call again, and the rest of the run, give the logits and the
 * text of the run without failures, bit for bit. Then the same with every
 * allocation from the n-th on failing (the error paths get no memory
 * either). Last, a session whose KV cache cannot be had (n_blocks huge)
 * fails with a message that names the cache and its size, no injection
 * needed. KILN_OOM_VERBOSE=1 prints the message of every failed call.
 *
 *   test_oom           tinystories-656k built for the CPU, into a temporary folder
 *   test_oom ENGINE    that engine, through its backend (tests/cuda/cuda_runtime.sh
 *                      runs a CUDA engine through the CPU stand-in for libcuda: the
 *                      CUDA backend's host code), in a lighter run (one token a
 *                      step, an empty prompt, one token generated: the stand-in runs
 *                      the kernels slowly), each allocation failing once only; the
 *                      huge KV cache is left out
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compiler/driver.h"
#include "runtime/kiln.h"
#include "tests/check.h"

/* An allocation of terabytes must come back NULL under AddressSanitizer too,
 * as it does from glibc, not end the program (the ASAN_OPTIONS that
 * tests/run.sh sets add to this). */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

enum { N_GEN = 4 };

/* What a run produced, to compare with the run without failures. */
typedef struct outcome {
    float logits[3][2048]; /* step 1's two rows, then step 2's one (tinystories: vocab 2048) */
    char text[512];        /* what kiln_generate's callback got */
    size_t text_len;       /* bytes in text */
    int generated;         /* kiln_generate's result */
    int seq_len[3];        /* the sequences' lengths at the end */
} outcome;

static const char *engine_path;
static int64_t vocab;
/* The run's sizes: the built-in engine's, or the lighter run of an engine given. */
static int n_first = 2;                      /* tokens of the first step */
static int n_gen = N_GEN;                    /* tokens kiln_generate generates */
static const char *prompt = "Once upon a time"; /* kiln_generate's prompt */

static int on_text(void *ctx, const char *text, size_t len)
{
    outcome *o = ctx;
    if (o->text_len + len < sizeof o->text) {
        memcpy(o->text + o->text_len, text, len);
        o->text_len += len;
    }
    return 0;
}

/* A call failed, during the injection: its message says out of memory, and
 * whether the failure stays with it (with memory back, the run goes on from
 * the state before the call) is checked by the caller. */
static void failed_cleanly(const char *call, const char *err, long n)
{
    if (getenv("KILN_OOM_VERBOSE")) printf("allocation %ld: %s: %s", n, call, err); /* each message, to read */
    CHECK_MSG(strstr(err, "out of memory"), "allocation %ld: %s failed without saying out of memory: \"%s\"", n,
              call, err);
}

/* One run; n > 0: allocation n fails (every one from n on with all_after).
 * Returns how many allocations the injection failed (0: the run met none).
 * A call that fails is made again with memory back, so the run always ends
 * with the same outcome. */
static long run(long n, int all_after, outcome *out)
{
    char err[512];
    memset(out, 0, sizeof *out);
    if (n > 0) ks_alloc_fail_after(n, all_after);
    long failed = 0;
#define AGAIN(call, what)                                                      \
    do {                                                                       \
        long f_ = ks_alloc_failures();                                         \
        if (f_ > 0) {                                                          \
            failed += f_;                                                      \
            failed_cleanly(what, err, n);                                      \
            ks_alloc_fail_after(0, 0);                                         \
            call;                                                              \
        }                                                                      \
    } while (0)

    err[0] = 0;
    kiln_engine *e = kiln_engine_open(engine_path, err, sizeof err);
    if (!e) {
        CHECK(ks_alloc_failures() > 0);
        AGAIN(e = kiln_engine_open(engine_path, err, sizeof err), "kiln_engine_open");
    } else {
        CHECK(ks_alloc_failures() == 0); /* a failure that the call did not report */
    }
    if (!e) {
        fprintf(stderr, "cannot open the engine: %s", err);
        exit(1);
    }

    kiln_session_opts so = {.max_seqs = 3, .max_context = 64, .block_size = 4};
    kiln_session *s = kiln_session_new(e, &so, err, sizeof err);
    if (!s) {
        CHECK(ks_alloc_failures() > 0);
        AGAIN(s = kiln_session_new(e, &so, err, sizeof err), "kiln_session_new");
    }
    CHECK(s != NULL);
    if (!s) exit(1);
    vocab = kiln_vocab_size(s);

    int rc = kiln_seq_add(s, 0, err, sizeof err);
    if (rc != 0) AGAIN(rc = kiln_seq_add(s, 0, err, sizeof err), "kiln_seq_add");
    CHECK(rc == 0);

    int32_t ids[2] = {1, 415}, seqs[2] = {0, 0};
    rc = kiln_step(s, n_first, ids, seqs, out->logits[0], err, sizeof err);
    if (rc != 0) {
        CHECK(kiln_seq_len(s, 0) == 0); /* nothing appended */
        AGAIN(rc = kiln_step(s, n_first, ids, seqs, out->logits[0], err, sizeof err), "kiln_step");
    }
    CHECK(rc == 0);

    rc = kiln_seq_fork(s, 0, 2, err, sizeof err);
    if (rc != 0) {
        CHECK(kiln_seq_len(s, 2) == -1);
        AGAIN(rc = kiln_seq_fork(s, 0, 2, err, sizeof err), "kiln_seq_fork");
    }
    CHECK(rc == 0);

    int32_t next = 600, two = 2; /* a token of sequence 2: its shared last block is copied first */
    rc = kiln_step(s, 1, &next, &two, out->logits[2], err, sizeof err);
    if (rc != 0) {
        CHECK(kiln_seq_len(s, 2) == n_first && kiln_seq_len(s, 0) == n_first);
        AGAIN(rc = kiln_step(s, 1, &next, &two, out->logits[2], err, sizeof err), "kiln_step (forked)");
    }
    CHECK(rc == 0);

    kiln_generate_opts go = kiln_generate_defaults();
    go.max_new = n_gen;
    int g = kiln_generate(s, 1, prompt, &go, on_text, out, err, sizeof err);
    if (g < 0) {
        CHECK(kiln_seq_len(s, 1) == -1); /* the sequence it added is gone again */
        out->text_len = 0;               /* the text of the failed call is not the run's */
        AGAIN(g = kiln_generate(s, 1, prompt, &go, on_text, out, err, sizeof err),
              "kiln_generate");
    }
    out->generated = g;
    for (int q = 0; q < 3; q++) out->seq_len[q] = kiln_seq_len(s, q);
    failed += ks_alloc_failures();
    ks_alloc_fail_after(0, 0);
#undef AGAIN
    kiln_session_free(s);
    kiln_engine_close(e);
    return failed;
}

static int same_outcome(const outcome *a, const outcome *b)
{
    return memcmp(a->logits, b->logits, sizeof a->logits) == 0 && a->text_len == b->text_len &&
           memcmp(a->text, b->text, a->text_len) == 0 && a->generated == b->generated &&
           memcmp(a->seq_len, b->seq_len, sizeof a->seq_len) == 0;
}

/* Fail allocation n = 1, 2, ... until a run meets none. Returns the number of runs. */
static long fail_each(int all_after, const outcome *want)
{
    static outcome got;
    long n = 1;
    for (;; n++) {
        int before = failures;
        long failed = run(n, all_after, &got);
        CHECK_MSG(same_outcome(&got, want), "allocation %ld (all after it: %d): the run ends differently", n,
                  all_after);
        if (failures > before + 10 || failures > 50) break; /* enough to go on */
        if (failed == 0) break;
    }
    return n;
}

/* A KV cache of 2^31 - 1 blocks: terabytes, which no allocator hands out. */
static void test_huge_kv_cache(void)
{
    char err[512];
    kiln_engine *e = kiln_engine_open(engine_path, err, sizeof err);
    CHECK(e != NULL);
    if (!e) return;
    kiln_session_opts so = {.max_seqs = 1, .n_blocks = 2147483647};
    kiln_session *s = kiln_session_new(e, &so, err, sizeof err);
    CHECK(s == NULL);
    /* one layer's K: 2^31 - 1 blocks of 16 positions x 4 heads x 16 elements x 4 bytes */
    char want[512];
    snprintf(want, sizeof want,
             "%s: error: out of memory (allocating 8796093018112 bytes for the KV cache: layer 0's K of "
             "2147483647 blocks)\n",
             engine_path);
    CHECK_STR(err, want);
    kiln_session_free(s);
    kiln_engine_close(e);
}

int main(int argc, char **argv)
{
    sink k;
    sink_init(&k);
    static outcome want;
    if (argc == 2) {
        engine_path = argv[1];
        n_first = 1, n_gen = 1, prompt = "";
        CHECK(run(0, 0, &want) == 0);
        CHECK(want.generated == n_gen && want.text_len > 0);
        printf("each allocation failing once: %ld runs\n", fail_each(0, &want));
        return check_finish("test_oom");
    }
    const char *shared = getenv("KILN_SHARED");
    char *model = ks_path_join(shared ? shared : "../shared", "models/tinystories-656k");
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/kiln_oom_test.XXXXXX");
    if (!mkdtemp(dir)) return 1;
    char *path = ks_path_join(dir, "ts.engine");
    kd_inputs in = {.input = model};
    kd_model m;
    if (kd_model_load(&in, 1, &m, &k.d) == 0 && kd_optimize(&in, &m, &k.d) == 0)
        kd_write_engine(&in, &m, path, NULL, &k.d);
    kd_model_free(&m);
    free(model);
    if (k.d.errors) {
        fprintf(stderr, "%s", sink_text(&k));
        return 1;
    }
    engine_path = path;

    CHECK(run(0, 0, &want) == 0);
    CHECK(want.generated == N_GEN && want.text_len > 0 && vocab == 2048);
    CHECK(want.seq_len[0] == 2 && want.seq_len[1] > 0 && want.seq_len[2] == 3);
    long runs = fail_each(0, &want);
    printf("each allocation failing once: %ld runs\n", runs);
    long runs_all = fail_each(1, &want);
    printf("every allocation from the n-th on failing: %ld runs\n", runs_all);
    test_huge_kv_cache();

    unlink(path);
    rmdir(dir);
    free(path);
    ks_buf_free(&k.log);
    return check_finish("test_oom");
}
