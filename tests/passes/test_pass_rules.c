/*
 * test_pass_rules.c — the rules around the passes, with their exact
 * messages:
 *  - kir_verify on KV-cache writes, derived weights and `fuse` groups;
 *  - the pass manager: unknown pass names, disabling, lists, the hook,
 *    stats, and a graph that does not verify;
 *  - derived weights' recipes and data (kp_derive_weight);
 *  - the interpreter on kv_write + attention{write_kv=0}: the same values
 *    and cache as attention alone;
 *  - kernel counts.
 */
#include <math.h>
#include <stdlib.h>

#include "runtime/interp/interp.h"
#include "tests/check.h"
#include "tests/ir/ir_test.h"
#include "passes/derived_weight.h"
#include "ir/numerics.h"
#include "ir/plan.h"
#include "passes/pipeline.h"

#define ATT "scale=0.5, window=0, softcap=0.0"

/* ---- the verifier ----------------------------------------------------------------------- */
typedef struct verify_case {
    const char *name; /* file name given to the parser and the verifier */
    const char *text; /* IR that parses */
    int errors;       /* what kir_verify returns */
    const char *log;  /* every message */
} verify_case;

static const verify_case verify_cases[] = {
    {"kv.ir",
     "kiln-ir 1\n"
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : f32[T,8] = embed(%1, %0)\n"
     "%3  : f32[T,2,4] = reshape(%2) {shape=[T,2,4]}\n"
     "%4  : f32[T,2,4] = kv_write(%3, %3)\n"
     "%5  : f32[T,2,4] = kv_write(%3, %3) {layer=0}\n"
     "%6  : f32[T,2,4] = attention(%3, %5, %3) {layer=0, " ATT ", write_kv=0}\n"
     "%7  : f32[T,2,4] = attention(%3, %3, %3) {layer=1, " ATT ", write_kv=0}\n"
     "%8  : f32[T,2,4] = attention(%3, %3, %3) {layer=2, " ATT ", write_kv=0}\n"
     "%9  : f32[T,2,4] = kv_write(%3, %3) {layer=2}\n"
     "%10 : f32[T,2,4] = kv_write(%3, %3) {layer=3}\n"
     "%11 : f32[T,2,4] = attention(%3, %3, %3) {layer=3, " ATT "}\n"
     "%12 : f32[T,2,4] = kv_write(%3, %3) {layer=4}\n"
     "%13 : f32[T,2,4] = attention(%3, %3, %3) {layer=4, " ATT ", write_kv=0}\n"
     "%14 : f32[T,2,4] = attention(%3, %3, %3) {layer=5, " ATT ", write_kv=2}\n"
     "%15 : f32[T,2,4] = attention(%3, %3, %3) {layer=6, " ATT ", write_kv=0.0}\n"
     "%16 : f32[T,2,4] = kv_write(%3, %3) {layer=0}\n"
     "%17 : f32[T,2,4] = kv_write(%3, %2) {layer=7}\n"
     "%18 : f32[T,8] = output(%2) {name=\"logits\"}\n",
     9,
     "kv.ir: error: node %4 (kv_write): missing attribute layer (an int)\n"
        "kv.ir: error: node %14 (attention): attribute write_kv is 2; it must be 0 or 1\n"
     "kv.ir: error: node %15 (attention): attribute write_kv is a float, not an int\n"
     "kv.ir: error: node %17 (kv_write): k and v must be [T,kv_heads,head_dim] with the same heads, got f32[T,2,4] "
     "and f32[T,8]\n"
     "kv.ir: error: node %16 (kv_write): layer 0 is used by node %5 too\n"
     "kv.ir: error: node %7 (attention): write_kv=0 reads layer 1 from the KV cache, but no kv_write writes it\n"
     "kv.ir: error: node %8 (attention): write_kv=0 reads layer 2, but the kv_write that writes it (node %9) comes "
     "after it\n"
     "kv.ir: error: node %11 (attention): layer 3 is written by kv_write node %10 already; attention writes it only "
     "with write_kv=1 (absent), so set write_kv=0\n"
     "kv.ir: error: node %13 (attention): with write_kv=0, k and v are the kv_write of layer 4 (node %12) and its v "
     "(%3)\n"
     },

    {"derived.ir",
     "kiln-ir 1\n"
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : f32[T,8] = embed(%1, %0)\n"
     "%3  : f32[4,8] = weight() {name=\"a\"}\n"
     "%4  : f32[2,8] = weight() {name=\"b\"}\n"
     "%5  : f32[6,8] = weight() {name=\"a+b\", derive=\"concat0\", sources=\"a,b\", rows=[4,2]}\n"
     "%6  : f32[6,8] = weight() {name=\"x1\", derive=\"concat2\", sources=\"a,b\", rows=[4,2]}\n"
     "%7  : f32[6,8] = weight() {name=\"x2\", derive=\"concat0\", sources=\"a,b\"}\n"
     "%8  : f32[6,8] = weight() {name=\"x3\", derive=\"concat0\", sources=\"a,b,c\", rows=[4,2]}\n"
     "%9  : f32[7,8] = weight() {name=\"x4\", derive=\"concat0\", sources=\"a,b\", rows=[4,2]}\n"
     "%10 : f32[6,8] = weight() {name=\"x5\", derive=\"concat0\", sources=\"a,b\", rows=[3,3]}\n"
     "%11 : f32[6,8] = weight() {name=\"x6\", derive=\"concat0\", sources=\"a,,b\", rows=[4,0,2]}\n"
     "%12 : f32[6,8] = weight() {name=\"x7\", derive=\"concat0\", sources=\"gone,b\", rows=[4,2]}\n"
     "%13 : f16[6,8] = weight() {name=\"x8\", derive=\"concat0\", sources=\"a,b\", rows=[4,2]}\n"
     "%14 : f32[6,8] = weight() {name=\"x9\", sources=\"a,b\"}\n"
     "%15 : f32[6,8] = weight() {name=\"x10\", derive=\"concat0\", sources=\"a,,b\", rows=[4,1,1]}\n"
     "%16 : f32[6,8] = weight() {name=\"x11\", derive=\"concat0\", sources=\"a,b\", rows=4}\n"
     "%17 : f32[4,8] = weight() {name=\"x12\", derive=\"smooth\", sources=\"a\", rows=[4]}\n"
     "%18 : f32[6,8] = weight() {name=\"x13\", derive=\"smooth\", sources=\"a,b\", rows=[4,2], smooth_of=\"w\"}\n"
     "%19 : f32[T,8] = output(%2) {name=\"logits\"}\n",
     14,
     "derived.ir: error: node %6 (weight): attribute derive is \"concat2\", not \"concat0\", \"concat1\", \"offset\" or \"smooth\"\n"
     "derived.ir: error: node %16 (weight): attribute rows is an int, not a list of ints\n"
     "derived.ir: error: node %7 (weight): a derived weight needs derive, sources and rows; rows is missing\n"
     "derived.ir: error: node %8 (weight): sources names 3 weights but rows has 2 numbers\n"
     "derived.ir: error: node %9 (weight): rows add up to 6, but the weight is f32[7,8]\n"
     "derived.ir: error: node %10 (weight): source \"a\" (node %3) is f32[4,8], not 3 rows of f32[6,8]\n"
     "derived.ir: error: node %10 (weight): source \"b\" (node %4) is f32[2,8], not 3 rows of f32[6,8]\n"
     "derived.ir: error: node %11 (weight): rows[1] is 0: each source gives at least one row\n"
     "derived.ir: error: node %13 (weight): source \"a\" (node %3) is f32[4,8], not 4 rows of f16[6,8]\n"
     "derived.ir: error: node %13 (weight): source \"b\" (node %4) is f32[2,8], not 2 rows of f16[6,8]\n"
     "derived.ir: error: node %14 (weight): a derived weight needs derive, sources and rows; derive is missing\n"
     "derived.ir: error: node %15 (weight): sources \"a,,b\": name 2 is empty\n"
     "derived.ir: error: node %17 (weight): a smooth weight needs smooth_of, the quantized weight whose smoothing "
     "divides it\n"
     "derived.ir: error: node %18 (weight): a smooth weight derives from one source, not 2\n"},

    {"groups.ir",
     "kiln-ir 1\n"
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : f32[T,8] = embed(%1, %0) @\"m.kiln\":4:7\n"
     "%3  : f32[8] = weight() {name=\"n\", fuse=0}\n"
     "%4  : f32[8,8] = weight() {name=\"w\"}\n"
     "%5  : f32[T,8] = rms_norm(%2, %3) {eps=1e-05, fuse=1}\n"
     "%6  : f32[T,8] = matmul(%5, %4) {fuse=1}\n"
     "%7  : f32[T,8] = silu(%6) {fuse=1}\n"
     "%8  : f32[T,8] = matmul(%7, %4) {fuse=1} @\"m.kiln\":9:3\n"
     "%9  : f32[T,8] = relu(%8) {fuse=2}\n"
     "%10 : f32[T,8] = gelu(%8) {fuse=1}\n"
     "%11 : f32[T,8] = rms_norm(%10, %3) {eps=1e-05, fuse=3}\n"
     "%12 : f32[T,8] = matmul(%11, %4) {fuse=3}\n"
     "%13 : f32[T,8] = add(%12, %11) {fuse=3}\n"
     "%14 : f32[T,8] = matmul(%13, %4) {fuse=4}\n"
     "%15 : f32[T,8] = rms_norm(%14, %3) {eps=1e-05, fuse=4}\n"
     "%16 : f32[T,8] = add(%15, %13) {fuse=5}\n"
     "%17 : f32[T,8] = rms_norm(%16, %3) {eps=1e-05, fuse=5}\n"
     "%18 : f32[T,8] = rms_norm(%17, %3) {eps=1e-05, fuse=5}\n"
     "%19 : f32[T,2,4] = reshape(%18) {shape=[T,2,4], fuse=6}\n"
     "%20 : f32[T,2,4] = rms_norm(%19, _) {eps=1e-05, fuse=6}\n"
     "%21 : f32[T,2,4] = attention(%20, %20, %20) {layer=0, " ATT ", fuse=6}\n"
     "%22 : f32[T,8] = embed(%1, %0) {fuse=7}\n"
     "%23 : f32[T,8] = silu(%22) {fuse=-1}\n"
     "%24 : f32[T,8] = silu(%23) {fuse=\"x\"}\n"
     "%25 : f32[T,8] = output(%24) {name=\"logits\", fuse=7}\n",
     11,
     "groups.ir: error: node %23 (silu): attribute fuse is -1; it must not be negative\n"
        "groups.ir: error: node %24 (silu): attribute fuse is a string, not an int\n"
        "groups.ir: error: node %3 (weight): fuse group 0: weight cannot join a group (its fusion class in ir/ops.def "
     "is none)\n"
     "m.kiln:9:3: error: node %8 (matmul): fuse group 1 has a second matmul or attention (node %6 is its first): a "
     "kernel has one\n"
     "groups.ir: error: node %10 (gelu): fuse group 1 is not contiguous: it has nodes up to %8, then %9 is not in it\n"
     "groups.ir: error: node %11 (rms_norm): fuse group 3: a norm joins a matmul's group only as its prologue, so its "
     "one use must be matmul %12's input (it has 2 uses)\n"
     "groups.ir: error: node %15 (rms_norm): fuse group 4: a norm after the group's matmul (node %14); a norm joins "
     "only before its matmul, as a prologue\n"
     "groups.ir: error: node %18 (rms_norm): fuse group 5 has a second norm (node %17 is its first): a kernel has "
     "one\n"
     "groups.ir: error: node %20 (rms_norm): fuse group 6: a norm and an attention (node %21) cannot share a "
     "kernel\n"
     "groups.ir: error: node %22 (embed): fuse group 7: embed cannot join a group (its fusion class in ir/ops.def "
     "is none)\n"
     
     
     "groups.ir: error: node %25 (output): fuse group 7: output cannot join a group (its fusion class in ir/ops.def "
     "is none)\n"},
};

