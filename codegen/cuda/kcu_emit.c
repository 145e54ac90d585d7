/*
 * kcu_emit.c — CUDA C for each compute node of a graph (codegen/cuda/kcu.h).
 *
 * Requires: a graph kir_verify accepts. Guarantees: one launch per fusion
 * group that kcu_emit_group.c can fuse (the `fuse` attribute of
 * passes/fuse_*.c: a norm, a matmul and its epilogue become one kernel),
 * and one launch per compute node elsewhere (two for an attention that
 * writes the KV cache: the write, then the attention, since blocks of one
 * launch are not ordered); every dimension but T a literal; views that do
 * not move data (reshape, the output, kv_write's pass-through value) get
 * no kernel and share their operand's buffer (meta aliases). Matmuls are
 * two kernels, NAME for steps of at most KCU_DECODE_T tokens and NAME_large
 * for longer ones (meta "large"), so that the decode path keeps its own
 * registers and occupancy. Kernels are shared: a kernel's text is written
 * with a placeholder for its name, and nodes whose texts are equal (same
 * op, shapes, dtypes and attributes; layers differ only in arguments) get
 * one kernel, named k_<op>_<hash of the text>, compiled once; the launch
 * table lists it once per node. Where values live is the backend's affair
 * (the memory plan's arena, runtime/cuda/cuda_backend.c).
 *
 * Attention is kcu_attention_kernel for every step, or in fast precision (or with
 * kcu_options.flash_prefill) its
 * `_large` variant for steps of many tokens runs on tensor cores (kcu_flash.cuh, on its own
 * grid; kcu_emit_attention.c's use_flash_prefill decides).
 *
 * Weights may be f32, bf16 or f16 (read through kcu_f(), kcu_prelude.cuh);
 * activations and the KV cache are each of their IR dtype (f32, or bf16/f16
 * in fast precision: passes/lower_precision.c): every kernel reads its
 * operands as f32 (kcu_ld), computes in f32 and stores each value in its
 * dtype (kcu_put_store: rounded to nearest even, as the interpreter rounds
 * it); the kernels of f32 values read as they did before halves. Matmuls are kcu_matmul_small/_large (prelude);
 * the other kernels follow runtime/interp/interp_kernels.c operation by operation, and
 * where one parallelizes a reduction (norms, the softmax's sum and max) it
 * uses a fixed tree, so results do not depend on timing.
 */
#include "codegen/cuda/kcu_gen.h"
#include "ir/numerics.h"
#include "ir/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


/* ---- ops ------------------------------------------------------------------------------ */
static int emit_embed(kcu_gen *x, kir_val v)
{
    const kir_node *n = &x->g->nodes[v];
    int64_t dim = n->dims[1];
    kir_dtype tt = x->g->nodes[n->in[0]].dtype;
    /* half table and half rows of 8-element chunks: a thread copies 16 bytes (8 values, each through
     * kcu_f and kcu_put as below: the interpreter's bits); measured at 2048 tokens of Llama-3-8B the
     * element a thread took 54 us for 16 MB, a tenth of the copy rate */
    const int vec = kcu_is_half(tt) && kcu_is_half(n->dtype) && dim % 8 == 0;
    krt_cuda_kernel *k = vec ? kcu_kernel_new(x, v, EW_THREADS) : kcu_elementwise_kernel(x, v, dim);
    if (vec) kcu_kernel_grid(k, 0, dim / 8, 0, EW_THREADS);
    kcu_param_in(x, k, n->in[0], "table");
    kcu_param_in(x, k, n->in[1], "ids");
    kcu_param_out(x, k, v);
    kcu_open_body(x, k, "rows of the table picked by ids (checked on the host before the step)");
    if (vec) {
        const char *tn = kcu_elem_type(tt), *on = kcu_elem_type(n->dtype);
        ks_buf_printf(&x->body,
                      "    const long long i = (long long)blockIdx.x * %d + threadIdx.x; /* 8 values */\n"
                      "    if (i >= (long long)T * %lld) return;\n"
                      "    union { uint4 v; %s e[8]; } a;\n"
                      "    union { uint4 v; %s e[8]; } b;\n"
                      "    a.v = *reinterpret_cast<const uint4 *>(table + (long long)ids[i / %lld] * %lld + 8 * (i %% %lld));\n"
                      "#pragma unroll\n"
                      "    for (int j = 0; j < 8; j++) kcu_put(&b.e[j], kcu_f(a.e[j]));\n"
                      "    *reinterpret_cast<uint4 *>(out + 8 * i) = b.v;\n}\n",
                      EW_THREADS, (long long)(dim / 8), tn, on, (long long)(dim / 8), (long long)dim,
                      (long long)(dim / 8));
        kcu_kernel_end(x, k, "");
        return 0;
    }
    kcu_elementwise_prologue(x, dim);
    char v_[160];
    snprintf(v_, sizeof v_, "kcu_f(table[(long long)ids[i / %lld] * %lld + i %% %lld])", (long long)dim, (long long)dim,
             (long long)dim);
    kcu_put_store(&x->body, n->dtype, "    ", "out[i]", v_);
    ks_buf_puts(&x->body, "}\n");
    kcu_kernel_end(x, k, "");
    return 0;
}

/* Weights of dtype t that kcu_matmul loads at a time from rows of K: 16
 * bytes' worth when rows are 16-byte aligned, else 1. */
static int matmul_vec(int64_t K, kir_dtype t)
{
    size_t es = kir_dtype_size(t);
    return (size_t)K * es % 16 == 0 ? (int)(16 / es) : 1;
}

/* The decode matmul's plan (kcu.h). The rule, for the H100's and H200's 132
 * SMs (any GPU runs any plan; only the speed is tuned for them): R = 4
 * columns a warp where there are columns for 1.25 blocks of 32 on every SM
 * (half the x loads and conversions a weight: what limits T = 8), else R =
 * 2 (twice the warps, so that a narrow weight still fills every SM). Measured
 * alone on the H200 at T = 1 (bench/RESULTS.md, issue #10 step 5, call 7):
 * Llama-3-8B's q,k,v (N 6144, 1.45 blocks of R 4 an SM) 17.9 µs with R 4,
 * 20.9 with R 2 (the rule before asked for two blocks an SM). A block
 * computes one tile of 8 R columns: its prologue (a norm's statistics and
 * staged values) is hidden behind its first step's loads and the SM's other
 * block, and small blocks keep the last wave short (a block covering many
 * tiles would share one prologue but could leave SMs idle at the end, for a
 * whole block's time, whenever the blocks do not divide evenly).
 * The expected times of Llama-3-8B's shapes are at kcu_matmul_small
 * (kcu_prelude.cuh). */
kcu_gemv_plan kcu_plan_gemv(int64_t N)
{
    enum {
        SMS = 132,  /* the H100's and H200's SMs */
        PER_SM = 2, /* decode blocks an SM holds (128 registers a thread at most) */
        WARPS = MM_THREADS / 32
    };
    kcu_gemv_plan p;
    p.tc = 0;
    p.rows = 4 * N >= (int64_t)5 * SMS * WARPS * 4 ? 4 : 2; /* N / (8 * 4) blocks >= 1.25 SMS */
    p.cols = WARPS * p.rows;
    p.per_sm = PER_SM;
    p.ring = 0;
    return p;
}

/* kcu_matmul_tc's plan: J tiles of 16 columns a block, one stream of weight steps through a ring of
 * shared memory filled by cp.async (the bytes in flight cost no registers), PER_SM blocks an SM over
 * one wave: J = ceil(tiles / (PER_SM SMS)), so that a block's prologue (the norm's statistics and
 * staged values) comes once, behind its first copies, and no SM waits on a second wave (Llama-3-8B
 * at PER_SM 1: q,k,v J 3, gate/up 14, down and o 2, lm_head 61). The ring takes what the targets'
 * least opt-in shared memory leaves beside the kernel's static 40 kB, up to RING_CAP, in steps of
 * 16 kB (a step of two chunks of a lane's two rows: 256 threads x 64 bytes). RING_CAP: what an
 * sm_80's 163 kB leave too, so that sm_80 and sm_90 engines hold the same kernels (seven steps: six
 * in flight, 96 kB an SM). The probe that chose this: bench/gemv_probe.cu (bench/RESULTS.md, #11
 * step 3). */
