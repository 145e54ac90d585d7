/*
 * kcu_flash.cuh — causal attention for prefill on tensor cores (FlashAttention-2's
 * design), over the paged KV cache. Embedded after kcu_prelude.cuh (whose element
 * types, kcu_f, kcu_bits and kcu_syncwarp it uses) into every generated source;
 * kcu_emit_attention.c launches it as the `_large` variant of an attention kernel
 * (steps of many tokens) when use_flash_prefill says so. Its design, cost and
 * limits are described there.
 *
 * Needs sm_80 (mma.sync m16n8k16 with bf16 or f16 inputs, ldmatrix, cp.async); the
 * CPU emulator (g++ with tests/cuda/emu_shim.h) runs every warp instruction here
 * element by element, in the PTX ISA's fragment layouts.
 */

/* ---- 16-bit values ------------------------------------------------------------------ */
/* f32 to bfloat16 / binary16 bits, rounded to nearest even (NaN stays NaN). */
__device__ __forceinline__ unsigned short kcu_to_bf16(float f)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#else
    const unsigned u = kcu_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
}
__device__ __forceinline__ unsigned short kcu_to_f16(float f)
{
#if defined(__CUDA_ARCH__)
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#elif !defined(__CUDACC__)
    const _Float16 v = (_Float16)f; /* g++ rounds to nearest even */
    unsigned short h;
    memcpy(&h, &v, sizeof h);
    return h;
#else
    return (unsigned short)f; /* nvcc's host pass: never runs */
#endif
}

/* kcu_fa_h<MT>: the tensor cores' input type MT (kcu_bf16 or kcu_f16): a float's bits in it */
template <typename MT> struct kcu_fa_h;
template <> struct kcu_fa_h<kcu_bf16> {
    enum { F16 = 0 };
    static __device__ __forceinline__ unsigned short of(float f) { return kcu_to_bf16(f); }
    static __device__ __forceinline__ float val(unsigned short h) { return __uint_as_float((unsigned)h << 16); }
};
template <> struct kcu_fa_h<kcu_f16> {
    enum { F16 = 1 };
    static __device__ __forceinline__ unsigned short of(float f) { return kcu_to_f16(f); }
    static __device__ __forceinline__ float val(unsigned short h) { return kcu_half_bits(h); }
};
/* an element of type E (float, kcu_bf16, kcu_f16) as MT bits: kept when E is MT, else rounded */
template <typename MT, typename E> struct kcu_fa_cvt {
    static __device__ __forceinline__ unsigned short bits(E v) { return kcu_fa_h<MT>::of(kcu_f(v)); }
};
template <typename MT> struct kcu_fa_cvt<MT, MT> {
    static __device__ __forceinline__ unsigned short bits(MT v) { return v.bits; }
};
/* (kcu_same<A, B>::V: kcu_prelude.cuh) */
/* an f32 result stored as O */
__device__ __forceinline__ void kcu_fa_store(float *p, float v) { *p = v; }
__device__ __forceinline__ void kcu_fa_store(kcu_bf16 *p, float v) { p->bits = kcu_to_bf16(v); }
__device__ __forceinline__ void kcu_fa_store(kcu_f16 *p, float v) { p->bits = kcu_to_f16(v); }

/* ---- warp instructions -------------------------------------------------------------- */
/* d += a b, one m16n8k16 tile, MT inputs, f32 accumulators; fragments as kcu_mma_frag
 * (kcu_prelude.cuh) lays them out: a[0..3] the A fragment, b0 and b1 the B fragment. */
