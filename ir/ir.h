/*
 * ir.h — kiln's IR: a typed SSA graph with symbolic dimensions.
 *
 * A graph is a flat array of nodes in schedule order. Each node defines one
 * value, named by its index (kir_val), so graphs copy and compare cheaply and
 * survive reallocation (QBE's Ref). Operands are earlier values. Ops come from
 * the one table in ir/ops.def; their shape rules live in ir/shape.c.
 *
 * Tutorial:
 *
 *     kir_graph *g = kir_graph_new("tiny");
 *     kir_loc at = kir_loc_make(g, "tiny.kiln", 3, 5);
 *     kir_val ids = kir_input(g, KIR_ROLE_TOKENS, at);     // i32[T]
 *     int64_t tdims[2] = {100, 64};
 *     kir_val tab = kir_weight(g, "embed", KIR_F32, 2, tdims, at);
 *     kir_val x = kir_build(g, KIR_OP_EMBED, at, (kir_val[]){tab, ids}, 2, NULL, 0, &err);
 *     if (x == KIR_NONE) ...                // err names the op and shapes
 *     kir_setting name = KIR_WITH_STR(KIR_A_OUTPUT_NAME, "logits");
 *     kir_val out = kir_build(g, KIR_OP_OUTPUT, at, &x, 1, &name, 1, &err);
 *     kir_verify(g, diag);                  // whole-graph checks
 *     ks_buf text = {0}; kir_print(g, &text); // text form; kir_parse reads it back
 *
 * Dimensions: a dim is a positive constant or a symbol (negative): KIR_DIM_T,
 * the number of tokens in a step. Every activation has T as its first dim.
 *
 * Prefix: kir_.
 */
#ifndef KILN_IR_H
#define KILN_IR_H

#include <stdint.h>
#include <stdio.h>

#include "support/support.h"

/* ---- the op table ---------------------------------------------------------- */
typedef enum kir_op {
#define KIR_OP(NAME, text, min, max, shape, fuse, be) KIR_OP_##NAME,
#include "ir/ops.def"
    KIR_OP_COUNT
} kir_op;

/* How a pass may fuse an op. */
typedef enum kir_fusion_class {
    KIR_FUSE_NONE,      /* never fused (inputs, weights, outputs) */
    KIR_FUSE_MATMUL,    /* a matmul: may absorb epilogues, may merge with siblings */
    KIR_FUSE_ELEMWISE,  /* elementwise: may become an epilogue of its producer */
    KIR_FUSE_NORM,      /* a row reduction: may absorb a preceding residual add */
    KIR_FUSE_VIEW,      /* reshape/slice/concat: may disappear into consumers */
    KIR_FUSE_ROW,       /* softmax/sum/topk/gather: along a token's row; a group of them (passes/fuse_rows.c) */
    KIR_FUSE_ATTENTION, /* attention: scale, mask, softmax and PV stay one op */
} kir_fusion_class;

/* Backends that lower an op (bits). */
enum {
    KIR_BE_INTERP = 1 << 0,
    KIR_BE_CPU = 1 << 1,
    KIR_BE_CUDA = 1 << 2,
    KIR_BE_HIP = 1 << 3,
    KIR_BE_ALL = 0xf,
};

typedef struct kir_op_info {
    const char *name;         /* name in the text form */
    int min_inputs;           /* operands required */
    int max_inputs;           /* operands allowed */
    kir_fusion_class fusion;  /* KIR_FUSE_* */
    unsigned backends;        /* KIR_BE_* bits */
} kir_op_info;

extern const kir_op_info kir_op_table[KIR_OP_COUNT];
/* The op named `name` in the text form, or KIR_OP_COUNT. */
kir_op kir_op_lookup(const char *name);

/* ---- types ----------------------------------------------------------------- */
typedef enum kir_dtype {
    KIR_F32,  /* IEEE binary32 */
    KIR_F16,  /* IEEE binary16 */
    KIR_BF16, /* bfloat16 */
    KIR_I32,  /* 32-bit signed integer (token ids, positions) */
    KIR_F8E4M3, /* FP8 E4M3 (OCP, "e4m3fn": no infinities): an FP8 checkpoint's weights, and the codes of a
                 * weight quantized to fp8 (passes/quantize.c) */
    KIR_U4,     /* 4-bit unsigned codes, two a byte (the even element in the low nibble) along the last dim:
                 * a weight quantized to 4 bits; no computed value has it */
    KIR_U8,     /* 8-bit unsigned codes: a weight quantized to 8 bits with zero points; a checkpoint's U8 */
    KIR_I8,     /* 8-bit signed codes: a weight quantized symmetrically to 8 bits; a checkpoint's I8 */
    KIR_DTYPE_COUNT
} kir_dtype;

