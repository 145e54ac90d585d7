/*
 * kv_cache.c — the paged KV cache's block manager (runtime/kv/kv_cache.h).
 *
 * The pool holds n_blocks blocks of block_size positions. A sequence owns a
 * block table: entry b holds the block with its positions [b*block_size,
 * (b+1)*block_size). Blocks are reference counted: krt_kv_seq_fork makes the
 * new sequence share every block of its source (vLLM's PagedAttention,
 * Kwon et al. 2023, §4.4), and the first sequence to write into a shared
 * block gets its own copy first.
 *
 * Which blocks are written: a step writes the positions a reserve added,
 * [old length, new length). So krt_kv_seq_reserve copies exactly the shared
 * blocks that overlap that range; positions below the old length are
 * stored and stay shared (a shared prompt is never copied). A caller that
 * wants to rewrite stored positions first shortens the sequence with a
 * smaller reserve, which copies nothing, then reserves again.
 *
 * All-or-nothing: reserve counts the blocks it needs (new ones plus
 * copies) before it touches anything, so a failure leaves every sequence
 * and the free list as they were.
 *
 * Prefix caching: a sequence publishes its full blocks under the chain hash
 * of their tokens (krt_kv_seq_publish); a new sequence whose first blocks'
 * hashes are published takes those blocks (krt_kv_seq_attach_cached) as a
 * fork would. A published block that no sequence holds is not free: it
 * waits, least recently released first, until a block is wanted and the
 * free list is empty (pop_block evicts it then). A published block is full,
 * so no sequence writes it again (a shared one is copied first; a shortened
 * sequence that alone holds it unpublishes it).
 *
 * Bookkeeping lives in host memory; the blocks' bytes live wherever the
 * backend's krt_kv_storage puts them, and are only touched through it.
 */
#include "runtime/kv/kv_cache.h"

#include <stdlib.h>
#include <string.h>

/* One sequence slot. */
typedef struct krt_kv_seq {
    int live;     /* 1 after seq_add/fork until seq_free */
    int len;      /* positions stored (reserved) */
    int n_blocks; /* entries used in its block table: ceil(len / block_size) */
} krt_kv_seq;

struct krt_kv {
    krt_kv_config cfg;       /* the caller's config; cfg.layers points at `layers` */
    const char *who;         /* what messages name (not owned): the engine file, or "kv cache" */
    krt_kv_layer *layers;    /* owned copy of cfg.layers [n_layers] */
    krt_kv_storage storage;  /* the backend's functions, copied */
    void **k;                /* [n_layers] K storage bases; NULL for a layer with no heads */
    void **v;                /* [n_layers] V storage bases */
    size_t *block_bytes_k;   /* [n_layers] bytes of one block of K */
    size_t *block_bytes_v;   /* [n_layers] bytes of one block of V */
    int32_t *refs;           /* [n_blocks] sequences whose table holds the block; 0: free */
    int32_t *free_list;      /* [n_blocks] stack of free block ids; top at n_free-1 */
    int n_free;              /* free blocks */
    int table_cap;           /* block-table entries per sequence: ceil(max_context / block_size) */
    krt_kv_seq *seqs;        /* [max_seqs] */
    int32_t *tables;         /* [max_seqs * table_cap]: sequence s's table at s*table_cap */
    /* prefix caching: a full block's content named by its chain hash (krt_kv_chain_hash) */
    uint64_t *hash;          /* [n_blocks] the hash a block is published under; 0: none */
    int32_t *by_hash;        /* [hash_cap] open addressing over hash[]: a block id, -1 empty, -2 deleted */
    size_t hash_cap;         /* a power of two, at least 2 n_blocks */
    size_t hash_used;        /* slots not empty (blocks and deleted marks) */
    int32_t *lru_prev, *lru_next; /* [n_blocks] published blocks no sequence holds, oldest first: reusable */
    int32_t lru_head, lru_tail;   /* -1: none */
    int n_lru;               /* how many */
    krt_kv_prefix_stats stats;
};

