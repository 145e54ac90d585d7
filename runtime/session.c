/* session.c — sequences and steps over a backend and a paged KV cache. */
#include "runtime/session.h"

#include <stdlib.h>
#include <string.h>

struct krt_session {
    const krt_engine *engine;   /* not owned */
    const krt_desc *desc;       /* the engine's description: &engine->desc */
    const krt_backend *backend; /* the engine's backend */
    void *state;                /* the backend's state */
    krt_kv *kv;                 /* owned */
    krt_kv_info kv_info;        /* how the cache was sized */
    int max_context;            /* positions per sequence: the engine's, or fewer as the options ask */
    int max_seqs;               /* sequence ids are below this */
    int draw_on_device;         /* 1: next tokens are drawn by the backend's step_draw */
    /* scratch of a step, grown as needed */
    krt_step_status *status;    /* [n] per token, when the caller gives none */
    int32_t *run_tok;           /* [n] the tokens that run, compacted */
    int32_t *run_seq;           /* [n] their sequences */
    int32_t *positions;         /* [n] their positions */
    int32_t *run_of;            /* [n] the compacted index of each token, -1 when it does not run */
    int32_t *draw_rows;         /* [n] compacted rows drawn from */
    int32_t *draw_tok;          /* [n] the token each draw belongs to */
    krt_draw *draws;            /* [n] the draws of a device step */
    size_t cap;                 /* capacity of the arrays above, in tokens */
    float *logits;              /* [cap_logits] logits of the tokens that run, when the caller's cannot take them */
    size_t cap_logits;          /* floats allocated */
    int32_t *seq_count;         /* [max_seqs] tokens of each sequence in the step */
    int32_t *seq_old_len;       /* [max_seqs] its length before the step */
    krt_step_status *seq_status; /* [max_seqs] its outcome */
    int32_t *seq_order;         /* [max_seqs] the step's sequences, in order of first appearance */
    int32_t *seq_next;          /* [max_seqs] the position its next token of the step takes */
};

static int report(ks_diag *d, const char *fmt, ...) KS_PRINTF(2, 3);
static int report(ks_diag *d, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ks_verror(d, "kiln", fmt, ap);
    va_end(ap);
    return -1;
}

/* Bytes of one KV block over every layer's K and V. */
/* The option checks, with the messages kiln run's flags map to. */
static int check_opts(const krt_session_opts *o, int model_ctx, ks_diag *d)
{
    if (!o) return 0;
    if (o->max_seqs < 0) return report(d, "max_seqs must not be negative (got %d)", o->max_seqs);
    if (o->max_context < 0) return report(d, "max_context must not be negative (got %d)", o->max_context);
    if (o->max_context > model_ctx)
        return report(d, "a context of %d positions is over the engine's limit of %d", o->max_context, model_ctx);
    if (o->block_size < 0) return report(d, "block_size must not be negative (got %d)", o->block_size);
    if (o->n_blocks < 0) return report(d, "n_blocks must not be negative (got %d)", o->n_blocks);
    if (!(o->kv_fraction >= 0 && o->kv_fraction <= 1))
        return report(d, "the KV-cache fraction of free device memory must be in (0, 1] (got %g)", o->kv_fraction);
    if (o->graph_max_tokens < 0) return report(d, "graph_max_tokens must not be negative (got %d)", o->graph_max_tokens);
    return 0;
}

/* The cache's blocks of bs positions (`block` bytes each over all layers):
 * given, or from the device's free memory, or enough for max_seqs full
 * sequences; into s->kv_info. -1 after reporting. */
