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

typedef struct ks_diag ks_diag;

/* ---- allocation -----------------------------------------------------------
 * Two kinds of call. The ks_try_* calls return NULL when memory runs out,
 * and the runtime (whatever runtime/kiln.h's calls reach: the engine, the
 * IR parser and verifier, sessions, tokenizers, backends) allocates only
 * through them and hands "out of memory" back to its caller. The ks_x* calls
 * end the process with a message instead: the compiler and the command line,
 * which have nothing better to do, use them. Both kinds go through one
 * place, so the fault injection below reaches every allocation of both. */
void *ks_try_malloc(size_t n);
void *ks_try_calloc(size_t n, size_t size); /* zeroed; NULL also when n * size overflows */
void *ks_try_realloc(void *p, size_t n);    /* NULL leaves p as it was */
char *ks_try_strdup(const char *s);

void *ks_xmalloc(size_t n);
void *ks_xcalloc(size_t n, size_t size);
void *ks_xrealloc(void *p, size_t n);
char *ks_xstrdup(const char *s);

/* Report `file: error: out of memory (allocating N bytes for WHAT)`, or
 * `(WHAT)` alone when bytes is 0 (a failure whose size is not known where it
 * is reported), counting it in d->oom too. Returns -1, for
 * `return ks_error_oom(...)`. */
int ks_error_oom(ks_diag *d, const char *file, size_t bytes, const char *what);

/* Fault injection, for tests (the way SQLite tests out of memory): after
 * ks_alloc_fail_after(n, all_after), the n-th allocation from then on
 * (ks_try_* and ks_x* alike, arenas' chunks and growing arrays included)
 * fails as if memory had run out, and with all_after every one after it
 * too; n = 0 turns it off and clears the count. ks_alloc_failures says how
 * many allocations it has failed since it was last set, so a test that
 * fails allocation n = 1, 2, 3, ... of a run knows it has covered them all
 * when a run ends with none failed. Process-wide state (support/alloc.c
 * says why that is the right exception here); off, it costs one atomic load
 * per allocation. */
void ks_alloc_fail_after(long n, int all_after);
long ks_alloc_failures(void);

/* ---- arenas --------------------------------------------------------------
 * An arena owns every allocation made from it until ks_arena_free. Each
 * owner names its arena for the lifetime it stands for (a graph's arena, a
 * pass's scratch arena, a parse's AST arena). Allocations are zeroed and
 * aligned to 16 bytes. Out of memory ends the process, unless the owner set
 * `fallible`: then an allocation that cannot be made returns NULL and
 * records its size in `failed` (the runtime's arenas). */
typedef struct ks_arena_chunk ks_arena_chunk;
typedef struct ks_arena {
    ks_arena_chunk *head; /* newest chunk first */
    size_t used;          /* bytes used in head */
    size_t total;         /* bytes handed out over the arena's life */
    int fallible;         /* 1: out of memory returns NULL (and sets failed) instead of ending the process */
    size_t failed;        /* 0, or the bytes of the last allocation that could not be made (fallible only) */
} ks_arena;

/* NULL only from a fallible arena out of memory (the three after it too). */
void *ks_arena_alloc(ks_arena *a, size_t size);
char *ks_arena_strdup(ks_arena *a, const char *s);
char *ks_arena_strndup(ks_arena *a, const char *s, size_t n);
char *ks_arena_printf(ks_arena *a, const char *fmt, ...) KS_PRINTF(2, 3);
void ks_arena_free(ks_arena *a); /* everything, failed too; fallible stays as it was */

/* Grow *ptr (an array of elements of size elem) so that it holds at least
 * need elements; *cap is its capacity. A need over limit is fatal with the
 * name of what grew, as Lua's luaM_growvector does; so is out of memory.
 * KS_TRY_GROW does the same but returns -1, leaving *ptr and *cap as they
 * were, where KS_GROW would end the process (over the limit, out of memory),
 * and 0 when the array grew or had room. */
void ks_grow_(void **ptr, size_t elem, size_t need, size_t *cap, size_t limit, const char *what);
int ks_try_grow_(void **ptr, size_t elem, size_t need, size_t *cap, size_t limit);
#define KS_GROW(ptr, need, cap, limit, what) \
    ks_grow_((void **)&(ptr), sizeof *(ptr), (need), &(cap), (limit), (what))
