/*
 * test_plan_small.c — the memory planner on small hand-built graphs, with
 * the slots, live ranges, bounds and offsets worked out by hand in the
 * comments, node by node and with `fuse` groups (one kernel each, its nodes
 * live together, in place only where one thread reads and writes the same
 * element); the checker on broken plans, with its exact messages; the
 * planner's errors; and the annotations in the IR text.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/plan_memory.h"
#include "tests/check.h"
#include "tests/graph_build.h"

/* What a test expects of each node: offset (KIR_MEM_NONE for weights), bytes
 * and flags. */
typedef struct want_node {
    uint64_t offset; /* expected offset */
    uint64_t bytes;  /* expected bytes */
    uint8_t flags;   /* expected KIR_MEM_* */
} want_node;

#define W_ {KIR_MEM_NONE, 0, 0} /* a weight */

static void print_figures(const char *name, const kp_mem_plan *p)
{
    printf("%-10s arena %" PRIu64 " B, lower bound %" PRIu64 " B, naive %" PRIu64 " B, %zu slots, %s\n", name,
           p->mem.arena_bytes, p->lower_bound_bytes, p->naive_bytes, p->n_buffers, p->strategy);
}

/* Plan g, check the plan, and compare it with the expectations. */
static void expect_plan(const char *name, const kir_graph *g, int64_t max_tokens, const want_node *want, size_t n_want,
                        uint64_t arena, uint64_t lower_bound, uint64_t naive, const char *strategy)
{
    ks_diag d = {0};
    kp_mem_plan p;
    CHECK(kp_plan_memory(g, max_tokens, &p, &d) == 0);
    print_figures(name, &p);
    ks_buf why = {0};
    CHECK_MSG(kir_plan_check(g, &p.mem, &why, NULL) == 0, "%s: plan check: %s", name, ks_buf_cstr(&why));
    ks_buf_free(&why);
    CHECK(n_want == g->n_nodes && p.mem.n_nodes == g->n_nodes);
    for (size_t v = 0; v < n_want && v < p.mem.n_nodes; v++) {
        check_at(p.mem.offset[v] == want[v].offset && p.mem.bytes[v] == want[v].bytes && p.mem.flags[v] == want[v].flags,
                 __FILE__, __LINE__,
                 "%s: %%%zu: offset %" PRIu64 " bytes %" PRIu64 " flags %u, expected offset %" PRIu64
                 " bytes %" PRIu64 " flags %u",
                 name, v, p.mem.offset[v], p.mem.bytes[v], p.mem.flags[v], want[v].offset, want[v].bytes, want[v].flags);
    }
    CHECK_U64(p.mem.arena_bytes, arena);
    CHECK_U64(p.lower_bound_bytes, lower_bound);
    CHECK_U64(p.naive_bytes, naive);
    CHECK_STR(p.strategy, strategy);
    kp_mem_plan_free(&p);
}

/* ---- graphs --------------------------------------------------------------------------- */

/* An MLP block at T=4, hidden 16, ffn 32:
 *   %0 tokens  %2 x=embed  %4 h=rms_norm(x)  %6 u=matmul(h)  %7 silu(u)
 *   %9 d=matmul(%7)  %10 add(x, d)  %11 output(%10)             */
static kir_graph *build_mlp(void)
{
    tb_graph b;
    tb_init(&b, "mlp");
    kir_val tok = tb_input(&b, "tokens");
    kir_val x = tb_embed(&b, tok, 100, 16);
    kir_val h = tb_norm(&b, KIR_OP_RMS_NORM, x);
    kir_val u = tb_matmul(&b, h, 32);
    kir_val s = tb_unary(&b, KIR_OP_SILU, u);
    kir_val dn = tb_matmul(&b, s, 16);
    kir_val r = tb_binary(&b, KIR_OP_ADD, x, dn);
    tb_output(&b, r);
    tb_verify(&b);
    return b.g;
}

