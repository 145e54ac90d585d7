/* cuda_meta.c — writing and reading the "cuda.meta" section (runtime/cuda/cuda_meta.h). */
#include "runtime/cuda/cuda_meta.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

/* Spellings of the argument kinds; a kind with an index is "name:N". */
static const struct {
    const char *name; /* as written in the meta */
    int indexed;      /* 1: followed by ":N"; 2: by ":N:R" */
} arg_names[KRT_CUDA_ARG_COUNT] = {
    [KRT_CUDA_ARG_T] = {"T", 0},
    [KRT_CUDA_ARG_VALUE] = {"value", 1},
    [KRT_CUDA_ARG_KV_K] = {"kv_k", 1},
    [KRT_CUDA_ARG_KV_V] = {"kv_v", 1},
    [KRT_CUDA_ARG_POSITIONS] = {"positions", 0},
    [KRT_CUDA_ARG_SLOTS] = {"slots", 0},
    [KRT_CUDA_ARG_TABLE_OFF] = {"table_off", 0},
    [KRT_CUDA_ARG_TABLES] = {"tables", 0},
    [KRT_CUDA_ARG_BLOCK_SIZE] = {"block_size", 0},
    [KRT_CUDA_ARG_TMAP] = {"tmap", 2}, /* tmap:value:box rows */
    [KRT_CUDA_ARG_KV_KS] = {"kv_ks", 1},
    [KRT_CUDA_ARG_KV_VS] = {"kv_vs", 1},
    [KRT_CUDA_ARG_XCODES] = {"xcodes", 1},
    [KRT_CUDA_ARG_XSCALES] = {"xscales", 1},
    [KRT_CUDA_ARG_TMAP_XCODES] = {"tmap_xcodes", 2}, /* tmap_xcodes:value:box rows */
    [KRT_CUDA_ARG_WDEQ] = {"wdeq", 1},
    [KRT_CUDA_ARG_TMAP_WDEQ] = {"tmap_wdeq", 2}, /* tmap_wdeq:value:box rows */
};

void krt_cuda_arg_format(const krt_cuda_arg *a, ks_buf *b)
{
    KS_ASSERT(a->kind < KRT_CUDA_ARG_COUNT);
    if (arg_names[a->kind].indexed == 2)
        ks_buf_printf(b, "%s:%lld:%d", arg_names[a->kind].name, (long long)a->index, (int)a->box);
    else if (arg_names[a->kind].indexed)
        ks_buf_printf(b, "%s:%lld", arg_names[a->kind].name, (long long)a->index);
    else
        ks_buf_puts(b, arg_names[a->kind].name);
}

/* {t, c, div, cap}: ceil((T t + c) / div), at most cap when cap > 0 */
static int64_t grid_of(const int64_t g[4], int64_t T)
{
    const int64_t n = (T * g[0] + g[1] + g[2] - 1) / g[2];
    return g[3] > 0 && n > g[3] ? g[3] : n;
}

int krt_cuda_large(const krt_cuda_kernel *k, int64_t T, int64_t run)
{
    return k->name_large && (k->large_per_seq ? run : T) > k->large_above;
}

int64_t krt_cuda_grid_dim(const krt_cuda_kernel *k, int i, int64_t T, int large)
{
    return grid_of(large && k->has_grid_large ? k->grid_large[i] : k->grid[i], T);
}

int64_t krt_cuda_launch_grid_dim(const krt_cuda_launch *l, int i, int64_t T) { return grid_of(l->grid[i], T); }

const krt_cuda_variant *krt_cuda_pick_variant(const krt_cuda_kernel *k, const char *arch, int64_t T)
{
    const krt_cuda_variant *pick = NULL;
    for (int i = 0; arch && i < k->n_variants; i++)
        if (T > k->variants[i].above && strcmp(k->variants[i].arch, arch) == 0) pick = &k->variants[i];
    return pick;
}

