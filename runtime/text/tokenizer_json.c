/* tokenizer_json.c — reads a Hugging Face tokenizer.json into a krt_tok:
 * the BPE model (vocab, merges as "a b" strings or [a, b] pairs, unk,
 * byte_fallback, fuse_unk, ignore_merges, subword prefix/suffix), the
 * normalizer, pre-tokenizer, decoder and post-processor (each flattened:
 * a Sequence runs its members in order, so a flat list is the same thing),
 * and added_tokens, given the ids Hugging Face's loader gives them.
 *
 * What the loader checks and reports, naming the place as a path into the
 * JSON (`model.merges[12]: ...`): JSON syntax (with line and column), the
 * model type, every component type, the types of the fields it reads,
 * merges whose parts or result are not in the vocabulary, ids out of
 * range, and regexes PCRE2 cannot compile. Out of memory too: the
 * tokenizer's arena is fallible, every allocation is checked, and the first
 * that fails ends the load with `name: error: out of memory (...)`, nothing
 * left allocated (cJSON's own allocations failing read as invalid JSON). */
#include "runtime/text/tokenizer_internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

typedef struct json_ctx {
    krt_tok *t;         /* being filled */
    krt_tok_hf *hf;     /* t->hf */
    ks_diag *d;         /* where errors go */
    krt_tok_matcher m;  /* for normalizing added tokens */
    int32_t max_id;     /* largest id seen so far */
    krt_tok_str *vkeys; /* [n_vkeys] model vocabulary entries in file order */
    int32_t *vids;      /* [n_vkeys] their ids */
    size_t n_vkeys;     /* entries read */
    int oom;            /* out of memory was reported: the load fails */
} json_ctx;

/* Out of memory (bytes the allocation asked for, 0 when not known): reported
 * once, for the whole load. Returns -1. */
static int nomem(json_ctx *c, size_t bytes)
{
    if (!c->oom) ks_error_oom(c->d, c->t->name, bytes ? bytes : c->t->arena.failed, "the tokenizer");
    c->oom = 1;
    return -1;
}

KS_PRINTF(3, 4) static int fail(json_ctx *c, const char *path, const char *fmt, ...)
{
    ks_buf b = KS_BUF_TRY;
    va_list ap;
    va_start(ap, fmt);
    ks_buf_vprintf(&b, fmt, ap);
    va_end(ap);
    ks_error(c->d, c->t->name, "%s: %s", path, ks_buf_cstr(&b));
    ks_buf_free(&b);
    return -1;
}

/* s[0..n) copied into the tokenizer's arena; p NULL when out of memory (reported). */
static krt_tok_str arena_str(json_ctx *c, const char *s, size_t n)
{
    krt_tok_str r;
    r.p = ks_arena_strndup(&c->t->arena, s, n);
    r.len = (uint32_t)n;
    if (!r.p) nomem(c, n + 1);
    return r;
}

static const char *join_path(char *buf, size_t cap, const char *path, const char *key)
{
    /* path "." key, cut to fit: it only names a place in messages (built by
     * hand: gcc's -Wformat-truncation cannot see that cutting is intended) */
    size_t lp = strlen(path), lk = strlen(key);
    if (lp > cap - 1) lp = cap - 1;
    memmove(buf, path, lp);
    size_t at = lp;
    if (at + 1 < cap) buf[at++] = '.';
    if (lk > cap - 1 - at) lk = cap - 1 - at;
    memcpy(buf + at, key, lk);
    buf[at + lk] = 0;
    return buf;
}

static const char *index_path(char *buf, size_t cap, const char *path, size_t i)
{
    snprintf(buf, cap, "%s[%zu]", path, i);
    return buf;
}

/* Fields: absent or null means the default. */
static int get_bool(json_ctx *c, const cJSON *obj, const char *path, const char *key, int def,
                    int *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    *out = def;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) {
        char p[512];
        return fail(c, join_path(p, sizeof p, path, key), "expected true or false");
    }
    *out = cJSON_IsTrue(v);
    return 0;
}

static int get_string(json_ctx *c, const cJSON *obj, const char *path, const char *key,
                      const char **out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    *out = NULL;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsString(v)) {
        char p[512];
        return fail(c, join_path(p, sizeof p, path, key), "expected a string");
    }
    *out = v->valuestring;
    return 0;
}

static int get_int(json_ctx *c, const cJSON *v, const char *path, int64_t lo, int64_t hi,
                   int64_t *out)
{
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble != floor(v->valuedouble))
        return fail(c, path, "expected an integer");
    if (v->valuedouble < (double)lo || v->valuedouble > (double)hi)
        return fail(c, path, "%.0f is out of range (%lld to %lld)", v->valuedouble, (long long)lo,
                    (long long)hi);
    *out = (int64_t)v->valuedouble;
    return 0;
}

static int get_id(json_ctx *c, const cJSON *v, const char *path, int32_t *out)
{
    int64_t id = 0;
    if (get_int(c, v, path, 0, KRT_TOK_MAX_ID - 1, &id)) return -1;
    *out = (int32_t)id;
    if (*out > c->max_id) c->max_id = *out;
    return 0;
}

static const char *type_of(json_ctx *c, const cJSON *obj, const char *path, int *bad)
{
    *bad = 0;
    if (!cJSON_IsObject(obj)) {
        *bad = 1;
        fail(c, path, "expected an object");
        return NULL;
    }
    const char *type;
    if (get_string(c, obj, path, "type", &type)) {
        *bad = 1;
        return NULL;
    }
    return type;
}

/* {"String": "..."} or {"Regex": "..."} */
static int read_pattern(json_ctx *c, const cJSON *obj, const char *path, krt_tok_pattern *out)
{
    char p[512];
    join_path(p, sizeof p, path, "pattern");
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(obj, "pattern");
    if (!cJSON_IsObject(pat)) return fail(c, p, "expected {\"String\": ...} or {\"Regex\": ...}");
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(pat, "String");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    if (cJSON_IsString(s)) {
        krt_tok_str lit = arena_str(c, s->valuestring, strlen(s->valuestring));
        if (!lit.p) return -1;
        krt_tok_pattern_literal(out, lit.p, lit.len);
        return 0;
    }
    if (cJSON_IsString(r)) {
        char rp[520];
        join_path(rp, sizeof rp, p, "Regex");
        return krt_tok_pattern_regex(out, r->valuestring, strlen(r->valuestring), c->d, c->t->name,
                                     rp);
    }
    return fail(c, p, "expected {\"String\": ...} or {\"Regex\": ...}");
}

