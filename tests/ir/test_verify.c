/*
 * test_verify.c — kir_verify's messages, exactly. Graphs come from IR text
 * (which parses: the problems are for the verifier), or from text then
 * edited in memory for what the text form cannot say.
 */
#include <stdlib.h>

#include "tests/check.h"
#include "tests/ir/ir_test.h"

typedef struct verify_case {
    const char *name; /* `what` given to kir_verify, and the file name to parse */
    const char *text; /* IR text that parses */
    int errors;       /* kir_verify's result */
    const char *log;  /* every message it writes */
} verify_case;

static const verify_case cases[] = {
    /* A wrong type is one error: its consumers are checked against the
     * declared type. Nodes with a location are reported there. */
    {"types.ir",
     "kiln-ir 1\n"
     "%0 : i32[T] = input() {name=\"tokens\"} @\"m.kiln\":1:1\n"
     "%1 : f32[10,8] = weight() {name=\"embed\"} @\"m.kiln\":2:1\n"
     "%2 : f32[T,8] = embed(%1, %0) @\"m.kiln\":3:5\n"
     "%3 : f32[6,8] = weight() {name=\"w\"}\n"
     "%4 : f32[T,8] = matmul(%2, %3) @\"m.kiln\":42:9\n"
     "%5 : f32[T,8] = silu(%4)\n"
     "%6 : f32[5,7] = weight() {name=\"w2\"}\n"
     "%7 : f32[T,5] = matmul(%5, %6) @\"m.kiln\":44:9\n"
     "%8 : f32[T] = input() {name=\"positions\"}\n"
     "%9 : bf16[T,8] = output(%5) {name=\"logits\"}\n"
     "%10 : i32[4] = weight() {name=\"ints\"}\n"
     "%11 : f32[T,9223372036854775807,2] = silu(%5)\n"
     "%12 : f32[T,8] = reshape(%11) {shape=[T,8]}\n",
     6,
     "m.kiln:42:9: error: node %4 (matmul): declared f32[T,8] but operands give f32[T,6]\n"
     "m.kiln:44:9: error: node %7 (matmul): inner dimensions differ: f32[T,8] x f32[5,7]\n"
     "types.ir: error: node %8 (input): declared f32[T] but its shape rule gives i32[T]\n"
     "types.ir: error: node %9 (output): declared bf16[T,8] but operands give f32[T,8]\n"
     "types.ir: error: node %10 (weight): weights must be f32, f16 or bf16 (or quantized codes: u4, u8, i8, f8e4m3)\n"
     "types.ir: error: node %11 (silu): dim 9223372036854775807 makes f32[T,9223372036854775807,2] too large "
     "(more than 2^48 elements per token)\n"},

    {"structure.ir",
     "kiln-ir 1\n"
     "%0 : i32[T] = input() {name=\"tokens\"}\n"
     "%1 : f32[10,8] = weight() {name=\"embed\"}\n"
     "%2 : f32[T,8] = embed(%1, %0)\n"
     "%3 : f32[T,8] = add(%2)\n"
     "%4 : f32[T,8] = add(%2, _)\n"
     "%5 : f32[T,8] = layer_norm(%2, _, _, %2) {eps=1e-05}\n"
     "%6 : f32[T,8] = rms_norm(%2, _)\n"
     "%7 : f32[T,8] = rms_norm(%2) {eps=1}\n"
     "%8 : f32[T,2,4] = reshape(%2) {shape=[T,2,4]}\n"
     "%9 : f32[T,2,4] = rope(%8, %0) {theta=10000.0, style=\"interleaved\", rot_dim=4, scaling=\"ntk\", "
     "factor=1.0, low_freq_factor=1.0, high_freq_factor=4.0}\n"
     "%10 : f32[T,2,4] = attention(%8, %8, %8) {layer=0, scale=0.5, window=0, softcap=0.0}\n"
     "%11 : f32[T,2,4] = attention(%8, %8, %8) {layer=0, scale=0.5, window=0, softcap=0.0}\n"
     "%12 : f32[10,8] = weight() {name=\"embed\"}\n"
     "%13 : i32[T] = input() {name=\"tokens\"}\n"
     "%14 : f32[T,8] = output(%2) {name=\"logits\"}\n"
     "%15 : f32[T,8] = output(%2) {name=\"logits\"}\n"
     "%16 : f32[T,8] = scale(%2) {value=\"x\"}\n"
     "%17 : f32[T,8] = slice(%2)\n"
     "%18 : f32[T,8] = output(%2)\n"
     "%19 : f32[T,2,4] = rope(%8, %0) {theta=10000.0, style=\"pairs\", rot_dim=4, scaling=\"llama3\", "
     "factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=8192, extra=\"ok\"}\n"
     "%20 : f32[T,2,4] = attention(%8, %8, %8) {layer=1, scale=0.5, window=0, softcap=0}\n",
     19,
     "structure.ir: error: node %3 (add): takes 2 operands, has 1\n"
     "structure.ir: error: node %4 (add): operand 2 is absent (_), but add needs it\n"
     "structure.ir: error: node %5 (layer_norm): takes 1 to 3 operands, has 4\n"
     "structure.ir: error: node %6 (rms_norm): missing attribute eps (a float)\n"
     "structure.ir: error: node %7 (rms_norm): attribute eps is an int, not a float\n"
     "structure.ir: error: node %9 (rope): attribute style is \"interleaved\", not \"halves\" or \"pairs\"\n"
     "structure.ir: error: node %9 (rope): attribute scaling is \"ntk\", not \"none\", \"linear\", \"llama3\", \"yarn\", \"longrope\" or \"dynamic\"\n"
     "structure.ir: error: node %9 (rope): missing attribute original_max_positions (an int)\n"
     "structure.ir: error: node %16 (scale): attribute value is a string, not a float\n"
     "structure.ir: error: node %17 (slice): missing attribute start (an int)\n"
     "structure.ir: error: node %17 (slice): missing attribute end (an int)\n"
     "structure.ir: error: node %18 (output): missing attribute name (a string)\n"
        "structure.ir: error: node %19 (rope): unknown attribute extra (ir/ops.def lists what rope takes)\n"
     "structure.ir: error: node %20 (attention): attribute softcap is an int, not a float\n"
     "structure.ir: error: node %11 (attention): layer 0 is used by node %10 too\n"
     "structure.ir: error: node %12 (weight): weight name \"embed\" is used by node %1 too\n"
     "structure.ir: error: node %13 (input): input name \"tokens\" is used by node %0 too\n"
     "structure.ir: error: node %15 (output): a graph has one output, and node %14 is one already\n"
     "structure.ir: error: node %18 (output): a graph has one output, and node %14 is one already\n"},

    /* values the schema's rules (ir/ops.def) refuse, and an input role that is not a word of its set */
    {"values.ir",
     "kiln-ir 1\n"
     "%0 : i32[T] = input() {name=\"tokens\"}\n"
     "%1 : i32[T] = input() {name=\"segments\"}\n"
     "%2 : f32[10,8] = weight() {name=\"embed\"}\n"
     "%3 : f32[T,8] = embed(%2, %0)\n"
     "%4 : f32[T,8] = rms_norm(%3) {eps=-1.0}\n"
     "%5 : f32[T,8] = layer_norm(%4) {eps=0.0}\n"
     "%6 : f32[T,2,4] = reshape(%5) {shape=[T,2,4]}\n"
     "%7 : f32[T,2,4] = rope(%6, %0) {theta=10000.0, style=\"halves\", rot_dim=4, scaling=\"llama3\", "
     "factor=8.0, low_freq_factor=4.0, high_freq_factor=4.0, original_max_positions=0}\n"
     "%8 : f32[T,2,4] = attention(%7, %7, %7) {layer=-1, scale=0.5, window=-3, softcap=-1.0}\n"
     "%9 : f32[T,8] = reshape(%8) {shape=[T,8]}\n"
     "%10 : f32[T,8] = output(%9) {name=\"logits\"}\n",
     8,
     "values.ir: error: node %1 (input): attribute name is \"segments\", not \"tokens\", \"positions\" or \"seq_lengths\"\n"
     "values.ir: error: node %4 (rms_norm): attribute eps is -1; it must be positive\n"
     "values.ir: error: node %5 (layer_norm): attribute eps is 0; it must be positive\n"
     "values.ir: error: node %7 (rope): attribute original_max_positions is 0; it must be positive\n"
     "values.ir: error: node %7 (rope): llama3 scaling needs low_freq_factor < high_freq_factor (got 4 and 4)\n"
     "values.ir: error: node %8 (attention): attribute layer is -1; it must not be negative\n"
     "values.ir: error: node %8 (attention): attribute window is -3; it must not be negative\n"
     "values.ir: error: node %8 (attention): attribute softcap is -1; it must not be negative\n"},

    /* Half values: a computed value may be stored as f16 or bf16; a view has
     * its operand's dtype; the KV cache has one dtype. */
    {"dtypes.ir",
     "kiln-ir 1\n"
     "%0 : i32[T] = input() {name=\"tokens\"}\n"
     "%1 : bf16[10,8] = weight() {name=\"embed\"}\n"
     "%2 : bf16[T,8] = embed(%1, %0)\n"
     "%3 : f16[T,8] = silu(%2)\n"
     "%4 : f32[T,2,4] = reshape(%3) {shape=[T,2,4]}\n"
     "%5 : bf16[T,2,4] = reshape(%2) {shape=[T,2,4]}\n"
     "%6 : bf16[T,2,4] = kv_write(%5, %5) {layer=0, kv_dtype=\"bf16\"}\n"
     "%7 : f32[T,2,4] = attention(%5, %6, %5) {layer=0, scale=0.5, window=0, softcap=0.0, write_kv=0, "
     "kv_dtype=\"f16\"}\n"
     "%8 : f32[T,2,4] = kv_write(%5, %5) {layer=1, kv_dtype=\"half\"}\n"
     "%9 : f32[T,2,4] = output(%7) {name=\"logits\"}\n",
     3,
     "dtypes.ir: error: node %4 (reshape): declared f32[T,2,4] but operands give f16[T,2,4]\n"
     "dtypes.ir: error: node %8 (kv_write): attribute kv_dtype is \"half\", not \"f32\", \"bf16\", \"f16\", \"i8\" or \"f8e4m3\"\n"
     "dtypes.ir: error: node %7 (attention): kv_dtype=f16, but node %6 stores the KV cache as bf16: the cache has "
     "one dtype\n"},

    /* V read from the K rows (v_in_k): v must be each head's first dims of k */
    {"v_in_k.ir",
     "kiln-ir 1\n"
     "%0 : i32[T] = input() {name=\"tokens\"}\n"
     "%1 : f32[10,16] = weight() {name=\"embed\"}\n"
     "%2 : f32[T,16] = embed(%1, %0)\n"
     "%3 : f32[T,2,8] = reshape(%2) {shape=[T,2,8]}\n"
     "%4 : f32[T,2,4] = slice(%3) {start=0, end=4}\n"
     "%5 : f32[T,2,8] = kv_write(%3, %4) {layer=0, v_in_k=1}\n"
     "%6 : f32[T,2,4] = attention(%3, %5, %4) {layer=0, scale=0.5, window=0, softcap=0.0, write_kv=0, v_in_k=1}\n"
     "%7 : f32[T,2,8] = reshape(%2) {shape=[T,2,8]}\n"
     "%8 : f32[T,2,4] = kv_write(%4, %7) {layer=1, v_in_k=1}\n"
     "%9 : f32[T,2,4] = output(%6) {name=\"logits\"}\n",
     1,
     "v_in_k.ir: error: node %8 (kv_write): v_in_k=1, but v [T,2,8] is not the first dims of each head of k [T,2,4]\n"},

    {"noout.ir",
     "kiln-ir 1\n"
     "%0 : i32[T] = input() {name=\"tokens\"} @\"m.kiln\":1:1\n",
     1,
     "noout.ir: error: graph has no output\n"},

    {"clean.ir",
     "kiln-ir 1\n"
     "%0 : i32[T] = input() {name=\"tokens\"}\n"
     "%1 : f16[10,8] = weight() {name=\"embed\"}\n"
     "%2 : f32[T,8] = embed(%1, %0)\n"
     "%3 : f32[8] = weight() {name=\"g\"}\n"
     "%4 : f32[T,8] = layer_norm(%2, %3, _) {eps=1e-05}\n"
     "%5 : f32[T,8] = output(%4) {name=\"logits\"}\n",
     0, ""},
};

