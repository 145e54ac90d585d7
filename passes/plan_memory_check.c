/*
 * plan_memory_check.c — kp_mem_plan_check: proves a memory plan safe for
 * its graph without trusting the planner (QBE runs ssacheck after ssa).
 *
 * Requires: a verified graph and a plan of the same node count.
 *
 * Checks, from the graph alone:
 *  - sizes: each value's bytes as kp_value_bytes gives them at the plan's
 *    max_tokens; weights have no offset; other values are aligned and end
 *    inside the arena;
 *  - sharing: every view (RESHAPE, OUTPUT, KV_WRITE) and only views are
 *    ALIAS, at their operand's bytes; INPLACE only on ops that may run in
 *    place (elementwise, not ROPE), at the bytes of a first operand of the
 *    same size that holds no INPUT and that nothing reads after the op, and
 *    that no other node of the op's `fuse` group reads where the group did
 *    not write it (the group's blocks run in no order);
 *  - no overlap: two values live at a common node share no byte, except a
 *    value and its views, and the operand an in-place op overwrites (or a
 *    chain of in-place ops, in one group) with that op's value. A value is
 *    live from the first node of its definition's group (an INPUT from the
 *    step's start) to the last node of the group of its last use, a use of
 *    a view being a use of what it views (an OUTPUT to the step's end); a
 *    node with no `fuse` group is a group of its own.
 *
 * Does not judge how good the plan is: arena_bytes and the bound are the
 * planner's report.
 */
#include <stdlib.h>
#include <string.h>

#include "passes/plan_memory.h"

/* What the check derives from the graph. */
typedef struct kp_checker {
    const kir_graph *g;        /* the graph */
    const kp_mem_plan *plan;   /* the plan checked */
    ks_buf *why;               /* the first problem */
    size_t n;                  /* nodes */
    uint32_t *group_first;     /* [n] first node of each node's `fuse` group */
    uint32_t *group_last;      /* [n] last node of each node's group */
    uint32_t *start;           /* [n] first node at which each value is live, groups running at once */
    uint32_t *end;             /* [n] last node at which each value is live, groups running at once */
    uint32_t *read_end;        /* [n] last node that reads each value, in schedule order */
    kir_val *gen;              /* [n] the value whose write a value's bytes hold: itself, or what it views */
} kp_checker;

static int fail(kp_checker *c, const char *fmt, ...) KS_PRINTF(2, 3);
static int fail(kp_checker *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ks_buf_vprintf(c->why, fmt, ap);
    va_end(ap);
    return -1;
}

static const char *op_name(const kp_checker *c, kir_val v) { return kir_op_table[c->g->nodes[v].op].name; }

