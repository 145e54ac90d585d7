/*
 * lower_builtins.c — the tensor builtins of the forward block and the
 * operators on tensors, each lowered to IR nodes (ir/ops.def) whose shapes
 * kir_infer checks. The table below is the whole list: a builtin is one
 * line (name, positional signature, attributes, lowering function).
 *
 * Positional arguments are tensors (or none, where the signature allows),
 * or compile-time ints for view's and slice's sizes; `key: value`
 * arguments are compile-time attributes: each is an IR attribute of the
 * op (ir/ops.def), whose kind, allowed words, rule and default the schema
 * gives; the spec here says only whether the language requires it, lets
 * the schema's fallback stand in, or computes a default from the operands.
 * Nodes are made with kir_build, as the passes and tests make them.
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

/* A node (kir_build); a shape the op's rule refuses is the user's,
 * reported at the call. */
static kf_value build(kf_lower *L, kir_op op, kf_loc loc, const kir_val *in, int n_in, const kir_setting *set,
                      int n_set)
{
    if (kf_node_budget(L, loc) != 0) return kf_err_value();
    ks_buf err = {0};
    kir_val v = kir_build(L->g, op, kf_kir_loc(L, loc), in, n_in, set, n_set, &err);
    kf_value r = v == KIR_NONE ? kf_error(L, loc, "%s", ks_buf_cstr(&err)) : kf_tval(v);
    ks_buf_free(&err);
    return r;
}

static kf_value emit2(kf_lower *L, kir_op op, kf_loc loc, kir_val a, kir_val b)
{
    kir_val in[2] = {a, b};
    return build(L, op, loc, in, 2, NULL, 0);
}

/* x * value + shift (the shift only when it is not 0: the text form of a plain scale stays) */
static kf_value emit_scale(kf_lower *L, kir_val x, double value, double shift, kf_loc loc)
{
    kir_setting set[] = {KIR_WITH_FLOAT(KIR_A_SCALE_VALUE, value), KIR_WITH_FLOAT(KIR_A_SCALE_SHIFT, shift)};
    return build(L, KIR_OP_SCALE, loc, &x, 1, set, shift != 0.0 ? 2 : 1);
}

/* The inputs are named for their roles: `tokens`, `positions` (lower.c binds them). */
kir_val kf_emit_input(kf_lower *L, const char *name, kf_loc loc)
{
    kir_word role = kir_word_lookup(KIR_SET_ROLE, name);
    KS_ASSERT(role != KIR_WORD_COUNT);
    return kir_input(L->g, role, kf_kir_loc(L, loc));
}

static int64_t last_dim(kf_lower *L, kir_val v)
{
    const kir_node *n = kir_node_at(L->g, v);
    return n->ndim ? n->dims[n->ndim - 1] : 1;
}

/* ---- operators on tensors ------------------------------------------------------ */
kf_value kf_tensor_neg(kf_lower *L, kf_value a, kf_loc loc) { return emit_scale(L, a.u.t, -1.0, 0.0, loc); }

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
        case '/': return emit2(L, KIR_OP_DIV, loc, a.u.t, b.u.t);
        default: return kf_error(L, loc, "'%s' between two tensors is not supported (only + - * /)", ot);
        }
    }
    kf_value t = a.kind == KF_V_TENSOR ? a : b, s = a.kind == KF_V_TENSOR ? b : a;
    if (s.kind != KF_V_INT && s.kind != KF_V_FLOAT)
        return kf_error(L, loc, "'%s' cannot combine a tensor with %s", ot, kf_a_type(s.kind));
    double x = s.kind == KF_V_INT ? (double)s.u.i : s.u.f;
    if (op == '+' || op == '-') {
        /* x + c, c + x, x - c: a shift; c - x: -x shifted */
        if (!isfinite(x)) return kf_error(L, loc, "'%s' adds %g; the number must be finite", ot, x);
        if (x == 0.0 && !(op == '-' && a.kind != KF_V_TENSOR)) return t; /* x + 0 is x */
        if (op == '-' && a.kind == KF_V_TENSOR) return emit_scale(L, t.u.t, 1.0, -x, loc);
        return emit_scale(L, t.u.t, op == '-' ? -1.0 : 1.0, x, loc);
    }
    if (op == '/' && a.kind == KF_V_TENSOR) {
        if (x == 0) return kf_error(L, loc, "division by zero in '/'");
        x = 1.0 / x;
    } else if (op == '/') {
        return kf_error(L, loc, "'/' cannot divide a number by a tensor");
    } else if (op != '*') {
        return kf_error(L, loc, "'%s' between a tensor and a number is not supported (only + - * /)", ot);
    }
    if (!isfinite(x)) return kf_error(L, loc, "'%s' scales by %g; the factor must be finite", ot, x);
    return emit_scale(L, t.u.t, x, 0.0, loc);
}