kcu_gemv_plan kcu_plan_gemv_tc(int64_t N, int norm, const kcu_options *opt)
{
    (void)norm;
    enum { SMS = 132, PER_SM = 1, STATIC = 40 * 1024, RESERVED = 1024, STEP = 16 * 1024, RING_CAP = 112 * 1024 };
    kcu_gemv_plan p;
    p.tc = 1;
    const int64_t tiles = (N + 15) / 16;
    const int per_sm = opt->tc_per_sm > 0 ? opt->tc_per_sm : PER_SM;
    p.rows = (int)((tiles + per_sm * SMS - 1) / (per_sm * SMS));
    p.cols = 16 * p.rows;
    p.per_sm = opt->tc_min_blocks > 0 ? opt->tc_min_blocks : per_sm; /* the launch bounds' */
    int64_t room = (opt->smem_optin + RESERVED) / per_sm - RESERVED - STATIC;
    const int64_t cap = opt->tc_ring_kb > 0 ? (int64_t)opt->tc_ring_kb * 1024 : RING_CAP;
    if (room > cap) room = cap;
    p.ring = (int)(room / STEP * STEP);
    KS_ASSERT(p.ring >= 2 * STEP); /* kcu_use_tc: smem_optin >= KCU_TC_MIN_OPTIN */
    return p;
}

int64_t kcu_decode_t(const kcu_gen *x) { return x->opt.batch_variant ? MM_GEMV_T : KCU_DECODE_T; }

/* Whether a matmul of x (dtype xt, or its fused norm's values of dtype ot) and weights of dtype wt
 * over K takes kcu_matmul_tc: the three of one half dtype, rows of whole 16-byte chunks, every
 * target's blocks able to opt into the shared memory of its ring, and no kcu_options.batch_variant. */
int kcu_use_tc(const kcu_gen *x, kir_dtype xt, kir_dtype ot, kir_dtype wt, int64_t K)
{
    return !x->opt.batch_variant && (wt == KIR_BF16 || wt == KIR_F16) && xt == wt && ot == wt && K % 8 == 0 &&
           x->opt.smem_optin >= KCU_TC_MIN_OPTIN;
}

const char *kcu_qmatmul_supported(const kir_graph *g, kir_val mm)
{
    kir_word q = kir_attr_word(g, mm, KIR_A_MATMUL_QUANT);
    if (q != KIR_QUANT_W4A16 && q != KIR_QUANT_W8A16 && q != KIR_QUANT_FP8 && q != KIR_QUANT_W8A8)
        return "the scheme has no CUDA kernel";
    kir_quant_layout L;
    kir_quant_layout_of(g, mm, &L);
    const int per = L.codes == KIR_U4 ? 32 : 16;
    if (L.block_rows != 1) return "blocks of several rows have no CUDA kernel yet (a scale a row and group)";
    if (L.cols % per || L.group % per) return "the CUDA kernel reads groups of whole 16-byte chunks (32 u4, 16 8-bit codes)";
    return NULL;
}

void kcu_qmatmul_params(kcu_gen *x, krt_cuda_kernel *k, kir_val mm)
{
    const kir_node *n = &x->g->nodes[mm];
    kcu_param_in(x, k, n->in[2], "qs");
    if (n->nin > 3 && n->in[3] != KIR_NONE) kcu_param_in(x, k, n->in[3], "qz");
}

void kcu_put_qmatmul(kcu_gen *x, kir_val mm, int R, int prefill, const char *pro, const char *epi)
{
    const kir_node *n = &x->g->nodes[mm];
    kir_quant_layout L;
    kir_quant_layout_of(x->g, mm, &L);
    const int asym = n->nin > 3 && n->in[3] != KIR_NONE;
    /* fp8 and w8a8 quantize x a token at a time (kcu_pro_xq: amax / 448 or / 127, as the interpreter); they take
     * no norm (passes/fuse_norm_prologue.c) */
    const kir_word q = kir_attr_word(x->g, mm, KIR_A_MATMUL_QUANT);
    const int xq = q == KIR_QUANT_FP8 ? 448 : q == KIR_QUANT_W8A8 ? 127 : 0;
    KS_ASSERT(!(xq && pro));
    char xpro[64];
    snprintf(xpro, sizeof xpro, "kcu_pro_xq<%lld, %d>()", (long long)L.cols, xq);
    ks_buf_printf(&x->body, "    kcu_matmul_q<%d, %s, %s, %lld, %lld, %lld, %d, %s, %s>(T, x, w, qs, %s, %s, %s);\n}\n",
                  L.codes == KIR_U4 ? 4 : 8, L.codes == KIR_I8 ? "true" : "false", asym ? "true" : "false",
                  (long long)L.cols, (long long)L.rows, (long long)L.group, R, prefill ? "true" : "false",
                  L.codes == KIR_F8E4M3 ? "true" : "false", asym ? "qz" : "(const unsigned char *)nullptr",
                  pro ? pro : xq ? xpro : "kcu_pro_none()", epi);
}

/* out[t, c] = dot(x[t, :], w[c, :]): kcu_matmul (kcu_prelude.cuh) at this
 * node's shapes and weight dtype; the decode kernel on its plan's grid. */
static int emit_matmul(kcu_gen *x, kir_val v)
{
    const kir_node *n = &x->g->nodes[v], *w = &x->g->nodes[n->in[1]];
    int64_t K = w->dims[1], N = w->dims[0];
    if (K >= INT32_MAX / 16 || N >= INT32_MAX / 16)
        return kcu_node_error(x, v, "a [%lld,%lld] weight is larger than the CUDA matmul indexes", (long long)N,
                          (long long)K);
    const int quant = n->nin > 2;
    int vec = quant ? 16 : matmul_vec(K, w->dtype);
    const kir_dtype xt = x->g->nodes[n->in[0]].dtype;
    kcu_gemv_plan plan =
        !quant && kcu_use_tc(x, xt, xt, w->dtype, K) ? kcu_plan_gemv_tc(N, 0, &x->opt) : kcu_plan_gemv(N);
    const int64_t decode_t = kcu_decode_t(x);
    krt_cuda_kernel *k = kcu_kernel_new(x, v, MM_THREADS);
    kcu_matmul_grids(k, N, &plan);
    k->smem = plan.ring;
    kcu_param_in(x, k, n->in[0], "x");
    kcu_param_in(x, k, n->in[1], "w");
    if (quant) kcu_qmatmul_params(x, k, v);
    kcu_param_out(x, k, v);
    ks_buf what = {0};
    if (plan.tc)
        ks_buf_printf(&what, "x w^T with %s weights, fp32 sums (tensor cores, %d rows a block, when T <= %d)",
                      kir_dtype_name(w->dtype), plan.cols, (int)decode_t);
    else
        ks_buf_printf(&what, "x w^T with %s weights, fp32 sums (%d-element loads; a warp for %d rows when T <= %d)",
                      kir_dtype_name(w->dtype), vec, plan.rows, (int)decode_t);
    (plan.tc ? kcu_open_body_tc : kcu_open_body_min)(x, k, ks_buf_cstr(&what), plan.per_sm);
    ks_buf_free(&what);
    for (int large = 0; large < 2; large++) {
        char shape[64];
        if (large) snprintf(shape, sizeof shape, "%lld, %lld", (long long)K, (long long)N);
        else if (plan.tc) snprintf(shape, sizeof shape, "%lld, %lld, %d, %d", (long long)K, (long long)N, plan.rows, plan.ring);
        else snprintf(shape, sizeof shape, "%lld, %lld, %d", (long long)K, (long long)N, plan.rows);
        if (large) kcu_open_large(x, k, decode_t);
        if (quant) {
            ks_buf epi = {0};
            ks_buf_printf(&epi, "kcu_epi_store<%lld%s%s>{out}", (long long)N, n->dtype == KIR_F32 ? "" : ", ",
                          n->dtype == KIR_F32 ? "" : kcu_elem_type(n->dtype));
            kcu_put_qmatmul(x, v, large ? 2 : plan.rows, large, NULL, ks_buf_cstr(&epi));
            ks_buf_free(&epi);
            continue;
        }
        ks_buf_printf(&x->body,
                      "    kcu_matmul_%s<%s, %s>(T, x, w, kcu_pro_none(), kcu_epi_store<%lld%s%s>{out});\n}\n",
                      large ? "large" : plan.tc ? "tc" : "small", kcu_elem_type(w->dtype), shape, (long long)N,
                      n->dtype == KIR_F32 ? "" : ", ", n->dtype == KIR_F32 ? "" : kcu_elem_type(n->dtype));
    }
    kcu_kernel_end(x, k, "");
    return 0;
}

