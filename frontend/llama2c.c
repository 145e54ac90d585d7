/*
 * llama2c.c — reading llama2.c's legacy `.bin` checkpoints (export.py
 * --version 0, what run.c reads) behind the kf_checkpoint interface.
 *
 * Layout (github.com/karpathy/llama2.c, run.c read_checkpoint and
 * memory_map_weights): seven int32 (dim, hidden_dim, n_layers, n_heads,
 * n_kv_heads, vocab_size, seq_len), then float32 arrays, all little-endian:
 *
 *     token_embedding_table [vocab, dim]
 *     rms_att_weight        [layers, dim]
 *     wq                    [layers, dim, dim]
 *     wk, wv                [layers, kv_dim, dim]    kv_dim = dim * n_kv_heads / n_heads
 *     wo                    [layers, dim, dim]
 *     rms_ffn_weight        [layers, dim]
 *     w1                    [layers, hidden, dim]
 *     w2                    [layers, dim, hidden]
 *     w3                    [layers, hidden, dim]
 *     rms_final_weight      [dim]
 *     freq_cis_real, _imag  [seq_len, head_size / 2]  (unused: RoPE is recomputed)
 *     wcls                  [vocab, dim]             only when vocab_size < 0
 *
 * A positive vocab_size means the classifier shares the embedding table.
 * Each per-layer slice is contiguous, so every layer's matrix becomes its
 * own kf_tensor pointing into the mapping, under Meta's Llama names (those
 * llama2.c's export reads):
 *
 *     tok_embeddings.weight                    [vocab, dim]
 *     layers.{i}.attention_norm.weight         [dim]
 *     layers.{i}.attention.wq.weight           [dim, dim]
 *     layers.{i}.attention.wk.weight           [kv_dim, dim]
 *     layers.{i}.attention.wv.weight           [kv_dim, dim]
 *     layers.{i}.attention.wo.weight           [dim, dim]
 *     layers.{i}.ffn_norm.weight               [dim]
 *     layers.{i}.feed_forward.w1.weight        [hidden, dim]
 *     layers.{i}.feed_forward.w2.weight        [dim, hidden]
 *     layers.{i}.feed_forward.w3.weight        [hidden, dim]
 *     norm.weight                              [dim]
 *     output.weight                            [vocab, dim]  only when not shared
 *
 * wq and wk keep Meta's row order, in which RoPE rotates interleaved pairs
 * (0,1), (2,3)... of each head (Hugging Face's conversion permutes them to
 * rotate halves; this file does not).
 */
#include "frontend/checkpoint_internal.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

enum { HEADER_BYTES = 7 * 4 };

/* export.py --version 1 and 2 start with this uint32 ("ak42" read LE). */
#define LLAMA2C_MAGIC 0x616b3432u

/* The seven header fields, in file order. */
typedef struct l2c_header {
    int32_t dim;        /* model width */
    int32_t hidden_dim; /* feed-forward width */
    int32_t n_layers;   /* transformer blocks */
    int32_t n_heads;    /* query heads */
    int32_t n_kv_heads; /* key/value heads (grouped-query attention) */
    int32_t vocab_size; /* tokens; negative: the classifier is stored separately */
    int32_t seq_len;    /* longest sequence the model was trained on */
} l2c_header;

/* Floats a file with header h holds, or 0 on overflow. */
static size_t count_floats(const l2c_header *h, size_t vocab, int shared)
{
    size_t dim = (size_t)h->dim, hidden = (size_t)h->hidden_dim, layers = (size_t)h->n_layers;
    size_t kv_dim = dim / (size_t)h->n_heads * (size_t)h->n_kv_heads;
    size_t head_size = dim / (size_t)h->n_heads;
    size_t terms[][3] = {
        {vocab, dim, 1},                           /* token_embedding_table */
        {layers, dim, 1},                          /* rms_att_weight */
        {layers, dim, dim},                        /* wq */
        {layers, kv_dim, dim},                     /* wk */
        {layers, kv_dim, dim},                     /* wv */
        {layers, dim, dim},                        /* wo */
        {layers, dim, 1},                          /* rms_ffn_weight */
        {layers, hidden, dim},                     /* w1 */
        {layers, dim, hidden},                     /* w2 */
        {layers, hidden, dim},                     /* w3 */
        {dim, 1, 1},                               /* rms_final_weight */
        {(size_t)h->seq_len, head_size, 1},        /* freq_cis_real + _imag: 2 x [seq_len, head_size / 2] */
        {shared ? 0 : vocab, dim, 1},              /* wcls */
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof terms / sizeof *terms; i++) {
        size_t n;
        if (!ks_mul_size(terms[i][0], terms[i][1], &n) || !ks_mul_size(n, terms[i][2], &n) ||
            !ks_add_size(total, n, &total))
            return 0;
    }
    return total;
}

