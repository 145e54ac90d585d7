/* kcu_build.c — CUDA targets, and the engine sections of a CUDA build:
 * generate once, compile per architecture (the architectures at once, a
 * thread each; a cubin compiled before read from KILN_CUDA_CACHE's folder),
 * describe the launches. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "codegen/cuda/kcu.h"
#include "runtime/cuda/cuda_draw.h"

/* ---- targets ----------------------------------------------------------------- */
int kcu_is_target(const char *target) { return target && strncmp(target, "sm_", 3) == 0; }

/* Is [s, s+n) of the form sm_<digits>? */
static int is_arch(const char *s, size_t n)
{
    if (n < 4 || n > 8 || strncmp(s, "sm_", 3) != 0) return 0;
    for (size_t i = 3; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return 0;
    return 1;
}

int kcu_parse_target(const char *target, ks_arena *a, const char ***archs, ks_diag *d)
{
    int n = 1;
    for (const char *p = target; *p; p++) n += *p == ',';
    const char **list = ks_arena_alloc(a, sizeof *list * (size_t)n);
    int count = 0;
    for (const char *p = target;;) {
        size_t len = strcspn(p, ",");
        if (!is_arch(p, len)) {
            ks_error(d, "kiln", "--target %s: '%.*s' is not a CUDA architecture of the form sm_NN (e.g. sm_90)",
                     target, (int)len, p);
            return -1;
        }
        for (int i = 0; i < count; i++) {
            if (strlen(list[i]) == len && strncmp(list[i], p, len) == 0) {
                ks_error(d, "kiln", "--target %s: %.*s is listed twice", target, (int)len, p);
                return -1;
            }
        }
        list[count++] = ks_arena_strndup(a, p, len);
        if (!p[len]) break;
        p += len + 1;
    }
    *archs = list;
    return count;
}

/* ---- --emit-source ------------------------------------------------------------- */
/* The graph's name made safe for a file name. */
static void file_stem(const kir_graph *g, ks_buf *b)
{
    const char *name = kir_graph_name(g, "kernels");
    for (const char *p = name; *p; p++) {
        char c = *p;
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
        ks_buf_put(b, ok ? &c : "_", 1);
    }
}

static int write_source(const char *dir, const char *file, const ks_buf *src, ks_diag *d)
{
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        ks_error(d, dir, "cannot create the folder: %s", strerror(errno));
        return -1;
    }
    if (!ks_is_dir(dir)) {
        ks_error(d, dir, "--emit-source needs a folder");
        return -1;
    }
    char *path = ks_path_join(dir, file);
    ks_outfile f;
    int rc = ks_outfile_open(d, &f, path, 0);
    if (rc == 0) {
        ks_outfile_write(&f, src->data, src->len);
        rc = ks_outfile_commit(d, &f);
    }
    free(path);
    return rc;
}

/* ---- compiling for every architecture ----------------------------------------------- */
/* One architecture's compile. The architectures of a build compile at once, on a thread each:
 * NVRTC compiles separate programs concurrently, and a cubin depends only on the source and its
 * architecture, so the engine holds the same bytes as when they compile one after another. Each
 * compile reports into a log of its own; the logs are passed on in architecture order, up to the
 * first that failed, so the messages are those of a build that compiles in turn and stops there. */
typedef struct arch_job {
    const char *src;      /* the generated source (read by every job) */
    const char *src_name; /* its file name, for messages */
    const char *arch;     /* the architecture, "sm_90" */
    const char *cache;    /* KILN_CUDA_CACHE's folder (kcu_cache.c), or NULL */
    ks_buf *cubin;        /* where its cubin goes */
    ks_buf log;           /* what the compile reported */
    ks_diag diag;         /* quiet, reporting into log */
    int rc;               /* kcu_compile's result: 0 or -1 */
} arch_job;

static void *compile_arch(void *p)
{
    arch_job *j = p;
    if (j->cache && kcu_cache_get(j->cache, j->src, j->arch, j->cubin)) {
        j->rc = 0;
        return NULL;
    }
    j->rc = kcu_compile(j->src, j->src_name, j->arch, j->cubin, &j->diag);
    if (j->rc == 0 && j->cache) kcu_cache_put(j->cache, j->src, j->arch, j->cubin);
    return NULL;
}

