/*
 * test_random.c — a property test of the text form: random graphs of valid
 * ops (random shapes, attribute values within ir/ops.def's rules, names,
 * strings, params and locations) verify cleanly; then, with extra
 * attributes of any name and kind added (which the verifier refuses, but
 * the text form must carry), print -> parse gives the same graph, whose
 * text is byte-identical.
 *
 * The valid graphs are built with kir_build (tests/graph_build.h), the extra
 * attributes with the raw setters (no schema id names them), and absent
 * operands at the end of a norm are written out (`rms_norm(%3, _)`), as
 * text may have them and kir_build does not make them.
 *
 * The seed is fixed so that runs repeat; KILN_IR_SEED=<n> picks another and
 * KILN_IR_ROUNDS=<n> the number of graphs. A failure prints its seed.
 */
#include <math.h>
#include <stdlib.h>

#include "tests/check.h"
#include "tests/graph_build.h"
#include "tests/ir/ir_test.h"

/* xorshift64* (Vigna, "An experimental exploration of Marsaglia's xorshift
 * generators, scrambled", 2016). */
typedef struct rng {
    uint64_t s; /* state, never 0 */
} rng;

static uint64_t next_u64(rng *r)
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1Dull;
}
static int below(rng *r, int n) { return (int)(next_u64(r) % (uint64_t)n); }
static int chance(rng *r, int percent) { return below(r, 100) < percent; }

/* A double from the shapes that matter to the printer: decimals, powers of
 * ten, fractions, integers, extremes, and raw bit patterns (NaN, inf,
 * subnormals). */
static double random_double(rng *r);

/* A random double that is positive and finite (the rule of theta, eps ...). */
static double random_positive(rng *r)
{
    double x = fabs(random_double(r));
    return x > 0 && isfinite(x) ? x : 1.0;
}

/* A random finite double (a scale's value). */
static double random_finite(rng *r)
{
    double x = random_double(r);
    return isfinite(x) ? x : 1.0;
}

static double random_double(rng *r)
{
    static const double pow10[] = {1e-300, 1e-20, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 0.01, 0.1, 1,
                                   10,     100,   1e4,  1e5,  1e6,  1e15, 1e16, 1e17, 1e22, 1e300};
    double sign = chance(r, 30) ? -1.0 : 1.0;
    switch (below(r, 7)) {
    case 0: return sign * (double)below(r, 100000) / pow10[below(r, 20)];
    case 1: return sign * pow10[below(r, 20)];
    case 2: return sign * 1.0 / (double)(1 + below(r, 1000));
    case 3: return sign * (double)(int64_t)(next_u64(r) >> below(r, 64));
    case 4: {
        static const double special[] = {0.0, -0.0, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308,
                                         0.1 + 0.2, 500000.0, 10000.0, 1e-6};
        return special[below(r, (int)(sizeof special / sizeof special[0]))];
    }
    default: {
        uint64_t bits = next_u64(r);
        double d;
        memcpy(&d, &bits, sizeof d);
        return d;
    }
    }
}

/* A string of 0..12 bytes from 1..255, leaning to the ones that need
 * escapes. Written into buf (at least 16 bytes). */
static const char *random_string(rng *r, char *buf)
{
    static const char awkward[] = "\"\\\n\t\r\x01\x7f\xff #%@{}=,_";
    int n = below(r, 13);
    for (int i = 0; i < n; i++)
        buf[i] = chance(r, 40) ? awkward[below(r, (int)sizeof awkward - 1)] : (char)(1 + below(r, 255));
    buf[n] = 0;
    return buf;
}

/* A name: a plain identifier (with . and -), or any string. */
static const char *random_name(rng *r, char *buf)
{
    if (chance(r, 30)) return random_string(r, buf);
    static const char first[] = "abcxyzT_";
    static const char rest[] = "abc019_.-";
    int n = 1 + below(r, 8);
    buf[0] = first[below(r, (int)sizeof first - 1)];
    for (int i = 1; i < n; i++) buf[i] = rest[below(r, (int)sizeof rest - 1)];
    buf[n] = 0;
    return buf;
}

/* The graph being built, with what the generator needs to pick operands. */
typedef struct gen {
    rng *r;            /* randomness */
    kir_graph *g;      /* the graph */
    kir_loc locs[4];   /* locations to choose from (locs[0] unknown) */
    int n_weights;     /* weights made, for unique names */
    int n_layers;      /* attention layers made */
    kir_val positions; /* the positions input, for rope */
    kir_val acts[512]; /* activation values */
    int n_acts;        /* count of acts */
} gen;

