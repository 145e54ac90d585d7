/*
 * tokenizer.h — text to token ids and back.
 *
 * Two formats load:
 *  - a Hugging Face tokenizer.json with a BPE model, in both common forms:
 *    byte-level BPE behind a regex pre-tokenizer (GPT-2, Llama-3, Qwen2) and
 *    SentencePiece-style BPE over "▁" with byte fallback (Llama-2, TinyStories).
 *    Encoding follows Hugging Face's `tokenizers` step by step: added tokens
 *    are cut out first (raw ones from the input, normalized ones from the
 *    normalized text), then normalizers, pre-tokenizers, the BPE model and,
 *    with KRT_TOK_ADD_SPECIAL, the post-processor's template;
 *  - llama2.c's tokenizer.bin, encoded and decoded exactly as its run.c does.
 *
 * Merging is O(n log n) in the length of a word: a linked list of symbols and
 * a binary heap of candidate pairs (the textbook linked-list BPE); vocabulary
 * and merge lookups are hash maps.
 *
 *     ks_diag d = {0};
 *     krt_tok *tok = krt_tok_load_file(&d, "tokenizer.json", KRT_TOK_AUTO);
 *     krt_tok_ids ids = {0};
 *     krt_tok_encode(tok, text, strlen(text), KRT_TOK_ADD_SPECIAL, &ids, &d);
 *     ks_buf out = {0};
 *     krt_tok_decode(tok, ids.ids, ids.len, 0, &out);   // out.data == text
 *
 *     krt_tok_stream *st = krt_tok_stream_new(tok, KRT_TOK_SKIP_SPECIAL);
 *     for each generated id: krt_tok_stream_push(st, id, &out);  // whole characters only
 *     krt_tok_stream_flush(st, &out);
 *     krt_tok_stream_free(st);
 *     krt_tok_ids_free(&ids); ks_buf_free(&out); krt_tok_free(tok);
 *
 * A loaded tokenizer is read-only: encode and decode may run on several
 * threads at once. Decoded text is always valid UTF-8 (invalid bytes come
 * out as U+FFFD, as Hugging Face's decode does).
 *
 * Prefix: krt_tok_ (runtime, tokenizer).
 */
#ifndef KILN_TOKENIZER_H
#define KILN_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "support/support.h"

typedef enum krt_tok_kind {
    KRT_TOK_AUTO = 0,        /* guess from the bytes: '{' first means tokenizer.json */
    KRT_TOK_HF_JSON = 1,     /* Hugging Face tokenizer.json (BPE model) */
    KRT_TOK_LLAMA2C_BIN = 2, /* llama2.c tokenizer.bin: int32 max_token_length, then
                                per token: float score, int32 len, len bytes */
} krt_tok_kind;

/* Flags for encode and decode. */
enum {
    KRT_TOK_ADD_SPECIAL = 1 << 0,  /* encode: add BOS etc. (HF: the post-processor's
                                      template; llama2.c: BOS, as run.c's bos=1) */
    KRT_TOK_ADD_EOS = 1 << 1,      /* encode, llama2.c only: append EOS (run.c's eos=1) */
    KRT_TOK_SKIP_SPECIAL = 1 << 2, /* decode: leave special tokens out */
};

typedef struct krt_tok krt_tok;

/* A growable array of ids; encode appends to it. */
typedef struct krt_tok_ids {
    int32_t *ids;  /* [len] */
    size_t len;    /* ids stored */
    size_t cap;    /* ids allocated */
    size_t failed; /* 0, or the bytes a push could not get (ids are missing); encode clears it when it
                      reports the failure */
} krt_tok_ids;

void krt_tok_ids_free(krt_tok_ids *v);

/* Load. Errors (unreadable file, bad JSON with its line and column,
 * unsupported model or component, inconsistent vocabulary or merges,
 * truncated .bin) are reported through d as `name: error: ...` or
 * `name:line:col: error: ...` and NULL is returned. `name` names the bytes
 * in messages. */
