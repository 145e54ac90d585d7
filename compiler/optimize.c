/* optimize.c — between compiling and writing an engine: the pass pipeline
 * (or a user's edited IR), IR dumps, per-pass statistics, the memory plan;
 * and the weight data of any graph the pipeline made, by weight name. */
#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>

#include "compiler/driver.h"
#include "compiler/synthetic.h"
#include "passes/derived_weight.h"
#include "passes/quantize_weight.h"
#include "passes/pipeline.h"
#include "ir/plan.h"

const kir_graph *kd_graph(const kd_model *m) { return m->optimized ? m->optimized : m->model->graph; }

/* ---- IR dumps and statistics ------------------------------------------------------ */

typedef struct dump_ctx {
    const kd_inputs *in; /* --dump-ir-after, --dump-dir, --stats */
    int index;           /* number of the next dump file */
} dump_ctx;

static int wants_dump(const kd_inputs *in, const char *pass)
{
    if (!in->dump_after || !in->dump_dir) return 0;
    if (strcmp(in->dump_after, "all") == 0) return 1;
    size_t n = strlen(pass);
    for (const char *p = in->dump_after; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, pass, n) == 0) return 1;
        p += len + (end ? 1 : 0);
    }
    return 0;
}

/* Every name of --dump-ir-after is a stage that makes a graph: the compiled
 * (or --from-ir) graph, a pass of the pipeline, plan_memory; or "all".
 * Reports an unknown one with the known names. */
static int check_dump_names(const char *list, ks_diag *d)
{
    for (const char *p = list; *p;) {
        size_t len = strcspn(p, ",");
        int known = 0;
        static const char *const stages[] = {"compiled", "from-ir", "all"};
        for (size_t i = 0; i < sizeof stages / sizeof *stages && !known; i++)
            known = strlen(stages[i]) == len && strncmp(stages[i], p, len) == 0;
        for (size_t i = 0; i < kp_pass_count && !known; i++)
            known = strlen(kp_passes[i].name) == len && strncmp(kp_passes[i].name, p, len) == 0;
        if (!known) {
            ks_buf names = {0};
            ks_buf_puts(&names, "compiled, from-ir");
            for (size_t i = 0; i < kp_pass_count; i++) ks_buf_printf(&names, ", %s", kp_passes[i].name);
            ks_buf_puts(&names, ", all");
            ks_error(d, "kiln", "--dump-ir-after: unknown pass '%.*s' (known: %s)", (int)len, p, ks_buf_cstr(&names));
            ks_buf_free(&names);
            return -1;
        }
        p += len + (p[len] == ',');
    }
    return 0;
}

/* Write dump_dir/NN-pass.ir (numbered in pipeline order, 00 the compiled graph). */
static int dump_ir(dump_ctx *c, const char *pass, const kir_graph *g, ks_diag *d)
{
    int index = c->index++;
    if (!wants_dump(c->in, pass)) return 0;
    if (!ks_is_dir(c->in->dump_dir) && mkdir(c->in->dump_dir, 0777) != 0) {
        ks_error(d, c->in->dump_dir, "cannot create the dump folder: %s", strerror(errno));
        return -1;
    }
    char name[128];
    snprintf(name, sizeof name, "%02d-%s.ir", index, pass);
    char *path = ks_path_join(c->in->dump_dir, name);
    ks_buf text = {0};
    kir_print(g, &text);
    ks_outfile f;
    int rc = ks_outfile_open(d, &f, path, 0);
    if (rc == 0) {
        ks_outfile_write(&f, text.data, text.len);
        rc = ks_outfile_commit(d, &f);
    }
    ks_buf_free(&text);
    free(path);
    return rc;
}

static int after_pass(void *ctx, const kp_pass *pass, const kir_graph *g, const kp_pass_stats *st, ks_diag *d)
{
    dump_ctx *c = ctx;
    kd_progress_update(c->in->progress, -1);
    return dump_ir(c, pass->name, g, d);
}

static void print_stats(FILE *out, const kp_pass_stats *st, size_t n, const kir_graph *g)
{
    fprintf(out, "%-24s %7s %7s %8s %8s %7s\n", "pass", "nodes", "->", "kernels", "->", "fusions");
    for (size_t i = 0; i < n; i++)
        fprintf(out, "%-24s %7zu %7zu %8zu %8zu %7zu\n", st[i].pass, st[i].nodes_before, st[i].nodes_after,
                st[i].kernels_before, st[i].kernels_after, st[i].fusions);
    int layers = 0;
    for (size_t v = 0; v < g->n_nodes; v++)
        if (g->nodes[v].op == KIR_OP_ATTENTION) layers++;
    size_t k = kp_count_kernels(g);
    fprintf(out, "kernels: %zu", k);
    if (layers) fprintf(out, " (%d attention layers: %.2f per layer)", layers, (double)k / layers);
    fprintf(out, "\n");
    /* the memory plan, as plan_memory wrote it into the graph with the planner's report */
    const kir_param *tokens = kir_param_find(g, "mem.max_tokens"), *arena = kir_param_find(g, "mem.arena_bytes");
    const kir_param *bound = kir_param_find(g, "mem.lower_bound_bytes"), *naive = kir_param_find(g, "mem.naive_bytes");
    if (tokens && arena && bound && naive)
        fprintf(out,
                "memory plan (%lld tokens per step): arena %lld bytes, lower bound %lld (peak/bound %.4f), naive %lld\n",
                (long long)tokens->i, (long long)arena->i, (long long)bound->i,
                bound->i ? (double)arena->i / (double)bound->i : 1.0, (long long)naive->i);
}

