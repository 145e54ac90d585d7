/*
 * cuda_profile.c — the CUDA backend's profiler (runtime/cuda/cuda_profile.h):
 * events around every launch of a profiled step, their times summed per
 * kernel name for decode and prefill steps apart, with the operations
 * they did, and the tables profile_report writes.
 */
#include "runtime/cuda/cuda_profile.h"

#include <stdlib.h>
#include <string.h>

#include "ir/flops.h"
#include "runtime/backend.h"
#include "runtime/cuda/cuda_draw.h"

krt_cu_profile *krt_cu_profile_new(const krt_cuda_api *api, krt_cu_stream stream, const krt_cuda_meta *meta,
                                   const kir_graph *g, ks_diag *d)
{
    krt_cu_profile *p = ks_try_calloc(1, sizeof *p);
    if (!p) return ks_error_oom(d, "cuda", sizeof *p, "the profiler"), NULL;
    *p = (krt_cu_profile){.api = api, .stream = stream, .meta = meta, .g = g};
    int nk = meta->n_kernels;
    int want = 2 * (nk + 1) + 2;
    p->name_of = ks_try_calloc((size_t)nk + 1, sizeof *p->name_of);
    p->events = ks_try_calloc((size_t)want, sizeof *p->events);
    p->flop_kernel = ks_try_calloc(g->n_nodes + 1, sizeof *p->flop_kernel);
    p->step_flops = ks_try_calloc((size_t)nk + 1, sizeof *p->step_flops);
    if (!p->name_of || !p->events || !p->flop_kernel || !p->step_flops) {
        ks_error_oom(d, "cuda",
                     ((size_t)nk + 1) * (sizeof *p->name_of + sizeof *p->step_flops) +
                         (size_t)want * sizeof *p->events + (g->n_nodes + 1) * sizeof *p->flop_kernel,
                     "the profiler");
        krt_cu_profile_free(p);
        return NULL;
    }
    for (int i = 0; i < nk; i++) {
        int j = 0;
        while (j < i && strcmp(meta->kernels[j].name, meta->kernels[i].name) != 0) j++;
        p->name_of[i] = j < i ? p->name_of[j] : p->n_names++;
    }
    /* node v's operations: the last launch for v (an attention's kernel runs after its kv_write's),
       else the last for a node of v's fusion group (the group's one kernel) */
    for (size_t v = 0; v < g->n_nodes; v++) {
        p->flop_kernel[v] = -1;
        kir_op op = g->nodes[v].op;
        int64_t group = op == KIR_OP_WEIGHT || op == KIR_OP_INPUT ? -1 : kir_attr_int(g, (kir_val)v, KIR_A_ANY_FUSE);
        int in_group = -1;
        for (int i = 0; i < nk; i++) {
            uint32_t u = meta->kernels[i].node;
            if (u == v) p->flop_kernel[v] = i;
            if (group >= 0 && u < g->n_nodes && kir_attr_int(g, (kir_val)u, KIR_A_ANY_FUSE) == group) in_group = i;
        }
        if (p->flop_kernel[v] < 0) p->flop_kernel[v] = in_group;
    }
    for (int c = 0; c < 2; c++) {
        p->prof[c].launches = ks_try_calloc((size_t)p->n_names + 1, sizeof *p->prof[c].launches);
        p->prof[c].kernel_ms = ks_try_calloc((size_t)p->n_names + 1, sizeof *p->prof[c].kernel_ms);
        p->prof[c].flops = ks_try_calloc((size_t)p->n_names + 1, sizeof *p->prof[c].flops);
        if (!p->prof[c].launches || !p->prof[c].kernel_ms || !p->prof[c].flops) {
            ks_error_oom(d, "cuda", ((size_t)p->n_names + 1) * 3 * sizeof(double), "the profiler");
            krt_cu_profile_free(p);
            return NULL;
        }
    }
    for (; p->n_events < want; p->n_events++) {
        krt_cu_result r = api->cuEventCreate(&p->events[p->n_events], KRT_CU_EVENT_DEFAULT);
        if (r != 0) {
            krt_cuda_error(api, d, r, "cannot create the events that time the kernels");
            krt_cu_profile_free(p);
            return NULL;
        }
    }
    return p;
}

