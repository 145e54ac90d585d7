/* tokenizer_bpe.c — the two BPE merge loops, both the linked-list + heap
 * form of BPE: a word is a doubly linked list of symbols over an array, and
 * a heap holds every adjacent pair that could merge. Popping the best
 * pair, merging it and pushing the (at most two) pairs it forms makes a word
 * of n symbols cost O(n log n), where re-scanning for the best pair after
 * every merge (llama2.c's run.c) costs O(n^2).
 *
 *  - krt_tok_merge_ranked is Hugging Face's Word::merge_all
 *    (tokenizers/src/models/bpe/word.rs): lowest merge rank first, leftmost
 *    among equal ranks; a popped entry is stale when its left symbol is gone,
 *    has no right neighbour, or the pair there no longer merges into the
 *    same id. Same checks, same order, same result.
 *  - krt_tok_merge_scored is llama2.c's encode loop: the pair whose
 *    concatenation is a vocabulary entry with the highest score, leftmost
 *    among equal scores, only scores above -1e10 (run.c's starting best).
 *    Symbol versions detect stale entries exactly, so the heap pops the
 *    merges run.c's scan would choose, in the same order.
 *
 * Out of memory (a word's symbols or the heap cannot grow) sets w->failed and
 * leaves the word short of symbols or candidates: the merges go on over what
 * is there, without crashing, and the caller, which checks
 * krt_tok_work_failed at the end, throws the result away. */
#include "runtime/text/tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

#define MAX_SYMS ((size_t)INT32_MAX)

void krt_tok_work_free(krt_tok_work *w)
{
    free(w->syms);
    free(w->heap);
    ks_buf_free(&w->scratch);
    memset(w, 0, sizeof *w);
    w->scratch.fallible = 1;
}

void krt_tok_work_push_sym(krt_tok_work *w, int32_t id, uint32_t len)
{
    if (w->failed) return;
    if (KS_TRY_GROW(w->syms, w->n_syms + 1, w->cap_syms, MAX_SYMS) != 0) {
        w->failed = (w->n_syms + 1) * sizeof *w->syms;
        return;
    }
    krt_tok_sym *s = &w->syms[w->n_syms];
    s->id = id;
    s->prev = (int32_t)w->n_syms - 1;
    s->next = -1;
    s->len = len;
    s->version = 0;
    if (w->n_syms > 0) w->syms[w->n_syms - 1].next = (int32_t)w->n_syms;
    w->n_syms++;
}

void krt_tok_work_emit(const krt_tok_work *w, krt_tok_ids *out)
{
    for (size_t i = 0; i < w->n_syms; i++)
        if (w->syms[i].len != 0) krt_tok_ids_push(out, w->syms[i].id);
}

/* ---- the heap ---------------------------------------------------------------- */

/* A 4-ary min-heap on 64-bit keys: shallower than a binary heap, and its
 * children share a cache line, which is what a million-symbol word (a
 * SentencePiece-style text with no pre-tokenizer is one word) needs. */
#define ARITY 4

