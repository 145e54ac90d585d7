/*
 * chat_template.c — a Jinja2 subset for Hugging Face chat templates (see
 * chat_template.h for what it covers).
 *
 * Three stages, as Jinja has them (jinja2/lexer.py, parser.py, and a tree
 * walker where Jinja compiles to Python):
 *  - the lexer cuts the text into data and tag tokens, applying whitespace
 *    control the way Jinja's lexer does with trim_blocks and lstrip_blocks
 *    (transformers' settings): `{%-` strips the data before, `-%}` the
 *    whitespace after, a block or comment tag alone on its line takes the
 *    line's indentation, and the newline after `%}` or `#}` goes;
 *  - a recursive-descent parser with Jinja's precedence (parse_condexpr down
 *    to parse_unary, filters and tests binding tighter than arithmetic) builds
 *    the tree in the template's arena; unknown tags, filters and tests are
 *    syntax errors, as Jinja finds them at compile time;
 *  - the renderer walks the tree with values in an arena per render, scopes
 *    as a chain of frames (a for loop's body gets a fresh frame each
 *    iteration, so a `set` in it does not outlive the iteration; `if` makes
 *    none), and Python's semantics where templates see them: truthiness,
 *    == across int/float/bool, floor division and modulo, str() and repr()
 *    of values, json.dumps.
 * Every user error, at parse or render time, is reported once, located at
 * the text as `name:LINE:COL`; nothing here aborts on any input.
 */
#include "server/chat_template.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum {
    TPL_MAX_DEPTH = 96,          /* nesting of expressions, and of blocks, in the parser */
    TPL_MAX_ITEMS = 1 << 20,     /* items of a list built by a render (range, *, +) */
    TPL_MAX_TOKENS = 1 << 24,    /* tokens of one template */
};
#define TPL_MAX_STR ((size_t)64 << 20) /* bytes of one string a render builds, and of its output */
#define TPL_MAX_STEPS 50000000L        /* statements and expressions one render may evaluate */
#define TPL_MAX_MEMORY ((size_t)256 << 20) /* bytes one render may take for its values */

/* ==== UTF-8, and whitespace as Python's str.isspace() sees it ============================== */

/* The code point at s[i] (lenient: a byte that starts no valid sequence is itself), its length in *len. */
static uint32_t utf8_decode(const char *s, size_t n, size_t i, size_t *len)
{
    const unsigned char *u = (const unsigned char *)s;
    unsigned c = u[i];
    size_t need = c >= 0xF0 && c < 0xF8 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (c >= 0xF8) need = 1;
    if (need == 1 || i + need > n) {
        *len = 1;
        return c;
    }
    uint32_t cp = c & (0x7F >> need);
    for (size_t k = 1; k < need; k++) {
        if ((u[i + k] & 0xC0) != 0x80) {
            *len = 1;
            return c;
        }
        cp = cp << 6 | (u[i + k] & 0x3F);
    }
    *len = need;
    return cp;
}


static int py_isspace(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

/* Length of s[0..n) without its trailing whitespace. */
static size_t rstrip_len(const char *s, size_t n)
{
    while (n > 0) {
        size_t j = n - 1, len;
        while (j > 0 && n - j < 4 && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
        uint32_t c = utf8_decode(s, n, j, &len);
        if (j + len != n) { /* not a whole sequence: a lone byte */
            j = n - 1;
            c = (unsigned char)s[j];
        }
        if (!py_isspace(c)) break;
        n = j;
    }
    return n;
}

/* Bytes of leading whitespace in s[0..n). */
static size_t lstrip_off(const char *s, size_t n)
{
    size_t i = 0, len;
    while (i < n && py_isspace(utf8_decode(s, n, i, &len))) i += len;
    return i;
}

static size_t utf8_count(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0, len; i < n; i += len, k++) utf8_decode(s, n, i, &len);
    return k;
}

/* ==== values ================================================================================== */

typedef enum vkind {
    V_UNDEF, /* an undefined name or missing item; name says which, for the message */
    V_NONE,
    V_BOOL,
    V_INT,
    V_FLOAT,
    V_STR,
    V_LIST,  /* also tuples (is_tuple) */
    V_DICT,
    V_NS,    /* namespace(...): a mapping whose attributes can be set */
    V_LOOP,  /* a for loop's `loop` */
    V_FUNC,  /* a global function */
    V_METHOD /* a method bound to its object, found by attribute and waiting for its call */
} vkind;

typedef struct tlist tlist;
typedef struct tdict tdict;
typedef struct tloop tloop;

typedef struct tval {
    vkind kind;
    union {
        int b;          /* V_BOOL */
        int64_t i;      /* V_INT; V_FUNC: its builtin id */
        double f;       /* V_FLOAT */
        tlist *list;    /* V_LIST */
        tdict *dict;    /* V_DICT, V_NS */
        tloop *loop;    /* V_LOOP */
        struct tval *self; /* V_METHOD: the object */
    };
    const char *s; /* V_STR: the bytes (not NUL-terminated in general); V_UNDEF: the name, or NULL;
                      V_METHOD: the method's name */
    size_t len;    /* V_STR: bytes */
} tval;

struct tlist {
    tval *v;      /* [n] items */
    int n;
    int is_tuple; /* 1: prints as (a, b) */
};

struct tdict {
    tval *keys, *vals; /* [n] in insertion order */
    int n, cap;
};

struct tloop {
    const tlist *items; /* what the loop goes over (after its `if` filter) */
    int index0;         /* the current item */
};

static const tval V_UNDEFINED = {.kind = V_UNDEF};

static tval v_bool(int b) { return (tval){.kind = V_BOOL, .b = !!b}; }
static tval v_int(int64_t i) { return (tval){.kind = V_INT, .i = i}; }
static tval v_float(double f) { return (tval){.kind = V_FLOAT, .f = f}; }
static tval v_str(const char *s, size_t len) { return (tval){.kind = V_STR, .s = s, .len = len}; }
static tval v_none(void) { return (tval){.kind = V_NONE}; }

/* ==== the tree ================================================================================== */

typedef enum nkind {
    /* statements */
    N_TEXT,   /* data: k */
    N_OUTPUT, /* {{ a }} */
    N_IF,     /* if a: body, else alt */
    N_FOR,    /* for names[n_names] in a (if b): body, else alt */
    N_SET,    /* set names[n_names] = a; or set name.attr (attr) = a */
    N_SETBLK, /* set names[0]: body */
    N_BREAK,
    N_CONTINUE,
    N_BLOCK,  /* body (generation) */
    /* expressions */
    E_CONST,  /* k */
    E_NAME,   /* name */
    E_ATTR,   /* a.attr */
    E_ITEM,   /* a[b] */
    E_SLICE,  /* a[b:c:d]; each of b c d may be NULL */
    E_CALL,   /* a(args, kw) */
    E_FILTER, /* a | op(args, kw) */
    E_TEST,   /* a is [not] op(args) */
    E_BIN,    /* a op b (arithmetic) */
    E_NEG,    /* -a */
    E_POS,    /* +a */
    E_NOT,
    E_AND,
    E_OR,
    E_COND,    /* b if a else c (c may be NULL) */
    E_COMPARE, /* a op[0] args[0] op[1] args[1] ... (ops in cmp_ops) */
    E_LIST,
    E_TUPLE,
    E_DICT /* args: key, value, key, value, ... */
} nkind;

typedef struct node node;
struct node {
    nkind kind;
    int line, col;     /* where it starts in the text */
    int op;            /* E_BIN: an operator; E_FILTER/E_TEST: the builtin; E_TEST: negated is neg */
    int neg;           /* E_TEST: `is not` */
    node *a, *b, *c, *d; /* operands, as each kind says */
    node **args;       /* [n_args] statements of a body, items, positional arguments */
    int n_args;
    node **alt;        /* [n_alt] the else body */
    int n_alt;
    node **kw;         /* [n_kw] keyword arguments' values */
    const char **kw_names; /* [n_kw] their names */
    int n_kw;
    const char **names; /* [n_names] for/set targets */
    int n_names;
    int *cmp_ops;      /* E_COMPARE: [n_args] operators */
    const char *name;  /* E_NAME, E_ATTR: the name; N_SET: the attribute of a namespace target */
    tval k;            /* N_TEXT, E_CONST */
};

struct ksv_tpl {
    ks_arena arena; /* the tree, its strings, the name */
    const char *name;
    node **body;
    int n_body;
};

/* ==== tokens ==================================================================================== */

typedef enum tkind {
    TK_EOF,
    TK_TEXT,        /* data: s, len (the bytes, already whitespace-controlled) */
    TK_VAR_BEGIN,   /* {{ */
    TK_VAR_END,     /* }} */
    TK_BLOCK_BEGIN, /* {% */
    TK_BLOCK_END,   /* %} */
    TK_NAME,        /* s, len */
    TK_STRING,      /* s, len: the decoded bytes (arena) */
    TK_INT,         /* i */
    TK_FLOAT,       /* f */
    TK_OP           /* s, len: the operator's text */
} tkind;

typedef struct token {
    tkind kind;
    const char *s; /* as the kind says */
    size_t len;
    int64_t i;
    double f;
    int line, col; /* where it starts (1-based; col counts bytes) */
} token;

typedef struct lexer {
    ksv_tpl *t;
    ks_diag *d;
    const char *src; /* the text, newlines normalized, one trailing newline dropped */
    size_t n;
    token *toks;     /* [n_toks] (heap) */
    size_t n_toks, cap;
    size_t loc_off;  /* lex_locate's cursor: an offset, its line, and the offset where that line starts */
    int loc_line;
    size_t loc_bol;
} lexer;

/* Report at name:line:col. */
static void tpl_error(ks_diag *d, const char *name, int line, int col, const char *fmt, ...) KS_PRINTF(5, 6);
static void tpl_error(ks_diag *d, const char *name, int line, int col, const char *fmt, ...)
{
    char place[512];
    snprintf(place, sizeof place, "%s:%d:%d", name, line, col);
    va_list ap;
    va_start(ap, fmt);
    ks_verror(d, place, fmt, ap);
    va_end(ap);
}

/* Line and column of an offset; offsets are asked for in increasing order (or again). */
static void lex_locate(lexer *lx, size_t off, int *line, int *col)
{
    if (off < lx->loc_off) lx->loc_off = 0, lx->loc_line = 1, lx->loc_bol = 0;
    for (; lx->loc_off < off; lx->loc_off++)
        if (lx->src[lx->loc_off] == '\n') lx->loc_line++, lx->loc_bol = lx->loc_off + 1;
    *line = lx->loc_line;
    *col = (int)(off - lx->loc_bol) + 1;
}

static void lex_error_at(lexer *lx, size_t off, const char *fmt, ...) KS_PRINTF(3, 4);
static void lex_error_at(lexer *lx, size_t off, const char *fmt, ...)
{
    int line, col;
    lex_locate(lx, off, &line, &col);
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tpl_error(lx->d, lx->t->name, line, col, "%s", msg);
}

static token *lex_push(lexer *lx, tkind kind, size_t off)
{
    if (lx->n_toks >= TPL_MAX_TOKENS) {
        lex_error_at(lx, off, "template too long (over %d tokens)", TPL_MAX_TOKENS);
        return NULL;
    }
    if (KS_TRY_GROW(lx->toks, lx->n_toks + 1, lx->cap, TPL_MAX_TOKENS)) {
        ks_error_oom(lx->d, lx->t->name, 0, "chat template tokens");
        return NULL;
    }
    token *tk = &lx->toks[lx->n_toks++];
    memset(tk, 0, sizeof *tk);
    tk->kind = kind;
    lex_locate(lx, off, &tk->line, &tk->col);
    return tk;
}

static void *tpl_alloc(ksv_tpl *t, ks_diag *d, size_t n)
{
    void *p = ks_arena_alloc(&t->arena, n ? n : 1);
    if (!p) ks_error_oom(d, t->name, n, "chat template");
    return p;
}

static int is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* A string literal at src[*pos] (the quote): decoded as Jinja does, with Python's escapes. */
static int lex_string(lexer *lx, size_t *pos)
{
    size_t start = *pos, i = start + 1;
    char q = lx->src[start];
    while (i < lx->n && lx->src[i] != q) i += lx->src[i] == '\\' && i + 1 < lx->n ? 2 : 1;
    if (i >= lx->n) {
        lex_error_at(lx, start, "unterminated string");
        return -1;
    }
    char *out = tpl_alloc(lx->t, lx->d, i - start + 1);
    if (!out) return -1;
    size_t o = 0;
    for (size_t j = start + 1; j < i;) {
        char c = lx->src[j];
        if (c != '\\') {
            out[o++] = c;
            j++;
            continue;
        }
        char e = lx->src[j + 1];
        j += 2;
        switch (e) {
        case '\n': break;
        case '\\': out[o++] = '\\'; break;
        case '\'': out[o++] = '\''; break;
        case '"': out[o++] = '"'; break;
        case 'a': out[o++] = '\a'; break;
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'n': out[o++] = '\n'; break;
        case 'r': out[o++] = '\r'; break;
        case 't': out[o++] = '\t'; break;
        case 'v': out[o++] = '\v'; break;
        case 'x': case 'u': case 'U': {
            int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int k = 0; k < digits; k++) {
                int h = j < i ? hexval(lx->src[j]) : -1;
                if (h < 0) {
                    lex_error_at(lx, j - 2 - (size_t)k, "truncated \\%c escape in a string", e);
                    return -1;
                }
                cp = cp << 4 | (uint32_t)h;
                j++;
            }
            if (cp > 0x10FFFF) {
                lex_error_at(lx, j - 10, "illegal Unicode character in \\U escape");
                return -1;
            }
            o += (size_t)ks_utf8_encode(cp, out + o); /* never longer than the escape that wrote it */
            break;
        }
        default:
            if (e >= '0' && e <= '7') {
                uint32_t cp = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && j < i && lx->src[j] >= '0' && lx->src[j] <= '7'; k++)
                    cp = cp * 8 + (uint32_t)(lx->src[j++] - '0');
                o += (size_t)ks_utf8_encode(cp, out + o);
            } else {
                out[o++] = '\\'; /* Python keeps an unknown escape as it is */
                out[o++] = e;
            }
        }
    }
    token *tk = lex_push(lx, TK_STRING, start);
    if (!tk) return -1;
    tk->s = out;
    tk->len = o;
    *pos = i + 1;
    return 0;
}

/* A number at src[*pos]: [0-9](_?[0-9])* then maybe a fraction and an exponent. */
static int lex_number(lexer *lx, size_t *pos)
{
    size_t start = *pos, i = start;
    char buf[128];
    size_t b = 0;
    int is_float = 0;
#define DIGITS()                                                                                \
    do {                                                                                        \
        while (i < lx->n && (is_digit(lx->src[i]) || (lx->src[i] == '_' && i + 1 < lx->n &&     \
                                                      is_digit(lx->src[i + 1]) && i > start))) { \
            if (lx->src[i] != '_' && b < sizeof buf - 1) buf[b++] = lx->src[i];                 \
            i++;                                                                                \
        }                                                                                       \
    } while (0)
    DIGITS();
    if (i + 1 < lx->n && lx->src[i] == '.' && is_digit(lx->src[i + 1])) {
        is_float = 1;
        buf[b++] = '.';
        i++;
        DIGITS();
    }
    if (i < lx->n && (lx->src[i] == 'e' || lx->src[i] == 'E')) {
        size_t j = i + 1;
        if (j < lx->n && (lx->src[j] == '+' || lx->src[j] == '-')) j++;
        if (j < lx->n && is_digit(lx->src[j])) {
            is_float = 1;
            if (b < sizeof buf - 3) buf[b++] = 'e';
            if (lx->src[i + 1] == '-' && b < sizeof buf - 2) buf[b++] = '-';
            i = j;
            DIGITS();
        }
    }
#undef DIGITS
    buf[b] = 0;
    if (b >= sizeof buf - 2) {
        lex_error_at(lx, start, "number too long");
        return -1;
    }
    token *tk = lex_push(lx, is_float ? TK_FLOAT : TK_INT, start);
    if (!tk) return -1;
    if (is_float) {
        tk->f = strtod(buf, NULL);
    } else {
        int64_t v = 0;
        for (size_t k = 0; k < b; k++) {
            if (v > (INT64_MAX - (buf[k] - '0')) / 10) {
                lex_error_at(lx, start, "integer too large");
                return -1;
            }
            v = v * 10 + (buf[k] - '0');
        }
        tk->i = v;
    }
    *pos = i;
    return 0;
}