/* The header's own checks; the size check follows in parse. */
static int check_header(ks_diag *d, const char *name, const l2c_header *h)
{
    const struct {
        const char *what; /* field name in messages */
        int32_t value;    /* its value */
    } fields[] = {
        {"dim", h->dim}, {"hidden_dim", h->hidden_dim}, {"n_layers", h->n_layers},
        {"n_heads", h->n_heads}, {"n_kv_heads", h->n_kv_heads}, {"seq_len", h->seq_len},
    };
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
        if (fields[i].value <= 0) {
            ks_error(d, name, "header: %s is %d; it must be positive", fields[i].what, (int)fields[i].value);
            return -1;
        }
    }
    if (h->vocab_size == 0 || h->vocab_size == INT32_MIN) {
        ks_error(d, name, "header: vocab_size is %d; it must be nonzero (negative: separate classifier)",
                 (int)h->vocab_size);
        return -1;
    }
    if (h->dim % h->n_heads != 0) {
        ks_error(d, name, "header: dim %d is not a multiple of n_heads %d", (int)h->dim, (int)h->n_heads);
        return -1;
    }
    if (h->n_heads % h->n_kv_heads != 0) {
        ks_error(d, name, "header: n_heads %d is not a multiple of n_kv_heads %d", (int)h->n_heads,
                 (int)h->n_kv_heads);
        return -1;
    }
    if ((h->dim / h->n_heads) % 2 != 0) {
        ks_error(d, name, "header: head size %d (dim / n_heads) is odd; RoPE rotates pairs",
                 (int)(h->dim / h->n_heads));
        return -1;
    }
    return 0;
}

/* What adding tensors needs. */
typedef struct l2c_reader {
    kf_checkpoint *ckpt;      /* the table being filled */
    const char *file;         /* the file, for kf_tensor.file (in the checkpoint's arena) */
    const uint8_t *at;        /* next unread float array */
} l2c_reader;

/* Add `count` tensors of shape [rows, cols] (cols 0: [rows]) read one
 * after another; name_fmt has one %d (the layer) when count > 1 or is a
 * plain name. */
static void take(l2c_reader *r, const char *name_fmt, int count, int64_t rows, int64_t cols)
{
    for (int i = 0; i < count; i++) {
        kf_tensor t = {0};
        t.name = strchr(name_fmt, '%') ? ks_arena_printf(&r->ckpt->arena, name_fmt, i)
                                       : kf_ckpt_strdup(r->ckpt, name_fmt);
        t.dtype = KIR_F32;
        t.ndim = cols ? 2 : 1;
        t.shape[0] = rows;
        t.shape[1] = cols;
        t.data = r->at;
        t.nbytes = (size_t)rows * (size_t)(cols ? cols : 1) * 4;
        t.file = r->file;
        const kf_tensor *clash = kf_ckpt_add(r->ckpt, &t);
        KS_ASSERT(clash == NULL); /* names here are fixed and distinct */
        r->at += t.nbytes;
    }
}

static cJSON *make_config(const l2c_header *h, int vocab, int shared)
{
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "model_type", "llama2c");
    cJSON_AddNumberToObject(c, "dim", h->dim);
    cJSON_AddNumberToObject(c, "hidden_dim", h->hidden_dim);
    cJSON_AddNumberToObject(c, "n_layers", h->n_layers);
    cJSON_AddNumberToObject(c, "n_heads", h->n_heads);
    cJSON_AddNumberToObject(c, "n_kv_heads", h->n_kv_heads);
    cJSON_AddNumberToObject(c, "vocab_size", vocab);
    cJSON_AddNumberToObject(c, "seq_len", h->seq_len);
    cJSON_AddBoolToObject(c, "shared_classifier", shared);
    /* Constants of llama2.c's model.py and run.c. */
    cJSON_AddNumberToObject(c, "norm_eps", 1e-5);
    cJSON_AddNumberToObject(c, "rope_theta", 10000.0);
    cJSON_AddNumberToObject(c, "bos_token_id", 1);
    cJSON_AddNumberToObject(c, "eos_token_id", 2);
    /* cJSON reports running out of memory by returning NULL from an add;
     * kiln treats that as fatal, as ks_xmalloc does. */
    KS_ASSERT(cJSON_GetArraySize(c) == 13);
    return c;
}

