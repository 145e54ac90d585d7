/*
 * kcu_flash_decode.cuh — decode attention on tensor cores (flash-decoding): each token's
 * attention over its sequence's positions in the paged KV cache, a block for all the q heads
 * of one kv head (the GQA group as the rows of an m16 tile: every K and V row is read once for
 * the group), positions split over the block's warps and, on sm_90 for long contexts, over the
 * blocks of a cluster. Embedded after kcu_flash.cuh (whose 16-bit types, mma, ldmatrix,
 * cp.async and tile layouts it uses); kcu_emit_attention.c launches it as the decode body of
 * an attention kernel in fast precision, and describes its design, cost and numerics there.
 *
 * Needs sm_80 (mma.sync m16n8k16, ldmatrix, cp.async); the CPU emulator runs every warp
 * instruction lane by lane, as for kcu_flash_attention.
 */

/* lane src's v (every lane of the warp calls it together; the emulator: every thread of the block) */
__device__ __forceinline__ int kcu_fd_shfl(int v, int src)
{
#ifdef KILN_EMU_SHIM_H
    return kemu_warp_publish(v)[src];
#else
    return __shfl_sync(0xffffffffu, v, src);
#endif
}

/* Dynamic shared memory of kcu_flash_decode<..., DK, DV, NW, BN, NS, ...>, bytes: a ring of NS K
 * tiles and NS V tiles of BN rows for each of the NW warps (kcu_emit_attention.c's
 * kcu_flash_decode_smem: the same sum, for the launch). After the positions, the warps' states
 * (GROUP rows of DV floats, a maximum and a sum a row) reuse it: it must hold them. */
template <int DK, int DV, int NW, int BN, int NS> struct kcu_fd_smem_of {
    enum {
        DKP = (DK + 15) / 16 * 16,
        DVP = (DV + 15) / 16 * 16,
        KT = BN * kcu_fa_rows<DKP>::STRIDE, /* elements a K tile */
        VT = BN * kcu_fa_rows<DVP>::STRIDE, /* a V tile */
        WARP = NS * (KT + VT),              /* a warp's ring */
        BYTES = 2 * NW * WARP
    };
};

/* A warp's copy of the K and V rows of positions [p0, p0 + BN) of a sequence (slots through its
 * block table; positions past hi zeros) into its tiles kdst, vdst (as kcu_fa_kv_tile, a warp's
 * lanes sharing the chunks): lane l finds the slot of row l % BN once, and the lanes copying a
 * row take it by a shuffle. */
template <typename MT, typename KV, int KH, int DK, int DKP, int DV, int DVP, int BN>
static __device__ __forceinline__ void kcu_fd_rows(unsigned short *__restrict__ kdst, unsigned short *__restrict__ vdst,
                                                   const KV *__restrict__ kbase, const KV *__restrict__ vbase,
                                                   const int *__restrict__ table, const int block_size, const int bsh,
                                                   const int p0, const int hi, const int lane,
                                                   const float *__restrict__ ksc = nullptr,
                                                   const float *__restrict__ vsc = nullptr)
{
    typedef kcu_fa_rows<DKP> KL;
    typedef kcu_fa_rows<DVP> VL;
    enum { CH = (int)KL::CH > (int)VL::CH ? (int)KL::CH : (int)VL::CH };
    static_assert(BN <= 32 && (BN * CH) % 32 == 0, "kcu_fd_rows: every lane takes as many chunks");
    const int pr = p0 + lane % BN;
    const int mine = pr <= hi ? (int)kcu_fa_slot(table, block_size, bsh, pr) : 0;
#pragma unroll
    for (int i = lane; i < BN * CH; i += 32) {
        const int r = i / CH, ch = i % CH;
        const long long slot = kcu_fd_shfl(mine, r);
        const bool valid = p0 + r <= hi;
        kcu_fa_kv_chunk<MT, KV, KH, DK, DKP, DV, DVP>(kdst, vdst, kbase, vbase, r, ch, slot, valid, ksc, vsc);
    }
}

