/*
 * cuda_mm_check.c — the matmul's prefill path (kcu_matmul_large: tensor cores,
 * codegen/cuda/kcu_prelude.cuh) on kernels written for it, against a
 * double-precision reference: awkward shapes (T = 9, 64, 100: partial tiles;
 * odd N; K not a multiple of 32; weight rows not 16-byte aligned; x not
 * 16-byte aligned), bf16, f16 and f32 weights, x over a wide range, a norm
 * prologue (kcu_pro_rms) and an epilogue that permutes the columns. Every
 * output within 1e-6 of the exact sum, relative to sum_k |x_k w_k| (x as
 * three bf16 parts is exact; the tensor cores sum in about f32 precision),
 * and two runs bitwise equal. And the decode path (kcu_matmul_small, T <= 8)
 * bitwise equal to a model of its order (decode_reference: lane l's chunks
 * l, l + 32, ... in order, fmaf, the butterfly; the norm's statistics in
 * double in kcu_row_stats's order): f32 or half x and norm values, 2 and 4
 * columns a warp, ragged K, slabs of staged x, columns past N.
 *
 *   cuda_mm_check          through the CPU emulator: the kernels compiled by
 *       $KILN_GXX with $KILN_EMU_SHIM and run behind $KILN_EMU_LIB (its mma
 *       follows the PTX fragment layout element by element, so a kernel
 *       that fills fragments wrongly fails here); and, with NVRTC, the same
 *       source compiled for sm_80 (its compile time printed; the models'
 *       cuda_build tests compile the path for sm_80 and sm_90 too; not in a
 *       sanitizer build, whose source is the plain build's). Exits 77 when it
 *       can do neither.
 *   cuda_mm_check --gpu [CUBIN]    on a real GPU (libcuda.so.1; the kernels
 *       compiled by NVRTC for its architecture, or CUBIN): the same checks,
 *       then Llama-3-8B's 128-token prefill matmuls timed on the tensor-core
 *       path against the CUDA-core one (kcu_matmul_fma), two x parts instead
 *       of three, and loads one k block ahead instead of two, with their
 *       errors on sampled outputs, and the 8B model's total; then its decode
 *       matmuls at T = 1 and 8 (bf16 weights and x, the norm fused where the
 *       model has it, kcu_plan_gemv's R and the other), in us and as a share
 *       of the weights' bytes at 4.2 TB/s, the weights rotated through copies
 *       bigger than L2, and the 8B model's total per token.
 *   cuda_mm_check --compile ARCH CUBIN    writes the --gpu kernels' cubin
 *       (NVRTC here, so that the GPU machine need not compile).
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "codegen/cuda/kcu.h"
#include "runtime/cuda/cuda_api.h"
#include "tests/check.h"

/* ---- the cases ------------------------------------------------------------------------ */
typedef enum { W_BF16, W_F16, W_F32 } wtype;
typedef enum {
    PATH_MATMUL, /* kcu_matmul_large: what kiln's prefill kernels call */
    PATH_FMA,    /* kcu_matmul_fma: the CUDA-core tiles */
    PATH_MMA,    /* kcu_matmul_mma in the case's configuration */
    PATH_DECODE, /* kcu_matmul_small, rows columns a warp: checked bitwise against decode_reference */
    PATH_TC      /* kcu_matmul_tc, rows tiles of 16 columns a block: within 1e-6, each token bitwise as alone */
} mm_path;

typedef struct mm_case {
    wtype w;      /* weight dtype */
    int T, K, N;  /* tokens, inputs, outputs */
    int rms;      /* 1: x through kcu_pro_rms with a [K] weight of dtype w */
    int rev;      /* 1: the epilogue's column c is weight row N-1-c */
    int x_off;    /* x starts this many floats into its buffer (1: not 16-byte aligned) */
    mm_path path; /* which implementation */
    int bk, pf;   /* PATH_MMA: k block (32, 64), blocks loaded ahead (1, 2) */
    int lb2;      /* 1: the kernel declares __launch_bounds__(256, 2) (at most 128 registers) */
    int rows;     /* PATH_DECODE: columns a warp (kcu_matmul_small's R) */
    int xh;       /* 1: x, and the norm's values, of the weights' half dtype (fast precision) */
} mm_case;

static const char *const w_name[] = {"kcu_bf16", "kcu_f16", "float"};
static const char *const w_short[] = {"bf16", "f16", "f32"};
static const size_t w_size[] = {2, 2, 4};

