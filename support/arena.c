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
    size = (size + 15) & ~(size_t)15;
    if (!a->head || a->used + size > a->head->size) {
        size_t csize = size > KS_ARENA_MIN_CHUNK ? size : KS_ARENA_MIN_CHUNK;
        ks_arena_chunk *c = ks_xmalloc(sizeof *c + csize);
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
    vsnprintf(p, (size_t)n + 1, fmt, ap2);
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
}

void *ks_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) ks_die(__FILE__, __LINE__, "out of memory allocating %zu bytes", n);
    return p;
}

void *ks_xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) ks_die(__FILE__, __LINE__, "out of memory allocating %zu x %zu bytes", n, size);
    return p;
}

void *ks_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) ks_die(__FILE__, __LINE__, "out of memory reallocating %zu bytes", n);
    return q;
}

char *ks_xstrdup(const char *s)
{
    size_t n = strlen(s);
    char *p = ks_xmalloc(n + 1);
    memcpy(p, s, n + 1);
    return p;
}

void ks_grow_(void **ptr, size_t elem, size_t need, size_t *cap, size_t limit, const char *what)
{
    if (need <= *cap) return;
    if (need > limit) ks_die(__FILE__, __LINE__, "too many %s (limit %zu)", what, limit);
    size_t ncap = *cap ? *cap : 8;
    while (ncap < need) ncap = ncap > limit / 2 ? limit : ncap * 2;
    size_t bytes;
    if (!ks_mul_size(ncap, elem, &bytes)) ks_die(__FILE__, __LINE__, "too many %s", what);
    *ptr = ks_xrealloc(*ptr, bytes);
    memset((char *)*ptr + *cap * elem, 0, (ncap - *cap) * elem);
    *cap = ncap;
}

void ks_buf_put(ks_buf *b, const void *data, size_t n)
{
    KS_GROW(b->data, b->len + n + 1, b->cap, (size_t)1 << 40, "buffer bytes");
    if (n) memcpy(b->data + b->len, data, n); /* data may be NULL when n is 0 (an empty ks_buf) */
    b->len += n;
    b->data[b->len] = 0;
}

void ks_buf_puts(ks_buf *b, const char *s) { ks_buf_put(b, s, strlen(s)); }

void ks_buf_vprintf(ks_buf *b, const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    KS_ASSERT(n >= 0);
    KS_GROW(b->data, b->len + (size_t)n + 1, b->cap, (size_t)1 << 40, "buffer bytes");
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    b->len += (size_t)n;
}

void ks_buf_printf(ks_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ks_buf_vprintf(b, fmt, ap);
    va_end(ap);
}

const char *ks_buf_cstr(ks_buf *b)
{
    if (!b->data) ks_buf_put(b, "", 0);
    return b->data;
}

void ks_buf_free(ks_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}
