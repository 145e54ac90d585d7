/*
 * cuda_profile.h — the CUDA backend's profiler (krt_backend_opts.profile),
 * private to runtime/cuda: cuda_backend.c runs a profiled step eagerly (no
 * CUDA graphs) and records an event before and after every launch and at
 * the step's start and end; after the step's wait, krt_cu_profile_collect
 * sums the times between them per kernel name, for decode steps (at most
 * KRT_PROFILE_DECODE_TOKENS tokens) and prefill steps apart, with each
 * step's device time from its first launch to its last copy, and the
 * operations each kernel did (ir/flops.h: matmuls and attention; the other
 * ops count none), each node's counted for the last launch computing it (an
 * attention's, not its kv_write's) or, in a fused kernel, for the group's;
 * krt_cu_profile_report writes the tables, with the rate each kernel ran at
 * and its fraction of a ceiling the caller gives.
 *
 * Events, for n kernels in cuda.meta: launch i is timed between events 2i
 * and 2i + 1, the draw kernel between 2n and 2n + 1, the step between
 * 2(n + 1) and 2(n + 1) + 1.
 *
 * Prefix: krt_cu_profile_.
 */
#ifndef KILN_CUDA_PROFILE_H
#define KILN_CUDA_PROFILE_H

#include "ir/ir.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda/cuda_meta.h"
#include "runtime/step.h"

/* What the profile sums for one kind of step (decode or prefill). */
typedef struct krt_cu_prof_class {
    long steps;        /* steps run */
    long tokens;       /* their tokens */
    double step_ms;    /* device time of the steps: first launch to last copy */
    double min_ms;     /* the shortest step */
    double max_ms;     /* the longest step */
    long *launches;    /* [n_names + 1] launches of each kernel name (the draw kernel last) */
    double *kernel_ms; /* [n_names + 1] their time */
    double *flops;     /* [n_names + 1] the operations they did (ir/flops.h) */
} krt_cu_prof_class;

typedef struct krt_cu_profile {
    const krt_cuda_api *api;    /* the driver the events come from; not owned */
    krt_cu_stream stream;       /* the stream the events are recorded on */
    const krt_cuda_meta *meta;  /* the launch table; not owned */
    const kir_graph *g;         /* the graph its kernels compute, named in the report; not owned */
    krt_cu_event *events;       /* [2 * (n_kernels + 1) + 2]: before and after each launch (the draw last), then
                                   the step's first and last */
    int n_events;               /* events created */
    int *name_of;               /* [n_kernels] index of each launch's kernel name among the distinct ones */
    int n_names;                /* distinct kernel names; the draw kernel counts as name n_names */
    int *flop_kernel;           /* [g->n_nodes] the launch whose time node v's operations count in; -1: none */
    double *step_flops;         /* [n_kernels] scratch: each launch's operations in the step collected */
    krt_cu_prof_class prof[2];  /* [0] decode steps, [1] prefill steps */
} krt_cu_profile;

/* A profile of meta's launches on stream, its events created (the device's
 * context current). NULL after reporting when the driver cannot create them. */
krt_cu_profile *krt_cu_profile_new(const krt_cuda_api *api, krt_cu_stream stream, const krt_cuda_meta *meta,
                                   const kir_graph *g, ks_diag *d);
/* Destroy the events (the device's context current) and free p; NULL does nothing. */
void krt_cu_profile_free(krt_cu_profile *p);
/* Record event i on the stream. */
int krt_cu_profile_record(krt_cu_profile *p, int i, ks_diag *d);
/* After step st (and n_draw draws) has run and the stream has been waited
 * for: its launches' times and operations and its own time, summed into its
 * kind of step. run: the most tokens one sequence had in it (which kernels ran:
 * krt_cuda_large). head: the kernel that ran on the n_draw drawn rows only (its
 * operations counted for them), or -1. */
int krt_cu_profile_collect(krt_cu_profile *p, const krt_step *st, int64_t run, int n_draw, int head, ks_diag *d);
/* The tables: per kind of step that ran, each kernel name's launches, time,
 * operations (GFLOP) and rate (TFLOP/s), and what it computes; with
 * ceiling_tflops > 0 the rate's fraction of it as well (0: no such column). */
void krt_cu_profile_report(const krt_cu_profile *p, double ceiling_tflops, ks_buf *out);

#endif
