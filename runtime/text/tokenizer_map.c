/* tokenizer_map.c — the tokenizer's two hash maps: byte strings -> ids (the
 * vocabulary) and id pairs -> merges. Both are open addressing with linear
 * probing, sized once for the entries the file declares (at most half full),
 * and live in the tokenizer's arena. */
#include "runtime/text/tokenizer_internal.h"

#include <string.h>

static size_t table_size(size_t n)
{
    size_t cap = 16;
    while (cap < n * 2 + 1) {
        KS_ASSERT(cap < ((size_t)1 << 40));
        cap <<= 1;
    }
    return cap;
}

static uint64_t hash_bytes(const char *key, size_t len)
{
    uint64_t h = ks_hash64(KS_HASH_SEED, key, len);
    /* MurmurHash3's finalizer: the slot is the low bits, which must depend
     * on every byte (short tokens only see ks_hash64's byte loop). */
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h ? h : 1; /* 0 marks an empty slot */
}

void krt_tok_strmap_init(krt_tok_strmap *m, ks_arena *a, size_t n)
{
    size_t cap = table_size(n);
    m->slots = ks_arena_alloc(a, cap * sizeof *m->slots);
    m->mask = cap - 1;
    m->count = 0;
}

static krt_tok_strmap_slot *strmap_find(const krt_tok_strmap *m, const char *key, size_t len,
                                        uint64_t h)
{
    size_t i = (size_t)h & m->mask;
    for (;;) {
        krt_tok_strmap_slot *s = &m->slots[i];
        if (s->hash == 0) return s;
        if (s->hash == h && s->len == len && memcmp(s->key, key, len) == 0) return s;
        i = (i + 1) & m->mask;
    }
}

static int32_t strmap_insert(krt_tok_strmap *m, const char *key, size_t len, int32_t val,
                             int overwrite)
{
    KS_ASSERT(len <= UINT32_MAX);
    uint64_t h = hash_bytes(key, len);
    krt_tok_strmap_slot *s = strmap_find(m, key, len, h);
    if (s->hash != 0) {
        int32_t old = s->val;
        if (overwrite) s->val = val;
        return old;
    }
    KS_ASSERT(m->count * 2 < m->mask + 1); /* sized for the declared entries */
    s->hash = h;
    s->key = key;
    s->len = (uint32_t)len;
    s->val = val;
    m->count++;
    return overwrite ? -1 : val;
}

int32_t krt_tok_strmap_put(krt_tok_strmap *m, const char *key, size_t len, int32_t val)
{
    return strmap_insert(m, key, len, val, 1);
}

int32_t krt_tok_strmap_put_first(krt_tok_strmap *m, const char *key, size_t len, int32_t val)
{
    return strmap_insert(m, key, len, val, 0);
}

int32_t krt_tok_strmap_get(const krt_tok_strmap *m, const char *key, size_t len)
{
    if (!m->slots) return -1;
    const krt_tok_strmap_slot *s = strmap_find(m, key, len, hash_bytes(key, len));
    return s->hash ? s->val : -1;
}

/* ---- pairs ------------------------------------------------------------------ */

#define PAIR_EMPTY UINT64_MAX

static uint64_t pair_key(int32_t left, int32_t right)
{
    return (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
}

static size_t pair_slot(const krt_tok_pairmap *m, uint64_t key)
{
    /* Fibonacci hashing spreads the consecutive ids of a vocabulary. */
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 17) & m->mask;
}

void krt_tok_pairmap_init(krt_tok_pairmap *m, ks_arena *a, size_t n)
{
    size_t cap = table_size(n);
    m->slots = ks_arena_alloc(a, cap * sizeof *m->slots);
    for (size_t i = 0; i < cap; i++) m->slots[i].key = PAIR_EMPTY;
    m->mask = cap - 1;
    m->count = 0;
}

void krt_tok_pairmap_put(krt_tok_pairmap *m, int32_t left, int32_t right, int32_t rank,
                         int32_t merged)
{
    KS_ASSERT(left >= 0 && right >= 0);
    uint64_t key = pair_key(left, right);
    size_t i = pair_slot(m, key);
    while (m->slots[i].key != PAIR_EMPTY && m->slots[i].key != key) i = (i + 1) & m->mask;
    if (m->slots[i].key == PAIR_EMPTY) {
        KS_ASSERT(m->count * 2 < m->mask + 1);
        m->count++;
    }
    /* A pair listed twice keeps its later rank, as Hugging Face's HashMap does. */
    m->slots[i].key = key;
    m->slots[i].rank = rank;
    m->slots[i].merged = merged;
}

const krt_tok_pairmap_slot *krt_tok_pairmap_get(const krt_tok_pairmap *m, int32_t left,
                                                int32_t right)
{
    if (!m->slots || left < 0 || right < 0) return NULL;
    uint64_t key = pair_key(left, right);
    size_t i = pair_slot(m, key);
    for (;;) {
        const krt_tok_pairmap_slot *s = &m->slots[i];
        if (s->key == key) return s;
        if (s->key == PAIR_EMPTY) return NULL;
        i = (i + 1) & m->mask;
    }
}