const char *kir_dtype_name(kir_dtype t);   /* "f32", "f16", "bf16", "i32", "f8e4m3", "u4", "u8", "i8" */
int kir_dtype_lookup(const char *name);    /* -1 if unknown */
size_t kir_dtype_size(kir_dtype t);        /* bytes per element; not for u4 (half a byte: kir_dtype_bytes) */
int kir_dtype_bits(kir_dtype t);           /* bits per element: 4 for u4 */
uint64_t kir_dtype_bytes(kir_dtype t, uint64_t elems); /* bytes of elems elements, packed (u4: rounded up) */
/* Whether t holds the codes of a quantized weight (u4, u8, i8, f8e4m3): a WEIGHT only, read with its scales. */
int kir_dtype_is_quantized(kir_dtype t);
/* A float dtype's element format, for ks_decode_f32. */
static inline ks_float_kind kir_float_kind(kir_dtype t)
{
    KS_ASSERT(t == KIR_F32 || t == KIR_F16 || t == KIR_BF16);
    return t == KIR_F32 ? KS_FLOAT_F32 : t == KIR_F16 ? KS_FLOAT_F16 : KS_FLOAT_BF16;
}

enum { KIR_MAX_DIMS = 4, KIR_MAX_INPUTS = 16 };
#define KIR_DIM_T (-1) /* symbolic dim: tokens in the step */

typedef uint32_t kir_val;   /* index of the node that defines a value */
#define KIR_NONE UINT32_MAX /* an absent optional operand */

/* Where a node came from in a .kiln file (or an IR text). */
typedef struct kir_loc {
    uint32_t file; /* index into kir_graph.files; UINT32_MAX: unknown */
    uint32_t line; /* 1-based; 0: unknown */
    uint32_t col;  /* 1-based */
} kir_loc;

/* ---- attributes ------------------------------------------------------------ */
typedef enum kir_attr_kind {
    KIR_ATTR_INT,    /* i: a 64-bit integer */
    KIR_ATTR_FLOAT,  /* f: a double */
    KIR_ATTR_STR,    /* s: a string (a WORD attribute is stored as its word's text) */
    KIR_ATTR_INTS,   /* ints: a list of integers (dims may be KIR_DIM_T) */
    KIR_ATTR_FLOATS, /* floats: a list of doubles (LongRoPE's per-frequency factors) */
} kir_attr_kind;

typedef struct kir_attr {
    const char *key;     /* attribute name, in the graph's arena */
    kir_attr_kind kind;  /* which member of the union holds the value */
    union {
        int64_t i;       /* KIR_ATTR_INT */
        double f;        /* KIR_ATTR_FLOAT */
        const char *s;   /* KIR_ATTR_STR, in the graph's arena */
        struct {
            const int64_t *v; /* KIR_ATTR_INTS, in the graph's arena */
            uint32_t n;       /* number of integers */
        } ints;
        struct {
            const double *v;  /* KIR_ATTR_FLOATS, in the graph's arena */
            uint32_t n;       /* number of floats */
        } floats;
    } u;
} kir_attr;

/* The attribute schema, generated from ir/ops.def's KIR_SET, KIR_WORD and
 * KIR_ATTR lines. */
#define KIR_OP_ANY KIR_OP_COUNT /* an attribute any op may carry */

/* The sets of words enum attributes hold. */
typedef enum kir_set {
    KIR_NOSET, /* not a WORD attribute */
#define KIR_SET(SET, what) KIR_SET_##SET,
#include "ir/ops.def"
    KIR_SET_COUNT
} kir_set;

/* Every word of every set: KIR_<SET>_<NAME>. */
typedef enum kir_word {
#define KIR_WORD(SET, NAME, text) KIR_##SET##_##NAME,
#include "ir/ops.def"
    KIR_WORD_COUNT
} kir_word;

/* The values an attribute may hold (checked by the verifier and the frontend). */
typedef enum kir_attr_rule {
    KIR_RULE_ANY,      /* any value of its kind */
    KIR_RULE_FINITE,   /* a finite number */
    KIR_RULE_POSITIVE, /* > 0 (and finite) */
    KIR_RULE_NONNEG,   /* >= 0 (and finite) */
    KIR_RULE_BOOL,     /* 0 or 1 */
} kir_attr_rule;

