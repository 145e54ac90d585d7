/*
 * attrs.c — the attribute schema (ir/ops.def's KIR_SET, KIR_WORD and
 * KIR_ATTR lines) as tables, and the typed accessors every reader of an
 * attribute goes through (ir/ir.h).
 */
#include <math.h>
#include <string.h>

#include "ir/ir.h"

const char *const kir_set_names[KIR_SET_COUNT] = {
    [KIR_NOSET] = "",
#define KIR_SET(SET, what) [KIR_SET_##SET] = what,
#include "ir/ops.def"
};

const kir_word_info kir_word_table[KIR_WORD_COUNT] = {
#define KIR_WORD(SET, NAME, text) [KIR_##SET##_##NAME] = {KIR_SET_##SET, text},
#include "ir/ops.def"
};

/* the schema's KIND and PRESENCE columns as values */
#define KIR_KIND_INT KIR_ATTR_INT
#define KIR_KIND_FLOAT KIR_ATTR_FLOAT
#define KIR_KIND_STR KIR_ATTR_STR
#define KIR_KIND_INTS KIR_ATTR_INTS
#define KIR_KIND_FLOATS KIR_ATTR_FLOATS
#define KIR_KIND_WORD KIR_ATTR_WORD
#define KIR_PRESENCE_REQ 1
#define KIR_PRESENCE_OPT 0
#define KIR_SET_NOSET KIR_NOSET

