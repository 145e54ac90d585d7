/*
 * lower_eval.c — evaluating .kiln expressions at compile time: literals,
 * names, config.json paths, operators and the scalar functions (sqrt, min,
 * max, abs, int, float). Tensor operands are handed to lower_builtins.c.
 *
 * Semantics:
 *  - ints are 64-bit and checked for overflow; `/` and `%` on two ints are
 *    integer division (truncating, as C); with a float operand they are
 *    floating. Division by zero is an error.
 *  - a config path whose key is missing or null (or whose index is out of
 *    range, or which walks through a null) is *absent*: `a ?? b` takes b
 *    when a is absent; any other use reports the missing key at the path. A
 *    path that walks into a value of the wrong kind (a key of a string, an
 *    index of an object) is an error at that value.
 *  - a JSON array of integers is a list of ints (eos_token_id may be one);
 *    other arrays are read by index.
 *  - `&&`, `||` and `c ? a : b` evaluate only what they need, so a branch
 *    not taken may name keys the config lacks.
 *  - a JSON number is an int when it is integral and under 2^53 in
 *    magnitude (10000.0 reads as 10000; 1e12 as 1000000000000); int() and
 *    float() convert explicitly, and int() of a float takes only a whole
 *    number in range: it never truncates.
 *  - a value read from config.json keeps where it sits there (kf_origin):
 *    messages about it point at it.
 */
#include "frontend/lower.h"

#include <math.h>
#include <string.h>

static kf_value eval_raw(kf_lower *L, const kf_expr *e);

const char *kf_type_name(kf_vkind k)
{
    switch (k) {
    case KF_V_ERROR: return "error";
    case KF_V_ABSENT: return "absent key";
    case KF_V_NONE: return "none";
    case KF_V_INT: return "int";
    case KF_V_FLOAT: return "float";
    case KF_V_STR: return "string";
    case KF_V_BOOL: return "bool";
    case KF_V_INTS: return "list of ints";
    case KF_V_FLOATS: return "list of floats";
    case KF_V_TENSOR: return "tensor";
    }
    KS_UNREACHABLE();
}

const char *kf_a_type(kf_vkind k)
{
    switch (k) {
    case KF_V_INT: return "an int";
    case KF_V_NONE: return "none";
    case KF_V_ABSENT: return "an absent key";
    case KF_V_ERROR: return "an error";
    case KF_V_FLOAT: return "a float";
    case KF_V_STR: return "a string";
    case KF_V_BOOL: return "a bool";
    case KF_V_INTS: return "a list of ints";
    case KF_V_FLOATS: return "a list of floats";
    case KF_V_TENSOR: return "a tensor";
    }
    KS_UNREACHABLE();
}

const char *kf_not_int(kf_value v)
{
    if (v.kind != KF_V_FLOAT || !isfinite(v.u.f) || v.u.f != floor(v.u.f) || fabs(v.u.f) < 9007199254740992.0)
        return kf_a_type(v.kind);
    /* Not the number itself: past 2^53 a double holds only a neighbour of what the text says. */
    return "a whole number too large to read exactly (2^53 or more)";
}

static int is_number(kf_value v) { return v.kind == KF_V_INT || v.kind == KF_V_FLOAT; }
static double as_double(kf_value v) { return v.kind == KF_V_INT ? (double)v.u.i : v.u.f; }

/* Without a config every key is absent: remember the paths for kf_compile's
 * one message. */
static void note_unconfigured(kf_lower *L, const kf_absent *a)
{
    const kf_absent *rev[64];
    size_t n = 0;
    for (; a && n < 64; a = a->next) rev[n++] = a;
    while (n-- > 0) {
        size_t i = 0;
        while (i < L->n_unconfigured && strcmp(L->unconfigured[i], rev[n]->path) != 0) i++;
        if (i < L->n_unconfigured) continue;
        KS_GROW(L->unconfigured, L->n_unconfigured + 1, L->cap_unconfigured, (size_t)1 << 20, "config paths");
        L->unconfigured[L->n_unconfigured++] = rev[n]->path;
    }
}

