/* tokenizer_hf.c — Hugging Face's encode pipeline and decoder chain, step
 * for step as `tokenizers` (Rust) runs them, so ids match its output:
 *
 *   input ──cut raw added tokens──▶ pieces ──normalize each──▶ cut normalized
 *   added tokens ──▶ pre-tokenizers (each splits or rewrites every piece) ──▶
 *   BPE model per piece ──▶ post-processor template (with ADD_SPECIAL)
 *
 * A piece is either text still to encode or an added token's id. Each step
 * reads one list of pieces and writes the next (two buffers, swapped), and
 * drops empty pieces as PreTokenizedString::split does.
 *
 * Decoding maps ids to token strings (added tokens first), runs the decoder
 * chain over the list of strings (decoders work per token or fuse them, as
 * their decode_chain does) and joins the result.
 *
 * Out of memory: every buffer and list here is fallible and remembers that
 * it failed (ks_buf's failed, piece_list's and tok_list's failed, the BPE
 * work's, hf_run's oom for the rest); the pipeline goes on over what it has
 * without crashing, and the entry points look at all of them at the end:
 * encode then reports `out of memory (encoding N bytes of text)` and leaves
 * its output as it was, decode marks its output buffer failed. */
#include "runtime/text/tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- GPT-2's byte <-> character map (bytes_to_unicode) ---------------------- */

/* Printable bytes stand for themselves; the others are shifted to 256.. in order. */
static uint32_t byte_to_cp(uint8_t b)
{
    if (b <= 32) return 256u + b;
    if (b >= 127 && b <= 160) return 289u + (b - 127u);
    if (b == 173) return 323;
    return b;
}

static int cp_to_byte(uint32_t cp)
{
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255))
        return (int)cp;
    if (cp >= 256 && cp <= 288) return (int)(cp - 256);
    if (cp >= 289 && cp <= 322) return (int)(cp - 289 + 127);
    if (cp == 323) return 173;
    return -1;
}

static void put_byte_level(ks_buf *out, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char u[4];
        int k = ks_utf8_encode(byte_to_cp((uint8_t)s[i]), u);
        ks_buf_put(out, u, (size_t)k);
    }
}

static void put(ks_buf *b, const char *s, size_t n)
{
    if (n) ks_buf_put(b, s, n);
}

/* Bytes at off in b, which may still be unallocated when nothing was put. */
static const char *at(const ks_buf *b, size_t off) { return b->data ? b->data + off : ""; }

/* ---- pieces -------------------------------------------------------------------- */

typedef struct piece {
    size_t off;       /* first byte in the list's text */
    size_t len;       /* bytes */
    int32_t id;       /* >= 0: an added token, already encoded; -1: text */
    uint8_t at_start; /* begins at the start of the input (Metaspace prepend "first") */
} piece;

typedef struct piece_list {
    ks_buf text;   /* the pieces' bytes (fallible) */
    piece *p;      /* [n] */
    size_t n;      /* pieces */
    size_t cap;    /* allocated */
    size_t failed; /* 0, or the bytes a growth of p could not get (pieces are missing) */
} piece_list;

typedef struct hf_run {
    const krt_tok *t;     /* the tokenizer */
    const krt_tok_hf *hf; /* its pipeline */
    krt_tok_matcher m;    /* regex scratch */
    krt_tok_work w;       /* BPE scratch */
    piece_list lists[2];  /* current and next */
    int cur;              /* index of the current list */
    ks_buf tmp[2];        /* normalizer scratch (fallible) */
    ks_diag *d;           /* errors, may be NULL */
    size_t oom;           /* 0, or the bytes something else here could not get (1: not known) */
} hf_run;

/* Out of memory in the run (bytes asked for; 0 when not known). */
static void run_oom(hf_run *r, size_t bytes)
{
    if (!r->oom) r->oom = bytes ? bytes : 1;
}

static void list_clear(piece_list *l)
{
    l->text.len = 0;
    l->n = 0;
}

static void list_free(piece_list *l)
{
    ks_buf_free(&l->text);
    free(l->p);
}

/* A piece is added only with its bytes: out of memory leaves the list as
 * it was (and failed), never a piece whose bytes are missing. */
