/* engine.c — writing and checking engine files (layout in engine.h). */
#include "runtime/engine.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

enum { HEADER_SIZE = 64, SECTION_ENTRY = 48, NAME_LEN = 16, MAX_SECTIONS = 16, SECTION_ALIGN = 64 };
/* Where the header's fields lie (engine.h). */
enum { AT_VERSION = 8, AT_SECTIONS = 12, AT_SIZE = 16, AT_CHECKSUM = 24 };

typedef struct section {
    char name[NAME_LEN]; /* NUL padded */
    uint64_t offset;     /* from the start of the file */
    uint64_t size;       /* bytes */
    uint64_t align;      /* offset is a multiple of this */
} section;

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* ---- writing ----------------------------------------------------------------- */

typedef struct writer {
    ks_outfile out;     /* temp file until commit; out.err: the first write that failed */
    uint64_t pos;       /* bytes written */
    uint64_t hash;      /* checksum of the file as written, its checksum field zero */
} writer;

static void w_bytes(writer *w, const void *p, size_t n)
{
    if (!n) return;
    ks_outfile_write(&w->out, p, n);
    w->pos += n;
}

static void w_pad_to(writer *w, uint64_t align)
{
    static const uint8_t zeros[4096];
    while (w->pos % align) {
        size_t n = (size_t)(align - w->pos % align);
        if (n > sizeof zeros) n = sizeof zeros;
        w_bytes(w, zeros, n);
    }
}

int krt_engine_write(const char *path, const krt_engine_spec *spec, ks_diag *d)
{
    ks_outfile out;
    if (krt_engine_open_output(path, &out, d) != 0) return -1;
    return krt_engine_write_to(&out, spec, NULL, d);
}

int krt_engine_open_output(const char *path, ks_outfile *out, ks_diag *d)
{
    return ks_outfile_open(d, out, path, KS_OUT_SEEKABLE);
}

