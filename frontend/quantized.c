/*
 * quantized.c — a Hub checkpoint stored quantized, decoded into the float
 * tensors its unquantized twin would hold (kf_checkpoint_dequantize,
 * frontend/checkpoint.h).
 *
 * Read by format, as config.json's quantization_config names it, never by
 * architecture: every tensor P.qweight with its P.scales (and P.qzeros,
 * P.g_idx) becomes P.weight, f32 [out, in], so a model description's
 * "....q_proj.weight" finds it whatever the model.
 *
 *   awq   AutoAWQ GEMM ("version": "gemm"), 4-bit, zero points, group g:
 *         qweight i32 [in, out/8]: nibble j (bits 4j..4j+3) of packed column c
 *         holds output channel 8c + AWQ_ORDER[j]; qzeros i32 [in/g, out/8]
 *         packed the same way; scales [in/g, out];
 *         w[o][i] = (q - z[i/g][o]) * s[i/g][o].
 *   gptq  AutoGPTQ, b = 4 or 8 bits, sym or asym: qweight i32 [in*b/32, out],
 *         input row i in bits b*(i % (32/b)) of row i / (32/b); qzeros i32
 *         [groups, out*b/32] packed in order along the output, holding
 *         zero - 1 ("checkpoint_format" gptq, the v1 layout) or the zero
 *         (gptq_v2); scales [groups, out]; g_idx i32 [in] each input's group
 *         (desc_act reorders them; absent: i / g);
 *         w[o][i] = (q - z[g_idx[i]][o]) * s[g_idx[i]][o].
 *   fp8   FP8 E4M3 weights P.weight [out, in] with a scale: compressed-tensors
 *         ("compressed-tensors", format "float-quantized", each of
 *         config_groups' weights 8-bit float symmetric, strategy "channel":
 *         P.weight_scale [out, 1], "tensor": one, "block": [out/bo, in/bi]
 *         for block_structure [bo, bi]) and FineGrainedFP8 ("fp8",
 *         weight_block_size [bo, bi]: P.weight_scale_inv [ceil(out/bo),
 *         ceil(in/bi)]; without one, a scale for the tensor);
 *         w[o][i] = e4m3(P.weight[o][i]) * scale. P.weight is replaced. A static
 *         P.input_scale is left unread: activations stay float (kiln's own FP8
 *         activations, quantized per token, are issue #13's kernels).
 *
 * The products are exact in f32 (a code of at most 8 bits times a half
 * scale), so the decoded weights equal the formats' own float64
 * dequantization. Problems are errors naming the config key (with a caret
 * when the text is at hand) or the tensor.
 */
#include "frontend/quantized.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/checkpoint_internal.h"
#include "support/json_locate.h"

typedef enum { QUANT_AWQ, QUANT_GPTQ, QUANT_FP8 } quant_format;
typedef enum { SCALE_TENSOR, SCALE_CHANNEL, SCALE_BLOCK } quant_scale; /* what an fp8 scale covers */

/* What quantization_config says, checked. */
typedef struct quant_spec {
    quant_format format;
    int bits;      /* 4 (awq), 4 or 8 (gptq); 0 (fp8) */
    int64_t group; /* inputs a scale covers; -1: the whole input (gptq) */
    int zero_plus_one; /* gptq v1: a stored zero is the zero minus one */
    quant_scale scale; /* fp8 */
    int64_t block[2];  /* fp8, SCALE_BLOCK: rows and columns a scale covers */
} quant_spec;

/* AWQ's GEMM packing: nibble j of a packed int32 holds channel 8c + AWQ_ORDER[j]. */
static const int AWQ_ORDER[8] = {0, 2, 4, 6, 1, 3, 5, 7};