static kir_loc pick_loc(gen *s) { return s->locs[below(s->r, 4)]; }

static kir_val add_act(gen *s, kir_val v)
{
    if (s->n_acts < (int)(sizeof s->acts / sizeof s->acts[0])) s->acts[s->n_acts++] = v;
    return v;
}

static kir_val new_weight(gen *s, int ndim, const int64_t *dims)
{
    static const kir_dtype types[] = {KIR_F32, KIR_F16, KIR_BF16};
    char name[64];
    snprintf(name, sizeof name, "w%d.%u", s->n_weights++, (unsigned)below(s->r, 1000));
    return kir_weight(s->g, name, types[below(s->r, 3)], ndim, dims, pick_loc(s));
}

static const kir_node *N(gen *s, kir_val v) { return kir_node_at(s->g, v); }

/* An activation with rank `ndim` (0: any), or KIR_NONE. */
static kir_val pick_act(gen *s, int ndim)
{
    for (int tries = 0; tries < 16; tries++) {
        kir_val v = s->acts[below(s->r, s->n_acts)];
        if (!ndim || N(s, v)->ndim == ndim) return v;
    }
    return KIR_NONE;
}

static void random_step(gen *s)
{
    rng *r = s->r;
    kir_graph *g = s->g;
    kir_val a = pick_act(s, 0);
    const kir_node xn = *N(s, a); /* a copy: adding nodes moves the array */
    const kir_node *x = &xn;
    int64_t last = x->dims[x->ndim - 1];
    switch (below(r, 12)) {
    case 0: {
        static const kir_op unary[] = {KIR_OP_SILU, KIR_OP_GELU,    KIR_OP_GELU_TANH, KIR_OP_RELU,
                                       KIR_OP_TANH, KIR_OP_SIGMOID, KIR_OP_SOFTMAX};
        kir_op op = unary[below(r, 7)];
        add_act(s, tb_op(g, op, pick_loc(s), a, KIR_NONE));
        return;
    }
    case 1: { /* a scale, a shifted scale, or a clamp of one or both sides */
        kir_loc at = pick_loc(s);
        double lo = random_finite(r), hi = lo + fabs(random_finite(r));
        if (!isfinite(hi)) hi = lo;
        kir_setting sh[2] = {KIR_WITH_FLOAT(KIR_A_SCALE_VALUE, random_finite(r)), KIR_WITH_FLOAT(KIR_A_SCALE_SHIFT, lo)};
        kir_setting cl[2] = {KIR_WITH_FLOAT(KIR_A_CLAMP_MIN, lo), KIR_WITH_FLOAT(KIR_A_CLAMP_MAX, hi)};
        switch (below(r, 5)) {
        case 0: add_act(s, tb_build(g, KIR_OP_SCALE, at, &a, 1, sh, 2)); return;
        case 1: add_act(s, tb_build(g, KIR_OP_CLAMP, at, &a, 1, cl, 2)); return;
        case 2: add_act(s, tb_build(g, KIR_OP_CLAMP, at, &a, 1, cl + below(r, 2), 1)); return;
        default: add_act(s, tb_scale_at(g, at, a, random_finite(r))); return;
        }
    }
    case 2: { /* binary: same shape, or a weight broadcast over leading dims */
        static const kir_op binary[] = {KIR_OP_ADD, KIR_OP_SUB, KIR_OP_MUL, KIR_OP_MAX, KIR_OP_MIN};
        kir_val in[2] = {a, a};
        if (chance(r, 50)) {
            int k = 1 + below(r, x->ndim - 1);
            in[1] = new_weight(s, k, x->dims + x->ndim - k);
        }
        kir_op op = binary[below(r, 5)];
        add_act(s, tb_op(g, op, pick_loc(s), in[0], in[1]));
        return;
    }
    case 3: { /* matmul */
        kir_val m = pick_act(s, 2);
        if (m == KIR_NONE) return;
        int64_t dims[2] = {1 + below(r, 12), N(s, m)->dims[1]};
        kir_val w = new_weight(s, 2, dims);
        add_act(s, tb_op(g, KIR_OP_MATMUL, pick_loc(s), m, w));
        return;
    }
    case 4:
    case 5: { /* rms_norm / layer_norm with optional weight and bias */
        kir_op op = chance(r, 50) ? KIR_OP_RMS_NORM : KIR_OP_LAYER_NORM;
        int nin = op == KIR_OP_RMS_NORM ? 1 + below(r, 2) : 1 + below(r, 3);
        kir_val in[3] = {a, KIR_NONE, KIR_NONE};
        for (int i = 1; i < nin; i++)
            if (chance(r, 60)) in[i] = new_weight(s, 1, &last);
        kir_loc at = pick_loc(s);
        kir_val v = tb_norm_at(g, at, op, a, in[1], in[2], random_positive(r));
        add_act(s, tb_pad_operands(g, v, nin)); /* (a, _) and (a, w, _) as written */
        return;
    }
    case 6: { /* reshape [T,a*b] <-> [T,a,b] */
        kir_loc at = pick_loc(s);
        int64_t shape[3] = {KIR_DIM_T, 0, 0};
        int n = 2;
        if (x->ndim == 2 && last % 2 == 0) {
            shape[1] = 2;
            shape[2] = last / 2;
            n = 3;
        } else {
            shape[1] = kir_row_elems(x);
        }
        add_act(s, tb_reshape_at(g, at, a, n, shape));
        return;
    }
    case 7: { /* slice */
        if (last < 2) return;
        int64_t start = below(r, (int)last - 1);
        int64_t end = start + 1 + below(r, (int)(last - start));
        add_act(s, tb_slice_at(g, pick_loc(s), a, start, end));
        return;
    }
    case 8: { /* concat of 1..4 copies */
        kir_val in[4] = {a, a, a, a};
        int n = 1 + below(r, 4);
        add_act(s, tb_build(g, KIR_OP_CONCAT, pick_loc(s), in, n, NULL, 0));
        return;
    }
    case 9: { /* rope on [T,H,D], D even */
        kir_val q = pick_act(s, 3);
        if (q == KIR_NONE || N(s, q)->dims[2] % 2) return;
        int64_t head_dim = N(s, q)->dims[2];
        static const kir_word styles[] = {KIR_ROPE_STYLE_HALVES, KIR_ROPE_STYLE_PAIRS};
        static const kir_word scalings[] = {KIR_ROPE_SCALING_NONE, KIR_ROPE_SCALING_LINEAR, KIR_ROPE_SCALING_LLAMA3};
        kir_loc at = pick_loc(s);
        tb_rope_attrs ra; /* one draw after another, in this order */
        ra.theta = random_positive(r);
        ra.style = styles[below(r, 2)];
        ra.rot_dim = 2 * (1 + below(r, (int)head_dim / 2));
        ra.scaling = scalings[below(r, 3)];
        ra.factor = random_positive(r);
        ra.low_freq_factor = fmin(random_positive(r), 1e300);
        double low = ra.low_freq_factor;
        ra.high_freq_factor = isfinite(low * 4) ? low * 4 : low; /* llama3: low < high */
        ra.original_max_positions = (int64_t)(next_u64(r) >> 1);
        add_act(s, tb_rope_at(g, at, q, s->positions, &ra));
        return;
    }
    case 10: { /* attention with q = k = v */
        kir_val q = pick_act(s, 3);
        if (q == KIR_NONE) return;
        kir_loc at = pick_loc(s);
        double scale = random_finite(r);
        int64_t window = below(r, 3) ? 0 : (int64_t)(next_u64(r) >> 1);
        double softcap = below(r, 2) ? 0.0 : random_positive(r);
        add_act(s, tb_attention_at(g, at, q, q, q, s->n_layers++, scale, window, softcap));
        return;
    }
    default:
        return;
    }
}

