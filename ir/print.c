/*
 * print.c — the IR's text form, written (kir_print). ir/parse.c reads it back.
 *
 * The text is what users read after each pass, so it aims to be plain:
 *
 *     kiln-ir 1
 *     graph "llama"
 *     param hidden = 128
 *     param eps = 1e-06
 *     param eos_token_id = [128001, 128008, 128009]
 *
 *     %0 : i32[T] = input() {name="tokens"} @"models/llama.kiln":40:7
 *     %5 : f32[T,128] = rms_norm(%2, _) {eps=1e-06} @"models/llama.kiln":44:9
 *
 * One statement per line. Values are the node indices (dense, in schedule
 * order), padded so that the types line up; `_` is an absent optional operand; attributes keep their stored
 * order; `@"file":line:col` is the node's source location, left out when it
 * is unknown.
 *
 * The printer guarantees that kir_parse reads back a graph that prints to
 * the same bytes, which takes care with two kinds of values:
 *  - floats are written in the shortest form that reads back to the same
 *    double and always look like floats (10000.0, 1e-06, inf, nan), so an
 *    attribute never changes kind on the way back;
 *  - strings are quoted with \" \\ \n \t and \xHH escapes for other control
 *    bytes; names that are not plain identifiers are quoted too.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

/* The longest text kir_print_double writes: sign, 17 digits, a point, up to
 * 15 zeros of padding (fixed form for exponents below 16) and slack. */
enum { FLOAT_TEXT_MAX = 48 };

/* Write x like Python's repr(): the fewest significant digits (1..17) that
 * read back to x under strtod, in fixed notation when the decimal exponent
 * is in [-4, 16) and in C's scientific notation otherwise (1e-06, 1e+16);
 * a fixed number without a fraction gets ".0". */
static void format_double(char out[FLOAT_TEXT_MAX], double x)
{
    if (isnan(x)) {
        strcpy(out, "nan");
        return;
    }
    if (isinf(x)) {
        strcpy(out, x < 0 ? "-inf" : "inf");
        return;
    }
    /* Shortest %e form that reads back exactly: "d.ddde±XX". */
    char sci[FLOAT_TEXT_MAX];
    for (int prec = 0; prec < 17; prec++) {
        snprintf(sci, sizeof sci, "%.*e", prec, x);
        if (strtod(sci, NULL) == x) break;
    }
    /* Split into sign, digits (without the point) and exponent. */
    const char *p = sci;
    int neg = 0;
    if (*p == '-') {
        neg = 1;
        p++;
    }
    char digits[24];
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9' && nd < (int)sizeof digits - 1) digits[nd++] = *p;
    KS_ASSERT(*p == 'e');
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--; /* 1.500e+00 -> 15, e0 */
    digits[nd] = 0;

    char *o = out;
    if (neg) *o++ = '-';
    if (exp10 < -4 || exp10 >= 16) {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, (size_t)nd - 1);
            o += nd - 1;
        }
        snprintf(o, (size_t)(FLOAT_TEXT_MAX - (o - out)), "e%c%02d", exp10 < 0 ? '-' : '+',
                 exp10 < 0 ? -exp10 : exp10);
        return;
    }
    if (exp10 < 0) { /* 0.000ddd */
        *o++ = '0';
        *o++ = '.';
        for (int i = 0; i < -exp10 - 1; i++) *o++ = '0';
        memcpy(o, digits, (size_t)nd);
        o += nd;
    } else { /* ddd.ddd, zero-padded before the point */
        int int_digits = exp10 + 1;
        for (int i = 0; i < int_digits; i++) *o++ = i < nd ? digits[i] : '0';
        *o++ = '.';
        if (nd > int_digits) {
            memcpy(o, digits + int_digits, (size_t)(nd - int_digits));
            o += nd - int_digits;
        } else {
            *o++ = '0';
        }
    }
    *o = 0;
}

static void print_double(ks_buf *b, double x)
{
    char text[FLOAT_TEXT_MAX];
    format_double(text, x);
    ks_buf_puts(b, text);
}

static void print_string(ks_buf *b, const char *s)
{
    ks_buf_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        switch (*p) {
        case '"': ks_buf_puts(b, "\\\""); break;
        case '\\': ks_buf_puts(b, "\\\\"); break;
        case '\n': ks_buf_puts(b, "\\n"); break;
        case '\t': ks_buf_puts(b, "\\t"); break;
        default:
            if (*p < 0x20 || *p == 0x7f)
                ks_buf_printf(b, "\\x%02x", *p);
            else
                ks_buf_put(b, p, 1);
        }
    }
    ks_buf_put(b, "\"", 1);
}

/* A name the parser reads as an identifier: [A-Za-z_][A-Za-z0-9_.-]*, and
 * not one of the words that mean something else where names stand. */
static int is_plain_name(const char *s)
{
    if (!s || !*s) return 0;
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_')) return 0;
    for (const char *p = s + 1; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '_' || *p == '.' || *p == '-'))
            return 0;
    return 1;
}

/* Param names and attribute keys: bare when they are identifiers, quoted
 * otherwise (the parser accepts both). */
