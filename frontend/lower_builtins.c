/*
 * lower_builtins.c — the tensor builtins of the forward block and the
 * operators on tensors, each lowered to IR nodes (ir/ops.def) whose shapes
 * kir_infer checks. The table below is the whole list: a builtin is one
 * line (name, positional signature, attributes, lowering function).
 *
 * Positional arguments are tensors (or none, where the signature allows),
 * or compile-time ints for view's and slice's sizes; `key: value`
 * arguments are compile-time attributes, checked against the builtin's
 * attribute specs (kind, allowed strings, default).
 */
#include "frontend/lower.h"

#include <math.h>
#include <string.h>

/* ---- emitting nodes ---------------------------------------------------------- */
int kf_node_budget(kf_lower *L, kf_loc loc)
{
    if (L->g->n_nodes < KF_MAX_NODES) return 0;
    if (!L->stop) kf_error(L, loc, "graph too large (more than %d nodes)", KF_MAX_NODES);
    L->stop = 1;
    return -1;
}

/* A node with operands; trailing absent operands are dropped, so a norm
 * without a weight is (x), not (x, none). */
static kir_val new_node(kf_lower *L, kir_op op, kf_loc loc, const kir_val *in, int n)
{
    while (n > 0 && in[n - 1] == KIR_NONE) n--;
    kir_val v = kir_node_new(L->g, op, kf_kir_loc(L, loc));
    for (int i = 0; i < n; i++) kir_node_add_input(L->g, v, in[i]);
    return v;
}

/* Run the op's shape rule; a mismatch is the user's, reported at the call. */
static kf_value finish(kf_lower *L, kir_val v, kf_loc loc)
{
    ks_buf err = {0};
    kf_value r = kf_tval(v);
    if (kir_infer(L->g, v, &err) != 0) r = kf_error(L, loc, "%s", ks_buf_cstr(&err));
    ks_buf_free(&err);
    return r;
}

static kf_value emit2(kf_lower *L, kir_op op, kf_loc loc, kir_val a, kir_val b)
{
    if (kf_node_budget(L, loc) != 0) return kf_err_value();
    kir_val in[2] = {a, b};
    return finish(L, new_node(L, op, loc, in, 2), loc);
}

static kf_value emit_scale(kf_lower *L, kir_val x, double value, kf_loc loc)
{
    if (kf_node_budget(L, loc) != 0) return kf_err_value();
    kir_val v = new_node(L, KIR_OP_SCALE, loc, &x, 1);
    kir_set_float(L->g, v, "value", value);
    return finish(L, v, loc);
}

kir_val kf_emit_input(kf_lower *L, const char *name, kf_loc loc)
{
    return kir_input(L->g, name, kf_kir_loc(L, loc));
}

static int64_t last_dim(kf_lower *L, kir_val v)
{
    const kir_node *n = kir_node_at(L->g, v);
    return n->ndim ? n->dims[n->ndim - 1] : 1;
}

/* ---- operators on tensors ------------------------------------------------------ */
kf_value kf_tensor_neg(kf_lower *L, kf_value a, kf_loc loc) { return emit_scale(L, a.u.t, -1.0, loc); }

