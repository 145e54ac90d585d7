/* verify.c — fused against unfused, value by value (see verify.h). */
#include "compiler/verify.h"

#include <math.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

#include "compiler/driver.h"
#include "compiler/targets.h"
#include "passes/pipeline.h"
#include "runtime/interp/interp.h"
#include "runtime/kv/kv_cache.h"
#include "runtime/session.h"

/* The key of a node: where it came from and in which layer. */
typedef struct node_key {
    kir_loc loc;  /* its location */
    int layer;    /* attention ops before it */
} node_key;

static int same_key(const node_key *a, const node_key *b)
{
    return a->loc.file == b->loc.file && a->loc.line == b->loc.line && a->loc.col == b->loc.col &&
           a->layer == b->layer;
}

static int comparable(const kir_node *n)
{
    int is_float = n->dtype == KIR_F32 || n->dtype == KIR_BF16 || n->dtype == KIR_F16;
    return n->op != KIR_OP_WEIGHT && n->op != KIR_OP_INPUT && is_float && n->loc.line > 0;
}

/* keys[v] for every node; the representative of a key is its last node. */
static node_key *node_keys(const kir_graph *g)
{
    node_key *k = ks_xcalloc(g->n_nodes ? g->n_nodes : 1, sizeof *k);
    int layer = 0;
    for (size_t v = 0; v < g->n_nodes; v++) {
        k[v].loc = g->nodes[v].loc;
        k[v].layer = layer;
        if (g->nodes[v].op == KIR_OP_ATTENTION) layer++;
    }
    return k;
}

/* The layer of node v: attention ops before it. */
static int layer_of(const kir_graph *g, kir_val v)
{
    int layer = 0;
    for (kir_val w = 0; w < v; w++) layer += g->nodes[w].op == KIR_OP_ATTENTION;
    return layer;
}

static int same_file(const kir_graph *a, uint32_t fa, const kir_graph *b, uint32_t fb)
{
    if (fa >= a->n_files || fb >= b->n_files) return fa == fb;
    return strcmp(a->files[fa], b->files[fb]) == 0;
}

/* match[v] = the test node standing for ref node v, or KIR_NONE. */
static kir_val *match_nodes(const kir_graph *ref, const kir_graph *test)
{
    node_key *kr = node_keys(ref), *kt = node_keys(test);
    kir_val *match = ks_xcalloc(ref->n_nodes ? ref->n_nodes : 1, sizeof *match);
    for (size_t v = 0; v < ref->n_nodes; v++) {
        match[v] = KIR_NONE;
        const kir_node *n = &ref->nodes[v];
        if (!comparable(n)) continue;
        /* only the last node of its key in ref */
        int last = 1;
        for (size_t w = v + 1; w < ref->n_nodes && last; w++)
            if (comparable(&ref->nodes[w]) && same_key(&kr[v], &kr[w])) last = 0;
        if (!last) continue;
        for (size_t t = test->n_nodes; t-- > 0;) {
            const kir_node *m = &test->nodes[t];
            node_key kv = kr[v], ktt = kt[t];
            kv.loc.file = ktt.loc.file; /* file indices differ between graphs; compare names below */
            if (!comparable(m) || !same_key(&kv, &ktt) || !same_file(ref, kr[v].loc.file, test, kt[t].loc.file))
                continue;
            if (m->ndim == n->ndim && memcmp(m->dims, n->dims, sizeof(int64_t) * n->ndim) == 0) match[v] = (kir_val)t;
            break;
        }
    }
    free(kr);
    free(kt);
    return match;
}

/* ---- running both graphs with taps ------------------------------------------------------ */

typedef struct side {
    const kir_graph *g;  /* the graph */
    krt_desc desc;       /* its description (the interpreter's side) */
    krt_interp *it;      /* its interpreter, or NULL when ses runs it */
    krt_kv *kv;          /* the interpreter's cache */
    krt_session *ses;    /* an engine's session, through its backend; or NULL */
    float **values;      /* [n_nodes] copies of the values of this step (for matched nodes) */
    const uint8_t *want; /* [n_nodes] 1: keep this node's value */
} side;