template <typename MT>
__device__ __forceinline__ void kcu_fa_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (kcu_fa_h<MT>::F16)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#elif defined(KILN_EMU_SHIM_H)
    /* The emulator: each lane publishes its fragments and gathers the rows of A and columns
     * of B its four outputs need from the lanes that hold them in the PTX layout; products
     * exact in f32, summed over k in order, then added. */
    struct frag {
        unsigned a[4], b[2];
    };
    const frag mine = {{a[0], a[1], a[2], a[3]}, {b0, b1}};
    const frag *wp = kemu_warp_publish(mine);
    const int lane = threadIdx.x & 31, g = lane / 4, c = lane % 4;
    for (int e = 0; e < 4; e++) {
        const int r = g + 8 * (e >> 1), n = 2 * c + (e & 1);
        float s = 0.0f;
        for (int k = 0; k < 16; k++) {
            const unsigned wa = wp[(r & 7) * 4 + (k & 7) / 2].a[(r >> 3) + 2 * (k >> 3)];
            const unsigned wb = wp[n * 4 + (k & 7) / 2].b[k >> 3];
            s += kcu_fa_h<MT>::val((unsigned short)(k & 1 ? wa >> 16 : wa)) *
                 kcu_fa_h<MT>::val((unsigned short)(k & 1 ? wb >> 16 : wb));
        }
        d[e] += s;
    }
#endif
}

/* The shared-memory address of p. */
__device__ __forceinline__ unsigned kcu_fa_smem(const void *p)
{
#if defined(__CUDA_ARCH__)
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
#else
    return (unsigned)(unsigned long long)p;
#endif
}

/* ldmatrix.x4 (.trans when TRANS) of 16-bit elements from shared memory: lane l gives in p
 * the address of row l % 8 of matrix l / 8 (8 consecutive elements, 16-byte aligned); lane
 * (g, c) = (l / 4, l % 4) receives in r[i] elements 2c, 2c + 1 of row g of matrix i, or with
 * TRANS elements g of rows 2c, 2c + 1 (the lower in the low half). */
template <bool TRANS> __device__ __forceinline__ void kcu_fa_ldmatrix(unsigned (&r)[4], const unsigned short *p)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned a = kcu_fa_smem(p);
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
#elif defined(KILN_EMU_SHIM_H)
    const unsigned short *const *rows = kemu_warp_publish(p);
    const int lane = threadIdx.x & 31, g = lane / 4, c = lane % 4;
    for (int i = 0; i < 4; i++) {
        unsigned lo, hi;
        if (TRANS)
            lo = rows[i * 8 + 2 * c][g], hi = rows[i * 8 + 2 * c + 1][g];
        else
            lo = rows[i * 8 + g][2 * c], hi = rows[i * 8 + g][2 * c + 1];
        r[i] = lo | hi << 16;
    }
#endif
}

/* cp.async of 16 bytes from global src to shared dst (both 16-byte aligned), or 16 zero
 * bytes when !valid (src is then not read); the group's copies land after kcu_fa_wait and
 * are visible to the block after the next __syncthreads. The emulator copies at once. */
__device__ __forceinline__ void kcu_fa_cp16(void *dst, const void *src, bool valid)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(kcu_fa_smem(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
#else
    if (valid)
        memcpy(dst, src, 16);
    else
        memset(dst, 0, 16);
#endif
}
__device__ __forceinline__ void kcu_fa_commit()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;");
#endif
}
/* wait until at most N of this thread's committed groups are in flight */
template <int N> __device__ __forceinline__ void kcu_fa_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
#endif
}

/* whether any lane of the warp has c (the emulator: always 1, so that every thread of a block
 * reaches the emulated warp instructions, block barriers there, alike) */
__device__ __forceinline__ bool kcu_fa_any(bool c)
{
#ifdef KILN_EMU_SHIM_H
    return (void)c, true;
#else
    return __any_sync(0xffffffffu, c);
#endif
}

/* ---- K and V tiles --------------------------------------------------------------------- */
/* Rows of positions [p0, p0 + BN) of a sequence (slots through table) of one kv head's D
 * elements (base: the cache at the head, row stride KH * D) into dst (BN rows of STRIDE MT
 * elements, dims D.. left alone), as MT; positions past hi are zeros. The block's NT
 * threads share the work: 16-byte cp.async copies when the cache holds MT and rows are whole
 * chunks of 8; else loads converted on the way (4 at a time when D % 4 == 0). */
