/*
 * test_plan_llama.c — the memory planner on a graph of the Llama-3-8B shape
 * (hidden 4096, 32 layers, 32 heads, 8 KV heads, head_dim 128, ffn 14336,
 * vocab 128256) at max_tokens 2048, built node for node as
 * models/llama.kiln lowers: embed; per layer rms_norm, q/k/v matmuls and
 * views, rope q and k, attention, view, o matmul, residual add; rms_norm,
 * gate matmul, silu, up matmul, mul, down matmul, residual add; final
 * rms_norm, lm_head matmul, output.
 *
 * Checked: the plan passes kir_plan_check; the lower bound and the naive
 * sum equal what the shapes give (worked out below); arena <= 1.05 x bound.
 * Twice: the whole model (the peak is the logits), and the decoder stack
 * alone with the hidden state as output (the peak is inside an MLP). Then
 * the whole model after kiln's pass pipeline (fused QKV and gate/up
 * matmuls, kv_writes, `fuse` groups run as one kernel each): the plan
 * passes the check and stays within 1.05 x its bound (with the groups'
 * liveness), and the bound is still the logits' peak.
 */
#include <inttypes.h>
#include <stdio.h>
#include <time.h>

#include "passes/pipeline.h"
#include "passes/plan_memory.h"
#include "tests/check.h"
#include "tests/graph_build.h"

enum {
    HIDDEN = 4096,
    LAYERS = 32,
    HEADS = 32,
    KV_HEADS = 8,
    HEAD_DIM = 128,
    FFN = 14336,
    VOCAB = 128256,
    MAX_TOKENS = 2048,
};

static kir_graph *build_llama(int with_head)
{
    tb_graph b;
    tb_init(&b, "llama3-8b");
    kir_val tokens = tb_input(&b, "tokens");
    kir_val positions = tb_input(&b, "positions");
    kir_val x = tb_embed(&b, tokens, VOCAB, HIDDEN);
    const int64_t qs[] = {KIR_DIM_T, HEADS, HEAD_DIM}, ks[] = {KIR_DIM_T, KV_HEADS, HEAD_DIM};
    const int64_t flat[] = {KIR_DIM_T, HEADS * HEAD_DIM};
    for (int i = 0; i < LAYERS; i++) {
        kir_val h = tb_norm(&b, KIR_OP_RMS_NORM, x);
        kir_val q = tb_reshape(&b, tb_matmul(&b, h, HEADS * HEAD_DIM), 3, qs);
        kir_val k = tb_reshape(&b, tb_matmul(&b, h, KV_HEADS * HEAD_DIM), 3, ks);
        kir_val v = tb_reshape(&b, tb_matmul(&b, h, KV_HEADS * HEAD_DIM), 3, ks);
        q = tb_rope(&b, q, positions);
        k = tb_rope(&b, k, positions);
        kir_val a = tb_attention(&b, q, k, v);
        x = tb_binary(&b, KIR_OP_ADD, x, tb_matmul(&b, tb_reshape(&b, a, 2, flat), HIDDEN));

        h = tb_norm(&b, KIR_OP_RMS_NORM, x);
        kir_val g = tb_matmul(&b, h, FFN);
        g = tb_unary(&b, KIR_OP_SILU, g);
        kir_val m = tb_binary(&b, KIR_OP_MUL, g, tb_matmul(&b, h, FFN));
        x = tb_binary(&b, KIR_OP_ADD, x, tb_matmul(&b, m, HIDDEN));
    }
    if (with_head) x = tb_matmul(&b, tb_norm(&b, KIR_OP_RMS_NORM, x), VOCAB);
    tb_output(&b, x);
    tb_verify(&b);
    return b.g;
}