static void test_verifier(void)
{
    for (size_t i = 0; i < sizeof verify_cases / sizeof verify_cases[0]; i++) {
        const verify_case *c = &verify_cases[i];
        ks_buf log = {0};
        kir_graph *g = kt_parse(c->name, c->text, &log);
        if (!CHECK_MSG(g != NULL, "%s: does not parse:\n%s", c->name, ks_buf_cstr(&log))) {
            ks_buf_free(&log);
            continue;
        }
        ks_diag d = {.log = &log, .quiet = 1};
        int errors = kir_verify(g, &d, c->name);
        CHECK_TEXT(c->name, ks_buf_cstr(&log), c->log);
        CHECK(errors == c->errors);
        if (errors != c->errors) fprintf(stderr, "%s: %d errors, want %d\n", c->name, errors, c->errors);
        kir_graph_free(g);
        ks_buf_free(&log);
    }
}

/* ---- the pass manager --------------------------------------------------------------------- */
static const char small_graph[] =
    "kiln-ir 1\n"
    "%0 : i32[T] = input() {name=\"tokens\"}\n"
    "%1 : f32[16,8] = weight() {name=\"embed\"}\n"
    "%2 : f32[T,8] = embed(%1, %0)\n"
    "%3 : f32[4,8] = weight() {name=\"a\"}\n"
    "%4 : f32[T,4] = matmul(%2, %3)\n"
    "%5 : f32[4,8] = weight() {name=\"b\"}\n"
    "%6 : f32[T,4] = matmul(%2, %5)\n"
    "%7 : f32[T,4] = mul(%4, %6)\n"
    "%8 : f32[T,4] = output(%7) {name=\"logits\"}\n";

