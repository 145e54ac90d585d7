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
 * so do activations and the KV cache: each value in its IR dtype (f32, or
 * bf16/f16 with --precision fast). Every load converts to f32 (kcu_f), all
 * arithmetic is f32, and every store of a half value rounds to nearest even
 * (kcu_put) as the interpreter does. Results do not depend on timing: every
 * sum has one fixed order (no atomics).
 */

/* A function compiled once and called (a fused kernel's epilogue: inlined
 * at every call site of the matmul it would multiply the compile time). */
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define KCU_NOINLINE __noinline__
#else
#define KCU_NOINLINE __attribute__((noinline))
#endif

/* Every generated kernel's first statement (kcu_gen.c writes it): on sm_90 and later, wait until
 * the kernel before it in the stream has finished and its writes are visible
 * (griddepcontrol.wait), then let the kernel after it start (launch_dependents). The runtime
 * launches an engine's kernels with programmatic stream serialization (krt_cuda_meta.pdl), so a
 * kernel's blocks take the SMs its predecessor's last blocks leave idle and are past their launch
 * when it ends; nothing before the wait touches memory, so the order of every read and write is
 * the stream's. Not even loads of weights, which no kernel writes: kcu_matmul_tc once issued its
 * ring's first cp.async copies of them before the wait, and its engines' fast logits came out
 * wrong on the H100 and the H200 with the kernels overlapping (max|d|/max|ref| 0.4-1.5 against the
 * interpreter, 1e-7 without the overlap, with the copies after the wait, or with no kernel letting
 * the next start early: gpu_check's variants stage, bench/RESULTS.md #11, 2026-12-06).
 * Launched plainly, the wait returns at once. Elsewhere (sm_80, the CPU emulator) a no-op. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define KCU_PDL_ENTER() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define KCU_PDL_ENTER() ((void)0)
#endif

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

/* the bits of an f32 */
__device__ __forceinline__ unsigned kcu_bits(float f)
{
#ifdef __CUDACC__
    return __float_as_uint(f);
#else
    unsigned u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

/* f rounded to nearest even, as bfloat16 and binary16 bits: support/numbers.c's
 * ks_f32_to_bf16 and ks_f32_to_f16 step for step (integer arithmetic, not the
 * GPU's cvt, whose NaNs differ), so that a value is stored with the bits the
 * interpreter gives it: NaN stays a quiet NaN of its sign, f16 overflows to
 * inf from 65520 up, and its subnormals round to nearest even. */
__device__ __forceinline__ unsigned short kcu_bf16_bits(float f)
{
    unsigned u = kcu_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u); /* quiet NaN */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    /* the same bits for every other f32 (nearest even, subnormals kept, inf from the top), one F2FP
     * where the integer steps take five: the stores of a fused epilogue are many */
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#else
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
#endif
}
__device__ __forceinline__ unsigned short kcu_f16_bits(float f)
{
    const unsigned u = kcu_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
#if defined(__CUDA_ARCH__)
    if (a <= 0x7f800000u) { /* not NaN: the same bits as the steps below (nearest even, subnormals, inf) */
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
        return h;
    }
#endif
    if (a > 0x7f800000u) return (unsigned short)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u); /* rounds to inf */
    if (a < 0x38800000u) { /* subnormal half: a / 2^-24 to nearest even */
        const float v = __uint_as_float(a) * 16777216.0f;
        unsigned m = (unsigned)v;
        const float r = v - (float)m;
        if (r > 0.5f || (r == 0.5f && (m & 1u))) m++;
        return (unsigned short)(sign | m);
    }
    unsigned h = (((a >> 23) - 112u) << 10) | ((a & 0x7fffffu) >> 13);
    const unsigned rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return (unsigned short)(sign | h);
}

/* The one store of a computed value: *p = v in p's dtype (half: rounded to nearest even). */
__device__ __forceinline__ void kcu_put(float *p, float v) { *p = v; }
__device__ __forceinline__ void kcu_put(kcu_bf16 *p, float v) { p->bits = kcu_bf16_bits(v); }
__device__ __forceinline__ void kcu_put(kcu_f16 *p, float v) { p->bits = kcu_f16_bits(v); }

/* v as a value of dtype T holds it (rounded once, as kcu_put stores it), as an f32: what a
 * fused kernel keeps in registers of a half value it also stores or hands on. */
template <typename T> __device__ __forceinline__ float kcu_round(float v) { return v; }
template <> __device__ __forceinline__ float kcu_round<kcu_bf16>(float v)
{
    return __uint_as_float((unsigned)kcu_bf16_bits(v) << 16);
}
template <> __device__ __forceinline__ float kcu_round<kcu_f16>(float v) { return kcu_half_bits(kcu_f16_bits(v)); }
/* The store of a bf16 value v already holds (kcu_round<kcu_bf16>): its high bits, which are what
 * kcu_put would store (kcu_bf16_bits gives a bf16 value's bits back, NaNs included). */
__device__ __forceinline__ void kcu_put_held(kcu_bf16 *p, float v) { p->bits = (unsigned short)(kcu_bits(v) >> 16); }

/* Two neighbouring half elements p[0], p[1] (p 4-byte aligned) as floats, one 32-bit load; and
 * kcu_put (kcu_put_held) of two neighbouring values there, one 32-bit store: the fused epilogue's
 * neighbour pairs (kcu_emit_group.c, range_neighbours). */
__device__ __forceinline__ void kcu_get2(const kcu_bf16 *p, float *o)
{
    const unsigned u = *reinterpret_cast<const unsigned *>(p);
    o[0] = __uint_as_float(u << 16), o[1] = __uint_as_float(u & 0xffff0000u);
}
__device__ __forceinline__ void kcu_get2(const kcu_f16 *p, float *o)
{
    const unsigned u = *reinterpret_cast<const unsigned *>(p);
    o[0] = kcu_half_bits(u & 0xffffu), o[1] = kcu_half_bits(u >> 16);
}
__device__ __forceinline__ void kcu_put2(kcu_bf16 *p, float a, float b)
{
    *reinterpret_cast<unsigned *>(p) = (unsigned)kcu_bf16_bits(a) | (unsigned)kcu_bf16_bits(b) << 16;
}
__device__ __forceinline__ void kcu_put2(kcu_f16 *p, float a, float b)
{
    *reinterpret_cast<unsigned *>(p) = (unsigned)kcu_f16_bits(a) | (unsigned)kcu_f16_bits(b) << 16;
}
__device__ __forceinline__ void kcu_put2_held(kcu_bf16 *p, float a, float b)
{
    *reinterpret_cast<unsigned *>(p) = kcu_bits(a) >> 16 | (kcu_bits(b) & 0xffff0000u);
}

/* kcu_put (kcu_put_held) of v at element i of base where base is not null, else nothing: the
 * address and the bits worked out either way, the store alone under the test (a predicated
 * st.global: ptxas had jumped around each whole store, and the branches kept the rows of a
 * hand-off apart, so that their dependent steps ran one row at a time). The fused epilogue's
 * merged stores (kcu_emit_group.c, put_stores). */
__device__ __forceinline__ void kcu_put_bits_at(unsigned short *base, long long i, unsigned short b)
{
#ifdef __CUDA_ARCH__
    asm volatile("{\n.reg .pred p;\n.reg .u64 a;\nsetp.ne.u64 p, %0, 0;\ncvta.to.global.u64 a, %1;\n"
                 "@p st.global.b16 [a], %2;\n}\n" ::"l"(base),
                 "l"(reinterpret_cast<unsigned long long>(base) + 2ull * (unsigned long long)i), "h"(b));
#else
    if (base) base[i] = b;
#endif
}
__device__ __forceinline__ void kcu_put_at(float *base, long long i, float v)
{
#ifdef __CUDA_ARCH__
    asm volatile("{\n.reg .pred p;\n.reg .u64 a;\nsetp.ne.u64 p, %0, 0;\ncvta.to.global.u64 a, %1;\n"
                 "@p st.global.f32 [a], %2;\n}\n" ::"l"(base),
                 "l"(reinterpret_cast<unsigned long long>(base) + 4ull * (unsigned long long)i), "f"(v));
#else
    if (base) base[i] = v;
#endif
}
__device__ __forceinline__ void kcu_put_at(kcu_bf16 *base, long long i, float v)
{
    kcu_put_bits_at(reinterpret_cast<unsigned short *>(base), i, kcu_bf16_bits(v));
}
__device__ __forceinline__ void kcu_put_at(kcu_f16 *base, long long i, float v)
{
    kcu_put_bits_at(reinterpret_cast<unsigned short *>(base), i, kcu_f16_bits(v));
}
__device__ __forceinline__ void kcu_put_held_at(kcu_bf16 *base, long long i, float v)
{
    kcu_put_bits_at(reinterpret_cast<unsigned short *>(base), i, (unsigned short)(kcu_bits(v) >> 16));
}

/* silu(x) = x / (1 + exp(-x)) for half-precision math (fast precision's SwiGLU, whose value is
 * rounded to bf16 or f16 next): the SFU's exp2 and reciprocal (relative error about 2^-21)
 * where expf and the IEEE division took about 18 instructions with a slow-path call (the gate/up
 * epilogue's largest share, cuobjdump). The interpreter's expf and division differ by a few f32
 * ulps. Where exp(-x) overflows (x < -88) the reciprocal is 0 and silu -0, as x / inf. */
/* clamp's bounds (ir/ops.def), one side each: NaN stays NaN (no comparison holds), as the interpreter */
__device__ __forceinline__ float kcu_clamp_lo(float v, float lo) { return v < lo ? lo : v; }
__device__ __forceinline__ float kcu_clamp_hi(float v, float hi) { return v > hi ? hi : v; }
__device__ __forceinline__ float kcu_silu_half(float x)
{
#ifdef __CUDA_ARCH__
    return __fdividef(x, 1.0f + __expf(-x));
#else
    return x / (1.0f + expf(-x));
#endif
}

/* sin and cos of an f32 angle for half-precision math (fast precision's RoPE, whose values are
 * rounded to bf16 or f16 next): the angle less the nearest multiple of 2 pi (2 pi in two f32
 * parts, each product fused: exact to about 2e-7 for |angle| < 2^20), then the SFU's sine and
 * cosine on [-pi, pi] (absolute error 2^-21.4): about 10 instructions where sincosf's full-range
 * reduction took about 40 and a slow path (measured: a third of q,k,v's epilogue samples). The
 * interpreter's cosf, sinf differ by at most about 1e-6. */
__device__ __forceinline__ void kcu_sincos_half(float angle, float *s, float *c)
{
    const float k = rintf(angle * 0.159154943f);
    float r = fmaf(-k, 6.28318548f, angle); /* f32(2 pi) */
    r = fmaf(-k, -1.74845553e-7f, r);       /* 2 pi - f32(2 pi) */
#ifdef __CUDA_ARCH__
    __sincosf(r, s, c);
#else
    *s = sinf(r), *c = cosf(r);
#endif
}

/* kcu_pick<C, A, B>::T: A when C, else B */
template <bool C, typename A, typename B> struct kcu_pick {
    typedef A T;
};
template <typename A, typename B> struct kcu_pick<false, A, B> {
    typedef B T;
};
/* kcu_same<A, B>::V: 1 when A and B are one type */
template <typename A, typename B> struct kcu_same {
    enum { V = 0 };
};
template <typename A> struct kcu_same<A, A> {
    enum { V = 1 };
};

/* ---- 16-byte loads of weights ---------------------------------------------------------- */
/* kcu_vec<W>: N elements of W in one 16-byte load, as floats: load reads them
 * (p 16-byte aligned, through the read-only path), unpack converts 16 bytes
 * already loaded (from any memory). */
template <typename W> struct kcu_vec;
template <> struct kcu_vec<float> {
    enum { N = 4 };
    static __device__ __forceinline__ void unpack(const uint4 &v, float *o)
    {
        o[0] = __uint_as_float(v.x), o[1] = __uint_as_float(v.y), o[2] = __uint_as_float(v.z),
        o[3] = __uint_as_float(v.w);
    }
    static __device__ __forceinline__ void load(const float *p, float *o)
    {
        const float4 v = __ldg(reinterpret_cast<const float4 *>(p));
        o[0] = v.x, o[1] = v.y, o[2] = v.z, o[3] = v.w;
    }
};
template <> struct kcu_vec<kcu_bf16> {
    enum { N = 8 };
    static __device__ __forceinline__ void unpack(const uint4 &v, float *o)
    {
        const unsigned int u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; j++) { /* element 2j is the low half (little-endian) */
            o[2 * j] = __uint_as_float(u[j] << 16);
            o[2 * j + 1] = __uint_as_float(u[j] & 0xffff0000u);
        }
    }
    static __device__ __forceinline__ void load(const kcu_bf16 *p, float *o)
    {
        unpack(__ldg(reinterpret_cast<const uint4 *>(p)), o);
    }
};
template <> struct kcu_vec<kcu_f16> {
    enum { N = 8 };
    static __device__ __forceinline__ void unpack(const uint4 &v, float *o)
    {
        const unsigned int u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            o[2 * j] = kcu_half_bits(u[j] & 0xffffu);
            o[2 * j + 1] = kcu_half_bits(u[j] >> 16);
        }
    }
    static __device__ __forceinline__ void load(const kcu_f16 *p, float *o)
    {
        unpack(__ldg(reinterpret_cast<const uint4 *>(p)), o);
    }
};
/* kcu_xload<VEC>: VEC consecutive activations, 16 bytes a load when VEC is a
 * multiple of 4 (p then 16-byte aligned: rows of K floats with K % VEC == 0);
 * half activations 16 bytes a load when VEC is a multiple of 8 (rows of K
 * halves, K % 8 == 0), else one at a time. */
template <int VEC, typename H> static __device__ __forceinline__ void kcu_xload(const H *__restrict__ p, float *o)
{
    if (VEC % 8 == 0) {
#pragma unroll
        for (int q = 0; q < VEC / 8; q++) kcu_vec<H>::load(p + 8 * q, o + 8 * q);
    } else {
#pragma unroll
        for (int j = 0; j < VEC; j++) o[j] = kcu_f(p[j]);
    }
}
template <int VEC> static __device__ __forceinline__ void kcu_xload(const float *__restrict__ p, float *o)
{
    if (VEC % 4 == 0) {
#pragma unroll
        for (int q = 0; q < VEC / 4; q++) {
            const float4 v = *reinterpret_cast<const float4 *>(p + 4 * q);
            o[4 * q] = v.x, o[4 * q + 1] = v.y, o[4 * q + 2] = v.z, o[4 * q + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int j = 0; j < VEC; j++) o[j] = p[j];
    }
}
/* kcu_chunk<W, VEC>: VEC consecutive weights as floats; VEC 1 is a plain load. */
template <typename W, int VEC> struct kcu_chunk {
    static __device__ __forceinline__ void load(const W *p, float *o) { kcu_vec<W>::load(p, o); }
};
template <typename W> struct kcu_chunk<W, 1> {
    static __device__ __forceinline__ void load(const W *p, float *o) { o[0] = kcu_f(p[0]); }
};

/* ---- matmul prologues: what the matmul reads as x ---------------------------------------
 *
 * A prologue is a functor: prepare(x, T, r0, n) is called by every thread of
 * the block before rows r0 .. r0+n-1 of x (n <= KCU_PRO_ROWS) are read, and
 * may compute per-row statistics into shared memory (it synchronizes the
 * block); then pro(v, t, k) turns x[t, k] = v into what the matmul
 * multiplies, and chunk<VEC>(v, t, k) does the same to VEC consecutive
 * values from k (k a multiple of VEC: the norm's weights 16 bytes a load
 * where they can be). kcu_pro_none reads x as it is; kcu_pro_rms and kcu_pro_ln
 * normalize each row first (a norm fused into the matmul that reads it: the
 * normalized rows are never stored). Row statistics are summed in double in
 * a fixed order (each lane its strided 16-byte chunks, then a butterfly of
 * shuffles: kcu_row_stats), the same whichever decode path takes the row.
 */
enum { KCU_PRO_ROWS = 64, KCU_PRO_WARPS = 8 };

struct kcu_pro_none {
    template <typename X> struct out {
        typedef X T; /* what the matmul multiplies: x itself */
    };
    template <typename X> __device__ __forceinline__ void prepare(const X *__restrict__, int, long long, int) {}
    template <typename X, class Row> __device__ __forceinline__ void prepare_rows(const X *__restrict__, int, const Row &) {}
    __device__ __forceinline__ float operator()(float v, long long, int) const { return v; }
    template <int VEC> __device__ __forceinline__ void chunk(float *, long long, int) const {}
};

__device__ __forceinline__ double kcu_warp_sum(double s)
{
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
    return s;
}

/* Lane lane's sum, in double, of f(v) over the elements v of row xr [K] in its chunks c = lane,
 * lane + 32, ... of V elements each (V: 16 bytes of X when K holds whole 16-byte chunks, else 1), a
 * chunk's elements in order. The loads go first, KCU_STATS_BATCH chunks at a time (16 bytes each
 * where the row is 16-byte aligned, else element by element: the same sum), then their sums: four
 * round trips to L2 for a row of 4096 halves (#11 steps 8 and 9: one, 16 chunks a lane, was slower). */
#ifndef KCU_STATS_BATCH
#define KCU_STATS_BATCH 4 /* the generator defines another with kcu_options.stats_batch (KILN_CUDA_STATS_BATCH); 16
                             (one round trip a row) took q,k,v at T = 1 from 31.9 to 38.0 µs on an H100 (64
                             registers of loads in a kernel bounded to 128: bench/RESULTS.md, #11 step 9) */
#endif
template <int K, typename X, class F>
__device__ __forceinline__ double kcu_lane_sum(const X *__restrict__ xr, int lane, F f)
{
    enum { E = sizeof(X), V = (K * E) % 16 == 0 ? 16 / E : 1, C = K / V, B = KCU_STATS_BATCH };
    double s = 0.0;
    if (V > 1 && (reinterpret_cast<unsigned long long>(xr) & 15) != 0) { /* uniform: the row's alignment */
        for (int c = lane; c < C; c += 32)
#pragma unroll
            for (int j = 0; j < V; j++) s += f(kcu_f(xr[(long long)c * V + j]));
        return s;
    }
#pragma unroll 1
    for (int c0 = 0; c0 < C; c0 += 32 * B) {
        uint4 raw[V > 1 ? B : 1];
        float one[V > 1 ? 1 : B];
#pragma unroll
        for (int b = 0; b < B; b++) {
            const int c = c0 + lane + 32 * b;
            if (c < C) {
                if constexpr (V > 1)
                    raw[b] = *reinterpret_cast<const uint4 *>(xr + (long long)c * V);
                else
                    one[b] = kcu_f(xr[c]);
            }
        }
#pragma unroll
        for (int b = 0; b < B; b++) {
            if (c0 + lane + 32 * b < C) {
                if constexpr (V > 1) {
                    float v[V];
                    kcu_vec<X>::unpack(raw[b], v);
#pragma unroll
                    for (int j = 0; j < V; j++) s += f(v[j]);
                } else {
                    s += f(one[b]);
                }
            }
        }
    }
    return s;
}

/* Per-row mean (LN only) and 1 / sqrt(var + eps) of rows r0 .. r0+n-1 of x
 * [*, K] into mean[], inv[]: warp w takes rows w, w + KCU_PRO_WARPS, ...
 * (blocks have at least KCU_PRO_WARPS warps); each lane sums its chunks
 * (kcu_lane_sum), then a butterfly of shuffles adds the 32 sums. */
template <int K, bool LN, typename X, class Row>
__device__ __forceinline__ void kcu_row_stats_of(const X *__restrict__ x, int n, const Row &row, double eps,
                                                 float *mean, float *inv)
{
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    __syncthreads(); /* the previous rows' statistics are no longer read */
    for (int i = 0; i < n; i += KCU_PRO_WARPS) {
        const int r = i + warp;
        const bool live = warp < KCU_PRO_WARPS && r < n; /* uniform in the warp */
        const X *xr = x + (live ? row(r) : 0) * (long long)K;
        double m = 0.0;
        if (LN) {
            if (live) m = kcu_lane_sum<K>(xr, lane, [](float v) { return (double)v; });
            m = kcu_warp_sum(m) / (double)K;
        }
        double s = 0.0;
        if (live)
            s = kcu_lane_sum<K>(xr, lane, [m](float v) {
                const double d = (double)v - m;
                return d * d;
            });
        s = kcu_warp_sum(s);
        if (live && lane == 0) {
            mean[r] = (float)m;
            inv[r] = (float)(1.0 / sqrt(s / (double)K + eps));
        }
    }
    __syncthreads();
}

/* ... of rows r0 .. r0 + n - 1 (those below T) into mean[0 ..], inv[0 ..]. */
template <int K, bool LN, typename X>
__device__ __forceinline__ void kcu_row_stats(const X *__restrict__ x, int T, long long r0, int n, double eps,
                                              float *mean, float *inv)
{
    const long long below = T - r0;
    kcu_row_stats_of<K, LN>(x, n < below ? n : (int)(below > 0 ? below : 0), [r0](int r) { return r0 + r; }, eps,
                            mean, inv);
}

/* An f8e4m3 code's value (ir/quant.h; NaN codes are never written), and v rounded to e4m3's nearest
 * value, ties to the even code, saturating at 448: ks_e4m3_to_f32(ks_f32_to_e4m3(v)) of the host. */
__device__ __forceinline__ float kcu_e4m3_value(unsigned b)
{
    const unsigned e = (b >> 3) & 15u, m = b & 7u;
    const float v = e ? __uint_as_float(((e + 120u) << 23) | (m << 20)) : (float)m * 0.001953125f;
    return (b & 0x80u) ? -v : v;
}
__device__ __forceinline__ float kcu_e4m3_round(float v)
{
    float a = fabsf(v);
    if (a >= 448.0f) {
        a = 448.0f;
    } else if (a < 0.015625f) { /* subnormal: steps of 2^-9 (the step to 2^-6 lands on the first normal) */
        a = rintf(a * 512.0f) * 0.001953125f;
    } else { /* 3 bits of mantissa, to nearest even */
        unsigned u = __float_as_uint(a);
        u += 0x7FFFFu + ((u >> 20) & 1u);
        a = __uint_as_float(u & 0xFFF00000u);
    }
    return copysignf(a, v);
}

/* x quantized a token at a time (the fp8 and w8a8 matmuls: ir/quant.h's kir_quantize_row):
 * each row's scale s = amax / Q (Q 448: e4m3 values of x / s; Q 127: integers rint(x / s) in
 * [-127, 127]), and what the matmul multiplies is the code times s (a row of zeros stays zeros). */
template <int K, int Q> struct kcu_pro_xq {
    float *scale;  /* shared [KCU_PRO_ROWS], set by prepare */
    long long r0;  /* the first row prepared */
    template <typename X> struct out {
        typedef X T;
    };
    /* each row's amax by the whole block (8 elements a thread at a time; a decode step's one row would
     * keep a single warp busy for K / 32 loads in a row), then the warps' maxima through shared memory */
    template <typename X, class Row> __device__ __forceinline__ void amax_of(const X *__restrict__ x, int n, const Row &row)
    {
        static_assert(K % 8 == 0, "kcu_pro_xq: rows of whole 8-element chunks");
        __shared__ float s_warp[32];
        const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, warps = (int)blockDim.x / 32;
        __syncthreads(); /* the previous rows' scales are no longer read */
        for (int r = 0; r < n; r++) {
            const X *xr = x + (long long)row(r) * K;
            float m = 0.0f;
            for (int c = tid; c < K / 8; c += (int)blockDim.x) {
                float v[8];
                kcu_xload<8>(xr + 8 * c, v);
#pragma unroll
                for (int j = 0; j < 8; j++) m = fmaxf(m, fabsf(v[j]));
            }
#pragma unroll
            for (int s = 16; s > 0; s >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, s));
            if (lane == 0) s_warp[warp] = m;
            __syncthreads();
            if (tid == 0) {
                float t = 0.0f;
                for (int w = 0; w < warps; w++) t = fmaxf(t, s_warp[w]);
                scale[r] = t / (float)Q;
            }
            __syncthreads();
        }
    }
    template <typename X> __device__ __forceinline__ void prepare(const X *__restrict__ x, int T, long long first, int n)
    {
        __shared__ float s_scale[KCU_PRO_ROWS];
        scale = s_scale;
        r0 = first;
        const long long below = T - first;
        amax_of(x, n < below ? n : (int)(below > 0 ? below : 0), [first](int r) { return first + r; });
    }
    template <typename X, class Row> __device__ __forceinline__ void prepare_rows(const X *__restrict__ x, int n, const Row &row)
    {
        __shared__ float s_scale_rows[KCU_PRO_ROWS];
        scale = s_scale_rows;
        r0 = 0;
        amax_of(x, n, row);
    }
    static __device__ __forceinline__ float code(float v, float s)
    {
        if (!(s > 0.0f)) return 0.0f;
        const float c = v / s;
        return (Q == 448 ? kcu_e4m3_round(c) : fminf(fmaxf(rintf(c), -127.0f), 127.0f)) * s;
    }
    __device__ __forceinline__ float operator()(float v, long long t, int) const { return code(v, scale[t - r0]); }
    template <int VEC> __device__ __forceinline__ void chunk(float *v, long long t, int) const
    {
        const float s = scale[t - r0];
#pragma unroll
        for (int j = 0; j < VEC; j++) v[j] = code(v[j], s);
    }
};

/* rms_norm over K (times the weight g, unless G is void): x * inv * g, as
 * a value of dtype O (the norm's: f32, or rounded to a half dtype). */
template <int K, typename G, typename O = float> struct kcu_pro_rms {
    const G *__restrict__ g; /* [K] the norm's weight, or NULL */
    double eps;              /* the norm's epsilon */
    float *inv;              /* shared [KCU_PRO_ROWS], set by prepare */
    long long r0;            /* the first row prepared */
    template <typename X> struct out {
        typedef O T; /* what the matmul multiplies: the norm's values */
    };
    template <typename X> __device__ __forceinline__ void prepare(const X *__restrict__ x, int T, long long first, int n)
    {
        __shared__ float s_inv[KCU_PRO_ROWS];
        inv = s_inv;
        r0 = first;
        kcu_row_stats<K, false>(x, T, first, n, eps, s_inv, s_inv);
    }
    /* the statistics of rows row(0) .. row(n - 1) (n <= KCU_PRO_ROWS), as rows 0 .. n - 1 of chunk's t */
    template <typename X, class Row> __device__ __forceinline__ void prepare_rows(const X *__restrict__ x, int n, const Row &row)
    {
        __shared__ float s_inv_rows[KCU_PRO_ROWS];
        inv = s_inv_rows;
        r0 = 0;
        kcu_row_stats_of<K, false>(x, n, row, eps, s_inv_rows, s_inv_rows);
    }
    __device__ __forceinline__ float operator()(float v, long long t, int k) const
    {
        const float y = v * inv[t - r0];
        return kcu_round<O>(g ? y * kcu_f(g[k]) : y);
    }
    template <int VEC> __device__ __forceinline__ void chunk(float *v, long long t, int k) const
    {
        const float s = inv[t - r0];
        float gv[VEC];
        if (g) kcu_xload<VEC>(g + k, gv);
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            const float y = v[j] * s;
            v[j] = kcu_round<O>(g ? y * gv[j] : y);
        }
    }
    /* kcu_matmul_tc's form: the weights of k .. k + 7 as 16 raw bytes, loaded a step ahead with x
     * (G a half dtype; f32 weights are read in chunk8 itself), then chunk<8>'s values from them */
    __device__ __forceinline__ uint4 raw16(int k) const
    {
        if constexpr (sizeof(G) == 2) return g ? *reinterpret_cast<const uint4 *>(g + k) : uint4{0u, 0u, 0u, 0u};
        return uint4{0u, 0u, 0u, 0u};
    }
    __device__ __forceinline__ void chunk8(float *v, long long t, int k, const uint4 &graw) const
    {
        if constexpr (sizeof(G) != 2) {
            chunk<8>(v, t, k);
        } else {
            const float s = inv[t - r0];
            float gv[8];
            if (g) kcu_vec<G>::unpack(graw, gv);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float y = v[j] * s;
                v[j] = kcu_round<O>(g ? y * gv[j] : y);
            }
        }
    }
};