static void keep_value(void *ctx, kir_val v, const float *data, int n_tokens)
{
    side *s = ctx;
    if (!s->want[v]) return;
    size_t n = (size_t)kir_elems(&s->g->nodes[v], n_tokens);
    free(s->values[v]);
    s->values[v] = ks_xmalloc(n * sizeof(float));
    memcpy(s->values[v], data, n * sizeof(float));
}

static int side_open(side *s, const kir_graph *g, const void *const *w, int max_seqs, int max_ctx, ks_diag *d)
{
    memset(s, 0, sizeof *s);
    s->g = g;
    if (krt_desc_init(&s->desc, g, "kiln verify", d) != 0) return -1;
    krt_kv_config cfg = {.n_layers = s->desc.n_kv_layers, .layers = s->desc.kv_layers, .block_size = 16,
                         .n_blocks = max_seqs * ((max_ctx + 15) / 16), .max_seqs = max_seqs,
                         .max_context = max_ctx, .elem_size = sizeof(float)};
    s->kv = krt_kv_new(&cfg, &krt_kv_host_storage, d);
    if (!s->kv) return -1;
    s->it = krt_interp_new(&s->desc, w, s->kv, d);
    if (!s->it) return -1;
    s->values = ks_xcalloc(g->n_nodes ? g->n_nodes : 1, sizeof *s->values);
    krt_interp_set_tap(s->it, keep_value, s);
    for (int q = 0; q < max_seqs; q++) {
        const char *why = NULL;
        if (krt_kv_seq_add(s->kv, q, &why) != 0) return -1;
    }
    return 0;
}

/* The engine's side: a session over its backend, which shows its values to the tap. */
static int side_open_engine(side *s, const krt_engine *e, int max_seqs, int max_ctx, ks_diag *d)
{
    memset(s, 0, sizeof *s);
    s->g = e->graph;
    krt_session_opts so = {.max_seqs = max_seqs, .max_context = max_ctx, .block_size = 16,
                           .n_blocks = max_seqs * ((max_ctx + 15) / 16)};
    s->ses = krt_session_new(e, &so, d);
    if (!s->ses) return -1;
    s->values = ks_xcalloc(s->g->n_nodes ? s->g->n_nodes : 1, sizeof *s->values);
    if (krt_session_set_tap(s->ses, keep_value, s, d) != 0) return -1;
    for (int q = 0; q < max_seqs; q++)
        if (krt_session_seq_add(s->ses, q, d) != 0) return -1;
    return 0;
}

/* Run a step: the interpreter's positions are reserved here; a session assigns the same ones itself. */
static int side_step(side *s, const krt_step *st, const int *len, float *out, ks_diag *d)
{
    if (s->ses) return krt_session_step(s->ses, st->n_tokens, st->tokens, st->seq_ids, out, d);
    for (int q = 0; q < 2; q++) {
        const char *why = NULL;
        if (krt_kv_seq_reserve(s->kv, q, len[q], &why) != 0) {
            ks_error(d, "kiln verify", "KV cache: %s", why);
            return -1;
        }
    }
    return krt_interp_step(s->it, st, out, d);
}

static void side_close(side *s)
{
    if (!s->g) return;
    if (s->values)
        for (size_t v = 0; v < s->g->n_nodes; v++) free(s->values[v]);
    free(s->values);
    krt_interp_free(s->it);
    krt_kv_free(s->kv);
    krt_session_free(s->ses);
    krt_desc_free(&s->desc);
}

static double rel_error(const float *a, const float *b, size_t n, double *max_abs)
{
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        if (isinf(a[i]) && a[i] == b[i]) continue; /* the same infinity (a masked score): no difference, no scale */
        double dd = fabs((double)a[i] - (double)b[i]);
        if (!(dd <= md)) md = dd; /* NaN wins; an infinity against a number too */
        if (fabs((double)a[i]) > mr) mr = fabs((double)a[i]);
    }
    if (max_abs) *max_abs = md;
    return md / (mr > 0 ? mr : 1e-30);
}