/* a >= b, a > b between tensors: a mask of 1 and 0 (ge, gt); a <= b and a < b the same with the
 * operands swapped (the IR broadcasts its second operand) */
kf_value kf_tensor_compare(kf_lower *L, int op, kf_value a, kf_value b, kf_loc loc)
{
    switch (op) {
    case KF_OP_GE: return emit2(L, KIR_OP_GE, loc, a.u.t, b.u.t);
    case '>': return emit2(L, KIR_OP_GT, loc, a.u.t, b.u.t);
    case KF_OP_LE: return emit2(L, KIR_OP_GE, loc, b.u.t, a.u.t);
    case '<': return emit2(L, KIR_OP_GT, loc, b.u.t, a.u.t);
    default: KS_UNREACHABLE(); /* compare() passes the four orderings alone */
    }
}

/* ---- the builtin table ----------------------------------------------------------- */
/* What a call may leave out. */
typedef enum kf_attr_need {
    KF_REQUIRED, /* the call must give it */
    KF_FALLBACK, /* absent: the schema's fallback (ir/ops.def) */
    KF_COMPUTED, /* absent: the lowering computes it from the operands */
} kf_attr_need;

typedef struct kf_attr_spec {
    kir_attr_id id;    /* the IR attribute (its key is the name a call writes); KIR_A_COUNT ends a list */
    kf_attr_need need; /* what a call may leave out */
} kf_attr_spec;

/* Words the language takes for another: Hugging Face names RoPE without
 * scaling rope_type "default". */
static const struct {
    kir_set set;       /* the set */
    const char *alias; /* the word a .kiln may write */
    kir_word word;     /* what it means */
} word_aliases[] = {{KIR_SET_ROPE_SCALING, "default", KIR_ROPE_SCALING_NONE}};

enum { KF_MAX_ATTRS = 14, KF_MAX_INTS = KIR_MAX_DIMS - 1 };

/* A call's arguments after evaluation and checking. */
typedef struct kf_call_args {
    kir_val t[KIR_MAX_INPUTS];    /* positional tensors; KIR_NONE for none */
    kf_loc t_loc[KIR_MAX_INPUTS]; /* where each is written */
    int nt;                       /* number of positional tensors */
    int64_t ints[KF_MAX_INTS];    /* positional ints (view, slice) */
    kf_loc int_loc[KF_MAX_INTS];  /* where each is written */
    int ni;                       /* number of ints */
    kf_value attr[KF_MAX_ATTRS];  /* attribute values, aligned with the spec: INT, FLOAT, or STR (a WORD's text) */
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
    const char *number_hint;   /* what to write instead when a number is given for a tensor; NULL: none */
};

static const kf_attr_spec no_attrs[] = {{KIR_A_COUNT, 0}};
/* a norm's `offset:` is the derived weight's (lower_norm): its weight is w + offset, as Gemma's (1 + w) */
static const kf_attr_spec norm_attrs[] = {{KIR_A_RMS_NORM_EPS, KF_REQUIRED}, {KIR_A_WEIGHT_OFFSET, KF_COMPUTED},
                                          {KIR_A_COUNT, 0}};
