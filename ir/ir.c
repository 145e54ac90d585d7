/* ir.c — the op table, graph builders, attributes and params. */
#include "ir/ir.h"

#include <stdlib.h>
#include <string.h>

const kir_op_info kir_op_table[KIR_OP_COUNT] = {
#define KIR_OP(NAME, text, min, max, shape, fuse, be) [KIR_OP_##NAME] = {text, min, max, fuse, be},
#include "ir/ops.def"
#undef KIR_OP
};

kir_op kir_op_lookup(const char *name)
{
    for (int i = 0; i < KIR_OP_COUNT; i++)
        if (strcmp(kir_op_table[i].name, name) == 0) return (kir_op)i;
    return KIR_OP_COUNT;
}

static const char *const dtype_names[KIR_DTYPE_COUNT] = {"f32", "f16", "bf16", "i32", "f8e4m3", "u4", "u8", "i8"};
static const int dtype_bits[KIR_DTYPE_COUNT] = {32, 16, 16, 32, 8, 4, 8, 8};

const char *kir_dtype_name(kir_dtype t)
{
    KS_ASSERT(t < KIR_DTYPE_COUNT);
    return dtype_names[t];
}

int kir_dtype_lookup(const char *name)
{
    for (int i = 0; i < KIR_DTYPE_COUNT; i++)
        if (strcmp(dtype_names[i], name) == 0) return i;
    return -1;
}

size_t kir_dtype_size(kir_dtype t)
{
    KS_ASSERT(t < KIR_DTYPE_COUNT && dtype_bits[t] % 8 == 0);
    return (size_t)dtype_bits[t] / 8;
}

int kir_dtype_bits(kir_dtype t)
{
    KS_ASSERT(t < KIR_DTYPE_COUNT);
    return dtype_bits[t];
}

uint64_t kir_dtype_bytes(kir_dtype t, uint64_t elems) { return (elems * (uint64_t)kir_dtype_bits(t) + 7) / 8; }

int kir_dtype_is_quantized(kir_dtype t) { return t == KIR_F8E4M3 || t == KIR_U4 || t == KIR_U8 || t == KIR_I8; }

/* Limits on graph size: far above any real model (Llama-3-405B unrolled is
 * ~3k nodes), low enough that a corrupt input cannot exhaust memory. */
enum { KIR_MAX_NODES = 1 << 22, KIR_MAX_FILES = 1 << 16, KIR_MAX_PARAMS = 1 << 16, KIR_MAX_ATTRS = 1 << 10 };

kir_graph *kir_graph_new(const char *name)
{
    kir_graph *g = ks_xcalloc(1, sizeof *g);
    g->name = ks_arena_strdup(&g->arena, name ? name : "");
    return g;
}

kir_graph *kir_graph_try_new(const char *name)
{
    kir_graph *g = ks_try_calloc(1, sizeof *g);
    if (!g) return NULL;
    g->fallible = g->arena.fallible = 1;
    g->name = ks_arena_strdup(&g->arena, name ? name : "");
    if (!g->name) {
        kir_graph_free(g);
        return NULL;
    }
    return g;
}

/* Grow one of g's arrays: KS_GROW for a graph that is not fallible (it ends
 * the process when it cannot), KS_TRY_GROW for one that is, setting g->oom.
 * 0, or -1 (fallible only). */
#define GRAPH_GROW(g, ptr, need, cap, limit, what)                                                          \
    ((g)->fallible ? (KS_TRY_GROW(ptr, need, cap, limit) == 0 ? 0 : ((g)->oom = 1, -1))                      \
                   : (KS_GROW(ptr, need, cap, limit, what), 0))

/* p, or NULL with g->oom set: an allocation from g's arena, which returns
 * NULL only when g is fallible. */
static void *graph_alloc_ok(kir_graph *g, void *p)
{
    if (!p) g->oom = 1;
    return p;
}

void kir_graph_free(kir_graph *g)
{
    if (!g) return;
    free(g->nodes);
    free(g->files);
    free(g->params);
    ks_arena_free(&g->arena);
    free(g);
}

static void copy_attr(kir_graph *dst, kir_attr *out, const kir_attr *a)
{
    *out = *a;
    out->key = ks_arena_strdup(&dst->arena, a->key);
    if (a->kind == KIR_ATTR_STR) out->u.s = ks_arena_strdup(&dst->arena, a->u.s);
    if (a->kind == KIR_ATTR_INTS) {
        int64_t *v = ks_arena_alloc(&dst->arena, sizeof *v * (a->u.ints.n ? a->u.ints.n : 1));
        memcpy(v, a->u.ints.v, sizeof *v * a->u.ints.n);
        out->u.ints.v = v;
    }
    if (a->kind == KIR_ATTR_FLOATS) {
        double *v = ks_arena_alloc(&dst->arena, sizeof *v * (a->u.floats.n ? a->u.floats.n : 1));
        memcpy(v, a->u.floats.v, sizeof *v * a->u.floats.n);
        out->u.floats.v = v;
    }
}

