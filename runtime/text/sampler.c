/* sampler.c — next-token selection (repetition penalty, temperature, top-k,
 * top-p, a seeded draw) and stop-string checks. The filters follow Hugging
 * Face's logits processors (RepetitionPenaltyLogitsProcessor,
 * TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper), with two
 * deliberate differences: top-k keeps exactly k ids (HF keeps every id tied
 * with the k-th), and ties everywhere go to the lower id, so results do not
 * depend on a sort's stability. */
#include "runtime/text/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct krt_sampler {
    krt_sampler_config cfg; /* settings  */
    int32_t vocab;          /* logits per row */
    uint64_t rng;           /* xorshift64* state, never 0 */
    uint8_t *seen;          /* [vocab] 1 for ids accepted so far */
    float *work;            /* [vocab] logits after penalty and temperature */
    int32_t *ids;           /* [vocab] candidate ids */
    double *probs;          /* [vocab] candidate probabilities */
};

krt_sampler_config krt_sampler_defaults(void)
{
    krt_sampler_config c;
    memset(&c, 0, sizeof c);
    c.temperature = 1.0f;
    c.top_k = 0;
    c.top_p = 1.0f;
    c.repetition_penalty = 1.0f;
    return c;
}

/* ---- the generator ------------------------------------------------------------ */

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static uint64_t next_u64(krt_sampler *s)
{
    /* xorshift64* (Vigna), as llama2.c's sampler uses. */
    s->rng ^= s->rng >> 12;
    s->rng ^= s->rng << 25;
    s->rng ^= s->rng >> 27;
    return s->rng * 0x2545F4914F6CDD1Dull;
}

double krt_sampler_uniform(krt_sampler *s)
{
    return (double)(next_u64(s) >> 11) * (1.0 / 9007199254740992.0); /* 53 bits */
}

const krt_sampler_config *krt_sampler_config_of(const krt_sampler *s) { return &s->cfg; }
uint64_t krt_sampler_rng(const krt_sampler *s) { return s->rng; }

void krt_sampler_set_rng(krt_sampler *s, uint64_t state)
{
    KS_ASSERT(state != 0); /* xorshift64* never reaches 0 */
    s->rng = state;
}

void krt_sampler_reset(krt_sampler *s, uint64_t seed)
{
    s->cfg.seed = seed;
    s->rng = splitmix64(seed);
    if (s->rng == 0) s->rng = 0x9E3779B97F4A7C15ull;
    memset(s->seen, 0, (size_t)s->vocab);
}

/* ---- setup --------------------------------------------------------------------- */

krt_sampler *krt_sampler_new(ks_diag *d, const krt_sampler_config *cfg, int32_t vocab_size)
{
    const char *who = "sampler";
    if (vocab_size <= 0) {
        ks_error(d, who, "vocabulary size must be > 0 (got %d)", (int)vocab_size);
        return NULL;
    }
    if (!(cfg->temperature >= 0) || isinf(cfg->temperature)) {
        ks_error(d, who, "temperature must be >= 0 and finite (got %g)", (double)cfg->temperature);
        return NULL;
    }
    if (cfg->top_k < 0) {
        ks_error(d, who, "top_k must be >= 0 (got %d)", (int)cfg->top_k);
        return NULL;
    }
    if (!(cfg->top_p >= 0 && cfg->top_p <= 1)) {
        ks_error(d, who, "top_p must be in [0, 1] (got %g)", (double)cfg->top_p);
        return NULL;
    }
    if (!(cfg->repetition_penalty > 0) || isinf(cfg->repetition_penalty)) {
        ks_error(d, who, "repetition_penalty must be > 0 and finite (got %g)",
                 (double)cfg->repetition_penalty);
        return NULL;
    }
    krt_sampler *s = ks_try_calloc(1, sizeof *s);
    if (!s) return ks_error_oom(d, who, sizeof *s, "a sampler"), NULL;
    s->cfg = *cfg;
    s->vocab = vocab_size;
    /* all a draw needs, so that drawing allocates nothing */
    s->seen = ks_try_calloc((size_t)vocab_size, 1);
    s->work = ks_try_calloc((size_t)vocab_size, sizeof *s->work);
    s->ids = ks_try_calloc((size_t)vocab_size, sizeof *s->ids);
    s->probs = ks_try_calloc((size_t)vocab_size, sizeof *s->probs);
    if (!s->seen || !s->work || !s->ids || !s->probs) {
        ks_error_oom(d, who, (size_t)vocab_size * (1 + sizeof *s->work + sizeof *s->ids + sizeof *s->probs),
                     "a sampler's tables");
        krt_sampler_free(s);
        return NULL;
    }
    krt_sampler_reset(s, cfg->seed);
    return s;
}

void krt_sampler_free(krt_sampler *s)
{
    if (!s) return;
    free(s->seen);
    free(s->work);
    free(s->ids);
    free(s->probs);
    free(s);
}

void krt_sampler_accept(krt_sampler *s, int32_t id)
{
    if (id >= 0 && id < s->vocab) s->seen[id] = 1;
}

/* ---- filtering ------------------------------------------------------------------- */

/* Candidate a ranks before b: larger logit, then lower id. */
static int ranks_before(const float *w, int32_t a, int32_t b)
{
    return w[a] > w[b] || (w[a] == w[b] && a < b);
}

static void sift_down(const float *w, int32_t *h, size_t n, size_t i)
{
    /* A heap whose root is the worst kept candidate. */
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, worst = i;
        if (l < n && ranks_before(w, h[worst], h[l])) worst = l;
        if (r < n && ranks_before(w, h[worst], h[r])) worst = r;
        if (worst == i) return;
        int32_t t = h[i];
        h[i] = h[worst];
        h[worst] = t;
        i = worst;
    }
}