/* ---- writing ------------------------------------------------------------------ */
static cJSON *int_array(const int64_t *v, int n)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)v[i]));
    return a;
}

/* a dim without a cap as the three numbers it always was */
static void put_grid(cJSON *obj, const int64_t (*grid)[4])
{
    cJSON *a = cJSON_AddArrayToObject(obj, "grid");
    for (int g = 0; g < 3; g++) cJSON_AddItemToArray(a, int_array(grid[g], grid[g][3] > 0 ? 4 : 3));
}

static void put_args(cJSON *obj, const krt_cuda_arg *args, int n, ks_buf *arg)
{
    cJSON *a = cJSON_AddArrayToObject(obj, "args");
    for (int i = 0; i < n; i++) {
        arg->len = 0;
        krt_cuda_arg_format(&args[i], arg);
        cJSON_AddItemToArray(a, cJSON_CreateString(ks_buf_cstr(arg)));
    }
}

static void put_variants(cJSON *jk, const krt_cuda_kernel *k, ks_buf *arg)
{
    cJSON *vs = cJSON_AddArrayToObject(jk, "variants");
    for (int i = 0; i < k->n_variants; i++) {
        const krt_cuda_variant *v = &k->variants[i];
        cJSON *jv = cJSON_CreateObject();
        cJSON_AddStringToObject(jv, "arch", v->arch);
        cJSON_AddNumberToObject(jv, "above", (double)v->above);
        cJSON *ls = cJSON_AddArrayToObject(jv, "launches");
        for (int j = 0; j < v->n_launches; j++) {
            const krt_cuda_launch *l = &v->launches[j];
            cJSON *jl = cJSON_CreateObject();
            cJSON_AddStringToObject(jl, "name", l->name);
            cJSON_AddNumberToObject(jl, "block", l->block);
            cJSON_AddNumberToObject(jl, "smem", l->smem);
            put_grid(jl, l->grid);
            put_args(jl, l->args, l->n_args, arg);
            cJSON_AddItemToArray(ls, jl);
        }
        cJSON_AddItemToArray(vs, jv);
    }
}

void krt_cuda_meta_write(const krt_cuda_meta *meta, ks_buf *out)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", KRT_CUDA_META_FORMAT);
    cJSON *archs = cJSON_AddArrayToObject(root, "archs");
    for (int i = 0; i < meta->n_archs; i++) cJSON_AddItemToArray(archs, cJSON_CreateString(meta->archs[i]));
    cJSON_AddNumberToObject(root, "output", meta->output);
    if (meta->pdl) cJSON_AddBoolToObject(root, "pdl", 1);
    cJSON *aliases = cJSON_AddArrayToObject(root, "aliases");
    for (int i = 0; i < meta->n_aliases; i++) {
        int64_t pair[2] = {meta->aliases[i][0], meta->aliases[i][1]};
        cJSON_AddItemToArray(aliases, int_array(pair, 2));
    }
    cJSON *kernels = cJSON_AddArrayToObject(root, "kernels");
    ks_buf arg = {0};
    for (int i = 0; i < meta->n_kernels; i++) {
        const krt_cuda_kernel *k = &meta->kernels[i];
        cJSON *jk = cJSON_CreateObject();
        cJSON_AddStringToObject(jk, "name", k->name);
        cJSON_AddNumberToObject(jk, "node", k->node);
        cJSON_AddNumberToObject(jk, "block", k->block);
        if (k->smem > 0) cJSON_AddNumberToObject(jk, "smem", k->smem); /* absent: 0, as before */
        if (k->name_large) {
            cJSON *jl = cJSON_AddObjectToObject(jk, "large");
            cJSON_AddStringToObject(jl, "name", k->name_large);
            cJSON_AddNumberToObject(jl, "above", (double)k->large_above);
            if (k->large_per_seq) cJSON_AddTrueToObject(jl, "per_seq"); /* absent: by the step's tokens, as before */
            if (k->has_grid_large) put_grid(jl, k->grid_large);
            if (k->smem_large > 0) cJSON_AddNumberToObject(jl, "smem", k->smem_large); /* absent: 0, as before */
        }
        put_grid(jk, k->grid);
        put_args(jk, k->args, k->n_args, &arg);
        if (k->n_variants) put_variants(jk, k, &arg);
        cJSON_AddItemToArray(kernels, jk);
    }
    ks_buf_free(&arg);
    char *text = cJSON_PrintUnformatted(root);
    ks_buf_puts(out, text);
    cJSON_free(text);
    cJSON_Delete(root);
}