static int read_prepend_scheme(json_ctx *c, const cJSON *obj, const char *path,
                               krt_tok_prepend_scheme *out)
{
    const char *scheme;
    if (get_string(c, obj, path, "prepend_scheme", &scheme)) return -1;
    if (scheme) {
        char p[512];
        join_path(p, sizeof p, path, "prepend_scheme");
        if (strcmp(scheme, "always") == 0) *out = KRT_PREPEND_ALWAYS;
        else if (strcmp(scheme, "first") == 0) *out = KRT_PREPEND_FIRST;
        else if (strcmp(scheme, "never") == 0) *out = KRT_PREPEND_NEVER;
        else return fail(c, p, "unknown prepend scheme '%s' (always, first or never)", scheme);
        return 0;
    }
    int add; /* the older spelling */
    if (get_bool(c, obj, path, "add_prefix_space", 1, &add)) return -1;
    *out = add ? KRT_PREPEND_ALWAYS : KRT_PREPEND_NEVER;
    return 0;
}

/* A single character, as Rust's `char` fields (Metaspace replacement, Strip content). */
static int read_char(json_ctx *c, const cJSON *obj, const char *path, const char *key,
                     const char *def, krt_tok_str *text, uint32_t *cp)
{
    const char *s;
    if (get_string(c, obj, path, key, &s)) return -1;
    if (!s) s = def;
    size_t n = strlen(s);
    uint32_t ch = 0;
    if (n == 0 || krt_tok_utf8_valid_len((const uint8_t *)s, n, &ch) != n) {
        char p[512];
        return fail(c, join_path(p, sizeof p, path, key), "expected a single character");
    }
    if (text && !(*text = arena_str(c, s, n)).p) return -1;
    if (cp) *cp = ch;
    return 0;
}

/* ---- components ------------------------------------------------------------------
 * The normalizer, pre-tokenizer, decoder and post-processor are each null, one
 * component, or a Sequence of them under `list_key`: a Sequence runs its members in
 * order, so it is read as the flat list of its members. */

/* Reads one component of a type other than Sequence; `type` is its "type". */
typedef int (*read_one_fn)(json_ctx *c, const cJSON *obj, const char *path, const char *type);

static int read_component(json_ctx *c, const cJSON *obj, const char *path, int depth, const char *list_key,
                          read_one_fn read_one)
{
    if (!obj || cJSON_IsNull(obj)) return 0;
    if (depth > 32) return fail(c, path, "nested too deeply");
    int bad;
    const char *type = type_of(c, obj, path, &bad);
    if (bad) return -1;
    if (!type) return fail(c, path, "missing \"type\"");
    if (strcmp(type, "Sequence") != 0) return read_one(c, obj, path, type);
    char p[512];
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(obj, list_key);
    join_path(p, sizeof p, path, list_key);
    if (!cJSON_IsArray(list)) return fail(c, p, "expected an array");
    size_t i = 0;
    for (const cJSON *e = list->child; e; e = e->next, i++) {
        char q[600];
        if (read_component(c, e, index_path(q, sizeof q, p, i), depth + 1, list_key, read_one)) return -1;
    }
    return 0;
}

/* *items[0..*n) copied into a new array in the tokenizer's arena with one more, zeroed,
 * element after them, which it returns; *n counts it. Copying is fine: a tokenizer has a
 * handful of each component. NULL when out of memory (reported), *items and *n as they
 * were. APPEND(c, items, n) calls it for an array `items` of `n`. */
static void *append(json_ctx *c, void **items, size_t *n, size_t size)
{
    char *grown = ks_arena_alloc(&c->t->arena, (*n + 1) * size);
    if (!grown) return nomem(c, (*n + 1) * size), NULL;
    if (*n) memcpy(grown, *items, *n * size);
    *items = grown;
    return grown + (*n)++ * size;
}
#define APPEND(c, items, n) append((c), (void **)&(items), &(n), sizeof *(items))

/* A Replace normalizer's or decoder's "pattern" and "content" (the text put in its place). */
static int read_replace(json_ctx *c, const cJSON *obj, const char *path, krt_tok_pattern *pattern,
                        krt_tok_str *text)
{
    const char *s;
    if (get_string(c, obj, path, "content", &s)) return -1;
    if (!s) {
        char p[512];
        return fail(c, join_path(p, sizeof p, path, "content"), "expected a string");
    }
    if (read_pattern(c, obj, path, pattern)) return -1;
    *text = arena_str(c, s, strlen(s));
    return text->p ? 0 : -1;
}

/* ---- normalizer ----------------------------------------------------------------- */

/* A new normalizer (NULL: out of memory, reported). */
static krt_tok_norm *new_norm(json_ctx *c, krt_tok_norm_kind kind)
{
    krt_tok_norm *n = APPEND(c, c->hf->norms, c->hf->n_norms);
    if (n) n->kind = kind;
    return n;
}

