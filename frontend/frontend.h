/*
 * frontend.h — from a .kiln model description, a Hugging Face config.json
 * and a checkpoint to a kir_graph plus the weight bindings that say where
 * each WEIGHT node's data comes from.
 *
 * Prefix: kf_.
 */
#ifndef KILN_FRONTEND_H
#define KILN_FRONTEND_H

#include <cjson/cJSON.h>

#include "frontend/checkpoint.h"
#include "ir/ir.h"
#include "support/support.h"

/* Where a WEIGHT node's data comes from. */
typedef struct kf_weight_binding {
    kir_val node;               /* the WEIGHT node in the graph */
    const char *tensor;         /* checkpoint tensor name chosen (first alternative present) */
    int transposed;             /* stored [in,out] (GPT-2 Conv1D): read transposed (3-D: each [in,out] of dim 0) */
    int row_dim;                /* 0: rows of dim 0; 1: of dim 1, for each index of dim 0 */
    int64_t row_start;          /* rows [row_start,row_end) of dim row_dim after transposition */
    int64_t row_end;            /* -1: all rows */
    int64_t row_step;           /* every row_step-th of them (1: each) */
    int64_t groups;             /* > 0: a 2-D tensor [A, C] read as [groups, A / groups, C] (rows of dim 1 each) */
    int transposed_after;       /* each index's rows of dim 1, then transposed (`[:, lo : hi].T`) */
    const char *const *parts;   /* {e} templates: [n_parts] tensors, one an expert, stacked along dim 0, each read
                                   as above (transposed, rows) as the weight's dims after the first; tensor is
                                   parts[0] */
    int64_t n_parts;            /* 0: the one tensor */
} kf_weight_binding;

typedef struct kf_model {
    ks_arena arena;             /* owns bindings and strings: the model's lifetime */
    kir_graph *graph;           /* owned */
    kf_weight_binding *weights; /* one per WEIGHT node that is not derived (a norm's offset:), in node order */
    size_t n_weights;           /* number of bindings */
} kf_model;

/* A .kiln model description shipped inside the kiln binary (models/ *.kiln). */
typedef struct kf_builtin_model {
    const char *file; /* e.g. "models/llama.kiln" */
    const char *text; /* whole text */
} kf_builtin_model;
extern const kf_builtin_model kf_builtin_models[];
extern const size_t kf_builtin_model_count;

/* A JSON document a description reads: config.json through `config.a.b`
 * paths, generation_config.json through `generation.a.b`. */
typedef struct kf_json_doc {
    const cJSON *root; /* the parsed document; NULL: absent (every key in it is missing) */
    ks_source src;     /* src.name names it in messages; src.text, when not NULL, is the text root
                          was parsed from: messages about a value then point at it with a caret */
} kf_json_doc;

/* Compile a .kiln text against config (config.json; may be NULL, or hold
 * no root, when the description needs no config key), generation
 * (generation_config.json, or NULL when there is none: its keys are then
 * missing, for `??` to fall back) and checkpoint (may be NULL: then every
 * weight is taken as present with its declared shape, and optional weights
 * as absent; used by `kiln ir` without weights). A config that lacks a key
 * the description needs is an error at each place that reads it; with no
 * config at all, one error names the keys read (`t.kiln: error: the
 * description reads config.json keys (config.hidden_size, ...) but no
 * config was given`), followed by "; " and no_config_hint when that is not
 * NULL (the caller's way to give one). NULL after reporting. */
kf_model *kf_compile(const ks_source *kiln, const kf_json_doc *config, const kf_json_doc *generation,
                     const kf_checkpoint *ckpt, const char *no_config_hint, ks_diag *d);
void kf_model_free(kf_model *m);

/* The `model_type` values a .kiln text declares with `matches`; returns
 * 1 if model_type is among them. */
int kf_kiln_matches(const char *kiln_text, const char *model_type);

#endif
