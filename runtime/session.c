/* session.c — sequences and steps over a backend and a paged KV cache. */
#include "runtime/session.h"

#include <stdlib.h>
#include <string.h>

struct krt_session {
    const krt_engine *engine;   /* not owned */
    const krt_backend *backend; /* the engine's backend */
    void *state;                /* the backend's state */
    krt_kv *kv;                 /* owned */
    krt_kv_layer *layers;       /* KV layout (owned) */
    int64_t vocab;              /* output row elements */
    int64_t n_token_ids;        /* token ids are < this (the embedding rows) */
    int max_context;            /* positions per sequence */
    int32_t *positions;         /* scratch [cap] */
    size_t cap;                 /* capacity of positions */
};

int64_t krt_engine_param_int(const krt_engine *e, const char *name, int64_t dflt)
{
    const kir_param *p = kir_param_find(e->graph, name);
    return p && p->kind == KIR_ATTR_INT ? p->i : dflt;
}

/* Token ids index the table of the EMBED that reads the "tokens" input. */
static int64_t token_id_limit(const kir_graph *g)
{
    for (size_t v = 0; v < g->n_nodes; v++) {
        const kir_node *n = &g->nodes[v];
        if (n->op != KIR_OP_EMBED) continue;
        const kir_node *ids = &g->nodes[n->in[1]];
        if (ids->op == KIR_OP_INPUT && strcmp(kir_get_str(g, n->in[1], "name", ""), "tokens") == 0)
            return g->nodes[n->in[0]].dims[0];
    }
    return INT32_MAX;
}

krt_session *krt_session_new(const krt_engine *e, const krt_session_opts *o, ks_diag *d)
{
    const krt_backend *be = krt_backend_for(e, d);
    if (!be) return NULL;
    krt_session *s = ks_xcalloc(1, sizeof *s);
    s->engine = e;
    s->backend = be;
    s->vocab = kir_output_row_elems(e->graph);
    s->n_token_ids = token_id_limit(e->graph);
    int max_seqs = o && o->max_seqs > 0 ? o->max_seqs : 16;
    int model_ctx = (int)krt_engine_param_int(e, "max_context", 2048);
    s->max_context = o && o->max_context > 0 ? o->max_context : model_ctx;
    if (s->max_context > model_ctx) s->max_context = model_ctx;
    int bs = o && o->block_size > 0 ? o->block_size : 16;
    int blocks_per_seq = (s->max_context + bs - 1) / bs;
    int n_blocks = o && o->n_blocks > 0 ? o->n_blocks : blocks_per_seq * max_seqs;
    int n_layers = 0;
    s->layers = kir_kv_layers(e->graph, &n_layers);
    krt_kv_config cfg = {
        .n_layers = n_layers,
        .layers = s->layers,
        .block_size = bs,
        .n_blocks = n_blocks,
        .max_seqs = max_seqs,
        .max_context = s->max_context,
        .elem_size = be->kv_elem_size,
    };
    krt_kv_storage storage = *be->kv_storage;
    if (be->open) {
        /* a device backend: its state first (it checks the engine fits the device), then the KV cache in it */
        s->state = be->open(e, d);
        if (!s->state) {
            krt_session_free(s);
            return NULL;
        }
        storage.ctx = s->state;
    }
    s->kv = krt_kv_new(&cfg, &storage, d);
    if (!s->kv) {
        krt_session_free(s);
        return NULL;
    }
    if (be->open ? be->attach(s->state, s->kv, d) != 0 : (s->state = be->create(e, s->kv, d)) == NULL) {
        krt_session_free(s);
        return NULL;
    }
    return s;
}

void krt_session_free(krt_session *s)
{
    if (!s) return;
    /* the KV cache first: a device backend's state holds what frees its blocks */
    krt_kv_free(s->kv);
    if (s->state) s->backend->destroy(s->state);
    free(s->layers);
    free(s->positions);
    free(s);
}

int64_t krt_session_vocab(const krt_session *s) { return s->vocab; }
int krt_session_max_context(const krt_session *s) { return s->max_context; }

static int report(ks_diag *d, const char *fmt, ...) KS_PRINTF(2, 3);
static int report(ks_diag *d, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ks_verror(d, "kiln", fmt, ap);
    va_end(ap);
    return -1;
}

int krt_session_seq_add(krt_session *s, int seq, ks_diag *d)
{
    const char *why = NULL;
    if (krt_kv_seq_add(s->kv, seq, &why) != 0) return report(d, "sequence %d: %s", seq, why);
    return 0;
}

int krt_session_seq_fork(krt_session *s, int src, int dst, ks_diag *d)
{
    const char *why = NULL;
    if (krt_kv_seq_fork(s->kv, src, dst, &why) != 0) return report(d, "fork %d -> %d: %s", src, dst, why);
    return 0;
}

void krt_session_seq_free(krt_session *s, int seq) { krt_kv_seq_free(s->kv, seq); }
int krt_session_seq_len(const krt_session *s, int seq) { return krt_kv_seq_len(s->kv, seq); }

int krt_session_step(krt_session *s, int n, const int32_t *tokens, const int32_t *seq_ids, float *out,
                     ks_diag *d)
{
    if (n <= 0) return report(d, "a step needs at least one token");
    KS_GROW(s->positions, (size_t)n, s->cap, (size_t)1 << 24, "tokens in a step");
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= s->n_token_ids)
            return report(d, "token id %d is out of range (the vocabulary has %lld ids)", tokens[i],
                          (long long)s->n_token_ids);
        if (!krt_kv_seq_exists(s->kv, seq_ids[i])) return report(d, "sequence %d does not exist", seq_ids[i]);
    }
    /* positions: each sequence's length so far, counted on through the step */
    for (int i = 0; i < n; i++) {
        int before = 0;
        for (int j = 0; j < i; j++) before += seq_ids[j] == seq_ids[i];
        s->positions[i] = krt_kv_seq_len(s->kv, seq_ids[i]) + before;
        if (s->positions[i] >= s->max_context)
            return report(d, "sequence %d: position %d is past the context of %d tokens", seq_ids[i],
                          s->positions[i], s->max_context);
    }
    /* reserve all or nothing: remember lengths to roll back */
    int *old_len = ks_xmalloc(sizeof *old_len * (size_t)n);
    int rc = 0;
    for (int i = 0; i < n; i++) old_len[i] = krt_kv_seq_len(s->kv, seq_ids[i]);
    int i = 0;
    for (; i < n; i++) {
        const char *why = NULL;
        if (s->positions[i] + 1 > krt_kv_seq_len(s->kv, seq_ids[i]) &&
            krt_kv_seq_reserve(s->kv, seq_ids[i], s->positions[i] + 1, &why) != 0) {
            rc = report(d, "sequence %d: %s", seq_ids[i], why);
            break;
        }
    }
    if (!rc) {
        kir_step st = {.n_tokens = n, .tokens = tokens, .positions = s->positions, .seq_ids = seq_ids};
        rc = s->backend->step(s->state, &st, out, d);
    }
    if (rc) {
        for (int j = 0; j < n; j++) {
            const char *why = NULL;
            if (krt_kv_seq_len(s->kv, seq_ids[j]) > old_len[j])
                krt_kv_seq_reserve(s->kv, seq_ids[j], old_len[j], &why);
        }
    }
    free(old_len);
    return rc;
}

int32_t krt_argmax(const float *logits, int64_t n)
{
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return (int32_t)best;
}