template <typename MT, typename KV, int KH, int D, int STRIDE, int BN, int NT>
static __device__ __forceinline__ void kcu_fa_tile(unsigned short *__restrict__ dst, const KV *__restrict__ base,
                                                   const int *__restrict__ table, const int block_size, const int p0,
                                                   const int hi)
{
    const int tid = threadIdx.x;
    if constexpr (kcu_same<KV, MT>::V && D % 8 == 0) {
        enum { CH = D / 8 };
        for (int i = tid; i < BN * CH; i += NT) {
            const int r = i / CH, ch = i % CH, p = p0 + r;
            const bool valid = p <= hi;
            const long long slot = valid ? (long long)table[p / block_size] * block_size + p % block_size : 0;
            kcu_fa_cp16(dst + r * STRIDE + ch * 8, base + slot * (KH * D) + ch * 8, valid);
        }
    } else if constexpr (D % 4 == 0) {
        enum { CH = D / 4 };
        for (int i = tid; i < BN * CH; i += NT) {
            const int r = i / CH, ch = i % CH, p = p0 + r;
            unsigned w0 = 0, w1 = 0;
            if (p <= hi) {
                const long long slot = (long long)table[p / block_size] * block_size + p % block_size;
                const KV *s = base + slot * (KH * D) + ch * 4;
                unsigned short h[4];
                if constexpr (kcu_same<KV, float>::V) {
                    const float4 v = __ldg(reinterpret_cast<const float4 *>(s));
                    h[0] = kcu_fa_h<MT>::of(v.x), h[1] = kcu_fa_h<MT>::of(v.y);
                    h[2] = kcu_fa_h<MT>::of(v.z), h[3] = kcu_fa_h<MT>::of(v.w);
                } else {
#pragma unroll
                    for (int e = 0; e < 4; e++) h[e] = kcu_fa_cvt<MT, KV>::bits(s[e]);
                }
                w0 = h[0] | (unsigned)h[1] << 16, w1 = h[2] | (unsigned)h[3] << 16;
            }
            unsigned *o = reinterpret_cast<unsigned *>(dst + r * STRIDE + ch * 4);
            o[0] = w0, o[1] = w1;
        }
    } else {
        for (int i = tid; i < BN * D; i += NT) {
            const int r = i / D, e = i % D, p = p0 + r;
            unsigned short h = 0;
            if (p <= hi) {
                const long long slot = (long long)table[p / block_size] * block_size + p % block_size;
                h = kcu_fa_cvt<MT, KV>::bits(base[slot * (KH * D) + e]);
            }
            dst[r * STRIDE + e] = h;
        }
    }
}

/*
 * kcu_flash_attention: causal attention of tokens [t0, t0 + BT) (BT = 16 MW TW) for HB q
 * heads of one kv head, over the paged cache: block (blockIdx.x, blockIdx.y) of a grid
 * [ceil(T / BT), H / HB], HB * TW warps (warp w: head w % HB of the block's, tokens
 * 16 MW (w / HB) ..+ 16 MW of its tile, MW m16 tiles). Token t attends to positions [lo, pos]
 * of its sequence (positions[t], lo from WINDOW; its block table at tables + table_off[t]);
 * the tile's tokens may come from several sequences in any order: the block takes each
 * sequence of its tile in turn (a segment), over the positions its tokens need, masking the
 * others. Shapes: q [T, H, DK], kc [slots, KH, DK], vc [slots, KH, DV], out [T, H, DV]; MT
 * the tensor cores' input type; BN positions a K/V tile.
 */
template <typename MT, typename Q, typename KV, typename O, int H, int KH, int DK, int DV, int HB, int TW, int MW,
          int BN, int WINDOW>
