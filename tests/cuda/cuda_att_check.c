/*
 * cuda_att_check.c — the prefill attention on tensor cores (kcu_flash_attention,
 * codegen/cuda/kcu_flash.cuh) on kernels written for it, against a double-precision
 * reference, over a paged KV cache with shuffled block tables: ragged steps (several
 * sequences, their tokens interleaved), prompts after a cached prefix (positions not
 * starting at 0), lengths that are not multiples of the tiles, GQA groups of 1, 2, 4 and 8,
 * a sliding window, a softcap, DK != DV, head dims that are not multiples of 16 (nor of 8),
 * bf16 and f16 tensor-core inputs, q/out and cache in f32 or 16 bits, K/V tiles of 16, 32 and
 * 64 positions, one or two m16 tiles a warp, head dims of swizzled (64, 128, 256) and padded rows
 * in shared memory; and the sm_90a kernel, kcu_flash90 (codegen/cuda/kcu_flash90.cuh: wgmma),
 * on cases of its own (q and cache in the tensor cores' type, dims multiples of 64, GQA 1 to 8,
 * windows, a softcap, block size 5, interleaved sequences, 2 and 3 stages, 64- and 128-position
 * tiles). Unwritten cache rows are NaN: a kernel that reads one shows it.
 *
 * The error of a (token, head) row is max_d |out - exact| / max |v| over the positions it
 * attends to (the output's scale), the exact result computed in double from the operands as
 * the tensor cores take them (q, k, v rounded to bf16/f16). Passes within 4e-3 (bf16: p is
 * rounded to 8 bits for the p v product) or 1e-3 (f16: 11 bits), plus the rounding of a 16-bit
 * out; and two runs bitwise equal (no atomics). The error against the unrounded operands is
 * printed too.
 *
 *   cuda_att_check          through the CPU emulator (the kernels compiled by $KILN_GXX with
 *       $KILN_EMU_SHIM, run behind $KILN_EMU_LIB: mma, ldmatrix and cp.async emulated lane by
 *       lane in the PTX layouts; not kcu_flash90: wgmma has no stand-in, and the output says
 *       so); and, with NVRTC, the --gpu program compiled for sm_90a (kcu_flash90's target; for it
 *       alone: the other kernels' code takes the same branches for sm_80, __CUDA_ARCH__ >= 800
 *       holding for both, so a second compile would only repeat NVRTC's work; CI time). Exits 77
 *       when it can do neither.
 *   cuda_att_check --gpu [CUBIN]    on a real GPU: the same checks, then Llama-3-8B's
 *       attention (32 q heads, 8 kv heads, head_dim 128, bf16, one causal sequence of 512, 2048
 *       and 8192 tokens, block size 16) timed, in ms and TFLOP/s (4 T^2/2 H D FLOPs), with
 *       sampled rows checked: kcu_flash90 as planned, with 3 stages and with 4 of 64 positions;
 *       kcu_flash_attention as kiln plans it (two m16 tiles a warp) and with one m16 tile a warp
 *       (32-position tiles); with an f32 cache at 2048; and today's kernel (kcu_attention_kernel,
 *       f32) at 512 and 2048.
 *   cuda_att_check --compile ARCH CUBIN    writes the --gpu kernels' cubin (NVRTC here).
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "codegen/cuda/kcu.h"
#include "runtime/cuda/cuda_api.h"
#include "tests/check.h"

/* ---- the cases ------------------------------------------------------------------------ */
typedef enum { E_F32, E_BF16, E_F16 } etype;
static const char *const e_name[] = {"float", "kcu_bf16", "kcu_f16"};
static const char *const e_short[] = {"f32", "bf16", "f16"};
static const size_t e_size[] = {4, 2, 2};

enum { MAX_SEQS = 128 };

typedef struct att_case {
    etype mt;             /* the tensor cores' inputs: E_BF16 or E_F16 */
    etype qt, kvt;        /* q and out; the cache */
    int H, KH, DK, DV;    /* heads, kv heads, dims */
    int window;           /* 0: none */
    float softcap;        /* 0: none */
    int block_size;       /* cache positions a block */
    int n_seqs;           /* sequences in the step */
    int len[MAX_SEQS];    /* tokens of each in the step */
    int start[MAX_SEQS];  /* the position of its first (a cached prefix before) */
    int interleave;       /* 1: the sequences' tokens round robin; 0: one after another */
    int bn;               /* positions a K/V tile; 0: as kcu_emit_attention plans */
    int old;              /* 1: today's kernel (kcu_attention_kernel, f32): timed on the GPU only */
    int mw;               /* m16 tiles a warp; 0: as kcu_emit_attention plans (2 up to head_dim 128) */
    int g90;              /* 1: kcu_flash90 (sm_90a, wgmma; kcu_flash90.cuh) as kcu_plan_flash90 plans it, bn its
                           * tile when set (GPU only: the CPU emulator runs no wgmma) */
    int ns;               /* kcu_flash90's stages; 0: as planned */
    int occ;              /* kcu_flash90's blocks an SM at least (__launch_bounds__'s second argument); 0: 1 */
    int dec;              /* 1: the decode kernel, kcu_flash_decode (kcu_flash_decode.cuh) as kcu_plan_flash_decode
                           * plans it: a block a (token, kv head), on sm_90 long contexts split over a cluster of
                           * DEC_SPLIT blocks in steps of at most DEC_WIDE_T tokens */
    int fdr;              /* kcu_flash_decode's rounds a block before the split (its R); 0: KCU_FD_ROUNDS */
    int sinks;            /* 1: a sink logit a head (sink_of), as gpt-oss's attention holds */
    int fdv;              /* kcu_flash_decode's rounds a virtual block (its RV); 0: as R */
} att_case;

/* Head h's sink in the cases with sinks: 3 to 6, above most scores (of order 1), so that it takes a
 * share the checks see even among 5000 positions (e^6 against their ~5000 e^0.5: 5 %). */
static float sink_of(int h) { return (float)(0.75 * (h % 5) + 3.0); }

enum { DEC_SPLIT = 8, DEC_WIDE_T = 32, FD_ROUNDS_DEFAULT = 4 /* kcu_prelude.cuh's KCU_FD_ROUNDS */ };
static int fd_r(const struct att_case *c) { return c->fdr > 0 ? c->fdr : FD_ROUNDS_DEFAULT; }

