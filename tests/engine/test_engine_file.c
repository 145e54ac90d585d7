/*
 * test_engine_file.c — the engine file refuses damage (runtime/engine.h).
 *
 * A small engine (a planned MLP graph, weights, a tokenizer and an extra
 * section) is written, then copies are damaged one byte at a time: each
 * header field (magic, version, section count, file size, checksum, every
 * padding byte), every field of every section table entry, and a byte of
 * every section. krt_engine_open must refuse each copy with the exact
 * message, naming the file. Then copies are changed and their checksum
 * recomputed (as engine.h describes it), to reach the checks behind the
 * checksum: a graph section patched to a memory plan with a value past the
 * arena, or two live values in the same bytes, is refused by the verifier
 * with the value and its place; a zero section count and a section past the
 * file's end by the section checks.
 */
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "runtime/engine.h"
#include "tests/check.h"

/* An MLP block at T=4 with its memory plan, as kiln build writes it. */
static const char graph_text[] =
    "kiln-ir 1\n"
    "graph \"mlp\"\n"
    "param mem.max_tokens = 4\n"
    "param mem.arena_bytes = 1024\n"
    "%0 : i32[T] = input() {name=\"tokens\", mem.offset=0, mem.bytes=64}\n"
    "%1 : f32[100,16] = weight() {name=\"embed\"}\n"
    "%2 : f32[T,16] = embed(%1, %0) {mem.offset=512, mem.bytes=256} @\"mlp.kiln\":3:9\n"
    "%3 : f32[16] = weight() {name=\"norm\"}\n"
    "%4 : f32[T,16] = rms_norm(%2, %3) {eps=1e-05, mem.offset=768, mem.bytes=256} @\"mlp.kiln\":4:9\n"
    "%5 : f32[32,16] = weight() {name=\"up\"}\n"
    "%6 : f32[T,32] = matmul(%4, %5) {mem.offset=0, mem.bytes=512} @\"mlp.kiln\":5:9\n"
    "%7 : f32[T,32] = silu(%6) {mem.offset=0, mem.bytes=512, mem.inplace=1} @\"mlp.kiln\":6:9\n"
    "%8 : f32[16,32] = weight() {name=\"down\"}\n"
    "%9 : f32[T,16] = matmul(%7, %8) {mem.offset=768, mem.bytes=256} @\"mlp.kiln\":7:9\n"
    "%10 : f32[T,16] = add(%2, %9) {mem.offset=512, mem.bytes=256, mem.inplace=1} @\"mlp.kiln\":8:5\n"
    "%11 : f32[T,16] = output(%10) {name=\"logits\", mem.offset=512, mem.bytes=256, mem.alias=1}\n";

enum { HEADER = 64, ENTRY = 48 }; /* engine.h: the header, a section table entry */

static char work_dir[64];

static int fill_weights(void *ctx, kir_val node, void *dst, size_t nbytes, ks_diag *d)
{
    (void)ctx;
    (void)d;
    float *f = dst;
    for (size_t i = 0; i < nbytes / sizeof(float); i++) f[i] = (float)(node + 1) * 0.01f * (float)(i % 5);
    return 0;
}

/* fill_weights in parts: bytes [at, at + nbytes) of the same data, for every weight but node 3's
 * (whole only: 1); parts counts the calls that filled */
static int parts;
static int fill_weights_part(void *ctx, kir_val node, size_t at, void *dst, size_t nbytes, ks_diag *d)
{
    (void)ctx;
    (void)d;
    if (node == 3) return 1;
    float *f = dst;
    for (size_t i = 0; i < nbytes / sizeof(float); i++) {
        size_t j = at / sizeof(float) + i;
        f[i] = (float)(node + 1) * 0.01f * (float)(j % 5);
    }
    parts++;
    return 0;
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}
static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* The checksum as engine.h defines it: every byte, the field taken as zero. */
static uint64_t checksum_of(const uint8_t *file, size_t size)
{
    uint8_t header[HEADER];
    memcpy(header, file, HEADER);
    memset(header + 24, 0, 8);
    return ks_hash64(ks_hash64(KS_HASH_SEED, header, HEADER), file + HEADER, size - HEADER);
}

/* An engine file in memory. */
typedef struct image {
    uint8_t *data; /* its bytes */
    size_t size;   /* how many */
} image;

static image read_image(const char *path)
{
    ks_diag d = {0};
    image im = {0};
    im.data = (uint8_t *)ks_read_file(&d, path, &im.size);
    KS_ASSERT(im.data);
    return im;
}

static image copy_image(const image *im)
{
    image c = {ks_xmalloc(im->size), im->size};
    memcpy(c.data, im->data, im->size);
    return c;
}

