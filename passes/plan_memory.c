/*
 * plan_memory.c — static memory planning of a step's activations.
 *
 * Requires: a verified graph (kir_verify): operands defined before their
 * users, every node's type inferred, dims positive or T, `fuse` groups
 * contiguous runs of the schedule.
 *
 * Guarantees: every value that is not a WEIGHT gets a byte offset in one
 * arena of arena_bytes, aligned to KIR_MEM_ALIGN, valid for any step of up to
 * max_tokens tokens, whether the runtime runs a kernel per node or one
 * kernel per `fuse` group; two values live at the same node never share a
 * byte unless one is a view of the other, or one is the operand that an
 * in-place elementwise op overwrites at its last use (kir_plan_check in
 * ir/plan_check.c proves this for a plan without trusting the planner);
 * arena_bytes is the smallest over the placements tried (an arena over
 * KIR_MEM_MAX_ARENA is an error), and lower_bound_bytes, computed with the
 * same liveness, is reported beside it so that a regression shows.
 *
 * Fused kernels: the nodes of a group run as one kernel whose blocks run in
 * no order, so liveness treats them as running at once: a value read by any
 * node of a group is live until the group's last node, a value defined in a
 * group is live from its first node. An elementwise op may take over its
 * operand's bytes only where the thread that writes element i is the one
 * that read it: the operand dies at the op in schedule order (a kernel per
 * node), and no other node of the op's group reads bytes of it that were
 * written before the group (a fused kernel computes the group's own values
 * in registers; an outside value that, say, a norm prologue of the group
 * reads must not be overwritten by the group's residual add). ROPE reads
 * the rotation partner of each element and never runs in place; the other
 * elementwise ops (add, sub, mul, whose second operand broadcasts over
 * leading dims, scale and the activations) read only element i to write
 * element i.
 *
 * Does not: change the schedule (node order is the schedule; a different
 * order could lower the bound), place weights (they live in the engine's
 * weight data), make SLICE or CONCAT views (a slice of the last dim is not
 * contiguous, and a concat would have to move its operands' producers), plan
 * the KV cache (runtime/kv/kv_cache.h does), place values differently for
 * steps smaller than max_tokens (a value uses a prefix of its slot), or
 * leave out a group's internal values (a fused kernel never writes them,
 * but a runtime that runs a kernel per node does: they keep their bytes).
 *
 * Three stages, as TVM's StaticPlanBlockMemory:
 *
 *  1. init (find_slots): each value's size, its last use, and the slot it
 *     lives in. A view (RESHAPE, OUTPUT, KV_WRITE) joins its operand's
 *     slot; an elementwise op joins its first operand's slot when that slot
 *     dies at the op, holds no INPUT, has the same size and the op's group
 *     allows it (above) (ggml-alloc lets a node reuse a parent that has no
 *     other consumer left); every other value opens a slot, live from the
 *     first node of its definition's group (an INPUT: from the start of the
 *     step, when the runtime copies it in) to the last node of the group of
 *     the last use of any value in the slot (an OUTPUT: to the end of the
 *     step, when the runtime reads it). The lower bound is the most bytes of
 *     slots live at one node.
 *
 *  2. plan (assign_offsets): an offline dynamic storage allocation over the
 *     slots. Each heuristic takes the slots in some order and puts each at
 *     a gap below, between or above the slots already placed that are live
 *     at the same time: greedy by size (Pisarchyk & Lee, "Efficient Memory
 *     Management for Deep Neural Net Inference", 2020), and orders by the
 *     load at the slot's busiest node, by size x lifetime, by lifetime and
 *     by schedule (the last is the free list of ggml-alloc and TVM, run
 *     offline), each with best fit (smallest gap) and first fit (lowest
 *     gap). The smallest wins. When it is above the lower bound a local
 *     search repairs the winning order: it moves a slot that touches the
 *     peak earlier in the order (or swaps two slots), places the order
 *     again from the first change, and keeps the change when the arena
 *     does not grow; its generator has a fixed seed and its budget counts
 *     work, so plans are reproducible. (An exact branch and bound over
 *     canonical placements, after MiniMalloc, was tried and dropped: on the
 *     random graphs of tests/planner it found less than this search.)
 *
 *  3. rewrite (write_plan): per-node offsets, sizes and flags.
 */
