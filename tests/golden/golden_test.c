/*
 * golden_test.c — a shared model folder against its golden.json (Hugging
 * Face transformers in float64): builds the engine through the driver, then
 *  1. each case as one sequence in one step: logits of every position within
 *     1e-4 * max|golden| of that row;
 *  2. all cases together, their tokens interleaved in one step;
 *  3. each greedy case: prefill the prompt, decode one token a step through
 *     the KV cache, all greedy sequences batched in the same decode steps;
 *     the ids must equal new_ids exactly.
 * usage: golden_test MODEL_DIR ENGINE_PATH [PASSES]
 * PASSES is given to the pass pipeline as --passes is: "none" (all passes
 * off), "all" (the default: every fusion, and the memory plan that the
 * interpreter then runs out of), or a comma-separated list.
 * The engine is built for $KILN_GOLDEN_TARGET when set (e.g. sm_90: the
 * CUDA backend; bench/gpu_check.sh), else for the CPU; with its weights as
 * $KILN_GOLDEN_DTYPE when set (f32, bf16, f16: kiln build --dtype). A
 * half-precision dtype sets no tolerance of its own: $KILN_GOLDEN_TOL
 * replaces 1e-4 (each model's half-precision noise differs), and greedy
 * continuations are then reported, not required to be exact (rounding may
 * flip a near tie). With $KILN_GOLDEN_PREBUILT=1, ENGINE_PATH is an engine
 * already built (e.g. by kiln build --emit-source for the CUDA emulator),
 * opened as it is; the model is still compiled, for its settings.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/driver.h"
#include "runtime/session.h"
#include "tests/check.h"

static double tolerance = 1e-4; /* per row: max|d| / max|golden| ($KILN_GOLDEN_TOL) */

typedef struct gcase {
    int32_t *ids;   /* input ids */
    int n;          /* count */
    float *logits;  /* golden [n, vocab] */
} gcase;

static int32_t *json_ids(const cJSON *arr, int *n)
{
    *n = cJSON_GetArraySize(arr);
    int32_t *ids = calloc((size_t)*n + 1, sizeof *ids);
    for (int i = 0; i < *n; i++) ids[i] = (int32_t)cJSON_GetArrayItem(arr, i)->valuedouble;
    return ids;
}

static float *read_f32(const char *path, size_t count)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    float *v = malloc(count * sizeof *v);
    size_t got = fread(v, sizeof *v, count, f);
    fclose(f);
    if (got != count) {
        free(v);
        return NULL;
    }
    return v;
}

/* Compare one row; returns the ratio max|d| / max|golden|. */
static double row_error(const float *got, const float *want, int64_t vocab)
{
    double maxd = 0, maxg = 0;
    for (int64_t i = 0; i < vocab; i++) {
        double dd = fabs((double)got[i] - want[i]);
        if (!(dd <= maxd)) maxd = dd; /* NaN propagates */
        if (fabs(want[i]) > maxg) maxg = fabs(want[i]);
    }
    return maxd / (maxg > 0 ? maxg : 1);
}

