/*
 * fuzz_passes.c — the graph passes under fuzzing: parse the bytes as IR
 * text; if the graph verifies, run the whole pass pipeline with the
 * verifier after every pass, and abort() if a pass fails, makes a graph
 * that does not verify, or one whose text does not read back to the same
 * bytes. Then run each pass alone on the original graph, with the same
 * checks. Memory errors and leaks are the sanitizers' to catch.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "passes/pipeline.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static kir_graph *parse_quiet(const char *name, const char *text, size_t len)
{
    ks_diag d = {.quiet = 1};
    ks_source src = {name, text, len};
    return kir_parse(&src, &d);
}

/* Run passes (NULL: all) over a copy of g; abort on any failure. */
static void run_checked(const kir_graph *g, const char *passes)
{
    kir_graph *h = kir_graph_clone(g);
    ks_buf log = {0};
    ks_diag d = {.log = &log, .quiet = 1};
    kp_options opt = {.passes = passes ? &passes : NULL, .n_passes = 1, .verify = 1};
    if (kp_run_pipeline(&h, &opt, NULL, NULL, &d) != 0) {
        fprintf(stderr, "fuzz_passes: %s failed on a verified graph:\n%s", passes ? passes : "the pipeline",
                ks_buf_cstr(&log));
        abort();
    }
    ks_buf first = {0}, second = {0};
    kir_print(h, &first);
    kir_graph *back = parse_quiet("after.ir", ks_buf_cstr(&first), first.len);
    if (!back) {
        fprintf(stderr, "fuzz_passes: the text after %s does not parse:\n%s", passes ? passes : "the pipeline",
                first.data);
        abort();
    }
    kir_print(back, &second);
    if (first.len != second.len || memcmp(first.data, second.data, first.len) != 0) {
        fprintf(stderr, "fuzz_passes: print -> parse -> print differs after %s\n", passes ? passes : "the pipeline");
        abort();
    }
    kir_graph_free(back);
    kir_graph_free(h);
    ks_buf_free(&first);
    ks_buf_free(&second);
    ks_buf_free(&log);
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
    if (kir_verify(g, &d, "fuzz.ir") == 0) {
        run_checked(g, NULL);
        for (size_t i = 0; i < kp_pass_count; i++) run_checked(g, kp_passes[i].name);
    }
    kir_graph_free(g);
    return 0;
}