/* One normalizer of type `type` (not a Sequence). */
static int read_one_normalizer(json_ctx *c, const cJSON *obj, const char *path, const char *type)
{
    char p[512];
    if (strcmp(type, "Prepend") == 0) {
        const char *s;
        if (get_string(c, obj, path, "prepend", &s)) return -1;
        if (!s) return fail(c, join_path(p, sizeof p, path, "prepend"), "expected a string");
        krt_tok_norm *n = new_norm(c, KRT_NORM_PREPEND);
        if (!n || !(n->text = arena_str(c, s, strlen(s))).p) return -1;
        return 0;
    }
    if (strcmp(type, "Replace") == 0) {
        krt_tok_norm *n = new_norm(c, KRT_NORM_REPLACE);
        return n ? read_replace(c, obj, path, &n->pattern, &n->text) : -1;
    }
    if (strcmp(type, "Strip") == 0) {
        int l, r;
        if (get_bool(c, obj, path, "strip_left", 1, &l) ||
            get_bool(c, obj, path, "strip_right", 1, &r))
            return -1;
        krt_tok_norm *n = new_norm(c, KRT_NORM_STRIP);
        if (!n) return -1;
        n->left = l;
        n->right = r;
        return 0;
    }
    if (strcmp(type, "ByteLevel") == 0) return new_norm(c, KRT_NORM_BYTELEVEL) ? 0 : -1;
    return fail(c, join_path(p, sizeof p, path, "type"),
                "unsupported normalizer '%s' (kiln reads Sequence, Prepend, Replace, Strip, ByteLevel)",
                type);
}

/* ---- pre-tokenizer ---------------------------------------------------------------- */

/* A new pre-tokenizer that owns *pat (NULL: out of memory, reported; *pat freed). */
static krt_tok_pretok *new_pretok(json_ctx *c, krt_tok_pretok_kind kind, krt_tok_pattern *pat)
{
    krt_tok_pretok *n = APPEND(c, c->hf->pretoks, c->hf->n_pretoks);
    if (!n) {
        krt_tok_pattern_free(pat);
        return NULL;
    }
    n->kind = kind;
    n->pattern = *pat;
    return n;
}

/* Rust's regex crate (which the built-in pre-tokenizers and added-token
 * checks use) means Alphabetic, marks, decimal digits, connector punctuation
 * and Join_Control by \w, and White_Space by \s; PCRE2 10.42's \w leaves
 * the marks out, so spell them. */
#define RUST_WORD_CHARS "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}"
#define RUST_WORD "[" RUST_WORD_CHARS "]"
#define RUST_SPACE_CHARS "\\p{White_Space}"
#define RUST_SPACE "[" RUST_SPACE_CHARS "]"

/* GPT-2's pre-tokenizer pattern (tokenizers/src/pre_tokenizers/byte_level.rs). */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int add_regex_split(json_ctx *c, const char *path, const char *re,
                           krt_tok_split_behavior behavior, int invert)
{
    krt_tok_pattern pat;
    if (krt_tok_pattern_regex(&pat, re, strlen(re), c->d, c->t->name, path)) return -1;
    krt_tok_pretok *p = new_pretok(c, KRT_PRETOK_SPLIT, &pat);
    if (!p) return -1;
    p->behavior = behavior;
    p->invert = invert;
    return 0;
}

static int read_behavior(json_ctx *c, const cJSON *obj, const char *path,
                         krt_tok_split_behavior def, krt_tok_split_behavior *out)
{
    const char *b;
    if (get_string(c, obj, path, "behavior", &b)) return -1;
    *out = def;
    if (!b) return 0;
    static const struct {
        const char *name;
        krt_tok_split_behavior behavior;
    } names[] = {{"Removed", KRT_SPLIT_REMOVED},
                 {"Isolated", KRT_SPLIT_ISOLATED},
                 {"MergedWithPrevious", KRT_SPLIT_MERGED_WITH_PREVIOUS},
                 {"MergedWithNext", KRT_SPLIT_MERGED_WITH_NEXT},
                 {"Contiguous", KRT_SPLIT_CONTIGUOUS}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(b, names[i].name) == 0) {
            *out = names[i].behavior;
            return 0;
        }
    char p[512];
    return fail(c, join_path(p, sizeof p, path, "behavior"), "unknown split behavior '%s'", b);
}

/* One pretokenizer of type `type` (not a Sequence). */
static int read_one_pretokenizer(json_ctx *c, const cJSON *obj, const char *path, const char *type)
{
    char p[512];
    if (strcmp(type, "ByteLevel") == 0) {
        int aps, regex;
        if (get_bool(c, obj, path, "add_prefix_space", 1, &aps) ||
            get_bool(c, obj, path, "use_regex", 1, &regex))
            return -1;
        krt_tok_pattern pat = {0};
        if (regex && krt_tok_pattern_regex(&pat, gpt2_pattern, strlen(gpt2_pattern), c->d,
                                           c->t->name, path))
            return -1;
        krt_tok_pretok *pt = new_pretok(c, KRT_PRETOK_BYTELEVEL, &pat);
        if (!pt) return -1;
        pt->add_prefix_space = aps;
        pt->use_regex = regex;
        return 0;
    }
    if (strcmp(type, "Split") == 0) {
        krt_tok_split_behavior behavior;
        int invert;
        if (read_behavior(c, obj, path, KRT_SPLIT_ISOLATED, &behavior) ||
            get_bool(c, obj, path, "invert", 0, &invert))
            return -1;
        krt_tok_pattern pat;
        if (read_pattern(c, obj, path, &pat)) return -1;
        krt_tok_pretok *pt = new_pretok(c, KRT_PRETOK_SPLIT, &pat);
        if (!pt) return -1;
        pt->behavior = behavior;
        pt->invert = invert;
        return 0;
    }
    if (strcmp(type, "Metaspace") == 0) {
        krt_tok_str rep;
        krt_tok_prepend_scheme scheme;
        int split;
        if (read_char(c, obj, path, "replacement", "\xE2\x96\x81", &rep, NULL) ||
            read_prepend_scheme(c, obj, path, &scheme) ||
            get_bool(c, obj, path, "split", 1, &split))
            return -1;
        krt_tok_pattern none = {0};
        krt_tok_pretok *pt = new_pretok(c, KRT_PRETOK_METASPACE, &none);
        if (!pt) return -1;
        pt->replacement = rep;
        pt->prepend = scheme;
        pt->split = split;
        return 0;
    }
    if (strcmp(type, "Digits") == 0) {
        int individual;
        if (get_bool(c, obj, path, "individual_digits", 0, &individual)) return -1;
        /* char::is_numeric is the N category; runs of digits stay together
         * unless individual_digits (HF: Isolated or Contiguous on each digit). */
        return add_regex_split(c, path, individual ? "\\p{N}" : "\\p{N}+", KRT_SPLIT_ISOLATED, 0);
    }
    if (strcmp(type, "Whitespace") == 0) /* \w+|[^\w\s]+ in Rust's regex */
        return add_regex_split(c, path, "(?:" RUST_WORD ")+|[^" RUST_WORD_CHARS RUST_SPACE_CHARS "]+",
                               KRT_SPLIT_REMOVED, 1);
    if (strcmp(type, "WhitespaceSplit") == 0) /* char::is_whitespace */
        return add_regex_split(c, path, RUST_SPACE, KRT_SPLIT_REMOVED, 0);
    if (strcmp(type, "Punctuation") == 0) {
        krt_tok_split_behavior behavior;
        if (read_behavior(c, obj, path, KRT_SPLIT_ISOLATED, &behavior)) return -1;
        /* is_ascii_punctuation() || the P categories, one character at a time */
        return add_regex_split(c, path, "[\\p{P}!-/:-@\\[-`{-~]", behavior, 0);
    }
    return fail(c, join_path(p, sizeof p, path, "type"),
                "unsupported pre-tokenizer '%s' (kiln reads Sequence, ByteLevel, Split, Metaspace, "
                "Digits, Whitespace, WhitespaceSplit, Punctuation)",
                type);
}

