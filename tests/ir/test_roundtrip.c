/*
 * test_roundtrip.c — print -> parse -> print is byte-identical, parse keeps
 * attribute order, param order and locations, and edited text (names with
 * gaps, comments, odd spacing) reads back to the canonical form.
 */
#include <stdlib.h>

#include "tests/check.h"
#include "tests/ir/ir_test.h"

/* text must be canonical: parsing and printing it gives it back. */
static void check_canonical(const char *what, const char *text)
{
    ks_buf log = {0};
    kir_graph *g = kt_parse(what, text, &log);
    if (!CHECK_MSG(g != NULL, "%s: parse failed:\n%s", what, ks_buf_cstr(&log))) {
        ks_buf_free(&log);
        return;
    }
    char *again = kt_print(g);
    CHECK_TEXT(what, again, text);
    free(again);
    kir_graph_free(g);
    ks_buf_free(&log);
}

/* Text that parses to a graph that prints as `want`. */
static void check_reads_as(const char *what, const char *text, const char *want)
{
    ks_buf log = {0};
    kir_graph *g = kt_parse(what, text, &log);
    if (CHECK_MSG(g != NULL, "%s: parse failed:\n%s", what, ks_buf_cstr(&log))) {
        char *got = kt_print(g);
        CHECK_TEXT(what, got, want);
        free(got);
        check_canonical(what, want);
    }
    kir_graph_free(g);
    ks_buf_free(&log);
}

static const char *const llama_text =
    "kiln-ir 1\n"
    "graph \"llama\"\n"
    "param hidden = 16\n"
    "param eps = 1e-06\n"
    "param theta = 500000.0\n"
    "param third = 0.3333333333333333\n"
    "param tenth = 0.1\n"
    "param rope_type = \"llama3\"\n"
    "param note = \"say \\\"hi\\\"\\n\\tand \\\\ \\x1b\"\n"
    "\n"
    "%0  : i32[T] = input() {name=\"tokens\"} @\"models/llama.kiln\":40:7\n"
    "%1  : i32[T] = input() {name=\"positions\"} @\"models/llama.kiln\":41:7\n"
    "%2  : f32[100,16] = weight() {name=\"embed\"} @\"models/llama.kiln\":12:1\n"
    "%3  : f32[T,16] = embed(%2, %0) @\"models/llama.kiln\":42:7\n"
    "%4  : f32[T,16] = rms_norm(%3, _) {eps=1e-06} @\"models/llama.kiln\":44:9\n"
    "%5  : f32[T,2,8] = reshape(%4) {shape=[T,2,8]}\n"
    "%6  : f32[T,2,8] = rope(%5, %1) {theta=500000.0, style=\"pairs\", rot_dim=8, scaling=\"llama3\", "
    "factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=8192}\n"
    "%7  : f32[T,2,8] = attention(%6, %6, %5) {layer=0, scale=0.1, window=4096, softcap=-inf}\n"
    "%8  : f32[T,16] = reshape(%7) {shape=[T,16]}\n"
    "%9  : f32[T,16] = scale(%8) {value=0.3333333333333333}\n"
    "%10 : f32[T,16] = output(%9) {name=\"logits\"} @\"other file.kiln\":0:0\n";

static void test_canonical_texts(void)
{
    check_canonical("llama", llama_text);
    check_canonical("empty", "kiln-ir 1\ngraph \"\"\n");
    check_canonical("params only", "kiln-ir 1\ngraph \"p\"\nparam z = 1\nparam a = nan\nparam m = -0.0\n"
                                   "param eos_token_id = [128001, 128008, -1, 9223372036854775807]\n"
                                   "param one = [7]\nparam empty = []\n");
    check_canonical("attr order",
                    "kiln-ir 1\n"
                    "graph \"order\"\n"
                    "\n"
                    "%0 : i32[T] = input() {zeta=1, alpha=\"a\", mid=[], \"odd key\"=[T,-2,3], name=\"tokens\"}\n");
}

/* Graphs from the builders survive print -> parse unchanged. The raw
 * parts, not kir_build: the scale carries attributes outside the schema,
 * which only the text form takes. */