/* ---- reading ------------------------------------------------------------------ */
typedef struct reader {
    const char *what; /* the section's name in messages */
    ks_diag *d;       /* where errors go */
    int v2;           /* 1: format kiln-cuda-2 (variants and tensor maps) */
} reader;

static int bad(reader *r, const char *fmt, ...) KS_PRINTF(2, 3);
static int bad(reader *r, const char *fmt, ...)
{
    ks_buf msg = KS_BUF_TRY;
    va_list ap;
    va_start(ap, fmt);
    ks_buf_vprintf(&msg, fmt, ap);
    va_end(ap);
    ks_error(r->d, r->what, "damaged cuda.meta: %s", ks_buf_cstr(&msg));
    ks_buf_free(&msg);
    return -1;
}

/* A non-negative integer below limit. */
static int get_count(reader *r, const cJSON *j, const char *field, int64_t limit, int64_t *out)
{
    if (!cJSON_IsNumber(j) || j->valuedouble < 0 || j->valuedouble >= (double)limit ||
        j->valuedouble != (double)(int64_t)j->valuedouble)
        return bad(r, "%s must be an integer in [0, %lld)", field, (long long)limit);
    *out = (int64_t)j->valuedouble;
    return 0;
}

static int parse_arg(reader *r, const cJSON *j, krt_cuda_arg *a)
{
    if (!cJSON_IsString(j)) return bad(r, "a kernel argument is not a string");
    const char *s = j->valuestring;
    for (int k = 0; k < KRT_CUDA_ARG_COUNT; k++) {
        size_t n = strlen(arg_names[k].name);
        if (strncmp(s, arg_names[k].name, n) != 0) continue;
        if (!arg_names[k].indexed) {
            if (s[n] != 0) continue;
            *a = (krt_cuda_arg){(krt_cuda_arg_kind)k, 0, 0};
            return 0;
        }
        if (s[n] != ':') continue;
        char *end;
        long long idx = strtoll(s + n + 1, &end, 10), box = 0;
        if (end == s + n + 1 || idx < 0 || idx > INT32_MAX) break;
        if (arg_names[k].indexed == 2) {
            const char *b = end + 1;
            if (*end != ':') break;
            box = strtoll(b, &end, 10);
            if (end == b || box < 8 || box > 256 || box % 8) break;
        }
        if (*end) break;
        *a = (krt_cuda_arg){(krt_cuda_arg_kind)k, idx, (int32_t)box};
        return 0;
    }
    return bad(r, "unknown kernel argument '%s'", s);
}

/* Out of memory reading it (the arena is fallible): -1. */
static int nomem(reader *r, krt_cuda_meta *m)
{
    return ks_error_oom(r->d, r->what, m->arena.failed, "the engine's cuda.meta");
}

