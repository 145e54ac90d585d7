/*
 * kcu_prelude.cuh — the device code every generated source starts with
 * (codegen/cuda/kcu_emit.c copies it in verbatim; CMake embeds this file as
 * kcu_prelude[]). The kernels kiln generates are small extern "C" wrappers
 * that instantiate these templates with their shapes as constants.
 *
 * Compiles three ways: NVRTC (kiln build), nvcc (a check of --emit-source),
 * and g++ with tests/cuda/emu_shim.h for the CPU emulator, which runs every
 * thread of a block as a coroutine switched at __syncthreads(): so block-wide
 * steps go through shared memory and barriers that every thread reaches,
 * never warp shuffles.
 *
 * Weights come as f32, bf16 or f16 (kcu_bf16 and kcu_f16 hold the bits);
 * everything is computed in f32. Results do not depend on timing: every sum
 * has one fixed order (no atomics).
 */

/* ---- element types ----------------------------------------------------------------- */
struct kcu_bf16 {
    unsigned short bits; /* bfloat16: the high half of an f32 */
};
struct kcu_f16 {
    unsigned short bits; /* IEEE binary16 */
};

__device__ __forceinline__ float kcu_f(float v) { return v; }
__device__ __forceinline__ float kcu_f(kcu_bf16 v) { return __uint_as_float((unsigned int)v.bits << 16); }

/* binary16 bits (the low 16 of h) to f32, exactly */
__device__ __forceinline__ float kcu_half_bits(unsigned int h)
{
#ifdef __CUDA_ARCH__
    float f;
    const unsigned short s = (unsigned short)h;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(s));
    return f;
#else
    const unsigned int sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (m << 13)); /* inf, nan */
    if (e == 0u) {                                                          /* zero, subnormal: m * 2^-24 */
        const float v = (float)m * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
#endif
}
__device__ __forceinline__ float kcu_f(kcu_f16 v) { return kcu_half_bits(v.bits); }

/* ---- 16-byte loads of weights ---------------------------------------------------------- */
/* kcu_vec<W>: N elements of W in one 16-byte load, as floats. p must be
 * 16-byte aligned. */
template <typename W> struct kcu_vec;
template <> struct kcu_vec<float> {
    enum { N = 4 };
    static __device__ __forceinline__ void load(const float *p, float *o)
    {
        const float4 v = __ldg(reinterpret_cast<const float4 *>(p));
        o[0] = v.x, o[1] = v.y, o[2] = v.z, o[3] = v.w;
    }
};
template <> struct kcu_vec<kcu_bf16> {
    enum { N = 8 };
    static __device__ __forceinline__ void load(const kcu_bf16 *p, float *o)
    {
        const uint4 v = __ldg(reinterpret_cast<const uint4 *>(p));
        const unsigned int u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; j++) { /* element 2j is the low half (little-endian) */
            o[2 * j] = __uint_as_float(u[j] << 16);
            o[2 * j + 1] = __uint_as_float(u[j] & 0xffff0000u);
        }
    }
};
template <> struct kcu_vec<kcu_f16> {
    enum { N = 8 };
    static __device__ __forceinline__ void load(const kcu_f16 *p, float *o)
    {
        const uint4 v = __ldg(reinterpret_cast<const uint4 *>(p));
        const unsigned int u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            o[2 * j] = kcu_half_bits(u[j] & 0xffffu);
            o[2 * j + 1] = kcu_half_bits(u[j] >> 16);
        }
    }
};
/* kcu_chunk<W, VEC>: VEC consecutive weights as floats; VEC 1 is a plain load. */
template <typename W, int VEC> struct kcu_chunk {
    static __device__ __forceinline__ void load(const W *p, float *o) { kcu_vec<W>::load(p, o); }
};
template <typename W> struct kcu_chunk<W, 1> {
    static __device__ __forceinline__ void load(const W *p, float *o) { o[0] = kcu_f(p[0]); }
};