/* layer_norm over K: (x - mean) * inv (* g) (+ b), as a value of dtype O. */
template <int K, typename G, typename O = float> struct kcu_pro_ln {
    const G *__restrict__ g; /* [K] weight, or NULL */
    const G *__restrict__ b; /* [K] bias, or NULL */
    double eps;              /* the norm's epsilon */
    float *mean, *inv;       /* shared [KCU_PRO_ROWS] each, set by prepare */
    long long r0;            /* the first row prepared */
    template <typename X> struct out {
        typedef O T;
    };
    template <typename X> __device__ __forceinline__ void prepare(const X *__restrict__ x, int T, long long first, int n)
    {
        __shared__ float s_mean[KCU_PRO_ROWS], s_inv[KCU_PRO_ROWS];
        mean = s_mean;
        inv = s_inv;
        r0 = first;
        kcu_row_stats<K, true>(x, T, first, n, eps, s_mean, s_inv);
    }
    template <typename X, class Row> __device__ __forceinline__ void prepare_rows(const X *__restrict__ x, int n, const Row &row)
    {
        __shared__ float s_mean_rows[KCU_PRO_ROWS], s_inv_rows[KCU_PRO_ROWS];
        mean = s_mean_rows;
        inv = s_inv_rows;
        r0 = 0;
        kcu_row_stats_of<K, true>(x, n, row, eps, s_mean_rows, s_inv_rows);
    }
    __device__ __forceinline__ float operator()(float v, long long t, int k) const
    {
        float y = (v - mean[t - r0]) * inv[t - r0];
        if (g) y *= kcu_f(g[k]);
        if (b) y += kcu_f(b[k]);
        return kcu_round<O>(y);
    }
    template <int VEC> __device__ __forceinline__ void chunk(float *v, long long t, int k) const
    {
        const float m = mean[t - r0], s = inv[t - r0];
        float gv[VEC], bv[VEC];
        if (g) kcu_xload<VEC>(g + k, gv);
        if (b) kcu_xload<VEC>(b + k, bv);
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            float y = (v[j] - m) * s;
            if (g) y *= gv[j];
            if (b) y += bv[j];
            v[j] = kcu_round<O>(y);
        }
    }
    /* kcu_matmul_tc's form (kcu_pro_rms's): nothing loaded ahead, chunk<8> itself */
    __device__ __forceinline__ uint4 raw16(int) const { return uint4{0u, 0u, 0u, 0u}; }
    __device__ __forceinline__ void chunk8(float *v, long long t, int k, const uint4 &) const { chunk<8>(v, t, k); }
};

/* ---- matmul epilogues: where the results go ---------------------------------------------
 *
 * An epilogue is a functor with: row(c), the weight row the matmul computes
 * as its c-th column (a permutation of 0..N-1 that puts the outputs an
 * epilogue needs together — a rotation's two halves, a gate and its up —
 * side by side); two(t, n0, v0, n1, v1), given the results of weight rows
 * n0 = row(2p) and n1 = row(2p+1) for token t; and one(t, n, v) for the
 * last column when N is odd. kcu_epi_store writes out[t, n].
 */
template <int N, typename O = float> struct kcu_epi_store {
    O *__restrict__ out; /* [T, N] */
    static __device__ __forceinline__ int row(int c) { return c; }
    __device__ __forceinline__ void one(long long t, int n, float v) const { kcu_put(out + t * N + n, v); }
    __device__ __forceinline__ void two(long long t, int n0, float v0, int n1, float v1) const
    {
        kcu_put(out + t * N + n0, v0);
        kcu_put(out + t * N + n1, v1);
    }
};

/* An epilogue may also come in steps (the code generator's do): a type
 * `col` holding what depends only on the pair's columns and column(n0, n1,
 * col &) that works it out (n1 < 0: the single last column); a type `in`
 * holding what it reads from memory for a row besides the matmul's values
 * and fetch(t, const col &, in &) that reads it; and apply(t, v0, v1,
 * const col &, const in &) that does the rest. A caller that hands over
 * many rows of one pair (kcu_gemm90) works out the column step once, then
 * fetches several rows before applying any, so that their loads are in
 * flight together: the compiler may not move a load above a store through
 * another pointer. kcu_epi_steps gives every epilogue the steps: its own,
 * or ones that keep the columns and call two/one. */
template <class> struct kcu_void_t {
    typedef void type;
};
template <class Epi, class = void> struct kcu_epi_steps {
    struct col {
        int n0, n1; /* the pair's weight rows (n1 < 0: the single last column) */
    };
    struct in {};
    static __device__ __forceinline__ void column(const Epi &, int n0, int n1, col &c) { c.n0 = n0, c.n1 = n1; }
    static __device__ __forceinline__ void fetch(const Epi &, long long, const col &, in &) {}
    static __device__ __forceinline__ void apply(const Epi &epi, long long t, float v0, float v1, const col &c,
                                                 const in &)
    {
        if (c.n1 >= 0) epi.two(t, c.n0, v0, c.n1, v1);
        else epi.one(t, c.n0, v0);
    }
};
template <class Epi> struct kcu_epi_steps<Epi, typename kcu_void_t<typename Epi::col>::type> {
    typedef typename Epi::col col;
    typedef typename Epi::in in;
    static __device__ __forceinline__ void column(const Epi &epi, int n0, int n1, col &c) { epi.column(n0, n1, c); }
    static __device__ __forceinline__ void fetch(const Epi &epi, long long t, const col &c, in &r) { epi.fetch(t, c, r); }
    static __device__ __forceinline__ void apply(const Epi &epi, long long t, float v0, float v1, const col &c,
                                                 const in &r)
    {
        epi.apply(t, v0, v1, c, r);
    }
};

/* ---- matmul: out[t, n] = sum_k x[t, k] w[n, k] ------------------------------------------
 *
 * Two kernels a matmul, chosen by T (the generated code launches NAME for
 * steps of at most KCU_GEMV_T tokens and NAME_large for longer ones), each on
 * blocks of KCU_MM_THREADS and a grid fixed by the shapes, not by T:
 *
 *  T <= KCU_GEMV_T (decode, kcu_matmul_small): memory-bound, so each weight
 *  is read once, 16 bytes at a time, with many loads in flight. Each warp
 *  computes R columns (weight rows epi.row(c)) for all T tokens; lane l
 *  takes chunks l, l + 32, ... of VEC weights of each row (sum in chunk
 *  order, fused multiply-adds), then the warp adds its 32 partial sums in a
 *  butterfly of shuffles (a fixed tree that leaves the same total in every
 *  lane), and one lane a (column pair, token) hands it to the epilogue. The
 *  design and its cost are described at kcu_matmul_small.
 *
 *  T > KCU_GEMV_T (prefill, kcu_matmul_large): tiles of 64 tokens x 64
 *  columns, K in steps of 32 staged through shared memory; blocks take tiles
 *  blockIdx.x, blockIdx.x + GRID, ... (GRID: ceil(N / KCU_MM_GRID_COLS)). On
 *  sm_80 and later (and in the CPU emulator), through tensor cores, x split
 *  into three bf16 parts and the weights into one to three so that nothing
 *  is lost (kcu_matmul_mma); on older GPUs, through f32 fused multiply-adds
 *  (kcu_matmul_fma).
 *
 * Each output is summed in an order fixed by its own position: a token's
 * logits depend on whether its step had more than KCU_GEMV_T tokens, never
 * on timing, on the other tokens of the step, or on the decode path's
 * per-shape choices (R: the order is lane-strided chunks whatever it is).
 */
enum {
    KCU_MM_THREADS = 256,  /* threads a block, both paths */
    KCU_GEMV_T = 8,        /* the most tokens of the decode path */
    KCU_MM_GRID_COLS = 16  /* the prefill path's grid: a block for every 16 columns */
};

/* ---- matmul, prefill on tensor cores (sm_80 and later; emulated on the CPU) ---------------
 *
 * T > KCU_GEMV_T on sm_80+: warp-level mma.sync.m16n8k16 (bf16 inputs, f32
 * accumulators) on tiles of 64 tokens x 64 columns.
 *
 * Fast precision (x a bf16 or f16 value, as the weights: what it multiplies,
 * x or its fused norm's values, is of the weights' half dtype): x and the
 * weights go to the tensor cores as they are, one part each (PX = PW = 1,
 * mma.sync with that type: .bf16 or .f16 inputs, f32 accumulators), k
 * blocks of 64; a thread loads 8 consecutive x of each of its two rows, 16
 * bytes a load when rows are 16-byte aligned. Exact: every product of two
 * halves is exact in f32. What follows describes f32 x (exact precision).
 *
 * Accuracy. x is f32 and must lose nothing, so each x element is split into
 * three bf16 parts, x = x0 + x1 + x2 exactly: x0 is x with its mantissa cut
 * to bf16's 8 bits (the high half of its bits), x1 the same of x - x0 (exact
 * in f32), x2 what is left: 3 x 8 = 24 bits, all of an f32's (two parts, 16
 * bits, measured 9e-6 relative L2 error on an H200: not enough). Weights
 * are split the same way: bf16 into 1 part (itself), f16 into 2 (its 11
 * bits: 8 + 3; bf16's range covers f16's, so there is no scaling, no
 * overflow past 65504 and no lost small value, as there would be with x in
 * f16 parts), f32 into 3. The tile sums the products of parts i of x and j
 * of w with i + j <= 2: 3 mma for bf16 weights, 5 for f16, 6 for f32; each
 * product left out (i + j >= 3) is below 2^-24 of x w, an f32 rounding's
 * size. The tensor cores truncate each mma's sum to about f32 precision, all
 * one way, so a long chain of mma into one accumulator drifts (1.5e-5
 * relative L2 after K = 14336, measured): x0 w0 is summed from zero over one
 * k block (32 or 64 products) and added to the f32 accumulator with an f32
 * add; the smaller products (2^-8 of it and less) go into a second
 * accumulator directly. The two are added at the end. Measured on an H200
 * (Llama-3-8B shapes, T = 128): 1.6e-7 .. 3.2e-7 relative L2 from the exact
 * sums, against 1.1e-6 .. 2.1e-6 for the CUDA-core path (sequential f32
 * fused multiply-adds).
 *
 * Layout. A block of 8 warps computes a 64 x 64 tile; warp w owns tokens 16
 * (w % 4) .. +15 and columns 32 (w / 4) .. +31: four 16 x 8 mma tiles, two
 * sets of accumulators (2 x 4 x 4 f32) in registers. K goes in blocks of BK
 * (64 for bf16 weights, 32 for f16 and f32, whose parts take more shared
 * memory): the threads load the next block's x (f32, float4 when aligned)
 * and weights (16-byte loads) into registers while the tensor cores work on
 * the current one, then, between two barriers, apply the prologue, split,
 * and store the parts to shared memory as bf16 pairs (k, k + 1) in 32-bit
 * words, laid out (kcu_matmul_mma) so that every fragment comes with one
 * 16-byte load, its registers in order, without bank conflicts. A lane
 * (g, c) = (lane / 4, lane % 4) reads words 2c, 2c + 1 of each 8-word k16
 * slice of its rows and uses them as its fragments' k 2c, 2c + 1 and 2c + 8,
 * 2c + 9: the mma's k order is a relabelling of the slice's, the same for x
 * and w, so the sum is the same. Per warp and k16 slice: PX + 2 PW 16-byte
 * shared loads, 4 x (3, 5 or 6) mma.
 *
 * Each output is the sum, in an order fixed by its position, of its k
 * blocks' mma (no split-K, no atomics): bitwise reproducible.
 *
 * Throughput. Expected (H200, bf16 weights): a block's k64 step is 384 mma
 * (8 warps x 4 tiles x 4 slices x 3 parts) against 8 kB of weights from HBM
 * and 16 kB of x from L2; mma.sync (not wgmma) peaks near 0.6 m16n8k16 a
 * cycle an SM, so ~650 cycles a step, about what a 132th of the HBM rate
 * takes for 8 kB, and the loads of the next block overlap this one's mma:
 * at best ~200 TFLOP/s of the model's arithmetic (3 mma a product), less
 * with 8-16 warps an SM to hide the latencies. Measured (cuda_mm_check
 * --gpu, T = 128, K = 4096, N = 4096 .. 128256; K = 14336, N = 4096): 52 ..
 * 77 TFLOP/s of the model's arithmetic, against 14 .. 22 on CUDA cores;
 * Llama-3-8B's 128-token prefill matmuls in 30 ms against 110 ms (34 ms
 * with the decode path in the same kernel: 148 registers, one block an SM
 * instead of two); f16 weights 1.9x and f32 2x the CUDA-core rate. The limits seen (Nsight Compute): the latency of shared
 * loads and barriers with 8 or 16 warps an SM, not the tensor cores' rate.
 */
#if (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800) || !defined(__CUDACC__)
#define KCU_MMA 1 /* mma.sync: sm_80 and later, and the CPU emulator (g++ with emu_shim.h) */
#else
#define KCU_MMA 0 /* older GPUs, and nvcc's host pass: the CUDA-core path */
#endif

/* Split the f32 pair (a, b) into P bf16 pairs, exactly for P = 3 (and for
 * values of at most 8 P significant bits with fewer): part p holds the next
 * 8 bits of each (the high half of what is left), a in the low half. An
 * infinite a gives NaN parts after the first (inf - inf): the sum is NaN. */
template <int P> __device__ __forceinline__ void kcu_split_pair(float a, float b, unsigned *parts)
{
#pragma unroll
    for (int p = 0; p < P; p++) {
        const unsigned ua = kcu_bits(a), ub = kcu_bits(b);
        parts[p] = (ua >> 16) | (ub & 0xffff0000u);
        if (p + 1 < P) {
            a -= __uint_as_float(ua & 0xffff0000u);
            b -= __uint_as_float(ub & 0xffff0000u);
        }
    }
}

/* One k16 slice of a warp's mma operands, in the registers of lane (g, c) =
 * (lane / 4, lane % 4) as the PTX ISA lays out mma.m16n8k16's fragments
 * (.bf16: two per 32-bit register, the lower k in the low half):
 *   A (16 x 16, row-major) a[0]: row g, k 2c, 2c+1; a[1]: row g+8, the same
 *     k; a[2]: row g, k 2c+8, 2c+9; a[3]: row g+8, k 2c+8, 2c+9;
 *   B (16 x 8, column-major) b[0]: k 2c, 2c+1 of column g; b[1]: k 2c+8, 2c+9;
 *   C, D (16 x 8, f32) d[0], d[1]: row g, columns 2c, 2c+1; d[2], d[3]: row g+8. */
template <int NT, int PX, int PW> struct kcu_mma_frag {
    unsigned a[PX][4];     /* part i of x: the A fragment (16 tokens x 16 k) */
    unsigned b[NT][PW][2]; /* part j of the weights of 8-column tile n: the B fragment */
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
/* d += a b for one 16 x 8 x 16 tile: bf16 inputs (E = kcu_bf16) or f16 (kcu_f16), f32 accumulators */
template <typename E> __device__ __forceinline__ void kcu_mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]);
template <> __device__ __forceinline__ void kcu_mma<kcu_bf16>(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2])
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <> __device__ __forceinline__ void kcu_mma<kcu_f16>(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2])
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

#if !defined(__CUDACC__)
/* The CPU emulator's mma: element (row r, k) of A part i, and (k, column n)
 * of B part j of tile t, read from the lane that holds it in the PTX layout
 * above (lanes published in f, base: the warp's first thread); E: the
 * elements' type (bf16 or f16). */
template <typename E> static inline float kemu_elem(unsigned w, int high)
{
    return kcu_f(E{(unsigned short)(high ? w >> 16 : w & 0xffffu)});
}
template <int S, typename E, int NT, int PX, int PW>
static inline float kemu_frag_a(const kcu_mma_frag<NT, PX, PW> *f, int base, int i, int r, int k)
{
    const unsigned w = f[(base + (r & 7) * 4 + (k & 7) / 2) * S].a[i][(r >> 3) + 2 * (k >> 3)];
    return kemu_elem<E>(w, k & 1);
}
template <int S, typename E, int NT, int PX, int PW>
static inline float kemu_frag_b(const kcu_mma_frag<NT, PX, PW> *f, int base, int t, int j, int k, int n)
{
    const unsigned w = f[(base + n * 4 + (k & 7) / 2) * S].b[t][j][k >> 3];
    return kemu_elem<E>(w, k & 1);
}
#endif

/* The warp's mma over the S k16 slices of a k block, for each 8-column
 * tile t: hi[t] += x0 w0, lo[t] += the other products of parts i + j < PX.
 * x0 w0 is summed by the tensor cores from zero over the block's slices,
 * then added to hi[t] with an f32 add (rounded to nearest): the tensor
 * cores truncate at each mma, and the bias of truncating a long sum (about
 * 2^-24 of it per mma, all one way: 1.5e-5 relative after K = 14336 on an
 * H200) would stay; truncating a 32- or 64-product sum costs nothing next
 * to that. lo, 2^-8 of hi, can take its truncations. Order: slice,
 * product, tile. E: the parts' type, kcu_bf16 (or kcu_f16: x and weights
 * both f16, one part each). */
template <int NT, int PX, int PW, int S, typename E = kcu_bf16>
static __device__ __forceinline__ void kcu_mma_warp(float (&hi)[NT][4], float (&lo)[NT][4],
                                                    const kcu_mma_frag<NT, PX, PW> (&f)[S])
{
    float blk[NT][4];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) blk[t][e] = 0.0f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#pragma unroll
    for (int s = 0; s < S; s++) {
#pragma unroll
        for (int t = 0; t < NT; t++) kcu_mma<E>(blk[t], f[s].a[0], f[s].b[t][0]);
#pragma unroll
        for (int d = 1; d < PX; d++)
#pragma unroll
            for (int i = 0; i <= d; i++)
                if (d - i < PW)
#pragma unroll
                    for (int t = 0; t < NT; t++) kcu_mma<E>(lo[t], f[s].a[i], f[s].b[t][d - i]);
    }
#elif !defined(__CUDACC__)
    /* The emulator has no warps: every thread publishes its registers, the
     * block synchronizes, and each thread gathers the rows of A and columns
     * of B its D elements need from its warp's lanes, each element from the
     * lane and register the layout above places it in (so a kernel that
     * fills fragments wrongly gives wrong results here too); products are
     * exact in f32 and summed over k in order. */
    static kcu_mma_frag<NT, PX, PW> pub[KCU_MM_THREADS * S];
    const int tid = threadIdx.x, base = tid & ~31, g = (tid & 31) / 4, c = tid & 3;
    for (int s = 0; s < S; s++) pub[tid * S + s] = f[s];
    __syncthreads();
    for (int s = 0; s < S; s++) {
        const kcu_mma_frag<NT, PX, PW> *fs = pub + s;
        float a[PX][2][16], b[NT][PW][2][16]; /* this lane's rows g, g + 8 and columns 2c, 2c + 1 */
        for (int k = 0; k < 16; k++) {
            for (int i = 0; i < PX; i++)
                for (int h = 0; h < 2; h++) a[i][h][k] = kemu_frag_a<S, E>(fs, base, i, g + 8 * h, k);
            for (int t = 0; t < NT; t++)
                for (int j = 0; j < PW; j++)
                    for (int h = 0; h < 2; h++) b[t][j][h][k] = kemu_frag_b<S, E>(fs, base, t, j, k, 2 * c + h);
        }
        for (int d = 0; d < PX; d++)
            for (int i = 0; i <= d; i++) {
                if (d - i >= PW) continue;
                for (int t = 0; t < NT; t++) {
                    float *acc = d == 0 ? blk[t] : lo[t];
                    for (int e = 0; e < 4; e++) {
                        const float *ar = a[i][e >> 1], *bc = b[t][d - i][e & 1];
                        float sum = 0.0f;
                        for (int k = 0; k < 16; k++) sum += ar[k] * bc[k];
                        acc[e] += sum;
                    }
                }
            }
    }
    __syncthreads();
#endif
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) hi[t][e] += blk[t][e];
}

/* Weights in tensor-core parts: PW bf16 parts (see above); ON: whether the
 * prefill takes this path for them; BK: its k block (64 when the 3 + PW
 * parts' tiles fit the 48 kB of static shared memory, else 32); Raw holds the 8
 * consecutive weights a thread loads for one k block; load reads them
 * (VEC at a time, zeros from k = K on); split turns them into PW x 4 words
 * of bf16 pairs. */
template <typename W> struct kcu_mma_w;
/* 8 consecutive 16-bit weights (bf16 or f16 bits) from p, weight k of the row
 * first: one 16-byte load when VEC is 8 and k is inside the row, else one at
 * a time with zeros from k = K on. */
template <int K, int VEC, typename H> static __device__ __forceinline__ uint4 kcu_mma_load16(const H *p, int k)
{
    if (VEC == 8 && k < K) return __ldg(reinterpret_cast<const uint4 *>(p));
    unsigned h[8];
#pragma unroll
    for (int j = 0; j < 8; j++) h[j] = k + j < K ? p[j].bits : 0u;
    return uint4{h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16, h[6] | h[7] << 16};
}
template <> struct kcu_mma_w<kcu_bf16> {
    enum { PW = 1, ON = 1, BK = 64 };
    typedef uint4 Raw;
    template <int K, int VEC> static __device__ __forceinline__ Raw load(const kcu_bf16 *p, int k)
    {
        return kcu_mma_load16<K, VEC>(p, k);
    }
    static __device__ __forceinline__ void split(const Raw &r, unsigned (*parts)[4])
    {
        parts[0][0] = r.x, parts[0][1] = r.y, parts[0][2] = r.z, parts[0][3] = r.w;
    }
};
template <> struct kcu_mma_w<kcu_f16> {
    enum { PW = 2, ON = 1, BK = 32 };
    typedef uint4 Raw;
    template <int K, int VEC> static __device__ __forceinline__ Raw load(const kcu_f16 *p, int k)
    {
        return kcu_mma_load16<K, VEC>(p, k);
    }
    static __device__ __forceinline__ void split(const Raw &r, unsigned (*parts)[4])
    {
        const unsigned u[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            unsigned two[2];
            kcu_split_pair<2>(kcu_half_bits(u[j] & 0xffffu), kcu_half_bits(u[j] >> 16), two);
            parts[0][j] = two[0], parts[1][j] = two[1];
        }
    }
};
template <> struct kcu_mma_w<float> {
    enum { PW = 3, ON = 1, BK = 32 };
    struct Raw {
        float4 lo, hi; /* weights k .. k+3, k+4 .. k+7 */
    };
    template <int K, int VEC> static __device__ __forceinline__ Raw load(const float *p, int k)
    {
        if (VEC == 4 && k < K) /* K % 4 == 0: k .. k+3 are in; k+4 .. k+7 too unless K ends there */
            return Raw{__ldg(reinterpret_cast<const float4 *>(p)),
                       K % 8 == 0 || k + 4 < K ? __ldg(reinterpret_cast<const float4 *>(p + 4)) : float4{}};
        float v[8];
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = k + j < K ? p[j] : 0.0f;
        return Raw{float4{v[0], v[1], v[2], v[3]}, float4{v[4], v[5], v[6], v[7]}};
    }
    static __device__ __forceinline__ void split(const Raw &r, unsigned (*parts)[4])
    {
        const float v[8] = {r.lo.x, r.lo.y, r.lo.z, r.lo.w, r.hi.x, r.hi.y, r.hi.z, r.hi.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            unsigned three[3];
            kcu_split_pair<3>(v[2 * j], v[2 * j + 1], three);
            parts[0][j] = three[0], parts[1][j] = three[1], parts[2][j] = three[2];
        }
    }
};

/* Weights that go to the tensor cores as they are, with x of their own
 * half type H (fast precision): one part, k blocks of 64. */
template <typename H> struct kcu_mma_raw {
    enum { PW = 1, ON = 1, BK = 64 };
    typedef uint4 Raw;
    template <int K, int VEC> static __device__ __forceinline__ Raw load(const H *p, int k)
    {
        return kcu_mma_load16<K, VEC>(p, k);
    }
    static __device__ __forceinline__ void split(const Raw &r, unsigned (*parts)[4])
    {
        parts[0][0] = r.x, parts[0][1] = r.y, parts[0][2] = r.z, parts[0][3] = r.w;
    }
};

/* Where kcu_matmul_mma reads its weights: a pointer to W rows (row r at w + r K), or a quantized
 * weight's handle (kcu_qsrc, below), which brings its own loader: kcu_mma_src<WP, M>::T is the loader
 * of weight source WP, M for a pointer. */
template <typename WP, class M> struct kcu_mma_src {
    typedef M T;
};
template <int K, typename W> static __device__ __forceinline__ const W *kcu_wrow(const W *w, long long r)
{
    return w + r * K;
}

/* A quantized weight (ir/quant.h) as kcu_matmul_mma's fast-precision prefill reads it: QB-bit codes
 * (FLIP: i8; E4M3: f8e4m3), scales S and (ASYM) zero points of groups of G along K; a handle at row
 * `row`, column k. Its loader dequantizes 8 codes, (code - zero) scale in f32 (e4m3: its value times
 * the scale), each rounded to H (the mma's half type): the tensor cores take them as they take a half
 * weight. */
template <int QB, bool FLIP, bool ASYM, int K, int G, typename S, typename H, bool E4M3 = false> struct kcu_qsrc {
    enum { KK = K };
    const unsigned char *codes;
    const S *scale;
    const unsigned char *zero;
    long long row;
    int k;
    __device__ __forceinline__ kcu_qsrc operator+(int d) const { return kcu_qsrc{codes, scale, zero, row, k + d}; }
    struct loader {
        enum { PW = 1, ON = 1, BK = 64 };
        typedef uint4 Raw;
        template <int KK, int VEC> static __device__ __forceinline__ Raw load(const kcu_qsrc &h, int)
        {
            const long long gi = h.row * (K / G) + h.k / G;
            const float s = kcu_f(h.scale[gi]), z = ASYM ? (float)h.zero[gi] : (QB == 4 ? 8.0f : 128.0f);
            unsigned q[8];
            if (QB == 4) {
                const unsigned wd = *reinterpret_cast<const unsigned *>(h.codes + h.row * (K / 2) + h.k / 2);
#pragma unroll
                for (int j = 0; j < 8; j++) q[j] = (wd >> (4 * j)) & 15u;
            } else {
                const unsigned *wd = reinterpret_cast<const unsigned *>(h.codes + h.row * K + h.k);
                const unsigned lo = wd[0], hi = wd[1];
#pragma unroll
                for (int j = 0; j < 8; j++) q[j] = ((j < 4 ? lo : hi) >> (8 * (j % 4))) & 255u;
            }
            unsigned u[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                unsigned b[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const unsigned c = FLIP ? q[2 * j + e] ^ 128u : q[2 * j + e];
                    const float v = E4M3 ? kcu_e4m3_value(q[2 * j + e]) * s : ((float)c - z) * s;
                    b[e] = kcu_same<H, kcu_bf16>::V ? kcu_bf16_bits(v) : kcu_f16_bits(v);
                }
                u[j] = b[0] | b[1] << 16;
            }
            return uint4{u[0], u[1], u[2], u[3]};
        }
        static __device__ __forceinline__ void split(const Raw &r, unsigned (*parts)[4])
        {
            parts[0][0] = r.x, parts[0][1] = r.y, parts[0][2] = r.z, parts[0][3] = r.w;
        }
    };
};
/* A quantized weight [N, K] dequantized into a half copy out (kcu_gemm90's prefill of w4a16 and w8a16: a
 * pre-pass; the matmul reads the copy through a tensor map): each value as kcu_qsrc's loader makes it for
 * kcu_matmul_mma, 8 codes a thread, 16 bytes a store; grid ceil(N K / 8 / blockDim.x). */
template <int N, class Q, typename H>
static __device__ __forceinline__ void kcu_dequantize_weight(const Q &w, H *__restrict__ out)
{
    enum { K = Q::KK };
    static_assert(K % 8 == 0, "rows of 8-code chunks");
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; /* the chunk */
    if (i >= (long long)N * (K / 8)) return;
    const long long r = i / (K / 8);
    const int k = (int)(i % (K / 8)) * 8;
    *reinterpret_cast<uint4 *>(out + r * K + k) = Q::loader::template load<K, 8>(Q{w.codes, w.scale, w.zero, r, k}, 0);
}
template <int QB, bool FLIP, bool ASYM, int K, int G, typename S, typename H, bool E4M3, class M>
struct kcu_mma_src<kcu_qsrc<QB, FLIP, ASYM, K, G, S, H, E4M3>, M> {
    typedef typename kcu_qsrc<QB, FLIP, ASYM, K, G, S, H, E4M3>::loader T;
};
template <int K, int QB, bool FLIP, bool ASYM, int KQ, int G, typename S, typename H, bool E4M3>
static __device__ __forceinline__ kcu_qsrc<QB, FLIP, ASYM, KQ, G, S, H, E4M3>
kcu_wrow(const kcu_qsrc<QB, FLIP, ASYM, KQ, G, S, H, E4M3> &w, long long r)
{
    return kcu_qsrc<QB, FLIP, ASYM, KQ, G, S, H, E4M3>{w.codes, w.scale, w.zero, r, 0};
}

/* How x reaches the tensor cores. Xv (f32, exact precision): CH chunks of 4
 * consecutive x of each of a thread's two rows, split into PX bf16 parts.
 * Xh (half, fast precision): 8 consecutive x of each row, as bits. */
template <int CH> struct kcu_mma_xv {
    float v[CH][2][4];
};
struct kcu_mma_xh {
    uint4 v[2];
};

/* One x of type X (f32 or half) as f32. */
__device__ __forceinline__ float kcu_ldx(const float *p) { return __ldg(p); }
template <typename X> __device__ __forceinline__ float kcu_ldx(const X *p) { return kcu_f(*p); }

struct alignas(8) kcu_u2 {
    unsigned x, y; /* two 32-bit words, loaded together */
};

