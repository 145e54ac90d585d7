/*
 * pipeline.c — the pass list and the pass manager (passes/pipeline.h).
 *
 * The order matters for what fuses, not for correctness (each pass works on
 * any verified graph):
 *  - sibling matmuls merge first, so that a norm feeding Q, K and V has one
 *    consumer left and can become the merged matmul's prologue;
 *  - quantization after the merge, so a merged weight is quantized once;
 *  - an attention whose V is part of its K shares its cache rows first, so
 *    that the kv_write split off it writes K alone;
 *  - kv_write is split off attention before the epilogues grow, so that the
 *    QKV kernel writes the cache and attention only reads it;
 *  - epilogues before prologues: a prologue norm joins the group its matmul
 *    anchors;
 *  - add + norm takes what the other groups left;
 *  - dead-node elimination: the passes before leave the weights they
 *    replaced for it to drop, and it renumbers the groups;
 *  - precision once the groups are final: what a group keeps in registers
 *    stays f32, what it stores becomes half; a quantized KV cache after it
 *    (its kv_dtype replaces the compute dtype's);
 *  - the rows of a token's routing, and a head's norm with its rotation,
 *    after precision: their groups keep the dtypes (a rounding that moves
 *    can change which experts a mixture of experts chooses);
 *  - the memory plan last: it places the values of the graph as it is.
 */
#include "passes/pipeline.h"

#include <stdlib.h>
#include <string.h>

#include "ir/plan.h"
#include "passes/rewrite.h"

const kp_pass kp_passes[] = {
    {"fuse_sibling_matmuls", "matmuls that share an input become one over a concatenated weight, then slices",
     kp_fuse_sibling_matmuls},
    {"quantize", "matmuls over float weights become matmuls over quantized codes and scales (--quant)", kp_quantize},
    {"share_kv", "an attention whose v is each head's first dims of its k keeps K alone in the cache (v_in_k)",
     kp_share_kv},
    {"split_kv_write", "attention's KV-cache write becomes a kv_write node; attention only reads",
     kp_split_kv_write},
    {"fuse_epilogues", "a matmul and the elementwise, view and kv_write nodes after it become one kernel",
     kp_fuse_epilogues},
    {"fuse_norm_prologue", "a norm joins the kernel of each matmul it feeds (a copy a matmul where several)",
     kp_fuse_norm_prologue},
    {"fuse_add_norm", "a residual add and the norm of its sum become one kernel", kp_fuse_add_norm},
    {"eliminate_dead_nodes", "nodes whose values nothing uses are dropped; groups are renumbered",
     kp_eliminate_dead_nodes},
    {"lower_precision", "values stored between kernels become f16/bf16 (fast precision); registers stay f32",
     kp_lower_precision},
    {"quantize_kv", "the KV cache holds int8 or fp8 codes, a scale a position and head (--kv-dtype)", kp_quantize_kv},
    {"fuse_rows", "a token's routing (softmax, topk, gather, sum, elementwise ops) becomes one kernel; dtypes kept",
     kp_fuse_rows},
    {"fuse_norm_rope", "a head norm and its rotation one kernel, an attention's q and k and its KV write one; dtypes kept",
     kp_fuse_norm_rope},
    {"plan_memory", "every activation of a step at a fixed offset in one arena (mem.offset); last",
     kp_plan_memory_pass},
};
const size_t kp_pass_count = sizeof kp_passes / sizeof kp_passes[0];

/* Most passes a --passes list may name (a list may repeat passes). */
enum { KP_MAX_RUN = 256 };

const kp_pass *kp_pass_find(const char *name)
{
    for (size_t i = 0; i < kp_pass_count; i++)
        if (strcmp(kp_passes[i].name, name) == 0) return &kp_passes[i];
    return NULL;
}

size_t kp_count_kernels(const kir_graph *g)
{
    size_t kernels = 0;
    int64_t run = -1; /* the group of the previous node */
    for (size_t v = 0; v < g->n_nodes; v++) {
        int64_t id = kp_group_of(g, (kir_val)v);
        if (id >= 0)
            kernels += id != run; /* groups are contiguous: one kernel per run */
        else
            kernels += (size_t)kp_is_compute(g, (kir_val)v);
        run = id;
    }
    return kernels;
}

/* "unknown pass 'x' (the passes: a, b, c)" */
static int unknown_pass(ks_diag *d, const char *what, const char *name, size_t len)
{
    ks_buf known = {0};
    for (size_t i = 0; i < kp_pass_count; i++) ks_buf_printf(&known, "%s%s", i ? ", " : "", kp_passes[i].name);
    ks_error(d, what, "unknown pass '%.*s' (the passes: %s)", (int)len, name, ks_buf_cstr(&known));
    ks_buf_free(&known);
    return -1;
}

