/*
 * plan.h — the memory plan as a graph carries it, and its checker.
 *
 * The memory planner (passes/plan_memory.c) gives every activation of a
 * step a byte offset in one arena sized for the engine's largest step. The
 * graph carries the plan in its text form, where a user may edit it (kiln
 * build --from-ir) and an engine file stores it:
 *
 *     param mem.max_tokens = 2048          tokens of the largest step
 *     param mem.arena_bytes = 4718592      the arena's size
 *     param mem.lower_bound_bytes = ...    the planner's report (optional)
 *     param mem.naive_bytes = ...          the planner's report (optional)
 *     %9 : f32[T,128] = matmul(...) {mem.offset=0, mem.bytes=262144}
 *     %10 : f32[T,128] = add(...) {mem.offset=0, mem.bytes=262144, mem.inplace=1}
 *     %11 : f32[T,128] = output(%10) {..., mem.offset=0, mem.bytes=262144, mem.alias=1}
 *
 * Every runtime trusts it (the interpreter and the CUDA backend write each
 * value at its offset), so it is checked wherever a graph is verified:
 * kir_verify runs kir_verify_plan, which reads the plan and proves it with
 * kir_plan_check. The planner runs kir_plan_check on its own plans too.
 *
 * Tutorial:
 *
 *     kir_mem_plan p;
 *     int rc = kir_plan_read(g, &p, diag, "llama.ir"); // 1: read, 0: no plan, -1: reported
 *     ks_buf why = {0};
 *     kir_val where;
 *     if (rc == 1 && kir_plan_check(g, &p, &why, &where) != 0) ...  // why: the first problem
 *     kir_mem_plan_free(&p);
 *
 * Prefix: kir_.
 */
#ifndef KILN_IR_PLAN_H
#define KILN_IR_PLAN_H

#include <stdint.h>

#include "ir/ir.h"

#define KIR_MEM_NONE UINT64_MAX /* offset of a value that has no place in the arena (weights) */
enum { KIR_MEM_ALIGN = 64 };    /* every planned value starts and ends on this many bytes */
/* The most bytes one value may take at max_tokens: no device holds more, and
 * the cap keeps every sum of sizes within 64 bits (2^22 nodes x 2^40 bytes). */
#define KIR_MEM_MAX_VALUE ((uint64_t)1 << 40)
/* The largest arena a plan may ask for (256 TiB): far above any device. */
#define KIR_MEM_MAX_ARENA ((uint64_t)1 << 48)
/* The most tokens a plan may be made for (kiln build --max-tokens). */
#define KIR_MEM_MAX_TOKENS ((int64_t)1 << 24)

/* How a value's bytes relate to another value's (kir_mem_plan.flags). */
enum {
    KIR_MEM_ALIAS = 1 << 0,   /* a view (reshape, output, kv_write): its operand's bytes; writes nothing there */
    KIR_MEM_INPLACE = 1 << 1, /* an elementwise op that writes over its first operand, which dies here */
};

/* Where each value of a graph lives. */
typedef struct kir_mem_plan {
    int64_t max_tokens;   /* T the arena is sized for (param mem.max_tokens) */
    uint64_t arena_bytes; /* size of the arena (param mem.arena_bytes) */
    size_t n_nodes;       /* nodes of the planned graph; the arrays below have this many entries */
    uint64_t *offset;     /* byte offset of each value in the arena (mem.offset); KIR_MEM_NONE for weights */
    uint64_t *bytes;      /* bytes of each value at max_tokens, rounded up to KIR_MEM_ALIGN (mem.bytes); 0: weights */
    uint8_t *flags;       /* KIR_MEM_* bits of each value (mem.alias, mem.inplace) */
    kir_val *share;       /* the operand whose bytes an ALIAS or INPLACE value reuses; KIR_NONE otherwise */
} kir_mem_plan;

/* Empty arrays for n nodes: every offset KIR_MEM_NONE, no flags, no sharing.
 * Out of memory ends the process (the planner's); kir_mem_plan_try_init
 * returns -1 then, *p empty (the runtime's). */
void kir_mem_plan_init(kir_mem_plan *p, size_t n_nodes);
int kir_mem_plan_try_init(kir_mem_plan *p, size_t n_nodes);
void kir_mem_plan_free(kir_mem_plan *p);

/* Bytes of value n for a step of n_tokens tokens, rounded up to
 * KIR_MEM_ALIGN, into *out; -1 when over KIR_MEM_MAX_VALUE. */
int kir_value_bytes(const kir_node *n, int64_t n_tokens, uint64_t *out);

/* The ops that may run in place: ir/ops.def's elementwise class but ROPE
 * (element i of its result reads element i's rotation partner too). */
int kir_op_in_place(kir_op op);
/* The ops whose value is their first operand's bytes: RESHAPE, OUTPUT and
 * KV_WRITE (it writes the KV cache; its value is k, passed through). */
int kir_op_is_view(kir_op op);

/* The `fuse` groups of g as spans of the schedule: for each node, the first
 * and the last node of the group it runs in (a contiguous run of nodes with
 * the same `fuse` id, as kir_verify requires), or the node itself when it has
 * no group. first and last have g->n_nodes entries. */
void kir_group_spans(const kir_graph *g, uint32_t *first, uint32_t *last);

/* Check plan against g without trusting whoever made it. g must pass
 * kir_verify's structural checks. Checks sizes (each value's bytes at
 * max_tokens), alignment, bounds (inside the arena), that every value but the
 * weights has a place, the rules for ALIAS and INPLACE (in a `fuse` group
 * too), and that no two values live at the same node share a byte (unless
 * one is a view of the other, or one is the operand an in-place op overwrites
 * at its last use), a group's nodes being live together from its first node
 * to its last. O(n log n) in the nodes. Returns 0, or -1 with the first
 * problem written to why ("node %9 (matmul): ...") and *where set to the
 * node it is about (KIR_NONE: the plan as a whole). where may be NULL.
 * Out of memory is -2, why saying so ("out of memory (allocating ...)"). */
int kir_plan_check(const kir_graph *g, const kir_mem_plan *plan, ks_buf *why, kir_val *where);

/* Does g carry a plan, or any part of one (a mem.* param or attribute)? */
int kir_has_plan(const kir_graph *g);

/* Read the plan g carries into *plan: the params, checked to be what a plan
 * holds (known keys, ints, present, positive and in range, consistent), and
 * each node's mem.* attributes. Returns 1 with *plan filled (free it), 0 when
 * g carries no plan, or -1 after reporting through d at `what` (*plan is then
 * empty; out of memory is such an error). g must pass every check of
 * kir_verify but the plan's (its mem.* attributes are ir/ops.def's, checked
 * there). Bytes a node does not state (no mem.bytes) are its size at
 * max_tokens. */
int kir_plan_read(const kir_graph *g, kir_mem_plan *plan, ks_diag *d, const char *what);

/* Read and check the plan g carries, reporting the first problem through d
 * (kir_verify runs it once the graph's structure verifies). Returns the
 * number of errors reported: 0 when the plan is sound or g has none. */
int kir_verify_plan(const kir_graph *g, ks_diag *d, const char *what);

/* Write plan into g: params mem.max_tokens and mem.arena_bytes, and on every
 * planned node mem.offset, mem.bytes, and mem.alias = 1 or mem.inplace = 1
 * where the value reuses its operand's bytes. */
void kir_plan_annotate(kir_graph *g, const kir_mem_plan *plan);

/* Remove every part of a plan from g (mem.* params and attributes): what a
 * transform that changes the graph must do, as the plan was for the graph
 * before it. */
void kir_plan_drop(kir_graph *g);

#endif
