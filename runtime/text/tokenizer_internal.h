/*
 * tokenizer_internal.h — what the tokenizer's files share and nobody else
 * sees: the krt_tok record, the maps, the compiled Hugging Face pipeline
 * (normalizers, pre-tokenizers, decoders, post-processor), the regex
 * wrapper and the UTF-8 helpers.
 *
 * Files:
 *   tokenizer.c         public entry points: load, free, decode, streaming
 *   tokenizer_map.c     string -> id and (id, id) -> merge hash maps
 *   tokenizer_utf8.c    UTF-8 decoding, lossy repair, Unicode whitespace
 *   tokenizer_regex.c   the PCRE2 wrapper (find every match, replace)
 *   tokenizer_json.c    tokenizer.json -> krt_tok (cJSON)
 *   tokenizer_hf.c      the Hugging Face encode pipeline and decoder chain
 *   tokenizer_bpe.c     the two BPE merge loops (rank-ordered, score-ordered)
 *   tokenizer_llama2c.c llama2.c's tokenizer.bin: load, encode, decode
 */
#ifndef KILN_TOKENIZER_INTERNAL_H
#define KILN_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "runtime/text/tokenizer.h"

/* Ids are below this: a vocabulary is a dense array indexed by id. */
#define KRT_TOK_MAX_ID (1 << 23)

/* A byte string owned by the tokenizer's arena (or by the caller's input). */
typedef struct krt_tok_str {
    const char *p; /* bytes; NUL-terminated when owned by the arena */
    uint32_t len;  /* bytes */
} krt_tok_str;

/* ---- maps (tokenizer_map.c) ------------------------------------------------ */

/* Byte string -> id: a ks_hmap with string keys (not copied) in the owner's arena,
 * for the entries the file declares. */
typedef ks_hmap krt_tok_strmap;

/* Room for n keys, and no more: 0, or -1 when out of memory (a fallible arena's).
 * The puts then allocate nothing. */
int krt_tok_strmap_init(krt_tok_strmap *m, ks_arena *a, size_t n);
/* Insert or overwrite (the later of two equal keys wins, as in a JSON
 * object read into a hash map). Returns the previous value or -1. */
int32_t krt_tok_strmap_put(krt_tok_strmap *m, const char *key, size_t len, int32_t val);
/* Insert only when absent; returns the value now stored. */
int32_t krt_tok_strmap_put_first(krt_tok_strmap *m, const char *key, size_t len, int32_t val);
/* The id of key, or -1. Inline: encoding looks up every candidate merge. */
static inline int32_t krt_tok_strmap_get(const krt_tok_strmap *m, const char *key, size_t len)
{
    const uint64_t *v = ks_hmap_get_str(m, key, len);
    return v ? (int32_t)*v : -1;
}

/* (left id, right id) -> (rank, merged id): a ks_hmap with u64 keys left << 32 | right
 * and values rank << 32 | merged. */
typedef ks_hmap krt_tok_pairmap;

/* Two 32-bit numbers as one 64-bit key or value, the first in the high half. */
static inline uint64_t krt_tok_pair(int32_t hi, int32_t lo) { return (uint64_t)(uint32_t)hi << 32 | (uint32_t)lo; }

int krt_tok_pairmap_init(krt_tok_pairmap *m, ks_arena *a, size_t n); /* as krt_tok_strmap_init */
void krt_tok_pairmap_put(krt_tok_pairmap *m, int32_t left, int32_t right, int32_t rank, int32_t merged);
/* Whether the pair merges; if so its rank (merge priority, lower first: the merge's
 * line in the list) and the id of left + right. Inline, as krt_tok_strmap_get. */
static inline int krt_tok_pairmap_get(const krt_tok_pairmap *m, int32_t left, int32_t right, int32_t *rank,
                                      int32_t *merged)
{
    if (left < 0 || right < 0) return 0;
    const uint64_t *v = ks_hmap_get_u64(m, krt_tok_pair(left, right));
    if (!v) return 0;
    *rank = (int32_t)(*v >> 32);
    *merged = (int32_t)(uint32_t)*v;
    return 1;
}

