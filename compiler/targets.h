/*
 * targets.h — what `kiln build --target` builds for, as a table of
 * functions (as the runtime's backends are: runtime/backend.h). The driver
 * asks the table for the target a --target value names and never tests
 * which one it has: a new target (HIP, the CPU through LLVM) is one entry.
 *
 *     const kd_target *t = kd_target_for("sm_80,sm_90", diag);   // NULL: reported, with the known ones
 *     kd_target_parts parts = {0};
 *     if (t->build && t->build(graph, "sm_80,sm_90", &opts, &parts, diag) != 0) ...
 *     // parts.sections go into the engine; parts.meta_list under parts.meta_key into its metadata
 *     kd_target_parts_free(&parts);
 *
 * Prefix: kd_.
 */
#ifndef KILN_COMPILER_TARGETS_H
#define KILN_COMPILER_TARGETS_H

#include "ir/ir.h"
#include "runtime/engine.h"
#include "support/support.h"

/* What a build adds to the engine for its target. */
typedef struct kd_target_parts {
    const krt_engine_section *sections; /* [n_sections] the backend's code and tables */
    size_t n_sections;                  /* how many */
    const char *meta_key;               /* a key of the engine's metadata the target fills ("cuda_archs"), or NULL */
    const char *const *meta_list;       /* [n_meta_list] its strings */
    int n_meta_list;                    /* how many */
    void *impl;                         /* the target's own (freed by kd_target_parts_free) */
    void (*free_impl)(void *impl);      /* how */
} kd_target_parts;

/* Settings of a build the targets read. */
typedef struct kd_target_opts {
    const char *emit_dir;  /* write the generated source here too, or NULL */
    void (*on_step)(void *ctx, const char *what); /* a slow step begins (NVRTC), or NULL */
    void *on_step_ctx;     /* its context */
    FILE *stats_out;       /* --stats: the target's per-shape choices (tiles) are printed here, or NULL */
} kd_target_opts;

typedef struct kd_target {
    const char *name;      /* the engine metadata's "target": the runtime picks its backend by it */
    const char *spelling;  /* what --target takes, for messages: "cpu", "sm_XX[,sm_YY...]" */
    /* 1 when the --target value names this target */
    int (*matches)(const char *spec);
    /* Optional: generate and compile g for spec, filling parts. 0, or -1 after reporting. NULL: the
     * target needs nothing but the graph and the weights (the interpreter runs them). */
    int (*build)(const kir_graph *g, const char *spec, const kd_target_opts *o, kd_target_parts *parts,
                 ks_diag *d);
    int emits_source;      /* 1: --emit-source applies */
    /* Optional: can this machine run engines of the target (its driver loads)? 0, or -1 after reporting. */
    int (*check_runtime)(ks_diag *d);
} kd_target;

/* The targets, in the order messages list them. */
extern const kd_target kd_targets[];
extern const size_t kd_target_count;

/* The target spec names ("cpu" when spec is NULL), or NULL after reporting
 * `kiln: error: unknown target 'x' (known: cpu, or NVIDIA GPU architectures
 * such as sm_90 or sm_80,sm_90)`. */
const kd_target *kd_target_for(const char *spec, ks_diag *d);

void kd_target_parts_free(kd_target_parts *p);

#endif