kf_value kf_require(kf_lower *L, kf_value v)
{
    if (v.kind != KF_V_ABSENT) return v;
    /* without a config.json, the paths into it are reported together (kf_compile), once */
    int only_config = 1;
    for (const kf_absent *a = v.u.absent; a; a = a->next) only_config &= a->doc == KF_DOC_CONFIG;
    if (!L->docs[KF_DOC_CONFIG].root && only_config) {
        note_unconfigured(L, v.u.absent);
        return kf_err_value();
    }
    /* The list is newest first; the message names the paths in source order. */
    const kf_absent *paths[64];
    size_t n = 0;
    for (const kf_absent *a = v.u.absent; a && n < 64; a = a->next) paths[n++] = a;
    ks_buf b = {0};
    ks_buf_printf(&b, "missing key ");
    int one_doc = 1;
    for (size_t i = 1; i < n; i++) one_doc &= paths[i]->doc == paths[0]->doc;
    for (size_t i = n; i-- > 0;) {
        ks_buf_printf(&b, "'%s'", paths[i]->path);
        if (!one_doc) ks_buf_printf(&b, " in %s", L->docs[paths[i]->doc].src.name);
        if (i > 1) ks_buf_puts(&b, ", ");
        else if (i == 1) ks_buf_puts(&b, n > 2 ? ", or " : " or ");
    }
    if (one_doc) {
        const kf_json_doc *doc = &L->docs[paths[0]->doc];
        ks_buf_printf(&b, " in %s", doc->src.name);
        if (!doc->root && paths[0]->doc == KF_DOC_CONFIG) ks_buf_puts(&b, " (no config was given)");
        else if (!doc->root) ks_buf_printf(&b, " (there is no %s)", doc->src.name);
    }
    kf_error(L, paths[n - 1]->loc, "%s", ks_buf_cstr(&b));
    ks_buf_free(&b);
    return kf_err_value();
}

kf_value kf_eval(kf_lower *L, const kf_expr *e) { return kf_require(L, eval_raw(L, e)); }

int kf_eval_int_value(kf_lower *L, const kf_expr *e, const char *what, kf_value *out)
{
    kf_value v = kf_eval(L, e);
    if (v.kind == KF_V_ERROR) return -1;
    if (v.kind != KF_V_INT) {
        kf_error_value(L, e->loc, v, "%s must be an int, not %s", what, kf_not_int(v));
        return -1;
    }
    *out = v;
    return 0;
}

int kf_eval_int(kf_lower *L, const kf_expr *e, const char *what, int64_t *out)
{
    kf_value v;
    if (kf_eval_int_value(L, e, what, &v) != 0) return -1;
    *out = v.u.i;
    return 0;
}

int kf_eval_bool(kf_lower *L, const kf_expr *e, const char *what, int *out)
{
    kf_value v = kf_eval(L, e);
    if (v.kind == KF_V_ERROR) return -1;
    if (v.kind != KF_V_BOOL) {
        kf_error_value(L, e->loc, v, "%s must be a bool, not %s", what, kf_a_type(v.kind));
        return -1;
    }
    *out = (int)v.u.i;
    return 0;
}

/* ---- names -------------------------------------------------------------------- */
static kf_value not_here(kf_lower *L, const kf_binding *b, kf_loc loc)
{
    const char *what = b->kind == KF_BIND_WEIGHT ? "a weight" : "an input of the forward block";
    return kf_error(L, loc, "'%s' is %s (a tensor); only compile-time values can be used here", b->name,
                    what);
}

static kf_value unknown_name(kf_lower *L, const kf_expr *e)
{
    const char *name = e->kind == KF_EXPR_NAME ? e->u.name : e->u.index.name;
    if (kf_reported_at(L, e->loc)) return kf_err_value();
    return kf_error(L, e->loc, "unknown identifier '%s'%s", name, kf_suggest_name(L, name));
}