#include "passes/plan_memory.h"

#include "passes/pipeline.h"

#include <stdlib.h>
#include <string.h>

#define NO_SLOT UINT32_MAX

/* Where values live: one or more values that share the same bytes. */
typedef struct kp_slot {
    uint64_t bytes;      /* size, a multiple of KIR_MEM_ALIGN */
    uint32_t first;      /* first node at which it is live (0 for an INPUT), groups running at once */
    uint32_t last;       /* last node at which it is live, groups running at once */
    uint32_t last_read;  /* last node that reads it, in schedule order (n-1 when it holds an OUTPUT) */
    kir_val root;        /* the value that opened it */
    int holds_input;     /* the root is an INPUT: never overwritten in place */
} kp_slot;

/* A placed slot's bytes [lo, hi), as the gap search sees it. */
typedef struct kp_span {
    uint64_t lo; /* first byte */
    uint64_t hi; /* one past the last byte */
} kp_span;

/* Orders in which the heuristics place slots. */
typedef enum kp_order {
    ORDER_SIZE,     /* largest first (greedy by size) */
    ORDER_PEAK,     /* busiest node in the lifetime first, then largest */
    ORDER_AREA,     /* largest size x lifetime first */
    ORDER_LIFETIME, /* longest lifetime first, then largest */
    ORDER_SCHEDULE, /* by first node: the online free list, run offline */
    ORDER_COUNT
} kp_order;

static const char *const strategy_names[ORDER_COUNT][2][2] = {
    /* [order][first fit?][repaired?] */
    [ORDER_SIZE] = {{"size/best-fit", "size/best-fit+repair"}, {"size/first-fit", "size/first-fit+repair"}},
    [ORDER_PEAK] = {{"peak/best-fit", "peak/best-fit+repair"}, {"peak/first-fit", "peak/first-fit+repair"}},
    [ORDER_AREA] = {{"area/best-fit", "area/best-fit+repair"}, {"area/first-fit", "area/first-fit+repair"}},
    [ORDER_LIFETIME] = {{"lifetime/best-fit", "lifetime/best-fit+repair"},
                        {"lifetime/first-fit", "lifetime/first-fit+repair"}},
    [ORDER_SCHEDULE] = {{"schedule/best-fit", "schedule/best-fit+repair"},
                        {"schedule/first-fit", "schedule/first-fit+repair"}},
};

/* The pass's state; everything in it lives in scratch, freed on return. */
typedef struct kp_planner {
    const kir_graph *g;      /* the graph planned */
    int64_t max_tokens;      /* T the arena is sized for */
    ks_diag *d;              /* where user errors go */
    ks_arena scratch;        /* the pass's scratch arena */
    size_t n;                /* nodes in g */
    uint64_t *bytes;         /* [n] bytes of each value (0 for weights) */
    uint32_t *group_first;   /* [n] first node of each node's `fuse` group (itself when it has none) */
    uint32_t *group_last;    /* [n] last node of each node's group */
    uint32_t *last_use;      /* [n] last node of the group of the last node that reads each value directly
                                (its own group's last node if none) */
    uint32_t *last_read;     /* [n] last node that reads each value directly, in schedule order (itself if none) */
    kir_val *base;           /* [n] the value whose bytes each value is: itself, or what a view shows */
    uint32_t *slot_of;       /* [n] slot of each value, NO_SLOT for weights */
    uint8_t *flags;          /* [n] KIR_MEM_* bits */
    kp_slot *slots;          /* [n_slots] */
    size_t n_slots;          /* slots opened */
    uint32_t *adj_start;     /* [n_slots+1] CSR: slot s conflicts with adj[adj_start[s] .. adj_start[s+1]) */
    uint32_t *adj;           /* slots live at a common node with each slot */
    uint64_t *load;          /* [n] bytes of slots live at each node */
    uint64_t lower_bound;    /* max of load */
    uint64_t naive;          /* bytes of all values that are not views */
    uint64_t *offset;        /* [n_slots] the kept placement */
    uint64_t arena;          /* its size */
    const char *strategy;    /* its name */
    uint64_t rng;            /* state of the repair's generator (xorshift64*) */
} kp_planner;

