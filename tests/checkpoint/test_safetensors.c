/*
 * test_safetensors.c — the safetensors reader against the shared models
 * (shapes, dtypes and values read beforehand with Python's struct module,
 * independently of kiln), files this test writes (every dtype, padding,
 * holes, empty and scalar tensors, a sharded checkpoint), and one case per
 * way a file can be broken, each with the exact message it must give.
 */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_test.h"

/* ---- the shared models ------------------------------------------------------ */

/* One tensor of a shared model and values pinned from Python. */
typedef struct model_tensor {
    const char *name;      /* checkpoint name */
    kir_dtype dtype;       /* stored dtype */
    int ndim;              /* dims */
    int64_t shape[2];      /* dims as stored */
    float first[4];        /* the first 4 elements (for 1-D: the first 4) */
    float t_half[3];       /* 2-D [a, b] read transposed from row b/2: its first 3 values */
    float last_row[3];     /* first 3 values of the last stored row */
} model_tensor;

typedef struct model_case {
    const char *folder;    /* under models/ */
    size_t count;          /* tensors, __metadata__ excluded */
    double sum;            /* sum of every element of every tensor (Python, float64) */
    double abs_sum;        /* sum of |element| */
    model_tensor tensors[2]; /* pinned tensors */
} model_case;

static const model_case models[] = {
    {"tinystories-656k", 20, 2784.1562730669975, 255265.7866087556,
     {{"model.layers.0.self_attn.k_proj.weight", KIR_F32, 2, {64, 128},
       {-1.1328125f, -0.267578125f, -0.61328125f, -0.43359375f},
       {-0.130859375f, 0.064453125f, 0.1328125f},
       {0.3125f, -0.265625f, -0.0991210938f}},
      {"lm_head.weight", KIR_F32, 2, {2048, 128},
       {-0.68359375f, -0.0258789062f, 0.58984375f, -0.168945312f},
       {0.219726562f, 0.271484375f, -0.4921875f},
       {-0.2578125f, -0.275390625f, -0.2109375f}}}},
    {"llama-gqa-tiny", 30, 1794.601047497359, 43131.044839252834,
     {{"model.layers.2.mlp.down_proj.weight", KIR_BF16, 2, {256, 688},
       {0.00210571289f, 0.0177001953f, -0.014465332f, 0.0197753906f},
       {0.0255126953f, -0.00744628906f, 0.00482177734f},
       {-0.0385742188f, 0.00537109375f, -0.00543212891f}},
      {"model.norm.weight", KIR_BF16, 1, {256, 0}, {0.92578125f, 0.859375f, 0.8046875f, 1.0234375f}, {0}, {0}}}},
    {"qwen2-tiny", 26, 978.8416324257851, 15971.552736341953,
     {{"model.embed_tokens.weight", KIR_F16, 2, {800, 192},
       {0.00802612305f, 0.00434875488f, 0.0253295898f, -4.60147858e-05f},
       {0.0286407471f, 0.00227737427f, -0.00595855713f},
       {-0.00332641602f, -0.0379638672f, 0.0360107422f}},
      {"model.layers.1.self_attn.q_proj.bias", KIR_F16, 1, {192, 0},
       {0.0183868408f, 0.028503418f, 0.0189666748f, 0.071472168f}, {0}, {0}}}},
    {"gpt2-tiny", 28, 644.571364101474, 7282.223823427734,
     {{"transformer.h.0.attn.c_attn.weight", KIR_F32, 2, {128, 384},
       {0.0216006171f, 0.0368226282f, 0.0234110896f, 0.0129089626f},
       {0.00736494269f, -0.0128558148f, 0.00012602075f},
       {-0.021833811f, -0.0136149209f, -0.00271049514f}},
      {"transformer.wpe.weight", KIR_F32, 2, {256, 128},
       {-0.0142220622f, 0.014278451f, 0.0175335351f, -0.000557185442f},
       {-0.0285216477f, -0.024467783f, -0.0178701766f},
       {0.0250859763f, 0.0117766839f, 0.00224569696f}}}},
};

static size_t elements(const kf_tensor *t)
{
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    return n;
}

