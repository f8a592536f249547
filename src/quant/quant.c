/* Quantized formats: names, ConvRot, E2M1, row decoding, quantizers and ComfyUI's markers (contracts in
 * quant.h). */
#include "quant/quant.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/json.h"
#include "io/gguf.h"

static const char *const g_names[H3_QF_COUNT] = {
    [H3_QF_NONE] = "none",         [H3_QF_INT8] = "int8_tensorwise",
    [H3_QF_FP8] = "float8_e4m3fn", [H3_QF_NVFP4] = "nvfp4",
    [H3_QF_Q4_0] = "Q4_0",         [H3_QF_Q4_1] = "Q4_1",
    [H3_QF_Q5_0] = "Q5_0",         [H3_QF_Q5_1] = "Q5_1",
    [H3_QF_Q8_0] = "Q8_0",         [H3_QF_Q2_K] = "Q2_K",
    [H3_QF_Q3_K] = "Q3_K",         [H3_QF_Q4_K] = "Q4_K",
    [H3_QF_Q5_K] = "Q5_K",         [H3_QF_Q6_K] = "Q6_K",
};

const char *h3_qformat_name(h3_qformat f) {
    return (unsigned)f < H3_QF_COUNT ? g_names[f] : "?";
}

int h3_qformat_block(h3_qformat f, int64_t *elems, int64_t *bytes) {
    static const struct {
        int64_t e, b;
    } t[H3_QF_COUNT] = {
        [H3_QF_NVFP4] = {16, 8},   [H3_QF_Q4_0] = {32, 18},   [H3_QF_Q4_1] = {32, 20},
        [H3_QF_Q5_0] = {32, 22},   [H3_QF_Q5_1] = {32, 24},   [H3_QF_Q8_0] = {32, 34},
        [H3_QF_Q2_K] = {256, 84},  [H3_QF_Q3_K] = {256, 110}, [H3_QF_Q4_K] = {256, 144},
        [H3_QF_Q5_K] = {256, 176}, [H3_QF_Q6_K] = {256, 210},
    };
    if ((unsigned)f >= H3_QF_COUNT || !t[f].e) return 0;
    if (elems) *elems = t[f].e;
    if (bytes) *bytes = t[f].b;
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
 * ------------------------------------------------------------------------------------------------ */

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

/* ---- E2M1
 * ---------------------------------------------------------------------------------------------------- */

static const float g_e2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                 -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

float h3_e2m1_to_f32(uint8_t code) {
    return g_e2m1[code & 15];
}

uint8_t h3_f32_to_e2m1(float x) {
    uint8_t sign = signbit(x) ? 8 : 0;
    float a = fabsf(x);
    if (!(a == a)) return 0;
    if (a >= 6.0f) return sign | 7;
    /* Nearest of the 8 magnitudes; on a tie the even code (mantissa bit 0), as round-half-even does. */
    int best = 0;
    float bd = a;
    for (int c = 1; c < 8; c++) {
        float d = fabsf(a - g_e2m1[c]);
        if (d < bd || (d == bd && (c & 1) == 0)) {
            bd = d;
            best = c;
        }
    }
    return sign | (uint8_t)best;
}

/* ---- decoding ---------------------------------------------------------------------------------------------
 */

static h3_status decode_nvfp4(const h3_tensor *t, int64_t r0, int64_t n, int64_t ld, float *dst) {
    const int64_t K = h3_tensor_cols(t), C = K / 16;
    if (!t->q.fmt_scales) return H3_ERR(H3_ERR_INVALID, "an nvfp4 tensor needs its block scales");
    float lut[256][2]; /* both values of a byte, high nibble first */
    for (int b = 0; b < 256; b++) {
        lut[b][0] = g_e2m1[b >> 4];
        lut[b][1] = g_e2m1[b & 15];
    }
    const float s2 = t->q.scale;
    for (int64_t r = 0; r < n; r++) {
        const uint8_t *src = (const uint8_t *)t->data + (r0 + r) * ld;
        const int64_t gr = t->q.fmt_row0 + r0 + r;
        float *d = dst + r * K;
        for (int64_t c = 0; c < C; c++) {
            /* In f32, rounding once: the scales' product, then each value times it (comfy-kitchen's eager
             * dequantize_nvfp4 with output f32; NVIDIA's exporter computes the same). */
            float ts = h3_fp8e4m3_to_f32(t->q.fmt_scales[h3_nvfp4_scale_index(gr, c, C)]) * s2;
            const uint8_t *p = src + c * 8;
            for (int i = 0; i < 8; i++) {
                d[c * 16 + 2 * i] = lut[p[i]][0] * ts;
                d[c * 16 + 2 * i + 1] = lut[p[i]][1] * ts;
            }
        }
    }
    return H3_OK;
}

h3_status h3_quant_decode_rows(const h3_tensor *t, int64_t r0, int64_t n, float *dst) {
    if (t->q.mode != H3_SCALE_FORMAT) return H3_ERR(H3_ERR_INVALID, "not a packed-format tensor");
    const h3_qformat f = (h3_qformat)t->q.format;
    const int64_t K = h3_tensor_cols(t);
    const int64_t ld = t->ndim == 2 ? t->stride[0] : 0;
    const int64_t rb = h3_qformat_row_bytes(f, K);
    if (t->dtype != H3_U8 || t->ndim != 2 || t->stride[1] != 1 || rb < 0 || ld < rb)
        return H3_ERR(H3_ERR_INVALID,
                      "a %s tensor of %lld columns needs 2-D U8 rows of %lld bytes (row stride %lld)",
                      h3_qformat_name(f), (long long)K, (long long)rb, (long long)ld);
    if (f == H3_QF_NVFP4) return decode_nvfp4(t, r0, n, ld, dst);
    for (int64_t r = 0; r < n; r++)
        h3_gguf_dequant(f, (const uint8_t *)t->data + (r0 + r) * ld, dst + r * K, K);
    return H3_OK;
}

/* ---- quantizers
 * --------------------------------------------------------------------------------------------- */

h3_status h3_quantize_int8_rows(const float *w, int64_t N, int64_t K, int group, int8_t *q, float *scales) {
    if (group && (!h3_convrot_group_ok(group) || K % group))
        return H3_ERR(H3_ERR_INVALID, "ConvRot group %d must be a power of 4 dividing K = %lld", group,
                      (long long)K);
    float *tmp = h3_malloc((size_t)(K > 0 ? K : 1) * sizeof(float), H3_MEM_WORKSPACE);
    if (!tmp) return H3_ERR_NOMEM;
    for (int64_t r = 0; r < N; r++) {
        memcpy(tmp, w + r * K, (size_t)K * sizeof(float));
        if (group) h3_convrot_apply(tmp, K, group);
        float amax = 0.0f;
        for (int64_t c = 0; c < K; c++) amax = fmaxf(amax, fabsf(tmp[c]));
        float s = amax / 127.0f;
        if (!(s >= 1e-30f)) s = 1e-30f;
        scales[r] = s;
        for (int64_t c = 0; c < K; c++) {
            float v = rintf(tmp[c] / s);
            q[r * K + c] = (int8_t)(v > 127.0f ? 127.0f : v < -128.0f ? -128.0f : v);
        }
    }
    h3_free(tmp);
    return H3_OK;
}

static float amax_of(const float *w, size_t n) {
    float a = 0.0f;
    for (size_t i = 0; i < n; i++) a = fmaxf(a, fabsf(w[i]));
    return a;
}

float h3_quantize_fp8_scale(const float *w, size_t n) {
    float s = amax_of(w, n) / 448.0f;
    return s > 0.0f ? s : 1.0f;
}

void h3_quantize_fp8(const float *w, size_t n, float scale, uint8_t *q) {
    const float inv = 1.0f / scale;
    for (size_t i = 0; i < n; i++) {
        float v = w[i] * inv;
        v = v > 448.0f ? 448.0f : v < -448.0f ? -448.0f : v;
        q[i] = h3_f32_to_fp8e4m3(v);
    }
}

float h3_quantize_nvfp4_scale2(const float *w, size_t n) {
    float s = amax_of(w, n) / 2688.0f; /* 448 · 6 */
    return s > 0.0f ? s : 1.0f;
}

h3_status h3_quantize_nvfp4(const float *w, int64_t N, int64_t K, float scale2, uint8_t *packed,
                            uint8_t *scales) {
    if (K % 16) return H3_ERR(H3_ERR_INVALID, "nvfp4 needs K a multiple of 16, got %lld", (long long)K);
    memset(scales, 0, (size_t)h3_nvfp4_scale_count(N, K));
    h3_quantize_nvfp4_rows(w, 0, N, K, scale2, packed, scales);
    return H3_OK;
}

void h3_quantize_nvfp4_rows(const float *w, int64_t r0, int64_t r1, int64_t K, float scale2, uint8_t *packed,
                            uint8_t *scales) {
    const int64_t C = K / 16;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c = 0; c < C; c++) {
            const float *x = w + r * K + c * 16;
            float bs = amax_of(x, 16) / 6.0f / scale2;
            if (bs > 448.0f) bs = 448.0f;
            uint8_t bq = h3_f32_to_fp8e4m3(bs);
            scales[h3_nvfp4_scale_index(r, c, C)] = bq;
            float total = scale2 * h3_fp8e4m3_to_f32(bq);
            uint8_t *p = packed + r * (K / 2) + c * 8;
            for (int i = 0; i < 8; i++) {
                float a = total == 0.0f ? 0.0f : x[2 * i] / total,
                      b = total == 0.0f ? 0.0f : x[2 * i + 1] / total;
                a = a > 6.0f ? 6.0f : a < -6.0f ? -6.0f : a;
                b = b > 6.0f ? 6.0f : b < -6.0f ? -6.0f : b;
                p[i] = (uint8_t)(h3_f32_to_e2m1(a) << 4 | h3_f32_to_e2m1(b));
            }
        }
}

