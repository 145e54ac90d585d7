/*
 * test_kvcache.c — the paged KV cache's block manager (runtime/kv/kv_cache.c):
 * sequences, block tables, reference counts, copy-on-write through the
 * storage table, all-or-nothing reserve, and the exact error messages.
 * Ends with a randomised run checked against a plain model of what every
 * sequence holds.
 */
#include "runtime/kv/kv_cache.h"
#include "tests/check.h"

#include <stdlib.h>
#include <string.h>

/* A storage table over host memory that counts what it is asked to do, and
 * can be told to fail an allocation. */
typedef struct counting_storage {
    int allocs;      /* successful allocations */
    int frees;       /* frees */
    int copies;      /* copy calls */
    int fail_after;  /* allocations that succeed before one fails; -1: never fail */
} counting_storage;

static void *counting_alloc(void *ctx, size_t bytes)
{
    counting_storage *c = ctx;
    if (c->fail_after == 0) return NULL;
    if (c->fail_after > 0) c->fail_after--;
    c->allocs++;
    return krt_kv_host_storage.alloc(NULL, bytes);
}

static void counting_free(void *ctx, void *p)
{
    counting_storage *c = ctx;
    c->frees++;
    krt_kv_host_storage.free(NULL, p);
}

static void counting_copy(void *ctx, void *base, size_t dst_off, size_t src_off, size_t bytes)
{
    counting_storage *c = ctx;
    c->copies++;
    krt_kv_host_storage.copy(NULL, base, dst_off, src_off, bytes);
}

static krt_kv_storage counting_table(counting_storage *c)
{
    return (krt_kv_storage){c, counting_alloc, counting_free, counting_copy};
}

/* Two layers of different shapes: layer 0 K [2 heads x 3], V [2 x 5];
 * layer 1 K [1 x 4], V [1 x 4]. */
static const krt_kv_layer two_layers[2] = {{2, 3, 5}, {1, 4, 4}};

static krt_kv_config small_config(int block_size, int n_blocks, int max_seqs, int max_context)
{
    return (krt_kv_config){
        .n_layers = 2,
        .layers = two_layers,
        .block_size = block_size,
        .n_blocks = n_blocks,
        .max_seqs = max_seqs,
        .max_context = max_context,
        .elem_size = sizeof(float),
    };
}

static int row_elems(const krt_kv *kv, int layer, int v_side)
{
    const krt_kv_layer *l = &krt_kv_config_of(kv)->layers[layer];
    return l->kv_heads * (v_side ? l->head_dim_v : l->head_dim_k);
}

static float *row_of(krt_kv *kv, int layer, int v_side, int seq, int pos)
{
    float *base = v_side ? krt_kv_v(kv, layer) : krt_kv_k(kv, layer);
    return base + krt_kv_slot(kv, seq, pos) * row_elems(kv, layer, v_side);
}

/* The value stored for (tag, layer, side, element): distinct everywhere. */
static float pattern(int tag, int layer, int v_side, int e)
{
    return (float)(tag * 1000 + layer * 100 + v_side * 50 + e);
}

/* Write `tag` into every layer's K and V rows of (seq, pos). */
static void write_pos(krt_kv *kv, int seq, int pos, int tag)
{
    for (int l = 0; l < 2; l++)
        for (int side = 0; side < 2; side++) {
            float *r = row_of(kv, l, side, seq, pos);
            for (int e = 0; e < row_elems(kv, l, side); e++) r[e] = pattern(tag, l, side, e);
        }
}

/* 1 when every layer's K and V rows of (seq, pos) hold `tag`. */
static int holds(krt_kv *kv, int seq, int pos, int tag)
{
    for (int l = 0; l < 2; l++)
        for (int side = 0; side < 2; side++) {
            const float *r = row_of(kv, l, side, seq, pos);
            for (int e = 0; e < row_elems(kv, l, side); e++)
                if (r[e] != pattern(tag, l, side, e)) return 0;
        }
    return 1;
}

static ks_diag quiet_diag(ks_buf *log) { return (ks_diag){.log = log, .quiet = 1}; }

