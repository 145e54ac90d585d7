/*
 * kcu_emit_g90.c — kcu_gemm90's column tiles for a fused matmul group
 * (codegen/cuda/kcu.h: kcu_g90_plan_tiles), and its tile rule.
 *
 * Requires: partner[c] for every column c of the matmul (kcu_emit_group.c's
 * pairing: a rotation's pair, gate with up, else a neighbour; -1 only for the
 * last column of an odd N). Guarantees: tiles that hand every column to the
 * epilogue exactly once, with its partner in the same thread: a tile is
 * nbox TMA boxes of R = bn / nbox weight rows (R % 8 == 0: the 128-byte
 * swizzle repeats every 8 rows, so boxes stack into one B operand), either
 * neighbours (columns 2p, 2p + 1 of the tile) or split (the first bn / 2
 * columns are first columns of pairs, the last bn / 2 their partners, in
 * the same order: wgmma's D layout gives a thread columns n and n + bn / 2).
 * Weights stay as the model stores them: no permuted copy, and the other
 * kernels of the group are untouched.
 *
 * Why boxes rather than a permuted weight: Llama's q and k pair columns j
 * and j + 64 of each 128-column head (RoPE "halves") and gate/up pair c
 * with c + 14336; a tile of bn = 256 takes the first halves of two heads
 * (two boxes of 64 rows) and their second halves (two more), or 128 gate
 * rows and the 128 up rows at the same place (two boxes). A permuted copy
 * would have had the engine writer store CUDA-only weights and every CUDA
 * kernel of the group read them permuted.
 *
 * Does not: mix neighbours and split pairs in one tile (a tile of each
 * kind; a short tile at the end of a run leaves boxes unused), or take
 * boxes of fewer than 8 rows (a head dim of 16 rotated by halves: none).
 */
#include "codegen/cuda/kcu.h"

#include <stdlib.h>
#include <string.h>

enum { MAX_BOXES = 16 };

/* Columns [c, c + R) are uncovered neighbour pairs (or run past N, or hold the single last column). */
static int neighbours(const int64_t *partner, const uint8_t *covered, int64_t N, int64_t c, int R)
{
    for (int64_t q = c; q < c + R && q < N; q++) {
        if (covered[q]) return 0;
        int64_t want = (q - c) % 2 ? q - 1 : q + 1;
        if (partner[q] != want && !(partner[q] < 0 && q == N - 1)) return 0;
    }
    return 1;
}

/* Columns [c, c + R) and their partners at c + D .. are uncovered split pairs. */
static int split_run(const int64_t *partner, const uint8_t *covered, int64_t N, int64_t c, int R, int64_t D)
{
    if (c + R > N || c + D + R > N) return 0;
    for (int64_t q = c; q < c + R; q++)
        if (covered[q] || covered[q + D] || partner[q] != q + D) return 0;
    return 1;
}

static int plan_with(const int64_t *partner, int64_t N, int bn, int nbox, kcu_g90_tiles *t)
{
    const int R = bn / nbox;
    uint8_t *covered = ks_xcalloc((size_t)N, 1);
    int cap = 64, nt = 0, ok = 1;
    int *table = ks_xmalloc(sizeof *table * (size_t)cap * (size_t)(nbox + 1));
    for (int64_t c = 0; c < N && ok;) {
        if (covered[c]) {
            c++;
            continue;
        }
        if (nt == cap) {
            cap *= 2;
            table = realloc(table, sizeof *table * (size_t)cap * (size_t)(nbox + 1));
            KS_ASSERT(table);
        }
        int *row = table + (size_t)nt * (size_t)(nbox + 1), used = 0;
        for (int i = 0; i < nbox; i++) row[1 + i] = -1;
        int64_t p = partner[c];
        if (p < 0 || p == c + 1) {
            /* neighbours: boxes one after another while their columns are neighbour pairs */
            row[0] = 0;
            for (int64_t b = c; used < nbox && b < N && neighbours(partner, covered, N, b, R); b += R) {
                row[1 + used++] = (int)b;
                for (int64_t q = b; q < b + R && q < N; q++) covered[q] = 1;
            }
        } else if (p > c + 1 && nbox % 2 == 0) {
            /* split: first columns in boxes, their partners in the boxes of the second half */
            const int64_t D = p - c;
            row[0] = 1;
            for (int64_t b = c; used < nbox / 2 && b < N;) {
                if (covered[b]) {
                    b++;
                    continue;
                }
                if (partner[b] != b + D || !split_run(partner, covered, N, b, R, D)) break;
                row[1 + used] = (int)b;
                row[1 + nbox / 2 + used] = (int)(b + D);
                used++;
                for (int64_t q = b; q < b + R; q++) covered[q] = covered[q + D] = 1;
                b += R;
            }
        }
        if (used == 0) ok = 0;
        nt++;
    }
    free(covered);
    if (!ok || N > INT32_MAX / 2) {
        free(table);
        return -1;
    }
    int plain = nbox == 1;
    for (int y = 0; y < nt && plain; y++) plain = table[2 * y] == 0 && table[2 * y + 1] == y * bn;
    *t = (kcu_g90_tiles){bn, nbox, nt, plain, plain ? NULL : table};
    if (plain) free(table);
    return 0;
}

