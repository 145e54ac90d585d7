/* graph_build.c — see graph_build.h. */
#include "tests/planner/graph_build.h"

#include <stdio.h>
#include <stdlib.h>

void tb_init(tb_graph *b, const char *name)
{
    b->g = kir_graph_new(name);
    b->at = kir_loc_make(b->g, "planner-test", 1, 1);
    b->n_weights = 0;
    b->n_layers = 0;
}

/* Infer v's type; a failure is the test's own bug. */
static kir_val done(tb_graph *b, kir_val v)
{
    ks_buf err = {0};
    if (kir_infer(b->g, v, &err) != 0) {
        fprintf(stderr, "test graph: node %%%u: %s\n", (unsigned)v, ks_buf_cstr(&err));
        abort();
    }
    ks_buf_free(&err);
    return v;
}

static kir_val node(tb_graph *b, kir_op op, int n, const kir_val *in)
{
    kir_val v = kir_node_new(b->g, op, b->at);
    for (int i = 0; i < n; i++) kir_node_add_input(b->g, v, in[i]);
    return v;
}

kir_val tb_input(tb_graph *b, const char *name) { return kir_input(b->g, kir_word_lookup(KIR_SET_ROLE, name), b->at); }

kir_val tb_weight(tb_graph *b, int ndim, int64_t d0, int64_t d1)
{
    char name[32];
    snprintf(name, sizeof name, "w%d", b->n_weights++);
    int64_t dims[2] = {d0, d1};
    return kir_weight(b->g, name, KIR_F32, ndim, dims, b->at);
}

kir_val tb_embed(tb_graph *b, kir_val ids, int64_t vocab, int64_t dim)
{
    kir_val in[2] = {tb_weight(b, 2, vocab, dim), ids};
    return done(b, node(b, KIR_OP_EMBED, 2, in));
}

kir_val tb_matmul(tb_graph *b, kir_val x, int64_t out_features)
{
    kir_val in[2] = {x, tb_weight(b, 2, out_features, kir_node_at(b->g, x)->dims[1])};
    return done(b, node(b, KIR_OP_MATMUL, 2, in));
}

kir_val tb_matmul_w(tb_graph *b, kir_val x, kir_val w)
{
    kir_val in[2] = {x, w};
    return done(b, node(b, KIR_OP_MATMUL, 2, in));
}

kir_val tb_rms_norm_w(tb_graph *b, kir_val x, kir_val w)
{
    kir_val in[2] = {x, w};
    kir_val v = node(b, KIR_OP_RMS_NORM, 2, in);
    kir_set_float(b->g, v, "eps", 1e-5);
    return done(b, v);
}

kir_val tb_norm(tb_graph *b, kir_op op, kir_val x)
{
    const kir_node *xn = kir_node_at(b->g, x);
    int64_t d = xn->dims[xn->ndim - 1];
    kir_val in[3] = {x, tb_weight(b, 1, d, 0), KIR_NONE};
    if (op == KIR_OP_LAYER_NORM) in[2] = tb_weight(b, 1, d, 0);
    kir_val v = node(b, op, op == KIR_OP_LAYER_NORM ? 3 : 2, in);
    kir_set_float(b->g, v, "eps", 1e-5);
    return done(b, v);
}

kir_val tb_unary(tb_graph *b, kir_op op, kir_val x)
{
    kir_val v = node(b, op, 1, &x);
    if (op == KIR_OP_SCALE) kir_set_float(b->g, v, "value", 0.5);
    return done(b, v);
}

kir_val tb_binary(tb_graph *b, kir_op op, kir_val x, kir_val y)
{
    kir_val in[2] = {x, y};
    return done(b, node(b, op, 2, in));
}

kir_val tb_reshape(tb_graph *b, kir_val x, int ndim, const int64_t *dims)
{
    kir_val v = node(b, KIR_OP_RESHAPE, 1, &x);
    kir_set_ints(b->g, v, "shape", dims, (uint32_t)ndim);
    return done(b, v);
}

kir_val tb_rope(tb_graph *b, kir_val x, kir_val pos)
{
    kir_val in[2] = {x, pos};
    kir_val v = node(b, KIR_OP_ROPE, 2, in);
    kir_set_float(b->g, v, "theta", 10000.0);
    kir_set_str(b->g, v, "style", "halves");
    kir_set_int(b->g, v, "rot_dim", kir_node_at(b->g, x)->dims[2]);
    kir_set_str(b->g, v, "scaling", "none");
    kir_set_float(b->g, v, "factor", 1.0);
    kir_set_float(b->g, v, "low_freq_factor", 1.0);
    kir_set_float(b->g, v, "high_freq_factor", 4.0);
    kir_set_int(b->g, v, "original_max_positions", 8192);
    return done(b, v);
}

kir_val tb_attention(tb_graph *b, kir_val q, kir_val k, kir_val vv)
{
    kir_val in[3] = {q, k, vv};
    kir_val v = node(b, KIR_OP_ATTENTION, 3, in);
    kir_set_int(b->g, v, "layer", b->n_layers++);
    kir_set_float(b->g, v, "scale", 0.125);
    kir_set_int(b->g, v, "window", 0);
    kir_set_float(b->g, v, "softcap", 0.0);
    return done(b, v);
}

kir_val tb_kv_write(tb_graph *b, kir_val k, kir_val vv)
{
    kir_val in[2] = {k, vv};
    kir_val v = node(b, KIR_OP_KV_WRITE, 2, in);
    kir_set_int(b->g, v, "layer", b->n_layers);
    return done(b, v);
}

kir_val tb_attention_cached(tb_graph *b, kir_val q, kir_val kv_write, kir_val vv)
{
    kir_val v = tb_attention(b, q, kv_write, vv);
    kir_set_int(b->g, v, "write_kv", 0);
    return v;
}

void tb_fuse(tb_graph *b, kir_val v, int64_t id) { kir_set_int(b->g, v, "fuse", id); }

kir_val tb_slice(tb_graph *b, kir_val x, int64_t start, int64_t end)
{
    kir_val v = node(b, KIR_OP_SLICE, 1, &x);
    kir_set_int(b->g, v, "start", start);
    kir_set_int(b->g, v, "end", end);
    return done(b, v);
}

kir_val tb_concat(tb_graph *b, int n, const kir_val *xs) { return done(b, node(b, KIR_OP_CONCAT, n, xs)); }

kir_val tb_output(tb_graph *b, kir_val x)
{
    kir_val v = node(b, KIR_OP_OUTPUT, 1, &x);
    kir_set_str(b->g, v, "name", "logits");
    return done(b, v);
}

void tb_verify(tb_graph *b)
{
    ks_buf log = {0};
    ks_diag d = {.log = &log, .quiet = 1};
    if (kir_verify(b->g, &d, "test graph") != 0) {
        fprintf(stderr, "test graph does not verify:\n%s", ks_buf_cstr(&log));
        abort();
    }
    ks_buf_free(&log);
}