/* Sizes, bounds and the sharing rules of one value. */
static int check_value(kp_checker *c, kir_val v)
{
    const kp_mem_plan *p = c->plan;
    const kir_node *n = kir_node_at(c->g, v);
    const char *op = op_name(c, v);
    uint8_t flags = p->flags[v];
    if (n->op == KIR_OP_WEIGHT) {
        if (p->offset[v] != KP_MEM_NONE || p->bytes[v] != 0 || flags != 0)
            return fail(c, "node %%%u (weight) has a place in the arena; weights have none", (unsigned)v);
        return 0;
    }
    uint64_t want;
    if (kp_value_bytes(n, p->max_tokens, &want) != 0)
        return fail(c, "node %%%u (%s) is too large to plan", (unsigned)v, op);
    if (p->bytes[v] != want) {
        ks_buf t = {0};
        kir_format_type(&t, n);
        fail(c, "node %%%u (%s) has %llu bytes; %s at max_tokens %lld needs %llu", (unsigned)v, op,
             (unsigned long long)p->bytes[v], ks_buf_cstr(&t), (long long)p->max_tokens, (unsigned long long)want);
        ks_buf_free(&t);
        return -1;
    }
    if (p->offset[v] == KP_MEM_NONE) return fail(c, "node %%%u (%s) has no place in the arena", (unsigned)v, op);
    if (p->offset[v] % KP_MEM_ALIGN != 0)
        return fail(c, "node %%%u (%s) at offset %llu, not a multiple of %d", (unsigned)v, op,
                    (unsigned long long)p->offset[v], KP_MEM_ALIGN);
    if (p->offset[v] > p->arena_bytes || p->bytes[v] > p->arena_bytes - p->offset[v])
        return fail(c, "node %%%u (%s) at bytes [%llu,%llu) ends past the arena of %llu bytes", (unsigned)v, op,
                    (unsigned long long)p->offset[v], (unsigned long long)(p->offset[v] + p->bytes[v]),
                    (unsigned long long)p->arena_bytes);
    if ((flags & KP_MEM_ALIAS) && (flags & KP_MEM_INPLACE))
        return fail(c, "node %%%u (%s) is marked both a view and in place", (unsigned)v, op);
    if (kp_op_is_view(n->op) && !(flags & KP_MEM_ALIAS))
        return fail(c, "node %%%u (%s) is a view but does not alias its operand", (unsigned)v, op);
    if ((flags & KP_MEM_ALIAS) && !kp_op_is_view(n->op))
        return fail(c, "node %%%u (%s) aliases its operand, but %s is not a view", (unsigned)v, op, op);
    if ((flags & KP_MEM_INPLACE) && !kp_op_in_place(n->op)) {
        if (kir_op_table[n->op].fusion == KIR_FUSE_ELEMWISE)
            return fail(c, "node %%%u (%s) is marked in place, but %s reads elements of its operand other than the one "
                        "it writes: it never runs in place", (unsigned)v, op, op);
        return fail(c, "node %%%u (%s) is marked in place, but %s is not elementwise", (unsigned)v, op, op);
    }
    kir_val src = n->nin > 0 ? n->in[0] : KIR_NONE;
    if (p->share[v] != (flags ? src : KIR_NONE))
        return fail(c, "node %%%u (%s) names %%%u as the value it shares bytes with", (unsigned)v, op,
                    (unsigned)p->share[v]);
    if (!flags) return 0;
    const char *how = flags & KP_MEM_ALIAS ? "a view of" : "in place over";
    if (src == KIR_NONE || c->g->nodes[src].op == KIR_OP_WEIGHT)
        return fail(c, "node %%%u (%s) is %s a value with no place in the arena", (unsigned)v, op, how);
    if (p->offset[src] != p->offset[v] || p->bytes[src] != p->bytes[v])
        return fail(c, "node %%%u (%s) is %s %%%u but at bytes [%llu,%llu), not [%llu,%llu)", (unsigned)v, op, how,
                    (unsigned)src, (unsigned long long)p->offset[v], (unsigned long long)(p->offset[v] + p->bytes[v]),
                    (unsigned long long)p->offset[src], (unsigned long long)(p->offset[src] + p->bytes[src]));
    return 0;
}

/* Live ranges, and gen: the write whose bytes a view shows. */
static void compute_liveness(kp_checker *c)
{
    const kir_graph *g = c->g;
    kp_group_spans(g, c->group_first, c->group_last);
    for (size_t v = 0; v < c->n; v++) {
        const kir_node *n = &g->nodes[v];
        int out = n->op == KIR_OP_OUTPUT;
        c->start[v] = n->op == KIR_OP_INPUT ? 0 : c->group_first[v];
        c->end[v] = out ? (uint32_t)(c->n - 1) : c->group_last[v];
        c->read_end[v] = out ? (uint32_t)(c->n - 1) : (uint32_t)v;
        for (int i = 0; i < n->nin; i++) {
            kir_val o = n->in[i];
            if (o == KIR_NONE) continue;
            if (c->end[o] < c->group_last[v]) c->end[o] = c->group_last[v];
            if (c->read_end[o] < v) c->read_end[o] = (uint32_t)v;
        }
        c->gen[v] = (c->plan->flags[v] & KP_MEM_ALIAS) ? c->gen[n->in[0]] : (kir_val)v;
    }
    /* a view's uses read what it views; views come after their operands */
    for (size_t v = c->n; v-- > 0;)
        if (c->plan->flags[v] & KP_MEM_ALIAS) {
            kir_val o = g->nodes[v].in[0];
            if (c->end[v] > c->end[o]) c->end[o] = c->end[v];
            if (c->read_end[v] > c->read_end[o]) c->read_end[o] = c->read_end[v];
        }
}

