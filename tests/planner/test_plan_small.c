/*
 * test_plan_small.c — the memory planner on small hand-built graphs, with
 * the slots, live ranges, bounds and offsets worked out by hand in the
 * comments; the checker on broken plans, with its exact messages; the
 * planner's errors; and the annotations in the IR text.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/plan_memory.h"
#include "tests/planner/graph_build.h"

static int failures;

#define EXPECT(cond)                                                                    \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "%s:%d: FAILED: %s\n", __FILE__, __LINE__, #cond);          \
            failures++;                                                                 \
        }                                                                               \
    } while (0)

static void expect_u64(const char *what, uint64_t got, uint64_t want, int line)
{
    if (got == want) return;
    fprintf(stderr, "%s:%d: FAILED: %s is %" PRIu64 ", expected %" PRIu64 "\n", __FILE__, line, what, got, want);
    failures++;
}
#define EXPECT_U64(what, got, want) expect_u64(what, got, want, __LINE__)

static void expect_str(const char *got, const char *want, int line)
{
    if (strcmp(got, want) == 0) return;
    fprintf(stderr, "%s:%d: FAILED:\n  got:      %s\n  expected: %s\n", __FILE__, line, got, want);
    failures++;
}
#define EXPECT_STR(got, want) expect_str(got, want, __LINE__)

/* What a test expects of each node: offset (KP_MEM_NONE for weights), bytes
 * and flags. */
typedef struct want_node {
    uint64_t offset; /* expected offset */
    uint64_t bytes;  /* expected bytes */
    uint8_t flags;   /* expected KP_MEM_* */
} want_node;

#define W_ {KP_MEM_NONE, 0, 0} /* a weight */

static void print_figures(const char *name, const kp_mem_plan *p)
{
    printf("%-10s arena %" PRIu64 " B, lower bound %" PRIu64 " B, naive %" PRIu64 " B, %zu slots, %s\n", name,
           p->arena_bytes, p->lower_bound_bytes, p->naive_bytes, p->n_buffers, p->strategy);
}

/* Plan g, check the plan, and compare it with the expectations. */
static void expect_plan(const char *name, const kir_graph *g, int64_t max_tokens, const want_node *want, size_t n_want,
                        uint64_t arena, uint64_t lower_bound, uint64_t naive, const char *strategy)
{
    ks_diag d = {0};
    kp_mem_plan p;
    EXPECT(kp_plan_memory(g, max_tokens, &p, &d) == 0);
    print_figures(name, &p);
    ks_buf why = {0};
    if (kp_mem_plan_check(g, &p, &why) != 0) {
        fprintf(stderr, "%s: FAILED: plan check: %s\n", name, ks_buf_cstr(&why));
        failures++;
    }
    ks_buf_free(&why);
    EXPECT(n_want == g->n_nodes && p.n_nodes == g->n_nodes);
    for (size_t v = 0; v < n_want && v < p.n_nodes; v++) {
        if (p.offset[v] != want[v].offset || p.bytes[v] != want[v].bytes || p.flags[v] != want[v].flags) {
            fprintf(stderr,
                    "%s: FAILED: %%%zu: offset %" PRIu64 " bytes %" PRIu64 " flags %u, expected offset %" PRIu64
                    " bytes %" PRIu64 " flags %u\n",
                    name, v, p.offset[v], p.bytes[v], p.flags[v], want[v].offset, want[v].bytes, want[v].flags);
            failures++;
        }
    }
    EXPECT_U64("arena_bytes", p.arena_bytes, arena);
    EXPECT_U64("lower_bound_bytes", p.lower_bound_bytes, lower_bound);
    EXPECT_U64("naive_bytes", p.naive_bytes, naive);
    EXPECT_STR(p.strategy, strategy);
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
        {0, 64, 0},   W_, {512, 256, 0}, W_, {768, 256, 0}, W_, {0, 512, 0}, {0, 512, KP_MEM_INPLACE}, W_,
        {768, 256, 0}, {512, 256, KP_MEM_INPLACE}, {512, 256, KP_MEM_ALIAS},
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
        {256, 64, 0}, W_, {0, 256, 0}, {256, 256, 0}, {256, 256, KP_MEM_INPLACE}, {256, 256, KP_MEM_ALIAS},
    };
    expect_plan("reuse", g, 4, want, sizeof want / sizeof want[0], 512, 512, 832, "size/best-fit");
    kir_graph_free(g);
}