/* A grid: 3 dims of [t, c, div] or [t, c, div, cap]. */
static int parse_grid(reader *r, const krt_cuda_kernel *k, const cJSON *grid, int64_t (*out)[4])
{
    if (!cJSON_IsArray(grid) || cJSON_GetArraySize(grid) != 3) return bad(r, "kernel %s: grid needs 3 dims", k->name);
    for (int g = 0; g < 3; g++) {
        const cJSON *dim = cJSON_GetArrayItem(grid, g);
        const int terms = cJSON_IsArray(dim) ? cJSON_GetArraySize(dim) : 0;
        if (terms != 3 && terms != 4) return bad(r, "kernel %s: a grid dim needs [t, c, div] or [t, c, div, cap]", k->name);
        out[g][3] = 0;
        for (int i = 0; i < terms; i++)
            if (get_count(r, cJSON_GetArrayItem(dim, i), "a grid term", (int64_t)1 << 31, &out[g][i])) return -1;
        if (out[g][2] == 0) return bad(r, "kernel %s: a grid divisor is 0", k->name);
    }
    return 0;
}

static int parse_args(reader *r, const char *name, const cJSON *args, krt_cuda_arg *out, int *n)
{
    if (!cJSON_IsArray(args) || cJSON_GetArraySize(args) > KRT_CUDA_MAX_ARGS)
        return bad(r, "kernel %s: args must be a list of at most %d", name, KRT_CUDA_MAX_ARGS);
    *n = cJSON_GetArraySize(args);
    for (int a = 0; a < *n; a++)
        if (parse_arg(r, cJSON_GetArrayItem(args, a), &out[a])) return -1;
    return 0;
}

static int parse_launch(reader *r, krt_cuda_meta *m, const krt_cuda_kernel *k, const cJSON *jl, krt_cuda_launch *l)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(jl, "name");
    if (!cJSON_IsString(name) || !name->valuestring[0]) return bad(r, "kernel %s: a variant's launch has no name", k->name);
    l->name = ks_arena_strdup(&m->arena, name->valuestring);
    if (!l->name) return nomem(r, m);
    int64_t v = 0;
    if (get_count(r, cJSON_GetObjectItemCaseSensitive(jl, "block"), "launch block", 1025, &v)) return -1;
    if (v == 0) return bad(r, "kernel %s has an empty block", l->name);
    l->block = (int)v;
    if (get_count(r, cJSON_GetObjectItemCaseSensitive(jl, "smem"), "launch smem", (int64_t)1 << 20, &v)) return -1;
    l->smem = (int)v;
    krt_cuda_kernel named = {.name = l->name};
    if (parse_grid(r, &named, cJSON_GetObjectItemCaseSensitive(jl, "grid"), l->grid)) return -1;
    return parse_args(r, l->name, cJSON_GetObjectItemCaseSensitive(jl, "args"), l->args, &l->n_args);
}

static int parse_variants(reader *r, krt_cuda_meta *m, const cJSON *vs, krt_cuda_kernel *k)
{
    if (!cJSON_IsArray(vs) || cJSON_GetArraySize(vs) > KRT_CUDA_MAX_VARIANTS)
        return bad(r, "kernel %s: variants must be a list of at most %d", k->name, KRT_CUDA_MAX_VARIANTS);
    k->n_variants = cJSON_GetArraySize(vs);
    k->variants = ks_arena_alloc(&m->arena, sizeof *k->variants * (size_t)(k->n_variants + 1));
    if (!k->variants) return nomem(r, m);
    for (int i = 0; i < k->n_variants; i++) {
        krt_cuda_variant *v = &k->variants[i];
        memset(v, 0, sizeof *v);
        const cJSON *jv = cJSON_GetArrayItem(vs, i), *arch = cJSON_GetObjectItemCaseSensitive(jv, "arch");
        if (!cJSON_IsString(arch) || !arch->valuestring[0]) return bad(r, "kernel %s: a variant has no arch", k->name);
        v->arch = ks_arena_strdup(&m->arena, arch->valuestring);
        if (!v->arch) return nomem(r, m);
        if (get_count(r, cJSON_GetObjectItemCaseSensitive(jv, "above"), "variant above", INT32_MAX, &v->above)) return -1;
        if (i > 0 && v->above < k->variants[i - 1].above)
            return bad(r, "kernel %s: variants are not in order of \"above\"", k->name);
        const cJSON *ls = cJSON_GetObjectItemCaseSensitive(jv, "launches");
        if (!cJSON_IsArray(ls) || cJSON_GetArraySize(ls) < 1 || cJSON_GetArraySize(ls) > KRT_CUDA_MAX_LAUNCHES)
            return bad(r, "kernel %s: a variant needs 1 to %d launches", k->name, KRT_CUDA_MAX_LAUNCHES);
        v->n_launches = cJSON_GetArraySize(ls);
        for (int j = 0; j < v->n_launches; j++)
            if (parse_launch(r, m, k, cJSON_GetArrayItem(ls, j), &v->launches[j])) return -1;
    }
    return 0;
}

