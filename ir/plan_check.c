/*
 * plan_check.c — kir_plan_check: proves a memory plan safe for its graph
 * without trusting whoever made it (QBE runs ssacheck after ssa). The
 * planner runs it on its plans; kir_verify runs it on every plan a graph
 * carries (an edited IR text, an engine being opened).
 *
 * Requires: a graph whose structure kir_verify accepts (operands before
 * their users, types, contiguous `fuse` groups) and a plan of any content.
 *
 * Checks, from the graph alone:
 *  - sizes: each value's bytes as kir_value_bytes gives them at the plan's
 *    max_tokens; weights have no place; every other value has one, aligned
 *    to KIR_MEM_ALIGN and ending inside the arena;
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
 * How, in O(n log n) for n nodes (it runs at every engine open and after
 * every pass): the values that may share bytes form chains (a value, its
 * views, an in-place op over it, that op's views, ...), each at one offset;
 * once the in-place rule holds for every link, any two values of one chain
 * may share, and two values of different chains may not when both are live.
 * A chain is live over one span of nodes (each link reads the one before),
 * so the check is a sweep over the schedule with the live chains in a
 * segment tree over their offsets: a chain that starts meets a live one iff
 * the live chain with the highest end among those that start below its end
 * ends above its start.
 *
 * Does not judge how good the plan is: arena_bytes and the lower bound are
 * the planner's report.
 */
#include <stdlib.h>
#include <string.h>

#include "ir/plan.h"

#define NO_CHAIN UINT32_MAX

/* What the check derives from the graph. */
typedef struct kir_checker {
    const kir_graph *g;      /* the graph */
    const kir_mem_plan *plan; /* the plan checked */
    ks_buf *why;             /* the first problem */
    kir_val *where;          /* the node it is about, or NULL */
    size_t n;                /* nodes */
    uint32_t *group_first;   /* [n] first node of each node's `fuse` group */
    uint32_t *group_last;    /* [n] last node of each node's group */
    uint32_t *start;         /* [n] first node at which each value is live, groups running at once */
    uint32_t *end;           /* [n] last node at which each value is live, groups running at once */
    uint32_t *read_end;      /* [n] last node that reads each value, in schedule order */
    kir_val *gen;            /* [n] the value whose write a value's bytes hold: itself, or what it views */
    kir_val *root;           /* [n] the first value of the chain of shared bytes each value is in */
} kir_checker;

static const char *op_name(const kir_checker *c, kir_val v) { return kir_op_table[c->g->nodes[v].op].name; }

/* The first problem: "node %v (op): ..." about v, or about the whole plan
 * when v is KIR_NONE. */
static int fail(kir_checker *c, kir_val v, const char *fmt, ...) KS_PRINTF(3, 4);
static int fail(kir_checker *c, kir_val v, const char *fmt, ...)
{
    if (v != KIR_NONE) ks_buf_printf(c->why, "node %%%u (%s): ", (unsigned)v, op_name(c, v));
    va_list ap;
    va_start(ap, fmt);
    ks_buf_vprintf(c->why, fmt, ap);
    va_end(ap);
    if (c->where) *c->where = v;
    return -1;
}

/* Out of memory: the check cannot be made, and says so as its problem; -2. */
static int nomem(kir_checker *c, size_t count, size_t elem)
{
    size_t bytes;
    if (!ks_mul_size(count, elem, &bytes)) bytes = SIZE_MAX;
    fail(c, KIR_NONE, "out of memory (allocating %zu bytes for checking the memory plan)", bytes);
    return -2;
}

