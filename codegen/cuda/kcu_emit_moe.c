/*
 * kcu_emit_moe.c — the kernels of a mixture of experts' routing ops (ir/ops.def: sum, topk, gather,
 * expert_matmul, expert_sum), each standalone; all but expert_matmul's dot products (32 lanes' sums,
 * then a butterfly) computed as the interpreter computes them (runtime/interp/interp_kernels.c), so
 * that an engine's logits match the reference's to a few ulps.
 *
 * The routing ops are one thread an output element. expert_matmul in fast precision (x and weights of
 * one half dtype) is the grouped matmul, kcu_moe_matmul (kcu_prelude.cuh): a block an expert the step
 * chose and 64 of its weight rows, over the rows routed to it, on tensor cores, so that each chosen
 * expert's weights are read once for all the tokens that chose it (16 routed rows a tile in a decode
 * step, 64 in a prompt's), every row summed in one order whatever the step (batch invariant); a gate
 * and up merged into one weight (passes/fuse_sibling_matmuls.c) with their SwiGLU in its group
 * (passes/fuse_epilogues.c) become one such kernel, kcu_moe_swiglu. Elsewhere (f32) expert_matmul is a
 * warp an output row (coalesced 16-byte loads of the chosen expert's row), each row read once per token
 * that chose it. expert_sum and the residual add after it are one kernel (its group). Not yet: the
 * weighted sum inside the down projection's kernel.
 */
#include "codegen/cuda/kcu_gen.h"
#include "ir/numerics.h"

#include <stdlib.h>

/* sum over the last dim: one thread a row, in order, in double, rounded once (the interpreter's). */
static int emit_sum(kcu_gen *x, kir_val v)
{
    const kir_node *n = &x->g->nodes[v], *a = &x->g->nodes[n->in[0]];
    int64_t rows = kir_row_elems(n), d = kcu_last_dim(a);
    krt_cuda_kernel *k = kcu_elementwise_kernel(x, v, rows);
    kcu_param_in(x, k, n->in[0], "x");
    kcu_param_out(x, k, v);
    kcu_open_body(x, k, "the sum of each row over the last dim, in order, in double");
    kcu_elementwise_prologue(x, rows);
    ks_buf_printf(&x->body,
                  "    double s = 0.0;\n"
                  "    for (int j = 0; j < %lld; j++) s += (double)%sx[i * %lldLL + j]%s;\n",
                  (long long)d, kcu_ld(a->dtype), (long long)d, kcu_ld_end(a->dtype));
    kcu_put_store(&x->body, n->dtype, "    ", "out[i]", "(float)s");
    ks_buf_puts(&x->body, "}\n");
    kcu_kernel_end(x, k, "");
    return 0;
}

/* amax, amin: each row's largest or smallest over the last dim, in order, a NaN kept (the interpreter's
 * run_extreme: max's and min's rule, kir_binary_write) */
static int emit_extreme(kcu_gen *x, kir_val v)
{
    const kir_node *n = &x->g->nodes[v], *a = &x->g->nodes[n->in[0]];
    int64_t rows = kir_row_elems(n), d = kcu_last_dim(a);
    krt_cuda_kernel *k = kcu_elementwise_kernel(x, v, rows);
    kcu_param_in(x, k, n->in[0], "x");
    kcu_param_out(x, k, v);
    const int largest = n->op == KIR_OP_AMAX;
    kcu_open_body(x, k, largest ? "the largest of each row over the last dim (a NaN kept)"
                                : "the smallest of each row over the last dim (a NaN kept)");
    kcu_elementwise_prologue(x, rows);
    ks_buf_printf(&x->body, "    float m = %sx[i * %lldLL]%s;\n", kcu_ld(a->dtype), (long long)d, kcu_ld_end(a->dtype));
    ks_buf_printf(&x->body,
                  "    for (int j = 1; j < %lld; j++) {\n"
                  "        const float e = %sx[i * %lldLL + j]%s;\n"
                  "        m = ",
                  (long long)d, kcu_ld(a->dtype), (long long)d, kcu_ld_end(a->dtype));
    ks_buf expr = {0};
    kir_binary_write(largest ? KIR_OP_MAX : KIR_OP_MIN, "m", "e", &expr, NULL);
    ks_buf_printf(&x->body, "%s;\n    }\n", ks_buf_cstr(&expr));
    ks_buf_free(&expr);
    kcu_put_store(&x->body, n->dtype, "    ", "out[i]", "m");
    ks_buf_puts(&x->body, "}\n");
    kcu_kernel_end(x, k, "");
    return 0;
}

/* topk over rows of at most TOPK_WARP_D: a warp a token (8 tokens a block), lane l holding the row's
 * elements l, l + 32, ...; k rounds, each the warp's best of what no round took (each lane its own, then
 * a butterfly of shuffles), by one total order — a NaN above every number, then the larger, then the
 * lower index — the interpreter's ranks_above, so the same indices in the same order. A thread a token
 * (below) walked a row of 128 experts k times in series: tens of µs at batch 1. */
enum { TOPK_WARP_D = 2048 };

/* The warp's k rounds over a row of d elements, element c's f32 value the expression elem (of c);
 * after each round, lane 0 runs `put` (j: the round, bi: the index chosen), after indent. */
