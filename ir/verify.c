/*
 * verify.c — whole-graph verification (kir_verify), QBE's ssacheck for kiln.
 *
 * Requires: nothing of the graph; it may be hand-edited IR text just parsed.
 * Guarantees, when it reports no error:
 *  - every node has a known op, a known dtype, at most KIR_MAX_DIMS dims,
 *    each a positive constant or T, and at most 2^48 elements per token;
 *  - its operand count is within the op's arity (ir/ops.def), and each
 *    operand is an earlier value, or KIR_NONE where the op allows an absent
 *    operand (rms_norm's weight, layer_norm's weight and bias);
 *  - the attributes each op needs are present with the right kind, and the
 *    string ones hold one of their allowed words (attr_rules below);
 *  - attention `layer` numbers, weight names and input names are unique,
 *    and there is exactly one OUTPUT;
 *  - each node's stored dtype and dims equal what its shape rule computes
 *    from its operands' stored types (so one wrong type is one error, not a
 *    cascade down the graph).
 * It does not check values (an eps of 0, a window of -5): the ops define
 * what they accept, and the shape rules check what shapes depend on.
 *
 * Messages name the node by its value and op, at the node's source location
 * when it has one: `models/llama.kiln:42:9: error: node %17 (matmul): ...`;
 * otherwise at `what`: `llama.ir: error: node %17 (matmul): ...`.
 */
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

/* The most elements a value may hold per token (for a weight: in all).
 * Far above any model (a 405B model's embedding is 2^31), low enough that
 * the element counts the shape rules and passes compute cannot overflow. */
#define KIR_VERIFY_MAX_ROW_ELEMS ((int64_t)1 << 48)

/* ---- what each op needs ----------------------------------------------------- */
static const char *const rope_styles[] = {"halves", "pairs", NULL};
static const char *const rope_scalings[] = {"none", "linear", "llama3", NULL};

typedef struct kir_attr_rule {
    kir_op op;                   /* the op that needs the attribute */
    const char *key;             /* its name */
    kir_attr_kind kind;          /* the kind it must have */
    const char *const *choices;  /* KIR_ATTR_STR: allowed words (NULL-ended), or NULL for any */
} kir_attr_rule;

static const kir_attr_rule attr_rules[] = {
    {KIR_OP_INPUT, "name", KIR_ATTR_STR, NULL},
    {KIR_OP_WEIGHT, "name", KIR_ATTR_STR, NULL},
    {KIR_OP_OUTPUT, "name", KIR_ATTR_STR, NULL},
    {KIR_OP_RMS_NORM, "eps", KIR_ATTR_FLOAT, NULL},
    {KIR_OP_LAYER_NORM, "eps", KIR_ATTR_FLOAT, NULL},
    {KIR_OP_SCALE, "value", KIR_ATTR_FLOAT, NULL},
    {KIR_OP_RESHAPE, "shape", KIR_ATTR_INTS, NULL},
    {KIR_OP_SLICE, "start", KIR_ATTR_INT, NULL},
    {KIR_OP_SLICE, "end", KIR_ATTR_INT, NULL},
    {KIR_OP_ROPE, "theta", KIR_ATTR_FLOAT, NULL},
    {KIR_OP_ROPE, "style", KIR_ATTR_STR, rope_styles},
    {KIR_OP_ROPE, "rot_dim", KIR_ATTR_INT, NULL},
    {KIR_OP_ROPE, "scaling", KIR_ATTR_STR, rope_scalings},
    {KIR_OP_ROPE, "factor", KIR_ATTR_FLOAT, NULL},
    {KIR_OP_ROPE, "low_freq_factor", KIR_ATTR_FLOAT, NULL},
    {KIR_OP_ROPE, "high_freq_factor", KIR_ATTR_FLOAT, NULL},
    {KIR_OP_ROPE, "original_max_positions", KIR_ATTR_INT, NULL},
    {KIR_OP_ATTENTION, "layer", KIR_ATTR_INT, NULL},
    {KIR_OP_ATTENTION, "scale", KIR_ATTR_FLOAT, NULL},
    {KIR_OP_ATTENTION, "window", KIR_ATTR_INT, NULL},
    {KIR_OP_ATTENTION, "softcap", KIR_ATTR_FLOAT, NULL},
};

