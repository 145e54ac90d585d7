/*
 * quantize_kv.c — the KV cache as int8 or fp8 codes (--kv-dtype).
 *
 * Requires: a verified graph; runs after lower_precision, whose kv_dtype
 *   (the compute dtype) it replaces, and after the epilogue groups are made.
 * Guarantees: with kp_options.kv_dtype KIR_I8 or KIR_F8E4M3, every attention
 *   and kv_write stores and reads its K/V rows as that dtype's codes
 *   (kv_dtype="i8" or "f8e4m3"), each (position, KV head) row with a scale
 *   of its own, written once with the row (ir/quant.h, kir_kv_round). The
 *   values the cache gives back are the codes times their scales; what
 *   attention computes with them does not change. Counts one fusion a node
 *   it marks.
 *   A kv_write of codes is in no group: a row's scale is the amax of the
 *   whole (position, head) row, a reduction over a head that the matmul
 *   epilogue writing k and v a tile at a time does not have. One that was
 *   in a group moves to right after the group's last node (nothing in the
 *   group reads it: its value is k, read by the attention), so the group
 *   stays contiguous and stores k and v for it; groups are renumbered.
 * Does not: touch any other node, or the graph when kv_dtype is KIR_F32 (0).
 */
#include <stdlib.h>

#include "passes/pipeline.h"
#include "passes/rewrite.h"

/* Whether a node of v's group (other than v) reads v. */
static int group_reads(const kir_graph *g, kir_val v, int64_t id)
{
    for (size_t u = v + 1; u < g->n_nodes && kp_group_of(g, (kir_val)u) == id; u++)
        for (int i = 0; i < g->nodes[u].nin; i++)
            if (g->nodes[u].in[i] == v) return 1;
    return 0;
}

/* The graph with each grouped kv_write (that its group does not read) after its group's run, in no group. */
static kir_graph *ungroup_writes(const kir_graph *g)
{
    const size_t n = g->n_nodes;
    kir_val *order = ks_xmalloc(sizeof *order * (n ? n : 1)), *held = ks_xmalloc(sizeof *held * (n ? n : 1));
    size_t count = 0, n_held = 0;
    int64_t held_of = -1; /* the group whose writes are held */
    for (size_t v = 0; v < n; v++) {
        const int64_t id = kp_group_of(g, (kir_val)v);
        if (n_held > 0 && id != held_of && g->nodes[v].op != KIR_OP_WEIGHT && g->nodes[v].op != KIR_OP_INPUT) {
            for (size_t i = 0; i < n_held; i++) order[count++] = held[i];
            n_held = 0;
        }
        if (g->nodes[v].op == KIR_OP_KV_WRITE && id >= 0 && !group_reads(g, (kir_val)v, id)) {
            held[n_held++] = (kir_val)v;
            held_of = id;
            continue;
        }
        order[count++] = (kir_val)v;
    }
    for (size_t i = 0; i < n_held; i++) order[count++] = held[i];
    kir_graph *out = kp_reorder(g, order, count, NULL);
    free(order);
    free(held);
    return out;
}

int kp_quantize_kv(kir_graph **gp, const kp_options *opt, kp_pass_stats *st, ks_diag *d)
{
    (void)d;
    if (opt->kv_dtype != KIR_I8 && opt->kv_dtype != KIR_F8E4M3) return 0;
    kir_graph *g = ungroup_writes(*gp);
    kir_graph_free(*gp);
    *gp = g;
    const kir_word w = kir_kv_dtype_word(opt->kv_dtype);
    for (size_t v = 0; v < g->n_nodes; v++) {
        const kir_op op = g->nodes[v].op;
        if (op != KIR_OP_ATTENTION && op != KIR_OP_KV_WRITE) continue;
        kir_attr_set_word(g, (kir_val)v, op == KIR_OP_ATTENTION ? KIR_A_ATTENTION_KV_DTYPE : KIR_A_KV_WRITE_KV_DTYPE, w);
        if (op == KIR_OP_KV_WRITE && (v + 1 >= g->n_nodes || kp_group_of(g, (kir_val)v) != kp_group_of(g, (kir_val)(v + 1))))
            kp_group_leave(g, (kir_val)v); /* the last of its run (ungroup_writes put it there), or in none */
        st->fusions++;
    }
    kp_group_renumber(g);
    return 0;
}
