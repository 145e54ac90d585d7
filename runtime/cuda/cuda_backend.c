/*
 * cuda_backend.c — the CUDA backend (runtime/backend.h): runs an engine built
 * with `kiln build --target sm_XX,...` on the first GPU.
 *
 * open:   checks cuda.meta and the memory plan against the graph, loads
 *         libcuda (runtime/cuda/cuda_api.h), picks the cubin for the
 *         device's compute capability — or says which architectures the
 *         engine has and which the device is, before allocating anything —
 *         loads it, looks up every kernel of cuda.meta (and krt_draw, the
 *         draw kernel, when the engine has it), uploads the weights section
 *         as it lies in the file (one copy), and allocates the activations'
 *         arena, so that what is free afterwards can size the KV cache
 *         (mem_info).
 * attach: checks cuda.meta against the graph and the KV cache, whose blocks
 *         live in device memory (cuda_kv_storage below).
 * step:   (checked by the session) uploads the
 *         step's ids, positions, KV slots and block tables in one copy, runs
 *         the kernels in order, copies the logits back — or draws the next
 *         tokens on the device (runtime/cuda/cuda_draw.h) and copies back only
 *         those — and waits for the stream.
 *
 * Every copy and launch goes on one stream of the backend's, in order, so
 * nothing needs more synchronization than the wait at the end of a step.
 *
 * Memory: the engine's memory plan (e->desc.plan: passes/plan_memory.c
 * made it) gives one arena, allocated once at open, valid for every step of
 * up to plan.max_tokens tokens (the session refuses larger ones); each
 * computed value lives at its offset (a smaller step uses a prefix of each
 * value's bytes). Views share their
 * operand's bytes (cuda.meta's aliases), and the plan must agree: an alias
 * whose plan offset is not its root's is a damaged engine. An engine built
 * without a plan (kiln build --passes none) gets every computed value its
 * own bytes instead, sized for the largest step so far (at least
 * graph_max_tokens) and regrown when a step is larger.
 *
 * CUDA graphs: a step of T <= graph_max_tokens tokens is captured once per T
 * (lazily, the first time a step of that size comes) and replayed after
 * that: the exact size, not a padded bucket, so a replay launches exactly the
 * kernels an eager step would, with the same T, and its results are the same
 * bits. Kernels whose variant follows the step's longest sequence
 * (large_per_seq: attention, a prompt's prefill kernel against a batch of
 * decode tokens' kernel) make that a second key: the class of the step's
 * longest run among their thresholds (seq_thr). Graph steps read their arrays from a fixed buffer (g_step, laid out
 * for graph_max_tokens tokens and as many block-table entries as that many
 * full sequences have), and write the activations, whose address is baked
 * into the graphs: the planned arena never moves; an unplanned engine's
 * activations move when a larger eager step regrows them, and its graphs
 * are then dropped and captured again on demand.
 *
 * The head on the drawn rows (find_head, launch_head): an eager step that
 * wants no logits back, only draws from fewer rows than it has (a prompt's
 * last token), gathers those rows of the head's activation and runs the
 * head (the final norm and lm_head, the last kernel) on them alone: the
 * draws read its rows 0 .. n_draw - 1. Steps that copy logits back, graph
 * steps, tapped steps, and heads that would take a variant at that many
 * rows (tensor maps over the whole activation) compute every row.
 *
 * The tap (kiln verify): a tapped step launches eagerly and copies each
 * value back right after the launch that writes it (later values may take
 * its bytes); values that no launch writes (a fused kernel's own) are not
 * shown.
 *
 * Profiling (krt_backend_opts.profile): no graphs; every launch between two
 * events, timed after the step's wait, and summed per kernel name for
 * prefill steps (more than KRT_PROFILE_DECODE_TOKENS tokens) and decode
 * steps apart, with each step's device time from its first launch to its
 * last copy; profile_report writes the tables (runtime/cuda/cuda_profile.c).
 */
#include <stdlib.h>
#include <string.h>

#include "runtime/backend.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda/cuda_draw.h"
#include "runtime/cuda/cuda_meta.h"
#include "runtime/cuda/cuda_profile.h"

#define NO_BUFFER SIZE_MAX /* act_off of a value with no buffer of its own */
enum { ACT_ALIGN = 256 };  /* bytes: each value's buffer starts aligned */

/* Where a value's data lives. */
typedef enum value_home {
    HOME_ACTS,      /* its own buffer in the activations */
    HOME_ALIAS,     /* another value's buffer (root) */
    HOME_WEIGHT,    /* the weights upload */
    HOME_TOKENS,    /* the step's token ids */
    HOME_POSITIONS, /* the step's positions */
    HOME_SEQ_LENGTHS, /* the step's sequence lengths (krt_step_seq_lengths) */
} value_home;

/* distinct thresholds of large_per_seq kernels an engine may have (the generator's: one, ATT_FLASH_T) */
enum { KRT_CUDA_MAX_SEQ_THR = 4 };

typedef struct cu_state {
    krt_cuda_api api;         /* libcuda, loaded */
    krt_cu_device dev;        /* the device (ordinal 0) */
    krt_cu_ctx ctx;           /* its primary context, retained while ctx_held */
    int ctx_held;             /* 1 after cuDevicePrimaryCtxRetain succeeded */
    char device_name[128];    /* as the driver names it */
    char arch[16];            /* the cubin picked, "sm_90" */
    int pdl;                  /* 1: kernels launched with programmatic stream serialization (launch_fn) */
    int carveout;             /* KILN_CUDA_CARVEOUT (0-100): every kernel's preferred shared-memory share of
                                 L1 (100: the most, so that a decode matmul's block and the next kernel's,
                                 launched early, fit an SM together); -1: the driver's choice */
    krt_cu_mod module;        /* the loaded cubin; NULL until loaded */
    krt_cu_stream stream;     /* every copy and launch goes on it; NULL until created */
    krt_backend_opts opts;    /* graphs on or off, and the largest step captured */
    krt_cuda_meta meta;       /* the launch table */
    krt_cu_fn *fns;           /* [meta.n_kernels] the kernels, looked up */
    krt_cu_fn *fns_large;     /* [meta.n_kernels] their variants for steps above large_above tokens, or NULL */
    krt_cu_fn draw_fn;        /* krt_draw (runtime/cuda/cuda_draw.h), or NULL: the engine predates it */
    /* variants (cuda.meta "variants": the sm_90a matmul) of the loaded arch: launch slot
     * vbase[i] + j * KRT_CUDA_MAX_LAUNCHES + l is launch l of variant j of kernel i */
    size_t *vbase;            /* [meta.n_kernels] */
    size_t n_vslots;          /* launch slots in all */
    krt_cu_fn *vfns;          /* [n_vslots] the variants' kernels (NULL: another arch's, never launched) */
    size_t *tm_base;          /* [n_vslots] the slot's first tensor map in tmaps (its TMAP args in order) */
    krt_cu_tmap *tmaps;       /* every tensor map a variant passes, made once a session (make_tmaps) */
    size_t n_tmaps;           /* how many */
    int64_t tmaps_rows;       /* the activation rows they were made for (0: not made) */
    int64_t xq_cols;          /* the widest row of a value the loaded arch's launches read as codes ("xcodes",
                                 "xscales", "tmap_xcodes"; 0: none): the scratch after the activations holds
                                 t_cap such rows of one-byte codes, then t_cap f32 scales (xq_ptr) */
    size_t wdeq_bytes;        /* the largest weight the loaded arch's launches dequantize ("wdeq", "tmap_wdeq"), at 2
                                 bytes an element: the scratch holds it after the codes (wdeq_ptr) */
    size_t scratch_off;       /* where the scratch starts in acts */
    const krt_engine *e;      /* the engine; not owned */
    const krt_desc *desc;     /* its description: &e->desc */
    const kir_graph *g;       /* its graph */
    krt_kv *kv;               /* the KV cache (attach); not owned */
    int has_kv;               /* 1 when the graph reads or writes the KV cache */
    uint32_t *root;           /* [n_nodes] the value whose buffer holds each value */
    value_home *home;         /* [n_nodes] where each value lives */
    const uint8_t *wsection;  /* the weights section inside the engine's map */
    krt_cu_ptr weights;       /* its copy on the device; 0 when there are no weights */
    krt_cu_ptr acts;          /* the activations: the planned arena, or one buffer per computed value */
    size_t *act_off;          /* [n_nodes] byte offset of each own buffer in acts; NO_BUFFER */
    size_t acts_bytes;        /* bytes allocated at acts */
    int64_t t_cap;            /* tokens acts is sized for (0: not allocated) */
    krt_cu_ptr step_dev;      /* eager steps' int arrays on the device */
    size_t step_dev_cap;      /* bytes allocated there */
    int32_t *stage;           /* the step's int arrays, staged on the host for one copy */
    size_t stage_cap;         /* int32 entries allocated */
    int32_t *slots;           /* [T] scratch: the KV row each token writes */
    size_t slots_cap;         /* entries allocated */
    int32_t *seq_off;         /* [max_seqs] scratch: a sequence's table offset in this step, -1 unseen */
    int32_t *seq_count;       /* [max_seqs] scratch: a sequence's tokens in this step (longest_run) */
    int64_t seq_thr[KRT_CUDA_MAX_SEQ_THR]; /* the large_above of large_per_seq kernels, distinct, ascending */
    int n_seq_thr;            /* how many: graphs are keyed by T and how many of them a step's longest run passes */
    int64_t *order;           /* scratch [T]: the sequences of a step, in order of first appearance */
    size_t order_cap;         /* capacity of order */
    int kv_failed;            /* a KV block copy failed; reported by the next step */
    /* CUDA graphs */
    krt_cu_graph_exec *graphs; /* [(opts.graph_max_tokens + 1) (n_seq_thr + 1)]: the step of T tokens whose longest
                                * sequence passes c of seq_thr at T (n_seq_thr + 1) + c, NULL until captured */
    int n_graphs;             /* graphs held now */
    krt_cu_ptr g_step;        /* graph steps' int arrays: 5 * graph_max_tokens + g_tables entries */
    size_t g_tables;          /* block-table entries g_step holds */
    /* draws on the device */
    krt_cu_ptr draw_dev;      /* rows [draw_cap] | records [draw_cap] | keys, masses [draw_cap * vocab] */
    int draw_cap;             /* draws draw_dev holds; 0: not allocated */
    krt_cuda_draw_row *draw_rows; /* [draw_cap] the records, staged on the host */
    int32_t *draw_iota;       /* [draw_cap] 0, 1, 2, ...: the logits rows of draws after the head on drawn rows */
    /* the tap */
    krt_tap_fn tap;           /* shown every f32 value after a step, or NULL */
    void *tap_ctx;            /* its context */
    int *tap_after;           /* [n_nodes] the launch after which each value is copied back; -1: not shown */
    size_t *tap_off;          /* [n_nodes] where a shown value lies in tap_buf this step, in floats */
    float *tap_buf;           /* the step's shown values, copied back */
    size_t tap_cap;           /* floats allocated */
    /* the head on the drawn rows only (find_head) */
    int head;                 /* the kernel that computes the logits alone from one activation, or -1 */
    uint32_t head_x;          /* that activation (a row a token) */
    size_t head_row_bytes;    /* bytes of one of its rows */
    krt_cu_ptr head_rows;     /* the drawn rows of head_x, gathered: head_rows_cap rows */
    int head_rows_cap;        /* rows allocated there */
    /* the profile (opts.profile) */
    krt_cu_profile *events;   /* the events around each launch and what they sum to (runtime/cuda/cuda_profile.h);
                                 NULL when not profiling */
} cu_state;

