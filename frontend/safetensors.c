/*
 * safetensors.c — reading safetensors checkpoints: one file, or shards
 * listed by a model.safetensors.index.json.
 *
 * A safetensors file is an 8-byte little-endian header length N, N bytes of
 * JSON, then the data section. The JSON maps each tensor name to
 * {"dtype": "F32", "shape": [a, b], "data_offsets": [begin, end]}, offsets
 * relative to the data section; "__metadata__" holds free-form strings and
 * is skipped. (Format: github.com/huggingface/safetensors, README "Format".)
 *
 * Everything in the header is untrusted: each entry is checked against the
 * bytes actually present before a kf_tensor points at them, and no two
 * tensors may share bytes. Holes between tensors and bytes after the last
 * one are allowed (the format forbids them, but they are harmless to a
 * reader and some writers pad). The first problem found is reported as
 * `file: error: tensor 'name': ...` and the open fails.
 *
 * Dtypes: F32, F16 and BF16 are read, and I32, I8, U8 and F8_E4M3 (the
 * packed integers of AWQ and GPTQ checkpoints, FP8 checkpoints' weights: for
 * frontend/quantized.c to decode; 8-bit codes of other formats, which a
 * weight of the model cannot bind: lower_weights.c says so); the other safetensors dtypes (BOOL, other
 * integers, F64, the other F8 kinds) are rejected at open, naming the
 * tensor, since kf_tensor has no way to carry them.
 */
#include "frontend/checkpoint_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A header longer than this is not a checkpoint kiln should trust: real
 * headers are tens of kilobytes (~100 bytes per tensor). */
#define KF_SAFETENSORS_MAX_HEADER 100000000ull

/* Largest integer a JSON number holds exactly (cJSON keeps doubles). */
#define KF_JSON_MAX_INT 9007199254740992.0 /* 2^53 */

/* The safetensors dtypes kiln knows of but cannot read. */
static const char *const unsupported_dtypes[] = {
    "BOOL", "U16", "I16", "U32", "U64", "I64", "F64",
    "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "C64",
};

/* What one file's parse needs to report and place tensors. */
typedef struct st_file {
    kf_checkpoint *ckpt;      /* the table being filled */
    ks_diag *diag;            /* where problems go */
    const char *name;         /* the file, as messages name it (in the checkpoint's arena) */
    const uint8_t *data;      /* the data section: after the length and header */
    size_t data_size;         /* bytes in the data section */
} st_file;

/* A tensor's bytes in its file's data section, for the overlap check. */
typedef struct st_span {
    uint64_t begin;           /* first byte, relative to the data section */
    uint64_t end;             /* one past the last byte */
    size_t tensor;            /* index into the checkpoint's tensors */
} st_span;

/* The safetensors name of a dtype kiln reads. */
static const char *dtype_name(kir_dtype dt)
{
    return dt == KIR_F32 ? "F32" : dt == KIR_F16 ? "F16" : dt == KIR_I32 ? "I32" : dt == KIR_F8E4M3 ? "F8_E4M3" : dt == KIR_I8 ? "I8"
           : dt == KIR_U8 ? "U8" : "BF16";
}

/* "[a, b, c]" into b. */
static void format_shape(ks_buf *b, const int64_t *shape, int ndim)
{
    ks_buf_puts(b, "[");
    for (int i = 0; i < ndim; i++) ks_buf_printf(b, "%s%lld", i ? ", " : "", (long long)shape[i]);
    ks_buf_puts(b, "]");
}

/* Report `file: error: tensor 'name': ...`; returns -1. */
static int tensor_error(const st_file *f, const char *tensor, const char *fmt, ...) KS_PRINTF(3, 4);
static int tensor_error(const st_file *f, const char *tensor, const char *fmt, ...)
{
    ks_buf msg = {0};
    va_list ap;
    va_start(ap, fmt);
    ks_buf_vprintf(&msg, fmt, ap);
    va_end(ap);
    ks_error(f->diag, f->name, "tensor '%s': %s", tensor, ks_buf_cstr(&msg));
    ks_buf_free(&msg);
    return -1;
}