/* add, sub, mul, max, min (ir/ops.def's KIR_BINARY lines): b repeats over a's leading dims when its shape
 * is a suffix of a's. */
static int emit_binary(kcu_gen *x, kir_val v)
{
    const kir_node *n = &x->g->nodes[v], *a = &x->g->nodes[n->in[0]], *b = &x->g->nodes[n->in[1]];
    int64_t row = kir_row_elems(n);
    krt_cuda_kernel *k = kcu_elementwise_kernel(x, v, row);
    kcu_param_in(x, k, n->in[0], "a");
    kcu_param_in(x, k, n->in[1], "b");
    kcu_param_out(x, k, v);
    int b_has_t = b->ndim > 0 && b->dims[0] == KIR_DIM_T;
    int by_row = kir_binary_broadcast(a, b) == KIR_BROADCAST_ROW;
    kcu_open_body(x, k, by_row ? "elementwise, b's one value a row repeated along it"
                        : b_has_t ? "elementwise" : "elementwise, b repeated over the leading dims");
    kcu_elementwise_prologue(x, row);
    ks_buf_printf(&x->body, "    const float va = %sa[i]%s;\n", kcu_ld(a->dtype), kcu_ld_end(a->dtype));
    if (by_row)
        ks_buf_printf(&x->body, "    const float vb = %sb[i / %lld]%s;\n", kcu_ld(b->dtype),
                      (long long)a->dims[a->ndim - 1], kcu_ld_end(b->dtype));
    else if (b_has_t)
        ks_buf_printf(&x->body, "    const float vb = %sb[i]%s;\n", kcu_ld(b->dtype), kcu_ld_end(b->dtype));
    else
        ks_buf_printf(&x->body, "    const float vb = kcu_f(b[i %% %lld]);\n", (long long)kir_elems(b, 1));
    ks_buf e = {0};
    if (n->op == KIR_OP_MASKED_FILL) { /* the attribute's value where the mask is not 0 */
        ks_buf_puts(&e, "vb != 0.0f ? ");
        kcu_put_float(&e, (float)kir_attr_float(x->g, v, KIR_A_MASKED_FILL_VALUE));
        ks_buf_puts(&e, " : va");
    } else {
        kir_binary_write(n->op, "va", "vb", &e, NULL); /* ir/ops.def's KIR_BINARY line */
    }
    kcu_put_store(&x->body, n->dtype, "    ", "out[i]", ks_buf_cstr(&e));
    ks_buf_free(&e);
    ks_buf_puts(&x->body, "}\n");
    kcu_kernel_end(x, k, "");
    return 0;
}

static int emit_unary(kcu_gen *x, kir_val v)
{
    const kir_node *n = &x->g->nodes[v];
    int64_t row = kir_row_elems(n);
    krt_cuda_kernel *k = kcu_elementwise_kernel(x, v, row);
    kcu_param_in(x, k, n->in[0], "x");
    kcu_param_out(x, k, v);
    kir_dtype xt = x->g->nodes[n->in[0]].dtype;
    char xi[32]; /* x[i] as f32 */
    snprintf(xi, sizeof xi, "%sx[i]%s", kcu_ld(xt), kcu_ld_end(xt));
    ks_buf body = {0}, val = {0};
    const char *what = "";
    char what_buf[128];
    switch (n->op) {
    case KIR_OP_SCALE:
    case KIR_OP_CLAMP:
        what = kcu_attr_unary_write(x->g, v, xi, &val);
        kcu_put_store(&body, n->dtype, "    ", "out[i]", ks_buf_cstr(&val));
        break;
    default: {
        /* ir/ops.def's formula, as the interpreter computes it: in double over a copy of x[i], or in float
         * over x[i] itself */
        int in_double = 0;
        ks_buf expr = {0};
        const int half = (int)kir_attr_int(x->g, v, KIR_A_ANY_HALF_MATH); /* fast precision: the formula's float form */
        kcu_formula_write(n->op, half, "a", &expr, &in_double, &what);
        if (in_double) {
            ks_buf_printf(&body, "    const double a = %s;\n", xi);
            ks_buf_printf(&val, "(float)(%s)", ks_buf_cstr(&expr));
        } else {
            expr.len = 0;
            kcu_formula_write(n->op, half, xi, &expr, NULL, NULL);
            ks_buf_puts(&val, ks_buf_cstr(&expr));
        }
        kcu_put_store(&body, n->dtype, "    ", "out[i]", ks_buf_cstr(&val));
        snprintf(what_buf, sizeof what_buf, "%s%s", what, in_double ? ", in double" : "");
        what = what_buf;
        ks_buf_free(&expr);
        break;
    }
    }
    kcu_open_body(x, k, what);
    kcu_elementwise_prologue(x, row);
    ks_buf_put(&x->body, body.data, body.len);
    ks_buf_puts(&x->body, "}\n");
    ks_buf_free(&body);
    ks_buf_free(&val);
    kcu_kernel_end(x, k, "");
    return 0;
}

/* Threads for a per-row reduction over d elements: a power of two in [32, 256]. */
static int reduce_threads(int64_t d)
{
    int t = 32;
    while (t < 256 && t < d) t *= 2;
    return t;
}

/* A block-wide reduction of `var` over the threads in the shared array `arr` [B], a fixed tree whose
 * step is arr[t] = combine (an expression over arr[threadIdx.x] and arr[threadIdx.x + s]); every thread
 * sees the result in `var` afterwards. */
static void put_block_tree(ks_buf *b, const char *arr, const char *var, const char *combine)
{
    ks_buf_printf(b,
                  "    %s[threadIdx.x] = %s;\n"
                  "    __syncthreads();\n"
                  "    for (int s = B / 2; s > 0; s >>= 1) {\n"
                  "        if (threadIdx.x < s) %s[threadIdx.x] = %s;\n"
                  "        __syncthreads();\n"
                  "    }\n"
                  "    %s = %s[0];\n"
                  "    __syncthreads();\n",
                  arr, var, arr, combine, var, arr);
}

/* A block-wide sum of the double `var` in red[B] (put_block_tree) */
static void put_block_sum(ks_buf *b, const char *var)
{
    put_block_tree(b, "red", var, "red[threadIdx.x] + red[threadIdx.x + s]");
}

/* An RMS norm's statistic over the block's row xr [D] of dtype xt: the squares in double, each thread's
 * elements in order, then the block's fixed tree (put_block_sum); `inv` = 1 / sqrt(mean + eps). */
static void put_rms_inv(ks_buf *b, kir_dtype xt)
{
    ks_buf_printf(b, "    double ss = 0.0;\n"
                     "    for (int i = threadIdx.x; i < D; i += B) ss += (double)%sxr[i]%s * %sxr[i]%s;\n",
                  kcu_ld(xt), kcu_ld_end(xt), kcu_ld(xt), kcu_ld_end(xt));
    put_block_sum(b, "ss");
    ks_buf_puts(b, "    const double inv = 1.0 / sqrt(ss / (double)D + eps);\n");
}

