/* rewrite.c — rebuilding graphs, uses and fusion groups for the passes (passes/rewrite.h). */
#include "passes/rewrite.h"
#include "ir/numerics.h"

#include <stdlib.h>
#include <string.h>

/* ---- rebuilding a graph ------------------------------------------------------------ */

void kp_rw_begin(kp_rewriter *rw, const kir_graph *old)
{
    rw->old = old;
    rw->g = kir_graph_new(old->name);
    /* files first and in order, so that old locations index the same files */
    for (size_t i = 0; i < old->n_files; i++) {
        kir_loc at = kir_loc_make(rw->g, old->files[i], 0, 0);
        KS_ASSERT(at.file == i);
    }
    for (size_t i = 0; i < old->n_params; i++) {
        const kir_param *p = &old->params[i];
        switch (p->kind) {
        case KIR_ATTR_INT: kir_param_int(rw->g, p->name, p->i); break;
        case KIR_ATTR_FLOAT: kir_param_float(rw->g, p->name, p->f); break;
        case KIR_ATTR_STR: kir_param_str(rw->g, p->name, p->s); break;
        case KIR_ATTR_INTS: kir_param_ints(rw->g, p->name, p->ints.v, p->ints.n); break;
        case KIR_ATTR_FLOATS: kir_param_floats(rw->g, p->name, p->floats.v, p->floats.n); break;
        }
    }
    rw->map = ks_xmalloc(sizeof *rw->map * (old->n_nodes ? old->n_nodes : 1));
    for (size_t i = 0; i < old->n_nodes; i++) rw->map[i] = KIR_NONE;
}

/* Copy attribute a onto node v of g (g's arena holds the copy). */
static void copy_attr(kir_graph *g, kir_val v, const kir_attr *a)
{
    switch (a->kind) {
    case KIR_ATTR_INT: kir_set_int(g, v, a->key, a->u.i); return;
    case KIR_ATTR_FLOAT: kir_set_float(g, v, a->key, a->u.f); return;
    case KIR_ATTR_STR: kir_set_str(g, v, a->key, a->u.s); return;
    case KIR_ATTR_INTS: kir_set_ints(g, v, a->key, a->u.ints.v, a->u.ints.n); return;
    case KIR_ATTR_FLOATS: kir_set_floats(g, v, a->key, a->u.floats.v, a->u.floats.n); return;
    }
    KS_UNREACHABLE();
}

/* Remove attribute a from node v, keeping the others' order; 1 if it was there. */
static int remove_attr(kir_graph *g, kir_val v, kir_attr_id a)
{
    kir_node *n = kir_node_at(g, v);
    for (uint32_t i = 0; i < n->nattrs; i++) {
        if (strcmp(n->attrs[i].key, kir_attr_table[a].key) != 0) continue;
        memmove(&n->attrs[i], &n->attrs[i + 1], sizeof *n->attrs * (n->nattrs - i - 1));
        n->nattrs--;
        return 1;
    }
    return 0;
}

/* Attribute x of a node of op (a verified graph's: in the schema, of its
 * kind) as a setting of kir_build. */
static kir_setting setting_of(kir_op op, const kir_attr *x)
{
    kir_attr_id a = kir_attr_lookup(op, x->key);
    KS_ASSERT(a < KIR_A_COUNT);
    const kir_attr_info *info = &kir_attr_table[a];
    KS_ASSERT((int)x->kind == (info->kind == KIR_ATTR_WORD ? KIR_ATTR_STR : info->kind));
    switch (info->kind) {
    case KIR_ATTR_INT: return KIR_WITH_INT(a, x->u.i);
    case KIR_ATTR_FLOAT: return KIR_WITH_FLOAT(a, x->u.f);
    case KIR_ATTR_STR: return KIR_WITH_STR(a, x->u.s);
    case KIR_ATTR_INTS: return KIR_WITH_INTS(a, x->u.ints.v, x->u.ints.n);
    case KIR_ATTR_WORD: {
        kir_word w = kir_word_lookup(info->set, x->u.s);
        KS_ASSERT(w < KIR_WORD_COUNT);
        return KIR_WITH_WORD(a, w);
    }
    }
    KS_UNREACHABLE();
}

