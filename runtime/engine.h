/*
 * engine.h — the engine file: one self-contained, versioned, checksummed file
 * holding the graph (IR text), metadata (JSON), the packed weights and the
 * tokenizer. `kiln build` writes it; the runtime maps it and checks all of it
 * before anything runs.
 *
 * Layout (all integers little-endian):
 *
 *   [0, 64)      header: magic "KILNENG\0" (bytes 0-7), u32 format version
 *                (8-11), u32 section count (12-15), u64 file size (16-23),
 *                u64 checksum (24-31), zero padding (32-63)
 *   checksum     ks_hash64 of the whole file, header and all, with the
 *                checksum field taken as zero while hashing: damage to any
 *                byte, the header's included, is found at open
 *   [64, ...)    section table: per section 48 bytes: name (16 bytes, NUL
 *                padded), u64 offset, u64 size, u64 alignment, u64 reserved
 *   sections     each at an offset that is a multiple of its alignment:
 *                "meta"        JSON object: target, dtype, kiln version, source
 *                "graph"       IR text (kir_print), parsed back with kir_parse
 *                "weights.idx" u32 count, then per weight: u32 node (value index
 *                              of its WEIGHT node), u32 dtype, u64 offset in
 *                              "weights", u64 bytes
 *                "weights"     packed weight data, each weight 256-byte aligned
 *                              so that it can be uploaded as it lies
 *                "tokenizer"   optional: u32 kind, then the tokenizer's file bytes
 *                any other     optional sections a backend adds (krt_engine_spec.extra),
 *                              e.g. "cuda.meta" and "cuda.sm_90"; readers skip the
 *                              ones they do not know
 *
 * Prefix: krt_.
 */
#ifndef KILN_ENGINE_H
#define KILN_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "ir/ir.h"
#include "runtime/desc.h"
#include "support/support.h"

#define KRT_ENGINE_MAGIC "KILNENG"  /* 8 bytes with the NUL */
#define KRT_ENGINE_VERSION 2u       /* bump on any layout change (2: the checksum covers the header) */
enum { KRT_WEIGHT_ALIGN = 256 };
/* Bytes of a weight the writer asks fill_part for at once (a multiple of every element size). */
enum { KRT_WEIGHT_PART = 64 << 20 };

/* The extra section that holds a model's chat template, when its checkpoint has one: JSON
 * {"template": ..., "bos_token": ..., "eos_token": ...} (kiln build from tokenizer_config.json; kiln
 * serve's /v1/chat/completions renders it). */
#define KRT_CHAT_TEMPLATE_SECTION "chat_template"

/* An extra named section (a backend's code or tables). */
typedef struct krt_engine_section {
    const char *name;  /* at most 15 bytes, none of the standard names */
    const void *data;  /* its bytes */
    size_t size;       /* bytes */
} krt_engine_section;

/* Produces the data of WEIGHT node `node` (nbytes, in the node's dtype) into dst. */
typedef int (*krt_weight_fill)(void *ctx, kir_val node, void *dst, size_t nbytes, ks_diag *d);
/* Produces bytes [at, at + nbytes) of WEIGHT node `node`'s data into dst (at and nbytes multiples of
 * its element size): 0, -1 after reporting, or 1 (nothing done) when the weight comes only whole
 * (then fill is called for it). */
typedef int (*krt_weight_fill_part)(void *ctx, kir_val node, size_t at, void *dst, size_t nbytes, ks_diag *d);

typedef struct krt_engine_spec {
    const kir_graph *graph;       /* the graph to store */
    const char *meta_json;        /* metadata object text (target, dtype, source...) */
    krt_weight_fill fill;         /* called once per WEIGHT node, in node order */
    krt_weight_fill_part fill_part; /* optional: a weight in parts of KRT_WEIGHT_PART bytes where it can, so
                                       that the writer's memory is a part, not the largest weight */
    void *fill_ctx;               /* passed to fill */
    const void *tokenizer;        /* tokenizer bytes, or NULL */
    size_t tokenizer_len;         /* bytes */
    uint32_t tokenizer_kind;      /* the runtime's tokenizer kind tag */
    const krt_engine_section *extra; /* extra sections, written in this order after the others */
    size_t n_extra;               /* how many */
    void (*progress)(void *ctx, uint64_t done, uint64_t total); /* if set, called after each weight with the
                                                                   weight bytes written so far and in all */
    void *progress_ctx;           /* passed to progress */
} krt_engine_spec;

/* Write an engine file atomically (a temp file renamed into place on
 * success; see ks_outfile for outputs that are not regular files). Returns
 * 0, or -1 after reporting; no partial file is left. */
int krt_engine_write(const char *path, const krt_engine_spec *spec, ks_diag *d);

/* The same in two steps, so that a caller can open the output before the
 * slow work that prepares the spec (a bad path fails at once; a signal
 * meanwhile removes the temp file): krt_engine_open_output opens path as an
 * engine output (0, or -1 after reporting); krt_engine_write_to writes the
 * engine into it and commits it, or removes it on an error, and in every
 * case takes *out over; *size (when size is not NULL) gets the engine's
 * size in bytes. */
int krt_engine_open_output(const char *path, ks_outfile *out, ks_diag *d);
int krt_engine_write_to(ks_outfile *out, const krt_engine_spec *spec, uint64_t *size, ks_diag *d);

typedef struct krt_engine {
    ks_mmap map;                  /* the whole file, mapped */
    const char *path;             /* as opened (owned) */
    uint32_t version;             /* format version */
    uint64_t checksum;            /* as stored, and verified over the whole file */
    char *meta_json;              /* NUL-terminated copy of "meta" */
    kir_graph *graph;             /* parsed and verified graph (owned) */
    krt_desc desc;                /* what the runtime needs to know of it, computed once at open */
    const void **weights;         /* [graph->n_nodes]: data of each WEIGHT node, else NULL */
    size_t n_weights;             /* WEIGHT nodes */
    uint64_t weight_bytes;        /* size of the "weights" section */
    const uint8_t *tokenizer;     /* tokenizer bytes inside the map, or NULL */
    size_t tokenizer_len;         /* bytes */
    uint32_t tokenizer_kind;      /* kind tag */
    const uint8_t *section_table; /* the section table inside the map (checked at open) */
    uint32_t n_sections;          /* its entries */
} krt_engine;

/* Open, check (magic, version, size, checksum of every byte, section table
 * and bounds, graph parse and verify with its memory plan, weight index),
 * map and describe (e->desc) an engine. NULL after reporting
 * `path: error: ...`. */
krt_engine *krt_engine_open(const char *path, ks_diag *d);
void krt_engine_close(krt_engine *e);

/* The bytes of section `name` inside the map (*size set), or NULL when the
 * engine has none. */
const void *krt_engine_section_data(const krt_engine *e, const char *name, size_t *size);

/* The string value of a top-level key of the metadata, or dflt when it has
 * none; NULL when the metadata cannot be read (it is not JSON, or memory ran
 * out: cJSON's, or a fallible scratch's, then marked failed). */
const char *krt_engine_meta(const krt_engine *e, const char *key, const char *dflt, ks_buf *scratch);

#endif
