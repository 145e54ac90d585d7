/*
 * kcu_gen.c — writing kernels: messages at a node's source place, literals,
 * launch records and parameters, and naming a kernel by its text so that
 * equal texts are compiled once (codegen/cuda/kcu_gen.h).
 */
#include "codegen/cuda/kcu_gen.h"

#include "ir/numerics.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- messages ---------------------------------------------------------------------- */
int kcu_node_error(kcu_gen *x, kir_val v, const char *fmt, ...)
{
    const char *op = kir_op_table[kir_node_at(x->g, v)->op].name;
    char lead[64];
    /* At a place the caret shows which node; elsewhere its number does. */
    if (kir_node_has_place(x->g, v))
        snprintf(lead, sizeof lead, "cuda: %s: ", op);
    else
        snprintf(lead, sizeof lead, "cuda: %%%u %s: ", (unsigned)v, op);
    va_list ap;
    va_start(ap, fmt);
    kir_node_verror(x->d, x->g, v, kir_graph_name(x->g, "graph"), lead, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- literals ------------------------------------------------------------------------ */
/* A float as a C++ literal that reads back to the same float (9 significant
 * digits suffice), e.g. 0.25f, 1.00000001e-06f. */
void kcu_put_float(ks_buf *b, float f)
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
void kcu_put_double(ks_buf *b, double v)
{
    char tmp[48];
    snprintf(tmp, sizeof tmp, "%.17g", v);
    ks_buf_puts(b, tmp);
    if (!strpbrk(tmp, ".e")) ks_buf_puts(b, ".0");
}

/* The device type of a value's elements (kcu_prelude.cuh). */
const char *kcu_elem_type(kir_dtype t)
{
    switch (t) {
    case KIR_F32: return "float";
    case KIR_F16: return "kcu_f16";
    case KIR_BF16: return "kcu_bf16";
    case KIR_I32: return "int";
    case KIR_F8E4M3: /* quantized weights' codes: bytes (kcu_matmul_q unpacks them) */
    case KIR_U4:
    case KIR_U8:
    case KIR_I8: return "unsigned char";
    case KIR_DTYPE_COUNT: break;
    }
    KS_UNREACHABLE();
}

int kcu_is_half(kir_dtype t) { return t == KIR_BF16 || t == KIR_F16; }
const char *kcu_ld(kir_dtype t) { return kcu_is_half(t) ? "kcu_f(" : ""; }
const char *kcu_ld_end(kir_dtype t) { return kcu_is_half(t) ? ")" : ""; }

/* The prelude's device forms of half-math formulas: op, then the function. */
static const struct {
    kir_op op;
    const char *fn;
} half_forms[] = {{KIR_OP_SILU, "kcu_silu_half"}};

void kcu_formula_write(kir_op op, int half, const char *operand, ks_buf *out, int *in_double, const char **what)
{
    for (size_t i = 0; half && i < sizeof half_forms / sizeof half_forms[0]; i++)
        if (half_forms[i].op == op) {
            ks_buf text = {0}; /* the formula's type and what it computes */
            kir_formula_write(op, half, operand, &text, in_double, what);
            ks_buf_free(&text);
            ks_buf_printf(out, "%s(%s)", half_forms[i].fn, operand);
            return;
        }
    kir_formula_write(op, half, operand, out, in_double, what);
}

void kcu_rope_factor(const kir_graph *g, kir_val v, const char *indent, const char *c, const char *s, ks_buf *out)
{
    float af = (float)kir_attr_float(g, v, KIR_A_ROPE_ATTENTION_FACTOR);
    if (af == 1.0f) return; /* the kernels of a plain rotation stay as they were */
    ks_buf_printf(out, "%s%s *= ", indent, c);
    kcu_put_float(out, af);
    ks_buf_printf(out, ", %s *= ", s);
    kcu_put_float(out, af);
    ks_buf_puts(out, ";\n");
}

const char *kcu_attr_unary_write(const kir_graph *g, kir_val v, const char *in, ks_buf *out)
{
    switch (g->nodes[v].op) {
    case KIR_OP_SCALE: { /* as the interpreter: the product rounded, then the shift added (no contraction) */
        float sh = (float)kir_attr_float(g, v, KIR_A_SCALE_SHIFT);
        ks_buf_printf(out, sh != 0.0f ? "(%s * " : "%s * ", in);
        kcu_put_float(out, (float)kir_attr_float(g, v, KIR_A_SCALE_VALUE));
        if (sh != 0.0f) {
            ks_buf_puts(out, " + ");
            kcu_put_float(out, sh);
            ks_buf_puts(out, ")");
        }
        return sh != 0.0f ? "x times a constant, plus a constant" : "x times a constant";
    }
    case KIR_OP_CLAMP: { /* kcu_clamp_lo/_hi (kcu_prelude.cuh): NaN stays, as the interpreter's comparisons */
        int lo = kir_attr_has(g, v, KIR_A_CLAMP_MIN), hi = kir_attr_has(g, v, KIR_A_CLAMP_MAX);
        if (hi) ks_buf_puts(out, "kcu_clamp_hi(");
        if (lo) ks_buf_puts(out, "kcu_clamp_lo(");
        ks_buf_puts(out, in);
        if (lo) {
            ks_buf_puts(out, ", ");
            kcu_put_float(out, (float)kir_attr_float(g, v, KIR_A_CLAMP_MIN));
            ks_buf_puts(out, ")");
        }
        if (hi) {
            ks_buf_puts(out, ", ");
            kcu_put_float(out, (float)kir_attr_float(g, v, KIR_A_CLAMP_MAX));
            ks_buf_puts(out, ")");
        }
        return "x clamped";
    }
    default: return NULL;
    }
}

void kcu_put_store(ks_buf *b, kir_dtype t, const char *indent, const char *lhs, const char *v)
{
    if (kcu_is_half(t))
        ks_buf_printf(b, "%skcu_put(&%s, %s);\n", indent, lhs, v);
    else
        ks_buf_printf(b, "%s%s = %s;\n", indent, lhs, v);
}

/* ---- kernels and their parameters ------------------------------------------------------- */
/* Start a launch of the kernel that computes node v (suffix tells apart the
 * kernels of one node, e.g. "_kv_write"): adds it to meta, unnamed until
 * kernel_end; parameters follow with add_param, then open_body writes the
 * signature into x->body, then the body. Text that the kernel needs before
 * its signature (helper functions, tables) goes into x->body first, named
 * with NAME_MARK as a prefix. */
krt_cuda_kernel *kcu_kernel_new(kcu_gen *x, kir_val v, int block)
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
    for (int i = 0; i < 3; i++) k->grid[i][0] = 0, k->grid[i][1] = 1, k->grid[i][2] = 1, k->grid[i][3] = 0;
    x->params.len = 0;
    x->body.len = 0;
    ks_buf_puts(&x->params, "int T");
    k->args[k->n_args++] = (krt_cuda_arg){KRT_CUDA_ARG_T, 0, 0};
    return k;
}

/* Grid dim i: ceil((T * t + c) / div) blocks. */
void kcu_kernel_grid(krt_cuda_kernel *k, int i, int64_t t, int64_t c, int64_t div)
{
    k->grid[i][0] = t;
    k->grid[i][1] = c;
    k->grid[i][2] = div;
}

void kcu_kernel_grid_large(krt_cuda_kernel *k, int i, int64_t t, int64_t c, int64_t div)
{
    if (!k->has_grid_large)
        for (int g = 0; g < 3; g++)
            k->grid_large[g][0] = 0, k->grid_large[g][1] = 1, k->grid_large[g][2] = 1, k->grid_large[g][3] = 0;
    k->has_grid_large = 1;
    k->grid_large[i][0] = t;
    k->grid_large[i][1] = c;
    k->grid_large[i][2] = div;
}

void kcu_kernel_grid_cap(krt_cuda_kernel *k, int i, int64_t cap)
{
    k->grid[i][3] = cap;
    if (k->has_grid_large) k->grid_large[i][3] = cap;
}

void kcu_matmul_grids(krt_cuda_kernel *k, int64_t N, const kcu_gemv_plan *p)
{
    kcu_kernel_grid(k, 0, 0, N, p->cols);
    if (p->cols != MM_GRID_COLS) kcu_kernel_grid_large(k, 0, 0, N, MM_GRID_COLS);
}

/* Append a parameter: its C declaration and what the runtime passes. */
void kcu_add_param(kcu_gen *x, krt_cuda_kernel *k, krt_cuda_arg_kind kind, int64_t index, const char *decl)
{
    KS_ASSERT(k->n_args < KRT_CUDA_MAX_ARGS);
    if (kind == KRT_CUDA_ARG_VALUE) index = x->root[index];
    k->args[k->n_args++] = (krt_cuda_arg){kind, index, 0};
    ks_buf_printf(&x->params, ", %s", decl);
}

/* A value operand as a parameter named `name` (read-only), of its dtype. */
void kcu_param_in(kcu_gen *x, krt_cuda_kernel *k, kir_val v, const char *name)
{
    ks_buf decl = {0};
    ks_buf_printf(&decl, "const %s *__restrict__ %s", kcu_elem_type(x->g->nodes[v].dtype), name);
    kcu_add_param(x, k, KRT_CUDA_ARG_VALUE, v, ks_buf_cstr(&decl));
    ks_buf_free(&decl);
}

/* The node's own buffer, written. */
void kcu_param_out(kcu_gen *x, krt_cuda_kernel *k, kir_val v)
{
    ks_buf decl = {0};
    ks_buf_printf(&decl, "%s *__restrict__ out", kcu_elem_type(x->g->nodes[v].dtype));
    kcu_add_param(x, k, KRT_CUDA_ARG_VALUE, v, ks_buf_cstr(&decl));
    ks_buf_free(&decl);
}

/* A kernel whose node is no matmul (attention, a norm, a rotation, routing, a sum) streams no weights:
 * while it runs, HBM would idle. If a matmul with weights of its own comes after it (and no routed
 * expert_matmul before that), the kernel gets that weight as the parameter `ahead` and its blocks
 * prefetch the weight's first bytes into L2 before they wait for the kernel before them
 * (kcu_l2_ahead: a hint that reads nothing into the kernel, KCU_PDL_ENTER's rule holds), so that
 * the matmul's first reads hit L2. The byte count is part of the text. Off unless asked for
 * (kcu_options.l2_ahead_mb: measured slower). */
static void put_l2_ahead(kcu_gen *x, krt_cuda_kernel *k, ks_buf *stmt)
{
    const kir_graph *g = x->g;
    const kir_op op = g->nodes[k->node].op;
    if (!x->ahead || x->opt.l2_ahead_mb <= 0 || op == KIR_OP_MATMUL || op == KIR_OP_EXPERT_MATMUL ||
        k->n_args >= KRT_CUDA_MAX_ARGS)
        return;
    const kir_val w = x->ahead[k->node];
    if (w == KIR_NONE) return;
    const kir_node *wn = &g->nodes[w];
    int64_t bytes = (int64_t)kir_dtype_bytes(wn->dtype, (uint64_t)kir_elems(wn, 0));
    const int64_t cap = (int64_t)x->opt.l2_ahead_mb << 20;
    if (bytes > cap) bytes = cap;
    bytes &= ~(int64_t)15;
    if (bytes <= 0) return;
    kcu_param_in(x, k, w, "ahead");
    ks_buf_printf(stmt, "    kcu_l2_ahead(ahead, %lldLL); /* the next matmul's weights */\n", (long long)bytes);
}

/* The kernel's signature and opening brace, with a comment naming what it
 * computes (no node numbers: the text is shared by every node it fits). */
static void open_body(kcu_gen *x, krt_cuda_kernel *k, const char *what, int min_blocks, const char *attr,
                      const char *entry)
{
    const kir_node *n = &x->g->nodes[k->node];
    ks_buf type = {0}, ahead = {0};
    put_l2_ahead(x, k, &ahead); /* its parameter now, its statement first in the body */
    kir_format_type(&type, n);
    ks_buf_printf(&x->body, "\n/* %s: %s -> %s */\n", kir_op_table[n->op].name, what, ks_buf_cstr(&type));
    ks_buf_printf(&x->body, "extern \"C\" __global__ void __launch_bounds__(%d", k->block);
    if (min_blocks > 0) ks_buf_printf(&x->body, ", %d", min_blocks);
    ks_buf_printf(&x->body, ") %s%s" NAME_MARK "(%s)\n{\n%s    %s\n", attr ? attr : "", attr ? " " : "",
                  ks_buf_cstr(&x->params), ks_buf_cstr(&ahead), entry);
    ks_buf_free(&ahead);
    ks_buf_free(&type);
}

void kcu_open_body_attr(kcu_gen *x, krt_cuda_kernel *k, const char *what, int min_blocks, const char *attr)
{
    open_body(x, k, what, min_blocks, attr, "KCU_PDL_ENTER();");
}

void kcu_open_body_tc(kcu_gen *x, krt_cuda_kernel *k, const char *what, int min_blocks)
{
    open_body(x, k, what, min_blocks, NULL, "/* KCU_PDL_ENTER: kcu_matmul_tc's, after its L2 prefetch */");
}

void kcu_open_body_min(kcu_gen *x, krt_cuda_kernel *k, const char *what, int min_blocks)
{
    kcu_open_body_attr(x, k, what, min_blocks, NULL);
}

void kcu_open_body(kcu_gen *x, krt_cuda_kernel *k, const char *what) { kcu_open_body_attr(x, k, what, 0, NULL); }

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
/* The name of a kernel text already written, or NULL. */
static const char *written_name(const kcu_gen *x, uint64_t hash)
{
    for (size_t i = 0; i < x->n_bodies; i++) {
        const kcu_body *b = &x->bodies[i];
        if (b->hash == hash && b->len == x->body.len && memcmp(x->texts.data + b->at, x->body.data, b->len) == 0)
            return b->name;
    }
    return NULL;
}

void kcu_kernel_end(kcu_gen *x, krt_cuda_kernel *k, const char *suffix)
{
    const char *op = kir_op_table[x->g->nodes[k->node].op].name;
    uint64_t hash = ks_hash64(KS_HASH_SEED, x->body.data, x->body.len);
    const char *name = written_name(x, hash);
    if (!name) {
        /* a new kernel: k_<op><suffix>_<48 bits of the hash>, distinct from every name so far */
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
    }
    k->name = name;
    if (x->large) {
        k->name_large = ks_arena_printf(&x->meta->arena, "%s_large", name);
        k->large_above = x->large;
    }
    x->large = 0;
}

void kcu_put_float_table(ks_buf *b, const char *comment, const char *name, const float *v, int64_t n)
{
    ks_buf_printf(b, "\n/* %s */\n__device__ const float " NAME_MARK "_%s[%lld] = {", comment, name,
                  (long long)(n > 0 ? n : 1));
    for (int64_t j = 0; j < n; j++) {
        ks_buf_puts(b, j % 6 ? " " : "\n    ");
        kcu_put_float(b, v[j]);
        ks_buf_puts(b, ",");
    }
    ks_buf_puts(b, "\n};\n");
}

void kcu_put_rope_table(kcu_gen *x, ks_buf *b, kir_val v, int64_t rot, int64_t seq_len, const char *suffix)
{
    int half = (int)(rot / 2);
    float *inv_freq = ks_xmalloc(sizeof(float) * (size_t)(half ? half : 1));
    kir_rope_inv_freq(x->g, v, (int)rot, seq_len, inv_freq);
    char name[48];
    snprintf(name, sizeof name, "inv_freq%s", suffix);
    kcu_put_float_table(b, "rotation frequencies, radians per position (as the interpreter computes them)", name,
                        inv_freq, half);
    free(inv_freq);
}

void kcu_open_large(kcu_gen *x, const krt_cuda_kernel *k, int64_t above)
{
    ks_buf_printf(&x->body, "\n/* the same for steps of more than %lld tokens */\n", (long long)above);
    ks_buf_printf(&x->body, "extern \"C\" __global__ void __launch_bounds__(%d) " NAME_MARK "_large(%s)\n{\n    KCU_PDL_ENTER();\n",
                  k->block,
                  ks_buf_cstr(&x->params));
    x->large = above;
}

/* An elementwise kernel over the node's T * row elements: one thread each;
 * the body sees i (the element) and returns early past the end. */
krt_cuda_kernel *kcu_elementwise_kernel(kcu_gen *x, kir_val v, int64_t row)
{
    krt_cuda_kernel *k = kcu_kernel_new(x, v, EW_THREADS);
    kcu_kernel_grid(k, 0, row, 0, EW_THREADS);
    return k;
}

void kcu_elementwise_prologue(kcu_gen *x, int64_t row)
{
    ks_buf_printf(&x->body,
                  "    const long long i = (long long)blockIdx.x * %d + threadIdx.x;\n"
                  "    if (i >= (long long)T * %lld) return;\n",
                  EW_THREADS, (long long)row);
}