/* ---- messages ------------------------------------------------------------------------- */
static int cu_error(const cu_state *s, ks_diag *d, krt_cu_result r, const char *fmt, ...) KS_PRINTF(4, 5);
static int cu_error(const cu_state *s, ks_diag *d, krt_cu_result r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    krt_cuda_verror(&s->api, d, r, fmt, ap);
    va_end(ap);
    return -1;
}

static int meta_error(cu_state *s, ks_diag *d, const char *fmt, ...) KS_PRINTF(3, 4);
static int meta_error(cu_state *s, ks_diag *d, const char *fmt, ...)
{
    ks_buf msg = KS_BUF_TRY;
    va_list ap;
    va_start(ap, fmt);
    ks_buf_vprintf(&msg, fmt, ap);
    va_end(ap);
    ks_error(d, s->e->path, "damaged cuda.meta: %s", ks_buf_cstr(&msg));
    ks_buf_free(&msg);
    return -1;
}

/* ---- the KV cache's blocks in device memory ---------------------------------------------- */
static void *kv_alloc(void *ctx, size_t bytes)
{
    cu_state *s = ctx;
    krt_cu_ptr p = 0;
    if (s->api.cuCtxSetCurrent(s->ctx) != 0 || s->api.cuMemAlloc(&p, bytes) != 0) return NULL;
    /* zeroed, as the host storage is: a row read before it is written holds zeros;
     * attach waits for the stream, and reports a failure there */
    if (s->api.cuMemsetD8Async(p, 0, bytes, s->stream) != 0) {
        s->api.cuMemFree(p);
        return NULL;
    }
    return (void *)(uintptr_t)p;
}

static void kv_free(void *ctx, void *p)
{
    cu_state *s = ctx;
    s->api.cuCtxSetCurrent(s->ctx);
    s->api.cuStreamSynchronize(s->stream); /* nothing in flight may still use it */
    s->api.cuMemFree((krt_cu_ptr)(uintptr_t)p);
}

/* Copy-on-write of a block: on the stream, so it lands before the next step's kernels. */
static void kv_copy(void *ctx, void *base, size_t dst_off, size_t src_off, size_t bytes)
{
    cu_state *s = ctx;
    krt_cu_ptr b = (krt_cu_ptr)(uintptr_t)base;
    if (s->api.cuCtxSetCurrent(s->ctx) != 0 ||
        s->api.cuMemcpyDtoDAsync(b + dst_off, b + src_off, bytes, s->stream) != 0)
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
        ks_buf have = KS_BUF_TRY;
        list_archs(&s->meta, &have);
        ks_error(d, s->e->path,
                 "the engine holds kernels for %s; the GPU (%s) is sm_%d%d, which runs none of them: rebuild the "
                 "engine with --target sm_%d%d",
                 ks_buf_cstr(&have), s->device_name, major, minor, major, minor);
        ks_buf_free(&have);
        return -1;
    }
    snprintf(s->arch, sizeof s->arch, "%s", s->meta.archs[pick]);
    /* programmatic dependent launch: kernels that wait for their predecessor (the meta says so), a
       device (and so a cubin) of sm_90 or later, a driver with cuLaunchKernelEx, not turned off */
    s->pdl = s->opts.kernel_overlap && s->meta.pdl && major >= 9 && s->api.cuLaunchKernelEx != NULL;
    const char *carve = getenv("KILN_CUDA_CARVEOUT"); /* a measurement knob (bench/gpu_check.sh decode_ab) */
    s->carveout = carve && *carve && atoi(carve) >= 0 && atoi(carve) <= 100 ? atoi(carve) : -1;
    return 0;
}

/* Allow kernel fn (called name) smem bytes of dynamic shared memory (nothing when 0), and give it
 * the preferred carveout where one is asked for, once: the attributes stay with the function. */
static int set_smem(cu_state *s, krt_cu_fn fn, const char *name, int smem, ks_diag *d)
{
    if (s->carveout >= 0 && s->api.cuFuncSetAttribute) {
        krt_cu_result r = s->api.cuFuncSetAttribute(fn, KRT_CU_FUNC_PREFERRED_SHARED_CARVEOUT, s->carveout);
        if (r != 0) return cu_error(s, d, r, "cannot give kernel %s a shared-memory carveout of %d%%", name, s->carveout);
    }
    if (smem <= 0) return 0;
    if (!s->api.cuFuncSetAttribute) {
        ks_error(d, "cuda", "kernel %s needs %d bytes of shared memory, and the driver has no "
                 "cuFuncSetAttribute (CUDA 12 or later has it)", name, smem);
        return -1;
    }
    krt_cu_result r = s->api.cuFuncSetAttribute(fn, KRT_CU_FUNC_MAX_DYNAMIC_SHARED_BYTES, smem);
    return r != 0 ? cu_error(s, d, r, "cannot give kernel %s %d bytes of shared memory", name, smem) : 0;
}

/* The variants' launch slots, and the kernels of those of the loaded arch, each with its dynamic
 * shared memory allowed (once: the attribute stays with the function). */
static int load_variants(cu_state *s, ks_diag *d)
{
    s->vbase = ks_try_calloc((size_t)s->meta.n_kernels + 1, sizeof *s->vbase);
    if (!s->vbase) return ks_error_oom(d, s->e->path, ((size_t)s->meta.n_kernels + 1) * sizeof *s->vbase, "the variants");
    size_t n = 0, maps = 0;
    for (int i = 0; i < s->meta.n_kernels; i++) {
        s->vbase[i] = n;
        n += (size_t)s->meta.kernels[i].n_variants * KRT_CUDA_MAX_LAUNCHES;
    }
    s->n_vslots = n;
    s->vfns = ks_try_calloc(n + 1, sizeof *s->vfns);
    s->tm_base = ks_try_calloc(n + 1, sizeof *s->tm_base);
    if (!s->vfns || !s->tm_base) return ks_error_oom(d, s->e->path, (n + 1) * 2 * sizeof *s->vfns, "the variants");
    for (int i = 0; i < s->meta.n_kernels; i++) {
        const krt_cuda_kernel *k = &s->meta.kernels[i];
        for (int j = 0; j < k->n_variants; j++) {
            const krt_cuda_variant *v = &k->variants[j];
            if (strcmp(v->arch, s->arch) != 0) continue;
            for (int l = 0; l < v->n_launches; l++) {
                const krt_cuda_launch *ln = &v->launches[l];
                size_t slot = s->vbase[i] + (size_t)j * KRT_CUDA_MAX_LAUNCHES + (size_t)l;
                krt_cu_result r = s->api.cuModuleGetFunction(&s->vfns[slot], s->module, ln->name);
                if (r != 0) return cu_error(s, d, r, "damaged engine: kernel %s is not in its %s cubin", ln->name, s->arch);
                if (set_smem(s, s->vfns[slot], ln->name, ln->smem, d) != 0) return -1;
                s->tm_base[slot] = maps;
                for (int a = 0; a < ln->n_args; a++) {
                    const krt_cuda_arg *arg = &ln->args[a];
                    maps += arg->kind == KRT_CUDA_ARG_TMAP || arg->kind == KRT_CUDA_ARG_TMAP_XCODES ||
                            arg->kind == KRT_CUDA_ARG_TMAP_WDEQ;
                    if (arg->kind == KRT_CUDA_ARG_WDEQ || arg->kind == KRT_CUDA_ARG_TMAP_WDEQ) {
                        /* a quantized weight's codes [rows, cols], cols a multiple of 8 */
                        const kir_node *wn = arg->index < (int64_t)s->g->n_nodes ? &s->g->nodes[arg->index] : NULL;
                        if (!wn || s->home[arg->index] != HOME_WEIGHT || wn->ndim != 2 || wn->dims[1] % 8)
                            return meta_error(s, d, "kernel %s dequantizes value %lld: not a weight of rows of a "
                                              "multiple of 8 elements", ln->name, (long long)arg->index);
                        const size_t bytes = (size_t)kir_elems(wn, 1) * 2;
                        if (bytes > s->wdeq_bytes) s->wdeq_bytes = bytes;
                        continue;
                    }
                    if (arg->kind != KRT_CUDA_ARG_XCODES && arg->kind != KRT_CUDA_ARG_XSCALES &&
                        arg->kind != KRT_CUDA_ARG_TMAP_XCODES)
                        continue;
                    /* a row a token, of whole 16-byte chunks of codes */
                    if (arg->index >= (int64_t)s->g->n_nodes || s->home[arg->index] == HOME_WEIGHT ||
                        s->home[arg->index] == HOME_TOKENS || s->home[arg->index] == HOME_POSITIONS ||
                        s->home[arg->index] == HOME_SEQ_LENGTHS || kir_row_elems(&s->g->nodes[arg->index]) % 16)
                        return meta_error(s, d, "kernel %s reads value %lld as codes: not an activation of rows of "
                                          "a multiple of 16 elements", ln->name, (long long)arg->index);
                    const int64_t cols = kir_row_elems(&s->g->nodes[arg->index]);
                    if (cols > s->xq_cols) s->xq_cols = cols;
                }
            }
        }
    }
    s->n_tmaps = maps;
    if (maps && !s->api.cuTensorMapEncodeTiled) {
        ks_error(d, "cuda", "the engine's %s kernels read tensor maps, and the driver has no cuTensorMapEncodeTiled "
                 "(CUDA 12 or later has it)", s->arch);
        return -1;
    }
    /* the driver wants each map 64-byte aligned (cuTensorMapEncodeTiled); a krt_cu_tmap is 128 */
    s->tmaps = aligned_alloc(_Alignof(krt_cu_tmap), (maps + 1) * sizeof *s->tmaps);
    if (!s->tmaps) return ks_error_oom(d, s->e->path, (maps + 1) * sizeof *s->tmaps, "the tensor maps");
    return 0;
}