/* ---- decoder ---------------------------------------------------------------------- */

/* A new decoder (NULL: out of memory, reported). */
static krt_tok_dec *new_dec(json_ctx *c, krt_tok_dec_kind kind)
{
    krt_tok_dec *n = APPEND(c, c->hf->decs, c->hf->n_decs);
    if (n) n->kind = kind;
    return n;
}

/* One decoder of type `type` (not a Sequence). */
static int read_one_decoder(json_ctx *c, const cJSON *obj, const char *path, const char *type)
{
    char p[512];
    if (strcmp(type, "ByteLevel") == 0) return new_dec(c, KRT_DEC_BYTELEVEL) ? 0 : -1;
    if (strcmp(type, "ByteFallback") == 0) return new_dec(c, KRT_DEC_BYTEFALLBACK) ? 0 : -1;
    if (strcmp(type, "Fuse") == 0) return new_dec(c, KRT_DEC_FUSE) ? 0 : -1;
    if (strcmp(type, "Replace") == 0) {
        krt_tok_dec *dec = new_dec(c, KRT_DEC_REPLACE);
        return dec ? read_replace(c, obj, path, &dec->pattern, &dec->text) : -1;
    }
    if (strcmp(type, "Strip") == 0) {
        uint32_t ch;
        int64_t start = 0, stop = 0;
        if (read_char(c, obj, path, "content", " ", NULL, &ch)) return -1;
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, "start");
        if (v && get_int(c, v, join_path(p, sizeof p, path, "start"), 0, 1 << 20, &start))
            return -1;
        v = cJSON_GetObjectItemCaseSensitive(obj, "stop");
        if (v && get_int(c, v, join_path(p, sizeof p, path, "stop"), 0, 1 << 20, &stop)) return -1;
        krt_tok_dec *dec = new_dec(c, KRT_DEC_STRIP);
        if (!dec) return -1;
        /* Stripping one leading character cuts the same from a window as from
         * the whole text; more, or trailing ones, depend on what comes next. */
        if (start > 1 || stop > 0) c->hf->stream_from_start = 1;
        dec->ch = ch;
        dec->start = (int)start;
        dec->stop = (int)stop;
        return 0;
    }
    if (strcmp(type, "Metaspace") == 0) {
        krt_tok_str rep;
        krt_tok_prepend_scheme scheme;
        if (read_char(c, obj, path, "replacement", "\xE2\x96\x81", &rep, NULL) ||
            read_prepend_scheme(c, obj, path, &scheme))
            return -1;
        krt_tok_dec *dec = new_dec(c, KRT_DEC_METASPACE);
        if (!dec) return -1;
        dec->text = rep;
        dec->prepend = scheme;
        return 0;
    }
    return fail(c, join_path(p, sizeof p, path, "type"),
                "unsupported decoder '%s' (kiln reads Sequence, ByteLevel, ByteFallback, Fuse, "
                "Replace, Strip, Metaspace)",
                type);
}

/* ---- post-processor ----------------------------------------------------------------- */

/* Wrap the current template in `before` ... `after` (a later processor of a
 * Sequence sees the earlier one's output). 0, or -1: out of memory (reported). */
static int wrap_template(json_ctx *c, const int32_t *before, size_t nb, const int32_t *after,
                         size_t na)
{
    krt_tok_hf *hf = c->hf;
    int32_t *b = ks_arena_alloc(&c->t->arena, (nb + hf->n_post_before + 1) * sizeof *b);
    int32_t *a = b ? ks_arena_alloc(&c->t->arena, (na + hf->n_post_after + 1) * sizeof *a) : NULL;
    if (!a) return nomem(c, 0);
    if (nb) memcpy(b, before, nb * sizeof *b);
    if (hf->n_post_before) memcpy(b + nb, hf->post_before, hf->n_post_before * sizeof *b);
    if (hf->n_post_after) memcpy(a, hf->post_after, hf->n_post_after * sizeof *a);
    if (na) memcpy(a + hf->n_post_after, after, na * sizeof *a);
    hf->post_before = b;
    hf->n_post_before += nb;
    hf->post_after = a;
    hf->n_post_after += na;
    hf->post = KRT_POST_TEMPLATE;
    return 0;
}

/* ["</s>", 2] */
static int read_cls_sep(json_ctx *c, const cJSON *obj, const char *path, const char *key,
                        int32_t *id)
{
    char p[512];
    join_path(p, sizeof p, path, key);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 2 || !cJSON_IsString(v->child))
        return fail(c, p, "expected [\"token\", id]");
    char q[520];
    return get_id(c, v->child->next, index_path(q, sizeof q, p, 1), id);
}

