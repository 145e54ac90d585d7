/*
 * parse.c — the IR's text form, read back (kir_parse): a hand-written lexer
 * and recursive-descent parser over what ir/print.c writes.
 *
 * Grammar (one statement per line; `#` starts a comment; spaces, tabs, CRs
 * and blank lines are free):
 *
 *     file      := 'kiln-ir' INT NL  statement*
 *     statement := 'graph' STRING
 *                | 'param' name '=' (scalar | '[' [INT {',' INT}] ']')
 *                | VALUE ':' type '=' IDENT '(' [operand {',' operand}] ')'
 *                      ['{' [attr {',' attr} [',']] '}'] ['@' STRING ':' INT ':' INT]
 *     type      := IDENT '[' [dim {',' dim}] ']'        dim := INT | 'T'
 *     operand   := VALUE | '_'
 *     attr      := name '=' (scalar | '[' [dim {',' dim}] ']')
 *     scalar    := INT | FLOAT | 'inf' | 'nan' | STRING
 *     name      := IDENT | STRING
 *
 * VALUE is `%` followed by letters, digits, `_`, `.` or `-` (`%17`, `%q_proj`):
 * values may have any names, in any order of numbering; they become dense
 * indices in order of definition. A number is a FLOAT when it has a `.` or
 * an exponent, else a 64-bit INT.
 *
 * Errors are reported at file:line:col with the line and a caret (through
 * ks_error_at). A syntax error abandons the rest of its line, and parsing
 * resumes at the next line, so one run reports the errors of many lines; a
 * semantic error (unknown op or dtype, undefined or redefined value) lets the
 * line finish. Any error makes kir_parse return NULL. The parser checks the
 * text, not the graph: arities, attributes and types are kir_verify's job.
 *
 * Out of memory is an error too (the runtime parses an engine's graph at
 * open): every allocation is checked, the first that fails stops the parse
 * (the lexer reads end of input from then on, and no more errors are
 * reported), and kir_parse reports `name: error: out of memory (...)` and
 * returns NULL. The graph is built fallible (kir_graph_try_new) and handed
 * back as an ordinary one.
 *
 * Everything lives in one `kir_parser` passed down the calls: two parses may
 * run at once (jq's reentrant scanner). Its scratch arena holds decoded
 * strings and names for the length of one parse.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

/* After this many errors the parse stops: the rest is noise. */
enum { KIR_PARSE_MAX_ERRORS = 50 };
/* How much of a token a message quotes. */
enum { TOKEN_QUOTE_MAX = 32 };
/* The graph's own limits (ir/ir.c dies past them, as it should for a
 * builder's bug); text from a user is held to them with a message. */
enum {
    KIR_PARSE_MAX_NODES = 1 << 22,
    KIR_PARSE_MAX_FILES = 1 << 16,
    KIR_PARSE_MAX_PARAMS = 1 << 16,
    KIR_PARSE_MAX_ATTRS = 1 << 10,
};

/* ---- tokens ------------------------------------------------------------------ */
typedef enum kir_tok_kind {
    TOK_EOF,     /* end of the text */
    TOK_NEWLINE, /* end of a line: ends a statement */
    TOK_IDENT,   /* [A-Za-z_][A-Za-z0-9_.-]*: keywords, ops, dtypes, names, T, _ */
    TOK_VALUE,   /* %name */
    TOK_INT,     /* integer literal; value in i */
    TOK_FLOAT,   /* float literal (or -inf); value in f */
    TOK_STRING,  /* "..." decoded into s */
    TOK_PUNCT,   /* one of ( ) [ ] { } , = : @; the character in punct */
    TOK_ERROR,   /* a lexical error, already reported */
} kir_tok_kind;

typedef struct kir_token {
    kir_tok_kind kind;  /* what it is */
    const char *start;  /* first byte in the source text */
    size_t len;         /* bytes in the source text */
    int line;           /* 1-based line of start */
    int col;            /* 1-based byte column of start */
    int64_t i;          /* TOK_INT: the value */
    double f;           /* TOK_FLOAT: the value */
    const char *s;      /* TOK_STRING: decoded text, in the scratch arena */
    char punct;         /* TOK_PUNCT: the character */
} kir_token;

/* ---- names -------------------------------------------------------------------
 * Hash maps (ks_hmap) of the names seen so far to their definitions: values
 * (without the `%`) to their dense index, or to VAL_POISONED when their line
 * had an error (later uses then stay quiet instead of cascading); and params,
 * to catch a param defined twice without a search per line. */
#define VAL_POISONED (KIR_NONE - 1)

/* Where a name was defined, in the scratch arena; the name maps to its address. */
typedef struct kir_name_def {
    kir_val index; /* values: dense index or VAL_POISONED; params: unused */
    int line;      /* where it was defined */
    int col;       /* column of its definition */
} kir_name_def;