/* ---- markers
 * ------------------------------------------------------------------------------------------------ */

h3_status h3_qmarker_parse(const void *bytes, size_t n, const char *what, h3_qmarker *out) {
    memset(out, 0, sizeof *out);
    json_t *j = NULL;
    h3_status st = h3_json_parse(bytes, n, what, &j);
    if (st != H3_OK) return st;
    if (!json_is_object(j)) {
        json_decref(j);
        return H3_ERR(H3_ERR_FORMAT, "%s: the comfy_quant marker is not a JSON object", what);
    }
    const char *f = h3_json_get_str(j, "format");
    if (!f) {
        json_decref(j);
        return H3_ERR(H3_ERR_FORMAT, "%s: the comfy_quant marker has no \"format\" string", what);
    }
    if (!strcmp(f, "int8_tensorwise")) {
        out->fmt = H3_QF_INT8;
        json_t *cr = json_object_get(j, "convrot"), *gs = json_object_get(j, "convrot_groupsize");
        if (cr && !json_is_boolean(cr))
            st = H3_ERR(H3_ERR_FORMAT, "%s: \"convrot\" must be true or false", what);
        out->convrot = json_is_true(cr);
        out->group = 256; /* comfy-kitchen's default */
        if (st == H3_OK && gs) {
            if (!json_is_integer(gs) || !h3_convrot_group_ok(json_integer_value(gs)) ||
                json_integer_value(gs) > (1 << 20))
                st = H3_ERR(H3_ERR_FORMAT,
                            "%s: \"convrot_groupsize\" must be a power of 4 (4, 16, 64, 256, ...)", what);
            else
                out->group = (int)json_integer_value(gs);
        }
        if (!out->convrot) out->group = 0;
    } else if (!strcmp(f, "float8_e4m3fn")) {
        out->fmt = H3_QF_FP8;
    } else if (!strcmp(f, "nvfp4")) {
        out->fmt = H3_QF_NVFP4;
        out->full_precision_mm = json_is_true(json_object_get(j, "full_precision_matrix_mult"));
    } else {
        st = H3_ERR(
            H3_ERR_UNSUPPORTED,
            "%s: quantization format '%s' is not supported (h3run reads int8_tensorwise with or without "
            "convrot, float8_e4m3fn and nvfp4)",
            what, f);
    }
    json_decref(j);
    return st;
}

