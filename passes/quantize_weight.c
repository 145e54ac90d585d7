/* quantize_weight.c — codes, scales and zero points of a quantized weight (passes/quantize_weight.h). */
#include "passes/quantize_weight.h"

#include <math.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

/* A scale as stored (its dtype's rounding), and read back. */
static float round_scale(kir_dtype t, float s)
{
    switch (t) {
    case KIR_F16: return ks_f16_to_f32(ks_f32_to_f16(s));
    case KIR_BF16: return ks_bf16_to_f32(ks_f32_to_bf16(s));
    default: return s;
    }
}

static void store_scale(kir_dtype t, void *scale, int64_t i, float s)
{
    if (t == KIR_F32) {
        memcpy((uint8_t *)scale + 4 * i, &s, 4);
        return;
    }
    uint16_t h = t == KIR_F16 ? ks_f32_to_f16(s) : ks_f32_to_bf16(s);
    memcpy((uint8_t *)scale + 2 * i, &h, 2);
}

static void put_code(const kir_quant_layout *q, uint8_t *codes, int64_t at, int c)
{
    if (q->codes != KIR_U4) {
        codes[at] = (uint8_t)c;
        return;
    }
    uint8_t *b = &codes[at / 2];
    *b = at % 2 ? (uint8_t)((*b & 15) | (c << 4)) : (uint8_t)((*b & 0xf0) | c);
}

/* A block's codes for range [lo, hi] (asym) or [-amax, amax] (sym): its scale, as stored, and zero;
 * f8e4m3: amax / 448 (e4m3's rounding is relative: its codes take no range). */
typedef struct int_grid {
    float s;        /* scale, rounded to the scale's dtype */
    float inv;      /* 1 / s (0 when s is 0) */
    int zero;       /* zero point (asym), else 0 */
    int cmin, cmax; /* the codes' range before the midpoint */
} int_grid;

static int_grid grid_for(const kir_quant_layout *q, float lo, float hi)
{
    const int bits = kir_dtype_bits(q->codes);
    int_grid g = {0};
    if (q->codes == KIR_F8E4M3) {
        g.s = round_scale(q->scale, (-lo > hi ? -lo : hi) / 448.0f);
    } else if (q->asym) {
        g.cmax = (1 << bits) - 1;
        g.s = round_scale(q->scale, (hi - lo) / (float)g.cmax);
        if (g.s > 0) {
            float z = rintf(-lo / g.s);
            g.zero = z < 0 ? 0 : z > (float)g.cmax ? g.cmax : (int)z;
        }
    } else {
        g.cmax = (1 << (bits - 1)) - 1;
        g.cmin = -g.cmax;
        g.s = round_scale(q->scale, (-lo > hi ? -lo : hi) / (float)g.cmax);
    }
    g.inv = g.s > 0 ? 1.0f / g.s : 0.0f;
    return g;
}

/* x rounded to the nearest integer, ties to even, for |x| < 2^22 (the codes' range and a bit): rintf
 * in the default rounding mode, without a call (x86-64's baseline has no roundss) */
static inline float round_code(float x) { return (x + 12582912.0f) - 12582912.0f; }

static int code_of(const int_grid *g, float x)
{
    float v = round_code(x * g->inv) + (float)g->zero;
    return v < (float)g->cmin ? g->cmin : v > (float)g->cmax ? g->cmax : (int)v;
}

/* x's code on grid g as stored (put_code's: an integer code plus the midpoint where there are no zero
 * points; an e4m3 byte), and in *got the value it stands for. */
static int code_at(const kir_quant_layout *q, const int_grid *g, float x, double *got)
{
    if (q->codes == KIR_F8E4M3) {
        const uint8_t e = g->s > 0 ? ks_f32_to_e4m3(x / g->s) : 0;
        *got = (double)ks_e4m3_to_f32(e) * g->s;
        return e;
    }
    const int c = code_of(g, x);
    *got = (double)(c - g->zero) * g->s;
    return c + (q->asym || q->codes == KIR_I8 ? 0 : 1 << (kir_dtype_bits(q->codes) - 1));
}

