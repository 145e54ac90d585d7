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

/* 2^x; subnormal results flushed to zero on a GPU (ex2.approx.ftz: one instruction, where exp2f
 * takes four to keep them: a probability below 2^-126 changes no sum) */
__device__ __forceinline__ float kcu_fa_exp2(float x)
{
#if defined(__CUDA_ARCH__)
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    return exp2f(x);
#endif
}

/* The online softmax's step for one row of an m16 fragment, whose columns the 4 lanes of a quad hold:
 * mx, this lane's maximum of the row's new scores, becomes the quad's; m, the row's running maximum,
 * grows to it and l, its running sum, is rescaled. Returns alpha, the old state's factor (1 when the
 * maximum stays, 0 from none), and sets mf, the new maximum in log2 units (0 for a row with no score
 * yet) that the step's exponentials subtract (kcu_flash_attention, kcu_flash90, kcu_flash_decode). */
__device__ __forceinline__ float kcu_fa_rescale(float &m, float &l, float mx, const float fac, float &mf)
{
    const float ninf = -__int_as_float(0x7f800000);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mn = fmaxf(m, mx);
    mf = (mn == ninf ? 0.0f : mn) * fac;
    const float alpha = kcu_fa_exp2(m * fac - mf);
    m = mn;
    l *= alpha;
    return alpha;
}

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

/* A shared-memory address that ldmatrix reads: a 32-bit shared-space byte address on a GPU (one
 * register, and a constant added to it is folded into the instruction), a pointer in the emulator. */
#if defined(__CUDA_ARCH__)
typedef unsigned kcu_fa_sptr;
#else
typedef const char *kcu_fa_sptr;
#endif
__device__ __forceinline__ kcu_fa_sptr kcu_fa_sp(const void *p)
{
#if defined(__CUDA_ARCH__)
    return kcu_fa_smem(p);
#else
    return (kcu_fa_sptr)p;
#endif
}

/* ldmatrix.x4 (.trans when TRANS) of 16-bit elements from shared memory: lane l gives in a the
 * address of row l % 8 of matrix l / 8 (8 consecutive elements, 16-byte aligned); lane (g, c) =
 * (l / 4, l % 4) receives in r[i] elements 2c, 2c + 1 of row g of matrix i, or with TRANS elements
 * g of rows 2c, 2c + 1 (the lower in the low half). */
template <bool TRANS> __device__ __forceinline__ void kcu_fa_ldmatrix(unsigned (&r)[4], const kcu_fa_sptr a)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
#elif defined(KILN_EMU_SHIM_H)
    const unsigned short *const *rows = kemu_warp_publish(reinterpret_cast<const unsigned short *>(a));
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

/* whether every lane of the warp has c; every thread of the block calls it together (the
 * emulator gathers the warp's lanes as a shuffle does) */
__device__ __forceinline__ bool kcu_fa_all(bool c)
{
#ifdef KILN_EMU_SHIM_H
    const bool *lanes = kemu_warp_publish(c);
    bool all = true;
    for (int i = 0; i < 32; i++) all = all && lanes[i];
    return all;
#else
    return __all_sync(0xffffffffu, c);
#endif
}

/* lo and hi as MT bits, rounded to nearest even, lo in the low half (one cvt on sm_80) */
template <typename MT> __device__ __forceinline__ unsigned kcu_fa_pack(float lo, float hi)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned r;
    if (kcu_fa_h<MT>::F16)
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    else
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return kcu_fa_h<MT>::of(lo) | (unsigned)kcu_fa_h<MT>::of(hi) << 16;
#endif
}

/* ---- tiles in shared memory ------------------------------------------------------------ */
/* kcu_fa_rows<DP>: the layout of a tile of rows of DP 16-bit elements (DP a multiple of 16) in
 * shared memory, in 16-byte chunks of 8 elements: ldmatrix reads one chunk of 8 consecutive
 * rows, which must fall in 8 different bank groups. Rows of a multiple of 8 chunks are packed,
 * chunk ch of row r stored at chunk ch ^ (r % 8) (an XOR swizzle: no padding, so q, K and V
 * of head_dim 128 fit in 96 KiB); other rows are padded by one chunk (an odd number of chunks
 * a row: 8 consecutive rows start in different bank groups). */