/* ---- host storage ---------------------------------------------------------- */
static void *host_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    /* Zeroed, so a block read before it is written holds zeros, not garbage; written here, not left to
       calloc's untouched pages, so that the pool is resident from the start: a server's memory does not
       creep up as the prefix cache spreads over blocks never used before (measured: TinyStories-656K's
       67 MB pool took a 90-second soak from 41 to 84 MB of RSS). */
    void *p = ks_try_malloc(bytes ? bytes : 1);
    if (p) memset(p, 0, bytes);
    return p;
}

static void host_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

static void host_copy(void *ctx, void *base, size_t dst_off, size_t src_off, size_t bytes)
{
    (void)ctx;
    memmove((char *)base + dst_off, (const char *)base + src_off, bytes);
}

const krt_kv_storage krt_kv_host_storage = {NULL, host_alloc, host_free, host_copy};

/* ---- creation ------------------------------------------------------------------ */
static int check_config(const krt_kv_config *cfg, const char *who, ks_diag *d)
{
    if (cfg->n_layers < 0) {
        ks_error(d, who, "n_layers must not be negative (got %d)", cfg->n_layers);
        return -1;
    }
    if (cfg->n_layers > 0 && !cfg->layers) {
        ks_error(d, who, "no layer shapes given for %d layers", cfg->n_layers);
        return -1;
    }
    for (int l = 0; l < cfg->n_layers; l++) {
        const krt_kv_layer *ly = &cfg->layers[l];
        /* A layer with no heads is a hole in the layer numbering: it stores nothing. */
        if (ly->kv_heads < 0 || (ly->kv_heads > 0 && (ly->head_dim_k <= 0 || ly->head_dim_v < 0))) {
            ks_error(d, who, "layer %d: kv_heads and head_dim_k must be positive, head_dim_v not negative (got %d, %d, %d)",
                     l, ly->kv_heads, ly->head_dim_k, ly->head_dim_v);
            return -1;
        }
    }
    struct { const char *name; int value; } counts[] = {
        {"block_size", cfg->block_size},
        {"n_blocks", cfg->n_blocks},
        {"max_seqs", cfg->max_seqs},
        {"max_context", cfg->max_context},
    };
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        if (counts[i].value <= 0) {
            ks_error(d, who, "%s must be positive (got %d)", counts[i].name, counts[i].value);
            return -1;
        }
    }
    if (cfg->elem_size == 0) {
        ks_error(d, who, "elem_size must be positive (got 0)");
        return -1;
    }
    return 0;
}

/* A zeroed table of n entries of size bytes, or NULL after reporting: sizes
 * here come from the caller's config and may be absurd. */
static void *alloc_table(const char *who, ks_diag *d, size_t n, size_t size, const char *what)
{
    size_t bytes;
    void *p = ks_mul_size(n, size, &bytes) ? ks_try_calloc(n ? n : 1, size) : NULL;
    if (!p) {
        char for_what[96];
        snprintf(for_what, sizeof for_what, "the KV cache's %s", what);
        ks_error_oom(d, who, ks_mul_size(n, size, &bytes) ? bytes : SIZE_MAX, for_what);
    }
    return p;
}

/* Bytes of one block of one layer: block_size * heads * head_dim * elem_size;
 * 0 on overflow. */
static size_t block_bytes(const krt_kv_config *cfg, int heads, int head_dim)
{
    size_t b;
    if (!ks_mul_size((size_t)cfg->block_size, (size_t)heads, &b)) return 0;
    if (!ks_mul_size(b, (size_t)head_dim, &b)) return 0;
    if (!ks_mul_size(b, cfg->elem_size, &b)) return 0;
    return b;
}

/* Bytes of the scales of one block of one layer (a cache of codes), 0 without. */
static size_t block_scale_bytes(const krt_kv_config *cfg, int heads)
{
    return (size_t)cfg->block_size * (size_t)heads * cfg->scale_size;
}

double krt_kv_block_bytes(const krt_kv_layer *layers, int n_layers, int block_size, size_t elem_size,
                          size_t scale_size)
{
    double per_pos = 0;
    for (int l = 0; l < n_layers; l++)
        per_pos += (double)layers[l].kv_heads *
                   ((double)(layers[l].head_dim_k + layers[l].head_dim_v) * (double)elem_size +
                    (layers[l].head_dim_v > 0 ? 2.0 : 1.0) * (double)scale_size);
    return per_pos * block_size;
}

