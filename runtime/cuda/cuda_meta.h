/*
 * cuda_meta.h — the "cuda.meta" section of a CUDA engine: which kernels to
 * launch, in what order, with which shapes and arguments. The CUDA code
 * generator (codegen/cuda/) fills a krt_cuda_meta and writes it; the CUDA
 * backend (runtime/cuda/cuda_backend.c) parses it back. The kernels themselves
 * are in the sections "cuda.sm_XX", one cubin per architecture, all compiled
 * from the same source, so one meta describes all of them.
 *
 * The section is a JSON object (readable with `kiln inspect`-like tools):
 *
 *   {
 *     "format": "kiln-cuda-2",
 *     "archs": ["sm_80", "sm_90a"],         cubins in the engine, sections cuda.sm_80, ...
 *     "output": 67,                         value whose buffer holds the logits
 *     "aliases": [[7, 6], [67, 66]],        [value, value whose buffer it shares]
 *     "kernels": [                          launched in this order every step
 *       {"name": "k6_matmul", "node": 6, "block": 256, "smem": 98304,   "smem" optional (0 when absent):
 *                                           its dynamic shared memory in bytes
 *        "large": {"name": "k6_matmul_large", "above": 8},   optional: the kernel for steps of more tokens
 *                                           (and optionally its own "grid", as "grid" below, and
 *                                           "smem", its dynamic shared memory in bytes: 0 when absent)
 *        "grid": [[0, 2, 1], [1, 31, 32], [0, 1, 1]],
 *        "args": ["T", "value:4", "value:5", "value:6"],
 *        "variants": [                      optional, by "above" ascending: launches that replace
 *          {"arch": "sm_90a", "above": 64,  the kernel for steps of more than "above" tokens when
 *           "launches": [                   the loaded cubin is "arch" (the last that applies runs)
 *             {"name": "k6_rms_norm_..", "block": 256, "smem": 0, "grid": .., "args": [..]},
 *             {"name": "k6_matmul_fused_.._g90_128", "block": 384, "smem": 197632,
 *              "grid": .., "args": ["T", "tmap:5:128", "tmap:4:64", "value:6"]}]}]},
 *       ...
 *     ]
 *   }
 *
 * "kiln-cuda-1" (no variants, no tensor maps) is read as well. A launch's
 * "smem" is its dynamic shared memory in bytes (the runtime sets the
 * function's MAX_DYNAMIC_SHARED_SIZE_BYTES to it once, at open).
 *
 * A grid dimension [t, c, div] is ceil((T * t + c) / div) blocks, T being the
 * tokens of the step; [t, c, div, cap] is that, at most cap (a mixture of experts' grouped
 * matmul: a block for each expert its step's tokens chose, min(T k, experts)); "block" is threads per block (x only). Arguments, in
 * the kernel's parameter order:
 *   "T"            int: tokens in the step
 *   "value:N"      pointer: the device buffer of value N (a weight, an input,
 *                  or a computed value; aliases resolved)
 *   "kv_k:L"       pointer: layer L's K storage in the KV cache
 *   "kv_v:L"       pointer: layer L's V storage
 *   "positions"    pointer to int[T]: each token's position
 *   "slots"        pointer to int[T]: the KV row each token writes
 *   "table_off"    pointer to int[T]: where each token's block table starts in "tables"
 *   "tables"       pointer to int[]: the block tables of the step's sequences
 *   "block_size"   int: positions per KV block
 *   "tmap:N:R"     CUtensorMap (128 bytes, by value): value N as a 2-D tensor of
 *                  rows of its last dim (a weight: its dims[0] rows; an
 *                  activation: the rows its buffer holds, the plan's max_tokens),
 *                  bf16 or f16 as the value, boxes of 64 elements x R rows,
 *                  128-byte swizzle, zeros past the edges; made once a session
 *                  (one-byte codes, f8e4m3 or i8: boxes of 128 elements, the
 *                  maps' type uint8)
 *   "xcodes:N"     pointer: value N's rows as one-byte codes, a row a token (the
 *                  fp8 and w8a8 matmuls' x: a pre-pass writes them, the matmul
 *                  reads them), in the backend's scratch after the activations
 *   "xscales:N"    pointer: those rows' f32 scales, a token each
 *   "tmap_xcodes:N:R"  CUtensorMap of "xcodes:N" (rows of the step's capacity),
 *                  boxes of 128 codes x R rows, as "tmap"
 *   "wdeq:N"       pointer: weight N (a quantized weight's codes, [rows, cols])
 *                  dequantized to a half type, 2 bytes an element, in the scratch
 *                  (w4a16 and w8a16's prefill on kcu_gemm90: a pre-pass writes it)
 *   "tmap_wdeq:N:R"  CUtensorMap of "wdeq:N", boxes of 64 elements x R rows, as
 *                  "tmap" (the map's type 16-bit: TMA copies bytes)
 *                  (the scratch is one region for every launch: they run one after
 *                  the other; it holds the widest N's codes, their scales, and the
 *                  largest dequantized weight)
 *
 * Prefix: krt_.
 */