/* The squared error of a block's codes on grid g, each column's weighted by importance (NULL: 1). */
static double block_error(const kir_quant_layout *q, const float *w, int64_t r0, int64_t c0, const int_grid *g,
                          const float *importance)
{
    /* code_of's arithmetic in floats, eight partial sums a row in blocks of 8 columns (so that it
     * vectorizes; a group is a multiple of 8 or the tail goes one by one) */
    const float s = g->s, inv = g->inv, z = (float)g->zero, lo = (float)g->cmin, hi = (float)g->cmax;
    double e = 0;
    for (int64_t r = r0; r < r0 + q->block_rows; r++) {
        const float *x = w + r * q->cols + c0;
        const float *imp = importance ? importance + c0 : NULL;
        float acc[8] = {0};
        int64_t c = 0;
        for (; c + 8 <= q->group; c += 8)
            for (int l = 0; l < 8; l++) {
                float v = round_code(x[c + l] * inv) + z;
                v = v < lo ? lo : v > hi ? hi : v;
                const float d = x[c + l] - (v - z) * s;
                acc[l] += d * d * (imp ? imp[c + l] : 1.0f);
            }
        for (int l = 0; c < q->group; c++, l++) {
            float v = round_code(x[c] * inv) + z;
            v = v < lo ? lo : v > hi ? hi : v;
            const float d = x[c] - (v - z) * s;
            acc[l] += d * d * (imp ? imp[c] : 1.0f);
        }
        e += (double)(((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])));
    }
    return e;
}

/* Clipping tried for integer codes: the range shrunk by 1 - k/100, k = 0 .. KP_CLIP_STEPS - 1. */
enum { KP_CLIP_STEPS = 40 };

/* The grid of one block, rows [r0, r0 + block_rows) and columns [c0, c0 + group) of w (each value times
 * smooth[c], NULL: 1): its range, or for integer codes a clipped one where that gives a smaller
 * (importance-weighted) squared error (clip: the search, else the range alone). */
static int_grid block_grid(const kir_quant_layout *q, const float *w, const float *smooth, int64_t r0, int64_t c0,
                           const float *importance, int clip)
{
    float lo = 0, hi = 0;
    for (int64_t r = r0; r < r0 + q->block_rows; r++)
        for (int64_t c = c0; c < c0 + q->group; c++) {
            const float x = w[r * q->cols + c] * (smooth ? smooth[c] : 1.0f);
            lo = x < lo ? x : lo;
            hi = x > hi ? x : hi;
        }
    int_grid best = grid_for(q, lo, hi);
    if (q->codes == KIR_F8E4M3 || !clip) return best;
    double best_e = block_error(q, w, r0, c0, &best, importance);
    for (int k = 1; k < KP_CLIP_STEPS && best_e > 0; k++) {
        const float f = 1.0f - (float)k / 100.0f;
        int_grid g = grid_for(q, lo * f, hi * f);
        double e = block_error(q, w, r0, c0, &g, importance);
        if (e < best_e) best = g, best_e = e;
    }
    return best;
}

/* The codes of one block: rows [r0, r0 + block_rows), columns [c0, c0 + group). */
static void quantize_block(const kir_quant_layout *q, const float *w, int64_t r0, int64_t c0, const float *importance,
                           uint8_t *codes, float *s_out, int *z_out)
{
    const int_grid best = block_grid(q, w, NULL, r0, c0, importance, 1);
    double got;
    for (int64_t r = r0; r < r0 + q->block_rows; r++)
        for (int64_t c = c0; c < c0 + q->group; c++)
            put_code(q, codes, r * q->cols + c, code_at(q, &best, w[r * q->cols + c], &got));
    *s_out = best.s;
    *z_out = best.zero;
}

/* ---- rows over threads ---------------------------------------------------------------------
 * Blocks of rows are independent: the quantizers hand them out to threads, each its own rows (u4
 * rows are whole bytes: K is even), so the result does not depend on the thread count. */
