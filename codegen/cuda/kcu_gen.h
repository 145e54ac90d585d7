/*
 * kcu_gen.h — the CUDA code generator's working state and the helpers its
 * emitters share (internal to codegen/cuda: kcu_emit.c lowers the graph,
 * kcu_emit_attention.c the KV cache and attention, kcu_gen.c writes kernels
 * and their launch records).
 *
 * A kernel is written in three steps: kcu_kernel_new starts its launch
 * record, kcu_param_in/kcu_param_out/kcu_add_param add parameters (each
 * with what the runtime passes), kcu_open_body writes the signature, the
 * emitter appends the body to x->body, and kcu_kernel_end names it — or
 * finds the same text already written and launches that (kernels are
 * shared by text). Text a kernel needs before its signature (helpers,
 * tables) goes into x->body first, its names prefixed with NAME_MARK.
 *
 * Prefix: kcu_.
 */
#ifndef KILN_KCU_GEN_H
#define KILN_KCU_GEN_H

#include "codegen/cuda/kcu.h"

/* Threads per block of elementwise kernels. */
enum { EW_THREADS = 256 };
/* Matmuls (kcu_matmul in kcu_prelude.cuh, whose KCU_MM_THREADS, KCU_GEMV_T
 * and KCU_MM_GRID_COLS these repeat): threads per block, the most tokens of
 * the decode path, and columns a block of the prefill path's grid (the
 * decode path's: kcu_gemv_plan). */
enum { MM_THREADS = 256, MM_GEMV_T = 8, MM_GRID_COLS = 16 };
/* The grouped matmul of a mixture of experts (kcu_moe_matmul in kcu_prelude.cuh, whose KCU_MOE_BW,
 * KCU_MOE_BK and kcu_moe_pipe's stages these repeat): weight rows a tile, k a stage; routed rows a
 * tile of its decode kernel (steps of up to kcu_decode_t tokens) and of its _large one. */
enum { MOE_BW = 64, MOE_BK = 64, MOE_BT_DECODE = 16, MOE_BT_LARGE = 64 };
/* The dynamic shared memory of a grouped matmul with bt routed rows a tile, bytes: its ring's stages
 * (kcu_moe_pipe: 8 for a decode step's 16 rows, 4 for a prompt's 64) of weights and rows. */
static inline int kcu_moe_smem(int bt) { return (bt <= 16 ? 8 : 4) * (MOE_BW + bt) * MOE_BK * 2; }
/* Kernels in a graph at most (a named limit for the growing arrays). */
#define KCU_MAX_KERNELS ((size_t)1 << 24)
/* What a kernel's text calls itself until its name is known. */
#define NAME_MARK "@K@"

/* A kernel text already in the source. */
typedef struct kcu_body {
    uint64_t hash;    /* of its text with NAME_MARK for the name */
    const char *name; /* the name it was given (meta arena) */
    size_t at, len;   /* its text in kcu_gen.texts */
} kcu_body;

typedef struct kcu_gen {
    const kir_graph *g;    /* the graph */
    ks_buf *src;           /* the source being written */
    krt_cuda_meta *meta;   /* kernels, aliases and output being filled */
    size_t cap_kernels;    /* capacity of meta->kernels */
    uint32_t *root;        /* [n_nodes] the value whose buffer holds each value (itself unless aliased) */
    ks_buf params;         /* the current kernel's parameter list */
    ks_buf body;           /* the current kernel's text, named NAME_MARK */
    ks_buf texts;          /* the texts of bodies[], one after another */
    kcu_body *bodies;      /* the distinct kernels written to src */
    size_t n_bodies;       /* how many */
    size_t cap_bodies;     /* capacity of bodies */
    ks_diag *d;            /* where errors go */
    int64_t large;         /* > 0: the kernel being written has a _large variant for steps above this many tokens */
    kcu_options opt;       /* the generator's choices (kcu.h) */
    kir_val *ahead;        /* [n_nodes] the weight of the first matmul after each node, KIR_NONE where a routed
                            * expert_matmul comes first or none does (kcu_emit's next_weights): what a kernel
                            * that streams no weights itself prefetches into L2 (kcu_l2_ahead) */
} kcu_gen;


/* ---- messages and literals ---------------------------------------------------------- */
/* Report an error at node v's source place ("cuda: <op>: ..."); returns -1. */
int kcu_node_error(kcu_gen *x, kir_val v, const char *fmt, ...) KS_PRINTF(3, 4);
/* A float as a C++ literal that reads back to the same float (0.25f). */
void kcu_put_float(ks_buf *b, float f);
/* A double as a literal that reads back exactly. */
void kcu_put_double(ks_buf *b, double v);
/* 1: t is bf16 or f16 (a half dtype). */
int kcu_is_half(kir_dtype t);
/* Whether a matmul of x (dtype xt; ot: its fused norm's values, else xt) and weights of dtype wt over
 * K takes the tensor-core decode kernel (kcu_matmul_tc; kcu_emit.c). */
