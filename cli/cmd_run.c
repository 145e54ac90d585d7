/* cmd_run.c — `kiln run`: text in, text streamed out; or ids in, logits out. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "runtime/generate.h"

static const char run_help[] =
    "usage: kiln run ENGINE [--prompt TEXT | --ids ID,ID,...] [-n N] [sampling options]\n"
    "                [--logits-out FILE] [device options]\n"
    "\n"
    "Run a prompt as one sequence: print the prompt, then stream the generated\n"
    "text to standard output as it comes (without a prompt: from the model's\n"
    "BOS token). Statistics (prompt tokens, generated\n"
    "tokens, time to first token, tokens/s) go to standard error, and on a GPU\n"
    "how large the KV cache is. With --ids the prompt is token ids and the\n"
    "generated ids are printed, separated by spaces. Generation ends after N\n"
    "tokens, at any of the model's end-of-sequence tokens (or their text), at a\n"
    "stop string, or at the end of the context (its last position is used). A\n"
    "prompt longer than the engine's largest step (kiln build --max-tokens) is\n"
    "run in several steps. On a GPU the next tokens are drawn there (greedy or\n"
    "sampled, with the same seeded generator as on the CPU), and only their\n"
    "ids come back; a repetition penalty draws on the CPU.\n"
    "\n"
    "  --prompt TEXT              text prompt (BOS added as the model's tokenizer does)\n"
    "  --ids LIST                 comma-separated token ids instead of text\n"
    "  -n N                       tokens to generate at most (default 128 with --prompt, 0 with --ids)\n"
    "  --ignore-eos               go on past the end-of-sequence tokens\n"
    "  --temperature T            0: greedy (default 0)\n"
    "  --top-k K                  keep the K most likely tokens (default 0: all)\n"
    "  --top-p P                  nucleus sampling (default 1: all)\n"
    "  --repetition-penalty R     > 1 discourages repeats (default 1: off)\n"
    "  --seed S                   sampling seed (default 0): same seed, same output\n"
    "  --stop TEXT                stop when the output ends with TEXT (may repeat)\n"
    "  --logits-out FILE          float32 little-endian logits [prompt tokens, vocab]\n"
    "  --max-context N            positions the sequence may have (default: the engine's)\n"
    "  --kv-fraction F            GPU: the KV cache takes at most F of the memory free after\n"
    "                             the weights, in (0, 1] (default 0.9; never more than a\n"
    "                             full context needs)\n"
    "  --kv-blocks N              KV-cache blocks of 16 positions, instead of --kv-fraction\n"
    "  --no-cuda-graphs           GPU: launch each kernel of each step, no CUDA graphs\n"
    "  --no-kernel-overlap        GPU: start each kernel after the one before has ended\n"
    "                             (no programmatic dependent launch on sm_90)\n"
    "  --host-sampling            GPU: copy the logits back and draw on the CPU\n"
    "  --profile                  time each step, prefill and decode steps apart, and on a GPU\n"
    "                             each kernel (no CUDA graphs then), with the operations it did\n"
    "                             (GFLOP: matmuls and attention) and their rate (TFLOP/s):\n"
    "                             tables on standard error\n"
    "  --profile-ceiling TFLOPS   with --profile: each kernel's TFLOP/s as a fraction of TFLOPS\n"
    "                             too (e.g. cuBLAS's on the device; default: no such column)\n";

/* Parse "1,5,9" into ids; reports the place of a bad entry. */
static int parse_ids(const char *s, krt_tok_ids *out)
{
    const char *p = s;
    for (;;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (*p < '0' || *p > '9' || end == p || errno || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "kiln run: error: --ids: bad token id at character %d of '%s'\n", (int)(p - s) + 1, s);
            return -1;
        }
        KS_GROW(out->ids, out->len + 1, out->cap, (size_t)1 << 30, "token ids");
        out->ids[out->len++] = (int32_t)v;
        if (!*end) return 0;
        p = end + 1;
    }
}

typedef struct run_opts {
    krt_gen_opts gen;                 /* what to generate and how */
    const char *stops[KC_MAX_REPEAT]; /* stop strings */
    const char *logits_out;           /* file for the prompt's logits, or NULL */
    int text;                         /* 1: text out (stream it); 0: --ids (print ids) */
    int profile;                      /* --profile */
    double ceiling;                   /* --profile-ceiling: TFLOP/s; 0: none */
} run_opts;