/* ---- diagnostics -------------------------------------------------------------------- */

/* Messages about a node are kir_verify's (kir_node_error); a graph with no name is "<graph>" in them. */
#define PLAN_NO_NAME "<graph>"

/* ---- stage 1: sizes, last uses, slots ------------------------------------------------- */

static uint32_t open_slot(kp_planner *p, kir_val v)
{
    const kir_node *n = kir_node_at(p->g, v);
    kp_slot *s = &p->slots[p->n_slots];
    s->bytes = p->bytes[v];
    s->first = n->op == KIR_OP_INPUT ? 0 : p->group_first[v];
    s->last = p->last_use[v];
    s->last_read = p->last_read[v];
    s->root = v;
    s->holds_input = n->op == KIR_OP_INPUT;
    return (uint32_t)p->n_slots++;
}

/* May v, an elementwise op of a `fuse` group, write over slot s (its first
 * operand's, which dies at v in schedule order)? In one kernel the group's
 * blocks run in no order: no other node of the group may read bytes of s
 * that were written before the group, as one block could overwrite them
 * before another reads them. Values the group computes itself are never
 * read back from memory there (and, a kernel per node, they are read before
 * v runs). A reshape moves no data and reads nothing. */
static int group_allows_in_place(const kp_planner *p, kir_val v, uint32_t s)
{
    uint32_t first = p->group_first[v], last = p->group_last[v];
    for (uint32_t u = first; u <= last; u++) {
        const kir_node *n = &p->g->nodes[u];
        if (u == v || n->op == KIR_OP_RESHAPE) continue;
        for (int i = 0; i < n->nin; i++) {
            if (n->in[i] == KIR_NONE) continue;
            kir_val b = p->base[n->in[i]];
            if (b < first && p->slot_of[b] == s) return 0;
        }
    }
    return 1;
}

/* Sizes, last uses and slots (stage 1). Returns -1 after reporting a value
 * too large to plan. */