/* Split "a,b" into a heap array of heap strings. */
static char **split_list(const char *s, size_t *n)
{
    *n = 0;
    if (!s || !*s) return NULL;
    size_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    char **v = ks_xcalloc(cap, sizeof *v);
    for (const char *p = s;;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len) {
            v[*n] = ks_xmalloc(len + 1);
            memcpy(v[*n], p, len);
            v[*n][len] = 0;
            (*n)++;
        }
        if (!end) break;
        p = end + 1;
    }
    return v;
}

static void free_list(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++) free(v[i]);
    free(v);
}

static int list_has(char **v, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(v[i], name) == 0) return 1;
    return 0;
}

/* ---- the optimize stage --------------------------------------------------------------- */

void kd_list_passes(FILE *out)
{
    for (size_t i = 0; i < kp_pass_count; i++) fprintf(out, "%-22s %s\n", kp_passes[i].name, kp_passes[i].summary);
}

kir_graph *kd_read_ir(const char *path, ks_diag *d)
{
    size_t len = 0;
    char *text = ks_read_file(d, path, &len);
    if (!text) return NULL;
    ks_source src = {path, text, len};
    kir_graph *g = kir_parse(&src, d);
    free(text);
    if (g && kir_verify(g, d, path) != 0) {
        kir_graph_free(g);
        g = NULL;
    }
    return g;
}

int64_t kd_plan_tokens(const kd_inputs *in, const kir_graph *g)
{
    if (in->max_tokens > 0) return in->max_tokens;
    const kir_param *ctx = kir_param_find(g, "max_context");
    int64_t t = ctx && ctx->kind == KIR_ATTR_INT && ctx->i > 0 ? ctx->i : KD_PLAN_TOKENS_DEFAULT;
    return t < KD_PLAN_TOKENS_DEFAULT ? t : KD_PLAN_TOKENS_DEFAULT;
}

int kd_compute_dtype(const kd_inputs *in, const kir_graph *g, kir_dtype *out, ks_diag *d)
{
    *out = KIR_F32;
    const char *w = kd_weights_dtype(g);
    int half = strcmp(w, "bf16") == 0 || strcmp(w, "f16") == 0;
    /* the default: fast for half weights (the CUDA backend and the interpreter compute it), exact for f32 */
    const char *p = in->precision ? in->precision : half ? "fast" : "exact";
    if (strcmp(p, "exact") == 0) return 0;
    if (strcmp(p, "fast") != 0) {
        ks_error(d, "kiln", "--precision %s: unknown precision (known: exact, fast)", p);
        return -1;
    }
    if (half) {
        *out = strcmp(w, "bf16") == 0 ? KIR_BF16 : KIR_F16;
        return 0;
    }
    ks_error(d, "kiln", "--precision fast computes in the weights' half dtype, and these are %s: build with --dtype "
             "bf16 or f16, or --precision exact", w);
    return -1;
}

/* --quant's scheme, or KIR_QUANT_NONE without one; -1 after an error. */
static int quant_scheme(const kd_inputs *in, kir_word *out, ks_diag *d)
{
    *out = KIR_QUANT_NONE;
    if (!in->quant) {
        if (in->quant_group || in->quant_asym || in->n_quant_skip) {
            ks_error(d, "kiln", "%s is a setting of --quant, which is not given",
                     in->quant_group ? "--quant-group" : in->quant_asym > 0 ? "--quant-asym" : in->quant_asym < 0 ? "--quant-sym"
                                                                                                       : "--quant-skip");
            return -1;
        }
        return 0;
    }
    if (in->from_ir) {
        ks_error(d, "kiln", "--quant %s with --from-ir %s: no pass runs on an IR text, whose weights say what is "
                 "quantized (build the model with --quant and --dump-ir-after to get such a text)", in->quant, in->from_ir);
        return -1;
    }
    kir_word w = kir_word_lookup(KIR_SET_QUANT, in->quant);
    if (w == KIR_WORD_COUNT || w == KIR_QUANT_NONE) {
        ks_error(d, "kiln", "--quant %s: unknown scheme (known: w4a16, w8a16, fp8, w8a8)", in->quant);
        return -1;
    }
    if (in->quant_asym == 1 && (w == KIR_QUANT_FP8 || w == KIR_QUANT_W8A8)) {
        ks_error(d, "kiln", "--quant-asym: --quant %s has no zero points (symmetric codes only)", in->quant);
        return -1;
    }
    if (in->quant_group && w == KIR_QUANT_W8A8) {
        ks_error(d, "kiln", "--quant-group: --quant w8a8 takes a scale a row (its INT8 products sum whole rows)");
        return -1;
    }
    *out = w;
    return 0;
}

/* --kv-dtype: the KV cache's codes (KIR_F32 when not given). */
static int kv_dtype_of(const kd_inputs *in, kir_dtype *out, ks_diag *d)
{
    *out = KIR_F32;
    if (!in->kv_dtype) return 0;
    if (in->from_ir) {
        ks_error(d, "kiln", "--kv-dtype %s with --from-ir %s: no pass runs on an IR text, whose attention nodes say "
                 "what the cache holds (their kv_dtype)", in->kv_dtype, in->from_ir);
        return -1;
    }
    if (strcmp(in->kv_dtype, "int8") == 0)
        *out = KIR_I8;
    else if (strcmp(in->kv_dtype, "fp8") == 0)
        *out = KIR_F8E4M3;
    else {
        ks_error(d, "kiln", "--kv-dtype %s: unknown (known: int8, fp8; without it the cache holds the compute dtype)",
                 in->kv_dtype);
        return -1;
    }
    return 0;
}

/* --quant-smooth (SMOOTH words; with --calib the scheme's default: w8a8 smoothquant, the others none:
 * on TinyStories-656K AWQ's smoothing before GPTQ measured worse than GPTQ alone, bench/RESULTS.md);
 * KIR_SMOOTH_NONE without --calib. */
