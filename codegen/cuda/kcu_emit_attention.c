/*
 * kcu_emit_attention.c — the KV cache's writes and attention over the paged
 * cache (codegen/cuda/kcu_gen.h).
 *
 * Requires: a verified graph; an attention node's operands [T,H,D],
 * [T,KH,D], [T,KH,Dv] with H a multiple of KH. Guarantees: every output
 * element summed in a fixed order (no atomics): reproducible bit for bit.
 */
#include "codegen/cuda/kcu_gen.h"

#include <math.h>

/* Attention: threads per (token, head) block. */
enum { ATT_THREADS = 128 };

/* The kernel that writes a step's K and V rows into layer `layer` of the
 * cache (its kv_k/kv_v arguments), at each token's slot; k and v are
 * values kv and vv. */
void kcu_emit_kv_write_kernel(kcu_gen *x, kir_val v, const char *suffix, kir_val kv, kir_val vv, int64_t layer)
{
    const kir_node *kn = &x->g->nodes[kv], *vn = &x->g->nodes[vv];
    int64_t krow = kir_row_elems(kn), vrow = kir_row_elems(vn);
    krt_cuda_kernel *k = kcu_elementwise_kernel(x, v, krow + vrow);
    kcu_param_in(x, k, kv, "k");
    kcu_param_in(x, k, vv, "v");
    kcu_add_param(x, k, KRT_CUDA_ARG_KV_K, layer, "float *__restrict__ kc");
    kcu_add_param(x, k, KRT_CUDA_ARG_KV_V, layer, "float *__restrict__ vc");
    kcu_add_param(x, k, KRT_CUDA_ARG_SLOTS, 0, "const int *__restrict__ slots");
    kcu_open_body(x, k, "K and V rows of the step into a layer of the KV cache (kc, vc), at each token's slot");
    kcu_elementwise_prologue(x, krow + vrow);
    ks_buf_printf(&x->body,
                  "    enum { KROW = %lld, VROW = %lld };\n"
                  "    const long long t = i / (KROW + VROW), e = i %% (KROW + VROW), slot = slots[t];\n"
                  "    if (e < KROW)\n"
                  "        kc[slot * KROW + e] = k[t * KROW + e];\n"
                  "    else\n"
                  "        vc[slot * VROW + e - KROW] = v[t * VROW + e - KROW];\n"
                  "}\n",
                  (long long)krow, (long long)vrow);
    kcu_kernel_end(x, k, suffix);
}

/*
 * Attention over the paged cache: one block per (token, head). Positions
 * [lo, pos] of the token's sequence are read through its block table. Three
 * passes over the keys, each recomputing the scores (no score buffer): the
 * maximum, the sum of exponentials (double, fixed tree), then
 * probabilities a chunk at a time into shared memory and the weighted sum of
 * V rows, in position order for every output element, as the interpreter.
 */
