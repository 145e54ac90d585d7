/*
 * lower_unused.c — the checkpoint tensors no weight reads.
 *
 * Requires: every weight resolved against the checkpoint without error
 * (phase 2), so that each present instance names the tensor it reads.
 * Reports, and changes nothing:
 *  - an error when a layer weight's template (any alternative, whether or
 *    not the weight is enabled) names a tensor of the checkpoint for a layer
 *    at or past the `layers` param: the config's layer count is wrong, or
 *    the checkpoint belongs to another model. Pointed at the config value
 *    of `layers`, with the layer count the checkpoint holds;
 *  - a warning listing the other tensors nothing reads, grouped by name with
 *    their numbers as '*' ("model.layers.*.self_attn.q_proj.bias (2)"),
 *    leaving out those an `ignore` item names: buffers some checkpoints
 *    store and no model reads (GPT-2's attn.bias).
 * Templates match a tensor name with each {i} standing for one layer
 * number, written as expand() writes it (decimal, no leading zeros), the
 * same number for every {i} of the template.
 */
#include "frontend/lower.h"

#include <string.h>

/* ---- templates -------------------------------------------------------------------- */
static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* Whether name is template t with a layer number for each {i}; *layer gets
 * it (-1 when t has no {i}). */
static int match_template(const char *t, const char *name, int64_t *layer)
{
    int64_t at = -1;
    while (*t) {
        if (t[0] == '{' && t[1] == 'i' && t[2] == '}') {
            if (!is_digit(*name) || (name[0] == '0' && is_digit(name[1]))) return 0;
            int64_t v = 0;
            for (; is_digit(*name); name++) {
                if (v > (INT64_MAX - 9) / 10) return 0;
                v = v * 10 + (*name - '0');
            }
            if (at >= 0 && v != at) return 0;
            at = v;
            t += 3;
            continue;
        }
        if (*t++ != *name++) return 0;
    }
    if (*name) return 0;
    *layer = at;
    return 1;
}

/* An `ignore` string takes {i} and nothing else in braces. */
static int check_ignore(kf_lower *L, const kf_item *it, size_t k)
{
    const char *t = it->strings[k];
    for (size_t i = 0; t[i]; i++) {
        if (t[i] != '{' && t[i] != '}') continue;
        if (t[i] == '{' && t[i + 1] == 'i' && t[i + 2] == '}') {
            i += 2;
            continue;
        }
        kf_loc at = {it->string_locs[k].line, it->string_locs[k].col + 1 + (int)i};
        kf_error(L, at, "ignore: unexpected '%c' in \"%s\" (only {i}, any layer number, is a placeholder)", t[i], t);
        return -1;
    }
    return 0;
}

void kf_check_ignores(kf_lower *L, const kf_file *f)
{
    for (size_t i = 0; i < f->n_items; i++)
        if (f->items[i]->kind == KF_ITEM_IGNORE)
            for (size_t k = 0; k < f->items[i]->n_strings; k++) check_ignore(L, f->items[i], k);
}

/* The group of an unused name: its all-digit parts ('.'-separated) as '*'. */
static const char *group_of(kf_lower *L, const char *name)
{
    ks_buf b = {0};
    for (const char *p = name; *p;) {
        const char *end = strchr(p, '.');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        size_t d = 0;
        while (d < n && is_digit(p[d])) d++;
        if (n > 0 && d == n) ks_buf_put(&b, "*", 1);
        else ks_buf_put(&b, p, n);
        p += n;
        if (*p) ks_buf_put(&b, p++, 1);
    }
    const char *r = ks_arena_strdup(&L->scratch, ks_buf_cstr(&b));
    ks_buf_free(&b);
    return r;
}

/* Whether any instance of w stacks experts' tensors ({e}). */
static int has_expert_parts(const kf_weight *w)
{
    for (int64_t l = 0; l < w->n_inst; l++)
        if (w->inst[l].n_parts) return 1;
    return 0;
}

/* How many groups the warning lists before "and N more". */
enum { KF_UNUSED_SHOWN = 8 };

