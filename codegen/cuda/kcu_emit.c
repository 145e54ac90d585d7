/*
 * kcu_emit.c — CUDA C for each compute node of a graph (codegen/cuda/kcu.h).
 *
 * Requires: a graph kir_verify accepts. Guarantees: one launch per compute
 * node (two for an attention that writes the KV cache: the write, then the
 * attention, since blocks of one launch are not ordered), every dimension
 * but T a literal; views that do not move data (reshape, the output,
 * kv_write's pass-through value) get no kernel and share their operand's
 * buffer (meta aliases). Kernels are shared: a kernel's text is written
 * with a placeholder for its name, and nodes whose texts are equal (same
 * op, shapes, dtypes and attributes; layers differ only in arguments) get
 * one kernel, named k_<op>_<hash of the text>, compiled once; the launch
 * table lists it once per node. Does not: fuse (the `fuse` attribute is
 * ignored), or follow the memory plan (mem.* attributes: the backend gives
 * each value its own buffer).
 *
 * Weights may be f32, bf16 or f16 (read through kcu_f(), kcu_prelude.cuh);
 * activations and the KV cache are f32. Matmuls are kcu_matmul (prelude);
 * the other kernels follow ir/interp_kernels.c operation by operation, and
 * where one parallelizes a reduction (norms, the softmax's sum and max) it
 * uses a fixed tree, so results do not depend on timing.
 */
#include "codegen/cuda/kcu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ir/interp_kernels.h" /* kir_rope_inv_freq: the reference's frequencies, reused */

/* Threads per block of elementwise kernels. */
enum { EW_THREADS = 256 };
/* Matmuls (kcu_matmul in kcu_prelude.cuh, whose KCU_MM_THREADS, KCU_GEMV_T
 * and KCU_GEMV_R these repeat): threads per block, the most tokens of the
 * decode path, and rows per warp there. */
enum { MM_THREADS = 256, MM_GEMV_T = 8, MM_GEMV_R = 2 };
/* Attention: threads per (token, head) block. */
enum { ATT_THREADS = 128 };
/* Kernels in a graph at most (a named limit for the growing arrays). */
#define KCU_MAX_KERNELS ((size_t)1 << 24)
/* What a kernel's text calls itself until its name is known. */
#define NAME_MARK "@K@"

/* A kernel text already in the source. */
typedef struct kcu_body {
    uint64_t hash;    /* of its text with NAME_MARK for the name */
    const char *name; /* the name it was given (meta arena) */
    size_t at, len;   /* its text in kcu_gen.texts */
} kcu_body;

typedef struct kcu_gen {
    const kir_graph *g;    /* the graph */
    ks_buf *src;           /* the source being written */
    krt_cuda_meta *meta;   /* kernels, aliases and output being filled */
    size_t cap_kernels;    /* capacity of meta->kernels */
    uint32_t *root;        /* [n_nodes] the value whose buffer holds each value (itself unless aliased) */
    ks_buf params;         /* the current kernel's parameter list */
    ks_buf body;           /* the current kernel's text, named NAME_MARK */
    ks_buf texts;          /* the texts of bodies[], one after another */
    kcu_body *bodies;      /* the distinct kernels written to src */
    size_t n_bodies;       /* how many */
    size_t cap_bodies;     /* capacity of bodies */
    ks_diag *d;            /* where errors go */
} kcu_gen;

/* ---- messages ---------------------------------------------------------------------- */
static int node_error(kcu_gen *x, kir_val v, const char *fmt, ...) KS_PRINTF(3, 4);
static int node_error(kcu_gen *x, kir_val v, const char *fmt, ...)
{
    const kir_graph *g = x->g;
    const kir_node *n = &g->nodes[v];
    ks_buf msg = {0};
    va_list ap;
    va_start(ap, fmt);
    ks_buf_vprintf(&msg, fmt, ap);
    va_end(ap);
    if (n->loc.file < g->n_files && n->loc.line > 0) {
        ks_source src = {g->files[n->loc.file], NULL, 0};
        ks_error_at(x->d, &src, (int)n->loc.line, (int)n->loc.col, "cuda: %s: %s", kir_op_table[n->op].name,
                    ks_buf_cstr(&msg));
    } else {
        ks_error(x->d, g->name && g->name[0] ? g->name : "graph", "cuda: %%%u %s: %s", v, kir_op_table[n->op].name,
                 ks_buf_cstr(&msg));
    }
    ks_buf_free(&msg);
    return -1;
}

/* ---- literals ------------------------------------------------------------------------ */
/* A float as a C++ literal that reads back to the same float (9 significant
 * digits suffice), e.g. 0.25f, 1.00000001e-06f. */
static void put_float(ks_buf *b, float f)
{
    if (isinf(f)) {
        ks_buf_puts(b, f > 0 ? "__int_as_float(0x7f800000)" : "__int_as_float(0xff800000)");
        return;
    }
    if (isnan(f)) {
        ks_buf_puts(b, "__int_as_float(0x7fc00000)");
        return;
    }
    char tmp[48];
    snprintf(tmp, sizeof tmp, "%.9g", (double)f);
    ks_buf_puts(b, tmp);
    if (!strpbrk(tmp, ".e")) ks_buf_puts(b, ".0");
    ks_buf_puts(b, "f");
}