static void print_name(ks_buf *b, const char *s)
{
    if (is_plain_name(s))
        ks_buf_puts(b, s);
    else
        print_string(b, s);
}

/* One dim: T for the token dim, else the number. */
static void print_dim(ks_buf *b, int64_t d)
{
    if (d == KIR_DIM_T)
        ks_buf_put(b, "T", 1);
    else
        ks_buf_printf(b, "%lld", (long long)d);
}

/* "[x,y]" (an attribute's, sep ",") or "[x, y]" (a param's, sep ", "): a list of floats, each read back exactly */
static void print_floats(ks_buf *b, const double *v, uint32_t n, const char *sep)
{
    ks_buf_put(b, "[", 1);
    for (uint32_t i = 0; i < n; i++) {
        if (i) ks_buf_puts(b, sep);
        print_double(b, v[i]);
    }
    ks_buf_put(b, "]", 1);
}

static void print_attr_value(ks_buf *b, const kir_attr *a)
{
    switch (a->kind) {
    case KIR_ATTR_INT: ks_buf_printf(b, "%lld", (long long)a->u.i); return;
    case KIR_ATTR_FLOAT: print_double(b, a->u.f); return;
    case KIR_ATTR_STR: print_string(b, a->u.s); return;
    case KIR_ATTR_INTS:
        ks_buf_put(b, "[", 1);
        for (uint32_t i = 0; i < a->u.ints.n; i++) {
            if (i) ks_buf_put(b, ",", 1);
            print_dim(b, a->u.ints.v[i]);
        }
        ks_buf_put(b, "]", 1);
        return;
    case KIR_ATTR_FLOATS: print_floats(b, a->u.floats.v, a->u.floats.n, ","); return;
    }
    KS_UNREACHABLE();
}

static void print_param(ks_buf *b, const kir_param *p)
{
    ks_buf_puts(b, "param ");
    print_name(b, p->name);
    ks_buf_puts(b, " = ");
    switch (p->kind) {
    case KIR_ATTR_INT: ks_buf_printf(b, "%lld", (long long)p->i); break;
    case KIR_ATTR_FLOAT: print_double(b, p->f); break;
    case KIR_ATTR_STR: print_string(b, p->s); break;
    case KIR_ATTR_INTS: /* plain integers: unlike an attribute's dims, -1 is not T here */
        ks_buf_put(b, "[", 1);
        for (uint32_t i = 0; i < p->ints.n; i++) ks_buf_printf(b, "%s%lld", i ? ", " : "", (long long)p->ints.v[i]);
        ks_buf_put(b, "]", 1);
        break;
    case KIR_ATTR_FLOATS: print_floats(b, p->floats.v, p->floats.n, ", "); break;
    }
    ks_buf_put(b, "\n", 1);
}

/* Node lines pad the value to the widest one so that the types line up. */
static void print_node(ks_buf *b, const kir_graph *g, kir_val v, int width)
{
    const kir_node *n = kir_node_at(g, v);
    KS_ASSERT(n->op < KIR_OP_COUNT && n->dtype < KIR_DTYPE_COUNT && n->ndim <= KIR_MAX_DIMS);
    ks_buf_printf(b, "%%%-*u : %s[", width, (unsigned)v, kir_dtype_name(n->dtype));
    for (int i = 0; i < n->ndim; i++) {
        if (i) ks_buf_put(b, ",", 1);
        print_dim(b, n->dims[i]);
    }
    ks_buf_printf(b, "] = %s(", kir_op_table[n->op].name);
    for (int i = 0; i < n->nin; i++) {
        if (i) ks_buf_puts(b, ", ");
        if (n->in[i] == KIR_NONE)
            ks_buf_put(b, "_", 1);
        else
            ks_buf_printf(b, "%%%u", (unsigned)n->in[i]);
    }
    ks_buf_put(b, ")", 1);
    if (n->nattrs) {
        ks_buf_puts(b, " {");
        for (uint32_t i = 0; i < n->nattrs; i++) {
            if (i) ks_buf_puts(b, ", ");
            print_name(b, n->attrs[i].key);
            ks_buf_put(b, "=", 1);
            print_attr_value(b, &n->attrs[i]);
        }
        ks_buf_put(b, "}", 1);
    }
    if (n->loc.file != UINT32_MAX && n->loc.file < g->n_files) {
        ks_buf_puts(b, " @");
        print_string(b, g->files[n->loc.file]);
        ks_buf_printf(b, ":%u:%u", n->loc.line, n->loc.col);
    }
    ks_buf_put(b, "\n", 1);
}

void kir_print(const kir_graph *g, ks_buf *out)
{
    ks_buf_puts(out, "kiln-ir 1\ngraph ");
    print_string(out, g->name);
    ks_buf_put(out, "\n", 1);
    for (size_t i = 0; i < g->n_params; i++) print_param(out, &g->params[i]);
    if (g->n_nodes) ks_buf_put(out, "\n", 1);
    int width = 1; /* digits of the last value */
    for (size_t m = g->n_nodes ? g->n_nodes - 1 : 0; m >= 10; m /= 10) width++;
    for (size_t i = 0; i < g->n_nodes; i++) print_node(out, g, (kir_val)i, width);
}