static void test_builder_graph(void)
{
    kir_graph *g = kir_graph_new("built");
    kir_param_str(g, "zz", "first");
    kir_param_float(g, "aa", 1e-6);
    kir_param_int(g, "mm", 3);
    const int64_t ids[3] = {128001, 128008, 128009};
    kir_param_ints(g, "eos_token_id", ids, 3);
    kir_loc at = kir_loc_make(g, "b.kiln", 9, 3);
    kir_val t = kir_input(g, KIR_ROLE_TOKENS, at);
    int64_t dims[2] = {50, 8};
    kir_val w = kir_weight(g, "w", KIR_BF16, 2, dims, kir_loc_make(g, "a.kiln", 1, 2));
    kir_val e = kir_node_new(g, KIR_OP_EMBED, at);
    kir_node_add_input(g, e, w);
    kir_node_add_input(g, e, t);
    ks_buf err = {0};
    CHECK(kir_infer(g, e, &err) == 0);
    kir_val s = kir_node_new(g, KIR_OP_SCALE, (kir_loc){UINT32_MAX, 0, 0});
    kir_node_add_input(g, s, e);
    kir_set_float(g, s, "value", 0.1 + 0.2);
    kir_set_str(g, s, "note", "tab\there \"quoted\" back\\slash");
    kir_set_int(g, s, "count", -7);
    CHECK(kir_infer(g, s, &err) == 0);
    kir_val o = kir_node_new(g, KIR_OP_OUTPUT, at);
    kir_node_add_input(g, o, s);
    kir_set_str(g, o, "name", "logits");
    CHECK(kir_infer(g, o, &err) == 0);
    ks_buf_free(&err);

    char *text = kt_print(g);
    ks_buf log = {0};
    kir_graph *h = kt_parse("built.ir", text, &log);
    CHECK(h != NULL);
    if (h) {
        CHECK(kt_graph_equal(g, h));
        char *again = kt_print(h);
        CHECK_TEXT("built", again, text);
        free(again);
        ks_diag d = {.quiet = 1};
        CHECK(kir_verify(h, &d, "built.ir") == 2); /* "note" and "count" are not in the schema: only the text form takes them */
    }
    CHECK_TEXT("built text", text,
               "kiln-ir 1\n"
               "graph \"built\"\n"
               "param zz = \"first\"\n"
               "param aa = 1e-06\n"
               "param mm = 3\n"
               "param eos_token_id = [128001, 128008, 128009]\n"
               "\n"
               "%0 : i32[T] = input() {name=\"tokens\"} @\"b.kiln\":9:3\n"
               "%1 : bf16[50,8] = weight() {name=\"w\"} @\"a.kiln\":1:2\n"
               "%2 : f32[T,8] = embed(%1, %0) @\"b.kiln\":9:3\n"
               "%3 : f32[T,8] = scale(%2) {value=0.30000000000000004, note=\"tab\\there \\\"quoted\\\" "
               "back\\\\slash\", count=-7}\n"
               "%4 : f32[T,8] = output(%3) {name=\"logits\"} @\"b.kiln\":9:3\n");
    free(text);
    kir_graph_free(h);
    kir_graph_free(g);
    ks_buf_free(&log);
}

/* What a user may write: any value names, gaps, comments, spacing, CRLF,
 * numbers in other spellings. */
static void test_edited_text(void)
{
    check_reads_as("edited",
                   "# edited by hand\r\n"
                   "\n"
                   "   kiln-ir   1   # version\r\n"
                   "graph\t\"e\"\n"
                   "param  eps=1E-6\n"
                   "param \"w\" = 10000.\n"
                   "param ids=[ 1,-2 ,3 ]\n"
                   "\n"
                   "%tokens:i32[ T ]=input( ){ name = \"tokens\" }\n"
                   "%10 : f32[ 7 , 4 ] = weight() {name=\"tab\"}   # a weight\n"
                   "%x.y : f32[T,4] = embed(%10,%tokens) @ \"m.kiln\" : 3 : 4\n"
                   "%3 : f32[T,4] = rms_norm(%x.y, _) {eps=0.000001}\n"
                   "%out-put : f32[T,4] = output(%3) {name=\"logits\",}\n",
                   "kiln-ir 1\n"
                   "graph \"e\"\n"
                   "param eps = 1e-06\n"
                   "param w = 10000.0\n"
                   "param ids = [1, -2, 3]\n"
                   "\n"
                   "%0 : i32[T] = input() {name=\"tokens\"}\n"
                   "%1 : f32[7,4] = weight() {name=\"tab\"}\n"
                   "%2 : f32[T,4] = embed(%1, %0) @\"m.kiln\":3:4\n"
                   "%3 : f32[T,4] = rms_norm(%2, _) {eps=1e-06}\n"
                   "%4 : f32[T,4] = output(%3) {name=\"logits\"}\n");
    /* No graph line and a text without a final newline. */
    check_reads_as("bare", "kiln-ir 1\n%0 : i32[T] = input() {name=\"tokens\", v=-1.5e300, w=inf}",
                   "kiln-ir 1\n"
                   "graph \"\"\n"
                   "\n"
                   "%0 : i32[T] = input() {name=\"tokens\", v=-1.5e+300, w=inf}\n");
}

int main(void)
{
    test_canonical_texts();
    test_builder_graph();
    test_edited_text();
    return check_finish("test_roundtrip");
}
