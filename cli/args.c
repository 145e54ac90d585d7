/* args.c — the argument parser the subcommands share. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/commands.h"

static int option_matches(const char *spec, const char *arg)
{
    const char *bar = strchr(spec, '|');
    if (!bar) return strcmp(spec, arg) == 0;
    size_t n = (size_t)(bar - spec);
    return (strlen(arg) == n && strncmp(spec, arg, n) == 0) || strcmp(bar + 1, arg) == 0;
}

int kc_parse_args(int argc, char **argv, const kc_option *opts, const char **positional, int max_pos,
                  int *n_pos, const char *help)
{
    *n_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(help, stdout);
            return 1;
        }
        if (a[0] == '-' && a[1]) {
            const kc_option *o = opts;
            while (o->name && !option_matches(o->name, a)) o++;
            if (!o->name) {
                fprintf(stderr, "kiln %s: error: unknown option '%s' (see 'kiln %s --help')\n", argv[0], a, argv[0]);
                return -1;
            }
            if (o->takes_value) {
                if (i + 1 >= argc) {
                    fprintf(stderr, "kiln %s: error: option '%s' needs a value\n", argv[0], a);
                    return -1;
                }
                if (o->takes_value == KC_REPEAT) {
                    if (*o->count >= KC_MAX_REPEAT) {
                        fprintf(stderr, "kiln %s: error: option '%s' given more than %d times\n", argv[0], a,
                                KC_MAX_REPEAT);
                        return -1;
                    }
                    o->value[(*o->count)++] = argv[++i];
                    continue;
                }
                *o->value = argv[++i];
            } else {
                *o->value = "1";
            }
            continue;
        }
        if (*n_pos >= max_pos) {
            fprintf(stderr, "kiln %s: error: unexpected argument '%s'\n", argv[0], a);
            return -1;
        }
        positional[(*n_pos)++] = a;
    }
    return 0;
}

int kc_check_output_file(const char *path, const char *opt, const char *what)
{
    struct stat st;
    size_t n = strlen(path);
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        fprintf(stderr, "%s: error: is a directory; %s names %s\n", path, opt, what);
        return -1;
    }
    if (n && path[n - 1] == '/') {
        fprintf(stderr, "%s: error: names a directory (it ends with '/'); %s names %s\n", path, opt, what);
        return -1;
    }
    return 0;
}

int kc_check_output_dir(const char *path, const char *opt, const char *what)
{
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "%s: error: not a directory; %s names %s\n", path, opt, what);
        return -1;
    }
    return 0;
}

/* s is decimal digits, after a '-' when negative is allowed: what strtoll and
 * strtoull would otherwise also take (spaces, '+', a wrapped "-1") is not. */
static int is_integer_text(const char *s, int negative)
{
    if (negative && *s == '-') s++;
    if (!*s) return 0;
    for (; *s; s++)
        if (*s < '0' || *s > '9') return 0;
    return 1;
}

int kc_parse_int(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = is_integer_text(s, lo < 0) ? strtoll(s, &end, 10) : 0;
    if (!is_integer_text(s, lo < 0) || errno || v < lo || v > hi) {
        fprintf(stderr, "kiln %s: error: %s: '%s' is not an integer from %" PRId64 " to %" PRId64 "\n", cmd, opt, s,
                lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int kc_parse_u64(const char *cmd, const char *opt, const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = is_integer_text(s, 0) ? strtoull(s, &end, 10) : 0;
    if (!is_integer_text(s, 0) || errno) {
        fprintf(stderr, "kiln %s: error: %s: '%s' is not an integer from 0 to %" PRIu64 "\n", cmd, opt, s,
                UINT64_MAX);
        return -1;
    }
    *out = v;
    return 0;
}

int kc_parse_number(const char *cmd, const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !(v >= lo && v <= hi)) {
        fprintf(stderr, "kiln %s: error: %s: '%s' is not a number in [%g, %g]\n", cmd, opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}
