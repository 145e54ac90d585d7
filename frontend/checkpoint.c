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
    if (!at) ks_die(__FILE__, __LINE__, "out of memory indexing the checkpoint's tensors");
    if (!added) return &c->tensors[*at];
    KS_GROW(c->tensors, c->n_tensors + 1, c->cap_tensors, KF_CKPT_MAX_TENSORS, "checkpoint tensors");
    *at = c->n_tensors;
    c->tensors[c->n_tensors++] = *t;
    return NULL;
}

void kf_checkpoint_close(kf_checkpoint *c)
{
    if (!c) return;
    kf_qcache_free(c->qcache);
    for (size_t i = 0; i < c->n_maps; i++) ks_mmap_close(&c->maps[i]);
    free(c->maps);
    free(c->tensors);
    ks_hmap_free(&c->by_name);
    ks_arena_free(&c->arena);
    free(c);
}

void kf_checkpoint_release(kf_checkpoint *c)
{
    for (size_t i = 0; c && i < c->n_maps; i++) ks_mmap_release(&c->maps[i]);
}

size_t kf_checkpoint_count(const kf_checkpoint *c) { return c->n_tensors; }

const uint8_t *kf_tensor_bytes(const kf_tensor *t) { return t->lazy ? kf_lazy_bytes(t->lazy) : t->data; }

const kf_tensor *kf_checkpoint_at(const kf_checkpoint *c, size_t i)
{
    KS_ASSERT(i < c->n_tensors);
    return &c->tensors[i];
}

const kf_tensor *kf_checkpoint_find(const kf_checkpoint *c, const char *name) { return kf_ckpt_lookup(c, name); }

const char *kf_checkpoint_path(const kf_checkpoint *c) { return c->path; }

/* ---- reading as float32 ---------------------------------------------------- */

/* Square tiles for the transposed copy: both sides stay in cache. */
enum { TILE = 32 };

/* kf_tensor_read_f32 with every row_step-th row. */
static int read_rows(ks_diag *d, const kf_tensor *t, int transposed, int64_t row_start, int64_t row_end,
                     int64_t row_step, float *out);

int kf_tensor_read_f32(ks_diag *d, const kf_tensor *t, int transposed, int64_t row_start,
                       int64_t row_end, float *out)
{
    return read_rows(d, t, transposed, row_start, row_end, 1, out);
}

int kf_tensor_read_view(ks_diag *d, const kf_tensor *t, const kf_tensor_view *v, float *out)
{
    if (v->row_step < 1) {
        ks_error(d, t->file, "tensor '%s': a row step of %lld", t->name, (long long)v->row_step);
        return -1;
    }
    kf_tensor grouped; /* a 2-D [A, C] as [groups, A / groups, C] */
    if (v->groups > 0) {
        if (t->ndim != 2 || t->shape[0] % v->groups != 0) {
            ks_error(d, t->file, "tensor '%s': cannot be read as %lld groups of its rows", t->name, (long long)v->groups);
            return -1;
        }
        grouped = *t;
        grouped.ndim = 3;
        grouped.shape[0] = v->groups;
        grouped.shape[1] = t->shape[0] / v->groups;
        grouped.shape[2] = t->shape[1];
        t = &grouped;
    }
    /* each index of dim 0 on its own: a 3-D tensor transposed, or rows of dim 1 */
    if ((t->ndim == 3 && v->transposed) || v->row_dim == 1) {
        if (t->ndim != 2 && t->ndim != 3) {
            ks_error(d, t->file, "tensor '%s': rows of dim 1 need 2 or 3 dims, it has %d", t->name, t->ndim);
            return -1;
        }
        if (t->ndim == 2 && v->transposed) {
            ks_error(d, t->file, "tensor '%s': .T and rows of dim 1 of a 2-D tensor", t->name);
            return -1;
        }
        const uint8_t *bytes = kf_tensor_bytes(t);
        kf_tensor sub = *t; /* the part at one index of dim 0 */
        sub.lazy = NULL;
        sub.ndim = t->ndim - 1;
        for (int i = 0; i < sub.ndim; i++) sub.shape[i] = t->shape[i + 1];
        sub.nbytes = t->nbytes / (size_t)(t->shape[0] > 0 ? t->shape[0] : 1);
        /* rows of dim 0 pick the parts; rows of dim 1, each part's rows (read_rows checks them) */
        int64_t e0 = 0, e1 = t->shape[0], es = 1, lo = 0, hi = -1, step = 1;
        if (v->row_dim == 0 && v->row_end >= 0) e0 = v->row_start, e1 = v->row_end, es = v->row_step;
        if (v->row_dim == 1) lo = v->row_start, hi = v->row_end, step = v->row_step;
        if (e0 < 0 || e0 > e1 || e1 > t->shape[0]) {
            ks_error(d, t->file, "tensor '%s': rows [%lld, %lld) are not within its %lld rows", t->name,
                     (long long)e0, (long long)e1, (long long)t->shape[0]);
            return -1;
        }
        /* a part's elements as read: its rows after .T, of which every step-th from lo below hi */
        int64_t rows = v->transposed ? sub.shape[1] : sub.shape[0], end = hi < 0 ? rows : hi;
        size_t part = sub.nbytes / kir_dtype_size(t->dtype);
        if (rows > 0) part = part / (size_t)rows * (size_t)(end > lo ? (end - lo + step - 1) / step : 0);
        /* transposed_after: a part's rows [n, cols] read, then written [cols, n] */
        int64_t n_rows = end > lo ? (end - lo + step - 1) / step : 0, cols = n_rows ? (int64_t)part / n_rows : 0;
        float *tmp = v->transposed_after && part ? ks_xmalloc(sizeof(float) * part) : NULL;
        for (int64_t e = e0, k = 0; e < e1; e += es, k++) {
            sub.data = bytes + (size_t)e * sub.nbytes;
            float *o = out + (size_t)k * part;
            if (read_rows(d, &sub, v->transposed, lo, hi, step, tmp ? tmp : o) != 0) {
                free(tmp);
                return -1;
            }
            for (int64_t r = 0; tmp && r < n_rows; r++)
                for (int64_t c = 0; c < cols; c++) o[c * n_rows + r] = tmp[r * cols + c];
        }
        free(tmp);
        return 0;
    }
    return read_rows(d, t, v->transposed, v->row_start, v->row_end, v->row_step, out);
}