static int quant_smooth_of(const kd_inputs *in, kir_word quant, kir_word *out, ks_diag *d)
{
    *out = KIR_SMOOTH_NONE;
    if (in->quant_smooth && !in->quant) {
        ks_error(d, "kiln", "--quant-smooth is a setting of --quant, which is not given");
        return -1;
    }
    if (!in->quant_smooth) {
        if (in->calib && quant == KIR_QUANT_W8A8) *out = KIR_SMOOTH_SMOOTHQUANT;
        return 0;
    }
    kir_word w = kir_word_lookup(KIR_SET_SMOOTH, in->quant_smooth);
    if (w == KIR_WORD_COUNT) {
        ks_error(d, "kiln", "--quant-smooth %s: unknown (known: awq, smoothquant, none)", in->quant_smooth);
        return -1;
    }
    if (w != KIR_SMOOTH_NONE && !in->calib) {
        ks_error(d, "kiln", "--quant-smooth %s: smoothing follows the inputs' statistics, which --calib FILE gives",
                 in->quant_smooth);
        return -1;
    }
    *out = w;
    return 0;
}

/* --quant-round: gptq (with --calib, the default) or rtn (round to nearest, with the clipping search;
 * the only rounding without --calib): m->quant_rtn. */
static int quant_round_of(const kd_inputs *in, kd_model *m, ks_diag *d)
{
    m->quant_rtn = !in->calib;
    if (!in->quant_round) return 0;
    if (!in->quant) {
        ks_error(d, "kiln", "--quant-round is a setting of --quant, which is not given");
        return -1;
    }
    if (strcmp(in->quant_round, "rtn") == 0) {
        m->quant_rtn = 1;
        return 0;
    }
    if (strcmp(in->quant_round, "gptq") != 0) {
        ks_error(d, "kiln", "--quant-round %s: unknown (known: gptq, rtn)", in->quant_round);
        return -1;
    }
    if (!in->calib) {
        ks_error(d, "kiln", "--quant-round gptq: GPTQ spreads each rounding's error by the inputs' statistics, which "
                 "--calib FILE gives");
        return -1;
    }
    return 0;
}

int kd_optimize(const kd_inputs *in, kd_model *m, ks_diag *d)
{
    if (in->dump_after && check_dump_names(in->dump_after, d) != 0) return -1;
    kir_word quant = KIR_QUANT_NONE;
    kir_dtype kv_dtype = KIR_F32;
    kir_word smooth = KIR_SMOOTH_NONE;
    if (quant_scheme(in, &quant, d) != 0 || quant_smooth_of(in, quant, &smooth, d) != 0 || quant_round_of(in, m, d) != 0 ||
        kv_dtype_of(in, &kv_dtype, d) != 0 || kd_calibrate(in, m, d) != 0)
        return -1;
    kir_graph *g = NULL;
    if (in->from_ir) {
        g = kd_read_ir(in->from_ir, d);
        if (!g) return -1;
        /* --dtype overrides the text's weight dtypes (kd_model_load parsed it) */
        if (m->weight_dtype_given) kd_set_weight_dtype(g, m->weight_dtype);
    } else {
        g = kir_graph_clone(m->model->graph);
    }
    size_t n_passes = 0, n_disabled = 0;
    char **passes = split_list(in->passes, &n_passes), **disabled = split_list(in->disabled, &n_disabled);
    int none = n_passes == 1 && strcmp(passes[0], "none") == 0;
    int all = n_passes == 0 || (n_passes == 1 && strcmp(passes[0], "all") == 0);
    kir_dtype compute = KIR_F32;
    int rc = kd_compute_dtype(in, g, &compute, d);
    dump_ctx dc = {in, 0};
    if (in->dump_after && !in->dump_dir) {
        ks_error(d, "kiln", "--dump-ir-after needs --dump-dir DIR");
        rc = -1;
    }
    if (!rc && in->dump_after) rc = dump_ir(&dc, in->from_ir ? "from-ir" : "compiled", g, d);
    /* a graph read with --from-ir keeps the fusions its author chose: of the passes only plan_memory runs
     * on it, when it carries no plan and plan_memory is not left out */
    static const char *const plan_only[] = {"plan_memory"};
    int plan_wanted = !list_has(disabled, n_disabled, "plan_memory") && (all || list_has(passes, n_passes, "plan_memory"));
    int from_ir_plan = in->from_ir && plan_wanted && !kir_has_plan(g);
    if (!rc && (from_ir_plan || (!in->from_ir && !none))) {
        kp_options opt = {
            .passes = from_ir_plan ? plan_only : all ? NULL : (const char *const *)passes,
            .n_passes = from_ir_plan ? 1 : all ? 0 : n_passes,
            .disabled = (const char *const *)disabled,
            .n_disabled = n_disabled,
            .verify = 1,
            .after = after_pass,
            .after_ctx = &dc,
            .max_tokens = kd_plan_tokens(in, g),
            .compute_dtype = compute,
            .quant = quant,
            .kv_dtype = kv_dtype,
            .quant_group = in->quant_group,
            .quant_smooth = smooth,
            .quant_asym = in->quant_asym,
            .quant_skip = in->quant_skip,
            .n_quant_skip = in->n_quant_skip,
        };
        kp_pass_stats *st = NULL;
        size_t n_st = 0;
        kd_progress_step(in->progress, "running the passes");
        rc = kp_run_pipeline(&g, &opt, &st, &n_st, d);
        kd_progress_done(in->progress);
        if (rc == 0 && in->stats) print_stats(in->stats_out ? in->stats_out : stdout, st, n_st, g);
        free(st);
    } else if (!rc && in->stats) {
        print_stats(in->stats_out ? in->stats_out : stdout, NULL, 0, g);
    }
    free_list(passes, n_passes);
    free_list(disabled, n_disabled);
    if (rc) {
        kir_graph_free(g);
        return -1;
    }
    kir_graph_free(m->optimized);
    m->optimized = g;
    return 0;
}