static void test_mlp(void)
{
    kir_graph *g = build_mlp();
    /* Slots (bytes, live nodes): A tokens (64, 0-2), B x+add+output (256, 2-11),
     * C h (256, 4-6), D u+silu (512, 6-9: silu overwrites u, whose only use it
     * is), E d (256, 9-10; add overwrites x, read last there).
     * Load: 320 at %2, 512 at %4, 1024 at %6 (B+C+D), 768, 1024 at %9 (B+D+E),
     * 512, 256: the bound is 1024. Naive: 64 + 256*4 + 512*2 = 2112.
     * Greedy by size: D at 0, B above it at 512, C above both at 768, E at
     * 768 too (C is dead by %9), A into the gap below B at 0: 1024. */
    const want_node want[] = {
        {0, 64, 0},   W_, {512, 256, 0}, W_, {768, 256, 0}, W_, {0, 512, 0}, {0, 512, KIR_MEM_INPLACE}, W_,
        {768, 256, 0}, {512, 256, KIR_MEM_INPLACE}, {512, 256, KIR_MEM_ALIAS},
    };
    expect_plan("mlp", g, 4, want, sizeof want / sizeof want[0], 1024, 1024, 2112, "size/best-fit");
    kir_graph_free(g);
}

/* A value read again later is not overwritten: %3 silu(x) cannot take x's
 * bytes, as %4 reads x; %4 mul(%3, x) takes %3's, its last use. */
static kir_graph *build_reuse(void)
{
    tb_graph b;
    tb_init(&b, "reuse");
    kir_val tok = tb_input(&b, "tokens");
    kir_val x = tb_embed(&b, tok, 50, 16);
    kir_val s = tb_unary(&b, KIR_OP_SILU, x);
    kir_val m = tb_binary(&b, KIR_OP_MUL, s, x);
    tb_output(&b, m);
    tb_verify(&b);
    return b.g;
}

static void test_reuse(void)
{
    kir_graph *g = build_reuse();
    /* Slots: A tokens (64, 0-2), B x (256, 2-4), C silu+mul+output (256, 3-5).
     * Load 320, 512, 512, 256: bound 512. Naive 64 + 3*256 = 832.
     * B and C tie on size and lifetime; B starts first and goes to 0, C
     * above it; A conflicts only with B and lands above it, at 256, where C
     * lives later. */
    const want_node want[] = {
        {256, 64, 0}, W_, {0, 256, 0}, {256, 256, 0}, {256, 256, KIR_MEM_INPLACE}, {256, 256, KIR_MEM_ALIAS},
    };
    expect_plan("reuse", g, 4, want, sizeof want / sizeof want[0], 512, 512, 832, "size/best-fit");
    kir_graph_free(g);
}

/* An attention block at T=8, hidden 32, 4 heads, 2 KV heads, head_dim 8:
 * views of q, k, v; rope writes new bytes (it reads each element's
 * rotation partner, so it never runs in place); the residual add overwrites
 * x. */
static kir_graph *build_attention(void)
{
    tb_graph b;
    tb_init(&b, "attn");
    kir_val tok = tb_input(&b, "tokens");                /* %0 */
    kir_val pos = tb_input(&b, "positions");             /* %1 */
    kir_val x = tb_embed(&b, tok, 64, 32);               /* %3 */
    kir_val q = tb_matmul(&b, x, 32);                    /* %5 */
    kir_val k = tb_matmul(&b, x, 16);                    /* %7 */
    kir_val v = tb_matmul(&b, x, 16);                    /* %9 */
    const int64_t qs[] = {KIR_DIM_T, 4, 8}, ks[] = {KIR_DIM_T, 2, 8}, flat[] = {KIR_DIM_T, 32};
    kir_val q3 = tb_reshape(&b, q, 3, qs);               /* %10 */
    kir_val k3 = tb_reshape(&b, k, 3, ks);               /* %11 */
    kir_val v3 = tb_reshape(&b, v, 3, ks);               /* %12 */
    kir_val qr = tb_rope(&b, q3, pos);                   /* %13 */
    kir_val kr = tb_rope(&b, k3, pos);                   /* %14 */
    kir_val a = tb_attention(&b, qr, kr, v3);            /* %15 */
    kir_val a2 = tb_reshape(&b, a, 2, flat);             /* %16 */
    kir_val o = tb_matmul(&b, a2, 32);                   /* %18 */
    kir_val r = tb_binary(&b, KIR_OP_ADD, x, o);         /* %19 */
    tb_output(&b, r);                                    /* %20 */
    tb_verify(&b);
    return b.g;
}