/* Allocate one layer's K or V storage of n_blocks blocks. */
static int alloc_layer(krt_kv *kv, ks_diag *d, int layer, const char *which, size_t per_block, void **out)
{
    size_t bytes;
    if (per_block == 0 || !ks_mul_size(per_block, (size_t)kv->cfg.n_blocks, &bytes)) {
        ks_error(d, kv->who, "layer %d: %s storage of %d blocks overflows the address space",
                 layer, which, kv->cfg.n_blocks);
        return -1;
    }
    *out = kv->storage.alloc(kv->storage.ctx, bytes);
    if (!*out) {
        char what[96];
        snprintf(what, sizeof what, "the KV cache: layer %d's %s of %d blocks", layer, which, kv->cfg.n_blocks);
        ks_error_oom(d, kv->who, bytes, what);
        return -1;
    }
    return 0;
}

krt_kv *krt_kv_new(const krt_kv_config *cfg, const krt_kv_storage *storage, ks_diag *d)
{
    return krt_kv_new_named(cfg, storage, NULL, d);
}

krt_kv *krt_kv_new_named(const krt_kv_config *cfg, const krt_kv_storage *storage, const char *name, ks_diag *d)
{
    KS_ASSERT(cfg && storage && storage->alloc && storage->free && storage->copy);
    const char *who = name ? name : "kv cache";
    if (check_config(cfg, who, d) != 0) return NULL;

    krt_kv *kv = ks_try_calloc(1, sizeof *kv);
    if (!kv) {
        ks_error_oom(d, who, sizeof *kv, "the KV cache");
        return NULL;
    }
    kv->who = who;
    kv->cfg = *cfg;
    kv->storage = *storage;
    kv->table_cap = (int)(((int64_t)cfg->max_context + cfg->block_size - 1) / cfg->block_size);
    size_t nl = (size_t)cfg->n_layers;
    kv->layers = alloc_table(who, d, nl ? nl : 1, sizeof *kv->layers, "layer table");
    kv->k = kv->layers ? alloc_table(who, d, nl ? nl : 1, sizeof *kv->k, "layer tables") : NULL;
    kv->v = kv->k ? alloc_table(who, d, nl ? nl : 1, sizeof *kv->v, "layer tables") : NULL;
    kv->block_bytes_k = kv->v ? alloc_table(who, d, nl ? nl : 1, sizeof *kv->block_bytes_k, "layer tables") : NULL;
    kv->block_bytes_v = kv->block_bytes_k ? alloc_table(who, d, nl ? nl : 1, sizeof *kv->block_bytes_v, "layer tables")
                                          : NULL;
    if (!kv->block_bytes_v) {
        krt_kv_free(kv);
        return NULL;
    }
    if (nl) memcpy(kv->layers, cfg->layers, nl * sizeof *kv->layers);
    kv->cfg.layers = kv->layers;

    /* The blocks' storage first: the large allocations, which a config asking
     * for too many blocks cannot have, before any table is touched. */
    for (int l = 0; l < cfg->n_layers; l++) {
        const krt_kv_layer *ly = &kv->layers[l];
        if (ly->kv_heads == 0) continue;
        kv->block_bytes_k[l] = block_bytes(cfg, ly->kv_heads, ly->head_dim_k);
        kv->block_bytes_v[l] = block_bytes(cfg, ly->kv_heads, ly->head_dim_v);
        const size_t sb = block_scale_bytes(cfg, ly->kv_heads); /* the codes' scales after them */
        /* (a layer of head_dim_v 0 stores no V: its attention reads V from the K rows) */
        if (alloc_layer(kv, d, l, "K", kv->block_bytes_k[l] ? kv->block_bytes_k[l] + sb : 0, &kv->k[l]) != 0 ||
            (ly->head_dim_v > 0 &&
             alloc_layer(kv, d, l, "V", kv->block_bytes_v[l] ? kv->block_bytes_v[l] + sb : 0, &kv->v[l]) != 0)) {
            krt_kv_free(kv);
            return NULL;
        }
    }

    size_t n_tables;
    kv->refs = alloc_table(who, d, (size_t)cfg->n_blocks, sizeof *kv->refs, "block reference counts");
    kv->free_list =
        kv->refs ? alloc_table(who, d, (size_t)cfg->n_blocks, sizeof *kv->free_list, "the free list") : NULL;
    kv->seqs = kv->free_list ? alloc_table(who, d, (size_t)cfg->max_seqs, sizeof *kv->seqs, "sequences") : NULL;
    if (kv->seqs) {
        if (ks_mul_size((size_t)cfg->max_seqs, (size_t)kv->table_cap, &n_tables))
            kv->tables = alloc_table(who, d, n_tables, sizeof *kv->tables, "block tables");
        else
            ks_error(d, who, "block tables for %d sequences of %d blocks overflow the address space",
                     cfg->max_seqs, kv->table_cap);
    }
    kv->hash_cap = 4;
    while (kv->hash_cap < 2 * (size_t)cfg->n_blocks) kv->hash_cap *= 2;
    kv->hash = kv->tables ? alloc_table(who, d, (size_t)cfg->n_blocks, sizeof *kv->hash, "prefix hashes") : NULL;
    kv->by_hash = kv->hash ? alloc_table(who, d, kv->hash_cap, sizeof *kv->by_hash, "prefix table") : NULL;
    kv->lru_prev = kv->by_hash ? alloc_table(who, d, (size_t)cfg->n_blocks, sizeof *kv->lru_prev, "cached blocks") : NULL;
    kv->lru_next = kv->lru_prev ? alloc_table(who, d, (size_t)cfg->n_blocks, sizeof *kv->lru_next, "cached blocks") : NULL;
    if (!kv->lru_next) {
        krt_kv_free(kv);
        return NULL;
    }
    for (size_t i = 0; i < kv->hash_cap; i++) kv->by_hash[i] = -1;
    kv->lru_head = kv->lru_tail = -1;
    /* Block 0 is handed out first. */
    for (int i = 0; i < cfg->n_blocks; i++) kv->free_list[i] = cfg->n_blocks - 1 - i;
    kv->n_free = cfg->n_blocks;
    return kv;
}

