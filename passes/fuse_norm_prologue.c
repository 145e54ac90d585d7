/*
 * fuse_norm_prologue.c — a norm joins the kernel of the matmul it feeds (of each, copied, where several).
 *
 * Requires: a verified graph.
 * Guarantees: an rms_norm or layer_norm in no group whose one use is the
 *   input of a matmul joins it: the matmul's
 *   group when the matmul starts one (fuse_epilogues made it), else a new
 *   group of the two. The norm moves to just before the matmul, as the
 *   group's first node (nothing between them uses it: the matmul is its
 *   only use), so groups stay contiguous. A norm in no group whose every
 *   use is such a matmul's input (parallel attention and MLP) is first
 *   copied, one norm a use:
 *   each kernel computes the rows' statistics again (a row of a few kB per
 *   token) rather than a kernel of its own storing them. The normalized
 *   rows are internal to the kernels; values are unchanged.
 * Does not: fuse a norm with a use that is not such a matmul (it is stored
 *   anyway: a mixture of experts' norm, read by the router and the experts'
 *   routed expert_matmul), or one that feeds an attention or a group that has
 *   a norm already.
 */
#include <stdlib.h>

#include "passes/pipeline.h"
#include "passes/rewrite.h"

/* Whether node m can take norm v as its prologue: a matmul of v's rows that opens its group, if it has
 * one (so that the norm lands in front of it). Not a routed expert_matmul: its grouped kernel can take a
 * norm prologue (an IR text may group them), but measured on an H100 (bench/RESULTS.md, 2026-12-07) the
 * Qwen3-30B-A3B shape's gate/up kernel took 36.2 us a launch with it where 27.9 without, and the copy in
 * the router's matmul 10.2 where 6.4: more than the norm's own kernel (5.2) saves. */
static int takes_prologue(const kir_graph *g, kir_val m, kir_val v)
{
    const kir_node *mn = kir_node_at(g, m);
    if (mn->op != KIR_OP_MATMUL || mn->in[0] != v || (mn->nin > 1 && mn->in[1] == v)) return 0;
    if (mn->nin > 2) { /* a quantized matmul: its kernel (kcu_matmul_q) normalizes x as w4a16 and w8a16 read it,
                          while fp8 and w8a8 quantize x itself */
        const kir_word q = kir_attr_word(g, m, KIR_A_MATMUL_QUANT);
        if (q != KIR_QUANT_W4A16 && q != KIR_QUANT_W8A16) return 0;
    }
    const int64_t id = kp_group_of(g, m);
    return id < 0 || m == 0 || kp_group_of(g, m - 1) != id;
}

/* The matmul that norm v can join as its prologue, or KIR_NONE. */
static kir_val prologue_of(const kir_graph *g, const kp_uses *uses, kir_val v)
{
    kir_fusion_class fc = kir_op_table[kir_node_at(g, v)->op].fusion;
    if (fc != KIR_FUSE_NORM || kp_group_of(g, v) >= 0 || kp_use_count(uses, v) != 1) return KIR_NONE;
    kir_val m = uses->user[uses->start[v]];
    return takes_prologue(g, m, v) ? m : KIR_NONE;
}

/* Whether norm v (in no group) has several uses, each one that takes it as a prologue. */
static int shared_norm(const kir_graph *g, const kp_uses *uses, kir_val v)
{
    if (kir_op_table[kir_node_at(g, v)->op].fusion != KIR_FUSE_NORM || kp_group_of(g, v) >= 0 ||
        kp_use_count(uses, v) < 2)
        return 0;
    for (uint32_t u = uses->start[v]; u < uses->start[v + 1]; u++)
        if (!takes_prologue(g, uses->user[u], v)) return 0;
    return 1;
}

/* *gp with each shared norm copied for its second and later uses, each copy just before its use
 * (the guarantee's first step). */
static void copy_shared_norms(kir_graph **gp)
{
    const kir_graph *g = *gp;
    kp_uses uses;
    kp_uses_build(&uses, g);
    kir_val *norm_of = ks_xmalloc(sizeof *norm_of * (g->n_nodes ? g->n_nodes : 1)); /* a later use's norm */
    for (kir_val v = 0; v < g->n_nodes; v++) norm_of[v] = KIR_NONE;
    size_t copies = 0;
    for (kir_val v = 0; v < g->n_nodes; v++) {
        if (!shared_norm(g, &uses, v)) continue;
        for (uint32_t u = uses.start[v] + 1; u < uses.start[v + 1]; u++) norm_of[uses.user[u]] = v, copies++;
    }
    if (copies) {
        kp_rewriter rw;
        kp_rw_begin(&rw, g);
        for (kir_val v = 0; v < g->n_nodes; v++) {
            const kir_val nv = norm_of[v];
            if (nv != KIR_NONE) { /* the norm again, for this use alone */
                const kir_val first = rw.map[nv];
                kp_rw_copy(&rw, nv);
                kp_rw_copy(&rw, v);
                rw.map[nv] = first;
            } else {
                kp_rw_copy(&rw, v);
            }
        }
        kir_graph *out = kp_rw_end(&rw);
        kir_graph_free(*gp);
        *gp = out;
    }
    kp_uses_free(&uses);
    free(norm_of);
}

int kp_fuse_norm_prologue(kir_graph **gp, const kp_options *opt, kp_pass_stats *st, ks_diag *d)
{
    (void)d;
    copy_shared_norms(gp);
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
        /* the matmul's group, or a new one of the two */
        int64_t *gid = ks_xmalloc(sizeof *gid * n), next_id = kp_group_next_id(g);
        for (kir_val v = 0; v < n; v++) gid[v] = -1;
        for (kir_val m = 0; m < n; m++) {
            if (norm_of[m] == KIR_NONE) continue;
            const int64_t id = kp_group_of(g, m);
            gid[m] = gid[norm_of[m]] = id >= 0 ? id : next_id++;
        }
        kp_regroup(gp, order, n_order, gid);
        free(gid);
        free(order);
    }
    kp_uses_free(&uses);
    free(norm_of);
    free(moved);
    st->fusions = joined;
    return 0;
}