/* rms_norm and layer_norm: one block per row of the last dim; sums in double. */
int kcu_emit_norm(kcu_gen *x, kir_val v)
{
    const kir_node *n = &x->g->nodes[v];
    int64_t d = kcu_last_dim(n), rows = kir_row_elems(n) / d;
    int threads = reduce_threads(d);
    int has_w = n->nin > 1 && n->in[1] != KIR_NONE, has_b = n->nin > 2 && n->in[2] != KIR_NONE;
    int rms = n->op == KIR_OP_RMS_NORM;
    kir_dtype xt = x->g->nodes[n->in[0]].dtype;
    const char *l0 = kcu_ld(xt), *l1 = kcu_ld_end(xt);
    krt_cuda_kernel *k = kcu_kernel_new(x, v, threads);
    kcu_kernel_grid(k, 0, rows, 0, 1);
    kcu_param_in(x, k, n->in[0], "x");
    if (has_w) kcu_param_in(x, k, n->in[1], "w");
    if (has_b) kcu_param_in(x, k, n->in[2], "bias");
    kcu_param_out(x, k, v);
    kcu_open_body(x, k, rms ? "x / sqrt(mean(x^2) + eps) (* w), one block per row, sums in double"
                        : "(x - mean) / sqrt(var + eps) (* w + b), one block per row, sums in double");
    ks_buf_printf(&x->body,
                  "    enum { D = %lld, B = %d };\n"
                  "    __shared__ double red[B];\n"
                  "    const %s *xr = x + (long long)blockIdx.x * D;\n"
                  "    %s *orow = out + (long long)blockIdx.x * D;\n"
                  "    const double eps = ",
                  (long long)d, threads, kcu_elem_type(xt), kcu_elem_type(n->dtype));
    kcu_put_double(&x->body, kir_attr_float(x->g, v, KIR_A_RMS_NORM_EPS));
    ks_buf_puts(&x->body, ";\n");
    const kir_dtype wt = has_w ? x->g->nodes[n->in[1]].dtype : xt;
    if (rms && d % 8 == 0 && kcu_is_half(xt) && kcu_is_half(n->dtype) && (!has_w || kcu_is_half(wt))) {
        /* half rows: 8 elements (16 bytes) a load, read once and kept in registers for the second
         * pass, 16 bytes a store. The squares in double, each thread's chunks in order, then the
         * block's fixed tree. (Before: an element a load, x read twice.) */
        ks_buf_printf(&x->body,
                      "    enum { NC = (D / 8 + B - 1) / B }; /* 8-element chunks a thread */\n"
                      "    float v[NC][8];\n"
                      "    double ss = 0.0;\n"
                      "#pragma unroll\n"
                      "    for (int c = 0; c < NC; c++) {\n"
                      "        const int i = (threadIdx.x + c * B) * 8;\n"
                      "        if (i >= D) break;\n"
                      "        kcu_xload<8>(xr + i, v[c]);\n"
                      "#pragma unroll\n"
                      "        for (int j = 0; j < 8; j++) ss += (double)v[c][j] * v[c][j];\n"
                      "    }\n");
        put_block_sum(&x->body, "ss");
        ks_buf_printf(&x->body,
                      "    const double inv = 1.0 / sqrt(ss / (double)D + eps);\n"
                      "#pragma unroll\n"
                      "    for (int c = 0; c < NC; c++) {\n"
                      "        const int i = (threadIdx.x + c * B) * 8;\n"
                      "        if (i >= D) break;\n"
                      "%s"
                      "#pragma unroll\n"
                      "        for (int j = 0; j < 8; j++) {\n"
                      "            const float y = (float)(v[c][j] * inv);\n"
                      "            v[c][j] = kcu_round<%s>(%s);\n"
                      "        }\n"
                      "        kcu_sts<8>(orow + i, v[c]);\n"
                      "    }\n}\n",
                      has_w ? "        float wv[8];\n        kcu_xload<8>(w + i, wv);\n" : "", kcu_elem_type(n->dtype),
                      has_w ? "y * wv[j]" : "y");
        kcu_kernel_end(x, k, "");
        return 0;
    }
    if (rms) {
        put_rms_inv(&x->body, xt);
        ks_buf_printf(&x->body,
                      "    for (int i = threadIdx.x; i < D; i += B) {\n"
                      "        const float y = (float)(%sxr[i]%s * inv);\n",
                      l0, l1);
        kcu_put_store(&x->body, n->dtype, "        ", "orow[i]", has_w ? "y * kcu_f(w[i])" : "y");
        ks_buf_puts(&x->body, "    }\n}\n");
        kcu_kernel_end(x, k, "");
        return 0;
    }
    ks_buf_printf(&x->body, "    double mean = 0.0, var = 0.0;\n"
                            "    for (int i = threadIdx.x; i < D; i += B) mean += %sxr[i]%s;\n", l0, l1);
    put_block_sum(&x->body, "mean");
    ks_buf_printf(&x->body, "    mean /= (double)D;\n"
                            "    for (int i = threadIdx.x; i < D; i += B) var += ((double)%sxr[i]%s - mean) * ((double)%sxr[i]%s - mean);\n",
                  l0, l1, l0, l1);
    put_block_sum(&x->body, "var");
    ks_buf_printf(&x->body,
                  "    const double inv = 1.0 / sqrt(var / (double)D + eps);\n"
                  "    for (int i = threadIdx.x; i < D; i += B) {\n"
                  "        float y = (float)(((double)%sxr[i]%s - mean) * inv);\n"
                  "%s%s",
                  l0, l1, has_w ? "        y *= kcu_f(w[i]);\n" : "", has_b ? "        y += kcu_f(bias[i]);\n" : "");
    kcu_put_store(&x->body, n->dtype, "        ", "orow[i]", "y");
    ks_buf_puts(&x->body, "    }\n}\n");
    kcu_kernel_end(x, k, "");
    return 0;
}

/* softmax over the last dim, as the interpreter computes it: one block per row; the row's maximum in a
 * fixed tree (ir/ops.def's max: a NaN kept), the sum of e^(x - max) in double (each thread's elements
 * in order, then the fixed tree of put_block_sum), each value e^(x - max) / sum. */
static int emit_softmax(kcu_gen *x, kir_val v)
{
    const kir_node *n = &x->g->nodes[v];
    int64_t d = kcu_last_dim(n), rows = kir_row_elems(n) / d;
    int threads = reduce_threads(d);
    kir_dtype xt = x->g->nodes[n->in[0]].dtype;
    const char *l0 = kcu_ld(xt), *l1 = kcu_ld_end(xt);
    krt_cuda_kernel *k = kcu_kernel_new(x, v, threads);
    kcu_kernel_grid(k, 0, rows, 0, 1);
    kcu_param_in(x, k, n->in[0], "x");
    kcu_param_out(x, k, v);
    kcu_open_body(x, k, "e^(x - max) / sum over the row, one block per row, the sum in double");
    ks_buf mx = {0}, tree = {0};
    kir_binary_write(KIR_OP_MAX, "e", "m", &mx, NULL);
    kir_binary_write(KIR_OP_MAX, "redm[threadIdx.x + s]", "redm[threadIdx.x]", &tree, NULL);
    ks_buf_printf(&x->body,
                  "    enum { D = %lld, B = %d };\n"
                  "    __shared__ double red[B];\n"
                  "    __shared__ float redm[B];\n"
                  "    const %s *xr = x + (long long)blockIdx.x * D;\n"
                  "    %s *orow = out + (long long)blockIdx.x * D;\n"
                  "    float m = -__int_as_float(0x7f800000);\n"
                  "    for (int i = threadIdx.x; i < D; i += B) {\n"
                  "        const float e = %sxr[i]%s;\n"
                  "        m = %s;\n"
                  "    }\n",
                  (long long)d, threads, kcu_elem_type(xt), kcu_elem_type(n->dtype), l0, l1, ks_buf_cstr(&mx));
    put_block_tree(&x->body, "redm", "m", ks_buf_cstr(&tree));
    ks_buf_printf(&x->body,
                  "    double ss = 0.0;\n"
                  "    for (int i = threadIdx.x; i < D; i += B) ss += exp((double)%sxr[i]%s - (double)m);\n",
                  l0, l1);
    ks_buf_free(&mx);
    ks_buf_free(&tree);
    put_block_sum(&x->body, "ss");
    ks_buf_printf(&x->body, "    for (int i = threadIdx.x; i < D; i += B) {\n"
                            "        const float y = (float)(exp((double)%sxr[i]%s - (double)m) / ss);\n",
                  l0, l1);
    kcu_put_store(&x->body, n->dtype, "        ", "orow[i]", "y");
    ks_buf_puts(&x->body, "    }\n}\n");
    kcu_kernel_end(x, k, "");
    return 0;
}

