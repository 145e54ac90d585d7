/*
 * commands.h — the CLI's subcommands and the small argument parser they share.
 *
 * Prefix: kc_ (command line).
 */
#ifndef KILN_COMMANDS_H
#define KILN_COMMANDS_H

#include <stdint.h>

typedef struct kc_command {
    const char *name;               /* as typed */
    const char *summary;            /* one line for `kiln --help` */
    int (*run)(int argc, char **argv); /* argv[0] is the command name; returns the exit code */
} kc_command;

int kc_cmd_bench(int argc, char **argv);
int kc_cmd_build(int argc, char **argv);
int kc_cmd_ir(int argc, char **argv);
int kc_cmd_inspect(int argc, char **argv);
int kc_cmd_quant_check(int argc, char **argv);
int kc_cmd_run(int argc, char **argv);
int kc_cmd_serve(int argc, char **argv);
int kc_cmd_tokenize(int argc, char **argv);
int kc_cmd_verify(int argc, char **argv);
int kc_cmd_version(int argc, char **argv);

struct krt_session;
/* --profile's kernel tables of session s (kiln run, kiln bench) on stderr, each rate as a fraction of
 * ceiling TFLOP/s (0: none); on the interpreter, which keeps none, `who: profile: kernels are timed on
 * CUDA engines ...` and `tail` after it. */
void kc_print_kernel_profile(const struct krt_session *s, double ceiling, const char *who, const char *tail);

/* One option a command accepts. */
typedef struct kc_option {
    const char *name;    /* "--weights"; a short alias after '|' is allowed: "-o|--output" */
    int takes_value;     /* 1: the next argument is its value; KC_REPEAT: it may come again */
    const char **value;  /* where the value goes (or "1" for a flag); for KC_REPEAT an
                            array of KC_MAX_REPEAT, filled in order */
    int *count;          /* KC_REPEAT: how many values were given */
} kc_option;

enum { KC_REPEAT = 2, KC_MAX_REPEAT = 16 };

/* Parse argv against opts; the non-option arguments go to positional (at
 * most max_pos). Prints `kiln CMD: error: ...` and returns -1 on a bad
 * argument; returns 1 if --help was asked (after printing help). */
int kc_parse_args(int argc, char **argv, const kc_option *opts, const char **positional, int max_pos,
                  int *n_pos, const char *help);

/* Option values. An integer option takes decimal digits only (a '-' first
 * when lo < 0): not 1.5, 1e3, 0x10 or ' 5'. Each prints `kiln CMD: error:
 * OPT: 'S' is not an integer from LO to HI` (or `is not a number in [LO,
 * HI]`) and returns -1, or stores the value and returns 0. */
int kc_parse_int(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out);
int kc_parse_u64(const char *cmd, const char *opt, const char *s, uint64_t *out); /* 0 to 2^64-1: seeds */
int kc_parse_number(const char *cmd, const char *opt, const char *s, double lo, double hi, double *out);

/* An output option's value must name a file to write: a directory (or a
 * path ending in '/') is reported as `PATH: error: is a directory; OPT names
 * WHAT` before any work is done. 0, or -1 after reporting. */
int kc_check_output_file(const char *path, const char *opt, const char *what);
/* A folder option's value, when it exists, must be a folder. 0, or -1 after reporting. */
int kc_check_output_dir(const char *path, const char *opt, const char *what);

#endif
