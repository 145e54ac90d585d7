/*
 * interp.c — the reference interpreter's driver (runtime/interp/interp.h): prepares a
 * verified graph (weights read where they lie, in their own dtype; rotation
 * frequencies; checks against the KV cache), places each step's values in
 * one arena, checks the step and runs the kernels of
 * runtime/interp/interp_kernels.c in schedule order.
 *
 * KV_WRITE writes K/V rows as ATTENTION does; ATTENTION with write_kv=0
 * only reads them; `fuse` groups are ignored (node by node is the reference).
 *
 * Requires: a graph that kir_verify accepts (checked again here, cheaply:
 * the kernels index memory by the graph's shapes). Guarantees: a step that
 * fails its checks changes nothing (no KV rows are written). Does not: fuse,
 * alias views, or reuse buffers between values (the memory planner will;
 * plan_places below is the one function it replaces).
 */
#include "runtime/interp/interp.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/interp/interp_kernels.h"

/* Values with no place in the arena (weights, inputs, the output). */
#define KIR_NOWHERE SIZE_MAX

/* Threads a large matmul may use at most. */
enum { INTERP_MAX_THREADS = 8 };

struct krt_interp {
    const kir_graph *g;        /* the graph; not owned, outlives the interpreter */
    krt_kv *kv;                /* the paged KV cache; not owned; NULL when the graph has no attention */
    const char *name;          /* what step errors are reported against: the model's name */
    int has_attention;         /* 1 when a step reads and writes the KV cache */
    int n_threads;             /* worker threads for large matmuls */
    const void **weights;      /* [n_nodes] data of WEIGHT nodes in their dtype: the caller's, or owned */
    void **owned;              /* [n_nodes] aligned copies made here of weights the caller's data misaligns */
    size_t owned_bytes;        /* bytes in owned: krt_interp_weight_bytes */
    krt_interp_rope *rope;       /* [n_nodes] rotation frequencies of ROPE nodes */
    size_t *places;            /* [n_nodes] offset of each value in the arena, floats; KIR_NOWHERE */
    float *arena;              /* the step's values */
    size_t arena_cap;          /* floats allocated in arena */
    const float **src;         /* [n_nodes] per step: data of each float value */
    float **dst;               /* [n_nodes] per step: where each computed value goes */
    const int32_t **ints;      /* [n_nodes] per step: data of each i32 value */
    int64_t *order;            /* scratch [3 * n_tokens]: (seq, pos, token) keys for the duplicate check */
    size_t order_cap;          /* capacity of order, in keys */
    krt_tap_fn tap;            /* called after each computed value, or NULL */
    void *tap_ctx;             /* passed to tap */
};

/* ---- messages ---------------------------------------------------------------------- */
static const char *graph_name(const kir_graph *g) { return g->name && g->name[0] ? g->name : "interp"; }

/* An error about node v, at its place in the source when it has one. */
static int node_error(ks_diag *d, const kir_graph *g, kir_val v, const char *fmt, ...) KS_PRINTF(4, 5);
static int node_error(ks_diag *d, const kir_graph *g, kir_val v, const char *fmt, ...)
{
    const kir_node *n = &g->nodes[v];
    ks_buf msg = {0};
    va_list ap;
    va_start(ap, fmt);
    ks_buf_vprintf(&msg, fmt, ap);
    va_end(ap);
    if (n->loc.file < g->n_files && n->loc.line > 0) {
        ks_source src = {g->files[n->loc.file], NULL, 0};
        ks_error_at(d, &src, (int)n->loc.line, (int)n->loc.col, "%s: %s", kir_op_table[n->op].name,
                    ks_buf_cstr(&msg));
    } else {
        ks_error(d, graph_name(g), "%s: %s", kir_op_table[n->op].name, ks_buf_cstr(&msg));
    }
    ks_buf_free(&msg);
    return -1;
}

/* ---- the KV layout ------------------------------------------------------------------- */
/* The K and V operands of a node that writes or reads the cache (ATTENTION,
 * KV_WRITE), or -1 for other nodes. */
static int kv_operands(const kir_node *n, kir_val *k, kir_val *v)
{
    if (n->op == KIR_OP_ATTENTION) {
        *k = n->in[1];
        *v = n->in[2];
        return 0;
    }
    if (n->op == KIR_OP_KV_WRITE) {
        *k = n->in[0];
        *v = n->in[1];
        return 0;
    }
    return -1;
}