/* A double as a literal that reads back exactly (17 significant digits). */
static void put_double(ks_buf *b, double v)
{
    char tmp[48];
    snprintf(tmp, sizeof tmp, "%.17g", v);
    ks_buf_puts(b, tmp);
    if (!strpbrk(tmp, ".e")) ks_buf_puts(b, ".0");
}

/* The device type of a value's elements (kcu_prelude.cuh). */
static const char *elem_type(kir_dtype t)
{
    switch (t) {
    case KIR_F32: return "float";
    case KIR_F16: return "kcu_f16";
    case KIR_BF16: return "kcu_bf16";
    case KIR_I32: return "int";
    case KIR_DTYPE_COUNT: break;
    }
    KS_UNREACHABLE();
}

/* ---- kernels and their parameters ------------------------------------------------------- */
/* Start a launch of the kernel that computes node v (suffix tells apart the
 * kernels of one node, e.g. "_kv_write"): adds it to meta, unnamed until
 * kernel_end; parameters follow with add_param, then open_body writes the
 * signature into x->body, then the body. Text that the kernel needs before
 * its signature (helper functions, tables) goes into x->body first, named
 * with NAME_MARK as a prefix. */
static krt_cuda_kernel *kernel_new(kcu_gen *x, kir_val v, int block)
{
    krt_cuda_meta *m = x->meta;
    size_t need = (size_t)m->n_kernels + 1;
    if (need > x->cap_kernels) {
        size_t cap = x->cap_kernels ? 2 * x->cap_kernels : 64;
        KS_ASSERT(cap <= KCU_MAX_KERNELS);
        krt_cuda_kernel *grown = ks_arena_alloc(&m->arena, sizeof *grown * cap);
        if (m->n_kernels) memcpy(grown, m->kernels, sizeof *grown * (size_t)m->n_kernels);
        m->kernels = grown;
        x->cap_kernels = cap;
    }
    krt_cuda_kernel *k = &m->kernels[m->n_kernels++];
    memset(k, 0, sizeof *k);
    k->node = v;
    k->block = block;
    for (int i = 0; i < 3; i++) k->grid[i][0] = 0, k->grid[i][1] = 1, k->grid[i][2] = 1;
    x->params.len = 0;
    x->body.len = 0;
    ks_buf_puts(&x->params, "int T");
    k->args[k->n_args++] = (krt_cuda_arg){KRT_CUDA_ARG_T, 0};
    return k;
}

/* Grid dim i: ceil((T * t + c) / div) blocks. */
static void kernel_grid(krt_cuda_kernel *k, int i, int64_t t, int64_t c, int64_t div)
{
    k->grid[i][0] = t;
    k->grid[i][1] = c;
    k->grid[i][2] = div;
}

/* Append a parameter: its C declaration and what the runtime passes. */
static void add_param(kcu_gen *x, krt_cuda_kernel *k, krt_cuda_arg_kind kind, int64_t index, const char *decl)
{
    KS_ASSERT(k->n_args < KRT_CUDA_MAX_ARGS);
    if (kind == KRT_CUDA_ARG_VALUE) index = x->root[index];
    k->args[k->n_args++] = (krt_cuda_arg){kind, index};
    ks_buf_printf(&x->params, ", %s", decl);
}

/* A value operand as a parameter named `name` (read-only), of its dtype. */
static void param_in(kcu_gen *x, krt_cuda_kernel *k, kir_val v, const char *name)
{
    ks_buf decl = {0};
    ks_buf_printf(&decl, "const %s *__restrict__ %s", elem_type(x->g->nodes[v].dtype), name);
    add_param(x, k, KRT_CUDA_ARG_VALUE, v, ks_buf_cstr(&decl));
    ks_buf_free(&decl);
}

/* The node's own buffer, written. */
static void param_out(kcu_gen *x, krt_cuda_kernel *k, kir_val v)
{
    add_param(x, k, KRT_CUDA_ARG_VALUE, v, "float *__restrict__ out");
}

/* The kernel's signature and opening brace, with a comment naming what it
 * computes (no node numbers: the text is shared by every node it fits). */
static void open_body(kcu_gen *x, const krt_cuda_kernel *k, const char *what)
{
    const kir_node *n = &x->g->nodes[k->node];
    ks_buf type = {0};
    kir_format_type(&type, n);
    ks_buf_printf(&x->body, "\n/* %s: %s -> %s */\n", kir_op_table[n->op].name, what, ks_buf_cstr(&type));
    ks_buf_printf(&x->body, "extern \"C\" __global__ void __launch_bounds__(%d) " NAME_MARK "(%s)\n{\n", k->block,
                  ks_buf_cstr(&x->params));
    ks_buf_free(&type);
}

