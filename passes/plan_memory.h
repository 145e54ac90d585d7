/*
 * plan_memory.h — the static memory planner: every activation of a step at a
 * byte offset, fixed at build time, in one arena sized for the engine's
 * largest step (max_tokens).
 *
 * Tutorial:
 *
 *     kp_mem_plan plan;
 *     if (kp_plan_memory(g, 2048, &plan, diag) != 0) ...   // reported through diag
 *     ks_buf why = {0};
 *     if (kp_mem_plan_check(g, &plan, &why) != 0) ...       // why: the first conflict
 *     printf("arena %llu bytes (lower bound %llu, naive %llu)\n", ...);
 *     kp_plan_annotate(g, &plan);   // mem.offset / mem.bytes on the nodes, for kir_print
 *     kp_mem_plan_free(&plan);
 *
 * What a runtime does with a plan: allocate arena_bytes once; before a step,
 * copy each INPUT's data to its offset; run the nodes in schedule order, node
 * v writing its value at offset[v]; after the step, read each OUTPUT at its
 * offset. Values with KP_MEM_ALIAS are views and write nothing in the arena
 * (reshape, output, and kv_write, whose value is its k operand passed
 * through); values with KP_MEM_INPLACE are elementwise ops that write over
 * their first operand, which the kernel must allow: element i of the result
 * is computed from element i of the operands, by the thread that stores it
 * (rope, which reads the rotation partner too, is never in place). For a
 * step of T <= max_tokens tokens the same offsets hold: a value uses a
 * prefix of its slot.
 *
 * The plan holds both for a runtime that runs one kernel per node and for
 * one that runs each `fuse` group as one kernel (whose blocks run in no
 * order, and which need not write the group's internal values).
 *
 * Prefix: kp_ (passes).
 */
#ifndef KILN_PLAN_MEMORY_H
#define KILN_PLAN_MEMORY_H

#include <stdint.h>

#include "ir/ir.h"
#include "support/support.h"

#define KP_MEM_NONE UINT64_MAX /* offset of a value that has no place in the arena (weights) */
enum { KP_MEM_ALIGN = 64 };    /* every slot starts and ends on this many bytes */

/* How a value's bytes relate to another value's (kp_mem_plan.flags). */
enum {
    KP_MEM_ALIAS = 1 << 0,   /* a view (reshape, output, kv_write): its operand's bytes; writes nothing there */
    KP_MEM_INPLACE = 1 << 1, /* an elementwise op that writes over its first operand, which dies here */
};

typedef struct kp_mem_plan {
    int64_t max_tokens;         /* T the arena is sized for */
    size_t n_nodes;             /* nodes of the planned graph; the arrays below have this many entries */
    uint64_t *offset;           /* byte offset of each value in the arena; KP_MEM_NONE for WEIGHT nodes */
    uint64_t *bytes;            /* bytes of each value at max_tokens, rounded up to KP_MEM_ALIGN; 0 for weights */
    uint8_t *flags;             /* KP_MEM_* bits of each value */
    kir_val *share;             /* the operand whose bytes an ALIAS or INPLACE value reuses; KIR_NONE otherwise */
    size_t n_buffers;           /* distinct slots placed (values that share bytes count once) */
    uint64_t arena_bytes;       /* size of the arena: the planned peak */
    uint64_t naive_bytes;       /* sum of the bytes of every value that is not a view: no reuse at all */
    uint64_t lower_bound_bytes; /* most bytes live at one node (shared bytes counted once): no plan does better */
    const char *strategy;       /* the placement kept, e.g. "size/best-fit" (static text) */
} kp_mem_plan;

/* Plan g's activations for steps of up to max_tokens tokens. g must be
 * verified (kir_verify). Returns 0, or -1 after reporting through d (a bad
 * max_tokens, a value too large to address); *plan is then empty and safe
 * to free. */
int kp_plan_memory(const kir_graph *g, int64_t max_tokens, kp_mem_plan *plan, ks_diag *d);
void kp_mem_plan_free(kp_mem_plan *plan);

/* Check plan against g without trusting the planner: sizes, alignment,
 * bounds, the rules for ALIAS and INPLACE (in a `fuse` group too), and that
 * no two values live at the same node share a byte (unless one is a view of
 * the other, or one is the operand an in-place op overwrites at its last
 * use), a group's nodes being live together from its first node to its
 * last. Returns 0, or -1 with the first problem written to why. */
int kp_mem_plan_check(const kir_graph *g, const kp_mem_plan *plan, ks_buf *why);

/* Attach the plan to g for readers of the IR text: int attributes
 * "mem.offset" and "mem.bytes" on every planned node, and "mem.alias" = 1 or
 * "mem.inplace" = 1 where the value reuses its operand's bytes. */
void kp_plan_annotate(kir_graph *g, const kp_mem_plan *plan);

/* Bytes of value n for a step of n_tokens tokens, rounded up to
 * KP_MEM_ALIGN, into *out; -1 when over 2^40 bytes (no device holds such a
 * value, and the cap keeps every sum of sizes in 64 bits). */
int kp_value_bytes(const kir_node *n, int64_t n_tokens, uint64_t *out);

/* The ops that may run in place: ir/ops.def's elementwise class but ROPE
 * (element i of its result reads element i's rotation partner too). */
int kp_op_in_place(kir_op op);
/* The ops whose value is their first operand's bytes: RESHAPE, OUTPUT and
 * KV_WRITE (it writes the KV cache; its value is k, passed through). */
int kp_op_is_view(kir_op op);

/* The `fuse` groups of g as spans of the schedule: for each node, the first
 * and the last node of the group it runs in (a contiguous run of nodes with
 * the same `fuse` id, as kir_verify requires), or the node itself when it has
 * no group. first and last have g->n_nodes entries. */
void kp_group_spans(const kir_graph *g, uint32_t *first, uint32_t *last);

#endif