void krt_cu_profile_free(krt_cu_profile *p)
{
    if (!p) return;
    for (int i = 0; i < p->n_events; i++) p->api->cuEventDestroy(p->events[i]);
    free(p->events);
    free(p->name_of);
    free(p->flop_kernel);
    free(p->step_flops);
    for (int c = 0; c < 2; c++) {
        free(p->prof[c].launches);
        free(p->prof[c].kernel_ms);
        free(p->prof[c].flops);
    }
    free(p);
}

int krt_cu_profile_record(krt_cu_profile *p, int i, ks_diag *d)
{
    KS_ASSERT(i >= 0 && i < p->n_events);
    krt_cu_result r = p->api->cuEventRecord(p->events[i], p->stream);
    if (r != 0) return krt_cuda_error(p->api, d, r, "cannot record an event to time the kernels");
    return 0;
}

/* The milliseconds between events a and b, into *ms. */
static int elapsed(const krt_cu_profile *p, int a, int b, double *ms, ks_diag *d)
{
    float t = 0;
    krt_cu_result r = p->api->cuEventElapsedTime(&t, p->events[a], p->events[b]);
    if (r != 0) return krt_cuda_error(p->api, d, r, "cannot read the kernels' times");
    *ms = t;
    return 0;
}

int krt_cu_profile_collect(krt_cu_profile *p, const krt_step *st, int64_t run, int n_draw, int head, ks_diag *d)
{
    int64_t T = st->n_tokens;
    krt_cu_prof_class *c = &p->prof[T > KRT_PROFILE_DECODE_TOKENS];
    int nk = p->meta->n_kernels;
    double ms = 0;
    memset(p->step_flops, 0, sizeof *p->step_flops * (size_t)nk);
    for (size_t v = 0; v < p->g->n_nodes; v++) {
        int k = p->flop_kernel[v];
        if (k >= 0) /* the head on the drawn rows only did their work (its nodes count no positions) */
            p->step_flops[k] += kir_node_flops(p->g, (kir_val)v, k == head ? n_draw : T, st->positions);
    }
    for (int i = 0; i < nk; i++) {
        int ran = 1; /* launch() skips a kernel whose grid is empty at this T */
        const int large = krt_cuda_large(&p->meta->kernels[i], T, run);
        for (int g = 0; g < 3; g++) ran &= krt_cuda_grid_dim(&p->meta->kernels[i], g, T, large) > 0;
        if (!ran) continue;
        if (elapsed(p, 2 * i, 2 * i + 1, &ms, d) != 0) return -1;
        c->launches[p->name_of[i]]++;
        c->kernel_ms[p->name_of[i]] += ms;
        c->flops[p->name_of[i]] += p->step_flops[i];
    }
    if (n_draw > 0) {
        if (elapsed(p, 2 * nk, 2 * nk + 1, &ms, d) != 0) return -1;
        c->launches[p->n_names]++;
        c->kernel_ms[p->n_names] += ms;
    }
    if (elapsed(p, 2 * (nk + 1), 2 * (nk + 1) + 1, &ms, d) != 0) return -1;
    if (c->steps == 0 || ms < c->min_ms) c->min_ms = ms;
    if (c->steps == 0 || ms > c->max_ms) c->max_ms = ms;
    c->steps++;
    c->tokens += T;
    c->step_ms += ms;
    return 0;
}

/* The ops of v's `fuse` group in schedule order, views left out, e.g.
 * "rms_norm, matmul, 3 slice, 2 rope, kv_write". */