/* ---- UTF-8 (tokenizer_utf8.c) ---------------------------------------------- */

/* Length of the valid UTF-8 sequence at s[0..n), 0 when it is not one
 * (Rust's str rules: no overlongs, no surrogates, at most U+10FFFF). */
size_t krt_tok_utf8_valid_len(const uint8_t *s, size_t n, uint32_t *cp);
/* Bytes of the "character" at s: a valid sequence, or 1 for a stray byte. */
size_t krt_tok_utf8_char_len(const uint8_t *s, size_t n);
/* Append s with every invalid part replaced by U+FFFD, one per maximal
 * invalid subpart (Rust's String::from_utf8_lossy). A fallible out that
 * cannot grow is marked failed. */
void krt_tok_utf8_lossy(ks_buf *out, const char *s, size_t n);
/* 1 when s[0..n) is valid UTF-8. */
int krt_tok_utf8_is_valid(const char *s, size_t n);
/* How many bytes at the end of s[0..n) are an incomplete but so far valid
 * start of a character (0..3). */
size_t krt_tok_utf8_incomplete_tail(const char *s, size_t n);
/* Unicode White_Space (Rust's char::is_whitespace and regex \s). */
int krt_tok_is_space(uint32_t cp);

/* ---- regex (tokenizer_regex.c) --------------------------------------------- */

/* A compiled pattern: PCRE2 with UTF + UCP, or a literal string. Patterns
 * from tokenizer.json are Oniguruma (Ruby syntax) in Hugging Face's
 * library; the ones tokenizers use (GPT-2, Llama-3, Qwen2) mean the same to
 * PCRE2. */
typedef struct krt_tok_pattern {
    pcre2_code *code;    /* NULL for a literal */
    const char *literal; /* the literal's bytes when code is NULL */
    size_t literal_len;  /* its length; 0 matches nothing (as in HF) */
} krt_tok_pattern;

/* A match found by krt_tok_find_all. */
typedef struct krt_tok_span {
    size_t start; /* byte offset of the first byte */
    size_t end;   /* byte offset past the last byte */
} krt_tok_span;

/* Per-call scratch for matching (PCRE2 match data). */
typedef struct krt_tok_matcher {
    pcre2_match_data *md;      /* room for the whole match only (captures are not read) */
    pcre2_match_context *mctx; /* bounded backtracking */
    krt_tok_span *spans;       /* matches of the last krt_tok_find_all */
    size_t n_spans;            /* matches stored */
    size_t cap_spans;          /* spans allocated */
    pcre2_general_context *gctx; /* PCRE2's allocations through support's (fallible, counted by the fault
                                    injection); NULL until a regex needs it */
} krt_tok_matcher;

/* Compile `re` (regex) into p; reports `what: ...` through d and returns -1. */
int krt_tok_pattern_regex(krt_tok_pattern *p, const char *re, size_t len, ks_diag *d,
                          const char *file, const char *what);
void krt_tok_pattern_literal(krt_tok_pattern *p, const char *s, size_t len);
void krt_tok_pattern_free(krt_tok_pattern *p);
/* 0, or -1 when out of memory (m then frees cleanly). */
int krt_tok_matcher_init(krt_tok_matcher *m);
void krt_tok_matcher_free(krt_tok_matcher *m);
/* Every non-overlapping match of p in s[0..n) (valid UTF-8), left to right,
 * into m->spans. Returns 0; -1 when the regex engine gave up (match limit):
 * the text is then left unsplit; -2 when out of memory (no spans). */
int krt_tok_find_all(krt_tok_matcher *m, const krt_tok_pattern *p, const char *s, size_t n);
/* 1 when the regex p matches the whole character at s[0..n), else 0; -2 out of memory. */
int krt_tok_char_matches(krt_tok_matcher *m, const krt_tok_pattern *p, const char *s, size_t n);

/* ---- the Hugging Face pipeline (tokenizer_json.c builds, tokenizer_hf.c runs) */

