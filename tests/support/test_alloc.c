/*
 * test_alloc.c — fallible allocation (support/alloc.c, support/arena.c,
 * support/hmap.c, support/diag.c) under the fault injection:
 *  - ks_alloc_fail_after(n) fails exactly the n-th allocation (or, with
 *    all_after, every one from it on), ks_try_* return NULL, the count says
 *    how many failed, 0 turns it off;
 *  - a fallible ks_buf that cannot grow keeps its text, records the bytes it
 *    asked for, and ignores appends until ks_buf_clear; ks_buf_cstr is "";
 *  - a fallible arena returns NULL and records the size; KS_TRY_GROW leaves
 *    the array as it was; a hash map's put returns NULL and the map holds
 *    what it held;
 *  - an error reported while memory is out still reaches the diagnostics
 *    (without its quoted source line), and ks_error_oom's two forms;
 *  - a die-mode ks_x* allocation that fails ends the process with
 *    "out of memory" (in a child).
 */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/check.h"

static void test_injection(void)
{
    ks_alloc_fail_after(3, 0);
    void *a = ks_try_malloc(8), *b = ks_try_calloc(2, 8), *c = ks_try_malloc(8), *e = ks_try_realloc(NULL, 8);
    CHECK(a && b && !c && e);
    CHECK(ks_alloc_failures() == 1);
    free(a);
    free(b);
    free(e);

    ks_alloc_fail_after(2, 1); /* the second and every one after it */
    a = ks_try_malloc(8);
    CHECK(a != NULL);
    CHECK(ks_try_malloc(8) == NULL && ks_try_strdup("x") == NULL && ks_try_calloc(1, 1) == NULL);
    CHECK(ks_try_realloc(a, 64) == NULL); /* a is still a's */
    CHECK(ks_alloc_failures() == 4);
    ks_alloc_fail_after(0, 0);
    CHECK(ks_alloc_failures() == 0);
    void *q = ks_try_realloc(a, 64);
    CHECK(q != NULL);
    free(q);

    /* n * size overflowing is NULL too, without the injection */
    CHECK(ks_try_calloc(SIZE_MAX / 2, 4) == NULL);
}

static void test_buf(void)
{
    ks_buf b = KS_BUF_TRY;
    CHECK(ks_buf_puts(&b, "abc") == 0);
    ks_alloc_fail_after(1, 0);
    char big[100];
    memset(big, 'x', sizeof big);
    CHECK(ks_buf_put(&b, big, sizeof big) == -1); /* 3 + 100 + 1 bytes: more than it had */
    CHECK(b.failed == 104 && b.len == 3 && strcmp(b.data, "abc") == 0);
    ks_alloc_fail_after(0, 0);
    /* sticky: appends after a failure do nothing, though memory is back */
    CHECK(ks_buf_puts(&b, "d") == -1 && ks_buf_printf(&b, "%d", 5) == -1 && b.len == 3);
    ks_buf_clear(&b);
    CHECK(b.failed == 0 && b.len == 0 && ks_buf_printf(&b, "%s-%d", "ok", 7) == 0);
    CHECK_STR(ks_buf_cstr(&b), "ok-7");
    ks_buf_free(&b);
    CHECK(b.fallible == 1); /* stays fallible */

    /* an empty fallible buffer whose NUL cannot be had reads as "" */
    ks_alloc_fail_after(1, 0);
    CHECK_STR(ks_buf_cstr(&b), "");
    CHECK(b.failed != 0 && b.data == NULL);
    ks_alloc_fail_after(0, 0);
    ks_buf_free(&b);
}

static void test_arena_grow_hmap(void)
{
    ks_arena a = {.fallible = 1};
    CHECK(ks_arena_strdup(&a, "first") != NULL);
    ks_alloc_fail_after(1, 0);
    CHECK(ks_arena_alloc(&a, 1 << 20) == NULL); /* a chunk of its own: the one allocation */
    CHECK(a.failed > (size_t)1 << 20);
    ks_alloc_fail_after(1, 0);
    CHECK(ks_arena_printf(&a, "%d", 42) != NULL); /* room in the first chunk: no allocation */
    CHECK(ks_alloc_failures() == 0);
    ks_alloc_fail_after(0, 0);
    ks_arena_free(&a);
    CHECK(a.failed == 0 && a.fallible == 1);

    int *v = NULL;
    size_t cap = 0;
    CHECK(KS_TRY_GROW(v, 4, cap, 100) == 0 && cap >= 4);
    v[3] = 9;
    size_t had = cap;
    ks_alloc_fail_after(1, 0);
    CHECK(KS_TRY_GROW(v, had + 1, cap, 100) == -1 && cap == had && v[3] == 9);
    ks_alloc_fail_after(0, 0);
    CHECK(KS_TRY_GROW(v, 101, cap, 100) == -1 && cap == had); /* over the limit */
    free(v);

    ks_hmap m;
    CHECK(ks_hmap_init(&m, NULL, 0, 1000, "keys") == 0);
    for (uint64_t k = 0; k < 8; k++) *ks_hmap_put_u64(&m, k, NULL) = k + 100;
    ks_alloc_fail_after(1, 1);
    uint64_t *slot = NULL;
    for (uint64_t k = 8; k < 64 && (slot = ks_hmap_put_u64(&m, k, NULL)) != NULL; k++) *slot = k + 100;
    CHECK(slot == NULL && ks_alloc_failures() == 1);
    size_t count = m.count;
    CHECK(*ks_hmap_put_u64(&m, 3, NULL) == 103); /* a key it holds needs no room */
    CHECK(m.count == count);
    for (uint64_t k = 0; k < count; k++) CHECK(ks_hmap_get_u64(&m, k) && *ks_hmap_get_u64(&m, k) == k + 100);
    ks_hmap dead;
    CHECK(ks_hmap_init(&dead, NULL, 100, 1000, "keys") == -1 && dead.slots == NULL);
    ks_alloc_fail_after(0, 0);
    ks_hmap_free(&m);
}

static void test_diag(void)
{
    sink k;
    sink_init(&k);
    ks_buf_put(&k.log, "", 0); /* the log has its memory: only the message's own buffer fails */
    ks_source src = {"f.kiln", "line one\n", 9};
    ks_alloc_fail_after(1, 0);
    ks_error_at(&k.d, &src, 1, 6, "bad %s", "word");
    ks_alloc_fail_after(0, 0);
    CHECK_LOG(&k, "f.kiln:1:6: error: bad word\n");
    ks_error_oom(&k.d, "model.engine", 1073741824, "the KV cache");
    ks_error_oom(&k.d, "kiln", 0, "encoding the prompt");
    CHECK_STR(sink_text(&k), "model.engine: error: out of memory (allocating 1073741824 bytes for the KV cache)\n"
                             "kiln: error: out of memory (encoding the prompt)\n");
    CHECK(k.d.errors == 2);
    ks_buf_free(&k.log);
}

/* ks_xmalloc that fails ends the process with a message, in a child. */
static void test_die(void)
{
    int fds[2];
    CHECK(pipe(fds) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        ks_alloc_fail_after(1, 0);
        (void)ks_xmalloc(10);
        _exit(0);
    }
    close(fds[1]);
    char out[256] = "";
    ssize_t n = read(fds[0], out, sizeof out - 1);
    out[n > 0 ? n : 0] = 0;
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
    CHECK_STR(out, "kiln: error: out of memory (allocating 10 bytes)\n");
}

int main(void)
{
    test_injection();
    test_buf();
    test_arena_grow_hmap();
    test_diag();
    test_die();
    return check_finish("test_alloc");
}