void kf_check_unused(kf_lower *L, const kf_file *f, kf_binding *const *bound)
{
    const kf_checkpoint *ck = L->ckpt;
    size_t n_tensors = kf_checkpoint_count(ck);
    /* What the weights read, and the templates of the layer weights. */
    size_t n_used = 0, n_templates = 0, n_ignore = 0;
    for (size_t i = 0; i < f->n_items; i++) {
        const kf_item *it = f->items[i];
        if (it->kind == KF_ITEM_IGNORE) n_ignore += it->n_strings;
        if (it->kind != KF_ITEM_WEIGHT || !bound[i]) continue;
        const kf_weight *w = bound[i]->weight;
        if (!w->ok) return; /* reported: the rest would be noise */
        n_used += (size_t)w->n_inst * (size_t)(has_expert_parts(w) ? w->dims[0] : 1);
        if (it->is_layer) n_templates += it->n_srcs;
    }
    ks_hmap used; /* the tensor names the weights read (support's map, in the scratch arena) */
    ks_hmap_init(&used, &L->scratch, n_used, n_used, "weight tensors");
    const char **templates = ks_arena_alloc(&L->scratch, (n_templates + 1) * sizeof *templates);
    const char **ignore = ks_arena_alloc(&L->scratch, (n_ignore + 1) * sizeof *ignore);
    n_templates = n_ignore = 0;
    for (size_t i = 0; i < f->n_items; i++) {
        const kf_item *it = f->items[i];
        if (it->kind == KF_ITEM_IGNORE)
            for (size_t k = 0; k < it->n_strings; k++) ignore[n_ignore++] = it->strings[k];
        if (it->kind != KF_ITEM_WEIGHT || !bound[i]) continue;
        const kf_weight *w = bound[i]->weight;
        for (int64_t l = 0; l < w->n_inst; l++) {
            const kf_weight_inst *in = &w->inst[l];
            if (in->present) ks_hmap_put_str(&used, in->tensor, strlen(in->tensor), NULL);
            for (int64_t e = 0; in->present && e < in->n_parts; e++)
                ks_hmap_put_str(&used, in->parts[e], strlen(in->parts[e]), NULL);
        }
        if (it->is_layer)
            for (size_t k = 0; k < it->n_srcs; k++) templates[n_templates++] = it->srcs[k]->tensor;
    }

    /* Past the last layer: the largest layer number and a tensor that has it. */
    int64_t past = -1;
    const char *past_name = NULL;
    /* The rest, grouped: groups[g] in order of first appearance, counts[g] tensors each. */
    ks_hmap groups; /* a group's name -> its index in group_names */
    ks_hmap_init(&groups, &L->scratch, n_tensors, n_tensors, "tensor groups");
    const char **group_names = ks_arena_alloc(&L->scratch, (n_tensors + 1) * sizeof *group_names);
    const char **group_first = ks_arena_alloc(&L->scratch, (n_tensors + 1) * sizeof *group_first);
    size_t *counts = ks_arena_alloc(&L->scratch, (n_tensors + 1) * sizeof *counts);
    size_t n_groups = 0, n_unused = 0;
    for (size_t t = 0; t < n_tensors; t++) {
        const char *name = kf_checkpoint_at(ck, t)->name;
        if (kf_checkpoint_at(ck, t)->decoded || ks_hmap_get_str(&used, name, strlen(name))) continue;
        int64_t layer = -1;
        int skip = 0;
        for (size_t k = 0; k < n_ignore && !skip; k++) skip = match_template(ignore[k], name, &layer);
        if (skip) continue;
        for (size_t k = 0; k < n_templates && !skip; k++)
            skip = match_template(templates[k], name, &layer) && layer >= L->n_layers;
        if (skip) {
            if (layer > past) {
                past = layer;
                past_name = name;
            }
            continue;
        }
        const char *g = group_of(L, name);
        int added;
        uint64_t *at = ks_hmap_put_str(&groups, g, strlen(g), &added);
        KS_ASSERT(at); /* the scratch arena does not fail, and the map has room for every tensor */
        if (added) {
            *at = n_groups;
            group_names[n_groups] = g;
            group_first[n_groups] = name;
            counts[n_groups++] = 0;
        }
        counts[*at]++;
        n_unused++;
    }

    if (past_name) {
        kf_binding *b = kf_lookup(L, "layers");
        KS_ASSERT(b && b->kind == KF_BIND_PARAM);
        kf_loc at = b->value.origin ? b->value.origin->loc : b->loc;
        kf_error_value(L, at, b->value, "the model has %lld layer%s, but the checkpoint has tensors for %lld (up to '%s')",
                       (long long)L->n_layers, L->n_layers == 1 ? "" : "s", (long long)past + 1, past_name);
        return;
    }
    if (n_unused == 0) return;
    ks_buf list = {0};
    for (size_t g = 0; g < n_groups && g < KF_UNUSED_SHOWN; g++) {
        if (g) ks_buf_puts(&list, ", ");
        if (counts[g] == 1) ks_buf_puts(&list, group_first[g]);
        else ks_buf_printf(&list, "%s (%zu)", group_names[g], counts[g]);
    }
    if (n_groups > KF_UNUSED_SHOWN) {
        size_t rest = 0;
        for (size_t g = KF_UNUSED_SHOWN; g < n_groups; g++) rest += counts[g];
        ks_buf_printf(&list, ", and %zu more", rest);
    }
    ks_warning(L->d, kf_checkpoint_path(ck), "the model does not use %zu of the checkpoint's tensors: %s", n_unused,
               ks_buf_cstr(&list));
    ks_buf_free(&list);
}