krt_kv_layer *krt_kv_layers_of(const kir_graph *g, int *n_layers)
{
    int64_t n = 0;
    kir_val k, val;
    for (size_t v = 0; v < g->n_nodes; v++) {
        if (kv_operands(&g->nodes[v], &k, &val) != 0) continue;
        int64_t l = kir_get_int(g, (kir_val)v, "layer", 0);
        if (l >= 0 && l < INT32_MAX && l + 1 > n) n = l + 1;
    }
    *n_layers = (int)n;
    if (n == 0) return NULL;
    /* A layer number no ATTENTION or KV_WRITE uses stays {0,0,0}: the cache stores nothing for it. */
    krt_kv_layer *layers = ks_xcalloc((size_t)n, sizeof *layers);
    for (size_t v = 0; v < g->n_nodes; v++) {
        if (kv_operands(&g->nodes[v], &k, &val) != 0) continue;
        int64_t l = kir_get_int(g, (kir_val)v, "layer", 0);
        if (l < 0 || l >= n || layers[l].kv_heads != 0) continue; /* the first one decides */
        const kir_node *kn = &g->nodes[k], *vn = &g->nodes[val];
        layers[l] = (krt_kv_layer){(int)kn->dims[1], (int)kn->dims[2], (int)vn->dims[2]};
    }
    return layers;
}

int64_t krt_output_row_elems(const kir_graph *g)
{
    for (size_t v = 0; v < g->n_nodes; v++)
        if (g->nodes[v].op == KIR_OP_OUTPUT) return kir_row_elems(&g->nodes[v]);
    return -1;
}

/* ---- creation ------------------------------------------------------------------------- */
/* The kernels read weights of any float dtype where they lie (f16 and bf16
 * converted as they go: interp_kernels.c); only data not aligned to its
 * elements is copied. */
static int prepare_weight(krt_interp *it, kir_val v, const void *data, ks_diag *d)
{
    const kir_node *n = &it->g->nodes[v];
    if (!data)
        return node_error(d, it->g, v, "'%s' has no data", kir_get_str(it->g, v, "name", "?"));
    size_t elem = kir_dtype_size(n->dtype);
    if ((uintptr_t)data % elem == 0) {
        it->weights[v] = data; /* used in place */
        return 0;
    }
    size_t bytes = elem * (size_t)kir_elems(n, 1);
    void *copy = ks_xmalloc(bytes ? bytes : 1);
    memcpy(copy, data, bytes);
    it->owned[v] = copy;
    it->owned_bytes += bytes;
    it->weights[v] = copy;
    return 0;
}

static int prepare_rope(krt_interp *it, kir_val v, ks_diag *d)
{
    const kir_graph *g = it->g;
    const kir_node *n = &g->nodes[v];
    const char *style = kir_get_str(g, v, "style", "halves");
    const char *scaling = kir_get_str(g, v, "scaling", "none");
    int64_t rot = kir_get_int(g, v, "rot_dim", n->dims[2]);
    if (strcmp(style, "halves") != 0 && strcmp(style, "pairs") != 0)
        return node_error(d, g, v, "unknown style '%s' (expected halves or pairs)", style);
    /* rot_dim (even, within the head) is the shape rule's to check; the values are the op's. */
    if (kir_get_float(g, v, "theta", 10000.0) <= 0.0) return node_error(d, g, v, "theta must be positive");
    int linear = strcmp(scaling, "linear") == 0, llama3 = strcmp(scaling, "llama3") == 0;
    if (!linear && !llama3 && strcmp(scaling, "none") != 0)
        return node_error(d, g, v, "unknown scaling '%s' (expected none, linear or llama3)", scaling);
    if ((linear || llama3) && !(kir_get_float(g, v, "factor", 1.0) > 0.0))
        return node_error(d, g, v, "scaling factor must be positive");
    if (llama3) {
        double low = kir_get_float(g, v, "low_freq_factor", 1.0), high = kir_get_float(g, v, "high_freq_factor", 4.0);
        if (!(low > 0.0) || !(high > low) || !(kir_get_float(g, v, "original_max_positions", 8192.0) > 0.0))
            return node_error(d, g, v,
                              "llama3 scaling needs 0 < low_freq_factor < high_freq_factor and original_max_positions > 0");
    }
    krt_interp_rope *rp = &it->rope[v];
    rp->rot_dim = (int)rot;
    rp->pairs = strcmp(style, "pairs") == 0;
    rp->inv_freq = ks_xmalloc(sizeof(float) * (size_t)(rot / 2));
    kir_rope_inv_freq(g, v, rp->rot_dim, rp->inv_freq);
    return 0;
}