static int find_slots(kp_planner *p)
{
    const kir_graph *g = p->g;
    size_t n = p->n;
    p->bytes = ks_arena_alloc(&p->scratch, sizeof *p->bytes * (n + 1));
    p->group_first = ks_arena_alloc(&p->scratch, sizeof *p->group_first * (n + 1));
    p->group_last = ks_arena_alloc(&p->scratch, sizeof *p->group_last * (n + 1));
    p->last_use = ks_arena_alloc(&p->scratch, sizeof *p->last_use * (n + 1));
    p->last_read = ks_arena_alloc(&p->scratch, sizeof *p->last_read * (n + 1));
    p->base = ks_arena_alloc(&p->scratch, sizeof *p->base * (n + 1));
    p->slot_of = ks_arena_alloc(&p->scratch, sizeof *p->slot_of * (n + 1));
    p->flags = ks_arena_alloc(&p->scratch, sizeof *p->flags * (n + 1));
    p->slots = ks_arena_alloc(&p->scratch, sizeof *p->slots * (n + 1));
    kir_group_spans(g, p->group_first, p->group_last);

    int bad = 0;
    for (size_t v = 0; v < n; v++) {
        const kir_node *node = &g->nodes[v];
        p->last_use[v] = p->group_last[v];
        p->last_read[v] = (uint32_t)v;
        if (node->op == KIR_OP_WEIGHT) continue;
        if (kir_value_bytes(node, p->max_tokens, &p->bytes[v]) != 0) {
            ks_buf t = {0};
            kir_format_type(&t, node);
            kir_node_error(p->d, g, (kir_val)v, kir_graph_name(g, PLAN_NO_NAME),
                           "%s needs more than 2^40 bytes at max_tokens %lld: too large to plan", ks_buf_cstr(&t),
                           (long long)p->max_tokens);
            ks_buf_free(&t);
            bad = 1;
        }
    }
    if (bad) return -1;
    for (size_t v = 0; v < n; v++) {
        const kir_node *node = &g->nodes[v];
        for (int i = 0; i < node->nin; i++) {
            kir_val o = node->in[i];
            if (o == KIR_NONE) continue;
            KS_ASSERT(o < v);
            if (p->group_last[v] > p->last_use[o]) p->last_use[o] = p->group_last[v];
            p->last_read[o] = (uint32_t)v;
        }
        /* the runtime reads outputs after the last node */
        if (node->op == KIR_OP_OUTPUT) p->last_use[v] = p->last_read[v] = (uint32_t)(n - 1);
        p->base[v] = kir_op_is_view(node->op) && node->nin > 0 ? p->base[node->in[0]] : (kir_val)v;
    }

    for (size_t v = 0; v < n; v++) {
        const kir_node *node = &g->nodes[v];
        p->slot_of[v] = NO_SLOT;
        if (node->op == KIR_OP_WEIGHT) continue;
        kir_val src = node->nin > 0 ? node->in[0] : KIR_NONE;
        uint32_t s = src != KIR_NONE ? p->slot_of[src] : NO_SLOT;
        if (kir_op_is_view(node->op)) {
            if (s == NO_SLOT) {
                kir_node_error(p->d, g, (kir_val)v, kir_graph_name(g, PLAN_NO_NAME),
                               "a view of a weight has no place in the arena");
                return -1;
            }
            KS_ASSERT(p->bytes[v] == p->slots[s].bytes);
            p->flags[v] = KIR_MEM_ALIAS;
        } else if (kir_op_in_place(node->op) && s != NO_SLOT && !p->slots[s].holds_input &&
                   p->slots[s].last_read == v && p->slots[s].bytes == p->bytes[v] &&
                   group_allows_in_place(p, (kir_val)v, s)) {
            /* Every value that joined s so far was defined before v, and
             * any later value that joins s reads one defined at or after v:
             * so s.last_read == v means nothing reads s's bytes after v;
             * then s.last is at most v's group's last node, where v's own
             * liveness reaches. */
            p->flags[v] = KIR_MEM_INPLACE;
        } else {
            s = open_slot(p, (kir_val)v);
        }
        p->slot_of[v] = s;
        if (p->last_use[v] > p->slots[s].last) p->slots[s].last = p->last_use[v];
        if (p->last_read[v] > p->slots[s].last_read) p->slots[s].last_read = p->last_read[v];
        if (!(p->flags[v] & KIR_MEM_ALIAS)) p->naive += p->bytes[v];
    }
    return 0;
}

/* The bytes live at each node, and their maximum: no placement can use
 * fewer bytes than the slots live at one node. */
static void compute_load(kp_planner *p)
{
    uint64_t *delta = ks_arena_alloc(&p->scratch, sizeof *delta * (p->n + 1));
    p->load = ks_arena_alloc(&p->scratch, sizeof *p->load * (p->n + 1));
    for (size_t s = 0; s < p->n_slots; s++) {
        delta[p->slots[s].first] += p->slots[s].bytes;
        delta[p->slots[s].last + 1] -= p->slots[s].bytes; /* wraps back on the prefix sum */
    }
    uint64_t live = 0;
    p->lower_bound = 0;
    for (size_t t = 0; t < p->n; t++) {
        live += delta[t];
        p->load[t] = live;
        if (live > p->lower_bound) p->lower_bound = live;
    }
}

/* ---- stage 2: offsets ----------------------------------------------------------------- */

/* A sort key: the slot and three numbers compared in turn, larger first. */
typedef struct kp_key {
    uint64_t k[3];   /* keys, most significant first; larger sorts earlier */
    uint32_t slot;   /* the slot (last tie-break: smaller first) */
} kp_key;

static int cmp_key(const void *a, const void *b)
{
    const kp_key *x = a, *y = b;
    for (int i = 0; i < 3; i++)
        if (x->k[i] != y->k[i]) return x->k[i] > y->k[i] ? -1 : 1;
    return x->slot < y->slot ? -1 : x->slot > y->slot;
}

