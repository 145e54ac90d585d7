/*
 * kv_cache.h — the paged KV cache: fixed-size blocks of positions, a block
 * table per sequence (vLLM's PagedAttention layout), shared between forked
 * sequences with reference counts and copied on write.
 *
 * The block manager (which block holds which positions of which sequence) is
 * host-side and shared by every backend; where the blocks' bytes live is the
 * backend's: a krt_kv_storage table of functions allocates them (host memory
 * for the interpreter and the CPU backend, device memory for CUDA/HIP) and
 * copies a block for copy-on-write.
 *
 * Layout of one layer's K (and V) storage: [n_blocks * block_size, kv_heads,
 * head_dim] of `elem_size`-byte elements; the row of (seq, pos) is
 * krt_kv_slot(kv, seq, pos). A cache of codes (int8, fp8: scale_size > 0)
 * holds after them, in the same allocation, [n_blocks * block_size,
 * kv_heads] scales of `scale_size` bytes, one a (position, KV head) row
 * (krt_kv_k_scales); a block's copy copies its scales with its codes.
 *
 * Prefix: krt_ (runtime).
 */
#ifndef KILN_KV_CACHE_H
#define KILN_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "support/support.h"

typedef struct krt_kv_layer {
    int kv_heads;   /* heads of K and V */
    int head_dim_k; /* elements per K head */
    int head_dim_v; /* elements per V head; 0: no V storage (V read from the K rows: the IR's v_in_k) */
} krt_kv_layer;

typedef struct krt_kv_config {
    int n_layers;                /* attention layers (the `layer` attribute of ATTENTION) */
    const krt_kv_layer *layers;  /* [n_layers] */
    int block_size;              /* positions per block */
    int n_blocks;                /* blocks in the pool */
    int max_seqs;                /* sequence ids are 0..max_seqs-1 */
    int max_context;             /* positions per sequence at most */
    size_t elem_size;            /* bytes per K/V element (4 for f32) */
    size_t scale_size;           /* bytes of a (position, KV head) row's scale: 0 (none), 4 (codes: f32) */
} krt_kv_config;

/* Where the blocks' bytes live: a backend's table of functions. */
typedef struct krt_kv_storage {
    void *ctx;                                                   /* the backend's */
    void *(*alloc)(void *ctx, size_t bytes);                     /* NULL when out of memory */
    void (*free)(void *ctx, void *p);
    /* copy `bytes` at src_off to dst_off inside the buffer base */
    void (*copy)(void *ctx, void *base, size_t dst_off, size_t src_off, size_t bytes);
} krt_kv_storage;

extern const krt_kv_storage krt_kv_host_storage; /* malloc'd host memory */

typedef struct krt_kv krt_kv;

/* NULL after reporting (bad config; out of memory: `kv cache: error: out of
 * memory (allocating N bytes for the KV cache: layer 0's K of 100 blocks)`),
 * nothing left allocated. krt_kv_new_named's messages name `name` (the
 * engine file) instead of "kv cache". */
krt_kv *krt_kv_new(const krt_kv_config *cfg, const krt_kv_storage *storage, ks_diag *d);
krt_kv *krt_kv_new_named(const krt_kv_config *cfg, const krt_kv_storage *storage, const char *name, ks_diag *d);
void krt_kv_free(krt_kv *kv);
const krt_kv_config *krt_kv_config_of(const krt_kv *kv);

/* Sequences. Return 0, or -1 with a reason in *why (static text). */
int krt_kv_seq_add(krt_kv *kv, int seq, const char **why);
int krt_kv_seq_fork(krt_kv *kv, int src, int dst, const char **why); /* dst shares src's blocks */
void krt_kv_seq_free(krt_kv *kv, int seq);                           /* its blocks return to the pool */
int krt_kv_seq_exists(const krt_kv *kv, int seq);
int krt_kv_seq_len(const krt_kv *kv, int seq); /* positions stored */

/* Make positions [0, n) of seq writable: allocates blocks, copies a shared
 * block before it is written. On failure (out of blocks, over max_context)
 * nothing changes and -1 is returned with *why set. Sets the length to n. */
int krt_kv_seq_reserve(krt_kv *kv, int seq, int n, const char **why);

/* Row of (seq, pos) in every layer's storage; pos < seq_len. */
int64_t krt_kv_slot(const krt_kv *kv, int seq, int pos);
/* The block table of seq: ids of its blocks in position order. */
const int32_t *krt_kv_block_table(const krt_kv *kv, int seq, int *n_blocks);
int krt_kv_free_blocks(const krt_kv *kv); /* blocks a sequence can take: free, or cached and held by none */

/* Prefix caching (vLLM's automatic prefix caching): a full block's content is named by the chain hash
 * of its tokens and of every token before them, h_b = krt_kv_chain_hash(h_{b-1}, block b's ids) from
 * h_{-1} = 0 (64 bits; two prefixes with one hash would share KV rows: taken as never happening). */
uint64_t krt_kv_chain_hash(uint64_t prev, const int32_t *tokens, int n);
/* Empty seq takes the published blocks of hashes[0], hashes[1], ... while there are: returns how many
 * (its length is then that many blocks of positions). */
int krt_kv_seq_attach_cached(krt_kv *kv, int seq, const uint64_t *hashes, int n);
/* Block b of seq, full (its positions all stored), holds the content named hash: later sequences may
 * take it. Nothing when it or that content is published already. */
void krt_kv_seq_publish(krt_kv *kv, int seq, int b, uint64_t hash);
typedef struct krt_kv_prefix_stats {
    long lookups;   /* blocks asked for by krt_kv_seq_attach_cached */
    long hits;      /* of those, found */
    long evictions; /* published blocks whose content was forgotten to make room */
    int cached;     /* blocks published now (held or not) */
} krt_kv_prefix_stats;
krt_kv_prefix_stats krt_kv_prefix_stats_of(const krt_kv *kv);

/* Storage of one layer: base of [n_blocks*block_size, kv_heads, head_dim]. */
void *krt_kv_k(krt_kv *kv, int layer);
void *krt_kv_v(krt_kv *kv, int layer);
/* The scales of a cache of codes: base of [n_blocks*block_size, kv_heads]
 * (inside the layer's storage, after its codes); NULL when scale_size is 0. */
void *krt_kv_k_scales(krt_kv *kv, int layer);
void *krt_kv_v_scales(krt_kv *kv, int layer);
/* Bytes of one block of every layer's K and V (codes and scales): what a
 * block costs the memory that sizes the cache. */
double krt_kv_block_bytes(const krt_kv_layer *layers, int n_layers, int block_size, size_t elem_size,
                          size_t scale_size);

#endif
