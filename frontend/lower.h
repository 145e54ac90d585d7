/*
 * lower.h — internal to the frontend: the state of one kf_compile while it
 * evaluates a parsed .kiln file against config.json and a checkpoint and
 * emits the kir_graph.
 *
 * Lowering runs in three phases over the items, each in source order:
 *   1. params and asserts (compile-time values: int, float, string, bool,
 *      list of ints), a param the runtime reads checked in its range;
 *   2. weights: shapes evaluated, templates expanded per layer, each
 *      resolved against the checkpoint (or taken as declared without one);
 *   3. the forward block, executed at compile time: loops unrolled, `if`
 *      resolved, each builtin call emitting IR nodes, values being
 *      compile-time scalars or tensors (IR values).
 * Then the whole: the params the runtime needs, the first output against
 * the vocabulary, and (with a checkpoint) the tensors nothing reads.
 *
 * Values read from config.json or generation_config.json remember where
 * they sit there (kf_origin): a message about one points at it.
 *
 * Files: lower.c (driver, names, phases 1 and 3 statements), lower_eval.c
 * (expressions and config.json), lower_weights.c (phase 2),
 * lower_builtins.c (tensor operators and builtin calls), lower_unused.c
 * (checkpoint tensors nothing reads, after the three phases).
 *
 * Prefix: kf_.
 */
#ifndef KILN_FRONTEND_LOWER_H
#define KILN_FRONTEND_LOWER_H

#include <cjson/cJSON.h>

#include "frontend/ast.h"
#include "support/json_locate.h"
#include "frontend/checkpoint.h"
#include "frontend/frontend.h"
#include "ir/ir.h"

/* Bounds that keep a hostile .kiln file from exhausting time or memory. */
enum {
    KF_MAX_NODES = 1 << 17,      /* IR nodes in one graph */
    KF_MAX_WORK = 1 << 22,       /* expressions evaluated plus statements executed */
    KF_MAX_LOOKUPS = 1 << 18,    /* checkpoint tensor names tried (layers x alternatives) */
    KF_MAX_SUGGEST = 1 << 16,    /* names compared for "did you mean" suggestions */
    KF_MAX_LOOP = 1 << 16,       /* iterations of one `for` */
    KF_MAX_LAYERS = 1 << 16,     /* value of the `layers` param */
    KF_MAX_SOURCE = 64 << 20,    /* bytes of .kiln text */
};
#define KF_MAX_DIM ((int64_t)INT32_MAX)          /* one dimension */
#define KF_LAYERS_BAD ((int64_t)-2)              /* kf_lower.n_layers of a `layers` param reported wrong */
#define KF_MAX_LIST ((size_t)1 << 16)            /* ints in a list read from config.json */
#define KF_MAX_WEIGHT_ELEMS ((int64_t)1 << 40)   /* elements of one weight */

/* ---- values ------------------------------------------------------------------ */
typedef enum kf_vkind {
    KF_V_ERROR,  /* an error already reported: consumers stay quiet */
    KF_V_ABSENT, /* a config key that is absent or null (only `??` takes it) */
    KF_V_NONE,   /* none: an absent tensor */
    KF_V_INT,    /* u.i */
    KF_V_FLOAT,  /* u.f */
    KF_V_STR,    /* u.s, in the scratch arena */
    KF_V_BOOL,   /* u.i: 0 or 1 */
    KF_V_INTS,   /* u.ints: a list of ints (a JSON array of integers, as eos_token_id may be) */
    KF_V_FLOATS, /* u.floats: a list of numbers (a JSON array with a non-integer: LongRoPE's factors) */
    KF_V_TENSOR, /* u.t: an IR value */
} kf_vkind;

/* The config paths an absent value came from, newest first (`a ?? b` that
 * finds neither reports both). */
typedef struct kf_absent {
    kf_doc_id doc;                /* the document that lacks it */
    const char *path;             /* e.g. "rope_parameters.rope_theta" */
    kf_loc loc;                   /* the `config` keyword */
    const struct kf_absent *next; /* an earlier path that was absent too */
} kf_absent;

/* A value as it stands in config.json or generation_config.json: a
 * message about the value points there (kf_error_value). */
typedef struct kf_origin {
    kf_doc_id doc;             /* the document */
    const char *path;          /* e.g. "rope_parameters.rope_theta", "eos_token_id[0]": for messages */
    const ks_json_step *steps; /* the same path, for ks_json_locate */
    size_t n_steps;            /* steps in it */
    kf_loc loc;                /* where the description reads it (its `config` keyword) */
} kf_origin;