/* The prefill matmul on tensor cores (the design above) on GRID blocks, PX
 * parts of x (3: exact; fewer only for experiments; 1 with half x), k
 * blocks of BK (32 or 64; 64 with half x), loaded PF blocks ahead (1 or
 * 2). X: x's dtype in memory; what the matmul multiplies (Pro::out) is f32
 * (exact: parts) or the weights' half type (fast: as it is). */
template <typename W, int K, int N, int GRID, int PX, int BK, int PF, class Pro, class Epi, typename X, typename WP>
static __device__ __forceinline__ void kcu_matmul_mma(const int T, const X *__restrict__ x, const WP w, Pro &pro,
                                                      const Epi &epi)
{
    typedef typename Pro::template out<X>::T XO;
    enum { HALF = !kcu_same<XO, float>::V }; /* fast precision: x (as multiplied) and w of one half type */
    typedef kcu_mma_w<W> MWx;
    typedef kcu_mma_raw<W> MWh;
    typedef typename kcu_mma_src<WP, typename kcu_pick<HALF, MWh, MWx>::T>::T MW; /* WP: W rows, or kcu_qsrc */
    typedef typename kcu_pick<HALF, W, kcu_bf16>::T E; /* the mma's input type */
    typedef typename MW::Raw Raw;
    enum {
        PW = MW::PW,
        VEC = (K * sizeof(W)) % 16 == 0 ? (int)kcu_vec<W>::N : 1, /* weight rows 16-byte aligned */
        BM = 64,                /* tokens a tile */
        BN = 64,                /* columns a tile */
        S = BK / 16,            /* mma k slices a block */
        CH = BK / 32,           /* x and weight chunks a thread loads a block */
        PITCH = BK + 16,        /* words a pair of rows m, m + 8 takes in shared memory (BK + 16 padding) */
        PLANE = BM / 2 * PITCH, /* words a part takes */
        KFULL = K % BK == 0,    /* no k block is partial */
        XPASS = kcu_same<Pro, kcu_pro_none>::V && kcu_same<X, XO>::V /* half x goes to the tensor cores as loaded */
    };
    typedef typename kcu_pick<HALF, kcu_mma_xh, kcu_mma_xv<CH>>::T XRaw;
    static_assert((int)BM == (int)KCU_PRO_ROWS, "a tile's rows are one prologue's");
    static_assert(PF == 1 || PF == 2, "one or two k blocks ahead");
    static_assert(BK == 32 || BK == 64, "k blocks of 32 or 64");
    static_assert(!HALF || (kcu_same<XO, W>::V && PX == 1 && BK == 64), "half x: the weights' type, one part, k64");
    /* Row (or column) m of a tile lies in pair 8 (m / 16) + m % 8, half h =
     * m / 8 % 2; word j (k 2j, 2j + 1 of the k block) of it at
     *   x parts: pair * PITCH + j / 2 * 4 + j % 2 * 2 + h
     *   weight parts: pair * PITCH + j / 2 * 4 + h * 2 + j % 2
     * so that one 16-byte load gives a lane (g, c) its A fragment (rows g,
     * g + 8; words 8 s + 2 c, 8 s + 2 c + 1 as k 2c.. and 2c+8..), or the B
     * fragments of two 8-column tiles (columns g, g + 8), registers in order;
     * the 16-word padding puts the 8 lanes of each quarter of a warp on
     * distinct banks. */
    __shared__ uint4 smem4[(PX + PW) * PLANE / 4];
    unsigned *const xs = reinterpret_cast<unsigned *>(smem4); /* [PX][PLANE] */
    unsigned *const ws = xs + PX * PLANE;                     /* [PW][PLANE] */
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, c = lane % 4;
    const int wm = warp % 4 * 16, wn = warp / 4 * 32; /* the warp's tokens and columns in the tile */
    /* loads: x rows xm, xm + 8 (pair xp), k xk + 32 i .. +3 (half x: k xk8 .. +7); weight column wc
     * (pair wp, half wh), k wk + 32 i .. +7 */
    const int xp = tid / 8, xm = xp / 8 * 16 + xp % 8, xk = tid % 8 * 4, xk8 = tid % 8 * 8;
    const int wc = tid / 4, wp = wc / 16 * 8 + wc % 8, wh = wc / 8 % 2, wk = tid % 4 * 8;
    const bool xvec = (HALF ? K % 8 == 0 : K % 4 == 0 && kcu_same<X, float>::V) &&
                      (reinterpret_cast<unsigned long long>(x) & 15) == 0;
    const int tiles_n = (N + BN - 1) / BN, tiles = tiles_n * ((T + BM - 1) / BM);
    for (int tile = blockIdx.x; tile < tiles; tile += GRID) {
        const long long row0 = (long long)(tile / tiles_n) * BM;
        const int col0 = (tile % tiles_n) * BN;
        pro.prepare(x, T, row0, BM);
        const bool live[2] = {row0 + xm < T, row0 + xm + 8 < T};
        const int xoff = HALF ? xk8 : xk;
        const X *const xrow[2] = {x + (row0 + xm) * K + xoff, x + (row0 + xm + 8) * K + xoff};
        const bool wlive = col0 + wc < N;
        const auto wrow = kcu_wrow<K>(w, wlive ? Epi::row(col0 + wc) : 0) + wk;
        float hi[4][4], lo[4][4];
#pragma unroll
        for (int t = 0; t < 4; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) hi[t][e] = lo[t][e] = 0.0f;
        /* this thread's share of the k block at k0 into xr, wr (zeros past T, N, K) */
        auto load = [&](int k0, XRaw &xr, Raw (&wr)[CH]) {
            if constexpr (HALF) {
                const int k = k0 + xk8;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    if (xvec && (KFULL || k < K)) {
                        xr.v[h] = live[h] ? __ldg(reinterpret_cast<const uint4 *>(xrow[h] + k0)) : uint4{};
                    } else {
                        unsigned b[8];
#pragma unroll
                        for (int j = 0; j < 8; j++) b[j] = live[h] && k + j < K ? xrow[h][k0 + j].bits : 0u;
                        xr.v[h] = uint4{b[0] | b[1] << 16, b[2] | b[3] << 16, b[4] | b[5] << 16, b[6] | b[7] << 16};
                    }
                }
            } else {
#pragma unroll
                for (int i = 0; i < CH; i++) {
                    const int k = k0 + 32 * i;
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        if (xvec && (KFULL || k + xk < K)) {
                            const float4 v = live[h] ? __ldg(reinterpret_cast<const float4 *>(xrow[h] + k)) : float4{};
                            xr.v[i][h][0] = v.x, xr.v[i][h][1] = v.y, xr.v[i][h][2] = v.z, xr.v[i][h][3] = v.w;
                        } else {
#pragma unroll
                            for (int j = 0; j < 4; j++)
                                xr.v[i][h][j] = live[h] && k + xk + j < K ? kcu_ldx(xrow[h] + k + j) : 0.0f;
                        }
                    }
                    if (wlive)
                        wr[i] = MW::template load<K, VEC>(wrow + k, k + wk);
                    else
                        wr[i] = Raw{};
                }
                return;
            }
#pragma unroll
            for (int i = 0; i < CH; i++) {
                const int k = k0 + 32 * i;
                if (wlive)
                    wr[i] = MW::template load<K, VEC>(wrow + k, k + wk);
                else
                    wr[i] = Raw{};
            }
        };
        /* the k block at k0, loaded in xr, wr: into shared memory as parts,
         * then (the block PF ahead loading into xr, wr meanwhile) the mma */
        auto step = [&](int k0, XRaw &xr, Raw (&wr)[CH]) {
            __syncthreads(); /* the previous block's fragments are read */
            if constexpr (HALF) {
                uint4 r[2] = {xr.v[0], xr.v[1]};
                if (!XPASS) { /* through the prologue: x as f32, its values (of XO) back to bits */
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const long long t = row0 + xm + 8 * h;
                        unsigned u[4] = {r[h].x, r[h].y, r[h].z, r[h].w};
#pragma unroll
                        for (int j = 0; j < 4; j++) {
                            const int k = k0 + xk8 + 2 * j;
                            unsigned q[2];
#pragma unroll
                            for (int e = 0; e < 2; e++) {
                                const float v = live[h] && (KFULL || k + e < K)
                                                    ? pro(kcu_f(X{(unsigned short)(e ? u[j] >> 16 : u[j] & 0xffffu)}),
                                                          t, k + e)
                                                    : 0.0f;
                                q[e] = kcu_same<XO, kcu_bf16>::V ? kcu_bf16_bits(v) : kcu_f16_bits(v);
                            }
                            u[j] = q[0] | q[1] << 16;
                        }
                        r[h] = uint4{u[0], u[1], u[2], u[3]};
                    }
                }
                *reinterpret_cast<uint4 *>(xs + xp * PITCH + xk8) = uint4{r[0].x, r[1].x, r[0].y, r[1].y};
                *reinterpret_cast<uint4 *>(xs + xp * PITCH + xk8 + 4) = uint4{r[0].z, r[1].z, r[0].w, r[1].w};
            }
#pragma unroll
            for (int i = 0; i < CH; i++) {
                const int k = k0 + 32 * i;
                if constexpr (!HALF) {
                    unsigned q[2][2][PX]; /* [row h][k pair][part] */
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const long long t = row0 + xm + 8 * h;
                        float v[4];
#pragma unroll
                        for (int j = 0; j < 4; j++)
                            v[j] = live[h] && (KFULL || k + xk + j < K) ? pro(xr.v[i][h][j], t, k + xk + j) : 0.0f;
                        kcu_split_pair<PX>(v[0], v[1], q[h][0]);
                        kcu_split_pair<PX>(v[2], v[3], q[h][1]);
                    }
#pragma unroll
                    for (int p = 0; p < PX; p++)
                        *reinterpret_cast<uint4 *>(xs + p * PLANE + xp * PITCH + (32 * i + xk) / 4 * 4) =
                            uint4{q[0][0][p], q[1][0][p], q[0][1][p], q[1][1][p]};
                }
                unsigned parts[PW][4];
                MW::split(wr[i], parts);
#pragma unroll
                for (int j = 0; j < PW; j++) {
                    unsigned *const d = ws + j * PLANE + wp * PITCH + (32 * i + wk) / 4 * 4 + 2 * wh;
                    *reinterpret_cast<kcu_u2 *>(d) = kcu_u2{parts[j][0], parts[j][1]};
                    *reinterpret_cast<kcu_u2 *>(d + 4) = kcu_u2{parts[j][2], parts[j][3]};
                }
            }
            __syncthreads();
            if (k0 + PF * BK < K) load(k0 + PF * BK, xr, wr);
            kcu_mma_frag<4, PX, PW> f[S];
#pragma unroll
            for (int s = 0; s < S; s++) {
#pragma unroll
                for (int i = 0; i < PX; i++) {
                    const uint4 a = *reinterpret_cast<const uint4 *>(xs + i * PLANE + (wm / 2 + g) * PITCH + (4 * s + c) * 4);
                    f[s].a[i][0] = a.x, f[s].a[i][1] = a.y, f[s].a[i][2] = a.z, f[s].a[i][3] = a.w;
                }
#pragma unroll
                for (int tp = 0; tp < 2; tp++)
#pragma unroll
                    for (int j = 0; j < PW; j++) {
                        const uint4 b = *reinterpret_cast<const uint4 *>(ws + j * PLANE + (wn / 2 + 8 * tp + g) * PITCH +
                                                                        (4 * s + c) * 4);
                        f[s].b[2 * tp][j][0] = b.x, f[s].b[2 * tp][j][1] = b.y;
                        f[s].b[2 * tp + 1][j][0] = b.z, f[s].b[2 * tp + 1][j][1] = b.w;
                    }
            }
            kcu_mma_warp<4, PX, PW, S, E>(hi, lo, f);
        };
        XRaw xa, xb;
        Raw wa[CH], wb[CH];
        load(0, xa, wa);
        if constexpr (PF == 1) {
            for (int k0 = 0; k0 < K; k0 += BK) step(k0, xa, wa);
        } else {
            if (BK < K) load(BK, xb, wb);
            for (int k0 = 0; k0 < K; k0 += 2 * BK) {
                step(k0, xa, wa);
                if (k0 + BK < K) step(k0 + BK, xb, wb);
            }
        }
#pragma unroll
        for (int t = 0; t < 4; t++) {
            const int col = col0 + wn + 8 * t + 2 * c;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const long long tok = row0 + wm + g + 8 * h;
                if (tok >= T) continue;
                const float v0 = hi[t][2 * h] + lo[t][2 * h], v1 = hi[t][2 * h + 1] + lo[t][2 * h + 1];
                if (col + 1 < N)
                    epi.two(tok, Epi::row(col), v0, Epi::row(col + 1), v1);
                else if (col < N)
                    epi.one(tok, Epi::row(col), v0);
            }
        }
    }
}

/* ---- matmul, prefill on CUDA cores (before sm_80) ----------------------------------------
 *
 * Tiles of 64 tokens x 64 columns, K in steps of 32 staged through shared
 * memory (x through the prologue, weights converted to f32 there); each
 * thread owns 4 x 4 outputs and sums over k in order with fused
 * multiply-adds. Blocks take tiles blockIdx.x, blockIdx.x + GRID, ...
 */
template <typename W, int K, int N, int GRID, class Pro, class Epi, typename X>
static __device__ __forceinline__ void kcu_matmul_fma(const int T, const X *__restrict__ x,
                                                      const W *__restrict__ w, Pro &pro, const Epi &epi)
{
    enum {
        B = KCU_MM_THREADS,
        VEC = (K * sizeof(W)) % 16 == 0 ? (int)kcu_vec<W>::N : 1, /* rows 16-byte aligned: vector loads */
        BM = 64,
        BN = 64,
        BK = 32,
        P = BM + 4 /* row pitch of the tiles in shared memory: rows stay 16-byte aligned */
    };
    const int tid = threadIdx.x;
    __shared__ float4 smem4[2 * BK * P / 4];
    float *const smem = reinterpret_cast<float *>(smem4);
    float(*xs)[P] = reinterpret_cast<float(*)[P]>(smem);          /* [BK][P]: x tile, k-major */
    float(*ws)[P] = reinterpret_cast<float(*)[P]>(smem + BK * P); /* [BK][P]: w tile, k-major */
    const int tx = tid % 16, ty = tid / 16;
    const int tiles_n = (N + BN - 1) / BN, tiles = tiles_n * ((T + BM - 1) / BM);
    for (int tile = blockIdx.x; tile < tiles; tile += GRID) {
        const long long row0 = (long long)(tile / tiles_n) * BM;
        const int col0 = (tile % tiles_n) * BN;
        pro.prepare(x, T, row0, T - row0 < BM ? (int)(T - row0) : BM);
        float acc[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
        for (int k0 = 0; k0 < K; k0 += BK) {
#pragma unroll
            for (int i = 0; i < BM * BK / B; i++) {
                const int e = tid + i * B, m = e / BK, kk = e % BK;
                xs[kk][m] = row0 + m < T && k0 + kk < K ? pro(kcu_f(x[(row0 + m) * K + k0 + kk]), row0 + m, k0 + kk) : 0.0f;
            }
            if (VEC > 1 && k0 + BK <= K) {
#pragma unroll
                for (int i = 0; i < (BN * BK / VEC + B - 1) / B; i++) {
                    const int e = tid + i * B, c = e / (BK / VEC), kk = e % (BK / VEC) * VEC;
                    if (e >= BN * BK / VEC) break;
                    float v[VEC];
                    if (col0 + c < N) {
                        kcu_chunk<W, VEC>::load(w + (long long)Epi::row(col0 + c) * K + k0 + kk, v);
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
                    ws[kk][c] = col0 + c < N && k0 + kk < K ? kcu_f(w[(long long)Epi::row(col0 + c) * K + k0 + kk]) : 0.0f;
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
            for (int j = 0; j < 4; j += 2) {
                const int c = col0 + tx * 4 + j;
                if (c + 1 < N)
                    epi.two(t, Epi::row(c), acc[i][j], Epi::row(c + 1), acc[i][j + 1]);
                else if (c < N)
                    epi.one(t, Epi::row(c), acc[i][j]);
            }
        }
    }
}

/* ---- matmul, decode (T <= KCU_GEMV_T) ------------------------------------------------------
 *
 * A matrix-vector product is a stream of weights: each is read once and used
 * for T multiply-adds, so the kernel can be as fast as HBM delivers weights,
 * if enough bytes are in flight on every SM (Little's law: 4.2 TB/s times
 * ~0.8 us of loaded latency is 25 kB on each of the H200's 132 SMs) and
 * nothing holds the loads back. The kernel this replaces loaded two 16-byte
 * chunks a lane at a time, each behind a branch (32 bytes a lane in flight),
 * and with a norm prologue normalized every x element again at every chunk
 * for every pair of columns (a shared load, a scalar load of the norm's
 * weight, two multiplies and a software rounding an element a token).
 *
 * Layout. A block of 8 warps computes 8 R columns (R = 2 or 4, chosen per
 * shape by the generator: kcu_plan_gemv); warp w takes columns w R .. w R +
 * R - 1. Lane l reads chunks l, l + 32, ... of VEC weights (16 bytes) of
 * each of its R rows, in steps of U chunks a row (R U = KCU_GEMV_LOADS at T
 * = 1, half that at T > 1, where the accumulators of 8 tokens take the
 * registers): a step is R U 16-byte loads into a lane's registers, all
 * unconditional (a column past N reads row 0, a chunk past K the last, and
 * neither is summed), and the next step's loads are issued before this
 * step's multiply-adds (two register buffers): at T = 1, 4 to 8 kB a warp in
 * flight, 64 to 128 kB an SM at two blocks (the kernel is compiled for two:
 * __launch_bounds__(256, 2), at most 128 registers a thread). The loads skip L1
 * (ld.global.nc.L1::no_allocate): each weight is read once, and L1 keeps the
 * x that every warp of the SM reads. A block issues its first step's loads
 * before anything else, so that HBM is busy while its prologue runs.
 *
 * x. Without a prologue, x is read from global memory (L1 after the first
 * warp) at each chunk. With one (a fused rms_norm or layer_norm), the block
 * computes the row statistics once (prepare), then all its threads stage
 * the norm's values, rounded to the norm's dtype as they always were, into
 * shared memory in that dtype (KCU_GEMV_XS_BYTES: all of K for every token
 * when it fits, as K = 4096 in bf16 does for T <= 5; else slabs of K of
 * whole steps, each staged between two barriers when the warps reach it), so
 * that the inner loop does one 16-byte shared load a chunk a token, as
 * without a prologue.
 *
 * Order. Each output is the same f32 sum as before this design: lane l's
 * chunks in order, each chunk's VEC products in order (fmaf), then the
 * butterfly; R, U and the staging change when values are read and which
 * warp sums them, not what is summed. T = 1 runs its own instance of the
 * loop (no per-token tests, deeper loads), T = 2 .. 8 one with accumulators
 * for 8 tokens.
 *
 * Expected on an H200 (bf16 weights and x; floor: the weights' bytes at 4.2
 * TB/s; from the design, before any measurement: `cuda_mm_check --gpu` times
 * these shapes). T = 1: the weights stream at about 90-95% of the copy rate,
 * plus about a microsecond a kernel to fill and drain (a block's prologue is
 * hidden behind its first loads and the SM's other block). T = 8: the
 * multiply-adds (64 a 16-byte chunk of a row) fill half of an SM's issue
 * slots, the x loads and conversions a quarter more at R = 4 and two fifths
 * at R = 2, and the staging of 8 tokens' norm values (in two slabs at K =
 * 4096) up to a third more for a block of 16 columns: the weights stream at
 * about 80% (R = 4) and 70% (R = 2).
 *
 *   Llama-3-8B (bf16)  K -> N      MB   R   floor     T = 1     T = 8
 *   q,k,v + rms    4096 -> 6144    50.3  2   12.0 us   13.5 us   17 us
 *   o              4096 -> 4096    33.6  2    8.0 us    9.5 us   11.5 us
 *   gate,up + rms  4096 -> 28672  234.9  4   55.9 us   60 us     70 us
 *   down          14336 -> 4096   117.4  2   28.0 us   30.5 us   40 us
 *   lm_head + rms  4096 -> 128256 1050.7 4  250 us    265 us    310 us
 *   a step's matmuls (32 layers and the head): 15.0 GB, 3.57 ms at the floor;
 *   expected 3.9 ms at T = 1 (the whole step took 8.64 ms before) and 4.7 ms
 *   at T = 8.
 * Measured: not yet.
 */
enum {
    KCU_GEMV_LOADS = 8,       /* 16-byte weight loads a lane a step at T = 1 (R U); T > 1: half */
    KCU_GEMV_XS_BYTES = 40960 /* shared memory for a block's staged x (the prologue's values) */
};

/* 16 bytes of weights (p 16-byte aligned), loaded to stream: each is read
 * once, so it is not kept in L1 (the x every warp reads stays there). */
__device__ __forceinline__ uint4 kcu_ld_stream(const void *p)
{
#ifdef __CUDA_ARCH__
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
#else
    return *reinterpret_cast<const uint4 *>(p);
#endif
}

/* kcu_wchunk<W, VEC>: VEC consecutive weights as stored (16 bytes; VEC 1:
 * one), streamed from memory (load), and as floats (unpack). */
template <typename W, int VEC> struct kcu_wchunk {
    typedef uint4 raw;
    static __device__ __forceinline__ raw load(const W *p) { return kcu_ld_stream(p); }
    static __device__ __forceinline__ void unpack(const raw &v, float *o) { kcu_vec<W>::unpack(v, o); }
};
template <typename W> struct kcu_wchunk<W, 1> {
    typedef W raw;
    static __device__ __forceinline__ raw load(const W *p) { return *p; }
    static __device__ __forceinline__ void unpack(const raw &v, float *o) { o[0] = kcu_f(v); }
};

/* VEC consecutive elements of dtype E (f32, bf16, f16) from shared memory,
 * as floats: 16 bytes a load when VEC of them make 16 bytes (p 16-byte
 * aligned), else one at a time. */
template <int VEC, typename E> __device__ __forceinline__ void kcu_lds(const E *p, float *o)
{
    enum { PER = 16 / (int)sizeof(E) };
    if constexpr (VEC % PER == 0) {
#pragma unroll
        for (int q = 0; q < VEC / PER; q++)
            kcu_vec<E>::unpack(*reinterpret_cast<const uint4 *>(p + q * PER), o + q * PER);
    } else {
#pragma unroll
        for (int j = 0; j < VEC; j++) o[j] = kcu_f(p[j]);
    }
}

/* The bits of v in dtype E, v being a value of E already (kcu_round's): exact. */
template <typename E> __device__ __forceinline__ unsigned kcu_held_bits(float v);
template <> __device__ __forceinline__ unsigned kcu_held_bits<kcu_bf16>(float v) { return kcu_bits(v) >> 16; }
template <> __device__ __forceinline__ unsigned kcu_held_bits<kcu_f16>(float v) { return kcu_f16_bits(v); }
template <> __device__ __forceinline__ unsigned kcu_held_bits<float>(float v) { return kcu_bits(v); }

/* VEC values of dtype E (each a value of E already) into shared memory at p,
 * as kcu_lds reads them back: 16 bytes a store when they make 16 bytes. */
template <int VEC, typename E> __device__ __forceinline__ void kcu_sts(E *p, const float *v)
{
    enum { PER = 16 / (int)sizeof(E) };
    if constexpr (VEC % PER == 0) {
#pragma unroll
        for (int q = 0; q < VEC / PER; q++) {
            unsigned u[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float *e = v + q * PER;
                u[i] = sizeof(E) == 4 ? kcu_held_bits<E>(e[i])
                                      : kcu_held_bits<E>(e[2 * i]) | kcu_held_bits<E>(e[2 * i + 1]) << 16;
            }
            *reinterpret_cast<uint4 *>(p + q * PER) = uint4{u[0], u[1], u[2], u[3]};
        }
    } else {
#pragma unroll
        for (int j = 0; j < VEC; j++) kcu_put(p + j, v[j]);
    }
}

/* kcu_matmul_small's shapes for TG tokens of accumulators. */
template <typename W, int K, int R, int TG, typename XO, bool STAGED> struct kcu_gemv {
    enum {
        B = KCU_MM_THREADS,
        VEC = (K * sizeof(W)) % 16 == 0 ? (int)kcu_vec<W>::N : 1, /* rows 16-byte aligned: vector loads */
        CHUNKS = K / VEC,
        U = (TG == 1 ? KCU_GEMV_LOADS : KCU_GEMV_LOADS / 2) / R, /* chunks of each row a lane loads a step */
        STEP = 32 * U,                                             /* chunks of each row a warp takes a step */
        STEPS = (CHUNKS + STEP - 1) / STEP,                        /* steps a row */
        RAGGED = CHUNKS % STEP != 0,                               /* the last step has chunks past K */
        XS = STAGED ? KCU_GEMV_XS_BYTES / (int)sizeof(XO) : 1      /* staged x elements */
    };
    static_assert(R == 2 || R == 4, "kcu_matmul_small: 2 or 4 columns a warp");
    static_assert(U >= 1 && R / 2 * TG <= 32, "kcu_matmul_small: a load a row, a lane a (pair, token)");
    static_assert(!STAGED || XS / (TG * VEC) >= STEP, "kcu_matmul_small: a slab holds a step of every token");
    typedef kcu_wchunk<W, VEC> WC;
    typedef typename WC::raw Raw;
};

/* The end of a decode matmul's warp (kcu_gemv_tokens, kcu_qgemv_tokens): its 32 partial sums of each
 * (column, token) totalled in every lane by a butterfly of shuffles, then lane p TG + t hands pair p's
 * sums for token t to the epilogue (one call site: the epilogue is compiled once an instance). */
template <int R, int TG, class Epi>
static __device__ __forceinline__ void kcu_gemv_hand(float (&acc)[R][TG], const int (&rows)[R], const int t0, const int TT,
                                                     const int lane, const Epi &epi)
{
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < TG; t++) {
            if (TG > 1 && t >= TT) break;
#pragma unroll
            for (int sh = 16; sh > 0; sh >>= 1) acc[r][t] += __shfl_xor_sync(0xffffffffu, acc[r][t], sh);
        }
    float v0 = 0.0f, v1 = 0.0f;
    int n0 = -1, n1 = -1;
#pragma unroll
    for (int p = 0; p < R / 2; p++)
#pragma unroll
        for (int t = 0; t < TG; t++)
            if (lane == p * TG + t) v0 = acc[2 * p][t], v1 = acc[2 * p + 1][t], n0 = rows[2 * p], n1 = rows[2 * p + 1];
    const int tq = lane % TG;
    if (lane < R / 2 * TG && tq < TT) {
        if (n1 >= 0)
            epi.two(t0 + tq, n0, v0, n1, v1);
        else if (n0 >= 0)
            epi.one(t0 + tq, n0, v0);
    }
}

/* Tokens t0 .. t0 + TT - 1 (TT <= TG) of kcu_matmul_small, with accumulators
 * for TG tokens: 1 (no per-token tests), or KCU_GEMV_T for any TT. xs: the
 * shared staging buffer when the prologue is staged. */
template <int TG, typename W, int K, int N, int R, class Pro, class Epi, typename X, typename XO>
static __device__ __forceinline__ void kcu_gemv_tokens(const int T, const int t0, const int TT, const X *__restrict__ x,
                                                       const W *__restrict__ w, Pro &pro, const Epi &epi, XO *xs)
{
    enum { STAGED = !kcu_same<Pro, kcu_pro_none>::V };
    typedef kcu_gemv<W, K, R, TG, XO, STAGED> G;
    typedef typename G::WC WC;
    typedef typename G::Raw Raw;
    enum { VEC = G::VEC, CHUNKS = G::CHUNKS, U = G::U, STEP = G::STEP, STEPS = G::STEPS, RAGGED = G::RAGGED };
    const int tid = threadIdx.x, lane = tid % 32;
    /* this warp's columns c0 .. c0 + R - 1: their weight rows (-1 past N) */
    const int c0 = ((int)blockIdx.x * (G::B / 32) + tid / 32) * R;
    int rows[R];
#pragma unroll
    for (int r = 0; r < R; r++) rows[r] = c0 + r < N ? Epi::row(c0 + r) : -1;
    /* staged: chunks of each token a slab, whole steps; all of K when it fits */
    const int fit = STAGED ? G::XS / (TT * VEC) / STEP * STEP : STEPS * STEP;
    const int slab = fit < STEPS * STEP ? fit : STEPS * STEP, slab_steps = slab / STEP;
    /* step s into buf: every load issued (a column past N reads row 0, a chunk past K the last), none waited for */
    auto load = [&](int s, Raw(&buf)[R][U]) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            int c = s * STEP + u * 32 + lane;
            if (RAGGED && c >= CHUNKS) c = CHUNKS - 1;
#pragma unroll
            for (int r = 0; r < R; r++) buf[r][u] = WC::load(w + (long long)(rows[r] < 0 ? 0 : rows[r]) * K + c * VEC);
        }
    };
    /* the prologue's values of chunks [s0, s0 + slab) of every token into xs, between two barriers */
    auto stage = [&](int s0) {
        __syncthreads(); /* every warp is done with the previous slab (and prepare's statistics are in) */
        const int n = CHUNKS - s0 < slab ? CHUNKS - s0 : slab;
        for (int t = 0; t < TT; t++)
            for (int c = tid; c < n; c += G::B) {
                const long long row = t0 + t;
                const int k = (s0 + c) * VEC;
                float v[VEC];
                kcu_xload<VEC>(x + row * K + k, v);
                pro.template chunk<VEC>(v, row, k);
                kcu_sts<VEC>(xs + (t * slab + c) * VEC, v);
            }
        __syncthreads();
    };
    float acc[R][TG];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < TG; t++) acc[r][t] = 0.0f;
    /* step s: stage its slab if it starts one, issue the next step's loads, sum this one's */
    auto step = [&](int s, const Raw(&use)[R][U], Raw(&fill)[R][U]) {
        int s0 = 0; /* the staged slab's first chunk */
        if constexpr (STAGED) {
            if (s % slab_steps == 0) stage(s * STEP);
            s0 = s / slab_steps * slab;
        }
        if (s + 1 < STEPS) load(s + 1, fill);
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = s * STEP + u * 32 + lane;
            if (RAGGED && c >= CHUNKS) continue;
            float wv[R][VEC];
#pragma unroll
            for (int r = 0; r < R; r++) WC::unpack(use[r][u], wv[r]);
#pragma unroll
            for (int t = 0; t < TG; t++) {
                if (TG > 1 && t >= TT) break;
                float xv[VEC];
                if constexpr (STAGED)
                    kcu_lds<VEC>(xs + (t * slab + c - s0) * VEC, xv);
                else
                    kcu_xload<VEC>(x + (long long)(t0 + t) * K + c * VEC, xv);
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int j = 0; j < VEC; j++) acc[r][t] = fmaf(xv[j], wv[r][j], acc[r][t]);
            }
        }
    };
    Raw wa[R][U], wb[R][U];
    load(0, wa); /* in flight while the prologue runs */
    if constexpr (STAGED) pro.prepare(x, T, t0, TT);