kir_val kp_rw_copy(kp_rewriter *rw, kir_val v)
{
    const kir_node *o = kir_node_at(rw->old, v);
    kir_val c = kir_node_new(rw->g, o->op, o->loc);
    for (int i = 0; i < o->nin; i++) {
        kir_val in = o->in[i];
        KS_ASSERT(in == KIR_NONE || rw->map[in] != KIR_NONE); /* operands come first */
        kir_node_add_input(rw->g, c, in == KIR_NONE ? KIR_NONE : rw->map[in]);
    }
    for (uint32_t i = 0; i < o->nattrs; i++) copy_attr(rw->g, c, &o->attrs[i]);
    kir_node *n = kir_node_at(rw->g, c);
    n->dtype = o->dtype;
    n->ndim = o->ndim;
    memcpy(n->dims, o->dims, sizeof n->dims);
    rw->map[v] = c;
    return c;
}

kir_val kp_rw_build(kp_rewriter *rw, kir_op op, kir_loc loc, const kir_val *in, int n_in, const kir_setting *set,
                    int n_set)
{
    ks_buf err = {0};
    kir_val v = kir_build(rw->g, op, loc, in, n_in, set, n_set, &err);
    if (v == KIR_NONE) ks_die(__FILE__, __LINE__, "a pass built a node that does not fit: %s", ks_buf_cstr(&err));
    ks_buf_free(&err);
    return v;
}

kir_val kp_rw_rebuild(kp_rewriter *rw, kir_val v, const kir_val *in, int n_in, const kir_setting *set, int n_set)
{
    const kir_node *o = kir_node_at(rw->old, v);
    size_t n = o->nattrs + (size_t)n_set;
    kir_setting *all = ks_xmalloc(sizeof *all * (n ? n : 1));
    for (uint32_t i = 0; i < o->nattrs; i++) all[i] = setting_of(o->op, &o->attrs[i]);
    for (int k = 0; k < n_set; k++) all[o->nattrs + k] = set[k];
    rw->map[v] = kp_rw_build(rw, o->op, o->loc, in, n_in, all, (int)n);
    free(all);
    return rw->map[v];
}

kir_graph *kp_rw_end(kp_rewriter *rw)
{
    kir_graph *g = rw->g;
    free(rw->map);
    rw->map = NULL;
    rw->g = NULL;
    return g;
}

kir_graph *kp_reorder(const kir_graph *old, const kir_val *order, size_t n, kir_val **map)
{
    kp_rewriter rw;
    kp_rw_begin(&rw, old);
    for (size_t i = 0; i < n; i++) {
        KS_ASSERT(order[i] < old->n_nodes && rw.map[order[i]] == KIR_NONE);
        kp_rw_copy(&rw, order[i]);
    }
    if (map) {
        *map = rw.map;
        rw.map = NULL;
    }
    return kp_rw_end(&rw);
}

/* ---- uses ----------------------------------------------------------------------------- */

void kp_uses_build(kp_uses *u, const kir_graph *g)
{
    u->n = g->n_nodes;
    u->start = ks_xcalloc(g->n_nodes + 1, sizeof *u->start);
    for (size_t v = 0; v < g->n_nodes; v++)
        for (int i = 0; i < g->nodes[v].nin; i++)
            if (g->nodes[v].in[i] != KIR_NONE) u->start[g->nodes[v].in[i] + 1]++;
    for (size_t v = 0; v < g->n_nodes; v++) u->start[v + 1] += u->start[v];
    u->user = ks_xmalloc(sizeof *u->user * (u->start[g->n_nodes] ? u->start[g->n_nodes] : 1));
    uint32_t *fill = ks_xmalloc(sizeof *fill * (g->n_nodes ? g->n_nodes : 1));
    memcpy(fill, u->start, sizeof *fill * g->n_nodes);
    for (size_t v = 0; v < g->n_nodes; v++)
        for (int i = 0; i < g->nodes[v].nin; i++)
            if (g->nodes[v].in[i] != KIR_NONE) u->user[fill[g->nodes[v].in[i]]++] = (kir_val)v;
    free(fill);
}

void kp_uses_free(kp_uses *u)
{
    free(u->start);
    free(u->user);
    memset(u, 0, sizeof *u);
}

/* ---- groups ---------------------------------------------------------------------------- */

int64_t kp_group_of(const kir_graph *g, kir_val v)
{
    int64_t group = kir_attr_int(g, v, KIR_A_ANY_FUSE);
    return group >= 0 ? group : -1;
}

void kp_group_leave(kir_graph *g, kir_val v) { remove_attr(g, v, KIR_A_ANY_FUSE); }

