/*
 * fuzz_kiln.c — the .kiln frontend under fuzzing: the bytes are a model
 * description, compiled against a small fixed config.json (with the keys
 * every shipped description reads, so that mutations of them go deep), a
 * generation_config.json and no checkpoint; kf_kiln_matches reads them
 * too. The frontend must report, never crash or leak (the sanitizers' to
 * catch), and what it returns must hold its promises: a graph that
 * verifies, one binding per WEIGHT node in node order (but derived ones: a norm's offset:).
 */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/frontend.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Small dims keep each compile fast; the keys are those of models/ *.kiln. */
static const char config_text[] =
    "{\"model_type\": \"llama\", \"hidden_size\": 16, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"intermediate_size\": 24, \"vocab_size\": 32, \"rms_norm_eps\": 1e-05,"
    " \"max_position_embeddings\": 64, \"bos_token_id\": 1, \"eos_token_id\": [2, 3], \"hidden_act\": \"silu\","
    " \"attention_bias\": true, \"mlp_bias\": false, \"sliding_window\": 8, \"tie_word_embeddings\": true,"
    " \"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": 500000.0, \"factor\": 8.0,"
    " \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 16},"
    " \"use_sliding_window\": true, \"max_window_layers\": 1, \"layer_types\": [\"full_attention\", "
    "\"sliding_attention\"],"
    " \"n_embd\": 16, \"n_layer\": 2, \"n_head\": 4, \"n_positions\": 64, \"n_inner\": null,"
    " \"layer_norm_epsilon\": 1e-05, \"activation_function\": \"gelu_new\", \"scale_attn_weights\": true,"
    " \"scale_attn_by_inverse_layer_idx\": true,"
    " \"dim\": 16, \"hidden_dim\": 24, \"n_layers\": 2, \"n_heads\": 4, \"n_kv_heads\": 2, \"seq_len\": 64}";

/* generation_config.json, read by `generation.` paths. */
static const char generation_text[] = "{\"bos_token_id\": 1, \"eos_token_id\": [2, 3], \"pad\": [1, \"x\"]}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = ks_xmalloc(size + 1);
    if (size) memcpy(text, data, size);
    text[size] = 0;

    cJSON *config = cJSON_Parse(config_text);
    if (!config) abort();
    ks_diag d = {.quiet = 1};
    ks_source src = {"fuzz.kiln", text, size};
    cJSON *generation = cJSON_Parse(generation_text);
    if (!generation) abort();
    kf_json_doc doc = {config, {"config.json", config_text, sizeof config_text - 1}};
    kf_json_doc gen = {generation, {"generation_config.json", generation_text, sizeof generation_text - 1}};
    kf_model *m = kf_compile(&src, &doc, &gen, NULL, NULL, &d);
    if (m) {
        if (d.errors != 0) abort(); /* a model comes back only without errors */
        size_t n_weight_nodes = 0;
        for (size_t i = 0; i < m->graph->n_nodes; i++)
            n_weight_nodes += m->graph->nodes[i].op == KIR_OP_WEIGHT && !kir_attr_has(m->graph, (kir_val)i, KIR_A_WEIGHT_DERIVE);
        if (n_weight_nodes != m->n_weights) abort();
        for (size_t i = 0; i < m->n_weights; i++) {
            if (kir_node_at(m->graph, m->weights[i].node)->op != KIR_OP_WEIGHT) abort();
            if (i > 0 && m->weights[i - 1].node >= m->weights[i].node) abort();
        }
        ks_diag v = {.quiet = 1};
        if (kir_verify(m->graph, &v, "fuzz.kiln") != 0) abort();
    } else if (d.errors == 0) {
        abort(); /* a failure is always reported */
    }
    kf_model_free(m);
    cJSON_Delete(config);
    cJSON_Delete(generation);

    /* The matches scan stops at NUL: it reads C strings. */
    kf_kiln_matches(text, "llama");
    free(text);
    return 0;
}