static int load_kernels(cu_state *s, ks_diag *d)
{
    ks_buf section = KS_BUF_TRY;
    ks_buf_printf(&section, "%s%s", KRT_CUDA_SECTION_PREFIX, s->arch);
    if (section.failed) return ks_error_oom(d, s->e->path, section.failed, "a section's name");
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
    void *image = ks_try_malloc(size);
    if (!image) return ks_error_oom(d, s->e->path, size, "a copy of the engine's kernels");
    memcpy(image, cubin, size);
    r = s->api.cuModuleLoadData(&s->module, image);
    free(image);
    if (r != 0) return cu_error(s, d, r, "cannot load the engine's %s kernels", s->arch);
    s->fns = ks_try_calloc((size_t)s->meta.n_kernels + 1, sizeof *s->fns);
    s->fns_large = ks_try_calloc((size_t)s->meta.n_kernels + 1, sizeof *s->fns_large);
    if (!s->fns || !s->fns_large)
        return ks_error_oom(d, s->e->path, 2 * ((size_t)s->meta.n_kernels + 1) * sizeof *s->fns, "the kernel table");
    for (int i = 0; i < s->meta.n_kernels; i++) {
        const krt_cuda_kernel *k = &s->meta.kernels[i];
        r = s->api.cuModuleGetFunction(&s->fns[i], s->module, k->name);
        if (r != 0) return cu_error(s, d, r, "damaged engine: kernel %s is not in its %s cubin", k->name, s->arch);
        if (set_smem(s, s->fns[i], k->name, k->smem, d) != 0) return -1;
        if (!k->name_large) continue;
        r = s->api.cuModuleGetFunction(&s->fns_large[i], s->module, k->name_large);
        if (r != 0) return cu_error(s, d, r, "damaged engine: kernel %s is not in its %s cubin", k->name_large, s->arch);
        if (set_smem(s, s->fns_large[i], k->name_large, k->smem_large, d) != 0) return -1;
    }
    if (load_variants(s, d) != 0) return -1;
    /* optional: engines built before the draw kernel existed lack it, and draw on the host */
    if (s->api.cuModuleGetFunction(&s->draw_fn, s->module, KRT_CUDA_DRAW_KERNEL) != 0) s->draw_fn = NULL;
    if ((r = s->api.cuStreamCreate(&s->stream, KRT_CU_STREAM_NON_BLOCKING)) != 0) {
        s->stream = NULL;
        return cu_error(s, d, r, "cannot create a stream");
    }
    return 0;
}

/* ---- the value table, the weights -------------------------------------------------------------- */

static int plan_error(cu_state *s, ks_diag *d, const char *fmt, ...) KS_PRINTF(3, 4);
static int plan_error(cu_state *s, ks_diag *d, const char *fmt, ...)
{
    ks_buf msg = KS_BUF_TRY;
    va_list ap;
    va_start(ap, fmt);
    ks_buf_vprintf(&msg, fmt, ap);
    va_end(ap);
    ks_error(d, s->e->path, "damaged: the memory plan does not fit the graph: %s", ks_buf_cstr(&msg));
    ks_buf_free(&msg);
    return -1;
}

/* Every planned value starts on this many bytes (ir/plan.h's
 * KIR_MEM_ALIGN), more than the kernels' 16-byte vector loads need. */
enum { PLAN_ALIGN = 64 };

/* The memory plan, when the engine has one (desc->plan, whose values lie
 * inside its arena): each own buffer's offset, and the aliases of cuda.meta
 * checked to sit where the plan puts their roots. */
static int read_plan(cu_state *s, ks_diag *d)
{
    const kir_graph *g = s->g;
    const krt_plan *plan = &s->desc->plan;
    if (!plan->planned) return 0; /* built without a plan: see reserve_acts */
    for (size_t v = 0; v < g->n_nodes; v++) {
        if (s->home[v] != HOME_ACTS) continue;
        int64_t off = plan->mem.offset[v] == KIR_MEM_NONE ? -1 : (int64_t)plan->mem.offset[v];
        if (off < 0 || off % PLAN_ALIGN != 0)
            return plan_error(s, d, "value %%%zu (%s) is at byte %lld of the arena, not a multiple of %d", v,
                              kir_op_table[g->nodes[v].op].name, (long long)off, PLAN_ALIGN);
        s->act_off[v] = (size_t)off;
    }
    for (size_t v = 0; v < g->n_nodes; v++) {
        if (s->home[v] != HOME_ALIAS) continue;
        uint32_t r = s->root[v];
        int64_t off = plan->mem.offset[v] == KIR_MEM_NONE ? -1 : (int64_t)plan->mem.offset[v];
        if (s->home[r] == HOME_ACTS && off != (int64_t)s->act_off[r])
            return plan_error(s, d, "cuda.meta has value %%%zu share the bytes of %%%u, which the plan puts at byte %zu, "
                              "but the plan puts %%%zu at byte %lld",
                              v, r, s->act_off[r], v, (long long)off);
    }
    return 0;
}

/* Where every value lives, from the graph, the aliases and the memory plan;
 * checks the aliases and the plan. */
static int place_values(cu_state *s, ks_diag *d)
{
    const kir_graph *g = s->g;
    size_t n = g->n_nodes;
    s->root = ks_try_calloc(n ? n : 1, sizeof *s->root);
    s->home = ks_try_calloc(n ? n : 1, sizeof *s->home);
    s->act_off = ks_try_calloc(n ? n : 1, sizeof *s->act_off);
    if (!s->root || !s->home || !s->act_off)
        return ks_error_oom(d, s->e->path, (n ? n : 1) * (sizeof *s->root + sizeof *s->home + sizeof *s->act_off),
                            "the value table");
    for (size_t v = 0; v < n; v++) {
        const kir_node *nd = &g->nodes[v];
        s->root[v] = (uint32_t)v;
        s->act_off[v] = NO_BUFFER;
        if (nd->op == KIR_OP_WEIGHT)
            s->home[v] = HOME_WEIGHT;
        else if (nd->op == KIR_OP_INPUT)
            s->home[v] = (kir_val)v == s->desc->tokens      ? HOME_TOKENS
                         : (kir_val)v == s->desc->positions ? HOME_POSITIONS
                                                            : HOME_SEQ_LENGTHS;
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
        kir_row_elems(&g->nodes[s->meta.output]) != s->desc->vocab)
        return meta_error(s, d, "output %u is not the graph's output", s->meta.output);
    return read_plan(s, d);
}

/* The kernels keep K/V rows in the engine's kv_dtype: 4 bytes (f32), 2 (bf16, f16) or 1 (int8 and fp8
 * codes, each (position, KV head) row with an f32 scale: ir/quant.h's kir_kv_round). */
static size_t cuda_kv_elem_size(const krt_desc *desc) { return kir_dtype_size(desc->kv_dtype); }
static size_t cuda_kv_scale_size(const krt_desc *desc)
{
    return desc->kv_dtype == KIR_I8 || desc->kv_dtype == KIR_F8E4M3 ? sizeof(float) : 0;
}

/* A launch's values and layers exist. */
static int check_args(cu_state *s, const char *name, const krt_cuda_arg *args, int n_args, ks_diag *d)
{
    const krt_kv_config *cfg = krt_kv_config_of(s->kv);
    for (int a = 0; a < n_args; a++) {
        const krt_cuda_arg *arg = &args[a];
        if ((arg->kind == KRT_CUDA_ARG_VALUE || arg->kind == KRT_CUDA_ARG_TMAP || arg->kind == KRT_CUDA_ARG_XCODES ||
             arg->kind == KRT_CUDA_ARG_XSCALES || arg->kind == KRT_CUDA_ARG_TMAP_XCODES ||
             arg->kind == KRT_CUDA_ARG_WDEQ || arg->kind == KRT_CUDA_ARG_TMAP_WDEQ) &&
            arg->index >= (int64_t)s->g->n_nodes)
            return meta_error(s, d, "kernel %s reads value %lld, past the graph", name, (long long)arg->index);
        if (arg->kind == KRT_CUDA_ARG_KV_K || arg->kind == KRT_CUDA_ARG_KV_V || arg->kind == KRT_CUDA_ARG_KV_KS ||
            arg->kind == KRT_CUDA_ARG_KV_VS) {
            if (arg->index >= cfg->n_layers || cfg->layers[arg->index].kv_heads == 0)
                return meta_error(s, d, "kernel %s uses KV layer %lld, which the cache does not have", name,
                                  (long long)arg->index);
            s->has_kv = 1;
        }
    }
    return 0;
}

/* Every kernel's node, values and layers exist (its variants' too). */
static int check_kernels(cu_state *s, ks_diag *d)
{
    const krt_kv_config *cfg = krt_kv_config_of(s->kv);
    for (int i = 0; i < s->meta.n_kernels; i++) {
        const krt_cuda_kernel *k = &s->meta.kernels[i];
        if (k->node >= s->g->n_nodes) return meta_error(s, d, "kernel %s computes node %u, past the graph", k->name, k->node);
        if (check_args(s, k->name, k->args, k->n_args, d) != 0) return -1;
        for (int j = 0; j < k->n_variants; j++)
            for (int l = 0; l < k->variants[j].n_launches; l++) {
                const krt_cuda_launch *ln = &k->variants[j].launches[l];
                if (check_args(s, ln->name, ln->args, ln->n_args, d) != 0) return -1;
            }
    }
    if (cfg->elem_size != cuda_kv_elem_size(s->desc) || cfg->scale_size != cuda_kv_scale_size(s->desc))
        return meta_error(s, d, "the KV cache holds %zu-byte elements; these kernels need %s", cfg->elem_size,
                          kir_dtype_name(s->desc->kv_dtype));
    return 0;
}

/* The head: the last kernel, when it writes the logits (the graph's output) and reads one
 * activation besides its weights (Llama's final norm and lm_head, fused). A step that wants
 * no logits back, only draws from a few rows, runs it on those rows alone (run_step): a
 * prompt of 2048 tokens needs the logits of its last, not 2048 x vocab of them. -1 when the
 * engine has no such kernel (then every row's logits are computed, as before). */