static kf_value eval_name(kf_lower *L, const kf_expr *e)
{
    const char *name = e->u.name;
    kf_binding *b = kf_lookup(L, name);
    if (!b && strcmp(name, "inf") == 0) return kf_float(INFINITY); /* a name of the language unless declared */
    if (!b) return unknown_name(L, e);
    switch (b->kind) {
    case KF_BIND_PARAM:
        if (!b->defined)
            return kf_error(L, e->loc,
                            "param '%s' is declared further down (line %d); a param can only use the params above it",
                            name, b->loc.line);
        for (size_t i = 0; i < b->deps.n; i++) kf_trace_add(L, b->deps.v[i]);
        return b->value;
    case KF_BIND_WEIGHT:
        if (!L->in_forward) return not_here(L, b, e->loc);
        if (b->weight->decl->is_layer)
            return kf_error(L, e->loc, "'%s' is a layer weight: index it with the layer, as %s[i]", name, name);
        return kf_weight_value(L, b->weight, 0, e->loc);
    case KF_BIND_INPUT:
        if (!L->in_forward) return not_here(L, b, e->loc);
        if (b->value.kind != KF_V_TENSOR) b->value = kf_tval(kf_emit_input(L, name, e->loc));
        return b->value;
    case KF_BIND_VAR:
    case KF_BIND_LOOP:
        return b->value;
    case KF_BIND_FN:
        return kf_error(L, e->loc, "'%s' is a function (line %d): call it, as %s(...)", name, b->loc.line, name);
    }
    KS_UNREACHABLE();
}

static kf_value eval_index(kf_lower *L, const kf_expr *e)
{
    const char *name = e->u.index.name;
    kf_binding *b = kf_lookup(L, name);
    if (!b) return unknown_name(L, e);
    if (b->kind != KF_BIND_WEIGHT)
        return kf_error(L, e->loc, "'%s' is not a layer weight; only layer weights take an index", name);
    if (!b->weight->decl->is_layer)
        return kf_error(L, e->loc, "'%s' is a weight, not a layer weight: use it without an index", name);
    if (!L->in_forward) return not_here(L, b, e->loc);
    int64_t layer;
    if (kf_eval_int(L, e->u.index.index, "a layer index", &layer) != 0) return kf_err_value();
    if (!b->weight->ok) return kf_err_value();
    if (layer < 0 || layer >= b->weight->n_inst)
        return kf_error(L, e->u.index.index->loc, "layer %lld of '%s' is out of range: the model has %lld layers",
                        (long long)layer, name, (long long)b->weight->n_inst);
    return kf_weight_value(L, b->weight, layer, e->loc);
}

/* ---- config.json ------------------------------------------------------------------ */
/* The value of a JSON number: an int when it is integral and exactly
 * representable (cJSON reads numbers as doubles: from 2^53 on, neighbouring
 * integers read the same), else a float. */
static kf_value json_number(double d)
{
    if (isfinite(d) && d == floor(d) && fabs(d) < 9007199254740992.0) return kf_int((int64_t)d);
    return kf_float(d);
}

/* "a string", "an object"...: what a JSON value is, for messages. */
static const char *json_kind(const cJSON *j)
{
    if (cJSON_IsString(j)) return "a string";
    if (cJSON_IsNumber(j)) return "a number";
    if (cJSON_IsBool(j)) return "a bool";
    if (cJSON_IsArray(j)) return "an array";
    if (cJSON_IsObject(j)) return "an object";
    return "null";
}

/* A JSON array of integers is a list of ints, one of numbers with a
 * non-integer among them a list of floats; any other array is an error at
 * the first element that is not a number. */
static kf_value json_number_list(kf_lower *L, const cJSON *j, const kf_origin *o, kf_loc loc)
{
    size_t n = (size_t)cJSON_GetArraySize(j), i = 0;
    kf_value bad = {.kind = KF_V_ERROR, .origin = o};
    if (n > KF_MAX_LIST)
        return kf_error_value(L, loc, bad, "'%s' holds %zu values; a list holds at most %zu numbers", o->path, n,
                              KF_MAX_LIST);
    int64_t *v = ks_arena_alloc(&L->scratch, (n ? n : 1) * sizeof *v);
    double *f = ks_arena_alloc(&L->scratch, (n ? n : 1) * sizeof *f);
    int floats = 0;
    for (const cJSON *x = j->child; x; x = x->next, i++) {
        if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble)) {
            bad.origin = kf_origin_element(L, o, (int64_t)i);
            return kf_error_value(L, loc, bad,
                                  "'%s' is %s: only an array of numbers is read whole (a list of ints or floats); "
                                  "read other arrays by index",
                                  bad.origin->path, cJSON_IsNumber(x) ? "not a finite number" : json_kind(x));
        }
        kf_value item = json_number(x->valuedouble);
        if (item.kind == KF_V_INT) v[i] = item.u.i;
        floats |= item.kind != KF_V_INT;
        f[i] = x->valuedouble;
    }
    kf_value r = {.kind = floats ? KF_V_FLOATS : KF_V_INTS, .origin = o};
    if (floats) {
        r.u.floats.v = f;
        r.u.floats.n = n;
    } else {
        r.u.ints.v = v;
        r.u.ints.n = n;
    }
    return r;
}