#pragma unroll 1
    for (int s = 0; s < STEPS - 1; s += 2) {
        step(s, wa, wb);
        step(s + 1, wb, wa);
    }
    if (STEPS % 2) step(STEPS - 1, wa, wb);
    kcu_gemv_hand<R, TG>(acc, rows, t0, TT, lane, epi);
}

/* The decode path (T <= KCU_GEMV_T; a longer step is taken KCU_GEMV_T
 * tokens at a time, correct but slow), as described above: R columns a warp,
 * 8 R a block (its grid: ceil(N / (8 R)) blocks). Its own kernel, so that its
 * registers and occupancy are not the tiled path's. */
template <typename W, int K, int N, int R, class Pro, class Epi, typename X>
static __device__ __forceinline__ void kcu_matmul_small(const int T, const X *__restrict__ x,
                                                        const W *__restrict__ w, Pro pro, const Epi &epi)
{
    typedef typename Pro::template out<X>::T XO; /* what the matmul multiplies: x, or the norm's values */
    enum { STAGED = !kcu_same<Pro, kcu_pro_none>::V, GT = KCU_GEMV_T };
    XO *xs = nullptr; /* [TT][slab * VEC]: the prologue's values of the chunks staged */
    if constexpr (STAGED) {
        __shared__ uint4 xs_buf[KCU_GEMV_XS_BYTES / 16]; /* 16-byte aligned */
        xs = reinterpret_cast<XO *>(xs_buf);
    }
    for (int t0 = 0; t0 < T; t0 += GT) {
        const int TT = T - t0 < GT ? T - t0 : GT;
        if (TT == 1)
            kcu_gemv_tokens<1, W, K, N, R>(T, t0, TT, x, w, pro, epi, xs);
        else
            kcu_gemv_tokens<GT, W, K, N, R>(T, t0, TT, x, w, pro, epi, xs);
    }
}

/* ---- matmul over quantized weights (ir/quant.h; passes/quantize.c) -----------------------------
 *
 * out[t, n] = sum_k x[t, k] (code[n, k] - zero[n, k / G]) scale[n, k / G]: QB-bit codes (4: two a
 * byte, the even k in the low nibble; 8: a byte, FLIP for i8's signed codes, read as unsigned ones
 * around 128), a scale (type S) and, ASYM, a u8 zero point for each G columns of a row; without zero
 * points the codes' midpoint (8, 128). Like kcu_matmul_small: R columns a warp, a lane 16-byte chunks
 * c = lane, lane + 32, ... of each row (32 u4 or 16 8-bit codes, one group's), two steps in flight
 * (the next chunk's loads issued before this one's sums), then the warp's butterfly; TG tokens at a
 * time (a longer step KCU_GEMV_T tokens at a time; past the decode path with half x, kcu_matmul_mma's
 * tiles instead). One token's
 * chunk sum is scale (sum_j x_j q_j - zero sum_j x_j), several tokens' each weight's (q - zero) scale
 * times x, in f32: the reference (runtime/interp) dequantizes each weight first, so they differ by
 * f32 roundings. x is read where it lies (no prologue: the
 * quantize pass's matmuls take none, passes/fuse_norm_prologue.c). */
/* u4 codes as kcu_qgemv_tokens sums them: the 8 codes of 32-bit word w as floats 0.5 + q / 256 (the code
 * in bits 16..19 of 0.5's mantissa: one byte permute a code, after two masks for the 8), so that
 * sum_j x_j q_j = 256 sum_j x_j v_j - 128 sum_j x_j: two instructions a weight where converting q itself
 * takes four (measured compute-bound: 1.4 TB/s of codes on an H100) at the cost of ~4 of the sum's 24
 * bits (q / 256 against 0.5): fast precision only (half x); exact precision converts q itself */
static __device__ __forceinline__ void kcu_u4_halves(unsigned w, float (&v)[8])
{
    const unsigned lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu; /* codes 0, 2, 4, 6 and 1, 3, 5, 7 */
#pragma unroll
    for (int b = 0; b < 4; b++) {
        v[2 * b] = __uint_as_float(__byte_perm(lo, 0x3F000000u, 0x7054u | (unsigned)b << 8));
        v[2 * b + 1] = __uint_as_float(__byte_perm(hi, 0x3F000000u, 0x7054u | (unsigned)b << 8));
    }
}

/* 8-bit codes as kcu_qgemv_tokens sums them: code j of piece p (8 codes, two 32-bit words of a chunk's 16
 * bytes) as an exact float (FLIP: i8's signed code read as unsigned around 128; E4M3: the e4m3 value). */
template <bool FLIP, bool E4M3 = false> static __device__ __forceinline__ float kcu_code8(const uint4 &raw, int p, int j)
{
    const unsigned wd[4] = {raw.x, raw.y, raw.z, raw.w};
    unsigned q = (wd[2 * p + j / 4] >> (8 * (j % 4))) & 255u;
    if (E4M3) return kcu_e4m3_value(q);
    if (FLIP) q ^= 128u;
    return __uint_as_float(0x4B000000u | q) - 8388608.0f;
}

template <int QB, bool FLIP, bool ASYM, int K, int N, int G, int R, int TG, bool E4M3, typename S, class Pro, class Epi,
          typename X>
static __device__ __forceinline__ void kcu_qgemv_tokens(const int t0, const int TT, const X *__restrict__ x,
                                                        const unsigned char *__restrict__ codes,
                                                        const S *__restrict__ scale,
                                                        const unsigned char *__restrict__ zero, const Pro &pro,
                                                        const Epi &epi)
{
    enum { PER = 128 / QB, PIECES = PER / 8, CHUNKS = K / PER, ROW = K * QB / 8, NG = K / G,
           STEPS = (CHUNKS + 31) / 32 /* a step: a chunk of each row a lane */ };
    static_assert(K % PER == 0 && G % PER == 0, "kcu_matmul_q: a 16-byte chunk of codes lies in one group");
    static_assert(R / 2 * TG <= 32, "kcu_matmul_q: a lane a (pair, token)");
    const int tid = threadIdx.x, lane = tid % 32;
    const int c0 = ((int)blockIdx.x * (KCU_MM_THREADS / 32) + tid / 32) * R;
    int rows[R];
#pragma unroll
    for (int r = 0; r < R; r++) rows[r] = c0 + r < N ? Epi::row(c0 + r) : -1;
    float acc[R][TG];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < TG; t++) acc[r][t] = 0.0f;
    const float mid = E4M3 ? 0.0f : QB == 4 ? 8.0f : 128.0f;
    /* step st's chunk of each row (the last chunk past the end: its sums are skipped), its scales and zeros */
    auto load = [&](int st, uint4 (&raw)[R], float (&sc)[R], float (&zp)[R]) {
        const int c = st * 32 + lane < CHUNKS ? st * 32 + lane : CHUNKS - 1;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const long long row = rows[r] < 0 ? 0 : rows[r];
            raw[r] = __ldg(reinterpret_cast<const uint4 *>(codes + row * ROW + (long long)c * 16));
            const long long gi = row * NG + (long long)c * PER / G;
            sc[r] = kcu_f(scale[gi]);
            zp[r] = ASYM ? (float)zero[gi] : mid;
        }
    };
    /* a chunk's sum a (row, token): scale (sum_j x_j q_j - zero sum_j x_j), each product summed in the
     * chunk's order (piece p, code j) whatever TG is, so that a token's sums do not depend on what its
     * step holds (batch invariance). One token: x loaded once a piece, the codes turned into floats for
     * each row; several: the codes once a (piece, row), x again from L1 for each row. */
    auto sum = [&](int st, const uint4 (&raw)[R], const float (&sc)[R], const float (&zp)[R]) {
        const int c = st * 32 + lane;
        if (c >= CHUNKS) return;
        float dq[R][TG], xs[TG];
#pragma unroll
        for (int t = 0; t < TG; t++) {
            xs[t] = 0.0f;
#pragma unroll
            for (int r = 0; r < R; r++) dq[r][t] = 0.0f;
        }
        /* u4 codes with half x (fast precision) as 0.5 + q / 256 (kcu_u4_halves); f32 x (exact) keeps q itself */
        enum { HALVES = QB == 4 && !kcu_same<typename Pro::template out<X>::T, float>::V };
        auto codes8 = [&](int r, int p, float (&v)[8]) {
            const unsigned wd[4] = {raw[r].x, raw[r].y, raw[r].z, raw[r].w};
            if constexpr (HALVES) {
                kcu_u4_halves(wd[p], v);
            } else if constexpr (QB == 4) {
#pragma unroll
                for (int j = 0; j < 8; j++) v[j] = __uint_as_float(0x4B000000u | ((wd[p] >> (4 * j)) & 15u)) - 8388608.0f;
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) v[j] = kcu_code8<FLIP, E4M3>(raw[r], p, j);
            }
        };
#pragma unroll
        for (int p = 0; p < PIECES; p++) {
            if constexpr (TG == 1) {
                float xv[8];
                kcu_xload<8>(x + (long long)t0 * K + (long long)c * PER + 8 * p, xv);
                pro.template chunk<8>(xv, t0, c * PER + 8 * p); /* fp8, w8a8: x's codes times its scale */
#pragma unroll
                for (int j = 0; j < 8; j++) xs[0] += xv[j];
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float v[8];
                    codes8(r, p, v);
#pragma unroll
                    for (int j = 0; j < 8; j++) dq[r][0] = fmaf(xv[j], v[j], dq[r][0]);
                }
            } else {
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float v[8];
                    codes8(r, p, v);
#pragma unroll
                    for (int t = 0; t < TG; t++) {
                        if (t >= TT) break;
                        float xv[8];
                        kcu_xload<8>(x + (long long)(t0 + t) * K + (long long)c * PER + 8 * p, xv);
                        pro.template chunk<8>(xv, t0 + t, c * PER + 8 * p);
                        if (r == 0)
#pragma unroll
                            for (int j = 0; j < 8; j++) xs[t] += xv[j];
#pragma unroll
                        for (int j = 0; j < 8; j++) dq[r][t] = fmaf(xv[j], v[j], dq[r][t]);
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < TG; t++) {
                const float xq = HALVES ? 256.0f * dq[r][t] - 128.0f * xs[t] : dq[r][t]; /* sum_j x_j q_j */
                acc[r][t] = fmaf(sc[r], xq - zp[r] * xs[t], acc[r][t]);
            }
    };
    /* one token: two steps in flight (the next step's loads issued before this one's sums); several: a
     * step at a time (their sums hide the loads) */
    if constexpr (TG == 1) {
        uint4 ra[R], rb[R];
        float sa[R], sb[R], za[R], zb[R];
        load(0, ra, sa, za);
#pragma unroll 1
        for (int st = 0; st < STEPS; st += 2) {
            if (st + 1 < STEPS) load(st + 1, rb, sb, zb);
            sum(st, ra, sa, za);
            if (st + 1 >= STEPS) break;
            if (st + 2 < STEPS) load(st + 2, ra, sa, za);
            sum(st + 1, rb, sb, zb);
        }
    } else {
#pragma unroll 1
        for (int st = 0; st < STEPS; st++) {
            uint4 ra[R];
            float sa[R], za[R];
            load(st, ra, sa, za);
            sum(st, ra, sa, za);
        }
    }
    kcu_gemv_hand<R, TG>(acc, rows, t0, TT, lane, epi);
}

/* pro: what the matmul multiplies of x — x as it is (kcu_pro_none), a fused norm's values (kcu_pro_rms,
 * kcu_pro_ln: w4a16 and w8a16), or x quantized a token at a time (kcu_pro_xq: fp8 and w8a8), each row's
 * statistics computed by the block first. E4M3: f8e4m3 codes (fp8). */
template <int QB, bool FLIP, bool ASYM, int K, int N, int G, int R, bool PREFILL, bool E4M3 = false, typename S,
          class Pro, class Epi, typename X>
static __device__ __forceinline__ void kcu_matmul_q(const int T, const X *__restrict__ x,
                                                    const unsigned char *__restrict__ codes, const S *__restrict__ scale,
                                                    const unsigned char *__restrict__ zero, Pro pro, const Epi &epi)
{
#if KCU_MMA
    /* the prefill kernel (PREFILL: steps past the decode path's, on the prefill grid, R == 2) with half x
     * (fast precision): the tiles of kcu_matmul_mma on tensor cores, each weight dequantized as it is
     * loaded (kcu_qsrc); the decode kernel keeps every step on the sums above (batch invariance) */
    if constexpr (PREFILL && !kcu_same<typename Pro::template out<X>::T, float>::V) {
        static_assert(R == 2, "kcu_matmul_q: the prefill grid is a block for every 16 columns");
        enum { GRID = (N + KCU_MM_GRID_COLS - 1) / KCU_MM_GRID_COLS };
        typedef typename Pro::template out<X>::T XO; /* the mma's half type */
        kcu_matmul_mma<X, K, N, GRID, 1, 64, 1>(T, x, kcu_qsrc<QB, FLIP, ASYM, K, G, S, XO, E4M3>{codes, scale, zero, 0, 0},
                                                 pro, epi);
        return;
    }
#endif
    for (int t0 = 0; t0 < T; t0 += KCU_GEMV_T) {
        const int TT = T - t0 < KCU_GEMV_T ? T - t0 : KCU_GEMV_T;
        pro.prepare(x, T, t0, TT); /* the rows' statistics, by the whole block */
        if (TT == 1)
            kcu_qgemv_tokens<QB, FLIP, ASYM, K, N, G, R, 1, E4M3>(t0, TT, x, codes, scale, zero, pro, epi);
        else
            kcu_qgemv_tokens<QB, FLIP, ASYM, K, N, G, R, KCU_GEMV_T, E4M3>(t0, TT, x, codes, scale, zero, pro, epi);
    }
}

/* ---- matmul, decode on tensor cores (fast precision, T <= kcu.h's KCU_DECODE_T) ---------------
 *
 * kcu_matmul_small sums on CUDA cores: at T = 8 its 8 multiply-adds a weight,
 * with the unpacking and the x loads, make it compute-bound (the 8B's 8-token
 * step took 3 times the one-token step, bench/RESULTS.md #10 step 11), and a
 * step of more than 8 tokens took another kernel, another order, so that a
 * sequence's logits changed with the batch it shared a step with. In fast
 * precision (x, or the fused norm's values, of the weights' half dtype: every
 * product exact in f32) this path takes every step of 1 to KCU_DECODE_T tokens (kcu.h),
 * on the tensor cores, each output summed in an order fixed by the weight's
 * shape alone: the same bits for a token whatever else its step holds.
 *
 * Layout. A block of 8 warps computes J tiles of 16 columns (weight rows
 * Epi::row(c)) one after another, for all the step's tokens; K is cut into
 * chunks of 32, and warp w takes chunks w CW .. w CW + CW - 1 (CW =
 * ceil(chunks / 8): chunks past K are zeros). A chunk is two mma.m16n8k16 a
 * token tile of 8, the weights as the A operand (rows) and the tokens as B:
 * lane (g, c) loads 16 bytes of each of its rows g and g + 8 (k = 32 j + 8 c
 * .. + 7) and 16 bytes of token g of each token tile at the same k, and uses
 * words 0, 1 of each as the first mma's k 2c, 2c+1 and 2c+8, 2c+9, words 2,
 * 3 as the second's: a relabelling of k, the same for both operands, so the
 * sum is of the same products. A lane's weight chunks come by cp.async (16
 * bytes, past L1) into its own slots of a ring in dynamic shared memory
 * (RING bytes, kcu_tc_tiles), many steps ahead of their use: the bytes in
 * flight cost no registers, and the block's J tiles are one stream.
 *
 * Order. Per warp and chunk, the two mma from zero, then added to the warp's
 * f32 sum (kcu_mma_warp: the tensor cores' truncation stays inside 32
 * products); the 8 warps' sums go through shared memory and are added in warp
 * order, then the epilogue gets each column pair (kcu_matmul's interface).
 * Nothing depends on T, J or on which tile a token sits in: a token tile's mma
 * reads only its own column of B, and tiles of tokens past the step compute
 * on a copy of its last token and are dropped. Steps of more tokens than
 * KCU_TC_GROUP go group by group, the weights read again.
 *
 * The norm prologue (kcu_pro_rms / _ln): the block's tokens' statistics once
 * a group (prepare), then the norm's values (rounded to its half dtype, as
 * everywhere: chunk8) either staged once in shared memory by the whole block
 * when the group's x fits KCU_TC_XS_BYTES (T <= 3 at K = 4096: the one-token
 * decode), or made chunk by chunk in the loop. J > 1 (the generator's plan:
 * many tiles) spreads that work over J tiles.
 *
 * Steps of 9-32 tokens with a norm (kcu_tc_wide): a tile at a time, every
 * tile would read and normalize the step's x again (32 tokens' x through L2,
 * 8 times the weights' bytes at K = 4096, measured 248 µs for the 8B's gate/up
 * where its weights take 56). Instead a block takes 8 tiles at once, a warp
 * each, and walks the 8 K slices in order: the whole block stages slice s's
 * norm values once (32 kB at K = 4096), each warp sums its tile's slice s
 * exactly as warp s of a tile does, and adds it to a running sum — slice 0's
 * sum, then + slice 1's, ...: the warp-order total of the tile path, the same
 * bits. Blocks past the 8-tile groups return.
 */
enum {
    KCU_TC_GROUP = 32,       /* tokens a pass over the weights: 4 tiles of 8 (the generator's KCU_DECODE_T: one pass) */
    KCU_TC_RED_BYTES = 16384, /* shared memory for the 8 warps' sums of a tile: [8][16][KCU_TC_GROUP] f32 */
    KCU_TC_XS_BYTES = 24576,  /* shared memory for a group's staged norm values */
    KCU_TC_SMEM = KCU_TC_RED_BYTES + KCU_TC_XS_BYTES, /* both, one buffer (kcu_tc_wide's slab takes all of it) */
    KCU_TC_WIDE_BLOCKS = 132 /* kcu_tc_wide's least groups of 8 tiles: a block for each SM of an H100 or H200
                                (fewer, as the 8B's q,k,v at 48, keep too few bytes in flight: 114 µs at T = 32
                                against 72 a tile at a time, #11 step 2) */
};

template <typename W, int K> struct kcu_tc {
    enum {
        WARPS = KCU_MM_THREADS / 32,
        CH = (K + 31) / 32,           /* chunks of 32 k */
        CW = (CH + WARPS - 1) / WARPS /* chunks a warp */
    };
    static_assert(K % 8 == 0, "kcu_matmul_tc: rows of whole 16-byte chunks");
};

/* 16 bytes of a half row at k, streamed; zeros from K on (K % 8 == 0: all or none). */
template <int K, typename H> __device__ __forceinline__ uint4 kcu_tc_ldw(const H *row, int k)
{
    return k < K ? kcu_ld_stream(row + k) : uint4{0u, 0u, 0u, 0u};
}
/* 16 bytes of x at k (read through L1: every block of the SM reads x); zeros from K on. */
template <int K, typename H> __device__ __forceinline__ uint4 kcu_tc_ldx(const H *row, int k)
{
    return k < K ? *reinterpret_cast<const uint4 *>(row + k) : uint4{0u, 0u, 0u, 0u};
}
/* The L2 line of p fetched ahead (its first step's weights, while the block prepares). */
__device__ __forceinline__ void kcu_prefetch_l2(const void *p)
{
#ifdef __CUDA_ARCH__
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
    (void)p;
#endif
}

/* Eight values of dtype E (each a value of E already) as four words of pairs, the lower k in the low half. */
template <typename E> __device__ __forceinline__ uint4 kcu_pack8(const float *v)
{
    unsigned q[4];
#pragma unroll
    for (int i = 0; i < 4; i++) q[i] = kcu_held_bits<E>(v[2 * i]) | kcu_held_bits<E>(v[2 * i + 1]) << 16;
    return uint4{q[0], q[1], q[2], q[3]};
}

/* The norm's values of tokens t0 .. t0 + TT - 1 at k = kbase .. kbase + 8 Q - 1 (zeros from K on),
 * 16-byte chunks of dtype XO, chunk q of token t into dst[t QP + q], by the block's threads: the loads
 * of x and of the norm's weights KCU_STAGE_BATCH chunks a thread at a time, then their values (one
 * round trip to L2 a batch where a load, its values and its store one after another took one a chunk).
 * The caller synchronizes the block before (dst is read) and after. */
enum { KCU_STAGE_BATCH = 8 };
template <int K, int Q, int QP, typename XO, typename X, class Pro>
__device__ __forceinline__ void kcu_tc_stage(const X *__restrict__ x, const Pro &pro, int t0, int TT, int kbase, uint4 *dst)
{
    const int n = TT * Q;
#pragma unroll 1
    for (int i0 = 0; i0 < n; i0 += KCU_STAGE_BATCH * KCU_MM_THREADS) {
        uint4 xr[KCU_STAGE_BATCH], gr[KCU_STAGE_BATCH];
#pragma unroll
        for (int b = 0; b < KCU_STAGE_BATCH; b++) {
            const int i = i0 + (int)threadIdx.x + b * KCU_MM_THREADS, k = kbase + 8 * (i % Q);
            if (i < n && k < K) {
                xr[b] = *reinterpret_cast<const uint4 *>(x + (long long)(t0 + i / Q) * K + k);
                gr[b] = pro.raw16(k);
            }
        }
#pragma unroll
        for (int b = 0; b < KCU_STAGE_BATCH; b++) {
            const int i = i0 + (int)threadIdx.x + b * KCU_MM_THREADS, k = kbase + 8 * (i % Q);
            if (i < n) {
                uint4 q = uint4{0u, 0u, 0u, 0u};
                if (k < K) {
                    float v[8];
                    kcu_vec<X>::unpack(xr[b], v);
                    pro.chunk8(v, t0 + i / Q, k, gr[b]);
                    q = kcu_pack8<XO>(v);
                }
                dst[(i / Q) * QP + i % Q] = q;
            }
        }
    }
}

/* One chunk of a 16-row tile: the two mma of k 32 j .. + 31 into acc (NT token tiles), from lane (g,
 * c)'s 16 bytes of rows g and g + 8 (a0, a1) and of each token tile's token g (xq[n]), the words
 * relabelled as described above. */
template <int NT, typename W>
__device__ __forceinline__ void kcu_tc_chunk(float (&acc)[NT][4], const uint4 (&xq)[NT], const uint4 &a0, const uint4 &a1)
{
    kcu_mma_frag<NT, 1, 1> f[2];
#pragma unroll
    for (int n = 0; n < NT; n++) {
        f[0].b[n][0][0] = xq[n].x, f[0].b[n][0][1] = xq[n].y;
        f[1].b[n][0][0] = xq[n].z, f[1].b[n][0][1] = xq[n].w;
    }
    f[0].a[0][0] = a0.x, f[0].a[0][1] = a1.x, f[0].a[0][2] = a0.y, f[0].a[0][3] = a1.y;
    f[1].a[0][0] = a0.z, f[1].a[0][1] = a1.z, f[1].a[0][2] = a0.w, f[1].a[0][3] = a1.w;
    kcu_mma_warp<NT, 1, 1, 2, W>(acc, acc, f); /* one part each: no second sum */
}

/* Column pair col, col + 1 (col + 1 past N: col alone) of token t0 + t to the epilogue. */
template <int N, class Epi>
__device__ __forceinline__ void kcu_tc_hand(const Epi &epi, long long t, int col, float v0, float v1)
{
    if (col + 1 < N)
        epi.two(t, Epi::row(col), v0, Epi::row(col + 1), v1);
    else if (col < N)
        epi.one(t, Epi::row(col), v0);
}

/* cp.async: 16 bytes from global memory at p to this thread's shared s, past L1 (the weights, read
 * once), in flight without a register; kcu_cp_commit closes this thread's group of them, and
 * kcu_cp_wait<N> returns when at most its last N groups are in flight (the others' bytes are in its
 * shared memory, for it to read). The emulator copies at once. */
__device__ __forceinline__ void kcu_cp16(uint4 *s, const void *p)
{
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(s)), "l"(p)
                 : "memory");
#else
    *s = *reinterpret_cast<const uint4 *>(p);