#ifndef KILN_CUDA_META_H
#define KILN_CUDA_META_H

#include <stdint.h>

#include "support/support.h"

#define KRT_CUDA_META_FORMAT "kiln-cuda-2"
#define KRT_CUDA_META_FORMAT_1 "kiln-cuda-1" /* read too: no variants */
#define KRT_CUDA_META_SECTION "cuda.meta"
#define KRT_CUDA_SECTION_PREFIX "cuda." /* + arch, e.g. "cuda.sm_90" */

typedef enum krt_cuda_arg_kind {
    KRT_CUDA_ARG_T,          /* int: tokens in the step */
    KRT_CUDA_ARG_VALUE,      /* pointer: buffer of value `index` */
    KRT_CUDA_ARG_KV_K,       /* pointer: K storage of layer `index` */
    KRT_CUDA_ARG_KV_V,       /* pointer: V storage of layer `index` */
    KRT_CUDA_ARG_POSITIONS,  /* pointer: int[T] positions */
    KRT_CUDA_ARG_SLOTS,      /* pointer: int[T] KV rows written */
    KRT_CUDA_ARG_TABLE_OFF,  /* pointer: int[T] offsets into tables */
    KRT_CUDA_ARG_TABLES,     /* pointer: int[] block tables */
    KRT_CUDA_ARG_BLOCK_SIZE, /* int: positions per KV block */
    KRT_CUDA_ARG_TMAP,       /* CUtensorMap by value: value `index` in boxes of `box` rows */
    KRT_CUDA_ARG_KV_KS,      /* pointer: float scales of layer `index`'s K rows (a cache of codes) */
    KRT_CUDA_ARG_KV_VS,      /* pointer: float scales of layer `index`'s V rows */
    KRT_CUDA_ARG_XCODES,     /* pointer: value `index`'s rows as one-byte codes (scratch) */
    KRT_CUDA_ARG_XSCALES,    /* pointer: their f32 scales, a row each (scratch) */
    KRT_CUDA_ARG_TMAP_XCODES, /* CUtensorMap by value: the codes of value `index` in boxes of `box` rows */
    KRT_CUDA_ARG_WDEQ,       /* pointer: weight `index` dequantized to 16 bits (scratch) */
    KRT_CUDA_ARG_TMAP_WDEQ,  /* CUtensorMap by value: that dequantized weight in boxes of `box` rows */
    KRT_CUDA_ARG_COUNT
} krt_cuda_arg_kind;

typedef struct krt_cuda_arg {
    krt_cuda_arg_kind kind; /* what the parameter receives */
    int64_t index;          /* value or layer number for VALUE, KV_K, KV_V, KV_KS, KV_VS, TMAP, XCODES, XSCALES,
                               TMAP_XCODES, WDEQ, TMAP_WDEQ; 0 otherwise */
    int32_t box;            /* TMAP, TMAP_XCODES, TMAP_WDEQ: rows of a box (8 .. 256); 0 otherwise */
} krt_cuda_arg;

enum { KRT_CUDA_MAX_ARGS = 24, KRT_CUDA_MAX_LAUNCHES = 4, KRT_CUDA_MAX_VARIANTS = 16 };

/* One launch of a variant. */
typedef struct krt_cuda_launch {
    const char *name;                    /* the kernel's function name */
    int block;                           /* threads per block */
    int smem;                            /* dynamic shared memory, bytes */
    int64_t grid[3][4];                  /* as krt_cuda_kernel's grid */
    int n_args;                          /* parameters */
    krt_cuda_arg args[KRT_CUDA_MAX_ARGS]; /* in parameter order */
} krt_cuda_launch;

