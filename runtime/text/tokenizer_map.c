/* tokenizer_map.c — the tokenizer's two maps, over ks_hmap (support/hmap.c): byte
 * strings -> ids (the vocabulary) and id pairs -> merges. Both live in the
 * owner's arena and hold at most the entries the file declares: the size they
 * are made with is their limit, and they are made with room for it, so only
 * making one allocates (and may run out of memory); a put never does. */
#include "runtime/text/tokenizer_internal.h"

int krt_tok_strmap_init(krt_tok_strmap *m, ks_arena *a, size_t n)
{
    return ks_hmap_init(m, a, n, n, "tokenizer strings");
}

int32_t krt_tok_strmap_put(krt_tok_strmap *m, const char *key, size_t len, int32_t val)
{
    int added;
    uint64_t *v = ks_hmap_put_str(m, key, len, &added);
    KS_ASSERT(v); /* room for every key from the start */
    int32_t old = added ? -1 : (int32_t)*v;
    *v = (uint32_t)val;
    return old;
}

int32_t krt_tok_strmap_put_first(krt_tok_strmap *m, const char *key, size_t len, int32_t val)
{
    int added;
    uint64_t *v = ks_hmap_put_str(m, key, len, &added);
    KS_ASSERT(v); /* room for every key from the start */
    if (added) *v = (uint32_t)val;
    return (int32_t)*v;
}

/* ---- pairs ------------------------------------------------------------------ */

int krt_tok_pairmap_init(krt_tok_pairmap *m, ks_arena *a, size_t n)
{
    return ks_hmap_init(m, a, n, n, "tokenizer merges");
}

void krt_tok_pairmap_put(krt_tok_pairmap *m, int32_t left, int32_t right, int32_t rank, int32_t merged)
{
    KS_ASSERT(left >= 0 && right >= 0);
    /* A pair listed twice keeps its later rank, as Hugging Face's HashMap does. */
    uint64_t *v = ks_hmap_put_u64(m, krt_tok_pair(left, right), NULL);
    KS_ASSERT(v); /* room for every key from the start */
    *v = krt_tok_pair(rank, merged);
}