static void list_add(piece_list *l, const char *s, size_t n, int32_t id, int at_start)
{
    if (id < 0 && n == 0) return; /* empty text pieces are dropped */
    if (l->failed) return;
    if (KS_TRY_GROW(l->p, l->n + 1, l->cap, (size_t)1 << 40) != 0) {
        l->failed = (l->n + 1) * sizeof *l->p;
        return;
    }
    size_t off = l->text.len;
    if (n && ks_buf_put(&l->text, s, n) != 0) return; /* l->text.failed */
    piece *p = &l->p[l->n++];
    p->off = off;
    p->len = n;
    p->id = id;
    p->at_start = (uint8_t)at_start;
}

static piece_list *cur_list(hf_run *r) { return &r->lists[r->cur]; }
static piece_list *next_list(hf_run *r)
{
    piece_list *l = &r->lists[!r->cur];
    list_clear(l);
    return l;
}
static void swap_lists(hf_run *r) { r->cur = !r->cur; }

static void report(hf_run *r, const char *fmt, const char *arg)
{
    if (r->d) ks_error(r->d, r->t->name, fmt, arg);
}

/* ---- added tokens ----------------------------------------------------------------- */

static uint32_t cp_at(const char *s, size_t n, size_t i, size_t *len)
{
    uint32_t cp = 0xFFFD;
    size_t l = krt_tok_utf8_valid_len((const uint8_t *)s + i, n - i, &cp);
    *len = l ? l : 1;
    return cp;
}

/* Start of the last character of s[0..n). */
static size_t last_char_start(const char *s, size_t n)
{
    size_t i = n;
    while (i > 0 && ((uint8_t)s[i - 1] & 0xC0) == 0x80 && n - i < 3) i--;
    return i > 0 ? i - 1 : 0;
}

static int word_char_at(hf_run *r, const char *s, size_t n)
{
    int rc = krt_tok_char_matches(&r->m, &r->hf->word_char, s, krt_tok_utf8_char_len((const uint8_t *)s, n));
    if (rc < 0) run_oom(r, 0);
    return rc > 0;
}

