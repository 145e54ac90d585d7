/* cmd_run.c — `kiln run`: logits for given ids, then greedy generation. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "runtime/session.h"

static const char run_help[] =
    "usage: kiln run ENGINE --ids ID,ID,... [-n N] [--logits-out FILE]\n"
    "\n"
    "Run the ids as one sequence (one step), write the logits of every input\n"
    "position, then generate N tokens greedily through the KV cache and print\n"
    "their ids on standard output, separated by spaces.\n"
    "\n"
    "  --ids LIST          comma-separated token ids (the prompt)\n"
    "  -n N                tokens to generate (default 0)\n"
    "  --logits-out FILE   float32 little-endian logits [len(ids), vocab]\n";

/* Parse "1,5,9" into ids; reports the place of a bad entry. */
static int parse_ids(const char *s, int32_t **out, int *n)
{
    size_t cap = 16;
    int32_t *ids = malloc(cap * sizeof *ids);
    *n = 0;
    const char *p = s;
    for (;;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "kiln run: error: --ids: bad token id at character %d of '%s'\n", (int)(p - s) + 1, s);
            free(ids);
            return -1;
        }
        if ((size_t)*n == cap) {
            cap *= 2;
            ids = realloc(ids, cap * sizeof *ids);
            if (!ids) return -1;
        }
        ids[(*n)++] = (int32_t)v;
        if (!*end) break;
        p = end + 1;
    }
    *out = ids;
    return 0;
}

int kc_cmd_run(int argc, char **argv)
{
    const char *ids_arg = NULL, *n_arg = NULL, *logits_out = NULL;
    kc_option opts[] = {
        {"--ids", 1, &ids_arg}, {"-n", 1, &n_arg}, {"--logits-out", 1, &logits_out}, {NULL, 0, NULL},
    };
    const char *pos[1];
    int npos = 0;
    int rc = kc_parse_args(argc, argv, opts, pos, 1, &npos, run_help);
    if (rc) return rc < 0 ? 2 : 0;
    if (npos != 1 || !ids_arg) {
        fprintf(stderr, "kiln run: error: needs an engine and --ids (see 'kiln run --help')\n");
        return 2;
    }
    long n_new = 0;
    if (n_arg) {
        char *end;
        n_new = strtol(n_arg, &end, 10);
        if (*end || n_new < 0 || n_new > 1000000) {
            fprintf(stderr, "kiln run: error: -n: '%s' is not a token count\n", n_arg);
            return 2;
        }
    }
    int32_t *ids = NULL;
    int n_ids = 0;
    if (parse_ids(ids_arg, &ids, &n_ids)) return 2;

    ks_diag d = {0};
    krt_engine *e = krt_engine_open(pos[0], &d);
    krt_session *s = e ? krt_session_new(e, NULL, &d) : NULL;
    float *logits = NULL;
    if (s && n_ids + n_new > krt_session_max_context(s)) {
        ks_error(&d, pos[0], "%d prompt tokens and %ld new ones exceed the context of %d", n_ids, n_new,
                 krt_session_max_context(s));
    }
    if (s && !d.errors && krt_session_seq_add(s, 0, &d) == 0) {
        int64_t vocab = krt_session_vocab(s);
        logits = malloc(sizeof(float) * (size_t)vocab * (size_t)n_ids);
        int32_t *seq = calloc((size_t)n_ids, sizeof *seq);
        if (krt_session_step(s, n_ids, ids, seq, logits, &d) == 0) {
            if (logits_out) {
                ks_outfile f;
                if (ks_outfile_open(&d, &f, logits_out) == 0) {
                    fwrite(logits, sizeof(float), (size_t)vocab * (size_t)n_ids, f.f);
                    ks_outfile_commit(&d, &f);
                }
            }
            int32_t next = krt_argmax(logits + (size_t)(n_ids - 1) * (size_t)vocab, vocab);
            for (long i = 0; i < n_new && !d.errors; i++) {
                printf("%s%d", i ? " " : "", next);
                fflush(stdout);
                if (i + 1 == n_new) break;
                int32_t zero = 0;
                if (krt_session_step(s, 1, &next, &zero, logits, &d) != 0) break;
                next = krt_argmax(logits, vocab);
            }
            if (n_new) printf("\n");
        }
        free(seq);
    }
    free(logits);
    free(ids);
    krt_session_free(s);
    krt_engine_close(e);
    return d.errors ? 1 : 0;
}