typedef struct hook_log {
    ks_buf names; /* passes seen, comma-separated */
    int stop_at;  /* fail at this call (1-based); 0: never */
    int calls;    /* calls so far */
} hook_log;

static int record(void *ctx, const kp_pass *pass, const kir_graph *g, const kp_pass_stats *st, ks_diag *d)
{
    hook_log *h = ctx;
    ks_buf_printf(&h->names, "%s%s:%zu", h->names.len ? "," : "", pass->name, kp_count_kernels(g));
    CHECK(st->nodes_after == g->n_nodes);
    if (++h->calls == h->stop_at) {
        ks_error(d, "hook", "stop after %s", pass->name);
        return -1;
    }
    return 0;
}

/* Run the pipeline on small_graph; returns its result, log in *log. */
static int run(const kp_options *opt, ks_buf *log, kp_pass_stats **st, size_t *n_st, kir_graph **out)
{
    kir_graph *g = kt_parse("small.ir", small_graph, log);
    KS_ASSERT(g);
    ks_diag d = {.log = log, .quiet = 1};
    int rc = kp_run_pipeline(&g, opt, st, n_st, &d);
    if (out)
        *out = g;
    else
        kir_graph_free(g);
    return rc;
}

static void test_pipeline(void)
{
    ks_buf log = {0};
    /* unknown names, in --passes and --disable-pass, with the list of passes */
    const char *bad[] = {"fuse_epilogues,fuse_qkv"};
    kp_options opt = {.passes = bad, .n_passes = 1};
    CHECK(run(&opt, &log, NULL, NULL, NULL) == -1);
    CHECK_TEXT("unknown pass", ks_buf_cstr(&log),
               "kiln: error: unknown pass 'fuse_qkv' (the passes: fuse_sibling_matmuls, quantize, share_kv, split_kv_write, "
               "fuse_epilogues, fuse_norm_prologue, fuse_add_norm, eliminate_dead_nodes, lower_precision, quantize_kv, fuse_rows, fuse_norm_rope, plan_memory)\n");
    log.len = 0;
    const char *bad_off[] = {""};
    kp_options opt2 = {.disabled = bad_off, .n_disabled = 1, .what = "kiln build"};
    CHECK(run(&opt2, &log, NULL, NULL, NULL) == -1);
    CHECK_TEXT("empty name", ks_buf_cstr(&log),
               "kiln build: error: unknown pass '' (the passes: fuse_sibling_matmuls, quantize, share_kv, split_kv_write, "
               "fuse_epilogues, fuse_norm_prologue, fuse_add_norm, eliminate_dead_nodes, lower_precision, quantize_kv, fuse_rows, fuse_norm_rope, plan_memory)\n");

    /* the whole pipeline, one pass disabled; stats and the hook */
    log.len = 0;
    hook_log h = {{0}, 0, 0};
    const char *off[] = {"fuse_add_norm", "split_kv_write"};
    kp_options opt3 = {.disabled = off, .n_disabled = 2, .verify = 1, .after = record, .after_ctx = &h};
    kp_pass_stats *st = NULL;
    size_t n_st = 0;
    kir_graph *g = NULL;
    CHECK(run(&opt3, &log, &st, &n_st, &g) == 0);
    CHECK_TEXT("hook", ks_buf_cstr(&h.names),
               "fuse_sibling_matmuls:5,quantize:5,share_kv:5,fuse_epilogues:2,fuse_norm_prologue:2,eliminate_dead_nodes:2,lower_precision:2,quantize_kv:2,fuse_rows:2,fuse_norm_rope:2,plan_memory:2");
    CHECK(n_st == 11); /* plan_memory ran, and planned nothing: no max_tokens; quantize and quantize_kv did nothing:
                          no --quant, no --kv-dtype; share_kv found no V inside a K */
    if (n_st == 11) {
        CHECK(strcmp(st[0].pass, "fuse_sibling_matmuls") == 0 && st[0].nodes_before == 9 && st[0].nodes_after == 11 &&
              st[0].kernels_before == 4 && st[0].kernels_after == 5 && st[0].fusions == 1);
        CHECK(strcmp(st[1].pass, "quantize") == 0 && st[1].fusions == 0 && st[1].nodes_after == 11);
        CHECK(strcmp(st[2].pass, "share_kv") == 0 && st[2].fusions == 0 && st[2].nodes_after == 11);
        CHECK(strcmp(st[3].pass, "fuse_epilogues") == 0 && st[3].fusions == 1 && st[3].kernels_after == 2);
        CHECK(strcmp(st[5].pass, "eliminate_dead_nodes") == 0 && st[5].nodes_before == 11 && st[5].nodes_after == 9);
    }
    ks_buf text = {0};
    kir_print(g, &text);
    CHECK_TEXT("small pipeline", ks_buf_cstr(&text),
               "kiln-ir 1\n"
               "graph \"\"\n"
               "\n"
               "%0 : i32[T] = input() {name=\"tokens\"}\n"
               "%1 : f32[16,8] = weight() {name=\"embed\"}\n"
               "%2 : f32[T,8] = embed(%1, %0)\n"
               "%3 : f32[8,8] = weight() {name=\"a+b\", derive=\"concat0\", sources=\"a,b\", rows=[4,4]}\n"
               "%4 : f32[T,8] = matmul(%2, %3) {fuse=0}\n"
               "%5 : f32[T,4] = slice(%4) {start=0, end=4, fuse=0}\n"
               "%6 : f32[T,4] = slice(%4) {start=4, end=8, fuse=0}\n"
               "%7 : f32[T,4] = mul(%5, %6) {fuse=0}\n"
               "%8 : f32[T,4] = output(%7) {name=\"logits\"}\n");
    ks_buf_free(&text);
    kir_graph_free(g);
    free(st);
    ks_buf_free(&h.names);

    /* plan_memory plans for the tokens the options give, and comes last */
    log.len = 0;
    const char *plan_then[] = {"fuse_sibling_matmuls,plan_memory"};
    kp_options opt_plan = {.passes = plan_then, .n_passes = 1, .verify = 1, .max_tokens = 4};
    CHECK(run(&opt_plan, &log, NULL, NULL, &g) == 0);
    CHECK(g && kir_has_plan(g) && kir_param_find(g, "mem.max_tokens")->i == 4);
    kir_graph_free(g);
    const char *plan_first[] = {"plan_memory,eliminate_dead_nodes"};
    kp_options opt_order = {.passes = plan_first, .n_passes = 1, .max_tokens = 4};
    CHECK(run(&opt_order, &log, NULL, NULL, NULL) == -1);
    CHECK_TEXT("plan first", ks_buf_cstr(&log),
               "kiln: error: plan_memory places the values of the final graph: it must be the last pass "
               "(eliminate_dead_nodes comes after it)\n");

    /* a list in order, a pass twice; the hook stops the run */
    log.len = 0;
    hook_log h2 = {{0}, 2, 0};
    const char *list[] = {"eliminate_dead_nodes", "fuse_sibling_matmuls,eliminate_dead_nodes"};
    kp_options opt4 = {.passes = list, .n_passes = 2, .after = record, .after_ctx = &h2};
    CHECK(run(&opt4, &log, &st, &n_st, NULL) == -1);
    CHECK_TEXT("stopped", ks_buf_cstr(&h2.names), "eliminate_dead_nodes:4,fuse_sibling_matmuls:5");
    CHECK_TEXT("stopped log", ks_buf_cstr(&log), "hook: error: stop after fuse_sibling_matmuls\n");
    CHECK(n_st == 2);
    free(st);
    ks_buf_free(&h2.names);

    /* a graph that does not verify is refused before any pass runs */
    log.len = 0;
    kir_graph *broken = kt_parse("broken.ir", "kiln-ir 1\n%0 : i32[T] = input() {name=\"tokens\"}\n", &log);
    ks_diag d = {.log = &log, .quiet = 1};
    kp_options opt5 = {.verify = 1};
    CHECK(kp_run_pipeline(&broken, &opt5, NULL, NULL, &d) == -1);
    CHECK_TEXT("broken", ks_buf_cstr(&log),
               "IR given to the passes: error: graph has no output\n"
               "kiln: error: the graph given to the passes does not verify\n");
    kir_graph_free(broken);
    CHECK(kp_pass_find("fuse_epilogues") == &kp_passes[4] && kp_pass_find("fuse") == NULL);
    ks_buf_free(&log);
}