static kf_value eval_config(kf_lower *L, const kf_expr *e)
{
    const kf_json_doc *doc = &L->docs[e->u.config.doc];
    const cJSON *j = doc->root;
    ks_buf path = {0};
    size_t n = e->u.config.n;
    ks_json_step *steps = ks_arena_alloc(&L->scratch, n * sizeof *steps);
    for (size_t i = 0; i < n; i++) {
        const kf_config_step *s = &e->u.config.steps[i];
        /* A step into a value that is neither null (absent) nor what the step
         * needs is an error, not absent: a "rope_scaling": "linear" that `??`
         * passed over would silently build another model. */
        if (j && !cJSON_IsNull(j) && !(s->key ? cJSON_IsObject(j) : cJSON_IsArray(j))) {
            kf_origin *o = ks_arena_alloc(&L->scratch, sizeof *o);
            *o = (kf_origin){e->u.config.doc, ks_arena_strdup(&L->scratch, ks_buf_cstr(&path)), steps, i, e->loc};
            ks_buf_free(&path);
            kf_value v = {.kind = KF_V_ERROR, .origin = o};
            if (s->key)
                return kf_error_value(L, e->loc, v,
                                      "'%s' in %s is %s, not an object: the description reads its key '%s'", o->path,
                                      doc->src.name, json_kind(j), s->key);
            return kf_error_value(L, e->loc, v, "'%s' in %s is %s, not an array: the description reads an element of it",
                                  o->path, doc->src.name, json_kind(j));
        }
        if (s->key) {
            ks_buf_printf(&path, "%s%s", i ? "." : "", s->key);
            steps[i].key = s->key;
            j = j && cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, s->key) : NULL;
        } else {
            int64_t idx;
            if (kf_eval_int(L, s->index, "a config index", &idx) != 0) {
                ks_buf_free(&path);
                return kf_err_value();
            }
            ks_buf_printf(&path, "[%lld]", (long long)idx);
            steps[i].index = idx;
            j = j && cJSON_IsArray(j) && idx >= 0 && idx < cJSON_GetArraySize(j) ? cJSON_GetArrayItem(j, (int)idx)
                                                                                  : NULL;
        }
    }
    const char *p = ks_arena_strdup(&L->scratch, ks_buf_cstr(&path));
    ks_buf_free(&path);
    if (!j || cJSON_IsNull(j)) {
        kf_absent *a = ks_arena_alloc(&L->scratch, sizeof *a);
        a->doc = e->u.config.doc;
        a->path = p;
        a->loc = e->loc;
        return (kf_value){.kind = KF_V_ABSENT, .u.absent = a};
    }
    kf_origin *o = ks_arena_alloc(&L->scratch, sizeof *o);
    o->doc = e->u.config.doc;
    o->path = p;
    o->steps = steps;
    o->n_steps = n;
    o->loc = e->loc;
    kf_trace_add(L, o);
    kf_value v;
    if (cJSON_IsBool(j)) {
        v = kf_bool(cJSON_IsTrue(j));
    } else if (cJSON_IsNumber(j)) {
        v = json_number(j->valuedouble);
    } else if (cJSON_IsString(j) && j->valuestring) {
        v = kf_str(ks_arena_strdup(&L->scratch, j->valuestring));
    } else if (cJSON_IsArray(j)) {
        return json_number_list(L, j, o, e->loc);
    } else {
        v = (kf_value){.kind = KF_V_ERROR, .origin = o};
        return kf_error_value(L, e->loc, v, "'%s' in %s is %s; expected a number, a string, a bool or a list of ints",
                              p, doc->src.name, cJSON_IsObject(j) ? "an object" : "not a value");
    }
    v.origin = o;
    return v;
}

