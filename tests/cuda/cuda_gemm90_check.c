/*
 * cuda_gemm90_check.c — kcu_gemm90, the sm_90a prefill matmul (wgmma fed by
 * TMA, codegen/cuda/kcu_prelude.cuh), on kernels written for it.
 *
 *   cuda_gemm90_check          NVRTC compiles the kernels for sm_90a (fails if
 *       they stop compiling) and names them: wgmma and TMA have no CPU
 *       stand-in, so nothing runs here. Exits 77 without NVRTC.
 *   cuda_gemm90_check --compile CUBIN    writes that cubin (NVRTC here, so
 *       that the GPU machine need not compile).
 *   cuda_gemm90_check --gpu CUBIN        on an sm_90 GPU: the checks against
 *       a double-precision reference (T = 1, 77, 200, 2048, 2100, 5000; N and K not
 *       multiples of the tile; bf16 and f16; the RMS prologue with its weight
 *       folded into w; an epilogue that permutes the columns; every output of
 *       a token < T written, none past T; six runs bitwise equal), then
 *       Llama-3-8B's prefill matmuls timed at T = 128, 512 and 2048 for each tile
 *       configuration, each checked on sampled outputs. Prints a line
 *       "TIME <shape> <T> <K> <N> <BN> <STAGES> <ms> <TFLOP/s>" per timing
 *       (bench/gemm90_vs_cublas.py reads them).
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codegen/cuda/kcu.h"
#include "runtime/cuda/cuda_api.h"
#include "tests/check.h"

/* ---- the kernels ---------------------------------------------------------------------------- */
typedef struct g90_case {
    int f16;      /* 1: f16 operands, 0: bf16 */
    int K, N;     /* inputs, outputs */
    int bn, st;   /* tile columns, pipeline stages */
    int rms;      /* 1: kcu_g90_rms (the norm's weight folded into w by the test, as the compiler would) */
    int rev;      /* 1: the epilogue's column c is weight row N-1-c (w uploaded permuted) */
    int out16;    /* 1: the epilogue stores bf16 (the timed kernels, as torch's bf16 matmul), 0: f32 */
    int rows;     /* x's rows in memory (max_tokens: the tensor map's) */
    int T[6], nt; /* the token counts checked (or timed) */
    const char *what; /* the 8B matmul timed, or NULL for a check case */
    int cluster;  /* 2: in clusters of two blocks sharing the weight tile (grid 2 x ceil(T / 256) x tiles), else 1 */
} g90_case;

static const g90_case check_cases[] = {
    {0, 256, 1000, 128, 6, 0, 0, 0, 2048, {1, 77, 200, 2048}, 4, NULL, 1}, /* N % 128 = 104 */
    {0, 4136, 333, 256, 4, 1, 1, 0, 256, {1, 77, 200}, 3, NULL, 1},        /* K % 64 = 40, rms, permuted */
    {1, 512, 520, 192, 5, 1, 0, 0, 2048, {77, 200, 2048}, 3, NULL, 1},     /* f16, rms */
    {1, 1000, 64, 64, 8, 0, 1, 0, 300, {1, 200, 300}, 3, NULL, 1},         /* f16, K % 64 = 40, T = rows */
    {0, 128, 200, 256, 2, 0, 0, 0, 77, {77}, 1, NULL, 1},                   /* one partial tile each way */
    {0, 512, 1000, 224, 5, 1, 1, 0, 2048, {1, 77, 200, 2048}, 4, NULL, 1}, /* 224 (m64n224 wgmma), rms, permuted */
    {1, 256, 448, 224, 3, 0, 0, 0, 300, {77, 300}, 2, NULL, 1},            /* 224, f16 */
    /* past 16 token tiles: kcu_g90_raster's bands (40 token tiles: 16, 16 and a last band of 8) */
    {0, 256, 1000, 128, 6, 0, 0, 0, 5000, {2100, 5000}, 2, NULL, 1},
    /* clusters of two: an odd count of token tiles (the last pair's second block past T), bands, f16 with
       rms, 224 columns (half boxes of 112 rows) permuted, a tile of 64 */
    {0, 256, 1000, 128, 6, 0, 0, 0, 2048, {1, 77, 200, 2048}, 4, NULL, 2},
    {0, 256, 1000, 256, 4, 0, 0, 0, 5000, {2100, 5000}, 2, NULL, 2},
    {1, 512, 520, 192, 5, 1, 0, 0, 2048, {77, 200, 2048}, 3, NULL, 2},
    {0, 512, 1000, 224, 5, 1, 1, 0, 2048, {1, 77, 200, 2048}, 4, NULL, 2},
    {0, 128, 200, 64, 8, 0, 0, 0, 77, {77}, 1, NULL, 2},
};