/* Sizes, bounds and the sharing rules of one value. */
static int check_value(kir_checker *c, kir_val v)
{
    const kir_mem_plan *p = c->plan;
    const kir_node *n = kir_node_at(c->g, v);
    const char *op = op_name(c, v);
    uint8_t flags = p->flags[v];
    if (n->op == KIR_OP_WEIGHT) {
        if (p->offset[v] != KIR_MEM_NONE || p->bytes[v] != 0 || flags != 0)
            return fail(c, v, "has a place in the arena; weights have none");
        return 0;
    }
    uint64_t want;
    if (kir_value_bytes(n, p->max_tokens, &want) != 0)
        return fail(c, v, "more than 2^40 bytes at %lld tokens: too large to plan", (long long)p->max_tokens);
    if (p->bytes[v] != want) {
        ks_buf t = KS_BUF_TRY;
        kir_format_type(&t, n);
        fail(c, v, "mem.bytes %llu, but %s at %lld tokens takes %llu", (unsigned long long)p->bytes[v],
             ks_buf_cstr(&t), (long long)p->max_tokens, (unsigned long long)want);
        ks_buf_free(&t);
        return -1;
    }
    if (p->offset[v] == KIR_MEM_NONE) return fail(c, v, "no place in the arena (no mem.offset)");
    if (p->offset[v] % KIR_MEM_ALIGN != 0)
        return fail(c, v, "mem.offset %llu is not a multiple of %d", (unsigned long long)p->offset[v], KIR_MEM_ALIGN);
    if (p->offset[v] > p->arena_bytes || p->bytes[v] > p->arena_bytes - p->offset[v])
        return fail(c, v, "mem.offset %llu + %llu bytes at %lld tokens is past mem.arena_bytes %llu",
                    (unsigned long long)p->offset[v], (unsigned long long)p->bytes[v], (long long)p->max_tokens,
                    (unsigned long long)p->arena_bytes);
    if ((flags & KIR_MEM_ALIAS) && (flags & KIR_MEM_INPLACE))
        return fail(c, v, "marked both a view (mem.alias) and in place (mem.inplace)");
    if (kir_op_is_view(n->op) && !(flags & KIR_MEM_ALIAS))
        return fail(c, v, "a view, but it does not alias its operand (no mem.alias)");
    if ((flags & KIR_MEM_ALIAS) && !kir_op_is_view(n->op))
        return fail(c, v, "aliases its operand (mem.alias), but %s is not a view", op);
    if ((flags & KIR_MEM_INPLACE) && !kir_op_in_place(n->op)) {
        if (kir_op_table[n->op].fusion == KIR_FUSE_ELEMWISE)
            return fail(c, v, "marked in place, but %s reads elements of its operand other than the one it writes: "
                        "it never runs in place", op);
        return fail(c, v, "marked in place, but %s is not elementwise", op);
    }
    kir_val src = n->nin > 0 ? n->in[0] : KIR_NONE;
    if (p->share[v] != (flags ? src : KIR_NONE))
        return fail(c, v, "names %%%u as the value it shares bytes with", (unsigned)p->share[v]);
    if (!flags) return 0;
    const char *how = flags & KIR_MEM_ALIAS ? "a view of" : "in place over";
    if (src == KIR_NONE || c->g->nodes[src].op == KIR_OP_WEIGHT)
        return fail(c, v, "%s a value with no place in the arena", how);
    if (p->offset[src] != p->offset[v] || p->bytes[src] != p->bytes[v])
        return fail(c, v, "%s %%%u, so at its bytes [%llu,%llu), but at [%llu,%llu)", how, (unsigned)src,
                    (unsigned long long)p->offset[src], (unsigned long long)(p->offset[src] + p->bytes[src]),
                    (unsigned long long)p->offset[v], (unsigned long long)(p->offset[v] + p->bytes[v]));
    return 0;
}