/* Every attribute of every op: KIR_A_<OP>_<ID>. */
typedef enum kir_attr_id {
#define KIR_ATTR(OP, ID, key, KIND, PRESENCE, fallback, SET, RULE) KIR_A_##OP##_##ID,
#include "ir/ops.def"
    KIR_A_COUNT
} kir_attr_id;

/* The kind an attribute has in the schema: the storage kinds, and WORD. */
enum { KIR_ATTR_WORD = KIR_ATTR_FLOATS + 1 };

typedef struct kir_attr_info {
    kir_op op;             /* the op that has it, or KIR_OP_ANY */
    const char *key;       /* its name in the text form */
    int kind;              /* a kir_attr_kind, or KIR_ATTR_WORD (stored as KIR_ATTR_STR) */
    int required;          /* 1: every node of the op has it */
    double fallback;       /* the value it has when absent (a kir_word for WORD attributes) */
    kir_set set;           /* WORD: its words' set */
    kir_attr_rule rule;    /* the values it may hold */
} kir_attr_info;

typedef struct kir_word_info {
    kir_set set;           /* the set it belongs to */
    const char *text;      /* as the text form writes it */
} kir_word_info;

extern const kir_attr_info kir_attr_table[KIR_A_COUNT];
extern const kir_word_info kir_word_table[KIR_WORD_COUNT];
extern const char *const kir_set_names[KIR_SET_COUNT]; /* what each set names: "rotation style" */

/* The word of set `set` written `text`, or KIR_WORD_COUNT. */
kir_word kir_word_lookup(kir_set set, const char *text);
/* 1 for the rope scalings whose frequencies follow each token's sequence length (longrope, dynamic:
 * the rope reads seq_lengths); the one list of them */
int kir_rope_scaling_by_length(kir_word scaling);
/* The attribute `key` of op (or of any op), or KIR_A_COUNT. */
kir_attr_id kir_attr_lookup(kir_op op, const char *key);
/* "must be positive" etc.: what a rule asks, for messages; NULL for ANY. */
const char *kir_rule_text(kir_attr_rule rule);
/* Whether x satisfies the rule (INT attributes pass their value as a double). */
int kir_rule_holds(kir_attr_rule rule, double x);

/* ---- nodes ----------------------------------------------------------------- */
typedef struct kir_node {
    kir_op op;                       /* what it computes */
    kir_dtype dtype;                 /* element type of the value */
    uint8_t ndim;                    /* number of dims, 0..KIR_MAX_DIMS */
    uint8_t nin;                     /* number of operands */
    int64_t dims[KIR_MAX_DIMS];      /* dims; KIR_DIM_T for the token dim */
    kir_val in[KIR_MAX_INPUTS];      /* operands (earlier values) or KIR_NONE */
    kir_attr *attrs;                 /* attributes, in the graph's arena */
    uint32_t nattrs;                 /* number of attributes */
    uint32_t cap_attrs;              /* capacity of attrs */
    kir_loc loc;                     /* source location */
} kir_node;

/* A resolved model parameter (hyperparameter), e.g. hidden = 128, or
 * eos_token_id = [128001, 128008, 128009]. */
typedef struct kir_param {
    const char *name;      /* in the graph's arena */
    kir_attr_kind kind;    /* INT, FLOAT, STR (booleans are INT 0/1), INTS or FLOATS */
    int64_t i;             /* KIR_ATTR_INT */
    double f;              /* KIR_ATTR_FLOAT */
    const char *s;         /* KIR_ATTR_STR */
    struct {
        const int64_t *v;  /* KIR_ATTR_INTS: the integers, in the graph's arena */
        uint32_t n;        /* how many (0 for an empty list) */
    } ints;
    struct {
        const double *v;   /* KIR_ATTR_FLOATS: the numbers, in the graph's arena */
        uint32_t n;        /* how many (0 for an empty list) */
    } floats;
} kir_param;

typedef struct kir_graph {
    ks_arena arena;        /* owns strings, attributes and ints: the graph's lifetime */
    const char *name;      /* model name (from the .kiln `model` line) */
    kir_node *nodes;       /* schedule order; value i is nodes[i] */
    size_t n_nodes;        /* number of nodes */
    size_t cap_nodes;      /* capacity of nodes */
    const char **files;    /* source files named by locations */
    size_t n_files;        /* number of files */
    size_t cap_files;      /* capacity of files */
    kir_param *params;     /* resolved hyperparameters, in declaration order */
    size_t n_params;       /* number of params */
    size_t cap_params;     /* capacity of params */
    int fallible;          /* 1: a builder out of memory sets oom instead of ending the process
                              (kir_parse's graph while it parses: the runtime reads engines with it) */
    int oom;               /* 1: a builder ran out of memory; the graph lacks what it could not add */
} kir_graph;

