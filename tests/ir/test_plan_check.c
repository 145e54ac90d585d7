/*
 * test_plan_check.c — the memory plan a graph carries, through kir_verify:
 * IR text with a plan in, kir_verify's messages out, exactly. Each case is
 * one of two sound plans (a kernel per node; a `fuse` group) with one edit,
 * as a user would make it in a dump before kiln build --from-ir.
 */
#include <stdlib.h>

#include "tests/check.h"
#include "tests/ir/ir_test.h"
#include "ir/plan.h"

/* An MLP block at T=4, hidden 16, ffn 32, a kernel per node, as the planner
 * places it: tokens (0-2) at 0, x+add+output at 512, h at 768 until %6,
 * u+silu at 0 from %6 (silu overwrites u, its only use), d at 768 from %9
 * (h is dead by then), the add over x (read last there). */
static const char mlp[] =
    "kiln-ir 1\n"
    "graph \"mlp\"\n"
    "param mem.max_tokens = 4\n"
    "param mem.arena_bytes = 1024\n"
    "param mem.lower_bound_bytes = 1024\n"
    "param mem.naive_bytes = 2112\n"
    "%0 : i32[T] = input() {name=\"tokens\", mem.offset=0, mem.bytes=64}\n"
    "%1 : f32[100,16] = weight() {name=\"embed\"}\n"
    "%2 : f32[T,16] = embed(%1, %0) {mem.offset=512, mem.bytes=256} @\"mlp.kiln\":3:9\n"
    "%3 : f32[16] = weight() {name=\"norm\"}\n"
    "%4 : f32[T,16] = rms_norm(%2, %3) {eps=1e-05, mem.offset=768, mem.bytes=256} @\"mlp.kiln\":4:9\n"
    "%5 : f32[32,16] = weight() {name=\"up\"}\n"
    "%6 : f32[T,32] = matmul(%4, %5) {mem.offset=0, mem.bytes=512} @\"mlp.kiln\":5:9\n"
    "%7 : f32[T,32] = silu(%6) {mem.offset=0, mem.bytes=512, mem.inplace=1} @\"mlp.kiln\":6:9\n"
    "%8 : f32[16,32] = weight() {name=\"down\"}\n"
    "%9 : f32[T,16] = matmul(%7, %8) {mem.offset=768, mem.bytes=256} @\"mlp.kiln\":7:9\n"
    "%10 : f32[T,16] = add(%2, %9) {mem.offset=512, mem.bytes=256, mem.inplace=1} @\"mlp.kiln\":8:5\n"
    "%11 : f32[T,16] = output(%10) {name=\"logits\", mem.offset=512, mem.bytes=256, mem.alias=1}\n";

/* A norm, its matmul and the residual add as one kernel (fuse=0, nodes %5
 * to %7): every value of the group is live from %5 to %7, and the add may
 * not overwrite x, which the norm of the same kernel reads. */
static const char fused[] =
    "kiln-ir 1\n"
    "graph \"prologue\"\n"
    "param mem.max_tokens = 4\n"
    "param mem.arena_bytes = 1024\n"
    "%0 : i32[T] = input() {name=\"tokens\", mem.offset=256, mem.bytes=64}\n"
    "%1 : f32[100,16] = weight() {name=\"embed\"}\n"
    "%2 : f32[T,16] = embed(%1, %0) {mem.offset=0, mem.bytes=256}\n"
    "%3 : f32[16] = weight() {name=\"norm\"}\n"
    "%4 : f32[16,16] = weight() {name=\"w\"}\n"
    "%5 : f32[T,16] = rms_norm(%2, %3) {eps=1e-05, fuse=0, mem.offset=512, mem.bytes=256}\n"
    "%6 : f32[T,16] = matmul(%5, %4) {fuse=0, mem.offset=768, mem.bytes=256}\n"
    "%7 : f32[T,16] = add(%2, %6) {fuse=0, mem.offset=256, mem.bytes=256}\n"
    "%8 : f32[T,16] = output(%7) {name=\"logits\", mem.offset=256, mem.bytes=256, mem.alias=1}\n";

