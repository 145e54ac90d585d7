/* cmd_run.c — `kiln run`: text in, text streamed out; or ids in, logits out. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/commands.h"
#include "runtime/text/sampler.h"
#include "runtime/session.h"
#include "runtime/text/tokenizer.h"

static const char run_help[] =
    "usage: kiln run ENGINE (--prompt TEXT | --ids ID,ID,...) [-n N] [sampling options]\n"
    "                [--logits-out FILE] [device options]\n"
    "\n"
    "Run a prompt as one sequence: print the prompt, then stream the generated\n"
    "text to standard output as it comes. Statistics (prompt tokens, generated\n"
    "tokens, time to first token, tokens/s) go to standard error, and on a GPU\n"
    "how large the KV cache is. With --ids the prompt is token ids and the\n"
    "generated ids are printed, separated by spaces. Generation ends after N\n"
    "tokens, at the model's end-of-sequence token, at a stop string, or at the\n"
    "end of the context. On a GPU the next tokens are drawn there (greedy or\n"
    "sampled, with the same seeded generator as on the CPU), and only their\n"
    "ids come back; a repetition penalty draws on the CPU.\n"
    "\n"
    "  --prompt TEXT              text prompt (BOS added as the model's tokenizer does)\n"
    "  --ids LIST                 comma-separated token ids instead of text\n"
    "  -n N                       tokens to generate at most (default 128 with --prompt, 0 with --ids)\n"
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
    "  --host-sampling            GPU: copy the logits back and draw on the CPU\n"
    "  --profile                  time each step, prefill and decode steps apart, and on a GPU\n"
    "                             each kernel (no CUDA graphs then): tables on standard error\n";

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

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

/* The engine's tokenizer with the model's BOS/EOS, or NULL after reporting. */
static krt_tok *engine_tokenizer(const krt_engine *e, ks_diag *d)
{
    if (!e->tokenizer) {
        ks_error(d, e->path, "the engine holds no tokenizer; rebuild it with --tokenizer FILE, or use --ids");
        return NULL;
    }
    krt_tok *t = krt_tok_load_memory(d, e->path, e->tokenizer, e->tokenizer_len, (krt_tok_kind)e->tokenizer_kind);
    if (t)
        krt_tok_set_bos_eos(t, (int32_t)krt_engine_param_int(e, "bos_token_id", -1),
                            (int32_t)krt_engine_param_int(e, "eos_token_id", -1));
    return t;
}

/* Whole steps' times on the host for --profile: one kind of step
 * (prefill: more than KRT_PROFILE_DECODE_TOKENS tokens; decode). */
typedef struct step_times {
    long steps;   /* steps run */
    long tokens;  /* their tokens */
    double total; /* seconds */
    double min;   /* the shortest step, seconds */
    double max;   /* the longest */
} step_times;

typedef struct run_opts {
    long n_new;                     /* tokens to generate at most */
    krt_sampler_config sampling;    /* sampler settings */
    const char *stops[KC_MAX_REPEAT]; /* stop strings */
    int n_stops;                    /* how many */
    const char *logits_out;         /* file for the prompt's logits, or NULL */
    int text;                       /* 1: --prompt (stream text), 0: --ids (print ids) */
    int profile;                    /* --profile */
    step_times times[2];            /* --profile: [0] decode steps, [1] prefill steps */
} run_opts;

/* Run one step of n tokens, timed into o->times. */
static int timed_run(krt_session *s, const krt_step_req *req, run_opts *o, ks_diag *d)
{
    double t0 = now_seconds();
    int rc = krt_session_run(s, req, d);
    double t = now_seconds() - t0;
    step_times *st = &o->times[req->n > KRT_PROFILE_DECODE_TOKENS];
    if (rc == 0) {
        if (st->steps == 0 || t < st->min) st->min = t;
        if (st->steps == 0 || t > st->max) st->max = t;
        st->steps++;
        st->tokens += req->n;
        st->total += t;
    }
    return rc;
}

/* --profile's tables on stderr: the steps' host times, then the backend's
 * kernels. */
static void print_profile(const krt_session *s, const run_opts *o)
{
    for (int k = 1; k >= 0; k--) {
        const step_times *t = &o->times[k];
        if (t->steps == 0) continue;
        fprintf(stderr,
                "kiln: profile: %ld %s step%s (%ld tokens; %s %d tokens a step): host time %.3f ms, %.1f µs a step "
                "(min %.1f, max %.1f)\n",
                t->steps, k ? "prefill" : "decode", t->steps == 1 ? "" : "s", t->tokens, k ? ">" : "<=",
                KRT_PROFILE_DECODE_TOKENS, 1e3 * t->total, 1e6 * t->total / (double)t->steps, 1e6 * t->min,
                1e6 * t->max);
    }
    ks_buf b = {0};
    if (krt_session_profile(s, &b) == 0)
        fputs(ks_buf_cstr(&b), stderr);
    else
        fprintf(stderr, "kiln: profile: kernels are timed on CUDA engines (kiln build --target sm_XX); this one runs "
                        "on the CPU interpreter, whose steps are timed above\n");
    ks_buf_free(&b);
}