void krt_kv_free(krt_kv *kv)
{
    if (!kv) return;
    for (int l = 0; l < kv->cfg.n_layers; l++) {
        if (kv->k && kv->k[l]) kv->storage.free(kv->storage.ctx, kv->k[l]);
        if (kv->v && kv->v[l]) kv->storage.free(kv->storage.ctx, kv->v[l]);
    }
    free(kv->k);
    free(kv->v);
    free(kv->block_bytes_k);
    free(kv->block_bytes_v);
    free(kv->layers);
    free(kv->refs);
    free(kv->free_list);
    free(kv->seqs);
    free(kv->tables);
    free(kv->hash);
    free(kv->by_hash);
    free(kv->lru_prev);
    free(kv->lru_next);
    free(kv);
}

const krt_kv_config *krt_kv_config_of(const krt_kv *kv) { return &kv->cfg; }

/* ---- blocks -------------------------------------------------------------------- */
static int32_t *table_of(const krt_kv *kv, int seq) { return kv->tables + (size_t)seq * (size_t)kv->table_cap; }

/* ---- the prefix table: published blocks by hash (linear probing; deletions marked, the table rebuilt
 * when marks and blocks fill half of it) ---- */
static size_t hash_slot(const krt_kv *kv, uint64_t h) { return (size_t)(h ^ (h >> 29)) & (kv->hash_cap - 1); }

/* The block published under h, or -1 */
static int32_t find_hash(const krt_kv *kv, uint64_t h)
{
    for (size_t i = hash_slot(kv, h);; i = (i + 1) & (kv->hash_cap - 1)) {
        const int32_t b = kv->by_hash[i];
        if (b == -1) return -1;
        if (b >= 0 && kv->hash[b] == h) return b;
    }
}

