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

/* Params the runtime reads from every model. */
static const char *const required_params[] = {"bos_token_id", "eos_token_id", "max_context"};

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

kf_binding *kf_lookup(kf_lower *L, const char *name)
{
    for (kf_binding *b = L->scope[name_hash(name)]; b; b = b->next)
        if (strcmp(b->name, name) == 0) return b;
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

static const char *kind_name(kf_bind_kind k)
{
    switch (k) {
    case KF_BIND_PARAM: return "param";
    case KF_BIND_WEIGHT: return "weight";
    case KF_BIND_INPUT: return "input";
    case KF_BIND_VAR: return "variable";
    case KF_BIND_LOOP: return "loop variable";
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
        for (kf_binding *b = L->scope[h]; b; b = b->next) n++;
    const char **cands = ks_arena_alloc(&L->scratch, (n ? n : 1) * sizeof *cands);
    n = 0;
    for (size_t h = 0; h < KF_SCOPE_BUCKETS; h++)
        for (kf_binding *b = L->scope[h]; b; b = b->next) cands[n++] = b->name;
    return kf_suggest(L, name, cands, n);
}

/* ---- phase 1: params and asserts ------------------------------------------------- */
static void lower_param(kf_lower *L, const kf_item *it, kf_binding *b)
{
    KS_ASSERT(b->kind == KF_BIND_PARAM);
    kf_value v = kf_eval(L, it->value);
    switch (v.kind) {
    case KF_V_INT:
    case KF_V_BOOL: kir_param_int(L->g, it->name, v.u.i); break;
    case KF_V_FLOAT:
        if (!isfinite(v.u.f)) {
            kf_error(L, it->value->loc, "param '%s' is %g; it must be finite", it->name, v.u.f);
            v = kf_err_value();
            break;
        }
        kir_param_float(L->g, it->name, v.u.f);
        break;
    case KF_V_STR: kir_param_str(L->g, it->name, v.u.s); break;
    case KF_V_ERROR: break;
    default:
        kf_error(L, it->value->loc, "param '%s' must be an int, float, string or bool, not %s", it->name,
                 kf_a_type(v.kind));
        v = kf_err_value();
        break;
    }
    b->value = v;
    b->defined = 1;
    if (strcmp(it->name, "layers") == 0 && v.kind != KF_V_ERROR) {
        if (v.kind != KF_V_INT || v.u.i < 0 || v.u.i > KF_MAX_LAYERS)
            kf_error(L, it->value->loc, "param 'layers' (the number of layers) must be an int from 0 to %d",
                     KF_MAX_LAYERS);
        else
            L->n_layers = v.u.i;
    }
}

static void lower_assert(kf_lower *L, const kf_item *it)
{
    int ok;
    if (kf_eval_bool(L, it->value, "an assert condition", &ok) == 0 && !ok)
        kf_error(L, it->loc, "assertion failed: %s", it->message);
}

/* ---- phase 3: the forward block --------------------------------------------------- */
static void exec_block(kf_lower *L, const kf_block *b);

static void exec_assign(kf_lower *L, const kf_stmt *s)
{
    kf_value v = kf_eval(L, s->value);
    kf_binding *b = kf_lookup(L, s->name);
    if (b && b->kind != KF_BIND_VAR) {
        kf_error(L, s->name_loc, "cannot assign to %s '%s'; forward variables need their own names",
                 kind_name(b->kind), s->name);
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
        kf_error(L, s->name_loc, "loop variable '%s' would hide the %s '%s'", s->name, kind_name(b->kind), s->name);
        return;
    }
    b = kf_bind(L, s->name, KF_BIND_LOOP, s->name_loc);
    for (int64_t i = lo; i < hi && !L->stop; i++) {
        b->value = kf_int(i);
        exec_block(L, &s->body);
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
    case KF_STMT_IF:
        /* an `else if` chain is walked in a loop, not by recursion: the parser
         * does not bound its length, and the C stack must not depend on it */
        for (;;) {
            int c;
            if (kf_eval_bool(L, s->value, "an if condition", &c) != 0) return;
            if (c) {
                exec_block(L, &s->body);
                return;
            }
            if (s->orelse.n != 1 || s->orelse.v[0]->kind != KF_STMT_IF) {
                exec_block(L, &s->orelse);
                return;
            }
            s = s->orelse.v[0];
            if (kf_work(L, s->loc) != 0) return;
        }
    }
    KS_UNREACHABLE();
}

static void exec_block(kf_lower *L, const kf_block *b)
{
    for (size_t i = 0; i < b->n && !L->stop; i++) exec_stmt(L, b->v[i]);
}

/* ---- the driver ---------------------------------------------------------------------- */
/* Declare every param and weight name up front, so that a use before the
 * declaration gets a precise message. bound[i] receives item i's binding,
 * or NULL when its name clashes (reported here; the item is skipped). */
static void declare_names(kf_lower *L, const kf_file *f, kf_binding **bound)
{
    kf_bind(L, "tokens", KF_BIND_INPUT, (kf_loc){0, 0});
    kf_bind(L, "positions", KF_BIND_INPUT, (kf_loc){0, 0});
    for (size_t i = 0; i < f->n_items; i++) {
        const kf_item *it = f->items[i];
        if (it->kind != KF_ITEM_PARAM && it->kind != KF_ITEM_WEIGHT) continue;
        kf_binding *old = kf_lookup(L, it->name);
        if (old && old->kind == KF_BIND_INPUT) {
            kf_error(L, it->name_loc, "'%s' is a builtin input of the forward block; choose another name", it->name);
            continue;
        }
        if (old) {
            kf_error(L, it->name_loc, "'%s' is already declared as a %s at line %d", it->name, kind_name(old->kind),
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
    for (size_t i = 0; i < sizeof required_params / sizeof *required_params; i++) {
        const char *name = required_params[i];
        kf_binding *b = kf_lookup(L, name);
        if (!b || b->kind != KF_BIND_PARAM)
            ks_error(L->d, L->src->name, "no param '%s': the runtime needs bos_token_id, eos_token_id and max_context",
                     name);
        else if (b->value.kind != KF_V_INT)
            kf_error(L, b->loc, "param '%s' must be an int (the runtime reads it), not %s", name,
                     kf_a_type(b->value.kind));
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
    ks_error(L->d, L->src->name, "the description reads %s keys (%s) but no config was given%s%s", L->config_name,
             ks_buf_cstr(&b), hint ? "; " : "", hint ? hint : "");
    ks_buf_free(&b);
    return 1;
}

kf_model *kf_compile(const ks_source *kiln, const cJSON *config, const char *config_name,
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
    L->config = config;
    L->config_name = config_name ? config_name : "config.json";
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
    if (forward && !unconfigured) {
        L->in_forward = 1;
        exec_block(L, &forward->body);
        report_unconfigured(L, no_config_hint); /* keys read by weights or the forward block */
    }
    /* What the file as a whole lacks is worth saying once the rest is right. */
    if (d->errors == errors0) check_result(L, model_item, forward);
    if (d->errors == errors0) kir_verify(L->g, d, kiln->name);

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
