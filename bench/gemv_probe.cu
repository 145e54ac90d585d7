// gemv_probe.cu — how a batch-1 matrix-vector product reaches HBM's copy rate on this GPU: the same
// 16-row tiles, warp K slices and 16-byte lane loads as kcu_matmul_tc (kcu_prelude.cuh), with the
// weights' loads in flight in registers (as kcu_matmul_tc today) or through a ring of shared memory
// filled by cp.async (bytes in flight that cost no registers), at the Llama-3-8B decode shapes, the
// weights rotated over copies bigger than L2 (a decode step reads each matrix once). A probe to choose
// the kernel's design by measurement (bench/RESULTS.md), not part of kiln: sums in FMA, not mma.
//
//   nvcc -O3 -arch=sm_90a -std=c++17 -o gemv_probe bench/gemv_probe.cu && ./gemv_probe
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(e)                                                                                     \
    do {                                                                                          \
        cudaError_t r_ = (e);                                                                     \
        if (r_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #e, cudaGetErrorString(r_));   \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

static __device__ __forceinline__ void dot8(float &acc, const uint4 &a, const uint4 &b)
{
    const __nv_bfloat162 *pa = reinterpret_cast<const __nv_bfloat162 *>(&a);
    const __nv_bfloat162 *pb = reinterpret_cast<const __nv_bfloat162 *>(&b);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 fa = __bfloat1622float2(pa[i]), fb = __bfloat1622float2(pb[i]);
        acc = fmaf(fa.x, fb.x, acc);
        acc = fmaf(fa.y, fb.y, acc);
    }
}

static __device__ __forceinline__ uint4 ld_stream(const void *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
static __device__ __forceinline__ void cp16(void *s, const void *g)
{
    unsigned a = (unsigned)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(a), "l"(g));
}
static __device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> static __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

// the tile's sums: lanes' partials of rows g, g + 8 over c (shuffles) then warps (shared memory, in order)
static __device__ __forceinline__ void tile_out(float a0, float a1, float *red, float *out, int tile)
{
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, c = lane % 4;
    a0 += __shfl_xor_sync(~0u, a0, 1), a0 += __shfl_xor_sync(~0u, a0, 2);
    a1 += __shfl_xor_sync(~0u, a1, 1), a1 += __shfl_xor_sync(~0u, a1, 2);
    __syncthreads();
    if (c == 0) red[warp * 16 + g] = a0, red[warp * 16 + g + 8] = a1;
    __syncthreads();
    if (tid < 16) {
        float s = 0;
        for (int w = 0; w < 8; w++) s += red[w * 16 + tid];
        out[tile * 16 + tid] = s;
    }
}

// registers: U chunks a step, two buffers (kcu_matmul_tc's way); block b: tiles b J .. b J + J - 1
template <int K, int U, int MINB>
__global__ void __launch_bounds__(256, MINB) gemv_regs(const __nv_bfloat16 *w, const __nv_bfloat16 *x, float *out,
                                                      int tiles, int J)
{
    enum { CW = K / 32 / 8, STEPS = CW / U };
    static_assert(CW % U == 0, "");
    extern __shared__ uint4 sm[];
    uint4 *xs = sm;
    float *red = reinterpret_cast<float *>(sm + K / 8);
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, c = lane % 4;
    for (int i = tid; i < K / 8; i += 256) xs[i] = reinterpret_cast<const uint4 *>(x)[i];
    __syncthreads();
    const int kw = warp * CW * 32 + 8 * c;
    for (int tile = blockIdx.x * J; tile < tiles && tile < (int)(blockIdx.x + 1) * J; tile++) {
        const __nv_bfloat16 *r0 = w + (long long)(tile * 16 + g) * K, *r1 = r0 + 8LL * K;
        uint4 wa[2][U], wb[2][U];
        auto load = [&](int s, uint4(&b)[2][U]) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int k = kw + 32 * (s * U + u);
                b[0][u] = ld_stream(r0 + k), b[1][u] = ld_stream(r1 + k);
            }
        };
        float a0 = 0, a1 = 0;
        auto step = [&](int s, const uint4(&b)[2][U]) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const uint4 xq = xs[(kw + 32 * (s * U + u)) / 8];
                dot8(a0, b[0][u], xq), dot8(a1, b[1][u], xq);
            }
        };
        load(0, wa);