/* Report msg at quantization_config.keys[0].keys[1]... (n keys; 0: the object itself). */
static int config_error_at(const kf_json_doc *cfg, const char *const *keys, size_t n, ks_diag *d, const char *msg)
{
    ks_json_step steps[4] = {{"quantization_config", 0}};
    ks_buf path = {0};
    ks_buf_puts(&path, "quantization_config");
    for (size_t i = 0; i < n && i < 3; i++) {
        steps[i + 1].key = keys[i];
        ks_buf_printf(&path, ".%s", keys[i]);
    }
    int line = 0, col = 0;
    if (cfg->src.text && ks_json_locate(cfg->src.text, cfg->src.len, steps, (n < 3 ? n : 3) + 1, &line, &col) == 0)
        ks_error_at(d, &cfg->src, line, col, "%s: %s", ks_buf_cstr(&path), msg);
    else
        ks_error(d, cfg->src.name, "%s: %s", ks_buf_cstr(&path), msg);
    ks_buf_free(&path);
    return -1;
}

/* Report msg at quantization_config.key (key NULL: the object itself). */
static int config_error(const kf_json_doc *cfg, const char *key, ks_diag *d, const char *msg)
{
    return config_error_at(cfg, &key, key ? 1 : 0, d, msg);
}

static const char *string_member(const cJSON *q, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(q, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* A [rows, cols] block size from a JSON list of two positive integers: 0, or -1 (not one). */
static int block_size(const cJSON *v, int64_t *block)
{
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 2) return -1;
    for (int i = 0; i < 2; i++) {
        const cJSON *e = cJSON_GetArrayItem(v, i);
        if (!cJSON_IsNumber(e) || e->valuedouble < 1 || e->valuedouble > 1e6 ||
            e->valuedouble != (double)(int64_t)e->valuedouble)
            return -1;
        block[i] = (int64_t)e->valuedouble;
    }
    return 0;
}

/* compressed-tensors' float-quantized scheme: every group's weights 8-bit float, symmetric, one strategy. */
static int parse_compressed_tensors(const kf_json_doc *cfg, const cJSON *q, quant_spec *s, ks_diag *d)
{
    const char *format = string_member(q, "format");
    if (!format || strcmp(format, "float-quantized") != 0)
        return config_error(cfg, "format", d, "kiln reads compressed-tensors' \"float-quantized\" (FP8) format only");
    const cJSON *groups = cJSON_GetObjectItemCaseSensitive(q, "config_groups");
    if (!cJSON_IsObject(groups) || !groups->child)
        return config_error(cfg, "config_groups", d, "must be an object of one or more schemes");
    int seen = 0;
    for (const cJSON *g = groups->child; g; g = g->next) {
        const char *path[3] = {"config_groups", g->string, "weights"};
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(g, "weights");
        if (!cJSON_IsObject(w)) return config_error_at(cfg, path, 2, d, "has no \"weights\" object");
        const cJSON *bits = cJSON_GetObjectItemCaseSensitive(w, "num_bits");
        const char *type = string_member(w, "type"), *strategy = string_member(w, "strategy");
        const cJSON *sym = cJSON_GetObjectItemCaseSensitive(w, "symmetric");
        if (!cJSON_IsNumber(bits) || bits->valuedouble != 8 || !type || strcmp(type, "float") != 0 || !cJSON_IsTrue(sym))
            return config_error_at(cfg, path, 3, d, "kiln reads 8-bit symmetric float weights (FP8 E4M3) only");
        quant_scale scale;
        int64_t block[2] = {0, 0};
        if (strategy && strcmp(strategy, "channel") == 0) {
            scale = SCALE_CHANNEL;
        } else if (strategy && strcmp(strategy, "tensor") == 0) {
            scale = SCALE_TENSOR;
        } else if (strategy && strcmp(strategy, "block") == 0) {
            scale = SCALE_BLOCK;
            if (block_size(cJSON_GetObjectItemCaseSensitive(w, "block_structure"), block) != 0)
                return config_error_at(cfg, path, 3, d, "strategy \"block\" needs block_structure [rows, columns]");
        } else {
            return config_error_at(cfg, path, 3, d, "strategy must be \"channel\", \"tensor\" or \"block\"");
        }
        if (seen && (scale != s->scale || block[0] != s->block[0] || block[1] != s->block[1]))
            return config_error_at(cfg, path, 2, d, "kiln reads config_groups whose weights share one scheme");
        s->scale = scale;
        s->block[0] = block[0];
        s->block[1] = block[1];
        seen = 1;
    }
    return 0;
}

/* An integer member: 0 with *out set, 1 when absent, -1 after an error (not an integer). */
static int int_member(const kf_json_doc *cfg, const cJSON *q, const char *key, int64_t *out, ks_diag *d)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(q, key);
    if (!v || cJSON_IsNull(v)) return 1;
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(int64_t)v->valuedouble || v->valuedouble < -1e9 ||
        v->valuedouble > 1e9)
        return config_error(cfg, key, d, "must be an integer");
    *out = (int64_t)v->valuedouble;
    return 0;
}

