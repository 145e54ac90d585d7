/*
 * backend.h — a backend is a table of functions (QBE's Target, ggml's
 * ggml_backend_i). Code above the backends never tests which one it has.
 *
 * Prefix: krt_.
 */
#ifndef KILN_BACKEND_H
#define KILN_BACKEND_H

#include "ir/interp.h"
#include "runtime/engine.h"
#include "runtime/kv_cache.h"

typedef struct krt_backend {
    const char *name;                  /* "interp", "cpu", "cuda", ... */
    const krt_kv_storage *kv_storage;  /* where this backend's KV blocks live */
    size_t kv_elem_size;               /* bytes per K/V element */
    /* Prepare to run e's graph with KV cache kv; returns the backend's state. */
    void *(*create)(const krt_engine *e, krt_kv *kv, ks_diag *d);
    void (*destroy)(void *state);
    /* Run one step (see ir/interp.h's execution model); out: [n_tokens, vocab] f32 on the host. */
    int (*step)(void *state, const kir_step *step, float *out, ks_diag *d);
    /* Optional, for backends whose KV blocks live on a device (NULL for the
     * others); when set they replace create. open prepares the device for e
     * before the KV cache exists, checking that e can run there and allocating
     * nothing when it cannot; the state it returns becomes kv_storage's ctx.
     * attach then hands the state its KV cache. destroy comes after the KV
     * cache is freed. */
    void *(*open)(const krt_engine *e, ks_diag *d);
    int (*attach)(void *state, krt_kv *kv, ks_diag *d);
} krt_backend;

/* The reference interpreter as a backend: fp32 on the CPU. */
extern const krt_backend krt_backend_interp;
/* CUDA (runtime/cuda_backend.c): loads libcuda at run time; f32 for now. */
extern const krt_backend krt_backend_cuda;

/* The backend for an engine's target (from its metadata), or NULL after reporting. */
const krt_backend *krt_backend_for(const krt_engine *e, ks_diag *d);

#endif
