/* graph_build.c — see graph_build.h. */
#include "tests/graph_build.h"

#include <stdio.h>
#include <stdlib.h>

/* ---- any graph, at a given location ------------------------------------------------ */
kir_val tb_build(kir_graph *g, kir_op op, kir_loc at, const kir_val *in, int n_in, const kir_setting *set, int n_set)
{
    ks_buf err = {0};
    kir_val v = kir_build(g, op, at, in, n_in, set, n_set, &err);
    if (v == KIR_NONE) {
        fprintf(stderr, "test graph %s: %s\n", g->name, ks_buf_cstr(&err));
        abort();
    }
    ks_buf_free(&err);
    return v;
}

kir_val tb_op(kir_graph *g, kir_op op, kir_loc at, kir_val a, kir_val b)
{
    kir_val in[2] = {a, b};
    return tb_build(g, op, at, in, 2, NULL, 0);
}

kir_val tb_scale_at(kir_graph *g, kir_loc at, kir_val x, double value)
{
    kir_setting set = KIR_WITH_FLOAT(KIR_A_SCALE_VALUE, value);
    return tb_build(g, KIR_OP_SCALE, at, &x, 1, &set, 1);
}

kir_val tb_norm_at(kir_graph *g, kir_loc at, kir_op op, kir_val x, kir_val w, kir_val b, double eps)
{
    KS_ASSERT(op == KIR_OP_RMS_NORM || op == KIR_OP_LAYER_NORM);
    KS_ASSERT(op == KIR_OP_LAYER_NORM || b == KIR_NONE);
    kir_val in[3] = {x, w, b};
    kir_setting set = KIR_WITH_FLOAT(op == KIR_OP_RMS_NORM ? KIR_A_RMS_NORM_EPS : KIR_A_LAYER_NORM_EPS, eps);
    return tb_build(g, op, at, in, 3, &set, 1);
}

kir_val tb_reshape_at(kir_graph *g, kir_loc at, kir_val x, int ndim, const int64_t *dims)
{
    kir_setting set = KIR_WITH_INTS(KIR_A_RESHAPE_SHAPE, dims, (uint32_t)ndim);
    return tb_build(g, KIR_OP_RESHAPE, at, &x, 1, &set, 1);
}

kir_val tb_slice_at(kir_graph *g, kir_loc at, kir_val x, int64_t start, int64_t end)
{
    kir_setting set[2] = {KIR_WITH_INT(KIR_A_SLICE_START, start), KIR_WITH_INT(KIR_A_SLICE_END, end)};
    return tb_build(g, KIR_OP_SLICE, at, &x, 1, set, 2);
}

kir_val tb_output_at(kir_graph *g, kir_loc at, kir_val x, const char *name)
{
    kir_setting set = KIR_WITH_STR(KIR_A_OUTPUT_NAME, name);
    return tb_build(g, KIR_OP_OUTPUT, at, &x, 1, &set, 1);
}

kir_val tb_kv_write_at(kir_graph *g, kir_loc at, kir_val k, kir_val v, int64_t layer)
{
    kir_val in[2] = {k, v};
    kir_setting set = KIR_WITH_INT(KIR_A_KV_WRITE_LAYER, layer);
    return tb_build(g, KIR_OP_KV_WRITE, at, in, 2, &set, 1);
}

/* attention's attributes, write_kv (1: write the cache, 0: read it only)
 * after them when it is 0; returns how many */
static int attention_settings(kir_setting set[5], int64_t layer, double scale, int64_t window, double softcap,
                              int write_kv)
{
    set[0] = KIR_WITH_INT(KIR_A_ATTENTION_LAYER, layer);
    set[1] = KIR_WITH_FLOAT(KIR_A_ATTENTION_SCALE, scale);
    set[2] = KIR_WITH_INT(KIR_A_ATTENTION_WINDOW, window);
    set[3] = KIR_WITH_FLOAT(KIR_A_ATTENTION_SOFTCAP, softcap);
    if (write_kv) return 4;
    set[4] = KIR_WITH_INT(KIR_A_ATTENTION_WRITE_KV, 0);
    return 5;
}

kir_val tb_attention_at(kir_graph *g, kir_loc at, kir_val q, kir_val k, kir_val v, int64_t layer, double scale,
                        int64_t window, double softcap)
{
    kir_val in[3] = {q, k, v};
    kir_setting set[5];
    int n = attention_settings(set, layer, scale, window, softcap, 1);
    return tb_build(g, KIR_OP_ATTENTION, at, in, 3, set, n);
}

tb_rope_attrs tb_rope_plain(int64_t rot_dim)
{
    return (tb_rope_attrs){10000.0, KIR_ROPE_STYLE_HALVES, rot_dim, KIR_ROPE_SCALING_NONE, 1.0, 1.0, 4.0, 8192};
}