typedef struct kf_value {
    kf_vkind kind; /* which member of u holds the value */
    const kf_origin *origin; /* the config value it is, passed on unchanged (through params, `??`,
                                `?:`); NULL for a value computed or written in the description */
    union {
        int64_t i;                /* KF_V_INT, KF_V_BOOL */
        double f;                 /* KF_V_FLOAT */
        const char *s;            /* KF_V_STR */
        kir_val t;                /* KF_V_TENSOR */
        const kf_absent *absent;  /* KF_V_ABSENT */
        struct {
            const int64_t *v;     /* in the scratch arena */
            size_t n;             /* how many; may be 0 */
        } ints;                   /* KF_V_INTS */
        struct {
            const double *v;      /* in the scratch arena */
            size_t n;             /* how many; at least 1 (an empty array is a list of ints) */
        } floats;                 /* KF_V_FLOATS */
    } u;
} kf_value;

/* ---- weights ------------------------------------------------------------------- */
/* One tensor of a weight: the weight itself, or one layer of a layer weight. */
typedef struct kf_weight_inst {
    int present;        /* 0: none (optional and absent, or `if` false) */
    const char *tensor; /* checkpoint tensor chosen, in the model's arena */
    int transposed;     /* read transposed (.T) */
    int row_dim;        /* the dim of the rows: 0, or 1 (each index of dim 0's) */
    int64_t row_start;  /* first row of dim row_dim after .T */
    int64_t row_end;    /* end row; -1: all rows */
    int64_t row_step;   /* every row_step-th row (1: each) */
    int64_t groups;     /* > 0: a 2-D tensor's dim 0 read as [groups, rows / groups] (a 3-D weight's rows of dim 1) */
    int transposed_after; /* `[:, lo : hi].T`: each index's rows, then transposed */
    const char **parts; /* {e}: [n_parts] each expert's tensor, stacked along dim 0 (tensor is parts[0]) */
    int64_t n_parts;    /* 0: one tensor */
    kir_val node;       /* its WEIGHT node once used; KIR_NONE before */
} kf_weight_inst;

typedef struct kf_weight {
    const kf_item *decl;             /* the declaration */
    int ndim;                        /* declared dims */
    int64_t dims[KIR_MAX_DIMS];      /* declared shape (what the graph sees) */
    int ok;                          /* shape and tensors resolved without error */
    int64_t n_inst;                  /* 1, or the layer count for a layer weight */
    kf_weight_inst *inst;            /* [n_inst] */
} kf_weight;

/* ---- names ----------------------------------------------------------------------- */
typedef enum kf_bind_kind {
    KF_BIND_PARAM,  /* a param: value */
    KF_BIND_WEIGHT, /* a weight: weight */
    KF_BIND_INPUT,  /* tokens or positions: created on first use in forward */
    KF_BIND_VAR,    /* a forward variable: value */
    KF_BIND_LOOP,   /* a loop variable: value (an int) */
    KF_BIND_FN,     /* a function (fn NAME(...) { ... }): fn */
} kf_bind_kind;

/* The config values an evaluation read (directly, or through the params
 * it named), in order of first reading: a failed assert points at them. */
enum { KF_MAX_TRACE = 16 };
typedef struct kf_trace {
    const kf_origin *v[KF_MAX_TRACE]; /* distinct values (by document and path); later ones are dropped */
    size_t n;                         /* how many */
} kf_trace;

typedef struct kf_binding {
    const char *name;        /* the name */
    kf_bind_kind kind;       /* what it names */
    kf_value value;          /* PARAM, VAR, LOOP: the value; INPUT: the tensor once created */
    kf_trace deps;           /* PARAM: the config values its evaluation read */
    int defined;             /* PARAM: evaluated already (else declared further down) */
    kf_weight *weight;       /* WEIGHT */
    kf_loc loc;              /* where it is declared */
    int frame;               /* VAR, LOOP: the call depth that bound it (0: forward; n: the nth nested call of
                                a function), seen only at that depth */
    const kf_item *fn;       /* FN: the declaration */
    int fn_bad;              /* FN: its declaration is wrong (reported): calls of it are errors already */
    int fn_active;           /* FN: being expanded (a call of it now is recursion) */
    struct kf_binding *next; /* next in its hash bucket */
} kf_binding;

enum { KF_SCOPE_BUCKETS = 256 };

