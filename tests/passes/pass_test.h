/*
 * pass_test.h — what the pass tests share: a failure counter, text
 * comparison that shows the first differing line, and parsing into a
 * captured log. Each test file holds its own inputs and expected outputs.
 */
#ifndef KILN_TESTS_PASS_TEST_H
#define KILN_TESTS_PASS_TEST_H

#include <stdio.h>
#include <string.h>

#include "ir/ir.h"

static int pt_failures; /* checks failed in this test program */

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            pt_failures++;                                                            \
        }                                                                             \
    } while (0)

/* Compare texts; on a difference print both and the first differing line. */
static inline void pt_check_text(const char *file, int line, const char *what, const char *got, const char *want)
{
    if (!got) got = "(null)";
    if (strcmp(got, want) == 0) return;
    pt_failures++;
    int ln = 1;
    size_t i = 0;
    while (got[i] && got[i] == want[i]) {
        if (got[i] == '\n') ln++;
        i++;
    }
    fprintf(stderr, "%s:%d: %s: text differs at line %d\n--- got:\n%s\n--- want:\n%s\n---\n", file, line, what, ln,
            got, want);
}
#define CHECK_TEXT(what, got, want) pt_check_text(__FILE__, __LINE__, (what), (got), (want))

static inline int pt_finish(const char *name)
{
    if (pt_failures) {
        fprintf(stderr, "%s: %d check(s) failed\n", name, pt_failures);
        return 1;
    }
    printf("%s: ok\n", name);
    return 0;
}

/* Parse text named `name`; messages go to *log only. */
static inline kir_graph *pt_parse(const char *name, const char *text, ks_buf *log)
{
    ks_diag d = {.log = log, .quiet = 1};
    ks_source src = {name, text, strlen(text)};
    return kir_parse(&src, &d);
}

#endif
