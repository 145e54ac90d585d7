/*
 * ckpt_test.h — what the checkpoint tests share: a scratch folder for the
 * files a test writes, a diagnostics log to compare with the message a case
 * expects, and check macros that count failures instead of stopping.
 */
#ifndef KILN_CKPT_TEST_H
#define KILN_CKPT_TEST_H

#include <stddef.h>
#include <stdint.h>

#include "frontend/checkpoint.h"

/* One test run's state. */
typedef struct ct_run {
    char dir[64];       /* the scratch folder, made by ct_init, removed by ct_finish */
    char shared[4096];  /* the shared data folder: $KILN_SHARED, else ../shared beside the source */
    char **files;       /* every path written under dir, for removal */
    size_t n_files;     /* entries in files */
    size_t cap_files;   /* capacity of files */
    ks_buf log;         /* messages of the current case */
    ks_diag diag;       /* quiet; logs into log */
    int failures;       /* checks failed so far */
    int checks;         /* checks made so far */
} ct_run;

void ct_init(ct_run *r);
/* Remove the scratch files, print a summary; returns the exit status. */
int ct_finish(ct_run *r, const char *what);

/* Write bytes to dir/name (subfolders made as needed); returns the full path
 * (owned by r). */
const char *ct_write(ct_run *r, const char *name, const void *data, size_t len);
/* A safetensors file: 8-byte length, header text, then data. */
const char *ct_write_st(ct_run *r, const char *name, const char *header, const void *data, size_t len);
/* Make dir/name as a folder; returns its path (owned by r). */
const char *ct_mkdir(ct_run *r, const char *name);

/* Clear the log and the diag's counts before a case. */
void ct_reset(ct_run *r);
/* Compare the log with `want`, in which "$TMP" stands for the scratch
 * folder. Counts a failure and prints both when they differ. */
void ct_expect_log(ct_run *r, const char *where, const char *want);

void ct_fail(ct_run *r, const char *file, int line, const char *fmt, ...) KS_PRINTF(4, 5);

#define CT_CHECK(r, cond)                                                     \
    do {                                                                      \
        (r)->checks++;                                                        \
        if (!(cond)) ct_fail((r), __FILE__, __LINE__, "check failed: %s", #cond); \
    } while (0)

/* Float equality within tol (absolute), with both values printed. */
#define CT_NEAR(r, got, want, tol)                                                              \
    do {                                                                                        \
        double g_ = (got), w_ = (want);                                                         \
        (r)->checks++;                                                                          \
        if (!(g_ - w_ <= (tol) && w_ - g_ <= (tol)))                                            \
            ct_fail((r), __FILE__, __LINE__, "%s = %.9g, expected %.9g", #got, g_, w_);         \
    } while (0)

#endif