static const char *const lex_ops[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
                                      "]",  "(",  ")",  "{",  "}",  ">",  "<", "=", ".", ":", "|", ",", ";"};

static int starts(const lexer *lx, size_t pos, const char *s)
{
    size_t n = strlen(s);
    return pos + n <= lx->n && memcmp(lx->src + pos, s, n) == 0;
}

/* Skip whitespace (Python's \s) from pos. */
static size_t skip_space(const lexer *lx, size_t pos) { return pos + lstrip_off(lx->src + pos, lx->n - pos); }

/* The tokens of a tag's inside, from *pos to its end (`}}` or `%}`), which it consumes. */
static int lex_tag(lexer *lx, size_t *pos, size_t open, int block)
{
    size_t i = *pos;
    int depth = 0; /* open brackets: an end marker inside them is not one (Jinja's balancing stack) */
    for (;;) {
        while (i < lx->n && (lx->src[i] == ' ' || lx->src[i] == '\t' || lx->src[i] == '\n' || lx->src[i] == '\r'))
            i++;
        if (i >= lx->n) {
            lex_error_at(lx, open, "unclosed '%s' (expected '%s')", block ? "{%" : "{{", block ? "%}" : "}}");
            return -1;
        }
        if (depth == 0) {
            const char *end = block ? "%}" : "}}";
            size_t at = i, next = 0;
            if (lx->src[i] == '-' && starts(lx, i + 1, end)) {
                next = skip_space(lx, i + 3);
            } else if (block && lx->src[i] == '+' && starts(lx, i + 1, end)) {
                next = i + 3;
            } else if (starts(lx, i, end)) {
                next = i + 2;
                if (block && next < lx->n && lx->src[next] == '\n') next++; /* trim_blocks */
            }
            if (next) {
                if (!lex_push(lx, block ? TK_BLOCK_END : TK_VAR_END, at)) return -1;
                *pos = next;
                return 0;
            }
        }
        char c = lx->src[i];
        if (c == '\'' || c == '"') {
            if (lex_string(lx, &i)) return -1;
        } else if (is_digit(c)) {
            if (lex_number(lx, &i)) return -1;
        } else if (is_name_start(c)) {
            size_t s = i;
            while (i < lx->n && (is_name_start(lx->src[i]) || is_digit(lx->src[i]))) i++;
            token *tk = lex_push(lx, TK_NAME, s);
            if (!tk) return -1;
            tk->s = lx->src + s;
            tk->len = i - s;
        } else {
            size_t k = 0, nops = sizeof lex_ops / sizeof *lex_ops;
            while (k < nops && !starts(lx, i, lex_ops[k])) k++;
            if (k == nops) {
                if ((unsigned char)c < 0x20 || (unsigned char)c >= 0x7F)
                    lex_error_at(lx, i, "unexpected character (byte 0x%02x)", (unsigned char)c);
                else
                    lex_error_at(lx, i, "unexpected character '%c'", c);
                return -1;
            }
            if (c == '(' || c == '[' || c == '{') depth++;
            if ((c == ')' || c == ']' || c == '}') && depth > 0) depth--;
            token *tk = lex_push(lx, TK_OP, i);
            if (!tk) return -1;
            tk->s = lex_ops[k];
            tk->len = strlen(lex_ops[k]);
            i += tk->len;
        }
    }
}

static int all_space(const char *s, size_t n) { return n > 0 && lstrip_off(s, n) == n; }

static int lex_all(lexer *lx)
{
    size_t pos = 0;
    while (pos < lx->n) {
        size_t k = pos;
        while (k + 1 < lx->n && !(lx->src[k] == '{' && (lx->src[k + 1] == '{' || lx->src[k + 1] == '%' ||
                                                         lx->src[k + 1] == '#')))
            k++;
        if (k + 1 >= lx->n) k = lx->n;
        char kind = k < lx->n ? lx->src[k + 1] : 0;
        char sign = k + 2 < lx->n && (lx->src[k + 2] == '-' || lx->src[k + 2] == '+') ? lx->src[k + 2] : 0;
        size_t tend = k;
        if (kind && sign == '-') {
            tend = pos + rstrip_len(lx->src + pos, k - pos);
        } else if (kind && kind != '{' && sign != '+') { /* lstrip_blocks */
            size_t l = k;
            while (l > pos && lx->src[l - 1] != '\n') l--;
            int line_starting = l > pos || pos == 0 || lx->src[pos - 1] == '\n';
            if (line_starting && all_space(lx->src + l, k - l)) tend = l;
        }
        if (tend > pos) {
            token *tk = lex_push(lx, TK_TEXT, pos);
            if (!tk) return -1;
            tk->s = lx->src + pos;
            tk->len = tend - pos;
        }
        if (!kind) break;
        size_t body = k + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            size_t e = body;
            while (e + 1 < lx->n && !(lx->src[e] == '#' && lx->src[e + 1] == '}')) e++;
            if (e + 1 >= lx->n) {
                lex_error_at(lx, k, "unclosed comment (expected '#}')");
                return -1;
            }
            pos = e + 2;
            if (e > body && lx->src[e - 1] == '-')
                pos = skip_space(lx, pos);
            else if (!(e > body && lx->src[e - 1] == '+') && pos < lx->n && lx->src[pos] == '\n')
                pos++;
            continue;
        }
        if (!lex_push(lx, kind == '%' ? TK_BLOCK_BEGIN : TK_VAR_BEGIN, k)) return -1;
        pos = body;
        if (lex_tag(lx, &pos, k, kind == '%')) return -1;
    }
    token *eof = lex_push(lx, TK_EOF, lx->n);
    return eof ? 0 : -1;
}

/* ==== builtins: filters, tests, functions, operators ============================================= */

typedef enum filter_id {
    F_ABS, F_CAPITALIZE, F_COUNT, F_D, F_DEFAULT, F_FIRST, F_FLOAT, F_INT, F_ITEMS, F_JOIN, F_LAST, F_LENGTH,
    F_LIST, F_LOWER, F_MAP, F_REJECT, F_REJECTATTR, F_REPLACE, F_REVERSE, F_SAFE, F_SELECT, F_SELECTATTR,
    F_STRING, F_TITLE, F_TOJSON, F_TRIM, F_UPPER, F_COUNT_
} filter_id;
static const char *const filter_names[F_COUNT_] = {
    "abs", "capitalize", "count", "d", "default", "first", "float", "int", "items", "join", "last", "length",
    "list", "lower", "map", "reject", "rejectattr", "replace", "reverse", "safe", "select", "selectattr",
    "string", "title", "tojson", "trim", "upper"};

typedef enum test_id {
    T_BOOLEAN, T_CALLABLE, T_DEFINED, T_DIVISIBLEBY, T_EQ, T_EQUALTO, T_EVEN, T_FALSE, T_FLOAT, T_GE, T_GT, T_IN,
    T_INTEGER, T_ITERABLE, T_LE, T_LOWER, T_LT, T_MAPPING, T_NE, T_NONE, T_NUMBER, T_ODD, T_SAMEAS, T_SEQUENCE,
    T_STRING, T_TRUE, T_UNDEFINED, T_UPPER, T_OP_EQ, T_OP_NE, T_OP_LT, T_OP_LE, T_OP_GT, T_OP_GE, T_COUNT_
} test_id;
static const char *const test_names[T_COUNT_] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "even", "false", "float", "ge", "gt", "in",
    "integer", "iterable", "le", "lower", "lt", "mapping", "ne", "none", "number", "odd", "sameas", "sequence",
    "string", "true", "undefined", "upper", "==", "!=", "<", "<=", ">", ">="};

typedef enum func_id { G_RAISE_EXCEPTION, G_NAMESPACE, G_RANGE, G_STRFTIME_NOW, G_COUNT_ } func_id;
static const char *const func_names[G_COUNT_] = {"raise_exception", "namespace", "range", "strftime_now"};

typedef enum bin_op { B_ADD, B_SUB, B_MUL, B_DIV, B_FLOORDIV, B_MOD, B_POW, B_CONCAT } bin_op;
typedef enum cmp_op { C_EQ, C_NE, C_LT, C_GT, C_LE, C_GE, C_IN, C_NOTIN } cmp_op;

static int lookup_name(const char *const *names, int n, const char *s, size_t len)
{
    for (int i = 0; i < n; i++)
        if (strlen(names[i]) == len && memcmp(names[i], s, len) == 0) return i;
    return -1;
}

/* ==== parser ===================================================================================== */

typedef struct parser {
    ksv_tpl *t;
    ks_diag *d;
    const token *tk; /* [n] ending in TK_EOF */
    size_t n, i;
    int depth;       /* nesting, against TPL_MAX_DEPTH */
    int loops;       /* for loops around the current statement (break and continue need one) */
} parser;

typedef struct nodelist {
    node **v;
    int n, cap;
} nodelist;

static const token *cur(const parser *p) { return &p->tk[p->i]; }
static const token *peek(const parser *p, size_t k) { return &p->tk[p->i + k < p->n ? p->i + k : p->n - 1]; }

static int tok_is(const token *t, tkind kind, const char *s)
{
    return t->kind == kind && (!s || (t->len == strlen(s) && memcmp(t->s, s, t->len) == 0));
}
static int is_op(const parser *p, const char *s) { return tok_is(cur(p), TK_OP, s); }
static int is_kw(const parser *p, const char *s) { return tok_is(cur(p), TK_NAME, s); }

/* How a token reads in a message. */
static const char *tok_desc(const token *t, char *buf, size_t n)
{
    switch (t->kind) {
    case TK_EOF: return "end of template";
    case TK_TEXT: return "template data";
    case TK_VAR_BEGIN: return "'{{'";
    case TK_VAR_END: return "'}}'";
    case TK_BLOCK_BEGIN: return "'{%'";
    case TK_BLOCK_END: return "'%}'";
    case TK_STRING: return "a string";
    case TK_INT: case TK_FLOAT: return "a number";
    case TK_NAME: case TK_OP: snprintf(buf, n, "'%.*s'", (int)(t->len > 40 ? 40 : t->len), t->s); return buf;
    }
    return "?";
}

static void perr(parser *p, const token *t, const char *fmt, ...) KS_PRINTF(3, 4);
static void perr(parser *p, const token *t, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tpl_error(p->d, p->t->name, t->line, t->col, "%s", msg);
}

static int expect_op(parser *p, const char *s)
{
    if (is_op(p, s)) {
        p->i++;
        return 0;
    }
    char buf[64];
    perr(p, cur(p), "expected '%s', got %s", s, tok_desc(cur(p), buf, sizeof buf));
    return -1;
}

static int expect_end(parser *p, tkind kind)
{
    if (cur(p)->kind == kind) {
        p->i++;
        return 0;
    }
    char buf[64];
    perr(p, cur(p), "expected '%s', got %s", kind == TK_BLOCK_END ? "%}" : "}}", tok_desc(cur(p), buf, sizeof buf));
    return -1;
}

static node *new_node(parser *p, nkind kind, const token *at)
{
    node *n = tpl_alloc(p->t, p->d, sizeof *n);
    if (!n) return NULL;
    n->kind = kind;
    n->line = at->line;
    n->col = at->col;
    return n;
}

static int nl_push(parser *p, nodelist *l, node *n)
{
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 8;
        node **v = tpl_alloc(p->t, p->d, (size_t)cap * sizeof *v);
        if (!v) return -1;
        if (l->n) memcpy(v, l->v, (size_t)l->n * sizeof *v);
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = n;
    return 0;
}

static const char *tok_name(parser *p, const token *t)
{
    char *s = tpl_alloc(p->t, p->d, t->len + 1);
    if (s) memcpy(s, t->s, t->len);
    return s;
}

static node *parse_expr(parser *p, int with_cond);
static node *parse_unary(parser *p, int with_filter);
static node *parse_primary(parser *p);
static node *parse_postfix(parser *p, node *n);

/* (args, kw=...) after the '(' */
static int parse_call_args(parser *p, node *call)
{
    nodelist args = {0}, kw = {0};
    const char **kw_names = NULL;
    int kw_cap = 0;
    p->i++; /* ( */
    while (!is_op(p, ")")) {
        if (args.n + kw.n > 0 && expect_op(p, ",")) return -1;
        if (is_op(p, ")")) break; /* a trailing comma */
        if (cur(p)->kind == TK_NAME && tok_is(peek(p, 1), TK_OP, "=")) {
            const char *nm = tok_name(p, cur(p));
            if (!nm) return -1;
            p->i += 2;
            node *v = parse_expr(p, 1);
            if (!v || nl_push(p, &kw, v)) return -1;
            if (kw.n > kw_cap) {
                const char **names = tpl_alloc(p->t, p->d, (size_t)kw.cap * sizeof *names);
                if (!names) return -1;
                if (kw_cap) memcpy(names, kw_names, (size_t)kw_cap * sizeof *names);
                kw_names = names;
                kw_cap = kw.cap;
            }
            kw_names[kw.n - 1] = nm;
        } else {
            if (kw.n) {
                perr(p, cur(p), "a positional argument after keyword arguments");
                return -1;
            }
            node *v = parse_expr(p, 1);
            if (!v || nl_push(p, &args, v)) return -1;
        }
    }
    p->i++; /* ) */
    call->args = args.v;
    call->n_args = args.n;
    call->kw = kw.v;
    call->kw_names = kw_names;
    call->n_kw = kw.n;
    return 0;
}

static node *parse_filters(parser *p, node *n)
{
    while (n) {
        if (is_op(p, "|")) {
            p->i++;
            const token *nm = cur(p);
            if (nm->kind != TK_NAME) {
                char buf[64];
                perr(p, nm, "expected a filter name after '|', got %s", tok_desc(nm, buf, sizeof buf));
                return NULL;
            }
            int id = lookup_name(filter_names, F_COUNT_, nm->s, nm->len);
            if (id < 0) {
                perr(p, nm, "unknown filter '%.*s'", (int)nm->len, nm->s);
                return NULL;
            }
            node *f = new_node(p, E_FILTER, nm);
            if (!f) return NULL;
            f->op = id;
            f->a = n;
            p->i++;
            if (is_op(p, "(") && parse_call_args(p, f)) return NULL;
            n = f;
        } else if (is_kw(p, "is")) {
            p->i++;
            int neg = 0;
            if (is_kw(p, "not")) neg = 1, p->i++;
            const token *nm = cur(p);
            int id = -1;
            if (nm->kind == TK_NAME) id = lookup_name(test_names, T_COUNT_, nm->s, nm->len);
            if (nm->kind == TK_OP) id = lookup_name(test_names, T_COUNT_, nm->s, nm->len);
            if (nm->kind != TK_NAME && id < 0) {
                char buf[64];
                perr(p, nm, "expected a test name after 'is', got %s", tok_desc(nm, buf, sizeof buf));
                return NULL;
            }
            if (id < 0) {
                perr(p, nm, "unknown test '%.*s'", (int)nm->len, nm->s);
                return NULL;
            }
            node *t = new_node(p, E_TEST, nm);
            if (!t) return NULL;
            t->op = id;
            t->neg = neg;
            t->a = n;
            p->i++;
            const token *c = cur(p);
            if (is_op(p, "(")) {
                if (parse_call_args(p, t)) return NULL;
            } else if ((c->kind == TK_NAME || c->kind == TK_STRING || c->kind == TK_INT || c->kind == TK_FLOAT ||
                        is_op(p, "[") || is_op(p, "{")) &&
                       !is_kw(p, "else") && !is_kw(p, "or") && !is_kw(p, "and")) {
                if (is_kw(p, "is")) {
                    perr(p, c, "tests cannot be chained with 'is'");
                    return NULL;
                }
                node *arg = parse_postfix(p, parse_primary(p));
                if (!arg) return NULL;
                t->args = tpl_alloc(p->t, p->d, sizeof *t->args);
                if (!t->args) return NULL;
                t->args[0] = arg;
                t->n_args = 1;
            }
            n = t;
        } else if (is_op(p, "(")) {
            node *call = new_node(p, E_CALL, cur(p));
            if (!call) return NULL;
            call->a = n;
            if (parse_call_args(p, call)) return NULL;
            n = call;
        } else {
            break;
        }
    }
    return n;
}

/* Items up to the closing bracket (after the opening one). */
static int parse_items(parser *p, const char *close, nodelist *items, int dict)
{
    p->i++;
    while (!is_op(p, close)) {
        if (items->n && expect_op(p, ",")) return -1;
        if (is_op(p, close)) break;
        node *k = parse_expr(p, 1);
        if (!k || nl_push(p, items, k)) return -1;
        if (dict) {
            if (expect_op(p, ":")) return -1;
            node *v = parse_expr(p, 1);
            if (!v || nl_push(p, items, v)) return -1;
        }
    }
    p->i++;
    return 0;
}

