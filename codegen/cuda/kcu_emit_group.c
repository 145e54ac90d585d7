/*
 * kcu_emit_group.c — one kernel for a fusion group built around a matmul
 * (codegen/cuda/kcu_gen.h): the norm that feeds the matmul becomes the
 * matmul's prologue, and the elementwise ops, slices, views, rotations and
 * KV-cache writes that follow it become its epilogue. The group's
 * intermediate values are never stored: only the values read outside the
 * group are.
 *
 * Requires: a verified graph whose `fuse` attributes name groups (passes/
 * fuse_*.c). Guarantees: kcu_emit_group either writes one kernel that
 * computes every value of the group that is read outside it, writes the
 * group's KV rows, and records the group's views as aliases — or returns 0
 * having written nothing, and the caller emits the group node by node. A
 * group qualifies when its nodes are consecutive, hold exactly one matmul,
 * at most a norm before it (read by the matmul only), and after it only
 * nodes computed from the matmul's output, element by element, from at most
 * two of its columns: slices of the last dim, reshapes, unary elementwise
 * ops, add/sub/mul with an operand from outside (broadcast as the graph
 * says) or with another slice of the output, rotary embeddings, and KV
 * writes.
 *
 * How: every such node's elements are a range of the matmul's columns
 * (base .. base + size). An element that needs two columns (a rotation's
 * pair, gate * up) makes those columns partners; every other column is
 * paired with a neighbour. The matmul computes the columns pair by pair
 * (kcu_matmul's epilogue interface, kcu_prelude.cuh), in an order given by
 * a short list of strided segments (row(c)), so that each pair reaches the
 * epilogue in one thread, which evaluates the group's nodes on it in
 * registers and stores what leaves the group. What depends only on the
 * pair's columns (which nodes they belong to, a rotation's frequency) is
 * the epilogue's column step, worked out once for all the rows that a
 * thread hands over (put_epilogue says why).
 *
 * Dtypes (fast precision, passes/lower_precision.c): a group value of a half
 * dtype is rounded to it in registers as soon as it is computed (kcu_round),
 * so that the group's later nodes, its store and its KV rows see what the
 * interpreter sees — or, a bf16 value that only stores read, by its stores,
 * to the same bits (plan_lazy); f32 values stay as computed. A norm prologue of a half
 * dtype hands the matmul half values (kcu_pro_rms<.., O>), which the
 * tensor cores take as they are.
 *
 * sm_90a (kcu_options.gemm90): a group whose x and weights are of one half
 * dtype also gets kcu_gemm90 kernels (wgmma fed by TMA) for steps above a
 * threshold, in the same text under #if KCU_GEMM90_KERNELS: one per tile
 * width the rule picks (kcu_g90_pick_bn), each running the same epilogue
 * functor over column tiles that keep the pairs together
 * (kcu_g90_plan_tiles); cuda.meta records them as the kernel's variants,
 * after the prologue norm's own kernel when the group has one (its value,
 * half and planned, is what the x tensor map reads: the interpreter's
 * numerics, no weight folding).
 */
#include "codegen/cuda/kcu_gen.h"
#include "ir/numerics.h"
#include "ir/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


/* Nodes in a group at most, and pair segments at most (beyond: node by node). */
enum { GROUP_MAX = 64, SEG_MAX = 16 };

/* What a group's node is to the fused kernel. */
typedef enum role {
    ROLE_PROLOGUE, /* the norm the matmul reads */
    ROLE_MATMUL,   /* the matmul */
    ROLE_VIEW,     /* slice or reshape: a range of the columns */
    ROLE_UNARY,    /* f(operand) */
    ROLE_BINARY,   /* a op b, one or both from the columns */
    ROLE_ROPE,     /* rotation of (column, partner) pairs */
    ROLE_KV_WRITE  /* K and V rows into the cache */
} role;

typedef struct gnode {
    kir_val v;     /* the node */
    role r;        /* its role */
    int64_t base;  /* element e is matmul column base + e (computed roles) */
    int64_t size;  /* elements per token */
    int a, b;      /* operands' local indices (-1: from outside the group) */
    int store;     /* 1: its value is read outside the group (stored at its root) */
    int root;      /* local index of the node whose buffer holds its value */
} gnode;

/* A run of pairs p in [p0, p0 + count): q = p - p0, first column
 * a + (q / inner) * outer + (q % inner) * step, second column first + delta. */
typedef struct seg {
    int64_t p0, count, a, inner, outer, step, delta;
} seg;

typedef struct group {
    kcu_gen *x;          /* the generator */
    gnode n[GROUP_MAX];  /* the group's compute nodes, in order */
    int count;           /* how many */
    int mm;              /* local index of the matmul */
    int pro;             /* local index of the fused norm, or -1 */
    int64_t N, K;        /* the matmul's shape */
    int64_t *partner;    /* [N] each column's partner, -1 if none yet */
    seg segs[SEG_MAX];   /* the pair order */
    int n_segs;          /* how many */
    int64_t pairs;       /* N / 2 */
} group;

/* ---- analysis -------------------------------------------------------------------------- */
static int local_of(const group *G, kir_val v)
{
    for (int i = 0; i < G->count; i++)
        if (G->n[i].v == v) return i;
    return -1;
}

/* Make columns c and d partners; 0, or -1 when either has another. */
static int pair_columns(group *G, int64_t c, int64_t d)
{
    if (c < 0 || d < 0 || c >= G->N || d >= G->N || c == d) return -1;
    if ((G->partner[c] >= 0 && G->partner[c] != d) || (G->partner[d] >= 0 && G->partner[d] != c)) return -1;
    G->partner[c] = d;
    G->partner[d] = c;
    return 0;
}


/* Classify node i (after the matmul); 0, or -1 when it cannot be fused. */
static int classify(group *G, int i)
{
    const kir_graph *g = G->x->g;
    gnode *gn = &G->n[i];
    const kir_node *n = &g->nodes[gn->v];
    int a = n->nin > 0 ? local_of(G, n->in[0]) : -1, b = n->nin > 1 ? local_of(G, n->in[1]) : -1;
    if ((a >= 0 && G->n[a].r == ROLE_PROLOGUE) || (b >= 0 && G->n[b].r == ROLE_PROLOGUE)) return -1;
    gn->a = a, gn->b = b, gn->size = kir_row_elems(n), gn->root = i;
    switch (n->op) {
    case KIR_OP_SLICE: {
        if (a < 0 || g->nodes[n->in[0]].ndim != 2) return -1;
        gn->r = ROLE_VIEW;
        gn->base = G->n[a].base + kir_attr_int(g, gn->v, KIR_A_SLICE_START);
        return 0;
    }
    case KIR_OP_RESHAPE:
        if (a < 0) return -1;
        gn->r = ROLE_VIEW, gn->base = G->n[a].base, gn->root = G->n[a].root;
        return 0;
    case KIR_OP_SCALE:
    case KIR_OP_CLAMP:
#define KIR_FORMULA(OP, TYPE, what, expr, half) case KIR_OP_##OP: /* the unary ops of ir/ops.def's formulas */
#include "ir/ops.def"
        if (a < 0) return -1;
        gn->r = ROLE_UNARY, gn->base = G->n[a].base;
        return 0;
#define KIR_BINARY(OP, what, expr) case KIR_OP_##OP: /* the binary ops of ir/ops.def */
#include "ir/ops.def"
    {
        gn->r = ROLE_BINARY;
        if (a < 0 && b < 0) return -1;
        int in_group = a >= 0 ? a : b;
        if (kir_row_elems(&g->nodes[G->n[in_group].v]) != gn->size) return -1;
        if (a >= 0 && b >= 0) {
            if (G->n[b].size != gn->size) return -1;
            gn->base = G->n[a].base;
            if (G->n[a].base != G->n[b].base)
                for (int64_t e = 0; e < gn->size; e++)
                    if (pair_columns(G, G->n[a].base + e, G->n[b].base + e) != 0) return -1;
            return 0;
        }
        if (a < 0) {
            /* an outside first operand must have the result's shape (no broadcast of the columns) */
            const kir_node *an = &g->nodes[n->in[0]];
            if (an->ndim == 0 || an->dims[0] != KIR_DIM_T || kir_row_elems(an) != gn->size) return -1;
        }
        gn->base = G->n[in_group].base;
        return 0;
    }
    case KIR_OP_ROPE: {
        if (a < 0 || b >= 0) return -1;
        if (g->nodes[n->in[1]].op != KIR_OP_INPUT) return -1;
        int64_t heads = n->dims[1], d = n->dims[2], rot = kir_attr_int(g, gn->v, KIR_A_ROPE_ROT_DIM), half = rot / 2;
        if (rot <= 0 || rot > d || rot % 2) return -1;
        gn->r = ROLE_ROPE, gn->base = G->n[a].base;
        int pairs = kir_attr_word(g, gn->v, KIR_A_ROPE_STYLE) == KIR_ROPE_STYLE_PAIRS;
        for (int64_t h = 0; h < heads; h++)
            for (int64_t j = 0; j < half; j++) {
                int64_t c = gn->base + h * d, c0 = pairs ? c + 2 * j : c + j;
                int64_t c1 = pairs ? c0 + 1 : c0 + half;
                if (pair_columns(G, c0, c1) != 0) return -1;
            }
        return 0;
    }
    case KIR_OP_KV_WRITE:
        if (a < 0 || b < 0) return -1;
        gn->r = ROLE_KV_WRITE, gn->base = G->n[a].base, gn->root = G->n[a].root;
        return 0;
    default:
        return -1;
    }
}

/* Pair the columns left without a partner with their neighbours, then
 * describe the pairs (ordered by first column) as strided segments. */
static int order_pairs(group *G)
{
    int64_t N = G->N, last = -1;
    for (int64_t c = 0; c < N; c++) {
        if (G->partner[c] >= 0) continue;
        if (last < 0) {
            last = c;
        } else {
            G->partner[last] = c, G->partner[c] = last;
            last = -1;
        }
    }
    /* N odd: one column stays single; it must be the last one (kcu_matmul's epi.one) */
    if (last >= 0 && last != N - 1) return -1;
    G->pairs = N / 2;
    int64_t *first = ks_xmalloc(sizeof *first * (size_t)(G->pairs ? G->pairs : 1)), np = 0;
    for (int64_t c = 0; c < N; c++)
        if (G->partner[c] > c) first[np++] = c;
    KS_ASSERT(np == G->pairs);
    int rc = 0;
    G->n_segs = 0;
    for (int64_t p = 0; p < np && rc == 0;) {
        seg s = {p, 1, first[p], 1, 0, 1, G->partner[first[p]] - first[p]};
        /* the inner run: columns advancing by one step, the same delta */
        if (p + 1 < np && G->partner[first[p + 1]] - first[p + 1] == s.delta) {
            s.step = first[p + 1] - first[p];
            while (p + s.inner < np && first[p + s.inner] == s.a + s.inner * s.step &&
                   G->partner[first[p + s.inner]] - first[p + s.inner] == s.delta)
                s.inner++;
        }
        s.count = s.inner;
        /* repeats of the run, each an outer stride further */
        if (p + s.inner < np) {
            s.outer = first[p + s.inner] - s.a;
            for (;;) {
                int64_t q0 = p + s.count, ok = q0 + s.inner <= np;
                for (int64_t q = 0; ok && q < s.inner; q++) {
                    int64_t c = first[q0 + q];
                    ok = c == s.a + (s.count / s.inner) * s.outer + q * s.step && G->partner[c] - c == s.delta;
                }
                if (!ok) break;
                s.count += s.inner;
            }
        }
        if (G->n_segs == SEG_MAX) rc = -1;
        else G->segs[G->n_segs++] = s;
        p += s.count;
    }
    free(first);
    return rc;
}