#endif
}
__device__ __forceinline__ void kcu_cp_commit()
{
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void kcu_cp_wait()
{
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

/* The block's tiles tile0 .. tile0 + nt - 1 (columns 16 tile .. + 15) for tokens t0 .. t0 + TT - 1
 * (TT <= 8 NT), NT token tiles, as one stream of weight steps (U chunks of each of a lane's two rows)
 * through ring, RING bytes of shared memory: D steps of slots, [D][U][2 rows][KCU_MM_THREADS] 16-byte
 * chunks, each thread's its own (it reads only what it copied: no barrier), step gs's copies issued
 * D - 1 steps ahead of its use, so the next tile's are in flight through a tile's epilogue. The
 * first D - 1 steps' copies are issued before prep() (the norm's statistics and staged values), which
 * runs then. XS: the norm's values of the group from xs ([TT][K / 8] chunks, staged), else x (and the
 * norm's weights) a step ahead in registers and normalized in the loop. red: the block's shared
 * [8 warps][16][8 NT] partial sums. */
/* KCU_TC_XRING: steps of more than 8 tokens (four token tiles) copy their x chunks into the ring with the
 * weights' (cp.async, D - 1 steps ahead) instead of loading them into registers a step or two ahead: 32
 * tokens' x is twice a step's weights and comes from L2, ~600 cycles a load, where a step's work is ~100
 * (the tile path at 32 tokens took q,k,v in 89.5 µs, 5x its weights' time: #11 step 9). Same values,
 * same sums: the bits do not depend on it. */
#ifndef KCU_TC_XRING
#define KCU_TC_XRING 1 /* the generator defines 0 with kcu_options.tc_xring < 0 (KILN_CUDA_TC_XRING=0) */
#endif
template <int NT, bool XS, int RING, int XA, typename W, int K, int N, class Pro, class Epi, typename X, class Prep>
static __device__ __forceinline__ void kcu_tc_tiles(const int t0, const int TT, const int tile0, const int nt,
                                                    const X *__restrict__ x, const W *__restrict__ w,
                                                    const Pro &pro, const Epi &epi, float *red, const uint4 *xs,
                                                    uint4 *ring, const Prep &prep)
{
    typedef kcu_tc<W, K> G;
    enum {
        FUSED = !kcu_same<Pro, kcu_pro_none>::V && !XS, /* the norm applied in the loop */
        CW = G::CW,
        TP = 8 * NT,                               /* tokens a row of red */
        U = NT == 1 ? 2 : 1,                       /* chunks a step */
        STEPS = (CW + U - 1) / U,                  /* steps a tile */
        XR = KCU_TC_XRING && !XS && NT > 1 && sizeof(X) == sizeof(W), /* x through the ring too */
        SLOT = (2 + (XR ? NT : 0)) * U * KCU_MM_THREADS, /* a step's chunks in the ring */
        D = RING / 16 / SLOT                       /* steps the ring holds */
    };
    static_assert(D >= 2, "kcu_matmul_tc: a ring of two steps at least");
    typedef typename Pro::template out<X>::T XO;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, c = lane % 4;
    /* this lane's token of tile n in the group (past the step: its last token) */
    auto tg = [&](int n) -> int { return 8 * n + g < TT ? 8 * n + g : TT - 1; };
    const int kw = warp * CW * 32 + 8 * c; /* this lane's k in its warp's first chunk */
    const int S = nt * STEPS;              /* the block's steps */
    /* step gs's copies into its slots (zeros for chunks past the warp's or past K), one group */
    auto issue = [&](int gs) {
        if (gs < S) {
            const int s = gs % STEPS, c0 = (tile0 + gs / STEPS) * 16;
            uint4 *slot = ring + (gs % D) * SLOT + tid;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int col = c0 + g + 8 * h;
                const W *row = w + (long long)(col < N ? Epi::row(col) : 0) * K;
#pragma unroll
                for (int u = 0; u < U; u++) {
                    const int j = s * U + u, k = kw + 32 * j;
                    uint4 *d = slot + (2 * u + h) * KCU_MM_THREADS;
                    if (j < CW && k < K)
                        kcu_cp16(d, row + k);
                    else
                        *d = uint4{0u, 0u, 0u, 0u};
                }
            }
            if constexpr (XR) { /* the step's x chunks of this thread's tokens, after the weights' */
#pragma unroll
                for (int u = 0; u < U; u++) {
                    const int j = s * U + u, k = kw + 32 * j;
#pragma unroll
                    for (int n = 0; n < NT; n++) {
                        uint4 *d = slot + (2 * U + u * NT + n) * KCU_MM_THREADS;
                        if (j < CW && k < K)
                            kcu_cp16(d, x + (long long)(t0 + tg(n)) * K + k);
                        else
                            *d = uint4{0u, 0u, 0u, 0u};
                    }
                }
            }
        }
        kcu_cp_commit(); /* past the end an empty group: the count stays D - 1 ahead */
    };
    auto load_x = [&](int gs, uint4(&xb)[NT][U], uint4(&gb)[U]) {
        if constexpr (!XS) {
            const int s = gs % STEPS;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int j = s * U + u, k = kw + 32 * j;
                const bool in = j < CW;
#pragma unroll
                for (int n = 0; n < NT; n++)
                    if constexpr (!XR) xb[n][u] = in ? kcu_tc_ldx<K>(x + (long long)(t0 + tg(n)) * K, k) : uint4{0u, 0u, 0u, 0u};
                if constexpr (FUSED) gb[u] = in && k < K ? pro.raw16(k) : uint4{0u, 0u, 0u, 0u};
            }
        }
    };
    float acc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[n][e] = 0.0f;
    /* the tile's sums: the warps' added in warp order; lane (g, c)'s d[e] is row g + 8 (e / 2), token 2c + e % 2 */
    auto finish = [&](int tile) {
        __syncthreads(); /* the previous tile's sums are read */
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                red[(warp * 16 + g + 8 * (e >> 1)) * TP + 8 * n + 2 * c + (e & 1)] = acc[n][e];
                acc[n][e] = 0.0f;
            }
        __syncthreads();
        for (int i = tid; i < 8 * TT; i += KCU_MM_THREADS) {
            const int t = i / 8, p = i % 8, col = tile * 16 + 2 * p;
            float v0 = red[(2 * p) * TP + t], v1 = red[(2 * p + 1) * TP + t];
#pragma unroll
            for (int ww = 1; ww < G::WARPS; ww++) {
                v0 += red[(ww * 16 + 2 * p) * TP + t];
                v1 += red[(ww * 16 + 2 * p + 1) * TP + t];
            }
            kcu_tc_hand<N>(epi, t0 + t, col, v0, v1);
        }
    };
    auto step = [&](int gs, const uint4(&xb)[NT][U], const uint4(&gb)[U]) {
        kcu_cp_wait<D - 2>(); /* step gs's copies are in */
        issue(gs + D - 1);    /* into the slots step gs - 1 read */
        const int s = gs % STEPS;
        const uint4 *slot = ring + (gs % D) * SLOT + tid;
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j = s * U + u, k = kw + 32 * j;
            if (j >= CW) break; /* uniform: the same for every lane of the block */
            uint4 xq[NT];
#pragma unroll
            for (int n = 0; n < NT; n++) {
                uint4 q;
                if constexpr (XS) {
                    q = k < K ? xs[tg(n) * (K / 8) + k / 8] : uint4{0u, 0u, 0u, 0u};
                } else {
                    if constexpr (XR)
                        q = slot[(2 * U + u * NT + n) * KCU_MM_THREADS];
                    else
                        q = xb[n][u];
                    if constexpr (FUSED) {
                        if (k < K) {
                            float v[8];
                            kcu_vec<X>::unpack(q, v);
                            pro.chunk8(v, t0 + tg(n), k, gb[u]);
                            q = kcu_pack8<XO>(v);
                        }
                    }
                }
                xq[n] = q;
            }
            kcu_tc_chunk<NT, W>(acc, xq, slot[(2 * u) * KCU_MM_THREADS], slot[(2 * u + 1) * KCU_MM_THREADS]);
        }
        if (s == STEPS - 1) finish(tile0 + gs / STEPS);
    };
#pragma unroll
    for (int i = 0; i < D - 1; i++) issue(i);
    prep();
    /* x (and the norm's weights) XA - 1 steps ahead in registers: XA sets, the loop unrolled by XA so
     * that each set keeps its registers (x comes from L2, ~600 cycles away, and a step takes ~100) */
    enum { XD = XS ? 1 : XA };
    uint4 xr[XD][NT][U], gr[XD][U];
#pragma unroll
    for (int i = 0; i < XD - 1; i++)
        if (i < S) load_x(i, xr[i], gr[i]);
#pragma unroll 1
    for (int gs = 0; gs < S; gs += XD) {
#pragma unroll
        for (int u = 0; u < XD; u++) {
            if (gs + u < S) {
                if (gs + u + XD - 1 < S) load_x(gs + u + XD - 1, xr[(u + XD - 1) % XD], gr[(u + XD - 1) % XD]);
                step(gs + u, xr[u], gr[u]);
            }
        }
    }
    kcu_cp_wait<0>(); /* the empty groups past the end: nothing of this thread's in flight */
}

/* The L2 prefetches: hints that bring lines into L2 and nothing into the kernel, so that a kernel may
 * issue them before it waits for the one before it (KCU_PDL_ENTER's rule holds). kcu_l2_bulk: one bulk
 * prefetch of bytes (a multiple of 16) from p, 16-byte aligned (sm_90; elsewhere nothing). */
enum { KCU_L2_PIECE = 65536 }; /* the bytes of one bulk prefetch where a range is cut into pieces */
__device__ __forceinline__ void kcu_l2_bulk(const void *p, unsigned bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
    (void)p, (void)bytes;
#endif
}

/* Piece i (KCU_L2_PIECE bytes, the last one shorter) of the bytes from p. */
__device__ __forceinline__ void kcu_l2_piece(const void *p, long long bytes, long long i)
{
    const long long at = i * KCU_L2_PIECE;
    kcu_l2_bulk(static_cast<const char *>(p) + at, (unsigned)(bytes - at < KCU_L2_PIECE ? bytes - at : KCU_L2_PIECE));
}

/* A kernel that streams no weights (kcu_gen.c's put_l2_ahead): the first `bytes` of the next matmul's
 * weights, its pieces spread over every thread of the grid. */
__device__ __forceinline__ void kcu_l2_ahead(const void *p, long long bytes)
{
    const long long pieces = (bytes + KCU_L2_PIECE - 1) / KCU_L2_PIECE;
    const long long blocks = (long long)gridDim.x * gridDim.y * gridDim.z;
    const long long b = blockIdx.x + (long long)gridDim.x * (blockIdx.y + (long long)gridDim.y * blockIdx.z);
    for (long long i = b * blockDim.x + threadIdx.x; i < pieces; i += blocks * blockDim.x) kcu_l2_piece(p, bytes, i);
}

/* bytes from p, every piece by the calling thread. */
__device__ __forceinline__ void kcu_l2_range(const void *p, long long bytes)
{
    for (long long i = 0; i * KCU_L2_PIECE < bytes; i++) kcu_l2_piece(p, bytes, i);
}

/* A routing kernel's choice e (kcu_emit_moe.c's row group): expert e's slab of the grouped matmul's
 * weights w ([experts][each] bytes) into L2, at most cap / choices bytes of it (cap over the step's
 * choices), by the calling thread. */
__device__ __forceinline__ void kcu_l2_expert(const void *w, int e, long long each, long long choices, long long cap)
{
    long long bytes = cap / (choices > 0 ? choices : 1);
    if (bytes > each) bytes = each;
    kcu_l2_range(static_cast<const char *>(w) + (long long)e * each, bytes & ~15LL);
}

/* Before the kernel waits for the one before it (kcu_matmul_tc calls KCU_PDL_ENTER itself, after
 * this): the L2 lines of the block's first KCU_TC_PREFETCH weight steps of a one-token-tile step
 * (T <= 8: U = 2 chunks a step, each warp from the start of its K slice of each of its first tiles'
 * 16 rows), one bulk prefetch a (row, warp). A hint to L2 that reads nothing into the block: the
 * order of every read and write stays the stream's (KCU_PDL_ENTER's rule), and what the weights'
 * stream would have waited for at the kernel's start arrives while the kernel before it ends. */
#ifndef KCU_TC_PREFETCH
#define KCU_TC_PREFETCH 0 /* none: measured slower; the generator defines another with kcu_options.tc_prefetch
                          * (KILN_CUDA_TC_PREFETCH=N) */
#endif
template <typename W, int K, int N, class Epi>
__device__ __forceinline__ void kcu_tc_prefetch(const int tile0, const int nt, const W *__restrict__ w)
{
    typedef kcu_tc<W, K> G;
    enum { U = 2, STEPS = (G::CW + U - 1) / U };
    if constexpr (KCU_TC_PREFETCH > 0) {
        const int warp = threadIdx.x / 32, r = threadIdx.x % 32, k0 = warp * G::CW * 32;
        if (r >= 16 || k0 >= K) return;
        for (int p = 0; p < KCU_TC_PREFETCH && p / STEPS < nt; p += STEPS) {
            const int col = (tile0 + p / STEPS) * 16 + r;
            const int steps = KCU_TC_PREFETCH - p < STEPS ? KCU_TC_PREFETCH - p : STEPS;
            int len = steps * U * 32; /* halves */
            if (len > G::CW * 32) len = G::CW * 32;
            if (len > K - k0) len = K - k0;
            if (col < N) kcu_l2_bulk(w + (long long)Epi::row(col) * K + k0, (unsigned)(len * (int)sizeof(W)));
        }
    }
}

/* Tokens t0 .. t0 + TT - 1 (8 < TT <= 32) of the 8 tiles from column c0 (a warp each), the K slices
 * in order, each slice's norm values staged in slab ([TT][CW * 4] chunks; kcu_tc_wide above); the
 * weights through ring as kcu_tc_tiles' (RING bytes, each thread's own slots, D - 1 steps ahead). */
template <int RING, typename W, int K, int N, class Pro, class Epi, typename X>
static __device__ __forceinline__ void kcu_tc_wide(const int t0, const int TT, const int c0, const X *__restrict__ x,
                                                   const W *__restrict__ w, const Pro &pro, const Epi &epi, uint4 *slab,
                                                   uint4 *ring)
{
    typedef kcu_tc<W, K> G;
    typedef typename Pro::template out<X>::T XO;
    enum {
        NT = KCU_TC_GROUP / 8,
        CW = G::CW,
        Q = CW * 4,                     /* 16-byte chunks of a token's slice */
        QP = Q | 1,                     /* a token's row of the slab: odd, so that the 8 tokens a warp reads
                                           at once fall on different banks (at 16 bytes x an even Q, all 8 on
                                           the same four: twice the shared-memory wavefronts) */
        U = 1,                          /* chunks a step */
        SS = (CW + U - 1) / U,          /* steps a slice */
        STEPS = G::WARPS * SS,
        SLOT = 2 * U * KCU_MM_THREADS,  /* a step's chunks in the ring */
        D = RING / 16 / SLOT            /* steps the ring holds */
    };
    static_assert(KCU_TC_GROUP * QP * 16 <= KCU_TC_SMEM, "kcu_tc_wide: a slice's norm values fit the buffer");
    static_assert(D >= 2, "kcu_tc_wide: a ring of two steps at least");
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, c = lane % 4;
    const int col0 = c0 + 16 * warp; /* this warp's tile */
    const W *wr[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int col = col0 + g + 8 * h;
        wr[h] = w + (long long)(col < N ? Epi::row(col) : 0) * K;
    }
    /* global step gs: slice gs / SS, its step gs % SS; a lane's k of chunk j of slice s: s CW 32 + 32 j + 8 c;
     * its copies into its slots, one group (past the end an empty one) */
    auto issue = [&](int gs) {
        if (gs < STEPS) {
            const int sl = gs / SS, ls = gs % SS;
            uint4 *slot = ring + (gs % D) * SLOT + tid;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int j = ls * U + u, k = sl * CW * 32 + 32 * j + 8 * c;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    uint4 *d = slot + (2 * u + h) * KCU_MM_THREADS;
                    if (j < CW && k < K)
                        kcu_cp16(d, wr[h] + k);
                    else
                        *d = uint4{0u, 0u, 0u, 0u};
                }
            }
        }
        kcu_cp_commit();
    };
    float acc[NT][4], run[NT][4];
    auto step = [&](int gs) {
        const int sl = gs / SS, ls = gs % SS;
        kcu_cp_wait<D - 2>(); /* step gs's copies are in */
        issue(gs + D - 1);    /* into the slots step gs - 1 read */
        const uint4 *slot = ring + (gs % D) * SLOT + tid;
        if (ls == 0) { /* slice sl's norm values, by the whole block */
            __syncthreads(); /* the previous slice's are read */
            kcu_tc_stage<K, Q, QP, XO>(x, pro, t0, TT, sl * CW * 32, slab);
            __syncthreads();
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[n][e] = 0.0f;
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j = ls * U + u;
            if (j >= CW) break; /* uniform */
            uint4 xq[NT];
#pragma unroll
            for (int n = 0; n < NT; n++) xq[n] = slab[(8 * n + g < TT ? 8 * n + g : TT - 1) * QP + 4 * j + c];
            kcu_tc_chunk<NT, W>(acc, xq, slot[(2 * u) * KCU_MM_THREADS], slot[(2 * u + 1) * KCU_MM_THREADS]);
        }
        if (ls == SS - 1) /* the slice's sum into the running total, in slice order */
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) run[n][e] = sl == 0 ? acc[n][e] : run[n][e] + acc[n][e];
    };
#pragma unroll
    for (int i = 0; i < D - 1; i++) issue(i);
#pragma unroll 1
    for (int gs = 0; gs < STEPS; gs++) step(gs);
    kcu_cp_wait<0>(); /* the empty groups past the end */
    /* the epilogue: lane (g, c)'s d[e] is row g + 8 (e / 2), token 8 n + 2 c + e % 2; the warp's sums go
     * through shared memory (the slab's room: [8 warps][16][KCU_TC_GROUP] f32) so that a lane gets a
     * column pair (one call site of the epilogue, as kcu_tc_tile's) */
    float *sums = reinterpret_cast<float *>(slab) + warp * 16 * KCU_TC_GROUP;
    __syncthreads(); /* every warp is done with the last slice */
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) sums[(g + 8 * (e >> 1)) * KCU_TC_GROUP + 8 * n + 2 * c + (e & 1)] = run[n][e];
    __syncthreads();
    for (int i = lane; i < 8 * TT; i += 32) {
        const int t = i / 8, p = i % 8, col = col0 + 2 * p;
        kcu_tc_hand<N>(epi, t0 + t, col, sums[(2 * p) * KCU_TC_GROUP + t], sums[(2 * p + 1) * KCU_TC_GROUP + t]);
    }
    __syncthreads(); /* the sums are read: the next group of tiles may stage */
}

/* The tensor-core decode path: J tiles of 16 columns a block, one after another (its grid:
 * ceil(N / (16 J)) blocks), as described above; T = 1 .. 8 on one token tile, more on four,
 * KCU_TC_GROUP tokens a pass. */
#ifndef KCU_TC_XAHEAD
#define KCU_TC_XAHEAD 2 /* kcu_tc_tiles' sets of x in registers: XA - 1 steps ahead (4 took q,k,v and o at T = 32
                           from 89.5 and 79.6 to 108.3 and 89.6 µs on an H100: #11 step 9) */
#endif
template <typename W, int K, int N, int J, int RING, int XA = KCU_TC_XAHEAD, class Pro, class Epi, typename X>
static __device__ __forceinline__ void kcu_matmul_tc(const int T, const X *__restrict__ x, const W *__restrict__ w,
                                                     Pro pro, const Epi &epi)
{
    typedef typename Pro::template out<X>::T XO;
    enum { STAGED = !kcu_same<Pro, kcu_pro_none>::V, TILES = (N + 15) / 16, KC = K / 8 };
    /* kcu_tc_wide for 9-32 tokens, where its groups of 8 tiles still give every SM a block */
    enum {
        WIDE = STAGED && KCU_TC_GROUP * (kcu_tc<W, K>::CW * 4 | 1) * 16 <= KCU_TC_SMEM &&
               (TILES + 7) / 8 >= KCU_TC_WIDE_BLOCKS
    };
    __shared__ uint4 smem[KCU_TC_SMEM / 16];
    float *red = reinterpret_cast<float *>(smem);             /* [8 warps][16][8 NT] */
    uint4 *xs = smem + KCU_TC_RED_BYTES / 16;                 /* [TT][K / 8] the norm's values */
#ifdef KILN_EMU_SHIM_H
    static uint4 ring[RING / 16]; /* blocks run one at a time */
#else
    extern __shared__ uint4 kcu_tc_ring[]; /* the kernel's dynamic shared memory: RING bytes */
    uint4 *const ring = kcu_tc_ring;
#endif
    const int tile0 = (int)blockIdx.x * J;
    if (T <= 8 && tile0 < TILES) kcu_tc_prefetch<W, K, N, Epi>(tile0, TILES - tile0 < J ? TILES - tile0 : J, w);
    KCU_PDL_ENTER(); /* the generated kernel leaves it to here (kcu_open_body_tc) */
    for (int t0 = 0; t0 < T; t0 += KCU_TC_GROUP) {
        const int TT = T - t0 < KCU_TC_GROUP ? T - t0 : KCU_TC_GROUP;
        if constexpr (WIDE) {
            if (TT > 8) { /* groups of 8 tiles over the grid, whatever J: blocks past them return */
                pro.prepare(x, T, t0, TT);
                for (int b = (int)blockIdx.x; b < (TILES + 7) / 8; b += (int)gridDim.x)
                    kcu_tc_wide<RING, W, K, N>(t0, TT, b * 128, x, w, pro, epi, smem, ring);
                __syncthreads(); /* the slab is read: the next group may stage */
                continue;
            }
        }
        const int nt = TILES - tile0 < J ? TILES - tile0 : J; /* this block's tiles */
        if (nt <= 0) break;                                   /* uniform */
        const bool staged = STAGED && TT * K * (int)sizeof(XO) <= KCU_TC_XS_BYTES;
        /* the norm's statistics, and its values staged where they fit, while the first weights come */
        auto prep = [&]() {
            if constexpr (STAGED) {
                pro.prepare(x, T, t0, TT);
                if (staged) { /* the group's norm values */
                    __syncthreads(); /* the previous group's are read */
                    kcu_tc_stage<K, KC, KC, XO>(x, pro, t0, TT, 0, xs);
                    __syncthreads();
                }
            }
        };
        if (TT > 8)
            kcu_tc_tiles<KCU_TC_GROUP / 8, false, RING, XA, W, K, N>(t0, TT, tile0, nt, x, w, pro, epi, red, xs, ring, prep);
        else if (staged)
            kcu_tc_tiles<1, true, RING, XA, W, K, N>(t0, TT, tile0, nt, x, w, pro, epi, red, xs, ring, prep);
        else
            kcu_tc_tiles<1, false, RING, XA, W, K, N>(t0, TT, tile0, nt, x, w, pro, epi, red, xs, ring, prep);
    }
}

/* The prefill path (T > KCU_GEMV_T): tensor cores where the weights allow
 * (kcu_matmul_mma: f32 x in three parts; half x, of the weights' type, as it
 * is), else CUDA-core tiles (kcu_matmul_fma). */
template <typename W, int K, int N, class Pro, class Epi, typename X>
static __device__ __forceinline__ void kcu_matmul_large(const int T, const X *__restrict__ x,
                                                        const W *__restrict__ w, Pro pro, const Epi &epi)
{
    enum { GRID = (N + KCU_MM_GRID_COLS - 1) / KCU_MM_GRID_COLS };
    typedef typename Pro::template out<X>::T XO;
#if KCU_MMA
    if constexpr (kcu_same<XO, float>::V && kcu_mma_w<W>::ON)
        kcu_matmul_mma<W, K, N, GRID, 3, kcu_mma_w<W>::BK, 1>(T, x, w, pro, epi);
    else if constexpr (kcu_same<XO, W>::V && !kcu_same<X, float>::V)
        kcu_matmul_mma<W, K, N, GRID, 1, 64, 1>(T, x, w, pro, epi);
    else
#endif
        kcu_matmul_fma<W, K, N, GRID>(T, x, w, pro, epi);
}

/* Both paths in one kernel, chosen by T (the generated code launches
 * kcu_matmul_small and kcu_matmul_large as two kernels instead, the first on
 * its own grid); launched on ceil(N / KCU_MM_GRID_COLS) blocks, so the decode
 * path's R = 2. */
template <typename W, int K, int N, class Pro, class Epi, typename X>
static __device__ __forceinline__ void kcu_matmul(const int T, const X *__restrict__ x, const W *__restrict__ w,
                                                  Pro pro, const Epi &epi)
{
    if (T <= KCU_GEMV_T)
        kcu_matmul_small<W, K, N, 2>(T, x, w, pro, epi);
    else
        kcu_matmul_large<W, K, N>(T, x, w, pro, epi);
}

/* ==== mixture of experts: the grouped matmul (codegen/cuda/kcu_emit_moe.c) ================
 *
 * expert_matmul in fast precision (x and the experts' weights of one half dtype, K % 8 == 0):
 * out[r, n] = sum_k x[row(r), k] w[idx[r], n, k] for each routed row r = t KK + j (token t's j-th
 * choice; row(r) = t, or r where x holds a row per choice: XR). A block takes one expert and
 * KCU_MOE_BW of its weight rows (Epi::wrow), finds the step's rows routed to that expert, in order,
 * BT at a time (kcu_moe_collect), and streams those weight rows once for each BT of them: a decode
 * step reads each chosen expert's weights once, however many of its tokens chose it, and a prompt
 * once per BT of its rows — where a warp a routed row (the f32 kernel) reads them once a row.
 *
 * Grid: x the weight-row tiles, y min(T KK, E) (cuda_meta.h's capped grid dim): block y takes the
 * y-th of the experts the step chose, in expert order; when T KK >= E, expert y (a block whose expert
 * nobody chose returns after one look at idx).
 *
 * Arithmetic: kcu_matmul_tc's (kcu_tc_chunk): the weights as the mma's A (16 rows a warp), the routed
 * rows as B (8 a tile), k in chunks of 32, each chunk's two mma from zero, then added to the f32 sum in
 * k order. A routed row's outputs depend on its x row and its expert alone — not on T, on BT (the
 * decode kernel's 16, the prompt's 64), on which rows share its tile or on the step's other tokens:
 * batch invariant, whichever kernel runs the step.
 *
 * Pipeline: k blocks of KCU_MOE_BK by cp.async into a ring of kcu_moe_pipe<BT>::STAGES stages of dynamic shared
 * memory, [stage][KCU_MOE_BW + BT rows][8 chunks of 16 bytes], chunk q of row i at q ^ 4 (i & 1): the
 * 8 lanes of a quarter warp read rows g and g + 1 at chunks c (or c + 4), 32 distinct banks. The
 * weights' copies of the next STAGES - 1 blocks are in flight while one is multiplied: 8 stages in a decode
 * step (the step's bytes in flight come from few blocks: 8 experts x 24 weight tiles at batch 1), 4 in a
 * prompt's (more blocks an SM).
 */
enum { KCU_MOE_BW = 64, KCU_MOE_BK = 64, KCU_MOE_SCAN = 8 };
template <int BT> struct kcu_moe_pipe {
    enum { STAGES = BT <= 16 ? 8 : 4 };
};

/* Rows r of from .. n - 1 with idx[r] == e, in order: the first (at most BT) into rows; returns how
 * many (the same in every thread) and *next, where the search goes on (past the last row taken, or n).
 * Each thread looks at KCU_MOE_SCAN consecutive rows a round; a warp's ballots place them. Every thread
 * of the block calls it; sh: [10] ints of shared memory. */
template <int BT>
__device__ __forceinline__ int kcu_moe_collect(const int *__restrict__ idx, const int n, const int e, const int from,
                                               int *rows, int *sh, int *next)
{
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const unsigned below_mask = (1u << lane) - 1u;
    int found = 0;
    for (int base = from; base < n; base += KCU_MM_THREADS * KCU_MOE_SCAN) {
        const int r0 = base + tid * KCU_MOE_SCAN;
        unsigned f = 0; /* bit i: row r0 + i is routed to e */
#pragma unroll
        for (int i = 0; i < KCU_MOE_SCAN; i++) f |= (unsigned)(r0 + i < n && idx[r0 + i] == e) << i;
        int below = 0, total = 0;
#pragma unroll
        for (int i = 0; i < KCU_MOE_SCAN; i++) {
            const unsigned b = __ballot_sync(0xffffffffu, (f >> i) & 1u);
            below += __popc(b & below_mask);
            total += __popc(b);
        }
        if (lane == 0) sh[warp] = total;
        __syncthreads();
        int at = found, all = 0;
        for (int w = 0; w < KCU_MM_THREADS / 32; w++) at += w < warp ? sh[w] : 0, all += sh[w];
        at += below;
#pragma unroll
        for (int i = 0; i < KCU_MOE_SCAN; i++)
            if ((f >> i) & 1u) {
                if (at < BT) rows[at] = r0 + i;
                if (at == BT - 1) sh[8] = r0 + i + 1;
                at++;
            }
        __syncthreads(); /* sh read, rows and sh[8] written */
        found += all;
        if (found >= BT) {
            *next = sh[8];
            return BT;
        }
    }
    *next = n;
    return found;
}

/* The expert of block y (see above): y when T KK >= E, else the y-th of the experts chosen, in
 * order, or -1 past them. Every thread of the block calls it; seen: [E] bytes, sh: [10] ints of shared
 * memory. */
template <int E>
__device__ __forceinline__ int kcu_moe_expert(const int *__restrict__ idx, const int n, const int y,
                                              unsigned char *seen, int *sh)
{
    if (n >= E) return y;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    for (int e = tid; e < E; e += KCU_MM_THREADS) seen[e] = 0;
    if (tid == 0) sh[9] = -1;
    __syncthreads();
    for (int r = tid; r < n; r += KCU_MM_THREADS) {
        const unsigned e = (unsigned)idx[r];
        if (e < (unsigned)E) seen[e] = 1;
    }
    __syncthreads();
    int count = 0;
    for (int base = 0; base < E; base += KCU_MM_THREADS) {
        const bool s = base + tid < E && seen[base + tid];
        const unsigned b = __ballot_sync(0xffffffffu, s);
        if (lane == 0) sh[warp] = __popc(b);
        __syncthreads();
        int at = count, all = 0;
        for (int w = 0; w < KCU_MM_THREADS / 32; w++) at += w < warp ? sh[w] : 0, all += sh[w];
        if (s && at + __popc(b & ((1u << lane) - 1u)) == y) sh[9] = base + tid;
        __syncthreads();
        count += all;
        if (count > y) break;
    }
    return sh[9];
}

/* What a grouped matmul's results become. Epi::wrow(tile, i): the weight row (of the expert's N) that
 * row i of the block's tile `tile` multiplies (-1: past the end); put(r, e, tile, i, v0, v1): routed
 * row r's results of tile rows i and i + 8 (i % 16 < 8), expert e. kcu_moe_store stores them (plus the
 * expert's bias where B); kcu_moe_swiglu takes a weight of 2F rows, F gate rows then F up rows (a
 * concat1 weight, passes/fuse_sibling_matmuls.c), tile row i and i + 8 a gate and its up, and stores
 * silu(gate) up: F outputs, the group's values in f32 (passes/lower_precision.c: a group's values
 * that nothing outside reads are not rounded), silu's half form (half_math), the product rounded to O
 * as it is stored. */