/* x->body with every NAME_MARK replaced by name, appended to out. */
static void put_named(ks_buf *out, const char *text, size_t len, const char *name)
{
    size_t mark = strlen(NAME_MARK);
    for (size_t i = 0; i < len;) {
        if (i + mark <= len && memcmp(text + i, NAME_MARK, mark) == 0) {
            ks_buf_puts(out, name);
            i += mark;
            continue;
        }
        size_t j = i + 1;
        while (j < len && text[j] != NAME_MARK[0]) j++;
        ks_buf_put(out, text + i, j - i);
        i = j;
    }
}

/* The kernel's text is complete: find it among the kernels written (the
 * same text: the same kernel) or write it under a new name; k launches it.
 * suffix is part of the name, after the op's. */
static void kernel_end(kcu_gen *x, krt_cuda_kernel *k, const char *suffix)
{
    const char *op = kir_op_table[x->g->nodes[k->node].op].name;
    uint64_t hash = ks_hash64(KS_HASH_SEED, x->body.data, x->body.len);
    for (size_t i = 0; i < x->n_bodies; i++) {
        const kcu_body *b = &x->bodies[i];
        if (b->hash == hash && b->len == x->body.len && memcmp(x->texts.data + b->at, x->body.data, b->len) == 0) {
            k->name = b->name;
            return;
        }
    }
    /* a new kernel: k_<op><suffix>_<48 bits of the hash>, distinct from every name so far */
    const char *name = NULL;
    for (uint64_t salt = 0;; salt++) {
        uint64_t h = salt ? ks_hash64(hash, &salt, sizeof salt) : hash;
        name = ks_arena_printf(&x->meta->arena, "k_%s%s_%012llx", op, suffix,
                               (unsigned long long)(h & 0xffffffffffffull));
        int taken = 0;
        for (size_t i = 0; i < x->n_bodies && !taken; i++) taken = strcmp(x->bodies[i].name, name) == 0;
        if (!taken) break;
    }
    KS_GROW(x->bodies, x->n_bodies + 1, x->cap_bodies, KCU_MAX_KERNELS, "distinct CUDA kernels");
    x->bodies[x->n_bodies++] = (kcu_body){hash, name, x->texts.len, x->body.len};
    ks_buf_put(&x->texts, x->body.data, x->body.len);
    put_named(x->src, x->body.data, x->body.len, name);
    k->name = name;
}

/* An elementwise kernel over the node's T * row elements: one thread each;
 * the body sees i (the element) and returns early past the end. */
static krt_cuda_kernel *elementwise_kernel(kcu_gen *x, kir_val v, int64_t row)
{
    krt_cuda_kernel *k = kernel_new(x, v, EW_THREADS);
    kernel_grid(k, 0, row, 0, EW_THREADS);
    return k;
}

static void elementwise_prologue(kcu_gen *x, int64_t row)
{
    ks_buf_printf(&x->body,
                  "    const long long i = (long long)blockIdx.x * %d + threadIdx.x;\n"
                  "    if (i >= (long long)T * %lld) return;\n",
                  EW_THREADS, (long long)row);
}

static int64_t last_dim(const kir_node *n) { return n->dims[n->ndim - 1]; }

/* ---- ops ------------------------------------------------------------------------------ */
static int emit_embed(kcu_gen *x, kir_val v)
{
    const kir_node *n = &x->g->nodes[v];
    int64_t dim = n->dims[1];
    krt_cuda_kernel *k = elementwise_kernel(x, v, dim);
    param_in(x, k, n->in[0], "table");
    param_in(x, k, n->in[1], "ids");
    param_out(x, k, v);
    open_body(x, k, "rows of the table picked by ids (checked on the host before the step)");
    elementwise_prologue(x, dim);
    ks_buf_printf(&x->body, "    out[i] = kcu_f(table[(long long)ids[i / %lld] * %lld + i %% %lld]);\n}\n",
                  (long long)dim, (long long)dim, (long long)dim);
    kernel_end(x, k, "");
    return 0;
}

/* Weights of dtype t that kcu_matmul loads at a time from rows of K: 16
 * bytes' worth when rows are 16-byte aligned, else 1. */
static int matmul_vec(int64_t K, kir_dtype t)
{
    size_t es = kir_dtype_size(t);
    return (size_t)K * es % 16 == 0 ? (int)(16 / es) : 1;
}

/* out[t, c] = dot(x[t, :], w[c, :]): kcu_matmul (kcu_prelude.cuh) at this
 * node's shapes and weight dtype. Its grid is fixed by N: ceil(N / rows per
 * block). */