static __device__ __forceinline__ void kcu_flash_attention(const int T, const Q *__restrict__ q,
                                                           const KV *__restrict__ kc, const KV *__restrict__ vc,
                                                           O *__restrict__ out, const int *__restrict__ positions,
                                                           const int *__restrict__ table_off,
                                                           const int *__restrict__ tables, const int block_size,
                                                           const float scale, const float softcap)
{
#if KCU_MMA
    enum {
        GROUP = H / KH,
        NW = HB * TW,                /* warps */
        NT = 32 * NW,                /* threads */
        WT = 16 * MW,                /* tokens a warp */
        BT = WT * TW,                /* tokens a block */
        R = 2 * MW,                  /* rows a lane holds: g and g + 8 of each m16 tile */
        DKP = (DK + 15) / 16 * 16,   /* DK padded to the mma's k */
        DVP = (DV + 15) / 16 * 16,   /* DV padded to pairs of 8-column tiles */
        KS = DKP + 8,                /* row strides in shared memory, elements: 16 bytes of padding put */
        VS = DVP + 8,                /*   ldmatrix's 8 rows in different banks */
        KC = DKP / 16,               /* k16 slices of q k */
        NB = BN / 8,                 /* 8-position column tiles of the scores */
        VN = DVP / 8                 /* 8-column tiles of the output */
    };
    static_assert(H % KH == 0 && GROUP % HB == 0 && BN % 16 == 0 && (MW == 1 || MW == 2),
                  "kcu_flash_attention: shapes");
    __shared__ uint4 ks4[BN * KS / 8], vs4[BN * VS / 8]; /* the K and V tiles, MT bits (uint4: 16-byte aligned) */
    unsigned short *const ks = reinterpret_cast<unsigned short *>(ks4), *const vs = reinterpret_cast<unsigned short *>(vs4);
    __shared__ int rpos[BT], rlo[BT], rseq[BT];        /* each token's position, first position, table (-1: none) */
    __shared__ int rfirst[BT];                         /* 1: the first token of its sequence in the tile */
    const float ninf = -__int_as_float(0x7f800000);
    const float log2e = 1.4426950408889634f;
    const int tiles = (T + BT - 1) / BT;
    const int t0 = (tiles - 1 - (int)blockIdx.x) * BT; /* the last tokens (the longest rows, in a prompt) first */
    if (t0 < 0) return;                                 /* a grid larger than the step's (not kiln's) */
    const int hb = blockIdx.y, kh = hb * HB / GROUP;
    const int tid = threadIdx.x, w = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
    const int head = hb * HB + w % HB, tw = w / HB;

    if (tid < BT) {
        const int t = t0 + tid;
        const int p = t < T ? positions[t] : -1;
        rpos[tid] = p;
        rlo[tid] = WINDOW > 0 && p - WINDOW + 1 > 0 ? p - WINDOW + 1 : 0;
        rseq[tid] = t < T ? table_off[t] : -1;
    }
    /* the padding dims are zeros, as q's */
    if constexpr (DKP > DK)
        for (int i = tid; i < BN * (DKP - DK); i += NT) ks[i / (DKP - DK) * KS + DK + i % (DKP - DK)] = 0;
    if constexpr (DVP > DV)
        for (int i = tid; i < BN * (DVP - DV); i += NT) vs[i / (DVP - DV) * VS + DV + i % (DVP - DV)] = 0;
    __syncthreads();
    if (tid < BT) {
        int f = rseq[tid] >= 0;
        for (int u = 0; u < tid && f; u++) f = rseq[u] != rseq[tid];
        rfirst[tid] = f;
    }

    /* q as A fragments (m16 tile mi: the warp's tokens 16 mi ..; zeros past T and DK) */
    unsigned qa[MW][KC][4];
#pragma unroll
    for (int mi = 0; mi < MW; mi++)
#pragma unroll
        for (int kk = 0; kk < KC; kk++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int t = t0 + tw * WT + mi * 16 + g + 8 * (i & 1), d = kk * 16 + 2 * c + 8 * (i >> 1);
                const Q *row = q + ((long long)t * H + head) * DK;
                const unsigned lo = t < T && d < DK ? kcu_fa_cvt<MT, Q>::bits(row[d]) : 0u;
                const unsigned hi = t < T && d + 1 < DK ? kcu_fa_cvt<MT, Q>::bits(row[d + 1]) : 0u;
                qa[mi][kk][i] = lo | hi << 16;
            }
    __syncthreads();
    /* the lane's rows: x = 2 mi + i is token 16 mi + g + 8 i of the warp's */
    int rp[R], rl[R], rs[R];
#pragma unroll
    for (int x = 0; x < R; x++) {
        const int r = tw * WT + (x / 2) * 16 + g + 8 * (x % 2);
        rp[x] = rpos[r], rl[x] = rlo[r], rs[x] = rseq[r];
    }
    float m[R], l[R];  /* each row's running maximum (log2 units), the lane's part of its sum of exponentials */
    float o[MW][VN][4]; /* the output accumulators, C layout */
#pragma unroll
    for (int x = 0; x < R; x++) m[x] = ninf, l[x] = 0.0f;
#pragma unroll
    for (int mi = 0; mi < MW; mi++)
#pragma unroll
        for (int j = 0; j < VN; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[mi][j][e] = 0.0f;

    for (int r0 = 0; r0 < BT; r0++) {
        if (!rfirst[r0]) continue;
        /* a segment: the tile's tokens of one sequence, over positions [klo, khi] */
        const int seq = rseq[r0];
        int klo = rlo[r0], khi = rpos[r0];
        for (int u = r0 + 1; u < BT; u++)
            if (rseq[u] == seq) klo = rlo[u] < klo ? rlo[u] : klo, khi = rpos[u] > khi ? rpos[u] : khi;
        const int *table = tables + seq;
        const int n_tiles = (khi - klo + BN) / BN;
        const KV *kbase = kc + (long long)kh * DK, *vbase = vc + (long long)kh * DV;
        kcu_fa_tile<MT, KV, KH, DK, KS, BN, NT>(ks, kbase, table, block_size, klo, khi);
        kcu_fa_commit();
        for (int it = 0; it < n_tiles; it++) {
            const int p0 = klo + it * BN;
            kcu_fa_tile<MT, KV, KH, DV, VS, BN, NT>(vs, vbase, table, block_size, p0, khi);
            kcu_fa_commit();
            kcu_fa_wait<1>(); /* K */
            __syncthreads();
            bool live = false;
#pragma unroll
            for (int x = 0; x < R; x++) live = live || (rs[x] == seq && rl[x] <= p0 + BN - 1 && rp[x] >= p0);
            const bool active = kcu_fa_any(live); /* the warp has a score here */
            unsigned pa[MW][BN / 16][4];          /* the probabilities as A fragments */
            if (active) {
                float s[MW][NB][4];
#pragma unroll
                for (int mi = 0; mi < MW; mi++)
#pragma unroll
                    for (int j = 0; j < NB; j++)
#pragma unroll
                        for (int e = 0; e < 4; e++) s[mi][j][e] = 0.0f;
                /* s = q k^T: K rows as B fragments, two 8-position tiles an ldmatrix, for each m16 tile */
#pragma unroll
                for (int kk = 0; kk < KC; kk++)
#pragma unroll
                    for (int j = 0; j < NB; j += 2) {
                        unsigned b[4];
                        kcu_fa_ldmatrix<false>(b, ks + (j * 8 + (lane / 16) * 8 + lane % 8) * KS + kk * 16 +
                                                      ((lane / 8) % 2) * 8);
#pragma unroll
                        for (int mi = 0; mi < MW; mi++) {
                            kcu_fa_mma<MT>(s[mi][j], qa[mi][kk], b[0], b[1]);
                            kcu_fa_mma<MT>(s[mi][j + 1], qa[mi][kk], b[2], b[3]);
                        }
                    }
                /* scale, softcap, mask; in log2 units */
                float mx[R];
#pragma unroll
                for (int x = 0; x < R; x++) mx[x] = ninf;
#pragma unroll
                for (int mi = 0; mi < MW; mi++)
#pragma unroll
                    for (int j = 0; j < NB; j++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int x = 2 * mi + (e >> 1), p = p0 + j * 8 + 2 * c + (e & 1);
                            float v = s[mi][j][e] * scale;
                            if (softcap > 0.0f) v = softcap * tanhf(v / softcap);
                            v = rs[x] == seq && p >= rl[x] && p <= rp[x] ? v * log2e : ninf;
                            s[mi][j][e] = v;
                            mx[x] = fmaxf(mx[x], v);
                        }
                /* online softmax: the rows' maxima over their 4 lanes, rescale, exponentials */
#pragma unroll
                for (int x = 0; x < R; x++) {
                    const int mi = x / 2, i = x % 2;
                    mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 1));
                    mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 2));
                    const float mn = fmaxf(m[x], mx[x]), mu = mn == ninf ? 0.0f : mn;
                    const float alpha = exp2f(m[x] - mu);
                    m[x] = mn;
                    l[x] *= alpha;
#pragma unroll
                    for (int j = 0; j < VN; j++) o[mi][j][2 * i] *= alpha, o[mi][j][2 * i + 1] *= alpha;
#pragma unroll
                    for (int j = 0; j < NB; j++) {
                        s[mi][j][2 * i] = exp2f(s[mi][j][2 * i] - mu);
                        s[mi][j][2 * i + 1] = exp2f(s[mi][j][2 * i + 1] - mu);
                        l[x] += s[mi][j][2 * i] + s[mi][j][2 * i + 1];
                    }
                }
                /* P in MT: the C fragments of tiles 2kk, 2kk + 1 are the A fragment of k slice kk */
#pragma unroll
                for (int mi = 0; mi < MW; mi++)
#pragma unroll
                    for (int kk = 0; kk < BN / 16; kk++)
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            const float *sv = s[mi][2 * kk + (i >> 1)] + 2 * (i & 1);
                            pa[mi][kk][i] = kcu_fa_h<MT>::of(sv[0]) | (unsigned)kcu_fa_h<MT>::of(sv[1]) << 16;
                        }
            }
            __syncthreads(); /* every warp is done with the K tile */
            if (it + 1 < n_tiles) {
                kcu_fa_tile<MT, KV, KH, DK, KS, BN, NT>(ks, kbase, table, block_size, p0 + BN, khi);
                kcu_fa_commit();
                kcu_fa_wait<1>(); /* V */
            } else {
                kcu_fa_wait<0>();
            }
            __syncthreads();
            if (active) {
                /* o += p v: V rows as B fragments (transposed), two 8-column tiles an ldmatrix */
#pragma unroll
                for (int kk = 0; kk < BN / 16; kk++)
#pragma unroll
                    for (int j = 0; j < VN; j += 2) {
                        unsigned b[4];
                        kcu_fa_ldmatrix<true>(b, vs + (kk * 16 + ((lane / 8) % 2) * 8 + lane % 8) * VS + j * 8 +
                                                     (lane / 16) * 8);
#pragma unroll
                        for (int mi = 0; mi < MW; mi++) {
                            kcu_fa_mma<MT>(o[mi][j], pa[mi][kk], b[0], b[1]);
                            kcu_fa_mma<MT>(o[mi][j + 1], pa[mi][kk], b[2], b[3]);
                        }
                    }
            }
            __syncthreads(); /* every warp is done with the V tile */
        }
    }

    /* out = o / l: the rows' sums over their 4 lanes */
#pragma unroll
    for (int x = 0; x < R; x++) {
        const int mi = x / 2, i = x % 2;
        l[x] += __shfl_xor_sync(0xffffffffu, l[x], 1);
        l[x] += __shfl_xor_sync(0xffffffffu, l[x], 2);
        const int t = t0 + tw * WT + mi * 16 + g + 8 * i;
        if (t >= T) continue;
        const float inv = l[x] > 0.0f ? 1.0f / l[x] : 0.0f;
        O *row = out + ((long long)t * H + head) * DV;
#pragma unroll
        for (int j = 0; j < VN; j++) {
            const int d = j * 8 + 2 * c;
            if (d < DV) kcu_fa_store(row + d, o[mi][j][2 * i] * inv);
            if (d + 1 < DV) kcu_fa_store(row + d + 1, o[mi][j][2 * i + 1] * inv);
        }
    }
#else
    (void)T, (void)q, (void)kc, (void)vc, (void)out, (void)positions, (void)table_off, (void)tables;
    (void)block_size, (void)scale, (void)softcap;
    __trap(); /* before sm_80: kcu_emit_attention does not launch it there */
#endif
}