static int emit_slice(kcu_gen *x, kir_val v)
{
    const kir_node *n = &x->g->nodes[v];
    int64_t d = kcu_last_dim(n), d_in = kcu_last_dim(&x->g->nodes[n->in[0]]), start = kir_attr_int(x->g, v, KIR_A_SLICE_START);
    int64_t row = kir_row_elems(n);
    krt_cuda_kernel *k = kcu_elementwise_kernel(x, v, row);
    kcu_param_in(x, k, n->in[0], "x");
    kcu_param_out(x, k, v);
    kcu_open_body(x, k, "a copy of a range of the last dim");
    kcu_elementwise_prologue(x, row);
    kir_dtype xt = x->g->nodes[n->in[0]].dtype;
    char v_[160];
    snprintf(v_, sizeof v_, "%sx[i / %lld * %lld + %lld + i %% %lld]%s", kcu_ld(xt), (long long)d, (long long)d_in,
             (long long)start, (long long)d, kcu_ld_end(xt));
    kcu_put_store(&x->body, n->dtype, "    ", "out[i]", v_);
    ks_buf_puts(&x->body, "}\n");
    kcu_kernel_end(x, k, "");
    return 0;
}

static int emit_concat(kcu_gen *x, kir_val v)
{
    const kir_node *n = &x->g->nodes[v];
    int64_t d = kcu_last_dim(n), row = kir_row_elems(n);
    krt_cuda_kernel *k = kcu_elementwise_kernel(x, v, row);
    for (int i = 0; i < n->nin; i++) {
        char name[16];
        snprintf(name, sizeof name, "x%d", i);
        kcu_param_in(x, k, n->in[i], name);
    }
    kcu_param_out(x, k, v);
    kcu_open_body(x, k, "operands side by side along the last dim");
    kcu_elementwise_prologue(x, row);
    ks_buf_printf(&x->body, "    const long long r = i / %lld, c = i %% %lld;\n", (long long)d, (long long)d);
    /* each operand's row: the result's, its dims of 1 between T and the last repeated (the interpreter's
       concat_row), computed before the chain of ifs */
    for (int i = 0; i < n->nin; i++) {
        const kir_node *an = &x->g->nodes[n->in[i]];
        if (!kir_concat_repeats(n, an)) continue;
        ks_buf_printf(&x->body, "    long long r%d = 0;\n    {\n        long long q = r, s = 1;\n", i);
        for (int d2 = n->ndim - 2; d2 >= 1; d2--) {
            if (an->dims[d2] != 1) ks_buf_printf(&x->body, "        r%d += q %% %lldLL * s;\n", i, (long long)n->dims[d2]);
            ks_buf_printf(&x->body, "        q /= %lldLL;\n", (long long)n->dims[d2]);
            if (an->dims[d2] != 1) ks_buf_printf(&x->body, "        s *= %lldLL;\n", (long long)an->dims[d2]);
        }
        ks_buf_printf(&x->body, "        r%d += q * s;\n    }\n", i);
    }
    int64_t at = 0;
    for (int i = 0; i < n->nin; i++) {
        const kir_node *an = &x->g->nodes[n->in[i]];
        int64_t di = kcu_last_dim(an);
        kir_dtype xt = an->dtype;
        char head[64], v_[160], src_row[16] = "r";
        if (kir_concat_repeats(n, an)) snprintf(src_row, sizeof src_row, "r%d", i);
        snprintf(head, sizeof head, "    %sif (c < %lld) ", i ? "else " : "", (long long)(at + di));
        snprintf(v_, sizeof v_, "%sx%d[%s * %lld + c - %lld]%s", kcu_ld(xt), i, src_row, (long long)di, (long long)at,
                 kcu_ld_end(xt));
        kcu_put_store(&x->body, n->dtype, head, "out[i]", v_);
        at += di;
    }
    ks_buf_puts(&x->body, "}\n");
    kcu_kernel_end(x, k, "");
    return 0;
}

/* Rotary embedding; the frequencies are the interpreter's, baked in as a table. */
static int emit_rope(kcu_gen *x, kir_val v)
{
    const kir_graph *g = x->g;
    const kir_node *n = &g->nodes[v];
    /* style and scaling are words of their sets (kir_verify); the table holds the frequencies */
    int64_t heads = n->dims[1], d = n->dims[2], rot = kir_attr_int(g, v, KIR_A_ROPE_ROT_DIM);
    int half = (int)(rot / 2), pairs = kir_attr_word(g, v, KIR_A_ROPE_STYLE) == KIR_ROPE_STYLE_PAIRS;
    int64_t row = heads * d;
    kir_dtype xt = g->nodes[n->in[0]].dtype;
    const char *l0 = kcu_ld(xt), *l1 = kcu_ld_end(xt);
    krt_cuda_kernel *k = kcu_elementwise_kernel(x, v, row);
    /* longrope, dynamic: past short_up_to, a token's frequencies follow its sequence's length */
    int64_t short_up_to = 0;
    const int by_length = kir_rope_by_length(g, v, &short_up_to);
    const kir_word scaling = kir_attr_word(g, v, KIR_A_ROPE_SCALING);
    kcu_put_rope_table(x, &x->body, v, rot, 1, "");
    if (scaling == KIR_ROPE_SCALING_LONGROPE) kcu_put_rope_table(x, &x->body, v, rot, short_up_to + 1, "_long");

    kcu_param_in(x, k, n->in[0], "x");
    kcu_param_in(x, k, n->in[1], "pos");
    if (by_length) kcu_param_in(x, k, n->in[2], "seq_len");
    kcu_param_out(x, k, v);
    kcu_open_body(x, k, pairs ? "rotate pairs (2j, 2j+1) by pos * inv_freq[j]" : "rotate (j, j + rot/2) by pos * inv_freq[j]");
    kcu_elementwise_prologue(x, row);
    ks_buf_printf(&x->body,
                  "    enum { D = %lld, ROT = %lld, HALF = %d };\n"
                  "    const int e = (int)(i %% D);\n"
                  "    if (e >= ROT) {\n",
                  (long long)d, (long long)rot, half);
    char xi[32];
    snprintf(xi, sizeof xi, "%sx[i]%s", l0, l1);
    kcu_put_store(&x->body, n->dtype, "        ", "out[i]", xi);
    ks_buf_puts(&x->body, "        return;\n"
                          "    }\n");
    if (pairs)
        ks_buf_puts(&x->body, "    const int j = e / 2, i0 = 2 * j, i1 = 2 * j + 1;\n");
    else
        ks_buf_puts(&x->body, "    const int j = e % HALF, i0 = j, i1 = j + HALF;\n");
    if (!by_length) {
        ks_buf_printf(&x->body, "    const float angle = (float)pos[i / %lld] * " NAME_MARK "_inv_freq[j];\n", (long long)row);
    } else {
        ks_buf_printf(&x->body,
                      "    const int len = seq_len[i / %lld];\n"
                      "    float f = " NAME_MARK "_inv_freq[j];\n"
                      "    if (len > %lld) {\n",
                      (long long)row, (long long)short_up_to);
        if (scaling == KIR_ROPE_SCALING_LONGROPE) {
            ks_buf_puts(&x->body, "        f = " NAME_MARK "_inv_freq_long[j]; /* the long factors */\n");
        } else { /* dynamic: kir_rope_inv_freq's float operations, the powers in double rounded once */
            const double factor = kir_attr_float(g, v, KIR_A_ROPE_FACTOR);
            ks_buf_puts(&x->body, "        /* the base grown with the sequence (dynamic NTK) */\n"
                                  "        const float grow = (float)len * ");
            kcu_put_float(&x->body, (float)factor);
            ks_buf_puts(&x->body, " / ");
            kcu_put_float(&x->body, (float)short_up_to);
            ks_buf_puts(&x->body, " - ");
            kcu_put_float(&x->body, (float)(factor - 1.0));
            ks_buf_puts(&x->body, ";\n        const float base = ");
            kcu_put_float(&x->body, (float)kir_attr_float(g, v, KIR_A_ROPE_THETA));
            ks_buf_puts(&x->body, " * (float)pow((double)grow, (double)");
            kcu_put_float(&x->body, (float)((double)rot / (double)(rot - 2)));
            ks_buf_printf(&x->body, ");\n"
                                    "        f = 1.0f / (float)pow((double)base, (double)((float)(2 * j) / %d.0f));\n",
                          (int)rot);
        }
        ks_buf_printf(&x->body, "    }\n"
                                "    const float angle = (float)pos[i / %lld] * f;\n",
                      (long long)row);
    }
    if (kir_attr_int(x->g, v, KIR_A_ANY_HALF_MATH)) /* fast precision: in float */
        ks_buf_puts(&x->body, "    float c, s;\n    kcu_sincos_half(angle, &s, &c);\n");
    else
        ks_buf_puts(&x->body, "    float c = (float)cos((double)angle), s = (float)sin((double)angle);\n");
    kcu_rope_factor(x->g, v, "    ", "c", "s", &x->body);
    ks_buf_printf(&x->body,
                  "    const %s *xr = x + (i - e);\n"
                  "    const float x0 = %sxr[i0]%s, x1 = %sxr[i1]%s;\n",
                  kcu_elem_type(xt), l0, l1, l0, l1);
    kcu_put_store(&x->body, n->dtype, "    ", "out[i]", "e == i0 ? x0 * c - x1 * s : x1 * c + x0 * s");
    ks_buf_puts(&x->body, "}\n");
    kcu_kernel_end(x, k, "");
    return 0;
}