/* Slot indices sorted by first node (then index): a counting sort, as
 * first is a node index. */
static void sort_by_first(kp_planner *p, uint32_t *idx)
{
    uint32_t *count = ks_arena_alloc(&p->scratch, sizeof *count * (p->n + 1));
    for (size_t s = 0; s < p->n_slots; s++) count[p->slots[s].first + 1]++;
    for (size_t t = 0; t < p->n; t++) count[t + 1] += count[t];
    for (size_t s = 0; s < p->n_slots; s++) idx[count[p->slots[s].first]++] = (uint32_t)s;
}

/* The conflict lists: slots live at a common node. A sweep in order of
 * first node keeps the slots still live; run twice, to count, then fill. */
static void find_conflicts(kp_planner *p)
{
    size_t ns = p->n_slots;
    uint32_t *by_first = ks_arena_alloc(&p->scratch, sizeof *by_first * (ns + 1));
    uint32_t *active = ks_arena_alloc(&p->scratch, sizeof *active * (ns + 1));
    uint32_t *fill = ks_arena_alloc(&p->scratch, sizeof *fill * (ns + 1));
    p->adj_start = ks_arena_alloc(&p->scratch, sizeof *p->adj_start * (ns + 1));
    sort_by_first(p, by_first);
    for (int pass = 0; pass < 2; pass++) {
        size_t n_active = 0;
        for (size_t i = 0; i < ns; i++) {
            uint32_t s = by_first[i];
            size_t keep = 0;
            for (size_t j = 0; j < n_active; j++)
                if (p->slots[active[j]].last >= p->slots[s].first) active[keep++] = active[j];
            n_active = keep;
            for (size_t j = 0; j < n_active; j++) {
                uint32_t o = active[j];
                if (pass == 0) {
                    p->adj_start[s + 1]++;
                    p->adj_start[o + 1]++;
                } else {
                    p->adj[fill[s]++] = o;
                    p->adj[fill[o]++] = s;
                }
            }
            active[n_active++] = s;
        }
        if (pass == 0) {
            for (size_t s = 0; s < ns; s++) p->adj_start[s + 1] += p->adj_start[s];
            p->adj = ks_arena_alloc(&p->scratch, sizeof *p->adj * (p->adj_start[ns] + 1));
            memcpy(fill, p->adj_start, sizeof *fill * ns);
        }
    }
}