static int parse_kernel(reader *r, krt_cuda_meta *m, const cJSON *jk, krt_cuda_kernel *k)
{
    memset(k, 0, sizeof *k);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(jk, "name");
    if (!cJSON_IsString(name) || !name->valuestring[0]) return bad(r, "a kernel has no name");
    k->name = ks_arena_strdup(&m->arena, name->valuestring);
    if (!k->name) return nomem(r, m);
    int64_t v = 0;
    if (get_count(r, cJSON_GetObjectItemCaseSensitive(jk, "node"), "kernel node", INT32_MAX, &v)) return -1;
    k->node = (uint32_t)v;
    if (get_count(r, cJSON_GetObjectItemCaseSensitive(jk, "block"), "kernel block", 1025, &v)) return -1;
    if (v == 0) return bad(r, "kernel %s has an empty block", k->name);
    k->block = (int)v;
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(jk, "smem");
    if (js) {
        if (get_count(r, js, "kernel smem", (int64_t)1 << 20, &v)) return -1;
        k->smem = (int)v;
    }
    const cJSON *jl = cJSON_GetObjectItemCaseSensitive(jk, "large");
    if (jl) {
        const cJSON *ln = cJSON_GetObjectItemCaseSensitive(jl, "name");
        if (!cJSON_IsObject(jl) || !cJSON_IsString(ln) || !ln->valuestring[0])
            return bad(r, "kernel %s: \"large\" needs a name", k->name);
        k->name_large = ks_arena_strdup(&m->arena, ln->valuestring);
        if (!k->name_large) return nomem(r, m);
        if (get_count(r, cJSON_GetObjectItemCaseSensitive(jl, "above"), "kernel large.above", INT32_MAX, &v)) return -1;
        k->large_above = v;
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(jl, "per_seq");
        if (ps && !cJSON_IsBool(ps)) return bad(r, "kernel %s: large.per_seq must be true or false", k->name);
        k->large_per_seq = cJSON_IsTrue(ps);
        const cJSON *lg = cJSON_GetObjectItemCaseSensitive(jl, "grid");
        if (lg) {
            if (parse_grid(r, k, lg, k->grid_large)) return -1;
            k->has_grid_large = 1;
        }
        const cJSON *ls = cJSON_GetObjectItemCaseSensitive(jl, "smem");
        if (ls) {
            if (get_count(r, ls, "kernel large.smem", (int64_t)1 << 20, &v)) return -1;
            k->smem_large = (int)v;
        }
    }
    if (parse_grid(r, k, cJSON_GetObjectItemCaseSensitive(jk, "grid"), k->grid)) return -1;
    if (parse_args(r, k->name, cJSON_GetObjectItemCaseSensitive(jk, "args"), k->args, &k->n_args)) return -1;
    const cJSON *vs = cJSON_GetObjectItemCaseSensitive(jk, "variants");
    if (vs && (!r->v2 || parse_variants(r, m, vs, k))) return r->v2 ? -1 : bad(r, "kernel %s: variants in a kiln-cuda-1 meta", k->name);
    return 0;
}

