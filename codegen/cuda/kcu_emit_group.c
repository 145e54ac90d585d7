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
 * registers and stores what leaves the group.
 *
 * Dtypes (fast precision, passes/lower_precision.c): a group value of a half
 * dtype is rounded to it in registers as soon as it is computed (kcu_round),
 * so that the group's later nodes, its store and its KV rows see what the
 * interpreter sees; f32 values stay as computed. A norm prologue of a half
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
#define KIR_FORMULA(OP, TYPE, what, expr, half) case KIR_OP_##OP: /* the unary ops of ir/ops.def's formulas */
#include "ir/ops.def"
        if (a < 0) return -1;
        gn->r = ROLE_UNARY, gn->base = G->n[a].base;
        return 0;
    case KIR_OP_ADD:
    case KIR_OP_SUB:
    case KIR_OP_MUL: {
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
        ks_buf_printf(b, "%s * ", in);
        kcu_put_float(b, (float)kir_attr_float(g, v, KIR_A_SCALE_VALUE));
        return;
    default: {
        /* ir/ops.def's formula, as the interpreter computes it */
        int in_double = 0;
        ks_buf operand = {0}, expr = {0};
        const int half = (int)kir_attr_int(g, v, KIR_A_ANY_HALF_MATH); /* fast precision: the formula's float form */
        kir_formula_write(g->nodes[v].op, half, "", &expr, &in_double, NULL); /* which type it computes in */
        ks_buf_printf(&operand, in_double ? "(double)%s" : "%s", in);
        expr.len = 0;
        kir_formula_write(g->nodes[v].op, half, ks_buf_cstr(&operand), &expr, NULL, NULL);
        ks_buf_printf(b, in_double ? "(float)(%s)" : "(%s)", ks_buf_cstr(&expr));
        ks_buf_free(&operand);
        ks_buf_free(&expr);
        return;
    }
    }
}

/* The value of local node loc at the element in slot `slot` ("j" or "1 - j"). */
static void slot_name(const group *G, int loc, const char *slot, char *out, size_t cap)
{
    if (loc == G->mm) snprintf(out, cap, "m[%s]", slot);
    else snprintf(out, cap, "x%d[%s]", loc, slot);
}

/* The functor's `in` (what the epilogue reads from memory for a pair: an
 * outside operand's two elements, a rotation's position, a KV write's slot)
 * and fetch(t, n0, n1, r), which reads it (kcu_epi_steps, kcu_prelude.cuh). */
static void put_fetch(group *G, ks_buf *b)
{
    const kir_graph *g = G->x->g;
    ks_buf members = {0}, reads = {0};
    for (int i = G->mm + 1; i < G->count; i++) {
        const gnode *gn = &G->n[i];
        const kir_node *nd = &g->nodes[gn->v];
        if (gn->r == ROLE_ROPE) {
            ks_buf_printf(&members, " int pos%d;", i);
            ks_buf_printf(&reads, "        r.pos%d = pos%d[t];\n", i, i);
        } else if (gn->r == ROLE_KV_WRITE) {
            ks_buf_printf(&members, " int slots%d;", i);
            ks_buf_printf(&reads, "        r.slots%d = slots%d[t];\n", i, i);
        } else if (gn->r == ROLE_BINARY) {
            for (int side = 0; side < 2; side++) {
                if ((side ? gn->b : gn->a) >= 0) continue;
                const kir_node *on = &g->nodes[nd->in[side]];
                ks_buf_printf(&members, " float in%d_%d[2];", i, side);
                /* an element out of the node's columns reads its first (never used): no branch */
                ks_buf_printf(&reads,
                              "#pragma unroll\n"
                              "        for (int j = 0; j < 2; j++) {\n"
                              "            const int e = (unsigned)(n[j] - %lld) < %lluu ? n[j] - %lld : 0;\n",
                              (long long)gn->base, (unsigned long long)gn->size, (long long)gn->base);
                if (on->ndim > 0 && on->dims[0] == KIR_DIM_T)
                    ks_buf_printf(&reads, "            r.in%d_%d[j] = kcu_f(in%d_%d[t * %lld + e]);\n", i, side, i, side,
                                  (long long)gn->size);
                else
                    ks_buf_printf(&reads, "            r.in%d_%d[j] = kcu_f(in%d_%d[e %% %lld]);\n", i, side, i, side,
                                  (long long)kir_elems(on, 1));
                ks_buf_puts(&reads, "        }\n");
            }
        }
    }
    ks_buf_printf(b,
                  "    /* what the epilogue reads for a pair besides the sums */\n"
                  "    struct in {%s };\n"
                  "    __device__ __forceinline__ void fetch(long long t, int n0, int n1, in &r) const\n"
                  "    {\n"
                  "        const int n[2] = {n0, n1};\n"
                  "        (void)t, (void)n, (void)r;\n%s"
                  "    }\n",
                  ks_buf_cstr(&members), ks_buf_cstr(&reads));
    ks_buf_free(&members);
    ks_buf_free(&reads);
}