static void find_head(cu_state *s)
{
    s->head = -1;
    if (s->meta.n_kernels == 0) return;
    const int i = s->meta.n_kernels - 1;
    const krt_cuda_kernel *k = &s->meta.kernels[i];
    int writes = 0, reads = 0;
    uint32_t x = 0;
    for (int a = 0; a < k->n_args; a++) {
        const krt_cuda_arg *arg = &k->args[a];
        if (arg->kind != KRT_CUDA_ARG_VALUE) {
            if (arg->kind != KRT_CUDA_ARG_T) return; /* positions, the KV cache, ...: not a head */
            continue;
        }
        uint32_t r = s->root[arg->index];
        if (s->home[r] == HOME_WEIGHT) continue;
        if (r == s->root[s->meta.output]) writes++;
        else if (s->home[r] == HOME_ACTS) x = r, reads++;
        else return;
    }
    if (writes != 1 || reads != 1 || s->root[k->node] != s->root[s->meta.output]) return;
    const kir_node *xn = &s->g->nodes[x];
    if (xn->ndim < 1 || xn->dims[0] != KIR_DIM_T) return;
    s->head = i;
    s->head_x = x;
    s->head_row_bytes = (size_t)kir_row_elems(xn) * kir_dtype_size(xn->dtype);
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
    r = s->api.cuMemcpyHtoDAsync(s->weights, s->wsection, size, s->stream);
    if (r == 0) r = s->api.cuStreamSynchronize(s->stream);
    if (r != 0) return cu_error(s, d, r, "cannot upload the weights");
    return 0;
}

/* The scratch of codes (xq_cols) for activations of cap rows: the codes, then the scales. */
static size_t scratch_codes_bytes(const cu_state *s, int64_t cap)
{
    return ((size_t)cap * (size_t)s->xq_cols + ACT_ALIGN - 1) / ACT_ALIGN * ACT_ALIGN;
}
static size_t scratch_xq_bytes(const cu_state *s, int64_t cap)
{
    const size_t b = s->xq_cols ? scratch_codes_bytes(s, cap) + (size_t)cap * sizeof(float) : 0;
    return (b + ACT_ALIGN - 1) / ACT_ALIGN * ACT_ALIGN;
}
static size_t scratch_bytes(const cu_state *s, int64_t cap) { return scratch_xq_bytes(s, cap) + s->wdeq_bytes; }
/* "wdeq:N": the dequantized weight, after the codes */
static krt_cu_ptr wdeq_ptr(const cu_state *s) { return s->acts + s->scratch_off + scratch_xq_bytes(s, s->t_cap); }
/* "xcodes:N" (scales 0) and "xscales:N" (1): every value's codes start the scratch (one launch at a
 * time uses them) */
static krt_cu_ptr xq_ptr(const cu_state *s, int scales)
{
    return s->acts + s->scratch_off + (scales ? scratch_codes_bytes(s, s->t_cap) : 0);
}

/* The planned arena, once: every step of up to plan.max_tokens tokens runs in it; the scratch
 * after it. */
static int alloc_arena(cu_state *s, ks_diag *d)
{
    const krt_plan *plan = &s->desc->plan;
    s->scratch_off = ((size_t)plan->mem.arena_bytes + ACT_ALIGN - 1) / ACT_ALIGN * ACT_ALIGN;
    size_t bytes = scratch_bytes(s, plan->max_tokens) ? s->scratch_off + scratch_bytes(s, plan->max_tokens)
                                                      : (size_t)plan->mem.arena_bytes;
    krt_cu_result r = s->api.cuMemAlloc(&s->acts, bytes ? bytes : PLAN_ALIGN);
    if (r != 0) {
        s->acts = 0;
        return cu_error(s, d, r,
                        "cannot allocate %zu bytes of activations for steps of up to %lld tokens (the engine's "
                        "memory plan; kiln build --max-tokens N plans for fewer)",
                        bytes, (long long)plan->max_tokens);
    }
    s->acts_bytes = bytes;
    s->t_cap = plan->max_tokens;
    return 0;
}

/* ---- the profile (runtime/cuda/cuda_profile.c) ----------------------------------------------------- */
static int start_profile(cu_state *s, ks_diag *d)
{
    s->events = krt_cu_profile_new(&s->api, s->stream, &s->meta, s->g, d);
    return s->events ? 0 : -1;
}

static int record(cu_state *s, int i, ks_diag *d) { return krt_cu_profile_record(s->events, i, d); }

static int collect_profile(cu_state *s, const krt_step *st, int64_t run, int n_draw, int head, ks_diag *d)
{
    return krt_cu_profile_collect(s->events, st, run, n_draw, head, d);
}

static void cuda_profile_report(void *state, double ceiling_tflops, ks_buf *out)
{
    cu_state *s = state;
    if (!s->events) return;
    if (s->desc->plan.planned)
        ks_buf_printf(out, "kiln: profile: activations: one arena of %zu bytes (the memory plan, for steps of up to %lld "
                           "tokens)\n", s->acts_bytes, (long long)s->desc->plan.max_tokens);
    else
        ks_buf_printf(out, "kiln: profile: activations: %zu bytes, a buffer per value for steps of up to %lld tokens (the "
                           "engine has no memory plan)\n", s->acts_bytes, (long long)s->t_cap);
    krt_cu_profile_report(s->events, ceiling_tflops, out);
}

/* ---- open and attach ---------------------------------------------------------------------------- */
/* The thresholds of the large_per_seq kernels, distinct and ascending, into seq_thr; more than
 * KRT_CUDA_MAX_SEQ_THR of them is a damaged engine. */
static int seq_thresholds(cu_state *s, ks_diag *d)
{
    s->n_seq_thr = 0;
    for (int i = 0; i < s->meta.n_kernels; i++) {
        const krt_cuda_kernel *k = &s->meta.kernels[i];
        if (!k->name_large || !k->large_per_seq) continue;
        int at = 0;
        while (at < s->n_seq_thr && s->seq_thr[at] < k->large_above) at++;
        if (at < s->n_seq_thr && s->seq_thr[at] == k->large_above) continue;
        if (s->n_seq_thr == KRT_CUDA_MAX_SEQ_THR) {
            ks_error(d, s->e->path, "damaged: more than %d thresholds of kernels chosen by sequence",
                     KRT_CUDA_MAX_SEQ_THR);
            return -1;
        }
        memmove(s->seq_thr + at + 1, s->seq_thr + at, sizeof *s->seq_thr * (size_t)(s->n_seq_thr - at));
        s->seq_thr[at] = k->large_above;
        s->n_seq_thr++;
    }
    return 0;
}

/* Entries of the graphs' table: a step size and a class of its longest sequence each. */
static size_t n_graph_keys(const cu_state *s)
{
    return ((size_t)s->opts.graph_max_tokens + 1) * (size_t)(s->n_seq_thr + 1);
}

/* The graph of a step of T tokens whose longest sequence has run of them. */
static size_t graph_key(const cu_state *s, int64_t T, int64_t run)
{
    int c = 0;
    while (c < s->n_seq_thr && run > s->seq_thr[c]) c++;
    return (size_t)T * (size_t)(s->n_seq_thr + 1) + (size_t)c;
}

/* The most tokens one sequence has in step st (the large_per_seq kernels' choice); T when no
 * kernel asks. */
static int64_t longest_run(cu_state *s, const krt_step *st)
{
    int64_t T = st->n_tokens, run = 0;
    if (!s->n_seq_thr || !s->seq_count) return T;
    for (int64_t i = 0; i < T; i++) s->seq_count[st->seq_ids[i]] = 0;
    for (int64_t i = 0; i < T; i++) {
        int32_t c = ++s->seq_count[st->seq_ids[i]];
        if (c > run) run = c;
    }
    return run;
}

static void *cuda_open(const krt_engine *e, const krt_backend_opts *o, ks_diag *d)
{
    size_t size = 0;
    const char *text = krt_engine_section_data(e, KRT_CUDA_META_SECTION, &size);
    if (!text) {
        ks_error(d, e->path, "damaged: the engine's target is cuda but it has no %s section", KRT_CUDA_META_SECTION);
        return NULL;
    }
    cu_state *s = ks_try_calloc(1, sizeof *s);
    if (!s) return ks_error_oom(d, e->path, sizeof *s, "the CUDA backend"), NULL;
    s->e = e;
    s->desc = &e->desc;
    s->g = e->graph;
    if (o) s->opts = *o;
    if (s->opts.graph_max_tokens <= 0) s->opts.graphs = 0;
    if (s->opts.profile) s->opts.graphs = 0; /* every launch is timed on its own */
    /* the engine's own consistency first: a damaged one is reported before the driver is touched */
    if (krt_cuda_meta_parse(text, size, e->path, &s->meta, d) != 0 || seq_thresholds(s, d) != 0 ||
        place_values(s, d) != 0 ||
        krt_cuda_api_load(&s->api, d) != 0 || open_device(s, d) != 0 || load_kernels(s, d) != 0 ||
        upload_weights(s, d) != 0 ||
        (s->desc->plan.planned && alloc_arena(s, d) != 0) || (s->opts.profile && start_profile(s, d) != 0)) {
        cuda_destroy(s);
        return NULL;
    }
    /* no step is larger than the plan holds */
    const krt_plan *plan = &s->desc->plan;
    if (plan->planned && s->opts.graph_max_tokens > plan->max_tokens) s->opts.graph_max_tokens = (int)plan->max_tokens;
    if (s->opts.graphs) {
        size_t n = n_graph_keys(s);
        s->graphs = ks_try_calloc(n, sizeof *s->graphs);
        if (!s->graphs) {
            ks_error_oom(d, e->path, n * sizeof *s->graphs, "the CUDA graphs' table");
            cuda_destroy(s);
            return NULL;
        }
    }
    return s;
}

