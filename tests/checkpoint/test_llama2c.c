/*
 * test_llama2c.c — the llama2.c .bin reader: stories260K (values read
 * beforehand with Python's struct module), a small file written here in
 * which every float holds its own index (so each tensor's place in the file
 * is checked), and every header error with its exact message.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_test.h"

/* ---- stories260K --------------------------------------------------------- */

/* A tensor of stories260K: shape and its first values, pinned from Python. */
typedef struct pinned {
    const char *name;   /* tensor name */
    int ndim;           /* 1 or 2 */
    int64_t shape[2];   /* dims */
    float first[4];     /* first 4 elements */
} pinned;

static const pinned stories[] = {
    {"tok_embeddings.weight", 2, {512, 64}, {-0.294748783f, 0.561895609f, 0.175422534f, 0.340573609f}},
    {"layers.0.attention_norm.weight", 1, {64, 0}, {0.972242951f, 0.67549336f, 0.820319533f, 0.871589661f}},
    {"layers.0.attention.wq.weight", 2, {64, 64}, {0.0443927869f, 0.0797477067f, -0.00892534666f, 0.0198952276f}},
    {"layers.1.attention.wq.weight", 2, {64, 64}, {0.214123234f, 0.335099846f, -0.0655440837f, -0.0438310578f}},
    {"layers.0.attention.wk.weight", 2, {32, 64}, {0.216130108f, 0.184071079f, -0.216989294f, 0.0602757931f}},
    {"layers.0.attention.wv.weight", 2, {32, 64}, {0.0911254361f, 0.0370284133f, -0.0827622712f, 0.0222484209f}},
    {"layers.0.attention.wo.weight", 2, {64, 64}, {0.017344147f, 0.00468486827f, 0.0651651025f, -0.00116564822f}},
    {"layers.0.ffn_norm.weight", 1, {64, 0}, {0.736777067f, 0.55338341f, 0.677631795f, 0.511051953f}},
    {"layers.0.feed_forward.w1.weight", 2, {172, 64}, {0.21368666f, -0.0463941656f, -0.196767062f, 0.0652381405f}},
    {"layers.0.feed_forward.w2.weight", 2, {64, 172}, {0.134984195f, 0.0671184734f, 0.112493306f, 0.100507595f}},
    {"layers.0.feed_forward.w3.weight", 2, {172, 64}, {0.0703711882f, 0.0479559004f, 0.103341803f, -0.00286771124f}},
    {"layers.4.feed_forward.w3.weight", 2, {172, 64}, {0.0124972966f, 0.0141169177f, -0.111457102f, 0.130053774f}},
    {"norm.weight", 1, {64, 0}, {2.45830894f, 1.36732268f, 1.75043821f, 1.10783184f}},
};

static double number(const cJSON *config, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(config, key);
    return cJSON_IsNumber(v) ? v->valuedouble : -12345;
}