/* ---- weight data by name ---------------------------------------------------------------- */

const kf_weight_binding *kd_binding(const kd_model *m, const char *name)
{
    const kir_graph *g = m->model->graph;
    for (size_t i = 0; i < m->model->n_weights; i++)
        if (strcmp(kir_attr_str(g, m->model->weights[i].node, KIR_A_WEIGHT_NAME), name) == 0) return &m->model->weights[i];
    return NULL;
}

/* Store n f32 values as dtype t into out (bf16, f16: round to nearest even). */
static void store_as(kir_dtype t, const float *in, size_t n, void *out)
{
    uint16_t *h = out;
    switch (t) {
    case KIR_F32:
        if (in != out) memcpy(out, in, n * sizeof *in);
        return;
    case KIR_BF16:
        for (size_t i = 0; i < n; i++) h[i] = ks_f32_to_bf16(in[i]);
        return;
    case KIR_F16:
        for (size_t i = 0; i < n; i++) h[i] = ks_f32_to_f16(in[i]);
        return;
    case KIR_I32:
    case KIR_F8E4M3:
    case KIR_U4:
    case KIR_U8:
    case KIR_I8:
    case KIR_DTYPE_COUNT:
        break;
    }
    KS_UNREACHABLE(); /* the weight shape rule allows float dtypes only */
}

/* n elements of tensor data (dtype src, untransposed rows) as dtype t into
 * out: a copy when the dtypes agree (bf16 or f16 through f32 and back with
 * round to nearest even is the identity, NaN payloads aside), else through
 * f32 a chunk at a time (no whole-tensor temporary: an 8B model's tensors
 * are gigabytes). */
static void convert_rows(const uint8_t *data, kir_dtype src, size_t n, kir_dtype t, void *out)
{
    size_t in_es = kir_dtype_size(src), out_es = kir_dtype_size(t);
    if (src == t) {
        memcpy(out, data, n * in_es);
        return;
    }
    enum { CHUNK = 1 << 14 };
    float buf[CHUNK];
    for (size_t at = 0; at < n; at += CHUNK) {
        size_t m = n - at < CHUNK ? n - at : CHUNK;
        float *f = t == KIR_F32 ? (float *)out + at : buf;
        ks_decode_f32(data + at * in_es, kir_float_kind(src), m, f);
        if (t != KIR_F32) store_as(t, buf, m, (uint8_t *)out + at * out_es);
    }
}

/* Read the compiled model's weight `name` as `elems` elements of dtype t into
 * out: from the checkpoint through f32 (synthetic data without one). */
/* Whether binding b's elems elements are the stored tensor's rows [row_start, row_end) as stored (not
 * transposed: contiguous, converted straight); *at: the byte where they start. */
static int straight_at(const kf_weight_binding *b, const kf_tensor *tensor, size_t elems, size_t *at)
{
    if (b->transposed || b->row_dim != 0 || b->row_step != 1 || b->groups || tensor->ndim < 1 || tensor->shape[0] <= 0)
        return 0;
    size_t row_elems = tensor->nbytes / kir_dtype_size(tensor->dtype) / (size_t)tensor->shape[0];
    int64_t end = b->row_end < 0 ? tensor->shape[0] : b->row_end;
    if (b->row_start < 0 || b->row_start > end || end > tensor->shape[0] ||
        (size_t)(end - b->row_start) * row_elems != elems)
        return 0;
    *at = (size_t)b->row_start * row_elems * kir_dtype_size(tensor->dtype);
    return 1;
}

/* Where binding b's elems elements start in the stored tensor's bytes (a lazy tensor's decoded) when
 * straight_at, else NULL. */
static const uint8_t *straight_rows(const kf_weight_binding *b, const kf_tensor *tensor, size_t elems)
{
    size_t at = 0;
    return straight_at(b, tensor, elems, &at) ? kf_tensor_bytes(tensor) + at : NULL;
}

/* elems elements of checkpoint tensor `tensor` read as binding b says (transposed, rows) as dtype t into out. */
static int read_tensor(const kf_weight_binding *b, const kf_tensor *tensor, kir_dtype t, void *out, size_t elems,
                       ks_diag *d)
{
    const uint8_t *rows = straight_rows(b, tensor, elems);
    if (rows) {
        convert_rows(rows, tensor->dtype, elems, t, out);
        return 0;
    }
    float *f = t == KIR_F32 ? out : ks_xmalloc(sizeof(float) * (elems ? elems : 1));
    kf_tensor_view view = {b->transposed, b->row_dim, b->row_start, b->row_end, b->row_step, b->groups,
                           b->transposed_after};
    int rc = kf_tensor_read_view(d, tensor, &view, f);
    if (rc == 0) store_as(t, f, elems, out);
    if (f != out) free(f);
    return rc;
}

