/*
 * share_kv.c — an attention whose V is part of its K keeps K alone in the cache (v_in_k).
 *
 * Requires: a verified graph.
 * Guarantees: each attention whose v is each head's first Dv dims of its k gets v_in_k=1: k is
 *   concat(v, r) (along the last dim, v of k's heads: DeepSeek's latent attention, K = [latent,
 *   rotary key] and V = the latent) or v is slice(k) from 0. The cache then holds its K rows alone
 *   (kv_heads x Dk values a position, not kv_heads x (Dk + Dv)) and V is read as the first Dv of each K
 *   row: the same values (of the cache's dtype; a cache of codes gives V its K row's codes and scale).
 *   Counts one fusion an attention.
 * Does not: move, add or remove nodes; touch an attention whose v is anything else.
 */
#include "passes/pipeline.h"

/* Whether v is each head's first dims of k. */
static int v_prefix_of_k(const kir_graph *g, kir_val k, kir_val v)
{
    const kir_node *kn = kir_node_at(g, k), *vn = kir_node_at(g, v);
    if (kn->ndim != 3 || vn->ndim != 3 || vn->dims[1] != kn->dims[1] || vn->dims[2] > kn->dims[2]) return 0;
    if (kn->op == KIR_OP_CONCAT) return kn->in[0] == v;
    return vn->op == KIR_OP_SLICE && vn->in[0] == k && kir_attr_int(g, v, KIR_A_SLICE_START) == 0;
}

int kp_share_kv(kir_graph **gp, const kp_options *opt, kp_pass_stats *st, ks_diag *d)
{
    (void)opt, (void)d;
    kir_graph *g = *gp;
    for (size_t a = 0; a < g->n_nodes; a++) {
        const kir_node *n = &g->nodes[a];
        if (n->op != KIR_OP_ATTENTION || kir_attr_int(g, (kir_val)a, KIR_A_ATTENTION_V_IN_K)) continue;
        kir_val k = n->in[1];
        if (kir_node_at(g, k)->op == KIR_OP_KV_WRITE) k = kir_node_at(g, k)->in[0]; /* a read-only attention */
        if (!v_prefix_of_k(g, k, n->in[2])) continue;
        kir_attr_set_int(g, (kir_val)a, KIR_A_ATTENTION_V_IN_K, 1);
        if (kir_node_at(g, n->in[1])->op == KIR_OP_KV_WRITE) kir_attr_set_int(g, n->in[1], KIR_A_KV_WRITE_V_IN_K, 1);
        st->fusions++;
    }
    return 0;
}