static int size_kv(krt_session *s, const krt_session_opts *o, int bs, double block, ks_diag *d)
{
    krt_kv_info *info = &s->kv_info;
    int64_t blocks_per_seq = (s->max_context + bs - 1) / bs;
    int64_t full = blocks_per_seq * s->max_seqs;
    krt_device_mem mem;
    int have_mem = s->backend->mem_info && s->backend->mem_info(s->state, &mem, d) == 0;
    if (s->backend->mem_info && !have_mem) return -1;
    char b1[32], b2[32];
    if (have_mem) {
        info->on_device = 1;
        info->free_bytes = mem.free_bytes;
        snprintf(info->device, sizeof info->device, "%s", mem.name);
    }
    int64_t n;
    if (o && o->n_blocks > 0) {
        n = o->n_blocks;
        if (have_mem && (double)n * block > (double)mem.free_bytes) {
            report(d, "a KV cache of %lld blocks (%s) does not fit in the %s free on the device (%s): ask for fewer "
                      "blocks, or leave the size to the KV-cache fraction",
                   (long long)n, ks_human_bytes((double)n * block, b1, sizeof b1),
                   ks_human_bytes((double)mem.free_bytes, b2, sizeof b2), mem.name);
            return -1;
        }
    } else if (have_mem) {
        double fraction = o && o->kv_fraction > 0 ? o->kv_fraction : KRT_KV_FRACTION_DEFAULT;
        double fit = block > 0 ? fraction * (double)mem.free_bytes / block : (double)full;
        n = fit < (double)full ? (int64_t)fit : full;
        info->from_free_memory = 1;
        info->fraction = fraction;
        if (n < 1) {
            report(d, "the device (%s) has %s free: %g of it cannot hold one KV-cache block of %s", mem.name,
                   ks_human_bytes((double)mem.free_bytes, b1, sizeof b1), fraction, ks_human_bytes(block, b2, sizeof b2));
            return -1;
        }
    } else {
        n = full;
    }
    if (n > INT32_MAX) n = INT32_MAX;
    info->n_blocks = (int)n;
    info->block_size = bs;
    info->bytes = (size_t)((double)n * block);
    return 0;
}

krt_session *krt_session_new(const krt_engine *e, const krt_session_opts *o, ks_diag *d)
{
    const krt_desc *desc = &e->desc;
    if (check_opts(o, desc->max_context, d) != 0) return NULL;
    const krt_backend *be = krt_backend_for(e, d);
    if (!be) return NULL;
    krt_session *s = ks_try_calloc(1, sizeof *s);
    if (!s) return ks_error_oom(d, e->path, sizeof *s, "a session"), NULL;
    s->engine = e;
    s->desc = desc;
    s->backend = be;
    s->max_seqs = o && o->max_seqs > 0 ? o->max_seqs : 16;
    s->max_context = o && o->max_context > 0 ? o->max_context : desc->max_context;
    int bs = o && o->block_size > 0 ? o->block_size : 16;
    size_t ns = (size_t)s->max_seqs;
    s->seq_count = ks_try_calloc(ns, sizeof *s->seq_count);
    s->seq_old_len = ks_try_calloc(ns, sizeof *s->seq_old_len);
    s->seq_status = ks_try_calloc(ns, sizeof *s->seq_status);
    s->seq_order = ks_try_calloc(ns, sizeof *s->seq_order);
    s->seq_next = ks_try_calloc(ns, sizeof *s->seq_next);
    if (!s->seq_count || !s->seq_old_len || !s->seq_status || !s->seq_order || !s->seq_next) {
        ks_error_oom(d, e->path, ns * (4 * sizeof(int32_t) + sizeof(krt_step_status)), "the session's sequences");
        krt_session_free(s);
        return NULL;
    }
    krt_kv_storage storage = *be->kv_storage;
    if (be->open) {
        /* a device backend: its state first (it checks the engine fits the device and uploads the
         * weights), then the KV cache in what memory is left */
        krt_backend_opts bo = {
            .graphs = !(o && o->no_graphs),
            .graph_max_tokens = o && o->graph_max_tokens > 0 ? o->graph_max_tokens : KRT_GRAPH_TOKENS_DEFAULT,
            .profile = o && o->profile,
            .kernel_overlap = !(o && o->no_kernel_overlap),
        };
        s->state = be->open(e, &bo, d);
        if (!s->state) {
            krt_session_free(s);
            return NULL;
        }
        storage.ctx = s->state;
    }
    size_t kv_elem = be->kv_elem_size(desc), kv_scale = be->kv_scale_size ? be->kv_scale_size(desc) : 0;
    if (size_kv(s, o, bs, krt_kv_block_bytes(desc->kv_layers, desc->n_kv_layers, bs, kv_elem, kv_scale), d) != 0) {
        krt_session_free(s);
        return NULL;
    }
    krt_kv_config cfg = {
        .n_layers = desc->n_kv_layers,
        .layers = desc->kv_layers,
        .block_size = bs,
        .n_blocks = s->kv_info.n_blocks,
        .max_seqs = s->max_seqs,
        .max_context = s->max_context,
        .elem_size = kv_elem,
        .scale_size = kv_scale,
    };
    s->kv = krt_kv_new_named(&cfg, &storage, e->path, d);
    if (!s->kv) {
        if (s->kv_info.on_device) {
            char b1[32];
            report(d, "the KV cache of %d blocks (%s) could not be allocated on the device (%s): ask for fewer blocks "
                      "or a smaller KV-cache fraction",
                   s->kv_info.n_blocks, ks_human_bytes((double)s->kv_info.bytes, b1, sizeof b1), s->kv_info.device);
        }
        krt_session_free(s);
        return NULL;
    }
    if (be->open ? be->attach(s->state, s->kv, d) != 0 : (s->state = be->create(e, s->kv, d)) == NULL) {
        krt_session_free(s);
        return NULL;
    }
    s->draw_on_device = !(o && o->host_sampling) && be->can_draw && be->step_draw && be->can_draw(s->state);
    return s;
}