template <int DP> struct kcu_fa_rows {
    enum {
        CH = DP / 8,                  /* chunks a row */
        SWZ = CH % 8 == 0,            /* 1: swizzled; 0: padded */
        STRIDE = SWZ ? DP : DP + 8    /* elements from a row to the next */
    };
    /* the element offset of chunk ch of row r */
    static __device__ __forceinline__ int at(int r, int ch) { return r * STRIDE + 8 * (SWZ ? ch ^ (r & 7) : ch); }
    /* A lane's ldmatrix addresses: row r (r % 8 == lane % 8), chunk 2 kk + odd is at element
     * r STRIDE + lane_chunk(kk % 4, ...) + 64 (kk / 4): the swizzle only permutes the low 3 bits of
     * the chunk, so four addresses a lane serve every k slice, the rest being constants. */
    static __device__ __forceinline__ int lane_chunk(const int k4, const int odd, const int lane)
    {
        return 8 * (SWZ ? (2 * k4 + odd) ^ (lane & 7) : 2 * k4 + odd);
    }
};

/* Chunk ch (elements 8 ch ..+ 8) of a row of D elements of type E into dst (16-byte aligned), as
 * MT bits; src is the chunk's first element (a global address; read only when valid), and
 * elements past D or of an invalid row are zeros. A 16-byte cp.async when E is MT and rows are
 * whole chunks (lands after kcu_fa_wait); else loads converted on the way (float4 loads of an
 * f32 row when D % 4 == 0; 8 codes of a cache of codes in one 8-byte load, times the row's scale
 * sc), stored at once. */
template <typename MT, typename E, int D>
static __device__ __forceinline__ void kcu_fa_chunk(unsigned short *dst, const E *src, const int ch, const bool valid,
                                                    const float sc = 1.0f)
{
    if constexpr (kcu_kv_codes<E>::V) { /* a cache of codes: each code times its row's scale sc, rounded to MT */
        unsigned short h[8];
        if constexpr (D % 8 == 0) {
            kcu_kv_u2 u = {0u, 0u};
            if (valid && 8 * ch < D) u = *reinterpret_cast<const kcu_kv_u2 *>(src);
#pragma unroll
            for (int e = 0; e < 8; e++)
                h[e] = kcu_fa_h<MT>::of(kcu_kv_codes<E>::value(((e < 4 ? u.x : u.y) >> (8 * (e % 4))) & 255u) * sc);
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++)
                h[e] = valid && 8 * ch + e < D ? kcu_fa_h<MT>::of(kcu_kv_codes<E>::value(src[e].c) * sc) : 0;
        }
        uint4 w;
        w.x = h[0] | (unsigned)h[1] << 16, w.y = h[2] | (unsigned)h[3] << 16;
        w.z = h[4] | (unsigned)h[5] << 16, w.w = h[6] | (unsigned)h[7] << 16;
        *reinterpret_cast<uint4 *>(dst) = w;
    } else if constexpr (kcu_same<E, MT>::V && D % 8 == 0) {
        kcu_fa_cp16(dst, src, valid && 8 * ch < D);
    } else {
        unsigned short h[8];
        if constexpr (kcu_same<E, float>::V && D % 4 == 0) {
#pragma unroll
            for (int half = 0; half < 2; half++) {
                float4 v = {0.0f, 0.0f, 0.0f, 0.0f};
                if (valid && 8 * ch + 4 * half < D) v = __ldg(reinterpret_cast<const float4 *>(src) + half);
                h[4 * half] = kcu_fa_h<MT>::of(v.x), h[4 * half + 1] = kcu_fa_h<MT>::of(v.y);
                h[4 * half + 2] = kcu_fa_h<MT>::of(v.z), h[4 * half + 3] = kcu_fa_h<MT>::of(v.w);
            }
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) h[e] = valid && 8 * ch + e < D ? kcu_fa_cvt<MT, E>::bits(src[e]) : 0;
        }
        uint4 w;
        w.x = h[0] | (unsigned)h[1] << 16, w.y = h[2] | (unsigned)h[3] << 16;
        w.z = h[4] | (unsigned)h[5] << 16, w.w = h[6] | (unsigned)h[7] << 16;
        *reinterpret_cast<uint4 *>(dst) = w;
    }
}

