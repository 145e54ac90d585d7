/*
 * generate.c — the smallest deployment of a kiln engine: open it, generate
 * text from a prompt, print it as it comes. Copy this file and build it
 * against an installed kiln (README, "Deploying an engine"):
 *
 *     cc generate.c $(pkg-config --cflags --libs kiln) -o kiln-generate
 *
 * usage: kiln-generate ENGINE PROMPT [MAX_NEW_TOKENS]
 */
#include <stdio.h>
#include <stdlib.h>

#include <kiln.h>

static int print_piece(void *ctx, const char *text, size_t len)
{
    (void)ctx;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0; /* go on */
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s ENGINE PROMPT [MAX_NEW_TOKENS]\n", argv[0]);
        return 2;
    }
    char err[1024];
    kiln_engine *e = kiln_engine_open(argv[1], err, sizeof err);
    if (!e) {
        fputs(err, stderr);
        return 1;
    }
    kiln_session *s = kiln_session_new(e, NULL, err, sizeof err);
    if (!s) {
        fputs(err, stderr);
        kiln_engine_close(e);
        return 1;
    }
    kiln_generate_opts o = kiln_generate_defaults(); /* greedy */
    o.max_new = argc > 3 ? atoi(argv[3]) : 64;
    fputs(argv[2], stdout);
    int n = kiln_generate(s, 0, argv[2], &o, print_piece, NULL, err, sizeof err);
    putchar('\n');
    if (n < 0) fputs(err, stderr);
    kiln_session_free(s);
    kiln_engine_close(e);
    return n < 0 ? 1 : 0;
}