template <int N, typename O, bool B, typename BT_ = O> struct kcu_moe_store {
    enum { COLS = KCU_MOE_BW }; /* outputs a tile */
    O *__restrict__ out;        /* [T KK, N] */
    const BT_ *__restrict__ bias; /* [E, N] where B */
    static __device__ __forceinline__ int wrow(int tile, int i)
    {
        const int n = tile * KCU_MOE_BW + i;
        return n < N ? n : -1;
    }
    __device__ __forceinline__ void put(long long r, int e, int tile, int i, float v0, float v1) const
    {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int n = wrow(tile, i + 8 * h);
            if (n < 0) continue;
            float v = h ? v1 : v0;
            if constexpr (B) v += kcu_f(bias[(long long)e * N + n]);
            kcu_put(out + r * N + n, v);
        }
    }
};
template <int F, typename O> struct kcu_moe_swiglu {
    enum { COLS = KCU_MOE_BW / 2 };
    O *__restrict__ out; /* [T KK, F] */
    static __device__ __forceinline__ int col(int tile, int i) { return tile * COLS + i / 16 * 8 + i % 8; }
    static __device__ __forceinline__ int wrow(int tile, int i)
    {
        const int c = col(tile, i);
        return c < F ? c + (i / 8 % 2) * F : -1;
    }
    __device__ __forceinline__ void put(long long r, int, int tile, int i, float gate, float up) const
    {
        const int c = col(tile, i);
        if (c >= F) return;
        kcu_put(out + r * F + c, kcu_silu_half(gate) * up);
    }
};

/* The grouped matmul: N weight rows an expert (Epi::wrow's), E experts, KK choices a token, BT routed
 * rows a tile (16: the decode kernel; 64: the prompt's); 8 warps, warp w the weight rows 16 (w % 4)
 * .. + 15 and routed rows BT / 2 (w / 4) .. + BT / 2 - 1 of the tile. */
template <typename W, int K, int N, int E, int KK, int BT, bool XR, class Pro, class Epi>
static __device__ __forceinline__ void kcu_moe_matmul(const int T, const W *__restrict__ x, const W *__restrict__ w,
                                                      const int *__restrict__ idx, Pro pro, const Epi &epi,
                                                      const void *next_w = nullptr, long long next_slab = 0,
                                                      long long next_cap = 0)
{
    enum {
        NT = BT / 16,                                  /* token tiles of 8 a warp */
        KB = (K + KCU_MOE_BK - 1) / KCU_MOE_BK,        /* k blocks */
        STAGE = (KCU_MOE_BW + BT) * KCU_MOE_BK / 8,    /* 16-byte chunks a stage */
        TC = (BT * 8 + KCU_MM_THREADS - 1) / KCU_MM_THREADS /* a thread's row chunks a stage */
    };
    static_assert(K % 8 == 0 && BT % 16 == 0 && KCU_MOE_BW * 8 == 2 * KCU_MM_THREADS, "kcu_moe_matmul's tiles");
    __shared__ int rows[BT];
    __shared__ int sh[10];
    __shared__ unsigned char seen[E];
#ifdef KILN_EMU_SHIM_H
    static uint4 ring[kcu_moe_pipe<BT>::STAGES * STAGE]; /* blocks run one at a time */
#else
    extern __shared__ uint4 kcu_moe_ring[]; /* the kernel's dynamic shared memory */
    uint4 *const ring = kcu_moe_ring;
#endif
    const int n = T * KK;
    const int e = kcu_moe_expert<E>(idx, n, (int)blockIdx.y, seen, sh);
    if (e < 0) return; /* the same in every thread */
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, c = lane % 4;
    const int tile = (int)blockIdx.x, wa = warp % 4 * 16 + g, wt = warp / 4 * (BT / 2);
    /* this thread's weight chunks: tid and tid + 256 of the tile's [64 rows][8] */
    const W *wsrc[2];
    bool wlive[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int ch = tid + h * KCU_MM_THREADS, row = Epi::wrow(tile, ch / 8);
        wlive[h] = row >= 0;
        wsrc[h] = w + ((long long)e * N + (row >= 0 ? row : 0)) * K + ch % 8 * 8;
    }
    for (int from = 0;;) {
        int next;
        const int cnt = kcu_moe_collect<BT>(idx, n, e, from, rows, sh, &next);
        if (cnt == 0) break;
        /* a norm's prologue: the statistics of the tile's rows' x, each row's values made from its x as
         * its stage lands (kcu_pro_rms / _ln's chunk, rounded to W as the norm's kernel stores them) */
        pro.prepare_rows(x, cnt, [&](int m) -> long long { return XR ? rows[m] : rows[m] / KK; });
        const W *xsrc[TC];
        bool xlive[TC];
#pragma unroll
        for (int h = 0; h < TC; h++) {
            const int ch = tid + h * KCU_MM_THREADS, m = ch / 8;
            xlive[h] = ch < BT * 8 && m < cnt;
            const long long xr = xlive[h] ? (XR ? rows[m] : rows[m] / KK) : 0;
            xsrc[h] = x + xr * K + ch % 8 * 8;
        }
        /* k block kb's weights and rows into its stage (zeros past N, cnt and K) */
        auto issue = [&](int kb) {
            uint4 *const st = ring + kb % kcu_moe_pipe<BT>::STAGES * STAGE;
            const int k0 = kb * KCU_MOE_BK;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int ch = tid + h * KCU_MM_THREADS, i = ch / 8, q = ch % 8;
                uint4 *const d = st + i * 8 + (q ^ (i & 1) * 4);
                if (wlive[h] && k0 + q * 8 < K) kcu_cp16(d, wsrc[h] + k0);
                else *d = uint4{0u, 0u, 0u, 0u};
            }
#pragma unroll
            for (int h = 0; h < TC; h++) {
                const int ch = tid + h * KCU_MM_THREADS, m = ch / 8, q = ch % 8;
                if (ch >= BT * 8) continue;
                uint4 *const d = st + (KCU_MOE_BW + m) * 8 + (q ^ (m & 1) * 4);
                if (xlive[h] && k0 + q * 8 < K) kcu_cp16(d, xsrc[h] + k0);
                else *d = uint4{0u, 0u, 0u, 0u};
            }
        };
        float acc[NT][4];
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[t][i] = 0.0f;
#pragma unroll
        for (int s = 0; s < kcu_moe_pipe<BT>::STAGES - 1; s++) {
            if (s < KB) issue(s);
            kcu_cp_commit();
        }
        for (int kb = 0; kb < KB; kb++) {
            kcu_cp_wait<kcu_moe_pipe<BT>::STAGES - 2>();
            if constexpr (!kcu_same<Pro, kcu_pro_none>::V) { /* this thread's row chunks of block kb, normalized */
                uint4 *const st = ring + kb % kcu_moe_pipe<BT>::STAGES * STAGE;
                const int k0 = kb * KCU_MOE_BK;
#pragma unroll
                for (int h = 0; h < TC; h++) {
                    const int ch = tid + h * KCU_MM_THREADS, m = ch / 8, q = ch % 8;
                    if (!xlive[h] || k0 + q * 8 >= K) continue;
                    uint4 *const d = st + (KCU_MOE_BW + m) * 8 + (q ^ (m & 1) * 4);
                    float v[8];
                    kcu_vec<W>::unpack(*d, v);
                    pro.template chunk<8>(v, m, k0 + q * 8);
                    *d = kcu_pack8<W>(v);
                }
            }
            __syncthreads(); /* block kb is in every thread's view; block kb - 1's stage is read */
            if (kb + kcu_moe_pipe<BT>::STAGES - 1 < KB) issue(kb + kcu_moe_pipe<BT>::STAGES - 1);
            kcu_cp_commit();
            const uint4 *const st = ring + kb % kcu_moe_pipe<BT>::STAGES * STAGE;
#pragma unroll
            for (int h = 0; h < KCU_MOE_BK / 32; h++) {
                const int q = 4 * h + c;
                const uint4 a0 = st[wa * 8 + (q ^ (wa & 1) * 4)], a1 = st[(wa + 8) * 8 + (q ^ (wa & 1) * 4)];
                uint4 xq[NT];
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    const int m = wt + 8 * t + g;
                    xq[t] = st[(KCU_MOE_BW + m) * 8 + (q ^ (m & 1) * 4)];
                }
                kcu_tc_chunk<NT, W>(acc, xq, a0, a1);
            }
        }
        kcu_cp_wait<0>();
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int m = wt + 8 * t + 2 * c + h;
                if (m < cnt) epi.put(rows[m], e, tile, wa, acc[t][h], acc[t][2 + h]);
            }
        __syncthreads(); /* rows and the ring are read: the next rows may come */
        if (next >= n) break;
        from = next;
    }
    /* next_w: the next grouped matmul's weights over the same choices, [E][next_slab bytes]; this block's
     * share (1 / gridDim.x) of its expert's slab, at most next_cap over the step's experts, into L2 */
    if (next_w && tid == 0) {
        long long each = next_cap / (long long)gridDim.y;
        if (each > next_slab) each = next_slab;
        const long long part = (each / (long long)gridDim.x) & ~15LL, at = part * (long long)blockIdx.x;
        kcu_l2_range(static_cast<const char *>(next_w) + (long long)e * next_slab + at, part);
    }
}

/* ==== attention over the paged KV cache (codegen/cuda/kcu_emit_attention.c) ============== */
/* Everything from here to the end of the file is the attention kernel's; the design, its
 * cost and its determinism are described at kcu_emit_attention. */

/* The blocks of a thread block cluster (sm_90): the decode's attention splits a head's positions
 * over the S blocks of a cluster (grid z, kcu_emit_attention's ATT_SPLIT), which combine their
 * states through distributed shared memory. Elsewhere (sm_80, the CPU emulator) there are no
 * clusters (KCU_CLUSTERS 0): one block (z = 0) takes every position and the others return.
 * KCU_CLUSTER_Z(S) is the kernel's attribute. A head's positions are split only when one block
 * would take more than KCU_ATT_SPLIT_ROUNDS rounds of its warps (at 2049 positions the split took
 * Llama-3-8B's decode attention from 154 to 38 µs a layer; at 16 the cluster's barriers cost ~5;
 * at 512 positions, 8 rounds of ~2.2 µs unsplit: 17.6 µs a layer, #11 step 3). */
enum { KCU_ATT_SPLIT_ROUNDS = 2 };
/* kcu_flash_decode's rounds of its warps a block takes before the cluster's blocks share a token's
 * positions in a step of many blocks (its template parameter R; kcu_emit_attention may give another):
 * at 4, a token of 512 positions (33 chunks of 16) takes 2 blocks, of 2048 5, of 4096 and more 8; the
 * token's virtual blocks, which fix its arithmetic, take KCU_FD_VROUNDS rounds each (kcu_flash_decode.cuh) */
#ifndef KCU_FD_ROUNDS
#define KCU_FD_ROUNDS 4
#endif
/* kcu_flash_decode's rounds of its warps a virtual block takes (its RV: a token's split, by its length
 * alone). At R, a token has as many virtual blocks as the cluster's blocks that take it in a step of many
 * (each walks one: the split of #11 step 7); fewer rounds give a token alone more blocks, walked one
 * after another by fewer blocks in a step of many (KILN_CUDA_FD_VROUNDS=2 to try; not yet measured) */
#ifndef KCU_FD_VROUNDS
#define KCU_FD_VROUNDS KCU_FD_ROUNDS
#endif
#ifndef KCU_FD_WAVE
#define KCU_FD_WAVE 264 /* kcu_flash_decode: a step's blocks up to which every virtual block gets its own */
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define KCU_CLUSTERS 1
#define KCU_CLUSTER_Z(S) __cluster_dims__(1, 1, S)
/* every thread of every block of the cluster: their shared-memory writes before it are seen by all
 * after it */
__device__ __forceinline__ void kcu_cluster_sync()
{
    asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}
__device__ __forceinline__ unsigned kcu_cluster_rank()
{
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
/* *p (this block's shared memory) as block `rank` of the cluster holds it */
__device__ __forceinline__ unsigned kcu_cluster_addr(const void *p, unsigned rank)
{
    unsigned r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"((unsigned)__cvta_generic_to_shared(p)), "r"(rank));
    return r;
}
__device__ __forceinline__ float kcu_cluster_ld(const float *p, unsigned rank)
{
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(kcu_cluster_addr(p, rank)));
    return v;
}
__device__ __forceinline__ double kcu_cluster_ld(const double *p, unsigned rank)
{
    double v;
    asm volatile("ld.shared::cluster.f64 %0, [%1];" : "=d"(v) : "r"(kcu_cluster_addr(p, rank)));
    return v;
}
#else
#define KCU_CLUSTERS 0
#define KCU_CLUSTER_Z(S)
__device__ __forceinline__ void kcu_cluster_sync() {}
__device__ __forceinline__ unsigned kcu_cluster_rank() { return 0; }
template <typename T> __device__ __forceinline__ T kcu_cluster_ld(const T *p, unsigned) { return *p; }
#endif

/* A split decode attention's ending: the states of (virtual) blocks 0 .. n - 1 — each block's ROWS
 * rows (q heads): bmax (its maximum score), bsum (its sum of exponentials relative to bmax) and bacc
 * (its DV outputs so) — block v's in slot v / P of the cluster's block v % P (P blocks: through
 * distributed shared memory where P > 1, the block's own shared memory where P is 1; kcu_attention:
 * one slot, P = n), combined in v's order by block 0: out(row, d) = sum_v bacc_v g_v / (sum_v bsum_v
 * g_v + sink's), g_v = weight(bmax_v, M), M the largest bmax_v, 0 for a block with no position;
 * sink(row) is a logit in bmax's units (-inf: none) that the sum holds with no value (attention
 * sinks); put(row, d, value) stores. The same states in the same order whatever P: a token's result
 * does not depend on how many blocks walked its virtual blocks. Every thread of every block of the
 * cluster that has not ended calls it; the blocks end only after the first has read them. */
template <int ROWS, int DV, int SPLIT, int SLOTS, int NT, class Weight, class Put, class Sink>
__device__ __forceinline__ void kcu_cluster_combine(const unsigned z, const int n, const int P,
                                               const float (&bmax)[SLOTS][ROWS], const double (&bsum)[SLOTS][ROWS],
                                               const double (&bacc)[SLOTS][ROWS][DV], double (&gbuf)[ROWS][SPLIT],
                                               const Weight &weight, const Put &put, const Sink &sink)
{
    const float ninf = -__int_as_float(0x7f800000);
    const int tid = threadIdx.x;
    __shared__ double sbuf[ROWS]; /* the sink's weight of each row */
    __syncthreads();
    if (P > 1) kcu_cluster_sync(); /* every block's states written */
    if (z == 0) {
        if (tid < ROWS * SPLIT && tid % SPLIT < n) { /* each virtual block's weight, a thread a (row, block) */
            const int row = tid / SPLIT, b = tid % SPLIT;
            float mx = ninf;
            for (int u = 0; u < n; u++) mx = fmaxf(mx, kcu_cluster_ld(&bmax[u / P][row], (unsigned)(u % P)));
            const float mb = kcu_cluster_ld(&bmax[b / P][row], (unsigned)(b % P));
            gbuf[row][b] = mb == ninf ? 0.0 : weight(mb, mx);
            if (b == 0) {
                const float sk = sink(row);
                sbuf[row] = sk == ninf ? 0.0 : weight(sk, mx);
            }
        }
        __syncthreads();
        for (int i = tid; i < ROWS * DV; i += NT) {
            const int row = i / DV, d = i % DV;
            double sum = 0.0, acc = 0.0;
            for (int b = 0; b < n; b++) {
                sum += kcu_cluster_ld(&bsum[b / P][row], (unsigned)(b % P)) * gbuf[row][b];
                acc += kcu_cluster_ld(&bacc[b / P][row][d], (unsigned)(b % P)) * gbuf[row][b];
            }
            sum += sbuf[row];
            put(row, d, (float)(acc / sum));
        }
    }
    if (P > 1) kcu_cluster_sync(); /* the first block has read the others' shared memory: they may end */
}

/* A barrier for the lanes of one warp. The CPU emulator (tests/cuda/emu_shim.h) has no warps:
 * there it is the block's barrier, so, as a shuffle, every thread of the block must reach it
 * the same number of times. */
__device__ __forceinline__ void kcu_syncwarp()
{
#ifdef KILN_EMU_SHIM_H
    __syncthreads();
#else
    __syncwarp();
#endif
}

/* VEC consecutive elements of the KV cache as floats (VEC 4: one 16-byte load of f32, p
 * 16-byte aligned; one 8-byte load of halves, p 8-byte aligned). C: the cache's elements. */
template <int VEC, typename C = float> struct kcu_kv_load;
template <> struct kcu_kv_load<4, float> {
    static __device__ __forceinline__ void load(const float *p, float *o)
    {
        const float4 v = __ldg(reinterpret_cast<const float4 *>(p));
        o[0] = v.x, o[1] = v.y, o[2] = v.z, o[3] = v.w;
    }
};
template <> struct kcu_kv_load<1> {
    static __device__ __forceinline__ void load(const float *p, float *o) { o[0] = __ldg(p); }
};
struct alignas(8) kcu_kv_u2 {
    unsigned x, y; /* four halves */
};
template <typename H> struct kcu_kv_load<1, H> {
    static __device__ __forceinline__ void load(const H *p, float *o) { o[0] = kcu_f(*p); }
};

/* A KV cache of codes (kiln build --kv-dtype int8|fp8): each (slot, KV head) row of K or V holds
 * its one-byte codes and, in the layer's scales ([slots, KH] floats after the codes: runtime/kv), a
 * scale s; the row's values are code * s, in f32 (ir/quant.h's kir_kv_round: s = amax / 127 and
 * codes rint(x / s) in [-127, 127] as signed bytes, or s = amax / 448 and e4m3's codes of x / s;
 * a row of zeros has s = 0 and codes 0). kcu_kv_codes<C>::V is 0 for a cache of values. */
struct kcu_kv_i8 {
    unsigned char c;
};
struct kcu_kv_e4m3 {
    unsigned char c;
};
/* e4m3's code of v, a value on its grid (kcu_e4m3_round's): sign, 4 bits of exponent (bias 7), 3 of
 * mantissa; below 2^-6 the subnormals m 2^-9 */
__device__ __forceinline__ unsigned kcu_e4m3_bits(float v)
{
    const float a = fabsf(v);
    unsigned b;
    if (a < 0.015625f) {
        b = (unsigned)(a * 512.0f);
    } else {
        const unsigned u = __float_as_uint(a);
        b = ((((u >> 23) & 255u) - 120u) << 3) | ((u >> 20) & 7u);
    }
    return ((__float_as_uint(v) >> 31) << 7) | b;
}
template <typename C> struct kcu_kv_codes {
    enum { V = 0 };
};
template <> struct kcu_kv_codes<kcu_kv_i8> {
    enum { V = 1, Q = 127 };
    static __device__ __forceinline__ float value(unsigned b) { return (float)(int)(signed char)(unsigned char)b; }
    static __device__ __forceinline__ unsigned code(float c) { return (unsigned)(int)fminf(fmaxf(rintf(c), -127.0f), 127.0f) & 255u; }
};
template <> struct kcu_kv_codes<kcu_kv_e4m3> {
    enum { V = 1, Q = 448 };
    static __device__ __forceinline__ float value(unsigned b) { return kcu_e4m3_value(b); }
    static __device__ __forceinline__ unsigned code(float c) { return kcu_e4m3_bits(kcu_e4m3_round(c)); }
};
/* VEC codes as their values over the scale (the caller multiplies by the row's scale): 4 codes one
 * 4-byte load (p 4-byte aligned), or one */
template <typename C> struct kcu_kv_load<4, C> {
    static __device__ __forceinline__ void load(const C *p, float *o)
    {
        if constexpr (kcu_kv_codes<C>::V) {
            const unsigned u = *reinterpret_cast<const unsigned *>(p);
#pragma unroll
            for (int i = 0; i < 4; i++) o[i] = kcu_kv_codes<C>::value((u >> (8 * i)) & 255u);
        } else {
            const kcu_kv_u2 v = *reinterpret_cast<const kcu_kv_u2 *>(p);
            o[0] = kcu_f(C{(unsigned short)(v.x & 0xffffu)}), o[1] = kcu_f(C{(unsigned short)(v.x >> 16)});
            o[2] = kcu_f(C{(unsigned short)(v.y & 0xffffu)}), o[3] = kcu_f(C{(unsigned short)(v.y >> 16)});
        }
    }
};
template <> struct kcu_kv_load<1, kcu_kv_i8> {
    static __device__ __forceinline__ void load(const kcu_kv_i8 *p, float *o) { o[0] = kcu_kv_codes<kcu_kv_i8>::value(p->c); }
};
template <> struct kcu_kv_load<1, kcu_kv_e4m3> {
    static __device__ __forceinline__ void load(const kcu_kv_e4m3 *p, float *o) { o[0] = kcu_kv_codes<kcu_kv_e4m3>::value(p->c); }
};

/* A warp writes one (slot, KV head) row of D values x as codes C at c and its scale at s (lane l takes
 * elements l, l + 32, ...): the amax over the warp (a maximum: the same in any order), s = amax / Q,
 * each code of x / s, as kir_quantize_row. */
template <int D, typename C, typename X>
static __device__ __forceinline__ void kcu_kv_put_row(const X *__restrict__ x, C *__restrict__ c, float *__restrict__ s,
                                                      const int lane)
{
    enum { N = (D + 31) / 32 };
    float v[N], m = 0.0f;
#pragma unroll
    for (int i = 0; i < N; i++) {
        const int d = i * 32 + lane;
        v[i] = d < D ? kcu_f(x[d]) : 0.0f;
        m = fmaxf(m, fabsf(v[i]));
    }
#pragma unroll
    for (int st = 16; st > 0; st >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, st));
    const float sc = m / (float)kcu_kv_codes<C>::Q;
#pragma unroll
    for (int i = 0; i < N; i++) {
        const int d = i * 32 + lane;
        if (d < D) c[d].c = (unsigned char)(sc > 0.0f ? kcu_kv_codes<C>::code(v[i] / sc) : 0u);
    }
    if (lane == 0) *s = sc;
}

/* kcu_log2<N>::V: log2 of a power of two. */
template <int N> struct kcu_log2 {
    enum { V = 1 + kcu_log2<N / 2>::V };
};
template <> struct kcu_log2<1> {
    enum { V = 0 };
};

/* The K and V rows of positions [p0, p0 + n) of a sequence (slots through its block table;
 * first is table[p0 / block_size], read ahead by the caller), this lane's dims of each
 * (kcu_attention's layout; VROW elements from a slot's V row to the next: KH DV, or KH DK where V
 * is read from the K rows), into kr and vr; rows from n on are zeros (n <= 0: all). The loads
 * are all issued before any is used. */
template <int KH, int DK, int DV, int P, int VK, int CK, int VV, int CV, int VROW, typename C>
static __device__ __forceinline__ void kcu_att_rows(const C *__restrict__ kbase, const C *__restrict__ vbase,
                                                    const int *__restrict__ table, const int block_size,
                                                    const int p0, const int n, const int first, const int lane,
                                                    float (&kr)[P][CK * VK], float (&vr)[P][CV * VV],
                                                    const float *__restrict__ ksb = nullptr,
                                                    const float *__restrict__ vsb = nullptr)
{
    int b = 0, o = 0;
    long long base = 0;
    if (n > 0) {
        b = p0 / block_size, o = p0 % block_size;
        base = (long long)first * block_size;
    }
#pragma unroll
    for (int j = 0; j < P; j++) {
#pragma unroll
        for (int i = 0; i < CK * VK; i++) kr[j][i] = 0.0f;
#pragma unroll
        for (int i = 0; i < CV * VV; i++) vr[j][i] = 0.0f;
        if (j < n) {
            const long long slot = base + o;
#pragma unroll
            for (int c = 0; c < CK; c++)
                if ((c * 32 + lane) * VK < DK)
                    kcu_kv_load<VK, C>::load(kbase + slot * (KH * DK) + (c * 32 + lane) * VK, &kr[j][c * VK]);
#pragma unroll
            for (int c = 0; c < CV; c++)
                if ((c * 32 + lane) * VV < DV)
                    kcu_kv_load<VV, C>::load(vbase + slot * VROW + (c * 32 + lane) * VV, &vr[j][c * VV]);
            if constexpr (kcu_kv_codes<C>::V) { /* codes: times their row's scale (ksb, vsb: the kv head's) */
                const float sk = ksb[slot * KH], sv = vsb[slot * KH];
#pragma unroll
                for (int i = 0; i < CK * VK; i++) kr[j][i] *= sk;
#pragma unroll
                for (int i = 0; i < CV * VV; i++) vr[j][i] *= sv;
            }
            if (++o == block_size && j + 1 < n) o = 0, base = (long long)table[++b] * block_size;
        }
    }
}

/*
 * kcu_attention: causal attention of token blockIdx.x, q heads [blockIdx.y * HB, + HB) (one kv
 * head: HB divides H / KH), over positions [lo, pos] of its sequence in the paged cache.
 * Launched with NW warps a block. Shapes: q [T, H, DK], kc [slots, KH, DK], vc [slots, KH, DV],
 * out [T, H, DV]. P positions a warp step, P * HB <= 32, all powers of two. Q, C, O: the
 * elements of q, of the cache and of out (f32, or a half type: read as f32, out rounded).
 */
template <int H, int KH, int DK, int DV, int HB, int P, int NW, int S, int WINDOW, int VIK, typename Q, typename C,
          typename O, typename SK = float>