static void test_model(ct_run *r, const model_case *m)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/models/%s", r->shared, m->folder);
    sink_clear(&r->out);
    kf_checkpoint *c = kf_checkpoint_open(&r->out.d, path);
    CT_EXPECT_LOG(r, m->folder, "");
    CHECK(c != NULL);
    if (!c) return;
    CHECK(strcmp(kf_checkpoint_path(c), path) == 0);
    CHECK(kf_checkpoint_count(c) == m->count);
    CHECK(kf_checkpoint_find(c, "__metadata__") == NULL);

    /* Every tensor read whole, summed in file order (as Python did). */
    double sum = 0, abs_sum = 0;
    for (size_t i = 0; i < kf_checkpoint_count(c); i++) {
        const kf_tensor *t = kf_checkpoint_at(c, i);
        CHECK(kf_checkpoint_find(c, t->name) == t);
        float *v = malloc((elements(t) ? elements(t) : 1) * sizeof *v);
        CHECK(kf_tensor_read_f32(&r->out.d, t, 0, 0, -1, v) == 0);
        for (size_t k = 0; k < elements(t); k++) {
            sum += v[k];
            abs_sum += fabs(v[k]);
        }
        free(v);
    }
    CHECK_NEAR(sum, m->sum, 1e-9 * m->abs_sum);
    CHECK_NEAR(abs_sum, m->abs_sum, 1e-9 * m->abs_sum);

    for (int k = 0; k < 2; k++) {
        const model_tensor *mt = &m->tensors[k];
        const kf_tensor *t = kf_checkpoint_find(c, mt->name);
        CHECK(t != NULL);
        if (!t) continue;
        CHECK(t->dtype == mt->dtype);
        CHECK(t->ndim == mt->ndim);
        for (int i = 0; i < mt->ndim; i++) CHECK(t->shape[i] == mt->shape[i]);
        CHECK(strstr(t->file, "model.safetensors") != NULL);
        size_t n = elements(t);
        float *v = malloc(n * sizeof *v);
        CHECK(kf_tensor_read_f32(&r->out.d, t, 0, 0, -1, v) == 0);
        for (int i = 0; i < 4; i++) CHECK_NEAR(v[i], mt->first[i], 0);
        if (mt->ndim == 2) {
            int64_t a = mt->shape[0], b = mt->shape[1];
            /* Rows [b/2, b) of the transposed [b, a]: row 0 is stored column b/2. */
            CHECK(kf_tensor_read_f32(&r->out.d, t, 1, b / 2, b, v) == 0);
            for (int i = 0; i < 3; i++) CHECK_NEAR(v[i], mt->t_half[i], 0);
            CHECK(kf_tensor_read_f32(&r->out.d, t, 0, a - 1, -1, v) == 0);
            for (int i = 0; i < 3; i++) CHECK_NEAR(v[i], mt->last_row[i], 0);
            /* every element of the transposed tensor, and of a slice of it that starts and ends inside a tile */
            float *all = malloc(n * sizeof *all), *tr = malloc(n * sizeof *tr);
            CHECK(kf_tensor_read_f32(&r->out.d, t, 0, 0, -1, all) == 0);
            CHECK(kf_tensor_read_f32(&r->out.d, t, 1, 0, -1, tr) == 0);
            size_t wrong = 0;
            for (int64_t i = 0; i < a; i++)
                for (int64_t j = 0; j < b; j++) wrong += memcmp(&tr[j * a + i], &all[i * b + j], sizeof(float)) != 0;
            int64_t j0 = b / 3, j1 = b - b / 5;
            CHECK(kf_tensor_read_f32(&r->out.d, t, 1, j0, j1, tr) == 0);
            for (int64_t i = 0; i < a; i++)
                for (int64_t j = j0; j < j1; j++)
                    wrong += memcmp(&tr[(j - j0) * a + i], &all[i * b + j], sizeof(float)) != 0;
            CHECK(wrong == 0);
            free(all);
            free(tr);
        }
        free(v);
    }
    CT_EXPECT_LOG(r, m->folder, "");
    kf_checkpoint_close(c);
}

/* Whether models/<folder> is one of the quantized checkpoints (KILN_QUANTIZED,
 * set by tests/CMakeLists.txt), whose tensor dtypes kiln does not read yet. */
static int is_quantized(const char *folder)
{
    const char *list = getenv("KILN_QUANTIZED");
    size_t n = strlen(folder);
    for (const char *p = list ? list : ""; *p;) {
        const char *end = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len > n && p[len - n - 1] == '/' && strncmp(p + len - n, folder, n) == 0) return 1;
        p += len + (end ? 1 : 0);
    }
    return 0;
}

/* Every models/<folder>/model.safetensors opens and reads whole, also
 * those not pinned above; returns how many there were. */
static int test_every_model(ct_run *r)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/models", r->shared);
    DIR *dir = opendir(path);
    CHECK(dir != NULL);
    if (!dir) return 0;
    int found = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        ks_buf file = {0};
        ks_buf_printf(&file, "%s/models/%s/model.safetensors", r->shared, e->d_name);
        if (e->d_name[0] == '.' || !ks_file_exists(file.data) || is_quantized(e->d_name)) {
            ks_buf_free(&file);
            continue;
        }
        found++;
        sink_clear(&r->out);
        kf_checkpoint *c = kf_checkpoint_open(&r->out.d, file.data);
        CHECK(c != NULL && kf_checkpoint_count(c) > 0);
        for (size_t i = 0; c && i < kf_checkpoint_count(c); i++) {
            const kf_tensor *t = kf_checkpoint_at(c, i);
            if (t->dtype != KIR_F32 && t->dtype != KIR_F16 && t->dtype != KIR_BF16) { /* quantized codes: no float to read */
                CHECK(kf_tensor_read_f32(&r->out.d, t, 0, 0, -1, NULL) != 0);
                sink_clear(&r->out);
                continue;
            }
            float *v = malloc((elements(t) ? elements(t) : 1) * sizeof *v);
            CHECK(kf_tensor_read_f32(&r->out.d, t, 0, 0, -1, v) == 0);
            free(v);
        }
        CT_EXPECT_LOG(r, file.data, "");
        kf_checkpoint_close(c);
        ks_buf_free(&file);
    }
    closedir(dir);
    return found;
}

/* ---- files written here --------------------------------------------------- */

