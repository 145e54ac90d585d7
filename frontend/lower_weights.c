/*
 * lower_weights.c — weight declarations: shapes, layer templates, the
 * checkpoint tensors behind each weight, and the WEIGHT nodes with their
 * bindings.
 *
 *     [optional] [layer] weight NAME[d0, d1] = "a" | "b".T | "c"[lo : hi] [if cond];
 *
 * The declared shape is what the graph sees. An alternative names a
 * checkpoint tensor (in a layer weight a template whose {i} is the layer
 * index); `.T` swaps a tensor's last two dims (a 2-D tensor read transposed;
 * a 3-D [experts, in, out], gpt-oss's, each expert's matrix), `[lo : hi]`
 * keeps rows lo..hi of dim 0 after the transposition, `[lo : hi : step]`
 * every step-th of them, and `[:, lo : hi]` (`: step`) rows of dim 1 for each
 * index of dim 0 (gpt-oss's gate and up, interleaved: `[:, 0 : 2 * ffn : 2]`
 * and `[:, 1 : 2 * ffn : 2]`). The first alternative present in the
 * checkpoint wins; it must then have the declared shape once read that way.
 * A template with {e} stacks one tensor per expert: the weight's dim 0 is
 * the expert index e, and expert e's tensor (each read the same way) has the
 * rest of the declared shape (Mixtral's experts.{e}.w1.weight into
 * [experts, ffn, hidden]); the alternative is present when expert 0's
 * tensor is, and then every expert's must be.
 * No alternative present is an error, or none for an `optional` weight; a
 * false `if` condition makes the weight none without looking. Without a
 * checkpoint, every non-optional weight is taken from its first alternative
 * with the declared shape, and optional ones are none.
 *
 * A weight becomes a WEIGHT node (dtype f32: the engine stores f32 for the
 * CPU target) the first time the forward block uses it, so the graph holds
 * only weights that are used; each node gets one kf_weight_binding.
 */
#include "frontend/lower.h"

#include <string.h>

/* Whether template t has the expert placeholder {e}. */
static int has_expert(const char *t) { return strstr(t, "{e}") != NULL; }

/* Check the {placeholders} of a template: {i}, only in a layer weight, which
 * must use it; {e}, in a weight of two dims or more. */
static int check_template(kf_lower *L, const kf_item *it, const kf_weight_src *src)
{
    const char *t = src->tensor;
    int uses_i = 0;
    if (!*t) {
        kf_error(L, src->loc, "weight '%s': empty tensor name", it->name);
        return -1;
    }
    for (size_t i = 0; t[i]; i++) {
        /* The column of byte i of the literal (exact when no escape precedes it). */
        kf_loc at = {src->loc.line, src->loc.col + 1 + (int)i};
        if (t[i] == '}') {
            kf_error(L, at, "weight '%s': unmatched '}' in tensor name \"%s\"", it->name, t);
            return -1;
        }
        if (t[i] != '{') continue;
        const char *close = strchr(t + i, '}');
        if (!close) {
            kf_error(L, at, "weight '%s': unterminated placeholder in tensor name \"%s\"", it->name, t);
            return -1;
        }
        int len = (int)(close - (t + i)) + 1;
        if (len != 3 || (t[i + 1] != 'i' && t[i + 1] != 'e')) {
            kf_error(L, at, "weight '%s': unknown placeholder '%.*s' ({i}, the layer index, and {e}, the expert index, "
                     "exist)", it->name, len, t + i);
            return -1;
        }
        if (t[i + 1] == 'e') {
            if (it->n_dims < 2) {
                kf_error(L, at, "weight '%s': placeholder {e} stacks a tensor per expert along dim 0, so the weight "
                         "needs two dims or more (declared with %zu)", it->name, it->n_dims);
                return -1;
            }
            i += 2;
            continue;
        }
        if (!it->is_layer) {
            kf_error(L, at, "weight '%s': placeholder {i} in a weight that is not a layer weight (declare it 'layer weight')",
                     it->name);
            return -1;
        }
        uses_i = 1;
        i += 2;
    }
    if (it->is_layer && !uses_i) {
        kf_error(L, src->loc, "layer weight '%s': tensor name \"%s\" has no {i}, so every layer would read the same tensor",
                 it->name, t);
        return -1;
    }
    return 0;
}