#pragma unroll 1
        for (int s = 0; s < STEPS - 1; s += 2) {
            load(s + 1, wb);
            step(s, wa);
            if (s + 2 < STEPS) load(s + 2, wa);
            step(s + 1, wb);
        }
        if (STEPS % 2) step(STEPS - 1, wa);
        tile_out(a0, a1, red, out, tile);
    }
}

// a ring of D steps in shared memory, each thread's own slots (no barrier: a thread reads what it
// copied), one stream over the block's tiles: step gs's copies issued D - 1 steps ahead
template <int K, int U, int D, int MINB>
__global__ void __launch_bounds__(256, MINB) gemv_ring(const __nv_bfloat16 *w, const __nv_bfloat16 *x, float *out,
                                                      int tiles, int J)
{
    enum { CW = K / 32 / 8, STEPS = CW / U, SLOT = 2 * U * 256 };
    static_assert(CW % U == 0, "");
    extern __shared__ uint4 sm[];
    uint4 *xs = sm;
    float *red = reinterpret_cast<float *>(sm + K / 8);
    uint4 *ring = sm + K / 8 + 64; /* 1 kB after xs (red's 8 x 16 floats, 512 B, within): the host's K / 8 * 16 + 1024 */
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, c = lane % 4;
    const int t0 = blockIdx.x * J, nt = tiles - t0 < J ? tiles - t0 : J;
    if (nt <= 0) return;
    const int S = nt * STEPS, kw = warp * CW * 32 + 8 * c;
    auto issue = [&](int gs) {
        if (gs < S) {
            const int tile = t0 + gs / STEPS, s = gs % STEPS;
            const __nv_bfloat16 *r0 = w + (long long)(tile * 16 + g) * K, *r1 = r0 + 8LL * K;
            uint4 *slot = ring + (gs % D) * SLOT + tid;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int k = kw + 32 * (s * U + u);
                cp16(slot + (2 * u) * 256, r0 + k);
                cp16(slot + (2 * u + 1) * 256, r1 + k);
            }
        }
        cp_commit();
    };
#pragma unroll
    for (int i = 0; i < D - 1; i++) issue(i);
    for (int i = tid; i < K / 8; i += 256) xs[i] = reinterpret_cast<const uint4 *>(x)[i];
    __syncthreads();
    float a0 = 0, a1 = 0;
#pragma unroll 1
    for (int gs = 0; gs < S; gs++) {
        cp_wait<D - 2>();
        issue(gs + D - 1);
        const int s = gs % STEPS;
        const uint4 *slot = ring + (gs % D) * SLOT + tid;
#pragma unroll
        for (int u = 0; u < U; u++) {
            const uint4 xq = xs[(kw + 32 * (s * U + u)) / 8];
            dot8(a0, slot[(2 * u) * 256], xq), dot8(a1, slot[(2 * u + 1) * 256], xq);
        }
        if (s == STEPS - 1) {
            tile_out(a0, a1, red, out, t0 + gs / STEPS);
            a0 = a1 = 0;
        }
    }
}


static __device__ __forceinline__ unsigned sa(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
static __device__ __forceinline__ void mb_init(unsigned long long *b, int n)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(sa(b)), "r"(n));
}
static __device__ __forceinline__ void mb_expect(unsigned long long *b, int bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(b)), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void mb_arrive(unsigned long long *b)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(sa(b)) : "memory");
}
static __device__ __forceinline__ void mb_wait(unsigned long long *b, int parity)
{
    asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}" ::"r"(sa(b)),
                 "r"(parity)
                 : "memory");
}
static __device__ __forceinline__ void bulk(void *s, const void *g, int bytes, unsigned long long *b)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(sa(s)),
                 "l"(g), "r"(bytes), "r"(sa(b))
                 : "memory");
}

