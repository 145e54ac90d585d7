/*
 * tests/check.h — the one check harness of kiln's C test programs.
 *
 *   CHECK(cond)                  cond holds
 *   CHECK_MSG(cond, fmt, ...)    the same, and says more (printf-style) when it fails
 *   CHECK_STR(got, want)         two strings are equal (got may be NULL)
 *   CHECK_TEXT(what, got, want)  two texts are equal; a multi-line difference shows both texts
 *                                and the first line where they differ
 *   CHECK_NEAR(got, want, tol)   |got - want| <= tol, both values printed when not
 *   CHECK_U64(got, want)         two unsigned integers are equal, both printed when not
 *   CHECK_LOG(sink, want)        the messages a sink kept are exactly want; then clears the sink
 *   check_finish(name)           prints "NAME: N checks, M failed"; returns the exit status
 *
 * Each check counts in `checks`; each one that fails also counts in `failures` and prints
 * FILE:LINE and why to stderr, and the test goes on. A check is an expression that gives 1 when
 * it held, so a test can stop where the rest would only crash: `if (!CHECK(g != NULL)) return;`.
 *
 * A sink keeps the diagnostics a call reports (quietly), for tests that pin the exact messages.
 *
 * Include once per test program, in its one source file that checks (the counts are static).
 */
#ifndef KILN_TESTS_CHECK_H
#define KILN_TESTS_CHECK_H

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "support/support.h"

static int checks;   /* checks made so far */
static int failures; /* of those, the ones that failed */

/* Count one check; when !ok, count a failure and print FILE:LINE: and the formatted reason. */
static inline int check_at(int ok, const char *file, int line, const char *fmt, ...) KS_PRINTF(4, 5);
static inline int check_at(int ok, const char *file, int line, const char *fmt, ...)
{
    checks++;
    if (ok) return 1;
    failures++;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 0;
}

#define CHECK(cond) check_at(!!(cond), __FILE__, __LINE__, "check failed: %s", #cond)

/* CHECK_MSG(cond, fmt, ...): the reason's format and arguments follow the condition. */
#define CHECK_MSG(cond, ...) check_msg_(!!(cond), __FILE__, __LINE__, #cond, __VA_ARGS__)
static inline int check_msg_(int ok, const char *file, int line, const char *cond, const char *fmt, ...)
    KS_PRINTF(5, 6);
static inline int check_msg_(int ok, const char *file, int line, const char *cond, const char *fmt, ...)
{
    checks++;
    if (ok) return 1;
    failures++;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s:%d: check failed: %s: ", file, line, cond);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 0;
}

/* Texts: one-line ones are printed quoted; others in full, with the first differing line. */
static inline int check_text_at(const char *file, int line, const char *what, const char *got, const char *want)
{
    checks++;
    if (got && strcmp(got, want) == 0) return 1;
    failures++;
    if (!got) got = "(null)";
    if (!strchr(got, '\n') && !strchr(want, '\n')) {
        fprintf(stderr, "%s:%d: %s: got\n  \"%s\"\nwant\n  \"%s\"\n", file, line, what, got, want);
        return 0;
    }
    int ln = 1;
    for (size_t i = 0; got[i] && got[i] == want[i]; i++)
        if (got[i] == '\n') ln++;
    fprintf(stderr, "%s:%d: %s: text differs at line %d\n--- got:\n%s\n--- want:\n%s\n---\n", file, line, what, ln,
            got, want);
    return 0;
}
#define CHECK_STR(got, want) check_text_at(__FILE__, __LINE__, #got, (got), (want))
#define CHECK_TEXT(what, got, want) check_text_at(__FILE__, __LINE__, (what), (got), (want))

static inline int check_near_at(const char *file, int line, const char *what, double got, double want, double tol)
{
    return check_at(fabs(got - want) <= tol, file, line, "%s = %.9g, want %.9g (+-%g)", what, got, want, tol);
}
#define CHECK_NEAR(got, want, tol) check_near_at(__FILE__, __LINE__, #got, (got), (want), (tol))

#define CHECK_U64(got, want) check_u64_at(__FILE__, __LINE__, #got, (got), (want))
static inline int check_u64_at(const char *file, int line, const char *what, uint64_t got, uint64_t want)
{
    return check_at(got == want, file, line, "%s is %" PRIu64 ", want %" PRIu64, what, got, want);
}

/* Print the run's summary; the exit status: 0 when every check held, else 1. */
static inline int check_finish(const char *name)
{
    printf("%s: %d checks, %d failed\n", name, checks, failures);
    if (failures) fprintf(stderr, "%s: %d of %d checks failed\n", name, failures, checks);
    return failures ? 1 : 0;
}

/* ---- a sink for diagnostics ----------------------------------------------------------------- */

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

/* Forget the messages and the error and warning counts. */
static inline void sink_clear(sink *s)
{
    s->log.len = 0;
    s->d.errors = s->d.warnings = 0;
}

static inline void sink_free(sink *s) { ks_buf_free(&s->log); }

static inline int check_log_at(const char *file, int line, sink *s, const char *want)
{
    int ok = check_text_at(file, line, "messages", sink_text(s), want);
    sink_clear(s);
    return ok;
}
#define CHECK_LOG(s, want) check_log_at(__FILE__, __LINE__, (s), (want))

#endif