/* AddedVocabulary::find_matches + split_with_indices over one text piece. */
static void split_added(hf_run *r, const krt_tok_added_set *set, const char *s, size_t n,
                        int at_start, piece_list *out)
{
    const krt_tok_hf *hf = r->hf;
    size_t start_offset = 0, i = 0;
    while (set->n && i < n) {
        uint8_t b = (uint8_t)s[i];
        const krt_tok_added *hit = NULL;
        for (uint32_t k = set->first[b]; k < set->first[b + 1]; k++) {
            const krt_tok_added *a = &hf->added[set->order[k]];
            if (a->match.len <= n - i && memcmp(s + i, a->match.p, a->match.len) == 0) {
                hit = a;
                break;
            }
        }
        if (!hit) {
            i++;
            continue;
        }
        size_t start = i, stop = i + hit->match.len;
        i = stop; /* matches never overlap, kept or not */
        const krt_tok_added *opt = &hf->added[hit->owner];
        if (opt->single_word) {
            int start_space = start == 0 || !word_char_at(r, s + last_char_start(s, start),
                                                          start - last_char_start(s, start));
            int stop_space = stop == n || !word_char_at(r, s + stop, n - stop);
            if (!start_space || !stop_space) continue;
        }
        if (opt->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t cs = last_char_start(s, ns), l;
                if (!krt_tok_is_space(cp_at(s, ns, cs, &l))) break;
                ns = cs;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (opt->rstrip) {
            while (stop < n) {
                size_t l;
                if (!krt_tok_is_space(cp_at(s, n, stop, &l))) break;
                stop += l;
            }
        }
        if (start < start_offset) continue; /* would overlap what an rstrip took */
        if (start_offset < start) list_add(out, s + start_offset, start - start_offset, -1,
                                           at_start && start_offset == 0);
        list_add(out, s + start, stop - start, hit->id, 0);
        start_offset = stop;
        i = stop; /* what an rstrip took cannot start another match */
    }
    if (start_offset < n) list_add(out, s + start_offset, n - start_offset, -1,
                                   at_start && start_offset == 0);
}

/* ---- normalizers -------------------------------------------------------------------- */

static int apply_norm(krt_tok_matcher *m, const krt_tok_norm *nm, const char *s, size_t n,
                      ks_buf *out)
{
    switch (nm->kind) {
    case KRT_NORM_PREPEND:
        if (n) put(out, nm->text.p, nm->text.len);
        put(out, s, n);
        return 0;
    case KRT_NORM_REPLACE: {
        int rc = krt_tok_find_all(m, &nm->pattern, s, n);
        if (rc) return rc; /* -1 the regex gave up, -2 out of memory */
        size_t at = 0;
        for (size_t k = 0; k < m->n_spans; k++) {
            put(out, s + at, m->spans[k].start - at);
            put(out, nm->text.p, nm->text.len);
            at = m->spans[k].end;
        }
        put(out, s + at, n - at);
        return 0;
    }
    case KRT_NORM_STRIP: {
        size_t a = 0, e = n, l;
        if (nm->left)
            while (a < e && krt_tok_is_space(cp_at(s, n, a, &l))) a += l;
        if (nm->right)
            while (e > a) {
                size_t cs = last_char_start(s, e);
                if (!krt_tok_is_space(cp_at(s, e, cs, &l))) break;
                e = cs;
            }
        put(out, s + a, e - a);
        return 0;
    }
    case KRT_NORM_BYTELEVEL:
        put_byte_level(out, s, n);
        return 0;
    }
    KS_UNREACHABLE();
}

int krt_tok_hf_normalize(const krt_tok *t, krt_tok_matcher *m, const char *s, size_t n, ks_buf *out)
{
    const krt_tok_hf *hf = t->hf;
    ks_buf bufs[2] = {KS_BUF_TRY, KS_BUF_TRY};
    const char *cur = s;
    size_t cur_n = n;
    int which = 0, rc = 0;
    for (size_t k = 0; k < hf->n_norms && rc == 0; k++) {
        ks_buf *o = &bufs[which];
        ks_buf_clear(o);
        rc = apply_norm(m, &hf->norms[k], cur, cur_n, o);
        if (o->failed) rc = -2;
        cur = o->data ? o->data : "";
        cur_n = o->len;
        which = !which;
    }
    if (rc == 0) put(out, cur, cur_n);
    ks_buf_free(&bufs[0]);
    ks_buf_free(&bufs[1]);
    return rc;
}

/* ---- pre-tokenizers ------------------------------------------------------------------ */

typedef struct split_part {
    size_t start, end; /* bytes of the piece */
    int is_match;      /* a match of the pattern (after invert) */
} split_part;

/* NormalizedString::split: the matches and the gaps between them, then the
 * behavior, then empty parts dropped. */
static void split_piece(hf_run *r, const char *s, size_t n, int at_start,
                        krt_tok_split_behavior behavior, int invert, piece_list *out)
{
    krt_tok_matcher *m = &r->m;
    size_t ns = m->n_spans;
    split_part *parts = ks_try_calloc(2 * ns + 2, sizeof *parts);
    if (!parts) {
        run_oom(r, (2 * ns + 2) * sizeof *parts);
        return;
    }
    size_t np = 0, prev = 0;
    for (size_t k = 0; k < ns; k++) {
        if (prev != m->spans[k].start)
            parts[np++] = (split_part){prev, m->spans[k].start, 0};
        parts[np++] = (split_part){m->spans[k].start, m->spans[k].end, 1};
        prev = m->spans[k].end;
    }
    if (prev != n || np == 0) parts[np++] = (split_part){prev, n, 0};
    if (invert)
        for (size_t k = 0; k < np; k++) parts[k].is_match = !parts[k].is_match;
    /* Merge per behavior into `merged` (same storage: it never grows). */
    size_t nm = 0;
    int previous_match = 0;
    switch (behavior) {
    case KRT_SPLIT_REMOVED:
    case KRT_SPLIT_ISOLATED:
        nm = np;
        break;
    case KRT_SPLIT_MERGED_WITH_PREVIOUS:
        for (size_t k = 0; k < np; k++) {
            if (parts[k].is_match && !previous_match && nm > 0)
                parts[nm - 1].end = parts[k].end;
            else
                parts[nm++] = parts[k];
            previous_match = parts[k].is_match;
        }
        break;
    case KRT_SPLIT_MERGED_WITH_NEXT: {
        /* Walk backwards, then restore the order. */
        split_part *rev = ks_try_calloc(np + 1, sizeof *rev);
        if (!rev) {
            run_oom(r, (np + 1) * sizeof *rev);
            free(parts);
            return;
        }
        for (size_t k = np; k-- > 0;) {
            if (parts[k].is_match && !previous_match && nm > 0)
                rev[nm - 1].start = parts[k].start;
            else
                rev[nm++] = parts[k];
            previous_match = parts[k].is_match;
        }
        for (size_t k = 0; k < nm; k++) parts[k] = rev[nm - 1 - k];
        free(rev);
        break;
    }
    case KRT_SPLIT_CONTIGUOUS:
        for (size_t k = 0; k < np; k++) {
            if (parts[k].is_match == previous_match && nm > 0)
                parts[nm - 1].end = parts[k].end;
            else
                parts[nm++] = parts[k];
            previous_match = parts[k].is_match;
        }
        break;
    }
    for (size_t k = 0; k < nm; k++) {
        if (behavior == KRT_SPLIT_REMOVED && parts[k].is_match) continue;
        list_add(out, s + parts[k].start, parts[k].end - parts[k].start, -1,
                 at_start && parts[k].start == 0);
    }
    free(parts);
}

static int run_pretok(hf_run *r, const krt_tok_pretok *pt)
{
    piece_list *in = cur_list(r), *out = next_list(r);
    ks_buf *tmp = &r->tmp[0];
    for (size_t i = 0; i < in->n; i++) {
        const piece *p = &in->p[i];
        const char *s = at(&in->text, p->off);
        if (p->id >= 0) {
            list_add(out, s, p->len, p->id, p->at_start);
            continue;
        }
        switch (pt->kind) {
        case KRT_PRETOK_BYTELEVEL: {
            tmp->len = 0;
            if (pt->add_prefix_space && (p->len == 0 || s[0] != ' ')) put(tmp, " ", 1);
            put(tmp, s, p->len);
            const char *src = tmp->data ? tmp->data : "";
            size_t n = tmp->len;
            size_t first = out->n;
            if (pt->use_regex) {
                int frc = krt_tok_find_all(&r->m, &pt->pattern, src ? src : "", n);
                if (frc == -2) {
                    run_oom(r, 0);
                    return -1;
                }
                if (frc) {
                    report(r, "cannot encode: the %s regex gave up (backtracking limit)",
                           "ByteLevel");
                    return -1;
                }
                split_piece(r, src, n, p->at_start, KRT_SPLIT_ISOLATED, 0, out);
            } else {
                list_add(out, src, n, -1, p->at_start);
            }
            /* Map the new pieces' bytes to GPT-2's characters, in place at the end. */
            for (size_t k = first; k < out->n; k++) {
                ks_buf *mapped = &r->tmp[1];
                mapped->len = 0; /* a failure stays: the run fails */
                put_byte_level(mapped, at(&out->text, out->p[k].off), out->p[k].len);
                size_t off = out->text.len;
                put(&out->text, mapped->data, mapped->len);
                out->p[k].off = off;
                out->p[k].len = mapped->failed || out->text.failed ? 0 : mapped->len; /* failed: the run fails */
            }
            break;
        }
        case KRT_PRETOK_SPLIT: {
            int frc = krt_tok_find_all(&r->m, &pt->pattern, s, p->len);
            if (frc == -2) {
                run_oom(r, 0);
                return -1;
            }
            if (frc) {
                report(r, "cannot encode: the %s regex gave up (backtracking limit)", "Split");
                return -1;
            }
            split_piece(r, s, p->len, p->at_start, pt->behavior, pt->invert, out);
            break;
        }
        case KRT_PRETOK_METASPACE: {
            tmp->len = 0;
            int prepend = pt->prepend == KRT_PREPEND_ALWAYS ||
                          (pt->prepend == KRT_PREPEND_FIRST && p->at_start);
            /* ' ' -> replacement, then prepend unless it already starts with one. */
            ks_buf *rep = &r->tmp[1];
            rep->len = 0;
            for (size_t k = 0; k < p->len; k++) {
                if (s[k] == ' ')
                    put(rep, pt->replacement.p, pt->replacement.len);
                else
                    put(rep, s + k, 1);
            }
            int starts = rep->len >= pt->replacement.len &&
                         memcmp(rep->data, pt->replacement.p, pt->replacement.len) == 0;
            if (prepend && !starts) put(tmp, pt->replacement.p, pt->replacement.len);
            put(tmp, rep->data, rep->len);
            if (pt->split) {
                krt_tok_pattern lit;
                krt_tok_pattern_literal(&lit, pt->replacement.p, pt->replacement.len);
                if (krt_tok_find_all(&r->m, &lit, tmp->data ? tmp->data : "", tmp->len) != 0) {
                    run_oom(r, 0); /* a literal never gives up */
                    return -1;
                }
                split_piece(r, tmp->data ? tmp->data : "", tmp->len, p->at_start,
                            KRT_SPLIT_MERGED_WITH_NEXT, 0, out);
            } else {
                list_add(out, tmp->data, tmp->len, -1, p->at_start);
            }
            break;
        }
        }
    }
    swap_lists(r);
    return 0;
}

/* ---- the BPE model --------------------------------------------------------------------- */

/* BPE::tokenize for one piece (tokenizers/src/models/bpe/model.rs merge_word). */
static int model_piece(hf_run *r, const char *s, size_t n, krt_tok_ids *out)
{
    const krt_tok *t = r->t;
    const krt_tok_hf *hf = r->hf;
    if (n == 0) return 0;
    if (hf->ignore_merges) {
        int32_t id = krt_tok_strmap_get(&t->vocab, s, n);
        if (id >= 0) {
            krt_tok_ids_push(out, id);
            return 0;
        }
    }
    krt_tok_work *w = &r->w;
    w->n_syms = 0;
    int32_t unk_id = -1;
    uint32_t unk_len = 0;
    int unk_pending = 0;
    ks_buf *key = &r->tmp[0];
    for (size_t i = 0; i < n;) {
        size_t clen = krt_tok_utf8_char_len((const uint8_t *)s + i, n - i);
        int is_first = i == 0, is_last = i + clen == n;
        key->len = 0;
        if (!is_first) put(key, hf->cont_prefix.p, hf->cont_prefix.len);
        put(key, s + i, clen);
        if (is_last) put(key, hf->word_suffix.p, hf->word_suffix.len);
        i += clen;
        int32_t id = krt_tok_strmap_get(&t->vocab, key->data, key->len);
        if (id >= 0) {
            if (unk_pending) krt_tok_work_push_sym(w, unk_id, unk_len);
            unk_pending = 0;
            krt_tok_work_push_sym(w, id, (uint32_t)clen);
            continue;
        }
        if (hf->byte_fallback) {
            int all = 1;
            for (size_t k = 0; k < key->len && all; k++) all = hf->byte_ids[(uint8_t)key->data[k]] >= 0;
            if (all) {
                /* As in HF, a pending unk is not flushed first: it lands after these. */
                for (size_t k = 0; k < key->len; k++)
                    krt_tok_work_push_sym(w, hf->byte_ids[(uint8_t)key->data[k]], 1);
                continue;
            }
        }
        if (!hf->has_unk) continue; /* no unk token: the character is dropped */
        if (hf->unk_id < 0) {
            report(r, "cannot encode: the unk token '%s' is not in the vocabulary", hf->unk_token.p);
            return -1;
        }
        if (unk_pending && hf->fuse_unk) {
            unk_len += (uint32_t)clen;
        } else {
            if (unk_pending) krt_tok_work_push_sym(w, unk_id, unk_len);
            unk_pending = 1;
            unk_id = hf->unk_id;
            unk_len = (uint32_t)clen;
        }
    }
    if (unk_pending) krt_tok_work_push_sym(w, unk_id, unk_len);
    krt_tok_merge_ranked(w, &hf->merges);
    krt_tok_work_emit(w, out);
    return 0;
}

/* ---- encode ------------------------------------------------------------------------------ */

static void run_free(hf_run *r)
{
    krt_tok_matcher_free(&r->m);
    krt_tok_work_free(&r->w);
    list_free(&r->lists[0]);
    list_free(&r->lists[1]);
    ks_buf_free(&r->tmp[0]);
    ks_buf_free(&r->tmp[1]);
}

static int encode_text(hf_run *r, const char *text, size_t len, krt_tok_ids *out)
{
    const krt_tok_hf *hf = r->hf;
    /* 1. Added tokens that are not normalized, found in the raw input. */
    piece_list *l = next_list(r);
    split_added(r, &hf->raw_set, text, len, 1, l);
    swap_lists(r);
    /* 2. Normalize each text piece; find the normalized added tokens in it. */
    piece_list *in = cur_list(r), *nx = next_list(r);
    for (size_t i = 0; i < in->n; i++) {
        const piece *p = &in->p[i];
        const char *s = at(&in->text, p->off);
        if (p->id >= 0) {
            list_add(nx, s, p->len, p->id, 0);
            continue;
        }
        ks_buf *norm = &r->tmp[0];
        norm->len = 0; /* a failure stays: the run fails */
        int nrc = krt_tok_hf_normalize(r->t, &r->m, s, p->len, norm);
        if (nrc == -2) {
            run_oom(r, 0);
            return -1;
        }
        if (nrc) {
            report(r, "cannot encode: the %s regex gave up (backtracking limit)", "normalizer");
            return -1;
        }
        split_added(r, &hf->norm_set, norm->data ? norm->data : "", norm->len, p->at_start, nx);
    }
    swap_lists(r);
    /* 3. Pre-tokenizers. */
    for (size_t k = 0; k < hf->n_pretoks; k++)
        if (run_pretok(r, &hf->pretoks[k])) return -1;
    /* 4. The model. */
    in = cur_list(r);
    for (size_t i = 0; i < in->n; i++) {
        const piece *p = &in->p[i];
        if (p->id >= 0)
            krt_tok_ids_push(out, p->id);
        else if (model_piece(r, at(&in->text, p->off), p->len, out))
            return -1;
    }
    return 0;
}

/* The first failure of the run's memory: bytes asked for (1: not known), or 0. */
static size_t run_failed(const hf_run *r)
{
    size_t f[] = {r->oom,
                  r->lists[0].failed,
                  r->lists[0].text.failed,
                  r->lists[1].failed,
                  r->lists[1].text.failed,
                  r->tmp[0].failed,
                  r->tmp[1].failed,
                  r->w.failed,
                  r->w.scratch.failed};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i]) return f[i];
    return 0;
}

