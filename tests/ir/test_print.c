/*
 * test_print.c — kir_print on graphs made with the builders, against the
 * expected text written here.
 *
 * The nodes are made with the raw parts (kir_node_new, kir_node_add_input,
 * the string-keyed setters, kir_infer), not kir_build: the text form must
 * print what kir_build does not make, absent operands at the end
 * (`rms_norm(%21, _)`) and attributes outside the schema (test_ops).
 */
#include <stdarg.h>
#include <stdlib.h>

#include "tests/check.h"
#include "tests/ir/ir_test.h"

/* Append op(operands...) at `at`; the caller sets attributes, then infer(). */
static kir_val node(kir_graph *g, kir_op op, kir_loc at, int nin, ...)
{
    kir_val v = kir_node_new(g, op, at);
    va_list ap;
    va_start(ap, nin);
    for (int i = 0; i < nin; i++) kir_node_add_input(g, v, va_arg(ap, kir_val));
    va_end(ap);
    return v;
}

static kir_val infer(kir_graph *g, kir_val v)
{
    ks_buf err = {0};
    CHECK_MSG(kir_infer(g, v, &err) == 0, "kir_infer(%%%u): %s", (unsigned)v, ks_buf_cstr(&err));
    ks_buf_free(&err);
    return v;
}

static kir_val weight(kir_graph *g, const char *name, int64_t d0, int64_t d1, kir_loc at)
{
    int64_t dims[2] = {d0, d1};
    return kir_weight(g, name, KIR_F32, d1 ? 2 : 1, dims, at);
}

static kir_val matmul(kir_graph *g, kir_val x, kir_val w, kir_loc at)
{
    return infer(g, node(g, KIR_OP_MATMUL, at, 2, x, w));
}

static kir_val reshape(kir_graph *g, kir_val x, int n, const int64_t *shape, kir_loc at)
{
    kir_val v = node(g, KIR_OP_RESHAPE, at, 1, x);
    kir_set_ints(g, v, "shape", shape, (uint32_t)n);
    return infer(g, v);
}

static kir_val rope(kir_graph *g, kir_val x, kir_val pos, kir_loc at)
{
    kir_val v = node(g, KIR_OP_ROPE, at, 2, x, pos);
    kir_set_float(g, v, "theta", 10000.0);
    kir_set_str(g, v, "style", "halves");
    kir_set_int(g, v, "rot_dim", 8);
    kir_set_str(g, v, "scaling", "none");
    kir_set_float(g, v, "factor", 1.0);
    kir_set_float(g, v, "low_freq_factor", 1.0);
    kir_set_float(g, v, "high_freq_factor", 4.0);
    kir_set_int(g, v, "original_max_positions", 8192);
    return infer(g, v);
}