static __device__ __forceinline__ void kcu_attention(const Q *__restrict__ q, const C *__restrict__ kc,
                                                     const C *__restrict__ vc, O *__restrict__ out,
                                                     const int *__restrict__ positions,
                                                     const int *__restrict__ table_off,
                                                     const int *__restrict__ tables, const int block_size,
                                                     const float scale, const float softcap,
                                                     const float *__restrict__ alibi = nullptr,
                                                     const SK *__restrict__ sinks = nullptr,
                                                     const float *__restrict__ ks = nullptr,
                                                     const float *__restrict__ vs = nullptr)
{
    enum {
        GROUP = H / KH,
        VK = DK % 4 == 0 && DK >= 128 ? 4 : 1, /* floats a lane loads at once from a K row */
        CK = (DK / VK + 31) / 32,              /* loads a lane makes of each K row */
        VV = DV % 4 == 0 && DV >= 128 && (!VIK || DK % 4 == 0) ? 4 : 1, /* the same for V rows (in K's: aligned) */
        CV = (DV / VV + 31) / 32,
        NV = P * HB,  /* scores of a warp step: position j, head h is score j * HB + h */
        RL = 32 / NV, /* lanes that hold each score once reduced: lane l holds score l / RL */
        LNV = kcu_log2<NV>::V,
        LP = kcu_log2<P>::V,
        NT = 32 * NW
    };
    enum { SPLIT = KCU_CLUSTERS ? S : 1, SB = SPLIT > 1 ? HB : 1 }; /* blocks a cluster splits positions over */
    __shared__ float pbuf[2][NW][NV + HB]; /* a step's probabilities, then its rescaling factors, by step parity */
    __shared__ float mbuf[NW][HB];         /* each warp's running maximum per head */
    __shared__ double lbuf[NW][NV];        /* each warp's sums of exponentials, per score slot */
    __shared__ float abuf[NW][HB][DV];     /* each warp's accumulated outputs */
    __shared__ double fbuf[NW][HB];        /* each warp's weight in the block's combination, per head */
    __shared__ double wbuf[NW][HB];        /* each warp's sum of exponentials, weighted so */
    __shared__ double snk[HB];             /* each head's sink, e^(sink - M) (0: none, or split) */
    __shared__ float bmax[1][SB];             /* split: the block's maximum per head */
    __shared__ double bacc[1][SB][SPLIT > 1 ? DV : 1]; /* split: the block's outputs relative to bmax */
    __shared__ double bsum[1][SB];            /* and its sum of exponentials so */
    __shared__ double gbuf[SB][SPLIT]; /* the first block's weight of each block's state */
    const float ninf = -__int_as_float(0x7f800000);
    const int t = blockIdx.x, h0 = blockIdx.y * HB, kh = h0 / GROUP;
    const int tid = threadIdx.x, w = tid / 32, lane = tid % 32;
    const int pos = positions[t];
    const int lo = WINDOW > 0 && pos - WINDOW + 1 > 0 ? pos - WINDOW + 1 : 0;
    const int len = pos - lo + 1;
    /* the cluster's blocks split the positions when one block would take more than KCU_ATT_SPLIT_ROUNDS
     * rounds (the same answer in every block of a cluster: one token); else block 0 takes them all, the
     * others end here and no block waits on the cluster (its barriers and combination cost ~5 µs a
     * kernel, measured on Llama-3-8B's decode at 16 positions) */
    const int split = SPLIT > 1 && (len + P - 1) / P > KCU_ATT_SPLIT_ROUNDS * NW ? SPLIT : 1;
    const unsigned z = kcu_cluster_rank(); /* the block's share of the positions (0 without clusters) */
    if ((int)z >= split) return;
    const int vw = (int)z * NW + w, vwn = split * NW; /* this (virtual) warp, and how many */
    const int *table = tables + table_off[t];
    const C *kbase = kc + kh * DK, *vbase = vc + kh * (VIK ? DK : DV); /* VIK: V the first DV of each K row */

    /* the lane's dims of q: dims (c * 32 + lane) * VK + e */
    float qr[HB][CK * VK];
#pragma unroll
    for (int h = 0; h < HB; h++)
#pragma unroll
        for (int c = 0; c < CK; c++)
#pragma unroll
            for (int e = 0; e < VK; e++) {
                const int d = (c * 32 + lane) * VK + e;
                qr[h][c * VK + e] = d < DK ? kcu_f(q[((long long)t * H + h0 + h) * DK + d]) : 0.0f;
            }
    float acc[HB][CV * VV];
#pragma unroll
    for (int h = 0; h < HB; h++)
#pragma unroll
        for (int i = 0; i < CV * VV; i++) acc[h][i] = 0.0f;
    const int mk = lane / RL, mh = mk % HB, mj = mk / HB; /* the score this lane holds */
    float m = ninf; /* running maximum of head mh's scores (the same in each of its lanes) */
    double l = 0.0; /* sum of exponentials (expf) of this lane's scores, rescaled as m grows */

    /* (virtual) warp vw takes steps of P positions vw, vw + vwn, ...: the same number of rounds in
     * every warp */
    const int steps = (len + P - 1) / P, rounds = (steps + vwn - 1) / vwn;
    int first = vw * P < len ? table[(lo + vw * P) / block_size] : 0; /* block of the step's first position */
    for (int r = 0; r < rounds; r++) {
        const int j0 = (r * vwn + vw) * P, n = len - j0 < P ? len - j0 : P; /* n <= 0: no positions */
        /* the next step's first block, read a step ahead: its latency overlaps this one */
        const int next = j0 + vwn * P < len ? table[(lo + j0 + vwn * P) / block_size] : 0;
        float kr[P][CK * VK], vr[P][CV * VV];
        kcu_att_rows<KH, DK, DV, P, VK, CK, VV, CV, KH *(VIK ? DK : DV)>(kbase, vbase, table, block_size, lo + j0, n,
                                                                         first, lane, kr, vr,
                                                    ks ? ks + kh : nullptr, vs ? vs + kh : nullptr);
        first = next;
        /* the lane's part of each dot product, its dims in order */
        float s[NV];
#pragma unroll
        for (int j = 0; j < P; j++)
#pragma unroll
            for (int h = 0; h < HB; h++) {
                float a = 0.0f;
#pragma unroll
                for (int i = 0; i < CK * VK; i++) a = fmaf(qr[h][i], kr[j][i], a);
                s[j * HB + h] = a;
            }
        /* the warp's sums, a fixed tree: halving (lane bit 16, 8, ... picks the half it keeps)
         * until one score a lane, then a butterfly over the RL lanes that share it */
#pragma unroll
        for (int st = 0; st < LNV; st++) {
            const int nv = NV >> (st + 1), mask = 16 >> st;
            const bool hi = (lane & mask) != 0;
#pragma unroll
            for (int i = 0; i < nv; i++) {
                const float lo_half = s[i], hi_half = s[i + nv];
                const float keep = hi ? hi_half : lo_half, send = hi ? lo_half : hi_half;
                s[i] = keep + __shfl_xor_sync(0xffffffffu, send, mask);
            }
        }
#pragma unroll
        for (int st = LNV; st < 5; st++) s[0] += __shfl_xor_sync(0xffffffffu, s[0], 16 >> st);
        float sc = s[0] * scale;
        if (softcap > 0.0f) sc = softcap * (float)tanh((double)(sc / softcap));
        if (alibi) sc += alibi[h0 + mh] * (float)(lo + j0 + mj); /* ALiBi: the head's slope times the key's position */
        if (mj >= n) sc = ninf;
        /* online softmax: the step's maximum of head mh (over the lanes of its positions) */
        float cm = sc;
#pragma unroll
        for (int st = 0; st < LP; st++) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 16 >> st));
        const float mn = fmaxf(m, cm);
        const float alpha = mn == ninf ? 1.0f : expf(m - mn);
        const float p = sc == ninf ? 0.0f : expf(sc - mn);
        l = l * alpha + p;
        m = mn;
        float *pb = pbuf[r & 1][w];
        if (lane % RL == 0) pb[mk] = p;
        if (lane % RL == 0 && mj == 0) pb[NV + mh] = alpha;
        kcu_syncwarp();
        /* acc = acc * alpha + sum_j p_j v_j, positions in order */
#pragma unroll
        for (int h = 0; h < HB; h++) {
            const float a = pb[NV + h];
#pragma unroll
            for (int i = 0; i < CV * VV; i++) acc[h][i] *= a;
        }
#pragma unroll
        for (int j = 0; j < P; j++)
            if (j < n)
#pragma unroll
                for (int h = 0; h < HB; h++) {
                    const float pj = pb[j * HB + h];
#pragma unroll
                    for (int i = 0; i < CV * VV; i++) acc[h][i] = fmaf(pj, vr[j][i], acc[h][i]);
                }
    }

    /* the block's warps' states combined in warp order, in double: out = sum_w acc_w f_w / sum_w l_w f_w,
     * f_w = e^(m_w - M), M the largest m_w (split: the block's state, combined with the cluster's below) */
    if (lane % RL == 0) lbuf[w][mk] = l;
    if (lane % RL == 0 && mj == 0) mbuf[w][mh] = m;
#pragma unroll
    for (int h = 0; h < HB; h++)
#pragma unroll
        for (int c = 0; c < CV; c++)
#pragma unroll
            for (int e = 0; e < VV; e++) {
                const int d = (c * 32 + lane) * VV + e;
                if (d < DV) abuf[w][h][d] = acc[h][c * VV + e];
            }
    __syncthreads();
    if (tid < NW * HB) { /* one thread a (warp, head) */
        const int v = tid / HB, h = tid % HB;
        float mx = ninf;
        for (int u = 0; u < NW; u++) mx = fmaxf(mx, mbuf[u][h]);
        double lw = 0.0;
        for (int j = 0; j < P; j++) lw += lbuf[v][j * HB + h];
        const double f = mbuf[v][h] == ninf ? 0.0 : exp((double)(mbuf[v][h] - mx)); /* 0: a warp with no position */
        fbuf[v][h] = f;
        wbuf[v][h] = lw * f;
        if (SPLIT > 1 && v == 0) bmax[0][h] = mx;
        /* the sink's e^(sink - M), in the unsplit sum only (split: the cluster's combination adds it) */
        if (v == 0) snk[h] = sinks && (SPLIT == 1 || split == 1) ? exp((double)kcu_f(sinks[h0 + h]) - (double)mx) : 0.0;
    }
    __syncthreads();
    for (int i = tid; i < HB * DV; i += NT) {
        const int h = i / DV, d = i % DV;
        double sum = 0.0, o = 0.0;
        for (int v = 0; v < NW; v++) {
            sum += wbuf[v][h];
            o += (double)abuf[v][h][d] * fbuf[v][h];
        }
        if constexpr (SPLIT > 1) {
            if (split > 1) { /* the block's state, relative to its maximum bmax */
                bacc[0][h][d] = o;
                if (d == 0) bsum[0][h] = sum;
                continue;
            }
        }
        sum += snk[h];
        if constexpr (kcu_same<O, float>::V) /* (a plain store: kcu_put here changes the f32 kernel's code) */
            out[((long long)t * H + h0 + h) * DV + d] = (float)(o / sum);
        else
            kcu_put(out + ((long long)t * H + h0 + h) * DV + d, (float)(o / sum));
    }
    /* the cluster's blocks' states combined in block order by the first: g_b = e^(bmax_b - M) */
    if constexpr (SPLIT > 1) {
        if (split == 1) return;
        kcu_cluster_combine<HB, DV, SPLIT, 1, NT>(
            z, split, split, bmax, bsum, bacc, gbuf, [](float mb, float mx) { return exp((double)(mb - mx)); },
            [&](int h, int d, float v) {
                if constexpr (kcu_same<O, float>::V)
                    out[((long long)t * H + h0 + h) * DV + d] = v;
                else
                    kcu_put(out + ((long long)t * H + h0 + h) * DV + d, v);
            },
            [&](int h) { return sinks ? kcu_f(sinks[h0 + h]) : ninf; });
    }
}
/* The attention kernel's body: kcu_attention over HBW heads a block (sharing their K and V
 * reads) when that still makes KCU_ATT_WIDE blocks or more and the step has more than WIDE_T
 * tokens (prefill, large batched decode), else one head a block (decode of few tokens: H blocks a
 * token, to spread the reads over more of the GPU). Launched on [T, H, S] blocks of 32 * NW threads
 * (z: a cluster's blocks, kcu_attention); blocks past H / HBW return at once in the first way.
 * Either way is deterministic, but they round differently (the score sums' trees differ with the
 * heads a warp step holds), so a token's result depends on which way its step took: WIDE_T is the
 * generator's decode range (kcu.h's KCU_DECODE_T), within which a token's attention is the same
 * whatever else the step holds (measured before WIDE_T: an f32 engine's sequence among 31 others
 * differed from alone by 3e-7, bench/RESULTS.md #11 step 1). */
enum { KCU_ATT_WIDE = 128 };
template <int H, int KH, int DK, int DV, int HBW, int PW, int P1, int NW, int S, int WINDOW, int WIDE_T, int VIK = 0,
          typename Q, typename C, typename O, typename SK = float>
static __device__ __forceinline__ void kcu_attention_kernel(const int T, const Q *__restrict__ q,
                                                            const C *__restrict__ kc, const C *__restrict__ vc,
                                                            O *__restrict__ out, const int *__restrict__ positions,
                                                            const int *__restrict__ table_off,
                                                            const int *__restrict__ tables, const int block_size,
                                                            const float scale, const float softcap,
                                                            const float *__restrict__ alibi = nullptr,
                                                            const SK *__restrict__ sinks = nullptr,
                                                            const float *__restrict__ ks = nullptr,
                                                            const float *__restrict__ vs = nullptr)
{
    if (!KCU_CLUSTERS && blockIdx.z > 0) return; /* no clusters: block z = 0 takes every position */
    if (HBW > 1 && T > WIDE_T && (long long)T * (H / HBW) >= KCU_ATT_WIDE) {
        if (blockIdx.y < H / HBW)
            kcu_attention<H, KH, DK, DV, HBW, PW, NW, S, WINDOW, VIK>(q, kc, vc, out, positions, table_off, tables,
                                                                 block_size, scale, softcap, alibi, sinks, ks, vs);
    } else {
        kcu_attention<H, KH, DK, DV, 1, P1, NW, S, WINDOW, VIK>(q, kc, vc, out, positions, table_off, tables, block_size,
                                                           scale, softcap, alibi, sinks, ks, vs);
    }
}
/* ==== end of attention ================================================================ */

/* ==== matmul, prefill on sm_90a: wgmma fed by TMA (kcu_gemm90) ==========================
 *
 * out[t, n] = sum_k x[t, k] w[n, k] for T tokens (known at run time) with x
 * and w both bf16 or both f16 (fast precision: half activations), f32 sums,
 * handed to the usual epilogue (epi.two / epi.one, above). Compiled only for
 * sm_90a (wgmma and setmaxnreg are arch-specific): KCU_GEMM90 is 1 there and
 * 0 elsewhere (sm_80, plain sm_90, the CPU emulator), where the section is
 * absent; the code generator emits kernels that call it only for sm_90a.
 *
 * Layout. A block of 384 threads (three warpgroups) computes a tile of BM =
 * 128 tokens x BN columns (BN 64, 128, 192, 224 or 256): blockIdx.x is
 * the token tile, blockIdx.y the column tile (token tiles vary fastest, so
 * the blocks in flight share a few weight tiles and x stays in L2).
 * K goes in blocks of 64 (128 bytes a row: one 128-byte swizzle atom) through
 * a ring of STAGES shared-memory stages; stage s holds x rows [128][64] and
 * weight rows [BN][64], each row 128 bytes, swizzled by TMA in the 128-byte
 * pattern (16-byte chunk c of row r at chunk c ^ r % 8), 1024-byte aligned.
 *  - warpgroup 0, the producer (setmaxnreg 40): thread 0 waits for a stage
 *    to be empty, arms its `full` mbarrier with the stage's bytes and issues
 *    two cp.async.bulk.tensor loads (x box [128 rows][64], w box [BN][64];
 *    what lies past the tensor maps' edges, rows past max_tokens or N and k
 *    past K, arrives as zeros); its other threads exit.
 *  - warpgroups 1 and 2, the consumers (setmaxnreg 232): warpgroup 1 + j
 *    owns tokens 64 j .. +63 of the tile, all BN columns (BN / 2 f32
 *    accumulators a thread); per stage 4 wgmma m64nBNk16 (A and B from
 *    shared memory through descriptors: K-major, 128-byte swizzle, 1024
 *    bytes between 8-row groups; the k16 step moves the start by 32 bytes),
 *    one commit group, then wait until the previous stage's group is done
 *    and release that stage (one arrive a warp on its `empty` mbarrier).
 * The epilogue: once both consumers' last wgmma are done, they store their
 * accumulators (wgmma's D layout: lane l of warp w, for each 8 columns j,
 * tokens 16 w + l / 4 (+ 8), columns 8 j + 2 (l % 4) (+ 1)) as an f32 tile
 * in the stages' shared memory, and their 256 threads hand it to the
 * epilogue (kcu_g90_handoff): each thread keeps one pair of columns
 * (consecutive threads, consecutive columns of a token) down the rows, and
 * fetches the inputs of 8 rows (a residual, positions, KV slots) before
 * applying any, so that its loads are in flight together. (Measured before: each thread handed its own
 * accumulators to a called epilogue, one pair at a time, whose load waited
 * for the previous pair's store: o and down ran at 0.49 and 0.64 of
 * cuBLAS in the engine, q,k,v with RoPE and the KV write at 0.37.)
 * Tokens >= T and columns >= N are not handed over.
 *
 * Column order. TMA reads weight rows as they lie. With Tiles =
 * kcu_g90_plain<BN> (below), the matmul's column c is weight row c of the w
 * it is given and goes to the epilogue as Epi::row(c) (a w stored permuted,
 * as tests/cuda/cuda_gemm90_check.c does). The code generator instead keeps
 * the model's weights and describes each column tile as TMA boxes of whole
 * swizzle atoms (Tiles: a table; codegen/cuda/kcu_emit_g90.c): a tile of
 * neighbour pairs, or a split tile whose first BN / 2 columns are the
 * first columns of pairs and the last BN / 2 their partners (RoPE's halves
 * j, j + rot / 2 in each head; SwiGLU's gate c with up c), which wgmma's D
 * layout puts in one thread (columns n and n + BN / 2, BN / 2 % 8 == 0).
 * The generated kernels run it without the RMS prologue below: a prologue
 * norm's own kernel writes its (half) value first, which the x map reads.
 *
 * RMSNorm prologue (Pro = kcu_g90_rms). rms_norm(x) w^T = diag(1 / rms(x))
 * x (g * w)^T: the norm's weight g is folded into the weights at build time
 * (w'[n, k] = w[n, k] * g[k], rounded once to the weight dtype), a pre-pass
 * kernel (kcu_g90_rms_inv: a warp a row, f32 sums in a fixed order) writes
 * inv[t] = 1 / sqrt(mean_k x[t, k]^2 + eps) for t < T, and the epilogue
 * scales the f32 sums by inv[t]. Chosen by measurement: summing the squares
 * from the x tiles in shared memory in two producer warps cost 35-50 % of
 * the matmul's rate (q,k,v 433 against 703 TFLOP/s at T = 2048), and raced
 * with the TMA refilling the stage (generic-proxy reads against an
 * async-proxy write); the pre-pass reads x once more (T K 2 bytes: 16 MB,
 * about 5 us at T = 2048) and q,k,v with it runs at 675 TFLOP/s (pre-pass
 * included). (LayerNorm the same way would need the row mean too and
 * sum_k g[k] w[n, k] per column: y = inv (x.w' - mean colsum(w')): not done.)
 *
 * Tensor maps (host, cuTensorMapEncodeTiled, once per session): x as a
 * 2-D tensor {K, max_tokens} (innermost first), row stride K * 2 bytes, box
 * {64, 128}; w as {K, N}, stride K * 2, box {64, BN}; both 128-byte
 * swizzle, no interleave, zero fill, L2 promotion 256 B, element strides 1;
 * data type bf16 (9) or f16 (6) as X. Needs K * 2 % 16 == 0 and 16-byte
 * aligned bases. Dynamic shared memory: kcu_gemm90_smem(BN, STAGES) bytes
 * (the stages plus 1024 for alignment; set the function's
 * MAX_DYNAMIC_SHARED_SIZE_BYTES attribute to it), grid (ceil(T / 128),
 * ceil(N / BN)), 384 threads, __launch_bounds__(384, 1).
 *
 * Each output is one block's sum over k in a fixed order (no split-K, no
 * atomics): bitwise reproducible.
 *
 * Tiles (STAGES follows BN: 256 -> 4, 192 -> 5, 128 -> 6, 64 -> 8, about
 * 192 kB of stages). Fewer tiles than multiprocessors leaves some idle, so:
 * BN = the largest of 256, 192, 128 with ceil(T / 128) ceil(N / BN) >= 119
 * (0.9 x the H200's 132 SMs), else 128. T is known at run time: emit the
 * BN = 256 kernel and the one this rule picks at the smallest T a shape
 * sees (or at T = 512) and launch by T, as NAME / NAME_large are chosen.
 * Llama-3-8B: every shape at T = 2048 and gate_up, lm_head at T = 512 take
 * 256; q,k,v at T = 512 takes 192; o and down at T = 512 take 128.
 *
 * Throughput. Expected: a k block of a 128 x 256 tile is 4.2 MFLOP, about
 * 800 ns of an SM at 700 TFLOP/s, against 48 kB of TMA per stage (60 GB/s
 * an SM from L2/HBM): the tensor cores' rate, less the prologue and
 * epilogue of each tile (no persistence) and the last wave's idle SMs.
 * Measured (H200, cuda_gemm90_check --gpu beside bench/gemm90_vs_cublas.py,
 * same run, bf16 in and out, TFLOP/s, kiln / cuBLAS, the tile rule's tile;
 * bench/RESULTS.md, issue #10 step 6):
 *   q,k,v   T=512 656 / 715 (0.92)   T=2048 745 / 785 (0.95)
 *   o       T=512 648 / 708 (0.92)   T=2048 739 / 762 (0.97)
 *   gate_up T=512 706 / 771 (0.92)   T=2048 755 / 787 (0.96)
 *   down    T=512 710 / 721 (0.98)   T=2048 806 / 700 (1.15)
 *   lm_head T=512 720 / 649 (1.11)   T=2048 764 / 690 (1.11)
 * Tried and measured slower: two blocks an SM (tiles of 128 x 128, 3 stages),
 * and pairs of 128 x 128 tiles a block, one a consumer warpgroup (one's
 * epilogue under the other's mainloop, the mainloops one after the other).
 * Room left: a persistent grid (the epilogue of one tile under the next
 * one's loads).
 *
 * Clusters (CLUSTER 2, kernels with KCU_G90_CLUSTER2; off unless asked:
 * kcu_options.g90_cluster): the two blocks of a cluster compute token tiles
 * 2 j and 2 j + 1 of one column tile (grid 2 x ceil(T / 256) x column
 * tiles); each producer loads its own x box and half of every weight box
 * (a tensor map of boxes of R / 2 rows), multicast into both blocks' stage,
 * whose `full` barrier expects the whole stage; a stage is refilled once the
 * consumers of both blocks released it (`empty` counts 16 warps, arrivals
 * through mapa); the blocks meet (barrier.cluster) after setting up their
 * barriers and before leaving. L2 reads of w halve. Measured (H200, 2026-12-02,
 * mbarrier arrivals with release.cluster): 0.6 of single blocks at 2048 tokens.
 */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KCU_GEMM90 1
#else
#define KCU_GEMM90 0
#endif
/* The CPU emulator (tests/cuda/emu_shim.h) runs a plain stand-in of kcu_gemm90 with the same
 * interface (below), so that the code generator's gemm90 kernels, their tensor maps and tile
 * tables run in CI; KCU_GEMM90_KERNELS says where the generated gemm90 kernels exist. */
#if defined(KILN_EMU_SHIM_H)
#define KCU_GEMM90_EMU 1
#else
#define KCU_GEMM90_EMU 0
#endif
#define KCU_GEMM90_KERNELS (KCU_GEMM90 || KCU_GEMM90_EMU)
/* the attribute of a kernel that runs kcu_gemm90 in clusters of two blocks (CLUSTER 2); the
 * emulator runs each block alone */
#if KCU_GEMM90
#define KCU_G90_CLUSTER2 __cluster_dims__(2, 1, 1)
#else
#define KCU_G90_CLUSTER2
#endif
/* Dynamic shared memory of kcu_gemm90<.., BN, STAGES, ..> in bytes: the
 * stages, or the f32 tile of the epilogue where that is more (two stages),
 * plus 1024 for alignment (codegen/cuda/kcu.h: kcu_g90_smem_bytes on the host). */
#define kcu_gemm90_smem(BN, STAGES)                                                                                   \
    (((STAGES) * (128 + (BN)) * 128 > 128 * ((BN) + 8) * 4 ? (STAGES) * (128 + (BN)) * 128 : 128 * ((BN) + 8) * 4) + \
     1024)

#if KCU_GEMM90_KERNELS
enum { KCU_G90_THREADS = 384, KCU_G90_BM = 128, KCU_G90_ROW = 128 /* bytes of a row a stage */ };

/* The operands X of both x and w: bf16, f16, or one-byte codes (kcu_kv_e4m3: the fp8 scheme's;
 * kcu_kv_i8: w8a8's). OP says which wgmma multiplies them: m64nNk16 for halves, m64nNk32 for bytes
 * (e4m3 f32 sums; s8 s32 sums, exact), 32 bytes of each row either way, so a stage's 128-byte rows
 * hold BK = 64 or 128 elements and every descriptor step is the same. TMAP: the tensor maps' data
 * type (cuTensorMapEncodeTiled's: 9 bf16, 6 f16, 0 uint8). */
template <typename X> struct kcu_g90_op;
template <> struct kcu_g90_op<kcu_bf16> {
    enum { OP = 0, BK = 64, TMAP = 9 };
    typedef float acc;
};
template <> struct kcu_g90_op<kcu_f16> {
    enum { OP = 1, BK = 64, TMAP = 6 };
    typedef float acc;
};
template <> struct kcu_g90_op<kcu_kv_e4m3> {
    enum { OP = 2, BK = 128, TMAP = 0 };
    typedef float acc;
};
template <> struct kcu_g90_op<kcu_kv_i8> {
    enum { OP = 3, BK = 128, TMAP = 0 };
    typedef int acc;
};

/* prologues: what multiplies each sum — none; rms_norm with its weight folded into w and the rows'
 * 1 / rms from kcu_g90_rms_inv (a pre-pass); or (kcu_g90_xq) the codes' scales of x's row
 * (kcu_g90_quantize_x, a pre-pass) and of w's row (the column's). scale(t) a row's, col(c) weight
 * row c's. */
struct kcu_g90_none {
    __device__ __forceinline__ float scale(long long) const { return 1.0f; }
    __device__ __forceinline__ float col(int) const { return 1.0f; }
};
struct kcu_g90_rms {
    const float *__restrict__ inv; /* [T] 1 / sqrt(mean_k x[t, k]^2 + eps), from kcu_g90_rms_inv */
    __device__ __forceinline__ float scale(long long t) const { return inv[t]; }
    __device__ __forceinline__ float col(int) const { return 1.0f; }
};
template <typename S> struct kcu_g90_xq {
    const float *__restrict__ xs; /* [T] each row's scale, from kcu_g90_quantize_x */
    const S *__restrict__ ws;     /* [N] each weight row's scale (a scale a row: fp8, w8a8) */
    __device__ __forceinline__ float scale(long long t) const { return xs[t]; }
    __device__ __forceinline__ float col(int c) const { return kcu_f(ws[c]); }
};

/* Which weight rows the B tile of column tile y holds (kcu_gemm90's Tiles):
 * NBOX boxes of R = BN / NBOX rows (R % 8 == 0: whole 1024-byte swizzle
 * atoms), box i from weight row box(y, i) on (-1: unused — loaded from row 0
 * so that the stage's byte count holds, never handed over). split(y) 0: the
 * tile's columns go to the epilogue as neighbours (2p, 2p + 1); 1: tile
 * column n < BN / 2 with column n + BN / 2 (a rotation's pair, gate with
 * up: wgmma's D layout puts columns n and n + BN / 2 in one thread, BN / 2
 * being a multiple of 8). PLAIN: tile y is weight rows y BN .. + BN - 1 and
 * column c goes to the epilogue as Epi::row(c) (a w stored permuted); the
 * code generator's tables (PLAIN 0) name the model's rows themselves. */
template <int BN> struct kcu_g90_plain {
    enum { NBOX = 1, PLAIN = 1 };
    static __device__ __forceinline__ int box(int y, int) { return y * BN; }
    static __device__ __forceinline__ int split(int) { return 0; }
};

/* The hand-off of a finished tile to the epilogue. The tile's f32 sums
 * lie in shared memory, row r (token m0 + r) at tile + r * KCU_G90_LD(BN),
 * column n of the tile at + n. A unit is a row and p < BN / 2: columns 2p,
 * 2p + 1 of a neighbours tile, or p and its partner p + BN / 2 of a split
 * tile. Thread `first` of `step` (step a multiple of BN / 2, or at least
 * it: the threads past the last whole multiple idle) keeps one p, so that
 * its columns, their boxes and the epilogue's column step (kcu_epi_steps:
 * which of the group's nodes the columns are in, their elements, a
 * rotation's frequency) are worked out once, and takes rows first / (BN /
 * 2), + step / (BN / 2), ...: a warp's
 * lanes take consecutive columns of a row (coalesced loads and stores). It
 * fetches U rows' inputs before applying any (kcu_epi_steps), with no
 * branch between the loads (ptxas waits for a load at the end of its
 * branch: measured, the hand-off ran a load at a time). Tokens >= T,
 * columns >= N and unused boxes are not handed over; sums are scaled by
 * pro.scale(token). */
#define KCU_G90_LD(BN) ((BN) + 8) /* floats a row: 8 banks apart, no conflicts on the D layout's stores */
/* kcu_g90_handoff's rows r0, r0 + pass, ... < rows of its columns n0, n1 (FULL: every row of
 * every pass of U is in the tile, so no row is tested) */
template <bool FULL, int U, int LD, class S, class Pro, class Epi>
static __device__ __forceinline__ void kcu_g90_hand_rows(const Epi &epi, const Pro &pro, const float *tile, long long m0,
                                                         int rows, int r0, int pass, int n0, int n1, float s0,
                                                         float s1, const typename S::col &cc)
{
    for (int r = r0; r < rows; r += U * pass) {
        typename S::in in[U];
        float v0[U], v1[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            /* past the last row: fetch the last again (not applied), so that no branch parts the loads */
            const int rr = FULL || r + u * pass < rows ? r + u * pass : rows - 1;
            const float sc = pro.scale(m0 + rr);
            v0[u] = tile[rr * LD + n0] * sc * s0;
            v1[u] = tile[rr * LD + n1] * sc * s1; /* (not handed over when pc < 0) */
            S::fetch(epi, m0 + rr, cc, in[u]);
        }
#pragma unroll
        for (int u = 0; u < U; u++)
            if (FULL || r + u * pass < rows) S::apply(epi, m0 + r + u * pass, v0[u], v1[u], cc, in[u]);
    }
}
template <int BN, int N, class Tiles, int U, class Pro, class Epi>
static __device__ __forceinline__ void kcu_g90_handoff(const Epi &epi, const Pro &pro, int T, long long m0, int y,
                                                       const float *tile, int first, int step)
{
    typedef kcu_epi_steps<Epi> S;
    enum { R = BN / Tiles::NBOX, UPR = BN / 2, LD = KCU_G90_LD(BN) };
    const int pass = step / UPR; /* rows a pass of the `step` threads */
    if (first >= pass * UPR) return;
    const int p = first % UPR, split = Tiles::split(y);
    const int n0 = split ? p : 2 * p, n1 = split ? p + BN / 2 : 2 * p + 1;
    const int b = Tiles::box(y, n0 / R);
    if (b < 0) return;
    int c = b + n0 % R, pc = -1;
    if (split) pc = Tiles::box(y, n1 / R) + n1 % R;
    else if (c + 1 < N) pc = c + 1;
    else if (c >= N) return;
    const int c0 = Tiles::PLAIN ? Epi::row(c) : c, c1 = pc < 0 ? -1 : Tiles::PLAIN ? Epi::row(pc) : pc;
    typename S::col cc; /* what the columns decide, once for all the rows */
    S::column(epi, c0, c1, cc);
    const float s0 = pro.col(c), s1 = pc < 0 ? 0.0f : pro.col(pc); /* the weight rows' scales (1: none) */
    const int rows = T - m0 < KCU_G90_BM ? (int)(T - m0) : KCU_G90_BM;
    /* a full tile's rows, in passes of U * pass rows that divide it, need no tests */
    if (rows == KCU_G90_BM && KCU_G90_BM % (U * pass) == 0)
        kcu_g90_hand_rows<true, U, LD, S>(epi, pro, tile, m0, rows, first / UPR, pass, n0, n1, s0, s1, cc);
    else
        kcu_g90_hand_rows<false, U, LD, S>(epi, pro, tile, m0, rows, first / UPR, pass, n0, n1, s0, s1, cc);
}
enum { KCU_G90_U = 8 }; /* rows a thread fetches before applying any (kcu_g90_handoff) */