static void put_f32(uint8_t *p, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(u >> (8 * i));
}

static void put_u16(uint8_t *p, uint16_t u)
{
    p[0] = (uint8_t)u;
    p[1] = (uint8_t)(u >> 8);
}

/* Every dtype, __metadata__, a padded header, a hole, an empty and a
 * scalar tensor. */
static const char good_header[] =
    "{\"__metadata__\":{\"format\":\"pt\"},"
    "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
    "\"h\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[24,30]},"
    "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[30,34]},"
    "\"empty\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[34,34]},"
    "\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[36,40]}}      ";

static void good_data(uint8_t data[40])
{
    memset(data, 0xee, 40);
    for (int i = 0; i < 6; i++) put_f32(data + 4 * i, (float)(i + 1)); /* a = [[1,2,3],[4,5,6]] */
    put_u16(data + 24, 0x3c00);                                         /* h = 1 */
    put_u16(data + 26, 0xc000);                                         /*     -2 */
    put_u16(data + 28, 0x3555);                                         /*     0.333251953125 */
    put_u16(data + 30, 0x3f80);                                         /* b = 1 */
    put_u16(data + 32, 0x4049);                                         /*     3.140625 */
    put_f32(data + 36, 7.5f);                                           /* s = 7.5; 34..36 a hole */
}

static void expect_floats(ct_run *r, const float *got, const float *want, int n)
{
    for (int i = 0; i < n; i++) CHECK_NEAR(got[i], want[i], 0);
}

static void test_good_file(ct_run *r)
{
    uint8_t data[40];
    good_data(data);
    const char *path = ct_write_st(r, "good.safetensors", good_header, data, sizeof data);
    sink_clear(&r->out);
    kf_checkpoint *c = kf_checkpoint_open(&r->out.d, path);
    CHECK(c != NULL);
    if (!c) return;
    CHECK(kf_checkpoint_count(c) == 5);
    const char *order[] = {"a", "h", "b", "empty", "s"};
    for (size_t i = 0; i < 5; i++) CHECK(strcmp(kf_checkpoint_at(c, i)->name, order[i]) == 0);
    CHECK(kf_checkpoint_find(c, "zzz") == NULL);
    CHECK(kf_checkpoint_find(c, "__metadata__") == NULL);

    const kf_tensor *a = kf_checkpoint_find(c, "a");
    CHECK(a->dtype == KIR_F32 && a->ndim == 2 && a->shape[0] == 2 && a->shape[1] == 3);
    CHECK(a->nbytes == 24 && strcmp(a->file, path) == 0);
    float v[8];
    CHECK(kf_tensor_read_f32(&r->out.d, a, 0, 0, -1, v) == 0);
    expect_floats(r, v, (const float[]){1, 2, 3, 4, 5, 6}, 6);
    CHECK(kf_tensor_read_f32(&r->out.d, a, 1, 0, -1, v) == 0);
    expect_floats(r, v, (const float[]){1, 4, 2, 5, 3, 6}, 6);
    CHECK(kf_tensor_read_f32(&r->out.d, a, 1, 1, 3, v) == 0);
    expect_floats(r, v, (const float[]){2, 5, 3, 6}, 4);
    CHECK(kf_tensor_read_f32(&r->out.d, a, 0, 1, -1, v) == 0);
    expect_floats(r, v, (const float[]){4, 5, 6}, 3);
    CHECK(kf_tensor_read_f32(&r->out.d, a, 0, 1, 1, v) == 0); /* an empty slice */

    const kf_tensor *h = kf_checkpoint_find(c, "h");
    CHECK(h->dtype == KIR_F16 && h->ndim == 1 && h->shape[0] == 3 && h->nbytes == 6);
    CHECK(kf_tensor_read_f32(&r->out.d, h, 0, 0, -1, v) == 0);
    expect_floats(r, v, (const float[]){1, -2, 0.333251953125f}, 3);

    const kf_tensor *b = kf_checkpoint_find(c, "b");
    CHECK(b->dtype == KIR_BF16 && b->ndim == 1 && b->shape[0] == 2);
    CHECK(kf_tensor_read_f32(&r->out.d, b, 0, 0, -1, v) == 0);
    expect_floats(r, v, (const float[]){1, 3.140625f}, 2);

    const kf_tensor *e = kf_checkpoint_find(c, "empty");
    CHECK(e->ndim == 2 && e->shape[0] == 0 && e->shape[1] == 4 && e->nbytes == 0);
    CHECK(kf_tensor_read_f32(&r->out.d, e, 0, 0, -1, v) == 0);
    CHECK(kf_tensor_read_f32(&r->out.d, e, 1, 0, -1, v) == 0);

    const kf_tensor *s = kf_checkpoint_find(c, "s");
    CHECK(s->ndim == 0 && s->nbytes == 4);
    v[0] = 0;
    CHECK(kf_tensor_read_f32(&r->out.d, s, 0, 0, -1, v) == 0);
    CHECK_NEAR(v[0], 7.5, 0);
    CT_EXPECT_LOG(r, "good.safetensors", "");

    /* Reads the reader refuses. */
    struct {
        const char *tensor; /* which tensor */
        int transposed;     /* read transposed */
        int64_t start, end; /* rows */
        const char *want;   /* the message */
    } bad_reads[] = {
        {"h", 1, 0, -1, "$TMP/good.safetensors: error: tensor 'h': cannot be read transposed: it has 1 dims, not 2\n"},
        {"a", 0, 1, 3, "$TMP/good.safetensors: error: tensor 'a': rows [1, 3) are not within its 2 rows\n"},
        {"a", 1, 2, 4, "$TMP/good.safetensors: error: tensor 'a': rows [2, 4) are not within its 3 rows\n"},
        {"a", 0, -1, 1, "$TMP/good.safetensors: error: tensor 'a': rows [-1, 1) are not within its 2 rows\n"},
        {"a", 0, 2, 1, "$TMP/good.safetensors: error: tensor 'a': rows [2, 1) are not within its 2 rows\n"},
        {"s", 0, 0, 0, "$TMP/good.safetensors: error: tensor 's': a scalar has no rows to slice\n"},
    };
    for (size_t i = 0; i < sizeof bad_reads / sizeof *bad_reads; i++) {
        sink_clear(&r->out);
        int rc = kf_tensor_read_f32(&r->out.d, kf_checkpoint_find(c, bad_reads[i].tensor), bad_reads[i].transposed,
                                    bad_reads[i].start, bad_reads[i].end, v);
        CHECK(rc == -1 && r->out.d.errors == 1);
        CT_EXPECT_LOG(r, "bad read", bad_reads[i].want);
    }
    kf_checkpoint_close(c);

    /* The same file as a folder's model.safetensors. */
    const char *dir = ct_mkdir(r, "folder");
    ct_write_st(r, "folder/model.safetensors", good_header, data, sizeof data);
    sink_clear(&r->out);
    c = kf_checkpoint_open(&r->out.d, dir);
    CHECK(c != NULL && kf_checkpoint_count(c) == 5);
    if (c) CHECK(strstr(kf_checkpoint_find(c, "s")->file, "folder/model.safetensors") != NULL);
    CT_EXPECT_LOG(r, "folder", "");
    kf_checkpoint_close(c);
}

