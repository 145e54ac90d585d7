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
 *  - every node's attributes are those ir/ops.def gives its op: the
 *    required ones present, each of its kind, a word of its set, a value
 *    its rule allows (a positive eps, a layer >= 0), no unknown ones; and
 *    what ties a node's attributes together (llama3 RoPE scaling's
 *    low_freq_factor < high_freq_factor);
 *  - attention `layer` numbers, kv_write `layer` numbers, weight names and
 *    input names are unique, and there is exactly one OUTPUT;
 *  - KV-cache writes are in order: an attention with write_kv=0 reads a
 *    layer that a kv_write earlier in the schedule wrote, and takes that
 *    kv_write and its v as its k and v; a layer a kv_write writes is not
 *    written again by an attention with write_kv=1 (check_kv_writes);
 *  - a derived weight (derive="concat0", or "concat1" along dim 1) names its sources and the rows
 *    each gives, and those add up to its first dim; a source still in the
 *    graph has the shape its rows say (check_derived);
 *  - `fuse` groups are legal kernels: contiguous in the schedule, ops with
 *    a fusion class only, at most one matmul or attention, and a norm only
 *    as the prologue of the group's matmul (its one use), or in a group
 *    with no matmul or attention at all (check_groups);
 *  - each node's stored dtype and dims equal what its shape rule computes
 *    from its operands' stored types (so one wrong type is one error, not a
 *    cascade down the graph);
 *  - when all that holds: the memory plan the graph carries, if any, is
 *    sound (kir_verify_plan, ir/plan.h: every runtime writes each value
 *    where the plan says, so a wrong plan is a crash or wrong output).
 * Values the shapes depend on (a rot_dim within the head, a slice within
 * its operand) are the shape rules' to check.
 *
 * Messages name the node by its value and op, at the node's source location
 * when it has one: `models/llama.kiln:42:9: error: node %17 (matmul): ...`;
 * otherwise at `what`: `llama.ir: error: node %17 (matmul): ...`.
 *
 * Out of memory (the runtime verifies an engine's graph when it opens it) is
 * an error, `what: error: out of memory (...)`, reported once; the checks
 * that needed the memory are skipped.
 */
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "ir/plan.h"

/* The most elements a value may hold per token (for a weight: in all).
 * Far above any model (a 405B model's embedding is 2^31), low enough that
 * the element counts the shape rules and passes compute cannot overflow. */
#define KIR_VERIFY_MAX_ROW_ELEMS ((int64_t)1 << 48)

/* ---- what each op needs ----------------------------------------------------- */
/* Attributes: the schema of ir/ops.def (kir_attr_table), checked by check_attrs. */

/* Whether operand i of op may be KIR_NONE (an absent optional operand). */
static int operand_optional(kir_op op, int i)
{
    switch (op) {
    case KIR_OP_RMS_NORM: return i == 1;              /* weight */
    case KIR_OP_LAYER_NORM: return i == 1 || i == 2;  /* weight, bias */
    default: return 0;
    }
}

static const char *kind_name(int k)
{
    switch (k) {
    case KIR_ATTR_INT: return "an int";
    case KIR_ATTR_FLOAT: return "a float";
    case KIR_ATTR_STR: return "a string";
    case KIR_ATTR_INTS: return "a list of ints";
    case KIR_ATTR_FLOATS: return "a list of floats";
    case KIR_ATTR_WORD: return "a string";
    }
    return "an unknown kind";
}

/* ---- the checker's state ---------------------------------------------------------- */
typedef struct kir_verifier {
    const kir_graph *g;   /* the graph checked */
    ks_diag *d;           /* where messages go */
    const char *what;     /* names the graph where a node has no location */
    int errors;           /* errors reported */
    int oom;              /* 1: out of memory was reported (once) */
    uint8_t *type_ok;     /* per node: its stored type is well formed (usable by consumers) */
} kir_verifier;

/* Out of memory for `for` (bytes; 0 when not known): an error, reported once. */
static void verify_oom(kir_verifier *c, size_t bytes, const char *for_what)
{
    if (c->oom) return;
    c->oom = 1;
    ks_error_oom(c->d, c->what, bytes, for_what);
    c->errors++;
}

/* Report "node %v (op): message" at the node's location. */
KS_PRINTF(3, 4)
static void node_error(kir_verifier *c, kir_val v, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kir_node_verror(c->d, c->g, v, c->what, NULL, fmt, ap);
    va_end(ap);
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
            ks_buf t = KS_BUF_TRY;
            kir_format_type(&t, n);
            if (bad)
                node_error(c, v, "bad dim %lld in %s: a dim is a positive integer or T", (long long)dim,
                           ks_buf_cstr(&t));
            else
                node_error(c, v, "dim %lld makes %s too large (more than 2^48 elements per token)",
                           (long long)dim, ks_buf_cstr(&t));
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

/* Attribute a of node v (the schema's): present unless optional, of its
 * kind, a word of its set, a value its rule allows. */
static int check_attr(kir_verifier *c, kir_val v, kir_attr_id id)
{
    const kir_attr_info *info = &kir_attr_table[id];
    const kir_attr *a = kir_get(c->g, v, info->key);
    if (!a) {
        if (!info->required) return 0;
        node_error(c, v, "missing attribute %s (%s)", info->key, kind_name(info->kind));
        return -1;
    }
    int stored = info->kind == KIR_ATTR_WORD ? KIR_ATTR_STR : info->kind;
    if ((int)a->kind != stored) {
        node_error(c, v, "attribute %s is %s, not %s", info->key, kind_name(a->kind), kind_name(info->kind));
        return -1;
    }
    if (info->kind == KIR_ATTR_WORD && kir_word_lookup(info->set, a->u.s) == KIR_WORD_COUNT) {
        ks_buf words = KS_BUF_TRY;
        int n = 0, k = 0;
        for (int w = 0; w < KIR_WORD_COUNT; w++) n += kir_word_table[w].set == info->set;
        for (int w = 0; w < KIR_WORD_COUNT; w++) {
            if (kir_word_table[w].set != info->set) continue;
            ks_buf_printf(&words, "%s\"%s\"", k == 0 ? "" : k == n - 1 ? " or " : ", ", kir_word_table[w].text);
            k++;
        }
        node_error(c, v, "attribute %s is \"%s\", not %s", info->key, a->u.s, ks_buf_cstr(&words));
        ks_buf_free(&words);
        return -1;
    }
    if (a->kind == KIR_ATTR_INT || a->kind == KIR_ATTR_FLOAT) {
        double x = a->kind == KIR_ATTR_INT ? (double)a->u.i : a->u.f;
        if (!kir_rule_holds(info->rule, x)) {
            if (a->kind == KIR_ATTR_INT)
                node_error(c, v, "attribute %s is %lld; it %s", info->key, (long long)a->u.i, kir_rule_text(info->rule));
            else
                node_error(c, v, "attribute %s is %g; it %s", info->key, a->u.f, kir_rule_text(info->rule));
            return -1;
        }
    }
    for (uint32_t i = 0; a->kind == KIR_ATTR_FLOATS && i < a->u.floats.n; i++)
        if (!kir_rule_holds(info->rule, a->u.floats.v[i])) {
            node_error(c, v, "attribute %s[%u] is %g; it %s", info->key, i, a->u.floats.v[i], kir_rule_text(info->rule));
            return -1;
        }
    return 0;
}

/* The schema's attributes of v's op (and those of any op), and no others;
 * then what ties a node's attributes together. */
static int check_attrs(kir_verifier *c, kir_val v)
{
    const kir_graph *g = c->g;
    const kir_node *n = kir_node_at(g, v);
    int rc = 0;
    for (int a = 0; a < KIR_A_COUNT; a++)
        if ((kir_attr_table[a].op == n->op || kir_attr_table[a].op == KIR_OP_ANY) && check_attr(c, v, (kir_attr_id)a))
            rc = -1;
    for (uint32_t i = 0; i < n->nattrs; i++) {
        if (kir_attr_lookup(n->op, n->attrs[i].key) == KIR_A_COUNT) {
            node_error(c, v, "unknown attribute %s (ir/ops.def lists what %s takes)", n->attrs[i].key,
                       kir_op_table[n->op].name);
            rc = -1;
        }
    }
    const kir_attr *lo = n->op == KIR_OP_ROPE ? kir_get(g, v, "low_freq_factor") : NULL;
    const kir_attr *hi = n->op == KIR_OP_ROPE ? kir_get(g, v, "high_freq_factor") : NULL;
    int factors_ok = lo && hi && lo->kind == KIR_ATTR_FLOAT && hi->kind == KIR_ATTR_FLOAT;
    if (factors_ok && kir_attr_word(g, v, KIR_A_ROPE_SCALING) == KIR_ROPE_SCALING_LLAMA3 &&
        !(kir_attr_float(g, v, KIR_A_ROPE_HIGH_FREQ_FACTOR) > kir_attr_float(g, v, KIR_A_ROPE_LOW_FREQ_FACTOR))) {
        node_error(c, v, "llama3 scaling needs low_freq_factor < high_freq_factor (got %g and %g)",
                   kir_attr_float(g, v, KIR_A_ROPE_LOW_FREQ_FACTOR), kir_attr_float(g, v, KIR_A_ROPE_HIGH_FREQ_FACTOR));
        rc = -1;
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
    ks_buf err = KS_BUF_TRY;
    if (kir_infer(copy, v, &err) != 0) {
        /* The rule's message starts with the op's name, which node_error gives. */
        const char *msg = err.len ? ks_buf_cstr(&err) : "shape rule failed";
        size_t k = strlen(kir_op_table[n->op].name);
        if (strncmp(msg, kir_op_table[n->op].name, k) == 0 && strncmp(msg + k, ": ", 2) == 0) msg += k + 2;
        node_error(c, v, "%s", msg);
    } else if (m->dtype != n->dtype || m->ndim != n->ndim ||
               memcmp(m->dims, n->dims, sizeof(int64_t) * n->ndim) != 0) {
        ks_buf want = KS_BUF_TRY, got = KS_BUF_TRY;
        kir_format_type(&want, n);
        kir_format_type(&got, m);
        node_error(c, v, "declared %s but %s %s", ks_buf_cstr(&want), n->nin ? "operands give" : "its shape rule gives",
                   ks_buf_cstr(&got));
        ks_buf_free(&want);
        ks_buf_free(&got);
    }
    ks_buf_free(&err);
    m->dtype = n->dtype;
    m->ndim = n->ndim;
    memcpy(m->dims, n->dims, sizeof m->dims);
}

/* ---- uniqueness ------------------------------------------------------------------------ */

/* Among the nodes of op `op` whose attribute `key` has kind `kind`, report
 * each whose value an earlier one has already. */
static void check_unique(kir_verifier *c, kir_op op, const char *key, kir_attr_kind kind, const char *what)
{
    const kir_graph *g = c->g;
    size_t count = 0;
    for (size_t i = 0; i < g->n_nodes; i++) count += g->nodes[i].op == op;
    if (count < 2) return;
    ks_hmap first; /* the value -> the first node that has it */
    if (ks_hmap_init(&first, NULL, count, count, "attribute values") != 0) {
        verify_oom(c, 0, "checking that names are unique");
        return;
    }
    for (size_t i = 0; i < g->n_nodes; i++) {
        if (g->nodes[i].op != op) continue;
        const kir_attr *a = kir_get(g, (kir_val)i, key);
        if (!a || a->kind != kind) continue; /* reported by check_attrs */
        int added;
        uint64_t *at = kind == KIR_ATTR_STR ? ks_hmap_put_str(&first, a->u.s, strlen(a->u.s), &added)
                                            : ks_hmap_put_u64(&first, (uint64_t)a->u.i, &added);
        if (!at) { /* not with room for count keys */
            verify_oom(c, 0, "checking that names are unique");
            break;
        }
        if (added)
            *at = i;
        else if (kind == KIR_ATTR_STR)
            node_error(c, (kir_val)i, "%s \"%s\" is used by node %%%u too", what, a->u.s, (unsigned)*at);
        else
            node_error(c, (kir_val)i, "%s %lld is used by node %%%u too", what, (long long)a->u.i, (unsigned)*at);
    }
    ks_hmap_free(&first);
}

/* ---- KV-cache writes ------------------------------------------------------------------- */

/* A kv_write and the layer it writes. */
typedef struct layer_writer {
    int64_t layer; /* the `layer` attribute */
    kir_val node;  /* the kv_write */
} layer_writer;

static int compare_writers(const void *a, const void *b)
{
    const layer_writer *x = a, *y = b;
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    return (x->node > y->node) - (x->node < y->node);
}

/* The first kv_write of `layer` among w (sorted), or KIR_NONE. */
static kir_val find_writer(const layer_writer *w, size_t n, int64_t layer)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (w[mid].layer < layer)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && w[lo].layer == layer ? w[lo].node : KIR_NONE;
}

static void check_kv_writes(kir_verifier *c)
{
    const kir_graph *g = c->g;
    size_t n = 0;
    for (size_t i = 0; i < g->n_nodes; i++) n += g->nodes[i].op == KIR_OP_KV_WRITE;
    layer_writer *w = ks_try_calloc(n ? n : 1, sizeof *w);
    if (!w) {
        verify_oom(c, sizeof *w * (n ? n : 1), "checking the KV-cache writes");
        return;
    }
    n = 0;
    for (size_t i = 0; i < g->n_nodes; i++) {
        const kir_attr *a = g->nodes[i].op == KIR_OP_KV_WRITE ? kir_get(g, (kir_val)i, "layer") : NULL;
        if (a && a->kind == KIR_ATTR_INT) w[n++] = (layer_writer){a->u.i, (kir_val)i};
    }
    qsort(w, n, sizeof *w, compare_writers);
    for (size_t i = 0; i < g->n_nodes; i++) {
        kir_val v = (kir_val)i;
        const kir_node *att = kir_node_at(g, v);
        const kir_attr *layer = att->op == KIR_OP_ATTENTION ? kir_get(g, v, "layer") : NULL;
        if (!layer || layer->kind != KIR_ATTR_INT) continue; /* check_attrs reported it */
        const kir_attr *wk = kir_get(g, v, "write_kv");
        if (wk && wk->kind != KIR_ATTR_INT) continue;
        int64_t write = wk ? wk->u.i : 1, l = layer->u.i;
        if (write != 0 && write != 1) continue; /* check_attrs reported it */
        kir_val kw = find_writer(w, n, l);
        if (write == 1) {
            if (kw != KIR_NONE)
                node_error(c, v, "layer %lld is written by kv_write node %%%u already; attention writes it only "
                           "with write_kv=1 (absent), so set write_kv=0",
                           (long long)l, (unsigned)kw);
            continue;
        }
        const kir_node *kwn = kw != KIR_NONE ? kir_node_at(g, kw) : NULL;
        if (!kwn)
            node_error(c, v, "write_kv=0 reads layer %lld from the KV cache, but no kv_write writes it", (long long)l);
        else if (kw > v)
            node_error(c, v, "write_kv=0 reads layer %lld, but the kv_write that writes it (node %%%u) comes after it",
                       (long long)l, (unsigned)kw);
        else if (att->nin == 3 && kwn->nin == 2 && (att->in[1] != kw || att->in[2] != kwn->in[1]))
            node_error(c, v, "with write_kv=0, k and v are the kv_write of layer %lld (node %%%u) and its v (%%%u)",
                       (long long)l, (unsigned)kw, (unsigned)kwn->in[1]);
    }
    free(w);
}

/* ---- derived weights ------------------------------------------------------------------- */

/* A weight by its name, for lookups of a derived weight's sources. */
typedef struct named_weight {
    const char *name; /* its `name` attribute */
    kir_val node;     /* the WEIGHT node */
} named_weight;

static int compare_named(const void *a, const void *b)
{
    return strcmp(((const named_weight *)a)->name, ((const named_weight *)b)->name);
}

/* The WEIGHT node named by the len bytes at name, among the weights sorted
 * by name, or KIR_NONE. */
static kir_val find_weight(const named_weight *w, size_t n, const char *name, size_t len)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int cmp = strncmp(w[mid].name, name, len);
        if (cmp == 0 && w[mid].name[len] != 0) cmp = 1;
        if (cmp < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < n && strncmp(w[lo].name, name, len) == 0 && w[lo].name[len] == 0) return w[lo].node;
    return KIR_NONE;
}

/* One derived weight: its recipe is whole and adds up. */
static void check_derived_weight(kir_verifier *c, kir_val v, const named_weight *by_name, size_t n_weights)
{
    const kir_graph *g = c->g;
    const kir_node *n = kir_node_at(g, v);
    const kir_attr *derive = kir_get(g, v, "derive"), *sources = kir_get(g, v, "sources");
    const kir_attr *rows = kir_get(g, v, "rows");
    if (!derive || !sources || !rows) {
        node_error(c, v, "a derived weight needs derive, sources and rows; %s is missing",
                   !derive ? "derive" : !sources ? "sources" : "rows");
        return;
    }
    if (derive->kind != KIR_ATTR_STR || sources->kind != KIR_ATTR_STR || rows->kind != KIR_ATTR_INTS ||
        (strcmp(derive->u.s, "concat0") != 0 && strcmp(derive->u.s, "concat1") != 0 && strcmp(derive->u.s, "offset") != 0 &&
         strcmp(derive->u.s, "smooth") != 0))
        return; /* check_attrs reported it */
    const int along = strcmp(derive->u.s, "concat1") == 0; /* the dim the sources' rows make up */
    uint32_t count = 1;
    for (const char *p = sources->u.s; *p; p++) count += *p == ',';
    if ((strcmp(derive->u.s, "offset") == 0 || strcmp(derive->u.s, "smooth") == 0) && count != 1) {
        node_error(c, v, "a%s %s weight derives from one source, not %u", derive->u.s[0] == 'o' ? "n" : "", derive->u.s,
                   (unsigned)count);
        return;
    }
    if (strcmp(derive->u.s, "smooth") == 0 && !kir_attr_str(g, v, KIR_A_WEIGHT_SMOOTH_OF)) {
        node_error(c, v, "a smooth weight needs smooth_of, the quantized weight whose smoothing divides it");
        return;
    }
    if (count != rows->u.ints.n) {
        node_error(c, v, "sources names %u weight%s but rows has %u number%s", (unsigned)count, count == 1 ? "" : "s",
                   (unsigned)rows->u.ints.n, rows->u.ints.n == 1 ? "" : "s");
        return;
    }
    int64_t sum = 0;
    for (uint32_t i = 0; i < rows->u.ints.n; i++) {
        int64_t r = rows->u.ints.v[i];
        if (r <= 0 || r > ((int64_t)1 << 48)) {
            node_error(c, v, "rows[%u] is %lld: each source gives at least one row", (unsigned)i, (long long)r);
            return;
        }
        sum += r;
    }
    /* a part of a quantization derives the float matrix it quantizes: its dims, any float dtype */
    const int quant = kir_weight_quant_part(g, v) && n->ndim == 2 && c->type_ok[v];
    int64_t data_dims[KIR_MAX_DIMS];
    memcpy(data_dims, n->dims, sizeof data_dims);
    if (quant) kir_quant_data_dims(g, v, data_dims);
    if (n->ndim < along + 1 || sum != data_dims[along]) {
        ks_buf t = KS_BUF_TRY;
        kir_format_type(&t, n);
        node_error(c, v, "rows add up to %lld, but the weight is %s%s", (long long)sum, ks_buf_cstr(&t),
                   along ? " (concat1: rows along dim 1)" : "");
        ks_buf_free(&t);
        return;
    }
    const char *name = sources->u.s;
    for (uint32_t i = 0; i < count; i++) {
        const char *end = strchr(name, ',');
        size_t len = end ? (size_t)(end - name) : strlen(name);
        if (len == 0) {
            node_error(c, v, "sources \"%s\": name %u is empty", sources->u.s, (unsigned)i + 1);
            return;
        }
        kir_val src = find_weight(by_name, n_weights, name, len);
        if (src != KIR_NONE && c->type_ok[src]) {
            /* a source still in the graph gives rows[i] rows of the same row type */
            const kir_node *s = kir_node_at(g, src);
            int fits = (quant ? !kir_dtype_is_quantized(s->dtype) : s->dtype == n->dtype) && s->ndim == n->ndim &&
                       s->dims[along] == rows->u.ints.v[i];
            for (int d = 0; fits && d < n->ndim; d++) fits = d == along || s->dims[d] == data_dims[d];
            if (!fits) {
                ks_buf ts = KS_BUF_TRY, tn = KS_BUF_TRY;
                kir_format_type(&ts, s);
                kir_format_type(&tn, n);
                node_error(c, v, "source \"%.*s\" (node %%%u) is %s, not %lld rows%s of %s", (int)len, name,
                           (unsigned)src, ks_buf_cstr(&ts), (long long)rows->u.ints.v[i], along ? " along dim 1" : "",
                           ks_buf_cstr(&tn));
                ks_buf_free(&ts);
                ks_buf_free(&tn);
            }
        }
        name += len + 1;
    }
}

static void check_derived(kir_verifier *c)
{
    const kir_graph *g = c->g;
    size_t n_weights = 0, n_derived = 0;
    for (size_t i = 0; i < g->n_nodes; i++) {
        if (g->nodes[i].op != KIR_OP_WEIGHT) continue;
        n_weights++;
        kir_val v = (kir_val)i;
        n_derived += kir_get(g, v, "derive") || kir_get(g, v, "sources") || kir_get(g, v, "rows");
    }
    if (!n_derived) return;
    named_weight *by_name = ks_try_calloc(n_weights, sizeof *by_name);
    if (!by_name) {
        verify_oom(c, sizeof *by_name * n_weights, "checking the derived weights");
        return;
    }
    n_weights = 0;
    for (size_t i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == KIR_OP_WEIGHT)
            by_name[n_weights++] = (named_weight){kir_get_str(g, (kir_val)i, "name", ""), (kir_val)i};
    qsort(by_name, n_weights, sizeof *by_name, compare_named);
    for (size_t i = 0; i < g->n_nodes; i++) {
        kir_val v = (kir_val)i;
        if (g->nodes[i].op == KIR_OP_WEIGHT &&
            (kir_get(g, v, "derive") || kir_get(g, v, "sources") || kir_get(g, v, "rows")))
            check_derived_weight(c, v, by_name, n_weights);
    }
    free(by_name);
}

/* ---- fusion groups ----------------------------------------------------------------------- */

/* The group of v: its `fuse` id, or -1 when it has none or a malformed one
 * (which check_attrs reports); an op that cannot join a group is reported here. */
static int64_t group_of(kir_verifier *c, kir_val v)
{
    const kir_attr *a = kir_get(c->g, v, "fuse");
    if (!a || a->kind != KIR_ATTR_INT || a->u.i < 0) return -1; /* check_attrs reported a bad one */
    kir_op op = kir_node_at(c->g, v)->op;
    if (kir_op_table[op].fusion == KIR_FUSE_NONE) {
        node_error(c, v, "fuse group %lld: %s cannot join a group (its fusion class in ir/ops.def is none)",
                   (long long)a->u.i, kir_op_table[op].name);
        return -1;
    }
    return a->u.i;
}

/* Groups: contiguous runs; per run at most one matmul or attention (the
 * anchor), and a norm only before the matmul whose only input it is, or in
 * a group with no anchor (add + norm), or as many as the group has ropes,
 * each norm's one use the rope after it (head norms: fuse_norm_rope). */
static void check_groups(kir_verifier *c)
{
    const kir_graph *g = c->g;
    int any = 0;
    for (size_t i = 0; i < g->n_nodes && !any; i++) any = kir_get(g, (kir_val)i, "fuse") != NULL;
    if (!any) return;
    uint32_t *uses = ks_try_calloc(g->n_nodes, sizeof *uses);
    if (!uses) {
        verify_oom(c, sizeof *uses * g->n_nodes, "checking the fuse groups");
        return;
    }
    for (size_t i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].nin && k < KIR_MAX_INPUTS; k++)
            if (g->nodes[i].in[k] < i) uses[g->nodes[i].in[k]]++;
    ks_hmap last; /* group id -> the last node of its run so far */
    ks_hmap_init(&last, NULL, 0, g->n_nodes, "fuse groups");

    int64_t run = -1;                        /* the group of the run the previous node is in; -1: none */
    kir_val anchor = KIR_NONE, norm = KIR_NONE; /* the run's matmul or attention, and its norm */
    for (size_t i = 0; i < g->n_nodes; i++) {
        kir_val v = (kir_val)i;
        const kir_node *n = kir_node_at(g, v);
        if ((unsigned)n->op >= KIR_OP_COUNT) continue;
        int64_t id = group_of(c, v);
        if (id != run && id >= 0) {
            /* a run starts: the id must not have had one before */
            const uint64_t *before = ks_hmap_get_u64(&last, (uint64_t)id);
            if (before)
                node_error(c, v, "fuse group %lld is not contiguous: it has nodes up to %%%u, then %%%u is not in it",
                           (long long)id, (unsigned)*before, (unsigned)*before + 1);
            anchor = norm = KIR_NONE;
        }
        run = id;
        if (id < 0) continue;
        uint64_t *at = ks_hmap_put_u64(&last, (uint64_t)id, NULL);
        if (!at) {
            verify_oom(c, 0, "checking the fuse groups");
            break;
        }
        *at = v;
        kir_fusion_class fc = kir_op_table[n->op].fusion;
        if (fc == KIR_FUSE_MATMUL || n->op == KIR_OP_ATTENTION) {
            if (anchor != KIR_NONE) {
                node_error(c, v, "fuse group %lld has a second matmul or attention (node %%%u is its first): a "
                           "kernel has one", (long long)id, (unsigned)anchor);
                continue;
            }
            anchor = v;
            if (norm == KIR_NONE) continue;
            if (n->op != KIR_OP_MATMUL && n->op != KIR_OP_EXPERT_MATMUL)
                node_error(c, norm, "fuse group %lld: a norm and an %s (node %%%u) cannot share a kernel",
                           (long long)id, kir_op_table[n->op].name, (unsigned)v);
            else if (n->in[0] != norm || uses[norm] != 1)
                node_error(c, norm, "fuse group %lld: a norm joins a matmul's group only as its prologue, so its one "
                           "use must be matmul %%%u's input (it has %u use%s)",
                           (long long)id, (unsigned)v, (unsigned)uses[norm], uses[norm] == 1 ? "" : "s");
        } else if (fc == KIR_FUSE_NORM) {
            /* a norm over each head whose one use is the next node, its group's rope (fuse_norm_rope's
             * pairs: an attention's q and k may share a kernel) is no second norm */
            const kir_node *r = i + 1 < g->n_nodes ? kir_node_at(g, v + 1) : NULL;
            const int head_norm = uses[v] == 1 && r && r->op == KIR_OP_ROPE && r->nin > 0 && r->in[0] == v &&
                                  group_of(c, v + 1) == id;
            if (head_norm && anchor == KIR_NONE) continue;
            if (norm != KIR_NONE)
                node_error(c, v, "fuse group %lld has a second norm (node %%%u is its first): a kernel has one",
                           (long long)id, (unsigned)norm);
            else if (anchor != KIR_NONE)
                node_error(c, v, "fuse group %lld: a norm after the group's %s (node %%%u); a norm joins only before "
                           "its matmul, as a prologue", (long long)id, kir_op_table[kir_node_at(g, anchor)->op].name,
                           (unsigned)anchor);
            else
                norm = v;
        }
    }
    ks_hmap_free(&last);
    free(uses);
}

