/*
 * test_interp_engines.c — the reference interpreter on engines of the
 * shared models ($KILN_MODELS, and stories260k's llama2.c checkpoint under
 * $KILN_SHARED) built with each weight dtype (kiln build --dtype f32, bf16,
 * f16), read through the engine's mapping as `kiln run` reads them:
 *  - the interpreter allocates nothing for weights
 *    (krt_interp_weight_bytes is 0): it reads f16 and bf16 where they lie,
 *    converting as it goes, rather than keeping a float32 copy of them all;
 *  - with f16 and bf16 weights its logits are bitwise those of the same
 *    graph with the weights converted to f32 first (ks_f16_to_f32,
 *    ks_bf16_to_f32), which is what the interpreter computed when it made
 *    that copy itself: a prefill of 70 tokens (its lm head split over
 *    threads) and one of 5 in another sequence, then four steps of one token
 *    for each sequence.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compiler/driver.h"
#include "runtime/engine.h"
#include "runtime/interp/interp.h"
#include "tests/check.h"

enum { PREFILL = 70, SHORT = 5, DECODE = 4 };

/* An interpreter over its own KV cache, two sequences. */
typedef struct runner {
    krt_desc desc;        /* the graph's description */
    int described;        /* 1: desc holds one */
    krt_kv *kv;           /* its cache */
    krt_interp *it;       /* the interpreter */
    int64_t rows;         /* rows of the token embedding: ids are taken modulo this */
} runner;

static int runner_open(runner *r, const kir_graph *g, const void *const *weights, ks_diag *d)
{
    memset(r, 0, sizeof *r);
    r->described = krt_desc_init(&r->desc, g, "test", d) == 0;
    if (!r->described) return -1;
    krt_kv_config cfg = {r->desc.n_kv_layers, r->desc.kv_layers, 16, 16, 2, 128, sizeof(float), 0};
    r->kv = krt_kv_new(&cfg, &krt_kv_host_storage, d);
    const char *why = NULL;
    if (!r->kv || krt_kv_seq_add(r->kv, 0, &why) || krt_kv_seq_add(r->kv, 1, &why)) return -1;
    for (size_t v = 0; v < g->n_nodes; v++)
        if (g->nodes[v].op == KIR_OP_EMBED && r->rows == 0) r->rows = g->nodes[g->nodes[v].in[0]].dims[0];
    r->it = krt_interp_new(&r->desc, weights, r->kv, d);
    return r->it && r->rows > 0 ? 0 : -1;
}

static void runner_close(runner *r)
{
    krt_interp_free(r->it);
    krt_kv_free(r->kv);
    if (r->described) krt_desc_free(&r->desc);
}

/* n tokens of sequence seq (ids from `first` on) or, with seq < 0, one token
 * of each sequence; out gets their logits. */
static int run_step(runner *r, int seq, int n, int first, float *out, ks_diag *d)
{
    int32_t tok[PREFILL], pos[PREFILL], seqs[PREFILL];
    if (seq < 0) n = 2;
    for (int i = 0; i < n; i++) {
        seqs[i] = seq < 0 ? i : seq;
        pos[i] = krt_kv_seq_len(r->kv, seqs[i]) + (seq < 0 ? 0 : i);
        tok[i] = (int32_t)((3 + (int64_t)(first + i) * 37) % r->rows);
    }
    const char *why = NULL;
    for (int i = 0; i < n; i++)
        if (krt_kv_seq_reserve(r->kv, seqs[i], pos[i] + 1, &why) != 0) return -1;
    krt_step st = {n, tok, pos, seqs};
    return krt_interp_step(r->it, &st, out, d);
}

/* Runs the steps on a and b; 1 when every logit is bitwise the same. */
static int same_logits(runner *a, runner *b, int64_t vocab, ks_diag *d)
{
    float *x = ks_xmalloc(sizeof(float) * PREFILL * (size_t)vocab), *y = ks_xmalloc(sizeof(float) * PREFILL * (size_t)vocab);
    int same = 1;
    static const int steps[2 + DECODE][3] = {{0, PREFILL, 0}, {1, SHORT, 500}, {-1, 2, 900}, {-1, 2, 901}, {-1, 2, 902}, {-1, 2, 903}};
    for (int s = 0; s < 2 + DECODE; s++) {
        const int *st = steps[s];
        int n = st[0] < 0 ? 2 : st[1];
        if (run_step(a, st[0], st[1], st[2], x, d) != 0 || run_step(b, st[0], st[1], st[2], y, d) != 0) {
            same = 0;
            break;
        }
        same &= memcmp(x, y, sizeof(float) * (size_t)n * (size_t)vocab) == 0;
    }
    free(x);
    free(y);
    return same;
}

