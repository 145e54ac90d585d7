/*
 * ir_test.h — IR helpers the IR and pass tests share: parsing into a
 * captured log, printing to a string, and structural equality of two graphs
 * (the checks themselves are tests/check.h's). Each test file holds its own
 * inputs and expected outputs.
 */
#ifndef KILN_TESTS_IR_TEST_H
#define KILN_TESTS_IR_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

/* Parse text named `name`; messages go to *log only. */
static inline kir_graph *kt_parse(const char *name, const char *text, ks_buf *log)
{
    ks_diag d = {.log = log, .quiet = 1};
    ks_source src = {name, text, strlen(text)};
    return kir_parse(&src, &d);
}

/* Print g into a fresh heap string (caller frees with free()). */
static inline char *kt_print(const kir_graph *g)
{
    ks_buf b = {0};
    kir_print(g, &b);
    ks_buf_cstr(&b);
    return b.data;
}

static inline int kt_double_same(double a, double b)
{
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return a == b && signbit(a) == signbit(b);
}

static inline int kt_attr_equal(const kir_attr *a, const kir_attr *b)
{
    if (strcmp(a->key, b->key) != 0 || a->kind != b->kind) return 0;
    switch (a->kind) {
    case KIR_ATTR_INT: return a->u.i == b->u.i;
    case KIR_ATTR_FLOAT: return kt_double_same(a->u.f, b->u.f);
    case KIR_ATTR_STR: return strcmp(a->u.s, b->u.s) == 0;
    case KIR_ATTR_INTS:
        if (a->u.ints.n != b->u.ints.n) return 0;
        for (uint32_t i = 0; i < a->u.ints.n; i++)
            if (a->u.ints.v[i] != b->u.ints.v[i]) return 0;
        return 1;
    case KIR_ATTR_FLOATS:
        if (a->u.floats.n != b->u.floats.n) return 0;
        for (uint32_t i = 0; i < a->u.floats.n; i++)
            if (!kt_double_same(a->u.floats.v[i], b->u.floats.v[i])) return 0;
        return 1;
    }
    return 0;
}

/* Same file name and position, or both unknown. */
static inline int kt_loc_equal(const kir_graph *a, kir_loc la, const kir_graph *b, kir_loc lb)
{
    int ka = la.file < a->n_files, kb = lb.file < b->n_files;
    if (ka != kb) return 0;
    if (!ka) return 1;
    return strcmp(a->files[la.file], b->files[lb.file]) == 0 && la.line == lb.line && la.col == lb.col;
}

/* Structural equality: name, params in order, and every node's op, type,
 * operands, attributes in order and location. Reports the first difference. */
static inline int kt_graph_equal(const kir_graph *a, const kir_graph *b)
{
    if (strcmp(a->name, b->name) != 0) {
        fprintf(stderr, "graph names differ: %s vs %s\n", a->name, b->name);
        return 0;
    }
    if (a->n_params != b->n_params) {
        fprintf(stderr, "param counts differ: %zu vs %zu\n", a->n_params, b->n_params);
        return 0;
    }
    for (size_t i = 0; i < a->n_params; i++) {
        const kir_param *p = &a->params[i], *q = &b->params[i];
        int same = strcmp(p->name, q->name) == 0 && p->kind == q->kind;
        if (same && p->kind == KIR_ATTR_INT) same = p->i == q->i;
        if (same && p->kind == KIR_ATTR_FLOAT) same = kt_double_same(p->f, q->f);
        if (same && p->kind == KIR_ATTR_STR) same = strcmp(p->s, q->s) == 0;
        if (same && p->kind == KIR_ATTR_INTS)
            same = p->ints.n == q->ints.n && (p->ints.n == 0 || memcmp(p->ints.v, q->ints.v, p->ints.n * sizeof *p->ints.v) == 0);
        if (same && p->kind == KIR_ATTR_FLOATS) {
            same = p->floats.n == q->floats.n;
            for (uint32_t k = 0; same && k < p->floats.n; k++) same = kt_double_same(p->floats.v[k], q->floats.v[k]);
        }
        if (!same) {
            fprintf(stderr, "param %zu differs (%s vs %s)\n", i, p->name, q->name);
            return 0;
        }
    }
    if (a->n_nodes != b->n_nodes) {
        fprintf(stderr, "node counts differ: %zu vs %zu\n", a->n_nodes, b->n_nodes);
        return 0;
    }
    for (size_t i = 0; i < a->n_nodes; i++) {
        const kir_node *n = &a->nodes[i], *m = &b->nodes[i];
        int same = n->op == m->op && n->dtype == m->dtype && n->ndim == m->ndim && n->nin == m->nin &&
                   n->nattrs == m->nattrs && kt_loc_equal(a, n->loc, b, m->loc);
        for (int k = 0; same && k < n->ndim; k++) same = n->dims[k] == m->dims[k];
        for (int k = 0; same && k < n->nin; k++) same = n->in[k] == m->in[k];
        for (uint32_t k = 0; same && k < n->nattrs; k++) same = kt_attr_equal(&n->attrs[k], &m->attrs[k]);
        if (!same) {
            fprintf(stderr, "node %%%zu differs\n", i);
            return 0;
        }
    }
    return 1;
}

#endif