int h3_qmarker_json(const h3_qmarker *m, char *buf, size_t n) {
    int len;
    switch (m->fmt) {
        case H3_QF_INT8:
            if (m->convrot)
                len = snprintf(
                    buf, n, "{\"format\": \"int8_tensorwise\", \"convrot\": true, \"convrot_groupsize\": %d}",
                    m->group);
            else
                len = snprintf(buf, n, "{\"format\": \"int8_tensorwise\"}");
            break;
        case H3_QF_FP8:
            len = snprintf(buf, n, "{\"format\": \"float8_e4m3fn\"}");
            break;
        case H3_QF_NVFP4:
            if (m->full_precision_mm)
                len = snprintf(buf, n, "{\"format\": \"nvfp4\", \"full_precision_matrix_mult\": true}");
            else
                len = snprintf(buf, n, "{\"format\": \"nvfp4\"}");
            break;
        default:
            return -1;
    }
    return len >= 0 && (size_t)len < n ? len : -1;
}

/* ---- quantized weights on a device ----------------------------------------------------------------------
 */

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

int h3_quant_aux(const h3_tensor *t, h3_qaux parts[2]) {
    int n = 0;
    const int64_t rows = h3_tensor_rows(t), cols = h3_tensor_cols(t);
    if ((t->q.mode == H3_SCALE_ROW || t->q.mode == H3_SCALE_BLOCK) && t->q.scales) {
        int64_t per = t->q.mode == H3_SCALE_BLOCK && t->q.block > 0 ? cols / t->q.block : 1;
        parts[n++] = (h3_qaux){t->q.scales, rows * per * 4};
    }
    if (t->q.mode == H3_SCALE_FORMAT && t->q.format == H3_QF_NVFP4) {
        if (t->q.fmt_row0 != 0) return -1;
        if (t->q.fmt_scales) parts[n++] = (h3_qaux){t->q.fmt_scales, h3_nvfp4_scale_count(rows, cols)};
    }
    if (t->q.col_scale) parts[n++] = (h3_qaux){t->q.col_scale, cols * 2};
    return n;
}

void h3_quant_aux_rebind(h3_tensor *t, void *const copies[2]) {
    int n = 0;
    if ((t->q.mode == H3_SCALE_ROW || t->q.mode == H3_SCALE_BLOCK) && t->q.scales) t->q.scales = copies[n++];
    if (t->q.mode == H3_SCALE_FORMAT && t->q.format == H3_QF_NVFP4 && t->q.fmt_scales)
        t->q.fmt_scales = copies[n++];
    if (t->q.col_scale) t->q.col_scale = copies[n++];
}