/* An attention block at T=8, hidden 32, 4 heads, 2 KV heads, head_dim 8:
 * views of q, k, v; rope overwrites q and k through their views; the
 * residual add overwrites x. */
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
     * X x+add+output (1024, 3-20), Q q+view+rope (1024, 5-15), K (512, 7-15),
     * V v+view (512, 9-15), S attention+view (1024, 15-18: the view is read
     * at %18), O (1024, 18-19).
     * Load peaks at %15: X+Q+K+V+S = 4096, the bound. Naive: 64*2 + 1024*6
     * (x q rope attention o add) + 512*3 (k v rope) = 7808.
     * Greedy by size (X Q S O K V P A): X 0, Q 1024, S 2048, O into the gap
     * at 1024 (Q is dead by %18), K 3072, V 3584, P into the gap at 2048 (S
     * comes after P dies), A into the gap at 1024 (Q comes after A dies). */
    const want_node want[] = {
        {1024, 64, 0},                      /* %0 tokens */
        {2048, 64, 0},                      /* %1 positions */
        W_, {0, 1024, 0},                   /* %3 x */
        W_, {1024, 1024, 0},                /* %5 q */
        W_, {3072, 512, 0},                 /* %7 k */
        W_, {3584, 512, 0},                 /* %9 v */
        {1024, 1024, KP_MEM_ALIAS},         /* %10 */
        {3072, 512, KP_MEM_ALIAS},          /* %11 */
        {3584, 512, KP_MEM_ALIAS},          /* %12 */
        {1024, 1024, KP_MEM_INPLACE},       /* %13 rope q */
        {3072, 512, KP_MEM_INPLACE},        /* %14 rope k */
        {2048, 1024, 0},                    /* %15 attention */
        {2048, 1024, KP_MEM_ALIAS},         /* %16 */
        W_, {1024, 1024, 0},                /* %18 o */
        {0, 1024, KP_MEM_INPLACE},          /* %19 add */
        {0, 1024, KP_MEM_ALIAS},            /* %20 output */
    };
    expect_plan("attention", g, 8, want, sizeof want / sizeof want[0], 4096, 4096, 7808, "size/best-fit");
    kir_graph_free(g);
}

/* ---- the checker on broken plans ------------------------------------------------------- */

typedef void (*breaker)(kp_mem_plan *p);

static void overlap_live(kp_mem_plan *p) { p->offset[9] = 0; }
static void drop_in_place(kp_mem_plan *p)
{
    p->flags[7] = 0;
    p->share[7] = KIR_NONE;
}
static void norm_in_place(kp_mem_plan *p)
{
    p->flags[4] = KP_MEM_INPLACE;
    p->share[4] = 2;
}
static void output_copies(kp_mem_plan *p)
{
    p->flags[11] = 0;
    p->share[11] = KIR_NONE;
}
static void wrong_bytes(kp_mem_plan *p) { p->bytes[9] = 128; }
static void misaligned(kp_mem_plan *p) { p->offset[4] = 100; }
static void past_end(kp_mem_plan *p) { p->offset[4] = 1024; }
static void weight_placed(kp_mem_plan *p) { p->offset[1] = 0; }
static void view_elsewhere(kp_mem_plan *p) { p->offset[11] = 768; }
static void short_plan(kp_mem_plan *p) { p->n_nodes--; }

static void expect_check_fails(const char *name, kir_graph *g, int64_t max_tokens, breaker brk, const char *message)
{
    ks_diag d = {0};
    kp_mem_plan p;
    EXPECT(kp_plan_memory(g, max_tokens, &p, &d) == 0);
    size_t n = p.n_nodes;
    brk(&p);
    ks_buf why = {0};
    int rc = kp_mem_plan_check(g, &p, &why);
    printf("check %-14s -> %s\n", name, rc ? ks_buf_cstr(&why) : "(accepted)");
    EXPECT(rc == -1);
    EXPECT_STR(why.len ? ks_buf_cstr(&why) : "", message);
    ks_buf_free(&why);
    p.n_nodes = n;
    kp_mem_plan_free(&p);
}

/* The reuse graph with silu forced over x, which mul still reads. */
static void test_check_in_place_over_live(void)
{
    kir_graph *g = build_reuse();
    ks_diag d = {0};
    kp_mem_plan p;
    EXPECT(kp_plan_memory(g, 4, &p, &d) == 0);
    for (kir_val v = 3; v <= 5; v++) p.offset[v] = p.offset[2];
    p.flags[3] = KP_MEM_INPLACE;
    p.share[3] = 2;
    ks_buf why = {0};
    EXPECT(kp_mem_plan_check(g, &p, &why) == -1);
    printf("check %-14s -> %s\n", "over-live", ks_buf_cstr(&why));
    EXPECT_STR(ks_buf_cstr(&why), "node %3 (silu) is in place over %2, but node %2 (embed) is live until node %4");
    ks_buf_free(&why);
    kp_mem_plan_free(&p);
    kir_graph_free(g);
}