static const att_case check_cases[] = {
    /* one prompt, GQA 4, bf16 everywhere (two m16 tiles a warp, as planned below head_dim 256) */
    {E_BF16, E_BF16, E_BF16, 8, 2, 64, 64, 0, 0, 16, 1, {100}, {0}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    /* MHA (group 1: 8 token warps), f16, two prompts, the second after a cached prefix of 23 */
    {E_F16, E_F16, E_F16, 4, 4, 32, 32, 0, 0, 16, 2, {37, 50}, {0, 23}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    /* f32 q/out and cache (converted in staging), group 8, DK = 40 (padded to 48), tiles of 32, one
     * m16 tile a warp */
    {E_BF16, E_F32, E_F32, 16, 2, 40, 40, 0, 0, 16, 1, {77}, {5}, 0, 32, 0, 1, 0, 0, 0, 0, 0, 0, 0},
    /* sliding window and softcap, group 8 of one kv head */
    {E_BF16, E_BF16, E_BF16, 8, 1, 32, 32, 17, 2.0f, 16, 1, {70}, {10}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    /* DK != DV (DV padded), three sequences interleaved, block size 5, one a single token */
    {E_F16, E_F16, E_F16, 4, 2, 48, 24, 0, 0, 5, 3, {1, 20, 33}, {0, 7, 64}, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    /* odd dims (36, 20: rows not whole 16-byte chunks), f32 q/out, bf16 cache, group 4, tiles of 16,
     * one m16 tile a warp */
    {E_BF16, E_F32, E_BF16, 8, 2, 36, 20, 0, 0, 16, 2, {45, 19}, {3, 0}, 1, 16, 0, 1, 0, 0, 0, 0, 0, 0, 0},
    /* Llama-3-8B's heads: group 4, 128 dims (swizzled rows), a window and a prefix, f16; as planned
     * (two m16 tiles a warp, 32-position tiles) */
    {E_F16, E_F16, E_F16, 8, 2, 128, 128, 40, 0, 16, 1, {70}, {30}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    /* group 2, f16 inputs on bf16 tensor cores (converted), softcap */
    {E_BF16, E_F16, E_F16, 4, 2, 64, 64, 0, 30.0f, 8, 2, {33, 31}, {0, 100}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    /* GQA 4 with a prefix and a mixed step; MHA with a window, f32 cache, 64-position tiles */
    {E_BF16, E_BF16, E_BF16, 8, 2, 64, 48, 0, 0, 16, 3, {90, 7, 40}, {0, 3, 17}, 1, 32, 0, 2, 0, 0, 0, 0, 0, 0, 0},
    {E_F16, E_F16, E_F32, 2, 2, 32, 32, 21, 0, 16, 1, {150}, {12}, 0, 64, 0, 2, 0, 0, 0, 0, 0, 0, 0},
    /* Llama-3-8B's shape as planned, bf16: three sequences interleaved (segments in a tile), a
     * prefix, block size 16; and the same on one m16 tile a warp */
    {E_BF16, E_BF16, E_BF16, 8, 2, 128, 128, 0, 0, 16, 3, {70, 9, 50}, {0, 40, 5}, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {E_BF16, E_BF16, E_BF16, 8, 2, 128, 128, 0, 0, 16, 2, {60, 45}, {20, 0}, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0},
    /* head_dim 256 (one m16 tile a warp, 16-position tiles, as planned), softcap, a window */
    {E_BF16, E_BF16, E_BF16, 4, 2, 256, 256, 30, 50.0f, 16, 1, {60}, {10}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    /* head_dim 128 with a softcap (planned: 16-position tiles), f16 cache on bf16 tensor cores */
    {E_BF16, E_BF16, E_F16, 8, 2, 128, 128, 0, 20.0f, 16, 1, {50}, {7}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    /* sinks (gpt-oss): two prompts, a window */
    {E_BF16, E_BF16, E_BF16, 8, 2, 64, 64, 20, 0, 16, 2, {70, 45}, {0, 12}, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0},
};

/* kcu_flash90's cases (q and the cache in the tensor cores' type; dims multiples of 64): the sm_90a
 * program only (--gpu, and NVRTC's compile in CI) */
static const att_case g90_cases[] = {
    /* Llama-3-8B's heads (group 4: 32 tokens x 4 heads a block), one prompt */
    {E_BF16, E_BF16, E_BF16, 8, 2, 128, 128, 0, 0, 16, 1, {300}, {0}, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0},
    /* after a cached prefix, a window, f16 */
    {E_F16, E_F16, E_F16, 8, 2, 128, 128, 40, 0, 16, 1, {170}, {30}, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0},
    /* three sequences interleaved (a segment each in a block), prefixes, block size 5 (no shifts) */
    {E_BF16, E_BF16, E_BF16, 8, 2, 128, 128, 0, 0, 5, 3, {70, 9, 150}, {0, 40, 5}, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0},
    /* MHA (128 tokens a block), dims 64 (one panel), softcap, two prompts one after the other */
    {E_BF16, E_BF16, E_BF16, 4, 4, 64, 64, 0, 30.0f, 16, 2, {200, 77}, {0, 13}, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0},
    /* group 8 (16 tokens x 8 heads a block), f16, DK 256 with DV 128 (64-position tiles as planned) */
    {E_F16, E_F16, E_F16, 16, 2, 256, 128, 0, 0, 16, 1, {150}, {20}, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0},
    /* Llama-3-8B's heads, two prompts; and with 3 stages */
    {E_BF16, E_BF16, E_BF16, 8, 2, 128, 128, 0, 0, 16, 2, {200, 90}, {0, 17}, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0},
    {E_F16, E_F16, E_F16, 8, 2, 128, 128, 0, 0, 16, 1, {333}, {0}, 0, 0, 0, 0, 1, 3, 0, 0, 0, 0, 0},
    /* group 2, 64-position tiles with dims 128, a window shorter than a tile */
    {E_BF16, E_BF16, E_BF16, 4, 2, 128, 128, 21, 0, 16, 2, {130, 60}, {0, 9}, 1, 64, 0, 0, 1, 0, 0, 0, 0, 0, 0},
};

/* kcu_flash_decode's cases (mma.sync: the emulator runs them; the split over a cluster only on sm_90) */
static const att_case dec_cases[] = {
    /* Llama-3-8B's heads (group 4), four decode tokens of ragged contexts, bf16 */
    {E_BF16, E_BF16, E_BF16, 8, 2, 128, 128, 0, 0, 16, 4, {1, 1, 1, 1}, {0, 17, 100, 299}, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0},
    /* f16, a window, a softcap, block size 5; a 12-token prompt beside two decode tokens */
    {E_F16, E_F16, E_F16, 8, 2, 64, 64, 40, 30.0f, 5, 3, {1, 12, 1}, {90, 0, 33}, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0},
    /* group 8, DK != DV, f32 q/out and an f32 cache (converted on the way); MHA with group 1, dims 32 */
    {E_BF16, E_F32, E_F32, 16, 2, 48, 32, 0, 0, 16, 2, {1, 1}, {63, 64}, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0},
    {E_BF16, E_BF16, E_BF16, 4, 4, 32, 32, 0, 0, 16, 2, {1, 1}, {15, 16}, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0},
    /* group 16 (every row of the m16 tile), two tokens of one sequence */
    {E_BF16, E_BF16, E_BF16, 16, 1, 128, 128, 0, 0, 16, 1, {2}, {40}, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0},
    /* long contexts: split over the cluster on sm_90 (a decode step); and a step past the decode
     * range (40 tokens: no split) */
    {E_BF16, E_BF16, E_BF16, 8, 2, 128, 128, 0, 0, 16, 3, {1, 1, 1}, {700, 257, 1500}, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0},
    {E_F16, E_F16, E_F16, 8, 2, 128, 128, 0, 0, 16, 2, {39, 1}, {500, 900}, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0},
    /* splits of 8, 4, 3 and 2 blocks (313, 129, 69 and 33 chunks at 4 rounds of 8 warps) in one step */
    {E_BF16, E_BF16, E_BF16, 8, 2, 128, 128, 0, 0, 16, 4, {1, 1, 1, 1}, {5000, 2040, 1100, 520}, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0},
    /* virtual blocks of 2 rounds (RV 2): 8, 8, 5 and 3 of them, each block of a token alone in the step's
     * few blocks walking its own; where a step has many (and in the emulator, one block a token), a block
     * walks several one after another; with sinks and a window too */
    {E_BF16, E_BF16, E_BF16, 8, 2, 128, 128, 0, 0, 16, 4, {1, 1, 1, 1}, {5000, 2040, 1100, 520}, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 2},
    {E_BF16, E_BF16, E_BF16, 8, 2, 64, 64, 300, 0, 16, 3, {1, 1, 1}, {5000, 1100, 40}, 1, 0, 0, 0, 0, 0, 0, 1, 0, 1, 2},
    /* sinks (gpt-oss): decode tokens split 8, 3 and 1 ways, a window in f16; the CUDA-core kernel's too */
    {E_BF16, E_BF16, E_BF16, 8, 2, 64, 64, 0, 0, 16, 3, {1, 1, 1}, {5000, 1100, 40}, 1, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0},
    {E_F16, E_F16, E_F16, 8, 2, 64, 64, 128, 0, 16, 2, {1, 1}, {3000, 90}, 1, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0},
    {E_BF16, E_BF16, E_BF16, 8, 2, 64, 64, 0, 0, 16, 2, {1, 1}, {3000, 90}, 1, 0, 0, 0, 0, 0, 0, 2, 0, 1, 0},
};

/* ---- data ------------------------------------------------------------------------------ */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double rng_unit(uint64_t *s) { return (double)(rng_next(s) >> 11) * 0x1p-52 - 1.0; }

/* f as stored in type t (into dst at element i), and its value back */
static double store(etype t, void *dst, size_t i, float f)
{
    if (t == E_F32) {
        memcpy((char *)dst + 4 * i, &f, 4);
        return f;
    }
    uint16_t h = t == E_BF16 ? ks_f32_to_bf16(f) : ks_f32_to_f16(f);
    memcpy((char *)dst + 2 * i, &h, 2);
    return t == E_BF16 ? ks_bf16_to_f32(h) : ks_f16_to_f32(h);
}
static double load(etype t, const void *src, size_t i)
{
    if (t == E_F32) {
        float f;
        memcpy(&f, (const char *)src + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, (const char *)src + 2 * i, 2);
    return t == E_BF16 ? ks_bf16_to_f32(h) : ks_f16_to_f32(h);
}
/* v as the tensor cores take it (rounded to mt) */
static double to_mt(etype mt, double v)
{
    return mt == E_BF16 ? ks_bf16_to_f32(ks_f32_to_bf16((float)v)) : ks_f16_to_f32(ks_f32_to_f16((float)v));
}

/* ---- the kernels' plan: kcu_emit_attention.c's, or the case's mw and bn where it sets them ---- */
typedef kcu_flash_plan att_plan;

static att_plan plan(const att_case *c)
{
    att_plan p = kcu_plan_flash(c->H / c->KH, c->DK, c->DV, c->softcap > 0, kcu_arch_smem_optin("sm_90"));
    if (c->mw) p.mw = c->mw;
    if (c->bn) p.bn = c->bn;
    p.smem = (int)kcu_flash_smem(&p, c->DK, c->DV);
    return p;
}

/* kcu_flash90's plan: kcu_plan_flash90's, the case's bn where it sets one */
static kcu_flash90_plan plan90(const att_case *c)
{
    kcu_flash90_plan p = kcu_plan_flash90(c->H / c->KH, c->DK, c->DV, kcu_arch_smem_optin("sm_90"));
    if (c->bn) p.bn = c->bn;
    if (c->ns) p.ns = c->ns;
    if (c->bn || c->ns) p.smem = (int)kcu_flash90_smem(c->DK, c->DV, p.bn, p.ns);
    return p;
}

static double head_scale(const att_case *c) { return 1.0 / sqrt((double)c->DK); }

/* ---- the kernels' source ------------------------------------------------------------------ */
static void kernel_source(const att_case *c, int index, ks_buf *src)
{
    etype qt = c->old ? E_F32 : c->qt, kvt = c->old ? E_F32 : c->kvt;
    if (c->sinks) { /* the heads' sinks, a table of the program (one a kernel: its index in the name) */
        ks_buf_printf(src, "static __device__ const float att_sinks_%d[%d] = {", index, c->H);
        for (int h = 0; h < c->H; h++) ks_buf_printf(src, "%s%.6ff", h ? ", " : "", (double)sink_of(h));
        ks_buf_puts(src, "};\n");
    }
    ks_buf_printf(src,
                  "extern \"C\" __global__ void __launch_bounds__(256, %d) %s att_%d(int T, const %s *__restrict__ q, "
                  "const %s *__restrict__ kc, const %s *__restrict__ vc, %s *__restrict__ out, const int "
                  "*__restrict__ positions, const int *__restrict__ table_off, const int *__restrict__ tables, int "
                  "block_size)\n{\n",
                  c->occ > 1 ? c->occ : 1, c->dec ? "KCU_CLUSTER_Z(8)" : "", index, e_name[qt], e_name[kvt],
                  e_name[kvt], e_name[qt]);
    char scale[32], cap[32];
    snprintf(scale, sizeof scale, "%.9g", (double)(float)head_scale(c));
    snprintf(cap, sizeof cap, "%.9g", (double)c->softcap);
    char sinks_arg[48] = "";
    if (c->sinks) snprintf(sinks_arg, sizeof sinks_arg, ", nullptr, att_sinks_%d", index);
    if (c->old) { /* Llama-3-8B's shape: kcu_emit_attention's plan for it */
        ks_buf_printf(src,
                      "    kcu_attention_kernel<%d, %d, %d, %d, 4, 2, 8, 8, 1, %d, 0>(T, q, kc, vc, out, positions, "
                      "table_off, tables, block_size, (float)%s, (float)%s);\n}\n",
                      c->H, c->KH, c->DK, c->DV, c->window, scale, cap);
        return;
    }
    if (c->dec == 2) { /* the CUDA-core decode kernel of a half cache, as the engine planned it before kcu_flash_decode */
        ks_buf_printf(src,
                      "    kcu_attention_kernel<%d, %d, %d, %d, 4, 2, 8, 8, %d, %d, %d>(T, q, kc, vc, out, positions, "
                      "table_off, tables, block_size, (float)%s, (float)%s%s);\n}\n",
                      c->H, c->KH, c->DK, c->DV, DEC_SPLIT, c->window, DEC_WIDE_T, scale, cap, sinks_arg);
        return;
    }
    if (c->dec) {
        kcu_flash_decode_plan p = kcu_plan_flash_decode(c->H / c->KH, c->DK, c->DV, kcu_arch_smem_optin("sm_90"));
        ks_buf_printf(src,
                      "    kcu_flash_decode<%s, %s, %s, %s, %d, %d, %d, %d, 8, 16, %d, %d, %d, %d, %d, %d, %d>(T, q, kc, "
                      "vc, out, positions, table_off, tables, block_size, (float)%s, (float)%s%s);\n}\n",
                      e_name[c->mt], e_name[c->qt], e_name[c->kvt], e_name[c->qt], c->H, c->KH, c->DK, c->DV, p.ns,
                      p.slots, DEC_SPLIT, c->window, DEC_WIDE_T, fd_r(c), c->fdv > 0 ? c->fdv : fd_r(c), scale, cap,
                      sinks_arg);
        return;
    }
    if (c->g90) {
        kcu_flash90_plan p = plan90(c);
        ks_buf_printf(src,
                      "#if KCU_GEMM90\n    kcu_flash90<%s, %s, %d, %d, %d, %d, %d, %d, %d, %d>(T, q, kc, vc, out, positions, "
                      "table_off, tables, block_size, (float)%s, (float)%s);\n#else\n    __trap();\n#endif\n}\n",
                      e_name[c->mt], e_name[c->qt], c->H, c->KH, c->DK, c->DV, p.hb, p.bn, p.ns, c->window, scale, cap);
        return;
    }
    att_plan p = plan(c);
    ks_buf_printf(src,
                  "    kcu_flash_attention<%s, %s, %s, %s, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d>(T, q, kc, vc, out, "
                  "positions, table_off, tables, block_size, (float)%s, (float)%s%s);\n}\n",
                  e_name[c->mt], e_name[c->qt], e_name[c->kvt], e_name[c->qt], c->H, c->KH, c->DK, c->DV, p.hb,
                  p.tw, p.mw, p.bn, p.ns, c->window, scale, cap, sinks_arg);
}

/* The first of cases[0..i] whose kernel is case i's (the same template arguments: the
 * benchmark's lengths share one): the program holds that one alone, and every case with the same
 * kernel launches it (NVRTC compiles each kernel in full; CI time). */
static int kernel_of(const att_case *cases, int i)
{
    ks_buf a = {0}, b = {0};
    kernel_source(&cases[i], 0, &a);
    int j = 0;
    for (; j < i; j++) {
        ks_buf_clear(&b);
        kernel_source(&cases[j], 0, &b);
        if (b.len == a.len && memcmp(a.data, b.data, a.len) == 0) break;
    }
    ks_buf_free(&a);
    ks_buf_free(&b);
    return j;
}

static void program_source(const att_case *cases, int n, ks_buf *src)
{
    ks_buf_puts(src, kcu_prelude);
    for (int i = 0; i < n; i++)
        if (kernel_of(cases, i) == i) kernel_source(&cases[i], i, src);
}

/* ---- running ------------------------------------------------------------------------------- */
typedef struct runner {
    const att_case *cases; /* the program's cases (program_source), the kernels' indices */
    krt_cuda_api api; /* the driver, or the emulator */
    krt_cu_ctx ctx;   /* its primary context */
    krt_cu_mod mod;   /* the kernels */
} runner;

static int cu_ok(runner *r, krt_cu_result res, const char *what)
{
    if (res == 0) return 1;
    ks_buf b = {0};
    krt_cuda_describe(&r->api, res, &b);
    fprintf(stderr, "%s: %s\n", what, ks_buf_cstr(&b));
    ks_buf_free(&b);
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A case's step: host arrays and device buffers. */
typedef struct att_data {
    int T;                            /* tokens */
    int *pos, *seq, *table_off;       /* [T] each token's position, sequence, table offset */
    int *tables;                      /* the block tables, one after another */
    int n_tables, n_slots;            /* table entries; cache rows */
    void *q, *kc, *vc;                /* host copies, as stored */
    krt_cu_ptr dq, dk, dv, dout, dpos, doff, dtab; /* device buffers */
} att_data;

static etype q_type(const att_case *c) { return c->old ? E_F32 : c->qt; }
static etype kv_type(const att_case *c) { return c->old ? E_F32 : c->kvt; }

static int setup(runner *r, const att_case *c, uint64_t seed, att_data *d)
{
    memset(d, 0, sizeof *d);
    uint64_t s = seed;
    int T = 0, blocks = 0, nb[MAX_SEQS];
    for (int i = 0; i < c->n_seqs; i++) {
        T += c->len[i];
        nb[i] = (c->start[i] + c->len[i] + c->block_size - 1) / c->block_size;
        blocks += nb[i];
    }
    blocks += 3; /* blocks no sequence owns: NaN */
    d->T = T;
    d->n_tables = blocks - 3;
    d->n_slots = blocks * c->block_size;
    d->pos = malloc(sizeof(int) * (size_t)T);
    d->seq = malloc(sizeof(int) * (size_t)T);
    d->table_off = malloc(sizeof(int) * (size_t)T);
    d->tables = malloc(sizeof(int) * (size_t)blocks);
    int *perm = malloc(sizeof(int) * (size_t)blocks);
    etype qt = q_type(c), kvt = kv_type(c);
    size_t nq = (size_t)T * c->H * c->DK, nk = (size_t)d->n_slots * c->KH * c->DK,
           nv = (size_t)d->n_slots * c->KH * c->DV;
    d->q = malloc(nq * e_size[qt]);
    d->kc = malloc(nk * e_size[kvt]);
    d->vc = malloc(nv * e_size[kvt]);
    if (!d->pos || !d->seq || !d->table_off || !d->tables || !perm || !d->q || !d->kc || !d->vc) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
    /* block tables: a shuffled permutation of the blocks */
    for (int i = 0; i < blocks; i++) perm[i] = i;
    for (int i = blocks - 1; i > 0; i--) {
        int j = (int)(rng_next(&s) % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    int off[MAX_SEQS], at = 0;
    for (int i = 0; i < c->n_seqs; i++) {
        off[i] = at;
        for (int b = 0; b < nb[i]; b++) d->tables[at + b] = perm[at + b];
        at += nb[i];
    }
    /* the step's tokens */
    int next[MAX_SEQS] = {0}, t = 0;
    while (t < T)
        for (int i = 0; i < c->n_seqs && t < T; i++) {
            int take = c->interleave ? 1 : c->len[i];
            for (int k = 0; k < take && next[i] < c->len[i]; k++, next[i]++, t++) {
                d->pos[t] = c->start[i] + next[i];
                d->seq[t] = i;
                d->table_off[t] = off[i];
            }
        }
    /* the cache: NaN everywhere, the sequences' positions [0, start + len) written */
    memset(d->kc, 0xff, nk * e_size[kvt]);
    memset(d->vc, 0xff, nv * e_size[kvt]);
    for (int i = 0; i < c->n_seqs; i++)
        for (int p = 0; p < c->start[i] + c->len[i]; p++) {
            size_t slot = (size_t)d->tables[off[i] + p / c->block_size] * c->block_size + p % c->block_size;
            for (int h = 0; h < c->KH; h++) {
                for (int e = 0; e < c->DK; e++)
                    store(kvt, d->kc, (slot * c->KH + h) * c->DK + e, (float)rng_unit(&s));
                for (int e = 0; e < c->DV; e++)
                    store(kvt, d->vc, (slot * c->KH + h) * c->DV + e, (float)rng_unit(&s));
            }
        }
    for (size_t i = 0; i < nq; i++) store(qt, d->q, i, (float)(3.0 * rng_unit(&s)));
    free(perm);
    size_t no = (size_t)T * c->H * c->DV * e_size[qt];
    int ok = cu_ok(r, r->api.cuMemAlloc(&d->dq, nq * e_size[qt]), "cuMemAlloc") &&
             cu_ok(r, r->api.cuMemAlloc(&d->dk, nk * e_size[kvt]), "cuMemAlloc") &&
             cu_ok(r, r->api.cuMemAlloc(&d->dv, nv * e_size[kvt]), "cuMemAlloc") &&
             cu_ok(r, r->api.cuMemAlloc(&d->dout, no), "cuMemAlloc") &&
             cu_ok(r, r->api.cuMemAlloc(&d->dpos, sizeof(int) * (size_t)T), "cuMemAlloc") &&
             cu_ok(r, r->api.cuMemAlloc(&d->doff, sizeof(int) * (size_t)T), "cuMemAlloc") &&
             cu_ok(r, r->api.cuMemAlloc(&d->dtab, sizeof(int) * (size_t)blocks), "cuMemAlloc") &&
             cu_ok(r, r->api.cuMemcpyHtoD(d->dq, d->q, nq * e_size[qt]), "cuMemcpyHtoD") &&
             cu_ok(r, r->api.cuMemcpyHtoD(d->dk, d->kc, nk * e_size[kvt]), "cuMemcpyHtoD") &&
             cu_ok(r, r->api.cuMemcpyHtoD(d->dv, d->vc, nv * e_size[kvt]), "cuMemcpyHtoD") &&
             cu_ok(r, r->api.cuMemcpyHtoD(d->dpos, d->pos, sizeof(int) * (size_t)T), "cuMemcpyHtoD") &&
             cu_ok(r, r->api.cuMemcpyHtoD(d->doff, d->table_off, sizeof(int) * (size_t)T), "cuMemcpyHtoD") &&
             cu_ok(r, r->api.cuMemcpyHtoD(d->dtab, d->tables, sizeof(int) * (size_t)blocks), "cuMemcpyHtoD");
    return ok ? 0 : -1;
}

static void teardown(runner *r, att_data *d)
{
    r->api.cuMemFree(d->dq), r->api.cuMemFree(d->dk), r->api.cuMemFree(d->dv), r->api.cuMemFree(d->dout);
    r->api.cuMemFree(d->dpos), r->api.cuMemFree(d->doff), r->api.cuMemFree(d->dtab);
    free(d->pos), free(d->seq), free(d->table_off), free(d->tables), free(d->q), free(d->kc), free(d->vc);
}

/* A case's kernel, grid and dynamic shared memory, looked up (and the attribute set) once: the
 * benchmark's launches are then only launches (a lookup each made the decode cases' times the host's). */
typedef struct att_launch {
    krt_cu_fn fn;
    unsigned gx, gy, gz, smem;
} att_launch;

static int prepare_launch(runner *r, const att_case *c, int index, const att_data *d, att_launch *L)
{
    char name[32];
    snprintf(name, sizeof name, "att_%d", kernel_of(r->cases, index));
    krt_cu_fn fn;
    if (!cu_ok(r, r->api.cuModuleGetFunction(&fn, r->mod, name), name)) return -1;
    int T = d->T;
    unsigned gx, gy, gz = 1, smem = 0;
    if (c->old) {
        gx = (unsigned)T, gy = (unsigned)c->H;
    } else if (c->dec) { /* a block a (token, kv head) (the CUDA-core kernel: a q head), a cluster's split on z */
        gx = (unsigned)T, gy = (unsigned)(c->dec == 2 ? c->H : c->KH), gz = DEC_SPLIT;
        smem = (unsigned)kcu_plan_flash_decode(c->H / c->KH, c->DK, c->DV, kcu_arch_smem_optin("sm_90")).smem;
        if (!r->api.cuFuncSetAttribute) {
            fprintf(stderr, "%s needs cuFuncSetAttribute\n", name);
            return -1;
        }
        if (!cu_ok(r, r->api.cuFuncSetAttribute(fn, KRT_CU_FUNC_MAX_DYNAMIC_SHARED_BYTES, (int)smem), name)) return -1;
    } else {
        att_plan p = plan(c);
        int bt = 16 * p.mw * p.tw, hb = p.hb;
        smem = (unsigned)p.smem;
        if (c->g90) { /* 128 (token, head) rows a block */
            kcu_flash90_plan p9 = plan90(c);
            bt = 128 / p9.hb, hb = p9.hb, smem = (unsigned)p9.smem;
        }
        gx = (unsigned)(c->H / hb), gy = (unsigned)((T + bt - 1) / bt); /* as the engine */
        /* as the backend does for a kernel's large.smem (the attribute stays: setting it again is harmless) */
        if (!r->api.cuFuncSetAttribute) {
            fprintf(stderr, "%s needs cuFuncSetAttribute\n", name);
            return -1;
        }
        if (!cu_ok(r, r->api.cuFuncSetAttribute(fn, KRT_CU_FUNC_MAX_DYNAMIC_SHARED_BYTES, (int)smem), name)) return -1;
    }
    *L = (att_launch){fn, gx, gy, gz, smem};
    return 0;
}

static int launch_prepared(runner *r, const att_case *c, const att_launch *L, const att_data *d)
{
    int T = d->T, bs = c->block_size;
    void *params[] = {&T,
                      (void *)&d->dq,
                      (void *)&d->dk,
                      (void *)&d->dv,
                      (void *)&d->dout,
                      (void *)&d->dpos,
                      (void *)&d->doff,
                      (void *)&d->dtab,
                      &bs,
                      NULL};
    return cu_ok(r, r->api.cuLaunchKernel(L->fn, L->gx, L->gy, L->gz, 256, 1, 1, L->smem, NULL, params, NULL),
                 "cuLaunchKernel")
               ? 0
               : -1;
}

static int launch(runner *r, const att_case *c, int index, const att_data *d)
{
    att_launch L;
    return prepare_launch(r, c, index, d, &L) == 0 ? launch_prepared(r, c, &L, d) : -1;
}

/* The errors of the rows of token t (every head), into worst (as the tensor cores take the
 * operands) and worst_in (the operands as stored). */
typedef struct att_err {
    double worst, worst_in; /* the two measures, the largest */
    int bad;                /* outputs that are not finite */
} att_err;

static void check_token(const att_case *c, const att_data *d, const void *out, int t, att_err *e)
{
    etype qt = q_type(c), kvt = kv_type(c);
    int p = d->pos[t], lo = c->window > 0 && p - c->window + 1 > 0 ? p - c->window + 1 : 0, n = p - lo + 1;
    int group = c->H / c->KH;
    const int *table = d->tables + d->table_off[t];
    double *w = malloc(sizeof(double) * 2 * (size_t)n), *ref = malloc(sizeof(double) * 2 * (size_t)c->DV);
    double *qr = malloc(sizeof(double) * 2 * (size_t)c->DK);
    for (int h = 0; h < c->H; h++) {
        int kh = h / group;
        for (int x = 0; x < c->DK; x++) {
            double v = load(qt, d->q, ((size_t)t * c->H + h) * c->DK + x);
            qr[x] = v, qr[c->DK + x] = c->old ? v : to_mt(c->mt, v);
        }
        for (int way = 0; way < 2; way++) { /* 0: operands as stored; 1: as the tensor cores take them */
            double mx = -INFINITY, vmax = 0.0;
            for (int j = 0; j < n; j++) {
                size_t slot = (size_t)table[(lo + j) / c->block_size] * c->block_size + (lo + j) % c->block_size;
                double s = 0.0;
                for (int x = 0; x < c->DK; x++) {
                    double k = load(kvt, d->kc, (slot * c->KH + kh) * c->DK + x);
                    s += qr[way * c->DK + x] * (way && !c->old ? to_mt(c->mt, k) : k);
                }
                s *= head_scale(c);
                if (c->softcap > 0) s = c->softcap * tanh(s / c->softcap);
                w[j] = s;
                if (s > mx) mx = s;
            }
            const double sk = c->sinks ? (double)sink_of(h) : -INFINITY; /* in the softmax, with no value */
            if (sk > mx) mx = sk;
            double sum = c->sinks ? exp(sk - mx) : 0.0;
            for (int j = 0; j < n; j++) sum += (w[j] = exp(w[j] - mx));
            for (int x = 0; x < c->DV; x++) ref[x] = 0.0;
            for (int j = 0; j < n; j++) {
                size_t slot = (size_t)table[(lo + j) / c->block_size] * c->block_size + (lo + j) % c->block_size;
                for (int x = 0; x < c->DV; x++) {
                    double v = load(kvt, d->vc, (slot * c->KH + kh) * c->DV + x);
                    if (way && !c->old) v = to_mt(c->mt, v);
                    if (fabs(v) > vmax) vmax = fabs(v);
                    ref[x] += w[j] / sum * v;
                }
            }
            double worst = 0.0;
            for (int x = 0; x < c->DV; x++) {
                double o = load(qt, out, ((size_t)t * c->H + h) * c->DV + x);
                if (!isfinite(o)) {
                    if (way == 0) e->bad++;
                    worst = INFINITY;
                    continue;
                }
                double err = fabs(o - ref[x]) / (vmax > 0 ? vmax : 1.0);
                if (err > worst) worst = err;
            }
            if (way == 0 && worst > e->worst_in) e->worst_in = worst;
            if (way == 1 && worst > e->worst) e->worst = worst;
        }
    }
    free(w), free(ref), free(qr);
}

static att_err compare(const att_case *c, const att_data *d, const void *out, int sample)
{
    att_err e = {0, 0, 0};
    int step = sample ? d->T / 12 + 1 : 1; /* the benchmark's: a dozen tokens (a 8192-token row is 2^30 products) */
    for (int t = 0; t < d->T; t += step) check_token(c, d, out, t, &e);
    if (sample) check_token(c, d, out, d->T - 1, &e);
    return e;
}

/* the tolerance of a case: the rounding of p to mt, and of a 16-bit out */
static double tolerance(const att_case *c)
{
    double tol = c->mt == E_BF16 ? 4e-3 : 1e-3;
    if (c->qt == E_BF16) tol += 4e-3;
    if (c->qt == E_F16) tol += 5e-4;
    return tol;
}

static void describe(const att_case *c, const att_data *d, char *buf, size_t n)
{
    att_plan p = plan(c);
    if (c->g90) { /* as kcu_flash90 tiles it */
        kcu_flash90_plan p9 = plan90(c);
        p.mw = 1, p.tw = 8 / p9.hb, p.hb = p9.hb, p.bn = p9.bn;
    }
    if (c->dec) /* kcu_flash_decode: a token x the group a block, 16-position chunks */
        p.mw = 1, p.tw = 1, p.hb = c->H / c->KH, p.bn = 16;
    int k = snprintf(buf, n, "%s mma, q/out %s, cache %s, H=%d KH=%d DK=%d DV=%d T=%d (", e_short[c->mt],
                     e_short[c->qt], e_short[c->kvt], c->H, c->KH, c->DK, c->DV, d->T);
    for (int i = 0; i < c->n_seqs && k < (int)n; i++)
        k += snprintf(buf + k, n - (size_t)k, "%s%d@%d", i ? " " : "", c->len[i], c->start[i]);
    if (k < (int)n)
        snprintf(buf + k, n - (size_t)k, "%s) bs=%d tile %dx%d heads, %d positions%s%s%s%s%s", c->interleave ? " mixed" : "",
                 c->block_size, 16 * p.mw * p.tw, p.hb, p.bn, c->window ? " window" : "", c->softcap > 0 ? " softcap" : "",
                 c->sinks ? " sinks" : "", c->g90 ? ", wgmma (sm_90a)" : c->dec ? ", decode" : "",
                 c->dec == 2 ? " (CUDA cores)" : "");
}

static void run_checks(runner *r, const att_case *cases, int n)
{
    for (int i = 0; i < n; i++) {
        const att_case *c = &cases[i];
        att_data d;
        char what[256];
        if (!CHECK(setup(r, c, 500 + (uint64_t)i, &d) == 0)) continue;
        describe(c, &d, what, sizeof what);
        size_t bytes = (size_t)d.T * c->H * c->DV * e_size[c->qt];
        void *a = malloc(bytes), *b = malloc(bytes);
        int ok = a && b && r->api.cuMemsetD8(d.dout, 0xff, bytes) == 0 && launch(r, c, i, &d) == 0 &&
                 r->api.cuMemcpyDtoH(a, d.dout, bytes) == 0 && r->api.cuMemsetD8(d.dout, 0xff, bytes) == 0 &&
                 launch(r, c, i, &d) == 0 && r->api.cuMemcpyDtoH(b, d.dout, bytes) == 0;
        if (CHECK_MSG(ok, "%s: launch", what)) {
            att_err e = compare(c, &d, a, 0);
            int same = memcmp(a, b, bytes) == 0;
            int pass = e.bad == 0 && e.worst <= tolerance(c) && same;
            printf("%s %s: worst error %.2e of max|v| (tolerance %.1e; %.2e against the unrounded operands)%s%s\n",
                   pass ? "ok  " : "FAIL", what, e.worst, tolerance(c), e.worst_in,
                   e.bad ? ", outputs not finite" : "", same ? "" : ", two runs differ");
            CHECK_MSG(pass, "%s", what);
        }
        free(a), free(b);
        teardown(r, &d);
    }
}

/* ---- the GPU benchmark -------------------------------------------------------------------- */
static double time_case(runner *r, const att_case *c, int index, const att_data *d, int reps)
{
    krt_cu_event e0, e1;
    if (!cu_ok(r, r->api.cuEventCreate(&e0, 0), "cuEventCreate") ||
        !cu_ok(r, r->api.cuEventCreate(&e1, 0), "cuEventCreate"))
        return -1;
    double ms = -1;
    att_launch L;
    int ok = prepare_launch(r, c, index, d, &L) == 0;
    /* warm: 50 ms of launches (at least two), so that the clocks have risen from an idle GPU's */
    const double t_warm = now_s();
    for (int i = 0; ok && (i < 2 || now_s() - t_warm < 0.05); i++) {
        ok = launch_prepared(r, c, &L, d) == 0;
        if (i % 16 == 15) ok = ok && cu_ok(r, r->api.cuStreamSynchronize(NULL), "cuStreamSynchronize");
    }
    if (ok) {
        r->api.cuEventRecord(e0, NULL);
        for (int i = 0; i < reps; i++) launch_prepared(r, c, &L, d);
        r->api.cuEventRecord(e1, NULL);
        float f = 0;
        if (cu_ok(r, r->api.cuStreamSynchronize(NULL), "cuStreamSynchronize") &&
            cu_ok(r, r->api.cuEventElapsedTime(&f, e0, e1), "cuEventElapsedTime"))
            ms = f / reps;
    }
    r->api.cuEventDestroy(e0);
    r->api.cuEventDestroy(e1);
    return ms;
}

/* Llama-3-8B's attention: bf16 at 512, 2048, 8192 tokens as kiln plans it (two m16 tiles a warp,
 * 32-position tiles), then with one m16 tile a warp and 64-position tiles (the plan before q moved
 * to shared memory), and one m16 tile with 32 positions; the plan with an f32 cache (converted in
 * staging); today's kernel at 512 and 2048 */
static int bench_cases(att_case *out)
{
    static const int lens[] = {512, 2048, 8192};
    int n = 0;
    for (int i = 0; i < 3; i++) {
        /* kcu_flash90: as planned (2 stages of 128 positions); then 3 stages, and 4 of 64 positions */
        out[n++] = (att_case){E_BF16, E_BF16, E_BF16, 32, 8, 128, 128, 0, 0, 16, 1, {lens[i]}, {0}, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0};
        /* bn, ns, blocks an SM (2 of 64 positions in 97 KiB: two blocks an SM, one's softmax under the
           other's products) */
        static const int variant[3][3] = {{128, 3, 1}, {64, 4, 1}, {64, 2, 2}};
        for (int v = 0; v < 3; v++)
            out[n++] = (att_case){E_BF16, E_BF16, E_BF16, 32, 8, 128, 128, 0, 0, 16, 1, {lens[i]}, {0}, 0,
                                  variant[v][0], 0, 0, 1, variant[v][1], variant[v][2], 0, 0, 0, 0};
        out[n++] = (att_case){E_BF16, E_BF16, E_BF16, 32, 8, 128, 128, 0, 0, 16, 1, {lens[i]}, {0}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        out[n++] = (att_case){E_BF16, E_BF16, E_BF16, 32, 8, 128, 128, 0, 0, 16, 1, {lens[i]}, {0}, 0, 32, 0, 1, 0, 0, 0, 0, 0, 0, 0};
    }
    out[n++] = (att_case){E_BF16, E_F32, E_F32, 32, 8, 128, 128, 0, 0, 16, 1, {2048}, {0}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < 2; i++)
        out[n++] = (att_case){E_BF16, E_F32, E_F32, 32, 8, 128, 128, 0, 0, 16, 1, {lens[i]}, {0}, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0};
    /* decode: one token of each of `seqs` sequences at a context of ctx positions, kcu_flash_decode
     * (dec 1) and the CUDA-core kernel it replaces (dec 2), bf16 cache */
    static const int dec_shape[][2] = {{1, 512}, {1, 2048}, {1, 8192}, {8, 512}, {32, 512}, {32, 4096}, {128, 4096}};
    /* kcu_flash_decode as planned (R 4, a virtual block a block), then with virtual blocks of 2 rounds
     * (walked by fewer blocks in a step of many), then with a split after 8 rounds (the rule's knobs) */
    static const int rounds[][2] = {{0, 0}, {0, 2}, {8, 0}};
    for (int i = 0; i < (int)(sizeof dec_shape / sizeof dec_shape[0]); i++)
        for (int v = 0; v < 4; v++) {
            const int dec = v < 3 ? 1 : 2;
            att_case c = {E_BF16, E_BF16, E_BF16, 32, 8, 128, 128, 0, 0, 16, dec_shape[i][0], {0}, {0}, 1, 0, 0, 0, 0, 0, 0, dec,
                          v < 3 ? rounds[v][0] : 0, 0, v < 3 ? rounds[v][1] : 0};
            for (int s = 0; s < c.n_seqs; s++) c.len[s] = 1, c.start[s] = dec_shape[i][1] - 1 - 3 * s;
            out[n++] = c;
        }
    return n;
}

static void run_bench(runner *r, const att_case *cases, int n, int first)
{
    for (int i = 0; i < n; i++) {
        const att_case *c = &cases[i];
        att_data d;
        if (!CHECK(setup(r, c, 77 + (uint64_t)i, &d) == 0)) continue;
        double ms = time_case(r, c, first + i, &d, c->old ? 2 : c->dec ? 50 : 10);
        size_t bytes = (size_t)d.T * c->H * c->DV * e_size[q_type(c)];
        void *out = malloc(bytes);
        att_err e = {0, 0, 0};
        if (out && r->api.cuMemcpyDtoH(out, d.dout, bytes) == 0) e = compare(c, &d, out, 1);
        free(out);
        if (c->dec) { /* the K and V rows read, against the copy rate */
            double kv = 0;
            for (int t = 0; t < d.T; t++) kv += (double)(d.pos[t] + 1) * c->KH * (c->DK + c->DV) * e_size[c->kvt];
            char how[64];
            if (c->dec == 1)
                snprintf(how, sizeof how, "kcu_flash_decode (tensor cores), R %d RV %d", fd_r(c),
                         c->fdv > 0 ? c->fdv : fd_r(c));
            else
                snprintf(how, sizeof how, "kcu_attention_kernel (CUDA cores)");
            printf("bench decode %3d tokens at %5d positions, %-38s %9.4f ms %7.1f GB/s of K/V  error %.2e%s\n", d.T,
                   d.pos[0] + 1, how, ms, ms > 0 ? kv / (ms * 1e-3) / 1e9 : 0.0, e.worst, e.bad ? " NOT FINITE" : "");
            CHECK_MSG(!e.bad && e.worst <= tolerance(c) + (c->dec == 2 ? 4e-3 : 0.0), "bench case %d: error %.2e", i, e.worst);
            teardown(r, &d);
            continue;
        }
        double flops = 4.0 * (double)d.T * d.T / 2 * c->H * c->DK;
        char how[64];
        att_plan p = plan(c);
        if (c->old)
            snprintf(how, sizeof how, "today's kernel (f32, CUDA cores)");
        else if (c->g90)
            snprintf(how, sizeof how, "wgmma (sm_90a), %d pos, %d stages%s", plan90(c).bn, plan90(c).ns,
                     c->occ > 1 ? ", 2/SM" : "");
        else
            snprintf(how, sizeof how, "tensor cores, %s cache, %d/warp, %d pos", e_short[c->kvt], 16 * p.mw, p.bn);
        printf("bench T=%-5d H=%d KH=%d D=%d causal, %-36s %9.3f ms %7.1f TFLOP/s  error %.2e (unrounded %.2e)%s\n",
               d.T, c->H, c->KH, c->DK, how, ms, ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0, e.worst, e.worst_in,
               e.bad ? " NOT FINITE" : "");
        if (!c->old) CHECK_MSG(!e.bad && e.worst <= tolerance(c), "bench case %d: error %.2e", i, e.worst);
        teardown(r, &d);
    }
}

/* ---- main ------------------------------------------------------------------------------- */
static int open_runner(runner *r, const char *cubin)
{
    ks_diag d = {0};
    if (krt_cuda_api_load(&r->api, &d) != 0) return -1;
    krt_cu_device dev;
    return cu_ok(r, r->api.cuInit(0), "cuInit") && cu_ok(r, r->api.cuDeviceGet(&dev, 0), "cuDeviceGet") &&
                   cu_ok(r, r->api.cuDevicePrimaryCtxRetain(&r->ctx, dev), "cuDevicePrimaryCtxRetain") &&
                   cu_ok(r, r->api.cuCtxSetCurrent(r->ctx), "cuCtxSetCurrent") &&
                   cu_ok(r, r->api.cuModuleLoadData(&r->mod, cubin), "cuModuleLoadData")
               ? 0
               : -1;
}

static void close_runner(runner *r)
{
    if (r->mod) r->api.cuModuleUnload(r->mod);
    if (r->ctx) r->api.cuDevicePrimaryCtxRelease(0);
    krt_cuda_api_unload(&r->api);
}

static int nvrtc(const char *src, const char *arch, ks_buf *cubin)
{
    ks_diag d = {0};
    double t0 = now_s();
    int rc = kcu_compile(src, "att_check.cu", arch, cubin, &d);
    printf("%s NVRTC %s: %.1f s\n", rc == 0 ? "ok  " : "FAIL", arch, now_s() - t0);
    return rc;
}

enum {
    N_FLASH = sizeof check_cases / sizeof check_cases[0],
    N_DEC = sizeof dec_cases / sizeof dec_cases[0],
    N_CHECKS = N_FLASH + N_DEC, /* the emulator's: the mma.sync kernels' */
    N_G90 = sizeof g90_cases / sizeof g90_cases[0],
    MAX_BENCH = 64
};

/* The emulator's cases: kcu_flash_attention's checks, then kcu_flash_decode's */
static void emu_cases(att_case *all)
{
    memcpy(all, check_cases, sizeof check_cases);
    memcpy(all + N_FLASH, dec_cases, sizeof dec_cases);
}

/* The --gpu program's cases: the emulator's, kcu_flash90's checks, then the benchmark's; returns the checks */
static int gpu_cases(att_case *all, int *n_bench)
{
    emu_cases(all);
    memcpy(all + N_CHECKS, g90_cases, sizeof g90_cases);
    *n_bench = bench_cases(all + N_CHECKS + N_G90);
    return N_CHECKS + N_G90;
}

/* The architecture the --gpu program is compiled for: a device's sm_90 as sm_90a (kcu_flash90, as
 * kiln's engines: KCU_GEMM90_ARCH) */
static const char *program_arch(const char *arch) { return strcmp(arch, "sm_90") == 0 ? KCU_GEMM90_ARCH : arch; }

static int compile_main(const char *arch, const char *path)
{
    att_case all[N_CHECKS + N_G90 + MAX_BENCH];
    int n_bench, n_checks = gpu_cases(all, &n_bench);
    ks_buf src = {0}, cubin = {0};
    program_source(all, n_checks + n_bench, &src);
    int rc = nvrtc(ks_buf_cstr(&src), program_arch(arch), &cubin);
    FILE *f = rc == 0 ? fopen(path, "wb") : NULL;
    if (rc == 0 && (!f || fwrite(cubin.data, 1, cubin.len, f) != cubin.len)) rc = -1;
    if (f && fclose(f) != 0) rc = -1;
    ks_buf_free(&src);
    ks_buf_free(&cubin);
    return rc == 0 ? 0 : 1;
}

static int gpu_main(const char *cubin_path)
{
    att_case all[N_CHECKS + N_G90 + MAX_BENCH];
    int n_bench, n_checks = gpu_cases(all, &n_bench);
    ks_buf src = {0}, cubin = {0};
    program_source(all, n_checks + n_bench, &src);
    runner r = {.cases = all};
    ks_diag d = {0};
    int major = 0, minor = 0;
    krt_cu_device dev;
    if (krt_cuda_api_load(&r.api, &d) != 0 || !cu_ok(&r, r.api.cuInit(0), "cuInit") ||
        !cu_ok(&r, r.api.cuDeviceGet(&dev, 0), "cuDeviceGet") ||
        !cu_ok(&r, r.api.cuDeviceGetAttribute(&major, KRT_CU_ATTR_CC_MAJOR, dev), "attribute") ||
        !cu_ok(&r, r.api.cuDeviceGetAttribute(&minor, KRT_CU_ATTR_CC_MINOR, dev), "attribute"))
        return 1;
    krt_cuda_api_unload(&r.api);
    char arch[16];
    snprintf(arch, sizeof arch, "sm_%d%d", major, minor);
    if (cubin_path) {
        size_t len = 0;
        char *data = ks_read_file(&d, cubin_path, &len);
        if (!data) return 1;
        ks_buf_put(&cubin, data, len);
        free(data);
    } else if (nvrtc(ks_buf_cstr(&src), program_arch(arch), &cubin) != 0) {
        return 1;
    }
    if (open_runner(&r, cubin.data) != 0) return 1;
    run_checks(&r, all, n_checks);
    run_bench(&r, all + n_checks, n_bench, n_checks);
    close_runner(&r);
    ks_buf_free(&src);
    ks_buf_free(&cubin);
    return check_finish("cuda_att_check");
}

static int emu_main(void)
{
    int ran = 0;
    ks_buf src = {0};
    static att_case emu_all[N_CHECKS];
    emu_cases(emu_all);
    program_source(emu_all, N_CHECKS, &src);
#if defined(__SANITIZE_ADDRESS__)
    printf("a sanitizer build: the plain build compiles this source with NVRTC\n");
#else
    if (kcu_have_nvrtc()) {
        /* kcu_flash90's check cases, which nothing here can run (the --gpu program holds them with the
         * mma.sync checks and the benchmark's kernels: compiled for the GPU machine by bench/gpu_check.sh;
         * the mma.sync kernels NVRTC compiles in every fast engine, CI time) */
        ks_buf gsrc = {0};
        program_source(g90_cases, (int)N_G90, &gsrc);
        ks_buf cubin = {0};
        CHECK_MSG(nvrtc(ks_buf_cstr(&gsrc), program_arch("sm_90"), &cubin) == 0, "NVRTC, sm_90a");
        printf("compiled, not run here: kcu_flash90's %d check cases (wgmma has no CPU stand-in; `--gpu CUBIN` "
               "runs them on an sm_90 GPU)\n", (int)N_G90);
        ks_buf_free(&cubin);
        ks_buf_free(&gsrc);
        ran = 1;
    }
#endif
    const char *gxx = getenv("KILN_GXX"), *shim = getenv("KILN_EMU_SHIM"), *emu = getenv("KILN_EMU_LIB");
    if (gxx && gxx[0] && shim && emu) {
        char dir[] = "/tmp/kiln_att_check.XXXXXX";
        if (!mkdtemp(dir)) return 1;
        char *cu = ks_path_join(dir, "att.cu"), *so = ks_path_join(dir, "att.so");
        FILE *f = fopen(cu, "w");
        if (!f || fwrite(src.data, 1, src.len, f) != src.len || fclose(f) != 0) return 1;
        ks_buf cmd = {0};
        ks_buf_printf(&cmd,
                      "'%s' -O2 -w -fno-strict-aliasing -fsanitize=alignment -fno-sanitize-recover=alignment -shared "
                      "-fPIC -include '%s' -x c++ '%s' -o '%s'",
                      gxx, shim, cu, so);
        if (CHECK_MSG(system(ks_buf_cstr(&cmd)) == 0, "g++ could not compile the kernels")) {
            setenv("KILN_EMU_KERNELS", so, 1);
            setenv("KILN_CUDA_LIB", emu, 1);
            runner r = {.cases = emu_all};
            if (CHECK(open_runner(&r, NULL) == 0)) run_checks(&r, emu_all, N_CHECKS);
            close_runner(&r);
            ran = 1;
        }
        unlink(cu);
        unlink(so);
        rmdir(dir);
        free(cu);
        free(so);
        ks_buf_free(&cmd);
    } else {
        printf("KILN_GXX, KILN_EMU_SHIM or KILN_EMU_LIB not set: the emulated checks are skipped\n");
    }
    ks_buf_free(&src);
    if (!ran) {
        printf("skipped: needs NVRTC or g++\n");
        return 77;
    }
    return check_finish("cuda_att_check");
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 2 && argc <= 3 && strcmp(argv[1], "--gpu") == 0) return gpu_main(argc == 3 ? argv[2] : NULL);
    if (argc == 4 && strcmp(argv[1], "--compile") == 0) return compile_main(argv[2], argv[3]);
    if (argc != 1) {
        fprintf(stderr, "usage: cuda_att_check [--gpu [CUBIN] | --compile ARCH CUBIN]\n");
        return 2;
    }
    return emu_main();
}
