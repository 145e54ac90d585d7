/*
 * plan.c — the memory plan as a graph carries it (ir/plan.h): the facts
 * the planner and its checker share (sizes, which ops run in place or are
 * views, `fuse` groups as spans), reading the plan from the graph's params
 * and attributes, writing it there, dropping it, and kir_verify_plan.
 *
 * Requires of kir_plan_read and kir_verify_plan: a graph whose every check
 * but the plan's kir_verify accepts (known ops, operands before their users,
 * types, attributes as ir/ops.def gives them: kir_verify runs
 * kir_verify_plan once those pass).
 * Guarantees of kir_plan_read: a plan it returns has both params in range,
 * an offset and a size for every node that states them as ints >= 0, and
 * flags 0 or 1; whether the plan is sound is kir_plan_check's (plan_check.c).
 */
#include "ir/plan.h"

#include <stdlib.h>
#include <string.h>

void kir_mem_plan_init(kir_mem_plan *p, size_t n_nodes)
{
    if (kir_mem_plan_try_init(p, n_nodes) != 0) {
        fprintf(stderr, "kiln: error: out of memory (allocating a memory plan of %zu nodes)\n", n_nodes);
        abort();
    }
}

int kir_mem_plan_try_init(kir_mem_plan *p, size_t n_nodes)
{
    memset(p, 0, sizeof *p);
    p->n_nodes = n_nodes;
    p->offset = ks_try_calloc(n_nodes + 1, sizeof *p->offset);
    p->bytes = ks_try_calloc(n_nodes + 1, sizeof *p->bytes);
    p->flags = ks_try_calloc(n_nodes + 1, sizeof *p->flags);
    p->share = ks_try_calloc(n_nodes + 1, sizeof *p->share);
    if (!p->offset || !p->bytes || !p->flags || !p->share) {
        kir_mem_plan_free(p);
        return -1;
    }
    for (size_t v = 0; v < n_nodes; v++) {
        p->offset[v] = KIR_MEM_NONE;
        p->share[v] = KIR_NONE;
    }
    return 0;
}

void kir_mem_plan_free(kir_mem_plan *p)
{
    if (!p) return;
    free(p->offset);
    free(p->bytes);
    free(p->flags);
    free(p->share);
    memset(p, 0, sizeof *p);
}

/* Checked step by step against KIR_MEM_MAX_VALUE, so nothing overflows. */
int kir_value_bytes(const kir_node *n, int64_t n_tokens, uint64_t *out)
{
    uint64_t b = kir_dtype_size(n->dtype);
    for (int i = 0; i < n->ndim; i++) {
        int64_t dim = n->dims[i] == KIR_DIM_T ? n_tokens : n->dims[i];
        KS_ASSERT(dim > 0);
        if ((uint64_t)dim > KIR_MEM_MAX_VALUE || b > KIR_MEM_MAX_VALUE / (uint64_t)dim) return -1;
        b *= (uint64_t)dim;
    }
    b = (b + KIR_MEM_ALIGN - 1) / KIR_MEM_ALIGN * KIR_MEM_ALIGN;
    if (b > KIR_MEM_MAX_VALUE) return -1;
    *out = b;
    return 0;
}

int kir_op_in_place(kir_op op)
{
    return op < KIR_OP_COUNT && kir_op_table[op].fusion == KIR_FUSE_ELEMWISE && op != KIR_OP_ROPE;
}

int kir_op_is_view(kir_op op) { return op == KIR_OP_RESHAPE || op == KIR_OP_OUTPUT || op == KIR_OP_KV_WRITE; }

void kir_group_spans(const kir_graph *g, uint32_t *first, uint32_t *last)
{
    size_t n = g->n_nodes;
    int64_t prev = -1;
    for (size_t v = 0; v < n; v++) {
        int64_t id = kir_attr_int(g, (kir_val)v, KIR_A_ANY_FUSE);
        first[v] = id >= 0 && id == prev ? first[v - 1] : (uint32_t)v;
        prev = id;
    }
    for (size_t v = n; v-- > 0;) last[v] = v + 1 < n && first[v + 1] == first[v] ? last[v + 1] : (uint32_t)v;
}

/* ---- the plan in the graph ------------------------------------------------------------ */

/* The params a plan uses, and no other mem.* param may be: a misspelt one is
 * an error, not a plan quietly missing a part. (Its node attributes are
 * ir/ops.def's, which kir_verify checks like any other.) */