// the bulk copy engine (TMA, 1-D): a stage is the 16 rows' next KS elements (16 copies of 2 KS bytes,
// rows padded by 16 bytes: no bank conflicts), D stages; warp w sums its KS / 8 of each stage
template <int K, int KS, int D, int MINB>
__global__ void __launch_bounds__(256, MINB) gemv_bulk(const __nv_bfloat16 *w, const __nv_bfloat16 *x, float *out,
                                                      int tiles, int J)
{
    enum { STEPS = K / KS, PITCH = KS * 2 + 16, STAGE = 16 * PITCH, CPW = KS / 256 /* chunks a warp a stage */ };
    static_assert(K % KS == 0 && KS % 256 == 0, "");
    extern __shared__ __align__(128) uint4 sm[];
    unsigned long long *full = reinterpret_cast<unsigned long long *>(sm), *empty = full + D;
    uint4 *xs = sm + 2 * D / 2 + 8;
    float *red = reinterpret_cast<float *>(xs + K / 8);
    char *ring = reinterpret_cast<char *>(red + 128);
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, c = lane % 4;
    const int t0 = blockIdx.x * J, nt = tiles - t0 < J ? tiles - t0 : J;
    if (nt <= 0) return;
    const int S = nt * STEPS;
    if (tid == 0) {
        for (int i = 0; i < D; i++) mb_init(full + i, 1), mb_init(empty + i, 8);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    auto issue = [&](int gs) { /* by warp 0's lanes 0..15: a row each */
        const int tile = t0 + gs / STEPS, s = gs % STEPS, st = gs % D;
        if (lane == 0) mb_expect(full + st, 16 * KS * 2);
        __syncwarp();
        if (lane < 16)
            bulk(ring + st * STAGE + lane * PITCH, w + (long long)(tile * 16 + lane) * K + s * KS, KS * 2, full + st);
    };
    if (warp == 0)
        for (int i = 0; i < D && i < S; i++) issue(i);
    for (int i = tid; i < K / 8; i += 256) xs[i] = reinterpret_cast<const uint4 *>(x)[i];
    __syncthreads();
    float a0 = 0, a1 = 0;
#pragma unroll 1
    for (int gs = 0; gs < S; gs++) {
        const int st = gs % D, s = gs % STEPS, ph = (gs / D) & 1;
        mb_wait(full + st, ph);
        const char *base = ring + st * STAGE;
#pragma unroll
        for (int u = 0; u < CPW; u++) {
            const int kk = warp * (KS / 8) + 32 * u + 8 * c; /* within the stage */
            const uint4 xq = xs[(s * KS + kk) / 8];
            dot8(a0, *reinterpret_cast<const uint4 *>(base + g * PITCH + kk * 2), xq);
            dot8(a1, *reinterpret_cast<const uint4 *>(base + (g + 8) * PITCH + kk * 2), xq);
        }
        __syncwarp();
        if (lane == 0) mb_arrive(empty + st);
        if (warp == 0 && gs + D < S) { /* refill this stage once every warp has read it */
            mb_wait(empty + st, ph);
            issue(gs + D);
        }
        if (s == STEPS - 1) {
            tile_out(a0, a1, red, out, t0 + gs / STEPS);
            a0 = a1 = 0;
        }
    }
}

struct shape {
    const char *name;
    int N, K;
};

static float copy_rate(void *a, void *b, size_t n)
{
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e0));
    for (int i = 0; i < 10; i++) CK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return 2.0f * n * 10 / (ms * 1e-3f) / 1e12f; /* read + write, TB/s */
}

template <class F> static float time_us(F launch, int copies, int reps)
{
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < copies; i++) launch(i);
    CK(cudaDeviceSynchronize());
    CK(cudaEventRecord(e0));
    for (int r = 0; r < reps; r++) launch(r % copies);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    CK(cudaGetLastError());
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return ms * 1e3f / reps;
}