/* Whether operand i of op may be KIR_NONE (an absent optional operand). */
static int operand_optional(kir_op op, int i)
{
    switch (op) {
    case KIR_OP_RMS_NORM: return i == 1;              /* weight */
    case KIR_OP_LAYER_NORM: return i == 1 || i == 2;  /* weight, bias */
    default: return 0;
    }
}

static const char *kind_name(kir_attr_kind k)
{
    switch (k) {
    case KIR_ATTR_INT: return "an int";
    case KIR_ATTR_FLOAT: return "a float";
    case KIR_ATTR_STR: return "a string";
    case KIR_ATTR_INTS: return "a list of ints";
    }
    return "an unknown kind";
}

/* ---- the checker's state ---------------------------------------------------------- */
typedef struct kir_verifier {
    const kir_graph *g;   /* the graph checked */
    ks_diag *d;           /* where messages go */
    const char *what;     /* names the graph where a node has no location */
    int errors;           /* errors reported */
    uint8_t *type_ok;     /* per node: its stored type is well formed (usable by consumers) */
    kir_val *seen;        /* open-addressing table for the uniqueness checks */
    size_t cap_seen;      /* slots in seen (a power of two) */
} kir_verifier;

/* Report "node %v (op): message" at the node's location. */
KS_PRINTF(3, 4)
static void node_error(kir_verifier *c, kir_val v, const char *fmt, ...)
{
    const kir_node *n = kir_node_at(c->g, v);
    ks_buf msg = {0};
    if (n->op < KIR_OP_COUNT)
        ks_buf_printf(&msg, "node %%%u (%s): ", (unsigned)v, kir_op_table[n->op].name);
    else
        ks_buf_printf(&msg, "node %%%u: ", (unsigned)v);
    va_list ap;
    va_start(ap, fmt);
    ks_buf_vprintf(&msg, fmt, ap);
    va_end(ap);
    if (n->loc.file < c->g->n_files && n->loc.line > 0) {
        ks_source src = {c->g->files[n->loc.file], NULL, 0};
        ks_error_at(c->d, &src, (int)n->loc.line, (int)n->loc.col, "%s", msg.data);
    } else {
        ks_error(c->d, c->what, "%s", msg.data);
    }
    ks_buf_free(&msg);
    c->errors++;
}

/* ---- per-node structure -------------------------------------------------------------- */

/* dtype, rank and dims are well formed. */
static int check_type(kir_verifier *c, kir_val v)
{
    const kir_node *n = kir_node_at(c->g, v);
    if ((unsigned)n->dtype >= KIR_DTYPE_COUNT) {
        node_error(c, v, "unknown dtype %d", (int)n->dtype);
        return -1;
    }
    if (n->ndim > KIR_MAX_DIMS) {
        node_error(c, v, "%d dims (at most %d)", n->ndim, KIR_MAX_DIMS);
        return -1;
    }
    int64_t row = 1; /* elements per token so far */
    for (int i = 0; i < n->ndim; i++) {
        int64_t dim = n->dims[i];
        int bad = dim <= 0 && dim != KIR_DIM_T;
        int huge = dim > 0 && row > KIR_VERIFY_MAX_ROW_ELEMS / dim;
        if (bad || huge) {
            ks_buf t = {0};
            kir_format_type(&t, n);
            if (bad)
                node_error(c, v, "bad dim %lld in %s: a dim is a positive integer or T", (long long)dim, t.data);
            else
                node_error(c, v, "dim %lld makes %s too large (more than 2^48 elements per token)",
                           (long long)dim, t.data);
            ks_buf_free(&t);
            return -1;
        }
        if (dim != KIR_DIM_T) row *= dim;
    }
    return 0;
}