/* ATTENTION and KV_WRITE: the cache has the node's layer, in its shape. */
static int prepare_kv_node(krt_interp *it, kir_val v, ks_diag *d)
{
    const kir_graph *g = it->g;
    const kir_node *n = &g->nodes[v];
    kir_val kv_k = KIR_NONE, kv_v = KIR_NONE;
    KS_ASSERT(kv_operands(n, &kv_k, &kv_v) == 0);
    if (!it->kv)
        return node_error(d, g, v, "the graph has %s but no KV cache was given",
                          n->op == KIR_OP_ATTENTION ? "attention" : "a kv_write");
    const krt_kv_config *cfg = krt_kv_config_of(it->kv);
    if (cfg->elem_size != sizeof(float))
        return node_error(d, g, v, "the KV cache holds %zu-byte elements; the interpreter needs f32 (4 bytes)",
                          cfg->elem_size);
    int64_t layer = kir_get_int(g, v, "layer", 0);
    if (layer < 0 || layer >= cfg->n_layers)
        return node_error(d, g, v, "layer %lld is not in the KV cache (it has %d layers)", (long long)layer,
                          cfg->n_layers);
    const kir_node *k = &g->nodes[kv_k], *val = &g->nodes[kv_v];
    const krt_kv_layer *kl = &cfg->layers[layer];
    if (kl->kv_heads != k->dims[1] || kl->head_dim_k != k->dims[2] || kl->head_dim_v != val->dims[2])
        return node_error(d, g, v,
                          "layer %lld needs %lld KV heads of %lld (K) and %lld (V) elements; "
                          "the KV cache has %d, %d and %d",
                          (long long)layer, (long long)k->dims[1], (long long)k->dims[2], (long long)val->dims[2],
                          kl->kv_heads, kl->head_dim_k, kl->head_dim_v);
    if (n->op == KIR_OP_ATTENTION && kir_get_float(g, v, "softcap", 0.0) < 0.0)
        return node_error(d, g, v, "softcap must not be negative");
    it->has_attention = 1;
    return 0;
}

static int prepare_node(krt_interp *it, kir_val v, const void *const *weights, ks_diag *d)
{
    const kir_graph *g = it->g;
    const kir_node *n = &g->nodes[v];
    switch (n->op) {
    case KIR_OP_WEIGHT:
        return prepare_weight(it, v, weights ? weights[v] : NULL, d);
    case KIR_OP_INPUT: {
        const char *name = kir_get_str(g, v, "name", "");
        if (strcmp(name, "tokens") != 0 && strcmp(name, "positions") != 0)
            return node_error(d, g, v, "'%s' is neither tokens nor positions", name);
        return 0;
    }
    case KIR_OP_ROPE:
        return prepare_rope(it, v, d);
    case KIR_OP_ATTENTION:
    case KIR_OP_KV_WRITE:
        return prepare_kv_node(it, v, d);
    default:
        /* i32 values come from the step's inputs only */
        if (n->dtype == KIR_I32) return node_error(d, g, v, "the interpreter has no i32 %s", kir_op_table[n->op].name);
        return 0;
    }
}

static int count_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) return 1;
    return n > INTERP_MAX_THREADS ? INTERP_MAX_THREADS : (int)n;
}

krt_interp *krt_interp_new(const kir_graph *g, const void *const *weights, krt_kv *kv, ks_diag *d)
{
    if (kir_verify(g, d, graph_name(g)) != 0) return NULL;
    size_t nn = g->n_nodes;
    krt_interp *it = ks_xcalloc(1, sizeof *it);
    it->g = g;
    it->kv = kv;
    it->name = graph_name(g);
    it->n_threads = count_threads();
    it->weights = ks_xcalloc(nn ? nn : 1, sizeof *it->weights);
    it->owned = ks_xcalloc(nn ? nn : 1, sizeof *it->owned);
    it->rope = ks_xcalloc(nn ? nn : 1, sizeof *it->rope);
    it->places = ks_xcalloc(nn ? nn : 1, sizeof *it->places);
    it->src = ks_xcalloc(nn ? nn : 1, sizeof *it->src);
    it->dst = ks_xcalloc(nn ? nn : 1, sizeof *it->dst);
    it->ints = ks_xcalloc(nn ? nn : 1, sizeof *it->ints);

    for (size_t v = 0; v < nn; v++) {
        if (prepare_node(it, (kir_val)v, weights, d) != 0) {
            krt_interp_free(it);
            return NULL;
        }
    }
    return it;
}

size_t krt_interp_weight_bytes(const krt_interp *it) { return it->owned_bytes; }