/* v as an integer in [0, 2^53]; reports `what` (e.g. "shape[1]") otherwise. */
static int json_index(st_file *f, const char *tensor, const char *what, const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v)) return tensor_error(f, tensor, "%s is not a number", what);
    double x = v->valuedouble;
    if (isfinite(x) && x < 0) return tensor_error(f, tensor, "%s is negative (%g)", what, x);
    if (isfinite(x) && x != floor(x)) return tensor_error(f, tensor, "%s is not an integer (%g)", what, x);
    if (!isfinite(x) || x > KF_JSON_MAX_INT) return tensor_error(f, tensor, "%s is too large (%g)", what, x);
    *out = (uint64_t)x;
    return 0;
}

static int parse_dtype(st_file *f, const char *tensor, const cJSON *entry, kir_dtype *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(entry, "dtype");
    if (!v) return tensor_error(f, tensor, "missing \"dtype\"");
    if (!cJSON_IsString(v)) return tensor_error(f, tensor, "\"dtype\" is not a string");
    const char *s = v->valuestring;
    if (strcmp(s, "F32") == 0) *out = KIR_F32;
    else if (strcmp(s, "F16") == 0) *out = KIR_F16;
    else if (strcmp(s, "BF16") == 0) *out = KIR_BF16;
    else if (strcmp(s, "I32") == 0) *out = KIR_I32;
    else if (strcmp(s, "F8_E4M3") == 0) *out = KIR_F8E4M3;
    else if (strcmp(s, "I8") == 0) *out = KIR_I8;
    else if (strcmp(s, "U8") == 0) *out = KIR_U8;
    else {
        for (size_t i = 0; i < sizeof unsupported_dtypes / sizeof *unsupported_dtypes; i++) {
            if (strcmp(s, unsupported_dtypes[i]) == 0)
                return tensor_error(f, tensor, "dtype %s is not supported (kiln reads F32, F16, BF16, I32, I8, U8 and F8_E4M3)", s);
        }
        return tensor_error(f, tensor, "unknown dtype \"%s\"", s);
    }
    return 0;
}

/* Fills t->ndim and t->shape, and *elems with their product. */
static int parse_shape(st_file *f, const char *tensor, const cJSON *entry, kf_tensor *t, size_t *elems)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(entry, "shape");
    if (!v) return tensor_error(f, tensor, "missing \"shape\"");
    if (!cJSON_IsArray(v)) return tensor_error(f, tensor, "\"shape\" is not an array");
    int ndim = cJSON_GetArraySize(v);
    if (ndim > KIR_MAX_DIMS)
        return tensor_error(f, tensor, "shape has %d dims; kiln handles at most %d", ndim, KIR_MAX_DIMS);
    t->ndim = ndim;
    const cJSON *dim = v->child;
    for (int i = 0; i < ndim; i++, dim = dim->next) {
        char what[32];
        snprintf(what, sizeof what, "shape[%d]", i);
        uint64_t n;
        if (json_index(f, tensor, what, dim, &n) != 0) return -1;
        t->shape[i] = (int64_t)n;
    }
    size_t count = 1;
    for (int i = 0; i < ndim; i++) {
        if (!ks_mul_size(count, (size_t)t->shape[i], &count) || count > (size_t)INT64_MAX) {
            ks_buf b = {0};
            format_shape(&b, t->shape, ndim);
            tensor_error(f, tensor, "shape %s has too many elements", b.data);
            ks_buf_free(&b);
            return -1;
        }
    }
    *elems = count;
    return 0;
}

/* Checks data_offsets against the data section and the size dtype x shape
 * gives; fills t->data and t->nbytes and the span. */