static int parse_spec(const kf_json_doc *cfg, const cJSON *q, quant_spec *s, ks_diag *d)
{
    if (!cJSON_IsObject(q)) return config_error(cfg, NULL, d, "must be an object");
    const char *method = string_member(q, "quant_method");
    if (!method)
        return config_error(cfg, "quant_method", d, "missing, or not a string (awq, gptq, compressed-tensors and fp8 are read)");
    memset(s, 0, sizeof *s);
    if (strcmp(method, "compressed-tensors") == 0) {
        s->format = QUANT_FP8;
        return parse_compressed_tensors(cfg, q, s, d);
    }
    if (strcmp(method, "fp8") == 0) {
        s->format = QUANT_FP8;
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(q, "weight_block_size");
        s->scale = b && !cJSON_IsNull(b) ? SCALE_BLOCK : SCALE_TENSOR;
        if (s->scale == SCALE_BLOCK && block_size(b, s->block) != 0)
            return config_error(cfg, "weight_block_size", d, "must be [rows, columns], two positive integers");
        return 0;
    }
    /* the integer formats: bits (AutoAWQ's w_bit) and group_size (q_group_size) */
    int64_t bits = 4, group = 128;
    int rc;
    if ((rc = int_member(cfg, q, "bits", &bits, d)) < 0) return -1;
    if (rc == 1 && (rc = int_member(cfg, q, "w_bit", &bits, d)) < 0) return -1;
    if ((rc = int_member(cfg, q, "group_size", &group, d)) < 0) return -1;
    if (rc == 1 && (rc = int_member(cfg, q, "q_group_size", &group, d)) < 0) return -1;
    s->bits = (int)bits;
    s->group = group;
    if (strcmp(method, "awq") == 0) {
        s->format = QUANT_AWQ;
        const char *version = string_member(q, "version");
        if (version && strcmp(version, "gemm") != 0 && strcmp(version, "GEMM") != 0)
            return config_error(cfg, "version", d, "kiln reads AWQ's GEMM packing (\"gemm\") only");
        if (bits != 4) return config_error(cfg, cJSON_GetObjectItemCaseSensitive(q, "bits") ? "bits" : "w_bit", d,
                                           "AWQ checkpoints kiln reads are 4-bit");
        const cJSON *zp = cJSON_GetObjectItemCaseSensitive(q, "zero_point");
        if (zp && !cJSON_IsTrue(zp))
            return config_error(cfg, "zero_point", d, "kiln reads AWQ with zero points (true) only");
        if (group <= 0) return config_error(cfg, "group_size", d, "must be positive for AWQ");
        return 0;
    }
    if (strcmp(method, "gptq") == 0) {
        s->format = QUANT_GPTQ;
        if (bits != 4 && bits != 8) return config_error(cfg, "bits", d, "kiln reads 4- and 8-bit GPTQ");
        if (group == 0 || group < -1) return config_error(cfg, "group_size", d, "must be positive, or -1 (one group)");
        const char *format = string_member(q, "checkpoint_format");
        if (format && strcmp(format, "gptq") != 0 && strcmp(format, "gptq_v2") != 0)
            return config_error(cfg, "checkpoint_format", d, "kiln reads \"gptq\" and \"gptq_v2\"");
        s->zero_plus_one = !format || strcmp(format, "gptq") == 0;
        return 0;
    }
    ks_buf msg = {0};
    ks_buf_printf(&msg, "\"%s\": kiln reads awq, gptq, compressed-tensors (FP8) and fp8 checkpoints; use the "
                        "model's float16, bfloat16 or float32 checkpoint", method);
    config_error(cfg, "quant_method", d, ks_buf_cstr(&msg));
    ks_buf_free(&msg);
    return -1;
}

