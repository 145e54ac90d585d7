/*
 * test_models.c — every shipped model through the whole pass pipeline.
 *
 * For each model folder under $KILN_SHARED/models (and the llama2.c
 * checkpoint, and the embedded default model), compiled as `kiln build`
 * compiles it (kd_model_load, with its weights):
 *  1. the pipeline runs with the verifier after every pass, and after every
 *     pass print -> parse -> print gives the same bytes;
 *  2. a second run of the pipeline changes nothing (the passes reach a
 *     fixed point);
 *  3. kernels: the count for the whole graph and per attention period (the
 *     kernels from one attention up to the next: a layer's worth) are
 *     printed; for llama-gqa-tiny each period has at most 6;
 *  4. the fused graph gives bit-identical logits to the unfused one in the
 *     interpreter (a fused matmul computes each column as the separate one
 *     did), over a prefill of two sequences interleaved in one step and
 *     then decode steps of both. The derived weights' data is made with
 *     kp_derive_weight from the sources' data, as the engine builder does.
 * usage: test_models [--print] [MODEL_DIR_OR_BIN ...] (default: all of them);
 * --print writes each fused graph's IR to stdout.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/driver.h"
#include "compiler/synthetic.h"
#include "runtime/interp/interp.h"
#include "passes/derived_weight.h"
#include "passes/pipeline.h"
#include "tests/check.h"

static int print_fused; /* --print: write each fused graph's IR */

/* ---- the hook: the text form survives every pass ---------------------------------------- */
typedef struct hook_ctx {
    const char *model; /* for messages */
    int passes_seen;   /* passes the hook saw */
} hook_ctx;

static int round_trips(const char *model, const char *pass, const kir_graph *g)
{
    ks_buf a = {0}, b = {0}, log = {0};
    kir_print(g, &a);
    ks_source src = {"after-pass.ir", ks_buf_cstr(&a), a.len};
    ks_diag d = {.log = &log, .quiet = 1};
    kir_graph *back = kir_parse(&src, &d);
    int ok = back != NULL;
    if (back) {
        kir_print(back, &b);
        ok = a.len == b.len && memcmp(a.data, b.data, a.len) == 0;
        kir_graph_free(back);
    }
    CHECK_MSG(ok, "%s: after %s: print -> parse -> print differs%s%s", model, pass, back ? "" : ": ",
              ks_buf_cstr(&log));
    ks_buf_free(&a);
    ks_buf_free(&b);
    ks_buf_free(&log);
    return ok;
}

static int after_pass(void *ctx, const kp_pass *pass, const kir_graph *g, const kp_pass_stats *st, ks_diag *d)
{
    (void)d;
    hook_ctx *h = ctx;
    h->passes_seen++;
    printf("    %-22s %4zu -> %4zu nodes, %3zu -> %3zu kernels, %2zu fusions\n", pass->name, st->nodes_before,
           st->nodes_after, st->kernels_before, st->kernels_after, st->fusions);
    round_trips(h->model, pass->name, g);
    return 0;
}

/* ---- kernels per attention period --------------------------------------------------------- */

/* The largest number of kernels between one attention and the next (from
 * the first kernel after attention i, through attention i+1). */
static size_t kernels_per_period(const kir_graph *g, int verbose)
{
    size_t worst = 0, count = 0, period = 0;
    int64_t run = -1;
    for (size_t v = 0; v < g->n_nodes; v++) {
        const kir_attr *fa = kir_get(g, (kir_val)v, "fuse");
        int64_t id = fa ? fa->u.i : -1;
        kir_op op = g->nodes[v].op;
        int compute = op != KIR_OP_INPUT && op != KIR_OP_WEIGHT && op != KIR_OP_OUTPUT && op != KIR_OP_RESHAPE;
        if (id >= 0 ? id != run : compute) count++;
        run = id;
        if (op == KIR_OP_ATTENTION || v + 1 == g->n_nodes) {
            if (verbose) printf("      period %zu: %zu kernels\n", period, count);
            if (count > worst && op == KIR_OP_ATTENTION && period > 0) worst = count;
            period++;
            count = 0;
        }
    }
    return worst;
}