int kcu_g90_plan_tiles(const int64_t *partner, int64_t N, int bn, kcu_g90_tiles *t)
{
    memset(t, 0, sizeof *t);
    /* the fewest boxes that fit: whole boxes load faster than many small ones */
    for (int nbox = 1; nbox <= MAX_BOXES; nbox++) {
        if (bn % nbox || (bn / nbox) % 8) continue;
        if (plan_with(partner, N, bn, nbox, t) == 0) return 0;
    }
    return -1;
}

const int kcu_g90_widths[KCU_G90_WIDTHS] = {64, 128, 192, 224, 256};

/* The tile rule. A step of m token tiles at width w runs m nt(w) blocks, one an SM at a time, in
 * waves of G90_SMS (the SMs of the sm_90 GPUs kiln targets: H100 SXM, H200, GH200; the engine's
 * tiles are chosen for them), each wave taking about w / eff(w) (a tile's time at full waves,
 * relative: measured on the H200, cuda_gemm90_check beside cuBLAS at 2048 tokens, 128 at 0.90 of
 * 256's TFLOP/s, 192 at 0.92, 224 at 0.96). The width of least waves x w / eff(w), the wider on a
 * tie. Measured before (the widest giving at least 119 tiles): gate/up at 512 tokens in 448 tiles
 * of 256, 3.4 waves (4: 85 % of the SMs busy), 650 TFLOP/s, 0.88 of cuBLAS; after, 512 tiles of
 * 224 in 3.9 waves, 706 (0.92; bench/RESULTS.md, issue #10 step 6). Tiles of 64 (eff 0.55, assumed:
 * a stage's x tile is twice its w tile, so the SM waits on L2 more) for short steps of narrow
 * matmuls: o and down at 128 tokens ran 32 tiles of 128 on the 132 SMs; alone at 128 tokens
 * (cuda_gemm90_check, step 7 call 1) o 281 against 177 TFLOP/s with 64 tiles, down 305 against 200,
 * q,k,v 341 against 250 (cuBLAS: 232, 389, 339). */
enum { G90_SMS = 132 };
double kcu_g90_cost(int64_t T, int bn, int nt)
{
    static const double eff[KCU_G90_WIDTHS] = {0.55, 0.90, 0.92, 0.96, 1.0};
    int i = 0;
    while (i < KCU_G90_WIDTHS - 1 && kcu_g90_widths[i] != bn) i++;
    KS_ASSERT(kcu_g90_widths[i] == bn && nt > 0);
    int64_t waves = ((T + 127) / 128 * nt + G90_SMS - 1) / G90_SMS;
    return (double)waves * bn / eff[i];
}

int kcu_g90_pick_bn(int64_t T, const int nt[KCU_G90_WIDTHS])
{
    int best = 0;
    double best_cost = 0.0;
    for (int i = 0; i < KCU_G90_WIDTHS; i++) {
        if (nt[i] <= 0) continue;
        double cost = kcu_g90_cost(T, kcu_g90_widths[i], nt[i]);
        if (best == 0 || cost <= best_cost) best = kcu_g90_widths[i], best_cost = cost;
    }
    return best;
}

int kcu_g90_stages(int bn)
{
    return bn >= 256 ? 4 : bn >= 192 ? 5 : bn >= 128 ? 6 : 8;
}

int kcu_g90_smem_bytes(int bn, int stages)
{
    int ring = stages * (128 + bn) * 128, tile = 128 * (bn + 8) * 4;
    return (ring > tile ? ring : tile) + 1024;
}