static void insert_hash(krt_kv *kv, int32_t b)
{
    size_t i = hash_slot(kv, kv->hash[b]);
    while (kv->by_hash[i] >= 0) i = (i + 1) & (kv->hash_cap - 1);
    if (kv->by_hash[i] == -1) kv->hash_used++;
    kv->by_hash[i] = b;
}

/* Block b no longer holds the content of its hash. */
static void unpublish(krt_kv *kv, int32_t b)
{
    if (!kv->hash[b]) return;
    for (size_t i = hash_slot(kv, kv->hash[b]);; i = (i + 1) & (kv->hash_cap - 1)) {
        KS_ASSERT(kv->by_hash[i] != -1);
        if (kv->by_hash[i] == b) {
            kv->by_hash[i] = -2;
            break;
        }
    }
    kv->hash[b] = 0;
    kv->stats.cached--;
    if (kv->hash_used * 2 > kv->hash_cap) { /* the marks fill it: the live blocks again, no marks */
        for (size_t i = 0; i < kv->hash_cap; i++) kv->by_hash[i] = -1;
        kv->hash_used = 0;
        for (int32_t x = 0; x < kv->cfg.n_blocks; x++)
            if (kv->hash[x]) insert_hash(kv, x);
    }
}

static void lru_unlink(krt_kv *kv, int32_t b)
{
    const int32_t p = kv->lru_prev[b], n = kv->lru_next[b];
    if (p >= 0) kv->lru_next[p] = n;
    else kv->lru_head = n;
    if (n >= 0) kv->lru_prev[n] = p;
    else kv->lru_tail = p;
    kv->n_lru--;
}

static void lru_append(krt_kv *kv, int32_t b)
{
    kv->lru_prev[b] = kv->lru_tail;
    kv->lru_next[b] = -1;
    if (kv->lru_tail >= 0) kv->lru_next[kv->lru_tail] = b;
    else kv->lru_head = b;
    kv->lru_tail = b;
    kv->n_lru++;
}

/* A block for a sequence: a free one, else the published block no sequence has used for longest
 * (evicted: its content forgotten). */
static int32_t pop_block(krt_kv *kv)
{
    int32_t b;
    if (kv->n_free > 0) {
        b = kv->free_list[--kv->n_free];
    } else {
        KS_ASSERT(kv->n_lru > 0);
        b = kv->lru_head;
        lru_unlink(kv, b);
        unpublish(kv, b);
        kv->stats.evictions++;
    }
    KS_ASSERT(kv->refs[b] == 0);
    kv->refs[b] = 1;
    return b;
}

/* One holder less; a block no sequence holds is free, or, published, cached for a later prefix. */
static void release_block(krt_kv *kv, int32_t b)
{
    KS_ASSERT(b >= 0 && b < kv->cfg.n_blocks && kv->refs[b] > 0);
    if (--kv->refs[b] > 0) return;
    if (kv->hash[b]) lru_append(kv, b);
    else kv->free_list[kv->n_free++] = b;
}

/* Blocks a reserve can take */
static int available(const krt_kv *kv) { return kv->n_free + kv->n_lru; }

/* Copy block src's bytes into block dst in every layer's K and V. */
static void copy_block(krt_kv *kv, int32_t dst, int32_t src)
{
    for (int l = 0; l < kv->cfg.n_layers; l++) {
        if (!kv->k[l]) continue;
        size_t bk = kv->block_bytes_k[l], bv = kv->block_bytes_v[l];
        kv->storage.copy(kv->storage.ctx, kv->k[l], (size_t)dst * bk, (size_t)src * bk, bk);
        if (kv->v[l]) kv->storage.copy(kv->storage.ctx, kv->v[l], (size_t)dst * bv, (size_t)src * bv, bv);
        const size_t sb = block_scale_bytes(&kv->cfg, kv->layers[l].kv_heads), nb = (size_t)kv->cfg.n_blocks;
        if (sb == 0) continue;
        kv->storage.copy(kv->storage.ctx, kv->k[l], nb * bk + (size_t)dst * sb, nb * bk + (size_t)src * sb, sb);
        if (kv->v[l]) kv->storage.copy(kv->storage.ctx, kv->v[l], nb * bv + (size_t)dst * sb, nb * bv + (size_t)src * sb, sb);
    }
}

