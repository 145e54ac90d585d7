/* cmd_quant_check.c — `kiln quant-check`: how far an engine's next-token
 * distributions land from a reference engine's over a text (a quantized or
 * half-precision engine against the f32 one of the same model).
 *
 * The text is tokenized once per engine (the ids must agree), cut into
 * windows that overlap by one token, so that every token after the first is
 * predicted exactly once, and each window runs as a fresh sequence through
 * both engines in lockstep, in steps no longer than either engine's plan
 * allows. Each predicted position compares the two rows of logits in double
 * precision: KL(P_ref || P_engine) from the log-softmaxes, whether the
 * argmaxes agree, and each engine's negative log-likelihood of the token
 * that comes next in the text (perplexity = exp(mean NLL)). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/commands.h"
#include "runtime/generate.h"

static const char quant_check_help[] =
    "usage: kiln quant-check ENGINE --reference REF_ENGINE --text FILE [--max-kl X] [--window N]\n"
    "                        [--json]\n"
    "\n"
    "Score ENGINE against REF_ENGINE (the same model, e.g. a bf16 or quantized\n"
    "engine against the f32 one) on a text: tokenize FILE with each engine's\n"
    "tokenizer (BOS as the model's tokenizer adds it; both must give the same\n"
    "ids and the engines the same vocabulary), run the tokens through both in\n"
    "windows of at most N tokens, each a fresh sequence (consecutive windows\n"
    "share one token, so every token after the first is predicted once), and\n"
    "compare the two engines' next-token distributions at every position:\n"
    "KL(P_reference || P_engine), computed in double from the log-softmaxes;\n"
    "whether their most likely tokens agree (top-1); and each engine's\n"
    "perplexity on the text (exp of the mean negative log-likelihood of the\n"
    "token that comes next). Prints the tokens scored, the mean, p99\n"
    "(nearest rank) and max KL, the top-1 agreement and both perplexities.\n"
    "\n"
    "  --reference REF_ENGINE     the engine to compare against (e.g. the f32 build)\n"
    "  --text FILE                the text to score (UTF-8; at least 2 tokens with BOS)\n"
    "  --max-kl X                 exit 1 when the mean KL is more than X (a CI gate)\n"
    "  --window N                 tokens a window holds, 2 or more (default: the smaller\n"
    "                             of the two engines' contexts)\n"
    "  --json                     print the results as one JSON object\n";

/* Steps are at most this many tokens (and their logits at most KC_QC_MAX_CHUNK_BYTES a side), even where an
 * engine's plan takes more: the two [chunk, vocab] float buffers stay small for any vocabulary. */
enum { KC_QC_MAX_CHUNK = 512 };
#define KC_QC_MAX_CHUNK_BYTES ((size_t)256 << 20)

/* One of the two engines compared. */
typedef struct qc_side {
    const char *path;    /* the engine file, as given */
    krt_engine *e;       /* opened, or NULL */
    krt_tok *tok;        /* its tokenizer, or NULL */
    krt_session *s;      /* its session, or NULL */
    krt_tok_ids ids;     /* the text's token ids from its tokenizer */
    float *logits;       /* [chunk, vocab] one step's logits */
    double nll;          /* sum over the scored tokens of -log P(next token) */
} qc_side;

/* What the comparison found. */
typedef struct qc_result {
    size_t text_tokens;  /* ids of the text, BOS included */
    int window;          /* tokens a window holds at most */
    size_t windows;      /* windows run */
    size_t scored;       /* positions compared: text_tokens - 1 */
    double *kl;          /* [scored] KL(P_ref || P_engine) of each, in nats; sorted at the end */
    size_t top1;         /* positions whose argmaxes agree */
    double mean_kl;      /* nats */
    double p99_kl;       /* nearest rank: the ceil(0.99 * scored)-th smallest */
    double max_kl;       /* nats */
    double ppl;          /* the engine's perplexity: exp(mean NLL) */
    double ref_ppl;      /* the reference's */
} qc_result;

static void side_free(qc_side *sd)
{
    free(sd->logits);
    krt_tok_ids_free(&sd->ids);
    krt_session_free(sd->s);
    krt_tok_free(sd->tok);
    krt_engine_close(sd->e);
}

/* The engine, its tokenizer and the text's ids from it. 0, or -1 after reporting. */
static int side_open(qc_side *sd, const char *text, size_t len, ks_diag *d)
{
    sd->e = krt_engine_open(sd->path, d);
    if (!sd->e) return -1;
    sd->tok = krt_engine_tokenizer(sd->e, d);
    if (!sd->tok) return -1;
    return krt_tok_encode(sd->tok, text, len, KRT_TOK_ADD_SPECIAL, &sd->ids, d);
}

/* log(sum(exp(x))) over a row of v logits, in double, and its first argmax; -1 when a logit is NaN or
 * infinite. */