/* ---- writing the kernel ---------------------------------------------------------------- */

/* The expression of unary op `op` of node v on float expression `in`, as
 * the per-node kernels compute it (kcu_emit.c). */
static void unary_expr(group *G, kir_val v, const char *in, ks_buf *b)
{
    const kir_graph *g = G->x->g;
    switch (g->nodes[v].op) {
    case KIR_OP_SCALE:
    case KIR_OP_CLAMP:
        kcu_attr_unary_write(g, v, in, b);
        return;
    default: {
        /* ir/ops.def's formula, as the interpreter computes it */
        int in_double = 0;
        ks_buf operand = {0}, expr = {0};
        const int half = (int)kir_attr_int(g, v, KIR_A_ANY_HALF_MATH); /* fast precision: the formula's float form */
        kcu_formula_write(g->nodes[v].op, half, "", &expr, &in_double, NULL); /* which type it computes in */
        ks_buf_printf(&operand, in_double ? "(double)%s" : "%s", in);
        expr.len = 0;
        kcu_formula_write(g->nodes[v].op, half, ks_buf_cstr(&operand), &expr, NULL, NULL);
        ks_buf_printf(b, in_double ? "(float)(%s)" : "(%s)", ks_buf_cstr(&expr));
        ks_buf_free(&operand);
        ks_buf_free(&expr);
        return;
    }
    }
}

/* ---- the epilogue functor: a column step, then rows ------------------------------------ */

/* Where a question about a pair's columns has the answer yes, over every
 * pair the epilogue is handed. Slot 0 is a pair's first column (row(2p),
 * kcu_g90_handoff's n0; the single last column of an odd N), slot 1 its
 * partner (row(2p + 1), n1; absent for the single column): every caller in
 * kcu_prelude.cuh hands pairs over so (kcu_emit_g90.c's tiles too). What is
 * yes for every pair needs no test, what is yes for none no code: gate/up's
 * silu is on slot 0 only, o's residual add on both slots always. */
typedef enum slot_is { SLOT_NEVER, SLOT_SOME, SLOT_ALWAYS } slot_is;

/* A question about column c: in [base, base + size) (Q_IN); a rotation's:
 * rotated, of its columns (Q_ROT); rotated, of all (Q_ROT_ANY); the first
 * of its rotation pair, of the rotated ones (Q_FIRST). */
typedef enum q_what { Q_IN, Q_ROT, Q_ROT_ANY, Q_FIRST } q_what;
typedef struct colq {
    q_what what;         /* the question */
    int64_t base, size;  /* the node's columns */
    int64_t head, rot;   /* a rotation's head dim and rotated dims (0: none) */
    int pairs;           /* a rotation's style: 1 pairs (d, d + 1), 0 halves (d, d + rot / 2) */
} colq;

/* The answer for column c (-1: the single column's absent partner); *care: whether it matters there. */
static int colq_eval(const colq *q, int64_t c, int *care)
{
    const int in = c >= q->base && c < q->base + q->size;
    const int64_t d = in && q->head ? (c - q->base) % q->head : 0;
    const int rot = in && d < q->rot;
    switch (q->what) {
    case Q_IN: *care = 1; return in;
    case Q_ROT: *care = in; return rot;
    case Q_ROT_ANY: *care = 1; return rot;
    case Q_FIRST: *care = rot; return q->pairs ? d % 2 == 0 : d < q->rot / 2;
    }
    KS_UNREACHABLE();
}

/* Where any of questions q[0 .. nq) is yes for slot j, over the pairs where one matters. */
static slot_is slot_status(const group *G, const colq *q, int nq, int j)
{
    int any = 0, all = 1;
    for (int64_t c = 0; c < G->N; c++) {
        const int64_t p = G->partner[c];
        if (p >= 0 && p < c) continue; /* slot 1 of the pair that c's partner opens */
        int care = 0, yes = 0;
        for (int i = 0; i < nq; i++) {
            int ci, a = colq_eval(&q[i], j ? p : c, &ci);
            care |= ci, yes |= ci && a;
        }
        if (!care) continue;
        any |= yes, all &= yes;
    }
    return !any ? SLOT_NEVER : all ? SLOT_ALWAYS : SLOT_SOME;
}

/* A range of columns (a node's) that the column step tests a pair's columns
 * against, once for all the nodes that share it. */
typedef struct crange {
    int64_t base, size;  /* [base, base + size) */
    slot_is in[2];       /* where slot j's column is in it */
    int flag[2];         /* col holds ok<r>_<j>, the test (where in[j] is SLOT_SOME and a store needs it) */
    int elem[2];         /* col holds e<r>_<j>, the column's element (0 outside: an address to read) */
} crange;

/* What the functor's text is written from: the ranges, the rotations' angle
 * sets, and the text of each of its parts as the nodes add to them. */
typedef struct epi_text {
    group *G;
    crange r[GROUP_MAX + 1];  /* the nodes' ranges, the matmul's [0, N) first */
    int nr;                   /* how many */
    int set_of[GROUP_MAX];    /* a rotation's angle set: the local index of the set's first rotation */
    uint8_t lazy[GROUP_MAX];  /* 1: a bf16 value kept unrounded in registers, rounded by its stores (plan_lazy) */
    ks_buf col, column;       /* col's members; column()'s body after the ranges */
    ks_buf in, fetch, apply;  /* in's members; fetch()'s and apply()'s bodies */
    struct pending_store {    /* a slot's stores, written at apply's end (put_stores) */
        int loc, r;           /* the node whose value it is; the range whose test guards it */
        kir_dtype to;         /* the dtype stored */
        char base[16], row[32], val[16]; /* the buffer, the row's index ("t", a KV slot), the value */
        int64_t stride;       /* elements a row of the buffer */
    } st[2][GROUP_MAX + 1];
    int n_st[2];
} epi_text;

static int range_of(epi_text *E, int64_t base, int64_t size)
{
    for (int i = 0; i < E->nr; i++)
        if (E->r[i].base == base && E->r[i].size == size) return i;
    KS_ASSERT(E->nr < GROUP_MAX + 1);
    crange *r = &E->r[E->nr];
    *r = (crange){.base = base, .size = size};
    const colq q = {Q_IN, base, size, 0, 0, 0};
    for (int j = 0; j < 2; j++) r->in[j] = slot_status(E->G, &q, 1, j);
    return E->nr++;
}

/* Where slot j of local node loc's columns holds one of its elements. */
static slot_is node_in(epi_text *E, int loc, int j)
{
    const gnode *gn = &E->G->n[loc];
    return E->r[range_of(E, gn->base, gn->size)].in[j];
}

/* "if (c.ok<r>_<j>) " when slot j is in range r at some pairs only, "" when at all. */
static const char *range_guard(epi_text *E, int r, int j, char *buf, size_t cap)
{
    KS_ASSERT(E->r[r].in[j] != SLOT_NEVER);
    if (E->r[r].in[j] == SLOT_ALWAYS) return "";
    E->r[r].flag[j] = 1;
    snprintf(buf, cap, "if (c.ok%d_%d) ", r, j);
    return buf;
}

/* "c.e<r>_<j>": slot j's element of range r. */
static const char *range_elem(epi_text *E, int r, int j, char *buf, size_t cap)
{
    KS_ASSERT(E->r[r].in[j] != SLOT_NEVER);
    E->r[r].elem[j] = 1;
    snprintf(buf, cap, "c.e%d_%d", r, j);
    return buf;
}

/* The value of local node loc in slot j: m<j> (the matmul's) or x<loc>_<j>;
 * a node's element needs its operands' only where they have elements. */
static const char *value_name(epi_text *E, int loc, int j, char *buf, size_t cap)
{
    KS_ASSERT(node_in(E, loc, j) != SLOT_NEVER);
    if (loc == E->G->mm) snprintf(buf, cap, "m%d", j);
    else snprintf(buf, cap, "x%d_%d", loc, j);
    return buf;
}

/* Whether range r's pairs are neighbours at even elements: every pair handed over there is columns
 * (c, c + 1) with c - base even (partner[c] == c + 1; the epilogue's two() gets a pair's first column
 * as n0 on every path), and both slots always in it — then slot 1's element is slot 0's plus one and
 * a pair of half values is one aligned 32-bit word of a row (rows of an even number of elements). */
static int range_neighbours(const epi_text *E, int r)
{
    const crange *cr = &E->r[r];
    if (cr->in[0] != SLOT_ALWAYS || cr->in[1] != SLOT_ALWAYS || cr->base % 2 || cr->size % 2) return 0;
    for (int64_t c = cr->base; c < cr->base + cr->size; c += 2)
        if (E->G->partner[c] != c + 1) return 0;
    return 1;
}

/* "n<j> - base" (just n<j> at 0). */
static void put_minus(ks_buf *b, int j, int64_t base)
{
    if (base) ks_buf_printf(b, "n%d - %lld", j, (long long)base);
    else ks_buf_printf(b, "n%d", j);
}

/* The rotations' angle sets: rotations of one precision on columns apart
 * (Llama's q and k) share one angle a row, as a pair is rotated by one of
 * them at most; set_of names each rotation's set by its first rotation. */
static void plan_angle_sets(epi_text *E)
{
    const group *G = E->G;
    const kir_graph *g = G->x->g;
    for (int i = G->mm + 1; i < G->count; i++) {
        E->set_of[i] = -1;
        if (G->n[i].r != ROLE_ROPE) continue;
        E->set_of[i] = i;
        const int64_t half_i = kir_attr_int(g, G->n[i].v, KIR_A_ANY_HALF_MATH);
        for (int s = G->mm + 1; s < i && E->set_of[i] == i; s++) {
            if (E->set_of[s] != s || kir_attr_int(g, G->n[s].v, KIR_A_ANY_HALF_MATH) != half_i) continue;
            int apart = 1;
            for (int k = s; k < i && apart; k++)
                if (E->set_of[k] == s)
                    apart = G->n[k].base + G->n[k].size <= G->n[i].base || G->n[i].base + G->n[i].size <= G->n[k].base;
            if (apart) E->set_of[i] = s;
        }
    }
}

/* Which bf16 values stay unrounded: those whose readers all store them as
 * bf16 (their own store, a KV write into a bf16 cache, a bf16 view that is
 * unrounded too). kcu_put rounds such a value as kcu_round would have
 * (rounding a bf16 value again gives its bits back), and does it under the
 * store's test: a pair of q columns does not round k's rotation. Every
 * value that a node computes with is rounded as it is computed. (Not f16:
 * kcu_round<kcu_f16> goes through the GPU's cvt, whose NaNs need not be
 * the integer rounding's, so a rounded f16 NaN may store other bits than
 * the value rounded once.) */
static void plan_lazy(epi_text *E)
{
    const group *G = E->G;
    const kir_graph *g = G->x->g;
    for (int i = G->count - 1; i >= G->mm; i--) {
        const gnode *gn = &G->n[i];
        const kir_dtype dt = g->nodes[gn->v].dtype;
        int lazy = dt == KIR_BF16 && gn->r != ROLE_KV_WRITE;
        for (int k = i + 1; k < G->count && lazy; k++) {
            const gnode *kn = &G->n[k];
            if (kn->a != i && kn->b != i) continue;
            if (kn->r == ROLE_KV_WRITE) lazy = kir_kv_dtype(g, kn->v) == KIR_BF16;
            else lazy = kn->r == ROLE_VIEW && g->nodes[kn->v].dtype == dt && E->lazy[k];
        }
        E->lazy[i] = (uint8_t)lazy;
    }
}