const kir_attr_info kir_attr_table[KIR_A_COUNT] = {
#define KIR_ATTR(OP, ID, key, KIND, PRESENCE, fallback, SET, RULE)                                                    \
    [KIR_A_##OP##_##ID] = {KIR_OP_##OP, key,          KIR_KIND_##KIND,  KIR_PRESENCE_##PRESENCE, (double)(fallback), \
                           KIR_SET_##SET, KIR_RULE_##RULE},
#include "ir/ops.def"
};

kir_word kir_word_lookup(kir_set set, const char *text)
{
    for (int w = 0; w < KIR_WORD_COUNT; w++)
        if (kir_word_table[w].set == set && strcmp(kir_word_table[w].text, text) == 0) return (kir_word)w;
    return KIR_WORD_COUNT;
}

int kir_rope_scaling_by_length(kir_word scaling)
{
    return scaling == KIR_ROPE_SCALING_LONGROPE || scaling == KIR_ROPE_SCALING_DYNAMIC;
}

kir_attr_id kir_attr_lookup(kir_op op, const char *key)
{
    for (int a = 0; a < KIR_A_COUNT; a++)
        if ((kir_attr_table[a].op == op || kir_attr_table[a].op == KIR_OP_ANY) && strcmp(kir_attr_table[a].key, key) == 0)
            return (kir_attr_id)a;
    return KIR_A_COUNT;
}

const char *kir_rule_text(kir_attr_rule rule)
{
    switch (rule) {
    case KIR_RULE_ANY: return NULL;
    case KIR_RULE_FINITE: return "must be finite";
    case KIR_RULE_POSITIVE: return "must be positive";
    case KIR_RULE_NONNEG: return "must not be negative";
    case KIR_RULE_BOOL: return "must be 0 or 1";
    }
    return NULL;
}

int kir_rule_holds(kir_attr_rule rule, double x)
{
    switch (rule) {
    case KIR_RULE_ANY: return 1;
    case KIR_RULE_FINITE: return isfinite(x);
    case KIR_RULE_POSITIVE: return isfinite(x) && x > 0;
    case KIR_RULE_NONNEG: return isfinite(x) && x >= 0;
    case KIR_RULE_BOOL: return x == 0 || x == 1;
    }
    return 0;
}

/* ---- typed access -------------------------------------------------------------- */
/* The attribute of node v's op that a names: a itself, or, for an op that
 * shares the attribute (eps of both norms, layer of attention and
 * kv_write), the op's own line with the same key and kind. */
static kir_attr_id resolve(const kir_graph *g, kir_val v, kir_attr_id a, int kind)
{
    KS_ASSERT(a < KIR_A_COUNT && v < g->n_nodes);
    const kir_attr_info *info = &kir_attr_table[a];
    kir_op op = g->nodes[v].op;
    if (info->op != KIR_OP_ANY && info->op != op) a = kir_attr_lookup(op, info->key);
    KS_ASSERT(a < KIR_A_COUNT && kir_attr_table[a].kind == kind);
    return a;
}

/* The attribute a of node v, checked as resolve does; NULL when absent. */
static const kir_attr *attr_of(const kir_graph *g, kir_val v, kir_attr_id *a, int kind)
{
    *a = resolve(g, v, *a, kind);
    return kir_get(g, v, kir_attr_table[*a].key);
}

int64_t kir_attr_int(const kir_graph *g, kir_val v, kir_attr_id a)
{
    const kir_attr *x = attr_of(g, v, &a, KIR_ATTR_INT);
    return x && x->kind == KIR_ATTR_INT ? x->u.i : (int64_t)kir_attr_table[a].fallback;
}

double kir_attr_float(const kir_graph *g, kir_val v, kir_attr_id a)
{
    const kir_attr *x = attr_of(g, v, &a, KIR_ATTR_FLOAT);
    if (x && x->kind == KIR_ATTR_FLOAT) return x->u.f;
    if (x && x->kind == KIR_ATTR_INT) return (double)x->u.i;
    return kir_attr_table[a].fallback;
}

kir_word kir_attr_word(const kir_graph *g, kir_val v, kir_attr_id a)
{
    const kir_attr *x = attr_of(g, v, &a, KIR_ATTR_WORD);
    kir_word w = x && x->kind == KIR_ATTR_STR ? kir_word_lookup(kir_attr_table[a].set, x->u.s) : KIR_WORD_COUNT;
    return w < KIR_WORD_COUNT ? w : (kir_word)kir_attr_table[a].fallback;
}

kir_dtype kir_kv_dtype(const kir_graph *g, kir_val v)
{
    kir_op op = g->nodes[v].op;
    KS_ASSERT(op == KIR_OP_ATTENTION || op == KIR_OP_KV_WRITE);
    switch (kir_attr_word(g, v, op == KIR_OP_ATTENTION ? KIR_A_ATTENTION_KV_DTYPE : KIR_A_KV_WRITE_KV_DTYPE)) {
    case KIR_KV_DTYPE_BF16: return KIR_BF16;
    case KIR_KV_DTYPE_F16: return KIR_F16;
    case KIR_KV_DTYPE_I8: return KIR_I8;
    case KIR_KV_DTYPE_F8E4M3: return KIR_F8E4M3;
    default: return KIR_F32;
    }
}

kir_word kir_kv_dtype_word(kir_dtype t)
{
    switch (t) {
    case KIR_BF16: return KIR_KV_DTYPE_BF16;
    case KIR_F16: return KIR_KV_DTYPE_F16;
    case KIR_I8: return KIR_KV_DTYPE_I8;
    case KIR_F8E4M3: return KIR_KV_DTYPE_F8E4M3;
    default: return KIR_KV_DTYPE_F32;
    }
}

const char *kir_attr_str(const kir_graph *g, kir_val v, kir_attr_id a)
{
    const kir_attr *x = attr_of(g, v, &a, KIR_ATTR_STR);
    return x && x->kind == KIR_ATTR_STR ? x->u.s : NULL;
}

const int64_t *kir_attr_ints(const kir_graph *g, kir_val v, kir_attr_id a, uint32_t *n)
{
    const kir_attr *x = attr_of(g, v, &a, KIR_ATTR_INTS);
    int ok = x && x->kind == KIR_ATTR_INTS;
    *n = ok ? x->u.ints.n : 0;
    return ok ? x->u.ints.v : NULL;
}

const double *kir_attr_floats(const kir_graph *g, kir_val v, kir_attr_id a, uint32_t *n)
{
    const kir_attr *x = attr_of(g, v, &a, KIR_ATTR_FLOATS);
    int ok = x && x->kind == KIR_ATTR_FLOATS;
    *n = ok ? x->u.floats.n : 0;
    return ok ? x->u.floats.v : NULL;
}

int kir_attr_has(const kir_graph *g, kir_val v, kir_attr_id a)
{
    KS_ASSERT(a < KIR_A_COUNT && v < g->n_nodes);
    return kir_get(g, v, kir_attr_table[a].key) != NULL;
}

void kir_attr_set_int(kir_graph *g, kir_val v, kir_attr_id a, int64_t value)
{
    (void)attr_of(g, v, &a, KIR_ATTR_INT);
    kir_set_int(g, v, kir_attr_table[a].key, value);
}

void kir_attr_set_float(kir_graph *g, kir_val v, kir_attr_id a, double value)
{
    (void)attr_of(g, v, &a, KIR_ATTR_FLOAT);
    kir_set_float(g, v, kir_attr_table[a].key, value);
}

void kir_attr_set_word(kir_graph *g, kir_val v, kir_attr_id a, kir_word w)
{
    (void)attr_of(g, v, &a, KIR_ATTR_WORD);
    KS_ASSERT(w < KIR_WORD_COUNT && kir_word_table[w].set == kir_attr_table[a].set);
    kir_set_str(g, v, kir_attr_table[a].key, kir_word_table[w].text);
}

void kir_attr_set_str(kir_graph *g, kir_val v, kir_attr_id a, const char *value)
{
    (void)attr_of(g, v, &a, KIR_ATTR_STR);
    kir_set_str(g, v, kir_attr_table[a].key, value);
}

void kir_attr_set_ints(kir_graph *g, kir_val v, kir_attr_id a, const int64_t *values, uint32_t n)
{
    (void)attr_of(g, v, &a, KIR_ATTR_INTS);
    kir_set_ints(g, v, kir_attr_table[a].key, values, n);
}

void kir_attr_set_floats(kir_graph *g, kir_val v, kir_attr_id a, const double *values, uint32_t n)
{
    (void)attr_of(g, v, &a, KIR_ATTR_FLOATS);
    kir_set_floats(g, v, kir_attr_table[a].key, values, n);
}

/* ---- building a node -------------------------------------------------------------- */
kir_val kir_build(kir_graph *g, kir_op op, kir_loc loc, const kir_val *in, int n_in, const kir_setting *set, int n_set,
                  ks_buf *err)
{
    while (n_in > 0 && in[n_in - 1] == KIR_NONE) n_in--;
    kir_val v = kir_node_new(g, op, loc);
    for (int i = 0; i < n_in; i++) kir_node_add_input(g, v, in[i]);
    for (int k = 0; k < n_set; k++) {
        const kir_setting *x = &set[k];
        switch (kir_attr_table[resolve(g, v, x->id, kir_attr_table[x->id].kind)].kind) {
        case KIR_ATTR_INT: kir_attr_set_int(g, v, x->id, x->i); break;
        case KIR_ATTR_FLOAT: kir_attr_set_float(g, v, x->id, x->f); break;
        case KIR_ATTR_STR: kir_attr_set_str(g, v, x->id, x->s); break;
        case KIR_ATTR_INTS: kir_attr_set_ints(g, v, x->id, x->ints, x->n); break;
        case KIR_ATTR_FLOATS: kir_attr_set_floats(g, v, x->id, x->floats, x->n); break;
        case KIR_ATTR_WORD: kir_attr_set_word(g, v, x->id, x->w); break;
        default: KS_UNREACHABLE();
        }
    }
    if (kir_infer(g, v, err) == 0) return v;
    g->n_nodes--; /* its attributes stay in the arena, unreferenced */
    return KIR_NONE;
}