/* A {rms_norm, rope} pair of a fuse_norm_rope group. */
typedef struct norm_rope_pair {
    kir_val norm, rope;
} norm_rope_pair;

static int norm_rope_ok(const kcu_gen *x, norm_rope_pair p, const uint8_t *read_outside)
{
    const kir_graph *g = x->g;
    const kir_node *n = &g->nodes[p.norm], *r = &g->nodes[p.rope];
    int64_t short_up_to = 0;
    return n->op == KIR_OP_RMS_NORM && r->op == KIR_OP_ROPE && r->nin == 2 && r->in[0] == p.norm &&
           !read_outside[p.norm] && n->ndim == 3 && !kir_rope_by_length(g, p.rope, &short_up_to);
}

/* Pair i's (token, head) row `row`: the norm as kcu_emit_norm computes it (the squares in double, the
 * block's fixed tree; its value rounded to its dtype), staged in shared memory, then each element rotated
 * as emit_rope rotates it; stored to out<i> where store, and where kv (the group's kv_write, this pair
 * its k) into the cache at the token's slot, the head's v row beside it. */
static void put_norm_rope_rows(kcu_gen *x, norm_rope_pair p, int i, int store, kir_val kv)
{
    const kir_graph *g = x->g;
    const kir_node *n = &g->nodes[p.norm], *r = &g->nodes[p.rope];
    const int64_t heads = r->dims[1], rot = kir_attr_int(g, p.rope, KIR_A_ROPE_ROT_DIM);
    const int half = (int)(rot / 2), pairs = kir_attr_word(g, p.rope, KIR_A_ROPE_STYLE) == KIR_ROPE_STYLE_PAIRS;
    const int has_w = n->nin > 1 && n->in[1] != KIR_NONE;
    const kir_dtype xt = g->nodes[n->in[0]].dtype;
    ks_buf *b = &x->body;
    char wv[32], dst[64];
    snprintf(wv, sizeof wv, "y * kcu_f(w%d[i])", i);
    ks_buf_printf(b,
                  "        enum { H = %lld, ROT = %lld, HALF = %d };\n"
                  "        const long long t = row / H;\n"
                  "        const %s *xr = x%d + row * D;\n"
                  "        const double eps = ",
                  (long long)heads, (long long)rot, half, kcu_elem_type(xt), i);
    kcu_put_double(b, kir_attr_float(g, p.norm, KIR_A_RMS_NORM_EPS));
    ks_buf_puts(b, ";\n");
    put_rms_inv(b, xt);
    ks_buf_printf(b,
                  "        for (int i = threadIdx.x; i < D; i += B) {\n"
                  "            const float y = (float)(%sxr[i]%s * inv);\n"
                  "            ys[i] = kcu_round<%s>(%s);\n"
                  "        }\n"
                  "        __syncthreads();\n",
                  kcu_ld(xt), kcu_ld_end(xt), kcu_elem_type(n->dtype), has_w ? wv : "y");
    if (kv != KIR_NONE) { /* the head's v row into the cache, beside k's */
        const kir_node *vn = &g->nodes[g->nodes[kv].in[1]];
        const int64_t vrow = kir_row_elems(vn) / heads;
        ks_buf_printf(b,
                      "        const long long slot = slots[t], h = row %% H;\n"
                      "        for (int e = threadIdx.x; e < %lld; e += B) {\n",
                      (long long)vrow);
        char val[96];
        snprintf(val, sizeof val, "%sv[row * %lld + e]%s", kcu_ld(vn->dtype), (long long)vrow, kcu_ld_end(vn->dtype));
        snprintf(dst, sizeof dst, "vc[(slot * H + h) * %lld + e]", (long long)vrow);
        kcu_put_store(b, kir_kv_dtype(g, kv), "            ", dst, val);
        ks_buf_puts(b, "        }\n");
    }
    ks_buf_printf(b, "        for (int e = threadIdx.x; e < D; e += B) {\n            float y;\n"
                     "            if (e >= ROT) {\n                y = ys[e];\n            } else {\n");
    ks_buf_puts(b, pairs ? "                const int j = e / 2, i0 = 2 * j, i1 = 2 * j + 1;\n"
                         : "                const int j = e % HALF, i0 = j, i1 = j + HALF;\n");
    ks_buf_printf(b, "                const float angle = (float)pos%d[t] * " NAME_MARK "_inv_freq%d[j];\n", i, i);
    if (kir_attr_int(g, p.rope, KIR_A_ANY_HALF_MATH))
        ks_buf_puts(b, "                float c, s;\n                kcu_sincos_half(angle, &s, &c);\n");
    else
        ks_buf_puts(b, "                float c = (float)cos((double)angle), s = (float)sin((double)angle);\n");
    kcu_rope_factor(g, p.rope, "                ", "c", "s", b);
    ks_buf_puts(b, "                const float y0 = ys[i0], y1 = ys[i1];\n"
                   "                y = e == i0 ? y0 * c - y1 * s : y1 * c + y0 * s;\n"
                   "            }\n");
    /* the rope's value rounded to its dtype, as its own kernel stores it; the cache's store rounds that */
    if (store) {
        snprintf(dst, sizeof dst, "out%d[row * D + e]", i);
        kcu_put_store(b, r->dtype, "            ", dst, "y");
    }
    if (kv != KIR_NONE) {
        ks_buf_printf(b, "            const float yr = kcu_round<%s>(y);\n", kcu_elem_type(r->dtype));
        snprintf(dst, sizeof dst, "kc[(slot * H + h) * D + e]");
        kcu_put_store(b, kir_kv_dtype(g, kv), "            ", dst, "yr");
    }
    ks_buf_puts(b, "        }\n");
}

/* passes/fuse_norm_rope.c's groups: {rms_norm, rope} — a norm over each head whose one use is its
 * rotation — or two such pairs (an attention's q and k) and the kv_write of k and v: one kernel, a
 * block a (token, head) row of each pair in turn (put_norm_rope_rows). 0 (nothing written) for another
 * group. */
