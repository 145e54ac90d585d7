/*
 * json_locate.c — the line and column of a value in a JSON text, found by
 * walking the text along a key path (see json_locate.h). Values that are
 * not on the path are skipped by counting brackets outside strings, so the
 * walk is one pass over the text before the value, with no recursion.
 */
#include "support/json_locate.h"

#include <string.h>

typedef struct scan {
    const char *p;   /* next byte */
    const char *end; /* one past the text */
} scan;

static void skip_ws(scan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r')) s->p++;
}

static int at(const scan *s, char c) { return s->p < s->end && *s->p == c; }

static int hex4(const char *p, const char *end, unsigned *out)
{
    if (end - p < 4) return -1;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

/* One character of a string's body, decoded into UTF-8 bytes out[0..*n).
 * s->p is inside the string, not at its closing quote. -1: malformed. */
static int next_char(scan *s, unsigned char out[4], int *n)
{
    if (*s->p != '\\') {
        out[0] = (unsigned char)*s->p++;
        *n = 1;
        return 0;
    }
    if (s->end - s->p < 2) return -1;
    char e = s->p[1];
    s->p += 2;
    const char *simple = "\"\"\\\\//b\bf\fn\nr\rt\t";
    for (const char *q = simple; *q; q += 2) {
        if (*q == e) {
            out[0] = (unsigned char)q[1];
            *n = 1;
            return 0;
        }
    }
    if (e != 'u') return -1;
    unsigned cp;
    if (hex4(s->p, s->end, &cp) != 0) return -1;
    s->p += 4;
    if (cp >= 0xd800 && cp <= 0xdbff) { /* a high surrogate: its low half follows */
        unsigned lo;
        if (s->end - s->p < 6 || s->p[0] != '\\' || s->p[1] != 'u' || hex4(s->p + 2, s->end, &lo) != 0 ||
            lo < 0xdc00 || lo > 0xdfff)
            return -1;
        s->p += 6;
        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
    } else if (cp >= 0xdc00 && cp <= 0xdfff) {
        return -1;
    }
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        *n = 1;
    } else if (cp < 0x800) {
        out[0] = (unsigned char)(0xc0 | cp >> 6);
        out[1] = (unsigned char)(0x80 | (cp & 0x3f));
        *n = 2;
    } else if (cp < 0x10000) {
        out[0] = (unsigned char)(0xe0 | cp >> 12);
        out[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (unsigned char)(0x80 | (cp & 0x3f));
        *n = 3;
    } else {
        out[0] = (unsigned char)(0xf0 | cp >> 18);
        out[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
        out[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        out[3] = (unsigned char)(0x80 | (cp & 0x3f));
        *n = 4;
    }
    return 0;
}

/* The string at s->p (its opening quote): step past it and say whether
 * its decoded text is key (when key is not NULL). -1: malformed. */
static int read_string(scan *s, const char *key, int *equal)
{
    if (!at(s, '"')) return -1;
    s->p++;
    size_t k = 0, key_len = key ? strlen(key) : 0;
    int same = key != NULL;
    while (s->p < s->end && *s->p != '"') {
        unsigned char c[4];
        int n;
        if (next_char(s, c, &n) != 0) return -1;
        if (same && (k + (size_t)n > key_len || memcmp(key + k, c, (size_t)n) != 0)) same = 0;
        k += (size_t)n;
    }
    if (!at(s, '"')) return -1;
    s->p++;
    if (equal) *equal = same && k == key_len;
    return 0;
}

/* Step past the value at s->p. -1: malformed (or nothing there). */
static int skip_value(scan *s)
{
    if (at(s, '"')) return read_string(s, NULL, NULL);
    if (at(s, '{') || at(s, '[')) {
        size_t depth = 0;
        while (s->p < s->end) {
            char c = *s->p;
            if (c == '"') {
                if (read_string(s, NULL, NULL) != 0) return -1;
                continue;
            }
            s->p++;
            if (c == '{' || c == '[') depth++;
            else if ((c == '}' || c == ']') && --depth == 0) return 0;
        }
        return -1;
    }
    const char *start = s->p;
    while (s->p < s->end && !strchr(",]} \t\r\n", *s->p)) s->p++;
    return s->p > start ? 0 : -1;
}

/* At an object: move to the value of its member key. */
static int enter_member(scan *s, const char *key)
{
    if (!at(s, '{')) return -1;
    s->p++;
    skip_ws(s);
    if (at(s, '}')) return -1;
    for (;;) {
        int equal;
        if (read_string(s, key, &equal) != 0) return -1;
        skip_ws(s);
        if (!at(s, ':')) return -1;
        s->p++;
        skip_ws(s);
        if (equal) return 0;
        if (skip_value(s) != 0) return -1;
        skip_ws(s);
        if (!at(s, ',')) return -1; /* '}': not there */
        s->p++;
        skip_ws(s);
    }
}

/* At an array: move to its element `index`. */
static int enter_element(scan *s, int64_t index)
{
    if (!at(s, '[') || index < 0) return -1;
    s->p++;
    skip_ws(s);
    if (at(s, ']')) return -1;
    for (int64_t i = 0; i < index; i++) {
        if (skip_value(s) != 0) return -1;
        skip_ws(s);
        if (!at(s, ',')) return -1; /* ']': too few elements */
        s->p++;
        skip_ws(s);
    }
    return 0;
}

int ks_json_locate(const char *text, size_t len, const ks_json_step *steps, size_t n, int *line, int *col)
{
    if (!text) return -1;
    scan s = {text, text + len};
    skip_ws(&s);
    for (size_t i = 0; i < n; i++) {
        int rc = steps[i].key ? enter_member(&s, steps[i].key) : enter_element(&s, steps[i].index);
        if (rc != 0) return -1;
    }
    if (s.p >= s.end) return -1;
    int l = 1;
    const char *line_start = text;
    for (const char *q = text; q < s.p; q++) {
        if (*q == '\n') {
            l++;
            line_start = q + 1;
        }
    }
    *line = l;
    *col = (int)(s.p - line_start) + 1;
    return 0;
}