static void check_rows(const char *what, int c, const float *got, const float *want, int n, int64_t vocab)
{
    double worst = 0;
    int worst_row = 0;
    for (int r = 0; r < n; r++) {
        double e = row_error(got + (size_t)r * vocab, want + (size_t)r * vocab, vocab);
        if (!(e <= worst)) worst = e, worst_row = r;
    }
    int ok = worst <= tolerance;
    printf("  %-8s case %d: %3d positions, worst row %d: max|d|/max|golden| = %.3g %s\n", what, c, n, worst_row,
           worst, ok ? "ok" : "FAIL");
    CHECK_MSG(ok, "%s case %d: worst row %d: max|d|/max|golden| = %.3g, tolerance %.3g", what, c, worst_row, worst,
              tolerance);
}

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: golden_test MODEL_DIR ENGINE\n");
        return 2;
    }
    const char *dir = argv[1], *engine_path = argv[2];
    ks_diag d = {0};
    kd_inputs in = {.input = dir, .target = getenv("KILN_GOLDEN_TARGET"), .passes = argc == 4 ? argv[3] : NULL,
                    .dtype = getenv("KILN_GOLDEN_DTYPE"), .precision = getenv("KILN_GOLDEN_PRECISION")};
    const char *tol = getenv("KILN_GOLDEN_TOL");
    if (tol) {
        char *end;
        tolerance = strtod(tol, &end);
        if (end == tol || *end || !(tolerance > 0)) {
            fprintf(stderr, "KILN_GOLDEN_TOL=%s is not a positive number\n", tol);
            return 2;
        }
    }
    /* half precision: greedy ids reported, not required (see the top) */
    int greedy_exact = !in.dtype || strcmp(in.dtype, "f32") == 0;
    kd_model m;
    const char *prebuilt = getenv("KILN_GOLDEN_PREBUILT");
    int build = !prebuilt || strcmp(prebuilt, "1") != 0;
    if (kd_model_load(&in, 1, &m, &d) != 0 || kd_optimize(&in, &m, &d) != 0 ||
        (build && kd_write_engine(&in, &m, engine_path, NULL, &d) != 0)) {
        kd_model_free(&m);
        return 1;
    }
    kd_model_free(&m);
    krt_engine *e = krt_engine_open(engine_path, &d);
    if (!e) return 1;

    char *gpath = ks_path_join(dir, "golden.json");
    char *text = ks_read_file(&d, gpath, NULL);
    cJSON *golden = text ? cJSON_Parse(text) : NULL;
    free(text);
    free(gpath);
    if (!golden) {
        fprintf(stderr, "%s: cannot read golden.json\n", dir);
        krt_engine_close(e);
        return 1;
    }
    krt_session_opts opts = {.max_seqs = 8, .block_size = 16};
    krt_session *s = krt_session_new(e, &opts, &d);
    if (!s) return 1;
    int64_t vocab = krt_session_vocab(s);

    const cJSON *cases = cJSON_GetObjectItem(golden, "cases");
    int nc = cJSON_GetArraySize(cases);
    gcase *gc = calloc((size_t)nc, sizeof *gc);
    int total = 0;
    for (int c = 0; c < nc; c++) {
        const cJSON *jc = cJSON_GetArrayItem(cases, c);
        gc[c].ids = json_ids(cJSON_GetObjectItem(jc, "input_ids"), &gc[c].n);
        char *lp = ks_path_join(dir, cJSON_GetObjectItem(jc, "logits")->valuestring);
        gc[c].logits = read_f32(lp, (size_t)gc[c].n * (size_t)vocab);
        if (!gc[c].logits) {
            fprintf(stderr, "%s: cannot read %zu floats\n", lp, (size_t)gc[c].n * (size_t)vocab);
            return 1;
        }
        free(lp);
        total += gc[c].n;
    }
    printf("%s: %d cases, vocab %lld, weights %s, tolerance %g\n", dir, nc, (long long)vocab,
           in.dtype ? in.dtype : "f32", tolerance);

    /* 1. one sequence per step */
    for (int c = 0; c < nc; c++) {
        float *out = malloc(sizeof(float) * (size_t)gc[c].n * (size_t)vocab);
        int32_t *seq = calloc((size_t)gc[c].n, sizeof *seq);
        if (krt_session_seq_add(s, 0, &d) || krt_session_step(s, gc[c].n, gc[c].ids, seq, out, &d)) return 1;
        check_rows("single", c, out, gc[c].logits, gc[c].n, vocab);
        krt_session_seq_free(s, 0);
        free(out);
        free(seq);
    }

    /* 2. all cases mixed in one step, tokens interleaved round-robin */
    {
        int32_t *tok = malloc(sizeof *tok * (size_t)total), *sid = malloc(sizeof *sid * (size_t)total);
        int *row_of = malloc(sizeof *row_of * (size_t)total);
        int k = 0;
        for (int c = 0; c < nc; c++)
            if (krt_session_seq_add(s, c, &d)) return 1;
        for (int p = 0; k < total; p++)
            for (int c = 0; c < nc; c++)
                if (p < gc[c].n) tok[k] = gc[c].ids[p], sid[k] = c, row_of[k] = p, k++;
        float *out = malloc(sizeof(float) * (size_t)total * (size_t)vocab);
        if (krt_session_step(s, total, tok, sid, out, &d)) return 1;
        for (int c = 0; c < nc; c++) {
            float *mine = malloc(sizeof(float) * (size_t)gc[c].n * (size_t)vocab);
            for (int i = 0; i < total; i++)
                if (sid[i] == c)
                    memcpy(mine + (size_t)row_of[i] * vocab, out + (size_t)i * vocab, sizeof(float) * (size_t)vocab);
            check_rows("mixed", c, mine, gc[c].logits, gc[c].n, vocab);
            free(mine);
            krt_session_seq_free(s, c);
        }
        free(out);
        free(tok);
        free(sid);
        free(row_of);
    }

    /* 3. greedy through the KV cache, all greedy cases decoding together */
    const cJSON *greedy = cJSON_GetObjectItem(golden, "greedy");
    int ng = cJSON_GetArraySize(greedy);
    int32_t **want = calloc((size_t)ng + 1, sizeof *want), *nwant = calloc((size_t)ng + 1, sizeof *nwant);
    int32_t *next = calloc((size_t)ng + 1, sizeof *next);
    int max_new = 0;
    for (int c = 0; c < ng; c++) {
        const cJSON *jg = cJSON_GetArrayItem(greedy, c);
        int np = 0, nn = 0;
        int32_t *prompt = json_ids(cJSON_GetObjectItem(jg, "prompt_ids"), &np);
        want[c] = json_ids(cJSON_GetObjectItem(jg, "new_ids"), &nn);
        nwant[c] = nn;
        if (nn > max_new) max_new = nn;
        float *out = malloc(sizeof(float) * (size_t)np * (size_t)vocab);
        int32_t *seq = malloc(sizeof *seq * (size_t)np);
        for (int i = 0; i < np; i++) seq[i] = c;
        if (krt_session_seq_add(s, c, &d) || krt_session_step(s, np, prompt, seq, out, &d)) return 1;
        next[c] = krt_argmax(out + (size_t)(np - 1) * vocab, vocab);
        free(out);
        free(seq);
        free(prompt);
    }
    int *mismatch = calloc((size_t)ng + 1, sizeof *mismatch);
    for (int c = 0; c < ng; c++) mismatch[c] = -1;
    float *out = malloc(sizeof(float) * (size_t)(ng + 1) * (size_t)vocab);
    for (int t = 0; t < max_new; t++) {
        int32_t tok[64], sid[64];
        int n = 0;
        for (int c = 0; c < ng; c++) {
            if (t >= nwant[c]) continue;
            if (next[c] != want[c][t] && mismatch[c] < 0) mismatch[c] = t;
            if (t + 1 < nwant[c]) tok[n] = next[c], sid[n] = c, n++;
        }
        if (!n) break;
        if (krt_session_step(s, n, tok, sid, out, &d)) return 1;
        for (int i = 0; i < n; i++) next[sid[i]] = krt_argmax(out + (size_t)i * vocab, vocab);
    }
    for (int c = 0; c < ng; c++) {
        printf("  greedy   case %d: %d new tokens %s", c, nwant[c],
               mismatch[c] < 0 ? "exact\n" : greedy_exact ? "FAIL" : "differ");
        if (mismatch[c] >= 0) {
            printf(" (first difference at token %d%s)\n", mismatch[c], greedy_exact ? "" : "; half precision: not counted");
        }
        if (greedy_exact) CHECK_MSG(mismatch[c] < 0, "greedy case %d: first difference at token %d", c, mismatch[c]);
        free(want[c]);
    }
    free(out);
    free(mismatch);
    free(want);
    free(nwant);
    free(next);
    for (int c = 0; c < nc; c++) {
        free(gc[c].ids);
        free(gc[c].logits);
    }
    free(gc);
    cJSON_Delete(golden);
    krt_session_free(s);
    krt_engine_close(e);
    return check_finish("golden_test");
}