/* Checked through the emulator and on a GPU. */
static const mm_case check_cases[] = {
    {W_BF16, 9, 72, 67, 0, 0, 0, PATH_MATMUL, 0, 0, 0, 0, 0},   /* one partial row tile, K % 32 = 8, N odd */
    {W_BF16, 64, 256, 128, 1, 1, 0, PATH_MATMUL, 0, 0, 0, 0, 0}, /* a full tile, rms prologue, permuted columns */
    {W_BF16, 100, 75, 33, 0, 0, 0, PATH_MATMUL, 0, 0, 0, 0, 0}, /* odd K: scalar weight and x loads */
    {W_BF16, 33, 64, 64, 0, 1, 1, PATH_MATMUL, 0, 0, 0, 0, 0},  /* x not 16-byte aligned */
    {W_F16, 100, 96, 130, 1, 0, 0, PATH_MATMUL, 0, 0, 0, 0, 0},  /* f16: weights as two bf16 parts */
    {W_F16, 20, 40, 9, 0, 1, 0, PATH_MATMUL, 0, 0, 0, 0, 0},
    {W_F32, 70, 64, 31, 1, 0, 0, PATH_MATMUL, 0, 0, 0, 0, 0},   /* f32: weights as three bf16 parts */
    /* the tensor-core path's other configurations */
    {W_BF16, 100, 200, 67, 1, 1, 0, PATH_MMA, 64, 1, 0, 0, 0},
    {W_BF16, 70, 136, 70, 0, 0, 1, PATH_MMA, 64, 2, 0, 0, 0},
    {W_F16, 9, 100, 40, 0, 1, 0, PATH_MMA, 32, 2, 0, 0, 0},
    {W_F32, 65, 96, 65, 1, 1, 0, PATH_MMA, 32, 1, 0, 0, 0},
    {W_F32, 20, 36, 19, 0, 0, 0, PATH_MATMUL, 0, 0, 0, 0, 0}, /* f32 rows 16-byte aligned, K % 8 = 4 */
    {W_BF16, 40, 128, 24, 1, 0, 0, PATH_FMA, 0, 0, 0, 0, 0}, /* the CUDA-core path (older GPUs) */
    /* the decode path: T = 1 and 2 .. 8 are two instances of its loop */
    {W_BF16, 1, 72, 67, 0, 0, 0, PATH_DECODE, 0, 0, 0, 2, 0},   /* K % 256 != 0: a ragged last step; N odd */
    {W_BF16, 3, 256, 128, 1, 1, 0, PATH_DECODE, 0, 0, 0, 4, 0}, /* rms (f32 values staged), permuted columns */
    {W_BF16, 8, 4096, 40, 1, 0, 0, PATH_DECODE, 0, 0, 0, 2, 1}, /* bf16 x: 8 x 4096 staged in two slabs */
    {W_BF16, 1, 4096, 40, 1, 1, 0, PATH_DECODE, 0, 0, 0, 4, 1}, /* bf16 x, T = 1: all of K staged */
    {W_BF16, 6, 2048, 33, 1, 0, 0, PATH_DECODE, 0, 0, 0, 2, 0}, /* f32 values: slabs of 3 steps, 4 steps */
    {W_BF16, 5, 520, 3, 0, 0, 0, PATH_DECODE, 0, 0, 0, 4, 1},   /* N < a warp's columns; ragged */
    {W_F16, 2, 100, 9, 1, 0, 0, PATH_DECODE, 0, 0, 0, 2, 1},    /* f16; rows not 16-byte aligned: VEC 1 */
    {W_F16, 7, 1000, 70, 1, 1, 0, PATH_DECODE, 0, 0, 0, 4, 1},
    {W_F32, 4, 36, 31, 1, 0, 0, PATH_DECODE, 0, 0, 0, 4, 0},    /* f32 weights: 4 a chunk */
    {W_F32, 1, 35, 17, 0, 1, 0, PATH_DECODE, 0, 0, 0, 2, 0},    /* f32, VEC 1 */
    /* the tensor-core decode path (half x): T = 1 .. 8 one token tile, 9 .. 32 four, then again */
    {W_BF16, 32, 4096, 40, 1, 0, 0, PATH_TC, 0, 0, 0, 1, 1},  /* four tiles; 16 chunks a warp; rms in the loop */
    {W_BF16, 5, 520, 67, 0, 1, 0, PATH_TC, 0, 0, 0, 2, 1},    /* 17 chunks: a warp's past K; N odd; J 2 */
    {W_F16, 40, 256, 33, 1, 1, 0, PATH_TC, 0, 0, 0, 2, 1},    /* two passes (32 + 8); rms staged for the 8 */
    {W_BF16, 9, 64, 16, 0, 0, 0, PATH_TC, 0, 0, 0, 1, 1},     /* 2 chunks: six warps sum nothing */
    {W_F16, 1, 1000, 70, 1, 0, 0, PATH_TC, 0, 0, 0, 3, 1},    /* T = 1, K % 32 = 8, rms staged; J 3 past N */
    {W_BF16, 3, 4096, 50, 1, 1, 0, PATH_TC, 0, 0, 0, 2, 1},   /* rms staged (3 x 4096 fit), J 2 */
    {W_BF16, 4, 4096, 33, 1, 0, 0, PATH_TC, 0, 0, 0, 1, 1},   /* rms in the loop (4 x 4096 do not fit) */
    /* 9-32 tokens with a norm and fewer than KCU_TC_WIDE_BLOCKS groups of 8 tiles: a tile at a time */
    {W_BF16, 20, 512, 300, 1, 1, 0, PATH_TC, 0, 0, 0, 3, 1},  /* 19 tiles on 7 blocks */
    {W_F16, 10, 128, 4100, 1, 0, 0, PATH_TC, 0, 0, 0, 16, 1}, /* 257 tiles on 17 blocks */
    {W_BF16, 17, 72, 24, 1, 0, 0, PATH_TC, 0, 0, 0, 1, 1},    /* 3 chunks: warps past K */
    /* ... and with as many groups: kcu_tc_wide, 8 tiles a block over the K slices in order, the weights
     * through the ring (their steps: one chunk of a lane's two rows) */
    {W_BF16, 20, 128, 16900, 1, 1, 0, PATH_TC, 0, 0, 0, 8, 1}, /* 1057 tiles: 133 groups on 133 blocks */
    {W_F16, 32, 264, 16900, 1, 0, 0, PATH_TC, 0, 0, 0, 9, 1},  /* 9 chunks: slices past K; 118 blocks, some two groups */
};

/* Llama-3-8B's matmuls (K, N), each timed for a 128-token prefill and for decode. */
typedef struct bench_shape {
    const char *what; /* the layer's matmul */
    int K, N;         /* its shape */
    int per_model;    /* how many the model has */
    int norm;         /* 1: a norm before it, fused as the decode kernel's prologue */
} bench_shape;
static const bench_shape llama8b[] = {
    {"q,k,v", 4096, 6144, 32, 1}, {"o", 4096, 4096, 32, 0}, {"gate,up", 4096, 28672, 32, 1},
    {"down", 14336, 4096, 32, 0}, {"lm_head", 4096, 128256, 1, 1},
};

/* ---- data ------------------------------------------------------------------------------ */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* uniform in [-1, 1) */
static double rng_unit(uint64_t *s) { return (double)(rng_next(s) >> 11) * 0x1p-52 - 1.0; }

/* n weights of type w, values about scale, stored as w stores them, into dst;
 * their exact values into val (NULL: not kept) */
static void fill_weights(wtype w, size_t n, double scale, uint64_t *s, void *dst, double *val)
{
    for (size_t i = 0; i < n; i++) {
        float f = (float)(rng_unit(s) * scale);
        if (w == W_BF16) {
            uint16_t h = ks_f32_to_bf16(f);
            memcpy((char *)dst + 2 * i, &h, 2);
            if (val) val[i] = ks_bf16_to_f32(h);
        } else if (w == W_F16) {
            uint16_t h = ks_f32_to_f16(f);
            memcpy((char *)dst + 2 * i, &h, 2);
            if (val) val[i] = ks_f16_to_f32(h);
        } else {
            memcpy((char *)dst + 4 * i, &f, 4);
            if (val) val[i] = f;
        }
    }
}

/* x over a wide range: mostly about 1, some 2^-20 .. 2^emax times that, a few zeros */
static void fill_x(size_t n, uint64_t *s, float *x, int wide, int emax)
{
    for (size_t i = 0; i < n; i++) {
        double v = rng_unit(s);
        uint64_t r = rng_next(s);
        if (wide && r % 8 == 0) v = ldexp(v, (int)(r >> 8) % (emax + 21) - 20);
        if (wide && r % 97 == 1) v = 0.0;
        x[i] = (float)v;
    }
}

/* ---- the kernels' source ------------------------------------------------------------------ */
/* The tensor-core decode path's plan, as an engine for sm_90 alone gets it (the ring's size: the
 * kernels' dynamic shared memory). */
enum { TC_OPTIN = 227 * 1024 };
static kcu_gemv_plan tc_plan(const mm_case *c)
{
    const kcu_options o = {.smem_optin = TC_OPTIN};
    return kcu_plan_gemv_tc(c->N, c->rms, &o);
}