kf_value kf_tensor_binary(kf_lower *L, int op, kf_value a, kf_value b, kf_loc loc)
{
    const char *ot = kf_op_text(op);
    /* none is an absent addend: x + none is x (an optional bias). */
    if ((op == '+' || op == '-') && b.kind == KF_V_NONE && (a.kind == KF_V_TENSOR || a.kind == KF_V_NONE))
        return a;
    if (op == '+' && a.kind == KF_V_NONE && b.kind == KF_V_TENSOR) return b;
    if (a.kind == KF_V_NONE || b.kind == KF_V_NONE)
        return kf_error(L, loc, "'%s' has none (an absent optional weight) on its %s", ot,
                        a.kind == KF_V_NONE ? "left" : "right");
    if (a.kind == KF_V_TENSOR && b.kind == KF_V_TENSOR) {
        /* The IR broadcasts its second operand: `bias + x` is `x + bias`. */
        const kir_node *na = kir_node_at(L->g, a.u.t), *nb = kir_node_at(L->g, b.u.t);
        int a_act = na->ndim > 0 && na->dims[0] == KIR_DIM_T, b_act = nb->ndim > 0 && nb->dims[0] == KIR_DIM_T;
        if ((op == '+' || op == '*') && !a_act && b_act) {
            kf_value t = a;
            a = b;
            b = t;
        }
        switch (op) {
        case '+': return emit2(L, KIR_OP_ADD, loc, a.u.t, b.u.t);
        case '-': return emit2(L, KIR_OP_SUB, loc, a.u.t, b.u.t);
        case '*': return emit2(L, KIR_OP_MUL, loc, a.u.t, b.u.t);
        default: return kf_error(L, loc, "'%s' between two tensors is not supported (only + - *)", ot);
        }
    }
    kf_value t = a.kind == KF_V_TENSOR ? a : b, s = a.kind == KF_V_TENSOR ? b : a;
    if (s.kind != KF_V_INT && s.kind != KF_V_FLOAT)
        return kf_error(L, loc, "'%s' cannot combine a tensor with %s", ot, kf_a_type(s.kind));
    double x = s.kind == KF_V_INT ? (double)s.u.i : s.u.f;
    if (op == '/' && a.kind == KF_V_TENSOR) {
        if (x == 0) return kf_error(L, loc, "division by zero in '/'");
        x = 1.0 / x;
    } else if (op == '/') {
        return kf_error(L, loc, "'/' cannot divide a number by a tensor");
    } else if (op != '*') {
        return kf_error(L, loc,
                        "'%s' between a tensor and a number is not supported (numbers scale tensors with * and /)", ot);
    }
    if (!isfinite(x)) return kf_error(L, loc, "'%s' scales by %g; the factor must be finite", ot, x);
    return emit_scale(L, t.u.t, x, loc);
}

/* ---- the builtin table ----------------------------------------------------------- */
/* The numbers an INT or FLOAT attribute takes (floats are finite in any case). */
typedef enum kf_range {
    KF_ANY,      /* any */
    KF_POSITIVE, /* > 0: a norm's eps, RoPE's theta and factors */
    KF_NONNEG,   /* >= 0: 0 means "none" (a window, a softcap) */
} kf_range;

typedef struct kf_attr_spec {
    const char *key;              /* attribute name, as written and as emitted */
    kir_attr_kind kind;           /* INT, FLOAT or STR */
    int required;                 /* no default: the call must give it */
    double dflt;                  /* default of INT and FLOAT attributes when not required */
    const char *dflt_s;           /* default of STR attributes */
    const char *const *choices;   /* STR: allowed values, NULL-terminated; NULL: any */
    kf_range range;               /* INT, FLOAT: the values allowed when given */
} kf_attr_spec;

enum { KF_MAX_ATTRS = 8, KF_MAX_INTS = KIR_MAX_DIMS - 1 };

/* A call's arguments after evaluation and checking. */
typedef struct kf_call_args {
    kir_val t[KIR_MAX_INPUTS];    /* positional tensors; KIR_NONE for none */
    kf_loc t_loc[KIR_MAX_INPUTS]; /* where each is written */
    int nt;                       /* number of positional tensors */
    int64_t ints[KF_MAX_INTS];    /* positional ints (view, slice) */
    kf_loc int_loc[KF_MAX_INTS];  /* where each is written */
    int ni;                       /* number of ints */
    kf_value attr[KF_MAX_ATTRS];  /* attribute values, aligned with the spec; INT/FLOAT/STR */
    int given[KF_MAX_ATTRS];      /* 1 when the call gave the attribute */
    kf_loc attr_loc[KF_MAX_ATTRS];/* where a given attribute is written */
} kf_call_args;

typedef struct kf_builtin kf_builtin;
typedef kf_value (*kf_lower_fn)(kf_lower *L, const kf_builtin *b, kf_call_args *a, kf_loc loc);

