/*
 * fuse_norm_rope.c — a norm over each head and the rotation of its value become one kernel.
 *
 * Requires: a verified graph, after lower_precision (as fuse_rows: the norm's value keeps the dtype it
 *   was stored in, rounded in the fused kernel as the unfused one stores it, so that no number moves —
 *   a rounding that moves in q or k reaches a mixture of experts' router and can flip a choice).
 * Guarantees: an rms_norm in no group whose value is [T, H, D] and whose one use is a rope in no
 *   group that rotates it by the step's positions (two operands: not a rotation by sequence length)
 *   forms a group with that rope, the rope moved to follow the norm (its other operand, the positions
 *   input, moved before the norm where it came later; nothing between uses the rope): Qwen3's and Gemma 3's
 *   norms over each head of q
 *   and k, each normalized and rotated while the head is in one block; the norm's value, read by the
 *   rope alone, is no longer stored. Values are unchanged.
 * Does not: join a layer_norm, a norm read by more than the rope, or a norm over the whole q row
 *   (OLMo 2's, reshaped before its rope).
 */
#include <stdlib.h>

#include "passes/pipeline.h"
#include "passes/rewrite.h"

/* The rope that norm v can fuse with, or KIR_NONE. */
static kir_val rope_of(const kir_graph *g, const kp_uses *uses, kir_val v)
{
    const kir_node *n = kir_node_at(g, v);
    if (n->op != KIR_OP_RMS_NORM || kp_group_of(g, v) >= 0 || n->ndim != 3 || kp_use_count(uses, v) != 1)
        return KIR_NONE;
    const kir_val u = uses->user[uses->start[v]];
    const kir_node *r = kir_node_at(g, u);
    if (r->op != KIR_OP_ROPE || r->nin != 2 || r->in[0] != v || kp_group_of(g, u) >= 0) return KIR_NONE;
    if (kir_node_at(g, r->in[1])->op != KIR_OP_INPUT) return KIR_NONE; /* positions: defined before the norm */
    return u;
}

int kp_fuse_norm_rope(kir_graph **gp, const kp_options *opt, kp_pass_stats *st, ks_diag *d)
{
    (void)opt;
    (void)d;
    const kir_graph *g = *gp;
    const size_t n = g->n_nodes;
    kp_uses uses;
    kp_uses_build(&uses, g);
    kir_val *rope = ks_xmalloc(sizeof *rope * (n ? n : 1)); /* the rope each norm takes */
    uint8_t *moved = ks_xcalloc(n ? n : 1, 1);
    size_t fused = 0;
    for (kir_val v = 0; v < n; v++) {
        rope[v] = rope_of(g, &uses, v);
        if (rope[v] != KIR_NONE) moved[rope[v]] = 1, fused++;
    }
    if (fused) {
        kir_val *order = ks_xmalloc(sizeof *order * n);
        size_t n_order = 0;
        for (kir_val v = 0; v < n; v++) {
            if (moved[v]) continue;
            if (rope[v] != KIR_NONE) {
                /* the positions input, where it comes later (an input is defined where first used), before
                 * the norm: a group's nodes are contiguous */
                const kir_val pos = kir_node_at(g, rope[v])->in[1];
                if (pos > v && !moved[pos]) order[n_order++] = pos, moved[pos] = 1;
            }
            order[n_order++] = v;
            if (rope[v] != KIR_NONE) order[n_order++] = rope[v];
        }
        kir_val *map = NULL;
        kir_graph *out = kp_reorder(g, order, n_order, &map);
        int64_t id = kp_group_next_id(g);
        for (kir_val v = 0; v < n; v++)
            if (rope[v] != KIR_NONE) {
                kir_attr_set_int(out, map[v], KIR_A_ANY_FUSE, id);
                kir_attr_set_int(out, map[rope[v]], KIR_A_ANY_FUSE, id);
                id++;
            }
        kp_group_renumber(out);
        free(map);
        free(order);
        kir_graph_free(*gp);
        *gp = out;
    }
    st->fusions = fused;
    kp_uses_free(&uses);
    free(rope);
    free(moved);
    return 0;
}