/* ---- operators ----------------------------------------------------------------------- */
static kf_value eval_unary(kf_lower *L, const kf_expr *e)
{
    kf_value a = kf_eval(L, e->u.unary.a);
    if (a.kind == KF_V_ERROR) return a;
    if (e->u.unary.op == '!') {
        if (a.kind != KF_V_BOOL) return kf_error_value(L, e->loc, a, "'!' expects a bool, not %s", kf_a_type(a.kind));
        return kf_bool(!a.u.i);
    }
    switch (a.kind) {
    case KF_V_INT:
        if (a.u.i == INT64_MIN) return kf_error(L, e->loc, "integer overflow in '-'");
        return kf_int(-a.u.i);
    case KF_V_FLOAT: return kf_float(-a.u.f);
    case KF_V_TENSOR: return kf_tensor_neg(L, a, e->loc);
    default: return kf_error_value(L, e->loc, a, "'-' expects a number or a tensor, not %s", kf_a_type(a.kind));
    }
}

static kf_value arith(kf_lower *L, int op, kf_value a, kf_value b, kf_loc loc)
{
    if (!is_number(a) || !is_number(b))
        return kf_error_value(L, loc, is_number(a) ? b : a, "'%s' expects numbers or tensors, not %s and %s",
                              kf_op_text(op), kf_a_type(a.kind), kf_a_type(b.kind));
    if (a.kind == KF_V_INT && b.kind == KF_V_INT) {
        int64_t x = a.u.i, y = b.u.i, r = 0;
        int overflow = 0;
        switch (op) {
        case '+': overflow = __builtin_add_overflow(x, y, &r); break;
        case '-': overflow = __builtin_sub_overflow(x, y, &r); break;
        case '*': overflow = __builtin_mul_overflow(x, y, &r); break;
        case '/':
        case '%':
            if (y == 0) return kf_error_value(L, loc, b, "division by zero in '%s'", kf_op_text(op));
            if (x == INT64_MIN && y == -1) overflow = 1;
            else r = op == '/' ? x / y : x % y;
            break;
        default: KS_UNREACHABLE();
        }
        if (overflow) return kf_error(L, loc, "integer overflow in '%s'", kf_op_text(op));
        return kf_int(r);
    }
    double x = as_double(a), y = as_double(b);
    switch (op) {
    case '+': return kf_float(x + y);
    case '-': return kf_float(x - y);
    case '*': return kf_float(x * y);
    case '/':
        if (y == 0) return kf_error_value(L, loc, b, "division by zero in '/'");
        return kf_float(x / y);
    case '%':
        if (y == 0) return kf_error_value(L, loc, b, "division by zero in '%%'");
        return kf_float(fmod(x, y));
    default: KS_UNREACHABLE();
    }
}

static kf_value compare(kf_lower *L, int op, kf_value a, kf_value b, kf_loc loc)
{
    int eq_op = op == KF_OP_EQ || op == KF_OP_NE;
    int r;
    if (is_number(a) && is_number(b)) {
        int c;
        if (a.kind == KF_V_INT && b.kind == KF_V_INT) c = (a.u.i > b.u.i) - (a.u.i < b.u.i);
        else c = (as_double(a) > as_double(b)) - (as_double(a) < as_double(b));
        switch (op) {
        case KF_OP_EQ: r = c == 0; break;
        case KF_OP_NE: r = c != 0; break;
        case '<': r = c < 0; break;
        case '>': r = c > 0; break;
        case KF_OP_LE: r = c <= 0; break;
        case KF_OP_GE: r = c >= 0; break;
        default: KS_UNREACHABLE();
        }
        return kf_bool(r);
    }
    if (!eq_op && a.kind == KF_V_TENSOR && b.kind == KF_V_TENSOR) return kf_tensor_compare(L, op, a, b, loc);
    if (!eq_op)
        return kf_error_value(L, loc, is_number(a) ? b : a, "'%s' compares numbers, not %s and %s", kf_op_text(op),
                              kf_a_type(a.kind), kf_a_type(b.kind));
    if (a.kind == KF_V_NONE || b.kind == KF_V_NONE) {
        r = a.kind == b.kind; /* x == none asks whether an optional weight is absent */
    } else if (a.kind == KF_V_STR && b.kind == KF_V_STR) {
        r = strcmp(a.u.s, b.u.s) == 0;
    } else if (a.kind == KF_V_BOOL && b.kind == KF_V_BOOL) {
        r = a.u.i == b.u.i;
    } else {
        /* The culprit is the operand whose kind is unlike the literal it is compared with: a config value. */
        return kf_error_value(L, loc, a.origin ? a : b, "'%s' cannot compare %s with %s", kf_op_text(op),
                              kf_a_type(a.kind), kf_a_type(b.kind));
    }
    return kf_bool(op == KF_OP_EQ ? r : !r);
}