int krt_tok_encode_hf(const krt_tok *t, const char *text, size_t len, int flags, krt_tok_ids *out,
                      ks_diag *d)
{
    hf_run r = {.w = KRT_TOK_WORK_INIT};
    r.t = t;
    r.hf = t->hf;
    r.d = d;
    r.lists[0].text.fallible = r.lists[1].text.fallible = r.tmp[0].fallible = r.tmp[1].fallible = 1;
    size_t mark = out->len, in_len = len;
    ks_buf repaired = KS_BUF_TRY;
    int rc = 0;
    if (krt_tok_matcher_init(&r.m) != 0) run_oom(&r, 0);
    if (!r.oom && !krt_tok_utf8_is_valid(text, len)) {
        krt_tok_utf8_lossy(&repaired, text, len);
        text = repaired.data ? repaired.data : "";
        len = repaired.len;
        if (repaired.failed) run_oom(&r, repaired.failed);
    }
    int add = (flags & KRT_TOK_ADD_SPECIAL) && r.hf->post == KRT_POST_TEMPLATE;
    if (!r.oom && add)
        for (size_t i = 0; i < r.hf->n_post_before; i++) krt_tok_ids_push(out, r.hf->post_before[i]);
    if (!r.oom) rc = encode_text(&r, text, len, out);
    if (rc == 0 && add)
        for (size_t i = 0; i < r.hf->n_post_after; i++) krt_tok_ids_push(out, r.hf->post_after[i]);
    size_t failed = run_failed(&r) ? run_failed(&r) : out->failed;
    if (failed) {
        char what[64];
        snprintf(what, sizeof what, "encoding %zu bytes of text", in_len);
        if (d) ks_error_oom(d, t->name, failed > 1 ? failed : 0, what);
        rc = -1;
    }
    if (rc) {
        out->len = mark;
        out->failed = 0;
    }
    ks_buf_free(&repaired);
    run_free(&r);
    return rc;
}

