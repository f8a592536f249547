/* GGUF block decoding shared by the CPU (the row decoders of tensor/qformat.c) and the GPU
 * (cuda/cuda_qgemm.cu): ggml's dequantize_row_* (ggml/src/ggml-quants.c), one block of 32 or 256 values at a
 * time, value for value. Header-only so both backends compile the same arithmetic. */
#ifndef H3_TENSOR_GGUF_BLOCKS_H
#define H3_TENSOR_GGUF_BLOCKS_H

#include <stdint.h>

#include "tensor/dtype.h"
#include "tensor/qformat.h"

static inline H3_HD float f16_at(const uint8_t *p) {
    return h3_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
}

static inline H3_HD uint32_t u32_at(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Q4_0 {f16 d; u8 qs[16]}: y[j] = (lo(qs[j]) − 8)·d, y[j+16] = (hi(qs[j]) − 8)·d. */
static inline H3_HD void deq_q4_0(const uint8_t *b, float *y) {
    const float d = f16_at(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)((qs[j] & 0x0F) - 8) * d;
        y[j + 16] = (float)((qs[j] >> 4) - 8) * d;
    }
}

/* Q4_1 {f16 d, m; u8 qs[16]}: x·d + m. */
static inline H3_HD void deq_q4_1(const uint8_t *b, float *y) {
    const float d = f16_at(b), m = f16_at(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)(qs[j] & 0x0F) * d + m;
        y[j + 16] = (float)(qs[j] >> 4) * d + m;
    }
}

/* Q5_0 {f16 d; u8 qh[4]; u8 qs[16]}: the fifth bit of value j is bit j of qh (little-endian u32). */
static inline H3_HD void deq_q5_0(const uint8_t *b, float *y) {
    const float d = f16_at(b);
    const uint32_t qh = u32_at(b + 2);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        const uint8_t xh0 = (uint8_t)(((qh >> (j + 0)) << 4) & 0x10);
        const uint8_t xh1 = (uint8_t)((qh >> (j + 12)) & 0x10);
        y[j] = (float)(((qs[j] & 0x0F) | xh0) - 16) * d;
        y[j + 16] = (float)(((qs[j] >> 4) | xh1) - 16) * d;
    }
}

/* Q5_1 {f16 d, m; u8 qh[4]; u8 qs[16]}. */
static inline H3_HD void deq_q5_1(const uint8_t *b, float *y) {
    const float d = f16_at(b), m = f16_at(b + 2);
    const uint32_t qh = u32_at(b + 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 16; j++) {
        const uint8_t xh0 = (uint8_t)(((qh >> (j + 0)) << 4) & 0x10);
        const uint8_t xh1 = (uint8_t)((qh >> (j + 12)) & 0x10);
        y[j] = (float)((qs[j] & 0x0F) | xh0) * d + m;
        y[j + 16] = (float)((qs[j] >> 4) | xh1) * d + m;
    }
}

/* Q8_0 {f16 d; i8 qs[32]}. */
static inline H3_HD void deq_q8_0(const uint8_t *b, float *y) {
    const float d = f16_at(b);
    for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
}

/* Q2_K {u8 scales[16]; u8 qs[64]; f16 d, dmin}: 16 sub-blocks of 16, 4-bit scale and min each. */
static inline H3_HD void deq_q2_k(const uint8_t *b, float *y) {
    const uint8_t *sc = b, *q = b + 16;
    const float d = f16_at(b + 80), min = f16_at(b + 82);
    int is = 0;
    for (int n = 0; n < 256; n += 128) {
        int shift = 0;
        for (int j = 0; j < 4; j++) {
            uint8_t s = sc[is++];
            float dl = d * (float)(s & 0xF), ml = min * (float)(s >> 4);
            for (int l = 0; l < 16; l++) *y++ = dl * (float)((int8_t)((q[l] >> shift) & 3)) - ml;
            s = sc[is++];
            dl = d * (float)(s & 0xF);
            ml = min * (float)(s >> 4);
            for (int l = 0; l < 16; l++) *y++ = dl * (float)((int8_t)((q[l + 16] >> shift) & 3)) - ml;
            shift += 2;
        }
        q += 32;
    }
}

