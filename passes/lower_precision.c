/*
 * lower_precision.c — half-precision compute: what a step stores in memory
 * becomes f16 or bf16; what a kernel keeps in registers stays f32.
 *
 * Requires: a verified graph, after the fusion passes (it reads the `fuse`
 *   groups: what a group keeps to itself is not stored) and before
 *   plan_memory (which sizes each value by its dtype). Nodes rebuilt by a
 *   later pass (kp_rw_rebuild) would be f32 again: no pass after it rebuilds.
 * Guarantees: with opt->compute_dtype f16 or bf16 ("fast" precision):
 *   - every float value a kernel writes to memory gets that dtype: a value
 *     computed outside any group, or a value of a group that a node outside
 *     the group reads (directly or through a view: reshape, kv_write);
 *   - except the values the graph's output reads (through views): the
 *     logits stay f32; and a value marked keep_f32 (the language's
 *     float32(x)) with every value computed from such values alone
 *     (weights and i32 indices aside): DeepSeek's router, as Hugging Face
 *     computes it;
 *   - a norm that a matmul (or expert_matmul) of its group reads as x (a norm fused as the
 *     matmul's prologue) gets that dtype too: the matmul multiplies x and
 *     the weights in their half dtype, on the tensor cores as they are
 *     (one mma a product, not three parts of an f32 x), so the norm's
 *     values are rounded where they are computed (as a half model's norm
 *     output is rounded before its projections in Hugging Face's models);
 *   - a group's other values stay f32 (a fused kernel holds them in
 *     registers), and so do the matmuls' accumulators, norms' statistics
 *     and attention's scores and softmax in every kernel: dtypes say where
 *     values are rounded, not how they are computed;
 *   - views take their operand's dtype again (their bytes are its bytes);
 *   - every attention and kv_write gets kv_dtype = the compute dtype: the KV
 *     cache holds half K/V rows, rounded as they are written;
 *   - every unary op with a formula (ir/ops.def section 4: silu, gelu, ...)
 *     and every rope gets half_math=1: it computes the formula's half form,
 *     or the rotation's cosine and sine, in float, in or out of a group
 *     (the interpreter and every backend read the attr).
 *   Rounding is to nearest even, as a value is stored. With f32 ("exact"
 *   precision, the default of f32 engines) the graph is not touched.
 * Does not: change weights (kiln build --dtype does), the schedule, the
 *   groups, or inputs (i32 token ids and positions).
 */
#include <stdlib.h>

#include "ir/numerics.h"
#include "passes/pipeline.h"
#include "passes/rewrite.h"

/* Ops whose value is their first operand's bytes. */
static int is_view(kir_op op) { return op == KIR_OP_RESHAPE || op == KIR_OP_KV_WRITE || op == KIR_OP_OUTPUT; }

/* Ops that compute a float value of their own (not weights, inputs, views). */
static int computes(const kir_node *n)
{
    return n->op != KIR_OP_WEIGHT && n->op != KIR_OP_INPUT && !is_view(n->op) && n->dtype == KIR_F32;
}

int kp_lower_precision(kir_graph **gp, const kp_options *opt, kp_pass_stats *st, ks_diag *d)
{
    (void)d;
    kir_graph *g = *gp;
    st->fusions = 0;
    kir_dtype half = opt->compute_dtype;
    if (half != KIR_F16 && half != KIR_BF16) return 0;
    size_t n = g->n_nodes;
    kp_uses uses;
    kp_uses_build(&uses, g);
    /* stored[v]: v's bytes are written to memory; keep_f32[v]: the output reads them */
    /* prologue[v]: v is a norm that a matmul of its group reads as x */
    uint8_t *stored = ks_xcalloc(n ? n : 1, 1), *keep_f32 = ks_xcalloc(n ? n : 1, 1), *prologue = ks_xcalloc(n ? n : 1, 1);
    for (size_t i = n; i-- > 0;) {
        kir_val v = (kir_val)i;
        const kir_node *node = &g->nodes[v];
        if (node->op == KIR_OP_OUTPUT) keep_f32[v] = 1;
        int64_t group = kp_group_of(g, v);
        for (uint32_t k = uses.start[v]; k < uses.start[v + 1]; k++) {
            kir_val u = uses.user[k];
            int view_user = is_view(g->nodes[u].op) && g->nodes[u].in[0] == v;
            if (group < 0 || kp_group_of(g, u) != group || (view_user && stored[u])) stored[v] = 1;
            if (view_user && keep_f32[u]) keep_f32[v] = 1;
            if ((node->op == KIR_OP_RMS_NORM || node->op == KIR_OP_LAYER_NORM) && group >= 0 &&
                (g->nodes[u].op == KIR_OP_MATMUL || g->nodes[u].op == KIR_OP_EXPERT_MATMUL) &&
                g->nodes[u].in[0] == v && kp_group_of(g, u) == group)
                prologue[v] = 1;
        }
    }
    /* float32(x) (keep_f32): x, and a value computed from such values alone (their views, i32 indices
       aside), stay f32: in schedule order, operands first */
    uint8_t *pinned = ks_xcalloc(n ? n : 1, 1);
    for (size_t v = 0; v < n; v++) {
        const kir_node *node = &g->nodes[v];
        if (kir_attr_int(g, (kir_val)v, KIR_A_ANY_KEEP_F32)) {
            pinned[v] = 1;
        } else if (node->op != KIR_OP_WEIGHT && node->op != KIR_OP_INPUT) {
            int floats = 0, kept = 0;
            for (int k = 0; k < node->nin; k++) {
                kir_val in = node->in[k];
                if (in == KIR_NONE || g->nodes[in].op == KIR_OP_WEIGHT || g->nodes[in].dtype == KIR_I32) continue;
                floats++;
                kept += pinned[in];
            }
            pinned[v] = floats && kept == floats;
        }
        keep_f32[v] |= pinned[v];
    }
    for (size_t v = 0; v < n; v++) {
        kir_node *node = &g->nodes[v];
        if (computes(node) && (stored[v] || prologue[v]) && !keep_f32[v]) {
            node->dtype = half;
            st->fusions++;
        }
        if ((kir_has_formula(node->op) || node->op == KIR_OP_ROPE) && !pinned[v]) /* float32's: the f32 form */
            kir_attr_set_int(g, (kir_val)v, KIR_A_ANY_HALF_MATH, 1);
        if (node->op == KIR_OP_ATTENTION || node->op == KIR_OP_KV_WRITE)
            kir_attr_set_word(g, (kir_val)v, node->op == KIR_OP_ATTENTION ? KIR_A_ATTENTION_KV_DTYPE : KIR_A_KV_WRITE_KV_DTYPE,
                              kir_kv_dtype_word(half));
        if (is_view(node->op)) { /* its operand's dtype, as the shape rule gives it */
            ks_buf err = {0};
            if (kir_infer(g, (kir_val)v, &err) != 0)
                ks_die(__FILE__, __LINE__, "lower_precision: a view no longer fits: %s", ks_buf_cstr(&err));
            ks_buf_free(&err);
        }
    }
    free(stored);
    free(keep_f32);
    free(pinned);
    free(prologue);
    kp_uses_free(&uses);
    return 0;
}