kir_graph *kir_graph_clone(const kir_graph *g)
{
    kir_graph *c = kir_graph_new(g->name);
    for (size_t i = 0; i < g->n_files; i++) {
        KS_GROW(c->files, c->n_files + 1, c->cap_files, KIR_MAX_FILES, "source files");
        c->files[c->n_files++] = ks_arena_strdup(&c->arena, g->files[i]);
    }
    for (size_t i = 0; i < g->n_params; i++) {
        KS_GROW(c->params, c->n_params + 1, c->cap_params, KIR_MAX_PARAMS, "params");
        kir_param p = g->params[i];
        p.name = ks_arena_strdup(&c->arena, p.name);
        if (p.kind == KIR_ATTR_STR) p.s = ks_arena_strdup(&c->arena, p.s);
        if (p.kind == KIR_ATTR_INTS) {
            int64_t *v = ks_arena_alloc(&c->arena, (p.ints.n ? p.ints.n : 1) * sizeof *v);
            if (p.ints.n) memcpy(v, p.ints.v, p.ints.n * sizeof *v);
            p.ints.v = v;
        }
        if (p.kind == KIR_ATTR_FLOATS) {
            double *v = ks_arena_alloc(&c->arena, (p.floats.n ? p.floats.n : 1) * sizeof *v);
            if (p.floats.n) memcpy(v, p.floats.v, p.floats.n * sizeof *v);
            p.floats.v = v;
        }
        c->params[c->n_params++] = p;
    }
    KS_GROW(c->nodes, g->n_nodes, c->cap_nodes, KIR_MAX_NODES, "IR nodes");
    for (size_t i = 0; i < g->n_nodes; i++) {
        kir_node n = g->nodes[i];
        n.attrs = NULL;
        n.cap_attrs = n.nattrs;
        if (n.nattrs) {
            n.attrs = ks_arena_alloc(&c->arena, sizeof *n.attrs * n.nattrs);
            for (uint32_t a = 0; a < n.nattrs; a++) copy_attr(c, &n.attrs[a], &g->nodes[i].attrs[a]);
        }
        c->nodes[i] = n;
    }
    c->n_nodes = g->n_nodes;
    return c;
}

kir_loc kir_loc_make(kir_graph *g, const char *file, uint32_t line, uint32_t col)
{
    kir_loc loc = {UINT32_MAX, line, col};
    if (!file) return loc;
    for (size_t i = 0; i < g->n_files; i++)
        if (strcmp(g->files[i], file) == 0) {
            loc.file = (uint32_t)i;
            return loc;
        }
    const char *copy = graph_alloc_ok(g, ks_arena_strdup(&g->arena, file));
    if (!copy || GRAPH_GROW(g, g->files, g->n_files + 1, g->cap_files, KIR_MAX_FILES, "source files") != 0)
        return loc; /* out of memory (g->oom): no file */
    g->files[g->n_files] = copy;
    loc.file = (uint32_t)g->n_files++;
    return loc;
}

kir_val kir_node_new(kir_graph *g, kir_op op, kir_loc loc)
{
    KS_ASSERT(op < KIR_OP_COUNT);
    if (GRAPH_GROW(g, g->nodes, g->n_nodes + 1, g->cap_nodes, KIR_MAX_NODES, "IR nodes") != 0) return KIR_NONE;
    kir_node *n = &g->nodes[g->n_nodes];
    memset(n, 0, sizeof *n);
    n->op = op;
    n->dtype = KIR_F32;
    n->loc = loc;
    for (int i = 0; i < KIR_MAX_INPUTS; i++) n->in[i] = KIR_NONE;
    return (kir_val)g->n_nodes++;
}

void kir_node_add_input(kir_graph *g, kir_val node, kir_val operand)
{
    kir_node *n = &g->nodes[node];
    KS_ASSERT(n->nin < KIR_MAX_INPUTS);
    KS_ASSERT(operand == KIR_NONE || operand < node);
    n->in[n->nin++] = operand;
}

kir_val kir_input(kir_graph *g, kir_word role, kir_loc loc)
{
    kir_val v = kir_node_new(g, KIR_OP_INPUT, loc);
    if (v == KIR_NONE) return KIR_NONE; /* out of memory: g->oom */
    kir_attr_set_word(g, v, KIR_A_INPUT_ROLE, role);
    kir_node *n = &g->nodes[v];
    n->dtype = KIR_I32;
    n->ndim = 1;
    n->dims[0] = KIR_DIM_T;
    return v;
}

