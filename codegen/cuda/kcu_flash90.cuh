/*
 * kcu_flash90.cuh — causal attention for prefill on sm_90a: both products on wgmma (FlashAttention-3's
 * core, Shah et al. 2024, without its intra-warpgroup pipelining), over the paged KV cache. Embedded after
 * kcu_flash.cuh (whose kcu_fa_* helpers it uses) and kcu_prelude.cuh (wgmma descriptors, mbarriers);
 * compiled where KCU_GEMM90 is 1 (the sm_90a cubin) and absent elsewhere. kcu_emit_attention.c runs it
 * as the sm_90a body of an attention kernel's `_large` variant when kcu_plan_flash90 finds a plan; the
 * design, its cost and what was measured are described there.
 *
 * A block: 256 threads, two warpgroups; 128 rows of (token, head): TB = 128 / HB consecutive tokens of
 * the step x HB q heads of one kv head (row r: token r / HB, head r % HB), warpgroup j rows 64 j ..+ 64
 * (one wgmma M). Shared memory (dynamic, 1024-aligned): q [DK / 64 panels][128 rows][128 bytes], then NS
 * stages of K [DK / 64][BN][128 B] and V [DV / 64][BN][128 B]: every row of a panel 128 bytes, its 16-byte
 * chunk c at c ^ (row % 8) (the 128-byte swizzle wgmma reads).
 *  - S = q K^T: wgmma m64nBNk16, q and K both K-major through descriptors (kcu_wg_desc), DK / 16 of them.
 *  - softmax on the accumulators (wgmma's D layout: thread (warp w, lane g * 4 + c) holds rows 16 w + g
 *    and + 8, columns 8 j + 2 c, + 1), as kcu_flash_attention does it: scale (softcap), mask on edge
 *    tiles, running maxima over the row's 4 lanes, 2^(s fac - m fac), rescale of o when a maximum moved.
 *  - O += P V: P rounded to MT in registers (the D layout of two 8-column tiles is wgmma's A fragment of
 *    a k16 slice), V from shared memory as an N-major B (imm-trans-b; descriptor kcu_wg_desc_mn), BN / 16
 *    wgmma m64nDVk16.
 * Loads: every thread copies its share of a tile with cp.async (rows through the block table; zeros past
 * the segment's last position), waits for its own copies, fences them for the async proxy and arrives on
 * the stage's `full` mbarrier (256 arrivals); a warpgroup waits on `full`, multiplies, and each warp
 * arrives on the stage's `empty` mbarrier (8 arrivals) once its wgmma are done; a thread refills a stage
 * only after `empty` says both warpgroups are done with it. No block barrier in the loop.
 */
#if KCU_GEMM90
/* wgmma with A from registers (four 32-bit registers: a k16 slice of 16 rows a warp, mma.sync's A
 * fragment layout) and B an N-major tile through a descriptor (imm-trans-b = 1): d += a b */
#define KCU_WG_RS_ASM(N, TY, REGS, A, B, P)                                                                           \
    "{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\n"                                                                \
    "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " {" REGS "}, {" A "}, " B ", p, 1, 1, 1;\n}\n"
template <int N> struct kcu_wg_mma_rs;
#define KCU_WG_MMA_RS_N(N, R, REGS, A, B, P, ...)                                                                     \
    template <> struct kcu_wg_mma_rs<N> {                                                                           \
        template <bool F16>                                                                                         \
        static __device__ __forceinline__ void run(float (&d)[R], const unsigned (&a)[4], unsigned long long b)     \
        {                                                                                                           \
            if constexpr (F16)                                                                                      \
                asm volatile(KCU_WG_RS_ASM(N, "f16", REGS, A, B, P)                                                 \
                             : __VA_ARGS__                                                                          \
                             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));                         \
            else                                                                                                    \
                asm volatile(KCU_WG_RS_ASM(N, "bf16", REGS, A, B, P)                                                \
                             : __VA_ARGS__                                                                          \
                             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));                         \
        }                                                                                                           \
    };