/* Two shards and an index; opened through the folder and the index itself. */
static void test_sharded(ct_run *r)
{
    uint8_t d1[16], d2[6];
    put_f32(d1, 1.5f); /* x = [1.5, -2.5] */
    put_f32(d1 + 4, -2.5f);
    put_u16(d1 + 8, 0x3f80); /* y = [[1, 2], [-1, 0.5]] in bf16 */
    put_u16(d1 + 10, 0x4000);
    put_u16(d1 + 12, 0xbf80);
    put_u16(d1 + 14, 0x3f00);
    put_u16(d2, 0x3c00); /* z = [1, 2, 0.5] in f16 */
    put_u16(d2 + 2, 0x4000);
    put_u16(d2 + 4, 0x3800);
    const char *dir = ct_mkdir(r, "sharded");
    ct_write_st(r, "sharded/model-00001-of-00002.safetensors",
                "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"y\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[8,16]}}",
                d1, sizeof d1);
    ct_write_st(r, "sharded/model-00002-of-00002.safetensors",
                "{\"__metadata__\":{},\"z\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]}}", d2, sizeof d2);
    const char *index_text = "{\"metadata\": {\"total_size\": 22}, \"weight_map\": {"
                             "\"x\": \"model-00001-of-00002.safetensors\", "
                             "\"z\": \"model-00002-of-00002.safetensors\", "
                             "\"y\": \"model-00001-of-00002.safetensors\"}}";
    const char *index = ct_write(r, "sharded/model.safetensors.index.json", index_text, strlen(index_text));

    for (int via_index = 0; via_index < 2; via_index++) {
        sink_clear(&r->out);
        kf_checkpoint *c = kf_checkpoint_open(&r->out.d, via_index ? index : dir);
        CT_EXPECT_LOG(r, "sharded", "");
        CHECK(c != NULL);
        if (!c) continue;
        CHECK(kf_checkpoint_count(c) == 3);
        const char *order[] = {"x", "y", "z"};
        for (size_t i = 0; i < 3; i++) CHECK(strcmp(kf_checkpoint_at(c, i)->name, order[i]) == 0);
        const kf_tensor *x = kf_checkpoint_find(c, "x"), *y = kf_checkpoint_find(c, "y"),
                        *z = kf_checkpoint_find(c, "z");
        CHECK(x && y && z);
        if (!x || !y || !z) continue;
        CHECK(strstr(x->file, "sharded/model-00001-of-00002.safetensors") != NULL);
        CHECK(y->file == x->file);
        CHECK(strstr(z->file, "sharded/model-00002-of-00002.safetensors") != NULL);
        float v[4];
        CHECK(kf_tensor_read_f32(&r->out.d, x, 0, 0, -1, v) == 0);
        expect_floats(r, v, (const float[]){1.5f, -2.5f}, 2);
        CHECK(kf_tensor_read_f32(&r->out.d, y, 1, 0, -1, v) == 0);
        expect_floats(r, v, (const float[]){1, -1, 2, 0.5f}, 4);
        CHECK(kf_tensor_read_f32(&r->out.d, z, 0, 1, 3, v) == 0);
        expect_floats(r, v, (const float[]){2, 0.5f}, 2);
        kf_checkpoint_close(c);
    }
}