static const char *expand(kf_lower *L, const char *t, int64_t layer, int64_t expert)
{
    ks_buf b = {0};
    for (const char *p = t; *p; p++) {
        if (p[0] == '{' && (p[1] == 'i' || p[1] == 'e') && p[2] == '}') {
            ks_buf_printf(&b, "%lld", (long long)(p[1] == 'i' ? layer : expert));
            p += 2;
        } else {
            ks_buf_put(&b, p, 1);
        }
    }
    const char *r = ks_arena_strdup(&L->scratch, ks_buf_cstr(&b));
    ks_buf_free(&b);
    return r;
}

static const char *inst_name(kf_lower *L, const kf_weight *w, int64_t layer)
{
    if (!w->decl->is_layer) return w->decl->name;
    return ks_arena_printf(&L->scratch, "%s[%lld]", w->decl->name, (long long)layer);
}

/* How a source reads its tensor, for messages: ".T[0:128]", "[:, 1:64:2]", "[:, 0:16].T". */
static const char *read_desc(kf_lower *L, const kf_weight_src *s, const int64_t *rows)
{
    if (!s->row_lo) return s->transposed ? ".T" : "";
    char step[32] = "";
    if (rows[2] != 1) snprintf(step, sizeof step, ":%lld", (long long)rows[2]);
    return ks_arena_printf(&L->scratch, "%s[%s%lld:%lld%s]%s", s->transposed ? ".T" : "", s->row_dim ? ":, " : "",
                           (long long)rows[0], (long long)rows[1], step, s->transposed_after ? ".T" : "");
}

/* A 3-D weight's rows of dim 1 from a 2-D tensor [A, C]: the tensor read as [d0, A / d0, C], d0 the
 * declared dim 0 (DeepSeek's kv_b_proj [heads * (nope + v), rank] as [heads, nope + v, rank]); the
 * groups, or 0 when the tensor is read as it is. */
static int64_t grouping(int want_ndim, const int64_t *want, const kf_weight_src *s, const kf_tensor *t)
{
    if (!t || !s->row_lo || s->row_dim != 1 || has_expert(s->tensor) || t->ndim != 2 || want_ndim != 3) return 0;
    return want[0];
}

/* Rows lo, lo + step, ... below hi: how many. */
static int64_t rows_taken(const int64_t *rows) { return (rows[1] - rows[0] + rows[2] - 1) / rows[2]; }

static const char *dims_text(kf_lower *L, int ndim, const int64_t *dims)
{
    ks_buf b = {0};
    kir_format_dims(&b, ndim, dims);
    const char *r = ks_arena_strdup(&L->scratch, ks_buf_cstr(&b));
    ks_buf_free(&b);
    return r;
}

/* Check the tensor t found for source s of weight instance `name`; fill
 * the instance. The message, if any, goes to msg. */