int krt_engine_write_to(ks_outfile *out, const krt_engine_spec *spec, uint64_t *size, ks_diag *d)
{
    const char *path = out->path;
    const kir_graph *g = spec->graph;
    ks_buf graph_text = {0}, idx = {0};
    kir_print(g, &graph_text);

    /* plan the weights: 256-byte aligned, in node order */
    uint32_t n_weights = 0;
    uint64_t wsize = 0;
    for (size_t v = 0; v < g->n_nodes; v++) {
        const kir_node *n = &g->nodes[v];
        if (n->op != KIR_OP_WEIGHT) continue;
        uint64_t bytes = kir_dtype_bytes(n->dtype, (uint64_t)kir_elems(n, 1));
        wsize = (wsize + KRT_WEIGHT_ALIGN - 1) / KRT_WEIGHT_ALIGN * KRT_WEIGHT_ALIGN;
        uint8_t e[24];
        put_u32(e, (uint32_t)v);
        put_u32(e + 4, (uint32_t)n->dtype);
        put_u64(e + 8, wsize);
        put_u64(e + 16, bytes);
        if (!n_weights) ks_buf_put(&idx, "\0\0\0\0", 4);
        ks_buf_put(&idx, e, sizeof e);
        wsize += bytes;
        n_weights++;
    }
    if (!n_weights) ks_buf_put(&idx, "\0\0\0\0", 4);
    put_u32((uint8_t *)idx.data, n_weights);

    section secs[MAX_SECTIONS];
    int nsec = 0;
    const char *names[MAX_SECTIONS] = {"meta", "graph", "weights.idx", "weights", "tokenizer"};
    uint64_t sizes[MAX_SECTIONS] = {strlen(spec->meta_json), graph_text.len, idx.len, wsize,
                                    spec->tokenizer ? 4 + spec->tokenizer_len : 0};
    uint64_t aligns[MAX_SECTIONS] = {SECTION_ALIGN, SECTION_ALIGN, SECTION_ALIGN, 4096, SECTION_ALIGN};
    int n_std = spec->tokenizer ? 5 : 4;
    int count = n_std;
    /* extra sections go last, each after a check of its name */
    for (size_t x = 0; x < spec->n_extra; x++) {
        const char *name = spec->extra[x].name;
        int clash = strlen(name) == 0 || strlen(name) >= NAME_LEN;
        for (int i = 0; i < count && !clash; i++) clash = strcmp(names[i], name) == 0;
        if (clash || count == MAX_SECTIONS) {
            if (clash)
                ks_error(d, path, "cannot add section '%s': empty, longer than %d bytes, or taken", name, NAME_LEN - 1);
            else
                ks_error(d, path, "cannot add section '%s': an engine holds at most %d sections", name, MAX_SECTIONS);
            ks_buf_free(&graph_text);
            ks_buf_free(&idx);
            ks_outfile_abort(out);
            return -1;
        }
        names[count] = name;
        sizes[count] = spec->extra[x].size;
        aligns[count] = SECTION_ALIGN;
        count++;
    }
    uint64_t off = HEADER_SIZE + (uint64_t)SECTION_ENTRY * (uint64_t)count;
    for (int i = 0; i < count; i++) {
        off = (off + aligns[i] - 1) / aligns[i] * aligns[i];
        memset(&secs[nsec], 0, sizeof secs[nsec]);
        strncpy(secs[nsec].name, names[i], NAME_LEN - 1);
        secs[nsec].offset = off;
        secs[nsec].size = sizes[i];
        secs[nsec].align = aligns[i];
        off += sizes[i];
        nsec++;
    }
    uint64_t file_size = off;
    if (size) *size = file_size;

    writer w = {.out = *out, .hash = KS_HASH_SEED}; /* the writer owns the output from here */
    memset(out, 0, sizeof *out);
    /* the header, its checksum field zero: hashed as it is, then patched */
    uint8_t header[HEADER_SIZE] = {0};
    memcpy(header, KRT_ENGINE_MAGIC, 8);
    put_u32(header + AT_VERSION, KRT_ENGINE_VERSION);
    put_u32(header + AT_SECTIONS, (uint32_t)nsec);
    put_u64(header + AT_SIZE, file_size);
    w_bytes(&w, header, sizeof header);
    uint8_t table[SECTION_ENTRY * MAX_SECTIONS] = {0};
    for (int i = 0; i < nsec; i++) {
        uint8_t *e = table + i * SECTION_ENTRY;
        memcpy(e, secs[i].name, NAME_LEN);
        put_u64(e + 16, secs[i].offset);
        put_u64(e + 24, secs[i].size);
        put_u64(e + 32, secs[i].align);
    }
    w_bytes(&w, table, (size_t)SECTION_ENTRY * (size_t)nsec);

    /* The checksum is computed over the file as laid out, read back at the
     * end: simpler than hashing while padding, and it checks what hit disk. */
    int rc = 0;
    for (int i = 0; i < nsec && !rc && !w.out.err; i++) {
        w_pad_to(&w, secs[i].align);
        KS_ASSERT(w.pos == secs[i].offset);
        switch (i < n_std ? i : -1) { /* -1: an extra section */
        case 0: w_bytes(&w, spec->meta_json, sizes[0]); break;
        case 1: w_bytes(&w, graph_text.data, graph_text.len); break;
        case 2: w_bytes(&w, idx.data, idx.len); break;
        case 3: {
            void *buf = NULL;
            size_t cap = 0;
            for (size_t v = 0; v < g->n_nodes && !rc && !w.out.err; v++) {
                const kir_node *n = &g->nodes[v];
                if (n->op != KIR_OP_WEIGHT) continue;
                size_t bytes = (size_t)kir_dtype_bytes(n->dtype, (uint64_t)kir_elems(n, 1));
                w_pad_to(&w, KRT_WEIGHT_ALIGN);
                /* in parts where fill_part can (the buffer a part), else whole */
                int whole = 1;
                for (size_t at = 0; spec->fill_part && at < bytes && !w.out.err; at += KRT_WEIGHT_PART) {
                    size_t len = bytes - at < KRT_WEIGHT_PART ? bytes - at : KRT_WEIGHT_PART;
                    if (len > cap) {
                        free(buf);
                        buf = ks_xmalloc(len);
                        cap = len;
                    }
                    int r = spec->fill_part(spec->fill_ctx, (kir_val)v, at, buf, len, d);
                    if (r == 1 && at == 0) break; /* whole only */
                    KS_ASSERT(r != 1);             /* a weight in parts stays in parts */
                    if (r != 0) {
                        rc = -1;
                        break;
                    }
                    w_bytes(&w, buf, len);
                    whole = 0;
                }
                if (rc) break;
                if (whole) {
                    if (bytes > cap) {
                        free(buf);
                        buf = ks_xmalloc(bytes);
                        cap = bytes;
                    }
                    if (spec->fill(spec->fill_ctx, (kir_val)v, buf, bytes, d) != 0) {
                        rc = -1;
                        break;
                    }
                    w_bytes(&w, buf, bytes);
                }
                if (spec->progress) spec->progress(spec->progress_ctx, w.pos - secs[i].offset, secs[i].size);
            }
            free(buf);
            break;
        }
        case 4: {
            uint8_t k[4];
            put_u32(k, spec->tokenizer_kind);
            w_bytes(&w, k, 4);
            w_bytes(&w, spec->tokenizer, spec->tokenizer_len);
            break;
        }
        default:
            w_bytes(&w, spec->extra[i - n_std].data, spec->extra[i - n_std].size);
            break;
        }
    }
    ks_buf_free(&graph_text);
    ks_buf_free(&idx);
    if (rc) {
        ks_outfile_abort(&w.out);
        return -1;
    }
    if (w.out.err) return ks_outfile_commit(d, &w.out); /* reports the write that failed */
    KS_ASSERT(w.pos == file_size);
    if (fflush(w.out.f) != 0) {
        w.out.err = errno;
        return ks_outfile_commit(d, &w.out);
    }
    /* checksum: read back the whole file, its checksum field still zero */
    FILE *f = w.out.f; /* open for reading too (KS_OUT_SEEKABLE) */
    if (fseek(f, 0, SEEK_SET) != 0) {
        w.out.err = errno;
    } else {
        enum { CHUNK = 1 << 20 }; /* a multiple of 8, as ks_hash64 chunks must be */
        uint8_t *chunk = ks_xmalloc(CHUNK);
        size_t n;
        while ((n = fread(chunk, 1, CHUNK, f)) > 0) w.hash = ks_hash64(w.hash, chunk, n);
        if (ferror(f)) w.out.err = errno ? errno : EIO;
        free(chunk);
    }
    put_u64(header + AT_CHECKSUM, w.hash);
    if (!w.out.err && fseek(f, 0, SEEK_SET) != 0) w.out.err = errno;
    ks_outfile_write(&w.out, header, sizeof header);
    return ks_outfile_commit(d, &w.out); /* reports a failure of any step */
}

