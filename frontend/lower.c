/*
 * lower.c — kf_compile: parse a .kiln text, then lower it against
 * config.json and a checkpoint into a kir_graph (see lower.h for the
 * phases). This file holds the driver, the table of names, and the
 * statements of the forward block.
 *
 * Names: params, weights and the inputs `tokens` and `positions` are
 * declared once for the whole file. Forward variables are SSA names:
 * `x = ...` binds x, and binding it again rebinds it (for the statements
 * after); a variable bound in a loop body or an `if` branch stays bound
 * after it. A loop variable exists only in its loop. Params, weights,
 * inputs and loop variables cannot be assigned.
 */
#include "frontend/lower.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Params the runtime reads from every model, and the values it takes:
 * ints (the runtime stores them in 32 bits) within a range, or for
 * eos_token_id also a list of them (Llama 3 stops at any of several). */
typedef struct kf_runtime_param {
    const char *name; /* the param */
    int64_t min, max; /* the range of its value (of each int of a list) */
    int token_id;     /* a token id: when not negative, also below the vocabulary */
    int list;         /* a non-empty list of ints is accepted too */
    const char *what; /* what the value is, for messages */
} kf_runtime_param;

static const kf_runtime_param runtime_params[] = {
    {"bos_token_id", INT64_MIN, INT32_MAX, 1, 0, "a token id, or negative for none"},
    {"eos_token_id", INT64_MIN, INT32_MAX, 1, 1, "a token id, or negative for none"},
    {"max_context", 1, INT32_MAX, 0, 0, "the positions a sequence holds"},
};
enum { KF_N_RUNTIME_PARAMS = sizeof runtime_params / sizeof *runtime_params };

static const kf_runtime_param *runtime_param(const char *name)
{
    for (size_t i = 0; i < KF_N_RUNTIME_PARAMS; i++)
        if (strcmp(runtime_params[i].name, name) == 0) return &runtime_params[i];
    return NULL;
}

/* Element i of list value v, keeping where it comes from. */
static kf_value list_item(kf_lower *L, kf_value v, size_t i)
{
    kf_value x = kf_int(v.u.ints.v[i]);
    if (v.origin) x.origin = kf_origin_element(L, v.origin, (int64_t)i);
    return x;
}

/* One int of a runtime param (the value, or an element of its list: `is` says which). */
static int check_runtime_int(kf_lower *L, const kf_runtime_param *rp, kf_value x, const char *is, kf_loc loc)
{
    if (x.u.i >= rp->min && x.u.i <= rp->max) return 0;
    if (rp->min == INT64_MIN)
        kf_error_value(L, loc, x, "param '%s' %s %lld; it must be at most %lld (%s)", rp->name, is, (long long)x.u.i,
                       (long long)rp->max, rp->what);
    else
        kf_error_value(L, loc, x, "param '%s' %s %lld; it must be from %lld to %lld (%s)", rp->name, is,
                       (long long)x.u.i, (long long)rp->min, (long long)rp->max, rp->what);
    return -1;
}

/* A param the runtime reads must be an int in its range (or a list of them). */
static kf_value check_runtime_param(kf_lower *L, const kf_runtime_param *rp, kf_value v, kf_loc loc)
{
    if (v.kind == KF_V_ERROR) return v;
    if (v.kind == KF_V_INTS && rp->list) {
        if (v.u.ints.n == 0)
            return kf_error_value(L, loc, v, "param '%s' is an empty list; it needs at least one id (or -1 for none)",
                                  rp->name);
        for (size_t i = 0; i < v.u.ints.n; i++)
            if (check_runtime_int(L, rp, list_item(L, v, i), "holds", loc) != 0) return kf_err_value();
        return v;
    }
    if (v.kind != KF_V_INT)
        return kf_error_value(L, loc, v, "param '%s' must be an int%s (the runtime reads it), not %s", rp->name,
                              rp->list ? " or a list of ints" : "", kf_not_int(v));
    return check_runtime_int(L, rp, v, "is", loc) == 0 ? v : kf_err_value();
}

/* Errors are reported once per place and text: the body of a loop runs
 * once per layer, and its mistakes would otherwise repeat as often. */