int kcu_use_tc(const kcu_gen *x, kir_dtype xt, kir_dtype ot, kir_dtype wt, int64_t K);
/* The most tokens a step of the matmuls' decode kernels: KCU_DECODE_T, or MM_GEMV_T with
 * kcu_options.batch_variant. */
int64_t kcu_decode_t(const kcu_gen *x);
/* The device type of elements of dtype t ("float", "kcu_bf16", ...). */
const char *kcu_elem_type(kir_dtype t);

/* ---- quantized matmuls (kcu_emit.c) ----
 * A matmul over a quantized weight (ir/quant.h) runs kcu_matmul_q (kcu_prelude.cuh) in both of its
 * kernels (kcu.h's kcu_qmatmul_supported says which have it); kcu_qmatmul_params adds its scale
 * ("qs") and zero-point ("qz") parameters after x and w; kcu_put_qmatmul writes the call, R columns a
 * warp, in the decode kernel or the prefill one (prefill), with epilogue expression epi. */
void kcu_qmatmul_params(kcu_gen *x, krt_cuda_kernel *k, kir_val mm);
void kcu_put_qmatmul(kcu_gen *x, kir_val mm, int R, int prefill, const char *pro, const char *epi);
/* Reading and writing values in their dtypes: "%s<element>%s" with
 * kcu_ld(t), kcu_ld_end(t) is the element of a value of dtype t as f32
 * (kcu_f() around a half; nothing around f32, so that the kernels of f32
 * values read as they always have); kcu_put_store writes the statement
 * that stores f32 expression v at lvalue lhs in dtype t ("lhs = v;", or
 * "kcu_put(&lhs, v);" rounding to a half), after indent, with a newline. */
const char *kcu_ld(kir_dtype t);
const char *kcu_ld_end(kir_dtype t);
void kcu_put_store(ks_buf *b, kir_dtype t, const char *indent, const char *lhs, const char *v);
/* ir/ops.def's formula of unary op `op` over `operand` (kir_formula_write), except where fast
 * precision (half != 0) has a device form of its own in the prelude (kcu_silu_half: the SFU's
 * exp2 and reciprocal; its result is rounded to bf16 or f16 next). */
void kcu_formula_write(kir_op op, int half, const char *operand, ks_buf *out, int *in_double, const char **what);
/* The unary ops whose arithmetic reads attributes (scale and its shift, clamp's bounds): node v's
 * expression over the f32 expression `in` into out, as the interpreter computes it; returns what it
 * computes (for comments), or NULL (nothing written) for the other ops (kcu_formula_write's). */
const char *kcu_attr_unary_write(const kir_graph *g, kir_val v, const char *in, ks_buf *out);
/* ROPE node v's attention factor (yarn's) on a rotation's cosine and sine, the float variables c and
 * s: `c *= af, s *= af;` as the interpreter scales them; nothing when it is 1. */
void kcu_rope_factor(const kir_graph *g, kir_val v, const char *indent, const char *c, const char *s, ks_buf *out);
/* The last dim of a node. */
static inline int64_t kcu_last_dim(const kir_node *n) { return n->dims[n->ndim - 1]; }

/* The rotation frequencies of rope node v (rot of its dims rotated) for a
 * sequence seq_len long (kir_rope_inv_freq: 1 for a rotation whose
 * frequencies do not follow the length) as a device table
 * NAME_MARK_inv_freq<suffix>, appended to b. */
void kcu_put_rope_table(kcu_gen *x, ks_buf *b, kir_val v, int64_t rot, int64_t seq_len, const char *suffix);
/* `__device__ const float NAME_<name>[n] = {...}` into b, after a comment: a kernel's table of floats
 * (NAME_MARK's prefix: the kernel's name), written before its signature. */
void kcu_put_float_table(ks_buf *b, const char *comment, const char *name, const float *v, int64_t n);

/* ---- kernels and their parameters ---------------------------------------------------------- */
/* Start the launch of a kernel computing node v, `block` threads a block. */
krt_cuda_kernel *kcu_kernel_new(kcu_gen *x, kir_val v, int block);
/* Grid dim i: ceil((T * t + c) / div) blocks. */
void kcu_kernel_grid(krt_cuda_kernel *k, int i, int64_t t, int64_t c, int64_t div);
/* Grid dim i of the kernel's _large variant (after kcu_open_large; the
 * other dims: ceil(T * 0 + 1) = 1 unless set), as kcu_kernel_grid. */
void kcu_kernel_grid_large(krt_cuda_kernel *k, int i, int64_t t, int64_t c, int64_t div);
/* Grid dim i, of both variants: at most cap blocks (after kcu_kernel_grid and kcu_kernel_grid_large). */
void kcu_kernel_grid_cap(krt_cuda_kernel *k, int i, int64_t cap);
/* A matmul kernel's grids for N columns: the decode kernel's by plan p,
 * the _large one's ceil(N / MM_GRID_COLS) (recorded apart only when they differ). */