typedef struct plan_case {
    const char *name; /* `what` given to kir_verify, and the file name to parse */
    const char *base; /* mlp or fused */
    const char *from; /* text of base to replace (NULL: none) */
    const char *to;   /* what replaces it */
    const char *log;  /* every message kir_verify writes ("" when it accepts) */
} plan_case;

static const plan_case cases[] = {
    {"mlp.ir", mlp, NULL, NULL, ""},
    {"fused.ir", fused, NULL, NULL, ""},

    /* where values are */
    {"past-arena.ir", mlp, "matmul(%7, %8) {mem.offset=768", "matmul(%7, %8) {mem.offset=1024",
     "mlp.kiln:7:9: error: node %9 (matmul): mem.offset 1024 + 256 bytes at 4 tokens is past mem.arena_bytes 1024\n"},
    {"straddles.ir", mlp, "rms_norm(%2, %3) {eps=1e-05, mem.offset=768", "rms_norm(%2, %3) {eps=1e-05, mem.offset=896",
     "mlp.kiln:4:9: error: node %4 (rms_norm): mem.offset 896 + 256 bytes at 4 tokens is past mem.arena_bytes 1024\n"},
    {"huge-offset.ir", mlp, "matmul(%4, %5) {mem.offset=0", "matmul(%4, %5) {mem.offset=9223372036854775744",
     "mlp.kiln:5:9: error: node %6 (matmul): mem.offset 9223372036854775744 + 512 bytes at 4 tokens is past "
     "mem.arena_bytes 1024\n"},
    {"misaligned.ir", mlp, "rms_norm(%2, %3) {eps=1e-05, mem.offset=768", "rms_norm(%2, %3) {eps=1e-05, mem.offset=100",
     "mlp.kiln:4:9: error: node %4 (rms_norm): mem.offset 100 is not a multiple of 64\n"},
    {"no-place.ir", mlp, "rms_norm(%2, %3) {eps=1e-05, mem.offset=768, mem.bytes=256}",
     "rms_norm(%2, %3) {eps=1e-05}",
     "mlp.kiln:4:9: error: node %4 (rms_norm): no place in the arena (no mem.offset)\n"},
    {"input-no-place.ir", mlp, "{name=\"tokens\", mem.offset=0, mem.bytes=64}", "{name=\"tokens\"}",
     "input-no-place.ir: error: node %0 (input): no place in the arena (no mem.offset)\n"},
    {"weight-placed.ir", mlp, "{name=\"up\"}", "{name=\"up\", mem.offset=0}",
     "weight-placed.ir: error: node %5 (weight): has a place in the arena; weights have none\n"},
    {"bytes.ir", mlp, "matmul(%7, %8) {mem.offset=768, mem.bytes=256", "matmul(%7, %8) {mem.offset=768, mem.bytes=128",
     "mlp.kiln:7:9: error: node %9 (matmul): mem.bytes 128, but f32[T,16] at 4 tokens takes 256\n"},
    {"no-bytes.ir", mlp, "matmul(%7, %8) {mem.offset=768, mem.bytes=256}", "matmul(%7, %8) {mem.offset=768}", ""},

    /* two live values in one place */
    {"overlap.ir", mlp, "matmul(%7, %8) {mem.offset=768", "matmul(%7, %8) {mem.offset=0",
     "mlp.kiln:7:9: error: node %9 (matmul): shares bytes [0,256) with node %7 (silu), and both are live at node %9\n"},
    {"overlap-part.ir", mlp, "matmul(%7, %8) {mem.offset=768", "matmul(%7, %8) {mem.offset=384",
     "mlp.kiln:7:9: error: node %9 (matmul): shares bytes [512,640) with node %2 (embed), and both are live at node "
     "%9\n"},
    {"overlap-input.ir", mlp, "{name=\"tokens\", mem.offset=0", "{name=\"tokens\", mem.offset=512",
     "mlp.kiln:3:9: error: node %2 (embed): shares bytes [512,576) with node %0 (input), and both are live at node "
     "%2\n"},
    {"not-in-place.ir", mlp, "{mem.offset=0, mem.bytes=512, mem.inplace=1}", "{mem.offset=0, mem.bytes=512}",
     "mlp.kiln:6:9: error: node %7 (silu): shares bytes [0,512) with node %6 (matmul), and both are live at node %7\n"},
    {"group-live.ir", fused, "add(%2, %6) {fuse=0, mem.offset=256, mem.bytes=256}\n%8 : f32[T,16] = output(%7) "
     "{name=\"logits\", mem.offset=256", "add(%2, %6) {fuse=0, mem.offset=512, mem.bytes=256}\n%8 : f32[T,16] = "
     "output(%7) {name=\"logits\", mem.offset=512",
     "group-live.ir: error: node %7 (add): shares bytes [512,768) with node %5 (rms_norm), and both are live at node "
     "%5\n"},

    /* what may share */
    {"norm-in-place.ir", mlp, "{eps=1e-05, mem.offset=768, mem.bytes=256}",
     "{eps=1e-05, mem.offset=512, mem.bytes=256, mem.inplace=1}",
     "mlp.kiln:4:9: error: node %4 (rms_norm): marked in place, but rms_norm is not elementwise\n"},
    {"in-place-over-live.ir", mlp, "matmul(%7, %8)", "matmul(%6, %8)",
     "mlp.kiln:6:9: error: node %7 (silu): in place over %6, but node %6 (matmul) is live until node %9\n"},
    {"view-not-alias.ir", mlp, "mem.bytes=256, mem.alias=1}", "mem.bytes=256}",
     "view-not-alias.ir: error: node %11 (output): a view, but it does not alias its operand (no mem.alias)\n"},
    {"alias-not-view.ir", mlp, "matmul(%4, %5) {mem.offset=0, mem.bytes=512}",
     "matmul(%4, %5) {mem.offset=0, mem.bytes=512, mem.alias=1}",
     "mlp.kiln:5:9: error: node %6 (matmul): aliases its operand (mem.alias), but matmul is not a view\n"},
    {"view-moved.ir", mlp, "{name=\"logits\", mem.offset=512", "{name=\"logits\", mem.offset=768",
     "view-moved.ir: error: node %11 (output): a view of %10, so at its bytes [512,768), but at [768,1024)\n"},
    {"in-place-in-group.ir", fused, "add(%2, %6) {fuse=0, mem.offset=256, mem.bytes=256}\n%8 : f32[T,16] = "
     "output(%7) {name=\"logits\", mem.offset=256", "add(%2, %6) {fuse=0, mem.offset=0, mem.bytes=256, "
     "mem.inplace=1}\n%8 : f32[T,16] = output(%7) {name=\"logits\", mem.offset=0",
     "in-place-in-group.ir: error: node %7 (add): in place over %2, but node %5 (rms_norm) of its fuse group (nodes "
     "%5 to %7, one kernel whose blocks run in no order) reads %2, written before the group\n"},

    /* the params */
    {"no-arena.ir", mlp, "param mem.arena_bytes = 1024\n", "",
     "no-arena.ir: error: the graph carries a memory plan but no param mem.arena_bytes (a plan needs mem.max_tokens "
     "and mem.arena_bytes)\n"},
    {"no-params.ir", mlp,
     "param mem.max_tokens = 4\nparam mem.arena_bytes = 1024\nparam mem.lower_bound_bytes = 1024\n"
     "param mem.naive_bytes = 2112\n",
     "",
     "no-params.ir: error: the graph carries a memory plan but no param mem.max_tokens (a plan needs mem.max_tokens "
     "and mem.arena_bytes)\n"},
    {"zero-tokens.ir", mlp, "param mem.max_tokens = 4", "param mem.max_tokens = 0",
     "zero-tokens.ir: error: param mem.max_tokens is 0; a plan is made for 1 to 16777216 tokens\n"},
    {"many-tokens.ir", mlp, "param mem.max_tokens = 4", "param mem.max_tokens = 16777217",
     "many-tokens.ir: error: param mem.max_tokens is 16777217; a plan is made for 1 to 16777216 tokens\n"},
    {"negative-arena.ir", mlp, "param mem.arena_bytes = 1024", "param mem.arena_bytes = -1024",
     "negative-arena.ir: error: param mem.arena_bytes is -1024; an arena has 1 to 281474976710656 bytes\n"},
    {"huge-arena.ir", mlp, "param mem.arena_bytes = 1024", "param mem.arena_bytes = 562949953421312",
     "huge-arena.ir: error: param mem.arena_bytes is 562949953421312; an arena has 1 to 281474976710656 bytes\n"},
    {"arena-below-bound.ir", mlp, "param mem.arena_bytes = 1024", "param mem.arena_bytes = 960",
     "arena-below-bound.ir: error: param mem.lower_bound_bytes is 1024, not between 0 and mem.arena_bytes 960: no "
     "plan fits below its lower bound\n"},
    {"arena-above-naive.ir", mlp, "param mem.naive_bytes = 2112", "param mem.naive_bytes = 1000",
     "arena-above-naive.ir: error: param mem.naive_bytes is 1000, less than mem.arena_bytes 1024: a plan never needs "
     "more than every value apart\n"},
    {"roomy-arena.ir", mlp, "param mem.arena_bytes = 1024", "param mem.arena_bytes = 2048", ""},
    {"string-param.ir", mlp, "param mem.arena_bytes = 1024", "param mem.arena_bytes = \"1024\"",
     "string-param.ir: error: param mem.arena_bytes is a string; it is a count (an int)\n"},
    {"unknown-param.ir", mlp, "param mem.naive_bytes", "param mem.naive",
     "unknown-param.ir: error: param mem.naive is not a memory plan param (those are mem.max_tokens, "
     "mem.arena_bytes, mem.lower_bound_bytes, mem.naive_bytes)\n"},

    /* the attributes */
    {"misspelt.ir", mlp, "matmul(%7, %8) {mem.offset=768", "matmul(%7, %8) {mem.ofset=768",
     "mlp.kiln:7:9: error: node %9 (matmul): unknown attribute mem.ofset (ir/ops.def lists what matmul takes)\n"},
    {"float-offset.ir", mlp, "matmul(%7, %8) {mem.offset=768", "matmul(%7, %8) {mem.offset=768.0",
     "mlp.kiln:7:9: error: node %9 (matmul): attribute mem.offset is a float, not an int\n"},
    {"negative-offset.ir", mlp, "matmul(%7, %8) {mem.offset=768", "matmul(%7, %8) {mem.offset=-256",
     "mlp.kiln:7:9: error: node %9 (matmul): attribute mem.offset is -256; it must not be negative\n"},
    {"alias-2.ir", mlp, "mem.alias=1", "mem.alias=2",
     "alias-2.ir: error: node %11 (output): attribute mem.alias is 2; it must be 0 or 1\n"},
    {"plan-without-params.ir", mlp,
     "param mem.max_tokens = 4\nparam mem.arena_bytes = 1024\nparam mem.lower_bound_bytes = 1024\n"
     "param mem.naive_bytes = 2112\n",
     "param mem.max_tokens = 4\n",
     "plan-without-params.ir: error: the graph carries a memory plan but no param mem.arena_bytes (a plan needs "
     "mem.max_tokens and mem.arena_bytes)\n"},

    /* a graph whose structure is wrong is not checked for its plan: the
     * checker needs operands, types and groups it can trust */
    {"structure-first.ir", mlp, "%10 : f32[T,16] = add(%2, %9)", "%10 : f32[T,8] = add(%2, %9)",
     "mlp.kiln:8:5: error: node %10 (add): declared f32[T,8] but operands give f32[T,16]\n"
     "structure-first.ir: error: node %11 (output): declared f32[T,16] but operands give f32[T,8]\n"},
};