static int tensor_error(const kf_tensor *t, ks_diag *d, const char *what)
{
    ks_error(d, t->file, "tensor '%s': %s", t->name, what);
    return -1;
}

/* The companion P.<suffix> of P.qweight (prefix_len bytes of P), or NULL. */
static const kf_tensor *companion(const kf_checkpoint *c, const char *name, size_t prefix_len, const char *suffix)
{
    ks_buf b = {0};
    ks_buf_put(&b, name, prefix_len);
    ks_buf_puts(&b, suffix);
    const kf_tensor *t = kf_ckpt_lookup(c, ks_buf_cstr(&b));
    ks_buf_free(&b);
    return t;
}

static int32_t i32_at(const kf_tensor *t, int64_t i)
{
    int32_t v;
    memcpy(&v, t->data + (size_t)i * 4, 4);
    return v;
}

static int is_2d(const kf_tensor *t, kir_dtype dt) { return t->dtype == dt && t->ndim == 2; }

static int is_float(const kf_tensor *t) { return t->dtype == KIR_F32 || t->dtype == KIR_F16 || t->dtype == KIR_BF16; }

/* A quantized layer, decoded when read: the packed tensors' descriptors (their data stays in the mapped
 * files) and what their checks at open found. */
typedef struct kf_qlayer {
    quant_spec spec;
    kf_tensor qw, sc, qz, gi; /* qz, gi: data NULL when absent; fp8: qw the E4M3 codes, sc their scale */
    int64_t in, outs;         /* the weight [outs, in] */
    int64_t groups;           /* the scales' groups (int formats: P.scales' rows) */
    int keep;                 /* the codes kept as they are (P.weight#codes, #scales, #zeros) */
    int64_t bo, bi;           /* fp8: the rows and columns a scale covers */
} kf_qlayer;

/* A lazy tensor: part `part` of layer `layer` (0 the weight, f32 [outs, in]; 1 its codes, u8 [outs, in];
 * 2 its scales, f32 [outs, groups]; 3 its zero points, u8 [outs, groups]). */
struct kf_lazy {
    struct kf_qcache *cache;
    const kf_qlayer *layer;
    int part;
};

/* The layer decoded last: each part's bytes (codes, scales, zeros where the layer keeps them). */
struct kf_qcache {
    const kf_qlayer *layer; /* NULL: none yet */
    uint8_t *part[4];
};

void kf_qcache_free(struct kf_qcache *q)
{
    if (!q) return;
    for (int i = 0; i < 4; i++) free(q->part[i]);
    free(q);
}

/* An integer layer's checks: its scales, zero points and g_idx against the qweight and the group size
 * (g_idx's values too, so that decoding cannot fail). */
