/*
 * interp.c — the reference interpreter's driver (runtime/interp/interp.h): prepares a
 * described graph (weights read where they lie, in their own dtype;
 * rotation frequencies; checks against the KV cache), places each step's
 * values in one arena (the engine's memory plan when it has one) and runs
 * the kernels of
 * runtime/interp/interp_kernels.c in schedule order.
 *
 * KV_WRITE writes K/V rows as ATTENTION does; ATTENTION with write_kv=0
 * only reads them; `fuse` groups are ignored (node by node is the reference).
 *
 * Requires: a graph that kir_verify accepts and its description
 * (runtime/desc.h); steps that the session checked (runtime/session.c):
 * token ids below desc->n_token_ids, positions reserved in the KV cache and
 * below desc->max_context, no KV row written twice, at most
 * desc->plan.max_tokens tokens. A step that breaks these is a caller's bug,
 * caught by KS_ASSERT. Does not: fuse (`fuse` groups run node by node: that
 * is the reference), or alias views.
 *
 * Memory: what does not depend on the step (the kernels' fixed scratch,
 * rotation tables, copies of misaligned weights) is allocated at creation;
 * the step's arena and the attention's scratch grow before a step that needs
 * more, and a step that cannot have them fails (-1, reported) before any
 * kernel runs. The kernels allocate nothing.
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
    const krt_desc *desc;      /* the graph's description; not owned, outlives the interpreter */
    const kir_graph *g;        /* desc->graph */
    krt_kv *kv;                /* the paged KV cache; not owned; NULL when the graph has no attention */
    int has_attention;         /* 1 when a step reads and writes the KV cache */
    int n_threads;             /* worker threads for large matmuls */
    const void **weights;      /* [n_nodes] data of WEIGHT nodes in their dtype: the caller's, or owned */
    void **owned;              /* [n_nodes] aligned copies made here of weights the caller's data misaligns */
    size_t owned_bytes;        /* bytes in owned: krt_interp_weight_bytes */
    krt_interp_rope *rope;       /* [n_nodes] rotation frequencies of ROPE nodes */
    size_t *places;            /* [n_nodes] offset of each value in the arena, floats; KIR_NOWHERE */
    float *arena;              /* the step's values */
    size_t arena_cap;          /* floats allocated in arena */
    krt_interp_scratch scratch; /* the kernels' scratch: conv, tiles and rope from creation, slots and score
                                   grown per step */
    float *fixed;              /* the scratch's conv, tiles and rope, in one allocation */
    size_t positions_cap;      /* entries allocated in scratch.slots and scratch.score */
    const float **src;         /* [n_nodes] per step: data of each float value */
    float **dst;               /* [n_nodes] per step: where each computed value goes */
    const int32_t **ints;      /* [n_nodes] per step: data of each i32 value */
    int32_t *seq_lengths;      /* [max_tokens] the step's input seq_lengths, when the graph has it */
    krt_tap_fn tap;            /* called after each computed value, or NULL */
    void *tap_ctx;             /* passed to tap */
};

/* ---- messages ----------------------------------------------------------------------
 * An error about node v, "op: ...", at its place in the source when it has
 * one (kir_node_verror). */
static int node_error(ks_diag *d, const kir_graph *g, kir_val v, const char *fmt, ...) KS_PRINTF(4, 5);
static int node_error(ks_diag *d, const kir_graph *g, kir_val v, const char *fmt, ...)
{
    char lead[64];
    snprintf(lead, sizeof lead, "%s: ", kir_op_table[g->nodes[v].op].name);
    va_list ap;
    va_start(ap, fmt);
    kir_node_verror(d, g, v, kir_graph_name(g, "interp"), lead, fmt, ap);
    va_end(ap);
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
        return node_error(d, it->g, v, "'%s' has no data", kir_attr_str(it->g, v, KIR_A_WEIGHT_NAME));
    size_t elem = kir_dtype_bits(n->dtype) < 8 ? 1 : kir_dtype_size(n->dtype);
    if ((uintptr_t)data % elem == 0) {
        it->weights[v] = data; /* used in place */
        return 0;
    }
    size_t bytes = (size_t)kir_dtype_bytes(n->dtype, (uint64_t)kir_elems(n, 1));
    void *copy = ks_try_malloc(bytes ? bytes : 1);
    if (!copy) {
        char what[96];
        snprintf(what, sizeof what, "an aligned copy of weight '%s'", kir_attr_str(it->g, v, KIR_A_WEIGHT_NAME));
        return ks_error_oom(d, it->desc->where, bytes, what);
    }
    memcpy(copy, data, bytes);
    it->owned[v] = copy;
    it->owned_bytes += bytes;
    it->weights[v] = copy;
    return 0;
}

