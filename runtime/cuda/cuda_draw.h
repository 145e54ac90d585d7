/*
 * cuda_draw.h — drawing next tokens on the GPU: the kernel's CUDA C source
 * and the record it reads and writes. The code generator appends the source
 * to every CUDA engine's kernels (codegen/cuda/kcu_build.c), so its cubins
 * hold `krt_draw` beside the graph's kernels; the CUDA backend launches it
 * after a step's kernels when the caller wants ids rather than logits, and
 * only the records come back.
 *
 * A row with a NaN or infinite logit draws no id (-1), as the session's
 * host draws do: the model has failed, and the caller reports it.
 * Otherwise the rules are runtime/text/sampler.c's, without the repetition
 * penalty: temperature 0 is the arg max (the lowest id among equals); else the logits are divided by the temperature
 * (in float, as there), the top_k best kept (ties to the lower id), a
 * softmax in double, the top_p nucleus (the most likely ids while the mass
 * before each is below top_p), and one uniform double from the caller's
 * xorshift64* state, taken only when more than one id is left. With the same
 * state the GPU draws the CPU sampler's id except where a draw lands within
 * rounding of a boundary between two ids (the sums are added in another
 * order), and it always draws the same id for the same logits and state.
 *
 * How, in one block of KRT_CUDA_DRAW_THREADS threads per row and no sort:
 * each logit becomes a 64-bit key, (its order-preserving float bits << 32)
 * | (2^32 - 1 - id), so that a larger key is a better candidate and keys are
 * distinct; NaN and -inf get key 0. Every cut (the k-th key, the nucleus's
 * last key, the key drawn) is "the largest key c whose mass at or above c
 * passes a test", a monotone search done four bits per pass over the row:
 * 16 passes, each a sweep that sums, per thread, the weight above the
 * current prefix and per next digit, then a fixed-tree block reduction. No
 * atomics: the same inputs give the same bits.
 *
 * Prefix: krt_cuda_.
 */
#ifndef KILN_CUDA_DRAW_H
#define KILN_CUDA_DRAW_H

#include <stdint.h>

#define KRT_CUDA_DRAW_KERNEL "krt_draw" /* the kernel's name in the cubin */
enum { KRT_CUDA_DRAW_THREADS = 256 };   /* threads per block, one block per row */

/* One row's draw, as the kernel's `krt_draw_row` (same layout: 24 bytes).
 * Kernel parameters, in order: int n (rows), const float *logits, int vocab,
 * const int *rows ([n] the logits row of each draw), krt_draw_row *draws
 * ([n]), unsigned long long *keys and double *mass (scratch, [n * vocab]
 * each). Grid: n blocks. */
typedef struct krt_cuda_draw_row {
    float temperature; /* in: 0 greedy */
    int32_t top_k;     /* in: 0 all */
    float top_p;       /* in: 1 all */
    int32_t id;        /* out: the id drawn, -1 when a logit is NaN or infinite */
    uint64_t rng;      /* in/out: the xorshift64* state */
} krt_cuda_draw_row;

/* The kernel's CUDA C (a translation unit's tail: no includes). */
extern const char krt_cuda_draw_source[];

#endif
