/*
 * test_numbers.c — support/numbers.c's little-endian data: ks_decode_f32 for each
 * float kind (every f16 and bf16 value against the one-value conversions, data at an
 * odd address, no write for n = 0), and ks_load_le32 / ks_load_le_i32 / ks_load_le64.
 */
#include <math.h>
#include <stdlib.h>

#include "tests/check.h"

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* All 65536 16-bit patterns, little-endian, one byte past an aligned address. */
static void test_halves(void)
{
    uint8_t *raw = ks_xmalloc(2 * 65536 + 1), *p = raw + 1;
    for (uint32_t h = 0; h < 65536; h++) p[2 * h] = (uint8_t)h, p[2 * h + 1] = (uint8_t)(h >> 8);
    float *out = ks_xmalloc(sizeof(float) * 65536);
    int wrong = 0;
    ks_decode_f32(p, KS_FLOAT_BF16, 65536, out);
    for (uint32_t h = 0; h < 65536; h++) wrong += bits(out[h]) != bits(ks_bf16_to_f32((uint16_t)h));
    CHECK(wrong == 0);
    wrong = 0;
    ks_decode_f32(p, KS_FLOAT_F16, 65536, out);
    for (uint32_t h = 0; h < 65536; h++) wrong += bits(out[h]) != bits(ks_f16_to_f32((uint16_t)h));
    CHECK(wrong == 0);
    /* a few values by hand */
    CHECK(out[0x3e00] == 1.5f && out[0xfc00] == -INFINITY && out[0x0001] == ldexpf(1.0f, -24));
    ks_decode_f32(p, KS_FLOAT_BF16, 65536, out);
    CHECK(out[0x3fc0] == 1.5f && out[0xc000] == -2.0f && out[0x7f80] == INFINITY && isnan(out[0x7fc0]));
    free(out);
    free(raw);
}

static void test_f32(void)
{
    const uint8_t raw[] = {0xee, 0x00, 0x00, 0xc0, 0x3f, 0x00, 0x00, 0x80, 0xbf, 0x01, 0x00, 0x00, 0x00};
    float out[4] = {7, 7, 7, 7};
    ks_decode_f32(raw + 1, KS_FLOAT_F32, 3, out);
    CHECK(out[0] == 1.5f && out[1] == -1.0f && bits(out[2]) == 1 && out[3] == 7);
    ks_decode_f32(raw + 1, KS_FLOAT_F32, 0, out + 3);
    ks_decode_f32(raw + 1, KS_FLOAT_BF16, 0, out + 3);
    ks_decode_f32(raw + 1, KS_FLOAT_F16, 0, out + 3);
    CHECK(out[3] == 7);
}

static void test_integers(void)
{
    const uint8_t raw[] = {0xee, 0x01, 0x02, 0x03, 0x84, 0xff, 0xff, 0xff, 0xff};
    CHECK(ks_load_le32(raw + 1) == 0x84030201u);
    CHECK(ks_load_le_i32(raw + 1) == (int32_t)-2080177663);
    CHECK(ks_load_le_i32(raw + 5) == -1);
    CHECK(ks_load_le64(raw + 1) == 0xffffffff84030201ull);
}

int main(void)
{
    test_halves();
    test_f32();
    test_integers();
    return check_finish("test_numbers");
}
