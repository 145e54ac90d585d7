/*
 * test_sampler.c — next-token sampling (runtime/text/sampler.c): one seed gives
 * one sequence; greedy; top-k keeps exactly k; top-p on a known
 * distribution; temperature measured on draws from a known distribution;
 * repetition penalty; stop ids and stop strings; the exact messages for
 * bad settings.
 */
#include "runtime/text/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/check.h"

static krt_sampler *make(krt_sampler_config cfg, int32_t vocab)
{
    ks_diag d = {0};
    krt_sampler *s = krt_sampler_new(&d, &cfg, vocab);
    CHECK(s != NULL);
    return s;
}

/* Logits whose softmax is p. */
static void logits_of(const double *p, int n, float *out)
{
    for (int i = 0; i < n; i++) out[i] = (float)log(p[i]);
}

/* Deterministic pseudo-random logits (independent of the sampler's generator). */
static void fill_logits(float *l, int n, uint32_t seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        l[i] = (float)((seed >> 8) % 2000) / 200.0f - 5.0f;
    }
}

static void test_seed_determinism(void)
{
    enum { V = 1000, N = 500 };
    float *l = malloc(V * sizeof *l);
    int32_t a[N], b[N], c[N];
    krt_sampler_config cfg = krt_sampler_defaults();
    cfg.temperature = 0.9f;
    cfg.top_k = 50;
    cfg.top_p = 0.95f;
    cfg.repetition_penalty = 1.1f;
    cfg.seed = 1234;
    int32_t *runs[3] = {a, b, c};
    for (int r = 0; r < 3; r++) {
        cfg.seed = r < 2 ? 1234 : 99;
        krt_sampler *s = make(cfg, V);
        if (!s) return;
        for (int i = 0; i < N; i++) {
            fill_logits(l, V, (uint32_t)i);
            runs[r][i] = krt_sampler_sample(s, l);
        }
        krt_sampler_free(s);
    }
    CHECK(memcmp(a, b, sizeof a) == 0);  /* same seed, same tokens */
    CHECK(memcmp(a, c, sizeof a) != 0);  /* another seed, other tokens */
    /* reset restarts the generator and forgets the seen ids */
    krt_sampler *s = make(cfg, V);
    cfg.seed = 1234;
    krt_sampler_reset(s, 1234);
    for (int i = 0; i < N; i++) {
        fill_logits(l, V, (uint32_t)i);
        c[i] = krt_sampler_sample(s, l);
    }
    CHECK(memcmp(a, c, sizeof a) == 0);
    krt_sampler_free(s);
    /* The generator's own sequence is pinned, so it cannot drift by platform. */
    cfg = krt_sampler_defaults();
    cfg.seed = 42;
    s = make(cfg, 4);
    double u0 = krt_sampler_uniform(s), u1 = krt_sampler_uniform(s);
    CHECK(u0 >= 0 && u0 < 1 && u1 >= 0 && u1 < 1 && u0 != u1);
    krt_sampler_reset(s, 42);
    CHECK(krt_sampler_uniform(s) == u0);
    krt_sampler_free(s);
    free(l);
}

static void test_greedy(void)
{
    krt_sampler_config cfg = krt_sampler_defaults();
    cfg.temperature = 0;
    krt_sampler *s = make(cfg, 5);
    float l[5] = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f};
    CHECK(krt_sampler_sample(s, l) == 1); /* the lower id among equal maxima */
    float nan_first[5] = {NAN, -INFINITY, 1.0f, 0.5f, NAN};
    CHECK(krt_sampler_sample(s, nan_first) == 2);
    float none[3] = {-INFINITY, NAN, -INFINITY};
    krt_sampler_free(s);
    s = make(cfg, 3);
    CHECK(krt_sampler_sample(s, none) == -1);
    krt_sampler_free(s);
}