static node *parse_primary(parser *p)
{
    const token *t = cur(p);
    char buf[64];
    if (++p->depth > TPL_MAX_DEPTH) {
        perr(p, t, "expression nested too deeply (over %d levels)", TPL_MAX_DEPTH);
        return NULL;
    }
    node *n = NULL;
    if (t->kind == TK_NAME) {
        static const char *const consts[] = {"true", "True", "false", "False", "none", "None"};
        int c = lookup_name(consts, 6, t->s, t->len);
        n = new_node(p, c >= 0 ? E_CONST : E_NAME, t);
        if (!n) return NULL;
        if (c >= 0)
            n->k = c < 4 ? v_bool(c < 2) : v_none();
        else if (!(n->name = tok_name(p, t)))
            return NULL;
        p->i++;
    } else if (t->kind == TK_STRING) {
        n = new_node(p, E_CONST, t);
        if (!n) return NULL;
        n->k = v_str(t->s, t->len);
        p->i++;
        if (cur(p)->kind == TK_STRING) { /* adjacent literals join */
            size_t len = 0;
            for (size_t j = p->i - 1; p->tk[j].kind == TK_STRING; j++) len += p->tk[j].len;
            char *s = tpl_alloc(p->t, p->d, len + 1);
            if (!s) return NULL;
            size_t o = 0;
            for (p->i--; cur(p)->kind == TK_STRING; p->i++) {
                memcpy(s + o, cur(p)->s, cur(p)->len);
                o += cur(p)->len;
            }
            n->k = v_str(s, len);
        }
    } else if (t->kind == TK_INT || t->kind == TK_FLOAT) {
        n = new_node(p, E_CONST, t);
        if (!n) return NULL;
        n->k = t->kind == TK_INT ? v_int(t->i) : v_float(t->f);
        p->i++;
    } else if (tok_is(t, TK_OP, "(")) {
        p->i++;
        if (is_op(p, ")")) {
            p->i++;
            n = new_node(p, E_TUPLE, t);
        } else {
            n = parse_expr(p, 1);
            if (n && is_op(p, ",")) {
                nodelist items = {0};
                if (nl_push(p, &items, n)) return NULL;
                while (is_op(p, ",")) {
                    p->i++;
                    if (is_op(p, ")")) break;
                    node *x = parse_expr(p, 1);
                    if (!x || nl_push(p, &items, x)) return NULL;
                }
                n = new_node(p, E_TUPLE, t);
                if (!n) return NULL;
                n->args = items.v;
                n->n_args = items.n;
            }
            if (n && expect_op(p, ")")) return NULL;
        }
    } else if (tok_is(t, TK_OP, "[") || tok_is(t, TK_OP, "{")) {
        int dict = t->s[0] == '{';
        nodelist items = {0};
        if (parse_items(p, dict ? "}" : "]", &items, dict)) return NULL;
        n = new_node(p, dict ? E_DICT : E_LIST, t);
        if (!n) return NULL;
        n->args = items.v;
        n->n_args = items.n;
    } else {
        perr(p, t, "expected an expression, got %s", tok_desc(t, buf, sizeof buf));
        return NULL;
    }
    p->depth--;
    return n;
}

/* a.b, a[b], a[b:c:d], a(...) */
static node *parse_postfix(parser *p, node *n)
{
    while (n) {
        const token *t = cur(p);
        if (tok_is(t, TK_OP, ".")) {
            p->i++;
            const token *a = cur(p);
            if (a->kind == TK_NAME) {
                node *g = new_node(p, E_ATTR, a);
                if (!g || !(g->name = tok_name(p, a))) return NULL;
                g->a = n;
                n = g;
            } else if (a->kind == TK_INT) {
                node *g = new_node(p, E_ITEM, a), *k = new_node(p, E_CONST, a);
                if (!g || !k) return NULL;
                k->k = v_int(a->i);
                g->a = n;
                g->b = k;
                n = g;
            } else {
                char buf[64];
                perr(p, a, "expected an attribute name after '.', got %s", tok_desc(a, buf, sizeof buf));
                return NULL;
            }
            p->i++;
        } else if (tok_is(t, TK_OP, "[")) {
            p->i++;
            node *parts[3] = {NULL, NULL, NULL};
            int colons = 0;
            for (;;) {
                if (is_op(p, ":")) {
                    if (++colons > 2) {
                        perr(p, cur(p), "a slice has at most two ':'");
                        return NULL;
                    }
                    p->i++;
                    continue;
                }
                if (is_op(p, "]")) break;
                if (parts[colons]) {
                    char buf[64];
                    perr(p, cur(p), "expected ']', got %s", tok_desc(cur(p), buf, sizeof buf));
                    return NULL;
                }
                if (!(parts[colons] = parse_expr(p, 1))) return NULL;
            }
            if (!colons && !parts[0]) {
                perr(p, cur(p), "expected an expression, got ']'");
                return NULL;
            }
            p->i++;
            node *g = new_node(p, colons ? E_SLICE : E_ITEM, t);
            if (!g) return NULL;
            g->a = n;
            g->b = parts[0];
            g->c = parts[1];
            g->d = parts[2];
            n = g;
        } else if (tok_is(t, TK_OP, "(")) {
            node *call = new_node(p, E_CALL, t);
            if (!call) return NULL;
            call->a = n;
            if (parse_call_args(p, call)) return NULL;
            n = call;
        } else {
            break;
        }
    }
    return n;
}

static node *parse_unary(parser *p, int with_filter)
{
    const token *t = cur(p);
    node *n;
    if (++p->depth > TPL_MAX_DEPTH) {
        perr(p, t, "expression nested too deeply (over %d levels)", TPL_MAX_DEPTH);
        return NULL;
    }
    if (tok_is(t, TK_OP, "-") || tok_is(t, TK_OP, "+")) {
        p->i++;
        n = new_node(p, t->s[0] == '-' ? E_NEG : E_POS, t);
        if (!n || !(n->a = parse_unary(p, 0))) return NULL;
    } else {
        n = parse_primary(p);
    }
    n = parse_postfix(p, n);
    if (with_filter) n = parse_filters(p, n);
    p->depth--;
    return n;
}

static node *new_bin(parser *p, nkind kind, int op, const token *at, node *a, node *b)
{
    if (!a || !b) return NULL;
    node *n = new_node(p, kind, at);
    if (!n) return NULL;
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static node *parse_pow(parser *p)
{
    node *n = parse_unary(p, 1);
    while (n && is_op(p, "**")) {
        const token *t = cur(p);
        p->i++;
        n = new_bin(p, E_BIN, B_POW, t, n, parse_unary(p, 1));
    }
    return n;
}

static node *parse_math2(parser *p)
{
    node *n = parse_pow(p);
    for (;;) {
        const token *t = cur(p);
        int op = is_op(p, "*") ? B_MUL : is_op(p, "/") ? B_DIV : is_op(p, "//") ? B_FLOORDIV : is_op(p, "%") ? B_MOD : -1;
        if (!n || op < 0) return n;
        p->i++;
        n = new_bin(p, E_BIN, op, t, n, parse_pow(p));
    }
}

static node *parse_concat(parser *p)
{
    node *n = parse_math2(p);
    while (n && is_op(p, "~")) {
        const token *t = cur(p);
        p->i++;
        n = new_bin(p, E_BIN, B_CONCAT, t, n, parse_math2(p));
    }
    return n;
}

static node *parse_math1(parser *p)
{
    node *n = parse_concat(p);
    for (;;) {
        const token *t = cur(p);
        int op = is_op(p, "+") ? B_ADD : is_op(p, "-") ? B_SUB : -1;
        if (!n || op < 0) return n;
        p->i++;
        n = new_bin(p, E_BIN, op, t, n, parse_concat(p));
    }
}

static node *parse_compare(parser *p)
{
    const token *start = cur(p);
    node *n = parse_math1(p);
    if (!n) return NULL;
    nodelist operands = {0};
    int *ops = NULL, cap = 0;
    for (;;) {
        int op = is_op(p, "==") ? C_EQ : is_op(p, "!=") ? C_NE : is_op(p, "<") ? C_LT : is_op(p, ">") ? C_GT
               : is_op(p, "<=") ? C_LE : is_op(p, ">=") ? C_GE : is_kw(p, "in") ? C_IN : -1;
        if (op < 0 && is_kw(p, "not") && tok_is(peek(p, 1), TK_NAME, "in")) {
            op = C_NOTIN;
            p->i++;
        }
        if (op < 0) break;
        p->i++;
        node *x = parse_math1(p);
        if (!x || nl_push(p, &operands, x)) return NULL;
        if (operands.n > cap) {
            int *o = tpl_alloc(p->t, p->d, (size_t)operands.cap * sizeof *o);
            if (!o) return NULL;
            if (cap) memcpy(o, ops, (size_t)cap * sizeof *o);
            ops = o;
            cap = operands.cap;
        }
        ops[operands.n - 1] = op;
    }
    if (!operands.n) return n;
    node *c = new_node(p, E_COMPARE, start);
    if (!c) return NULL;
    c->a = n;
    c->args = operands.v;
    c->n_args = operands.n;
    c->cmp_ops = ops;
    return c;
}

static node *parse_not(parser *p)
{
    if (is_kw(p, "not")) {
        const token *t = cur(p);
        if (++p->depth > TPL_MAX_DEPTH) {
            perr(p, t, "expression nested too deeply (over %d levels)", TPL_MAX_DEPTH);
            return NULL;
        }
        p->i++;
        node *n = new_node(p, E_NOT, t);
        if (!n || !(n->a = parse_not(p))) return NULL;
        p->depth--;
        return n;
    }
    return parse_compare(p);
}

static node *parse_and(parser *p)
{
    node *n = parse_not(p);
    while (n && is_kw(p, "and")) {
        const token *t = cur(p);
        p->i++;
        n = new_bin(p, E_AND, 0, t, n, parse_not(p));
    }
    return n;
}

static node *parse_or(parser *p)
{
    node *n = parse_and(p);
    while (n && is_kw(p, "or")) {
        const token *t = cur(p);
        p->i++;
        n = new_bin(p, E_OR, 0, t, n, parse_and(p));
    }
    return n;
}

/* An expression; with_cond: `x if c else y` too (not where `if` filters a for loop). */
static node *parse_expr(parser *p, int with_cond)
{
    const token *start = cur(p);
    if (++p->depth > TPL_MAX_DEPTH) {
        perr(p, start, "expression nested too deeply (over %d levels)", TPL_MAX_DEPTH);
        return NULL;
    }
    node *n = parse_or(p);
    while (with_cond && n && is_kw(p, "if")) {
        p->i++;
        node *c = new_node(p, E_COND, start);
        if (!c) return NULL;
        c->b = n;
        if (!(c->a = parse_or(p))) return NULL;
        if (is_kw(p, "else")) {
            p->i++;
            if (!(c->c = parse_expr(p, 1))) return NULL;
        }
        n = c;
    }
    p->depth--;
    return n;
}

/* An expression, or several separated by commas (a tuple), as {{ }}, set and for take. */
static node *parse_tuple(parser *p, int with_cond)
{
    const token *start = cur(p);
    node *n = parse_expr(p, with_cond);
    if (!n || !is_op(p, ",")) return n;
    nodelist items = {0};
    if (nl_push(p, &items, n)) return NULL;
    while (is_op(p, ",")) {
        p->i++;
        if (cur(p)->kind == TK_BLOCK_END || cur(p)->kind == TK_VAR_END || is_kw(p, "in") || is_kw(p, "if")) break;
        node *x = parse_expr(p, with_cond);
        if (!x || nl_push(p, &items, x)) return NULL;
    }
    node *t = new_node(p, E_TUPLE, start);
    if (!t) return NULL;
    t->args = items.v;
    t->n_args = items.n;
    return t;
}

/* Target names of for and set: a, b, c (parenthesized or not). */
static int parse_targets(parser *p, node *n, int allow_attr)
{
    int paren = is_op(p, "(");
    if (paren) p->i++;
    const char *names[16];
    int k = 0;
    for (;;) {
        const token *t = cur(p);
        if (t->kind != TK_NAME) {
            char buf[64];
            perr(p, t, "expected a name to assign, got %s", tok_desc(t, buf, sizeof buf));
            return -1;
        }
        if (k == 16) {
            perr(p, t, "too many names to assign (at most 16)");
            return -1;
        }
        if (!(names[k++] = tok_name(p, t))) return -1;
        p->i++;
        if (allow_attr && k == 1 && !paren && is_op(p, ".")) {
            p->i++;
            if (cur(p)->kind != TK_NAME) {
                char buf[64];
                perr(p, cur(p), "expected an attribute name after '.', got %s", tok_desc(cur(p), buf, sizeof buf));
                return -1;
            }
            if (!(n->name = tok_name(p, cur(p)))) return -1;
            p->i++;
            break;
        }
        if (!is_op(p, ",")) break;
        p->i++;
    }
    if (paren && expect_op(p, ")")) return -1;
    n->names = tpl_alloc(p->t, p->d, (size_t)k * sizeof *n->names);
    if (!n->names) return -1;
    memcpy(n->names, names, (size_t)k * sizeof *names);
    n->n_names = k;
    return 0;
}

static int parse_body(parser *p, const char *const *stops, const token *opener, const char *opener_name,
                      nodelist *body);

/* {% if %} after `if`, and each elif (which shares the endif). */
static node *parse_if(parser *p, const token *opener)
{
    node *n = new_node(p, N_IF, opener);
    if (!n || !(n->a = parse_tuple(p, 1)) || expect_end(p, TK_BLOCK_END)) return NULL;
    static const char *const stops[] = {"elif", "else", "endif", NULL};
    nodelist body = {0}, alt = {0};
    if (parse_body(p, stops, opener, "if", &body)) return NULL;
    n->args = body.v;
    n->n_args = body.n;
    const token *tag = peek(p, 1);
    p->i += 2;
    if (tok_is(tag, TK_NAME, "elif")) {
        node *e = parse_if(p, tag);
        if (!e || nl_push(p, &alt, e)) return NULL;
    } else {
        if (tok_is(tag, TK_NAME, "else")) {
            static const char *const end[] = {"endif", NULL};
            if (expect_end(p, TK_BLOCK_END) || parse_body(p, end, opener, "if", &alt)) return NULL;
            p->i += 2;
        }
        if (expect_end(p, TK_BLOCK_END)) return NULL;
    }
    n->alt = alt.v;
    n->n_alt = alt.n;
    return n;
}

static node *parse_for(parser *p, const token *opener)
{
    node *n = new_node(p, N_FOR, opener);
    if (!n || parse_targets(p, n, 0)) return NULL;
    if (!is_kw(p, "in")) {
        char buf[64];
        perr(p, cur(p), "expected 'in', got %s", tok_desc(cur(p), buf, sizeof buf));
        return NULL;
    }
    p->i++;
    if (!(n->a = parse_tuple(p, 0))) return NULL;
    if (is_kw(p, "if")) {
        p->i++;
        if (!(n->b = parse_expr(p, 1))) return NULL;
    }
    if (is_kw(p, "recursive")) {
        perr(p, cur(p), "recursive for loops are not supported");
        return NULL;
    }
    if (expect_end(p, TK_BLOCK_END)) return NULL;
    static const char *const stops[] = {"else", "endfor", NULL};
    static const char *const end[] = {"endfor", NULL};
    nodelist body = {0}, alt = {0};
    p->loops++;
    int rc = parse_body(p, stops, opener, "for", &body);
    p->loops--;
    if (rc) return NULL;
    if (tok_is(peek(p, 1), TK_NAME, "else")) {
        p->i += 2;
        if (expect_end(p, TK_BLOCK_END) || parse_body(p, end, opener, "for", &alt)) return NULL;
    }
    p->i += 2;
    if (expect_end(p, TK_BLOCK_END)) return NULL;
    n->args = body.v;
    n->n_args = body.n;
    n->alt = alt.v;
    n->n_alt = alt.n;
    return n;
}

static node *parse_set(parser *p, const token *opener)
{
    node *n = new_node(p, N_SET, opener);
    if (!n || parse_targets(p, n, 1)) return NULL;
    if (is_op(p, "=")) {
        p->i++;
        if (!(n->a = parse_tuple(p, 1)) || expect_end(p, TK_BLOCK_END)) return NULL;
        return n;
    }
    if (n->n_names != 1 || n->name) {
        char buf[64];
        perr(p, cur(p), "expected '=', got %s", tok_desc(cur(p), buf, sizeof buf));
        return NULL;
    }
    if (expect_end(p, TK_BLOCK_END)) return NULL;
    static const char *const end[] = {"endset", NULL};
    nodelist body = {0};
    if (parse_body(p, end, opener, "set", &body)) return NULL;
    p->i += 2;
    if (expect_end(p, TK_BLOCK_END)) return NULL;
    n->kind = N_SETBLK;
    n->args = body.v;
    n->n_args = body.n;
    return n;
}

/* After `{%`: one statement. */
static node *parse_stmt(parser *p)
{
    const token *t = peek(p, 1);
    char buf[64];
    if (t->kind != TK_NAME) {
        perr(p, t, "expected a tag name, got %s", tok_desc(t, buf, sizeof buf));
        return NULL;
    }
    if (++p->depth > TPL_MAX_DEPTH) {
        perr(p, t, "blocks nested too deeply (over %d levels)", TPL_MAX_DEPTH);
        return NULL;
    }
    p->i += 2;
    node *n = NULL;
    if (tok_is(t, TK_NAME, "if")) {
        n = parse_if(p, t);
    } else if (tok_is(t, TK_NAME, "for")) {
        n = parse_for(p, t);
    } else if (tok_is(t, TK_NAME, "set")) {
        n = parse_set(p, t);
    } else if (tok_is(t, TK_NAME, "break") || tok_is(t, TK_NAME, "continue")) {
        if (!p->loops) {
            perr(p, t, "'%.*s' outside a for loop", (int)t->len, t->s);
            return NULL;
        }
        n = new_node(p, t->s[0] == 'b' ? N_BREAK : N_CONTINUE, t);
        if (!n || expect_end(p, TK_BLOCK_END)) return NULL;
    } else if (tok_is(t, TK_NAME, "generation")) {
        static const char *const end[] = {"endgeneration", NULL};
        nodelist body = {0};
        n = new_node(p, N_BLOCK, t);
        if (!n || expect_end(p, TK_BLOCK_END) || parse_body(p, end, t, "generation", &body)) return NULL;
        p->i += 2;
        if (expect_end(p, TK_BLOCK_END)) return NULL;
        n->args = body.v;
        n->n_args = body.n;
    } else {
        static const char *const unsupported[] = {"macro", "call", "filter", "include", "import", "from",
                                                  "extends", "block", "raw", "with", "autoescape", "do"};
        if (lookup_name(unsupported, 12, t->s, t->len) >= 0)
            perr(p, t, "the '%.*s' tag is not supported", (int)t->len, t->s);
        else if ((t->len > 3 && memcmp(t->s, "end", 3) == 0) || tok_is(t, TK_NAME, "elif") ||
                 tok_is(t, TK_NAME, "else"))
            perr(p, t, "unexpected '%.*s'", (int)t->len, t->s);
        else
            perr(p, t, "unknown tag '%.*s'", (int)t->len, t->s);
        return NULL;
    }
    p->depth--;
    return n;
}

/* Statements until a `{% stop %}` (left unconsumed) or the end, which is an error when stops are expected. */
static int parse_body(parser *p, const char *const *stops, const token *opener, const char *opener_name,
                      nodelist *body)
{
    for (;;) {
        const token *t = cur(p);
        node *n = NULL;
        switch (t->kind) {
        case TK_EOF:
            if (stops) {
                int last = 0;
                while (stops[last + 1]) last++;
                perr(p, opener, "'%s' is never closed (expected {%% %s %%})", opener_name, stops[last]);
                return -1;
            }
            return 0;
        case TK_TEXT:
            if (!(n = new_node(p, N_TEXT, t))) return -1;
            n->k = v_str(t->s, t->len);
            p->i++;
            break;
        case TK_VAR_BEGIN:
            p->i++;
            if (!(n = new_node(p, N_OUTPUT, t)) || !(n->a = parse_tuple(p, 1)) || expect_end(p, TK_VAR_END))
                return -1;
            break;
        case TK_BLOCK_BEGIN:
            for (int s = 0; stops && stops[s]; s++)
                if (tok_is(peek(p, 1), TK_NAME, stops[s])) return 0;
            if (!(n = parse_stmt(p))) return -1;
            break;
        default: {
            char buf[64];
            perr(p, t, "unexpected %s", tok_desc(t, buf, sizeof buf));
            return -1;
        }
        }
        if (nl_push(p, body, n)) return -1;
    }
}

ksv_tpl *ksv_tpl_parse(const char *text, size_t len, const char *name, ks_diag *d)
{
    ksv_tpl *t = ks_try_calloc(1, sizeof *t);
    if (!name) name = "chat_template";
    if (!t) {
        ks_error_oom(d, name, sizeof *t, "chat template");
        return NULL;
    }
    t->arena.fallible = 1;
    char *src = ks_arena_alloc(&t->arena, len + 1);
    char *nm = ks_arena_strdup(&t->arena, name);
    if (!src || !nm) {
        ks_error_oom(d, name, len + 1, "chat template");
        ksv_tpl_free(t);
        return NULL;
    }
    t->name = nm;
    /* Jinja's lexer: every newline sequence becomes "\n", and one at the very end goes
     * (keep_trailing_newline is off). */
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == '\r') {
            src[n++] = '\n';
            if (i + 1 < len && text[i + 1] == '\n') i++;
        } else {
            src[n++] = text[i];
        }
    }
    if (n > 0 && src[n - 1] == '\n') n--;
    src[n] = 0;

    lexer lx = {.t = t, .d = d, .src = src, .n = n, .loc_line = 1};
    int rc = lex_all(&lx);
    if (rc == 0) {
        parser p = {.t = t, .d = d, .tk = lx.toks, .n = lx.n_toks};
        nodelist body = {0};
        rc = parse_body(&p, NULL, NULL, NULL, &body);
        t->body = body.v;
        t->n_body = body.n;
    }
    free(lx.toks);
    if (rc) {
        ksv_tpl_free(t);
        return NULL;
    }
    return t;
}

