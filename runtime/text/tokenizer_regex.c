/* tokenizer_regex.c — the regexes of tokenizer.json (Split pre-tokenizers,
 * Replace normalizers and decoders, GPT-2's ByteLevel pattern) through
 * PCRE2, with Unicode properties on (\p{L}, \p{N}, Unicode \s), and literal
 * string patterns. Matches are enumerated as the Rust `onig` crate's
 * find_iter does, since that is what Hugging Face's library runs.
 *
 * PCRE2 allocates through support's fallible calls (a general context made
 * with them), so running out of memory inside it is an error like ours: a
 * pattern that cannot be compiled, a match that returns PCRE2_ERROR_NOMEMORY
 * (find_all's -2), and the fault injection reaches it too. */
#include "runtime/text/tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

static void *pcre_alloc(PCRE2_SIZE n, void *ctx)
{
    (void)ctx;
    return ks_try_malloc(n);
}

static void pcre_free(void *p, void *ctx)
{
    (void)ctx;
    free(p);
}

int krt_tok_pattern_regex(krt_tok_pattern *p, const char *re, size_t len, ks_diag *d,
                          const char *file, const char *what)
{
    memset(p, 0, sizeof *p);
    int err = PCRE2_ERROR_NOMEMORY;
    PCRE2_SIZE off = 0;
    /* the code keeps the context's allocator; the contexts themselves go */
    pcre2_general_context *g = pcre2_general_context_create(pcre_alloc, pcre_free, NULL);
    pcre2_compile_context *cc = g ? pcre2_compile_context_create(g) : NULL;
    /* MULTILINE: ^ and $ match at line breaks, as in Oniguruma's Ruby syntax. */
    if (cc)
        p->code = pcre2_compile((PCRE2_SPTR)re, len, PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &off, cc);
    pcre2_compile_context_free(cc);
    pcre2_general_context_free(g);
    if (!p->code && (err == PCRE2_ERROR_NOMEMORY || err == PCRE2_ERROR_HEAP_FAILED))
        return ks_error_oom(d, file, 0, "compiling a regex");
    if (!p->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        ks_error(d, file, "%s: bad regex at offset %zu: %s", what, (size_t)off, (const char *)msg);
        return -1;
    }
    /* The JIT is an optimisation only: without it PCRE2 interprets. */
    (void)pcre2_jit_compile(p->code, PCRE2_JIT_COMPLETE);
    return 0;
}

void krt_tok_pattern_literal(krt_tok_pattern *p, const char *s, size_t len)
{
    memset(p, 0, sizeof *p);
    p->literal = s;
    p->literal_len = len;
}

void krt_tok_pattern_free(krt_tok_pattern *p)
{
    if (p->code) pcre2_code_free(p->code);
    p->code = NULL;
}

int krt_tok_matcher_init(krt_tok_matcher *m)
{
    memset(m, 0, sizeof *m);
    m->gctx = pcre2_general_context_create(pcre_alloc, pcre_free, NULL);
    m->md = m->gctx ? pcre2_match_data_create(1, m->gctx) : NULL;
    m->mctx = m->gctx ? pcre2_match_context_create(m->gctx) : NULL;
    if (!m->md || !m->mctx) return -1;
    /* A pathological pattern from a file must not hang encode. */
    pcre2_set_match_limit(m->mctx, 20 * 1000 * 1000);
    pcre2_set_depth_limit(m->mctx, 100 * 1000);
    return 0;
}

void krt_tok_matcher_free(krt_tok_matcher *m)
{
    pcre2_match_data_free(m->md); /* NULL is nothing to PCRE2 */
    pcre2_match_context_free(m->mctx);
    pcre2_general_context_free(m->gctx);
    free(m->spans);
    memset(m, 0, sizeof *m);
}

/* 0, or -2 when out of memory (the spans so far kept). */
static int add_span(krt_tok_matcher *m, size_t start, size_t end)
{
    if (KS_TRY_GROW(m->spans, m->n_spans + 1, m->cap_spans, (size_t)1 << 40) != 0) return -2;
    m->spans[m->n_spans].start = start;
    m->spans[m->n_spans].end = end;
    m->n_spans++;
    return 0;
}

static int find_literal(krt_tok_matcher *m, const krt_tok_pattern *p, const char *s, size_t n)
{
    size_t k = p->literal_len;
    if (k == 0 || k > n) return 0; /* an empty literal matches nothing (HF's &str pattern) */
    for (size_t i = 0; i + k <= n;) {
        const char *hit = memchr(s + i, p->literal[0], n - i - k + 1);
        if (!hit) break;
        size_t at = (size_t)(hit - s);
        if (memcmp(hit, p->literal, k) == 0) {
            if (add_span(m, at, at + k) != 0) return -2;
            i = at + k;
        } else {
            i = at + 1;
        }
    }
    return 0;
}

int krt_tok_find_all(krt_tok_matcher *m, const krt_tok_pattern *p, const char *s, size_t n)
{
    m->n_spans = 0;
    if (!p->code) {
        int rc = find_literal(m, p, s, n);
        if (rc) m->n_spans = 0;
        return rc;
    }
    /* The onig crate's FindMatches: an empty match right where the previous
     * match ended is skipped by stepping one character. */
    size_t last_end = 0, last_match_end = (size_t)-1;
    while (last_end <= n) {
        int rc = pcre2_match(p->code, (PCRE2_SPTR)s, n, last_end, PCRE2_NO_UTF_CHECK, m->md,
                             m->mctx);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* the interpreter keeps its backtracking on the heap */
            rc = pcre2_match(p->code, (PCRE2_SPTR)s, n, last_end, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                             m->md, m->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            m->n_spans = 0;
            return rc == PCRE2_ERROR_NOMEMORY ? -2 : -1;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(m->md);
        size_t start = ov[0], end = ov[1];
        if (end < start) { /* \K games: treat as no further matches */
            break;
        }
        if (start == end && last_end == last_match_end) {
            last_end += last_end < n ? krt_tok_utf8_char_len((const uint8_t *)s + last_end,
                                                             n - last_end)
                                     : 1;
            continue;
        }
        last_end = end;
        last_match_end = end;
        if (add_span(m, start, end) != 0) {
            m->n_spans = 0;
            return -2;
        }
    }
    return 0;
}

int krt_tok_char_matches(krt_tok_matcher *m, const krt_tok_pattern *p, const char *s, size_t n)
{
    if (!p->code || n == 0) return 0;
    int rc = pcre2_match(p->code, (PCRE2_SPTR)s, n, 0, PCRE2_NO_UTF_CHECK | PCRE2_ANCHORED,
                         m->md, m->mctx);
    return rc == PCRE2_ERROR_NOMEMORY ? -2 : rc >= 0;
}