/* The store of local node loc's value val in slot j as dtype `to`, at row `row` (an index
 * expression) of buffer `base` of `stride` elements a row, element c.e<r>_<j> of range r: queued
 * for put_stores. */
static void queue_store(epi_text *E, int j, int loc, int r, kir_dtype to, const char *base, const char *row,
                        int64_t stride, const char *val)
{
    KS_ASSERT(E->n_st[j] < GROUP_MAX + 1);
    struct pending_store *p = &E->st[j][E->n_st[j]++];
    *p = (struct pending_store){.loc = loc, .r = r, .to = to, .stride = stride};
    snprintf(p->base, sizeof p->base, "%s", base);
    snprintf(p->row, sizeof p->row, "%s", row);
    snprintf(p->val, sizeof p->val, "%s", val);
    char e[32];
    range_elem(E, r, j, e, sizeof e); /* marks c.e<r>_<j> used: every way put_stores writes indexes by it */
}

/* Whether store p writes a bf16 value held rounded as its bits (kcu_put_held), not through kcu_put
 * (which rounds: a value kept unrounded, or held in another dtype). */
static int store_held(const epi_text *E, const struct pending_store *p)
{
    const kir_dtype dt = E->G->x->g->nodes[E->G->n[p->loc].v].dtype;
    return p->to == KIR_BF16 && dt == KIR_BF16 && !E->lazy[p->loc];
}

/* Stores of slot 0 and slot 1 into neighbouring half elements of one row (range_neighbours: the
 * residual add of o and down) as one 32-bit store (kcu_put2), taken out of the slots' lists: one
 * store a row where there were two 16-bit ones. */
static void put_pair_stores(epi_text *E)
{
    for (int a = 0; a < E->n_st[0]; a++) {
        struct pending_store *s0 = &E->st[0][a];
        if ((s0->to != KIR_BF16 && s0->to != KIR_F16) || !range_neighbours(E, s0->r)) continue;
        for (int b = 0; b < E->n_st[1]; b++) {
            struct pending_store *s1 = &E->st[1][b];
            if (s1->r != s0->r || s1->to != s0->to || strcmp(s1->base, s0->base) || strcmp(s1->row, s0->row) ||
                s1->stride != s0->stride || store_held(E, s0) != store_held(E, s1))
                continue;
            ks_buf_printf(&E->apply, "        %s(&%s[%s * %lld + c.e%d_0], %s, %s);\n",
                          store_held(E, s0) ? "kcu_put2_held" : "kcu_put2", s0->base, s0->row, (long long)s0->stride,
                          s0->r, s0->val, s1->val);
            E->st[0][a] = E->st[0][--E->n_st[0]];
            E->st[1][b] = E->st[1][--E->n_st[1]];
            a--;
            break;
        }
    }
}

/* Slot j's stores, at the end of apply. Where a slot has several, each under its own range's test,
 * the ranges apart (Llama's q, k and v: a pair's column is in one of them), the same dtype and way, and at most two
 * kinds of row, the column step picks the one (its buffer's element, its row's stride and which
 * row) and a row selects the value and stores once: a store and a test a row where there were
 * three of each (ptxas jumped over each store: the q,k,v hand-off's branches). Else each store under
 * its test. */
static void put_stores(epi_text *E, int j)
{
    const int n = E->n_st[j];
    struct pending_store *st = E->st[j];
    const char *row2 = NULL; /* the second kind of row */
    int merge = n >= 2;
    for (int i = 0; i < n && merge; i++) {
        merge = E->r[st[i].r].in[j] == SLOT_SOME && st[i].to == st[0].to && store_held(E, &st[i]) == store_held(E, &st[0]);
        /* one store a column: the stores' ranges apart (two stored nodes on the same columns keep both) */
        for (int k = 0; k < i && merge; k++)
            merge = E->r[st[i].r].base + E->r[st[i].r].size <= E->r[st[k].r].base ||
                    E->r[st[k].r].base + E->r[st[k].r].size <= E->r[st[i].r].base;
        if (merge && strcmp(st[i].row, st[0].row) != 0) {
            if (!row2) row2 = st[i].row;
            else merge = strcmp(st[i].row, row2) == 0;
        }
    }
    char guard[32];
    if (!merge) {
        for (int i = 0; i < n; i++) {
            char lhs[128];
            snprintf(lhs, sizeof lhs, "%s[%s * %lld + c.e%d_%d]", st[i].base, st[i].row, (long long)st[i].stride, st[i].r, j);
            ks_buf head = {0};
            ks_buf_printf(&head, "        %s", range_guard(E, st[i].r, j, guard, sizeof guard));
            if (store_held(E, &st[i]))
                ks_buf_printf(&E->apply, "%skcu_put_held(&%s, %s);\n", ks_buf_cstr(&head), lhs, st[i].val);
            else
                kcu_put_store(&E->apply, st[i].to, ks_buf_cstr(&head), lhs, st[i].val);
            ks_buf_free(&head);
        }
        return;
    }
    /* the column step: the element's address (NULL: no store), the row's stride, which row */
    ks_buf_printf(&E->col, " %s *dp%d; int ds%d;", kcu_elem_type(st[0].to), j, j);
    if (row2) ks_buf_printf(&E->col, " bool dr%d;", j);
    ks_buf dp = {0}, ds = {0}, dr = {0}, val = {0};
    for (int i = 0; i < n; i++) {
        range_guard(E, st[i].r, j, guard, sizeof guard); /* marks c.ok<r>_<j> used: the selects test it */
        ks_buf_printf(&dp, "c.ok%d_%d ? %s + c.e%d_%d : ", st[i].r, j, st[i].base, st[i].r, j);
        if (i < n - 1) ks_buf_printf(&ds, "c.ok%d_%d ? %lld : ", st[i].r, j, (long long)st[i].stride);
        else ks_buf_printf(&ds, "%lld", (long long)st[i].stride);
        if (row2 && strcmp(st[i].row, row2) == 0) ks_buf_printf(&dr, "%sc.ok%d_%d", dr.len ? " || " : "", st[i].r, j);
        if (i < n - 1) ks_buf_printf(&val, "c.ok%d_%d ? %s : ", st[i].r, j, st[i].val);
        else ks_buf_puts(&val, st[i].val);
    }
    ks_buf_printf(&E->column, "        c.dp%d = %snullptr;\n        c.ds%d = %s;\n", j, ks_buf_cstr(&dp), j, ks_buf_cstr(&ds));
    if (row2) ks_buf_printf(&E->column, "        c.dr%d = %s;\n", j, ks_buf_cstr(&dr));
    char row[96];
    if (row2) snprintf(row, sizeof row, "(c.dr%d ? %s : %s)", j, row2, st[0].row);
    else snprintf(row, sizeof row, "%s", st[0].row);
    ks_buf_printf(&E->apply, "        /* slot %d's store: the one its column's node has */\n"
                             "        const float s%d = %s;\n", j, j, ks_buf_cstr(&val));
    /* the store under its test alone (kcu_put_at: predicated, no branch between the rows) */
    ks_buf_printf(&E->apply, "        %s(c.dp%d, (long long)%s * c.ds%d, s%d);\n",
                  store_held(E, &st[0]) ? "kcu_put_held_at" : "kcu_put_at", j, row, j, j);
    ks_buf_free(&dp);
    ks_buf_free(&ds);
    ks_buf_free(&dr);
    ks_buf_free(&val);
}

/* Rotation i's question `what` about its columns. */
static colq rope_q(const group *G, int i, q_what what)
{
    const kir_graph *g = G->x->g;
    const gnode *gn = &G->n[i];
    return (colq){what, gn->base, gn->size, g->nodes[gn->v].dims[2], kir_attr_int(g, gn->v, KIR_A_ROPE_ROT_DIM),
                  kir_attr_word(g, gn->v, KIR_A_ROPE_STYLE) == KIR_ROPE_STYLE_PAIRS};
}

/* The column step of rotation i (locals d, rot, f of each slot it rotates;
 * col's rot and first where they vary), then of its angle set when i is
 * the set's last rotation: the frequency, the positions, whether the pair
 * is rotated at all. */
static void put_rope_column(epi_text *E, int i)
{
    const group *G = E->G;
    const gnode *gn = &G->n[i];
    const colq rq = rope_q(G, i, Q_ROT), fq = rope_q(G, i, Q_FIRST);
    const int64_t half = rq.rot / 2;
    ks_buf_printf(&E->column, "        /* rope: columns [%lld, %lld), heads of %lld, %lld rotated */\n",
                  (long long)gn->base, (long long)(gn->base + gn->size), (long long)rq.head, (long long)rq.rot);
    for (int j = 0; j < 2; j++) {
        if (node_in(E, i, j) == SLOT_NEVER || slot_status(G, &rq, 1, j) == SLOT_NEVER) continue;
        ks_buf_printf(&E->column, "        const int d%d_%d = (", i, j);
        put_minus(&E->column, j, gn->base);
        ks_buf_printf(&E->column, ") %% %lld;\n        const bool rot%d_%d = (unsigned)(", (long long)rq.head, i, j);
        put_minus(&E->column, j, gn->base);
        ks_buf_printf(&E->column, ") < %lluu && d%d_%d < %lld;\n", (unsigned long long)gn->size, i, j, (long long)rq.rot);
        if (rq.pairs) ks_buf_printf(&E->column, "        const int f%d_%d = d%d_%d / 2;\n", i, j, i, j);
        else ks_buf_printf(&E->column, "        const int f%d_%d = d%d_%d %% %lld;\n", i, j, i, j, (long long)half);
        if (slot_status(G, &rq, 1, j) == SLOT_SOME) {
            ks_buf_printf(&E->col, " bool rot%d_%d;", i, j);
            ks_buf_printf(&E->column, "        c.rot%d_%d = rot%d_%d;\n", i, j, i, j);
        }
        if (slot_status(G, &fq, 1, j) == SLOT_SOME) {
            ks_buf_printf(&E->col, " bool first%d_%d;", i, j);
            if (rq.pairs) ks_buf_printf(&E->column, "        c.first%d_%d = (d%d_%d & 1) == 0;\n", i, j, i, j);
            else ks_buf_printf(&E->column, "        c.first%d_%d = d%d_%d < %lld;\n", i, j, i, j, (long long)half);
        }
    }
    const int s = E->set_of[i];
    for (int k = i + 1; k < G->count; k++)
        if (E->set_of[k] == s) return; /* the set's last rotation writes it */
    /* the set: a pair is a rotation's pair (kcu_emit_group's classify), so both slots have one frequency */
    colq any[GROUP_MAX];
    memset(any, 0, sizeof any); /* (gcc cannot see that a set has a member) */
    int n_any = 0, members = 0;
    ks_buf fr = {0}, pp = {0}, on = {0};
    for (int k = s; k <= i; k++) {
        if (E->set_of[k] != s) continue;
        any[n_any++] = rope_q(G, k, Q_ROT_ANY);
        const colq kq = rope_q(G, k, Q_ROT);
        ks_buf slots = {0};
        for (int j = 0; j < 2; j++) {
            if (node_in(E, k, j) == SLOT_NEVER || slot_status(G, &kq, 1, j) == SLOT_NEVER) continue;
            ks_buf_printf(&fr, "rot%d_%d ? " NAME_MARK "_inv_freq%d[f%d_%d] : ", k, j, k, k, j);
            ks_buf_printf(&slots, "%srot%d_%d", slots.len ? " || " : "", k, j);
            ks_buf_printf(&on, "%srot%d_%d", on.len ? " || " : "", k, j);
        }
        if (members++ && slots.len) ks_buf_printf(&pp, "%s ? pos%d : ", ks_buf_cstr(&slots), k);
        ks_buf_free(&slots);
    }
    ks_buf_printf(&E->col, " float fr%d;", s);
    ks_buf_printf(&E->column, "        c.fr%d = %s0.0f;\n", s, ks_buf_cstr(&fr));
    if (members > 1) {
        ks_buf_printf(&E->col, " const int *pp%d;", s);
        ks_buf_printf(&E->column, "        c.pp%d = %spos%d;\n", s, ks_buf_cstr(&pp), s);
    }
    /* a pair's first column is rotated when its partner is */
    if (slot_status(G, any, n_any, 0) == SLOT_SOME) {
        ks_buf_printf(&E->col, " bool on%d;", s);
        ks_buf_printf(&E->column, "        c.on%d = %s;\n", s, on.len ? ks_buf_cstr(&on) : "false");
    }
    ks_buf_free(&fr);
    ks_buf_free(&pp);
    ks_buf_free(&on);
}