static int check_layer(kf_qlayer *L, ks_diag *d)
{
    const quant_spec *s = &L->spec;
    const int per = 32 / s->bits;
    const int64_t group = s->group > 0 ? s->group : L->in > 0 ? L->in : 1, in = L->in, outs = L->outs;
    const kf_tensor *sc = &L->sc, *qz = L->qz.data ? &L->qz : NULL, *gi = L->gi.data ? &L->gi : NULL;
    L->groups = sc->shape[0];
    if (sc->shape[1] != outs || (s->format == QUANT_AWQ && L->groups * group != in) ||
        (s->format == QUANT_GPTQ && !gi && L->groups != (in + group - 1) / group))
        return tensor_error(sc, d, "its shape does not fit the layer's qweight and the group size");
    if (qz && (!is_2d(qz, KIR_I32) || qz->shape[0] != L->groups || qz->shape[1] * per != outs))
        return tensor_error(qz, d, "expected i32 [groups, out * bits / 32] zero points");
    if (gi && (gi->dtype != KIR_I32 || gi->ndim != 1 || gi->shape[0] != in))
        return tensor_error(gi, d, "expected i32 [in], each input's group");
    for (int64_t i = 0; gi && i < in; i++) {
        const int64_t g = i32_at(gi, i);
        if (g < 0 || g >= L->groups) {
            ks_buf msg = {0};
            ks_buf_printf(&msg, "input %lld's group %lld is not one of the %lld groups", (long long)i, (long long)g,
                          (long long)L->groups);
            tensor_error(gi, d, ks_buf_cstr(&msg));
            ks_buf_free(&msg);
            return -1;
        }
    }
    return 0;
}

/* Decode integer layer L into out [outs, in] (and its codes, zeros and scales where it keeps them). */
static void decode_layer(const kf_qlayer *L, float *out, uint8_t *codes, float *kept_scales, uint8_t *zeros)
{
    const quant_spec *s = &L->spec;
    const int per = 32 / s->bits;
    const uint32_t mask = (1u << s->bits) - 1;
    const int64_t in = L->in, outs = L->outs, groups = L->groups;
    const int64_t group = s->group > 0 ? s->group : in > 0 ? in : 1;
    const kf_tensor *qw = &L->qw, *qz = L->qz.data ? &L->qz : NULL, *gi = L->gi.data ? &L->gi : NULL;
    float *scales = ks_xmalloc((size_t)(groups * outs > 0 ? groups * outs : 1) * sizeof *scales);
    ks_diag quiet = {0};
    const int rc = kf_tensor_read_f32(&quiet, &L->sc, 0, 0, -1, scales);
    KS_ASSERT(rc == 0); /* a float tensor of 2 dims: checked at open */
    for (int64_t i = 0; i < in; i++) {
        const int64_t g = gi ? i32_at(gi, i) : i / group;
        for (int64_t o = 0; o < outs; o++) {
            uint32_t q, z;
            if (s->format == QUANT_AWQ) {
                const int64_t c = o / 8;
                int j = 0;
                while (AWQ_ORDER[j] != o % 8) j++;
                q = ((uint32_t)i32_at(qw, i * (outs / 8) + c) >> (4 * j)) & mask;
                z = ((uint32_t)i32_at(qz, g * (outs / 8) + c) >> (4 * j)) & mask;
            } else {
                q = ((uint32_t)i32_at(qw, (i / per) * outs + o) >> (s->bits * (i % per))) & mask;
                z = qz ? ((uint32_t)i32_at(qz, g * (outs / per) + o / per) >> (s->bits * (o % per))) & mask
                       : 1u << (s->bits - 1);
                if (qz && s->zero_plus_one) z = (z + 1) & mask; /* AutoGPTQ v1 adds one, modulo 2^bits */
            }
            out[o * in + i] = ((float)(int32_t)q - (float)(int32_t)z) * scales[g * outs + o];
            if (codes) {
                codes[o * in + i] = (uint8_t)q;
                if (i % group == 0) zeros[o * groups + g] = (uint8_t)z, kept_scales[o * groups + g] = scales[g * outs + o];
            }
        }
    }
    free(scales);
}