static char *write_image(const image *im, const char *name)
{
    char *path = ks_path_join(work_dir, name);
    FILE *f = fopen(path, "wb");
    KS_ASSERT(f && fwrite(im->data, 1, im->size, f) == im->size);
    fclose(f);
    return path;
}

/* Open im (written as damaged.engine); the engine must be refused with exactly
 * `want` (%s in it: the path, as many times as it appears). */
static void expect_refused(const char *what, const image *im, const char *want_fmt)
{
    char *path = write_image(im, "damaged.engine");
    sink s;
    sink_init(&s);
    krt_engine *e = krt_engine_open(path, &s.d);
    CHECK_MSG(e == NULL, "%s: the damaged engine opened", what);
    krt_engine_close(e);
    ks_buf want = {0};
    /* the path goes where the format says: at most twice */
    ks_buf_printf(&want, want_fmt, path, path);
    CHECK_TEXT(what, sink_text(&s), ks_buf_cstr(&want));
    ks_buf_free(&want);
    ks_buf_free(&s.log);
    unlink(path);
    free(path);
}

/* im with byte `at` flipped must fail its checksum. */
static void expect_checksum_refused(const char *what, const image *good, size_t at)
{
    image im = copy_image(good);
    im.data[at] ^= 0x55;
    char fmt[256];
    snprintf(fmt, sizeof fmt, "%%s: error: damaged: checksum mismatch (stored %016llx, computed %016llx)\n",
             (unsigned long long)get_u64(im.data + 24), (unsigned long long)checksum_of(im.data, im.size));
    expect_refused(what, &im, fmt);
    free(im.data);
}

/* Every byte of the header and the section table, and a byte of every section. */
static void test_flips(const image *good)
{
    image im = copy_image(good);
    im.data[0] ^= 0x55;
    expect_refused("magic", &im, "%s: error: not a kiln engine file (bad magic)\n");
    memcpy(im.data, good->data, HEADER);
    im.data[7] ^= 0x55; /* the magic's NUL */
    expect_refused("magic's NUL", &im, "%s: error: not a kiln engine file (bad magic)\n");
    memcpy(im.data, good->data, HEADER);
    im.data[8] ^= 0x55; /* 2 -> 87 */
    expect_refused("version", &im, "%s: error: engine format version 87, this kiln reads version 2; rebuild the engine\n");
    memcpy(im.data, good->data, HEADER);
    im.data[8] = 1;
    expect_refused("format 1", &im, "%s: error: built by an older kiln (format 1); rebuild it\n");
    memcpy(im.data, good->data, HEADER);
    im.data[16] ^= 0x55;
    char fmt[160];
    snprintf(fmt, sizeof fmt, "%%s: error: truncated or damaged: header says %llu bytes, file has %zu\n",
             (unsigned long long)get_u64(im.data + 16), im.size);
    expect_refused("file size", &im, fmt);
    free(im.data);

    /* the section count, the checksum, the padding: only the checksum tells */
    for (size_t at = 12; at < HEADER; at++) {
        if (at >= 16 && at < 24) continue; /* the file size: above */
        char what[32];
        snprintf(what, sizeof what, "header byte %zu", at);
        expect_checksum_refused(what, good, at);
    }
    uint32_t nsec = (uint32_t)good->data[12];
    CHECK(nsec == 6);
    for (uint32_t i = 0; i < nsec; i++) {
        const uint8_t *e = good->data + HEADER + (size_t)i * ENTRY;
        char what[64];
        for (size_t f = 0; f < ENTRY; f += 8) { /* name (twice), offset, size, alignment, reserved */
            snprintf(what, sizeof what, "section table entry %u byte %zu", i, f);
            expect_checksum_refused(what, good, HEADER + (size_t)i * ENTRY + f);
        }
        uint64_t off = get_u64(e + 16), size = get_u64(e + 24);
        CHECK(size > 0 && off + size <= good->size);
        snprintf(what, sizeof what, "section %.16s", (const char *)e);
        expect_checksum_refused(what, good, (size_t)(off + size / 2));
    }
}

/* Where text first occurs in im at or after `from`, or SIZE_MAX. */
static size_t find(const image *im, size_t from, const char *text)
{
    size_t n = strlen(text);
    for (size_t i = from; i + n <= im->size; i++)
        if (memcmp(im->data + i, text, n) == 0) return i;
    return SIZE_MAX;
}

/* Changes behind a recomputed checksum: the checks that follow it. A copy
 * of good with its one `from` replaced by `to`, of the same length. */
