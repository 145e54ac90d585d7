/* fuzz_llama2c.c — bytes as a llama2.c .bin, parsed from memory
 * (kf_checkpoint_open_llama2c_memory), every tensor read as f32, the
 * synthesized config freed. A failed open must have reported an error. */
#include <stdlib.h>

#include "frontend/checkpoint_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ks_buf log = {0};
    ks_diag d = {.quiet = 1, .log = &log};
    cJSON *config = NULL;
    kf_checkpoint *c = kf_checkpoint_open_llama2c_memory(&d, "fuzz.bin", data, size, &config);
    if (c) {
        KS_ASSERT(config != NULL && d.errors == 0);
        for (size_t i = 0; i < kf_checkpoint_count(c); i++) {
            const kf_tensor *t = kf_checkpoint_at(c, i);
            KS_ASSERT(t->data >= data && t->data + t->nbytes <= data + size);
            float *out = malloc(t->nbytes ? t->nbytes : 1); /* f32: as many floats as bytes / 4 */
            KS_ASSERT(out);
            KS_ASSERT(kf_tensor_read_f32(&d, t, 0, 0, -1, out) == 0);
            if (t->ndim == 2) KS_ASSERT(kf_tensor_read_f32(&d, t, 1, 0, -1, out) == 0);
            free(out);
        }
        cJSON_Delete(config);
        kf_checkpoint_close(c);
    } else {
        KS_ASSERT(config == NULL && d.errors == 1 && log.len > 0);
    }
    ks_buf_free(&log);
    return 0;
}