/* An error already reported (kf_error reports each place and text once). */
typedef struct kf_reported {
    kf_loc loc;               /* where */
    const char *text;         /* the message */
    struct kf_reported *next; /* next in its hash bucket */
} kf_reported;

/* ---- the lowering context ---------------------------------------------------------- */
typedef struct kf_lower {
    const ks_source *src;       /* the .kiln text */
    ks_diag *d;                 /* where errors go */
    kf_json_doc docs[KF_N_DOCS]; /* config.json, generation_config.json (root NULL when absent) */
    kf_trace *trace;            /* while a param or an assert is evaluated: the config values read */
    struct kf_reported_origin *reported_origins; /* config values reported on already */
    const kf_checkpoint *ckpt;  /* the checkpoint, or NULL: every weight as declared */
    ks_arena scratch;           /* values, names, messages: freed when kf_compile returns */
    kf_model *model;            /* the result being built */
    kir_graph *g;               /* model->graph */
    kf_binding *scope[KF_SCOPE_BUCKETS]; /* every name, hashed */
    kf_reported *reported[KF_SCOPE_BUCKETS]; /* errors reported, hashed */
    int in_forward;             /* phase 3: tensors and inputs exist */
    int frame;                  /* functions being expanded, nested (lower_fn.c): 0 outside any */
    int64_t n_layers;           /* the `layers` param; -1 when there is none, KF_LAYERS_BAD when it is wrong
                                   (reported) */
    int n_attention;            /* ATTENTION nodes emitted: the next one's `layer` */
    int n_outputs;              /* OUTPUT nodes emitted */
    kir_val first_output;       /* the first OUTPUT node, once there is one: the runtime samples from it */
    kf_loc first_output_loc;    /* where it is written */
    size_t cap_weights;         /* capacity of model->weights while it grows on the heap */
    long work;                  /* expressions evaluated plus statements executed */
    long lookups;               /* checkpoint tensor names tried */
    long suggest_work;          /* names compared for "did you mean" (bounded: a courtesy) */
    int stop;                   /* a limit was hit (reported): evaluate nothing more */
    const char **unconfigured;  /* without a config: the config paths read (each once, in source order),
                                   reported together by kf_compile instead of one error each */
    size_t n_unconfigured;      /* how many */
    size_t cap_unconfigured;    /* capacity of unconfigured */
} kf_lower;

/* lower.c */
kf_value kf_error(kf_lower *L, kf_loc loc, const char *fmt, ...) KS_PRINTF(3, 4);
/* An error about value v, used at loc: when v is a config value whose text
 * is known, reported at its place in the JSON text, with a note at loc;
 * else at loc. One error per config value: the uses after the first (a norm
 * in every layer) stay quiet. Returns KF_V_ERROR. */
kf_value kf_error_value(kf_lower *L, kf_loc loc, kf_value v, const char *fmt, ...) KS_PRINTF(4, 5);
/* The line and column of a config value in its document's text: 0, or -1
 * when the text is not known or the path is not found in it. */
int kf_locate(const kf_lower *L, const kf_origin *o, int *line, int *col);
/* Record that config value o was read, when a trace is being kept. */
void kf_trace_add(kf_lower *L, const kf_origin *o);
/* The origin of element i of the config value at o (a list). */
const kf_origin *kf_origin_element(kf_lower *L, const kf_origin *o, int64_t i);
/* Whether an error was reported at loc already (then a loop body's second
 * pass need not work out the message again). */
int kf_reported_at(kf_lower *L, kf_loc loc);
/* Count one unit of work; past KF_MAX_WORK report once and stop: -1. */
int kf_work(kf_lower *L, kf_loc loc);
kf_binding *kf_lookup(kf_lower *L, const char *name);
kf_binding *kf_bind(kf_lower *L, const char *name, kf_bind_kind kind, kf_loc loc);
void kf_unbind(kf_lower *L, kf_binding *b);
/* A "(did you mean 'x'?)" suffix naming the closest of the candidates, or "". */
const char *kf_suggest(kf_lower *L, const char *name, const char *const *cands, size_t n);
const char *kf_suggest_name(kf_lower *L, const char *name);
kir_loc kf_kir_loc(kf_lower *L, kf_loc loc);