void krt_session_free(krt_session *s)
{
    if (!s) return;
    /* the KV cache first: a device backend's state holds what frees its blocks */
    krt_kv_free(s->kv);
    if (s->state) s->backend->destroy(s->state);
    free(s->status);
    free(s->run_tok);
    free(s->run_seq);
    free(s->positions);
    free(s->run_of);
    free(s->draw_rows);
    free(s->draw_tok);
    free(s->draws);
    free(s->logits);
    free(s->seq_count);
    free(s->seq_old_len);
    free(s->seq_status);
    free(s->seq_order);
    free(s->seq_next);
    free(s);
}

const krt_desc *krt_session_desc(const krt_session *s) { return s->desc; }
int64_t krt_session_vocab(const krt_session *s) { return s->desc->vocab; }
int krt_session_max_context(const krt_session *s) { return s->max_context; }
int krt_session_max_seqs(const krt_session *s) { return s->max_seqs; }
int krt_session_free_blocks(const krt_session *s) { return krt_kv_free_blocks(s->kv); }
int krt_session_block_size(const krt_session *s) { return krt_kv_config_of(s->kv)->block_size; }
int krt_session_seq_attach_cached(krt_session *s, int seq, const uint64_t *hashes, int n)
{
    return krt_kv_seq_attach_cached(s->kv, seq, hashes, n);
}
void krt_session_seq_publish(krt_session *s, int seq, int b, uint64_t hash) { krt_kv_seq_publish(s->kv, seq, b, hash); }
krt_kv_prefix_stats krt_session_prefix_stats(const krt_session *s) { return krt_kv_prefix_stats_of(s->kv); }
const krt_kv_info *krt_session_kv_info(const krt_session *s) { return &s->kv_info; }

int krt_session_profile(const krt_session *s, double ceiling_tflops, ks_buf *out)
{
    if (!s->backend->profile_report) return -1;
    s->backend->profile_report(s->state, ceiling_tflops, out);
    return 0;
}
int krt_session_draws_on_device(const krt_session *s) { return s->draw_on_device; }

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

int krt_session_seq_truncate(krt_session *s, int seq, int len)
{
    const char *why = NULL;
    if (len > krt_kv_seq_len(s->kv, seq)) return -1;
    return krt_kv_seq_reserve(s->kv, seq, len, &why); /* shortening: blocks go back, nothing is copied */
}
int krt_session_seq_len(const krt_session *s, int seq) { return krt_kv_seq_len(s->kv, seq); }

