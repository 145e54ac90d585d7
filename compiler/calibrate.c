/*
 * calibrate.c — --calib: what a calibration text says about each matmul's
 * input, for the quantization of its weight (compiler/driver.h,
 * "calibration").
 *
 * The text is tokenized with the build's tokenizer and run, in windows of
 * up to CALIB_WINDOW tokens (each a fresh sequence that starts with BOS),
 * through the reference interpreter over the compiled graph (the
 * description's, before any pass), its weights as kd_weight_data reads
 * them. A tap sees each matmul's input as it is computed and sums x^T x
 * over its rows: the mean, the input's gram matrix [K,K], is what GPTQ
 * spreads each rounding's error by, and its diagonal (the mean square of
 * column k) the importance of the weight's column k in the clipping search
 * (the error of x w^T for an error e_k in that column is x_k e_k: its mean
 * square weighs e_k^2 by mean(x_k^2)). A weight read by several matmuls (a
 * tied embedding aside, no quantized one is) keeps the first's. Beside the
 * gram, each column's mean |x_k| (AWQ's activation scale) and max |x_k|
 * (SmoothQuant's). The grams take K^2 doubles each: an 8B model's
 * 14336-wide down projection 1.6 GB.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/driver.h"
#include "runtime/desc.h"
#include "runtime/interp/interp.h"
#include "runtime/kv/kv_cache.h"
#include "runtime/text/tokenizer.h"

/* Tokens of a window: a step each (the interpreter's memory grows with it). */
enum { CALIB_WINDOW = 512 };

typedef struct kd_calib {
    const kir_graph *g;  /* the graph calibrated */
    kir_val *input_of;   /* [n_nodes] for a WEIGHT node: the value the first matmul over it multiplies, or KIR_NONE */
    double **sum_sq;     /* [n_nodes] for such an input value: the sums of x^T x over its rows [K,K], then their mean */
    double **sum_abs;    /* [n_nodes] likewise: the sums of |x_k| [K], then their mean */
    float **absmax;      /* [n_nodes] likewise: max |x_k| [K] */
    int64_t rows;        /* rows (tokens) summed */
} kd_calib;

void kd_calib_free(kd_calib *c)
{
    if (!c) return;
    for (size_t v = 0; v < c->g->n_nodes; v++) {
        free(c->sum_sq[v]);
        free(c->sum_abs[v]);
        free(c->absmax[v]);
    }
    free(c->sum_sq);
    free(c->sum_abs);
    free(c->absmax);
    free(c->input_of);
    free(c);
}

int kd_calib_input_of(const kd_model *m, const char *name, kd_calib_input *out)
{
    memset(out, 0, sizeof *out);
    const kd_calib *c = m->calib;
    if (!c) return -1;
    for (size_t v = 0; v < c->g->n_nodes; v++)
        if (c->g->nodes[v].op == KIR_OP_WEIGHT && c->input_of[v] != KIR_NONE &&
            strcmp(kir_attr_str(c->g, (kir_val)v, KIR_A_WEIGHT_NAME), name) == 0) {
            const kir_val x = c->input_of[v];
            *out = (kd_calib_input){c->g->nodes[x].dims[1], c->sum_sq[x], c->sum_abs[x], c->absmax[x]};
            return 0;
        }
    return -1;
}

static void tap(void *ctx, kir_val v, const float *data, int n_tokens)
{
    kd_calib *c = ctx;
    double *s = c->sum_sq[v], *a = c->sum_abs[v];
    float *mx = c->absmax[v];
    if (!s) return;
    const int64_t k = c->g->nodes[v].dims[1];
    for (int t = 0; t < n_tokens; t++) {
        const float *x = data + t * k;
        for (int64_t i = 0; i < k; i++) {
            const double xi = x[i];
            for (int64_t j = 0; j <= i; j++) s[i * k + j] += xi * x[j];
            a[i] += fabs(xi);
            mx[i] = fabsf(x[i]) > mx[i] ? fabsf(x[i]) : mx[i];
        }
    }
}