typedef enum krt_tok_norm_kind {
    KRT_NORM_PREPEND,   /* prepend `text` to a non-empty string */
    KRT_NORM_REPLACE,   /* replace every match of `pattern` by `text` */
    KRT_NORM_STRIP,     /* strip White_Space at the left and/or right */
    KRT_NORM_BYTELEVEL, /* map each byte to its GPT-2 printable character */
} krt_tok_norm_kind;

typedef struct krt_tok_norm {
    krt_tok_norm_kind kind;  /* what it does */
    krt_tok_str text;        /* PREPEND: the text; REPLACE: the replacement */
    krt_tok_pattern pattern; /* REPLACE: what is replaced */
    int left, right;         /* STRIP: which ends */
} krt_tok_norm;

typedef enum krt_tok_split_behavior {
    KRT_SPLIT_REMOVED,             /* matches are dropped */
    KRT_SPLIT_ISOLATED,            /* matches are pieces of their own */
    KRT_SPLIT_MERGED_WITH_PREVIOUS,/* a match joins the piece before it */
    KRT_SPLIT_MERGED_WITH_NEXT,    /* a match joins the piece after it */
    KRT_SPLIT_CONTIGUOUS,          /* runs of matches become one piece */
} krt_tok_split_behavior;

typedef enum krt_tok_prepend_scheme {
    KRT_PREPEND_ALWAYS, /* every piece gets the replacement in front */
    KRT_PREPEND_FIRST,  /* only the piece at the start of the input */
    KRT_PREPEND_NEVER,  /* none */
} krt_tok_prepend_scheme;

typedef enum krt_tok_pretok_kind {
    KRT_PRETOK_BYTELEVEL, /* optional GPT-2 regex split, then bytes -> characters */
    KRT_PRETOK_SPLIT,     /* split on a pattern with a behavior */
    KRT_PRETOK_METASPACE, /* ' ' -> replacement, prepend, optional split */
} krt_tok_pretok_kind;

typedef struct krt_tok_pretok {
    krt_tok_pretok_kind kind;        /* what it does */
    int add_prefix_space;            /* BYTELEVEL: prepend ' ' to a piece not starting with one */
    int use_regex;                   /* BYTELEVEL: split with the GPT-2 pattern first */
    krt_tok_pattern pattern;         /* SPLIT: where to split (BYTELEVEL: GPT-2's pattern) */
    krt_tok_split_behavior behavior; /* SPLIT */
    int invert;                      /* SPLIT: the pattern marks what is kept */
    krt_tok_str replacement;         /* METASPACE: UTF-8 of the replacement character */
    krt_tok_prepend_scheme prepend;  /* METASPACE */
    int split;                       /* METASPACE: split before each replacement */
} krt_tok_pretok;

typedef enum krt_tok_dec_kind {
    KRT_DEC_BYTELEVEL,    /* GPT-2 characters -> bytes, all tokens fused, lossy UTF-8 */
    KRT_DEC_REPLACE,      /* replace `pattern` by `text` in each token */
    KRT_DEC_BYTEFALLBACK, /* runs of <0xNN> tokens -> the bytes they spell */
    KRT_DEC_FUSE,         /* join all tokens into one */
    KRT_DEC_STRIP,        /* strip `start`/`stop` copies of `ch` from each token */
    KRT_DEC_METASPACE,    /* replacement -> ' ', dropped in the first token */
} krt_tok_dec_kind;

typedef struct krt_tok_dec {
    krt_tok_dec_kind kind;          /* what it does */
    krt_tok_pattern pattern;        /* REPLACE */
    krt_tok_str text;               /* REPLACE: replacement; METASPACE: replacement character */
    uint32_t ch;                    /* STRIP: the character stripped */
    int start, stop;                /* STRIP: how many at most at each end */
    krt_tok_prepend_scheme prepend; /* METASPACE */
} krt_tok_dec;

