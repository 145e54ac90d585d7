/* fuzz_cuda_meta.c — bytes as a CUDA engine's cuda.meta section
 * (runtime/cuda/cuda_meta.h). A parse either fails with exactly one error, or
 * succeeds and then writes text that parses again and writes back to the
 * same text. A crash, leak or sanitizer report is the bug. */
#include <string.h>

#include "runtime/cuda/cuda_meta.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ks_buf log = {0}, once = {0}, twice = {0};
    ks_diag d = {.quiet = 1, .log = &log};
    krt_cuda_meta m, again;
    if (krt_cuda_meta_parse((const char *)data, size, "fuzz.engine", &m, &d) == 0) {
        KS_ASSERT(d.errors == 0);
        for (int i = 0; i < m.n_kernels; i++)
            for (int g = 0; g < 3; g++) KS_ASSERT(krt_cuda_grid_dim(&m.kernels[i], g, 7, krt_cuda_large(&m.kernels[i], 7, 1)) >= 0);
        krt_cuda_meta_write(&m, &once);
        KS_ASSERT(krt_cuda_meta_parse(once.data, once.len, "fuzz.engine", &again, &d) == 0);
        krt_cuda_meta_write(&again, &twice);
        KS_ASSERT(once.len == twice.len && memcmp(once.data, twice.data, once.len) == 0);
        krt_cuda_meta_free(&again);
        krt_cuda_meta_free(&m);
    } else {
        KS_ASSERT(d.errors == 1 && log.len > 0);
    }
    ks_buf_free(&log);
    ks_buf_free(&once);
    ks_buf_free(&twice);
    return 0;
}
