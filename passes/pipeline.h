/*
 * pipeline.h — kiln's graph passes and the pass manager that runs them.
 *
 * The pipeline is one explicit list (kp_passes, in passes/pipeline.c), read
 * top to bottom as QBE's main.c reads; each pass rewrites the graph into a
 * new one (passes/rewrite.h) and the manager can check the result between
 * passes (TVM's PassInstrument) and hand it to a hook, which is how the CLI
 * dumps the IR after a pass:
 *
 *     kp_options opt = {.verify = 1, .after = dump_ir, .after_ctx = &cli};
 *     kp_pass_stats *st = NULL;
 *     size_t n_st = 0;
 *     if (kp_run_pipeline(&g, &opt, &st, &n_st, diag) != 0) ...   // reported
 *     for (size_t i = 0; i < n_st; i++)
 *         printf("%-22s %zu -> %zu nodes, %zu fusions\n", st[i].pass, ...);
 *     printf("%zu kernels\n", kp_count_kernels(g));
 *     free(st);
 *
 * The last pass, plan_memory, places every activation of a step in one
 * arena (passes/plan_memory.h) for steps of up to opt->max_tokens tokens;
 * it must come last, as any pass after it would change what it planned.
 *
 * What the passes make of a graph: fused matmuls over derived weights
 * (passes/derived_weight.h), KV-cache writes split off attention into
 * kv_write nodes, and `fuse=<id>` attributes that gather the nodes of one
 * kernel. A group's nodes are contiguous in the schedule; ids are dense
 * from 0 in schedule order after every pass. A group holds at most one
 * anchor (a matmul or an attention), a norm only as the prologue of its
 * matmul or beside no anchor at all, and elementwise, view and kv_write
 * nodes. kir_verify checks these rules; the interpreter ignores `fuse`.
 * Deleting `fuse` attributes from a dump undoes those fusions.
 *
 * Prefix: kp_ (passes).
 */
#ifndef KILN_PASSES_PIPELINE_H
#define KILN_PASSES_PIPELINE_H

#include <stddef.h>

#include "ir/ir.h"
#include "support/support.h"

/* What one pass did (for `kiln build --stats`). */
typedef struct kp_pass_stats {
    const char *pass;      /* the pass's name (static text) */
    size_t nodes_before;   /* nodes of the graph it was given */
    size_t nodes_after;    /* nodes of the graph it made */
    size_t kernels_before; /* kp_count_kernels of the graph it was given */
    size_t kernels_after;  /* kp_count_kernels of the graph it made */
    size_t fusions;        /* rewrites made: matmuls merged (one per set of siblings), kv_writes split off,
                              groups formed or grown; 0 for eliminate_dead_nodes (see the node counts) */
} kp_pass_stats;

typedef struct kp_options kp_options;

/* A pass: replaces *g with the rewritten graph (freeing the old one) and
 * fills st->fusions; opt holds the build's settings a pass may need (the
 * memory plan's tokens). Returns 0, or -1 after reporting through d. */
typedef int (*kp_pass_fn)(kir_graph **g, const kp_options *opt, kp_pass_stats *st, ks_diag *d);

typedef struct kp_pass {
    const char *name;    /* as --passes and --disable-pass spell it */
    const char *summary; /* one line, for --help and --stats */
    kp_pass_fn run;      /* the transform */
} kp_pass;

/* The pipeline, in order. */
extern const kp_pass kp_passes[];
extern const size_t kp_pass_count;

/* The pass named `name`, or NULL. */
const kp_pass *kp_pass_find(const char *name);

/* Called after each pass with the graph it made; return 0 to go on, or -1
 * (after reporting through d) to stop the pipeline with an error. */
typedef int (*kp_after_pass_fn)(void *ctx, const kp_pass *pass, const kir_graph *g, const kp_pass_stats *st,
                                ks_diag *d);