void krt_interp_free(krt_interp *it)
{
    if (!it) return;
    for (size_t v = 0; v < it->g->n_nodes; v++) {
        free(it->owned[v]);
        free(it->rope[v].inv_freq);
    }
    free(it->weights);
    free(it->owned);
    free(it->rope);
    free(it->places);
    free(it->arena);
    free(it->src);
    free(it->dst);
    free(it->ints);
    free(it->order);
    free(it);
}

/* ---- the memory plan ----------------------------------------------------------------------
 * Where each computed value of a step of n_tokens tokens lives: an offset in
 * floats into one arena, or KIR_NOWHERE for values that live elsewhere
 * (weights, the step's inputs, and the OUTPUT, which is written straight
 * into the caller's buffer).
 *
 * A graph planned by passes/plan_memory.c carries the plan: the byte offset
 * of every value in one arena (`mem.offset`) and the arena's size for the
 * engine's largest step (graph params `mem.arena_bytes`, `mem.max_tokens`).
 * The interpreter then runs out of exactly that arena, so a planning error
 * (two live values overlapping) shows up as wrong logits. An unplanned
 * graph gets every value its own place, 64-byte aligned. Returns the
 * arena's size in floats. */
static size_t plan_places(const kir_graph *g, int64_t n_tokens, size_t *places)
{
    const kir_param *arena = kir_param_find(g, "mem.arena_bytes");
    size_t at = 0;
    for (size_t v = 0; v < g->n_nodes; v++) {
        kir_op op = g->nodes[v].op;
        if (op == KIR_OP_WEIGHT || op == KIR_OP_INPUT || op == KIR_OP_OUTPUT) {
            places[v] = KIR_NOWHERE;
            continue;
        }
        int64_t off = arena ? kir_get_int(g, (kir_val)v, "mem.offset", -1) : -1;
        if (off >= 0) {
            KS_ASSERT(off % (int64_t)sizeof(float) == 0);
            places[v] = (size_t)off / sizeof(float);
            continue;
        }
        places[v] = at;
        size_t ne = (size_t)kir_elems(&g->nodes[v], n_tokens);
        at += (ne + 15) & ~(size_t)15;
    }
    if (arena && arena->kind == KIR_ATTR_INT && arena->i > 0) {
        /* planned values lie below the arena's end; unplanned ones (none in a
         * planned graph) follow it */
        size_t base = (size_t)arena->i / sizeof(float);
        for (size_t v = 0; v < g->n_nodes; v++)
            if (places[v] != KIR_NOWHERE && kir_get_int(g, (kir_val)v, "mem.offset", -1) < 0) places[v] += base;
        return base + at;
    }
    return at;
}

/* Point every value at its data for this step. */
static void bind_values(krt_interp *it, const krt_step *step, float *out)
{
    const kir_graph *g = it->g;
    size_t need = plan_places(g, step->n_tokens, it->places);
    if (need > it->arena_cap) {
        free(it->arena);
        it->arena = ks_xmalloc(sizeof(float) * need);
        it->arena_cap = need;
    }
    for (size_t v = 0; v < g->n_nodes; v++) {
        const kir_node *n = &g->nodes[v];
        it->src[v] = NULL;
        it->dst[v] = NULL;
        it->ints[v] = NULL;
        if (n->op == KIR_OP_INPUT) {
            int tokens = strcmp(kir_get_str(g, (kir_val)v, "name", ""), "tokens") == 0;
            it->ints[v] = tokens ? step->tokens : step->positions;
        } else if (n->op != KIR_OP_WEIGHT) { /* the kernels read weights from it->weights */
            it->dst[v] = n->op == KIR_OP_OUTPUT ? out : it->arena + it->places[v];
            it->src[v] = it->dst[v];
        }
    }
}

/* ---- checks of a step --------------------------------------------------------------------- */
static int step_error(krt_interp *it, ks_diag *d, const char *fmt, ...) KS_PRINTF(3, 4);
static int step_error(krt_interp *it, ks_diag *d, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ks_verror(d, it->name, fmt, ap);
    va_end(ap);
    return -1;
}

static int compare_keys(const void *a, const void *b)
{
    const int64_t *x = a, *y = b;
    if (x[0] != y[0]) return x[0] < y[0] ? -1 : 1;
    return (x[1] > y[1]) - (x[1] < y[1]);
}

/* Sequences and positions: each token's position is reserved in its
 * sequence, and no two tokens write the same row of the cache. */