static int cmp_span(const void *a, const void *b)
{
    const kp_span *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Scratch of the placement loop, reused by every call. */
typedef struct kp_placer {
    uint8_t *placed; /* [n_slots] placed in this run */
    kp_span *spans;  /* [n_slots] the placed neighbours of the slot being placed */
    uint64_t work;   /* slots placed and conflicts visited, summed over runs */
} kp_placer;

/* Place the slots in `order`, each at the best (smallest) or first (lowest)
 * gap among the placed slots it conflicts with, or above them all. The
 * first `keep` slots of the order are already placed at off (a repair
 * changes the order from there on). Writes offsets to off; returns the
 * arena size, or UINT64_MAX as soon as it exceeds cutoff. */
static uint64_t place_slots(const kp_planner *p, kp_placer *w, const uint32_t *order, size_t keep, int first_fit,
                            uint64_t cutoff, uint64_t *off)
{
    memset(w->placed, 0, p->n_slots);
    uint64_t top = 0;
    for (size_t k = 0; k < keep; k++) {
        uint32_t s = order[k];
        w->placed[s] = 1;
        if (off[s] + p->slots[s].bytes > top) top = off[s] + p->slots[s].bytes;
    }
    for (size_t k = keep; k < p->n_slots; k++) {
        uint32_t s = order[k];
        uint64_t size = p->slots[s].bytes;
        size_t m = 0;
        w->work += 1 + p->adj_start[s + 1] - p->adj_start[s];
        for (uint32_t e = p->adj_start[s]; e < p->adj_start[s + 1]; e++) {
            uint32_t o = p->adj[e];
            if (w->placed[o]) w->spans[m++] = (kp_span){off[o], off[o] + p->slots[o].bytes};
        }
        if (m > 24) {
            qsort(w->spans, m, sizeof *w->spans, cmp_span);
        } else { /* few neighbours: an insertion sort beats qsort's calls */
            for (size_t i = 1; i < m; i++) {
                kp_span x = w->spans[i];
                size_t j = i;
                for (; j > 0 && w->spans[j - 1].lo > x.lo; j--) w->spans[j] = w->spans[j - 1];
                w->spans[j] = x;
            }
        }
        uint64_t cursor = 0, pick = UINT64_MAX, pick_gap = UINT64_MAX;
        for (size_t i = 0; i < m; i++) {
            if (w->spans[i].lo > cursor) {
                uint64_t gap = w->spans[i].lo - cursor;
                if (gap >= size && gap < pick_gap) {
                    pick = cursor;
                    pick_gap = gap;
                    if (first_fit) break;
                }
            }
            if (w->spans[i].hi > cursor) cursor = w->spans[i].hi;
        }
        if (pick == UINT64_MAX) pick = cursor;
        off[s] = pick;
        w->placed[s] = 1;
        if (pick + size > top) top = pick + size;
        if (top > cutoff) return UINT64_MAX;
    }
    return top;
}

/* The order a heuristic places slots in. */
static void make_order(const kp_planner *p, kp_order how, kp_key *keys, uint32_t *order)
{
    for (size_t s = 0; s < p->n_slots; s++) {
        const kp_slot *sl = &p->slots[s];
        uint64_t life = (uint64_t)sl->last - sl->first + 1;
        kp_key *k = &keys[s];
        k->slot = (uint32_t)s;
        switch (how) {
        case ORDER_SIZE:
            k->k[0] = sl->bytes, k->k[1] = life, k->k[2] = UINT64_MAX - sl->first;
            break;
        case ORDER_PEAK: {
            uint64_t peak = 0;
            for (uint32_t t = sl->first; t <= sl->last; t++)
                if (p->load[t] > peak) peak = p->load[t];
            k->k[0] = peak, k->k[1] = sl->bytes, k->k[2] = life;
            break;
        }
        case ORDER_AREA:
            /* bytes < 2^40, life < 2^22: the product fits */
            k->k[0] = sl->bytes * life, k->k[1] = sl->bytes, k->k[2] = UINT64_MAX - sl->first;
            break;
        case ORDER_LIFETIME:
            k->k[0] = life, k->k[1] = sl->bytes, k->k[2] = UINT64_MAX - sl->first;
            break;
        case ORDER_SCHEDULE:
            k->k[0] = UINT64_MAX - sl->first, k->k[1] = sl->bytes, k->k[2] = life;
            break;
        default: KS_UNREACHABLE();
        }
    }
    qsort(keys, p->n_slots, sizeof *keys, cmp_key);
    for (size_t s = 0; s < p->n_slots; s++) order[s] = keys[s].slot;
}

static uint64_t next_random(kp_planner *p)
{
    /* xorshift64* (Vigna, 2016) */
    p->rng ^= p->rng >> 12;
    p->rng ^= p->rng << 25;
    p->rng ^= p->rng >> 27;
    return p->rng * 0x2545f4914f6cdd1dull;
}

/* Work the repair may spend, in slots placed and conflicts visited: under a
 * second of CPU on a hard graph of a few hundred slots (seen on random
 * graphs whose optimum is above the bound, where the repair runs it all;
 * transformer stacks reach the bound without it). Plans must not depend on
 * the machine, so the budget is counted, not timed. */
#define KP_REPAIR_WORK ((uint64_t)50000000)

/* Local search over the placement order of the best heuristic: move a slot
 * that reaches the top of the arena, or one it conflicts with, to an
 * earlier place in the order (it then finds a low gap before smaller or
 * shorter slots take it), or swap two slots; keep the change when the arena
 * does not grow, so that the search walks plateaus. Only the part of the
 * order after the first change is placed again. Stops at the lower bound. */
static int repair_order(kp_planner *p, kp_placer *w, uint32_t *order, int first_fit)
{
    size_t ns = p->n_slots;
    uint32_t *trial = ks_arena_alloc(&p->scratch, sizeof *trial * ns);
    uint64_t *trial_off = ks_arena_alloc(&p->scratch, sizeof *trial_off * ns);
    uint32_t *pos = ks_arena_alloc(&p->scratch, sizeof *pos * ns);
    uint32_t *peak = ks_arena_alloc(&p->scratch, sizeof *peak * ns);
    uint64_t budget = KP_REPAIR_WORK;
    size_t n_peak = 0;
    int improved = 0, stale = 1;
    w->work = 0;
    while (w->work < budget && p->arena > p->lower_bound) {
        if (stale) { /* the kept placement changed */
            n_peak = 0;
            for (size_t s = 0; s < ns; s++)
                if (p->offset[s] + p->slots[s].bytes == p->arena) peak[n_peak++] = (uint32_t)s;
            for (size_t k = 0; k < ns; k++) pos[order[k]] = (uint32_t)k;
            stale = 0;
        }
        memcpy(trial, order, sizeof *trial * ns);
        size_t keep;
        uint64_t r = next_random(p);
        if (r % 4 != 3) {
            /* a slot at the top, or one of its conflicts, moves earlier */
            uint32_t s = peak[(r >> 8) % n_peak];
            uint32_t deg = p->adj_start[s + 1] - p->adj_start[s];
            if (r % 4 == 2 && deg > 0) s = p->adj[p->adj_start[s] + (uint32_t)((r >> 32) % deg)];
            uint32_t from = pos[s];
            if (from == 0) {
                w->work++;
                continue;
            }
            uint32_t to = (uint32_t)(next_random(p) % from);
            memmove(&trial[to + 1], &trial[to], sizeof *trial * (from - to));
            trial[to] = s;
            keep = to;
        } else {
            uint32_t a = (uint32_t)(next_random(p) % ns), b = (uint32_t)(next_random(p) % ns);
            uint32_t t = trial[a];
            trial[a] = trial[b];
            trial[b] = t;
            keep = a < b ? a : b;
        }
        memcpy(trial_off, p->offset, sizeof *trial_off * ns);
        uint64_t size = place_slots(p, w, trial, keep, first_fit, p->arena, trial_off);
        if (size == UINT64_MAX) continue;
        if (size < p->arena) improved = 1;
        p->arena = size;
        memcpy(order, trial, sizeof *order * ns);
        memcpy(p->offset, trial_off, sizeof *p->offset * ns);
        stale = 1;
    }
    return improved;
}

/* Offsets of every slot (stage 2): each heuristic in turn, the smallest
 * kept (the first on a tie), then the repair when it is above the bound. */
static void assign_offsets(kp_planner *p)
{
    size_t ns = p->n_slots;
    p->offset = ks_arena_alloc(&p->scratch, sizeof *p->offset * (ns + 1));
    p->arena = 0;
    p->strategy = "none";
    if (ns == 0) return;
    find_conflicts(p);
    kp_placer w = {ks_arena_alloc(&p->scratch, ns), ks_arena_alloc(&p->scratch, sizeof *w.spans * ns), 0};
    kp_key *keys = ks_arena_alloc(&p->scratch, sizeof *keys * ns);
    uint32_t *order = ks_arena_alloc(&p->scratch, sizeof *order * ns);
    uint32_t *best_order = ks_arena_alloc(&p->scratch, sizeof *best_order * ns);
    uint64_t *off = ks_arena_alloc(&p->scratch, sizeof *off * ns);
    int best_how = -1, best_ff = 0;
    p->arena = UINT64_MAX;
    for (int how = 0; how < ORDER_COUNT && p->arena > p->lower_bound; how++) {
        make_order(p, (kp_order)how, keys, order);
        for (int ff = 0; ff < 2; ff++) {
            uint64_t size = place_slots(p, &w, order, 0, ff, p->arena - 1, off);
            if (size == UINT64_MAX) continue;
            p->arena = size;
            best_how = how;
            best_ff = ff;
            memcpy(best_order, order, sizeof *order * ns);
            memcpy(p->offset, off, sizeof *off * ns);
            if (size == p->lower_bound) break;
        }
    }
    KS_ASSERT(best_how >= 0);
    int repaired = p->arena > p->lower_bound && repair_order(p, &w, best_order, best_ff);
    p->strategy = strategy_names[best_how][best_ff][repaired];
}

/* ---- stage 3: the plan ---------------------------------------------------------------- */

static void write_plan(const kp_planner *p, kp_mem_plan *plan)
{
    size_t n = p->n;
    kir_mem_plan *m = &plan->mem;
    kir_mem_plan_init(m, n);
    m->max_tokens = p->max_tokens;
    m->arena_bytes = p->arena;
    for (size_t v = 0; v < n; v++) {
        uint32_t s = p->slot_of[v];
        m->offset[v] = s == NO_SLOT ? KIR_MEM_NONE : p->offset[s];
        m->bytes[v] = p->bytes[v];
        m->flags[v] = p->flags[v];
        m->share[v] = p->flags[v] ? p->g->nodes[v].in[0] : KIR_NONE;
    }
    plan->n_buffers = p->n_slots;
    plan->naive_bytes = p->naive;
    plan->lower_bound_bytes = p->lower_bound;
    plan->strategy = p->strategy;
}

int kp_plan_memory(const kir_graph *g, int64_t max_tokens, kp_mem_plan *plan, ks_diag *d)
{
    memset(plan, 0, sizeof *plan);
    if (max_tokens < 1 || max_tokens > KIR_MEM_MAX_TOKENS) {
        ks_error(d, kir_graph_name(g, PLAN_NO_NAME), "memory plan: max_tokens must be %s, got %lld",
                 max_tokens < 1 ? "at least 1" : "at most 16777216", (long long)max_tokens);
        return -1;
    }
    kp_planner p = {.g = g, .max_tokens = max_tokens, .d = d, .n = g->n_nodes};
    p.rng = 0x9e3779b97f4a7c15ull ^ (uint64_t)g->n_nodes;
    int rc = find_slots(&p);
    if (rc == 0) {
        compute_load(&p);
        assign_offsets(&p);
        if (p.arena > KIR_MEM_MAX_ARENA) {
            ks_error(d, kir_graph_name(g, PLAN_NO_NAME), "memory plan: the arena takes %llu bytes at max_tokens %lld, more than 2^48",
                     (unsigned long long)p.arena, (long long)max_tokens);
            rc = -1;
        }
    }
    if (rc == 0) write_plan(&p, plan);
    ks_arena_free(&p.scratch);
    return rc;
}

void kp_mem_plan_free(kp_mem_plan *plan)
{
    if (!plan) return;
    kir_mem_plan_free(&plan->mem);
    memset(plan, 0, sizeof *plan);
}

void kp_plan_annotate(kir_graph *g, const kp_mem_plan *plan)
{
    kir_plan_annotate(g, &plan->mem);
    kir_param_int(g, "mem.lower_bound_bytes", (int64_t)plan->lower_bound_bytes);
    kir_param_int(g, "mem.naive_bytes", (int64_t)plan->naive_bytes);
}

/* ---- the pass ------------------------------------------------------------------------- */
int kp_plan_memory_pass(kir_graph **gp, const kp_options *opt, kp_pass_stats *st, ks_diag *d)
{
    kir_graph *g = *gp;
    st->fusions = 0;
    if (opt->max_tokens == 0) return 0; /* no plan asked for (kp_options) */
    kp_mem_plan plan;
    if (kp_plan_memory(g, opt->max_tokens, &plan, d) != 0) return -1;
    ks_buf why = {0};
    if (kir_plan_check(g, &plan.mem, &why, NULL) != 0)
        ks_die(__FILE__, __LINE__, "the memory plan is wrong: %s", ks_buf_cstr(&why));
    ks_buf_free(&why);
    kp_plan_annotate(g, &plan);
    kp_mem_plan_free(&plan);
    return 0;
}
