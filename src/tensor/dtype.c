#include "tensor/dtype.h"

#include <math.h>
#include <pthread.h>

#if defined(__F16C__)
#include <immintrin.h>
#endif

static const struct {
    const char *name, *st;
    size_t size;
    int is_float;
} g_dtypes[H3_DTYPE_COUNT] = {
    [H3_F32] = {"f32", "F32", 4, 1},       [H3_F16] = {"f16", "F16", 2, 1},
    [H3_BF16] = {"bf16", "BF16", 2, 1},    [H3_F64] = {"f64", "F64", 8, 1},
    [H3_F8_E4M3] = {"fp8_e4m3", "F8_E4M3", 1, 1}, [H3_F8_E5M2] = {"fp8_e5m2", "F8_E5M2", 1, 1},
    [H3_I8] = {"i8", "I8", 1, 0},          [H3_U8] = {"u8", "U8", 1, 0},
    [H3_I16] = {"i16", "I16", 2, 0},       [H3_U16] = {"u16", "U16", 2, 0},
    [H3_I32] = {"i32", "I32", 4, 0},       [H3_U32] = {"u32", "U32", 4, 0},
    [H3_I64] = {"i64", "I64", 8, 0},       [H3_U64] = {"u64", "U64", 8, 0},
    [H3_BOOL] = {"bool", "BOOL", 1, 0},
};

size_t h3_dtype_size(h3_dtype t) {
    return (unsigned)t < H3_DTYPE_COUNT ? g_dtypes[t].size : 0;
}
const char *h3_dtype_name(h3_dtype t) {
    return (unsigned)t < H3_DTYPE_COUNT ? g_dtypes[t].name : "?";
}
const char *h3_dtype_st_name(h3_dtype t) {
    return (unsigned)t < H3_DTYPE_COUNT ? g_dtypes[t].st : "?";
}
int h3_dtype_is_float(h3_dtype t) {
    return (unsigned)t < H3_DTYPE_COUNT && g_dtypes[t].is_float;
}

int h3_dtype_from_st(const char *s, h3_dtype *out) {
    for (int i = 0; i < H3_DTYPE_COUNT; i++) {
        if (strcmp(s, g_dtypes[i].st) == 0) {
            *out = (h3_dtype)i;
            return 1;
        }
    }
    return 0;
}

uint16_t h3_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
    if (a < 0x38800000u) {                                   /* below the smallest normal 2^-14 */
        if (a < 0x33000000u) return (uint16_t)sign;          /* < 2^-25: rounds to zero */
        uint32_t e = a >> 23;
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14..24: value = m * 2^(e-150), half subnormal unit 2^-24 */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u; /* rebias 127->15, round to nearest even */
    return (uint16_t)(sign | (r >> 13));
}

static float g_fp8e4m3_lut[256];
static float g_fp8e5m2_lut[256];
static pthread_once_t g_fp8_once = PTHREAD_ONCE_INIT;

static void fp8_init(void) {
    for (int v = 0; v < 256; v++) {
        int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
        float f;
        if (e == 15 && m == 7) f = NAN;
        else if (e == 0) f = ldexpf((float)m / 8.0f, -6);
        else f = ldexpf(1.0f + (float)m / 8.0f, e - 7);
        g_fp8e4m3_lut[v] = s ? -f : f;
        int e5 = (v >> 2) & 31, m5 = v & 3;
        float g;
        if (e5 == 31) g = m5 ? NAN : INFINITY;
        else if (e5 == 0) g = ldexpf((float)m5 / 4.0f, -14);
        else g = ldexpf(1.0f + (float)m5 / 4.0f, e5 - 15);
        g_fp8e5m2_lut[v] = s ? -g : g;
    }
}

float h3_fp8e4m3_to_f32(uint8_t v) {
    pthread_once(&g_fp8_once, fp8_init);
    return g_fp8e4m3_lut[v];
}

uint8_t h3_f32_to_fp8e4m3(float f) {
    if (isnan(f)) return 0x7f;
    uint8_t sign = signbit(f) ? 0x80 : 0;
    float a = fabsf(f);
    if (a >= 448.0f) return sign | 0x7e; /* saturate to the largest finite value */
    /* Exponent of a, clamped to the normal range [-6, 8]; below that the step is the subnormal step 2^-9. */
    int e;
    frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1) -> unbiased exponent e-1 */
    int ue = e - 1;
    if (ue < -6) ue = -6;
    float step = ldexpf(1.0f, ue - 3); /* 3 mantissa bits */
    float q = rintf(a / step);         /* round half to even */
    float r = q * step;
    if (r >= 448.0f) return sign | 0x7e;
    if (r == 0.0f) return sign;
    /* Encode r exactly. */
    int re;
    frexpf(r, &re);
    int ur = re - 1;
    if (ur < -6) { /* subnormal: m/8 * 2^-6 */
        int m = (int)rintf(r / ldexpf(1.0f, -9));
        return sign | (uint8_t)m;
    }
    int m = (int)rintf((r / ldexpf(1.0f, ur) - 1.0f) * 8.0f);
    return sign | (uint8_t)((ur + 7) << 3) | (uint8_t)m;
}

void h3_convert_bf16_to_f32(const uint16_t *src, float *dst, size_t n) {
    uint32_t *d = (uint32_t *)dst;
    for (size_t i = 0; i < n; i++) d[i] = (uint32_t)src[i] << 16;
}

void h3_convert_f16_to_f32(const uint16_t *src, float *dst, size_t n) {
    size_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(src + i));
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
#endif
    for (; i < n; i++) dst[i] = h3_f16_to_f32(src[i]);
}

void h3_convert_f32_to_bf16(const float *src, uint16_t *dst, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = h3_f32_to_bf16(src[i]);
}

void h3_convert_f32_to_f16(const float *src, uint16_t *dst, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = h3_f32_to_f16(src[i]);
}

int h3_convert_to_f32(h3_dtype t, const void *src, float *dst, size_t n) {
    switch (t) {
        case H3_F32: memmove(dst, src, n * 4); return 1;
        case H3_BF16: h3_convert_bf16_to_f32(src, dst, n); return 1;
        case H3_F16: h3_convert_f16_to_f32(src, dst, n); return 1;
        case H3_F64:
            for (size_t i = 0; i < n; i++) dst[i] = (float)((const double *)src)[i];
            return 1;
        case H3_F8_E4M3:
            pthread_once(&g_fp8_once, fp8_init);
            for (size_t i = 0; i < n; i++) dst[i] = g_fp8e4m3_lut[((const uint8_t *)src)[i]];
            return 1;
        case H3_F8_E5M2:
            pthread_once(&g_fp8_once, fp8_init);
            for (size_t i = 0; i < n; i++) dst[i] = g_fp8e5m2_lut[((const uint8_t *)src)[i]];
            return 1;
        default: return 0;
    }
}

int h3_convert_from_f32(h3_dtype t, const float *src, void *dst, size_t n) {
    switch (t) {
        case H3_F32: memmove(dst, src, n * 4); return 1;
        case H3_BF16: h3_convert_f32_to_bf16(src, dst, n); return 1;
        case H3_F16: h3_convert_f32_to_f16(src, dst, n); return 1;
        case H3_F8_E4M3:
            for (size_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = h3_f32_to_fp8e4m3(src[i]);
            return 1;
        default: return 0;
    }
}