/* ---- derived weights --------------------------------------------------------------------------- */
static void test_derived(void)
{
    ks_buf log = {0};
    kir_graph *g = kt_parse("derive.ir",
                            "kiln-ir 1\n"
                            "%0 : f16[5,2] = weight() {name=\"x+y\", derive=\"concat0\", sources=\"x,y\", rows=[2,3]}\n"
                            "%1 : f32[3] = weight() {name=\"p\", derive=\"concat0\", sources=\"p1,p2,p3\", rows=[1,1,1]}\n"
                            "%2 : f32[3] = weight() {name=\"plain\"}\n"
                            "%3 : f32[4] = weight() {name=\"bad\", derive=\"concat0\", sources=\"p1,p2\", rows=[1,1]}\n"
                            "%4 : f32[4] = weight() {name=\"bad2\", derive=\"concat0\", sources=\"p1,\", rows=[2,2]}\n",
                            &log);
    KS_ASSERT(g);
    ks_arena arena = {0};
    kp_weight_recipe r;
    CHECK(kp_weight_recipe_of(g, 0, &arena, &r) == 0 && r.n_sources == 2);
    if (r.n_sources == 2) {
        CHECK(strcmp(r.names[0], "x") == 0 && strcmp(r.names[1], "y") == 0);
        CHECK(r.rows[0] == 2 && r.rows[1] == 3 && r.bytes[0] == 8 && r.bytes[1] == 12);
        uint16_t x[4] = {1, 2, 3, 4}, y[6] = {5, 6, 7, 8, 9, 10}, out[10] = {0};
        const void *src[2] = {x, y};
        kp_derive_weight(g, 0, &r, src, out);
        for (int i = 0; i < 10; i++) CHECK(out[i] == i + 1);
    }
    CHECK(kp_weight_recipe_of(g, 1, &arena, &r) == 0 && r.n_sources == 3 && r.bytes[2] == 4);
    if (r.n_sources == 3) {
        float a = 1.5f, b = -2.0f, c = 3.25f, out[3];
        const void *src[3] = {&a, &b, &c};
        kp_derive_weight(g, 1, &r, src, out);
        CHECK(out[0] == 1.5f && out[1] == -2.0f && out[2] == 3.25f);
    }
    CHECK(kp_weight_recipe_of(g, 2, &arena, &r) == 0 && r.n_sources == 0 && !kp_weight_is_derived(g, 2));
    CHECK(kp_weight_is_derived(g, 3) && kp_weight_recipe_of(g, 3, &arena, &r) == -1);
    CHECK(kp_weight_recipe_of(g, 4, &arena, &r) == -1);
    ks_arena_free(&arena);
    kir_graph_free(g);

    /* concat1: stacked experts' rows along dim 1, expert by expert (a gate [2,1,2] and an up [2,2,2]
     * into [2,3,2]: expert 0's gate row, its two up rows, then expert 1's); rows that do not add up to
     * dim 1, and a source of another expert count, refused */
    g = kt_parse("concat1.ir",
                 "kiln-ir 1\n"
                 "%0 : f32[2,1,2] = weight() {name=\"g\"}\n"
                 "%1 : f32[2,2,2] = weight() {name=\"u\"}\n"
                 "%2 : f32[2,3,2] = weight() {name=\"g+u\", derive=\"concat1\", sources=\"g,u\", rows=[1,2]}\n",
                 &log);
    KS_ASSERT(g);
    CHECK(kp_weight_recipe_of(g, 2, &arena, &r) == 0 && r.n_sources == 2);
    if (r.n_sources == 2) {
        CHECK(r.rows[0] == 1 && r.rows[1] == 2 && r.bytes[0] == 16 && r.bytes[1] == 32);
        float gw[4] = {1, 2, 7, 8}, uw[8] = {3, 4, 5, 6, 9, 10, 11, 12}, out[12];
        const void *src[2] = {gw, uw};
        kp_derive_weight(g, 2, &r, src, out);
        for (int i = 0; i < 12; i++) CHECK(out[i] == (float)(i + 1));
    }
    ks_arena_free(&arena);
    kir_graph_free(g);
    {
        ks_buf v = {0};
        ks_diag d = {.log = &v, .quiet = 1};
        g = kt_parse("concat1bad.ir",
                     "kiln-ir 1\n"
                     "%0 : f32[3,1,2] = weight() {name=\"g\"}\n"
                     "%1 : f32[2,2,2] = weight() {name=\"u\"}\n"
                     "%2 : f32[2,3,2] = weight() {name=\"x\", derive=\"concat1\", sources=\"g,u\", rows=[1,2]}\n"
                     "%3 : f32[2,4,2] = weight() {name=\"y\", derive=\"concat1\", sources=\"u,u\", rows=[2,1]}\n",
                     &log);
        KS_ASSERT(g);
        CHECK(kp_weight_recipe_of(g, 3, &arena, &r) == -1);
        CHECK(kir_verify(g, &d, "concat1") != 0);
        CHECK(strstr(ks_buf_cstr(&v), "node %2 (weight): source \"g\" (node %0) is f32[3,1,2], not 1 rows along dim 1 of f32[2,3,2]") != NULL);
        CHECK(strstr(ks_buf_cstr(&v), "node %3 (weight): rows add up to 3, but the weight is f32[2,4,2] (concat1: rows along dim 1)") != NULL);
        ks_buf_free(&v);
        ks_arena_free(&arena);
        kir_graph_free(g);
    }

    /* offset: one source plus a number (a norm's offset:), in f32 and rounded once in bf16; two
     * sources are refused */
    g = kt_parse("offset.ir",
                 "kiln-ir 1\n"
                 "%0 : f32[3] = weight() {name=\"n+1\", derive=\"offset\", sources=\"n\", rows=[3], offset=1.0}\n"
                 "%1 : bf16[2] = weight() {name=\"m+1\", derive=\"offset\", sources=\"m\", rows=[2], offset=1.0}\n"
                 "%2 : f32[2] = weight() {name=\"two\", derive=\"offset\", sources=\"a,b\", rows=[1,1], offset=1.0}\n",
                 &log);
    KS_ASSERT(g);
    CHECK(kp_weight_recipe_of(g, 0, &arena, &r) == 0 && r.n_sources == 1 && r.bytes[0] == 12);
    if (r.n_sources == 1) {
        float n[3] = {0.25f, -1.0f, 0x1p-30f}, out[3];
        const void *src[1] = {n};
        kp_derive_weight(g, 0, &r, src, out);
        CHECK(out[0] == 1.25f && out[1] == 0.0f && out[2] == 1.0f + 0x1p-30f);
    }
    CHECK(kp_weight_recipe_of(g, 1, &arena, &r) == 0 && r.n_sources == 1 && r.bytes[0] == 4);
    if (r.n_sources == 1) {
        uint16_t m[2] = {ks_f32_to_bf16(0.5f), ks_f32_to_bf16(0.00390625f)}, out[2];
        const void *src[1] = {m};
        kp_derive_weight(g, 1, &r, src, out);
        CHECK(ks_bf16_to_f32(out[0]) == 1.5f && ks_bf16_to_f32(out[1]) == 1.0f); /* 1 + 2^-8 rounds to even: 1 */
    }
    CHECK(kp_weight_recipe_of(g, 2, &arena, &r) == -1);
    ks_buf v = {0};
    ks_diag d = {.log = &v, .quiet = 1};
    CHECK(kir_verify(g, &d, "offset") != 0 && strstr(ks_buf_cstr(&v), "an offset weight derives from one source, not 2"));
    ks_buf_free(&v);
    ks_arena_free(&arena);
    kir_graph_free(g);
    ks_buf_free(&log);
}