static unsigned reported_hash(kf_loc loc)
{
    return (unsigned)(((uint64_t)loc.line * 0x9e3779b97f4a7c15ull ^ (uint64_t)loc.col) % KF_SCOPE_BUCKETS);
}

int kf_reported_at(kf_lower *L, kf_loc loc)
{
    for (kf_reported *r = L->reported[reported_hash(loc)]; r; r = r->next)
        if (r->loc.line == loc.line && r->loc.col == loc.col) return 1;
    return 0;
}

kf_value kf_error(kf_lower *L, kf_loc loc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ks_buf b = {0};
    ks_buf_vprintf(&b, fmt, ap);
    va_end(ap);
    kf_reported **slot = &L->reported[reported_hash(loc)];
    for (kf_reported *r = *slot; r; r = r->next) {
        if (r->loc.line == loc.line && r->loc.col == loc.col && strcmp(r->text, b.data) == 0) {
            ks_buf_free(&b);
            return kf_err_value();
        }
    }
    kf_reported *r = ks_arena_alloc(&L->scratch, sizeof *r);
    r->loc = loc;
    r->text = ks_arena_strdup(&L->scratch, b.data);
    r->next = *slot;
    *slot = r;
    ks_buf_free(&b);
    ks_error_at(L->d, L->src, loc.line, loc.col, "%s", r->text);
    return kf_err_value();
}

/* ---- config values ------------------------------------------------------------ */
typedef struct kf_reported_origin {
    const kf_origin *origin;                 /* the config value (by document and path: same_origin) */
    struct kf_reported_origin *next;         /* the one reported before */
} kf_reported_origin;

static int same_origin(const kf_origin *a, const kf_origin *b)
{
    return a->doc == b->doc && strcmp(a->path, b->path) == 0;
}

int kf_locate(const kf_lower *L, const kf_origin *o, int *line, int *col)
{
    const kf_json_doc *doc = &L->docs[o->doc];
    if (!doc->src.text) return -1;
    return ks_json_locate(doc->src.text, doc->src.len, o->steps, o->n_steps, line, col);
}

void kf_trace_add(kf_lower *L, const kf_origin *o)
{
    kf_trace *t = L->trace;
    if (!t || !o) return;
    for (size_t i = 0; i < t->n; i++)
        if (same_origin(t->v[i], o)) return;
    if (t->n < KF_MAX_TRACE) t->v[t->n++] = o;
}

const kf_origin *kf_origin_element(kf_lower *L, const kf_origin *o, int64_t i)
{
    kf_origin *e = ks_arena_alloc(&L->scratch, sizeof *e);
    *e = *o;
    e->path = ks_arena_printf(&L->scratch, "%s[%lld]", o->path, (long long)i);
    ks_json_step *steps = ks_arena_alloc(&L->scratch, (o->n_steps + 1) * sizeof *steps);
    memcpy(steps, o->steps, o->n_steps * sizeof *steps);
    steps[o->n_steps] = (ks_json_step){NULL, i};
    e->steps = steps;
    e->n_steps = o->n_steps + 1;
    return e;
}

kf_value kf_error_value(kf_lower *L, kf_loc loc, kf_value v, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ks_buf b = {0};
    ks_buf_vprintf(&b, fmt, ap);
    va_end(ap);
    const kf_origin *o = v.origin;
    int line, col;
    if (!o || kf_locate(L, o, &line, &col) != 0) {
        kf_error(L, loc, "%s", ks_buf_cstr(&b));
        ks_buf_free(&b);
        return kf_err_value();
    }
    for (kf_reported_origin *r = L->reported_origins; r; r = r->next) {
        if (same_origin(r->origin, o)) {
            ks_buf_free(&b);
            return kf_err_value();
        }
    }
    kf_reported_origin *r = ks_arena_alloc(&L->scratch, sizeof *r);
    r->origin = o;
    r->next = L->reported_origins;
    L->reported_origins = r;
    ks_error_at(L->d, &L->docs[o->doc].src, line, col, "%s", ks_buf_cstr(&b));
    ks_note_at(L->d, L->src, loc.line, loc.col, "'%s' is used here", o->path);
    ks_buf_free(&b);
    return kf_err_value();
}

