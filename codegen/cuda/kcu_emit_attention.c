/*
 * kcu_emit_attention.c — the KV cache's writes and attention over the paged
 * cache (codegen/cuda/kcu_gen.h).
 *
 * Requires: a verified graph; an attention node's operands [T,H,D],
 * [T,KH,D], [T,KH,Dv] with H a multiple of KH. Guarantees: every output
 * element summed in a fixed order (no atomics): reproducible bit for bit;
 * the cache's elements of the node's kv_dtype (f32, or bf16/f16 rounded to
 * nearest even as they are written), q, k, v and the output of their own
 * dtypes, all arithmetic in f32.
 */
#include "codegen/cuda/kcu_gen.h"
#include "ir/numerics.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Attention: warps a block (at most); the tensor-core prefill (kcu_flash.cuh) runs for steps in which
 * a sequence has more than ATT_FLASH_T tokens (the kernel's large_per_seq), when use_flash_prefill says
 * so (decode, a few tokens a sequence however many sequences, stays kcu_attention_kernel). */
enum { ATT_WARPS = 8, ATT_FLASH_T = 32 };
/* Blocks a head's positions are split over, one thread block cluster (grid z; kcu_attention,
 * sm_90 and later: each block a share of the positions, their states combined through distributed
 * shared memory; elsewhere block 0 takes all). Decode at long contexts had a block a head walk
 * every position: 32 blocks for Llama-3-8B on 132 SMs, 154 µs a layer at 2049 positions (38 split).
 * Split only past KCU_ATT_SPLIT_ROUNDS rounds of a block's warps (kcu_prelude.cuh). 8: the portable
 * cluster size. */
enum { ATT_SPLIT = 8 };

/* Whether attention or kv_write v reads V from the K rows (v_in_k, passes/share_kv.c): the cache holds K alone. */
static int v_in_k(const kcu_gen *x, kir_val v)
{
    return kir_attr_int(x->g, v, x->g->nodes[v].op == KIR_OP_ATTENTION ? KIR_A_ATTENTION_V_IN_K : KIR_A_KV_WRITE_V_IN_K) != 0;
}

/* Whether node v's KV cache holds int8 or fp8 codes (--kv-dtype), each row with a scale. */
static int kv_codes(const kcu_gen *x, kir_val v)
{
    const kir_dtype t = kir_kv_dtype(x->g, v);
    return t == KIR_I8 || t == KIR_F8E4M3;
}

/* The KV cache's element type (attention or kv_write v's kv_dtype: f32, a half type in fast precision,
 * or a code type of the prelude's kcu_kv_codes). */
static const char *kv_elem_type(const kcu_gen *x, kir_val v)
{
    const kir_dtype t = kir_kv_dtype(x->g, v);
    return t == KIR_I8 ? "kcu_kv_i8" : t == KIR_F8E4M3 ? "kcu_kv_e4m3" : kcu_elem_type(t);
}

/* A kernel's parameters for layer `layer` of node v's cache: kc, and vc unless V is in the K rows (v_in_k); over
 * codes, their scales ks (and vs). const where the kernel only reads. */
static void add_cache_params(kcu_gen *x, krt_cuda_kernel *k, kir_val v, int64_t layer, int writes)
{
    const char *c = writes ? "" : "const ";
    const int vik = v_in_k(x, v);
    char decl[64];
    snprintf(decl, sizeof decl, "%s%s *__restrict__ kc", c, kv_elem_type(x, v));
    kcu_add_param(x, k, KRT_CUDA_ARG_KV_K, layer, decl);
    if (!vik) {
        snprintf(decl, sizeof decl, "%s%s *__restrict__ vc", c, kv_elem_type(x, v));
        kcu_add_param(x, k, KRT_CUDA_ARG_KV_V, layer, decl);
    }
    if (!kv_codes(x, v)) return;
    snprintf(decl, sizeof decl, "%sfloat *__restrict__ ks", c);
    kcu_add_param(x, k, KRT_CUDA_ARG_KV_KS, layer, decl);
    if (vik) return;
    snprintf(decl, sizeof decl, "%sfloat *__restrict__ vs", c);
    kcu_add_param(x, k, KRT_CUDA_ARG_KV_VS, layer, decl);
}

enum { KV_CODE_WARPS = 8 };
/* The write of a step's K and V rows as codes (kv_codes): a warp a (token, K or V, kv head) row,
 * kcu_kv_put_row (the row's amax, its scale, its codes), KV_CODE_WARPS rows a block. */
static void emit_kv_write_codes(kcu_gen *x, kir_val v, const char *suffix, kir_val kv, kir_val vv, int64_t layer)
{
    const kir_node *kn = &x->g->nodes[kv], *vn = &x->g->nodes[vv];
    const int64_t kh = kn->dims[1], dk = kn->dims[2], dv = vn->dims[2];
    const int vik = v_in_k(x, v), sides = vik ? 1 : 2; /* V in the K rows: K's alone */
    krt_cuda_kernel *k = kcu_kernel_new(x, v, 32 * KV_CODE_WARPS);
    kcu_kernel_grid(k, 0, sides * kh, 0, KV_CODE_WARPS);
    kcu_param_in(x, k, kv, "k");
    if (!vik) kcu_param_in(x, k, vv, "v");
    add_cache_params(x, k, v, layer, 1);
    kcu_add_param(x, k, KRT_CUDA_ARG_SLOTS, 0, "const int *__restrict__ slots");
    kcu_open_body(x, k, "K and V rows of the step into a layer of the KV cache as codes (kc, vc) and a scale a row "
                        "(ks, vs), at each token's slot: a warp a (token, K or V, head) row");
    ks_buf_printf(&x->body,
                  "    enum { KH = %lld, DK = %lld, DV = %lld, W = %d, SIDES = %d };\n"
                  "    const long long r = (long long)blockIdx.x * W + threadIdx.x / 32;\n"
                  "    if (r >= (long long)T * SIDES * KH) return;\n"
                  "    const long long t = r / (SIDES * KH), slot = slots[t];\n"
                  "    const int j = (int)(r %% (SIDES * KH)), h = j %% KH, lane = threadIdx.x %% 32;\n"
                  "    if (j < KH)\n"
                  "        kcu_kv_put_row<DK>(k + (t * KH + h) * DK, kc + (slot * KH + h) * DK, ks + slot * KH + h, lane);\n",
                  (long long)kh, (long long)dk, (long long)dv, KV_CODE_WARPS, sides);
    if (!vik)
        ks_buf_puts(&x->body,
                    "    else\n"
                    "        kcu_kv_put_row<DV>(v + (t * KH + h) * DV, vc + (slot * KH + h) * DV, vs + slot * KH + h, lane);\n");
    ks_buf_puts(&x->body, "}\n");
    kcu_kernel_end(x, k, suffix);
}

/* The kernel that writes a step's K and V rows into layer `layer` of the
 * cache (its kv_k/kv_v arguments), at each token's slot; k and v are
 * values kv and vv. */
void kcu_emit_kv_write_kernel(kcu_gen *x, kir_val v, const char *suffix, kir_val kv, kir_val vv, int64_t layer)
{
    if (kv_codes(x, v)) {
        emit_kv_write_codes(x, v, suffix, kv, vv, layer);
        return;
    }
    const kir_node *kn = &x->g->nodes[kv], *vn = &x->g->nodes[vv];
    /* V in the K rows (v_in_k): K's rows alone */
    const int vik = v_in_k(x, v);
    int64_t krow = kir_row_elems(kn), vrow = vik ? 0 : kir_row_elems(vn);
    krt_cuda_kernel *k = kcu_elementwise_kernel(x, v, krow + vrow);
    kcu_param_in(x, k, kv, "k");
    if (!vik) kcu_param_in(x, k, vv, "v");
    kir_dtype ct = kir_kv_dtype(x->g, v);
    add_cache_params(x, k, v, layer, 1);
    kcu_add_param(x, k, KRT_CUDA_ARG_SLOTS, 0, "const int *__restrict__ slots");
    kcu_open_body(x, k, "K and V rows of the step into a layer of the KV cache (kc, vc), at each token's slot");
    kcu_elementwise_prologue(x, krow + vrow);
    ks_buf_printf(&x->body,
                  "    enum { KROW = %lld, VROW = %lld };\n"
                  "    const long long t = i / (KROW + VROW), e = i %% (KROW + VROW), slot = slots[t];\n"
                  "    if (e < KROW)\n",
                  (long long)krow, (long long)vrow);
    char val[64];
    snprintf(val, sizeof val, "%sk[t * KROW + e]%s", kcu_ld(kn->dtype), kcu_ld_end(kn->dtype));
    kcu_put_store(&x->body, ct, "        ", "kc[slot * KROW + e]", val);
    if (!vik) {
        ks_buf_puts(&x->body, "    else\n");
        snprintf(val, sizeof val, "%sv[t * VROW + e - KROW]%s", kcu_ld(vn->dtype), kcu_ld_end(vn->dtype));
        kcu_put_store(&x->body, ct, "        ", "vc[slot * VROW + e - KROW]", val);
    }
    ks_buf_puts(&x->body, "}\n");
    kcu_kernel_end(x, k, suffix);
}

/* How the attention kernel (kcu_attention_kernel, kcu_prelude.cuh) splits its work. */
typedef struct att_plan {
    int hbw; /* q heads a block in the wide way, sharing their kv head's K and V reads (1: no wide way) */
    int pw;  /* positions a warp takes a step, wide way */
    int p1;  /* the same, one head a block */
    int nw;  /* warps a block */
} att_plan;

/* The largest power of two that divides n and is at most cap. */
static int pow2_divisor(int64_t n, int cap)
{
    int v = 1;
    while (v * 2 <= cap && n % (v * 2) == 0) v *= 2;
    return v;
}

/* Positions a step for hb heads a block, starting from p: at most 32 scores a step (p * hb),
 * and the step's K and V rows at most 64 registers a lane. */
static int step_positions(int p, int hb, int64_t dk, int64_t dv)
{
    while (p > 1 && (p * hb > 32 || p * (dk + dv) > 64 * 32)) p /= 2;
    return p;
}

static att_plan plan_attention(int64_t group, int64_t dk, int64_t dv)
{
    att_plan a;
    /* wide: up to 4 heads of a kv group, while their accumulators stay within 16 registers a lane */
    a.hbw = pow2_divisor(group, 4);
    while (a.hbw > 1 && a.hbw * dv > 512) a.hbw /= 2;
    a.pw = step_positions(8 / a.hbw, a.hbw, dk, dv);
    a.p1 = step_positions(8, 1, dk, dv);
    /* 8 warps, fewer when their partial outputs would pass 32 KiB of shared memory */
    a.nw = ATT_WARPS;
    while (a.nw > 1 && (int64_t)a.nw * a.hbw * dv * 4 > 32768) a.nw /= 2;
    while (a.nw > 1 && (int64_t)a.nw * dv * 4 > 32768) a.nw /= 2;
    return a;
}


/*
 * The tensor-core prefill (kcu_flash_attention, kcu_flash.cuh): FlashAttention-2's forward
 * (Dao, "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning",
 * 2023) over kiln's paged cache, the `_large` variant of the attention kernel (steps of more
 * than ATT_FLASH_T tokens), on its own grid [ceil(T / (16 mw tw)), H / hb] of 8 warps.
 *
 * A block owns 16 mw tw consecutive tokens of the step for hb q heads of one kv head (warp w:
 * head w % hb, 16 mw tokens): the group's heads share every K/V tile the block stages (Llama-3-8B:
 * 64 tokens x 4 heads, the whole group). The step's tokens may come from several sequences in
 * any order: the block takes each sequence among its tokens in turn (a segment) over the
 * positions its tokens need ([min lo, max pos]), in tiles of bn positions read through the
 * block table, and masks by sequence, window and position (causal by position, not by token
 * index: a prompt after a cached prefix, or decode tokens in a long step, are the same case).
 * q (the block's 16 mw tw tokens x hb heads), two K tiles (k rows) and two V tiles (v rows) sit in
 * dynamic shared memory as the mma's 16-bit type (flash_smem bytes, meta "large.smem"), rows of a
 * multiple of 64 elements packed with their 16-byte chunks XOR-swizzled by the row (other rows
 * padded by 16 bytes) so that ldmatrix's 8 rows fall in different banks. A cache of that type is
 * copied with cp.async, double-buffered: tile it + 1's K and V are in flight while the warps
 * multiply tile it, one barrier a tile; an f32 cache is converted on the way (loads, stored at
 * once). Each warp owns 16 mw tokens of one head (mw m16 tiles) and forms s = q k^T with mma.sync
 * m16n8k16: per k16 slice, q's A fragments and K rows as B fragments by ldmatrix, each K fragment
 * feeding the mw tiles; it scales, softcaps and masks s in f32 (the mask only on tiles where a row
 * of the warp does not see every position: the diagonal, window edges, other sequences), updates
 * the rows' running maxima (over their 4 lanes) and sums (per lane; summed at the end), takes
 * p = 2^(s fac - m fac) (fac = scale log2e; one fma and one ex2.approx.ftz), rescales its output
 * accumulators unless no row's maximum moved (a warp vote), and multiplies the probabilities,
 * rounded to the 16-bit type in registers (the C fragments of two 8-position tiles are the A
 * fragment of a 16-position slice), by V (ldmatrix.trans, each fragment feeding the mw tiles)
 * into f32 accumulators. A warp whose rows have no score in a tile skips its products there (the
 * block still takes every barrier).
 *
 * Numerics: q, k, v and p in bf16 (or f16: the engine's half type; bf16 for f32 activations),
 * f32 products, sums and softmax statistics. Every sum has one order fixed by the shapes, the
 * step's tokens and the tile sizes: no atomics, the same bits on every run; a token's result
 * depends on which kernel its step's T chose (as kcu_matmul's). The exponentials are
 * ex2.approx.ftz on a GPU (a probability below 2^-126 is 0; the CPU emulator's exp2f keeps it);
 * skipping the rescale when no maximum moved changes no bit (o 1 = o).
 *
 * Cost (head_dim 128, sm_90a, ptxas -O3 --fmad=false): mw 2 with bn 32 (kcu_plan_flash's budgets),
 * 255 registers, no spills, 96 KiB of dynamic and 1 KiB of static shared memory: one block (8
 * warps) an SM, as before (the registers bound it; sm_80: 248). Before (q in registers, mw 1, bn
 * 64, single K and V tiles, 3 barriers a tile): 252 registers, 35 KiB, measured 352 us a layer
 * for Llama-3-8B at T = 2048 (torch SDPA 203 us), issue-bound on latency (ncu: 5.3 cycles a warp
 * between instructions, 62% of cycles no eligible warp). Per warp and 32-position tile now: 128
 * mma, 48 ldmatrix.x4 (16 q, 16 K, 16 V; was 64 per 128 mma: the K and V reads a product halve,
 * q's are new), so an SM reads 8 x 48 x 512 bytes of shared memory per 1024 mma, 1.5 cycles an
 * mma at 128 bytes a cycle (was 2): under mma.sync's rate, where before it bounded the tensor
 * cores at about half of it. Instructions a warp per 128 mma: about 450-600 (was about 800): the
 * softmax takes an fma and an ex2 an element (was a multiply by scale, one by log2e, and exp2f's 4
 * instructions), the mask runs only on edge tiles (was 5 integer ops an element on every tile), p
 * packs two a cvt, one barrier a tile (was 3 a 64-position tile), the rescale is skipped when no
 * maximum moves. Expected 250-290 us; measured 345.7 us (ncu: SMs active only 63 % of the kernel's
 * cycles, and 1160 SASS instructions a warp per 128 mma). Three fixes, each from ncu's per-SASS
 * samples (H200, Llama-3-8B, T = 2048, in the engine): the grid is [H / hb, tiles] (head groups on
 * x, which blocks start first: the longest rows of every group lead, where tiles on x let the last
 * wave hold whole groups of long rows); K and V tiles share a row's slot, found with shifts for a
 * power-of-two block size (the division per chunk and tensor held 16 % of the samples); ldmatrix
 * reads per-lane shared addresses with constant offsets and K's fragments in register pairs (the
 * loop's core 809 -> 616 instructions). Measured after: 177.4 us a layer at 2048 (194 TFLOP/s;
 * cuda_att_check alone 175 us, 196), 53 us at 512 (42 TFLOP/s: 64 blocks of 16 sequential tiles
 * on 132 SMs, latency-bound), 2.18 ms at 8192 (252 TFLOP/s); mw 1 (bn 32 or 64) is no faster at
 * 512 and slower at 2048 and 8192. A ring of 4 K/V tiles (plan.ns, where the targets' opt-in
 * shared memory holds it) measured 52.8 us at 512, 173 at 2048, 2.13 ms at 8192 (2 tiles: 53.0,
 * 175, 2.18): the loads were not the wait; each warp's own chain (QK mma, softmax, PV mma) at two
 * warps a scheduler is. At short T the long plan leaves SMs idle (64 blocks at 512 tokens on 132
 * SMs): the kernel holds a short plan too (kcu_plan_flash_short: one m16 tile a warp, twice the
 * blocks), taken when the long plan's blocks are fewer than the GPU's SMs (kcu_fa_few_blocks, at
 * run time); measured at 512 tokens in the engine 53 -> 38 µs (bench/RESULTS.md, issue #10 step 6;
 * SDPA 24). Untried: splitting a long row's positions between blocks at short T (the causal
 * rows' work is 1 to 16 tiles: the last block takes twice the mean), 2 blocks an SM of 4 warps,
 * ping-pong of softmax and mma between warps (FA3).
 * A step of many short sequences would make a segment per sequence in a tile, its products mostly
 * masked (measured: 128 one-token sequences at 4096 positions, 104.5 ms a step against a 19.9 ms
 * floor): such steps stay on kcu_attention_kernel, the variant being chosen by the step's longest
 * sequence (krt_cuda_kernel.large_per_seq); a step that mixes a prompt with decode tokens takes this
 * kernel for all of them.
 */
enum { FLASH_ACC_REGS = 160, FLASH_SOFTCAP_REGS = 16, FLASH_SMEM = 96 * 1024, FLASH_STATIC_SMEM = 2 * 1024 };

/* A lane's accumulator registers under plan f (and a softcap's share), as the budget counts them. */
static int flash_regs(const kcu_flash_plan *f, int64_t dvp, int softcap)
{
    return (int)(f->mw * (dvp + f->bn) / 2) + (softcap ? FLASH_SOFTCAP_REGS : 0);
}

/* Elements from a row of a dp-element tile (dp a multiple of 16) to the next in shared memory, as
 * kcu_fa_rows (kcu_flash.cuh): packed (swizzled) when a row is a multiple of 8 16-byte chunks, else
 * padded by one. */
static int64_t flash_row_stride(int64_t dp) { return (dp / 8) % 8 == 0 ? dp : dp + 8; }

/* The dynamic shared memory of plan f, bytes, as kcu_fa_smem_of (kcu_flash.cuh): q's 16 mw rows of
 * each of the 8 warps, ns K tiles and ns V tiles of bn rows, 16-bit elements. */
static int64_t flash_smem(const kcu_flash_plan *f, int64_t dkp, int64_t dvp)
{
    int64_t ks = flash_row_stride(dkp), vs = flash_row_stride(dvp);
    return 2 * ((int64_t)ATT_WARPS * 16 * f->mw * ks + (int64_t)f->ns * f->bn * (ks + vs));
}

int64_t kcu_arch_smem_optin(const char *arch)
{
    if (strncmp(arch, "sm_", 3) != 0) return 48 * 1024;
    int cc = atoi(arch + 3);
    if (cc == 80 || cc == 87) return 163 * 1024;
    if (cc == 86 || cc == 89) return 99 * 1024;
    if (cc == 90) return 227 * 1024;
    return 48 * 1024;
}

int64_t kcu_flash_smem(const kcu_flash_plan *f, int64_t dk, int64_t dv)
{
    return flash_smem(f, (dk + 15) / 16 * 16, (dv + 15) / 16 * 16);
}

/* kcu_plan_flash with at most mw_max m16 tiles a warp */
static kcu_flash_plan plan_flash(int64_t group, int64_t dk, int64_t dv, int softcap, int64_t smem_optin, int mw_max)
{
    kcu_flash_plan f;
    f.ns = 2;
    f.hb = pow2_divisor(group, ATT_WARPS);
    f.tw = ATT_WARPS / f.hb;
    int64_t dkp = (dk + 15) / 16 * 16, dvp = (dv + 15) / 16 * 16;
    f.mw = mw_max;
    f.bn = 64;
    for (;;) {
        int over = flash_regs(&f, dvp, softcap) > FLASH_ACC_REGS || flash_smem(&f, dkp, dvp) > FLASH_SMEM;
        if (over && f.bn > 16)
            f.bn /= 2;
        else if (over && f.mw == 2)
            f.mw = 1, f.bn = 64;
        else
            break;
    }
    /* dk, dv <= 256 (use_flash_prefill): mw 1 with bn 16 fits */
    KS_ASSERT(flash_smem(&f, dkp, dvp) <= FLASH_SMEM && flash_regs(&f, dvp, softcap) <= FLASH_ACC_REGS);
    /* a deeper ring where every target lets a block have it (the kernel's static shared memory,
     * about 1 KiB, comes out of the same opt-in) */
    while (f.ns < 4) {
        f.ns++;
        if (flash_smem(&f, dkp, dvp) + FLASH_STATIC_SMEM > smem_optin) {
            f.ns--;
            break;
        }
    }
    f.smem = (int)flash_smem(&f, dkp, dvp);
    return f;
}

kcu_flash_plan kcu_plan_flash(int64_t group, int64_t dk, int64_t dv, int softcap, int64_t smem_optin)
{
    return plan_flash(group, dk, dv, softcap, smem_optin, 2);
}

kcu_flash_plan kcu_plan_flash_short(const kcu_flash_plan *f, int64_t group, int64_t dk, int64_t dv, int softcap,
                                    int64_t smem_optin)
{
    return f->mw == 1 ? *f : plan_flash(group, dk, dv, softcap, smem_optin, 1);
}

/*
 * The sm_90a prefill (kcu_flash90, kcu_flash90.cuh): both products of the flash kernel on wgmma, the
 * sm_90a body of the same `_large` kernel (its other cubins keep kcu_flash_attention), on the short
 * plan's grid: [H / hb, ceil(T / (128 / hb))], 256 threads, a block 128 (token, head) rows, two
 * warpgroups of 64 (one wgmma M each). Why: kcu_flash_attention's mma.sync reaches 196 TFLOP/s at
 * 2048 tokens (Llama-3-8B, H200; torch SDPA, FlashAttention-2, 170), each warp's chain of QK mma,
 * softmax and PV mma at two warps a scheduler being the bound; wgmma issues a 64 x 128 x 16 product
 * a warpgroup per instruction, asynchronously, and the two warpgroups, coupled only by the stages'
 * mbarriers, run one's softmax under the other's products. q, K and V sit in 128-byte-swizzled
 * panels of 64 elements (wgmma's canonical layouts: q and K K-major, V read N-major through
 * imm-trans-b), so the cache's 16-bit rows are copied as they lie (cp.async, 16 bytes a thread at a
 * time). Needs q and the cache in the same 16-bit type (fast precision), dk a multiple of 64 up to
 * 256 and dv 64 or 128 (the accumulators: bn / 2 + dv / 2 + bn / 4 registers a thread).
 * Budget: q 128 dk 2 bytes, 2 stages of bn (dk + dv) 2, 1024 for alignment: Llama-3-8B 32 KiB +
 * 2 x 64 KiB (bn 128) = 161 KiB, within sm_90's opt-in (227 KiB) less the static arrays (5 ints a
 * token, the barriers) and within every other target's less kcu_flash_attention's FLASH_STATIC_SMEM.
 * Prediction (before measuring): a tile is 2 x 64 x 128 x 128 x 2 FLOP a warpgroup in 16 wgmma
 * (about 1100 cycles of the SM's tensor cores for both), the softmax 64 exponentials a thread (the
 * SM's 16 a cycle: about 1000 cycles a tile for both warpgroups), under the other's products:
 * 350-450 TFLOP/s at 2048 against 196, attention 174 -> ~90 µs a layer, TTFT at 2048 -2.7 ms.
 * Measured (H200, cuda_att_check --gpu, Llama-3-8B's heads, bf16; kcu_flash_attention beside it in
 * the same run: 0.173 ms at 2048, 2.146 at 8192): first 0.227 ms at 2048 (152 TFLOP/s): a thread
 * read the block table before each 16-byte copy (a dependent load, and a branch between K and V
 * within a warp); with the rows' slots read first, all at once, and a warp copying K or V alone,
 * 0.159 ms; with a tile's fence and arrive before the next tile's copies are issued (the arrive's
 * release is a MEMBAR in the SASS, which may wait for the copies in flight) 0.154 ms at 2048 (223
 * TFLOP/s, 1.12x faster than kcu_flash_attention), 1.659 ms at 8192 (331 TFLOP/s, 1.29x). Slower:
 * 3 stages of 128 positions (where only sm_90 is targeted: 225 KiB) 0.157 / 1.741; 4 of 64 0.157 /
 * 1.769; the warpgroups taking turns to issue their q K^T (FlashAttention-3's ping-pong, named
 * barriers) 0.167 / 1.882. At 512 tokens (64 blocks of 1-4 tiles) it runs about as fast as
 * kcu_flash_attention (0.05-0.08 ms, noisy). Short of the prediction by 2x: a warpgroup waits
 * for its own q K^T before its softmax and for P V before the next tile, and every thread copies as
 * well as computes (no producer warp, no TMA). FlashAttention-3's intra-warpgroup pipelining (a
 * tile's P V issued with the next tile's q K^T, under its softmax; 3 stages, refilled an iteration
 * after their tile; each path waiting for what it issued, else ptxas serializes every wgmma: C7520)
 * was slower (2026-12-02, same check: 0.169 ms at 2048, 1.915 at 8192; 255 registers with spills)
 * and is not kept: with two warpgroups a block the other's products already fill the gaps.
 */
enum { F90_STATIC_MARGIN = 256 };

int64_t kcu_flash90_smem(int64_t dk, int64_t dv, int bn, int ns)
{
    return 128 * dk * 2 + (int64_t)ns * bn * (dk + dv) * 2 + 1024;
}

kcu_flash90_plan kcu_plan_flash90(int64_t group, int64_t dk, int64_t dv, int64_t smem_optin)
{
    kcu_flash90_plan p = {pow2_divisor(group, ATT_WARPS), dk + dv <= 256 ? 128 : 64, 2, 0};
    if (dk % 64 != 0 || dk > 256 || (dv != 64 && dv != 128)) return p;
    /* kcu_flash90's static arrays: 5 ints a token, two mbarriers a stage, and a margin */
    int64_t room = kcu_arch_smem_optin("sm_90") - (20 * (128 / p.hb) + 16 * 4 + F90_STATIC_MARGIN);
    if (smem_optin - FLASH_STATIC_SMEM < room) room = smem_optin - FLASH_STATIC_SMEM;
    if (kcu_flash90_smem(dk, dv, p.bn, p.ns) > room) return p;
    p.smem = (int)kcu_flash90_smem(dk, dv, p.bn, p.ns);
    return p;
}

/*
 * The decode attention on tensor cores (kcu_flash_decode, kcu_flash_decode.cuh): flash-decoding
 * (Dao et al., "Flash-Decoding for long-context inference", 2023) over kiln's paged cache, the
 * decode body of the attention kernel in fast precision, on a grid [T, KH, ATT_SPLIT] of 8 warps.
 *
 * Why: kcu_attention_kernel decodes a q head a block on CUDA cores, so a GQA group's heads each
 * read their kv head's K and V rows (Llama-3-8B: 4 times the cache's bytes into the SMs; L2 serves
 * some), and it takes P = 8 positions a warp step with a shuffle tree and a shared-memory exchange
 * a step: measured on the H200, 40 us a layer at 2048 positions for one sequence (the rows: 8 MiB,
 * 2 us at the copy rate) and 69.2 ms a step for 128 sequences at 4096 positions (weights and cache
 * 85 GB: 20 ms at the copy rate). Here a block holds the whole group as the rows of one m16 tile
 * (GROUP <= 16; rows past it are zeros: Llama-3-8B uses 4 of 16, the tensor cores having ~10x the
 * rate the bytes need) and reads every K and V row once. Each warp copies chunks of 16 positions
 * (K and V: 8 KiB at head_dim 128) into its own ring of ns chunks with cp.async (16 bytes a lane,
 * the chunk's slots found once a row and shared by a shuffle; ns - 1 chunks in flight while it
 * multiplies one: 8 warps x 8-16 KiB in flight an SM), then 16 mma for q k^T, the online softmax
 * of kcu_flash_attention on two 8-position tiles, and 16 mma for p v (head_dim 128). A warp's own
 * ring needs no block barrier in the loop; the warps' states meet once at the end (shared memory,
 * warp order, double), and the cluster's blocks' (split: sm_90, a decode step, more than
 * KCU_FD_ROUNDS rounds of 8 warps: as many blocks as take the chunks in that many rounds, at most
 * ATT_SPLIT) in block order, as kcu_attention's. Why as many and not all: a block of 8 warps and a
 * 192 KiB ring is alone on its SM, and its fixed costs (q, the block table, the ring's first
 * copies, the combination) are ~10 us; split over all 8 blocks, 32 sequences of 512 positions made
 * 2048 blocks of a chunk a warp, 16 waves (166 us a layer on the H100, against 20 us of K and V at
 * the copy rate, #11 step 6).
 *
 * Numerics: q, k, v and p in MT (bf16 or f16), f32 products and statistics; deterministic, and a
 * token's result is a function of its own length and of whether its step is a decode step (T <=
 * the decode range: then split by length, else never), not of the other tokens of the step: batch
 * invariant within the decode range, as the matmuls' decode kernels.
 *
 * Budget: 2 ns 8 16 (dkp + dvp) bytes of dynamic shared memory (Llama-3-8B: 128 KiB at ns 2, 192
 * at 3), plus the split's static arrays; no plan (kcu_attention_kernel decodes) where two chunks a
 * warp do not fit the targets' opt-in (sm_86/89's 99 KiB at head_dim 128) or the group is wider
 * than 16.
 */
enum { FD_BN = 16, FD_STATIC_MARGIN = 1024, FD_SLOTS = 4 };

static int64_t flash_decode_smem(int64_t dk, int64_t dv, int ns)
{
    int64_t dkp = (dk + 15) / 16 * 16, dvp = (dv + 15) / 16 * 16;
    return 2 * (int64_t)ATT_WARPS * ns * FD_BN * (flash_row_stride(dkp) + flash_row_stride(dvp));
}

kcu_flash_decode_plan kcu_plan_flash_decode(int64_t group, int64_t dk, int64_t dv, int64_t smem_optin)
{
    kcu_flash_decode_plan p = {0, 0, 0};
    if (group < 1 || group > 16 || dk % 16 != 0 || dv % 16 != 0 || dk > 256 || dv > 256) return p;
    /* the split's static arrays: a maximum, a sum and dv outputs (double) a row, a weight a block */
    /* the virtual blocks' states a block keeps (kcu_flash_decode's SLOTS): up to 4, within 32 kB */
    p.slots = (int)(32768 / (group * dv * 8));
    if (p.slots > FD_SLOTS) p.slots = FD_SLOTS;
    if (p.slots < 1) return p;
    int64_t stat = group * (4 + 8 + 8 * dv) * p.slots + group * 8 * ATT_SPLIT + FD_STATIC_MARGIN;
    for (int ns = 2; ns <= 3 && flash_decode_smem(dk, dv, ns) + stat <= smem_optin; ns++)
        p.ns = ns, p.smem = (int)flash_decode_smem(dk, dv, ns);
    /* the warps' states at the end reuse the ring: a maximum, a sum and dv outputs a row (floats), a
       weight a row (double), and the rows' maxima */
    if ((int64_t)ATT_WARPS * group * (dv + 2) * 4 + (int64_t)ATT_WARPS * group * 8 + group * 4 > p.smem)
        p.ns = 0, p.smem = 0;
    return p;
}

/* The one place that decides whether attention node v gets the tensor-core prefill kernel for
 * steps of many tokens: in fast precision (bf16/f16 products, f32 softmax statistics; `fast`:
 * the attention's KV cache is half, or kcu_options.flash_prefill forces it), with head dims the kernel keeps
 * in registers (the output accumulators: at most 256). Exact precision keeps
 * kcu_attention_kernel (f32) for every step. */
static int use_flash_prefill(const kcu_gen *x, kir_val v, int fast)
{
    const kir_node *n = &x->g->nodes[v];
    const kir_node *qn = &x->g->nodes[n->in[0]], *kn = &x->g->nodes[n->in[1]], *vn = &x->g->nodes[n->in[2]];
    int64_t dk = qn->dims[2], dv = vn->dims[2];
    /* both kernels of the node run on one block size: the decode kernel's must be ATT_WARPS warps */
    return fast && dk <= 256 && dv <= 256 && plan_attention(qn->dims[1] / kn->dims[1], dk, dv).nw == ATT_WARPS;
}

/* The 16-bit type the tensor cores multiply in: q's when it is bf16 or f16, else the cache's,
 * else bf16 (f32 activations: bf16 keeps their range). */
static const char *flash_mma_type(const kcu_gen *x, kir_val v, kir_val q)
{
    kir_dtype t = x->g->nodes[q].dtype, c = kir_kv_dtype(x->g, v);
    if (t == KIR_BF16 || t == KIR_F16) return kcu_elem_type(t);
    return c == KIR_BF16 || c == KIR_F16 ? kcu_elem_type(c) : "kcu_bf16";
}

/*
 * Attention over the paged cache (kcu_attention, kcu_prelude.cuh): positions [lo, pos] of each
 * token's sequence (lo from WINDOW), read through its block table (tables + table_off[t]); one
 * pass over K and V with an online softmax; deterministic.
 *
 * Blocks: grid [T, H], NW = 8 warps (256 threads), two ways chosen by T at run time
 * (kcu_attention_kernel):
 *  - one q head a block (HB = 1): decode of few tokens; Llama-3-8B's token is 32 blocks;
 *  - HBW q heads of one kv head a block (HBW the largest power of two dividing the GQA group,
 *    at most 4), reading their K and V rows once for all of them, when that still makes
 *    KCU_ATT_WIDE (128) blocks: prefill and batched decode (Llama-3-8B: from 16 tokens);
 *    the other blocks return at once.
 *
 * A block's warps take steps of P positions round robin (warp w: steps w, w + NW, ...; the same
 * number of rounds in every warp, as the CPU emulator's shuffles need). In a step the warp first
 * issues every load: each of the P K rows and V rows is read by the whole warp at once, lanes
 * splitting head_dim (a 16-byte load a lane when head_dim is a multiple of 4 and at least 128,
 * else one float: coalesced either way; with head_dim < 32 some lanes idle); the block table
 * entry of the next step is read a step ahead. Each lane forms its part of the P * HB dot
 * products and the warp sums them in a fixed tree: a halving exchange (P * HB - 1 shuffles, lane
 * bit 16, 8, ... choosing the half a lane keeps) until each score is on 32 / (P * HB) lanes, then
 * a butterfly among those; every score is summed over lanes in the same pairs (bit 16 first), so
 * the scores do not depend on HB or P. Online softmax per head: the step's maximum (log2 P
 * shuffles), the running maximum m, alpha = expf(m_old - m), p = expf(s - m), the lane's running
 * sum of p in double; the step's P * HB probabilities and HB alphas go through shared memory (one
 * warp barrier a step, two buffers alternating), and each lane updates its dims of the HB
 * accumulators, acc = acc * alpha + sum_j p_j v_j, positions in order (fmaf). At the end the
 * warps' (m, sum, acc) are combined in warp order in double: out = sum_w acc_w f_w / sum_w l_w
 * f_w, f_w = e^(m_w - M). Every sum has one order, fixed by the shapes, the token's position, T
 * (which way) and the warp and lane numbers: no atomics, the same bits on every run.
 *
 * Cost per (token, kv head), len = pos - lo + 1 positions: K and V rows len * (DK + DV) * 4
 * bytes, read once from memory (L2 serves the other heads of the group in the one-head way), plus
 * the block table, q and out rows. Into the SMs per (token, q head): len * (DK + DV) * 4 / HB;
 * the three-pass kernel it replaces read the K rows three times there (a whole row a thread:
 * uncoalesced) and V once. Llama-3-8B at 160 positions: 160 KiB per (token, kv head); per
 * (token, q head) 160 KiB (one head a block) or 40 KiB (4 heads), against 320 KiB before.
 * Measured on an H200 (launches replayed in a CUDA graph, 64 a graph, contexts 128-160, f32
 * cache, block size 16, random block tables over 1.5 GiB: cold L2): 1 token 7.7 us (was 126);
 * 8 tokens 9.4 us (149); 32 tokens 19.5 us (314); 128 tokens 71 us (1134); 512 tokens 272 us
 * (4016), 2.2 TB/s. Few tokens are latency-bound: dependent loads (the position, the block
 * table, then the rows) once a round, three rounds at 150 positions.
 */
int kcu_emit_attention(kcu_gen *x, kir_val v)
{
    const kir_graph *g = x->g;
    const kir_node *n = &g->nodes[v];
    const kir_node *qn = &g->nodes[n->in[0]], *kn = &g->nodes[n->in[1]], *vn = &g->nodes[n->in[2]];
    int64_t heads = qn->dims[1], dk = qn->dims[2], kv_heads = kn->dims[1], dv = vn->dims[2];
    int64_t layer = kir_attr_int(g, v, KIR_A_ATTENTION_LAYER), window = kir_attr_int(g, v, KIR_A_ATTENTION_WINDOW);
    float scale = (float)kir_attr_float(g, v, KIR_A_ATTENTION_SCALE);
    float softcap = (float)kir_attr_float(g, v, KIR_A_ATTENTION_SOFTCAP);
    if (layer < 0 || layer >= INT32_MAX) return kcu_node_error(x, v, "layer %lld is out of range", (long long)layer);
    if (softcap < 0.0f) return kcu_node_error(x, v, "softcap must not be negative");
    if (window < 0 || window > INT32_MAX) window = 0; /* as the interpreter: every position is in such a window */
    if (kir_attr_int(g, v, KIR_A_ATTENTION_WRITE_KV) != 0) kcu_emit_kv_write_kernel(x, v, "_kv_write", n->in[1], n->in[2], layer);

    att_plan a = plan_attention(heads / kv_heads, dk, dv);
    /* fast precision (a half KV cache, or a cache of codes with half q) takes the tensor cores (codes times
     * their row's scale rounded to the mma's type as they are staged); kcu_options.flash_prefill forces
     * them; exact precision over codes keeps kcu_attention_kernel (codes times scale, in f32) */
    const int codes = kv_codes(x, v);
    const int half_q = qn->dtype == KIR_BF16 || qn->dtype == KIR_F16;
    /* V in the K rows (v_in_k: latent attention, whose heads of 576 dims the tensor-core kernels do not take
     * anyway) is read by kcu_attention_kernel alone */
    const int vik = v_in_k(x, v);
    int flash = !vik && use_flash_prefill(x, v, codes ? half_q || x->opt.flash_prefill
                                                      : kir_kv_dtype(g, v) != KIR_F32 || x->opt.flash_prefill);
    int g90 = 0;              /* the sm_90a cubin's prefill is kcu_flash90 */
    kcu_flash90_plan f9 = {0}; /* its plan */
    krt_cuda_kernel *k = kcu_kernel_new(x, v, flash ? 32 * ATT_WARPS : 32 * a.nw);
    const int alibi = kir_attr_int(g, v, KIR_A_ATTENTION_ALIBI) != 0;
    /* the kernels' calls end with the heads' ALiBi slopes where the node has them */
    /* and with the heads' sinks (a weight: a logit a head in every row's softmax) where it has them */
    const int has_sinks = n->nin > 3 && n->in[3] != KIR_NONE;
    /* and, over a cache of codes, with its scales */
    char call_end[96];
    snprintf(call_end, sizeof call_end, "%s%s%s);\n",
             alibi ? ", " NAME_MARK "_alibi" : has_sinks || codes ? ", nullptr" : "",
             has_sinks ? ", sinks" : codes ? ", (const float *)nullptr" : "", codes ? (vik ? ", ks, ks" : ", ks, vs") : "");
    if (alibi) { /* the heads' slopes, as the interpreter computes them */
        float *slopes = ks_xmalloc(sizeof(float) * (size_t)heads);
        for (int64_t h = 0; h < heads; h++) slopes[h] = kir_alibi_slope(heads, h);
        kcu_put_float_table(&x->body, "ALiBi's slope of each head", "alibi", slopes, heads);
        free(slopes);
    }
    /* fast precision's decode (a half cache) on tensor cores, a kv head's group a block, where it has a plan */
    kcu_flash_decode_plan fd = {0, 0, 0};
    if (flash && kir_kv_dtype(g, v) != KIR_F32 && !x->opt.no_flash_decode) fd = kcu_plan_flash_decode(heads / kv_heads, dk, dv, x->opt.smem_optin);
    kcu_kernel_grid(k, 0, 1, 0, 1);
    kcu_kernel_grid(k, 1, 0, fd.smem > 0 ? kv_heads : heads, 1);
    kcu_kernel_grid(k, 2, 0, ATT_SPLIT, 1);
    kcu_param_in(x, k, n->in[0], "q");
    add_cache_params(x, k, v, layer, 0);
    kcu_param_out(x, k, v);
    kcu_add_param(x, k, KRT_CUDA_ARG_POSITIONS, 0, "const int *__restrict__ positions");
    kcu_add_param(x, k, KRT_CUDA_ARG_TABLE_OFF, 0, "const int *__restrict__ table_off");
    kcu_add_param(x, k, KRT_CUDA_ARG_TABLES, 0, "const int *__restrict__ tables");
    kcu_add_param(x, k, KRT_CUDA_ARG_BLOCK_SIZE, 0, "int block_size");
    if (has_sinks) kcu_param_in(x, k, n->in[3], "sinks");
    char cluster[32];
    snprintf(cluster, sizeof cluster, "KCU_CLUSTER_Z(%d)", ATT_SPLIT);
    kcu_open_body_attr(x, k,
                       "causal attention over a layer of the paged KV cache (kc, vc), online softmax; on sm_90 a "
                       "head's positions split over the blocks of a cluster",
                       0, cluster);
    if (fd.smem > 0) {
        ks_buf_printf(&x->body,
                      "    kcu_flash_decode<%s, %s, %s, %s, %lld, %lld, %lld, %lld, %d, %d, %d, %d, %d, %lld, %lld",
                      flash_mma_type(x, v, n->in[0]), kcu_elem_type(qn->dtype), kv_elem_type(x, v),
                      kcu_elem_type(n->dtype), (long long)heads, (long long)kv_heads, (long long)dk, (long long)dv,
                      ATT_WARPS, FD_BN, fd.ns, fd.slots, ATT_SPLIT, (long long)window, (long long)kcu_decode_t(x));
        if (x->opt.fd_rounds > 0 || x->opt.fd_vrounds > 0) {
            if (x->opt.fd_rounds > 0)
                ks_buf_printf(&x->body, ", %d", x->opt.fd_rounds);
            else
                ks_buf_puts(&x->body, ", KCU_FD_ROUNDS");
            if (x->opt.fd_vrounds > 0) ks_buf_printf(&x->body, ", %d", x->opt.fd_vrounds);
        }
        ks_buf_puts(&x->body, ">(T, q, kc, vc, out,\n        positions, table_off, tables, block_size, ");
        k->smem = fd.smem;
    } else {
        ks_buf_printf(&x->body,
                      "    kcu_attention_kernel<%lld, %lld, %lld, %lld, %d, %d, %d, %d, %d, %lld, %lld%s>(T, q, kc, %s, out, "
                      "positions,\n        table_off, tables, block_size, ",
                      (long long)heads, (long long)kv_heads, (long long)dk, (long long)dv, a.hbw, a.pw, a.p1, a.nw,
                      ATT_SPLIT, (long long)window, (long long)kcu_decode_t(x), vik ? ", 1" : "", vik ? "kc" : "vc");
    }
    kcu_put_float(&x->body, scale);
    ks_buf_puts(&x->body, ", ");
    kcu_put_float(&x->body, softcap);
    ks_buf_puts(&x->body, call_end);
    ks_buf_puts(&x->body, "}\n");
    if (flash) {
        /* steps of more than ATT_FLASH_T tokens: tiles of 16 mw tw tokens x hb heads, on their own grid */
        const int64_t group = heads / kv_heads;
        kcu_flash_plan f = kcu_plan_flash(group, dk, dv, softcap > 0.0f, x->opt.smem_optin);
        kcu_flash_plan fs = kcu_plan_flash_short(&f, group, dk, dv, softcap > 0.0f, x->opt.smem_optin);
        KS_ASSERT(f.hb * f.tw == ATT_WARPS && fs.hb == f.hb && k->block == 32 * ATT_WARPS);
        kcu_open_large(x, k, ATT_FLASH_T);
        /* sm_90a: kcu_flash90 where it has a plan, q and the cache of the tensor cores' type */
        const char *mt = flash_mma_type(x, v, n->in[0]);
        f9 = kcu_plan_flash90(group, dk, dv, x->opt.smem_optin);
        /* (kcu_flash90 adds no ALiBi bias and holds no sinks: such a node keeps kcu_flash_attention on sm_90a
         * too) */
        g90 = x->opt.gemm90 && !x->opt.no_flash90 && !alibi && !has_sinks && f9.smem > 0 && f9.hb == fs.hb && fs.mw == 1 &&
                  strcmp(kcu_elem_type(qn->dtype), mt) == 0 && strcmp(kv_elem_type(x, v), mt) == 0;
        if (g90) {
            ks_buf_printf(&x->body,
                          "#if KCU_GEMM90\n    kcu_flash90<%s, %s, %lld, %lld, %lld, %lld, %d, %d, %d, %lld>(T, q, kc, vc, "
                          "out, positions,\n        table_off, tables, block_size, ",
                          mt, kcu_elem_type(n->dtype), (long long)heads, (long long)kv_heads, (long long)dk,
                          (long long)dv, f9.hb, f9.bn, f9.ns, (long long)window);
            kcu_put_float(&x->body, scale);
            ks_buf_puts(&x->body, ", ");
            kcu_put_float(&x->body, softcap);
            ks_buf_puts(&x->body, ");\n#else\n");
        }
        /* steps whose blocks under f would leave SMs idle take fs (twice the blocks); the grid is fs's,
         * whose extra blocks f's steps return from at once */
        const int two = fs.mw != f.mw;
        if (two)
            ks_buf_printf(&x->body, "    if (kcu_fa_few_blocks(T, %d, %lld))\n", 16 * f.mw * f.tw, (long long)(heads / f.hb));
        for (int i = two ? 0 : 1; i < 2; i++) {
            const kcu_flash_plan *p = i == 0 ? &fs : &f;
            if (two && i == 1) ks_buf_puts(&x->body, "    else\n");
            ks_buf_printf(&x->body,
                          "    %skcu_flash_attention<%s, %s, %s, %s, %lld, %lld, %lld, %lld, %d, %d, %d, %d, %d, %lld>(T, q, "
                          "kc, vc, out,\n        positions, table_off, tables, block_size, ",
                          two ? "    " : "", flash_mma_type(x, v, n->in[0]), kcu_elem_type(qn->dtype), kv_elem_type(x, v),
                          kcu_elem_type(n->dtype), (long long)heads, (long long)kv_heads, (long long)dk, (long long)dv, p->hb,
                          p->tw, p->mw, p->bn, p->ns, (long long)window);
            kcu_put_float(&x->body, scale);
            ks_buf_puts(&x->body, ", ");
            kcu_put_float(&x->body, softcap);
            ks_buf_puts(&x->body, call_end);
        }
        if (g90) ks_buf_puts(&x->body, "#endif\n");
        ks_buf_puts(&x->body, "}\n");
        kcu_kernel_grid_large(k, 0, 0, heads / fs.hb, 1);
        kcu_kernel_grid_large(k, 1, 1, 0, 16 * fs.mw * fs.tw);
        /* by the step's longest sequence: a batch of decode tokens stays on the decode kernel (each
         * token a block; the flash kernel would make a segment of each, its rows mostly masked:
         * measured 104.5 ms a step for 128 sequences at 4096 positions against a 19.9 ms floor), and
         * a sequence's attention does not depend on what shares its step */
        k->large_per_seq = 1;
        k->smem_large = f.smem > fs.smem ? f.smem : fs.smem;
        if (g90 && f9.smem > k->smem_large) k->smem_large = f9.smem;
    }
    size_t bodies = x->n_bodies;
    kcu_kernel_end(x, k, "");
    if (g90 && x->opt.choices && x->n_bodies > bodies) /* a new kernel: its sm_90a prefill, one line */
        ks_buf_printf(x->opt.choices,
                      "%s: %%%u attention: sm_90a above %d tokens: wgmma flash, %d tokens x %d heads a block, "
                      "%d-position tiles, %d stages, %d bytes of shared memory\n",
                      k->name, k->node, ATT_FLASH_T, 128 / f9.hb, f9.hb, f9.bn, f9.ns, f9.smem);
    return 0;
}