static int row_lse(const float *x, int64_t v, double *lse, int32_t *argmax)
{
    float m = x[0];
    int32_t at = 0;
    for (int64_t i = 0; i < v; i++) {
        if (!isfinite(x[i])) return -1;
        if (x[i] > m) m = x[i], at = (int32_t)i;
    }
    double sum = 0;
    for (int64_t i = 0; i < v; i++) sum += exp((double)x[i] - (double)m);
    *lse = (double)m + log(sum);
    *argmax = at;
    return 0;
}

/* KL(P || Q) in nats of the softmaxes of logit rows p and q (their log-sum-exps lp, lq):
 * sum_i P_i (log P_i - log Q_i). Rows that are bit for bit the same give exactly 0; rounding can
 * leave a tiny negative sum for rows that differ in the last bits, which is clamped to 0 (KL is never
 * negative). */
static double row_kl(const float *p, double lp, const float *q, double lq, int64_t v)
{
    double kl = 0;
    for (int64_t i = 0; i < v; i++) {
        double log_p = (double)p[i] - lp, log_q = (double)q[i] - lq;
        kl += exp(log_p) * (log_p - log_q);
    }
    return kl > 0 ? kl : 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Compare row r of the two sides' logits; next is the token the text has after it. */
static int score_row(qc_side *eng, qc_side *ref, int64_t vocab, int r, int32_t next, size_t pos, qc_result *res,
                     ks_diag *d)
{
    const float *pe = eng->logits + (size_t)r * (size_t)vocab, *pr = ref->logits + (size_t)r * (size_t)vocab;
    double le, lr;
    int32_t ae, ar;
    int bad_e = row_lse(pe, vocab, &le, &ae) != 0, bad_r = !bad_e && row_lse(pr, vocab, &lr, &ar) != 0;
    if (bad_e || bad_r) {
        ks_error(d, bad_e ? eng->path : ref->path,
                 "the logits predicting token %zu of the text are not all finite (NaN or infinite)", pos + 1);
        return -1;
    }
    if (next >= vocab) { /* a token id the embedding takes but no logit scores */
        ks_error(d, ref->path, "token %zu of the text is id %d, past the %lld logits a token gets", pos + 1, next,
                 (long long)vocab);
        return -1;
    }
    res->kl[res->scored++] = row_kl(pr, lr, pe, le, vocab);
    res->top1 += ae == ar;
    eng->nll += le - (double)pe[next];
    ref->nll += lr - (double)pr[next];
    return 0;
}

/* Run the text's ids window by window through both sessions and score every predicted position. */
static int run_windows(qc_side *eng, qc_side *ref, int64_t vocab, int chunk, qc_result *res, ks_diag *d)
{
    const int32_t *ids = ref->ids.ids;
    size_t n = ref->ids.len;
    int32_t *seqs = ks_xcalloc((size_t)chunk, sizeof *seqs); /* sequence 0 for every token */
    int rc = 0;
    for (size_t w = 0; rc == 0 && w + 1 < n; w += (size_t)res->window - 1) {
        int len = n - w < (size_t)res->window ? (int)(n - w) : res->window;
        if (krt_session_seq_add(eng->s, 0, d) != 0) {
            rc = -1;
            break;
        }
        if (krt_session_seq_add(ref->s, 0, d) != 0) {
            krt_session_seq_free(eng->s, 0);
            rc = -1;
            break;
        }
        res->windows++;
        for (int c = 0; rc == 0 && c < len; c += chunk) {
            int k = len - c < chunk ? len - c : chunk;
            if (krt_session_step(eng->s, k, ids + w + (size_t)c, seqs, eng->logits, d) != 0 ||
                krt_session_step(ref->s, k, ids + w + (size_t)c, seqs, ref->logits, d) != 0) {
                rc = -1;
                break;
            }
            for (int r = 0; rc == 0 && r < k && c + r + 1 < len; r++) {
                size_t pos = w + (size_t)(c + r);
                rc = score_row(eng, ref, vocab, r, ids[pos + 1], pos, res, d);
            }
        }
        krt_session_seq_free(eng->s, 0);
        krt_session_seq_free(ref->s, 0);
    }
    free(seqs);
    return rc;
}

static void summarize(const qc_side *eng, const qc_side *ref, qc_result *res)
{
    double sum = 0;
    for (size_t i = 0; i < res->scored; i++) sum += res->kl[i];
    qsort(res->kl, res->scored, sizeof *res->kl, cmp_double);
    size_t rank = (99 * res->scored + 99) / 100; /* nearest rank, 1-based: ceil(0.99 n), at least 1 */
    res->mean_kl = sum / (double)res->scored;
    res->p99_kl = res->kl[rank - 1];
    res->max_kl = res->kl[res->scored - 1];
    res->ppl = exp(eng->nll / (double)res->scored);
    res->ref_ppl = exp(ref->nll / (double)res->scored);
}

static int add(cJSON *o, const char *key, cJSON *item)
{
    if (item && cJSON_AddItemToObject(o, key, item)) return 1;
    cJSON_Delete(item);
    return 0;
}

/* The results on stdout, as lines or one JSON object. 0, or -1 after reporting. */
static int print_result(const qc_result *r, const char *engine, const char *reference, const char *text, int json)
{
    double pct = 100.0 * (double)r->top1 / (double)r->scored;
    if (!json) {
        printf("engine:           %s\n", engine);
        printf("reference:        %s\n", reference);
        printf("text:             %s (%zu tokens, %zu window%s of at most %d)\n", text, r->text_tokens, r->windows,
               r->windows == 1 ? "" : "s", r->window);
        printf("tokens scored:    %zu\n", r->scored);
        printf("mean KL:          %.6g\n", r->mean_kl);
        printf("p99 KL:           %.6g\n", r->p99_kl);
        printf("max KL:           %.6g\n", r->max_kl);
        printf("top-1 agreement:  %.2f %% (%zu of %zu)\n", pct, r->top1, r->scored);
        printf("perplexity:       %.6g (engine), %.6g (reference)\n", r->ppl, r->ref_ppl);
        return 0;
    }
    cJSON *o = cJSON_CreateObject();
    int ok = o && add(o, "kiln_quant_check", cJSON_CreateNumber(1)) && add(o, "engine", cJSON_CreateString(engine)) &&
             add(o, "reference", cJSON_CreateString(reference)) && add(o, "text", cJSON_CreateString(text)) &&
             add(o, "text_tokens", cJSON_CreateNumber((double)r->text_tokens)) &&
             add(o, "window", cJSON_CreateNumber(r->window)) &&
             add(o, "windows", cJSON_CreateNumber((double)r->windows)) &&
             add(o, "tokens_scored", cJSON_CreateNumber((double)r->scored)) &&
             add(o, "mean_kl", cJSON_CreateNumber(r->mean_kl)) && add(o, "p99_kl", cJSON_CreateNumber(r->p99_kl)) &&
             add(o, "max_kl", cJSON_CreateNumber(r->max_kl)) &&
             add(o, "top1_agreement_pct", cJSON_CreateNumber(pct)) &&
             add(o, "top1_matches", cJSON_CreateNumber((double)r->top1)) &&
             add(o, "perplexity", cJSON_CreateNumber(r->ppl)) &&
             add(o, "reference_perplexity", cJSON_CreateNumber(r->ref_ppl));
    char *s = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!s) {
        fprintf(stderr, "kiln quant-check: error: out of memory (the JSON of the results)\n");
        return -1;
    }
    printf("%s\n", s);
    cJSON_free(s);
    return 0;
}