int krt_session_set_tap(krt_session *s, krt_tap_fn tap, void *ctx, ks_diag *d)
{
    if (!s->backend->set_tap)
        return report(d, "the %s backend cannot show the values it computes", s->backend->name);
    return s->backend->set_tap(s->state, tap, ctx, d);
}

const char *krt_step_status_text(krt_step_status st)
{
    switch (st) {
    case KRT_STEP_OK:
        return "ok";
    case KRT_STEP_NO_SEQUENCE:
        return "no such sequence";
    case KRT_STEP_BAD_TOKEN:
        return "a token id is out of range";
    case KRT_STEP_OVER_CONTEXT:
        return "past the end of the context";
    case KRT_STEP_OUT_OF_BLOCKS:
        return "out of KV-cache blocks";
    case KRT_STEP_FAILED:
        return "the step failed";
    }
    return "?";
}

int krt_session_step(krt_session *s, int n, const int32_t *tokens, const int32_t *seq_ids, float *out,
                     ks_diag *d)
{
    krt_step_req r = {.n = n, .tokens = tokens, .seq_ids = seq_ids, .logits = out};
    return krt_session_run(s, &r, d);
}

/* Put every reserved sequence of the step back to its length before it. */
static void roll_back(krt_session *s, int n_seqs)
{
    for (int k = 0; k < n_seqs; k++) {
        int seq = s->seq_order[k];
        const char *why = NULL;
        if (krt_kv_seq_len(s->kv, seq) > s->seq_old_len[seq]) krt_kv_seq_reserve(s->kv, seq, s->seq_old_len[seq], &why);
    }
}

/* *p (of `size`-byte elements) reallocated for cap of them: 0, or -1 with *p as it was. */
static int regrow(void *p, size_t cap, size_t size)
{
    void **at = p;
    void *q = ks_try_realloc(*at, cap * size);
    if (!q) return -1;
    *at = q;
    return 0;
}

/* The per-token scratch for a step of n tokens: 0, or -1 after reporting
 * (the arrays keep the capacity they had). */
static int grow_scratch(krt_session *s, size_t n, ks_diag *d)
{
    if (n <= s->cap) return 0;
    size_t cap = 2 * s->cap > n ? 2 * s->cap : n;
    /* each array grown to cap, or left as it was: s->cap counts only when all grew */
    if (regrow(&s->status, cap, sizeof *s->status) || regrow(&s->run_tok, cap, sizeof *s->run_tok) ||
        regrow(&s->run_seq, cap, sizeof *s->run_seq) || regrow(&s->positions, cap, sizeof *s->positions) ||
        regrow(&s->run_of, cap, sizeof *s->run_of) || regrow(&s->draw_rows, cap, sizeof *s->draw_rows) ||
        regrow(&s->draw_tok, cap, sizeof *s->draw_tok) || regrow(&s->draws, cap, sizeof *s->draws)) {
        char what[64];
        snprintf(what, sizeof what, "a step of %zu token%s", n, n == 1 ? "" : "s");
        size_t per_token = sizeof(krt_step_status) + 6 * sizeof(int32_t) + sizeof(krt_draw);
        return ks_error_oom(d, s->engine->path, cap * per_token, what);
    }
    s->cap = cap;
    return 0;
}

/* 1 when no logit of the row is NaN or infinite: a draw from a row that
 * has one is no draw (-1), as on the device (runtime/cuda/cuda_draw.h). */
static int all_finite(const float *row, int64_t n)
{
    float acc = 0;
    for (int64_t i = 0; i < n; i++) acc += row[i] * 0.0f; /* NaN when some row[i] is NaN or infinite */
    return acc == 0.0f;
}

/* Can this step's draws go to the device? Not with a repetition penalty
 * (the device keeps no record of the ids seen), and a sampler only once
 * (its generator's draws are in order). */
