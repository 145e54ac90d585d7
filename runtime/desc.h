/*
 * desc.h — the engine description: every fact about an engine that the
 * runtime needs, computed once from its graph (and metadata) when the
 * engine is opened, and read by the session, every backend and the C API.
 * Nobody looks these facts up again in the graph: no input is found by its
 * name, no limit recomputed.
 *
 *     krt_desc d;
 *     if (krt_desc_init(&d, graph, "model.engine", diag) != 0) ...   // reports what is inconsistent
 *     d.vocab, d.n_token_ids, d.kv_layers[l], d.plan.offset[v] ...
 *     krt_desc_free(&d);
 *
 * An engine's description is e->desc (runtime/engine.h); kiln verify and the
 * tests describe graphs they build themselves with krt_desc_init.
 *
 * Prefix: krt_.
 */
#ifndef KILN_RUNTIME_DESC_H
#define KILN_RUNTIME_DESC_H

#include <stdint.h>

#include "ir/ir.h"
#include "ir/plan.h"
#include "runtime/kv/kv_cache.h"
#include "support/support.h"

/* The most tokens one step may have when the graph carries no memory plan. */
#define KRT_MAX_STEP_TOKENS (1 << 24)
/* The context of a graph that declares none (param max_context). */
#define KRT_DEFAULT_CONTEXT 2048
/* The most positions a sequence may have. */
#define KRT_MAX_CONTEXT (1 << 24)
/* The most end-of-sequence ids an engine may list. */
enum { KRT_MAX_EOS = 16 };

/* The memory plan (passes/plan_memory.c made it, ir/plan.h reads it): every
 * computed value of a step lives at a fixed byte offset in one arena sized
 * for the largest step. kir_verify proved it sound before it is read here. */
typedef struct krt_plan {
    int planned;            /* 1: the graph carries a plan */
    int64_t max_tokens;     /* the most tokens a step may have: the plan's, or KRT_MAX_STEP_TOKENS */
    kir_mem_plan mem;       /* planned: the plan (offsets, bytes, aliases); empty otherwise */
} krt_plan;

typedef struct krt_desc {
    const kir_graph *graph;  /* the graph described; not owned */
    const char *where;       /* what krt_desc_init's `what` named (the engine file; not owned, it must outlive
                                the description): what a backend's out-of-memory messages name */
    kir_val tokens;          /* the INPUT of token ids, or KIR_NONE */
    kir_val positions;       /* the INPUT of positions, or KIR_NONE */
    kir_val seq_lengths;     /* the INPUT of sequence lengths (longrope, dynamic RoPE), or KIR_NONE */
    kir_val output;          /* the OUTPUT: logits */
    int64_t vocab;           /* elements per output row: logits per token */
    int64_t n_token_ids;     /* token ids are below this: the rows of the table the token ids index */
    int max_context;         /* positions a sequence may have (param max_context) */
    int32_t bos;             /* beginning-of-sequence id, or -1 (param bos_token_id) */
    int32_t eos[KRT_MAX_EOS]; /* end-of-sequence ids (param eos_token_id: one id or a list) */
    int n_eos;               /* how many; 0: none */
    kir_dtype weight_dtype;  /* the dtype every weight has (KIR_F32 when there are none) */
    int mixed_weights;       /* 1: the weights do not share one dtype */
    int n_kv_layers;         /* layers of the KV cache: 1 + the largest `layer` of an attention or kv_write */
    krt_kv_layer *kv_layers; /* [n_kv_layers] each layer's heads and head sizes; {0,0,0} for a number no node uses */
    kir_dtype kv_dtype;      /* what the cache's K/V rows are (the kv_dtype of the attention and kv_write nodes,
                                one for the graph: kir_verify): f32, or bf16/f16 (fast precision); f32 without */
    krt_plan plan;           /* the memory plan */
} krt_desc;

/* Describe g (a verified graph). `what` names it in messages (the engine
 * file). Returns 0, or -1 after reporting what does not hang together (an
 * output that is not one row per token, a context over the position
 * table, a plan that does not fit). */
int krt_desc_init(krt_desc *desc, const kir_graph *g, const char *what, ks_diag *d);
void krt_desc_free(krt_desc *desc);

/* The K and V operands of a node that writes or reads the KV cache
 * (ATTENTION, KV_WRITE) into *k and *v: 1; 0 for other nodes. */
int krt_desc_kv_operands(const kir_node *n, kir_val *k, kir_val *v);
/* The KV-cache layer that such a node v of g needs: its K heads and dims, and its V dims (0 where V
 * is read from the K rows: v_in_k). The one definition the description's layers and the backends'
 * checks share. */
krt_kv_layer krt_desc_kv_layer_of(const kir_graph *g, kir_val v);

/* 1 when id is one of the description's end-of-sequence ids. */
int krt_desc_is_eos(const krt_desc *desc, int32_t id);

#endif