/* An attribute of the node being parsed, before it joins the graph. */
typedef struct kir_pending_attr {
    const char *key;     /* in the scratch arena */
    kir_attr_kind kind;  /* which member holds the value */
    int64_t i;           /* KIR_ATTR_INT */
    double f;            /* KIR_ATTR_FLOAT */
    const char *s;       /* KIR_ATTR_STR, scratch arena */
    const int64_t *v;    /* KIR_ATTR_INTS, scratch arena */
    const double *fv;    /* KIR_ATTR_FLOATS, scratch arena */
    uint32_t n;          /* KIR_ATTR_INTS, KIR_ATTR_FLOATS count */
} kir_pending_attr;

typedef struct kir_parser {
    const ks_source *src;      /* the text and its name for messages */
    ks_diag *d;                /* where errors go */
    const char *cur;           /* next byte to lex */
    const char *end;           /* one past the last byte */
    const char *line_start;    /* first byte of the line holding cur */
    int line;                  /* 1-based line of cur */
    kir_token tok;             /* the lookahead token */
    int errors;                /* errors this parse reported */
    int gave_up;               /* set after KIR_PARSE_MAX_ERRORS */
    size_t oom;                /* 0, or the bytes an allocation could not get (1 when not known): the
                                  parse stops */
    ks_arena scratch;          /* decoded strings, names, lists: this parse's lifetime */
    ks_buf sbuf;               /* reused while decoding a string */
    kir_graph *g;              /* the graph being built */
    int saw_graph;             /* a `graph` line was read */
    ks_hmap values;            /* value names defined so far -> their kir_name_def */
    ks_hmap params;            /* param names defined so far -> their kir_name_def */
    kir_pending_attr *attrs;   /* the current node's attributes */
    size_t cap_attrs;          /* capacity of attrs */
    int64_t *ints;             /* the list being read */
    size_t cap_ints;           /* capacity of ints */
    double *floats;            /* a list's items as floats, while it is read */
    size_t cap_floats;         /* capacity of floats */
} kir_parser;

/* ---- errors ------------------------------------------------------------------ */
KS_PRINTF(4, 5)
static void error_at(kir_parser *p, int line, int col, const char *fmt, ...)
{
    if (p->gave_up || p->oom) return; /* out of memory, the rest is noise too */
    va_list ap;
    va_start(ap, fmt);
    ks_verror_at(p->d, p->src, line, col, fmt, ap);
    va_end(ap);
    if (++p->errors == KIR_PARSE_MAX_ERRORS) {
        ks_error(p->d, p->src->name ? p->src->name : "<input>", "too many errors; stopping here");
        p->gave_up = 1;
    }
}

#define error_tok(p, t, ...) error_at((p), (t)->line, (t)->col, __VA_ARGS__)

/* Out of memory (bytes the allocation asked for; 1 when not known): the parse stops. Returns -1. */
static int nomem(kir_parser *p, size_t bytes)
{
    if (!p->oom) p->oom = bytes ? bytes : 1;
    return -1;
}

/* s from the scratch arena, or "" when it could not be had (the parse stops):
 * for the text of messages. */
static const char *msg_str(kir_parser *p, const char *s)
{
    if (s) return s;
    nomem(p, p->scratch.failed);
    return "";
}

/* The token as a message quotes it: 'add', '%5', end of line. */
static const char *describe(kir_parser *p, const kir_token *t)
{
    switch (t->kind) {
    case TOK_EOF: return "end of input";
    case TOK_NEWLINE: return "end of line";
    default: break;
    }
    if (t->len > TOKEN_QUOTE_MAX)
        return msg_str(p, ks_arena_printf(&p->scratch, "'%.*s...'", TOKEN_QUOTE_MAX, t->start));
    return msg_str(p, ks_arena_printf(&p->scratch, "'%.*s'", (int)t->len, t->start));
}

/* A syntax error at the lookahead: "expected WHAT, found TOKEN". Quiet when
 * the lookahead is a lexical error, which the lexer reported already. */
static int expected(kir_parser *p, const char *what)
{
    if (p->tok.kind != TOK_ERROR)
        error_tok(p, &p->tok, "expected %s, found %s", what, describe(p, &p->tok));
    return -1;
}