/* ---- broken files ------------------------------------------------------------ */

/* A broken file made of a header text and `data_len` zero bytes of data. */
typedef struct bad_header {
    const char *file;   /* file name in the scratch folder */
    const char *header; /* header JSON */
    size_t data_len;    /* bytes of data section */
    const char *want;   /* the exact message */
} bad_header;

#define W4 "\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}"

static const bad_header bad_headers[] = {
    {"bad_json.safetensors", "{\"w\": {\"dtype\": \"F32\",", 0,
     "$TMP/bad_json.safetensors: error: header is not valid JSON (at byte 21 of the header)\n"},
    {"not_object.safetensors", "[1, 2]", 0,
     "$TMP/not_object.safetensors: error: header is not a JSON object\n"},
    {"trailing.safetensors", "{} x", 0,
     "$TMP/trailing.safetensors: error: header is not valid JSON (at byte 3 of the header)\n"},
    {"empty_header.safetensors", "", 0,
     "$TMP/empty_header.safetensors: error: header is not valid JSON (at byte 0 of the header)\n"},
    {"entry_not_object.safetensors", "{\"w\": 3}", 0,
     "$TMP/entry_not_object.safetensors: error: tensor 'w': header entry is not a JSON object\n"},
    {"no_dtype.safetensors", "{\"w\":{\"shape\":[4],\"data_offsets\":[0,16]}}", 16,
     "$TMP/no_dtype.safetensors: error: tensor 'w': missing \"dtype\"\n"},
    {"dtype_not_string.safetensors", "{\"w\":{\"dtype\":7,\"shape\":[4],\"data_offsets\":[0,16]}}", 16,
     "$TMP/dtype_not_string.safetensors: error: tensor 'w': \"dtype\" is not a string\n"},
    {"unknown_dtype.safetensors", "{\"w\":{\"dtype\":\"Q7\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16,
     "$TMP/unknown_dtype.safetensors: error: tensor 'w': unknown dtype \"Q7\"\n"},
    {"i64.safetensors",
     "{" W4 ",\"position_ids\":{\"dtype\":\"I64\",\"shape\":[1,2],\"data_offsets\":[16,32]}}", 32,
     "$TMP/i64.safetensors: error: tensor 'position_ids': dtype I64 is not supported (kiln reads F32, F16, "
     "BF16, I32, I8, U8 and F8_E4M3)\n"},
    {"f8.safetensors", "{\"w\":{\"dtype\":\"F8_E5M2\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4,
     "$TMP/f8.safetensors: error: tensor 'w': dtype F8_E5M2 is not supported (kiln reads F32, F16, BF16, I32, I8, "
     "U8 and F8_E4M3)\n"},
    {"no_shape.safetensors", "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,16]}}", 16,
     "$TMP/no_shape.safetensors: error: tensor 'w': missing \"shape\"\n"},
    {"shape_not_array.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,16]}}", 16,
     "$TMP/shape_not_array.safetensors: error: tensor 'w': \"shape\" is not an array\n"},
    {"five_dims.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,4],\"data_offsets\":[0,16]}}", 16,
     "$TMP/five_dims.safetensors: error: tensor 'w': shape has 5 dims; kiln handles at most 4\n"},
    {"negative_dim.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,-3],\"data_offsets\":[0,16]}}", 16,
     "$TMP/negative_dim.safetensors: error: tensor 'w': shape[1] is negative (-3)\n"},
    {"fractional_dim.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,16]}}", 16,
     "$TMP/fractional_dim.safetensors: error: tensor 'w': shape[0] is not an integer (2.5)\n"},
    {"string_dim.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[\"4\"],\"data_offsets\":[0,16]}}", 16,
     "$TMP/string_dim.safetensors: error: tensor 'w': shape[0] is not a number\n"},
    {"huge_dim.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,16]}}", 16,
     "$TMP/huge_dim.safetensors: error: tensor 'w': shape[0] is too large (1e+300)\n"},
    {"element_overflow.safetensors",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,16]}}", 16,
     "$TMP/element_overflow.safetensors: error: tensor 'w': shape [4294967296, 4294967296, 16] has too many "
     "elements\n"},
    {"byte_overflow.safetensors",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[4503599627370496,1025],\"data_offsets\":[0,16]}}", 16,
     "$TMP/byte_overflow.safetensors: error: tensor 'w': F32 [4503599627370496, 1025] has too many bytes\n"},
    {"no_offsets.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[4]}}", 16,
     "$TMP/no_offsets.safetensors: error: tensor 'w': missing \"data_offsets\"\n"},
    {"offsets_not_pair.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16]}}", 16,
     "$TMP/offsets_not_pair.safetensors: error: tensor 'w': \"data_offsets\" is not [begin, end]\n"},
    {"offsets_object.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":{\"a\":0,\"b\":16}}}",
     16, "$TMP/offsets_object.safetensors: error: tensor 'w': \"data_offsets\" is not [begin, end]\n"},
    {"offsets_negative.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 16,
     "$TMP/offsets_negative.safetensors: error: tensor 'w': data_offsets[0] is negative (-4)\n"},
    {"offsets_huge.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,1e20]}}", 16,
     "$TMP/offsets_huge.safetensors: error: tensor 'w': data_offsets[1] is too large (1e+20)\n"},
    {"offsets_reversed.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 16,
     "$TMP/offsets_reversed.safetensors: error: tensor 'w': data_offsets [8, 4] end before they begin\n"},
    {"truncated.safetensors", "{" W4 "}", 12,
     "$TMP/truncated.safetensors: error: tensor 'w': data_offsets [0, 16] run past the end of the data section "
     "(12 bytes; is the file truncated?)\n"},
    {"size_mismatch.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,12]}}", 16,
     "$TMP/size_mismatch.safetensors: error: tensor 'w': data_offsets [0, 12] hold 12 bytes, but F32 [4] needs "
     "16\n"},
    {"size_mismatch_bf16.safetensors", "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,16]}}", 16,
     "$TMP/size_mismatch_bf16.safetensors: error: tensor 'w': data_offsets [0, 16] hold 16 bytes, but BF16 [2, "
     "3] needs 12\n"},
    {"overlap.safetensors",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16,
     "$TMP/overlap.safetensors: error: tensor 'b': data_offsets [8, 16] overlap tensor 'a' at [0, 16]\n"},
    {"overlap_same.safetensors",
     "{\"b\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[4,8]},"
     "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
     "\"c\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8,
     "$TMP/overlap_same.safetensors: error: tensor 'a': data_offsets [4, 8] overlap tensor 'b' at [4, 8]\n"},
    {"duplicate.safetensors", "{" W4 "," W4 "}", 16,
     "$TMP/duplicate.safetensors: error: tensor 'w' appears twice in the header\n"},
};

