/*
 * cuda_backend.c — the CUDA backend (runtime/backend.h): runs an engine built
 * with `kiln build --target sm_XX,...` on the first GPU.
 *
 * open:   loads libcuda (runtime/cuda_api.h), picks the cubin for the
 *         device's compute capability — or says which architectures the
 *         engine has and which the device is, before allocating anything —
 *         loads it and looks up every kernel of cuda.meta.
 * attach: uploads the weights section as it lies in the file (one copy),
 *         and checks cuda.meta against the graph and the KV cache, whose
 *         blocks live in device memory (cuda_kv_storage below).
 * step:   checks the step on the host (as the interpreter does), uploads the
 *         step's ids, positions, KV slots and block tables in one copy, runs
 *         the kernels in order on the default stream, and copies the logits
 *         back (which also waits for them).
 *
 * Memory: one device buffer per computed value (phase 1), sized for the
 * largest step so far and regrown when a step is larger. Views share their
 * operand's buffer (cuda.meta's aliases).
 */
#include <stdlib.h>
#include <string.h>

#include "runtime/backend.h"
#include "runtime/cuda_api.h"
#include "runtime/cuda_meta.h"

#define NO_BUFFER SIZE_MAX /* act_off of a value with no buffer of its own */
enum { ACT_ALIGN = 256 };  /* bytes: each value's buffer starts aligned */

/* Where a value's data lives. */
typedef enum value_home {
    HOME_ACTS,      /* its own buffer in the activations */
    HOME_ALIAS,     /* another value's buffer (root) */
    HOME_WEIGHT,    /* the weights upload */
    HOME_TOKENS,    /* the step's token ids */
    HOME_POSITIONS, /* the step's positions */
} value_home;

typedef struct cu_state {
    krt_cuda_api api;         /* libcuda, loaded */
    krt_cu_device dev;        /* the device (ordinal 0) */
    krt_cu_ctx ctx;           /* its primary context, retained while ctx_held */
    int ctx_held;             /* 1 after cuDevicePrimaryCtxRetain succeeded */
    char device_name[128];    /* as the driver names it */
    char arch[16];            /* the cubin picked, "sm_90" */
    krt_cu_mod module;        /* the loaded cubin; NULL until loaded */
    krt_cuda_meta meta;       /* the launch table */
    krt_cu_fn *fns;           /* [meta.n_kernels] the kernels, looked up */
    const krt_engine *e;      /* the engine; not owned */
    const kir_graph *g;       /* its graph */
    const char *name;         /* what step errors are reported against: the model's name */
    krt_kv *kv;               /* the KV cache (attach); not owned */
    int has_kv;               /* 1 when the graph reads or writes the KV cache */
    uint32_t *root;           /* [n_nodes] the value whose buffer holds each value */
    value_home *home;         /* [n_nodes] where each value lives */
    const uint8_t *wsection;  /* the weights section inside the engine's map */
    krt_cu_ptr weights;       /* its copy on the device; 0 when there are no weights */
    krt_cu_ptr acts;          /* the activations: one buffer per computed value */
    size_t *act_off;          /* [n_nodes] byte offset of each own buffer in acts; NO_BUFFER */
    int64_t t_cap;            /* tokens acts is sized for (0: not allocated) */
    krt_cu_ptr step_dev;      /* the step's int arrays on the device */
    size_t step_dev_cap;      /* bytes allocated there */
    int32_t *step_host;       /* the step's int arrays, staged */
    size_t step_host_cap;     /* int32 entries allocated */
    int32_t *seq_off;         /* [max_seqs] scratch: a sequence's table offset in this step, -1 unseen */
    int64_t *order;           /* scratch [2 * T]: (slot, token) pairs for the duplicate check */
    size_t order_cap;         /* capacity of order, in pairs */
    int kv_failed;            /* a KV block copy failed; reported by the next step */
} cu_state;

/* ---- messages ------------------------------------------------------------------------- */
static int cu_error(const cu_state *s, ks_diag *d, krt_cu_result r, const char *fmt, ...) KS_PRINTF(4, 5);
static int cu_error(const cu_state *s, ks_diag *d, krt_cu_result r, const char *fmt, ...)
{
    ks_buf msg = {0};
    va_list ap;
    va_start(ap, fmt);
    ks_buf_vprintf(&msg, fmt, ap);
    va_end(ap);
    ks_buf_puts(&msg, ": ");
    krt_cuda_describe(&s->api, r, &msg);
    ks_error(d, "cuda", "%s", ks_buf_cstr(&msg));
    ks_buf_free(&msg);
    return -1;
}