static int read_template(json_ctx *c, const cJSON *obj, const char *path)
{
    char p[512], q[600], r[700];
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(obj, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(obj, "special_tokens");
    join_path(p, sizeof p, path, "single");
    if (!cJSON_IsArray(single)) return fail(c, p, "expected an array");
    int32_t *ids[2] = {NULL, NULL};
    size_t n[2] = {0, 0}, cap[2] = {0, 0};
    int side = 0, seen_a = 0, rc = 0;
    size_t i = 0;
    for (const cJSON *e = single->child; e && rc == 0; e = e->next, i++) {
        index_path(q, sizeof q, p, i);
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(e, "SpecialToken");
        const cJSON *seq = cJSON_GetObjectItemCaseSensitive(e, "Sequence");
        if (cJSON_IsObject(seq)) {
            const char *which;
            if ((rc = get_string(c, seq, q, "id", &which))) break;
            if (which && strcmp(which, "A") == 0) {
                seen_a = 1;
                side = 1;
            }
            continue;
        }
        const char *name = NULL;
        if (!cJSON_IsObject(sp) || (rc = get_string(c, sp, q, "id", &name)) || !name) {
            if (rc == 0) rc = fail(c, q, "expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
            break;
        }
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(specials, name);
        const cJSON *st_ids = cJSON_GetObjectItemCaseSensitive(st, "ids");
        if (!cJSON_IsArray(st_ids)) {
            rc = fail(c, q, "special token '%s' is not in special_tokens", name);
            break;
        }
        size_t k = 0;
        for (const cJSON *x = st_ids->child; x; x = x->next, k++) {
            snprintf(r, sizeof r, "%s.special_tokens.%s.ids[%zu]", path, name, k);
            int32_t id;
            if ((rc = get_id(c, x, r, &id))) break;
            if (KS_TRY_GROW(ids[side], n[side] + 1, cap[side], (size_t)1 << 20) != 0) {
                rc = nomem(c, (n[side] + 1) * sizeof *ids[side]);
                break;
            }
            ids[side][n[side]++] = id;
        }
    }
    if (rc == 0 && !seen_a) rc = fail(c, p, "the template has no {\"Sequence\": {\"id\": \"A\"}}");
    if (rc == 0) rc = wrap_template(c, ids[0], n[0], ids[1], n[1]);
    free(ids[0]);
    free(ids[1]);
    return rc;
}

/* One post processor of type `type` (not a Sequence). */
static int read_one_post_processor(json_ctx *c, const cJSON *obj, const char *path, const char *type)
{
    char p[512];
    if (strcmp(type, "ByteLevel") == 0) return 0; /* offsets only; ids unchanged */
    if (strcmp(type, "TemplateProcessing") == 0) return read_template(c, obj, path);
    if (strcmp(type, "RobertaProcessing") == 0 || strcmp(type, "BertProcessing") == 0) {
        int32_t cls, sep;
        if (read_cls_sep(c, obj, path, "cls", &cls) || read_cls_sep(c, obj, path, "sep", &sep))
            return -1;
        return wrap_template(c, &cls, 1, &sep, 1);
    }
    return fail(c, join_path(p, sizeof p, path, "type"),
                "unsupported post-processor '%s' (kiln reads Sequence, ByteLevel, "
                "TemplateProcessing, RobertaProcessing, BertProcessing)",
                type);
}

/* ---- model ------------------------------------------------------------------------- */

static int read_model(json_ctx *c, const cJSON *model)
{
    krt_tok *t = c->t;
    krt_tok_hf *hf = c->hf;
    int bad;
    const char *type = type_of(c, model, "model", &bad);
    if (bad) return -1;
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (type && strcmp(type, "BPE") != 0)
        return fail(c, "model.type", "unsupported model '%s' (kiln reads BPE)", type);
    if (!type && !merges)
        return fail(c, "model", "no \"type\" and no \"merges\": not a BPE model");
    if (!cJSON_IsObject(vocab)) return fail(c, "model.vocab", "expected an object of token -> id");
    if (!cJSON_IsArray(merges)) return fail(c, "model.merges", "expected an array");

    const char *s;
    if (get_string(c, model, "model", "unk_token", &s)) return -1;
    if (s) {
        hf->has_unk = 1;
        if (!(hf->unk_token = arena_str(c, s, strlen(s))).p) return -1;
    }
    if (get_string(c, model, "model", "continuing_subword_prefix", &s)) return -1;
    if (!(hf->cont_prefix = arena_str(c, s ? s : "", s ? strlen(s) : 0)).p) return -1;
    if (get_string(c, model, "model", "end_of_word_suffix", &s)) return -1;
    if (!(hf->word_suffix = arena_str(c, s ? s : "", s ? strlen(s) : 0)).p) return -1;
    if (get_bool(c, model, "model", "byte_fallback", 0, &hf->byte_fallback) ||
        get_bool(c, model, "model", "fuse_unk", 0, &hf->fuse_unk) ||
        get_bool(c, model, "model", "ignore_merges", 0, &hf->ignore_merges))
        return -1;
    /* dropout is a training-time option; inference runs without it. */

    size_t n_vocab = (size_t)cJSON_GetArraySize(vocab);
    if (krt_tok_strmap_init(&t->vocab, &t->arena, n_vocab) != 0) return nomem(c, 0);
    c->vkeys = ks_try_calloc(n_vocab + 1, sizeof *c->vkeys);
    c->vids = ks_try_calloc(n_vocab + 1, sizeof *c->vids);
    if (!c->vkeys || !c->vids) return nomem(c, (n_vocab + 1) * (sizeof *c->vkeys + sizeof *c->vids));
    char p[512];
    for (const cJSON *e = vocab->child; e; e = e->next) {
        int32_t id;
        double v = cJSON_IsNumber(e) ? e->valuedouble : -1;
        if (v >= 0 && v < KRT_TOK_MAX_ID && v == (double)(int32_t)v) { /* the common case, fast */
            id = (int32_t)v;
            if (id > c->max_id) c->max_id = id;
        } else {
            snprintf(p, sizeof p, "model.vocab.%.400s", e->string);
            if (get_id(c, e, p, &id)) return -1;
        }
        krt_tok_str key = arena_str(c, e->string, strlen(e->string));
        if (!key.p) return -1;
        krt_tok_strmap_put(&t->vocab, key.p, key.len, id);
        c->vkeys[c->n_vkeys] = key;
        c->vids[c->n_vkeys++] = id;
    }

    size_t n_merges = (size_t)cJSON_GetArraySize(merges);
    if (krt_tok_pairmap_init(&hf->merges, &t->arena, n_merges) != 0) return nomem(c, 0);
    ks_buf joined = KS_BUF_TRY;
    int32_t rank = 0;
    size_t i = 0;
    int rc = 0;
    for (const cJSON *e = merges->child; e && rc == 0; e = e->next, i++) {
/* The path is spelled only for a message. */
#define MERGE_PATH() index_path(p, sizeof p, "model.merges", i)
        const char *a, *b;
        size_t alen, blen;
        if (cJSON_IsString(e)) {
            const char *line = e->valuestring;
            if (strncmp(line, "#version", 8) == 0) continue; /* a merges.txt header */
            const char *sp = strchr(line, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                rc = fail(c, MERGE_PATH(), "expected two tokens separated by one space, got '%.200s'", line);
                break;
            }
            a = line, alen = (size_t)(sp - line);
            b = sp + 1, blen = strlen(sp + 1);
        } else if (cJSON_IsArray(e) && e->child && cJSON_IsString(e->child) && e->child->next &&
                   cJSON_IsString(e->child->next) && !e->child->next->next) {
            a = e->child->valuestring, alen = strlen(a);
            b = e->child->next->valuestring, blen = strlen(b);
        } else {
            rc = fail(c, MERGE_PATH(), "expected \"a b\" or [\"a\", \"b\"]");
            break;
        }
        int32_t ia = krt_tok_strmap_get(&t->vocab, a, alen);
        int32_t ib = krt_tok_strmap_get(&t->vocab, b, blen);
        if (ia < 0 || ib < 0) {
            rc = fail(c, MERGE_PATH(), "'%.*s' is not in the vocabulary", (int)(ia < 0 ? alen : blen),
                      ia < 0 ? a : b);
            break;
        }
        /* The merged token drops the right part's continuing_subword_prefix. */
        size_t cut = hf->cont_prefix.len <= blen ? hf->cont_prefix.len : blen;
        ks_buf_clear(&joined);
        ks_buf_put(&joined, a, alen);
        ks_buf_put(&joined, b + cut, blen - cut);
        if (joined.failed) {
            rc = nomem(c, joined.failed);
            break;
        }
        int32_t im = krt_tok_strmap_get(&t->vocab, ks_buf_cstr(&joined), joined.len);
        if (im < 0) {
            rc = fail(c, MERGE_PATH(), "the merged token '%.*s' is not in the vocabulary", (int)joined.len,
                      joined.data);
            break;
        }
        krt_tok_pairmap_put(&hf->merges, ia, ib, rank++, im);
    }
#undef MERGE_PATH
    ks_buf_free(&joined);
    return rc;
}

/* ---- added tokens ------------------------------------------------------------------- */

static int added_equal(const krt_tok_added *a, const krt_tok_added *b)
{
    return a->content.len == b->content.len && memcmp(a->content.p, b->content.p, a->content.len) == 0 &&
           a->special == b->special && a->normalized == b->normalized && a->lstrip == b->lstrip &&
           a->rstrip == b->rstrip && a->single_word == b->single_word;
}

/* HF's AddedVocabulary::add_tokens, one token at a time as its loader calls it:
 * an identical token is ignored; the id is that of an earlier added token with
 * the same content, else the model's, else the next one after the model's
 * vocabulary and every added id. */
static int read_added_tokens(json_ctx *c, const cJSON *list)
{
    krt_tok *t = c->t;
    krt_tok_hf *hf = c->hf;
    if (!list || cJSON_IsNull(list)) return 0;
    if (!cJSON_IsArray(list)) return fail(c, "added_tokens", "expected an array");
    size_t n = (size_t)cJSON_GetArraySize(list);
    hf->added = ks_arena_alloc(&t->arena, (n + 1) * sizeof *hf->added);
    if (!hf->added) return nomem(c, 0);
    /* Scratch that keeps this linear: content -> the last token with it, and
     * for each token the previous one with the same content. */
    ks_arena scratch = {.fallible = 1};
    krt_tok_strmap by_content;
    int32_t *same_prev = NULL;
    int rc = 0;
    if (krt_tok_strmap_init(&by_content, &scratch, n) != 0 ||
        !(same_prev = ks_arena_alloc(&scratch, (n + 1) * sizeof *same_prev)))
        rc = nomem(c, scratch.failed);
    int64_t model_size = (int64_t)t->vocab.count, max_added = -1;
    size_t i = 0;
    char p[512];
    for (const cJSON *e = list->child; e && rc == 0; e = e->next, i++) {
        index_path(p, sizeof p, "added_tokens", i);
        if (!cJSON_IsObject(e)) {
            rc = fail(c, p, "expected an object");
            break;
        }
        const char *content;
        if ((rc = get_string(c, e, p, "content", &content))) break;
        if (!content) {
            rc = fail(c, p, "missing \"content\"");
            break;
        }
        int32_t file_id;
        const cJSON *idv = cJSON_GetObjectItemCaseSensitive(e, "id");
        char q[600];
        if (!idv) {
            rc = fail(c, p, "missing \"id\"");
            break;
        }
        if ((rc = get_id(c, idv, join_path(q, sizeof q, p, "id"), &file_id))) break;
        krt_tok_added a = {0};
        int sw, ls, rs, norm, sp;
        if ((rc = get_bool(c, e, p, "single_word", 0, &sw) || get_bool(c, e, p, "lstrip", 0, &ls) ||
                  get_bool(c, e, p, "rstrip", 0, &rs) || get_bool(c, e, p, "normalized", 1, &norm) ||
                  get_bool(c, e, p, "special", 0, &sp) ? -1 : 0))
            break;
        a.content.p = content;
        a.content.len = (uint32_t)strlen(content);
        a.single_word = (uint8_t)sw, a.lstrip = (uint8_t)ls, a.rstrip = (uint8_t)rs;
        a.normalized = (uint8_t)norm, a.special = (uint8_t)sp;
        if (a.content.len == 0) continue;
        int32_t last = krt_tok_strmap_get(&by_content, a.content.p, a.content.len);
        int dup = 0;
        for (int32_t k = last; k >= 0 && !dup; k = same_prev[k]) dup = added_equal(&hf->added[k], &a);
        if (dup) continue;
        /* An earlier added token with this content gives its id, else the model's. */
        int32_t id = last >= 0 ? hf->added[last].id : krt_tok_strmap_get(&t->vocab, a.content.p, a.content.len);
        if (id < 0) {
            int64_t next = max_added < 0 ? model_size
                           : (max_added >= model_size || model_size == 0) ? max_added + 1
                                                                           : model_size;
            if (next >= KRT_TOK_MAX_ID) {
                rc = fail(c, p, "too many ids");
                break;
            }
            id = (int32_t)next;
        }
        if (id > max_added) max_added = id;
        if (id > c->max_id) c->max_id = id;
        a.content = arena_str(c, content, a.content.len);
        if (!a.content.p) {
            rc = -1;
            break;
        }
        a.id = id;
        same_prev[hf->n_added] = last;
        krt_tok_strmap_put(&by_content, a.content.p, a.content.len, (int32_t)hf->n_added);
        hf->added[hf->n_added++] = a;
        if (a.single_word) hf->has_single_word = 1;
    }
    if (rc == 0) {
        /* The last token given an id is the one HF keeps for it: its options
         * and text apply to every match of that id. */
        ks_hmap last_of_id; /* id -> the last added token with it (with room for them all: puts allocate
                               nothing) */
        if (ks_hmap_init(&last_of_id, &scratch, hf->n_added, hf->n_added, "added tokens") != 0) {
            rc = nomem(c, scratch.failed);
        } else {
            for (size_t k = 0; k < hf->n_added; k++) *ks_hmap_put_u64(&last_of_id, (uint32_t)hf->added[k].id, NULL) = k;
            for (size_t k = 0; k < hf->n_added; k++)
                hf->added[k].owner = (int32_t)*ks_hmap_get_u64(&last_of_id, (uint32_t)hf->added[k].id);
        }
    }
    ks_arena_free(&scratch);
    if (rc) return rc;
    /* What encode looks for: normalized tokens are matched in normalized text. */
    ks_buf norm = KS_BUF_TRY;
    for (size_t k = 0; k < hf->n_added && rc == 0; k++) {
        krt_tok_added *a = &hf->added[k];
        a->match = a->content;
        if (!a->normalized || hf->n_norms == 0) continue;
        ks_buf_clear(&norm);
        int nrc = krt_tok_hf_normalize(t, &c->m, a->content.p, a->content.len, &norm);
        if (nrc == -2 || norm.failed)
            rc = nomem(c, norm.failed);
        else if (nrc)
            rc = fail(c, "added_tokens", "normalizing '%s' failed (regex limit)", a->content.p);
        else if (!(a->match = arena_str(c, ks_buf_cstr(&norm), norm.len)).p)
            rc = -1;
    }
    ks_buf_free(&norm);
    return rc;
}

/* Index the added tokens of one kind (raw or normalized) by first byte,
 * longest first, in HF's order (special tokens, then the others). 0, or -1:
 * out of memory (reported). */
static int build_added_set(json_ctx *c, krt_tok_added_set *set, int normalized)
{
    krt_tok_hf *hf = c->hf;
    size_t count[257] = {0};
    set->order = ks_arena_alloc(&c->t->arena, (hf->n_added + 1) * sizeof *set->order);
    int32_t *sorted = set->order ? ks_arena_alloc(&c->t->arena, (hf->n_added + 1) * sizeof *sorted) : NULL;
    set->n = 0;
    ks_arena scratch = {.fallible = 1};
    krt_tok_strmap seen;
    if (!sorted) return nomem(c, 0);
    if (krt_tok_strmap_init(&seen, &scratch, hf->n_added) != 0) return nomem(c, scratch.failed);
    for (int pass = 0; pass < 2; pass++) /* special first, as HF chains special_tokens first */
        for (size_t k = 0; k < hf->n_added; k++) {
            const krt_tok_added *a = &hf->added[k];
            if (a->normalized != normalized || a->match.len == 0) continue;
            if ((pass == 0) != (a->special != 0)) continue;
            /* the same text twice: the first one matches */
            if (krt_tok_strmap_put_first(&seen, a->match.p, a->match.len, (int32_t)k) != (int32_t)k)
                continue;
            set->order[set->n++] = (int32_t)k;
            count[(uint8_t)a->match.p[0]]++;
        }
    ks_arena_free(&scratch);
    /* Stable counting sort by first byte, then stable insertion by length. */
    uint32_t pos[257];
    set->first[0] = 0;
    for (int b = 0; b < 256; b++) set->first[b + 1] = set->first[b] + (uint32_t)count[b];
    memcpy(pos, set->first, sizeof pos);
    for (size_t k = 0; k < set->n; k++) {
        int32_t idx = set->order[k];
        sorted[pos[(uint8_t)hf->added[idx].match.p[0]]++] = idx;
    }
    for (int b = 0; b < 256; b++)
        for (uint32_t x = set->first[b] + 1; x < set->first[b + 1]; x++) {
            int32_t v = sorted[x];
            uint32_t y = x;
            while (y > set->first[b] && hf->added[sorted[y - 1]].match.len < hf->added[v].match.len) {
                sorted[y] = sorted[y - 1];
                y--;
            }
            sorted[y] = v;
        }
    set->order = sorted;
    return 0;
}

static void find_bos_eos(json_ctx *c)
{
    krt_tok *t = c->t;
    krt_tok_hf *hf = c->hf;
    t->bos = hf->n_post_before ? hf->post_before[0] : -1;
    t->eos = hf->n_post_after ? hf->post_after[hf->n_post_after - 1] : -1;
    if (t->eos >= 0) return;
    static const char *const names[] = {"</s>", "<|endoftext|>", "<|end_of_text|>", "<|eot_id|>",
                                        "<|im_end|>", "<eos>", "<|end_story|>"};
    for (size_t k = 0; k < sizeof names / sizeof names[0] && t->eos < 0; k++)
        for (size_t i = 0; i < hf->n_added; i++)
            if (hf->added[i].special &&
                strcmp(hf->added[i].content.p, names[k]) == 0) {
                t->eos = hf->added[i].id;
                break;
            }
}

/* ---- entry -------------------------------------------------------------------------- */

static void json_error_place(json_ctx *c, const char *data, size_t len, const char *at,
                             const char *what)
{
    size_t off = at && at >= data && at <= data + len ? (size_t)(at - data) : len;
    int line = 1, col = 1;
    size_t line_start = 0;
    for (size_t i = 0; i < off; i++) {
        if (data[i] == '\n') {
            line++;
            col = 1;
            line_start = i + 1;
        } else {
            col++;
        }
    }
    size_t line_end = off;
    while (line_end < len && data[line_end] != '\n') line_end++;
    /* Quote the line only when it is short enough to read (a minified
     * tokenizer.json is one line of megabytes). */
    ks_source src = {c->t->name, line_end - line_start <= 200 ? data : NULL, len};
    ks_error_at(c->d, &src, line, col, "%s", what);
}

int krt_tok_load_hf(krt_tok *t, const char *data, size_t len, ks_diag *d)
{
    json_ctx c = {0};
    c.t = t;
    c.d = d;
    c.max_id = -1;
    cJSON *root = NULL;
    int rc = 0;
    /* cJSON reads C strings; data may be any bytes, so work on a NUL-terminated copy. */
    char *copy = ks_try_malloc(len + 1);
    t->hf = ks_arena_alloc(&t->arena, sizeof *t->hf);
    c.hf = t->hf;
    if (krt_tok_matcher_init(&c.m) != 0 || !t->hf || !copy) {
        rc = nomem(&c, copy ? 0 : len + 1);
        goto done;
    }
    if (len) memcpy(copy, data, len);
    copy[len] = 0;
    const char *end = NULL;
    root = cJSON_ParseWithLengthOpts(copy, len, &end, 0);
    if (!root) {
        json_error_place(&c, copy, len, end, "invalid JSON");
        rc = -1;
        goto done;
    }
    for (const char *p = end; p && p < copy + len; p++)
        if (*p != ' ' && *p != '\n' && *p != '\r' && *p != '\t') {
            json_error_place(&c, copy, len, p, "unexpected text after the JSON value");
            rc = -1;
            goto done;
        }
    if (!cJSON_IsObject(root)) {
        ks_error(d, t->name, "expected a JSON object at the top (a tokenizer.json)");
        rc = -1;
        goto done;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!model) {
        ks_error(d, t->name, "no \"model\": not a tokenizer.json");
        rc = -1;
        goto done;
    }
    const cJSON *normalizer = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const cJSON *pre_tokenizer = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    const cJSON *decoder = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    const cJSON *post_processor = cJSON_GetObjectItemCaseSensitive(root, "post_processor");
    /* any decoder, even an empty Sequence, replaces joining tokens with ' ' */
    c.hf->has_decoder = decoder && !cJSON_IsNull(decoder);
    if (read_model(&c, model) ||
        read_component(&c, normalizer, "normalizer", 0, "normalizers", read_one_normalizer) ||
        read_component(&c, pre_tokenizer, "pre_tokenizer", 0, "pretokenizers", read_one_pretokenizer) ||
        read_component(&c, decoder, "decoder", 0, "decoders", read_one_decoder) ||
        read_component(&c, post_processor, "post_processor", 0, "processors", read_one_post_processor) ||
        read_added_tokens(&c, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"))) {
        rc = -1;
        goto done;
    }
    krt_tok_hf *hf = t->hf;
    if (c.max_id < 0) {
        ks_error(d, t->name, "model.vocab: empty vocabulary");
        rc = -1;
        goto done;
    }
    t->n_vocab = c.max_id + 1;
    t->pieces = ks_arena_alloc(&t->arena, (size_t)t->n_vocab * sizeof *t->pieces);
    t->special = t->pieces ? ks_arena_alloc(&t->arena, (size_t)t->n_vocab) : NULL;
    if (!t->special) {
        rc = nomem(&c, 0);
        goto done;
    }
    /* id -> text from the final map (a key listed twice keeps its later id;
     * of two keys with one id, the later in the file wins). */
    for (size_t i = 0; i < c.n_vkeys; i++)
        if (krt_tok_strmap_get(&t->vocab, c.vkeys[i].p, c.vkeys[i].len) == c.vids[i])
            t->pieces[c.vids[i]] = c.vkeys[i];
    for (size_t k = 0; k < hf->n_added; k++) {
        const krt_tok_added *a = &hf->added[k];
        if ((size_t)a->owner != k) continue;
        t->pieces[a->id] = a->match; /* HF's id_to_token gives the normalized form */
        t->special[a->id] = a->special;
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        hf->byte_ids[b] = krt_tok_strmap_get(&t->vocab, name, 6);
    }
    hf->unk_id = hf->has_unk ? krt_tok_strmap_get(&t->vocab, hf->unk_token.p, hf->unk_token.len) : -1;
    if (build_added_set(&c, &hf->raw_set, 0) != 0 || build_added_set(&c, &hf->norm_set, 1) != 0) {
        rc = -1;
        goto done;
    }
    if (hf->has_single_word &&
        krt_tok_pattern_regex(&hf->word_char, RUST_WORD, strlen(RUST_WORD), d, t->name,
                              "added_tokens")) {
        rc = -1;
        goto done;
    }
    find_bos_eos(&c);
done:
    cJSON_Delete(root);
    free(copy);
    free(c.vkeys);
    free(c.vids);
    krt_tok_matcher_free(&c.m);
    return rc;
}