/* Generate from prompt ids; streams text (or ids) to stdout. */
static int generate(krt_session *s, krt_tok *tok, const krt_tok_ids *prompt, run_opts *o, ks_diag *d)
{
    int64_t vocab = krt_session_vocab(s);
    int ctx = krt_session_max_context(s);
    int n = (int)prompt->len;
    if (n > ctx) {
        ks_error(d, "kiln", "the prompt has %d tokens, more than the context of %d", n, ctx);
        return -1;
    }
    long n_new = o->n_new;
    if (n + n_new > ctx) {
        fprintf(stderr, "kiln: note: generating %ld tokens, not %ld: the context holds %d\n", (long)(ctx - n), n_new,
                ctx);
        n_new = ctx - n;
    }
    krt_sampler *smp = krt_sampler_new(d, &o->sampling, (int32_t)vocab);
    if (!smp) return -1;
    for (int i = 0; i < n; i++) krt_sampler_accept(smp, prompt->ids[i]);
    krt_tok_stream *stream = tok ? krt_tok_stream_new(tok, KRT_TOK_SKIP_SPECIAL) : NULL;
    ks_buf text = {0};  /* everything streamed, for stop strings */
    size_t printed = 0; /* bytes of text written to stdout */
    if (stream) {
        for (int i = 0; i < n; i++) krt_tok_stream_push(stream, prompt->ids[i], &text);
        fwrite(text.data, 1, text.len, stdout);
        printed = text.len;
        fflush(stdout);
    }
    size_t prompt_text = text.len;
    /* the prompt's step: its logits when asked for, and the first new token drawn from its last row
     * (where the logits are: on a GPU only the id comes back) */
    float *logits = o->logits_out ? ks_xmalloc(sizeof(float) * (size_t)vocab * (size_t)n) : NULL;
    int32_t *seq = ks_xcalloc((size_t)n, sizeof *seq), *next = ks_xmalloc(sizeof *next * (size_t)n);
    krt_sampler **samplers = ks_xcalloc((size_t)n, sizeof *samplers);
    samplers[n - 1] = n_new > 0 ? smp : NULL;
    krt_step_req req = {.n = n, .tokens = prompt->ids, .seq_ids = seq, .logits = logits, .samplers = samplers,
                        .next = next};
    double t0 = now_seconds(), t_first = 0;
    int rc = timed_run(s, &req, o, d);
    long generated = 0;
    if (rc == 0 && o->logits_out) {
        ks_outfile f;
        if (ks_outfile_open(d, &f, o->logits_out, 0) == 0) {
            ks_outfile_write(&f, logits, sizeof(float) * (size_t)vocab * (size_t)n);
            rc = ks_outfile_commit(d, &f);
        } else {
            rc = -1;
        }
    }
    int32_t token = next[n - 1];
    int stopped = 0;
    while (rc == 0 && generated < n_new && !stopped) {
        if (generated == 0) t_first = now_seconds();
        if (token < 0 || krt_sampler_is_stop_id(smp, token)) break;
        generated++;
        if (stream) {
            krt_tok_stream_push(stream, token, &text);
            size_t at = 0;
            if (o->n_stops && krt_sampler_stop_find(o->stops, (size_t)o->n_stops, text.data + prompt_text,
                                                    text.len - prompt_text, 0, &at) == 0) {
                text.len = prompt_text + at; /* the stop string itself is not printed */
                stopped = 1;
            }
            size_t hold = stopped ? 0 : krt_sampler_stop_holdback(o->stops, (size_t)o->n_stops,
                                                                  text.data + prompt_text, text.len - prompt_text);
            if (text.len - hold > printed) {
                fwrite(text.data + printed, 1, text.len - hold - printed, stdout);
                printed = text.len - hold;
                fflush(stdout);
            }
        } else {
            printf("%s%d", generated > 1 ? " " : "", token);
            fflush(stdout);
        }
        if (stopped || generated == n_new) break;
        int32_t zero = 0, in = token;
        krt_step_req step = {.n = 1, .tokens = &in, .seq_ids = &zero, .samplers = &smp, .next = &token};
        rc = timed_run(s, &step, o, d);
    }
    if (stream && !stopped) {
        krt_tok_stream_flush(stream, &text);
        if (text.len > printed) fwrite(text.data + printed, 1, text.len - printed, stdout);
    }
    if (stream || generated) printf("\n");
    fflush(stdout);
    double t_end = now_seconds();
    if (rc == 0) {
        double ttft = generated ? t_first - t0 : t_end - t0;
        double rate = generated > 1 && t_end > t_first ? (double)(generated - 1) / (t_end - t_first) : 0;
        fprintf(stderr, "kiln: prompt tokens %d, generated tokens %ld, time to first token %.1f ms, %.1f tokens/s\n",
                n, generated, ttft * 1e3, rate);
        if (o->profile) print_profile(s, o);
    }
    free(logits);
    free(seq);
    free(next);
    free(samplers);
    ks_buf_free(&text);
    krt_tok_stream_free(stream);
    krt_sampler_free(smp);
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
               *no_graphs = NULL, *host_sampling = NULL, *profile = NULL;
    run_opts o = {.sampling = krt_sampler_defaults()};
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
        {"--stop", KC_REPEAT, o.stops, &o.n_stops},
        {"--max-context", 1, &max_ctx, NULL},
        {"--kv-fraction", 1, &kv_fraction, NULL},
        {"--kv-blocks", 1, &kv_blocks, NULL},
        {"--no-cuda-graphs", 0, &no_graphs, NULL},
        {"--host-sampling", 0, &host_sampling, NULL},
        {"--profile", 0, &profile, NULL},
        {NULL, 0, NULL, NULL},
    };
    const char *pos[1];
    int npos = 0;
    int rc = kc_parse_args(argc, argv, opts, pos, 1, &npos, run_help);
    if (rc) return rc < 0 ? 2 : 0;
    if (npos != 1 || !!ids_arg == !!prompt_arg) {
        fprintf(stderr, "kiln run: error: needs an engine and one of --prompt or --ids (see 'kiln run --help')\n");
        return 2;
    }
    if (o.logits_out &&
        kc_check_output_file(o.logits_out, "--logits-out", "the file the logits are written to") != 0)
        return 2;
    o.text = prompt_arg != NULL;
    double v;
    int64_t k;
    o.n_new = o.text ? 128 : 0;
    if (n_arg) {
        if (kc_parse_int("run", "-n", n_arg, 0, 10000000, &k)) return 2;
        o.n_new = (long)k;
    }
    o.sampling.temperature = 0;
    if (temp) {
        if (kc_parse_number("run", "--temperature", temp, 0, 100, &v)) return 2;
        o.sampling.temperature = (float)v;
    }
    if (top_k) {
        if (kc_parse_int("run", "--top-k", top_k, 0, 1000000000, &k)) return 2;
        o.sampling.top_k = (int32_t)k;
    }
    if (top_p) {
        if (kc_parse_number("run", "--top-p", top_p, 0, 1, &v)) return 2;
        o.sampling.top_p = (float)v;
    }
    if (rep) {
        if (kc_parse_number("run", "--repetition-penalty", rep, 0.01, 100, &v)) return 2;
        o.sampling.repetition_penalty = (float)v;
    }
    if (seed && kc_parse_u64("run", "--seed", seed, &o.sampling.seed)) return 2;
    o.profile = profile != NULL;
    krt_session_opts so = {.no_graphs = no_graphs != NULL, .host_sampling = host_sampling != NULL,
                           .profile = o.profile};
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
    krt_tok *tok = e && o.text ? engine_tokenizer(e, &d) : NULL;
    krt_session *s = e && !d.errors ? krt_session_new(e, &so, &d) : NULL;
    if (s) report_kv(s);
    if (s && o.text) {
        krt_tok_encode(tok, prompt_arg, strlen(prompt_arg), KRT_TOK_ADD_SPECIAL, &ids, &d);
        int32_t bos = krt_tok_bos(tok);
        if (!d.errors && ids.len == 0) {
            if (bos >= 0) {
                KS_GROW(ids.ids, 1, ids.cap, 1, "token ids");
                ids.ids[ids.len++] = bos;
            } else {
                ks_error(&d, "kiln", "the prompt is empty and the model has no BOS token to start from");
            }
        }
    }
    int32_t eos = (int32_t)(e ? krt_engine_param_int(e, "eos_token_id", -1) : -1);
    if (eos >= 0) {
        o.sampling.stop_ids = &eos;
        o.sampling.n_stop_ids = 1;
    }
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
    krt_tok *tok = e ? engine_tokenizer(e, &d) : NULL;
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