int kcu_emit_attention(kcu_gen *x, kir_val v)
{
    const kir_graph *g = x->g;
    const kir_node *n = &g->nodes[v];
    const kir_node *qn = &g->nodes[n->in[0]], *kn = &g->nodes[n->in[1]], *vn = &g->nodes[n->in[2]];
    int64_t heads = qn->dims[1], dk = qn->dims[2], kv_heads = kn->dims[1], dv = vn->dims[2];
    int64_t layer = kir_get_int(g, v, "layer", 0), window = kir_get_int(g, v, "window", 0);
    float scale = (float)kir_get_float(g, v, "scale", 1.0 / sqrt((double)dk));
    float softcap = (float)kir_get_float(g, v, "softcap", 0.0);
    if (layer < 0 || layer >= INT32_MAX) return kcu_node_error(x, v, "layer %lld is out of range", (long long)layer);
    if (softcap < 0.0f) return kcu_node_error(x, v, "softcap must not be negative");
    if (kir_get_int(g, v, "write_kv", 1) != 0) kcu_emit_kv_write_kernel(x, v, "_kv_write", n->in[1], n->in[2], layer);

    krt_cuda_kernel *k = kcu_kernel_new(x, v, ATT_THREADS);
    ks_buf_printf(&x->body, "\n/* a score: q . k(position p) * scale%s */\n", softcap > 0.0f ? ", soft-capped" : "");
    ks_buf_printf(&x->body,
                  "static __device__ float " NAME_MARK "_score(const float *qs, const float *__restrict__ kc, const int *table,\n"
                  "                                   int block_size, int p, int kh)\n{\n"
                  "    const long long slot = (long long)table[p / block_size] * block_size + p %% block_size;\n"
                  "    float s = kcu_dot(qs, kc + slot * %lld + kh * %lld, %lld) * ",
                  (long long)(kv_heads * dk), (long long)dk, (long long)dk);
    kcu_put_float(&x->body, scale);
    ks_buf_puts(&x->body, ";\n");
    if (softcap > 0.0f) {
        ks_buf_puts(&x->body, "    s = ");
        kcu_put_float(&x->body, softcap);
        ks_buf_puts(&x->body, " * (float)tanh((double)(s / ");
        kcu_put_float(&x->body, softcap);
        ks_buf_puts(&x->body, "));\n");
    }
    ks_buf_puts(&x->body, "    return s;\n}\n");

    kcu_kernel_grid(k, 0, 1, 0, 1);
    kcu_kernel_grid(k, 1, 0, heads, 1);
    kcu_param_in(x, k, n->in[0], "q");
    kcu_add_param(x, k, KRT_CUDA_ARG_KV_K, layer, "const float *__restrict__ kc");
    kcu_add_param(x, k, KRT_CUDA_ARG_KV_V, layer, "const float *__restrict__ vc");
    kcu_param_out(x, k, v);
    kcu_add_param(x, k, KRT_CUDA_ARG_POSITIONS, 0, "const int *__restrict__ positions");
    kcu_add_param(x, k, KRT_CUDA_ARG_TABLE_OFF, 0, "const int *__restrict__ table_off");
    kcu_add_param(x, k, KRT_CUDA_ARG_TABLES, 0, "const int *__restrict__ tables");
    kcu_add_param(x, k, KRT_CUDA_ARG_BLOCK_SIZE, 0, "int block_size");
    kcu_open_body(x, k, "causal attention over a layer of the paged KV cache (kc, vc), one block per (token, head)");
    ks_buf_printf(&x->body,
                  "    enum { H = %lld, DK = %lld, DV = %lld, GROUP = %lld, VROW = %lld, WINDOW = %lld, NT = %d,\n"
                  "           R = (DV + NT - 1) / NT };\n"
                  "    __shared__ float qs[DK];\n"
                  "    __shared__ float p[NT];\n"
                  "    __shared__ float redf[NT];\n"
                  "    __shared__ double red[NT];\n"
                  "    const int t = blockIdx.x, h = blockIdx.y, kh = h / GROUP, tid = threadIdx.x;\n"
                  "    const int pos = positions[t];\n"
                  "    const int lo = WINDOW > 0 && pos - WINDOW + 1 > 0 ? pos - WINDOW + 1 : 0;\n"
                  "    const int len = pos - lo + 1;\n"
                  "    const int *table = tables + table_off[t];\n"
                  "    for (int i = tid; i < DK; i += NT) qs[i] = q[((long long)t * H + h) * DK + i];\n"
                  "    __syncthreads();\n"
                  "    /* 1. the largest score */\n"
                  "    float m = -__int_as_float(0x7f800000);\n"
                  "    for (int j = tid; j < len; j += NT) {\n"
                  "        const float s = " NAME_MARK "_score(qs, kc, table, block_size, lo + j, kh);\n"
                  "        if (s > m) m = s;\n"
                  "    }\n"
                  "    redf[tid] = m;\n"
                  "    __syncthreads();\n"
                  "    for (int s = NT / 2; s > 0; s >>= 1) {\n"
                  "        if (tid < s && redf[tid + s] > redf[tid]) redf[tid] = redf[tid + s];\n"
                  "        __syncthreads();\n"
                  "    }\n"
                  "    m = redf[0];\n"
                  "    /* 2. the sum of exponentials, each rounded to float first as the interpreter stores them */\n"
                  "    double sum = 0.0;\n"
                  "    for (int j = tid; j < len; j += NT)\n"
                  "        sum += (float)exp((double)(" NAME_MARK "_score(qs, kc, table, block_size, lo + j, kh) - m));\n"
                  "    red[tid] = sum;\n"
                  "    __syncthreads();\n"
                  "    for (int s = NT / 2; s > 0; s >>= 1) {\n"
                  "        if (tid < s) red[tid] += red[tid + s];\n"
                  "        __syncthreads();\n"
                  "    }\n"
                  "    sum = red[0];\n"
                  "    /* 3. out = sum_j p_j v_j, positions in order */\n"
                  "    float acc[R];\n"
                  "#pragma unroll\n"
                  "    for (int r = 0; r < R; r++) acc[r] = 0.0f;\n"
                  "    for (int j0 = 0; j0 < len; j0 += NT) {\n"
                  "        if (j0 + tid < len) {\n"
                  "            const float e = (float)exp((double)(" NAME_MARK "_score(qs, kc, table, block_size, lo + j0 + tid, kh) - m));\n"
                  "            p[tid] = (float)(e / sum);\n"
                  "        }\n"
                  "        __syncthreads();\n"
                  "        const int n = len - j0 < NT ? len - j0 : NT;\n"
                  "        for (int jj = 0; jj < n; jj++) {\n"
                  "            const int ps = lo + j0 + jj;\n"
                  "            const long long slot = (long long)table[ps / block_size] * block_size + ps %% block_size;\n"
                  "            const float *vj = vc + slot * VROW + kh * DV;\n"
                  "#pragma unroll\n"
                  "            for (int r = 0; r < R; r++)\n"
                  "                if (tid + r * NT < DV) acc[r] += p[jj] * vj[tid + r * NT];\n"
                  "        }\n"
                  "        __syncthreads();\n"
                  "    }\n"
                  "#pragma unroll\n"
                  "    for (int r = 0; r < R; r++)\n"
                  "        if (tid + r * NT < DV) out[((long long)t * H + h) * DV + tid + r * NT] = acc[r];\n"
                  "}\n",
                  (long long)heads, (long long)dk, (long long)dv, (long long)(heads / kv_heads),
                  (long long)(kv_heads * dv), (long long)window, ATT_THREADS);
    kcu_kernel_end(x, k, "");
    return 0;
}

