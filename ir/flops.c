/* flops.c — the operations a node does in a step (ir/flops.h). */
#include "ir/flops.h"

double kir_node_flops(const kir_graph *g, kir_val v, int64_t T, const int32_t *positions)
{
    const kir_node *n = &g->nodes[v];
    switch (n->op) {
    case KIR_OP_MATMUL: {
        const kir_node *w = &g->nodes[n->in[1]]; /* [N, K] */
        return 2.0 * (double)T * (double)w->dims[1] * (double)w->dims[0];
    }
    case KIR_OP_ATTENTION: {
        const kir_node *q = &g->nodes[n->in[0]], *vv = &g->nodes[n->in[2]]; /* [T,H,DK], [T,KH,DV] */
        int64_t window = kir_attr_int(g, v, KIR_A_ATTENTION_WINDOW);
        KS_ASSERT(positions || T == 0);
        double attended = 0;
        for (int64_t t = 0; t < T; t++) {
            int64_t p = positions[t];
            attended += (double)(window > 0 && window < p + 1 ? window : p + 1);
        }
        return 2.0 * (double)q->dims[1] * (double)(q->dims[2] + vv->dims[2]) * attended;
    }
    default:
        return 0;
    }
}