/* A token added on top of the model's vocabulary (added_tokens[]). */
typedef struct krt_tok_added {
    krt_tok_str content; /* as written in the file */
    krt_tok_str match;   /* what encode looks for: content, or normalized content */
    int32_t id;          /* the id Hugging Face's library gives it */
    int32_t owner;       /* index of the last added token with this id: its options and
                            text are the ones that count */
    uint8_t special;     /* skipped by KRT_TOK_SKIP_SPECIAL */
    uint8_t normalized;  /* matched in the normalized text */
    uint8_t lstrip;      /* takes the White_Space on its left */
    uint8_t rstrip;      /* takes the White_Space on its right */
    uint8_t single_word; /* only between non-word characters */
} krt_tok_added;

/* Added tokens to look for in one kind of text, by first byte, longest first. */
typedef struct krt_tok_added_set {
    int32_t *order;     /* indices into hf->added, grouped by first byte, longest first */
    uint32_t first[257];/* order[first[b] .. first[b+1]) start with byte b */
    size_t n;           /* entries in order */
} krt_tok_added_set;

typedef enum krt_tok_post_kind {
    KRT_POST_NONE,     /* ids are left as they are */
    KRT_POST_TEMPLATE, /* `before` + ids + `after` */
} krt_tok_post_kind;

typedef struct krt_tok_hf {
    /* model: BPE */
    krt_tok_pairmap merges;      /* (left, right) -> (rank, merged) */
    int32_t unk_id;              /* -1: none */
    krt_tok_str unk_token;       /* the unk token's text, when unk_id < 0 but one is named */
    int has_unk;                 /* the model names an unk token */
    int byte_fallback;           /* unknown characters -> <0xNN> tokens */
    int fuse_unk;                /* consecutive unknowns -> one unk */
    int ignore_merges;           /* a whole piece found in the vocabulary is one token */
    krt_tok_str cont_prefix;     /* continuing_subword_prefix ("" when none) */
    krt_tok_str word_suffix;     /* end_of_word_suffix ("" when none) */
    int32_t byte_ids[256];       /* id of <0xNN>, -1 when absent */
    /* added tokens */
    krt_tok_added *added;        /* [n_added] */
    size_t n_added;              /* entries in added */
    krt_tok_added_set raw_set;   /* non-normalized: matched in the input text */
    krt_tok_added_set norm_set;  /* normalized: matched after the normalizers */
    krt_tok_pattern word_char;   /* \w, for single_word tokens */
    int has_single_word;         /* some added token is single_word */
    /* pipeline */
    krt_tok_norm *norms;         /* [n_norms], applied in order */
    size_t n_norms;
    krt_tok_pretok *pretoks;     /* [n_pretoks], applied in order */
    size_t n_pretoks;
    krt_tok_dec *decs;           /* [n_decs], applied in order */
    size_t n_decs;
    int has_decoder;             /* 0: tokens are joined with ' ' */
    int stream_from_start;       /* the decoders are not prefix-stable (Strip of more than one
                                    leading or of any trailing character): streaming re-decodes
                                    from the first id instead of a short window */
    /* post-processor */
    krt_tok_post_kind post;      /* what add-special does */
    int32_t *post_before;        /* [n_post_before] ids put before the text's */
    size_t n_post_before;
    int32_t *post_after;         /* [n_post_after] ids put after */
    size_t n_post_after;
} krt_tok_hf;

/* ---- the tokenizer ---------------------------------------------------------- */

struct krt_tok {
    krt_tok_kind kind;      /* which format it came from */
    char *name;             /* file name for diagnostics (arena) */
    ks_arena arena;         /* owns everything the tokenizer holds */
    int32_t n_vocab;        /* largest id + 1 */
    krt_tok_str *pieces;    /* [n_vocab] each id's text as the model writes it; p NULL: no such id */
    uint8_t *special;       /* [n_vocab] 1 for special tokens */
    krt_tok_strmap vocab;   /* model vocabulary: text -> id */
    int32_t bos, eos;       /* -1: unknown */
    /* llama2.c */
    float *scores;          /* [n_vocab] merge scores */
    int32_t max_token_len;  /* from the file header */
    krt_tok_hf *hf;         /* Hugging Face pipeline; NULL for llama2.c */
};