/* --profile's tables on stderr: the steps' host times, then the backend's
 * kernels. */
static void print_profile(const krt_session *s, const krt_gen_stats *st, double ceiling)
{
    for (int k = 1; k >= 0; k--) {
        const krt_gen_times *t = &st->times[k];
        if (t->steps == 0) continue;
        fprintf(stderr,
                "kiln: profile: %ld %s step%s (%ld tokens; %s %d tokens a step): host time %.3f ms, %.1f µs a step "
                "(min %.1f, max %.1f)\n",
                t->steps, k ? "prefill" : "decode", t->steps == 1 ? "" : "s", t->tokens, k ? ">" : "<=",
                KRT_PROFILE_DECODE_TOKENS, 1e3 * t->total, 1e6 * t->total / (double)t->steps, 1e6 * t->min,
                1e6 * t->max);
    }
    kc_print_kernel_profile(s, ceiling, "kiln", ", whose steps are timed above");
}

void kc_print_kernel_profile(const krt_session *s, double ceiling, const char *who, const char *tail)
{
    ks_buf b = {0};
    if (krt_session_profile(s, ceiling, &b) == 0)
        fputs(ks_buf_cstr(&b), stderr);
    else
        fprintf(stderr, "%s: profile: kernels are timed on CUDA engines (kiln build --target sm_XX); this one runs "
                        "on the CPU interpreter%s\n", who, tail);
    ks_buf_free(&b);
}