static const kf_attr_spec topk_attrs[] = {{KIR_A_TOPK_K, KF_REQUIRED}, {KIR_A_COUNT, 0}};
static const kf_attr_spec masked_fill_attrs[] = {{KIR_A_MASKED_FILL_VALUE, KF_REQUIRED}, {KIR_A_COUNT, 0}};
static const kf_attr_spec clamp_attrs[] = {{KIR_A_CLAMP_MIN, KF_COMPUTED}, {KIR_A_CLAMP_MAX, KF_COMPUTED}, {KIR_A_COUNT, 0}};
static const kf_attr_spec rope_attrs[] = {
    {KIR_A_ROPE_THETA, KF_REQUIRED},
    {KIR_A_ROPE_STYLE, KF_FALLBACK},
    {KIR_A_ROPE_ROT_DIM, KF_COMPUTED}, /* the whole head */
    {KIR_A_ROPE_SCALING, KF_FALLBACK},
    {KIR_A_ROPE_FACTOR, KF_FALLBACK},
    {KIR_A_ROPE_LOW_FREQ_FACTOR, KF_FALLBACK},
    {KIR_A_ROPE_HIGH_FREQ_FACTOR, KF_FALLBACK},
    {KIR_A_ROPE_ORIGINAL_MAX_POSITIONS, KF_FALLBACK},
    {KIR_A_ROPE_BETA_FAST, KF_COMPUTED},        /* yarn's; absent: the schema's, and not written */
    {KIR_A_ROPE_BETA_SLOW, KF_COMPUTED},
    {KIR_A_ROPE_TRUNCATE, KF_COMPUTED},
    {KIR_A_ROPE_ATTENTION_FACTOR, KF_COMPUTED},
    {KIR_A_ROPE_SHORT_FACTOR, KF_COMPUTED},     /* longrope's; absent: none, and not written */
    {KIR_A_ROPE_LONG_FACTOR, KF_COMPUTED},
    {KIR_A_COUNT, 0},
};
static const kf_attr_spec attention_attrs[] = {
    {KIR_A_ATTENTION_SCALE, KF_COMPUTED}, /* 1/sqrt(head size) */
    {KIR_A_ATTENTION_WINDOW, KF_FALLBACK},
    {KIR_A_ATTENTION_SOFTCAP, KF_FALLBACK},
    {KIR_A_ATTENTION_ALIBI, KF_COMPUTED}, /* set when true: the text of other models stays */
    {KIR_A_COUNT, 0},
};

/* The call's value of attribute k of the spec as a setting of node's attribute. */
static kir_setting setting_of(const kf_builtin *b, const kf_call_args *a, int k);

static kf_value lower_simple(kf_lower *L, const kf_builtin *b, kf_call_args *a, kf_loc loc)
{
    return build(L, b->op, loc, a->t, a->nt, NULL, 0);
}

static kf_value lower_linear(kf_lower *L, const kf_builtin *b, kf_call_args *a, kf_loc loc)
{
    kf_value mm = emit2(L, KIR_OP_MATMUL, loc, a->t[0], a->t[1]);
    if (mm.kind != KF_V_TENSOR || a->nt < 3 || a->t[2] == KIR_NONE) return mm;
    return emit2(L, KIR_OP_ADD, loc, mm.u.t, a->t[2]);
}

/* A norm; with `offset: c` its weight w is replaced by a weight derived from it, w + c (computed when
 * the engine is built: derive="offset", passes/derived_weight.h), so that every backend's norm stays
 * x-normalized times a weight. */
static kf_value lower_norm(kf_lower *L, const kf_builtin *b, kf_call_args *a, kf_loc loc)
{
    kir_setting set[] = {setting_of(b, a, 0)};
    if (a->given[1] && a->attr[1].u.f != 0.0) {
        kir_val w = a->nt > 1 ? a->t[1] : KIR_NONE;
        const kir_node *wn = w != KIR_NONE ? kir_node_at(L->g, w) : NULL;
        if (!wn || wn->op != KIR_OP_WEIGHT || kir_attr_has(L->g, w, KIR_A_WEIGHT_DERIVE))
            return kf_error(L, a->attr_loc[1], "%s: offset: needs the norm's weight, a declared weight (not %s)",
                            b->name, wn ? "a computed tensor" : "none");
        const char *src = kir_attr_str(L->g, w, KIR_A_WEIGHT_NAME);
        char *name = ks_arena_printf(&L->g->arena, "%s%+g", src, a->attr[1].u.f);
        /* one derived weight for a weight and an offset, however many norms use it (a weight's name is
         * its own) */
        kir_val d = KIR_NONE;
        for (size_t i = 0; i < L->g->n_nodes && d == KIR_NONE; i++)
            if (L->g->nodes[i].op == KIR_OP_WEIGHT && strcmp(kir_attr_str(L->g, (kir_val)i, KIR_A_WEIGHT_NAME), name) == 0)
                d = (kir_val)i;
        if (d == KIR_NONE) {
            int64_t rows = wn->dims[0];
            d = kir_weight(L->g, name, wn->dtype, wn->ndim, wn->dims, wn->loc);
            kir_attr_set_word(L->g, d, KIR_A_WEIGHT_DERIVE, KIR_DERIVE_OFFSET);
            kir_attr_set_str(L->g, d, KIR_A_WEIGHT_SOURCES, src);
            kir_attr_set_ints(L->g, d, KIR_A_WEIGHT_ROWS, &rows, 1);
            kir_attr_set_float(L->g, d, KIR_A_WEIGHT_OFFSET, a->attr[1].u.f);
        }
        a->t[1] = d;
    }
    return build(L, b->op, loc, a->t, a->nt, set, 1);
}