static int cuda_attach(void *state, krt_kv *kv, ks_diag *d)
{
    cu_state *s = state;
    s->kv = kv;
    krt_cu_result r = s->api.cuCtxSetCurrent(s->ctx);
    if (r != 0) return cu_error(s, d, r, "cannot use the device's context");
    const krt_kv_config *cfg = krt_kv_config_of(kv);
    s->seq_off = ks_try_calloc((size_t)cfg->max_seqs, sizeof *s->seq_off);
    if (!s->seq_off) return ks_error_oom(d, s->e->path, (size_t)cfg->max_seqs * sizeof *s->seq_off, "the sequences");
    s->seq_count = ks_try_calloc((size_t)cfg->max_seqs, sizeof *s->seq_count);
    if (!s->seq_count) return ks_error_oom(d, s->e->path, (size_t)cfg->max_seqs * sizeof *s->seq_count, "the sequences");
    if ((int64_t)cfg->n_blocks * cfg->block_size > INT32_MAX) {
        ks_error(d, "cuda", "a KV cache of %d blocks of %d positions has more rows than the kernels index (2^31)",
                 cfg->n_blocks, cfg->block_size);
        return -1;
    }
    if (check_kernels(s, d) != 0) return -1;
    find_head(s);
    /* the KV blocks' zeroing went on the stream */
    if ((r = s->api.cuStreamSynchronize(s->stream)) != 0) return cu_error(s, d, r, "cannot clear the KV cache");
    return 0;
}

static int cuda_mem_info(void *state, krt_device_mem *m, ks_diag *d)
{
    cu_state *s = state;
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", s->device_name);
    krt_cu_result r = s->api.cuCtxSetCurrent(s->ctx);
    if (r == 0) r = s->api.cuMemGetInfo(&m->free_bytes, &m->total_bytes);
    if (r != 0) return cu_error(s, d, r, "cannot ask the device how much memory is free");
    return 0;
}

static void drop_graphs(cu_state *s)
{
    for (size_t t = 0; s->graphs && t < n_graph_keys(s); t++)
        if (s->graphs[t]) {
            s->api.cuGraphExecDestroy(s->graphs[t]);
            s->graphs[t] = NULL;
        }
    s->n_graphs = 0;
}

static void cuda_destroy(void *state)
{
    cu_state *s = state;
    if (!s) return;
    if (s->ctx_held) {
        s->api.cuCtxSetCurrent(s->ctx);
        if (s->stream) s->api.cuStreamSynchronize(s->stream);
        drop_graphs(s);
        krt_cu_ptr bufs[] = {s->acts, s->step_dev, s->g_step, s->draw_dev, s->weights, s->head_rows};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i]) s->api.cuMemFree(bufs[i]);
        krt_cu_profile_free(s->events);
        if (s->stream) s->api.cuStreamDestroy(s->stream);
        if (s->module) s->api.cuModuleUnload(s->module);
        s->api.cuDevicePrimaryCtxRelease(s->dev);
    }
    krt_cuda_api_unload(&s->api);
    krt_cuda_meta_free(&s->meta);
    free(s->graphs);
    free(s->fns);
    free(s->fns_large);
    free(s->vbase);
    free(s->vfns);
    free(s->tm_base);
    free(s->tmaps);
    free(s->root);
    free(s->home);
    free(s->act_off);
    free(s->stage);
    free(s->slots);
    free(s->seq_off);
    free(s->seq_count);
    free(s->order);
    free(s->draw_rows);
    free(s->draw_iota);
    free(s->tap_after);
    free(s->tap_off);
    free(s->tap_buf);
    free(s);
}

/* ---- a step ----------------------------------------------------------------------------------- */
/* An engine without a memory plan: a buffer per computed value, for steps
 * of up to T tokens (at least the largest graph step). A planned engine's
 * arena holds every step it takes. */
static int reserve_acts(cu_state *s, int64_t T, ks_diag *d)
{
    if (s->desc->plan.planned || T <= s->t_cap) return 0;
    int64_t cap = s->t_cap * 2 > T ? s->t_cap * 2 : T;
    if (s->opts.graphs && cap < s->opts.graph_max_tokens) cap = s->opts.graph_max_tokens;
    size_t at = 0;
    for (size_t v = 0; v < s->g->n_nodes; v++) {
        if (s->home[v] != HOME_ACTS) continue;
        s->act_off[v] = at;
        size_t bytes = (size_t)kir_elems(&s->g->nodes[v], cap) * sizeof(float);
        at += (bytes + ACT_ALIGN - 1) / ACT_ALIGN * ACT_ALIGN;
    }
    s->scratch_off = at;
    at += scratch_bytes(s, cap);
    /* the graphs write the old buffer: capture them again when they are next used */
    drop_graphs(s);
    if (s->acts) s->api.cuMemFree(s->acts);
    s->acts = 0;
    s->t_cap = 0;
    krt_cu_result r = s->api.cuMemAlloc(&s->acts, at ? at : ACT_ALIGN);
    if (r != 0) {
        s->acts = 0;
        return cu_error(s, d, r, "cannot allocate %zu bytes of activations for %lld tokens", at, (long long)cap);
    }
    s->acts_bytes = at;
    s->t_cap = cap;
    return 0;
}

/* The KV row each token writes (the session reserved them). */
static void fill_slots(cu_state *s, const krt_step *st, int32_t *slots)
{
    for (int i = 0; i < st->n_tokens; i++)
        slots[i] = s->has_kv ? (int32_t)krt_kv_slot(s->kv, st->seq_ids[i], st->positions[i]) : 0;
}

/* Device addresses of the step's arrays. */
typedef struct step_ptrs {
    krt_cu_ptr tokens, positions, slots, table_off, seq_lengths, tables; /* int32 arrays */
} step_ptrs;

/* The arrays' places in a buffer at base laid out for `stride` tokens:
 * tokens | positions | slots | table_off | seq_lengths, stride entries each, then the tables. */
static step_ptrs layout(krt_cu_ptr base, size_t stride)
{
    size_t w = sizeof(int32_t) * stride;
    return (step_ptrs){base, base + w, base + 2 * w, base + 3 * w, base + 4 * w, base + 5 * w};
}

/* Block-table entries a graph step may need: graph_max_tokens sequences of
 * the longest table. */
static size_t graph_tables(const cu_state *s)
{
    if (!s->has_kv) return 0;
    const krt_kv_config *cfg = krt_kv_config_of(s->kv);
    size_t per_seq = (size_t)((cfg->max_context + cfg->block_size - 1) / cfg->block_size);
    return (size_t)s->opts.graph_max_tokens * per_seq;
}

/* Stage and upload tokens | positions | slots | table_off | tables: into
 * g_step, laid out for graph_max_tokens, for a graph step; else into
 * step_dev, laid out for T. */
static int upload_step(cu_state *s, const krt_step *st, int graph, step_ptrs *p, ks_diag *d)
{
    size_t T = (size_t)st->n_tokens, stride = graph ? (size_t)s->opts.graph_max_tokens : T;
    /* the block tables of the step's sequences, each once, in order of first appearance;
     * their ids go to order */
    size_t n_tables = 0, n_seqs = 0;
    if (s->has_kv) {
        if (KS_TRY_GROW(s->order, T, s->order_cap, (size_t)1 << 32) != 0)
            return ks_error_oom(d, s->e->path, T * sizeof *s->order, "a step's sequences");
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
    size_t total = 5 * stride + n_tables;
    if (KS_TRY_GROW(s->stage, total, s->stage_cap, (size_t)1 << 31) != 0)
        return ks_error_oom(d, s->e->path, total * sizeof *s->stage, "a step's arrays");
    int32_t *h = s->stage;
    memcpy(h, st->tokens, sizeof *h * T);
    memcpy(h + stride, st->positions, sizeof *h * T);
    memcpy(h + 2 * stride, s->slots, sizeof *h * T);
    for (size_t i = 0; i < T; i++) h[3 * stride + i] = s->has_kv ? s->seq_off[st->seq_ids[i]] : 0;
    if (s->desc->seq_lengths != KIR_NONE) krt_step_seq_lengths(st, s->has_kv ? s->kv : NULL, h + 4 * stride);
    for (size_t i = 0; i < n_seqs; i++) {
        int seq = (int)s->order[i], nb = 0;
        const int32_t *table = krt_kv_block_table(s->kv, seq, &nb);
        memcpy(h + 5 * stride + s->seq_off[seq], table, sizeof *h * (size_t)nb);
    }
    size_t bytes = sizeof *h * total;
    krt_cu_result r;
    krt_cu_ptr base;
    if (graph) {
        if (!s->g_step) {
            s->g_tables = graph_tables(s);
            size_t cap = sizeof *h * (5 * stride + s->g_tables);
            if ((r = s->api.cuMemAlloc(&s->g_step, cap)) != 0) {
                s->g_step = 0;
                return cu_error(s, d, r, "cannot allocate %zu bytes for graph steps' arrays", cap);
            }
        }
        KS_ASSERT(n_tables <= s->g_tables);
        base = s->g_step;
    } else {
        if (bytes > s->step_dev_cap) {
            if (s->step_dev) s->api.cuMemFree(s->step_dev);
            s->step_dev = 0;
            s->step_dev_cap = 0;
            size_t cap = bytes * 2;
            if ((r = s->api.cuMemAlloc(&s->step_dev, cap)) != 0) {
                s->step_dev = 0;
                return cu_error(s, d, r, "cannot allocate %zu bytes for a step's arrays", cap);
            }
            s->step_dev_cap = cap;
        }
        base = s->step_dev;
    }
    if ((r = s->api.cuMemcpyHtoDAsync(base, h, bytes, s->stream)) != 0)
        return cu_error(s, d, r, "cannot upload a step's arrays");
    *p = layout(base, stride);
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
    case HOME_SEQ_LENGTHS:
        return p->seq_lengths;
    case HOME_ACTS:
        KS_ASSERT(s->act_off[r] != NO_BUFFER);
        return s->acts + s->act_off[r];
    case HOME_ALIAS:
        break;
    }
    KS_UNREACHABLE();
}

/* Every tensor map of the loaded arch's variants, for activations of t_cap rows (their buffers do
 * not move until reserve_acts regrows them: a planned engine's never). A map is value v as rows (a
 * weight's of its last dim, an activation's a token each), boxes of 64 x box rows, 128-byte swizzle, zeros past the edges (kcu_prelude.cuh's
 * kcu_gemm90). */
