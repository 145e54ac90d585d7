/* backend_interp.c — the reference interpreter behind the backend table. */
#include "runtime/backend.h"
#include "runtime/interp/interp.h"

#include <string.h>

static void *interp_create(const krt_engine *e, krt_kv *kv, ks_diag *d)
{
    return krt_interp_new(&e->desc, e->weights, kv, d);
}

static void interp_destroy(void *state) { krt_interp_free(state); }

static int interp_step(void *state, const krt_step *step, float *out, ks_diag *d)
{
    return krt_interp_step(state, step, out, d);
}

static int interp_set_tap(void *state, krt_tap_fn tap, void *ctx, ks_diag *d)
{
    krt_interp_set_tap(state, tap, ctx);
    return 0;
}

/* The interpreter's cache holds f32 elements whatever the engine's kv_dtype:
 * a half cache's rows are f32 values rounded to it as they are written. */
static size_t interp_kv_elem_size(const krt_desc *desc)
{
    (void)desc;
    return sizeof(float);
}

const krt_backend krt_backend_interp = {
    .name = "interp",
    .kv_storage = &krt_kv_host_storage,
    .kv_elem_size = interp_kv_elem_size,
    .create = interp_create,
    .destroy = interp_destroy,
    .step = interp_step,
    .set_tap = interp_set_tap,
};

const krt_backend *krt_backend_for(const krt_engine *e, ks_diag *d)
{
    ks_buf scratch = KS_BUF_TRY;
    const char *target = krt_engine_meta(e, "target", "cpu", &scratch);
    const krt_backend *be = NULL;
    if (!target && scratch.failed)
        ks_error_oom(d, e->path, scratch.failed, "the engine's target");
    else if (!target) /* cJSON could not parse it: its memory ran out, as it was checksummed at open */
        ks_error(d, e->path, "cannot read its metadata (out of memory, or not JSON)");
    else if (strcmp(target, "cpu") == 0 || strcmp(target, "interp") == 0)
        be = &krt_backend_interp;
    else if (strcmp(target, "cuda") == 0)
        be = &krt_backend_cuda;
    else
        ks_error(d, e->path, "engine target '%s' has no backend in this runtime", target);
    ks_buf_free(&scratch);
    return be;
}