static int check_tensor(kf_lower *L, int want_ndim, const int64_t *want, const char *name, const kf_weight_src *s,
                        const int64_t *rows, const kf_tensor *t, ks_buf *msg)
{
    if (t->dtype != KIR_F32 && t->dtype != KIR_F16 && t->dtype != KIR_BF16) {
        ks_buf_printf(msg, "weight '%s': tensor '%s' has dtype %s; weights must be f32, f16 or bf16", name, t->name,
                      kir_dtype_name(t->dtype));
        return -1;
    }
    int64_t shape[KIR_MAX_DIMS];
    int ndim = t->ndim;
    if (ndim < 0 || ndim > KIR_MAX_DIMS) {
        ks_buf_printf(msg, "weight '%s': tensor '%s' has %d dims; at most %d are supported", name, t->name, ndim,
                      KIR_MAX_DIMS);
        return -1;
    }
    memcpy(shape, t->shape, (size_t)ndim * sizeof *shape);
    const int64_t groups = grouping(want_ndim, want, s, t);
    if (groups) {
        if (t->shape[0] % groups != 0) {
            ks_buf_printf(msg, "weight '%s': tensor '%s' has shape %s: its %lld rows are not %lld groups of rows", name,
                          t->name, dims_text(L, t->ndim, t->shape), (long long)t->shape[0], (long long)groups);
            return -1;
        }
        ndim = 3;
        shape[0] = groups;
        shape[1] = t->shape[0] / groups;
        shape[2] = t->shape[1];
    }
    if (s->transposed) {
        if (ndim != 2 && ndim != 3) {
            ks_buf_printf(msg, "weight '%s': .T needs a 2-D or 3-D tensor, but tensor '%s' has shape %s", name,
                          t->name, dims_text(L, t->ndim, t->shape));
            return -1;
        }
        int64_t r = shape[ndim - 2];
        shape[ndim - 2] = shape[ndim - 1];
        shape[ndim - 1] = r;
    }
    if (s->row_lo) {
        const int dim = s->row_dim;
        if (ndim < dim + 1 || (dim == 1 && ndim > 3)) {
            ks_buf_printf(msg, "weight '%s': %s needs a tensor of %s dims, but tensor '%s' has shape %s", name,
                          read_desc(L, s, rows), dim ? "2 or 3" : "1 or more", t->name, dims_text(L, t->ndim, t->shape));
            return -1;
        }
        if (rows[1] > shape[dim]) {
            ks_buf_printf(msg, "weight '%s': rows [%lld:%lld] are out of range: tensor '%s' has %lld rows%s%s", name,
                          (long long)rows[0], (long long)rows[1], t->name, (long long)shape[dim],
                          dim ? " in dim 1" : "", s->transposed ? " after .T" : "");
            return -1;
        }
        shape[dim] = rows_taken(rows);
        if (s->transposed_after && ndim != 3) {
            ks_buf_printf(msg, "weight '%s': %s transposes each index's rows: it needs a 3-D tensor (or a 2-D one "
                               "read as a 3-D weight's groups of rows), but tensor '%s' has shape %s", name,
                          read_desc(L, s, rows), t->name, dims_text(L, t->ndim, t->shape));
            return -1;
        }
        if (s->transposed_after) {
            int64_t r = shape[ndim - 2];
            shape[ndim - 2] = shape[ndim - 1];
            shape[ndim - 1] = r;
        }
    }
    int same = ndim == want_ndim;
    for (int k = 0; same && k < ndim; k++) same = shape[k] == want[k];
    if (!same) {
        const char *declared = dims_text(L, want_ndim, want);
        if (!s->transposed && !s->row_lo)
            ks_buf_printf(msg, "weight '%s': tensor '%s' has shape %s; expected %s", name, t->name,
                          dims_text(L, t->ndim, t->shape), declared);
        else
            ks_buf_printf(msg, "weight '%s': tensor '%s' has shape %s, read as %s it is %s; expected %s", name,
                          t->name, dims_text(L, t->ndim, t->shape), read_desc(L, s, rows), dims_text(L, ndim, shape),
                          declared);
        return -1;
    }
    return 0;
}

/* Report the first failure of a weight's layers once, with how many more
 * layers failed the same way. */
typedef struct kf_failure {
    ks_buf msg;     /* the first failure's message */
    kf_loc loc;     /* where to report it */
    int64_t more;   /* further instances that failed */
} kf_failure;

static void fail(kf_failure *f, kf_loc loc, ks_buf *msg)
{
    if (f->msg.len == 0) {
        ks_buf_put(&f->msg, msg->data, msg->len);
        f->loc = loc;
    } else {
        f->more++;
    }
    msg->len = 0;
}

/* The tensors of experts 1.. of instance `layer` from source s (expert 0's, t0, found): each present
 * and of the declared shape without dim 0; inst->parts gets all of their names. 0, or -1 with msg. */