static int parse_root(reader *r, const cJSON *root, krt_cuda_meta *m)
{
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    if (!cJSON_IsString(fmt) ||
        (strcmp(fmt->valuestring, KRT_CUDA_META_FORMAT) != 0 && strcmp(fmt->valuestring, KRT_CUDA_META_FORMAT_1) != 0))
        return bad(r, "format is not \"%s\"", KRT_CUDA_META_FORMAT);
    r->v2 = strcmp(fmt->valuestring, KRT_CUDA_META_FORMAT) == 0;
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "archs");
    if (!cJSON_IsArray(archs) || cJSON_GetArraySize(archs) == 0) return bad(r, "no archs");
    m->n_archs = cJSON_GetArraySize(archs);
    m->archs = ks_arena_alloc(&m->arena, sizeof *m->archs * (size_t)m->n_archs);
    if (!m->archs) return nomem(r, m);
    for (int i = 0; i < m->n_archs; i++) {
        const cJSON *a = cJSON_GetArrayItem(archs, i);
        if (!cJSON_IsString(a)) return bad(r, "an arch is not a string");
        m->archs[i] = ks_arena_strdup(&m->arena, a->valuestring);
        if (!m->archs[i]) return nomem(r, m);
    }
    int64_t v = 0;
    if (get_count(r, cJSON_GetObjectItemCaseSensitive(root, "output"), "output", INT32_MAX, &v)) return -1;
    m->output = (uint32_t)v;
    const cJSON *pdl = cJSON_GetObjectItemCaseSensitive(root, "pdl");
    if (pdl && !cJSON_IsBool(pdl)) return bad(r, "pdl is not true or false");
    m->pdl = cJSON_IsTrue(pdl);
    const cJSON *aliases = cJSON_GetObjectItemCaseSensitive(root, "aliases");
    if (!cJSON_IsArray(aliases)) return bad(r, "no aliases list");
    m->n_aliases = cJSON_GetArraySize(aliases);
    m->aliases = ks_arena_alloc(&m->arena, sizeof *m->aliases * (size_t)(m->n_aliases + 1));
    if (!m->aliases) return nomem(r, m);
    for (int i = 0; i < m->n_aliases; i++) {
        const cJSON *p = cJSON_GetArrayItem(aliases, i);
        if (!cJSON_IsArray(p) || cJSON_GetArraySize(p) != 2) return bad(r, "an alias is not a pair");
        for (int j = 0; j < 2; j++) {
            if (get_count(r, cJSON_GetArrayItem(p, j), "an alias", INT32_MAX, &v)) return -1;
            m->aliases[i][j] = (uint32_t)v;
        }
    }
    const cJSON *kernels = cJSON_GetObjectItemCaseSensitive(root, "kernels");
    if (!cJSON_IsArray(kernels)) return bad(r, "no kernels list");
    m->n_kernels = cJSON_GetArraySize(kernels);
    m->kernels = ks_arena_alloc(&m->arena, sizeof *m->kernels * (size_t)(m->n_kernels + 1));
    if (!m->kernels) return nomem(r, m);
    for (int i = 0; i < m->n_kernels; i++)
        if (parse_kernel(r, m, cJSON_GetArrayItem(kernels, i), &m->kernels[i])) return -1;
    return 0;
}

int krt_cuda_meta_parse(const char *text, size_t len, const char *what, krt_cuda_meta *meta, ks_diag *d)
{
    memset(meta, 0, sizeof *meta);
    meta->arena.fallible = 1; /* the runtime reads it: out of memory is an error (nomem) */
    reader r = {what, d, 0};
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return bad(&r, "not a JSON object");
    }
    int rc = parse_root(&r, root, meta);
    cJSON_Delete(root);
    if (rc) krt_cuda_meta_free(meta);
    return rc;
}

void krt_cuda_meta_free(krt_cuda_meta *meta)
{
    ks_arena_free(&meta->arena);
    memset(meta, 0, sizeof *meta);
}