struct kf_builtin {
    const char *name;          /* as called in .kiln */
    const char *sig;           /* positional arguments: T tensor, t tensor or none (may be left out),
                                  i int; a trailing '+' repeats the one before it */
    const kf_attr_spec *attrs; /* attribute specs, ending with {NULL} */
    kf_lower_fn lower;         /* emits the nodes */
    kir_op op;                 /* the op, for the lowerings shared by several builtins */
};

static const char *const rope_styles[] = {"halves", "pairs", NULL};
static const char *const rope_scalings[] = {"none", "default", "linear", "llama3", NULL};

static const kf_attr_spec no_attrs[] = {{.key = NULL}};
/* A norm divides by sqrt(mean + eps): eps <= 0 gives inf or NaN on a zero row. */
static const kf_attr_spec norm_attrs[] = {{"eps", KIR_ATTR_FLOAT, 1, 0, NULL, NULL, KF_POSITIVE}, {.key = NULL}};
static const kf_attr_spec rope_attrs[] = {
    {"theta", KIR_ATTR_FLOAT, 1, 0, NULL, NULL, KF_POSITIVE},
    {"style", KIR_ATTR_STR, 0, 0, "halves", rope_styles, KF_ANY},
    {"rot_dim", KIR_ATTR_INT, 0, -1, NULL, NULL, KF_ANY}, /* -1: the whole head; checked against it */
    {"scaling", KIR_ATTR_STR, 0, 0, "none", rope_scalings, KF_ANY},
    {"factor", KIR_ATTR_FLOAT, 0, 1.0, NULL, NULL, KF_POSITIVE},
    {"low_freq_factor", KIR_ATTR_FLOAT, 0, 1.0, NULL, NULL, KF_POSITIVE},
    {"high_freq_factor", KIR_ATTR_FLOAT, 0, 4.0, NULL, NULL, KF_POSITIVE},
    {"original_max_positions", KIR_ATTR_INT, 0, 8192, NULL, NULL, KF_POSITIVE},
    {.key = NULL},
};
static const kf_attr_spec attention_attrs[] = {
    {"scale", KIR_ATTR_FLOAT, 0, -1.0, NULL, NULL, KF_ANY}, /* -1: 1/sqrt(head size) */
    {"window", KIR_ATTR_INT, 0, 0, NULL, NULL, KF_NONNEG},  /* 0: unlimited */
    {"softcap", KIR_ATTR_FLOAT, 0, 0, NULL, NULL, KF_NONNEG}, /* 0: none */
    {.key = NULL},
};

static kf_value lower_simple(kf_lower *L, const kf_builtin *b, kf_call_args *a, kf_loc loc)
{
    if (kf_node_budget(L, loc) != 0) return kf_err_value();
    return finish(L, new_node(L, b->op, loc, a->t, a->nt), loc);
}

static kf_value lower_linear(kf_lower *L, const kf_builtin *b, kf_call_args *a, kf_loc loc)
{
    kf_value mm = emit2(L, KIR_OP_MATMUL, loc, a->t[0], a->t[1]);
    if (mm.kind != KF_V_TENSOR || a->nt < 3 || a->t[2] == KIR_NONE) return mm;
    return emit2(L, KIR_OP_ADD, loc, mm.u.t, a->t[2]);
}

static kf_value lower_norm(kf_lower *L, const kf_builtin *b, kf_call_args *a, kf_loc loc)
{
    if (kf_node_budget(L, loc) != 0) return kf_err_value();
    kir_val v = new_node(L, b->op, loc, a->t, a->nt);
    kir_set_float(L->g, v, "eps", a->attr[0].u.f);
    return finish(L, v, loc);
}