static int overlap(const kp_mem_plan *p, kir_val a, kir_val b)
{
    return p->offset[a] < p->offset[b] + p->bytes[b] && p->offset[b] < p->offset[a] + p->bytes[a];
}

/* In place over src in a `fuse` group: no other node of the group reads
 * bytes of src that the group did not write (its blocks run in no order). A
 * reshape moves no data. */
static int check_group_reads(kp_checker *c, kir_val v, kir_val src)
{
    uint32_t first = c->group_first[v], last = c->group_last[v];
    for (uint32_t u = first; u <= last; u++) {
        const kir_node *n = &c->g->nodes[u];
        if (u == v || n->op == KIR_OP_RESHAPE) continue;
        for (int i = 0; i < n->nin; i++) {
            kir_val x = n->in[i];
            if (x == KIR_NONE || c->plan->offset[x] == KP_MEM_NONE || c->gen[x] >= first || !overlap(c->plan, x, src))
                continue;
            return fail(c, "node %%%u (%s) is in place over %%%u, but node %%%u (%s) of its fuse group (nodes %%%u to "
                        "%%%u, one kernel whose blocks run in no order) reads %%%u, written before the group",
                        (unsigned)v, op_name(c, v), (unsigned)src, (unsigned)u, op_name(c, u), (unsigned)first,
                        (unsigned)last, (unsigned)x);
        }
    }
    return 0;
}

/* An in-place op overwrites its operand's bytes: nothing may read them later. */
static int check_in_place(kp_checker *c)
{
    /* the last node at which each write (gen) is read, and by which value */
    uint32_t *gen_end = ks_xcalloc(c->n + 1, sizeof *gen_end);
    kir_val *gen_reader = ks_xcalloc(c->n + 1, sizeof *gen_reader);
    for (size_t v = 0; v < c->n; v++) {
        kir_val w = c->gen[v];
        if (c->read_end[v] >= gen_end[w]) {
            gen_end[w] = c->read_end[v];
            gen_reader[w] = (kir_val)v;
        }
    }
    int rc = 0;
    for (size_t v = 0; v < c->n && rc == 0; v++) {
        if (!(c->plan->flags[v] & KP_MEM_INPLACE)) continue;
        kir_val src = c->g->nodes[v].in[0], w = c->gen[src];
        /* follow the writes back to the value that first held the bytes */
        kir_val root = w;
        while (c->plan->flags[root] & (KP_MEM_ALIAS | KP_MEM_INPLACE)) root = c->gen[c->g->nodes[root].in[0]];
        if (c->g->nodes[root].op == KIR_OP_INPUT)
            rc = fail(c, "node %%%u (%s) is in place over %%%u, whose bytes hold the input %%%u", (unsigned)v,
                      op_name(c, (kir_val)v), (unsigned)src, (unsigned)root);
        else if (gen_end[w] > v)
            rc = fail(c, "node %%%u (%s) is in place over %%%u, but node %%%u (%s) is live until node %%%u",
                      (unsigned)v, op_name(c, (kir_val)v), (unsigned)src, (unsigned)gen_reader[w],
                      op_name(c, gen_reader[w]), (unsigned)gen_end[w]);
        else
            rc = check_group_reads(c, (kir_val)v, src);
    }
    free(gen_end);
    free(gen_reader);
    return rc;
}