/* ---- lexer ------------------------------------------------------------------- */
static int is_ident_start(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int is_digit(int c) { return c >= '0' && c <= '9'; }
static int is_ident_char(int c) { return is_ident_start(c) || is_digit(c) || c == '.' || c == '-'; }
static int hex_value(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int tok_is(const kir_token *t, const char *word)
{
    return t->kind == TOK_IDENT && t->len == strlen(word) && memcmp(t->start, word, t->len) == 0;
}
static int tok_punct(const kir_token *t, char c) { return t->kind == TOK_PUNCT && t->punct == c; }

/* Lex a string; cur is past the opening quote. A string ends on its line. */
static void lex_string(kir_parser *p, kir_token *t)
{
    ks_buf_clear(&p->sbuf);
    for (;;) {
        if (p->cur >= p->end || *p->cur == '\n') {
            error_tok(p, t, "unterminated string");
            t->kind = TOK_ERROR;
            return;
        }
        unsigned char c = (unsigned char)*p->cur;
        if (c == '"') {
            p->cur++;
            break;
        }
        if (c == '\\') {
            const char *esc = p->cur;
            int ecol = (int)(esc - p->line_start) + 1;
            char e = esc + 1 < p->end ? esc[1] : 0;
            int ch = -1;
            size_t elen = 2;
            switch (e) {
            case '"': ch = '"'; break;
            case '\\': ch = '\\'; break;
            case 'n': ch = '\n'; break;
            case 't': ch = '\t'; break;
            case 'r': ch = '\r'; break;
            case 'x':
                if (esc + 3 < p->end && hex_value(esc[2]) >= 0 && hex_value(esc[3]) >= 0) {
                    ch = hex_value(esc[2]) * 16 + hex_value(esc[3]);
                    elen = 4;
                }
                break;
            default: break;
            }
            if (ch <= 0) {
                if (ch == 0)
                    error_at(p, p->line, ecol, "a string cannot hold \\x00");
                else if (e == 'x')
                    error_at(p, p->line, ecol, "bad escape in string: \\x needs two hex digits");
                else if (e == '\n' || e == 0 || (unsigned char)e < 0x20 || (unsigned char)e >= 0x7f)
                    error_at(p, p->line, ecol, "bad escape in string");
                else
                    error_at(p, p->line, ecol, "bad escape '\\%c' in string", e);
                /* Leave cur before the end of the line so recovery finds it. */
                while (p->cur < p->end && *p->cur != '\n') p->cur++;
                t->kind = TOK_ERROR;
                return;
            }
            char chc = (char)ch;
            ks_buf_put(&p->sbuf, &chc, 1);
            p->cur += elen;
            continue;
        }
        if (c < 0x20 && c != '\t') {
            error_at(p, p->line, (int)(p->cur - p->line_start) + 1,
                     "control byte 0x%02x in a string (write it as \\x%02x)", c, c);
            while (p->cur < p->end && *p->cur != '\n') p->cur++;
            t->kind = TOK_ERROR;
            return;
        }
        ks_buf_put(&p->sbuf, p->cur, 1);
        p->cur++;
    }
    t->kind = TOK_STRING;
    t->s = p->sbuf.failed ? NULL : ks_arena_strndup(&p->scratch, ks_buf_cstr(&p->sbuf), p->sbuf.len);
    if (!t->s) {
        nomem(p, p->sbuf.failed ? p->sbuf.failed : p->scratch.failed);
        t->kind = TOK_ERROR;
    }
}

/* Lex a number; cur is at its first byte (a digit, or '-' before one). */
static void lex_number(kir_parser *p, kir_token *t)
{
    const char *s = p->cur, *q = s;
    int is_float = 0;
    if (*q == '-') q++;
    while (q < p->end && is_digit(*q)) q++;
    if (q < p->end && *q == '.') {
        is_float = 1;
        q++;
        while (q < p->end && is_digit(*q)) q++;
    }
    if (q < p->end && (*q == 'e' || *q == 'E')) {
        const char *e = q + 1;
        if (e < p->end && (*e == '+' || *e == '-')) e++;
        if (e < p->end && is_digit(*e)) {
            is_float = 1;
            q = e;
            while (q < p->end && is_digit(*q)) q++;
        }
    }
    int bad = 0;
    while (q < p->end && is_ident_char(*q)) { /* 12abc, 1e, 0x1f, 1.2.3 */
        q++;
        bad = 1;
    }
    p->cur = q;
    t->len = (size_t)(q - s);
    if (bad) {
        error_tok(p, t, "bad number '%.*s'", (int)t->len, s);
        t->kind = TOK_ERROR;
        return;
    }
    char *text = ks_arena_strndup(&p->scratch, s, t->len);
    if (!text) {
        nomem(p, p->scratch.failed);
        t->kind = TOK_ERROR;
        return;
    }
    errno = 0;
    if (is_float) {
        t->kind = TOK_FLOAT;
        t->f = strtod(text, NULL);
        if (errno == ERANGE && isinf(t->f)) {
            error_tok(p, t, "bad number '%s': too large for a double", text);
            t->kind = TOK_ERROR;
        }
    } else {
        t->kind = TOK_INT;
        long long v = strtoll(text, NULL, 10);
        if (errno == ERANGE) {
            error_tok(p, t, "bad number '%s': out of range for a 64-bit integer", text);
            t->kind = TOK_ERROR;
        }
        t->i = v;
    }
}

/* Read the next token into p->tok. */
static void lex(kir_parser *p)
{
    kir_token *t = &p->tok;
    memset(t, 0, sizeof *t);
    for (;;) {
        while (p->cur < p->end && (*p->cur == ' ' || *p->cur == '\t' || *p->cur == '\r' ||
                                   *p->cur == '\v' || *p->cur == '\f'))
            p->cur++;
        if (p->cur < p->end && *p->cur == '#') {
            while (p->cur < p->end && *p->cur != '\n') p->cur++;
            continue;
        }
        break;
    }
    t->start = p->cur;
    t->line = p->line;
    t->col = (int)(p->cur - p->line_start) + 1;
    if (p->cur >= p->end || p->oom) { /* out of memory: the parse ends here */
        t->kind = TOK_EOF;
        return;
    }
    unsigned char c = (unsigned char)*p->cur;
    if (c == '\n') {
        t->kind = TOK_NEWLINE;
        t->len = 1;
        p->cur++;
        p->line++;
        p->line_start = p->cur;
        return;
    }
    if (is_ident_start(c)) {
        const char *q = p->cur + 1;
        while (q < p->end && is_ident_char(*q)) q++;
        t->kind = TOK_IDENT;
        t->len = (size_t)(q - p->cur);
        p->cur = q;
        return;
    }
    if (c == '%') {
        const char *q = p->cur + 1;
        while (q < p->end && is_ident_char(*q)) q++;
        t->len = (size_t)(q - p->cur);
        p->cur = q;
        if (t->len == 1) {
            error_tok(p, t, "expected a value name after '%%'");
            t->kind = TOK_ERROR;
            return;
        }
        t->kind = TOK_VALUE;
        return;
    }
    if (is_digit(c) || (c == '-' && p->cur + 1 < p->end && is_digit(p->cur[1]))) {
        lex_number(p, t);
        return;
    }
    if (c == '-' && p->end - p->cur >= 4 && memcmp(p->cur, "-inf", 4) == 0 &&
        (p->end - p->cur == 4 || !is_ident_char(p->cur[4]))) {
        t->kind = TOK_FLOAT;
        t->f = -INFINITY;
        t->len = 4;
        p->cur += 4;
        return;
    }
    if (c == '"') {
        p->cur++;
        lex_string(p, t);
        t->len = (size_t)(p->cur - t->start);
        return;
    }
    p->cur++;
    t->len = 1;
    if (strchr("()[]{},=:@", c) && c) {
        t->kind = TOK_PUNCT;
        t->punct = (char)c;
        return;
    }
    if (c >= 0x20 && c < 0x7f)
        error_tok(p, t, "unexpected character '%c'", c);
    else
        error_tok(p, t, "unexpected byte 0x%02x", c);
    t->kind = TOK_ERROR;
}

/* After a syntax error: drop the rest of the line and lex the next one. */
static void recover(kir_parser *p)
{
    if (p->tok.kind == TOK_EOF) return;
    if (p->tok.kind != TOK_NEWLINE) {
        while (p->cur < p->end && *p->cur != '\n') p->cur++;
        lex(p);
        if (p->tok.kind == TOK_EOF) return;
    }
    lex(p); /* past the newline */
}

/* Expect punctuation c; on a mismatch report "expected WHAT". */
static int expect_punct(kir_parser *p, char c, const char *what)
{
    if (!tok_punct(&p->tok, c)) return expected(p, what);
    lex(p);
    return 0;
}

/* A statement ends at the end of its line (or of the text). */
static int expect_end(kir_parser *p, const char *after)
{
    if (p->tok.kind == TOK_NEWLINE) {
        lex(p);
        return 0;
    }
    if (p->tok.kind == TOK_EOF) return 0;
    return expected(p, msg_str(p, ks_arena_printf(&p->scratch, "end of line after %s", after)));
}

/* ---- name tables ---------------------------------------------------------------- */
static kir_name_def *name_find(const ks_hmap *t, const char *name, size_t len)
{
    const uint64_t *def = ks_hmap_get_str(t, name, len);
    return def ? (kir_name_def *)(uintptr_t)*def : NULL;
}

/* Add name (not in t yet), defined at line:col, copying it to the scratch arena.
 * Out of memory stops the parse. */
static void name_define(kir_parser *p, ks_hmap *t, const char *name, size_t len, kir_val index, int line, int col)
{
    kir_name_def *def = ks_arena_alloc(&p->scratch, sizeof *def);
    const char *copy = def ? ks_arena_strndup(&p->scratch, name, len) : NULL;
    if (!copy) {
        nomem(p, p->scratch.failed);
        return;
    }
    *def = (kir_name_def){index, line, col};
    int added;
    uint64_t *slot = ks_hmap_put_str(t, copy, len, &added);
    if (!slot) {
        nomem(p, 0);
        return;
    }
    KS_ASSERT(added);
    *slot = (uintptr_t)def;
}

/* The definition of the value a VALUE token names, or NULL. */
static kir_name_def *value_find(kir_parser *p, const kir_token *t)
{
    return name_find(&p->values, t->start + 1, t->len - 1);
}

static void value_define(kir_parser *p, const kir_token *t, kir_val index)
{
    name_define(p, &p->values, t->start + 1, t->len - 1, index, t->line, t->col);
}

/* ---- statements ------------------------------------------------------------------ */

/* A name: an identifier or a quoted string. NULL (reported) if neither. */
static const char *parse_name(kir_parser *p, const char *what)
{
    const char *name;
    if (p->tok.kind == TOK_IDENT) {
        name = ks_arena_strndup(&p->scratch, p->tok.start, p->tok.len);
        if (!name) {
            nomem(p, p->scratch.failed);
            return NULL;
        }
    } else if (p->tok.kind == TOK_STRING)
        name = p->tok.s;
    else {
        expected(p, what);
        return NULL;
    }
    lex(p);
    return name;
}

/* A scalar: INT, FLOAT, inf, nan or STRING, into an attribute record.
 * Returns 1 if the lookahead is not a scalar (nothing consumed). */
static int parse_scalar(kir_parser *p, kir_pending_attr *a)
{
    const kir_token *t = &p->tok;
    if (t->kind == TOK_INT) {
        a->kind = KIR_ATTR_INT;
        a->i = t->i;
    } else if (t->kind == TOK_FLOAT) {
        a->kind = KIR_ATTR_FLOAT;
        a->f = t->f;
    } else if (tok_is(t, "inf")) {
        a->kind = KIR_ATTR_FLOAT;
        a->f = INFINITY;
    } else if (tok_is(t, "nan")) {
        a->kind = KIR_ATTR_FLOAT;
        a->f = NAN;
    } else if (t->kind == TOK_STRING) {
        a->kind = KIR_ATTR_STR;
        a->s = t->s;
    } else {
        return 1;
    }
    lex(p);
    return 0;
}

/* A dim of a type or list: INT or T. Returns 1 if the lookahead is neither. */
static int parse_dim(kir_parser *p, int64_t *out)
{
    if (p->tok.kind == TOK_INT)
        *out = p->tok.i;
    else if (tok_is(&p->tok, "T"))
        *out = KIR_DIM_T;
    else
        return 1;
    lex(p);
    return 0;
}

/* '[' item {',' item} ']' into a list in the scratch arena: items are dims
 * (integers or T) for an attribute, plain integers for a param (dims 0); a
 * list with a float in it (a number with a point or an exponent, inf, nan)
 * is a list of floats, its integers read as floats. */
static int parse_list(kir_parser *p, kir_pending_attr *a, int dims)
{
    KS_ASSERT(tok_punct(&p->tok, '['));
    lex(p);
    size_t n = 0;
    int floats = 0, dim_t = 0;
    if (!tok_punct(&p->tok, ']')) {
        for (;;) {
            if (KS_TRY_GROW(p->ints, n + 1, p->cap_ints, (size_t)1 << 24) != 0 ||
                KS_TRY_GROW(p->floats, n + 1, p->cap_floats, (size_t)1 << 24) != 0)
                return nomem(p, 0);
            if (p->tok.kind == TOK_FLOAT || tok_is(&p->tok, "inf") || tok_is(&p->tok, "nan")) {
                if (dim_t) return expected(p, "an integer or T in the list of dims");
                kir_pending_attr item = {0};
                (void)parse_scalar(p, &item);
                floats = 1;
                p->floats[n] = item.f;
            } else if (dims) {
                if (floats && tok_is(&p->tok, "T")) return expected(p, "a number in the list of floats");
                if (parse_dim(p, &p->ints[n])) return expected(p, "a number or T in the list");
                dim_t |= p->ints[n] == KIR_DIM_T;
                p->floats[n] = (double)p->ints[n];
            } else {
                if (p->tok.kind != TOK_INT) return expected(p, "a number in the list");
                p->ints[n] = p->tok.i;
                p->floats[n] = (double)p->tok.i;
                lex(p);
            }
            n++;
            if (tok_punct(&p->tok, ']')) break;
            if (expect_punct(p, ',', "',' or ']' in the list")) return -1;
        }
    }
    lex(p);
    if (floats) {
        double *v = ks_arena_alloc(&p->scratch, (n ? n : 1) * sizeof *v);
        if (!v) return nomem(p, p->scratch.failed);
        memcpy(v, p->floats, n * sizeof *v);
        a->kind = KIR_ATTR_FLOATS;
        a->fv = v;
        a->n = (uint32_t)n;
        return 0;
    }
    int64_t *v = ks_arena_alloc(&p->scratch, (n ? n : 1) * sizeof *v);
    if (!v) return nomem(p, p->scratch.failed);
    if (n) memcpy(v, p->ints, n * sizeof *v);
    a->kind = KIR_ATTR_INTS;
    a->v = v;
    a->n = (uint32_t)n;
    return 0;
}

/* 'kiln-ir' INT: the header. */
static int parse_header(kir_parser *p)
{
    lex(p);
    if (p->tok.kind != TOK_INT) return expected(p, "a version number after 'kiln-ir'");
    if (p->tok.i != 1)
        error_tok(p, &p->tok, "unsupported IR version %lld (this kiln reads version 1)",
                  (long long)p->tok.i);
    lex(p);
    return expect_end(p, "the header");
}

/* 'graph' STRING */
static int parse_graph(kir_parser *p)
{
    kir_token kw = p->tok;
    lex(p);
    if (p->tok.kind != TOK_STRING) return expected(p, "the graph's name in quotes");
    if (p->saw_graph)
        error_tok(p, &kw, "the graph is named twice");
    else if (!(p->g->name = ks_arena_strdup(&p->g->arena, p->tok.s)))
        return nomem(p, p->g->arena.failed);
    p->saw_graph = 1;
    lex(p);
    return expect_end(p, "the graph's name");
}

/* 'param' name '=' (scalar | list) */
static int parse_param(kir_parser *p)
{
    lex(p);
    kir_token name_tok = p->tok;
    const char *name = parse_name(p, "a param name");
    if (!name) return -1;
    if (expect_punct(p, '=', "'=' after the param name")) return -1;
    kir_pending_attr value = {0};
    if (tok_punct(&p->tok, '[')) {
        if (parse_list(p, &value, 0)) return -1;
    } else if (parse_scalar(p, &value)) {
        return expected(p, "a param value (a number, a string or a list of numbers)");
    }
    if (expect_end(p, "the param")) return -1;
    kir_name_def *prev = name_find(&p->params, name, strlen(name));
    if (prev) {
        error_tok(p, &name_tok, "param '%s' defined twice", name);
        if (!p->gave_up) ks_note_at(p->d, p->src, prev->line, prev->col, "first defined here");
        return 0;
    }
    if (p->params.count == KIR_PARSE_MAX_PARAMS) {
        error_tok(p, &name_tok, "too many params (at most %d)", KIR_PARSE_MAX_PARAMS);
        return 0;
    }
    name_define(p, &p->params, name, strlen(name), 0, name_tok.line, name_tok.col);
    switch (value.kind) {
    case KIR_ATTR_INT: kir_param_int(p->g, name, value.i); break;
    case KIR_ATTR_FLOAT: kir_param_float(p->g, name, value.f); break;
    case KIR_ATTR_STR: kir_param_str(p->g, name, value.s); break;
    case KIR_ATTR_INTS: kir_param_ints(p->g, name, value.v, value.n); break;
    case KIR_ATTR_FLOATS: kir_param_floats(p->g, name, value.fv, value.n); break;
    }
    return p->g->oom ? nomem(p, p->g->arena.failed) : 0;
}

/* The parts of a node line, gathered before the node joins the graph. */
typedef struct kir_pending_node {
    kir_op op;                   /* KIR_OP_COUNT when unknown (reported) */
    kir_dtype dtype;             /* element type */
    int ndim;                    /* dims read */
    int64_t dims[KIR_MAX_DIMS];  /* the dims */
    int nin;                     /* operands read */
    kir_val in[KIR_MAX_INPUTS];  /* dense operand indices or KIR_NONE */
    size_t nattrs;               /* attributes in the parser's attrs */
    const char *file;            /* location file, NULL when none given */
    uint32_t line;               /* location line */
    uint32_t col;                /* location column */
} kir_pending_node;

/* IDENT '[' [dim {',' dim}] ']' */
static int parse_type(kir_parser *p, kir_pending_node *n)
{
    if (p->tok.kind != TOK_IDENT) return expected(p, "a type like f32[T,128]");
    const char *word = ks_arena_strndup(&p->scratch, p->tok.start, p->tok.len);
    if (!word) return nomem(p, p->scratch.failed);
    int dt = kir_dtype_lookup(word);
    if (dt < 0) error_tok(p, &p->tok, "unknown dtype %s", describe(p, &p->tok));
    n->dtype = dt < 0 ? KIR_F32 : (kir_dtype)dt;
    lex(p);
    if (expect_punct(p, '[', "'[' after the dtype")) return -1;
    if (tok_punct(&p->tok, ']')) {
        lex(p);
        return 0;
    }
    for (;;) {
        kir_token dim_tok = p->tok;
        int64_t dim;
        if (parse_dim(p, &dim)) return expected(p, "a dim (a positive integer or T)");
        if (dim <= 0 && dim != KIR_DIM_T)
            error_tok(p, &dim_tok, "bad dim %lld: a dim is a positive integer or T", (long long)dim);
        else if (n->ndim == KIR_MAX_DIMS)
            error_tok(p, &dim_tok, "too many dims (at most %d)", KIR_MAX_DIMS);
        if (n->ndim < KIR_MAX_DIMS) n->dims[n->ndim] = dim;
        n->ndim++;
        if (tok_punct(&p->tok, ']')) break;
        if (expect_punct(p, ',', "',' or ']' in the type")) return -1;
    }
    if (n->ndim > KIR_MAX_DIMS) n->ndim = KIR_MAX_DIMS;
    lex(p);
    return 0;
}

/* '(' [operand {',' operand}] ')' */
static int parse_operands(kir_parser *p, kir_pending_node *n)
{
    if (expect_punct(p, '(', "'(' after the op name")) return -1;
    if (tok_punct(&p->tok, ')')) {
        lex(p);
        return 0;
    }
    for (;;) {
        kir_val v = KIR_NONE;
        if (p->tok.kind == TOK_VALUE) {
            kir_name_def *s = value_find(p, &p->tok);
            if (!s)
                error_tok(p, &p->tok, "use of undefined value %.*s", (int)p->tok.len, p->tok.start);
            else
                v = s->index; /* VAL_POISONED: its line was reported */
        } else if (!tok_is(&p->tok, "_")) {
            return expected(p, "an operand (%N or _)");
        }
        if (n->nin == KIR_MAX_INPUTS)
            error_tok(p, &p->tok, "too many operands (at most %d)", KIR_MAX_INPUTS);
        if (n->nin < KIR_MAX_INPUTS) n->in[n->nin++] = v;
        lex(p);
        if (tok_punct(&p->tok, ')')) break;
        if (expect_punct(p, ',', "',' or ')' after an operand")) return -1;
    }
    lex(p);
    return 0;
}

/* '{' [name '=' value {',' ...}] '}' into the parser's attrs. */
static int parse_attrs(kir_parser *p, kir_pending_node *n)
{
    KS_ASSERT(tok_punct(&p->tok, '{'));
    lex(p);
    if (tok_punct(&p->tok, '}')) {
        lex(p);
        return 0;
    }
    for (;;) {
        kir_token key_tok = p->tok;
        const char *key = parse_name(p, "an attribute name");
        if (!key) return -1;
        if (!tok_punct(&p->tok, '='))
            return expected(p, msg_str(p, ks_arena_printf(&p->scratch, "'=' after the attribute name '%s'", key)));
        lex(p);
        if (KS_TRY_GROW(p->attrs, n->nattrs + 1, p->cap_attrs, (size_t)1 << 20) != 0) return nomem(p, 0);
        kir_pending_attr *a = &p->attrs[n->nattrs];
        memset(a, 0, sizeof *a);
        a->key = key;
        if (tok_punct(&p->tok, '[')) {
            if (parse_list(p, a, 1)) return -1;
        } else if (parse_scalar(p, a)) {
            return expected(p, "an attribute value (a number, a string or a [list])");
        }
        int dup = 0;
        for (size_t i = 0; i < n->nattrs && !dup; i++) dup = strcmp(p->attrs[i].key, key) == 0;
        if (dup)
            error_tok(p, &key_tok, "attribute '%s' given twice", key);
        else if (n->nattrs == KIR_PARSE_MAX_ATTRS)
            error_tok(p, &key_tok, "too many attributes (at most %d)", KIR_PARSE_MAX_ATTRS);
        else
            n->nattrs++;
        if (tok_punct(&p->tok, '}')) break;
        if (expect_punct(p, ',', "',' or '}' after an attribute")) return -1;
        if (tok_punct(&p->tok, '}')) break; /* a trailing comma */
    }
    lex(p);
    return 0;
}

/* A location number: line or column. */
static int parse_loc_number(kir_parser *p, const char *what, uint32_t *out)
{
    if (p->tok.kind != TOK_INT) return expected(p, msg_str(p, ks_arena_printf(&p->scratch, "a %s", what)));
    if (p->tok.i < 0 || p->tok.i >= (int64_t)UINT32_MAX)
        error_tok(p, &p->tok, "bad %s %lld", what, (long long)p->tok.i);
    else
        *out = (uint32_t)p->tok.i;
    lex(p);
    return 0;
}

/* '@' STRING ':' INT ':' INT */
static int parse_loc(kir_parser *p, kir_pending_node *n)
{
    KS_ASSERT(tok_punct(&p->tok, '@'));
    lex(p);
    if (p->tok.kind != TOK_STRING) return expected(p, "a file name in quotes after '@'");
    n->file = p->tok.s;
    lex(p);
    if (expect_punct(p, ':', "':' after the file name")) return -1;
    if (parse_loc_number(p, "line number", &n->line)) return -1;
    if (expect_punct(p, ':', "':' after the line number")) return -1;
    return parse_loc_number(p, "column number", &n->col);
}

static int known_file(const kir_graph *g, const char *file)
{
    for (size_t i = 0; i < g->n_files; i++)
        if (strcmp(g->files[i], file) == 0) return 1;
    return 0;
}

/* Append the node to the graph; VAL_POISONED when out of memory (the parse
 * stops: the graph is thrown away). */
static kir_val commit_node(kir_parser *p, const kir_pending_node *n)
{
    kir_loc loc = {UINT32_MAX, 0, 0};
    if (n->file) loc = kir_loc_make(p->g, n->file, n->line, n->col);
    kir_val v = p->g->oom ? KIR_NONE : kir_node_new(p->g, n->op, loc);
    if (v == KIR_NONE) {
        nomem(p, p->g->arena.failed);
        return VAL_POISONED;
    }
    kir_node *node = kir_node_at(p->g, v);
    node->dtype = n->dtype;
    node->ndim = (uint8_t)n->ndim;
    for (int i = 0; i < n->ndim; i++) node->dims[i] = n->dims[i];
    for (int i = 0; i < n->nin; i++) kir_node_add_input(p->g, v, n->in[i]);
    for (size_t i = 0; i < n->nattrs; i++) {
        const kir_pending_attr *a = &p->attrs[i];
        switch (a->kind) {
        case KIR_ATTR_INT: kir_set_int(p->g, v, a->key, a->i); break;
        case KIR_ATTR_FLOAT: kir_set_float(p->g, v, a->key, a->f); break;
        case KIR_ATTR_STR: kir_set_str(p->g, v, a->key, a->s); break;
        case KIR_ATTR_INTS: kir_set_ints(p->g, v, a->key, a->v, a->n); break;
        case KIR_ATTR_FLOATS: kir_set_floats(p->g, v, a->key, a->fv, a->n); break;
        }
    }
    if (p->g->oom) nomem(p, p->g->arena.failed);
    return v;
}

/* VALUE ':' type '=' op operands [attrs] [loc] */
static int parse_node(kir_parser *p)
{
    kir_token name_tok = p->tok;
    kir_name_def *prev = value_find(p, &name_tok);
    if (prev) {
        error_tok(p, &name_tok, "value %.*s defined twice", (int)name_tok.len, name_tok.start);
        if (!p->gave_up) ks_note_at(p->d, p->src, prev->line, prev->col, "first defined here");
    }
    kir_pending_node n = {.op = KIR_OP_COUNT};
    lex(p);
    int rc = 0;
    if (tok_punct(&p->tok, ':'))
        lex(p);
    else
        rc = expected(p, msg_str(p, ks_arena_printf(&p->scratch, "':' after %.*s", (int)name_tok.len, name_tok.start)));
    if (!rc) rc = parse_type(p, &n);
    if (!rc) rc = expect_punct(p, '=', "'=' after the type");
    if (!rc && p->tok.kind != TOK_IDENT) rc = expected(p, "an op name");
    const char *op_word = NULL;
    if (!rc && !(op_word = ks_arena_strndup(&p->scratch, p->tok.start, p->tok.len))) rc = nomem(p, p->scratch.failed);
    if (!rc) {
        n.op = kir_op_lookup(op_word);
        if (n.op >= KIR_OP_COUNT) error_tok(p, &p->tok, "unknown op %s", describe(p, &p->tok));
        lex(p);
        rc = parse_operands(p, &n);
    }
    if (!rc && tok_punct(&p->tok, '{')) rc = parse_attrs(p, &n);
    if (!rc && tok_punct(&p->tok, '@')) rc = parse_loc(p, &n);
    if (!rc) rc = expect_end(p, "the node");
    if (!rc && !prev && p->g->n_nodes == KIR_PARSE_MAX_NODES)
        error_tok(p, &name_tok, "too many nodes (at most %d)", KIR_PARSE_MAX_NODES);
    if (!rc && n.file && p->g->n_files == KIR_PARSE_MAX_FILES && !known_file(p->g, n.file))
        error_tok(p, &name_tok, "too many source files (at most %d)", KIR_PARSE_MAX_FILES);

    /* Once any error is reported the graph is thrown away: later nodes only
     * need their names, so that their uses stay quiet. */
    if (prev) return rc; /* the first definition stands */
    if (!rc && p->errors == 0) {
        KS_ASSERT(p->g->n_nodes < VAL_POISONED);
        value_define(p, &name_tok, commit_node(p, &n));
    } else {
        value_define(p, &name_tok, VAL_POISONED);
    }
    return rc;
}

static int parse_statement(kir_parser *p)
{
    if (p->tok.kind == TOK_VALUE) return parse_node(p);
    if (tok_is(&p->tok, "param")) return parse_param(p);
    if (tok_is(&p->tok, "graph")) return parse_graph(p);
    if (tok_is(&p->tok, "kiln-ir")) {
        error_tok(p, &p->tok, "the 'kiln-ir' header belongs on the first line");
        return -1;
    }
    return expected(p, "a node (%N : type = op(...)) or a param");
}

kir_graph *kir_parse(const ks_source *src, ks_diag *d)
{
    kir_parser p = {0};
    p.src = src;
    p.d = d;
    p.cur = src->text ? src->text : "";
    p.end = p.cur + (src->text ? src->len : 0);
    p.line_start = p.cur;
    p.line = 1;
    p.scratch.fallible = p.sbuf.fallible = 1;
    p.g = kir_graph_try_new("");
    if (!p.g) return ks_error_oom(d, src->name ? src->name : "<input>", sizeof *p.g, "an IR graph"), NULL;
    /* a node per line, and a name after each error until the parse gives up */
    ks_hmap_init(&p.values, NULL, 0, KIR_PARSE_MAX_NODES + KIR_PARSE_MAX_ERRORS, "value names");
    ks_hmap_init(&p.params, NULL, 0, KIR_PARSE_MAX_PARAMS, "param names");

    lex(&p);
    while (p.tok.kind == TOK_NEWLINE) lex(&p);
    if (tok_is(&p.tok, "kiln-ir")) {
        if (parse_header(&p)) recover(&p);
    } else {
        expected(&p, "the header 'kiln-ir 1'");
    }
    while (p.tok.kind != TOK_EOF && !p.gave_up && !p.oom) {
        if (p.tok.kind == TOK_NEWLINE) {
            lex(&p);
            continue;
        }
        if (p.tok.kind == TOK_ERROR || parse_statement(&p)) recover(&p);
    }

    kir_graph *g = p.g;
    if (p.oom || g->oom) {
        char what[64];
        snprintf(what, sizeof what, "the graph, reading line %d", p.line);
        ks_error_oom(d, src->name ? src->name : "<input>", p.oom > 1 ? p.oom : 0, what);
    }
    if (p.errors || p.oom || g->oom) {
        kir_graph_free(g);
        g = NULL;
    } else {
        g->fallible = g->arena.fallible = 0; /* an ordinary graph from here: the passes' builds do not check */
    }
    ks_hmap_free(&p.values);
    ks_hmap_free(&p.params);
    free(p.attrs);
    free(p.ints);
    free(p.floats);
    ks_buf_free(&p.sbuf);
    ks_arena_free(&p.scratch);
    return g;
}
