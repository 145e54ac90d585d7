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
 *     "format": "kiln-cuda-1",
 *     "archs": ["sm_80", "sm_90"],          cubins in the engine, sections cuda.sm_80, ...
 *     "output": 67,                         value whose buffer holds the logits
 *     "aliases": [[7, 6], [67, 66]],        [value, value whose buffer it shares]
 *     "kernels": [                          launched in this order every step
 *       {"name": "k6_matmul", "node": 6, "block": 256,
 *        "large": {"name": "k6_matmul_large", "above": 8},   optional: the kernel for steps of more tokens
 *                                           (and optionally its own "grid", as "grid" below)
 *        "grid": [[0, 2, 1], [1, 31, 32], [0, 1, 1]],
 *        "args": ["T", "value:4", "value:5", "value:6"]},
 *       ...
 *     ]
 *   }
 *
 * A grid dimension [t, c, div] is ceil((T * t + c) / div) blocks, T being the
 * tokens of the step; "block" is threads per block (x only). Arguments, in
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
 *
 * Prefix: krt_.
 */
#ifndef KILN_CUDA_META_H
#define KILN_CUDA_META_H

#include <stdint.h>

#include "support/support.h"

#define KRT_CUDA_META_FORMAT "kiln-cuda-1"
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
    KRT_CUDA_ARG_COUNT
} krt_cuda_arg_kind;

typedef struct krt_cuda_arg {
    krt_cuda_arg_kind kind; /* what the parameter receives */
    int64_t index;          /* value or layer number for VALUE, KV_K, KV_V; 0 otherwise */
} krt_cuda_arg;

enum { KRT_CUDA_MAX_ARGS = 24 };

typedef struct krt_cuda_kernel {
    const char *name;                    /* the kernel's function name, e.g. "k6_matmul" */
    const char *name_large;              /* launched instead when T > large_above; NULL: name for every T */
    int64_t large_above;                 /* tokens a step above which name_large runs */
    int has_grid_large;                  /* 1: name_large runs on grid_large; 0: on grid */
    int64_t grid_large[3][3];            /* name_large's grid, as grid */
    uint32_t node;                       /* the graph node it computes */
    int block;                           /* threads per block */
    int64_t grid[3][3];                  /* per grid dim: {t, c, div}: ceil((T*t + c) / div) */
    int n_args;                          /* parameters */
    krt_cuda_arg args[KRT_CUDA_MAX_ARGS]; /* in parameter order */
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
} krt_cuda_meta;

/* The JSON text of meta (appended to out); deterministic. */
void krt_cuda_meta_write(const krt_cuda_meta *meta, ks_buf *out);

/* Parse the JSON text; checks the structure, not the graph (the backend
 * checks node and layer numbers against its graph). Returns 0, or -1 after
 * reporting against `what`. Free with krt_cuda_meta_free. */
int krt_cuda_meta_parse(const char *text, size_t len, const char *what, krt_cuda_meta *meta, ks_diag *d);
void krt_cuda_meta_free(krt_cuda_meta *meta);

/* Grid dimension i of kernel k for a step of T tokens (of name_large's grid when that runs). */
int64_t krt_cuda_grid_dim(const krt_cuda_kernel *k, int i, int64_t T);

/* The spelling of an argument in the meta ("value:6"), into b. */
void krt_cuda_arg_format(const krt_cuda_arg *a, ks_buf *b);

#endif
