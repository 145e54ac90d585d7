/* derived_weight.c — recipes and data of derived WEIGHT nodes (passes/derived_weight.h). */
#include "passes/derived_weight.h"

#include <string.h>

int kp_weight_is_derived(const kir_graph *g, kir_val w)
{
    return kir_node_at(g, w)->op == KIR_OP_WEIGHT && kir_attr_has(g, w, KIR_A_WEIGHT_DERIVE);
}

/* The data w's recipe derives: w's own dtype and dims, or for a part of a quantization the f32
 * matrix it quantizes (ir/ir.h, "quantized weights"). */
static kir_node recipe_data(const kir_graph *g, kir_val w)
{
    kir_node d = *kir_node_at(g, w);
    if (kir_weight_quant_part(g, w) && d.ndim == 2) {
        d.dtype = KIR_F32;
        kir_quant_data_dims(g, w, d.dims);
    }
    return d;
}

int kp_weight_recipe_of(const kir_graph *g, kir_val w, ks_arena *arena, kp_weight_recipe *r)
{
    memset(r, 0, sizeof *r);
    if (kir_node_at(g, w)->op != KIR_OP_WEIGHT || !kir_attr_has(g, w, KIR_A_WEIGHT_DERIVE)) return 0;
    const kir_node data = recipe_data(g, w), *n = &data;
    const char *sources = kir_attr_str(g, w, KIR_A_WEIGHT_SOURCES);
    uint32_t n_rows = 0;
    const int64_t *rows = kir_attr_ints(g, w, KIR_A_WEIGHT_ROWS, &n_rows);
    kir_word derive = kir_attr_word(g, w, KIR_A_WEIGHT_DERIVE);
    /* along: the dim the sources' rows make up (concat1: 1, the stacked experts' rows) */
    const int along = derive == KIR_DERIVE_CONCAT1;
    const int one = derive == KIR_DERIVE_OFFSET || derive == KIR_DERIVE_SMOOTH; /* one source */
    if ((derive != KIR_DERIVE_CONCAT0 && derive != KIR_DERIVE_CONCAT1 && !one) || !sources || !rows || n->ndim < along + 1 ||
        (derive == KIR_DERIVE_SMOOTH && !kir_attr_str(g, w, KIR_A_WEIGHT_SMOOTH_OF)))
        return -1;
    size_t count = 1;
    for (const char *p = sources; *p; p++) count += *p == ',';
    if (count != n_rows || (one && count != 1)) return -1;
    /* bytes of one row of dim `along`, times the rows of the dims before it (concat1: each expert's) */
    size_t row_bytes = kir_dtype_size(n->dtype);
    for (int d = 0; d < n->ndim; d++)
        if (d != along) row_bytes *= (size_t)n->dims[d];
    r->names = ks_arena_alloc(arena, sizeof *r->names * count);
    r->rows = ks_arena_alloc(arena, sizeof *r->rows * count);
    r->bytes = ks_arena_alloc(arena, sizeof *r->bytes * count);
    int64_t sum = 0;
    const char *name = sources;
    for (size_t i = 0; i < count; i++) {
        const char *end = strchr(name, ',');
        size_t len = end ? (size_t)(end - name) : strlen(name);
        int64_t rw = rows[i];
        if (len == 0 || rw <= 0 || rw > n->dims[along] - sum) return -1;
        r->names[i] = ks_arena_strndup(arena, name, len);
        r->rows[i] = rw;
        r->bytes[i] = (size_t)rw * row_bytes;
        sum += rw;
        name += len + (end != NULL);
    }
    if (sum != n->dims[along]) return -1;
    r->n_sources = count;
    return 0;
}

void kp_derive_weight(const kir_graph *g, kir_val w, const kp_weight_recipe *r, const void *const *sources, void *out)
{
    const kir_node data = recipe_data(g, w), *n = &data;
    size_t total = (size_t)kir_elems(n, 1) * kir_dtype_size(n->dtype), at = 0;
    KS_ASSERT(r->n_sources > 0);
    /* smooth: the engine builder's, from the calibration (compiler/smooth.c) */
    KS_ASSERT(kir_attr_word(g, w, KIR_A_WEIGHT_DERIVE) != KIR_DERIVE_SMOOTH);
    if (kir_attr_word(g, w, KIR_A_WEIGHT_DERIVE) == KIR_DERIVE_OFFSET) {
        /* offset: each element plus the offset, in f32, rounded once to the weight's dtype */
        KS_ASSERT(r->n_sources == 1 && r->bytes[0] == total);
        const float off = (float)kir_attr_float(g, w, KIR_A_WEIGHT_OFFSET);
        const size_t ne = (size_t)kir_elems(n, 1);
        for (size_t i = 0; i < ne; i++) {
            if (n->dtype == KIR_F32) {
                float f;
                memcpy(&f, (const uint8_t *)sources[0] + 4 * i, 4);
                f += off;
                memcpy((uint8_t *)out + 4 * i, &f, 4);
            } else {
                uint16_t h;
                memcpy(&h, (const uint8_t *)sources[0] + 2 * i, 2);
                const int bf = n->dtype == KIR_BF16;
                KS_ASSERT(bf || n->dtype == KIR_F16);
                float f = (bf ? ks_bf16_to_f32(h) : ks_f16_to_f32(h)) + off;
                h = bf ? ks_f32_to_bf16(f) : ks_f32_to_f16(f);
                memcpy((uint8_t *)out + 2 * i, &h, 2);
            }
        }
        return;
    }
    if (kir_attr_word(g, w, KIR_A_WEIGHT_DERIVE) == KIR_DERIVE_CONCAT1) {
        /* concat1: for each index of dim 0, each source's slab of rows[i] rows of dims 2.. */
        const size_t outer = (size_t)n->dims[0];
        for (size_t o = 0; o < outer; o++)
            for (size_t i = 0; i < r->n_sources; i++) {
                const size_t slab = r->bytes[i] / outer;
                KS_ASSERT(at + slab <= total);
                memcpy((uint8_t *)out + at, (const uint8_t *)sources[i] + o * slab, slab);
                at += slab;
            }
        KS_ASSERT(at == total);
        return;
    }
    /* concat0: row-major data, so the sources' bytes one after another */
    for (size_t i = 0; i < r->n_sources; i++) {
        KS_ASSERT(at + r->bytes[i] <= total);
        memcpy((uint8_t *)out + at, sources[i], r->bytes[i]);
        at += r->bytes[i];
    }
    KS_ASSERT(at == total);
}
