/* kcu_build.c — CUDA targets, and the engine sections of a CUDA build:
 * generate once, compile per architecture, describe the launches. */
#include <errno.h>
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

/* ---- the build ------------------------------------------------------------------- */
int kcu_build(const kir_graph *g, const char *target, const char *emit_dir, kcu_arch_fn on_arch, void *on_arch_ctx,
              kcu_parts *out, ks_diag *d)
{
    memset(out, 0, sizeof *out);
    int n = kcu_parse_target(target, &out->arena, &out->archs, d);
    if (n < 0) return -1;
    out->n_archs = n;

    krt_cuda_meta meta = {0};
    ks_buf src = {0}, stem = {0};
    int rc = kcu_generate(g, &src, &meta, d);
    /* the runtime's draw kernel rides along in every CUDA engine (runtime/cuda/cuda_draw.h) */
    if (rc == 0) ks_buf_puts(&src, krt_cuda_draw_source);
    file_stem(g, &stem);
    ks_buf_puts(&stem, ".cu");
    const char *src_name = ks_arena_strdup(&out->arena, ks_buf_cstr(&stem));
    if (rc == 0 && emit_dir) rc = write_source(emit_dir, src_name, &src, d);

    out->cubins = ks_arena_alloc(&out->arena, sizeof *out->cubins * (size_t)n);
    for (int i = 0; i < n && rc == 0; i++) {
        if (on_arch) on_arch(on_arch_ctx, out->archs[i], i, n);
        rc = kcu_compile(ks_buf_cstr(&src), src_name, out->archs[i], &out->cubins[i], d);
    }
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
    ks_arena_free(&p->arena);
    memset(p, 0, sizeof *p);
}