/* Llama-3-8B's matmuls (K, N) and the tile configurations timed. */
static const struct {
    const char *what;
    int K, N;
} llama8b[] = {{"qkv", 4096, 6144}, {"o", 4096, 4096}, {"gate_up", 4096, 28672}, {"down", 14336, 4096},
               {"lm_head", 4096, 128256}};
/* BN, STAGES; and those timed in clusters of two as well (reported as "<matmul>_c2") */
static const int configs[][2] = {{256, 4}, {224, 5}, {128, 6}, {192, 5}, {64, 8}};
static const char *const clustered[] = {"qkv_c2", "o_c2", "gate_up_c2", "down_c2", "lm_head_c2"};
enum { N_SHAPES = 5, N_CONFIGS = 5, N_CONFIGS_C2 = 3, N_CHECKS = sizeof check_cases / sizeof check_cases[0], N_RMS = 2,
       N_ALL = N_CHECKS + N_SHAPES * (N_CONFIGS + N_CONFIGS_C2) + N_RMS };

static void all_cases(g90_case *all)
{
    memcpy(all, check_cases, sizeof check_cases);
    int n = N_CHECKS;
    for (int s = 0; s < N_SHAPES; s++) {
        for (int c = 0; c < N_CONFIGS; c++)
            all[n++] = (g90_case){0, llama8b[s].K, llama8b[s].N, configs[c][0], configs[c][1], 0, 0, 1, 2048,
                                  {128, 256, 512, 1024, 2048}, 5, llama8b[s].what, 1};
        for (int c = 0; c < N_CONFIGS_C2; c++)
            all[n++] = (g90_case){0, llama8b[s].K, llama8b[s].N, configs[c][0], configs[c][1], 0, 0, 1, 2048,
                                  {128, 256, 512, 1024, 2048}, 5, clustered[s], 2};
    }
    /* the RMS prologue's cost, its pre-pass included: q,k,v with it (g = 1: nothing to fold) */
    all[n++] = (g90_case){0, 4096, 6144, 256, 4, 1, 0, 1, 2048, {512, 2048}, 2, "qkv_rms", 1};
    all[n++] = (g90_case){0, 4096, 6144, 192, 5, 1, 0, 1, 2048, {512, 2048}, 2, "qkv_rms", 1};
}

