/*
 * kcu.h — the CUDA code generator: from a verified kir_graph to CUDA C (one
 * launch per fusion group — norm prologue, matmul, epilogue — or per compute
 * node outside groups, shapes as compile-time constants, T — the tokens of
 * a step — a kernel argument), compiled with NVRTC into one cubin per
 * requested architecture, plus the launch table the CUDA backend runs
 * (runtime/cuda/cuda_meta.h).
 *
 * Tutorial (what `kiln build --target sm_80,sm_90` does):
 *
 *     kcu_parts parts;
 *     if (kcu_build(graph, "sm_80,sm_90", emit_dir_or_NULL, NULL, NULL, &parts, diag) != 0) ...;
 *     // parts.sections: "cuda.meta", "cuda.sm_80", "cuda.sm_90" for the engine
 *     // parts.archs: {"sm_80", "sm_90"} for the engine's metadata
 *     kcu_parts_free(&parts);
 *
 * Kernels are shared: nodes whose kernels would have the same text (the
 * same op, shapes, dtypes and attributes — the layers of a model) launch one
 * kernel, compiled once, so a 32-layer model compiles about as fast as a
 * 1-layer one.
 *
 * Weights are f32, bf16 or f16, read as they lie in the engine (16-byte
 * loads in the matmuls); activations, sums and the KV cache are f32. Every
 * output element is computed in an order fixed by its position (no atomics,
 * fixed reduction trees): runs are bitwise reproducible. Matmuls have two
 * kernels (kcu_prelude.cuh): a memory-bound one for steps of at most
 * KCU_DECODE_T tokens (decode: kcu_matmul_tc on tensor cores in fast precision,
 * kcu_matmul_small on CUDA cores otherwise; a token's sums the same whatever
 * its step holds), and a tiled one for longer steps (prefill; tensor cores
 * for bf16/f16 weights on sm_80 and later, x split into 16-bit parts), and
 * a fused matmul group with half x and weights (fast precision) a third for
 * the sm_90a cubin (a target's sm_90: kcu_gemm90, wgmma fed by TMA, for
 * steps past the decode kernels', tile widths by step size: cuda.meta
 * "variants", kcu_emit_group.c and kcu_emit_g90.c); the
 * other kernels keep the reference interpreter's arithmetic where they can
 * (runtime/interp/interp_kernels.c: double for row sums and transcendental functions).
 *
 * Prefix: kcu_.
 */
#ifndef KILN_KCU_H
#define KILN_KCU_H

#include "ir/ir.h"
#include "runtime/cuda/cuda_meta.h"
#include "runtime/engine.h"
#include "support/support.h"

/* ---- targets ---------------------------------------------------------------- */
/* 1 when target names CUDA architectures ("sm_90" or "sm_80,sm_90"), 0 when
 * it is something else (e.g. "cpu"). */
int kcu_is_target(const char *target);

/* Split a CUDA target into its architectures ("sm_80", "sm_90"), in the
 * order given, into a (the caller's arena). Reports a malformed or repeated
 * entry. Returns the count, or -1 after reporting. */
int kcu_parse_target(const char *target, ks_arena *a, const char ***archs, ks_diag *d);

/* Whether quantized matmul mm (ir/quant.h) has a CUDA kernel (kcu_matmul_q: w4a16 and w8a16, a scale
 * a row and group, groups of whole 16-byte chunks): NULL, or why not (kcu_build reports it). */
const char *kcu_qmatmul_supported(const kir_graph *g, kir_val mm);