static int device_takes_draws(const krt_session *s, const krt_step_req *r, int n_draw)
{
    if (!s->draw_on_device || n_draw == 0) return 0;
    for (int k = 0; k < n_draw; k++) {
        const krt_sampler *smp = r->samplers[s->draw_tok[k]];
        if (krt_sampler_config_of(smp)->repetition_penalty != 1.0f) return 0;
        for (int j = 0; j < k; j++)
            if (r->samplers[s->draw_tok[j]] == smp) return 0;
    }
    return 1;
}

/* The step's checks and reservations; fills the statuses and the compacted
 * tokens. Returns how many tokens run, or -1 after reporting (strict). */
static int plan_step(krt_session *s, const krt_step_req *r, krt_step_status *st, int *n_seqs, ks_diag *d)
{
    int n = r->n, strict = r->status == NULL;
    *n_seqs = 0;
    /* 1. the tokens: their sequences exist, their ids are in range */
    for (int i = 0; i < n; i++) {
        int seq = r->seq_ids[i];
        int bad_id = r->tokens[i] < 0 || r->tokens[i] >= s->desc->n_token_ids;
        st[i] = KRT_STEP_OK;
        if (strict && bad_id)
            return report(d, "token id %d is out of range (the vocabulary has %lld ids)", r->tokens[i],
                          (long long)s->desc->n_token_ids);
        if (!krt_kv_seq_exists(s->kv, seq)) {
            if (strict) return report(d, "sequence %d does not exist", seq);
            st[i] = KRT_STEP_NO_SEQUENCE;
            continue;
        }
        if (s->seq_count[seq] == 0) {
            s->seq_order[(*n_seqs)++] = seq;
            s->seq_status[seq] = KRT_STEP_OK;
            s->seq_old_len[seq] = krt_kv_seq_len(s->kv, seq);
            s->seq_next[seq] = s->seq_old_len[seq];
        }
        s->seq_count[seq]++;
        if (bad_id) s->seq_status[seq] = KRT_STEP_BAD_TOKEN;
    }
    /* 2. positions: each sequence's length so far, counted on through the step */
    for (int i = 0; i < n; i++) {
        if (st[i] != KRT_STEP_OK) continue;
        int seq = r->seq_ids[i], pos = s->seq_next[seq]++;
        if (pos >= s->max_context && s->seq_status[seq] == KRT_STEP_OK) {
            if (strict)
                return report(d, "sequence %d: position %d is past the context of %d tokens", seq, pos, s->max_context);
            s->seq_status[seq] = KRT_STEP_OVER_CONTEXT;
        }
        s->positions[i] = pos;
    }
    /* 3. KV blocks, sequence by sequence in order of first appearance: one that
     * cannot have them fails alone */
    for (int k = 0; k < *n_seqs; k++) {
        int seq = s->seq_order[k];
        if (s->seq_status[seq] != KRT_STEP_OK) continue;
        const char *why = NULL;
        int free_blocks = krt_kv_free_blocks(s->kv);
        if (krt_kv_seq_reserve(s->kv, seq, s->seq_old_len[seq] + s->seq_count[seq], &why) != 0) {
            if (strict) {
                roll_back(s, k);
                return report(d, "sequence %d: %s (%d of %d blocks free)", seq, why, free_blocks,
                              s->kv_info.n_blocks);
            }
            s->seq_status[seq] = KRT_STEP_OUT_OF_BLOCKS;
        }
    }
    /* 4. the tokens that run, compacted in their order */
    int n_run = 0;
    for (int i = 0; i < n; i++) {
        s->run_of[i] = -1;
        if (st[i] != KRT_STEP_OK) continue;
        st[i] = s->seq_status[r->seq_ids[i]];
        if (st[i] != KRT_STEP_OK) continue;
        s->run_of[i] = n_run;
        s->run_tok[n_run] = r->tokens[i];
        s->run_seq[n_run] = r->seq_ids[i];
        s->positions[n_run] = s->positions[i]; /* n_run <= i: not yet needed */
        n_run++;
    }
    return n_run;
}