/* An extra attribute on some node: of a random name and kind (the raw
 * setters: no schema id names it). */
static void add_extra_attr(kir_graph *g, rng *r)
{
    char key[64], str[16];
    {
        kir_val v = (kir_val)below(r, (int)g->n_nodes);
        random_name(r, key);
        if (kir_get(g, v, key)) return; /* keep the attributes the op needs */
        switch (below(r, 4)) {
        case 0: kir_set_int(g, v, key, (int64_t)next_u64(r)); break;
        case 1: kir_set_float(g, v, key, random_double(r)); break;
        case 2: kir_set_str(g, v, key, random_string(r, str)); break;
        default: {
            int64_t list[6];
            int n = below(r, 7);
            for (int i = 0; i < n; i++) list[i] = chance(r, 30) ? KIR_DIM_T : (int64_t)next_u64(r) >> below(r, 64);
            kir_set_ints(g, v, key, list, (uint32_t)n);
        }
        }
    }
}

static kir_graph *random_graph(rng *r)
{
    char buf[64];
    gen s = {.r = r};
    s.g = kir_graph_new(random_string(r, buf));
    kir_graph *g = s.g;
    int n_params = below(r, 6);
    for (int i = 0; i < n_params; i++) {
        random_name(r, buf);
        switch (below(r, 5)) {
        case 0: kir_param_int(g, buf, (int64_t)next_u64(r)); break;
        case 1: kir_param_float(g, buf, random_double(r)); break;
        case 2: {
            int64_t ids[4];
            uint32_t n = (uint32_t)below(r, 5);
            for (uint32_t k = 0; k < n; k++) ids[k] = (int64_t)next_u64(r);
            kir_param_ints(g, buf, ids, n);
            break;
        }
        case 3: { /* a list of floats has one at least: "[]" reads back as a list of ints */
            double fs[4];
            uint32_t n = 1 + (uint32_t)below(r, 4);
            for (uint32_t k = 0; k < n; k++) fs[k] = random_double(r);
            kir_param_floats(g, buf, fs, n);
            break;
        }
        default: {
            char str[16];
            kir_param_str(g, buf, random_string(r, str));
        }
        }
    }
    s.locs[0] = (kir_loc){UINT32_MAX, 0, 0};
    for (int i = 1; i < 4; i++)
        s.locs[i] = kir_loc_make(g, random_string(r, buf), (uint32_t)below(r, 5000), (uint32_t)below(r, 200));

    kir_val tokens = kir_input(g, KIR_ROLE_TOKENS, pick_loc(&s));
    s.positions = kir_input(g, KIR_ROLE_POSITIONS, pick_loc(&s));
    int64_t d = 2 * (1 + below(r, 8));
    int64_t dims[2] = {1 + below(r, 50), d};
    kir_val table = new_weight(&s, 2, dims);
    kir_val x = add_act(&s, tb_op(g, KIR_OP_EMBED, pick_loc(&s), table, tokens));
    int64_t shape[3] = {KIR_DIM_T, 2, d / 2};
    add_act(&s, tb_reshape_at(g, pick_loc(&s), x, 3, shape));
    int steps = 5 + below(r, 40);
    for (int i = 0; i < steps; i++) random_step(&s);
    kir_val last = s.acts[below(r, s.n_acts)];
    kir_loc at = pick_loc(&s);
    tb_output_at(g, at, last, random_string(r, buf));
    return g;
}