/* The epilogue functor: row(c), fetch and apply (the two steps of
 * kcu_epi_steps), run(t, n0, v0, n1, v1) = both, called by two and one. Parameters were
 * added in the same order as the fields (param names == field names). */
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

    put_fetch(G, b);
    /* apply: every node on the pair; slot 1 absent when n1 < 0 */
    ks_buf_puts(b, "    __device__ __forceinline__ void apply(long long t, int n0, float v0, int n1, float v1, const in &r) "
                   "const\n"
                   "    {\n"
                   "        const int n[2] = {n0, n1};\n");
    kir_dtype mt = g->nodes[G->n[G->mm].v].dtype;
    if (mt == KIR_F32)
        ks_buf_puts(b, "        float m[2] = {v0, v1};\n");
    else
        ks_buf_printf(b, "        float m[2] = {kcu_round<%s>(v0), kcu_round<%s>(v1)};\n", kcu_elem_type(mt),
                      kcu_elem_type(mt));
    if (G->n[G->mm].store) {
        char lhs[64];
        snprintf(lhs, sizeof lhs, "out%d[t * %lld + n[j]]", G->mm, (long long)G->N);
        ks_buf_puts(b, "        for (int j = 0; j < 2; j++)\n");
        kcu_put_store(b, mt, "            if (n[j] >= 0) ", lhs, "m[j]");
    }
    for (int i = G->mm + 1; i < G->count; i++) {
        gnode *gn = &G->n[i];
        const kir_node *nd = &g->nodes[gn->v];
        ks_buf_printf(b, "        /* %s: columns [%lld, %lld) */\n", kir_op_table[nd->op].name, (long long)gn->base,
                      (long long)(gn->base + gn->size));
        if (gn->r == ROLE_KV_WRITE) {
            const gnode *kg = &G->n[gn->a], *vg = &G->n[gn->b];
            kir_dtype ct = kir_kv_dtype(g, gn->v);
            char ks[32], vs[32], head[96], lhs[96];
            slot_name(G, gn->a, "j", ks, sizeof ks);
            slot_name(G, gn->b, "j", vs, sizeof vs);
            ks_buf_printf(b,
                          "#pragma unroll\n"
                          "        for (int j = 0; j < 2; j++) {\n"
                          "            const int ek = n[j] - %lld, ev = n[j] - %lld;\n",
                          (long long)kg->base, (long long)vg->base);
            snprintf(head, sizeof head, "            if ((unsigned)ek < %lluu) ", (unsigned long long)kg->size);
            snprintf(lhs, sizeof lhs, "kc%d[(long long)r.slots%d * %lld + ek]", i, i, (long long)kg->size);
            kcu_put_store(b, ct, head, lhs, ks);
            snprintf(head, sizeof head, "            if ((unsigned)ev < %lluu) ", (unsigned long long)vg->size);
            snprintf(lhs, sizeof lhs, "vc%d[(long long)r.slots%d * %lld + ev]", i, i, (long long)vg->size);
            kcu_put_store(b, ct, head, lhs, vs);
            ks_buf_puts(b, "        }\n");
            continue;
        }
        if (gn->r == ROLE_ROPE) /* the last angle's cos and sin: a rotation's pair shares them */
            ks_buf_printf(b, "        float ra%d = __int_as_float(0x7fc00000), rc%d = 0.0f, rs%d = 0.0f;\n", i, i, i);
        ks_buf_printf(b, "        float x%d[2];\n#pragma unroll\n        for (int j = 0; j < 2; j++) {\n", i);
        ks_buf_printf(b, "            const int e = n[j] - %lld;\n            x%d[j] = 0.0f;\n", (long long)gn->base, i);
        ks_buf_printf(b, "            if ((unsigned)e >= %lluu) continue;\n", (unsigned long long)gn->size);
        char src_a[32] = "", src_b[32] = "", other[32] = "";
        /* an operand's value at this element: its slot j, or the partner's slot when its base differs */
        if (gn->a >= 0) slot_name(G, gn->a, "j", src_a, sizeof src_a);
        if (gn->a >= 0) slot_name(G, gn->a, "1 - j", other, sizeof other);
        if (gn->b >= 0) slot_name(G, gn->b, G->n[gn->b].base == gn->base ? "j" : "1 - j", src_b, sizeof src_b);
        switch (gn->r) {
        case ROLE_VIEW:
            ks_buf_printf(b, "            x%d[j] = %s;\n", i, src_a);
            break;
        case ROLE_UNARY: {
            ks_buf expr = {0};
            unary_expr(G, gn->v, src_a, &expr);
            ks_buf_printf(b, "            x%d[j] = %s;\n", i, ks_buf_cstr(&expr));
            ks_buf_free(&expr);
            break;
        }
        case ROLE_BINARY: {
            const char *op = nd->op == KIR_OP_ADD ? "+" : nd->op == KIR_OP_SUB ? "-" : "*";
            ks_buf ea = {0}, eb = {0};
            for (int side = 0; side < 2; side++) {
                int loc = side ? gn->b : gn->a;
                ks_buf *eo = side ? &eb : &ea;
                if (loc >= 0) {
                    ks_buf_puts(eo, side ? src_b : src_a);
                    continue;
                }
                const kir_node *on = &g->nodes[nd->in[side]];
                (void)on;
                ks_buf_printf(eo, "r.in%d_%d[j]", i, side);
            }
            ks_buf_printf(b, "            x%d[j] = %s %s %s;\n", i, ks_buf_cstr(&ea), op, ks_buf_cstr(&eb));
            ks_buf_free(&ea);
            ks_buf_free(&eb);
            break;
        }
        case ROLE_ROPE: {
            int64_t d = nd->dims[2], rot = kir_attr_int(g, gn->v, KIR_A_ROPE_ROT_DIM), half = rot / 2;
            ks_buf cs = {0}; /* the angle's cosine and sine: in float with half_math (fast precision), else double */
            if (kir_attr_int(g, gn->v, KIR_A_ANY_HALF_MATH))
                ks_buf_printf(&cs, "                    ra%d = angle;\n                    sincosf(angle, &rs%d, &rc%d);\n", i,
                              i, i);
            else
                ks_buf_printf(&cs,
                              "                    double sd, cd;\n"
                              "                    sincos((double)angle, &sd, &cd);\n"
                              "                    ra%d = angle, rc%d = (float)cd, rs%d = (float)sd;\n",
                              i, i, i);
            int pairs = kir_attr_word(g, gn->v, KIR_A_ROPE_STYLE) == KIR_ROPE_STYLE_PAIRS;
            ks_buf_printf(b,
                          "            const int d = e %% %lld;\n"
                          "            if (d >= %lld) {\n                x%d[j] = %s;\n"
                          "            } else {\n",
                          (long long)d, (long long)rot, i, src_a);
            if (pairs)
                ks_buf_puts(b, "                const int f = d / 2, first = (d & 1) == 0;\n");
            else
                ks_buf_printf(b, "                const int f = d %% %lld, first = d < %lld;\n", (long long)half,
                              (long long)half);
            ks_buf_printf(b,
                          "                const float angle = (float)r.pos%d * " NAME_MARK "_inv_freq%d[f];\n"
                          "                if (!(angle == ra%d)) {\n"
                          "%s"
                          "                }\n"
                          "                const float self = %s, other = %s;\n"
                          "                x%d[j] = first ? self * rc%d - other * rs%d : self * rc%d + other * rs%d;\n"
                          "            }\n",
                          i, i, i, ks_buf_cstr(&cs), src_a, other, i, i, i, i, i);
            ks_buf_free(&cs);
            break;
        }
        default:
            KS_UNREACHABLE();
        }
        if (nd->dtype != KIR_F32) /* a half value: as stored, for the store and the nodes after it */
            ks_buf_printf(b, "            x%d[j] = kcu_round<%s>(x%d[j]);\n", i, kcu_elem_type(nd->dtype), i);
        if (gn->store) {
            char lhs[64], val[16];
            snprintf(lhs, sizeof lhs, "out%d[t * %lld + e]", i, (long long)gn->size);
            snprintf(val, sizeof val, "x%d[j]", i);
            kcu_put_store(b, nd->dtype, "            ", lhs, val);
        }
        ks_buf_puts(b, "        }\n");
    }
    ks_buf_puts(b, "    }\n"
                   "    __device__ KCU_NOINLINE void run(long long t, int n0, float v0, int n1, float v1) const\n"
                   "    {\n        in r;\n        fetch(t, n0, n1, r);\n        apply(t, n0, v0, n1, v1, r);\n    }\n"
                   "    __device__ __forceinline__ void two(long long t, int n0, float v0, int n1, float v1) const\n"
                   "    {\n        run(t, n0, v0, n1, v1);\n    }\n"
                   "    __device__ __forceinline__ void one(long long t, int n0, float v0) const\n"
                   "    {\n        run(t, n0, v0, -1, 0.0f);\n    }\n};\n");
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
enum { G90_MAX = 3 }; /* tile widths at most: 128, 192, 256 */