void ksv_tpl_free(ksv_tpl *t)
{
    if (!t) return;
    ks_arena_free(&t->arena);
    free(t);
}

/* ==== the renderer =============================================================================== */

typedef struct frame frame;
struct frame {
    frame *up;          /* the enclosing scope; NULL for the template's own */
    const char **names; /* [n] variables set in this scope */
    tval *vals;         /* [n] their values */
    int n, cap;
};

typedef struct render {
    const ksv_tpl *t;
    ks_diag *d;
    ks_arena a;  /* every value of this render (fallible) */
    ks_buf out;  /* the text so far (fallible) */
    frame *top;  /* the innermost scope */
    long steps;  /* statements and expressions evaluated, against TPL_MAX_STEPS */
    int over;    /* TPL_MAX_MEMORY was reached (and reported) */
} render;

typedef struct callargs {
    const tval *pos;            /* [n] positional arguments */
    int n;
    const char *const *kw_names; /* [n_kw] keyword arguments */
    const tval *kw;
    int n_kw;
} callargs;

static int rerr(render *r, const node *n, const char *fmt, ...) KS_PRINTF(3, 4);
static int rerr(render *r, const node *n, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tpl_error(r->d, r->t->name, n->line, n->col, "%s", msg);
    return -1;
}

static void *ralloc(render *r, size_t n)
{
    if (r->a.total + n > TPL_MAX_MEMORY) {
        if (!r->over) ks_error(r->d, r->t->name, "render takes too much memory (over %zu bytes)", TPL_MAX_MEMORY);
        r->over = 1;
        return NULL;
    }
    void *p = ks_arena_alloc(&r->a, n ? n : 1);
    if (!p) ks_error_oom(r->d, r->t->name, n, "chat template render");
    return p;
}

/* Room for one more entry in the parallel arrays *a and *b (elements of ea and eb bytes; n used, *cap
 * allocated, first the capacity of a first allocation), from the render's arena: the entries copied into
 * arrays twice as long, the old ones left to the arena. 0, or -1 after reporting. */
static int grow_pair(render *r, void **a, size_t ea, void **b, size_t eb, int n, int *cap, int first)
{
    if (n < *cap) return 0;
    const int c = *cap ? *cap * 2 : first;
    void *na = ralloc(r, (size_t)c * ea), *nb = ralloc(r, (size_t)c * eb);
    if (!na || !nb) return -1;
    if (n) {
        memcpy(na, *a, (size_t)n * ea);
        memcpy(nb, *b, (size_t)n * eb);
    }
    *a = na;
    *b = nb;
    *cap = c;
    return 0;
}

/* A new string of len bytes (plus a NUL), within TPL_MAX_STR. */
static char *rstr(render *r, const node *n, size_t len)
{
    if (len > TPL_MAX_STR) {
        rerr(r, n, "string too long (over %zu bytes)", TPL_MAX_STR);
        return NULL;
    }
    return ralloc(r, len + 1);
}

static tval *rvals(render *r, const node *n, size_t count)
{
    if (count > TPL_MAX_ITEMS) {
        rerr(r, n, "list too long (over %d items)", TPL_MAX_ITEMS);
        return NULL;
    }
    return ralloc(r, count * sizeof(tval));
}

static int mklist(render *r, const node *n, tval *items, int count, int is_tuple, tval *out)
{
    tlist *l = ralloc(r, sizeof *l);
    if (!l) return -1;
    l->v = items;
    l->n = count;
    l->is_tuple = is_tuple;
    *out = (tval){.kind = V_LIST, .list = l};
    (void)n;
    return 0;
}

static tval undef_named(render *r, const char *fmt, const char *a, size_t alen)
{
    tval u = V_UNDEFINED;
    char *msg = ks_arena_printf(&r->a, fmt, (int)alen, a);
    if (msg) u.s = msg, u.len = strlen(msg);
    return u;
}

static int undef_error(render *r, const node *n, const tval *v)
{
    if (v->s) return rerr(r, n, "%s", v->s);
    return rerr(r, n, "a value is undefined");
}

static const char *type_name(const tval *v)
{
    switch (v->kind) {
    case V_UNDEF: return "Undefined";
    case V_NONE: return "NoneType";
    case V_BOOL: return "bool";
    case V_INT: return "int";
    case V_FLOAT: return "float";
    case V_STR: return "str";
    case V_LIST: return v->list->is_tuple ? "tuple" : "list";
    case V_DICT: return "dict";
    case V_NS: return "Namespace";
    case V_LOOP: return "LoopContext";
    case V_FUNC: return "function";
    case V_METHOD: return "builtin_function_or_method";
    }
    return "?";
}

static int truthy(const tval *v)
{
    switch (v->kind) {
    case V_UNDEF: case V_NONE: return 0;
    case V_BOOL: return v->b;
    case V_INT: return v->i != 0;
    case V_FLOAT: return v->f != 0;
    case V_STR: return v->len > 0;
    case V_LIST: return v->list->n > 0;
    case V_DICT: return v->dict->n > 0;
    default: return 1;
    }
}

static int is_num(const tval *v) { return v->kind == V_BOOL || v->kind == V_INT || v->kind == V_FLOAT; }
static int is_intlike(const tval *v) { return v->kind == V_BOOL || v->kind == V_INT; }
static int64_t as_int(const tval *v) { return v->kind == V_BOOL ? v->b : v->i; }
static double as_float(const tval *v) { return v->kind == V_FLOAT ? v->f : (double)as_int(v); }


/* ---- dicts ---- */

static int dict_find(const tdict *d, const tval *key);

static int dict_set(render *r, tdict *d, tval key, tval val)
{
    int i = dict_find(d, &key);
    if (i >= 0) {
        d->vals[i] = val;
        return 0;
    }
    if (grow_pair(r, (void **)&d->keys, sizeof *d->keys, (void **)&d->vals, sizeof *d->vals, d->n, &d->cap, 4)) return -1;
    d->keys[d->n] = key;
    d->vals[d->n++] = val;
    return 0;
}

/* ---- equality and order, as Python has them ---- */

static int v_eq(const tval *a, const tval *b)
{
    if (is_num(a) && is_num(b)) {
        if (is_intlike(a) && is_intlike(b)) return as_int(a) == as_int(b);
        return as_float(a) == as_float(b);
    }
    if (a->kind != b->kind) return 0;
    switch (a->kind) {
    case V_UNDEF: case V_NONE: return 1;
    case V_STR: return a->len == b->len && (a->len == 0 || memcmp(a->s, b->s, a->len) == 0);
    case V_LIST:
        if (a->list->n != b->list->n || a->list->is_tuple != b->list->is_tuple) return 0;
        for (int i = 0; i < a->list->n; i++)
            if (!v_eq(&a->list->v[i], &b->list->v[i])) return 0;
        return 1;
    case V_DICT:
        if (a->dict->n != b->dict->n) return 0;
        for (int i = 0; i < a->dict->n; i++) {
            int j = dict_find(b->dict, &a->dict->keys[i]);
            if (j < 0 || !v_eq(&a->dict->vals[i], &b->dict->vals[j])) return 0;
        }
        return 1;
    case V_NS: return a->dict == b->dict;
    case V_LOOP: return a->loop == b->loop;
    case V_FUNC: return a->i == b->i;
    default: return 0;
    }
}

static int dict_find(const tdict *d, const tval *key)
{
    for (int i = 0; i < d->n; i++)
        if (v_eq(&d->keys[i], key)) return i;
    return -1;
}

/* *res < 0, 0, > 0 as a < b, or an error for types Python does not order. */
static int v_cmp(render *r, const node *n, const char *op, const tval *a, const tval *b, int *res)
{
    if (a->kind == V_UNDEF) return undef_error(r, n, a);
    if (b->kind == V_UNDEF) return undef_error(r, n, b);
    if (is_num(a) && is_num(b)) {
        if (is_intlike(a) && is_intlike(b))
            *res = as_int(a) < as_int(b) ? -1 : as_int(a) > as_int(b);
        else
            *res = as_float(a) < as_float(b) ? -1 : as_float(a) > as_float(b) ? 1 : as_float(a) == as_float(b) ? 0 : 2;
        return 0;
    }
    if (a->kind == V_STR && b->kind == V_STR) {
        size_t m = a->len < b->len ? a->len : b->len;
        int c = m ? memcmp(a->s, b->s, m) : 0;
        *res = c ? c : a->len < b->len ? -1 : a->len > b->len;
        return 0;
    }
    if (a->kind == V_LIST && b->kind == V_LIST && a->list->is_tuple == b->list->is_tuple) {
        int i = 0;
        while (i < a->list->n && i < b->list->n && v_eq(&a->list->v[i], &b->list->v[i])) i++;
        if (i < a->list->n && i < b->list->n) return v_cmp(r, n, op, &a->list->v[i], &b->list->v[i], res);
        *res = a->list->n < b->list->n ? -1 : a->list->n > b->list->n;
        return 0;
    }
    return rerr(r, n, "'%s' not supported between instances of '%s' and '%s'", op, type_name(a), type_name(b));
}

/* ---- str() and repr() ---- */