#define KS_TRY_GROW(ptr, need, cap, limit) ks_try_grow_((void **)&(ptr), sizeof *(ptr), (need), &(cap), (limit))

/* ---- strings --------------------------------------------------------------
 * A growable byte string. Out of memory ends the process, unless the owner
 * set `fallible` (the runtime's buffers: `ks_buf b = KS_BUF_TRY;`): then an
 * append that cannot grow the buffer leaves it as it was, returns -1 and
 * records the bytes it asked for in `failed`, and the appends after it do
 * nothing (SQLite's StrAccum accError): a caller appends freely and checks
 * `failed` once, at the end. */
typedef struct ks_buf {
    char *data;    /* NUL-terminated when len > 0 or after ks_buf_cstr; NULL until something is put */
    size_t len;    /* bytes used, without the NUL */
    size_t cap;    /* bytes allocated */
    int fallible;  /* 1: out of memory sets failed instead of ending the process */
    size_t failed; /* 0, or the bytes an append asked for and could not get (fallible only): the text is
                      incomplete, and stays so until ks_buf_clear or ks_buf_free */
} ks_buf;

#define KS_BUF_TRY {.fallible = 1} /* the initializer of a fallible buffer */

/* 0, or -1 when a fallible buffer has failed (now or before). */
int ks_buf_put(ks_buf *b, const void *data, size_t n);
int ks_buf_puts(ks_buf *b, const char *s);
int ks_buf_printf(ks_buf *b, const char *fmt, ...) KS_PRINTF(2, 3);
int ks_buf_vprintf(ks_buf *b, const char *fmt, va_list ap);
/* The text, NUL-terminated; "" when a fallible buffer holds nothing and
 * cannot get the byte for its NUL. */
const char *ks_buf_cstr(ks_buf *b);
void ks_buf_clear(ks_buf *b); /* len 0 and failed 0, keeping the memory */
/* For code that builds b's text out of other allocations: one of them failed
 * (asking for `bytes`, 0 when not known), so b's text is incomplete. A
 * fallible b is marked failed; for one that is not, it ends the process, as
 * an append would have. */
void ks_buf_fail(ks_buf *b, size_t bytes);
void ks_buf_free(ks_buf *b);  /* the memory, and failed; fallible stays as it was */

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

struct ks_diag {
    FILE *out;      /* where messages go; NULL: stderr */
    ks_buf *log;    /* if set, every message is appended here too */
    int errors;     /* errors reported so far */
    int oom;        /* of those, the ones that were out of memory (ks_error_oom): a caller that adds its own
                       words about a failure ("damaged: ...") leaves them out for these */
    int warnings;   /* warnings reported so far */
    int quiet;      /* if set, nothing goes to out (log still fills) */
    void (*before_print)(void *ctx); /* if set, called before a message goes to out (to erase a
                                        progress line on the terminal first) */
    void *before_ctx; /* its argument */
};

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
/* The process's largest resident set so far, bytes (/proc/self/status VmHWM, else getrusage: see
 * peak_memory.c for why not ru_maxrss first; 0 when unknown). */
uint64_t ks_peak_memory(void);
/* Seconds on the monotonic clock (from an arbitrary start): for durations. */
double ks_now_seconds(void);
/* Drop m's pages from this process's resident memory (they stay in the page cache and come back
 * on the next read): after reading what will not be read again soon. */
void ks_mmap_release(const ks_mmap *m);

/* An output file, written whole or not at all where that is possible:
 *  - a regular file, or a path where nothing is yet, is written to a temp
 *    file beside it (`target.tmp.<pid>`) that is renamed over it only when
 *    complete, so a failed command never leaves a half-written file;
 *  - a symlink is followed: the temp file goes beside the file it names, the
 *    link stays a link;
 *  - anything else (a device such as /dev/null, a FIFO, a terminal) is
 *    written straight through and never replaced (a FIFO's open waits for a
 *    reader, as any writer's does); with KS_OUT_SEEKABLE (a
 *    writer that seeks and reads back) the bytes go to an unlinked scratch
 *    file in $TMPDIR first, copied into it at commit.
 * Write with ks_outfile_write, which keeps the errno of the first failure;
 * ks_outfile_commit then flushes, syncs, closes and renames, and reports the
 * errno of the first step that failed ("No space left on device"). */