static void test_top_k(void)
{
    krt_sampler_config cfg = krt_sampler_defaults();
    cfg.top_k = 3;
    krt_sampler *s = make(cfg, 8);
    /* ids 1, 4, 6 tie at 2.0 with id 7 at 5.0: exactly 3 stay, the lower ids. */
    float l[8] = {0.0f, 2.0f, -1.0f, 1.0f, 2.0f, 0.5f, 2.0f, 5.0f};
    int32_t ids[8];
    double p[8];
    size_t n = krt_sampler_candidates(s, l, ids, p);
    CHECK(n == 3);
    CHECK(ids[0] == 7 && ids[1] == 1 && ids[2] == 4);
    double z = exp(5.0) + 2 * exp(2.0);
    CHECK_NEAR(p[0], exp(5.0) / z, 1e-9);
    CHECK_NEAR(p[1], exp(2.0) / z, 1e-9);
    /* Draws never leave the k. */
    int other = 0;
    for (int i = 0; i < 2000; i++) {
        int32_t id = krt_sampler_sample(s, l);
        other += id != 7 && id != 1 && id != 4;
    }
    CHECK(other == 0);
    krt_sampler_free(s);
    /* k at least the vocabulary: everything stays */
    cfg.top_k = 100;
    s = make(cfg, 8);
    CHECK(krt_sampler_candidates(s, l, ids, p) == 8);
    krt_sampler_free(s);
}

static void test_top_p(void)
{
    const double dist[5] = {0.05, 0.5, 0.1, 0.2, 0.15};
    float l[5];
    logits_of(dist, 5, l);
    int32_t ids[5];
    double p[5];
    krt_sampler_config cfg = krt_sampler_defaults();
    /* Sorted: 0.5 (id 1), 0.2 (3), 0.15 (4), 0.1 (2), 0.05 (0). An id stays while
     * the probability before it is below top_p. */
    struct {
        float top_p;
        size_t n;
    } cases[] = {{0.5f, 1}, {0.6f, 2}, {0.7f, 2}, {0.71f, 3}, {0.9f, 4}, {0.96f, 5}, {1.0f, 5}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        cfg.top_p = cases[c].top_p;
        krt_sampler *s = make(cfg, 5);
        size_t n = krt_sampler_candidates(s, l, ids, p);
        CHECK_MSG(n == cases[c].n, "top_p %g keeps %zu, want %zu", (double)cases[c].top_p, n, cases[c].n);
        krt_sampler_free(s);
    }
    cfg.top_p = 0.7f;
    krt_sampler *s = make(cfg, 5);
    size_t n = krt_sampler_candidates(s, l, ids, p);
    CHECK(n == 2 && ids[0] == 1 && ids[1] == 3);
    CHECK_NEAR(p[0], 0.5 / 0.7, 1e-6);
    CHECK_NEAR(p[1], 0.2 / 0.7, 1e-6);
    /* Draw frequencies follow the renormalised nucleus. */
    int count[5] = {0};
    for (int i = 0; i < 20000; i++) count[krt_sampler_sample(s, l)]++;
    CHECK(count[0] == 0 && count[2] == 0 && count[4] == 0);
    CHECK_NEAR(count[1] / 20000.0, 0.5 / 0.7, 0.015);
    krt_sampler_free(s);
}

static void test_temperature(void)
{
    const double dist[3] = {0.5, 0.3, 0.2};
    float l[3];
    logits_of(dist, 3, l);
    const float temps[] = {1.0f, 0.5f, 2.0f};
    for (int t = 0; t < 3; t++) {
        krt_sampler_config cfg = krt_sampler_defaults();
        cfg.temperature = temps[t];
        cfg.seed = 7;
        krt_sampler *s = make(cfg, 3);
        enum { DRAWS = 60000 };
        int count[3] = {0};
        for (int i = 0; i < DRAWS; i++) count[krt_sampler_sample(s, l)]++;
        /* p^(1/T), renormalised */
        double want[3], z = 0;
        for (int i = 0; i < 3; i++) z += want[i] = pow(dist[i], 1.0 / temps[t]);
        for (int i = 0; i < 3; i++) {
            double f = (double)count[i] / DRAWS, w = want[i] / z;
            /* 5 standard deviations of a binomial frequency */
            double tol = 5 * sqrt(w * (1 - w) / DRAWS);
            CHECK_MSG(fabs(f - w) <= tol, "temperature %g: id %d drawn %.4f of the time, want %.4f (+-%.4f)",
                      (double)temps[t], i, f, w, tol);
        }
        krt_sampler_free(s);
    }
}