static void put_warp_topk(ks_buf *b, const char *indent, int64_t d, int64_t kk, const char *elem, const char *put)
{
    ks_buf_printf(b,
                  "%1$senum { D = %2$lld, K = %3$lld, L = (D + 31) / 32 };\n"
                  "%1$sfloat e[L];\n"
                  "%1$sunsigned long long taken = 0; /* bit q: element lane + 32 q was taken */\n"
                  "#pragma unroll\n"
                  "%1$sfor (int q = 0; q < L; q++) { const int c = lane + 32 * q; e[q] = c < D ? %4$s : 0.0f; }\n"
                  "%1$s/* a above b: a NaN above a number, then the larger, then the lower index */\n"
                  "%1$sauto above = [](float av, int ai, float bv, int bi) {\n"
                  "%1$s    if (av != av || bv != bv) return av != av && (bv == bv || ai < bi);\n"
                  "%1$s    return av > bv || (av == bv && ai < bi);\n"
                  "%1$s};\n"
                  "%1$sfor (int j = 0; j < K; j++) {\n"
                  "%1$s    float bv = 0.0f;\n"
                  "%1$s    int bi = -1;\n"
                  "#pragma unroll\n"
                  "%1$s    for (int q = 0; q < L; q++) {\n"
                  "%1$s        const int c = lane + 32 * q;\n"
                  "%1$s        if (c < D && !((taken >> q) & 1ull) && (bi < 0 || above(e[q], c, bv, bi))) bv = e[q], bi = c;\n"
                  "%1$s    }\n"
                  "%1$s    for (int m = 16; m > 0; m >>= 1) {\n"
                  "%1$s        const float ov = __shfl_xor_sync(0xffffffffu, bv, m);\n"
                  "%1$s        const int oi = __shfl_xor_sync(0xffffffffu, bi, m);\n"
                  "%1$s        if (oi >= 0 && (bi < 0 || above(ov, oi, bv, bi))) bv = ov, bi = oi;\n"
                  "%1$s    }\n"
                  "%1$s    if (bi >= 0 && bi %% 32 == lane) taken |= 1ull << (bi / 32);\n"
                  "%1$s    if (lane == 0) {\n"
                  "%5$s"
                  "%1$s    }\n"
                  "%1$s}\n",
                  indent, (long long)d, (long long)kk, elem, put);
}

static int emit_topk_warp(kcu_gen *x, kir_val v)
{
    const kir_node *n = &x->g->nodes[v], *a = &x->g->nodes[n->in[0]];
    const int64_t d = kcu_last_dim(a), kk = kcu_last_dim(n);
    enum { WARPS = EW_THREADS / 32 };
    krt_cuda_kernel *k = kcu_kernel_new(x, v, EW_THREADS);
    kcu_kernel_grid(k, 0, 1, 0, WARPS);
    kcu_param_in(x, k, n->in[0], "x");
    kcu_param_out(x, k, v);
    kcu_open_body(x, k, "the indices of the k largest of each row, largest first (NaN first, ties to the lower "
                        "index), a warp a row");
    ks_buf_printf(&x->body,
                  "    const long long i0 = (long long)blockIdx.x * %d + threadIdx.x / 32;\n"
                  "    const bool live = i0 < T; /* the same in every lane: no return before the shuffles */\n"
                  "    const long long i = live ? i0 : T - 1;\n"
                  "    const int lane = threadIdx.x %% 32;\n",
                  WARPS);
    ks_buf elem = {0};
    ks_buf_printf(&elem, "%sx[i * D + c]%s", kcu_ld(a->dtype), kcu_ld_end(a->dtype));
    put_warp_topk(&x->body, "    ", d, kk, ks_buf_cstr(&elem), "            if (live) out[i * K + j] = bi;\n");
    ks_buf_free(&elem);
    ks_buf_puts(&x->body, "}\n");
    kcu_kernel_end(x, k, "warp");
    return 0;
}

/* topk: one thread a token, k passes of a selection (a NaN above every number, equal values by the
 * lower index: the interpreter's ranks_above). */
static int emit_topk(kcu_gen *x, kir_val v)
{
    const kir_node *n = &x->g->nodes[v], *a = &x->g->nodes[n->in[0]];
    int64_t d = kcu_last_dim(a), kk = kcu_last_dim(n);
    if (d <= TOPK_WARP_D) return emit_topk_warp(x, v);
    krt_cuda_kernel *k = kcu_elementwise_kernel(x, v, 1);
    kcu_param_in(x, k, n->in[0], "x");
    kcu_param_out(x, k, v);
    kcu_open_body(x, k, "the indices of the k largest of each row, largest first (NaN first, ties to the lower index)");
    kcu_elementwise_prologue(x, 1);
    ks_buf_printf(&x->body,
                  "    enum { D = %lld, K = %lld };\n"
                  "    for (int j = 0; j < K; j++) {\n"
                  "        int best = -1;\n"
                  "        float bv = 0.0f;\n"
                  "        for (int c = 0; c < D; c++) {\n"
                  "            int taken = 0;\n"
                  "            for (int q = 0; q < j; q++) taken |= out[i * K + q] == c;\n"
                  "            if (taken) continue;\n"
                  "            const float e = %sx[i * D + c]%s;\n"
                  "            const int above = best < 0 || ((e != e || bv != bv) ? (e != e && bv == bv) : e > bv);\n"
                  "            if (above) best = c, bv = e;\n"
                  "        }\n"
                  "        out[i * K + j] = best;\n"
                  "    }\n"
                  "}\n",
                  (long long)d, (long long)kk, kcu_ld(a->dtype), kcu_ld_end(a->dtype));
    kcu_kernel_end(x, k, "");
    return 0;
}

/* gather: out[t,j] = x[t, idx[t,j]], one thread an element. */
static int emit_gather(kcu_gen *x, kir_val v)
{
    const kir_node *n = &x->g->nodes[v], *a = &x->g->nodes[n->in[0]];
    int64_t d = kcu_last_dim(a), kk = kcu_last_dim(n);
    krt_cuda_kernel *k = kcu_elementwise_kernel(x, v, kk);
    kcu_param_in(x, k, n->in[0], "x");
    kcu_param_in(x, k, n->in[1], "idx");
    kcu_param_out(x, k, v);
    kcu_open_body(x, k, "x[t, idx[t, j]]");
    kcu_elementwise_prologue(x, kk);
    ks_buf e = {0};
    ks_buf_printf(&e, "%sx[(i / %lld) * %lldLL + idx[i]]%s", kcu_ld(a->dtype), (long long)kk, (long long)d,
                  kcu_ld_end(a->dtype));
    kcu_put_store(&x->body, n->dtype, "    ", "out[i]", ks_buf_cstr(&e));
    ks_buf_free(&e);
    ks_buf_puts(&x->body, "}\n");
    kcu_kernel_end(x, k, "");
    return 0;
}