static void write_float(ks_buf *b, double f)
{
    if (isnan(f)) {
        ks_buf_puts(b, "nan");
        return;
    }
    if (isinf(f)) {
        ks_buf_puts(b, f < 0 ? "-inf" : "inf");
        return;
    }
    char buf[64];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* buf: [-]d[.ddd]e(+|-)xx — Python's repr: the shortest digits, fixed notation when the
     * decimal point falls within -4 < decpt <= 16, else d.ddde+XX */
    const char *s = buf;
    int neg = *s == '-';
    if (neg) s++;
    char digits[32];
    int nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s != '.') digits[nd++] = *s;
    int exp = atoi(s + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    int decpt = exp + 1;
    if (neg) ks_buf_put(b, "-", 1);
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            ks_buf_puts(b, "0.");
            for (int i = 0; i < -decpt; i++) ks_buf_put(b, "0", 1);
            ks_buf_put(b, digits, (size_t)nd);
        } else if (decpt >= nd) {
            ks_buf_put(b, digits, (size_t)nd);
            for (int i = nd; i < decpt; i++) ks_buf_put(b, "0", 1);
            ks_buf_puts(b, ".0");
        } else {
            ks_buf_put(b, digits, (size_t)decpt);
            ks_buf_put(b, ".", 1);
            ks_buf_put(b, digits + decpt, (size_t)(nd - decpt));
        }
    } else {
        ks_buf_put(b, digits, 1);
        if (nd > 1) {
            ks_buf_put(b, ".", 1);
            ks_buf_put(b, digits + 1, (size_t)(nd - 1));
        }
        ks_buf_printf(b, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
}

/* Code points Python's str.isprintable() refuses (Other and Separator categories), as far as
 * templates meet them. */
static int py_unprintable(uint32_t c)
{
    return c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD || c == 0x1680 || (c >= 0x2000 && c <= 0x200F) ||
           (c >= 0x2028 && c <= 0x202F) || (c >= 0x205F && c <= 0x2064) || c == 0x3000 || c == 0xFEFF ||
           (c >= 0xD800 && c <= 0xDFFF) || (c >= 0xE000 && c <= 0xF8FF);
}

static void write_repr_str(ks_buf *b, const char *s, size_t n)
{
    char q = memchr(s, '\'', n) && !memchr(s, '"', n) ? '"' : '\'';
    ks_buf_put(b, &q, 1);
    for (size_t i = 0, len; i < n; i += len) {
        uint32_t c = utf8_decode(s, n, i, &len);
        if (c == '\\' || c == (uint32_t)q) {
            ks_buf_put(b, "\\", 1);
            ks_buf_put(b, s + i, 1);
        } else if (c == '\n') {
            ks_buf_puts(b, "\\n");
        } else if (c == '\r') {
            ks_buf_puts(b, "\\r");
        } else if (c == '\t') {
            ks_buf_puts(b, "\\t");
        } else if (py_unprintable(c)) {
            if (c < 0x100)
                ks_buf_printf(b, "\\x%02x", (unsigned)c);
            else
                ks_buf_printf(b, "\\u%04x", (unsigned)c);
        } else {
            ks_buf_put(b, s + i, len);
        }
    }
    ks_buf_put(b, &q, 1);
}

/* str(v) (repr: repr(v), as items of a list print) into b. */
static void write_value(ks_buf *b, const tval *v, int repr, int depth)
{
    if (depth > 32) {
        ks_buf_puts(b, "...");
        return;
    }
    switch (v->kind) {
    case V_UNDEF: break;
    case V_NONE: ks_buf_puts(b, "None"); break;
    case V_BOOL: ks_buf_puts(b, v->b ? "True" : "False"); break;
    case V_INT: ks_buf_printf(b, "%lld", (long long)v->i); break;
    case V_FLOAT: write_float(b, v->f); break;
    case V_STR:
        if (repr)
            write_repr_str(b, v->s, v->len);
        else
            ks_buf_put(b, v->s, v->len);
        break;
    case V_LIST:
        ks_buf_puts(b, v->list->is_tuple ? "(" : "[");
        for (int i = 0; i < v->list->n; i++) {
            if (i) ks_buf_puts(b, ", ");
            write_value(b, &v->list->v[i], 1, depth + 1);
        }
        ks_buf_puts(b, v->list->is_tuple ? (v->list->n == 1 ? ",)" : ")") : "]");
        break;
    case V_DICT: case V_NS:
        ks_buf_puts(b, v->kind == V_NS ? "<Namespace {" : "{");
        for (int i = 0; i < v->dict->n; i++) {
            if (i) ks_buf_puts(b, ", ");
            write_value(b, &v->dict->keys[i], 1, depth + 1);
            ks_buf_puts(b, ": ");
            write_value(b, &v->dict->vals[i], 1, depth + 1);
        }
        ks_buf_puts(b, v->kind == V_NS ? "}>" : "}");
        break;
    case V_LOOP: ks_buf_puts(b, "<LoopContext>"); break;
    case V_FUNC: case V_METHOD: ks_buf_puts(b, "<function>"); break;
    }
}

/* str(v) as a string value. */
static int to_str(render *r, const node *n, const tval *v, tval *out)
{
    if (v->kind == V_STR) {
        *out = *v;
        return 0;
    }
    if (v->kind == V_UNDEF) {
        *out = v_str("", 0);
        return 0;
    }
    ks_buf b = KS_BUF_TRY;
    write_value(&b, v, 0, 0);
    if (b.failed) {
        ks_buf_free(&b);
        return ks_error_oom(r->d, r->t->name, 0, "chat template render");
    }
    char *s = rstr(r, n, b.len);
    if (s && b.len) memcpy(s, b.data, b.len);
    size_t len = b.len;
    ks_buf_free(&b);
    if (!s) return -1;
    *out = v_str(s, len);
    return 0;
}

/* ---- json.dumps(v, ensure_ascii=False, indent=indent) (transformers' tojson) ---- */

static void json_indent(ks_buf *b, int indent, int level)
{
    ks_buf_put(b, "\n", 1);
    for (int i = 0; i < indent * level; i++) ks_buf_put(b, " ", 1);
}

static void json_str(ks_buf *b, const char *s, size_t n)
{
    ks_buf_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': ks_buf_puts(b, "\\\""); break;
        case '\\': ks_buf_puts(b, "\\\\"); break;
        case '\n': ks_buf_puts(b, "\\n"); break;
        case '\r': ks_buf_puts(b, "\\r"); break;
        case '\t': ks_buf_puts(b, "\\t"); break;
        case '\b': ks_buf_puts(b, "\\b"); break;
        case '\f': ks_buf_puts(b, "\\f"); break;
        default:
            if (c < 0x20)
                ks_buf_printf(b, "\\u%04x", c);
            else
                ks_buf_put(b, s + i, 1);
        }
    }
    ks_buf_put(b, "\"", 1);
}

static int write_json(render *r, const node *n, ks_buf *b, const tval *v, int indent, int level)
{
    if (level > 64) return rerr(r, n, "tojson: value nested too deeply");
    switch (v->kind) {
    case V_NONE: ks_buf_puts(b, "null"); return 0;
    case V_BOOL: ks_buf_puts(b, v->b ? "true" : "false"); return 0;
    case V_INT: ks_buf_printf(b, "%lld", (long long)v->i); return 0;
    case V_FLOAT:
        if (isnan(v->f)) ks_buf_puts(b, "NaN");
        else if (isinf(v->f)) ks_buf_puts(b, v->f < 0 ? "-Infinity" : "Infinity");
        else write_float(b, v->f);
        return 0;
    case V_STR: json_str(b, v->s, v->len); return 0;
    case V_LIST: {
        if (!v->list->n) {
            ks_buf_puts(b, "[]");
            return 0;
        }
        ks_buf_put(b, "[", 1);
        for (int i = 0; i < v->list->n; i++) {
            if (i) ks_buf_puts(b, indent >= 0 ? "," : ", ");
            if (indent >= 0) json_indent(b, indent, level + 1);
            if (write_json(r, n, b, &v->list->v[i], indent, level + 1)) return -1;
        }
        if (indent >= 0) json_indent(b, indent, level);
        ks_buf_put(b, "]", 1);
        return 0;
    }
    case V_DICT: {
        if (!v->dict->n) {
            ks_buf_puts(b, "{}");
            return 0;
        }
        ks_buf_put(b, "{", 1);
        for (int i = 0; i < v->dict->n; i++) {
            const tval *k = &v->dict->keys[i];
            if (i) ks_buf_puts(b, indent >= 0 ? "," : ", ");
            if (indent >= 0) json_indent(b, indent, level + 1);
            if (k->kind == V_STR) {
                json_str(b, k->s, k->len);
            } else if (k->kind == V_NONE || k->kind == V_BOOL || k->kind == V_INT || k->kind == V_FLOAT) {
                ks_buf_put(b, "\"", 1);
                if (write_json(r, n, b, k, -1, level + 1)) return -1;
                ks_buf_put(b, "\"", 1);
            } else {
                return rerr(r, n, "tojson: keys must be str, int, float, bool or None, not %s", type_name(k));
            }
            ks_buf_puts(b, ": ");
            if (write_json(r, n, b, &v->dict->vals[i], indent, level + 1)) return -1;
        }
        if (indent >= 0) json_indent(b, indent, level);
        ks_buf_put(b, "}", 1);
        return 0;
    }
    default: return rerr(r, n, "tojson: Object of type %s is not JSON serializable", type_name(v));
    }
}

/* ---- iteration, containment ---- */

/* The items a for loop over v sees. */
static int v_iter(render *r, const node *n, const tval *v, const tlist **out)
{
    static const tlist empty = {0};
    switch (v->kind) {
    case V_UNDEF: *out = &empty; return 0;
    case V_LIST: *out = v->list; return 0;
    case V_DICT: {
        tval lv;
        if (mklist(r, n, v->dict->keys, v->dict->n, 0, &lv)) return -1;
        *out = lv.list;
        return 0;
    }
    case V_STR: {
        size_t count = utf8_count(v->s, v->len);
        tval *items = rvals(r, n, count), lv;
        if (!items) return -1;
        size_t k = 0;
        for (size_t i = 0, len; i < v->len; i += len) {
            utf8_decode(v->s, v->len, i, &len);
            items[k++] = v_str(v->s + i, len);
        }
        if (mklist(r, n, items, (int)count, 0, &lv)) return -1;
        *out = lv.list;
        return 0;
    }
    default: return rerr(r, n, "'%s' object is not iterable", type_name(v));
    }
}

static int v_in(render *r, const node *n, const tval *item, const tval *c, int *res)
{
    switch (c->kind) {
    case V_UNDEF: *res = 0; return 0;
    case V_STR:
        if (item->kind != V_STR)
            return rerr(r, n, "'in <string>' requires string as left operand, not %s", type_name(item));
        *res = 0;
        if (item->len == 0) *res = 1;
        for (size_t i = 0; !*res && item->len <= c->len && i <= c->len - item->len; i++)
            if (memcmp(c->s + i, item->s, item->len) == 0) *res = 1;
        return 0;
    case V_LIST:
        *res = 0;
        for (int i = 0; i < c->list->n && !*res; i++) *res = v_eq(item, &c->list->v[i]);
        return 0;
    case V_DICT: case V_NS: *res = dict_find(c->dict, item) >= 0; return 0;
    default: return rerr(r, n, "argument of type '%s' is not iterable", type_name(c));
    }
}

/* ---- scopes ---- */

static const tval *frame_get(const render *r, const char *name)
{
    for (const frame *f = r->top; f; f = f->up)
        for (int i = f->n - 1; i >= 0; i--)
            if (strcmp(f->names[i], name) == 0) return &f->vals[i];
    return NULL;
}

static int frame_set(render *r, frame *f, const char *name, tval v)
{
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->names[i], name) == 0) {
            f->vals[i] = v;
            return 0;
        }
    if (grow_pair(r, (void **)&f->names, sizeof *f->names, (void **)&f->vals, sizeof *f->vals, f->n, &f->cap, 8)) return -1;
    f->names[f->n] = name;
    f->vals[f->n++] = v;
    return 0;
}

/* ---- attributes and items ---- */

static const char *const str_methods[] = {"strip", "lstrip", "rstrip", "startswith", "endswith", "split", "upper",
                                          "lower", "title", "capitalize", "replace", NULL};
static const char *const dict_methods[] = {"items", "keys", "values", "get", NULL};

static int in_names(const char *const *names, const char *s)
{
    for (int i = 0; names[i]; i++)
        if (strcmp(names[i], s) == 0) return 1;
    return 0;
}

static int method(render *r, const tval *self, const char *name, tval *out)
{
    tval *s = ralloc(r, sizeof *s);
    if (!s) return -1;
    *s = *self;
    *out = (tval){.kind = V_METHOD, .self = s, .s = name};
    return 0;
}

/* String index i of v (a code point), Python-style (negative from the end); undefined past it. */
static int str_index(render *r, const tval *v, int64_t i, tval *out)
{
    int64_t count = (int64_t)utf8_count(v->s, v->len);
    if (i < 0) i += count;
    if (i < 0 || i >= count) {
        *out = undef_named(r, "string index out of range%.*s", "", 0);
        return 0;
    }
    size_t pos = 0, len = 0;
    for (int64_t k = 0; k <= i; k++) {
        pos += len;
        utf8_decode(v->s, v->len, pos, &len);
    }
    *out = v_str(v->s + pos, len);
    return 0;
}

static int loop_attr(render *r, const tval *v, const char *name, tval *out)
{
    const tloop *l = v->loop;
    int n = l->items->n, i = l->index0;
    if (!strcmp(name, "index")) *out = v_int(i + 1);
    else if (!strcmp(name, "index0")) *out = v_int(i);
    else if (!strcmp(name, "revindex")) *out = v_int(n - i);
    else if (!strcmp(name, "revindex0")) *out = v_int(n - i - 1);
    else if (!strcmp(name, "first")) *out = v_bool(i == 0);
    else if (!strcmp(name, "last")) *out = v_bool(i == n - 1);
    else if (!strcmp(name, "length")) *out = v_int(n);
    else if (!strcmp(name, "depth")) *out = v_int(1);
    else if (!strcmp(name, "depth0")) *out = v_int(0);
    else if (!strcmp(name, "previtem")) *out = i > 0 ? l->items->v[i - 1] : undef_named(r, "there is no previous item%.*s", "", 0);
    else if (!strcmp(name, "nextitem")) *out = i < n - 1 ? l->items->v[i + 1] : undef_named(r, "there is no next item%.*s", "", 0);
    else if (!strcmp(name, "cycle")) return method(r, v, "cycle", out);
    else *out = undef_named(r, "'LoopContext object' has no attribute '%.*s'", name, strlen(name));
    return 0;
}

/* obj.name: an attribute first (a method), then an item, as Jinja's getattr. */
static int get_attr(render *r, const node *n, const tval *obj, const char *name, tval *out)
{
    switch (obj->kind) {
    case V_UNDEF: return undef_error(r, n, obj);
    case V_DICT:
        if (in_names(dict_methods, name)) return method(r, obj, name, out);
        /* fall through */
    case V_NS: {
        tval key = v_str(name, strlen(name));
        int i = dict_find(obj->dict, &key);
        if (i >= 0)
            *out = obj->dict->vals[i];
        else
            *out = undef_named(r, obj->kind == V_NS ? "'Namespace object' has no attribute '%.*s'"
                                                    : "'dict object' has no attribute '%.*s'", name, strlen(name));
        return 0;
    }
    case V_STR:
        if (in_names(str_methods, name)) return method(r, obj, name, out);
        break;
    case V_LOOP: return loop_attr(r, obj, name, out);
    default: break;
    }
    char what[64];
    snprintf(what, sizeof what, "'%s object' has no attribute '%%.*s'", type_name(obj));
    *out = undef_named(r, what, name, strlen(name));
    return 0;
}

/* obj[key]: an item first, then an attribute, as Jinja's getitem. */
static int get_item(render *r, const node *n, const tval *obj, const tval *key, tval *out)
{
    if (obj->kind == V_UNDEF) return undef_error(r, n, obj);
    if (key->kind == V_UNDEF) return undef_error(r, n, key);
    if (obj->kind == V_LIST && is_intlike(key)) {
        int64_t i = as_int(key);
        if (i < 0) i += obj->list->n;
        if (i < 0 || i >= obj->list->n)
            *out = undef_named(r, "%.*slist index out of range", "", 0);
        else
            *out = obj->list->v[i];
        return 0;
    }
    if (obj->kind == V_STR && is_intlike(key)) return str_index(r, obj, as_int(key), out);
    if (obj->kind == V_DICT || obj->kind == V_NS) {
        int i = dict_find(obj->dict, key);
        if (i >= 0) {
            *out = obj->dict->vals[i];
            return 0;
        }
    }
    if (key->kind == V_STR) {
        char *name = ks_arena_strndup(&r->a, key->s, key->len);
        if (!name) return ks_error_oom(r->d, r->t->name, key->len + 1, "chat template render");
        if (obj->kind == V_DICT || obj->kind == V_NS) {
            *out = undef_named(r, obj->kind == V_NS ? "'Namespace object' has no attribute '%.*s'"
                                                    : "'dict object' has no attribute '%.*s'", key->s, key->len);
            return 0;
        }
        return get_attr(r, n, obj, name, out);
    }
    *out = undef_named(r, "%.*sno such item", "", 0);
    return 0;
}

/* Python's slice.indices: first index, count, step of v[b:c:d] over len items. */
static int slice_range(render *r, const node *n, const tval *b, const tval *c, const tval *d, int64_t len,
                       int64_t *start, int64_t *count, int64_t *step)
{
    const tval *parts[3] = {b, c, d};
    for (int k = 0; k < 3; k++)
        if (parts[k]->kind != V_NONE && !is_intlike(parts[k]))
            return rerr(r, n, "slice indices must be integers or None, not %s", type_name(parts[k]));
    *step = d->kind == V_NONE ? 1 : as_int(d);
    if (*step == 0) return rerr(r, n, "slice step cannot be zero");
    if (*step < -INT64_MAX) *step = -INT64_MAX;
    int64_t lo = *step > 0 ? 0 : -1, hi = *step > 0 ? len : len - 1, s, e;
    if (b->kind == V_NONE) {
        s = *step > 0 ? lo : hi;
    } else {
        s = as_int(b);
        if (s < 0) s = s < -len ? lo : s + len;
        if (s < lo) s = lo;
        if (s > hi) s = hi;
    }
    if (c->kind == V_NONE) {
        e = *step > 0 ? hi : lo;
    } else {
        e = as_int(c);
        if (e < 0) e = e < -len ? lo : e + len;
        if (e < lo) e = lo;
        if (e > hi) e = hi;
    }
    *start = s;
    if (*step > 0)
        *count = e > s ? (e - s - 1) / *step + 1 : 0;
    else
        *count = s > e ? (s - e - 1) / (-*step) + 1 : 0;
    return 0;
}

