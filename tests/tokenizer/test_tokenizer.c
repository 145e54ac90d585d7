/*
 * test_tokenizer.c — the tokenizers (runtime/tokenizer*.c):
 *  - every case of every tokenizer_golden.json under KILN_SHARED (found by
 *    walking the folder) encodes to its ids, with and without special
 *    tokens, and decodes (at once and streamed) to its text;
 *  - two small tokenizer.json files written here, one byte-level and one
 *    SentencePiece-style, with ids and texts from Hugging Face `tokenizers`
 *    0.23.3 (added tokens with lstrip/rstrip, byte fallback, fused unk,
 *    Metaspace prepend "first", templates);
 *  - llama2.c's tok512.bin: ids from run.c's encode for a few prompts, the
 *    expected_greedy texts round-trip, run.c's decode rules;
 *  - streaming: a character split across byte-fallback tokens comes out
 *    whole, when its last byte arrives;
 *  - a megabyte of text (tests/tokenizer/long_inputs.h, also one
 *    megabyte-long word) encodes to ids in the vocabulary, and back where
 *    the tokenizer is lossless (bench/tokenizer_speed times it);
 *  - the exact error messages for broken files.
 */
#include "runtime/text/tokenizer.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/check.h"
#include "tests/tokenizer/long_inputs.h"

static const char *shared_dir(void)
{
    static char buf[4096];
    const char *s = getenv("KILN_SHARED");
    if (s && *s) return s;
    const char *src = getenv("KILN_SOURCE");
    snprintf(buf, sizeof buf, "%s/../shared", src && *src ? src : ".");
    return buf;
}

static char *shared_path(const char *rel)
{
    return ks_path_join(shared_dir(), rel);
}

/* ---- helpers ------------------------------------------------------------------ */

static void clear(ks_buf *b)
{
    b->len = 0;
    if (b->data) b->data[0] = 0;
}