int krt_session_run(krt_session *s, const krt_step_req *r, ks_diag *d)
{
    int n = r->n;
    if (n <= 0) return report(d, "a step needs at least one token");
    if (n > s->desc->plan.max_tokens)
        return report(d, "a step of %d tokens is more than the %lld %s", n, (long long)s->desc->plan.max_tokens,
                      s->desc->plan.planned ? "the engine's memory plan holds" : "kiln takes");
    if (grow_scratch(s, (size_t)n, d) != 0) {
        if (r->status)
            for (int i = 0; i < n; i++) r->status[i] = KRT_STEP_FAILED;
        return -1;
    }
    krt_step_status *st = r->status ? r->status : s->status;
    if (r->next)
        for (int i = 0; i < n; i++) r->next[i] = -1;
    int n_seqs = 0;
    int n_run = plan_step(s, r, st, &n_seqs, d);
    int rc = n_run < 0 ? -1 : 0;
    if (n_run > 0) {
        /* the draws: rows of tokens that ran */
        int n_draw = 0;
        for (int i = 0; r->samplers && i < n; i++)
            if (r->samplers[i] && s->run_of[i] >= 0) s->draw_rows[n_draw] = s->run_of[i], s->draw_tok[n_draw++] = i;
        int device = device_takes_draws(s, r, n_draw);
        const krt_backend *be = s->backend;
        /* where the logits go: the caller's rows when all run; else scratch when the host needs them */
        float *dest = NULL;
        if (r->logits && n_run == n) {
            dest = r->logits;
        } else if (r->logits || (n_draw > 0 && !device) || !be->step_draw) {
            size_t want = (size_t)n_run * (size_t)s->desc->vocab;
            if (KS_TRY_GROW(s->logits, want, s->cap_logits, (size_t)1 << 40) != 0) {
                char what[64];
                snprintf(what, sizeof what, "the logits of a step of %d token%s", n_run, n_run == 1 ? "" : "s");
                rc = ks_error_oom(d, s->engine->path, want * sizeof(float), what);
            }
            dest = s->logits;
        }
        for (int k = 0; rc == 0 && device && k < n_draw; k++) {
            const krt_sampler *smp = r->samplers[s->draw_tok[k]];
            const krt_sampler_config *c = krt_sampler_config_of(smp);
            s->draws[k] = (krt_draw){c->temperature, c->top_k, c->top_p, krt_sampler_rng(smp), -1};
        }
        krt_step step = {.n_tokens = n_run, .tokens = s->run_tok, .positions = s->positions, .seq_ids = s->run_seq};
        if (rc == 0 && dest && !device)
            rc = be->step(s->state, &step, dest, d);
        else if (rc == 0)
            rc = be->step_draw(s->state, &step, dest, device ? n_draw : 0, s->draw_rows, s->draws, d);
        if (rc == 0 && r->logits && dest != r->logits)
            for (int i = 0; i < n; i++)
                if (s->run_of[i] >= 0)
                    memcpy(r->logits + (size_t)i * (size_t)s->desc->vocab, dest + (size_t)s->run_of[i] * (size_t)s->desc->vocab,
                           sizeof(float) * (size_t)s->desc->vocab);
        for (int k = 0; rc == 0 && k < n_draw; k++) {
            krt_sampler *smp = r->samplers[s->draw_tok[k]];
            int32_t id;
            if (device) {
                id = s->draws[k].id;
                krt_sampler_set_rng(smp, s->draws[k].rng);
                if (id >= 0) krt_sampler_accept(smp, id);
            } else {
                const float *row = dest + (size_t)s->draw_rows[k] * (size_t)s->desc->vocab;
                id = all_finite(row, s->desc->vocab) ? krt_sampler_sample(smp, row) : -1;
            }
            if (r->next) r->next[s->draw_tok[k]] = id;
        }
        if (rc != 0) {
            roll_back(s, n_seqs);
            for (int i = 0; i < n; i++) st[i] = KRT_STEP_FAILED;
        }
    }
    for (int k = 0; k < n_seqs; k++) s->seq_count[s->seq_order[k]] = 0;
    return rc;
}

int32_t krt_argmax(const float *logits, int64_t n)
{
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return (int32_t)best;
}