static const char *const param_keys[] = {"mem.max_tokens", "mem.arena_bytes", "mem.lower_bound_bytes",
                                         "mem.naive_bytes", NULL};
static const char param_key_list[] = "mem.max_tokens, mem.arena_bytes, mem.lower_bound_bytes, mem.naive_bytes";

static int is_plan_key(const char *key) { return strncmp(key, "mem.", 4) == 0; }

int kir_has_plan(const kir_graph *g)
{
    for (size_t i = 0; i < g->n_params; i++)
        if (is_plan_key(g->params[i].name)) return 1;
    for (size_t v = 0; v < g->n_nodes; v++)
        for (uint32_t a = 0; a < g->nodes[v].nattrs; a++)
            if (is_plan_key(g->nodes[v].attrs[a].key)) return 1;
    return 0;
}

static const char *kind_word(kir_attr_kind k)
{
    switch (k) {
    case KIR_ATTR_INT: return "an int";
    case KIR_ATTR_FLOAT: return "a float";
    case KIR_ATTR_STR: return "a string";
    case KIR_ATTR_INTS: return "a list";
    case KIR_ATTR_FLOATS: return "a list of floats";
    }
    return "of an unknown kind";
}

/* The plan's params: present, ints, in range and consistent. */
static int read_params(const kir_graph *g, kir_mem_plan *plan, ks_diag *d, const char *what)
{
    const kir_param *by_key[4] = {NULL, NULL, NULL, NULL}; /* in param_keys order */
    for (size_t i = 0; i < g->n_params; i++) {
        const kir_param *p = &g->params[i];
        if (!is_plan_key(p->name)) continue;
        int k = 0;
        while (param_keys[k] && strcmp(param_keys[k], p->name) != 0) k++;
        if (!param_keys[k]) {
            ks_error(d, what, "param %s is not a memory plan param (those are %s)", p->name, param_key_list);
            return -1;
        }
        if (p->kind != KIR_ATTR_INT) {
            ks_error(d, what, "param %s is %s; it is a count (an int)", p->name, kind_word(p->kind));
            return -1;
        }
        by_key[k] = p;
    }
    const kir_param *tokens = by_key[0], *arena = by_key[1], *bound = by_key[2], *naive = by_key[3];
    if (!tokens || !arena) {
        ks_error(d, what, "the graph carries a memory plan but no param %s (a plan needs mem.max_tokens and "
                 "mem.arena_bytes)", tokens ? "mem.arena_bytes" : "mem.max_tokens");
        return -1;
    }
    if (tokens->i < 1 || tokens->i > KIR_MEM_MAX_TOKENS) {
        ks_error(d, what, "param mem.max_tokens is %lld; a plan is made for 1 to %lld tokens", (long long)tokens->i,
                 (long long)KIR_MEM_MAX_TOKENS);
        return -1;
    }
    if (arena->i < 1 || (uint64_t)arena->i > KIR_MEM_MAX_ARENA) {
        ks_error(d, what, "param mem.arena_bytes is %lld; an arena has 1 to %llu bytes", (long long)arena->i,
                 (unsigned long long)KIR_MEM_MAX_ARENA);
        return -1;
    }
    if (bound && (bound->i < 0 || bound->i > arena->i)) {
        ks_error(d, what, "param mem.lower_bound_bytes is %lld, not between 0 and mem.arena_bytes %lld: no plan "
                 "fits below its lower bound", (long long)bound->i, (long long)arena->i);
        return -1;
    }
    if (naive && naive->i < arena->i) {
        ks_error(d, what, "param mem.naive_bytes is %lld, less than mem.arena_bytes %lld: a plan never needs more "
                 "than every value apart", (long long)naive->i, (long long)arena->i);
        return -1;
    }
    plan->max_tokens = tokens->i;
    plan->arena_bytes = (uint64_t)arena->i;
    return 0;
}

/* Node v's part of the plan. kir_verify has checked its mem.* attributes
 * against ir/ops.def: ints, offsets and sizes >= 0, flags 0 or 1. */