static int ids_equal(const krt_tok_ids *got, const int32_t *want, size_t n)
{
    if (got->len != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (got->ids[i] != want[i]) return 0;
    return 1;
}

static void print_ids(const char *what, const int32_t *ids, size_t n)
{
    fprintf(stderr, "  %s:", what);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", (int)ids[i]);
    fprintf(stderr, "\n");
}

/* Encode text and compare with want[0..n); say what differs. */
static void check_encode(const krt_tok *t, const char *text, int flags, const int32_t *want,
                         size_t n, const char *where)
{
    krt_tok_ids ids = {0};
    ks_diag d = {0};
    int rc = krt_tok_encode(t, text, strlen(text), flags, &ids, &d);
    if (!CHECK_MSG(rc == 0 && ids_equal(&ids, want, n), "%s: encode(\"%s\", flags %d) differs", where, text, flags)) {
        print_ids("got ", ids.ids, ids.len);
        print_ids("want", want, n);
    }
    krt_tok_ids_free(&ids);
}

static void check_decode(const krt_tok *t, const int32_t *ids, size_t n, int flags,
                         const char *want, const char *where)
{
    ks_buf out = {0};
    krt_tok_decode(t, ids, n, flags, &out);
    CHECK_TEXT(where, ks_buf_cstr(&out), want);
    ks_buf_free(&out);
}

/* Stream ids one at a time: every chunk must be whole UTF-8 characters and
 * the chunks together the expected text. */
static void check_stream(const krt_tok *t, const int32_t *ids, size_t n, int flags,
                         const char *want, const char *where)
{
    krt_tok_stream *s = krt_tok_stream_new(t, flags);
    ks_buf all = {0};
    for (size_t i = 0; i < n; i++) {
        ks_buf chunk = {0};
        krt_tok_stream_push(s, ids[i], &chunk);
        /* whole characters only: valid UTF-8, no replacement character at the end */
        int whole = 1;
        for (size_t k = 0; k < chunk.len;) {
            unsigned char c = (unsigned char)chunk.data[k];
            size_t l = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
            if (l == 0 || k + l > chunk.len) {
                whole = 0;
                break;
            }
            k += l;
        }
        CHECK_MSG(whole, "%s: stream chunk %zu is not whole UTF-8", where, i);
        if (chunk.len) ks_buf_put(&all, chunk.data, chunk.len);
        ks_buf_free(&chunk);
    }
    krt_tok_stream_flush(s, &all);
    krt_tok_stream_free(s);
    CHECK_TEXT(where, ks_buf_cstr(&all), want);
    ks_buf_free(&all);
}

static int32_t *json_ids(const cJSON *arr, size_t *n)
{
    *n = (size_t)cJSON_GetArraySize(arr);
    int32_t *ids = ks_xmalloc((*n + 1) * sizeof *ids);
    size_t i = 0;
    for (const cJSON *e = arr ? arr->child : NULL; e; e = e->next) ids[i++] = (int32_t)e->valuedouble;
    return ids;
}

/* ---- golden files ----------------------------------------------------------------- */

typedef struct golden_stats {
    int files; /* tokenizer_golden.json files checked */
    int cases; /* cases checked */
} golden_stats;

static void check_golden_file(const char *dir, golden_stats *st)
{
    char *gpath = ks_path_join(dir, "tokenizer_golden.json");
    char *tpath = ks_path_join(dir, "tokenizer.json");
    ks_diag d = {0};
    size_t len;
    char *text = ks_read_file(&d, gpath, &len);
    krt_tok *t = krt_tok_load_file(&d, tpath, KRT_TOK_AUTO);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    CHECK(t != NULL);
    CHECK(root != NULL);
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(root, "cases");
    CHECK(cJSON_IsArray(cases));
    if (t && cases) {
        st->files++;
        int i = 0;
        for (const cJSON *c = cases->child; c; c = c->next, i++) {
            const char *s = cJSON_GetObjectItemCaseSensitive(c, "text")->valuestring;
            const char *decoded = cJSON_GetObjectItemCaseSensitive(c, "decoded")->valuestring;
            char where[4200];
            snprintf(where, sizeof where, "%s case %d", gpath, i);
            size_t n;
            int32_t *ids = json_ids(cJSON_GetObjectItemCaseSensitive(c, "ids"), &n);
            check_encode(t, s, 0, ids, n, where);
            check_decode(t, ids, n, 0, decoded, where);
            check_stream(t, ids, n, 0, decoded, where);
            const cJSON *with = cJSON_GetObjectItemCaseSensitive(c, "ids_with_special");
            if (with) {
                size_t m;
                int32_t *sp = json_ids(with, &m);
                check_encode(t, s, KRT_TOK_ADD_SPECIAL, sp, m, where);
                free(sp);
            }
            free(ids);
            st->cases++;
        }
    }
    cJSON_Delete(root);
    free(text);
    krt_tok_free(t);
    free(gpath);
    free(tpath);
}

static void walk_for_goldens(const char *dir, int depth, golden_stats *st)
{
    if (depth > 6) return;
    DIR *dd = opendir(dir);
    if (!dd) return;
    struct dirent *e;
    char **subs = NULL;
    size_t n = 0, cap = 0;
    while ((e = readdir(dd))) {
        if (e->d_name[0] == '.') continue;
        char *p = ks_path_join(dir, e->d_name);
        if (strcmp(e->d_name, "tokenizer_golden.json") == 0) check_golden_file(dir, st);
        if (ks_is_dir(p)) {
            KS_GROW(subs, n + 1, cap, 1 << 20, "folders");
            subs[n++] = p;
        } else {
            free(p);
        }
    }
    closedir(dd);
    for (size_t i = 0; i < n; i++) {
        walk_for_goldens(subs[i], depth + 1, st);
        free(subs[i]);
    }
    free(subs);
}

static void test_goldens(void)
{
    golden_stats st = {0, 0};
    walk_for_goldens(shared_dir(), 0, &st);
    /* shared/ holds three today (GPT-2, Llama-3, TinyStories); more are welcome. */
    CHECK(st.files >= 3);
    CHECK(st.cases >= 40);
    printf("tokenizer: %d golden files, %d cases\n", st.files, st.cases);
}

/* ---- small tokenizers written here --------------------------------------------------- */

/* Byte-level BPE, merges as pairs, an lstrip+rstrip special token, a BOS template. */
static const char byte_level_json[] =
    "{\"version\":\"1.0\",\"added_tokens\":["
    "{\"id\":7,\"content\":\"<|eot|>\",\"single_word\":false,\"lstrip\":true,\"rstrip\":true,"
    "\"normalized\":false,\"special\":true},"
    "{\"id\":8,\"content\":\"<s>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
    "\"normalized\":false,\"special\":true}],"
    "\"normalizer\":null,"
    "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true},"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\","
    "\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"pair\":[],\"special_tokens\":"
    "{\"<s>\":{\"id\":\"<s>\",\"ids\":[8],\"tokens\":[\"<s>\"]}}},"
    "\"decoder\":{\"type\":\"ByteLevel\"},"
    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"\xC4\xA0\":2,\"ab\":3,\"\xC4\xA0" "ab\":4,"
    "\"c\":5,\"abc\":6},\"merges\":[[\"a\",\"b\"],[\"\xC4\xA0\",\"ab\"],[\"ab\",\"c\"]]}}";

/* SentencePiece-style: Metaspace (prepend "first"), "a b" merges, byte
 * fallback with three byte tokens, fused unk, Strip decoder. */
static const char spm_json[] =
    "{\"version\":\"1.0\",\"added_tokens\":["
    "{\"id\":0,\"content\":\"<unk>\",\"normalized\":false,\"special\":true},"
    "{\"id\":1,\"content\":\"<s>\",\"normalized\":false,\"special\":true},"
    "{\"id\":2,\"content\":\"</s>\",\"normalized\":false,\"special\":true}],"
    "\"normalizer\":null,"
    "\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\xE2\x96\x81\",\"prepend_scheme\":\"first\","
    "\"split\":false},"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\","
    "\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"pair\":[],\"special_tokens\":"
    "{\"<s>\":{\"id\":\"<s>\",\"ids\":[1],\"tokens\":[\"<s>\"]}}},"
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\xE2\x96\x81\"},"
    "\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \","
    "\"start\":1,\"stop\":0}]},"
    "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"byte_fallback\":true,"
    "\"vocab\":{\"<unk>\":0,\"<s>\":1,\"</s>\":2,\"<0xE4>\":3,\"<0xB8>\":4,\"<0xAD>\":5,\"\xE2\x96\x81\":6,"
    "\"h\":7,\"i\":8,\"hi\":9,\"\xE2\x96\x81hi\":10,\"x\":11,\"\xE2\x96\x81x\":12},"
    "\"merges\":[\"h i\",\"\xE2\x96\x81 hi\"]}}";

static void test_small_tokenizers(void)
{
    ks_diag d = {0};
    krt_tok *t = krt_tok_load_memory(&d, "byte_level.json", byte_level_json, strlen(byte_level_json),
                                     KRT_TOK_AUTO);
    CHECK(t != NULL);
    if (t) {
        CHECK(krt_tok_kind_of(t) == KRT_TOK_HF_JSON);
        CHECK(krt_tok_vocab_size(t) == 9);
        CHECK(krt_tok_bos(t) == 8);
        CHECK(krt_tok_is_special(t, 7) && !krt_tok_is_special(t, 3));
        CHECK(krt_tok_lookup(t, "<|eot|>", 7) == 7 && krt_tok_lookup(t, "abc", 3) == 6);
        size_t len;
        const char *p = krt_tok_piece(t, 4, &len);
        CHECK(p && len == 4 && memcmp(p, "\xC4\xA0" "ab", 4) == 0);
        CHECK(krt_tok_piece(t, 99, &len) == NULL && len == 0);
        /* Hugging Face tokenizers 0.23.3 gives these. */
        check_encode(t, "ab abc<|eot|> ab", KRT_TOK_ADD_SPECIAL, (int32_t[]){8, 3, 4, 5, 7, 3}, 6,
                     "byte_level");
        check_encode(t, "ab abc<|eot|> ab", 0, (int32_t[]){3, 4, 5, 7, 3}, 5, "byte_level");
        check_encode(t, "abc", KRT_TOK_ADD_SPECIAL, (int32_t[]){8, 6}, 2, "byte_level");
        check_encode(t, " ab  <|eot|>", KRT_TOK_ADD_SPECIAL, (int32_t[]){8, 4, 7}, 3, "byte_level");
        check_encode(t, "ab<s>ab", KRT_TOK_ADD_SPECIAL, (int32_t[]){8, 3, 8, 3}, 4, "byte_level");
        check_decode(t, (int32_t[]){8, 3, 4, 5, 7, 3}, 6, 0, "<s>ab abc<|eot|>ab", "byte_level");
        check_decode(t, (int32_t[]){8, 3, 4, 5, 7, 3}, 6, KRT_TOK_SKIP_SPECIAL, "ab abcab", "byte_level");
        check_decode(t, (int32_t[]){8, 4, 7}, 3, 0, "<s> ab<|eot|>", "byte_level");
        /* Ids without an entry are skipped. */
        check_decode(t, (int32_t[]){-1, 3, 99}, 3, 0, "ab", "byte_level");
        krt_tok_free(t);
    }
    t = krt_tok_load_memory(&d, "spm.json", spm_json, strlen(spm_json), KRT_TOK_HF_JSON);
    CHECK(t != NULL);
    if (t) {
        CHECK(krt_tok_bos(t) == 1 && krt_tok_eos(t) == 2); /* EOS by its name, </s> */
        check_encode(t, "hi \xE4\xB8\xAD \xC3\xA9\xC3\xA9 x", KRT_TOK_ADD_SPECIAL,
                     (int32_t[]){1, 10, 6, 3, 4, 5, 6, 0, 6, 11}, 10, "spm");
        check_encode(t, "x", KRT_TOK_ADD_SPECIAL, (int32_t[]){1, 6, 11}, 3, "spm");
        /* After <s> the text is not at the start: no "▁" in front of "hi". */
        check_encode(t, "<s>hi</s> hi", KRT_TOK_ADD_SPECIAL, (int32_t[]){1, 1, 9, 2, 10}, 5, "spm");
        check_encode(t, "", KRT_TOK_ADD_SPECIAL, (int32_t[]){1}, 1, "spm");
        check_encode(t, "", 0, NULL, 0, "spm");
        check_decode(t, (int32_t[]){1, 10, 6, 3, 4, 5, 6, 0, 6, 11}, 10, 0,
                     "<s> hi \xE4\xB8\xAD <unk> x", "spm");
        check_decode(t, (int32_t[]){1, 10, 6, 3, 4, 5, 6, 0, 6, 11}, 10, KRT_TOK_SKIP_SPECIAL,
                     "hi \xE4\xB8\xAD  x", "spm");
        check_decode(t, (int32_t[]){1, 1, 9, 2, 10}, 5, 0, "<s><s>hi</s> hi", "spm");
        /* A run of byte tokens that is not UTF-8: one U+FFFD per byte (HF's ByteFallback). */
        check_decode(t, (int32_t[]){9, 3, 4, 9}, 4, 0, "hi\xEF\xBF\xBD\xEF\xBF\xBDhi", "spm");
        /* Streaming: 中 is three byte-fallback tokens and comes out whole. */
        krt_tok_stream *s = krt_tok_stream_new(t, KRT_TOK_SKIP_SPECIAL);
        ks_buf out = {0};
        const int32_t ids[] = {1, 10, 6, 3, 4, 5, 6, 11};
        const char *chunks[] = {"", "hi", " ", "", "", "\xE4\xB8\xAD", " ", "x"};
        for (size_t i = 0; i < 8; i++) {
            clear(&out);
            krt_tok_stream_push(s, ids[i], &out);
            CHECK_STR(ks_buf_cstr(&out), chunks[i]);
        }
        clear(&out);
        CHECK(krt_tok_stream_flush(s, &out) == 0);
        /* An unfinished character at the end comes out as U+FFFD on flush. */
        krt_tok_stream_push(s, 9, &out);
        krt_tok_stream_push(s, 3, &out);
        CHECK_STR(ks_buf_cstr(&out), "hi");
        krt_tok_stream_flush(s, &out);
        CHECK_STR(ks_buf_cstr(&out), "hi\xEF\xBF\xBD");
        krt_tok_stream_free(s);
        ks_buf_free(&out);
        krt_tok_free(t);
    }
    CHECK(d.errors == 0);
}

/* ---- llama2.c ------------------------------------------------------------------------ */

static void test_llama2c(void)
{
    char *path = shared_path("models/stories260k/tok512.bin");
    ks_diag d = {0};
    krt_tok *t = krt_tok_load_file(&d, path, KRT_TOK_AUTO);
    CHECK(t != NULL);
    free(path);
    if (!t) return;
    CHECK(krt_tok_kind_of(t) == KRT_TOK_LLAMA2C_BIN);
    CHECK(krt_tok_vocab_size(t) == 512);
    CHECK(krt_tok_bos(t) == 1 && krt_tok_eos(t) == 2);
    /* What llama2.c's run.c encode gives (bos=1, eos=0). */
    check_encode(t, "Zoo", KRT_TOK_ADD_SPECIAL, (int32_t[]){1, 410, 469, 347}, 4, "tok512");
    check_encode(t, "Once upon a time", KRT_TOK_ADD_SPECIAL, (int32_t[]){1, 403, 407, 261, 378}, 5,
                 "tok512");
    check_encode(t, "Hello, world!", KRT_TOK_ADD_SPECIAL,
                 (int32_t[]){1, 346, 306, 414, 432, 263, 304, 341, 443}, 9, "tok512");
    check_encode(t, "\xE4\xB8\xAD\xE6\x96\x87", KRT_TOK_ADD_SPECIAL,
                 (int32_t[]){1, 410, 231, 187, 176, 233, 153, 138}, 8, "tok512");
    check_encode(t, "trailing ", KRT_TOK_ADD_SPECIAL, (int32_t[]){1, 259, 420, 412, 290, 299, 410}, 7,
                 "tok512");
    check_encode(t, "", KRT_TOK_ADD_SPECIAL, (int32_t[]){1}, 1, "tok512");
    check_encode(t, "Zoo", KRT_TOK_ADD_SPECIAL | KRT_TOK_ADD_EOS, (int32_t[]){1, 410, 469, 347, 2}, 5,
                 "tok512");
    check_encode(t, "Zoo", 0, (int32_t[]){410, 469, 347}, 3, "tok512");
    /* run.c's decode: no leading space right after BOS, <0xNN> is a raw byte. */
    check_decode(t, (int32_t[]){1, 410, 469, 347}, 4, KRT_TOK_SKIP_SPECIAL, "Zoo", "tok512");
    check_decode(t, (int32_t[]){1, 410, 469, 347}, 4, 0, "\n<s>\nZoo", "tok512");
    check_decode(t, (int32_t[]){410, 469, 347}, 3, 0, " Zoo", "tok512");
    check_decode(t, (int32_t[]){1, 410, 231, 187, 176, 233, 153, 138}, 8, KRT_TOK_SKIP_SPECIAL,
                 "\xE4\xB8\xAD\xE6\x96\x87", "tok512");
    /* run.c's printed output: encoding it (run.c gives 62 and 258 tokens) and
     * decoding the ids gives it back. */
    const char *files[] = {"models/stories260k/expected_greedy_Zoo_60.txt",
                           "models/stories260k/expected_greedy_bos_256.txt"};
    const size_t want_tokens[] = {62, 258};
    for (int f = 0; f < 2; f++) {
        char *p = shared_path(files[f]);
        size_t len;
        char *text = ks_read_file(&d, p, &len);
        CHECK(text != NULL);
        if (text) {
            krt_tok_ids ids = {0};
            CHECK(krt_tok_encode(t, text, len, KRT_TOK_ADD_SPECIAL, &ids, &d) == 0);
            CHECK(ids.len == want_tokens[f]);
            check_decode(t, ids.ids, ids.len, KRT_TOK_SKIP_SPECIAL, text, files[f]);
            check_stream(t, ids.ids, ids.len, KRT_TOK_SKIP_SPECIAL, text, files[f]);
            krt_tok_ids_free(&ids);
        }
        free(text);
        free(p);
    }
    /* Streaming: 中 and 文 are three byte-fallback tokens each. */
    krt_tok_stream *s = krt_tok_stream_new(t, KRT_TOK_SKIP_SPECIAL);
    const int32_t ids[] = {1, 410, 231, 187, 176, 233, 153, 138};
    const char *chunks[] = {"", "", "", "", "\xE4\xB8\xAD", "", "", "\xE6\x96\x87"};
    ks_buf out = {0};
    for (size_t i = 0; i < 8; i++) {
        clear(&out);
        krt_tok_stream_push(s, ids[i], &out);
        CHECK_STR(ks_buf_cstr(&out), chunks[i]);
    }
    krt_tok_stream_free(s);
    ks_buf_free(&out);
    krt_tok_free(t);
}

/* ---- long inputs ------------------------------------------------------------------------ */

/* Encode a megabyte: every id in the vocabulary; lossless tokenizers decode it back.
 * (bench/tokenizer_speed times the same inputs; a test asserts no speed.) */
static void encode_long(const krt_tok *t, const char *name, const ks_buf *text, int roundtrip)
{
    krt_tok_ids ids = {0};
    ks_diag d = {0};
    int rc = krt_tok_encode(t, text->data, text->len, 0, &ids, &d);
    printf("tokenizer: %s: %zu bytes -> %zu tokens\n", name, text->len, ids.len);
    CHECK(rc == 0);
    CHECK(ids.len > 0);
    int32_t vocab = krt_tok_vocab_size(t);
    size_t bad = 0;
    while (bad < ids.len && ids.ids[bad] >= 0 && ids.ids[bad] < vocab) bad++;
    CHECK_MSG(bad == ids.len, "%s: id %d at %zu is outside the vocabulary of %d", name,
              bad < ids.len ? ids.ids[bad] : 0, bad, vocab);
    if (roundtrip) {
        ks_buf out = {0};
        krt_tok_decode(t, ids.ids, ids.len, 0, &out);
        CHECK(out.len == text->len && memcmp(out.data, text->data, text->len) == 0);
        ks_buf_free(&out);
    }
    krt_tok_ids_free(&ids);
}

static void test_long_inputs(void)
{
    tok_long_input in[TOK_LONG_INPUTS];
    tok_long_inputs(in);
    for (int i = 0; i < TOK_LONG_TOKENIZERS; i++) {
        char *p = shared_path(tok_long_tokenizers[i]);
        ks_diag d = {0};
        krt_tok *t = krt_tok_load_file(&d, p, KRT_TOK_AUTO);
        CHECK(t != NULL);
        for (int k = 0; t && k < TOK_LONG_INPUTS; k++) {
            char label[256];
            snprintf(label, sizeof label, "%s (%s)", tok_long_tokenizers[i], in[k].name);
            encode_long(t, label, &in[k].text, tok_long_lossless(i, k));
        }
        krt_tok_free(t);
        free(p);
    }
    for (int k = 0; k < TOK_LONG_INPUTS; k++) ks_buf_free(&in[k].text);
}

/* ---- errors ----------------------------------------------------------------------------- */

static void check_load_error(const char *name, const char *data, size_t len, krt_tok_kind kind,
                             const char *want)
{
    ks_buf log = {0};
    ks_diag d = {0};
    d.log = &log;
    d.quiet = 1;
    krt_tok *t = krt_tok_load_memory(&d, name, data, len, kind);
    CHECK(t == NULL);
    CHECK(d.errors == 1);
    CHECK_STR(ks_buf_cstr(&log), want);
    krt_tok_free(t);
    ks_buf_free(&log);
}

#define LOAD_ERROR(name, text, kind, want) check_load_error(name, text, sizeof text - 1, kind, want)

static void test_errors(void)
{
    ks_buf log = {0};
    ks_diag d = {0};
    d.log = &log;
    d.quiet = 1;
    CHECK(krt_tok_load_file(&d, "/nonexistent/tokenizer.json", KRT_TOK_AUTO) == NULL);
    CHECK_STR(ks_buf_cstr(&log), "/nonexistent/tokenizer.json: error: cannot read: No such file or directory\n");
    ks_buf_free(&log);

    LOAD_ERROR("bad.json", "{\n  \"model\": [1,\n}\n", KRT_TOK_AUTO,
               "bad.json:3:1: error: invalid JSON\n  }\n  ^\n");
    LOAD_ERROR("trail.json", "{\"model\": {}} x", KRT_TOK_HF_JSON,
               "trail.json:1:15: error: unexpected text after the JSON value\n  {\"model\": {}} x\n                ^\n");
    LOAD_ERROR("top.json", "[1, 2]", KRT_TOK_HF_JSON,
               "top.json: error: expected a JSON object at the top (a tokenizer.json)\n");
    LOAD_ERROR("nomodel.json", "{\"version\": \"1.0\"}", KRT_TOK_HF_JSON,
               "nomodel.json: error: no \"model\": not a tokenizer.json\n");
    LOAD_ERROR("uni.json", "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", KRT_TOK_HF_JSON,
               "uni.json: error: model.type: unsupported model 'Unigram' (kiln reads BPE)\n");
    LOAD_ERROR("m.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\", \"a c\"]}}",
               KRT_TOK_HF_JSON, "m.json: error: model.merges[0]: the merged token 'ab' is not in the vocabulary\n");
    LOAD_ERROR("m2.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [[\"a\", \"c\"]]}}",
               KRT_TOK_HF_JSON, "m2.json: error: model.merges[0]: 'c' is not in the vocabulary\n");
    LOAD_ERROR("m3.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a  a\"]}}",
               KRT_TOK_HF_JSON,
               "m3.json: error: model.merges[0]: expected two tokens separated by one space, got 'a  a'\n");
    LOAD_ERROR("id.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -3}, \"merges\": []}}",
               KRT_TOK_HF_JSON, "id.json: error: model.vocab.a: -3 is out of range (0 to 8388607)\n");
    LOAD_ERROR("nfc.json", "{\"normalizer\": {\"type\": \"NFC\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
               KRT_TOK_HF_JSON,
               "nfc.json: error: normalizer.type: unsupported normalizer 'NFC' (kiln reads Sequence, "
               "Prepend, Replace, Strip, ByteLevel)\n");
    LOAD_ERROR("re.json", "{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
               "\"pattern\": {\"Regex\": \"(a\"}, \"behavior\": \"Isolated\"}]}, \"model\": {\"type\": \"BPE\", "
               "\"vocab\": {\"a\": 0}, \"merges\": []}}",
               KRT_TOK_HF_JSON,
               "re.json: error: pre_tokenizer.pretokenizers[0].pattern.Regex: bad regex at offset 2: "
               "missing closing parenthesis\n");
    LOAD_ERROR("beh.json", "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, "
               "\"behavior\": \"Sideways\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
               KRT_TOK_HF_JSON, "beh.json: error: pre_tokenizer.behavior: unknown split behavior 'Sideways'\n");
    /* the components' shared reading: Sequence lists, types, depth, Replace */
#define TINY_MODEL "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}"
    LOAD_ERROR("seq.json", "{\"decoder\": {\"type\": \"Sequence\"}, " TINY_MODEL, KRT_TOK_HF_JSON,
               "seq.json: error: decoder.decoders: expected an array\n");
    LOAD_ERROR("notype.json", "{\"pre_tokenizer\": {\"pretokenizers\": []}, " TINY_MODEL, KRT_TOK_HF_JSON,
               "notype.json: error: pre_tokenizer: missing \"type\"\n");
    LOAD_ERROR("notobj.json", "{\"post_processor\": {\"type\": \"Sequence\", \"processors\": [7]}, " TINY_MODEL,
               KRT_TOK_HF_JSON, "notobj.json: error: post_processor.processors[0]: expected an object\n");
    LOAD_ERROR("post.json", "{\"post_processor\": {\"type\": \"Foo\"}, " TINY_MODEL, KRT_TOK_HF_JSON,
               "post.json: error: post_processor.type: unsupported post-processor 'Foo' (kiln reads Sequence, "
               "ByteLevel, TemplateProcessing, RobertaProcessing, BertProcessing)\n");
    LOAD_ERROR("rep.json", "{\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Fuse\"}, "
               "{\"type\": \"Replace\", \"pattern\": {\"String\": \"a\"}}]}, " TINY_MODEL, KRT_TOK_HF_JSON,
               "rep.json: error: decoder.decoders[1].content: expected a string\n");
    LOAD_ERROR("rep2.json", "{\"normalizer\": {\"type\": \"Replace\", \"content\": \"b\"}, " TINY_MODEL,
               KRT_TOK_HF_JSON, "rep2.json: error: normalizer.pattern: expected {\"String\": ...} or {\"Regex\": ...}\n");
    {
        ks_buf deep = {0};
        ks_buf_puts(&deep, "{\"normalizer\": ");
        for (int i = 0; i < 34; i++) ks_buf_puts(&deep, "{\"type\": \"Sequence\", \"normalizers\": [");
        ks_buf_puts(&deep, "null");
        for (int i = 0; i < 34; i++) ks_buf_puts(&deep, "]}");
        ks_buf_puts(&deep, ", " TINY_MODEL);
        ks_buf want = {0};
        ks_buf_puts(&want, "deep.json: error: normalizer");
        for (int i = 0; i < 33; i++) ks_buf_puts(&want, ".normalizers[0]");
        ks_buf_puts(&want, ": nested too deeply\n");
        check_load_error("deep.json", deep.data, deep.len, KRT_TOK_HF_JSON, ks_buf_cstr(&want));
        ks_buf_free(&deep);
        ks_buf_free(&want);
    }
    LOAD_ERROR("utf.json", "{\"model\": \"\xC3\x28\"}", KRT_TOK_HF_JSON,
               "utf.json: error: not valid UTF-8 (byte 11 is 0xC3)\n");
    LOAD_ERROR("short.bin", "\x07\x00", KRT_TOK_LLAMA2C_BIN,
               "short.bin: error: too short for a llama2.c tokenizer (2 bytes; the header alone is 4)\n");
    LOAD_ERROR("trunc.bin", "\x07\x00\x00\x00\x00\x00\x00\x00\x0a\x00\x00\x00" "abc", KRT_TOK_LLAMA2C_BIN,
               "trunc.bin: error: token 0 at byte 4: length 10 runs past the end of the file (3 bytes left)\n");
    LOAD_ERROR("neg.bin", "\x07\x00\x00\x00\x00\x00\x00\x00\xff\xff\xff\xff", KRT_TOK_LLAMA2C_BIN,
               "neg.bin: error: token 0 at byte 4: negative length -1\n");

    /* Without a decoder, tokens are joined with ' '; any decoder, even an empty Sequence, joins them as they are. */
    static const char *const joined[][2] = {
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": []}}", "a b"},
        {"{\"decoder\": {\"type\": \"Sequence\", \"decoders\": []}, \"model\": {\"type\": \"BPE\", "
         "\"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": []}}", "ab"},
    };
    for (int k = 0; k < 2; k++) {
        ks_diag dj = {0};
        krt_tok *tj = krt_tok_load_memory(&dj, "join.json", joined[k][0], strlen(joined[k][0]), KRT_TOK_HF_JSON);
        CHECK(tj != NULL);
        if (!tj) continue;
        ks_buf out = {0};
        krt_tok_decode(tj, (const int32_t[]){0, 1}, 2, 0, &out);
        CHECK_STR(ks_buf_cstr(&out), joined[k][1]);
        ks_buf_free(&out);
        krt_tok_free(tj);
    }

    /* An unk token that is not in the vocabulary fails when it is needed. */
    static const char unk_json[] =
        "{\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"vocab\": {\"a\": 0}, \"merges\": []}}";
    ks_diag d2 = {0};
    krt_tok *t = krt_tok_load_memory(&d2, "unk.json", unk_json, strlen(unk_json), KRT_TOK_HF_JSON);
    CHECK(t != NULL);
    if (t) {
        krt_tok_ids ids = {0};
        clear(&log);
        d2.log = &log;
        d2.quiet = 1;
        CHECK(krt_tok_encode(t, "aa", 2, 0, &ids, &d2) == 0 && ids.len == 2);
        ids.len = 0;
        CHECK(krt_tok_encode(t, "ab", 2, 0, &ids, &d2) == -1 && ids.len == 0);
        CHECK_STR(ks_buf_cstr(&log),
                  "unk.json: error: cannot encode: the unk token '<unk>' is not in the vocabulary\n");
        krt_tok_ids_free(&ids);
        krt_tok_free(t);
    }
    ks_buf_free(&log);
}

int main(void)
{
    test_goldens();
    test_small_tokenizers();
    test_llama2c();
    test_long_inputs();
    test_errors();
    return check_finish("tokenizer");
}
