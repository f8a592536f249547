/* Stored weight formats: the traits table, the row decoders, ConvRot and E2M1 (contracts in qformat.h). */
#include "tensor/qformat.h"

#include "base/alloc.h"
#include "tensor/gguf_blocks.h"

/* ---- row decoders
 * ------------------------------------------------------------------------------------------ */

static void row_int8(const uint8_t *src, float *dst, int64_t n, const h3_qrow_side *side) {
    (void)side;
    const int8_t *s8 = (const int8_t *)src;
    for (int64_t c = 0; c < n; c++) dst[c] = (float)s8[c];
}

static void row_fp8(const uint8_t *src, float *dst, int64_t n, const h3_qrow_side *side) {
    (void)side;
    h3_convert_to_f32(H3_F8_E4M3, src, dst, (size_t)n);
}

static void row_nvfp4(const uint8_t *src, float *dst, int64_t n, const h3_qrow_side *side) {
    const int64_t C = n / 16;
    for (int64_t c = 0; c < C; c++) {
        /* In f32, rounding once: the scales' product, then each value times it (comfy-kitchen's eager
         * dequantize_nvfp4 with output f32; NVIDIA's exporter computes the same). */
        const float ts =
            h3_fp8e4m3_to_f32(side->block_scales[h3_nvfp4_scale_index(side->row, c, C)]) * side->scale2;
        const uint8_t *p = src + c * 8;
        float *d = dst + c * 16;
        for (int i = 0; i < 8; i++) { /* the high nibble first */
            d[2 * i] = h3_e2m1_to_f32(p[i] >> 4) * ts;
            d[2 * i + 1] = h3_e2m1_to_f32(p[i] & 15) * ts;
        }
    }
}

/* One row decoder per GGUF format: its blocks one after the other (ggml's dequantize_row_*). */
#define H3_GGUF_ROW(F, deq, be, bb)                                                                          \
    static void row_##F(const uint8_t *src, float *dst, int64_t n, const h3_qrow_side *side) {               \
        (void)side;                                                                                          \
        for (int64_t i = 0; i < n / (be); i++) deq(src + i * (bb), dst + i * (be));                          \
    }
H3_GGUF_FORMATS(H3_GGUF_ROW)

/* ---- the table
 * --------------------------------------------------------------------------------------------- */

#define H3_GGUF_TRAITS(F, deq, be, bb) [H3_QF_##F] = {#F, be, bb, 1, row_##F},

/* clang-format off */
static const h3_qformat_traits g_traits[H3_QF_COUNT] = {
    [H3_QF_NONE] = {"none", 1, 0, 0, NULL},
    [H3_QF_INT8] = {"int8_tensorwise", 1, 1, 0, row_int8},
    [H3_QF_FP8] = {"float8_e4m3fn", 1, 1, 0, row_fp8},
    [H3_QF_NVFP4] = {"nvfp4", 16, 8, 1, row_nvfp4},
    H3_GGUF_FORMATS(H3_GGUF_TRAITS)
};
/* clang-format on */

const h3_qformat_traits *h3_qformat_get_traits(h3_qformat f) {
    return (unsigned)f < H3_QF_COUNT ? &g_traits[f] : NULL;
}

const char *h3_qformat_name(h3_qformat f) {
    return (unsigned)f < H3_QF_COUNT ? g_traits[f].name : "?";
}

int h3_qformat_block(h3_qformat f, int64_t *elems, int64_t *bytes) {
    if ((unsigned)f >= H3_QF_COUNT || !g_traits[f].packed) return 0;
    if (elems) *elems = g_traits[f].block_elems;
    if (bytes) *bytes = g_traits[f].block_bytes;
    return 1;
}

int64_t h3_qformat_row_bytes(h3_qformat f, int64_t cols) {
    int64_t be, bb;
    if (!h3_qformat_block(f, &be, &bb) || cols < 0 || cols % be) return -1;
    int64_t r;
    if (!h3_mul_i64(cols / be, bb, &r)) return -1;
    return r;
}

/* ---- ConvRot
 * ----------------------------------------------------------------------------------------------- */

int h3_convrot_group_ok(int64_t g) {
    if (g < 4) return 0;
    while (g > 1) {
        if (g % 4) return 0;
        g /= 4;
    }
    return 1;
}

void h3_convrot_apply(float *v, int64_t n, int64_t g) {
    /* H_g = ⊗ H4 / sqrt(g): one radix-4 stage per base-4 digit of the index (stride 1, 4, 16, ...), each with
     * H4/2 (orthonormal). With s = x0+x1+x2+x3, H4·x = (s − 2x3, s − 2x2, s − 2x1, s − 2x0). */
    for (int64_t base = 0; base + g <= n; base += g) {
        float *x = v + base;
        for (int64_t st = 1; st < g; st *= 4)
            for (int64_t b0 = 0; b0 < g; b0 += 4 * st)
                for (int64_t o = 0; o < st; o++) {
                    float *p = x + b0 + o;
                    float x0 = p[0], x1 = p[st], x2 = p[2 * st], x3 = p[3 * st];
                    p[0] = 0.5f * ((x0 + x1) + (x2 - x3));
                    p[st] = 0.5f * ((x0 + x1) - (x2 - x3));
                    p[2 * st] = 0.5f * ((x0 - x1) + (x2 + x3));
                    p[3 * st] = 0.5f * ((x2 + x3) - (x0 - x1));
                }
    }
}

/* ---- the GPU
 * ----------------------------------------------------------------------------------------------- */

int h3_quant_gpu_supported(const h3_tensor *w, const char **why) {
    const char *dummy;
    if (!why) why = &dummy;
    *why = NULL;
    const h3_scale_mode m = w->q.mode;
    const int float_dt = w->dtype == H3_F32 || w->dtype == H3_BF16 || w->dtype == H3_F16;
    if (m == H3_SCALE_NONE && float_dt) return 1;
    if (m == H3_SCALE_FORMAT) {
        int64_t be;
        if (w->q.format == H3_QF_NVFP4) {
            if (h3_tensor_cols(w) % 16 == 0) return 1;
            *why = "nvfp4 with K not a multiple of 16";
            return 0;
        }
        if (h3_qformat_block((h3_qformat)w->q.format, &be, NULL) && be <= 256 && h3_tensor_cols(w) % be == 0)
            return 1;
        *why = "this packed format";
        return 0;
    }
    if (w->dtype == H3_I8 && (m == H3_SCALE_ROW || m == H3_SCALE_TENSOR) && !w->q.col_scale) return 1;
    if ((w->dtype == H3_F8_E4M3 || w->dtype == H3_F8_E5M2) &&
        (m == H3_SCALE_ROW || m == H3_SCALE_TENSOR || m == H3_SCALE_NONE) && !w->q.rot_group &&
        !w->q.col_scale)
        return 1;
    *why = m == H3_SCALE_BLOCK ? "block scales" : "this dtype and scale form";
    return 0;
}