static void test_attention(void)
{
    kir_graph *g = build_attention();
    /* Slots (bytes, live nodes): A tokens (64, 0-3), P positions (64, 0-14),
     * X x+add+output (1024, 3-20), Q q+view (1024, 5-13), K k+view (512,
     * 7-14), V v+view (512, 9-15), RQ rope q (1024, 13-15), RK rope k (512,
     * 14-15), S attention+view (1024, 15-18: the view is read at %18), O
     * (1024, 18-19).
     * Load peaks at %13: P+X+Q+K+V+RQ = 4160, the bound (at %15 it is
     * X+V+RQ+RK+S = 4096). Naive: 64*2 + 1024*6 (x q rope attention o add)
     * + 512*3 (k v rope) = 7808.
     * Every heuristic lands above the bound (greedy by size: X Q S O RQ ...
     * puts RQ above Q and S); the repair of the schedule order reaches it:
     * RQ at 0 (after tokens die), P 1024, X 1088, Q 2112, then RK into Q's
     * bytes (Q dies at %13), S above RK, K 3136 and V 3648; O back at 0
     * (RQ dies at %15). */
    const want_node want[] = {
        {0, 64, 0},                         /* %0 tokens */
        {1024, 64, 0},                      /* %1 positions */
        W_, {1088, 1024, 0},                /* %3 x */
        W_, {2112, 1024, 0},                /* %5 q */
        W_, {3136, 512, 0},                 /* %7 k */
        W_, {3648, 512, 0},                 /* %9 v */
        {2112, 1024, KIR_MEM_ALIAS},         /* %10 */
        {3136, 512, KIR_MEM_ALIAS},          /* %11 */
        {3648, 512, KIR_MEM_ALIAS},          /* %12 */
        {0, 1024, 0},                       /* %13 rope q */
        {2112, 512, 0},                     /* %14 rope k */
        {2624, 1024, 0},                    /* %15 attention */
        {2624, 1024, KIR_MEM_ALIAS},         /* %16 */
        W_, {0, 1024, 0},                   /* %18 o */
        {1088, 1024, KIR_MEM_INPLACE},       /* %19 add */
        {1088, 1024, KIR_MEM_ALIAS},         /* %20 output */
    };
    expect_plan("attention", g, 8, want, sizeof want / sizeof want[0], 4160, 4160, 7808, "schedule/best-fit+repair");
    kir_graph_free(g);
}

/* ---- fused kernels (`fuse` groups) ------------------------------------------------------ */

/* A norm prologue, a matmul and a residual add at T=4, hidden 16:
 *   %2 x=embed  %5 h=rms_norm(x)  %6 d=matmul(h)  %7 add(x, d)  %8 output
 * fused: %5-%7 one kernel (fuse=0). */
static kir_graph *build_prologue(int fused)
{
    tb_graph b;
    tb_init(&b, fused ? "prologue-fused" : "prologue");
    kir_val tok = tb_input(&b, "tokens");
    kir_val x = tb_embed(&b, tok, 100, 16);
    kir_val wn = tb_weight(&b, 1, 16, 0), wm = tb_weight(&b, 2, 16, 16);
    kir_val h = tb_rms_norm_w(&b, x, wn);
    kir_val d = tb_matmul_w(&b, h, wm);
    kir_val r = tb_binary(&b, KIR_OP_ADD, x, d);
    tb_output(&b, r);
    if (fused) tb_fuse(&b, h, 0), tb_fuse(&b, d, 0), tb_fuse(&b, r, 0);
    tb_verify(&b);
    return b.g;
}

static void test_prologue(void)
{
    /* A kernel per node: A tokens (64, 0-2), X x+add+output (256, 2-8: the
     * add overwrites x, read last there), H (256, 5-6), D (256, 6-7).
     * Load 320, 256, 256, 512, 768, 512, 256: bound 768. Naive 64 + 256*4.
     * By size: X 0, H 256, D 512, A into H's bytes (H comes after A dies). */
    kir_graph *g = build_prologue(0);
    const want_node plain[] = {
        {256, 64, 0}, W_, {0, 256, 0}, W_, W_, {256, 256, 0}, {512, 256, 0}, {0, 256, KIR_MEM_INPLACE},
        {0, 256, KIR_MEM_ALIAS},
    };
    expect_plan("prologue", g, 4, plain, sizeof plain / sizeof plain[0], 768, 768, 1088, "size/best-fit");
    kir_graph_free(g);

    /* One kernel for %5-%7, its blocks in no order: the norm may still read
     * a row of x that the add would already have overwritten, so the add
     * gets bytes of its own; and every value of the group is live from %5
     * to %7 (x, read in the group, until %7). Slots: A (64, 0-2), X (256,
     * 2-7), H (256, 5-7), D (256, 5-7), R add+output (256, 5-8). Load 1024
     * at %5-%7: the bound. By size: X 0, R (longer) 256, H 512, D 768, A
     * into R's bytes. */
    g = build_prologue(1);
    const want_node fused[] = {
        {256, 64, 0}, W_, {0, 256, 0}, W_, W_, {512, 256, 0}, {768, 256, 0}, {256, 256, 0},
        {256, 256, KIR_MEM_ALIAS},
    };
    expect_plan("prologue-fused", g, 4, fused, sizeof fused / sizeof fused[0], 1024, 1024, 1088, "size/best-fit");
    kir_graph_free(g);
}