static void test_stories(ct_run *r)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/models/stories260k/stories260K.bin", r->shared);
    sink_clear(&r->out);
    cJSON *config = NULL;
    kf_checkpoint *c = kf_checkpoint_open_llama2c(&r->out.d, path, &config);
    CT_EXPECT_LOG(r, "stories260K.bin", "");
    CHECK(c != NULL && config != NULL);
    if (!c || !config) return;

    CHECK(strcmp(cJSON_GetObjectItemCaseSensitive(config, "model_type")->valuestring, "llama2c") == 0);
    CHECK(number(config, "dim") == 64);
    CHECK(number(config, "hidden_dim") == 172);
    CHECK(number(config, "n_layers") == 5);
    CHECK(number(config, "n_heads") == 8);
    CHECK(number(config, "n_kv_heads") == 4);
    CHECK(number(config, "vocab_size") == 512);
    CHECK(number(config, "seq_len") == 512);
    CHECK(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(config, "shared_classifier")));
    CHECK(number(config, "norm_eps") == 1e-5);
    CHECK(number(config, "rope_theta") == 10000.0);
    CHECK(number(config, "bos_token_id") == 1);
    CHECK(number(config, "eos_token_id") == 2);
    char *text = cJSON_PrintUnformatted(config);
    CHECK(strcmp(text, "{\"model_type\":\"llama2c\",\"dim\":64,\"hidden_dim\":172,\"n_layers\":5,\"n_heads\":8,"
                             "\"n_kv_heads\":4,\"vocab_size\":512,\"seq_len\":512,\"shared_classifier\":true,"
                             "\"norm_eps\":1e-05,\"rope_theta\":10000,\"bos_token_id\":1,\"eos_token_id\":2}") == 0);
    free(text);

    /* 1 embedding, 9 tensors in each of 5 layers, the final norm; shared classifier. */
    CHECK(kf_checkpoint_count(c) == 47);
    CHECK(kf_checkpoint_find(c, "output.weight") == NULL);
    CHECK(strcmp(kf_checkpoint_path(c), path) == 0);
    float *v = malloc(512 * 64 * sizeof *v);
    for (size_t i = 0; i < sizeof stories / sizeof *stories; i++) {
        const pinned *p = &stories[i];
        const kf_tensor *t = kf_checkpoint_find(c, p->name);
        CHECK(t != NULL);
        if (!t) continue;
        CHECK(t->dtype == KIR_F32 && t->ndim == p->ndim && strcmp(t->file, path) == 0);
        for (int k = 0; k < p->ndim; k++) CHECK(t->shape[k] == p->shape[k]);
        CHECK(kf_tensor_read_f32(&r->out.d, t, 0, 0, -1, v) == 0);
        for (int k = 0; k < 4; k++) CHECK_NEAR(v[k], p->first[k], 0);
    }
    /* The first row of wq transposed is wq's column 0: element [1][0] is its second value. */
    const kf_tensor *wq = kf_checkpoint_find(c, "layers.0.attention.wq.weight");
    float row[64];
    CHECK(kf_tensor_read_f32(&r->out.d, wq, 0, 1, 2, row) == 0);
    float w10 = row[0];
    CHECK(kf_tensor_read_f32(&r->out.d, wq, 1, 0, 1, row) == 0);
    CHECK_NEAR(row[0], 0.0443927869f, 0);
    CHECK_NEAR(row[1], w10, 0);
    CT_EXPECT_LOG(r, "stories260K.bin values", "");
    free(v);
    cJSON_Delete(config);
    kf_checkpoint_close(c);

    /* config_out may be NULL. */
    sink_clear(&r->out);
    c = kf_checkpoint_open_llama2c(&r->out.d, path, NULL);
    CHECK(c != NULL && kf_checkpoint_count(c) == 47);
    kf_checkpoint_close(c);
}

/* ---- a small file in which every float is its own index -------------------- */

/* dim 4, hidden 6, 2 layers, 2 heads, 1 KV head (head size 2, kv_dim 2),
 * vocab 5, seq_len 3: 286 floats, 306 with a separate classifier. */
static const int32_t tiny[7] = {4, 6, 2, 2, 1, 5, 3};
enum { TINY_SHARED_FLOATS = 286, TINY_SEPARATE_FLOATS = 306 };

/* A .bin with header h followed by `floats` floats 0, 1, 2, ... and
 * `extra` more bytes. */
static const char *write_bin(ct_run *r, const char *name, const int32_t h[7], size_t floats, size_t extra)
{
    size_t len = 28 + 4 * floats + extra;
    uint8_t *b = calloc(len, 1);
    for (int i = 0; i < 7; i++)
        for (int k = 0; k < 4; k++) b[4 * i + k] = (uint8_t)((uint32_t)h[i] >> (8 * k));
    for (size_t i = 0; i < floats; i++) {
        float f = (float)i;
        uint32_t u;
        memcpy(&u, &f, 4);
        for (int k = 0; k < 4; k++) b[28 + 4 * i + k] = (uint8_t)(u >> (8 * k));
    }
    const char *path = ct_write(r, name, b, len);
    free(b);
    return path;
}

/* Where each tensor starts in the float array, worked out by hand from
 * llama2.c's order (see frontend/llama2c.c). */
static const struct {
    const char *name;   /* tensor */
    int64_t rows, cols; /* shape; cols 0: 1-D */
    int first;          /* index of its first float */
} tiny_layout[] = {
    {"tok_embeddings.weight", 5, 4, 0},
    {"layers.0.attention_norm.weight", 4, 0, 20},
    {"layers.1.attention_norm.weight", 4, 0, 24},
    {"layers.0.attention.wq.weight", 4, 4, 28},
    {"layers.1.attention.wq.weight", 4, 4, 44},
    {"layers.0.attention.wk.weight", 2, 4, 60},
    {"layers.1.attention.wk.weight", 2, 4, 68},
    {"layers.0.attention.wv.weight", 2, 4, 76},
    {"layers.1.attention.wv.weight", 2, 4, 84},
    {"layers.0.attention.wo.weight", 4, 4, 92},
    {"layers.1.attention.wo.weight", 4, 4, 108},
    {"layers.0.ffn_norm.weight", 4, 0, 124},
    {"layers.1.ffn_norm.weight", 4, 0, 128},
    {"layers.0.feed_forward.w1.weight", 6, 4, 132},
    {"layers.1.feed_forward.w1.weight", 6, 4, 156},
    {"layers.0.feed_forward.w2.weight", 4, 6, 180},
    {"layers.1.feed_forward.w2.weight", 4, 6, 204},
    {"layers.0.feed_forward.w3.weight", 6, 4, 228},
    {"layers.1.feed_forward.w3.weight", 6, 4, 252},
    {"norm.weight", 4, 0, 276},
    /* freq_cis_real and _imag: 280..285 */
    {"output.weight", 5, 4, 286},
};
enum { TINY_TENSORS = sizeof tiny_layout / sizeof *tiny_layout };