/* The cache slot of position p through a sequence's block table: shifts when the block size is a
 * power of two (bsh = its log2; kiln's are), else a division (bsh < 0). */
__device__ __forceinline__ long long kcu_fa_slot(const int *__restrict__ table, const int block_size, const int bsh,
                                                 const int p)
{
    if (bsh >= 0) return (long long)table[p >> bsh] << bsh | (p & (block_size - 1));
    return (long long)table[p / block_size] * block_size + p % block_size;
}

/* Chunk ch of row r of a K/V tile (kcu_fa_kv_tile, kcu_fd_rows): K's into kdst and V's into vdst (rows laid out
 * as kcu_fa_rows<DKP> and <DVP>) from cache slot `slot` (kbase, vbase: the kv head's; a row's chunks past
 * its dims take none); a cache of codes times the row's scale (ksc, vsc: the kv head's, row stride KH). */
template <typename MT, typename KV, int KH, int DK, int DKP, int DV, int DVP>
static __device__ __forceinline__ void kcu_fa_kv_chunk(unsigned short *__restrict__ kdst, unsigned short *__restrict__ vdst,
                                                       const KV *__restrict__ kbase, const KV *__restrict__ vbase,
                                                       const int r, const int ch, const long long slot, const bool valid,
                                                       const float *__restrict__ ksc, const float *__restrict__ vsc)
{
    typedef kcu_fa_rows<DKP> KL;
    typedef kcu_fa_rows<DVP> VL;
    const float sk = kcu_kv_codes<KV>::V && valid ? ksc[slot * KH] : 1.0f;
    const float sv = kcu_kv_codes<KV>::V && valid ? vsc[slot * KH] : 1.0f;
    if (ch < (int)KL::CH) kcu_fa_chunk<MT, KV, DK>(kdst + KL::at(r, ch), kbase + slot * (KH * DK) + 8 * ch, ch, valid, sk);
    if (ch < (int)VL::CH) kcu_fa_chunk<MT, KV, DV>(vdst + VL::at(r, ch), vbase + slot * (KH * DV) + 8 * ch, ch, valid, sv);
}

/* Rows of positions [p0, p0 + BN) of a sequence (slots through table) of one kv head: its K rows of DK
 * elements (kbase: the cache at the head, row stride KH * DK) into kdst and its V rows of DV elements
 * (vbase, stride KH * DV) into vdst (BN rows laid out as kcu_fa_rows<DKP> and <DVP>), as MT; positions
 * past hi and dims past DK, DV are zeros. The block's NT threads share the chunks; a thread finds the
 * slot of a row once for its K and V chunks (measured: the slot's division, computed per chunk and
 * per tensor, held 16 % of the kernel's stall samples). */
template <typename MT, typename KV, int KH, int DK, int DKP, int DV, int DVP, int BN, int NT>
static __device__ __forceinline__ void kcu_fa_kv_tile(unsigned short *__restrict__ kdst,
                                                      unsigned short *__restrict__ vdst,
                                                      const KV *__restrict__ kbase, const KV *__restrict__ vbase,
                                                      const int *__restrict__ table, const int block_size,
                                                      const int bsh, const int p0, const int hi,
                                                      const float *__restrict__ ksc = nullptr,
                                                      const float *__restrict__ vsc = nullptr)
{
    typedef kcu_fa_rows<DKP> KL;
    typedef kcu_fa_rows<DVP> VL;
    enum { CH = (int)KL::CH > (int)VL::CH ? (int)KL::CH : (int)VL::CH };
    for (int i = threadIdx.x; i < BN * CH; i += NT) {
        const int r = i / CH, ch = i % CH, p = p0 + r;
        const bool valid = p <= hi;
        const long long slot = valid ? kcu_fa_slot(table, block_size, bsh, p) : 0;
        kcu_fa_kv_chunk<MT, KV, KH, DK, DKP, DV, DVP>(kdst, vdst, kbase, vbase, r, ch, slot, valid, ksc, vsc);
    }
}