/* Two fused kernels at T=4, hidden 16:
 *   %5 m=matmul(x)  %6 a=scale(m)  %7 mul(m, a)      fuse=0
 *   %8 d=matmul(%7) %9 add(x, d)                     fuse=1
 *   %10 output */
static kir_graph *build_epilogues(void)
{
    tb_graph b;
    tb_init(&b, "epilogues");
    kir_val tok = tb_input(&b, "tokens");
    kir_val x = tb_embed(&b, tok, 100, 16);
    kir_val w0 = tb_weight(&b, 2, 16, 16), w1 = tb_weight(&b, 2, 16, 16);
    kir_val m = tb_matmul_w(&b, x, w0);
    kir_val a = tb_unary(&b, KIR_OP_SCALE, m);
    kir_val mm = tb_binary(&b, KIR_OP_MUL, m, a);
    kir_val d = tb_matmul_w(&b, mm, w1);
    kir_val r = tb_binary(&b, KIR_OP_ADD, x, d);
    tb_output(&b, r);
    tb_fuse(&b, m, 0), tb_fuse(&b, a, 0), tb_fuse(&b, mm, 0);
    tb_fuse(&b, d, 1), tb_fuse(&b, r, 1);
    tb_verify(&b);
    return b.g;
}

static void test_epilogues(void)
{
    kir_graph *g = build_epilogues();
    /* In place where one thread reads and writes the same element: the mul
     * over m (m is the group's own value: the scale read it before, and a
     * fused kernel never reads it back from memory); the residual add over
     * x (read in an earlier kernel; in its own group only by the add).
     * Slots: A tokens (64, 0-2), X x+add+output (256, 2-10), M m+mul (256,
     * 5-9: the mul is read by group 1, %8-%9), S scale (256, 5-7), D (256,
     * 8-9). Load 768 at %5-%9: the bound. Naive 64 + 256*6 = 1600.
     * By size: X 0, M 256, S 512, D into S's bytes (S is dead by %8), A
     * into M's. */
    const want_node want[] = {
        {256, 64, 0}, W_, {0, 256, 0}, W_, W_, {256, 256, 0}, {512, 256, 0}, {256, 256, KIR_MEM_INPLACE},
        {512, 256, 0}, {0, 256, KIR_MEM_INPLACE}, {0, 256, KIR_MEM_ALIAS},
    };
    expect_plan("epilogues", g, 4, want, sizeof want / sizeof want[0], 768, 768, 1600, "size/best-fit");
    kir_graph_free(g);
}

/* The attention half of a Llama layer as the passes fuse it, at T=4,
 * hidden 16, 2 heads, 1 KV head, head_dim 8:
 *   %6 h=rms_norm(x)  %7 qkv=matmul(h)  %8-%13 slices q k v and their views
 *   %14 rope(q)  %15 rope(k)  %16 kv_write(%15, v)               fuse=0
 *   %17 attention(%14, %16, v){write_kv=0}  %18 view
 *   %20 o=matmul(%18)  %21 add(x, o)                            fuse=1
 *   %22 output */
