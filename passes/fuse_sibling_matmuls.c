/*
 * fuse_sibling_matmuls.c — matmuls that read the same input become one.
 *
 * Requires: a verified graph.
 * Guarantees: for each value x and weight dtype, two or more matmuls in no
 *   group, matmul(x, W_i), whose W_i are plain WEIGHT nodes [N_i, K] (not
 *   derived themselves, named without commas) become
 *       %w = weight() {name="W_0+W_1+…", derive="concat0", sources="W_0,W_1,…", rows=[N_0,N_1,…]}
 *       %m = matmul(x, %w)                  where the first sibling was, at its location
 *       slice(%m) {start=…, end=…}          one per sibling, where it was, at its location
 *                                           (keep_f32 when the sibling had it)
 *   When the only use of every sibling is a bias add(matmul_i, b_i), with b_i
 *   plain 1-D WEIGHT nodes of one dtype, the biases merge too: a derived
 *   bias %b and add(%m, %b) at the first sibling, and the slices replace the
 *   bias adds instead. Unequal widths (grouped-query attention's K and V)
 *   are the usual case. Every value the graph computed before is computed
 *   by the new one (rows of w concatenated are columns of x w^T
 *   concatenated), so consumers see the same numbers.
 *   Routed experts the same way: two or more expert_matmul(x, W_i, idx) of
 *   one x and one idx, without biases, whose W_i are plain WEIGHT nodes [E, N_i, K]
 *   of one dtype, become one over a weight derived with "concat1" (expert e's
 *   rows of W_0, then of W_1, …: [E, N_0 + N_1 + …, K]) and slices of the last
 *   dim (a mixture of experts' gate and up: passes/fuse_epilogues.c then joins
 *   their SwiGLU to it).
 * Does not: drop the weights it replaced (eliminate_dead_nodes does), merge
 *   matmuls whose weight is a computed value or of another dtype, or merge
 *   biases when only some siblings have one (those adds stay, after their
 *   slices).
 */
#include <stdlib.h>
#include <string.h>

#include "passes/derived_weight.h"
#include "passes/pipeline.h"
#include "passes/rewrite.h"

/* A set of sibling matmuls. */
typedef struct sibling_set {
    size_t first;   /* index of its first member in the members array */
    size_t count;   /* members, in schedule order */
    int biased;     /* 1: every member's only use is a bias add, and the biases merge */
    kir_val fused;  /* in the new graph: the merged matmul, or its bias add when biased */
} sibling_set;

/* What a node of the old graph becomes. */
typedef enum sibling_role {
    ROLE_KEEP,     /* copied as it is */
    ROLE_MATMUL,   /* a member matmul */
    ROLE_BIAS_ADD, /* the bias add of a member of a biased set */
} sibling_role;

typedef struct sibling_pass {
    const kir_graph *g;     /* the old graph */
    kp_uses uses;           /* its uses */
    kir_val *members;       /* matmuls of every set, set after set */
    size_t n_members;       /* entries in members */
    int64_t *slice_start;   /* [n_members] where each member's columns start in its set's result */
    sibling_set *sets;      /* the sets found */
    size_t n_sets;          /* entries in sets */
    uint8_t *role;          /* [n_nodes] sibling_role of each node */
    uint32_t *member_of;    /* [n_nodes] for ROLE_MATMUL and ROLE_BIAS_ADD: index into members */
    uint32_t *set_of;       /* [n_members] the set of each member */
} sibling_pass;

/* A weight a merge may read: a plain WEIGHT node of rank `ndim` whose name
 * can stand in a comma-separated list of sources. */
static int plain_weight(const kir_graph *g, kir_val w, int ndim)
{
    const kir_node *n = kir_node_at(g, w);
    if (n->op != KIR_OP_WEIGHT || n->ndim != ndim || kp_weight_is_derived(g, w)) return 0;
    const char *name = kir_attr_str(g, w, KIR_A_WEIGHT_NAME);
    return name[0] && !strchr(name, ',');
}

/* The bias add of matmul m when m's only use is add(m, b) with b a plain
 * 1-D weight of m's width, both in no group; else KIR_NONE. */