/* The text's ids, and the tokenizer's BOS (-1: none) for the windows to start with; NULL after reporting. */
static krt_tok_ids *read_text(const kd_inputs *in, int32_t *bos, ks_diag *d)
{
    krt_tok *t = kd_load_tokenizer(in, d);
    if (!t) {
        if (!d->errors)
            ks_error(d, "kiln", "--calib %s: the model has no tokenizer to read it with (give --tokenizer FILE)", in->calib);
        return NULL;
    }
    size_t len = 0;
    char *text = ks_read_file(d, in->calib, &len);
    krt_tok_ids *ids = ks_xcalloc(1, sizeof *ids);
    int rc = text ? krt_tok_encode(t, text, len, 0, ids, d) : -1;
    if (rc == 0 && ids->len < 2) {
        ks_error(d, in->calib, "a calibration text needs at least 2 tokens, this one has %zu", ids->len);
        rc = -1;
    }
    free(text);
    *bos = krt_tok_bos(t);
    krt_tok_free(t);
    if (rc) {
        krt_tok_ids_free(ids);
        free(ids);
        return NULL;
    }
    return ids;
}

/* Run ids through the interpreter in windows; the tap sums. */
static int run_text(kd_calib *c, const kd_model *m, const krt_tok_ids *ids, int32_t bos, ks_diag *d)
{
    const kir_graph *g = c->g;
    krt_desc desc;
    if (krt_desc_init(&desc, g, "kiln --calib", d) != 0) return -1;
    int64_t ctx = desc.max_context > 0 && desc.max_context < CALIB_WINDOW ? desc.max_context : CALIB_WINDOW;
    void **w = ks_xcalloc(g->n_nodes ? g->n_nodes : 1, sizeof *w);
    int rc = 0;
    for (size_t v = 0; v < g->n_nodes && rc == 0; v++) {
        const kir_node *n = &g->nodes[v];
        if (n->op != KIR_OP_WEIGHT) continue;
        w[v] = ks_xmalloc((size_t)kir_dtype_bytes(n->dtype, (uint64_t)kir_elems(n, 1)));
        rc = kd_weight_data(m, g, (kir_val)v, w[v], d);
    }
    krt_kv_config cfg = {.n_layers = desc.n_kv_layers, .layers = desc.kv_layers, .block_size = 16,
                         .n_blocks = (int)((ctx + 15) / 16), .max_seqs = 1, .max_context = (int)ctx,
                         .elem_size = sizeof(float)};
    krt_kv *kv = rc ? NULL : krt_kv_new(&cfg, &krt_kv_host_storage, d);
    krt_interp *it = kv ? krt_interp_new(&desc, (const void *const *)w, kv, d) : NULL;
    if (!it) rc = -1;
    if (it) krt_interp_set_tap(it, tap, c);
    int32_t *tokens = ks_xmalloc(sizeof(int32_t) * (size_t)ctx), *pos = ks_xmalloc(sizeof(int32_t) * (size_t)ctx);
    int32_t *seqs = ks_xcalloc((size_t)ctx, sizeof(int32_t));
    float *out = ks_xmalloc(sizeof(float) * (size_t)ctx * (size_t)(desc.vocab > 0 ? desc.vocab : 1));
    /* windows of the text: BOS (when the tokenizer has one and the text does not start with it), then
     * the next ctx - 1 (or ctx) ids */
    for (size_t at = 0; rc == 0 && at < ids->len;) {
        int n = 0;
        if (bos >= 0 && ids->ids[at] != bos) tokens[n++] = bos;
        while (n < ctx && at < ids->len) tokens[n++] = ids->ids[at++];
        for (int i = 0; i < n; i++) pos[i] = i;
        const char *why = NULL;
        if (krt_kv_seq_add(kv, 0, &why) != 0 || krt_kv_seq_reserve(kv, 0, n, &why) != 0) {
            ks_error(d, "kiln --calib", "KV cache: %s", why ? why : "no room");
            rc = -1;
            break;
        }
        krt_step st = {.n_tokens = n, .tokens = tokens, .positions = pos, .seq_ids = seqs};
        rc = krt_interp_step(it, &st, out, d);
        krt_kv_seq_free(kv, 0);
        c->rows += n;
    }
    free(tokens);
    free(pos);
    free(seqs);
    free(out);
    krt_interp_free(it);
    krt_kv_free(kv);
    for (size_t v = 0; v < g->n_nodes; v++) free(w[v]);
    free(w);
    krt_desc_free(&desc);
    return rc;
}