static void program_source(const g90_case *cases, int n, ks_buf *src)
{
    ks_buf_puts(src, kcu_prelude);
    ks_buf_puts(src, "\n#if KCU_GEMM90\n"
                     "/* column c is weight row N-1-c */\n"
                     "template <int N> struct g90_epi_rev {\n"
                     "    float *__restrict__ out; /* [T, N] */\n"
                     "    static __device__ __forceinline__ int row(int c) { return N - 1 - c; }\n"
                     "    __device__ __forceinline__ void one(long long t, int n, float v) const { out[t * N + n] = v; }\n"
                     "    __device__ __forceinline__ void two(long long t, int n0, float v0, int n1, float v1) const\n"
                     "    {\n        out[t * N + n0] = v0;\n        out[t * N + n1] = v1;\n    }\n};\n"
                     "/* bf16 out[t, n] (round to nearest even), a pair in one 4-byte store */\n"
                     "__device__ __forceinline__ unsigned g90_bf16(float v)\n"
                     "{\n    const unsigned u = __float_as_uint(v);\n"
                     "    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;\n}\n"
                     "template <int N> struct g90_epi_bf16 {\n"
                     "    unsigned short *__restrict__ out; /* [T, N] */\n"
                     "    static __device__ __forceinline__ int row(int c) { return c; }\n"
                     "    __device__ __forceinline__ void one(long long t, int n, float v) const { out[t * N + n] = "
                     "(unsigned short)g90_bf16(v); }\n"
                     "    __device__ __forceinline__ void two(long long t, int n0, float v0, int n1, float v1) const\n"
                     "    {\n        *reinterpret_cast<unsigned *>(out + t * N + n0) = g90_bf16(v0) | g90_bf16(v1) << 16;\n"
                     "    }\n};\n");
    for (int i = 0; i < n; i++) {
        const g90_case *c = &cases[i];
        const char *epi = c->out16 ? "g90_epi_bf16" : c->rev ? "g90_epi_rev" : "kcu_epi_store";
        const char *xt = c->f16 ? "kcu_f16" : "kcu_bf16";
        char call[128];
        const int cl = c->cluster == 2 ? 2 : 1;
        snprintf(call, sizeof call, "kcu_gemm90<%s, %d, %d, %d, %d, kcu_g90_plain<%d>, %d>", xt, c->K, c->N, c->bn, c->st,
                 c->bn, cl);
        ks_buf_printf(src,
                      "extern \"C\" __global__ void __launch_bounds__(KCU_G90_THREADS, 1)%s\n"
                      "g90_%d(int T, const __grid_constant__ kcu_tmap ta, const __grid_constant__ kcu_tmap tb, "
                      "%s *__restrict__ out, const float *__restrict__ inv)\n"
                      "{\n    (void)inv;\n    %s(T, ta, tb, %s, %s<%d>{out});\n}\n",
                      cl == 2 ? " KCU_G90_CLUSTER2" : "", i, c->out16 ? "unsigned short" : "float", call, c->rms ? "kcu_g90_rms{inv}" : "kcu_g90_none{}", epi,
                      c->N);
        if (c->rms)
            ks_buf_printf(src,
                          "extern \"C\" __global__ void __launch_bounds__(KCU_G90_INV_ROWS * 32)\n"
                          "g90_%d_inv(int T, const %s *__restrict__ x, float eps, float *__restrict__ inv)\n"
                          "{\n    kcu_g90_rms_inv<%s, %d>(T, x, eps, inv);\n}\n",
                          i, xt, xt, c->K);
    }
    ks_buf_puts(src, "#endif\n");
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- data ------------------------------------------------------------------------------------ */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double rng_unit(uint64_t *s) { return (double)(rng_next(s) >> 11) * 0x1p-52 - 1.0; }

static uint16_t to_half(int f16, double v) { return f16 ? ks_f32_to_f16((float)v) : ks_f32_to_bf16((float)v); }
static double from_half(int f16, uint16_t h) { return f16 ? ks_f16_to_f32(h) : ks_bf16_to_f32(h); }

/* ---- running --------------------------------------------------------------------------------- */
typedef struct runner {
    krt_cuda_api api; /* the driver */
    krt_cu_ctx ctx;   /* its primary context */
    krt_cu_mod mod;   /* the kernels */
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

/* A case's operands: host copies (the half bits as uploaded) and device buffers. */
typedef struct g90_data {
    uint16_t *x, *w;          /* [rows, K], [N, K] as uploaded (w permuted and folded as the case says) */
    double *wmodel;           /* [N, K] the model's weights (w' after folding), row n = output n */
    krt_cu_ptr dx, dw, dout;  /* device buffers; dout [rows, N] */
    krt_cu_ptr dinv;          /* [rows] the RMS pre-pass's 1 / rms */
    krt_cu_tmap ta, tb;       /* their tensor maps */
    size_t out_bytes;         /* dout's size */
} g90_data;

static int tensor_map(runner *r, krt_cu_tmap *m, krt_cu_ptr base, int f16, int K, int rows, int box_rows)
{
    const uint64_t dims[2] = {(uint64_t)K, (uint64_t)rows}, strides[1] = {(uint64_t)K * 2};
    const unsigned box[2] = {64, (unsigned)box_rows}, es[2] = {1, 1};
    return cu_ok(r,
                 r->api.cuTensorMapEncodeTiled(m, f16 ? KRT_CU_TMAP_FLOAT16 : KRT_CU_TMAP_BFLOAT16, 2,
                                               (void *)(uintptr_t)base, dims, strides, box, es,
                                               KRT_CU_TMAP_INTERLEAVE_NONE, KRT_CU_TMAP_SWIZZLE_128B,
                                               KRT_CU_TMAP_L2_256B, KRT_CU_TMAP_OOB_ZERO),
                 "cuTensorMapEncodeTiled");
}

/* Random operands for case c: x about 1 (rows past the largest T too: read, never used), w
 * about 1/sqrt(K); with rms, w' = half(w * g) for a g about 1 (the compiler's fold). For a
 * timed case (fast), random signs, exponents and mantissas straight from the generator's bits
 * (Llama's weights take seconds otherwise), and no copy of w in double. */
static int setup(runner *r, const g90_case *c, uint64_t seed, g90_data *d)
{
    memset(d, 0, sizeof *d);
    const int fast = c->what != NULL;
    const size_t nx = (size_t)c->rows * c->K, nw = (size_t)c->N * c->K;
    d->x = malloc(nx * 2);
    d->w = malloc(nw * 2);
    d->wmodel = fast ? NULL : malloc(nw * sizeof(double));
    if (!d->x || !d->w || (!fast && !d->wmodel)) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
    uint64_t s = seed;
    if (fast) { /* bf16: sign, exponent 126..127 (x) or 119..122 (w), 7 random mantissa bits */
        for (size_t i = 0; i < nx; i += 4) {
            const uint64_t b = rng_next(&s);
            for (size_t j = 0; j < 4 && i + j < nx; j++) {
                const unsigned v = (unsigned)(b >> (16 * j));
                d->x[i + j] = (uint16_t)((v & 0x807fu) | (126u + (v >> 7 & 1u)) << 7);
            }
        }
        for (size_t i = 0; i < nw; i += 4) {
            const uint64_t b = rng_next(&s);
            for (size_t j = 0; j < 4 && i + j < nw; j++) {
                const unsigned v = (unsigned)(b >> (16 * j));
                d->w[i + j] = (uint16_t)((v & 0x807fu) | (119u + (v >> 7 & 3u)) << 7);
            }
        }
    } else {
        for (size_t i = 0; i < nx; i++) d->x[i] = to_half(c->f16, rng_unit(&s) * (1.0 + (double)(i % 7)));
        const double scale = 1.0 / sqrt((double)c->K);
        double *g = malloc((size_t)c->K * sizeof(double));
        for (int k = 0; k < c->K; k++)
            g[k] = c->rms ? from_half(c->f16, to_half(c->f16, 1.0 + 0.25 * rng_unit(&s))) : 1.0;
        for (int n = 0; n < c->N; n++) {
            const int row = c->rev ? c->N - 1 - n : n; /* where output n's weights are uploaded */
            for (int k = 0; k < c->K; k++) {
                const double w = from_half(c->f16, to_half(c->f16, rng_unit(&s) * scale));
                const uint16_t folded = to_half(c->f16, w * g[k]);
                d->w[(size_t)row * c->K + k] = folded;
                d->wmodel[(size_t)n * c->K + k] = from_half(c->f16, folded);
            }
        }
        free(g);
    }
    d->out_bytes = (size_t)c->rows * c->N * (c->out16 ? 2 : 4);
    const int ok = cu_ok(r, r->api.cuMemAlloc(&d->dx, nx * 2), "cuMemAlloc") &&
                   cu_ok(r, r->api.cuMemAlloc(&d->dw, nw * 2), "cuMemAlloc") &&
                   cu_ok(r, r->api.cuMemAlloc(&d->dout, d->out_bytes), "cuMemAlloc") &&
                   cu_ok(r, r->api.cuMemAlloc(&d->dinv, (size_t)c->rows * 4), "cuMemAlloc") &&
                   cu_ok(r, r->api.cuMemcpyHtoD(d->dx, d->x, nx * 2), "cuMemcpyHtoD") &&
                   cu_ok(r, r->api.cuMemcpyHtoD(d->dw, d->w, nw * 2), "cuMemcpyHtoD");
    return ok ? 0 : -1;
}

/* the tensor maps of case c over d's buffers (x: boxes of 128 rows, w: of BN, of BN / 2 in clusters of two) */
static int maps(runner *r, const g90_case *c, g90_data *d)
{
    return tensor_map(r, &d->ta, d->dx, c->f16, c->K, c->rows, 128) &&
           tensor_map(r, &d->tb, d->dw, c->f16, c->K, c->N, c->cluster == 2 ? c->bn / 2 : c->bn);
}

static void teardown(runner *r, g90_data *d)
{
    r->api.cuMemFree(d->dx);
    r->api.cuMemFree(d->dw);
    r->api.cuMemFree(d->dout);
    r->api.cuMemFree(d->dinv);
    free(d->x);
    free(d->w);
    free(d->wmodel);
}

static int launch(runner *r, const g90_case *c, int index, g90_data *d, int T)
{
    char name[32];
    snprintf(name, sizeof name, "g90_%d", index);
    krt_cu_fn fn;
    if (!cu_ok(r, r->api.cuModuleGetFunction(&fn, r->mod, name), name)) return -1;
    const int smem = kcu_g90_smem_bytes(c->bn, c->st);
    if (!cu_ok(r, r->api.cuFuncSetAttribute(fn, KRT_CU_FUNC_MAX_DYNAMIC_SHARED_BYTES, smem), "cuFuncSetAttribute"))
        return -1;
    if (c->rms) { /* the pre-pass: 1 / rms of each row into dinv */
        char inv_name[40];
        snprintf(inv_name, sizeof inv_name, "g90_%d_inv", index);
        krt_cu_fn inv_fn;
        float eps = 1e-5f;
        void *inv_params[] = {&T, &d->dx, &eps, &d->dinv, NULL};
        if (!cu_ok(r, r->api.cuModuleGetFunction(&inv_fn, r->mod, inv_name), inv_name) ||
            !cu_ok(r, r->api.cuLaunchKernel(inv_fn, (unsigned)(T + 7) / 8, 1, 1, 256, 1, 1, 0, NULL, inv_params, NULL),
                   "cuLaunchKernel"))
            return -1;
    }
    void *params[] = {&T, &d->ta, &d->tb, &d->dout, &d->dinv, NULL};
    return cu_ok(r,
                 c->cluster == 2 ? r->api.cuLaunchKernel(fn, 2, (unsigned)(T + 255) / 256, (unsigned)(c->N + c->bn - 1) / c->bn,
                                                         384, 1, 1, (unsigned)smem, NULL, params, NULL)
                                 : r->api.cuLaunchKernel(fn, (unsigned)(T + 127) / 128, (unsigned)(c->N + c->bn - 1) / c->bn, 1,
                                                         384, 1, 1, (unsigned)smem, NULL, params, NULL),
                 "cuLaunchKernel")
               ? 0
               : -1;
}

/* The exact output (t, n) and sum_k |x w| (scaled by the row's 1/rms with rms). */
static double reference(const g90_case *c, const g90_data *d, int t, int n, double *mag)
{
    const uint16_t *xr = d->x + (size_t)t * c->K;
    double sum = 0.0, m = 0.0, ss = 0.0;
    for (int k = 0; k < c->K; k++) {
        const double wv = d->wmodel ? d->wmodel[(size_t)n * c->K + k] : from_half(c->f16, d->w[(size_t)n * c->K + k]);
        const double xv = from_half(c->f16, xr[k]), p = xv * wv;
        sum += p, m += fabs(p), ss += xv * xv;
    }
    const double inv = c->rms ? 1.0 / sqrt(ss / c->K + 1e-5) : 1.0;
    *mag = m * inv;
    return sum * inv;
}

static double out_at(const g90_case *c, const void *out, size_t i)
{
    if (c->out16) return ks_bf16_to_f32(((const uint16_t *)out)[i]);
    return ((const float *)out)[i];
}

/* Run case index at T twice (outputs poisoned before each); compare every output
 * (sample: some), the rows past T untouched, the two runs bitwise equal. */
static void check_run(runner *r, const g90_case *c, int index, g90_data *d, int T, int sample)
{
    char what[160];
    snprintf(what, sizeof what, "%s K=%d N=%d BN=%d STAGES=%d T=%d%s%s%s%s", c->f16 ? "f16" : "bf16", c->K, c->N,
             c->bn, c->st, T, c->rms ? " rms" : "", c->rev ? " permuted" : "", c->out16 ? " bf16-out" : "",
             c->cluster == 2 ? " cluster-2" : "");
    unsigned char *a = malloc(d->out_bytes), *b = malloc(d->out_bytes);
    int ok = a && b && r->api.cuMemsetD8(d->dout, 0xff, d->out_bytes) == 0 && launch(r, c, index, d, T) == 0 &&
             cu_ok(r, r->api.cuStreamSynchronize(NULL), "run") &&
             r->api.cuMemcpyDtoH(a, d->dout, d->out_bytes) == 0 && r->api.cuMemsetD8(d->dout, 0xff, d->out_bytes) == 0 &&
             launch(r, c, index, d, T) == 0 && cu_ok(r, r->api.cuStreamSynchronize(NULL), "run") &&
             r->api.cuMemcpyDtoH(b, d->dout, d->out_bytes) == 0;
    if (!check_at(ok, __FILE__, __LINE__, "%s: launch", what)) {
        free(a), free(b);
        return;
    }
    const size_t es = c->out16 ? 2 : 4;
    double worst = 0.0, num = 0.0, den = 0.0;
    int bad = 0, untouched = 1;
    uint64_t s = 77;
    const long samples = sample ? 400 : (long)T * c->N;
    for (long i = 0; i < samples; i++) {
        const int t = sample ? (int)(rng_next(&s) % (uint64_t)T) : (int)(i / c->N);
        const int n = sample ? (int)(rng_next(&s) % (uint64_t)c->N) : (int)(i % c->N);
        double mag;
        const double ref = reference(c, d, t, n, &mag), v = out_at(c, a, (size_t)t * c->N + n);
        if (!isfinite(v)) {
            bad++;
            continue;
        }
        const double e = fabs(v - ref) / (mag > 0 ? mag : 1.0);
        if (e > worst) worst = e;
        num += (v - ref) * (v - ref), den += ref * ref;
    }
    for (size_t i = (size_t)T * c->N * es; i < d->out_bytes; i++) untouched &= a[i] == 0xff;
    int same = memcmp(a, b, d->out_bytes) == 0;
    for (int again = 0; !sample && again < 4 && same; again++) /* a race shows as runs that differ */
        same = r->api.cuMemsetD8(d->dout, 0xff, d->out_bytes) == 0 && launch(r, c, index, d, T) == 0 &&
               r->api.cuMemcpyDtoH(b, d->dout, d->out_bytes) == 0 && memcmp(a, b, d->out_bytes) == 0;
    const double l2 = den > 0 ? sqrt(num / den) : sqrt(num);
    /* f32 sums (wgmma accumulates in about f32); a bf16 output rounds at 2^-9 */
    const double tol = c->out16 ? 8e-3 : 2e-5;
    const int pass = bad == 0 && worst <= tol && untouched && same;
    printf("%s %s: worst error %.2e of sum|x w| (relative L2 %.2e)%s%s%s%s\n", pass ? "ok  " : "FAIL", what, worst, l2,
           sample ? ", sampled" : "", bad ? ", outputs not written or not finite" : "",
           untouched ? "" : ", rows past T written", same ? "" : ", two runs differ");
    CHECK_MSG(pass, "%s", what);
    free(a), free(b);
}

/* ms per launch: two warm-up launches, then the median of 5 batches of reps launches */
static double time_run(runner *r, const g90_case *c, int index, g90_data *d, int T)
{
    krt_cu_event e0, e1;
    if (!cu_ok(r, r->api.cuEventCreate(&e0, 0), "cuEventCreate") ||
        !cu_ok(r, r->api.cuEventCreate(&e1, 0), "cuEventCreate"))
        return -1;
    const double flop = 2.0 * T * (double)c->N * c->K;
    const int reps = (int)(3e-3 / (flop / 600e12)) + 2; /* about 3 ms a batch */
    double ms[5];
    int ok = launch(r, c, index, d, T) == 0 && launch(r, c, index, d, T) == 0;
    for (int b = 0; ok && b < 5; b++) {
        r->api.cuEventRecord(e0, NULL);
        for (int i = 0; i < reps; i++) ok &= launch(r, c, index, d, T) == 0;
        r->api.cuEventRecord(e1, NULL);
        float f = 0;
        ok &= cu_ok(r, r->api.cuStreamSynchronize(NULL), "cuStreamSynchronize") &&
              cu_ok(r, r->api.cuEventElapsedTime(&f, e0, e1), "cuEventElapsedTime");
        ms[b] = f / reps;
    }
    r->api.cuEventDestroy(e0);
    r->api.cuEventDestroy(e1);
    if (!ok) return -1;
    for (int i = 0; i < 5; i++) /* sort: the median is ms[2] */
        for (int j = i + 1; j < 5; j++)
            if (ms[j] < ms[i]) {
                const double t = ms[i];
                ms[i] = ms[j], ms[j] = t;
            }
    return ms[2];
}

static int gpu_main(const char *cubin_path)
{
    g90_case all[N_ALL];
    all_cases(all);
    runner r = {0};
    ks_diag d = {0};
    size_t len = 0;
    char *cubin = ks_read_file(&d, cubin_path, &len);
    krt_cu_device dev;
    if (!cubin || krt_cuda_api_load(&r.api, &d) != 0) return 1;
    if (!r.api.cuTensorMapEncodeTiled || !r.api.cuFuncSetAttribute) {
        fprintf(stderr, "the driver has no cuTensorMapEncodeTiled\n");
        return 1;
    }
    if (!cu_ok(&r, r.api.cuInit(0), "cuInit") || !cu_ok(&r, r.api.cuDeviceGet(&dev, 0), "cuDeviceGet") ||
        !cu_ok(&r, r.api.cuDevicePrimaryCtxRetain(&r.ctx, dev), "cuDevicePrimaryCtxRetain") ||
        !cu_ok(&r, r.api.cuCtxSetCurrent(r.ctx), "cuCtxSetCurrent") ||
        !cu_ok(&r, r.api.cuModuleLoadData(&r.mod, cubin), "cuModuleLoadData"))
        return 1;
    /* the timed cases of one shape (consecutive in all[]) share their operands */
    g90_data data;
    int have = 0;
    for (int i = 0; i < N_ALL; i++) {
        const g90_case *c = &all[i];
        const double t0 = now_s();
        if (!have && !CHECK_MSG(setup(&r, c, 1000 + (uint64_t)i, &data) == 0, "case %d: setup", i)) {
            teardown(&r, &data);
            continue;
        }
        have = 1;
        if (CHECK_MSG(maps(&r, c, &data), "case %d: tensor maps", i)) {
            for (int j = 0; j < c->nt; j++) {
                const int T = c->T[j];
                check_run(&r, c, i, &data, T, c->what != NULL || (long)T * c->N * c->K > 2000000000L);
                if (!c->what) continue;
                const double ms = time_run(&r, c, i, &data, T);
                printf("TIME %s %d %d %d %d %d %.4f %.1f\n", c->what, T, c->K, c->N, c->bn, c->st, ms,
                       ms > 0 ? 2.0 * T * (double)c->N * c->K / (ms * 1e-3) / 1e12 : 0.0);
            }
        }
        if (i + 1 == N_ALL || !c->what || all[i + 1].what != c->what) {
            teardown(&r, &data);
            have = 0;
        }
        if (now_s() - t0 > 30) printf("(case %d took %.0f s)\n", i, now_s() - t0);
    }
    r.api.cuModuleUnload(r.mod);
    r.api.cuDevicePrimaryCtxRelease(dev);
    free(cubin);
    return check_finish("cuda_gemm90_check");
}

/* NVRTC: the kernels for sm_90a (into path when not NULL). */
static int compile_main(const char *path)
{
    g90_case all[N_ALL];
    all_cases(all);
    ks_buf src = {0}, cubin = {0};
    program_source(all, N_ALL, &src);
    ks_diag d = {0};
    const double t0 = now_s();
    const int rc = kcu_compile(ks_buf_cstr(&src), "gemm90_check.cu", "sm_90a", &cubin, &d);
    printf("%s NVRTC sm_90a: %d kernels, %.1f s\n", rc == 0 ? "ok  " : "FAIL", N_ALL, now_s() - t0);
    CHECK_MSG(rc == 0, "NVRTC compiles kcu_gemm90 for sm_90a");
    if (rc == 0 && path) {
        FILE *f = fopen(path, "wb");
        CHECK_MSG(f && fwrite(cubin.data, 1, cubin.len, f) == cubin.len && fclose(f) == 0, "writing %s", path);
    }
    if (!path) {
        printf("not run here (wgmma and TMA have no CPU stand-in; `--gpu CUBIN` runs them on an sm_90 GPU):");
        for (int i = 0; i < N_ALL; i++)
            printf("%s g90_%d (%s K=%d N=%d BN=%d STAGES=%d%s%s)", i % 2 ? "" : "\n ", i, all[i].f16 ? "f16" : "bf16",
                   all[i].K, all[i].N, all[i].bn, all[i].st, all[i].rms ? " rms" : "", all[i].rev ? " permuted" : "");
        printf("\n");
    }
    ks_buf_free(&src);
    ks_buf_free(&cubin);
    return check_finish("cuda_gemm90_check");
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 3 && strcmp(argv[1], "--gpu") == 0) return gpu_main(argv[2]);
    if (argc == 3 && strcmp(argv[1], "--compile") == 0) return compile_main(argv[2]);
    if (argc != 1) {
        fprintf(stderr, "usage: cuda_gemm90_check [--compile CUBIN | --gpu CUBIN]\n");
        return 2;
    }
    if (!kcu_have_nvrtc()) {
        printf("skipped: needs NVRTC\n");
        return 77;
    }
    return compile_main(NULL);
}