static void plan_and_check(const char *name, int with_head, int fused)
{
    const uint64_t T = MAX_TOKENS, f32 = 4;
    const uint64_t hid = T * HIDDEN * f32, kv = T * KV_HEADS * HEAD_DIM * f32, ffn = T * FFN * f32;
    const uint64_t logits = T * VOCAB * f32, ids = T * 4;
    /* Not views: per layer h, q, rope q, attention, o, add, h, down, add
     * (hidden-sized), k, v, rope k (kv-sized), gate, silu, up, mul
     * (ffn-sized); then tokens, positions, embed, and with the head the
     * final norm and the logits. */
    const uint64_t naive =
        LAYERS * (9 * hid + 3 * kv + 4 * ffn) + 2 * ids + hid + (with_head ? hid + logits : 0);
    /* The most live at once: with the head, the final norm and the logits
     * (x, positions and tokens are dead by then); without, at the up matmul
     * of an MLP before the last layer: x, h, silu(gate), up and the
     * positions, which the next layer's rope reads. */
    uint64_t bound = with_head ? hid + logits : 2 * hid + 2 * ffn + ids;
    /* Fused, the final norm and the lm_head are one kernel: x, the norm and
     * the logits are live together (the MLP's kernel, x, the norm, the
     * gate/up matmul, its two slices and the positions, holds less). */
    if (fused) bound = 2 * hid + logits;

    kir_graph *g = build_llama(with_head);
    ks_diag d = {0};
    if (fused) {
        kp_options opt = {.verify = 1};
        if (!CHECK_MSG(kp_run_pipeline(&g, &opt, NULL, NULL, &d) == 0, "%s: the pass pipeline", name)) {
            kir_graph_free(g);
            return;
        }
    }
    kp_mem_plan p;
    clock_t t0 = clock();
    if (!CHECK_MSG(kp_plan_memory(g, MAX_TOKENS, &p, &d) == 0, "%s: planning", name)) {
        kir_graph_free(g);
        return;
    }
    double ms = 1000.0 * (double)(clock() - t0) / CLOCKS_PER_SEC;
    const double mib = 1024.0 * 1024.0;
    printf("%s: %zu nodes, %zu slots, max_tokens %d, planned in %.1f ms (%s)\n", name, g->n_nodes, p.n_buffers,
           MAX_TOKENS, ms, p.strategy);
    printf("  arena (planned peak) %12" PRIu64 " B  %9.1f MiB\n", p.mem.arena_bytes, p.mem.arena_bytes / mib);
    printf("  lower bound          %12" PRIu64 " B  %9.1f MiB\n", p.lower_bound_bytes, p.lower_bound_bytes / mib);
    printf("  naive sum            %12" PRIu64 " B  %9.1f MiB\n", p.naive_bytes, p.naive_bytes / mib);
    printf("  arena / bound %.4f, naive / arena %.1f\n", (double)p.mem.arena_bytes / (double)p.lower_bound_bytes,
           (double)p.naive_bytes / (double)p.mem.arena_bytes);

    ks_buf why = {0};
    CHECK_MSG(kir_plan_check(g, &p.mem, &why, NULL) == 0, "%s: plan check: %s", name, ks_buf_cstr(&why));
    ks_buf_free(&why);
    CHECK_MSG(p.lower_bound_bytes == bound, "%s: lower bound %" PRIu64 ", expected %" PRIu64, name,
              p.lower_bound_bytes, bound);
    if (!fused)
        CHECK_MSG(p.naive_bytes == naive, "%s: naive %" PRIu64 ", expected %" PRIu64, name, p.naive_bytes, naive);
    CHECK_MSG(p.mem.arena_bytes >= p.lower_bound_bytes && p.mem.arena_bytes * 100 <= p.lower_bound_bytes * 105,
              "%s: arena %" PRIu64 " is not within 1.05 x the bound %" PRIu64, name, p.mem.arena_bytes,
              p.lower_bound_bytes);
    kp_mem_plan_free(&p);
    kir_graph_free(g);
}

int main(void)
{
    plan_and_check("llama3-8b", 1, 0);
    plan_and_check("llama3-8b decoder stack", 0, 0);
    plan_and_check("llama3-8b fused", 1, 1);
    return check_finish("planner_llama");
}