static kir_val bias_add_of(const sibling_pass *p, kir_val m)
{
    const kir_graph *g = p->g;
    if (kp_use_count(&p->uses, m) != 1) return KIR_NONE;
    kir_val a = p->uses.user[p->uses.start[m]];
    const kir_node *add = kir_node_at(g, a);
    if (add->op != KIR_OP_ADD || add->in[0] != m || add->in[1] == m || kp_group_of(g, a) >= 0) return KIR_NONE;
    kir_val b = add->in[1];
    if (!plain_weight(g, b, 1) || kir_node_at(g, b)->dims[0] != kir_node_at(g, m)->dims[1]) return KIR_NONE;
    return a;
}

/* A matmul that may merge with siblings reading x. */
static int candidate(const kir_graph *g, kir_val m, kir_val x)
{
    const kir_node *n = kir_node_at(g, m);
    return n->op == KIR_OP_MATMUL && n->in[0] == x && kp_group_of(g, m) < 0 && plain_weight(g, n->in[1], 2);
}

/* A routed expert_matmul without bias that may merge with siblings reading x. */
static int expert_candidate(const kir_graph *g, kir_val m, kir_val x)
{
    const kir_node *n = kir_node_at(g, m);
    return n->op == KIR_OP_EXPERT_MATMUL && n->in[0] == x && n->nin >= 3 && n->in[2] != KIR_NONE &&
           (n->nin < 4 || n->in[3] == KIR_NONE) && kp_group_of(g, m) < 0 && plain_weight(g, n->in[1], 3);
}

/* Whether expert_matmuls a and b may merge: one idx, weights of one dtype, experts and depth. */
static int expert_siblings(const kir_graph *g, kir_val a, kir_val b)
{
    const kir_node *na = kir_node_at(g, a), *nb = kir_node_at(g, b);
    const kir_node *wa = kir_node_at(g, na->in[1]), *wb = kir_node_at(g, nb->in[1]);
    return na->in[2] == nb->in[2] && wa->dtype == wb->dtype && wa->dims[0] == wb->dims[0] && wa->dims[2] == wb->dims[2];
}

/* Record the set of `count` matmuls at members[first..]. */
static void add_set(sibling_pass *p, size_t first, size_t count)
{
    const kir_graph *g = p->g;
    sibling_set *s = &p->sets[p->n_sets];
    *s = (sibling_set){first, count, 1, KIR_NONE};
    int64_t at = 0;
    kir_dtype bias_dtype = KIR_F32;
    for (size_t i = first; i < first + count; i++) {
        kir_val m = p->members[i];
        p->role[m] = ROLE_MATMUL;
        p->member_of[m] = (uint32_t)i;
        p->set_of[i] = (uint32_t)p->n_sets;
        p->slice_start[i] = at;
        const kir_node *mn = kir_node_at(g, m);
        at += mn->dims[mn->ndim - 1];
        kir_val a = mn->op == KIR_OP_MATMUL ? bias_add_of(p, m) : KIR_NONE; /* experts: no bias merging */
        if (a == KIR_NONE) {
            s->biased = 0;
            continue;
        }
        kir_dtype t = kir_node_at(g, kir_node_at(g, a)->in[1])->dtype;
        if (i == first) bias_dtype = t;
        if (t != bias_dtype) s->biased = 0;
    }
    if (s->biased)
        for (size_t i = first; i < first + count; i++) {
            kir_val a = bias_add_of(p, p->members[i]);
            p->role[a] = ROLE_BIAS_ADD;
            p->member_of[a] = (uint32_t)i;
        }
    p->n_sets++;
}