static int get_slice(render *r, const node *n, const tval *obj, const tval *b, const tval *c, const tval *d,
                     tval *out)
{
    if (obj->kind == V_UNDEF) return undef_error(r, n, obj);
    if (obj->kind != V_LIST && obj->kind != V_STR) return rerr(r, n, "'%s' object is not subscriptable", type_name(obj));
    const tlist *items;
    if (v_iter(r, n, obj, &items)) return -1;
    int64_t start = 0, count = 0, step = 1;
    if (slice_range(r, n, b, c, d, items->n, &start, &count, &step)) return -1;
    if (obj->kind == V_LIST) {
        tval *v = rvals(r, n, (size_t)count);
        if (!v) return -1;
        for (int64_t k = 0; k < count; k++) v[k] = items->v[start + k * step];
        return mklist(r, n, v, (int)count, obj->list->is_tuple, out);
    }
    size_t len = 0;
    for (int64_t k = 0; k < count; k++) len += items->v[start + k * step].len;
    char *s = rstr(r, n, len);
    if (!s) return -1;
    size_t o = 0;
    for (int64_t k = 0; k < count; k++) {
        const tval *ch = &items->v[start + k * step];
        memcpy(s + o, ch->s, ch->len);
        o += ch->len;
    }
    *out = v_str(s, len);
    return 0;
}

/* ---- strings ---- */

static int concat(render *r, const node *n, const tval *a, const tval *b, tval *out)
{
    char *s = rstr(r, n, a->len + b->len);
    if (!s) return -1;
    if (a->len) memcpy(s, a->s, a->len);
    if (b->len) memcpy(s + a->len, b->s, b->len);
    *out = v_str(s, a->len + b->len);
    return 0;
}

/* Is code point c in the string chars? */
static int in_chars(const tval *chars, uint32_t c)
{
    for (size_t i = 0, len; i < chars->len; i += len)
        if (utf8_decode(chars->s, chars->len, i, &len) == c) return 1;
    return 0;
}

/* strip (which: 1 left, 2 right, 3 both) whitespace, or the characters of chars when it is a string. */
static int strip(render *r, const node *n, const tval *v, const tval *chars, int which, tval *out)
{
    if (chars && chars->kind != V_NONE && chars->kind != V_STR)
        return rerr(r, n, "strip arg must be None or str, not %s", type_name(chars));
    int by_chars = chars && chars->kind == V_STR;
    size_t s = 0, e = v->len, len;
    if (which & 1)
        while (s < e) {
            uint32_t c = utf8_decode(v->s, e, s, &len);
            if (by_chars ? !in_chars(chars, c) : !py_isspace(c)) break;
            s += len;
        }
    if (which & 2) {
        if (!by_chars) {
            e = s + rstrip_len(v->s + s, e - s);
        } else {
            while (e > s) {
                size_t j = e - 1;
                while (j > s && ((unsigned char)v->s[j] & 0xC0) == 0x80) j--;
                if (!in_chars(chars, utf8_decode(v->s, e, j, &len))) break;
                e = j;
            }
        }
    }
    *out = v_str(v->s + s, e - s);
    return 0;
}

static char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? (char)(c + 32) : c; }
static char ascii_upper(char c) { return c >= 'a' && c <= 'z' ? (char)(c - 32) : c; }
static int ascii_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

/* mode: 'l' lower, 'u' upper, 'c' capitalize, 't' str.title, 'T' Jinja's title filter. */
static int recase(render *r, const node *n, const tval *v, char mode, tval *out)
{
    char *s = rstr(r, n, v->len);
    if (!s) return -1;
    int prev_cased = 0, word_start = 1;
    for (size_t i = 0; i < v->len; i++) {
        char c = v->s[i];
        switch (mode) {
        case 'l': c = ascii_lower(c); break;
        case 'u': c = ascii_upper(c); break;
        case 'c': c = i == 0 ? ascii_upper(c) : ascii_lower(c); break;
        case 't':
            c = prev_cased ? ascii_lower(c) : ascii_upper(c);
            prev_cased = ascii_alpha(c);
            break;
        default: { /* split at runs of - whitespace ( { [ <; each piece: first upper, rest lower */
            int sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || c == ' ' || (c >= 9 && c <= 13);
            c = word_start ? ascii_upper(c) : ascii_lower(c);
            word_start = sep;
        }
        }
        s[i] = c;
    }
    *out = v_str(s, v->len);
    return 0;
}

static int str_replace(render *r, const node *n, const tval *v, const tval *old, const tval *new_, int64_t count,
                       tval *out)
{
    if (old->kind != V_STR || new_->kind != V_STR) return rerr(r, n, "replace() arguments must be str");
    ks_buf b = KS_BUF_TRY;
    size_t i = 0;
    int64_t done = 0;
    if (old->len == 0) {
        for (size_t len; (count < 0 || done < count); done++) {
            ks_buf_put(&b, new_->s, new_->len);
            if (i >= v->len) break;
            utf8_decode(v->s, v->len, i, &len);
            ks_buf_put(&b, v->s + i, len);
            i += len;
        }
        ks_buf_put(&b, v->s + i, v->len - i);
    } else {
        while (i < v->len) {
            if ((count < 0 || done < count) && i + old->len <= v->len && memcmp(v->s + i, old->s, old->len) == 0) {
                ks_buf_put(&b, new_->s, new_->len);
                i += old->len;
                done++;
            } else {
                ks_buf_put(&b, v->s + i, 1);
                i++;
            }
            if (b.len > TPL_MAX_STR) break;
        }
    }
    int rc = 0;
    if (b.failed) rc = ks_error_oom(r->d, r->t->name, 0, "chat template render");
    char *s = rc ? NULL : rstr(r, n, b.len);
    if (s) {
        if (b.len) memcpy(s, b.data, b.len);
        *out = v_str(s, b.len);
    }
    ks_buf_free(&b);
    return s ? 0 : -1;
}

/* str.split(sep=None, maxsplit=-1) */
static int str_split(render *r, const node *n, const tval *v, const tval *sep, int64_t maxsplit, tval *out)
{
    if (sep && sep->kind != V_NONE && sep->kind != V_STR) return rerr(r, n, "must be str or None, not %s", type_name(sep));
    if (sep && sep->kind == V_STR && sep->len == 0) return rerr(r, n, "empty separator");
    size_t cap = v->len + 1;
    tval *items = rvals(r, n, cap);
    if (!items) return -1;
    int k = 0;
    size_t i = 0, len;
    if (!sep || sep->kind == V_NONE) {
        for (;;) {
            i += lstrip_off(v->s + i, v->len - i);
            if (i >= v->len) break;
            if (maxsplit >= 0 && k >= maxsplit) {
                items[k++] = v_str(v->s + i, rstrip_len(v->s + i, v->len - i));
                break;
            }
            size_t s = i;
            while (i < v->len && !py_isspace(utf8_decode(v->s, v->len, i, &len))) i += len;
            items[k++] = v_str(v->s + s, i - s);
        }
    } else {
        size_t s = 0;
        while (i + sep->len <= v->len) {
            if ((maxsplit < 0 || k < maxsplit) && memcmp(v->s + i, sep->s, sep->len) == 0) {
                items[k++] = v_str(v->s + s, i - s);
                i += sep->len;
                s = i;
            } else {
                i++;
            }
        }
        items[k++] = v_str(v->s + s, v->len - s);
    }
    return mklist(r, n, items, k, 0, out);
}

static int affix(render *r, const node *n, const tval *v, const tval *a, int end, int *res)
{
    if (a->kind == V_LIST && a->list->is_tuple) {
        *res = 0;
        for (int i = 0; i < a->list->n && !*res; i++)
            if (affix(r, n, v, &a->list->v[i], end, res)) return -1;
        return 0;
    }
    if (a->kind != V_STR)
        return rerr(r, n, "%s first arg must be str or a tuple of str, not %s", end ? "endswith" : "startswith",
                    type_name(a));
    *res = a->len <= v->len && memcmp(v->s + (end ? v->len - a->len : 0), a->s, a->len) == 0;
    return 0;
}

/* ---- calls ---- */

static const tval *ca_get(const callargs *ca, int pos, const char *name)
{
    if (pos >= 0 && pos < ca->n) return &ca->pos[pos];
    for (int i = 0; name && i < ca->n_kw; i++)
        if (!strcmp(ca->kw_names[i], name)) return &ca->kw[i];
    return NULL;
}

static int want_int(render *r, const node *n, const tval *v, const char *what, int64_t *out)
{
    if (!is_intlike(v)) return rerr(r, n, "%s must be an integer, not %s", what, type_name(v));
    *out = as_int(v);
    return 0;
}

static int call_method(render *r, const node *n, const tval *m, const callargs *ca, tval *out)
{
    const tval *self = m->self;
    const char *name = m->s;
    const tval *a0 = ca_get(ca, 0, NULL), *a1 = ca_get(ca, 1, NULL);
    if (self->kind == V_STR) {
        if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip"))
            return strip(r, n, self, a0, name[0] == 'l' ? 1 : name[0] == 'r' ? 2 : 3, out);
        if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
            int res;
            if (!a0) return rerr(r, n, "%s() takes at least 1 argument (0 given)", name);
            if (affix(r, n, self, a0, name[0] == 'e', &res)) return -1;
            *out = v_bool(res);
            return 0;
        }
        if (!strcmp(name, "split")) {
            const tval *sep = ca_get(ca, 0, "sep"), *ms = ca_get(ca, 1, "maxsplit");
            int64_t maxsplit = -1;
            if (ms && want_int(r, n, ms, "maxsplit", &maxsplit)) return -1;
            return str_split(r, n, self, sep, maxsplit, out);
        }
        if (!strcmp(name, "upper")) return recase(r, n, self, 'u', out);
        if (!strcmp(name, "lower")) return recase(r, n, self, 'l', out);
        if (!strcmp(name, "title")) return recase(r, n, self, 't', out);
        if (!strcmp(name, "capitalize")) return recase(r, n, self, 'c', out);
        if (!strcmp(name, "replace")) {
            int64_t count = -1;
            if (!a0 || !a1) return rerr(r, n, "replace() takes at least 2 arguments");
            const tval *c = ca_get(ca, 2, "count");
            if (c && want_int(r, n, c, "count", &count)) return -1;
            return str_replace(r, n, self, a0, a1, count, out);
        }
    } else if (self->kind == V_DICT) {
        const tdict *d = self->dict;
        if (!strcmp(name, "get")) {
            if (!a0) return rerr(r, n, "get expected at least 1 argument, got 0");
            int i = dict_find(d, a0);
            *out = i >= 0 ? d->vals[i] : a1 ? *a1 : v_none();
            return 0;
        }
        tval *items = rvals(r, n, (size_t)d->n);
        if (!items) return -1;
        for (int i = 0; i < d->n; i++) {
            if (!strcmp(name, "items")) {
                tval *pair = rvals(r, n, 2);
                if (!pair) return -1;
                pair[0] = d->keys[i];
                pair[1] = d->vals[i];
                if (mklist(r, n, pair, 2, 1, &items[i])) return -1;
            } else {
                items[i] = name[0] == 'k' ? d->keys[i] : d->vals[i];
            }
        }
        return mklist(r, n, items, d->n, 0, out);
    } else if (self->kind == V_LOOP && !strcmp(name, "cycle")) {
        if (!ca->n) return rerr(r, n, "no items for cycling given");
        *out = ca->pos[self->loop->index0 % ca->n];
        return 0;
    }
    return rerr(r, n, "'%s object' has no attribute '%s'", type_name(self), name);
}

static int call_func(render *r, const node *n, int id, const callargs *ca, tval *out)
{
    switch ((func_id)id) {
    case G_RAISE_EXCEPTION: {
        tval msg = v_str("", 0);
        const tval *a = ca_get(ca, 0, "message");
        if (a && to_str(r, n, a, &msg)) return -1;
        return rerr(r, n, "%.*s", (int)(msg.len > INT_MAX ? INT_MAX : msg.len), msg.s);
    }
    case G_NAMESPACE: {
        tdict *d = ralloc(r, sizeof *d);
        if (!d) return -1;
        const tval *init = ca_get(ca, 0, NULL);
        if (init && init->kind == V_DICT)
            for (int i = 0; i < init->dict->n; i++)
                if (dict_set(r, d, init->dict->keys[i], init->dict->vals[i])) return -1;
        for (int i = 0; i < ca->n_kw; i++)
            if (dict_set(r, d, v_str(ca->kw_names[i], strlen(ca->kw_names[i])), ca->kw[i])) return -1;
        *out = (tval){.kind = V_NS, .dict = d};
        return 0;
    }
    case G_RANGE: {
        int64_t a[3] = {0, 0, 1};
        if (ca->n < 1 || ca->n > 3) return rerr(r, n, "range expected 1 to 3 arguments, got %d", ca->n);
        for (int i = 0; i < ca->n; i++)
            if (want_int(r, n, &ca->pos[i], "a range argument", &a[i])) return -1;
        if (ca->n == 1) a[1] = a[0], a[0] = 0;
        if (a[2] == 0) return rerr(r, n, "range() arg 3 must not be zero");
        double count = a[2] > 0 ? (a[1] > a[0] ? ((double)a[1] - (double)a[0] - 1) / (double)a[2] + 1 : 0)
                                : (a[0] > a[1] ? ((double)a[0] - (double)a[1] - 1) / (double)-a[2] + 1 : 0);
        if (count > TPL_MAX_ITEMS) return rerr(r, n, "range too long (over %d items)", TPL_MAX_ITEMS);
        int k = (int)count;
        tval *v = rvals(r, n, (size_t)k);
        if (!v) return -1;
        for (int i = 0; i < k; i++) v[i] = v_int(a[0] + (int64_t)i * a[2]);
        return mklist(r, n, v, k, 0, out);
    }
    case G_STRFTIME_NOW: {
        const tval *f = ca_get(ca, 0, "format");
        if (!f || f->kind != V_STR) return rerr(r, n, "strftime_now() takes a format string");
        char fmt[256], buf[512];
        snprintf(fmt, sizeof fmt, "%.*s", (int)(f->len > 255 ? 255 : f->len), f->s);
        time_t now = time(NULL);
        struct tm tm;
        size_t len = localtime_r(&now, &tm) ? strftime(buf, sizeof buf, fmt, &tm) : 0;
        char *s = rstr(r, n, len);
        if (!s) return -1;
        memcpy(s, buf, len);
        *out = v_str(s, len);
        return 0;
    }
    case G_COUNT_: break;
    }
    return rerr(r, n, "not callable");
}

/* ---- tests and filters ---- */

static int apply_test(render *r, const node *n, int id, const tval *v, const tval *args, int n_args, int *res);
static int apply_filter(render *r, const node *n, int id, const tval *v, const callargs *ca, tval *out);

static int need_arg(render *r, const node *n, int n_args, const char *what)
{
    if (n_args < 1) return rerr(r, n, "the '%s' test takes an argument", what);
    return 0;
}

