/* tokenizer_llama2c.c — llama2.c's tokenizer.bin, encoded and decoded as its
 * run.c does (Karpathy's llama2.c, `encode` and `decode`):
 *  - file: int32 max_token_length, then per token float score, int32 len and
 *    len bytes, to the end of the file;
 *  - encode: optional BOS (id 1), a dummy-prefix " " token when the text is
 *    non-empty, one token per UTF-8 code point that is in the vocabulary
 *    and otherwise one token per byte (id = byte + 3), then merge the pair
 *    whose concatenation scores best until none is in the vocabulary
 *    (tokenizer_bpe.c does this with a heap), optional EOS (id 2);
 *  - decode: a token right after BOS loses its leading space; a piece that
 *    reads like "<0x41>" is that raw byte.
 * run.c treats text and pieces as C strings: both stop at a NUL here too. */
#include "runtime/text/tokenizer_internal.h"

#include <ctype.h>
#include <string.h>

enum { LLAMA2C_UNK = 0, LLAMA2C_BOS = 1, LLAMA2C_EOS = 2, LLAMA2C_BYTE0 = 3 };

int krt_tok_load_llama2c(krt_tok *t, const uint8_t *data, size_t len, ks_diag *d)
{
    if (len < 4) {
        ks_error(d, t->name, "too short for a llama2.c tokenizer (%zu bytes; the header alone is 4)",
                 len);
        return -1;
    }
    t->max_token_len = ks_load_le_i32(data);
    if (t->max_token_len < 0) {
        ks_error(d, t->name, "bad llama2.c tokenizer header: max_token_length is %d",
                 (int)t->max_token_len);
        return -1;
    }
    /* First pass: count and check the entries. */
    size_t n = 0;
    for (size_t off = 4; off < len; n++) {
        if (len - off < 8) {
            ks_error(d, t->name, "token %zu at byte %zu: the file ends inside its header (%zu of 8 bytes)",
                     n, off, len - off);
            return -1;
        }
        int32_t l = ks_load_le_i32(data + off + 4);
        if (l < 0) {
            ks_error(d, t->name, "token %zu at byte %zu: negative length %d", n, off, (int)l);
            return -1;
        }
        if ((size_t)l > len - off - 8) {
            ks_error(d, t->name, "token %zu at byte %zu: length %d runs past the end of the file (%zu bytes left)",
                     n, off, (int)l, len - off - 8);
            return -1;
        }
        if (n + 1 >= KRT_TOK_MAX_ID) {
            ks_error(d, t->name, "more than %d tokens", KRT_TOK_MAX_ID);
            return -1;
        }
        off += 8 + (size_t)l;
    }
    if (n == 0) {
        ks_error(d, t->name, "no tokens after the header");
        return -1;
    }
    t->n_vocab = (int32_t)n;
    t->pieces = ks_arena_alloc(&t->arena, n * sizeof *t->pieces);
    t->scores = ks_arena_alloc(&t->arena, n * sizeof *t->scores);
    t->special = ks_arena_alloc(&t->arena, n);
    if (!t->pieces || !t->scores || !t->special || krt_tok_strmap_init(&t->vocab, &t->arena, n) != 0)
        return ks_error_oom(d, t->name, t->arena.failed, "the tokenizer");
    size_t off = 4;
    for (size_t i = 0; i < n; i++) {
        ks_decode_f32(data + off, KS_FLOAT_F32, 1, &t->scores[i]);
        size_t l = (size_t)ks_load_le_i32(data + off + 4);
        char *p = ks_arena_strndup(&t->arena, (const char *)data + off + 8, l);
        if (!p) return ks_error_oom(d, t->name, t->arena.failed, "the tokenizer");
        t->pieces[i].p = p;
        t->pieces[i].len = (uint32_t)l;
        /* run.c looks pieces up as C strings; of equal strings the lowest id wins. */
        krt_tok_strmap_put_first(&t->vocab, p, strlen(p), (int32_t)i);
        off += 8 + l;
    }
    for (int32_t i = 0; i <= LLAMA2C_EOS && i < t->n_vocab; i++) t->special[i] = 1;
    t->bos = t->n_vocab > LLAMA2C_BOS ? LLAMA2C_BOS : -1;
    t->eos = t->n_vocab > LLAMA2C_EOS ? LLAMA2C_EOS : -1;
    return 0;
}

