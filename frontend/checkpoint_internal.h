/*
 * checkpoint_internal.h — what the checkpoint readers share and nothing else
 * sees: the kf_checkpoint table (checkpoint.c) that safetensors.c and
 * llama2c.c fill, and entry points that parse from memory, for the fuzz
 * targets and tests.
 *
 * A reader makes a table with kf_ckpt_new, maps its files with
 * kf_ckpt_map (the table unmaps them on close), checks each tensor's header
 * against the bytes it has, and adds it with kf_ckpt_add, which refuses a
 * second tensor of the same name. On any error the reader reports it and
 * closes the table.
 *
 * Prefix: kf_ckpt_ (private to the checkpoint readers).
 */
#ifndef KILN_CHECKPOINT_INTERNAL_H
#define KILN_CHECKPOINT_INTERNAL_H

#include <cjson/cJSON.h>

#include "frontend/checkpoint.h"

/* Most tensors one checkpoint may hold: far above any real model (Llama-3
 * 405B has ~1.1k), low enough that a hostile header cannot make kiln grow
 * its tables without end. */
#define KF_CKPT_MAX_TENSORS ((size_t)1 << 24)

struct kf_checkpoint {
    ks_arena arena;        /* names, file paths, the path: the checkpoint's lifetime */
    const char *path;      /* the path it was opened with (in arena) */
    kf_tensor *tensors;    /* heap array of n_tensors, in file order (shard by shard) */
    size_t n_tensors;      /* tensors held */
    size_t cap_tensors;    /* capacity of tensors */
    ks_hmap by_name;       /* tensor name -> its index in tensors */
    ks_mmap *maps;         /* files mapped for this checkpoint, unmapped on close */
    size_t n_maps;         /* maps in use */
    size_t cap_maps;       /* capacity of maps */
    struct kf_qcache *qcache; /* the quantized layer decoded last (quantized.c), or NULL */
};

/* The bytes of a lazy tensor (kf_tensor_bytes; quantized.c). */
const uint8_t *kf_lazy_bytes(const struct kf_lazy *z);
/* Free a checkpoint's decoded layer (quantized.c; NULL: nothing). */
void kf_qcache_free(struct kf_qcache *q);

/* A new empty table for `path` (copied). */
kf_checkpoint *kf_ckpt_new(const char *path);

/* Map `file` and keep the mapping until close. Returns the mapping (valid
 * until close), or NULL after reporting through d. */
const ks_mmap *kf_ckpt_map(kf_checkpoint *c, ks_diag *d, const char *file);

/* A copy of s that lives as long as the checkpoint. */
const char *kf_ckpt_strdup(kf_checkpoint *c, const char *s);

/* The tensor named `name`, or NULL. */
const kf_tensor *kf_ckpt_lookup(const kf_checkpoint *c, const char *name);

/* Add t (its name and file must live as long as c: use kf_ckpt_strdup).
 * Returns NULL, or the tensor of the same name already held (t is then not
 * added; the caller reports the clash). The caller checks the count
 * against KF_CKPT_MAX_TENSORS first. */
const kf_tensor *kf_ckpt_add(kf_checkpoint *c, const kf_tensor *t);

/* Parse one safetensors file held in memory (not copied: data must outlive
 * the checkpoint); `name` names it in messages. As kf_checkpoint_open. */
kf_checkpoint *kf_checkpoint_open_memory(ks_diag *d, const char *name, const uint8_t *data,
                                         size_t size);

/* Parse one llama2.c .bin held in memory (not copied). As
 * kf_checkpoint_open_llama2c. */
kf_checkpoint *kf_checkpoint_open_llama2c_memory(ks_diag *d, const char *name,
                                                 const uint8_t *data, size_t size,
                                                 cJSON **config_out);

#endif