static int apply_test(render *r, const node *n, int id, const tval *v, const tval *args, int n_args, int *res)
{
    int c;
    switch ((test_id)id) {
    case T_BOOLEAN: *res = v->kind == V_BOOL; return 0;
    case T_CALLABLE: *res = v->kind == V_FUNC || v->kind == V_METHOD; return 0;
    case T_DEFINED: *res = v->kind != V_UNDEF; return 0;
    case T_UNDEFINED: *res = v->kind == V_UNDEF; return 0;
    case T_NONE: *res = v->kind == V_NONE; return 0;
    case T_STRING: *res = v->kind == V_STR; return 0;
    case T_MAPPING: *res = v->kind == V_DICT; return 0;
    case T_ITERABLE: *res = v->kind == V_UNDEF || v->kind == V_STR || v->kind == V_LIST || v->kind == V_DICT; return 0;
    case T_SEQUENCE: *res = v->kind == V_UNDEF || v->kind == V_STR || v->kind == V_LIST || v->kind == V_DICT; return 0;
    case T_NUMBER: *res = is_num(v); return 0;
    case T_INTEGER: *res = v->kind == V_INT; return 0;
    case T_FLOAT: *res = v->kind == V_FLOAT; return 0;
    case T_TRUE: *res = v->kind == V_BOOL && v->b; return 0;
    case T_FALSE: *res = v->kind == V_BOOL && !v->b; return 0;
    case T_LOWER: case T_UPPER: {
        tval s, cased;
        if (to_str(r, n, v, &s) || recase(r, n, &s, id == T_LOWER ? 'l' : 'u', &cased)) return -1;
        *res = v_eq(&s, &cased);
        return 0;
    }
    case T_ODD: case T_EVEN: case T_DIVISIBLEBY: {
        int64_t x = 0, m = id == T_DIVISIBLEBY ? 0 : 2;
        if (want_int(r, n, v, "the value tested", &x)) return -1;
        if (id == T_DIVISIBLEBY && (need_arg(r, n, n_args, "divisibleby") || want_int(r, n, &args[0], "the divisor", &m)))
            return -1;
        if (m == 0) return rerr(r, n, "integer modulo by zero");
        int64_t rem = m == -1 ? 0 : x % m;
        *res = id == T_ODD ? rem != 0 : rem == 0;
        return 0;
    }
    case T_EQ: case T_EQUALTO: case T_OP_EQ: case T_SAMEAS:
        if (need_arg(r, n, n_args, test_names[id])) return -1;
        *res = id == T_SAMEAS && !(v->kind == V_NONE || v->kind == V_BOOL) ? v_eq(v, &args[0]) && v->kind == args[0].kind
                                                                         : v_eq(v, &args[0]);
        if (id == T_SAMEAS && (v->kind == V_NONE || v->kind == V_BOOL)) *res = v->kind == args[0].kind && v_eq(v, &args[0]);
        return 0;
    case T_NE: case T_OP_NE:
        if (need_arg(r, n, n_args, test_names[id])) return -1;
        *res = !v_eq(v, &args[0]);
        return 0;
    case T_LT: case T_OP_LT: case T_LE: case T_OP_LE: case T_GT: case T_OP_GT: case T_GE: case T_OP_GE:
        if (need_arg(r, n, n_args, test_names[id]) || v_cmp(r, n, test_names[id], v, &args[0], &c)) return -1;
        *res = id == T_LT || id == T_OP_LT ? c == -1 : id == T_LE || id == T_OP_LE ? c == -1 || c == 0
             : id == T_GT || id == T_OP_GT ? c == 1 : c == 1 || c == 0;
        return 0;
    case T_IN:
        if (need_arg(r, n, n_args, "in")) return -1;
        return v_in(r, n, v, &args[0], res);
    case T_COUNT_: break;
    }
    return rerr(r, n, "unknown test");
}

/* For select, reject, selectattr, rejectattr, map: the items of v, and for each the test or filter. */
static int filter_items(render *r, const node *n, int id, const tval *v, const callargs *ca, tval *out)
{
    const tlist *items;
    if (v_iter(r, n, v, &items)) return -1;
    int by_attr = id == F_SELECTATTR || id == F_REJECTATTR;
    int keep_if = id == F_SELECT || id == F_SELECTATTR;
    tval *kept = rvals(r, n, (size_t)items->n);
    if (!kept) return -1;
    int k = 0;
    const tval *attr = NULL;
    int argi = 0;
    if (by_attr || id == F_MAP) {
        attr = by_attr ? ca_get(ca, 0, NULL) : ca_get(ca, -1, "attribute");
        if (by_attr && !attr) return rerr(r, n, "%s needs an attribute name", filter_names[id]);
        if (by_attr) argi = 1;
    }
    const tval *name = ca_get(ca, argi, NULL);
    int fid = -1;
    if (name) {
        if (name->kind != V_STR) return rerr(r, n, "%s: the test or filter name must be a string", filter_names[id]);
        fid = id == F_MAP ? lookup_name(filter_names, F_COUNT_, name->s, name->len)
                          : lookup_name(test_names, T_COUNT_, name->s, name->len);
        if (fid < 0 && !(id == F_MAP && attr))
            return rerr(r, n, "no %s named '%.*s'", id == F_MAP ? "filter" : "test", (int)name->len, name->s);
    }
    for (int i = 0; i < items->n; i++) {
        tval x = items->v[i];
        if (attr) {
            tval got;
            if (attr->kind == V_STR || is_intlike(attr)) {
                if (get_item(r, n, &x, attr, &got)) return -1;
            } else {
                return rerr(r, n, "%s: the attribute must be a string", filter_names[id]);
            }
            x = got;
            if (id == F_MAP) {
                const tval *dflt = ca_get(ca, -1, "default");
                if (x.kind == V_UNDEF && dflt) x = *dflt;
                kept[k++] = x;
                continue;
            }
        }
        if (id == F_MAP) {
            if (fid < 0) return rerr(r, n, "map needs a filter name or attribute=");
            callargs rest = {ca->pos + argi + 1, ca->n - argi - 1 > 0 ? ca->n - argi - 1 : 0, NULL, NULL, 0};
            if (apply_filter(r, n, fid, &x, &rest, &kept[k++])) return -1;
            continue;
        }
        int res;
        if (fid >= 0) {
            int na = ca->n - argi - 1;
            if (apply_test(r, n, fid, &x, ca->pos + argi + 1, na > 0 ? na : 0, &res)) return -1;
        } else {
            res = truthy(&x);
        }
        if (!!res == keep_if) kept[k++] = items->v[i];
    }
    return mklist(r, n, kept, k, 0, out);
}

static int apply_filter(render *r, const node *n, int id, const tval *v, const callargs *ca, tval *out)
{
    const tval *a0 = ca_get(ca, 0, NULL);
    tval s;
    switch ((filter_id)id) {
    case F_ABS:
        if (v->kind == V_FLOAT) *out = v_float(fabs(v->f));
        else if (is_intlike(v) && as_int(v) != INT64_MIN) *out = v_int(as_int(v) < 0 ? -as_int(v) : as_int(v));
        else return rerr(r, n, "bad operand type for abs(): '%s'", type_name(v));
        return 0;
    case F_CAPITALIZE: return to_str(r, n, v, &s) || recase(r, n, &s, 'c', out) ? -1 : 0;
    case F_TITLE: return to_str(r, n, v, &s) || recase(r, n, &s, 'T', out) ? -1 : 0;
    case F_LOWER: return to_str(r, n, v, &s) || recase(r, n, &s, 'l', out) ? -1 : 0;
    case F_UPPER: return to_str(r, n, v, &s) || recase(r, n, &s, 'u', out) ? -1 : 0;
    case F_COUNT: case F_LENGTH:
        switch (v->kind) {
        case V_UNDEF: *out = v_int(0); return 0;
        case V_STR: *out = v_int((int64_t)utf8_count(v->s, v->len)); return 0;
        case V_LIST: *out = v_int(v->list->n); return 0;
        case V_DICT: *out = v_int(v->dict->n); return 0;
        default: return rerr(r, n, "object of type '%s' has no len()", type_name(v));
        }
    case F_D: case F_DEFAULT: {
        const tval *b = ca_get(ca, 1, "boolean");
        const tval *dv = ca_get(ca, 0, "default_value");
        if (v->kind == V_UNDEF || (b && truthy(b) && !truthy(v)))
            *out = dv ? *dv : v_str("", 0);
        else
            *out = *v;
        return 0;
    }
    case F_FIRST: case F_LAST: {
        const tlist *items;
        if (v->kind == V_UNDEF) {
            *out = undef_named(r, "%.*sNo first item, sequence was empty.", "", 0);
            return 0;
        }
        if (v_iter(r, n, v, &items)) return -1;
        if (!items->n)
            *out = undef_named(r, "%.*sNo item, sequence was empty.", "", 0);
        else
            *out = items->v[id == F_FIRST ? 0 : items->n - 1];
        return 0;
    }
    case F_FLOAT: case F_INT: {
        const tval *dflt = ca_get(ca, 0, "default");
        double f;
        int ok = 1;
        if (is_num(v)) {
            f = as_float(v);
            if (id == F_INT && is_intlike(v)) {
                *out = v_int(as_int(v));
                return 0;
            }
        } else if (v->kind == V_STR) {
            char buf[128];
            size_t off = lstrip_off(v->s, v->len), len = rstrip_len(v->s, v->len);
            len = len > off ? len - off : 0;
            if (len == 0 || len >= sizeof buf) {
                ok = 0;
                f = 0;
            } else {
                memcpy(buf, v->s + off, len);
                buf[len] = 0;
                char *end;
                f = strtod(buf, &end);
                ok = *end == 0;
            }
        } else {
            ok = 0;
            f = 0;
        }
        if (!ok || (id == F_INT && (isnan(f) || fabs(f) >= 9.2e18))) {
            *out = dflt ? *dflt : id == F_INT ? v_int(0) : v_float(0);
            return 0;
        }
        *out = id == F_INT ? v_int((int64_t)f) : v_float(f);
        return 0;
    }
    case F_ITEMS: {
        if (v->kind == V_UNDEF) return mklist(r, n, NULL, 0, 0, out);
        if (v->kind != V_DICT) return rerr(r, n, "can only get item pairs from a mapping");
        tval m;
        callargs none = {0};
        return method(r, v, "items", &m) || call_method(r, n, &m, &none, out) ? -1 : 0;
    }
    case F_JOIN: {
        const tval *sep = ca_get(ca, 0, "d"), *attr = ca_get(ca, 1, "attribute");
        tval sepv = v_str("", 0);
        if (sep && to_str(r, n, sep, &sepv)) return -1;
        const tlist *items;
        if (v_iter(r, n, v, &items)) return -1;
        ks_buf b = KS_BUF_TRY;
        int rc = 0;
        for (int i = 0; i < items->n && !rc; i++) {
            tval x = items->v[i], xs;
            if (attr) rc = get_item(r, n, &items->v[i], attr, &x);
            if (!rc) rc = to_str(r, n, &x, &xs);
            if (!rc) {
                if (i) ks_buf_put(&b, sepv.s, sepv.len);
                ks_buf_put(&b, xs.s, xs.len);
                if (b.len > TPL_MAX_STR) rc = rerr(r, n, "string too long (over %zu bytes)", TPL_MAX_STR);
            }
        }
        if (!rc && b.failed) rc = ks_error_oom(r->d, r->t->name, 0, "chat template render");
        char *str = rc ? NULL : rstr(r, n, b.len);
        if (str) {
            if (b.len) memcpy(str, b.data, b.len);
            *out = v_str(str, b.len);
        }
        ks_buf_free(&b);
        return str ? 0 : -1;
    }
    case F_LIST: {
        const tlist *items;
        if (v_iter(r, n, v, &items)) return -1;
        return mklist(r, n, items->v, items->n, 0, out);
    }
    case F_MAP: case F_REJECT: case F_REJECTATTR: case F_SELECT: case F_SELECTATTR:
        return filter_items(r, n, id, v, ca, out);
    case F_REPLACE: {
        const tval *a1 = ca_get(ca, 1, NULL), *c = ca_get(ca, 2, "count");
        int64_t count = -1;
        if (!a0 || !a1) return rerr(r, n, "replace needs the old and the new text");
        if (c && c->kind != V_NONE && want_int(r, n, c, "count", &count)) return -1;
        tval olds, news;
        if (to_str(r, n, v, &s) || to_str(r, n, a0, &olds) || to_str(r, n, a1, &news)) return -1;
        return str_replace(r, n, &s, &olds, &news, count, out);
    }
    case F_REVERSE: {
        const tlist *items;
        if (v_iter(r, n, v, &items)) return -1;
        tval *rev = rvals(r, n, (size_t)items->n);
        if (!rev) return -1;
        size_t len = 0;
        for (int i = 0; i < items->n; i++) rev[i] = items->v[items->n - 1 - i], len += rev[i].len;
        if (v->kind != V_STR) return mklist(r, n, rev, items->n, 0, out);
        char *str = rstr(r, n, len);
        if (!str) return -1;
        size_t o = 0;
        for (int i = 0; i < items->n; i++) memcpy(str + o, rev[i].s, rev[i].len), o += rev[i].len;
        *out = v_str(str, len);
        return 0;
    }
    case F_SAFE: *out = *v; return 0;
    case F_STRING: return to_str(r, n, v, out);
    case F_TOJSON: {
        const tval *ind = ca_get(ca, 0, "indent");
        int64_t indent = -1;
        if (ind && ind->kind != V_NONE) {
            if (want_int(r, n, ind, "indent", &indent)) return -1;
            if (indent < 0) indent = 0;
            if (indent > 64) indent = 64;
        }
        ks_buf b = KS_BUF_TRY;
        int rc = write_json(r, n, &b, v, (int)indent, 0);
        if (!rc && b.failed) rc = ks_error_oom(r->d, r->t->name, 0, "chat template render");
        char *str = rc ? NULL : rstr(r, n, b.len);
        if (str) {
            if (b.len) memcpy(str, b.data, b.len);
            *out = v_str(str, b.len);
        }
        ks_buf_free(&b);
        return str ? 0 : -1;
    }
    case F_TRIM:
        if (to_str(r, n, v, &s)) return -1;
        return strip(r, n, &s, ca_get(ca, 0, "chars"), 3, out);
    case F_COUNT_: break;
    }
    return rerr(r, n, "unknown filter");
}

/* ---- arithmetic ---- */

static const char *const bin_names[] = {"+", "-", "*", "/", "//", "%", "**", "~"};

static int repeat(render *r, const node *n, const tval *seq, int64_t times, tval *out)
{
    if (times < 0) times = 0;
    if (seq->kind == V_STR) {
        if (seq->len && (uint64_t)times > TPL_MAX_STR / seq->len)
            return rerr(r, n, "string too long (over %zu bytes)", TPL_MAX_STR);
        size_t len = seq->len * (size_t)times;
        char *s = rstr(r, n, len);
        if (!s) return -1;
        for (int64_t i = 0; i < times; i++) memcpy(s + (size_t)i * seq->len, seq->s, seq->len);
        *out = v_str(s, len);
        return 0;
    }
    int m = seq->list->n;
    if (m && times > TPL_MAX_ITEMS / m) return rerr(r, n, "list too long (over %d items)", TPL_MAX_ITEMS);
    tval *v = rvals(r, n, (size_t)m * (size_t)times);
    if (!v) return -1;
    for (int64_t i = 0; i < times; i++)
        if (m) memcpy(v + i * m, seq->list->v, (size_t)m * sizeof *v);
    return mklist(r, n, v, (int)(m * times), seq->list->is_tuple, out);
}