static int read_rows(ks_diag *d, const kf_tensor *t, int transposed, int64_t row_start, int64_t row_end,
                     int64_t row_step, float *out)
{
    if (t->dtype != KIR_F32 && t->dtype != KIR_F16 && t->dtype != KIR_BF16) {
        ks_error(d, t->file, "tensor '%s': dtype %s cannot be read as f32", t->name, kir_dtype_name(t->dtype));
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
    KS_ASSERT(elems * kir_dtype_size(t->dtype) == t->nbytes);

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

    /* Checkpoints are little-endian whatever the host, and data inside a mapping need
     * not be aligned (safetensors headers have any length): ks_decode_f32 reads both. */
    ks_float_kind kind = kir_float_kind(t->dtype);
    size_t es = kir_dtype_size(t->dtype);
    const uint8_t *data = kf_tensor_bytes(t);
    if (!transposed) {
        size_t row_elems = rows ? elems / (size_t)rows : 0;
        if (row_step == 1) {
            size_t first = (size_t)row_start * row_elems, n = (size_t)(row_end - row_start) * row_elems;
            if (n) ks_decode_f32(data + first * es, kind, n, out); /* n is 0 for a [5, 0] tensor */
            return 0;
        }
        for (int64_t r = row_start, k = 0; r < row_end; r += row_step, k++)
            if (row_elems) ks_decode_f32(data + (size_t)r * row_elems * es, kind, row_elems, out + (size_t)k * row_elems);
        return 0;
    }
    /* Stored [a, b]; result [b, a] restricted to rows row_start, + row_step, ... below row_end:
     * out[(j - row_start) / row_step * a + i] = stored[i * b + j]. */
    size_t a = (size_t)t->shape[0], b = (size_t)t->shape[1];
    size_t j0 = (size_t)row_start, j1 = (size_t)row_end, js = (size_t)row_step;
    float row[TILE]; /* stored[i * b + jj .. i * b + je) */
    for (size_t ii = 0; ii < a; ii += TILE) {
        size_t ie = ii + TILE < a ? ii + TILE : a;
        for (size_t jj = j0; jj < j1; jj += TILE) {
            size_t je = jj + TILE < j1 ? jj + TILE : j1;
            for (size_t i = ii; i < ie; i++) {
                ks_decode_f32(data + (i * b + jj) * es, kind, je - jj, row);
                for (size_t j = jj; j < je; j++)
                    if ((j - j0) % js == 0) out[(j - j0) / js * a + i] = row[j - jj];
            }
        }
    }
    return 0;
}