/* The tile block (bx, by) of a grid of gx token tiles by gy column tiles computes: (x, y). Blocks start
 * in the order of their linear index (bx fastest); taken as they are, the blocks resident at once span
 * every token tile of a step and two or three column tiles, so that at T = 8192 (64 token tiles) each
 * k block of x is read from HBM again for every few column tiles (x: 64 MB, past the H200's 50 MB of
 * L2). Here consecutive blocks sweep the column tiles of a band of KCU_G90_BAND token tiles (Triton's
 * grouped order): the resident blocks cover about 16 x 8 tiles, x and w read once a band. Up to
 * KCU_G90_BAND token tiles (T <= 2048) it is the identity. A bijection of the grid: the last band is
 * as many token tiles as are left. */
enum { KCU_G90_BAND = 16 };
struct kcu_g90_at {
    int x, y;
};
__device__ __forceinline__ kcu_g90_at kcu_g90_raster(int bx, int by, int gx, int gy)
{
    const int id = by * gx + bx, band = KCU_G90_BAND * gy, b = id / band, x0 = b * KCU_G90_BAND, in = id - b * band;
    const int rows = gx - x0 < KCU_G90_BAND ? gx - x0 : KCU_G90_BAND;
    return {x0 + in % rows, in / rows};
}
/* This block's tile. CLUSTER 1: grid (token tiles, column tiles). CLUSTER 2: grid (2, ceil(T / 256),
 * column tiles) in clusters of the two blocks along x, token tiles 2 by + bx of column tile bz (the
 * grid's x even whatever T; the pair's tiles neighbours in the raster's order, whose bands are even:
 * one column tile, so that they share its weight tile). */
template <int CLUSTER> __device__ __forceinline__ kcu_g90_at kcu_g90_block_at()
{
    if (CLUSTER == 2) return kcu_g90_raster(2 * blockIdx.y + blockIdx.x, blockIdx.z, 2 * gridDim.y, gridDim.z);
    return kcu_g90_raster(blockIdx.x, blockIdx.y, gridDim.x, gridDim.y);
}

/* x's rows as codes C (kcu_kv_e4m3 or kcu_kv_i8) for the fp8 and w8a8 matmuls on kcu_gemm90 (a
 * pre-pass, as ir/quant.h's kir_quantize_row and the decode kernels' kcu_pro_xq): row t's scale
 * xs[t] = amax / Q and codes[t, k] the code of x[t, k] / xs[t] (a row of zeros: scale 0, codes 0).
 * A warp a row (blocks of KCU_G90_INV_ROWS warps: grid ceil(T / 8)); lane l takes 8-element chunks
 * l, l + 32, ... (x rows 16-byte aligned: K % 16 == 0), the amax by a butterfly of shuffles (a
 * maximum: the same in any order), 8 codes an 8-byte store. */
enum { KCU_G90_INV_ROWS = 8 };
template <typename C, int K, typename X>
static __device__ __forceinline__ void kcu_g90_quantize_x(const int T, const X *__restrict__ x, C *__restrict__ codes,
                                                          float *__restrict__ xs)
{
    static_assert(K % 16 == 0, "rows of 16-byte chunks of codes");
    typedef kcu_kv_codes<C> Q;
    const int lane = threadIdx.x % 32;
    const long long t = (long long)blockIdx.x * KCU_G90_INV_ROWS + threadIdx.x / 32;
    const bool live = t < T; /* every lane of the block takes part in the shuffles */
    const X *const row = x + (live ? t : 0) * K;
    float m = 0.0f;
    for (int c = lane; live && c < K / 8; c += 32) {
        float v[8];
        kcu_xload<8>(row + 8 * c, v);
#pragma unroll
        for (int j = 0; j < 8; j++) m = fmaxf(m, fabsf(v[j]));
    }
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, s));
    if (!live) return;
    const float sc = m / (float)Q::Q;
    if (lane == 0) xs[t] = sc;
    unsigned char *const out = reinterpret_cast<unsigned char *>(codes) + t * K;
    for (int c = lane; c < K / 8; c += 32) {
        float v[8];
        kcu_xload<8>(row + 8 * c, v);
        unsigned lo = 0, hi = 0;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const unsigned b = sc > 0.0f ? Q::code(v[j] / sc) : 0u;
            if (j < 4) lo |= b << (8 * j);
            else hi |= b << (8 * (j - 4));
        }
        *reinterpret_cast<unsigned long long *>(out + 8 * c) = (unsigned long long)hi << 32 | lo;
    }
}
#endif

#if KCU_GEMM90_EMU
/* The emulator's tensor map: tests/cuda/emu_libcuda.c's cuTensorMapEncodeTiled
 * records its arguments in a kcu_emu_tmap and puts the record's address in
 * the map's first 8 bytes, which its cuLaunchKernel passes (8 bytes a
 * parameter). */
struct kcu_emu_tmap {
    const void *base;             /* the tensor */
    unsigned long long dims[2];   /* elements: innermost, rows */
    unsigned long long stride;    /* bytes between rows */
    unsigned box[2];              /* elements, rows */
    int dtype;                    /* 9 bf16, 6 f16, 0 bytes */
};
struct kcu_tmap {
    const kcu_emu_tmap *m;
};
/* Element (k, row) of map m as f32; 0 past its edges, as TMA fills. */
template <typename X> static inline float kcu_emu_tmap_at(const kcu_emu_tmap *m, long long k, long long row)
{
    if (k >= (long long)m->dims[0] || row >= (long long)m->dims[1]) return 0.0f;
    const X *p = (const X *)((const char *)m->base + row * m->stride + k * (long long)sizeof(X));
    if constexpr (kcu_kv_codes<X>::V) return kcu_kv_codes<X>::value(p->c); /* a code's value */
    else return kcu_f(*p);
}
/* The stand-ins' checks of the maps against the kernel (boxes {BK, 128} and {BK, R}, the operand type),
 * then column tile y of token tile x computed in f32 (k in order, reading x and w through their maps as
 * TMA would) into tile and handed to the epilogue as the real kernels do. */
template <typename X, int K, int N, int BN, class Tiles, int CLUSTER, class Pro, class Epi>
static inline void kcu_emu_g90_tile(const kcu_tmap &ta, const kcu_tmap &tb, const Pro &pro, const Epi &epi, int T,
                                    float *tile)
{
    /* the maps' element size: one byte (uint8) or two (bf16 or f16: a dequantized weight's map is bf16 for
     * either half, as TMA copies bytes) */
    enum { R = BN / Tiles::NBOX, ONE = sizeof(X) == 1, BK = kcu_g90_op<X>::BK };
    const kcu_emu_tmap *a = ta.m, *w = tb.m;
    if (a->box[0] != BK || a->box[1] != KCU_G90_BM || w->box[0] != BK || w->box[1] != R / CLUSTER ||
        a->dims[0] != K || w->dims[0] != K || (a->dtype == 0) != ONE || (w->dtype == 0) != ONE)
        __builtin_trap();
    const kcu_g90_at at = kcu_g90_block_at<CLUSTER>();
    int y;
    const long long m0 = (long long)at.x * KCU_G90_BM;
    y = at.y;
    for (int r = 0; r < KCU_G90_BM && m0 + r < T; r++)
        for (int n = 0; n < BN; n++) {
            const int b = Tiles::box(y, n / R), row = (b < 0 ? 0 : b) + n % R;
            float sum = 0.0f;
            for (int k = 0; k < K; k++) sum = fmaf(kcu_emu_tmap_at<X>(a, k, m0 + r), kcu_emu_tmap_at<X>(w, k, row), sum);
            tile[r * KCU_G90_LD(BN) + n] = sum;
        }
    for (int p = 0; p < BN / 2; p++) kcu_g90_handoff<BN, N, Tiles, KCU_G90_U>(epi, pro, T, m0, y, tile, p, BN / 2);
}
/* kcu_gemm90's stand-in: thread 0 of each block computes its tile (kcu_emu_g90_tile); a cluster's
 * blocks each their own (the weight halves they would share are read whole). */
template <typename X, int K, int N, int BN, int STAGES, class Tiles = kcu_g90_plain<BN>, int CLUSTER = 1, class Pro,
          class Epi>
static inline void kcu_gemm90(const int T, const kcu_tmap &ta, const kcu_tmap &tb, const Pro pro, const Epi &epi)
{
    if (threadIdx.x != 0) return;
    float *tile = (float *)calloc((size_t)KCU_G90_BM * KCU_G90_LD(BN), sizeof(float));
    if (!tile) __builtin_trap();
    kcu_emu_g90_tile<X, K, N, BN, Tiles, CLUSTER>(ta, tb, pro, epi, T, tile);
    free(tile);
}
#endif

#if KCU_GEMM90
/* CUtensorMap (cuda.h): 128 opaque bytes, 128-byte aligned */
struct alignas(128) kcu_tmap {
    unsigned long long opaque[16];
};

/* The RMS pre-pass: inv[t] = 1 / sqrt(mean_k x[t, k]^2 + eps) for t < T, a
 * warp a row (blocks of KCU_G90_INV_ROWS warps: grid ceil(T / 8)); lane l
 * sums the squares of 8-element chunks l, l + 32, ... in f32 (x rows 16-byte
 * aligned: K % 8 == 0), then a fixed butterfly of shuffles: deterministic. */
template <typename X, int K>
static __device__ __forceinline__ void kcu_g90_rms_inv(const int T, const X *__restrict__ x, const float eps,
                                                       float *__restrict__ inv)
{
    static_assert(K % 8 == 0, "rows of 16-byte chunks");
    const int lane = threadIdx.x % 32;
    const long long t = (long long)blockIdx.x * KCU_G90_INV_ROWS + threadIdx.x / 32;
    if (t >= T) return;
    const X *const row = x + t * K;
    float ss = 0.0f;
    for (int c = lane; c < K / 8; c += 32) {
        float v[8];
        kcu_vec<X>::load(row + 8 * c, v);
#pragma unroll
        for (int j = 0; j < 8; j++) ss = fmaf(v[j], v[j], ss);
    }
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, m);
    if (lane == 0) inv[t] = 1.0f / sqrtf(ss / (float)K + eps);
}

__device__ __forceinline__ unsigned kcu_g90_smem(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void kcu_mbar_init(unsigned bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void kcu_mbar_expect(unsigned bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void kcu_mbar_arrive(unsigned bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void kcu_mbar_wait(unsigned bar, unsigned parity)
{
    unsigned done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}
/* box at (c0 innermost, c1) of map into shared dst, completing on bar */
__device__ __forceinline__ void kcu_tma_2d(unsigned dst, const kcu_tmap &map, unsigned bar, int c0, int c1)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];"
                 ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(&map)), "r"(bar), "r"(c0), "r"(c1)
                 : "memory");
}
/* the same box into shared dst of every block of the cluster in mask (each its own dst and bar: the
 * same offsets), completing on each one's bar */
__device__ __forceinline__ void kcu_tma_2d_multicast(unsigned dst, const kcu_tmap &map, unsigned bar, int c0, int c1,
                                                     unsigned short mask)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%3, %4}], [%2], %5;"
                 ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(&map)), "r"(bar), "r"(c0), "r"(c1), "h"(mask)
                 : "memory");
}
/* an arrival on the barrier at offset bar of block `rank` of the cluster (this one's included; the
 * default release.cta, as CUTLASS's ClusterBarrier::arrive: measured with release.cluster, the
 * clusters ran at 0.6 of single blocks) */
__device__ __forceinline__ void kcu_mbar_arrive_cluster(unsigned bar, unsigned rank)
{
    asm volatile("{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
                 "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(bar), "r"(rank)
                 : "memory");
}
/* wgmma shared-memory descriptor: K-major rows of 128 bytes, 128-byte
 * swizzle, 8-row groups 1024 bytes apart (stride), start at addr */
__device__ __forceinline__ unsigned long long kcu_wg_desc(unsigned addr)
{
    return (unsigned long long)((addr & 0x3ffffu) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
/* the two consumer warpgroups (threads 128 .. 383) meet: named barrier 1 */
__device__ __forceinline__ void kcu_g90_consumers_sync() { asm volatile("bar.sync 1, 256;" ::: "memory"); }
__device__ __forceinline__ void kcu_wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void kcu_wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void kcu_wg_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
/* the accumulators stay where they are across the asm above (CUTLASS's warpgroup_fence_operand) */
template <int R> __device__ __forceinline__ void kcu_wg_hold(float (&d)[R])
{
#pragma unroll
    for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i])::"memory");
}
template <int R> __device__ __forceinline__ void kcu_wg_hold(int (&d)[R])
{
#pragma unroll
    for (int i = 0; i < R; i++) asm volatile("" : "+r"(d[i])::"memory");
}

#define KCU_WG_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
    "+f"(d[i + 7])
#define KCU_WG_D32(i) KCU_WG_D8(i), KCU_WG_D8(i + 8), KCU_WG_D8(i + 16), KCU_WG_D8(i + 24)
/* the same for s32 accumulators (i8 operands) */
#define KCU_WG_I8(i) "+r"(d[i]), "+r"(d[i + 1]), "+r"(d[i + 2]), "+r"(d[i + 3]), "+r"(d[i + 4]), "+r"(d[i + 5]), "+r"(d[i + 6]), \
    "+r"(d[i + 7])
#define KCU_WG_I32(i) KCU_WG_I8(i), KCU_WG_I8(i + 8), KCU_WG_I8(i + 16), KCU_WG_I8(i + 24)
#define KCU_WG_LIST(...) __VA_ARGS__
/* The accumulators' operand numbers of wgmma's register list, 32 (16) at a time: "%0, %1, ..., %31" */
#define KCU_WG_R0 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "\
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define KCU_WG_R32 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "\
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define KCU_WG_R64 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "\
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define KCU_WG_R96_16 "%96, %97, %98, %99, %100, %101, %102, %103, "\
    "%104, %105, %106, %107, %108, %109, %110, %111"
#define KCU_WG_R112_16 "%112, %113, %114, %115, %116, %117, %118, %119, "\
    "%120, %121, %122, %123, %124, %125, %126, %127"
/* One wgmma m64nN of SHAPE_TYPES ("k16.f32.bf16.bf16", ...) on the accumulators REGS, descriptors A,
 * B, its scale-d predicate from operand P (1: d += a b^T), then TAIL (the halves' scales and
 * transposes; e4m3's scales; nothing for s8) */
#define KCU_WG_ASM(N, SHAPE_TYPES, REGS, A, B, P, TAIL)                                                                \
    "{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\n"                                                                \
    "wgmma.mma_async.sync.aligned.m64n" #N SHAPE_TYPES " {" REGS "}, " A ", " B ", p" TAIL ";\n}\n"
template <int BN> struct kcu_wg_mma; /* d += a b^T, m64 x BN x k16 (k32 bytes): a, b shared-memory descriptors */
/* kcu_wg_mma<N> on R accumulators a thread: run (halves), e4m3 and s8; DF, DI the outputs'
 * constraints, f32 and s32 (each a parenthesized list) */
#define KCU_WG_MMA_N(N, R, REGS, A, B, P, DF, DI)                                                                     \
    template <> struct kcu_wg_mma<N> {                                                                              \
        template <bool F16>                                                                                         \
        static __device__ __forceinline__ void run(float (&d)[R], unsigned long long a, unsigned long long b)       \
        {                                                                                                           \
            if constexpr (F16)                                                                                      \
                asm volatile(KCU_WG_ASM(N, "k16.f32.f16.f16", REGS, A, B, P, ", 1, 1, 0, 0")                        \
                             : KCU_WG_LIST DF : "l"(a), "l"(b), "r"(1));                                            \
            else                                                                                                    \
                asm volatile(KCU_WG_ASM(N, "k16.f32.bf16.bf16", REGS, A, B, P, ", 1, 1, 0, 0")                      \
                             : KCU_WG_LIST DF : "l"(a), "l"(b), "r"(1));                                            \
        }                                                                                                           \
        static __device__ __forceinline__ void e4m3(float (&d)[R], unsigned long long a, unsigned long long b)      \
        {                                                                                                           \
            asm volatile(KCU_WG_ASM(N, "k32.f32.e4m3.e4m3", REGS, A, B, P, ", 1, 1")                                \
                         : KCU_WG_LIST DF : "l"(a), "l"(b), "r"(1));                                                \
        }                                                                                                           \
        static __device__ __forceinline__ void s8(int (&d)[R], unsigned long long a, unsigned long long b)          \
        {                                                                                                           \
            asm volatile(KCU_WG_ASM(N, "k32.s32.s8.s8", REGS, A, B, P, "")                                          \
                         : KCU_WG_LIST DI : "l"(a), "l"(b), "r"(1));                                                \
        }                                                                                                           \
    };
KCU_WG_MMA_N(64, 32, KCU_WG_R0, "%32", "%33", "%34", (KCU_WG_D32(0)), (KCU_WG_I32(0)))
KCU_WG_MMA_N(128, 64, KCU_WG_R0 ", " KCU_WG_R32, "%64", "%65", "%66", (KCU_WG_D32(0), KCU_WG_D32(32)),
             (KCU_WG_I32(0), KCU_WG_I32(32)))
KCU_WG_MMA_N(192, 96, KCU_WG_R0 ", " KCU_WG_R32 ", " KCU_WG_R64, "%96", "%97", "%98",
             (KCU_WG_D32(0), KCU_WG_D32(32), KCU_WG_D32(64)), (KCU_WG_I32(0), KCU_WG_I32(32), KCU_WG_I32(64)))
KCU_WG_MMA_N(224, 112, KCU_WG_R0 ", " KCU_WG_R32 ", " KCU_WG_R64 ", " KCU_WG_R96_16, "%112", "%113", "%114",
             (KCU_WG_D32(0), KCU_WG_D32(32), KCU_WG_D32(64), KCU_WG_D8(96), KCU_WG_D8(104)),
             (KCU_WG_I32(0), KCU_WG_I32(32), KCU_WG_I32(64), KCU_WG_I8(96), KCU_WG_I8(104)))
KCU_WG_MMA_N(256, 128, KCU_WG_R0 ", " KCU_WG_R32 ", " KCU_WG_R64 ", " KCU_WG_R96_16 ", " KCU_WG_R112_16, "%128", "%129",
             "%130", (KCU_WG_D32(0), KCU_WG_D32(32), KCU_WG_D32(64), KCU_WG_D32(96)),
             (KCU_WG_I32(0), KCU_WG_I32(32), KCU_WG_I32(64), KCU_WG_I32(96)))
/* One wgmma of kcu_g90_op OP (0 bf16, 1 f16, 2 e4m3: f32 accumulators; 3 s8: s32) */
template <int BN, int OP, int R>
__device__ __forceinline__ void kcu_g90_mma(float (&d)[R], unsigned long long a, unsigned long long b)
{
    if constexpr (OP == 2) kcu_wg_mma<BN>::e4m3(d, a, b);
    else kcu_wg_mma<BN>::template run<OP == 1>(d, a, b);
}
template <int BN, int OP, int R>
__device__ __forceinline__ void kcu_g90_mma(int (&d)[R], unsigned long long a, unsigned long long b)
{
    static_assert(OP == 3, "s32 accumulators: i8 operands");
    kcu_wg_mma<BN>::s8(d, a, b);
}

/* A gemm90 block's start: thread 0 prefetches the tensor maps and sets up the ring's barriers, full
 * (one arrival: the producer's expect, then the bytes) and empty (`releasers` arrivals: the warps
 * that consume a stage); the block meets after. */
template <int STAGES, int CLUSTER>
static __device__ __forceinline__ void kcu_g90_ring_init(const kcu_tmap &ta, const kcu_tmap &tb, unsigned full,
                                                         unsigned empty, int releasers)
{
    if (threadIdx.x == 0) {
        asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<unsigned long long>(&ta)) : "memory");
        asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<unsigned long long>(&tb)) : "memory");
        for (int s = 0; s < STAGES; s++) {
            kcu_mbar_init(full + 8 * s, 1);
            kcu_mbar_init(empty + 8 * s, releasers);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    /* a cluster's blocks write into each other's stages and barriers: all of them set up first */
    if (CLUSTER > 1) kcu_cluster_sync();
    else __syncthreads();
}

/* The producer's fills g0 .. g0 + KT - 1 of the ring (the one thread that issues them): fill g into
 * stage g % STAGES once fill g - STAGES is released, the k blocks of x rows m0 .. m0 + 127 (sa: the x
 * stages) and of column tile y's boxes (sb: the w stages). */
template <int K, int BK, int BN, int STAGES, class Tiles, int CLUSTER>
static __device__ __forceinline__ void kcu_g90_produce(const kcu_tmap &ta, const kcu_tmap &tb, unsigned sa,
                                                       unsigned sb, unsigned full, unsigned empty, int m0, int y,
                                                       int g0, int rank)
{
    enum {
        KT = (K + BK - 1) / BK,
        A_BYTES = KCU_G90_BM * KCU_G90_ROW,
        B_BYTES = BN * KCU_G90_ROW,
        NBOX = Tiles::NBOX,
        RB = BN / NBOX
    };
    int rows[NBOX]; /* the boxes' first weight rows */
#pragma unroll
    for (int i = 0; i < NBOX; i++) rows[i] = max(Tiles::box(y, i), 0);
    for (int kt = 0; kt < KT; kt++) {
        const int g = g0 + kt, s = g % STAGES;
        if (g >= STAGES) kcu_mbar_wait(empty + 8 * s, (g / STAGES + 1) & 1);
        kcu_mbar_expect(full + 8 * s, A_BYTES + B_BYTES);
        kcu_tma_2d(sa + s * A_BYTES, ta, full + 8 * s, kt * BK, m0);
#pragma unroll
        for (int i = 0; i < NBOX; i++) {
            if (CLUSTER == 2) /* this block's half of each box, into both blocks' stage */
                kcu_tma_2d_multicast(sb + s * B_BYTES + i * RB * 128 + rank * (RB / 2) * 128, tb, full + 8 * s, kt * BK,
                                     rows[i] + rank * (RB / 2), (unsigned short)3);
            else
                kcu_tma_2d(sb + s * B_BYTES + i * RB * 128, tb, full + 8 * s, kt * BK, rows[i]);
        }
    }
}

/* The matmul of the design above on X (kcu_g90_op: kcu_bf16, kcu_f16, or the codes kcu_kv_e4m3 and
 * kcu_kv_i8) operands: K, N the shape, BN the tile's columns, STAGES the ring's depth; ta, tb the
 * tensor maps of x and w (kernel parameters, __grid_constant__); pro kcu_g90_none, kcu_g90_rms or
 * (codes) kcu_g90_xq. Called from a kernel of KCU_G90_THREADS threads with kcu_gemm90_smem(BN,
 * STAGES) bytes of dynamic shared memory. */
template <typename X, int K, int N, int BN, int STAGES, class Tiles = kcu_g90_plain<BN>, int CLUSTER = 1, class Pro,
          class Epi>
static __device__ __forceinline__ void kcu_gemm90(const int T, const kcu_tmap &ta, const kcu_tmap &tb, const Pro pro,
                                                  const Epi &epi)
{
    typedef kcu_g90_op<X> OPX;
    enum {
        BM = KCU_G90_BM,
        BK = OPX::BK,                        /* elements of a row a stage (128 bytes) */
        KT = (K + BK - 1) / BK,              /* k blocks */
        A_BYTES = BM * KCU_G90_ROW,          /* a stage's x tile */
        B_BYTES = BN * KCU_G90_ROW,          /* a stage's w tile */
        NBOX = Tiles::NBOX,                  /* its boxes */
        RB = BN / NBOX,                      /* rows a box */
        STAGE_BYTES = A_BYTES + B_BYTES,
        R = BN / 2,                          /* accumulators a consumer thread */
        CONSUMER_WARPS = 8,
        KSTEP = 32 / sizeof(X)               /* k a wgmma: 16 halves, 32 bytes */
    };
    static_assert(sizeof(X) * BK == KCU_G90_ROW && BK % KSTEP == 0, "128-byte rows of whole wgmma steps");
    static_assert((BN % 64 == 0 || BN == 224) && BN >= 64 && BN <= 256, "BN: 64, 128, 192, 224 or 256");
    static_assert(STAGES >= 2 && kcu_gemm90_smem(BN, STAGES) <= 232448 - 1024, "stages fit in shared memory");
    static_assert(BN % NBOX == 0 && RB % 8 == 0 && RB <= 256, "boxes of whole swizzle atoms");
    static_assert(CLUSTER == 1 || (CLUSTER == 2 && RB % 16 == 0), "a cluster's blocks load half boxes of whole atoms");
    extern __shared__ unsigned char kcu_g90_dyn[];
    __shared__ alignas(8) unsigned long long bars[2 * STAGES]; /* full[STAGES], empty[STAGES] */
    const unsigned base = (kcu_g90_smem(kcu_g90_dyn) + 1023u) & ~1023u;
    const unsigned sa = base, sb = base + STAGES * A_BYTES; /* x stages, then w stages */
    const unsigned full = kcu_g90_smem(bars), empty = full + 8 * STAGES;
    const int tid = threadIdx.x, wg = tid / 128, warp = tid / 32 % 4, lane = tid % 32;
    const kcu_g90_at at = kcu_g90_block_at<CLUSTER>();
    const int m0 = at.x * BM;
    const int rank = CLUSTER == 2 ? (int)blockIdx.x : 0; /* in the cluster (its blocks lie along x) */
    const int cg = wg - 1; /* a consumer's warpgroup (1, 2): tokens 64 cg ..+ 64 of the tile */
    /* a stage is refilled once every block it is filled into has released it */
    kcu_g90_ring_init<STAGES, CLUSTER>(ta, tb, full, empty, CONSUMER_WARPS * CLUSTER);
    if (wg == 0) {
        /* the producer */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (warp == 0 && lane == 0)
            kcu_g90_produce<K, BK, BN, STAGES, Tiles, CLUSTER>(ta, tb, sa, sb, full, empty, m0, at.y, 0, rank);
    } else {
        /* a consumer: tokens 64 cg .. +63 of the tile */
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
        typename OPX::acc d[R]; /* f32, or s32 for i8 */
#pragma unroll
        for (int i = 0; i < R; i++) d[i] = 0;
        const unsigned arow = (unsigned)cg * 64 * 128; /* the warpgroup's first x row in a stage */
        for (int kt = 0; kt < KT; kt++) {
            const int s = kt % STAGES;
            kcu_mbar_wait(full + 8 * s, (kt / STAGES) & 1);
            const unsigned long long da = kcu_wg_desc(sa + s * A_BYTES + arow), db = kcu_wg_desc(sb + s * B_BYTES);
            kcu_wg_fence();
#pragma unroll
            for (int kk = 0; kk < BK / KSTEP; kk++) kcu_g90_mma<BN, OPX::OP>(d, da + 2 * kk, db + 2 * kk);
            kcu_wg_commit();
            kcu_wg_wait<1>(); /* the previous stage's wgmma are done: release it */
            kcu_wg_hold(d);
            if (kt > 0 && lane == 0) {
                if (CLUSTER == 2) /* to both producers: each fills half of it */
                    for (int c = 0; c < 2; c++) kcu_mbar_arrive_cluster(empty + 8 * ((kt - 1) % STAGES), (unsigned)c);
                else
                    kcu_mbar_arrive(empty + 8 * ((kt - 1) % STAGES));
            }
        }
        kcu_wg_wait<0>();
        kcu_wg_hold(d);
        /* the sums through shared memory (the stages are free once both consumers' wgmma are done) */
        static_assert(KCU_G90_BM * KCU_G90_LD(BN) * 4 + 1024 <= kcu_gemm90_smem(BN, STAGES), "the tile fits");
        kcu_g90_consumers_sync();
        float *const tile = reinterpret_cast<float *>(kcu_g90_dyn + (base - kcu_g90_smem(kcu_g90_dyn)));
        const int rt = cg * 64 + warp * 16 + lane / 4; /* the thread's first row in the tile */
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                *reinterpret_cast<float2 *>(tile + (rt + 8 * h) * KCU_G90_LD(BN) + 8 * j + 2 * (lane % 4)) =
                    make_float2((float)d[4 * j + 2 * h], (float)d[4 * j + 2 * h + 1]);
        kcu_g90_consumers_sync();
        kcu_g90_handoff<BN, N, Tiles, KCU_G90_U>(epi, pro, T, m0, at.y, tile, cg * 128 + tid % 128, 256);
    }
    /* no block leaves while the other may still arrive on its barriers */
    if (CLUSTER > 1 && (wg > 0 || (warp == 0 && lane == 0))) kcu_cluster_sync();
}

#endif /* KCU_GEMM90 */