template <int K> static void run_shape(const shape &sh, int sms, float bw, __nv_bfloat16 *pool, size_t pool_elems,
                                       const __nv_bfloat16 *x, float *out)
{
    const size_t welems = (size_t)sh.N * K;
    const int copies = (int)(pool_elems / welems) < 64 ? (int)(pool_elems / welems) : 64;
    const int tiles = sh.N / 16;
    const double floor_us = welems * 2.0 / (bw * 1e12) * 1e6;
    auto report = [&](const char *how, float us) {
        printf("%-8s %-34s %8.1f us  floor %6.1f  %5.1f%% of copy\n", sh.name, how, us, floor_us, 100.0 * floor_us / us);
    };
    const int reps = 200;
    /* today's: 2 blocks an SM, J over two waves where there is a norm (here: as kcu_plan_gemv_tc with none) */
    {
        const int J = 1, grid = (tiles + J - 1) / J;
        const size_t smem = K / 8 * 16 + 1024;
        auto f = gemv_regs<K, 2, 2>;
        CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        report("regs U2, 2/SM, J 1", time_us([&](int i) { f<<<grid, 256, smem>>>(pool + i * welems, x, out, tiles, J); }, copies, reps));
        const int J2 = (tiles + 2 * sms - 1) / (2 * sms);
        report("regs U2, 2/SM, J waves", time_us([&](int i) { f<<<(tiles + J2 - 1) / J2, 256, smem>>>(pool + i * welems, x, out, tiles, J2); }, copies, reps));
    }
    auto ring = [&](auto f, int U, int D, int per_sm, const char *how) {
        const size_t smem = K / 8 * 16 + 1024 + (size_t)D * 2 * U * 256 * 16;
        CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        const int J = (tiles + per_sm * sms - 1) / (per_sm * sms), grid = (tiles + J - 1) / J;
        char buf[64];
        snprintf(buf, sizeof buf, "%s (%zu kB, J %d)", how, smem / 1024, J);
        report(buf, time_us([&](int i) { f<<<grid, 256, smem>>>(pool + i * welems, x, out, tiles, J); }, copies, reps));
    };
    ring(gemv_ring<K, 2, 4, 1>, 2, 4, 1, "ring U2 D4, 1/SM");
    ring(gemv_ring<K, 2, 8, 1>, 2, 8, 1, "ring U2 D8, 1/SM");
    ring(gemv_ring<K, 2, 12, 1>, 2, 12, 1, "ring U2 D12, 1/SM");
    ring(gemv_ring<K, 1, 16, 1>, 1, 16, 1, "ring U1 D16, 1/SM");
    ring(gemv_ring<K, 2, 4, 2>, 2, 4, 2, "ring U2 D4, 2/SM");
    ring(gemv_ring<K, 2, 6, 2>, 2, 6, 2, "ring U2 D6, 2/SM");
    ring(gemv_ring<K, 1, 6, 2>, 1, 6, 2, "ring U1 D6, 2/SM");
    auto blk = [&](auto f, int KS, int D, int per_sm, const char *how) {
        const size_t smem = 16 * (D + 8) + K / 8 * 16 + 512 + (size_t)D * 16 * (KS * 2 + 16);
        CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        const int J = (tiles + per_sm * sms - 1) / (per_sm * sms), grid = (tiles + J - 1) / J;
        char buf[64];
        snprintf(buf, sizeof buf, "%s (%zu kB, J %d)", how, smem / 1024, J);
        report(buf, time_us([&](int i) { f<<<grid, 256, smem>>>(pool + i * welems, x, out, tiles, J); }, copies, reps));
    };
    blk(gemv_bulk<K, 512, 6, 1>, 512, 6, 1, "bulk KS512 D6, 1/SM");
    blk(gemv_bulk<K, 512, 10, 1>, 512, 10, 1, "bulk KS512 D10, 1/SM");
    blk(gemv_bulk<K, 1024, 5, 1>, 1024, 5, 1, "bulk KS1024 D5, 1/SM");
    blk(gemv_bulk<K, 512, 5, 2>, 512, 5, 2, "bulk KS512 D5, 2/SM");
}

int main()
{
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const size_t pool_bytes = (size_t)3 << 30; /* 3 GiB of weights: every shape rotated past L2 */
    __nv_bfloat16 *pool, *x;
    float *out;
    CK(cudaMalloc(&pool, pool_bytes));
    CK(cudaMemset(pool, 0x3c, pool_bytes));
    CK(cudaMalloc(&x, 14336 * 2));
    CK(cudaMemset(x, 0x3c, 14336 * 2));
    CK(cudaMalloc(&out, 128256 * 4));
    const float bw = copy_rate(pool, (char *)pool + pool_bytes / 2, pool_bytes / 4);
    printf("%s, %d SMs: device copy %.2f TB/s (read + write)\n", prop.name, sms, bw);
    const size_t pe = pool_bytes / 2;
    run_shape<4096>({"qkv", 6144, 4096}, sms, bw, pool, pe, x, out);
    run_shape<4096>({"o", 4096, 4096}, sms, bw, pool, pe, x, out);
    run_shape<4096>({"gate/up", 28672, 4096}, sms, bw, pool, pe, x, out);
    run_shape<14336>({"down", 4096, 14336}, sms, bw, pool, pe, x, out);
    run_shape<4096>({"lm_head", 128256, 4096}, sms, bw, pool, pe, x, out);
    return 0;
}