static int read_named(const kd_model *m, const char *name, kir_dtype t, void *out, size_t elems, ks_diag *d)
{
    const kf_weight_binding *b = kd_binding(m, name);
    if (!b) {
        ks_error(d, "kiln", "weight '%s' is not a weight of the model description", name);
        return -1;
    }
    const kir_node *n = kir_node_at(m->model->graph, b->node);
    if ((size_t)kir_elems(n, 1) != elems) {
        ks_error(d, "kiln", "weight '%s' has %lld elements in the model, %zu in the graph being built", name,
                 (long long)kir_elems(n, 1), elems);
        return -1;
    }
    if (!m->ckpt) { /* synthetic data, the whole weight at once */
        float *f = t == KIR_F32 ? out : ks_xmalloc(sizeof(float) * (elems ? elems : 1));
        kd_synthetic_weight(name, f, n->ndim, n->dims);
        store_as(t, f, elems, out);
        if (f != out) free(f);
        return 0;
    }
    /* one tensor, or (an {e} template) one an expert, each its share of dim 0 */
    int64_t n_parts = b->n_parts ? b->n_parts : 1;
    size_t part = elems / (size_t)n_parts, es = kir_dtype_size(t);
    int rc = 0;
    for (int64_t p = 0; p < n_parts && rc == 0; p++) {
        const kf_tensor *tensor = kf_checkpoint_find(m->ckpt, b->n_parts ? b->parts[p] : b->tensor);
        KS_ASSERT(tensor);
        rc = read_tensor(b, tensor, t, (uint8_t *)out + (size_t)p * part * es, part, d);
    }
    return rc;
}

/* Elements [first, first + count) of the model's weight `name` (elems in all) as dtype t, when the
 * checkpoint stores them as they are (read_named's straight case); 1 when it does not. */
static int read_named_part(const kd_model *m, const char *name, kir_dtype t, size_t elems, size_t first, size_t count,
                           void *out, ks_diag *d)
{
    const kf_weight_binding *b = kd_binding(m, name);
    const kf_tensor *tensor = b && !b->n_parts && m->ckpt ? kf_checkpoint_find(m->ckpt, b->tensor) : NULL;
    /* read_named's straight case (a weight of experts' tensors comes whole), with the model's element count (read_named checks it first) */
    const uint8_t *rows = tensor && kir_elems(kir_node_at(m->model->graph, b->node), 1) == (int64_t)elems
                              ? straight_rows(b, tensor, elems)
                              : NULL;
    if (!rows) return 1;
    if (first > elems || count > elems - first) {
        ks_error(d, "kiln", "weight '%s': elements [%zu, %zu) asked of %zu", name, first, first + count, elems);
        return -1;
    }
    convert_rows(rows + first * kir_dtype_size(tensor->dtype), tensor->dtype, count, t, out);
    return 0;
}

/* A concatenation's part (derive=concat0: fuse_sibling_matmuls' q,k,v and gate/up weights): each
 * source's overlap with [first, first + count), read straight; 1 when a source is not stored as it is
 * or the weight derives otherwise (then it comes whole). */
static int concat_part(const kd_model *m, const kir_graph *g, kir_val node, size_t first, size_t count, void *out,
                       ks_diag *d)
{
    const kir_node *n = kir_node_at(g, node);
    if (kir_attr_word(g, node, KIR_A_WEIGHT_DERIVE) != KIR_DERIVE_CONCAT0) return 1;
    ks_arena scratch = {0};
    kp_weight_recipe r;
    int rc = kp_weight_recipe_of(g, node, &scratch, &r);
    KS_ASSERT(rc == 0); /* the graph verified */
    const size_t es = kir_dtype_size(n->dtype);
    size_t at = 0; /* the source's first element in the concatenation */
    for (size_t i = 0; i < r.n_sources && rc == 0; i++) {
        const size_t elems = r.bytes[i] / es, lo = first > at ? first : at;
        const size_t hi = first + count < at + elems ? first + count : at + elems;
        if (lo < hi)
            rc = read_named_part(m, r.names[i], n->dtype, elems, lo - at, hi - lo, (uint8_t *)out + (lo - first) * es, d);
        at += elems;
    }
    ks_arena_free(&scratch);
    return rc;
}

int kd_weight_part(const kd_model *m, const kir_graph *g, kir_val node, size_t first, size_t count, void *out,
                   ks_diag *d)
{
    const kir_node *n = kir_node_at(g, node);
    if (kir_weight_quant_part(g, node)) return 1; /* quantized from its float matrix, whole */
    if (kp_weight_is_derived(g, node)) return concat_part(m, g, node, first, count, out, d);
    return read_named_part(m, kir_attr_str(g, node, KIR_A_WEIGHT_NAME), n->dtype, (size_t)kir_elems(n, 1), first, count,
                           out, d);
}

static int derived_data(const kd_model *m, const kir_graph *g, kir_val node, kir_dtype t, void *out, ks_diag *d);

/* The scales' dtype of the quantization that part w belongs to: its matmul's scale operand's. */
static kir_dtype quant_scale_dtype(const kir_graph *g, kir_val w)
{
    for (size_t v = 0; v < g->n_nodes; v++) {
        const kir_node *n = &g->nodes[v];
        if (n->op == KIR_OP_MATMUL && n->nin >= 3)
            for (int k = 1; k < n->nin; k++)
                if (n->in[k] == w) return kir_node_at(g, n->in[2])->dtype;
    }
    KS_UNREACHABLE(); /* eliminate_dead_nodes drops a part no matmul reads */
}

/* The last quantization computed, all three parts: a build reads a weight's codes, scales and zero
 * points one after another (they are adjacent in the graph), so each float matrix is read and
 * quantized once. key: everything its data depends on. */
typedef struct kd_quant_cache {
    char *key;         /* the recipe and layout, as text; NULL: empty */
    uint8_t *parts[3]; /* codes, scales, zero points (NULL without) */
    size_t bytes[3];   /* their sizes */
} kd_quant_cache;

kd_quant_cache *kd_quant_cache_new(void) { return ks_xcalloc(1, sizeof(kd_quant_cache)); }

void kd_quant_cache_free(kd_quant_cache *c)
{
    if (!c) return;
    free(c->key);
    for (int i = 0; i < 3; i++) free(c->parts[i]);
    free(c);
}

