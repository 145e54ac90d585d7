/*
 * lower_fn.c — user functions of a .kiln description: `fn NAME(a, b) { statements; return expr; }`.
 *
 * Requires: the params, weights and inputs bound (lower.c's declare_names) before kf_declare_fn.
 * Guarantees: a function is expanded where it is called, as if its body were written there with
 * its parameters bound to the arguments' values: the graph holds no trace of it (no call node),
 * so the passes and the backends see what they would see without it. Its body sees its parameters,
 * its own variables and the file's params, weights, functions and inputs, never the caller's
 * variables; what it assigns is gone when it returns. A function cannot call itself, directly or
 * through others (expansion would not end): such a call is an error at the call that closes the
 * cycle. An error inside a body gets a note at the outermost call that expanded it (the forward
 * block's or a param's).
 *
 * Prefix: kf_ (frontend).
 */
#include <string.h>

#include "frontend/lower.h"

/* The body's `return`s other than its last statement, and its `output`s (a function gives its value
 * to its caller; outputs are the forward block's): errors. */
static int check_body(kf_lower *L, const kf_item *fn, const kf_block *b, int top)
{
    int bad = 0;
    for (size_t i = 0; i < b->n; i++) {
        const kf_stmt *s = b->v[i];
        if (s->kind == KF_STMT_RETURN && !(top && i + 1 == b->n)) {
            kf_error(L, s->loc, "'return' must be the last statement of function '%s' (its value is the call's)",
                     fn->name);
            bad = 1;
        } else if (s->kind == KF_STMT_OUTPUT) {
            kf_error(L, s->loc, "'output' in function '%s': outputs belong to the forward block; return the value",
                     fn->name);
            bad = 1;
        } else if (s->kind == KF_STMT_FOR) {
            bad |= check_body(L, fn, &s->body, 0);
        } else if (s->kind == KF_STMT_IF) {
            for (const kf_stmt *c = s; c; c = c->orelse.n == 1 && c->orelse.v[0]->kind == KF_STMT_IF ? c->orelse.v[0] : NULL) {
                bad |= check_body(L, fn, &c->body, 0);
                if (!(c->orelse.n == 1 && c->orelse.v[0]->kind == KF_STMT_IF)) bad |= check_body(L, fn, &c->orelse, 0);
            }
        }
    }
    return bad;
}

void kf_declare_fn(kf_lower *L, const kf_item *it)
{
    kf_binding *old = kf_lookup(L, it->name);
    if (old) {
        kf_error(L, it->name_loc, "'%s' is already declared as a %s at line %d", it->name, kf_kind_name(old->kind),
                 old->loc.line);
        return;
    }
    if (kf_is_builtin(it->name) || kf_is_scalar_function(it->name)) {
        kf_error(L, it->name_loc, "'%s' is a builtin function; choose another name", it->name);
        return;
    }
    kf_binding *b = kf_bind(L, it->name, KF_BIND_FN, it->name_loc);
    b->fn = it;
    if (it->body.n == 0 || it->body.v[it->body.n - 1]->kind != KF_STMT_RETURN) {
        kf_error(L, it->name_loc, "function '%s' must end with 'return VALUE;'", it->name);
        b->fn_bad = 1;
    }
    b->fn_bad |= check_body(L, it, &it->body, 1);
}

void kf_check_fn_params(kf_lower *L, kf_binding *b)
{
    const kf_item *it = b->fn;
    for (size_t i = 0; i < it->n_strings; i++) {
        const char *p = it->strings[i];
        kf_binding *g = kf_lookup(L, p);
        if (g) {
            kf_error(L, it->string_locs[i], "parameter '%s' would hide the %s '%s'", p, kf_kind_name(g->kind), p);
            b->fn_bad = 1;
        }
        for (size_t j = 0; j < i; j++)
            if (strcmp(it->strings[j], p) == 0) {
                kf_error(L, it->string_locs[i], "parameter '%s' of function '%s' is named twice", p, it->name);
                b->fn_bad = 1;
            }
    }
}