typedef enum ks_out_mode {
    KS_OUT_RENAME, /* a temp file renamed over target at commit */
    KS_OUT_DIRECT, /* f writes into the path itself */
    KS_OUT_COPY,   /* f is a scratch file, copied into the path at commit */
} ks_out_mode;

typedef struct ks_outfile {
    FILE *f;          /* write here; opened for reading too (w+b) unless KS_OUT_DIRECT */
    char *path;       /* the path as given: messages name it */
    char *target;     /* KS_OUT_RENAME: the file renamed over (path, its symlinks followed); else NULL */
    char *tmp_path;   /* KS_OUT_RENAME: where the bytes go until commit; else NULL */
    ks_out_mode mode; /* how the bytes reach the path */
    int err;          /* errno of the first failed write (or read back); 0: none so far */
    int cleanup;      /* ks_cleanup_add's id for tmp_path; 0: none */
} ks_outfile;

enum { KS_OUT_SEEKABLE = 1 }; /* ks_outfile_open flag: f must seek and read back */
int ks_outfile_open(ks_diag *d, ks_outfile *o, const char *path, int flags); /* 0, or -1 after reporting */
int ks_outfile_write(ks_outfile *o, const void *data, size_t n); /* 0, or -1 (o->err set; reported at commit) */
/* 0 ok; -1 after reporting `path: error: cannot write: <errno text>`, the temp file removed */
int ks_outfile_commit(ks_diag *d, ks_outfile *o);
void ks_outfile_abort(ks_outfile *o);              /* remove the temp file */

/* Temp files removed when a signal ends the process (support/cleanup.c).
 * ks_cleanup_add registers a path (the caller keeps the string alive until
 * ks_cleanup_remove) and returns an id, 0 when the table is full; ks_outfile
 * registers its temp files. ks_cleanup_on_signals, called once by a program
 * (the kiln command), installs the handler for SIGINT, SIGTERM and SIGHUP
 * (those not ignored): it unlinks the registered paths and dies of the
 * signal. 0, or -1 when sigaction fails. */
int ks_cleanup_add(const char *path);
void ks_cleanup_remove(int id);
int ks_cleanup_on_signals(void);

/* Join a folder and a file name into a heap string. */
char *ks_path_join(const char *dir, const char *name);
int ks_is_dir(const char *path);
int ks_file_exists(const char *path);

/* ---- numbers ---------------------------------------------------------------- */
float ks_f16_to_f32(uint16_t h);
float ks_bf16_to_f32(uint16_t h);
uint16_t ks_f32_to_f16(float f);  /* round to nearest even */
uint16_t ks_f32_to_bf16(float f); /* round to nearest even */
/* FP8 E4M3 (OCP's e4m3fn: bias 7, no infinities, S.1111.111 NaN). */
float ks_e4m3_to_f32(uint8_t b);
uint8_t ks_f32_to_e4m3(float f);  /* round to nearest even, saturating at +-448; NaN: 0x7f */

/* The element formats of stored float data (support does not know the IR's
 * dtypes: kir_float_kind maps them). */
typedef enum ks_float_kind {
    KS_FLOAT_F32,  /* IEEE binary32, 4 bytes */
    KS_FLOAT_F16,  /* IEEE binary16, 2 bytes */
    KS_FLOAT_BF16, /* bfloat16, 2 bytes */
} ks_float_kind;
/* n elements of little-endian data of that kind at src (any alignment: data in a
 * file mapping) as floats into out (not overlapping src), whatever the host's byte
 * order. One loop per kind, written so that the compiler can vectorize them (bf16,
 * the common one, vectorizes at -O3). */
void ks_decode_f32(const void *restrict src, ks_float_kind kind, size_t n, float *restrict out);
/* Little-endian integers at src (any alignment). */
uint32_t ks_load_le32(const void *src);
int32_t ks_load_le_i32(const void *src);
uint64_t ks_load_le64(const void *src);