/* The gemm90 kernels of a group: one per tile width that the rule picks
 * for some step above the threshold, each with the step sizes it runs. */
typedef struct g90_plan {
    int n;                         /* kernels (0: no variant) */
    kcu_g90_tiles tiles[G90_MAX];  /* their tiles */
    int64_t above[G90_MAX];        /* kernel i runs for steps of more than above[i] tokens */
    kir_val xv;                    /* the value the matmul reads through the x map: the norm's, or its operand */
} g90_plan;

/* Which gemm90 kernels group G gets: half x and weights of one dtype, rows
 * of 16-byte chunks, pairs that fit boxes (kcu_g90_plan_tiles); widths by
 * the rule from the threshold up (the rule's width only grows with T). */
static void plan_g90(const group *G, g90_plan *P)
{
    const kcu_gen *x = G->x;
    const kir_graph *g = x->g;
    memset(P, 0, sizeof *P);
    if (!x->opt.gemm90) return;
    const kir_node *mn = &g->nodes[G->n[G->mm].v];
    kir_dtype wt = g->nodes[mn->in[1]].dtype;
    P->xv = mn->in[0];
    if ((wt != KIR_BF16 && wt != KIR_F16) || g->nodes[P->xv].dtype != wt || G->K % 8 || G->N < 2) return;
    int64_t above = x->opt.gemm90_above > 0 ? x->opt.gemm90_above : KCU_GEMM90_ABOVE;
    kcu_g90_tiles all[G90_MAX];
    int nt[G90_MAX] = {0};
    static const int widths[G90_MAX] = {128, 192, 256};
    for (int i = 0; i < G90_MAX; i++)
        if (kcu_g90_plan_tiles(G->partner, G->N, widths[i], &all[i]) == 0) nt[i] = all[i].nt;
    int last = 0;
    for (int64_t m = (above + 1 + 127) / 128;; m++) {
        int64_t T = m == (above + 1 + 127) / 128 ? above + 1 : (m - 1) * 128 + 1; /* the first step of m token tiles */
        int bn = kcu_g90_pick_bn(T, nt);
        if (bn == 0) break;
        if (bn != last) {
            int i = bn == 128 ? 0 : bn == 192 ? 1 : 2;
            P->tiles[P->n] = all[i];
            all[i].table = NULL; /* owned by P now */
            P->above[P->n++] = T - 1;
            last = bn;
        }
        if (bn == 256 || m > 4096 || P->n == G90_MAX) break;
    }
    for (int i = 0; i < G90_MAX; i++)
        if (nt[i]) free(all[i].table);
}