/* Whether expert_matmul node v takes the grouped matmul: routed by idx, x and weights of one half
 * dtype, rows of whole 16-byte chunks, and a target whose blocks can opt into the kernels' shared memory
 * (the decode kernel's 8-stage ring is the larger: kcu_moe_smem). */
static int moe_grouped_inputs(const kcu_gen *x, kir_val v)
{
    const kir_node *n = &x->g->nodes[v], *in = &x->g->nodes[n->in[0]], *w = &x->g->nodes[n->in[1]];
    return n->nin > 2 && n->in[2] != KIR_NONE && kcu_is_half(w->dtype) && in->dtype == w->dtype &&
           w->dims[2] % 8 == 0 && w->dims[1] < INT32_MAX / 64 &&
           x->opt.smem_optin >= kcu_moe_smem(MOE_BT_DECODE) + w->dims[0] + 1024;
}

/* ... and the grouped matmul stores its results itself: of a half dtype (a group's f32 value goes node by node). */
static int moe_grouped(const kcu_gen *x, kir_val v) { return moe_grouped_inputs(x, v) && kcu_is_half(x->g->nodes[v].dtype); }

/* The first expert_matmul after node `after` that idx routes, or KIR_NONE. */
static kir_val routed_matmul(const kir_graph *g, kir_val idx, kir_val after)
{
    for (size_t u = (size_t)after + 1; u < g->n_nodes; u++) {
        const kir_node *n = &g->nodes[u];
        if (n->op == KIR_OP_EXPERT_MATMUL && n->nin > 2 && n->in[2] == idx) return (kir_val)u;
    }
    return KIR_NONE;
}

/* A routing kernel knows the experts its tokens chose before the grouped matmul after it does: as each
 * choice is made, the chosen expert's weights of that matmul (its [rows, depth] slab) go into L2, the
 * first kcu_options.l2_ahead_mb MB of them over the step's T k choices (kcu_l2_expert); off unless
 * asked for (measured slower). */

/* The grouped matmul's kernels (kcu_moe_matmul) for node v, whose results go to the epilogue `epi`
 * (a kcu_moe_* functor's type and initializer, over the kernel's parameters), `cols` outputs a tile
 * of the weight's rows. The caller has added the parameters: x, w, idx, then the epilogue's. */
static void moe_grouped_kernels(kcu_gen *x, krt_cuda_kernel *k, kir_val mm, const char *what, const char *pro,
                                const char *epi, int64_t tiles)
{
    const kir_node *n = &x->g->nodes[mm], *in = &x->g->nodes[n->in[0]], *w = &x->g->nodes[n->in[1]];
    const int64_t experts = w->dims[0], rows = w->dims[1], depth = w->dims[2], kk = n->dims[1];
    kcu_kernel_grid(k, 0, 0, tiles, 1);
    kcu_kernel_grid(k, 1, kk, 0, 1);
    kcu_kernel_grid_cap(k, 1, experts); /* a block an expert the step chose: min(T k, experts) */
    const int bt_large = x->opt.moe_bt_large ? x->opt.moe_bt_large : MOE_BT_LARGE;
    k->smem = kcu_moe_smem(MOE_BT_DECODE);
    k->smem_large = kcu_moe_smem(bt_large);
    /* the next grouped matmul of these choices (the down projection after the gate and up): each block
     * prefetches its share of its expert's slab of those weights into L2 as it ends */
    const kir_val next = x->opt.l2_ahead_mb > 0 ? routed_matmul(x->g, n->in[2], mm) : KIR_NONE;
    const kir_node *nw = next != KIR_NONE ? &x->g->nodes[x->g->nodes[next].in[1]] : NULL;
    ks_buf ahead = {0};
    if (nw && nw->op == KIR_OP_WEIGHT && nw->dims[0] == experts && k->n_args < KRT_CUDA_MAX_ARGS) {
        const int64_t slab = nw->dims[1] * nw->dims[2] * (int64_t)kir_dtype_size(nw->dtype);
        if (slab % 16 == 0) {
            kcu_param_in(x, k, x->g->nodes[next].in[1], "next_w");
            ks_buf_printf(&ahead, ", next_w, %lldLL, %lldLL", (long long)slab,
                          (long long)((int64_t)x->opt.l2_ahead_mb << 20));
        }
    }
    kcu_open_body(x, k, what);
    for (int large = 0; large < 2; large++) {
        if (large) kcu_open_large(x, k, kcu_decode_t(x));
        ks_buf_printf(&x->body, "    kcu_moe_matmul<%s, %lld, %lld, %lld, %lld, %d, %s>(T, x, w, idx, %s, %s%s);\n}\n",
                      kcu_elem_type(w->dtype), (long long)depth, (long long)rows, (long long)experts, (long long)kk,
                      large ? bt_large : MOE_BT_DECODE, in->ndim == 3 ? "true" : "false", pro ? pro : "kcu_pro_none()",
                      epi, ks_buf_cstr(&ahead));
    }
    ks_buf_free(&ahead);
}

/* Whether norm node pn (KIR_NONE: none) can be expert_matmul mm's prologue in the grouped kernel: an
 * rms_norm or layer_norm of x rows of the weights' dtype, its value read by mm alone. */
static int moe_prologue_ok(const kcu_gen *x, kir_val pn, kir_val mm, const uint8_t *read_outside)
{
    if (pn == KIR_NONE) return 1;
    const kir_node *p = &x->g->nodes[pn], *n = &x->g->nodes[mm];
    return (p->op == KIR_OP_RMS_NORM || p->op == KIR_OP_LAYER_NORM) && n->in[0] == pn && !read_outside[pn] &&
           x->g->nodes[p->in[0]].dtype == x->g->nodes[n->in[1]].dtype && p->ndim == 2;
}

/* The grouped kernel's parameters x (the norm's input where pn is a prologue), w, idx and the norm's
 * weights; its prologue's initializer into pro (kcu_pro_rms / _ln; nothing without one). */