static char *quant_key(const kir_graph *g, kir_val node, const kir_quant_layout *q)
{
    ks_buf k = {0};
    static const char *const attrs[] = {"derive", "sources", "offset", "smooth"};
    for (size_t i = 0; i < sizeof attrs / sizeof *attrs; i++) {
        const kir_attr *a = kir_get(g, node, attrs[i]);
        if (a && a->kind == KIR_ATTR_STR) ks_buf_printf(&k, "%s=%s;", attrs[i], a->u.s);
        if (a && a->kind == KIR_ATTR_FLOAT) ks_buf_printf(&k, "%s=%.17g;", attrs[i], a->u.f);
    }
    uint32_t n = 0;
    const int64_t *rows = kir_attr_ints(g, node, KIR_A_WEIGHT_ROWS, &n);
    for (uint32_t i = 0; i < n; i++) ks_buf_printf(&k, "%lld,", (long long)rows[i]);
    ks_buf_printf(&k, ";%d %d %lld %lld %lld %lld %d", (int)q->codes, (int)q->scale, (long long)q->rows, (long long)q->cols,
                  (long long)q->block_rows, (long long)q->group, q->asym);
    char *key = ks_xstrdup(ks_buf_cstr(&k));
    ks_buf_free(&k);
    return key;
}

/* A codes/scales/zeros companion of checkpoint tensor `tensor` ("#codes" etc.: frontend/quantized.h), or NULL. */
static const kf_tensor *companion_of(const kd_model *m, const char *tensor, const char *suffix)
{
    ks_buf b = {0};
    ks_buf_printf(&b, "%s%s", tensor, suffix);
    const kf_tensor *t = m->ckpt ? kf_checkpoint_find(m->ckpt, ks_buf_cstr(&b)) : NULL;
    ks_buf_free(&b);
    return t;
}

/* The checkpoint's own codes for part `node`'s quantization (an AWQ or GPTQ checkpoint's, kept by
 * frontend/quantized.c) when every source of its recipe is such a layer, read straight (no transpose, all
 * its rows), concatenated along dim 0 (derive concat0), and stored with this layout: the same group, the
 * codes' range (u4: 0..15), the zero points where asym (else the midpoint everywhere: 8, or 128 for i8
 * and u8). Writes the three parts into c's buffers and returns 1; 0 (nothing written) where not. */
static int checkpoint_codes(const kd_model *m, const kir_graph *g, kir_val node, const kir_quant_layout *q,
                            uint8_t *const parts[3])
{
    /* a smoothed part's float matrix is the weight's columns times s, which the checkpoint's codes are not */
    if (!m->ckpt || kir_attr_word(g, node, KIR_A_WEIGHT_DERIVE) != KIR_DERIVE_CONCAT0 || q->block_rows != 1 ||
        q->codes == KIR_F8E4M3 || kir_attr_word(g, node, KIR_A_WEIGHT_SMOOTH) != KIR_SMOOTH_NONE)
        return 0;
    ks_arena scratch = {0};
    kp_weight_recipe r;
    int ok = kp_weight_recipe_of(g, node, &scratch, &r) == 0 && r.n_sources > 0;
    const int64_t groups = q->cols / q->group;
    const int mid = q->codes == KIR_U4 ? 8 : 128;
    int64_t row = 0;
    /* first a check of every source, then the copy: nothing written unless all fit */
    for (int pass = 0; pass < 2 && ok; pass++) {
        row = 0;
        for (size_t i = 0; i < r.n_sources && ok; i++) {
            const kf_weight_binding *b = kd_binding(m, r.names[i]);
            const kf_tensor *w = b && !b->n_parts ? kf_checkpoint_find(m->ckpt, b->tensor) : NULL;
            const kf_tensor *tc = w ? companion_of(m, b->tensor, "#codes") : NULL;
            const kf_tensor *ts = w ? companion_of(m, b->tensor, "#scales") : NULL;
            const kf_tensor *tz = w ? companion_of(m, b->tensor, "#zeros") : NULL;
            size_t first = 1;
            ok = tc && ts && tz && straight_at(b, w, (size_t)(r.rows[i] * q->cols), &first) && first == 0 &&
                 tc->shape[0] == r.rows[i] && tc->shape[1] == q->cols && ts->shape[1] == groups;
            /* the three of one layer: decoded once, all valid together (kf_tensor_bytes) */
            const uint8_t *codes = ok ? kf_tensor_bytes(tc) : NULL, *zeros = ok ? kf_tensor_bytes(tz) : NULL;
            const float *sc = ok ? (const float *)(const void *)kf_tensor_bytes(ts) : NULL;
            for (int64_t e = 0; ok && pass == 0 && e < r.rows[i] * q->cols; e++)
                ok = q->codes != KIR_U4 || codes[e] < 16;
            for (int64_t e = 0; ok && pass == 0 && !q->asym && e < r.rows[i] * groups; e++) ok = zeros[e] == mid;
            if (!ok || pass == 0) {
                row += r.rows[i];
                continue;
            }
            for (int64_t n = 0; n < r.rows[i]; n++) {
                for (int64_t k = 0; k < q->cols; k++) {
                    const int64_t at = (row + n) * q->cols + k;
                    int code = codes[n * q->cols + k];
                    if (q->codes == KIR_U4) {
                        uint8_t *byte = &parts[0][at / 2];
                        *byte = at % 2 ? (uint8_t)((*byte & 15) | code << 4) : (uint8_t)((*byte & 0xf0) | code);
                    } else {
                        parts[0][at] = (uint8_t)(q->codes == KIR_I8 ? code - 128 : code);
                    }
                }
                for (int64_t gi = 0; gi < groups; gi++) {
                    const float v = sc[n * groups + gi];
                    const int64_t at = (row + n) * groups + gi;
                    if (q->scale == KIR_F32) memcpy(parts[1] + 4 * at, &v, 4);
                    else {
                        const uint16_t h = q->scale == KIR_F16 ? ks_f32_to_f16(v) : ks_f32_to_bf16(v);
                        memcpy(parts[1] + 2 * at, &h, 2);
                    }
                    if (q->asym) parts[2][at] = zeros[n * groups + gi];
                }
            }
            row += r.rows[i];
        }
    }
    ks_arena_free(&scratch);
    return ok && row == q->rows;
}

