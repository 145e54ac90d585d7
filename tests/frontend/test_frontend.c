/*
 * test_frontend.c — tests of the .kiln frontend.
 *
 *   test_frontend models
 *       Compiles every shipped description (kf_builtin_models) against each
 *       model under $KILN_SHARED/models that it matches, with and without
 *       the checkpoint, and checks the graph: node counts by op, attention
 *       layers in order, the attributes and params the runtime reads, and
 *       that every weight binding names a checkpoint tensor whose shape,
 *       read as bound, is the WEIGHT node's.
 *
 *   test_frontend cases FILE
 *       Runs the cases of FILE (a .test file here): each is a .kiln text,
 *       optionally a config.json and a shared checkpoint, and the exact
 *       messages expected (empty: it must compile). Format:
 *
 *           %% case <name>
 *           %% config              (optional) JSON up to the next %% line
 *           %% generation          (optional) generation_config.json, likewise
 *           %% checkpoint <folder> (optional) a folder under $KILN_SHARED/models
 *           %% kiln                the text, compiled as "t.kiln"
 *           %% expect              the messages, byte for byte (the checkpoint's
 *                                  folder named as in %% checkpoint); it
 *                                  compiles when they hold no error
 *           %% ops                 (optional) the graph's ops in order, by
 *                                  their IR names, when it compiles
 *           %% params              (optional) the graph's param lines as
 *                                  kir_print writes them, when it compiles
 *
 * Blank lines at the end of a section are not part of it.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/frontend.h"
#include "tests/check.h"

static const char *shared_dir(void)
{
    const char *s = getenv("KILN_SHARED");
    return s && *s ? s : KILN_SOURCE_DIR "/../shared";
}

static cJSON *read_json(const char *path)
{
    ks_diag d = {0};
    char *text = ks_read_file(&d, path, NULL);
    if (!text) return NULL;
    cJSON *j = cJSON_Parse(text);
    free(text);
    return j;
}

/* ---- models --------------------------------------------------------------------- */
static int count_op(const kir_graph *g, kir_op op)
{
    int n = 0;
    for (size_t i = 0; i < g->n_nodes; i++) n += g->nodes[i].op == op;
    return n;
}

static int64_t param_int(const kir_graph *g, const char *name)
{
    const kir_param *p = kir_param_find(g, name);
    CHECK_MSG(p && p->kind == KIR_ATTR_INT, "param %s is not an int", name);
    return p && p->kind == KIR_ATTR_INT ? p->i : -12345;
}

static kir_val find_node(const kir_graph *g, kir_op op, int nth)
{
    for (size_t i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == op && nth-- == 0) return (kir_val)i;
    return KIR_NONE;
}

static const kf_weight_binding *binding_named(const kf_model *m, const char *name)
{
    for (size_t i = 0; i < m->n_weights; i++)
        if (strcmp(kir_get_str(m->graph, m->weights[i].node, "name", ""), name) == 0) return &m->weights[i];
    return NULL;
}