/* f32 copies of the engine's weights, and its graph with f32 weights. */
static kir_graph *f32_twin(const krt_engine *e, void ***data)
{
    const kir_graph *g = e->graph;
    kir_graph *twin = kir_graph_clone(g);
    kd_set_weight_dtype(twin, KIR_F32);
    *data = ks_xcalloc(g->n_nodes, sizeof **data);
    for (size_t v = 0; v < g->n_nodes; v++) {
        const kir_node *n = &g->nodes[v];
        if (n->op != KIR_OP_WEIGHT) continue;
        size_t ne = (size_t)kir_elems(n, 1);
        float *f = ks_xmalloc(sizeof(float) * (ne ? ne : 1));
        const uint16_t *h = e->weights[v];
        for (size_t i = 0; i < ne; i++)
            f[i] = n->dtype == KIR_F32 ? ((const float *)e->weights[v])[i]
                   : n->dtype == KIR_F16 ? ks_f16_to_f32(h[i])
                                         : ks_bf16_to_f32(h[i]);
        (*data)[v] = f;
    }
    return twin;
}

static void test_engine(const char *model, const char *label, const char *dtype, const char *dir)
{
    sink k;
    sink_init(&k);
    char *path = ks_path_join(dir, "model.engine");
    kd_inputs in = {.input = model, .dtype = dtype};
    kd_model m;
    if (kd_model_load(&in, 1, &m, &k.d) == 0 && kd_optimize(&in, &m, &k.d) == 0) kd_write_engine(&in, &m, path, NULL, &k.d);
    kd_model_free(&m);
    krt_engine *e = k.d.errors ? NULL : krt_engine_open(path, &k.d);
    if (!CHECK_MSG(e != NULL, "%s %s: cannot build or open the engine:\n%s", label, dtype, sink_text(&k))) {
        free(path);
        ks_buf_free(&k.log);
        return;
    }
    runner r;
    int opened = runner_open(&r, e->graph, e->weights, &k.d) == 0;
    if (CHECK_MSG(opened, "%s %s: no interpreter:\n%s", label, dtype, sink_text(&k))) {
        size_t bytes = krt_interp_weight_bytes(r.it);
        printf("%s %s: %zu bytes of weights in the engine, %zu allocated for them", label, dtype,
               (size_t)e->weight_bytes, bytes);
        CHECK_MSG(bytes == 0, "%s %s: the interpreter allocated %zu bytes for weights", label, dtype, bytes);
        if (strcmp(dtype, "f32") != 0) {
            void **data = NULL;
            kir_graph *twin = f32_twin(e, &data);
            runner ref;
            int64_t vocab = e->desc.vocab;
            int same = runner_open(&ref, twin, (const void *const *)data, &k.d) == 0 &&
                       same_logits(&r, &ref, vocab, &k.d);
            printf(", logits %s those with f32 weights", same ? "bitwise" : "NOT");
            CHECK_MSG(same, "%s %s: logits differ from those with the weights in f32\n%s", label, dtype, sink_text(&k));
            runner_close(&ref);
            for (size_t v = 0; v < twin->n_nodes; v++) free(data[v]);
            free(data);
            kir_graph_free(twin);
        }
        printf("\n");
    }
    runner_close(&r);
    krt_engine_close(e);
    unlink(path);
    free(path);
    ks_buf_free(&k.log);
}

int main(void)
{
    const char *shared = getenv("KILN_SHARED"), *models = getenv("KILN_MODELS");
    char dir[64] = "/tmp/kiln_interp_engines.XXXXXX";
    if (!mkdtemp(dir)) return 1;
    /* $KILN_MODELS: checkpoint folders separated by ':' */
    char *list = ks_xstrdup(models ? models : "");
    int n = 0;
    for (char *save = NULL, *m = strtok_r(list, ":", &save); m; m = strtok_r(NULL, ":", &save), n++) {
        const char *label = strrchr(m, '/') ? strrchr(m, '/') + 1 : m;
        for (int t = 0; t < 3; t++) test_engine(m, label, (const char *[]){"f32", "bf16", "f16"}[t], dir);
    }
    char *llama2c = ks_path_join(shared ? shared : "../shared", "models/stories260k/stories260K.bin");
    if (access(llama2c, R_OK) == 0) {
        for (int t = 0; t < 3; t++) test_engine(llama2c, "stories260k", (const char *[]){"f32", "bf16", "f16"}[t], dir);
        n++;
    }
    free(llama2c);
    free(list);
    rmdir(dir);
    if (n == 0) {
        fprintf(stderr, "no shared models: set KILN_MODELS and KILN_SHARED\n");
        return 1;
    }
    return check_finish("interp_engines");
}