static image resealed(const image *good, const char *from, const char *to)
{
    image im = copy_image(good);
    size_t at = find(&im, 0, from);
    KS_ASSERT(strlen(from) == strlen(to) && at != SIZE_MAX && find(&im, at + 1, from) == SIZE_MAX);
    memcpy(im.data + at, to, strlen(to));
    return im;
}

static void reseal(image *im) { put_u64(im->data + 24, checksum_of(im->data, im->size)); }

static void test_behind_checksum(const image *good)
{
    image im = resealed(good, "matmul(%7, %8) {mem.offset=768", "matmul(%7, %8) {mem.offset=960");
    reseal(&im);
    expect_refused("plan past the arena", &im,
                   "mlp.kiln:7:9: error: node %%9 (matmul): mem.offset 960 + 256 bytes at 4 tokens is past "
                   "mem.arena_bytes 1024\n"
                   "%s: error: damaged: its graph does not parse or verify\n");
    free(im.data);

    im = resealed(good, "matmul(%7, %8) {mem.offset=768", "matmul(%7, %8) {mem.offset=384");
    reseal(&im);
    expect_refused("plan overlap", &im,
                   "mlp.kiln:7:9: error: node %%9 (matmul): shares bytes [512,640) with node %%2 (embed), and both "
                   "are live at node %%9\n"
                   "%s: error: damaged: its graph does not parse or verify\n");
    free(im.data);

    im = resealed(good, "param mem.arena_bytes = 1024", "param mem.arena_bytes = -102");
    reseal(&im);
    expect_refused("plan arena", &im,
                   "%s(graph): error: param mem.arena_bytes is -102; an arena has 1 to 281474976710656 bytes\n"
                   "%s: error: damaged: its graph does not parse or verify\n");
    free(im.data);

    im = copy_image(good);
    memset(im.data + 12, 0, 4);
    reseal(&im);
    expect_refused("no sections", &im, "%s: error: damaged: bad section count 0\n");
    free(im.data);

    im = copy_image(good);
    uint8_t *graph_entry = im.data + HEADER + ENTRY; /* meta, graph, ...: engine.c's order */
    CHECK(strcmp((const char *)graph_entry, "graph") == 0);
    put_u64(graph_entry + 24, im.size);
    reseal(&im);
    expect_refused("section past the end", &im, "%s: error: damaged: section 'graph' lies outside the file\n");
    free(im.data);

    /* the metadata's dtype is the weights' (the engine description's) */
    im = resealed(good, "\"dtype\": \"f32\"", "\"dtype\": \"f16\"");
    reseal(&im);
    expect_refused("metadata dtype", &im, "%s: error: damaged: the metadata says the weights are f16, the graph says f32\n");
    free(im.data);
}

int main(void)
{
    snprintf(work_dir, sizeof work_dir, "/tmp/kiln_engine_test.XXXXXX");
    if (!mkdtemp(work_dir)) return 1;
    sink s;
    sink_init(&s);
    ks_source src = {"mlp.ir", graph_text, strlen(graph_text)};
    kir_graph *g = kir_parse(&src, &s.d);
    CHECK(g && kir_verify(g, &s.d, "mlp.ir") == 0);
    const krt_engine_section extra[] = {{"x.extra", "extra bytes", 11}};
    krt_engine_spec spec = {
        .graph = g,
        .meta_json = "{\"target\": \"cpu\", \"dtype\": \"f32\"}",
        .fill = fill_weights,
        .tokenizer = "tokenizer bytes",
        .tokenizer_len = 15,
        .tokenizer_kind = 1,
        .extra = extra,
        .n_extra = 1,
    };
    char *path = ks_path_join(work_dir, "good.engine");
    CHECK(krt_engine_write(path, &spec, &s.d) == 0);
    krt_engine *e = krt_engine_open(path, &s.d);
    CHECK(e != NULL);
    CHECK(e && e->version == KRT_ENGINE_VERSION && e->n_sections == 6);
    CHECK_STR(sink_text(&s), "");
    krt_engine_close(e);
    image good = read_image(path);
    CHECK(get_u64(good.data + 24) == checksum_of(good.data, good.size));
    /* weights in parts (where fill_part takes them; the others whole): the same bytes */
    spec.fill_part = fill_weights_part;
    char *path2 = ks_path_join(work_dir, "parts.engine");
    CHECK(krt_engine_write(path2, &spec, &s.d) == 0);
    image again = read_image(path2);
    CHECK(parts > 0 && again.size == good.size && memcmp(again.data, good.data, good.size) == 0);
    free(again.data);
    unlink(path2);
    free(path2);
    test_flips(&good);
    test_behind_checksum(&good);
    free(good.data);
    unlink(path);
    free(path);
    rmdir(work_dir);
    kir_graph_free(g);
    ks_buf_free(&s.log);
    return check_finish("test_engine_file");
}