/* KL(p || q) of softmax(a) and softmax(b). */
static double kl_div(const float *a, const float *b, int64_t n)
{
    double ma = -INFINITY, mb = -INFINITY, za = 0, zb = 0, kl = 0;
    for (int64_t i = 0; i < n; i++) ma = fmax(ma, a[i]), mb = fmax(mb, b[i]);
    for (int64_t i = 0; i < n; i++) za += exp(a[i] - ma), zb += exp(b[i] - mb);
    for (int64_t i = 0; i < n; i++) {
        double p = exp(a[i] - ma) / za, lp = a[i] - ma - log(za), lq = b[i] - mb - log(zb);
        kl += p * (lp - lq);
    }
    return kl;
}

static const char *file_of(const kir_graph *g, kir_loc loc)
{
    return loc.file < g->n_files ? g->files[loc.file] : "?";
}

/* Both sides: test runs through the interpreter with test_weights, or, with
 * engine, through the engine's backend. */
static int verify(const kir_graph *ref, const void *const *ref_weights, const kir_graph *test,
                  const void *const *test_weights, const krt_engine *engine, const kd_verify_opts *o,
                  kd_verify_result *r, ks_diag *d)
{
    memset(r, 0, sizeof *r);
    r->first = KIR_NONE;
    /* both graphs described once: their outputs, token ids and contexts */
    krt_desc dr, dt;
    if (krt_desc_init(&dr, ref, "kiln verify", d) != 0) return -1;
    if (krt_desc_init(&dt, test, "kiln verify", d) != 0) {
        krt_desc_free(&dr);
        return -1;
    }
    int64_t vocab = dr.vocab, n_ids = dr.n_token_ids < dt.n_token_ids ? dr.n_token_ids : dt.n_token_ids;
    int model_ctx = dr.max_context;
    krt_desc_free(&dr);
    int64_t test_vocab = dt.vocab;
    krt_desc_free(&dt);
    if (vocab != test_vocab) {
        ks_error(d, "kiln verify", "the graphs' outputs differ: %lld and %lld per token", (long long)vocab,
                 (long long)test_vocab);
        return -1;
    }
    kir_val *match = match_nodes(ref, test);
    uint8_t *want_r = ks_xcalloc(ref->n_nodes + 1, 1), *want_t = ks_xcalloc(test->n_nodes + 1, 1);
    for (size_t v = 0; v < ref->n_nodes; v++)
        if (match[v] != KIR_NONE) want_r[v] = 1, want_t[match[v]] = 1, r->compared++;
    double *worst = ks_xcalloc(ref->n_nodes + 1, sizeof *worst);

    /* the steps: two sequences' prompts mixed in one step, then decode steps of both */
    int n0 = o->prompt_tokens > 0 ? o->prompt_tokens : 16, n1 = n0 / 2 > 0 ? n0 / 2 : 1;
    int max_ctx = n0 + o->decode_steps + 1;
    if (max_ctx > model_ctx) {
        ks_error(d, "kiln verify", "%d prompt tokens and %d decode steps exceed the model's context of %d", n0,
                 o->decode_steps, model_ctx);
        free(match), free(want_r), free(want_t), free(worst);
        return -1;
    }
    side a = {0}, b = {0};
    int rc = side_open(&a, ref, ref_weights, 2, max_ctx, d);
    if (rc == 0) rc = engine ? side_open_engine(&b, engine, 2, max_ctx, d) : side_open(&b, test, test_weights, 2, max_ctx, d);
    a.want = want_r;
    b.want = want_t;
    int total = n0 + n1;
    int32_t *tok = ks_xmalloc(sizeof *tok * (size_t)total), *pos = ks_xmalloc(sizeof *pos * (size_t)total),
            *seq = ks_xmalloc(sizeof *seq * (size_t)total);
    float *la = ks_xmalloc(sizeof(float) * (size_t)total * (size_t)vocab);
    float *lb = ks_xmalloc(sizeof(float) * (size_t)total * (size_t)vocab);
    uint64_t state = o->seed * 0x9e3779b97f4a7c15ull + 1;
    int len[2] = {0, 0};
    for (int step = 0; rc == 0 && step <= o->decode_steps; step++) {
        int n = 0;
        if (step == 0) {
            /* interleave: seq 0 gets n0 tokens, seq 1 gets n1 */
            for (int i = 0, i0 = 0, i1 = 0; i < total; i++) {
                int sq = (i % 3 == 2 && i1 < n1) || i0 >= n0 ? 1 : 0;
                state ^= state << 13, state ^= state >> 7, state ^= state << 17;
                tok[n] = (int32_t)(state % (uint64_t)n_ids);
                seq[n] = sq;
                pos[n] = sq ? i1++ : i0++;
                n++;
            }
        } else {
            for (int sq = 0; sq < 2; sq++) {
                /* each sequence goes on with the reference's greedy token */
                tok[n] = tok[sq];
                seq[n] = sq;
                pos[n] = len[sq];
                n++;
            }
        }
        for (int i = 0; i < n; i++)
            if (pos[i] + 1 > len[seq[i]]) len[seq[i]] = pos[i] + 1;
        krt_step st = {.n_tokens = n, .tokens = tok, .positions = pos, .seq_ids = seq};
        rc = side_step(&a, &st, len, la, d);
        if (rc == 0) rc = side_step(&b, &st, len, lb, d);
        if (rc) break;
        for (size_t v = 0; v < ref->n_nodes; v++) {
            if (match[v] == KIR_NONE || !a.values[v] || !b.values[match[v]]) continue;
            double e = rel_error(a.values[v], b.values[match[v]], (size_t)kir_elems(&ref->nodes[v], n), NULL);
            if (!(e <= worst[v])) worst[v] = e;
        }
        for (int i = 0; i < n; i++) {
            double mabs;
            const float *ra = la + (size_t)i * vocab, *rb = lb + (size_t)i * vocab;
            double e = rel_error(ra, rb, (size_t)vocab, &mabs);
            if (!(mabs <= r->logits_max_abs)) r->logits_max_abs = mabs;
            if (!(e <= r->logits_max_rel)) r->logits_max_rel = e;
            double kl = kl_div(ra, rb, vocab);
            if (!(kl <= r->logits_max_kl)) r->logits_max_kl = kl;
        }
        /* next tokens: the reference's greedy choice at each sequence's last token */
        for (int sq = 0; sq < 2; sq++) {
            int last = -1;
            for (int i = 0; i < n; i++)
                if (seq[i] == sq) last = i;
            const float *row = la + (size_t)last * vocab;
            int64_t best = 0;
            for (int64_t j = 1; j < vocab; j++)
                if (row[j] > row[best]) best = j;
            tok[sq] = (int32_t)best;
        }
    }
    if (rc == 0) {
        for (size_t v = 0; v < ref->n_nodes; v++)
            if (match[v] != KIR_NONE && !(worst[v] <= o->tolerance)) {
                r->first = (kir_val)v;
                r->first_error = worst[v];
                r->diverged = 1;
                break;
            }
        if (!(r->logits_max_rel <= o->tolerance)) r->diverged = 1;
    }
    if (rc == 0 && o->out) {
        /* per layer: the worst value, then the logits and the verdict */
        fprintf(o->out, "compared %d values in %d steps (%d + %d prompt tokens mixed, %d decode steps), tolerance %.3g%s%s\n",
                r->compared, o->decode_steps + 1, n0, n1, o->decode_steps, o->tolerance, o->why ? ": " : "",
                o->why ? o->why : "");
        int layer = 0;
        double lw = -1;
        kir_val lv = KIR_NONE;
        for (size_t v = 0; v <= ref->n_nodes; v++) {
            int end = v == ref->n_nodes || ref->nodes[v].op == KIR_OP_ATTENTION;
            if (v < ref->n_nodes && match[v] != KIR_NONE && !(worst[v] <= lw)) lw = worst[v], lv = (kir_val)v;
            if (!end) continue;
            if (lv != KIR_NONE) {
                const kir_node *n = &ref->nodes[lv];
                fprintf(o->out, "  %s %2d: worst %-9.3g at %s:%u:%u (%s)\n", v == ref->n_nodes ? "after" : "layer",
                        layer, lw, file_of(ref, n->loc), n->loc.line, n->loc.col, kir_op_table[n->op].name);
            }
            layer++, lw = -1, lv = KIR_NONE;
        }
        fprintf(o->out, "  logits:   max|d| %.3g, max|d|/max|ref| %.3g, KL %.3g\n", r->logits_max_abs,
                r->logits_max_rel, r->logits_max_kl);
        if (r->first != KIR_NONE) {
            const kir_node *n = &ref->nodes[r->first];
            fprintf(o->out, "DIVERGED: first at %s:%u:%u: %s in layer %d, max|d|/max|ref| = %.3g > %.3g\n",
                    file_of(ref, n->loc), n->loc.line, n->loc.col, kir_op_table[n->op].name,
                    layer_of(ref, r->first), r->first_error, o->tolerance);
        } else if (r->diverged) {
            fprintf(o->out, "DIVERGED: the logits differ by %.3g > %.3g\n", r->logits_max_rel, o->tolerance);
        } else {
            fprintf(o->out, "OK: within tolerance\n");
        }
    }
    free(tok), free(pos), free(seq), free(la), free(lb), free(match), free(want_r), free(want_t), free(worst);
    side_close(&a);
    side_close(&b);
    return rc;
}

