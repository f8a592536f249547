/* Element types and conversions between them.
 *
 * Storage types follow safetensors' names. bf16 and f16 round to nearest even; fp8 e4m3fn saturates to
 * +-448 (the format has no infinity; NaN stays NaN), which is what a quantizer that clamps first produces.
 */
#ifndef H3_TENSOR_DTYPE_H
#define H3_TENSOR_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Callable from host and device code: small pure functions both backends share, so they agree bit for bit. */
#ifdef __CUDACC__
#define H3_HD __host__ __device__
#else
#define H3_HD
#endif

typedef enum h3_dtype {
    H3_F32 = 0,
    H3_F16,
    H3_BF16,
    H3_F64,
    H3_F8_E4M3,
    H3_F8_E5M2,
    H3_I8,
    H3_U8,
    H3_I16,
    H3_U16,
    H3_I32,
    H3_U32,
    H3_I64,
    H3_U64,
    H3_BOOL,
    H3_DTYPE_COUNT
} h3_dtype;

size_t h3_dtype_size(h3_dtype t);
/* Lower-case name for messages ("bf16"). */
const char *h3_dtype_name(h3_dtype t);
/* safetensors spelling ("BF16"). */
const char *h3_dtype_st_name(h3_dtype t);
/* Parses a safetensors dtype string; returns 0 when unknown. */
int h3_dtype_from_st(const char *s, h3_dtype *out);
int h3_dtype_is_float(h3_dtype t);

static inline float h3_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t h3_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* IEEE half to float, exact (subnormals renormalized); host and device (GGUF blocks decode on both). */
static inline H3_HD float h3_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: renormalize */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while ((man & 0x400u) == 0);
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    union {
        uint32_t u;
        float f;
    } c;
    c.u = u;
    return c.f;
}
uint16_t h3_f32_to_f16(float f);
float h3_fp8e4m3_to_f32(uint8_t v);
uint8_t h3_f32_to_fp8e4m3(float f);

/* Bulk conversions of n contiguous elements. */
void h3_convert_bf16_to_f32(const uint16_t *src, float *dst, size_t n);
void h3_convert_f16_to_f32(const uint16_t *src, float *dst, size_t n);
void h3_convert_f32_to_bf16(const float *src, uint16_t *dst, size_t n);
void h3_convert_f32_to_f16(const float *src, uint16_t *dst, size_t n);
/* Any float dtype to f32 (f32, f16, bf16, f64, fp8 without scale). Returns 0 for non-float types. */
int h3_convert_to_f32(h3_dtype t, const void *src, float *dst, size_t n);
/* f32 to f32/f16/bf16/fp8 e4m3. Returns 0 for other targets. */
int h3_convert_from_f32(h3_dtype t, const float *src, void *dst, size_t n);

#endif