/* ---- generation --------------------------------------------------------------- */
/* Choices of the generator that the graph does not make (zeroed: the defaults). */
typedef struct kcu_options {
    int flash_prefill; /* 1: attention for steps of many tokens on tensor cores (kcu_flash.cuh, in bf16/f16;
                        * kcu_emit_attention.c's use_flash_prefill) in exact-precision engines too (for
                        * tests; kcu_build: KILN_CUDA_FLASH_PREFILL=1 in the environment); 0: only in fast
                        * precision (a half KV cache), exact engines keep f32 on CUDA cores for every step. */
    int gemm90;        /* 1: matmul groups with half x and weights get a variant for the sm_90a cubin
                        * (KCU_GEMM90_ARCH): kcu_gemm90 (wgmma fed by TMA) for steps of more than
                        * gemm90_above tokens (kcu_build: when the target has sm_90; KILN_CUDA_GEMM90=0
                        * in the environment turns it off) */
    int no_flash90;    /* 1: the attention kernels' sm_90a cubin keeps kcu_flash_attention (mma.sync) for steps
                        * of many tokens instead of kcu_flash90 (wgmma) (kcu_build: KILN_CUDA_FLASH90=0 in the
                        * environment; for comparisons) */
    int no_flash_decode; /* 1: fast precision's decode steps on kcu_attention_kernel (CUDA cores, a q head a block)
                        * instead of kcu_flash_decode (tensor cores, a kv head's GQA group a block; every K and V
                        * row read once for the group) (kcu_build: KILN_CUDA_FLASH_DECODE=0 in the environment;
                        * for comparisons: on the H100 kcu_flash_decode took 0.0108 / 0.0128 / 0.025 ms for one
                        * token at 512 / 2048 / 8192 positions against 0.0176 / 0.0385 / 0.170, 0.97 ms for 128
                        * tokens at 4096 against 3.53, bench/RESULTS.md #11 step 5) */
    int fd_vrounds;    /* 0: kcu_flash_decode's rounds a virtual block, KCU_FD_VROUNDS; else these
                        * (KILN_CUDA_FD_VROUNDS=N, for comparisons) */
    int fd_rounds;     /* 0: kcu_flash_decode's rounds of its warps a block before the cluster's blocks share a
                        * token's positions (KCU_FD_ROUNDS, kcu_prelude.cuh); else these (kcu_build:
                        * KILN_CUDA_FD_ROUNDS=N in the environment, for comparisons) */
    int g90_cluster;   /* 1: kcu_gemm90 in clusters of two blocks that share the weight tile (each loads half
                        * of it into both: TMA multicast) where its boxes split into whole swizzle atoms; 0:
                        * a block at a time (kcu_build: KILN_CUDA_GEMM90_CLUSTER=2 in the environment; off by
                        * default: on the H200 0.96-1.05 of single blocks at 2048 tokens, worse at 128,
                        * bench/RESULTS.md, #10 step 10) */
    int batch_variant; /* 1: trade batch invariance for speed where that is faster today: steps of at most
                        * MM_GEMV_T tokens on kcu_matmul_small (CUDA cores), longer ones on the prefill
                        * kernels (kcu_gemm90 from MM_GEMV_T + 1 on sm_90a); 0 (the default): steps of up
                        * to KCU_DECODE_T tokens on the invariant decode kernels (kcu_matmul_tc in fast
                        * precision). kcu_build: KILN_CUDA_BATCH_VARIANT=1 in the environment. Measured on the
                        * H200 (bench/RESULTS.md #11 step 1): batch 1 / 8 / 32 of the 8B 4.58 / 12.94 / 6.77
                        * ms a step with it, 5.77 / 6.93 / 17.44 without. */
    int64_t gemm90_above; /* 0: the decode kernels' most; else the tokens a step above which gemm90 runs
                        * (kcu_build: KILN_CUDA_GEMM90_ABOVE=N, for tests that want short prompts on it) */
    int64_t smem_optin; /* 0, or the dynamic shared memory a block may opt into on every target
                        * architecture, bytes (kcu_arch_smem_optin; kcu_build sets it): room for the flash
                        * attention's deeper K/V ring */
    int tc_per_sm;     /* 0: kcu_matmul_tc's plan's blocks an SM; else these (kcu_build: KILN_CUDA_TC_PER_SM=N,
                        * for comparisons) */
    int moe_bt_large;  /* 0: the grouped MoE matmul's routed rows a tile in prompts, MOE_BT_LARGE (64); else
                        * these (KILN_CUDA_MOE_BT_LARGE=16 or 32: tests/cuda/cuda_ops.sh makes a short prompt's
                        * experts take more than one tile) */
    int stats_batch;   /* 0: the norm statistics' chunks a lane loads before summing them, KCU_STATS_BATCH;
                        * else these (KILN_CUDA_STATS_BATCH=N, 1 to 16, for comparisons: the order of the
                        * sums is the same) */
    int tc_xahead;     /* 0: kcu_matmul_tc's sets of x in registers, KCU_TC_XAHEAD; else these
                        * (KILN_CUDA_TC_XAHEAD=N, 1 to 8, for comparisons) */
    int tc_ring_kb;    /* 0: kcu_matmul_tc's plan's ring; else at most this many kB (KILN_CUDA_TC_RING=N) */
    int tc_min_blocks; /* 0: kcu_matmul_tc's launch bounds ask for its plan's blocks an SM; else for these
                        * (KILN_CUDA_TC_MIN_BLOCKS=N, 1 to 4: 2 caps it at 128 registers, so that the next
                        * kernel's block, launched early, fits beside it; for comparisons) */
    int l2_ahead_mb;   /* 0: no L2 prefetch ahead of a matmul (the default: on an H100 it cost a batch-1 step
                        * of the 8B's shape 25 % and of the MoE's 2.8x, bench/RESULTS.md); else a kernel that
                        * streams no weights prefetches the next matmul's first N MB into L2, and a MoE's
                        * routing and gate/up kernels the chosen experts' (KILN_CUDA_L2_AHEAD=N, 1 to 48, for
                        * comparisons: no number depends on it) */
    int tc_xring;      /* 0: steps of more than 8 tokens copy x through kcu_matmul_tc's ring (KCU_TC_XRING);
                        * -1: into registers (KILN_CUDA_TC_XRING=0, for comparisons: the same sums) */
    int tc_prefetch;   /* 0: none (the default, measured slower with l2_ahead_mb); else kcu_matmul_tc's first N
                        * weight steps prefetched into L2 before its wait for the kernel before it
                        * (KILN_CUDA_TC_PREFETCH=N, 1 to 64, for comparisons: no number depends on it) */
    ks_buf *choices;   /* NULL, or where the per-shape choices go, a line a distinct kernel that has
                        * variants: "k_matmul_fused_..: %7 matmul, 4096 -> 6144: sm_90a above 64 tokens: ..."
                        * (kiln build --stats prints them) */
} kcu_options;

