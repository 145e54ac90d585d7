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
 *     if (kir_plan_check(g, &plan.mem, &why, NULL) != 0) ... // why: the first conflict
 *     printf("arena %llu bytes (lower bound %llu, naive %llu)\n", ...);
 *     kp_plan_annotate(g, &plan);   // the plan in the graph (ir/plan.h), for kir_print
 *     kp_mem_plan_free(&plan);
 *
 * What a runtime does with a plan: allocate arena_bytes once; before a step,
 * copy each INPUT's data to its offset; run the nodes in schedule order, node
 * v writing its value at offset[v]; after the step, read each OUTPUT at its
 * offset. Values with KIR_MEM_ALIAS are views and write nothing in the arena
 * (reshape, output, and kv_write, whose value is its k operand passed
 * through); values with KIR_MEM_INPLACE are elementwise ops that write over
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
#include "ir/plan.h"
#include "support/support.h"

/* A plan and the planner's report on it. */
typedef struct kp_mem_plan {
    kir_mem_plan mem;           /* where each value lives (ir/plan.h): what the graph carries */
    size_t n_buffers;           /* distinct slots placed (values that share bytes count once) */
    uint64_t naive_bytes;       /* sum of the bytes of every value that is not a view: no reuse at all */
    uint64_t lower_bound_bytes; /* most bytes live at one node (shared bytes counted once): no plan does better */
    const char *strategy;       /* the placement kept, e.g. "size/best-fit" (static text) */
} kp_mem_plan;

/* Plan g's activations for steps of up to max_tokens tokens. g must be
 * verified (kir_verify). Returns 0, or -1 after reporting through d (a bad
 * max_tokens, a value too large to address, an arena over
 * KIR_MEM_MAX_ARENA); *plan is then empty and safe to free. */
int kp_plan_memory(const kir_graph *g, int64_t max_tokens, kp_mem_plan *plan, ks_diag *d);
void kp_mem_plan_free(kp_mem_plan *plan);

/* Attach the plan to g (kir_plan_annotate: params mem.max_tokens and
 * mem.arena_bytes, mem.offset / mem.bytes / mem.alias / mem.inplace on the
 * nodes), and the report: params mem.lower_bound_bytes and mem.naive_bytes. */
void kp_plan_annotate(kir_graph *g, const kp_mem_plan *plan);

#endif