/* topk(x, k: n): its one attribute */
static kf_value lower_topk(kf_lower *L, const kf_builtin *b, kf_call_args *a, kf_loc loc)
{
    kir_setting set[] = {setting_of(b, a, 0)};
    return build(L, b->op, loc, a->t, a->nt, set, 1);
}

/* clamp(x, min: a, max: b): either bound or both, a <= b */
static kf_value lower_clamp(kf_lower *L, const kf_builtin *b, kf_call_args *a, kf_loc loc)
{
    if (!a->given[0] && !a->given[1]) return kf_error(L, loc, "clamp: give min:, max: or both");
    if (a->given[0] && a->given[1] && a->attr[0].u.f > a->attr[1].u.f)
        return kf_error(L, a->attr_loc[1], "clamp: max %g is below min %g", a->attr[1].u.f, a->attr[0].u.f);
    kir_setting set[2];
    int n = 0;
    for (int k = 0; k < 2; k++)
        if (a->given[k]) set[n++] = setting_of(b, a, k);
    return build(L, b->op, loc, a->t, a->nt, set, n);
}

/* masked_fill(x, mask, value: v): v where mask is not 0 (a mask of ge/gt), else x */
static kf_value lower_masked_fill(kf_lower *L, const kf_builtin *b, kf_call_args *a, kf_loc loc)
{
    kir_setting set[] = {setting_of(b, a, 0)};
    return build(L, b->op, loc, a->t, a->nt, set, 1);
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
    kir_setting set[] = {KIR_WITH_INTS(KIR_A_RESHAPE_SHAPE, shape, (uint32_t)a->ni + 1)};
    return build(L, KIR_OP_RESHAPE, loc, a->t, 1, set, 1);
}

static kf_value lower_slice(kf_lower *L, const kf_builtin *b, kf_call_args *a, kf_loc loc)
{
    kir_setting set[] = {KIR_WITH_INT(KIR_A_SLICE_START, a->ints[0]), KIR_WITH_INT(KIR_A_SLICE_END, a->ints[1])};
    return build(L, KIR_OP_SLICE, loc, a->t, 1, set, 2);
}

