/* tokenizer.c — the tokenizer's public entry points: loading (format
 * detection, file reading), lookups, encode/decode dispatch, and the
 * streaming decoder. The formats live in tokenizer_json.c/tokenizer_hf.c
 * (Hugging Face) and tokenizer_llama2c.c (llama2.c). */
#include "runtime/text/tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

int krt_tok_ids_push(krt_tok_ids *v, int32_t id)
{
    if (v->failed) return -1;
    if (KS_TRY_GROW(v->ids, v->len + 1, v->cap, (size_t)1 << 40) != 0) {
        v->failed = (v->len + 1) * sizeof *v->ids;
        return -1;
    }
    v->ids[v->len++] = id;
    return 0;
}

void krt_tok_ids_free(krt_tok_ids *v)
{
    free(v->ids);
    memset(v, 0, sizeof *v);
}

/* ---- loading --------------------------------------------------------------------- */

static krt_tok_kind guess_kind(const uint8_t *p, size_t n)
{
    size_t i = 0;
    if (n >= 3 && p[0] == 0xEF && p[1] == 0xBB && p[2] == 0xBF) i = 3; /* UTF-8 BOM */
    while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r')) i++;
    return i < n && p[i] == '{' ? KRT_TOK_HF_JSON : KRT_TOK_LLAMA2C_BIN;
}

/* Where the first invalid UTF-8 byte is, or n. */
static size_t first_invalid_utf8(const uint8_t *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) { /* ASCII: most of a tokenizer.json */
            i++;
            continue;
        }
        size_t l = krt_tok_utf8_valid_len(p + i, n - i, NULL);
        if (!l) return i;
        i += l;
    }
    return n;
}

krt_tok *krt_tok_load_memory(ks_diag *d, const char *name, const void *data, size_t len,
                             krt_tok_kind kind)
{
    if (!name) name = "<tokenizer>";
    krt_tok *t = ks_try_calloc(1, sizeof *t);
    if (!t) return ks_error_oom(d, name, sizeof *t, "the tokenizer"), NULL;
    t->arena.fallible = 1; /* the loaders check every allocation */
    t->name = ks_arena_strdup(&t->arena, name);
    if (!t->name) {
        ks_error_oom(d, name, t->arena.failed, "the tokenizer");
        krt_tok_free(t);
        return NULL;
    }
    t->bos = t->eos = -1;
    const uint8_t *bytes = data ? data : (const uint8_t *)"";
    if (kind == KRT_TOK_AUTO) kind = guess_kind(bytes, len);
    t->kind = kind;
    int rc;
    switch (kind) {
    case KRT_TOK_HF_JSON: {
        /* Hugging Face reads tokenizer.json as a Rust str: UTF-8 or nothing. */
        size_t bad = first_invalid_utf8(bytes, len);
        if (bad < len) {
            ks_error(d, t->name, "not valid UTF-8 (byte %zu is 0x%02X)", bad, bytes[bad]);
            rc = -1;
        } else {
            rc = krt_tok_load_hf(t, (const char *)bytes, len, d);
        }
        break;
    }
    case KRT_TOK_LLAMA2C_BIN:
        rc = krt_tok_load_llama2c(t, bytes, len, d);
        break;
    default:
        ks_error(d, t->name, "unknown tokenizer kind %d", (int)kind);
        rc = -1;
        break;
    }
    if (rc) {
        krt_tok_free(t);
        return NULL;
    }
    return t;
}

krt_tok *krt_tok_load_file(ks_diag *d, const char *path, krt_tok_kind kind)
{
    size_t len;
    char *data = ks_read_file(d, path, &len);
    if (!data) return NULL;
    krt_tok *t = krt_tok_load_memory(d, path, data, len, kind);
    free(data);
    return t;
}

void krt_tok_free(krt_tok *t)
{
    if (!t) return;
    krt_tok_hf *hf = t->hf;
    if (hf) {
        for (size_t i = 0; i < hf->n_norms; i++) krt_tok_pattern_free(&hf->norms[i].pattern);
        for (size_t i = 0; i < hf->n_pretoks; i++) krt_tok_pattern_free(&hf->pretoks[i].pattern);
        for (size_t i = 0; i < hf->n_decs; i++) krt_tok_pattern_free(&hf->decs[i].pattern);
        krt_tok_pattern_free(&hf->word_char);
    }
    ks_arena_free(&t->arena);
    free(t);
}

/* ---- lookups --------------------------------------------------------------------------- */

krt_tok_kind krt_tok_kind_of(const krt_tok *t) { return t->kind; }
int32_t krt_tok_vocab_size(const krt_tok *t) { return t->n_vocab; }
int32_t krt_tok_bos(const krt_tok *t) { return t->bos; }
int32_t krt_tok_eos(const krt_tok *t) { return t->eos; }

void krt_tok_set_bos_eos(krt_tok *t, int32_t bos, int32_t eos)
{
    if (bos >= 0) t->bos = bos;
    if (eos >= 0) t->eos = eos;
}

const char *krt_tok_piece(const krt_tok *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_vocab || !t->pieces[id].p) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = t->pieces[id].len;
    return t->pieces[id].p;
}

int32_t krt_tok_lookup(const krt_tok *t, const char *piece, size_t len)
{
    if (t->hf) /* added tokens first, as HF's token_to_id */
        for (size_t i = t->hf->n_added; i-- > 0;) {
            const krt_tok_added *a = &t->hf->added[i];
            if (a->content.len == len && memcmp(a->content.p, piece, len) == 0) return a->id;
        }
    return krt_tok_strmap_get(&t->vocab, piece, len);
}

int krt_tok_is_special(const krt_tok *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && t->special[id];
}