/* Arity and operand order. */
static int check_operands(kir_verifier *c, kir_val v)
{
    const kir_node *n = kir_node_at(c->g, v);
    const kir_op_info *info = &kir_op_table[n->op];
    if (n->nin < info->min_inputs || n->nin > info->max_inputs) {
        if (info->min_inputs == info->max_inputs)
            node_error(c, v, "takes %d operand%s, has %d", info->min_inputs, info->min_inputs == 1 ? "" : "s",
                       n->nin);
        else
            node_error(c, v, "takes %d to %d operands, has %d", info->min_inputs, info->max_inputs, n->nin);
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < n->nin; i++) {
        kir_val in = n->in[i];
        if (in == KIR_NONE) {
            if (!operand_optional(n->op, i)) {
                node_error(c, v, "operand %d is absent (_), but %s needs it", i + 1, info->name);
                rc = -1;
            }
        } else if (in >= v) {
            node_error(c, v, "operand %d is %%%u, which is not defined before it", i + 1, (unsigned)in);
            rc = -1;
        }
    }
    return rc;
}

/* Required attributes: present, of their kind, holding an allowed word. */
static int check_attrs(kir_verifier *c, kir_val v)
{
    const kir_node *n = kir_node_at(c->g, v);
    int rc = 0;
    for (size_t r = 0; r < sizeof attr_rules / sizeof attr_rules[0]; r++) {
        const kir_attr_rule *rule = &attr_rules[r];
        if (rule->op != n->op) continue;
        const kir_attr *a = kir_get(c->g, v, rule->key);
        if (!a) {
            node_error(c, v, "missing attribute %s (%s)", rule->key, kind_name(rule->kind));
            rc = -1;
        } else if (a->kind != rule->kind) {
            node_error(c, v, "attribute %s is %s, not %s", rule->key, kind_name(a->kind), kind_name(rule->kind));
            rc = -1;
        } else if (rule->choices) {
            int found = 0;
            for (const char *const *w = rule->choices; *w && !found; w++) found = strcmp(*w, a->u.s) == 0;
            if (!found) {
                ks_buf words = {0};
                for (const char *const *w = rule->choices; *w; w++)
                    ks_buf_printf(&words, "%s\"%s\"", w == rule->choices ? "" : w[1] ? ", " : " or ", *w);
                node_error(c, v, "attribute %s is \"%s\", not %s", rule->key, a->u.s, words.data);
                ks_buf_free(&words);
                rc = -1;
            }
        }
    }
    return rc;
}

/* Stored type against the shape rule, on `copy` whose nodes hold the stored
 * types: run the rule for v, compare, and put the stored type back so that
 * v's consumers are checked against what the graph says. */
static void check_inferred_type(kir_verifier *c, kir_graph *copy, kir_val v)
{
    const kir_node *n = kir_node_at(c->g, v);
    kir_node *m = kir_node_at(copy, v);
    ks_buf err = {0};
    if (kir_infer(copy, v, &err) != 0) {
        /* The rule's message starts with the op's name, which node_error gives. */
        const char *msg = err.data ? err.data : "shape rule failed";
        size_t k = strlen(kir_op_table[n->op].name);
        if (strncmp(msg, kir_op_table[n->op].name, k) == 0 && strncmp(msg + k, ": ", 2) == 0) msg += k + 2;
        node_error(c, v, "%s", msg);
    } else if (m->dtype != n->dtype || m->ndim != n->ndim ||
               memcmp(m->dims, n->dims, sizeof(int64_t) * n->ndim) != 0) {
        ks_buf want = {0}, got = {0};
        kir_format_type(&want, n);
        kir_format_type(&got, m);
        node_error(c, v, "declared %s but %s %s", want.data, n->nin ? "operands give" : "its shape rule gives",
                   got.data);
        ks_buf_free(&want);
        ks_buf_free(&got);
    }
    ks_buf_free(&err);
    m->dtype = n->dtype;
    m->ndim = n->ndim;
    memcpy(m->dims, n->dims, sizeof m->dims);
}

/* ---- uniqueness ------------------------------------------------------------------------ */

static uint64_t key_hash(const kir_attr *a)
{
    if (a->kind == KIR_ATTR_STR) return ks_hash64(KS_HASH_SEED, a->u.s, strlen(a->u.s));
    return ks_hash64(KS_HASH_SEED, &a->u.i, sizeof a->u.i);
}

static int key_equal(const kir_attr *a, const kir_attr *b)
{
    if (a->kind != b->kind) return 0;
    if (a->kind == KIR_ATTR_STR) return strcmp(a->u.s, b->u.s) == 0;
    return a->u.i == b->u.i;
}