krt_tok *krt_tok_load_file(ks_diag *d, const char *path, krt_tok_kind kind);
krt_tok *krt_tok_load_memory(ks_diag *d, const char *name, const void *data, size_t len,
                             krt_tok_kind kind);
void krt_tok_free(krt_tok *t);

krt_tok_kind krt_tok_kind_of(const krt_tok *t);
/* Largest id + 1 (the model's vocabulary and the added tokens). */
int32_t krt_tok_vocab_size(const krt_tok *t);
/* BOS / EOS ids, -1 when the tokenizer does not say. For tokenizer.json:
 * BOS is the special token the post-processor puts first; EOS the special
 * token it puts last, else a special added token named like an end of text
 * (</s>, <|endoftext|>, <|end_of_text|>, <|eot_id|>, <|im_end|>, <eos>,
 * <|end_story|>). llama2.c: 1 and 2. The engine overrides them from the
 * model's config with krt_tok_set_bos_eos. */
int32_t krt_tok_bos(const krt_tok *t);
int32_t krt_tok_eos(const krt_tok *t);
void krt_tok_set_bos_eos(krt_tok *t, int32_t bos, int32_t eos); /* -1 keeps the current one */
/* The id's text as the vocabulary writes it ("Ġthe", "▁the", "<0x0A>",
 * "<|endoftext|>"); NULL for an id with no entry. *len gets its bytes. */
const char *krt_tok_piece(const krt_tok *t, int32_t id, size_t *len);
/* The id of a vocabulary entry or added token, -1 when absent. */
int32_t krt_tok_lookup(const krt_tok *t, const char *piece, size_t len);
int krt_tok_is_special(const krt_tok *t, int32_t id);

/* Append the ids of text[0..len) to out. Text that is not valid UTF-8 is
 * repaired first for tokenizer.json (each invalid part becomes U+FFFD), and
 * taken byte by byte for llama2.c. Returns 0, or -1 with a message through
 * d (when not NULL) when the tokenizer cannot encode it: a model whose
 * unk_token is not in its vocabulary met an unknown character, a
 * pre-tokenizer regex hit its backtracking limit, or memory ran out (out is
 * then as it was). */
int krt_tok_encode(const krt_tok *t, const char *text, size_t len, int flags, krt_tok_ids *out,
                   ks_diag *d);

/* Append the text of ids[0..n) to out (NUL-terminated). Ids without an
 * entry are skipped. Out of memory marks a fallible out failed (its text is
 * incomplete: ks_buf_fail), and ends the process for one that is not. */
void krt_tok_decode(const krt_tok *t, const int32_t *ids, size_t n, int flags, ks_buf *out);

/* Streaming decode: push ids one at a time; only whole characters come out,
 * so a character split across tokens (byte fallback, byte-level) appears
 * when its last byte arrives. The concatenation of everything pushed and
 * flushed equals krt_tok_decode of all the ids whenever that text has no
 * U+FFFD (for bytes that are not UTF-8, decode follows Hugging Face's rules
 * for a whole run of byte tokens, which a stream cannot know in advance).
 * (Hugging Face's DecodeStream: re-decode a short window of ids and emit
 * what grew; decoders that strip more than one leading character or any
 * trailing one re-decode from the first id instead.) */
typedef struct krt_tok_stream krt_tok_stream;

krt_tok_stream *krt_tok_stream_new(const krt_tok *t, int flags); /* NULL: out of memory */
/* Appends new text to out; returns the bytes appended. Out of memory, as
 * krt_tok_decode: a fallible out is marked failed (the stream must then be
 * flushed or freed, not pushed to again). */
size_t krt_tok_stream_push(krt_tok_stream *s, int32_t id, ks_buf *out);
/* End of the stream: appends what was held back (an incomplete character
 * comes out as U+FFFD) and starts over. Returns the bytes appended. */
size_t krt_tok_stream_flush(krt_tok_stream *s, ks_buf *out);
void krt_tok_stream_free(krt_tok_stream *s);

#endif
