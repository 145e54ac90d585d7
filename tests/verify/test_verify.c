/*
 * test_verify.c — kiln verify must catch a wrong fused weight and say where.
 * Builds llama-gqa-tiny unfused and fused (all passes), then:
 *  - unchanged: no divergence;
 *  - one element of the K rows of layer 1's merged QKV weight perturbed: the
 *    first diverging value is the unfused graph's K projection of layer 1
 *    (the matmul that reads wk[1]), named by its .kiln place;
 *  - the same in the Q rows: the Q projection.
 * usage: test_verify MODEL_DIR
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/driver.h"
#include "compiler/verify.h"
#include "passes/derived_weight.h"
#include "tests/check.h"

static float **weights_of(const kd_model *m, const kir_graph *g, ks_diag *d)
{
    float **w = calloc(g->n_nodes, sizeof *w);
    for (size_t v = 0; v < g->n_nodes; v++)
        if (g->nodes[v].op == KIR_OP_WEIGHT) {
            w[v] = malloc(sizeof(float) * (size_t)kir_elems(&g->nodes[v], 1));
            if (kd_weight_data(m, g, (kir_val)v, w[v], d) != 0) exit(1);
        }
    return w;
}

static kir_val weight_named(const kir_graph *g, const char *name)
{
    for (size_t v = 0; v < g->n_nodes; v++)
        if (g->nodes[v].op == KIR_OP_WEIGHT && strcmp(kir_get_str(g, (kir_val)v, "name", ""), name) == 0)
            return (kir_val)v;
    return KIR_NONE;
}

/* The matmul that reads weight w. */
static kir_val reader_of(const kir_graph *g, kir_val w)
{
    for (size_t v = 0; v < g->n_nodes; v++)
        if (g->nodes[v].op == KIR_OP_MATMUL && g->nodes[v].in[1] == w) return (kir_val)v;
    return KIR_NONE;
}

static void run(const char *what, const kir_graph *ref, float **wr, const kir_graph *test, float **wt, int expect_div,
                kir_val expect_first)
{
    ks_diag d = {0};
    kd_verify_opts o = {.tolerance = 1e-4, .prompt_tokens = 12, .decode_steps = 2, .seed = 3, .out = stdout};
    kd_verify_result r;
    printf("== %s\n", what);
    int rc = kd_verify_graphs(ref, (const void *const *)wr, test, (const void *const *)wt, &o, &r, &d);
    CHECK_MSG(rc == 0, "%s: verify ran", what);
    CHECK_MSG(r.diverged == expect_div, "%s: diverged %d", what, r.diverged);
    CHECK_MSG(r.first == expect_first, "%s: first diverging node %u, expected %u", what, r.first, expect_first);
    CHECK_MSG(r.compared > 20, "%s: compared only %d values", what, r.compared);
}

int main(int argc, char **argv)
{
    if (argc != 2) return 2;
    ks_diag d = {0};
    kd_inputs in = {.input = argv[1]};
    kd_model m;
    if (kd_model_load(&in, 1, &m, &d) != 0 || kd_optimize(&in, &m, &d) != 0) return 1;
    const kir_graph *ref = m.model->graph, *test = kd_graph(&m);
    float **wr = weights_of(&m, ref, &d), **wt = weights_of(&m, test, &d);

    run("unchanged", ref, wr, test, wt, 0, KIR_NONE);

    kir_val qkv = weight_named(test, "wq[1]+wk[1]+wv[1]");
    CHECK_MSG(qkv != KIR_NONE, "layer 1's merged QKV weight is in the fused graph");
    if (qkv == KIR_NONE) return 1;
    int64_t q_rows = kir_node_at(ref, weight_named(ref, "wq[1]"))->dims[0];
    int64_t k_in = kir_node_at(test, qkv)->dims[1];
    float *w = wt[qkv];
    size_t in_k = (size_t)(q_rows + 5) * (size_t)k_in + 7, in_q = 3 * (size_t)k_in + 11;

    w[in_k] += 0.5f;
    run("one element of wk[1] inside the merged weight", ref, wr, test, wt, 1, reader_of(ref, weight_named(ref, "wk[1]")));
    w[in_k] -= 0.5f;
    w[in_q] += 0.5f;
    run("one element of wq[1] inside the merged weight", ref, wr, test, wt, 1, reader_of(ref, weight_named(ref, "wq[1]")));

    for (size_t v = 0; v < ref->n_nodes; v++) free(wr[v]);
    for (size_t v = 0; v < test->n_nodes; v++) free(wt[v]);
    free(wr);
    free(wt);
    kd_model_free(&m);
    return check_finish("verify_perturbed");
}