/* Q3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}: 16 6-bit signed scales packed in 12 bytes. */
static inline H3_HD void deq_q3_k(const uint8_t *b, float *y) {
    const uint8_t *hm = b, *q = b + 32;
    const float d_all = f16_at(b + 108);
    const uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
    uint32_t aux[4];
    int8_t scales[16];
    aux[0] = u32_at(b + 96);
    aux[1] = u32_at(b + 100);
    aux[2] = u32_at(b + 104);
    uint32_t tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
    aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
    aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
    aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
    for (int i = 0; i < 16; i++) scales[i] = (int8_t)(uint8_t)(aux[i / 4] >> (8 * (i % 4)));
    int is = 0;
    uint8_t m = 1;
    for (int n = 0; n < 256; n += 128) {
        int shift = 0;
        for (int j = 0; j < 4; j++) {
            float dl = d_all * (float)(scales[is++] - 32);
            for (int l = 0; l < 16; l++)
                *y++ = dl * (float)((int8_t)((q[l + 0] >> shift) & 3) - ((hm[l + 0] & m) ? 0 : 4));
            dl = d_all * (float)(scales[is++] - 32);
            for (int l = 0; l < 16; l++)
                *y++ = dl * (float)((int8_t)((q[l + 16] >> shift) & 3) - ((hm[l + 16] & m) ? 0 : 4));
            shift += 2;
            m = (uint8_t)(m << 1);
        }
        q += 32;
    }
}

/* The 6-bit scale and min of sub-block j of a Q4_K/Q5_K block (get_scale_min_k4). */
static inline H3_HD void scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

/* Q4_K {f16 d, dmin; u8 scales[12]; u8 qs[128]}: 8 sub-blocks of 32. */
static inline H3_HD void deq_q4_k(const uint8_t *b, float *y) {
    const float d = f16_at(b), min = f16_at(b + 2);
    const uint8_t *sc = b + 4, *q = b + 16;
    int is = 0;
    uint8_t s, m;
    for (int j = 0; j < 256; j += 64) {
        scale_min_k4(is + 0, sc, &s, &m);
        const float d1 = d * (float)s, m1 = min * (float)m;
        scale_min_k4(is + 1, sc, &s, &m);
        const float d2 = d * (float)s, m2 = min * (float)m;
        for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0xF) - m1;
        for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
        q += 32;
        is += 2;
    }
}

/* Q5_K {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}. */
static inline H3_HD void deq_q5_k(const uint8_t *b, float *y) {
    const float d = f16_at(b), min = f16_at(b + 2);
    const uint8_t *sc = b + 4, *qh = b + 16, *ql = b + 48;
    int is = 0;
    uint8_t s, m, u1 = 1, u2 = 2;
    for (int j = 0; j < 256; j += 64) {
        scale_min_k4(is + 0, sc, &s, &m);
        const float d1 = d * (float)s, m1 = min * (float)m;
        scale_min_k4(is + 1, sc, &s, &m);
        const float d2 = d * (float)s, m2 = min * (float)m;
        for (int l = 0; l < 32; l++) *y++ = d1 * (float)((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
        for (int l = 0; l < 32; l++) *y++ = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        ql += 32;
        is += 2;
        u1 = (uint8_t)(u1 << 2);
        u2 = (uint8_t)(u2 << 2);
    }
}

/* Q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}. */
static inline H3_HD void deq_q6_k(const uint8_t *b, float *y) {
    const float d = f16_at(b + 208);
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    for (int n = 0; n < 256; n += 128) {
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            const int8_t q1 = (int8_t)((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int8_t q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int8_t q3 = (int8_t)((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int8_t q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l + 0] = d * (float)sc[is + 0] * (float)q1;
            y[l + 32] = d * (float)sc[is + 2] * (float)q2;
            y[l + 64] = d * (float)sc[is + 4] * (float)q3;
            y[l + 96] = d * (float)sc[is + 6] * (float)q4;
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
    }
}

/* Every GGUF block format h3run decodes: X(format, block decoder, values per block, bytes per block). The one
 * list the host's traits table (tensor/qformat.c) and the device's dispatch below are made from. */
#define H3_GGUF_FORMATS(X)                                                                                   \
    X(Q4_0, deq_q4_0, 32, 18)                                                                                \
    X(Q4_1, deq_q4_1, 32, 20)                                                                                \
    X(Q5_0, deq_q5_0, 32, 22)                                                                                \
    X(Q5_1, deq_q5_1, 32, 24)                                                                                \
    X(Q8_0, deq_q8_0, 32, 34)                                                                                \
    X(Q2_K, deq_q2_k, 256, 84)                                                                               \
    X(Q3_K, deq_q3_k, 256, 110)                                                                              \
    X(Q4_K, deq_q4_k, 256, 144)                                                                              \
    X(Q5_K, deq_q5_k, 256, 176)                                                                              \
    X(Q6_K, deq_q6_k, 256, 210)

#define H3_GGUF_CASE(F, deq, be, bb)                                                                         \
    case H3_QF_##F:                                                                                          \
        deq(b, y);                                                                                           \
        return 1;

/* One block of format f (a GGUF block format of qformat.h) at b into y (its h3_qformat_block element count);
 * returns 0 for another format. The device decodes through this switch (the host through qformat.c's table,
 * made from the same list). */
static inline H3_HD int h3_gguf_block_decode(int f, const uint8_t *b, float *y) {
    switch (f) {
        H3_GGUF_FORMATS(H3_GGUF_CASE)
        default:
            return 0;
    }
}

#endif
