/*
 * eliminate_dead_nodes.c — nodes whose values nothing uses are dropped.
 *
 * Requires: a verified graph.
 * Guarantees: what remains is what the outputs and the KV cache need: the
 *   OUTPUT, every kv_write and every attention that writes the cache
 *   (write_kv absent or 1) are roots, and a node is kept when a kept node
 *   uses it. Weights replaced by derived ones, inputs nothing reads and
 *   computations nothing reads go. Groups are renumbered densely from 0 in
 *   schedule order, and a group left with one node is dissolved.
 * Does not: merge equal computations (no CSE) or reorder anything.
 */
#include <stdlib.h>

#include "passes/pipeline.h"
#include "passes/rewrite.h"

/* Nodes kept whatever uses them: results and cache writes. */
static int is_root(const kir_graph *g, kir_val v)
{
    kir_op op = kir_node_at(g, v)->op;
    return op == KIR_OP_OUTPUT || op == KIR_OP_KV_WRITE ||
           (op == KIR_OP_ATTENTION && kir_attr_int(g, v, KIR_A_ATTENTION_WRITE_KV) != 0);
}

int kp_eliminate_dead_nodes(kir_graph **gp, const kp_options *opt, kp_pass_stats *st, ks_diag *d)
{
    (void)d;
    const kir_graph *g = *gp;
    size_t n = g->n_nodes, n_live = 0;
    uint8_t *live = ks_xcalloc(n ? n : 1, 1);
    /* operands come before their users: one backward sweep marks everything */
    for (size_t i = n; i-- > 0;) {
        kir_val v = (kir_val)i;
        if (is_root(g, v)) live[v] = 1;
        if (!live[v]) continue;
        n_live++;
        const kir_node *node = kir_node_at(g, v);
        for (int k = 0; k < node->nin; k++)
            if (node->in[k] != KIR_NONE) live[node->in[k]] = 1;
    }
    kir_val *order = ks_xmalloc(sizeof *order * (n ? n : 1));
    size_t n_order = 0;
    for (kir_val v = 0; v < n; v++)
        if (live[v]) order[n_order++] = v;
    KS_ASSERT(n_order == n_live);
    kir_graph *out = kp_reorder(g, order, n_order, NULL);
    kp_group_renumber(out);
    free(order);
    free(live);
    kir_graph_free(*gp);
    *gp = out;
    st->fusions = 0;
    return 0;
}
