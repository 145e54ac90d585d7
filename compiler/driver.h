/*
 * driver.h — the compile pipeline shared by the CLI commands and the tests:
 * find the model description and config for an input, open the checkpoint,
 * compile to a graph, and write an engine.
 *
 * Prefix: kd_ (driver).
 */
#ifndef KILN_DRIVER_H
#define KILN_DRIVER_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "compiler/progress.h"
#include "frontend/frontend.h"
#include "ir/quant.h"
#include "support/support.h"

typedef struct kd_inputs {
    const char *input;     /* a .kiln file or a checkpoint folder */
    const char *weights;   /* checkpoint folder or file, when input is a .kiln */
    const char *config;    /* config.json path, overriding the one beside the weights */
    const char *target;    /* "cpu" (default), or CUDA architectures "sm_80,sm_90" */
    const char *dtype;     /* what every weight is stored as: "f32", "bf16" or "f16"; NULL: as compiled
                              (f32), or as an --from-ir text declares them */
    const char *emit_source; /* CUDA targets: also write the generated .cu into this folder; or NULL */
    int synthetic;         /* the embedded default model (compiler/synthetic.h): no input */
    const char *passes;    /* comma-separated passes to run; NULL or "all": the pipeline; "none": none */
    const char *disabled;  /* comma-separated passes to leave out */
    const char *dump_after; /* pass names (comma-separated) or "all": dump the IR after them */
    const char *dump_dir;  /* where the dumps go, NN-pass.ir */
    const char *from_ir;   /* build this (edited) IR text instead of the compiled graph */
    int stats;             /* print per-pass statistics and the memory plan */
    FILE *stats_out;       /* where they go; NULL: standard output */
    int64_t max_tokens;    /* tokens per step the memory plan holds; 0: kd_plan_tokens's default */
    const char *precision; /* "exact" (values between kernels in f32) or "fast" (in the weights' half
                              dtype); NULL: kd_compute_dtype's default (fast for bf16/f16 weights) */
    const char *tokenizer; /* tokenizer file (tokenizer.json or llama2.c .bin); default:
                              tokenizer.json beside the weights, if any */
    const char *calib;     /* --calib: a text whose activations weigh the quantization (compiler/calibrate.c) */
    const char *kv_dtype;  /* --kv-dtype: int8 or fp8, the KV cache's codes (passes/quantize_kv.c); NULL: the
                              compute dtype's */
    const char *quant;     /* --quant: w4a16, w8a16, fp8 or w8a8 (passes/quantize.c); NULL: float weights */
    const char *quant_round;  /* --quant-round: gptq or rtn; NULL: gptq with --calib, else rtn */
    const char *quant_smooth; /* --quant-smooth: awq, smoothquant or none (compiler/smooth.c); NULL: the scheme's */
    int64_t quant_group;   /* --quant-group: columns a scale covers; 0: the scheme's */
    int quant_asym;        /* --quant-asym 1, --quant-sym -1; 0: the scheme's */
    const char *const *quant_skip; /* --quant-skip globs: weights left in 16 bits */
    size_t n_quant_skip;   /* entries in quant_skip */
    kd_progress *progress; /* where long steps show what they do (a terminal: compiler/progress.h), or NULL */
} kd_inputs;

/* A JSON document the description reads, with its text for messages. */
typedef struct kd_json {
    char *path;            /* owned; NULL when there is none */
    char *text;            /* owned; the text json was parsed from, or NULL (a llama2.c header) */
    size_t len;            /* bytes in text */
    cJSON *json;           /* parsed, or NULL when there is none */
} kd_json;

/* What kd_write_engine wrote. */
typedef struct kd_build_info {
    uint64_t bytes;     /* the engine file's size */
    const char *target; /* "cpu", or the CUDA architectures as given ("sm_80,sm_90") */
    const char *dtype;  /* the weights' dtype: "f32", "bf16", "f16" or "mixed" (static text) */
    int layers;         /* attention layers of the graph */
} kd_build_info;