/* lower_eval.c */
static inline kf_value kf_int(int64_t i) { return (kf_value){.kind = KF_V_INT, .u.i = i}; }
static inline kf_value kf_float(double f) { return (kf_value){.kind = KF_V_FLOAT, .u.f = f}; }
static inline kf_value kf_bool(int b) { return (kf_value){.kind = KF_V_BOOL, .u.i = b != 0}; }
static inline kf_value kf_str(const char *s) { return (kf_value){.kind = KF_V_STR, .u.s = s}; }
static inline kf_value kf_tval(kir_val t) { return (kf_value){.kind = KF_V_TENSOR, .u.t = t}; }
static inline kf_value kf_none(void) { return (kf_value){.kind = KF_V_NONE}; }
static inline kf_value kf_err_value(void) { return (kf_value){.kind = KF_V_ERROR}; }
const char *kf_type_name(kf_vkind k); /* "int", "tensor", ... */
const char *kf_a_type(kf_vkind k);    /* with its article: "an int", "a tensor", "none" */
/* What v is, for "must be an int, not ...": its kind with its article, or
 * for a whole number too large to be an int (a JSON integer of 2^53 or
 * more, which cJSON holds only as a double) why it is not one. */
const char *kf_not_int(kf_value v);
/* Evaluate; an absent config key is reported here and becomes KF_V_ERROR. */
kf_value kf_eval(kf_lower *L, const kf_expr *e);
/* Report an absent value as a missing key; returns KF_V_ERROR. Other values pass. */
kf_value kf_require(kf_lower *L, kf_value v);
/* Evaluate an int / a bool; -1 after reporting ("<what> must be an int, not a float"). */
int kf_eval_int(kf_lower *L, const kf_expr *e, const char *what, int64_t *out);
/* The same, keeping the value (and where it comes from) for later messages. */
int kf_eval_int_value(kf_lower *L, const kf_expr *e, const char *what, kf_value *out);
int kf_eval_bool(kf_lower *L, const kf_expr *e, const char *what, int *out);

/* lower_weights.c */
void kf_declare_weight(kf_lower *L, kf_weight *w);
/* The tensor value of weight instance `layer` (0 for plain weights): its
 * WEIGHT node, created on first use, or none. */
kf_value kf_weight_value(kf_lower *L, kf_weight *w, int64_t layer, kf_loc loc);

/* lower_unused.c: the checkpoint tensors no weight of file f reads (bound[i]
 * is item i's binding): an error for tensors of layers past the `layers`
 * param, a warning for the others an `ignore` item does not name. */
void kf_check_unused(kf_lower *L, const kf_file *f, kf_binding *const *bound);
/* The tensor names of the `ignore` items: {i} is their only placeholder. */
void kf_check_ignores(kf_lower *L, const kf_file *f);

/* lower.c: what a binding's kind is called in messages ("param", "function", ...) */
const char *kf_kind_name(kf_bind_kind k);
/* lower.c: the statements of b, in order */
void kf_exec_block(kf_lower *L, const kf_block *b);

/* lower_fn.c: user functions, expanded where they are called. kf_declare_fn checks a declaration
 * (one `return` as its last statement, no `output`) and binds its name; kf_check_fn_params, once
 * every function is declared, that its parameters hide no name of the file and are distinct;
 * kf_call_fn expands a call of the function b names: the arguments evaluated where the call is, the
 * body's statements run with only the parameters (and the params, weights, functions and inputs)
 * in sight, its `return` value the call's. */
void kf_declare_fn(kf_lower *L, const kf_item *it);
void kf_check_fn_params(kf_lower *L, kf_binding *b);
kf_value kf_call_fn(kf_lower *L, const kf_expr *call, kf_binding *b);
/* lower_eval.c: 1 when name is a scalar function (sqrt, log, pow, ...) */
int kf_is_scalar_function(const char *name);

/* lower_builtins.c */
kf_value kf_tensor_binary(kf_lower *L, int op, kf_value a, kf_value b, kf_loc loc);
kf_value kf_tensor_compare(kf_lower *L, int op, kf_value a, kf_value b, kf_loc loc);
kf_value kf_tensor_neg(kf_lower *L, kf_value a, kf_loc loc);
/* A call of a tensor builtin; returns 0 when `name` is not one. */
int kf_call_builtin(kf_lower *L, const kf_expr *call, kf_value *out);
int kf_is_builtin(const char *name);
void kf_builtin_names(const char *const **names, size_t *n);
/* OUTPUT node for `output name = value;` */
void kf_emit_output(kf_lower *L, const char *name, kf_value v, kf_loc loc);
/* The INPUT node `tokens` or `positions`. */
kir_val kf_emit_input(kf_lower *L, const char *name, kf_loc loc);
/* Node budget check before emitting; -1 after reporting once. */
int kf_node_budget(kf_lower *L, kf_loc loc);

#endif
