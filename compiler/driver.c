/* driver.c — from the user's inputs to a compiled model and an engine file. */
#include "compiler/driver.h"

#include <stdlib.h>
#include <string.h>

#include "codegen/cuda/kcu.h"
#include "runtime/engine.h"
#include "compiler/synthetic.h"
#include "compiler/version.h"
#include "runtime/text/tokenizer.h"

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Pick the builtin description whose `matches` names model_type. */
static int pick_builtin(kd_model *m, const char *model_type, ks_diag *d)
{
    for (size_t i = 0; i < kf_builtin_model_count; i++) {
        if (kf_kiln_matches(kf_builtin_models[i].text, model_type)) {
            m->kiln.name = kf_builtin_models[i].file;
            m->kiln.text = kf_builtin_models[i].text;
            m->kiln.len = strlen(kf_builtin_models[i].text);
            return 0;
        }
    }
    ks_buf known = {0};
    for (size_t i = 0; i < kf_builtin_model_count; i++)
        if (strstr(kf_builtin_models[i].file, ".kiln"))
            ks_buf_printf(&known, "%s%s", known.len ? ", " : "", kf_builtin_models[i].file);
    ks_error(d, m->config_path, "model_type '%s' matches no shipped model description (%s); write a .kiln "
             "for it and pass it as the input, with --weights", model_type, ks_buf_cstr(&known));
    ks_buf_free(&known);
    return -1;
}

static int load_config(kd_model *m, const char *path, ks_diag *d)
{
    m->config_path = ks_xstrdup(path);
    size_t len = 0;
    char *text = ks_read_file(d, path, &len);
    if (!text) return -1;
    const char *end = NULL;
    m->config = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!m->config || !cJSON_IsObject(m->config)) {
        /* place the error: line and column of where cJSON stopped */
        int line = 1, col = 1;
        const char *stop = end ? end : cJSON_GetErrorPtr();
        for (const char *p = text; stop && p < stop && *p; p++) {
            if (*p == '\n') line++, col = 1;
            else col++;
        }
        ks_source src = {path, text, len};
        ks_error_at(d, &src, line, col, "%s", m->config ? "config must be a JSON object" : "invalid JSON");
        free(text);
        return -1;
    }
    free(text);
    return 0;
}

/* A checkpoint stored quantized (config.json's quantization_config, as
 * AWQ, GPTQ and compressed-tensors write it) is a clear error: kiln reads
 * float checkpoints only so far. */
static int reject_quantized(const kd_model *m, ks_diag *d)
{
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(m->config, "quantization_config");
    if (!q) return 0;
    const cJSON *method = cJSON_IsObject(q) ? cJSON_GetObjectItemCaseSensitive(q, "quant_method") : NULL;
    ks_error(d, m->config_path,
             "quantization_config (quant_method \"%s\"): kiln does not read quantized checkpoints yet; "
             "use the model's float16, bfloat16 or float32 checkpoint",
             cJSON_IsString(method) ? method->valuestring : "?");
    return -1;
}

/* A llama2.c checkpoint (.bin): its header is the config. */
static int load_llama2c(kd_model *m, const char *path, ks_diag *d)
{
    m->ckpt = kf_checkpoint_open_llama2c(d, path, &m->config);
    if (!m->ckpt) return -1;
    m->config_path = ks_xstrdup(path);
    return pick_builtin(m, "llama2c", d);
}

int kd_parse_dtype(const char *name, kir_dtype *out, ks_diag *d)
{
    static const kir_dtype known[] = {KIR_F32, KIR_BF16, KIR_F16};
    for (size_t i = 0; i < sizeof known / sizeof *known; i++) {
        if (strcmp(name, kir_dtype_name(known[i])) == 0) {
            *out = known[i];
            return 0;
        }
    }
    ks_error(d, "kiln", "--dtype %s: unknown weight dtype (known: f32, bf16, f16)", name);
    return -1;
}

void kd_set_weight_dtype(kir_graph *g, kir_dtype t)
{
    for (size_t v = 0; v < g->n_nodes; v++)
        if (g->nodes[v].op == KIR_OP_WEIGHT) g->nodes[v].dtype = t;
}

const char *kd_weights_dtype(const kir_graph *g)
{
    int seen = 0;
    kir_dtype t = KIR_F32;
    for (size_t v = 0; v < g->n_nodes; v++) {
        if (g->nodes[v].op != KIR_OP_WEIGHT) continue;
        if (seen && g->nodes[v].dtype != t) return "mixed";
        t = g->nodes[v].dtype;
        seen = 1;
    }
    return kir_dtype_name(t);
}