kir_val kir_weight(kir_graph *g, const char *name, kir_dtype dtype, int ndim, const int64_t *dims, kir_loc loc)
{
    KS_ASSERT(ndim >= 0 && ndim <= KIR_MAX_DIMS);
    kir_val v = kir_node_new(g, KIR_OP_WEIGHT, loc);
    if (v == KIR_NONE) return KIR_NONE; /* out of memory: g->oom */
    kir_attr_set_str(g, v, KIR_A_WEIGHT_NAME, name);
    kir_node *n = &g->nodes[v];
    n->dtype = dtype;
    n->ndim = (uint8_t)ndim;
    for (int i = 0; i < ndim; i++) n->dims[i] = dims[i];
    return v;
}

/* ---- attributes ------------------------------------------------------------- */

/* The attribute `key` of node v, added (kind INT 0) when absent; NULL when
 * out of memory (g->oom). */
static kir_attr *attr_slot(kir_graph *g, kir_val v, const char *key)
{
    kir_node *n = &g->nodes[v];
    for (uint32_t i = 0; i < n->nattrs; i++)
        if (strcmp(n->attrs[i].key, key) == 0) return &n->attrs[i];
    const char *copy = graph_alloc_ok(g, ks_arena_strdup(&g->arena, key));
    if (!copy) return NULL;
    if (n->nattrs == n->cap_attrs) {
        /* attributes live in the graph's arena: grow by copying */
        uint32_t ncap = n->cap_attrs ? n->cap_attrs * 2 : 4;
        KS_ASSERT(ncap <= KIR_MAX_ATTRS);
        kir_attr *na = graph_alloc_ok(g, ks_arena_alloc(&g->arena, sizeof *na * ncap));
        if (!na) return NULL;
        if (n->nattrs) memcpy(na, n->attrs, sizeof *na * n->nattrs);
        n->attrs = na;
        n->cap_attrs = ncap;
    }
    kir_attr *a = &n->attrs[n->nattrs++];
    a->key = copy;
    return a;
}

void kir_set_int(kir_graph *g, kir_val v, const char *key, int64_t value)
{
    kir_attr *a = attr_slot(g, v, key);
    if (!a) return;
    a->kind = KIR_ATTR_INT;
    a->u.i = value;
}

void kir_set_float(kir_graph *g, kir_val v, const char *key, double value)
{
    kir_attr *a = attr_slot(g, v, key);
    if (!a) return;
    a->kind = KIR_ATTR_FLOAT;
    a->u.f = value;
}

void kir_set_str(kir_graph *g, kir_val v, const char *key, const char *value)
{
    const char *copy = graph_alloc_ok(g, ks_arena_strdup(&g->arena, value));
    kir_attr *a = copy ? attr_slot(g, v, key) : NULL;
    if (!a) return;
    a->kind = KIR_ATTR_STR;
    a->u.s = copy;
}

void kir_set_ints(kir_graph *g, kir_val v, const char *key, const int64_t *values, uint32_t n)
{
    int64_t *copy = graph_alloc_ok(g, ks_arena_alloc(&g->arena, sizeof *copy * (n ? n : 1)));
    kir_attr *a = copy ? attr_slot(g, v, key) : NULL;
    if (!a) return;
    if (n) memcpy(copy, values, sizeof *copy * n);
    a->kind = KIR_ATTR_INTS;
    a->u.ints.v = copy;
    a->u.ints.n = n;
}

void kir_set_floats(kir_graph *g, kir_val v, const char *key, const double *values, uint32_t n)
{
    double *copy = graph_alloc_ok(g, ks_arena_alloc(&g->arena, sizeof *copy * (n ? n : 1)));
    kir_attr *a = copy ? attr_slot(g, v, key) : NULL;
    if (!a) return;
    if (n) memcpy(copy, values, sizeof *copy * n);
    a->kind = KIR_ATTR_FLOATS;
    a->u.floats.v = copy;
    a->u.floats.n = n;
}

const kir_attr *kir_get(const kir_graph *g, kir_val v, const char *key)
{
    const kir_node *n = &g->nodes[v];
    for (uint32_t i = 0; i < n->nattrs; i++)
        if (strcmp(n->attrs[i].key, key) == 0) return &n->attrs[i];
    return NULL;
}

int64_t kir_get_int(const kir_graph *g, kir_val v, const char *key, int64_t dflt)
{
    const kir_attr *a = kir_get(g, v, key);
    return a && a->kind == KIR_ATTR_INT ? a->u.i : dflt;
}

double kir_get_float(const kir_graph *g, kir_val v, const char *key, double dflt)
{
    const kir_attr *a = kir_get(g, v, key);
    if (!a) return dflt;
    if (a->kind == KIR_ATTR_FLOAT) return a->u.f;
    if (a->kind == KIR_ATTR_INT) return (double)a->u.i;
    return dflt;
}