/* ---- weights ------------------------------------------------------------------------------- */
typedef struct weights {
    const kir_graph *g; /* the graph they are for */
    float **data;       /* [n_nodes] f32 data of each WEIGHT node; NULL for others */
} weights;

static void weights_free(weights *w)
{
    if (!w->data) return;
    for (size_t v = 0; v < w->g->n_nodes; v++) free(w->data[v]);
    free(w->data);
}

/* The unfused graph's weights, read as the engine builder reads them. */
static int load_weights(kd_model *m, weights *w, ks_diag *d)
{
    const kir_graph *g = m->model->graph;
    w->g = g;
    w->data = calloc(g->n_nodes, sizeof *w->data);
    for (size_t i = 0; i < m->model->n_weights; i++) {
        const kf_weight_binding *b = &m->model->weights[i];
        const kir_node *n = kir_node_at(g, b->node);
        if (n->dtype != KIR_F32) return -1;
        float *out = malloc(sizeof(float) * (size_t)kir_elems(n, 1));
        w->data[b->node] = out;
        if (!m->ckpt) {
            kd_synthetic_weight(kir_get_str(g, b->node, "name", ""), out, n->ndim, n->dims);
            continue;
        }
        const kf_tensor *t = kf_checkpoint_find(m->ckpt, b->tensor);
        if (!t || kf_tensor_read_f32(d, t, b->transposed, b->row_start, b->row_end, out) != 0) return -1;
    }
    return 0;
}

/* The data of the weight named `name` in w's graph, or NULL. */
static const float *weight_named(const weights *w, const char *name, const kir_node **node)
{
    for (size_t v = 0; v < w->g->n_nodes; v++)
        if (w->g->nodes[v].op == KIR_OP_WEIGHT && strcmp(kir_get_str(w->g, (kir_val)v, "name", ""), name) == 0) {
            *node = &w->g->nodes[v];
            return w->data[v];
        }
    return NULL;
}

/* The fused graph's weights: plain ones by name, derived ones made from
 * their sources' data with kp_derive_weight. */
static int derive_weights(const weights *base, const kir_graph *g, weights *w)
{
    w->g = g;
    w->data = calloc(g->n_nodes, sizeof *w->data);
    int derived = 0;
    for (size_t v = 0; v < g->n_nodes; v++) {
        const kir_node *n = &g->nodes[v];
        if (n->op != KIR_OP_WEIGHT) continue;
        size_t bytes = sizeof(float) * (size_t)kir_elems(n, 1);
        w->data[v] = malloc(bytes);
        ks_arena arena = {0};
        kp_weight_recipe r;
        int rc = kp_weight_recipe_of(g, (kir_val)v, &arena, &r);
        CHECK_MSG(rc == 0, "%s: bad recipe", kir_get_str(g, (kir_val)v, "name", ""));
        if (rc == 0 && r.n_sources == 0) {
            const kir_node *src = NULL;
            const float *data = weight_named(base, kir_get_str(g, (kir_val)v, "name", ""), &src);
            CHECK_MSG(data && src && kir_elems(src, 1) == kir_elems(n, 1), "no data for weight %s",
                      kir_get_str(g, (kir_val)v, "name", ""));
            if (data) memcpy(w->data[v], data, bytes);
        } else if (rc == 0) {
            const void **sources = calloc(r.n_sources, sizeof *sources);
            int ok = 1;
            for (size_t i = 0; i < r.n_sources; i++) {
                const kir_node *src = NULL;
                sources[i] = weight_named(base, r.names[i], &src);
                ok = ok && sources[i] && (size_t)kir_elems(src, 1) * sizeof(float) == r.bytes[i];
            }
            CHECK_MSG(ok, "derived weight %s: a source is missing or of another size",
                      kir_get_str(g, (kir_val)v, "name", ""));
            if (ok) kp_derive_weight(g, (kir_val)v, &r, sources, w->data[v]);
            free(sources);
            derived++;
        }
        ks_arena_free(&arena);
    }
    return derived;
}

/* ---- running a graph ------------------------------------------------------------------------ */
typedef struct runner {
    krt_desc desc;        /* the graph's description */
    int described;        /* 1: desc holds one */
    krt_kv *kv;           /* its cache */
    krt_interp *it;       /* its interpreter */
} runner;