/* The angle of rotation set s for the row: its position, times the pair's
 * frequency; its cosine and sine once (under a test when some pairs are
 * not rotated). */
static void put_angle(epi_text *E, int s)
{
    const group *G = E->G;
    const kir_graph *g = G->x->g;
    colq any[GROUP_MAX];
    memset(any, 0, sizeof any); /* (gcc cannot see that a set has a member) */
    int n_any = 0, members = 0;
    for (int k = s; k < G->count; k++) {
        if (E->set_of[k] != s) continue;
        any[n_any++] = rope_q(G, k, Q_ROT_ANY);
        members++;
    }
    const slot_is on = slot_status(G, any, n_any, 0);
    if (on == SLOT_NEVER) return;
    ks_buf_printf(&E->in, " int pos%d;", s);
    ks_buf_printf(&E->fetch, "        r.pos%d = %s%d[t];\n", s, members > 1 ? "c.pp" : "pos", s);
    ks_buf_printf(&E->apply,
                  "        /* the rotation's angle for the pair (both of its columns: one frequency), "
                  "its cosine and sine once */\n"
                  "        const float angle%d = (float)r.pos%d * c.fr%d;\n"
                  "        float rc%d = 0.0f, rs%d = 0.0f;\n",
                  s, s, s, s, s);
    const char *indent = on == SLOT_SOME ? "            " : "        ";
    if (on == SLOT_SOME) ks_buf_printf(&E->apply, "        if (c.on%d) {\n", s);
    if (kir_attr_int(g, G->n[s].v, KIR_A_ANY_HALF_MATH)) /* in float with half_math (fast precision), else double */
        ks_buf_printf(&E->apply, "%skcu_sincos_half(angle%d, &rs%d, &rc%d);\n", indent, s, s, s);
    else
        ks_buf_printf(&E->apply,
                      "%sdouble sd%d, cd%d;\n"
                      "%ssincos((double)angle%d, &sd%d, &cd%d);\n"
                      "%src%d = (float)cd%d, rs%d = (float)sd%d;\n",
                      indent, s, s, indent, s, s, s, indent, s, s, s, s);
    char cn[16], sn[16];
    snprintf(cn, sizeof cn, "rc%d", s);
    snprintf(sn, sizeof sn, "rs%d", s);
    kcu_rope_factor(g, G->n[s].v, indent, cn, sn, &E->apply);
    if (on == SLOT_SOME) ks_buf_puts(&E->apply, "        }\n");
}

/* Node i's value in slot j (x<i>_<j>; rounded to a half dtype), and its store. */
static void put_node_slot(epi_text *E, int i, int j)
{
    group *G = E->G;
    const kir_graph *g = G->x->g;
    const gnode *gn = &G->n[i];
    const kir_node *nd = &g->nodes[gn->v];
    char a[32] = "", o[32] = "", bv[32] = "";
    if (gn->a >= 0) value_name(E, gn->a, j, a, sizeof a);
    ks_buf *b = &E->apply;
    ks_buf_printf(b, "        float x%d_%d = ", i, j);
    switch (gn->r) {
    case ROLE_VIEW:
        ks_buf_printf(b, "%s;\n", a);
        break;
    case ROLE_UNARY: {
        ks_buf expr = {0};
        unary_expr(G, gn->v, a, &expr);
        ks_buf_printf(b, "%s;\n", ks_buf_cstr(&expr));
        ks_buf_free(&expr);
        break;
    }
    case ROLE_BINARY: {
        for (int side = 0; side < 2; side++) {
            const int loc = side ? gn->b : gn->a;
            if (loc >= 0) {
                /* an operand from another slice of the columns: the partner's slot */
                if (side) value_name(E, loc, G->n[loc].base == gn->base ? j : 1 - j, bv, sizeof bv);
            } else {
                const kir_node *on = &g->nodes[nd->in[side]];
                /* a row operand is read with the row; one broadcast over the tokens, in the column step */
                snprintf(side ? bv : a, sizeof a, "%s.in%d_%d[%d]", on->ndim > 0 && on->dims[0] == KIR_DIM_T ? "r" : "c",
                         i, side, j);
            }
        }
        kir_binary_write(nd->op, a, bv, b, NULL); /* ir/ops.def's KIR_BINARY line */
        ks_buf_puts(b, ";\n");
        break;
    }
    case ROLE_ROPE: {
        const colq rq = rope_q(G, i, Q_ROT), fq = rope_q(G, i, Q_FIRST);
        const slot_is rot = slot_status(G, &rq, 1, j), first = slot_status(G, &fq, 1, j);
        const int s = E->set_of[i];
        if (rot != SLOT_NEVER) value_name(E, gn->a, 1 - j, o, sizeof o); /* the rotation's partner */
        ks_buf rotated = {0};
        if (first != SLOT_NEVER)
            ks_buf_printf(&rotated, "%s * rc%d - %s * rs%d", a, s, o, s);
        if (first == SLOT_SOME) ks_buf_puts(&rotated, " : ");
        if (first != SLOT_ALWAYS) ks_buf_printf(&rotated, "%s * rc%d + %s * rs%d", a, s, o, s);
        if (rot == SLOT_NEVER) ks_buf_printf(b, "%s;\n", a);
        else if (rot == SLOT_ALWAYS && first == SLOT_SOME)
            ks_buf_printf(b, "c.first%d_%d ? %s;\n", i, j, ks_buf_cstr(&rotated));
        else if (rot == SLOT_ALWAYS)
            ks_buf_printf(b, "%s;\n", ks_buf_cstr(&rotated));
        else if (first == SLOT_SOME)
            ks_buf_printf(b, "c.rot%d_%d ? (c.first%d_%d ? %s) : %s;\n", i, j, i, j, ks_buf_cstr(&rotated), a);
        else
            ks_buf_printf(b, "c.rot%d_%d ? %s : %s;\n", i, j, ks_buf_cstr(&rotated), a);
        ks_buf_free(&rotated);
        break;
    }
    default:
        KS_UNREACHABLE();
    }
    /* a half value: as stored, for the nodes after it (a view of a value of its dtype holds it already) */
    const int same = gn->r == ROLE_VIEW && g->nodes[G->n[gn->a].v].dtype == nd->dtype;
    if (nd->dtype != KIR_F32 && !E->lazy[i] && !same)
        ks_buf_printf(b, "        x%d_%d = kcu_round<%s>(x%d_%d);\n", i, j, kcu_elem_type(nd->dtype), i, j);
    if (gn->store) {
        char base[24], val[32];
        snprintf(base, sizeof base, "out%d", i);
        snprintf(val, sizeof val, "x%d_%d", i, j);
        queue_store(E, j, i, range_of(E, gn->base, gn->size), nd->dtype, base, "t", gn->size, val);
    }
}

/* A binary node's operands from outside the group: a row's two elements
 * (in, read with the row), or elements broadcast over the tokens (col,
 * read once). An element out of the node's columns reads its first (never
 * used): the address is valid with no branch. */
static void put_operand_reads(epi_text *E, int i)
{
    const group *G = E->G;
    const kir_graph *g = G->x->g;
    const gnode *gn = &G->n[i];
    const kir_node *nd = &g->nodes[gn->v];
    const int r = range_of(E, gn->base, gn->size);
    for (int side = 0; side < 2; side++) {
        if ((side ? gn->b : gn->a) >= 0) continue;
        const kir_node *on = &g->nodes[nd->in[side]];
        const int per_row = on->ndim > 0 && on->dims[0] == KIR_DIM_T;
        ks_buf_printf(per_row ? &E->in : &E->col, " float in%d_%d[2];", i, side);
        if (per_row && (on->dtype == KIR_BF16 || on->dtype == KIR_F16) && range_neighbours(E, r)) {
            /* a row's two neighbouring half elements, one 32-bit load (kcu_get2) */
            char e[32];
            range_elem(E, r, 0, e, sizeof e);
            ks_buf_printf(&E->fetch, "        kcu_get2(&in%d_%d[t * %lld + %s], r.in%d_%d);\n", i, side, (long long)gn->size, e,
                          i, side);
            continue;
        }
        for (int j = 0; j < 2; j++) {
            if (E->r[r].in[j] == SLOT_NEVER) continue;
            char e[32];
            range_elem(E, r, j, e, sizeof e);
            if (per_row)
                ks_buf_printf(&E->fetch, "        r.in%d_%d[%d] = kcu_f(in%d_%d[t * %lld + %s]);\n", i, side, j, i, side,
                              (long long)gn->size, e);
            else
                ks_buf_printf(&E->column, "        c.in%d_%d[%d] = kcu_f(in%d_%d[%s %% %lld]);\n", i, side, j, i, side, e,
                              (long long)kir_elems(on, 1));
        }
    }
}

/* The epilogue functor: row(c); the column step (struct col, column(n0, n1,
 * c)); the row's reads (struct in, fetch(t, c, r)); the rest (apply(t, v0,
 * v1, c, r)); run = the three, which two and one call (kcu_epi_steps,
 * kcu_prelude.cuh). Parameters were added in the same order as the fields
 * (param names == field names).
 *
 * Why a column step: kcu_g90_handoff keeps one pair of columns per thread
 * for all the rows of its tile, and what depends only on the columns —
 * which node's range a column falls in, its element, a rotation's
 * frequency and which half it is, a KV write's range — is worked out there
 * once. Before, apply did it again each row, with a branch around each
 * node (`if out of range: continue`): Llama-3-8B's q,k,v group at 2048
 * tokens ran at 0.49 of cuBLAS, Nsight Compute counting 35.3 M warp
 * instructions in the epilogue against 14.5 M in the mainloop, about 180 a
 * pair a row, 10 % branches and 15 % divergence bookkeeping (BSSY/BSYNC).
 * A row is now loads, arithmetic on values as they are (a slot out of a
 * node's range computes a value no one reads), selects, and stores under
 * tests worked out once (ptxas predicates a store, or jumps over it with
 * the rounding of a value only stored: plan_lazy); each slot's code is
 * written only where some pair has an element there (slot_status); the
 * one test in the arithmetic is around a rotation's sincos where some
 * pairs are not rotated (v's columns). The arithmetic is the per-node
 * kernels' and the interpreter's, operation by operation, and values are
 * stored with the bits they had: bitwise the same results as before.
 * ptxas -v and the SASS of the sm_90a kernels (Llama-3-8B, bf16, fast
 * precision, tiles of 256): q,k,v 5560 instructions -> 2312 (270 -> 125
 * branches, 294 -> 136 BSSY/BSYNC), o and down 944 -> 784, gate/up 1488 ->
 * 920; 168 registers, no spills, before and after. */
