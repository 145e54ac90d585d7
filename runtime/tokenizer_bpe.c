/* tokenizer_bpe.c — the two BPE merge loops, both the linked-list + heap
 * form of BPE: a word is a doubly linked list of symbols over an array, and
 * a binary heap holds every adjacent pair that could merge. Popping the best
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
 *    merges run.c's scan would choose, in the same order. */
#include "runtime/tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

#define MAX_SYMS ((size_t)INT32_MAX)

void krt_tok_work_free(krt_tok_work *w)
{
    free(w->syms);
    free(w->heap);
    ks_buf_free(&w->scratch);
    memset(w, 0, sizeof *w);
}

void krt_tok_work_push_sym(krt_tok_work *w, int32_t id, uint32_t len)
{
    KS_GROW(w->syms, w->n_syms + 1, w->cap_syms, MAX_SYMS, "symbols in one word");
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

/* a pops before b? */
static int before(const krt_tok_cand *a, const krt_tok_cand *b, int scored)
{
    if (scored) {
        if (a->score != b->score) return a->score > b->score;
    } else if (a->rank != b->rank) {
        return a->rank < b->rank;
    }
    return a->pos < b->pos;
}

static void heap_push(krt_tok_work *w, const krt_tok_cand *c, int scored)
{
    KS_GROW(w->heap, w->n_heap + 1, w->cap_heap, MAX_SYMS * 2, "merge candidates");
    size_t i = w->n_heap++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!before(c, &w->heap[parent], scored)) break;
        w->heap[i] = w->heap[parent];
        i = parent;
    }
    w->heap[i] = *c;
}

static krt_tok_cand heap_pop(krt_tok_work *w, int scored)
{
    krt_tok_cand top = w->heap[0];
    krt_tok_cand last = w->heap[--w->n_heap];
    size_t i = 0, n = w->n_heap;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, best = i;
        const krt_tok_cand *bc = &last;
        if (l < n && before(&w->heap[l], bc, scored)) best = l, bc = &w->heap[l];
        if (r < n && before(&w->heap[r], bc, scored)) best = r;
        if (best == i) break;
        w->heap[i] = w->heap[best];
        i = best;
    }
    if (n > 0) w->heap[i] = last;
    return top;
}

/* Merge syms[pos] with its right neighbour into `merged`. */
static void merge_at(krt_tok_work *w, int32_t pos, int32_t merged)
{
    krt_tok_sym *s = &w->syms[pos];
    int32_t r = s->next;
    krt_tok_sym *right = &w->syms[r];
    s->id = merged;
    s->len += right->len;
    s->next = right->next;
    s->version++;
    right->len = 0;
    right->version++;
    if (right->next >= 0) w->syms[right->next].prev = pos;
}

/* ---- Hugging Face: by rank ---------------------------------------------------- */

static void push_ranked(krt_tok_work *w, const krt_tok_pairmap *merges, int32_t pos)
{
    int32_t next = w->syms[pos].next;
    if (next < 0) return;
    const krt_tok_pairmap_slot *m = krt_tok_pairmap_get(merges, w->syms[pos].id, w->syms[next].id);
    if (!m) return;
    krt_tok_cand c = {0};
    c.rank = m->rank;
    c.pos = pos;
    c.merged = m->merged;
    heap_push(w, &c, 0);
}

void krt_tok_merge_ranked(krt_tok_work *w, const krt_tok_pairmap *merges)
{
    w->n_heap = 0;
    for (size_t i = 0; i + 1 < w->n_syms; i++) push_ranked(w, merges, (int32_t)i);
    while (w->n_heap > 0) {
        krt_tok_cand top = heap_pop(w, 0);
        krt_tok_sym *s = &w->syms[top.pos];
        if (s->len == 0 || s->next < 0) continue;
        const krt_tok_pairmap_slot *m =
            krt_tok_pairmap_get(merges, s->id, w->syms[s->next].id);
        if (!m || m->merged != top.merged) continue;
        merge_at(w, top.pos, top.merged);
        if (w->syms[top.pos].prev >= 0) push_ranked(w, merges, w->syms[top.pos].prev);
        push_ranked(w, merges, top.pos);
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

static void push_scored(krt_tok_work *w, const krt_tok *t, int32_t pos)
{
    int32_t next = w->syms[pos].next;
    if (next < 0) return;
    krt_tok_str a = c_piece(t, w->syms[pos].id), b = c_piece(t, w->syms[next].id);
    w->scratch.len = 0;
    if (a.len) ks_buf_put(&w->scratch, a.p, a.len);
    if (b.len) ks_buf_put(&w->scratch, b.p, b.len);
    int32_t id = krt_tok_strmap_get(&t->vocab, w->scratch.data ? w->scratch.data : "",
                                    w->scratch.len);
    if (id < 0) return;
    float score = t->scores[id];
    if (!(score > -1e10f)) return; /* run.c starts from best_score = -1e10 and needs '>' */
    krt_tok_cand c = {0};
    c.score = score;
    c.pos = pos;
    c.merged = id;
    c.lver = w->syms[pos].version;
    c.rver = w->syms[next].version;
    heap_push(w, &c, 1);
}

void krt_tok_merge_scored(krt_tok_work *w, const krt_tok *t)
{
    w->n_heap = 0;
    for (size_t i = 0; i + 1 < w->n_syms; i++) push_scored(w, t, (int32_t)i);
    while (w->n_heap > 0) {
        krt_tok_cand top = heap_pop(w, 1);
        krt_tok_sym *s = &w->syms[top.pos];
        if (s->len == 0 || s->next < 0 || s->version != top.lver ||
            w->syms[s->next].version != top.rver)
            continue;
        merge_at(w, top.pos, top.merged);
        if (w->syms[top.pos].prev >= 0) push_scored(w, t, w->syms[top.pos].prev);
        push_scored(w, t, top.pos);
    }
}
