/*
 * split_kv_write.c — attention's KV-cache write becomes a node of its own.
 *
 * Requires: a verified graph.
 * Guarantees: each attention(q, k, v[, sinks]) that writes the cache
 *   (write_kv absent or 1) becomes
 *       %w = kv_write(k, v) {layer=L}                 right after k and v are both defined
 *       attention(q, %w, v[, sinks]) {…, write_kv=0}  where it was
 *   both at the attention's location (the write v_in_k where the attention
 *   is: it stores K alone). kv_write's value is k, so the
 *   attention depends on the write; the step computes the same values and
 *   writes the same cache rows, before the attention reads them. Placed
 *   early, the write can join the kernel that computes k and v
 *   (fuse_epilogues).
 *   When k and v are defined inside a group's run, the kv_write joins that
 *   group, so that groups stay contiguous.
 * Does not: touch attention that already reads only (write_kv=0), or move
 *   any other node.
 */
#include <stdlib.h>

#include "passes/pipeline.h"
#include "passes/rewrite.h"

/* Whether attention v writes the cache itself. */
static int writes_kv(const kir_graph *g, kir_val v)
{
    return kir_node_at(g, v)->op == KIR_OP_ATTENTION && kir_attr_int(g, v, KIR_A_ATTENTION_WRITE_KV) != 0;
}

int kp_split_kv_write(kir_graph **gp, const kp_options *opt, kp_pass_stats *st, ks_diag *d)
{
    (void)d;
    const kir_graph *g = *gp;
    size_t n = g->n_nodes, splits = 0;
    /* after[v]: the first attention whose kv_write goes right after v; next[a]: the one after a */
    kir_val *after = ks_xmalloc(sizeof *after * (n ? n : 1)), *next = ks_xmalloc(sizeof *next * (n ? n : 1));
    for (size_t v = 0; v < n; v++) after[v] = next[v] = KIR_NONE;
    for (size_t i = n; i-- > 0;) { /* backwards, so that each list is in schedule order */
        kir_val a = (kir_val)i;
        if (!writes_kv(g, a)) continue;
        const kir_node *att = kir_node_at(g, a);
        kir_val last = att->in[1] > att->in[2] ? att->in[1] : att->in[2];
        next[a] = after[last];
        after[last] = a;
        splits++;
    }
    if (splits) {
        kp_rewriter rw;
        kp_rw_begin(&rw, g);
        kir_val *write = ks_xmalloc(sizeof *write * n); /* the kv_write of each split attention */
        for (kir_val v = 0; v < n; v++) {
            if (writes_kv(g, v)) {
                const kir_node *att = kir_node_at(g, v);
                /* q, the kv_write, v, and the sinks where it has them */
                kir_val in[4] = {rw.map[att->in[0]], write[v], rw.map[att->in[2]],
                                 att->nin > 3 ? rw.map[att->in[3]] : KIR_NONE};
                kir_setting read_only = KIR_WITH_INT(KIR_A_ATTENTION_WRITE_KV, 0);
                kp_rw_rebuild(&rw, v, in, att->nin > 3 ? 4 : 3, &read_only, 1);
            } else {
                kp_rw_copy(&rw, v);
            }
            for (kir_val a = after[v]; a != KIR_NONE; a = next[a]) {
                const kir_node *att = kir_node_at(g, a);
                kir_val in[2] = {rw.map[att->in[1]], rw.map[att->in[2]]};
                kir_setting set[3] = {KIR_WITH_INT(KIR_A_KV_WRITE_LAYER, kir_attr_int(g, a, KIR_A_ATTENTION_LAYER))};
                int n_set = 1;
                /* V in K's rows (share_kv): the write stores K alone */
                if (kir_attr_int(g, a, KIR_A_ATTENTION_V_IN_K)) set[n_set++] = KIR_WITH_INT(KIR_A_KV_WRITE_V_IN_K, 1);
                /* inside a group's run the write joins the group, which stays contiguous */
                int64_t id = kp_group_of(g, v);
                if (id >= 0 && v + 1 < n && kp_group_of(g, v + 1) == id) set[n_set++] = KIR_WITH_INT(KIR_A_ANY_FUSE, id);
                write[a] = kp_rw_build(&rw, KIR_OP_KV_WRITE, att->loc, in, 2, set, n_set);
            }
        }
        free(write);
        kir_graph_free(*gp);
        *gp = kp_rw_end(&rw);
    }
    free(after);
    free(next);
    st->fusions = splits;
    return 0;
}