static int check_positions(krt_interp *it, const krt_step *st, ks_diag *d)
{
    for (int i = 0; i < st->n_tokens; i++) {
        int seq = st->seq_ids[i], pos = st->positions[i];
        if (pos < 0) return step_error(it, d, "token %d: negative position %d", i, pos);
        if (!it->has_attention) continue;
        if (!krt_kv_seq_exists(it->kv, seq)) return step_error(it, d, "token %d: unknown sequence %d", i, seq);
        int len = krt_kv_seq_len(it->kv, seq);
        if (pos >= len)
            return step_error(it, d,
                              "token %d: position %d of sequence %d is beyond what the KV cache has reserved "
                              "(%d positions)",
                              i, pos, seq, len);
    }
    if (!it->has_attention) return 0;
    /* keys are (seq, pos, token index), sorted on (seq, pos) */
    KS_GROW(it->order, 3 * (size_t)st->n_tokens, it->order_cap, (size_t)1 << 32, "tokens in a step");
    for (int i = 0; i < st->n_tokens; i++) {
        it->order[3 * i] = st->seq_ids[i];
        it->order[3 * i + 1] = st->positions[i];
        it->order[3 * i + 2] = i;
    }
    qsort(it->order, (size_t)st->n_tokens, 3 * sizeof *it->order, compare_keys);
    for (int i = 1; i < st->n_tokens; i++) {
        const int64_t *a = &it->order[3 * (i - 1)], *b = &it->order[3 * i];
        if (a[0] == b[0] && a[1] == b[1]) {
            int64_t first = a[2] < b[2] ? a[2] : b[2], second = a[2] < b[2] ? b[2] : a[2];
            return step_error(it, d, "tokens %lld and %lld both write position %lld of sequence %lld",
                              (long long)first, (long long)second, (long long)a[1], (long long)a[0]);
        }
    }
    return 0;
}

/* Ids that index a table (token ids, learned positions) are inside it. */
static int check_ids(krt_interp *it, const krt_step *st, ks_diag *d)
{
    const kir_graph *g = it->g;
    for (size_t v = 0; v < g->n_nodes; v++) {
        const kir_node *n = &g->nodes[v];
        if (n->op != KIR_OP_EMBED) continue;
        int64_t rows = g->nodes[n->in[0]].dims[0];
        int tokens = strcmp(kir_get_str(g, n->in[1], "name", ""), "tokens") == 0;
        const int32_t *ids = tokens ? st->tokens : st->positions;
        for (int i = 0; i < st->n_tokens; i++) {
            if (ids[i] >= 0 && ids[i] < rows) continue;
            if (tokens)
                return step_error(it, d, "token %d: id %d is out of range (the vocabulary has %lld ids)", i, ids[i],
                                  (long long)rows);
            return step_error(it, d, "token %d: position %d is out of range (the position table has %lld rows)", i,
                              ids[i], (long long)rows);
        }
    }
    return 0;
}

/* ---- a step ------------------------------------------------------------------------------ */
int krt_interp_step(krt_interp *it, const krt_step *step, float *out, ks_diag *d)
{
    KS_ASSERT(step && step->n_tokens >= 0);
    if (step->n_tokens == 0) return 0;
    KS_ASSERT(step->tokens && step->positions && step->seq_ids && out);
    const kir_param *max_tokens = kir_param_find(it->g, "mem.max_tokens");
    if (max_tokens && max_tokens->kind == KIR_ATTR_INT && step->n_tokens > max_tokens->i)
        return step_error(it, d, "a step of %d tokens is more than the %lld the engine's memory plan holds", step->n_tokens,
                          (long long)max_tokens->i);
    if (check_positions(it, step, d) != 0 || check_ids(it, step, d) != 0) return -1;
    bind_values(it, step, out);
    krt_interp_exec x = {
        .g = it->g,
        .n_tokens = step->n_tokens,
        .step = step,
        .kv = it->kv,
        .src = it->src,
        .weights = it->weights,
        .dst = it->dst,
        .ints = it->ints,
        .rope = it->rope,
        .n_threads = it->n_threads,
    };
    for (size_t v = 0; v < it->g->n_nodes; v++) {
        krt_interp_exec_node(&x, (kir_val)v);
        if (it->tap && it->src[v] && it->g->nodes[v].op != KIR_OP_WEIGHT)
            it->tap(it->tap_ctx, (kir_val)v, it->src[v], step->n_tokens);
    }
    return 0;
}

void krt_interp_set_tap(krt_interp *it, krt_tap_fn tap, void *ctx)
{
    it->tap = tap;
    it->tap_ctx = ctx;
}