/* One Llama layer: hidden 32, 4 heads, 2 KV heads, head_dim 8, vocab 64. */
static void test_tiny_llama(void)
{
    kir_graph *g = kir_graph_new("tiny-llama");
    kir_param_int(g, "hidden", 32);
    kir_param_float(g, "eps", 1e-5);
    kir_param_str(g, "rope_type", "default");
    kir_loc none = {UINT32_MAX, 0, 0};
    kir_loc l3 = kir_loc_make(g, "tiny.kiln", 3, 5);
    kir_loc l7 = kir_loc_make(g, "tiny.kiln", 7, 9);
    kir_loc l8 = kir_loc_make(g, "tiny.kiln", 8, 9);

    kir_val tokens = kir_input(g, KIR_ROLE_TOKENS, l3);
    kir_val pos = kir_input(g, KIR_ROLE_POSITIONS, l3);
    kir_val x = infer(g, node(g, KIR_OP_EMBED, l3, 2, weight(g, "embed", 64, 32, none), tokens));
    kir_val h = node(g, KIR_OP_RMS_NORM, l7, 2, x, weight(g, "attn_norm", 32, 0, none));
    kir_set_float(g, h, "eps", 1e-5);
    infer(g, h);
    kir_val q = matmul(g, h, weight(g, "wq", 32, 32, none), l8);
    kir_val k = matmul(g, h, weight(g, "wk", 16, 32, none), l8);
    kir_val v = matmul(g, h, weight(g, "wv", 16, 32, none), l8);
    const int64_t qs[3] = {KIR_DIM_T, 4, 8}, ks[3] = {KIR_DIM_T, 2, 8}, flat[2] = {KIR_DIM_T, 32};
    q = rope(g, reshape(g, q, 3, qs, l8), pos, l8);
    k = rope(g, reshape(g, k, 3, ks, l8), pos, l8);
    v = reshape(g, v, 3, ks, l8);
    kir_val a = node(g, KIR_OP_ATTENTION, l8, 3, q, k, v);
    kir_set_int(g, a, "layer", 0);
    kir_set_float(g, a, "scale", 1.0 / sqrt(8.0));
    kir_set_int(g, a, "window", 0);
    kir_set_float(g, a, "softcap", 0.0);
    infer(g, a);
    kir_val merged = reshape(g, a, 2, flat, l8); /* before the weight: argument order is unspecified */
    kir_val o = matmul(g, merged, weight(g, "wo", 32, 32, none), l8);
    x = infer(g, node(g, KIR_OP_ADD, l8, 2, x, o));
    h = node(g, KIR_OP_RMS_NORM, none, 2, x, KIR_NONE);
    kir_set_float(g, h, "eps", 1e-5);
    infer(g, h);
    kir_val gate = infer(g, node(g, KIR_OP_SILU, none, 1, matmul(g, h, weight(g, "w_gate", 48, 32, none), none)));
    kir_val up = matmul(g, h, weight(g, "w_up", 48, 32, none), none);
    kir_val m = infer(g, node(g, KIR_OP_MUL, none, 2, gate, up));
    x = infer(g, node(g, KIR_OP_ADD, none, 2, x, matmul(g, m, weight(g, "w_down", 32, 48, none), none)));
    kir_val logits = node(g, KIR_OP_SCALE, none, 1, matmul(g, x, weight(g, "lm_head", 64, 32, none), none));
    kir_set_float(g, logits, "value", 0.5);
    infer(g, logits);
    kir_val out = node(g, KIR_OP_OUTPUT, l3, 1, logits);
    kir_set_str(g, out, "name", "logits");
    infer(g, out);

    ks_diag d = {.quiet = 1};
    CHECK(kir_verify(g, &d, "tiny-llama") == 0);
    char *text = kt_print(g);
    CHECK_TEXT("tiny llama", text,
               "kiln-ir 1\n"
               "graph \"tiny-llama\"\n"
               "param hidden = 32\n"
               "param eps = 1e-05\n"
               "param rope_type = \"default\"\n"
               "\n"
               "%0  : i32[T] = input() {name=\"tokens\"} @\"tiny.kiln\":3:5\n"
               "%1  : i32[T] = input() {name=\"positions\"} @\"tiny.kiln\":3:5\n"
               "%2  : f32[64,32] = weight() {name=\"embed\"}\n"
               "%3  : f32[T,32] = embed(%2, %0) @\"tiny.kiln\":3:5\n"
               "%4  : f32[32] = weight() {name=\"attn_norm\"}\n"
               "%5  : f32[T,32] = rms_norm(%3, %4) {eps=1e-05} @\"tiny.kiln\":7:9\n"
               "%6  : f32[32,32] = weight() {name=\"wq\"}\n"
               "%7  : f32[T,32] = matmul(%5, %6) @\"tiny.kiln\":8:9\n"
               "%8  : f32[16,32] = weight() {name=\"wk\"}\n"
               "%9  : f32[T,16] = matmul(%5, %8) @\"tiny.kiln\":8:9\n"
               "%10 : f32[16,32] = weight() {name=\"wv\"}\n"
               "%11 : f32[T,16] = matmul(%5, %10) @\"tiny.kiln\":8:9\n"
               "%12 : f32[T,4,8] = reshape(%7) {shape=[T,4,8]} @\"tiny.kiln\":8:9\n"
               "%13 : f32[T,4,8] = rope(%12, %1) {theta=10000.0, style=\"halves\", rot_dim=8, scaling=\"none\", "
               "factor=1.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=8192} "
               "@\"tiny.kiln\":8:9\n"
               "%14 : f32[T,2,8] = reshape(%9) {shape=[T,2,8]} @\"tiny.kiln\":8:9\n"
               "%15 : f32[T,2,8] = rope(%14, %1) {theta=10000.0, style=\"halves\", rot_dim=8, scaling=\"none\", "
               "factor=1.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=8192} "
               "@\"tiny.kiln\":8:9\n"
               "%16 : f32[T,2,8] = reshape(%11) {shape=[T,2,8]} @\"tiny.kiln\":8:9\n"
               "%17 : f32[T,4,8] = attention(%13, %15, %16) {layer=0, scale=0.35355339059327373, window=0, "
               "softcap=0.0} @\"tiny.kiln\":8:9\n"
               "%18 : f32[T,32] = reshape(%17) {shape=[T,32]} @\"tiny.kiln\":8:9\n"
               "%19 : f32[32,32] = weight() {name=\"wo\"}\n"
               "%20 : f32[T,32] = matmul(%18, %19) @\"tiny.kiln\":8:9\n"
               "%21 : f32[T,32] = add(%3, %20) @\"tiny.kiln\":8:9\n"
               "%22 : f32[T,32] = rms_norm(%21, _) {eps=1e-05}\n"
               "%23 : f32[48,32] = weight() {name=\"w_gate\"}\n"
               "%24 : f32[T,48] = matmul(%22, %23)\n"
               "%25 : f32[T,48] = silu(%24)\n"
               "%26 : f32[48,32] = weight() {name=\"w_up\"}\n"
               "%27 : f32[T,48] = matmul(%22, %26)\n"
               "%28 : f32[T,48] = mul(%25, %27)\n"
               "%29 : f32[32,48] = weight() {name=\"w_down\"}\n"
               "%30 : f32[T,32] = matmul(%28, %29)\n"
               "%31 : f32[T,32] = add(%21, %30)\n"
               "%32 : f32[64,32] = weight() {name=\"lm_head\"}\n"
               "%33 : f32[T,64] = matmul(%31, %32)\n"
               "%34 : f32[T,64] = scale(%33) {value=0.5}\n"
               "%35 : f32[T,64] = output(%34) {name=\"logits\"} @\"tiny.kiln\":3:5\n");
    free(text);
    kir_graph_free(g);
}