static kf_value lower_rope(kf_lower *L, const kf_builtin *b, kf_call_args *a, kf_loc loc)
{
    int64_t head = last_dim(L, a->t[0]);
    if (!a->given[2]) a->attr[2] = kf_int(head); /* rot_dim: the whole head */
    int64_t rot = a->attr[2].u.i;
    if (rot < 2 || rot > head || rot % 2 != 0)
        return kf_error_value(L, a->given[2] ? a->attr_loc[2] : loc, a->attr[2],
                              "rope: rot_dim %lld must be even, at least 2 and at most the head size %lld",
                              (long long)rot, (long long)head);
    /* llama3 scaling blends between two wavelengths: the high frequency factor must be the larger
     * (the verifier's rule too, said here at the .kiln and config place) */
    if (strcmp(a->attr[3].u.s, "llama3") == 0 && !(a->attr[6].u.f > a->attr[5].u.f))
        return kf_error_value(L, a->given[6] ? a->attr_loc[6] : loc, a->attr[6],
                              "rope: llama3 scaling needs high_freq_factor (%g) above low_freq_factor (%g)",
                              a->attr[6].u.f, a->attr[5].u.f);
    /* longrope and dynamic scaling read each token's sequence length: the third argument, the input
     * seq_lengths (the others take none) */
    const char *scaling = a->attr[3].u.s;
    const int by_length = kir_rope_scaling_by_length(kir_word_lookup(KIR_SET_ROPE_SCALING, scaling));
    if (by_length && (a->nt < 3 || a->t[2] == KIR_NONE))
        return kf_error(L, loc, "rope: %s scaling needs each token's sequence length: rope(x, positions, seq_lengths, ...)",
                        scaling);
    if (!by_length && a->nt > 2 && a->t[2] != KIR_NONE)
        return kf_error(L, a->t_loc[2], "rope: a third argument (seq_lengths) is for longrope and dynamic scaling only (this one's "
                        "scaling is %s)",
                        scaling);
    for (int k = 12; k < 14; k++) {
        int64_t want = strcmp(scaling, "longrope") == 0 ? rot / 2 : 0;
        size_t got = a->given[k] ? a->attr[k].u.floats.n : 0;
        if ((int64_t)got != want)
            return kf_error_value(L, a->given[k] ? a->attr_loc[k] : loc, a->attr[k],
                                  want ? "rope: longrope scaling needs %s of rot_dim/2 = %lld numbers, got %zu"
                                       : "rope: %s is longrope's (of rot_dim/2 = %lld numbers), not for this scaling "
                                         "(%zu given)",
                                  kir_attr_table[rope_attrs[k].id].key, (long long)(rot / 2), got);
    }
    kir_setting set[14];
    int n = 0;
    for (int k = 0; k < 8; k++) set[n++] = setting_of(b, a, k);
    for (int k = 8; k < 14; k++) /* yarn's, the attention factor and longrope's: written only when given */
        if (a->given[k]) set[n++] = setting_of(b, a, k);
    return build(L, KIR_OP_ROPE, loc, a->t, by_length ? 3 : 2, set, n);
}

/* expert_matmul(x, w, idx, b): each token's rows through the experts idx chooses; expert_matmul(x, w):
 * row j of each token through matrix j (x [T,E,K]: a weight a head, MLA's absorbed projections) */
static kf_value lower_expert_matmul(kf_lower *L, const kf_builtin *b, kf_call_args *a, kf_loc loc)
{
    if (a->nt > 3 && a->t[3] != KIR_NONE && (a->nt < 3 || a->t[2] == KIR_NONE))
        return kf_error(L, a->t_loc[3], "expert_matmul: a bias needs the indices (expert_matmul(x, w, idx, b))");
    return build(L, b->op, loc, a->t, a->nt, NULL, 0);
}

/* float32(x): x, which fast precision leaves in float32, with what is computed from such values alone
 * (DeepSeek's router, which Hugging Face computes in float32 whatever the model's dtype) */
static kf_value lower_float32(kf_lower *L, const kf_builtin *b, kf_call_args *a, kf_loc loc)
{
    const kir_node *n = kir_node_at(L->g, a->t[0]);
    if (n->op == KIR_OP_WEIGHT || n->op == KIR_OP_INPUT || n->op == KIR_OP_RESHAPE || n->dtype != KIR_F32)
        return kf_error(L, a->t_loc[0], "%s: needs a computed float value (not a weight, an input or a view)", b->name);
    kir_attr_set_int(L->g, a->t[0], KIR_A_ANY_KEEP_F32, 1);
    return kf_tval(a->t[0]);
}

static kf_value lower_attention(kf_lower *L, const kf_builtin *b, kf_call_args *a, kf_loc loc)
{
    if (!a->given[0]) a->attr[0] = kf_float(1.0 / sqrt((double)last_dim(L, a->t[0]))); /* scale */
    /* Attention calls are numbered in graph order: each owns one layer of
     * the KV cache. */
    kir_setting set[] = {KIR_WITH_INT(KIR_A_ATTENTION_LAYER, L->n_attention), setting_of(b, a, 0), setting_of(b, a, 1),
                         setting_of(b, a, 2), setting_of(b, a, 3)};
    const int alibi = a->given[3] && a->attr[3].u.i != 0;
    /* attention(q, k, v, sinks): sinks, a weight of a logit a head, optional */
    const int nt = a->nt > 3 && a->t[3] != KIR_NONE ? 4 : 3;
    kf_value r = build(L, KIR_OP_ATTENTION, loc, a->t, nt, set, alibi ? 5 : 4);
    if (r.kind == KF_V_TENSOR) L->n_attention++;
    return r;
}

