/* driver.c — from the user's inputs to a compiled model and an engine file. */
#include "compiler/driver.h"

#include <stdlib.h>
#include <string.h>

#include "compiler/targets.h"
#include "runtime/engine.h"
#include "compiler/synthetic.h"
#include "compiler/version.h"
#include "frontend/quantized.h"
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
    ks_error(d, m->config.path, "model_type '%s' matches no shipped model description (%s); write a .kiln "
             "for it and pass it as the input, with --weights", model_type, ks_buf_cstr(&known));
    ks_buf_free(&known);
    return -1;
}

/* Read and parse a JSON object (config.json), keeping its text: messages
 * about its values point into it. */
static int load_json(kd_json *j, const char *path, ks_diag *d)
{
    j->path = ks_xstrdup(path);
    j->text = ks_read_file(d, path, &j->len);
    if (!j->text) return -1;
    const char *end = NULL;
    j->json = cJSON_ParseWithLengthOpts(j->text, j->len, &end, 0);
    if (!j->json || !cJSON_IsObject(j->json)) {
        /* place the error: where cJSON stopped, or the value that is not an object */
        int line = 1, col = 1;
        const char *stop = j->json ? j->text + strspn(j->text, " \t\r\n") : end ? end : cJSON_GetErrorPtr();
        for (const char *p = j->text; stop && p < stop && *p; p++) {
            if (*p == '\n') line++, col = 1;
            else col++;
        }
        ks_source src = {path, j->text, j->len};
        ks_error_at(d, &src, line, col, "%s", j->json ? "expected a JSON object" : "invalid JSON");
        return -1;
    }
    return 0;
}

static void free_json(kd_json *j)
{
    cJSON_Delete(j->json);
    free(j->path);
    free(j->text);
    memset(j, 0, sizeof *j);
}

/* generation_config.json beside config.json (Hugging Face keeps the ids
 * generation stops at there), when there is one. */
static int load_generation(kd_model *m, ks_diag *d)
{
    const char *slash = strrchr(m->config.path, '/');
    char *dir = slash ? ks_xstrdup(m->config.path) : ks_xstrdup(".");
    if (slash) dir[slash - m->config.path + (slash == m->config.path)] = 0;
    char *path = ks_path_join(dir, "generation_config.json");
    free(dir);
    int rc = ks_file_exists(path) ? load_json(&m->generation, path, d) : 0;
    free(path);
    return rc;
}