static kir_graph *build_qkv(void)
{
    tb_graph b;
    tb_init(&b, "qkv");
    kir_val tok = tb_input(&b, "tokens");                    /* %0 */
    kir_val pos = tb_input(&b, "positions");                 /* %1 */
    kir_val x = tb_embed(&b, tok, 100, 16);                  /* %3 */
    kir_val wn = tb_weight(&b, 1, 16, 0);                    /* %4 */
    kir_val wqkv = tb_weight(&b, 2, 32, 16);                 /* %5 */
    kir_val h = tb_rms_norm_w(&b, x, wn);                    /* %6 */
    kir_val qkv = tb_matmul_w(&b, h, wqkv);                  /* %7 */
    const int64_t qs[] = {KIR_DIM_T, 2, 8}, ks[] = {KIR_DIM_T, 1, 8}, flat[] = {KIR_DIM_T, 16};
    kir_val q = tb_reshape(&b, tb_slice(&b, qkv, 0, 16), 3, qs);   /* %8, %9 */
    kir_val k = tb_reshape(&b, tb_slice(&b, qkv, 16, 24), 3, ks);  /* %10, %11 */
    kir_val v = tb_reshape(&b, tb_slice(&b, qkv, 24, 32), 3, ks);  /* %12, %13 */
    kir_val qr = tb_rope(&b, q, pos);                        /* %14 */
    kir_val kr = tb_rope(&b, k, pos);                        /* %15 */
    kir_val kw = tb_kv_write(&b, kr, v);                     /* %16 */
    kir_val a = tb_attention_cached(&b, qr, kw, v);          /* %17 */
    kir_val a2 = tb_reshape(&b, a, 2, flat);                 /* %18 */
    kir_val wo = tb_weight(&b, 2, 16, 16);                   /* %19 */
    kir_val o = tb_matmul_w(&b, a2, wo);                     /* %20 */
    kir_val r = tb_binary(&b, KIR_OP_ADD, x, o);             /* %21 */
    tb_output(&b, r);                                        /* %22 */
    for (kir_val v2 = h; v2 <= kw; v2++) tb_fuse(&b, v2, 0);
    tb_fuse(&b, o, 1), tb_fuse(&b, r, 1);
    tb_verify(&b);
    return b.g;
}

static void test_qkv(void)
{
    kir_graph *g = build_qkv();
    /* Group 0 (%6-%16) is live at once: P positions (64, 0-16), X (256,
     * 3-21), H (256), QKV (512), Q q+view (256), K k+view (128), V v+view
     * (128, to %17), RQ (256, to %17), RK rope k+kv_write (128, to %17: the
     * kv_write is a view, its value k passed through). Load there: 64 + 256
     * + 256 + 512 + 256 + 128 + 128 + 256 + 128 = 1984, the bound; then S
     * attention+view (256, 17-21) and O (256, 20-21). Naive: 64*2 + 256*7
     * (x h q rope-q attention o add) + 512 + 128*3 (k v rope-k) = 2816.
     * Neither rope is in place; the add is, over x.
     * By size (QKV X RQ H Q S O V RK K P A): QKV 0, X 512, RQ 768, H 1024,
     * Q 1280; S into QKV's bytes (dead by %17), O above S; V, RK, K above
     * Q; positions on top; tokens at 0, before QKV. */
    const want_node want[] = {
        {0, 64, 0},                         /* %0 tokens */
        {1920, 64, 0},                      /* %1 positions */
        W_, {512, 256, 0},                  /* %3 x */
        W_, W_, {1024, 256, 0},             /* %6 h */
        {0, 512, 0},                        /* %7 qkv */
        {1280, 256, 0},                     /* %8 q */
        {1280, 256, KIR_MEM_ALIAS},          /* %9 */
        {1792, 128, 0},                     /* %10 k */
        {1792, 128, KIR_MEM_ALIAS},          /* %11 */
        {1536, 128, 0},                     /* %12 v */
        {1536, 128, KIR_MEM_ALIAS},          /* %13 */
        {768, 256, 0},                      /* %14 rope q */
        {1664, 128, 0},                     /* %15 rope k */
        {1664, 128, KIR_MEM_ALIAS},          /* %16 kv_write */
        {0, 256, 0},                        /* %17 attention */
        {0, 256, KIR_MEM_ALIAS},             /* %18 */
        W_, {256, 256, 0},                  /* %20 o */
        {512, 256, KIR_MEM_INPLACE},         /* %21 add */
        {512, 256, KIR_MEM_ALIAS},           /* %22 output */
    };
    expect_plan("qkv", g, 4, want, sizeof want / sizeof want[0], 1984, 1984, 2816, "size/best-fit");
    kir_graph_free(g);
}

/* ---- the checker on broken plans ------------------------------------------------------- */

typedef void (*breaker)(kir_mem_plan *p);

