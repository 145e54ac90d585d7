/*
 * lower.h — internal to the frontend: the state of one kf_compile while it
 * evaluates a parsed .kiln file against config.json and a checkpoint and
 * emits the kir_graph.
 *
 * Lowering runs in three phases over the items, each in source order:
 *   1. params and asserts (compile-time values: int, float, string, bool);
 *   2. weights: shapes evaluated, templates expanded per layer, each
 *      resolved against the checkpoint (or taken as declared without one);
 *   3. the forward block, executed at compile time: loops unrolled, `if`
 *      resolved, each builtin call emitting IR nodes, values being
 *      compile-time scalars or tensors (IR values).
 *
 * Files: lower.c (driver, names, phases 1 and 3 statements), lower_eval.c
 * (expressions and config.json), lower_weights.c (phase 2),
 * lower_builtins.c (tensor operators and builtin calls).
 *
 * Prefix: kf_.
 */
#ifndef KILN_FRONTEND_LOWER_H
#define KILN_FRONTEND_LOWER_H

#include <cjson/cJSON.h>

#include "frontend/ast.h"
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
    KF_V_TENSOR, /* u.t: an IR value */
} kf_vkind;

/* The config paths an absent value came from, newest first (`a ?? b` that
 * finds neither reports both). */
typedef struct kf_absent {
    const char *path;             /* e.g. "rope_parameters.rope_theta" */
    kf_loc loc;                   /* the `config` keyword */
    const struct kf_absent *next; /* an earlier path that was absent too */
} kf_absent;

typedef struct kf_value {
    kf_vkind kind; /* which member of u holds the value */
    union {
        int64_t i;                /* KF_V_INT, KF_V_BOOL */
        double f;                 /* KF_V_FLOAT */
        const char *s;            /* KF_V_STR */
        kir_val t;                /* KF_V_TENSOR */
        const kf_absent *absent;  /* KF_V_ABSENT */
    } u;
} kf_value;

/* ---- weights ------------------------------------------------------------------- */
/* One tensor of a weight: the weight itself, or one layer of a layer weight. */
typedef struct kf_weight_inst {
    int present;        /* 0: none (optional and absent, or `if` false) */
    const char *tensor; /* checkpoint tensor chosen, in the model's arena */
    int transposed;     /* read transposed (.T) */
    int64_t row_start;  /* first row of dim 0 after .T */
    int64_t row_end;    /* end row; -1: all rows */
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
} kf_bind_kind;

typedef struct kf_binding {
    const char *name;        /* the name */
    kf_bind_kind kind;       /* what it names */
    kf_value value;          /* PARAM, VAR, LOOP: the value; INPUT: the tensor once created */
    int defined;             /* PARAM: evaluated already (else declared further down) */
    kf_weight *weight;       /* WEIGHT */
    kf_loc loc;              /* where it is declared */
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
    const cJSON *config;        /* config.json, or NULL */
    const char *config_name;    /* its name in messages */
    const kf_checkpoint *ckpt;  /* the checkpoint, or NULL: every weight as declared */
    ks_arena scratch;           /* values, names, messages: freed when kf_compile returns */
    kf_model *model;            /* the result being built */
    kir_graph *g;               /* model->graph */
    kf_binding *scope[KF_SCOPE_BUCKETS]; /* every name, hashed */
    kf_reported *reported[KF_SCOPE_BUCKETS]; /* errors reported, hashed */
    int in_forward;             /* phase 3: tensors and inputs exist */
    int64_t n_layers;           /* the `layers` param, or -1 when there is none */
    int n_attention;            /* ATTENTION nodes emitted: the next one's `layer` */
    int n_outputs;              /* OUTPUT nodes emitted */
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
/* Evaluate; an absent config key is reported here and becomes KF_V_ERROR. */
kf_value kf_eval(kf_lower *L, const kf_expr *e);
/* Report an absent value as a missing key; returns KF_V_ERROR. Other values pass. */
kf_value kf_require(kf_lower *L, kf_value v);
/* Evaluate an int / a bool; -1 after reporting ("<what> must be an int, not a float"). */
int kf_eval_int(kf_lower *L, const kf_expr *e, const char *what, int64_t *out);
int kf_eval_bool(kf_lower *L, const kf_expr *e, const char *what, int *out);

/* lower_weights.c */
void kf_declare_weight(kf_lower *L, kf_weight *w);
/* The tensor value of weight instance `layer` (0 for plain weights): its
 * WEIGHT node, created on first use, or none. */
kf_value kf_weight_value(kf_lower *L, kf_weight *w, int64_t layer, kf_loc loc);

/* lower_builtins.c */
kf_value kf_tensor_binary(kf_lower *L, int op, kf_value a, kf_value b, kf_loc loc);
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
