/*
 * desc.c — the engine description (runtime/desc.h), computed in one pass
 * over a verified graph.
 *
 * Requires: a graph kir_verify accepts (one OUTPUT, unique input names and
 * layer numbers, operands of the right types). Guarantees, when it returns
 * 0: the output has one row per token; a token id below n_token_ids and a
 * position below max_context index every table they index (learned
 * positions included); the plan, when the graph carries one, is the one
 * kir_verify proved sound.
 */
#include "runtime/desc.h"

#include <stdlib.h>
#include <string.h>

static int desc_error(ks_diag *d, const char *what, const char *fmt, ...) KS_PRINTF(3, 4);
static int desc_error(ks_diag *d, const char *what, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ks_verror(d, what, fmt, ap);
    va_end(ap);
    return -1;
}

/* An int param, or dflt when the graph has none. */
static int64_t param_int(const kir_graph *g, const char *name, int64_t dflt)
{
    const kir_param *p = kir_param_find(g, name);
    return p && p->kind == KIR_ATTR_INT ? p->i : dflt;
}

int krt_desc_kv_operands(const kir_node *n, kir_val *k, kir_val *v)
{
    if (n->op == KIR_OP_ATTENTION) {
        *k = n->in[1];
        *v = n->in[2];
        return 1;
    }
    if (n->op == KIR_OP_KV_WRITE) {
        *k = n->in[0];
        *v = n->in[1];
        return 1;
    }
    return 0;
}

krt_kv_layer krt_desc_kv_layer_of(const kir_graph *g, kir_val v)
{
    kir_val k = KIR_NONE, val = KIR_NONE;
    KS_ASSERT(krt_desc_kv_operands(&g->nodes[v], &k, &val));
    const kir_node *kn = &g->nodes[k], *vn = &g->nodes[val];
    /* V in K's rows (v_in_k, passes/share_kv.c): the layer stores no V */
    const int v_in_k = kir_attr_int(g, v, g->nodes[v].op == KIR_OP_ATTENTION ? KIR_A_ATTENTION_V_IN_K
                                                                              : KIR_A_KV_WRITE_V_IN_K) != 0;
    return (krt_kv_layer){(int)kn->dims[1], (int)kn->dims[2], v_in_k ? 0 : (int)vn->dims[2]};
}

static int describe_kv(krt_desc *desc, const char *what, ks_diag *d)
{
    const kir_graph *g = desc->graph;
    int64_t n = 0;
    kir_val k, val;
    for (size_t v = 0; v < g->n_nodes; v++) {
        if (!krt_desc_kv_operands(&g->nodes[v], &k, &val)) continue;
        int64_t l = kir_attr_int(g, (kir_val)v, KIR_A_ATTENTION_LAYER);
        if (l >= 0 && l < INT32_MAX && l + 1 > n) n = l + 1;
    }
    desc->n_kv_layers = (int)n;
    desc->kv_dtype = KIR_F32;
    for (size_t v = 0; v < g->n_nodes; v++)
        if (krt_desc_kv_operands(&g->nodes[v], &k, &val)) {
            desc->kv_dtype = kir_kv_dtype(g, (kir_val)v); /* the same on every node (kir_verify) */
            break;
        }
    if (n == 0) return 0;
    /* a layer number no attention or kv_write uses stays {0,0,0}: the cache stores nothing for it */
    desc->kv_layers = ks_try_calloc((size_t)n, sizeof *desc->kv_layers);
    if (!desc->kv_layers) return ks_error_oom(d, what, (size_t)n * sizeof *desc->kv_layers, "the KV-cache layers");
    for (size_t v = 0; v < g->n_nodes; v++) {
        if (!krt_desc_kv_operands(&g->nodes[v], &k, &val)) continue;
        int64_t l = kir_attr_int(g, (kir_val)v, KIR_A_ATTENTION_LAYER);
        if (l < 0 || l >= n || desc->kv_layers[l].kv_heads != 0) continue; /* the first one decides */
        desc->kv_layers[l] = krt_desc_kv_layer_of(g, (kir_val)v);
    }
    return 0;
}