static void overlap_live(kir_mem_plan *p) { p->offset[9] = 0; }
static void drop_in_place(kir_mem_plan *p)
{
    p->flags[7] = 0;
    p->share[7] = KIR_NONE;
}
static void norm_in_place(kir_mem_plan *p)
{
    p->flags[4] = KIR_MEM_INPLACE;
    p->share[4] = 2;
}
static void output_copies(kir_mem_plan *p)
{
    p->flags[11] = 0;
    p->share[11] = KIR_NONE;
}
static void wrong_bytes(kir_mem_plan *p) { p->bytes[9] = 128; }
static void misaligned(kir_mem_plan *p) { p->offset[4] = 100; }
static void past_end(kir_mem_plan *p) { p->offset[4] = 1024; }
static void weight_placed(kir_mem_plan *p) { p->offset[1] = 0; }
static void view_elsewhere(kir_mem_plan *p) { p->offset[11] = 768; }
static void short_plan(kir_mem_plan *p) { p->n_nodes--; }

static void expect_check_fails(const char *name, kir_graph *g, int64_t max_tokens, breaker brk, const char *message)
{
    ks_diag d = {0};
    kp_mem_plan p;
    CHECK(kp_plan_memory(g, max_tokens, &p, &d) == 0);
    size_t n = p.mem.n_nodes;
    brk(&p.mem);
    ks_buf why = {0};
    int rc = kir_plan_check(g, &p.mem, &why, NULL);
    printf("check %-14s -> %s\n", name, rc ? ks_buf_cstr(&why) : "(accepted)");
    CHECK(rc == -1);
    CHECK_STR(why.len ? ks_buf_cstr(&why) : "", message);
    ks_buf_free(&why);
    p.mem.n_nodes = n;
    kp_mem_plan_free(&p);
}

/* The reuse graph with silu forced over x, which mul still reads. */
static void test_check_in_place_over_live(void)
{
    kir_graph *g = build_reuse();
    ks_diag d = {0};
    kp_mem_plan p;
    CHECK(kp_plan_memory(g, 4, &p, &d) == 0);
    for (kir_val v = 3; v <= 5; v++) p.mem.offset[v] = p.mem.offset[2];
    p.mem.flags[3] = KIR_MEM_INPLACE;
    p.mem.share[3] = 2;
    ks_buf why = {0};
    CHECK(kir_plan_check(g, &p.mem, &why, NULL) == -1);
    printf("check %-14s -> %s\n", "over-live", ks_buf_cstr(&why));
    CHECK_STR(ks_buf_cstr(&why), "node %3 (silu): in place over %2, but node %2 (embed) is live until node %4");
    ks_buf_free(&why);
    kp_mem_plan_free(&p);
    kir_graph_free(g);
}

static void rope_in_place(kir_mem_plan *p)
{
    p->flags[15] = KIR_MEM_INPLACE;
    p->share[15] = 11;
    p->offset[15] = p->offset[16] = p->offset[11];
}
/* the add and its output over the norm's bytes: disjoint live ranges node
 * by node (%5-%6 and %7-%8), not in one kernel */
static void add_over_norm(kir_mem_plan *p) { p->offset[7] = p->offset[8] = p->offset[5]; }

/* A plan made node by node is wrong for the fused kernel: the add writes
 * over x, which the group's norm reads. */
static void test_check_groups(void)
{
    kir_graph *plain = build_prologue(0), *fused = build_prologue(1);
    ks_diag d = {0};
    kp_mem_plan p;
    CHECK(kp_plan_memory(plain, 4, &p, &d) == 0);
    ks_buf why = {0};
    CHECK(kir_plan_check(plain, &p.mem, &why, NULL) == 0);
    CHECK(kir_plan_check(fused, &p.mem, &why, NULL) == -1);
    printf("check %-14s -> %s\n", "plain-as-fused", ks_buf_cstr(&why));
    CHECK_STR(ks_buf_cstr(&why), "node %7 (add): in place over %2, but node %5 (rms_norm) of its fuse group (nodes "
                                  "%5 to %7, one kernel whose blocks run in no order) reads %2, written before the "
                                  "group");
    ks_buf_free(&why);
    kp_mem_plan_free(&p);
    expect_check_fails("group-live", fused, 4, add_over_norm,
                       "node %7 (add): shares bytes [512,768) with node %5 (rms_norm), and both are live at node %5");
    kir_graph_free(plain);
    kir_graph_free(fused);

    kir_graph *g = build_qkv();
    expect_check_fails("rope-in-place", g, 4, rope_in_place,
                       "node %15 (rope): marked in place, but rope reads elements of its operand other than the one "
                       "it writes: it never runs in place");
    kir_graph_free(g);
}