/* What every compiled model must satisfy. */
static void check_common(const char *what, const kf_model *m, const kf_checkpoint *ck)
{
    const kir_graph *g = m->graph;
    int64_t layers = param_int(g, "layers");
    CHECK_MSG(count_op(g, KIR_OP_ATTENTION) == layers, "%s: %d attention nodes for %lld layers", what,
              count_op(g, KIR_OP_ATTENTION), (long long)layers);
    for (int l = 0; l < layers; l++) {
        kir_val a = find_node(g, KIR_OP_ATTENTION, l);
        CHECK_MSG(a != KIR_NONE && kir_get_int(g, a, "layer", -1) == l, "%s: attention %d has the wrong layer", what,
                  l);
        CHECK_MSG(kir_get(g, a, "scale") && kir_get(g, a, "window") && kir_get(g, a, "softcap"),
                  "%s: attention %d lacks attributes", what, l);
    }
    CHECK_MSG(count_op(g, KIR_OP_OUTPUT) == 1, "%s: one output", what);
    kir_val out = find_node(g, KIR_OP_OUTPUT, 0);
    if (out != KIR_NONE) {
        const kir_node *o = kir_node_at(g, out);
        CHECK_MSG(strcmp(kir_get_str(g, out, "name", ""), "logits") == 0, "%s: output is named logits", what);
        CHECK_MSG(o->ndim == 2 && o->dims[0] == KIR_DIM_T && o->dims[1] == param_int(g, "vocab"),
                  "%s: logits are [T, vocab]", what);
    }
    param_int(g, "bos_token_id");
    param_int(g, "eos_token_id");
    /* The weights' dtype is the build's (--dtype) and the engine's metadata's, not a param. */
    CHECK_MSG(!kir_param_find(g, "dtype"), "%s: no param dtype", what);
    CHECK_MSG(param_int(g, "max_context") > 0, "%s: max_context", what);
    CHECK_MSG((int)m->n_weights == count_op(g, KIR_OP_WEIGHT), "%s: %zu bindings for %d weights", what, m->n_weights,
          count_op(g, KIR_OP_WEIGHT));
    for (int r = 0; r < count_op(g, KIR_OP_ROPE); r++) {
        kir_val v = find_node(g, KIR_OP_ROPE, r);
        static const char *const keys[] = {"theta", "style", "rot_dim", "scaling", "factor",
                                           "low_freq_factor", "high_freq_factor", "original_max_positions"};
        for (size_t k = 0; k < 8; k++) CHECK_MSG(kir_get(g, v, keys[k]), "%s: rope %d lacks %s", what, r, keys[k]);
    }
    for (size_t i = 0; i < m->n_weights; i++) {
        const kf_weight_binding *b = &m->weights[i];
        const kir_node *n = kir_node_at(g, b->node);
        CHECK_MSG(n->op == KIR_OP_WEIGHT && n->dtype == KIR_F32, "%s: binding %zu is an f32 WEIGHT node", what, i);
        CHECK_MSG(i == 0 || m->weights[i - 1].node < b->node, "%s: bindings in node order", what);
        if (!ck) continue;
        const kf_tensor *t = kf_checkpoint_find(ck, b->tensor);
        CHECK_MSG(t != NULL, "%s: bound tensor %s exists", what, b->tensor);
        if (!t) continue;
        int64_t shape[KIR_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        if (b->transposed && t->ndim >= 2) { /* the last two dims swapped */
            shape[t->ndim - 2] = t->shape[t->ndim - 1];
            shape[t->ndim - 1] = t->shape[t->ndim - 2];
        }
        if (b->row_end >= 0) shape[b->row_dim] = (b->row_end - b->row_start + b->row_step - 1) / b->row_step;
        int same = t->ndim == n->ndim;
        for (int k = 0; same && k < n->ndim; k++) same = shape[k] == n->dims[k];
        CHECK_MSG(same, "%s: %s read as bound has the WEIGHT's shape", what, b->tensor);
    }
}

/* One model's specific expectations. */
typedef struct model_case {
    const char *folder;     /* under $KILN_SHARED/models */
    const char *kiln;       /* the description expected to match it */
    int n_nodes;            /* nodes in the graph compiled with the checkpoint */
    int n_weights;          /* WEIGHT nodes */
    int n_add;              /* ADD nodes: residuals + biases */
} model_case;

static void check_model_specific(const model_case *mc, const kf_model *m)
{
    const kir_graph *g = m->graph;
    const char *f = mc->folder;
    kir_val rope = find_node(g, KIR_OP_ROPE, 0);
    kir_val att = find_node(g, KIR_OP_ATTENTION, 0);
    if (strcmp(f, "tinystories-656k") == 0) {
        /* Tied: only lm_head.weight is stored, and the embedding reads it. */
        const kf_weight_binding *e = binding_named(m, "embed");
        CHECK_MSG(e && strcmp(e->tensor, "lm_head.weight") == 0, "tinystories: embed reads lm_head.weight");
        CHECK_MSG(strcmp(kir_get_str(g, rope, "scaling", ""), "none") == 0, "tinystories: no rope scaling");
        CHECK_MSG(kir_get_float(g, rope, "theta", 0) == 10000.0, "tinystories: theta");
        CHECK_MSG(kir_get_int(g, rope, "rot_dim", 0) == 16, "tinystories: rot_dim is head_dim");
        CHECK_MSG(param_int(g, "bos_token_id") == 1 && param_int(g, "eos_token_id") == 2, "tinystories: bos/eos");
        CHECK_MSG(kir_get_float(g, find_node(g, KIR_OP_RMS_NORM, 0), "eps", 0) == 1e-6, "tinystories: eps");
    } else if (strcmp(f, "llama-gqa-tiny") == 0) {
        CHECK_MSG(strcmp(kir_get_str(g, rope, "scaling", ""), "llama3") == 0, "llama-gqa: llama3 scaling");
        CHECK_MSG(kir_get_float(g, rope, "factor", 0) == 8.0, "llama-gqa: factor");
        CHECK_MSG(kir_get_float(g, rope, "low_freq_factor", 0) == 1.0, "llama-gqa: low_freq_factor");
        CHECK_MSG(kir_get_float(g, rope, "high_freq_factor", 0) == 4.0, "llama-gqa: high_freq_factor");
        CHECK_MSG(kir_get_int(g, rope, "original_max_positions", 0) == 64, "llama-gqa: original_max_positions");
        CHECK_MSG(kir_get_float(g, rope, "theta", 0) == 500000.0, "llama-gqa: theta");
        CHECK_MSG(strcmp(kir_get_str(g, rope, "style", ""), "halves") == 0, "llama-gqa: halves");
        /* head_dim 32 from config: q is [T,8,32], k [T,2,32] */
        kir_val k = kir_node_at(g, att)->in[1];
        CHECK_MSG(kir_node_at(g, k)->dims[1] == 2 && kir_node_at(g, k)->dims[2] == 32, "llama-gqa: k is [T,2,32]");
        CHECK_MSG(fabs(kir_get_float(g, att, "scale", 0) - 1.0 / sqrt(32.0)) < 1e-12, "llama-gqa: scale");
        const kf_weight_binding *lm = binding_named(m, "lm_head");
        CHECK_MSG(lm && strcmp(lm->tensor, "lm_head.weight") == 0, "llama-gqa: untied lm_head");
        CHECK_MSG(param_int(g, "max_context") == 512, "llama-gqa: max_context");
    } else if (strcmp(f, "qwen2-tiny") == 0) {
        const kf_weight_binding *lm = binding_named(m, "lm_head");
        CHECK_MSG(lm && strcmp(lm->tensor, "model.embed_tokens.weight") == 0, "qwen2: tied lm_head");
        const kf_weight_binding *bq = binding_named(m, "bq[1]");
        CHECK_MSG(bq && strcmp(bq->tensor, "model.layers.1.self_attn.q_proj.bias") == 0, "qwen2: bq[1]");
        CHECK_MSG(kir_get_int(g, att, "window", -1) == 0, "qwen2: no sliding window");
        CHECK_MSG(kir_get_float(g, rope, "theta", 0) == 1000000.0, "qwen2: theta");
        CHECK_MSG(param_int(g, "bos_token_id") == -1 && param_int(g, "eos_token_id") == -1, "qwen2: null bos/eos");
    } else if (strcmp(f, "gpt2-tiny") == 0) {
        const kf_weight_binding *wk = binding_named(m, "wk[1]");
        CHECK_MSG(wk && strcmp(wk->tensor, "transformer.h.1.attn.c_attn.weight") == 0 && wk->transposed &&
                  wk->row_start == 128 && wk->row_end == 256,
                  "gpt2: wk[1] is rows 128..256 of c_attn.weight transposed");
        const kf_weight_binding *bv = binding_named(m, "bv[0]");
        CHECK_MSG(bv && !bv->transposed && bv->row_start == 256 && bv->row_end == 384, "gpt2: bv[0] rows 256..384");
        const kf_weight_binding *lm = binding_named(m, "lm_head");
        CHECK_MSG(lm && strcmp(lm->tensor, "transformer.wte.weight") == 0 && !lm->transposed && lm->row_end == -1,
                  "gpt2: lm_head is wte");
        CHECK_MSG(count_op(g, KIR_OP_GELU_TANH) == 2 && count_op(g, KIR_OP_LAYER_NORM) == 5, "gpt2: gelu_new, 5 norms");
        CHECK_MSG(count_op(g, KIR_OP_EMBED) == 2 && count_op(g, KIR_OP_INPUT) == 2, "gpt2: learned positions");
        CHECK_MSG(count_op(g, KIR_OP_ROPE) == 0, "gpt2: no rope");
        CHECK_MSG(param_int(g, "bos_token_id") == 499 && param_int(g, "max_context") == 256, "gpt2: bos, n_positions");
    } else if (strcmp(f, "stories260k") == 0) {
        CHECK_MSG(strcmp(kir_get_str(g, rope, "style", ""), "pairs") == 0, "stories260k: pairs");
        CHECK_MSG(param_int(g, "max_context") == 512, "stories260k: seq_len");
    }
    CHECK_MSG((int)g->n_nodes == mc->n_nodes, "%s: %zu nodes, expected %d", f, g->n_nodes, mc->n_nodes);
    CHECK_MSG(count_op(g, KIR_OP_WEIGHT) == mc->n_weights, "%s: %d weights, expected %d", f, count_op(g, KIR_OP_WEIGHT),
              mc->n_weights);
    CHECK_MSG(count_op(g, KIR_OP_ADD) == mc->n_add, "%s: %d adds, expected %d", f, count_op(g, KIR_OP_ADD), mc->n_add);
}

static const kf_builtin_model *builtin_for(const char *model_type)
{
    const kf_builtin_model *found = NULL;
    for (size_t i = 0; i < kf_builtin_model_count; i++) {
        if (!kf_kiln_matches(kf_builtin_models[i].text, model_type)) continue;
        CHECK_MSG(!found, "model_type %s matched by %s and %s", model_type, found ? found->file : "",
                  kf_builtin_models[i].file);
        found = &kf_builtin_models[i];
    }
    return found;
}

static void test_model(const model_case *mc)
{
    char *dir = ks_path_join(shared_dir(), "models");
    char *folder = ks_path_join(dir, mc->folder);
    free(dir);
    ks_buf log = {0};
    ks_diag d = {.log = &log};
    kf_checkpoint *ck = NULL;
    cJSON *config = NULL;
    if (strcmp(mc->folder, "stories260k") == 0) {
        char *bin = ks_path_join(folder, "stories260K.bin");
        ck = kf_checkpoint_open_llama2c(&d, bin, &config);
        free(bin);
    } else {
        char *cfg = ks_path_join(folder, "config.json");
        config = read_json(cfg);
        free(cfg);
        ck = kf_checkpoint_open(&d, folder);
    }
    CHECK_MSG(config && ck, "%s: config and checkpoint open: %s", mc->folder, ks_buf_cstr(&log));
    if (!config || !ck) goto done;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(config, "model_type");
    const kf_builtin_model *bm = builtin_for(cJSON_IsString(mt) ? mt->valuestring : "");
    CHECK_MSG(bm && strcmp(bm->file, mc->kiln) == 0, "%s is matched by %s", mc->folder, mc->kiln);
    if (!bm) goto done;
    ks_source src = {bm->file, bm->text, strlen(bm->text)};
    /* Without the checkpoint: every weight as declared. */
    kf_json_doc doc = {config, {"config.json", NULL, 0}};
    kf_model *m0 = kf_compile(&src, &doc, NULL, NULL, NULL, &d);
    CHECK_MSG(m0 != NULL, "%s without checkpoint: %s", mc->folder, ks_buf_cstr(&log));
    if (m0) check_common(mc->folder, m0, NULL);
    /* With it. */
    kf_model *m = kf_compile(&src, &doc, NULL, ck, NULL, &d);
    CHECK_MSG(m != NULL, "%s with checkpoint: %s", mc->folder, ks_buf_cstr(&log));
    if (m) {
        check_common(mc->folder, m, ck);
        check_model_specific(mc, m);
        if (m0) CHECK_MSG(m0->graph->n_nodes == m->graph->n_nodes, "%s: same graph without the checkpoint", mc->folder);
    }
    CHECK_MSG(d.errors == 0 && d.warnings == 0, "%s: no errors or warnings: %s", mc->folder, ks_buf_cstr(&log));
    printf("%-18s %-20s %4zu nodes, %3d weights, %2d adds\n", mc->folder, bm->file, m ? m->graph->n_nodes : 0,
           m ? count_op(m->graph, KIR_OP_WEIGHT) : 0, m ? count_op(m->graph, KIR_OP_ADD) : 0);
    kf_model_free(m0);
    kf_model_free(m);
done:
    kf_checkpoint_close(ck);
    cJSON_Delete(config);
    free(folder);
    ks_buf_free(&log);
}

static int run_models(void)
{
    /* Per layer a Llama has 9 weights (q, k, v, o, gate, up, down, 2 norms)
     * and 20 compute nodes: 2 norms, 7 matmuls, 4 reshapes (q, k, v, and
     * attention's result), 2 ropes, attention, 2 residual adds, silu, mul.
     * Around the layers: the 2 inputs, embed, final norm, head matmul and
     * output, and 3 weights (embedding, final norm, head). */
    static const model_case cases[] = {
        {"tinystories-656k", "models/llama.kiln", 6 + 3 + 2 * (9 + 20), 3 + 2 * 9, 2 * 2},
        {"llama-gqa-tiny", "models/llama.kiln", 6 + 3 + 3 * (9 + 20), 3 + 3 * 9, 3 * 2},
        /* Qwen2: the q, k, v biases add a weight and an add each per layer. */
        {"qwen2-tiny", "models/qwen2.kiln", 6 + 3 + 2 * (12 + 23), 3 + 2 * 12, 2 * 5},
        /* GPT-2 per layer: 16 weights (ln_1 and ln_2 weight and bias; q, k,
         * v, c_proj, c_fc, mlp c_proj weight and bias) and 22 compute nodes:
         * 2 norms, 6 matmuls, 6 bias adds, 2 residual adds, 4 reshapes,
         * attention, gelu_tanh. Around the layers: 2 inputs, 2 embeds and
         * their add, final norm, head matmul, output; 5 weights (wte, wpe,
         * lm_head, ln_f weight and bias). */
        {"gpt2-tiny", "models/gpt2.kiln", 8 + 5 + 2 * (16 + 22), 5 + 2 * 16, 1 + 2 * 8},
        {"stories260k", "models/llama2c.kiln", 6 + 3 + 5 * (9 + 20), 3 + 5 * 9, 5 * 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) test_model(&cases[i]);

    /* Every shipped description names what it matches, and nothing else.
     * One embedded file is models/default.json, the default model's config. */
    CHECK_MSG(kf_builtin_model_count == 24, "%zu builtin models", kf_builtin_model_count);
    /* those whose goldens are tests/data's (tests/data/make_goldens.py) */
    static const char *const own[][2] = {{"gemma", "models/gemma.kiln"}, {"gemma2", "models/gemma2.kiln"},
                                         {"gemma3_text", "models/gemma3_text.kiln"}, {"qwen3", "models/qwen3.kiln"},
                                         {"olmo", "models/olmo.kiln"}, {"olmo2", "models/olmo2.kiln"},
                                         {"granite", "models/granite.kiln"}, {"nemotron", "models/nemotron.kiln"},
                                         {"phi", "models/phi.kiln"}, {"cohere", "models/cohere.kiln"},
                                         {"phi3", "models/phi3.kiln"}, {"stablelm", "models/stablelm.kiln"},
                                         {"gpt_neox", "models/gpt_neox.kiln"}, {"bloom", "models/bloom.kiln"},
                                         {"mixtral", "models/mixtral.kiln"}, {"qwen3_moe", "models/qwen3_moe.kiln"},
                                         {"qwen2_moe", "models/qwen2_moe.kiln"}, {"gpt_oss", "models/gpt_oss.kiln"},
                                         {"deepseek_v3", "models/deepseek_v3.kiln"}};
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) {
        const kf_builtin_model *b = builtin_for(own[i][0]);
        CHECK_MSG(b && strcmp(b->file, own[i][1]) == 0, "%s is matched by %s", own[i][0], own[i][1]);
    }
    const kf_builtin_model *llama = builtin_for("mistral");
    CHECK_MSG(llama && strcmp(llama->file, "models/llama.kiln") == 0, "mistral is a llama");
    CHECK_MSG(builtin_for("bert") == NULL, "nothing matches bert");
    CHECK_MSG(!kf_kiln_matches("model x; # matches \"bert\";\nmatches \"a\", \"b\";", "bert"), "comments do not match");
    CHECK_MSG(kf_kiln_matches("model x; matches \"a\", \"b\";", "b"), "second string matches");
    CHECK_MSG(!kf_kiln_matches("model x; param matches_ = \"b\";", "b"), "only matches lines");
    return check_finish("frontend models");
}

/* ---- cases ------------------------------------------------------------------------ */
typedef struct test_case {
    char *name;       /* from the %% case line */
    ks_buf config;    /* JSON text; empty: no config */
    ks_buf generation; /* generation_config.json's text; empty: none */
    char *checkpoint; /* folder under models, or NULL */
    ks_buf kiln;      /* the description */
    ks_buf expect;    /* the messages */
    ks_buf ops;       /* expected op names, whitespace-separated; empty: not checked */
    ks_buf params;    /* expected param lines; empty: not checked */
    int line;         /* line of %% case in FILE */
} test_case;

/* Blank lines that end a section separate it from the next case. */
static void trim_blank_end(ks_buf *b)
{
    while (b->len >= 2 && b->data[b->len - 1] == '\n' && b->data[b->len - 2] == '\n') b->data[--b->len] = 0;
    if (b->len == 1 && b->data[0] == '\n') b->data[--b->len] = 0;
}

static void run_case(test_case *tc, const char *file)
{
    trim_blank_end(&tc->expect);
    trim_blank_end(&tc->kiln);
    ks_buf log = {0};
    ks_diag d = {.log = &log, .quiet = 1};
    cJSON *config = NULL, *generation = NULL;
    if (tc->config.len) {
        config = cJSON_Parse(ks_buf_cstr(&tc->config));
        if (!check_at(config != NULL, file, tc->line, "case %s: bad JSON in %%%% config", tc->name)) return;
    }
    if (tc->generation.len) {
        generation = cJSON_Parse(ks_buf_cstr(&tc->generation));
        if (!check_at(generation != NULL, file, tc->line, "case %s: bad JSON in %%%% generation", tc->name)) {
            cJSON_Delete(config);
            return;
        }
    }
    kf_checkpoint *ck = NULL;
    char *models_dir = ks_path_join(shared_dir(), "models/");
    if (tc->checkpoint) {
        char *path = ks_path_join(models_dir, tc->checkpoint);
        ck = kf_checkpoint_open(&d, path);
        free(path);
        if (!check_at(ck != NULL, file, tc->line, "case %s: cannot open checkpoint: %s", tc->name,
                      ks_buf_cstr(&log))) {
            cJSON_Delete(config);
            cJSON_Delete(generation);
            ks_buf_free(&log);
            free(models_dir);
            return;
        }
    }
    ks_source src = {"t.kiln", ks_buf_cstr(&tc->kiln), tc->kiln.len};
    kf_json_doc doc = {config, {"config.json", config ? tc->config.data : NULL, tc->config.len}};
    kf_json_doc gen = {generation, {"generation_config.json", generation ? tc->generation.data : NULL,
                                    tc->generation.len}};
    kf_model *m = kf_compile(&src, &doc, &gen, ck, NULL, &d);
    /* Messages name the checkpoint by its folder under models/, wherever the shared data is. */
    ks_buf shown = {0};
    const char *text = ks_buf_cstr(&log);
    for (const char *at; (at = strstr(text, models_dir)) != NULL; text = at + strlen(models_dir))
        ks_buf_put(&shown, text, (size_t)(at - text));
    ks_buf_puts(&shown, text);
    free(models_dir);
    const char *got = ks_buf_cstr(&shown), *want = ks_buf_cstr(&tc->expect);
    int ok = strcmp(got, want) == 0 && (m != NULL) == (d.errors == 0);
    check_at(ok, file, tc->line, "case '%s' failed (%s)\n--- expected\n%s--- got\n%s---", tc->name,
             m ? "compiled" : "did not compile", want, got);
    if (ok && m && tc->ops.len) {
        /* Compare the op sequence, normalizing the expected whitespace. */
        ks_buf want_ops = {0}, got_ops = {0};
        for (char *w = strtok(tc->ops.data, " \t\n"); w; w = strtok(NULL, " \t\n"))
            ks_buf_printf(&want_ops, "%s%s", want_ops.len ? " " : "", w);
        for (size_t i = 0; i < m->graph->n_nodes; i++)
            ks_buf_printf(&got_ops, "%s%s", i ? " " : "", kir_op_table[m->graph->nodes[i].op].name);
        check_at(strcmp(ks_buf_cstr(&want_ops), ks_buf_cstr(&got_ops)) == 0, file, tc->line,
                 "case '%s': ops differ\n--- expected\n%s\n--- got\n%s\n---", tc->name, ks_buf_cstr(&want_ops),
                 ks_buf_cstr(&got_ops));
        ks_buf_free(&want_ops);
        ks_buf_free(&got_ops);
    }
    if (ok && m && tc->params.len) {
        ks_buf printed = {0}, got_params = {0};
        kir_print(m->graph, &printed);
        for (char *line = printed.data; line && *line;) {
            char *nl = strchr(line, '\n');
            size_t len = nl ? (size_t)(nl - line + 1) : strlen(line);
            if (strncmp(line, "param ", 6) == 0) ks_buf_put(&got_params, line, len);
            line += len;
        }
        trim_blank_end(&tc->params);
        check_at(strcmp(ks_buf_cstr(&got_params), ks_buf_cstr(&tc->params)) == 0, file, tc->line,
                 "case '%s': params differ\n--- expected\n%s--- got\n%s---", tc->name, ks_buf_cstr(&tc->params),
                 ks_buf_cstr(&got_params));
        ks_buf_free(&printed);
        ks_buf_free(&got_params);
    }
    kf_model_free(m);
    kf_checkpoint_close(ck);
    cJSON_Delete(config);
    cJSON_Delete(generation);
    ks_buf_free(&log);
    ks_buf_free(&shown);
}

static int run_cases(const char *file)
{
    ks_diag d = {0};
    char *text = ks_read_file(&d, file, NULL);
    if (!text) return 1;
    test_case tc = {0};
    ks_buf *section = NULL;
    int n = 0, line = 0;
    /* Split into lines by hand: strtok would drop the empty ones. */
    for (char *p = text; p && *p; line++) {
        char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        if (len >= 2 && p[0] == '%' && p[1] == '%') {
            char *arg = ks_xmalloc(len + 1);
            memcpy(arg, p, len);
            arg[len] = 0;
            if (strncmp(arg, "%% case ", 8) == 0) {
                if (tc.name) {
                    run_case(&tc, file);
                    n++;
                }
                free(tc.name);
                free(tc.checkpoint);
                ks_buf_free(&tc.config);
                ks_buf_free(&tc.generation);
                ks_buf_free(&tc.kiln);
                ks_buf_free(&tc.expect);
                ks_buf_free(&tc.ops);
                ks_buf_free(&tc.params);
                memset(&tc, 0, sizeof tc);
                tc.name = ks_xstrdup(arg + 8);
                tc.line = line + 1;
                section = NULL;
            } else if (strcmp(arg, "%% config") == 0) {
                section = &tc.config;
            } else if (strcmp(arg, "%% generation") == 0) {
                section = &tc.generation;
            } else if (strcmp(arg, "%% params") == 0) {
                section = &tc.params;
            } else if (strncmp(arg, "%% checkpoint ", 14) == 0) {
                tc.checkpoint = ks_xstrdup(arg + 14);
                section = NULL;
            } else if (strcmp(arg, "%% kiln") == 0) {
                section = &tc.kiln;
            } else if (strcmp(arg, "%% expect") == 0) {
                section = &tc.expect;
            } else if (strcmp(arg, "%% ops") == 0) {
                section = &tc.ops;
            } else {
                check_at(0, file, line + 1, "unknown line: %s", arg);
            }
            free(arg);
        } else if (section) {
            ks_buf_put(section, p, len);
            ks_buf_put(section, "\n", 1);
        }
        p = nl ? nl + 1 : NULL;
    }
    if (tc.name) {
        run_case(&tc, file);
        n++;
    }
    free(tc.name);
    free(tc.checkpoint);
    ks_buf_free(&tc.config);
    ks_buf_free(&tc.generation);
    ks_buf_free(&tc.kiln);
    ks_buf_free(&tc.expect);
    ks_buf_free(&tc.ops);
    ks_buf_free(&tc.params);
    free(text);
    printf("%d cases\n", n);
    return check_finish(file);
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "models") == 0) return run_models();
    if (argc == 3 && strcmp(argv[1], "cases") == 0) return run_cases(argv[2]);
    fprintf(stderr, "usage: %s models | cases FILE\n", argv[0]);
    return 2;
}