static void put_epilogue(group *G, ks_buf *fields)
{
    kcu_gen *x = G->x;
    const kir_graph *g = x->g;
    ks_buf *b = &x->body;
    ks_buf_printf(b, "\nstruct " NAME_MARK "_epi {\n%s", ks_buf_cstr(fields));
    /* row(c): the segments */
    ks_buf_puts(b, "    /* the weight row computed as column c: pairs p = c / 2 in strided runs */\n"
                   "    static __device__ __forceinline__ int row(int c)\n    {\n"
                   "        const int p = c >> 1, s = c & 1;\n");
    for (int i = 0; i < G->n_segs; i++) {
        const seg *s = &G->segs[i];
        ks_buf_printf(b, "        if (p < %lld) {\n            const int q = p - %lld;\n            return %lld",
                      (long long)(s->p0 + s->count), (long long)s->p0, (long long)s->a);
        if (s->inner < s->count) ks_buf_printf(b, " + q / %lld * %lld", (long long)s->inner, (long long)s->outer);
        if (s->count > 1) {
            if (s->inner < s->count) ks_buf_printf(b, " + q %% %lld * %lld", (long long)s->inner, (long long)s->step);
            else ks_buf_printf(b, " + q * %lld", (long long)s->step);
        }
        ks_buf_printf(b, " + s * %lld;\n        }\n", (long long)s->delta);
    }
    ks_buf_printf(b, "        return %lld; /* the single last column */\n    }\n", (long long)(G->N - 1));

    epi_text E = {.G = G};
    plan_angle_sets(&E);
    plan_lazy(&E);
    const int rm = range_of(&E, 0, G->N); /* the matmul's columns: slot 1 absent for the single last column */
    kir_dtype mt = g->nodes[G->n[G->mm].v].dtype;
    for (int j = 0; j < 2; j++) {
        if (E.r[rm].in[j] == SLOT_NEVER) continue;
        if (mt == KIR_F32 || E.lazy[G->mm]) ks_buf_printf(&E.apply, "        const float m%d = v%d;\n", j, j);
        else ks_buf_printf(&E.apply, "        const float m%d = kcu_round<%s>(v%d);\n", j, kcu_elem_type(mt), j);
        if (G->n[G->mm].store) {
            char base[16], val[16];
            snprintf(base, sizeof base, "out%d", G->mm);
            snprintf(val, sizeof val, "m%d", j);
            queue_store(&E, j, G->mm, rm, mt, base, "t", G->N, val);
        }
    }
    for (int i = G->mm + 1; i < G->count; i++)
        if (E.set_of[i] == i) put_angle(&E, i);
    for (int i = G->mm + 1; i < G->count; i++) {
        gnode *gn = &G->n[i];
        const kir_node *nd = &g->nodes[gn->v];
        if (gn->r == ROLE_KV_WRITE) {
            const gnode *kg = &G->n[gn->a], *vg = &G->n[gn->b];
            const int rk = range_of(&E, kg->base, kg->size), rv = range_of(&E, vg->base, vg->size);
            kir_dtype ct = kir_kv_dtype(g, gn->v);
            ks_buf_printf(&E.in, " int slots%d;", i);
            ks_buf_printf(&E.fetch, "        r.slots%d = slots%d[t];\n", i, i);
            ks_buf_printf(&E.apply, "        /* kv_write: k columns [%lld, %lld), v columns [%lld, %lld) */\n",
                          (long long)kg->base, (long long)(kg->base + kg->size), (long long)vg->base,
                          (long long)(vg->base + vg->size));
            for (int j = 0; j < 2; j++)
                for (int kv = 0; kv < 2; kv++) {
                    const int r = kv ? rv : rk;
                    if (E.r[r].in[j] == SLOT_NEVER) continue;
                    char base[16], row[32], val[16];
                    snprintf(base, sizeof base, "%s%d", kv ? "vc" : "kc", i);
                    snprintf(row, sizeof row, "(long long)r.slots%d", i);
                    value_name(&E, kv ? gn->b : gn->a, j, val, sizeof val);
                    queue_store(&E, j, kv ? gn->b : gn->a, r, ct, base, row, E.r[r].size, val);
                }
            continue;
        }
        if (gn->r == ROLE_BINARY) put_operand_reads(&E, i);
        if (gn->r == ROLE_ROPE) put_rope_column(&E, i);
        ks_buf_printf(&E.apply, "        /* %s: columns [%lld, %lld) */\n", kir_op_table[nd->op].name, (long long)gn->base,
                      (long long)(gn->base + gn->size));
        for (int j = 0; j < 2; j++)
            if (node_in(&E, i, j) != SLOT_NEVER) put_node_slot(&E, i, j);
    }

    put_pair_stores(&E);
    for (int j = 0; j < 2; j++) put_stores(&E, j);

    /* the column step: the ranges' tests and elements, then what the nodes added */
    ks_buf ranges = {0};
    for (int r = 0; r < E.nr; r++) {
        const crange *cr = &E.r[r];
        for (int j = 0; j < 2; j++) {
            if (!cr->flag[j] && !cr->elem[j]) continue;
            ks_buf test = {0};
            ks_buf_puts(&test, "(unsigned)(");
            put_minus(&test, j, cr->base);
            ks_buf_printf(&test, ") < %lluu", (unsigned long long)cr->size);
            if (cr->flag[j]) {
                ks_buf_printf(&E.col, " bool ok%d_%d;", r, j);
                ks_buf_printf(&ranges, "        c.ok%d_%d = %s;\n", r, j, ks_buf_cstr(&test));
            }
            if (cr->elem[j]) {
                ks_buf_printf(&E.col, " int e%d_%d;", r, j);
                ks_buf_printf(&ranges, "        c.e%d_%d = ", r, j);
                if (cr->in[j] == SLOT_SOME && cr->flag[j]) ks_buf_printf(&ranges, "c.ok%d_%d ? ", r, j);
                else if (cr->in[j] == SLOT_SOME) ks_buf_printf(&ranges, "%s ? ", ks_buf_cstr(&test));
                put_minus(&ranges, j, cr->base);
                ks_buf_puts(&ranges, cr->in[j] == SLOT_SOME ? " : 0;\n" : ";\n");
            }
            ks_buf_free(&test);
        }
    }
    ks_buf_printf(b,
                  "    /* what the pair's columns decide, worked out once for all the rows a thread hands over */\n"
                  "    struct col {%s };\n"
                  "    __device__ __forceinline__ void column(int n0, int n1, col &c) const\n"
                  "    {\n"
                  "        (void)n0, (void)n1, (void)c;\n%s%s"
                  "    }\n"
                  "    /* what the epilogue reads for a row besides the sums */\n"
                  "    struct in {%s };\n"
                  "    __device__ __forceinline__ void fetch(long long t, const col &c, in &r) const\n"
                  "    {\n"
                  "        (void)t, (void)c, (void)r;\n%s"
                  "    }\n"
                  "    /* the group's nodes on the row's pair (v1: none for the single last column) */\n"
                  "    __device__ __forceinline__ void apply(long long t, float v0, float v1, const col &c, const in &r) "
                  "const\n"
                  "    {\n"
                  "        (void)t, (void)v0, (void)v1, (void)c, (void)r;\n%s"
                  "    }\n"
                  "    __device__ KCU_NOINLINE void run(long long t, int n0, float v0, int n1, float v1) const\n"
                  "    {\n"
                  "        col c;\n"
                  "        column(n0, n1, c);\n"
                  "        in r;\n"
                  "        fetch(t, c, r);\n"
                  "        apply(t, v0, v1, c, r);\n"
                  "    }\n"
                  "    __device__ __forceinline__ void two(long long t, int n0, float v0, int n1, float v1) const\n"
                  "    {\n        run(t, n0, v0, n1, v1);\n    }\n"
                  "    __device__ __forceinline__ void one(long long t, int n0, float v0) const\n"
                  "    {\n        run(t, n0, v0, -1, 0.0f);\n    }\n};\n",
                  ks_buf_cstr(&E.col), ks_buf_cstr(&ranges), ks_buf_cstr(&E.column), ks_buf_cstr(&E.in),
                  ks_buf_cstr(&E.fetch), ks_buf_cstr(&E.apply));
    ks_buf_free(&ranges);
    ks_buf_free(&E.col);
    ks_buf_free(&E.column);
    ks_buf_free(&E.in);
    ks_buf_free(&E.fetch);
    ks_buf_free(&E.apply);
}

/* A kernel parameter that the epilogue functor holds as a field of the
 * same name: its declaration (decl ends with the name), what the runtime
 * passes, the field, and the name in the functor's initializer. */
static void add_field(kcu_gen *x, krt_cuda_kernel *k, krt_cuda_arg_kind kind, int64_t index, const char *decl,
                      const char *name, ks_buf *fields, ks_buf *inits)
{
    kcu_add_param(x, k, kind, index, decl);
    ks_buf_printf(fields, "    %s;\n", decl);
    ks_buf_printf(inits, "%s%s", inits->len ? ", " : "", name);
}

/* ---- the sm_90a variant: kcu_gemm90 ------------------------------------------------------ */
enum { G90_MAX = KRT_CUDA_MAX_VARIANTS }; /* variants a kernel at most */

/* The gemm90 kernels of a group: one per tile width the rule picks for
 * some step above the threshold; the variants, in ascending ranges of
 * steps, each running one of them (a width may serve several ranges). */
typedef struct g90_plan {
    int n;                                  /* variants (0: none) */
    kcu_g90_tiles tiles[KCU_G90_WIDTHS];    /* each width's tiles (bn 0: the width is not used) */
    int width[G90_MAX];                     /* variant i runs width kcu_g90_widths[width[i]] */
    int64_t above[G90_MAX];                 /* for steps of more than above[i] tokens */
    kir_val xv;                             /* the value the matmul reads through the x map: the norm's, or its operand */
    kir_dtype codes;                        /* KIR_DTYPE_COUNT: halves; else the one-byte codes of both operands
                                               (f8e4m3, i8: g90_codes), x's written by a pre-pass kernel */
    int deq;                                /* 1: the weight's codes dequantized to x's half type by a pre-pass
                                               kernel, the matmul on halves (w4a16, w8a16: g90_deq) */
} g90_plan;

/* The prelude's type of one-byte codes t (kcu_gemm90's operands) */
static const char *code_type(kir_dtype t) { return t == KIR_I8 ? "kcu_kv_i8" : "kcu_kv_e4m3"; }

/* The codes group G's quantized matmul multiplies on kcu_gemm90, or KIR_DTYPE_COUNT: fp8 and w8a8 (x quantized a
 * token at a time, so both operands are e4m3 or i8 codes: wgmma k32, sums scaled by x's row scale and
 * the weight row's), with a scale a weight row, half x (fast precision: exact precision keeps f32
 * sums of the values in the interpreter's order), rows of 16-byte chunks. */