/* ---- the interpreter on a split write ---------------------------------------------------------- */

/* Two steps of a tiny attention graph, logits into out[0..n_out); the
 * cache's layer-0 K rows into kc. */
static int interp_run(const char *text, float *out, float *kc_rows, ks_buf *log)
{
    kir_graph *g = kt_parse("kv_interp.ir", text, log);
    if (!g) return -1;
    float embed[16 * 8];
    for (int i = 0; i < 16 * 8; i++) embed[i] = sinf((float)i * 0.7f);
    const void *w[16] = {0};
    w[1] = embed;
    ks_diag d = {.log = log, .quiet = 1};
    krt_desc desc;
    int rc = -1, described = krt_desc_init(&desc, g, "kv_interp.ir", &d) == 0;
    const krt_kv_layer *layers = described ? desc.kv_layers : NULL;
    if (described && desc.n_kv_layers == 1 && layers[0].kv_heads == 2 && layers[0].head_dim_k == 4 &&
        layers[0].head_dim_v == 4) {
        krt_kv_config cfg = {desc.n_kv_layers, layers, 4, 4, 1, 16, sizeof(float), 0};
        krt_kv *kv = krt_kv_new(&cfg, &krt_kv_host_storage, &d);
        krt_interp *it = kv ? krt_interp_new(&desc, w, kv, &d) : NULL;
        const char *why = NULL;
        if (it && krt_kv_seq_add(kv, 0, &why) == 0 && krt_kv_seq_reserve(kv, 0, 3, &why) == 0) {
            int32_t tok[3] = {3, 9, 14}, pos[3] = {0, 1, 2}, seq[3] = {0, 0, 0};
            krt_step a = {2, tok, pos, seq}, b = {1, tok + 2, pos + 2, seq};
            rc = krt_interp_step(it, &a, out, &d) || krt_interp_step(it, &b, out + 2 * 8, &d) ? -1 : 0;
            const float *kc = krt_kv_k(kv, 0);
            for (int p = 0; p < 3; p++) memcpy(kc_rows + p * 8, kc + krt_kv_slot(kv, 0, p) * 8, 8 * sizeof(float));
        }
        krt_interp_free(it);
        krt_kv_free(kv);
    }
    if (described) krt_desc_free(&desc);
    kir_graph_free(g);
    return rc;
}