/* Find every set: the candidate users of each value, split by weight dtype. */
static void find_sets(sibling_pass *p)
{
    const kir_graph *g = p->g;
    size_t n = g->n_nodes;
    p->members = ks_xmalloc(sizeof *p->members * (n ? n : 1));
    p->slice_start = ks_xmalloc(sizeof *p->slice_start * (n ? n : 1));
    p->set_of = ks_xmalloc(sizeof *p->set_of * (n ? n : 1));
    p->sets = ks_xmalloc(sizeof *p->sets * (n ? n : 1));
    p->role = ks_xcalloc(n ? n : 1, 1);
    p->member_of = ks_xmalloc(sizeof *p->member_of * (n ? n : 1));
    for (kir_val x = 0; x < n; x++) {
        for (int t = 0; t < KIR_DTYPE_COUNT; t++) {
            size_t first = p->n_members;
            for (uint32_t u = p->uses.start[x]; u < p->uses.start[x + 1]; u++) {
                kir_val m = p->uses.user[u];
                if (candidate(g, m, x) && kir_node_at(g, kir_node_at(g, m)->in[1])->dtype == (kir_dtype)t)
                    p->members[p->n_members++] = m;
            }
            if (p->n_members - first >= 2)
                add_set(p, first, p->n_members - first);
            else
                p->n_members = first;
        }
        /* routed experts: each first candidate with its siblings (one idx, dtype and shape) */
        for (uint32_t u = p->uses.start[x]; u < p->uses.start[x + 1]; u++) {
            kir_val m = p->uses.user[u];
            if (!expert_candidate(g, m, x) || p->role[m] != ROLE_KEEP) continue;
            size_t first = p->n_members;
            p->members[p->n_members++] = m;
            for (uint32_t o = u + 1; o < p->uses.start[x + 1]; o++) {
                kir_val s = p->uses.user[o];
                int listed = 0; /* a user listed twice */
                for (size_t i = first; i < p->n_members; i++) listed |= p->members[i] == s;
                if (!listed && expert_candidate(g, s, x) && p->role[s] == ROLE_KEEP && expert_siblings(g, m, s))
                    p->members[p->n_members++] = s;
            }
            if (p->n_members - first >= 2)
                add_set(p, first, p->n_members - first);
            else
                p->n_members = first;
        }
    }
}

/* Whether a WEIGHT named `name` is in the old graph or already in the new one. */
static int weight_name_taken(const kir_graph *old, const kir_graph *g, const char *name)
{
    const kir_graph *graphs[2] = {old, g};
    for (int k = 0; k < 2; k++)
        for (size_t v = 0; v < graphs[k]->n_nodes; v++)
            if (graphs[k]->nodes[v].op == KIR_OP_WEIGHT &&
                kir_attr_has(graphs[k], (kir_val)v, KIR_A_WEIGHT_NAME) &&
                strcmp(kir_attr_str(graphs[k], (kir_val)v, KIR_A_WEIGHT_NAME), name) == 0)
                return 1;
    return 0;
}

/* A derived WEIGHT node concatenating the weights operand `which` of each
 * of the set's matmuls (which = 1), or of their bias adds (which = 2). */
static kir_val emit_concat_weight(sibling_pass *p, kp_rewriter *rw, const sibling_set *s, int which)
{
    const kir_graph *g = p->g;
    ks_buf name = {0}, sources = {0};
    int64_t *rows = ks_xmalloc(sizeof *rows * s->count);
    int64_t total = 0;
    kir_val first_w = KIR_NONE;
    for (size_t i = 0; i < s->count; i++) {
        kir_val m = p->members[s->first + i];
        kir_val owner = which == 1 ? m : p->uses.user[p->uses.start[m]]; /* the matmul or its bias add */
        kir_val w = kir_node_at(g, owner)->in[1];
        if (i == 0) first_w = w;
        const char *wname = kir_attr_str(g, w, KIR_A_WEIGHT_NAME);
        ks_buf_printf(&name, "%s%s", i ? "+" : "", wname);
        ks_buf_printf(&sources, "%s%s", i ? "," : "", wname);
        rows[i] = kir_node_at(g, w)->dims[kir_node_at(g, w)->ndim == 3];
        total += rows[i];
    }
    /* a name no weight has: the concatenation, with #2, #3… if it were taken */
    size_t base = name.len;
    for (int k = 2; weight_name_taken(g, rw->g, ks_buf_cstr(&name)); k++) {
        name.len = base;
        ks_buf_printf(&name, "#%d", k);
    }
    const kir_node *fw = kir_node_at(g, first_w);
    const int experts = fw->ndim == 3; /* [E, N_i, K]: along dim 1 */
    int64_t dims[3] = {total, fw->ndim == 2 ? fw->dims[1] : 0, 0};
    if (experts) dims[0] = fw->dims[0], dims[1] = total, dims[2] = fw->dims[2];
    kir_val w = kir_weight(rw->g, ks_buf_cstr(&name), fw->dtype, fw->ndim, dims, fw->loc);
    kir_attr_set_word(rw->g, w, KIR_A_WEIGHT_DERIVE, experts ? KIR_DERIVE_CONCAT1 : KIR_DERIVE_CONCAT0);
    kir_attr_set_str(rw->g, w, KIR_A_WEIGHT_SOURCES, ks_buf_cstr(&sources));
    kir_attr_set_ints(rw->g, w, KIR_A_WEIGHT_ROWS, rows, (uint32_t)s->count);
    ks_buf_free(&name);
    ks_buf_free(&sources);
    free(rows);
    return w;
}

