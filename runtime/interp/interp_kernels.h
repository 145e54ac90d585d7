/*
 * interp_kernels.h — private to the reference interpreter: what a kernel
 * sees of a step, and the one entry that runs a node's kernel.
 *
 * runtime/interp/interp.c binds every value to its data before the step (weights,
 * the step's inputs, places in the step's arena, the caller's output
 * buffer), allocates the scratch the kernels use (krt_interp_scratch, sized
 * here) and checks the step (token ids, positions, sequences), so a kernel
 * cannot fail, out of memory included: it reads its operands and writes its
 * value, and allocates nothing. Weights
 * stay in their own dtype: a kernel that reads one (embed, matmul, the
 * second operand of add/sub/mul, a norm's weight and bias) loads it into
 * float32 as it goes (elem_f32 and load_f32 in interp_kernels.c).
 */
#ifndef KILN_RUNTIME_INTERP_KERNELS_H
#define KILN_RUNTIME_INTERP_KERNELS_H

#include "ir/numerics.h"
#include "runtime/interp/interp.h"

/* Per-node data prepared when the interpreter is created. */
typedef struct krt_interp_rope {
    float *inv_freq; /* [rot_dim/2] rotation frequencies, radians per position, as HF computes them */
    int rot_dim;     /* leading elements of each head that rotate; the rest pass through */
    int pairs;       /* 1: rotate (2j, 2j+1) (llama2.c); 0: (j, j+rot_dim/2) (HF rotate_half) */
    int by_length;   /* 1: longrope, dynamic: past short_up_to, a token's frequencies follow its seq_lengths */
    int64_t short_up_to; /* the longest sequence that inv_freq serves (by_length) */
} krt_interp_rope;

/* Where kernels put what they compute on the way: allocated before the step. */
typedef struct krt_interp_scratch {
    float *conv;      /* [conv] f16/bf16 weights read whole (a bias, a norm's weight), as float32 */
    float *tiles;     /* [threads * tile] one tile of a matmul's f16/bf16 weight as float32, per thread */
    size_t tile;      /* floats of one thread's tile */
    float *rope;      /* [rope] one position's cos and sin of each rotation, then its frequencies (by_length) */
    int64_t *slots;   /* [positions] attention: the cache rows of a token's positions */
    float *score;     /* [positions] attention: their scores, then weights */
} krt_interp_scratch;

/* The floats of the scratch's parts that g needs at most (they do not depend
 * on the step; the attention's grow with its positions, the largest + 1). */
void krt_interp_scratch_sizes(const kir_graph *g, size_t *conv, size_t *tile, size_t *rope);

typedef struct krt_interp_exec {
    const kir_graph *g;            /* the graph */
    int64_t n_tokens;              /* T of this step */
    const krt_step *step;          /* the step's tokens, positions and sequences */
    krt_kv *kv;                    /* the paged KV cache (NULL when the graph has no attention) */
    const float *const *src;       /* [n_nodes] f32 data of each computed value, to read; NULL for weights */
    const void *const *weights;    /* [n_nodes] data of WEIGHT nodes in their dtype (f32, f16, bf16),
                                      where they lie; NULL for other nodes */
    float *const *dst;             /* [n_nodes] where each computed value is written; NULL for weights, inputs */
    const int32_t *const *ints;    /* [n_nodes] data of each i32 value (the step's inputs); NULL otherwise */
    const krt_interp_rope *rope;     /* [n_nodes] prepared ROPE nodes; zeroed for other nodes */
    int n_threads;                 /* worker threads a large matmul may use (1: none); tiles for that many */
    const krt_interp_scratch *scratch; /* the kernels' scratch, sized by krt_interp_scratch_sizes */
} krt_interp_exec;

/* Compute value v of the step. */
void krt_interp_exec_node(const krt_interp_exec *x, kir_val v);


#endif