static int parse_offsets(st_file *f, const char *tensor, const cJSON *entry, kf_tensor *t, size_t elems,
                         st_span *span)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(entry, "data_offsets");
    if (!v) return tensor_error(f, tensor, "missing \"data_offsets\"");
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 2)
        return tensor_error(f, tensor, "\"data_offsets\" is not [begin, end]");
    uint64_t begin, end;
    if (json_index(f, tensor, "data_offsets[0]", v->child, &begin) != 0 ||
        json_index(f, tensor, "data_offsets[1]", v->child->next, &end) != 0)
        return -1;
    unsigned long long b = begin, e = end;
    if (begin > end) return tensor_error(f, tensor, "data_offsets [%llu, %llu] end before they begin", b, e);
    if (end > f->data_size)
        return tensor_error(f, tensor,
                            "data_offsets [%llu, %llu] run past the end of the data section (%zu bytes; is the file "
                            "truncated?)",
                            b, e, f->data_size);
    size_t need = 0;
    if (!ks_mul_size(elems, kir_dtype_size(t->dtype), &need)) {
        ks_buf s = {0};
        format_shape(&s, t->shape, t->ndim);
        tensor_error(f, tensor, "%s %s has too many bytes", dtype_name(t->dtype), s.data);
        ks_buf_free(&s);
        return -1;
    }
    if (need != end - begin) {
        ks_buf s = {0};
        format_shape(&s, t->shape, t->ndim);
        tensor_error(f, tensor, "data_offsets [%llu, %llu] hold %llu bytes, but %s %s needs %zu", b, e, e - b,
                     dtype_name(t->dtype), s.data, need);
        ks_buf_free(&s);
        return -1;
    }
    t->data = f->data + begin;
    t->nbytes = need;
    span->begin = begin;
    span->end = end;
    return 0;
}

static int compare_spans(const void *pa, const void *pb)
{
    const st_span *a = pa, *b = pb;
    if (a->begin != b->begin) return a->begin < b->begin ? -1 : 1;
    return a->tensor < b->tensor ? -1 : a->tensor > b->tensor;
}

/* No two tensors of one file may share a byte (empty tensors share none). */
static int check_overlaps(st_file *f, st_span *spans, size_t n)
{
    if (n < 2) return 0; /* and spans may be NULL, which qsort must not see */
    qsort(spans, n, sizeof *spans, compare_spans);
    size_t widest = 0; /* among spans[0..k), the one reaching furthest */
    for (size_t k = 1; k < n; k++) {
        if (spans[k].begin < spans[widest].end) {
            const st_span *a = &spans[widest], *b = &spans[k];
            return tensor_error(f, f->ckpt->tensors[b->tensor].name,
                                "data_offsets [%llu, %llu] overlap tensor '%s' at [%llu, %llu]",
                                (unsigned long long)b->begin, (unsigned long long)b->end,
                                f->ckpt->tensors[a->tensor].name, (unsigned long long)a->begin,
                                (unsigned long long)a->end);
        }
        if (spans[k].end > spans[widest].end) widest = k;
    }
    return 0;
}

/* Checks every entry of a parsed header and adds its tensors. */
static int add_tensors(st_file *f, const cJSON *header)
{
    kf_checkpoint *c = f->ckpt;
    st_span *spans = NULL;
    size_t n_spans = 0, cap_spans = 0;
    int rc = -1;
    for (const cJSON *entry = header->child; entry; entry = entry->next) {
        const char *tname = entry->string;
        if (strcmp(tname, "__metadata__") == 0) continue;
        if (!cJSON_IsObject(entry)) {
            tensor_error(f, tname, "header entry is not a JSON object");
            goto out;
        }
        kf_tensor t = {0};
        size_t elems = 0;
        st_span span;
        if (parse_dtype(f, tname, entry, &t.dtype) != 0 || parse_shape(f, tname, entry, &t, &elems) != 0 ||
            parse_offsets(f, tname, entry, &t, elems, &span) != 0)
            goto out;
        if (c->n_tensors >= KF_CKPT_MAX_TENSORS) {
            ks_error(f->diag, f->name, "more than %zu tensors", (size_t)KF_CKPT_MAX_TENSORS);
            goto out;
        }
        t.name = kf_ckpt_strdup(c, tname);
        t.file = f->name;
        const kf_tensor *old = kf_ckpt_add(c, &t);
        if (old) {
            if (old->file == f->name)
                ks_error(f->diag, f->name, "tensor '%s' appears twice in the header", tname);
            else
                ks_error(f->diag, f->name, "tensor '%s' is also in %s", tname, old->file);
            goto out;
        }
        if (t.nbytes > 0) {
            span.tensor = c->n_tensors - 1;
            KS_GROW(spans, n_spans + 1, cap_spans, KF_CKPT_MAX_TENSORS, "tensor spans");
            spans[n_spans++] = span;
        }
    }
    rc = check_overlaps(f, spans, n_spans);
out:
    free(spans);
    return rc;
}