static void test_interp_split(void)
{
    static const char whole[] =
        "kiln-ir 1\n"
        "%0 : i32[T] = input() {name=\"tokens\"}\n"
        "%1 : f32[16,8] = weight() {name=\"embed\"}\n"
        "%2 : f32[T,8] = embed(%1, %0)\n"
        "%3 : f32[T,2,4] = reshape(%2) {shape=[T,2,4]}\n"
        "%4 : f32[T,2,4] = silu(%3)\n"
        "%5 : f32[T,2,4] = scale(%3) {value=0.5}\n"
        "%6 : f32[T,2,4] = attention(%3, %4, %5) {layer=0, " ATT "}\n"
        "%7 : f32[T,8] = reshape(%6) {shape=[T,8]}\n"
        "%8 : f32[T,8] = output(%7) {name=\"logits\"}\n";
    static const char split[] =
        "kiln-ir 1\n"
        "%0 : i32[T] = input() {name=\"tokens\"}\n"
        "%1 : f32[16,8] = weight() {name=\"embed\"}\n"
        "%2 : f32[T,8] = embed(%1, %0)\n"
        "%3 : f32[T,2,4] = reshape(%2) {shape=[T,2,4]}\n"
        "%4 : f32[T,2,4] = silu(%3)\n"
        "%5 : f32[T,2,4] = scale(%3) {value=0.5}\n"
        "%6 : f32[T,2,4] = kv_write(%4, %5) {layer=0}\n"
        "%7 : f32[T,2,4] = attention(%3, %6, %5) {layer=0, " ATT ", write_kv=0}\n"
        "%8 : f32[T,8] = reshape(%7) {shape=[T,8]}\n"
        "%9 : f32[T,8] = output(%8) {name=\"logits\"}\n";
    ks_buf log = {0};
    float oa[24], ob[24], ka[24], kb[24];
    CHECK(interp_run(whole, oa, ka, &log) == 0);
    CHECK(interp_run(split, ob, kb, &log) == 0);
    CHECK(memcmp(oa, ob, sizeof oa) == 0);
    CHECK(memcmp(ka, kb, sizeof ka) == 0);
    /* the rows in the cache are silu of the embedding rows */
    int32_t tok[3] = {3, 9, 14};
    for (int p = 0; p < 3; p++) {
        float e = sinf((float)(tok[p] * 8 + 5) * 0.7f);
        CHECK(fabsf(kb[p * 8 + 5] - e / (1.0f + expf(-e))) < 1e-6f);
    }
    /* no cache given */
    kir_graph *g = kt_parse("nokv.ir", split, &log);
    ks_diag d = {.log = &log, .quiet = 1};
    float embed[16 * 8] = {0};
    const void *w[16] = {0};
    w[1] = embed;
    log.len = 0;
    krt_desc desc;
    CHECK(krt_desc_init(&desc, g, "nokv.ir", &d) == 0);
    CHECK(krt_interp_new(&desc, w, NULL, &d) == NULL);
    krt_desc_free(&desc);
    CHECK_TEXT("no cache", ks_buf_cstr(&log),
               "interp: error: kv_write: the graph has a kv_write but no KV cache was given\n");
    kir_graph_free(g);
    ks_buf_free(&log);
}

/* lower_precision: what a group stores or an ungrouped node computes becomes
 * bf16, and so does a norm fused as a matmul's prologue; a group's other values, the output's operand (through views) and the
 * inputs do not; views follow their operand; the KV cache is bf16. */