static kf_value lower_view(kf_lower *L, const kf_builtin *b, kf_call_args *a, kf_loc loc)
{
    int64_t shape[KIR_MAX_DIMS];
    int infer = -1;
    int64_t known = 1, row = kir_row_elems(kir_node_at(L->g, a->t[0]));
    shape[0] = KIR_DIM_T;
    for (int i = 0; i < a->ni; i++) {
        int64_t d = a->ints[i];
        if (d == -1 && infer < 0) {
            infer = i;
        } else if (d < 1 || d > KF_MAX_DIM) {
            return kf_error(L, a->int_loc[i], "view: size %lld must be positive (or one -1, inferred)", (long long)d);
        } else if (__builtin_mul_overflow(known, d, &known)) {
            return kf_error(L, a->int_loc[i], "view: sizes overflow");
        }
        shape[i + 1] = d;
    }
    if (infer >= 0) {
        if (row % known != 0)
            return kf_error(L, a->int_loc[infer], "view: cannot infer -1: %lld elements per token are not a multiple of %lld",
                            (long long)row, (long long)known);
        shape[infer + 1] = row / known;
    }
    if (kf_node_budget(L, loc) != 0) return kf_err_value();
    kir_val v = new_node(L, KIR_OP_RESHAPE, loc, a->t, 1);
    kir_set_ints(L->g, v, "shape", shape, (uint32_t)a->ni + 1);
    return finish(L, v, loc);
}

static kf_value lower_slice(kf_lower *L, const kf_builtin *b, kf_call_args *a, kf_loc loc)
{
    if (kf_node_budget(L, loc) != 0) return kf_err_value();
    kir_val v = new_node(L, KIR_OP_SLICE, loc, a->t, 1);
    kir_set_int(L->g, v, "start", a->ints[0]);
    kir_set_int(L->g, v, "end", a->ints[1]);
    return finish(L, v, loc);
}

static kf_value lower_rope(kf_lower *L, const kf_builtin *b, kf_call_args *a, kf_loc loc)
{
    int64_t head = last_dim(L, a->t[0]);
    double theta = a->attr[0].u.f;
    int64_t rot = a->attr[2].u.i < 0 && !a->given[2] ? head : a->attr[2].u.i;
    if (rot < 2 || rot > head || rot % 2 != 0)
        return kf_error_value(L, a->given[2] ? a->attr_loc[2] : loc, a->attr[2],
                              "rope: rot_dim %lld must be even, at least 2 and at most the head size %lld",
                              (long long)rot, (long long)head);
    const char *scaling = a->attr[3].u.s;
    /* llama3 scaling blends between two wavelengths: the high frequency factor must be the larger. */
    if (strcmp(scaling, "llama3") == 0 && !(a->attr[6].u.f > a->attr[5].u.f))
        return kf_error_value(L, a->given[6] ? a->attr_loc[6] : loc, a->attr[6],
                              "rope: llama3 scaling needs high_freq_factor (%g) above low_freq_factor (%g)",
                              a->attr[6].u.f, a->attr[5].u.f);
    if (strcmp(scaling, "default") == 0) scaling = "none"; /* Hugging Face's rope_type name for it */
    if (kf_node_budget(L, loc) != 0) return kf_err_value();
    kir_val v = new_node(L, KIR_OP_ROPE, loc, a->t, 2);
    kir_set_float(L->g, v, "theta", theta);
    kir_set_str(L->g, v, "style", a->attr[1].u.s);
    kir_set_int(L->g, v, "rot_dim", rot);
    kir_set_str(L->g, v, "scaling", scaling);
    kir_set_float(L->g, v, "factor", a->attr[4].u.f);
    kir_set_float(L->g, v, "low_freq_factor", a->attr[5].u.f);
    kir_set_float(L->g, v, "high_freq_factor", a->attr[6].u.f);
    kir_set_int(L->g, v, "original_max_positions", a->attr[7].u.i);
    return finish(L, v, loc);
}

static kf_value lower_attention(kf_lower *L, const kf_builtin *b, kf_call_args *a, kf_loc loc)
{
    double scale = a->given[0] ? a->attr[0].u.f : 1.0 / sqrt((double)last_dim(L, a->t[0]));
    if (kf_node_budget(L, loc) != 0) return kf_err_value();
    kir_val v = new_node(L, KIR_OP_ATTENTION, loc, a->t, 3);
    /* Attention calls are numbered in graph order: each owns one layer of
     * the KV cache. */
    kir_set_int(L->g, v, "layer", L->n_attention);
    kir_set_float(L->g, v, "scale", scale);
    kir_set_int(L->g, v, "window", a->attr[1].u.i);
    kir_set_float(L->g, v, "softcap", a->attr[2].u.f);
    kf_value r = finish(L, v, loc);
    if (r.kind == KF_V_TENSOR) L->n_attention++;
    return r;
}