/* Token u (thread u, u < the tile's tokens) of a tile from t0: its position, the first position it
 * attends to (WINDOW), its block table (-1 past T), into the tile's shared arrays. */
template <int WINDOW>
static __device__ __forceinline__ void kcu_fa_token_row(const int u, const int t0, const int T,
                                                        const int *__restrict__ positions,
                                                        const int *__restrict__ table_off, int *rpos, int *rlo,
                                                        int *rseq)
{
    const int t = t0 + u;
    const int p = t < T ? positions[t] : -1;
    rpos[u] = p;
    rlo[u] = WINDOW > 0 && p - WINDOW + 1 > 0 ? p - WINDOW + 1 : 0;
    rseq[u] = t < T ? table_off[t] : -1;
}

/* Dynamic shared memory of kcu_flash_attention<..., DK, DV, HB, TW, MW, BN, NS, ...>, bytes: q's
 * rows of the block's warps, then NS K and NS V tiles (kcu_emit_attention.c's flash_smem: the same
 * sum, for the launch). */
template <int DK, int DV, int HB, int TW, int MW, int BN, int NS> struct kcu_fa_smem_of {
    enum {
        DKP = (DK + 15) / 16 * 16,
        DVP = (DV + 15) / 16 * 16,
        BYTES = 2 * (HB * TW * 16 * MW * kcu_fa_rows<DKP>::STRIDE +
                     NS * BN * (kcu_fa_rows<DKP>::STRIDE + kcu_fa_rows<DVP>::STRIDE))
    };
};

/* Whether a step of T tokens in tiles of BT, over `groups` head groups, gives fewer blocks than
 * the GPU has SMs (%nsmid: the SM ids' bound, the SMs or a few more; the emulator: KEMU_SMS): then
 * a plan of half the tokens a block fills more of it (kcu_emit_attention.c, kcu_plan_flash_short). */
__device__ __forceinline__ bool kcu_fa_few_blocks(int T, int BT, long long groups)
{
#ifdef KILN_EMU_SHIM_H
    const unsigned sms = KEMU_SMS;
#else
    unsigned sms;
    asm("mov.u32 %0, %%nsmid;" : "=r"(sms));
#endif
    return (long long)((T + BT - 1) / BT) * groups < (long long)sms;
}

/*
 * kcu_flash_attention: causal attention of tokens [t0, t0 + BT) (BT = 16 MW TW) for HB q
 * heads of one kv head, over the paged cache: block (blockIdx.x, blockIdx.y) of a grid
 * [H / HB, ceil(T / BT)], HB * TW warps (warp w: head w % HB of the block's, tokens
 * 16 MW (w / HB) ..+ 16 MW of its tile, MW m16 tiles). Token t attends to positions [lo, pos]
 * of its sequence (positions[t], lo from WINDOW; its block table at tables + table_off[t]);
 * the tile's tokens may come from several sequences in any order: the block takes each
 * sequence of its tile in turn (a segment), over the positions its tokens need, masking the
 * others. Shapes: q [T, H, DK], kc [slots, KH, DK], vc [slots, KH, DV], out [T, H, DV]; MT
 * the tensor cores' input type; BN positions a K/V tile; NS tiles in the ring (NS - 1 in flight
 * while the warps multiply one: the loads wait on the block table, then on L2 or HBM, and at
 * short T a block's tiles are its whole critical path). Needs kcu_fa_smem_of<...>::BYTES of
 * dynamic shared memory (a GPU traps with less).
 */
template <typename MT, typename Q, typename KV, typename O, int H, int KH, int DK, int DV, int HB, int TW, int MW,
          int BN, int NS, int WINDOW, typename SK = float>