/*
 * kcu_flash_decode: attention of token blockIdx.x for the GROUP = H / KH q heads of kv head
 * blockIdx.y (rows 0 .. GROUP - 1 of one m16 tile; the others zero), over positions [lo, pos] of
 * its sequence, on a grid [T, KH, S] of NW warps (z: a cluster's blocks on sm_90; elsewhere
 * block z = 0 takes every position and the others return). The positions go in chunks of BN
 * (16) to the virtual warps round robin, chunk c to warp c % (vsplit NW): in a decode step (T <=
 * WIDE_T) vsplit, the token's virtual blocks, is the fewest (at most S; at most SLOTS without
 * clusters) that take the chunks in at most RV rounds of their warps, else 1 — a function of the
 * token's length and of whether T <= WIDE_T alone, so that a token's result does not depend on
 * what else its step holds. P of the cluster's blocks walk them (block z: virtual blocks z, z + P,
 * ..., each state kept in a slot): every virtual block its own block where the step's blocks
 * stay within KCU_FD_WAVE, else as many as take the chunks in R rounds (at least vsplit / SLOTS),
 * so that a step of many sequences of a few hundred positions fills the GPU with a few working
 * blocks a sequence, not S blocks of a chunk each; blocks past P end at once (an exited block
 * counts as arrived at the cluster's barriers, and no block reads their shared memory). Each warp copies its chunks into its
 * own ring of NS K and V tiles (cp.async, NS - 1 in flight while it multiplies one), forms
 * s = q k^T (q's A fragments in registers, K rows as B fragments by ldmatrix), an online softmax
 * per row in f32 (exponentials in base 2, as kcu_flash_attention), and o += p v (p rounded to MT:
 * the C fragments are the A fragment; V by ldmatrix.trans). At the end of a virtual block its
 * warps' states are combined in warp order in double, then (split) the virtual blocks' in their
 * order by the first block, through distributed shared memory (kcu_cluster_combine). Shapes as kcu_attention; MT the tensor cores' type.
 */
template <typename MT, typename Q, typename KV, typename O, int H, int KH, int DK, int DV, int NW, int BN, int NS,
          int SLOTS, int S, int WINDOW, int WIDE_T, int R = KCU_FD_ROUNDS, int RV = KCU_FD_VROUNDS,
          typename SK = float>
static __device__ __forceinline__ void kcu_flash_decode(const int T, const Q *__restrict__ q, const KV *__restrict__ kc,
                                                        const KV *__restrict__ vc, O *__restrict__ out,
                                                        const int *__restrict__ positions,
                                                        const int *__restrict__ table_off,
                                                        const int *__restrict__ tables, const int block_size,
                                                        const float scale, const float softcap,
                                                        const float *__restrict__ alibi = nullptr,
                                                        const SK *__restrict__ sinks = nullptr,
                                                        const float *__restrict__ ksc = nullptr,
                                                        const float *__restrict__ vsc = nullptr)
{
#if KCU_MMA
    typedef kcu_fd_smem_of<DK, DV, NW, BN, NS> L;
    enum {
        GROUP = H / KH,
        NT = 32 * NW,
        DKP = L::DKP,
        DVP = L::DVP,
        KC = DKP / 16, /* k16 slices of q k */
        VN = DVP / 8,  /* 8-column tiles of the output */
        KT = L::KT,
        VT = L::VT
    };
    /* the virtual blocks a token's positions may split into (walked by one block where there are no clusters) */
    enum { SPLIT = KCU_CLUSTERS ? S : (S < SLOTS ? S : SLOTS), SG = SPLIT > 1 ? GROUP : 1 };
    typedef kcu_fa_rows<DKP> KL;
    typedef kcu_fa_rows<DVP> VL;
    static_assert(H % KH == 0 && GROUP <= 16 && BN == 16 && NS >= 2 && NS <= 4, "kcu_flash_decode: shapes");
    static_assert(NW * GROUP * (DV + 2) * 4 + NW * GROUP * 8 + GROUP * 4 <= (int)L::BYTES,
                  "kcu_flash_decode: the warps' states and weights fit the ring");
#ifdef KILN_EMU_SHIM_H
    static uint4 dyn[L::BYTES / 16]; /* blocks run one at a time */
#else
    extern __shared__ uint4 kcu_fa_dyn[];
    uint4 *const dyn = kcu_fa_dyn;
#endif
    static_assert(SLOTS >= 1 && SLOTS * SG * (SPLIT > 1 ? DV : 1) * 8 <= 32768, "kcu_flash_decode: the slots' states");
    __shared__ float bmax[SLOTS][SG];                      /* split: a virtual block's maximum per row (times fac) */
    __shared__ double bsum[SLOTS][SG];                     /* and its sum of exponentials relative to it */
    __shared__ double bacc[SLOTS][SG][SPLIT > 1 ? DV : 1]; /* and its outputs so */
    __shared__ double gbuf[SG][SPLIT];                     /* the first block's weight of each virtual block's state */
    const float ninf = -__int_as_float(0x7f800000);
    const float fac = softcap > 0.0f ? 1.4426950408889634f : scale * 1.4426950408889634f;
    const int t = blockIdx.x, kh = blockIdx.y, h0 = kh * GROUP;
    const int tid = threadIdx.x, w = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
    if (!KCU_CLUSTERS && blockIdx.z > 0) return;
#if defined(__CUDA_ARCH__)
    if (tid == 0) {
        unsigned dyn_bytes;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn_bytes));
        if (dyn_bytes < (unsigned)L::BYTES) __trap(); /* launched with less than the layout needs */
    }