int kd_verify_graphs(const kir_graph *ref, const void *const *ref_weights, const kir_graph *test,
                     const void *const *test_weights, const kd_verify_opts *o, kd_verify_result *r, ks_diag *d)
{
    return verify(ref, ref_weights, test, test_weights, NULL, o, r, d);
}

int kd_verify_engine(const kir_graph *ref, const void *const *ref_weights, const krt_engine *test,
                     const kd_verify_opts *o, kd_verify_result *r, ks_diag *d)
{
    return verify(ref, ref_weights, test->graph, NULL, test, o, r, d);
}

int kd_verify_check_target(const char *target, ks_diag *d)
{
    const kd_target *t = kd_target_for(target, d);
    if (!t) return -1;
    return t->check_runtime ? t->check_runtime(d) : 0;
}

/* The data of every WEIGHT node of g in its dtype (free_weights frees it). */
static void **graph_weights(const kd_model *m, const kir_graph *g, ks_diag *d)
{
    void **w = ks_xcalloc(g->n_nodes ? g->n_nodes : 1, sizeof *w);
    for (size_t v = 0; v < g->n_nodes && !d->errors; v++) {
        const kir_node *n = &g->nodes[v];
        if (n->op != KIR_OP_WEIGHT) continue;
        w[v] = ks_xmalloc((size_t)kir_dtype_bytes(n->dtype, (uint64_t)kir_elems(n, 1)));
        kd_weight_data(m, g, (kir_val)v, w[v], d);
    }
    return w;
}