static kir_graph *parse_ok(const char *name, const char *text)
{
    ks_buf log = {0};
    kir_graph *g = kt_parse(name, text, &log);
    CHECK_MSG(g != NULL, "%s: does not parse:\n%s", name, ks_buf_cstr(&log));
    ks_buf_free(&log);
    return g;
}

static void run_case(const verify_case *c)
{
    kir_graph *g = parse_ok(c->name, c->text);
    if (!g) return;
    ks_buf log = {0};
    ks_diag d = {.log = &log, .quiet = 1};
    int errors = kir_verify(g, &d, c->name);
    CHECK(errors == c->errors);
    CHECK(d.errors == c->errors);
    CHECK_TEXT(c->name, ks_buf_cstr(&log), c->log);
    ks_buf_free(&log);
    kir_graph_free(g);
}

/* What no text can say: operands later than their node, and malformed
 * types. A node with a malformed type is one error; its consumers are not
 * checked against it. */
static void test_edited_in_memory(void)
{
    kir_graph *g = parse_ok("mem.ir",
                            "kiln-ir 1\n"
                            "%0 : i32[T] = input() {name=\"tokens\"}\n"
                            "%1 : f32[10,8] = weight() {name=\"embed\"}\n"
                            "%2 : f32[T,8] = embed(%1, %0)\n"
                            "%3 : f32[T,8] = silu(%2) @\"m.kiln\":7:3\n"
                            "%4 : f32[T,8] = add(%3, %2)\n"
                            "%5 : f32[T,8] = silu(%4)\n"
                            "%6 : f32[T,8] = silu(%5)\n"
                            "%7 : f32[T,8] = output(%6) {name=\"logits\"}\n");
    if (!g) return;
    g->nodes[1].dims[0] = 0;      /* embed's consumers are skipped */
    g->nodes[3].in[0] = 5;        /* later than the node */
    g->nodes[4].in[1] = 99;       /* not a node at all */
    g->nodes[5].dtype = (kir_dtype)9;
    g->nodes[6].ndim = 5;
    ks_buf log = {0};
    ks_diag d = {.log = &log, .quiet = 1};
    CHECK(kir_verify(g, &d, NULL) == 5);
    CHECK_TEXT("in memory", ks_buf_cstr(&log),
               "<ir>: error: node %1 (weight): bad dim 0 in f32[0,8]: a dim is a positive integer or T\n"
               "m.kiln:7:3: error: node %3 (silu): operand 1 is %5, which is not defined before it\n"
               "<ir>: error: node %4 (add): operand 2 is %99, which is not defined before it\n"
               "<ir>: error: node %5 (silu): unknown dtype 9\n"
               "<ir>: error: node %6 (silu): 5 dims (at most 4)\n");
    ks_buf_free(&log);
    kir_graph_free(g);
}