static int runner_open(runner *r, const kir_graph *g, const weights *w, ks_diag *d)
{
    r->described = krt_desc_init(&r->desc, g, "test", d) == 0;
    if (!r->described) return -1;
    krt_kv_config cfg = {r->desc.n_kv_layers, r->desc.kv_layers, 8, 16, 2, 64, sizeof(float), 0};
    r->kv = krt_kv_new(&cfg, &krt_kv_host_storage, d);
    if (!r->kv) return -1;
    const char *why = NULL;
    if (krt_kv_seq_add(r->kv, 0, &why) || krt_kv_seq_add(r->kv, 1, &why)) return -1;
    r->it = krt_interp_new(&r->desc, (const void *const *)w->data, r->kv, d);
    return r->it ? 0 : -1;
}

static void runner_close(runner *r)
{
    krt_interp_free(r->it);
    krt_kv_free(r->kv);
    if (r->described) krt_desc_free(&r->desc);
}

/* Run a step of n tokens on r; positions come from the sequences' lengths. */
static int run_step(runner *r, int n, const int32_t *tok, const int32_t *seq, float *out, ks_diag *d)
{
    int32_t pos[64];
    int len[2] = {krt_kv_seq_len(r->kv, 0), krt_kv_seq_len(r->kv, 1)}, grow[2] = {0, 0};
    for (int i = 0; i < n; i++) pos[i] = len[seq[i]] + grow[seq[i]]++;
    const char *why = NULL;
    for (int s = 0; s < 2; s++)
        if (grow[s] && krt_kv_seq_reserve(r->kv, s, len[s] + grow[s], &why)) return -1;
    krt_step st = {n, tok, pos, seq};
    return krt_interp_step(r->it, &st, out, d);
}