typedef struct row_job {
    void (*run)(const struct row_job *j, int64_t r0, int64_t r1); /* rows [r0, r1) of the job */
    int64_t n;            /* row blocks in all */
    int64_t next;         /* the next block to hand out (under lock) */
    pthread_mutex_t lock; /* guards next */
    const kir_quant_layout *q;
    const float *w, *importance;
    const double *u;      /* GPTQ: the inverse gram's factor, in perm's order */
    const int64_t *perm;  /* GPTQ: the columns in the order they are quantized (act order) */
    uint8_t *codes;
    void *scale, *zero;
    const float *smooth;  /* kp_scaled_rtn_error: the columns' factors */
    double *block_error;  /* kp_scaled_rtn_error: each row block's error */
} row_job;

enum { ROWS_A_TAKE = 16, MAX_QUANT_THREADS = 64 };

static void *row_worker(void *p)
{
    row_job *j = p;
    for (;;) {
        pthread_mutex_lock(&j->lock);
        int64_t r0 = j->next;
        j->next += ROWS_A_TAKE;
        pthread_mutex_unlock(&j->lock);
        if (r0 >= j->n) return NULL;
        j->run(j, r0, r0 + ROWS_A_TAKE < j->n ? r0 + ROWS_A_TAKE : j->n);
    }
}

static void run_rows(row_job *j)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = cpus < 1 ? 1 : cpus > MAX_QUANT_THREADS ? MAX_QUANT_THREADS : (int)cpus;
    if (j->n < 2 * ROWS_A_TAKE) nt = 1;
    pthread_mutex_init(&j->lock, NULL);
    j->next = 0;
    pthread_t tid[MAX_QUANT_THREADS];
    int started[MAX_QUANT_THREADS] = {0};
    for (int i = 1; i < nt; i++) started[i] = pthread_create(&tid[i], NULL, row_worker, j) == 0;
    row_worker(j);
    for (int i = 1; i < nt; i++)
        if (started[i]) pthread_join(tid[i], NULL);
    pthread_mutex_destroy(&j->lock);
}

static void rtn_rows(const row_job *j, int64_t br0, int64_t br1)
{
    const kir_quant_layout *q = j->q;
    const int64_t bc = q->cols / q->group;
    for (int64_t br = br0; br < br1; br++)
        for (int64_t b = 0; b < bc; b++) {
            float s;
            int z;
            quantize_block(q, j->w, br * q->block_rows, b * q->group, j->importance, j->codes, &s, &z);
            if (j->scale) store_scale(q->scale, j->scale, br * bc + b, s);
            if (j->zero && q->asym) ((uint8_t *)j->zero)[br * bc + b] = (uint8_t)z;
        }
}

void kp_quantize_matrix(const kir_quant_layout *q, const float *w, const float *importance, void *codes, void *scale,
                        void *zero)
{
    KS_ASSERT(q->rows % q->block_rows == 0 && q->cols % q->group == 0);
    uint8_t *tmp = codes ? NULL : ks_xmalloc(kir_quant_codes_bytes(q) ? kir_quant_codes_bytes(q) : 1);
    row_job j = {.run = rtn_rows, .n = q->rows / q->block_rows, .q = q, .w = w, .importance = importance,
                 .codes = codes ? codes : tmp, .scale = scale, .zero = zero};
    run_rows(&j);
    free(tmp);
}

/* A row block's error in kp_scaled_rtn_error. */
static void scaled_rows(const row_job *j, int64_t br0, int64_t br1)
{
    const kir_quant_layout *q = j->q;
    const int64_t bc = q->cols / q->group;
    const float *s = j->smooth, *imp = j->importance;
    for (int64_t br = br0; br < br1; br++) {
        double e = 0;
        for (int64_t b = 0; b < bc; b++) {
            const int64_t c0 = b * q->group;
            const int_grid g = block_grid(q, j->w, s, br * q->block_rows, c0, NULL, 0);
            for (int64_t r = br * q->block_rows; r < (br + 1) * q->block_rows; r++)
                for (int64_t c = c0; c < c0 + q->group; c++) {
                    const float w = j->w[r * q->cols + c];
                    double got;
                    code_at(q, &g, w * s[c], &got);
                    const double d = got / s[c] - w;
                    e += d * d * (imp ? imp[c] : 1.0f);
                }
        }
        j->block_error[br] = e;
    }
}