static int resolve_experts(kf_lower *L, kf_weight *w, int64_t layer, const kf_weight_src *s, const int64_t *rows,
                           const kf_tensor *t0, kf_weight_inst *inst, ks_buf *msg)
{
    int64_t n = w->dims[0];
    const char **parts = ks_arena_alloc(&L->scratch, (size_t)n * sizeof *parts);
    for (int64_t e = 0; e < n; e++) {
        const kf_tensor *t = e == 0 ? t0 : NULL;
        const char *nm = expand(L, s->tensor, layer, e);
        if (L->ckpt && !t && !(t = kf_checkpoint_find(L->ckpt, nm))) {
            ks_buf_printf(msg, "weight '%s': expert %lld's tensor '%s' is not in the checkpoint (expert 0's is; the "
                          "declared dim 0 says %lld experts)", inst_name(L, w, layer), (long long)e, nm, (long long)n);
            return -1;
        }
        if (t && check_tensor(L, w->ndim - 1, w->dims + 1, ks_arena_printf(&L->scratch, "%s expert %lld",
                              inst_name(L, w, layer), (long long)e), s, rows, t, msg) != 0)
            return -1;
        parts[e] = t ? t->name : nm;
    }
    inst->parts = parts;
    inst->n_parts = n;
    return 0;
}

/* Resolve instance `layer` of w against the checkpoint. */
static void resolve(kf_lower *L, kf_weight *w, int64_t layer, int64_t (*rows)[3], kf_failure *f)
{
    const kf_item *it = w->decl;
    kf_weight_inst *inst = &w->inst[layer];
    inst->node = KIR_NONE;
    inst->present = 0;
    inst->parts = NULL;
    inst->n_parts = 0;
    size_t chosen = 0;
    const kf_tensor *t = NULL;
    const char *names[16];
    size_t n = it->n_srcs;
    for (size_t k = 0; k < n; k++) {
        const char *nm = expand(L, it->srcs[k]->tensor, layer, 0);
        if (k < 16) names[k] = nm;
        if (L->ckpt && !t && (t = kf_checkpoint_find(L->ckpt, nm)) != NULL) chosen = k;
    }
    if (!L->ckpt) {
        if (it->is_optional) return;
        inst->present = 1;
        chosen = 0;
    } else if (!t) {
        if (it->is_optional) return;
        ks_buf msg = {0};
        const char *name = inst_name(L, w, layer);
        if (n == 1) {
            ks_buf_printf(&msg, "weight '%s': tensor '%s' is not in the checkpoint", name, names[0]);
        } else {
            ks_buf_printf(&msg, "weight '%s': none of the tensors ", name);
            for (size_t k = 0; k < n && k < 16; k++) ks_buf_printf(&msg, "%s'%s'", k ? ", " : "", names[k]);
            ks_buf_puts(&msg, " is in the checkpoint");
        }
        fail(f, it->name_loc, &msg);
        ks_buf_free(&msg);
        return;
    } else if (!has_expert(it->srcs[chosen]->tensor)) {
        ks_buf msg = {0};
        if (check_tensor(L, w->ndim, w->dims, inst_name(L, w, layer), it->srcs[chosen], rows[chosen], t, &msg) != 0) {
            fail(f, it->srcs[chosen]->loc, &msg);
            ks_buf_free(&msg);
            return;
        }
        ks_buf_free(&msg);
        inst->present = 1;
    } else {
        inst->present = 1;
    }
    const kf_weight_src *s = it->srcs[chosen];
    if (has_expert(s->tensor)) {
        ks_buf msg = {0};
        if (resolve_experts(L, w, layer, s, rows[chosen], t, inst, &msg) != 0) {
            inst->present = 0;
            fail(f, s->loc, &msg);
            ks_buf_free(&msg);
            return;
        }
        ks_buf_free(&msg);
    }
    inst->tensor = inst->n_parts ? inst->parts[0] : L->ckpt ? t->name : (chosen < 16 ? names[chosen] : expand(L, s->tensor, layer, 0));
    inst->transposed = s->transposed;
    inst->row_dim = s->row_lo ? s->row_dim : 0;
    inst->row_start = s->row_lo ? rows[chosen][0] : 0;
    inst->row_end = s->row_lo ? rows[chosen][1] : -1;
    inst->row_step = s->row_lo ? rows[chosen][2] : 1;
    inst->groups = grouping(w->ndim, w->dims, s, t);
    inst->transposed_after = s->transposed_after;
}