static int make_tmaps(cu_state *s, ks_diag *d)
{
    if (s->n_tmaps == 0 || s->tmaps_rows == s->t_cap) return 0;
    const step_ptrs none = {0};
    size_t at = 0;
    for (int i = 0; i < s->meta.n_kernels; i++) {
        const krt_cuda_kernel *k = &s->meta.kernels[i];
        for (int j = 0; j < k->n_variants; j++) {
            const krt_cuda_variant *v = &k->variants[j];
            if (strcmp(v->arch, s->arch) != 0) continue;
            for (int l = 0; l < v->n_launches; l++)
                for (int a = 0; a < v->launches[l].n_args; a++) {
                    const krt_cuda_arg *arg = &v->launches[l].args[a];
                    if (arg->kind != KRT_CUDA_ARG_TMAP && arg->kind != KRT_CUDA_ARG_TMAP_XCODES &&
                        arg->kind != KRT_CUDA_ARG_TMAP_WDEQ)
                        continue;
                    const kir_node *n = &s->g->nodes[arg->index];
                    uint32_t r = s->root[arg->index];
                    const int codes = arg->kind == KRT_CUDA_ARG_TMAP_XCODES; /* the value's codes in the scratch */
                    const int deq = arg->kind == KRT_CUDA_ARG_TMAP_WDEQ;     /* the weight dequantized there */
                    /* a weight [N, K]: N rows; an activation: a row a token ([T, heads, dim] too) */
                    int weight = !codes && s->home[r] == HOME_WEIGHT;
                    int64_t K = !n->ndim ? 0 : weight ? n->dims[n->ndim - 1] : kir_row_elems(n);
                    const int one = codes || (!deq && (n->dtype == KIR_F8E4M3 || n->dtype == KIR_I8)); /* one-byte codes */
                    /* (a dequantized weight: 16-bit elements, of whichever half type; TMA copies bytes) */
                    int dt = one                       ? KRT_CU_TMAP_UINT8
                             : deq || n->dtype == KIR_BF16 ? KRT_CU_TMAP_BFLOAT16
                             : n->dtype == KIR_F16     ? KRT_CU_TMAP_FLOAT16
                                                       : -1;
                    const int64_t esize = one ? 1 : 2;
                    if (dt < 0 || K <= 0 || (K * esize) % 16 || s->home[r] == HOME_TOKENS ||
                        s->home[r] == HOME_POSITIONS || s->home[r] == HOME_SEQ_LENGTHS)
                        return meta_error(s, d, "kernel %s reads value %%%lld through a tensor map, which needs "
                                          "bf16, f16 or one-byte rows of 16-byte chunks", v->launches[l].name,
                                          (long long)arg->index);
                    krt_cu_ptr base = codes ? xq_ptr(s, 0) : deq ? wdeq_ptr(s) : value_ptr(s, (uint32_t)arg->index, &none);
                    const uint64_t dims[2] = {(uint64_t)K, (uint64_t)(weight ? kir_elems(n, 1) / K : s->t_cap)},
                                   strides[1] = {(uint64_t)(K * esize)};
                    /* a box row: 128 bytes (one row of the 128-byte swizzle) */
                    const unsigned box[2] = {(unsigned)(128 / esize), (unsigned)arg->box}, es[2] = {1, 1};
                    KS_ASSERT(at < s->n_tmaps);
                    krt_cu_result res = s->api.cuTensorMapEncodeTiled(
                        &s->tmaps[at++], dt, 2, (void *)(uintptr_t)base, dims, strides, box, es,
                        KRT_CU_TMAP_INTERLEAVE_NONE, KRT_CU_TMAP_SWIZZLE_128B, KRT_CU_TMAP_L2_256B, KRT_CU_TMAP_OOB_ZERO);
                    if (res != 0)
                        return cu_error(s, d, res, "cannot make the tensor map of value %%%lld for kernel %s",
                                        (long long)arg->index, v->launches[l].name);
                }
        }
    }
    s->tmaps_rows = s->t_cap;
    return 0;
}

/* Each parameter's value in an 8-byte slot (a tensor map: params points at it in tmaps, from
 * tmaps[tm] on); the entries past the last parameter stay NULL (the driver ignores them; a CPU
 * stand-in for libcuda in the tests stops at the first NULL). */
typedef union arg_slot {
    krt_cu_ptr ptr; /* a pointer parameter */
    int i;          /* an int parameter */
} arg_slot;

static void fill_params(cu_state *s, const krt_cuda_arg *args, int n_args, int64_t T, const step_ptrs *p, size_t tm,
                        arg_slot *slot, void **params)
{
    const krt_kv_config *cfg = krt_kv_config_of(s->kv);
    for (int a = 0; a < n_args; a++) {
        const krt_cuda_arg *arg = &args[a];
        params[a] = &slot[a];
        switch (arg->kind) {
        case KRT_CUDA_ARG_T:
            slot[a].i = (int)T;
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
        case KRT_CUDA_ARG_KV_KS:
            slot[a].ptr = (krt_cu_ptr)(uintptr_t)krt_kv_k_scales(s->kv, (int)arg->index);
            break;
        case KRT_CUDA_ARG_KV_VS:
            slot[a].ptr = (krt_cu_ptr)(uintptr_t)krt_kv_v_scales(s->kv, (int)arg->index);
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
        case KRT_CUDA_ARG_TMAP:
        case KRT_CUDA_ARG_TMAP_XCODES:
        case KRT_CUDA_ARG_TMAP_WDEQ:
            KS_ASSERT(tm < s->n_tmaps);
            params[a] = &s->tmaps[tm++];
            break;
        case KRT_CUDA_ARG_XCODES:
        case KRT_CUDA_ARG_XSCALES:
            slot[a].ptr = xq_ptr(s, arg->kind == KRT_CUDA_ARG_XSCALES);
            break;
        case KRT_CUDA_ARG_WDEQ:
            slot[a].ptr = wdeq_ptr(s);
            break;
        case KRT_CUDA_ARG_COUNT:
            KS_UNREACHABLE();
        }
    }
}

/* A launch's grid for T tokens (krt_cuda_grid_dim), checked against the device's limits; 0 when
 * a dim is empty (nothing to launch), 1 to launch, -1 after reporting. */
static int check_grid(const char *name, const int64_t grid[3], int64_t T, ks_diag *d)
{
    static const int64_t limit[3] = {INT32_MAX, 65535, 65535};
    int run = 1;
    for (int g = 0; g < 3; g++) {
        if (grid[g] > limit[g]) {
            ks_error(d, "cuda", "kernel %s: a step of %lld tokens needs %lld blocks in grid dimension %d (at most %lld)",
                     name, (long long)T, (long long)grid[g], g, (long long)limit[g]);
            return -1;
        }
        if (grid[g] <= 0) run = 0;
    }
    return run;
}

/* Launch one of the engine's kernels on the stream: with programmatic stream serialization where
 * s->pdl (its blocks may start while the kernel before it ends: every engine kernel first waits for
 * that one, KCU_PDL_ENTER), else plainly. */
static krt_cu_result launch_fn(cu_state *s, krt_cu_fn fn, const int64_t grid[3], int block, int smem, void **params)
{
    if (!s->pdl)
        return s->api.cuLaunchKernel(fn, (unsigned)grid[0], (unsigned)grid[1], (unsigned)grid[2], (unsigned)block, 1,
                                     1, (unsigned)smem, s->stream, params, NULL);
    krt_cu_launch_attr attr = {.id = KRT_CU_LAUNCH_ATTR_PROGRAMMATIC_SERIALIZATION, .u.value = 1};
    krt_cu_launch_config c = {.grid = {(unsigned)grid[0], (unsigned)grid[1], (unsigned)grid[2]},
                              .block = {(unsigned)block, 1, 1},
                              .shared_bytes = (unsigned)smem,
                              .stream = s->stream,
                              .attrs = &attr,
                              .n_attrs = 1};
    return s->api.cuLaunchKernelEx(&c, fn, params, NULL);
}

/* Variant j of kernel i (the loaded arch's) for a step of T tokens: its launches in order. */
static int launch_variant(cu_state *s, int i, int j, int64_t T, const step_ptrs *p, ks_diag *d)
{
    const krt_cuda_variant *v = &s->meta.kernels[i].variants[j];
    for (int l = 0; l < v->n_launches; l++) {
        const krt_cuda_launch *ln = &v->launches[l];
        size_t slot_at = s->vbase[i] + (size_t)j * KRT_CUDA_MAX_LAUNCHES + (size_t)l;
        const int64_t grid[3] = {krt_cuda_launch_grid_dim(ln, 0, T), krt_cuda_launch_grid_dim(ln, 1, T),
                                 krt_cuda_launch_grid_dim(ln, 2, T)};
        int run = check_grid(ln->name, grid, T, d);
        if (run < 0) return -1;
        if (run == 0) continue;
        arg_slot slot[KRT_CUDA_MAX_ARGS] = {{0}};
        void *params[KRT_CUDA_MAX_ARGS + 1] = {0};
        fill_params(s, ln->args, ln->n_args, T, p, s->tm_base[slot_at], slot, params);
        krt_cu_result r = launch_fn(s, s->vfns[slot_at], grid, ln->block, ln->smem, params);
        if (r != 0) return cu_error(s, d, r, "cannot launch %s", ln->name);
    }
    return 0;
}

/* Kernel i's own launch (not a variant) for T tokens whose longest sequence has run of them, with
 * value `swap`'s pointer replaced by swap_ptr (swap UINT32_MAX: none). */
static int launch_kernel(cu_state *s, int i, int64_t T, int64_t run, const step_ptrs *p, uint32_t swap,
                         krt_cu_ptr swap_ptr, ks_diag *d)
{
    const krt_cuda_kernel *k = &s->meta.kernels[i];
    const int large = krt_cuda_large(k, T, run);
    const int64_t grid[3] = {krt_cuda_grid_dim(k, 0, T, large), krt_cuda_grid_dim(k, 1, T, large),
                             krt_cuda_grid_dim(k, 2, T, large)};
    int go = check_grid(k->name, grid, T, d);
    if (go <= 0) return go;
    arg_slot slot[KRT_CUDA_MAX_ARGS] = {{0}};
    void *params[KRT_CUDA_MAX_ARGS + 1] = {0};
    fill_params(s, k->args, k->n_args, T, p, 0, slot, params);
    for (int a = 0; a < k->n_args && swap != UINT32_MAX; a++)
        if (k->args[a].kind == KRT_CUDA_ARG_VALUE && s->root[k->args[a].index] == swap) slot[a].ptr = swap_ptr;
    krt_cu_fn fn = large ? s->fns_large[i] : s->fns[i];
    int smem = large ? k->smem_large : k->smem;
    krt_cu_result r = launch_fn(s, fn, grid, k->block, smem, params);
    if (r != 0) return cu_error(s, d, r, "cannot launch %s", k->name);
    return 0;
}

