/*
 * test_plan_random.c — a property test of the memory planner over random
 * graphs at realistic shapes. Odd seeds stack transformer parts: attention
 * and MLP blocks (gated and plain), branches that rejoin, skips from far
 * back, parallel blocks, slices and concats, views. Even seeds build random
 * DAGs over four widths, each node reading values picked anywhere before
 * it, so that lifetimes cross freely (the hard case for placement). Each
 * graph is planned twice: as built (a kernel per node), and after kiln's
 * pass pipeline (passes/pipeline.h: sibling matmuls merged, kv_writes split
 * off, `fuse` groups that run as one kernel each). For every plan:
 *  - the graph verifies (kir_verify), so the shapes are real;
 *  - kir_plan_check accepts the plan;
 *  - lower bound <= arena <= 1.05 x lower bound, and arena <= naive (the
 *    bound with the groups' liveness for a fused graph);
 *  - with a chain of values that share bytes moved elsewhere (onto another
 *    chain's bytes, or anywhere), kir_plan_check, which sweeps the schedule
 *    in O(n log n), accepts the plan exactly when a quadratic reference that
 *    compares every pair of values accepts it.
 * Each plan's figures are printed (fused graphs' seeds marked with f); a
 * failure names the seed, and KILN_PLANNER_SEED=S rebuilds that graph alone
 * (KILN_PLANNER_GRAPHS=N runs seeds 1..N: 5000 of them have all stayed
 * within 1.05, the worst at 1.0435, which is that graph's optimum, the bound
 * being out of reach there).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/pipeline.h"
#include "passes/plan_memory.h"
#include "tests/check.h"
#include "tests/graph_build.h"

enum { N_GRAPHS = 400, MAX_POOL = 4096 };

/* A small deterministic generator (splitmix64). */
typedef struct rng {
    uint64_t s; /* state */
} rng;

