/* fuzz_tokenizer.c — the tokenizers under arbitrary input. The first byte
 * picks what the rest is:
 *   0-3  text, encoded and decoded by a real tokenizer (GPT-2 byte-level,
 *        Llama-3 byte-level, TinyStories SentencePiece-style, llama2.c's
 *        tok512), checking that byte-level BPE gives valid UTF-8 back
 *        exactly, that llama2.c's round trip holds, and that streaming
 *        decode agrees with decode;
 *   4    a tokenizer.json (up to a NUL byte), then text to encode with it;
 *   5    a llama2.c tokenizer.bin, then a fixed text is encoded with it;
 *   6    pairs of bytes as ids, decoded at once and streamed by each real
 *        tokenizer.
 * The real tokenizers load once, from $KILN_SHARED, else the shared/ folder
 * beside the source tree, else ../shared; when none is there, two small
 * tokenizers written below stand in for them. */
#include "runtime/text/tokenizer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Stand-ins when shared/ is absent, like fuzz/corpus/tokenizer/seed_bytelevel
 * and seed_spm. */
static const char fallback_byte_level[] =
    "{\"added_tokens\":[{\"id\":7,\"content\":\"<|eot|>\",\"lstrip\":true,\"rstrip\":true,"
    "\"normalized\":false,\"special\":true}],\"pre_tokenizer\":{\"type\":\"ByteLevel\","
    "\"add_prefix_space\":false,\"use_regex\":true},\"decoder\":{\"type\":\"ByteLevel\"},"
    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"\xC4\xA0\":2,\"ab\":3,\"\xC4\xA0" "ab\":4,"
    "\"c\":5,\"abc\":6},\"merges\":[[\"a\",\"b\"],[\"\xC4\xA0\",\"ab\"],[\"ab\",\"c\"]]}}";
static const char fallback_spm[] =
    "{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\xE2\x96\x81\"},"
    "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\xE2\x96\x81\"}]},"
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\xE2\x96\x81\"},"
    "\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \","
    "\"start\":1,\"stop\":0}]},\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,"
    "\"byte_fallback\":true,\"vocab\":{\"<unk>\":0,\"<0xE4>\":1,\"<0xB8>\":2,\"<0xAD>\":3,\"\xE2\x96\x81\":4,"
    "\"h\":5,\"i\":6,\"hi\":7,\"\xE2\x96\x81hi\":8},\"merges\":[\"h i\",\"\xE2\x96\x81 hi\"]}}";

enum { N_REAL = 4 };

typedef struct real_toks {
    int loaded;            /* tried already */
    krt_tok *tok[N_REAL];  /* GPT-2, Llama-3, TinyStories, tok512 (or stand-ins) */
    int lossless[N_REAL];  /* byte-level: decode(encode(x)) == x for valid UTF-8 */
    int llama2c[N_REAL];   /* llama2.c's round trip rules apply */
} real_toks;

static krt_tok *load_quiet(const char *dir, const char *rel)
{
    if (!dir) return NULL;
    char *p = ks_path_join(dir, rel);
    ks_diag d = {0};
    d.quiet = 1;
    krt_tok *t = ks_file_exists(p) ? krt_tok_load_file(&d, p, KRT_TOK_AUTO) : NULL;
    free(p);
    return t;
}

static real_toks *real(void)
{
    static real_toks r; /* loaded once per process: a fuzzer runs millions of inputs */
    if (r.loaded) return &r;
    r.loaded = 1;
    static const char *rel[N_REAL] = {"tokenizers/gpt2-bpe/tokenizer.json",
                                      "tokenizers/llama3-bpe/tokenizer.json",
                                      "models/tinystories-656k/tokenizer.json",
                                      "models/stories260k/tok512.bin"};
    char here[4096];
    snprintf(here, sizeof here, "%s", __FILE__);
    char *slash = strrchr(here, '/');
    if (slash) strcpy(slash, "/../../shared");
    const char *dirs[3] = {getenv("KILN_SHARED"), slash ? here : NULL, "../shared"};
    for (int i = 0; i < N_REAL; i++)
        for (int k = 0; k < 3 && !r.tok[i]; k++) r.tok[i] = load_quiet(dirs[k], rel[i]);
    ks_diag d = {0};
    d.quiet = 1;
    for (int i = 0; i < N_REAL; i++) {
        if (r.tok[i]) {
            r.lossless[i] = i < 2;
            r.llama2c[i] = i == 3;
            continue;
        }
        const char *j = i % 2 ? fallback_spm : fallback_byte_level;
        r.tok[i] = krt_tok_load_memory(&d, "fallback.json", j, strlen(j), KRT_TOK_HF_JSON);
        r.lossless[i] = 0; /* the stand-ins' vocabularies do not cover every byte */
    }
    return &r;
}

static int valid_utf8(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint8_t b = s[i];
        size_t l = b < 0x80 ? 1 : (b >= 0xC2 && b <= 0xDF) ? 2 : (b >= 0xE0 && b <= 0xEF) ? 3
                                  : (b >= 0xF0 && b <= 0xF4) ? 4 : 0;
        if (l == 0 || i + l > n) return 0;
        uint32_t cp = l == 1 ? b : l == 2 ? (b & 0x1Fu) : l == 3 ? (b & 0x0Fu) : (b & 0x07u);
        for (size_t k = 1; k < l; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = cp << 6 | (s[i + k] & 0x3Fu);
        }
        if ((l == 3 && cp < 0x800) || (l == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += l;
    }
    return 1;
}

static int contains(const uint8_t *s, size_t n, const char *what)
{
    size_t k = strlen(what);
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(s + i, what, k) == 0) return 1;
    return 0;
}

