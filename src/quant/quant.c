/* Quantizers, ComfyUI's markers and quantized tensors' side data (contracts in quant.h; the formats' traits
 * and decoders are tensor/qformat.c). */
#include "quant/quant.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/json.h"

/* ---- quantizers
 * --------------------------------------------------------------------------------------------- */

uint8_t h3_f32_to_e2m1(float x) {
    uint8_t sign = signbit(x) ? 8 : 0;
    float a = fabsf(x);
    if (!(a == a)) return 0;
    if (a >= 6.0f) return sign | 7;
    /* Nearest of the 8 magnitudes; on a tie the even code (mantissa bit 0), as round-half-even does. */
    int best = 0;
    float bd = a;
    for (int c = 1; c < 8; c++) {
        float d = fabsf(a - h3_e2m1_to_f32((uint8_t)c));
        if (d < bd || (d == bd && (c & 1) == 0)) {
            bd = d;
            best = c;
        }
    }
    return sign | (uint8_t)best;
}

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
        int finite = 1;
        for (int64_t c = 0; c < K; c++) {
            amax = fmaxf(amax, fabsf(tmp[c]));
            finite &= isfinite(tmp[c]) != 0;
        }
        if (!finite) { /* NaN or an infinity: no code holds it; the row's scale keeps it, so the row decodes NaN */
            scales[r] = NAN;
            memset(q + r * K, 0, (size_t)K);
            continue;
        }
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

/* The largest finite magnitude: a value that is not finite takes no part in a scale (its own code or block keeps
 * it not finite instead). */
static float amax_of(const float *w, size_t n) {
    float a = 0.0f;
    for (size_t i = 0; i < n; i++)
        if (isfinite(w[i])) a = fmaxf(a, fabsf(w[i]));
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
        if (!isfinite(w[i])) { /* e4m3 has no infinity: NaN's code keeps the value not finite */
            q[i] = 0x7f;
            continue;
        }
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
            uint8_t *p = packed + r * (K / 2) + c * 8;
            int finite = 1;
            for (int i = 0; i < 16; i++) finite &= isfinite(x[i]) != 0;
            if (!finite) { /* no code holds NaN or an infinity: the block's scale (e4m3's NaN) keeps it */
                scales[h3_nvfp4_scale_index(r, c, C)] = 0x7f;
                memset(p, 0, 8);
                continue;
            }
            float bs = amax_of(x, 16) / 6.0f / scale2;
            if (bs > 448.0f) bs = 448.0f;
            uint8_t bq = h3_f32_to_fp8e4m3(bs);
            scales[h3_nvfp4_scale_index(r, c, C)] = bq;
            float total = scale2 * h3_fp8e4m3_to_f32(bq);
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