static void test_repetition_penalty(void)
{
    krt_sampler_config cfg = krt_sampler_defaults();
    cfg.temperature = 0;
    cfg.repetition_penalty = 2.0f;
    krt_sampler *s = make(cfg, 4);
    float l[4] = {1.0f, 0.9f, -3.0f, -0.2f};
    CHECK(krt_sampler_sample(s, l) == 0); /* also marks 0 as seen */
    /* 0 is now seen: 1.0 / 2 = 0.5 < 0.9 */
    CHECK(krt_sampler_sample(s, l) == 1);
    /* both seen: 0.5 and 0.45; negative logits are multiplied, so a seen -0.2 becomes -0.4 */
    krt_sampler_accept(s, 3);
    int32_t ids[4];
    double p[4];
    krt_sampler_config soft = cfg;
    soft.temperature = 1.0f;
    krt_sampler *t = make(soft, 4);
    krt_sampler_accept(t, 0);
    krt_sampler_accept(t, 1);
    krt_sampler_accept(t, 3);
    size_t n = krt_sampler_candidates(t, l, ids, p);
    CHECK(n == 4 && ids[0] == 0 && ids[1] == 1 && ids[2] == 3 && ids[3] == 2);
    double z = exp(0.5) + exp(0.45) + exp(-0.4) + exp(-3.0);
    CHECK_NEAR(p[0], exp(0.5) / z, 1e-6);
    CHECK_NEAR(p[2], exp(-0.4) / z, 1e-6);
    CHECK_NEAR(p[3], exp(-3.0) / z, 1e-6);
    krt_sampler_free(t);
    /* reset forgets */
    krt_sampler_reset(s, 0);
    CHECK(krt_sampler_sample(s, l) == 0);
    krt_sampler_free(s);
}

static void test_stop(void)
{
    const char *stops[] = {"\n\nUser:", "END", ""};
    const char *text = "The answer is 4.\n\nUser: and";
    size_t at = 99;
    CHECK(krt_sampler_ends_with_stop(stops, 3, "the END", 7) == 1);
    CHECK(krt_sampler_ends_with_stop(stops, 3, "the EN", 6) == -1);
    CHECK(krt_sampler_ends_with_stop(stops, 3, "", 0) == -1);
    CHECK(krt_sampler_stop_find(stops, 3, text, strlen(text), 17, &at) == 0 && at == 16);
    /* Already checked up to byte 26: the stop string ended before, not found again. */
    CHECK(krt_sampler_stop_find(stops, 3, text, strlen(text), 26, &at) == -1);
    /* The earliest occurrence wins. */
    CHECK(krt_sampler_stop_find(stops, 3, "xEND\n\nUser:END", 13, 0, &at) == 1 && at == 1);
    /* Hold back what may be the start of a stop string. */
    CHECK(krt_sampler_stop_holdback(stops, 3, "answer\n\nUs", 10) == 4);
    CHECK(krt_sampler_stop_holdback(stops, 3, "answer E", 8) == 1);
    CHECK(krt_sampler_stop_holdback(stops, 3, "answer", 6) == 0);
    CHECK(krt_sampler_stop_holdback(stops, 3, "EN", 2) == 2);
}

static void check_config_error(krt_sampler_config cfg, int32_t vocab, const char *want)
{
    ks_buf log = {0};
    ks_diag d = {0};
    d.log = &log;
    d.quiet = 1;
    krt_sampler *s = krt_sampler_new(&d, &cfg, vocab);
    CHECK(s == NULL);
    CHECK(d.errors == 1);
    CHECK_STR(ks_buf_cstr(&log), want);
    krt_sampler_free(s);
    ks_buf_free(&log);
}

static void test_config_errors(void)
{
    krt_sampler_config c = krt_sampler_defaults();
    check_config_error(c, 0, "sampler: error: vocabulary size must be > 0 (got 0)\n");
    c.temperature = -1;
    check_config_error(c, 10, "sampler: error: temperature must be >= 0 and finite (got -1)\n");
    c = krt_sampler_defaults();
    c.top_k = -2;
    check_config_error(c, 10, "sampler: error: top_k must be >= 0 (got -2)\n");
    c = krt_sampler_defaults();
    c.top_p = 1.5f;
    check_config_error(c, 10, "sampler: error: top_p must be in [0, 1] (got 1.5)\n");
    c = krt_sampler_defaults();
    c.repetition_penalty = 0;
    check_config_error(c, 10, "sampler: error: repetition_penalty must be > 0 and finite (got 0)\n");
}

int main(void)
{
    test_seed_determinism();
    test_greedy();
    test_top_k();
    test_top_p();
    test_temperature();
    test_repetition_penalty();
    test_stop();
    test_config_errors();
    return check_finish("sampler");
}