static void kernel_source(const mm_case *c, int index, ks_buf *src)
{
    const char *wt = w_name[c->w];
    char epi[64], pro[128];
    snprintf(epi, sizeof epi, "%s<%d>{out}", c->rev ? "mmc_epi_rev" : "kcu_epi_store", c->N);
    if (c->rms)
        snprintf(pro, sizeof pro, "kcu_pro_rms<%d, %s%s%s>{g, 1e-5, nullptr, 0}", c->K, wt, c->xh ? ", " : "",
                 c->xh ? wt : "");
    else
        snprintf(pro, sizeof pro, "kcu_pro_none{}");
    char bounds[16] = ""; /* __launch_bounds__'s blocks an SM: the decode kernel's as kiln's, or lb2's */
    if (c->path == PATH_DECODE || c->path == PATH_TC || c->lb2)
        snprintf(bounds, sizeof bounds, ", %d",
                 c->path == PATH_DECODE ? kcu_plan_gemv(c->N).per_sm
                 : c->path == PATH_TC   ? tc_plan(c).per_sm
                                        : 2);
    ks_buf_printf(src,
                  "extern \"C\" __global__ void __launch_bounds__(KCU_MM_THREADS%s) mm_%d(int T, const %s "
                  "*__restrict__ x, const %s *__restrict__ w, const %s *__restrict__ g, float *__restrict__ out)\n"
                  "{\n    (void)g;\n",
                  bounds, index, c->xh ? wt : "float", wt, wt);
    int grid = (c->N + 15) / 16;
    if (c->path == PATH_DECODE)
        ks_buf_printf(src, "    kcu_matmul_small<%s, %d, %d, %d>(T, x, w, %s, %s);\n}\n", wt, c->K, c->N, c->rows, pro,
                      epi);
    else if (c->path == PATH_TC)
        ks_buf_printf(src, "    kcu_matmul_tc<%s, %d, %d, %d, %d>(T, x, w, %s, %s);\n}\n", wt, c->K, c->N, c->rows,
                      tc_plan(c).ring, pro, epi);
    else if (c->path == PATH_MATMUL)
        ks_buf_printf(src, "    kcu_matmul_large<%s, %d, %d>(T, x, w, %s, %s);\n}\n", wt, c->K, c->N, pro, epi);
    else if (c->path == PATH_FMA)
        ks_buf_printf(src, "    auto pro = %s;\n    kcu_matmul_fma<%s, %d, %d, %d>(T, x, w, pro, %s);\n}\n", pro, wt,
                      c->K, c->N, grid, epi);
    else
        ks_buf_printf(src, "    auto pro = %s;\n    kcu_matmul_mma<%s, %d, %d, %d, 3, %d, %d>(T, x, w, pro, %s);\n}\n",
                      pro, wt, c->K, c->N, grid, c->bk, c->pf, epi);
}

static void program_source(const mm_case *cases, int n, ks_buf *src)
{
    ks_buf_puts(src, kcu_prelude);
    ks_buf_puts(src, "\n/* column c is weight row N-1-c */\n"
                     "template <int N> struct mmc_epi_rev {\n"
                     "    float *__restrict__ out; /* [T, N] */\n"
                     "    static __device__ __forceinline__ int row(int c) { return N - 1 - c; }\n"
                     "    __device__ __forceinline__ void one(long long t, int n, float v) const { out[t * N + n] = v; "
                     "}\n"
                     "    __device__ __forceinline__ void two(long long t, int n0, float v0, int n1, float v1) const\n"
                     "    {\n        out[t * N + n0] = v0;\n        out[t * N + n1] = v1;\n    }\n};\n");
    for (int i = 0; i < n; i++) kernel_source(&cases[i], i, src);
}

/* ---- running ------------------------------------------------------------------------------- */
typedef struct runner {
    krt_cuda_api api; /* the driver, or the emulator */
    krt_cu_ctx ctx;   /* its primary context */
    krt_cu_mod mod;   /* the kernels */
    int gpu;          /* 1 on a real GPU */
} runner;