static void test_config_errors(void)
{
    static const struct {
        krt_kv_config cfg; /* a bad config */
        const char *want;  /* the message it gets */
    } cases[] = {
        {{.n_layers = -1, .block_size = 4, .n_blocks = 4, .max_seqs = 1, .max_context = 8, .elem_size = 4},
         "kv cache: error: n_layers must not be negative (got -1)\n"},
        {{.n_layers = 2, .layers = NULL, .block_size = 4, .n_blocks = 4, .max_seqs = 1, .max_context = 8, .elem_size = 4},
         "kv cache: error: no layer shapes given for 2 layers\n"},
        {{.n_layers = 2, .layers = two_layers, .block_size = 0, .n_blocks = 4, .max_seqs = 1, .max_context = 8, .elem_size = 4},
         "kv cache: error: block_size must be positive (got 0)\n"},
        {{.n_layers = 2, .layers = two_layers, .block_size = 4, .n_blocks = -3, .max_seqs = 1, .max_context = 8, .elem_size = 4},
         "kv cache: error: n_blocks must be positive (got -3)\n"},
        {{.n_layers = 2, .layers = two_layers, .block_size = 4, .n_blocks = 4, .max_seqs = 0, .max_context = 8, .elem_size = 4},
         "kv cache: error: max_seqs must be positive (got 0)\n"},
        {{.n_layers = 2, .layers = two_layers, .block_size = 4, .n_blocks = 4, .max_seqs = 1, .max_context = 0, .elem_size = 4},
         "kv cache: error: max_context must be positive (got 0)\n"},
        {{.n_layers = 2, .layers = two_layers, .block_size = 4, .n_blocks = 4, .max_seqs = 1, .max_context = 8, .elem_size = 0},
         "kv cache: error: elem_size must be positive (got 0)\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ks_buf log = {0};
        ks_diag d = quiet_diag(&log);
        CHECK(krt_kv_new(&cases[i].cfg, &krt_kv_host_storage, &d) == NULL);
        CHECK_STR(ks_buf_cstr(&log), cases[i].want);
        CHECK(d.errors == 1);
        ks_buf_free(&log);
    }

    /* A layer with heads but no head size. */
    krt_kv_layer bad[1] = {{4, 0, 8}};
    krt_kv_config cfg = small_config(4, 4, 1, 8);
    cfg.n_layers = 1;
    cfg.layers = bad;
    ks_buf log = {0};
    ks_diag d = quiet_diag(&log);
    CHECK(krt_kv_new(&cfg, &krt_kv_host_storage, &d) == NULL);
    CHECK_STR(ks_buf_cstr(&log),
              "kv cache: error: layer 0: kv_heads and head_dim_k must be positive, head_dim_v not negative (got 4, 0, 8)\n");
    ks_buf_free(&log);

    /* Storage that runs out: the second allocation (layer 0's V) fails, and
     * what was allocated is given back. */
    counting_storage cs = {.fail_after = 1};
    krt_kv_storage st = counting_table(&cs);
    cfg = small_config(4, 4, 1, 8);
    log = (ks_buf){0};
    d = quiet_diag(&log);
    CHECK(krt_kv_new(&cfg, &st, &d) == NULL);
    /* 4 blocks x 4 positions x 2 heads x 5 floats x 4 bytes = 640 bytes. */
    CHECK_STR(ks_buf_cstr(&log),
              "kv cache: error: out of memory (allocating 640 bytes for the KV cache: layer 0's V of 4 blocks)\n");
    CHECK(cs.allocs == 1 && cs.frees == 1);
    ks_buf_free(&log);

    /* Storage that would not fit in the address space. */
    krt_kv_layer huge[1] = {{1 << 30, 1 << 30, 1}};
    cfg = small_config(1 << 20, 4, 1, 8);
    cfg.n_layers = 1;
    cfg.layers = huge;
    log = (ks_buf){0};
    d = quiet_diag(&log);
    CHECK(krt_kv_new(&cfg, &krt_kv_host_storage, &d) == NULL);
    CHECK_STR(ks_buf_cstr(&log), "kv cache: error: layer 0: K storage of 4 blocks overflows the address space\n");
    ks_buf_free(&log);
}

static void test_add_fork_free_reserve(void)
{
    krt_kv_config cfg = small_config(4, 8, 3, 20);
    ks_diag d = {0};
    krt_kv *kv = krt_kv_new(&cfg, &krt_kv_host_storage, &d);
    CHECK(kv != NULL);
    const char *why = NULL;
    int nb;

    CHECK(krt_kv_free_blocks(kv) == 8);
    CHECK(!krt_kv_seq_exists(kv, 0));
    CHECK(krt_kv_seq_len(kv, 0) == -1);
    CHECK(krt_kv_seq_add(kv, 0, &why) == 0);
    CHECK(krt_kv_seq_exists(kv, 0));
    CHECK(krt_kv_seq_len(kv, 0) == 0);
    CHECK(krt_kv_block_table(kv, 0, &nb) != NULL && nb == 0);

    /* 6 positions take 2 blocks, handed out from block 0 up. */
    CHECK(krt_kv_seq_reserve(kv, 0, 6, &why) == 0);
    CHECK(krt_kv_seq_len(kv, 0) == 6);
    const int32_t *t = krt_kv_block_table(kv, 0, &nb);
    CHECK(nb == 2 && t[0] == 0 && t[1] == 1);
    CHECK(krt_kv_free_blocks(kv) == 6);
    CHECK(krt_kv_slot(kv, 0, 0) == 0);
    CHECK(krt_kv_slot(kv, 0, 5) == 1 * 4 + 1);

    /* Growing inside the last block takes nothing new. */
    CHECK(krt_kv_seq_reserve(kv, 0, 8, &why) == 0);
    CHECK(krt_kv_free_blocks(kv) == 6);
    CHECK(krt_kv_seq_reserve(kv, 0, 9, &why) == 0);
    CHECK(krt_kv_free_blocks(kv) == 5);
    CHECK(krt_kv_slot(kv, 0, 8) == 2 * 4);

    /* Shortening returns the blocks it no longer needs. */
    CHECK(krt_kv_seq_reserve(kv, 0, 3, &why) == 0);
    CHECK(krt_kv_seq_len(kv, 0) == 3);
    CHECK(krt_kv_free_blocks(kv) == 7);
    CHECK(krt_kv_seq_reserve(kv, 0, 0, &why) == 0);
    CHECK(krt_kv_free_blocks(kv) == 8);
    CHECK(krt_kv_seq_reserve(kv, 0, 6, &why) == 0);

    /* A fork shares every block: no new ones, same table. */
    CHECK(krt_kv_seq_fork(kv, 0, 2, &why) == 0);
    CHECK(krt_kv_seq_len(kv, 2) == 6);
    CHECK(krt_kv_free_blocks(kv) == 6);
    const int32_t *t2 = krt_kv_block_table(kv, 2, &nb);
    t = krt_kv_block_table(kv, 0, &nb);
    CHECK(nb == 2 && t2[0] == t[0] && t2[1] == t[1]);

    /* Freeing one sharer keeps the blocks; freeing the last returns them. */
    krt_kv_seq_free(kv, 0);
    CHECK(!krt_kv_seq_exists(kv, 0));
    CHECK(krt_kv_free_blocks(kv) == 6);
    krt_kv_seq_free(kv, 2);
    CHECK(krt_kv_free_blocks(kv) == 8);
    krt_kv_seq_free(kv, 2); /* freeing an unknown sequence does nothing */
    krt_kv_seq_free(kv, 99);
    CHECK(krt_kv_free_blocks(kv) == 8);

    /* A freed id can be added again, empty. */
    CHECK(krt_kv_seq_add(kv, 0, &why) == 0);
    CHECK(krt_kv_seq_len(kv, 0) == 0);
    krt_kv_free(kv);
    CHECK(d.errors == 0);
}

static void test_sequence_errors(void)
{
    krt_kv_config cfg = small_config(4, 4, 2, 10);
    ks_diag d = {0};
    krt_kv *kv = krt_kv_new(&cfg, &krt_kv_host_storage, &d);
    const char *why = NULL;
    int nb;

    CHECK(krt_kv_seq_add(kv, 2, &why) == -1);
    CHECK_STR(why, "too many sequences: the id is not below max_seqs");
    CHECK(krt_kv_seq_add(kv, -1, &why) == -1);
    CHECK_STR(why, "negative sequence id");
    CHECK(krt_kv_seq_add(kv, 1, &why) == 0);
    CHECK(krt_kv_seq_add(kv, 1, &why) == -1);
    CHECK_STR(why, "sequence already exists");

    why = NULL;
    CHECK(krt_kv_seq_reserve(kv, 0, 1, &why) == -1);
    CHECK_STR(why, "unknown sequence");
    CHECK(krt_kv_seq_fork(kv, 0, 1, &why) == -1);
    CHECK_STR(why, "unknown sequence");
    CHECK(krt_kv_seq_fork(kv, 1, 1, &why) == -1);
    CHECK_STR(why, "sequence already exists");
    CHECK(krt_kv_seq_fork(kv, 1, 5, &why) == -1);
    CHECK_STR(why, "too many sequences: the id is not below max_seqs");
    CHECK(krt_kv_block_table(kv, 0, &nb) == NULL && nb == 0);

    /* max_context: exactly 10 fits, 11 does not, and nothing changes. */
    CHECK(krt_kv_seq_reserve(kv, 1, 10, &why) == 0);
    CHECK(krt_kv_seq_reserve(kv, 1, 11, &why) == -1);
    CHECK_STR(why, "exceeds max_context");
    CHECK(krt_kv_seq_len(kv, 1) == 10);
    CHECK(krt_kv_free_blocks(kv) == 1);
    CHECK(krt_kv_seq_reserve(kv, 1, -2, &why) == -1);
    CHECK_STR(why, "negative length");
    krt_kv_free(kv);
}

static void test_out_of_blocks(void)
{
    krt_kv_config cfg = small_config(2, 5, 3, 100);
    ks_diag d = {0};
    krt_kv *kv = krt_kv_new(&cfg, &krt_kv_host_storage, &d);
    const char *why = NULL;
    int nb;

    CHECK(krt_kv_seq_add(kv, 0, &why) == 0);
    CHECK(krt_kv_seq_add(kv, 1, &why) == 0);
    CHECK(krt_kv_seq_reserve(kv, 0, 3, &why) == 0); /* blocks 0, 1 */
    CHECK(krt_kv_seq_reserve(kv, 1, 4, &why) == 0); /* blocks 2, 3 */
    for (int p = 0; p < 3; p++) write_pos(kv, 0, p, 10 + p);
    for (int p = 0; p < 4; p++) write_pos(kv, 1, p, 20 + p);

    /* Sequence 0 wants 4 more blocks; one is free. */
    int32_t before[2];
    memcpy(before, krt_kv_block_table(kv, 0, &nb), sizeof before);
    CHECK(krt_kv_seq_reserve(kv, 0, 11, &why) == -1);
    CHECK_STR(why, "out of KV cache blocks");
    const int32_t *t = krt_kv_block_table(kv, 0, &nb);
    CHECK(nb == 2 && t[0] == before[0] && t[1] == before[1]);
    CHECK(krt_kv_seq_len(kv, 0) == 3);
    CHECK(krt_kv_free_blocks(kv) == 1);
    for (int p = 0; p < 3; p++) CHECK(holds(kv, 0, p, 10 + p));

    /* The other sequence goes on with the block that is left... */
    CHECK(krt_kv_seq_reserve(kv, 1, 6, &why) == 0);
    write_pos(kv, 1, 4, 24);
    write_pos(kv, 1, 5, 25);
    for (int p = 0; p < 6; p++) CHECK(holds(kv, 1, p, 20 + p));
    /* ...and so does the first, inside its last block. */
    CHECK(krt_kv_seq_reserve(kv, 0, 4, &why) == 0);
    write_pos(kv, 0, 3, 13);
    for (int p = 0; p < 4; p++) CHECK(holds(kv, 0, p, 10 + p));
    CHECK(krt_kv_free_blocks(kv) == 0);

    /* A copy-on-write that finds no free block fails as a whole too. */
    CHECK(krt_kv_seq_fork(kv, 0, 2, &why) == 0);
    CHECK(krt_kv_seq_reserve(kv, 2, 3, &why) == 0); /* shortening copies nothing */
    CHECK(krt_kv_seq_reserve(kv, 2, 4, &why) == -1);
    CHECK_STR(why, "out of KV cache blocks");
    CHECK(krt_kv_seq_len(kv, 2) == 3);
    krt_kv_seq_free(kv, 1);
    CHECK(krt_kv_free_blocks(kv) == 3);
    CHECK(krt_kv_seq_reserve(kv, 2, 4, &why) == 0);
    write_pos(kv, 2, 3, 99);
    CHECK(holds(kv, 0, 3, 13));
    CHECK(holds(kv, 2, 3, 99));
    krt_kv_free(kv);
}

static void test_copy_on_write(void)
{
    counting_storage cs = {.fail_after = -1};
    krt_kv_storage st = counting_table(&cs);
    krt_kv_config cfg = small_config(4, 8, 4, 32);
    ks_diag d = {0};
    krt_kv *kv = krt_kv_new(&cfg, &st, &d);
    CHECK(cs.allocs == 4); /* K and V of two layers */
    const char *why = NULL;
    int nb;

    /* A prompt of 6 positions: one full block and a half-full one. */
    CHECK(krt_kv_seq_add(kv, 0, &why) == 0);
    CHECK(krt_kv_seq_reserve(kv, 0, 6, &why) == 0);
    for (int p = 0; p < 6; p++) write_pos(kv, 0, p, 100 + p);
    CHECK(krt_kv_seq_fork(kv, 0, 1, &why) == 0);
    CHECK(cs.copies == 0);
    for (int p = 0; p < 6; p++) CHECK(holds(kv, 1, p, 100 + p));

    /* The fork appends: its half-full last block is copied (in 2 layers x K,V),
     * the full one stays shared. */
    CHECK(krt_kv_seq_reserve(kv, 1, 7, &why) == 0);
    CHECK(cs.copies == 4);
    const int32_t *t0 = krt_kv_block_table(kv, 0, &nb);
    const int32_t *t1 = krt_kv_block_table(kv, 1, &nb);
    CHECK(t0[0] == t1[0] && t0[1] != t1[1]);
    CHECK(krt_kv_free_blocks(kv) == 5);
    write_pos(kv, 1, 6, 201);
    for (int p = 0; p < 6; p++) CHECK(holds(kv, 1, p, 100 + p));
    CHECK(holds(kv, 1, 6, 201));

    /* The source appends at the same position: its block is no longer shared,
     * so it writes in place and the fork's copy is untouched. */
    CHECK(krt_kv_seq_reserve(kv, 0, 7, &why) == 0);
    CHECK(cs.copies == 4);
    write_pos(kv, 0, 6, 106);
    CHECK(holds(kv, 0, 6, 106));
    CHECK(holds(kv, 1, 6, 201));

    /* Fork on a block boundary: nothing needs copying when the fork grows. */
    CHECK(krt_kv_seq_reserve(kv, 0, 8, &why) == 0);
    write_pos(kv, 0, 7, 107);
    CHECK(krt_kv_seq_fork(kv, 0, 2, &why) == 0);
    CHECK(krt_kv_seq_reserve(kv, 2, 9, &why) == 0);
    CHECK(cs.copies == 4);
    write_pos(kv, 2, 8, 300);
    for (int p = 0; p < 8; p++) CHECK(holds(kv, 2, p, 100 + p));

    /* The source's original grows too, after its fork took the shared tail:
     * sequence 0 and 2 share blocks 0-1; 0 appends into a new block. */
    CHECK(krt_kv_seq_reserve(kv, 0, 9, &why) == 0);
    write_pos(kv, 0, 8, 108);
    CHECK(holds(kv, 2, 8, 300));
    CHECK(holds(kv, 0, 8, 108));

    /* Shortening a fork then rewriting copies the block it rewrites. */
    CHECK(krt_kv_seq_reserve(kv, 2, 5, &why) == 0);
    int copies = cs.copies;
    CHECK(krt_kv_seq_reserve(kv, 2, 6, &why) == 0);
    CHECK(cs.copies == copies + 4);
    write_pos(kv, 2, 5, 305);
    CHECK(holds(kv, 2, 4, 104));
    CHECK(holds(kv, 2, 5, 305));
    CHECK(holds(kv, 0, 5, 105));

    krt_kv_seq_free(kv, 0);
    krt_kv_seq_free(kv, 1);
    krt_kv_seq_free(kv, 2);
    CHECK(krt_kv_free_blocks(kv) == 8);
    krt_kv_free(kv);
    CHECK(cs.frees == 4);
}

/* ---- randomised run against a model -----------------------------------------
 * The model keeps, for every live sequence, the tag written at each position.
 * Every reserve, fork, free and write is applied to both; after each, every
 * stored position must hold its tag and the block counts must add up. */
enum { R_SEQS = 6, R_CONTEXT = 40 };

typedef struct model_seq {
    int live;               /* in use */
    int len;                /* positions */
    int tag[R_CONTEXT];     /* tag written at each position */
} model_seq;

static unsigned lcg(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (*s >> 16) & 0x7fff;
}

static void check_against_model(krt_kv *kv, const model_seq *m, int n_blocks)
{
    int used[64] = {0};
    for (int s = 0; s < R_SEQS; s++) {
        CHECK(krt_kv_seq_exists(kv, s) == m[s].live);
        if (!m[s].live) continue;
        CHECK(krt_kv_seq_len(kv, s) == m[s].len);
        for (int p = 0; p < m[s].len; p++) CHECK(holds(kv, s, p, m[s].tag[p]));
        int nb;
        const int32_t *t = krt_kv_block_table(kv, s, &nb);
        for (int b = 0; b < nb; b++) used[t[b]] = 1;
    }
    int n_used = 0;
    for (int b = 0; b < n_blocks; b++) n_used += used[b];
    CHECK(n_used + krt_kv_free_blocks(kv) == n_blocks);
}

static void test_random_against_model(void)
{
    enum { N_BLOCKS = 24, BS = 3 };
    krt_kv_config cfg = small_config(BS, N_BLOCKS, R_SEQS, R_CONTEXT);
    ks_diag d = {0};
    krt_kv *kv = krt_kv_new(&cfg, &krt_kv_host_storage, &d);
    model_seq m[R_SEQS] = {{0}};
    unsigned seed = 12345;
    int next_tag = 1, failed_reserves = 0;
    const char *why;

    for (int it = 0; it < 4000 && !failures; it++) {
        int s = (int)(lcg(&seed) % R_SEQS), op = (int)(lcg(&seed) % 10);
        if (!m[s].live) {
            if (op < 5) {
                CHECK(krt_kv_seq_add(kv, s, &why) == 0);
                m[s] = (model_seq){.live = 1};
            } else {
                int src = (int)(lcg(&seed) % R_SEQS);
                int rc = krt_kv_seq_fork(kv, src, s, &why);
                CHECK(rc == (m[src].live ? 0 : -1));
                if (rc == 0) m[s] = m[src];
            }
        } else if (op == 0) {
            krt_kv_seq_free(kv, s);
            m[s].live = 0;
        } else if (op <= 2) {
            int n = (int)(lcg(&seed) % (m[s].len + 1)); /* shorten */
            CHECK(krt_kv_seq_reserve(kv, s, n, &why) == 0);
            m[s].len = n;
        } else {
            /* grow and write the new positions, as a step does */
            int n = m[s].len + 1 + (int)(lcg(&seed) % 6);
            int rc = krt_kv_seq_reserve(kv, s, n, &why);
            if (n > R_CONTEXT) {
                CHECK(rc == -1);
                CHECK_STR(why, "exceeds max_context");
            } else if (rc != 0) {
                CHECK_STR(why, "out of KV cache blocks");
                failed_reserves++;
            } else {
                for (int p = m[s].len; p < n; p++) {
                    m[s].tag[p] = next_tag++;
                    write_pos(kv, s, p, m[s].tag[p]);
                }
                m[s].len = n;
            }
        }
        check_against_model(kv, m, N_BLOCKS);
    }
    CHECK(failed_reserves > 0); /* the pool did run dry on the way */
    krt_kv_free(kv);
}

/* A cache of codes (scale_size > 0): each layer's K and V hold one-byte codes, then a scale a (position,
 * head) row after every block's codes; a block's copy-on-write copies its codes and their scales, and the
 * memory a block costs counts both. */
static void test_scales(void)
{
    counting_storage cs = {.fail_after = -1};
    krt_kv_storage st = counting_table(&cs);
    krt_kv_config cfg = small_config(4, 8, 4, 32);
    cfg.elem_size = 1;
    cfg.scale_size = sizeof(float);
    ks_diag d = {0};
    krt_kv *kv = krt_kv_new(&cfg, &st, &d);
    CHECK(kv != NULL);
    if (!kv) return;
    /* the scales right after the codes: layer 0's K 8 blocks x 4 positions x 2 heads x 3 codes */
    CHECK((char *)krt_kv_k_scales(kv, 0) == (char *)krt_kv_k(kv, 0) + 8 * 4 * 2 * 3);
    CHECK((char *)krt_kv_v_scales(kv, 1) == (char *)krt_kv_v(kv, 1) + 8 * 4 * 1 * 4);
    /* a block: positions x (heads x (dk + dv codes + 2 scales of 4 bytes)) over the layers */
    CHECK(krt_kv_block_bytes(two_layers, 2, 4, 1, sizeof(float)) == 4.0 * (2 * (3 + 5 + 8) + 1 * (4 + 4 + 8)));
    const char *why = NULL;
    CHECK(krt_kv_seq_add(kv, 0, &why) == 0);
    CHECK(krt_kv_seq_reserve(kv, 0, 6, &why) == 0);
    for (int l = 0; l < 2; l++) {
        const int heads = two_layers[l].kv_heads;
        float *ks = krt_kv_k_scales(kv, l), *vs = krt_kv_v_scales(kv, l);
        for (int p = 0; p < 6; p++)
            for (int h = 0; h < heads; h++) {
                ks[krt_kv_slot(kv, 0, p) * heads + h] = (float)(1000 * l + 10 * p + h);
                vs[krt_kv_slot(kv, 0, p) * heads + h] = (float)(-1000 * l - 10 * p - h);
            }
    }
    CHECK(krt_kv_seq_fork(kv, 0, 1, &why) == 0);
    CHECK(krt_kv_seq_reserve(kv, 1, 7, &why) == 0); /* the half-full block copied: codes and scales, K and V */
    CHECK(cs.copies == 8);
    int nb;
    const int32_t *t0 = krt_kv_block_table(kv, 0, &nb), *t1 = krt_kv_block_table(kv, 1, &nb);
    CHECK(t0[1] != t1[1]);
    for (int l = 0; l < 2; l++) {
        const int heads = two_layers[l].kv_heads;
        const float *ks = krt_kv_k_scales(kv, l), *vs = krt_kv_v_scales(kv, l);
        for (int p = 0; p < 6; p++)
            for (int h = 0; h < heads; h++) {
                CHECK(ks[krt_kv_slot(kv, 1, p) * heads + h] == (float)(1000 * l + 10 * p + h));
                CHECK(vs[krt_kv_slot(kv, 1, p) * heads + h] == (float)(-1000 * l - 10 * p - h));
            }
    }
    krt_kv_free(kv);
    /* a cache of values has none */
    krt_kv_config plain = small_config(4, 8, 4, 32);
    kv = krt_kv_new(&plain, &krt_kv_host_storage, &d);
    CHECK(kv && krt_kv_k_scales(kv, 0) == NULL && krt_kv_v_scales(kv, 0) == NULL);
    krt_kv_free(kv);
}

/* Prefix caching: published full blocks taken by a new sequence with the same hashes, kept while no
 * sequence holds them, evicted least recently released first when blocks run out; a shortened
 * sequence that alone holds a published block unpublishes it. */
static void test_prefix_cache(void)
{
    krt_kv_config cfg = small_config(2, 6, 4, 100); /* blocks of 2 positions, 6 blocks */
    ks_diag d = {0};
    krt_kv *kv = krt_kv_new(&cfg, &krt_kv_host_storage, &d);
    const char *why = NULL;
    int nb;
    const int32_t ids[6] = {5, 6, 7, 8, 9, 10};
    uint64_t h[3];
    for (int b = 0; b < 3; b++) h[b] = krt_kv_chain_hash(b ? h[b - 1] : 0, ids + 2 * b, 2);
    CHECK(h[0] != h[1] && h[1] != h[2] && krt_kv_chain_hash(0, ids + 2, 2) != h[1]); /* the chain counts */
    /* sequence 0 writes 5 positions and publishes its two full blocks */
    CHECK(krt_kv_seq_add(kv, 0, &why) == 0 && krt_kv_seq_reserve(kv, 0, 5, &why) == 0);
    for (int p = 0; p < 5; p++) write_pos(kv, 0, p, 30 + p);
    krt_kv_seq_publish(kv, 0, 0, h[0]);
    krt_kv_seq_publish(kv, 0, 1, h[1]);
    krt_kv_seq_publish(kv, 0, 2, h[2]); /* not full: ignored */
    CHECK(krt_kv_prefix_stats_of(kv).cached == 2);
    /* sequence 1 takes them (its length 4), not the third */
    CHECK(krt_kv_seq_add(kv, 1, &why) == 0);
    CHECK(krt_kv_seq_attach_cached(kv, 1, h, 3) == 2);
    CHECK(krt_kv_seq_len(kv, 1) == 4);
    for (int p = 0; p < 4; p++) CHECK(holds(kv, 1, p, 30 + p));
    const int32_t *t0 = krt_kv_block_table(kv, 0, &nb), *t1 = krt_kv_block_table(kv, 1, &nb);
    CHECK(t0[0] == t1[0] && t0[1] == t1[1]);
    /* both freed: the published blocks stay cached (and count as free); a new sequence takes them again */
    krt_kv_seq_free(kv, 0);
    krt_kv_seq_free(kv, 1);
    CHECK(krt_kv_free_blocks(kv) == 6 && krt_kv_prefix_stats_of(kv).cached == 2);
    CHECK(krt_kv_seq_add(kv, 2, &why) == 0 && krt_kv_seq_attach_cached(kv, 2, h, 2) == 2);
    for (int p = 0; p < 4; p++) CHECK(holds(kv, 2, p, 30 + p));
    /* shortened into its second block (which it alone holds): that block is no longer published */
    CHECK(krt_kv_seq_reserve(kv, 2, 3, &why) == 0);
    CHECK(krt_kv_prefix_stats_of(kv).cached == 1);
    krt_kv_seq_free(kv, 2);
    /* a sequence that needs every block evicts the cached one */
    CHECK(krt_kv_seq_add(kv, 3, &why) == 0 && krt_kv_seq_reserve(kv, 3, 12, &why) == 0);
    CHECK(krt_kv_prefix_stats_of(kv).cached == 0 && krt_kv_prefix_stats_of(kv).evictions == 1);
    krt_kv_seq_free(kv, 3);
    CHECK(krt_kv_seq_add(kv, 0, &why) == 0 && krt_kv_seq_attach_cached(kv, 0, h, 2) == 0);
    const krt_kv_prefix_stats st = krt_kv_prefix_stats_of(kv);
    CHECK(st.lookups == 7 && st.hits == 4);
    krt_kv_free(kv);
}

int main(void)
{
    test_prefix_cache();
    test_scales();
    test_config_errors();
    test_add_fork_free_reserve();
    test_sequence_errors();
    test_out_of_blocks();
    test_copy_on_write();
    test_random_against_model();
    return check_finish("kvcache");
}
