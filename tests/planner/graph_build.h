/*
 * graph_build.h — builders the planner tests share: each adds one node with
 * the attributes kir_verify wants, infers its type, and aborts the test
 * with the shape error when the test built something wrong.
 */
#ifndef KILN_TESTS_PLANNER_GRAPH_BUILD_H
#define KILN_TESTS_PLANNER_GRAPH_BUILD_H

#include "ir/ir.h"

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
kir_val tb_unary(tb_graph *b, kir_op op, kir_val x);
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