static kf_value logic(kf_lower *L, const kf_expr *e)
{
    int op = e->u.binary.op;
    kf_value a = kf_eval(L, e->u.binary.a);
    if (a.kind == KF_V_ERROR) return a;
    if (a.kind != KF_V_BOOL)
        return kf_error_value(L, e->loc, a, "'%s' expects bools, not %s", kf_op_text(op), kf_a_type(a.kind));
    if ((op == KF_OP_AND && !a.u.i) || (op == KF_OP_OR && a.u.i)) return a;
    kf_value b = kf_eval(L, e->u.binary.b);
    if (b.kind == KF_V_ERROR) return b;
    if (b.kind != KF_V_BOOL)
        return kf_error_value(L, e->loc, b, "'%s' expects bools, not %s", kf_op_text(op), kf_a_type(b.kind));
    return b;
}

/* a ?? b: b when a is absent. When both are, the absent value names both
 * paths (b's first: the list is newest first). */
static kf_value coalesce(kf_lower *L, const kf_expr *e)
{
    kf_value a = eval_raw(L, e->u.binary.a);
    if (a.kind != KF_V_ABSENT) return a;
    kf_value b = eval_raw(L, e->u.binary.b);
    if (b.kind != KF_V_ABSENT) return b;
    kf_absent *head = NULL, **tail = &head;
    for (const kf_absent *x = b.u.absent; x; x = x->next) {
        kf_absent *c = ks_arena_alloc(&L->scratch, sizeof *c);
        *c = *x;
        *tail = c;
        tail = (kf_absent **)&c->next;
    }
    *tail = (kf_absent *)a.u.absent;
    b.u.absent = head;
    return b;
}

static kf_value eval_binary(kf_lower *L, const kf_expr *e)
{
    int op = e->u.binary.op;
    switch (op) {
    case KF_OP_COALESCE: return coalesce(L, e);
    case KF_OP_AND:
    case KF_OP_OR: return logic(L, e);
    default: break;
    }
    kf_value a = kf_eval(L, e->u.binary.a);
    kf_value b = kf_eval(L, e->u.binary.b);
    if (a.kind == KF_V_ERROR || b.kind == KF_V_ERROR) return kf_err_value();
    switch (op) {
    case KF_OP_EQ:
    case KF_OP_NE:
    case '<':
    case '>':
    case KF_OP_LE:
    case KF_OP_GE: return compare(L, op, a, b, e->loc);
    default: break;
    }
    if (a.kind == KF_V_TENSOR || b.kind == KF_V_TENSOR || a.kind == KF_V_NONE || b.kind == KF_V_NONE)
        return kf_tensor_binary(L, op, a, b, e->loc);
    return arith(L, op, a, b, e->loc);
}

static kf_value eval_cond(kf_lower *L, const kf_expr *e)
{
    int c;
    if (kf_eval_bool(L, e->u.cond.c, "the condition of '?'", &c) != 0) return kf_err_value();
    return eval_raw(L, c ? e->u.cond.a : e->u.cond.b);
}

/* ---- scalar functions ---------------------------------------------------------------- */
static const char *const scalar_functions[] = {"sqrt", "min", "max", "abs", "int", "float", "log", "pow", "floor",
                                               "ceil"};