/* ---- decode ------------------------------------------------------------------------------ */

typedef struct tok_span {
    size_t off; /* first byte in the list's text */
    size_t len; /* bytes */
} tok_span;

typedef struct tok_list {
    ks_buf text;    /* the strings' bytes (fallible) */
    tok_span *s;    /* [n] each string */
    size_t n;       /* strings */
    size_t cap;     /* allocated */
    size_t failed;  /* 0, or the bytes a growth of s could not get (strings are missing) */
} tok_list;

/* A string is added only with its bytes (as list_add). */
static void tl_add(tok_list *l, const char *s, size_t n)
{
    if (l->failed) return;
    if (KS_TRY_GROW(l->s, l->n + 1, l->cap, (size_t)1 << 40) != 0) {
        l->failed = (l->n + 1) * sizeof *l->s;
        return;
    }
    size_t off = l->text.len;
    if (n && ks_buf_put(&l->text, s, n) != 0) return; /* l->text.failed */
    l->s[l->n].off = off;
    l->s[l->n].len = n;
    l->n++;
}

static void tl_clear(tok_list *l)
{
    l->text.len = 0; /* a failure stays: the decode fails */
    l->n = 0;
}

static void tl_free(tok_list *l)
{
    ks_buf_free(&l->text);
    free(l->s);
}

