/*
 * alloc.c — every heap allocation kiln makes goes through here: the
 * ks_try_* calls, which return NULL when memory runs out (the runtime's),
 * the ks_x* calls, which end the process with a message instead (the
 * compiler's), and the fault injection that tests use to make any one of
 * them fail (support/support.h).
 *
 * The fault injection is process-wide state, against kiln's rule of passing
 * contexts: an allocation deep inside a tokenizer or a hash map must see it
 * without every caller on the way passing something down, and a context
 * passed for tests alone would be a parameter in every runtime call that a
 * deployment never uses. It is test machinery, as SQLite's
 * sqlite3_test_control(SQLITE_TESTCTRL_FAULT_INSTALL) is: compiled in always,
 * so that the library the tests drive is the one a deployment links (no
 * build of its own for the out-of-memory tests), and off unless a test arms
 * it, when an allocation pays one relaxed atomic load. Atomics, because the
 * runtime allocates on several threads (sessions of one engine on different
 * threads); a test arms it while nothing else runs.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

static atomic_long fail_countdown; /* > 0: that many allocations more, and the last of them fails; else off */
static atomic_int fail_all;        /* 1: every allocation fails (after the one the countdown named) */
static atomic_int fail_all_after;  /* 1: the failure the countdown names turns fail_all on */
static atomic_long fail_count;     /* allocations failed since ks_alloc_fail_after */

void ks_alloc_fail_after(long n, int all_after)
{
    atomic_store(&fail_all, 0);
    atomic_store(&fail_all_after, all_after != 0);
    atomic_store(&fail_count, 0);
    atomic_store(&fail_countdown, n > 0 ? n : 0);
}

long ks_alloc_failures(void) { return atomic_load(&fail_count); }

/* Whether this allocation is one the fault injection fails. */
static int injected_failure(void)
{
    if (atomic_load_explicit(&fail_all, memory_order_relaxed)) {
        atomic_fetch_add(&fail_count, 1);
        return 1;
    }
    if (atomic_load_explicit(&fail_countdown, memory_order_relaxed) <= 0) return 0;
    if (atomic_fetch_sub(&fail_countdown, 1) != 1) return 0; /* not yet (or another thread's turn came) */
    atomic_fetch_add(&fail_count, 1);
    if (atomic_load(&fail_all_after)) atomic_store(&fail_all, 1);
    return 1;
}

void *ks_try_malloc(size_t n)
{
    if (injected_failure()) return NULL;
    return malloc(n ? n : 1);
}

void *ks_try_calloc(size_t n, size_t size)
{
    size_t bytes;
    if (!ks_mul_size(n, size, &bytes) || injected_failure()) return NULL;
    return calloc(n ? n : 1, size ? size : 1);
}

void *ks_try_realloc(void *p, size_t n)
{
    if (injected_failure()) return NULL;
    return realloc(p, n ? n : 1);
}

char *ks_try_strdup(const char *s)
{
    size_t n = strlen(s);
    char *p = ks_try_malloc(n + 1);
    if (p) memcpy(p, s, n + 1);
    return p;
}

/* Out of memory where there is nothing better to do than stop: the message
 * says so (not "internal error": it is not kiln's bug). */
KS_NORETURN static void out_of_memory(size_t bytes)
{
    fprintf(stderr, "kiln: error: out of memory (allocating %zu bytes)\n", bytes);
    abort();
}

void *ks_xmalloc(size_t n)
{
    void *p = ks_try_malloc(n);
    if (!p) out_of_memory(n);
    return p;
}

void *ks_xcalloc(size_t n, size_t size)
{
    void *p = ks_try_calloc(n, size);
    if (!p) out_of_memory(ks_mul_size(n, size, &n) ? n : SIZE_MAX);
    return p;
}

void *ks_xrealloc(void *p, size_t n)
{
    void *q = ks_try_realloc(p, n);
    if (!q) out_of_memory(n);
    return q;
}

char *ks_xstrdup(const char *s)
{
    char *p = ks_try_strdup(s);
    if (!p) out_of_memory(strlen(s) + 1);
    return p;
}

int ks_error_oom(ks_diag *d, const char *file, size_t bytes, const char *what)
{
    if (bytes)
        ks_error(d, file, "out of memory (allocating %zu bytes for %s)", bytes, what);
    else
        ks_error(d, file, "out of memory (%s)", what);
    d->oom++;
    return -1;
}