/* Live ranges; gen, the write whose bytes a view shows; root, the chain. */
static void compute_liveness(kir_checker *c)
{
    const kir_graph *g = c->g;
    kir_group_spans(g, c->group_first, c->group_last);
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
        uint8_t flags = c->plan->flags[v];
        c->gen[v] = (flags & KIR_MEM_ALIAS) ? c->gen[n->in[0]] : (kir_val)v;
        c->root[v] = (flags & (KIR_MEM_ALIAS | KIR_MEM_INPLACE)) ? c->root[n->in[0]] : (kir_val)v;
    }
    /* a view's uses read what it views; views come after their operands */
    for (size_t v = c->n; v-- > 0;)
        if (c->plan->flags[v] & KIR_MEM_ALIAS) {
            kir_val o = g->nodes[v].in[0];
            if (c->end[v] > c->end[o]) c->end[o] = c->end[v];
            if (c->read_end[v] > c->read_end[o]) c->read_end[o] = c->read_end[v];
        }
}

static int overlap(const kir_mem_plan *p, kir_val a, kir_val b)
{
    return p->offset[a] < p->offset[b] + p->bytes[b] && p->offset[b] < p->offset[a] + p->bytes[a];
}

/* ---- in place in a `fuse` group ------------------------------------------------------------
 * An op of a group in place over src: no other node of the group may read
 * bytes of src that the group did not write (its blocks run in no order). A
 * reshape moves no data. The reads from before the group are gathered once
 * per group, their byte spans sorted, so that counting those that meet src
 * takes two binary searches. */

/* A group's reads of values written before it. */
typedef struct group_reads {
    uint32_t first;  /* the group gathered (UINT32_MAX: none yet) */
    size_t n;        /* reads */
    uint64_t *lo;    /* [n] their first bytes, ascending */
    uint64_t *hi;    /* [n] one past their last bytes, ascending */
} group_reads;

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Does u's operand x count as a read, by the group from first, of bytes written before it? */
static int outside_read(const kir_checker *c, kir_val x, uint32_t first)
{
    return x != KIR_NONE && c->plan->offset[x] != KIR_MEM_NONE && c->gen[x] < first;
}

static void gather_reads(const kir_checker *c, uint32_t first, uint32_t last, group_reads *r)
{
    r->first = first;
    r->n = 0;
    for (uint32_t u = first; u <= last; u++) {
        const kir_node *n = &c->g->nodes[u];
        if (n->op == KIR_OP_RESHAPE) continue;
        for (int i = 0; i < n->nin; i++) {
            kir_val x = n->in[i];
            if (!outside_read(c, x, first)) continue;
            r->lo[r->n] = c->plan->offset[x];
            r->hi[r->n] = c->plan->offset[x] + c->plan->bytes[x];
            r->n++;
        }
    }
    qsort(r->lo, r->n, sizeof *r->lo, cmp_u64);
    qsort(r->hi, r->n, sizeof *r->hi, cmp_u64);
}