/* The argument of the call for parameter i: the positional one in its place, or the one named so;
 * NULL, reported, when there is none or more than one. */
static const kf_arg *argument_for(kf_lower *L, const kf_expr *call, const kf_item *fn, size_t i)
{
    const kf_arg *found = NULL;
    size_t pos = 0;
    for (size_t a = 0; a < call->u.call.n; a++) {
        const kf_arg *arg = &call->u.call.args[a];
        int is = arg->name ? strcmp(arg->name, fn->strings[i]) == 0 : pos++ == i;
        if (!is) continue;
        if (found) {
            kf_error(L, arg->loc, "%s: parameter '%s' is given twice", fn->name, fn->strings[i]);
            return NULL;
        }
        found = arg;
    }
    if (!found) kf_error(L, call->loc, "%s: no argument for parameter '%s'", fn->name, fn->strings[i]);
    return found;
}

kf_value kf_call_fn(kf_lower *L, const kf_expr *call, kf_binding *b)
{
    const kf_item *fn = b->fn;
    if (b->fn_bad) return kf_err_value();
    if (L->frame >= KF_MAX_CALL_DEPTH) /* each level is C stack: a chain of a thousand functions must not reach its end */
        return kf_error(L, call->loc, "functions call each other more than %d deep here", KF_MAX_CALL_DEPTH);
    if (b->fn_active)
        return kf_error(L, call->loc,
                        "'%s' calls itself (directly or through other functions): a function is expanded where it "
                        "is called, so it cannot recurse",
                        fn->name);
    size_t npos = 0;
    for (size_t a = 0; a < call->u.call.n; a++) {
        const kf_arg *arg = &call->u.call.args[a];
        if (!arg->name) {
            npos++;
            continue;
        }
        int known = 0;
        for (size_t i = 0; i < fn->n_strings; i++) known |= strcmp(arg->name, fn->strings[i]) == 0;
        if (!known) return kf_error(L, arg->loc, "%s has no parameter '%s'", fn->name, arg->name);
    }
    if (npos > fn->n_strings)
        return kf_error(L, call->loc, "%s: expected %zu argument%s, got %zu", fn->name, fn->n_strings,
                        fn->n_strings == 1 ? "" : "s", npos);
    /* the arguments, where the call is */
    kf_value *args = ks_arena_alloc(&L->scratch, (fn->n_strings ? fn->n_strings : 1) * sizeof *args);
    for (size_t i = 0; i < fn->n_strings; i++) {
        const kf_arg *arg = argument_for(L, call, fn, i);
        if (!arg) return kf_err_value();
        args[i] = kf_eval(L, arg->value);
    }
    /* the body, one frame down: the caller's variables out of sight */
    const int errors0 = L->d->errors;
    b->fn_active = 1;
    L->frame++;
    for (size_t i = 0; i < fn->n_strings; i++) kf_bind(L, fn->strings[i], KF_BIND_VAR, fn->string_locs[i])->value = args[i];
    const kf_block body = {fn->body.v, fn->body.n - 1};
    kf_exec_block(L, &body);
    kf_value out = L->stop ? kf_err_value() : kf_eval(L, fn->body.v[fn->body.n - 1]->value);
    for (size_t h = 0; h < KF_SCOPE_BUCKETS; h++)
        for (kf_binding **p = &L->scope[h]; *p;) {
            kf_binding *v = *p;
            if ((v->kind == KF_BIND_VAR || v->kind == KF_BIND_LOOP) && v->frame == L->frame) *p = v->next;
            else p = &v->next;
        }
    L->frame--;
    b->fn_active = 0;
    /* the outermost call that led to an error inside (the ones between would be a note each) */
    if (L->d->errors > errors0 && !L->stop && L->frame == 0)
        ks_note_at(L->d, L->src, call->loc.line, call->loc.col, "in this call of '%s'", fn->name);
    return out;
}
