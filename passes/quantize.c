/*
 * quantize.c — matmuls over float weights become matmuls over quantized
 * ones (--quant): the codes, scales and zero points of ir/ir.h's
 * "quantized weights", computed at build time by round to nearest
 * (passes/quantize_weight.h).
 *
 * Requires: a verified graph; after fuse_sibling_matmuls (a merged Q, K, V
 *   weight is quantized as one: its rows' blocks are the blocks its
 *   sources' rows would have).
 * Guarantees: with opt->quant a scheme (a KIR_QUANT_* word but NONE), each MATMUL
 *   whose weight is a float WEIGHT [N,K] (plain or derived) becomes
 *       %c = weight() {name="W#codes", <W's recipe>, quant="codes", qtype=…, group=g, asym=…}
 *       %s = weight() {name="W#scale", …, quant="scale"}
 *       %z = weight() {name="W#zero", …, quant="zero"}          (asym only)
 *       matmul(x, %c, %s[, %z]) {quant=<scheme>}                where it was, its attributes kept
 *   where <W's recipe> is W's derive, sources, rows and offset (a plain W:
 *   derive="concat0", sources="W", rows=[N]). Schemes:
 *       w4a16  u4 codes, f16 scales in groups of opt->quant_group columns
 *              (default 128), zero points unless opt->quant_asym is -1;
 *       w8a16  i8 codes, f16 scales a row (a group when quant_group is
 *              given); u8 codes with zero points when quant_asym is 1;
 *       fp8    f8e4m3 codes, f32 scales a row; x quantized to fp8 a token
 *              at a time in the matmul;
 *       w8a8   i8 codes, f32 scales a row; x quantized to i8 a token at a
 *              time.
 *   Left as they are: the embedding and the matmul whose value the graph's
 *   output is (the lm_head, through views and elementwise ops: a logit
 *   soft-cap), a matmul one of whose weights' names (a merged weight's
 *   sources too) matches a glob of opt->quant_skip ('*' and '?'; '[' is itself), and expert_matmul.
 *   A K that the group does not divide is the user's error, naming the
 *   weight. A skip pattern no weight matches is a warning.
 *   With opt->quant_smooth AWQ or SMOOTHQUANT (--calib), a quantized matmul
 *   whose x is an rms_norm that nothing else reads, over a plain gain
 *   weight G, has its input channels smoothed: its parts get smooth=<word>
 *   (their float matrix is W's columns times the smoothing vector s, which
 *   the engine builder computes from the calibration, compiler/smooth.c),
 *   and the norm reads instead
 *       %g = weight() {name="G#smooth", derive="smooth", sources="G", rows=[K], smooth_of="W"}
 *   G / s, so that x w^T is unchanged up to the codes' rounding: the
 *   channels with large inputs get finer steps (AWQ) or the inputs' range
 *   moves into the weights (SmoothQuant, for w8a8's quantized x). Other
 *   matmuls (o and down projections) are not smoothed.
 * Does not: drop the float weights it replaced (eliminate_dead_nodes does),
 *   or look at the data (the engine builder quantizes it).
 */
#include <stdlib.h>
#include <string.h>

#include "passes/pipeline.h"
#include "passes/rewrite.h"

/* How a scheme stores its weights. */
typedef struct scheme {
    kir_dtype codes, scale;
    int64_t group; /* 0: K (a scale a row) */
    int asym;
} scheme;

static scheme scheme_of(const kp_options *opt)
{
    scheme s = {KIR_F32, KIR_F32, opt->quant_group, 0};
    switch (opt->quant) {
    case KIR_QUANT_W4A16:
        s = (scheme){KIR_U4, KIR_F16, opt->quant_group ? opt->quant_group : 128, opt->quant_asym >= 0};
        break;
    case KIR_QUANT_W8A16:
        s = (scheme){opt->quant_asym == 1 ? KIR_U8 : KIR_I8, KIR_F16, opt->quant_group, opt->quant_asym == 1};
        break;
    case KIR_QUANT_FP8: s = (scheme){KIR_F8E4M3, KIR_F32, opt->quant_group, 0}; break;
    case KIR_QUANT_W8A8: s = (scheme){KIR_I8, KIR_F32, 0, 0}; break;
    default: KS_UNREACHABLE();
    }
    return s;
}

