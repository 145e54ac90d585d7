/* ckpt_test.c — scratch files, logged diagnostics and checks for the
 * checkpoint tests (see ckpt_test.h). */
#include "ckpt_test.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* $KILN_SHARED, else ../shared beside $KILN_SOURCE, else ../shared. */
static void find_shared(ct_run *r)
{
    const char *s = getenv("KILN_SHARED"), *src = getenv("KILN_SOURCE");
    if (s && *s)
        snprintf(r->shared, sizeof r->shared, "%s", s);
    else if (src && *src)
        snprintf(r->shared, sizeof r->shared, "%s/../shared", src);
    else
        snprintf(r->shared, sizeof r->shared, "../shared");
}

void ct_init(ct_run *r)
{
    memset(r, 0, sizeof *r);
    snprintf(r->dir, sizeof r->dir, "/tmp/kiln-ckpt-XXXXXX");
    if (!mkdtemp(r->dir)) {
        perror("mkdtemp");
        exit(2);
    }
    r->diag.quiet = 1;
    r->diag.log = &r->log;
    find_shared(r);
}

static void remember(ct_run *r, char *path)
{
    KS_GROW(r->files, r->n_files + 1, r->cap_files, 1 << 16, "scratch files");
    r->files[r->n_files++] = path;
}

int ct_finish(ct_run *r, const char *what)
{
    /* Newest first: files before the folders that hold them. */
    for (size_t i = r->n_files; i-- > 0;) {
        if (remove(r->files[i]) != 0) perror(r->files[i]);
        free(r->files[i]);
    }
    free(r->files);
    if (rmdir(r->dir) != 0) perror(r->dir);
    ks_buf_free(&r->log);
    printf("%s: %d checks, %d failed\n", what, r->checks, r->failures);
    return r->failures ? 1 : 0;
}

const char *ct_mkdir(ct_run *r, const char *name)
{
    char *path = ks_path_join(r->dir, name);
    if (mkdir(path, 0700) != 0) {
        perror(path);
        exit(2);
    }
    remember(r, path);
    return path;
}

const char *ct_write(ct_run *r, const char *name, const void *data, size_t len)
{
    char *path = ks_path_join(r->dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        perror(path);
        exit(2);
    }
    remember(r, path);
    return path;
}

const char *ct_write_st(ct_run *r, const char *name, const char *header, const void *data, size_t len)
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

void ct_reset(ct_run *r)
{
    r->log.len = 0;
    if (r->log.data) r->log.data[0] = 0;
    r->diag.errors = r->diag.warnings = 0;
}

void ct_expect_log(ct_run *r, const char *where, const char *want)
{
    ks_buf w = {0};
    for (const char *p = want; *p;) {
        if (strncmp(p, "$TMP", 4) == 0) {
            ks_buf_puts(&w, r->dir);
            p += 4;
        } else {
            ks_buf_put(&w, p, 1);
            p++;
        }
    }
    const char *got = r->log.len ? r->log.data : "";
    const char *exp = w.len ? w.data : "";
    r->checks++;
    if (strcmp(got, exp) != 0) ct_fail(r, where, 0, "message differs\n  got:      %s  expected: %s", got, exp);
    ks_buf_free(&w);
}

void ct_fail(ct_run *r, const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (line)
        fprintf(stderr, "%s:%d: ", file, line);
    else
        fprintf(stderr, "%s: ", file);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    r->failures++;
}