double kp_scaled_rtn_error(const kir_quant_layout *q, const float *w, const float *s, const float *importance)
{
    KS_ASSERT(q->rows % q->block_rows == 0 && q->cols % q->group == 0);
    const int64_t n = q->rows / q->block_rows;
    double *errors = ks_xcalloc((size_t)(n ? n : 1), sizeof *errors);
    row_job j = {.run = scaled_rows, .n = n, .q = q, .w = w, .importance = importance, .smooth = s, .block_error = errors};
    run_rows(&j);
    double e = 0;
    for (int64_t i = 0; i < n; i++) e += errors[i];
    free(errors);
    return e;
}

/* ---- GPTQ --------------------------------------------------------------------------------- */

/* In-place Cholesky of the SPD matrix a [n,n] (lower triangle: a = L L^T); -1 when not positive definite. */
static int cholesky(double *a, int64_t n)
{
    for (int64_t j = 0; j < n; j++) {
        double s = a[j * n + j];
        for (int64_t k = 0; k < j; k++) s -= a[j * n + k] * a[j * n + k];
        if (!(s > 0)) return -1;
        a[j * n + j] = sqrt(s);
        for (int64_t i = j + 1; i < n; i++) {
            double t = a[i * n + j];
            for (int64_t k = 0; k < j; k++) t -= a[i * n + k] * a[j * n + k];
            a[i * n + j] = t / a[j * n + j];
        }
        for (int64_t i = 0; i < j; i++) a[i * n + j] = 0;
    }
    return 0;
}

/* u [k,k]: the upper Cholesky factor of the inverse of the damped gram (10% of its mean diagonal added) (inverse = u^T u); -1 when the
 * gram is not positive definite even damped. */
static int inverse_factor(const double *gram, int64_t k, double *u)
{
    double mean = 0;
    for (int64_t i = 0; i < k; i++) mean += gram[i * k + i];
    mean = mean > 0 ? mean / (double)k : 1;
    double *l = ks_xmalloc(sizeof(double) * (size_t)(k * k)), *inv = ks_xcalloc((size_t)(k * k), sizeof(double));
    memcpy(l, gram, sizeof(double) * (size_t)(k * k));
    for (int64_t i = 0; i < k; i++) l[i * k + i] = (l[i * k + i] > 0 ? l[i * k + i] : mean) + 0.1 * mean;
    int rc = cholesky(l, k);
    if (rc == 0) {
        /* inv = L^-T L^-1, column by column of L^-1 (forward substitution) */
        double *col = ks_xmalloc(sizeof(double) * (size_t)k);
        for (int64_t c = 0; c < k; c++) {
            for (int64_t i = 0; i < k; i++) {
                double t = i == c ? 1 : 0;
                for (int64_t j = c; j < i; j++) t -= l[i * k + j] * col[j];
                col[i] = i < c ? 0 : t / l[i * k + i];
            }
            /* inv[:, c] = L^-T col: back substitution */
            for (int64_t i = k - 1; i >= 0; i--) {
                double t = col[i];
                for (int64_t j = i + 1; j < k; j++) t -= l[j * k + i] * inv[j * k + c];
                inv[i * k + c] = t / l[i * k + i];
            }
        }
        free(col);
        rc = cholesky(inv, k); /* inv = L2 L2^T; u = L2^T */
        for (int64_t i = 0; rc == 0 && i < k; i++)
            for (int64_t j = 0; j < k; j++) u[i * k + j] = j >= i ? inv[j * k + i] : 0;
    }
    free(l);
    free(inv);
    return rc;
}

