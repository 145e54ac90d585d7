/*
 * test_hmap.c — ks_hmap (support/hmap.c): string and u64 keys, values kept through growth
 * on the heap and in an arena, keys that differ only in length, the edge keys 0 and
 * UINT64_MAX, and the named limit (fatal, with its name, in a child process).
 */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/check.h"

static void test_strings(ks_arena *arena)
{
    ks_hmap m;
    ks_hmap_init(&m, arena, 0, 1 << 20, "names");
    CHECK(ks_hmap_get_str(&m, "a", 1) == NULL);
    int added = -1;
    uint64_t *v = ks_hmap_put_str(&m, "a", 1, &added);
    CHECK(added == 1 && *v == 0);
    *v = 7;
    v = ks_hmap_put_str(&m, "a", 1, &added);
    CHECK(added == 0 && *v == 7);
    /* keys are bytes with a length: a prefix, an empty key, and a NUL inside are keys of their own */
    *ks_hmap_put_str(&m, "ab", 2, NULL) = 8;
    *ks_hmap_put_str(&m, "", 0, NULL) = 9;
    *ks_hmap_put_str(&m, "a\0b", 3, NULL) = 10;
    CHECK(*ks_hmap_get_str(&m, "abc", 1) == 7);
    CHECK(*ks_hmap_get_str(&m, "abc", 2) == 8);
    CHECK(*ks_hmap_get_str(&m, "x", 0) == 9);
    CHECK(*ks_hmap_get_str(&m, "a\0b", 3) == 10);
    CHECK(ks_hmap_get_str(&m, "a\0c", 3) == NULL);
    CHECK(m.count == 4);

    /* many keys: the table grows and every value stays */
    enum { N = 50000 };
    char (*keys)[16] = ks_xmalloc(N * sizeof *keys);
    for (int i = 0; i < N; i++) {
        snprintf(keys[i], sizeof keys[i], "k%d", i);
        uint64_t *slot = ks_hmap_put_str(&m, keys[i], strlen(keys[i]), &added);
        CHECK(added == 1);
        *slot = (uint64_t)i * 3 + 1;
    }
    CHECK(m.count == N + 4);
    CHECK((m.count + 1) * 2 <= m.mask + 1);
    int wrong = 0;
    for (int i = 0; i < N; i++) {
        const uint64_t *got = ks_hmap_get_str(&m, keys[i], strlen(keys[i]));
        wrong += !got || *got != (uint64_t)i * 3 + 1;
    }
    CHECK(wrong == 0);
    CHECK(ks_hmap_get_str(&m, "k50000", 6) == NULL);
    CHECK(*ks_hmap_get_str(&m, "a", 1) == 7);
    ks_hmap_free(&m);
    CHECK(m.count == 0 && ks_hmap_get_str(&m, "a", 1) == NULL);
    free(keys);
}

static void test_u64(ks_arena *arena)
{
    ks_hmap m;
    ks_hmap_init(&m, arena, 100, 1 << 20, "ids");
    size_t slots = m.mask + 1;
    CHECK(slots >= 201);
    int added = -1;
    *ks_hmap_put_u64(&m, 0, &added) = 5;
    CHECK(added == 1);
    *ks_hmap_put_u64(&m, UINT64_MAX, &added) = 6;
    CHECK(added == 1);
    CHECK(*ks_hmap_get_u64(&m, 0) == 5);
    CHECK(*ks_hmap_get_u64(&m, UINT64_MAX) == 6);
    CHECK(ks_hmap_get_u64(&m, 1) == NULL);
    /* 100 keys fit without growing */
    for (uint64_t k = 1; k <= 98; k++) *ks_hmap_put_u64(&m, k << 32 | 7, NULL) = k;
    CHECK(m.count == 100 && m.mask + 1 == slots);
    /* consecutive keys, as ids are, then many more */
    for (uint64_t k = 0; k < 100000; k++) *ks_hmap_put_u64(&m, 1000 + k, NULL) = k;
    int wrong = 0;
    for (uint64_t k = 0; k < 100000; k++) {
        const uint64_t *got = ks_hmap_get_u64(&m, 1000 + k);
        wrong += !got || *got != k;
    }
    for (uint64_t k = 1; k <= 98; k++) wrong += *ks_hmap_get_u64(&m, k << 32 | 7) != k;
    CHECK(wrong == 0);
    CHECK(*ks_hmap_get_u64(&m, 0) == 5 && *ks_hmap_get_u64(&m, UINT64_MAX) == 6);
    ks_hmap_free(&m);
}

/* One key past the limit is fatal, and the message names what the keys are. */
static void test_limit(void)
{
    ks_hmap m;
    ks_hmap_init(&m, NULL, 0, 3, "test keys");
    for (uint64_t k = 0; k < 3; k++) ks_hmap_put_u64(&m, k, NULL);
    ks_hmap_put_u64(&m, 2, NULL); /* a key already there is no new key */
    CHECK(m.count == 3);
    int err[2];
    CHECK(pipe(err) == 0);
    fflush(stderr);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dup2(err[1], 2);
        ks_hmap_put_u64(&m, 3, NULL);
        _exit(0);
    }
    close(err[1]);
    char text[512] = {0};
    size_t got = 0;
    ssize_t n;
    while (got + 1 < sizeof text && (n = read(err[0], text + got, sizeof text - 1 - got)) > 0) got += (size_t)n;
    close(err[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
    CHECK(strstr(text, "too many test keys (limit 3)\n") != NULL);
    ks_hmap_free(&m);
}

int main(void)
{
    test_strings(NULL);
    test_u64(NULL);
    ks_arena arena = {0};
    test_strings(&arena);
    test_u64(&arena);
    ks_arena_free(&arena);
    test_limit();
    return check_finish("test_hmap");
}