/* kf_compile, then the weight dtype asked for. */
static int compile_model(const kd_inputs *in, kd_model *m, const char *config_name, ks_diag *d)
{
    kir_dtype t = KIR_F32;
    if (in->dtype && kd_parse_dtype(in->dtype, &t, d) != 0) return -1;
    /* a .kiln input without a config: say how to give one */
    ks_buf hint = {0};
    if (in->weights && ks_is_dir(in->weights))
        ks_buf_printf(&hint, "%s has no config.json: pass --config FILE", in->weights);
    else
        ks_buf_puts(&hint, "pass --config FILE or --weights CHECKPOINT_DIR");
    m->model = kf_compile(&m->kiln, m->config, config_name, m->ckpt, ks_buf_cstr(&hint), d);
    ks_buf_free(&hint);
    if (!m->model) return -1;
    if (in->dtype) kd_set_weight_dtype(m->model->graph, t);
    return 0;
}

int kd_model_load(const kd_inputs *in, int need_weights, kd_model *m, ks_diag *d)
{
    memset(m, 0, sizeof *m);
    if (in->synthetic) {
        /* weights come from kd_synthetic_weight, so no checkpoint */
        for (size_t i = 0; i < kf_builtin_model_count && !m->config; i++)
            if (strcmp(kf_builtin_models[i].file, KD_SYNTHETIC_CONFIG) == 0) m->config = cJSON_Parse(kf_builtin_models[i].text);
        KS_ASSERT(m->config);
        m->config_path = ks_xstrdup(KD_SYNTHETIC_CONFIG);
        const cJSON *mt = cJSON_GetObjectItemCaseSensitive(m->config, "model_type");
        KS_ASSERT(cJSON_IsString(mt));
        if (pick_builtin(m, mt->valuestring, d)) return -1;
        return compile_model(in, m, m->config_path, d);
    }
    const char *weights = in->weights;
    int input_is_kiln = ends_with(in->input, ".kiln");
    if (!input_is_kiln && ends_with(in->input, ".bin") && ks_file_exists(in->input)) {
        if (load_llama2c(m, in->input, d)) return -1;
        return compile_model(in, m, m->config_path, d);
    }
    if (!input_is_kiln) {
        if (!ks_is_dir(in->input)) {
            ks_error(d, in->input, "not a .kiln file or a checkpoint folder");
            return -1;
        }
        weights = in->input;
    }
    /* config.json: given, or beside the weights */
    if (in->config) {
        if (load_config(m, in->config, d)) return -1;
    } else if (weights) {
        char *p = ks_is_dir(weights) ? ks_path_join(weights, "config.json") : NULL;
        if (p && ks_file_exists(p)) {
            int rc = load_config(m, p, d);
            free(p);
            if (rc) return -1;
        } else if (!input_is_kiln) {
            ks_error(d, weights, "no config.json in the checkpoint folder");
            free(p);
            return -1;
        } else {
            free(p);
        }
    }
    if (m->config && reject_quantized(m, d) != 0) return -1;
    if (input_is_kiln) {
        size_t len = 0;
        m->kiln_owned = ks_read_file(d, in->input, &len);
        if (!m->kiln_owned) return -1;
        m->kiln.name = in->input;
        m->kiln.text = m->kiln_owned;
        m->kiln.len = len;
    } else {
        const cJSON *mt = cJSON_GetObjectItemCaseSensitive(m->config, "model_type");
        if (!cJSON_IsString(mt)) {
            ks_error(d, m->config_path, "no \"model_type\" string to pick a model description by");
            return -1;
        }
        if (pick_builtin(m, mt->valuestring, d)) return -1;
    }
    if (need_weights) {
        if (!weights) {
            ks_error(d, in->input, "no weights: pass --weights CHECKPOINT");
            return -1;
        }
        m->ckpt = kf_checkpoint_open(d, weights);
        if (!m->ckpt) return -1;
    }
    return compile_model(in, m, m->config_path ? m->config_path : "config.json", d);
}

void kd_model_free(kd_model *m)
{
    kir_graph_free(m->optimized);
    kf_model_free(m->model);
    kf_checkpoint_close(m->ckpt);
    cJSON_Delete(m->config);
    free(m->config_path);
    free(m->kiln_owned);
    memset(m, 0, sizeof *m);
}

typedef struct fill_ctx {
    kd_model *m;        /* the model */
    const kir_graph *g; /* the graph being written */
} fill_ctx;

static int fill_weight(void *ctx, kir_val node, void *dst, size_t nbytes, ks_diag *d)
{
    fill_ctx *f = ctx;
    const kir_node *n = kir_node_at(f->g, node);
    KS_ASSERT(nbytes == (size_t)kir_elems(n, 1) * kir_dtype_size(n->dtype));
    return kd_weight_data(f->m, f->g, node, dst, d);
}

/* The tokenizer to pack: --tokenizer, else tokenizer.json beside the
 * weights. Loaded once here so that a broken tokenizer fails the build, not
 * a later run. *bytes is NULL when there is none. */