/* The name of the quantized weight whose part v is ("W" of "W#codes"), in arena a. */
static const char *part_base(const kir_graph *g, kir_val v, ks_arena *a)
{
    const char *name = kir_attr_str(g, v, KIR_A_WEIGHT_NAME), *hash = strrchr(name, '#');
    return ks_arena_strndup(a, name, hash ? (size_t)(hash - name) : strlen(name));
}

/* The smoothing vector (compiler/smooth.c) of the quantized weight whose part is `part` (its `smooth`
 * attribute; *s NULL for none), w its float matrix ([q->rows, q->cols]) and source its recipe's first
 * source; 0, or -1 after reporting, for weight `asked` (the part or the gain it divides), when the build
 * has no calibration of that input (a build from an IR text). */
static int smoothing_of(const kd_model *m, const kir_graph *g, kir_val part, const kir_quant_layout *q, const float *w,
                        const char *source, const char *asked, const float **s, ks_diag *d)
{
    *s = NULL;
    const kir_word method = kir_attr_word(g, part, KIR_A_WEIGHT_SMOOTH);
    if (method == KIR_SMOOTH_NONE) return 0;
    ks_arena scratch = {0};
    const char *of = part_base(g, part, &scratch);
    *s = kd_smooth_vector(m, of, method, q, w, source);
    if (!*s)
        ks_error(d, "kiln", "weight '%s': smoothing '%s' (%s) needs the calibration of its input (--calib), which a "
                 "build from an IR text does not run", asked, of, kir_word_table[method].text);
    ks_arena_free(&scratch);
    return *s ? 0 : -1;
}

/* Part `node` of a quantization (ir/ir.h, "quantized weights"): the checkpoint's own codes where it
 * stores them in this layout (checkpoint_codes), else the float matrix its recipe derives, read in f32,
 * quantized (passes/quantize_weight.h: GPTQ with --calib's gram, else round to nearest); that part
 * written to out. */
static int quant_part_data(const kd_model *m, const kir_graph *g, kir_val node, void *out, ks_diag *d)
{
    kir_quant_layout q;
    kir_quant_layout_of_part(g, node, quant_scale_dtype(g, node), &q);
    kir_word part = kir_attr_word(g, node, KIR_A_WEIGHT_QUANT);
    const int which = part == KIR_QUANT_PART_CODES ? 0 : part == KIR_QUANT_PART_SCALE ? 1 : 2;
    char *key = quant_key(g, node, &q);
    kd_quant_cache *c = m->qcache; /* kd_model_load made it */
    KS_ASSERT(c);
    if (c->key && strcmp(c->key, key) == 0 && c->parts[which]) {
        memcpy(out, c->parts[which], c->bytes[which]);
        free(key);
        return 0;
    }
    free(c->key);
    for (int i = 0; i < 3; i++) free(c->parts[i]), c->parts[i] = NULL;
    c->key = NULL;
    c->bytes[0] = kir_quant_codes_bytes(&q), c->bytes[1] = kir_quant_scale_bytes(&q), c->bytes[2] = kir_quant_zero_bytes(&q);
    for (int i = 0; i < 3; i++) c->parts[i] = c->bytes[i] ? ks_xmalloc(c->bytes[i]) : NULL;
    /* the checkpoint's own codes need no float matrix */
    float *w = NULL;
    int rc = 0, own = checkpoint_codes(m, g, node, &q, c->parts);
    if (!own) {
        w = ks_xmalloc(sizeof(float) * (size_t)(q.rows * q.cols));
        rc = derived_data(m, g, node, KIR_F32, w, d);
    }
    /* --calib: the input's gram, its first source's (merged sources multiply one input), and the columns'
     * importance (its diagonal); a smoothed weight's columns times s, and the statistics of x / s */
    ks_arena scratch = {0};
    kp_weight_recipe r;
    kd_calib_input in = {0};
    const float *s = NULL;
    float *importance = NULL;
    double *scaled = NULL; /* the gram of x / s */
    const double *gram = NULL;
    if (rc == 0 && !own && kp_weight_recipe_of(g, node, &scratch, &r) == 0 && r.n_sources) {
        rc = smoothing_of(m, g, node, &q, w, r.names[0], kir_attr_str(g, node, KIR_A_WEIGHT_NAME), &s, d);
        if (rc == 0 && kd_calib_input_of(m, r.names[0], &in) == 0 && in.k == q.cols) {
            const int64_t k = q.cols;
            gram = in.gram;
            if (s) {
                gram = scaled = ks_xmalloc(sizeof *scaled * (size_t)(k * k));
                for (int64_t i = 0; i < k; i++)
                    for (int64_t j = 0; j < k; j++) scaled[i * k + j] = in.gram[i * k + j] / ((double)s[i] * s[j]);
                for (int64_t n = 0; n < q.rows; n++)
                    for (int64_t i = 0; i < k; i++) w[n * k + i] *= s[i];
            }
            importance = ks_xmalloc(sizeof *importance * (size_t)k);
            for (int64_t i = 0; i < k; i++) importance[i] = (float)gram[i * k + i];
        }
    }
    if (rc == 0) {
        c->key = key;
        key = NULL;
        if (!own && (!gram || m->quant_rtn || kp_quantize_gptq(&q, w, gram, c->parts[0], c->parts[1], c->parts[2]) != 0))
            kp_quantize_matrix(&q, w, importance, c->parts[0], c->parts[1], c->parts[2]);
        memcpy(out, c->parts[which], c->bytes[which]);
    }
    free(scaled);
    free(importance);
    ks_arena_free(&scratch);
    free(key);
    free(w);
    return rc;
}

