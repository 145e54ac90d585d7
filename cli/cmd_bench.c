/* cmd_bench.c — `kiln bench`: time to first token and decode speed of an
 * engine (the measuring is runtime/bench.c's). */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "runtime/bench.h"

static const char bench_help[] =
    "usage: kiln bench ENGINE [--prompts N,N,...] [--decode N] [--decode-prompt N]\n"
    "                  [--batch B,B,...] [--reps N] [--warmup N] [--json] [device options]\n"
    "\n"
    "Time the engine on whatever it runs on (a CUDA engine on the GPU, a CPU\n"
    "engine on the interpreter), through the generation loop `kiln run` uses,\n"
    "with greedy draws:\n"
    "  - time to first token: a prompt of N synthetic token ids (the same ids on\n"
    "    every run) prefilled in a fresh sequence, and the first new token drawn;\n"
    "    a prompt longer than the engine's largest step (kiln build --max-tokens)\n"
    "    runs in several steps, as kiln run runs it (the steps column says how\n"
    "    many); one longer than the context is skipped, with a note;\n"
    "  - decode at batch 1: N one-token steps after a short prompt, time per step;\n"
    "  - with --batch: B sequences after that prompt each, N steps of one token a\n"
    "    sequence, time per step (the runtime's multi-sequence step, drawn where\n"
    "    the logits are);\n"
    "  - the cold start: the engine file opened (every byte read for its checksum:\n"
    "    the file's read rate, from disk or the page cache), the session made (on a\n"
    "    GPU the weights uploaded), and the first run's first token.\n"
    "Each runs --warmup times untimed, then --reps times: the median and the\n"
    "fastest run are shown, as a table, or with --json as one JSON object on a\n"
    "line (for scripts: bench/prefill_bench.py reads it).\n"
    "\n"
    "  --prompts LIST             prompt lengths in tokens, comma-separated, at most 16\n"
    "                             (default 128,512,2048,8192)\n"
    "  --decode N                 decode steps to time (default 128; 0: none)\n"
    "  --decode-prompt N          tokens of the prompt before them (default 16)\n"
    "  --batch LIST               batch sizes of a batched decode, comma-separated, 2 to\n"
    "                             256, at most 8 (default: none)\n"
    "  --reps N                   timed runs of each measurement, 1 to 1000 (default 5)\n"
    "  --warmup N                 untimed runs first, 0 to 1000 (default 1)\n"
    "  --json                     print the results as JSON instead of a table\n"
    "  --max-context N            positions a sequence may have (default: the engine's)\n"
    "  --kv-blocks N              KV-cache blocks of 16 positions (default: enough for the\n"
    "                             largest batch's full sequences, as far as 0.9 of the\n"
    "                             device's free memory goes); a batch whose sequences need\n"
    "                             more is skipped, with a note\n"
    "  --no-cuda-graphs           GPU: launch each kernel of each step, no CUDA graphs\n"
    "  --no-kernel-overlap        GPU: start each kernel after the one before has ended\n"
    "                             (no programmatic dependent launch on sm_90)\n"
    "  --profile                  GPU: time each kernel of every step (no CUDA graphs) and\n"
    "                             print kiln run --profile's tables after the results, on\n"
    "                             stderr: steps of at most 8 tokens apart from longer ones\n"
    "                             (a batched decode alone: --prompts 1 --decode-prompt 1\n"
    "                             --decode N --batch B, whose steps of B > 8 tokens are the\n"
    "                             longer ones)\n";

/* "128,512" (opt's list of integers from lo to hi, at most max, each a `noun`) into out[], *n;
 * reports a bad entry. 0, or -1. */
static int parse_list(const char *opt, const char *noun, const char *s, int64_t lo, int64_t hi, int max, int *out,
                      int *n_out)
{
    *n_out = 0;
    for (const char *p = s;;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        char item[32];
        if (n == 0) {
            fprintf(stderr, "kiln bench: error: %s: an empty %s in '%s'\n", opt, noun, s);
            return -1;
        }
        if (*n_out == max) {
            fprintf(stderr, "kiln bench: error: %s: more than %d %ss in '%s'\n", opt, max, noun, s);
            return -1;
        }
        if (n >= sizeof item) { /* longer than any integer in range */
            fprintf(stderr, "kiln bench: error: %s: '%.*s' is not an integer from %lld to %lld\n", opt, (int)n, p,
                    (long long)lo, (long long)hi);
            return -1;
        }
        memcpy(item, p, n);
        item[n] = 0;
        int64_t v;
        if (kc_parse_int("bench", opt, item, lo, hi, &v) != 0) return -1;
        out[(*n_out)++] = (int)v;
        if (!end) return 0;
        p = end + 1;
    }
}