void kf_declare_weight(kf_lower *L, kf_weight *w)
{
    const kf_item *it = w->decl;
    int bad = 0;
    w->ok = 0;
    if (it->n_dims > KIR_MAX_DIMS) {
        kf_error(L, it->dims[KIR_MAX_DIMS]->loc, "weight '%s': at most %d dims", it->name, KIR_MAX_DIMS);
        return;
    }
    w->ndim = (int)it->n_dims;
    /* the condition first: a weight it leaves out is absent, and its dims and rows need not make sense
       (deepseek_v3's q_a_proj of q_lora_rank 0) */
    int enabled = 1;
    if (it->value && kf_eval_bool(L, it->value, "the condition of a weight", &enabled) != 0) bad = 1;
    int64_t elems = 1;
    for (size_t k = 0; enabled && k < it->n_dims; k++) {
        kf_value dv;
        if (kf_eval_int_value(L, it->dims[k], "a weight dimension", &dv) != 0) {
            bad = 1;
            continue;
        }
        int64_t d = dv.u.i;
        if (d < 1 || d > KF_MAX_DIM) {
            if (d < 1)
                kf_error_value(L, it->dims[k]->loc, dv, "weight '%s': dimension %zu is %lld; it must be positive",
                               it->name, k + 1, (long long)d);
            else
                kf_error_value(L, it->dims[k]->loc, dv, "weight '%s': dimension %zu is %lld; it must be at most %lld",
                               it->name, k + 1, (long long)d, (long long)KF_MAX_DIM);
            bad = 1;
            continue;
        }
        w->dims[k] = d;
        if (__builtin_mul_overflow(elems, d, &elems) || elems > KF_MAX_WEIGHT_ELEMS) {
            kf_error(L, it->dims[k]->loc, "weight '%s' is too large (more than %lld elements)", it->name,
                     (long long)KF_MAX_WEIGHT_ELEMS);
            bad = 1;
            elems = 1;
        }
    }
    int64_t(*rows)[3] = ks_arena_alloc(&L->scratch, it->n_srcs * sizeof *rows);
    for (size_t k = 0; enabled && k < it->n_srcs; k++) {
        const kf_weight_src *s = it->srcs[k];
        if (check_template(L, it, s) != 0) bad = 1;
        rows[k][2] = 1;
        if (!s->row_lo) continue;
        if (kf_eval_int(L, s->row_lo, "a row bound", &rows[k][0]) != 0 ||
            kf_eval_int(L, s->row_hi, "a row bound", &rows[k][1]) != 0 ||
            (s->row_step && kf_eval_int(L, s->row_step, "a row step", &rows[k][2]) != 0)) {
            bad = 1;
            continue;
        }
        /* the declared dim the rows make: dim 0, or dim 1 (of an expert's tensor under {e}: the dims after
           the first) */
        const int ddim = s->row_dim + (has_expert(s->tensor) ? 1 : 0) + (s->transposed_after ? 1 : 0);
        if (rows[k][2] < 1) {
            kf_error(L, s->row_step->loc, "weight '%s': a row step of %lld; it must be at least 1", it->name,
                     (long long)rows[k][2]);
            bad = 1;
        } else if (rows[k][0] < 0 || rows[k][1] <= rows[k][0]) {
            kf_error(L, s->row_lo->loc, "weight '%s': rows [%lld:%lld] are empty or negative", it->name,
                     (long long)rows[k][0], (long long)rows[k][1]);
            bad = 1;
        } else if (w->ndim > ddim && !bad && rows_taken(rows[k]) != w->dims[ddim]) {
            kf_error(L, s->row_lo->loc, "weight '%s': rows %s are %lld rows, but the declared shape has %lld in dim %d",
                     it->name, read_desc(L, s, rows[k]), (long long)rows_taken(rows[k]), (long long)w->dims[ddim], ddim);
            bad = 1;
        }
    }
    w->n_inst = 1;
    if (it->is_layer) {
        if (L->n_layers == KF_LAYERS_BAD) {
            bad = 1;
        } else if (L->n_layers < 0) {
            kf_error(L, it->loc, "layer weight '%s' needs a param 'layers' (the number of layers)", it->name);
            bad = 1;
        } else {
            w->n_inst = L->n_layers;
        }
    }
    if (bad) return;
    /* Every layer tries every alternative: bound the names a hostile file
     * can make kiln build and look up. */
    L->lookups += w->n_inst * (int64_t)it->n_srcs;
    for (size_t k = 0; k < it->n_srcs; k++)
        if (has_expert(it->srcs[k]->tensor)) L->lookups += w->n_inst * (w->ndim ? w->dims[0] : 0);
    if (L->lookups > KF_MAX_LOOKUPS) {
        if (!L->stop)
            kf_error(L, it->loc, "too many weight tensors to look up (more than %d names for all layers)", KF_MAX_LOOKUPS);
        L->stop = 1;
        return;
    }
    w->inst = ks_arena_alloc(&L->scratch, (size_t)(w->n_inst ? w->n_inst : 1) * sizeof *w->inst);
    kf_failure f = {{0}, {0, 0}, 0};
    for (int64_t l = 0; l < w->n_inst; l++) {
        w->inst[l].node = KIR_NONE;
        w->inst[l].present = 0;
        if (enabled) resolve(L, w, l, rows, &f);
    }
    if (f.msg.len) {
        if (f.more)
            kf_error(L, f.loc, "%s (and likewise in %lld more layer%s)", ks_buf_cstr(&f.msg), (long long)f.more,
                     f.more == 1 ? "" : "s");
        else
            kf_error(L, f.loc, "%s", ks_buf_cstr(&f.msg));
        ks_buf_free(&f.msg);
        return;
    }
    w->ok = 1;
}