/* ---- encode / decode ---------------------------------------------------------------------- */

int krt_tok_encode(const krt_tok *t, const char *text, size_t len, int flags, krt_tok_ids *out,
                   ks_diag *d)
{
    if (!text) text = "", len = 0;
    if (t->kind == KRT_TOK_LLAMA2C_BIN) return krt_tok_encode_llama2c(t, text, len, flags, out, d);
    return krt_tok_encode_hf(t, text, len, flags, out, d);
}

void krt_tok_decode(const krt_tok *t, const int32_t *ids, size_t n, int flags, ks_buf *out)
{
    if (t->kind == KRT_TOK_LLAMA2C_BIN)
        krt_tok_decode_llama2c(t, ids, n, flags, out);
    else
        krt_tok_decode_hf(t, ids, n, flags, out);
}

/* ---- streaming ------------------------------------------------------------------------------ */

struct krt_tok_stream {
    const krt_tok *t;     /* the tokenizer */
    int flags;            /* decode flags */
    krt_tok_ids ids;      /* the window: already-emitted context, then pending ids */
    size_t prefix_index;  /* ids[prefix_index..] have not been emitted */
    ks_buf prefix;        /* decode of the window's emitted context (fallible) */
    ks_buf text;          /* scratch: decode of the whole window (fallible) */
};

krt_tok_stream *krt_tok_stream_new(const krt_tok *t, int flags)
{
    krt_tok_stream *s = ks_try_calloc(1, sizeof *s);
    if (!s) return NULL;
    s->t = t;
    s->flags = flags;
    s->prefix.fallible = s->text.fallible = 1;
    return s;
}

/* The stream's own memory ran out (its window, or a decode of it): out has
 * an incomplete text now (ks_buf_fail), and the stream starts over. */
static size_t stream_failed(krt_tok_stream *s, ks_buf *out)
{
    size_t bytes = s->ids.failed ? s->ids.failed : s->text.failed ? s->text.failed : s->prefix.failed;
    s->ids.len = 0;
    s->ids.failed = 0;
    s->prefix_index = 0;
    ks_buf_clear(&s->prefix);
    ks_buf_clear(&s->text);
    ks_buf_fail(out, bytes);
    return 0;
}

void krt_tok_stream_free(krt_tok_stream *s)
{
    if (!s) return;
    krt_tok_ids_free(&s->ids);
    ks_buf_free(&s->prefix);
    ks_buf_free(&s->text);
    free(s);
}

static int ends_with_replacement(const ks_buf *b)
{
    return b->len >= 3 && memcmp(b->data + b->len - 3, "\xEF\xBF\xBD", 3) == 0;
}

/* Bytes that `text` shares with `prefix` at its start, cut back to a
 * character boundary. */
static size_t common_prefix(const ks_buf *text, const ks_buf *prefix)
{
    size_t n = text->len < prefix->len ? text->len : prefix->len, i = 0;
    while (i < n && text->data[i] == prefix->data[i]) i++;
    while (i > 0 && i < text->len && ((uint8_t)text->data[i] & 0xC0) == 0x80) i--;
    return i;
}

size_t krt_tok_stream_push(krt_tok_stream *s, int32_t id, ks_buf *out)
{
    krt_tok_ids_push(&s->ids, id);
    ks_buf_clear(&s->text);
    if (!s->ids.failed) krt_tok_decode(s->t, s->ids.ids, s->ids.len, s->flags, &s->text);
    if (s->ids.failed || s->text.failed) return stream_failed(s, out);
    if (s->text.len <= s->prefix.len || ends_with_replacement(&s->text)) {
        ks_buf_put(out, "", 0); /* NUL-terminated even when nothing was added */
        return 0;
    }
    /* Decoders are prefix-stable (the window's text starts with the
     * context's text); if one were not, emit from where they part. */
    size_t from = common_prefix(&s->text, &s->prefix);
    size_t n = s->text.len - from;
    ks_buf_put(out, s->text.data + from, n);
    if (s->t->hf && s->t->hf->stream_from_start) {
        /* Decoders that are not prefix-stable: every step decodes from the first id. */
        ks_buf_clear(&s->prefix);
        ks_buf_put(&s->prefix, s->text.data, s->text.len);
        if (s->prefix.failed) return stream_failed(s, out);
        s->prefix_index = s->ids.len;
        return n;
    }
    /* Keep the newly emitted ids as the next window's context. */
    size_t new_prefix_index = s->ids.len - s->prefix_index;
    memmove(s->ids.ids, s->ids.ids + s->prefix_index,
            (s->ids.len - s->prefix_index) * sizeof *s->ids.ids);
    s->ids.len -= s->prefix_index;
    ks_buf_clear(&s->prefix);
    krt_tok_decode(s->t, s->ids.ids, s->ids.len, s->flags, &s->prefix);
    if (s->prefix.failed) return stream_failed(s, out);
    s->prefix_index = new_prefix_index;
    return n;
}

size_t krt_tok_stream_flush(krt_tok_stream *s, ks_buf *out)
{
    size_t n = 0;
    if (s->prefix_index < s->ids.len) {
        ks_buf_clear(&s->text);
        krt_tok_decode(s->t, s->ids.ids, s->ids.len, s->flags, &s->text);
        if (s->text.failed) return stream_failed(s, out);
        size_t from = common_prefix(&s->text, &s->prefix);
        if (s->text.len > from) {
            n = s->text.len - from;
            ks_buf_put(out, s->text.data + from, n);
        }
    }
    ks_buf_put(out, "", 0); /* NUL-terminated even when nothing was added */
    s->ids.len = 0;
    s->prefix_index = 0;
    ks_buf_clear(&s->prefix);
    return n;
}
