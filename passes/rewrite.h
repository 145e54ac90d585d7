/*
 * rewrite.h — what the graph passes share: building a rewritten graph,
 * who uses each value, and the `fuse` groups.
 *
 * The IR is an array in schedule order whose operands are indices, so a
 * pass does not edit it in place: it builds a NEW graph, copying the old
 * nodes in the order it wants and mapping each old value to its new one,
 * inserting and replacing nodes as it goes (QBE's passes rebuild a block's
 * instruction list the same way):
 *
 *     kp_rewriter rw;
 *     kp_rw_begin(&rw, old);                    // same name, files, params
 *     for (kir_val v = 0; v < old->n_nodes; v++) {
 *         if (replace_it(v)) {
 *             kir_setting set[] = {KIR_WITH_INT(KIR_A_SLICE_START, 0), ...};
 *             kir_val s = kp_rw_build(&rw, KIR_OP_SLICE, old->nodes[v].loc,
 *                                     &fused, 1, set, 2); // kir_build; fused: a NEW value
 *             rw.map[v] = s;                    // v's consumers now read s
 *         } else {
 *             kp_rw_copy(&rw, v);               // operands through rw.map
 *         }
 *     }
 *     kir_graph *g = kp_rw_end(&rw);            // old is the caller's to free
 *
 * New nodes are made with kir_build (ir/ir.h), the one builder the frontend
 * and the tests use too; kp_rw_copy copies a node as it is.
 * Locations stay valid: the new graph has the old one's files, in order.
 *
 * Groups: a node's `fuse` attribute names the kernel it belongs to (see
 * passes/pipeline.h). Passes give new groups fresh ids (kp_group_next_id)
 * and end with kp_group_renumber, so ids are dense from 0 in schedule
 * order after every pass.
 *
 * Prefix: kp_ (passes).
 */
#ifndef KILN_PASSES_REWRITE_H
#define KILN_PASSES_REWRITE_H

#include <stdint.h>

#include "ir/ir.h"

/* ---- rebuilding a graph ------------------------------------------------------------ */
typedef struct kp_rewriter {
    const kir_graph *old; /* the graph rewritten; not owned, not changed */
    kir_graph *g;         /* the new graph, built in schedule order; owned until kp_rw_end */
    kir_val *map;         /* [old->n_nodes] the new value standing for each old value; KIR_NONE: none (yet) */
} kp_rewriter;

void kp_rw_begin(kp_rewriter *rw, const kir_graph *old);
/* Append a copy of old node v (type, attributes, location), its operands
 * mapped; each must have a new value already. Sets and returns map[v]. */
kir_val kp_rw_copy(kp_rewriter *rw, kir_val v);
/* Append a new node made with kir_build: op at loc (a location of the old
 * graph) over in[0..n_in), values of the new graph (KIR_NONE: absent), with
 * the attributes set[0..n_set). A shape its rule refuses is the pass's bug
 * (it built a node that does not fit): fatal, with the rule's message. */
kir_val kp_rw_build(kp_rewriter *rw, kir_op op, kir_loc loc, const kir_val *in, int n_in, const kir_setting *set,
                    int n_set);
/* Old node v made again with kir_build over new operands in[0..n_in)
 * (values of the new graph): its op, location and attributes in their
 * order, then set[0..n_set) (a setting of an attribute v has replaces the
 * value in its place). Sets and returns map[v]. Fatal as kp_rw_build. */
kir_val kp_rw_rebuild(kp_rewriter *rw, kir_val v, const kir_val *in, int n_in, const kir_setting *set, int n_set);
/* The new graph; frees the map. */
kir_graph *kp_rw_end(kp_rewriter *rw);

/* A new graph with old's nodes in the order given (n of them, each at most
 * once; nodes left out are dropped): each node's operands must come earlier
 * in the order. When map is not NULL it receives [old->n_nodes] new values
 * (KIR_NONE for dropped nodes), which the caller frees. */
kir_graph *kp_reorder(const kir_graph *old, const kir_val *order, size_t n, kir_val **map);

/* ---- uses ----------------------------------------------------------------------------- */
/* Who uses each value, in schedule order (compressed rows: the users of v
 * are user[start[v] .. start[v+1]); a node that takes v twice is there twice). */
typedef struct kp_uses {
    size_t n;       /* nodes of the graph */
    uint32_t *start; /* [n + 1] offsets into user */
    kir_val *user;   /* [start[n]] the using nodes */
} kp_uses;

void kp_uses_build(kp_uses *u, const kir_graph *g);
void kp_uses_free(kp_uses *u);
static inline uint32_t kp_use_count(const kp_uses *u, kir_val v) { return u->start[v + 1] - u->start[v]; }

/* ---- groups ---------------------------------------------------------------------------- */
/* v's `fuse` group, or -1 when it has none. */
int64_t kp_group_of(const kir_graph *g, kir_val v);
/* v leaves its group (its `fuse` attribute removed); the caller keeps the
 * groups contiguous and renumbers. */
void kp_group_leave(kir_graph *g, kir_val v);
/* An id no node of g uses yet (one more than the largest). */
int64_t kp_group_next_id(const kir_graph *g);
/* Renumber the groups of g densely from 0 in schedule order and dissolve
 * groups of one node (a kernel of one op is no fusion). Requires contiguous
 * groups. Returns the number of groups. */
size_t kp_group_renumber(kir_graph *g);
/* Whether node v may join a group other than as its anchor: elementwise ops
 * (a binary one whose second operand repeats over leading dims, not along
 * the row), views, kv_write. */
int kp_node_joins_epilogue(const kir_graph *g, kir_val v);
/* Whether v is computed by a kernel of its own when it is in no group
 * (everything but inputs, weights, the output and reshapes, which are
 * free views). */
int kp_is_compute(const kir_graph *g, kir_val v);

/* *gp rebuilt in the order given (kp_reorder's rules), each node v of the old graph with gid[v] >= 0
 * put in group gid[v], the groups renumbered (kp_group_renumber); the old graph freed. */
void kp_regroup(kir_graph **gp, const kir_val *order, size_t n, const int64_t *gid);

/* Order the window [first, last] of g so that its members (member[v] != 0,
 * indexed by old value) are contiguous: first the non-members that depend
 * on no member, then the members, then the non-members that do, each in
 * schedule order; appended to order at *n. Values outside the window are
 * untouched. Returns -1 (nothing appended) when a member depends on a
 * non-member that depends on a member, which no order can make contiguous.
 * dep is scratch of g->n_nodes bytes, all zero on entry and on return. */
int kp_order_window(const kir_graph *g, kir_val first, kir_val last, const uint8_t *member, uint8_t *dep,
                    kir_val *order, size_t *n);

#endif