kir_graph *kir_graph_new(const char *name);
/* A fallible graph (see `fallible`), or NULL when out of memory. Its
 * builders never end the process: one that runs out of memory sets g->oom
 * and adds nothing (kir_node_new returns KIR_NONE, a loc has no file), so
 * the caller checks g->oom after building and frees the graph when it is
 * set. Clear g->fallible (and g->arena.fallible) once it is built, for the
 * passes, whose builds do not check. */
kir_graph *kir_graph_try_new(const char *name);
void kir_graph_free(kir_graph *g);
kir_graph *kir_graph_clone(const kir_graph *g);

kir_loc kir_loc_make(kir_graph *g, const char *file, uint32_t line, uint32_t col);
static inline kir_node *kir_node_at(const kir_graph *g, kir_val v) { return &g->nodes[v]; }

/* Building a graph: kir_build (below the attributes) is the one way the
 * frontend, the passes and the tests add a computed node; inputs and
 * weights, whose types are declared rather than computed, have their own.
 * kir_node_new and kir_node_add_input are the raw parts underneath, for
 * the text parser and for tests that make malformed graphs on purpose. */
kir_val kir_node_new(kir_graph *g, kir_op op, kir_loc loc); /* no operands, dtype F32, ndim 0 */
void kir_node_add_input(kir_graph *g, kir_val node, kir_val operand); /* operand may be KIR_NONE */
kir_val kir_input(kir_graph *g, kir_word role, kir_loc loc);          /* i32[T]: KIR_ROLE_TOKENS or _POSITIONS */
kir_val kir_weight(kir_graph *g, const char *name, kir_dtype dtype, int ndim, const int64_t *dims, kir_loc loc);

/* Attributes: set replaces a value of the same key. */
void kir_set_int(kir_graph *g, kir_val v, const char *key, int64_t value);
void kir_set_float(kir_graph *g, kir_val v, const char *key, double value);
void kir_set_str(kir_graph *g, kir_val v, const char *key, const char *value);
void kir_set_ints(kir_graph *g, kir_val v, const char *key, const int64_t *values, uint32_t n);
void kir_set_floats(kir_graph *g, kir_val v, const char *key, const double *values, uint32_t n);
const kir_attr *kir_get(const kir_graph *g, kir_val v, const char *key);
int64_t kir_get_int(const kir_graph *g, kir_val v, const char *key, int64_t dflt);
double kir_get_float(const kir_graph *g, kir_val v, const char *key, double dflt); /* INT attrs convert */
const char *kir_get_str(const kir_graph *g, kir_val v, const char *key, const char *dflt);

/* Typed access through the schema (ir/ops.def): node v must be of the
 * attribute's op (KS_ASSERT) and the attribute of the accessor's kind. An
 * absent attribute gives the schema's fallback (verified graphs have every
 * REQ one). Readers use these, never a key and a default of their own. */
int64_t kir_attr_int(const kir_graph *g, kir_val v, kir_attr_id a);    /* INT */
double kir_attr_float(const kir_graph *g, kir_val v, kir_attr_id a);   /* FLOAT (an INT converts) */
kir_word kir_attr_word(const kir_graph *g, kir_val v, kir_attr_id a);  /* WORD */
const char *kir_attr_str(const kir_graph *g, kir_val v, kir_attr_id a); /* STR; NULL when absent */
const int64_t *kir_attr_ints(const kir_graph *g, kir_val v, kir_attr_id a, uint32_t *n); /* INTS; NULL when absent */
const double *kir_attr_floats(const kir_graph *g, kir_val v, kir_attr_id a, uint32_t *n); /* FLOATS; NULL when absent */
int kir_attr_has(const kir_graph *g, kir_val v, kir_attr_id a);        /* 1 when present */
/* The dtype an ATTENTION or KV_WRITE node stores K/V rows as (kv_dtype: f32, bf16, f16, or the codes
 * of a quantized cache, i8 or f8e4m3, ir/quant.h's kir_kv_round), and the kv_dtype word of such a dtype. */