#endif
    const int pos = positions[t];
    const int lo = WINDOW > 0 && pos - WINDOW + 1 > 0 ? pos - WINDOW + 1 : 0;
    const int chunks = (pos - lo + BN) / BN;
    static_assert(R >= 1, "kcu_flash_decode: at least a round a warp");
    /* the token's virtual blocks: as many as take its chunks in RV rounds of their warps (a function of
     * its length alone); the cluster's blocks that walk them: all where the step's blocks make at most
     * KCU_FD_WAVE, else as many as take the chunks in R rounds, and enough that each walks at most SLOTS */
    static_assert(RV >= 1, "kcu_flash_decode: at least a round a virtual block");
    const int vneed = (chunks + RV * NW - 1) / (RV * NW);
    const int vsplit = SPLIT > 1 && T <= WIDE_T ? (vneed < SPLIT ? vneed : SPLIT) : 1;
    int P = 1;
    if (KCU_CLUSTERS && vsplit > 1) {
        const int need = (chunks + R * NW - 1) / (R * NW); /* blocks for at most R rounds each */
        P = (long long)T * KH * vsplit <= KCU_FD_WAVE ? vsplit : need < vsplit ? need : vsplit;
        if (P * SLOTS < vsplit) P = (vsplit + SLOTS - 1) / SLOTS;
    }
    const unsigned z = kcu_cluster_rank();
    if ((int)z >= P) return;
    const int vwn = vsplit * NW;
    const int rounds = (chunks + vwn - 1) / vwn; /* the same in every warp of the block */
    const int *table = tables + table_off[t];
    const KV *kbase = kc + (long long)kh * DK, *vbase = vc + (long long)kh * DV;
    const float *ksb = ksc ? ksc + kh : nullptr, *vsb = vsc ? vsc + kh : nullptr; /* a cache of codes' scales */
    int bsh = -1;
    if (block_size > 0 && (block_size & (block_size - 1)) == 0)
        for (bsh = 0; 1 << bsh < block_size;) bsh++;
    unsigned short *const ks = reinterpret_cast<unsigned short *>(dyn) + w * L::WARP, *const vs = ks + NS * KT;

    /* q's A fragments: row g (head h0 + g), g + 8; dims 16 kk + 2c, + 1 and + 8 */
    unsigned qf[KC][4];
#pragma unroll
    for (int kk = 0; kk < KC; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int row = g + 8 * (i & 1), d = 16 * kk + 8 * (i >> 1) + 2 * c;
            const Q *qr = q + ((long long)t * H + h0 + row) * DK;
            const unsigned short lo16 = row < GROUP && d < DK ? kcu_fa_cvt<MT, Q>::bits(qr[d]) : 0;
            const unsigned short hi16 = row < GROUP && d + 1 < DK ? kcu_fa_cvt<MT, Q>::bits(qr[d + 1]) : 0;
            qf[kk][i] = lo16 | (unsigned)hi16 << 16;
        }
    float sl[2] = {0.0f, 0.0f}; /* ALiBi's slope of rows g, g + 8, in the scores' units */
    if (alibi)
#pragma unroll
        for (int x = 0; x < 2; x++)
            sl[x] = g + 8 * x < GROUP ? alibi[h0 + g + 8 * x] * (softcap > 0.0f ? 1.0f : 1.0f / scale) : 0.0f;
    /* ldmatrix addresses (kcu_flash_attention's): K rows 8 (i / 2) ..+ 8, chunk 2 kk + i % 2; V
     * (transposed) rows 8 (i % 2) ..+ 8, chunk 2 j + i / 2; at buffer 0 */
    const int lrow = ((lane / 8) % 2) * 8 + lane % 8, krow = (lane / 16) * 8 + lane % 8;
    kcu_fa_sptr ka[4], va[4];