/* ---- sequences ------------------------------------------------------------------ */
static int check_new_id(const krt_kv *kv, int seq, const char **why)
{
    if (seq < 0) {
        *why = "negative sequence id";
        return -1;
    }
    if (seq >= kv->cfg.max_seqs) {
        *why = "too many sequences: the id is not below max_seqs";
        return -1;
    }
    if (kv->seqs[seq].live) {
        *why = "sequence already exists";
        return -1;
    }
    return 0;
}

int krt_kv_seq_exists(const krt_kv *kv, int seq)
{
    return seq >= 0 && seq < kv->cfg.max_seqs && kv->seqs[seq].live;
}

int krt_kv_seq_add(krt_kv *kv, int seq, const char **why)
{
    if (check_new_id(kv, seq, why) != 0) return -1;
    kv->seqs[seq] = (krt_kv_seq){.live = 1};
    return 0;
}

int krt_kv_seq_fork(krt_kv *kv, int src, int dst, const char **why)
{
    if (!krt_kv_seq_exists(kv, src)) {
        *why = "unknown sequence";
        return -1;
    }
    if (check_new_id(kv, dst, why) != 0) return -1;
    const krt_kv_seq *s = &kv->seqs[src];
    int32_t *st = table_of(kv, src), *dt = table_of(kv, dst);
    for (int b = 0; b < s->n_blocks; b++) {
        dt[b] = st[b];
        kv->refs[st[b]]++;
    }
    kv->seqs[dst] = *s;
    return 0;
}

void krt_kv_seq_free(krt_kv *kv, int seq)
{
    if (!krt_kv_seq_exists(kv, seq)) return;
    krt_kv_seq *s = &kv->seqs[seq];
    const int32_t *t = table_of(kv, seq);
    /* last block first: the stack then hands the blocks out again in the sequence's order, so a
       sequence that follows a freed one gets the same ascending run of blocks, not the reverse */
    for (int b = s->n_blocks - 1; b >= 0; b--) release_block(kv, t[b]);
    *s = (krt_kv_seq){0};
}

int krt_kv_seq_len(const krt_kv *kv, int seq) { return krt_kv_seq_exists(kv, seq) ? kv->seqs[seq].len : -1; }

int krt_kv_seq_reserve(krt_kv *kv, int seq, int n, const char **why)
{
    if (!krt_kv_seq_exists(kv, seq)) {
        *why = "unknown sequence";
        return -1;
    }
    if (n < 0) {
        *why = "negative length";
        return -1;
    }
    if (n > kv->cfg.max_context) {
        *why = "exceeds max_context";
        return -1;
    }
    krt_kv_seq *s = &kv->seqs[seq];
    int32_t *t = table_of(kv, seq);
    int bs = kv->cfg.block_size;
    int need = (int)(((int64_t)n + bs - 1) / bs);

    if (n <= s->len) {
        /* Shorten: nothing is written, so nothing is copied. A published block that stays partly (its
           rest to be written again) and that this sequence alone holds is no longer what its hash says. */
        if (n % bs && need > 0 && kv->refs[t[need - 1]] == 1) unpublish(kv, t[need - 1]);
        for (int b = s->n_blocks - 1; b >= need; b--) release_block(kv, t[b]);
        s->n_blocks = need;
        s->len = n;
        return 0;
    }

    /* Positions [len, n) will be written: blocks first..need-1. Count what
     * that takes before changing anything. */
    int first = s->len / bs;
    int copies = 0;
    for (int b = first; b < s->n_blocks; b++)
        if (kv->refs[t[b]] > 1) copies++;
    if (copies + (need - s->n_blocks) > available(kv)) {
        *why = "out of KV cache blocks";
        return -1;
    }
    for (int b = first; b < s->n_blocks; b++) {
        if (kv->refs[t[b]] <= 1) continue;
        int32_t fresh = pop_block(kv);
        copy_block(kv, fresh, t[b]);
        release_block(kv, t[b]);
        t[b] = fresh;
    }
    for (int b = s->n_blocks; b < need; b++) t[b] = pop_block(kv);
    s->n_blocks = need;
    s->len = n;
    return 0;
}