kir_dtype kir_kv_dtype(const kir_graph *g, kir_val v);
kir_word kir_kv_dtype_word(kir_dtype t);
void kir_attr_set_int(kir_graph *g, kir_val v, kir_attr_id a, int64_t value);
void kir_attr_set_float(kir_graph *g, kir_val v, kir_attr_id a, double value);
void kir_attr_set_word(kir_graph *g, kir_val v, kir_attr_id a, kir_word w);
void kir_attr_set_str(kir_graph *g, kir_val v, kir_attr_id a, const char *value);
void kir_attr_set_ints(kir_graph *g, kir_val v, kir_attr_id a, const int64_t *values, uint32_t n);
void kir_attr_set_floats(kir_graph *g, kir_val v, kir_attr_id a, const double *values, uint32_t n);

/* One attribute of a node kir_build makes: its schema id, and its value in
 * the member its kind uses. KIR_WITH_INT(id, x) etc. write one. */
typedef struct kir_setting {
    kir_attr_id id;        /* which attribute */
    int64_t i;             /* INT */
    double f;              /* FLOAT */
    kir_word w;            /* WORD */
    const char *s;         /* STR */
    const int64_t *ints;   /* INTS: the values */
    const double *floats;  /* FLOATS: the values */
    uint32_t n;            /* INTS, FLOATS: how many */
} kir_setting;
#define KIR_WITH_INT(a, x) ((kir_setting){.id = (a), .i = (x)})
#define KIR_WITH_FLOAT(a, x) ((kir_setting){.id = (a), .f = (x)})
#define KIR_WITH_WORD(a, x) ((kir_setting){.id = (a), .w = (x)})
#define KIR_WITH_STR(a, x) ((kir_setting){.id = (a), .s = (x)})
#define KIR_WITH_INTS(a, v, count) ((kir_setting){.id = (a), .ints = (v), .n = (count)})
#define KIR_WITH_FLOATS(a, v, count) ((kir_setting){.id = (a), .floats = (v), .n = (count)})

/* Append a node of op at loc with operands in[0..n_in) (trailing KIR_NONE
 * operands dropped: a norm without its weight is (x), not (x, none)) and
 * the attributes of set[0..n_set), then run its shape rule. Returns the
 * node; or KIR_NONE, with the rule's message in err ("matmul: inner
 * dimensions differ: [T,256] x [688,128]") and the node taken back out. */
kir_val kir_build(kir_graph *g, kir_op op, kir_loc loc, const kir_val *in, int n_in, const kir_setting *set, int n_set,
                  ks_buf *err);

/* Params. */
void kir_param_int(kir_graph *g, const char *name, int64_t v);
void kir_param_float(kir_graph *g, const char *name, double v);
void kir_param_str(kir_graph *g, const char *name, const char *v);
void kir_param_ints(kir_graph *g, const char *name, const int64_t *v, uint32_t n);
void kir_param_floats(kir_graph *g, const char *name, const double *v, uint32_t n);
const kir_param *kir_param_find(const kir_graph *g, const char *name);

/* Shape inference: run the op's shape rule over its operands and attributes
 * and store dtype/ndim/dims in the node. On a mismatch returns -1 and writes
 * a message naming the op and the shapes to err, e.g.
 * "matmul: inner dimensions differ: [T,256] x [688,128]". */
int kir_infer(kir_graph *g, kir_val v, ks_buf *err);

/* Whole-graph verification: operand order (SSA), arities, attribute
 * presence and kinds, every node's type equal to what its shape rule
 * computes, and the memory plan the graph carries, if any (ir/plan.h,
 * checked once the rest verifies). Reports each problem through d, at the node's location; `what`
 * names the graph in messages (e.g. the IR file). Returns the error count. */
int kir_verify(const kir_graph *g, ks_diag *d, const char *what);

/* ---- quantized weights -----------------------------------------------------------
 * passes/quantize.c replaces a matmul's float weight W [N,K] by three WEIGHT
 * nodes, the parts of quantizing W's data, which a matmul takes as operands
 * (x, codes, scale, zero):
 *
 *   %8 : u4[256,128] = weight() {name="wq[0]+wk[0]+wv[0]#codes", derive="concat0",
 *        sources="wq[0],wk[0],wv[0]", rows=[128,64,64], quant="codes", qtype="u4", group=128, asym=1}
 *   %9 : f16[256,1] = weight() {name="…#scale", …, quant="scale", …}
 *   %10 : u8[256,1] = weight() {name="…#zero", …, quant="zero", …}
 *   %11 : f32[T,256] = matmul(%7, %8, %9, %10) {quant="w4a16"}
 *
 * Each part carries the recipe of W's data (derive, sources, rows, offset:
 * passes/derived_weight.h), read in f32, and how it is quantized: the codes'
 * dtype (qtype), blocks of block_rows rows and group columns (group = K: a
 * scale a row), asym (zero points). Element [n,k] of W is
 *     (code[n,k] - zero[n/r, k/g]) * scale[n/r, k/g]
 * with zero the block's u8 zero point, or without them the codes' midpoint
 * (u4: 8, u8: 128; i8 and f8e4m3: 0). */