int kf_is_scalar_function(const char *name)
{
    for (size_t i = 0; i < sizeof scalar_functions / sizeof *scalar_functions; i++)
        if (strcmp(scalar_functions[i], name) == 0) return 1;
    return 0;
}

static kf_value to_int(kf_lower *L, kf_value v, kf_loc loc)
{
    switch (v.kind) {
    case KF_V_INT: return v;
    case KF_V_BOOL: return kf_int(v.u.i);
    case KF_V_FLOAT: {
        /* Exact or an error: a truncated 1e12 or 2.5 would be a different model. */
        if (!(v.u.f >= -9223372036854775808.0 && v.u.f < 9223372036854775808.0))
            return kf_error_value(L, loc, v, "int: %g is out of range", v.u.f);
        if (v.u.f != floor(v.u.f)) return kf_error_value(L, loc, v, "int: %g is not a whole number", v.u.f);
        kf_value r = kf_int((int64_t)v.u.f);
        r.origin = v.origin;
        return r;
    }
    default: return kf_error_value(L, loc, v, "int: expects a number or a bool, not %s", kf_a_type(v.kind));
    }
}

/* Returns 0 when name is not a scalar function. */
static int eval_scalar_call(kf_lower *L, const kf_expr *e, kf_value *out)
{
    const char *name = e->u.call.name;
    size_t fn = 0, nfn = sizeof scalar_functions / sizeof *scalar_functions;
    while (fn < nfn && strcmp(scalar_functions[fn], name) != 0) fn++;
    if (fn == nfn) return 0;
    size_t n = e->u.call.n;
    int variadic = strcmp(name, "min") == 0 || strcmp(name, "max") == 0, pair = strcmp(name, "pow") == 0;
    for (size_t i = 0; i < n; i++) {
        if (e->u.call.args[i].name) {
            *out = kf_error(L, e->u.call.args[i].loc, "%s: takes no named arguments", name);
            return 1;
        }
    }
    if (variadic ? n < 2 : n != (pair ? 2u : 1u)) {
        *out = kf_error(L, e->loc, "%s: expected %s, got %zu", name,
                        variadic ? "at least 2 arguments" : pair ? "2 arguments" : "1 argument", n);
        return 1;
    }
    kf_value v[KIR_MAX_INPUTS];
    if (n > KIR_MAX_INPUTS) {
        *out = kf_error(L, e->loc, "%s: too many arguments (at most %d)", name, KIR_MAX_INPUTS);
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        v[i] = kf_eval(L, e->u.call.args[i].value);
        if (v[i].kind == KF_V_ERROR) {
            *out = v[i];
            return 1;
        }
    }
    if (strcmp(name, "int") == 0) {
        *out = to_int(L, v[0], e->loc);
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        if (!is_number(v[i])) {
            *out = kf_error_value(L, e->u.call.args[i].value->loc, v[i], "%s: expects numbers, not %s", name,
                                  kf_a_type(v[i].kind));
            return 1;
        }
    }
    if (strcmp(name, "float") == 0) {
        *out = kf_float(as_double(v[0]));
    } else if (strcmp(name, "sqrt") == 0) {
        if (as_double(v[0]) < 0)
            *out = kf_error_value(L, e->loc, v[0], "sqrt: %g is negative", as_double(v[0]));
        else
            *out = kf_float(sqrt(as_double(v[0])));
    } else if (strcmp(name, "log") == 0) {
        if (!(as_double(v[0]) > 0))
            *out = kf_error_value(L, e->loc, v[0], "log: %g is not positive", as_double(v[0]));
        else
            *out = kf_float(log(as_double(v[0])));
    } else if (strcmp(name, "pow") == 0) {
        double r = pow(as_double(v[0]), as_double(v[1]));
        *out = isfinite(r) ? kf_float(r)
                           : kf_error(L, e->loc, "pow: %g to the power %g is not a finite number", as_double(v[0]),
                                      as_double(v[1]));
    } else if (strcmp(name, "floor") == 0 || strcmp(name, "ceil") == 0) {
        /* whole numbers, as ints (a dim or a count computed from a float) */
        double x = name[0] == 'f' ? floor(as_double(v[0])) : ceil(as_double(v[0]));
        *out = x >= -9223372036854775808.0 && x < 9223372036854775808.0
                   ? kf_int((int64_t)x)
                   : kf_error_value(L, e->loc, v[0], "%s: %g is out of an int's range", name, as_double(v[0]));
    } else if (strcmp(name, "abs") == 0) {
        if (v[0].kind == KF_V_INT)
            *out = v[0].u.i == INT64_MIN ? kf_error(L, e->loc, "integer overflow in abs")
                                         : kf_int(v[0].u.i < 0 ? -v[0].u.i : v[0].u.i);
        else
            *out = kf_float(fabs(v[0].u.f));
    } else {
        int want_max = strcmp(name, "max") == 0;
        kf_value best = v[0];
        for (size_t i = 1; i < n; i++) {
            kf_value c = v[i];
            int greater = (c.kind == KF_V_INT && best.kind == KF_V_INT) ? c.u.i > best.u.i
                                                                        : as_double(c) > as_double(best);
            int less = (c.kind == KF_V_INT && best.kind == KF_V_INT) ? c.u.i < best.u.i
                                                                     : as_double(c) < as_double(best);
            if (want_max ? greater : less) best = c;
        }
        int all_int = 1;
        for (size_t i = 0; i < n; i++) all_int &= v[i].kind == KF_V_INT;
        *out = all_int ? best : kf_float(as_double(best));
    }
    return 1;
}

