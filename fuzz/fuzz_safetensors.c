/* fuzz_safetensors.c — bytes as one safetensors file, parsed from memory
 * (kf_checkpoint_open_memory), then every float tensor read as f32 whole,
 * transposed when 2-D, and as its second half of rows (an I32 one must
 * refuse); then the checkpoint's packed layers decoded as AWQ's, GPTQ's
 * and FP8's (kf_checkpoint_dequantize), each an error or a success. A
 * failed open must have reported an error; a crash, leak or sanitizer
 * report is the bug. */
#include <stdlib.h>
#include <string.h>

#include "frontend/checkpoint_internal.h"
#include "frontend/quantized.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void read_all(ks_diag *d, const kf_tensor *t)
{
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    /* n * dtype size == nbytes <= size: the reader checked it. */
    if (t->dtype != KIR_F32 && t->dtype != KIR_F16 && t->dtype != KIR_BF16) { /* quantized codes: no floats */
        KS_ASSERT(kf_tensor_read_f32(d, t, 0, 0, -1, NULL) != 0);
        d->errors = 0;
        return;
    }
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
        static const char *const configs[] = {
            "{\"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 2}}",
            "{\"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 2}}",
            "{\"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 8, \"group_size\": -1, "
            "\"checkpoint_format\": \"gptq_v2\"}}",
            "{\"quantization_config\": {\"quant_method\": \"compressed-tensors\", \"format\": \"float-quantized\", "
            "\"config_groups\": {\"g\": {\"weights\": {\"num_bits\": 8, \"type\": \"float\", \"symmetric\": true, "
            "\"strategy\": \"channel\"}}}}}",
            "{\"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": [2, 2]}}",
        };
        for (size_t k = 0; k < sizeof configs / sizeof *configs; k++) {
            cJSON *json = cJSON_Parse(configs[k]);
            KS_ASSERT(json);
            kf_json_doc doc = {json, {"config.json", configs[k], strlen(configs[k])}};
            c = kf_checkpoint_open_memory(&d, "fuzz.safetensors", data, size);
            KS_ASSERT(c);
            d.errors = 0;
            if (kf_checkpoint_dequantize(c, &doc, &d) != 0) KS_ASSERT(d.errors == 1);
            d.errors = 0;
            kf_checkpoint_close(c);
            cJSON_Delete(json);
        }
    } else {
        KS_ASSERT(d.errors == 1 && log.len > 0);
    }
    ks_buf_free(&log);
    return 0;
}
