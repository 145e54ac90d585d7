/* cmd_inspect.c — `kiln inspect`: what an engine file holds. */
#include <stdio.h>
#include <stdlib.h>

#include "cli/commands.h"
#include "runtime/engine.h"

static const char inspect_help[] =
    "usage: kiln inspect ENGINE\n"
    "\n"
    "Check an engine file (a checksum of every byte, the graph and its memory\n"
    "plan, the weight index) and say what it holds: format version, target,\n"
    "model parameters, ops, memory plan, weights and the KV-cache layout it\n"
    "needs. What it calls verified is what it checked; it runs nothing.\n";

int kc_cmd_inspect(int argc, char **argv)
{
    kc_option opts[] = {{NULL, 0, NULL, NULL}};
    const char *pos[1];
    int npos = 0;
    int rc = kc_parse_args(argc, argv, opts, pos, 1, &npos, inspect_help);
    if (rc) return rc < 0 ? 2 : 0;
    if (npos != 1) {
        fprintf(stderr, "kiln inspect: error: needs an engine file (see 'kiln inspect --help')\n");
        return 2;
    }
    ks_diag d = {0};
    krt_engine *e = krt_engine_open(pos[0], &d);
    if (!e) return 1;
    const kir_graph *g = e->graph;
    printf("engine:      %s\n", pos[0]);
    printf("format:      kiln engine version %u, %zu bytes, checksum %016llx (verified over every byte)\n",
           e->version, e->map.size, (unsigned long long)e->checksum);
    printf("metadata:    %s\n", e->meta_json);
    printf("model:       %s\n", g->name);
    printf("params:\n");
    for (size_t i = 0; i < g->n_params; i++) {
        const kir_param *p = &g->params[i];
        if (p->kind == KIR_ATTR_INT) {
            printf("  %-24s %lld\n", p->name, (long long)p->i);
        } else if (p->kind == KIR_ATTR_FLOAT) {
            printf("  %-24s %g\n", p->name, p->f);
        } else if (p->kind == KIR_ATTR_INTS) {
            printf("  %-24s [", p->name);
            for (uint32_t k = 0; k < p->ints.n; k++) printf("%s%lld", k ? ", " : "", (long long)p->ints.v[k]);
            printf("]\n");
        } else if (p->kind == KIR_ATTR_FLOATS) {
            printf("  %-24s [", p->name);
            for (uint32_t k = 0; k < p->floats.n; k++) printf("%s%g", k ? ", " : "", p->floats.v[k]);
            printf("]\n");
        } else {
            printf("  %-24s \"%s\"\n", p->name, p->s);
        }
    }
    size_t counts[KIR_OP_COUNT] = {0};
    for (size_t v = 0; v < g->n_nodes; v++) counts[g->nodes[v].op]++;
    printf("graph:       %zu nodes:", g->n_nodes);
    for (int op = 0; op < KIR_OP_COUNT; op++)
        if (counts[op]) printf(" %s %zu", kir_op_table[op].name, counts[op]);
    printf("\n");
    /* krt_engine_open verified the graph, and with it the plan it carries (read once, into desc) */
    const krt_desc *desc = &e->desc;
    if (desc->plan.planned)
        printf("memory plan: arena %llu bytes for steps of up to %lld tokens (verified: every value inside it, no "
               "two live values in the same bytes)\n",
               (unsigned long long)desc->plan.mem.arena_bytes, (long long)desc->plan.max_tokens);
    else
        printf("memory plan: none (each value gets its own place)\n");
    printf("weights:     %zu tensors, %llu bytes\n", e->n_weights, (unsigned long long)e->weight_bytes);
    size_t per_pos = 0;
    for (int i = 0; i < desc->n_kv_layers; i++)
        per_pos += (size_t)desc->kv_layers[i].kv_heads *
                   (size_t)(desc->kv_layers[i].head_dim_k + desc->kv_layers[i].head_dim_v);
    printf("kv cache:    %d layers, %zu elements per position", desc->n_kv_layers, per_pos);
    if (desc->n_kv_layers) printf(" (%d kv heads x %d)", desc->kv_layers[0].kv_heads, desc->kv_layers[0].head_dim_k);
    printf("\n");
    printf("vocabulary:  %lld logits per token, token ids below %lld\n", (long long)desc->vocab,
           (long long)desc->n_token_ids);
    printf("context:     %d positions\n", desc->max_context);
    printf("tokens:      BOS %d, EOS", desc->bos);
    for (int i = 0; i < desc->n_eos; i++) printf("%s%d", i ? ", " : " ", desc->eos[i]);
    if (!desc->n_eos) printf(" none");
    printf("\n");
    printf("weights as:  %s\n", desc->mixed_weights ? "mixed dtypes" : kir_dtype_name(desc->weight_dtype));
    printf("tokenizer:   %s\n", e->tokenizer ? "embedded" : "none");
    krt_engine_close(e);
    return 0;
}