/* Whether group G's quantized matmul runs kcu_gemm90 on its weight dequantized to x's half type by a
 * pre-pass (w4a16, w8a16: weight-only codes of any group, x half). The pre-pass writes N K halves each
 * prefill step (Llama-3-8B: 16 GB for its 32 layers, ~5 ms at the H200's copy rate) where kcu_matmul_q's
 * tiles dequantize every weight as each token tile loads it (mma.sync: 88 ms at 512 tokens on an H100
 * against bf16's 12 on kcu_gemm90, bench/RESULTS.md #13 step 2): vLLM's AWQ does the same from 256 tokens. */
static int g90_deq(const group *G)
{
    const kir_graph *g = G->x->g;
    const kir_val mm = G->n[G->mm].v;
    const kir_node *mn = &g->nodes[mm];
    if (mn->nin <= 2 || G->K % 8 || !kcu_is_half(g->nodes[mn->in[0]].dtype)) return 0;
    const kir_word q = kir_attr_word(g, mm, KIR_A_MATMUL_QUANT);
    return (q == KIR_QUANT_W4A16 || q == KIR_QUANT_W8A16) && !kcu_qmatmul_supported(g, mm);
}

static kir_dtype g90_codes(const group *G)
{
    const kir_graph *g = G->x->g;
    const kir_val mm = G->n[G->mm].v;
    const kir_node *mn = &g->nodes[mm];
    if (mn->nin <= 2 || G->pro >= 0 || G->K % 16 || !kcu_is_half(g->nodes[mn->in[0]].dtype)) return KIR_DTYPE_COUNT;
    const kir_word q = kir_attr_word(g, mm, KIR_A_MATMUL_QUANT);
    kir_quant_layout L;
    kir_quant_layout_of(g, mm, &L);
    if (L.block_rows != 1 || L.group != L.cols) return KIR_DTYPE_COUNT;
    if ((q == KIR_QUANT_FP8 && L.codes == KIR_F8E4M3) || (q == KIR_QUANT_W8A8 && L.codes == KIR_I8)) return L.codes;
    return KIR_DTYPE_COUNT;
}


/* Whether the group's decode kernel is kcu_matmul_tc: x, the fused norm's values (if any) and the
 * weights of one half dtype (kcu_use_tc). */
static int group_tc(const group *G)
{
    const kir_graph *g = G->x->g;
    const kir_node *mn = &g->nodes[G->n[G->mm].v];
    const kir_node *pn = G->pro >= 0 ? &g->nodes[G->n[G->pro].v] : NULL;
    const kir_dtype xt = g->nodes[pn ? pn->in[0] : mn->in[0]].dtype;
    return kcu_use_tc(G->x, xt, pn ? pn->dtype : xt, g->nodes[mn->in[1]].dtype, G->K);
}

/* Which gemm90 kernels group G gets: half x and weights of one dtype, rows
 * of 16-byte chunks, pairs that fit boxes (kcu_g90_plan_tiles); for each
 * count of token tiles from the threshold up to G90_SCAN, the rule's width
 * (kcu_g90_pick_bn). A wider width than the current one starts a new
 * variant; a narrower one only where the rule's cost drops by G90_BACK (its
 * efficiencies are shape-blind estimates: only a clear loss of waves is
 * taken back); past G90_SCAN, the rule's pick for long steps, where waves
 * are many and the widest tile the most efficient. At most G90_MAX.
 * Why widths may narrow again: at 1024 tokens Llama-3-8B's q,k,v ran 2
 * waves of 256-wide tiles at 579 TFLOP/s, the rule's pick from 513 to 768
 * tokens (one wave) kept by the earlier ascending-only rule, where 192
 * (2 waves, fuller) ran at 697 (H200, 2026-12-04, bench/RESULTS.md #10
 * step 11). */
enum { G90_SCAN = 64, G90_LONG = 1024, G90_MIN_BOX = 32 }; /* token tiles: 8192 tokens; a long step's; rows */
/* Steps above which a dequantized weight's gemm90 runs (g90_deq; KILN_CUDA_GEMM90_ABOVE sets it too): where the
 * pre-pass's bytes cost less than the tiles' dequantization, estimated from the figures there (not measured) */
enum { G90_DEQ_ABOVE = 64 };
#define G90_BACK 0.15
static void plan_g90(const group *G, g90_plan *P)
{
    const kcu_gen *x = G->x;
    const kir_graph *g = x->g;
    memset(P, 0, sizeof *P);
    P->codes = KIR_DTYPE_COUNT;
    if (!x->opt.gemm90) return;
    const kir_node *mn = &g->nodes[G->n[G->mm].v];
    kir_dtype wt = g->nodes[mn->in[1]].dtype;
    P->xv = mn->in[0];
    P->codes = g90_codes(G);
    const int codes = P->codes != KIR_DTYPE_COUNT;
    P->deq = !codes && g90_deq(G);
    if (mn->nin > 2 && !codes && !P->deq) return; /* other quantized matmuls: kcu_matmul_q's tensor-core tiles */
    if (P->deq) wt = g->nodes[P->xv].dtype;       /* the copy's */
    if (!codes && ((wt != KIR_BF16 && wt != KIR_F16) || g->nodes[P->xv].dtype != wt || G->K % 8)) return;
    if (G->N < 2) return;
    int64_t above = x->opt.gemm90_above > 0 ? x->opt.gemm90_above : P->deq ? G90_DEQ_ABOVE : kcu_decode_t(x);
    if (above < kcu_decode_t(x)) above = kcu_decode_t(x); /* the decode kernel's steps stay its own */
    kcu_g90_tiles all[KCU_G90_WIDTHS];
    int nt[KCU_G90_WIDTHS] = {0};
    /* widths whose boxes are under G90_MIN_BOX rows are left out (where another fits): many small TMA
     * boxes a stage load slowly, which the rule does not model (q,k,v at 224 in 14 boxes of 16 rows:
     * 640 TFLOP/s at 2048 tokens where 192 in 6 boxes of 32 ran 708, H200, #10 step 11) */
    int any_big = 0;
    for (int i = 0; i < KCU_G90_WIDTHS; i++)
        if (kcu_g90_plan_tiles(G->partner, G->N, kcu_g90_widths[i], &all[i]) == 0) {
            nt[i] = all[i].nt;
            any_big |= all[i].bn / all[i].nbox >= G90_MIN_BOX;
        }
    for (int i = 0; i < KCU_G90_WIDTHS && any_big; i++)
        if (nt[i] && all[i].bn / all[i].nbox < G90_MIN_BOX) {
            free(all[i].table);
            all[i].table = NULL;
            nt[i] = 0;
        }
    const int64_t m0 = (above + 1 + 127) / 128;
    int cur = -1;
    for (int64_t m = m0; m <= G90_SCAN + 1; m++) {
        const int last = m == G90_SCAN + 1; /* the long steps' variant, from G90_SCAN token tiles on */
        int64_t T = m == m0 ? above + 1 : (m - 1) * 128 + 1; /* the first step of m token tiles */
        int bn = kcu_g90_pick_bn(last ? (int64_t)G90_LONG * 128 : T, nt);
        if (bn == 0) break;
        int i = 0;
        while (kcu_g90_widths[i] != bn) i++;
        if (i == cur) continue;
        if (!last && cur >= 0 && i < cur &&
            kcu_g90_cost(T, bn, nt[i]) > (1.0 - G90_BACK) * kcu_g90_cost(T, kcu_g90_widths[cur], nt[cur]))
            continue;
        if (P->n == G90_MAX - (last ? 0 : 1)) continue; /* the last slot is the long steps' */
        if (!P->tiles[i].bn) {
            P->tiles[i] = all[i];
            all[i].table = NULL; /* owned by P now */
        }
        P->width[P->n] = i;
        P->above[P->n++] = T - 1;
        cur = i;
    }
    for (int i = 0; i < KCU_G90_WIDTHS; i++)
        if (nt[i]) free(all[i].table);
}

static void free_g90(g90_plan *P)
{
    for (int i = 0; i < KCU_G90_WIDTHS; i++) free(P->tiles[i].table);
}

/* Blocks a cluster of tile set t's gemm90 kernel: 2 when asked (kcu_options.g90_cluster) and its
 * boxes split into halves of whole swizzle atoms (each block of the pair loads half of every weight
 * box into both: the pair's token tiles share their column tile), else 1. */
static int g90_cluster(const kcu_gen *x, const kcu_g90_tiles *t)
{
    return x->opt.g90_cluster && (t->bn / t->nbox) % 16 == 0 ? 2 : 1;
}

/* The gemm90 kernels' text, appended to the body: each a kernel of
 * KCU_G90_THREADS threads with the x and w tensor maps, then the epilogue's
 * fields (g90_params: their declarations), running kcu_gemm90 with the
 * group's epilogue functor; tile tables where the pairs are not
 * neighbours. Compiled only where KCU_GEMM90_KERNELS (sm_90a, the CPU
 * emulator). */