static void test_checker(void)
{
    kir_graph *g = build_mlp();
    expect_check_fails("overlap", g, 4, overlap_live,
                       "node %7 (silu) and node %9 (matmul) share bytes [0,256) while both are live at node %9");
    expect_check_fails("not-in-place", g, 4, drop_in_place,
                       "node %6 (matmul) and node %7 (silu) share bytes [0,512) while both are live at node %7");
    expect_check_fails("norm-in-place", g, 4, norm_in_place,
                       "node %4 (rms_norm) is marked in place, but rms_norm is not elementwise");
    expect_check_fails("output-copy", g, 4, output_copies, "node %11 (output) is a view but does not alias its operand");
    expect_check_fails("bytes", g, 4, wrong_bytes, "node %9 (matmul) has 128 bytes; f32[T,16] at max_tokens 4 needs 256");
    expect_check_fails("misaligned", g, 4, misaligned, "node %4 (rms_norm) at offset 100, not a multiple of 64");
    expect_check_fails("past-end", g, 4, past_end,
                       "node %4 (rms_norm) at bytes [1024,1280) ends past the arena of 1024 bytes");
    expect_check_fails("weight", g, 4, weight_placed, "node %1 (weight) has a place in the arena; weights have none");
    expect_check_fails("view-moved", g, 4, view_elsewhere,
                       "node %11 (output) is a view of %10 but at bytes [768,1024), not [512,768)");
    expect_check_fails("short", g, 4, short_plan, "the plan covers 11 nodes, the graph has 12");
    kir_graph_free(g);
    test_check_in_place_over_live();
}

/* ---- errors and annotations ---------------------------------------------------------- */

static void test_errors(void)
{
    kir_graph *g = build_reuse();
    ks_buf log = {0};
    ks_diag d = {.log = &log, .quiet = 1};
    kp_mem_plan p;
    EXPECT(kp_plan_memory(g, 0, &p, &d) == -1);
    EXPECT_STR(ks_buf_cstr(&log), "reuse: error: memory plan: max_tokens must be at least 1, got 0\n");
    kp_mem_plan_free(&p);

    /* 2^36 tokens: the i32 tokens take 2^38 bytes, every f32[T,16] 2^42 */
    log.len = 0;
    d.errors = 0;
    EXPECT(kp_plan_memory(g, (int64_t)1 << 36, &p, &d) == -1);
    EXPECT(d.errors == 4);
    EXPECT_STR(ks_buf_cstr(&log),
               "planner-test:1:1: error: node %2 (embed): f32[T,16] needs more than 2^40 bytes at max_tokens "
               "68719476736: too large to plan\n"
               "planner-test:1:1: error: node %3 (silu): f32[T,16] needs more than 2^40 bytes at max_tokens "
               "68719476736: too large to plan\n"
               "planner-test:1:1: error: node %4 (mul): f32[T,16] needs more than 2^40 bytes at max_tokens "
               "68719476736: too large to plan\n"
               "planner-test:1:1: error: node %5 (output): f32[T,16] needs more than 2^40 bytes at max_tokens "
               "68719476736: too large to plan\n");
    EXPECT(p.n_nodes == 0 && p.offset == NULL);
    kp_mem_plan_free(&p);
    ks_buf_free(&log);
    kir_graph_free(g);
}

/* The plan in the IR text: every planned node carries its place. */
static void test_annotate(void)
{
    kir_graph *g = build_reuse();
    ks_diag d = {0};
    kp_mem_plan p;
    EXPECT(kp_plan_memory(g, 4, &p, &d) == 0);
    kp_plan_annotate(g, &p);
    kp_mem_plan_free(&p);
    ks_buf text = {0};
    kir_print(g, &text);
    printf("%s", ks_buf_cstr(&text));
    EXPECT_STR(ks_buf_cstr(&text),
               "kiln-ir 1\n"
               "graph \"reuse\"\n"
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
    EXPECT(kir_verify(g, &vd, "annotated") == 0);
    ks_source src = {"annotated.ir", text.data, text.len};
    kir_graph *back = kir_parse(&src, &vd);
    EXPECT(back != NULL);
    if (back) {
        EXPECT(kir_get_int(back, 4, "mem.offset", -1) == 256);
        EXPECT(kir_get_int(back, 4, "mem.inplace", 0) == 1);
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
    const want_node want[] = {{0, 64, 0}, W_, {64, 64, 0}, {64, 64, KP_MEM_ALIAS}};
    expect_plan("trivial", b.g, 1, want, 4, 128, 128, 128, "size/best-fit");
    kir_graph_free(b.g);
}

/* Which ops the planner lets write over their first operand, and which it
 * treats as views: the interpreter and every backend must agree. */
static void test_op_classes(void)
{
    ks_buf in_place = {0}, views = {0};
    for (int op = 0; op < KIR_OP_COUNT; op++) {
        if (kp_op_in_place((kir_op)op)) ks_buf_printf(&in_place, " %s", kir_op_table[op].name);
        if (kp_op_is_view((kir_op)op)) ks_buf_printf(&views, " %s", kir_op_table[op].name);
    }
    printf("in place:%s\nviews:%s\n", ks_buf_cstr(&in_place), ks_buf_cstr(&views));
    EXPECT_STR(ks_buf_cstr(&in_place), " add sub mul scale silu gelu gelu_tanh relu rope");
    EXPECT_STR(ks_buf_cstr(&views), " reshape output");
    ks_buf_free(&in_place);
    ks_buf_free(&views);
}

int main(void)
{
    test_op_classes();
    test_mlp();
    test_reuse();
    test_attention();
    test_trivial();
    test_checker();
    test_errors();
    test_annotate();
    if (failures) {
        fprintf(stderr, "%d failure(s)\n", failures);
        return 1;
    }
    printf("all planner tests passed\n");
    return 0;
}