static void test_bad_headers(ct_run *r)
{
    uint8_t zeros[64] = {0};
    for (size_t i = 0; i < sizeof bad_headers / sizeof *bad_headers; i++) {
        const bad_header *b = &bad_headers[i];
        const char *path = ct_write_st(r, b->file, b->header, zeros, b->data_len);
        sink_clear(&r->out);
        kf_checkpoint *c = kf_checkpoint_open(&r->out.d, path);
        CHECK(c == NULL && r->out.d.errors == 1);
        CT_EXPECT_LOG(r, b->file, b->want);
        kf_checkpoint_close(c);
    }
}

static void expect_open_fails(ct_run *r, const char *path, const char *want)
{
    sink_clear(&r->out);
    kf_checkpoint *c = kf_checkpoint_open(&r->out.d, path);
    CHECK(c == NULL && r->out.d.errors == 1);
    CT_EXPECT_LOG(r, path, want);
    kf_checkpoint_close(c);
}

/* Broken before the header: too short, absurd or overlong lengths. */
static void test_bad_prefix(ct_run *r)
{
    expect_open_fails(r, ct_write(r, "short.safetensors", "\x01\x02\x03\x04\x05", 5),
                      "$TMP/short.safetensors: error: file is 5 bytes, too short for the 8-byte header length\n");
    expect_open_fails(r, ct_write(r, "empty.safetensors", "", 0),
                      "$TMP/empty.safetensors: error: file is 0 bytes, too short for the 8-byte header length\n");
    expect_open_fails(r, ct_write(r, "huge_header.safetensors", "\x00\x00\x00\x00\x00\x01\x00\x00{}", 10),
                      "$TMP/huge_header.safetensors: error: header length 1099511627776 is over the "
                      "100000000-byte limit (is this a safetensors file?)\n");
    expect_open_fails(r, ct_write(r, "past_end.safetensors", "\x64\x00\x00\x00\x00\x00\x00\x00{}0123456789", 20),
                      "$TMP/past_end.safetensors: error: header length 100 runs past the end of the file (20 "
                      "bytes)\n");
    expect_open_fails(r, ct_write(r, "max_length.safetensors", "\xff\xff\xff\xff\xff\xff\xff\xff{}", 10),
                      "$TMP/max_length.safetensors: error: header length 18446744073709551615 is over the "
                      "100000000-byte limit (is this a safetensors file?)\n");
    char missing[200];
    snprintf(missing, sizeof missing, "%s/nope.safetensors", r->dir);
    expect_open_fails(r, missing, "$TMP/nope.safetensors: error: cannot open: No such file or directory\n");
    expect_open_fails(r, ct_mkdir(r, "empty_folder"),
                      "$TMP/empty_folder: error: no model.safetensors or model.safetensors.index.json in this "
                      "folder\n");
}

/* A folder `name` with shard files 1 and 2 (x in shard 1, z in shard 2,
 * unless shard2 says otherwise) and the given index text. */