static void put_g90(group *G, const g90_plan *P, const char *g90_params, const char *inits)
{
    ks_buf *b = &G->x->body;
    const kir_graph *g = G->x->g;
    const char *xt = kcu_elem_type(g->nodes[P->xv].dtype);
    ks_buf_puts(b, "\n#if KCU_GEMM90_KERNELS\n");
    const int codes = P->codes != KIR_DTYPE_COUNT;
    const char *ot = codes ? code_type(P->codes) : xt; /* the operands' type */
    char pro[96];
    snprintf(pro, sizeof pro, codes ? "kcu_g90_xq<%s>{g90_xs, g90_ws}" : "kcu_g90_none()",
             codes ? kcu_elem_type(g->nodes[g->nodes[G->n[G->mm].v].in[2]].dtype) : "");
    if (codes)
        ks_buf_printf(b,
                      "/* x's rows as %s codes and their scales for the gemm90 kernels below: a warp a row */\n"
                      "extern \"C\" __global__ void __launch_bounds__(256) " NAME_MARK
                      "_xq(int T, const %s *__restrict__ x, unsigned char *__restrict__ codes, float *__restrict__ xs)\n"
                      "{\n"
                      "    KCU_PDL_ENTER();\n"
                      "    kcu_g90_quantize_x<%s, %lld>(T, x, reinterpret_cast<%s *>(codes), xs);\n"
                      "}\n",
                      kir_dtype_name(P->codes), xt, ot, (long long)G->K, ot);
    if (P->deq) {
        const kir_val mm = G->n[G->mm].v;
        const kir_node *mn = &g->nodes[mm];
        kir_quant_layout L;
        kir_quant_layout_of(g, mm, &L);
        const int asym = mn->nin > 3 && mn->in[3] != KIR_NONE;
        const char *st = kcu_elem_type(g->nodes[mn->in[2]].dtype);
        ks_buf_printf(b,
                      "/* the weight's %s codes dequantized to %s for the gemm90 kernels below: 8 codes a thread */\n"
                      "extern \"C\" __global__ void __launch_bounds__(256) " NAME_MARK
                      "_deq(const unsigned char *__restrict__ w, const %s *__restrict__ qs%s, %s *__restrict__ out)\n"
                      "{\n"
                      "    KCU_PDL_ENTER(); /* the scratch it writes: the previous gemm90 read it */\n"
                      "    kcu_dequantize_weight<%lld>(kcu_qsrc<%d, %s, %s, %lld, %lld, %s, %s, %s>{w, qs, %s, 0, 0}, out);\n"
                      "}\n",
                      kir_dtype_name(L.codes), xt, st, asym ? ", const unsigned char *__restrict__ qz" : "", xt,
                      (long long)L.rows, L.codes == KIR_U4 ? 4 : 8, L.codes == KIR_I8 ? "true" : "false",
                      asym ? "true" : "false", (long long)L.cols, (long long)L.group, st, xt,
                      L.codes == KIR_F8E4M3 ? "true" : "false", asym ? "qz" : "nullptr");
    }
    for (int i = 0; i < KCU_G90_WIDTHS; i++) {
        const kcu_g90_tiles *t = &P->tiles[i];
        if (!t->bn) continue;
        int64_t first = -1; /* the first step range it runs */
        for (int j = 0; j < P->n && first < 0; j++)
            if (P->width[j] == i) first = P->above[j];
        char tiles[64];
        if (t->plain) {
            snprintf(tiles, sizeof tiles, "kcu_g90_plain<%d>", t->bn);
        } else {
            snprintf(tiles, sizeof tiles, NAME_MARK "_tiles%d", t->bn);
            ks_buf_printf(b, "/* column tiles of %d: split flag, then the first weight row of each box of %d */\n"
                             "__device__ const int " NAME_MARK "_tile%d[%d] = {",
                          t->bn, t->bn / t->nbox, t->bn, t->nt * (t->nbox + 1));
            for (int j = 0; j < t->nt * (t->nbox + 1); j++)
                ks_buf_printf(b, "%s%d,", j % (t->nbox + 1) ? " " : "\n    ", t->table[j]);
            ks_buf_printf(b, "\n};\n"
                             "struct " NAME_MARK "_tiles%d {\n"
                             "    enum { NBOX = %d, PLAIN = 0 };\n"
                             "    static __device__ __forceinline__ int box(int y, int i) { return " NAME_MARK
                             "_tile%d[y * %d + 1 + i]; }\n"
                             "    static __device__ __forceinline__ int split(int y) { return " NAME_MARK
                             "_tile%d[y * %d]; }\n"
                             "};\n",
                          t->bn, t->nbox, t->bn, t->nbox + 1, t->bn, t->nbox + 1);
        }
        const int cluster = g90_cluster(G->x, t);
        ks_buf_printf(b,
                      "/* the same on sm_90a for steps of more than %lld tokens: wgmma fed by TMA, tiles of 128 x %d%s */\n"
                      "extern \"C\" __global__ void __launch_bounds__(KCU_G90_THREADS, 1) %s" NAME_MARK "_g90_%d(%s)\n"
                      "{\n"
                      "    KCU_PDL_ENTER();\n"
                      "    const " NAME_MARK "_epi epi = {%s};\n"
                      "    kcu_gemm90<%s, %lld, %lld, %d, %d, %s, %d>(T, ta, tb, %s, epi);\n"
                      "}\n",
                      (long long)first, t->bn, cluster > 1 ? ", in clusters of two sharing the weight tile" : "",
                      cluster > 1 ? "KCU_G90_CLUSTER2 " : "", t->bn, g90_params, inits, ot,
                      (long long)G->K, (long long)G->N, t->bn, kcu_g90_stages(t->bn), tiles, cluster, pro);
    }
    ks_buf_puts(b, "#endif\n");
}

/* The variants of kernel ki (named): [the norm's own kernel, or x's codes' pre-pass,] the gemm90 kernel. */
static int add_g90_variants(group *G, const g90_plan *P, size_t ki, const krt_cuda_arg *fargs, int n_fargs)
{
    kcu_gen *x = G->x;
    const kir_graph *g = x->g;
    krt_cuda_launch norm = {0};
    if (G->pro >= 0) {
        /* the norm writes its value (half, at its planned place) for the x map to read */
        int before = x->meta->n_kernels;
        if (kcu_emit_norm(x, G->n[G->pro].v) != 0) return -1;
        KS_ASSERT(x->meta->n_kernels == before + 1);
        const krt_cuda_kernel *nk = &x->meta->kernels[--x->meta->n_kernels];
        norm.name = nk->name;
        norm.block = nk->block;
        memcpy(norm.grid, nk->grid, sizeof norm.grid);
        norm.n_args = nk->n_args;
        memcpy(norm.args, nk->args, sizeof norm.args);
    }
    krt_cuda_kernel *k = &x->meta->kernels[ki];
    k->variants = ks_arena_alloc(&x->meta->arena, sizeof *k->variants * (size_t)P->n);
    k->n_variants = P->n;
    const kir_node *mn = &g->nodes[G->n[G->mm].v];
    const kir_val wv = mn->in[1], xr = x->root[P->xv];
    krt_cuda_launch xq = {0}; /* x's codes and scales (P->codes): a warp a row, 8 a block */
    const int codes = P->codes != KIR_DTYPE_COUNT;
    if (codes) {
        xq.name = ks_arena_printf(&x->meta->arena, "%s_xq", x->meta->kernels[ki].name);
        xq.block = 256;
        const int64_t grid[3][4] = {{1, 0, 8, 0}, {0, 1, 1, 0}, {0, 1, 1, 0}};
        memcpy(xq.grid, grid, sizeof grid);
        xq.args[xq.n_args++] = (krt_cuda_arg){KRT_CUDA_ARG_T, 0, 0};
        xq.args[xq.n_args++] = (krt_cuda_arg){KRT_CUDA_ARG_VALUE, xr, 0};
        xq.args[xq.n_args++] = (krt_cuda_arg){KRT_CUDA_ARG_XCODES, xr, 0};
        xq.args[xq.n_args++] = (krt_cuda_arg){KRT_CUDA_ARG_XSCALES, xr, 0};
    }
    krt_cuda_launch deq = {0}; /* the weight dequantized (P->deq): 8 codes a thread, 256 a block */
    if (P->deq) {
        deq.name = ks_arena_printf(&x->meta->arena, "%s_deq", x->meta->kernels[ki].name);
        deq.block = 256;
        const int64_t grid[3][4] = {{0, G->N * (G->K / 8), 256, 0}, {0, 1, 1, 0}, {0, 1, 1, 0}};
        memcpy(deq.grid, grid, sizeof grid);
        deq.args[deq.n_args++] = (krt_cuda_arg){KRT_CUDA_ARG_VALUE, x->root[wv], 0};
        for (int q = 2; q < mn->nin && q < 4; q++)
            if (mn->in[q] != KIR_NONE) deq.args[deq.n_args++] = (krt_cuda_arg){KRT_CUDA_ARG_VALUE, x->root[mn->in[q]], 0};
        deq.args[deq.n_args++] = (krt_cuda_arg){KRT_CUDA_ARG_WDEQ, x->root[wv], 0};
    }
    for (int i = 0; i < P->n; i++) {
        const kcu_g90_tiles *t = &P->tiles[P->width[i]];
        krt_cuda_variant *v = &k->variants[i];
        memset(v, 0, sizeof *v);
        v->arch = KCU_GEMM90_ARCH;
        v->above = P->above[i];
        if (G->pro >= 0) v->launches[v->n_launches++] = norm;
        if (codes) v->launches[v->n_launches++] = xq;
        if (P->deq) v->launches[v->n_launches++] = deq;
        krt_cuda_launch *l = &v->launches[v->n_launches++];
        l->name = ks_arena_printf(&x->meta->arena, "%s_g90_%d", k->name, t->bn);
        l->block = 384; /* the prelude's KCU_G90_THREADS */
        l->smem = kcu_g90_smem_bytes(t->bn, kcu_g90_stages(t->bn));
        /* ceil(T / 128) token tiles (the prelude's KCU_G90_BM) by the column tiles; in clusters of two,
           (2, ceil(T / 256), column tiles), each block loading half of each weight box (kcu_g90_block_at) */
        const int cluster = g90_cluster(x, t);
        int64_t plain[3][4] = {{1, 0, 128, 0}, {0, t->nt, 1, 0}, {0, 1, 1, 0}};
        int64_t pairs[3][4] = {{0, 2, 1, 0}, {1, 0, 256, 0}, {0, t->nt, 1, 0}};
        memcpy(l->grid, cluster > 1 ? pairs : plain, sizeof plain);
        l->args[l->n_args++] = (krt_cuda_arg){KRT_CUDA_ARG_T, 0, 0};
        l->args[l->n_args++] = (krt_cuda_arg){codes ? KRT_CUDA_ARG_TMAP_XCODES : KRT_CUDA_ARG_TMAP, xr, 128};
        l->args[l->n_args++] =
            (krt_cuda_arg){P->deq ? KRT_CUDA_ARG_TMAP_WDEQ : KRT_CUDA_ARG_TMAP, x->root[wv], t->bn / t->nbox / cluster};
        if (codes) { /* the sums' scales: x's rows' (g90_xs), the weight rows' (g90_ws) */
            l->args[l->n_args++] = (krt_cuda_arg){KRT_CUDA_ARG_XSCALES, xr, 0};
            l->args[l->n_args++] = (krt_cuda_arg){KRT_CUDA_ARG_VALUE, x->root[mn->in[2]], 0};
        }
        KS_ASSERT(l->n_args + n_fargs <= KRT_CUDA_MAX_ARGS);
        for (int a = 0; a < n_fargs; a++) l->args[l->n_args++] = fargs[a];
    }
    return 0;
}

/* The variants' tiles of a new kernel k, one line (kcu_options.choices). */
static void put_choices(const group *G, const g90_plan *P, const krt_cuda_kernel *k)
{
    ks_buf *b = G->x->opt.choices;
    /* the pre-passes before the gemm90 kernel, and the operands' wgmma */
    const char *pre = G->pro >= 0 ? (P->deq ? "the norm's kernel, the weight dequantized, then " : "the norm's kernel, then ")
                      : P->deq ? "the weight dequantized, then "
                      : P->codes != KIR_DTYPE_COUNT ? "x's codes, then "
                                                    : "";
    const char *op = P->codes == KIR_DTYPE_COUNT ? "" : P->codes == KIR_I8 ? " s8" : " e4m3";
    ks_buf_printf(b, "%s: %%%u matmul, %lld -> %lld:", k->name, k->node, (long long)G->K, (long long)G->N);
    for (int i = 0; i < P->n; i++) {
        const kcu_g90_tiles *t = &P->tiles[P->width[i]];
        const int stages = kcu_g90_stages(t->bn);
        ks_buf_printf(b, "%s %s above %lld tokens: %swgmma%s tiles 128 x %d (%d column tiles of %d box%s, %d stages, %d "
                         "bytes of shared memory%s)",
                      i ? ";" : "", KCU_GEMM90_ARCH, (long long)P->above[i], pre, op, t->bn, t->nt, t->nbox,
                      t->nbox > 1 ? "es" : "", stages, kcu_g90_smem_bytes(t->bn, stages),
                      g90_cluster(G->x, t) > 1 ? ", clusters of two blocks sharing the weight tile" : "");
    }
    ks_buf_puts(b, "\n");
}