/* Loaders (they fill a zeroed krt_tok whose arena and name are set). */
int krt_tok_load_hf(krt_tok *t, const char *data, size_t len, ks_diag *d);
int krt_tok_load_llama2c(krt_tok *t, const uint8_t *data, size_t len, ks_diag *d);

/* Encoders: append ids to out; on failure (reported) out is as it was. */
int krt_tok_encode_hf(const krt_tok *t, const char *text, size_t len, int flags, krt_tok_ids *out,
                      ks_diag *d);
int krt_tok_encode_llama2c(const krt_tok *t, const char *text, size_t len, int flags, krt_tok_ids *out,
                           ks_diag *d);
/* Decoders: append valid UTF-8 to out (out of memory: ks_buf_fail(out)). */
void krt_tok_decode_hf(const krt_tok *t, const int32_t *ids, size_t n, int flags, ks_buf *out);
void krt_tok_decode_llama2c(const krt_tok *t, const int32_t *ids, size_t n, int flags, ks_buf *out);
/* Apply the normalizers to s[0..n), appending to out (used for added tokens
 * too). 0; -1 when a regex gave up; -2 out of memory (out, if fallible, may
 * be marked failed instead: the caller checks both). */
int krt_tok_hf_normalize(const krt_tok *t, krt_tok_matcher *m, const char *s, size_t n, ks_buf *out);

/* ---- BPE merge loops (tokenizer_bpe.c) -------------------------------------- */

/* One symbol of a word being merged: a doubly linked list over an array. */
typedef struct krt_tok_sym {
    int32_t id;      /* token id */
    int32_t prev;    /* index of the previous live symbol, -1 at the start */
    int32_t next;    /* index of the next live symbol, -1 at the end */
    uint32_t len;    /* bytes covered; 0 once merged into its left neighbour */
    uint32_t version;/* bumped whenever the pair starting here changes (stale heap entries) */
} krt_tok_sym;

/* A candidate merge in the heap: 16 bytes, so the heap stays small. */
typedef struct krt_tok_cand {
    uint64_t key;    /* pop order, smallest first: HF rank << 32 | pos; llama2.c
                        (score, descending) << 32 | pos */
    int32_t merged;  /* the merged id */
    uint32_t ver;    /* llama2.c: the left symbol's version when pushed */
} krt_tok_cand;

/* Scratch for merging, reused across the words of one encode call. */
typedef struct krt_tok_work {
    krt_tok_sym *syms;   /* [n_syms] the word's symbols */
    size_t n_syms;       /* symbols in use */
    size_t cap_syms;     /* allocated */
    krt_tok_cand *heap;  /* binary heap of candidates */
    size_t n_heap;       /* entries in use */
    size_t cap_heap;     /* allocated */
    ks_buf scratch;      /* concatenations for llama2.c lookups (fallible) */
    size_t failed;       /* 0, or the bytes a growth could not get: symbols or candidates are missing, so the
                            result is wrong (sticky: the caller checks it, with scratch.failed, at the end) */
} krt_tok_work;

#define KRT_TOK_WORK_INIT {.scratch = KS_BUF_TRY} /* an empty krt_tok_work */

void krt_tok_work_free(krt_tok_work *w);
void krt_tok_work_push_sym(krt_tok_work *w, int32_t id, uint32_t len); /* out of memory: w->failed */
/* Hugging Face's Word::merge_all: merge by rank until no pair merges. */
void krt_tok_merge_ranked(krt_tok_work *w, const krt_tok_pairmap *merges);
/* llama2.c's encode loop: merge the best-scoring pair (leftmost among
 * equals) whose concatenation is a vocabulary entry, until none is. */
void krt_tok_merge_scored(krt_tok_work *w, const krt_tok *t);
/* Append the live symbols' ids to out (out of memory: out->failed). */
void krt_tok_work_emit(const krt_tok_work *w, krt_tok_ids *out);
/* 1 when w or its scratch ran out of memory. */
static inline int krt_tok_work_failed(const krt_tok_work *w) { return w->failed || w->scratch.failed; }

/* Append id: 0, or -1 when out of memory (v->failed set; v as it was). */
int krt_tok_ids_push(krt_tok_ids *v, int32_t id);

#endif