/* ---- dot products (attention) ----------------------------------------------------------- */
/* eight partial sums, partial k % 8 taking product k, added in a fixed tree */
__device__ inline float kcu_dot(const float *a, const float *__restrict__ b, int n)
{
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int i = 0;
    for (; i + 8 <= n; i += 8)
#pragma unroll
        for (int l = 0; l < 8; l++) acc[l] += a[i + l] * b[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* ---- matmul: out[t, n] = sum_k x[t, k] w[n, k] ------------------------------------------
 *
 * One kernel for every T; launched on GRID blocks of KCU_MM_THREADS (a
 * number fixed by the shapes, not by T). Two ways, chosen by T:
 *
 *  T <= KCU_GEMV_T (decode): memory-bound, so each weight is read once, 16
 *  bytes at a time. Each warp computes KCU_GEMV_R rows for all T tokens on
 *  its own (no block-wide step): lane l takes chunks l, l + 32, ... of VEC
 *  weights of each row (sum in chunk order, fused multiply-adds), then the
 *  warp adds its 32 partial sums in a butterfly of shuffles (a fixed tree
 *  that leaves the same total in every lane).
 *
 *  T > KCU_GEMV_T (prefill): tiles of 64 tokens x 64 rows, K in steps of 32
 *  staged through shared memory (weights converted to f32 there); each
 *  thread owns 4 x 4 outputs and sums over k in order. Blocks take tiles
 *  blockIdx.x, blockIdx.x + GRID, ...
 *
 * Each output is summed in an order fixed by its own position: a token's
 * logits depend on whether its step had more than KCU_GEMV_T tokens, never
 * on timing.
 */
enum { KCU_MM_THREADS = 256, KCU_GEMV_T = 8, KCU_GEMV_R = 2 };

template <typename W, int K, int N>
static __device__ __forceinline__ void kcu_matmul(const int T, const float *__restrict__ x, const W *__restrict__ w,
                                                  float *__restrict__ out)
{
    enum {
        B = KCU_MM_THREADS,
        R = KCU_GEMV_R,
        GT = KCU_GEMV_T,
        VEC = (K * sizeof(W)) % 16 == 0 ? (int)kcu_vec<W>::N : 1, /* rows 16-byte aligned: vector loads */
        CHUNKS = K / VEC,
        RPB = B / 32 * R, /* rows per block in the decode path */
        GRID = (N + RPB - 1) / RPB,
        BM = 64,
        BN = 64,
        BK = 32,
        P = BM + 4 /* row pitch of the tiles in shared memory: rows stay 16-byte aligned */
    };
    const int tid = threadIdx.x;

    if (T <= GT) {
        const int lane = tid % 32, n0 = blockIdx.x * RPB + tid / 32 * R;
        float acc[R][GT];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < GT; t++) acc[r][t] = 0.0f;
#pragma unroll 4
        for (int c = lane; c < CHUNKS; c += 32) {
            const int k = c * VEC;
            float wv[R][VEC];
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (n0 + r < N) {
                    kcu_chunk<W, VEC>::load(w + (long long)(n0 + r) * K + k, wv[r]);
                } else {
#pragma unroll
                    for (int j = 0; j < VEC; j++) wv[r][j] = 0.0f;
                }
            }
#pragma unroll
            for (int t = 0; t < GT; t++) {
                if (t < T) {
                    float xv[VEC];
#pragma unroll
                    for (int j = 0; j < VEC; j++) xv[j] = x[(long long)t * K + k + j];
#pragma unroll
                    for (int r = 0; r < R; r++)
#pragma unroll
                        for (int j = 0; j < VEC; j++) acc[r][t] = fmaf(xv[j], wv[r][j], acc[r][t]);
                }
            }
        }
        /* the warp's 32 partial sums of each (row, token); lane r * GT + t writes it */
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < GT; t++) {
                if (t < T) {
                    float v = acc[r][t];
#pragma unroll
                    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
                    if (lane == r * GT + t && n0 + r < N) out[(long long)t * N + n0 + r] = v;
                }
            }
        return;
    }

    __shared__ float4 smem4[2 * BK * P / 4];
    float *const smem = reinterpret_cast<float *>(smem4);
    float(*xs)[P] = reinterpret_cast<float(*)[P]>(smem);          /* [BK][P]: x tile, k-major */
    float(*ws)[P] = reinterpret_cast<float(*)[P]>(smem + BK * P); /* [BK][P]: w tile, k-major */
    const int tx = tid % 16, ty = tid / 16;
    const int tiles_n = (N + BN - 1) / BN, tiles = tiles_n * ((T + BM - 1) / BM);
    for (int tile = blockIdx.x; tile < tiles; tile += GRID) {
        const long long row0 = (long long)(tile / tiles_n) * BM;
        const int col0 = (tile % tiles_n) * BN;
        float acc[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
        for (int k0 = 0; k0 < K; k0 += BK) {
#pragma unroll
            for (int i = 0; i < BM * BK / B; i++) {
                const int e = tid + i * B, m = e / BK, kk = e % BK;
                xs[kk][m] = row0 + m < T && k0 + kk < K ? x[(row0 + m) * K + k0 + kk] : 0.0f;
            }
            if (VEC > 1 && k0 + BK <= K) {
#pragma unroll
                for (int i = 0; i < (BN * BK / VEC + B - 1) / B; i++) {
                    const int e = tid + i * B, c = e / (BK / VEC), kk = e % (BK / VEC) * VEC;
                    if (e >= BN * BK / VEC) break;
                    float v[VEC];
                    if (col0 + c < N) {
                        kcu_chunk<W, VEC>::load(w + (long long)(col0 + c) * K + k0 + kk, v);
                    } else {
#pragma unroll
                        for (int j = 0; j < VEC; j++) v[j] = 0.0f;
                    }
#pragma unroll
                    for (int j = 0; j < VEC; j++) ws[kk + j][c] = v[j];
                }
            } else {
#pragma unroll
                for (int i = 0; i < BN * BK / B; i++) {
                    const int e = tid + i * B, c = e / BK, kk = e % BK;
                    ws[kk][c] = col0 + c < N && k0 + kk < K ? kcu_f(w[(long long)(col0 + c) * K + k0 + kk]) : 0.0f;
                }
            }
            __syncthreads();
#pragma unroll 8
            for (int kk = 0; kk < BK; kk++) {
                const float4 a = *reinterpret_cast<const float4 *>(&xs[kk][ty * 4]);
                const float4 b = *reinterpret_cast<const float4 *>(&ws[kk][tx * 4]);
                const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int j = 0; j < 4; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
            }
            __syncthreads();
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const long long t = row0 + ty * 4 + i;
            if (t >= T) break;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int c = col0 + tx * 4 + j;
                if (c < N) out[t * N + c] = acc[i][j];
            }
        }
    }
}