static void free_g90(g90_plan *P)
{
    for (int i = 0; i < P->n; i++) free(P->tiles[i].table);
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
    for (int i = 0; i < P->n; i++) {
        const kcu_g90_tiles *t = &P->tiles[i];
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
        ks_buf_printf(b,
                      "/* the same on sm_90a for steps of more than %lld tokens: wgmma fed by TMA, tiles of 128 x %d */\n"
                      "extern \"C\" __global__ void __launch_bounds__(KCU_G90_THREADS, 1) " NAME_MARK "_g90_%d(%s)\n"
                      "{\n"
                      "    const " NAME_MARK "_epi epi = {%s};\n"
                      "    kcu_gemm90<%s, %lld, %lld, %d, %d, %s>(T, ta, tb, kcu_g90_none(), epi);\n"
                      "}\n",
                      (long long)P->above[i], t->bn, t->bn, g90_params, inits, xt, (long long)G->K, (long long)G->N,
                      t->bn, kcu_g90_stages(t->bn), tiles);
    }
    ks_buf_puts(b, "#endif\n");
}

/* The variants of kernel ki (named): [the norm's own kernel,] the gemm90 kernel. */
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
    const kir_val wv = g->nodes[G->n[G->mm].v].in[1];
    for (int i = 0; i < P->n; i++) {
        const kcu_g90_tiles *t = &P->tiles[i];
        krt_cuda_variant *v = &k->variants[i];
        memset(v, 0, sizeof *v);
        v->arch = KCU_GEMM90_ARCH;
        v->above = P->above[i];
        if (G->pro >= 0) v->launches[v->n_launches++] = norm;
        krt_cuda_launch *l = &v->launches[v->n_launches++];
        l->name = ks_arena_printf(&x->meta->arena, "%s_g90_%d", k->name, t->bn);
        l->block = 384;
        l->smem = kcu_g90_smem_bytes(t->bn, kcu_g90_stages(t->bn));
        /* ceil(T / 128) token tiles (the prelude's KCU_G90_BM), the column tiles */
        int64_t grid[3][3] = {{1, 0, 128}, {0, t->nt, 1}, {0, 1, 1}};
        memcpy(l->grid, grid, sizeof grid);
        l->args[l->n_args++] = (krt_cuda_arg){KRT_CUDA_ARG_T, 0, 0};
        l->args[l->n_args++] = (krt_cuda_arg){KRT_CUDA_ARG_TMAP, x->root[P->xv], 128};
        l->args[l->n_args++] = (krt_cuda_arg){KRT_CUDA_ARG_TMAP, wv, t->bn / t->nbox};
        KS_ASSERT(l->n_args + n_fargs <= KRT_CUDA_MAX_ARGS);
        for (int a = 0; a < n_fargs; a++) l->args[l->n_args++] = fargs[a];
    }
    return 0;
}