/* One KV cache: every attention and kv_write stores its rows as one dtype. */
static void check_kv_dtype(kir_verifier *c)
{
    const kir_graph *g = c->g;
    kir_val first = KIR_NONE;
    for (size_t i = 0; i < g->n_nodes; i++) {
        kir_op op = g->nodes[i].op;
        if (op != KIR_OP_ATTENTION && op != KIR_OP_KV_WRITE) continue;
        const kir_attr *a = kir_get(g, (kir_val)i, "kv_dtype");
        if (a && (a->kind != KIR_ATTR_STR || kir_word_lookup(KIR_SET_KV_DTYPE, a->u.s) == KIR_WORD_COUNT))
            continue; /* check_attrs reported it */
        if (first == KIR_NONE) first = (kir_val)i;
        /* v_in_k: v is each head's first dims of k (passes/share_kv.c proves it): as many heads, no more dims */
        const kir_val ki = g->nodes[i].in[op == KIR_OP_ATTENTION ? 1 : 0], vi = g->nodes[i].in[op == KIR_OP_ATTENTION ? 2 : 1];
        const kir_node *kn = ki < i ? &g->nodes[ki] : NULL, *vn = vi < i ? &g->nodes[vi] : NULL;
        if (kir_attr_int(g, (kir_val)i, op == KIR_OP_ATTENTION ? KIR_A_ATTENTION_V_IN_K : KIR_A_KV_WRITE_V_IN_K) && kn &&
            vn && kn->ndim == 3 && vn->ndim == 3 && (vn->dims[1] != kn->dims[1] || vn->dims[2] > kn->dims[2]))
            node_error(c, (kir_val)i, "v_in_k=1, but v [T,%lld,%lld] is not the first dims of each head of k [T,%lld,%lld]",
                       (long long)vn->dims[1], (long long)vn->dims[2], (long long)kn->dims[1], (long long)kn->dims[2]);
        if (first != (kir_val)i && kir_kv_dtype(g, (kir_val)i) != kir_kv_dtype(g, first))
            node_error(c, (kir_val)i, "kv_dtype=%s, but node %%%u stores the KV cache as %s: the cache has one dtype",
                       kir_dtype_name(kir_kv_dtype(g, (kir_val)i)), (unsigned)first,
                       kir_dtype_name(kir_kv_dtype(g, first)));
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
    KS_ASSERT(g->n_nodes < KIR_NONE);
    /* The shape rules write the type they compute into the node: they run on
     * a copy of the nodes (sharing g's attributes, which they only read), whose
     * stored types stand for g's. */
    c.type_ok = ks_try_calloc(g->n_nodes ? g->n_nodes : 1, 1);
    kir_graph copy_graph = *g, *copy = &copy_graph;
    copy->nodes = c.type_ok ? ks_try_calloc(g->n_nodes ? g->n_nodes : 1, sizeof *copy->nodes) : NULL;
    if (!copy->nodes) {
        free(c.type_ok);
        verify_oom(&c, (g->n_nodes ? g->n_nodes : 1) * (1 + sizeof *copy->nodes), "verifying the graph");
        return c.errors;
    }
    if (g->n_nodes) memcpy(copy->nodes, g->nodes, g->n_nodes * sizeof *copy->nodes);

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
    check_unique(&c, KIR_OP_KV_WRITE, "layer", KIR_ATTR_INT, "layer");
    check_kv_writes(&c);
    check_kv_dtype(&c);
    check_derived(&c);
    if (c.errors == 0) c.errors += kir_verify_quant(g, d, c.what);
    check_groups(&c);
    check_output(&c);
    /* the plan's checker needs a sound graph: operands, types and groups */
    if (c.errors == 0) c.errors += kir_verify_plan(g, d, c.what);

    free(copy->nodes);
    free(c.type_ok);
    return c.errors;
}