static int emit_matmul(kcu_gen *x, kir_val v)
{
    const kir_node *n = &x->g->nodes[v], *w = &x->g->nodes[n->in[1]];
    int64_t K = w->dims[1], N = w->dims[0];
    if (K >= INT32_MAX / 16 || N >= INT32_MAX / 16)
        return node_error(x, v, "a [%lld,%lld] weight is larger than the CUDA matmul indexes", (long long)N,
                          (long long)K);
    int vec = matmul_vec(K, w->dtype);
    int64_t rows_per_block = (int64_t)(MM_THREADS / 32) * MM_GEMV_R;
    krt_cuda_kernel *k = kernel_new(x, v, MM_THREADS);
    kernel_grid(k, 0, 0, N, rows_per_block);
    param_in(x, k, n->in[0], "x");
    param_in(x, k, n->in[1], "w");
    param_out(x, k, v);
    ks_buf what = {0};
    ks_buf_printf(&what, "x w^T with %s weights, fp32 sums (%d-element loads; a warp for %d rows when T <= %d)",
                  kir_dtype_name(w->dtype), vec, MM_GEMV_R, MM_GEMV_T);
    open_body(x, k, ks_buf_cstr(&what));
    ks_buf_free(&what);
    ks_buf_printf(&x->body, "    kcu_matmul<%s, %lld, %lld>(T, x, w, out);\n}\n", elem_type(w->dtype),
                  (long long)K, (long long)N);
    kernel_end(x, k, "");
    return 0;
}

/* add/sub/mul: b repeats over a's leading dims when its shape is a suffix of a's. */
static int emit_binary(kcu_gen *x, kir_val v)
{
    const kir_node *n = &x->g->nodes[v], *b = &x->g->nodes[n->in[1]];
    int64_t row = kir_row_elems(n);
    const char *op = n->op == KIR_OP_ADD ? "+" : n->op == KIR_OP_SUB ? "-" : "*";
    krt_cuda_kernel *k = elementwise_kernel(x, v, row);
    param_in(x, k, n->in[0], "a");
    param_in(x, k, n->in[1], "b");
    param_out(x, k, v);
    int b_has_t = b->ndim > 0 && b->dims[0] == KIR_DIM_T;
    open_body(x, k, b_has_t ? "elementwise" : "elementwise, b repeated over the leading dims");
    elementwise_prologue(x, row);
    if (b_has_t)
        ks_buf_printf(&x->body, "    out[i] = a[i] %s b[i];\n}\n", op);
    else
        ks_buf_printf(&x->body, "    out[i] = a[i] %s kcu_f(b[i %% %lld]);\n}\n", op, (long long)kir_elems(b, 1));
    kernel_end(x, k, "");
    return 0;
}

static int emit_unary(kcu_gen *x, kir_val v)
{
    const kir_node *n = &x->g->nodes[v];
    int64_t row = kir_row_elems(n);
    krt_cuda_kernel *k = elementwise_kernel(x, v, row);
    param_in(x, k, n->in[0], "x");
    param_out(x, k, v);
    ks_buf body = {0};
    const char *what = "";
    switch (n->op) {
    case KIR_OP_SCALE:
        what = "x times a constant";
        ks_buf_puts(&body, "    out[i] = x[i] * ");
        put_float(&body, (float)kir_get_float(x->g, v, "value", 1.0));
        ks_buf_puts(&body, ";\n");
        break;
    case KIR_OP_SILU:
        what = "x sigmoid(x), in double";
        ks_buf_puts(&body, "    const double a = x[i];\n    out[i] = (float)(a / (1.0 + exp(-a)));\n");
        break;
    case KIR_OP_GELU:
        what = "exact GELU with erf, in double";
        ks_buf_puts(&body, "    const double a = x[i];\n    out[i] = (float)(0.5 * a * (1.0 + erf(a / sqrt(2.0))));\n");
        break;
    case KIR_OP_GELU_TANH:
        what = "GELU's tanh approximation, in double";
        ks_buf_puts(&body, "    const double a = x[i], k = sqrt(2.0 / 3.14159265358979323846);\n"
                           "    out[i] = (float)(0.5 * a * (1.0 + tanh(k * (a + 0.044715 * a * a * a))));\n");
        break;
    case KIR_OP_RELU:
        what = "max(x, 0)";
        ks_buf_puts(&body, "    out[i] = x[i] > 0.0f ? x[i] : 0.0f;\n");
        break;
    default:
        KS_UNREACHABLE();
    }
    open_body(x, k, what);
    elementwise_prologue(x, row);
    ks_buf_put(&x->body, body.data, body.len);
    ks_buf_puts(&x->body, "}\n");
    ks_buf_free(&body);
    kernel_end(x, k, "");
    return 0;
}

/* Threads for a per-row reduction over d elements: a power of two in [32, 256]. */
static int reduce_threads(int64_t d)
{
    int t = 32;
    while (t < 256 && t < d) t *= 2;
    return t;
}

/* A block-wide sum of the double `var` over the threads, in a fixed tree;
 * every thread sees the total in `var` afterwards. */
static void put_block_sum(ks_buf *b, const char *var)
{
    ks_buf_printf(b,
                  "    red[threadIdx.x] = %s;\n"
                  "    __syncthreads();\n"
                  "    for (int s = B / 2; s > 0; s >>= 1) {\n"
                  "        if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];\n"
                  "        __syncthreads();\n"
                  "    }\n"
                  "    %s = red[0];\n"
                  "    __syncthreads();\n",
                  var, var);
}