static void moe_grouped_params(kcu_gen *x, krt_cuda_kernel *k, kir_val mm, kir_val pn, ks_buf *pro)
{
    const kir_graph *g = x->g;
    const kir_node *n = &g->nodes[mm];
    const kir_node *p = pn != KIR_NONE ? &g->nodes[pn] : NULL;
    kcu_param_in(x, k, p ? p->in[0] : n->in[0], "x");
    kcu_param_in(x, k, n->in[1], "w");
    kcu_param_in(x, k, n->in[2], "idx");
    if (!p) return;
    const int rms = p->op == KIR_OP_RMS_NORM, has_g = p->nin > 1 && p->in[1] != KIR_NONE,
              has_b = !rms && p->nin > 2 && p->in[2] != KIR_NONE;
    if (has_g) kcu_param_in(x, k, p->in[1], "g");
    if (has_b) kcu_param_in(x, k, p->in[2], "gb");
    ks_buf_printf(pro, "kcu_pro_%s<%lld, %s, %s>{%s, %s", rms ? "rms" : "ln", (long long)kcu_last_dim(p),
                  has_g ? kcu_elem_type(g->nodes[p->in[1]].dtype) : "float", kcu_elem_type(p->dtype),
                  has_g ? "g" : "nullptr", rms ? "" : (has_b ? "gb, " : "nullptr, "));
    kcu_put_double(pro, kir_attr_float(g, pn, KIR_A_RMS_NORM_EPS));
    ks_buf_puts(pro, "}");
}

/* expert_matmul in fast precision: the grouped matmul, its results stored (plus the expert's bias);
 * pn: its norm prologue, or KIR_NONE. */
static int emit_expert_matmul_grouped(kcu_gen *x, kir_val v, kir_val pn)
{
    const kir_node *n = &x->g->nodes[v], *w = &x->g->nodes[n->in[1]];
    const int has_b = n->nin > 3 && n->in[3] != KIR_NONE;
    const int64_t rows = w->dims[1];
    krt_cuda_kernel *k = kcu_kernel_new(x, v, MM_THREADS);
    ks_buf pro = {0};
    moe_grouped_params(x, k, v, pn, &pro);
    if (has_b) kcu_param_in(x, k, n->in[3], "bias");
    kcu_param_out(x, k, v);
    ks_buf epi = {0};
    ks_buf_printf(&epi, "kcu_moe_store<%lld, %s, %s", (long long)rows, kcu_elem_type(n->dtype), has_b ? "true" : "false");
    if (has_b) ks_buf_printf(&epi, ", %s>{out, bias}", kcu_elem_type(x->g->nodes[n->in[3]].dtype));
    else ks_buf_puts(&epi, ">{out, nullptr}");
    moe_grouped_kernels(x, k, v, "each routed row through its expert, grouped by expert (tensor cores)",
                        pro.len ? ks_buf_cstr(&pro) : NULL, ks_buf_cstr(&epi), (rows + MOE_BW - 1) / MOE_BW);
    ks_buf_free(&epi);
    ks_buf_free(&pro);
    kcu_kernel_end(x, k, "");
    return 0;
}

/* expert_matmul: a warp an output row (t, j, c), 8 warps a block: the lanes read the chosen expert's
 * row c and the token's row in 16-byte chunks (lane l: chunks l, l + 32, ..., each chunk's elements in
 * order, f32), a butterfly of shuffles adds the 32 sums, then the expert's bias. The loads of a warp are
 * one contiguous stretch of the row: a decode step reads each chosen expert's rows at the copy rate's
 * pace (a thread a row, as before, made every load of a warp touch 32 rows 4 kB apart). The order is
 * the row's alone: the same whatever else the step holds (batch invariant). */
static int emit_expert_matmul(kcu_gen *x, kir_val v)
{
    if (moe_grouped(x, v)) return emit_expert_matmul_grouped(x, v, KIR_NONE);
    const kir_node *n = &x->g->nodes[v], *in = &x->g->nodes[n->in[0]], *w = &x->g->nodes[n->in[1]];
    int has_b = n->nin > 3 && n->in[3] != KIR_NONE;
    int64_t kk = n->dims[1], cols = w->dims[1], depth = w->dims[2];
    enum { WARPS = EW_THREADS / 32 };
    krt_cuda_kernel *k = kcu_kernel_new(x, v, EW_THREADS);
    kcu_kernel_grid(k, 0, kk * cols, 0, WARPS);
    kcu_param_in(x, k, n->in[0], "x");
    kcu_param_in(x, k, n->in[1], "w");
    const int has_idx = n->nin > 2; /* without: row j through matrix j */
    if (has_idx) kcu_param_in(x, k, n->in[2], "idx");
    if (has_b) kcu_param_in(x, k, n->in[3], "bias");
    kcu_param_out(x, k, v);
    kcu_open_body(x, k, "each token's row through its chosen experts: w[idx[t,j]] x (+ bias), a warp an output row");
    const kir_dtype bt = has_b ? x->g->nodes[n->in[3]].dtype : KIR_F32;
    /* 16 bytes of the weights a chunk where every row holds whole ones, else one element */
    const int vec = depth % (w->dtype == KIR_F32 ? 4 : 8) == 0 ? (w->dtype == KIR_F32 ? 4 : 8) : 1;
    ks_buf_printf(&x->body,
                  "    enum { K = %lld, N = %lld, D = %lld, V = %d, C = D / V };\n"
                  "    const long long rows = (long long)T * K * N;\n"
                  "    const long long r0 = (long long)blockIdx.x * %d + threadIdx.x / 32;\n"
                  "    const bool live = r0 < rows; /* the same in every lane: no early return before the shuffles */\n"
                  "    const long long r = live ? r0 : rows - 1, tj = r / N, c = r %% N;\n"
                  "    const int lane = threadIdx.x %% 32, e = %s;\n"
                  "    const %s *xr = x + %s;\n"
                  "    const %s *wr = w + ((long long)e * N + c) * D;\n"
                  "    const bool xal = (reinterpret_cast<unsigned long long>(xr) & 15) == 0; /* x's rows 16-byte aligned */\n"
                  "    float acc = 0.0f;\n"
                  "    for (int q = lane; q < C; q += 32) {\n"
                  "        float xv[V], wv[V];\n"
                  "        if (xal)\n"
                  "            kcu_xload<V>(xr + (long long)q * V, xv);\n"
                  "        else\n"
                  "            for (int l = 0; l < V; l++) xv[l] = kcu_f(xr[(long long)q * V + l]);\n"
                  "        kcu_chunk<%s, V>::load(wr + (long long)q * V, wv);\n"
                  "#pragma unroll\n"
                  "        for (int l = 0; l < V; l++) acc = fmaf(xv[l], wv[l], acc);\n"
                  "    }\n"
                  "    for (int m = 16; m > 0; m >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);\n"
                  "    float y = acc;\n",
                  (long long)kk, (long long)cols, (long long)depth, vec, WARPS, has_idx ? "idx[tj]" : "(int)(tj % K)",
                  kcu_elem_type(in->dtype),
                  in->ndim == 3 ? "tj * D" : "(tj / K) * D", kcu_elem_type(w->dtype), kcu_elem_type(w->dtype));
    if (has_b)
        ks_buf_printf(&x->body, "    y += %sbias[(long long)e * N + c]%s;\n", kcu_ld(bt), kcu_ld_end(bt));
    ks_buf_puts(&x->body, "    if (live && lane == 0) {\n");
    kcu_put_store(&x->body, n->dtype, "        ", "out[r]", "y");
    ks_buf_puts(&x->body, "    }\n}\n");
    kcu_kernel_end(x, k, "");
    return 0;
}