static int parse(kf_checkpoint *c, ks_diag *d, const char *name, const uint8_t *data, size_t size,
                 cJSON **config_out)
{
    if (size < HEADER_BYTES) {
        ks_error(d, name, "file is %zu bytes, too short for the %d-byte llama2.c header", size, HEADER_BYTES);
        return -1;
    }
    if (ks_load_le32(data) == LLAMA2C_MAGIC) {
        ks_error(d, name, "this is a llama2.c export of version %d (magic \"ak42\"); kiln reads the legacy format "
                 "(export.py --version 0)", size >= 8 ? (int)ks_load_le_i32(data + 4) : -1);
        return -1;
    }
    l2c_header h = {ks_load_le_i32(data),      ks_load_le_i32(data + 4),  ks_load_le_i32(data + 8),
                    ks_load_le_i32(data + 12), ks_load_le_i32(data + 16), ks_load_le_i32(data + 20),
                    ks_load_le_i32(data + 24)};
    if (check_header(d, name, &h) != 0) return -1;
    int shared = h.vocab_size > 0;
    int vocab = shared ? h.vocab_size : -h.vocab_size;

    size_t floats = count_floats(&h, (size_t)vocab, shared), need;
    if (floats == 0 || !ks_mul_size(floats, 4, &need) || !ks_add_size(need, HEADER_BYTES, &need)) {
        ks_error(d, name, "header: the sizes it gives overflow");
        return -1;
    }
    if (size != need) {
        /* The likeliest mix-up: the sign of vocab_size. */
        size_t other = count_floats(&h, (size_t)vocab, !shared);
        const char *hint = size < need ? " (is it truncated?)" : "";
        if (other != 0 && other <= (SIZE_MAX - HEADER_BYTES) / 4 && size == other * 4 + HEADER_BYTES)
            hint = shared ? " (it would fit a separate classifier: should vocab_size be negative?)"
                          : " (it would fit a shared classifier: should vocab_size be positive?)";
        ks_error(d, name,
                 "file is %zu bytes, but its header (dim %d, hidden_dim %d, n_layers %d, n_heads %d, "
                 "n_kv_heads %d, vocab_size %d, seq_len %d) needs %zu%s",
                 size, (int)h.dim, (int)h.hidden_dim, (int)h.n_layers, (int)h.n_heads, (int)h.n_kv_heads,
                 (int)h.vocab_size, (int)h.seq_len, need, hint);
        return -1;
    }

    int64_t dim = h.dim, hidden = h.hidden_dim, kv_dim = (int64_t)h.dim / h.n_heads * h.n_kv_heads;
    int layers = h.n_layers;
    /* 9 tensors a layer plus 3: under the limit for any file that passed
     * the size check, but the check costs nothing. */
    if ((size_t)layers * 9 + 3 > KF_CKPT_MAX_TENSORS) {
        ks_error(d, name, "header: n_layers %d gives more than %zu tensors", layers, (size_t)KF_CKPT_MAX_TENSORS);
        return -1;
    }
    l2c_reader r = {c, name, data + HEADER_BYTES};
    take(&r, "tok_embeddings.weight", 1, vocab, dim);
    take(&r, "layers.%d.attention_norm.weight", layers, dim, 0);
    take(&r, "layers.%d.attention.wq.weight", layers, dim, dim);
    take(&r, "layers.%d.attention.wk.weight", layers, kv_dim, dim);
    take(&r, "layers.%d.attention.wv.weight", layers, kv_dim, dim);
    take(&r, "layers.%d.attention.wo.weight", layers, dim, dim);
    take(&r, "layers.%d.ffn_norm.weight", layers, dim, 0);
    take(&r, "layers.%d.feed_forward.w1.weight", layers, hidden, dim);
    take(&r, "layers.%d.feed_forward.w2.weight", layers, dim, hidden);
    take(&r, "layers.%d.feed_forward.w3.weight", layers, hidden, dim);
    take(&r, "norm.weight", 1, dim, 0);
    /* Skip freq_cis_real and _imag: 2 x [seq_len, head_size / 2] floats. */
    r.at += (size_t)h.seq_len * (size_t)(dim / h.n_heads) * 4;
    if (!shared) take(&r, "output.weight", 1, vocab, dim);
    KS_ASSERT(r.at == data + size);

    if (config_out) *config_out = make_config(&h, vocab, shared);
    return 0;
}

kf_checkpoint *kf_checkpoint_open_llama2c_memory(ks_diag *d, const char *name, const uint8_t *data,
                                                 size_t size, cJSON **config_out)
{
    if (config_out) *config_out = NULL;
    kf_checkpoint *c = kf_ckpt_new(name);
    if (parse(c, d, c->path, data, size, config_out) != 0) {
        kf_checkpoint_close(c);
        return NULL;
    }
    return c;
}

kf_checkpoint *kf_checkpoint_open_llama2c(ks_diag *d, const char *path, cJSON **config_out)
{
    if (config_out) *config_out = NULL;
    kf_checkpoint *c = kf_ckpt_new(path);
    const ks_mmap *m = kf_ckpt_map(c, d, c->path);
    if (!m || parse(c, d, c->path, m->data, m->size, config_out) != 0) {
        kf_checkpoint_close(c);
        return NULL;
    }
    return c;
}