static int read_tokenizer(const kd_inputs *in, char **bytes, size_t *len, uint32_t *kind, ks_diag *d)
{
    *bytes = NULL;
    *len = 0;
    char *path = NULL;
    if (in->synthetic && !in->tokenizer) {
        *bytes = kd_synthetic_tokenizer(len);
        *kind = KRT_TOK_LLAMA2C_BIN;
        return 0;
    }
    if (in->tokenizer) {
        path = ks_xstrdup(in->tokenizer);
    } else if (!in->input) {
        return 0;
    } else {
        const char *dir = ks_is_dir(in->input) ? in->input : in->weights && ks_is_dir(in->weights) ? in->weights : NULL;
        if (dir) path = ks_path_join(dir, "tokenizer.json");
        if (!path || !ks_file_exists(path)) {
            free(path);
            return 0;
        }
    }
    *bytes = ks_read_file(d, path, len);
    int rc = -1;
    if (*bytes) {
        krt_tok *t = krt_tok_load_memory(d, path, *bytes, *len, KRT_TOK_AUTO);
        if (t) {
            *kind = (uint32_t)krt_tok_kind_of(t);
            krt_tok_free(t);
            rc = 0;
        }
    }
    if (rc) {
        free(*bytes);
        *bytes = NULL;
    }
    free(path);
    return rc;
}

/* kcu_build's hook: NVRTC takes seconds per architecture, so its line shows at once. */
static void on_arch(void *ctx, const char *arch, int index, int count)
{
    kd_progress *p = ctx;
    char step[64];
    snprintf(step, sizeof step, "compiling CUDA kernels for %s (%d of %d)", arch, index + 1, count);
    kd_progress_step(p, step);
    kd_progress_show(p);
}

/* krt_engine_write's hook: the weights written so far. */
static void on_weights(void *ctx, uint64_t done, uint64_t total)
{
    kd_progress_update(ctx, total ? (double)done / (double)total : -1);
}

int kd_write_engine(const kd_inputs *in, kd_model *m, const char *out_path, kd_build_info *info, ks_diag *d)
{
    const char *target = in->target ? in->target : "cpu";
    int cuda = kcu_is_target(target);
    if (strcmp(target, "cpu") != 0 && !cuda) {
        ks_error(d, "kiln", "unknown target '%s' (known: cpu, or NVIDIA GPU architectures such as sm_90 or sm_80,sm_90)",
                 target);
        return -1;
    }
    if (in->emit_source && !cuda) {
        ks_error(d, "kiln", "--emit-source needs a CUDA target (--target sm_XX)");
        return -1;
    }
    /* the output first: a path that cannot be written fails before the slow
     * steps, and the temp file is there to remove if a signal comes during them */
    ks_outfile out;
    if (krt_engine_open_output(out_path, &out, d) != 0) return -1;
    kcu_parts parts = {0};
    char *tok = NULL;
    size_t tok_len = 0;
    uint32_t tok_kind = 0;
    if (kd_check_f16_range(m, kd_graph(m), d) != 0 ||
        (cuda && kcu_build(kd_graph(m), target, in->emit_source, on_arch, in->progress, &parts, d) != 0) ||
        read_tokenizer(in, &tok, &tok_len, &tok_kind, d) != 0) {
        ks_outfile_abort(&out);
        kcu_parts_free(&parts);
        return -1;
    }
    const kir_graph *g = kd_graph(m);
    fill_ctx f = {m, g};
    cJSON *meta = cJSON_CreateObject();
    cJSON_AddStringToObject(meta, "format", "kiln-engine");
    cJSON_AddStringToObject(meta, "kiln_version", KD_VERSION);
    cJSON_AddStringToObject(meta, "target", cuda ? "cuda" : target);
    if (cuda) {
        cJSON *archs = cJSON_AddArrayToObject(meta, "cuda_archs");
        for (int i = 0; i < parts.n_archs; i++) cJSON_AddItemToArray(archs, cJSON_CreateString(parts.archs[i]));
    }
    cJSON_AddStringToObject(meta, "dtype", kd_weights_dtype(g));
    cJSON_AddStringToObject(meta, "model", g->name);
    cJSON_AddStringToObject(meta, "description", m->kiln.name);
    if (in->synthetic) cJSON_AddStringToObject(meta, "weights", "synthetic (the embedded default model)");
    char *meta_text = cJSON_Print(meta);
    cJSON_Delete(meta);
    krt_engine_spec spec = {
        .graph = g,
        .meta_json = meta_text,
        .fill = fill_weight,
        .fill_ctx = &f,
        .tokenizer = tok,
        .tokenizer_len = tok_len,
        .tokenizer_kind = tok_kind,
        .extra = parts.sections,
        .n_extra = parts.n_sections,
        .progress = on_weights,
        .progress_ctx = in->progress,
    };
    kd_progress_step(in->progress, "writing weights");
    uint64_t bytes = 0;
    int rc = krt_engine_write_to(&out, &spec, &bytes, d);
    kd_progress_done(in->progress);
    if (rc == 0 && info) {
        info->bytes = bytes;
        info->target = target;
        info->dtype = kd_weights_dtype(g);
        info->layers = 0;
        for (size_t v = 0; v < g->n_nodes; v++) info->layers += g->nodes[v].op == KIR_OP_ATTENTION;
    }
    kcu_parts_free(&parts);
    free(tok);
    cJSON_free(meta_text);
    return rc;
}