/* Compile src for archs[0..n) into cubins[0..n); 0, or -1 once reported. */
static int compile_archs(const char *src, const char *src_name, const char *const *archs, int n, ks_buf *cubins,
                         ks_diag *d)
{
    arch_job *jobs = ks_xcalloc((size_t)n, sizeof *jobs);
    pthread_t *tid = ks_xcalloc((size_t)n, sizeof *tid);
    int *started = ks_xcalloc((size_t)n, sizeof *started);
    const char *cache = getenv("KILN_CUDA_CACHE");
    if (cache && !*cache) cache = NULL;
    for (int i = 0; i < n; i++) {
        jobs[i] = (arch_job){.src = src, .src_name = src_name, .arch = archs[i], .cache = cache, .cubin = &cubins[i]};
        jobs[i].diag = (ks_diag){.log = &jobs[i].log, .quiet = 1};
    }
    /* a thread that cannot start leaves its compile to this one */
    for (int i = 1; i < n; i++) started[i] = pthread_create(&tid[i], NULL, compile_arch, &jobs[i]) == 0;
    compile_arch(&jobs[0]);
    for (int i = 1; i < n; i++) {
        if (started[i])
            pthread_join(tid[i], NULL);
        else
            compile_arch(&jobs[i]);
    }
    int rc = 0;
    for (int i = 0; i < n; i++) {
        if (rc == 0) {
            ks_diag_forward(d, &jobs[i].diag);
            rc = jobs[i].rc;
        }
        ks_buf_free(&jobs[i].log);
    }
    free(jobs);
    free(tid);
    free(started);
    return rc;
}

void kcu_target_options(const char **archs, int n, int gemm90, kcu_options *opt)
{
    for (int i = 0; i < n; i++) {
        if (gemm90 && strcmp(archs[i], "sm_90") == 0) {
            archs[i] = KCU_GEMM90_ARCH;
            opt->gemm90 = 1;
        }
        int64_t optin = kcu_arch_smem_optin(archs[i]);
        if (i == 0 || optin < opt->smem_optin) opt->smem_optin = optin;
    }
}

