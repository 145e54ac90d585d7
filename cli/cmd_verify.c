/* cmd_verify.c — `kiln verify`: the fused engine against the unfused one. */
#include <stdio.h>

#include "cli/commands.h"
#include "compiler/driver.h"
#include "compiler/verify.h"

static const char verify_help[] =
    "usage: kiln verify <model.kiln | checkpoint-folder | llama2c.bin> [--weights PATH] [--config FILE]\n"
    "                   [--passes LIST] [--target cpu|sm_XX,...] [--tolerance X] [--tokens N] [--steps N]\n"
    "                   [--seed S] [--dtype f32|bf16|f16] [--precision exact|fast]\n"
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
    "  --tolerance X     max|d| / max|reference| allowed per value (default 1e-4; with\n"
    "                    --precision fast 16 roundings of the half dtype: 0.0625 for bf16,\n"
    "                    0.0078 for f16, since the unfused reference rounds every value\n"
    "                    it computes, the fused build only what its kernels store)\n"
    "  --tokens N        prompt tokens of the first sequence (default 24)\n"
    "  --steps N         decode steps after the prompt (default 4)\n"
    "  --seed S          seed of the prompts' token ids (default 1)\n"
    "  --dtype DTYPE     the weights of both builds, as kiln build takes (f32, bf16, f16)\n"
    "  --precision P     both builds' precision, as kiln build takes (exact, fast): fast\n"
    "                    lowers the reference too, every value it computes in the half dtype\n";

int kc_cmd_verify(int argc, char **argv)
{
    kd_inputs in = {0};
    const char *tol = NULL, *tokens = NULL, *steps = NULL, *seed = NULL;
    kc_option opts[] = {
        {"--weights", 1, &in.weights, NULL},  {"--config", 1, &in.config, NULL}, {"--passes", 1, &in.passes, NULL},
        {"--target", 1, &in.target, NULL},    {"--tolerance", 1, &tol, NULL},    {"--tokens", 1, &tokens, NULL},
        {"--steps", 1, &steps, NULL},         {"--seed", 1, &seed, NULL},        {"--dtype", 1, &in.dtype, NULL},
        {"--precision", 1, &in.precision, NULL}, {NULL, 0, NULL, NULL},
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
    kd_verify_opts o = {.tolerance = -1, .prompt_tokens = 24, .decode_steps = 4, .seed = 1, .out = stdout};
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
    ks_diag d = {0};
    if (kd_verify_check_target(in.target, &d) != 0) return 1;
    kd_model m;
    kd_verify_result r = {0};
    if (kd_model_load(&in, 1, &m, &d) == 0 && kd_optimize(&in, &m, &d) == 0) kd_verify_model(&in, &m, &o, &r, &d);
    kd_model_free(&m);
    if (d.errors) return 1;
    return r.diverged ? 1 : 0;
}