/* Decode FP8 layer L into out [outs, in]. */
static void decode_fp8_layer(const kf_qlayer *L, float *out)
{
    const int64_t outs = L->outs, in = L->in, cols = (in + L->bi - 1) / L->bi;
    int64_t elems = 1;
    for (int i = 0; i < L->sc.ndim; i++) elems *= L->sc.shape[i];
    float *scales = ks_xmalloc((size_t)(elems ? elems : 1) * sizeof *scales);
    ks_diag quiet = {0};
    const int rc = kf_tensor_read_f32(&quiet, &L->sc, 0, 0, -1, scales);
    KS_ASSERT(rc == 0); /* a float tensor: checked at open */
    for (int64_t o = 0; o < outs; o++)
        for (int64_t i = 0; i < in; i++) out[o * in + i] = ks_e4m3_to_f32(L->qw.data[o * in + i]) * scales[(o / L->bo) * cols + i / L->bi];
    free(scales);
}

const uint8_t *kf_lazy_bytes(const struct kf_lazy *z)
{
    struct kf_qcache *q = z->cache;
    const kf_qlayer *L = z->layer;
    if (q->layer != L) { /* the previous layer's bytes go: one decoded layer at a time */
        for (int i = 0; i < 4; i++) free(q->part[i]), q->part[i] = NULL;
        const size_t n = (size_t)(L->outs * L->in), ng = (size_t)(L->outs * L->groups);
        q->part[0] = ks_xmalloc(sizeof(float) * (n ? n : 1));
        if (L->keep) {
            q->part[1] = ks_xmalloc(n ? n : 1);
            q->part[2] = ks_xmalloc(sizeof(float) * (ng ? ng : 1));
            q->part[3] = ks_xmalloc(ng ? ng : 1);
        }
        if (L->spec.format == QUANT_FP8)
            decode_fp8_layer(L, (float *)(void *)q->part[0]);
        else
            decode_layer(L, (float *)(void *)q->part[0], q->part[1], (float *)(void *)q->part[2], q->part[3]);
        q->layer = L;
    }
    KS_ASSERT(q->part[z->part]);
    return q->part[z->part];
}

/* Add the lazy tensor `name` (part of layer L, dtype and [rows, cols]), marked decoded where it is a
 * companion (no weight binds those: kd_weight_data reads them by name). Adding moves the table. */
static int add_lazy(kf_checkpoint *c, const char *name, const char *file, const kf_qlayer *L, int part, kir_dtype dt,
                    int64_t rows, int64_t cols, ks_diag *d)
{
    struct kf_lazy *z = ks_arena_alloc(&c->arena, sizeof *z);
    *z = (struct kf_lazy){c->qcache, L, part};
    kf_tensor t = {0};
    t.name = kf_ckpt_strdup(c, name);
    t.dtype = dt;
    t.ndim = 2;
    t.shape[0] = rows;
    t.shape[1] = cols;
    t.nbytes = (size_t)(rows * cols) * kir_dtype_size(dt);
    t.file = file;
    t.decoded = part != 0;
    t.lazy = z;
    if (c->n_tensors >= KF_CKPT_MAX_TENSORS) {
        ks_error(d, file, "tensor '%s': too many tensors", t.name);
        return -1;
    }
    kf_ckpt_add(c, &t);
    return 0;
}

/* FP8 layer k (P.weight, F8_E4M3 [out, in]): its scale checked against the spec, and the tensor made a
 * lazy f32 one that decodes it (the codes' descriptor kept in the layer). */
