/*
 * ckpt_test.h — the fixture the checkpoint tests share: a scratch folder for
 * the files a test writes (removed at the end), the shared data folder, and
 * a sink whose messages a case compares with the ones it expects, in which
 * "$TMP" stands for the scratch folder. The checks are tests/check.h's.
 * Include once, in the test program's one source file.
 */
#ifndef KILN_CKPT_TEST_H
#define KILN_CKPT_TEST_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "frontend/checkpoint.h"
#include "tests/check.h"

/* One test run's state. */
typedef struct ct_run {
    char dir[64];       /* the scratch folder, made by ct_init, removed by ct_cleanup */
    char shared[4096];  /* the shared data folder: $KILN_SHARED, else ../shared beside the source */
    char **files;       /* every path written under dir, for removal */
    size_t n_files;     /* entries in files */
    size_t cap_files;   /* capacity of files */
    sink out;           /* the messages of the current case (out.d: the diagnostics to report into) */
    ks_buf want;        /* the last expected text with $TMP replaced (ct_tmp) */
} ct_run;

/* $KILN_SHARED, else ../shared beside $KILN_SOURCE, else ../shared. */
static inline void ct_find_shared(ct_run *r)
{
    const char *s = getenv("KILN_SHARED"), *src = getenv("KILN_SOURCE");
    if (s && *s)
        snprintf(r->shared, sizeof r->shared, "%s", s);
    else if (src && *src)
        snprintf(r->shared, sizeof r->shared, "%s/../shared", src);
    else
        snprintf(r->shared, sizeof r->shared, "../shared");
}

static inline void ct_init(ct_run *r)
{
    memset(r, 0, sizeof *r);
    snprintf(r->dir, sizeof r->dir, "/tmp/kiln-ckpt-XXXXXX");
    if (!mkdtemp(r->dir)) {
        perror("mkdtemp");
        exit(2);
    }
    sink_init(&r->out);
    ct_find_shared(r);
}

static inline void ct_remember(ct_run *r, char *path)
{
    KS_GROW(r->files, r->n_files + 1, r->cap_files, 1 << 16, "scratch files");
    r->files[r->n_files++] = path;
}

/* Remove the scratch files and folder. */
static inline void ct_cleanup(ct_run *r)
{
    /* Newest first: files before the folders that hold them. */
    for (size_t i = r->n_files; i-- > 0;) {
        if (remove(r->files[i]) != 0) perror(r->files[i]);
        free(r->files[i]);
    }
    free(r->files);
    if (rmdir(r->dir) != 0) perror(r->dir);
    sink_free(&r->out);
    ks_buf_free(&r->want);
}

/* Make dir/name as a folder; returns its path (owned by r). */
static inline const char *ct_mkdir(ct_run *r, const char *name)
{
    char *path = ks_path_join(r->dir, name);
    if (mkdir(path, 0700) != 0) {
        perror(path);
        exit(2);
    }
    ct_remember(r, path);
    return path;
}

/* Write bytes to dir/name; returns the full path (owned by r). */
static inline const char *ct_write(ct_run *r, const char *name, const void *data, size_t len)
{
    char *path = ks_path_join(r->dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        perror(path);
        exit(2);
    }
    ct_remember(r, path);
    return path;
}

/* A safetensors file: 8-byte length, header text, then data. */
static inline const char *ct_write_st(ct_run *r, const char *name, const char *header, const void *data, size_t len)
{
    ks_buf b = {0};
    uint64_t n = strlen(header);
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)(n >> (8 * i));
    ks_buf_put(&b, le, 8);
    ks_buf_put(&b, header, n);
    if (len) ks_buf_put(&b, data, len);
    const char *path = ct_write(r, name, b.data, b.len);
    ks_buf_free(&b);
    return path;
}

/* want with every "$TMP" replaced by the scratch folder (owned by r, until the next call). */
static inline const char *ct_tmp(ct_run *r, const char *want)
{
    r->want.len = 0;
    for (const char *p = want; *p;) {
        if (strncmp(p, "$TMP", 4) == 0) {
            ks_buf_puts(&r->want, r->dir);
            p += 4;
        } else {
            ks_buf_put(&r->want, p, 1);
            p++;
        }
    }
    return r->want.len ? ks_buf_cstr(&r->want) : "";
}

/* The messages of the case named `where` are exactly want ($TMP: the scratch folder). */
#define CT_EXPECT_LOG(r, where, want) CHECK_TEXT((where), sink_text(&(r)->out), ct_tmp((r), (want)))

#endif
