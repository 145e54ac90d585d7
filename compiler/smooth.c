/*
 * smooth.c — the smoothing vector of a quantized weight's input channels
 * (--calib; passes/quantize.c decides which weights, ir/ops.def's SMOOTH
 * words what the vector is). x w^T = (x / s)(w s)^T: the weight's columns
 * are multiplied by s before they are quantized, and the norm before the
 * matmul divides by s (its gain's derive="smooth"), so that
 *   awq          s_k = mean|x_k|^a, normalized to a geometric mean range of
 *                1 (s / sqrt(max s min s)); a in 0, 0.05, .. 0.95, the one
 *                whose round to nearest has the least error over the
 *                calibration's inputs (each column's weighted by its mean
 *                square: kp_scaled_rtn_error) — a = 0 is no smoothing, so
 *                the search never does worse than none by that measure
 *                (Lin et al., 2023: channels with large inputs get finer
 *                steps);
 *   smoothquant  s_k = max|x_k|^a / max_n|w_nk|^(1-a), a = 0.5 (Xiao et al.,
 *                2022: the inputs' outlier channels move into the weights,
 *                for w8a8, whose x is quantized a token at a time).
 * A channel that the calibration never saw nonzero keeps s = 1. Each vector
 * is computed once a build (kd_smooth, kd_model's), the first time the
 * gain or a part asks for it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/driver.h"
#include "passes/quantize_weight.h"

typedef struct smooth_entry {
    char *name; /* the quantized weight's name (its parts' without "#codes") */
    kir_word method;
    float *s; /* [K] */
} smooth_entry;

struct kd_smooth {
    smooth_entry *e;
    size_t n;
};

kd_smooth *kd_smooth_new(void) { return ks_xcalloc(1, sizeof(kd_smooth)); }

void kd_smooth_free(kd_smooth *c)
{
    if (!c) return;
    for (size_t i = 0; i < c->n; i++) free(c->e[i].name), free(c->e[i].s);
    free(c->e);
    free(c);
}

enum { AWQ_GRID = 20 };

static void awq_vector(const kir_quant_layout *q, const float *w, const kd_calib_input *in, float *s)
{
    const int64_t k = q->cols;
    float *imp = ks_xmalloc(sizeof *imp * (size_t)k), *t = ks_xmalloc(sizeof *t * (size_t)k);
    for (int64_t i = 0; i < k; i++) imp[i] = (float)in->gram[i * k + i];
    double best = INFINITY;
    for (int a = 0; a < AWQ_GRID; a++) {
        const double alpha = (double)a / AWQ_GRID;
        double lo = INFINITY, hi = 0;
        for (int64_t i = 0; i < k; i++) {
            t[i] = in->meanabs[i] > 0 ? (float)pow(in->meanabs[i], alpha) : 1.0f;
            lo = t[i] < lo ? t[i] : lo;
            hi = t[i] > hi ? t[i] : hi;
        }
        const double mid = sqrt(lo * hi);
        for (int64_t i = 0; i < k; i++) t[i] = (float)(t[i] / mid);
        const double e = kp_scaled_rtn_error(q, w, t, imp);
        if (e < best) {
            best = e;
            memcpy(s, t, sizeof *s * (size_t)k);
        }
    }
    free(imp);
    free(t);
}

static void smoothquant_vector(const kir_quant_layout *q, const float *w, const kd_calib_input *in, float *s)
{
    const double alpha = 0.5;
    for (int64_t c = 0; c < q->cols; c++) {
        float wmax = 0;
        for (int64_t r = 0; r < q->rows; r++) wmax = fabsf(w[r * q->cols + c]) > wmax ? fabsf(w[r * q->cols + c]) : wmax;
        const float xmax = in->absmax[c];
        s[c] = xmax > 0 && wmax > 0 ? (float)(pow((double)xmax, alpha) / pow((double)wmax, 1 - alpha)) : 1.0f;
    }
}

const float *kd_smooth_vector(const kd_model *m, const char *name, kir_word method, const kir_quant_layout *q,
                              const float *w, const char *source)
{
    kd_smooth *c = m->smooth;
    for (size_t i = 0; i < c->n; i++)
        if (c->e[i].method == method && strcmp(c->e[i].name, name) == 0) return c->e[i].s;
    kd_calib_input in;
    if (kd_calib_input_of(m, source, &in) != 0 || in.k != q->cols) return NULL;
    float *s = ks_xmalloc(sizeof *s * (size_t)q->cols);
    if (method == KIR_SMOOTH_AWQ)
        awq_vector(q, w, &in, s);
    else
        smoothquant_vector(q, w, &in, s);
    c->e = ks_xrealloc(c->e, sizeof *c->e * (c->n + 1));
    c->e[c->n++] = (smooth_entry){ks_xstrdup(name), method, s};
    return s;
}