/* A 64-bit checksum (FNV-1a over 8-byte words), continued from h: start
 * with KS_HASH_SEED. Chunked calls give the same result as one call only
 * when every chunk but the last is a multiple of 8 bytes long. */
#define KS_HASH_SEED 0xcbf29ce484222325ull
uint64_t ks_hash64(uint64_t h, const void *data, size_t n);

/* A byte count for people: "512 bytes", "12.0 MiB", "1.5 GiB" into buf;
 * returns buf. */
const char *ks_human_bytes(double bytes, char *buf, size_t len);

/* ---- text ------------------------------------------------------------------- */
/* Code point cp (below 0x110000) as UTF-8 into out; returns the bytes written (1 to 4). */
int ks_utf8_encode(uint32_t cp, char out[4]);

/* ---- hash maps ----------------------------------------------------------------
 * ks_hmap maps keys to 64-bit values (an index, an id, two 32-bit numbers), by open
 * addressing with linear probing (support/hmap.c). One map holds one kind of key:
 * byte strings (the _str calls; the bytes are not copied and must outlive the map)
 * or 64-bit integers (the _u64 calls). Its slots come from an arena when it is given
 * one (growing leaves the old slots there) or else from the heap (ks_hmap_free). It
 * holds at most `limit` keys: one more is fatal, naming `what`, as KS_GROW is. Out
 * of memory is not: a put that cannot grow the map returns NULL, leaving the map as
 * it was (the runtime's maps go on; the compiler's callers end the process).
 *
 *     ks_hmap by_name;
 *     ks_hmap_init(&by_name, NULL, 0, 1 << 20, "tensor names");
 *     int added;
 *     uint64_t *slot = ks_hmap_put_str(&by_name, name, strlen(name), &added);
 *     if (!slot) ... out of memory
 *     if (added) *slot = index; else ... name was there, with index *slot
 *     const uint64_t *at = ks_hmap_get_str(&by_name, name, strlen(name)); // NULL: absent
 *     ks_hmap_free(&by_name);
 */
typedef struct ks_hmap_slot {
    uint64_t hash;   /* the key's hash; 0 marks an empty slot (a key never hashes to 0) */
    uint64_t key;    /* a u64 key itself; for a string key, its length in bytes */
    const char *str; /* a string key's bytes (not owned); NULL for a u64 key */
    uint64_t val;    /* the value */
} ks_hmap_slot;

typedef struct ks_hmap {
    ks_hmap_slot *slots; /* [mask + 1], at most half full; NULL until the first key */
    size_t mask;         /* slot count - 1 (a power of two minus one) */
    size_t count;        /* keys stored */
    size_t limit;        /* most keys it may hold */
    const char *what;    /* what its keys are, for the message past the limit ("tensor names") */
    ks_arena *arena;     /* where its slots come from; NULL: the heap */
} ks_hmap;

/* An empty map with room for n keys before it grows (n may be 0). 0, or -1 when
 * the room cannot be had (the map is then empty, with no room). */
int ks_hmap_init(ks_hmap *m, ks_arena *arena, size_t n, size_t limit, const char *what);
void ks_hmap_free(ks_hmap *m); /* the heap's slots; nothing for an arena's. The map is then empty. */
/* The value of key, added as 0 when absent (*added, when given, says which); NULL
 * when it is absent and the map cannot grow to take it. The pointer holds until
 * the next put. */
uint64_t *ks_hmap_put_str(ks_hmap *m, const char *key, size_t len, int *added);
uint64_t *ks_hmap_put_u64(ks_hmap *m, uint64_t key, int *added);
/* The value of key, or NULL when absent. */
const uint64_t *ks_hmap_get_str(const ks_hmap *m, const char *key, size_t len);
const uint64_t *ks_hmap_get_u64(const ks_hmap *m, uint64_t key);

/* Checked arithmetic for sizes from untrusted files: 0 on overflow. */
int ks_mul_size(size_t a, size_t b, size_t *out);
int ks_add_size(size_t a, size_t b, size_t *out);

#endif