/* The matmuls the graph's outputs are, through one-operand ops (views, a soft-cap): lm_heads. */
static void mark_heads(const kir_graph *g, uint8_t *head)
{
    for (size_t i = 0; i < g->n_nodes; i++) {
        if (g->nodes[i].op != KIR_OP_OUTPUT) continue;
        kir_val v = g->nodes[i].in[0];
        while (v != KIR_NONE && g->nodes[v].op != KIR_OP_MATMUL && g->nodes[v].nin == 1) v = g->nodes[v].in[0];
        if (v != KIR_NONE && g->nodes[v].op == KIR_OP_MATMUL) head[v] = 1;
    }
}

/* Whether name matches glob: '*' any run of characters, '?' any one, every other character itself
 * ('[' too: the description's names index layers, wq[0]). */
static int glob_match(const char *glob, const char *name)
{
    for (; *glob; glob++, name++) {
        if (*glob == '*') {
            for (const char *rest = name;; rest++) {
                if (glob_match(glob + 1, rest)) return 1;
                if (!*rest) return 0;
            }
        }
        if (!*name || (*glob != '?' && *glob != *name)) return 0;
    }
    return !*name;
}

/* The names weight w's data comes from: its recipe's sources, or its own. */
static void each_source(const kir_graph *g, kir_val w, ks_buf *names)
{
    const char *src = kir_attr_has(g, w, KIR_A_WEIGHT_DERIVE) ? kir_attr_str(g, w, KIR_A_WEIGHT_SOURCES) : NULL;
    ks_buf_clear(names);
    ks_buf_puts(names, src ? src : kir_attr_str(g, w, KIR_A_WEIGHT_NAME));
}

/* Whether a skip pattern matches w's name or one of its sources'; counts each pattern's matches. */
static int skipped(const kir_graph *g, kir_val w, const kp_options *opt, size_t *hits, ks_buf *names)
{
    each_source(g, w, names);
    int skip = 0;
    for (size_t p = 0; p < opt->n_quant_skip; p++) {
        int hit = glob_match(opt->quant_skip[p], kir_attr_str(g, w, KIR_A_WEIGHT_NAME));
        char *list = (char *)ks_buf_cstr(names);
        for (char *name = list; !hit && name;) {
            char *comma = strchr(name, ',');
            if (comma) *comma = 0;
            hit = glob_match(opt->quant_skip[p], name);
            if (comma) *comma = ',';
            name = comma ? comma + 1 : NULL;
        }
        hits[p] += hit;
        skip |= hit;
    }
    return skip;
}

/* One part of W's quantization: a WEIGHT with W's recipe (smooth: the smoothing of its columns, or NONE). */
static kir_val emit_part(kp_rewriter *rw, const kir_graph *g, kir_val w, const scheme *s, int64_t group, kir_word part,
                         kir_word smooth)
{
    const kir_node *wn = kir_node_at(g, w);
    const char *name = kir_attr_str(g, w, KIR_A_WEIGHT_NAME);
    static const char *const suffix[] = {"#codes", "#scale", "#zero"};
    int which = part == KIR_QUANT_PART_CODES ? 0 : part == KIR_QUANT_PART_SCALE ? 1 : 2;
    ks_buf pname = {0};
    ks_buf_printf(&pname, "%s%s", name, suffix[which]);
    int64_t dims[2] = {wn->dims[0], wn->dims[1]};
    kir_dtype t = s->codes;
    if (which) dims[1] /= group, t = which == 1 ? s->scale : KIR_U8;
    kir_val p = kir_weight(rw->g, ks_buf_cstr(&pname), t, 2, dims, wn->loc);
    ks_buf_free(&pname);
    if (kir_attr_has(g, w, KIR_A_WEIGHT_DERIVE)) {
        kir_attr_set_word(rw->g, p, KIR_A_WEIGHT_DERIVE, kir_attr_word(g, w, KIR_A_WEIGHT_DERIVE));
        kir_attr_set_str(rw->g, p, KIR_A_WEIGHT_SOURCES, kir_attr_str(g, w, KIR_A_WEIGHT_SOURCES));
        uint32_t n = 0;
        const int64_t *rows = kir_attr_ints(g, w, KIR_A_WEIGHT_ROWS, &n);
        kir_attr_set_ints(rw->g, p, KIR_A_WEIGHT_ROWS, rows, n);
        if (kir_attr_has(g, w, KIR_A_WEIGHT_OFFSET))
            kir_attr_set_float(rw->g, p, KIR_A_WEIGHT_OFFSET, kir_attr_float(g, w, KIR_A_WEIGHT_OFFSET));
    } else {
        kir_attr_set_word(rw->g, p, KIR_A_WEIGHT_DERIVE, KIR_DERIVE_CONCAT0);
        kir_attr_set_str(rw->g, p, KIR_A_WEIGHT_SOURCES, name);
        kir_attr_set_ints(rw->g, p, KIR_A_WEIGHT_ROWS, &wn->dims[0], 1);
    }
    kir_attr_set_word(rw->g, p, KIR_A_WEIGHT_QUANT, part);
    kir_attr_set_str(rw->g, p, KIR_A_WEIGHT_QTYPE, kir_dtype_name(s->codes));
    kir_attr_set_int(rw->g, p, KIR_A_WEIGHT_GROUP, group);
    if (s->asym) kir_attr_set_int(rw->g, p, KIR_A_WEIGHT_ASYM, 1);
    if (smooth != KIR_SMOOTH_NONE) kir_attr_set_word(rw->g, p, KIR_A_WEIGHT_SMOOTH, smooth);
    return p;
}