static int prepare_rope(krt_interp *it, kir_val v, ks_diag *d)
{
    const kir_graph *g = it->g;
    /* the verifier checked the attributes' values (ir/ops.def's rules), the shape rule rot_dim */
    int64_t rot = kir_attr_int(g, v, KIR_A_ROPE_ROT_DIM);
    krt_interp_rope *rp = &it->rope[v];
    rp->rot_dim = (int)rot;
    rp->pairs = kir_attr_word(g, v, KIR_A_ROPE_STYLE) == KIR_ROPE_STYLE_PAIRS;
    rp->inv_freq = ks_try_calloc((size_t)(rot / 2), sizeof(float));
    if (!rp->inv_freq)
        return ks_error_oom(d, it->desc->where, sizeof(float) * (size_t)(rot / 2), "rotation frequencies");
    kir_rope_inv_freq(g, v, rp->rot_dim, 1, rp->inv_freq); /* a short sequence's (longrope, dynamic) */
    rp->by_length = kir_rope_by_length(g, v, &rp->short_up_to);
    return 0;
}

/* ATTENTION and KV_WRITE: the cache has the node's layer, in its shape. */
static int prepare_kv_node(krt_interp *it, kir_val v, ks_diag *d)
{
    const kir_graph *g = it->g;
    const kir_node *n = &g->nodes[v];
    kir_val kv_k = KIR_NONE, kv_v = KIR_NONE;
    KS_ASSERT(krt_desc_kv_operands(n, &kv_k, &kv_v));
    if (!it->kv)
        return node_error(d, g, v, "the graph has %s but no KV cache was given",
                          n->op == KIR_OP_ATTENTION ? "attention" : "a kv_write");
    const krt_kv_config *cfg = krt_kv_config_of(it->kv);
    if (cfg->elem_size != sizeof(float))
        return node_error(d, g, v, "the KV cache holds %zu-byte elements; the interpreter needs f32 (4 bytes)",
                          cfg->elem_size);
    int64_t layer = kir_attr_int(g, v, KIR_A_ATTENTION_LAYER);
    if (layer < 0 || layer >= cfg->n_layers)
        return node_error(d, g, v, "layer %lld is not in the KV cache (it has %d layers)", (long long)layer,
                          cfg->n_layers);
    const krt_kv_layer *kl = &cfg->layers[layer], need = krt_desc_kv_layer_of(g, v);
    if (kl->kv_heads != need.kv_heads || kl->head_dim_k != need.head_dim_k || kl->head_dim_v != need.head_dim_v)
        return node_error(d, g, v,
                          "layer %lld needs %d KV heads of %d (K) and %d (V) elements; "
                          "the KV cache has %d, %d and %d",
                          (long long)layer, need.kv_heads, need.head_dim_k, need.head_dim_v, kl->kv_heads,
                          kl->head_dim_k, kl->head_dim_v);
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
    case KIR_OP_INPUT:
        return 0; /* tokens, positions or seq_lengths: desc has them */
    case KIR_OP_ROPE:
        return prepare_rope(it, v, d);
    case KIR_OP_ATTENTION:
    case KIR_OP_KV_WRITE:
        return prepare_kv_node(it, v, d);
    case KIR_OP_TOPK:
        return 0; /* i32 indices, in its float-sized places */
    default:
        /* i32 values come from the step's inputs and topk only */
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

krt_interp *krt_interp_new(const krt_desc *desc, const void *const *weights, krt_kv *kv, ks_diag *d)
{
    const kir_graph *g = desc->graph;
    size_t nn = g->n_nodes ? g->n_nodes : 1;
    krt_interp *it = ks_try_calloc(1, sizeof *it);
    if (!it) return ks_error_oom(d, desc->where, sizeof *it, "the interpreter"), NULL;
    it->desc = desc;
    it->g = g;
    it->kv = kv;
    it->n_threads = count_threads();
    it->weights = ks_try_calloc(nn, sizeof *it->weights);
    it->owned = ks_try_calloc(nn, sizeof *it->owned);
    it->rope = ks_try_calloc(nn, sizeof *it->rope);
    it->places = ks_try_calloc(nn, sizeof *it->places);
    it->src = ks_try_calloc(nn, sizeof *it->src);
    it->dst = ks_try_calloc(nn, sizeof *it->dst);
    it->ints = ks_try_calloc(nn, sizeof *it->ints);
    size_t n_lengths = desc->seq_lengths != KIR_NONE ? (size_t)desc->plan.max_tokens : 0;
    it->seq_lengths = n_lengths ? ks_try_calloc(n_lengths, sizeof *it->seq_lengths) : NULL;
    if (!it->weights || !it->owned || !it->rope || !it->places || !it->src || !it->dst || !it->ints ||
        (n_lengths && !it->seq_lengths)) {
        ks_error_oom(d, desc->where, nn * (6 * sizeof(void *) + sizeof *it->rope) + n_lengths * sizeof(int32_t),
                     "the interpreter's tables");
        krt_interp_free(it);
        return NULL;
    }
    /* the kernels' scratch that does not depend on the step */
    size_t conv, tile, rope;
    krt_interp_scratch_sizes(g, &conv, &tile, &rope);
    size_t fixed = conv + (size_t)it->n_threads * tile + rope;
    if (fixed) {
        it->fixed = ks_try_calloc(fixed, sizeof(float));
        if (!it->fixed) {
            ks_error_oom(d, desc->where, fixed * sizeof(float), "the interpreter's scratch");
            krt_interp_free(it);
            return NULL;
        }
        it->scratch.conv = it->fixed;
        it->scratch.tiles = it->fixed + conv;
        it->scratch.tile = tile;
        it->scratch.rope = it->fixed + conv + (size_t)it->n_threads * tile;
    }

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
    for (size_t v = 0; it->owned && it->rope && v < it->g->n_nodes; v++) {
        free(it->owned[v]);
        free(it->rope[v].inv_freq);
    }
    free(it->fixed);
    free(it->scratch.slots);
    free(it->scratch.score);
    free(it->weights);
    free(it->owned);
    free(it->rope);
    free(it->places);
    free(it->arena);
    free(it->src);
    free(it->dst);
    free(it->ints);
    free(it->seq_lengths);
    free(it);
}

/* ---- the memory plan ----------------------------------------------------------------------
 * Where each computed value of a step of n_tokens tokens lives: an offset in
 * floats into one arena, or KIR_NOWHERE for values that live elsewhere
 * (weights, the step's inputs, and the OUTPUT, which is written straight
 * into the caller's buffer).
 *
 * A planned engine (desc->plan) runs out of exactly its plan's arena, so a
 * planning error (two live values overlapping) shows up as wrong logits. An
 * unplanned graph gets every value its own place, 64-byte aligned. Returns
 * the arena's size in floats. */
static size_t plan_places(const krt_desc *desc, int64_t n_tokens, size_t *places)
{
    const kir_graph *g = desc->graph;
    const krt_plan *plan = &desc->plan;
    /* The interpreter holds every value as f32: a plan made for half values
     * (lower_precision) sizes them at 2 bytes, so it lays them out itself. */
    int planned = plan->planned;
    for (size_t v = 0; v < g->n_nodes && planned; v++)
        planned = g->nodes[v].op == KIR_OP_WEIGHT || (g->nodes[v].dtype != KIR_F16 && g->nodes[v].dtype != KIR_BF16);
    size_t at = 0;
    for (size_t v = 0; v < g->n_nodes; v++) {
        kir_op op = g->nodes[v].op;
        if (op == KIR_OP_WEIGHT || op == KIR_OP_INPUT || op == KIR_OP_OUTPUT) {
            places[v] = KIR_NOWHERE;
        } else if (planned) {
            KS_ASSERT(plan->mem.offset[v] != KIR_MEM_NONE && plan->mem.offset[v] % sizeof(float) == 0);
            places[v] = (size_t)(plan->mem.offset[v] / sizeof(float));
        } else {
            places[v] = at;
            size_t ne = (size_t)kir_elems(&g->nodes[v], n_tokens);
            at += (ne + 15) & ~(size_t)15;
        }
    }
    return planned ? (size_t)(plan->mem.arena_bytes / sizeof(float)) : at;
}

/* *p (of `size`-byte elements) replaced by room for n of them (contents not
 * kept): 0, or -1 with *p as it was. */
static int regrow(void *p, size_t n, size_t size)
{
    void **at = p;
    void *q = ks_try_calloc(n ? n : 1, size);
    if (!q) return -1;
    free(*at);
    *at = q;
    return 0;
}

/* Point every value at its data for this step, with room for its values
 * and the attention's scratch: 0, or -1 after reporting out of memory. */
static int bind_values(krt_interp *it, const krt_step *step, float *out, ks_diag *d)
{
    const kir_graph *g = it->g;
    size_t need = plan_places(it->desc, step->n_tokens, it->places);
    if (need > it->arena_cap) {
        if (regrow(&it->arena, need, sizeof(float)) != 0) {
            char what[64];
            snprintf(what, sizeof what, "the values of a step of %d token%s", step->n_tokens,
                     step->n_tokens == 1 ? "" : "s");
            return ks_error_oom(d, it->desc->where, need * sizeof(float), what);
        }
        it->arena_cap = need;
    }
    size_t positions = 0; /* the attention's: the step's largest position + 1 */
    for (int i = 0; it->has_attention && i < step->n_tokens; i++)
        if ((size_t)step->positions[i] + 1 > positions) positions = (size_t)step->positions[i] + 1;
    if (positions > it->positions_cap) {
        if (regrow(&it->scratch.slots, positions, sizeof(int64_t)) != 0 ||
            regrow(&it->scratch.score, positions, sizeof(float)) != 0) {
            char what[64];
            snprintf(what, sizeof what, "attention over %zu positions", positions);
            return ks_error_oom(d, it->desc->where, positions * (sizeof(int64_t) + sizeof(float)), what);
        }
        it->positions_cap = positions;
    }
    for (size_t v = 0; v < g->n_nodes; v++) {
        const kir_node *n = &g->nodes[v];
        it->src[v] = NULL;
        it->dst[v] = NULL;
        it->ints[v] = NULL;
        if (n->op == KIR_OP_INPUT) {
            if ((kir_val)v == it->desc->seq_lengths) krt_step_seq_lengths(step, it->kv, it->seq_lengths);
            it->ints[v] = (kir_val)v == it->desc->tokens      ? step->tokens
                          : (kir_val)v == it->desc->positions ? step->positions
                                                              : it->seq_lengths;
        } else if (n->op != KIR_OP_WEIGHT) { /* the kernels read weights from it->weights */
            it->dst[v] = n->op == KIR_OP_OUTPUT ? out : it->arena + it->places[v];
            it->src[v] = it->dst[v];
        }
    }
    return 0;
}

/* ---- what the session promised ------------------------------------------------------------ */
/* The step's tokens are inside their tables and their positions reserved
 * (runtime/session.c checked them: a failure here is a caller's bug). */
static void assert_step(const krt_interp *it, const krt_step *st)
{
    const krt_desc *desc = it->desc;
    KS_ASSERT(st->n_tokens <= desc->plan.max_tokens);
    for (int i = 0; i < st->n_tokens; i++) {
        KS_ASSERT(st->tokens[i] >= 0 && st->tokens[i] < desc->n_token_ids);
        KS_ASSERT(st->positions[i] >= 0 && st->positions[i] < desc->max_context);
        if (it->has_attention) KS_ASSERT(st->positions[i] < krt_kv_seq_len(it->kv, st->seq_ids[i]));
    }
}

/* ---- a step ------------------------------------------------------------------------------ */
int krt_interp_step(krt_interp *it, const krt_step *step, float *out, ks_diag *d)
{
    KS_ASSERT(step && step->n_tokens >= 0);
    if (step->n_tokens == 0) return 0;
    KS_ASSERT(step->tokens && step->positions && step->seq_ids && out);
    assert_step(it, step);
    if (bind_values(it, step, out, d) != 0) return -1;
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
        .scratch = &it->scratch,
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