static void read_node(const kir_graph *g, kir_val v, kir_mem_plan *plan)
{
    const kir_node *n = &g->nodes[v];
    if (kir_attr_has(g, v, KIR_A_ANY_MEM_OFFSET))
        plan->offset[v] = (uint64_t)kir_attr_int(g, v, KIR_A_ANY_MEM_OFFSET);
    /* a node that does not state its size has the size of its type (the
     * checker then compares the stated ones with that) */
    if (kir_attr_has(g, v, KIR_A_ANY_MEM_BYTES))
        plan->bytes[v] = (uint64_t)kir_attr_int(g, v, KIR_A_ANY_MEM_BYTES);
    else if (n->op != KIR_OP_WEIGHT && kir_value_bytes(n, plan->max_tokens, &plan->bytes[v]) != 0)
        plan->bytes[v] = 0;
    if (kir_attr_int(g, v, KIR_A_ANY_MEM_ALIAS)) plan->flags[v] |= KIR_MEM_ALIAS;
    if (kir_attr_int(g, v, KIR_A_ANY_MEM_INPLACE)) plan->flags[v] |= KIR_MEM_INPLACE;
    plan->share[v] = plan->flags[v] && n->nin > 0 ? n->in[0] : KIR_NONE;
}

int kir_plan_read(const kir_graph *g, kir_mem_plan *plan, ks_diag *d, const char *what)
{
    memset(plan, 0, sizeof *plan);
    if (!what) what = "<ir>";
    if (!kir_has_plan(g)) return 0;
    kir_mem_plan p;
    if (kir_mem_plan_try_init(&p, g->n_nodes) != 0)
        return ks_error_oom(d, what, (g->n_nodes + 1) * (2 * sizeof(uint64_t) + 1 + sizeof(kir_val)),
                            "the memory plan");
    if (read_params(g, &p, d, what) != 0) {
        kir_mem_plan_free(&p);
        return -1;
    }
    for (size_t v = 0; v < g->n_nodes; v++) read_node(g, (kir_val)v, &p);
    *plan = p;
    return 1;
}

int kir_verify_plan(const kir_graph *g, ks_diag *d, const char *what)
{
    if (!what) what = "<ir>";
    kir_mem_plan p;
    int rc = kir_plan_read(g, &p, d, what);
    if (rc <= 0) return rc < 0;
    ks_buf why = KS_BUF_TRY;
    kir_val where = KIR_NONE;
    int errors = 0;
    int rc_check = kir_plan_check(g, &p, &why, &where);
    if (rc_check != 0) {
        if (rc_check == -2) d->oom++; /* why says out of memory */
        if (where == KIR_NONE) /* the plan as a whole */
            ks_error(d, what, "%s", ks_buf_cstr(&why));
        else /* why names the node already */
            kir_node_error_text(d, g, where, what, ks_buf_cstr(&why));
        errors = 1;
    }
    ks_buf_free(&why);
    kir_mem_plan_free(&p);
    return errors;
}

void kir_plan_annotate(kir_graph *g, const kir_mem_plan *plan)
{
    KS_ASSERT(plan->n_nodes == g->n_nodes);
    kir_param_int(g, "mem.max_tokens", plan->max_tokens);
    kir_param_int(g, "mem.arena_bytes", (int64_t)plan->arena_bytes);
    for (size_t v = 0; v < g->n_nodes; v++) {
        if (plan->offset[v] == KIR_MEM_NONE) continue;
        kir_attr_set_int(g, (kir_val)v, KIR_A_ANY_MEM_OFFSET, (int64_t)plan->offset[v]);
        kir_attr_set_int(g, (kir_val)v, KIR_A_ANY_MEM_BYTES, (int64_t)plan->bytes[v]);
        if (plan->flags[v] & KIR_MEM_ALIAS) kir_attr_set_int(g, (kir_val)v, KIR_A_ANY_MEM_ALIAS, 1);
        if (plan->flags[v] & KIR_MEM_INPLACE) kir_attr_set_int(g, (kir_val)v, KIR_A_ANY_MEM_INPLACE, 1);
    }
}

void kir_plan_drop(kir_graph *g)
{
    size_t keep = 0;
    for (size_t i = 0; i < g->n_params; i++)
        if (!is_plan_key(g->params[i].name)) g->params[keep++] = g->params[i];
    g->n_params = keep;
    for (size_t v = 0; v < g->n_nodes; v++) {
        kir_node *n = &g->nodes[v];
        uint32_t k = 0;
        for (uint32_t a = 0; a < n->nattrs; a++)
            if (!is_plan_key(n->attrs[a].key)) n->attrs[k++] = n->attrs[a];
        n->nattrs = k;
    }
}