typedef struct kd_model {
    ks_source kiln;        /* the model description (text owned unless builtin) */
    char *kiln_owned;      /* owned text, or NULL for a builtin description */
    kd_json config;        /* config.json (or a llama2.c checkpoint's header) */
    kd_json generation;    /* generation_config.json beside config.json, when there is one */
    kf_checkpoint *ckpt;   /* the open checkpoint, or NULL */
    kf_model *model;       /* compiled graph and weight bindings */
    kir_graph *optimized;  /* the graph after kd_optimize (owned), or NULL */
    int weight_dtype_given; /* 1: --dtype named the weights' dtype (parsed once, into weight_dtype) */
    kir_dtype weight_dtype; /* the weights' dtype when given */
    struct kd_calib *calib; /* --calib's statistics (compiler/calibrate.c), or NULL */
    struct kd_quant_cache *qcache; /* the last quantized weight's parts (compiler/optimize.c), owned */
    struct kd_smooth *smooth; /* the smoothing vectors computed (compiler/smooth.c), owned */
    int quant_rtn;            /* 1: quantize by round to nearest, not GPTQ (--quant-round rtn, or no --calib) */
} kd_model;

/* Resolve and compile. need_weights: open the checkpoint (a build) rather than
 * compile from shapes alone (`kiln ir` without weights). With in->dtype, the
 * compiled graph's WEIGHT nodes take that dtype (kd_set_weight_dtype). 0, or
 * -1 after reporting. */
int kd_model_load(const kd_inputs *in, int need_weights, kd_model *m, ks_diag *d);
void kd_model_free(kd_model *m);

/* The tokenizer a build packs (--tokenizer, tokenizer.json beside the weights, the default model's),
 * loaded; NULL when there is none (nothing reported) or after reporting a broken one (d->errors). */
struct krt_tok *kd_load_tokenizer(const kd_inputs *in, ks_diag *d);

/* ---- calibration (compiler/calibrate.c) ----
 * kd_calibrate runs in->calib's text through the reference interpreter over the compiled graph (its
 * weights as the build reads them) and keeps, for each matmul over a model weight, the mean square of
 * each column of its input: how much each input channel weighs in the product, which the quantization
 * of that weight (passes/quantize_weight.h: the clipping search) takes as each column's importance. */
int kd_calibrate(const kd_inputs *in, kd_model *m, ks_diag *d);
/* What the calibration saw of the input x [T,K] of the matmul over model weight `name`. */
typedef struct kd_calib_input {
    int64_t k;            /* K */
    const double *gram;   /* [K,K] the mean of x^T x (its diagonal: each column's mean square) */
    const double *meanabs; /* [K] the mean |x_k| */
    const float *absmax;  /* [K] max |x_k| */
} kd_calib_input;
/* Fills *out and returns 0, or -1 (zeros) without a calibration or such a matmul. */
int kd_calib_input_of(const kd_model *m, const char *name, kd_calib_input *out);
void kd_calib_free(struct kd_calib *c);

/* ---- smoothing (compiler/smooth.c) ----
 * The smoothing vector s [K] (ir/ops.def's SMOOTH words: awq, smoothquant) of the quantized weight
 * `name` whose float matrix is w ([q->rows, q->cols], layout q), from the calibration of its input
 * (the matmul over model weight `source`: its recipe's first source); computed once a build. NULL
 * without such a calibration. */
typedef struct kd_smooth kd_smooth;
kd_smooth *kd_smooth_new(void);
void kd_smooth_free(kd_smooth *c);
const float *kd_smooth_vector(const kd_model *m, const char *name, kir_word method, const kir_quant_layout *q,
                              const float *w, const char *source);
struct kd_quant_cache *kd_quant_cache_new(void);
void kd_quant_cache_free(struct kd_quant_cache *c);

/* The pass pipeline, a line per pass: its name and what it does. */
void kd_list_passes(FILE *out);

/* An IR text (an edited dump, kiln ir FILE.ir), parsed and verified (its
 * memory plan too); NULL after reporting at its file:line:col. */
kir_graph *kd_read_ir(const char *path, ks_diag *d);

/* The default of --max-tokens: a step of the whole context, but at most
 * this many tokens (a longer prompt is prefilled in steps of this size:
 * runtime/generate.h), so that the arena of a long-context model stays a
 * fraction of the device (Llama-3-8B at 2048 tokens: about 1 GiB). */