static void test_checker(void)
{
    kir_graph *g = build_mlp();
    expect_check_fails("overlap", g, 4, overlap_live,
                       "node %9 (matmul): shares bytes [0,256) with node %7 (silu), and both are live at node %9");
    expect_check_fails("not-in-place", g, 4, drop_in_place,
                       "node %7 (silu): shares bytes [0,512) with node %6 (matmul), and both are live at node %7");
    expect_check_fails("norm-in-place", g, 4, norm_in_place,
                       "node %4 (rms_norm): marked in place, but rms_norm is not elementwise");
    expect_check_fails("output-copy", g, 4, output_copies, "node %11 (output): a view, but it does not alias its operand (no mem.alias)");
    expect_check_fails("bytes", g, 4, wrong_bytes, "node %9 (matmul): mem.bytes 128, but f32[T,16] at 4 tokens takes 256");
    expect_check_fails("misaligned", g, 4, misaligned, "node %4 (rms_norm): mem.offset 100 is not a multiple of 64");
    expect_check_fails("past-end", g, 4, past_end,
                       "node %4 (rms_norm): mem.offset 1024 + 256 bytes at 4 tokens is past mem.arena_bytes 1024");
    expect_check_fails("weight", g, 4, weight_placed, "node %1 (weight): has a place in the arena; weights have none");
    expect_check_fails("view-moved", g, 4, view_elsewhere,
                       "node %11 (output): a view of %10, so at its bytes [512,768), but at [768,1024)");
    expect_check_fails("short", g, 4, short_plan, "the plan covers 11 nodes, the graph has 12");
    kir_graph_free(g);
    test_check_in_place_over_live();
    test_check_groups();
}

/* ---- errors and annotations ---------------------------------------------------------- */

static void test_errors(void)
{
    kir_graph *g = build_reuse();
    ks_buf log = {0};
    ks_diag d = {.log = &log, .quiet = 1};
    kp_mem_plan p;
    CHECK(kp_plan_memory(g, 0, &p, &d) == -1);
    CHECK_STR(ks_buf_cstr(&log), "reuse: error: memory plan: max_tokens must be at least 1, got 0\n");
    kp_mem_plan_free(&p);

    log.len = 0;
    CHECK(kp_plan_memory(g, ((int64_t)1 << 24) + 1, &p, &d) == -1);
    CHECK_STR(ks_buf_cstr(&log), "reuse: error: memory plan: max_tokens must be at most 16777216, got 16777217\n");
    kp_mem_plan_free(&p);
    kir_graph_free(g);

    /* 2^24 tokens of rows of 2^17 floats: every f32[T,131072] takes 2^43 bytes */
    tb_graph b;
    tb_init(&b, "wide");
    kir_val tok = tb_input(&b, "tokens");
    kir_val x = tb_embed(&b, tok, 50, (int64_t)1 << 17);
    tb_output(&b, tb_unary(&b, KIR_OP_SILU, x));
    tb_verify(&b);
    g = b.g;
    log.len = 0;
    d.errors = 0;
    CHECK(kp_plan_memory(g, (int64_t)1 << 24, &p, &d) == -1);
    CHECK(d.errors == 3);
    CHECK_STR(ks_buf_cstr(&log),
               "planner-test:1:1: error: node %2 (embed): f32[T,131072] needs more than 2^40 bytes at max_tokens "
               "16777216: too large to plan\n"
               "planner-test:1:1: error: node %3 (silu): f32[T,131072] needs more than 2^40 bytes at max_tokens "
               "16777216: too large to plan\n"
               "planner-test:1:1: error: node %4 (output): f32[T,131072] needs more than 2^40 bytes at max_tokens "
               "16777216: too large to plan\n");
    CHECK(p.mem.n_nodes == 0 && p.mem.offset == NULL);
    kp_mem_plan_free(&p);
    ks_buf_free(&log);
    kir_graph_free(g);
}

