/* cmd_build.c — `kiln build` and `kiln ir`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/driver.h"

static const char build_help[] =
    "usage: kiln build <model.kiln | checkpoint-folder> [--weights PATH] [--config FILE]\n"
    "                  [--target cpu] -o ENGINE\n"
    "\n"
    "Compile a model into a self-contained engine file.\n"
    "  A checkpoint folder holds config.json and model.safetensors (or a sharded\n"
    "  model.safetensors.index.json); its model_type picks the shipped description\n"
    "  (models/*.kiln). A .kiln input takes its weights from --weights.\n"
    "\n"
    "  -o, --output ENGINE  the engine file to write (written whole or not at all)\n"
    "  --weights PATH       checkpoint folder or .safetensors file for a .kiln input\n"
    "  --config FILE        config.json to use instead of the one beside the weights\n"
    "  --target cpu         what the engine runs on (default cpu)\n";

int kc_cmd_build(int argc, char **argv)
{
    kd_inputs in = {0};
    const char *out = NULL;
    kc_option opts[] = {
        {"-o|--output", 1, &out}, {"--weights", 1, &in.weights}, {"--config", 1, &in.config},
        {"--target", 1, &in.target}, {NULL, 0, NULL},
    };
    const char *pos[1];
    int npos = 0;
    int rc = kc_parse_args(argc, argv, opts, pos, 1, &npos, build_help);
    if (rc) return rc < 0 ? 2 : 0;
    if (npos != 1 || !out) {
        fprintf(stderr, "kiln build: error: needs a model and -o ENGINE (see 'kiln build --help')\n");
        return 2;
    }
    in.input = pos[0];
    ks_diag d = {0};
    kd_model m;
    if (kd_model_load(&in, 1, &m, &d) == 0) kd_write_engine(&in, &m, out, &d);
    kd_model_free(&m);
    return d.errors ? 1 : 0;
}

static const char ir_help[] =
    "usage: kiln ir <model.kiln | checkpoint-folder | file.ir> [--weights PATH] [--config FILE] [-o FILE]\n"
    "\n"
    "Print the model's IR in its text form (kiln's IR parses back from it).\n"
    "Given an IR text (.ir), parse and verify it, and print it again.\n"
    "Without weights, every declared weight is taken as present with its\n"
    "declared shape and optional ones as absent.\n"
    "\n"
    "  -o, --output FILE    write the IR here instead of standard output\n"
    "  --weights PATH       checkpoint, to resolve optional weights as a build would\n"
    "  --config FILE        config.json to use\n";

/* Parse and verify an IR text; NULL after reporting. */
static kir_graph *read_ir(const char *path, ks_diag *d)
{
    size_t len = 0;
    char *text = ks_read_file(d, path, &len);
    if (!text) return NULL;
    ks_source src = {path, text, len};
    kir_graph *g = kir_parse(&src, d);
    if (g && kir_verify(g, d, path) != 0) {
        kir_graph_free(g);
        g = NULL;
    }
    free(text);
    return g;
}

static void write_text(const char *out, const ks_buf *text, ks_diag *d)
{
    if (!out) {
        fwrite(text->data, 1, text->len, stdout);
        return;
    }
    ks_outfile f;
    if (ks_outfile_open(d, &f, out) == 0) {
        fwrite(text->data, 1, text->len, f.f);
        ks_outfile_commit(d, &f);
    }
}

static int ends_with_ir(const char *s)
{
    size_t n = strlen(s);
    return n > 3 && strcmp(s + n - 3, ".ir") == 0;
}

int kc_cmd_ir(int argc, char **argv)
{
    kd_inputs in = {0};
    const char *out = NULL;
    kc_option opts[] = {
        {"-o|--output", 1, &out}, {"--weights", 1, &in.weights}, {"--config", 1, &in.config}, {NULL, 0, NULL},
    };
    const char *pos[1];
    int npos = 0;
    int rc = kc_parse_args(argc, argv, opts, pos, 1, &npos, ir_help);
    if (rc) return rc < 0 ? 2 : 0;
    if (npos != 1) {
        fprintf(stderr, "kiln ir: error: needs a model (see 'kiln ir --help')\n");
        return 2;
    }
    in.input = pos[0];
    ks_diag d = {0};
    if (ends_with_ir(in.input)) {
        kir_graph *g = read_ir(in.input, &d);
        if (g) {
            ks_buf text = {0};
            kir_print(g, &text);
            write_text(out, &text, &d);
            ks_buf_free(&text);
            kir_graph_free(g);
        }
        return d.errors ? 1 : 0;
    }
    kd_model m;
    /* a checkpoint folder input has weights to consult; a bare .kiln may not */
    int need_weights = in.weights != NULL || !(in.input && ks_file_exists(in.input));
    if (kd_model_load(&in, need_weights, &m, &d) == 0) {
        ks_buf text = {0};
        kir_print(m.model->graph, &text);
        write_text(out, &text, &d);
        ks_buf_free(&text);
    }
    kd_model_free(&m);
    return d.errors ? 1 : 0;
}
