/*
 * interp.h — the reference interpreter: executes any verified kir_graph in
 * float32 on the CPU, one step at a time (runtime/step.h: the execution
 * model); weights of any float dtype are read as they are stored. It is
 * the numerical reference for every backend, and the CPU backend of the
 * runtime (runtime/interp/backend_interp.c).
 *
 * Prefix: krt_interp_.
 */
#ifndef KILN_RUNTIME_INTERP_H
#define KILN_RUNTIME_INTERP_H

#include "ir/ir.h"
#include "runtime/desc.h"
#include "runtime/kv/kv_cache.h"
#include "runtime/step.h"

typedef struct krt_interp krt_interp;

/* desc describes the graph to run (runtime/desc.h); it and the weights
 * must outlive the interpreter. weights[v] points at the data of WEIGHT
 * node v (in its node's dtype), NULL for other nodes. kv is the cache the
 * graph's attention reads and writes (NULL for a graph without attention),
 * laid out as desc->kv_layers with f32 elements. NULL after reporting. */
krt_interp *krt_interp_new(const krt_desc *desc, const void *const *weights, krt_kv *kv, ks_diag *d);
void krt_interp_free(krt_interp *it);

/* Bytes the interpreter allocated for copies of weights. The kernels read
 * weights where they lie, in their own dtype (f32, f16, bf16: half
 * precision is converted to f32 as it is read, exactly), so this is 0
 * unless some weight's data was not aligned to its elements (4 bytes for
 * f32, 2 for f16 and bf16), which is copied once here. An engine's weights
 * are aligned: it reads them from the engine's mapping. */
size_t krt_interp_weight_bytes(const krt_interp *it);

/* Run one step; out receives the OUTPUT value, [n_tokens, desc->vocab].
 * The step must be one the session checked (interp.c says what that
 * promises); returns 0, or -1 after reporting that memory for the step's
 * values ran out (before anything ran). */
int krt_interp_step(krt_interp *it, const krt_step *step, float *out, ks_diag *d);

/* The tap (runtime/step.h) sees every float value as soon as it is computed
 * (valid until the next node runs). */
void krt_interp_set_tap(krt_interp *it, krt_tap_fn tap, void *ctx);

#endif