/* expert_sum node es: out[t,c] = the sum over j of g[t,j] y[t,j,c], j in order in f32, one thread an
 * element; with res (not KIR_NONE), the residual add of its group too: value `outv` = res + the sum (the
 * sum first where sum_first), rounded once. */
static void put_expert_sum(kcu_gen *x, kir_val es, kir_val res, int sum_first, kir_val outv)
{
    const kir_node *n = &x->g->nodes[es], *y = &x->g->nodes[n->in[0]], *g = &x->g->nodes[n->in[1]];
    const int64_t kk = y->dims[1], cols = y->dims[2];
    krt_cuda_kernel *k = kcu_elementwise_kernel(x, es, cols);
    kcu_param_in(x, k, n->in[0], "y");
    kcu_param_in(x, k, n->in[1], "g");
    if (res != KIR_NONE) kcu_param_in(x, k, res, "res");
    kcu_param_out(x, k, outv);
    kcu_open_body(x, k, res != KIR_NONE ? "the residual plus the chosen experts' rows weighted by g and added, in order"
                                        : "the chosen experts' rows weighted by g and added, in order");
    kcu_elementwise_prologue(x, cols);
    ks_buf_printf(&x->body,
                  "    enum { K = %lld, N = %lld };\n"
                  "    const long long t = i / N, c = i %% N;\n"
                  "    float s = 0.0f;\n"
                  "    for (int j = 0; j < K; j++) s += %sg[t * K + j]%s * %sy[(t * K + j) * N + c]%s;\n",
                  (long long)kk, (long long)cols, kcu_ld(g->dtype), kcu_ld_end(g->dtype), kcu_ld(y->dtype),
                  kcu_ld_end(y->dtype));
    const char *v = res == KIR_NONE ? "s" : sum_first ? "s + kcu_f(res[i])" : "kcu_f(res[i]) + s";
    kcu_put_store(&x->body, x->g->nodes[outv].dtype, "    ", "out[i]", v);
    ks_buf_puts(&x->body, "}\n");
    kcu_kernel_end(x, k, res != KIR_NONE ? "residual" : "");
}

static int emit_expert_sum(kcu_gen *x, kir_val v)
{
    put_expert_sum(x, v, KIR_NONE, 0, v);
    return 0;
}

/* A group anchored at a routed expert_matmul (passes/fuse_epilogues.c): one grouped matmul when it is
 * a SwiGLU over a gate and up merged along the experts' rows (fuse_sibling_matmuls' concat1):
 *     m = expert_matmul(x, w[E, 2F, K], idx); a = slice(m, 0, F); b = slice(m, F, 2F);
 *     out = mul(silu(a), b)   (either order), out the only value read outside,
 * silu in its half form (fast precision), x and w of one half dtype. Else 0: node by node. */
static int emit_expert_matmul_group(kcu_gen *x, const kir_val *nodes, int count, const uint8_t *read_outside)
{
    const kir_graph *g = x->g;
    /* a norm first: the matmul's prologue (passes/fuse_norm_prologue.c) */
    const kir_val pn = count > 1 && kir_op_table[g->nodes[nodes[0]].op].fusion == KIR_FUSE_NORM ? nodes[0] : KIR_NONE;
    if (pn != KIR_NONE) nodes++, count--;
    const kir_val mm = nodes[0];
    if (g->nodes[mm].op != KIR_OP_EXPERT_MATMUL || !moe_grouped_inputs(x, mm) ||
        !moe_prologue_ok(x, pn, mm, read_outside))
        return 0;
    if (count == 1 && pn != KIR_NONE && moe_grouped(x, mm)) { /* the norm and the matmul alone */
        emit_expert_matmul_grouped(x, mm, pn);
        return 1;
    }
    if (count != 5) return 0;
    const int64_t rows = g->nodes[g->nodes[mm].in[1]].dims[1], half = rows / 2;
    kir_val lo = KIR_NONE, hi = KIR_NONE, act = KIR_NONE, prod = KIR_NONE;
    for (int i = 1; i < count; i++) {
        const kir_val v = nodes[i];
        const kir_node *n = &g->nodes[v];
        if (n->op == KIR_OP_SLICE && n->in[0] == mm) {
            const int64_t s = kir_attr_int(g, v, KIR_A_SLICE_START), e = kir_attr_int(g, v, KIR_A_SLICE_END);
            if (s == 0 && e == half) lo = v;
            else if (s == half && e == rows) hi = v;
        } else if (n->op == KIR_OP_SILU && kir_attr_int(g, v, KIR_A_ANY_HALF_MATH)) {
            act = v;
        } else if (n->op == KIR_OP_MUL) {
            prod = v;
        }
    }
    if (rows % 2 || lo == KIR_NONE || hi == KIR_NONE || act == KIR_NONE || prod == KIR_NONE) return 0;
    const kir_node *a = &g->nodes[act], *p = &g->nodes[prod];
    if (a->in[0] != lo || !((p->in[0] == act && p->in[1] == hi) || (p->in[0] == hi && p->in[1] == act))) return 0;
    for (int i = 0; i < count; i++)
        if (read_outside[nodes[i]] != (nodes[i] == prod)) return 0;
    krt_cuda_kernel *k = kcu_kernel_new(x, mm, MM_THREADS);
    ks_buf pro = {0};
    moe_grouped_params(x, k, mm, pn, &pro);
    kcu_param_out(x, k, prod);
    ks_buf epi = {0};
    ks_buf_printf(&epi, "kcu_moe_swiglu<%lld, %s>{out}", (long long)half, kcu_elem_type(p->dtype));
    moe_grouped_kernels(x, k, mm, pn != KIR_NONE ? "silu(gate) up of each routed row's expert (gate and up one weight), "
                                               "grouped by expert (tensor cores), the norm of its x first"
                                             : "silu(gate) up of each routed row's expert (gate and up one weight), grouped by "
                                               "expert (tensor cores)",
                        pro.len ? ks_buf_cstr(&pro) : NULL, ks_buf_cstr(&epi), (half + MOE_BW / 2 - 1) / (MOE_BW / 2));
    ks_buf_free(&epi);
    ks_buf_free(&pro);
    kcu_kernel_end(x, k, "swiglu");
    return 1;
}

