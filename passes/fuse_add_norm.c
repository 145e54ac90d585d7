/*
 * fuse_add_norm.c — a residual add and the norm of its sum become one kernel.
 *
 * Requires: a verified graph.
 * Guarantees: an rms_norm or layer_norm in no group whose input is an add
 *   in no group forms a group with that add: the sum is written once (the
 *   residual stream needs it) and normalized while it is in registers.
 *   Nodes between the two move out of the way as in fuse_epilogues (those
 *   that do not depend on the add before it, those that do after the norm);
 *   values are unchanged.
 * Does not: fuse when a node of another group lies between the add and the
 *   norm (moving part of a group would split it), or when the add or the
 *   norm is in a group already: fuse_epilogues and fuse_norm_prologue run
 *   first and their kernels do more.
 */
#include <stdlib.h>

#include "passes/pipeline.h"
#include "passes/rewrite.h"

/* The add that norm v can fuse with, or KIR_NONE. */
static kir_val add_of(const kir_graph *g, kir_val v)
{
    const kir_node *n = kir_node_at(g, v);
    if (kir_op_table[n->op].fusion != KIR_FUSE_NORM || kp_group_of(g, v) >= 0) return KIR_NONE;
    kir_val a = n->in[0];
    if (a == KIR_NONE || kir_node_at(g, a)->op != KIR_OP_ADD || kp_group_of(g, a) >= 0) return KIR_NONE;
    const kir_node *an = kir_node_at(g, a);
    if (kir_binary_broadcast(kir_node_at(g, an->in[0]), kir_node_at(g, an->in[1])) != KIR_BROADCAST_SUFFIX)
        return KIR_NONE; /* the fused kernel adds a residual of the row's shape */
    for (kir_val w = a + 1; w < v; w++)
        if (kp_group_of(g, w) >= 0) return KIR_NONE;
    return a;
}

int kp_fuse_add_norm(kir_graph **gp, const kp_options *opt, kp_pass_stats *st, ks_diag *d)
{
    (void)d;
    const kir_graph *g = *gp;
    size_t n = g->n_nodes, fused = 0, n_order = 0;
    kir_val *order = ks_xmalloc(sizeof *order * (n ? n : 1));
    int64_t *gid = ks_xmalloc(sizeof *gid * (n ? n : 1));
    uint8_t *member = ks_xcalloc(n ? n : 1, 1), *dep = ks_xcalloc(n ? n : 1, 1);
    int64_t next_id = kp_group_next_id(g);
    /* norm_at[a]: the norm that fuses with add a (the first one, when several use it) */
    kir_val *norm_at = ks_xmalloc(sizeof *norm_at * (n ? n : 1));
    for (kir_val v = 0; v < n; v++) norm_at[v] = KIR_NONE, gid[v] = -1;
    for (kir_val v = 0; v < n; v++) {
        kir_val a = add_of(g, v);
        if (a != KIR_NONE && norm_at[a] == KIR_NONE) norm_at[a] = v;
    }
    for (kir_val v = 0; v < n;) {
        kir_val norm = norm_at[v];
        if (norm == KIR_NONE) {
            order[n_order++] = v++;
            continue;
        }
        member[v] = member[norm] = 1;
        if (kp_order_window(g, v, norm, member, dep, order, &n_order) != 0) {
            /* the norm depends on the add through a node between them: leave both */
            member[v] = member[norm] = 0;
            order[n_order++] = v++;
            continue;
        }
        member[v] = member[norm] = 0;
        gid[v] = gid[norm] = next_id++;
        fused++;
        v = norm + 1;
    }
    if (fused) kp_regroup(gp, order, n_order, gid);
    free(order);
    free(gid);
    free(member);
    free(dep);
    free(norm_at);
    st->fusions = fused;
    return 0;
}