/* Params of every kind, floats in their shortest forms, escapes, names that
 * need quotes, a graph without nodes. */
static void test_values(void)
{
    kir_graph *g = kir_graph_new("quote\"d");
    kir_param_int(g, "n", -42);
    kir_param_int(g, "big", INT64_MIN);
    kir_param_float(g, "tenth", 0.1);
    kir_param_float(g, "third", 1.0 / 3.0);
    kir_param_float(g, "theta", 500000.0);
    kir_param_float(g, "eps", 1e-6);
    kir_param_float(g, "tiny", 0.0001);
    kir_param_float(g, "e16", 1e16);
    kir_param_float(g, "under16", 1234567890123456.0);
    kir_param_float(g, "neg_zero", -0.0);
    kir_param_float(g, "min_sub", 5e-324);
    kir_param_float(g, "max", 1.7976931348623157e308);
    kir_param_float(g, "inf", INFINITY);
    kir_param_float(g, "ninf", -INFINITY);
    kir_param_float(g, "nan", NAN);
    kir_param_str(g, "s", "a \"b\" \\ c\nd\te\x01\x7f\xc3\xa9");
    kir_param_str(g, "has space", "");
    kir_param_str(g, "9lives", "x");
    kir_param_str(g, "rope.type-2", "y");
    char *text = kt_print(g);
    CHECK_TEXT("values", text,
               "kiln-ir 1\n"
               "graph \"quote\\\"d\"\n"
               "param n = -42\n"
               "param big = -9223372036854775808\n"
               "param tenth = 0.1\n"
               "param third = 0.3333333333333333\n"
               "param theta = 500000.0\n"
               "param eps = 1e-06\n"
               "param tiny = 0.0001\n"
               "param e16 = 1e+16\n"
               "param under16 = 1234567890123456.0\n"
               "param neg_zero = -0.0\n"
               "param min_sub = 5e-324\n"
               "param max = 1.7976931348623157e+308\n"
               "param inf = inf\n"
               "param ninf = -inf\n"
               "param nan = nan\n"
               "param s = \"a \\\"b\\\" \\\\ c\\nd\\te\\x01\\x7f\xc3\xa9\"\n"
               "param \"has space\" = \"\"\n"
               "param \"9lives\" = \"x\"\n"
               "param rope.type-2 = \"y\"\n");
    free(text);
    kir_graph_free(g);
}