static void check_tiny(ct_run *r, const char *path, int shared)
{
    sink_clear(&r->out);
    cJSON *config = NULL;
    kf_checkpoint *c = kf_checkpoint_open_llama2c(&r->out.d, path, &config);
    CT_EXPECT_LOG(r, path, "");
    CHECK(c != NULL && config != NULL);
    if (!c || !config) return;
    CHECK(kf_checkpoint_count(c) == (size_t)(shared ? TINY_TENSORS - 1 : TINY_TENSORS));
    CHECK(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(config, "shared_classifier")) == shared);
    CHECK(number(config, "vocab_size") == 5);
    for (size_t i = 0; i < TINY_TENSORS; i++) {
        const kf_tensor *t = kf_checkpoint_find(c, tiny_layout[i].name);
        if (shared && strcmp(tiny_layout[i].name, "output.weight") == 0) {
            CHECK(t == NULL);
            continue;
        }
        CHECK(t != NULL);
        if (!t) continue;
        /* File order is table order. */
        CHECK(kf_checkpoint_at(c, i) == t);
        int64_t n = tiny_layout[i].rows * (tiny_layout[i].cols ? tiny_layout[i].cols : 1);
        CHECK(t->ndim == (tiny_layout[i].cols ? 2 : 1) && t->shape[0] == tiny_layout[i].rows);
        CHECK(t->nbytes == (size_t)n * 4);
        float v[24];
        CHECK(kf_tensor_read_f32(&r->out.d, t, 0, 0, -1, v) == 0);
        for (int64_t k = 0; k < n; k++) CHECK_NEAR(v[k], tiny_layout[i].first + k, 0);
    }
    cJSON_Delete(config);
    kf_checkpoint_close(c);
}

static void test_tiny(ct_run *r)
{
    check_tiny(r, write_bin(r, "tiny_shared.bin", tiny, TINY_SHARED_FLOATS, 0), 1);
    int32_t h[7];
    memcpy(h, tiny, sizeof h);
    h[5] = -5;
    check_tiny(r, write_bin(r, "tiny_separate.bin", h, TINY_SEPARATE_FLOATS, 0), 0);
}

/* ---- header errors ------------------------------------------------------------ */

static void expect_fail(ct_run *r, const char *path, const char *want)
{
    sink_clear(&r->out);
    cJSON sentinel;
    cJSON *config = &sentinel; /* must come back NULL */
    kf_checkpoint *c = kf_checkpoint_open_llama2c(&r->out.d, path, &config);
    CHECK(c == NULL && config == NULL && r->out.d.errors == 1);
    CT_EXPECT_LOG(r, path, want);
    kf_checkpoint_close(c);
}

/* tiny with field `field` set to `value`, as `name`, with the shared size. */
static const char *tiny_with(ct_run *r, const char *name, int field, int32_t value)
{
    int32_t h[7];
    memcpy(h, tiny, sizeof h);
    h[field] = value;
    return write_bin(r, name, h, TINY_SHARED_FLOATS, 0);
}