/* rms_norm and layer_norm: one block per row of the last dim; sums in double. */
static int emit_norm(kcu_gen *x, kir_val v)
{
    const kir_node *n = &x->g->nodes[v];
    int64_t d = last_dim(n), rows = kir_row_elems(n) / d;
    int threads = reduce_threads(d);
    int has_w = n->nin > 1 && n->in[1] != KIR_NONE, has_b = n->nin > 2 && n->in[2] != KIR_NONE;
    int rms = n->op == KIR_OP_RMS_NORM;
    krt_cuda_kernel *k = kernel_new(x, v, threads);
    kernel_grid(k, 0, rows, 0, 1);
    param_in(x, k, n->in[0], "x");
    if (has_w) param_in(x, k, n->in[1], "w");
    if (has_b) param_in(x, k, n->in[2], "bias");
    param_out(x, k, v);
    open_body(x, k, rms ? "x / sqrt(mean(x^2) + eps) (* w), one block per row, sums in double"
                        : "(x - mean) / sqrt(var + eps) (* w + b), one block per row, sums in double");
    ks_buf_printf(&x->body,
                  "    enum { D = %lld, B = %d };\n"
                  "    __shared__ double red[B];\n"
                  "    const float *xr = x + (long long)blockIdx.x * D;\n"
                  "    float *orow = out + (long long)blockIdx.x * D;\n"
                  "    const double eps = ",
                  (long long)d, threads);
    put_double(&x->body, kir_get_float(x->g, v, "eps", 1e-5));
    ks_buf_puts(&x->body, ";\n");
    if (rms) {
        ks_buf_puts(&x->body, "    double ss = 0.0;\n"
                              "    for (int i = threadIdx.x; i < D; i += B) ss += (double)xr[i] * xr[i];\n");
        put_block_sum(&x->body, "ss");
        ks_buf_printf(&x->body,
                      "    const double inv = 1.0 / sqrt(ss / (double)D + eps);\n"
                      "    for (int i = threadIdx.x; i < D; i += B) {\n"
                      "        const float y = (float)(xr[i] * inv);\n"
                      "        orow[i] = %s;\n"
                      "    }\n}\n",
                      has_w ? "y * kcu_f(w[i])" : "y");
        kernel_end(x, k, "");
        return 0;
    }
    ks_buf_puts(&x->body, "    double mean = 0.0, var = 0.0;\n"
                          "    for (int i = threadIdx.x; i < D; i += B) mean += xr[i];\n");
    put_block_sum(&x->body, "mean");
    ks_buf_puts(&x->body, "    mean /= (double)D;\n"
                          "    for (int i = threadIdx.x; i < D; i += B) var += ((double)xr[i] - mean) * ((double)xr[i] - mean);\n");
    put_block_sum(&x->body, "var");
    ks_buf_printf(&x->body,
                  "    const double inv = 1.0 / sqrt(var / (double)D + eps);\n"
                  "    for (int i = threadIdx.x; i < D; i += B) {\n"
                  "        float y = (float)(((double)xr[i] - mean) * inv);\n"
                  "%s%s"
                  "        orow[i] = y;\n"
                  "    }\n}\n",
                  has_w ? "        y *= kcu_f(w[i]);\n" : "", has_b ? "        y += kcu_f(bias[i]);\n" : "");
    kernel_end(x, k, "");
    return 0;
}

static int emit_slice(kcu_gen *x, kir_val v)
{
    const kir_node *n = &x->g->nodes[v];
    int64_t d = last_dim(n), d_in = last_dim(&x->g->nodes[n->in[0]]), start = kir_get_int(x->g, v, "start", 0);
    int64_t row = kir_row_elems(n);
    krt_cuda_kernel *k = elementwise_kernel(x, v, row);
    param_in(x, k, n->in[0], "x");
    param_out(x, k, v);
    open_body(x, k, "a copy of a range of the last dim");
    elementwise_prologue(x, row);
    ks_buf_printf(&x->body, "    out[i] = x[i / %lld * %lld + %lld + i %% %lld];\n}\n", (long long)d, (long long)d_in,
                  (long long)start, (long long)d);
    kernel_end(x, k, "");
    return 0;
}

static int emit_concat(kcu_gen *x, kir_val v)
{
    const kir_node *n = &x->g->nodes[v];
    int64_t d = last_dim(n), row = kir_row_elems(n);
    krt_cuda_kernel *k = elementwise_kernel(x, v, row);
    for (int i = 0; i < n->nin; i++) {
        char name[16];
        snprintf(name, sizeof name, "x%d", i);
        param_in(x, k, n->in[i], name);
    }
    param_out(x, k, v);
    open_body(x, k, "operands side by side along the last dim");
    elementwise_prologue(x, row);
    ks_buf_printf(&x->body, "    const long long r = i / %lld, c = i %% %lld;\n", (long long)d, (long long)d);
    int64_t at = 0;
    for (int i = 0; i < n->nin; i++) {
        int64_t di = last_dim(&x->g->nodes[n->in[i]]);
        ks_buf_printf(&x->body, "    %sif (c < %lld) out[i] = x%d[r * %lld + c - %lld];\n", i ? "else " : "",
                      (long long)(at + di), i, (long long)di, (long long)at);
        at += di;
    }
    ks_buf_puts(&x->body, "}\n");
    kernel_end(x, k, "");
    return 0;
}