static void free_weights(void **w, size_t n)
{
    if (!w) return;
    for (size_t v = 0; v < n; v++) free(w[v]);
    free(w);
}

/* The fused build as an engine for the target in a temporary folder, run through its backend. */
static int verify_on_target(const kd_inputs *in, const kd_target *t, kd_model *m, const kir_graph *ref,
                            const void *const *wr, const kd_verify_opts *o, kd_verify_result *r, ks_diag *d)
{
    const char *tmp = getenv("TMPDIR");
    char *dir = ks_path_join(tmp && *tmp ? tmp : "/tmp", "kiln-verify.XXXXXX");
    if (!mkdtemp(dir)) {
        ks_error(d, dir, "cannot create a temporary folder for the engine");
        free(dir);
        return -1;
    }
    char *path = ks_path_join(dir, "fused.engine");
    int rc = -1;
    if (kd_write_engine(in, m, path, NULL, d) == 0) {
        krt_engine *e = krt_engine_open(path, d);
        if (e) {
            if (o->out)
                fprintf(o->out, "kiln verify: %s, %s passes against none; the fused engine (%s) on the %s backend\n",
                        m->kiln.name, in->passes ? in->passes : "all", in->target, t->name);
            rc = kd_verify_engine(ref, wr, e, o, r, d);
            krt_engine_close(e);
        }
    }
    unlink(path);
    rmdir(dir);
    free(path);
    free(dir);
    return rc;
}