/* Whether w is a WEIGHT that is a part of a quantization (has `quant`). */
int kir_weight_quant_part(const kir_graph *g, kir_val w);
/* The dims [N,K] of the float matrix that part w is a part of quantizing. */
void kir_quant_data_dims(const kir_graph *g, kir_val w, int64_t dims[2]);
/* The codes' dtype of part w's quantization (its qtype), or KIR_DTYPE_COUNT when qtype names none. */
kir_dtype kir_quant_codes_dtype(const kir_graph *g, kir_val w);
/* The verifier's check of the parts and of each quantized matmul's operands (kir_verify runs it). */
int kir_verify_quant(const kir_graph *g, ks_diag *d, const char *what);

/* ---- errors about a node ------------------------------------------------------
 * kir_node_error reports an error about node v: at its place in the .kiln or IR
 * text it came from when it has one (`file:line:col: error: ...`, the source
 * line and a caret), else as `where: error: ...`. The message is a lead that
 * names the node, then fmt. kir_node_error's lead is the IR's own,
 * `node %17 (matmul): ` (kir_verify, the memory planner); kir_node_verror takes
 * the caller's (plain text, not a format), or NULL for the IR's. Both return -1,
 * for `return kir_node_error(...)`. */
int kir_node_error(ks_diag *d, const kir_graph *g, kir_val v, const char *where, const char *fmt, ...)
    KS_PRINTF(5, 6);
int kir_node_verror(ks_diag *d, const kir_graph *g, kir_val v, const char *where, const char *lead,
                    const char *fmt, va_list ap);
/* text as it is (it names the node already), at v's place or at `where`. */
int kir_node_error_text(ks_diag *d, const kir_graph *g, kir_val v, const char *where, const char *text);
/* Whether kir_node_error reports v at a place in a text (else at `where`). */
int kir_node_has_place(const kir_graph *g, kir_val v);
/* The graph's name, or fallback when it has none. */
const char *kir_graph_name(const kir_graph *g, const char *fallback);

/* Formatting of types, e.g. "f32[T,128]". */
void kir_format_type(ks_buf *b, const kir_node *n);
void kir_format_dims(ks_buf *b, int ndim, const int64_t *dims);

/* How a binary op's second operand b repeats over its first a (ir/ops.def's
 * conventions): SUFFIX, b's shape is a suffix of a's (a bias, a weight over
 * the leading dims; equal shapes too); ROW, b has a's dims but a last dim of
 * 1 (one value a row: a row's sum dividing it); NONE, neither (an error). */
typedef enum kir_broadcast { KIR_BROADCAST_NONE, KIR_BROADCAST_SUFFIX, KIR_BROADCAST_ROW } kir_broadcast;
kir_broadcast kir_binary_broadcast(const kir_node *a, const kir_node *b);

/* Whether operand a of concat node n repeats a dim of 1 between T and the last (n's is larger). */
int kir_concat_repeats(const kir_node *n, const kir_node *a);

/* Elements in one token's slice of a value (product of its non-T dims), and
 * the number of elements for a given token count. */
int64_t kir_row_elems(const kir_node *n);
int64_t kir_elems(const kir_node *n, int64_t n_tokens);

/* The token ids a graph takes: the rows of the table of the EMBED whose ids
 * are the tokens INPUT (the vocabulary); -1 when no EMBED reads it. The one
 * owner of the token-id limit: the compiler checks tokenizers against it, the
 * runtime's engine description (runtime/desc.h) reads it. */
int64_t kir_token_ids(const kir_graph *g);

/* ---- text form --------------------------------------------------------------
 * kir_print writes the graph so that kir_parse reads back the same graph and
 * printing that again gives byte-identical text. */
void kir_print(const kir_graph *g, ks_buf *out);
/* Parse IR text; reports errors at file:line:col through d. NULL on error. */
kir_graph *kir_parse(const ks_source *src, ks_diag *d);

#endif