static int check_fp8(kf_checkpoint *c, const quant_spec *s, size_t k, ks_diag *d)
{
    const kf_tensor *w = &c->tensors[k];
    if (w->ndim != 2) return tensor_error(w, d, "an FP8 weight must have 2 dims");
    const size_t plen = strlen(w->name) - 6; /* "P." */
    const kf_tensor *sc = companion(c, w->name, plen, "weight_scale");
    if (!sc) sc = companion(c, w->name, plen, "weight_scale_inv");
    if (!sc || !is_float(sc) || sc->ndim > 2)
        return tensor_error(w, d, "its scale (P.weight_scale or P.weight_scale_inv, f32, f16 or bf16) is missing or malformed");
    const int64_t outs = w->shape[0], in = w->shape[1];
    int64_t elems = 1;
    for (int i = 0; i < sc->ndim; i++) elems *= sc->shape[i];
    int64_t bo = 0, bi = 0; /* the rows and columns a scale covers */
    if (s->scale == SCALE_TENSOR && elems == 1) {
        bo = outs > 0 ? outs : 1, bi = in > 0 ? in : 1;
    } else if (s->scale == SCALE_CHANNEL && elems == outs && (sc->ndim == 1 || sc->shape[1] == 1)) {
        bo = 1, bi = in > 0 ? in : 1;
    } else if (s->scale == SCALE_BLOCK && sc->ndim == 2 && sc->shape[0] == (outs + s->block[0] - 1) / s->block[0] &&
               sc->shape[1] == (in + s->block[1] - 1) / s->block[1]) {
        bo = s->block[0], bi = s->block[1];
    } else {
        return tensor_error(sc, d, s->scale == SCALE_TENSOR    ? "expected one scale for the tensor"
                                   : s->scale == SCALE_CHANNEL ? "expected a scale an output channel, [out, 1]"
                                                               : "expected a scale a block, [ceil(out / rows), ceil(in / columns)]");
    }
    kf_qlayer *L = ks_arena_alloc(&c->arena, sizeof *L);
    *L = (kf_qlayer){.spec = *s, .qw = *w, .sc = *sc, .in = in, .outs = outs, .bo = bo, .bi = bi};
    struct kf_lazy *z = ks_arena_alloc(&c->arena, sizeof *z);
    *z = (struct kf_lazy){c->qcache, L, 0};
    c->tensors[(size_t)(sc - c->tensors)].decoded = 1;
    /* a static activation scale (compressed-tensors' P.input_scale): activations stay float, so it is read by
     * nothing; marked with the layer so that no warning calls it unused */
    const kf_tensor *act = companion(c, c->tensors[k].name, plen, "input_scale");
    if (act) c->tensors[(size_t)(act - c->tensors)].decoded = 1;
    kf_tensor *t = &c->tensors[k];
    t->dtype = KIR_F32;
    t->data = NULL;
    t->lazy = z;
    t->nbytes = (size_t)(outs * in) * sizeof(float);
    return 0;
}

int kf_quantization_check(const kf_json_doc *config, ks_diag *d)
{
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(config->root, "quantization_config");
    quant_spec s;
    return q ? parse_spec(config, q, &s, d) : 0;
}

