/*
 * fuse_norm_prologue.c — a norm joins the kernel of the matmul it feeds.
 *
 * Requires: a verified graph.
 * Guarantees: an rms_norm or layer_norm in no group whose one use is the
 *   input of a matmul joins that matmul: the matmul's group when the
 *   matmul starts one (fuse_epilogues made it), else a new group of the
 *   two. The norm moves to just before the matmul, as the group's first
 *   node (nothing between them uses it: the matmul is its only use), so
 *   groups stay contiguous. The normalized rows are internal to the
 *   kernel; values are unchanged.
 * Does not: fuse a norm with several uses (the rows would be computed
 *   twice, or stored anyway), or one that feeds an attention or a group
 *   that has a norm already.
 */
#include <stdlib.h>

#include "passes/pipeline.h"
#include "passes/rewrite.h"

/* The matmul that norm v can join as its prologue, or KIR_NONE. */
static kir_val prologue_of(const kir_graph *g, const kp_uses *uses, kir_val v)
{
    kir_fusion_class fc = kir_op_table[kir_node_at(g, v)->op].fusion;
    if (fc != KIR_FUSE_NORM || kp_group_of(g, v) >= 0 || kp_use_count(uses, v) != 1) return KIR_NONE;
    kir_val m = uses->user[uses->start[v]];
    const kir_node *mn = kir_node_at(g, m);
    if (mn->op != KIR_OP_MATMUL || mn->in[0] != v) return KIR_NONE;
    int64_t id = kp_group_of(g, m);
    /* a grouped matmul must open its group, so the norm lands in front of it */
    if (id >= 0 && m > 0 && kp_group_of(g, m - 1) == id) return KIR_NONE;
    return m;
}

int kp_fuse_norm_prologue(kir_graph **gp, const kp_options *opt, kp_pass_stats *st, ks_diag *d)
{
    (void)d;
    const kir_graph *g = *gp;
    size_t n = g->n_nodes, joined = 0;
    kp_uses uses;
    kp_uses_build(&uses, g);
    kir_val *norm_of = ks_xmalloc(sizeof *norm_of * (n ? n : 1)); /* the prologue of each matmul */
    uint8_t *moved = ks_xcalloc(n ? n : 1, 1);
    for (kir_val v = 0; v < n; v++) norm_of[v] = KIR_NONE;
    for (kir_val v = 0; v < n; v++) {
        kir_val m = prologue_of(g, &uses, v);
        if (m == KIR_NONE) continue;
        norm_of[m] = v;
        moved[v] = 1;
        joined++;
    }
    if (joined) {
        kir_val *order = ks_xmalloc(sizeof *order * n);
        size_t n_order = 0;
        for (kir_val v = 0; v < n; v++) {
            if (moved[v]) continue;
            if (norm_of[v] != KIR_NONE) order[n_order++] = norm_of[v];
            order[n_order++] = v;
        }
        kir_val *map = NULL;
        kir_graph *out = kp_reorder(g, order, n_order, &map);
        int64_t next_id = kp_group_next_id(g);
        for (kir_val m = 0; m < n; m++) {
            if (norm_of[m] == KIR_NONE) continue;
            int64_t id = kp_group_of(g, m);
            if (id < 0) {
                id = next_id++;
                kir_attr_set_int(out, map[m], KIR_A_ANY_FUSE, id);
            }
            kir_attr_set_int(out, map[norm_of[m]], KIR_A_ANY_FUSE, id);
        }
        kp_group_renumber(out);
        free(map);
        free(order);
        kir_graph_free(*gp);
        *gp = out;
    }
    kp_uses_free(&uses);
    free(norm_of);
    free(moved);
    st->fusions = joined;
    return 0;
}