static void gptq_rows(const row_job *j, int64_t r0, int64_t r1)
{
    const kir_quant_layout *q = j->q;
    const int64_t k = q->cols, bc = q->cols / q->group;
    const double *u = j->u;
    const int64_t *perm = j->perm;
    uint8_t *out = j->codes;
    float *row = ks_xmalloc(sizeof(float) * (size_t)k);
    int_grid *grids = ks_xmalloc(sizeof *grids * (size_t)bc);
    for (int64_t r = r0; r < r1; r++) {
        memcpy(row, j->w + r * k, sizeof(float) * (size_t)k);
        /* each group's grid from the row as it is (static groups: the act order visits a group's columns
         * at different times): its range, clipped where that is better */
        for (int64_t b = 0; b < bc; b++) {
            const int_grid g = block_grid(q, row, NULL, 0, b * q->group, j->importance, 1);
            grids[b] = g;
            if (j->scale) store_scale(q->scale, j->scale, r * bc + b, g.s);
            if (j->zero && q->asym) ((uint8_t *)j->zero)[r * bc + b] = (uint8_t)g.zero;
        }
        for (int64_t i = 0; i < k; i++) {
            const int64_t col = perm[i];
            double got; /* the value the code stands for */
            put_code(q, out, r * k + col, code_at(q, &grids[col / q->group], row[col], &got));
            /* the rounding's error, spread over the columns still to come */
            double err = ((double)row[col] - got) / u[i * k + i];
            for (int64_t i2 = i + 1; i2 < k; i2++) row[perm[i2]] -= (float)(err * u[i * k + i2]);
        }
    }
    free(grids);
    free(row);
}

/* A column and its gram's diagonal, for GPTQ's act order: largest first (ties: lower index). */
typedef struct diag_col {
    double d;
    int64_t col;
} diag_col;
static int by_diag(const void *a, const void *b)
{
    const diag_col *x = a, *y = b;
    return x->d > y->d ? -1 : x->d < y->d ? 1 : (x->col > y->col) - (x->col < y->col);
}

int kp_quantize_gptq(const kir_quant_layout *q, const float *w_in, const double *gram, void *codes, void *scale,
                     void *zero)
{
    if (q->block_rows != 1) return -1;
    const int64_t k = q->cols, n = q->rows;
    /* act order: the columns whose inputs are largest first, while the most columns are left to take their errors */
    int64_t *perm = ks_xmalloc(sizeof *perm * (size_t)k);
    diag_col *diag = ks_xmalloc(sizeof *diag * (size_t)k);
    double *gp = ks_xmalloc(sizeof(double) * (size_t)(k * k));
    for (int64_t i = 0; i < k; i++) diag[i] = (diag_col){gram[i * k + i], i};
    qsort(diag, (size_t)k, sizeof *diag, by_diag);
    for (int64_t i = 0; i < k; i++) perm[i] = diag[i].col;
    for (int64_t i = 0; i < k; i++)
        for (int64_t c = 0; c < k; c++) gp[i * k + c] = gram[perm[i] * k + perm[c]];
    double *u = ks_xmalloc(sizeof(double) * (size_t)(k * k));
    int rc = inverse_factor(gp, k, u);
    free(gp);
    free(diag);
    if (rc != 0) {
        free(u);
        free(perm);
        return -1;
    }
    float *imp = ks_xmalloc(sizeof *imp * (size_t)k);
    for (int64_t i = 0; i < k; i++) imp[i] = (float)gram[i * k + i];
    row_job j = {.run = gptq_rows, .n = n, .q = q, .w = w_in, .u = u, .perm = perm, .importance = imp,
                 .codes = codes ? codes : NULL, .scale = scale, .zero = zero};
    uint8_t *own = codes ? NULL : ks_xmalloc(kir_quant_codes_bytes(q) ? kir_quant_codes_bytes(q) : 1);
    if (own) j.codes = own;
    run_rows(&j);
    free(own);
    free(u);
    free(perm);
    free(imp);
    return 0;
}