/* A node whose op is not in the table is named by its value alone. */
static void test_unknown_op(void)
{
    kir_graph *g = parse_ok("op.ir",
                            "kiln-ir 1\n"
                            "%0 : i32[T] = input() {name=\"tokens\"}\n"
                            "%1 : f32[10,8] = weight() {name=\"embed\"}\n"
                            "%2 : f32[T,8] = embed(%1, %0) @\"m.kiln\":3:5\n"
                            "%3 : f32[T,8] = output(%2) {name=\"logits\"}\n");
    if (!g) return;
    g->nodes[1].op = (kir_op)(KIR_OP_COUNT + 3);
    g->nodes[2].op = (kir_op)(KIR_OP_COUNT + 4);
    ks_buf log = {0};
    ks_diag d = {.log = &log, .quiet = 1};
    CHECK(kir_verify(g, &d, "op.ir") == 2);
    ks_buf want = {0};
    ks_buf_printf(&want, "op.ir: error: node %%1: unknown op %d\nm.kiln:3:5: error: node %%2: unknown op %d\n",
                  KIR_OP_COUNT + 3, KIR_OP_COUNT + 4);
    CHECK_TEXT("unknown op", ks_buf_cstr(&log), ks_buf_cstr(&want));
    ks_buf_free(&want);
    ks_buf_free(&log);
    kir_graph_free(g);
}

int main(void)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
    test_edited_in_memory();
    test_unknown_op();
    return check_finish("test_verify");
}