/* The ids both tokenizers gave must be the same. 0, or -1 after reporting. */
static int check_same_ids(const qc_side *eng, const qc_side *ref, const char *text, ks_diag *d)
{
    size_t n = eng->ids.len < ref->ids.len ? eng->ids.len : ref->ids.len, i = 0;
    while (i < n && eng->ids.ids[i] == ref->ids.ids[i]) i++;
    if (i == n && eng->ids.len == ref->ids.len) return 0;
    if (i < n)
        ks_error(d, eng->path,
                 "its tokenizer gives %s other token ids than the reference %s's: token %zu is %d, the "
                 "reference's %d (quant-check compares engines of one tokenizer)",
                 text, ref->path, i, eng->ids.ids[i], ref->ids.ids[i]);
    else
        ks_error(d, eng->path,
                 "its tokenizer gives %s %zu tokens, the reference %s's %zu (quant-check compares engines of one "
                 "tokenizer)",
                 text, eng->ids.len, ref->path, ref->ids.len);
    return -1;
}

/* Open both engines, tokenize the text with each, check that they can be compared, and compare them over
 * it into res. 0, or -1 after reporting. */
static int quant_check(qc_side *eng, qc_side *ref, const char *text_path, const char *text, size_t len,
                       int64_t window, qc_result *res, ks_diag *d)
{
    if (side_open(eng, text, len, d) != 0 || side_open(ref, text, len, d) != 0) return -1;
    const krt_desc *de = &eng->e->desc, *dr = &ref->e->desc;
    int64_t vocab = dr->vocab;
    if (de->vocab != dr->vocab) {
        ks_error(d, eng->path,
                 "its vocabulary has %lld logits per token, the reference %s's %lld (quant-check compares engines "
                 "of one vocabulary)",
                 (long long)de->vocab, ref->path, (long long)dr->vocab);
        return -1;
    }
    if (check_same_ids(eng, ref, text_path, d) != 0) return -1;
    res->text_tokens = ref->ids.len;
    if (res->text_tokens < 2) {
        ks_error(d, text_path, "the text is %zu token%s (with BOS); quant-check needs at least 2 to score one",
                 res->text_tokens, res->text_tokens == 1 ? "" : "s");
        return -1;
    }
    const char *smaller = de->max_context <= dr->max_context ? eng->path : ref->path; /* on a tie, the engine */
    int context = de->max_context < dr->max_context ? de->max_context : dr->max_context;
    if (window > context) {
        ks_error(d, smaller, "--window %lld is more than its context of %d positions", (long long)window, context);
        return -1;
    }
    res->window = window ? (int)window : context;
    if (res->window < 2) {
        ks_error(d, smaller, "its context of %d position%s holds no token to predict", context,
                 context == 1 ? "" : "s");
        return -1;
    }
    /* one step: what both plans take, within the window and the buffers' limits */
    int64_t chunk = de->plan.max_tokens < dr->plan.max_tokens ? de->plan.max_tokens : dr->plan.max_tokens;
    int64_t by_bytes = (int64_t)(KC_QC_MAX_CHUNK_BYTES / ((size_t)vocab * sizeof(float)));
    if (chunk > res->window) chunk = res->window;
    if (chunk > KC_QC_MAX_CHUNK) chunk = KC_QC_MAX_CHUNK;
    if (chunk > by_bytes) chunk = by_bytes;
    if (chunk < 1) chunk = 1;
    krt_session_opts so = {.max_seqs = 1, .max_context = res->window};
    eng->s = krt_session_new(eng->e, &so, d);
    ref->s = eng->s ? krt_session_new(ref->e, &so, d) : NULL;
    if (!ref->s) return -1;
    eng->logits = ks_xmalloc((size_t)chunk * (size_t)vocab * sizeof(float));
    ref->logits = ks_xmalloc((size_t)chunk * (size_t)vocab * sizeof(float));
    res->kl = ks_xmalloc((res->text_tokens - 1) * sizeof *res->kl);
    if (run_windows(eng, ref, vocab, (int)chunk, res, d) != 0) return -1;
    summarize(eng, ref, res);
    return 0;
}