static int cu_ok(runner *r, krt_cu_result res, const char *what)
{
    if (res == 0) return 1;
    ks_buf b = {0};
    krt_cuda_describe(&r->api, res, &b);
    fprintf(stderr, "%s: %s\n", what, ks_buf_cstr(&b));
    ks_buf_free(&b);
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One case's buffers on the device and its exact operands on the host. */
typedef struct mm_data {
    krt_cu_ptr x, w, g, out; /* device buffers */
    double *xp;              /* [T, K] x after the prologue, exactly (NULL: sampled rows only) */
    double *wv;              /* [N, K] the weights' values (NULL for big shapes: wraw is read) */
    void *wraw;              /* [N, K] the weights as stored */
    float *xh;               /* [T, K] x as given (a half value's, with xh) */
    float *gf;               /* [K] the norm's weight's values */
} mm_data;

static double weight_at(const mm_case *c, const mm_data *d, size_t i)
{
    if (d->wv) return d->wv[i];
    uint16_t h;
    float f;
    if (c->w == W_F32) {
        memcpy(&f, (const char *)d->wraw + 4 * i, 4);
        return f;
    }
    memcpy(&h, (const char *)d->wraw + 2 * i, 2);
    return c->w == W_BF16 ? ks_bf16_to_f32(h) : ks_f16_to_f32(h);
}

/* The prologue's output for row t, exactly (rms in double, as kcu_pro_rms). */
static void prologue_row(const mm_case *c, const float *xrow, const double *g, double *y)
{
    double inv = 1.0;
    if (c->rms) {
        double s = 0.0;
        for (int k = 0; k < c->K; k++) s += (double)xrow[k] * xrow[k];
        inv = 1.0 / sqrt(s / c->K + 1e-5);
    }
    for (int k = 0; k < c->K; k++) y[k] = (double)xrow[k] * inv * (c->rms ? g[k] : 1.0);
}

/* The bits of f in the half dtype of weights w (bf16 or f16), rounded to nearest even; *back: their value. */
static uint16_t to_half(wtype w, float f, float *back)
{
    uint16_t h = w == W_BF16 ? ks_f32_to_bf16(f) : ks_f32_to_f16(f);
    *back = w == W_BF16 ? ks_bf16_to_f32(h) : ks_f16_to_f32(h);
    return h;
}

/* Upload a case's operands (seeded by seed); full: keep the exact weights */
static int setup(runner *r, const mm_case *c, uint64_t seed, int full, mm_data *d)
{
    memset(d, 0, sizeof *d);
    size_t nx = (size_t)c->T * c->K + (size_t)c->x_off, nw = (size_t)c->N * c->K, es = w_size[c->w];
    size_t xs = c->xh ? 2 : 4; /* bytes an x */
    uint64_t s = seed;
    d->xh = malloc(nx * sizeof(float));
    d->wraw = malloc(nw * es);
    d->gf = malloc((size_t)c->K * sizeof(float));
    void *graw = malloc((size_t)c->K * es), *xraw = malloc(nx * xs);
    double *gv = malloc((size_t)c->K * sizeof(double));
    if (full) d->wv = malloc(nw * sizeof(double));
    if (!d->xh || !d->wraw || !d->gf || !graw || !xraw || !gv || (full && !d->wv)) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
    /* wide x up to 2^20, or 2^14 for f16 x (finite: binary16 ends at 65504; measured before: 2^20
     * made f16 x infinite and the sums NaN, of whichever sign the order gave) */
    fill_x(nx, &s, d->xh, full, c->xh && c->w == W_F16 ? 14 : 20);
    for (size_t i = 0; i < nx; i++) {
        if (c->xh) {
            uint16_t h = to_half(c->w, d->xh[i], &d->xh[i]);
            memcpy((char *)xraw + 2 * i, &h, 2);
        } else {
            memcpy((char *)xraw + 4 * i, &d->xh[i], 4);
        }
    }
    fill_weights(c->w, nw, full ? 0.5 : 0.04, &s, d->wraw, d->wv);
    for (int k = 0; k < c->K; k++) { /* norm weights about 1 */
        float f = (float)(1.0 + 0.25 * rng_unit(&s));
        if (c->w == W_BF16) {
            uint16_t h = ks_f32_to_bf16(f);
            memcpy((char *)graw + 2 * (size_t)k, &h, 2), gv[k] = ks_bf16_to_f32(h);
        } else if (c->w == W_F16) {
            uint16_t h = ks_f32_to_f16(f);
            memcpy((char *)graw + 2 * (size_t)k, &h, 2), gv[k] = ks_f16_to_f32(h);
        } else {
            memcpy((char *)graw + 4 * (size_t)k, &f, 4), gv[k] = f;
        }
        d->gf[k] = (float)gv[k];
    }
    d->xp = malloc((size_t)c->T * c->K * sizeof(double));
    if (!d->xp) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
    for (int t = 0; t < c->T; t++)
        prologue_row(c, d->xh + c->x_off + (size_t)t * c->K, gv, d->xp + (size_t)t * c->K);
    int ok = cu_ok(r, r->api.cuMemAlloc(&d->x, nx * xs), "cuMemAlloc") &&
             cu_ok(r, r->api.cuMemAlloc(&d->w, nw * es), "cuMemAlloc") &&
             cu_ok(r, r->api.cuMemAlloc(&d->g, (size_t)c->K * es), "cuMemAlloc") &&
             cu_ok(r, r->api.cuMemAlloc(&d->out, (size_t)c->T * c->N * 4), "cuMemAlloc") &&
             cu_ok(r, r->api.cuMemcpyHtoD(d->x, xraw, nx * xs), "cuMemcpyHtoD") &&
             cu_ok(r, r->api.cuMemcpyHtoD(d->w, d->wraw, nw * es), "cuMemcpyHtoD") &&
             cu_ok(r, r->api.cuMemcpyHtoD(d->g, graw, (size_t)c->K * es), "cuMemcpyHtoD");
    free(graw);
    free(xraw);
    free(gv);
    return ok ? 0 : -1;
}

static void teardown(runner *r, mm_data *d)
{
    r->api.cuMemFree(d->x);
    r->api.cuMemFree(d->w);
    r->api.cuMemFree(d->g);
    r->api.cuMemFree(d->out);
    free(d->xp);
    free(d->wv);
    free(d->wraw);
    free(d->xh);
    free(d->gf);
}

/* A case's kernel, grid and dynamic shared memory, looked up (and the attribute set) once: the
 * decode benchmark's launches are then only launches. The grid: ceil(N / 16) blocks of 256 threads,
 * the decode path's ceil(N / (8 rows)), the tensor-core decode path's ceil(N / (16 rows)). */
typedef struct mm_launch {
    krt_cu_fn fn;
    unsigned grid;
    int smem;
} mm_launch;

static int prepare_launch(runner *r, const mm_case *c, int index, mm_launch *L)
{
    char name[32];
    snprintf(name, sizeof name, "mm_%d", index);
    if (!cu_ok(r, r->api.cuModuleGetFunction(&L->fn, r->mod, name), name)) return -1;
    int cols = c->path == PATH_DECODE ? 8 * c->rows : c->path == PATH_TC ? 16 * c->rows : 16;
    L->grid = (unsigned)((c->N + cols - 1) / cols);
    L->smem = c->path == PATH_TC ? tc_plan(c).ring : 0;
    if (L->smem && !cu_ok(r, r->api.cuFuncSetAttribute(L->fn, KRT_CU_FUNC_MAX_DYNAMIC_SHARED_BYTES, L->smem), name))
        return -1;
    return 0;
}

static int launch_prepared(runner *r, const mm_case *c, const mm_launch *L, const mm_data *d, krt_cu_ptr w, int t0,
                           int T)
{
    krt_cu_ptr x = d->x + (c->xh ? 2 : 4) * ((krt_cu_ptr)c->x_off + (krt_cu_ptr)t0 * (krt_cu_ptr)c->K);
    void *params[] = {&T, &x, &w, (void *)&d->g, (void *)&d->out, NULL};
    return cu_ok(r, r->api.cuLaunchKernel(L->fn, L->grid, 1, 1, 256, 1, 1, (unsigned)L->smem, NULL, params, NULL),
                 "cuLaunchKernel")
               ? 0
               : -1;
}

/* Launch case index, its weights at w, for tokens t0 .. t0 + T - 1 of its x, on its grid. */
static int launch_rows(runner *r, const mm_case *c, int index, const mm_data *d, krt_cu_ptr w, int t0, int T)
{
    mm_launch L;
    return prepare_launch(r, c, index, &L) == 0 ? launch_prepared(r, c, &L, d, w, t0, T) : -1;
}

static int launch(runner *r, const mm_case *c, int index, const mm_data *d)
{
    return launch_rows(r, c, index, d, d->w, 0, c->T);
}

/* Error of out against the exact sums over rows/columns (every one, or a
 * sample): worst |out - exact| / sum_k |x_k w_k|, and the relative L2. */
typedef struct mm_err {
    double worst, l2; /* the two measures */
    int bad;          /* outputs that are not finite */
} mm_err;

static mm_err compare(const mm_case *c, const mm_data *d, const float *out, int sample)
{
    mm_err e = {0, 0, 0};
    double num = 0.0, den = 0.0;
    int tstep = sample ? c->T / 3 + 1 : 1, nstep = sample ? c->N / 97 + 1 : 1;
    for (int t = 0; t < c->T; t += tstep)
        for (int n = 0; n < c->N; n += nstep) {
            double sum = 0.0, mag = 0.0;
            const double *xr = d->xp + (size_t)t * c->K;
            for (int k = 0; k < c->K; k++) {
                double p = xr[k] * weight_at(c, d, (size_t)n * c->K + k);
                sum += p, mag += fabs(p);
            }
            double v = out[(size_t)t * c->N + n];
            if (!isfinite(v)) {
                e.bad++;
                continue;
            }
            double err = fabs(v - sum) / (mag > 0 ? mag : 1.0);
            if (err > e.worst) e.worst = err;
            num += (v - sum) * (v - sum), den += sum * sum;
        }
    e.l2 = den > 0 ? sqrt(num / den) : sqrt(num);
    return e;
}

/* The decode path's outputs [T, N] as it sums them (kcu_prelude.cuh's kcu_matmul_small, and the
 * decode kernel before it): per token, kcu_pro_rms's statistic (decode_x: lane l sums x_k^2 in
 * double over its chunks, a butterfly of the 32 sums; 1 / sqrt(s / K + eps) as f32), the norm's values
 * (x inv, times g, in f32, rounded to the half dtype with xh); per output, lane l sums its chunks
 * l, l + 32, ... of VEC elements in order with fmaf from 0, then a butterfly of the 32 sums.
 * Columns 0, nstep, 2 nstep, ... only. */
/* Token t's x as the decode paths multiply it, into xp[K]: x itself, or kcu_pro_rms's values
 * (statistic: lane l sums x_k^2 in double over its chunks c = l, l + 32, ... of 16 bytes of x
 * (single elements where K is not a whole number of them), a butterfly of the 32 sums,
 * 1 / sqrt(s / K + eps) as f32; x inv, times g, in f32, rounded to the half dtype with xh). */
static void decode_x(const mm_case *c, const mm_data *d, int t, float *xp)
{
    const int K = c->K;
    const float *xr = d->xh + c->x_off + (size_t)t * K;
    float inv = 1.0f;
    if (c->rms) {
        /* lane l: its chunks c = l, l + 32, ... of v elements (16 bytes of x where K holds whole ones) */
        const int es = c->xh ? 2 : 4, v = (K * es) % 16 == 0 ? 16 / es : 1;
        double lane[32], next[32];
        for (int l = 0; l < 32; l++) {
            lane[l] = 0.0;
            for (int ch = l; ch < K / v; ch += 32)
                for (int j = 0; j < v; j++) lane[l] += (double)xr[ch * v + j] * (double)xr[ch * v + j];
        }
        for (int m = 16; m > 0; m >>= 1) {
            for (int l = 0; l < 32; l++) next[l] = lane[l] + lane[l ^ m];
            memcpy(lane, next, sizeof lane);
        }
        inv = (float)(1.0 / sqrt(lane[0] / (double)K + 1e-5));
    }
    for (int k = 0; k < K; k++) {
        float y = xr[k];
        if (c->rms) {
            y = y * inv;
            y = y * d->gf[k];
            if (c->xh) to_half(c->w, y, &y);
        }
        xp[k] = y;
    }
}

static void decode_reference(const mm_case *c, const mm_data *d, int nstep, float *ref)
{
    const int K = c->K, N = c->N, es = (int)w_size[c->w], vec = (K * es) % 16 == 0 ? 16 / es : 1, chunks = K / vec;
    float *xp = malloc((size_t)K * sizeof(float));
    if (!xp) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
    for (int t = 0; t < c->T; t++) {
        decode_x(c, d, t, xp);
        for (int n = 0; n < N; n += nstep) {
            float lane[32], next[32];
            for (int l = 0; l < 32; l++) {
                float acc = 0.0f;
                for (int ch = l; ch < chunks; ch += 32)
                    for (int j = 0; j < vec; j++) {
                        const int k = ch * vec + j;
                        acc = fmaf(xp[k], (float)weight_at(c, d, (size_t)n * K + k), acc);
                    }
                lane[l] = acc;
            }
            for (int m = 16; m > 0; m >>= 1) {
                for (int l = 0; l < 32; l++) next[l] = lane[l] + lane[l ^ m];
                memcpy(lane, next, sizeof lane);
            }
            ref[(size_t)t * N + n] = lane[0];
        }
    }
    free(xp);
}

/* Run every check case twice: within 1e-6 (4e-6 for the CUDA-core path), or the decode path
 * bitwise equal to decode_reference; bitwise equal runs. */
static void run_checks(runner *r, const mm_case *cases, int n)
{
    for (int i = 0; i < n; i++) {
        const mm_case *c = &cases[i];
        mm_data d;
        char what[128];
        snprintf(what, sizeof what, "%s T=%d K=%d N=%d%s%s%s%s", w_short[c->w], c->T, c->K, c->N,
                 c->rms ? " rms" : "", c->rev ? " reversed" : "", c->x_off ? " x+1" : "", c->xh ? " half x" : "");
        if (c->path == PATH_DECODE) snprintf(what + strlen(what), sizeof what - strlen(what), " decode R=%d", c->rows);
        if (c->path == PATH_TC) snprintf(what + strlen(what), sizeof what - strlen(what), " tc J=%d", c->rows);
        size_t bytes = (size_t)c->T * c->N * 4;
        float *a = malloc(bytes), *b = malloc(bytes);
        if (!a || !b || setup(r, c, 1000 + (uint64_t)i, 1, &d) != 0) {
            check_at(0, __FILE__, __LINE__, "%s: setup", what);
            free(a), free(b);
            continue;
        }
        int ok = r->api.cuMemsetD8(d.out, 0xff, bytes) == 0 && launch(r, c, i, &d) == 0 &&
                 r->api.cuMemcpyDtoH(a, d.out, bytes) == 0 && r->api.cuMemsetD8(d.out, 0xff, bytes) == 0 &&
                 launch(r, c, i, &d) == 0 && r->api.cuMemcpyDtoH(b, d.out, bytes) == 0;
        if (check_at(ok, __FILE__, __LINE__, "%s: launch", what) && c->path == PATH_DECODE) {
            float *ref = malloc(bytes);
            if (!ref) {
                fprintf(stderr, "out of host memory\n");
                exit(1);
            }
            decode_reference(c, &d, 1, ref);
            size_t differ = 0, n_out = (size_t)c->T * c->N, first = n_out;
            for (size_t o = 0; o < n_out; o++)
                if (memcmp(&a[o], &ref[o], 4) != 0) differ++, first = first < o ? first : o;
            int same = memcmp(a, b, bytes) == 0;
            printf("%s %s: %zu of %zu outputs differ from the decode order's sums%s\n",
                   !differ && same ? "ok  " : "FAIL", what, differ, n_out, same ? "" : ", two runs differ");
            if (differ) /* where, and by how much: an ulp is an order, more is a wrong value */
                printf("     first: token %zu, output %zu: %.9g, the model's %.9g (%+.3g)\n", first / (size_t)c->N,
                       first % (size_t)c->N, (double)a[first], (double)ref[first], (double)a[first] - ref[first]);
            CHECK_MSG(!differ && same, "%s", what);
            free(ref);
        } else if (ok) {
            if (c->path == PATH_TC) { /* the exact sums of what it multiplies: the norm's values rounded */
                float *xp = malloc((size_t)c->K * sizeof(float));
                if (!xp) {
                    fprintf(stderr, "out of host memory\n");
                    exit(1);
                }
                for (int t = 0; t < c->T; t++) {
                    decode_x(c, &d, t, xp);
                    for (int k = 0; k < c->K; k++) d.xp[(size_t)t * c->K + k] = xp[k];
                }
                free(xp);
            }
            mm_err e = compare(c, &d, a, 0);
            int same = memcmp(a, b, bytes) == 0;
            /* the CUDA-core path's sequential f32 sums round more often */
            int pass = e.bad == 0 && e.worst <= (c->path == PATH_FMA ? 4e-6 : 1e-6) && same;
            printf("%s %s: worst error %.2e of sum|x w| (relative L2 %.2e)%s%s\n", pass ? "ok  " : "FAIL", what,
                   e.worst, e.l2, e.bad ? ", outputs not finite" : "", same ? "" : ", two runs differ");
            CHECK_MSG(pass, "%s", what);
            if (c->path == PATH_TC) { /* batch invariance: each token's outputs as in a step of its own */
                int alone_same = 1;
                for (int t = 0; t < c->T && alone_same; t++)
                    alone_same = r->api.cuMemsetD8(d.out, 0xff, bytes) == 0 &&
                                 launch_rows(r, c, i, &d, d.w, t, 1) == 0 &&
                                 r->api.cuMemcpyDtoH(b, d.out, (size_t)c->N * 4) == 0 &&
                                 memcmp(b, a + (size_t)t * c->N, (size_t)c->N * 4) == 0;
                printf("%s %s: every token's outputs bitwise %s a step of its own\n", alone_same ? "ok  " : "FAIL",
                       what, alone_same ? "those of" : "NOT those of");
                CHECK_MSG(alone_same, "%s: batch invariance", what);
            }
        }
        teardown(r, &d);
        free(a), free(b);
    }
}

/* ---- the GPU benchmark -------------------------------------------------------------------- */
/* Time a case (warm-up, then reps launches between events); ms per launch. */
static double time_case(runner *r, const mm_case *c, int index, const mm_data *d, int reps)
{
    krt_cu_event e0, e1;
    if (!cu_ok(r, r->api.cuEventCreate(&e0, 0), "cuEventCreate") ||
        !cu_ok(r, r->api.cuEventCreate(&e1, 0), "cuEventCreate"))
        return -1;
    double ms = -1;
    if (launch(r, c, index, d) == 0 && launch(r, c, index, d) == 0) {
        r->api.cuEventRecord(e0, NULL);
        for (int i = 0; i < reps; i++) launch(r, c, index, d);
        r->api.cuEventRecord(e1, NULL);
        float f = 0;
        if (cu_ok(r, r->api.cuStreamSynchronize(NULL), "cuStreamSynchronize") &&
            cu_ok(r, r->api.cuEventElapsedTime(&f, e0, e1), "cuEventElapsedTime"))
            ms = f / reps;
    }
    r->api.cuEventDestroy(e0);
    r->api.cuEventDestroy(e1);
    return ms;
}

/* The benchmark's cases: every 8B shape (bf16) through kcu_matmul_large, the same
 * in a kernel limited to 128 registers, the CUDA-core path, and the
 * tensor-core path alone loading two k blocks ahead; gate,up in f16 and f32;
 * T = 512, 2048; then every 8B shape through the decode path. */
static int bench_cases(mm_case *out)
{
    int n = 0;
    for (size_t s = 0; s < sizeof llama8b / sizeof llama8b[0]; s++) {
        const int K = llama8b[s].K, N = llama8b[s].N;
        out[n++] = (mm_case){W_BF16, 128, K, N, 0, 0, 0, PATH_MATMUL, 0, 0, 0, 0, 0};
        out[n++] = (mm_case){W_BF16, 128, K, N, 0, 0, 0, PATH_MATMUL, 0, 0, 1, 0, 0};
        out[n++] = (mm_case){W_BF16, 128, K, N, 0, 0, 0, PATH_FMA, 0, 0, 0, 0, 0};
        out[n++] = (mm_case){W_BF16, 128, K, N, 0, 0, 0, PATH_MMA, 64, 2, 0, 0, 0};
    }
    for (int w = W_F16; w <= W_F32; w++) {
        out[n++] = (mm_case){(wtype)w, 128, 4096, 28672, 0, 0, 0, PATH_MATMUL, 0, 0, 0, 0, 0};
        out[n++] = (mm_case){(wtype)w, 128, 4096, 28672, 0, 0, 0, PATH_MATMUL, 0, 0, 1, 0, 0};
        out[n++] = (mm_case){(wtype)w, 128, 4096, 28672, 0, 0, 0, PATH_FMA, 0, 0, 0, 0, 0};
    }
    out[n++] = (mm_case){W_BF16, 512, 4096, 28672, 0, 0, 0, PATH_MATMUL, 0, 0, 1, 0, 0};
    out[n++] = (mm_case){W_BF16, 2048, 4096, 4096, 0, 0, 0, PATH_MATMUL, 0, 0, 1, 0, 0};
    out[n++] = (mm_case){W_BF16, 2048, 4096, 4096, 0, 0, 0, PATH_FMA, 0, 0, 0, 0, 0};
    /* decode: bf16 x (fast precision), T = 1 and 8, kcu_plan_gemv's R first, then the other */
    for (size_t s = 0; s < sizeof llama8b / sizeof llama8b[0]; s++)
        for (int T = 1; T <= 8; T += 7) {
            const bench_shape *b = &llama8b[s];
            const int R = kcu_plan_gemv(b->N).rows;
            out[n++] = (mm_case){W_BF16, T, b->K, b->N, b->norm, 0, 0, PATH_DECODE, 0, 0, 0, R, 1};
            out[n++] = (mm_case){W_BF16, T, b->K, b->N, b->norm, 0, 0, PATH_DECODE, 0, 0, 0, 6 - R, 1};
        }
    /* decode on tensor cores (what fast engines run for steps of 1-32 tokens): T = 1, 8, 32 */
    for (size_t s = 0; s < sizeof llama8b / sizeof llama8b[0]; s++)
        for (int T = 1; T <= 32; T = T == 1 ? 8 : T == 8 ? 32 : 33) {
            const bench_shape *b = &llama8b[s];
            out[n++] = (mm_case){W_BF16, T, b->K, b->N, b->norm, 0, 0, PATH_TC, 0, 0, 0, tc_plan(&(mm_case){.N = b->N, .rms = b->norm}).rows, 1};
        }
    return n;
}

/* A case's implementation, in words. */
static void path_name(const mm_case *c, char *buf, size_t n)
{
    if (c->path == PATH_DECODE)
        snprintf(buf, n, "decode, R %d%s", c->rows, c->rms ? ", rms prologue" : "");
    else if (c->path == PATH_TC)
        snprintf(buf, n, "decode on tensor cores, J %d%s", c->rows, c->rms ? ", rms prologue" : "");
    else if (c->path == PATH_MATMUL)
        snprintf(buf, n, "kcu_matmul_large%s", c->lb2 ? ", <= 128 registers" : "");
    else if (c->path == PATH_FMA)
        snprintf(buf, n, "CUDA cores (fma)");
    else
        snprintf(buf, n, "tensor cores, k %d, %d ahead", c->bk, c->pf);
}

/* A decode case timed: reps launches, the weights read from copies enough to pass 256 MB (so that
 * L2, 50 MB, does not hold them between launches: each launch reads its weights from HBM, as a
 * decode step does); us a launch (the launches queue back to back: the gaps between kernels are
 * in it, as in a step's stream), or -1. */
static double time_decode(runner *r, const mm_case *c, int index, const mm_data *d, int reps)
{
    enum { MAX_COPIES = 16 };
    const size_t bytes = (size_t)c->N * c->K * w_size[c->w];
    int copies = (int)((((size_t)256 << 20) + bytes - 1) / bytes);
    if (copies > MAX_COPIES) copies = MAX_COPIES;
    krt_cu_ptr w[MAX_COPIES] = {d->w};
    int have = 1;
    while (have < copies && r->api.cuMemAlloc(&w[have], bytes) == 0 && r->api.cuMemsetD8(w[have], 0, bytes) == 0)
        have++;
    krt_cu_event e0, e1;
    double us = -1;
    mm_launch L;
    if (prepare_launch(r, c, index, &L) == 0 && cu_ok(r, r->api.cuEventCreate(&e0, 0), "cuEventCreate") &&
        cu_ok(r, r->api.cuEventCreate(&e1, 0), "cuEventCreate")) {
        int ok = 1;
        /* warm: 50 ms of launches first, so that the clocks have risen from an idle GPU's before the
         * first case is timed (a few launches were all the warming the q,k,v case had) */
        const double t_warm = now_s();
        for (int i = 0; ok && now_s() - t_warm < 0.05; i++) {
            ok = launch_prepared(r, c, &L, d, w[i % have], 0, c->T) == 0;
            if (i % 64 == 63) ok = ok && cu_ok(r, r->api.cuStreamSynchronize(NULL), "cuStreamSynchronize");
        }
        r->api.cuEventRecord(e0, NULL);
        for (int i = 0; i < reps && ok; i++) ok = launch_prepared(r, c, &L, d, w[i % have], 0, c->T) == 0;
        r->api.cuEventRecord(e1, NULL);
        float f = 0;
        if (ok && cu_ok(r, r->api.cuStreamSynchronize(NULL), "cuStreamSynchronize") &&
            cu_ok(r, r->api.cuEventElapsedTime(&f, e0, e1), "cuEventElapsedTime"))
            us = 1e3 * f / reps;
        r->api.cuEventDestroy(e0);
        r->api.cuEventDestroy(e1);
    }
    for (int i = 1; i < have; i++) r->api.cuMemFree(w[i]);
    /* the outputs of the last launch are of copy (reps - 1) % have: run copy 0 again to check them */
    if (us > 0 && launch(r, c, index, d) != 0) us = -1;
    return us;
}

/* The decode cases of the benchmark: time each, check sampled outputs bitwise against
 * decode_reference (kcu_matmul_small) or within 1e-6 of the exact sums (kcu_matmul_tc), and
 * total the 8B model's decode matmuls at each T with the generator's plan: model[path][T index]
 * [time, floor] (T index: 1, 8, 32). */
static void run_decode_bench(runner *r, const mm_case *c, int index, double model[2][3][2])
{
    mm_data d;
    if (!CHECK(setup(r, c, 11 + (uint64_t)c->K * 31 + (uint64_t)c->N, 0, &d) == 0)) return;
    const double floor_us = (double)c->N * c->K * w_size[c->w] / 4.2e12 * 1e6; /* the weights at 4.2 TB/s */
    double us = time_decode(r, c, index, &d, c->N > 100000 ? 20 : 200);
    size_t bytes = (size_t)c->T * c->N * 4;
    const int nstep = c->N / 97 + 1;
    float *out = malloc(bytes), *ref = malloc(bytes);
    size_t differ = 0, checked = 0;
    if (c->path == PATH_TC && out && us > 0 && r->api.cuMemcpyDtoH(out, d.out, bytes) == 0) {
        float *xp = malloc((size_t)c->K * sizeof(float));
        for (int t = 0; xp && t < c->T; t++) {
            decode_x(c, &d, t, xp);
            for (int k = 0; k < c->K; k++) d.xp[(size_t)t * c->K + k] = xp[k];
        }
        free(xp);
        const mm_err e = compare(c, &d, out, 1);
        checked = 1, differ = e.bad || e.worst > 1e-6;
    } else if (out && ref && us > 0 && r->api.cuMemcpyDtoH(out, d.out, bytes) == 0) {
        decode_reference(c, &d, nstep, ref);
        for (int t = 0; t < c->T; t++)
            for (int nn = 0; nn < c->N; nn += nstep, checked++)
                differ += memcmp(&out[(size_t)t * c->N + nn], &ref[(size_t)t * c->N + nn], 4) != 0;
    }
    free(out), free(ref);
    char name[48];
    path_name(c, name, sizeof name);
    const double gbs = us > 0 ? (double)c->N * c->K * w_size[c->w] / (us * 1e-6) / 1e9 : 0;
    printf("bench %-5s T=%-4d K=%-5d N=%-6d %-32s %8.1f us %6.0f GB/s, %3.0f%% of the floor (%.1f us)%s\n",
           w_short[c->w], c->T, c->K, c->N, name, us, gbs, us > 0 ? 100.0 * floor_us / us : 0, floor_us,
           differ ? (c->path == PATH_TC ? "  OUTPUTS PAST 1e-6" : "  OUTPUTS DIFFER FROM THE DECODE ORDER") : "");
    CHECK_MSG(us > 0 && checked > 0 && differ == 0, "decode bench case %d: %zu of %zu sampled outputs differ", index,
              differ, checked);
    const int tc = c->path == PATH_TC, ti = c->T == 1 ? 0 : c->T == 8 ? 1 : 2;
    for (size_t s = 0; s < sizeof llama8b / sizeof llama8b[0]; s++)
        if (c->K == llama8b[s].K && c->N == llama8b[s].N &&
            c->rows == (tc ? tc_plan(c) : kcu_plan_gemv(c->N)).rows) {
            model[tc][ti][0] += us * llama8b[s].per_model;
            model[tc][ti][1] += floor_us * llama8b[s].per_model;
        }
    teardown(r, &d);
}

static void run_bench(runner *r, const mm_case *cases, int n, int first)
{
    double decode[2][3][2] = {{{0}}}; /* the 8B model's decode matmuls, us, and their floors (run_decode_bench) */
    enum { MAX_LABELS = 8 };
    char labels[MAX_LABELS][48];
    double model[MAX_LABELS] = {0}; /* the 8B model's matmul time per implementation, ms */
    int n_labels = 0;
    for (int i = 0; i < n; i++) {
        const mm_case *c = &cases[i];
        mm_data d;
        if (c->path == PATH_DECODE || c->path == PATH_TC) {
            run_decode_bench(r, c, first + i, decode);
            continue;
        }
        if (!CHECK(setup(r, c, 7 + (uint64_t)c->K * 31 + (uint64_t)c->N, 0, &d) == 0)) continue;
        double ms = time_case(r, c, first + i, &d, c->T >= 512 ? 5 : 10);
        size_t bytes = (size_t)c->T * c->N * 4;
        float *out = malloc(bytes);
        mm_err e = {0, 0, 0};
        if (out && r->api.cuMemcpyDtoH(out, d.out, bytes) == 0) e = compare(c, &d, out, 1);
        free(out);
        double tflops = ms > 0 ? 2.0 * c->T * c->K * (double)c->N / (ms * 1e-3) / 1e12 : 0;
        char name[48];
        path_name(c, name, sizeof name);
        printf("bench %-5s T=%-4d K=%-5d N=%-6d %-32s %8.3f ms %6.1f TFLOP/s  error %.2e (L2 %.2e)%s\n",
               w_short[c->w], c->T, c->K, c->N, name, ms, tflops, e.worst, e.l2, e.bad ? " NOT FINITE" : "");
        if (c->path != PATH_FMA) CHECK_MSG(!e.bad && e.worst <= 1e-6, "bench case %d: error %.2e", i, e.worst);
        if (c->w != W_BF16 || c->T != 128) {
            teardown(r, &d);
            continue;
        }
        int l = 0;
        while (l < n_labels && strcmp(labels[l], name) != 0) l++;
        if (l == n_labels && n_labels < MAX_LABELS) snprintf(labels[n_labels++], sizeof labels[0], "%s", name);
        for (size_t s = 0; s < sizeof llama8b / sizeof llama8b[0] && l < n_labels; s++)
            if (c->K == llama8b[s].K && c->N == llama8b[s].N) model[l] += ms * llama8b[s].per_model;
        teardown(r, &d);
    }
    for (int l = 0; l < n_labels; l++)
        printf("bench Llama-3-8B 128-token prefill, matmuls only (bf16 weights), %s: %.1f ms\n", labels[l], model[l]);
    static const int ts[3] = {1, 8, 32};
    for (int p = 0; p < 2; p++)
        for (int t = 0; t < 3; t++)
            if (decode[p][t][0] > 0)
                printf("bench Llama-3-8B decode step, T = %d, matmuls only (bf16 weights and x, %s): "
                       "%.3f ms (the weights at 4.2 TB/s: %.3f ms, %.0f%%)\n",
                       ts[t], p ? "kcu_matmul_tc" : "kcu_matmul_small, kcu_plan_gemv's R", decode[p][t][0] * 1e-3,
                       decode[p][t][1] * 1e-3, 100.0 * decode[p][t][1] / decode[p][t][0]);
}

/* ---- main ------------------------------------------------------------------------------- */
static int open_runner(runner *r, const char *cubin, size_t cubin_size)
{
    ks_diag d = {0};
    (void)cubin_size;
    if (krt_cuda_api_load(&r->api, &d) != 0) return -1;
    krt_cu_device dev;
    return cu_ok(r, r->api.cuInit(0), "cuInit") && cu_ok(r, r->api.cuDeviceGet(&dev, 0), "cuDeviceGet") &&
                   cu_ok(r, r->api.cuDevicePrimaryCtxRetain(&r->ctx, dev), "cuDevicePrimaryCtxRetain") &&
                   cu_ok(r, r->api.cuCtxSetCurrent(r->ctx), "cuCtxSetCurrent") &&
                   cu_ok(r, r->api.cuModuleLoadData(&r->mod, cubin), "cuModuleLoadData")
               ? 0
               : -1;
}

static void close_runner(runner *r)
{
    if (r->mod) r->api.cuModuleUnload(r->mod);
    if (r->ctx) r->api.cuDevicePrimaryCtxRelease(0);
    krt_cuda_api_unload(&r->api);
}

/* Compile src for arch with NVRTC into cubin; prints the time. 0 or -1. */
static int nvrtc(const char *src, const char *arch, ks_buf *cubin)
{
    ks_diag d = {0};
    double t0 = now_s();
    int rc = kcu_compile(src, "mm_check.cu", arch, cubin, &d);
    printf("%s NVRTC %s: %.1f s\n", rc == 0 ? "ok  " : "FAIL", arch, now_s() - t0);
    return rc;
}

enum { MAX_BENCH = 80 };

/* The --gpu kernels: the checks, then the benchmark's; their counts. */
static void gpu_cases(mm_case *all, int *n_checks, int *n_bench)
{
    *n_checks = (int)(sizeof check_cases / sizeof check_cases[0]);
    memcpy(all, check_cases, sizeof check_cases);
    *n_bench = bench_cases(all + *n_checks);
}

static int compile_main(const char *arch, const char *path)
{
    mm_case all[sizeof check_cases / sizeof check_cases[0] + MAX_BENCH];
    int n_checks, n_bench;
    gpu_cases(all, &n_checks, &n_bench);
    ks_buf src = {0}, cubin = {0};
    program_source(all, n_checks + n_bench, &src);
    int rc = nvrtc(ks_buf_cstr(&src), arch, &cubin);
    FILE *f = rc == 0 ? fopen(path, "wb") : NULL;
    if (rc == 0 && (!f || fwrite(cubin.data, 1, cubin.len, f) != cubin.len)) rc = -1;
    if (f && fclose(f) != 0) rc = -1;
    ks_buf_free(&src);
    ks_buf_free(&cubin);
    return rc == 0 ? 0 : 1;
}

static int gpu_main(const char *cubin_path)
{
    mm_case all[sizeof check_cases / sizeof check_cases[0] + MAX_BENCH];
    int n_checks, n_bench;
    gpu_cases(all, &n_checks, &n_bench);
    ks_buf src = {0}, cubin = {0};
    program_source(all, n_checks + n_bench, &src);
    runner r = {0};
    r.gpu = 1;
    /* the device's architecture */
    ks_diag d = {0};
    int major = 0, minor = 0;
    krt_cu_device dev;
    if (krt_cuda_api_load(&r.api, &d) != 0 || !cu_ok(&r, r.api.cuInit(0), "cuInit") ||
        !cu_ok(&r, r.api.cuDeviceGet(&dev, 0), "cuDeviceGet") ||
        !cu_ok(&r, r.api.cuDeviceGetAttribute(&major, KRT_CU_ATTR_CC_MAJOR, dev), "attribute") ||
        !cu_ok(&r, r.api.cuDeviceGetAttribute(&minor, KRT_CU_ATTR_CC_MINOR, dev), "attribute"))
        return 1;
    krt_cuda_api_unload(&r.api);
    char arch[16];
    snprintf(arch, sizeof arch, "sm_%d%d", major, minor);
    if (cubin_path) {
        size_t len = 0;
        char *data = ks_read_file(&d, cubin_path, &len);
        if (!data) return 1;
        ks_buf_put(&cubin, data, len);
        free(data);
    } else if (nvrtc(ks_buf_cstr(&src), arch, &cubin) != 0) {
        return 1;
    }
    if (open_runner(&r, cubin.data, cubin.len) != 0) return 1;
    run_checks(&r, all, n_checks);
    run_bench(&r, all + n_checks, n_bench, n_checks);
    close_runner(&r);
    ks_buf_free(&src);
    ks_buf_free(&cubin);
    return check_finish("cuda_mm_check");
}

static int emu_main(void)
{
    int n = (int)(sizeof check_cases / sizeof check_cases[0]), ran = 0;
    ks_buf src = {0};
    program_source(check_cases, n, &src);
#if defined(__SANITIZE_ADDRESS__)
    /* a sanitizer build: the source is the plain build's, which compiles it; NVRTC itself is not
     * sanitized, and slow here behind the sanitizer's allocator (CI time) */
    printf("a sanitizer build: the plain build compiles this source with NVRTC\n");
#else
    if (kcu_have_nvrtc()) {
        /* NVRTC on one case of each path and weight dtype (a case's sizes are constants of the same
         * templates; every fast engine compiles them too, and bench/gpu_check.sh the whole --gpu
         * program; CI time): bf16, f16 and f32 tiled, the mma and FMA paths, decode, tensor-core
         * decode a tile at a time and kcu_tc_wide */
        static const int pick[] = {0, 4, 6, 7, 12, 13, 23, 33};
        mm_case some_cases[sizeof pick / sizeof pick[0]];
        for (size_t i = 0; i < sizeof pick / sizeof pick[0]; i++) some_cases[i] = check_cases[pick[i]];
        ks_buf some = {0}, cubin = {0};
        program_source(some_cases, (int)(sizeof pick / sizeof pick[0]), &some);
        CHECK_MSG(nvrtc(ks_buf_cstr(&some), "sm_80", &cubin) == 0, "NVRTC, sm_80");
        ks_buf_free(&cubin);
        ks_buf_free(&some);
        ran = 1;
    }
#endif
    const char *gxx = getenv("KILN_GXX"), *shim = getenv("KILN_EMU_SHIM"), *emu = getenv("KILN_EMU_LIB");
    if (gxx && gxx[0] && shim && emu) {
        char dir[] = "/tmp/kiln_mm_check.XXXXXX";
        if (!mkdtemp(dir)) return 1;
        char *cu = ks_path_join(dir, "mm.cu"), *so = ks_path_join(dir, "mm.so");
        FILE *f = fopen(cu, "w");
        if (!f || fwrite(src.data, 1, src.len, f) != src.len || fclose(f) != 0) return 1;
        ks_buf cmd = {0};
        ks_buf_printf(&cmd, "'%s' -O2 -w -fno-strict-aliasing -shared -fPIC -include '%s' -x c++ '%s' -o '%s'", gxx,
                      shim, cu, so);
        if (CHECK_MSG(system(ks_buf_cstr(&cmd)) == 0, "g++ could not compile the kernels")) {
            setenv("KILN_EMU_KERNELS", so, 1);
            setenv("KILN_CUDA_LIB", emu, 1);
            runner r = {0};
            if (CHECK(open_runner(&r, NULL, 0) == 0)) run_checks(&r, check_cases, n);
            close_runner(&r);
            ran = 1;
        }
        unlink(cu);
        unlink(so);
        rmdir(dir);
        free(cu);
        free(so);
        ks_buf_free(&cmd);
    } else {
        printf("KILN_GXX, KILN_EMU_SHIM or KILN_EMU_LIB not set: the emulated checks are skipped\n");
    }
    ks_buf_free(&src);
    if (!ran) {
        printf("skipped: needs NVRTC or g++\n");
        return 77;
    }
    return check_finish("cuda_mm_check");
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 2 && argc <= 3 && strcmp(argv[1], "--gpu") == 0) return gpu_main(argc == 3 ? argv[2] : NULL);
    if (argc == 4 && strcmp(argv[1], "--compile") == 0) return compile_main(argv[2], argv[3]);
    if (argc != 1) {
        fprintf(stderr, "usage: cuda_mm_check [--gpu [CUBIN] | --compile ARCH CUBIN]\n");
        return 2;
    }
    return emu_main();
}