/* The inputs, the output, and the tables ids index. */
static int describe_io(krt_desc *desc, const char *what, ks_diag *d)
{
    const kir_graph *g = desc->graph;
    desc->tokens = desc->positions = desc->seq_lengths = desc->output = KIR_NONE;
    for (size_t v = 0; v < g->n_nodes; v++) {
        const kir_node *n = &g->nodes[v];
        if (n->op == KIR_OP_INPUT) {
            /* kir_verify: a role each, each role once */
            kir_word role = kir_attr_word(g, (kir_val)v, KIR_A_INPUT_ROLE);
            if (role == KIR_ROLE_TOKENS)
                desc->tokens = (kir_val)v;
            else if (role == KIR_ROLE_POSITIONS)
                desc->positions = (kir_val)v;
            else
                desc->seq_lengths = (kir_val)v;
        } else if (n->op == KIR_OP_OUTPUT) {
            desc->output = (kir_val)v;
        }
    }
    KS_ASSERT(desc->output != KIR_NONE); /* kir_verify: exactly one */
    desc->vocab = kir_row_elems(&g->nodes[desc->output]);
    int64_t ids = kir_token_ids(g); /* the one owner of the token-id limit (ir/ir.h) */
    desc->n_token_ids = ids >= 0 ? ids : INT32_MAX;
    int64_t position_rows = INT64_MAX;
    for (size_t v = 0; v < g->n_nodes; v++) {
        const kir_node *n = &g->nodes[v];
        if (n->op != KIR_OP_EMBED) continue;
        int64_t rows = g->nodes[n->in[0]].dims[0];
        if (n->in[1] == desc->positions && rows < position_rows) position_rows = rows;
    }
    if (desc->max_context > position_rows)
        return desc_error(d, what, "a context of %d positions is over the %lld rows of the position table",
                          desc->max_context, (long long)position_rows);
    return 0;
}

static void describe_tokens(krt_desc *desc)
{
    const kir_graph *g = desc->graph;
    int64_t bos = param_int(g, "bos_token_id", -1);
    desc->bos = bos >= 0 && bos < desc->n_token_ids ? (int32_t)bos : -1;
    /* one id or a list (Llama 3: [128001, 128008, 128009]); negative ones mean none */
    const kir_param *eos = kir_param_find(g, "eos_token_id");
    const int64_t *ids = NULL;
    uint32_t n = 0;
    if (eos && eos->kind == KIR_ATTR_INT) ids = &eos->i, n = 1;
    if (eos && eos->kind == KIR_ATTR_INTS) ids = eos->ints.v, n = eos->ints.n;
    for (uint32_t i = 0; i < n && desc->n_eos < KRT_MAX_EOS; i++)
        if (ids[i] >= 0 && ids[i] < desc->vocab && !krt_desc_is_eos(desc, (int32_t)ids[i]))
            desc->eos[desc->n_eos++] = (int32_t)ids[i];
}

static void describe_weights(krt_desc *desc)
{
    const kir_graph *g = desc->graph;
    int seen = 0;
    desc->weight_dtype = KIR_F32;
    for (size_t v = 0; v < g->n_nodes; v++) {
        const kir_node *n = &g->nodes[v];
        if (n->op != KIR_OP_WEIGHT) continue;
        if (seen && n->dtype != desc->weight_dtype) desc->mixed_weights = 1;
        if (!seen) desc->weight_dtype = n->dtype;
        seen = 1;
    }
}

/* The plan, read once (kir_verify proved it: ir/plan.h). */
static int describe_plan(krt_desc *desc, const char *what, ks_diag *d)
{
    krt_plan *p = &desc->plan;
    p->max_tokens = KRT_MAX_STEP_TOKENS;
    int rc = kir_plan_read(desc->graph, &p->mem, d, what);
    if (rc < 0) return -1;
    p->planned = rc == 1;
    if (p->planned) p->max_tokens = p->mem.max_tokens;
    return 0;
}

int krt_desc_init(krt_desc *desc, const kir_graph *g, const char *what, ks_diag *d)
{
    memset(desc, 0, sizeof *desc);
    desc->graph = g;
    desc->where = what;
    int64_t ctx = param_int(g, "max_context", KRT_DEFAULT_CONTEXT);
    if (ctx < 1 || ctx > KRT_MAX_CONTEXT) {
        desc_error(d, what, "param max_context %lld is not a context length (1 to %d)", (long long)ctx, KRT_MAX_CONTEXT);
        return -1;
    }
    desc->max_context = (int)ctx;
    int rc = describe_io(desc, what, d);
    if (rc == 0) {
        describe_tokens(desc);
        describe_weights(desc);
        rc = describe_kv(desc, what, d);
    }
    if (rc == 0) {
        rc = describe_plan(desc, what, d);
    }
    if (rc != 0) krt_desc_free(desc);
    return rc;
}

void krt_desc_free(krt_desc *desc)
{
    free(desc->kv_layers);
    desc->kv_layers = NULL;
    if (desc->plan.planned) kir_mem_plan_free(&desc->plan.mem);
    desc->plan.planned = 0;
}

int krt_desc_is_eos(const krt_desc *desc, int32_t id)
{
    for (int i = 0; i < desc->n_eos; i++)
        if (desc->eos[i] == id) return 1;
    return 0;
}