static const char *tl_str(const tok_list *l, size_t i) { return at(&l->text, l->s[i].off); }

/* "<0xNN>" -> the byte (ByteFallback: exactly 6 bytes, two hex digits). */
static int byte_token(const char *s, size_t n, uint8_t *b)
{
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return 0;
    unsigned v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        unsigned d;
        if (c >= '0' && c <= '9') d = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') d = (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') d = (unsigned)(c - 'A' + 10);
        else return 0;
        v = v * 16 + d;
    }
    *b = (uint8_t)v;
    return 1;
}

static void flush_bytes(tok_list *out, ks_buf *bytes)
{
    if (bytes->len == 0) return;
    if (krt_tok_utf8_is_valid(bytes->data, bytes->len)) {
        tl_add(out, bytes->data, bytes->len);
    } else {
        for (size_t k = 0; k < bytes->len; k++) tl_add(out, "\xEF\xBF\xBD", 3);
    }
    bytes->len = 0;
}

/* One decoder over in into out. Out of memory: out, b or *oom (bytes; 1
 * when not known) records it. */
static void run_decoder(krt_tok_matcher *m, const krt_tok_dec *dec, const tok_list *in,
                        tok_list *out, size_t *oom)
{
    ks_buf b = KS_BUF_TRY;
    switch (dec->kind) {
    case KRT_DEC_BYTELEVEL:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = tl_str(in, i);
            size_t n = in->s[i].len, mark = b.len;
            int ok = 1;
            for (size_t k = 0; k < n && ok;) {
                uint32_t cp = 0;
                size_t l = krt_tok_utf8_valid_len((const uint8_t *)s + k, n - k, &cp);
                int byte = l ? cp_to_byte(cp) : -1;
                if (byte < 0) {
                    ok = 0;
                    break;
                }
                uint8_t c = (uint8_t)byte;
                ks_buf_put(&b, &c, 1);
                k += l;
            }
            if (!ok) { /* a character outside the map: the token's own bytes */
                b.len = mark;
                put(&b, s, n);
            }
        }
        {
            ks_buf fixed = KS_BUF_TRY;
            krt_tok_utf8_lossy(&fixed, b.data ? b.data : "", b.len);
            tl_add(out, fixed.data ? fixed.data : "", fixed.len);
            if (fixed.failed && !*oom) *oom = fixed.failed;
            ks_buf_free(&fixed);
        }
        break;
    case KRT_DEC_REPLACE:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = tl_str(in, i);
            size_t n = in->s[i].len;
            b.len = 0;
            int frc = krt_tok_find_all(m, &dec->pattern, s, n);
            if (frc == -2 && !*oom) *oom = 1;
            if (frc) m->n_spans = 0;
            size_t at = 0;
            for (size_t k = 0; k < m->n_spans; k++) {
                put(&b, s + at, m->spans[k].start - at);
                put(&b, dec->text.p, dec->text.len);
                at = m->spans[k].end;
            }
            put(&b, s + at, n - at);
            tl_add(out, b.data ? b.data : "", b.len);
        }
        break;
    case KRT_DEC_BYTEFALLBACK:
        for (size_t i = 0; i < in->n; i++) {
            uint8_t byte;
            if (byte_token(tl_str(in, i), in->s[i].len, &byte)) {
                ks_buf_put(&b, &byte, 1);
            } else {
                flush_bytes(out, &b);
                tl_add(out, tl_str(in, i), in->s[i].len);
            }
        }
        flush_bytes(out, &b);
        break;
    case KRT_DEC_FUSE:
        for (size_t i = 0; i < in->n; i++) put(&b, tl_str(in, i), in->s[i].len);
        tl_add(out, b.data ? b.data : "", b.len);
        break;
    case KRT_DEC_STRIP:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = tl_str(in, i);
            size_t n = in->s[i].len;
            /* Character boundaries. */
            size_t nch = 0;
            for (size_t k = 0; k < n; k += krt_tok_utf8_char_len((const uint8_t *)s + k, n - k)) nch++;
            size_t *at = ks_try_calloc(nch + 1, sizeof *at);
            uint32_t *cps = ks_try_calloc(nch + 1, sizeof *cps);
            if (!at || !cps) {
                if (!*oom) *oom = (nch + 1) * (sizeof *at + sizeof *cps);
                free(at);
                free(cps);
                break;
            }
            size_t c = 0;
            for (size_t k = 0; k < n;) {
                size_t l;
                cps[c] = cp_at(s, n, k, &l);
                at[c++] = k;
                k += l;
            }
            at[nch] = n;
            size_t start_cut = 0, stop_cut = nch;
            for (size_t k = 0; k < (size_t)dec->start && k < nch; k++) {
                if (cps[k] != dec->ch) break;
                start_cut = k + 1;
            }
            for (size_t k = 0; k < (size_t)dec->stop && k < nch; k++) {
                size_t idx = nch - k - 1;
                if (cps[idx] != dec->ch) break;
                stop_cut = idx;
            }
            if (start_cut > stop_cut) start_cut = stop_cut;
            tl_add(out, s + at[start_cut], at[stop_cut] - at[start_cut]);
            free(at);
            free(cps);
        }
        break;
    case KRT_DEC_METASPACE:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = tl_str(in, i);
            size_t n = in->s[i].len;
            b.len = 0;
            for (size_t k = 0; k < n;) {
                size_t l = krt_tok_utf8_char_len((const uint8_t *)s + k, n - k);
                if (l == dec->text.len && memcmp(s + k, dec->text.p, l) == 0) {
                    if (!(i == 0 && dec->prepend != KRT_PREPEND_NEVER)) put(&b, " ", 1);
                } else {
                    put(&b, s + k, l);
                }
                k += l;
            }
            tl_add(out, b.data ? b.data : "", b.len);
        }
        break;
    }
    if (b.failed && !*oom) *oom = b.failed;
    ks_buf_free(&b);
}