static const char *make_sharded(ct_run *r, const char *name, const char *shard2_header, const char *index_text)
{
    char p[256];
    uint8_t zeros[16] = {0};
    const char *dir = ct_mkdir(r, name);
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", name);
    ct_write_st(r, p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", zeros, 8);
    if (shard2_header) {
        snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", name);
        ct_write_st(r, p, shard2_header, zeros, 8);
    }
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", name);
    ct_write(r, p, index_text, strlen(index_text));
    return dir;
}

#define SHARD1 "\"model-00001-of-00002.safetensors\""
#define SHARD2 "\"model-00002-of-00002.safetensors\""
#define Z_HEADER "{\"z\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}"

static void test_bad_index(ct_run *r)
{
    expect_open_fails(r,
                      make_sharded(r, "missing_shard", NULL,
                                   "{\"weight_map\": {\"x\": " SHARD1 ", \"z\": " SHARD2 "}}"),
                      "$TMP/missing_shard/model.safetensors.index.json: error: tensor 'z': shard "
                      "\"model-00002-of-00002.safetensors\" does not exist\n");
    expect_open_fails(r,
                      make_sharded(r, "absent_tensor", Z_HEADER,
                                   "{\"weight_map\": {\"x\": " SHARD1 ", \"q\": " SHARD1 ", \"z\": " SHARD2 "}}"),
                      "$TMP/absent_tensor/model.safetensors.index.json: error: tensor 'q': not in its shard "
                      "\"model-00001-of-00002.safetensors\"\n");
    expect_open_fails(r,
                      make_sharded(r, "wrong_shard", Z_HEADER,
                                   "{\"weight_map\": {\"x\": " SHARD2 ", \"z\": " SHARD2 ", \"q\": " SHARD1 "}}"),
                      "$TMP/wrong_shard/model.safetensors.index.json: error: tensor 'x': the index places it in "
                      "\"model-00002-of-00002.safetensors\", but it is in "
                      "$TMP/wrong_shard/model-00001-of-00002.safetensors\n");
    expect_open_fails(r,
                      make_sharded(r, "duplicate_across", "{\"x\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]}}",
                                   "{\"weight_map\": {\"x\": " SHARD1 ", \"y\": " SHARD2 "}}"),
                      "$TMP/duplicate_across/model-00002-of-00002.safetensors: error: tensor 'x' is also in "
                      "$TMP/duplicate_across/model-00001-of-00002.safetensors\n");
    expect_open_fails(r,
                      make_sharded(r, "broken_shard", "{\"z\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
                                   "{\"weight_map\": {\"x\": " SHARD1 ", \"z\": " SHARD2 "}}"),
                      "$TMP/broken_shard/model-00002-of-00002.safetensors: error: tensor 'z': data_offsets [0, 16] "
                      "run past the end of the data section (8 bytes; is the file truncated?)\n");
    expect_open_fails(r, make_sharded(r, "index_bad_json", Z_HEADER, "{\"weight_map\": {\"x\": "),
                      "$TMP/index_bad_json/model.safetensors.index.json: error: not valid JSON (at byte 20)\n");
    expect_open_fails(r, make_sharded(r, "index_not_object", Z_HEADER, "[\"weight_map\"]"),
                      "$TMP/index_not_object/model.safetensors.index.json: error: not a JSON object\n");
    expect_open_fails(r, make_sharded(r, "index_no_map", Z_HEADER, "{\"metadata\": {}}"),
                      "$TMP/index_no_map/model.safetensors.index.json: error: missing \"weight_map\"\n");
    expect_open_fails(r, make_sharded(r, "index_map_array", Z_HEADER, "{\"weight_map\": [" SHARD1 "]}"),
                      "$TMP/index_map_array/model.safetensors.index.json: error: \"weight_map\" is not a JSON "
                      "object\n");
    expect_open_fails(r, make_sharded(r, "index_shard_number", Z_HEADER, "{\"weight_map\": {\"x\": 1}}"),
                      "$TMP/index_shard_number/model.safetensors.index.json: error: tensor 'x': its shard is not a "
                      "string\n");
    expect_open_fails(r,
                      make_sharded(r, "index_escape", Z_HEADER,
                                   "{\"weight_map\": {\"x\": \"../good.safetensors\"}}"),
                      "$TMP/index_escape/model.safetensors.index.json: error: tensor 'x': shard "
                      "\"../good.safetensors\" is not a file name in the index's folder\n");
}

/* kf_tensor_read_view over a stacked [3 experts, 4, 5] f32 tensor (and the same bytes as a 2-D [12, 5] read in groups), v[e][i][j] = 100 e + 10 i + j: a 3-D .T
 * (each expert's matrix) with rows of dim 0 (experts 1 and 2), rows of dim 1 with a step, both with .T (gpt-oss's
 * interleaved gate and up), against the elements they must be; and a step of 0 refused. */
/* 8-bit codes (I8, U8): read as they are, with their bytes; not as floats (a weight cannot bind them) */
static void test_byte_dtypes(ct_run *r)
{
    static const char header[] = "{\"q\":{\"dtype\":\"I8\",\"shape\":[2,2],\"data_offsets\":[0,4]},"
                                 "\"z\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[4,7]}} ";
    const uint8_t data[8] = {0x81, 0x7f, 0x00, 0xff, 7, 8, 250, 0};
    const char *path = ct_write_st(r, "bytes.safetensors", header, data, sizeof data);
    sink_clear(&r->out);
    kf_checkpoint *c = kf_checkpoint_open(&r->out.d, path);
    CHECK(c != NULL);
    if (!c) return;
    const kf_tensor *q = kf_checkpoint_find(c, "q"), *z = kf_checkpoint_find(c, "z");
    CHECK(q && q->dtype == KIR_I8 && q->nbytes == 4 && (int8_t)q->data[0] == -127 && (int8_t)q->data[3] == -1);
    CHECK(z && z->dtype == KIR_U8 && z->nbytes == 3 && z->data[2] == 250);
    float v[4];
    CHECK(kf_tensor_read_f32(&r->out.d, q, 0, 0, -1, v) != 0);
    CT_EXPECT_LOG(r, "I8 as f32", "$TMP/bytes.safetensors: error: tensor 'q': dtype i8 cannot be read as f32\n");
    kf_checkpoint_close(c);
}

static void test_views(ct_run *r)
{
    float v[3][4][5], out[60];
    for (int e = 0; e < 3; e++)
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 5; j++) v[e][i][j] = (float)(100 * e + 10 * i + j);
    kf_tensor t = {"stacked", KIR_F32, 3, {3, 4, 5}, (const uint8_t *)v, sizeof v, "view-test", 0, NULL};
    size_t wrong = 0;
    kf_tensor_view tr_experts = {1, 0, 1, 3, 1, 0, 0}; /* .T[1 : 3]: [2, 5, 4] */
    CHECK(kf_tensor_read_view(&r->out.d, &t, &tr_experts, out) == 0);
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 5; j++)
            for (int i = 0; i < 4; i++) wrong += out[(k * 5 + j) * 4 + i] != v[1 + k][i][j];
    kf_tensor_view odd_rows = {0, 1, 1, 4, 2, 0, 0}; /* [:, 1 : 4 : 2]: [3, 2, 5] */
    CHECK(kf_tensor_read_view(&r->out.d, &t, &odd_rows, out) == 0);
    for (int e = 0; e < 3; e++)
        for (int k = 0; k < 2; k++)
            for (int j = 0; j < 5; j++) wrong += out[(e * 2 + k) * 5 + j] != v[e][1 + 2 * k][j];
    kf_tensor_view tr_even = {1, 1, 0, 5, 2, 0, 0}; /* .T[:, 0 : 5 : 2]: [3, 3, 4] */
    CHECK(kf_tensor_read_view(&r->out.d, &t, &tr_even, out) == 0);
    for (int e = 0; e < 3; e++)
        for (int k = 0; k < 3; k++)
            for (int i = 0; i < 4; i++) wrong += out[(e * 3 + k) * 4 + i] != v[e][i][2 * k];
    /* rows of dim 1, then each expert's matrix transposed ([:, 1 : 3].T: [3, 5, 2]) */
    kf_tensor_view rows_tr = {0, 1, 1, 3, 1, 0, 1};
    CHECK(kf_tensor_read_view(&r->out.d, &t, &rows_tr, out) == 0);
    for (int e = 0; e < 3; e++)
        for (int j = 0; j < 5; j++)
            for (int k = 0; k < 2; k++) wrong += out[(e * 5 + j) * 2 + k] != v[e][1 + k][j];
    /* the same tensor stored 2-D [12, 5] (DeepSeek's kv_b_proj), read as 3 groups of 4 rows: [:, 0 : 2].T
     * ([3, 5, 2]) and [:, 2 : 4] ([3, 2, 5]) */
    kf_tensor flat = {"flat", KIR_F32, 2, {12, 5}, (const uint8_t *)v, sizeof v, "view-test", 0, NULL};
    kf_tensor_view key = {0, 1, 0, 2, 1, 3, 1}, value = {0, 1, 2, 4, 1, 3, 0};
    CHECK(kf_tensor_read_view(&r->out.d, &flat, &key, out) == 0);
    for (int e = 0; e < 3; e++)
        for (int j = 0; j < 5; j++)
            for (int k = 0; k < 2; k++) wrong += out[(e * 5 + j) * 2 + k] != v[e][k][j];
    CHECK(kf_tensor_read_view(&r->out.d, &flat, &value, out) == 0);
    for (int e = 0; e < 3; e++)
        for (int k = 0; k < 2; k++)
            for (int j = 0; j < 5; j++) wrong += out[(e * 2 + k) * 5 + j] != v[e][2 + k][j];
    CHECK_MSG(wrong == 0, "%zu elements of the views wrong", wrong);
    kf_tensor_view bad_groups = {0, 1, 0, 2, 1, 5, 0};
    sink_clear(&r->out);
    CHECK(kf_tensor_read_view(&r->out.d, &flat, &bad_groups, out) == -1 && r->out.d.errors == 1);
    CT_EXPECT_LOG(r, "view-test", "view-test: error: tensor 'flat': cannot be read as 5 groups of its rows\n");
    kf_tensor_view no_step = {0, 1, 0, 4, 0, 0, 0};
    sink_clear(&r->out);
    CHECK(kf_tensor_read_view(&r->out.d, &t, &no_step, out) == -1 && r->out.d.errors == 1);
    CT_EXPECT_LOG(r, "view-test", "view-test: error: tensor 'stacked': a row step of 0\n");
}

int main(void)
{
    ct_run r;
    ct_init(&r);
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) test_model(&r, &models[i]);
    CHECK(test_every_model(&r) >= (int)(sizeof models / sizeof *models));
    test_good_file(&r);
    test_sharded(&r);
    test_bad_prefix(&r);
    test_bad_headers(&r);
    test_bad_index(&r);
    test_views(&r);
    test_byte_dtypes(&r);
    ct_cleanup(&r);
    return check_finish("test_safetensors");
}
