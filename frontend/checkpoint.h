/*
 * checkpoint.h — reading model checkpoints: safetensors, one file or sharded
 * with model.safetensors.index.json, through mmap; header parsed with cJSON.
 * llama2.c's legacy .bin is a second importer behind the same interface
 * (kf_checkpoint_open_llama2c, below).
 *
 * Every tensor's header entry is checked before anything reads it: dtype
 * known, shape non-negative and without overflow, data_offsets inside the
 * file's data section and of the size dtype x shape gives, no two tensors
 * overlapping. Problems are reported as `file: error: tensor 'name': ...`.
 * Dtypes other than F32, F16, BF16, I32, I8, U8 and F8_E4M3 (I64, F64, F8_E5M2...)
 * are rejected at open, naming the tensor.
 *
 * Prefix: kf_ (frontend).
 */
#ifndef KILN_CHECKPOINT_H
#define KILN_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "ir/ir.h"
#include "support/support.h"

typedef struct kf_tensor {
    const char *name;        /* checkpoint name, e.g. "model.layers.0.mlp.up_proj.weight" */
    kir_dtype dtype;         /* KIR_F32, KIR_F16 or KIR_BF16; KIR_I32, KIR_F8E4M3 (quantized weights) */
    int ndim;                /* 0..KIR_MAX_DIMS */
    int64_t shape[KIR_MAX_DIMS]; /* dims as stored */
    const uint8_t *data;     /* first byte, inside the file's mapping; NULL for a lazy tensor */
    size_t nbytes;           /* bytes of data */
    const char *file;        /* the file that holds it (for messages) */
    int decoded;             /* a quantized layer's packed part, decoded into another tensor (quantized.c):
                                no weight reads it, and no warning calls it unused */
    const struct kf_lazy *lazy; /* NULL: data holds the bytes; else they are made when read (kf_tensor_bytes):
                                   a Hub layer decoded from its packed parts (quantized.c) */
} kf_tensor;

/* The bytes of t: its data, or a lazy tensor's decoded into its checkpoint's cache of one layer (valid
 * until another layer of that checkpoint is decoded: read them before asking for the next layer's), so
 * that a build of a quantized checkpoint holds one decoded layer, not the model. Never fails: the
 * layer was checked when the checkpoint was read. */
const uint8_t *kf_tensor_bytes(const kf_tensor *t);

typedef struct kf_checkpoint kf_checkpoint;

/* Open `path`: a folder holding model.safetensors or
 * model.safetensors.index.json (+ its shards), or one .safetensors file.
 * Returns NULL after reporting through d. */
kf_checkpoint *kf_checkpoint_open(ks_diag *d, const char *path);
void kf_checkpoint_close(kf_checkpoint *c);
/* Drop the mapped files' pages from the process's memory (ks_mmap_release): a build that has
 * converted a tensor calls it, so that its memory stays about one tensor, not the checkpoint. */
void kf_checkpoint_release(kf_checkpoint *c);

size_t kf_checkpoint_count(const kf_checkpoint *c);
const kf_tensor *kf_checkpoint_at(const kf_checkpoint *c, size_t i);
const kf_tensor *kf_checkpoint_find(const kf_checkpoint *c, const char *name); /* NULL if absent */
const char *kf_checkpoint_path(const kf_checkpoint *c); /* the path it was opened with */

/* Open a llama2.c checkpoint (.bin as run.c reads it: 7 int32 then
 * float32 arrays). Its header is checked (dims positive, n_heads divides
 * dim, n_kv_heads divides n_heads, even head size, file size exactly what
 * the header gives). Tensors, all F32, each layer's slice its own tensor:
 *
 *   tok_embeddings.weight               [vocab, dim]
 *   layers.{i}.attention_norm.weight    [dim]
 *   layers.{i}.attention.wq.weight      [dim, dim]
 *   layers.{i}.attention.wk.weight      [kv_dim, dim]   kv_dim = dim / n_heads * n_kv_heads
 *   layers.{i}.attention.wv.weight      [kv_dim, dim]
 *   layers.{i}.attention.wo.weight      [dim, dim]
 *   layers.{i}.ffn_norm.weight          [dim]
 *   layers.{i}.feed_forward.w1.weight   [hidden_dim, dim]
 *   layers.{i}.feed_forward.w2.weight   [dim, hidden_dim]
 *   layers.{i}.feed_forward.w3.weight   [hidden_dim, dim]
 *   norm.weight                         [dim]
 *   output.weight                       [vocab, dim]    only when not shared
 *
 * wq/wk rows are in Meta's order: RoPE rotates interleaved pairs. When
 * config_out is not NULL it receives a new cJSON object (free it with
 * cJSON_Delete) describing the model: {"model_type": "llama2c", "dim",
 * "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size" (always
 * positive), "seq_len", "shared_classifier" (bool), "norm_eps": 1e-5,
 * "rope_theta": 10000.0, "bos_token_id": 1, "eos_token_id": 2}; NULL on
 * failure. Returns NULL after reporting through d. */
kf_checkpoint *kf_checkpoint_open_llama2c(ks_diag *d, const char *path, cJSON **config_out);

/* Read the tensor as float32 into out, optionally transposed (a 2-D
 * [a,b] tensor read as [b,a]) and then restricted to rows [row_start,
 * row_end) of dim 0 (row_end < 0: all rows). out holds the result's
 * elements. Returns 0, or -1 with an error through d. */
int kf_tensor_read_f32(ks_diag *d, const kf_tensor *t, int transposed, int64_t row_start,
                       int64_t row_end, float *out);

/* How a weight reads its tensor (a .kiln source's `.T` and rows): the last two dims swapped when
 * transposed (a 2-D tensor, or each [a,b] of a 3-D one); then rows [row_start, row_end) of dim
 * row_dim (row_end < 0: all), every row_step-th (1: each); row_dim 1 takes them from each index of
 * dim 0 (a 2-D or 3-D tensor). */
typedef struct kf_tensor_view {
    int transposed;
    int row_dim;
    int64_t row_start, row_end, row_step;
    int64_t groups;       /* > 0: a 2-D [A, C] read as the 3-D [groups, A / groups, C] first */
    int transposed_after; /* row_dim 1: each index's rows, then that matrix transposed */
} kf_tensor_view;

/* Read the tensor as float32 into out as v says; out holds the result's elements. Returns 0, or -1
 * with an error through d. */
int kf_tensor_read_view(ks_diag *d, const kf_tensor *t, const kf_tensor_view *v, float *out);

#endif