int64_t kp_group_next_id(const kir_graph *g)
{
    int64_t next = 0;
    for (size_t v = 0; v < g->n_nodes; v++) {
        int64_t id = kp_group_of(g, (kir_val)v);
        if (id >= next) next = id + 1;
    }
    return next;
}

size_t kp_group_renumber(kir_graph *g)
{
    size_t groups = 0;
    for (size_t v = 0; v < g->n_nodes;) {
        int64_t id = kp_group_of(g, (kir_val)v);
        if (id < 0) {
            v++;
            continue;
        }
        size_t end = v + 1; /* the run of id: contiguous, as the verifier requires */
        while (end < g->n_nodes && kp_group_of(g, (kir_val)end) == id) end++;
        for (size_t m = v; m < end; m++) {
            if (end - v == 1)
                remove_attr(g, (kir_val)m, KIR_A_ANY_FUSE);
            else
                kir_attr_set_int(g, (kir_val)m, KIR_A_ANY_FUSE, (int64_t)groups);
        }
        groups += end - v > 1;
        v = end;
    }
    return groups;
}

int kp_node_joins_epilogue(const kir_graph *g, kir_val v)
{
    const kir_node *n = kir_node_at(g, v);
    kir_fusion_class fc = kir_op_table[n->op].fusion;
    if (kir_has_binary(n->op) && n->nin == 2 &&
        kir_binary_broadcast(kir_node_at(g, n->in[0]), kir_node_at(g, n->in[1])) != KIR_BROADCAST_SUFFIX)
        return 0; /* a row's value along the row: the epilogues repeat b over leading dims only */
    if (n->op == KIR_OP_CONCAT)
        for (int i = 0; i < n->nin; i++)
            if (kir_concat_repeats(n, kir_node_at(g, n->in[i]))) return 0; /* a repeated operand: its own kernel */
    if (n->op == KIR_OP_ROPE && n->nin > 2)
        return 0; /* longrope, dynamic: frequencies by each token's sequence length, its own kernel */
    return fc == KIR_FUSE_ELEMWISE || fc == KIR_FUSE_VIEW || n->op == KIR_OP_KV_WRITE;
}

int kp_is_compute(const kir_graph *g, kir_val v)
{
    kir_op op = kir_node_at(g, v)->op;
    return op != KIR_OP_INPUT && op != KIR_OP_WEIGHT && op != KIR_OP_OUTPUT && op != KIR_OP_RESHAPE;
}

void kp_regroup(kir_graph **gp, const kir_val *order, size_t n, const int64_t *gid)
{
    const kir_graph *g = *gp;
    kir_val *map = NULL;
    kir_graph *out = kp_reorder(g, order, n, &map);
    for (kir_val v = 0; v < g->n_nodes; v++)
        if (gid[v] >= 0) kir_attr_set_int(out, map[v], KIR_A_ANY_FUSE, gid[v]);
    kp_group_renumber(out);
    free(map);
    kir_graph_free(*gp);
    *gp = out;
}

int kp_order_window(const kir_graph *g, kir_val first, kir_val last, const uint8_t *member, uint8_t *dep,
                    kir_val *order, size_t *n)
{
    KS_ASSERT(first <= last && last < g->n_nodes);
    /* dep[v]: v is a member or uses, inside the window, a value that is */
    for (kir_val v = first; v <= last; v++) {
        const kir_node *node = kir_node_at(g, v);
        int on_member = 0, on_dependent = 0;
        for (int i = 0; i < node->nin; i++) {
            kir_val in = node->in[i];
            if (in == KIR_NONE || in < first) continue;
            if (member[in]) on_member = 1;
            else if (dep[in]) on_dependent = 1;
        }
        if (member[v] && on_dependent) {
            for (kir_val w = first; w < v; w++) dep[w] = 0;
            return -1;
        }
        dep[v] = member[v] || on_member || on_dependent;
    }
    size_t at = *n;
    for (kir_val v = first; v <= last; v++)
        if (!dep[v]) order[at++] = v;
    for (kir_val v = first; v <= last; v++)
        if (member[v]) order[at++] = v;
    for (kir_val v = first; v <= last; v++)
        if (dep[v] && !member[v]) order[at++] = v;
    for (kir_val v = first; v <= last; v++) dep[v] = 0;
    *n = at;
    return 0;
}
