/* bench.c — timing an engine: time to first token and decode per token
 * (runtime/bench.h). */
#include "runtime/bench.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/generate.h"
#include "runtime/text/sampler.h"

krt_bench_opts krt_bench_defaults(void)
{
    krt_bench_opts o = {.prompts = {128, 512, 2048, 8192}, .n_prompts = 4, .decode = 128, .decode_prompt = 16,
                        .warmup = 1, .reps = 5};
    return o;
}

/* The synthetic prompt: ids drawn below n_ids by a fixed generator
 * (splitmix64), the same on every run and machine. */
static void fill_ids(int32_t *ids, int n, int64_t n_ids)
{
    uint64_t x = 0x6b696c6e; /* "kiln" */
    for (int i = 0; i < n; i++) {
        uint64_t z = (x += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        ids[i] = (int32_t)(z % (uint64_t)n_ids);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median, min, max and first of t[0..n), seconds in, milliseconds out; sorts t. */
static krt_bench_time summarize(double *t, int n)
{
    double first = t[0];
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    double med = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
    return (krt_bench_time){.median_ms = 1e3 * med, .min_ms = 1e3 * t[0], .max_ms = 1e3 * t[n - 1],
                            .first_ms = 1e3 * first};
}

/* One generation in a fresh sequence 0: n prompt ids, max_new greedy
 * tokens (end-of-sequence ids ignored), then the sequence freed. */
static int one_run(krt_session *s, const int32_t *ids, int n, int max_new, krt_gen_stats *st, ks_diag *d)
{
    if (krt_session_seq_add(s, 0, d) != 0) return -1;
    krt_gen_opts go = krt_gen_defaults();
    go.max_new = max_new;
    go.ignore_eos = 1;
    int got = krt_generate(s, 0, NULL, ids, n, &go, NULL, st, d);
    krt_session_seq_free(s, 0);
    if (got < 0) return -1;
    if (got != max_new) { /* room was checked: only a callback or the context could stop it, and neither does */
        ks_error(d, krt_session_desc(s)->where, "benchmark: generated %d tokens, not %d", got, max_new);
        return -1;
    }
    return 0;
}

/* The options' ranges; what fits the session is checked by the caller. */
static int check_opts(const krt_bench_opts *o, const char *where, ks_diag *d)
{
    if (o->n_prompts < 0 || o->n_prompts > KRT_BENCH_MAX_PROMPTS) {
        ks_error(d, where, "benchmark: %d prompt lengths; from 0 to %d may be given", o->n_prompts,
                 KRT_BENCH_MAX_PROMPTS);
        return -1;
    }
    for (int i = 0; i < o->n_prompts; i++)
        if (o->prompts[i] < 1) {
            ks_error(d, where, "benchmark: a prompt of %d tokens: a prompt needs at least one", o->prompts[i]);
            return -1;
        }
    if (o->decode < 0 || o->decode_prompt < 1 || o->warmup < 0 || o->reps < 1 || o->reps > KRT_BENCH_MAX_REPS) {
        ks_error(d, where, "benchmark: decode %d (at least 0) after %d tokens (at least 1), warm-up %d (at least 0), "
                 "reps %d (1 to %d)", o->decode, o->decode_prompt, o->warmup, o->reps, KRT_BENCH_MAX_REPS);
        return -1;
    }
    if (o->n_prompts == 0 && o->decode == 0) {
        ks_error(d, where, "benchmark: nothing to measure (no prompt lengths and no decode steps)");
        return -1;
    }
    if (o->n_batches < 0 || o->n_batches > KRT_BENCH_MAX_BATCHES) {
        ks_error(d, where, "benchmark: %d batch sizes; from 0 to %d may be given", o->n_batches, KRT_BENCH_MAX_BATCHES);
        return -1;
    }
    if (o->n_batches > 0 && o->decode == 0) {
        ks_error(d, where, "benchmark: a batched decode needs decode steps (decode is 0)");
        return -1;
    }
    for (int i = 0; i < o->n_batches; i++)
        if (o->batches[i] < 2 || o->batches[i] > KRT_BENCH_MAX_BATCH) {
            ks_error(d, where, "benchmark: a batch of %d sequences: from 2 to %d (batch 1 is the decode itself)",
                     o->batches[i], KRT_BENCH_MAX_BATCH);
            return -1;
        }
    return 0;
}

/* One batched decode in fresh sequences 0 .. B-1: each prefilled with the n prompt ids (in steps
 * of at most the engine's largest, its first new token drawn), then `steps` steps of B tokens, one
 * a sequence, drawn greedily; *step_s the time of a step; the sequences freed. */
static int one_batch(krt_session *s, int B, const int32_t *ids, int n, int steps, double *step_s, ks_diag *d)
{
    const krt_desc *desc = krt_session_desc(s);
    int32_t *tok = ks_try_malloc(sizeof *tok * (size_t)B * 3), *seq = tok + B, *next = tok + 2 * B;
    int32_t *pseq = ks_try_malloc(sizeof *pseq * (size_t)n);
    krt_sampler **smp = ks_try_calloc((size_t)B + 1, sizeof *smp); /* [B] one a sequence; [B]: none (prefill) */
    int rc = tok && pseq && smp ? 0 : ks_error_oom(d, desc->where, 0, "the batched decode");
    krt_sampler_config cfg = krt_sampler_defaults();
    cfg.temperature = 0;
    int added = 0;
    for (int b = 0; rc == 0 && b < B; b++)
        if (!(smp[b] = krt_sampler_new(d, &cfg, (int32_t)desc->vocab))) rc = -1;
    for (; rc == 0 && added < B; added++) {
        if (krt_session_seq_add(s, added, d) != 0) {
            rc = -1;
            break;
        }
        /* the prompt in steps of at most the engine's largest (as kiln run runs a long one), its last
           token drawn */
        int chunk = (int)(desc->plan.max_tokens < n ? desc->plan.max_tokens : n);
        krt_sampler **ps = ks_try_calloc((size_t)chunk, sizeof *ps);
        int32_t *nx = ks_try_malloc(sizeof *nx * (size_t)chunk);
        if (!ps || !nx) {
            rc = ks_error_oom(d, desc->where, (sizeof *ps + sizeof *nx) * (size_t)chunk, "the batched decode");
            added++;
            free(ps);
            free(nx);
            break;
        }
        for (int i = 0; i < n; i++) pseq[i] = added;
        for (int at = 0; rc == 0 && at < n; at += chunk) {
            int m = n - at < chunk ? n - at : chunk;
            ps[m - 1] = at + m == n ? smp[added] : NULL;
            krt_step_req req = {.n = m, .tokens = ids + at, .seq_ids = pseq, .samplers = ps, .next = nx};
            rc = krt_session_run(s, &req, d);
            ps[m - 1] = NULL;
            if (rc == 0 && at + m == n) next[added] = nx[m - 1];
        }
        free(nx);
        free(ps);
    }
    double t0 = ks_now_seconds();
    for (int k = 0; rc == 0 && k < steps; k++) {
        for (int b = 0; b < B; b++) tok[b] = next[b] < 0 ? 0 : next[b], seq[b] = b;
        krt_step_req req = {.n = B, .tokens = tok, .seq_ids = seq, .samplers = smp, .next = next};
        rc = krt_session_run(s, &req, d);
    }
    *step_s = (ks_now_seconds() - t0) / (steps > 0 ? steps : 1);
    for (int b = 0; b < added; b++) krt_session_seq_free(s, b);
    for (int b = 0; smp && b < B; b++) krt_sampler_free(smp[b]);
    free(smp);
    free(pseq);
    free(tok);
    return rc;
}

/* The cold start's first token: that of the session's first run (a prompt of n tokens). */
static void note_first_run(krt_bench_result *r, int n, const krt_gen_stats *st)
{
    if (r->cold.prompt_tokens) return;
    r->cold.prompt_tokens = n;
    r->cold.first_token_ms = 1e3 * st->first_token_s;
}

int krt_bench_run(krt_session *s, const krt_bench_opts *o, krt_bench_result *r, ks_diag *d)
{
    const krt_desc *desc = krt_session_desc(s);
    const krt_kv_info *kv = krt_session_kv_info(s);
    memset(r, 0, sizeof *r);
    if (check_opts(o, desc->where, d) != 0) return -1;
    int ctx = krt_session_max_context(s);
    snprintf(r->device, sizeof r->device, "%s", kv->on_device ? kv->device : "cpu");
    r->weight_dtype = kir_dtype_name(desc->weight_dtype);
    r->vocab = desc->vocab;
    r->max_context = ctx;
    r->max_step_tokens = desc->plan.max_tokens;
    r->warmup = o->warmup;
    r->reps = o->reps;
    r->decode = o->decode;
    r->decode_prompt = o->decode_prompt;
    r->kv_blocks = kv->n_blocks;
    r->kv_block_size = kv->block_size;
    r->kv_bytes = kv->bytes;
    /* the decode's prompt, its first token and its steps: decode_prompt + decode positions */
    if (o->decode > 0 && (int64_t)o->decode_prompt + o->decode > ctx) {
        ks_error(d, desc->where, "benchmark: a decode of %d steps after %d prompt tokens needs %lld positions; the "
                 "context has %d", o->decode, o->decode_prompt, (long long)o->decode_prompt + o->decode, ctx);
        return -1;
    }
    int longest = o->decode > 0 ? o->decode_prompt : 0;
    for (int i = 0; i < o->n_prompts; i++)
        if (o->prompts[i] <= ctx && o->prompts[i] > longest) longest = o->prompts[i];
    int32_t *ids = ks_try_malloc(sizeof *ids * (size_t)(longest ? longest : 1));
    if (!ids) return ks_error_oom(d, desc->where, sizeof *ids * (size_t)longest, "the benchmark's prompt");
    fill_ids(ids, longest, desc->n_token_ids);

    double t[KRT_BENCH_MAX_REPS];
    krt_gen_stats st;
    int rc = 0;
    for (int i = 0; i < o->n_prompts && rc == 0; i++) {
        krt_bench_prefill *p = &r->prefill[r->n_prefill++];
        p->tokens = o->prompts[i];
        if (p->tokens > ctx) continue; /* skipped: krt_bench_note says why */
        for (int k = 0; k < o->warmup + o->reps && rc == 0; k++) {
            rc = one_run(s, ids, p->tokens, 1, &st, d);
            if (k >= o->warmup) t[k - o->warmup] = st.first_token_s;
            if (rc == 0) note_first_run(r, p->tokens, &st);
        }
        if (rc != 0) break;
        p->ran = 1;
        p->steps = (int)(st.times[0].steps + st.times[1].steps); /* one new token: every step was the prompt's */
        p->ttft = summarize(t, o->reps);
    }
    for (int k = 0; o->decode > 0 && k < o->warmup + o->reps && rc == 0; k++) {
        /* decode + 1 new tokens: the first comes from the prefill, each other from a one-token step; decode_s
           is the time from the first to the last */
        rc = one_run(s, ids, o->decode_prompt, o->decode + 1, &st, d);
        if (k >= o->warmup) t[k - o->warmup] = st.decode_s / o->decode;
        if (rc == 0) note_first_run(r, o->decode_prompt, &st);
    }
    if (rc == 0 && o->decode > 0) r->decode_per_token = summarize(t, o->reps);
    for (int i = 0; i < o->n_batches && rc == 0; i++) {
        /* each sequence holds its prompt and a position a step */
        int64_t per_seq = ((int64_t)o->decode_prompt + o->decode + kv->block_size - 1) / kv->block_size;
        r->batches[r->n_batches] = o->batches[i];
        r->batch_blocks[r->n_batches] = per_seq * o->batches[i];
        if (r->batch_blocks[r->n_batches] > kv->n_blocks) { /* skipped: krt_bench_table's note says why */
            r->n_batches++;
            continue;
        }
        for (int k = 0; k < o->warmup + o->reps && rc == 0; k++) {
            double step_s = 0;
            rc = one_batch(s, o->batches[i], ids, o->decode_prompt, o->decode, &step_s, d);
            if (k >= o->warmup) t[k - o->warmup] = step_s;
        }
        if (rc != 0) break;
        r->batch_ran[r->n_batches] = 1;
        r->batch_step[r->n_batches++] = summarize(t, o->reps);
    }
    free(ids);
    return rc;
}

/* The engine file's read rate, GB/s (its bytes over the time to open it; 0 when not timed). */
static double cold_rate(const krt_bench_cold *c) { return c->open_s > 0 ? 1e-9 * (double)c->engine_bytes / c->open_s : 0; }

/* Why a prompt length was not measured in one step, or NULL. */
static const char *prefill_note(const krt_bench_result *r, const krt_bench_prefill *p, char *buf, size_t len)
{
    if (!p->ran)
        snprintf(buf, len, "skipped: longer than the context of %d positions", r->max_context);
    else if (p->steps > 1)
        snprintf(buf, len, "prefilled in %d steps of at most %lld tokens (the engine's largest step: kiln build "
                 "--max-tokens)", p->steps, (long long)r->max_step_tokens);
    else
        return NULL;
    return buf;
}

/* Why batch i was not measured, or NULL. */
static const char *batch_note(const krt_bench_result *r, int i, char *buf, size_t len)
{
    if (r->batch_ran[i]) return NULL;
    char need[32], have[32];
    double block = r->kv_blocks > 0 ? (double)r->kv_bytes / r->kv_blocks : 0;
    snprintf(buf, len, "skipped: %d sequences of %d positions need %lld KV-cache blocks of %d (%s); the session's "
             "cache holds %d (%s)", r->batches[i], r->decode_prompt + r->decode, (long long)r->batch_blocks[i],
             r->kv_block_size, ks_human_bytes(block * (double)r->batch_blocks[i], need, sizeof need), r->kv_blocks,
             ks_human_bytes((double)r->kv_bytes, have, sizeof have));
    return buf;
}

void krt_bench_table(const krt_bench_result *r, const char *engine, ks_buf *out)
{
    ks_buf_printf(out, "kiln bench: %s on %s (%s weights, context %d, steps of at most %lld tokens)\n", engine,
                  r->device, r->weight_dtype, r->max_context, (long long)r->max_step_tokens);
    ks_buf_printf(out, "%d warm-up and %d timed run%s of each; times from the prompt to the first new token "
                  "(greedy)\n\n", r->warmup, r->reps, r->reps == 1 ? "" : "s");
    ks_buf_printf(out, "%-28s %6s %12s %12s %12s\n", "measurement", "steps", "median ms", "min ms", "tokens/s");
    char what[64], note[256];
    for (int i = 0; i < r->n_prefill; i++) {
        const krt_bench_prefill *p = &r->prefill[i];
        snprintf(what, sizeof what, "prefill %d tokens", p->tokens);
        if (p->ran)
            ks_buf_printf(out, "%-28s %6d %12.3f %12.3f %12.1f\n", what, p->steps, p->ttft.median_ms, p->ttft.min_ms,
                          1e3 * p->tokens / p->ttft.median_ms);
        else
            ks_buf_printf(out, "%-28s %6s %12s %12s %12s\n", what, "-", "skipped", "-", "-");
    }
    if (r->decode > 0) {
        snprintf(what, sizeof what, "decode, batch 1, per token");
        ks_buf_printf(out, "%-28s %6d %12.3f %12.3f %12.1f\n", what, r->decode, r->decode_per_token.median_ms,
                      r->decode_per_token.min_ms, 1e3 / r->decode_per_token.median_ms);
    }
    for (int i = 0; i < r->n_batches; i++) {
        snprintf(what, sizeof what, "decode, batch %d, per step", r->batches[i]);
        if (r->batch_ran[i])
            ks_buf_printf(out, "%-28s %6d %12.3f %12.3f %12.1f\n", what, r->decode, r->batch_step[i].median_ms,
                          r->batch_step[i].min_ms, 1e3 * r->batches[i] / r->batch_step[i].median_ms);
        else
            ks_buf_printf(out, "%-28s %6s %12s %12s %12s\n", what, "-", "skipped", "-", "-");
    }
    const krt_bench_cold *c = &r->cold;
    if (c->measured && c->prompt_tokens > 0) {
        char b[32];
        ks_buf_printf(out, "\ncold start: %.3f s from the engine file to the first token: the file read and checked "
                           "in %.3f s (%s, %.2f GB/s), the session opened in %.3f s (on a GPU: the weights uploaded), "
                           "the first %d-token prompt's first token %.3f ms\n",
                      c->open_s + c->session_s + 1e-3 * c->first_token_ms, c->open_s,
                      ks_human_bytes((double)c->engine_bytes, b, sizeof b), cold_rate(c), c->session_s,
                      c->prompt_tokens, c->first_token_ms);
    }
    int header = 0;
    for (int i = 0; i < r->n_prefill; i++)
        if (prefill_note(r, &r->prefill[i], note, sizeof note)) {
            if (!header++) ks_buf_puts(out, "\nnotes:\n");
            ks_buf_printf(out, "  prefill %d tokens: %s\n", r->prefill[i].tokens, note);
        }
    if (r->decode > 0) {
        if (!header++) ks_buf_puts(out, "\nnotes:\n");
        ks_buf_printf(out, "  decode: %d one-token steps after a prompt of %d tokens; time per step\n", r->decode,
                      r->decode_prompt);
    }
    if (r->n_batches > 0)
        ks_buf_printf(out, "  decode, batch B: B sequences, each after a prompt of %d tokens, %d steps of a token each; "
                      "time per step, tokens/s of all\n", r->decode_prompt, r->decode);
    for (int i = 0; i < r->n_batches; i++)
        if (batch_note(r, i, note, sizeof note)) ks_buf_printf(out, "  decode, batch %d: %s\n", r->batches[i], note);
}

/* Times in JSON to the microsecond (the clock's noise is larger). */
static cJSON *ms_number(double ms)
{
    return cJSON_CreateNumber(round(ms * 1e3) / 1e3);
}

/* Rates to a tenth. */
static cJSON *rate_number(double per_s)
{
    return cJSON_CreateNumber(round(per_s * 10) / 10);
}

/* Add item (NULL: its creation failed) to object o under key; 1, or 0 with
 * item freed. */
static int add(cJSON *o, const char *key, cJSON *item)
{
    if (item && cJSON_AddItemToObject(o, key, item)) return 1;
    cJSON_Delete(item);
    return 0;
}

static cJSON *prefill_json(const krt_bench_result *r, const krt_bench_prefill *p)
{
    char note[160];
    const char *nt = prefill_note(r, p, note, sizeof note);
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    int ok = add(o, "tokens", cJSON_CreateNumber(p->tokens)) && add(o, "ran", cJSON_CreateBool(p->ran)) &&
             add(o, "steps", cJSON_CreateNumber(p->steps)) &&
             add(o, "ttft_ms_median", p->ran ? ms_number(p->ttft.median_ms) : cJSON_CreateNull()) &&
             add(o, "ttft_ms_min", p->ran ? ms_number(p->ttft.min_ms) : cJSON_CreateNull()) &&
             add(o, "ttft_ms_max", p->ran ? ms_number(p->ttft.max_ms) : cJSON_CreateNull()) &&
             add(o, "ttft_ms_first", p->ran ? ms_number(p->ttft.first_ms) : cJSON_CreateNull()) &&
             add(o, "tokens_per_s", p->ran ? rate_number(1e3 * p->tokens / p->ttft.median_ms) : cJSON_CreateNull()) &&
             add(o, "note", nt ? cJSON_CreateString(nt) : cJSON_CreateNull());
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static cJSON *cold_json(const krt_bench_cold *c)
{
    if (!c->measured || c->prompt_tokens == 0) return cJSON_CreateNull();
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    int ok = add(o, "total_s", ms_number(c->open_s + c->session_s + 1e-3 * c->first_token_ms)) &&
             add(o, "open_s", ms_number(c->open_s)) &&
             add(o, "engine_bytes", cJSON_CreateNumber((double)c->engine_bytes)) &&
             add(o, "read_gb_per_s", cJSON_CreateNumber(round(cold_rate(c) * 100) / 100)) &&
             add(o, "session_s", ms_number(c->session_s)) &&
             add(o, "prompt_tokens", cJSON_CreateNumber(c->prompt_tokens)) &&
             add(o, "first_token_ms", ms_number(c->first_token_ms));
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static cJSON *decode_json(const krt_bench_result *r)
{
    if (r->decode == 0) return cJSON_CreateNull();
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    int ok = add(o, "prompt_tokens", cJSON_CreateNumber(r->decode_prompt)) &&
             add(o, "tokens", cJSON_CreateNumber(r->decode)) &&
             add(o, "ms_per_token_median", ms_number(r->decode_per_token.median_ms)) &&
             add(o, "ms_per_token_min", ms_number(r->decode_per_token.min_ms)) &&
             add(o, "tokens_per_s", rate_number(1e3 / r->decode_per_token.median_ms));
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

int krt_bench_json(const krt_bench_result *r, const char *engine, ks_buf *out, ks_diag *d)
{
    cJSON *o = cJSON_CreateObject(), *pre = cJSON_CreateArray();
    int ok = o && pre && add(o, "kiln_bench", cJSON_CreateNumber(1)) && add(o, "engine", cJSON_CreateString(engine)) &&
             add(o, "device", cJSON_CreateString(r->device)) &&
             add(o, "weight_dtype", cJSON_CreateString(r->weight_dtype)) &&
             add(o, "vocab", cJSON_CreateNumber((double)r->vocab)) &&
             add(o, "max_context", cJSON_CreateNumber(r->max_context)) &&
             add(o, "max_step_tokens", cJSON_CreateNumber((double)r->max_step_tokens)) &&
             add(o, "kv_blocks", cJSON_CreateNumber(r->kv_blocks)) &&
             add(o, "kv_block_size", cJSON_CreateNumber(r->kv_block_size)) &&
             add(o, "kv_bytes", cJSON_CreateNumber((double)r->kv_bytes)) &&
             add(o, "warmup", cJSON_CreateNumber(r->warmup)) && add(o, "reps", cJSON_CreateNumber(r->reps));
    for (int i = 0; ok && i < r->n_prefill; i++) {
        cJSON *p = prefill_json(r, &r->prefill[i]);
        ok = p && cJSON_AddItemToArray(pre, p);
        if (!ok) cJSON_Delete(p);
    }
    if (ok) {
        ok = add(o, "prefill", pre); /* o owns it now, or it was freed */
        pre = NULL;
        ok = ok && add(o, "decode", decode_json(r)) && add(o, "cold_start", cold_json(&r->cold));
    }
    if (ok) {
        cJSON *batches = cJSON_CreateArray();
        ok = batches != NULL;
        for (int i = 0; ok && i < r->n_batches; i++) {
            cJSON *b = cJSON_CreateObject();
            int ran = r->batch_ran[i];
            char note[256];
            const char *why = batch_note(r, i, note, sizeof note);
            ok = b && add(b, "batch", cJSON_CreateNumber(r->batches[i])) && add(b, "ran", cJSON_CreateBool(ran)) &&
                 add(b, "steps", cJSON_CreateNumber(r->decode)) &&
                 add(b, "ms_per_step_median", ran ? ms_number(r->batch_step[i].median_ms) : cJSON_CreateNull()) &&
                 add(b, "ms_per_step_min", ran ? ms_number(r->batch_step[i].min_ms) : cJSON_CreateNull()) &&
                 add(b, "tokens_per_s",
                     ran ? rate_number(1e3 * r->batches[i] / r->batch_step[i].median_ms) : cJSON_CreateNull()) &&
                 add(b, "note", why ? cJSON_CreateString(why) : cJSON_CreateNull()) &&
                 cJSON_AddItemToArray(batches, b);
            if (ok) b = NULL; /* the array owns it */
            cJSON_Delete(b);
        }
        if (ok)
            ok = add(o, "decode_batch", batches); /* o owns it now, or it was freed */
        else
            cJSON_Delete(batches);
    }
    char *text = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    cJSON_Delete(pre);
    if (!text) return ks_error_oom(d, "kiln", 0, "the benchmark's JSON");
    ks_buf_puts(out, text);
    ks_buf_puts(out, "\n");
    free(text);
    return 0;
}