void krt_tok_decode_hf(const krt_tok *t, const int32_t *ids, size_t n, int flags, ks_buf *out)
{
    const krt_tok_hf *hf = t->hf;
    tok_list lists[2];
    memset(lists, 0, sizeof lists);
    lists[0].text.fallible = lists[1].text.fallible = 1;
    size_t oom = 0; /* what else ran out: bytes (1: not known) */
    int cur = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_vocab || !t->pieces[id].p) continue;
        if ((flags & KRT_TOK_SKIP_SPECIAL) && t->special[id]) continue;
        tl_add(&lists[0], t->pieces[id].p, t->pieces[id].len);
    }
    ks_buf joined = KS_BUF_TRY;
    if (!hf->has_decoder) {
        for (size_t i = 0; i < lists[0].n; i++) {
            if (i) put(&joined, " ", 1);
            put(&joined, tl_str(&lists[0], i), lists[0].s[i].len);
        }
    } else {
        krt_tok_matcher m;
        if (krt_tok_matcher_init(&m) != 0) oom = 1;
        for (size_t k = 0; k < hf->n_decs && !oom; k++) {
            tl_clear(&lists[!cur]);
            run_decoder(&m, &hf->decs[k], &lists[cur], &lists[!cur], &oom);
            cur = !cur;
        }
        krt_tok_matcher_free(&m);
        for (size_t i = 0; i < lists[cur].n; i++) put(&joined, tl_str(&lists[cur], i), lists[cur].s[i].len);
    }
    size_t f[] = {oom, lists[0].failed, lists[0].text.failed, lists[1].failed, lists[1].text.failed, joined.failed};
    for (size_t i = 0; i < sizeof f / sizeof f[0] && !oom; i++) oom = f[i];
    if (oom)
        ks_buf_fail(out, oom > 1 ? oom : 0); /* the text would be wrong: none */
    else
        krt_tok_utf8_lossy(out, joined.data ? joined.data : "", joined.len);
    ks_buf_put(out, "", 0); /* NUL-terminated even when nothing was added */
    ks_buf_free(&joined);
    tl_free(&lists[0]);
    tl_free(&lists[1]);
}