int main(void)
{
    const char *seed_env = getenv("KILN_IR_SEED");
    const char *rounds_env = getenv("KILN_IR_ROUNDS");
    uint64_t seed = seed_env ? strtoull(seed_env, NULL, 10) : 20261201;
    int rounds = rounds_env ? atoi(rounds_env) : 400;
    for (int i = 0; i < rounds; i++) {
        rng r = {seed * 1000003u + (uint64_t)i + 1};
        int before = failures;
        kir_graph *g = random_graph(&r);
        ks_buf log = {0};
        ks_diag d = {.log = &log, .quiet = 1};
        CHECK_MSG(kir_verify(g, &d, "random") == 0, "random graph does not verify:\n%s", ks_buf_cstr(&log));
        for (int k = below(&r, 6); k > 0; k--) add_extra_attr(g, &r);
        char *text = kt_print(g);
        log.len = 0;
        kir_graph *h = kt_parse("random.ir", text, &log);
        if (CHECK_MSG(h != NULL, "printed text does not parse:\n%s\n%s", ks_buf_cstr(&log), text)) {
            CHECK(kt_graph_equal(g, h));
            char *again = kt_print(h);
            CHECK_TEXT("reprint", again, text);
            free(again);
        }
        if (failures != before) fprintf(stderr, "(seed %llu, round %d)\n", (unsigned long long)seed, i);
        free(text);
        kir_graph_free(h);
        kir_graph_free(g);
        ks_buf_free(&log);
        if (failures > 10) break;
    }
    return check_finish("test_random");
}
