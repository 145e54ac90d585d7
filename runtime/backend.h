/*
 * backend.h — a backend is a table of functions (QBE's Target, ggml's
 * ggml_backend_i). Code above the backends never tests which one it has:
 * it asks for an optional entry and does without when it is NULL.
 *
 * Prefix: krt_.
 */
#ifndef KILN_BACKEND_H
#define KILN_BACKEND_H

#include "runtime/engine.h"
#include "runtime/kv/kv_cache.h"
#include "runtime/step.h"

/* Settings a session passes to a device backend's open. */
typedef struct krt_backend_opts {
    int graphs;           /* 1: replay captured launch sequences (CUDA graphs) where the backend can */
    int graph_max_tokens; /* steps of at most this many tokens are captured, one graph per size */
    int profile;          /* 1: time every kernel (no graphs) for profile_report */
    int kernel_overlap;   /* 1: a kernel may start while the one before it ends, where the device and the engine
                             allow (CUDA: programmatic dependent launch on sm_90 and later) */
} krt_backend_opts;

/* Profiles count steps of at most this many tokens as decode steps, larger
 * ones as prefill steps. */
#define KRT_PROFILE_DECODE_TOKENS 8

/* One draw of a next token on the device, with runtime/text/sampler.c's rules
 * (no repetition penalty): temperature 0 is the arg max (lowest id among
 * equals), else top-k, top-p and one uniform draw from its generator. */
typedef struct krt_draw {
    float temperature; /* 0: greedy */
    int32_t top_k;     /* 0: all */
    float top_p;       /* 1: all */
    uint64_t rng;      /* in: the xorshift64* state (krt_sampler_rng); out: after the draw */
    int32_t id;        /* out: the id drawn; -1 when every logit is NaN or -inf */
} krt_draw;

/* What the device holds: for sizing the KV cache and for messages. */
typedef struct krt_device_mem {
    size_t free_bytes;  /* free now */
    size_t total_bytes; /* the device's memory */
    char name[128];     /* the device, as its driver names it */
} krt_device_mem;

typedef struct krt_backend {
    const char *name;                  /* "interp", "cpu", "cuda", ... */
    const krt_kv_storage *kv_storage;  /* where this backend's KV blocks live */
    /* Bytes per K/V element this backend stores for an engine described by
     * desc (whose kv_dtype says what the rows are). */
    size_t (*kv_elem_size)(const krt_desc *desc);
    /* Bytes of the scale of a (position, KV head) row of such a cache: 0, or
     * NULL, where it holds values; 4 (an f32) where it holds int8 or fp8
     * codes (runtime/kv/kv_cache.h's scale_size). */
    size_t (*kv_scale_size)(const krt_desc *desc);
    /* Prepare to run e's graph (described by e->desc) with KV cache kv,
     * laid out as e->desc.kv_layers; returns the backend's state. */
    void *(*create)(const krt_engine *e, krt_kv *kv, ks_diag *d);
    void (*destroy)(void *state);
    /* Run one step (runtime/step.h), which the session checked: token ids
     * below desc.n_token_ids, positions reserved, at most
     * desc.plan.max_tokens tokens. out: [n_tokens, desc.vocab] f32 on the
     * host. -1 after reporting when the device fails. */
    int (*step)(void *state, const krt_step *step, float *out, ks_diag *d);
    /* Optional, for backends whose KV blocks live on a device (NULL for the
     * others); when set they replace create. open prepares the device for e
     * before the KV cache exists, checking that e can run there and allocating
     * nothing when it cannot, and uploads the weights; the state it returns
     * becomes kv_storage's ctx. attach then hands the state its KV cache.
     * destroy comes after the KV cache is freed. */
    void *(*open)(const krt_engine *e, const krt_backend_opts *o, ks_diag *d);
    int (*attach)(void *state, krt_kv *kv, ks_diag *d);
    /* Optional: the device's memory, after open. 0, or -1 after reporting. */
    int (*mem_info)(void *state, krt_device_mem *m, ks_diag *d);
    /* Optional: 1 when step_draw can run (the engine holds the draw kernel). */
    int (*can_draw)(void *state);
    /* Optional: step, then draw n_draw next tokens on the device, draw k from
     * the logits of token rows[k]; only the ids (and generator states) come
     * back. out receives the logits too when not NULL. */
    int (*step_draw)(void *state, const krt_step *step, float *out, int n_draw, const int32_t *rows, krt_draw *draws,
                     ks_diag *d);
    /* Optional: after each step, show every value the step computed (f32, half ones as f32) to
     * tap (runtime/step.h's krt_tap_fn), in schedule order; NULL turns it off.
     * A backend whose fused kernels keep a group's inner values to
     * themselves does not show those. 0, or -1 after reporting (out of
     * memory for what it copies back: the tap is then off). */
    int (*set_tap)(void *state, krt_tap_fn tap, void *ctx, ks_diag *d);
    /* Optional: after steps run with krt_backend_opts.profile, append the
     * time each kernel took (a table per kind of step: launches, total and
     * mean, share of the steps' device time, operations and rate, the node
     * it computes) and the steps' device times to out; with
     * ceiling_tflops > 0 each rate's fraction of it too. */
    void (*profile_report)(void *state, double ceiling_tflops, ks_buf *out);
} krt_backend;

/* The reference interpreter as a backend: fp32 on the CPU. */
extern const krt_backend krt_backend_interp;
/* CUDA (runtime/cuda/cuda_backend.c): loads libcuda at run time. */
extern const krt_backend krt_backend_cuda;

/* The backend for an engine's target (from its metadata), or NULL after reporting. */
const krt_backend *krt_backend_for(const krt_engine *e, ks_diag *d);

#endif