/* How the tensor-core prefill attention (kcu_flash_attention, kcu_flash.cuh) splits its work
 * (codegen/cuda/kcu_emit_attention.c, where its budgets are explained). */
typedef struct kcu_flash_plan {
    int hb;   /* q heads of one kv head a block: the largest power of two dividing the group, at most 8 */
    int tw;   /* warps a head: 8 / hb (8 warps, the kernel's 256 threads) */
    int mw;   /* m16 tiles (16 tokens) a warp: 2 (each K/V fragment read from shared memory feeds two
               * mma), 1 where two tiles' accumulators or q would not fit */
    int bn;   /* positions a K/V tile: 64, halved until the budgets hold */
    int ns;   /* K/V tiles in the ring (2-4): as many as the shared memory a block may opt into holds */
    int smem; /* dynamic shared memory, bytes (kcu_flash_smem) */
} kcu_flash_plan;
/* The plan for a GQA group of q heads a kv head, head dims dk and dv (at most 256), with or
 * without a softcap, for targets whose blocks may opt into smem_optin bytes of dynamic shared
 * memory (0: unknown, the two-tile ring that fits every architecture from sm_80). */
kcu_flash_plan kcu_plan_flash(int64_t group, int64_t dk, int64_t dv, int softcap, int64_t smem_optin);
/* The plan for steps that give plan `f` fewer blocks than the GPU has SMs (kcu_fa_few_blocks): one
 * m16 tile a warp (mw 1: twice f's blocks) with the largest K/V tile the budgets allow; f itself
 * when f.mw is 1 already. */
kcu_flash_plan kcu_plan_flash_short(const kcu_flash_plan *f, int64_t group, int64_t dk, int64_t dv, int softcap,
                                    int64_t smem_optin);