/* base with its one edit. */
static char *edited(const plan_case *c)
{
    ks_buf b = {0};
    const char *at = c->from ? strstr(c->base, c->from) : NULL;
    if (c->from) CHECK_MSG(at != NULL, "%s: the text to edit is not in the base", c->name);
    if (!at) {
        ks_buf_puts(&b, c->base);
    } else {
        ks_buf_put(&b, c->base, (size_t)(at - c->base));
        ks_buf_puts(&b, c->to);
        ks_buf_puts(&b, at + strlen(c->from));
    }
    char *text = ks_xstrdup(ks_buf_cstr(&b));
    ks_buf_free(&b);
    return text;
}

static void run_case(const plan_case *c)
{
    char *text = edited(c);
    ks_buf log = {0};
    kir_graph *g = kt_parse(c->name, text, &log);
    if (CHECK_MSG(g != NULL, "%s: does not parse:\n%s", c->name, ks_buf_cstr(&log))) {
        ks_diag d = {.log = &log, .quiet = 1};
        int errors = kir_verify(g, &d, c->name);
        CHECK(errors == d.errors);
        CHECK((errors == 0) == (c->log[0] == 0));
        CHECK_TEXT(c->name, ks_buf_cstr(&log), c->log);
    }
    kir_graph_free(g);
    ks_buf_free(&log);
    free(text);
}