/* Entries of the ascending a[0..n) below x. */
static size_t count_below(const uint64_t *a, size_t n, uint64_t x)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (a[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int check_group_reads(kir_checker *c, kir_val v, kir_val src, group_reads *r)
{
    uint32_t first = c->group_first[v], last = c->group_last[v];
    if (first == last) return 0;
    if (r->first != first) gather_reads(c, first, last, r);
    const kir_mem_plan *p = c->plan;
    uint64_t lo = p->offset[src], hi = lo + p->bytes[src];
    /* reads that meet [lo, hi): all but those ending at or below lo and
     * those starting at or above hi; then not v's own */
    size_t meet = r->n - count_below(r->hi, r->n, lo + 1) - (r->n - count_below(r->lo, r->n, hi));
    const kir_node *vn = &c->g->nodes[v];
    for (int i = 0; i < vn->nin; i++)
        if (outside_read(c, vn->in[i], first) && overlap(p, vn->in[i], src)) meet--;
    if (meet == 0) return 0;
    for (uint32_t u = first; u <= last; u++) { /* name the first such read */
        const kir_node *n = &c->g->nodes[u];
        if (u == v || n->op == KIR_OP_RESHAPE) continue;
        for (int i = 0; i < n->nin; i++) {
            kir_val x = n->in[i];
            if (!outside_read(c, x, first) || !overlap(p, x, src)) continue;
            return fail(c, v, "in place over %%%u, but node %%%u (%s) of its fuse group (nodes %%%u to %%%u, one "
                        "kernel whose blocks run in no order) reads %%%u, written before the group",
                        (unsigned)src, (unsigned)u, op_name(c, u), (unsigned)first, (unsigned)last, (unsigned)x);
        }
    }
    KS_UNREACHABLE();
}

/* An in-place op overwrites its operand's bytes: nothing may read them later. */
static int check_in_place(kir_checker *c)
{
    /* the last node at which each write (gen) is read, and by which value */
    uint32_t *gen_end = ks_try_calloc(c->n + 1, sizeof *gen_end);
    kir_val *gen_reader = ks_try_calloc(c->n + 1, sizeof *gen_reader);
    size_t n_operands = 0;
    for (size_t v = 0; v < c->n; v++) n_operands += c->g->nodes[v].nin;
    group_reads r = {UINT32_MAX, 0, ks_try_calloc(n_operands + 1, sizeof *r.lo),
                     ks_try_calloc(n_operands + 1, sizeof *r.hi)};
    if (!gen_end || !gen_reader || !r.lo || !r.hi) {
        free(gen_end);
        free(gen_reader);
        free(r.lo);
        free(r.hi);
        return nomem(c, c->n + 1 + n_operands + 1, sizeof(uint64_t));
    }
    int rc = 0;
    for (size_t v = 0; v < c->n; v++) {
        kir_val w = c->gen[v];
        if (c->read_end[v] >= gen_end[w]) {
            gen_end[w] = c->read_end[v];
            gen_reader[w] = (kir_val)v;
        }
    }
    for (size_t v = 0; v < c->n && rc == 0; v++) {
        if (!(c->plan->flags[v] & KIR_MEM_INPLACE)) continue;
        kir_val src = c->g->nodes[v].in[0], w = c->gen[src], root = c->root[src];
        if (c->g->nodes[root].op == KIR_OP_INPUT)
            rc = fail(c, (kir_val)v, "in place over %%%u, whose bytes hold the input %%%u", (unsigned)src,
                      (unsigned)root);
        else if (gen_end[w] > v)
            rc = fail(c, (kir_val)v, "in place over %%%u, but node %%%u (%s) is live until node %%%u", (unsigned)src,
                      (unsigned)gen_reader[w], op_name(c, gen_reader[w]), (unsigned)gen_end[w]);
        else
            rc = check_group_reads(c, (kir_val)v, src, &r);
    }
    free(gen_end);
    free(gen_reader);
    free(r.lo);
    free(r.hi);
    return rc;
}

/* ---- no overlap ------------------------------------------------------------------------- */

/* A chain of values that share bytes: one place, one span of live nodes. */
typedef struct chain {
    kir_val root;   /* its first value */
    uint32_t start; /* first node at which a value of it is live */
    uint32_t end;   /* last node at which a value of it is live */
    uint64_t lo;    /* its first byte */
    uint64_t hi;    /* one past its last byte */
} chain;

/* The live chains by offset: a segment tree whose leaves are the distinct
 * offsets, each holding the chain live there (at most one while no two
 * overlap), and whose inner nodes hold the chain of highest end below them. */
typedef struct live_tree {
    const chain *chains; /* the chains */
    uint32_t *node;      /* [2 * size] chain index, or NO_CHAIN */
    size_t size;         /* leaves, a power of two */
} live_tree;

static uint32_t higher(const live_tree *t, uint32_t a, uint32_t b)
{
    if (a == NO_CHAIN) return b;
    if (b == NO_CHAIN) return a;
    return t->chains[b].hi > t->chains[a].hi ? b : a;
}

static void tree_set(live_tree *t, size_t leaf, uint32_t chain_index)
{
    size_t i = t->size + leaf;
    t->node[i] = chain_index;
    for (i /= 2; i >= 1; i /= 2) t->node[i] = higher(t, t->node[2 * i], t->node[2 * i + 1]);
}

/* The live chain of highest end among leaves [0, count). */
static uint32_t tree_highest(const live_tree *t, size_t count)
{
    uint32_t best = NO_CHAIN;
    size_t lo = t->size, hi = t->size + count; /* [lo, hi) */
    while (lo < hi) {
        if (lo & 1) best = higher(t, best, t->node[lo++]);
        if (hi & 1) best = higher(t, best, t->node[--hi]);
        lo /= 2;
        hi /= 2;
    }
    return best;
}

/* Chain indices sorted by key (start or end) with a counting sort: keys are node indices.
 * 0, or -1 when out of memory. */
static int sort_chains(const chain *ch, size_t k, size_t n, int by_end, uint32_t *out)
{
    uint32_t *count = ks_try_calloc(n + 2, sizeof *count);
    if (!count) return -1;
    for (size_t i = 0; i < k; i++) count[(by_end ? ch[i].end : ch[i].start) + 1]++;
    for (size_t t = 0; t <= n; t++) count[t + 1] += count[t];
    for (size_t i = 0; i < k; i++) out[count[by_end ? ch[i].end : ch[i].start]++] = (uint32_t)i;
    free(count);
    return 0;
}

/* Report that chains a and b (b starting later, or at once) share bytes while live. */
static int report_overlap(kir_checker *c, const chain *a, const chain *b)
{
    const kir_mem_plan *p = c->plan;
    uint32_t t = b->start;
    kir_val u = KIR_NONE; /* the first value of a live at t */
    for (size_t v = 0; v < c->n && u == KIR_NONE; v++)
        if (p->offset[v] != KIR_MEM_NONE && c->root[v] == a->root && c->start[v] <= t && t <= c->end[v]) u = (kir_val)v;
    KS_ASSERT(u != KIR_NONE);
    uint64_t lo = a->lo > b->lo ? a->lo : b->lo, hi = a->hi < b->hi ? a->hi : b->hi;
    return fail(c, b->root, "shares bytes [%llu,%llu) with node %%%u (%s), and both are live at node %%%u",
                (unsigned long long)lo, (unsigned long long)hi, (unsigned)u, op_name(c, u), (unsigned)t);
}

static int check_overlaps(kir_checker *c)
{
    const kir_mem_plan *p = c->plan;
    size_t n = c->n, k = 0;
    uint32_t *chain_of = ks_try_calloc(n + 1, sizeof *chain_of);
    chain *ch = ks_try_calloc(n + 1, sizeof *ch);
    uint32_t *by_start = ks_try_calloc(n + 1, sizeof *by_start), *by_end = ks_try_calloc(n + 1, sizeof *by_end);
    uint64_t *offsets = ks_try_calloc(n + 1, sizeof *offsets);
    live_tree t = {ch, NULL, 1};
    while (t.size < n + 1) t.size *= 2; /* k <= n chains, m <= k offsets */
    t.node = ks_try_calloc(2 * t.size, sizeof *t.node);
    int rc = 0;
    if (!chain_of || !ch || !by_start || !by_end || !offsets || !t.node) {
        rc = nomem(c, n + 1, sizeof *ch + 3 * sizeof(uint64_t) + 4 * sizeof *t.node);
        goto done;
    }
    for (size_t v = 0; v < n; v++) {
        if (p->offset[v] == KIR_MEM_NONE) continue;
        if (c->root[v] == v) {
            ch[k] = (chain){(kir_val)v, c->start[v], c->end[v], p->offset[v], p->offset[v] + p->bytes[v]};
            chain_of[v] = (uint32_t)k++;
        }
        chain *x = &ch[chain_of[c->root[v]]];
        if (c->start[v] < x->start) x->start = c->start[v];
        if (c->end[v] > x->end) x->end = c->end[v];
    }
    if (sort_chains(ch, k, n, 0, by_start) != 0 || sort_chains(ch, k, n, 1, by_end) != 0) {
        rc = nomem(c, n + 2, sizeof(uint32_t));
        goto done;
    }
    /* the distinct offsets, ascending: the tree's leaves */
    for (size_t i = 0; i < k; i++) offsets[i] = ch[i].lo;
    qsort(offsets, k, sizeof *offsets, cmp_u64);
    size_t m = 0;
    for (size_t i = 0; i < k; i++)
        if (m == 0 || offsets[i] != offsets[m - 1]) offsets[m++] = offsets[i];
    for (t.size = 1; t.size < m;) t.size *= 2; /* the tree's first 2 * size entries are used */
    for (size_t i = 0; i < 2 * t.size; i++) t.node[i] = NO_CHAIN;

    size_t gone = 0; /* chains of by_end taken out */
    for (size_t i = 0; i < k && rc == 0; i++) {
        const chain *b = &ch[by_start[i]];
        /* chains that ended before b starts are no longer live (they all started before it) */
        for (; gone < k && ch[by_end[gone]].end < b->start; gone++)
            tree_set(&t, count_below(offsets, m, ch[by_end[gone]].lo), NO_CHAIN);
        uint32_t a = tree_highest(&t, count_below(offsets, m, b->hi));
        if (a != NO_CHAIN && ch[a].hi > b->lo)
            rc = report_overlap(c, &ch[a], b);
        else
            tree_set(&t, count_below(offsets, m, b->lo), by_start[i]);
    }
done:
    free(chain_of);
    free(ch);
    free(by_start);
    free(by_end);
    free(offsets);
    free(t.node);
    return rc;
}

int kir_plan_check(const kir_graph *g, const kir_mem_plan *plan, ks_buf *why, kir_val *where)
{
    kir_checker c = {.g = g, .plan = plan, .why = why, .where = where, .n = g->n_nodes};
    if (where) *where = KIR_NONE;
    if (plan->n_nodes != g->n_nodes)
        return fail(&c, KIR_NONE, "the plan covers %zu nodes, the graph has %zu", plan->n_nodes, g->n_nodes);
    if (plan->max_tokens < 1 || plan->max_tokens > KIR_MEM_MAX_TOKENS)
        return fail(&c, KIR_NONE, "the plan is made for %lld tokens; a plan is made for 1 to %lld",
                    (long long)plan->max_tokens, (long long)KIR_MEM_MAX_TOKENS);
    if (plan->arena_bytes > KIR_MEM_MAX_ARENA)
        return fail(&c, KIR_NONE, "the plan's arena has %llu bytes, more than %llu",
                    (unsigned long long)plan->arena_bytes, (unsigned long long)KIR_MEM_MAX_ARENA);
    for (size_t v = 0; v < c.n; v++)
        if (check_value(&c, (kir_val)v) != 0) return -1;
    c.group_first = ks_try_calloc(c.n + 1, sizeof *c.group_first);
    c.group_last = ks_try_calloc(c.n + 1, sizeof *c.group_last);
    c.start = ks_try_calloc(c.n + 1, sizeof *c.start);
    c.end = ks_try_calloc(c.n + 1, sizeof *c.end);
    c.read_end = ks_try_calloc(c.n + 1, sizeof *c.read_end);
    c.gen = ks_try_calloc(c.n + 1, sizeof *c.gen);
    c.root = ks_try_calloc(c.n + 1, sizeof *c.root);
    int rc;
    if (!c.group_first || !c.group_last || !c.start || !c.end || !c.read_end || !c.gen || !c.root) {
        rc = nomem(&c, c.n + 1, 7 * sizeof(uint32_t));
    } else {
        compute_liveness(&c);
        rc = check_in_place(&c);
        if (rc == 0) rc = check_overlaps(&c);
    }
    free(c.group_first);
    free(c.group_last);
    free(c.start);
    free(c.end);
    free(c.read_end);
    free(c.gen);
    free(c.root);
    return rc;
}