static const kf_builtin builtins[] = {
    {"embed", "TT", no_attrs, lower_simple, KIR_OP_EMBED, NULL},
    {"linear", "TTt", no_attrs, lower_linear, KIR_OP_MATMUL, NULL},
    {"matmul", "TT", no_attrs, lower_simple, KIR_OP_MATMUL, NULL},
    {"rms_norm", "Tt", norm_attrs, lower_norm, KIR_OP_RMS_NORM, NULL},
    {"layer_norm", "Ttt", norm_attrs, lower_norm, KIR_OP_LAYER_NORM, NULL},
    {"silu", "T", no_attrs, lower_simple, KIR_OP_SILU, NULL},
    {"gelu", "T", no_attrs, lower_simple, KIR_OP_GELU, NULL},
    {"gelu_tanh", "T", no_attrs, lower_simple, KIR_OP_GELU_TANH, NULL},
    {"relu", "T", no_attrs, lower_simple, KIR_OP_RELU, NULL},
    {"tanh", "T", no_attrs, lower_simple, KIR_OP_TANH, NULL},
    {"exp", "T", no_attrs, lower_simple, KIR_OP_EXP, NULL},
    {"sigmoid", "T", no_attrs, lower_simple, KIR_OP_SIGMOID, NULL},
    {"clamp", "T", clamp_attrs, lower_clamp, KIR_OP_CLAMP, NULL},
    {"maximum", "TT", no_attrs, lower_simple, KIR_OP_MAX, "a number bounds a tensor from below with clamp(x, min: c)"},
    {"minimum", "TT", no_attrs, lower_simple, KIR_OP_MIN, "a number bounds a tensor from above with clamp(x, max: c)"},
    {"softmax", "T", no_attrs, lower_simple, KIR_OP_SOFTMAX, NULL},
    {"sum", "T", no_attrs, lower_simple, KIR_OP_SUM, NULL},
    {"amax", "T", no_attrs, lower_simple, KIR_OP_AMAX, NULL},
    {"masked_fill", "TT", masked_fill_attrs, lower_masked_fill, KIR_OP_MASKED_FILL, NULL},
    {"amin", "T", no_attrs, lower_simple, KIR_OP_AMIN, NULL},
    {"topk", "T", topk_attrs, lower_topk, KIR_OP_TOPK, NULL},
    {"gather", "TT", no_attrs, lower_simple, KIR_OP_GATHER, NULL},
    {"expert_matmul", "TTtt", no_attrs, lower_expert_matmul, KIR_OP_EXPERT_MATMUL, NULL},
    {"expert_sum", "TT", no_attrs, lower_simple, KIR_OP_EXPERT_SUM, NULL},
    {"view", "Ti+", no_attrs, lower_view, KIR_OP_RESHAPE, NULL},
    {"slice", "Tii", no_attrs, lower_slice, KIR_OP_SLICE, NULL},
    {"concat", "T+", no_attrs, lower_simple, KIR_OP_CONCAT, NULL},
    {"rope", "TTt", rope_attrs, lower_rope, KIR_OP_ROPE, NULL},
    {"attention", "TTTt", attention_attrs, lower_attention, KIR_OP_ATTENTION, NULL},
    {"float32", "T", no_attrs, lower_float32, KIR_OP_COUNT, NULL},
};
enum { KF_N_BUILTINS = sizeof builtins / sizeof *builtins };

