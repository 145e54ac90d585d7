/* cmd_verify.c — `kiln verify`: the fused engine against the unfused one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "compiler/driver.h"
#include "compiler/verify.h"
#include "codegen/cuda/kcu.h"

static const char verify_help[] =
    "usage: kiln verify <model.kiln | checkpoint-folder | llama2c.bin> [--weights PATH] [--config FILE]\n"
    "                   [--passes LIST] [--target cpu|sm_XX,...] [--tolerance X] [--tokens N] [--steps N]\n"
    "                   [--seed S] [--dtype f32|bf16|f16]\n"
    "\n"
    "Build the model twice from the same weights, with no passes and with the\n"
    "passes (all, or LIST), run the same steps through both (two sequences'\n"
    "prompts mixed in one step, then decode steps), and compare every value\n"
    "the two graphs share as it is computed, layer by layer, and the logits\n"
    "(max |d|, relative error, KL divergence of the next-token distributions).\n"
    "Reports the first value that diverges past the tolerance with its place\n"
    "in the .kiln text; exits 1 then. With a CUDA target the fused build is a\n"
    "CUDA engine (written to a temporary folder) run on the GPU through the\n"
    "CUDA backend, which copies every value back for the comparison; the\n"
    "unfused reference stays the interpreter.\n"
    "\n"
    "  --passes LIST     passes of the fused build (default: all)\n"
    "  --target T        where the fused build runs: cpu (default), or CUDA architectures\n"
    "                    (sm_90, sm_80,sm_90: the engine holds each, the GPU runs its own)\n"
    "  --tolerance X     max|d| / max|reference| allowed per value (default 1e-4)\n"
    "  --tokens N        prompt tokens of the first sequence (default 24)\n"
    "  --steps N         decode steps after the prompt (default 4)\n"
    "  --seed S          seed of the prompts' token ids (default 1)\n"
    "  --dtype DTYPE     the weights of both builds, as kiln build takes (f32, bf16, f16)\n";

/* The f32 data of every WEIGHT node of g (caller frees with free_weights). */
static float **graph_weights(const kd_model *m, const kir_graph *g, ks_diag *d)
{
    float **w = ks_xcalloc(g->n_nodes ? g->n_nodes : 1, sizeof *w);
    for (size_t v = 0; v < g->n_nodes && !d->errors; v++) {
        if (g->nodes[v].op != KIR_OP_WEIGHT) continue;
        w[v] = ks_xmalloc(sizeof(float) * (size_t)kir_elems(&g->nodes[v], 1));
        kd_weight_data(m, g, (kir_val)v, w[v], d);
    }
    return w;
}

static void free_weights(float **w, size_t n)
{
    if (!w) return;
    for (size_t v = 0; v < n; v++) free(w[v]);
    free(w);
}

/* The fused build as a CUDA engine in a temporary folder, run through the CUDA backend. */
static void verify_on_cuda(const kd_inputs *in, kd_model *m, const kir_graph *ref, const void *const *wr,
                           const kd_verify_opts *o, kd_verify_result *r, ks_diag *d)
{
    const char *tmp = getenv("TMPDIR");
    char *dir = ks_path_join(tmp && *tmp ? tmp : "/tmp", "kiln-verify.XXXXXX");
    if (!mkdtemp(dir)) {
        ks_error(d, dir, "cannot create a temporary folder for the engine");
        free(dir);
        return;
    }
    char *path = ks_path_join(dir, "fused.engine");
    if (kd_write_engine(in, m, path, NULL, d) == 0) {
        krt_engine *e = krt_engine_open(path, d);
        if (e) {
            printf("kiln verify: %s, %s passes against none; the fused engine (%s) on the CUDA backend\n",
                   m->kiln.name, in->passes ? in->passes : "all", in->target);
            kd_verify_engine(ref, wr, e, o, r, d);
            krt_engine_close(e);
        }
    }
    unlink(path);
    rmdir(dir);
    free(path);
    free(dir);
}

int kc_cmd_verify(int argc, char **argv)
{
    kd_inputs in = {0};
    const char *tol = NULL, *tokens = NULL, *steps = NULL, *seed = NULL;
    kc_option opts[] = {
        {"--weights", 1, &in.weights, NULL},  {"--config", 1, &in.config, NULL}, {"--passes", 1, &in.passes, NULL},
        {"--target", 1, &in.target, NULL},    {"--tolerance", 1, &tol, NULL},    {"--tokens", 1, &tokens, NULL},
        {"--steps", 1, &steps, NULL},         {"--seed", 1, &seed, NULL},        {"--dtype", 1, &in.dtype, NULL},
        {NULL, 0, NULL, NULL},
    };
    const char *pos[1];
    int npos = 0;
    int rc = kc_parse_args(argc, argv, opts, pos, 1, &npos, verify_help);
    if (rc) return rc < 0 ? 2 : 0;
    if (npos != 1) {
        fprintf(stderr, "kiln verify: error: needs a model (see 'kiln verify --help')\n");
        return 2;
    }
    in.input = pos[0];
    kd_verify_opts o = {.tolerance = 1e-4, .prompt_tokens = 24, .decode_steps = 4, .seed = 1, .out = stdout};
    int64_t k;
    if (tol && kc_parse_number("verify", "--tolerance", tol, 0, 1e9, &o.tolerance)) return 2;
    if (tokens) {
        if (kc_parse_int("verify", "--tokens", tokens, 1, 1 << 20, &k)) return 2;
        o.prompt_tokens = (int)k;
    }
    if (steps) {
        if (kc_parse_int("verify", "--steps", steps, 0, 1 << 20, &k)) return 2;
        o.decode_steps = (int)k;
    }
    if (seed && kc_parse_u64("verify", "--seed", seed, &o.seed)) return 2;
    int cuda = in.target && kcu_is_target(in.target);
    if (in.target && strcmp(in.target, "cpu") != 0 && !cuda) {
        fprintf(stderr, "kiln verify: error: target '%s': verify runs on cpu or CUDA architectures (sm_90, ...)\n",
                in.target);
        return 2;
    }
    ks_diag d = {0};
    if (kd_verify_check_target(in.target, &d) != 0) return 1;
    kd_model m;
    float **wr = NULL, **wt = NULL;
    kd_verify_result r = {0};
    if (kd_model_load(&in, 1, &m, &d) == 0 && kd_optimize(&in, &m, &d) == 0) {
        const kir_graph *ref = m.model->graph, *test = kd_graph(&m);
        wr = graph_weights(&m, ref, &d);
        if (cuda) {
            if (!d.errors) verify_on_cuda(&in, &m, ref, (const void *const *)wr, &o, &r, &d);
        } else {
            wt = d.errors ? NULL : graph_weights(&m, test, &d);
            if (!d.errors) {
                printf("kiln verify: %s, %s passes against none\n", m.kiln.name, in.passes ? in.passes : "all");
                kd_verify_graphs(ref, (const void *const *)wr, test, (const void *const *)wt, &o, &r, &d);
            }
            free_weights(wt, test->n_nodes);
        }
        free_weights(wr, ref->n_nodes);
    }
    kd_model_free(&m);
    if (d.errors) return 1;
    return r.diverged ? 1 : 0;
}
