/* f16_range.c — what storing weights as f16 would lose (kd_check_f16_range,
 * compiler/driver.h): checkpoint values beyond f16's range, or too many below its
 * normal range, found before any weight is converted. */
#include <stdlib.h>
#include <string.h>

#include "compiler/driver.h"
#include "passes/derived_weight.h"

/* f16's limits, as f32 bit patterns of magnitudes (ks_f32_to_f16 rounds to
 * nearest even): from 65520 up a value becomes inf (65504 is the largest
 * finite f16); under 2^-14 it is subnormal (fewer significant bits); at most
 * 2^-25 it becomes 0. The same limits as bf16 bit patterns (bf16 is the high
 * half of an f32: 65520 is not one, 65536 = 2^16 is the first beyond). */
#define F32_INF 0x7f800000u
#define F32_OVERFLOW 0x477ff000u
#define F32_NORMAL 0x38800000u
#define F32_ZERO 0x33000000u
#define BF16_INF 0x7f80u
#define BF16_OVERFLOW 0x4780u
#define BF16_NORMAL 0x3880u
#define BF16_ZERO 0x3300u

/* A warning names a tensor with more than this share of its values under
 * f16's normal range (nonzero). Trained and randomly initialised weights
 * have well under 1% there (the shared test models: at most 0.52%); a
 * tensor whose scale is itself tiny has most of its values there. */
#define BELOW_NORMAL_SHARE 0.01

/* What converting one tensor to f16 would do to its values. Magnitudes are
 * kept as f32 bit patterns (nonnegative floats order as their bits). */
typedef struct f16_loss {
    size_t n;          /* values */
    size_t overflow;   /* finite values that would become inf */
    size_t below;      /* nonzero values under 2^-14: subnormal or 0 in f16 */
    size_t zero;       /* of those, the ones that would become 0 */
    uint32_t max_abs;  /* the largest finite magnitude */
    uint32_t min_abs;  /* the smallest nonzero magnitude; F32_INF if none */
} f16_loss;

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Scan a tensor's data (f32 or bf16, little-endian). The loops are plain
 * integer compares, which the compiler vectorizes: a pass over the data is
 * memory-bound. */
static void scan(const kf_tensor *t, f16_loss *s)
{
    size_t n = t->nbytes / kir_dtype_size(t->dtype);
    size_t over = 0, below = 0, zero = 0;
    const uint8_t *data = kf_tensor_bytes(t); /* a lazy tensor's decoded */
    uint32_t hi = 0, lo = F32_INF;
    if (t->dtype == KIR_F32) {
        for (size_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, data + 4 * i, 4);
            u &= 0x7fffffffu;
            int finite = u < F32_INF, tiny = u != 0 && u < F32_NORMAL;
            over += finite && u >= F32_OVERFLOW;
            below += tiny;
            zero += tiny && u <= F32_ZERO;
            hi = finite && u > hi ? u : hi;
            lo = u != 0 && u < lo ? u : lo;
        }
    } else { /* bf16 */
        for (size_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)(data[2 * i] | data[2 * i + 1] << 8) & 0x7fffu;
            int finite = u < BF16_INF, tiny = u != 0 && u < BF16_NORMAL;
            over += finite && u >= BF16_OVERFLOW;
            below += tiny;
            zero += tiny && u <= BF16_ZERO;
            hi = finite && u << 16 > hi ? u << 16 : hi;
            lo = u != 0 && u << 16 < lo ? u << 16 : lo;
        }
    }
    *s = (f16_loss){n, over, below, zero, hi, lo};
}

/* Report one tensor: an error (returns -1) when values would become inf, a
 * warning when more than BELOW_NORMAL_SHARE of them are under f16's normal
 * range. */
static int report(const kf_tensor *t, const f16_loss *s, ks_diag *d)
{
    if (s->overflow) {
        ks_error(d, "kiln",
                 "--dtype f16: tensor '%s' has %zu of %zu values beyond f16's range (largest magnitude %g; f16 "
                 "holds at most 65504): they would become inf; --dtype bf16 keeps f32's range",
                 t->name, s->overflow, s->n, (double)bits_f32(s->max_abs));
        return -1;
    }
    if ((double)s->below > BELOW_NORMAL_SHARE * (double)s->n)
        ks_warning(d, "kiln",
                   "--dtype f16: tensor '%s' has %zu of %zu values (%.1f%%) below f16's normal range (nonzero, "
                   "magnitude under 6.10352e-05; the smallest %g): stored with fewer significant bits, %zu of them "
                   "as 0; --dtype bf16 keeps f32's range",
                   t->name, s->below, s->n, 100.0 * (double)s->below / (double)s->n, (double)bits_f32(s->min_abs),
                   s->zero);
    return 0;
}

/* Add t to the list of tensors to scan, unless it is there or holds f16 already. */
static void add_tensor(const kf_tensor *t, const kf_tensor ***list, size_t *n, size_t *cap)
{
    if (!t || t->dtype == KIR_F16) return;
    for (size_t i = 0; i < *n; i++)
        if ((*list)[i] == t) return;
    KS_GROW(*list, *n + 1, *cap, (size_t)1 << 30, "tensors to check");
    (*list)[(*n)++] = t;
}

/* Add the checkpoint tensors behind weight `name` (one, or one an expert; none for synthetic weights). */
static void add_tensors_of(const kd_model *m, const char *name, const kf_tensor ***list, size_t *n, size_t *cap)
{
    const kf_weight_binding *b = m->ckpt ? kd_binding(m, name) : NULL;
    if (!b) return;
    if (!b->n_parts) add_tensor(kf_checkpoint_find(m->ckpt, b->tensor), list, n, cap);
    for (int64_t p = 0; p < b->n_parts; p++) add_tensor(kf_checkpoint_find(m->ckpt, b->parts[p]), list, n, cap);
}

int kd_check_f16_range(const kd_model *m, const kir_graph *g, ks_diag *d)
{
    const kf_tensor **list = NULL;
    size_t n = 0, cap = 0;
    for (size_t v = 0; v < g->n_nodes; v++) {
        const kir_node *node = &g->nodes[v];
        /* a quantized weight's f16 scales are amax / qmax of its values, far inside f16 (kp_quantize_matrix):
         * its float data is not stored as f16 */
        if (node->op != KIR_OP_WEIGHT || node->dtype != KIR_F16 || kir_weight_quant_part(g, (kir_val)v)) continue;
        if (!kp_weight_is_derived(g, (kir_val)v)) {
            add_tensors_of(m, kir_attr_str(g, (kir_val)v, KIR_A_WEIGHT_NAME), &list, &n, &cap);
            continue;
        }
        ks_arena scratch = {0};
        kp_weight_recipe r;
        int rc = kp_weight_recipe_of(g, (kir_val)v, &scratch, &r);
        KS_ASSERT(rc == 0); /* the graph verified */
        for (size_t i = 0; i < r.n_sources; i++) add_tensors_of(m, r.names[i], &list, &n, &cap);
        ks_arena_free(&scratch);
    }
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        f16_loss s;
        scan(list[i], &s);
        if (report(list[i], &s, d) != 0) rc = -1;
        if (m->ckpt) kf_checkpoint_release(m->ckpt); /* its pages: a tensor at a time, as the build writes */
    }
    free(list);
    return rc;
}