kir_val tb_rope_at(kir_graph *g, kir_loc at, kir_val x, kir_val pos, const tb_rope_attrs *r)
{
    kir_val in[2] = {x, pos};
    kir_setting set[8] = {
        KIR_WITH_FLOAT(KIR_A_ROPE_THETA, r->theta),
        KIR_WITH_WORD(KIR_A_ROPE_STYLE, r->style),
        KIR_WITH_INT(KIR_A_ROPE_ROT_DIM, r->rot_dim),
        KIR_WITH_WORD(KIR_A_ROPE_SCALING, r->scaling),
        KIR_WITH_FLOAT(KIR_A_ROPE_FACTOR, r->factor),
        KIR_WITH_FLOAT(KIR_A_ROPE_LOW_FREQ_FACTOR, r->low_freq_factor),
        KIR_WITH_FLOAT(KIR_A_ROPE_HIGH_FREQ_FACTOR, r->high_freq_factor),
        KIR_WITH_INT(KIR_A_ROPE_ORIGINAL_MAX_POSITIONS, r->original_max_positions),
    };
    return tb_build(g, KIR_OP_ROPE, at, in, 2, set, 8);
}

kir_val tb_pad_operands(kir_graph *g, kir_val v, int n)
{
    KS_ASSERT(n <= kir_op_table[kir_node_at(g, v)->op].max_inputs);
    while (kir_node_at(g, v)->nin < n) kir_node_add_input(g, v, KIR_NONE);
    return v;
}

/* ---- the planner tests' graphs ----------------------------------------------------- */
void tb_init(tb_graph *b, const char *name)
{
    b->g = kir_graph_new(name);
    b->at = kir_loc_make(b->g, "planner-test", 1, 1);
    b->n_weights = 0;
    b->n_layers = 0;
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
    kir_val table = tb_weight(b, 2, vocab, dim);
    return tb_op(b->g, KIR_OP_EMBED, b->at, table, ids);
}

kir_val tb_matmul(tb_graph *b, kir_val x, int64_t out_features)
{
    kir_val w = tb_weight(b, 2, out_features, kir_node_at(b->g, x)->dims[1]);
    return tb_op(b->g, KIR_OP_MATMUL, b->at, x, w);
}

kir_val tb_matmul_w(tb_graph *b, kir_val x, kir_val w) { return tb_op(b->g, KIR_OP_MATMUL, b->at, x, w); }

kir_val tb_rms_norm_w(tb_graph *b, kir_val x, kir_val w)
{
    return tb_norm_at(b->g, b->at, KIR_OP_RMS_NORM, x, w, KIR_NONE, 1e-5);
}

kir_val tb_norm(tb_graph *b, kir_op op, kir_val x)
{
    const kir_node *xn = kir_node_at(b->g, x);
    int64_t d = xn->dims[xn->ndim - 1];
    kir_val w = tb_weight(b, 1, d, 0), bias = op == KIR_OP_LAYER_NORM ? tb_weight(b, 1, d, 0) : KIR_NONE;
    return tb_norm_at(b->g, b->at, op, x, w, bias, 1e-5);
}

kir_val tb_unary(tb_graph *b, kir_op op, kir_val x)
{
    return op == KIR_OP_SCALE ? tb_scale_at(b->g, b->at, x, 0.5) : tb_op(b->g, op, b->at, x, KIR_NONE);
}

kir_val tb_binary(tb_graph *b, kir_op op, kir_val x, kir_val y) { return tb_op(b->g, op, b->at, x, y); }

kir_val tb_reshape(tb_graph *b, kir_val x, int ndim, const int64_t *dims)
{
    return tb_reshape_at(b->g, b->at, x, ndim, dims);
}

kir_val tb_rope(tb_graph *b, kir_val x, kir_val pos)
{
    tb_rope_attrs r = tb_rope_plain(kir_node_at(b->g, x)->dims[2]);
    return tb_rope_at(b->g, b->at, x, pos, &r);
}

kir_val tb_attention(tb_graph *b, kir_val q, kir_val k, kir_val v)
{
    return tb_attention_at(b->g, b->at, q, k, v, b->n_layers++, 0.125, 0, 0.0);
}

kir_val tb_kv_write(tb_graph *b, kir_val k, kir_val v) { return tb_kv_write_at(b->g, b->at, k, v, b->n_layers); }

kir_val tb_attention_cached(tb_graph *b, kir_val q, kir_val kv_write, kir_val v)
{
    kir_val in[3] = {q, kv_write, v};
    kir_setting set[5];
    int n = attention_settings(set, b->n_layers++, 0.125, 0, 0.0, 0);
    return tb_build(b->g, KIR_OP_ATTENTION, b->at, in, 3, set, n);
}

void tb_fuse(tb_graph *b, kir_val v, int64_t id) { kir_attr_set_int(b->g, v, KIR_A_ANY_FUSE, id); }

kir_val tb_slice(tb_graph *b, kir_val x, int64_t start, int64_t end)
{
    return tb_slice_at(b->g, b->at, x, start, end);
}

kir_val tb_concat(tb_graph *b, int n, const kir_val *xs)
{
    return tb_build(b->g, KIR_OP_CONCAT, b->at, xs, n, NULL, 0);
}

kir_val tb_output(tb_graph *b, kir_val x) { return tb_output_at(b->g, b->at, x, "logits"); }

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