static int binop(render *r, const node *n, int op, const tval *a, const tval *b, tval *out)
{
    if (op == B_CONCAT) {
        tval sa, sb;
        return to_str(r, n, a, &sa) || to_str(r, n, b, &sb) || concat(r, n, &sa, &sb, out) ? -1 : 0;
    }
    if (a->kind == V_UNDEF) return undef_error(r, n, a);
    if (b->kind == V_UNDEF) return undef_error(r, n, b);
    if (is_num(a) && is_num(b)) {
        if (is_intlike(a) && is_intlike(b) && op != B_DIV) {
            int64_t x = as_int(a), y = as_int(b), z = 0;
            int of = 0;
            switch (op) {
            case B_ADD: of = __builtin_add_overflow(x, y, &z); break;
            case B_SUB: of = __builtin_sub_overflow(x, y, &z); break;
            case B_MUL: of = __builtin_mul_overflow(x, y, &z); break;
            case B_FLOORDIV: case B_MOD:
                if (y == 0) return rerr(r, n, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) {
                    of = op == B_FLOORDIV;
                    z = 0;
                    break;
                }
                z = op == B_FLOORDIV ? x / y : x % y;
                if (op == B_FLOORDIV && (x % y != 0) && ((x < 0) != (y < 0))) z--;
                if (op == B_MOD && z != 0 && ((z < 0) != (y < 0))) z += y;
                break;
            case B_POW:
                if (y < 0) {
                    if (x == 0) return rerr(r, n, "0.0 cannot be raised to a negative power");
                    *out = v_float(pow((double)x, (double)y));
                    return 0;
                }
                z = 1;
                for (int64_t k = 0; k < y && !of; k++) {
                    of = __builtin_mul_overflow(z, x, &z);
                    if (z == 0 || z == 1 || (z == -1 && x == -1)) {
                        if (x == -1) z = (y % 2) ? -1 : 1;
                        break;
                    }
                }
                break;
            }
            if (of) return rerr(r, n, "integer overflow in '%s'", bin_names[op]);
            *out = v_int(z);
            return 0;
        }
        double x = as_float(a), y = as_float(b), z = 0;
        switch (op) {
        case B_ADD: z = x + y; break;
        case B_SUB: z = x - y; break;
        case B_MUL: z = x * y; break;
        case B_DIV:
            if (y == 0) return rerr(r, n, "division by zero");
            z = x / y;
            break;
        case B_FLOORDIV: case B_MOD:
            if (y == 0) return rerr(r, n, "float %s by zero", op == B_MOD ? "modulo" : "floor division");
            z = fmod(x, y);
            if (z != 0 && ((z < 0) != (y < 0))) z += y;
            if (op == B_FLOORDIV) z = floor((x - z) / y + 0.5) == (x - z) / y ? (x - z) / y : floor(x / y);
            break;
        case B_POW:
            if (x == 0 && y < 0) return rerr(r, n, "0.0 cannot be raised to a negative power");
            z = pow(x, y);
            break;
        }
        *out = v_float(z);
        return 0;
    }
    if (op == B_ADD && a->kind == V_STR && b->kind == V_STR) return concat(r, n, a, b, out);
    if (op == B_ADD && a->kind == V_LIST && b->kind == V_LIST && a->list->is_tuple == b->list->is_tuple) {
        int m = a->list->n, k = b->list->n;
        if (m + (int64_t)k > TPL_MAX_ITEMS) return rerr(r, n, "list too long (over %d items)", TPL_MAX_ITEMS);
        tval *v = rvals(r, n, (size_t)(m + k));
        if (!v) return -1;
        if (m) memcpy(v, a->list->v, (size_t)m * sizeof *v);
        if (k) memcpy(v + m, b->list->v, (size_t)k * sizeof *v);
        return mklist(r, n, v, m + k, a->list->is_tuple, out);
    }
    if (op == B_MUL && (a->kind == V_STR || a->kind == V_LIST) && is_intlike(b)) return repeat(r, n, a, as_int(b), out);
    if (op == B_MUL && (b->kind == V_STR || b->kind == V_LIST) && is_intlike(a)) return repeat(r, n, b, as_int(a), out);
    return rerr(r, n, "unsupported operand type(s) for %s: '%s' and '%s'", bin_names[op], type_name(a), type_name(b));
}

/* ---- expressions ---- */

static int eval(render *r, const node *n, tval *out);

static int eval_args(render *r, const node *n, callargs *ca)
{
    tval *pos = n->n_args ? rvals(r, n, (size_t)n->n_args) : NULL, *kw = n->n_kw ? rvals(r, n, (size_t)n->n_kw) : NULL;
    if ((n->n_args && !pos) || (n->n_kw && !kw)) return -1;
    for (int i = 0; i < n->n_args; i++)
        if (eval(r, n->args[i], &pos[i])) return -1;
    for (int i = 0; i < n->n_kw; i++)
        if (eval(r, n->kw[i], &kw[i])) return -1;
    *ca = (callargs){pos, n->n_args, n->kw_names, kw, n->n_kw};
    return 0;
}

static int eval_list(render *r, const node *n, tval *out)
{
    tval *v = n->n_args ? rvals(r, n, (size_t)n->n_args) : NULL;
    if (n->n_args && !v) return -1;
    for (int i = 0; i < n->n_args; i++)
        if (eval(r, n->args[i], &v[i])) return -1;
    return mklist(r, n, v, n->n_args, n->kind == E_TUPLE, out);
}

static int eval(render *r, const node *n, tval *out)
{
    tval a, b, c;
    if (++r->steps > TPL_MAX_STEPS) return rerr(r, n, "template too expensive (over %ld steps)", TPL_MAX_STEPS);
    switch (n->kind) {
    case E_CONST: *out = n->k; return 0;
    case E_NAME: {
        const tval *v = frame_get(r, n->name);
        if (v) {
            *out = *v;
            return 0;
        }
        int id = lookup_name(func_names, G_COUNT_, n->name, strlen(n->name));
        if (id >= 0)
            *out = (tval){.kind = V_FUNC, .i = id};
        else
            *out = undef_named(r, "'%.*s' is undefined", n->name, strlen(n->name));
        return 0;
    }
    case E_ATTR:
        if (eval(r, n->a, &a)) return -1;
        if (a.kind == V_UNDEF) return undef_error(r, n->a, &a); /* at the undefined thing */
        return get_attr(r, n, &a, n->name, out);
    case E_ITEM:
        if (eval(r, n->a, &a) || eval(r, n->b, &b)) return -1;
        if (a.kind == V_UNDEF) return undef_error(r, n->a, &a);
        return get_item(r, n, &a, &b, out);
    case E_SLICE: {
        tval parts[3] = {v_none(), v_none(), v_none()};
        const node *pn[3] = {n->b, n->c, n->d};
        if (eval(r, n->a, &a)) return -1;
        for (int k = 0; k < 3; k++)
            if (pn[k] && eval(r, pn[k], &parts[k])) return -1;
        return get_slice(r, n, &a, &parts[0], &parts[1], &parts[2], out);
    }
    case E_CALL: {
        callargs ca;
        if (eval(r, n->a, &a) || eval_args(r, n, &ca)) return -1;
        const node *at = n->a;
        if (a.kind == V_FUNC) return call_func(r, at, (int)a.i, &ca, out);
        if (a.kind == V_METHOD) return call_method(r, at, &a, &ca, out);
        if (a.kind == V_UNDEF) return undef_error(r, at, &a);
        return rerr(r, at, "'%s' object is not callable", type_name(&a));
    }
    case E_FILTER: {
        callargs ca;
        if (eval(r, n->a, &a) || eval_args(r, n, &ca)) return -1;
        return apply_filter(r, n, n->op, &a, &ca, out);
    }
    case E_TEST: {
        callargs ca;
        int res;
        if (eval(r, n->a, &a) || eval_args(r, n, &ca) || apply_test(r, n, n->op, &a, ca.pos, ca.n, &res)) return -1;
        *out = v_bool(n->neg ? !res : res);
        return 0;
    }
    case E_BIN: return eval(r, n->a, &a) || eval(r, n->b, &b) || binop(r, n, n->op, &a, &b, out) ? -1 : 0;
    case E_NEG: case E_POS:
        if (eval(r, n->a, &a)) return -1;
        if (a.kind == V_UNDEF) return undef_error(r, n, &a);
        if (!is_num(&a)) return rerr(r, n, "bad operand type for unary %c: '%s'", n->kind == E_NEG ? '-' : '+', type_name(&a));
        if (n->kind == E_POS) *out = a.kind == V_BOOL ? v_int(a.b) : a;
        else if (a.kind == V_FLOAT) *out = v_float(-a.f);
        else if (as_int(&a) == INT64_MIN) return rerr(r, n, "integer overflow in '-'");
        else *out = v_int(-as_int(&a));
        return 0;
    case E_NOT:
        if (eval(r, n->a, &a)) return -1;
        *out = v_bool(!truthy(&a));
        return 0;
    case E_AND: case E_OR:
        if (eval(r, n->a, &a)) return -1;
        if (truthy(&a) == (n->kind == E_OR)) {
            *out = a;
            return 0;
        }
        return eval(r, n->b, out);
    case E_COND:
        if (eval(r, n->a, &c)) return -1;
        if (truthy(&c)) return eval(r, n->b, out);
        if (n->c) return eval(r, n->c, out);
        *out = V_UNDEFINED;
        return 0;
    case E_COMPARE: {
        if (eval(r, n->a, &a)) return -1;
        static const char *const cmp_names[] = {"==", "!=", "<", ">", "<=", ">=", "in", "not in"};
        for (int i = 0; i < n->n_args; i++) {
            int op = n->cmp_ops[i], res, cv = 0;
            if (eval(r, n->args[i], &b)) return -1;
            if (op == C_EQ || op == C_NE) {
                res = v_eq(&a, &b) == (op == C_EQ);
            } else if (op == C_IN || op == C_NOTIN) {
                if (v_in(r, n->args[i], &a, &b, &res)) return -1;
                if (op == C_NOTIN) res = !res;
            } else {
                if (v_cmp(r, n->args[i], cmp_names[op], &a, &b, &cv)) return -1;
                res = op == C_LT ? cv == -1 : op == C_GT ? cv == 1 : op == C_LE ? cv == -1 || cv == 0 : cv == 1 || cv == 0;
            }
            if (!res) {
                *out = v_bool(0);
                return 0;
            }
            a = b;
        }
        *out = v_bool(1);
        return 0;
    }
    case E_LIST: case E_TUPLE: return eval_list(r, n, out);
    case E_DICT: {
        tdict *d = ralloc(r, sizeof *d);
        if (!d) return -1;
        for (int i = 0; i + 1 < n->n_args; i += 2) {
            if (eval(r, n->args[i], &a) || eval(r, n->args[i + 1], &b)) return -1;
            if (a.kind == V_LIST && !a.list->is_tuple) return rerr(r, n->args[i], "unhashable type: 'list'");
            if (a.kind == V_DICT || a.kind == V_NS) return rerr(r, n->args[i], "unhashable type: 'dict'");
            if (dict_set(r, d, a, b)) return -1;
        }
        *out = (tval){.kind = V_DICT, .dict = d};
        return 0;
    }
    default: return rerr(r, n, "not an expression");
    }
}

/* ---- statements ---- */

enum { EXEC_OK = 0, EXEC_BREAK = 1, EXEC_CONTINUE = 2 }; /* or -1: an error was reported */

static int exec_body(render *r, node *const *body, int n);

/* Bind names[0..k) to v: one name takes it whole, several unpack it. */
static int assign(render *r, const node *n, frame *f, const char *const *names, int k, const tval *v)
{
    if (k == 1) return frame_set(r, f, names[0], *v);
    const tlist *items;
    if (v->kind == V_UNDEF) return undef_error(r, n, v);
    if (v_iter(r, n, v, &items)) return -1;
    if (items->n != k)
        return rerr(r, n, "%s values to unpack (expected %d, got %d)", items->n > k ? "too many" : "not enough", k,
                    items->n);
    for (int i = 0; i < k; i++)
        if (frame_set(r, f, names[i], items->v[i])) return -1;
    return 0;
}

static int exec_for(render *r, const node *n)
{
    tval seq;
    const tlist *items;
    if (eval(r, n->a, &seq) || v_iter(r, n->a, &seq, &items)) return -1;
    frame f = {.up = r->top};
    if (n->b) { /* the loop's `if` filters first, so that loop.length and loop.last count what is left */
        tval *kept = rvals(r, n, (size_t)items->n);
        if (!kept) return -1;
        int k = 0;
        r->top = &f;
        for (int i = 0; i < items->n; i++) {
            tval c;
            f.n = 0;
            if (assign(r, n, &f, n->names, n->n_names, &items->v[i]) || eval(r, n->b, &c)) {
                r->top = f.up;
                return -1;
            }
            if (truthy(&c)) kept[k++] = items->v[i];
        }
        r->top = f.up;
        tval lv;
        if (mklist(r, n, kept, k, 0, &lv)) return -1;
        items = lv.list;
    }
    if (!items->n) return exec_body(r, n->alt, n->n_alt) < 0 ? -1 : EXEC_OK;
    tloop *loop = ralloc(r, sizeof *loop);
    if (!loop) return -1;
    loop->items = items;
    r->top = &f;
    int rc = 0;
    for (int i = 0; i < items->n; i++) {
        f.n = 0; /* a fresh scope each time round: what the body sets does not outlive the iteration */
        loop->index0 = i;
        if (assign(r, n, &f, n->names, n->n_names, &items->v[i]) ||
            frame_set(r, &f, "loop", (tval){.kind = V_LOOP, .loop = loop})) {
            rc = -1;
            break;
        }
        rc = exec_body(r, n->args, n->n_args);
        if (rc < 0 || rc == EXEC_BREAK) break;
        rc = 0;
    }
    r->top = f.up;
    return rc < 0 ? -1 : EXEC_OK;
}

static int emit(render *r, const node *n, const tval *v)
{
    tval s;
    if (to_str(r, n, v, &s)) return -1;
    ks_buf_put(&r->out, s.s, s.len);
    if (r->out.failed) return ks_error_oom(r->d, r->t->name, r->out.failed, "chat template output");
    if (r->out.len > TPL_MAX_STR) return rerr(r, n, "output too long (over %zu bytes)", TPL_MAX_STR);
    return 0;
}

static int exec_stmt(render *r, const node *n)
{
    tval v;
    if (++r->steps > TPL_MAX_STEPS) return rerr(r, n, "template too expensive (over %ld steps)", TPL_MAX_STEPS);
    switch (n->kind) {
    case N_TEXT: return emit(r, n, &n->k);
    case N_OUTPUT: return eval(r, n->a, &v) || emit(r, n, &v) ? -1 : 0;
    case N_IF:
        if (eval(r, n->a, &v)) return -1;
        return truthy(&v) ? exec_body(r, n->args, n->n_args) : exec_body(r, n->alt, n->n_alt);
    case N_FOR: return exec_for(r, n);
    case N_SET:
        if (eval(r, n->a, &v)) return -1;
        if (n->name) { /* ns.attr = v */
            const tval *ns = frame_get(r, n->names[0]);
            if (!ns || ns->kind != V_NS)
                return rerr(r, n, "cannot assign attribute on non-namespace object ('%s')", n->names[0]);
            return dict_set(r, ns->dict, v_str(n->name, strlen(n->name)), v);
        }
        return assign(r, n, r->top, n->names, n->n_names, &v);
    case N_SETBLK: {
        size_t start = r->out.len;
        int rc = exec_body(r, n->args, n->n_args);
        if (rc) return rc;
        char *s = rstr(r, n, r->out.len - start);
        if (!s) return -1;
        size_t len = r->out.len - start;
        if (len) memcpy(s, r->out.data + start, len);
        r->out.len = start;
        return frame_set(r, r->top, n->names[0], v_str(s, len));
    }
    case N_BREAK: return EXEC_BREAK;
    case N_CONTINUE: return EXEC_CONTINUE;
    case N_BLOCK: return exec_body(r, n->args, n->n_args);
    default: return rerr(r, n, "not a statement");
    }
}

static int exec_body(render *r, node *const *body, int n)
{
    for (int i = 0; i < n; i++) {
        int rc = exec_stmt(r, body[i]);
        if (rc) return rc;
    }
    return 0;
}

int ksv_tpl_render(const ksv_tpl *t, const ksv_tpl_message *msgs, int n_msgs, const ksv_tpl_vars *vars,
                   ks_buf *out, ks_diag *d)
{
    render r = {.t = t, .d = d, .out = KS_BUF_TRY};
    r.a.fallible = 1;
    frame root = {0};
    r.top = &root;
    int rc = -1;
    const char *bos = vars && vars->bos_token ? vars->bos_token : "";
    const char *eos = vars && vars->eos_token ? vars->eos_token : "";
    node at = {.line = 1, .col = 1};
    tval *items = n_msgs > 0 ? rvals(&r, &at, (size_t)n_msgs) : NULL, list;
    if (n_msgs > 0 && !items) goto done;
    for (int i = 0; i < n_msgs; i++) {
        tdict *m = ralloc(&r, sizeof *m);
        if (!m) goto done;
        const char *role = msgs[i].role ? msgs[i].role : "";
        tval content = msgs[i].content ? v_str(msgs[i].content, strlen(msgs[i].content)) : v_none();
        if (dict_set(&r, m, v_str("role", 4), v_str(role, strlen(role))) ||
            dict_set(&r, m, v_str("content", 7), content))
            goto done;
        items[i] = (tval){.kind = V_DICT, .dict = m};
    }
    if (mklist(&r, &at, items, n_msgs > 0 ? n_msgs : 0, 0, &list) || frame_set(&r, &root, "messages", list) ||
        frame_set(&r, &root, "tools", v_none()) || frame_set(&r, &root, "documents", v_none()) ||
        frame_set(&r, &root, "add_generation_prompt", v_bool(vars && vars->add_generation_prompt)) ||
        frame_set(&r, &root, "bos_token", v_str(bos, strlen(bos))) ||
        frame_set(&r, &root, "eos_token", v_str(eos, strlen(eos))))
        goto done;
    if (exec_body(&r, t->body, t->n_body) < 0) goto done;
    if (ks_buf_put(out, r.out.data ? r.out.data : "", r.out.len) < 0) {
        ks_error_oom(d, t->name, r.out.len, "chat template output");
        goto done;
    }
    rc = 0;
done:
    ks_buf_free(&r.out);
    ks_arena_free(&r.a);
    return rc;
}