/* The norm's gain divided by the smoothing of the quantized weight w (the norm's one reader's). */
static kir_val emit_smoothed_gain(kp_rewriter *rw, const kir_graph *g, kir_val gain, kir_val w)
{
    const kir_node *gn = kir_node_at(g, gain);
    const char *name = kir_attr_str(g, gain, KIR_A_WEIGHT_NAME);
    ks_buf pname = {0};
    ks_buf_printf(&pname, "%s#smooth", name);
    kir_val p = kir_weight(rw->g, ks_buf_cstr(&pname), gn->dtype, gn->ndim, gn->dims, gn->loc);
    ks_buf_free(&pname);
    kir_attr_set_word(rw->g, p, KIR_A_WEIGHT_DERIVE, KIR_DERIVE_SMOOTH);
    kir_attr_set_str(rw->g, p, KIR_A_WEIGHT_SOURCES, name);
    kir_attr_set_ints(rw->g, p, KIR_A_WEIGHT_ROWS, &gn->dims[0], 1);
    kir_attr_set_str(rw->g, p, KIR_A_WEIGHT_SMOOTH_OF, kir_attr_str(g, w, KIR_A_WEIGHT_NAME));
    return p;
}

/* The rms_norm x of matmul v when v's weight can be smoothed through it: x read by v alone, its gain
 * a plain float WEIGHT of one dim; else KIR_NONE. */
static kir_val smoothing_norm(const kir_graph *g, kir_val v, const kp_uses *uses)
{
    const kir_val x = g->nodes[v].in[0];
    const kir_node *xn = kir_node_at(g, x);
    if (xn->op != KIR_OP_RMS_NORM || xn->nin < 2 || xn->in[1] == KIR_NONE || kp_use_count(uses, x) != 1) return KIR_NONE;
    const kir_node *gn = kir_node_at(g, xn->in[1]);
    if (gn->op != KIR_OP_WEIGHT || gn->ndim != 1 || kir_attr_has(g, xn->in[1], KIR_A_WEIGHT_DERIVE) ||
        kir_dtype_is_quantized(gn->dtype))
        return KIR_NONE;
    return x;
}