static int emit_norm_rope(kcu_gen *x, const kir_val *nodes, int count, const uint8_t *read_outside)
{
    const kir_graph *g = x->g;
    norm_rope_pair p[2];
    int np = 0;
    kir_val kv = KIR_NONE;
    for (int i = 0; i < count; i++) {
        const kir_op op = g->nodes[nodes[i]].op;
        if (op == KIR_OP_RMS_NORM && i + 1 < count && np < 2) p[np++] = (norm_rope_pair){nodes[i], nodes[i + 1]}, i++;
        else if (op == KIR_OP_KV_WRITE && kv == KIR_NONE) kv = nodes[i];
        else return 0;
    }
    if (np == 0 || (kv != KIR_NONE) != (np == 2)) return 0;
    for (int i = 0; i < np; i++)
        if (!norm_rope_ok(x, p[i], read_outside)) return 0;
    int kp = -1; /* the pair that is the kv_write's k */
    if (kv != KIR_NONE) {
        const kir_node *w = &g->nodes[kv];
        for (int i = 0; i < np; i++)
            if (w->in[0] == p[i].rope) kp = i;
        const int64_t layer = kir_attr_int(g, kv, KIR_A_ATTENTION_LAYER);
        if (kp < 0 || layer < 0 || layer >= INT32_MAX) return 0;
        const kir_node *vn = &g->nodes[w->in[1]];
        if (kir_row_elems(vn) % g->nodes[p[kp].rope].dims[1] != 0) return 0;
    }
    const int64_t d = g->nodes[p[0].rope].dims[2];
    for (int i = 1; i < np; i++)
        if (g->nodes[p[i].rope].dims[2] != d) return 0;
    const int threads = reduce_threads(d);
    krt_cuda_kernel *k = kcu_kernel_new(x, p[np - 1].rope, threads);
    int64_t rows = 0;
    for (int i = 0; i < np; i++) rows += g->nodes[p[i].rope].dims[1];
    kcu_kernel_grid(k, 0, rows, 0, 1);
    for (int i = 0; i < np; i++) {
        const kir_node *n = &g->nodes[p[i].norm], *r = &g->nodes[p[i].rope];
        char name[16], suffix[16];
        snprintf(suffix, sizeof suffix, "%d", i);
        kcu_put_rope_table(x, &x->body, p[i].rope, kir_attr_int(g, p[i].rope, KIR_A_ROPE_ROT_DIM), 1, suffix);
        snprintf(name, sizeof name, "x%d", i);
        kcu_param_in(x, k, n->in[0], name);
        if (n->nin > 1 && n->in[1] != KIR_NONE) {
            snprintf(name, sizeof name, "w%d", i);
            kcu_param_in(x, k, n->in[1], name);
        }
        snprintf(name, sizeof name, "pos%d", i);
        kcu_param_in(x, k, r->in[1], name);
    }
    int store[2] = {1, 1};
    for (int i = 0; i < np; i++) {
        if (i == kp) store[i] = read_outside[p[i].rope] || read_outside[kv];
        if (!store[i]) continue;
        char decl[64];
        snprintf(decl, sizeof decl, "%s *__restrict__ out%d", kcu_elem_type(g->nodes[p[i].rope].dtype), i);
        kcu_add_param(x, k, KRT_CUDA_ARG_VALUE, p[i].rope, decl);
    }
    if (kv != KIR_NONE) {
        const kir_node *w = &g->nodes[kv];
        const int64_t layer = kir_attr_int(g, kv, KIR_A_ATTENTION_LAYER);
        x->root[kv] = x->root[w->in[0]]; /* its value is k, passed through */
        kcu_param_in(x, k, w->in[1], "v");
        const char *ct = kcu_elem_type(kir_kv_dtype(g, kv));
        char decl[64];
        snprintf(decl, sizeof decl, "%s *__restrict__ kc", ct);
        kcu_add_param(x, k, KRT_CUDA_ARG_KV_K, layer, decl);
        snprintf(decl, sizeof decl, "%s *__restrict__ vc", ct);
        kcu_add_param(x, k, KRT_CUDA_ARG_KV_V, layer, decl);
        kcu_add_param(x, k, KRT_CUDA_ARG_SLOTS, 0, "const int *__restrict__ slots");
    }
    const int pairs = kir_attr_word(g, p[0].rope, KIR_A_ROPE_STYLE) == KIR_ROPE_STYLE_PAIRS;
    kcu_open_body(x, k, np == 2 ? "q's and k's head norms and rotations, k and v into the KV cache"
                        : pairs ? "each head's rms_norm, then its pairs (2j, 2j+1) rotated by pos * inv_freq[j]"
                                : "each head's rms_norm, then (j, j + rot/2) rotated by pos * inv_freq[j]");
    ks_buf_printf(&x->body,
                  "    enum { D = %lld, B = %d };\n"
                  "    __shared__ double red[B];\n"
                  "    __shared__ float ys[D];\n"
                  "    long long row = blockIdx.x;\n",
                  (long long)d, threads);
    for (int i = 0; i < np; i++) {
        const int64_t heads = g->nodes[p[i].rope].dims[1];
        if (i + 1 < np) ks_buf_printf(&x->body, "    if (row < T * %lldLL) {\n", (long long)heads);
        else ks_buf_puts(&x->body, "    {\n");
        put_norm_rope_rows(x, p[i], i, store[i], i == kp ? kv : KIR_NONE);
        ks_buf_puts(&x->body, "        return;\n    }\n");
        if (i + 1 < np) ks_buf_printf(&x->body, "    row -= T * %lldLL;\n", (long long)heads);
    }
    ks_buf_puts(&x->body, "}\n");
    kcu_kernel_end(x, k, "norm");
    return 1;
}

/* The kernel that writes a step's K and V rows into layer `layer` of the
 * cache (its kv_k/kv_v arguments), at each token's slot; k and v are
 * values kv and vv. */
/* ---- the graph ------------------------------------------------------------------------- */
static const char banner[] =
    "/*\n"
    " * Generated by kiln (codegen/cuda) for graph \"%s\": %d launches of %zu distinct\n"
    " * kernels (nodes whose kernels would be the same text share one), every\n"
    " * dimension but T (the tokens of a step, a kernel argument) a constant.\n"
    " * Weights as stored in the engine (f32, bf16 or f16), every value in its IR dtype\n"
    " * (f32, or bf16/f16 in fast precision), arithmetic in f32.\n"
    " * The launch table is the engine's cuda.meta section. The device templates\n"
    " * below are codegen/cuda/kcu_prelude.cuh.\n"
    " */\n";

/* Emit node v's kernels, or record its alias. */
static int emit_node(kcu_gen *x, kir_val v)
{
    const kir_node *n = &x->g->nodes[v];
    switch (n->op) {
    case KIR_OP_INPUT:  /* the step's tokens or positions, uploaded by the runtime */
    case KIR_OP_WEIGHT: /* uploaded once */
        return 0;
    case KIR_OP_RESHAPE: /* same elements, same order: a view */
    case KIR_OP_OUTPUT:  /* the logits are copied to the host from the operand's buffer */
        x->root[v] = x->root[n->in[0]];
        return 0;
    case KIR_OP_KV_WRITE: {
        /* writes the cache; its value is k, passed through */
        int64_t layer = kir_attr_int(x->g, v, KIR_A_ATTENTION_LAYER);
        if (layer < 0 || layer >= INT32_MAX) return kcu_node_error(x, v, "layer %lld is out of range", (long long)layer);
        x->root[v] = x->root[n->in[0]];
        kcu_emit_kv_write_kernel(x, v, "", n->in[0], n->in[1], layer);
        return 0;
    }
    case KIR_OP_EMBED:
        return emit_embed(x, v);
    case KIR_OP_MATMUL:
        return emit_matmul(x, v);
#define KIR_BINARY(OP, what, expr) case KIR_OP_##OP: /* the binary ops of ir/ops.def */
#include "ir/ops.def"
    case KIR_OP_MASKED_FILL:
        return emit_binary(x, v);
    case KIR_OP_SCALE:
    case KIR_OP_CLAMP:
#define KIR_FORMULA(OP, TYPE, what, expr, half) case KIR_OP_##OP: /* the unary ops of ir/ops.def's formulas */
#include "ir/ops.def"
        return emit_unary(x, v);
    case KIR_OP_SOFTMAX:
        return emit_softmax(x, v);
    case KIR_OP_SUM:
    case KIR_OP_AMAX:
    case KIR_OP_AMIN:
    case KIR_OP_TOPK:
    case KIR_OP_GATHER:
    case KIR_OP_EXPERT_MATMUL:
    case KIR_OP_EXPERT_SUM:
        return kcu_emit_moe(x, v);
    case KIR_OP_RMS_NORM:
    case KIR_OP_LAYER_NORM:
        return kcu_emit_norm(x, v);
    case KIR_OP_SLICE:
        return emit_slice(x, v);
    case KIR_OP_CONCAT:
        return emit_concat(x, v);
    case KIR_OP_ROPE:
        return emit_rope(x, v);
    case KIR_OP_ATTENTION:
        return kcu_emit_attention(x, v);
    case KIR_OP_COUNT:
        break;
    }
    KS_UNREACHABLE();
}

/* 1 when node u's kernel reads operand i (attention reads K and V from the
 * cache, not from its operands, once kv_write was split from it; it reads q
 * and its sinks). */
static int reads_operand(const kir_graph *g, kir_val u, int i)
{
    const kir_node *n = &g->nodes[u];
    if (n->op == KIR_OP_ATTENTION && (i == 1 || i == 2)) return kir_attr_int(g, u, KIR_A_ATTENTION_WRITE_KV) != 0;
    return 1;
}