/* A norm's gain divided by the smoothing of the quantized weight it feeds (derive="smooth",
 * passes/quantize.c): its source read in f32, the smoothing vector of weight smooth_of (computed from
 * that weight's float matrix where no part has asked for it yet), the quotient stored in the gain's dtype. */
static int smoothed_gain_data(const kd_model *m, const kir_graph *g, kir_val node, void *out, ks_diag *d)
{
    const kir_node *n = kir_node_at(g, node);
    const char *of = kir_attr_str(g, node, KIR_A_WEIGHT_SMOOTH_OF), *name = kir_attr_str(g, node, KIR_A_WEIGHT_NAME);
    ks_arena scratch = {0};
    const size_t of_len = strlen(of);
    kir_val codes = KIR_NONE; /* the smoothed weight's codes part, "<of>#codes" */
    for (size_t v = 0; v < g->n_nodes && codes == KIR_NONE; v++) {
        const char *pn = g->nodes[v].op == KIR_OP_WEIGHT ? kir_attr_str(g, (kir_val)v, KIR_A_WEIGHT_NAME) : NULL;
        if (pn && kir_weight_quant_part(g, (kir_val)v) &&
            kir_attr_word(g, (kir_val)v, KIR_A_WEIGHT_QUANT) == KIR_QUANT_PART_CODES &&
            kir_attr_word(g, (kir_val)v, KIR_A_WEIGHT_SMOOTH) != KIR_SMOOTH_NONE && strncmp(pn, of, of_len) == 0 &&
            pn[of_len] == '#')
            codes = (kir_val)v;
    }
    kp_weight_recipe r, gr;
    if (codes == KIR_NONE || kp_weight_recipe_of(g, codes, &scratch, &r) != 0 || !r.n_sources ||
        kp_weight_recipe_of(g, node, &scratch, &gr) != 0 || gr.n_sources != 1) {
        ks_error(d, "kiln", "weight '%s': smooth_of=\"%s\" names no smoothed quantized weight of the graph", name, of);
        ks_arena_free(&scratch);
        return -1;
    }
    kir_quant_layout q;
    kir_quant_layout_of_part(g, codes, KIR_F32, &q);
    const size_t k = (size_t)kir_elems(n, 1);
    float *gain = ks_xmalloc(sizeof *gain * k), *w = NULL;
    int rc = read_named(m, gr.names[0], KIR_F32, gain, k, d);
    const float *s = NULL;
    if (rc == 0 && (int64_t)k != q.cols) {
        ks_error(d, "kiln", "weight '%s': %zu elements, but the weight it smooths (smooth_of=\"%s\") has %lld columns",
                 name, k, of, (long long)q.cols);
        rc = -1;
    }
    if (rc == 0) { /* the float matrix, for the vector (a part that comes later finds it computed) */
        w = ks_xmalloc(sizeof(float) * (size_t)(q.rows * q.cols));
        rc = derived_data(m, g, codes, KIR_F32, w, d);
    }
    if (rc == 0) rc = smoothing_of(m, g, codes, &q, w, r.names[0], name, &s, d);
    if (rc == 0) {
        for (size_t i = 0; i < k; i++) gain[i] /= s[i];
        store_as(n->dtype, gain, k, out);
    }
    free(gain);
    free(w);
    ks_arena_free(&scratch);
    return rc;
}

int kd_weight_data(const kd_model *m, const kir_graph *g, kir_val node, void *out, ks_diag *d)
{
    const kir_node *n = kir_node_at(g, node);
    const char *name = kir_attr_str(g, node, KIR_A_WEIGHT_NAME);
    if (kir_weight_quant_part(g, node)) return quant_part_data(m, g, node, out, d);
    if (kir_attr_has(g, node, KIR_A_WEIGHT_DERIVE) && kir_attr_word(g, node, KIR_A_WEIGHT_DERIVE) == KIR_DERIVE_SMOOTH)
        return smoothed_gain_data(m, g, node, out, d);
    if (!kp_weight_is_derived(g, node)) return read_named(m, name, n->dtype, out, (size_t)kir_elems(n, 1), d);
    return derived_data(m, g, node, n->dtype, out, d);
}

/* A derived weight's data (its recipe's, with sources read as dtype t: the weight's own, or f32 for the
 * float matrix of a quantization) into out. */
static int derived_data(const kd_model *m, const kir_graph *g, kir_val node, kir_dtype t, void *out, ks_diag *d)
{
    size_t es = kir_dtype_size(t);
    ks_arena scratch = {0};
    kp_weight_recipe r;
    int rc = kp_weight_recipe_of(g, node, &scratch, &r);
    KS_ASSERT(rc == 0); /* the graph verified */
    void **src = ks_xcalloc(r.n_sources, sizeof *src);
    for (size_t i = 0; i < r.n_sources && rc == 0; i++) {
        src[i] = ks_xmalloc(r.bytes[i] ? r.bytes[i] : 1);
        rc = read_named(m, r.names[i], t, src[i], r.bytes[i] / es, d);
    }
    if (rc == 0) kp_derive_weight(g, node, &r, (const void *const *)src, out);
    for (size_t i = 0; i < r.n_sources; i++) free(src[i]);
    free(src);
    ks_arena_free(&scratch);
    return rc;
}