/* kir_plan_read gives what the text says, sizes left out being the type's. */
static void test_read(void)
{
    plan_case c = {"read.ir", mlp, "matmul(%7, %8) {mem.offset=768, mem.bytes=256}", "matmul(%7, %8) {mem.offset=768}",
                   ""};
    char *text = edited(&c);
    ks_buf log = {0};
    kir_graph *g = kt_parse(c.name, text, &log);
    CHECK(g != NULL);
    if (g) {
        ks_diag d = {.log = &log, .quiet = 1};
        kir_mem_plan p;
        CHECK(kir_has_plan(g));
        CHECK(kir_plan_read(g, &p, &d, c.name) == 1);
        CHECK(p.max_tokens == 4 && p.arena_bytes == 1024 && p.n_nodes == 12);
        CHECK(p.offset[9] == 768 && p.bytes[9] == 256 && p.flags[9] == 0 && p.share[9] == KIR_NONE);
        CHECK(p.offset[7] == 0 && p.flags[7] == KIR_MEM_INPLACE && p.share[7] == 6);
        CHECK(p.offset[11] == 512 && p.flags[11] == KIR_MEM_ALIAS && p.share[11] == 10);
        CHECK(p.offset[1] == KIR_MEM_NONE && p.bytes[1] == 0);
        kir_mem_plan_free(&p);
        /* dropped, the graph has no plan and still verifies */
        kir_graph *h = kir_graph_clone(g);
        kir_plan_drop(h);
        CHECK(!kir_has_plan(h));
        CHECK(kir_plan_read(h, &p, &d, c.name) == 0);
        CHECK(kir_verify(h, &d, c.name) == 0);
        CHECK(h->n_params == 0 && h->nodes[9].nattrs == 0 && h->nodes[11].nattrs == 1);
        kir_graph_free(h);
        CHECK_TEXT("read", ks_buf_cstr(&log), "");
    }
    kir_graph_free(g);
    ks_buf_free(&log);
    free(text);
}

int main(void)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
    test_read();
    return check_finish("test_plan_check");
}
