/*
 * fold_norm_weight.c — an rms_norm's weight moves into the weight of the matmul that reads it.
 *
 * Requires: a verified graph; fast precision (kp_options.compute_dtype bf16 or f16), else it changes
 *   nothing (exact precision keeps every rounding where the model puts it).
 * Guarantees: each rms_norm(x, g) whose one user is a matmul(., W) — g a plain 1-D weight that nothing
 *   else reads, W a [N, K] bf16 or f16 weight that nothing else reads, plain or fuse_sibling_matmuls'
 *   concatenation — becomes rms_norm(x) over a derived W' = W diag(g):
 *
 *       %9 : bf16[6144,4096] = weight() {name="wq[0]+wk[0]+wv[0]*attention_norm[0]", derive="concat0",
 *                                       sources="wq[0],wk[0],wv[0]", rows=[4096,1024,1024],
 *                                       scale="attention_norm[0]"}
 *
 *   rms_norm(x, g) W^T = rms_norm(x) (W diag g)^T; values change by rounding only (W' is rounded once to
 *   W's dtype where the norm rounded x g). Why: a weightless norm that feeds a matmul is a row scale of
 *   its sums, so the CUDA backend's sm_90a matmul reads x as it is and scales its f32 sums by 1 / rms
 *   from a pre-pass that reads x once (kcu_g90_rms), instead of a kernel writing the norm's value for
 *   the matmul to read back (half the norm's traffic, and the norm's kernel off the step).
 * Does not: fold layer_norm (its mean would need W's column sums in the epilogue), a norm whose
 *   weight is derived (Gemma's offset weights) or read elsewhere, a matmul whose weight is shared (tied
 *   embeddings: the embedding keeps reading W) or already scaled.
 */
#include <stdlib.h>
#include <string.h>

#include "passes/derived_weight.h"
#include "passes/pipeline.h"
#include "passes/rewrite.h"

/* The matmul weight that norm v's weight folds into, or KIR_NONE. */
static kir_val fold_target(const kir_graph *g, const kp_uses *u, kir_val v)
{
    const kir_node *n = kir_node_at(g, v);
    if (n->op != KIR_OP_RMS_NORM || n->nin < 2 || n->in[1] == KIR_NONE || kp_use_count(u, v) != 1) return KIR_NONE;
    const kir_val gw = n->in[1];
    const kir_node *gn = kir_node_at(g, gw);
    if (gn->op != KIR_OP_WEIGHT || kp_weight_is_derived(g, gw) || gn->ndim != 1 || kp_use_count(u, gw) != 1)
        return KIR_NONE;
    const kir_node *m = kir_node_at(g, u->user[u->start[v]]);
    if (m->op != KIR_OP_MATMUL || m->in[0] != v || m->in[1] == v) return KIR_NONE;
    const kir_val w = m->in[1];
    const kir_node *wn = kir_node_at(g, w);
    if (wn->op != KIR_OP_WEIGHT || (wn->dtype != KIR_BF16 && wn->dtype != KIR_F16) || wn->ndim != 2 ||
        wn->dims[1] != gn->dims[0] || kp_use_count(u, w) != 1 || kir_attr_has(g, w, KIR_A_WEIGHT_SCALE))
        return KIR_NONE;
    if (kp_weight_is_derived(g, w) && kir_attr_word(g, w, KIR_A_WEIGHT_DERIVE) != KIR_DERIVE_CONCAT0) return KIR_NONE;
    return w;
}

/* W' in place of weight w: its data W diag(g), g the weight named gname. */
static kir_val emit_scaled(kp_rewriter *rw, kir_val w, const char *gname)
{
    const kir_graph *g = rw->old;
    const kir_node *wn = kir_node_at(g, w);
    const char *wname = kir_attr_str(g, w, KIR_A_WEIGHT_NAME);
    ks_buf name = {0};
    ks_buf_printf(&name, "%s*%s", wname, gname);
    kir_val s = kir_weight(rw->g, ks_buf_cstr(&name), wn->dtype, 2, wn->dims, wn->loc);
    kir_attr_set_word(rw->g, s, KIR_A_WEIGHT_DERIVE, KIR_DERIVE_CONCAT0);
    if (kp_weight_is_derived(g, w)) {
        uint32_t n_rows = 0;
        const int64_t *rows = kir_attr_ints(g, w, KIR_A_WEIGHT_ROWS, &n_rows);
        kir_attr_set_str(rw->g, s, KIR_A_WEIGHT_SOURCES, kir_attr_str(g, w, KIR_A_WEIGHT_SOURCES));
        kir_attr_set_ints(rw->g, s, KIR_A_WEIGHT_ROWS, rows, n_rows);
    } else {
        kir_attr_set_str(rw->g, s, KIR_A_WEIGHT_SOURCES, wname);
        kir_attr_set_ints(rw->g, s, KIR_A_WEIGHT_ROWS, &wn->dims[0], 1);
    }
    kir_attr_set_str(rw->g, s, KIR_A_WEIGHT_SCALE, gname);
    ks_buf_free(&name);
    rw->map[w] = s;
    return s;
}

int kp_fold_norm_weight(kir_graph **gp, const kp_options *opt, kp_pass_stats *st, ks_diag *d)
{
    (void)d;
    st->fusions = 0;
    if (opt->compute_dtype != KIR_BF16 && opt->compute_dtype != KIR_F16) return 0;
    const kir_graph *g = *gp;
    const size_t n = g->n_nodes;
    kp_uses u;
    kp_uses_build(&u, g);
    /* norm_of[w]: the norm whose weight matmul weight w takes (KIR_NONE: none); folded[v]: norm v gives its weight */
    kir_val *norm_of = ks_xmalloc(sizeof *norm_of * (n ? n : 1));
    uint8_t *folded = ks_xcalloc(n ? n : 1, 1);
    for (kir_val v = 0; v < n; v++) norm_of[v] = KIR_NONE;
    size_t count = 0;
    for (kir_val v = 0; v < n; v++) {
        kir_val w = fold_target(g, &u, v);
        if (w == KIR_NONE) continue;
        norm_of[w] = v;
        folded[v] = 1;
        count++;
    }
    if (count) {
        kp_rewriter rw;
        kp_rw_begin(&rw, g);
        for (kir_val v = 0; v < n; v++) {
            if (norm_of[v] != KIR_NONE) {
                const kir_val gw = kir_node_at(g, norm_of[v])->in[1];
                emit_scaled(&rw, v, kir_attr_str(g, gw, KIR_A_WEIGHT_NAME));
            } else if (folded[v]) {
                const kir_val in[2] = {rw.map[kir_node_at(g, v)->in[0]], KIR_NONE};
                kp_rw_rebuild(&rw, v, in, 2, NULL, 0);
            } else {
                kp_rw_copy(&rw, v);
            }
        }
        kir_graph *out = kp_rw_end(&rw);
        kir_graph_free(*gp);
        *gp = out;
    }
    st->fusions = count;
    kp_uses_free(&u);
    free(norm_of);
    free(folded);
    return 0;
}
