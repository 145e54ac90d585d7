/*
 * test_tokenizer_oom.c — out of memory inside the tokenizers
 * (runtime/text/tokenizer*.c) is an error or a marked output, never a crash,
 * a leak or a wrong result.
 *
 * For each tokenizer below, one run is: load, encode a text (special tokens,
 * runs of spaces, a word the regexes split, bytes that are not UTF-8), decode
 * the ids at once, and stream them one by one. The run is made with every
 * allocation succeeding, then with allocation n = 1, 2, ... failing (once,
 * and then from there on), until a run meets no failure. Each time the call
 * that met it must say so: a load returns NULL and an encode -1, both with
 * "out of memory" in their message, the encode's ids as they were; a decode
 * or a stream marks its (fallible) output failed. With memory back, the call
 * made again gives what the run without failures gave. The ASan build that
 * tests/run.sh runs checks that nothing leaks.
 *
 * The tokenizers: a byte-level one written here with everything the
 * pipeline has that allocates (added tokens stripped, single-word and
 * normalized; a Replace regex normalizer and Strip; Split and ByteLevel
 * regex pre-tokenizers; a template), a SentencePiece-style one (Prepend and
 * Replace normalizers, Metaspace splitting, byte fallback, Replace,
 * ByteFallback, Fuse and Strip decoders), and llama2.c's tok512.bin from
 * $KILN_SHARED (stories260k).
 */
#include <stdlib.h>
#include <string.h>

#include "runtime/text/tokenizer.h"
#include "tests/check.h"

static const char byte_level_json[] =
    "{\"version\":\"1.0\",\"added_tokens\":["
    "{\"id\":7,\"content\":\"<|eot|>\",\"single_word\":false,\"lstrip\":true,\"rstrip\":true,"
    "\"normalized\":false,\"special\":true},"
    "{\"id\":8,\"content\":\"<s>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
    "\"normalized\":false,\"special\":true},"
    "{\"id\":9,\"content\":\"cab\",\"single_word\":true,\"lstrip\":false,\"rstrip\":false,"
    "\"normalized\":true,\"special\":false}],"
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Replace\",\"pattern\":{\"Regex\":\" {2,}\"},"
    "\"content\":\" \"},{\"type\":\"Strip\",\"strip_left\":false,\"strip_right\":true}]},"
    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"[0-9]\"},"
    "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}]},"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\","
    "\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"pair\":[],\"special_tokens\":"
    "{\"<s>\":{\"id\":\"<s>\",\"ids\":[8],\"tokens\":[\"<s>\"]}}},"
    "\"decoder\":{\"type\":\"ByteLevel\"},"
    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"\xC4\xA0\":2,\"ab\":3,\"\xC4\xA0" "ab\":4,"
    "\"c\":5,\"abc\":6,\"1\":10,\"\xC3\xBF\":11,\"\xC3\xBE\":12},"
    "\"merges\":[[\"a\",\"b\"],[\"\xC4\xA0\",\"ab\"],[\"ab\",\"c\"]]}}";

static const char spm_json[] =
    "{\"version\":\"1.0\",\"added_tokens\":["
    "{\"id\":0,\"content\":\"<unk>\",\"normalized\":false,\"special\":true},"
    "{\"id\":1,\"content\":\"<s>\",\"normalized\":false,\"special\":true},"
    "{\"id\":2,\"content\":\"</s>\",\"normalized\":false,\"special\":true}],"
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\xE2\x96\x81\"},"
    "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\xE2\x96\x81\"}]},"
    "\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\xE2\x96\x81\",\"prepend_scheme\":\"never\","
    "\"split\":true},"
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

/* What a run gave, to compare with the run without failures. */
typedef struct outcome {
    int32_t ids[256];   /* the encoded ids */
    size_t n_ids;       /* how many */
    char text[1024];    /* their decode */
    char streamed[1024]; /* their streamed decode */
} outcome;

/* One tokenizer under test. */
typedef struct subject {
    const char *name;   /* what messages name */
    const void *data;   /* its bytes */
    size_t len;         /* how many */
    const char *text;   /* what it encodes */
} subject;

static sink k; /* the calls' messages, in a buffer with room made before each call: no growth needed */

static void sink_ready(void)
{
    sink_clear(&k);
    if (k.log.cap < 4096) {
        char pad[4096];
        memset(pad, ' ', sizeof pad);
        ks_buf_put(&k.log, pad, sizeof pad - 1);
        sink_clear(&k);
    }
}

/* A call failed while allocation n was made to fail: it said out of memory. */
static void said_oom(const subject *su, const char *call, long n)
{
    CHECK_MSG(strstr(sink_text(&k), "out of memory"), "%s, allocation %ld: %s failed without saying out of memory: "
              "\"%s\"", su->name, n, call, sink_text(&k));
}

/* Decode ids at once into out->text; 0, or -1 when the output was marked failed. */
static int decode_all(const krt_tok *t, const outcome *o, char *text)
{
    ks_buf b = KS_BUF_TRY;
    krt_tok_decode(t, o->ids, o->n_ids, 0, &b);
    int bad = b.failed != 0;
    if (!bad) snprintf(text, 1024, "%s", ks_buf_cstr(&b));
    ks_buf_free(&b);
    return bad ? -1 : 0;
}