/* A group anchored at expert_sum (passes/fuse_epilogues.c): one kernel when it is the residual add,
 *     s = expert_sum(y, g); out = add(r, s) or add(s, r), r from outside, of out's shape,
 * out the only value read outside (put_expert_sum). Else 0: node by node. */
static int emit_expert_sum_group(kcu_gen *x, const kir_val *nodes, int count, const uint8_t *read_outside)
{
    const kir_graph *g = x->g;
    const kir_val es = nodes[0], add = count == 2 ? nodes[1] : KIR_NONE;
    if (add == KIR_NONE || g->nodes[add].op != KIR_OP_ADD || read_outside[es] || !read_outside[add]) return 0;
    const kir_node *a = &g->nodes[add];
    const kir_val r = a->in[0] == es ? a->in[1] : a->in[0];
    if ((a->in[0] != es && a->in[1] != es) || r == es || g->nodes[r].ndim != 2 || g->nodes[r].dims[1] != a->dims[1])
        return 0;
    put_expert_sum(x, es, r, a->in[0] == es, add);
    return 1;
}

int kcu_emit_moe_group(kcu_gen *x, const kir_val *nodes, int count, const uint8_t *read_outside)
{
    return x->g->nodes[nodes[0]].op == KIR_OP_EXPERT_SUM ? emit_expert_sum_group(x, nodes, count, read_outside)
                                                         : emit_expert_matmul_group(x, nodes, count, read_outside);
}

int kcu_emit_moe(kcu_gen *x, kir_val v)
{
    switch (x->g->nodes[v].op) {
    case KIR_OP_SUM: return emit_sum(x, v);
    case KIR_OP_AMAX:
    case KIR_OP_AMIN: return emit_extreme(x, v);
    case KIR_OP_TOPK: return emit_topk(x, v);
    case KIR_OP_GATHER: return emit_gather(x, v);
    case KIR_OP_EXPERT_MATMUL: return emit_expert_matmul(x, v);
    case KIR_OP_EXPERT_SUM: return emit_expert_sum(x, v);
    default: KS_UNREACHABLE();
    }
}

/* ---- a token's routing as one kernel (passes/fuse_rows.c's groups) ------------------------------ */

/* The rows a row group holds in shared memory, f32 and i32 elements a warp at most. */
enum { ROWS_MAX_FLOATS = 1536, ROWS_MAX_INTS = 256 };

/* Where a member's row lives in the warp's shared rows. */
typedef struct row_slot {
    int is_int;  /* 1: in ri (topk's indices), else rf */
    int64_t off; /* first element */
} row_slot;

typedef struct row_group {
    const kir_val *nodes;
    int count;
    row_slot *slot;       /* [count] */
    kir_val *outside;     /* operands from outside the group, in first-use order */
    int n_outside;
} row_group;

/* The member index of value v, or -1. */
static int row_member(const row_group *r, kir_val v)
{
    for (int i = 0; i < r->count; i++)
        if (r->nodes[i] == v) return i;
    return -1;
}

/* Element `c` (a C expression) of operand value v as f32 (ints: as int), into out: the warp's shared
 * row of a member, or the outside value's row t (a [T, 1] value: its one element). */
static void row_operand(const kcu_gen *x, const row_group *r, kir_val v, const char *c, ks_buf *out)
{
    const int m = row_member(r, v);
    const kir_node *n = &x->g->nodes[v];
    if (m >= 0) {
        ks_buf_printf(out, "%s[%lld + (%s)]", r->slot[m].is_int ? "ri[warp]" : "rf[warp]", (long long)r->slot[m].off, c);
        return;
    }
    int o = 0;
    while (r->outside[o] != v) o++;
    if (n->dims[1] == 1)
        ks_buf_printf(out, "%sa%d[t]%s", kcu_ld(n->dtype), o, kcu_ld_end(n->dtype));
    else
        ks_buf_printf(out, "%sa%d[t * %lldLL + (%s)]%s", kcu_ld(n->dtype), o, (long long)n->dims[1], c,
                      kcu_ld_end(n->dtype));
}

/* Whether member node v is one the row kernel computes. */
static int row_supported(const kcu_gen *x, kir_val v)
{
    const kir_node *n = &x->g->nodes[v];
    switch (n->op) {
    case KIR_OP_SOFTMAX:
    case KIR_OP_TOPK:
    case KIR_OP_GATHER:
    case KIR_OP_SUM:
    case KIR_OP_SCALE:
    case KIR_OP_CLAMP: return 1;
    default: return kir_has_formula(n->op) || (kir_has_binary(n->op) && n->op != KIR_OP_MASKED_FILL && n->nin == 2);
    }
}