static int has_replacement(const ks_buf *b)
{
    for (size_t i = 0; i + 3 <= b->len; i++)
        if (memcmp(b->data + i, "\xEF\xBF\xBD", 3) == 0) return 1;
    return 0;
}

/* Decode at once and streamed; they must agree when the text is valid. */
static void check_stream(const krt_tok *t, const int32_t *ids, size_t n, int flags)
{
    ks_buf once = {0}, streamed = {0};
    krt_tok_decode(t, ids, n, flags, &once);
    if (!valid_utf8((const uint8_t *)once.data, once.len)) abort();
    krt_tok_stream *s = krt_tok_stream_new(t, flags);
    for (size_t i = 0; i < n; i++) krt_tok_stream_push(s, ids[i], &streamed);
    krt_tok_stream_flush(s, &streamed);
    krt_tok_stream_free(s);
    if (!valid_utf8((const uint8_t *)streamed.data, streamed.len)) abort();
    if (!has_replacement(&once) &&
        (once.len != streamed.len || memcmp(once.data, streamed.data, once.len) != 0))
        abort();
    ks_buf_free(&once);
    ks_buf_free(&streamed);
}

static void fuzz_text(const krt_tok *t, int lossless, int llama2c, const uint8_t *data, size_t n)
{
    if (!t) return;
    ks_diag d = {0};
    d.quiet = 1;
    krt_tok_ids ids = {0};
    const char *text = (const char *)data;
    if (krt_tok_encode(t, text, n, KRT_TOK_ADD_SPECIAL, &ids, &d) != 0) abort(); /* real ones encode anything */
    for (size_t i = 0; i < ids.len; i++)
        if (ids.ids[i] < 0 || ids.ids[i] >= krt_tok_vocab_size(t)) abort();
    int valid = valid_utf8(data, n);
    ks_buf out = {0};
    krt_tok_decode(t, ids.ids, ids.len, KRT_TOK_SKIP_SPECIAL, &out);
    if (lossless && valid) {
        /* special-token text encodes to its id and decodes back, so decode without skipping */
        ks_buf all = {0};
        krt_tok_ids plain = {0};
        krt_tok_encode(t, text, n, 0, &plain, &d);
        krt_tok_decode(t, plain.ids, plain.len, 0, &all);
        if (all.len != n || (n && memcmp(all.data, text, n) != 0)) abort();
        krt_tok_ids_free(&plain);
        ks_buf_free(&all);
    }
    if (llama2c && valid && !memchr(data, 0, n) && !contains(data, n, "<0x")) {
        if (out.len != n || (n && memcmp(out.data, text, n) != 0)) abort();
    }
    check_stream(t, ids.ids, ids.len, KRT_TOK_SKIP_SPECIAL);
    check_stream(t, ids.ids, ids.len, 0);
    ks_buf_free(&out);
    krt_tok_ids_free(&ids);
}

static void fuzz_loaded(krt_tok *t, const char *text, size_t n)
{
    if (!t) return;
    ks_diag d = {0};
    d.quiet = 1;
    krt_tok_ids ids = {0};
    if (krt_tok_encode(t, text, n, KRT_TOK_ADD_SPECIAL, &ids, &d) == 0) {
        for (size_t i = 0; i < ids.len; i++)
            if (ids.ids[i] < 0 || ids.ids[i] >= krt_tok_vocab_size(t)) abort();
        check_stream(t, ids.ids, ids.len, 0);
    }
    int32_t some[8];
    for (int i = 0; i < 8; i++) some[i] = (int32_t)((i * 7919) % (krt_tok_vocab_size(t) + 2)) - 1;
    check_stream(t, some, 8, KRT_TOK_SKIP_SPECIAL);
    for (int32_t i = -1; i < 4; i++) {
        size_t len;
        krt_tok_piece(t, i, &len);
    }
    krt_tok_ids_free(&ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int mode = data[0] % 7;
    data++;
    size--;
    real_toks *r = real();
    ks_diag d = {0};
    d.quiet = 1;
    switch (mode) {
    case 0:
    case 1:
    case 2:
    case 3:
        fuzz_text(r->tok[mode], r->lossless[mode], r->llama2c[mode], data, size);
        break;
    case 4: {
        const uint8_t *nul = memchr(data, 0, size);
        size_t jlen = nul ? (size_t)(nul - data) : size;
        krt_tok *t = krt_tok_load_memory(&d, "fuzz.json", data, jlen, KRT_TOK_HF_JSON);
        const char *text = nul ? (const char *)nul + 1 : "Hello w\xC3\xB6rld \xE4\xB8\xAD  <s>";
        size_t tlen = nul ? size - jlen - 1 : strlen(text);
        fuzz_loaded(t, text, tlen);
        krt_tok_free(t);
        break;
    }
    case 5: {
        krt_tok *t = krt_tok_load_memory(&d, "fuzz.bin", data, size, KRT_TOK_LLAMA2C_BIN);
        const char *text = "Hello w\xC3\xB6rld \xE4\xB8\xAD <0x41>";
        fuzz_loaded(t, text, strlen(text));
        krt_tok_free(t);
        break;
    }
    case 6: {
        size_t n = size / 2;
        int32_t *ids = malloc((n + 1) * sizeof *ids);
        for (size_t i = 0; i < n; i++) ids[i] = (int32_t)(data[2 * i] | data[2 * i + 1] << 8) - 16;
        for (int k = 0; k < N_REAL; k++)
            if (r->tok[k]) {
                check_stream(r->tok[k], ids, n, 0);
                check_stream(r->tok[k], ids, n, KRT_TOK_SKIP_SPECIAL);
            }
        free(ids);
        break;
    }
    }
    return 0;
}