static void group_ops(const kir_graph *g, kir_val v, int64_t group, ks_buf *b)
{
    size_t first = v, last = v;
    while (first > 0 && kir_attr_int(g, (kir_val)(first - 1), KIR_A_ANY_FUSE) == group) first--;
    while (last + 1 < g->n_nodes && kir_attr_int(g, (kir_val)(last + 1), KIR_A_ANY_FUSE) == group) last++;
    int shown = 0;
    for (size_t u = first; u <= last; u++) {
        kir_op op = g->nodes[u].op;
        if (op == KIR_OP_RESHAPE) continue;
        int seen = 0, count = 0;
        for (size_t w = first; w <= last; w++) {
            seen |= w < u && g->nodes[w].op == op;
            count += g->nodes[w].op == op;
        }
        if (seen) continue;
        ks_buf_puts(b, shown++ ? ", " : "");
        if (count > 1) ks_buf_printf(b, "%d ", count);
        ks_buf_puts(b, kir_op_table[op].name);
    }
}

/* What kernel name j computes: "%7 matmul [fuse 0: rms_norm, matmul, 3
 * slice, 2 rope, kv_write], %36, %65" (the first four of the nodes it is
 * launched for, and their count when there are more). */
static void kernel_nodes(const krt_cu_profile *p, int j, ks_buf *b)
{
    if (j == p->n_names) {
        ks_buf_puts(b, "the next tokens' draws");
        return;
    }
    int shown = 0, count = 0;
    uint32_t last = UINT32_MAX;
    for (int i = 0; i < p->meta->n_kernels; i++) {
        uint32_t v = p->meta->kernels[i].node;
        if (p->name_of[i] != j || v == last) continue; /* a node may launch it twice in a row */
        last = v;
        if (count++ >= 4) continue;
        ks_buf_printf(b, "%s%%%u", shown++ ? ", " : "", v);
        if (shown == 1) {
            ks_buf_printf(b, " %s", kir_op_table[p->g->nodes[v].op].name);
            int64_t group = kir_attr_int(p->g, (kir_val)v, KIR_A_ANY_FUSE);
            if (group >= 0) {
                ks_buf_printf(b, " [fuse %lld: ", (long long)group);
                group_ops(p->g, (kir_val)v, group, b);
                ks_buf_puts(b, "]");
            }
        }
    }
    if (count > shown) ks_buf_printf(b, ", ... (%d nodes)", count);
}

/* A row of a table: a kernel name and its time. */
typedef struct prof_row {
    int name;  /* kernel name index (n_names: the draw kernel) */
    double ms; /* its total */
} prof_row;

static int compare_rows(const void *a, const void *b)
{
    const prof_row *x = a, *y = b;
    if (x->ms != y->ms) return x->ms > y->ms ? -1 : 1;
    return (x->name > y->name) - (x->name < y->name);
}

/* The columns of a row's operations: GFLOP, TFLOP/s, and with a ceiling its
 * fraction of it; "-" where none were counted. */
static void flop_columns(ks_buf *out, double flops, double ms, double ceiling_tflops)
{
    if (flops <= 0) {
        ks_buf_printf(out, " %13s %8s", "-", "-");
        if (ceiling_tflops > 0) ks_buf_printf(out, " %8s", "-");
        return;
    }
    double tflops = ms > 0 ? flops / ms * 1e-9 : 0; /* FLOP a ms: 1e-9 of it is TFLOP a s */
    ks_buf_printf(out, " %13.6f %8.2f", 1e-9 * flops, tflops);
    if (ceiling_tflops > 0) ks_buf_printf(out, " %7.1f%%", 100.0 * tflops / ceiling_tflops);
}