KCU_WG_MMA_RS_N(64, 32, KCU_WG_R0, "%32, %33, %34, %35", "%36", "%37", KCU_WG_D32(0))
KCU_WG_MMA_RS_N(128, 64, KCU_WG_R0 ", " KCU_WG_R32, "%64, %65, %66, %67", "%68", "%69", KCU_WG_D32(0), KCU_WG_D32(32))

/* wgmma shared-memory descriptor of an MN-major operand in the 128-byte swizzle: rows of 128 bytes (64
 * elements along N), 8 rows along K 1024 bytes apart (stride), the next 64 along N `panel` bytes on
 * (leading), start at addr */
__device__ __forceinline__ unsigned long long kcu_wg_desc_mn(unsigned addr, unsigned panel)
{
    return (unsigned long long)((addr & 0x3ffffu) >> 4) | ((unsigned long long)(panel >> 4) << 16) | (64ull << 32) |
           (1ull << 62);
}

/* cp.async of 16 bytes from global src to the shared address dst, or 16 zero bytes when !valid */
__device__ __forceinline__ void kcu_f90_cp16(unsigned dst, const void *src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}

/* this thread's generic-proxy writes to shared memory made visible to the async proxy (wgmma's reads) */
__device__ __forceinline__ void kcu_f90_fence_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

/* The byte offset of 16-byte chunk ch (elements 8 ch ..+ 8) of row r of a tile of `rows` rows in panels of
 * 64 elements, 128-byte swizzle. */
template <int ROWS> __device__ __forceinline__ unsigned kcu_f90_at(int r, int ch)
{
    return (unsigned)((ch >> 3) * ROWS * 128 + r * 128 + (((ch & 7) ^ (r & 7)) << 4));
}

/* A walk over a block's K/V tiles: the segments (a sequence's tokens in the block, first to last; seg_hi
 * of its first token, -1 for the others) in token order, each in tiles of BN positions from its lowest. */
template <int TB, int BN> struct kcu_f90_walk {
    int u;        /* the segment's first token (TB: past the last) */
    int j, n;     /* the tile in the segment, the segment's tiles */
    int klo, khi; /* the segment's positions */
    __device__ __forceinline__ void seek(const int *seg_lo, const int *seg_hi, int from)
    {
        for (u = from; u < TB && seg_hi[u] < 0;) u++;
        j = 0;
        if (u < TB) klo = seg_lo[u], khi = seg_hi[u], n = (khi - klo + BN) / BN;
    }
    __device__ __forceinline__ void next(const int *seg_lo, const int *seg_hi)
    {
        if (++j == n) seek(seg_lo, seg_hi, u + 1);
    }
};

/* Dynamic shared memory of kcu_flash90<..., DK, DV, .., BN, NS, ..>, bytes: q, the stages, 1024 for the
 * alignment (kcu_emit_attention.c's flash90_smem: the same sum, for the launch). */
template <int DK, int DV, int BN, int NS> struct kcu_f90_smem_of {
    enum { BYTES = 128 * DK * 2 + NS * BN * (DK + DV) * 2 + 1024 };
};

/*
 * kcu_flash90: causal attention of the step's tokens [t0, t0 + TB) (TB = 128 / HB) for HB q heads of one
 * kv head, over the paged cache: block (blockIdx.x, blockIdx.y) of a grid [H / HB, ceil(T / TB)], 256
 * threads. Operands as kcu_flash_attention's with q and the cache in MT (kcu_bf16 or kcu_f16) and
 * DK, DV multiples of 64 (DK <= 256, DV <= 128); BN positions a K/V tile (64 or 128), NS stages. Needs
 * kcu_f90_smem_of<DK, DV, BN, NS>::BYTES of dynamic shared memory (traps with less).
 */