/* Stream the ids one by one; 0, or -1 when the stream could not be made or its output was marked failed. */
static int stream_all(const krt_tok *t, const outcome *o, char *text)
{
    krt_tok_stream *s = krt_tok_stream_new(t, 0);
    if (!s) return -1;
    ks_buf b = KS_BUF_TRY;
    for (size_t i = 0; i < o->n_ids && !b.failed; i++) krt_tok_stream_push(s, o->ids[i], &b);
    if (!b.failed) krt_tok_stream_flush(s, &b);
    int bad = b.failed != 0;
    if (!bad) snprintf(text, 1024, "%s", ks_buf_cstr(&b));
    ks_buf_free(&b);
    krt_tok_stream_free(s);
    return bad ? -1 : 0;
}

/* One run; n > 0: allocation n fails (every one from n on with all_after). A
 * call that fails is made again with memory back. Returns the failures met. */
static long run(const subject *su, long n, int all_after, outcome *out)
{
    memset(out, 0, sizeof *out);
    long failed = 0;
    if (n > 0) ks_alloc_fail_after(n, all_after);
#define MET() (ks_alloc_failures() > 0 ? (failed += ks_alloc_failures(), ks_alloc_fail_after(0, 0), 1) : 0)

    sink_ready();
    krt_tok *t = krt_tok_load_memory(&k.d, su->name, su->data, su->len, KRT_TOK_AUTO);
    if (!t) {
        CHECK(MET());
        said_oom(su, "load", n);
        sink_ready();
        t = krt_tok_load_memory(&k.d, su->name, su->data, su->len, KRT_TOK_AUTO);
    }
    CHECK(t != NULL);
    if (!t) exit(1);

    krt_tok_ids ids = {0};
    ids.ids = malloc(sizeof *ids.ids); /* an id already there stays, whatever happens (not counted) */
    ids.ids[0] = 12345;
    ids.len = ids.cap = 1;
    sink_ready();
    int rc = krt_tok_encode(t, su->text, strlen(su->text), KRT_TOK_ADD_SPECIAL, &ids, &k.d);
    if (rc != 0) {
        CHECK(MET());
        said_oom(su, "encode", n);
        CHECK(ids.len == 1 && ids.ids[0] == 12345 && ids.failed == 0);
        sink_ready();
        rc = krt_tok_encode(t, su->text, strlen(su->text), KRT_TOK_ADD_SPECIAL, &ids, &k.d);
    }
    CHECK(rc == 0 && ids.len > 1 && ids.len - 1 <= sizeof out->ids / sizeof out->ids[0]);
    out->n_ids = ids.len - 1 < sizeof out->ids / sizeof out->ids[0] ? ids.len - 1 : 0;
    memcpy(out->ids, ids.ids + 1, out->n_ids * sizeof *out->ids);
    krt_tok_ids_free(&ids);

    if (decode_all(t, out, out->text) != 0) {
        CHECK(MET());
        CHECK(decode_all(t, out, out->text) == 0);
    }
    if (stream_all(t, out, out->streamed) != 0) {
        CHECK(MET());
        CHECK(stream_all(t, out, out->streamed) == 0);
    }
    failed += ks_alloc_failures();
    ks_alloc_fail_after(0, 0);
#undef MET
    krt_tok_free(t);
    return failed;
}

static void test_subject(const subject *su)
{
    static outcome want, got;
    CHECK(run(su, 0, 0, &want) == 0);
    CHECK(want.n_ids > 5 && want.text[0] && strcmp(want.text, want.streamed) == 0);
    long runs[2] = {0, 0};
    for (int all_after = 0; all_after < 2; all_after++) {
        for (long n = 1;; n++) {
            int before = failures;
            long failed = run(su, n, all_after, &got);
            runs[all_after]++;
            CHECK_MSG(memcmp(&got, &want, sizeof got) == 0, "%s, allocation %ld (all after it: %d): the run ends "
                      "differently", su->name, n, all_after);
            if (failures > before + 10 || failures > 50 || failed == 0) break;
        }
    }
    printf("%s: %zu ids, \"%s\"; %ld runs, each allocation failing once, then every one from it on\n", su->name,
           want.n_ids, want.text, runs[0]);
}

int main(void)
{
    sink_init(&k);
    k.log.fallible = 1;
    static const char text[] = "<|eot|>  ab abc  cab xcab 19 \xC3\xBF\xFE abab <s>abc   ";
    subject bl = {"byte_level.json", byte_level_json, sizeof byte_level_json - 1, text};
    test_subject(&bl);
    static const char spm_text[] = "hi hi x \xE4\xB8\xAD hiq </s> x";
    subject spm = {"spm.json", spm_json, sizeof spm_json - 1, spm_text};
    test_subject(&spm);

    const char *shared = getenv("KILN_SHARED");
    char *path = ks_path_join(shared ? shared : "../shared", "models/stories260k/tok512.bin");
    ks_diag d = {.quiet = 1};
    size_t len = 0;
    char *data = ks_read_file(&d, path, &len);
    if (CHECK_MSG(data != NULL, "cannot read %s", path)) {
        subject l2 = {"tok512.bin", data, len, "Zoo animals: one day, a little \xF0\x9F\x90\xB1 said hi"};
        test_subject(&l2);
    }
    free(data);
    free(path);
    ks_buf_free(&k.log);
    return check_finish("test_tokenizer_oom");
}
