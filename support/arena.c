/* arena.c — arenas with named lifetimes, growable arrays and string buffers. */
#include "support.h"

#include <stdlib.h>
#include <string.h>

struct ks_arena_chunk {
    ks_arena_chunk *next; /* older chunk */
    size_t size;          /* usable bytes in data */
    _Alignas(16) unsigned char data[];
};

enum { KS_ARENA_MIN_CHUNK = 64 * 1024 };

void *ks_arena_alloc(ks_arena *a, size_t size)
{
    if (size > SIZE_MAX - 15 - sizeof(ks_arena_chunk)) { /* no chunk can hold it */
        if (!a->fallible) ks_die(__FILE__, __LINE__, "arena allocation of %zu bytes", size);
        a->failed = size;
        return NULL;
    }
    size = (size + 15) & ~(size_t)15;
    if (!a->head || a->used + size > a->head->size) {
        size_t csize = size > KS_ARENA_MIN_CHUNK ? size : KS_ARENA_MIN_CHUNK;
        ks_arena_chunk *c = a->fallible ? ks_try_malloc(sizeof *c + csize) : ks_xmalloc(sizeof *c + csize);
        if (!c) {
            a->failed = sizeof *c + csize;
            return NULL;
        }
        c->next = a->head;
        c->size = csize;
        a->head = c;
        a->used = 0;
    }
    void *p = a->head->data + a->used;
    a->used += size;
    a->total += size;
    memset(p, 0, size);
    return p;
}

char *ks_arena_strndup(ks_arena *a, const char *s, size_t n)
{
    char *p = ks_arena_alloc(a, n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

char *ks_arena_strdup(ks_arena *a, const char *s) { return ks_arena_strndup(a, s, strlen(s)); }

char *ks_arena_printf(ks_arena *a, const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    KS_ASSERT(n >= 0);
    char *p = ks_arena_alloc(a, (size_t)n + 1);
    if (p) vsnprintf(p, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return p;
}

void ks_arena_free(ks_arena *a)
{
    ks_arena_chunk *c = a->head;
    while (c) {
        ks_arena_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->used = 0;
    a->total = 0;
    a->failed = 0;
}

int ks_try_grow_(void **ptr, size_t elem, size_t need, size_t *cap, size_t limit)
{
    if (need <= *cap) return 0;
    if (need > limit) return -1;
    size_t ncap = *cap ? *cap : 8;
    while (ncap < need) ncap = ncap > limit / 2 ? limit : ncap * 2;
    size_t bytes;
    if (!ks_mul_size(ncap, elem, &bytes)) return -1;
    void *p = ks_try_realloc(*ptr, bytes);
    if (!p) return -1;
    memset((char *)p + *cap * elem, 0, (ncap - *cap) * elem);
    *ptr = p;
    *cap = ncap;
    return 0;
}

void ks_grow_(void **ptr, size_t elem, size_t need, size_t *cap, size_t limit, const char *what)
{
    if (need <= *cap) return;
    if (need > limit) ks_die(__FILE__, __LINE__, "too many %s (limit %zu)", what, limit);
    size_t bytes;
    if (!ks_mul_size(need, elem, &bytes)) ks_die(__FILE__, __LINE__, "too many %s", what);
    if (ks_try_grow_(ptr, elem, need, cap, limit) != 0) {
        fprintf(stderr, "kiln: error: out of memory (growing the %s to %zu)\n", what, need);
        abort();
    }
}

/* Room in b for n more bytes and a NUL: 0, or -1 (fallible; failed set) when it cannot be had. */
static int buf_reserve(ks_buf *b, size_t n)
{
    if (b->failed) return -1;
    size_t need;
    int fits = ks_add_size(b->len, n, &need) && ks_add_size(need, 1, &need);
    if (fits && need <= b->cap) return 0;
    if (!b->fallible) {
        KS_GROW(b->data, b->len + n + 1, b->cap, (size_t)1 << 40, "buffer bytes");
        return 0;
    }
    if (!fits || KS_TRY_GROW(b->data, need, b->cap, (size_t)1 << 40) != 0) {
        b->failed = fits ? need : SIZE_MAX;
        return -1;
    }
    return 0;
}

int ks_buf_put(ks_buf *b, const void *data, size_t n)
{
    if (buf_reserve(b, n) != 0) return -1;
    if (n) memcpy(b->data + b->len, data, n); /* data may be NULL when n is 0 (an empty ks_buf) */
    b->len += n;
    b->data[b->len] = 0;
    return 0;
}

int ks_buf_puts(ks_buf *b, const char *s) { return ks_buf_put(b, s, strlen(s)); }

int ks_buf_vprintf(ks_buf *b, const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    KS_ASSERT(n >= 0);
    int rc = buf_reserve(b, (size_t)n);
    if (rc == 0) {
        vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap2);
        b->len += (size_t)n;
    }
    va_end(ap2);
    return rc;
}

int ks_buf_printf(ks_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = ks_buf_vprintf(b, fmt, ap);
    va_end(ap);
    return rc;
}

const char *ks_buf_cstr(ks_buf *b)
{
    if (!b->data && buf_reserve(b, 0) == 0) b->data[0] = 0;
    return b->data ? b->data : "";
}

void ks_buf_clear(ks_buf *b)
{
    b->len = 0;
    b->failed = 0;
    if (b->data) b->data[0] = 0;
}

void ks_buf_fail(ks_buf *b, size_t bytes)
{
    if (!b->fallible) {
        fprintf(stderr, "kiln: error: out of memory (allocating %zu bytes)\n", bytes);
        abort();
    }
    if (!b->failed) b->failed = bytes ? bytes : 1;
}

void ks_buf_free(ks_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->failed = 0;
}