/* Parse one safetensors file's bytes into c; `name` lives in c's arena. */
static int parse_file(kf_checkpoint *c, ks_diag *d, const char *name, const uint8_t *data, size_t size)
{
    if (size < 8) {
        ks_error(d, name, "file is %zu bytes, too short for the 8-byte header length", size);
        return -1;
    }
    uint64_t hlen = ks_load_le64(data);
    if (hlen > KF_SAFETENSORS_MAX_HEADER) {
        ks_error(d, name, "header length %llu is over the %llu-byte limit (is this a safetensors file?)",
                 (unsigned long long)hlen, KF_SAFETENSORS_MAX_HEADER);
        return -1;
    }
    if (hlen > size - 8) {
        ks_error(d, name, "header length %llu runs past the end of the file (%zu bytes)", (unsigned long long)hlen,
                 size);
        return -1;
    }
    const char *text = (const char *)data + 8;
    const char *end = NULL;
    cJSON *header = cJSON_ParseWithLengthOpts(text, (size_t)hlen, &end, 0);
    if (header && end) {
        /* Writers pad the header with spaces to align the data section. */
        while (end < text + hlen && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')) end++;
        if (end < text + hlen) {
            cJSON_Delete(header);
            header = NULL;
        }
    }
    if (!header) {
        size_t at = end && end >= text && end <= text + hlen ? (size_t)(end - text) : 0;
        ks_error(d, name, "header is not valid JSON (at byte %zu of the header)", at);
        return -1;
    }
    int rc = -1;
    if (!cJSON_IsObject(header)) {
        ks_error(d, name, "header is not a JSON object");
    } else {
        st_file f = {c, d, name, data + 8 + hlen, size - 8 - (size_t)hlen};
        rc = add_tensors(&f, header);
    }
    cJSON_Delete(header);
    return rc;
}

/* Map `file` and parse it into c. */
static int open_file(kf_checkpoint *c, ks_diag *d, const char *file)
{
    const char *name = kf_ckpt_strdup(c, file);
    const ks_mmap *m = kf_ckpt_map(c, d, name);
    if (!m) return -1;
    return parse_file(c, d, name, m->data, m->size);
}

/* ---- sharded checkpoints ----------------------------------------------------
 * model.safetensors.index.json: {"metadata": {...}, "weight_map": {tensor:
 * shard file name}}. Shards are opened in the order the map first names
 * them; each tensor the map names must be in the shard it names. Tensors a
 * shard holds beyond the map are kept (names still may not repeat). */

/* A shard name must name a file in the index's folder. */
static int is_plain_file_name(const char *s)
{
    return s[0] && strchr(s, '/') == NULL && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

static int open_index(kf_checkpoint *c, ks_diag *d, const char *index_path)
{
    size_t len;
    char *text = ks_read_file(d, index_path, &len);
    if (!text) return -1;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    int rc = -1;
    char *dir = NULL;
    const char **shards = NULL; /* distinct shard names, in first-named order */
    size_t n_shards = 0, cap_shards = 0;
    if (!root) {
        ks_error(d, index_path, "not valid JSON (at byte %zu)",
                 end && end >= text && end <= text + len ? (size_t)(end - text) : (size_t)0);
        goto out;
    }
    if (!cJSON_IsObject(root)) {
        ks_error(d, index_path, "not a JSON object");
        goto out;
    }
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!map) {
        ks_error(d, index_path, "missing \"weight_map\"");
        goto out;
    }
    if (!cJSON_IsObject(map)) {
        ks_error(d, index_path, "\"weight_map\" is not a JSON object");
        goto out;
    }
    /* The shards' folder: the index's own. */
    const char *slash = strrchr(index_path, '/');
    dir = slash ? ks_arena_strndup(&c->arena, index_path, slash == index_path ? 1 : (size_t)(slash - index_path))
                : NULL;
    for (const cJSON *e = map->child; e; e = e->next) {
        if (!cJSON_IsString(e)) {
            ks_error(d, index_path, "tensor '%s': its shard is not a string", e->string);
            goto out;
        }
        if (!is_plain_file_name(e->valuestring)) {
            ks_error(d, index_path, "tensor '%s': shard \"%s\" is not a file name in the index's folder", e->string,
                     e->valuestring);
            goto out;
        }
        size_t s = 0;
        while (s < n_shards && strcmp(shards[s], e->valuestring) != 0) s++;
        if (s < n_shards) continue;
        char *path = dir ? ks_path_join(dir, e->valuestring) : ks_xstrdup(e->valuestring);
        int exists = ks_file_exists(path);
        free(path);
        if (!exists) {
            ks_error(d, index_path, "tensor '%s': shard \"%s\" does not exist", e->string, e->valuestring);
            goto out;
        }
        KS_GROW(shards, n_shards + 1, cap_shards, KF_CKPT_MAX_TENSORS, "checkpoint shards");
        shards[n_shards++] = e->valuestring;
    }
    for (size_t s = 0; s < n_shards; s++) {
        char *path = dir ? ks_path_join(dir, shards[s]) : ks_xstrdup(shards[s]);
        int bad = open_file(c, d, path);
        free(path);
        if (bad) goto out;
    }
    for (const cJSON *e = map->child; e; e = e->next) {
        const kf_tensor *t = kf_ckpt_lookup(c, e->string);
        const char *base = t ? strrchr(t->file, '/') : NULL;
        base = base ? base + 1 : t ? t->file : NULL;
        if (!t) {
            ks_error(d, index_path, "tensor '%s': not in its shard \"%s\"", e->string, e->valuestring);
            goto out;
        }
        if (strcmp(base, e->valuestring) != 0) {
            ks_error(d, index_path, "tensor '%s': the index places it in \"%s\", but it is in %s", e->string,
                     e->valuestring, t->file);
            goto out;
        }
    }
    rc = 0;
out:
    free(shards);
    cJSON_Delete(root);
    free(text);
    return rc;
}

/* ---- the public entry points ------------------------------------------------ */

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

kf_checkpoint *kf_checkpoint_open(ks_diag *d, const char *path)
{
    kf_checkpoint *c = kf_ckpt_new(path);
    int rc;
    if (ks_is_dir(path)) {
        char *single = ks_path_join(path, "model.safetensors");
        char *index = ks_path_join(path, "model.safetensors.index.json");
        if (ks_file_exists(single)) {
            rc = open_file(c, d, single);
        } else if (ks_file_exists(index)) {
            rc = open_index(c, d, index);
        } else {
            ks_error(d, path, "no model.safetensors or model.safetensors.index.json in this folder");
            rc = -1;
        }
        free(single);
        free(index);
    } else if (ends_with(path, ".json")) {
        rc = open_index(c, d, path);
    } else {
        rc = open_file(c, d, path);
    }
    if (rc != 0) {
        kf_checkpoint_close(c);
        return NULL;
    }
    return c;
}

kf_checkpoint *kf_checkpoint_open_memory(ks_diag *d, const char *name, const uint8_t *data, size_t size)
{
    kf_checkpoint *c = kf_ckpt_new(name);
    if (parse_file(c, d, c->path, data, size) != 0) {
        kf_checkpoint_close(c);
        return NULL;
    }
    return c;
}
