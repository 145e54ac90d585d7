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
 *   Then, where an attention's q is such a group's rope and its k the value of a kv_write in no group
 *   whose k is another such group's rope (of the same head size), the two groups and the kv_write become
 *   one group (q's norm and rotation, k's, and the write of k and v into the cache: one kernel), when
 *   the nodes between them can be ordered around it.
 * Does not: join a layer_norm, a norm read by more than the rope, a norm over the whole q row
 *   (OLMo 2's, reshaped before its rope), or a kv_write of int8/fp8 codes (quantize_kv's) or of K alone
 *   (share_kv's v_in_k).
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

/* The norm of the {rms_norm, rope} group whose rope is r (the norm just before it), or KIR_NONE. */
static kir_val pair_norm(const kir_graph *g, kir_val r)
{
    const kir_node *rn = kir_node_at(g, r);
    const int64_t id = kp_group_of(g, r);
    if (rn->op != KIR_OP_ROPE || id < 0 || r == 0 || rn->in[0] != r - 1) return KIR_NONE;
    const kir_node *nn = kir_node_at(g, r - 1);
    if (nn->op != KIR_OP_RMS_NORM || kp_group_of(g, r - 1) != id) return KIR_NONE;
    if (r >= 2 && kp_group_of(g, r - 2) == id) return KIR_NONE;
    if (r + 1 < g->n_nodes && kp_group_of(g, r + 1) == id) return KIR_NONE;
    return r - 1;
}

/* Each attention's q pair, k pair and kv_write as one group (the second guarantee); returns how many. */
static size_t join_q_k(kir_graph **gp)
{
    const kir_graph *g = *gp;
    const size_t n = g->n_nodes;
    kir_val *last_of = ks_xmalloc(sizeof *last_of * (n ? n : 1)); /* a window's first node: its last */
    kir_val *join = ks_xmalloc(sizeof *join * (n ? n : 1) * 5);    /* a window's first node: its 5 members */
    for (kir_val v = 0; v < n; v++) last_of[v] = KIR_NONE;
    for (kir_val a = 0; a < n; a++) {
        const kir_node *an = kir_node_at(g, a);
        if (an->op != KIR_OP_ATTENTION || kir_attr_int(g, a, KIR_A_ATTENTION_WRITE_KV) != 0 || an->nin < 3) continue;
        const kir_val rq = an->in[0], w = an->in[1];
        const kir_node *wn = kir_node_at(g, w);
        if (wn->op != KIR_OP_KV_WRITE || kp_group_of(g, w) >= 0) continue;
        /* a write of codes (quantize_kv) stays a kernel of its own: its scale is a row's amax */
        if (kir_dtype_is_quantized(kir_kv_dtype(g, w)) || kir_attr_int(g, w, KIR_A_KV_WRITE_V_IN_K)) continue;
        const kir_val rk = wn->in[0], nq = pair_norm(g, rq), nk = pair_norm(g, rk);
        if (nq == KIR_NONE || nk == KIR_NONE || nq == nk) continue;
        if (kir_node_at(g, nq)->dims[2] != kir_node_at(g, nk)->dims[2]) continue;
        const kir_val first = nq < nk ? nq : nk, last = w > rq ? w : rq;
        if (last_of[first] != KIR_NONE) continue;
        last_of[first] = last;
        const kir_val m[5] = {nq, rq, nk, rk, w};
        for (int i = 0; i < 5; i++) join[(size_t)first * 5 + i] = m[i];
    }
    kir_val *order = ks_xmalloc(sizeof *order * (n ? n : 1));
    int64_t *gid = ks_xmalloc(sizeof *gid * (n ? n : 1));
    uint8_t *member = ks_xcalloc(n ? n : 1, 1), *dep = ks_xcalloc(n ? n : 1, 1);
    size_t n_order = 0, joined = 0;
    int64_t next_id = kp_group_next_id(g);
    for (kir_val v = 0; v < n; v++) gid[v] = -1;
    for (kir_val v = 0; v < n;) {
        const kir_val last = last_of[v];
        if (last == KIR_NONE) {
            order[n_order++] = v++;
            continue;
        }
        const kir_val *m = join + (size_t)v * 5;
        for (int i = 0; i < 5; i++) member[m[i]] = 1;
        const int ok = kp_order_window(g, v, last, member, dep, order, &n_order) == 0;
        for (int i = 0; i < 5; i++) member[m[i]] = 0;
        if (!ok) { /* a node between them depends on the one group and feeds the other: left as it is */
            order[n_order++] = v++;
            continue;
        }
        for (int i = 0; i < 5; i++) gid[m[i]] = next_id;
        next_id++, joined++;
        v = last + 1;
    }
    if (joined) kp_regroup(gp, order, n_order, gid);
    free(order), free(gid), free(member), free(dep), free(last_of), free(join);
    return joined;
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
        int64_t *gid = ks_xmalloc(sizeof *gid * n), id = kp_group_next_id(g);
        for (kir_val v = 0; v < n; v++) gid[v] = -1;
        for (kir_val v = 0; v < n; v++)
            if (rope[v] != KIR_NONE) gid[v] = gid[rope[v]] = id++;
        kp_regroup(gp, order, n_order, gid);
        free(gid);
        free(order);
    }
    if (fused) fused += join_q_k(gp);
    st->fusions = fused;
    kp_uses_free(&uses);
    free(rope);
    free(moved);
    return 0;
}