/* Optional operands in the middle, attribute keys that need quotes, every
 * attribute kind, a location whose file name needs escapes, concat/slice. */
static void test_ops(void)
{
    kir_graph *g = kir_graph_new("ops");
    kir_loc none = {UINT32_MAX, 0, 0};
    kir_loc odd = kir_loc_make(g, "dir with space/\"q\".kiln", 1, 1);
    kir_val t = kir_input(g, KIR_ROLE_TOKENS, none);
    kir_val x = infer(g, node(g, KIR_OP_EMBED, none, 2, weight(g, "wte", 10, 6, none), t));
    kir_val ln = node(g, KIR_OP_LAYER_NORM, odd, 3, x, KIR_NONE, weight(g, "b", 6, 0, none));
    kir_set_float(g, ln, "eps", 1e-5);
    kir_set_int(g, ln, "extra key", 7);
    kir_set_ints(g, ln, "empty", NULL, 0);
    infer(g, ln);
    kir_val s = node(g, KIR_OP_SLICE, none, 1, ln);
    kir_set_int(g, s, "start", 2);
    kir_set_int(g, s, "end", 5);
    infer(g, s);
    kir_val c = infer(g, node(g, KIR_OP_CONCAT, none, 3, s, infer(g, node(g, KIR_OP_GELU_TANH, none, 1, s)), ln));
    kir_val out = node(g, KIR_OP_OUTPUT, none, 1, c);
    kir_set_str(g, out, "name", "logits");
    infer(g, out);
    ks_diag d = {.quiet = 1};
    CHECK(kir_verify(g, &d, "ops") == 2); /* "extra key" and "empty": the text form carries what the schema refuses */
    char *text = kt_print(g);
    CHECK_TEXT("ops", text,
               "kiln-ir 1\n"
               "graph \"ops\"\n"
               "\n"
               "%0 : i32[T] = input() {name=\"tokens\"}\n"
               "%1 : f32[10,6] = weight() {name=\"wte\"}\n"
               "%2 : f32[T,6] = embed(%1, %0)\n"
               "%3 : f32[6] = weight() {name=\"b\"}\n"
               "%4 : f32[T,6] = layer_norm(%2, _, %3) {eps=1e-05, \"extra key\"=7, empty=[]} "
               "@\"dir with space/\\\"q\\\".kiln\":1:1\n"
               "%5 : f32[T,3] = slice(%4) {start=2, end=5}\n"
               "%6 : f32[T,3] = gelu_tanh(%5)\n"
               "%7 : f32[T,12] = concat(%5, %6, %4)\n"
               "%8 : f32[T,12] = output(%7) {name=\"logits\"}\n");
    free(text);
    kir_graph_free(g);

    kir_graph *e = kir_graph_new("empty");
    text = kt_print(e);
    CHECK_TEXT("empty", text, "kiln-ir 1\ngraph \"empty\"\n");
    free(text);
    kir_graph_free(e);
}

int main(void)
{
    test_tiny_llama();
    test_values();
    test_ops();
    return check_finish("test_print");
}
