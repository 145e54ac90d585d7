/* numbers.c — half-precision conversions, little-endian data, hashing, checked size arithmetic, byte counts
 * for people. */
#include "support.h"

#include <stdio.h>
#include <math.h>
#include <string.h>

static float bits_to_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t f32_to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

float ks_bf16_to_f32(uint16_t h) { return bits_to_f32((uint32_t)h << 16); }

float ks_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24 */
        float f = (float)man * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    if (exp == 31) return bits_to_f32(sign | 0x7f800000u | (man << 13));
    return bits_to_f32(sign | ((exp + 112) << 23) | (man << 13));
}

void ks_decode_f32(const void *restrict src, ks_float_kind kind, size_t n, float *restrict out)
{
    const uint8_t *restrict p = src;
    switch (kind) {
    case KS_FLOAT_F32:
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        if (n) memcpy(out, p, n * sizeof *out);
#else
        for (size_t i = 0; i < n; i++) out[i] = bits_to_f32(ks_load_le32(p + 4 * i));
#endif
        return;
    case KS_FLOAT_BF16:
        /* as ks_bf16_to_f32, in a form the compiler vectorizes */
        for (size_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)(p[2 * i] | p[2 * i + 1] << 8) << 16;
            memcpy(&out[i], &u, sizeof u);
        }
        return;
    case KS_FLOAT_F16:
        for (size_t i = 0; i < n; i++) out[i] = ks_f16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
        return;
    }
    KS_UNREACHABLE();
}

uint32_t ks_load_le32(const void *src)
{
    const uint8_t *p = src;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int32_t ks_load_le_i32(const void *src)
{
    uint32_t u = ks_load_le32(src);
    int32_t v;
    memcpy(&v, &u, 4); /* two's complement, without an implementation-defined conversion */
    return v;
}

uint64_t ks_load_le64(const void *src)
{
    const uint8_t *p = src;
    return (uint64_t)ks_load_le32(p) | (uint64_t)ks_load_le32(p + 4) << 32;
}

uint16_t ks_f32_to_bf16(float f)
{
    uint32_t u = f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

uint16_t ks_f32_to_f16(float f)
{
    uint32_t u = f32_to_bits(f);
    uint32_t sign = (u >> 16) & 0x8000;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds to inf */
    if (a < 0x38800000u) {
        /* subnormal half: round a / 2^-24 to nearest even */
        float v = bits_to_f32(a) * 16777216.0f;
        uint32_t m = (uint32_t)v;
        float r = v - (float)m;
        if (r > 0.5f || (r == 0.5f && (m & 1))) m++;
        return (uint16_t)(sign | m);
    }
    uint32_t exp = (a >> 23) - 112, man = a & 0x7fffff;
    uint32_t h = (exp << 10) | (man >> 13);
    uint32_t rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

float ks_e4m3_to_f32(uint8_t b)
{
    const int e = (b >> 3) & 15, m = b & 7;
    const float sign = b & 0x80 ? -1.0f : 1.0f;
    if (e == 15 && m == 7) return sign * __builtin_nanf("");
    return sign * (e ? ldexpf(1.0f + (float)m / 8.0f, e - 7) : ldexpf((float)m / 8.0f, -6));
}

uint8_t ks_f32_to_e4m3(float f)
{
    if (f != f) return 0x7f;
    uint8_t sign = signbit(f) ? 0x80 : 0;
    float a = fabsf(f);
    if (a >= 448.0f) return (uint8_t)(sign | 126);
    /* subnormal codes 0..7 are steps of 2^-9 (8 steps: the first normal code, 8); rintf in the default mode
     * rounds a tie to the even step, the even code */
    if (a < 0.015625f) return (uint8_t)(sign | (int)rintf(a * 512.0f));
    /* normal: f32's mantissa rounded to 3 bits, to nearest even (a carry moves to the next binade: the
     * next code), then exponent and mantissa as the code's (bias 7 against f32's 127); under 448 no
     * rounding reaches 480, the NaN code */
    uint32_t u;
    memcpy(&u, &a, sizeof u);
    u += 0x7FFFFu + ((u >> 20) & 1u);
    return (uint8_t)(sign | (int)((((u >> 23) - 120u) << 3) | ((u >> 20) & 7u)));
}

uint64_t ks_hash64(uint64_t h, const void *data, size_t n)
{
    /* FNV-1a over 8-byte little-endian words (then the tail bytes): eight
     * times fewer multiplies than byte-wise FNV, enough to checksum tens of
     * gigabytes of weights in seconds. Detects damage, not tampering. */
    const unsigned char *p = data;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h ^= w;
        h *= 0x100000001b3ull;
        h ^= h >> 29;
    }
    for (; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

int ks_mul_size(size_t a, size_t b, size_t *out)
{
    if (a && b > SIZE_MAX / a) return 0;
    *out = a * b;
    return 1;
}

int ks_add_size(size_t a, size_t b, size_t *out)
{
    if (b > SIZE_MAX - a) return 0;
    *out = a + b;
    return 1;
}

const char *ks_human_bytes(double b, char *buf, size_t len)
{
    static const char *const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) b /= 1024, u++;
    snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", b, units[u]);
    return buf;
}
