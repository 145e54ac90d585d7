/* tokenizer_utf8.c — UTF-8 as Rust's str sees it (the reference tokenizer
 * library is Rust): validation, lossy repair with one U+FFFD per maximal
 * invalid subpart, and Unicode's White_Space property. */
#include "runtime/text/tokenizer_internal.h"

/* The valid range of the second byte after lead byte b (Unicode table 3-7). */
static int second_range(uint8_t b, uint8_t *lo, uint8_t *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b == 0xE0) { *lo = 0xA0; return 3; }
    if (b >= 0xE1 && b <= 0xEC) return 3;
    if (b == 0xED) { *hi = 0x9F; return 3; }
    if (b >= 0xEE && b <= 0xEF) return 3;
    if (b == 0xF0) { *lo = 0x90; return 4; }
    if (b >= 0xF1 && b <= 0xF3) return 4;
    if (b == 0xF4) { *hi = 0x8F; return 4; }
    return 0;
}

/* How a sequence at s looks: returns its full length when valid (and the
 * code point), else 0 with *prefix set to the length of the maximal subpart
 * (the longest start of a valid sequence, at least 1). */
static size_t classify(const uint8_t *s, size_t n, uint32_t *cp, size_t *prefix)
{
    *prefix = 1;
    if (n == 0) return 0;
    uint8_t b = s[0];
    if (b < 0x80) {
        if (cp) *cp = b;
        return 1;
    }
    uint8_t lo, hi;
    int need = second_range(b, &lo, &hi);
    if (need == 0) return 0;
    uint32_t c = b & (need == 2 ? 0x1F : need == 3 ? 0x0F : 0x07);
    for (int i = 1; i < need; i++) {
        if ((size_t)i >= n) return 0;
        uint8_t x = s[i];
        uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (x < l || x > h) return 0;
        c = c << 6 | (x & 0x3F);
        *prefix = (size_t)i + 1;
    }
    if (cp) *cp = c;
    return (size_t)need;
}

size_t krt_tok_utf8_valid_len(const uint8_t *s, size_t n, uint32_t *cp)
{
    size_t prefix;
    return classify(s, n, cp, &prefix);
}

size_t krt_tok_utf8_char_len(const uint8_t *s, size_t n)
{
    size_t prefix, len = classify(s, n, NULL, &prefix);
    return len ? len : 1;
}

void krt_tok_utf8_lossy(ks_buf *out, const char *s, size_t n)
{
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0, run = 0; /* run: start of the valid bytes not yet copied */
    while (i < n) {
        size_t prefix, len = classify(u + i, n - i, NULL, &prefix);
        if (len) {
            i += len;
            continue;
        }
        if (i > run) ks_buf_put(out, s + run, i - run);
        ks_buf_put(out, "\xEF\xBF\xBD", 3);
        i += prefix;
        run = i;
    }
    if (n > run) ks_buf_put(out, s + run, n - run);
}

int krt_tok_utf8_is_valid(const char *s, size_t n)
{
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        size_t prefix, len = classify(u + i, n - i, NULL, &prefix);
        if (!len) return 0;
        i += len;
    }
    return 1;
}

size_t krt_tok_utf8_incomplete_tail(const char *s, size_t n)
{
    const uint8_t *u = (const uint8_t *)s;
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        uint8_t b = u[n - back];
        if ((b & 0xC0) == 0x80) continue; /* a continuation byte: look further back */
        uint8_t lo, hi;
        int need = second_range(b, &lo, &hi);
        if (need == 0 || (size_t)need <= back) return 0;
        size_t prefix;
        classify(u + n - back, back, NULL, &prefix);
        return prefix == back ? back : 0;
    }
    return 0;
}


int krt_tok_is_space(uint32_t cp)
{
    /* Unicode 15 PropList.txt, White_Space. */
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}