/* Rotary embedding; the frequencies are the interpreter's, baked in as a table. */
static int emit_rope(kcu_gen *x, kir_val v)
{
    const kir_graph *g = x->g;
    const kir_node *n = &g->nodes[v];
    const char *style = kir_get_str(g, v, "style", "halves");
    const char *scaling = kir_get_str(g, v, "scaling", "none");
    if (strcmp(style, "halves") != 0 && strcmp(style, "pairs") != 0)
        return node_error(x, v, "unknown style '%s' (expected halves or pairs)", style);
    if (strcmp(scaling, "none") != 0 && strcmp(scaling, "linear") != 0 && strcmp(scaling, "llama3") != 0)
        return node_error(x, v, "unknown scaling '%s' (expected none, linear or llama3)", scaling);
    int64_t heads = n->dims[1], d = n->dims[2], rot = kir_get_int(g, v, "rot_dim", d);
    int half = (int)(rot / 2), pairs = strcmp(style, "pairs") == 0;
    int64_t row = heads * d;
    krt_cuda_kernel *k = elementwise_kernel(x, v, row);
    float *inv_freq = ks_xmalloc(sizeof(float) * (size_t)(half ? half : 1));
    kir_rope_inv_freq(g, v, (int)rot, inv_freq);
    ks_buf_printf(&x->body, "\n/* rotation frequencies, radians per position (as the interpreter computes them) */\n"
                            "__device__ const float " NAME_MARK "_inv_freq[%d] = {",
                  half);
    for (int j = 0; j < half; j++) {
        ks_buf_puts(&x->body, j % 6 ? " " : "\n    ");
        put_float(&x->body, inv_freq[j]);
        ks_buf_puts(&x->body, ",");
    }
    ks_buf_puts(&x->body, "\n};\n");
    free(inv_freq);

    param_in(x, k, n->in[0], "x");
    param_in(x, k, n->in[1], "pos");
    param_out(x, k, v);
    open_body(x, k, pairs ? "rotate pairs (2j, 2j+1) by pos * inv_freq[j]" : "rotate (j, j + rot/2) by pos * inv_freq[j]");
    elementwise_prologue(x, row);
    ks_buf_printf(&x->body,
                  "    enum { D = %lld, ROT = %lld, HALF = %d };\n"
                  "    const int e = (int)(i %% D);\n"
                  "    if (e >= ROT) {\n"
                  "        out[i] = x[i];\n"
                  "        return;\n"
                  "    }\n",
                  (long long)d, (long long)rot, half);
    if (pairs)
        ks_buf_puts(&x->body, "    const int j = e / 2, i0 = 2 * j, i1 = 2 * j + 1;\n");
    else
        ks_buf_puts(&x->body, "    const int j = e % HALF, i0 = j, i1 = j + HALF;\n");
    ks_buf_printf(&x->body,
                  "    const float angle = (float)pos[i / %lld] * " NAME_MARK "_inv_freq[j];\n"
                  "    const float c = (float)cos((double)angle), s = (float)sin((double)angle);\n"
                  "    const float *xr = x + (i - e);\n"
                  "    const float x0 = xr[i0], x1 = xr[i1];\n"
                  "    out[i] = e == i0 ? x0 * c - x1 * s : x1 * c + x0 * s;\n"
                  "}\n",
                  (long long)row);
    kernel_end(x, k, "");
    return 0;
}

/* The kernel that writes a step's K and V rows into layer `layer` of the
 * cache (its kv_k/kv_v arguments), at each token's slot; k and v are
 * values kv and vv. */
static void emit_kv_write_kernel(kcu_gen *x, kir_val v, const char *suffix, kir_val kv, kir_val vv, int64_t layer)
{
    const kir_node *kn = &x->g->nodes[kv], *vn = &x->g->nodes[vv];
    int64_t krow = kir_row_elems(kn), vrow = kir_row_elems(vn);
    krt_cuda_kernel *k = elementwise_kernel(x, v, krow + vrow);
    param_in(x, k, kv, "k");
    param_in(x, k, vv, "v");
    add_param(x, k, KRT_CUDA_ARG_KV_K, layer, "float *__restrict__ kc");
    add_param(x, k, KRT_CUDA_ARG_KV_V, layer, "float *__restrict__ vc");
    add_param(x, k, KRT_CUDA_ARG_SLOTS, 0, "const int *__restrict__ slots");
    open_body(x, k, "K and V rows of the step into a layer of the KV cache (kc, vc), at each token's slot");
    elementwise_prologue(x, krow + vrow);
    ks_buf_printf(&x->body,
                  "    enum { KROW = %lld, VROW = %lld };\n"
                  "    const long long t = i / (KROW + VROW), e = i %% (KROW + VROW), slot = slots[t];\n"
                  "    if (e < KROW)\n"
                  "        kc[slot * KROW + e] = k[t * KROW + e];\n"
                  "    else\n"
                  "        vc[slot * VROW + e - KROW] = v[t * VROW + e - KROW];\n"
                  "}\n",
                  (long long)krow, (long long)vrow);
    kernel_end(x, k, suffix);
}