static const char *const builtin_names[KF_N_BUILTINS] = {
    "embed", "linear", "matmul", "rms_norm", "layer_norm", "silu", "gelu",
    "gelu_tanh", "relu", "tanh", "exp", "sigmoid", "clamp", "maximum", "minimum", "softmax", "sum", "amax",
    "masked_fill", "amin", "topk", "gather",
    "expert_matmul", "expert_sum", "view", "slice",
    "concat", "rope", "attention", "float32",
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

/* The words a WORD attribute takes, for messages: "\"halves\" or \"pairs\"". */
static void list_words(kir_set set, ks_buf *out)
{
    const char *words[KIR_WORD_COUNT + 8];
    int n = 0;
    for (int w = 0; w < KIR_WORD_COUNT; w++)
        if (kir_word_table[w].set == set) words[n++] = kir_word_table[w].text;
    for (size_t i = 0; i < sizeof word_aliases / sizeof *word_aliases; i++)
        if (word_aliases[i].set == set) words[n++] = word_aliases[i].alias;
    for (int k = 0; k < n; k++) ks_buf_printf(out, "%s\"%s\"", k == 0 ? "" : k == n - 1 ? " or " : ", ", words[k]);
}

/* A given attribute's value against the schema: its kind, a word of its
 * set (or an alias of one, replaced by the word), its rule. */
static int check_attr(kf_lower *L, const kf_builtin *b, const kf_attr_spec *spec, kf_value *v, kf_loc loc)
{
    const kir_attr_info *info = &kir_attr_table[spec->id];
    const char *rule = kir_rule_text(info->rule);
    switch (info->kind) {
    case KIR_ATTR_FLOAT:
        if (v->kind == KF_V_INT) { /* the value stays the config value it is */
            double f = (double)v->u.i;
            v->kind = KF_V_FLOAT;
            v->u.f = f;
        }
        if (v->kind != KF_V_FLOAT) {
            kf_error_value(L, loc, *v, "%s: attribute '%s' must be a number, not %s", b->name, info->key,
                           kf_a_type(v->kind));
            return -1;
        }
        if (!isfinite(v->u.f) && !(info->rule == KIR_RULE_ANY && !isnan(v->u.f))) { /* ANY: inf allowed */
            kf_error_value(L, loc, *v, "%s: attribute '%s' must be finite", b->name, info->key);
            return -1;
        }
        if (!kir_rule_holds(info->rule, v->u.f)) {
            kf_error_value(L, loc, *v, "%s: attribute '%s' is %g; it %s", b->name, info->key, v->u.f, rule);
            return -1;
        }
        return 0;
    case KIR_ATTR_INT:
        if (v->kind == KF_V_BOOL && info->rule == KIR_RULE_BOOL) v->kind = KF_V_INT; /* true, false: 1, 0 */
        if (v->kind != KF_V_INT) {
            kf_error_value(L, loc, *v, "%s: attribute '%s' must be an int, not %s", b->name, info->key,
                           kf_not_int(*v));
            return -1;
        }
        if (!kir_rule_holds(info->rule, (double)v->u.i)) {
            kf_error_value(L, loc, *v, "%s: attribute '%s' is %lld; it %s", b->name, info->key, (long long)v->u.i,
                           rule);
            return -1;
        }
        return 0;
    case KIR_ATTR_WORD:
        if (v->kind != KF_V_STR) {
            kf_error_value(L, loc, *v, "%s: attribute '%s' must be a string, not %s", b->name, info->key,
                           kf_a_type(v->kind));
            return -1;
        }
        for (size_t i = 0; i < sizeof word_aliases / sizeof *word_aliases; i++)
            if (word_aliases[i].set == info->set && strcmp(word_aliases[i].alias, v->u.s) == 0)
                *v = kf_str(kir_word_table[word_aliases[i].word].text);
        if (kir_word_lookup(info->set, v->u.s) == KIR_WORD_COUNT) {
            ks_buf c = {0};
            list_words(info->set, &c);
            kf_error_value(L, loc, *v, "%s: attribute '%s' is \"%s\"; it must be %s", b->name, info->key, v->u.s,
                           ks_buf_cstr(&c));
            ks_buf_free(&c);
            return -1;
        }
        return 0;
    case KIR_ATTR_FLOATS:
        if (v->kind == KF_V_INTS) { /* a list of integers, read as numbers (the value stays the config value) */
            double *f = ks_arena_alloc(&L->scratch, (v->u.ints.n ? v->u.ints.n : 1) * sizeof *f);
            size_t n = v->u.ints.n;
            for (size_t i = 0; i < n; i++) f[i] = (double)v->u.ints.v[i];
            v->kind = KF_V_FLOATS;
            v->u.floats.v = f;
            v->u.floats.n = n;
        }
        if (v->kind != KF_V_FLOATS) {
            kf_error_value(L, loc, *v, "%s: attribute '%s' must be a list of numbers, not %s", b->name, info->key,
                           kf_a_type(v->kind));
            return -1;
        }
        for (size_t i = 0; i < v->u.floats.n; i++)
            if (!isfinite(v->u.floats.v[i]) || !kir_rule_holds(info->rule, v->u.floats.v[i])) {
                kf_error_value(L, loc, *v, "%s: attribute '%s' holds %g at [%zu]; it %s", b->name, info->key,
                               v->u.floats.v[i], i, rule ? rule : "must be finite");
                return -1;
            }
        return 0;
    }
    KS_UNREACHABLE(); /* the builtins take no STR or INTS attributes */
}

/* The value of an attribute no call gave: the schema's fallback. */
static kf_value fallback_of(const kf_attr_spec *spec)
{
    const kir_attr_info *info = &kir_attr_table[spec->id];
    switch (info->kind) {
    case KIR_ATTR_INT: return kf_int((int64_t)info->fallback);
    case KIR_ATTR_FLOAT: return kf_float(info->fallback);
    case KIR_ATTR_WORD: return kf_str(kir_word_table[(int)info->fallback].text);
    case KIR_ATTR_FLOATS: return (kf_value){.kind = KF_V_FLOATS}; /* none */
    }
    KS_UNREACHABLE();
}

static kir_setting setting_of(const kf_builtin *b, const kf_call_args *a, int k)
{
    kir_attr_id id = b->attrs[k].id;
    const kf_value *v = &a->attr[k];
    switch (kir_attr_table[id].kind) {
    case KIR_ATTR_INT: return KIR_WITH_INT(id, v->u.i);
    case KIR_ATTR_FLOAT: return KIR_WITH_FLOAT(id, v->u.f);
    case KIR_ATTR_WORD: return KIR_WITH_WORD(id, kir_word_lookup(kir_attr_table[id].set, v->u.s));
    case KIR_ATTR_FLOATS: return KIR_WITH_FLOATS(id, v->u.floats.v, (uint32_t)v->u.floats.n);
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
    while (b->attrs[nspec].id != KIR_A_COUNT) nspec++;
    KS_ASSERT(nspec <= KF_MAX_ATTRS);
    int pos = 0;
    for (size_t i = 0; i < call->u.call.n; i++) {
        const kf_arg *arg = &call->u.call.args[i];
        kf_value v = kf_eval(L, arg->value);
        if (arg->name) {
            size_t k = 0;
            while (k < nspec && strcmp(kir_attr_table[b->attrs[k].id].key, arg->name) != 0) k++;
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
                        keys[s] = kir_attr_table[b->attrs[s].id].key;
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
            const int hint = (v.kind == KF_V_INT || v.kind == KF_V_FLOAT) && b->number_hint;
            kf_error(L, arg->value->loc, "%s: argument %d must be a tensor, not %s%s%s%s", b->name, at + 1,
                     kf_a_type(v.kind), hint ? " (" : "", hint ? b->number_hint : "", hint ? ")" : "");
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
        if (s->need == KF_REQUIRED) {
            kf_error(L, call->loc, "%s: missing attribute '%s'", b->name, kir_attr_table[s->id].key);
            bad = 1;
        } else if (s->need == KF_FALLBACK) {
            a.attr[k] = fallback_of(s);
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
        if (L->g->nodes[i].op == KIR_OP_OUTPUT && strcmp(kir_attr_str(L->g, (kir_val)i, KIR_A_OUTPUT_NAME), name) == 0) {
            kf_error(L, loc, "output '%s' is defined twice", name);
            return;
        }
    }
    kir_setting set[] = {KIR_WITH_STR(KIR_A_OUTPUT_NAME, name)};
    kf_value o = build(L, KIR_OP_OUTPUT, loc, &v.u.t, 1, set, 1);
    if (o.kind != KF_V_TENSOR) return;
    if (L->n_outputs++ == 0) {
        L->first_output = o.u.t;
        L->first_output_loc = loc;
    }
}