int kf_checkpoint_dequantize(kf_checkpoint *c, const kf_json_doc *config, ks_diag *d)
{
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(config->root, "quantization_config");
    if (!q) return 0;
    quant_spec s;
    if (parse_spec(config, q, &s, d) != 0) return -1;
    if (!c->qcache) c->qcache = ks_xcalloc(1, sizeof *c->qcache);
    const size_t n = c->n_tensors; /* the tensors added below are not visited */
    size_t layers = 0;
    for (size_t k = 0; k < n; k++) {
        const kf_tensor *qw = &c->tensors[k];
        const size_t len = strlen(qw->name);
        if (s.format == QUANT_FP8) {
            if (qw->dtype != KIR_F8E4M3) continue;
            if (len < 7 || strcmp(qw->name + len - 7, ".weight") != 0)
                return tensor_error(qw, d, "an FP8 tensor that is no layer's weight (P.weight)");
            if (check_fp8(c, &s, k, d) != 0) return -1;
            layers++;
            continue;
        }
        if (len < 8 || strcmp(qw->name + len - 8, ".qweight") != 0) continue;
        const size_t plen = len - 7; /* "P." */
        const int per = 32 / s.bits;
        const kf_tensor *sc = companion(c, qw->name, plen, "scales");
        const kf_tensor *qz = companion(c, qw->name, plen, "qzeros");
        const kf_tensor *gi = s.format == QUANT_GPTQ ? companion(c, qw->name, plen, "g_idx") : NULL;
        if (!is_2d(qw, KIR_I32)) return tensor_error(qw, d, "a packed weight must be i32 of 2 dims");
        if (!sc || !is_float(sc) || sc->ndim != 2)
            return tensor_error(qw, d, "its scales (P.scales, f32, f16 or bf16, 2 dims) are missing or malformed");
        if (s.format == QUANT_AWQ && !qz) return tensor_error(qw, d, "its zero points (P.qzeros) are missing");
        const int64_t in = s.format == QUANT_AWQ ? qw->shape[0] : qw->shape[0] * per;
        const int64_t outs = s.format == QUANT_AWQ ? qw->shape[1] * 8 : qw->shape[1];
        if (s.format == QUANT_AWQ && sc->shape[1] != outs)
            return tensor_error(qw, d, "its shape does not fit its scales' (AWQ packs 8 outputs an i32)");
        ks_buf name = {0};
        ks_buf_put(&name, qw->name, plen);
        ks_buf_puts(&name, "weight");
        if (kf_ckpt_lookup(c, ks_buf_cstr(&name))) {
            ks_buf msg = {0};
            ks_buf_printf(&msg, "the checkpoint holds both it and '%s'", ks_buf_cstr(&name));
            tensor_error(qw, d, ks_buf_cstr(&msg));
            ks_buf_free(&msg);
            ks_buf_free(&name);
            return -1;
        }
        kf_qlayer *L = ks_arena_alloc(&c->arena, sizeof *L);
        *L = (kf_qlayer){.spec = s, .qw = *qw, .sc = *sc, .in = in, .outs = outs};
        if (qz) L->qz = *qz;
        if (gi) L->gi = *gi;
        if (check_layer(L, d) != 0) {
            ks_buf_free(&name);
            return -1;
        }
        /* the codes as they are, where groups of whole columns hold them in order (no g_idx that permutes
         * them): kiln build --quant takes them for the layer's codes, not a quantization of its own */
        const int64_t group = s.group > 0 ? s.group : in;
        L->keep = group > 0 && in % group == 0 && sc->shape[0] == in / group;
        for (int64_t i = 0; gi && L->keep && i < in; i++) L->keep = i32_at(gi, i) == i / group;
        /* the packed parts are read: mark them before the adds move the table */
        const size_t parts[4] = {k, (size_t)(sc - c->tensors), qz ? (size_t)(qz - c->tensors) : k,
                                 gi ? (size_t)(gi - c->tensors) : k};
        for (int p = 0; p < 4; p++) c->tensors[parts[p]].decoded = 1;
        const char *file = qw->file;
        static const char *const suffix[3] = {"#codes", "#scales", "#zeros"};
        int rc = add_lazy(c, ks_buf_cstr(&name), file, L, 0, KIR_F32, outs, in, d);
        for (int p = 0; rc == 0 && L->keep && p < 3; p++) {
            ks_buf part = {0};
            ks_buf_printf(&part, "%s%s", ks_buf_cstr(&name), suffix[p]);
            rc = add_lazy(c, ks_buf_cstr(&part), file, L, p + 1, p == 1 ? KIR_F32 : KIR_U8, outs, p == 0 ? in : L->groups, d);
            ks_buf_free(&part);
        }
        ks_buf_free(&name);
        if (rc) return -1;
        layers++;
    }
    if (layers == 0)
        return config_error(config, "quant_method", d,
                            s.format == QUANT_FP8 ? "no quantized layer (P.weight in F8_E4M3) in the checkpoint"
                                                  : "no quantized layer (P.qweight) in the checkpoint");
    return 0;
}