/* The head (find_head) on the n rows rows[] of its activation only: gathered into head_rows,
 * its logits into the output's first n rows. The kernel's plain launch (no variant: n is at
 * most the variants' threshold), with the activation's pointer replaced. */
static int launch_head(cu_state *s, int64_t n, const int32_t *rows, const step_ptrs *p, ks_diag *d)
{
    krt_cu_result r;
    if (n > s->head_rows_cap) {
        if (s->head_rows) s->api.cuMemFree(s->head_rows);
        s->head_rows = 0;
        s->head_rows_cap = 0;
        if ((r = s->api.cuMemAlloc(&s->head_rows, s->head_row_bytes * (size_t)n)) != 0) {
            s->head_rows = 0;
            return cu_error(s, d, r, "cannot allocate %zu bytes for the drawn rows", s->head_row_bytes * (size_t)n);
        }
        s->head_rows_cap = (int)n;
    }
    krt_cu_ptr x = value_ptr(s, s->head_x, p);
    for (int64_t j = 0; j < n; j++)
        if ((r = s->api.cuMemcpyDtoDAsync(s->head_rows + s->head_row_bytes * (size_t)j,
                                          x + s->head_row_bytes * (size_t)rows[j], s->head_row_bytes, s->stream)) != 0)
            return cu_error(s, d, r, "cannot gather the drawn rows");
    return launch_kernel(s, s->head, n, n, p, s->head_x, s->head_rows, d);
}

/* Launch kernel i for a step of T tokens whose longest sequence has run of them on the stream (or
 * into the graph being captured). */
static int launch(cu_state *s, int i, int64_t T, int64_t run, const step_ptrs *p, ks_diag *d)
{
    const krt_cuda_kernel *k = &s->meta.kernels[i];
    const krt_cuda_variant *v = krt_cuda_pick_variant(k, s->arch, T);
    if (v) return launch_variant(s, i, (int)(v - k->variants), T, p, d);
    return launch_kernel(s, i, T, run, p, UINT32_MAX, 0, d);
}

/* Capture the kernels of a step of T tokens whose longest sequence has run of them, reading the
 * arrays at p, into its graph (graph_key). On failure the stream is left out of capture mode. */
static int capture(cu_state *s, int64_t T, int64_t run, const step_ptrs *p, ks_diag *d)
{
    krt_cu_result r = s->api.cuStreamBeginCapture(s->stream, KRT_CU_CAPTURE_MODE_THREAD_LOCAL);
    if (r != 0) return cu_error(s, d, r, "cannot capture a CUDA graph of a %lld-token step", (long long)T);
    int rc = 0;
    for (int i = 0; i < s->meta.n_kernels && rc == 0; i++) rc = launch(s, i, T, run, p, d);
    krt_cu_graph graph = NULL;
    r = s->api.cuStreamEndCapture(s->stream, &graph);
    if (rc == 0 && r != 0) rc = cu_error(s, d, r, "cannot capture a CUDA graph of a %lld-token step", (long long)T);
    krt_cu_graph_exec exec = NULL;
    if (rc == 0 && (r = s->api.cuGraphInstantiateWithFlags(&exec, graph, 0)) != 0)
        rc = cu_error(s, d, r, "cannot instantiate the CUDA graph of a %lld-token step", (long long)T);
    if (graph) s->api.cuGraphDestroy(graph);
    if (rc) return -1;
    s->graphs[graph_key(s, T, run)] = exec;
    s->n_graphs++;
    return 0;
}

/* capture, with the kernel overlap where it is on; a driver that cannot capture overlapping
 * launches (graphs took programmatic launches from CUDA 12.3) gets them one after the other from
 * then on, and the capture again (a failure that is not the overlap's is reported by that one). */
static int capture_step(cu_state *s, int64_t T, int64_t run, const step_ptrs *p, ks_diag *d)
{
    if (s->pdl) {
        ks_diag quiet = {.quiet = 1};
        if (capture(s, T, run, p, &quiet) == 0) return 0;
        s->pdl = 0;
    }
    return capture(s, T, run, p, d);
}

/* Where the draw kernel's arrays lie in draw_dev, for cap draws: each
 * starts ACT_ALIGN-aligned (the records hold 8-byte fields). */
typedef struct draw_layout {
    size_t rows;  /* offset of int32 rows[cap]: the logits row of each draw */
    size_t recs;  /* offset of krt_cuda_draw_row records[cap] */
    size_t keys;  /* offset of uint64 keys[cap * vocab] (the kernel's scratch) */
    size_t mass;  /* offset of double masses[cap * vocab] (the kernel's scratch) */
    size_t bytes; /* the whole buffer */
} draw_layout;

static draw_layout layout_draws(int cap, int64_t vocab)
{
#define ALIGN_UP(x) (((x) + ACT_ALIGN - 1) / ACT_ALIGN * ACT_ALIGN)
    draw_layout l;
    l.rows = 0;
    l.recs = ALIGN_UP(sizeof(int32_t) * (size_t)cap);
    l.keys = ALIGN_UP(l.recs + sizeof(krt_cuda_draw_row) * (size_t)cap);
    l.mass = ALIGN_UP(l.keys + sizeof(uint64_t) * (size_t)cap * (size_t)vocab);
    l.bytes = l.mass + sizeof(double) * (size_t)cap * (size_t)vocab;
#undef ALIGN_UP
    return l;
}

/* The draw kernel's buffers for n draws. */
static int reserve_draws(cu_state *s, int n, ks_diag *d)
{
    if (n <= s->draw_cap) return 0;
    int cap = s->draw_cap * 2 > n ? s->draw_cap * 2 : n;
    /* the host's records first: out of memory leaves everything as it was */
    krt_cuda_draw_row *rows = ks_try_realloc(s->draw_rows, sizeof *s->draw_rows * (size_t)cap);
    if (!rows) return ks_error_oom(d, s->e->path, sizeof *s->draw_rows * (size_t)cap, "the draws' records");
    s->draw_rows = rows;
    int32_t *iota = ks_try_realloc(s->draw_iota, sizeof *s->draw_iota * (size_t)cap);
    if (!iota) return ks_error_oom(d, s->e->path, sizeof *s->draw_iota * (size_t)cap, "the draws' rows");
    s->draw_iota = iota;
    for (int k = 0; k < cap; k++) iota[k] = k;
    if (s->draw_dev) s->api.cuMemFree(s->draw_dev);
    s->draw_dev = 0;
    s->draw_cap = 0;
    size_t bytes = layout_draws(cap, s->desc->vocab).bytes;
    krt_cu_result r = s->api.cuMemAlloc(&s->draw_dev, bytes);
    if (r != 0) {
        s->draw_dev = 0;
        return cu_error(s, d, r, "cannot allocate %zu bytes to draw %d tokens", bytes, cap);
    }
    s->draw_cap = cap;
    return 0;
}

/* Queue the draws behind the step's kernels: upload rows and records, launch, copy the records back. */
static int queue_draws(cu_state *s, int64_t T, krt_cu_ptr logits, int n, const int32_t *rows, const krt_draw *draws,
                       ks_diag *d)
{
    for (int k = 0; k < n; k++) {
        KS_ASSERT(rows[k] >= 0 && rows[k] < T);
        s->draw_rows[k] = (krt_cuda_draw_row){draws[k].temperature, draws[k].top_k, draws[k].top_p, -1, draws[k].rng};
    }
    draw_layout l = layout_draws(s->draw_cap, s->desc->vocab);
    krt_cu_ptr d_rows = s->draw_dev + l.rows, d_recs = s->draw_dev + l.recs;
    krt_cu_result r;
    if ((r = s->api.cuMemcpyHtoDAsync(d_rows, rows, sizeof(int32_t) * (size_t)n, s->stream)) != 0 ||
        (r = s->api.cuMemcpyHtoDAsync(d_recs, s->draw_rows, sizeof *s->draw_rows * (size_t)n, s->stream)) != 0)
        return cu_error(s, d, r, "cannot upload the draws");
    union {
        krt_cu_ptr ptr; /* a pointer parameter */
        int i;          /* an int parameter */
    } slot[7] = {{0}};
    slot[0].i = n;
    slot[1].ptr = logits;
    slot[2].i = (int)s->desc->vocab;
    slot[3].ptr = d_rows;
    slot[4].ptr = d_recs;
    slot[5].ptr = s->draw_dev + l.keys;
    slot[6].ptr = s->draw_dev + l.mass;
    void *params[8] = {&slot[0], &slot[1], &slot[2], &slot[3], &slot[4], &slot[5], &slot[6], NULL};
    int at = 2 * s->meta.n_kernels; /* the draw's events, when profiling */
    if (s->events && record(s, at, d) != 0) return -1;
    if ((r = s->api.cuLaunchKernel(s->draw_fn, (unsigned)n, 1, 1, KRT_CUDA_DRAW_THREADS, 1, 1, 0, s->stream, params,
                                   NULL)) != 0)
        return cu_error(s, d, r, "cannot launch %s", KRT_CUDA_DRAW_KERNEL);
    if (s->events && record(s, at + 1, d) != 0) return -1;
    if ((r = s->api.cuMemcpyDtoHAsync(s->draw_rows, d_recs, sizeof *s->draw_rows * (size_t)n, s->stream)) != 0)
        return cu_error(s, d, r, "cannot copy the draws back");
    return 0;
}

/* Which values the tap sees, and when they are copied back: right after
 * the launch that writes them, since the memory plan gives their bytes to
 * other values later in the step. A value's writer is the first launch
 * that names it (or a view of it) whose node is in the value's `fuse`
 * group (a fused kernel computes its group's values): a value that no
 * launch writes (one a fused kernel keeps to itself) is not shown, nor
 * are its views. */