#pragma unroll
    for (int k4 = 0; k4 < 4; k4++) {
        ka[k4] = kcu_fa_sp(ks) + 2 * (krow * KL::STRIDE + KL::lane_chunk(k4, (lane / 8) % 2, lane));
        va[k4] = kcu_fa_sp(vs) + 2 * (lrow * VL::STRIDE + VL::lane_chunk(k4, lane / 16, lane));
    }

    /* the block's virtual blocks z, z + P, ..., each into its slot: its warps' chunks, their states
     * combined in warp order */
    for (int vb = (int)z, slot = 0; vb < vsplit; vb += P, slot++) {
    const int vw = vb * NW + w;
    /* the first chunks in flight, a commit group each (empty past the warp's last) */
#pragma unroll
    for (int st = 0; st < NS - 1; st++) {
        const int p0 = lo + (st * vwn + vw) * BN;
        if (st < rounds && kcu_fa_any(p0 <= pos))
            kcu_fd_rows<MT, KV, KH, DK, DKP, DV, DVP, BN>(ks + st * KT, vs + st * VT, kbase, vbase, table, block_size,
                                                          bsh, p0, pos, lane, ksb, vsb);
        kcu_fa_commit();
    }
    float m[2] = {ninf, ninf}, l[2] = {0.0f, 0.0f}; /* rows g, g + 8: running maximum, the lane's part of the sum */
    float o[VN][4];
#pragma unroll
    for (int j = 0; j < VN; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[j][e] = 0.0f;
    for (int it = 0; it < rounds; it++) {
        const int p0 = lo + (it * vwn + vw) * BN, buf = it % NS;
        kcu_fa_wait<NS - 2>();
        kcu_syncwarp(); /* chunk it landed for every lane; every lane is done with chunk it - 1's buffers */
        {
            const int nx = it + NS - 1, n0 = lo + (nx * vwn + vw) * BN;
            if (nx < rounds && kcu_fa_any(n0 <= pos))
                kcu_fd_rows<MT, KV, KH, DK, DKP, DV, DVP, BN>(ks + nx % NS * KT, vs + nx % NS * VT, kbase, vbase, table,
                                                              block_size, bsh, n0, pos, lane, ksb, vsb);
            kcu_fa_commit();
        }
        if (!kcu_fa_any(p0 <= pos)) continue; /* past the warp's last chunk (the same in every lane) */
        float s[2][4];
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[j][e] = 0.0f;
        const int kb = 2 * buf * KT, vb = 2 * buf * VT;
#pragma unroll
        for (int kk = 0; kk < KC; kk++) {
            unsigned b[4];
            kcu_fa_ldmatrix<false>(b, ka[kk % 4] + kb + 2 * 64 * (kk / 4));
            kcu_fa_mma<MT>(s[0], qf[kk], b[0], b[1]);
            kcu_fa_mma<MT>(s[1], qf[kk], b[2], b[3]);
        }
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = s[j][e];
                if (softcap > 0.0f) v = softcap * tanhf(v * scale / softcap);
                const int p = p0 + 8 * j + 2 * c + (e & 1);
                if (alibi) v += sl[e >> 1] * (float)p;
                s[j][e] = p <= pos ? v : ninf;
            }
        float alpha[2];
        bool same = true;
#pragma unroll
        for (int x = 0; x < 2; x++) {
            const float mx = fmaxf(fmaxf(s[0][2 * x], s[0][2 * x + 1]), fmaxf(s[1][2 * x], s[1][2 * x + 1]));
            float mf;
            alpha[x] = kcu_fa_rescale(m[x], l[x], mx, fac, mf);
            same = same && alpha[x] == 1.0f;
#pragma unroll
            for (int j = 0; j < 2; j++) {
                s[j][2 * x] = kcu_fa_exp2(fmaf(s[j][2 * x], fac, -mf));
                s[j][2 * x + 1] = kcu_fa_exp2(fmaf(s[j][2 * x + 1], fac, -mf));
                l[x] += s[j][2 * x] + s[j][2 * x + 1];
            }
        }
        if (!kcu_fa_all(same))
#pragma unroll
            for (int j = 0; j < VN; j++) {
                o[j][0] *= alpha[0], o[j][1] *= alpha[0];
                o[j][2] *= alpha[1], o[j][3] *= alpha[1];
            }
        unsigned pa[4];
#pragma unroll
        for (int i = 0; i < 4; i++) pa[i] = kcu_fa_pack<MT>(s[i >> 1][2 * (i & 1)], s[i >> 1][2 * (i & 1) + 1]);
#pragma unroll
        for (int j = 0; j < VN; j += 2) {
            unsigned b[4];
            kcu_fa_ldmatrix<true>(b, va[(j / 2) % 4] + vb + 2 * 64 * ((j / 2) / 4));
            kcu_fa_mma<MT>(o[j], pa, b[0], b[1]);
            kcu_fa_mma<MT>(o[j + 1], pa, b[2], b[3]);
        }
    }

    /* the warps' states, through the ring's memory: row r's maximum (times fac), sum, outputs */
    kcu_fa_wait<0>();
    __syncthreads(); /* every warp is done with its ring (and its copies landed) */
    float *const wm = reinterpret_cast<float *>(dyn);  /* [NW][GROUP] */
    float *const wl = wm + NW * GROUP;                 /* [NW][GROUP] */
    float *const wo = wl + NW * GROUP;                 /* [NW][GROUP][DV] */
#pragma unroll
    for (int x = 0; x < 2; x++) {
        l[x] += __shfl_xor_sync(0xffffffffu, l[x], 1);
        l[x] += __shfl_xor_sync(0xffffffffu, l[x], 2);
        const int row = g + 8 * x;
        if (row >= GROUP) continue;
        if (c == 0) wm[w * GROUP + row] = m[x] == ninf ? ninf : m[x] * fac, wl[w * GROUP + row] = l[x];
#pragma unroll
        for (int j = 0; j < VN; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int d = 8 * j + 2 * c + e;
                if (d < DV) wo[(w * GROUP + row) * DV + d] = o[j][2 * x + e];
            }
    }
    /* each row's maximum over the warps, then each (warp, row)'s weight 2^(m - M) once (0: a warp with
     * no position), not once an output (a double exp2 each: ~1 us a block at GROUP x DV = 512) */
    double *const wf = reinterpret_cast<double *>(wo + NW * GROUP * DV); /* [NW][GROUP] */
    float *const wmx = reinterpret_cast<float *>(wf + NW * GROUP);      /* [GROUP] */
    __syncthreads();
    if (tid < GROUP) {
        float mx = ninf;
        for (int v = 0; v < NW; v++) mx = fmaxf(mx, wm[v * GROUP + tid]);
        wmx[tid] = mx;
    }
    __syncthreads();
    if (tid < NW * GROUP) {
        const float mv = wm[tid];
        wf[tid] = mv == ninf ? 0.0 : exp2((double)mv - (double)wmx[tid % GROUP]);
    }
    __syncthreads();
    for (int i = tid; i < GROUP * DV; i += NT) {
        const int row = i / DV, d = i % DV;
        const float mx = wmx[row];
        double sum = 0.0, acc = 0.0;
        for (int v = 0; v < NW; v++) {
            const double f = wf[v * GROUP + row];
            sum += (double)wl[v * GROUP + row] * f;
            acc += (double)wo[(v * GROUP + row) * DV + d] * f;
        }
        if constexpr (SPLIT > 1) {
            if (vsplit > 1) { /* the virtual block's state, relative to its maximum */
                bacc[slot][row][d] = acc;
                if (d == 0) bsum[slot][row] = sum, bmax[slot][row] = mx;
                continue;
            }
        }
        if (sinks) /* the sink's 2^(sink log2 e - M), in the scores' log2 units */
            sum += exp2((double)kcu_f(sinks[h0 + row]) * 1.4426950408889634 - (double)mx);
        kcu_fa_store(out + ((long long)t * H + h0 + row) * DV + d, (float)(acc / sum));
    }
    __syncthreads(); /* the ring's memory read: the next virtual block's copies may land in it */
    }
    /* the virtual blocks' states combined in their order by the first block: g_v = 2^(bmax_v - M) (bmax
     * in log2 units); state v in block v % P, slot v / P */
    if constexpr (SPLIT > 1) {
        if (vsplit == 1) return;
        kcu_cluster_combine<GROUP, DV, SPLIT, SLOTS, NT>(
            z, vsplit, P, bmax, bsum, bacc, gbuf, [](float mb, float mx) { return exp2((double)mb - (double)mx); },
            [&](int row, int d, float v) { kcu_fa_store(out + ((long long)t * H + h0 + row) * DV + d, v); },
            [&](int row) { return sinks ? kcu_f(sinks[h0 + row]) * 1.4426950408889634f : ninf; });
    }
#else
    (void)T, (void)q, (void)kc, (void)vc, (void)out, (void)positions, (void)table_off, (void)tables;
    (void)block_size, (void)scale, (void)softcap, (void)alibi, (void)sinks;
    __trap(); /* before sm_80: kcu_emit_attention does not launch it there */
#endif
}
