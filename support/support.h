/*
 * support.h — the few things every kiln module shares: arenas with named
 * lifetimes, growable arrays with named limits, diagnostics that point at the
 * text, internal asserts, and small file helpers.
 *
 * Prefix: ks_ (kiln support).
 *
 * Conventions used across kiln:
 *  - user errors (bad .kiln text, bad config, bad checkpoint, bad engine) are
 *    reported through a ks_diag and counted; library code returns an error
 *    code and never calls exit();
 *  - broken internal invariants are KS_ASSERT failures that name the C file
 *    and line and abort: they are kiln's bugs, not the user's.
 */
#ifndef KILN_SUPPORT_H
#define KILN_SUPPORT_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define KS_PRINTF(fmt_idx, arg_idx) __attribute__((format(printf, fmt_idx, arg_idx)))
#define KS_NORETURN __attribute__((noreturn))

/* ---- internal invariants (kiln's bugs, not the user's) ------------------ */
KS_NORETURN void ks_die(const char *file, int line, const char *fmt, ...) KS_PRINTF(3, 4);
#define KS_ASSERT(cond)                                                        \
    do {                                                                       \
        if (!(cond)) ks_die(__FILE__, __LINE__, "assertion failed: %s", #cond); \
    } while (0)
#define KS_UNREACHABLE() ks_die(__FILE__, __LINE__, "unreachable")

/* ---- arenas --------------------------------------------------------------
 * An arena owns every allocation made from it until ks_arena_free. Each
 * owner names its arena for the lifetime it stands for (a graph's arena, a
 * pass's scratch arena, a parse's AST arena). Allocations are zeroed and
 * aligned to 16 bytes. Out of memory is fatal (ks_die): kiln cannot go on. */
typedef struct ks_arena_chunk ks_arena_chunk;
typedef struct ks_arena {
    ks_arena_chunk *head; /* newest chunk first */
    size_t used;          /* bytes used in head */
    size_t total;         /* bytes handed out over the arena's life */
} ks_arena;

void *ks_arena_alloc(ks_arena *a, size_t size);
char *ks_arena_strdup(ks_arena *a, const char *s);
char *ks_arena_strndup(ks_arena *a, const char *s, size_t n);
char *ks_arena_printf(ks_arena *a, const char *fmt, ...) KS_PRINTF(2, 3);
void ks_arena_free(ks_arena *a);

/* ---- heap helpers that die on OOM ---------------------------------------- */
void *ks_xmalloc(size_t n);
void *ks_xcalloc(size_t n, size_t size);
void *ks_xrealloc(void *p, size_t n);
char *ks_xstrdup(const char *s);

/* Grow *ptr (an array of elements of size elem) so that it holds at least
 * need elements; *cap is its capacity. A need over limit is fatal with the
 * name of what grew, as Lua's luaM_growvector does. */
void ks_grow_(void **ptr, size_t elem, size_t need, size_t *cap, size_t limit, const char *what);
#define KS_GROW(ptr, need, cap, limit, what) \
    ks_grow_((void **)&(ptr), sizeof *(ptr), (need), &(cap), (limit), (what))

/* ---- strings -------------------------------------------------------------- */
typedef struct ks_buf {
    char *data;  /* NUL-terminated when len > 0 or after ks_buf_cstr */
    size_t len;  /* bytes used, without the NUL */
    size_t cap;  /* bytes allocated */
} ks_buf;

void ks_buf_put(ks_buf *b, const void *data, size_t n);
void ks_buf_puts(ks_buf *b, const char *s);
void ks_buf_printf(ks_buf *b, const char *fmt, ...) KS_PRINTF(2, 3);
void ks_buf_vprintf(ks_buf *b, const char *fmt, va_list ap);
const char *ks_buf_cstr(ks_buf *b);
void ks_buf_free(ks_buf *b);

/* ---- diagnostics ----------------------------------------------------------
 * Messages read `file:line:col: error: text`, followed by the source line
 * and a caret under the column, when the text is known; `file: error: text`
 * when there is no place in a text (a checkpoint, an engine file). Every
 * message goes to `out` (stderr by default) and, when `log` is set, is also
 * appended to it, so tests can pin the exact message. */
typedef struct ks_source {
    const char *name; /* file name as the user gave it */
    const char *text; /* whole text, NUL-terminated; may be NULL */
    size_t len;       /* bytes in text */
} ks_source;

typedef struct ks_diag {
    FILE *out;      /* where messages go; NULL: stderr */
    ks_buf *log;    /* if set, every message is appended here too */
    int errors;     /* errors reported so far */
    int warnings;   /* warnings reported so far */
    int quiet;      /* if set, nothing goes to out (log still fills) */
} ks_diag;

void ks_error_at(ks_diag *d, const ks_source *src, int line, int col, const char *fmt, ...) KS_PRINTF(5, 6);
void ks_verror_at(ks_diag *d, const ks_source *src, int line, int col, const char *fmt, va_list ap);
void ks_note_at(ks_diag *d, const ks_source *src, int line, int col, const char *fmt, ...) KS_PRINTF(5, 6);
/* An error about a whole file (or a place in a binary file, in the text). */
void ks_error(ks_diag *d, const char *file, const char *fmt, ...) KS_PRINTF(3, 4);
void ks_verror(ks_diag *d, const char *file, const char *fmt, va_list ap);
/* A warning about a whole file: `file: warning: text`; counts in d->warnings. */
void ks_warning(ks_diag *d, const char *file, const char *fmt, ...) KS_PRINTF(3, 4);
/* Pass on what `from` reported into its log (a quiet ks_diag of a worker
 * thread, say): the text goes to d as if reported there, the counts add up. */
void ks_diag_forward(ks_diag *d, const ks_diag *from);

/* ---- files ----------------------------------------------------------------- */
/* Read a whole file into a NUL-terminated heap buffer. On failure reports
 * `path: error: cannot read: <reason>` and returns NULL. */
char *ks_read_file(ks_diag *d, const char *path, size_t *len_out);

/* A read-only memory map of a whole file. */
typedef struct ks_mmap {
    const uint8_t *data; /* NULL when empty or unmapped */
    size_t size;         /* bytes */
} ks_mmap;
int ks_mmap_open(ks_diag *d, const char *path, ks_mmap *m); /* 0 ok, -1 error reported */
void ks_mmap_close(ks_mmap *m);

/* Output files are written to `path.tmp.<pid>` and renamed over `path` only
 * when complete, so a failed command never leaves a half-written file. */
typedef struct ks_outfile {
    FILE *f;        /* write here */
    char *path;     /* final path */
    char *tmp_path; /* where the bytes go until commit */
} ks_outfile;
int ks_outfile_open(ks_diag *d, ks_outfile *o, const char *path);
int ks_outfile_commit(ks_diag *d, ks_outfile *o); /* 0 ok; on error the temp file is removed */
void ks_outfile_abort(ks_outfile *o);              /* remove the temp file */

/* Join a folder and a file name into a heap string. */
char *ks_path_join(const char *dir, const char *name);
int ks_is_dir(const char *path);
int ks_file_exists(const char *path);

/* ---- numbers ---------------------------------------------------------------- */
float ks_f16_to_f32(uint16_t h);
float ks_bf16_to_f32(uint16_t h);
uint16_t ks_f32_to_f16(float f);  /* round to nearest even */
uint16_t ks_f32_to_bf16(float f); /* round to nearest even */

/* A 64-bit checksum (FNV-1a over 8-byte words), continued from h: start
 * with KS_HASH_SEED. Chunked calls give the same result as one call only
 * when every chunk but the last is a multiple of 8 bytes long. */
#define KS_HASH_SEED 0xcbf29ce484222325ull
uint64_t ks_hash64(uint64_t h, const void *data, size_t n);

/* Checked arithmetic for sizes from untrusted files: 0 on overflow. */
int ks_mul_size(size_t a, size_t b, size_t *out);
int ks_add_size(size_t a, size_t b, size_t *out);

#endif