/* The statement storing member i's element c, value `val` (f32): rounded to its dtype into its shared
 * row, and into its buffer o<i> when read outside. */
static void row_store(const kcu_gen *x, const row_group *r, int i, const uint8_t *read_outside, const char *c,
                      const char *val, ks_buf *b)
{
    const kir_node *n = &x->g->nodes[r->nodes[i]];
    ks_buf_printf(b, "            const float y = %s;\n", val);
    ks_buf_printf(b, "            rf[warp][%lld + (%s)] = kcu_round<%s>(y);\n", (long long)r->slot[i].off, c,
                  kcu_elem_type(n->dtype));
    if (read_outside[r->nodes[i]]) {
        ks_buf lhs = {0};
        ks_buf_printf(&lhs, "o%d[t * %lldLL + (%s)]", i, (long long)n->dims[1], c);
        ks_buf_puts(b, "            if (live) ");
        kcu_put_store(b, n->dtype, "", ks_buf_cstr(&lhs), "y");
        ks_buf_free(&lhs);
    }
}

int kcu_emit_row_group(kcu_gen *x, const kir_val *nodes, int count, const uint8_t *read_outside)
{
    const kir_graph *g = x->g;
    row_group r = {.nodes = nodes, .count = count};
    r.slot = ks_xcalloc((size_t)count, sizeof *r.slot);
    r.outside = ks_xcalloc((size_t)count * KIR_MAX_INPUTS + 1, sizeof *r.outside);
    int64_t floats = 0, ints = 0;
    int ok = 1;
    for (int i = 0; i < count && ok; i++) {
        const kir_node *n = &g->nodes[nodes[i]];
        ok = row_supported(x, nodes[i]) && n->ndim == 2 && (n->dtype == KIR_I32) == (n->op == KIR_OP_TOPK);
        r.slot[i].is_int = n->dtype == KIR_I32;
        r.slot[i].off = r.slot[i].is_int ? ints : floats;
        *(r.slot[i].is_int ? &ints : &floats) += n->dims[1];
        for (int k = 0; k < n->nin && ok; k++) {
            const kir_val a = n->in[k];
            if (a == KIR_NONE || row_member(&r, a) >= 0) continue;
            int seen = 0;
            for (int o = 0; o < r.n_outside; o++) seen |= r.outside[o] == a;
            if (!seen) r.outside[r.n_outside++] = a;
        }
    }
    if (!ok || floats > ROWS_MAX_FLOATS || ints > ROWS_MAX_INTS || r.n_outside + count + 1 > KRT_CUDA_MAX_ARGS) {
        free(r.slot);
        free(r.outside);
        return 0;
    }
    enum { WARPS = EW_THREADS / 32 };
    krt_cuda_kernel *k = kcu_kernel_new(x, nodes[0], EW_THREADS);
    kcu_kernel_grid(k, 0, 1, 0, WARPS);
    for (int o = 0; o < r.n_outside; o++) {
        char name[16];
        snprintf(name, sizeof name, "a%d", o);
        kcu_param_in(x, k, r.outside[o], name);
    }
    for (int i = 0; i < count; i++) {
        if (!read_outside[nodes[i]]) continue;
        ks_buf decl = {0};
        ks_buf_printf(&decl, "%s *__restrict__ o%d", kcu_elem_type(g->nodes[nodes[i]].dtype), i);
        kcu_add_param(x, k, KRT_CUDA_ARG_VALUE, nodes[i], ks_buf_cstr(&decl));
        ks_buf_free(&decl);
    }
    /* a topk whose choices route an expert_matmul of the model's weights: those experts' weights ahead */
    int ahead_of = -1;
    int64_t expert_bytes = 0;
    for (int i = 0; i < count && ahead_of < 0 && x->opt.l2_ahead_mb > 0 && k->n_args < KRT_CUDA_MAX_ARGS; i++) {
        const kir_val em = g->nodes[nodes[i]].op == KIR_OP_TOPK && read_outside[nodes[i]]
                               ? routed_matmul(g, nodes[i], nodes[i]) : KIR_NONE;
        if (em == KIR_NONE || g->nodes[g->nodes[em].in[1]].op != KIR_OP_WEIGHT) continue;
        const kir_node *w = &g->nodes[g->nodes[em].in[1]];
        expert_bytes = w->dims[1] * w->dims[2] * (int64_t)kir_dtype_size(w->dtype);
        if (expert_bytes % 16) continue; /* bulk prefetches of whole 16-byte units */
        kcu_param_in(x, k, g->nodes[em].in[1], "experts_ahead");
        ahead_of = i;
    }    kcu_open_body(x, k, "a token's row ops as one kernel (a warp a token), each value rounded to its dtype as stored");
    ks_buf *b = &x->body;
    ks_buf_printf(b,
                  "    __shared__ float rf[%d][%lld];\n"
                  "    __shared__ int ri[%d][%lld];\n"
                  "    const int warp = threadIdx.x / 32, lane = threadIdx.x %% 32;\n"
                  "    const long long t0 = (long long)blockIdx.x * %d + warp;\n"
                  "    const bool live = t0 < T; /* the same in the warp: no return before its shuffles */\n"
                  "    const long long t = live ? t0 : T - 1;\n",
                  WARPS, (long long)(floats ? floats : 1), WARPS, (long long)(ints ? ints : 1), WARPS);
    for (int i = 0; i < count; i++) {
        const kir_val v = nodes[i];
        const kir_node *n = &g->nodes[v];
        const int64_t width = n->dims[1];
        ks_buf a = {0}, bb = {0}, e = {0};
        row_operand(x, &r, n->in[0], "c", &a);
        ks_buf_printf(b, "    { /* %s */\n", kir_op_table[n->op].name);
        switch (n->op) {
        case KIR_OP_SOFTMAX: { /* e^(x - max) / sum, the max by max's rule, the sum in double (the kernel's) */
            ks_buf mx = {0};
            kir_binary_write(KIR_OP_MAX, "e", "m", &mx, NULL);
            ks_buf mo = {0};
            kir_binary_write(KIR_OP_MAX, "m", "om", &mo, NULL);
            ks_buf_printf(b,
                          "        float m = -__int_as_float(0x7f800000);\n"
                          "        for (int c = lane; c < %lld; c += 32) { const float e = %s; m = %s; }\n"
                          "        for (int s = 16; s > 0; s >>= 1) { const float om = __shfl_xor_sync(0xffffffffu, m, s); m = %s; }\n"
                          "        double ss = 0.0;\n"
                          "        for (int c = lane; c < %lld; c += 32) ss += exp((double)%s - (double)m);\n"
                          "        ss = kcu_warp_sum(ss);\n"
                          "        for (int c = lane; c < %lld; c += 32) {\n",
                          (long long)width, ks_buf_cstr(&a), ks_buf_cstr(&mx), ks_buf_cstr(&mo), (long long)width,
                          ks_buf_cstr(&a), (long long)width);
            ks_buf_printf(&e, "(float)(exp((double)%s - (double)m) / ss)", ks_buf_cstr(&a));
            row_store(x, &r, i, read_outside, "c", ks_buf_cstr(&e), b);
            ks_buf_puts(b, "        }\n");
            ks_buf_free(&mx);
            ks_buf_free(&mo);
            break;
        }
        case KIR_OP_TOPK: { /* the warp topk's rounds (put_warp_topk: emit_topk_warp's order) */
            ks_buf put = {0};
            ks_buf_printf(&put, "                ri[warp][%lld + j] = bi;\n", (long long)r.slot[i].off);
            if (read_outside[v]) ks_buf_printf(&put, "                if (live) o%d[t * K + j] = bi;\n", i);
            put_warp_topk(b, "        ", g->nodes[n->in[0]].dims[1], width, ks_buf_cstr(&a), ks_buf_cstr(&put));
            ks_buf_free(&put);
            if (i == ahead_of) /* after the rounds, a lane a choice: lane 0 alone would hold up every round */
                ks_buf_printf(b,
                              "        kcu_syncwarp();\n"
                              "        for (int j = lane; live && j < K; j += 32)\n"
                              "            kcu_l2_expert(experts_ahead, ri[warp][%lld + j], %lldLL, (long long)T * K, %lldLL);\n",
                              (long long)r.slot[i].off, (long long)expert_bytes,
                              (long long)((int64_t)x->opt.l2_ahead_mb << 20));
            break;
        }
        case KIR_OP_GATHER: {
            ks_buf idx = {0};
            row_operand(x, &r, n->in[1], "j", &idx);
            const kir_val iv = n->in[1];
            if (row_member(&r, iv) < 0) { /* an outside i32 row: as it is, not through kcu_ld */
                int o = 0;
                while (r.outside[o] != iv) o++;
                idx.len = 0;
                ks_buf_printf(&idx, "a%d[t * %lldLL + j]", o, (long long)g->nodes[iv].dims[1]);
            }
            ks_buf_printf(b, "        for (int j = lane; j < %lld; j += 32) {\n            const int c = %s;\n",
                          (long long)width, ks_buf_cstr(&idx));
            row_store(x, &r, i, read_outside, "j", ks_buf_cstr(&a), b);
            ks_buf_puts(b, "        }\n");
            ks_buf_free(&idx);
            break;
        }
        case KIR_OP_SUM: { /* one lane, in order, in double (emit_sum's) */
            const int64_t d = g->nodes[n->in[0]].dims[1];
            ks_buf_printf(b,
                          "        if (lane == 0) {\n"
                          "            double s = 0.0;\n"
                          "            for (int c = 0; c < %lld; c++) s += (double)%s;\n"
                          "            const int c = 0;\n",
                          (long long)d, ks_buf_cstr(&a));
            row_store(x, &r, i, read_outside, "c", "(float)s", b);
            ks_buf_puts(b, "        }\n");
            break;
        }
        default: { /* elementwise: a unary formula or attribute op, or a binary op ([T, 1] repeated) */
            ks_buf_printf(b, "        for (int c = lane; c < %lld; c += 32) {\n", (long long)width);
            if (kir_has_binary(n->op)) {
                const kir_node *bn = &g->nodes[n->in[1]];
                row_operand(x, &r, n->in[1], bn->dims[1] == 1 ? "0" : "c", &bb);
                ks_buf_printf(b, "            const float va = %s, vb = %s;\n", ks_buf_cstr(&a), ks_buf_cstr(&bb));
                kir_binary_write(n->op, "va", "vb", &e, NULL);
            } else if (n->op == KIR_OP_SCALE || n->op == KIR_OP_CLAMP) {
                ks_buf_printf(b, "            const float va = %s;\n", ks_buf_cstr(&a));
                kcu_attr_unary_write(g, v, "va", &e);
            } else {
                int in_double = 0;
                const int half = (int)kir_attr_int(g, v, KIR_A_ANY_HALF_MATH);
                ks_buf f = {0};
                kcu_formula_write(n->op, half, "a", &f, &in_double, NULL);
                if (in_double) {
                    ks_buf_printf(b, "            const double a = %s;\n", ks_buf_cstr(&a));
                    ks_buf_printf(&e, "(float)(%s)", ks_buf_cstr(&f));
                } else {
                    ks_buf_printf(b, "            const float va = %s;\n", ks_buf_cstr(&a));
                    kcu_formula_write(n->op, half, "va", &e, NULL, NULL);
                }
                ks_buf_free(&f);
            }
            row_store(x, &r, i, read_outside, "c", ks_buf_cstr(&e), b);
            ks_buf_puts(b, "        }\n");
            break;
        }
        }
        ks_buf_puts(b, "    }\n    kcu_syncwarp();\n");
        ks_buf_free(&a);
        ks_buf_free(&bb);
        ks_buf_free(&e);
    }
    ks_buf_puts(b, "}\n");
    kcu_kernel_end(x, k, "rows");
    free(r.slot);
    free(r.outside);
    return 1;
}