static int print_text(void *ctx, const char *text, size_t len)
{
    (void)ctx;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

static int print_id(void *ctx, int32_t id)
{
    int *count = ctx;
    printf("%s%d", (*count)++ ? " " : "", id);
    fflush(stdout);
    return 0;
}

/* Generate from prompt ids in sequence 0; streams text (or ids) to stdout. */
static int generate(krt_session *s, krt_tok *tok, const krt_tok_ids *prompt, run_opts *o, ks_diag *d)
{
    int64_t vocab = krt_session_vocab(s);
    size_t n = prompt->len;
    float *logits = o->logits_out ? ks_xmalloc(sizeof(float) * (size_t)vocab * n) : NULL;
    o->gen.prompt_logits = logits;
    o->gen.echo_prompt = o->text;
    int printed_ids = 0;
    krt_gen_callbacks cb = {.on_text = o->text ? print_text : NULL, .on_token = o->text ? NULL : print_id,
                            .ctx = &printed_ids};
    krt_gen_stats st;
    int rc = krt_generate(s, 0, o->text ? tok : NULL, prompt->ids, (int)n, &o->gen, &cb, &st, d) < 0 ? -1 : 0;
    if (o->text || printed_ids) printf("\n");
    fflush(stdout);
    if (rc == 0 && o->logits_out) {
        ks_outfile f;
        if (ks_outfile_open(d, &f, o->logits_out, 0) == 0) {
            ks_outfile_write(&f, logits, sizeof(float) * (size_t)vocab * n);
            rc = ks_outfile_commit(d, &f);
        } else {
            rc = -1;
        }
    }
    if (rc == 0) {
        if (st.end == KRT_GEN_CONTEXT)
            fprintf(stderr, "kiln: note: generated %d tokens, not %d: the context of %d positions is full\n",
                    st.generated, o->gen.max_new, krt_session_max_context(s));
        double rate = st.generated > 1 && st.decode_s > 0 ? (double)(st.generated - 1) / st.decode_s : 0;
        fprintf(stderr, "kiln: prompt tokens %d, generated tokens %d, time to first token %.1f ms, %.1f tokens/s\n",
                st.prompt_tokens, st.generated, st.first_token_s * 1e3, rate);
        if (o->profile) print_profile(s, &st, o->ceiling);
    }
    free(logits);
    return rc;
}

/* The KV cache's size, on stderr, when it lives on a device. */
static void report_kv(const krt_session *s)
{
    const krt_kv_info *kv = krt_session_kv_info(s);
    if (!kv->on_device) return;
    char b1[32], b2[32];
    fprintf(stderr, "kiln: KV cache on %s: %d blocks of %d positions (%s)", kv->device, kv->n_blocks, kv->block_size,
            ks_human_bytes((double)kv->bytes, b1, sizeof b1));
    if (kv->from_free_memory)
        fprintf(stderr, ", at most %g of the %s free\n", kv->fraction, ks_human_bytes((double)kv->free_bytes, b2, sizeof b2));
    else
        fprintf(stderr, ", as asked\n");
}

int kc_cmd_run(int argc, char **argv)
{
    const char *ids_arg = NULL, *prompt_arg = NULL, *n_arg = NULL, *temp = NULL, *top_k = NULL, *top_p = NULL,
               *rep = NULL, *seed = NULL, *max_ctx = NULL, *kv_fraction = NULL, *kv_blocks = NULL,
               *no_graphs = NULL, *host_sampling = NULL, *profile = NULL, *ignore_eos = NULL,
               *ceiling = NULL, *no_overlap = NULL;
    run_opts o = {.gen = krt_gen_defaults()};
    kc_option opts[] = {
        {"--ids", 1, &ids_arg, NULL},
        {"--prompt", 1, &prompt_arg, NULL},
        {"-n", 1, &n_arg, NULL},
        {"--logits-out", 1, &o.logits_out, NULL},
        {"--temperature", 1, &temp, NULL},
        {"--top-k", 1, &top_k, NULL},
        {"--top-p", 1, &top_p, NULL},
        {"--repetition-penalty", 1, &rep, NULL},
        {"--seed", 1, &seed, NULL},
        {"--stop", KC_REPEAT, o.stops, &o.gen.n_stops},
        {"--ignore-eos", 0, &ignore_eos, NULL},
        {"--max-context", 1, &max_ctx, NULL},
        {"--kv-fraction", 1, &kv_fraction, NULL},
        {"--kv-blocks", 1, &kv_blocks, NULL},
        {"--no-cuda-graphs", 0, &no_graphs, NULL},
        {"--no-kernel-overlap", 0, &no_overlap, NULL},
        {"--host-sampling", 0, &host_sampling, NULL},
        {"--profile", 0, &profile, NULL},
        {"--profile-ceiling", 1, &ceiling, NULL},
        {NULL, 0, NULL, NULL},
    };
    const char *pos[1];
    int npos = 0;
    int rc = kc_parse_args(argc, argv, opts, pos, 1, &npos, run_help);
    if (rc) return rc < 0 ? 2 : 0;
    if (npos != 1 || (ids_arg && prompt_arg)) {
        fprintf(stderr, "kiln run: error: needs an engine and at most one of --prompt or --ids (see 'kiln run "
                        "--help')\n");
        return 2;
    }
    if (o.logits_out &&
        kc_check_output_file(o.logits_out, "--logits-out", "the file the logits are written to") != 0)
        return 2;
    o.text = ids_arg == NULL;
    o.gen.stops = o.stops;
    o.gen.ignore_eos = ignore_eos != NULL;
    double v;
    int64_t k;
    o.gen.max_new = o.text ? 128 : 0;
    if (n_arg) {
        if (kc_parse_int("run", "-n", n_arg, 0, 10000000, &k)) return 2;
        o.gen.max_new = (int)k;
    }
    if (temp) {
        if (kc_parse_number("run", "--temperature", temp, 0, 100, &v)) return 2;
        o.gen.sampling.temperature = (float)v;
    }
    if (top_k) {
        if (kc_parse_int("run", "--top-k", top_k, 0, 1000000000, &k)) return 2;
        o.gen.sampling.top_k = (int32_t)k;
    }
    if (top_p) {
        if (kc_parse_number("run", "--top-p", top_p, 0, 1, &v)) return 2;
        o.gen.sampling.top_p = (float)v;
    }
    if (rep) {
        if (kc_parse_number("run", "--repetition-penalty", rep, 0.01, 100, &v)) return 2;
        o.gen.sampling.repetition_penalty = (float)v;
    }
    if (seed && kc_parse_u64("run", "--seed", seed, &o.gen.sampling.seed)) return 2;
    o.profile = profile != NULL;
    if (ceiling) {
        if (!o.profile) {
            fprintf(stderr, "kiln run: error: --profile-ceiling goes with --profile\n");
            return 2;
        }
        if (kc_parse_number("run", "--profile-ceiling", ceiling, 0.001, 1e6, &o.ceiling)) return 2;
    }
    krt_session_opts so = {.no_graphs = no_graphs != NULL, .host_sampling = host_sampling != NULL,
                           .profile = o.profile, .no_kernel_overlap = no_overlap != NULL};
    if (max_ctx) {
        if (kc_parse_int("run", "--max-context", max_ctx, 1, INT32_MAX, &k)) return 2;
        so.max_context = (int)k;
    }
    if (kv_fraction) {
        char *end;
        errno = 0;
        so.kv_fraction = strtod(kv_fraction, &end);
        if (end == kv_fraction || *end || errno || !(so.kv_fraction > 0 && so.kv_fraction <= 1)) {
            fprintf(stderr, "kiln run: error: --kv-fraction: '%s' is not a number in (0, 1]\n", kv_fraction);
            return 2;
        }
    }
    if (kv_blocks) {
        if (kc_parse_int("run", "--kv-blocks", kv_blocks, 1, INT32_MAX, &k)) return 2;
        so.n_blocks = (int)k;
    }
    if (kv_fraction && kv_blocks) {
        fprintf(stderr, "kiln run: error: --kv-fraction and --kv-blocks both size the KV cache: give one\n");
        return 2;
    }
    krt_tok_ids ids = {0};
    if (ids_arg && parse_ids(ids_arg, &ids)) {
        krt_tok_ids_free(&ids);
        return 2;
    }

    ks_diag d = {0};
    krt_engine *e = krt_engine_open(pos[0], &d);
    krt_tok *tok = e && o.text ? krt_engine_tokenizer(e, &d) : NULL;
    krt_session *s = e && !d.errors ? krt_session_new(e, &so, &d) : NULL;
    if (s) report_kv(s);
    /* text: the prompt's ids, [BOS] without one */
    if (s && o.text) krt_gen_prompt(tok, &e->desc, prompt_arg ? prompt_arg : "", &ids, &d);
    if (s && !d.errors && krt_session_seq_add(s, 0, &d) == 0) generate(s, tok, &ids, &o, &d);
    krt_tok_ids_free(&ids);
    krt_session_free(s);
    krt_tok_free(tok);
    krt_engine_close(e);
    return d.errors ? 1 : 0;
}

static const char tokenize_help[] =
    "usage: kiln tokenize ENGINE --prompt TEXT [--no-special]\n"
    "\n"
    "Print the token ids the engine's tokenizer gives TEXT (with BOS and other\n"
    "special tokens as the model expects, unless --no-special), separated by\n"
    "spaces.\n";

int kc_cmd_tokenize(int argc, char **argv)
{
    const char *prompt = NULL, *plain = NULL;
    kc_option opts[] = {{"--prompt", 1, &prompt, NULL}, {"--no-special", 0, &plain, NULL}, {NULL, 0, NULL, NULL}};
    const char *pos[1];
    int npos = 0;
    int rc = kc_parse_args(argc, argv, opts, pos, 1, &npos, tokenize_help);
    if (rc) return rc < 0 ? 2 : 0;
    if (npos != 1 || !prompt) {
        fprintf(stderr, "kiln tokenize: error: needs an engine and --prompt (see 'kiln tokenize --help')\n");
        return 2;
    }
    ks_diag d = {0};
    krt_engine *e = krt_engine_open(pos[0], &d);
    krt_tok *tok = e ? krt_engine_tokenizer(e, &d) : NULL;
    krt_tok_ids ids = {0};
    if (tok && krt_tok_encode(tok, prompt, strlen(prompt), plain ? 0 : KRT_TOK_ADD_SPECIAL, &ids, &d) == 0) {
        for (size_t i = 0; i < ids.len; i++) printf("%s%d", i ? " " : "", ids.ids[i]);
        printf("\n");
    }
    krt_tok_ids_free(&ids);
    krt_tok_free(tok);
    krt_engine_close(e);
    return d.errors ? 1 : 0;
}