int kf_work(kf_lower *L, kf_loc loc)
{
    if (L->stop) return -1;
    if (++L->work <= KF_MAX_WORK) return 0;
    kf_error(L, loc, "the description takes too long to evaluate (more than %d steps); is a loop range wrong?",
             KF_MAX_WORK);
    L->stop = 1;
    return -1;
}

kir_loc kf_kir_loc(kf_lower *L, kf_loc loc)
{
    return kir_loc_make(L->g, L->src->name ? L->src->name : "<input>", (uint32_t)loc.line, (uint32_t)loc.col);
}

/* ---- names ------------------------------------------------------------------- */
/* FNV-1a over the name's bytes. */
static unsigned name_hash(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return (unsigned)(h % KF_SCOPE_BUCKETS);
}

/* b can be named here: not a variable of a caller (lower_fn.c) */
static int in_sight(const kf_lower *L, const kf_binding *b)
{
    return (b->kind != KF_BIND_VAR && b->kind != KF_BIND_LOOP) || b->frame == L->frame;
}

kf_binding *kf_lookup(kf_lower *L, const char *name)
{
    for (kf_binding *b = L->scope[name_hash(name)]; b; b = b->next)
        if (strcmp(b->name, name) == 0 && in_sight(L, b)) return b;
    return NULL;
}

kf_binding *kf_bind(kf_lower *L, const char *name, kf_bind_kind kind, kf_loc loc)
{
    KS_ASSERT(!kf_lookup(L, name));
    kf_binding *b = ks_arena_alloc(&L->scratch, sizeof *b);
    unsigned h = name_hash(name);
    b->name = name;
    b->kind = kind;
    b->loc = loc;
    b->frame = L->frame;
    b->next = L->scope[h];
    L->scope[h] = b;
    return b;
}

void kf_unbind(kf_lower *L, kf_binding *b)
{
    kf_binding **p = &L->scope[name_hash(b->name)];
    while (*p != b) p = &(*p)->next;
    *p = b->next;
}

const char *kf_kind_name(kf_bind_kind k)
{
    switch (k) {
    case KF_BIND_PARAM: return "param";
    case KF_BIND_WEIGHT: return "weight";
    case KF_BIND_INPUT: return "input";
    case KF_BIND_VAR: return "variable";
    case KF_BIND_LOOP: return "loop variable";
    case KF_BIND_FN: return "function";
    }
    KS_UNREACHABLE();
}

