/* synthetic.c — the embedded default model (see synthetic.h). */
#include "compiler/synthetic.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { VOCAB = 512, FIRST_BYTE = 3, FIRST_PIECE = FIRST_BYTE + 256 };

/* splitmix64: a small, well-mixed generator (Steele et al. 2014). */
static uint64_t next_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double uniform(uint64_t *s) { return ((double)(next_u64(s) >> 11) + 0.5) / 9007199254740992.0; }

/* Standard normal by Box-Muller. */
static double normal(uint64_t *s)
{
    double u = uniform(s), v = uniform(s);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static int starts_with(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

void kd_synthetic_weight(const char *name, float *out, int ndim, const int64_t *dims)
{
    uint64_t seed = ks_hash64(KS_HASH_SEED, name, strlen(name));
    size_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (size_t)dims[i];
    if (ndim == 1) {
        /* norm weights: around one */
        for (size_t i = 0; i < n; i++) out[i] = (float)(1.0 + 0.05 * normal(&seed));
        return;
    }
    /* The embedding sets the token's direction; the head maps it to peaky
     * logits; the layers perturb it. Rows of the head for the special and
     * byte tokens are zero, so those stay in the middle of the distribution
     * and samplers that cut the tail (top-k, top-p) never produce them. */
    double std = starts_with(name, "embed") ? 1.0 : starts_with(name, "lm_head") ? 0.3 : 0.05;
    for (size_t i = 0; i < n; i++) out[i] = (float)(std * normal(&seed));
    if (starts_with(name, "lm_head")) {
        size_t row = (size_t)dims[1];
        for (size_t r = 0; r < (size_t)dims[0]; r++)
            if (r < FIRST_PIECE) memset(out + r * row, 0, row * sizeof *out);
    }
}

static void put_token(ks_buf *b, float score, const char *piece)
{
    int32_t len = (int32_t)strlen(piece);
    ks_buf_put(b, &score, 4);
    ks_buf_put(b, &len, 4);
    ks_buf_put(b, piece, (size_t)len);
}

char *kd_synthetic_tokenizer(size_t *len)
{
    static const char *const words[] = {
        " the", " a", " and", " was", " to", " she", " he", " it", " of", " in", " is", " on", " big",
        " little", " day", " time", " once", " upon", " there", " named", " girl", " boy", " cat", " dog",
        " sun", " tree", " happy", " sad", " play", " friend", " mom", " said", " saw", " went", " had",
        " with", " very", " her", " his", " they", " not", " but", " so", " what", " you", " we", " like",
        " love", " park", " ball", " fun", " run", " jump", " home", " red", " blue", " bird", " sky",
    };
    static const char consonants[] = "bdfghklmnprstvwz", vowels[] = "aeiou", singles[] = " abcdefghijklmnopqrstuvwxyz.,!?'";
    ks_buf b = {0};
    int32_t max_len = 16;
    ks_buf_put(&b, &max_len, 4);
    put_token(&b, 0, "<unk>");
    put_token(&b, 0, "\n<s>\n");
    put_token(&b, 0, "\n</s>\n");
    for (int i = 0; i < 256; i++) {
        char piece[8];
        snprintf(piece, sizeof piece, "<0x%02X>", i);
        put_token(&b, 0, piece);
    }
    int id = FIRST_PIECE;
    for (const char *c = singles; *c; c++, id++) {
        char piece[2] = {*c, 0};
        put_token(&b, -1000.0f, piece);
    }
    for (const char *c = consonants; *c; c++)
        for (const char *v = vowels; *v; v++, id++) {
            char piece[3] = {*c, *v, 0};
            put_token(&b, -1.0f - (float)(id % 7), piece);
        }
    for (const char *c = consonants; *c; c++)
        for (const char *v = vowels; *v; v++, id++) {
            char piece[4] = {' ', *c, *v, 0};
            put_token(&b, -2.0f - (float)(id % 5), piece);
        }
    for (size_t w = 0; w < sizeof words / sizeof words[0]; w++, id++) put_token(&b, -3.0f, words[w]);
    for (int k = 0; id < VOCAB; id++, k++) {
        char piece[8];
        snprintf(piece, sizeof piece, "%c%c%c", consonants[k % 16], vowels[(k / 16) % 5], 'n' + k % 3);
        put_token(&b, -4.0f, piece);
    }
    *len = b.len;
    return b.data;
}
