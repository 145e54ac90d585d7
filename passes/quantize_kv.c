/*
 * quantize_kv.c — the KV cache as int8 or fp8 codes (--kv-dtype).
 *
 * Requires: a verified graph; runs after lower_precision, whose kv_dtype
 *   (the compute dtype) it replaces.
 * Guarantees: with kp_options.kv_dtype KIR_I8 or KIR_F8E4M3, every attention
 *   and kv_write stores and reads its K/V rows as that dtype's codes
 *   (kv_dtype="i8" or "f8e4m3"), each (position, KV head) row with a scale
 *   of its own, written once with the row (ir/quant.h, kir_kv_round). The
 *   values the cache gives back are the codes times their scales; what
 *   attention computes with them does not change. Counts one fusion a node
 *   it marks.
 * Does not: touch any other node, or the graph when kv_dtype is KIR_F32 (0).
 */
#include "passes/pipeline.h"

int kp_quantize_kv(kir_graph **gp, const kp_options *opt, kp_pass_stats *st, ks_diag *d)
{
    (void)d;
    if (opt->kv_dtype != KIR_I8 && opt->kv_dtype != KIR_F8E4M3) return 0;
    kir_graph *g = *gp;
    const kir_word w = kir_kv_dtype_word(opt->kv_dtype);
    for (size_t v = 0; v < g->n_nodes; v++) {
        const kir_op op = g->nodes[v].op;
        if (op != KIR_OP_ATTENTION && op != KIR_OP_KV_WRITE) continue;
        kir_attr_set_word(g, (kir_val)v, op == KIR_OP_ATTENTION ? KIR_A_ATTENTION_KV_DTYPE : KIR_A_KV_WRITE_KV_DTYPE, w);
        st->fusions++;
    }
    return 0;
}