/* Levenshtein distance, for "did you mean"; long names are not compared. */
static size_t edit_distance(const char *a, const char *b)
{
    size_t n = strlen(a), m = strlen(b);
    if (n > 64 || m > 64) return (size_t)-1;
    size_t row[65];
    for (size_t j = 0; j <= m; j++) row[j] = j;
    for (size_t i = 1; i <= n; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= m; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[m];
}

const char *kf_suggest(kf_lower *L, const char *name, const char *const *cands, size_t n)
{
    size_t len = strlen(name), limit = len <= 3 ? 1 : 2, best_d = (size_t)-1;
    const char *best = NULL;
    L->suggest_work += (long)n;
    if (L->suggest_work > KF_MAX_SUGGEST) return "";
    for (size_t i = 0; i < n; i++) {
        size_t d = edit_distance(name, cands[i]);
        if (d <= limit && d < best_d) {
            best_d = d;
            best = cands[i];
        }
    }
    return best ? ks_arena_printf(&L->scratch, " (did you mean '%s'?)", best) : "";
}

const char *kf_suggest_name(kf_lower *L, const char *name)
{
    size_t n = 0;
    for (size_t h = 0; h < KF_SCOPE_BUCKETS; h++)
        for (kf_binding *b = L->scope[h]; b; b = b->next) {
            if (L->frame > 0 && !in_sight(L, b) && strcmp(b->name, name) == 0)
                return " (a function sees its parameters and its own variables, not its caller's: pass it as an "
                       "argument)";
            n++;
        }
    const char **cands = ks_arena_alloc(&L->scratch, (n ? n : 1) * sizeof *cands);
    n = 0;
    for (size_t h = 0; h < KF_SCOPE_BUCKETS; h++)
        for (kf_binding *b = L->scope[h]; b; b = b->next)
            if (in_sight(L, b)) cands[n++] = b->name;
    return kf_suggest(L, name, cands, n);
}

/* ---- phase 1: params and asserts ------------------------------------------------- */
static void lower_param(kf_lower *L, const kf_item *it, kf_binding *b)
{
    KS_ASSERT(b->kind == KF_BIND_PARAM);
    L->trace = &b->deps;
    kf_value v = kf_eval(L, it->value);
    L->trace = NULL;
    /* A param's own value is best shown where it is read: `a ?? b` is written at its `??`. */
    kf_loc at = v.origin ? v.origin->loc : it->value->loc;
    const kf_runtime_param *rp = runtime_param(it->name);
    if (rp) v = check_runtime_param(L, rp, v, at);
    switch (v.kind) {
    case KF_V_INT:
    case KF_V_BOOL: kir_param_int(L->g, it->name, v.u.i); break;
    case KF_V_FLOAT:
        if (!isfinite(v.u.f)) {
            v = kf_error_value(L, at, v, "param '%s' is %g; it must be finite", it->name, v.u.f);
            break;
        }
        kir_param_float(L->g, it->name, v.u.f);
        break;
    case KF_V_STR: kir_param_str(L->g, it->name, v.u.s); break;
    case KF_V_INTS: kir_param_ints(L->g, it->name, v.u.ints.v, (uint32_t)v.u.ints.n); break;
    case KF_V_FLOATS: kir_param_floats(L->g, it->name, v.u.floats.v, (uint32_t)v.u.floats.n); break;
    case KF_V_ERROR: break;
    default:
        v = kf_error_value(L, at, v, "param '%s' must be an int, float, string, bool or list of numbers, not %s",
                           it->name, kf_a_type(v.kind));
        break;
    }
    /* A model without layers computes nothing a language model needs: no
     * attention, so no context. A bad count stops the layer weights quietly. */
    if (strcmp(it->name, "layers") == 0) {
        if (v.kind == KF_V_INT && (v.u.i < 1 || v.u.i > KF_MAX_LAYERS))
            v = kf_error_value(L, at, v, "param 'layers' (the number of layers) is %lld; it must be from 1 to %d",
                               (long long)v.u.i, KF_MAX_LAYERS);
        else if (v.kind != KF_V_INT && v.kind != KF_V_ERROR)
            v = kf_error_value(L, at, v, "param 'layers' (the number of layers) must be an int from 1 to %d, not %s",
                               KF_MAX_LAYERS, kf_not_int(v));
        L->n_layers = v.kind == KF_V_INT ? v.u.i : KF_LAYERS_BAD;
    }
    b->value = v;
    b->defined = 1;
}

/* A failed assert that read config values is reported at the first of
 * them whose place is known, with a note at each other one and at the
 * assert: the user fixes config.json, not the description. */
static void lower_assert(kf_lower *L, const kf_item *it)
{
    int ok;
    kf_trace t = {{0}, 0};
    L->trace = &t;
    int rc = kf_eval_bool(L, it->value, "an assert condition", &ok);
    L->trace = NULL;
    if (rc != 0 || ok) return;
    int first = -1, line[KF_MAX_TRACE], col[KF_MAX_TRACE];
    for (size_t i = 0; i < t.n; i++) {
        line[i] = 0;
        if (kf_locate(L, t.v[i], &line[i], &col[i]) != 0) line[i] = 0;
        else if (first < 0) first = (int)i;
    }
    if (first < 0) {
        kf_error(L, it->loc, "assertion failed: %s", it->message);
        return;
    }
    ks_error_at(L->d, &L->docs[t.v[first]->doc].src, line[first], col[first], "assertion failed: %s", it->message);
    for (size_t i = (size_t)first + 1; i < t.n; i++)
        if (line[i]) ks_note_at(L->d, &L->docs[t.v[i]->doc].src, line[i], col[i], "the assertion reads this value too");
    ks_note_at(L->d, L->src, it->loc.line, it->loc.col, "the assertion is here");
}

/* ---- phase 3: the forward block --------------------------------------------------- */
static void exec_assign(kf_lower *L, const kf_stmt *s)
{
    kf_value v = kf_eval(L, s->value);
    kf_binding *b = kf_lookup(L, s->name);
    if (b && b->kind != KF_BIND_VAR) {
        kf_error(L, s->name_loc, "cannot assign to %s '%s'; forward variables need their own names",
                 kf_kind_name(b->kind), s->name);
        return;
    }
    if (!b) b = kf_bind(L, s->name, KF_BIND_VAR, s->name_loc);
    b->value = v;
}

static void exec_for(kf_lower *L, const kf_stmt *s)
{
    int64_t lo, hi, span;
    int bad = kf_eval_int(L, s->lo, "a loop bound", &lo) != 0;
    bad |= kf_eval_int(L, s->hi, "a loop bound", &hi) != 0;
    if (bad) return;
    if (__builtin_sub_overflow(hi, lo, &span) || span > KF_MAX_LOOP) {
        kf_error(L, s->loc, "loop range %lld .. %lld is too long (at most %d iterations)", (long long)lo,
                 (long long)hi, KF_MAX_LOOP);
        return;
    }
    kf_binding *b = kf_lookup(L, s->name);
    if (b) {
        kf_error(L, s->name_loc, "loop variable '%s' would hide the %s '%s'", s->name, kf_kind_name(b->kind), s->name);
        return;
    }
    b = kf_bind(L, s->name, KF_BIND_LOOP, s->name_loc);
    for (int64_t i = lo; i < hi && !L->stop; i++) {
        b->value = kf_int(i);
        kf_exec_block(L, &s->body);
    }
    kf_unbind(L, b);
}

static void exec_stmt(kf_lower *L, const kf_stmt *s)
{
    if (kf_work(L, s->loc) != 0) return;
    switch (s->kind) {
    case KF_STMT_ASSIGN: exec_assign(L, s); return;
    case KF_STMT_OUTPUT: kf_emit_output(L, s->name, kf_eval(L, s->value), s->name_loc); return;
    case KF_STMT_FOR: exec_for(L, s); return;
    case KF_STMT_RETURN: /* a function's last one is its value (lower_fn.c); elsewhere: */
        kf_error(L, s->loc, "'return' outside a function: the forward block's results are its outputs");
        return;
    case KF_STMT_IF:
        /* an `else if` chain is walked in a loop, not by recursion: the parser
         * does not bound its length, and the C stack must not depend on it */
        for (;;) {
            int c;
            if (kf_eval_bool(L, s->value, "an if condition", &c) != 0) return;
            if (c) {
                kf_exec_block(L, &s->body);
                return;
            }
            if (s->orelse.n != 1 || s->orelse.v[0]->kind != KF_STMT_IF) {
                kf_exec_block(L, &s->orelse);
                return;
            }
            s = s->orelse.v[0];
            if (kf_work(L, s->loc) != 0) return;
        }
    }
    KS_UNREACHABLE();
}

void kf_exec_block(kf_lower *L, const kf_block *b)
{
    for (size_t i = 0; i < b->n && !L->stop; i++) exec_stmt(L, b->v[i]);
}

/* ---- the driver ---------------------------------------------------------------------- */
/* Declare every param and weight name up front, so that a use before the
 * declaration gets a precise message. bound[i] receives item i's binding,
 * or NULL when its name clashes (reported here; the item is skipped). */
static void declare_names(kf_lower *L, const kf_file *f, kf_binding **bound)
{
    kf_bind(L, kir_word_table[KIR_ROLE_TOKENS].text, KF_BIND_INPUT, (kf_loc){0, 0}); /* the inputs are named for their roles */
    kf_bind(L, kir_word_table[KIR_ROLE_POSITIONS].text, KF_BIND_INPUT, (kf_loc){0, 0});
    kf_bind(L, kir_word_table[KIR_ROLE_SEQ_LENGTHS].text, KF_BIND_INPUT, (kf_loc){0, 0});
    for (size_t i = 0; i < f->n_items; i++) {
        const kf_item *it = f->items[i];
        if (it->kind != KF_ITEM_PARAM && it->kind != KF_ITEM_WEIGHT) continue;
        kf_binding *old = kf_lookup(L, it->name);
        if (old && old->kind == KF_BIND_INPUT) {
            kf_error(L, it->name_loc, "'%s' is a builtin input of the forward block; choose another name", it->name);
            continue;
        }
        if (old) {
            kf_error(L, it->name_loc, "'%s' is already declared as a %s at line %d", it->name, kf_kind_name(old->kind),
                     old->loc.line);
            continue;
        }
        if (it->kind == KF_ITEM_PARAM) {
            bound[i] = kf_bind(L, it->name, KF_BIND_PARAM, it->name_loc);
        } else {
            bound[i] = kf_bind(L, it->name, KF_BIND_WEIGHT, it->name_loc);
            bound[i]->weight = ks_arena_alloc(&L->scratch, sizeof *bound[i]->weight);
            bound[i]->weight->decl = it;
        }
    }
    /* then the functions, whose parameters must not hide those names nor another function's */
    for (size_t i = 0; i < f->n_items; i++)
        if (f->items[i]->kind == KF_ITEM_FN) kf_declare_fn(L, f->items[i]);
    for (size_t i = 0; i < f->n_items; i++) {
        kf_binding *b = f->items[i]->kind == KF_ITEM_FN ? kf_lookup(L, f->items[i]->name) : NULL;
        if (b && b->kind == KF_BIND_FN && b->fn == f->items[i]) kf_check_fn_params(L, b);
    }
}

/* The file's model line and forward block; a second one is an error. */
static void find_structure(kf_lower *L, const kf_file *f, const kf_item **model, const kf_item **forward)
{
    *model = *forward = NULL;
    for (size_t i = 0; i < f->n_items; i++) {
        const kf_item *it = f->items[i];
        const kf_item **slot = it->kind == KF_ITEM_MODEL ? model : it->kind == KF_ITEM_FORWARD ? forward : NULL;
        if (!slot) continue;
        if (*slot)
            kf_error(L, it->loc, "second '%s' (the first is at line %d)", it->kind == KF_ITEM_MODEL ? "model" : "forward",
                     (*slot)->loc.line);
        else
            *slot = it;
    }
}

/* The whole file: a model line, a forward block with an output, and the
 * params the runtime reads. */
static void check_result(kf_lower *L, const kf_item *model, const kf_item *forward)
{
    if (!model) ks_error(L->d, L->src->name, "no 'model NAME;' line");
    if (!forward) ks_error(L->d, L->src->name, "no 'forward { ... }' block");
    else if (L->n_outputs == 0) kf_error(L, forward->loc, "the forward block has no output");
    /* The vocabulary: the ids the "tokens" input may hold. The runtime draws
     * the next token from the first output, and feeds it back as an input. */
    int64_t vocab = kir_token_ids(L->g);
    if (vocab >= 0 && L->n_outputs > 0) {
        int64_t width = kir_row_elems(kir_node_at(L->g, L->first_output));
        if (width != vocab)
            kf_error(L, L->first_output_loc,
                     "output '%s' has %lld values per token, but the vocabulary has %lld ids (the rows of the table "
                     "'tokens' indexes): the runtime draws the next token from the first output",
                     kir_attr_str(L->g, L->first_output, KIR_A_OUTPUT_NAME), (long long)width, (long long)vocab);
    }
    for (size_t i = 0; i < KF_N_RUNTIME_PARAMS; i++) {
        const kf_runtime_param *rp = &runtime_params[i];
        kf_binding *b = kf_lookup(L, rp->name);
        if (!b || b->kind != KF_BIND_PARAM) {
            ks_error(L->d, L->src->name, "no param '%s': the runtime needs bos_token_id, eos_token_id and max_context",
                     rp->name);
            continue;
        }
        kf_value v = b->value;
        if (!rp->token_id || vocab < 0) continue;
        kf_loc at = v.origin ? v.origin->loc : b->loc;
        if (v.kind == KF_V_INT && v.u.i >= vocab)
            kf_error_value(L, at, v, "param '%s' is %lld, outside the vocabulary (%lld ids)", rp->name,
                           (long long)v.u.i, (long long)vocab);
        for (size_t k = 0; v.kind == KF_V_INTS && k < v.u.ints.n; k++) {
            kf_value x = list_item(L, v, k);
            if (x.u.i < vocab) continue;
            kf_error_value(L, at, x, "param '%s' holds %lld, outside the vocabulary (%lld ids)", rp->name,
                           (long long)x.u.i, (long long)vocab);
            break;
        }
    }
}

/* Without a config, the keys the description needed: one error naming the
 * first few, and the caller's hint. 1 when there were some. */
static int report_unconfigured(kf_lower *L, const char *hint)
{
    if (!L->n_unconfigured) return 0;
    ks_buf b = {0};
    for (size_t i = 0; i < L->n_unconfigured && i < 3; i++)
        ks_buf_printf(&b, "%sconfig.%s", i ? ", " : "", L->unconfigured[i]);
    if (L->n_unconfigured > 3) ks_buf_printf(&b, ", and %zu more", L->n_unconfigured - 3);
    ks_error(L->d, L->src->name, "the description reads %s keys (%s) but no config was given%s%s", L->docs[KF_DOC_CONFIG].src.name,
             ks_buf_cstr(&b), hint ? "; " : "", hint ? hint : "");
    ks_buf_free(&b);
    return 1;
}

kf_model *kf_compile(const ks_source *kiln, const kf_json_doc *config, const kf_json_doc *generation,
                     const kf_checkpoint *ckpt, const char *no_config_hint, ks_diag *d)
{
    int errors0 = d->errors;
    if (kiln->len > KF_MAX_SOURCE) {
        ks_error(d, kiln->name, "too large for a model description (%zu bytes)", kiln->len);
        return NULL;
    }
    ks_arena ast = {0};
    kf_file *f = kf_parse(kiln, &ast, d);
    if (d->errors > errors0) {
        ks_arena_free(&ast);
        return NULL;
    }

    kf_lower *L = ks_xcalloc(1, sizeof *L);
    L->src = kiln;
    L->d = d;
    const kf_json_doc *docs[KF_N_DOCS] = {config, generation};
    const char *names[KF_N_DOCS] = {"config.json", "generation_config.json"};
    for (int i = 0; i < KF_N_DOCS; i++) {
        if (docs[i]) L->docs[i] = *docs[i];
        if (!L->docs[i].src.name) L->docs[i].src.name = names[i];
    }
    L->ckpt = ckpt;
    L->n_layers = -1;
    const kf_item *model_item, *forward;
    find_structure(L, f, &model_item, &forward);

    kf_model *m = ks_xcalloc(1, sizeof *m);
    m->graph = kir_graph_new(model_item ? model_item->name : "model");
    L->model = m;
    L->g = m->graph;

    kf_binding **bound = ks_arena_alloc(&L->scratch, (f->n_items ? f->n_items : 1) * sizeof *bound);
    declare_names(L, f, bound);
    for (size_t i = 0; i < f->n_items; i++) {
        if (f->items[i]->kind == KF_ITEM_PARAM && bound[i]) lower_param(L, f->items[i], bound[i]);
        else if (f->items[i]->kind == KF_ITEM_ASSERT) lower_assert(L, f->items[i]);
    }
    /* without a config, what follows from the params would only be more
     * errors about the same missing keys */
    int unconfigured = report_unconfigured(L, no_config_hint);
    for (size_t i = 0; i < f->n_items && !unconfigured; i++)
        if (f->items[i]->kind == KF_ITEM_WEIGHT && bound[i]) kf_declare_weight(L, bound[i]->weight);
    kf_check_ignores(L, f);
    if (forward && !unconfigured) {
        L->in_forward = 1;
        kf_exec_block(L, &forward->body);
        report_unconfigured(L, no_config_hint); /* keys read by weights or the forward block */
    }
    /* What the file as a whole lacks is worth saying once the rest is right. */
    if (d->errors == errors0) check_result(L, model_item, forward);
    if (d->errors == errors0) kir_verify(L->g, d, kiln->name);
    if (d->errors == errors0 && ckpt) kf_check_unused(L, f, bound);

    /* The bindings move into the model's arena. */
    kf_weight_binding *heap = m->weights;
    if (m->n_weights) {
        m->weights = ks_arena_alloc(&m->arena, m->n_weights * sizeof *m->weights);
        memcpy(m->weights, heap, m->n_weights * sizeof *m->weights);
    } else {
        m->weights = NULL;
    }
    free(heap);
    free(L->unconfigured);
    ks_arena_free(&L->scratch);
    free(L);
    ks_arena_free(&ast);
    if (d->errors > errors0) {
        kf_model_free(m);
        return NULL;
    }
    return m;
}

void kf_model_free(kf_model *m)
{
    if (!m) return;
    kir_graph_free(m->graph);
    ks_arena_free(&m->arena);
    free(m);
}