/* Append the passes that names (entries, each a name or a comma-separated
 * list of them) lists to out[*n]. Returns 0, or -1 after reporting. */
static int resolve_names(const char *const *names, size_t n_names, const kp_pass **out, size_t *n, ks_diag *d,
                         const char *what)
{
    for (size_t i = 0; i < n_names; i++) {
        const char *p = names[i];
        for (;;) {
            const char *end = strchr(p, ',');
            size_t len = end ? (size_t)(end - p) : strlen(p);
            const kp_pass *found = NULL;
            for (size_t k = 0; k < kp_pass_count && !found; k++)
                if (strlen(kp_passes[k].name) == len && strncmp(kp_passes[k].name, p, len) == 0) found = &kp_passes[k];
            if (!found) return unknown_pass(d, what, p, len);
            if (*n == KP_MAX_RUN) {
                ks_error(d, what, "more than %d passes to run", KP_MAX_RUN);
                return -1;
            }
            out[(*n)++] = found;
            if (!end) break;
            p = end + 1;
        }
    }
    return 0;
}

/* kir_verify g; on failure say which pass made it. */
static int verify_after(const kir_graph *g, const char *pass, const char *what, ks_diag *d)
{
    ks_buf name = {0};
    if (pass)
        ks_buf_printf(&name, "IR after %s", pass);
    else
        ks_buf_puts(&name, "IR given to the passes");
    int errors = kir_verify(g, d, ks_buf_cstr(&name));
    ks_buf_free(&name);
    if (errors == 0) return 0;
    if (pass)
        ks_error(d, what, "the graph after pass %s does not verify (a bug in kiln)", pass);
    else
        ks_error(d, what, "the graph given to the passes does not verify");
    return -1;
}

int kp_run_pipeline(kir_graph **g, const kp_options *opt, kp_pass_stats **stats, size_t *n_stats, ks_diag *d)
{
    static const kp_options defaults = {0};
    if (!opt) opt = &defaults;
    const char *what = opt->what ? opt->what : "kiln";
    if (stats) *stats = NULL;
    if (n_stats) *n_stats = 0;

    const kp_pass *selected[KP_MAX_RUN], *disabled[KP_MAX_RUN];
    size_t n_selected = 0, n_disabled = 0;
    if (opt->passes) {
        if (resolve_names(opt->passes, opt->n_passes, selected, &n_selected, d, what) != 0) return -1;
    } else {
        for (size_t i = 0; i < kp_pass_count; i++) selected[n_selected++] = &kp_passes[i];
    }
    if (resolve_names(opt->disabled, opt->n_disabled, disabled, &n_disabled, d, what) != 0) return -1;

    /* plan_memory places the values of the final graph: nothing may run after it */
    for (size_t i = 0; i + 1 < n_selected; i++) {
        int off = 0;
        for (size_t k = 0; k < n_disabled && !off; k++) off = disabled[k] == selected[i];
        if (!off && selected[i]->run == kp_plan_memory_pass) {
            ks_error(d, what, "plan_memory places the values of the final graph: it must be the last pass (%s comes "
                              "after it)", selected[i + 1]->name);
            return -1;
        }
    }
    int verify = opt->verify;
#ifndef NDEBUG
    verify = 1;
#endif
    if (verify && verify_after(*g, NULL, what, d) != 0) return -1;
    /* a memory plan is for the graph as it is: the passes change it (and
     * copy attributes to the nodes they make), so the plan goes;
     * plan_memory, the last pass, makes a new one */
    int any_runs = 0;
    for (size_t i = 0; i < n_selected && !any_runs; i++) {
        int off = 0;
        for (size_t k = 0; k < n_disabled && !off; k++) off = disabled[k] == selected[i];
        any_runs = !off;
    }
    if (any_runs) kir_plan_drop(*g);

    kp_pass_stats *st = ks_xcalloc(n_selected ? n_selected : 1, sizeof *st);
    size_t n_run = 0;
    int rc = 0;
    for (size_t i = 0; i < n_selected && rc == 0; i++) {
        const kp_pass *pass = selected[i];
        int off = 0;
        for (size_t k = 0; k < n_disabled && !off; k++) off = disabled[k] == pass;
        if (off) continue;
        kp_pass_stats *s = &st[n_run++];
        s->pass = pass->name;
        s->nodes_before = (*g)->n_nodes;
        s->kernels_before = kp_count_kernels(*g);
        rc = pass->run(g, opt, s, d);
        s->nodes_after = (*g)->n_nodes;
        s->kernels_after = kp_count_kernels(*g);
        if (rc == 0 && verify) rc = verify_after(*g, pass->name, what, d);
        if (rc == 0 && opt->after) rc = opt->after(opt->after_ctx, pass, *g, s, d);
    }
    if (stats) {
        *stats = st;
        if (n_stats) *n_stats = n_run;
    } else {
        free(st);
    }
    return rc;
}