struct kp_options {
    const char *const *passes;   /* passes to run, in this order; NULL: the whole pipeline. An entry may be
                                    a comma-separated list ("fuse_epilogues,eliminate_dead_nodes") */
    size_t n_passes;             /* entries in passes */
    const char *const *disabled; /* passes to leave out (entries as in passes) */
    size_t n_disabled;           /* entries in disabled */
    int verify;                  /* 1: kir_verify the input and the graph after every pass (builds without
                                    NDEBUG always do) */
    kp_after_pass_fn after;      /* hook after each pass, or NULL */
    void *after_ctx;             /* its context */
    const char *what;            /* names the run in messages; NULL: "kiln" */
    int64_t max_tokens;          /* plan_memory: the most tokens a step may have, which the plan holds
                                    (the build's --max-tokens); 0: no plan (plan_memory leaves the graph) */
    kir_word quant;              /* quantize: the scheme (--quant), a KIR_QUANT_* word but NONE; any other
                                    value (0, KIR_QUANT_NONE) leaves the graph untouched */
    int64_t quant_group;         /* quantize: the columns a scale covers; 0: the scheme's (w4a16 128, else a row) */
    int quant_asym;              /* quantize: 1 zero points, -1 none, 0 the scheme's (w4a16 with, else without) */
    kir_word quant_smooth;       /* quantize: KIR_SMOOTH_AWQ or _SMOOTHQUANT smooths the matmuls after a norm
                                    (--calib); KIR_SMOOTH_NONE (or 0) none */
    const char *const *quant_skip; /* quantize: globs of weight names left in 16 bits (--quant-skip) */
    size_t n_quant_skip;         /* entries in quant_skip */
    kir_dtype kv_dtype;          /* quantize_kv: KIR_I8 or KIR_F8E4M3, the KV cache's codes (--kv-dtype);
                                    KIR_F32 (0): the cache as lower_precision leaves it */
    kir_dtype compute_dtype;     /* lower_precision: KIR_BF16 or KIR_F16 stores values between kernels in
                                    that dtype (--precision fast); KIR_F32 (0): exact, the graph untouched */
};

/* Run the passes over *g, replacing it. A memory plan *g carries (ir/plan.h)
 * is dropped when any pass runs: it was made for the graph before. *stats receives one entry per pass
 * run (caller frees; may be NULL to not collect them). A name that is no
 * pass is the user's error:
 *   kiln: error: unknown pass 'fuse_qkv' (the passes: fuse_sibling_matmuls, ...)
 * A graph that fails kir_verify after a pass is kiln's bug: its messages,
 * then "kiln: error: the graph after pass X does not verify". Returns 0, or
 * -1 after reporting; on error *g is the graph of the last pass that ran. */
int kp_run_pipeline(kir_graph **g, const kp_options *opt, kp_pass_stats **stats, size_t *n_stats, ks_diag *d);

/* Kernels a backend launches for g: its groups plus the nodes in no group
 * that compute (not inputs, weights, the output or reshapes, which are
 * views). */
size_t kp_count_kernels(const kir_graph *g);

/* ---- the passes, each in its own file -------------------------------------------------- */
int kp_fuse_sibling_matmuls(kir_graph **g, const kp_options *opt, kp_pass_stats *st, ks_diag *d); /* passes/fuse_sibling_matmuls.c */
int kp_quantize(kir_graph **g, const kp_options *opt, kp_pass_stats *st, ks_diag *d);              /* passes/quantize.c */
int kp_split_kv_write(kir_graph **g, const kp_options *opt, kp_pass_stats *st, ks_diag *d);       /* passes/split_kv_write.c */
int kp_fuse_epilogues(kir_graph **g, const kp_options *opt, kp_pass_stats *st, ks_diag *d);       /* passes/fuse_epilogues.c */
int kp_fuse_norm_prologue(kir_graph **g, const kp_options *opt, kp_pass_stats *st, ks_diag *d);   /* passes/fuse_norm_prologue.c */
int kp_fuse_add_norm(kir_graph **g, const kp_options *opt, kp_pass_stats *st, ks_diag *d);        /* passes/fuse_add_norm.c */
int kp_eliminate_dead_nodes(kir_graph **g, const kp_options *opt, kp_pass_stats *st, ks_diag *d); /* passes/eliminate_dead_nodes.c */
int kp_lower_precision(kir_graph **g, const kp_options *opt, kp_pass_stats *st, ks_diag *d);      /* passes/lower_precision.c */
int kp_quantize_kv(kir_graph **g, const kp_options *opt, kp_pass_stats *st, ks_diag *d);           /* passes/quantize_kv.c */
int kp_share_kv(kir_graph **g, const kp_options *opt, kp_pass_stats *st, ks_diag *d);              /* passes/share_kv.c */
int kp_fuse_rows(kir_graph **g, const kp_options *opt, kp_pass_stats *st, ks_diag *d);            /* passes/fuse_rows.c */
int kp_fuse_norm_rope(kir_graph **g, const kp_options *opt, kp_pass_stats *st, ks_diag *d);       /* passes/fuse_norm_rope.c */
int kp_plan_memory_pass(kir_graph **g, const kp_options *opt, kp_pass_stats *st, ks_diag *d); /* passes/plan_memory.c */

#endif