#define KD_PLAN_TOKENS_DEFAULT 2048

/* The tokens per step the memory plan holds: in->max_tokens when given,
 * else g's context (param max_context) up to KD_PLAN_TOKENS_DEFAULT. */
int64_t kd_plan_tokens(const kd_inputs *in, const kir_graph *g);

/* The dtype values between kernels are stored in (lower_precision): f32 for
 * in->precision "exact", the weights' dtype for "fast" (which needs them
 * all bf16 or all f16); NULL: fast when the weights are all bf16 or all
 * f16, else exact. 0, or -1 after reporting. */
int kd_compute_dtype(const kd_inputs *in, const kir_graph *g, kir_dtype *out, ks_diag *d);

/* Run the pass pipeline, plan_memory last (or read --from-ir, which gets
 * only a plan when it has none), dump and report as asked; the result
 * becomes the graph an engine is built from. */
int kd_optimize(const kd_inputs *in, kd_model *m, ks_diag *d);

/* The graph to build: the optimized one, else the compiled one. */
const kir_graph *kd_graph(const kd_model *m);

/* The binding of the compiled model's weight `name`, or NULL. */
const kf_weight_binding *kd_binding(const kd_model *m, const char *name);

/* The data of WEIGHT node `node` of g (a graph of this model, fused or
 * not) in the node's dtype: read from the checkpoint by its name (converted
 * through f32 from the checkpoint's dtype; to bf16 or f16 rounding to
 * nearest even), or derived from its sources' data (passes/derived_weight.h).
 * out holds kir_elems(node) elements of the node's dtype. */
int kd_weight_data(const kd_model *m, const kir_graph *g, kir_val node, void *out, ks_diag *d);

/* Elements [first, first + count) of WEIGHT node `node`'s data, as kd_weight_data would give them,
 * where the weight is the checkpoint's stored rows as they are (not transposed), or a concatenation
 * (derive=concat0) of such weights: converted straight from the mapped file, so a large weight
 * streams in parts. Returns 1 (nothing done) for a weight that comes only whole (another
 * derivation, transposed, synthetic), 0, or -1 after reporting. */
int kd_weight_part(const kd_model *m, const kir_graph *g, kir_val node, size_t first, size_t count, void *out,
                   ks_diag *d);

/* The weight dtype named by a --dtype value ("f32", "bf16", "f16"); reports
 * another and returns -1. */
int kd_parse_dtype(const char *name, kir_dtype *out, ks_diag *d);

/* Give every WEIGHT node of g dtype t (the graph stays valid: operations
 * take weights of any float dtype and compute in f32). */
void kd_set_weight_dtype(kir_graph *g, kir_dtype t);

/* The dtype name all of g's weights share ("f32", "bf16", "f16"), "mixed",
 * or "f32" for a graph with no weights: the engine meta's "dtype". */
const char *kd_weights_dtype(const kir_graph *g);

/* Before g's weights that are stored as f16 are converted (--dtype f16),
 * the checkpoint tensors they come from are scanned (tensors stored as f16
 * already, and synthetic weights, are not): a tensor with finite values of
 * magnitude 65520 or more, which f16 rounds to inf, is an error naming it,
 * how many such values it has and the largest magnitude, with a hint to use
 * bf16; a tensor with more than 1% of its values nonzero and under f16's
 * smallest normal (2^-14 = 6.10352e-05: subnormal in f16, with fewer
 * significant bits, or 0 at 2^-25 and under) is a warning saying how many,
 * the smallest magnitude and how many become 0. Each tensor is reported
 * once. Returns 0, or -1 after an error. */
int kd_check_f16_range(const kd_model *m, const kir_graph *g, ks_diag *d);

/* Build an engine file from a loaded model (its optimized graph, if any);
 * with f16 weights, kd_check_f16_range first. On success *info (when info
 * is not NULL) says what was written. 0, or -1 after reporting. */
int kd_write_engine(const kd_inputs *in, kd_model *m, const char *out_path, kd_build_info *info, ks_diag *d);

#endif