int kc_cmd_quant_check(int argc, char **argv)
{
    const char *reference = NULL, *text_path = NULL, *max_kl_arg = NULL, *window_arg = NULL, *json = NULL;
    kc_option opts[] = {
        {"--reference", 1, &reference, NULL},
        {"--text", 1, &text_path, NULL},
        {"--max-kl", 1, &max_kl_arg, NULL},
        {"--window", 1, &window_arg, NULL},
        {"--json", 0, &json, NULL},
        {NULL, 0, NULL, NULL},
    };
    const char *pos[1];
    int npos = 0;
    int rc = kc_parse_args(argc, argv, opts, pos, 1, &npos, quant_check_help);
    if (rc) return rc < 0 ? 2 : 0;
    if (npos != 1 || !reference || !text_path) {
        fprintf(stderr, "kiln quant-check: error: needs an engine, --reference REF_ENGINE and --text FILE (see "
                        "'kiln quant-check --help')\n");
        return 2;
    }
    double max_kl = 0;
    int64_t window = 0;
    if (max_kl_arg && kc_parse_number("quant-check", "--max-kl", max_kl_arg, 0, 1e9, &max_kl)) return 2;
    if (window_arg && kc_parse_int("quant-check", "--window", window_arg, 2, KRT_MAX_CONTEXT, &window)) return 2;

    ks_diag d = {0};
    if (ks_is_dir(text_path)) {
        ks_error(&d, text_path, "is a directory; --text names the text to score");
        return 1;
    }
    size_t len = 0;
    char *text = ks_read_file(&d, text_path, &len);
    if (!text) return 1;
    if (len == 0) {
        ks_error(&d, text_path, "the text is empty; --text names the text to score (at least 2 tokens)");
        free(text);
        return 1;
    }
    qc_side eng = {.path = pos[0]}, ref = {.path = reference};
    qc_result res = {0};
    if (quant_check(&eng, &ref, text_path, text, len, window, &res, &d) == 0) {
        if (print_result(&res, eng.path, ref.path, text_path, json != NULL) != 0) {
            d.errors++;
        } else if (fflush(stdout) != 0) {
            fprintf(stderr, "kiln quant-check: error: cannot write the results to standard output\n");
            d.errors++;
        } else if (max_kl_arg && res.mean_kl > max_kl) {
            fprintf(stderr, "kiln quant-check: mean KL %.6g exceeds --max-kl %s\n", res.mean_kl, max_kl_arg);
            d.errors++;
        }
    }
    free(res.kl);
    side_free(&eng);
    side_free(&ref);
    free(text);
    return d.errors ? 1 : 0;
}