static kf_value eval_call(kf_lower *L, const kf_expr *e)
{
    kf_value out;
    if (eval_scalar_call(L, e, &out)) return out;
    if (kf_call_builtin(L, e, &out)) return out;
    const char *name = e->u.call.name;
    kf_binding *fn = kf_lookup(L, name);
    if (fn && fn->kind == KF_BIND_FN) return kf_call_fn(L, e, fn);
    if (kf_reported_at(L, e->loc)) return kf_err_value();
    /* Suggest among every function name: the builtins, the scalar functions, the file's own. */
    const char *const *bn;
    size_t nb, nf = 0;
    kf_builtin_names(&bn, &nb);
    size_t ns = sizeof scalar_functions / sizeof *scalar_functions;
    for (size_t h = 0; h < KF_SCOPE_BUCKETS; h++)
        for (const kf_binding *b = L->scope[h]; b; b = b->next) nf += b->kind == KF_BIND_FN;
    const char **all = ks_arena_alloc(&L->scratch, (nb + ns + nf) * sizeof *all);
    memcpy(all, bn, nb * sizeof *all);
    memcpy(all + nb, scalar_functions, ns * sizeof *all);
    size_t n = nb + ns;
    for (size_t h = 0; h < KF_SCOPE_BUCKETS; h++)
        for (const kf_binding *b = L->scope[h]; b; b = b->next)
            if (b->kind == KF_BIND_FN) all[n++] = b->name;
    if (fn) return kf_error(L, e->loc, "'%s' is a %s, not a function", name, kf_kind_name(fn->kind));
    return kf_error(L, e->loc, "unknown function '%s'%s", name, kf_suggest(L, name, all, n));
}

static kf_value eval_raw(kf_lower *L, const kf_expr *e)
{
    if (kf_work(L, e->loc) != 0) return kf_err_value();
    switch (e->kind) {
    case KF_EXPR_INT: return kf_int(e->u.i);
    case KF_EXPR_FLOAT: return kf_float(e->u.f);
    case KF_EXPR_STR: return kf_str(e->u.s);
    case KF_EXPR_BOOL: return kf_bool((int)e->u.i);
    case KF_EXPR_NONE: return kf_none();
    case KF_EXPR_NAME: return eval_name(L, e);
    case KF_EXPR_INDEX: return eval_index(L, e);
    case KF_EXPR_CONFIG: return eval_config(L, e);
    case KF_EXPR_UNARY: return eval_unary(L, e);
    case KF_EXPR_BINARY: return eval_binary(L, e);
    case KF_EXPR_COND: return eval_cond(L, e);
    case KF_EXPR_CALL: return eval_call(L, e);
    }
    KS_UNREACHABLE();
}
