/*
 * test_engine.h — the engine a session test runs on: the file it was given, or TinyStories-656K
 * (from $KILN_SHARED, else ../shared) built for the CPU into a temporary folder that
 * test_engine_close removes. Include once per test program.
 *
 *     test_engine t;
 *     krt_engine *e = test_engine_open(argc > 1 ? argv[1] : NULL, &t, &d);
 *     ...
 *     test_engine_close(&t, e);
 */
#ifndef KILN_TESTS_SESSION_TEST_ENGINE_H
#define KILN_TESTS_SESSION_TEST_ENGINE_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "compiler/driver.h"

typedef struct test_engine {
    char dir[64]; /* the temporary folder ("" for a given engine) */
    char *path;   /* the engine's file */
} test_engine;

/* given, or NULL: TinyStories built here. NULL after reporting (or when the folder cannot be made). */
static krt_engine *test_engine_open(const char *given, test_engine *t, ks_diag *d)
{
    t->dir[0] = 0;
    if (given) {
        t->path = ks_xstrdup(given);
        return krt_engine_open(given, d);
    }
    const char *shared = getenv("KILN_SHARED");
    char *model = ks_path_join(shared ? shared : "../shared", "models/tinystories-656k");
    snprintf(t->dir, sizeof t->dir, "/tmp/kiln_session_test.XXXXXX");
    if (!mkdtemp(t->dir)) {
        free(model);
        t->path = NULL;
        return NULL;
    }
    t->path = ks_path_join(t->dir, "ts.engine");
    kd_inputs in = {.input = model};
    kd_model m;
    if (kd_model_load(&in, 1, &m, d) == 0 && kd_optimize(&in, &m, d) == 0) kd_write_engine(&in, &m, t->path, NULL, d);
    kd_model_free(&m);
    free(model);
    return d->errors ? NULL : krt_engine_open(t->path, d);
}

/* Closes e and removes what test_engine_open built. */
static void test_engine_close(test_engine *t, krt_engine *e)
{
    krt_engine_close(e);
    if (t->dir[0]) {
        if (t->path) unlink(t->path);
        rmdir(t->dir);
    }
    free(t->path);
}

#endif
