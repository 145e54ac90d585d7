/* main.c — the kiln command line: a table of subcommands. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "support/support.h"

static const kc_command commands[] = {
    {"build", "compile a model into an engine file", kc_cmd_build},
    {"ir", "print the IR of a model", kc_cmd_ir},
    {"inspect", "say what an engine file holds", kc_cmd_inspect},
    {"run", "run an engine: generate text from a prompt, or logits for given ids", kc_cmd_run},
    {"serve", "answer OpenAI-style completion requests over HTTP, many at once", kc_cmd_serve},
    {"bench", "time an engine: time to first token by prompt length, decode per token", kc_cmd_bench},
    {"verify", "compare the fused build with the unfused one, value by value", kc_cmd_verify},
    {"quant-check", "score an engine against a reference engine on a text: KL, top-1, perplexity", kc_cmd_quant_check},
    {"tokenize", "print the token ids an engine's tokenizer gives a text", kc_cmd_tokenize},
    {"version", "print kiln's version and what it was built with (also: kiln --version)", kc_cmd_version},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: kiln COMMAND [ARGS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-11s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n'kiln COMMAND --help' describes each.\n");
}

int main(int argc, char **argv)
{
    /* Ctrl-C during a build removes the engine's temp file (support/cleanup.c) */
    ks_cleanup_on_signals();
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--version") == 0) return kc_cmd_version(argc - 1, argv + 1);
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kiln: error: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
