/*
 * checkpoint.c — the table of tensors every checkpoint reader fills (a hash
 * map of their names for lookup, mapped files owned until close), and
 * reading a tensor as float32 whatever format it came from.
 *
 * The formats themselves live in safetensors.c and llama2c.c; this file
 * knows nothing of them. Tensors are not copied: kf_tensor.data points into
 * a file mapping, which is why the table owns the mappings.
 */
#include "frontend/checkpoint_internal.h"

#include <stdlib.h>
#include <string.h>

kf_checkpoint *kf_ckpt_new(const char *path)
{
    kf_checkpoint *c = ks_xcalloc(1, sizeof *c);
    c->path = ks_arena_strdup(&c->arena, path);
    ks_hmap_init(&c->by_name, NULL, 0, KF_CKPT_MAX_TENSORS, "checkpoint tensors");
    return c;
}

const ks_mmap *kf_ckpt_map(kf_checkpoint *c, ks_diag *d, const char *file)
{
    ks_mmap m;
    if (ks_mmap_open(d, file, &m) != 0) return NULL;
    /* A checkpoint maps one file per shard: the limit only names the array. */
    KS_GROW(c->maps, c->n_maps + 1, c->cap_maps, (size_t)1 << 20, "checkpoint files");
    c->maps[c->n_maps] = m;
    return &c->maps[c->n_maps++];
}

const char *kf_ckpt_strdup(kf_checkpoint *c, const char *s) { return ks_arena_strdup(&c->arena, s); }

const kf_tensor *kf_ckpt_lookup(const kf_checkpoint *c, const char *name)
{
    const uint64_t *at = ks_hmap_get_str(&c->by_name, name, strlen(name));
    return at ? &c->tensors[*at] : NULL;
}

const kf_tensor *kf_ckpt_add(kf_checkpoint *c, const kf_tensor *t)
{
    KS_ASSERT(c->n_tensors < KF_CKPT_MAX_TENSORS);
    int added;
    uint64_t *at = ks_hmap_put_str(&c->by_name, t->name, strlen(t->name), &added);
    if (!added) return &c->tensors[*at];
    KS_GROW(c->tensors, c->n_tensors + 1, c->cap_tensors, KF_CKPT_MAX_TENSORS, "checkpoint tensors");
    *at = c->n_tensors;
    c->tensors[c->n_tensors++] = *t;
    return NULL;
}

void kf_checkpoint_close(kf_checkpoint *c)
{
    if (!c) return;
    for (size_t i = 0; i < c->n_maps; i++) ks_mmap_close(&c->maps[i]);
    free(c->maps);
    free(c->tensors);
    ks_hmap_free(&c->by_name);
    ks_arena_free(&c->arena);
    free(c);
}

size_t kf_checkpoint_count(const kf_checkpoint *c) { return c->n_tensors; }

const kf_tensor *kf_checkpoint_at(const kf_checkpoint *c, size_t i)
{
    KS_ASSERT(i < c->n_tensors);
    return &c->tensors[i];
}

const kf_tensor *kf_checkpoint_find(const kf_checkpoint *c, const char *name) { return kf_ckpt_lookup(c, name); }

const char *kf_checkpoint_path(const kf_checkpoint *c) { return c->path; }

/* ---- reading as float32 ---------------------------------------------------- */

/* Element k of a stored array as float32. Bytes are assembled explicitly:
 * checkpoints are little-endian whatever the host, and data inside a
 * mapping need not be aligned (safetensors headers have any length). */
static float load_f32(const uint8_t *base, kir_dtype dt, size_t k)
{
    switch (dt) {
    case KIR_F32: {
        const uint8_t *p = base + 4 * k;
        uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case KIR_F16: return ks_f16_to_f32((uint16_t)(base[2 * k] | base[2 * k + 1] << 8));
    case KIR_BF16: return ks_bf16_to_f32((uint16_t)(base[2 * k] | base[2 * k + 1] << 8));
    default: KS_UNREACHABLE();
    }
}

static size_t dtype_bytes(kir_dtype dt) { return dt == KIR_F32 ? 4 : 2; }

/* Square tiles for the transposed copy: both sides stay in cache. */
enum { TILE = 32 };

int kf_tensor_read_f32(ks_diag *d, const kf_tensor *t, int transposed, int64_t row_start,
                       int64_t row_end, float *out)
{
    if (t->dtype != KIR_F32 && t->dtype != KIR_F16 && t->dtype != KIR_BF16) {
        ks_error(d, t->file, "tensor '%s': dtype %d cannot be read as f32", t->name, (int)t->dtype);
        return -1;
    }
    KS_ASSERT(t->ndim >= 0 && t->ndim <= KIR_MAX_DIMS);
    if (transposed && t->ndim != 2) {
        ks_error(d, t->file, "tensor '%s': cannot be read transposed: it has %d dims, not 2", t->name,
                 t->ndim);
        return -1;
    }
    /* The readers checked that shape and nbytes agree and do not overflow. */
    size_t elems = 1;
    for (int i = 0; i < t->ndim; i++) elems *= (size_t)t->shape[i];
    KS_ASSERT(elems * dtype_bytes(t->dtype) == t->nbytes);

    /* Rows are dim 0 of the result: [b] of a transposed [a, b]. */
    int64_t rows = t->ndim == 0 ? 1 : transposed ? t->shape[1] : t->shape[0];
    if (row_end < 0) row_end = rows;
    if (t->ndim == 0 && (row_start != 0 || row_end != 1)) {
        ks_error(d, t->file, "tensor '%s': a scalar has no rows to slice", t->name);
        return -1;
    }
    if (row_start < 0 || row_start > row_end || row_end > rows) {
        ks_error(d, t->file, "tensor '%s': rows [%lld, %lld) are not within its %lld rows", t->name,
                 (long long)row_start, (long long)row_end, (long long)rows);
        return -1;
    }
    if (row_start == row_end) return 0;

    if (!transposed) {
        size_t row_elems = rows ? elems / (size_t)rows : 0;
        size_t first = (size_t)row_start * row_elems, n = (size_t)(row_end - row_start) * row_elems;
        for (size_t k = 0; k < n; k++) out[k] = load_f32(t->data, t->dtype, first + k);
        return 0;
    }
    /* Stored [a, b]; result [b, a] restricted to rows [row_start, row_end):
     * out[(j - row_start) * a + i] = stored[i * b + j]. */
    size_t a = (size_t)t->shape[0], b = (size_t)t->shape[1];
    size_t j0 = (size_t)row_start, j1 = (size_t)row_end;
    for (size_t ii = 0; ii < a; ii += TILE) {
        size_t ie = ii + TILE < a ? ii + TILE : a;
        for (size_t jj = j0; jj < j1; jj += TILE) {
            size_t je = jj + TILE < j1 ? jj + TILE : j1;
            for (size_t i = ii; i < ie; i++)
                for (size_t j = jj; j < je; j++) out[(j - j0) * a + i] = load_f32(t->data, t->dtype, i * b + j);
        }
    }
    return 0;
}
