/*
 * hmap.c — ks_hmap: keys (byte strings or 64-bit integers) to 64-bit values, by open
 * addressing with linear probing (support/support.h).
 *
 * The table is kept at most half full, so a probe meets an empty slot within a few
 * steps, and grows by doubling up to the map's named limit. A slot stores the key's
 * full hash: a probe compares hashes before it compares string bytes, and 0 marks an
 * empty slot (a key whose hash is 0 gets 1).
 */
#include "support.h"

#include <stdlib.h>
#include <string.h>

/* MurmurHash3's 64-bit finalizer: every bit of x reaches the low bits that pick the slot. */
static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x ? x : 1;
}

/* ks_hash64 alone leaves the low bits of a short key's hash to its last bytes. */
static uint64_t hash_str(const char *key, size_t len) { return mix64(ks_hash64(KS_HASH_SEED, key, len)); }

/* Slots for n keys at most half full: a power of two, at least 16. */
static size_t slots_for(size_t n)
{
    size_t cap = 16;
    while (cap < n * 2 + 1) {
        KS_ASSERT(cap < ((size_t)1 << 40));
        cap <<= 1;
    }
    return cap;
}

/* Zeroed slots, or NULL when out of memory (an arena's: when it is fallible). */
static ks_hmap_slot *alloc_slots(ks_hmap *m, size_t cap)
{
    size_t bytes;
    if (!ks_mul_size(cap, sizeof(ks_hmap_slot), &bytes)) ks_die(__FILE__, __LINE__, "too many %s", m->what);
    return m->arena ? ks_arena_alloc(m->arena, bytes) : ks_try_calloc(cap, sizeof(ks_hmap_slot));
}

int ks_hmap_init(ks_hmap *m, ks_arena *arena, size_t n, size_t limit, const char *what)
{
    *m = (ks_hmap){.limit = limit, .what = what, .arena = arena};
    if (n) {
        size_t cap = slots_for(n);
        m->slots = alloc_slots(m, cap);
        if (!m->slots) return -1;
        m->mask = cap - 1;
    }
    return 0;
}

void ks_hmap_free(ks_hmap *m)
{
    if (!m->arena) free(m->slots);
    m->slots = NULL;
    m->mask = m->count = 0;
}

/* The slot holding the key, or the empty slot where it goes: one loop per kind of key,
 * as lookups are the hot path of encoding text. */
static ks_hmap_slot *probe_str(const ks_hmap *m, uint64_t h, const char *str, size_t len)
{
    for (size_t i = (size_t)h & m->mask;; i = (i + 1) & m->mask) {
        ks_hmap_slot *s = &m->slots[i];
        if (s->hash == 0 || (s->hash == h && s->key == len && memcmp(s->str, str, len) == 0)) return s;
    }
}

static ks_hmap_slot *probe_u64(const ks_hmap *m, uint64_t h, uint64_t key)
{
    for (size_t i = (size_t)h & m->mask;; i = (i + 1) & m->mask) {
        ks_hmap_slot *s = &m->slots[i];
        if (s->hash == 0 || (s->hash == h && s->key == key)) return s;
    }
}

/* The first empty slot from hash h: where a key not in the map goes. */
static ks_hmap_slot *empty_slot(const ks_hmap *m, uint64_t h)
{
    size_t i = (size_t)h & m->mask;
    while (m->slots[i].hash) i = (i + 1) & m->mask;
    return &m->slots[i];
}

/* Make room for one more key: past the limit is fatal, as KS_GROW is. Returns whether
 * the slots moved (or were made): 1 or 0; -1, the map as it was, when out of memory. */
static int reserve_one(ks_hmap *m)
{
    if (m->count + 1 > m->limit) ks_die(__FILE__, __LINE__, "too many %s (limit %zu)", m->what, m->limit);
    if (m->slots && (m->count + 1) * 2 <= m->mask + 1) return 0;
    ks_hmap_slot *old = m->slots;
    size_t old_cap = old ? m->mask + 1 : 0, cap = slots_for(m->count + 1);
    ks_hmap_slot *slots = alloc_slots(m, cap);
    if (!slots) return -1;
    m->slots = slots;
    m->mask = cap - 1;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].hash) *empty_slot(m, old[i].hash) = old[i];
    if (!m->arena) free(old);
    return 1;
}

/* The value in slot s, where probing for key k stopped (NULL: the map has no slots yet);
 * k goes there first when s is empty. NULL when out of memory. */
static uint64_t *put(ks_hmap *m, ks_hmap_slot *s, ks_hmap_slot k, int *added)
{
    int is_new = !s || !s->hash;
    if (is_new) {
        int moved = reserve_one(m);
        if (moved < 0) return NULL;
        if (moved) s = empty_slot(m, k.hash);
        *s = k;
        m->count++;
    }
    if (added) *added = is_new;
    return &s->val;
}

uint64_t *ks_hmap_put_str(ks_hmap *m, const char *key, size_t len, int *added)
{
    if (!key) key = ""; /* an empty key may come as NULL */
    uint64_t h = hash_str(key, len);
    return put(m, m->slots ? probe_str(m, h, key, len) : NULL, (ks_hmap_slot){.hash = h, .key = len, .str = key},
               added);
}

uint64_t *ks_hmap_put_u64(ks_hmap *m, uint64_t key, int *added)
{
    uint64_t h = mix64(key);
    return put(m, m->slots ? probe_u64(m, h, key) : NULL, (ks_hmap_slot){.hash = h, .key = key}, added);
}

const uint64_t *ks_hmap_get_str(const ks_hmap *m, const char *key, size_t len)
{
    if (!m->count) return NULL;
    const ks_hmap_slot *s = probe_str(m, hash_str(key, len), key ? key : "", len);
    return s->hash ? &s->val : NULL;
}

const uint64_t *ks_hmap_get_u64(const ks_hmap *m, uint64_t key)
{
    if (!m->count) return NULL;
    const ks_hmap_slot *s = probe_u64(m, mix64(key), key);
    return s->hash ? &s->val : NULL;
}