static const kf_builtin builtins[] = {
    {"embed", "TT", no_attrs, lower_simple, KIR_OP_EMBED},
    {"linear", "TTt", no_attrs, lower_linear, KIR_OP_MATMUL},
    {"matmul", "TT", no_attrs, lower_simple, KIR_OP_MATMUL},
    {"rms_norm", "Tt", norm_attrs, lower_norm, KIR_OP_RMS_NORM},
    {"layer_norm", "Ttt", norm_attrs, lower_norm, KIR_OP_LAYER_NORM},
    {"silu", "T", no_attrs, lower_simple, KIR_OP_SILU},
    {"gelu", "T", no_attrs, lower_simple, KIR_OP_GELU},
    {"gelu_tanh", "T", no_attrs, lower_simple, KIR_OP_GELU_TANH},
    {"relu", "T", no_attrs, lower_simple, KIR_OP_RELU},
    {"view", "Ti+", no_attrs, lower_view, KIR_OP_RESHAPE},
    {"slice", "Tii", no_attrs, lower_slice, KIR_OP_SLICE},
    {"concat", "T+", no_attrs, lower_simple, KIR_OP_CONCAT},
    {"rope", "TT", rope_attrs, lower_rope, KIR_OP_ROPE},
    {"attention", "TTT", attention_attrs, lower_attention, KIR_OP_ATTENTION},
};
enum { KF_N_BUILTINS = sizeof builtins / sizeof *builtins };

static const char *const builtin_names[KF_N_BUILTINS] = {
    "embed", "linear", "matmul", "rms_norm", "layer_norm", "silu", "gelu",
    "gelu_tanh", "relu", "view", "slice", "concat", "rope", "attention",
};

void kf_builtin_names(const char *const **names, size_t *n)
{
    *names = builtin_names;
    *n = KF_N_BUILTINS;
}

static const kf_builtin *find_builtin(const char *name)
{
    for (size_t i = 0; i < KF_N_BUILTINS; i++)
        if (strcmp(builtins[i].name, name) == 0) return &builtins[i];
    return NULL;
}

int kf_is_builtin(const char *name) { return find_builtin(name) != NULL; }

/* ---- checking a call against its builtin ------------------------------------------ */
/* Positional arguments the signature takes: at least *min, at most *max;
 * sig_at(i) is the kind of argument i. */
static void sig_range(const char *sig, int *min, int *max)
{
    size_t n = strlen(sig);
    int repeat = n > 0 && sig[n - 1] == '+';
    int fixed = (int)(repeat ? n - 1 : n);
    *min = 0;
    for (int i = 0; i < fixed && sig[i] != 't'; i++) (*min)++;
    *max = fixed;
    if (repeat) *max = sig[fixed - 1] == 'i' ? fixed - 1 + KF_MAX_INTS : KIR_MAX_INPUTS;
}

static char sig_at(const char *sig, int i)
{
    size_t n = strlen(sig);
    int repeat = n > 0 && sig[n - 1] == '+';
    int fixed = (int)(repeat ? n - 1 : n);
    return i < fixed ? sig[i] : sig[fixed - 1];
}

static const char *plural(int n) { return n == 1 ? "" : "s"; }

static int check_range(kf_lower *L, const kf_builtin *b, const kf_attr_spec *spec, kf_value v, double x, kf_loc loc)
{
    if (spec->range == KF_POSITIVE && !(x > 0)) {
        kf_error_value(L, loc, v, "%s: attribute '%s' is %g; it must be positive", b->name, spec->key, x);
        return -1;
    }
    if (spec->range == KF_NONNEG && !(x >= 0)) {
        kf_error_value(L, loc, v, "%s: attribute '%s' is %g; it must be 0 or positive", b->name, spec->key, x);
        return -1;
    }
    return 0;
}