/* ---- the group ------------------------------------------------------------------------- */
int kcu_emit_group(kcu_gen *x, const kir_val *nodes, int count, const uint8_t *read_outside)
{
    const kir_graph *g = x->g;
    if (count > GROUP_MAX || count < 1) return 0;
    group G = {.x = x, .count = count, .mm = -1, .pro = -1};
    for (int i = 0; i < count; i++) {
        G.n[i] = (gnode){.v = nodes[i], .a = -1, .b = -1, .root = i};
        if (g->nodes[nodes[i]].op == KIR_OP_MATMUL) {
            if (G.mm >= 0) return 0;
            G.mm = i;
        }
    }
    if (G.mm < 0) return 0;
    const kir_node *mn = &g->nodes[nodes[G.mm]], *wn = &g->nodes[mn->in[1]];
    G.N = wn->dims[0], G.K = wn->dims[1];
    if (G.K >= INT32_MAX / 16 || G.N >= INT32_MAX / 16) return 0;
    /* before the matmul: only the norm it reads, read by nothing else */
    for (int i = 0; i < G.mm; i++) {
        const kir_node *n = &g->nodes[nodes[i]];
        if (i != G.mm - 1 || mn->in[0] != nodes[i] || (n->op != KIR_OP_RMS_NORM && n->op != KIR_OP_LAYER_NORM) ||
            read_outside[nodes[i]] || kcu_last_dim(n) != G.K)
            return 0;
        G.pro = i;
        G.n[i].r = ROLE_PROLOGUE;
    }
    G.n[G.mm].r = ROLE_MATMUL, G.n[G.mm].base = 0, G.n[G.mm].size = G.N;
    G.partner = ks_xmalloc(sizeof *G.partner * (size_t)G.N);
    for (int64_t c = 0; c < G.N; c++) G.partner[c] = -1;
    int ok = 1;
    for (int i = G.mm + 1; i < count && ok; i++) ok = classify(&G, i) == 0;
    /* the norm's other users inside the group are caught by classify; values read outside are stored */
    for (int i = 0; i < count && ok; i++) {
        if (G.n[i].r == ROLE_PROLOGUE || !read_outside[nodes[i]]) continue;
        int r = G.n[i].root;
        /* a kv_write's value is its k: store k's root */
        G.n[r].store = 1;
    }
    if (ok) ok = order_pairs(&G) == 0;
    /* a node that needs a partner must find it in every pair of its columns */
    for (int i = G.mm + 1; i < count && ok; i++) {
        const gnode *gn = &G.n[i];
        if (gn->r == ROLE_BINARY && gn->a >= 0 && gn->b >= 0 && G.n[gn->a].base != G.n[gn->b].base)
            for (int64_t e = 0; e < gn->size && ok; e++) ok = G.partner[gn->base + e] == G.n[gn->b].base + e;
    }
    const int quant = mn->nin > 2; /* kcu_matmul_q: a norm prologue for w4a16 and w8a16 only
                                      (passes/fuse_norm_prologue.c); gemm90 for fp8 and w8a8 (g90_codes) */
    g90_plan P = {0};
    if (ok) plan_g90(&G, &P);
    if (!ok) {
        free(G.partner);
        return 0;
    }

    /* ---- the kernel: matmul grid, parameters, the functor, the body ---- */
    const kir_node *pn = G.pro >= 0 ? &g->nodes[nodes[G.pro]] : NULL;
    const kcu_gemv_plan plan =
        !quant && group_tc(&G) ? kcu_plan_gemv_tc(G.N, G.pro >= 0, &x->opt) : kcu_plan_gemv(G.N);
    krt_cuda_kernel *k = kcu_kernel_new(x, nodes[G.mm], MM_THREADS);
    kcu_matmul_grids(k, G.N, &plan);
    k->smem = plan.ring;
    kcu_param_in(x, k, pn ? pn->in[0] : mn->in[0], "x");
    kcu_param_in(x, k, mn->in[1], "w");
    if (quant) kcu_qmatmul_params(x, k, nodes[G.mm]);
    int has_g = pn && pn->nin > 1 && pn->in[1] != KIR_NONE, has_b = pn && pn->nin > 2 && pn->in[2] != KIR_NONE;
    if (has_g) kcu_param_in(x, k, pn->in[1], "g");
    if (has_b) kcu_param_in(x, k, pn->in[2], "gb");
    ks_buf fields = {0}, inits = {0}, tables = {0};
    const int first_field = k->n_args; /* the epilogue's parameters follow: the gemm90 kernels take them too */
    for (int i = G.mm; i < count; i++) {
        gnode *gn = &G.n[i];
        const kir_node *nd = &g->nodes[gn->v];
        char name[32], decl[96];
        if (gn->store && gn->root == i && gn->r != ROLE_KV_WRITE) {
            snprintf(name, sizeof name, "out%d", i);
            snprintf(decl, sizeof decl, "%s *__restrict__ %s", kcu_elem_type(nd->dtype), name);
            add_field(x, k, KRT_CUDA_ARG_VALUE, gn->v, decl, name, &fields, &inits);
        }
        if (gn->r == ROLE_VIEW || gn->r == ROLE_KV_WRITE) {
            if (gn->root != i) x->root[gn->v] = x->root[G.n[gn->root].v];
        }
        if (gn->r == ROLE_BINARY)
            for (int side = 0; side < 2; side++) {
                if ((side ? gn->b : gn->a) >= 0) continue;
                const kir_node *on = &g->nodes[nd->in[side]];
                snprintf(name, sizeof name, "in%d_%d", i, side);
                snprintf(decl, sizeof decl, "const %s *__restrict__ %s", kcu_elem_type(on->dtype), name);
                add_field(x, k, KRT_CUDA_ARG_VALUE, nd->in[side], decl, name, &fields, &inits);
            }
        if (gn->r == ROLE_ROPE) {
            snprintf(name, sizeof name, "pos%d", i);
            snprintf(decl, sizeof decl, "const int *__restrict__ %s", name);
            add_field(x, k, KRT_CUDA_ARG_VALUE, nd->in[1], decl, name, &fields, &inits);
            char suffix[16];
            snprintf(suffix, sizeof suffix, "%d", i);
            kcu_put_rope_table(x, &tables, gn->v, kir_attr_int(g, gn->v, KIR_A_ROPE_ROT_DIM), 1, suffix);
        }
        if (gn->r == ROLE_KV_WRITE) {
            int64_t layer = kir_attr_int(g, gn->v, KIR_A_ATTENTION_LAYER);
            if (layer < 0 || layer >= INT32_MAX) {
                ks_buf_free(&fields), ks_buf_free(&inits), ks_buf_free(&tables);
                free_g90(&P);
                free(G.partner);
                return kcu_node_error(x, gn->v, "layer %lld is out of range", (long long)layer);
            }
            static const char *const kinds[3] = {"kc", "vc", "slots"};
            static const krt_cuda_arg_kind akinds[3] = {KRT_CUDA_ARG_KV_K, KRT_CUDA_ARG_KV_V, KRT_CUDA_ARG_SLOTS};
            for (int j = 0; j < 3; j++) {
                snprintf(name, sizeof name, "%s%d", kinds[j], i);
                snprintf(decl, sizeof decl, "%s *__restrict__ %s",
                         j == 2 ? "const int" : kcu_elem_type(kir_kv_dtype(g, gn->v)), name);
                add_field(x, k, akinds[j], j == 2 ? 0 : layer, decl, name, &fields, &inits);
            }
        }
    }
    if (tables.len) ks_buf_put(&x->body, tables.data, tables.len);
    put_epilogue(&G, &fields); /* the last reader of the pairs */
    free(G.partner);

    ks_buf what = {0};
    ks_buf_puts(&what, "fused");
    for (int i = 0; i < count; i++) ks_buf_printf(&what, " %s", kir_op_table[g->nodes[nodes[i]].op].name);
    ks_buf_printf(&what, "; %s weights, fp32 sums", kir_dtype_name(wn->dtype));
    (plan.tc ? kcu_open_body_tc : kcu_open_body_min)(x, k, ks_buf_cstr(&what), plan.per_sm);
    ks_buf_free(&what);
    const char *wt = kcu_elem_type(wn->dtype);
    ks_buf call = {0}, pro = {0}; /* the matmul's arguments after its name and shape; its prologue */
    if (!pn) {
        ks_buf_puts(&pro, "kcu_pro_none()");
    } else {
        const char *gt = has_g ? kcu_elem_type(g->nodes[pn->in[1]].dtype) : "float";
        int rms = pn->op == KIR_OP_RMS_NORM;
        /* the norm's values are of its dtype: a half one rounds them as the matmul takes them */
        ks_buf ot = {0};
        if (pn->dtype != KIR_F32) ks_buf_printf(&ot, ", %s", kcu_elem_type(pn->dtype));
        ks_buf_printf(&pro, "kcu_pro_%s<%lld, %s%s>{%s, %s", rms ? "rms" : "ln", (long long)G.K, gt, ks_buf_cstr(&ot),
                      has_g ? "g" : "nullptr", rms ? "" : (has_b ? "gb, " : "nullptr, "));
        ks_buf_free(&ot);
        kcu_put_double(&pro, kir_attr_float(g, nodes[G.pro], KIR_A_RMS_NORM_EPS));
        ks_buf_puts(&pro, "}");
    }
    ks_buf_printf(&call, "(T, x, w, %s, epi);\n}\n", ks_buf_cstr(&pro));
    for (int large = 0; large < 2; large++) {
        if (large) kcu_open_large(x, k, kcu_decode_t(x));
        ks_buf_printf(&x->body, "    const " NAME_MARK "_epi epi = {%s};\n", ks_buf_cstr(&inits));
        if (quant) {
            kcu_put_qmatmul(x, nodes[G.mm], large ? 2 : plan.rows, large, pn ? ks_buf_cstr(&pro) : NULL, "epi");
            continue;
        }
        ks_buf_printf(&x->body, "    kcu_matmul_%s<%s, %lld, %lld", large ? "large" : plan.tc ? "tc" : "small", wt,
                      (long long)G.K, (long long)G.N);
        if (!large) ks_buf_printf(&x->body, ", %d", plan.rows);
        if (!large && plan.tc) ks_buf_printf(&x->body, ", %d", plan.ring);
        if (!large && plan.tc && x->opt.tc_xahead > 0) ks_buf_printf(&x->body, ", %d", x->opt.tc_xahead);
        ks_buf_printf(&x->body, ">%s", ks_buf_cstr(&call));
    }
    ks_buf_free(&call);
    ks_buf_free(&pro);
    if (P.n) {
        /* the gemm90 kernels' parameters: T, the maps, the epilogue's fields ("    decl;\n" each) */
        ks_buf params = {0};
        ks_buf_puts(&params, "int T, const __grid_constant__ kcu_tmap ta, const __grid_constant__ kcu_tmap tb");
        if (P.codes != KIR_DTYPE_COUNT)
            ks_buf_printf(&params, ", const float *__restrict__ g90_xs, const %s *__restrict__ g90_ws",
                          kcu_elem_type(g->nodes[mn->in[2]].dtype));
        for (const char *f = ks_buf_cstr(&fields); *f;) {
            const char *end = strchr(f, '\n');
            KS_ASSERT(end && end - f > 5 && end[-1] == ';');
            ks_buf_printf(&params, ", %.*s", (int)(end - f - 5), f + 4);
            f = end + 1;
        }
        put_g90(&G, &P, ks_buf_cstr(&params), ks_buf_cstr(&inits));
        ks_buf_free(&params);
    }
    ks_buf_free(&fields);
    ks_buf_free(&inits);
    ks_buf_free(&tables);
    size_t ki = (size_t)(k - x->meta->kernels);
    krt_cuda_arg fargs[KRT_CUDA_MAX_ARGS];
    int n_fargs = k->n_args - first_field;
    memcpy(fargs, k->args + first_field, sizeof *fargs * (size_t)n_fargs);
    const size_t bodies = x->n_bodies;
    kcu_kernel_end(x, k, "_fused");
    int rc = P.n ? add_g90_variants(&G, &P, ki, fargs, n_fargs) : 0;
    if (rc == 0 && P.n && x->opt.choices && x->n_bodies > bodies) put_choices(&G, &P, &x->meta->kernels[ki]);
    free_g90(&P);
    return rc ? -1 : 1;
}