static const char precision_graph[] =
    "kiln-ir 1\n"
    "%0 : i32[T] = input() {name=\"tokens\"}\n"
    "%1 : f32[16,8] = weight() {name=\"embed\"}\n"
    "%2 : f32[T,8] = embed(%1, %0)\n"
    "%3 : f32[8] = weight() {name=\"norm\"}\n"
    "%4 : f32[24,8] = weight() {name=\"qkv\"}\n"
    "%5 : f32[T,8] = rms_norm(%2, %3) {eps=1e-05, fuse=0}\n"
    "%6 : f32[T,24] = matmul(%5, %4) {fuse=0}\n"
    "%7 : f32[T,8] = slice(%6) {start=0, end=8, fuse=0}\n"
    "%8 : f32[T,2,4] = reshape(%7) {shape=[T,2,4], fuse=0}\n"
    "%9 : f32[T,8] = slice(%6) {start=8, end=16, fuse=0}\n"
    "%10 : f32[T,2,4] = reshape(%9) {shape=[T,2,4], fuse=0}\n"
    "%11 : f32[T,8] = slice(%6) {start=16, end=24, fuse=0}\n"
    "%12 : f32[T,2,4] = reshape(%11) {shape=[T,2,4], fuse=0}\n"
    "%13 : f32[T,2,4] = kv_write(%10, %12) {layer=0, fuse=0}\n"
    "%14 : f32[T,2,4] = attention(%8, %13, %12) {layer=0, scale=0.5, window=0, softcap=0.0, write_kv=0}\n"
    "%15 : f32[T,8] = reshape(%14) {shape=[T,8]}\n"
    "%16 : f32[8,8] = weight() {name=\"wo\"}\n"
    "%17 : f32[T,8] = matmul(%15, %16) {fuse=1}\n"
    "%18 : f32[T,8] = add(%2, %17) {fuse=1}\n"
    "%19 : f32[16,8] = weight() {name=\"head\"}\n"
    "%20 : f32[T,16] = matmul(%18, %19)\n"
    "%21 : f32[T,2,8] = reshape(%20) {shape=[T,2,8]}\n"
    "%22 : f32[T,2,8] = output(%21) {name=\"logits\"}\n";

/* The graph of text src after lower_precision alone, in bf16 ("fast") when half, else f32; *made:
 * the values it made half (the pass's count). */
static kir_graph *lowered(const char *name, const char *src, int half, ks_buf *log, unsigned *made)
{
    const char *only[] = {"lower_precision"};
    kir_graph *g = kt_parse(name, src, log);
    KS_ASSERT(g);
    ks_diag d = {.log = log, .quiet = 1};
    kp_options opt = {.passes = only, .n_passes = 1, .verify = 1, .compute_dtype = half ? KIR_BF16 : KIR_F32};
    kp_pass_stats *st = NULL;
    size_t n_st = 0;
    CHECK(kp_run_pipeline(&g, &opt, &st, &n_st, &d) == 0 && n_st == 1);
    *made = n_st == 1 ? (unsigned)st[0].fusions : 0u;
    free(st);
    return g;
}

static void test_lower_precision(void)
{
    ks_buf log = {0}, text = {0};
    for (int half = 0; half < 2; half++) {
        unsigned made = 0;
        kir_graph *g = lowered("precision.ir", precision_graph, half, &log, &made);
        CHECK(made == (half ? 7u : 0u)); /* values made half */
        text.len = 0;
        kir_print(g, &text);
        if (!half) {
            kir_graph *orig = kt_parse("precision.ir", precision_graph, &log);
            ks_buf want = {0};
            kir_print(orig, &want);
            CHECK_TEXT("exact: untouched", ks_buf_cstr(&text), ks_buf_cstr(&want));
            ks_buf_free(&want);
            kir_graph_free(orig);
        } else {
            CHECK_TEXT("fast: bf16 between kernels", ks_buf_cstr(&text),
               "kiln-ir 1\n"
               "graph \"\"\n"
               "\n"
               "%0  : i32[T] = input() {name=\"tokens\"}\n"
               "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
               "%2  : bf16[T,8] = embed(%1, %0)\n"
               "%3  : f32[8] = weight() {name=\"norm\"}\n"
               "%4  : f32[24,8] = weight() {name=\"qkv\"}\n"
               "%5  : bf16[T,8] = rms_norm(%2, %3) {eps=1e-05, fuse=0}\n"
               "%6  : f32[T,24] = matmul(%5, %4) {fuse=0}\n"
               "%7  : bf16[T,8] = slice(%6) {start=0, end=8, fuse=0}\n"
               "%8  : bf16[T,2,4] = reshape(%7) {shape=[T,2,4], fuse=0}\n"
               "%9  : bf16[T,8] = slice(%6) {start=8, end=16, fuse=0}\n"
               "%10 : bf16[T,2,4] = reshape(%9) {shape=[T,2,4], fuse=0}\n"
               "%11 : bf16[T,8] = slice(%6) {start=16, end=24, fuse=0}\n"
               "%12 : bf16[T,2,4] = reshape(%11) {shape=[T,2,4], fuse=0}\n"
               "%13 : bf16[T,2,4] = kv_write(%10, %12) {layer=0, fuse=0, kv_dtype=\"bf16\"}\n"
               "%14 : bf16[T,2,4] = attention(%8, %13, %12) {layer=0, scale=0.5, window=0, softcap=0.0, write_kv=0, kv_dtype=\"bf16\"}\n"
               "%15 : bf16[T,8] = reshape(%14) {shape=[T,8]}\n"
               "%16 : f32[8,8] = weight() {name=\"wo\"}\n"
               "%17 : f32[T,8] = matmul(%15, %16) {fuse=1}\n"
               "%18 : bf16[T,8] = add(%2, %17) {fuse=1}\n"
               "%19 : f32[16,8] = weight() {name=\"head\"}\n"
               "%20 : f32[T,16] = matmul(%18, %19)\n"
               "%21 : f32[T,2,8] = reshape(%20) {shape=[T,2,8]}\n"
               "%22 : f32[T,2,8] = output(%21) {name=\"logits\"}\n");
        }
        kir_graph_free(g);
    }
    CHECK_TEXT("no messages", ks_buf_cstr(&log), "");
    ks_buf_free(&log);
    ks_buf_free(&text);
}

