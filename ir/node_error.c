/*
 * node_error.c — errors about one node of a graph, at the place in the .kiln or IR text it came from.
 *
 * kir_verify, the memory planner, the interpreter and the CUDA code generator all report "this node is
 * wrong" the same way: at the node's place (`file:line:col: error: ...`, the source line and a caret) when it
 * has one, else at a name for the graph (`llama.ir: error: ...`). They differ only in how the message names
 * the node, so the caller chooses that (the lead) and this file does the rest.
 */
#include "ir/ir.h"

#include <stdarg.h>

const char *kir_graph_name(const kir_graph *g, const char *fallback)
{
    return g->name && g->name[0] ? g->name : fallback;
}

int kir_node_has_place(const kir_graph *g, kir_val v)
{
    const kir_node *n = kir_node_at(g, v);
    return n->loc.file < g->n_files && n->loc.line > 0;
}

int kir_node_verror(ks_diag *d, const kir_graph *g, kir_val v, const char *where, const char *lead,
                    const char *fmt, va_list ap)
{
    const kir_node *n = kir_node_at(g, v);
    ks_buf msg = KS_BUF_TRY; /* out of memory, the message is cut short, and says so */
    if (lead)
        ks_buf_puts(&msg, lead);
    else if (n->op < KIR_OP_COUNT)
        ks_buf_printf(&msg, "node %%%u (%s): ", (unsigned)v, kir_op_table[n->op].name);
    else
        ks_buf_printf(&msg, "node %%%u: ", (unsigned)v);
    ks_buf_vprintf(&msg, fmt, ap);
    const char *cut = msg.failed ? "... (the rest: out of memory)" : "";
    if (kir_node_has_place(g, v)) {
        ks_source src = {g->files[n->loc.file], NULL, 0};
        ks_error_at(d, &src, (int)n->loc.line, (int)n->loc.col, "%s%s", ks_buf_cstr(&msg), cut);
    } else {
        ks_error(d, where, "%s%s", ks_buf_cstr(&msg), cut);
    }
    ks_buf_free(&msg);
    return -1;
}

int kir_node_error(ks_diag *d, const kir_graph *g, kir_val v, const char *where, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kir_node_verror(d, g, v, where, NULL, fmt, ap);
    va_end(ap);
    return -1;
}

int kir_node_error_text(ks_diag *d, const kir_graph *g, kir_val v, const char *where, const char *text)
{
    const kir_node *n = kir_node_at(g, v);
    if (kir_node_has_place(g, v)) {
        ks_source src = {g->files[n->loc.file], NULL, 0};
        ks_error_at(d, &src, (int)n->loc.line, (int)n->loc.col, "%s", text);
    } else {
        ks_error(d, where, "%s", text);
    }
    return -1;
}
