/*
 * fuzz_ir.c — the IR text form under fuzzing: parse the bytes as IR text;
 * if they parse, verify (which checks the memory plan the text carries, if
 * any: ir/plan.h); then print, parse the print and print again, and abort()
 * if the two prints differ or the print does not parse. The round trip is
 * checked for every graph that parses, verified or not (a stronger property
 * than for verified graphs only: the printer and parser promise it for any
 * graph the parser builds). A verified graph with a plan must also give that
 * plan to kir_plan_read and pass kir_plan_check, and the plan written back
 * (kir_plan_annotate) into the graph without it must verify. Memory errors
 * and leaks are the sanitizers' to catch.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "ir/plan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Parse text quietly; NULL if it does not parse. */
static kir_graph *parse_quiet(const char *name, const char *text, size_t len)
{
    ks_diag d = {.quiet = 1};
    ks_source src = {name, text, len};
    return kir_parse(&src, &d);
}

/* A plan that kir_verify accepted reads, checks, and survives being
 * dropped and written back. */
static void check_plan(const kir_graph *g)
{
    ks_diag d = {.quiet = 1};
    kir_mem_plan p;
    if (kir_plan_read(g, &p, &d, "fuzz.ir") != 1) {
        fprintf(stderr, "fuzz_ir: a verified plan does not read\n");
        abort();
    }
    ks_buf why = {0};
    if (kir_plan_check(g, &p, &why, NULL) != 0) {
        fprintf(stderr, "fuzz_ir: a verified plan fails kir_plan_check: %s\n", ks_buf_cstr(&why));
        abort();
    }
    kir_graph *h = kir_graph_clone(g);
    kir_plan_drop(h);
    if (kir_has_plan(h) || kir_verify(h, &d, "dropped.ir") != 0) {
        fprintf(stderr, "fuzz_ir: the graph without its plan does not verify\n");
        abort();
    }
    kir_plan_annotate(h, &p);
    if (kir_verify(h, &d, "annotated.ir") != 0) {
        fprintf(stderr, "fuzz_ir: the plan written back does not verify\n");
        abort();
    }
    kir_graph_free(h);
    ks_buf_free(&why);
    kir_mem_plan_free(&p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = ks_xmalloc(size + 1);
    if (size) memcpy(text, data, size);
    text[size] = 0;
    kir_graph *g = parse_quiet("fuzz.ir", text, size);
    free(text);
    if (!g) return 0;

    ks_diag d = {.quiet = 1};
    if (kir_verify(g, &d, "fuzz.ir") == 0 && kir_has_plan(g)) check_plan(g);
    {
        ks_buf first = {0}, second = {0};
        kir_print(g, &first);
        kir_graph *h = parse_quiet("printed.ir", ks_buf_cstr(&first), first.len);
        if (!h) {
            fprintf(stderr, "fuzz_ir: printed text does not parse:\n%s", first.data);
            abort();
        }
        kir_print(h, &second);
        if (first.len != second.len || memcmp(first.data, second.data, first.len) != 0) {
            fprintf(stderr, "fuzz_ir: print -> parse -> print differs:\n%s---\n%s", first.data,
                    ks_buf_cstr(&second));
            abort();
        }
        kir_graph_free(h);
        ks_buf_free(&first);
        ks_buf_free(&second);
    }
    kir_graph_free(g);
    return 0;
}