static void test_errors(ct_run *r)
{
    expect_fail(r, ct_write(r, "short.bin", "\x40\x00\x00\x00", 4),
                "$TMP/short.bin: error: file is 4 bytes, too short for the 28-byte llama2.c header\n");
    expect_fail(r, write_bin(r, "empty_file.bin", tiny, 0, 0) /* header only: sizes checked below */,
                "$TMP/empty_file.bin: error: file is 28 bytes, but its header (dim 4, hidden_dim 6, n_layers 2, "
                "n_heads 2, n_kv_heads 1, vocab_size 5, seq_len 3) needs 1172 (is it truncated?)\n");
    {
        int32_t v1[7] = {0x616b3432, 1, 4, 6, 2, 2, 1};
        expect_fail(r, write_bin(r, "version1.bin", v1, 10, 0),
                    "$TMP/version1.bin: error: this is a llama2.c export of version 1 (magic \"ak42\"); kiln reads "
                    "the legacy format (export.py --version 0)\n");
    }
    expect_fail(r, tiny_with(r, "dim0.bin", 0, 0), "$TMP/dim0.bin: error: header: dim is 0; it must be positive\n");
    expect_fail(r, tiny_with(r, "hidden_neg.bin", 1, -6),
                "$TMP/hidden_neg.bin: error: header: hidden_dim is -6; it must be positive\n");
    expect_fail(r, tiny_with(r, "layers0.bin", 2, 0),
                "$TMP/layers0.bin: error: header: n_layers is 0; it must be positive\n");
    expect_fail(r, tiny_with(r, "heads0.bin", 3, 0),
                "$TMP/heads0.bin: error: header: n_heads is 0; it must be positive\n");
    expect_fail(r, tiny_with(r, "kv_neg.bin", 4, -1),
                "$TMP/kv_neg.bin: error: header: n_kv_heads is -1; it must be positive\n");
    expect_fail(r, tiny_with(r, "vocab0.bin", 5, 0),
                "$TMP/vocab0.bin: error: header: vocab_size is 0; it must be nonzero (negative: separate "
                "classifier)\n");
    expect_fail(r, tiny_with(r, "vocab_min.bin", 5, INT32_MIN),
                "$TMP/vocab_min.bin: error: header: vocab_size is -2147483648; it must be nonzero (negative: "
                "separate classifier)\n");
    expect_fail(r, tiny_with(r, "seq0.bin", 6, 0), "$TMP/seq0.bin: error: header: seq_len is 0; it must be positive\n");
    expect_fail(r, tiny_with(r, "heads3.bin", 3, 3),
                "$TMP/heads3.bin: error: header: dim 4 is not a multiple of n_heads 3\n");
    expect_fail(r, tiny_with(r, "kv3.bin", 4, 3),
                "$TMP/kv3.bin: error: header: n_heads 2 is not a multiple of n_kv_heads 3\n");
    {
        int32_t h[7] = {6, 6, 2, 2, 1, 5, 3}; /* head size 3 */
        expect_fail(r, write_bin(r, "odd_head.bin", h, 300, 0),
                    "$TMP/odd_head.bin: error: header: head size 3 (dim / n_heads) is odd; RoPE rotates pairs\n");
    }
    expect_fail(r, write_bin(r, "truncated.bin", tiny, TINY_SHARED_FLOATS - 1, 0),
                "$TMP/truncated.bin: error: file is 1168 bytes, but its header (dim 4, hidden_dim 6, n_layers 2, "
                "n_heads 2, n_kv_heads 1, vocab_size 5, seq_len 3) needs 1172 (is it truncated?)\n");
    expect_fail(r, write_bin(r, "trailing.bin", tiny, TINY_SHARED_FLOATS, 1),
                "$TMP/trailing.bin: error: file is 1173 bytes, but its header (dim 4, hidden_dim 6, n_layers 2, "
                "n_heads 2, n_kv_heads 1, vocab_size 5, seq_len 3) needs 1172\n");
    expect_fail(r, write_bin(r, "wants_negative.bin", tiny, TINY_SEPARATE_FLOATS, 0),
                "$TMP/wants_negative.bin: error: file is 1252 bytes, but its header (dim 4, hidden_dim 6, n_layers "
                "2, n_heads 2, n_kv_heads 1, vocab_size 5, seq_len 3) needs 1172 (it would fit a separate "
                "classifier: should vocab_size be negative?)\n");
    {
        int32_t h[7];
        memcpy(h, tiny, sizeof h);
        h[5] = -5;
        expect_fail(r, write_bin(r, "wants_positive.bin", h, TINY_SHARED_FLOATS, 0),
                    "$TMP/wants_positive.bin: error: file is 1172 bytes, but its header (dim 4, hidden_dim 6, "
                    "n_layers 2, n_heads 2, n_kv_heads 1, vocab_size -5, seq_len 3) needs 1252 (it would fit a "
                    "shared classifier: should vocab_size be positive?)\n");
    }
    {
        int32_t h[7] = {1 << 30, 2, 1 << 30, 2, 2, 1, 1}; /* layers x dim x dim = 2^90 floats */
        expect_fail(r, write_bin(r, "overflow.bin", h, 4, 0),
                    "$TMP/overflow.bin: error: header: the sizes it gives overflow\n");
    }
    char missing[200];
    snprintf(missing, sizeof missing, "%s/missing.bin", r->dir);
    expect_fail(r, missing, "$TMP/missing.bin: error: cannot open: No such file or directory\n");
}

int main(void)
{
    ct_run r;
    ct_init(&r);
    test_stories(&r);
    test_tiny(&r);
    test_errors(&r);
    ct_cleanup(&r);
    return check_finish("test_llama2c");
}