/* May u and w, live at a common node, share bytes? */
static int may_share(const kp_checker *c, kir_val u, kir_val w)
{
    if (c->gen[u] == c->gen[w]) return 1; /* one shows the other's write */
    /* w's bytes were written by h, in place over a write that may be
     * another in-place op's: a chain (in one group, where all are live at
     * once). u's write is overwritten in the chain at u's last read. */
    for (kir_val h = c->gen[w]; c->plan->flags[h] & KP_MEM_INPLACE;) {
        kir_val over = c->gen[c->g->nodes[h].in[0]];
        if (over == c->gen[u]) return c->read_end[u] <= h;
        h = over;
    }
    return 0;
}

/* Sweep the values by start; each is compared with those still live. */
static int check_overlaps(kp_checker *c)
{
    const kp_mem_plan *p = c->plan;
    size_t n = c->n;
    uint32_t *count = ks_xcalloc(n + 1, sizeof *count);
    kir_val *order = ks_xcalloc(n + 1, sizeof *order);
    kir_val *active = ks_xcalloc(n + 1, sizeof *active);
    size_t n_values = 0, n_active = 0;
    for (size_t v = 0; v < n; v++)
        if (p->offset[v] != KP_MEM_NONE) count[c->start[v] + 1]++, n_values++;
    for (size_t t = 0; t < n; t++) count[t + 1] += count[t];
    for (size_t v = 0; v < n; v++)
        if (p->offset[v] != KP_MEM_NONE) order[count[c->start[v]]++] = (kir_val)v;
    int rc = 0;
    for (size_t i = 0; i < n_values && rc == 0; i++) {
        kir_val w = order[i];
        size_t keep = 0;
        for (size_t j = 0; j < n_active; j++)
            if (c->end[active[j]] >= c->start[w]) active[keep++] = active[j];
        n_active = keep;
        uint64_t wlo = p->offset[w], whi = wlo + p->bytes[w];
        for (size_t j = 0; j < n_active && rc == 0; j++) {
            kir_val u = active[j];
            uint64_t ulo = p->offset[u], uhi = ulo + p->bytes[u];
            if (ulo >= whi || wlo >= uhi) continue;
            if (may_share(c, u, w) || may_share(c, w, u)) continue;
            kir_val a = u < w ? u : w, b = u < w ? w : u;
            rc = fail(c, "node %%%u (%s) and node %%%u (%s) share bytes [%llu,%llu) while both are live at node %%%u",
                      (unsigned)a, op_name(c, a), (unsigned)b, op_name(c, b),
                      (unsigned long long)(ulo > wlo ? ulo : wlo), (unsigned long long)(uhi < whi ? uhi : whi),
                      (unsigned)c->start[w]);
        }
        active[n_active++] = w;
    }
    free(count);
    free(order);
    free(active);
    return rc;
}

int kp_mem_plan_check(const kir_graph *g, const kp_mem_plan *plan, ks_buf *why)
{
    kp_checker c = {.g = g, .plan = plan, .why = why, .n = g->n_nodes};
    if (plan->n_nodes != g->n_nodes)
        return fail(&c, "the plan covers %zu nodes, the graph has %zu", plan->n_nodes, g->n_nodes);
    if (plan->max_tokens < 1) return fail(&c, "the plan's max_tokens is %lld", (long long)plan->max_tokens);
    for (size_t v = 0; v < c.n; v++)
        if (check_value(&c, (kir_val)v) != 0) return -1;
    c.group_first = ks_xcalloc(c.n + 1, sizeof *c.group_first);
    c.group_last = ks_xcalloc(c.n + 1, sizeof *c.group_last);
    c.start = ks_xcalloc(c.n + 1, sizeof *c.start);
    c.end = ks_xcalloc(c.n + 1, sizeof *c.end);
    c.read_end = ks_xcalloc(c.n + 1, sizeof *c.read_end);
    c.gen = ks_xcalloc(c.n + 1, sizeof *c.gen);
    compute_liveness(&c);
    int rc = check_in_place(&c);
    if (rc == 0) rc = check_overlaps(&c);
    free(c.group_first);
    free(c.group_last);
    free(c.start);
    free(c.end);
    free(c.read_end);
    free(c.gen);
    return rc;
}