const char *kir_get_str(const kir_graph *g, kir_val v, const char *key, const char *dflt)
{
    const kir_attr *a = kir_get(g, v, key);
    return a && a->kind == KIR_ATTR_STR ? a->u.s : dflt;
}

/* ---- params ------------------------------------------------------------------- */

/* The param `name`, added when absent; NULL when out of memory (g->oom). */
static kir_param *param_slot(kir_graph *g, const char *name)
{
    for (size_t i = 0; i < g->n_params; i++)
        if (strcmp(g->params[i].name, name) == 0) return &g->params[i];
    const char *copy = graph_alloc_ok(g, ks_arena_strdup(&g->arena, name));
    if (!copy || GRAPH_GROW(g, g->params, g->n_params + 1, g->cap_params, KIR_MAX_PARAMS, "params") != 0)
        return NULL;
    kir_param *p = &g->params[g->n_params++];
    memset(p, 0, sizeof *p);
    p->name = copy;
    return p;
}

void kir_param_int(kir_graph *g, const char *name, int64_t v)
{
    kir_param *p = param_slot(g, name);
    if (!p) return;
    p->kind = KIR_ATTR_INT;
    p->i = v;
}

void kir_param_float(kir_graph *g, const char *name, double v)
{
    kir_param *p = param_slot(g, name);
    if (!p) return;
    p->kind = KIR_ATTR_FLOAT;
    p->f = v;
}

void kir_param_str(kir_graph *g, const char *name, const char *v)
{
    const char *copy = graph_alloc_ok(g, ks_arena_strdup(&g->arena, v));
    kir_param *p = copy ? param_slot(g, name) : NULL;
    if (!p) return;
    p->kind = KIR_ATTR_STR;
    p->s = copy;
}

void kir_param_ints(kir_graph *g, const char *name, const int64_t *v, uint32_t n)
{
    int64_t *copy = graph_alloc_ok(g, ks_arena_alloc(&g->arena, (n ? n : 1) * sizeof *copy));
    kir_param *p = copy ? param_slot(g, name) : NULL;
    if (!p) return;
    if (n) memcpy(copy, v, n * sizeof *copy);
    p->kind = KIR_ATTR_INTS;
    p->ints.v = copy;
    p->ints.n = n;
}

void kir_param_floats(kir_graph *g, const char *name, const double *v, uint32_t n)
{
    double *copy = graph_alloc_ok(g, ks_arena_alloc(&g->arena, (n ? n : 1) * sizeof *copy));
    kir_param *p = copy ? param_slot(g, name) : NULL;
    if (!p) return;
    if (n) memcpy(copy, v, n * sizeof *copy);
    p->kind = KIR_ATTR_FLOATS;
    p->floats.v = copy;
    p->floats.n = n;
}

const kir_param *kir_param_find(const kir_graph *g, const char *name)
{
    for (size_t i = 0; i < g->n_params; i++)
        if (strcmp(g->params[i].name, name) == 0) return &g->params[i];
    return NULL;
}

/* ---- types ------------------------------------------------------------------------ */

void kir_format_dims(ks_buf *b, int ndim, const int64_t *dims)
{
    ks_buf_puts(b, "[");
    for (int i = 0; i < ndim; i++) {
        if (i) ks_buf_puts(b, ",");
        if (dims[i] == KIR_DIM_T)
            ks_buf_puts(b, "T");
        else
            ks_buf_printf(b, "%lld", (long long)dims[i]);
    }
    ks_buf_puts(b, "]");
}

void kir_format_type(ks_buf *b, const kir_node *n)
{
    ks_buf_puts(b, kir_dtype_name(n->dtype));
    kir_format_dims(b, n->ndim, n->dims);
}

int64_t kir_row_elems(const kir_node *n)
{
    int64_t e = 1;
    for (int i = 0; i < n->ndim; i++)
        if (n->dims[i] != KIR_DIM_T) e *= n->dims[i];
    return e;
}

int64_t kir_elems(const kir_node *n, int64_t n_tokens)
{
    int64_t e = 1;
    for (int i = 0; i < n->ndim; i++) e *= n->dims[i] == KIR_DIM_T ? n_tokens : n->dims[i];
    return e;
}

int64_t kir_token_ids(const kir_graph *g)
{
    for (size_t v = 0; v < g->n_nodes; v++) {
        const kir_node *n = &g->nodes[v];
        if (n->op != KIR_OP_EMBED || n->nin < 2 || n->in[0] >= g->n_nodes || n->in[1] >= g->n_nodes) continue;
        if (g->nodes[n->in[1]].op == KIR_OP_INPUT && kir_attr_word(g, n->in[1], KIR_A_INPUT_ROLE) == KIR_ROLE_TOKENS)
            return g->nodes[n->in[0]].dims[0];
    }
    return -1;
}