static __device__ __forceinline__ void kcu_flash_attention(const int T, const Q *__restrict__ q,
                                                           const KV *__restrict__ kc, const KV *__restrict__ vc,
                                                           O *__restrict__ out, const int *__restrict__ positions,
                                                           const int *__restrict__ table_off,
                                                           const int *__restrict__ tables, const int block_size,
                                                           const float scale, const float softcap,
                                                           const float *__restrict__ alibi = nullptr,
                                                           const SK *__restrict__ sinks = nullptr,
                                                           const float *__restrict__ ksc = nullptr,
                                                           const float *__restrict__ vsc = nullptr)
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
        KC = DKP / 16,               /* k16 slices of q k */
        NB = BN / 8,                 /* 8-position column tiles of the scores */
        VN = DVP / 8,                /* 8-column tiles of the output */
        QROWS = NW * WT,             /* q rows in shared memory: warp w's are w WT ..+ WT */
        SMEM = kcu_fa_smem_of<DK, DV, HB, TW, MW, BN, NS>::BYTES
    };
    typedef kcu_fa_rows<DKP> KL; /* q and K rows */
    typedef kcu_fa_rows<DVP> VL; /* V rows */
    enum { KT = BN * KL::STRIDE, VT = BN * VL::STRIDE }; /* elements a K tile, a V tile */
    static_assert(H % KH == 0 && GROUP % HB == 0 && BN % 16 == 0 && (MW == 1 || MW == 2) && NS >= 2 && NS <= 4,
                  "kcu_flash_attention: shapes");
    static_assert(SMEM == 2 * (QROWS * KL::STRIDE + NS * (KT + VT)) && SMEM % 16 == 0, "kcu_flash_attention: layout");
#ifdef KILN_EMU_SHIM_H
    static uint4 dyn[SMEM / 16]; /* blocks run one at a time */
#else
    extern __shared__ uint4 kcu_fa_dyn[];
    uint4 *const dyn = kcu_fa_dyn;
#endif
    /* q (MT bits), then K tiles 0 .. NS - 1, then V tiles 0 .. NS - 1 */
    unsigned short *const qs = reinterpret_cast<unsigned short *>(dyn), *const ks = qs + QROWS * KL::STRIDE;
    unsigned short *const vs = ks + NS * KT;
    __shared__ int rpos[BT], rlo[BT], rseq[BT];        /* each token's position, first position, table (-1: none) */
    __shared__ int rfirst[BT];                         /* 1: the first token of its sequence in the tile */
    __shared__ int wrange[TW][4];                      /* a segment's positions of token warp tw's rows (below) */
    const float ninf = -__int_as_float(0x7f800000);
    /* exp(x) = exp2(x log2e): the exponentials' factor on the scores (the softcapped ones with a softcap) */
    const float fac = softcap > 0.0f ? 1.4426950408889634f : scale * 1.4426950408889634f;
    const int tiles = (T + BT - 1) / BT;
    /* blocks start in x-major order: every head group's last tokens (the longest rows, in a prompt)
     * first, then the next tile down (longest first over the whole grid: with the token tiles on x,
     * head groups started in turn, and the last wave held whole groups of long rows while SMs idled:
     * ncu, Llama-3-8B at T = 2048, SMs active 63 % of the kernel's cycles) */
    const int t0 = (tiles - 1 - (int)blockIdx.y) * BT;
    if (t0 < 0) return; /* a grid larger than the step's (not kiln's) */
    const int hb = blockIdx.x, kh = hb * HB / GROUP;
    const int tid = threadIdx.x, w = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
    const int head = hb * HB + w % HB, tw = w / HB;
    int bsh = -1; /* log2 of the block size when a power of two (kcu_fa_slot) */
    if (block_size > 0 && (block_size & (block_size - 1)) == 0)
        for (bsh = 0; 1 << bsh < block_size;) bsh++;
#if defined(__CUDA_ARCH__)
    if (tid == 0) {
        unsigned dyn_bytes;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn_bytes));
        if (dyn_bytes < (unsigned)SMEM) __trap(); /* launched with less than the layout needs */
    }