/* ---- reading ------------------------------------------------------------------- */

static const section *find_section(const section *secs, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strncmp(secs[i].name, name, NAME_LEN) == 0) return &secs[i];
    return NULL;
}

static int open_fail(krt_engine *e, ks_diag *d, const char *path, const char *fmt, ...) KS_PRINTF(4, 5);
static int open_fail(krt_engine *e, ks_diag *d, const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ks_verror(d, path, fmt, ap);
    va_end(ap);
    krt_engine_close(e);
    return -1;
}

/* Out of memory at open: reported, and e closed. */
static int open_oom(krt_engine *e, ks_diag *d, const char *path, size_t bytes, const char *what)
{
    ks_error_oom(d, path, bytes, what);
    krt_engine_close(e);
    return -1;
}

krt_engine *krt_engine_open(const char *path, ks_diag *d)
{
    krt_engine *e = ks_try_calloc(1, sizeof *e);
    if (!e) return ks_error_oom(d, path, sizeof *e, "the engine"), NULL;
    e->path = ks_try_strdup(path);
    if (!e->path) {
        open_oom(e, d, path, strlen(path) + 1, "the engine's path");
        return NULL;
    }
    if (ks_mmap_open(d, path, &e->map) != 0) {
        krt_engine_close(e);
        return NULL;
    }
    const uint8_t *p = e->map.data;
    size_t size = e->map.size;
    if (size < HEADER_SIZE || memcmp(p, KRT_ENGINE_MAGIC, 8) != 0) {
        open_fail(e, d, path, "not a kiln engine file (bad magic)");
        return NULL;
    }
    e->version = get_u32(p + AT_VERSION);
    if (e->version >= 1 && e->version < KRT_ENGINE_VERSION) {
        open_fail(e, d, path, "built by an older kiln (format %u); rebuild it", e->version);
        return NULL;
    }
    if (e->version != KRT_ENGINE_VERSION) {
        open_fail(e, d, path, "engine format version %u, this kiln reads version %u; rebuild the engine",
                  e->version, KRT_ENGINE_VERSION);
        return NULL;
    }
    uint32_t nsec = get_u32(p + AT_SECTIONS);
    uint64_t file_size = get_u64(p + AT_SIZE);
    if (file_size != size) {
        open_fail(e, d, path, "truncated or damaged: header says %llu bytes, file has %zu",
                  (unsigned long long)file_size, size);
        return NULL;
    }
    /* every byte, the header's too, before anything in the file is believed */
    e->checksum = get_u64(p + AT_CHECKSUM);
    uint8_t header[HEADER_SIZE];
    memcpy(header, p, HEADER_SIZE);
    memset(header + AT_CHECKSUM, 0, 8);
    uint64_t h = ks_hash64(ks_hash64(KS_HASH_SEED, header, HEADER_SIZE), p + HEADER_SIZE, size - HEADER_SIZE);
    if (h != e->checksum) {
        open_fail(e, d, path, "damaged: checksum mismatch (stored %016llx, computed %016llx)",
                  (unsigned long long)e->checksum, (unsigned long long)h);
        return NULL;
    }
    if (nsec == 0 || nsec > MAX_SECTIONS || HEADER_SIZE + (uint64_t)nsec * SECTION_ENTRY > size) {
        open_fail(e, d, path, "damaged: bad section count %u", nsec);
        return NULL;
    }
    section secs[MAX_SECTIONS];
    for (uint32_t i = 0; i < nsec; i++) {
        const uint8_t *t = p + HEADER_SIZE + i * SECTION_ENTRY;
        memcpy(secs[i].name, t, NAME_LEN);
        secs[i].name[NAME_LEN - 1] = 0;
        secs[i].offset = get_u64(t + 16);
        secs[i].size = get_u64(t + 24);
        secs[i].align = get_u64(t + 32);
        if (secs[i].offset > size || secs[i].size > size - secs[i].offset) {
            open_fail(e, d, path, "damaged: section '%s' lies outside the file", secs[i].name);
            return NULL;
        }
    }
    const char *required[] = {"meta", "graph", "weights.idx", "weights"};
    for (int i = 0; i < 4; i++)
        if (!find_section(secs, (int)nsec, required[i])) {
            open_fail(e, d, path, "damaged: no '%s' section", required[i]);
            return NULL;
        }
    const section *meta = find_section(secs, (int)nsec, "meta");
    e->meta_json = ks_try_malloc(meta->size + 1);
    if (!e->meta_json) {
        open_oom(e, d, path, meta->size + 1, "the engine's metadata");
        return NULL;
    }
    memcpy(e->meta_json, p + meta->offset, meta->size);
    e->meta_json[meta->size] = 0;

    const section *gs = find_section(secs, (int)nsec, "graph");
    char *gtext = ks_try_malloc(gs->size + 1);
    ks_buf where = KS_BUF_TRY;
    ks_buf_printf(&where, "%s(graph)", path);
    if (!gtext || where.failed) {
        free(gtext);
        ks_buf_free(&where);
        open_oom(e, d, path, gs->size + 1, "the engine's graph text");
        return NULL;
    }
    memcpy(gtext, p + gs->offset, gs->size);
    gtext[gs->size] = 0;
    ks_source src = {ks_buf_cstr(&where), gtext, gs->size};
    int oom_before = d->oom;
    e->graph = kir_parse(&src, d);
    int bad_graph = !e->graph || kir_verify(e->graph, d, src.name) != 0;
    free(gtext);
    ks_buf_free(&where);
    if (bad_graph && d->oom > oom_before) { /* reported: not damage */
        krt_engine_close(e);
        return NULL;
    }
    if (bad_graph) {
        open_fail(e, d, path, "damaged: its graph does not parse or verify");
        return NULL;
    }

    if (krt_desc_init(&e->desc, e->graph, e->path, d) != 0) {
        krt_engine_close(e);
        return NULL;
    }
    /* the metadata's "dtype" (what kiln inspect shows) is the weights' own, as the description found it */
    ks_buf scratch = KS_BUF_TRY;
    const char *meta_dtype = krt_engine_meta(e, "dtype", NULL, &scratch);
    if (scratch.failed) {
        open_oom(e, d, path, scratch.failed, "the metadata's dtype");
        ks_buf_free(&scratch);
        return NULL;
    }
    const char *have = e->desc.mixed_weights ? "mixed" : kir_dtype_name(e->desc.weight_dtype);
    if (meta_dtype && strcmp(meta_dtype, have) != 0) {
        open_fail(e, d, path, "damaged: the metadata says the weights are %s, the graph says %s", meta_dtype, have);
        ks_buf_free(&scratch);
        return NULL;
    }
    ks_buf_free(&scratch);

    const section *ws = find_section(secs, (int)nsec, "weights");
    const section *wi = find_section(secs, (int)nsec, "weights.idx");
    e->weight_bytes = ws->size;
    e->weights = ks_try_calloc(e->graph->n_nodes, sizeof *e->weights);
    if (!e->weights) {
        open_oom(e, d, path, e->graph->n_nodes * sizeof *e->weights, "the engine's weight table");
        return NULL;
    }
    const uint8_t *ip = p + wi->offset;
    if (wi->size < 4 || get_u32(ip) > (wi->size - 4) / 24 || (wi->size - 4) / 24 != get_u32(ip)) {
        open_fail(e, d, path, "damaged: bad weight index");
        return NULL;
    }
    uint32_t count = get_u32(ip);
    for (uint32_t i = 0; i < count; i++) {
        const uint8_t *r = ip + 4 + (size_t)i * 24;
        uint32_t node = get_u32(r), dtype = get_u32(r + 4);
        uint64_t off = get_u64(r + 8), bytes = get_u64(r + 16);
        if (node >= e->graph->n_nodes || e->graph->nodes[node].op != KIR_OP_WEIGHT || e->weights[node]) {
            open_fail(e, d, path, "damaged: weight index entry %u names node %u, not a weight", i, node);
            return NULL;
        }
        const kir_node *n = &e->graph->nodes[node];
        const char *name = kir_attr_str(e->graph, node, KIR_A_WEIGHT_NAME);
        if (dtype != (uint32_t)n->dtype ||
            bytes != kir_dtype_bytes(n->dtype, (uint64_t)kir_elems(n, 1))) {
            open_fail(e, d, path, "damaged: weight '%s' has the wrong type or size in the index", name);
            return NULL;
        }
        if (off > ws->size || bytes > ws->size - off || (ws->offset + off) % 16) {
            open_fail(e, d, path, "damaged: weight '%s' lies outside the weights section", name);
            return NULL;
        }
        e->weights[node] = p + ws->offset + off;
        e->n_weights++;
    }
    for (size_t v = 0; v < e->graph->n_nodes; v++)
        if (e->graph->nodes[v].op == KIR_OP_WEIGHT && !e->weights[v]) {
            open_fail(e, d, path, "damaged: no data for weight '%s'", kir_attr_str(e->graph, (kir_val)v, KIR_A_WEIGHT_NAME));
            return NULL;
        }
    e->section_table = p + HEADER_SIZE;
    e->n_sections = nsec;
    const section *ts = find_section(secs, (int)nsec, "tokenizer");
    if (ts && ts->size >= 4) {
        e->tokenizer_kind = get_u32(p + ts->offset);
        e->tokenizer = p + ts->offset + 4;
        e->tokenizer_len = ts->size - 4;
    }
    return e;
}