/* lower_precision: a formula op (silu) gets half_math in fast precision, in or out of a
 * group, and the interpreter then computes its float form (ir/ops.def section 4). */
static void test_half_math(void)
{
    static const char src[] = "kiln-ir 1\n"
                              "%0 : i32[T] = input() {name=\"tokens\"}\n"
                              "%1 : f32[16,8] = weight() {name=\"embed\"}\n"
                              "%2 : f32[T,8] = embed(%1, %0)\n"
                              "%3 : f32[T,8] = silu(%2)\n"
                              "%4 : f32[T,8] = output(%3) {name=\"logits\"}\n";
    ks_buf log = {0}, text = {0};
    for (int half = 0; half < 2; half++) {
        unsigned made = 0;
        kir_graph *g = lowered("half_math.ir", src, half, &log, &made);
        text.len = 0;
        kir_print(g, &text);
        CHECK_TEXT(half ? "fast: silu in float" : "exact: silu in double", ks_buf_cstr(&text),
                   half ? "kiln-ir 1\n"
                          "graph \"\"\n"
                          "\n"
                          "%0 : i32[T] = input() {name=\"tokens\"}\n"
                          "%1 : f32[16,8] = weight() {name=\"embed\"}\n"
                          "%2 : bf16[T,8] = embed(%1, %0)\n"
                          "%3 : f32[T,8] = silu(%2) {half_math=1}\n"
                          "%4 : f32[T,8] = output(%3) {name=\"logits\"}\n"
                        : "kiln-ir 1\n"
                          "graph \"\"\n"
                          "\n"
                          "%0 : i32[T] = input() {name=\"tokens\"}\n"
                          "%1 : f32[16,8] = weight() {name=\"embed\"}\n"
                          "%2 : f32[T,8] = embed(%1, %0)\n"
                          "%3 : f32[T,8] = silu(%2)\n"
                          "%4 : f32[T,8] = output(%3) {name=\"logits\"}\n");
        kir_graph_free(g);
    }
    /* the interpreter's kernels are ir/ops.def's two forms: double, and float for half_math */
    const float x = -3.7f;
    CHECK(kir_unary_SILU(x) == (float)((double)x / (1.0 + exp(-(double)x))));
    CHECK(kir_unary_half_SILU(x) == x / (1.0f + expf(-x)));
    CHECK_TEXT("no messages", ks_buf_cstr(&log), "");
    ks_buf_free(&log);
    ks_buf_free(&text);
}

/* lower_precision: float32(x) (keep_f32) keeps x, and what is computed from such values alone (a
 * sigmoid of it, a sum with another kept value, a gather by i32 indices), f32 and in their f32 forms
 * (no half_math); a value that also reads a half one (the add of the embedding) goes half. */
static void test_keep_f32(void)
{
    static const char src[] = "kiln-ir 1\n"
                              "%0 : i32[T] = input() {name=\"tokens\"}\n"
                              "%1 : f32[16,8] = weight() {name=\"embed\"}\n"
                              "%2 : f32[T,8] = embed(%1, %0)\n"
                              "%3 : f32[8,8] = weight() {name=\"router\"}\n"
                              "%4 : f32[T,8] = matmul(%2, %3) {keep_f32=1}\n"
                              "%5 : f32[T,8] = sigmoid(%4)\n"
                              "%6 : f32[T,8] = add(%5, %4)\n"
                              "%7 : i32[T,2] = topk(%6) {k=2}\n"
                              "%8 : f32[T,2] = gather(%6, %7)\n"
                              "%9 : f32[T,8] = add(%2, %6)\n"
                              "%10 : f32[T,8] = mul(%9, %9)\n"
                              "%11 : f32[T,2] = scale(%8) {value=2.0}\n"
                              "%12 : f32[T,10] = concat(%10, %11)\n"
                              "%13 : f32[T,10] = output(%12) {name=\"logits\"}\n";
    ks_buf log = {0}, text = {0};
    unsigned made = 0;
    kir_graph *g = lowered("keep_f32.ir", src, 1, &log, &made);
    kir_print(g, &text);
    CHECK_TEXT("fast: the router's values f32", ks_buf_cstr(&text),
               "kiln-ir 1\n"
               "graph \"\"\n"
               "\n"
               "%0  : i32[T] = input() {name=\"tokens\"}\n"
               "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
               "%2  : bf16[T,8] = embed(%1, %0)\n"
               "%3  : f32[8,8] = weight() {name=\"router\"}\n"
               "%4  : f32[T,8] = matmul(%2, %3) {keep_f32=1}\n"
               "%5  : f32[T,8] = sigmoid(%4)\n"
               "%6  : f32[T,8] = add(%5, %4)\n"
               "%7  : i32[T,2] = topk(%6) {k=2}\n"
               "%8  : f32[T,2] = gather(%6, %7)\n"
               "%9  : bf16[T,8] = add(%2, %6)\n"
               "%10 : bf16[T,8] = mul(%9, %9)\n"
               "%11 : f32[T,2] = scale(%8) {value=2.0}\n"
               "%12 : f32[T,10] = concat(%10, %11)\n"
               "%13 : f32[T,10] = output(%12) {name=\"logits\"}\n");
    kir_graph_free(g);
    CHECK_TEXT("no messages", ks_buf_cstr(&log), "");
    ks_buf_free(&log);
    ks_buf_free(&text);
}

int main(void)
{
    test_verifier();
    test_pipeline();
    test_derived();
    test_interp_split();
    test_lower_precision();
    test_half_math();
    test_keep_f32();
    return check_finish("test_pass_rules");
}