#endif

    if (tid < BT) kcu_fa_token_row<WINDOW>(tid, t0, T, positions, table_off, rpos, rlo, rseq);
    /* q's rows (row r: warp r / WT's token r % WT), zeros past T and DK; lands with the first K tile */
    for (int i = tid; i < QROWS * KL::CH; i += NT) {
        const int r = i / KL::CH, ch = i % KL::CH, wr = r / WT;
        const int t = t0 + (wr / HB) * WT + r % WT, hd = hb * HB + wr % HB;
        kcu_fa_chunk<MT, Q, DK>(qs + KL::at(r, ch), q + ((long long)(t < T ? t : 0) * H + hd) * DK + 8 * ch, ch, t < T);
    }
    kcu_fa_commit();
    __syncthreads();
    if (tid < BT) {
        int f = rseq[tid] >= 0;
        for (int u = 0; u < tid && f; u++) f = rseq[u] != rseq[tid];
        rfirst[tid] = f;
    }
    __syncthreads();

    float m[R], l[R];  /* each row's running maximum (of the scores: fac s is its log2 of e^s), the lane's part of its sum of exponentials */
    float o[MW][VN][4]; /* the output accumulators, C layout */
#pragma unroll
    for (int x = 0; x < R; x++) m[x] = ninf, l[x] = 0.0f;
#pragma unroll
    for (int mi = 0; mi < MW; mi++)