/* Among the nodes of op `op` whose attribute `key` has kind `kind`, report
 * each whose value an earlier one has already. */
static void check_unique(kir_verifier *c, kir_op op, const char *key, kir_attr_kind kind, const char *what)
{
    const kir_graph *g = c->g;
    size_t count = 0;
    for (size_t i = 0; i < g->n_nodes; i++) count += g->nodes[i].op == op;
    if (count < 2) return;
    size_t cap = 16;
    while (cap < count * 2) cap *= 2;
    if (cap > c->cap_seen) {
        free(c->seen);
        c->seen = ks_xmalloc(cap * sizeof *c->seen);
        c->cap_seen = cap;
    }
    for (size_t i = 0; i < cap; i++) c->seen[i] = KIR_NONE;
    for (size_t i = 0; i < g->n_nodes; i++) {
        if (g->nodes[i].op != op) continue;
        const kir_attr *a = kir_get(g, (kir_val)i, key);
        if (!a || a->kind != kind) continue; /* reported by check_attrs */
        for (size_t h = key_hash(a) & (cap - 1);; h = (h + 1) & (cap - 1)) {
            if (c->seen[h] == KIR_NONE) {
                c->seen[h] = (kir_val)i;
                break;
            }
            if (key_equal(kir_get(g, c->seen[h], key), a)) {
                if (kind == KIR_ATTR_STR)
                    node_error(c, (kir_val)i, "%s \"%s\" is used by node %%%u too", what, a->u.s,
                               (unsigned)c->seen[h]);
                else
                    node_error(c, (kir_val)i, "%s %lld is used by node %%%u too", what, (long long)a->u.i,
                               (unsigned)c->seen[h]);
                break;
            }
        }
    }
}

static void check_output(kir_verifier *c)
{
    const kir_graph *g = c->g;
    kir_val first = KIR_NONE;
    for (size_t i = 0; i < g->n_nodes; i++) {
        if (g->nodes[i].op != KIR_OP_OUTPUT) continue;
        if (first == KIR_NONE)
            first = (kir_val)i;
        else
            node_error(c, (kir_val)i, "a graph has one output, and node %%%u is one already", (unsigned)first);
    }
    if (first == KIR_NONE) {
        ks_error(c->d, c->what, "graph has no output");
        c->errors++;
    }
}

int kir_verify(const kir_graph *g, ks_diag *d, const char *what)
{
    kir_verifier c = {.g = g, .d = d, .what = what ? what : "<ir>"};
    c.type_ok = ks_xcalloc(g->n_nodes ? g->n_nodes : 1, 1);
    kir_graph *copy = kir_graph_clone(g);
    KS_ASSERT(g->n_nodes < KIR_NONE);

    for (size_t i = 0; i < g->n_nodes; i++) {
        kir_val v = (kir_val)i;
        const kir_node *n = kir_node_at(g, v);
        if ((unsigned)n->op >= KIR_OP_COUNT) {
            node_error(&c, v, "unknown op %d", (int)n->op);
            continue;
        }
        c.type_ok[i] = check_type(&c, v) == 0;
        int ok = c.type_ok[i];
        if (n->nin > KIR_MAX_INPUTS) {
            node_error(&c, v, "%d operands (at most %d)", n->nin, KIR_MAX_INPUTS);
            continue;
        }
        if (check_operands(&c, v)) ok = 0;
        if (check_attrs(&c, v)) ok = 0;
        /* The rule reads the operands' types: skip it when one is malformed
         * (already reported at that operand). */
        for (int k = 0; ok && k < n->nin; k++) ok = n->in[k] == KIR_NONE || c.type_ok[n->in[k]];
        if (ok) check_inferred_type(&c, copy, v);
    }
    check_unique(&c, KIR_OP_ATTENTION, "layer", KIR_ATTR_INT, "layer");
    check_unique(&c, KIR_OP_WEIGHT, "name", KIR_ATTR_STR, "weight name");
    check_unique(&c, KIR_OP_INPUT, "name", KIR_ATTR_STR, "input name");
    check_output(&c);

    kir_graph_free(copy);
    free(c.type_ok);
    free(c.seen);
    return c.errors;
}