/* The merged matmul (and bias add) of set s, in place of its first member. */
static void emit_fused(sibling_pass *p, kp_rewriter *rw, sibling_set *s)
{
    const kir_graph *g = p->g;
    kir_val first = p->members[s->first];
    const kir_node *fm = kir_node_at(g, first);
    kir_val w = emit_concat_weight(p, rw, s, 1);
    KS_ASSERT(rw->map[fm->in[0]] != KIR_NONE);
    kir_val m;
    if (fm->op == KIR_OP_EXPERT_MATMUL) {
        KS_ASSERT(rw->map[fm->in[2]] != KIR_NONE);
        kir_val mm_in[3] = {rw->map[fm->in[0]], w, rw->map[fm->in[2]]};
        m = kp_rw_build(rw, KIR_OP_EXPERT_MATMUL, fm->loc, mm_in, 3, NULL, 0);
    } else {
        kir_val mm_in[2] = {rw->map[fm->in[0]], w};
        m = kp_rw_build(rw, KIR_OP_MATMUL, fm->loc, mm_in, 2, NULL, 0);
    }
    s->fused = m;
    if (!s->biased) return;
    kir_val add_in[2] = {m, emit_concat_weight(p, rw, s, 2)};
    s->fused = kp_rw_build(rw, KIR_OP_ADD, kir_node_at(g, p->uses.user[p->uses.start[first]])->loc, add_in, 2, NULL, 0);
}

/* The slice of member i's columns that replaces old node v. */
static void emit_slice(sibling_pass *p, kp_rewriter *rw, size_t i, kir_val v)
{
    const sibling_set *s = &p->sets[p->set_of[i]];
    const kir_node *mn = kir_node_at(p->g, p->members[i]);
    kir_setting set[2] = {
        KIR_WITH_INT(KIR_A_SLICE_START, p->slice_start[i]),
        KIR_WITH_INT(KIR_A_SLICE_END, p->slice_start[i] + mn->dims[mn->ndim - 1]),
    };
    rw->map[v] = kp_rw_build(rw, KIR_OP_SLICE, kir_node_at(p->g, v)->loc, &s->fused, 1, set, 2);
    if (kir_attr_int(p->g, v, KIR_A_ANY_KEEP_F32)) /* float32(matmul): the slice is the value kept */
        kir_attr_set_int(rw->g, rw->map[v], KIR_A_ANY_KEEP_F32, 1);
}

int kp_fuse_sibling_matmuls(kir_graph **gp, const kp_options *opt, kp_pass_stats *st, ks_diag *d)
{
    (void)d;
    const kir_graph *g = *gp;
    sibling_pass p = {.g = g};
    kp_uses_build(&p.uses, g);
    find_sets(&p);
    kir_graph *out = NULL;
    if (p.n_sets) {
        kp_rewriter rw;
        kp_rw_begin(&rw, g);
        for (kir_val v = 0; v < g->n_nodes; v++) {
            if (p.role[v] == ROLE_KEEP) {
                kp_rw_copy(&rw, v);
                continue;
            }
            size_t i = p.member_of[v];
            sibling_set *s = &p.sets[p.set_of[i]];
            if (p.role[v] == ROLE_MATMUL && i == s->first) emit_fused(&p, &rw, s);
            /* a biased member's value is used only by its bias add, which a slice replaces */
            if (p.role[v] == ROLE_BIAS_ADD || !s->biased) emit_slice(&p, &rw, i, v);
        }
        out = kp_rw_end(&rw);
    }
    st->fusions = p.n_sets;
    kp_uses_free(&p.uses);
    free(p.members);
    free(p.slice_start);
    free(p.set_of);
    free(p.sets);
    free(p.role);
    free(p.member_of);
    if (out) {
        kir_graph_free(*gp);
        *gp = out;
    }
    return 0;
}