int kd_calibrate(const kd_inputs *in, kd_model *m, ks_diag *d)
{
    if (!in->calib) return 0;
    if (!in->quant) {
        ks_error(d, "kiln", "--calib %s: a calibration text weighs --quant's quantization, which is not given", in->calib);
        return -1;
    }
    int32_t bos = -1;
    krt_tok_ids *ids = read_text(in, &bos, d);
    if (!ids) return -1;
    /* ids the model has no row for (a tokenizer not the model's own): the user's error, before the interpreter */
    const int64_t vocab = kir_token_ids(m->model->graph);
    for (size_t i = 0; vocab >= 0 && i < ids->len; i++)
        if (ids->ids[i] < 0 || ids->ids[i] >= vocab || bos >= vocab) {
            ks_error(d, in->calib, "the tokenizer gives id %d, but the model's vocabulary has %lld ids (the rows of its "
                     "embedding table): is the tokenizer the model's own?",
                     ids->ids[i] >= vocab || ids->ids[i] < 0 ? (int)ids->ids[i] : (int)bos, (long long)vocab);
            krt_tok_ids_free(ids);
            free(ids);
            return -1;
        }
    kd_progress_step(in->progress, "calibrating");
    const kir_graph *g = m->model->graph;
    kd_calib *c = ks_xcalloc(1, sizeof *c);
    c->g = g;
    size_t n = g->n_nodes ? g->n_nodes : 1;
    c->input_of = ks_xmalloc(sizeof *c->input_of * n);
    c->sum_sq = ks_xcalloc(n, sizeof *c->sum_sq);
    c->sum_abs = ks_xcalloc(n, sizeof *c->sum_abs);
    c->absmax = ks_xcalloc(n, sizeof *c->absmax);
    for (size_t v = 0; v < g->n_nodes; v++) c->input_of[v] = KIR_NONE;
    for (size_t v = 0; v < g->n_nodes; v++) {
        const kir_node *mm = &g->nodes[v];
        if (mm->op != KIR_OP_MATMUL || g->nodes[mm->in[1]].op != KIR_OP_WEIGHT || c->input_of[mm->in[1]] != KIR_NONE)
            continue;
        c->input_of[mm->in[1]] = mm->in[0];
        const size_t k = (size_t)g->nodes[mm->in[0]].dims[1];
        if (!c->sum_sq[mm->in[0]]) {
            c->sum_sq[mm->in[0]] = ks_xcalloc(k * k, sizeof(double));
            c->sum_abs[mm->in[0]] = ks_xcalloc(k, sizeof(double));
            c->absmax[mm->in[0]] = ks_xcalloc(k, sizeof(float));
        }
    }
    int rc = run_text(c, m, ids, bos, d);
    kd_progress_done(in->progress);
    krt_tok_ids_free(ids);
    free(ids);
    if (rc) {
        kd_calib_free(c);
        return -1;
    }
    const double rows = (double)(c->rows ? c->rows : 1);
    for (size_t v = 0; v < g->n_nodes; v++) { /* the grams' means, both triangles */
        const int64_t k = g->nodes[v].ndim == 2 ? g->nodes[v].dims[1] : 0;
        double *s = c->sum_sq[v];
        for (int64_t i = 0; s && i < k; i++)
            for (int64_t j = 0; j <= i; j++) s[i * k + j] = s[j * k + i] = s[i * k + j] / rows;
    }
    for (size_t v = 0; v < g->n_nodes; v++) /* the mean |x_k| */
        for (int64_t i = 0; c->sum_abs[v] && i < g->nodes[v].dims[1]; i++) c->sum_abs[v][i] /= rows;
    kd_calib_free(m->calib);
    m->calib = c;
    return 0;
}
