/*
 * tests/check.h — the checks of kiln's C test programs: CHECK(cond) and
 * CHECK_STR(got, want) count failures in `failures` and say where; a sink
 * keeps the diagnostics a call reports, for tests that pin messages.
 * Include once, in the test program's one source file.
 */
#ifndef KILN_TESTS_CHECK_H
#define KILN_TESTS_CHECK_H

#include <stdio.h>
#include <string.h>

#include "support/support.h"

static int failures; /* checks failed so far */

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                              \
        }                                                                            \
    } while (0)

#define CHECK_STR(got, want)                                                                                   \
    do {                                                                                                       \
        const char *g_ = (got), *w_ = (want);                                                                  \
        if (!g_ || strcmp(g_, w_) != 0) {                                                                      \
            fprintf(stderr, "%s:%d: got\n  \"%s\"\nwant\n  \"%s\"\n", __FILE__, __LINE__, g_ ? g_ : "(null)", w_); \
            failures++;                                                                                        \
        }                                                                                                      \
    } while (0)

/* main's result: 0 when no check failed; says which program failed how often, or that it passed. */
static inline int check_finish(const char *program)
{
    if (failures) {
        fprintf(stderr, "%s: %d failures\n", program, failures);
        return 1;
    }
    printf("%s: ok\n", program);
    return 0;
}

/* A diagnostics sink that keeps the messages. */
typedef struct sink {
    ks_buf log; /* every message */
    ks_diag d;  /* reporting into log, quietly */
} sink;

static inline void sink_init(sink *s)
{
    memset(s, 0, sizeof *s);
    s->d.log = &s->log;
    s->d.quiet = 1;
}

static inline const char *sink_text(sink *s) { return s->log.len ? ks_buf_cstr(&s->log) : ""; }

/* Forget the messages and the error count. */
static inline void sink_clear(sink *s)
{
    s->log.len = 0;
    s->d.errors = 0;
}

#endif
