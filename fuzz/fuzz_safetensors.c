/* fuzz_safetensors.c — bytes as one safetensors file, parsed from memory
 * (kf_checkpoint_open_memory), then every tensor read as f32 whole,
 * transposed when 2-D, and as its second half of rows. A failed open must
 * have reported an error; a crash, leak or sanitizer report is the bug. */
#include <stdlib.h>

#include "frontend/checkpoint_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void read_all(ks_diag *d, const kf_tensor *t)
{
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    /* n * dtype size == nbytes <= size: the reader checked it. */
    float *out = malloc((n ? n : 1) * sizeof *out);
    KS_ASSERT(out);
    KS_ASSERT(kf_tensor_read_f32(d, t, 0, 0, -1, out) == 0);
    if (t->ndim == 2) KS_ASSERT(kf_tensor_read_f32(d, t, 1, 0, -1, out) == 0);
    if (t->ndim >= 1) KS_ASSERT(kf_tensor_read_f32(d, t, 0, t->shape[0] / 2, t->shape[0], out) == 0);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ks_buf log = {0};
    ks_diag d = {.quiet = 1, .log = &log};
    kf_checkpoint *c = kf_checkpoint_open_memory(&d, "fuzz.safetensors", data, size);
    if (c) {
        KS_ASSERT(d.errors == 0);
        for (size_t i = 0; i < kf_checkpoint_count(c); i++) {
            const kf_tensor *t = kf_checkpoint_at(c, i);
            KS_ASSERT(kf_checkpoint_find(c, t->name) == t);
            KS_ASSERT(t->data >= data && t->nbytes <= size && t->data + t->nbytes <= data + size);
            read_all(&d, t);
        }
        KS_ASSERT(d.errors == 0);
        kf_checkpoint_close(c);
    } else {
        KS_ASSERT(d.errors == 1 && log.len > 0);
    }
    ks_buf_free(&log);
    return 0;
}