/* Emit every node: a fusion group (consecutive nodes with the same `fuse`,
 * weights and inputs among them allowed) as one kernel when
 * kcu_emit_group can, else node by node. */
/* For each node, the weight of the first matmul after it in the graph's order (the kernels' order),
 * or KIR_NONE where a routed expert_matmul (weights that depend on the step) or nothing comes first:
 * kcu_gen.ahead. A matmul's weight is its second operand when that is a weight of the model. */
static kir_val *next_weights(const kir_graph *g)
{
    kir_val *ahead = ks_xmalloc(sizeof *ahead * (g->n_nodes ? g->n_nodes : 1));
    kir_val next = KIR_NONE;
    for (size_t v = g->n_nodes; v-- > 0;) {
        const kir_node *n = &g->nodes[v];
        ahead[v] = next;
        if (n->op != KIR_OP_MATMUL && n->op != KIR_OP_EXPERT_MATMUL) continue;
        const int routed = n->op == KIR_OP_EXPERT_MATMUL && n->nin > 2 && n->in[2] != KIR_NONE;
        next = !routed && g->nodes[n->in[1]].op == KIR_OP_WEIGHT ? n->in[1] : KIR_NONE;
    }
    return ahead;
}

static int emit_nodes(kcu_gen *x)
{
    const kir_graph *g = x->g;
    size_t n = g->n_nodes;
    int64_t *fuse = ks_xmalloc(sizeof *fuse * (n ? n : 1));
    uint8_t *outside = ks_xcalloc(n ? n : 1, 1);
    kir_val *members = ks_xmalloc(sizeof *members * (n ? n : 1));
    for (size_t v = 0; v < n; v++) {
        kir_op op = g->nodes[v].op;
        fuse[v] = op == KIR_OP_WEIGHT || op == KIR_OP_INPUT ? -1 : kir_attr_int(g, (kir_val)v, KIR_A_ANY_FUSE);
    }
    for (size_t u = 0; u < n; u++)
        for (int i = 0; i < g->nodes[u].nin; i++) {
            kir_val in = g->nodes[u].in[i];
            if (in == KIR_NONE || !reads_operand(g, (kir_val)u, i)) continue;
            if (fuse[u] < 0 || fuse[u] != fuse[in]) outside[in] = 1;
        }
    int rc = 0;
    for (size_t v = 0; v < n && rc == 0;) {
        if (fuse[v] < 0) {
            rc = emit_node(x, (kir_val)v);
            v++;
            continue;
        }
        /* the group's span: nodes of this group, weights and inputs, up to its last node */
        int count = 0;
        size_t end = v;
        for (size_t u = v; u < n; u++) {
            kir_op op = g->nodes[u].op;
            if (fuse[u] == fuse[v]) {
                members[count++] = (kir_val)u;
                end = u + 1;
            } else if (op != KIR_OP_WEIGHT && op != KIR_OP_INPUT) {
                break;
            }
        }
        int done = 0;
        /* a group with members after the span is not consecutive: node by node */
        int consecutive = 1;
        for (size_t u = end; u < n && consecutive; u++) consecutive = fuse[u] != fuse[v];
        int rows = 1; /* passes/fuse_rows.c's group: row ops and elementwise ones, no matmul, norm or attention */
        for (int i = 0; i < count; i++) {
            const kir_fusion_class fc = kir_op_table[g->nodes[members[i]].op].fusion;
            rows &= fc == KIR_FUSE_ROW || fc == KIR_FUSE_ELEMWISE;
        }
        /* a kv_write of int8/fp8 codes (quantize_kv leaves it in no group; an edited IR may not) or of K alone
         * (v_in_k): its own kernel (kcu_emit_kv_write_kernel), so node by node */
        for (int i = 0; i < count; i++)
            if (g->nodes[members[i]].op == KIR_OP_KV_WRITE &&
                (kir_dtype_is_quantized(kir_kv_dtype(g, members[i])) || kir_attr_int(g, members[i], KIR_A_KV_WRITE_V_IN_K)))
                consecutive = 0;
        const int norm_rope = count >= 2 && g->nodes[members[0]].op == KIR_OP_RMS_NORM &&
                              g->nodes[members[1]].op == KIR_OP_ROPE; /* and maybe k's pair and the kv_write */
        if (consecutive && norm_rope)
            done = emit_norm_rope(x, members, count, outside);
        else if (consecutive)
            done = g->nodes[members[0]].op == KIR_OP_EXPERT_MATMUL || g->nodes[members[0]].op == KIR_OP_EXPERT_SUM ||
                           (count > 1 && g->nodes[members[1]].op == KIR_OP_EXPERT_MATMUL) /* after its norm */
                       ? kcu_emit_moe_group(x, members, count, outside)
                   : rows                                          ? kcu_emit_row_group(x, members, count, outside)
                                                                   : kcu_emit_group(x, members, count, outside);
        if (done < 0) rc = -1;
        if (done != 0) {
            for (size_t u = v; u < end && rc == 0; u++)
                if (fuse[u] != fuse[v]) rc = emit_node(x, (kir_val)u);
            v = end;
            continue;
        }
        for (size_t u = v; u < end && rc == 0; u++) rc = emit_node(x, (kir_val)u);
        v = end;
    }
    free(fuse);
    free(outside);
    free(members);
    return rc;
}

int kcu_generate(const kir_graph *g, ks_buf *src, krt_cuda_meta *meta, ks_diag *d)
{
    return kcu_generate_with(g, NULL, src, meta, d);
}

int kcu_generate_with(const kir_graph *g, const kcu_options *opt, ks_buf *src, krt_cuda_meta *meta, ks_diag *d)
{
    if (kir_verify(g, d, kir_graph_name(g, "graph")) != 0) return -1;
    ks_buf kernels = {0};
    kcu_gen x = {.g = g, .src = &kernels, .meta = meta, .d = d};
    if (opt) x.opt = *opt;
    x.root = ks_xcalloc(g->n_nodes ? g->n_nodes : 1, sizeof *x.root);
    x.ahead = next_weights(g);
    int have_output = 0;
    /* every value is of a float dtype kiln computes (f32, bf16, f16) or an i32 input: kir_verify */
    for (size_t v = 0; v < g->n_nodes; v++) x.root[v] = (uint32_t)v;
    int rc = emit_nodes(&x);
    if (rc == 0) {
        ks_buf_printf(src, banner, g->name ? g->name : "", meta->n_kernels, x.n_bodies);
        if (x.opt.stats_batch > 0) ks_buf_printf(src, "#define KCU_STATS_BATCH %d\n", x.opt.stats_batch);
        if (x.opt.tc_xring < 0) ks_buf_puts(src, "#define KCU_TC_XRING 0\n");
        if (x.opt.tc_prefetch > 0) ks_buf_printf(src, "#define KCU_TC_PREFETCH %d\n", x.opt.tc_prefetch);
        ks_buf_puts(src, kcu_prelude);
        ks_buf_put(src, kernels.data, kernels.len);
        meta->pdl = 1; /* kcu_open_body, kcu_open_large and the gemm90 wrappers open with KCU_PDL_ENTER */
    }
    size_t n_aliases = 0;
    for (size_t v = 0; v < g->n_nodes; v++) n_aliases += x.root[v] != v;
    meta->aliases = ks_arena_alloc(&meta->arena, sizeof *meta->aliases * (n_aliases + 1));
    for (size_t v = 0; v < g->n_nodes && rc == 0; v++) {
        if (x.root[v] != v) {
            meta->aliases[meta->n_aliases][0] = (uint32_t)v;
            meta->aliases[meta->n_aliases][1] = x.root[v];
            meta->n_aliases++;
        }
        if (g->nodes[v].op == KIR_OP_OUTPUT && !have_output) {
            meta->output = x.root[v];
            have_output = 1;
        }
    }
    if (rc == 0 && !have_output) {
        ks_error(d, kir_graph_name(g, "graph"), "cuda: the graph has no output");
        rc = -1;
    }
    ks_buf_free(&kernels);
    ks_buf_free(&x.params);
    ks_buf_free(&x.body);
    ks_buf_free(&x.texts);
    free(x.bodies);
    free(x.root);
    free(x.ahead);
    return rc;
}