/* A llama2.c checkpoint (.bin): its header is the config. */
static int load_llama2c(kd_model *m, const char *path, ks_diag *d)
{
    m->ckpt = kf_checkpoint_open_llama2c(d, path, &m->config.json);
    if (!m->ckpt) return -1;
    m->config.path = ks_xstrdup(path);
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

/* config.json as the frontend reads it: the parsed document, and its text for carets. */
static kf_json_doc config_doc(const kd_model *m)
{
    return (kf_json_doc){m->config.json, {m->config.path ? m->config.path : "config.json", m->config.text, m->config.len}};
}

/* kf_compile, then the weight dtype asked for. */
static int compile_model(const kd_inputs *in, kd_model *m, ks_diag *d)
{
    if (in->dtype && kd_parse_dtype(in->dtype, &m->weight_dtype, d) != 0) return -1;
    m->weight_dtype_given = in->dtype != NULL;
    kf_json_doc config = config_doc(m);
    kf_json_doc generation = {m->generation.json, {m->generation.path ? m->generation.path : "generation_config.json",
                                                    m->generation.text, m->generation.len}};
    /* a .kiln input without a config: say how to give one */
    ks_buf hint = {0};
    if (in->weights && ks_is_dir(in->weights))
        ks_buf_printf(&hint, "%s has no config.json: pass --config FILE", in->weights);
    else
        ks_buf_puts(&hint, "pass --config FILE or --weights CHECKPOINT_DIR");
    m->model = kf_compile(&m->kiln, &config, &generation, m->ckpt, ks_buf_cstr(&hint), d);
    ks_buf_free(&hint);
    if (!m->model) return -1;
    if (m->weight_dtype_given) kd_set_weight_dtype(m->model->graph, m->weight_dtype);
    return 0;
}

int kd_model_load(const kd_inputs *in, int need_weights, kd_model *m, ks_diag *d)
{
    memset(m, 0, sizeof *m);
    m->qcache = kd_quant_cache_new();
    m->smooth = kd_smooth_new();
    if (in->synthetic) {
        /* weights come from kd_synthetic_weight, so no checkpoint */
        for (size_t i = 0; i < kf_builtin_model_count && !m->config.json; i++) {
            if (strcmp(kf_builtin_models[i].file, KD_SYNTHETIC_CONFIG) != 0) continue;
            m->config.text = ks_xstrdup(kf_builtin_models[i].text);
            m->config.len = strlen(m->config.text);
            m->config.json = cJSON_Parse(m->config.text);
        }
        KS_ASSERT(m->config.json);
        m->config.path = ks_xstrdup(KD_SYNTHETIC_CONFIG);
        const cJSON *mt = cJSON_GetObjectItemCaseSensitive(m->config.json, "model_type");
        KS_ASSERT(cJSON_IsString(mt));
        if (pick_builtin(m, mt->valuestring, d)) return -1;
        return compile_model(in, m, d);
    }
    const char *weights = in->weights;
    int input_is_kiln = ends_with(in->input, ".kiln");
    if (!input_is_kiln && ends_with(in->input, ".bin") && ks_file_exists(in->input)) {
        if (load_llama2c(m, in->input, d)) return -1;
        return compile_model(in, m, d);
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
        if (load_json(&m->config, in->config, d)) return -1;
    } else if (weights) {
        char *p = ks_is_dir(weights) ? ks_path_join(weights, "config.json") : NULL;
        if (p && ks_file_exists(p)) {
            int rc = load_json(&m->config, p, d);
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
    const kf_json_doc config = config_doc(m);
    if (m->config.json && kf_quantization_check(&config, d) != 0) return -1;
    if (m->config.json && load_generation(m, d) != 0) return -1;
    if (input_is_kiln) {
        size_t len = 0;
        m->kiln_owned = ks_read_file(d, in->input, &len);
        if (!m->kiln_owned) return -1;
        m->kiln.name = in->input;
        m->kiln.text = m->kiln_owned;
        m->kiln.len = len;
    } else {
        const cJSON *mt = cJSON_GetObjectItemCaseSensitive(m->config.json, "model_type");
        if (!cJSON_IsString(mt)) {
            ks_error(d, m->config.path, "no \"model_type\" string to pick a model description by");
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
        /* stored quantized (config.json's quantization_config): the packed layers decoded */
        if (m->config.json && kf_checkpoint_dequantize(m->ckpt, &config, d) != 0) return -1;
    }
    return compile_model(in, m, d);
}

void kd_model_free(kd_model *m)
{
    kir_graph_free(m->optimized);
    kd_calib_free(m->calib);
    kd_quant_cache_free(m->qcache);
    kd_smooth_free(m->smooth);
    kf_model_free(m->model);
    kf_checkpoint_close(m->ckpt);
    free_json(&m->config);
    free_json(&m->generation);
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
    KS_ASSERT(nbytes == kir_dtype_bytes(n->dtype, (uint64_t)kir_elems(n, 1)));
    int rc = kd_weight_data(f->m, f->g, node, dst, d);
    /* the checkpoint's pages of this weight: out of the build's memory (streamed, tensor by tensor) */
    kf_checkpoint_release(f->m->ckpt);
    return rc;
}

/* Bytes [at, at + nbytes) of a weight the checkpoint stores as it is (kd_weight_part), its pages
 * given back after each part; 1 for one that comes only whole. */
static int fill_weight_part(void *ctx, kir_val node, size_t at, void *dst, size_t nbytes, ks_diag *d)
{
    fill_ctx *f = ctx;
    if (kir_dtype_bits(kir_node_at(f->g, node)->dtype) < 8) return 1; /* packed codes: whole (kd_weight_data) */
    size_t es = kir_dtype_size(kir_node_at(f->g, node)->dtype);
    KS_ASSERT(at % es == 0 && nbytes % es == 0);
    int rc = kd_weight_part(f->m, f->g, node, at / es, nbytes / es, dst, d);
    if (rc == 0) kf_checkpoint_release(f->m->ckpt);
    return rc;
}

/* A tokenizer must not make ids the model has no row for: the first id at
 * or past the vocabulary (kir_token_ids) is an error, with its text. */
static int check_tokenizer_ids(const krt_tok *t, const char *path, const kir_graph *g, ks_diag *d)
{
    int64_t vocab = kir_token_ids(g);
    int32_t n = krt_tok_vocab_size(t);
    if (vocab < 0 || n <= vocab) return 0;
    for (int64_t id = vocab; id < n; id++) {
        size_t len = 0;
        const char *piece = krt_tok_piece(t, (int32_t)id, &len);
        if (!piece) continue;
        ks_buf shown = {0}; /* the piece, control bytes and backslashes escaped */
        for (size_t i = 0; i < len && i < 64; i++) {
            unsigned char c = (unsigned char)piece[i];
            if (c == '\\') ks_buf_puts(&shown, "\\\\");
            else if (c < 0x20 || c == 0x7f) ks_buf_printf(&shown, "\\x%02x", c);
            else ks_buf_put(&shown, &piece[i], 1);
        }
        ks_error(d, path,
                 "token '%s' has id %lld, but the model's vocabulary has %lld ids (the rows of its embedding table); "
                 "the tokenizer holds %d ids: is it the model's own?",
                 ks_buf_cstr(&shown), (long long)id, (long long)vocab, n);
        ks_buf_free(&shown);
        return -1;
    }
    return 0;
}

/* The tokenizer to pack: --tokenizer, else tokenizer.json beside the
 * weights. Loaded once here so that a broken tokenizer, or one whose ids
 * the model (graph g) cannot take, fails the build, not a later run.
 * *bytes is NULL when there is none. */
/* The tokenizer file of a build (--tokenizer, or tokenizer.json beside the weights), or NULL. */
static char *tokenizer_path(const kd_inputs *in)
{
    if (in->tokenizer) return ks_xstrdup(in->tokenizer);
    if (!in->input) return NULL;
    const char *dir = ks_is_dir(in->input) ? in->input : in->weights && ks_is_dir(in->weights) ? in->weights : NULL;
    char *path = dir ? ks_path_join(dir, "tokenizer.json") : NULL;
    if (path && !ks_file_exists(path)) {
        free(path);
        path = NULL;
    }
    return path;
}

krt_tok *kd_load_tokenizer(const kd_inputs *in, ks_diag *d)
{
    if (in->synthetic && !in->tokenizer) {
        size_t len = 0;
        char *bytes = kd_synthetic_tokenizer(&len);
        krt_tok *t = krt_tok_load_memory(d, "the default model's tokenizer", bytes, len, KRT_TOK_LLAMA2C_BIN);
        free(bytes);
        return t;
    }
    char *path = tokenizer_path(in);
    krt_tok *t = path ? krt_tok_load_file(d, path, KRT_TOK_AUTO) : NULL;
    free(path);
    return t;
}

static int read_tokenizer(const kd_inputs *in, const kir_graph *g, char **bytes, size_t *len, uint32_t *kind,
                          ks_diag *d)
{
    *bytes = NULL;
    *len = 0;
    if (in->synthetic && !in->tokenizer) {
        *bytes = kd_synthetic_tokenizer(len);
        *kind = KRT_TOK_LLAMA2C_BIN;
        return 0;
    }
    char *path = tokenizer_path(in);
    if (!path) return 0;
    *bytes = ks_read_file(d, path, len);
    int rc = -1;
    if (*bytes) {
        krt_tok *t = krt_tok_load_memory(d, path, *bytes, *len, KRT_TOK_AUTO);
        if (t) {
            *kind = (uint32_t)krt_tok_kind_of(t);
            rc = check_tokenizer_ids(t, path, g, d);
            krt_tok_free(t);
        }
    }
    if (rc) {
        free(*bytes);
        *bytes = NULL;
    }
    free(path);
    return rc;
}

/* A target's slow step (NVRTC takes seconds per architecture): its line shows at once. */
static void on_target_step(void *ctx, const char *what)
{
    kd_progress *p = ctx;
    kd_progress_step(p, what);
    kd_progress_show(p);
}

/* krt_engine_write's hook: the weights written so far. */
static void on_weights(void *ctx, uint64_t done, uint64_t total)
{
    kd_progress_bytes(ctx, (double)done, (double)total);
}

/* A special token of tokenizer_config.json ("<s>", or {"content": "<s>", ...}) as text; "" when absent. */
static const char *special_text(const cJSON *cfg, const char *key)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(t)) t = cJSON_GetObjectItemCaseSensitive(t, "content");
    return cJSON_IsString(t) ? t->valuestring : "";
}

/* The chat template beside the weights (tokenizer_config.json's "chat_template": a string, or a list of
 * {"name", "template"} whose "default" is taken) with the BOS and EOS texts it renders, as the engine's
 * "chat_template" section: {"template": ..., "bos_token": ..., "eos_token": ...} (kiln serve's
 * /v1/chat/completions). *json NULL when there is none; -1 after reporting a tokenizer_config.json that
 * is not JSON. */
static int read_chat_template(const kd_inputs *in, char **json, ks_diag *d)
{
    *json = NULL;
    if (!in->input || in->synthetic) return 0;
    const char *dir = ks_is_dir(in->input) ? in->input : in->weights && ks_is_dir(in->weights) ? in->weights : NULL;
    char *path = dir ? ks_path_join(dir, "tokenizer_config.json") : NULL;
    if (!path || !ks_file_exists(path)) {
        free(path);
        return 0;
    }
    size_t len = 0;
    char *text = ks_read_file(d, path, &len);
    cJSON *cfg = text ? cJSON_ParseWithLength(text, len) : NULL;
    int rc = 0;
    if (text && !cfg) {
        ks_error(d, path, "not JSON (reading its chat_template)");
        rc = -1;
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    if (cJSON_IsArray(t)) { /* named templates: the default one */
        const cJSON *pick = NULL;
        for (const cJSON *e = t->child; e; e = e->next)
            if (cJSON_IsString(cJSON_GetObjectItemCaseSensitive(e, "name")) &&
                strcmp(cJSON_GetObjectItemCaseSensitive(e, "name")->valuestring, "default") == 0)
                pick = cJSON_GetObjectItemCaseSensitive(e, "template");
        t = pick;
    }
    if (cJSON_IsString(t)) {
        cJSON *sec = cJSON_CreateObject();
        cJSON_AddStringToObject(sec, "template", t->valuestring);
        cJSON_AddStringToObject(sec, "bos_token", special_text(cfg, "bos_token"));
        cJSON_AddStringToObject(sec, "eos_token", special_text(cfg, "eos_token"));
        char *out = cJSON_PrintUnformatted(sec);
        cJSON_Delete(sec);
        *json = out ? ks_xstrdup(out) : NULL;
        cJSON_free(out);
    }
    cJSON_Delete(cfg);
    free(text);
    free(path);
    return rc;
}

int kd_write_engine(const kd_inputs *in, kd_model *m, const char *out_path, kd_build_info *info, ks_diag *d)
{
    const char *target_spec = in->target ? in->target : "cpu";
    const kd_target *target = kd_target_for(target_spec, d);
    if (!target) return -1;
    if (in->emit_source && !target->emits_source) {
        ks_error(d, "kiln", "--emit-source needs a target that generates source (--target sm_XX)");
        return -1;
    }
    /* the output first: a path that cannot be written fails before the slow
     * steps, and the temp file is there to remove if a signal comes during them */
    ks_outfile out;
    if (krt_engine_open_output(out_path, &out, d) != 0) return -1;
    kd_target_parts parts = {0};
    kd_target_opts topts = {.emit_dir = in->emit_source,
                            .on_step = on_target_step,
                            .on_step_ctx = in->progress,
                            .stats_out = in->stats ? (in->stats_out ? in->stats_out : stdout) : NULL};
    char *tok = NULL, *chat = NULL;
    size_t tok_len = 0;
    uint32_t tok_kind = 0;
    if (kd_check_f16_range(m, kd_graph(m), d) != 0 ||
        (target->build && target->build(kd_graph(m), target_spec, &topts, &parts, d) != 0) ||
        read_tokenizer(in, kd_graph(m), &tok, &tok_len, &tok_kind, d) != 0 || read_chat_template(in, &chat, d) != 0) {
        ks_outfile_abort(&out);
        kd_target_parts_free(&parts);
        free(tok);
        return -1;
    }
    /* the target's sections, then the chat template's */
    krt_engine_section *sections = ks_xcalloc(parts.n_sections + 1, sizeof *sections);
    if (parts.n_sections) memcpy(sections, parts.sections, parts.n_sections * sizeof *sections);
    size_t n_sections = parts.n_sections;
    if (chat) sections[n_sections++] = (krt_engine_section){KRT_CHAT_TEMPLATE_SECTION, chat, strlen(chat)};
    const kir_graph *g = kd_graph(m);
    fill_ctx f = {m, g};
    cJSON *meta = cJSON_CreateObject();
    cJSON_AddStringToObject(meta, "format", "kiln-engine");
    cJSON_AddStringToObject(meta, "kiln_version", KD_VERSION);
    cJSON_AddStringToObject(meta, "target", target->name);
    if (parts.meta_key) {
        cJSON *list = cJSON_AddArrayToObject(meta, parts.meta_key);
        for (int i = 0; i < parts.n_meta_list; i++) cJSON_AddItemToArray(list, cJSON_CreateString(parts.meta_list[i]));
    }
    const char *dtype = kd_weights_dtype(g);
    cJSON_AddStringToObject(meta, "dtype", dtype);
    cJSON_AddStringToObject(meta, "model", g->name);
    cJSON_AddStringToObject(meta, "description", m->kiln.name);
    if (in->synthetic) cJSON_AddStringToObject(meta, "weights", "synthetic (the embedded default model)");
    char *meta_text = cJSON_Print(meta);
    cJSON_Delete(meta);
    krt_engine_spec spec = {
        .graph = g,
        .meta_json = meta_text,
        .fill = fill_weight,
        .fill_part = fill_weight_part,
        .fill_ctx = &f,
        .tokenizer = tok,
        .tokenizer_len = tok_len,
        .tokenizer_kind = tok_kind,
        .extra = sections,
        .n_extra = n_sections,
        .progress = on_weights,
        .progress_ctx = in->progress,
    };
    kd_progress_step(in->progress, "writing weights");
    uint64_t bytes = 0;
    int rc = krt_engine_write_to(&out, &spec, &bytes, d);
    kd_progress_done(in->progress);
    if (rc == 0 && info) {
        info->bytes = bytes;
        info->target = target_spec;
        info->dtype = dtype;
        info->layers = 0;
        for (size_t v = 0; v < g->n_nodes; v++) info->layers += g->nodes[v].op == KIR_OP_ATTENTION;
    }
    kd_target_parts_free(&parts);
    free(sections);
    free(chat);
    free(tok);
    cJSON_free(meta_text);
    return rc;
}