static int plan_tap(cu_state *s, ks_diag *d)
{
    const kir_graph *g = s->g;
    size_t n = g->n_nodes;
    free(s->tap_after);
    free(s->tap_off);
    s->tap_after = ks_try_calloc(n ? n : 1, sizeof *s->tap_after);
    s->tap_off = ks_try_calloc(n ? n : 1, sizeof *s->tap_off);
    uint32_t *first = ks_try_calloc(n ? n : 1, sizeof *first), *last = ks_try_calloc(n ? n : 1, sizeof *last);
    uint8_t *named = ks_try_calloc(n ? n : 1, 1);
    if (!s->tap_after || !s->tap_off || !first || !last || !named) {
        free(first);
        free(last);
        free(named);
        return ks_error_oom(d, s->e->path, (n ? n : 1) * (sizeof *s->tap_after + sizeof *s->tap_off + 9),
                            "the tap's tables");
    }
    for (size_t v = 0; v < n; v++) {
        int64_t group = kir_attr_int(g, (kir_val)v, KIR_A_ANY_FUSE);
        first[v] = group >= 0 && v > 0 && kir_attr_int(g, (kir_val)(v - 1), KIR_A_ANY_FUSE) == group ? first[v - 1]
                                                                                             : (uint32_t)v;
        s->tap_after[v] = -1;
    }
    for (size_t v = n; v-- > 0;) last[v] = v + 1 < n && first[v + 1] == first[v] ? last[v + 1] : (uint32_t)v;
    for (int i = 0; i < s->meta.n_kernels; i++) {
        const krt_cuda_kernel *k = &s->meta.kernels[i];
        for (int a = 0; a < k->n_args; a++) {
            if (k->args[a].kind != KRT_CUDA_ARG_VALUE) continue;
            uint32_t r = s->root[k->args[a].index];
            if (s->home[r] != HOME_ACTS || named[r]) continue;
            named[r] = 1;
            if (r >= first[k->node] && r <= last[k->node]) s->tap_after[r] = i;
        }
    }
    for (size_t v = 0; v < n; v++)
        if (s->home[v] == HOME_ALIAS) s->tap_after[v] = s->home[s->root[v]] == HOME_ACTS ? s->tap_after[s->root[v]] : -1;
    for (size_t v = 0; v < n; v++) /* f32 values, and half ones shown as f32 (show_tapped) */
        if (g->nodes[v].dtype != KIR_F32 && g->nodes[v].dtype != KIR_BF16 && g->nodes[v].dtype != KIR_F16)
            s->tap_after[v] = -1;
    free(first);
    free(last);
    free(named);
    return 0;
}

/* Before a tapped step of T tokens: where each shown value goes in tap_buf.
 * 0, or -1 after reporting out of memory. */
static int layout_tap(cu_state *s, int64_t T, ks_diag *d)
{
    size_t at = 0;
    for (size_t v = 0; v < s->g->n_nodes; v++) {
        if (s->tap_after[v] < 0) continue;
        s->tap_off[v] = at;
        at += (size_t)kir_elems(&s->g->nodes[v], T);
    }
    if (KS_TRY_GROW(s->tap_buf, at ? at : 1, s->tap_cap, (size_t)1 << 36) != 0)
        return ks_error_oom(d, s->e->path, (at ? at : 1) * sizeof(float), "the tapped values");
    return 0;
}

/* After launch i of a tapped step: copy back the values it wrote (a linear
 * scan: the tap is for kiln verify, not for speed). */
static int copy_tapped(cu_state *s, int i, int64_t T, const step_ptrs *p, ks_diag *d)
{
    for (size_t v = 0; v < s->g->n_nodes; v++) {
        if (s->tap_after[v] != i) continue;
        const kir_node *nd = &s->g->nodes[v];
        size_t bytes = kir_dtype_size(nd->dtype) * (size_t)kir_elems(nd, T); /* a half value: into the first half of its room */
        krt_cu_result r = s->api.cuMemcpyDtoHAsync(s->tap_buf + s->tap_off[v], value_ptr(s, (uint32_t)v, p), bytes,
                                                   s->stream);
        if (r != 0) return cu_error(s, d, r, "cannot copy value %%%zu back", v);
    }
    return 0;
}

/* After a tapped step has run: show the values, in schedule order, a half
 * value's elements converted to f32 where they lie (from the last: element
 * i's f32 bytes start at 4 i, past the halves not yet read). */
static void show_tapped(cu_state *s, int64_t T)
{
    for (size_t v = 0; v < s->g->n_nodes; v++) {
        if (s->tap_after[v] < 0) continue;
        float *f = s->tap_buf + s->tap_off[v];
        kir_dtype t = s->g->nodes[v].dtype;
        if (t == KIR_BF16 || t == KIR_F16)
            for (size_t i = (size_t)kir_elems(&s->g->nodes[v], T); i-- > 0;) {
                uint16_t h;
                memcpy(&h, (const unsigned char *)f + 2 * i, sizeof h);
                f[i] = t == KIR_BF16 ? ks_bf16_to_f32(h) : ks_f16_to_f32(h);
            }
        s->tap(s->tap_ctx, (kir_val)v, f, (int)T);
    }
}

/* A step: its kernels (replayed from a graph when captured), then the logits
 * copied back when out is not NULL, then n_draw draws. */
static int run_step(cu_state *s, const krt_step *st, float *out, int n_draw, const int32_t *rows, krt_draw *draws,
                    ks_diag *d)
{
    KS_ASSERT(st && st->n_tokens >= 0);
    if (st->n_tokens == 0) return 0;
    KS_ASSERT(st->tokens && st->positions && st->seq_ids);
    KS_ASSERT(st->n_tokens <= s->desc->plan.max_tokens); /* the session's check */
    if (s->kv_failed) {
        ks_error(d, "cuda", "a copy between KV-cache blocks failed earlier; the cache cannot be trusted");
        return -1;
    }
    krt_cu_result r = s->api.cuCtxSetCurrent(s->ctx);
    if (r != 0) return cu_error(s, d, r, "cannot use the device's context");
    int64_t T = st->n_tokens;
    if (KS_TRY_GROW(s->slots, (size_t)T, s->slots_cap, (size_t)1 << 31) != 0)
        return ks_error_oom(d, s->e->path, (size_t)T * sizeof *s->slots, "a step's KV rows");
    fill_slots(s, st, s->slots);
    const int64_t run = longest_run(s, st); /* the large_per_seq kernels' choice, and the graph's key */
    if (n_draw > 0 && !s->draw_fn) {
        ks_error(d, s->e->path, "the engine has no draw kernel (built before kiln drew tokens on the GPU): rebuild it");
        return -1;
    }
    /* a tapped step copies values back between launches: no graph */
    int graph = s->opts.graphs && T <= s->opts.graph_max_tokens && !s->tap;
    /* only draws wanted, from fewer rows than the step has: the head on those rows (find_head),
     * unless the kernel would take a variant at that many rows (its tensor maps read the whole
     * activation) */
    const int head_rows = !graph && !s->tap && !out && n_draw > 0 && n_draw < T && s->head >= 0 &&
                          !krt_cuda_pick_variant(&s->meta.kernels[s->head], s->arch, n_draw);
    int nk = s->meta.n_kernels, step_ev = 2 * (nk + 1); /* the step's events, when profiling */
    step_ptrs p;
    if (reserve_acts(s, T, d) != 0 || make_tmaps(s, d) != 0 || (n_draw > 0 && reserve_draws(s, n_draw, d) != 0) ||
        (s->events && record(s, step_ev, d) != 0) || upload_step(s, st, graph, &p, d) != 0)
        return -1;
    if (graph) {
        const size_t key = graph_key(s, T, run);
        if (!s->graphs[key] && capture_step(s, T, run, &p, d) != 0) return -1;
        if ((r = s->api.cuGraphLaunch(s->graphs[key], s->stream)) != 0)
            return cu_error(s, d, r, "cannot launch the CUDA graph of a %lld-token step", (long long)T);
    } else {
        if (s->tap && layout_tap(s, T, d) != 0) return -1;
        for (int i = 0; i < nk; i++) {
            if ((s->events && record(s, 2 * i, d) != 0)) return -1;
            if (i == s->head && head_rows) {
                if (launch_head(s, n_draw, rows, &p, d) != 0) return -1;
            } else if (launch(s, i, T, run, &p, d) != 0) {
                return -1;
            }
            if ((s->events && record(s, 2 * i + 1, d) != 0) || (s->tap && copy_tapped(s, i, T, &p, d) != 0)) return -1;
        }
    }
    krt_cu_ptr logits = value_ptr(s, s->meta.output, &p);
    size_t out_bytes = sizeof(float) * (size_t)T * (size_t)s->desc->vocab;
    if (out && (r = s->api.cuMemcpyDtoHAsync(out, logits, out_bytes, s->stream)) != 0)
        return cu_error(s, d, r, "cannot copy the logits back");
    if (n_draw > 0 && head_rows) {
        /* the head wrote the drawn rows' logits one after another */
        if (queue_draws(s, n_draw, logits, n_draw, s->draw_iota, draws, d) != 0) return -1;
    } else if (n_draw > 0 && queue_draws(s, T, logits, n_draw, rows, draws, d) != 0) {
        return -1;
    }
    if (s->events && record(s, step_ev + 1, d) != 0) return -1;
    if ((r = s->api.cuStreamSynchronize(s->stream)) != 0)
        return cu_error(s, d, r, "the step failed on the device (%s)", s->device_name);
    if (s->events && collect_profile(s, st, run, n_draw, head_rows ? s->head : -1, d) != 0) return -1;
    for (int k = 0; k < n_draw; k++) {
        draws[k].id = s->draw_rows[k].id;
        draws[k].rng = s->draw_rows[k].rng;
    }
    if (s->tap) show_tapped(s, T);
    return 0;
}

static int cuda_step(void *state, const krt_step *st, float *out, ks_diag *d)
{
    KS_ASSERT(out);
    return run_step(state, st, out, 0, NULL, NULL, d);
}

static int cuda_step_draw(void *state, const krt_step *st, float *out, int n_draw, const int32_t *rows,
                          krt_draw *draws, ks_diag *d)
{
    return run_step(state, st, out, n_draw, rows, draws, d);
}

static int cuda_can_draw(void *state) { return ((const cu_state *)state)->draw_fn != NULL; }

static int cuda_set_tap(void *state, krt_tap_fn tap, void *ctx, ks_diag *d)
{
    cu_state *s = state;
    s->tap = NULL;
    if (tap && plan_tap(s, d) != 0) return -1; /* out of memory: the tap stays off */
    s->tap = tap;
    s->tap_ctx = ctx;
    return 0;
}

const krt_backend krt_backend_cuda = {
    .name = "cuda",
    .kv_storage = &cuda_kv_storage,
    .kv_elem_size = cuda_kv_elem_size,
    .kv_scale_size = cuda_kv_scale_size,
    .create = NULL,
    .destroy = cuda_destroy,
    .step = cuda_step,
    .open = cuda_open,
    .attach = cuda_attach,
    .mem_info = cuda_mem_info,
    .can_draw = cuda_can_draw,
    .step_draw = cuda_step_draw,
    .set_tap = cuda_set_tap,
    .profile_report = cuda_profile_report,
};
