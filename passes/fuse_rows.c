/*
 * fuse_rows.c — a token's routing becomes one kernel: softmax, topk, gather, sum and the elementwise ops
 * between them, over rows short enough for a warp to hold.
 *
 * Requires: a verified graph, after lower_precision and before plan_memory. Its values' dtypes are
 *   the ones their kernels store, and this pass keeps them: a group it makes computes each value as
 *   the node-by-node kernels do, rounded to its dtype (not kept in f32 as a matmul's epilogue is), so
 *   running the group as one kernel changes no number — a mixture of experts' choice of experts, which
 *   a flipped rounding can change, stays what the unfused graph chooses.
 * Guarantees: each maximal run of consecutive row nodes in no group, at least two of them and at least
 *   one reduction among them (softmax, topk, gather, sum over the last dim), gets `fuse=<id>` (new ids,
 *   then renumbered). A row node: softmax, topk, gather, sum, a unary op with a formula (ir/ops.def
 *   section 4), scale, clamp, or a binary elementwise op (add, sub, mul, div, max, min) of two operands,
 *   whose value is [T, n] with n <= KP_ROW_MAX, and each of whose operands is [T, n'] (n' == 1, or any
 *   for gather's and topk's operands). A mixture of experts' router: softmax, topk, gather, sum, div (Qwen,
 *   Mixtral) or topk, gather, softmax (gpt-oss): one group. Values and the schedule are unchanged.
 * Does not: reorder nodes to make runs contiguous, join a run to the matmul that feeds it, or group
 *   rows longer than KP_ROW_MAX (a backend holds a row in registers and shared memory).
 */
#include <stdlib.h>

#include "ir/numerics.h"
#include "passes/pipeline.h"
#include "passes/rewrite.h"

/* The longest row a group holds. */
enum { KP_ROW_MAX = 1024 };

/* A [T, n] value with n <= KP_ROW_MAX. */
static int row_value(const kir_node *n) { return n->ndim == 2 && n->dims[0] == KIR_DIM_T && n->dims[1] <= KP_ROW_MAX; }

/* Whether node v is a row op (above); *reduces: it reduces or picks along the row. */
static int row_node(const kir_graph *g, kir_val v, int *reduces)
{
    const kir_node *n = kir_node_at(g, v);
    *reduces = n->op == KIR_OP_SOFTMAX || n->op == KIR_OP_TOPK || n->op == KIR_OP_GATHER || n->op == KIR_OP_SUM;
    const int elementwise = kir_has_formula(n->op) || n->op == KIR_OP_SCALE || n->op == KIR_OP_CLAMP ||
                            (kir_has_binary(n->op) && n->nin == 2);
    if ((!*reduces && !elementwise) || kp_group_of(g, v) >= 0 || !row_value(n)) return 0;
    for (int i = 0; i < n->nin; i++) {
        if (n->in[i] == KIR_NONE) continue;
        const kir_node *a = kir_node_at(g, n->in[i]);
        if (!row_value(a)) return 0;
        if (!*reduces && a->dims[1] != n->dims[1] && a->dims[1] != 1) return 0; /* elementwise: same row or [T, 1] */
    }
    return 1;
}

int kp_fuse_rows(kir_graph **gp, const kp_options *opt, kp_pass_stats *st, ks_diag *d)
{
    (void)opt;
    (void)d;
    kir_graph *g = *gp;
    size_t groups = 0;
    int64_t next_id = kp_group_next_id(g);
    for (kir_val v = 0; v < g->n_nodes;) {
        kir_val end = v;
        int reductions = 0, reduces = 0;
        while (end < g->n_nodes && row_node(g, end, &reduces)) {
            reductions += reduces;
            end++;
        }
        if (end - v >= 2 && reductions > 0) {
            for (kir_val w = v; w < end; w++) kir_attr_set_int(g, w, KIR_A_ANY_FUSE, next_id);
            next_id++;
            groups++;
        }
        v = end > v ? end : v + 1;
    }
    if (groups) kp_group_renumber(g);
    st->fusions = groups;
    return 0;
}
