/*
 * test_passes.c — each pass on IR text in, exact IR text out (TVM's
 * assert_structural_equal, by way of the text form, which prints a graph
 * one way only). Each case names the passes to run (a --passes list), and
 * the input and expected output both verify; the output also reads back
 * to the same text.
 */
#include <stdlib.h>

#include "passes/pipeline.h"
#include "tests/check.h"
#include "tests/ir/ir_test.h"

typedef struct pass_case {
    const char *name;   /* file name for messages */
    const char *passes; /* comma-separated, as --passes takes them; NULL: the whole pipeline */
    const char *in;     /* IR text */
    const char *want;   /* kir_print of the result */
    size_t fusions;     /* fusions the (last) pass reports */
} pass_case;

#define HEAD "kiln-ir 1\ngraph \"t\"\n\n"

static const pass_case cases[] = {
    /* Q, K and V of grouped-query attention: unequal widths (8, 4, 4). The
     * merged weight takes the first source's place; each slice stands
     * where its matmul stood, at its location. */
    {"qkv_gqa.ir", "fuse_sibling_matmuls",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : f32[T,8] = embed(%1, %0)\n"
     "%3  : f32[8,8] = weight() {name=\"a.q\"} @\"m.kiln\":3:1\n"
     "%4  : f32[T,8] = matmul(%2, %3) @\"m.kiln\":10:5\n"
     "%5  : f32[T,2,4] = reshape(%4) {shape=[T,2,4]}\n"
     "%6  : f32[4,8] = weight() {name=\"a.k\"} @\"m.kiln\":4:1\n"
     "%7  : f32[T,4] = matmul(%2, %6) @\"m.kiln\":11:5\n"
     "%8  : f32[T,1,4] = reshape(%7) {shape=[T,1,4]}\n"
     "%9  : f32[4,8] = weight() {name=\"a.v\"} @\"m.kiln\":5:1\n"
     "%10 : f32[T,4] = matmul(%2, %9) @\"m.kiln\":12:5\n"
     "%11 : f32[T,1,4] = reshape(%10) {shape=[T,1,4]}\n"
     "%12 : f32[T,2,4] = attention(%5, %8, %11) {layer=0, scale=0.5, window=0, softcap=0.0}\n"
     "%13 : f32[T,8] = reshape(%12) {shape=[T,8]}\n"
     "%14 : f32[T,8] = output(%13) {name=\"logits\"}\n",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : f32[T,8] = embed(%1, %0)\n"
     "%3  : f32[8,8] = weight() {name=\"a.q\"} @\"m.kiln\":3:1\n"
     "%4  : f32[16,8] = weight() {name=\"a.q+a.k+a.v\", derive=\"concat0\", sources=\"a.q,a.k,a.v\", rows=[8,4,4]} @\"m.kiln\":3:1\n"
     "%5  : f32[T,16] = matmul(%2, %4) @\"m.kiln\":10:5\n"
     "%6  : f32[T,8] = slice(%5) {start=0, end=8} @\"m.kiln\":10:5\n"
     "%7  : f32[T,2,4] = reshape(%6) {shape=[T,2,4]}\n"
     "%8  : f32[4,8] = weight() {name=\"a.k\"} @\"m.kiln\":4:1\n"
     "%9  : f32[T,4] = slice(%5) {start=8, end=12} @\"m.kiln\":11:5\n"
     "%10 : f32[T,1,4] = reshape(%9) {shape=[T,1,4]}\n"
     "%11 : f32[4,8] = weight() {name=\"a.v\"} @\"m.kiln\":5:1\n"
     "%12 : f32[T,4] = slice(%5) {start=12, end=16} @\"m.kiln\":12:5\n"
     "%13 : f32[T,1,4] = reshape(%12) {shape=[T,1,4]}\n"
     "%14 : f32[T,2,4] = attention(%7, %10, %13) {layer=0, scale=0.5, window=0, softcap=0.0}\n"
     "%15 : f32[T,8] = reshape(%14) {shape=[T,8]}\n"
     "%16 : f32[T,8] = output(%15) {name=\"logits\"}\n",
     1},

    /* With biases on all three: the biases merge too, and the slices
     * replace the bias adds. */
    {"qkv_bias.ir", "fuse_sibling_matmuls",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : f32[T,8] = embed(%1, %0)\n"
     "%3  : f32[8] = weight() {name=\"n\"}\n"
     "%4  : f32[T,8] = rms_norm(%2, %3) {eps=1e-05}\n"
     "%5  : f32[8,8] = weight() {name=\"a.q\"}\n"
     "%6  : f32[8] = weight() {name=\"a.q.b\"}\n"
     "%7  : f32[T,8] = matmul(%4, %5) @\"m.kiln\":10:5\n"
     "%8  : f32[T,8] = add(%7, %6) @\"m.kiln\":10:7\n"
     "%9  : f32[T,2,4] = reshape(%8) {shape=[T,2,4]}\n"
     "%10 : f32[4,8] = weight() {name=\"a.k\"}\n"
     "%11 : f32[4] = weight() {name=\"a.k.b\"}\n"
     "%12 : f32[T,4] = matmul(%4, %10) @\"m.kiln\":11:5\n"
     "%13 : f32[T,4] = add(%12, %11) @\"m.kiln\":11:7\n"
     "%14 : f32[T,1,4] = reshape(%13) {shape=[T,1,4]}\n"
     "%15 : f32[4,8] = weight() {name=\"a.v\"}\n"
     "%16 : f32[4] = weight() {name=\"a.v.b\"}\n"
     "%17 : f32[T,4] = matmul(%4, %15) @\"m.kiln\":12:5\n"
     "%18 : f32[T,4] = add(%17, %16) @\"m.kiln\":12:7\n"
     "%19 : f32[T,1,4] = reshape(%18) {shape=[T,1,4]}\n"
     "%20 : f32[T,2,4] = attention(%9, %14, %19) {layer=0, scale=0.5, window=0, softcap=0.0}\n"
     "%21 : f32[T,8] = reshape(%20) {shape=[T,8]}\n"
     "%22 : f32[T,8] = output(%21) {name=\"logits\"}\n",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : f32[T,8] = embed(%1, %0)\n"
     "%3  : f32[8] = weight() {name=\"n\"}\n"
     "%4  : f32[T,8] = rms_norm(%2, %3) {eps=1e-05}\n"
     "%5  : f32[8,8] = weight() {name=\"a.q\"}\n"
     "%6  : f32[8] = weight() {name=\"a.q.b\"}\n"
     "%7  : f32[16,8] = weight() {name=\"a.q+a.k+a.v\", derive=\"concat0\", sources=\"a.q,a.k,a.v\", rows=[8,4,4]}\n"
     "%8  : f32[T,16] = matmul(%4, %7) @\"m.kiln\":10:5\n"
     "%9  : f32[16] = weight() {name=\"a.q.b+a.k.b+a.v.b\", derive=\"concat0\", sources=\"a.q.b,a.k.b,a.v.b\", rows=[8,4,4]}\n"
     "%10 : f32[T,16] = add(%8, %9) @\"m.kiln\":10:7\n"
     "%11 : f32[T,8] = slice(%10) {start=0, end=8} @\"m.kiln\":10:7\n"
     "%12 : f32[T,2,4] = reshape(%11) {shape=[T,2,4]}\n"
     "%13 : f32[4,8] = weight() {name=\"a.k\"}\n"
     "%14 : f32[4] = weight() {name=\"a.k.b\"}\n"
     "%15 : f32[T,4] = slice(%10) {start=8, end=12} @\"m.kiln\":11:7\n"
     "%16 : f32[T,1,4] = reshape(%15) {shape=[T,1,4]}\n"
     "%17 : f32[4,8] = weight() {name=\"a.v\"}\n"
     "%18 : f32[4] = weight() {name=\"a.v.b\"}\n"
     "%19 : f32[T,4] = slice(%10) {start=12, end=16} @\"m.kiln\":12:7\n"
     "%20 : f32[T,1,4] = reshape(%19) {shape=[T,1,4]}\n"
     "%21 : f32[T,2,4] = attention(%12, %16, %20) {layer=0, scale=0.5, window=0, softcap=0.0}\n"
     "%22 : f32[T,8] = reshape(%21) {shape=[T,8]}\n"
     "%23 : f32[T,8] = output(%22) {name=\"logits\"}\n",
     1},

    /* Only siblings of one weight dtype merge; a bias only some of them
     * have stays an add after its slice; a matmul in a group stays. */
    {"siblings_mixed.ir", "fuse_sibling_matmuls",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : f32[T,8] = embed(%1, %0)\n"
     "%3  : f32[4,8] = weight() {name=\"w1\"}\n"
     "%4  : f32[T,4] = matmul(%2, %3)\n"
     "%5  : f32[4] = weight() {name=\"b1\"}\n"
     "%6  : f32[T,4] = add(%4, %5)\n"
     "%7  : f16[4,8] = weight() {name=\"w2\"}\n"
     "%8  : f32[T,4] = matmul(%2, %7)\n"
     "%9  : f32[2,8] = weight() {name=\"w3\"}\n"
     "%10 : f32[T,2] = matmul(%2, %9)\n"
     "%11 : f32[4,8] = weight() {name=\"w4\"}\n"
     "%12 : f32[T,4] = matmul(%2, %11) {fuse=0}\n"
     "%13 : f32[T,4] = silu(%12) {fuse=0}\n"
     "%14 : f32[T,4] = mul(%6, %8)\n"
     "%15 : f32[T,4] = mul(%14, %13)\n"
     "%16 : f32[T,6] = concat(%15, %10)\n"
     "%17 : f32[T,6] = output(%16) {name=\"logits\"}\n",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : f32[T,8] = embed(%1, %0)\n"
     "%3  : f32[4,8] = weight() {name=\"w1\"}\n"
     "%4  : f32[6,8] = weight() {name=\"w1+w3\", derive=\"concat0\", sources=\"w1,w3\", rows=[4,2]}\n"
     "%5  : f32[T,6] = matmul(%2, %4)\n"
     "%6  : f32[T,4] = slice(%5) {start=0, end=4}\n"
     "%7  : f32[4] = weight() {name=\"b1\"}\n"
     "%8  : f32[T,4] = add(%6, %7)\n"
     "%9  : f16[4,8] = weight() {name=\"w2\"}\n"
     "%10 : f32[T,4] = matmul(%2, %9)\n"
     "%11 : f32[2,8] = weight() {name=\"w3\"}\n"
     "%12 : f32[T,2] = slice(%5) {start=4, end=6}\n"
     "%13 : f32[4,8] = weight() {name=\"w4\"}\n"
     "%14 : f32[T,4] = matmul(%2, %13) {fuse=0}\n"
     "%15 : f32[T,4] = silu(%14) {fuse=0}\n"
     "%16 : f32[T,4] = mul(%8, %10)\n"
     "%17 : f32[T,4] = mul(%16, %15)\n"
     "%18 : f32[T,6] = concat(%17, %12)\n"
     "%19 : f32[T,6] = output(%18) {name=\"logits\"}\n",
     1},

    /* Each writing attention splits: the kv_write right after its k and v,
     * at the attention's location; inside a group's run it joins the
     * group. An attention that only reads stays. */
    {"split_kv.ir", "split_kv_write",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : f32[T,8] = embed(%1, %0)\n"
     "%3  : f32[T,2,4] = reshape(%2) {shape=[T,2,4]}\n"
     "%4  : f32[T,2,4] = scale(%3) {value=0.5}\n"
     "%5  : f32[T,2,4] = silu(%3)\n"
     "%6  : f32[T,2,4] = attention(%3, %5, %4) {layer=0, scale=0.5, window=0, softcap=0.0} @\"m.kiln\":20:3\n"
     "%7  : f32[T,2,4] = scale(%6) {value=2.0, fuse=0}\n"
     "%8  : f32[T,2,4] = silu(%7) {fuse=0}\n"
     "%9  : f32[T,2,4] = relu(%7) {fuse=0}\n"
     "%10 : f32[T,2,4] = gelu(%7) {fuse=0}\n"
     "%11 : f32[T,2,4] = attention(%10, %8, %9) {layer=1, scale=0.5, window=4, softcap=0.0, write_kv=1}\n"
     "%12 : f32[T,2,4] = kv_write(%4, %5) {layer=2}\n"
     "%13 : f32[T,2,4] = attention(%11, %12, %5) {layer=2, scale=0.5, window=0, softcap=0.0, write_kv=0}\n"
     "%14 : f32[T,8] = reshape(%13) {shape=[T,8]}\n"
     "%15 : f32[T,8] = output(%14) {name=\"logits\"}\n",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : f32[T,8] = embed(%1, %0)\n"
     "%3  : f32[T,2,4] = reshape(%2) {shape=[T,2,4]}\n"
     "%4  : f32[T,2,4] = scale(%3) {value=0.5}\n"
     "%5  : f32[T,2,4] = silu(%3)\n"
     "%6  : f32[T,2,4] = kv_write(%5, %4) {layer=0} @\"m.kiln\":20:3\n"
     "%7  : f32[T,2,4] = attention(%3, %6, %4) {layer=0, scale=0.5, window=0, softcap=0.0, write_kv=0} @\"m.kiln\":20:3\n"
     "%8  : f32[T,2,4] = scale(%7) {value=2.0, fuse=0}\n"
     "%9  : f32[T,2,4] = silu(%8) {fuse=0}\n"
     "%10 : f32[T,2,4] = relu(%8) {fuse=0}\n"
     "%11 : f32[T,2,4] = kv_write(%9, %10) {layer=1, fuse=0}\n"
     "%12 : f32[T,2,4] = gelu(%8) {fuse=0}\n"
     "%13 : f32[T,2,4] = attention(%12, %11, %10) {layer=1, scale=0.5, window=4, softcap=0.0, write_kv=0}\n"
     "%14 : f32[T,2,4] = kv_write(%4, %5) {layer=2}\n"
     "%15 : f32[T,2,4] = attention(%13, %14, %5) {layer=2, scale=0.5, window=0, softcap=0.0, write_kv=0}\n"
     "%16 : f32[T,8] = reshape(%15) {shape=[T,8]}\n"
     "%17 : f32[T,8] = output(%16) {name=\"logits\"}\n",
     2},

    /* SwiGLU after the gate and up matmuls merged: silu(slice) * slice
     * joins the matmul; the weight between them moves before the group.
     * The down matmul and the residual add make the next group; the norm
     * stops it. */
    {"swiglu.ir", "fuse_epilogues",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : f32[T,8] = embed(%1, %0)\n"
     "%3  : f32[8] = weight() {name=\"n\"}\n"
     "%4  : f32[T,8] = rms_norm(%2, %3) {eps=1e-05}\n"
     "%5  : f32[24,8] = weight() {name=\"g+u\", derive=\"concat0\", sources=\"g,u\", rows=[12,12]}\n"
     "%6  : f32[T,24] = matmul(%4, %5)\n"
     "%7  : f32[T,12] = slice(%6) {start=0, end=12}\n"
     "%8  : f32[T,12] = silu(%7)\n"
     "%9  : f32[12,8] = weight() {name=\"u\"}\n"
     "%10 : f32[T,12] = slice(%6) {start=12, end=24}\n"
     "%11 : f32[T,12] = mul(%8, %10)\n"
     "%12 : f32[8,12] = weight() {name=\"d\"}\n"
     "%13 : f32[T,8] = matmul(%11, %12)\n"
     "%14 : f32[T,8] = add(%2, %13)\n"
     "%15 : f32[T,8] = rms_norm(%14, %3) {eps=1e-05}\n"
     "%16 : f32[T,8] = output(%15) {name=\"logits\"}\n",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : f32[T,8] = embed(%1, %0)\n"
     "%3  : f32[8] = weight() {name=\"n\"}\n"
     "%4  : f32[T,8] = rms_norm(%2, %3) {eps=1e-05}\n"
     "%5  : f32[24,8] = weight() {name=\"g+u\", derive=\"concat0\", sources=\"g,u\", rows=[12,12]}\n"
     "%6  : f32[12,8] = weight() {name=\"u\"}\n"
     "%7  : f32[T,24] = matmul(%4, %5) {fuse=0}\n"
     "%8  : f32[T,12] = slice(%7) {start=0, end=12, fuse=0}\n"
     "%9  : f32[T,12] = silu(%8) {fuse=0}\n"
     "%10 : f32[T,12] = slice(%7) {start=12, end=24, fuse=0}\n"
     "%11 : f32[T,12] = mul(%9, %10) {fuse=0}\n"
     "%12 : f32[8,12] = weight() {name=\"d\"}\n"
     "%13 : f32[T,8] = matmul(%11, %12) {fuse=1}\n"
     "%14 : f32[T,8] = add(%2, %13) {fuse=1}\n"
     "%15 : f32[T,8] = rms_norm(%14, %3) {eps=1e-05}\n"
     "%16 : f32[T,8] = output(%15) {name=\"logits\"}\n",
     2},

    /* GPT-2's MLP: bias add and gelu_tanh after the first matmul; bias add
     * and the residual add after the second. */
    {"bias_gelu_residual.ir", "fuse_epilogues",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : f32[T,8] = embed(%1, %0)\n"
     "%3  : f32[8] = weight() {name=\"ln.w\"}\n"
     "%4  : f32[8] = weight() {name=\"ln.b\"}\n"
     "%5  : f32[T,8] = layer_norm(%2, %3, %4) {eps=1e-05}\n"
     "%6  : f32[32,8] = weight() {name=\"fc\"}\n"
     "%7  : f32[32] = weight() {name=\"fc.b\"}\n"
     "%8  : f32[T,32] = matmul(%5, %6)\n"
     "%9  : f32[T,32] = add(%8, %7)\n"
     "%10 : f32[T,32] = gelu_tanh(%9)\n"
     "%11 : f32[8,32] = weight() {name=\"proj\"}\n"
     "%12 : f32[8] = weight() {name=\"proj.b\"}\n"
     "%13 : f32[T,8] = matmul(%10, %11)\n"
     "%14 : f32[T,8] = add(%13, %12)\n"
     "%15 : f32[T,8] = add(%2, %14)\n"
     "%16 : f32[T,8] = output(%15) {name=\"logits\"}\n",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : f32[T,8] = embed(%1, %0)\n"
     "%3  : f32[8] = weight() {name=\"ln.w\"}\n"
     "%4  : f32[8] = weight() {name=\"ln.b\"}\n"
     "%5  : f32[T,8] = layer_norm(%2, %3, %4) {eps=1e-05}\n"
     "%6  : f32[32,8] = weight() {name=\"fc\"}\n"
     "%7  : f32[32] = weight() {name=\"fc.b\"}\n"
     "%8  : f32[T,32] = matmul(%5, %6) {fuse=0}\n"
     "%9  : f32[T,32] = add(%8, %7) {fuse=0}\n"
     "%10 : f32[T,32] = gelu_tanh(%9) {fuse=0}\n"
     "%11 : f32[8,32] = weight() {name=\"proj\"}\n"
     "%12 : f32[8] = weight() {name=\"proj.b\"}\n"
     "%13 : f32[T,8] = matmul(%10, %11) {fuse=1}\n"
     "%14 : f32[T,8] = add(%13, %12) {fuse=1}\n"
     "%15 : f32[T,8] = add(%2, %14) {fuse=1}\n"
     "%16 : f32[T,8] = output(%15) {name=\"logits\"}\n",
     2},

    /* A norm whose one use is a matmul joins it: a new group with an
     * ungrouped matmul, the group of one that opens a group. A norm with
     * two uses, or whose use is not a matmul, stays. */
    {"prologue.ir", "fuse_norm_prologue",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : f32[T,8] = embed(%1, %0)\n"
     "%3  : f32[8] = weight() {name=\"n1\"}\n"
     "%4  : f32[T,8] = rms_norm(%2, %3) {eps=1e-05}\n"
     "%5  : f32[8] = weight() {name=\"n2\"}\n"
     "%6  : f32[8,8] = weight() {name=\"w1\"}\n"
     "%7  : f32[T,8] = matmul(%4, %6)\n"
     "%8  : f32[T,8] = rms_norm(%7, %3) {eps=1e-05}\n"
     "%9  : f32[8,8] = weight() {name=\"w2\"}\n"
     "%10 : f32[T,8] = matmul(%8, %9) {fuse=0}\n"
     "%11 : f32[T,8] = silu(%10) {fuse=0}\n"
     "%12 : f32[T,8] = rms_norm(%11, %5) {eps=1e-05}\n"
     "%13 : f32[8,8] = weight() {name=\"w3\"}\n"
     "%14 : f32[T,8] = matmul(%12, %13)\n"
     "%15 : f32[T,8] = add(%14, %12)\n"
     "%16 : f32[T,8] = layer_norm(%15, _, _) {eps=1e-05}\n"
     "%17 : f32[T,8] = output(%16) {name=\"logits\"}\n",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : f32[T,8] = embed(%1, %0)\n"
     "%3  : f32[8] = weight() {name=\"n1\"}\n"
     "%4  : f32[8] = weight() {name=\"n2\"}\n"
     "%5  : f32[8,8] = weight() {name=\"w1\"}\n"
     "%6  : f32[T,8] = rms_norm(%2, %3) {eps=1e-05, fuse=0}\n"
     "%7  : f32[T,8] = matmul(%6, %5) {fuse=0}\n"
     "%8  : f32[8,8] = weight() {name=\"w2\"}\n"
     "%9  : f32[T,8] = rms_norm(%7, %3) {eps=1e-05, fuse=1}\n"
     "%10 : f32[T,8] = matmul(%9, %8) {fuse=1}\n"
     "%11 : f32[T,8] = silu(%10) {fuse=1}\n"
     "%12 : f32[T,8] = rms_norm(%11, %4) {eps=1e-05}\n"
     "%13 : f32[8,8] = weight() {name=\"w3\"}\n"
     "%14 : f32[T,8] = matmul(%12, %13)\n"
     "%15 : f32[T,8] = add(%14, %12)\n"
     "%16 : f32[T,8] = layer_norm(%15, _, _) {eps=1e-05}\n"
     "%17 : f32[T,8] = output(%16) {name=\"logits\"}\n",
     2},

    /* A residual add and the norm of the sum: the weight between them
     * moves before the add, the matmul that uses the sum after the norm. */
    {"add_norm.ir", "fuse_add_norm",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : f32[T,8] = embed(%1, %0)\n"
     "%3  : f32[8,8] = weight() {name=\"w\"}\n"
     "%4  : f32[T,8] = matmul(%2, %3)\n"
     "%5  : f32[T,8] = add(%2, %4)\n"
     "%6  : f32[8,8] = weight() {name=\"w2\"}\n"
     "%7  : f32[T,8] = matmul(%5, %6)\n"
     "%8  : f32[8] = weight() {name=\"n\"}\n"
     "%9  : f32[T,8] = rms_norm(%5, %8) {eps=1e-05}\n"
     "%10 : f32[T,8] = add(%7, %9)\n"
     "%11 : f32[T,8] = mul(%10, %9)\n"
     "%12 : f32[T,8] = output(%11) {name=\"logits\"}\n",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : f32[T,8] = embed(%1, %0)\n"
     "%3  : f32[8,8] = weight() {name=\"w\"}\n"
     "%4  : f32[T,8] = matmul(%2, %3)\n"
     "%5  : f32[8,8] = weight() {name=\"w2\"}\n"
     "%6  : f32[8] = weight() {name=\"n\"}\n"
     "%7  : f32[T,8] = add(%2, %4) {fuse=0}\n"
     "%8  : f32[T,8] = rms_norm(%7, %6) {eps=1e-05, fuse=0}\n"
     "%9  : f32[T,8] = matmul(%7, %5)\n"
     "%10 : f32[T,8] = add(%9, %8)\n"
     "%11 : f32[T,8] = mul(%10, %8)\n"
     "%12 : f32[T,8] = output(%11) {name=\"logits\"}\n",
     1},

    /* Dead weights, inputs and computations go; kv_write and a writing
     * attention stay although nothing uses them; a group left with one
     * node dissolves and the others are renumbered from 0. */
    {"dce.ir", "eliminate_dead_nodes",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : i32[T] = input() {name=\"positions\"}\n"
     "%2  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%3  : f32[T,8] = embed(%2, %0)\n"
     "%4  : f32[8,8] = weight() {name=\"unused\"}\n"
     "%5  : f32[T,2,4] = reshape(%3) {shape=[T,2,4]}\n"
     "%6  : f32[T,2,4] = silu(%5) {fuse=3}\n"
     "%7  : f32[T,2,4] = scale(%5) {value=0.5, fuse=3}\n"
     "%8  : f32[T,2,4] = kv_write(%7, %5) {layer=0}\n"
     "%9  : f32[T,2,4] = attention(%5, %8, %5) {layer=0, scale=0.5, window=0, softcap=0.0, write_kv=0}\n"
     "%10 : f32[T,2,4] = attention(%5, %5, %5) {layer=1, scale=0.5, window=0, softcap=0.0}\n"
     "%11 : f32[T,8] = relu(%3) {fuse=7}\n"
     "%12 : f32[T,8] = gelu(%11) {fuse=7}\n"
     "%13 : f32[T,8] = output(%12) {name=\"logits\"}\n",
     HEAD
     "%0 : i32[T] = input() {name=\"tokens\"}\n"
     "%1 : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2 : f32[T,8] = embed(%1, %0)\n"
     "%3 : f32[T,2,4] = reshape(%2) {shape=[T,2,4]}\n"
     "%4 : f32[T,2,4] = scale(%3) {value=0.5}\n"
     "%5 : f32[T,2,4] = kv_write(%4, %3) {layer=0}\n"
     "%6 : f32[T,2,4] = attention(%3, %3, %3) {layer=1, scale=0.5, window=0, softcap=0.0}\n"
     "%7 : f32[T,8] = relu(%2) {fuse=0}\n"
     "%8 : f32[T,8] = gelu(%7) {fuse=0}\n"
     "%9 : f32[T,8] = output(%8) {name=\"logits\"}\n",
     0},

    /* The whole pipeline over one Llama-style layer with grouped-query
     * attention and an LM head: five kernels for the layer (norm + QKV +
     * rope + kv_write, attention, output projection + residual, norm +
     * gate/up + SwiGLU, down + residual), then norm + head. */
    {"layer.ir", NULL,
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : f32[T,8] = embed(%1, %0)\n"
     "%3  : f32[8] = weight() {name=\"attn_norm\"}\n"
     "%4  : f32[T,8] = rms_norm(%2, %3) {eps=1e-05}\n"
     "%5  : f32[8,8] = weight() {name=\"wq\"}\n"
     "%6  : f32[T,8] = matmul(%4, %5)\n"
     "%7  : f32[T,2,4] = reshape(%6) {shape=[T,2,4]}\n"
     "%8  : f32[4,8] = weight() {name=\"wk\"}\n"
     "%9  : f32[T,4] = matmul(%4, %8)\n"
     "%10 : f32[T,1,4] = reshape(%9) {shape=[T,1,4]}\n"
     "%11 : f32[4,8] = weight() {name=\"wv\"}\n"
     "%12 : f32[T,4] = matmul(%4, %11)\n"
     "%13 : f32[T,1,4] = reshape(%12) {shape=[T,1,4]}\n"
     "%14 : i32[T] = input() {name=\"positions\"}\n"
     "%15 : f32[T,2,4] = rope(%7, %14) {theta=10000.0, style=\"halves\", rot_dim=4, scaling=\"none\", factor=1.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=8192}\n"
     "%16 : f32[T,1,4] = rope(%10, %14) {theta=10000.0, style=\"halves\", rot_dim=4, scaling=\"none\", factor=1.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=8192}\n"
     "%17 : f32[T,2,4] = attention(%15, %16, %13) {layer=0, scale=0.5, window=0, softcap=0.0}\n"
     "%18 : f32[T,8] = reshape(%17) {shape=[T,8]}\n"
     "%19 : f32[8,8] = weight() {name=\"wo\"}\n"
     "%20 : f32[T,8] = matmul(%18, %19)\n"
     "%21 : f32[T,8] = add(%2, %20)\n"
     "%22 : f32[8] = weight() {name=\"ffn_norm\"}\n"
     "%23 : f32[T,8] = rms_norm(%21, %22) {eps=1e-05}\n"
     "%24 : f32[12,8] = weight() {name=\"wg\"}\n"
     "%25 : f32[T,12] = matmul(%23, %24)\n"
     "%26 : f32[T,12] = silu(%25)\n"
     "%27 : f32[12,8] = weight() {name=\"wu\"}\n"
     "%28 : f32[T,12] = matmul(%23, %27)\n"
     "%29 : f32[T,12] = mul(%26, %28)\n"
     "%30 : f32[8,12] = weight() {name=\"wd\"}\n"
     "%31 : f32[T,8] = matmul(%29, %30)\n"
     "%32 : f32[T,8] = add(%21, %31)\n"
     "%33 : f32[8] = weight() {name=\"norm\"}\n"
     "%34 : f32[T,8] = rms_norm(%32, %33) {eps=1e-05}\n"
     "%35 : f32[16,8] = weight() {name=\"head\"}\n"
     "%36 : f32[T,16] = matmul(%34, %35)\n"
     "%37 : f32[T,16] = output(%36) {name=\"logits\"}\n",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : f32[T,8] = embed(%1, %0)\n"
     "%3  : f32[8] = weight() {name=\"attn_norm\"}\n"
     "%4  : f32[16,8] = weight() {name=\"wq+wk+wv\", derive=\"concat0\", sources=\"wq,wk,wv\", rows=[8,4,4]}\n"
     "%5  : i32[T] = input() {name=\"positions\"}\n"
     "%6  : f32[T,8] = rms_norm(%2, %3) {eps=1e-05, fuse=0}\n"
     "%7  : f32[T,16] = matmul(%6, %4) {fuse=0}\n"
     "%8  : f32[T,8] = slice(%7) {start=0, end=8, fuse=0}\n"
     "%9  : f32[T,2,4] = reshape(%8) {shape=[T,2,4], fuse=0}\n"
     "%10 : f32[T,4] = slice(%7) {start=8, end=12, fuse=0}\n"
     "%11 : f32[T,1,4] = reshape(%10) {shape=[T,1,4], fuse=0}\n"
     "%12 : f32[T,4] = slice(%7) {start=12, end=16, fuse=0}\n"
     "%13 : f32[T,1,4] = reshape(%12) {shape=[T,1,4], fuse=0}\n"
     "%14 : f32[T,2,4] = rope(%9, %5) {theta=10000.0, style=\"halves\", rot_dim=4, scaling=\"none\", factor=1.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=8192, fuse=0}\n"
     "%15 : f32[T,1,4] = rope(%11, %5) {theta=10000.0, style=\"halves\", rot_dim=4, scaling=\"none\", factor=1.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=8192, fuse=0}\n"
     "%16 : f32[T,1,4] = kv_write(%15, %13) {layer=0, fuse=0}\n"
     "%17 : f32[T,2,4] = attention(%14, %16, %13) {layer=0, scale=0.5, window=0, softcap=0.0, write_kv=0}\n"
     "%18 : f32[T,8] = reshape(%17) {shape=[T,8]}\n"
     "%19 : f32[8,8] = weight() {name=\"wo\"}\n"
     "%20 : f32[T,8] = matmul(%18, %19) {fuse=1}\n"
     "%21 : f32[T,8] = add(%2, %20) {fuse=1}\n"
     "%22 : f32[8] = weight() {name=\"ffn_norm\"}\n"
     "%23 : f32[24,8] = weight() {name=\"wg+wu\", derive=\"concat0\", sources=\"wg,wu\", rows=[12,12]}\n"
     "%24 : f32[T,8] = rms_norm(%21, %22) {eps=1e-05, fuse=2}\n"
     "%25 : f32[T,24] = matmul(%24, %23) {fuse=2}\n"
     "%26 : f32[T,12] = slice(%25) {start=0, end=12, fuse=2}\n"
     "%27 : f32[T,12] = silu(%26) {fuse=2}\n"
     "%28 : f32[T,12] = slice(%25) {start=12, end=24, fuse=2}\n"
     "%29 : f32[T,12] = mul(%27, %28) {fuse=2}\n"
     "%30 : f32[8,12] = weight() {name=\"wd\"}\n"
     "%31 : f32[T,8] = matmul(%29, %30) {fuse=3}\n"
     "%32 : f32[T,8] = add(%21, %31) {fuse=3}\n"
     "%33 : f32[8] = weight() {name=\"norm\"}\n"
     "%34 : f32[16,8] = weight() {name=\"head\"}\n"
     "%35 : f32[T,8] = rms_norm(%32, %33) {eps=1e-05, fuse=4}\n"
     "%36 : f32[T,16] = matmul(%35, %34) {fuse=4}\n"
     "%37 : f32[T,16] = output(%36) {name=\"logits\"}\n",
     0},

    /* Routed experts: the gate and up of one x and one idx merge along the experts' rows (concat1) and
     * slices of the last dim; one of another weight dtype, and one with a bias, stay. */
    {"experts.ir", "fuse_sibling_matmuls",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : f32[T,8] = embed(%1, %0)\n"
     "%3  : f32[4,8] = weight() {name=\"router\"}\n"
     "%4  : f32[T,4] = matmul(%2, %3)\n"
     "%5  : i32[T,2] = topk(%4) {k=2}\n"
     "%6  : f32[T,2] = gather(%4, %5)\n"
     "%7  : f32[4,6,8] = weight() {name=\"wg\"} @\"m.kiln\":3:1\n"
     "%8  : f32[T,2,6] = expert_matmul(%2, %7, %5) @\"m.kiln\":10:5\n"
     "%9  : f32[4,6,8] = weight() {name=\"wu\"} @\"m.kiln\":4:1\n"
     "%10 : f32[T,2,6] = expert_matmul(%2, %9, %5) @\"m.kiln\":10:30\n"
     "%11 : f16[4,6,8] = weight() {name=\"wh\"}\n"
     "%12 : f32[T,2,6] = expert_matmul(%2, %11, %5)\n"
     "%13 : f32[4,6] = weight() {name=\"bg\"}\n"
     "%14 : f32[T,2,6] = expert_matmul(%2, %7, %5, %13)\n"
     "%15 : f32[T,2,6] = silu(%8) @\"m.kiln\":10:1\n"
     "%16 : f32[T,2,6] = mul(%15, %10) @\"m.kiln\":10:28\n"
     "%17 : f32[T,2,6] = add(%16, %14)\n"
     "%18 : f32[T,2,6] = add(%17, %12)\n"
     "%19 : f32[T,6] = expert_sum(%18, %6)\n"
     "%20 : f32[T,6] = output(%19) {name=\"logits\"}\n",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : f32[T,8] = embed(%1, %0)\n"
     "%3  : f32[4,8] = weight() {name=\"router\"}\n"
     "%4  : f32[T,4] = matmul(%2, %3)\n"
     "%5  : i32[T,2] = topk(%4) {k=2}\n"
     "%6  : f32[T,2] = gather(%4, %5)\n"
     "%7  : f32[4,6,8] = weight() {name=\"wg\"} @\"m.kiln\":3:1\n"
     "%8  : f32[4,12,8] = weight() {name=\"wg+wu\", derive=\"concat1\", sources=\"wg,wu\", rows=[6,6]} @\"m.kiln\":3:1\n"
     "%9  : f32[T,2,12] = expert_matmul(%2, %8, %5) @\"m.kiln\":10:5\n"
     "%10 : f32[T,2,6] = slice(%9) {start=0, end=6} @\"m.kiln\":10:5\n"
     "%11 : f32[4,6,8] = weight() {name=\"wu\"} @\"m.kiln\":4:1\n"
     "%12 : f32[T,2,6] = slice(%9) {start=6, end=12} @\"m.kiln\":10:30\n"
     "%13 : f16[4,6,8] = weight() {name=\"wh\"}\n"
     "%14 : f32[T,2,6] = expert_matmul(%2, %13, %5)\n"
     "%15 : f32[4,6] = weight() {name=\"bg\"}\n"
     "%16 : f32[T,2,6] = expert_matmul(%2, %7, %5, %15)\n"
     "%17 : f32[T,2,6] = silu(%10) @\"m.kiln\":10:1\n"
     "%18 : f32[T,2,6] = mul(%17, %12) @\"m.kiln\":10:28\n"
     "%19 : f32[T,2,6] = add(%18, %16)\n"
     "%20 : f32[T,2,6] = add(%19, %14)\n"
     "%21 : f32[T,6] = expert_sum(%20, %6)\n"
     "%22 : f32[T,6] = output(%21) {name=\"logits\"}\n",
     1},

    /* A merged gate and up: the SwiGLU joins the routed expert_matmul's group; the down projection's
     * weighted sum (not elementwise) does not: it anchors a group of its own with the residual add. */
    {"experts_epilogue.ir", "fuse_epilogues",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : f32[T,8] = embed(%1, %0)\n"
     "%3  : f32[4,8] = weight() {name=\"router\"}\n"
     "%4  : f32[T,4] = matmul(%2, %3)\n"
     "%5  : i32[T,2] = topk(%4) {k=2}\n"
     "%6  : f32[T,2] = gather(%4, %5)\n"
     "%7  : f32[4,12,8] = weight() {name=\"wg+wu\", derive=\"concat1\", sources=\"wg,wu\", rows=[6,6]}\n"
     "%8  : f32[T,2,12] = expert_matmul(%2, %7, %5)\n"
     "%9  : f32[T,2,6] = slice(%8) {start=0, end=6}\n"
     "%10 : f32[T,2,6] = slice(%8) {start=6, end=12}\n"
     "%11 : f32[T,2,6] = silu(%9)\n"
     "%12 : f32[T,2,6] = mul(%11, %10)\n"
     "%13 : f32[4,8,6] = weight() {name=\"wd\"}\n"
     "%14 : f32[T,2,8] = expert_matmul(%12, %13, %5)\n"
     "%15 : f32[T,8] = expert_sum(%14, %6)\n"
     "%16 : f32[T,8] = add(%2, %15)\n"
     "%17 : f32[T,8] = output(%16) {name=\"logits\"}\n",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : f32[T,8] = embed(%1, %0)\n"
     "%3  : f32[4,8] = weight() {name=\"router\"}\n"
     "%4  : f32[T,4] = matmul(%2, %3)\n"
     "%5  : i32[T,2] = topk(%4) {k=2}\n"
     "%6  : f32[T,2] = gather(%4, %5)\n"
     "%7  : f32[4,12,8] = weight() {name=\"wg+wu\", derive=\"concat1\", sources=\"wg,wu\", rows=[6,6]}\n"
     "%8  : f32[T,2,12] = expert_matmul(%2, %7, %5) {fuse=0}\n"
     "%9  : f32[T,2,6] = slice(%8) {start=0, end=6, fuse=0}\n"
     "%10 : f32[T,2,6] = slice(%8) {start=6, end=12, fuse=0}\n"
     "%11 : f32[T,2,6] = silu(%9) {fuse=0}\n"
     "%12 : f32[T,2,6] = mul(%11, %10) {fuse=0}\n"
     "%13 : f32[4,8,6] = weight() {name=\"wd\"}\n"
     "%14 : f32[T,2,8] = expert_matmul(%12, %13, %5)\n"
     "%15 : f32[T,8] = expert_sum(%14, %6) {fuse=1}\n"
     "%16 : f32[T,8] = add(%2, %15) {fuse=1}\n"
     "%17 : f32[T,8] = output(%16) {name=\"logits\"}\n",
     2},

    /* A router's row ops after its matmul (softmax, topk, gather, sum, div) become one group, their dtypes
     * as they were; a lone softmax (one node) and a row op past KP_ROW_MAX (2048 wide) stay alone. */
    {"rows.ir", "fuse_rows",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : bf16[T,8] = embed(%1, %0)\n"
     "%3  : f32[4,8] = weight() {name=\"router\"}\n"
     "%4  : bf16[T,4] = matmul(%2, %3)\n"
     "%5  : bf16[T,4] = softmax(%4)\n"
     "%6  : i32[T,2] = topk(%5) {k=2}\n"
     "%7  : bf16[T,2] = gather(%5, %6)\n"
     "%8  : bf16[T,1] = sum(%7)\n"
     "%9  : bf16[T,2] = div(%7, %8)\n"
     "%10 : f32[2048,8] = weight() {name=\"wide\"}\n"
     "%11 : f32[T,2048] = matmul(%2, %10)\n"
     "%12 : f32[T,2048] = softmax(%11)\n"
     "%13 : f32[T,1] = sum(%12)\n"
     "%14 : f32[T,2] = mul(%9, %13)\n"
     "%15 : f32[T,2] = output(%14) {name=\"logits\"}\n",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : bf16[T,8] = embed(%1, %0)\n"
     "%3  : f32[4,8] = weight() {name=\"router\"}\n"
     "%4  : bf16[T,4] = matmul(%2, %3)\n"
     "%5  : bf16[T,4] = softmax(%4) {fuse=0}\n"
     "%6  : i32[T,2] = topk(%5) {k=2, fuse=0}\n"
     "%7  : bf16[T,2] = gather(%5, %6) {fuse=0}\n"
     "%8  : bf16[T,1] = sum(%7) {fuse=0}\n"
     "%9  : bf16[T,2] = div(%7, %8) {fuse=0}\n"
     "%10 : f32[2048,8] = weight() {name=\"wide\"}\n"
     "%11 : f32[T,2048] = matmul(%2, %10)\n"
     "%12 : f32[T,2048] = softmax(%11)\n"
     "%13 : f32[T,1] = sum(%12)\n"
     "%14 : f32[T,2] = mul(%9, %13)\n"
     "%15 : f32[T,2] = output(%14) {name=\"logits\"}\n",
     1},

    /* A norm over each head whose one use is its rotation: one group, the rope moved after its norm and
     * the positions input before it; a norm also read elsewhere stays alone. */
    {"norm_rope.ir", "fuse_norm_rope",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : f32[T,8] = embed(%1, %0)\n"
     "%3  : f32[T,2,4] = reshape(%2) {shape=[T,2,4]}\n"
     "%4  : f32[4] = weight() {name=\"qn\"}\n"
     "%5  : bf16[T,2,4] = rms_norm(%3, %4) {eps=1e-06}\n"
     "%6  : bf16[T,2,4] = rms_norm(%3, %4) {eps=1e-06}\n"
     "%7  : i32[T] = input() {name=\"positions\"}\n"
     "%8  : bf16[T,2,4] = rope(%5, %7) {theta=10000.0, style=\"halves\", rot_dim=4, scaling=\"none\", factor=1.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=8}\n"
     "%9  : bf16[T,2,4] = rope(%6, %7) {theta=10000.0, style=\"halves\", rot_dim=4, scaling=\"none\", factor=1.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=8}\n"
     "%10 : bf16[T,2,4] = add(%9, %6)\n"
     "%11 : bf16[T,2,4] = add(%8, %10)\n"
     "%12 : bf16[T,2,4] = output(%11) {name=\"logits\"}\n",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : f32[T,8] = embed(%1, %0)\n"
     "%3  : f32[T,2,4] = reshape(%2) {shape=[T,2,4]}\n"
     "%4  : f32[4] = weight() {name=\"qn\"}\n"
     "%5  : i32[T] = input() {name=\"positions\"}\n"
     "%6  : bf16[T,2,4] = rms_norm(%3, %4) {eps=1e-06, fuse=0}\n"
     "%7  : bf16[T,2,4] = rope(%6, %5) {theta=10000.0, style=\"halves\", rot_dim=4, scaling=\"none\", factor=1.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=8, fuse=0}\n"
     "%8  : bf16[T,2,4] = rms_norm(%3, %4) {eps=1e-06}\n"
     "%9  : bf16[T,2,4] = rope(%8, %5) {theta=10000.0, style=\"halves\", rot_dim=4, scaling=\"none\", factor=1.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=8}\n"
     "%10 : bf16[T,2,4] = add(%9, %8)\n"
     "%11 : bf16[T,2,4] = add(%7, %10)\n"
     "%12 : bf16[T,2,4] = output(%11) {name=\"logits\"}\n",
     1},

    /* An attention's q and k, each a head norm and its rotation, and the kv_write of k and v: the two
     * pairs and the kv_write one group (one kernel), the kv_write moved up beside them. */
    {"norm_rope_qk.ir", "fuse_norm_rope",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : bf16[T,8] = embed(%1, %0)\n"
     "%3  : bf16[T,2,4] = reshape(%2) {shape=[T,2,4]}\n"
     "%4  : f32[4] = weight() {name=\"qn\"}\n"
     "%5  : f32[4] = weight() {name=\"kn\"}\n"
     "%6  : i32[T] = input() {name=\"positions\"}\n"
     "%7  : bf16[T,2,4] = rms_norm(%3, %4) {eps=1e-06}\n"
     "%8  : bf16[T,2,4] = rope(%7, %6) {theta=10000.0, style=\"halves\", rot_dim=4, scaling=\"none\", factor=1.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=8}\n"
     "%9  : bf16[T,2,4] = rms_norm(%3, %5) {eps=1e-06}\n"
     "%10 : bf16[T,2,4] = rope(%9, %6) {theta=10000.0, style=\"halves\", rot_dim=4, scaling=\"none\", factor=1.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=8}\n"
     "%11 : bf16[T,2,4] = add(%3, %3)\n"
     "%12 : bf16[T,2,4] = kv_write(%10, %3) {layer=0, kv_dtype=\"bf16\"}\n"
     "%13 : bf16[T,2,4] = attention(%8, %12, %3) {layer=0, scale=0.5, window=0, softcap=0.0, write_kv=0, kv_dtype=\"bf16\"}\n"
     "%14 : bf16[T,2,4] = add(%13, %11)\n"
     "%15 : bf16[T,2,4] = output(%14) {name=\"logits\"}\n",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : bf16[T,8] = embed(%1, %0)\n"
     "%3  : bf16[T,2,4] = reshape(%2) {shape=[T,2,4]}\n"
     "%4  : f32[4] = weight() {name=\"qn\"}\n"
     "%5  : f32[4] = weight() {name=\"kn\"}\n"
     "%6  : i32[T] = input() {name=\"positions\"}\n"
     "%7  : bf16[T,2,4] = add(%3, %3)\n"
     "%8  : bf16[T,2,4] = rms_norm(%3, %4) {eps=1e-06, fuse=0}\n"
     "%9  : bf16[T,2,4] = rope(%8, %6) {theta=10000.0, style=\"halves\", rot_dim=4, scaling=\"none\", factor=1.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=8, fuse=0}\n"
     "%10 : bf16[T,2,4] = rms_norm(%3, %5) {eps=1e-06, fuse=0}\n"
     "%11 : bf16[T,2,4] = rope(%10, %6) {theta=10000.0, style=\"halves\", rot_dim=4, scaling=\"none\", factor=1.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=8, fuse=0}\n"
     "%12 : bf16[T,2,4] = kv_write(%11, %3) {layer=0, kv_dtype=\"bf16\", fuse=0}\n"
     "%13 : bf16[T,2,4] = attention(%9, %12, %3) {layer=0, scale=0.5, window=0, softcap=0.0, write_kv=0, kv_dtype=\"bf16\"}\n"
     "%14 : bf16[T,2,4] = add(%13, %7)\n"
     "%15 : bf16[T,2,4] = output(%14) {name=\"logits\"}\n",
     3},

    /* A norm whose uses are all matmuls (parallel attention and MLP): a copy a use, each its matmul's
     * prologue. */
    {"norm_prologue_shared.ir", "fuse_norm_prologue",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : f32[T,8] = embed(%1, %0)\n"
     "%3  : f32[8] = weight() {name=\"n\"}\n"
     "%4  : f32[T,8] = rms_norm(%2, %3) {eps=1e-06}\n"
     "%5  : f32[4,8] = weight() {name=\"attn\"}\n"
     "%6  : f32[T,4] = matmul(%4, %5)\n"
     "%7  : f32[4,8] = weight() {name=\"mlp\"}\n"
     "%8  : f32[T,4] = matmul(%4, %7)\n"
     "%9  : f32[T,4] = add(%6, %8)\n"
     "%10 : f32[T,4] = output(%9) {name=\"logits\"}\n",
     HEAD
     "%0  : i32[T] = input() {name=\"tokens\"}\n"
     "%1  : f32[16,8] = weight() {name=\"embed\"}\n"
     "%2  : f32[T,8] = embed(%1, %0)\n"
     "%3  : f32[8] = weight() {name=\"n\"}\n"
     "%4  : f32[4,8] = weight() {name=\"attn\"}\n"
     "%5  : f32[T,8] = rms_norm(%2, %3) {eps=1e-06, fuse=0}\n"
     "%6  : f32[T,4] = matmul(%5, %4) {fuse=0}\n"
     "%7  : f32[4,8] = weight() {name=\"mlp\"}\n"
     "%8  : f32[T,8] = rms_norm(%2, %3) {eps=1e-06, fuse=1}\n"
     "%9  : f32[T,4] = matmul(%8, %7) {fuse=1}\n"
     "%10 : f32[T,4] = add(%6, %9)\n"
     "%11 : f32[T,4] = output(%10) {name=\"logits\"}\n",
     2},

    /* A mixture of experts' norm (read by the router and the routed experts): no copy and no prologue,
     * the norm a kernel of its own (a routed expert_matmul takes none: measured slower, the pass's
     * takes_prologue). */
#define MOE_NORM_IR \
    HEAD \
    "%0  : i32[T] = input() {name=\"tokens\"}\n" \
    "%1  : f32[16,8] = weight() {name=\"embed\"}\n" \
    "%2  : f32[T,8] = embed(%1, %0)\n" \
    "%3  : f32[8] = weight() {name=\"n\"}\n" \
    "%4  : f32[T,8] = rms_norm(%2, %3) {eps=1e-06}\n" \
    "%5  : f32[4,8] = weight() {name=\"router\"}\n" \
    "%6  : f32[T,4] = matmul(%4, %5)\n" \
    "%7  : i32[T,2] = topk(%6) {k=2}\n" \
    "%8  : f32[4,6,8] = weight() {name=\"experts\"}\n" \
    "%9  : f32[T,2,6] = expert_matmul(%4, %8, %7)\n" \
    "%10 : f32[T,2] = gather(%6, %7)\n" \
    "%11 : f32[T,6] = expert_sum(%9, %10)\n" \
    "%12 : f32[T,6] = output(%11) {name=\"logits\"}\n"
    {"norm_prologue_moe.ir", "fuse_norm_prologue", MOE_NORM_IR, MOE_NORM_IR, 0},
#undef MOE_NORM_IR
};

static void run_case(const pass_case *c)
{
    ks_buf log = {0};
    kir_graph *g = kt_parse(c->name, c->in, &log);
    if (!CHECK_MSG(g != NULL, "%s: does not parse:\n%s", c->name, ks_buf_cstr(&log))) {
        ks_buf_free(&log);
        return;
    }
    ks_diag d = {.log = &log, .quiet = 1};
    kp_options opt = {.passes = c->passes ? &c->passes : NULL, .n_passes = 1, .verify = 1};
    kp_pass_stats *st = NULL;
    size_t n_st = 0;
    int rc = kp_run_pipeline(&g, &opt, &st, &n_st, &d);
    if (rc != 0) fprintf(stderr, "%s: %s", c->name, ks_buf_cstr(&log));
    CHECK(rc == 0);
    CHECK(n_st >= 1 && st[n_st - 1].fusions == c->fusions);
    if (n_st >= 1 && st[n_st - 1].fusions != c->fusions)
        fprintf(stderr, "%s: %zu fusions, want %zu\n", c->name, st[n_st - 1].fusions, c->fusions);
    ks_buf out = {0};
    kir_print(g, &out);
    CHECK_TEXT(c->name, ks_buf_cstr(&out), c->want);
    /* the output reads back to the same text */
    kir_graph *back = kt_parse(c->name, ks_buf_cstr(&out), &log);
    CHECK(back != NULL);
    if (back) {
        ks_buf again = {0};
        kir_print(back, &again);
        CHECK_TEXT(c->name, ks_buf_cstr(&again), ks_buf_cstr(&out));
        ks_buf_free(&again);
        kir_graph_free(back);
    }
    free(st);
    ks_buf_free(&out);
    ks_buf_free(&log);
    kir_graph_free(g);
}

int main(void)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
    return check_finish("test_passes");
}