static int check_attr(kf_lower *L, const kf_builtin *b, const kf_attr_spec *spec, kf_value *v, kf_loc loc)
{
    switch (spec->kind) {
    case KIR_ATTR_FLOAT:
        if (v->kind == KF_V_INT) { /* the value stays the config value it is */
            double f = (double)v->u.i;
            v->kind = KF_V_FLOAT;
            v->u.f = f;
        }
        if (v->kind != KF_V_FLOAT) {
            kf_error_value(L, loc, *v, "%s: attribute '%s' must be a number, not %s", b->name, spec->key,
                           kf_a_type(v->kind));
            return -1;
        }
        if (!isfinite(v->u.f)) {
            kf_error_value(L, loc, *v, "%s: attribute '%s' must be finite", b->name, spec->key);
            return -1;
        }
        return check_range(L, b, spec, *v, v->u.f, loc);
    case KIR_ATTR_INT:
        if (v->kind != KF_V_INT) {
            kf_error_value(L, loc, *v, "%s: attribute '%s' must be an int, not %s", b->name, spec->key,
                           kf_not_int(*v));
            return -1;
        }
        return check_range(L, b, spec, *v, (double)v->u.i, loc);
    case KIR_ATTR_STR:
        if (v->kind != KF_V_STR) {
            kf_error_value(L, loc, *v, "%s: attribute '%s' must be a string, not %s", b->name, spec->key,
                           kf_a_type(v->kind));
            return -1;
        }
        if (spec->choices) {
            size_t i = 0;
            while (spec->choices[i] && strcmp(spec->choices[i], v->u.s) != 0) i++;
            if (!spec->choices[i]) {
                ks_buf c = {0};
                for (size_t k = 0; spec->choices[k]; k++)
                    ks_buf_printf(&c, "%s\"%s\"", k ? (spec->choices[k + 1] ? ", " : " or ") : "", spec->choices[k]);
                kf_error_value(L, loc, *v, "%s: attribute '%s' is \"%s\"; it must be %s", b->name, spec->key,
                               v->u.s, ks_buf_cstr(&c));
                ks_buf_free(&c);
                return -1;
            }
        }
        return 0;
    case KIR_ATTR_INTS: break;
    }
    KS_UNREACHABLE();
}