kf_value kf_weight_value(kf_lower *L, kf_weight *w, int64_t layer, kf_loc loc)
{
    if (!w->ok) return kf_err_value();
    KS_ASSERT(layer >= 0 && layer < w->n_inst);
    kf_weight_inst *inst = &w->inst[layer];
    if (!inst->present) return kf_none();
    if (inst->node == KIR_NONE) {
        if (kf_node_budget(L, loc) != 0) return kf_err_value();
        inst->node = kir_weight(L->g, inst_name(L, w, layer), KIR_F32, w->ndim, w->dims,
                                kf_kir_loc(L, w->decl->name_loc));
        kf_model *m = L->model;
        KS_GROW(m->weights, m->n_weights + 1, L->cap_weights, (size_t)KF_MAX_NODES, "weight bindings");
        kf_weight_binding *b = &m->weights[m->n_weights++];
        b->node = inst->node;
        b->tensor = ks_arena_strdup(&m->arena, inst->tensor);
        b->transposed = inst->transposed;
        b->row_dim = inst->row_dim;
        b->row_start = inst->row_start;
        b->row_end = inst->row_end;
        b->row_step = inst->row_step;
        b->groups = inst->groups;
        b->transposed_after = inst->transposed_after;
        b->n_parts = inst->n_parts;
        b->parts = NULL;
        if (inst->n_parts) {
            const char **parts = ks_arena_alloc(&m->arena, (size_t)inst->n_parts * sizeof *parts);
            for (int64_t e = 0; e < inst->n_parts; e++) parts[e] = ks_arena_strdup(&m->arena, inst->parts[e]);
            b->parts = parts;
        }
    }
    return kf_tval(inst->node);
}