/*
 * Attention over the paged cache: one block per (token, head). Positions
 * [lo, pos] of the token's sequence are read through its block table. Three
 * passes over the keys, each recomputing the scores (no score buffer): the
 * maximum, the sum of exponentials (double, fixed tree), then
 * probabilities a chunk at a time into shared memory and the weighted sum of
 * V rows, in position order for every output element, as the interpreter.
 */
static int emit_attention(kcu_gen *x, kir_val v)
{
    const kir_graph *g = x->g;
    const kir_node *n = &g->nodes[v];
    const kir_node *qn = &g->nodes[n->in[0]], *kn = &g->nodes[n->in[1]], *vn = &g->nodes[n->in[2]];
    int64_t heads = qn->dims[1], dk = qn->dims[2], kv_heads = kn->dims[1], dv = vn->dims[2];
    int64_t layer = kir_get_int(g, v, "layer", 0), window = kir_get_int(g, v, "window", 0);
    float scale = (float)kir_get_float(g, v, "scale", 1.0 / sqrt((double)dk));
    float softcap = (float)kir_get_float(g, v, "softcap", 0.0);
    if (layer < 0 || layer >= INT32_MAX) return node_error(x, v, "layer %lld is out of range", (long long)layer);
    if (softcap < 0.0f) return node_error(x, v, "softcap must not be negative");
    if (kir_get_int(g, v, "write_kv", 1) != 0) emit_kv_write_kernel(x, v, "_kv_write", n->in[1], n->in[2], layer);

    krt_cuda_kernel *k = kernel_new(x, v, ATT_THREADS);
    ks_buf_printf(&x->body, "\n/* a score: q . k(position p) * scale%s */\n", softcap > 0.0f ? ", soft-capped" : "");
    ks_buf_printf(&x->body,
                  "static __device__ float " NAME_MARK "_score(const float *qs, const float *__restrict__ kc, const int *table,\n"
                  "                                   int block_size, int p, int kh)\n{\n"
                  "    const long long slot = (long long)table[p / block_size] * block_size + p %% block_size;\n"
                  "    float s = kcu_dot(qs, kc + slot * %lld + kh * %lld, %lld) * ",
                  (long long)(kv_heads * dk), (long long)dk, (long long)dk);
    put_float(&x->body, scale);
    ks_buf_puts(&x->body, ";\n");
    if (softcap > 0.0f) {
        ks_buf_puts(&x->body, "    s = ");
        put_float(&x->body, softcap);
        ks_buf_puts(&x->body, " * (float)tanh((double)(s / ");
        put_float(&x->body, softcap);
        ks_buf_puts(&x->body, "));\n");
    }
    ks_buf_puts(&x->body, "    return s;\n}\n");

    kernel_grid(k, 0, 1, 0, 1);
    kernel_grid(k, 1, 0, heads, 1);
    param_in(x, k, n->in[0], "q");
    add_param(x, k, KRT_CUDA_ARG_KV_K, layer, "const float *__restrict__ kc");
    add_param(x, k, KRT_CUDA_ARG_KV_V, layer, "const float *__restrict__ vc");
    param_out(x, k, v);
    add_param(x, k, KRT_CUDA_ARG_POSITIONS, 0, "const int *__restrict__ positions");
    add_param(x, k, KRT_CUDA_ARG_TABLE_OFF, 0, "const int *__restrict__ table_off");
    add_param(x, k, KRT_CUDA_ARG_TABLES, 0, "const int *__restrict__ tables");
    add_param(x, k, KRT_CUDA_ARG_BLOCK_SIZE, 0, "int block_size");
    open_body(x, k, "causal attention over a layer of the paged KV cache (kc, vc), one block per (token, head)");
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
    kernel_end(x, k, "");
    return 0;
}

/* ---- the graph ------------------------------------------------------------------------- */
static const char banner[] =
    "/*\n"
    " * Generated by kiln (codegen/cuda) for graph \"%s\": %d launches of %zu distinct\n"
    " * kernels (nodes whose kernels would be the same text share one), every\n"
    " * dimension but T (the tokens of a step, a kernel argument) a constant.\n"
    " * Weights as stored in the engine (f32, bf16 or f16), everything else f32.\n"
    " * The launch table is the engine's cuda.meta section. The device templates\n"
    " * below are codegen/cuda/kcu_prelude.cuh.\n"
    " */\n";