void krt_engine_close(krt_engine *e)
{
    if (!e) return;
    krt_desc_free(&e->desc);
    kir_graph_free(e->graph);
    free(e->weights);
    free(e->meta_json);
    ks_mmap_close(&e->map);
    free((char *)e->path);
    free(e);
}

const void *krt_engine_section_data(const krt_engine *e, const char *name, size_t *size)
{
    /* the entries were checked against the file at open */
    for (uint32_t i = 0; i < e->n_sections; i++) {
        const uint8_t *t = e->section_table + (size_t)i * SECTION_ENTRY;
        if (strnlen((const char *)t, NAME_LEN) < NAME_LEN && strcmp((const char *)t, name) == 0) {
            *size = (size_t)get_u64(t + 24);
            return e->map.data + get_u64(t + 16);
        }
    }
    *size = 0;
    return NULL;
}

const char *krt_engine_meta(const krt_engine *e, const char *key, const char *dflt, ks_buf *scratch)
{
    cJSON *j = cJSON_Parse(e->meta_json);
    if (!j) return NULL; /* not JSON, or cJSON out of memory */
    const char *out = dflt;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (cJSON_IsString(v)) {
        ks_buf_clear(scratch);
        out = ks_buf_puts(scratch, v->valuestring) == 0 ? ks_buf_cstr(scratch) : NULL;
    }
    cJSON_Delete(j);
    return out;
}