void krt_cu_profile_report(const krt_cu_profile *p, double ceiling_tflops, ks_buf *out)
{
    const krt_cuda_meta *meta = p->meta;
    size_t width = strlen("(all kernels)");
    for (int i = 0; i < meta->n_kernels; i++)
        if (strlen(meta->kernels[i].name) > width) width = strlen(meta->kernels[i].name);
    if (strlen(KRT_CUDA_DRAW_KERNEL) > width) width = strlen(KRT_CUDA_DRAW_KERNEL);
    prof_row *rows = ks_try_calloc((size_t)p->n_names + 1, sizeof *rows);
    ks_buf what = KS_BUF_TRY;
    if (!rows) {
        ks_buf_fail(out, ((size_t)p->n_names + 1) * sizeof *rows); /* no table: out is incomplete */
        return;
    }
    int shown = 0; /* a table was written */
    for (int k = 1; k >= 0; k--) {
        const krt_cu_prof_class *c = &p->prof[k];
        if (c->steps == 0) continue;
        ks_buf_printf(out,
                      "kiln: profile: %ld %s step%s (%ld tokens; %s %d tokens a step): device time %.3f ms, %.1f µs a "
                      "step (min %.1f, max %.1f)\n",
                      c->steps, k ? "prefill" : "decode", c->steps == 1 ? "" : "s", c->tokens, k ? ">" : "<=",
                      KRT_PROFILE_DECODE_TOKENS, c->step_ms, 1e3 * c->step_ms / (double)c->steps, 1e3 * c->min_ms,
                      1e3 * c->max_ms);
        /* the columns below, by hand: µ is two bytes, which printf's widths count */
        ks_buf_printf(out, "  %-*s  launches     total µs     mean µs   share         GFLOP  TFLOP/s%s  computes\n",
                      (int)width, "kernel", ceiling_tflops > 0 ? "  ceiling" : "");
        int n = 0;
        double sum = 0, flops = 0;
        for (int j = 0; j <= p->n_names; j++)
            if (c->launches[j] > 0)
                rows[n++] = (prof_row){j, c->kernel_ms[j]}, sum += c->kernel_ms[j], flops += c->flops[j];
        qsort(rows, (size_t)n, sizeof *rows, compare_rows);
        long launches = 0;
        for (int r = 0; r < n; r++) {
            int j = rows[r].name;
            const char *name = KRT_CUDA_DRAW_KERNEL;
            for (int i = 0; i < meta->n_kernels && j < p->n_names; i++)
                if (p->name_of[i] == j) {
                    name = meta->kernels[i].name;
                    break;
                }
            what.len = 0;
            kernel_nodes(p, j, &what);
            launches += c->launches[j];
            ks_buf_printf(out, "  %-*s %9ld %12.1f %11.2f %6.1f%%", (int)width, name, c->launches[j],
                          1e3 * c->kernel_ms[j], 1e3 * c->kernel_ms[j] / (double)c->launches[j],
                          c->step_ms > 0 ? 100.0 * c->kernel_ms[j] / c->step_ms : 0.0);
            flop_columns(out, c->flops[j], c->kernel_ms[j], ceiling_tflops);
            ks_buf_printf(out, "  %s\n", ks_buf_cstr(&what));
        }
        ks_buf_printf(out, "  %-*s %9ld %12.1f %11s %6.1f%%", (int)width, "(all kernels)", launches, 1e3 * sum, "",
                      c->step_ms > 0 ? 100.0 * sum / c->step_ms : 0.0);
        flop_columns(out, flops, sum, ceiling_tflops);
        ks_buf_puts(out, "\n");
        ks_buf_printf(out, "  %-*s %9s %12.1f %11s %6.1f%% %13s %8s%s  %s\n", (int)width, "(the rest)", "",
                      1e3 * (c->step_ms - sum), "", c->step_ms > 0 ? 100.0 * (c->step_ms - sum) / c->step_ms : 0.0, "",
                      "", ceiling_tflops > 0 ? "         " : "", "uploads, copies back, and the device idle between kernels");
        shown = 1;
    }
    if (shown) {
        ks_buf_puts(out, "kiln: profile: GFLOP: the operations the kernels did, matmuls 2·T·K·N, attention 2·H·(DK + DV) "
                         "a position each token attends (ir/flops.h); the other ops count none (-); TFLOP/s: GFLOP "
                         "over the kernel's total time");
        if (ceiling_tflops > 0) ks_buf_printf(out, "; ceiling: TFLOP/s as a fraction of %g TFLOP/s", ceiling_tflops);
        ks_buf_puts(out, "\n");
    }
    if (what.failed) ks_buf_fail(out, what.failed); /* a row's nodes are missing */
    ks_buf_free(&what);
    free(rows);
}