static void sift_up(krt_tok_cand *h, size_t i)
{
    krt_tok_cand c = h[i];
    while (i > 0) {
        size_t parent = (i - 1) / ARITY;
        if (h[parent].key <= c.key) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = c;
}

static void sift_down(krt_tok_cand *h, size_t n, size_t i)
{
    krt_tok_cand c = h[i];
    for (;;) {
        size_t first = i * ARITY + 1;
        if (first >= n) break;
        size_t best = first, end = first + ARITY < n ? first + ARITY : n;
        for (size_t k = first + 1; k < end; k++)
            if (h[k].key < h[best].key) best = k;
        if (h[best].key >= c.key) break;
        h[i] = h[best];
        i = best;
    }
    h[i] = c;
}

static void heap_push(krt_tok_work *w, uint64_t key, int32_t merged, uint32_t ver, int heapify)
{
    if (w->failed) return;
    if (KS_TRY_GROW(w->heap, w->n_heap + 1, w->cap_heap, MAX_SYMS * 2) != 0) {
        w->failed = (w->n_heap + 1) * sizeof *w->heap;
        return;
    }
    krt_tok_cand *c = &w->heap[w->n_heap++];
    c->key = key;
    c->merged = merged;
    c->ver = ver;
    if (!heapify) sift_up(w->heap, w->n_heap - 1);
}

/* After pushing the initial pairs unordered: Floyd's O(n) heap construction. */
static void heap_build(krt_tok_work *w)
{
    if (w->n_heap < 2) return;
    for (size_t i = (w->n_heap - 2) / ARITY + 1; i-- > 0;) sift_down(w->heap, w->n_heap, i);
}

static krt_tok_cand heap_pop(krt_tok_work *w)
{
    krt_tok_cand top = w->heap[0];
    w->heap[0] = w->heap[--w->n_heap];
    if (w->n_heap > 1) sift_down(w->heap, w->n_heap, 0);
    return top;
}

/* Merge syms[pos] with its right neighbour into `merged`. The pairs that
 * start at pos and at its left neighbour change: both versions move. */
static void merge_at(krt_tok_work *w, int32_t pos, int32_t merged)
{
    krt_tok_sym *s = &w->syms[pos];
    int32_t r = s->next;
    krt_tok_sym *right = &w->syms[r];
    s->id = merged;
    s->len += right->len;
    s->next = right->next;
    s->version++;
    if (s->prev >= 0) w->syms[s->prev].version++;
    right->len = 0;
    right->version++;
    if (right->next >= 0) w->syms[right->next].prev = pos;
}

/* ---- Hugging Face: by rank ---------------------------------------------------- */

static void push_ranked(krt_tok_work *w, const krt_tok_pairmap *merges, int32_t pos, int heapify)
{
    int32_t next = w->syms[pos].next;
    if (next < 0) return;
    int32_t rank, merged;
    if (!krt_tok_pairmap_get(merges, w->syms[pos].id, w->syms[next].id, &rank, &merged)) return;
    heap_push(w, (uint64_t)(uint32_t)rank << 32 | (uint32_t)pos, merged, 0, heapify);
}

void krt_tok_merge_ranked(krt_tok_work *w, const krt_tok_pairmap *merges)
{
    w->n_heap = 0;
    for (size_t i = 0; i + 1 < w->n_syms; i++) push_ranked(w, merges, (int32_t)i, 1);
    heap_build(w);
    while (w->n_heap > 0) {
        krt_tok_cand top = heap_pop(w);
        int32_t pos = (int32_t)(uint32_t)top.key;
        krt_tok_sym *s = &w->syms[pos];
        if (s->len == 0 || s->next < 0) continue;
        /* HF's staleness test: the pair here must still merge into the same id. */
        int32_t rank, merged;
        if (!krt_tok_pairmap_get(merges, s->id, w->syms[s->next].id, &rank, &merged) || merged != top.merged)
            continue;
        merge_at(w, pos, top.merged);
        if (w->syms[pos].prev >= 0) push_ranked(w, merges, w->syms[pos].prev, 0);
        push_ranked(w, merges, pos, 0);
    }
}

/* ---- llama2.c: by score --------------------------------------------------------- */

/* Text of id as run.c sees it: a C string (up to its first NUL). */
static krt_tok_str c_piece(const krt_tok *t, int32_t id)
{
    krt_tok_str s = t->pieces[id];
    const char *nul = s.p ? memchr(s.p, 0, s.len) : NULL;
    if (nul) s.len = (uint32_t)(nul - s.p);
    return s;
}

/* Scores as keys that sort like the floats, highest first; -0 counts as +0
 * (run.c compares with '>'). */
static uint32_t score_key(float score)
{
    if (score == 0) score = 0.0f;
    uint32_t u;
    memcpy(&u, &score, 4);
    u = (u & 0x80000000u) ? ~u : u | 0x80000000u; /* ascending order of floats */
    return ~u;                                     /* descending */
}

static void push_scored(krt_tok_work *w, const krt_tok *t, int32_t pos, int heapify)
{
    int32_t next = w->syms[pos].next;
    if (next < 0) return;
    krt_tok_str a = c_piece(t, w->syms[pos].id), b = c_piece(t, w->syms[next].id);
    if (w->scratch.failed) return;
    w->scratch.len = 0;
    if (a.len) ks_buf_put(&w->scratch, a.p, a.len);
    if (b.len) ks_buf_put(&w->scratch, b.p, b.len);
    if (w->scratch.failed) return; /* krt_tok_work_failed */
    int32_t id = krt_tok_strmap_get(&t->vocab, w->scratch.data ? w->scratch.data : "",
                                    w->scratch.len);
    if (id < 0) return;
    float score = t->scores[id];
    if (!(score > -1e10f)) return; /* run.c starts from best_score = -1e10 and needs '>' */
    heap_push(w, (uint64_t)score_key(score) << 32 | (uint32_t)pos, id, w->syms[pos].version,
              heapify);
}

void krt_tok_merge_scored(krt_tok_work *w, const krt_tok *t)
{
    w->n_heap = 0;
    for (size_t i = 0; i + 1 < w->n_syms; i++) push_scored(w, t, (int32_t)i, 1);
    heap_build(w);
    while (w->n_heap > 0) {
        krt_tok_cand top = heap_pop(w);
        int32_t pos = (int32_t)(uint32_t)top.key;
        krt_tok_sym *s = &w->syms[pos];
        if (s->len == 0 || s->next < 0 || s->version != top.ver) continue;
        merge_at(w, pos, top.merged);
        if (w->syms[pos].prev >= 0) push_scored(w, t, w->syms[pos].prev, 0);
        push_scored(w, t, pos, 0);
    }
}