/* ---- one model -------------------------------------------------------------------------------- */
static void test_model(const char *label, const kd_inputs *in, int max_period)
{
    printf("%s\n", label);
    ks_buf log = {0};
    ks_diag d = {.log = &log};
    kd_model m;
    if (kd_model_load(in, 1, &m, &d) != 0) {
        check_at(0, __FILE__, __LINE__, "%s: does not load:\n%s", label, ks_buf_cstr(&log));
        kd_model_free(&m);
        ks_buf_free(&log);
        return;
    }
    weights base = {0}, fused_w = {0};
    CHECK_MSG(load_weights(&m, &base, &d) == 0, "%s: weights do not load", label);

    /* 1. the pipeline, verified and round-tripped after every pass */
    kir_graph *g = kir_graph_clone(m.model->graph);
    hook_ctx h = {label, 0};
    kp_options opt = {.verify = 1, .after = after_pass, .after_ctx = &h};
    kp_pass_stats *st = NULL;
    size_t n_st = 0;
    int rc = kp_run_pipeline(&g, &opt, &st, &n_st, &d);
    CHECK_MSG(rc == 0 && d.errors == 0, "%s: pipeline failed:\n%s", label, ks_buf_cstr(&log));
    CHECK_MSG(h.passes_seen == (int)kp_pass_count && n_st == kp_pass_count, "%s: %d passes ran", label, h.passes_seen);
    free(st);

    /* 2. a fixed point */
    ks_buf once = {0}, twice = {0};
    kir_print(g, &once);
    kir_graph *again = kir_graph_clone(g);
    kp_options quiet = {.verify = 1};
    CHECK_MSG(kp_run_pipeline(&again, &quiet, NULL, NULL, &d) == 0, "%s: second run failed", label);
    kir_print(again, &twice);
    CHECK_MSG(once.len == twice.len && memcmp(once.data, twice.data, once.len) == 0,
              "%s: a second run of the pipeline changed the graph", label);
    kir_graph_free(again);
    ks_buf_free(&once);
    ks_buf_free(&twice);

    if (print_fused) {
        ks_buf text = {0};
        kir_print(g, &text);
        fputs(ks_buf_cstr(&text), stdout);
        ks_buf_free(&text);
    }

    /* 3. kernels */
    size_t k0 = kp_count_kernels(m.model->graph), k1 = kp_count_kernels(g);
    printf("    kernels: %zu unfused, %zu fused; per attention period:\n", k0, k1);
    size_t worst = kernels_per_period(g, 1);
    printf("    at most %zu kernels per period (from one attention through the next)\n", worst);
    if (max_period)
        CHECK_MSG(worst <= (size_t)max_period, "%s: %zu kernels in a period, want <= %d", label, worst, max_period);

    /* 4. the same logits */
    int derived = derive_weights(&base, g, &fused_w);
    printf("    %d derived weights\n", derived);
    CHECK_MSG(derived > 0, "%s: nothing was merged", label);
    runner ra = {0}, rb = {0};
    if (runner_open(&ra, m.model->graph, &base, &d) == 0 && runner_open(&rb, g, &fused_w, &d) == 0) {
        int64_t vocab = rb.desc.vocab;
        float *oa = malloc(sizeof(float) * 16 * (size_t)vocab), *ob = malloc(sizeof(float) * 16 * (size_t)vocab);
        /* a prefill of two sequences interleaved, then three decode steps of both */
        int32_t tok[16], seq[16];
        for (int i = 0; i < 11; i++) tok[i] = (int32_t)((i * 37 + 5) % vocab), seq[i] = i % 3 == 2;
        double worst_diff = 0;
        for (int step = 0; step < 4; step++) {
            int n = step == 0 ? 11 : 2;
            if (step > 0)
                for (int i = 0; i < 2; i++) tok[i] = (int32_t)((step * 101 + i * 7) % vocab), seq[i] = i;
            int ea = run_step(&ra, n, tok, seq, oa, &d), eb = run_step(&rb, n, tok, seq, ob, &d);
            CHECK_MSG(ea == 0 && eb == 0, "%s: step %d failed:\n%s", label, step, ks_buf_cstr(&log));
            if (ea || eb) break;
            for (int64_t i = 0; i < n * vocab; i++) {
                double e = fabs((double)oa[i] - (double)ob[i]);
                if (!(e <= worst_diff)) worst_diff = e;
            }
        }
        printf("    fused vs unfused logits: max |diff| = %g\n", worst_diff);
        CHECK_MSG(worst_diff == 0, "%s: fused logits differ from unfused by %g", label, worst_diff);
        free(oa);
        free(ob);
    } else {
        check_at(0, __FILE__, __LINE__, "%s: interpreter does not start:\n%s", label, ks_buf_cstr(&log));
    }
    runner_close(&ra);
    runner_close(&rb);
    weights_free(&base);
    weights_free(&fused_w);
    kir_graph_free(g);
    kd_model_free(&m);
    ks_buf_free(&log);
}

int main(int argc, char **argv)
{
    const char *shared = getenv("KILN_SHARED");
    char *fallback = NULL;
    if (!shared) {
        const char *src = getenv("KILN_SOURCE");
        fallback = ks_path_join(src ? src : ".", "../shared");
        shared = fallback;
    }
    int first = 1;
    if (argc > 1 && strcmp(argv[1], "--print") == 0) print_fused = 1, first = 2;
    if (argc > first) {
        for (int i = first; i < argc; i++) {
            kd_inputs in = {.input = argv[i]};
            test_model(argv[i], &in, 0);
        }
    } else {
        static const char *const folders[] = {"llama-gqa-tiny", "tinystories-656k", "qwen2-tiny", "gpt2-tiny"};
        char *models = ks_path_join(shared, "models");
        for (size_t i = 0; i < sizeof folders / sizeof folders[0]; i++) {
            char *dir = ks_path_join(models, folders[i]);
            kd_inputs in = {.input = dir};
            test_model(folders[i], &in, strcmp(folders[i], "llama-gqa-tiny") == 0 ? 6 : 0);
            free(dir);
        }
        char *bin = ks_path_join(models, "stories260k/stories260K.bin");
        kd_inputs in = {.input = bin};
        test_model("stories260k (llama2.c)", &in, 6);
        free(bin);
        kd_inputs syn = {.synthetic = 1};
        test_model("the embedded default model", &syn, 6);
        free(models);
    }
    free(fallback);
    return check_finish("pass_models");
}