int kf_call_builtin(kf_lower *L, const kf_expr *call, kf_value *out)
{
    const kf_builtin *b = find_builtin(call->u.call.name);
    if (!b) return 0;
    kf_call_args a;
    memset(&a, 0, sizeof a);
    int bad = 0, npos = 0, min, max;
    sig_range(b->sig, &min, &max);
    for (size_t i = 0; i < call->u.call.n; i++)
        if (!call->u.call.args[i].name) npos++;
    if (npos < min || npos > max) {
        if (min == max)
            *out = kf_error(L, call->loc, "%s: expected %d argument%s, got %d", b->name, min, plural(min), npos);
        else if (max == min + 1)
            *out = kf_error(L, call->loc, "%s: expected %d or %d arguments, got %d", b->name, min, max, npos);
        else
            *out = kf_error(L, call->loc, "%s: expected %d to %d arguments, got %d", b->name, min, max, npos);
        return 1;
    }
    size_t nspec = 0;
    while (b->attrs[nspec].key) nspec++;
    KS_ASSERT(nspec <= KF_MAX_ATTRS);
    int pos = 0;
    for (size_t i = 0; i < call->u.call.n; i++) {
        const kf_arg *arg = &call->u.call.args[i];
        kf_value v = kf_eval(L, arg->value);
        if (arg->name) {
            size_t k = 0;
            while (k < nspec && strcmp(b->attrs[k].key, arg->name) != 0) k++;
            if (k == nspec) {
                if (b->lower == lower_attention && strcmp(arg->name, "layer") == 0) {
                    kf_error(L, arg->loc, "attention: 'layer' is not an attribute to give: attention calls are "
                                          "numbered 0, 1, 2... in graph order, one KV-cache layer each");
                } else if (nspec == 0) {
                    kf_error(L, arg->loc, "%s: unknown attribute '%s' (%s takes no attributes)", b->name, arg->name,
                             b->name);
                } else {
                    const char *keys[KF_MAX_ATTRS];
                    ks_buf all = {0};
                    for (size_t s = 0; s < nspec; s++) {
                        keys[s] = b->attrs[s].key;
                        ks_buf_printf(&all, "%s%s", s ? ", " : "", keys[s]);
                    }
                    const char *hint = kf_suggest(L, arg->name, keys, nspec);
                    if (*hint)
                        kf_error(L, arg->loc, "%s: unknown attribute '%s'%s", b->name, arg->name, hint);
                    else
                        kf_error(L, arg->loc, "%s: unknown attribute '%s' (%s takes %s)", b->name, arg->name, b->name,
                                 ks_buf_cstr(&all));
                    ks_buf_free(&all);
                }
                bad = 1;
                continue;
            }
            if (a.given[k]) {
                kf_error(L, arg->loc, "%s: attribute '%s' is given twice", b->name, arg->name);
                bad = 1;
                continue;
            }
            a.given[k] = 1;
            a.attr_loc[k] = arg->loc;
            if (v.kind == KF_V_ERROR || check_attr(L, b, &b->attrs[k], &v, arg->value->loc) != 0) {
                bad = 1;
                continue;
            }
            a.attr[k] = v;
            continue;
        }
        int at = pos++;
        char kind = sig_at(b->sig, at);
        if (v.kind == KF_V_ERROR) {
            bad = 1;
            continue;
        }
        if (kind == 'i') {
            if (v.kind != KF_V_INT) {
                kf_error_value(L, arg->value->loc, v, "%s: argument %d must be an int, not %s", b->name, at + 1,
                               kf_not_int(v));
                bad = 1;
                continue;
            }
            a.ints[a.ni] = v.u.i;
            a.int_loc[a.ni++] = arg->value->loc;
            continue;
        }
        if (v.kind == KF_V_NONE && kind == 't') {
            a.t[a.nt] = KIR_NONE;
        } else if (v.kind == KF_V_NONE) {
            kf_error(L, arg->value->loc, "%s: argument %d is none (an absent optional weight)", b->name, at + 1);
            bad = 1;
            continue;
        } else if (v.kind != KF_V_TENSOR) {
            kf_error(L, arg->value->loc, "%s: argument %d must be a tensor, not %s", b->name, at + 1, kf_a_type(v.kind));
            bad = 1;
            continue;
        } else {
            a.t[a.nt] = v.u.t;
        }
        a.t_loc[a.nt++] = arg->value->loc;
    }
    for (size_t k = 0; k < nspec && !bad; k++) {
        if (a.given[k]) continue;
        const kf_attr_spec *s = &b->attrs[k];
        if (s->required) {
            kf_error(L, call->loc, "%s: missing attribute '%s'", b->name, s->key);
            bad = 1;
        } else if (s->kind == KIR_ATTR_STR) {
            a.attr[k] = kf_str(s->dflt_s);
        } else if (s->kind == KIR_ATTR_INT) {
            a.attr[k] = kf_int((int64_t)s->dflt);
        } else {
            a.attr[k] = kf_float(s->dflt);
        }
    }
    *out = bad ? kf_err_value() : b->lower(L, b, &a, call->loc);
    return 1;
}

/* ---- outputs ----------------------------------------------------------------------- */
void kf_emit_output(kf_lower *L, const char *name, kf_value v, kf_loc loc)
{
    if (v.kind == KF_V_ERROR) return;
    if (v.kind != KF_V_TENSOR) {
        kf_error(L, loc, "output '%s' must be a tensor, not %s", name, kf_a_type(v.kind));
        return;
    }
    for (size_t i = 0; i < L->g->n_nodes; i++) {
        if (L->g->nodes[i].op == KIR_OP_OUTPUT && strcmp(kir_get_str(L->g, (kir_val)i, "name", ""), name) == 0) {
            kf_error(L, loc, "output '%s' is defined twice", name);
            return;
        }
    }
    if (kf_node_budget(L, loc) != 0) return;
    kir_val o = new_node(L, KIR_OP_OUTPUT, loc, &v.u.t, 1);
    kir_set_str(L->g, o, "name", name);
    if (finish(L, o, loc).kind != KF_V_TENSOR) return;
    if (L->n_outputs++ == 0) {
        L->first_output = o;
        L->first_output_loc = loc;
    }
}