/* How the sm_90a prefill attention (kcu_flash90, kcu_flash90.cuh) runs (kcu_emit_attention.c). */
typedef struct kcu_flash90_plan {
    int hb;   /* q heads of one kv head a block (kcu_plan_flash's hb): 128 / hb tokens a block */
    int bn;   /* positions a K/V tile: 128, or 64 where q and two stages would not fit */
    int ns;   /* stages of K and V tiles: 2 (3 measured slower where they fit) */
    int smem; /* dynamic shared memory, bytes; 0: no plan (then kcu_flash_attention runs there too) */
} kcu_flash90_plan;
/* The plan for a GQA group, head dims dk and dv, for targets whose blocks may opt into smem_optin
 * bytes of dynamic shared memory (the least of theirs: the other architectures' cubins launch
 * kcu_flash_attention with the same amount): smem 0 unless dk is a multiple of 64 up to 256, dv 64
 * or 128, and it fits. */
kcu_flash90_plan kcu_plan_flash90(int64_t group, int64_t dk, int64_t dv, int64_t smem_optin);
/* kcu_flash90's dynamic shared memory at dims dk, dv with ns stages of bn positions, bytes (kcu_flash90.cuh's
 * kcu_f90_smem_of: q, the stages, 1024 for alignment). */
int64_t kcu_flash90_smem(int64_t dk, int64_t dv, int bn, int ns);
/* How the decode attention on tensor cores (kcu_flash_decode, kcu_flash_decode.cuh) runs
 * (kcu_emit_attention.c): 8 warps, chunks of 16 positions, each warp a ring of ns chunks. */
typedef struct kcu_flash_decode_plan {
    int ns;   /* K/V chunks in a warp's ring (2-4): as many as the targets' opt-in shared memory holds */
    int smem; /* dynamic shared memory, bytes; 0: no plan (kcu_attention_kernel decodes) */
    int slots; /* virtual blocks' states a block keeps (kcu_flash_decode's SLOTS, 1-4) */
} kcu_flash_decode_plan;
/* The plan for a GQA group (at most 16 q heads a kv head), head dims dk and dv (multiples of 16, at
 * most 256), for targets whose blocks may opt into smem_optin bytes: smem 0 where two chunks a warp
 * do not fit. */
kcu_flash_decode_plan kcu_plan_flash_decode(int64_t group, int64_t dk, int64_t dv, int64_t smem_optin);
/* The dynamic shared memory a block may opt into on architecture sm_NN (e.g. "sm_90a"), bytes:
 * the CUDA programming guide's table (sm_80, sm_87: 163 KiB; sm_86, sm_89: 99 KiB; sm_90: 227 KiB;
 * others, and names kiln does not know: 48 KiB). */
int64_t kcu_arch_smem_optin(const char *arch);
/* What a target's architectures (kcu_parse_target's) mean for the generator: with gemm90, each
 * sm_90 becomes KCU_GEMM90_ARCH and opt->gemm90 is set; opt->smem_optin is the least of theirs. */
void kcu_target_options(const char **archs, int n, int gemm90, kcu_options *opt);
/* The dynamic shared memory of plan f's hb, mw and bn at dims dk, dv, bytes (kcu_flash.cuh's
 * kcu_fa_smem_of). */
int64_t kcu_flash_smem(const kcu_flash_plan *f, int64_t dk, int64_t dv);

/* How the decode matmul (kcu_matmul_small or _tc, kcu_prelude.cuh: steps of at most KCU_DECODE_T tokens) spreads
 * a weight of N rows over blocks (codegen/cuda/kcu_emit.c, where the rule and the expected times
 * are explained). The sums do not depend on it: only which warp computes them. */
typedef struct kcu_gemv_plan {
    int tc;     /* 1: kcu_matmul_tc (tensor cores: x and weights of one half dtype, K % 8 == 0); 0:
                 * kcu_matmul_small (CUDA cores; T > MM_GEMV_T in groups of it, the weights read again) */
    int rows;   /* R: columns (weight rows) a warp: 4 where N gives every SM 1.25 blocks of 32, else 2;
                 * tc: J, the tiles of 16 columns a block takes one after another (kcu_emit.c) */
    int cols;   /* columns a block, 8 R (tc: 16 J): the kernel's grid is ceil(N / cols) blocks */
    int per_sm; /* blocks an SM the kernel is compiled for (__launch_bounds__: 2, so 128 registers a
                 * thread at most; more would spill, visibly, rather than halve the loads in flight) */
    int ring;   /* tc: the weights' ring, bytes of dynamic shared memory (kcu_matmul_tc's RING, the
                 * kernel's "smem"); 0 elsewhere */
} kcu_gemv_plan;
/* The plan for N columns (tc: kcu_matmul_tc's). */
kcu_gemv_plan kcu_plan_gemv(int64_t N);
/* norm: the matmul has a fused norm prologue; opt: the targets' smem_optin (the ring's room), tc_per_sm and
 * tc_ring_kb */