#pragma unroll
        for (int j = 0; j < VN; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[mi][j][e] = 0.0f;
    /* The lane's ldmatrix addresses, matrices i = lane / 8. q (the A fragment) and V (transposed,
     * the B fragments of two 8-column tiles): rows 8 (i % 2) ..+ 8, chunk 2 kk + i / 2. K: rows
     * 8 (i / 2) ..+ 8, chunk 2 kk + i % 2, so that r[0], r[1] are the B fragment of one 8-position
     * tile and r[2], r[3] of the next (the mma takes a B fragment in two consecutive registers: in
     * the other order ptxas moved two registers for every mma). Four addresses each (k slices
     * kk % 4; the rest are constant offsets, folded into the instructions), K and V at buffer 0. */
    const int lrow = ((lane / 8) % 2) * 8 + lane % 8, krow = (lane / 16) * 8 + lane % 8;
    kcu_fa_sptr qa[4], ka[4], va[4];
#pragma unroll
    for (int k4 = 0; k4 < 4; k4++) {
        qa[k4] = kcu_fa_sp(qs) + 2 * ((w * WT + lrow) * KL::STRIDE + KL::lane_chunk(k4, lane / 16, lane));
        ka[k4] = kcu_fa_sp(ks) + 2 * (krow * KL::STRIDE + KL::lane_chunk(k4, (lane / 8) % 2, lane));
        va[k4] = kcu_fa_sp(vs) + 2 * (lrow * VL::STRIDE + VL::lane_chunk(k4, lane / 16, lane));
    }

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
        const float *ksb = ksc ? ksc + kh : nullptr, *vsb = vsc ? vsc + kh : nullptr; /* a cache of codes' scales */
        __syncthreads(); /* every warp is done with the tiles of the previous segment */
        /* the token rows of warp w's (w / HB: TW of them, shared by the heads): the positions any of them
         * needs, [wlo, whi]; the positions all of them need, [flo, fhi] (empty when a row is of
         * another sequence); in shared memory, read a tile, to spare registers */
        if (tid < TW) {
            int wlo = khi + 1, whi = -1, flo = 0, fhi = khi;
            for (int u = tid * WT; u < tid * WT + WT; u++) {
                if (rseq[u] != seq) {
                    fhi = -1;
                    continue;
                }
                wlo = rlo[u] < wlo ? rlo[u] : wlo, whi = rpos[u] > whi ? rpos[u] : whi;
                flo = rlo[u] > flo ? rlo[u] : flo, fhi = rpos[u] < fhi ? rpos[u] : fhi;
            }
            wrange[tid][0] = wlo, wrange[tid][1] = whi, wrange[tid][2] = flo, wrange[tid][3] = fhi;
        }
        /* tiles 0 .. NS - 2 in flight, a commit group each (empty past the last tile: every
         * iteration below then finds its tile NS - 2 groups behind the newest) */
#pragma unroll
        for (int st = 0; st < NS - 1; st++) {
            if (st < n_tiles)
                kcu_fa_kv_tile<MT, KV, KH, DK, DKP, DV, DVP, BN, NT>(ks + st * KT, vs + st * VT, kbase, vbase, table,
                                                                     block_size, bsh, klo + st * BN, khi, ksb, vsb);
            kcu_fa_commit();
        }
        for (int it = 0; it < n_tiles; it++) {
            const int p0 = klo + it * BN, buf = it % NS;
            kcu_fa_wait<NS - 2>();
            __syncthreads(); /* tile it (and q) landed; every warp is done with tile it - 1, whose buffers come next */
            {
                /* tile it + NS - 1 in flight while the warps multiply tile it */
                const int nx = it + NS - 1;
                if (nx < n_tiles)
                    kcu_fa_kv_tile<MT, KV, KH, DK, DKP, DV, DVP, BN, NT>(ks + nx % NS * KT, vs + nx % NS * VT, kbase,
                                                                         vbase, table, block_size, bsh, klo + nx * BN,
                                                                         khi, ksb, vsb);
                kcu_fa_commit();
            }
            if (!kcu_fa_any(wrange[tw][1] >= p0 && wrange[tw][0] <= p0 + BN - 1)) continue; /* no score of the warp's here */
            const int kb = 2 * buf * KT, vb = 2 * buf * VT; /* this tile's buffers, bytes from buffer 0 */
            float s[MW][NB][4];
#pragma unroll
            for (int mi = 0; mi < MW; mi++)
#pragma unroll
                for (int j = 0; j < NB; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) s[mi][j][e] = 0.0f;
            /* s = q k^T: q's A fragments and K rows as B fragments (two 8-position tiles) by
             * ldmatrix, each K fragment feeding the MW m16 tiles */
#pragma unroll
            for (int kk = 0; kk < KC; kk++) {
                unsigned qf[MW][4];
#pragma unroll
                for (int mi = 0; mi < MW; mi++)
                    kcu_fa_ldmatrix<false>(qf[mi], qa[kk % 4] + 2 * (16 * mi * KL::STRIDE + 64 * (kk / 4)));
#pragma unroll
                for (int j = 0; j < NB; j += 2) {
                    unsigned b[4];
                    kcu_fa_ldmatrix<false>(b, ka[kk % 4] + kb + 2 * (j * 8 * KL::STRIDE + 64 * (kk / 4)));
#pragma unroll
                    for (int mi = 0; mi < MW; mi++) {
                        kcu_fa_mma<MT>(s[mi][j], qf[mi], b[0], b[1]);
                        kcu_fa_mma<MT>(s[mi][j + 1], qf[mi], b[2], b[3]);
                    }
                }
            }
            /* scale (softcap: s = softcap tanh(s scale / softcap)), then mask, unless every row
             * of the warp sees all of [p0, p0 + BN) */
#pragma unroll
            for (int mi = 0; mi < MW; mi++)
#pragma unroll
                for (int j = 0; j < NB; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (softcap > 0.0f) s[mi][j][e] = softcap * tanhf(s[mi][j][e] * scale / softcap);
            if (alibi) {
                /* ALiBi: the head's slope times the key's position, in the scores' units (unscaled
                 * without a softcap: fac scales them) */
                const float sl = alibi[head] * (softcap > 0.0f ? 1.0f : 1.0f / scale);
#pragma unroll
                for (int mi = 0; mi < MW; mi++)
#pragma unroll
                    for (int j = 0; j < NB; j++)
#pragma unroll
                        for (int e = 0; e < 4; e++) s[mi][j][e] += sl * (float)(p0 + j * 8 + 2 * c + (e & 1));
            }
            if (!(wrange[tw][2] <= p0 && wrange[tw][3] >= p0 + BN - 1)) {
#pragma unroll
                for (int x = 0; x < R; x++) {
                    const int mi = x / 2, i = x % 2, row = tw * WT + 16 * mi + g + 8 * i;
                    const int rq = rseq[row], rl = rlo[row], rp = rpos[row];
#pragma unroll
                    for (int j = 0; j < NB; j++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const int p = p0 + j * 8 + 2 * c + e;
                            if (!(rq == seq && p >= rl && p <= rp)) s[mi][j][2 * i + e] = ninf;
                        }
                }
            }
            /* online softmax: the rows' maxima over their 4 lanes, exponentials, rescale */
            float alpha[R];
            bool same = true; /* no row's maximum moved: the accumulators stay */
#pragma unroll
            for (int x = 0; x < R; x++) {
                const int mi = x / 2, i = x % 2;
                float mx = ninf;
#pragma unroll
                for (int j = 0; j < NB; j++) mx = fmaxf(mx, fmaxf(s[mi][j][2 * i], s[mi][j][2 * i + 1]));
                float mf;
                alpha[x] = kcu_fa_rescale(m[x], l[x], mx, fac, mf);
                same = same && alpha[x] == 1.0f;
#pragma unroll
                for (int j = 0; j < NB; j++) {
                    s[mi][j][2 * i] = kcu_fa_exp2(fmaf(s[mi][j][2 * i], fac, -mf));
                    s[mi][j][2 * i + 1] = kcu_fa_exp2(fmaf(s[mi][j][2 * i + 1], fac, -mf));
                    l[x] += s[mi][j][2 * i] + s[mi][j][2 * i + 1];
                }
            }
            if (!kcu_fa_all(same)) /* (o alpha is o when alpha is 1: skipping changes no bit) */
#pragma unroll
                for (int mi = 0; mi < MW; mi++)
#pragma unroll
                    for (int j = 0; j < VN; j++) {
                        o[mi][j][0] *= alpha[2 * mi], o[mi][j][1] *= alpha[2 * mi];
                        o[mi][j][2] *= alpha[2 * mi + 1], o[mi][j][3] *= alpha[2 * mi + 1];
                    }
            /* P in MT: the C fragments of tiles 2kk, 2kk + 1 are the A fragment of k slice kk */
            unsigned pa[MW][BN / 16][4];
#pragma unroll
            for (int mi = 0; mi < MW; mi++)
#pragma unroll
                for (int kk = 0; kk < BN / 16; kk++)
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const float *sv = s[mi][2 * kk + (i >> 1)] + 2 * (i & 1);
                        pa[mi][kk][i] = kcu_fa_pack<MT>(sv[0], sv[1]);
                    }
            /* o += p v: V rows as B fragments (transposed), two 8-column tiles an ldmatrix, each
             * feeding the MW m16 tiles */
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++)
#pragma unroll
                for (int j = 0; j < VN; j += 2) {
                    unsigned b[4];
                    kcu_fa_ldmatrix<true>(b, va[(j / 2) % 4] + vb + 2 * (kk * 16 * VL::STRIDE + 64 * ((j / 2) / 4)));
#pragma unroll
                    for (int mi = 0; mi < MW; mi++) {
                        kcu_fa_mma<MT>(o[mi][j], pa[mi][kk], b[0], b[1]);
                        kcu_fa_mma<MT>(o[mi][j + 1], pa[mi][kk], b[2], b[3]);
                    }
                }
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
        float inv = l[x] > 0.0f ? 1.0f / l[x] : 0.0f;
        if (sinks) { /* the sink among the row's scores: o 2^(m - M) / (l 2^(m - M) + 2^(sink - M)), log2 units */
            const float ninf = -__int_as_float(0x7f800000);
            const float mf = m[x] == ninf ? ninf : m[x] * fac, sk = kcu_f(sinks[head]) * 1.4426950408889634f;
            const float mm = fmaxf(mf, sk), a = mf == ninf ? 0.0f : exp2f(mf - mm);
            inv = a / (l[x] * a + exp2f(sk - mm));
        }
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
    (void)block_size, (void)scale, (void)softcap, (void)alibi, (void)sinks;
    __trap(); /* before sm_80: kcu_emit_attention does not launch it there */
#endif
}