int krt_tok_encode_llama2c(const krt_tok *t, const char *text, size_t len, int flags, krt_tok_ids *out,
                           ks_diag *d)
{
    len = strnlen(text, len);
    size_t mark = out->len;
    krt_tok_work w = KRT_TOK_WORK_INIT;
    if ((flags & KRT_TOK_ADD_SPECIAL) && t->bos >= 0) krt_tok_work_push_sym(&w, t->bos, 1);
    if (len > 0) {
        int32_t dummy = krt_tok_strmap_get(&t->vocab, " ", 1);
        if (dummy >= 0) krt_tok_work_push_sym(&w, dummy, 1);
    }
    /* Code points as run.c cuts them: a new one starts at any byte that is
     * not a continuation byte, and at most 4 bytes go into one. */
    char cp[4];
    size_t cp_len = 0;
    for (size_t i = 0; i < len; i++) {
        uint8_t c = (uint8_t)text[i];
        if ((c & 0xC0) != 0x80) cp_len = 0;
        cp[cp_len++] = (char)c;
        uint8_t next = i + 1 < len ? (uint8_t)text[i + 1] : 0;
        if ((next & 0xC0) == 0x80 && cp_len < 4) continue;
        int32_t id = krt_tok_strmap_get(&t->vocab, cp, cp_len);
        if (id >= 0) {
            krt_tok_work_push_sym(&w, id, (uint32_t)cp_len);
        } else {
            for (size_t k = 0; k < cp_len; k++) {
                int32_t b = (int32_t)(uint8_t)cp[k] + LLAMA2C_BYTE0;
                krt_tok_work_push_sym(&w, b < t->n_vocab ? b : LLAMA2C_UNK, 1);
            }
        }
        cp_len = 0;
    }
    krt_tok_merge_scored(&w, t);
    if (!krt_tok_work_failed(&w)) krt_tok_work_emit(&w, out);
    if ((flags & KRT_TOK_ADD_EOS) && t->eos >= 0) krt_tok_ids_push(out, t->eos);
    size_t failed = w.failed ? w.failed : w.scratch.failed ? w.scratch.failed : out->failed;
    krt_tok_work_free(&w);
    if (failed) {
        out->len = mark;
        out->failed = 0;
        char what[64];
        snprintf(what, sizeof what, "encoding %zu bytes of text", len);
        if (d) ks_error_oom(d, t->name, failed, what);
        return -1;
    }
    return 0;
}

/* sscanf(piece, "<0x%02hhX>", &byte) == 1, spelled out. */
static int parse_byte_piece(const char *p, size_t n, uint8_t *byte)
{
    if (n < 4 || memcmp(p, "<0x", 3) != 0) return 0;
    size_t i = 3;
    while (i < n && isspace((unsigned char)p[i])) i++;
    int width = 2, neg = 0, digits = 0;
    unsigned value = 0;
    if (i < n && (p[i] == '+' || p[i] == '-')) {
        neg = p[i] == '-';
        i++;
        width--;
    }
    for (; width > 0 && i < n && isxdigit((unsigned char)p[i]); i++, width--, digits++) {
        int c = p[i];
        value = value * 16 + (unsigned)(isdigit(c) ? c - '0' : (tolower(c) - 'a' + 10));
    }
    if (!digits) return 0;
    *byte = (uint8_t)(neg ? 0u - value : value);
    return 1;
}

void krt_tok_decode_llama2c(const krt_tok *t, const int32_t *ids, size_t n, int flags, ks_buf *out)
{
    ks_buf raw = KS_BUF_TRY;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i], prev = i > 0 ? ids[i - 1] : -1;
        if (id < 0 || id >= t->n_vocab) continue;
        if ((flags & KRT_TOK_SKIP_SPECIAL) && t->special[id]) continue;
        const char *p = t->pieces[id].p;
        size_t len = strlen(p);
        /* After BOS, sentencepiece's decoder drops the leading space (run.c, PR #89). */
        if (prev == LLAMA2C_BOS && p[0] == ' ') p++, len--;
        uint8_t byte;
        if (parse_byte_piece(p, len, &byte))
            ks_buf_put(&raw, &byte, 1);
        else if (len)
            ks_buf_put(&raw, p, len);
    }
    if (raw.failed)
        ks_buf_fail(out, raw.failed);
    else
        krt_tok_utf8_lossy(out, raw.data ? raw.data : "", raw.len);
    ks_buf_put(out, "", 0); /* NUL-terminated even when nothing was added */
    ks_buf_free(&raw);
}