/* The variants' tiles of a new kernel k, one line (kcu_options.choices). */
static void put_choices(const group *G, const g90_plan *P, const krt_cuda_kernel *k)
{
    ks_buf *b = G->x->opt.choices;
    ks_buf_printf(b, "%s: %%%u matmul, %lld -> %lld:", k->name, k->node, (long long)G->K, (long long)G->N);
    for (int i = 0; i < P->n; i++) {
        const kcu_g90_tiles *t = &P->tiles[i];
        const int stages = kcu_g90_stages(t->bn);
        ks_buf_printf(b, "%s %s above %lld tokens: %swgmma tiles 128 x %d (%d column tiles of %d box%s, %d stages, %d "
                         "bytes of shared memory)",
                      i ? ";" : "", KCU_GEMM90_ARCH, (long long)P->above[i], G->pro >= 0 ? "the norm's kernel, then " : "",
                      t->bn, t->nt, t->nbox, t->nbox > 1 ? "es" : "", stages, kcu_g90_smem_bytes(t->bn, stages));
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
    g90_plan P = {0};
    if (ok) plan_g90(&G, &P);
    free(G.partner);
    if (!ok) return 0;

    /* ---- the kernel: matmul grid, parameters, the functor, the body ---- */
    const kcu_gemv_plan plan = kcu_plan_gemv(G.N); /* kcu_matmul_small's columns a warp */
    krt_cuda_kernel *k = kcu_kernel_new(x, nodes[G.mm], MM_THREADS);
    kcu_matmul_grids(k, G.N, &plan);
    const kir_node *pn = G.pro >= 0 ? &g->nodes[nodes[G.pro]] : NULL;
    kcu_param_in(x, k, pn ? pn->in[0] : mn->in[0], "x");
    kcu_param_in(x, k, mn->in[1], "w");
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
            kcu_put_rope_table(x, &tables, gn->v, kir_attr_int(g, gn->v, KIR_A_ROPE_ROT_DIM), suffix);
        }
        if (gn->r == ROLE_KV_WRITE) {
            int64_t layer = kir_attr_int(g, gn->v, KIR_A_ATTENTION_LAYER);
            if (layer < 0 || layer >= INT32_MAX) {
                ks_buf_free(&fields), ks_buf_free(&inits), ks_buf_free(&tables);
                free_g90(&P);
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
    put_epilogue(&G, &fields);

    ks_buf what = {0};
    ks_buf_puts(&what, "fused");
    for (int i = 0; i < count; i++) ks_buf_printf(&what, " %s", kir_op_table[g->nodes[nodes[i]].op].name);
    ks_buf_printf(&what, "; %s weights, fp32 sums", kir_dtype_name(wn->dtype));
    kcu_open_body_min(x, k, ks_buf_cstr(&what), plan.per_sm);
    ks_buf_free(&what);
    const char *wt = kcu_elem_type(wn->dtype);
    ks_buf call = {0}; /* the matmul's arguments after its name and shape */
    if (!pn) {
        ks_buf_puts(&call, "(T, x, w, kcu_pro_none(), epi);\n}\n");
    } else {
        const char *gt = has_g ? kcu_elem_type(g->nodes[pn->in[1]].dtype) : "float";
        int rms = pn->op == KIR_OP_RMS_NORM;
        /* the norm's values are of its dtype: a half one rounds them as the matmul takes them */
        ks_buf ot = {0};
        if (pn->dtype != KIR_F32) ks_buf_printf(&ot, ", %s", kcu_elem_type(pn->dtype));
        ks_buf_printf(&call, "(T, x, w, kcu_pro_%s<%lld, %s%s>{%s, %s", rms ? "rms" : "ln", (long long)G.K, gt,
                      ks_buf_cstr(&ot), has_g ? "g" : "nullptr", rms ? "" : (has_b ? "gb, " : "nullptr, "));
        ks_buf_free(&ot);
        kcu_put_double(&call, kir_attr_float(g, nodes[G.pro], KIR_A_RMS_NORM_EPS));
        ks_buf_puts(&call, "}, epi);\n}\n");
    }
    for (int large = 0; large < 2; large++) {
        if (large) kcu_open_large(x, k, MM_GEMV_T);
        ks_buf_printf(&x->body, "    const " NAME_MARK "_epi epi = {%s};\n", ks_buf_cstr(&inits));
        ks_buf_printf(&x->body, "    kcu_matmul_%s<%s, %lld, %lld", large ? "large" : "small", wt, (long long)G.K,
                      (long long)G.N);
        if (!large) ks_buf_printf(&x->body, ", %d", plan.rows);
        ks_buf_printf(&x->body, ">%s", ks_buf_cstr(&call));
    }
    ks_buf_free(&call);
    if (P.n) {
        /* the gemm90 kernels' parameters: T, the maps, the epilogue's fields ("    decl;\n" each) */
        ks_buf params = {0};
        ks_buf_puts(&params, "int T, const __grid_constant__ kcu_tmap ta, const __grid_constant__ kcu_tmap tb");
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