/* An integer option's value into *out when given. 0, or -1 after reporting. */
static int int_opt(const char *opt, const char *s, int64_t lo, int64_t hi, int *out)
{
    int64_t v;
    if (!s) return 0;
    if (kc_parse_int("bench", opt, s, lo, hi, &v) != 0) return -1;
    *out = (int)v;
    return 0;
}

int kc_cmd_bench(int argc, char **argv)
{
    const char *prompts = NULL, *decode = NULL, *decode_prompt = NULL, *reps = NULL, *warmup = NULL, *json = NULL,
               *max_ctx = NULL, *no_graphs = NULL, *batch = NULL, *no_overlap = NULL, *profile = NULL,
               *kv_blocks = NULL;
    kc_option opts[] = {
        {"--prompts", 1, &prompts, NULL},
        {"--decode", 1, &decode, NULL},
        {"--decode-prompt", 1, &decode_prompt, NULL},
        {"--batch", 1, &batch, NULL},
        {"--reps", 1, &reps, NULL},
        {"--warmup", 1, &warmup, NULL},
        {"--json", 0, &json, NULL},
        {"--max-context", 1, &max_ctx, NULL},
        {"--kv-blocks", 1, &kv_blocks, NULL},
        {"--no-cuda-graphs", 0, &no_graphs, NULL},
        {"--no-kernel-overlap", 0, &no_overlap, NULL},
        {"--profile", 0, &profile, NULL},
        {NULL, 0, NULL, NULL},
    };
    const char *pos[1];
    int npos = 0;
    int rc = kc_parse_args(argc, argv, opts, pos, 1, &npos, bench_help);
    if (rc) return rc < 0 ? 2 : 0;
    if (npos != 1) {
        fprintf(stderr, "kiln bench: error: needs an engine (see 'kiln bench --help')\n");
        return 2;
    }
    krt_bench_opts o = krt_bench_defaults();
    krt_session_opts so = {.max_seqs = 1, .no_graphs = no_graphs != NULL, .no_kernel_overlap = no_overlap != NULL,
                           .profile = profile != NULL};
    if ((prompts && parse_list("--prompts", "length", prompts, 1, KRT_MAX_CONTEXT, KRT_BENCH_MAX_PROMPTS, o.prompts,
                               &o.n_prompts) != 0) ||
        (batch && parse_list("--batch", "size", batch, 2, KRT_BENCH_MAX_BATCH, KRT_BENCH_MAX_BATCHES, o.batches,
                             &o.n_batches) != 0) || int_opt("--decode", decode, 0, KRT_MAX_CONTEXT, &o.decode) ||
        int_opt("--decode-prompt", decode_prompt, 1, KRT_MAX_CONTEXT, &o.decode_prompt) ||
        int_opt("--reps", reps, 1, KRT_BENCH_MAX_REPS, &o.reps) || int_opt("--warmup", warmup, 0, 1000, &o.warmup) ||
        int_opt("--max-context", max_ctx, 1, KRT_MAX_CONTEXT, &so.max_context) ||
        int_opt("--kv-blocks", kv_blocks, 1, INT32_MAX, &so.n_blocks))
        return 2;
    for (int i = 0; i < o.n_batches; i++) /* a batch's sequences at once */
        if (o.batches[i] > so.max_seqs) so.max_seqs = o.batches[i];

    ks_diag d = {0};
    double t0 = ks_now_seconds();
    krt_engine *e = krt_engine_open(pos[0], &d);
    double t1 = ks_now_seconds();
    krt_session *s = e ? krt_session_new(e, &so, &d) : NULL;
    double t2 = ks_now_seconds();
    krt_bench_result r;
    ks_buf out = {0};
    if (s && krt_bench_run(s, &o, &r, &d) == 0) {
        r.cold.measured = 1; /* the cold start: the file opened, the session made (krt_bench_run: the first token) */
        r.cold.open_s = t1 - t0;
        r.cold.engine_bytes = e->map.size;
        r.cold.session_s = t2 - t1;
        if (json)
            krt_bench_json(&r, pos[0], &out, &d);
        else
            krt_bench_table(&r, pos[0], &out);
        if (!d.errors) fputs(ks_buf_cstr(&out), stdout);
        if (!d.errors && profile) kc_print_kernel_profile(s, 0, "kiln bench", "");
    }
    ks_buf_free(&out);
    krt_session_free(s);
    krt_engine_close(e);
    if (fflush(stdout) != 0 && !d.errors) {
        fprintf(stderr, "kiln bench: error: cannot write the results to standard output\n");
        return 1;
    }
    return d.errors ? 1 : 0;
}