/*
 * Fast precision's tolerance. The unfused reference rounds every value it
 * computes to the half dtype (unit roundoff u = 2^-8 for bf16, 2^-11 for
 * f16), the fused graph only the values its kernels store (a group's
 * inner values stay f32): each value of the reference carries the
 * roundings of the values it is computed from that the fused graph skips,
 * a norm, a matmul, a slice, an activation each adding up to u of the
 * value's scale, and those errors propagate through the layers. Measured
 * on the CPU (llama-gqa-tiny, tinystories-656k, qwen2-tiny, gpt2-tiny; 24 +
 * 12 tokens and 4 decode steps): worst per-value max|d|/max|ref| 2.5 .. 7.4 u
 * for bf16, 3 .. 10 u for f16 (tinystories-656k the worst of both); the
 * CUDA engines land the same. The default is 16 u: 0.0625 for bf16, 0.0078
 * for f16.
 */
double kd_verify_half_tolerance(kir_dtype t, char *why, size_t cap)
{
    double u = t == KIR_F16 ? 1.0 / 2048 : 1.0 / 256;
    snprintf(why, cap, "16 %s roundings (u = 2^-%d of the value's scale): the unfused graph rounds every value to %s, "
             "the fused one only what its kernels store", kir_dtype_name(t), t == KIR_F16 ? 11 : 8, kir_dtype_name(t));
    return 16 * u;
}

int kd_verify_model(const kd_inputs *in, kd_model *m, const kd_verify_opts *o_in, kd_verify_result *r, ks_diag *d)
{
    const kd_target *t = kd_target_for(in->target, d);
    if (!t) return -1;
    const kir_graph *ref = m->model->graph, *test = kd_graph(m);
    /* fast precision: the reference lowered too, its every value rounded to the half dtype */
    kir_dtype compute = KIR_F32;
    if (kd_compute_dtype(in, ref, &compute, d) != 0) return -1;
    kir_graph *lowered = NULL;
    kd_verify_opts o_copy = *o_in;
    const kd_verify_opts *o = &o_copy;
    char why[256];
    if (compute != KIR_F32) {
        lowered = kir_graph_clone(ref);
        kp_options po = {.compute_dtype = compute};
        kp_pass_stats st = {0};
        if (kp_lower_precision(&lowered, &po, &st, d) != 0) {
            kir_graph_free(lowered);
            return -1;
        }
        ref = lowered;
        if (o_copy.tolerance < 0) o_copy.tolerance = kd_verify_half_tolerance(compute, why, sizeof why), o_copy.why = why;
    } else if (o_copy.tolerance < 0) {
        o_copy.tolerance = 1e-4;
    }
    void **wr = graph_weights(m, ref, d), **wt = NULL;
    int rc = -1;
    if (d->errors) {
        /* reported */
    } else if (t->build) {
        rc = verify_on_target(in, t, m, ref, (const void *const *)wr, o, r, d);
    } else {
        wt = graph_weights(m, test, d);
        if (!d->errors) {
            if (o->out)
                fprintf(o->out, "kiln verify: %s, %s passes against none\n", m->kiln.name,
                        in->passes ? in->passes : "all");
            rc = kd_verify_graphs(ref, (const void *const *)wr, test, (const void *const *)wt, o, r, d);
        }
        free_weights(wt, test->n_nodes);
    }
    free_weights(wr, ref->n_nodes);
    if (lowered) kir_graph_free(lowered);
    return rc;
}