/* ---- lookups -------------------------------------------------------------------- */
int64_t krt_kv_slot(const krt_kv *kv, int seq, int pos)
{
    KS_ASSERT(krt_kv_seq_exists(kv, seq));
    KS_ASSERT(pos >= 0 && pos < kv->seqs[seq].len);
    int bs = kv->cfg.block_size;
    return (int64_t)table_of(kv, seq)[pos / bs] * bs + pos % bs;
}

const int32_t *krt_kv_block_table(const krt_kv *kv, int seq, int *n_blocks)
{
    if (!krt_kv_seq_exists(kv, seq)) {
        *n_blocks = 0;
        return NULL;
    }
    *n_blocks = kv->seqs[seq].n_blocks;
    return table_of(kv, seq);
}

int krt_kv_free_blocks(const krt_kv *kv) { return available(kv); }

/* ---- prefix caching ------------------------------------------------------------- */
uint64_t krt_kv_chain_hash(uint64_t prev, const int32_t *tokens, int n)
{
    uint64_t h = prev ^ 0x9e3779b97f4a7c15ull; /* FNV-1a over the ids, after the chain so far */
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 4; k++) h = (h ^ (((uint32_t)tokens[i] >> (8 * k)) & 0xffu)) * 0x100000001b3ull;
    h ^= h >> 31; /* a final mix (splitmix64's) */
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    return h ? h : 1; /* 0 means none */
}

int krt_kv_seq_attach_cached(krt_kv *kv, int seq, const uint64_t *hashes, int n)
{
    if (!krt_kv_seq_exists(kv, seq) || kv->seqs[seq].len != 0) return 0;
    int32_t *t = table_of(kv, seq);
    int got = 0;
    if (n > kv->table_cap) n = kv->table_cap;
    for (; got < n; got++) {
        const int32_t b = find_hash(kv, hashes[got]);
        if (b < 0) break;
        if (kv->refs[b]++ == 0) lru_unlink(kv, b); /* held again */
        t[got] = b;
    }
    kv->stats.lookups += n;
    kv->stats.hits += got;
    kv->seqs[seq].n_blocks = got;
    kv->seqs[seq].len = got * kv->cfg.block_size;
    return got;
}

void krt_kv_seq_publish(krt_kv *kv, int seq, int b, uint64_t hash)
{
    if (!krt_kv_seq_exists(kv, seq) || b < 0 || (int64_t)(b + 1) * kv->cfg.block_size > kv->seqs[seq].len || !hash)
        return;
    const int32_t blk = table_of(kv, seq)[b];
    if (kv->hash[blk] || find_hash(kv, hash) >= 0) return; /* published already, or the content is elsewhere */
    kv->hash[blk] = hash;
    insert_hash(kv, blk);
    kv->stats.cached++;
}

krt_kv_prefix_stats krt_kv_prefix_stats_of(const krt_kv *kv) { return kv->stats; }

void *krt_kv_k(krt_kv *kv, int layer)
{
    KS_ASSERT(layer >= 0 && layer < kv->cfg.n_layers);
    return kv->k[layer];
}

void *krt_kv_v(krt_kv *kv, int layer)
{
    KS_ASSERT(layer >= 0 && layer < kv->cfg.n_layers);
    return kv->v[layer];
}

void *krt_kv_k_scales(krt_kv *kv, int layer)
{
    KS_ASSERT(layer >= 0 && layer < kv->cfg.n_layers);
    if (kv->cfg.scale_size == 0 || !kv->k[layer]) return NULL;
    return (char *)kv->k[layer] + (size_t)kv->cfg.n_blocks * kv->block_bytes_k[layer];
}

void *krt_kv_v_scales(krt_kv *kv, int layer)
{
    KS_ASSERT(layer >= 0 && layer < kv->cfg.n_layers);
    if (kv->cfg.scale_size == 0 || !kv->v[layer]) return NULL;
    return (char *)kv->v[layer] + (size_t)kv->cfg.n_blocks * kv->block_bytes_v[layer];
}