static int step_error(const cu_state *s, ks_diag *d, const char *fmt, ...) KS_PRINTF(3, 4);
static int step_error(const cu_state *s, ks_diag *d, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ks_verror(d, s->name, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- the KV cache's blocks in device memory ---------------------------------------------- */
static void *kv_alloc(void *ctx, size_t bytes)
{
    cu_state *s = ctx;
    krt_cu_ptr p = 0;
    if (s->api.cuCtxSetCurrent(s->ctx) != 0 || s->api.cuMemAlloc(&p, bytes) != 0) return NULL;
    /* zeroed, as the host storage is: a row read before it is written holds zeros */
    if (s->api.cuMemsetD8(p, 0, bytes) != 0) {
        s->api.cuMemFree(p);
        return NULL;
    }
    return (void *)(uintptr_t)p;
}

static void kv_free(void *ctx, void *p)
{
    cu_state *s = ctx;
    s->api.cuCtxSetCurrent(s->ctx);
    s->api.cuMemFree((krt_cu_ptr)(uintptr_t)p);
}

static void kv_copy(void *ctx, void *base, size_t dst_off, size_t src_off, size_t bytes)
{
    cu_state *s = ctx;
    krt_cu_ptr b = (krt_cu_ptr)(uintptr_t)base;
    if (s->api.cuCtxSetCurrent(s->ctx) != 0 || s->api.cuMemcpyDtoD(b + dst_off, b + src_off, bytes) != 0)
        s->kv_failed = 1;
}

/* ctx is replaced by the backend's state (krt_backend.open). */
static const krt_kv_storage cuda_kv_storage = {NULL, kv_alloc, kv_free, kv_copy};

/* ---- open: the device, the cubin, the kernels --------------------------------------------- */
static void cuda_destroy(void *state);

/* The architectures of the engine, "sm_80, sm_90", into b. */
static void list_archs(const krt_cuda_meta *m, ks_buf *b)
{
    for (int i = 0; i < m->n_archs; i++) ks_buf_printf(b, "%s%s", i ? ", " : "", m->archs[i]);
}

static int open_device(cu_state *s, ks_diag *d)
{
    krt_cu_result r = s->api.cuInit(0);
    if (r != 0) return cu_error(s, d, r, "cannot initialize the driver (cuInit)");
    int count = 0;
    r = s->api.cuDeviceGetCount(&count);
    if (r != 0) return cu_error(s, d, r, "cannot count devices");
    if (count == 0) {
        ks_error(d, "cuda", "no CUDA device is present");
        return -1;
    }
    int major = 0, minor = 0;
    if ((r = s->api.cuDeviceGet(&s->dev, 0)) != 0 ||
        (r = s->api.cuDeviceGetName(s->device_name, (int)sizeof s->device_name, s->dev)) != 0 ||
        (r = s->api.cuDeviceGetAttribute(&major, KRT_CU_ATTR_CC_MAJOR, s->dev)) != 0 ||
        (r = s->api.cuDeviceGetAttribute(&minor, KRT_CU_ATTR_CC_MINOR, s->dev)) != 0)
        return cu_error(s, d, r, "cannot query device 0");
    int pick = krt_cuda_pick_arch(s->meta.archs, s->meta.n_archs, major, minor);
    if (pick < 0) {
        ks_buf have = {0};
        list_archs(&s->meta, &have);
        ks_error(d, s->e->path,
                 "the engine holds kernels for %s; the GPU (%s) is sm_%d%d, which runs none of them: rebuild the "
                 "engine with --target sm_%d%d",
                 ks_buf_cstr(&have), s->device_name, major, minor, major, minor);
        ks_buf_free(&have);
        return -1;
    }
    snprintf(s->arch, sizeof s->arch, "%s", s->meta.archs[pick]);
    return 0;
}

static int load_kernels(cu_state *s, ks_diag *d)
{
    ks_buf section = {0};
    ks_buf_printf(&section, "%s%s", KRT_CUDA_SECTION_PREFIX, s->arch);
    size_t size = 0;
    const void *cubin = krt_engine_section_data(s->e, ks_buf_cstr(&section), &size);
    if (!cubin || size == 0) {
        ks_error(d, s->e->path, "damaged: cuda.meta lists %s but there is no '%s' section", s->arch,
                 ks_buf_cstr(&section));
        ks_buf_free(&section);
        return -1;
    }
    ks_buf_free(&section);
    krt_cu_result r = s->api.cuDevicePrimaryCtxRetain(&s->ctx, s->dev);
    if (r != 0) return cu_error(s, d, r, "cannot take the device's context");
    s->ctx_held = 1;
    if ((r = s->api.cuCtxSetCurrent(s->ctx)) != 0) return cu_error(s, d, r, "cannot use the device's context");
    /* cuModuleLoadData wants the image aligned as an ELF file: copy it out of the map */
    void *image = ks_xmalloc(size);
    memcpy(image, cubin, size);
    r = s->api.cuModuleLoadData(&s->module, image);
    free(image);
    if (r != 0) return cu_error(s, d, r, "cannot load the engine's %s kernels", s->arch);
    s->fns = ks_xcalloc((size_t)s->meta.n_kernels + 1, sizeof *s->fns);
    for (int i = 0; i < s->meta.n_kernels; i++) {
        r = s->api.cuModuleGetFunction(&s->fns[i], s->module, s->meta.kernels[i].name);
        if (r != 0) return cu_error(s, d, r, "damaged engine: kernel %s is not in its %s cubin", s->meta.kernels[i].name, s->arch);
    }
    return 0;
}

static void *cuda_open(const krt_engine *e, ks_diag *d)
{
    size_t size = 0;
    const char *text = krt_engine_section_data(e, KRT_CUDA_META_SECTION, &size);
    if (!text) {
        ks_error(d, e->path, "damaged: the engine's target is cuda but it has no %s section", KRT_CUDA_META_SECTION);
        return NULL;
    }
    cu_state *s = ks_xcalloc(1, sizeof *s);
    s->e = e;
    s->g = e->graph;
    s->name = s->g->name && s->g->name[0] ? s->g->name : "cuda";
    if (krt_cuda_meta_parse(text, size, e->path, &s->meta, d) != 0 || krt_cuda_api_load(&s->api, d) != 0 ||
        open_device(s, d) != 0 || load_kernels(s, d) != 0) {
        cuda_destroy(s);
        return NULL;
    }
    return s;
}

/* ---- attach: the KV cache, the weights, the value table --------------------------------------- */
static int meta_error(cu_state *s, ks_diag *d, const char *fmt, ...) KS_PRINTF(3, 4);
static int meta_error(cu_state *s, ks_diag *d, const char *fmt, ...)
{
    ks_buf msg = {0};
    va_list ap;
    va_start(ap, fmt);
    ks_buf_vprintf(&msg, fmt, ap);
    va_end(ap);
    ks_error(d, s->e->path, "damaged cuda.meta: %s", ks_buf_cstr(&msg));
    ks_buf_free(&msg);
    return -1;
}

/* Where every value lives, from the graph and the aliases; checks the aliases. */
static int place_values(cu_state *s, ks_diag *d)
{
    const kir_graph *g = s->g;
    size_t n = g->n_nodes;
    s->root = ks_xcalloc(n ? n : 1, sizeof *s->root);
    s->home = ks_xcalloc(n ? n : 1, sizeof *s->home);
    s->act_off = ks_xcalloc(n ? n : 1, sizeof *s->act_off);
    for (size_t v = 0; v < n; v++) {
        const kir_node *nd = &g->nodes[v];
        s->root[v] = (uint32_t)v;
        s->act_off[v] = NO_BUFFER;
        if (nd->op == KIR_OP_WEIGHT)
            s->home[v] = HOME_WEIGHT;
        else if (nd->op == KIR_OP_INPUT)
            s->home[v] = strcmp(kir_get_str(g, (kir_val)v, "name", ""), "tokens") == 0 ? HOME_TOKENS : HOME_POSITIONS;
        else
            s->home[v] = HOME_ACTS;
    }
    for (int i = 0; i < s->meta.n_aliases; i++) {
        uint32_t v = s->meta.aliases[i][0], of = s->meta.aliases[i][1];
        if (v >= n || of >= v || s->home[v] != HOME_ACTS || kir_elems(&g->nodes[v], 1) > kir_elems(&g->nodes[of], 1))
            return meta_error(s, d, "alias [%u, %u] does not fit the graph", v, of);
        s->root[v] = s->root[of];
        s->home[v] = HOME_ALIAS;
    }
    if (s->meta.output >= n || s->home[s->meta.output] == HOME_WEIGHT ||
        kir_row_elems(&g->nodes[s->meta.output]) != kir_output_row_elems(g))
        return meta_error(s, d, "output %u is not the graph's output", s->meta.output);
    return 0;
}

/* Every kernel's node, values and layers exist. */
static int check_kernels(cu_state *s, ks_diag *d)
{
    const krt_kv_config *cfg = krt_kv_config_of(s->kv);
    for (int i = 0; i < s->meta.n_kernels; i++) {
        const krt_cuda_kernel *k = &s->meta.kernels[i];
        if (k->node >= s->g->n_nodes) return meta_error(s, d, "kernel %s computes node %u, past the graph", k->name, k->node);
        for (int a = 0; a < k->n_args; a++) {
            const krt_cuda_arg *arg = &k->args[a];
            if (arg->kind == KRT_CUDA_ARG_VALUE && arg->index >= (int64_t)s->g->n_nodes)
                return meta_error(s, d, "kernel %s reads value %lld, past the graph", k->name, (long long)arg->index);
            if (arg->kind == KRT_CUDA_ARG_KV_K || arg->kind == KRT_CUDA_ARG_KV_V) {
                if (arg->index >= cfg->n_layers || cfg->layers[arg->index].kv_heads == 0)
                    return meta_error(s, d, "kernel %s uses KV layer %lld, which the cache does not have", k->name,
                                      (long long)arg->index);
                s->has_kv = 1;
            }
        }
    }
    if (cfg->elem_size != sizeof(float))
        return meta_error(s, d, "the KV cache holds %zu-byte elements; these kernels need f32", cfg->elem_size);
    return 0;
}

static int upload_weights(cu_state *s, ks_diag *d)
{
    size_t size = 0;
    s->wsection = krt_engine_section_data(s->e, "weights", &size);
    if (!s->wsection || size == 0) return 0;
    krt_cu_result r = s->api.cuMemAlloc(&s->weights, size);
    if (r != 0) {
        s->weights = 0;
        return cu_error(s, d, r, "cannot allocate %zu bytes for the weights", size);
    }
    r = s->api.cuMemcpyHtoD(s->weights, s->wsection, size);
    if (r != 0) return cu_error(s, d, r, "cannot upload the weights");
    return 0;
}

static int cuda_attach(void *state, krt_kv *kv, ks_diag *d)
{
    cu_state *s = state;
    s->kv = kv;
    krt_cu_result r = s->api.cuCtxSetCurrent(s->ctx);
    if (r != 0) return cu_error(s, d, r, "cannot use the device's context");
    const krt_kv_config *cfg = krt_kv_config_of(kv);
    s->seq_off = ks_xcalloc((size_t)cfg->max_seqs, sizeof *s->seq_off);
    if ((int64_t)cfg->n_blocks * cfg->block_size > INT32_MAX) {
        ks_error(d, "cuda", "a KV cache of %d blocks of %d positions has more rows than the kernels index (2^31)",
                 cfg->n_blocks, cfg->block_size);
        return -1;
    }
    if (place_values(s, d) != 0 || check_kernels(s, d) != 0) return -1;
    return upload_weights(s, d);
}

static void cuda_destroy(void *state)
{
    cu_state *s = state;
    if (!s) return;
    if (s->ctx_held) {
        s->api.cuCtxSetCurrent(s->ctx);
        if (s->acts) s->api.cuMemFree(s->acts);
        if (s->step_dev) s->api.cuMemFree(s->step_dev);
        if (s->weights) s->api.cuMemFree(s->weights);
        if (s->module) s->api.cuModuleUnload(s->module);
        s->api.cuDevicePrimaryCtxRelease(s->dev);
    }
    krt_cuda_api_unload(&s->api);
    krt_cuda_meta_free(&s->meta);
    free(s->fns);
    free(s->root);
    free(s->home);
    free(s->act_off);
    free(s->step_host);
    free(s->seq_off);
    free(s->order);
    free(s);
}

/* ---- a step ----------------------------------------------------------------------------------- */
/* Activation buffers for steps of up to T tokens. */
static int reserve_acts(cu_state *s, int64_t T, ks_diag *d)
{
    if (T <= s->t_cap) return 0;
    int64_t cap = s->t_cap * 2 > T ? s->t_cap * 2 : T;
    size_t at = 0;
    for (size_t v = 0; v < s->g->n_nodes; v++) {
        if (s->home[v] != HOME_ACTS) continue;
        s->act_off[v] = at;
        size_t bytes = (size_t)kir_elems(&s->g->nodes[v], cap) * sizeof(float);
        at += (bytes + ACT_ALIGN - 1) / ACT_ALIGN * ACT_ALIGN;
    }
    if (s->acts) s->api.cuMemFree(s->acts);
    s->acts = 0;
    s->t_cap = 0;
    krt_cu_result r = s->api.cuMemAlloc(&s->acts, at ? at : ACT_ALIGN);
    if (r != 0) {
        s->acts = 0;
        return cu_error(s, d, r, "cannot allocate %zu bytes of activations for %lld tokens", at, (long long)cap);
    }
    s->t_cap = cap;
    return 0;
}

static int compare_pairs(const void *a, const void *b)
{
    const int64_t *x = a, *y = b;
    if (x[0] != y[0]) return x[0] < y[0] ? -1 : 1;
    return (x[1] > y[1]) - (x[1] < y[1]);
}

/* The interpreter's checks of a step (ir/interp.c), with its messages:
 * positions reserved, ids inside their tables, no KV row written twice.
 * Fills slots[T] on the way. */
static int check_step(cu_state *s, const kir_step *st, int32_t *slots, ks_diag *d)
{
    const kir_graph *g = s->g;
    for (int i = 0; i < st->n_tokens; i++) {
        int seq = st->seq_ids[i], pos = st->positions[i];
        slots[i] = 0;
        if (pos < 0) return step_error(s, d, "token %d: negative position %d", i, pos);
        if (!s->has_kv) continue;
        if (!krt_kv_seq_exists(s->kv, seq)) return step_error(s, d, "token %d: unknown sequence %d", i, seq);
        int len = krt_kv_seq_len(s->kv, seq);
        if (pos >= len)
            return step_error(s, d,
                              "token %d: position %d of sequence %d is beyond what the KV cache has reserved "
                              "(%d positions)",
                              i, pos, seq, len);
        slots[i] = (int32_t)krt_kv_slot(s->kv, seq, pos);
    }
    for (size_t v = 0; v < g->n_nodes; v++) {
        const kir_node *n = &g->nodes[v];
        if (n->op != KIR_OP_EMBED) continue;
        int64_t rows = g->nodes[n->in[0]].dims[0];
        int tokens = s->home[n->in[1]] == HOME_TOKENS;
        const int32_t *ids = tokens ? st->tokens : st->positions;
        for (int i = 0; i < st->n_tokens; i++) {
            if (ids[i] >= 0 && ids[i] < rows) continue;
            if (tokens)
                return step_error(s, d, "token %d: id %d is out of range (the vocabulary has %lld ids)", i, ids[i],
                                  (long long)rows);
            return step_error(s, d, "token %d: position %d is out of range (the position table has %lld rows)", i,
                              ids[i], (long long)rows);
        }
    }
    if (!s->has_kv) return 0;
    /* the same slot twice is the same (sequence, position) twice: sort (slot, token) pairs */
    KS_GROW(s->order, 2 * (size_t)st->n_tokens, s->order_cap, (size_t)1 << 32, "tokens in a step");
    for (int i = 0; i < st->n_tokens; i++) s->order[2 * i] = slots[i], s->order[2 * i + 1] = i;
    qsort(s->order, (size_t)st->n_tokens, 2 * sizeof *s->order, compare_pairs);
    for (int i = 1; i < st->n_tokens; i++) {
        if (s->order[2 * i] != s->order[2 * (i - 1)]) continue;
        int64_t a = s->order[2 * (i - 1) + 1], b = s->order[2 * i + 1];
        int first = (int)(a < b ? a : b), second = (int)(a < b ? b : a);
        return step_error(s, d, "tokens %d and %d both write position %d of sequence %d", first, second,
                          st->positions[first], st->seq_ids[first]);
    }
    return 0;
}

/* Device addresses of the step's arrays. */
typedef struct step_ptrs {
    krt_cu_ptr tokens, positions, slots, table_off, tables; /* int32 arrays */
} step_ptrs;

/* Stage and upload tokens | positions | slots | table_off | tables. */
static int upload_step(cu_state *s, const kir_step *st, step_ptrs *p, ks_diag *d)
{
    size_t T = (size_t)st->n_tokens;
    /* the block tables of the step's sequences, each once, in order of first appearance;
     * their ids go to order (free again after check_step) */
    size_t n_tables = 0, n_seqs = 0;
    if (s->has_kv) {
        KS_GROW(s->order, T, s->order_cap, (size_t)1 << 32, "tokens in a step");
        for (size_t i = 0; i < T; i++) s->seq_off[st->seq_ids[i]] = -1;
        for (size_t i = 0; i < T; i++) {
            int seq = st->seq_ids[i], nb = 0;
            if (s->seq_off[seq] >= 0) continue;
            krt_kv_block_table(s->kv, seq, &nb);
            s->seq_off[seq] = (int32_t)n_tables;
            s->order[n_seqs++] = seq;
            n_tables += (size_t)nb;
        }
    }
    size_t total = 4 * T + n_tables;
    KS_GROW(s->step_host, total, s->step_host_cap, (size_t)1 << 31, "step arrays");
    int32_t *h = s->step_host;
    memcpy(h, st->tokens, sizeof *h * T);
    memcpy(h + T, st->positions, sizeof *h * T);
    /* [2T, 3T): the slots, filled by check_step */
    for (size_t i = 0; i < T; i++) h[3 * T + i] = s->has_kv ? s->seq_off[st->seq_ids[i]] : 0;
    for (size_t i = 0; i < n_seqs; i++) {
        int seq = (int)s->order[i], nb = 0;
        const int32_t *table = krt_kv_block_table(s->kv, seq, &nb);
        memcpy(h + 4 * T + s->seq_off[seq], table, sizeof *h * (size_t)nb);
    }
    size_t bytes = sizeof *h * total;
    if (bytes > s->step_dev_cap) {
        if (s->step_dev) s->api.cuMemFree(s->step_dev);
        s->step_dev = 0;
        s->step_dev_cap = 0;
        size_t cap = bytes * 2;
        krt_cu_result r = s->api.cuMemAlloc(&s->step_dev, cap);
        if (r != 0) {
            s->step_dev = 0;
            return cu_error(s, d, r, "cannot allocate %zu bytes for a step's arrays", cap);
        }
        s->step_dev_cap = cap;
    }
    krt_cu_result r = s->api.cuMemcpyHtoD(s->step_dev, h, bytes);
    if (r != 0) return cu_error(s, d, r, "cannot upload a step's arrays");
    p->tokens = s->step_dev;
    p->positions = s->step_dev + 4 * T;
    p->slots = s->step_dev + 8 * T;
    p->table_off = s->step_dev + 12 * T;
    p->tables = s->step_dev + 16 * T;
    return 0;
}

/* The device address of value v. */
static krt_cu_ptr value_ptr(const cu_state *s, uint32_t v, const step_ptrs *p)
{
    uint32_t r = s->root[v];
    switch (s->home[r]) {
    case HOME_WEIGHT:
        return s->weights + (krt_cu_ptr)((const uint8_t *)s->e->weights[r] - s->wsection);
    case HOME_TOKENS:
        return p->tokens;
    case HOME_POSITIONS:
        return p->positions;
    case HOME_ACTS:
        KS_ASSERT(s->act_off[r] != NO_BUFFER);
        return s->acts + s->act_off[r];
    case HOME_ALIAS:
        break;
    }
    KS_UNREACHABLE();
}

static int launch(cu_state *s, int i, const kir_step *st, const step_ptrs *p, ks_diag *d)
{
    const krt_cuda_kernel *k = &s->meta.kernels[i];
    const krt_kv_config *cfg = krt_kv_config_of(s->kv);
    int64_t T = st->n_tokens, grid[3];
    static const int64_t limit[3] = {INT32_MAX, 65535, 65535};
    for (int g = 0; g < 3; g++) {
        grid[g] = krt_cuda_grid_dim(k, g, T);
        if (grid[g] > limit[g]) {
            ks_error(d, "cuda", "kernel %s: a step of %lld tokens needs %lld blocks in grid dimension %d (at most %lld)",
                     k->name, (long long)T, (long long)grid[g], g, (long long)limit[g]);
            return -1;
        }
        if (grid[g] <= 0) return 0; /* nothing to do */
    }
    /* Each parameter's value in an 8-byte slot; the entries past the last
     * parameter stay NULL (the driver ignores them; a CPU stand-in for
     * libcuda in the tests stops at the first NULL). */
    union {
        krt_cu_ptr ptr; /* a pointer parameter */
        int i;          /* an int parameter */
    } slot[KRT_CUDA_MAX_ARGS] = {{0}};
    void *params[KRT_CUDA_MAX_ARGS + 1] = {0};
    for (int a = 0; a < k->n_args; a++) {
        const krt_cuda_arg *arg = &k->args[a];
        params[a] = &slot[a];
        switch (arg->kind) {
        case KRT_CUDA_ARG_T:
            slot[a].i = st->n_tokens;
            break;
        case KRT_CUDA_ARG_BLOCK_SIZE:
            slot[a].i = cfg->block_size;
            break;
        case KRT_CUDA_ARG_VALUE:
            slot[a].ptr = value_ptr(s, (uint32_t)arg->index, p);
            break;
        case KRT_CUDA_ARG_KV_K:
            slot[a].ptr = (krt_cu_ptr)(uintptr_t)krt_kv_k(s->kv, (int)arg->index);
            break;
        case KRT_CUDA_ARG_KV_V:
            slot[a].ptr = (krt_cu_ptr)(uintptr_t)krt_kv_v(s->kv, (int)arg->index);
            break;
        case KRT_CUDA_ARG_POSITIONS:
            slot[a].ptr = p->positions;
            break;
        case KRT_CUDA_ARG_SLOTS:
            slot[a].ptr = p->slots;
            break;
        case KRT_CUDA_ARG_TABLE_OFF:
            slot[a].ptr = p->table_off;
            break;
        case KRT_CUDA_ARG_TABLES:
            slot[a].ptr = p->tables;
            break;
        case KRT_CUDA_ARG_COUNT:
            KS_UNREACHABLE();
        }
    }
    krt_cu_result r = s->api.cuLaunchKernel(s->fns[i], (unsigned)grid[0], (unsigned)grid[1], (unsigned)grid[2],
                                            (unsigned)k->block, 1, 1, 0, NULL, params, NULL);
    if (r != 0) return cu_error(s, d, r, "cannot launch %s", k->name);
    return 0;
}

static int cuda_step(void *state, const kir_step *st, float *out, ks_diag *d)
{
    cu_state *s = state;
    KS_ASSERT(st && st->n_tokens >= 0);
    if (st->n_tokens == 0) return 0;
    KS_ASSERT(st->tokens && st->positions && st->seq_ids && out);
    if (s->kv_failed) {
        ks_error(d, "cuda", "a copy between KV-cache blocks failed earlier; the cache cannot be trusted");
        return -1;
    }
    krt_cu_result r = s->api.cuCtxSetCurrent(s->ctx);
    if (r != 0) return cu_error(s, d, r, "cannot use the device's context");
    size_t T = (size_t)st->n_tokens;
    KS_GROW(s->step_host, 4 * T, s->step_host_cap, (size_t)1 << 31, "step arrays");
    if (check_step(s, st, s->step_host + 2 * T, d) != 0) return -1;
    step_ptrs p;
    if (reserve_acts(s, st->n_tokens, d) != 0 || upload_step(s, st, &p, d) != 0) return -1;
    for (int i = 0; i < s->meta.n_kernels; i++)
        if (launch(s, i, st, &p, d) != 0) return -1;
    int64_t vocab = kir_output_row_elems(s->g);
    r = s->api.cuMemcpyDtoH(out, value_ptr(s, s->meta.output, &p), sizeof(float) * T * (size_t)vocab);
    if (r != 0) return cu_error(s, d, r, "the step failed on the device (%s)", s->device_name);
    return 0;
}

const krt_backend krt_backend_cuda = {
    .name = "cuda",
    .kv_storage = &cuda_kv_storage,
    .kv_elem_size = sizeof(float),
    .create = NULL,
    .destroy = cuda_destroy,
    .step = cuda_step,
    .open = cuda_open,
    .attach = cuda_attach,
};