void kcu_matmul_grids(krt_cuda_kernel *k, int64_t N, const kcu_gemv_plan *p);
/* Append a parameter: its C declaration and what the runtime passes. */
void kcu_add_param(kcu_gen *x, krt_cuda_kernel *k, krt_cuda_arg_kind kind, int64_t index, const char *decl);
/* Value v as a read-only parameter called name, of its dtype. */
void kcu_param_in(kcu_gen *x, krt_cuda_kernel *k, kir_val v, const char *name);
/* Value v's buffer, written, as the parameter `out` (of v's dtype). */
void kcu_param_out(kcu_gen *x, krt_cuda_kernel *k, kir_val v);
/* The signature, with a comment saying what the kernel computes. */
void kcu_open_body(kcu_gen *x, krt_cuda_kernel *k, const char *what);
/* The same for a kernel compiled to fit min_blocks blocks an SM (__launch_bounds__'s second
 * argument; 0: none). */
void kcu_open_body_min(kcu_gen *x, krt_cuda_kernel *k, const char *what, int min_blocks);
/* The same with attr (e.g. "KCU_CLUSTER_Z(8)", NULL: none) between the launch bounds and the name. */
void kcu_open_body_attr(kcu_gen *x, krt_cuda_kernel *k, const char *what, int min_blocks, const char *attr);
/* kcu_open_body_min's for a kernel whose body is a call of kcu_matmul_tc: its KCU_PDL_ENTER is
 * kcu_matmul_tc's own, after the L2 prefetch of its first weights (kcu_tc_prefetch). */
void kcu_open_body_tc(kcu_gen *x, krt_cuda_kernel *k, const char *what, int min_blocks);
/* After the kernel's body: the signature of its variant NAME_large, the
 * kernel launched instead for steps of more than `above` tokens (the body
 * follows, then kcu_kernel_end records both). */
void kcu_open_large(kcu_gen *x, const krt_cuda_kernel *k, int64_t above);
/* The body is complete: name the kernel (or reuse the same text); suffix
 * follows the op in the name. */
void kcu_kernel_end(kcu_gen *x, krt_cuda_kernel *k, const char *suffix);
/* One thread per element of T * row elements (EW_THREADS a block); the
 * prologue defines i and returns past the end. */
krt_cuda_kernel *kcu_elementwise_kernel(kcu_gen *x, kir_val v, int64_t row);
void kcu_elementwise_prologue(kcu_gen *x, int64_t row);

/* ---- emitters in other files ---------------------------------------------------------------- */
/* kcu_emit.c: the kernel of norm node v alone (rms_norm, layer_norm; also the first launch of a
 * fused group's gemm90 variant, which reads the norm's value back through a tensor map). */
int kcu_emit_norm(kcu_gen *x, kir_val v);
/* kcu_emit_moe.c: the kernel of a routing node (sum, topk, gather, expert_matmul, expert_sum) alone. */
int kcu_emit_moe(kcu_gen *x, kir_val v);
/* kcu_emit_moe.c: one kernel for a fusion group anchored at a routed expert_matmul (nodes[0]): a grouped
 * matmul when it is a SwiGLU over a merged gate and up (kcu_moe_swiglu); or at expert_sum: the weighted
 * sum and the residual add; 0 (nothing written: node by node) otherwise. kcu_emit_group's contract. */
int kcu_emit_moe_group(kcu_gen *x, const kir_val *nodes, int count, const uint8_t *read_outside);
/* kcu_emit_moe.c: one kernel, a warp a token, for a group of row ops (passes/fuse_rows.c: softmax, topk,
 * gather, sum, elementwise) computing each value as its node's kernel would, rounded to its dtype;
 * 0 (nothing written) when a member is not one it computes. kcu_emit_group's contract. */
int kcu_emit_row_group(kcu_gen *x, const kir_val *nodes, int count, const uint8_t *read_outside);
/* kcu_emit_attention.c: the kernel writing K and V rows (values kv, vv) of a
 * step into layer `layer` of the cache, for node v; and attention. */
void kcu_emit_kv_write_kernel(kcu_gen *x, kir_val v, const char *suffix, kir_val kv, kir_val vv, int64_t layer);
int kcu_emit_attention(kcu_gen *x, kir_val v);
/* kcu_emit_group.c: one kernel for the fusion group nodes[0..count) (in
 * graph order); read_outside[v] is 1 when a kernel outside the group reads
 * value v. Returns 1 when written, 0 when the group does not qualify
 * (nothing written: emit its nodes one by one), -1 after reporting. */
int kcu_emit_group(kcu_gen *x, const kir_val *nodes, int count, const uint8_t *read_outside);

#endif