struct kcu_options;
kcu_gemv_plan kcu_plan_gemv_tc(int64_t N, int norm, const struct kcu_options *opt);
/* The least smem_optin that kcu_matmul_tc runs with (its static shared memory and a ring of two steps). */
enum { KCU_TC_MIN_OPTIN = (40 + 1 + 32) * 1024 };
/* The most tokens a step of the decode kernels (kcu_matmul_tc in fast precision, kcu_matmul_small
 * otherwise): steps of up to this many take them, larger ones the kernel's _large or kcu_gemm90
 * (whose variants start above it). Both sum each token's outputs in an order that does not depend
 * on the step (kcu_prelude.cuh), so a sequence decoded among up to 31 others gets the bits it gets
 * alone (issue #11's batch invariance; tests/session/test_session.c). */
enum { KCU_DECODE_T = 32 };

/* The architecture whose cubin holds the gemm90 kernels: a target's sm_90 is compiled for it
 * (wgmma and setmaxnreg are sm_90a's; an sm_90a cubin runs on compute capability 9.0 only). */
#define KCU_GEMM90_ARCH "sm_90a"
/* kcu_gemm90 takes every step past the decode kernels' (kcu_gen.h's kcu_decode_t: KCU_DECODE_T, or
 * MM_GEMV_T with kcu_options.batch_variant; a smaller KILN_CUDA_GEMM90_ABOVE is raised to it), so
 * that on sm_90a kcu_matmul_mma's _large runs for none. A step of up to 128 tokens is one token
 * tile, where kcu_gemm90 streams the weights near the copy rate (alone at 128 tokens on the H200:
 * gate/up 66.5 µs, lm_head 269 against floors of 55.5 and 248; bench/RESULTS.md #10 step 11). */

/* kcu_gemm90's column tiles for a matmul of N columns whose column c is
 * paired with partner[c] (-1: the single last column of an odd N), BN
 * columns a tile (codegen/cuda/kcu_emit_g90.c): nt tiles, each nbox boxes
 * of bn / nbox weight rows; table [nt][nbox + 1]: the tile's split flag
 * (1: column n < bn/2 pairs with n + bn/2), then its boxes' first rows
 * (-1: unused). plain: tile y is rows y bn .. (no table needed). */
typedef struct kcu_g90_tiles {
    int bn, nbox, nt, plain; /* as above */
    int *table;              /* [nt * (nbox + 1)], malloc'd; NULL when plain */
} kcu_g90_tiles;
/* 0 and the tiles, or -1 when the pairs do not fit boxes of whole swizzle atoms (then none). */
int kcu_g90_plan_tiles(const int64_t *partner, int64_t N, int bn, kcu_g90_tiles *t);
/* The tile widths kcu_gemm90 takes, narrowest first. */
enum { KCU_G90_WIDTHS = 5 };
extern const int kcu_g90_widths[KCU_G90_WIDTHS]; /* 64, 128, 192, 224, 256 */
/* The tile width for a step of T tokens, given nt[i], the tiles at width kcu_g90_widths[i] (0:
 * none): the least waves x width / efficiency over an sm_90 GPU's 132 SMs (kcu_emit_g90.c). */
int kcu_g90_pick_bn(int64_t T, const int nt[KCU_G90_WIDTHS]);
/* The rule's cost of a step of T tokens in nt column tiles of width bn: waves x bn / efficiency. */
double kcu_g90_cost(int64_t T, int bn, int nt);
/* Pipeline stages for a tile width (about 192 kB of shared memory). */
int kcu_g90_stages(int bn);
/* Dynamic shared memory of a kcu_gemm90 kernel with that tile and stages, in bytes (the
 * prelude's kcu_gemm90_smem: the stages or the epilogue's f32 tile, and 1024 for alignment). */
