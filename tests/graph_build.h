/*
 * graph_build.h — building graphs by hand, for every test that does. Each
 * computed node goes through kir_build (ir/ir.h), the one builder the
 * frontend and the passes use too; a shape its rule refuses is the test's
 * own bug: the rule's message on stderr, then abort().
 *
 * Two levels:
 *  - any graph, each node at a location the caller gives (the `_at`
 *    builders): tb_build itself, tb_op for ops without attributes, and one
 *    builder for each op with attributes, which sets them in the order the
 *    text form prints them (the order tests' pinned texts have);
 *  - tb_graph, the planner tests' context: every node at one location,
 *    weights made as needed (f32, named w0, w1, ...), attention layers
 *    numbered in order.
 *
 * Inputs and weights, whose types are declared, come from kir_input and
 * kir_weight. Tests that make malformed graphs on purpose (tests/ir/
 * test_print.c, test_roundtrip.c, test_verify.c) use the raw parts,
 * kir_node_new and kir_node_add_input, instead.
 */
#ifndef KILN_TESTS_GRAPH_BUILD_H
#define KILN_TESTS_GRAPH_BUILD_H

#include "ir/ir.h"

/* ---- any graph, at a given location ------------------------------------------------ */
/* kir_build; aborts when the op's rule refuses the node. */
kir_val tb_build(kir_graph *g, kir_op op, kir_loc at, const kir_val *in, int n_in, const kir_setting *set, int n_set);
/* op(a) or op(a, b), an op without attributes (b KIR_NONE for one operand). */
kir_val tb_op(kir_graph *g, kir_op op, kir_loc at, kir_val a, kir_val b);
kir_val tb_scale_at(kir_graph *g, kir_loc at, kir_val x, double value);
/* RMS_NORM (x, w) or LAYER_NORM (x, w, b) {eps}; w and b may be KIR_NONE
 * (absent operands at the end are dropped, as kir_build does). */
kir_val tb_norm_at(kir_graph *g, kir_loc at, kir_op op, kir_val x, kir_val w, kir_val b, double eps);
kir_val tb_reshape_at(kir_graph *g, kir_loc at, kir_val x, int ndim, const int64_t *dims); /* dims[0] is T */
kir_val tb_slice_at(kir_graph *g, kir_loc at, kir_val x, int64_t start, int64_t end);
kir_val tb_output_at(kir_graph *g, kir_loc at, kir_val x, const char *name);
kir_val tb_kv_write_at(kir_graph *g, kir_loc at, kir_val k, kir_val v, int64_t layer);
/* attention(q, k, v) {layer, scale, window, softcap}: it writes the cache. */
kir_val tb_attention_at(kir_graph *g, kir_loc at, kir_val q, kir_val k, kir_val v, int64_t layer, double scale,
                        int64_t window, double softcap);

/* RoPE's attributes. */
typedef struct tb_rope_attrs {
    double theta;                   /* base of the frequencies */
    kir_word style;                 /* KIR_ROPE_STYLE_* */
    int64_t rot_dim;                /* leading elements of a head that rotate */
    kir_word scaling;               /* KIR_ROPE_SCALING_* */
    double factor;                  /* linear, llama3 */
    double low_freq_factor;         /* llama3 */
    double high_freq_factor;        /* llama3 */
    int64_t original_max_positions; /* llama3 */
} tb_rope_attrs;
/* theta 10000, halves, no scaling (factor 1, low 1, high 4, original 8192). */
tb_rope_attrs tb_rope_plain(int64_t rot_dim);
kir_val tb_rope_at(kir_graph *g, kir_loc at, kir_val x, kir_val pos, const tb_rope_attrs *r);

/* Write node v's absent operands out up to n of them: (x) becomes (x, _)
 * for n = 2. kir_build drops absent operands at the end; IR text may still
 * write them (`rms_norm(%3, _)`), and the tests that check what the text
 * form, the passes and the interpreter make of such nodes build them so.
 * Returns v. */
kir_val tb_pad_operands(kir_graph *g, kir_val v, int n);

/* ---- the planner tests' graphs ----------------------------------------------------- */
typedef struct tb_graph {
    kir_graph *g;     /* the graph being built (owned by the caller) */
    kir_loc at;       /* location given to every node */
    int n_weights;    /* weights made so far: names are w0, w1, ... */
    int n_layers;     /* attention nodes made so far: their `layer` */
} tb_graph;

void tb_init(tb_graph *b, const char *name);
kir_val tb_input(tb_graph *b, const char *name);
kir_val tb_weight(tb_graph *b, int ndim, int64_t d0, int64_t d1);
kir_val tb_embed(tb_graph *b, kir_val ids, int64_t vocab, int64_t dim);
kir_val tb_matmul(tb_graph *b, kir_val x, int64_t out_features);
kir_val tb_matmul_w(tb_graph *b, kir_val x, kir_val w); /* over a weight made earlier (tb_weight) */
kir_val tb_norm(tb_graph *b, kir_op op, kir_val x); /* RMS_NORM or LAYER_NORM, with weights */
kir_val tb_rms_norm_w(tb_graph *b, kir_val x, kir_val w); /* over a weight made earlier */
kir_val tb_unary(tb_graph *b, kir_op op, kir_val x); /* SCALE: by 0.5 */
kir_val tb_binary(tb_graph *b, kir_op op, kir_val x, kir_val y);
kir_val tb_reshape(tb_graph *b, kir_val x, int ndim, const int64_t *dims); /* dims[0] is T */
kir_val tb_rope(tb_graph *b, kir_val x, kir_val pos);
kir_val tb_attention(tb_graph *b, kir_val q, kir_val k, kir_val v);
/* kv_write(k, v) of the next layer, and the attention that reads the cache
 * it wrote (write_kv=0) */
kir_val tb_kv_write(tb_graph *b, kir_val k, kir_val v);
kir_val tb_attention_cached(tb_graph *b, kir_val q, kir_val kv_write, kir_val v);
/* Put node v in `fuse` group id (a group's nodes must be contiguous: make
 * its weights before its first node). */
void tb_fuse(tb_graph *b, kir_val v, int64_t id);
kir_val tb_slice(tb_graph *b, kir_val x, int64_t start, int64_t end);
kir_val tb_concat(tb_graph *b, int n, const kir_val *xs);
kir_val tb_output(tb_graph *b, kir_val x);
/* kir_verify the whole graph; aborts on an error. */
void tb_verify(tb_graph *b);

#endif