/* ---- the build ------------------------------------------------------------------- */
int kcu_build(const kir_graph *g, const char *target, const char *emit_dir, kcu_compile_fn on_compile,
              void *on_compile_ctx, kcu_parts *out, ks_diag *d)
{
    memset(out, 0, sizeof *out);
    int n = kcu_parse_target(target, &out->arena, &out->archs, d);
    if (n < 0) return -1;
    for (size_t v = 0; v < g->n_nodes; v++)
        if (g->nodes[v].op == KIR_OP_MATMUL && g->nodes[v].nin > 2 && kcu_qmatmul_supported(g, (kir_val)v)) {
            ks_error(d, "kiln", "--target %s: quantized matmul over '%s' (quant=%s): %s; build with --target cpu, "
                     "or another --quant", target, kir_attr_str(g, g->nodes[v].in[1], KIR_A_WEIGHT_NAME),
                     kir_word_table[kir_attr_word(g, (kir_val)v, KIR_A_MATMUL_QUANT)].text,
                     kcu_qmatmul_supported(g, (kir_val)v));
            kcu_parts_free(out);
            return -1;
        }
    out->n_archs = n;
    /* A target's sm_90 is compiled for sm_90a, whose cubin holds the gemm90 kernels too
     * (kcu_gemm90: wgmma and setmaxnreg are sm_90a's; such a cubin runs on compute capability
     * 9.0, the only sm_9x there is); the engine names it so (cuda.sm_90a, cuda.meta's archs),
     * and the matmul groups' variants name it as theirs. KILN_CUDA_GEMM90=0 keeps plain sm_90. */
    const char *g90_env = getenv("KILN_CUDA_GEMM90"), *above_env = getenv("KILN_CUDA_GEMM90_ABOVE");
    kcu_options opt = {0};
    kcu_target_options(out->archs, n, !(g90_env && strcmp(g90_env, "0") == 0), &opt);
    if (above_env && *above_env) opt.gemm90_above = strtoll(above_env, NULL, 10);
    const char *variant_env = getenv("KILN_CUDA_BATCH_VARIANT");
    opt.batch_variant = variant_env && strcmp(variant_env, "1") == 0;
    const char *cluster_env = getenv("KILN_CUDA_GEMM90_CLUSTER");
    opt.g90_cluster = cluster_env && strcmp(cluster_env, "2") == 0;
    const char *tc_per_sm = getenv("KILN_CUDA_TC_PER_SM"), *tc_ring = getenv("KILN_CUDA_TC_RING");
    if (tc_per_sm && *tc_per_sm) opt.tc_per_sm = atoi(tc_per_sm) > 0 && atoi(tc_per_sm) <= 4 ? atoi(tc_per_sm) : 0;
    const char *tc_xahead = getenv("KILN_CUDA_TC_XAHEAD");
    if (tc_xahead && *tc_xahead) opt.tc_xahead = atoi(tc_xahead) >= 1 && atoi(tc_xahead) <= 8 ? atoi(tc_xahead) : 0;
    const char *moe_bt = getenv("KILN_CUDA_MOE_BT_LARGE");
    if (moe_bt && (strcmp(moe_bt, "16") == 0 || strcmp(moe_bt, "32") == 0)) opt.moe_bt_large = atoi(moe_bt);
    const char *stats_batch = getenv("KILN_CUDA_STATS_BATCH");
    if (stats_batch && *stats_batch)
        opt.stats_batch = atoi(stats_batch) >= 1 && atoi(stats_batch) <= 16 ? atoi(stats_batch) : 0;
    const char *l2_ahead = getenv("KILN_CUDA_L2_AHEAD");
    if (l2_ahead && *l2_ahead && atoi(l2_ahead) >= 1 && atoi(l2_ahead) <= 48) opt.l2_ahead_mb = atoi(l2_ahead);
    const char *tc_xring = getenv("KILN_CUDA_TC_XRING");
    if (tc_xring && strcmp(tc_xring, "0") == 0) opt.tc_xring = -1;
    const char *tc_prefetch = getenv("KILN_CUDA_TC_PREFETCH");
    if (tc_prefetch && *tc_prefetch && atoi(tc_prefetch) >= 1 && atoi(tc_prefetch) <= 64)
        opt.tc_prefetch = atoi(tc_prefetch);
    const char *tc_min_blocks = getenv("KILN_CUDA_TC_MIN_BLOCKS");
    if (tc_min_blocks && *tc_min_blocks && atoi(tc_min_blocks) >= 1 && atoi(tc_min_blocks) <= 4)
        opt.tc_min_blocks = atoi(tc_min_blocks);
    if (tc_ring && *tc_ring) opt.tc_ring_kb = atoi(tc_ring) >= 32 && atoi(tc_ring) <= 224 ? atoi(tc_ring) : 0;

    krt_cuda_meta meta = {0};
    ks_buf src = {0}, stem = {0};
    /* Until the IR records the precision an engine computes in (issue #10), the tests that build
     * engines with the tensor-core prefill attention ask for it here. */
    const char *flash = getenv("KILN_CUDA_FLASH_PREFILL");
    opt.flash_prefill = flash && strcmp(flash, "1") == 0;
    const char *flash90 = getenv("KILN_CUDA_FLASH90");
    opt.no_flash90 = flash90 && strcmp(flash90, "0") == 0;
    const char *flash_decode = getenv("KILN_CUDA_FLASH_DECODE");
    opt.no_flash_decode = flash_decode && strcmp(flash_decode, "0") == 0;
    const char *fd_rounds = getenv("KILN_CUDA_FD_ROUNDS");
    opt.fd_rounds = fd_rounds ? atoi(fd_rounds) : 0;
    if (opt.fd_rounds < 0 || opt.fd_rounds > 64) opt.fd_rounds = 0;
    const char *fd_vrounds = getenv("KILN_CUDA_FD_VROUNDS");
    opt.fd_vrounds = fd_vrounds ? atoi(fd_vrounds) : 0;
    if (opt.fd_vrounds < 0 || opt.fd_vrounds > 64) opt.fd_vrounds = 0;
    opt.choices = &out->choices;
    int rc = kcu_generate_with(g, &opt, &src, &meta, d);
    /* the runtime's draw kernel rides along in every CUDA engine (runtime/cuda/cuda_draw.h) */
    if (rc == 0) ks_buf_puts(&src, krt_cuda_draw_source);
    file_stem(g, &stem);
    ks_buf_puts(&stem, ".cu");
    const char *src_name = ks_arena_strdup(&out->arena, ks_buf_cstr(&stem));
    if (rc == 0 && emit_dir) rc = write_source(emit_dir, src_name, &src, d);

    out->cubins = ks_arena_alloc(&out->arena, sizeof *out->cubins * (size_t)n);
    if (rc == 0 && on_compile) {
        ks_buf list = {0};
        for (int i = 0; i < n; i++) ks_buf_printf(&list, "%s%s", i ? ", " : "", out->archs[i]);
        on_compile(on_compile_ctx, ks_buf_cstr(&list));
        ks_buf_free(&list);
    }
    if (rc == 0) rc = compile_archs(ks_buf_cstr(&src), src_name, out->archs, n, out->cubins, d);
    if (rc == 0) {
        meta.archs = out->archs;
        meta.n_archs = n;
        krt_cuda_meta_write(&meta, &out->meta);
        out->n_sections = 1 + (size_t)n;
        out->sections = ks_arena_alloc(&out->arena, sizeof *out->sections * out->n_sections);
        out->sections[0] = (krt_engine_section){KRT_CUDA_META_SECTION, out->meta.data, out->meta.len};
        for (int i = 0; i < n; i++) {
            const char *name = ks_arena_printf(&out->arena, "%s%s", KRT_CUDA_SECTION_PREFIX, out->archs[i]);
            out->sections[1 + i] = (krt_engine_section){name, out->cubins[i].data, out->cubins[i].len};
        }
    }
    meta.archs = NULL; /* the arena of out owns them */
    krt_cuda_meta_free(&meta);
    ks_buf_free(&src);
    ks_buf_free(&stem);
    if (rc) kcu_parts_free(out);
    return rc;
}

void kcu_parts_free(kcu_parts *p)
{
    for (int i = 0; p->cubins && i < p->n_archs; i++) ks_buf_free(&p->cubins[i]);
    ks_buf_free(&p->meta);
    ks_buf_free(&p->choices);
    ks_arena_free(&p->arena);
    memset(p, 0, sizeof *p);
}
