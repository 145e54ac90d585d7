/*
 * fuse_epilogues.c — a matmul and the cheap nodes after it become one kernel.
 *
 * Requires: a verified graph.
 * Guarantees: starting at each matmul in no group (the anchor; also a routed
 *   expert_matmul, whose epilogue a mixture of experts' SwiGLU is, and
 *   expert_sum, whose epilogue is the residual add), a group
 *   grows over the nodes that follow it in the schedule: an elementwise op
 *   (a bias or residual add, silu, gelu, a SwiGLU mul of two group values,
 *   scale, rope…), a view (slice, reshape, concat) or a kv_write joins when
 *   it uses a group value and each of its other operands was defined before
 *   the anchor or does not depend on the group. Growth stops at the next
 *   matmul, attention, embed or output, or at a node of another group; a
 *   norm is passed over (Qwen3's norms over each head of q and k come between
 *   q's slice and k's and v's, which join: one kernel stores all three).
 *   Nodes passed over that do not join move out of the way, keeping their
 *   order: those that do not depend on the group before the anchor, those
 *   that do after the group, so that the group is contiguous. A group of
 *   the anchor alone is no group. Members get `fuse=<id>`; ids are dense.
 *   Values are unchanged: only the schedule and attributes change.
 * Does not: fuse across another anchor (a matmul never absorbs a norm or an
 *   attention: fuse_norm_prologue joins a norm to the matmul after it), or
 *   duplicate a node to fuse it in two places.
 */
#include <stdlib.h>

#include "passes/pipeline.h"
#include "passes/rewrite.h"

/* Whether node v anchors a group: a matmul, an expert_matmul routed by an index, or expert_sum (the
 * experts' weighted sum, whose epilogue is the residual add). */
static int anchors(const kir_graph *g, kir_val v)
{
    const kir_node *n = kir_node_at(g, v);
    return n->op == KIR_OP_MATMUL || (n->op == KIR_OP_EXPERT_MATMUL && n->nin >= 3 && n->in[2] != KIR_NONE) ||
           n->op == KIR_OP_EXPERT_SUM;
}

/* Nodes where a group stops growing: each starts a kernel of its own. */
static int stops_growth(const kir_graph *g, kir_val v)
{
    kir_op op = kir_node_at(g, v)->op;
    kir_fusion_class fc = kir_op_table[op].fusion;
    return fc == KIR_FUSE_MATMUL || op == KIR_OP_ATTENTION || op == KIR_OP_EMBED || op == KIR_OP_OUTPUT ||
           anchors(g, v);
}

/* Grow the group of anchor a: mark its members (member[], indexed by
 * value) and return the last one. dep (scratch, zero on entry and on
 * return) marks the nodes from a on that depend on a member. */
static kir_val grow(const kir_graph *g, kir_val a, uint8_t *member, uint8_t *dep)
{
    kir_val last = a, v;
    member[a] = dep[a] = 1;
    for (v = a + 1; v < g->n_nodes; v++) {
        const kir_node *n = kir_node_at(g, v);
        if (stops_growth(g, v) || kp_group_of(g, v) >= 0) break;
        int uses_member = 0, uses_dependent = 0;
        for (int i = 0; i < n->nin; i++) {
            kir_val in = n->in[i];
            if (in == KIR_NONE || in < a) continue;
            if (member[in]) uses_member = 1;
            else if (dep[in]) uses_dependent = 1;
        }
        if (kp_node_joins_epilogue(g, v) && uses_member && !uses_dependent) {
            member[v] = dep[v] = 1;
            last = v;
        } else {
            dep[v] = (uint8_t)(uses_member || uses_dependent);
        }
    }
    for (kir_val w = a; w < v; w++) dep[w] = 0;
    return last;
}

int kp_fuse_epilogues(kir_graph **gp, const kp_options *opt, kp_pass_stats *st, ks_diag *d)
{
    (void)d;
    const kir_graph *g = *gp;
    size_t n = g->n_nodes, groups = 0;
    kir_val *order = ks_xmalloc(sizeof *order * (n ? n : 1));
    int64_t *gid = ks_xmalloc(sizeof *gid * (n ? n : 1)); /* the new group of each member */
    uint8_t *member = ks_xcalloc(n ? n : 1, 1), *dep = ks_xcalloc(n ? n : 1, 1);
    int64_t next_id = kp_group_next_id(g);
    size_t n_order = 0;
    for (kir_val v = 0; v < n; v++) gid[v] = -1;
    for (kir_val v = 0; v < n;) {
        if (!anchors(g, v) || kp_group_of(g, v) >= 0) {
            order[n_order++] = v++;
            continue;
        }
        kir_val last = grow(g, v, member, dep);
        if (last == v) {
            member[v] = 0;
            order[n_order++] = v++;
            continue;
        }
        /* members only use members or values that do not depend on the group: always orderable */
        int orderable = kp_order_window(g, v, last, member, dep, order, &n_order);
        KS_ASSERT(orderable == 0);
        for (kir_val w = v; w <= last; w++)
            if (member[w]) gid[w] = next_id;
        for (kir_val w = v; w <= last; w++) member[w] = 0;
        next_id++;
        groups++;
        v = last + 1;
    }
    kp_regroup(gp, order, n_order, gid);
    free(order);
    free(gid);
    free(member);
    free(dep);
    st->fusions = groups;
    return 0;
}