/* The plan in the IR text: the params, and every planned node's place. */
static void test_annotate(void)
{
    kir_graph *g = build_reuse();
    ks_diag d = {0};
    kp_mem_plan p;
    CHECK(kp_plan_memory(g, 4, &p, &d) == 0);
    kp_plan_annotate(g, &p);
    kp_mem_plan_free(&p);
    ks_buf text = {0};
    kir_print(g, &text);
    printf("%s", ks_buf_cstr(&text));
    CHECK_STR(ks_buf_cstr(&text),
               "kiln-ir 1\n"
               "graph \"reuse\"\n"
               "param mem.max_tokens = 4\n"
               "param mem.arena_bytes = 512\n"
               "param mem.lower_bound_bytes = 512\n"
               "param mem.naive_bytes = 832\n"
               "\n"
               "%0 : i32[T] = input() {name=\"tokens\", mem.offset=256, mem.bytes=64} @\"planner-test\":1:1\n"
               "%1 : f32[50,16] = weight() {name=\"w0\"} @\"planner-test\":1:1\n"
               "%2 : f32[T,16] = embed(%1, %0) {mem.offset=0, mem.bytes=256} @\"planner-test\":1:1\n"
               "%3 : f32[T,16] = silu(%2) {mem.offset=256, mem.bytes=256} @\"planner-test\":1:1\n"
               "%4 : f32[T,16] = mul(%3, %2) {mem.offset=256, mem.bytes=256, mem.inplace=1} @\"planner-test\":1:1\n"
               "%5 : f32[T,16] = output(%4) {name=\"logits\", mem.offset=256, mem.bytes=256, mem.alias=1} "
               "@\"planner-test\":1:1\n");
    /* the annotated graph still verifies and reads back */
    ks_buf log = {0};
    ks_diag vd = {.log = &log, .quiet = 1};
    CHECK(kir_verify(g, &vd, "annotated") == 0);
    ks_source src = {"annotated.ir", text.data, text.len};
    kir_graph *back = kir_parse(&src, &vd);
    CHECK(back != NULL);
    if (back) {
        CHECK(kir_get_int(back, 4, "mem.offset", -1) == 256);
        CHECK(kir_get_int(back, 4, "mem.inplace", 0) == 1);
        kir_graph_free(back);
    }
    if (log.len) fprintf(stderr, "%s", ks_buf_cstr(&log));
    ks_buf_free(&log);
    ks_buf_free(&text);
    kir_graph_free(g);
}

/* A graph with no activations but an input and an output of it. */
static void test_trivial(void)
{
    tb_graph b;
    tb_init(&b, "trivial");
    kir_val tok = tb_input(&b, "tokens");
    kir_val x = tb_embed(&b, tok, 10, 16);
    tb_output(&b, x);
    /* tokens (64, 0-2) and x+output (64 at T=1, 2-3) meet at %2; tokens
     * live longer and go first */
    const want_node want[] = {{0, 64, 0}, W_, {64, 64, 0}, {64, 64, KIR_MEM_ALIAS}};
    expect_plan("trivial", b.g, 1, want, 4, 128, 128, 128, "size/best-fit");
    kir_graph_free(b.g);
}

/* Which ops the planner lets write over their first operand (not rope: it
 * reads each element's rotation partner), and which it treats as views
 * (kv_write passes k through): the interpreter and every backend must
 * agree. */
static void test_op_classes(void)
{
    ks_buf in_place = {0}, views = {0};
    for (int op = 0; op < KIR_OP_COUNT; op++) {
        if (kir_op_in_place((kir_op)op)) ks_buf_printf(&in_place, " %s", kir_op_table[op].name);
        if (kir_op_is_view((kir_op)op)) ks_buf_printf(&views, " %s", kir_op_table[op].name);
    }
    printf("in place:%s\nviews:%s\n", ks_buf_cstr(&in_place), ks_buf_cstr(&views));
    CHECK_STR(ks_buf_cstr(&in_place), " add sub mul max min div ge gt scale silu gelu gelu_tanh relu tanh exp sigmoid clamp");
    CHECK_STR(ks_buf_cstr(&views), " reshape kv_write output");
    ks_buf_free(&in_place);
    ks_buf_free(&views);
}

int main(void)
{
    test_op_classes();
    test_mlp();
    test_reuse();
    test_attention();
    test_prologue();
    test_epilogues();
    test_qkv();
    test_trivial();
    test_checker();
    test_errors();
    test_annotate();
    return check_finish("planner_small");
}
