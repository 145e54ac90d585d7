/* ast.c — syntax tree constructors and the parse-time lists. */
#include "frontend/ast.h"

#include <stdlib.h>
#include <string.h>

/* Longest list the parser builds (items of a file, arguments of a call). */
#define KF_VEC_LIMIT ((size_t)1 << 24)

kf_vec *kf_vec_new(void)
{
    kf_vec *v = ks_xcalloc(1, sizeof *v);
    return v;
}

void kf_vec_push(kf_vec *vec, void *elem)
{
    KS_GROW(vec->v, vec->n + 1, vec->cap, KF_VEC_LIMIT, "list elements in a .kiln file");
    vec->v[vec->n++] = elem;
}

void kf_vec_free(kf_vec *vec)
{
    if (!vec) return;
    free(vec->v);
    free(vec);
}

void **kf_vec_finish(kf_vec *vec, ks_arena *a, size_t *n)
{
    *n = 0;
    if (!vec) return NULL;
    void **out = NULL;
    if (vec->n) {
        out = ks_arena_alloc(a, vec->n * sizeof *out);
        memcpy(out, vec->v, vec->n * sizeof *out);
    }
    *n = vec->n;
    kf_vec_free(vec);
    return out;
}

const char *kf_op_text(int op)
{
    switch (op) {
    case '+': return "+";
    case '-': return "-";
    case '*': return "*";
    case '/': return "/";
    case '%': return "%";
    case '<': return "<";
    case '>': return ">";
    case '!': return "!";
    case KF_OP_EQ: return "==";
    case KF_OP_NE: return "!=";
    case KF_OP_LE: return "<=";
    case KF_OP_GE: return ">=";
    case KF_OP_AND: return "&&";
    case KF_OP_OR: return "||";
    case KF_OP_COALESCE: return "??";
    default: KS_UNREACHABLE();
    }
}

/* Give e its depth from its deepest child; report the first node that goes
 * past the limit (its parents are past it too, and stay quiet). */
static void set_depth(kf_parser *p, kf_expr *e, int child_depth)
{
    e->depth = child_depth + 1;
    if (e->depth == KF_MAX_EXPR_DEPTH + 1)
        ks_error_at(p->diag, p->src, e->loc.line, e->loc.col,
                    "expression nested too deeply (more than %d levels)", KF_MAX_EXPR_DEPTH);
}

static int max_depth(int a, int b) { return a > b ? a : b; }

kf_expr *kf_expr_new(kf_parser *p, kf_expr_kind kind, kf_loc loc)
{
    kf_expr *e = ks_arena_alloc(p->arena, sizeof *e);
    e->kind = kind;
    e->loc = loc;
    e->depth = 1;
    return e;
}

kf_expr *kf_expr_unary(kf_parser *p, int op, kf_expr *a, kf_loc loc)
{
    kf_expr *e = kf_expr_new(p, KF_EXPR_UNARY, loc);
    e->u.unary.op = op;
    e->u.unary.a = a;
    set_depth(p, e, a->depth);
    return e;
}

kf_expr *kf_expr_binary(kf_parser *p, int op, kf_expr *a, kf_expr *b, kf_loc loc)
{
    kf_expr *e = kf_expr_new(p, KF_EXPR_BINARY, loc);
    e->u.binary.op = op;
    e->u.binary.a = a;
    e->u.binary.b = b;
    set_depth(p, e, max_depth(a->depth, b->depth));
    return e;
}

kf_expr *kf_expr_cond(kf_parser *p, kf_expr *c, kf_expr *a, kf_expr *b, kf_loc loc)
{
    kf_expr *e = kf_expr_new(p, KF_EXPR_COND, loc);
    e->u.cond.c = c;
    e->u.cond.a = a;
    e->u.cond.b = b;
    set_depth(p, e, max_depth(c->depth, max_depth(a->depth, b->depth)));
    return e;
}

kf_expr *kf_expr_call(kf_parser *p, const char *name, kf_vec *args, kf_loc loc)
{
    kf_expr *e = kf_expr_new(p, KF_EXPR_CALL, loc);
    e->u.call.name = name;
    kf_arg **v = (kf_arg **)kf_vec_finish(args, p->arena, &e->u.call.n);
    int d = 0;
    if (e->u.call.n) {
        e->u.call.args = ks_arena_alloc(p->arena, e->u.call.n * sizeof *e->u.call.args);
        for (size_t i = 0; i < e->u.call.n; i++) {
            e->u.call.args[i] = *v[i];
            d = max_depth(d, v[i]->value->depth);
        }
    }
    set_depth(p, e, d);
    return e;
}

kf_expr *kf_expr_index(kf_parser *p, const char *name, kf_expr *index, kf_loc loc)
{
    kf_expr *e = kf_expr_new(p, KF_EXPR_INDEX, loc);
    e->u.index.name = name;
    e->u.index.index = index;
    set_depth(p, e, index->depth);
    return e;
}

kf_expr *kf_expr_config(kf_parser *p, kf_vec *steps, kf_loc loc)
{
    kf_expr *e = kf_expr_new(p, KF_EXPR_CONFIG, loc);
    kf_config_step **v = (kf_config_step **)kf_vec_finish(steps, p->arena, &e->u.config.n);
    e->u.config.doc = v[0]->doc;
    e->u.config.steps = ks_arena_alloc(p->arena, e->u.config.n * sizeof *e->u.config.steps);
    int d = 0;
    for (size_t i = 0; i < e->u.config.n; i++) {
        e->u.config.steps[i] = *v[i];
        if (v[i]->index) d = max_depth(d, v[i]->index->depth);
    }
    set_depth(p, e, d);
    return e;
}