int kcu_g90_smem_bytes(int bn, int stages);

/* Append the CUDA C source of g's kernels to src and fill meta's kernels,
 * aliases and output (not its archs). meta must be zeroed; its arena owns
 * what is added. Reports ops or types it does not lower. 0 or -1.
 * kcu_generate_with takes options (NULL: the defaults, as kcu_generate). */
int kcu_generate(const kir_graph *g, ks_buf *src, krt_cuda_meta *meta, ks_diag *d);
int kcu_generate_with(const kir_graph *g, const kcu_options *opt, ks_buf *src, krt_cuda_meta *meta, ks_diag *d);

/* The device templates every generated source starts with: the text of
 * codegen/cuda/kcu_prelude.cuh, embedded at build time. */
extern const char kcu_prelude[];

/* ---- compilation (NVRTC) ------------------------------------------------------- */
/* 1 when this kiln was built with NVRTC; 0 when kcu_compile only reports. */
int kcu_have_nvrtc(void);
/* NVRTC's version and the lowest and highest sm_NN it compiles for (0 when
 * it cannot say); -1 without NVRTC. */
int kcu_nvrtc_version(int *major, int *minor, int *lo_arch, int *hi_arch);

/* Compile src (named src_name in messages) for arch ("sm_90") into a cubin,
 * appended to cubin. 0, or -1 after reporting (NVRTC missing, the arch
 * unsupported, or a compile error — kiln's bug: the log is reported). */
int kcu_compile(const char *src, const char *src_name, const char *arch, ks_buf *cubin, ks_diag *d);
/* What decides a cubin besides its source, as one line appended to id: NVRTC's
 * version, the architecture, kcu_compile's options and the NVRTC library's file
 * ("nvrtc 13.0 -arch=sm_90a --fmad=false --std=c++17 (/usr/local/cuda/...: N bytes,
 * modified T)"). */
void kcu_compile_id(const char *arch, ks_buf *id);

/* A folder of compiled cubins (kcu_cache.c), keyed by kcu_compile_id and the
 * whole source: kcu_build reads a cubin from there when it compiled the same
 * before, the same bytes. The environment's KILN_CUDA_CACHE names the folder
 * (the tests set it: they build the same sources several times); unset, there
 * is none. kcu_cache_get: 1 and the cubin appended, or 0 (a miss); put: stores
 * it, silently (a cache that cannot be written is no error). */
int kcu_cache_get(const char *dir, const char *src, const char *arch, ks_buf *cubin);
void kcu_cache_put(const char *dir, const char *src, const char *arch, const ks_buf *cubin);

/* ---- the engine's CUDA sections --------------------------------------------------- */
typedef struct kcu_parts {
    ks_arena arena;                /* owns archs, names and the section table */
    const char **archs;            /* the target's architectures, as given */
    int n_archs;                   /* how many */
    ks_buf meta;                   /* the cuda.meta JSON text */
    ks_buf choices;                /* the generator's per-shape choices (kcu_options.choices) */
    ks_buf *cubins;                /* [n_archs] cubin bytes */
    krt_engine_section *sections;  /* [n_sections]: cuda.meta, then cuda.<arch> per arch */
    size_t n_sections;             /* 1 + n_archs */
} kcu_parts;

/* Generate, compile for every architecture of target, and describe the
 * sections to add to the engine. With emit_dir, also write the generated
 * source there as <graph name>.cu. 0, or -1 after reporting. The
 * architectures compile at once, a thread each: the cubins are the bytes
 * each compiles to alone, and a failure reports what a build compiling in
 * turn would (the messages up to the first architecture that fails).
 * on_compile, when not NULL, is called once before they start, with the
 * architectures as one text ("sm_80, sm_90"). */
typedef void (*kcu_compile_fn)(void *ctx, const char *archs);
int kcu_build(const kir_graph *g, const char *target, const char *emit_dir, kcu_compile_fn on_compile,
              void *on_compile_ctx, kcu_parts *out, ks_diag *d);
void kcu_parts_free(kcu_parts *p);

#endif