int kp_quantize(kir_graph **gp, const kp_options *opt, kp_pass_stats *st, ks_diag *d)
{
    const kir_graph *g = *gp;
    st->fusions = 0;
    if (opt->quant >= KIR_WORD_COUNT || kir_word_table[opt->quant].set != KIR_SET_QUANT || opt->quant == KIR_QUANT_NONE)
        return 0;
    const scheme s = scheme_of(opt);
    uint8_t *head = ks_xcalloc(g->n_nodes ? g->n_nodes : 1, 1), *embedded = ks_xcalloc(g->n_nodes ? g->n_nodes : 1, 1);
    size_t *hits = ks_xcalloc(opt->n_quant_skip ? opt->n_quant_skip : 1, sizeof *hits);
    mark_heads(g, head);
    for (size_t i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == KIR_OP_EMBED) embedded[g->nodes[i].in[0]] = 1;
    ks_buf names = {0};
    /* the matmuls quantized, and the norms that smooth one (smoothed[norm]: its matmul) */
    const size_t nn = g->n_nodes ? g->n_nodes : 1;
    const int smoothing = opt->quant_smooth == KIR_SMOOTH_AWQ || opt->quant_smooth == KIR_SMOOTH_SMOOTHQUANT;
    uint8_t *eligible = ks_xcalloc(nn, 1);
    kir_val *smoothed = ks_xmalloc(sizeof *smoothed * nn);
    for (size_t v = 0; v < g->n_nodes; v++) smoothed[v] = KIR_NONE;
    kp_uses uses;
    kp_uses_build(&uses, g);
    for (kir_val v = 0; v < g->n_nodes; v++) {
        const kir_node *n = kir_node_at(g, v);
        kir_val w = n->op == KIR_OP_MATMUL ? n->in[1] : KIR_NONE;
        eligible[v] = w != KIR_NONE && n->nin == 2 && g->nodes[w].op == KIR_OP_WEIGHT &&
                      !kir_dtype_is_quantized(g->nodes[w].dtype) && !head[v] && !embedded[w];
        if (eligible[v] && skipped(g, w, opt, hits, &names)) eligible[v] = 0;
        const kir_val norm = eligible[v] && smoothing ? smoothing_norm(g, v, &uses) : KIR_NONE;
        if (norm != KIR_NONE) smoothed[norm] = v;
    }
    kp_rewriter rw;
    kp_rw_begin(&rw, g);
    int rc = 0;
    for (kir_val v = 0; v < g->n_nodes; v++) {
        const kir_node *n = kir_node_at(g, v);
        if (smoothed[v] != KIR_NONE) { /* the norm over the smoothed gain */
            kir_val in[KIR_MAX_INPUTS];
            for (int i = 0; i < n->nin; i++) in[i] = n->in[i] == KIR_NONE ? KIR_NONE : rw.map[n->in[i]];
            in[1] = emit_smoothed_gain(&rw, g, n->in[1], g->nodes[smoothed[v]].in[1]);
            kp_rw_rebuild(&rw, v, in, n->nin, NULL, 0);
            continue;
        }
        if (!eligible[v]) {
            kp_rw_copy(&rw, v);
            continue;
        }
        kir_val w = n->in[1];
        const kir_word smooth = smoothed[n->in[0]] == v ? opt->quant_smooth : KIR_SMOOTH_NONE;
        const kir_node *wn = kir_node_at(g, w);
        int64_t group = s.group ? s.group : wn->dims[1];
        if (wn->dims[1] % group) {
            ks_error(d, opt->what ? opt->what : "kiln",
                     "--quant %s: weight '%s' has %lld columns (inputs), which groups of %lld do not divide: choose "
                     "--quant-group to divide it, or leave it in 16 bits with --quant-skip '%s'",
                     kir_word_table[opt->quant].text, kir_attr_str(g, w, KIR_A_WEIGHT_NAME), (long long)wn->dims[1],
                     (long long)group, kir_attr_str(g, w, KIR_A_WEIGHT_NAME));
            rc = -1;
            break;
        }
        kir_val in[4] = {rw.map[n->in[0]], emit_part(&rw, g, w, &s, group, KIR_QUANT_PART_CODES, smooth),
                         emit_part(&rw, g, w, &s, group, KIR_QUANT_PART_SCALE, smooth),
                         s.asym ? emit_part(&rw, g, w, &s, group, KIR_QUANT_PART_ZERO, smooth) : KIR_NONE};
        kir_setting set = KIR_WITH_WORD(KIR_A_MATMUL_QUANT, opt->quant);
        kp_rw_rebuild(&rw, v, in, s.asym ? 4 : 3, &set, 1);
        st->fusions++;
    }
    kir_graph *out = kp_rw_end(&rw);
    for (size_t p = 0; rc == 0 && p < opt->n_quant_skip; p++)
        if (!hits[p])
            ks_warning(d, opt->what ? opt->what : "kiln", "--quant-skip '%s' matches no weight a matmul quantizes",
                       opt->quant_skip[p]);
    ks_buf_free(&names);
    free(eligible);
    kp_uses_free(&uses);
    free(smoothed);
    free(head);
    free(embedded);
    free(hits);
    if (rc) {
        kir_graph_free(out);
        return -1;
    }
    kir_graph_free(*gp);
    *gp = out;
    return 0;
}