/* Launches that replace a kernel for steps of more than `above` tokens on
 * one architecture (e.g. the sm_90a matmul: a norm's own kernel, then the
 * wgmma matmul reading its output through a tensor map). */
typedef struct krt_cuda_variant {
    const char *arch;                              /* the cubin that holds them, "sm_90a" */
    int64_t above;                                 /* tokens a step above which they run */
    int n_launches;                                /* 1 .. KRT_CUDA_MAX_LAUNCHES */
    krt_cuda_launch launches[KRT_CUDA_MAX_LAUNCHES]; /* in order */
} krt_cuda_variant;

typedef struct krt_cuda_kernel {
    const char *name;                    /* the kernel's function name, e.g. "k6_matmul" */
    const char *name_large;              /* launched instead when T > large_above; NULL: name for every T */
    int64_t large_above;                 /* tokens a step above which name_large runs */
    int large_per_seq;                   /* 1: name_large runs when one sequence has more than large_above tokens
                                          * in the step, not when the step has (attention: a prompt takes the
                                          * prefill kernel, a batch of decode tokens the decode one; meta
                                          * "large.per_seq") */
    int has_grid_large;                  /* 1: name_large runs on grid_large; 0: on grid */
    int64_t grid_large[3][4];            /* name_large's grid, as grid */
    int smem_large;                      /* name_large's dynamic shared memory, bytes (0: none; meta "large.smem") */
    uint32_t node;                       /* the graph node it computes */
    int block;                           /* threads per block */
    int smem;                            /* name's dynamic shared memory, bytes (0: none; meta "smem") */
    int64_t grid[3][4];                  /* per grid dim: {t, c, div, cap}: ceil((T*t + c) / div), at most cap
                                          * when cap > 0 */
    int n_args;                          /* parameters */
    krt_cuda_arg args[KRT_CUDA_MAX_ARGS]; /* in parameter order */
    krt_cuda_variant *variants;          /* by above ascending; NULL when none */
    int n_variants;                      /* how many (at most KRT_CUDA_MAX_VARIANTS) */
} krt_cuda_kernel;

typedef struct krt_cuda_meta {
    ks_arena arena;            /* owns the strings and arrays below */
    const char **archs;        /* "sm_80", ...: the cubins present */
    int n_archs;               /* how many */
    uint32_t output;           /* value holding the logits (aliases resolved by the reader) */
    uint32_t (*aliases)[2];    /* [value, shares the buffer of] */
    int n_aliases;             /* how many */
    krt_cuda_kernel *kernels;  /* in launch order */
    int n_kernels;             /* how many */
    int pdl;                   /* 1: every kernel's first statement waits for the kernel before it (KCU_PDL_ENTER,
                                  sm_90 on), so the runtime may launch it to overlap that one's end; 0 (engines
                                  built before): launched one after the other */
} krt_cuda_meta;

/* The JSON text of meta (appended to out); deterministic. */
void krt_cuda_meta_write(const krt_cuda_meta *meta, ks_buf *out);

/* Parse the JSON text; checks the structure, not the graph (the backend
 * checks node and layer numbers against its graph). Returns 0, or -1 after
 * reporting against `what`. Free with krt_cuda_meta_free. */
int krt_cuda_meta_parse(const char *text, size_t len, const char *what, krt_cuda_meta *meta, ks_diag *d);
void krt_cuda_meta_free(krt_cuda_meta *meta);

/* Whether kernel k runs name_large for a step of T tokens whose longest sequence has run of them. */
int krt_cuda_large(const krt_cuda_kernel *k, int64_t T, int64_t run);

/* Grid dimension i of kernel k for a step of T tokens (of name_large's grid when large: krt_cuda_large). */
int64_t krt_cuda_grid_dim(const krt_cuda_kernel *k, int i, int64_t T, int large);

/* Grid dimension i of a launch for a step of T tokens. */
int64_t krt_cuda_launch_grid_dim(const krt_cuda_launch *l, int i, int64_t T);

/* The variant of kernel k that runs a step of T tokens when the cubin of
 * arch is loaded: the last whose arch is arch and whose above is below T;
 * NULL: k's own kernels (name, name_large) run. */
const krt_cuda_variant *krt_cuda_pick_variant(const krt_cuda_kernel *k, const char *arch, int64_t T);

/* The spelling of an argument in the meta ("value:6"), into b. */
void krt_cuda_arg_format(const krt_cuda_arg *a, ks_buf *b);

#endif