/* Sort ids best first: a heap sort, since qsort cannot take the logits as context. */
static void sort_by_rank(const float *w, int32_t *ids, size_t n)
{
    /* Build a heap whose root is the worst, then pop the worst to the end. */
    for (size_t i = n / 2; i-- > 0;) sift_down(w, ids, n, i);
    for (size_t end = n; end > 1; end--) {
        int32_t t = ids[0];
        ids[0] = ids[end - 1];
        ids[end - 1] = t;
        sift_down(w, ids, end - 1, 0);
    }
    /* The worst went last each time, so ids now runs best first. */
}

/* Fills s->ids/s->probs with the surviving candidates, best first; returns how many. */
static size_t filter(krt_sampler *s, const float *logits)
{
    const krt_sampler_config *c = &s->cfg;
    float *w = s->work;
    int32_t *ids = s->ids;
    size_t n = 0;
    for (int32_t i = 0; i < s->vocab; i++) {
        float l = logits[i];
        if (s->seen[i] && c->repetition_penalty != 1.0f)
            l = l > 0 ? l / c->repetition_penalty : l * c->repetition_penalty;
        w[i] = l;
        if (!isnan(l) && l != -INFINITY) ids[n++] = i;
    }
    if (n == 0) return 0;
    if (c->temperature == 0) { /* greedy */
        int32_t best = ids[0];
        for (size_t k = 1; k < n; k++)
            if (ranks_before(w, ids[k], best)) best = ids[k];
        ids[0] = best;
        s->probs[0] = 1.0;
        return 1;
    }
    for (size_t k = 0; k < n; k++) w[ids[k]] /= c->temperature;
    if (c->top_k > 0 && (size_t)c->top_k < n) {
        /* Keep the k best: a heap of size k whose root is the worst kept. */
        size_t k = (size_t)c->top_k;
        for (size_t i = k / 2; i-- > 0;) sift_down(w, ids, k, i);
        for (size_t i = k; i < n; i++)
            if (ranks_before(w, ids[i], ids[0])) {
                ids[0] = ids[i];
                sift_down(w, ids, k, 0);
            }
        n = k;
    }
    sort_by_rank(w, ids, n);
    /* Softmax in double, from the largest logit. */
    double max = w[ids[0]], sum = 0;
    for (size_t k = 0; k < n; k++) {
        double e = exp((double)w[ids[k]] - max);
        s->probs[k] = e;
        sum += e;
    }
    for (size_t k = 0; k < n; k++) s->probs[k] /= sum;
    if (c->top_p < 1.0f) {
        double before = 0;
        size_t keep = 0;
        while (keep < n && (keep == 0 || before < (double)c->top_p)) before += s->probs[keep++];
        n = keep;
        for (size_t k = 0; k < n; k++) s->probs[k] /= before;
    }
    return n;
}

size_t krt_sampler_candidates(krt_sampler *s, const float *logits, int32_t *ids, double *probs)
{
    size_t n = filter(s, logits);
    memcpy(ids, s->ids, n * sizeof *ids);
    memcpy(probs, s->probs, n * sizeof *probs);
    return n;
}

int32_t krt_sampler_sample(krt_sampler *s, const float *logits)
{
    size_t n = filter(s, logits);
    if (n == 0) return -1;
    int32_t id = s->ids[n - 1];
    if (n > 1) {
        double r = krt_sampler_uniform(s), cum = 0;
        for (size_t k = 0; k < n; k++) {
            cum += s->probs[k];
            if (r < cum) {
                id = s->ids[k];
                break;
            }
        }
    } else {
        id = s->ids[0];
    }
    krt_sampler_accept(s, id);
    return id;
}

/* ---- stop strings ------------------------------------------------------------------ */

int krt_sampler_ends_with_stop(const char *const *stops, size_t n_stops, const char *text,
                               size_t len)
{
    int best = -1;
    size_t best_len = 0;
    for (size_t i = 0; i < n_stops; i++) {
        size_t k = strlen(stops[i]);
        if (k == 0 || k > len || k <= best_len) continue;
        if (memcmp(text + len - k, stops[i], k) == 0) {
            best = (int)i;
            best_len = k;
        }
    }
    return best;
}

int krt_sampler_stop_find(const char *const *stops, size_t n_stops, const char *text, size_t len,
                          size_t from, size_t *at)
{
    int best = -1;
    size_t best_at = 0;
    for (size_t i = 0; i < n_stops; i++) {
        size_t k = strlen(stops[i]);
        if (k == 0 || k > len) continue;
        /* Occurrences ending after `from` start at or after from - k + 1. */
        size_t start = from >= k ? from - k + 1 : 0;
        for (size_t p = start; p + k <= len; p++) {
            if (best >= 0 && p >= best_at) break;
            if (memcmp(text + p, stops[i], k) == 0) {
                best = (int)i;
                best_at = p;
                break;
            }
        }
    }
    if (best >= 0 && at) *at = best_at;
    return best;
}

size_t krt_sampler_stop_holdback(const char *const *stops, size_t n_stops, const char *text,
                                 size_t len)
{
    size_t hold = 0;
    for (size_t i = 0; i < n_stops; i++) {
        size_t k = strlen(stops[i]);
        /* Longest proper prefix of stops[i] that text ends with. */
        for (size_t m = (k > 0 ? k - 1 : 0); m > hold; m--) {
            if (m > len) continue;
            if (memcmp(text + len - m, stops[i], m) == 0) {
                hold = m;
                break;
            }
        }
    }
    return hold;
}
