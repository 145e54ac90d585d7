/*
 * tokenizer_speed.c — how long the tokenizers take to encode a megabyte: the
 * inputs and tokenizers of tests/tokenizer (tests/tokenizer/long_inputs.h),
 * each encoded REPS times (default 3); prints the fastest time and MB/s. A
 * measurement, not a test: tests assert no speed (bench/RESULTS.md keeps the
 * figures).
 *
 * usage: tokenizer_speed [SHARED_DIR] [REPS]   (default $KILN_SHARED, else ../shared)
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "runtime/text/tokenizer.h"
#include "tests/tokenizer/long_inputs.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    const char *env = getenv("KILN_SHARED");
    const char *shared = argc > 1 ? argv[1] : env && *env ? env : "../shared";
    int reps = argc > 2 ? atoi(argv[2]) : 3;
    if (reps < 1) reps = 1;
    tok_long_input in[TOK_LONG_INPUTS];
    tok_long_inputs(in);
    int rc = 0;
    for (int i = 0; i < TOK_LONG_TOKENIZERS; i++) {
        char *path = ks_path_join(shared, tok_long_tokenizers[i]);
        ks_diag d = {0};
        krt_tok *t = krt_tok_load_file(&d, path, KRT_TOK_AUTO);
        if (!t) rc = 1;
        for (int k = 0; t && k < TOK_LONG_INPUTS; k++) {
            double best = 0;
            size_t n = 0;
            for (int r = 0; r < reps; r++) {
                krt_tok_ids ids = {0};
                double t0 = now_s();
                if (krt_tok_encode(t, in[k].text.data, in[k].text.len, 0, &ids, &d) != 0) rc = 1;
                double dt = now_s() - t0;
                if (r == 0 || dt < best) best = dt;
                n = ids.len;
                krt_tok_ids_free(&ids);
            }
            printf("%-40s %-14s %8zu bytes -> %7zu tokens  %7.3f s  %6.2f MB/s\n", tok_long_tokenizers[i],
                   in[k].name, in[k].text.len, n, best, best > 0 ? (double)in[k].text.len / best / 1e6 : 0.0);
        }
        krt_tok_free(t);
        free(path);
    }
    for (int k = 0; k < TOK_LONG_INPUTS; k++) ks_buf_free(&in[k].text);
    return rc;
}
