/*
 * verify.h — `kiln verify`: find where a fused graph diverges from the
 * unfused one. Both run the same steps (two sequences mixed in one prefill
 * step, then decode steps of both); every value that exists in both graphs
 * is compared as it is computed, and the logits are compared at the end of
 * each step (max |d|, relative error, KL divergence of the next-token
 * distributions).
 *
 * Values correspond by their place in the .kiln text and their layer: the
 * key of a node is its location and the number of attention ops before it;
 * of the nodes with one key, the last in schedule order stands for the
 * expression's value (a fused graph's slice of a merged matmul stands for
 * the matmul it replaced). Values whose shapes differ are not compared.
 *
 * The fused side runs in the interpreter (kd_verify_graphs), or as an
 * engine through its backend (kd_verify_engine: `kiln verify --target
 * sm_90` runs the CUDA engine on the GPU), which shows the values it
 * computes to the same tap (runtime/backend.h's set_tap).
 *
 * Prefix: kd_ (driver).
 */
#ifndef KILN_VERIFY_H
#define KILN_VERIFY_H

#include <stdint.h>
#include <stdio.h>

#include "ir/ir.h"
#include "runtime/engine.h"

typedef struct kd_verify_opts {
    double tolerance;   /* a value diverges when max|d| > tolerance * max|reference|; < 0: kd_verify_model's
                           default for the precision (1e-4 exact; half: kd_verify_half_tolerance) */
    const char *why;    /* what the tolerance stands for, said in the report; NULL: nothing */
    int prompt_tokens;  /* tokens of the first sequence's prompt (the second gets half) */
    int decode_steps;   /* decode steps after the prefill */
    uint64_t seed;      /* for the prompt's token ids */
    FILE *out;          /* the report; NULL: none */
} kd_verify_opts;

typedef struct kd_verify_result {
    int compared;             /* values compared (pairs of nodes) */
    int diverged;             /* 1 when some value or the logits went past the tolerance */
    kir_val first;            /* the first diverging value of the reference graph (schedule order) */
    double first_error;       /* its relative error */
    double logits_max_abs;    /* largest |d| over all logits of all steps */
    double logits_max_rel;    /* largest max|d| / max|reference| over the logit rows */
    double logits_max_kl;     /* largest KL(reference || test) of a row's softmax */
} kd_verify_result;

/* Before anything is built: the target is one kiln builds for
 * (compiler/targets.h), and, when its fused side runs on a device (a CUDA
 * target, sm_XX), the device's driver loads: a machine without one hears
 * it at once, in the backend's words, not after the kernels are compiled.
 * 0, or -1 after reporting. */
int kd_verify_check_target(const char *target, ks_diag *d);

struct kd_inputs;
struct kd_model;
/* The whole of `kiln verify` for a loaded and optimized model (compiler/
 * driver.h): the reference is m's compiled (unfused) graph in the
 * interpreter (with --precision fast, lowered as lower_precision lowers
 * it: every value it computes rounded to the half dtype, the logits f32);
 * the fused side is m's optimized graph in the interpreter
 * for the CPU target, or, for another target, an engine built for it (in a
 * temporary folder, removed after) and run through its backend. Writes the
 * report to o->out. Returns 0 when the comparison ran (see r->diverged), -1
 * after reporting. */
int kd_verify_model(const struct kd_inputs *in, struct kd_model *m, const kd_verify_opts *o, kd_verify_result *r,
                    ks_diag *d);

/* The default tolerance of a fast-precision comparison in half dtype t
 * (bf16, f16), and its reason into why (cap bytes). */
double kd_verify_half_tolerance(kir_dtype t, char *why, size_t cap);

/* Compare test (fused) against ref (unfused). weights[v] is the f32 data of
 * each graph's WEIGHT node v. Returns 0 when the comparison ran (see
 * r->diverged), -1 after reporting an error running either graph. */
int kd_verify_graphs(const kir_graph *ref, const void *const *ref_weights, const kir_graph *test,
                     const void *const *test_weights, const kd_verify_opts *o, kd_verify_result *r, ks_diag *d);

/* The same, with the test side an engine (its graph and weights) run through
 * its backend, which must be able to show its values (a tap). */
int kd_verify_engine(const kir_graph *ref, const void *const *ref_weights, const krt_engine *test,
                     const kd_verify_opts *o, kd_verify_result *r, ks_diag *d);

#endif