template <typename MT, typename O, int H, int KH, int DK, int DV, int HB, int BN, int NS, int WINDOW>
static __device__ __forceinline__ void kcu_flash90(const int T, const MT *__restrict__ q, const MT *__restrict__ kc,
                                                   const MT *__restrict__ vc, O *__restrict__ out,
                                                   const int *__restrict__ positions, const int *__restrict__ table_off,
                                                   const int *__restrict__ tables, const int block_size,
                                                   const float scale, const float softcap)
{
    enum {
        GROUP = H / KH,
        ROWS = 128,             /* (token, head) rows a block */
        TB = ROWS / HB,         /* tokens a block */
        QBYTES = ROWS * DK * 2, /* q: DK / 64 panels of ROWS rows */
        KBYTES = BN * DK * 2,   /* a stage's K */
        VBYTES = BN * DV * 2,   /* a stage's V */
        KCH = DK / 8,           /* 16-byte chunks a K row */
        VCH = DV / 8,           /* a V row's */
        KI = BN * KCH / 256,    /* K chunks a thread copies a tile */
        VI = BN * VCH / 256,    /* V chunks */
        NB = BN / 8,            /* 8-position column tiles of the scores */
        VN = DV / 8,            /* 8-column tiles of the output */
        F16 = kcu_fa_h<MT>::F16,
        SMEM = kcu_f90_smem_of<DK, DV, BN, NS>::BYTES
    };
    static_assert(H % KH == 0 && GROUP % HB == 0 && ROWS % HB == 0 && 64 % HB == 0, "kcu_flash90: heads");
    static_assert(DK % 64 == 0 && DK <= 256 && (DV == 64 || DV == 128) && (BN == 64 || BN == 128) && NS >= 2,
                  "kcu_flash90: shapes");
    static_assert(BN * KCH % 256 == 0 && BN * VCH % 256 == 0, "kcu_flash90: whole chunks a thread");
    extern __shared__ unsigned char kcu_f90_dyn[];
    __shared__ alignas(8) unsigned long long bars[2 * NS]; /* full[NS], empty[NS] */
    __shared__ int rpos[TB], rlo[TB], rseq[TB];            /* each token's position, first position, table (-1: none) */
    __shared__ int seg_lo[TB], seg_hi[TB];                 /* a segment's positions at its first token; -1: not first */
    const unsigned base = (kcu_g90_smem(kcu_f90_dyn) + 1023u) & ~1023u;
    const unsigned sq = base, sk = base + QBYTES, sv = sk + NS * KBYTES;
    const unsigned full = kcu_g90_smem(bars), empty = full + 8 * NS;
    const float ninf = -__int_as_float(0x7f800000);
    const float fac = softcap > 0.0f ? 1.4426950408889634f : scale * 1.4426950408889634f;
    const int tiles = (T + TB - 1) / TB;
    /* the last tokens (the longest rows of a prompt) first, as kcu_flash_attention */
    const int t0 = (tiles - 1 - (int)blockIdx.y) * TB;
    if (t0 < 0) return;
    const int hb = blockIdx.x, kh = hb * HB / GROUP;
    const int tid = threadIdx.x, wg = tid / 128, warp = tid / 32 % 4, lane = tid % 32, g = lane / 4, c = lane % 4;
    int bsh = -1;
    if (block_size > 0 && (block_size & (block_size - 1)) == 0)
        for (bsh = 0; 1 << bsh < block_size;) bsh++;
    if (tid == 0) {
        unsigned dyn_bytes;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn_bytes));
        if (dyn_bytes < (unsigned)SMEM) __trap(); /* launched with less than the layout needs */
        for (int s = 0; s < NS; s++) {
            kcu_mbar_init(full + 8 * s, 256);
            kcu_mbar_init(empty + 8 * s, 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    if (tid < TB) kcu_fa_token_row<WINDOW>(tid, t0, T, positions, table_off, rpos, rlo, rseq);
    /* q's rows (row r: token r / HB, head r % HB), zeros past T; land with tile 0's group */
    for (int i = tid; i < ROWS * KCH; i += 256) {
        const int r = i / KCH, ch = i % KCH, t = t0 + r / HB, hd = hb * HB + r % HB;
        kcu_f90_cp16(sq + kcu_f90_at<ROWS>(r, ch), q + ((long long)(t < T ? t : 0) * H + hd) * DK + 8 * ch, t < T);
    }
    __syncthreads();
    if (tid < TB) {
        /* a segment: the block's tokens of one sequence, over positions [min lo, max pos], at its first token */
        const int seq = rseq[tid];
        int f = seq >= 0, lo = rlo[tid], hi = rpos[tid];
        for (int u = 0; u < tid && f; u++) f = rseq[u] != seq;
        if (f)
            for (int u = tid + 1; u < TB; u++)
                if (rseq[u] == seq) lo = rlo[u] < lo ? rlo[u] : lo, hi = rpos[u] > hi ? rpos[u] : hi;
        seg_lo[tid] = lo, seg_hi[tid] = f ? hi : -1;
    }
    __syncthreads();

    /* the block's tiles, every segment's in turn */
    int n_tiles = 0;
    for (int u = 0; u < TB; u++)
        if (seg_hi[u] >= 0) n_tiles += (seg_hi[u] - seg_lo[u] + BN) / BN;
    const MT *const kbase = kc + (long long)kh * DK, *const vbase = vc + (long long)kh * DV;
    /* tile (walk w's) into stage st, rows past the segment's last position zeros. Where a row's chunks
     * divide the block (256 % KCH == 0, KCH == VCH), thread tid copies chunk tid % KCH of the KI
     * consecutive rows from (tid / KCH) KI, K and V: their slots are one lookup in the block table and
     * consecutive where the rows lie in one cache block (else a lookup a row). Otherwise thread tid
     * copies chunks tid + 256 i (row (tid + 256 i) / KCH), the rows' slots read first, all at once. */
    auto load = [&](const kcu_f90_walk<TB, BN> &w, int st) {
        const int *table = tables + rseq[w.u];
        const int p0 = w.klo + w.j * BN;
        if constexpr (256 % KCH == 0 && KCH == VCH) {
            const int ch = tid % KCH, r0 = tid / KCH * KI, q0 = p0 + r0;
            long long sl[KI]; /* the rows' slots (-1: past the segment) */
            if (bsh >= 0 && q0 <= w.khi && (q0 >> bsh) == ((q0 + KI - 1) >> bsh)) {
                const long long s0 = kcu_fa_slot(table, block_size, bsh, q0);
#pragma unroll
                for (int i = 0; i < KI; i++) sl[i] = q0 + i <= w.khi ? s0 + i : -1;
            } else {
#pragma unroll
                for (int i = 0; i < KI; i++) sl[i] = q0 + i <= w.khi ? kcu_fa_slot(table, block_size, bsh, q0 + i) : -1;
            }
#pragma unroll
            for (int i = 0; i < KI; i++)
                kcu_f90_cp16(sk + st * KBYTES + kcu_f90_at<BN>(r0 + i, ch),
                             kbase + (sl[i] < 0 ? 0 : sl[i]) * (KH * DK) + 8 * ch, sl[i] >= 0);
#pragma unroll
            for (int i = 0; i < KI; i++)
                kcu_f90_cp16(sv + st * VBYTES + kcu_f90_at<BN>(r0 + i, ch),
                             vbase + (sl[i] < 0 ? 0 : sl[i]) * (KH * DV) + 8 * ch, sl[i] >= 0);
        } else {
            long long ks[KI], vs[VI]; /* the rows' slots (-1: past the segment) */
#pragma unroll
            for (int i = 0; i < KI; i++) {
                const int p = p0 + (tid + 256 * i) / KCH;
                ks[i] = p <= w.khi ? kcu_fa_slot(table, block_size, bsh, p) : -1;
            }
#pragma unroll
            for (int i = 0; i < VI; i++) {
                const int p = p0 + (tid + 256 * i) / VCH;
                vs[i] = p <= w.khi ? kcu_fa_slot(table, block_size, bsh, p) : -1;
            }
#pragma unroll
            for (int i = 0; i < KI; i++) {
                const int r = (tid + 256 * i) / KCH, ch = (tid + 256 * i) % KCH;
                kcu_f90_cp16(sk + st * KBYTES + kcu_f90_at<BN>(r, ch),
                             kbase + (ks[i] < 0 ? 0 : ks[i]) * (KH * DK) + 8 * ch, ks[i] >= 0);
            }
#pragma unroll
            for (int i = 0; i < VI; i++) {
                const int r = (tid + 256 * i) / VCH, ch = (tid + 256 * i) % VCH;
                kcu_f90_cp16(sv + st * VBYTES + kcu_f90_at<BN>(r, ch),
                             vbase + (vs[i] < 0 ? 0 : vs[i]) * (KH * DV) + 8 * ch, vs[i] >= 0);
            }
        }
    };
    kcu_f90_walk<TB, BN> pf, cw; /* the next tile to load, the tile to multiply */
    pf.seek(seg_lo, seg_hi, 0);
    cw = pf;
#pragma unroll
    for (int st = 0; st < NS - 1; st++) {
        if (st < n_tiles) {
            load(pf, st);
            pf.next(seg_lo, seg_hi);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    }

    /* the thread's two rows (h = 0, 1: row 16 warp + g + 8 h of its warpgroup's 64) */
    int rq[2], rl[2], rp[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int tok = (64 * wg + 16 * warp + g + 8 * h) / HB;
        rq[h] = rseq[tok], rl[h] = rlo[tok], rp[h] = rpos[tok];
    }
    float m[2] = {ninf, ninf}, l[2] = {0.0f, 0.0f};
    float o[VN * 4];
#pragma unroll
    for (int i = 0; i < VN * 4; i++) o[i] = 0.0f;
    /* the warpgroup's rows of the current segment: the positions any needs [wlo, whi], all need [flo, fhi] */
    int wlo = 0, whi = -1, flo = 0, fhi = -1, seg_u = -1;
    const unsigned qa = sq + wg * 64 * 128; /* the warpgroup's q rows */

    for (int gi = 0; gi < n_tiles; gi++) {
        const int st = gi % NS;
        /* this thread's copies of tile gi (and q) landed (the NS - 2 tiles after it may be in flight):
         * fenced for wgmma, announced; before the next tile's copies are issued, since the fence and the
         * arrive's release (MEMBAR.ALL.CTA in the SASS) may wait for every copy the thread has in flight */
        asm volatile("cp.async.wait_group %0;" ::"n"(NS - 2) : "memory");
        kcu_f90_fence_async();
        kcu_mbar_arrive(full + 8 * st);
        {
            /* tile gi + NS - 1 into the stage tile gi - 1 used, once both warpgroups are done with it */
            const int nx = gi + NS - 1;
            if (nx < n_tiles) {
                if (nx >= NS) kcu_mbar_wait(empty + 8 * (nx % NS), (nx / NS - 1) & 1);
                load(pf, nx % NS);
                pf.next(seg_lo, seg_hi);
            }
            asm volatile("cp.async.commit_group;" ::: "memory");
        }
        const int seq = rseq[cw.u], p0 = cw.klo + cw.j * BN;
        if (cw.u != seg_u) {
            seg_u = cw.u, wlo = cw.khi + 1, whi = -1, flo = 0, fhi = cw.khi;
            for (int tok = 64 * wg / HB; tok < (64 * wg + 64) / HB; tok++) {
                if (rseq[tok] != seq) {
                    fhi = -1;
                    continue;
                }
                wlo = rlo[tok] < wlo ? rlo[tok] : wlo, whi = rpos[tok] > whi ? rpos[tok] : whi;
                flo = rlo[tok] > flo ? rlo[tok] : flo, fhi = rpos[tok] < fhi ? rpos[tok] : fhi;
            }
        }
        const bool mine = whi >= p0 && wlo <= p0 + BN - 1; /* a score of the warpgroup's here (uniform in it) */
        if (mine) {
            kcu_mbar_wait(full + 8 * st, (gi / NS) & 1);
            float s[NB * 4];
#pragma unroll
            for (int i = 0; i < NB * 4; i++) s[i] = 0.0f;
            kcu_wg_fence();
            const unsigned ka = sk + st * KBYTES;
#pragma unroll
            for (int kk = 0; kk < DK / 16; kk++)
                kcu_wg_mma<BN>::template run<F16>(s, kcu_wg_desc(qa + (kk / 4) * (ROWS * 128) + (kk % 4) * 32),
                                                  kcu_wg_desc(ka + (kk / 4) * (BN * 128) + (kk % 4) * 32));
            kcu_wg_commit();
            kcu_wg_wait<0>();
            kcu_wg_hold(s);
            if (softcap > 0.0f)
#pragma unroll
                for (int i = 0; i < NB * 4; i++) s[i] = softcap * tanhf(s[i] * scale / softcap);
            if (!(flo <= p0 && fhi >= p0 + BN - 1)) {
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int j = 0; j < NB; j++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const int p = p0 + 8 * j + 2 * c + e;
                            if (!(rq[h] == seq && p >= rl[h] && p <= rp[h])) s[4 * j + 2 * h + e] = ninf;
                        }
            }
            float alpha[2];
            bool same = true;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float mx = ninf;
#pragma unroll
                for (int j = 0; j < NB; j++) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
                float mf;
                alpha[h] = kcu_fa_rescale(m[h], l[h], mx, fac, mf);
                same = same && alpha[h] == 1.0f;
#pragma unroll
                for (int j = 0; j < NB; j++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        s[4 * j + 2 * h + e] = kcu_fa_exp2(fmaf(s[4 * j + 2 * h + e], fac, -mf));
                        l[h] += s[4 * j + 2 * h + e];
                    }
            }
            if (!kcu_fa_all(same))
#pragma unroll
                for (int j = 0; j < VN; j++) {
                    o[4 * j] *= alpha[0], o[4 * j + 1] *= alpha[0];
                    o[4 * j + 2] *= alpha[1], o[4 * j + 3] *= alpha[1];
                }
            /* P in MT: tiles 2 kk, 2 kk + 1 are the A fragment of k slice kk */
            unsigned pa[BN / 16][4];
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) {
                pa[kk][0] = kcu_fa_pack<MT>(s[8 * kk], s[8 * kk + 1]);
                pa[kk][1] = kcu_fa_pack<MT>(s[8 * kk + 2], s[8 * kk + 3]);
                pa[kk][2] = kcu_fa_pack<MT>(s[8 * kk + 4], s[8 * kk + 5]);
                pa[kk][3] = kcu_fa_pack<MT>(s[8 * kk + 6], s[8 * kk + 7]);
            }
            kcu_wg_fence();
            const unsigned va = sv + st * VBYTES;
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++)
                kcu_wg_mma_rs<DV>::template run<F16>(o, pa[kk], kcu_wg_desc_mn(va + kk * 16 * 128, BN * 128));
            kcu_wg_commit();
            kcu_wg_wait<0>();
            kcu_wg_hold(o);
        }
        if (lane == 0) kcu_mbar_arrive(empty + 8 * st); /* this warp is done with the stage */
        cw.next(seg_lo, seg_hi);
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");

    /* out = o / l: the rows' sums over their 4 lanes */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
        const int r = 64 * wg + 16 * warp + g + 8 * h, t = t0 + r / HB;
        if (t >= T) continue;
        const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
        O *row = out + ((long long)t * H + hb * HB + r % HB) * DV;
#pragma unroll
        for (int j = 0; j < VN; j++) {
            kcu_fa_store(row + 8 * j + 2 * c, o[4 * j + 2 * h] * inv);
            kcu_fa_store(row + 8 * j + 2 * c + 1, o[4 * j + 2 * h + 1] * inv);
        }
    }
}
#endif /* KCU_GEMM90 */