static uint64_t next(rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static int below(rng *r, int n) { return (int)(next(r) % (uint64_t)n); }

/* The model being generated. */
typedef struct model {
    tb_graph b;              /* the graph */
    rng *r;                  /* randomness */
    int64_t dim;             /* hidden size */
    int64_t ffn;             /* MLP width */
    int64_t heads;           /* query heads */
    int64_t kv_heads;        /* key/value heads */
    int64_t head_dim;        /* per head */
    kir_val pos;             /* positions input, KIR_NONE when the model has no rope */
    kir_val pool[MAX_POOL];  /* earlier [T,dim] values a block may read again */
    int n_pool;              /* values in pool */
} model;

static void remember(model *m, kir_val v)
{
    if (m->n_pool < MAX_POOL) m->pool[m->n_pool++] = v;
}

/* An earlier [T,dim] value, mostly a recent one. */
static kir_val older(model *m)
{
    int back = below(m->r, 4) == 0 ? below(m->r, m->n_pool) : below(m->r, m->n_pool < 3 ? m->n_pool : 3);
    return m->pool[m->n_pool - 1 - back];
}

static kir_op random_activation(rng *r)
{
    static const kir_op acts[] = {KIR_OP_SILU, KIR_OP_GELU, KIR_OP_GELU_TANH, KIR_OP_RELU, KIR_OP_SCALE};
    return acts[below(r, 5)];
}

static kir_val norm(model *m, kir_val x)
{
    return tb_norm(&m->b, below(m->r, 3) ? KIR_OP_RMS_NORM : KIR_OP_LAYER_NORM, x);
}

static kir_val attention(model *m, kir_val h)
{
    tb_graph *b = &m->b;
    int64_t qd = m->heads * m->head_dim, kvd = m->kv_heads * m->head_dim;
    kir_val q = tb_matmul(b, h, qd), k = tb_matmul(b, h, kvd), v = tb_matmul(b, h, kvd);
    const int64_t qs[] = {KIR_DIM_T, m->heads, m->head_dim}, ks[] = {KIR_DIM_T, m->kv_heads, m->head_dim};
    const int64_t flat[] = {KIR_DIM_T, qd};
    q = tb_reshape(b, q, 3, qs);
    k = tb_reshape(b, k, 3, ks);
    v = tb_reshape(b, v, 3, ks);
    if (m->pos != KIR_NONE) {
        q = tb_rope(b, q, m->pos);
        k = tb_rope(b, k, m->pos);
    }
    kir_val a = tb_attention(b, q, k, v);
    a = tb_reshape(b, a, 2, flat);
    return tb_matmul(b, a, m->dim);
}

static kir_val mlp(model *m, kir_val h)
{
    tb_graph *b = &m->b;
    if (below(m->r, 2)) { /* gated: act(gate) * up */
        kir_val g = tb_matmul(b, h, m->ffn), u = tb_matmul(b, h, m->ffn);
        g = tb_unary(b, random_activation(m->r), g);
        g = tb_binary(b, KIR_OP_MUL, g, u);
        return tb_matmul(b, g, m->dim);
    }
    kir_val u = tb_matmul(b, h, m->ffn);
    u = tb_unary(b, random_activation(m->r), u);
    return tb_matmul(b, u, m->dim);
}

/* A short chain of [T,dim] -> [T,dim] steps. */
static kir_val chain(model *m, kir_val x)
{
    int n = 1 + below(m->r, 3);
    for (int i = 0; i < n; i++) {
        switch (below(m->r, 4)) {
        case 0: x = tb_matmul(&m->b, x, m->dim); break;
        case 1: x = norm(m, x); break;
        default: x = tb_unary(&m->b, random_activation(m->r), x); break;
        }
    }
    return x;
}

/* One block: from the residual stream x to the next. */
static kir_val block(model *m, kir_val x)
{
    tb_graph *b = &m->b;
    static const kir_op joins[] = {KIR_OP_ADD, KIR_OP_SUB, KIR_OP_MUL};
    switch (below(m->r, 9)) {
    case 0:
    case 1: return tb_binary(b, KIR_OP_ADD, x, attention(m, norm(m, x)));
    case 2:
    case 3: return tb_binary(b, KIR_OP_ADD, x, mlp(m, norm(m, x)));
    case 4: { /* parallel attention and MLP over one norm (GPT-J) */
        kir_val h = norm(m, x);
        kir_val a = attention(m, h), f = mlp(m, h);
        return tb_binary(b, KIR_OP_ADD, tb_binary(b, KIR_OP_ADD, x, a), f);
    }
    case 5: { /* two branches that rejoin */
        kir_val l = chain(m, x), r = chain(m, x);
        return tb_binary(b, joins[below(m->r, 3)], l, r);
    }
    case 6: /* a skip from further back */
        return tb_binary(b, KIR_OP_ADD, x, older(m));
    case 7: { /* a slice, projected back */
        int64_t half = m->dim / 2;
        int64_t s = below(m->r, 2) ? 0 : half;
        kir_val p = tb_matmul(b, tb_slice(b, x, s, s + half), m->dim);
        return tb_binary(b, KIR_OP_ADD, x, p);
    }
    default: { /* a concat with an older value, projected back */
        kir_val parts[2] = {x, older(m)};
        kir_val c = tb_concat(b, 2, parts);
        if (below(m->r, 2)) {
            const int64_t s3[] = {KIR_DIM_T, 2, m->dim};
            const int64_t s2[] = {KIR_DIM_T, 2 * m->dim};
            c = tb_reshape(b, tb_reshape(b, c, 3, s3), 2, s2);
        }
        return tb_binary(b, KIR_OP_ADD, tb_matmul(b, c, m->dim), x);
    }
    }
}

/* A value of any of the model's widths, mostly a recent one. */
typedef struct dag {
    kir_val v[MAX_POOL]; /* [T,w] values, all widths */
    int n;               /* values */
} dag;

static kir_val pick_value(model *m, const dag *d)
{
    int back = below(m->r, 3) == 0 ? below(m->r, d->n) : below(m->r, d->n < 4 ? d->n : 4);
    return d->v[d->n - 1 - back];
}

static int64_t width_of(model *m, kir_val v) { return kir_node_at(m->b.g, v)->dims[1]; }

/* An earlier value of width w, or KIR_NONE. */
static kir_val pick_width(model *m, const dag *d, int64_t w)
{
    int start = below(m->r, d->n);
    for (int i = 0; i < d->n; i++) {
        kir_val v = d->v[(start + d->n - i) % d->n];
        if (width_of(m, v) == w) return v;
    }
    return KIR_NONE;
}

/* A random DAG of [T,w] values over widths dim/2, dim, 2 dim and ffn: each
 * node reads values picked anywhere before it, so lifetimes cross freely. */
static kir_val random_dag(model *m, kir_val x, int n_nodes)
{
    tb_graph *b = &m->b;
    dag d = {.n = 0};
    d.v[d.n++] = x;
    const int64_t widths[] = {m->dim / 2, m->dim, 2 * m->dim, m->ffn};
    for (int i = 0; i < n_nodes && d.n < MAX_POOL; i++) {
        kir_val a = pick_value(m, &d), v;
        int64_t w = width_of(m, a);
        switch (below(m->r, 8)) {
        case 0:
        case 1: v = tb_matmul(b, a, widths[below(m->r, 4)]); break;
        case 2: v = tb_unary(b, random_activation(m->r), a); break;
        case 3: v = norm(m, a); break;
        case 4:
        case 5: {
            kir_val o = pick_width(m, &d, w);
            v = tb_binary(b, below(m->r, 2) ? KIR_OP_ADD : KIR_OP_MUL, a, o);
            break;
        }
        case 6: v = w >= 2 ? tb_slice(b, a, 0, w / 2) : tb_unary(b, KIR_OP_RELU, a); break;
        default: {
            kir_val parts[2] = {a, pick_value(m, &d)};
            v = tb_concat(b, 2, parts);
            if (width_of(m, v) % 2 == 0 && below(m->r, 2)) {
                const int64_t s3[] = {KIR_DIM_T, 2, width_of(m, v) / 2}, s2[] = {KIR_DIM_T, width_of(m, v)};
                v = tb_reshape(b, tb_reshape(b, v, 3, s3), 2, s2);
            }
            break;
        }
        }
        d.v[d.n++] = v;
    }
    /* back to [T,dim], reading the last few values */
    kir_val y = d.v[d.n - 1];
    if (width_of(m, y) != m->dim) y = tb_matmul(b, y, m->dim);
    return tb_binary(b, KIR_OP_ADD, y, x);
}

static const int64_t token_counts[] = {1, 7, 16, 64, 128, 512};

/* Build random graph number `seed`; *max_tokens receives its step size. */
static kir_graph *build(uint64_t seed, int64_t *max_tokens)
{
    rng r = {seed * 0x2545f4914f6cdd1dull + 1};
    model m = {.r = &r};
    static const int64_t dims[] = {64, 96, 128, 256, 512};
    static const int64_t head_dims[] = {16, 32};
    static const int64_t vocabs[] = {128, 256, 1000, 4096, 32000};
    tb_init(&m.b, "random");
    m.dim = dims[below(&r, 5)];
    m.head_dim = head_dims[below(&r, 2)];
    m.heads = m.dim / m.head_dim;
    int64_t kv_options[] = {1, m.heads % 2 == 0 ? 2 : 1, m.heads};
    m.kv_heads = kv_options[below(&r, 3)];
    int64_t ffn_mult[] = {2, 3, 4};
    m.ffn = below(&r, 4) == 0 ? (m.dim * 8 / 3 + 31) / 32 * 32 : m.dim * ffn_mult[below(&r, 3)];
    *max_tokens = token_counts[below(&r, 6)];

    kir_val tok = tb_input(&m.b, "tokens");
    m.pos = below(&r, 4) ? tb_input(&m.b, "positions") : KIR_NONE;
    kir_val x = tb_embed(&m.b, tok, vocabs[below(&r, 5)], m.dim);
    remember(&m, x);
    int n_blocks = 1 + below(&r, 12);
    int dag_nodes = seed % 2 == 0 ? 10 + below(&r, 150) : 0; /* even seeds: random DAGs */
    for (int i = 0; i < n_blocks; i++) {
        x = dag_nodes ? random_dag(&m, x, dag_nodes / n_blocks + 1) : block(&m, x);
        remember(&m, x);
    }
    x = norm(&m, x);
    if (below(&r, 4)) x = tb_matmul(&m.b, x, vocabs[below(&r, 5)]);
    tb_output(&m.b, x);
    tb_verify(&m.b);
    return m.b.g;
}

/* ---- the quadratic reference ---------------------------------------------------------------
 * The overlap rules of ir/plan_check.c said pair by pair: two values live
 * at a common node share no byte, unless one shows the other's write (a
 * view) or is an in-place op that overwrites it at or after its last read
 * (through a chain of in-place ops); and no other node of an in-place op's
 * `fuse` group reads its operand's bytes written before the group. The
 * other rules (sizes, flags, in-place over a live value) do not depend on
 * where chains are, so a moved plan keeps them. */
typedef struct reference {
    const kir_graph *g;      /* the graph */
    const kir_mem_plan *p;   /* the plan */
    uint32_t *first, *last;  /* [n] each node's group */
    uint32_t *start, *end;   /* [n] live range of each value */
    uint32_t *read_end;      /* [n] last node that reads each value */
    kir_val *gen;            /* [n] the write each value's bytes hold */
} reference;

static int ref_overlap(const kir_mem_plan *p, kir_val a, kir_val b)
{
    return p->offset[a] < p->offset[b] + p->bytes[b] && p->offset[b] < p->offset[a] + p->bytes[a];
}

static int ref_may_share(const reference *r, kir_val u, kir_val w)
{
    if (r->gen[u] == r->gen[w]) return 1;
    for (kir_val h = r->gen[w]; r->p->flags[h] & KIR_MEM_INPLACE;) {
        kir_val over = r->gen[r->g->nodes[h].in[0]];
        if (over == r->gen[u]) return r->read_end[u] <= h;
        h = over;
    }
    return 0;
}

static int reference_accepts(const kir_graph *g, const kir_mem_plan *p)
{
    size_t n = g->n_nodes;
    reference r = {g, p, calloc(n, 4), calloc(n, 4), calloc(n, 4), calloc(n, 4), calloc(n, 4), calloc(n, 4)};
    kir_group_spans(g, r.first, r.last);
    for (size_t v = 0; v < n; v++) {
        const kir_node *nd = &g->nodes[v];
        int out = nd->op == KIR_OP_OUTPUT;
        r.start[v] = nd->op == KIR_OP_INPUT ? 0 : r.first[v];
        r.end[v] = out ? (uint32_t)(n - 1) : r.last[v];
        r.read_end[v] = out ? (uint32_t)(n - 1) : (uint32_t)v;
        for (int i = 0; i < nd->nin; i++) {
            kir_val o = nd->in[i];
            if (o == KIR_NONE) continue;
            if (r.end[o] < r.last[v]) r.end[o] = r.last[v];
            if (r.read_end[o] < v) r.read_end[o] = (uint32_t)v;
        }
        r.gen[v] = (p->flags[v] & KIR_MEM_ALIAS) ? r.gen[nd->in[0]] : (kir_val)v;
    }
    for (size_t v = n; v-- > 0;)
        if (p->flags[v] & KIR_MEM_ALIAS) {
            kir_val o = g->nodes[v].in[0];
            if (r.end[v] > r.end[o]) r.end[o] = r.end[v];
            if (r.read_end[v] > r.read_end[o]) r.read_end[o] = r.read_end[v];
        }
    int ok = 1;
    for (size_t v = 0; v < n && ok; v++) {
        if (!(p->flags[v] & KIR_MEM_INPLACE)) continue;
        kir_val src = g->nodes[v].in[0];
        for (uint32_t u = r.first[v]; u <= r.last[v] && ok; u++) {
            const kir_node *nd = &g->nodes[u];
            if (u == v || nd->op == KIR_OP_RESHAPE) continue;
            for (int i = 0; i < nd->nin; i++) {
                kir_val x = nd->in[i];
                if (x != KIR_NONE && p->offset[x] != KIR_MEM_NONE && r.gen[x] < r.first[v] && ref_overlap(p, x, src))
                    ok = 0;
            }
        }
    }
    for (size_t u = 0; u < n && ok; u++)
        for (size_t w = u + 1; w < n && ok; w++) {
            if (p->offset[u] == KIR_MEM_NONE || p->offset[w] == KIR_MEM_NONE) continue;
            if (r.start[u] > r.end[w] || r.start[w] > r.end[u] || !ref_overlap(p, (kir_val)u, (kir_val)w)) continue;
            ok = ref_may_share(&r, (kir_val)u, (kir_val)w) || ref_may_share(&r, (kir_val)w, (kir_val)u);
        }
    free(r.first);
    free(r.last);
    free(r.start);
    free(r.end);
    free(r.read_end);
    free(r.gen);
    return ok;
}

/* Move chains of a sound plan (a value and those that share its bytes)
 * at random, and compare kir_plan_check with the reference on each. Returns
 * the disagreements. */
static int compare_moved(const char *seed, const kir_graph *g, const kir_mem_plan *sound, uint64_t seed_bits)
{
    enum { MOVES = 8 };
    size_t n = g->n_nodes;
    rng r = {seed_bits ^ 0x5eedull};
    kir_val *root = calloc(n, sizeof *root);
    kir_val *roots = calloc(n, sizeof *roots);
    size_t n_roots = 0;
    for (size_t v = 0; v < n; v++) {
        if (sound->offset[v] == KIR_MEM_NONE) continue;
        root[v] = sound->flags[v] ? root[g->nodes[v].in[0]] : (kir_val)v;
        if (root[v] == v) roots[n_roots++] = (kir_val)v;
    }
    kir_mem_plan p;
    kir_mem_plan_init(&p, n);
    int bad = 0;
    for (int m = 0; m < MOVES && n_roots > 1; m++) {
        p.max_tokens = sound->max_tokens;
        p.arena_bytes = 2 * sound->arena_bytes; /* room to move: bounds are not what is compared */
        memcpy(p.offset, sound->offset, n * sizeof *p.offset);
        memcpy(p.bytes, sound->bytes, n * sizeof *p.bytes);
        memcpy(p.flags, sound->flags, n);
        memcpy(p.share, sound->share, n * sizeof *p.share);
        kir_val moved = roots[below(&r, (int)n_roots)];
        uint64_t to = below(&r, 2) ? sound->offset[roots[below(&r, (int)n_roots)]]
                                   : (uint64_t)below(&r, (int)(sound->arena_bytes / KIR_MEM_ALIGN)) * KIR_MEM_ALIGN;
        for (size_t v = 0; v < n; v++)
            if (p.offset[v] != KIR_MEM_NONE && root[v] == moved) p.offset[v] = to;
        ks_buf why = {0};
        int fast = kir_plan_check(g, &p, &why, NULL) == 0, slow = reference_accepts(g, &p);
        if (fast != slow) {
            fprintf(stderr, "seed %s: FAILED: %%%u moved to %" PRIu64 ": kir_plan_check %s (%s), the reference %s\n",
                    seed, (unsigned)moved, to, fast ? "accepts" : "refuses", ks_buf_cstr(&why),
                    slow ? "accepts" : "refuses");
            bad++;
        }
        ks_buf_free(&why);
    }
    kir_mem_plan_free(&p);
    free(root);
    free(roots);
    return bad;
}

/* The totals of a run. */
typedef struct tally {
    int plans;          /* plans made */
    int at_bound;       /* plans at the lower bound */
    double sum;         /* of arena / bound */
    double worst;       /* largest arena / bound */
    char worst_seed[24]; /* its seed (and f for a fused graph) */
} tally;

/* Plan g, check the plan and its bounds, and print its figures. */
static void plan_one(const char *seed, const kir_graph *g, int64_t max_tokens, tally *t)
{
    ks_buf log = {0};
    ks_diag d = {.log = &log, .quiet = 1};
    kp_mem_plan p;
    if (!CHECK_MSG(kp_plan_memory(g, max_tokens, &p, &d) == 0, "seed %s: planning: %s", seed, ks_buf_cstr(&log))) {
        ks_buf_free(&log);
        return;
    }
    ks_buf_free(&log);
    double ratio = (double)p.mem.arena_bytes / (double)p.lower_bound_bytes;
    printf("%6s %6zu %8" PRId64 " %12" PRIu64 " %12" PRIu64 " %12" PRIu64 " %7.4f  %s\n", seed, g->n_nodes,
           max_tokens, p.mem.arena_bytes, p.lower_bound_bytes, p.naive_bytes, ratio, p.strategy);
    ks_buf why = {0};
    if (kir_plan_check(g, &p.mem, &why, NULL) != 0) {
        CHECK_MSG(0, "seed %s: plan check: %s", seed, ks_buf_cstr(&why));
    } else {
        uint64_t bits = 0;
        for (const char *c = seed; *c; c++) bits = bits * 131 + (uint8_t)*c;
        CHECK_MSG(compare_moved(seed, g, &p.mem, bits) == 0, "seed %s: the checker and the reference disagree", seed);
    }
    ks_buf_free(&why);
    /* arena <= 1.05 x bound, in integers */
    CHECK_MSG(p.mem.arena_bytes >= p.lower_bound_bytes && p.mem.arena_bytes * 100 <= p.lower_bound_bytes * 105 &&
                  p.mem.arena_bytes <= p.naive_bytes,
              "seed %s: arena %" PRIu64 " outside [bound %" PRIu64 ", 1.05 x bound] or over naive %" PRIu64, seed,
              p.mem.arena_bytes, p.lower_bound_bytes, p.naive_bytes);
    if (ratio > t->worst) t->worst = ratio, snprintf(t->worst_seed, sizeof t->worst_seed, "%s", seed);
    t->plans++;
    t->at_bound += p.mem.arena_bytes == p.lower_bound_bytes;
    t->sum += ratio;
    kp_mem_plan_free(&p);
}

int main(void)
{
    /* KILN_PLANNER_GRAPHS=N runs graphs 1..N; KILN_PLANNER_SEED=S runs graph S alone */
    const char *env = getenv("KILN_PLANNER_GRAPHS"), *one = getenv("KILN_PLANNER_SEED");
    uint64_t n_graphs = env && atoi(env) > 0 ? (uint64_t)atoi(env) : N_GRAPHS, first = 1;
    if (one && atoi(one) > 0) first = n_graphs = (uint64_t)atoi(one);
    tally t = {.worst = 1.0};
    int fused_groups = 0;
    printf("%6s %6s %8s %12s %12s %12s %7s  %s\n", "seed", "nodes", "tokens", "arena", "bound", "naive", "ratio",
           "strategy");
    for (uint64_t seed = first; seed <= n_graphs; seed++) {
        int64_t max_tokens = 0;
        kir_graph *g = build(seed, &max_tokens);
        char name[24];
        snprintf(name, sizeof name, "%" PRIu64, seed);
        plan_one(name, g, max_tokens, &t);
        /* the same graph fused by the pass pipeline */
        ks_buf log = {0};
        ks_diag d = {.log = &log, .quiet = 1};
        kp_options opt = {.verify = 1};
        if (CHECK_MSG(kp_run_pipeline(&g, &opt, NULL, NULL, &d) == 0, "seed %" PRIu64 ": the pass pipeline: %s", seed,
                      ks_buf_cstr(&log))) {
            for (size_t v = 0; v < g->n_nodes; v++)
                if (kir_get_int(g, (kir_val)v, "fuse", -1) >= 0) {
                    fused_groups++;
                    break;
                }
            snprintf(name, sizeof name, "%" PRIu64 "f", seed);
            plan_one(name, g, max_tokens, &t);
        }
        ks_buf_free(&log);
        kir_graph_free(g);
    }
    printf("%d plans (%d of fused graphs with groups): %d at the lower bound, mean arena/bound %.4f, worst %.4f "
           "(seed %s)\n",
           t.plans, fused_groups, t.at_bound, t.plans ? t.sum / t.plans : 0.0, t.worst, t.worst_seed);
    return check_finish("planner_random");
}