/* Checks that node v can be lowered (types), before any code is written. */
static int check_node(kcu_gen *x, kir_val v)
{
    const kir_node *n = &x->g->nodes[v];
    if (n->op == KIR_OP_INPUT) {
        const char *name = kir_get_str(x->g, v, "name", "");
        if (strcmp(name, "tokens") != 0 && strcmp(name, "positions") != 0)
            return node_error(x, v, "'%s' is neither tokens nor positions", name);
        return 0;
    }
    if (n->op == KIR_OP_WEIGHT) return 0; /* f32, f16 or bf16: the shape rule allows no other */
    if (n->dtype != KIR_F32)
        return node_error(x, v, "the CUDA backend computes f32 values only, not %s", kir_dtype_name(n->dtype));
    return 0;
}

/* Emit node v's kernels, or record its alias. */
static int emit_node(kcu_gen *x, kir_val v)
{
    const kir_node *n = &x->g->nodes[v];
    switch (n->op) {
    case KIR_OP_INPUT:  /* the step's tokens or positions, uploaded by the runtime */
    case KIR_OP_WEIGHT: /* uploaded once */
        return 0;
    case KIR_OP_RESHAPE: /* same elements, same order: a view */
    case KIR_OP_OUTPUT:  /* the logits are copied to the host from the operand's buffer */
        x->root[v] = x->root[n->in[0]];
        return 0;
    case KIR_OP_KV_WRITE: {
        /* writes the cache; its value is k, passed through */
        int64_t layer = kir_get_int(x->g, v, "layer", 0);
        if (layer < 0 || layer >= INT32_MAX) return node_error(x, v, "layer %lld is out of range", (long long)layer);
        x->root[v] = x->root[n->in[0]];
        emit_kv_write_kernel(x, v, "", n->in[0], n->in[1], layer);
        return 0;
    }
    case KIR_OP_EMBED:
        return emit_embed(x, v);
    case KIR_OP_MATMUL:
        return emit_matmul(x, v);
    case KIR_OP_ADD:
    case KIR_OP_SUB:
    case KIR_OP_MUL:
        return emit_binary(x, v);
    case KIR_OP_SCALE:
    case KIR_OP_SILU:
    case KIR_OP_GELU:
    case KIR_OP_GELU_TANH:
    case KIR_OP_RELU:
        return emit_unary(x, v);
    case KIR_OP_RMS_NORM:
    case KIR_OP_LAYER_NORM:
        return emit_norm(x, v);
    case KIR_OP_SLICE:
        return emit_slice(x, v);
    case KIR_OP_CONCAT:
        return emit_concat(x, v);
    case KIR_OP_ROPE:
        return emit_rope(x, v);
    case KIR_OP_ATTENTION:
        return emit_attention(x, v);
    case KIR_OP_COUNT:
        break;
    }
    KS_UNREACHABLE();
}

int kcu_generate(const kir_graph *g, ks_buf *src, krt_cuda_meta *meta, ks_diag *d)
{
    if (kir_verify(g, d, g->name && g->name[0] ? g->name : "graph") != 0) return -1;
    ks_buf kernels = {0};
    kcu_gen x = {.g = g, .src = &kernels, .meta = meta, .d = d};
    x.root = ks_xcalloc(g->n_nodes ? g->n_nodes : 1, sizeof *x.root);
    int rc = 0, have_output = 0;
    for (size_t v = 0; v < g->n_nodes; v++) {
        x.root[v] = (uint32_t)v;
        if (check_node(&x, (kir_val)v) != 0) rc = -1;
    }
    for (size_t v = 0; v < g->n_nodes && rc == 0; v++) rc = emit_node(&x, (kir_val)v);
    if (rc == 0) {
        ks_buf_printf(src, banner, g->name ? g->name : "", meta->n_kernels, x.n_bodies);
        ks_buf_puts(src, kcu_prelude);
        ks_buf_put(src, kernels.data, kernels.len);
    }
    size_t n_aliases = 0;
    for (size_t v = 0; v < g->n_nodes; v++) n_aliases += x.root[v] != v;
    meta->aliases = ks_arena_alloc(&meta->arena, sizeof *meta->aliases * (n_aliases + 1));
    for (size_t v = 0; v < g->n_nodes && rc == 0; v++) {
        if (x.root[v] != v) {
            meta->aliases[meta->n_aliases][0] = (uint32_t)v;
            meta->aliases[meta->n_aliases][1] = x.root[v];
            meta->n_aliases++;
        }
        if (g->nodes[v].op == KIR_OP_OUTPUT && !have_output) {
            meta->output = x.root[v];
            have_output = 1;
        }
    }
    if (rc == 0 && !have_output) {
        ks_error(d, g->name && g->name[0] ? g->name : "graph", "cuda: the graph has no output");
        rc = -1;
    }
    ks_buf_free(&kernels);
    ks_buf_free(&x.params);
    ks_buf_free(&x.body);
    ks_buf_free(&x.texts);
    free(x.bodies);
    free(x.root);
    return rc;
}
