/* Qwen3-VL's vision tower and image processor. The contract and the formulas are in vision.h. */
#include "models/vision.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/fs.h"
#include "cuda/cuda.h"
#include "io/safetensors.h"
#include "io/wbind.h"
#include "mem/pack.h"
#include "mem/units.h"

#define VIS_CHUNK 1024 /* rows per MLP chunk */

/* ---- config -----------------------------------------------------------------------------------------------
 */

void h3_vis_config_default(h3_vis_config *c) {
    memset(c, 0, sizeof *c);
    c->depth = 27;
    c->hidden = 1152;
    c->intermediate = 4304;
    c->heads = 16;
    c->in_channels = 3;
    c->patch = 16;
    c->temporal_patch = 2;
    c->merge = 2;
    c->out_hidden = 5120;
    c->num_pos = 2304;
    c->n_deep = 3;
    c->deep_idx[0] = 8;
    c->deep_idx[1] = 16;
    c->deep_idx[2] = 24;
    c->act_tanh = 1;
    c->min_pixels = 65536;
    c->max_pixels = 16777216;
    c->video_min_pixels = 4096;
    c->video_max_pixels = 25165824;
    for (int i = 0; i < 3; i++) c->mean[i] = c->std[i] = 0.5f;
    c->image_token_id = 151655;
    c->video_token_id = 151656;
    c->vision_start_token_id = 151652;
}

static h3_status get_int(const json_t *o, const char *key, const char *what, int64_t lo, int64_t *out) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return H3_OK;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > ((int64_t)1 << 40))
        return H3_ERR(H3_ERR_FORMAT, "%s: \"%s\" must be an integer >= %lld", what, key, (long long)lo);
    *out = json_integer_value(v);
    return H3_OK;
}

/* config.json's vision_config and token ids over the defaults. */
static h3_status config_from_json(const json_t *j, const char *what, h3_vis_config *c) {
    H3_TRY(get_int(j, "image_token_id", what, 0, &c->image_token_id));
    H3_TRY(get_int(j, "video_token_id", what, 0, &c->video_token_id));
    H3_TRY(get_int(j, "vision_start_token_id", what, 0, &c->vision_start_token_id));
    const json_t *v = json_object_get(j, "vision_config");
    if (!json_is_object(v)) return H3_OK;
    H3_TRY(get_int(v, "depth", what, 1, &c->depth));
    H3_TRY(get_int(v, "hidden_size", what, 1, &c->hidden));
    H3_TRY(get_int(v, "intermediate_size", what, 1, &c->intermediate));
    H3_TRY(get_int(v, "num_heads", what, 1, &c->heads));
    H3_TRY(get_int(v, "in_channels", what, 1, &c->in_channels));
    H3_TRY(get_int(v, "patch_size", what, 1, &c->patch));
    H3_TRY(get_int(v, "temporal_patch_size", what, 1, &c->temporal_patch));
    H3_TRY(get_int(v, "spatial_merge_size", what, 1, &c->merge));
    H3_TRY(get_int(v, "out_hidden_size", what, 1, &c->out_hidden));
    H3_TRY(get_int(v, "num_position_embeddings", what, 1, &c->num_pos));
    const json_t *d = json_object_get(v, "deepstack_visual_indexes");
    if (d && !json_is_null(d)) {
        if (!json_is_array(d) || json_array_size(d) > H3_VIS_MAX_DEEP)
            return H3_ERR(H3_ERR_FORMAT,
                          "%s: \"deepstack_visual_indexes\" must be a list of at most %d block indices", what,
                          H3_VIS_MAX_DEEP);
        c->n_deep = (int)json_array_size(d);
        for (int k = 0; k < c->n_deep; k++) {
            const json_t *e = json_array_get(d, (size_t)k);
            if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= c->depth)
                return H3_ERR(H3_ERR_FORMAT, "%s: deepstack_visual_indexes[%d] must be a block index 0..%lld",
                              what, k, (long long)c->depth - 1);
            c->deep_idx[k] = json_integer_value(e);
        }
    }
    const char *act = h3_json_get_str(v, "hidden_act");
    if (act) {
        if (!strcmp(act, "gelu_pytorch_tanh"))
            c->act_tanh = 1;
        else if (!strcmp(act, "gelu"))
            c->act_tanh = 0;
        else
            return H3_ERR(H3_ERR_UNSUPPORTED,
                          "%s: vision hidden_act '%s' is not supported (gelu_pytorch_tanh, gelu)", what, act);
    }
    if (c->hidden % c->heads || (c->hidden / c->heads) % 4)
        return H3_ERR(H3_ERR_FORMAT,
                      "%s: vision hidden_size %lld over %lld heads must give a head size that is a "
                      "multiple of 4 (2-D rotary pairs)",
                      what, (long long)c->hidden, (long long)c->heads);
    const int64_t side = (int64_t)llround(sqrt((double)c->num_pos));
    if (side * side != c->num_pos)
        return H3_ERR(H3_ERR_FORMAT, "%s: num_position_embeddings %lld is not a square", what,
                      (long long)c->num_pos);
    return H3_OK;
}

/* preprocessor_config.json (optional): min/max pixels, mean, std. */
static h3_status proc_from_json(const json_t *j, const char *what, h3_vis_config *c) {
    const json_t *sz = json_object_get(j, "size");
    if (json_is_object(sz)) {
        H3_TRY(get_int(sz, "shortest_edge", what, 1, &c->min_pixels));
        H3_TRY(get_int(sz, "longest_edge", what, 1, &c->max_pixels));
    }
    H3_TRY(get_int(j, "min_pixels", what, 1, &c->min_pixels));
    H3_TRY(get_int(j, "max_pixels", what, 1, &c->max_pixels));
    static const char *const keys[2] = {"image_mean", "image_std"};
    for (int k = 0; k < 2; k++) {
        const json_t *a = json_object_get(j, keys[k]);
        if (!a || json_is_null(a)) continue;
        if (!json_is_array(a) || json_array_size(a) != 3)
            return H3_ERR(H3_ERR_FORMAT, "%s: \"%s\" must be 3 numbers", what, keys[k]);
        for (int i = 0; i < 3; i++) {
            const json_t *e = json_array_get(a, (size_t)i);
            if (!json_is_number(e) || (k == 1 && !(json_number_value(e) > 0)))
                return H3_ERR(H3_ERR_FORMAT, "%s: \"%s\" must be 3 numbers (std above 0)", what, keys[k]);
            (k ? c->std : c->mean)[i] = (float)json_number_value(e);
        }
    }
    if (c->min_pixels > c->max_pixels)
        return H3_ERR(H3_ERR_FORMAT, "%s: min_pixels %lld is above max_pixels %lld", what,
                      (long long)c->min_pixels, (long long)c->max_pixels);
    return H3_OK;
}

/* ---- the image processor ----------------------------------------------------------------------------------
 */

h3_status h3_vis_smart_resize(const h3_vis_config *c, int64_t h, int64_t w, int64_t *oh, int64_t *ow) {
    const int64_t f = c->patch * c->merge;
    if (h < 1 || w < 1)
        return H3_ERR(H3_ERR_INVALID, "the image is %lldx%lld: it has no pixels", (long long)w, (long long)h);
    const double ratio = (double)(h > w ? h : w) / (double)(h > w ? w : h);
    if (ratio > 200)
        return H3_ERR(H3_ERR_INVALID,
                      "the image is %lldx%lld: its aspect ratio %.1f is above 200, which Qwen3-VL's "
                      "processor refuses",
                      (long long)w, (long long)h, ratio);
    /* Python's round(): half to even, what nearbyint does in the default rounding mode */
    int64_t hb = (int64_t)nearbyint((double)h / (double)f) * f,
            wb = (int64_t)nearbyint((double)w / (double)f) * f;
    if ((double)hb * (double)wb > (double)c->max_pixels) {
        const double beta = sqrt((double)(h * w) / (double)c->max_pixels);
        hb = (int64_t)floor((double)h / beta / (double)f) * f;
        wb = (int64_t)floor((double)w / beta / (double)f) * f;
        if (hb < f) hb = f;
        if (wb < f) wb = f;
    } else if ((double)hb * (double)wb < (double)c->min_pixels) {
        const double beta = sqrt((double)c->min_pixels / (double)(h * w));
        hb = (int64_t)ceil((double)h * beta / (double)f) * f;
        wb = (int64_t)ceil((double)w * beta / (double)f) * f;
    }
    *oh = hb;
    *ow = wb;
    return H3_OK;
}

/* PIL's bicubic (a = −0.5), support 2. */
static double bicubic(double x) {
    const double a = -0.5;
    x = fabs(x);
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

/* PIL's Lanczos (a = 3): sinc(x)·sinc(x/3) on [−3, 3). */
static double sinc_pil(double x) {
    if (x == 0.0) return 1.0;
    x *= 3.14159265358979323846;
    return sin(x) / x;
}
static double lanczos(double x) {
    return (-3.0 <= x && x < 3.0) ? sinc_pil(x) * sinc_pil(x / 3.0) : 0.0;
}

typedef struct pil_filter {
    double (*fn)(double);
    double support;
} pil_filter;
static const pil_filter k_bicubic = {bicubic, 2.0}, k_lanczos = {lanczos, 3.0};

#define PIL_PRECISION_BITS (32 - 8 - 2)

/* PIL's precompute_coeffs and normalize_coeffs_8bpc: per output pixel its first source pixel, count and
 * fixed-point weights (ksize each). Returns ksize, 0 on allocation failure. */
/* adaptive: torch's uint8 kernel (aten UpSampleKernelAVXAntialias): the weights as int16 at the largest precision
 * p <= 22 whose next step would not overflow, p found from the axis's largest weight (*prec gets it); else PIL's 22
 * bits. */
static int pil_coeffs(const pil_filter *flt, int in_size, int out_size, int **bounds, int32_t **kk, int adaptive,
                      int *prec) {
    double scale = (double)in_size / out_size, filterscale = scale < 1.0 ? 1.0 : scale;
    const double support = flt->support * filterscale;
    const int ksize = (int)ceil(support) * 2 + 1;
    double *pre = h3_malloc((size_t)out_size * (size_t)ksize * sizeof *pre, H3_MEM_WORKSPACE);
    *kk = h3_malloc((size_t)out_size * (size_t)ksize * sizeof **kk, H3_MEM_WORKSPACE);
    *bounds = h3_malloc((size_t)out_size * 2 * sizeof **bounds, H3_MEM_WORKSPACE);
    if (!pre || !*kk || !*bounds) {
        h3_free(pre);
        return 0;
    }
    for (int xx = 0; xx < out_size; xx++) {
        const double center = (xx + 0.5) * scale, ss = 1.0 / filterscale;
        double ww = 0.0;
        int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5);
        if (xmin < 0) xmin = 0;
        if (xmax > in_size) xmax = in_size;
        xmax -= xmin;
        double *k = &pre[(size_t)xx * ksize];
        int x;
        for (x = 0; x < xmax; x++) {
            const double wv = flt->fn((x + xmin - center + 0.5) * ss);
            k[x] = wv;
            ww += wv;
        }
        for (x = 0; x < xmax; x++)
            if (ww != 0.0) k[x] /= ww;
        for (; x < ksize; x++) k[x] = 0;
        (*bounds)[xx * 2] = xmin;
        (*bounds)[xx * 2 + 1] = xmax;
    }
    int p = PIL_PRECISION_BITS;
    if (adaptive) {
        double wmax = 0.0;
        for (size_t i = 0; i < (size_t)out_size * (size_t)ksize; i++)
            if (pre[i] > wmax) wmax = pre[i];
        for (p = 0; p < 22; p++)
            if ((int)(0.5 + wmax * (double)(1 << (p + 1))) >= (1 << 15)) break;
    }
    *prec = p;
    for (size_t i = 0; i < (size_t)out_size * (size_t)ksize; i++)
        (*kk)[i] = pre[i] < 0 ? (int32_t)(-0.5 + pre[i] * (double)(1 << p)) : (int32_t)(0.5 + pre[i] * (double)(1 << p));
    h3_free(pre);
    return ksize;
}

static uint8_t clip8(int32_t in, int p) {
    if (in >= (1 << p << 8)) return 255;
    if (in <= 0) return 0;
    return (uint8_t)(in >> p);
}

static h3_status pil_resize(const pil_filter *flt, int adaptive, const uint8_t *src, int w, int h, uint8_t *dst,
                            int ow, int oh) {
    if (w < 1 || h < 1 || ow < 1 || oh < 1) return H3_ERR(H3_ERR_INVALID, "resize: empty image");
    int *bh = NULL, *bv = NULL;
    int32_t *kh = NULL, *kv = NULL;
    uint8_t *tmp = NULL;
    h3_status st = H3_OK;
    int ph = 0, pv = 0;
    const int ksh = pil_coeffs(flt, w, ow, &bh, &kh, adaptive, &ph), ksv = pil_coeffs(flt, h, oh, &bv, &kv, adaptive, &pv);
    if (!ksh || !ksv) H3_FAIL(H3_ERR_NOMEM, "out of memory resizing a %dx%d image", w, h);
    const int need_h = ow != w, need_v = oh != h;
    /* the horizontal pass covers only the rows the vertical one reads */
    const int y_first = bv[0], y_last = bv[oh * 2 - 2] + bv[oh * 2 - 1];
    const uint8_t *in = src;
    int in_rows = h, y_off = 0;
    if (need_h) {
        for (int i = 0; i < oh; i++) bv[i * 2] -= y_first;
        in_rows = y_last - y_first;
        tmp = h3_malloc((size_t)in_rows * (size_t)ow * 3, H3_MEM_WORKSPACE);
        if (!tmp) H3_FAIL(H3_ERR_NOMEM, "out of memory resizing a %dx%d image", w, h);
        for (int yy = 0; yy < in_rows; yy++) {
            const uint8_t *row = src + (size_t)(yy + y_first) * (size_t)w * 3;
            for (int xx = 0; xx < ow; xx++) {
                const int xmin = bh[xx * 2], xmax = bh[xx * 2 + 1];
                const int32_t *k = &kh[(size_t)xx * ksh];
                int32_t s0 = 1 << (ph - 1), s1 = s0, s2 = s0;
                for (int x = 0; x < xmax; x++) {
                    const uint8_t *p = row + (size_t)(x + xmin) * 3;
                    s0 += p[0] * k[x];
                    s1 += p[1] * k[x];
                    s2 += p[2] * k[x];
                }
                uint8_t *o = tmp + ((size_t)yy * ow + xx) * 3;
                o[0] = clip8(s0, ph);
                o[1] = clip8(s1, ph);
                o[2] = clip8(s2, ph);
            }
        }
        in = tmp;
    } else {
        y_off = 0;
    }
    const int iw = need_h ? ow : w;
    if (need_v) {
        for (int yy = 0; yy < oh; yy++) {
            const int ymin = bv[yy * 2], ymax = bv[yy * 2 + 1];
            const int32_t *k = &kv[(size_t)yy * ksv];
            for (int xx = 0; xx < iw; xx++) {
                int32_t s0 = 1 << (pv - 1), s1 = s0, s2 = s0;
                for (int y = 0; y < ymax; y++) {
                    const uint8_t *p = in + ((size_t)(y + ymin + y_off) * iw + xx) * 3;
                    s0 += p[0] * k[y];
                    s1 += p[1] * k[y];
                    s2 += p[2] * k[y];
                }
                uint8_t *o = dst + ((size_t)yy * iw + xx) * 3;
                o[0] = clip8(s0, pv);
                o[1] = clip8(s1, pv);
                o[2] = clip8(s2, pv);
            }
        }
    } else {
        memcpy(dst, in, (size_t)in_rows * (size_t)iw * 3);
    }
    (void)in_rows;
done:
    h3_free(bh);
    h3_free(bv);
    h3_free(kh);
    h3_free(kv);
    h3_free(tmp);
    return st;
}

h3_status h3_vis_resize_bicubic_tv(const uint8_t *src, int w, int h, uint8_t *dst, int ow, int oh) {
    return pil_resize(&k_bicubic, 1, src, w, h, dst, ow, oh);
}

h3_status h3_vis_resize_lanczos(const uint8_t *src, int w, int h, uint8_t *dst, int ow, int oh) {
    return pil_resize(&k_lanczos, 0, src, w, h, dst, ow, oh);
}

/* Patches of resized frames f0, f1 (the temporal pair; the same frame twice for an image) of ow x oh. */
static h3_status patchify(const h3_vis_config *c, const uint8_t *f0, const uint8_t *f1, int64_t ow, int64_t oh,
                          h3_tensor *pixels, int64_t grid[3]) {
    const int64_t p = c->patch, m = c->merge, tp = c->temporal_patch, gh = oh / p, gw = ow / p;
    const int64_t cols = 3 * tp * p * p;
    H3_TRY(h3_tensor_alloc2(pixels, H3_PLACE_HOST, H3_F32, gh * gw, cols, H3_MEM_IO));
    /* transformers: f32(v · (1/255) in double), then (x − mean) / std in f32 */
    float lut[3][256];
    for (int ch = 0; ch < 3; ch++)
        for (int v = 0; v < 256; v++) lut[ch][v] = ((float)((double)v * (1.0 / 255.0)) - c->mean[ch]) / c->std[ch];
    float *out = pixels->data;
    for (int64_t bh = 0; bh < gh / m; bh++)
        for (int64_t bw = 0; bw < gw / m; bw++)
            for (int64_t mh = 0; mh < m; mh++)
                for (int64_t mw = 0; mw < m; mw++) {
                    const int64_t row = ((bh * (gw / m) + bw) * m + mh) * m + mw;
                    const int64_t py = (bh * m + mh) * p, px = (bw * m + mw) * p;
                    float *o = out + row * cols;
                    for (int ch = 0; ch < 3; ch++)
                        for (int64_t t = 0; t < tp; t++) {
                            const uint8_t *rs = t == 0 ? f0 : f1;
                            for (int64_t y = 0; y < p; y++)
                                for (int64_t x = 0; x < p; x++) *o++ = lut[ch][rs[((py + y) * ow + px + x) * 3 + ch]];
                        }
                }
    grid[0] = 1;
    grid[1] = gh;
    grid[2] = gw;
    return H3_OK;
}

h3_status h3_vis_preprocess(const h3_vis_config *c, const uint8_t *rgb, int w, int h, h3_tensor *pixels,
                            int64_t grid[3]) {
    memset(pixels, 0, sizeof *pixels);
    int64_t oh, ow;
    H3_TRY(h3_vis_smart_resize(c, h, w, &oh, &ow));
    if (oh * ow > c->max_pixels && oh * ow > 64LL << 20)
        return H3_ERR(H3_ERR_INVALID, "the image resizes to %lldx%lld: too large", (long long)ow,
                      (long long)oh);
    if (c->in_channels != 3)
        return H3_ERR(H3_ERR_UNSUPPORTED, "the vision tower takes %lld channels; images have 3",
                      (long long)c->in_channels);
    uint8_t *rs = h3_malloc((size_t)oh * (size_t)ow * 3, H3_MEM_IO);
    if (!rs) return H3_ERR(H3_ERR_NOMEM, "out of memory for a %lldx%lld image", (long long)ow, (long long)oh);
    h3_status st = h3_vis_resize_bicubic_tv(rgb, w, h, rs, (int)ow, (int)oh);
    if (st == H3_OK) st = patchify(c, rs, rs, ow, oh, pixels, grid);
    h3_free(rs);
    if (st != H3_OK) h3_tensor_free(pixels);
    return st;
}

h3_status h3_vis_video_smart_resize(const h3_vis_config *c, int64_t t, int64_t h, int64_t w, int64_t *oh,
                                    int64_t *ow) {
    const int64_t f = c->patch * c->merge, tf = c->temporal_patch;
    if (t < tf) return H3_ERR(H3_ERR_INVALID, "a video of %lld sampled frames; the processor needs %lld", (long long)t, (long long)tf);
    if (h < f || w < f)
        return H3_ERR(H3_ERR_INVALID, "a %lldx%lld video is smaller than the processor's %lld pixels a side",
                      (long long)w, (long long)h, (long long)f);
    if ((double)(h > w ? h : w) / (double)(h > w ? w : h) > 200)
        return H3_ERR(H3_ERR_INVALID, "a %lldx%lld video's aspect ratio is above 200", (long long)w, (long long)h);
    int64_t hb = (int64_t)nearbyint((double)h / (double)f) * f, wb = (int64_t)nearbyint((double)w / (double)f) * f;
    const int64_t tb = (int64_t)nearbyint((double)t / (double)tf) * tf;
    if ((double)tb * (double)hb * (double)wb > (double)c->video_max_pixels) {
        const double beta = sqrt((double)t * (double)h * (double)w / (double)c->video_max_pixels);
        hb = (int64_t)floor((double)h / beta / (double)f) * f;
        wb = (int64_t)floor((double)w / beta / (double)f) * f;
        if (hb < f) hb = f;
        if (wb < f) wb = f;
    } else if ((double)tb * (double)hb * (double)wb < (double)c->video_min_pixels) {
        const double beta = sqrt((double)c->video_min_pixels / ((double)t * (double)h * (double)w));
        hb = (int64_t)ceil((double)h * beta / (double)f) * f;
        wb = (int64_t)ceil((double)w * beta / (double)f) * f;
    }
    *oh = hb;
    *ow = wb;
    return H3_OK;
}

h3_status h3_vis_preprocess_pair(const h3_vis_config *c, const uint8_t *f0, const uint8_t *f1, int w, int h,
                                 int64_t oh, int64_t ow, h3_tensor *pixels, int64_t grid[3]) {
    memset(pixels, 0, sizeof *pixels);
    if (c->in_channels != 3 || c->temporal_patch != 2)
        return H3_ERR(H3_ERR_UNSUPPORTED, "the vision tower takes %lld channels and %lld frames a patch; videos "
                      "need 3 and 2", (long long)c->in_channels, (long long)c->temporal_patch);
    if (oh < 1 || ow < 1 || oh * ow > (64LL << 20) || oh % (c->patch * c->merge) || ow % (c->patch * c->merge))
        return H3_ERR(H3_ERR_INVALID, "a video block of %lldx%lld pixels", (long long)ow, (long long)oh);
    const size_t fb = (size_t)oh * (size_t)ow * 3;
    uint8_t *rs = h3_malloc(2 * fb, H3_MEM_IO);
    if (!rs) return H3_ERR(H3_ERR_NOMEM, "out of memory for a %lldx%lld video block", (long long)ow, (long long)oh);
    h3_status st = h3_vis_resize_bicubic_tv(f0, w, h, rs, (int)ow, (int)oh);
    if (st == H3_OK) st = h3_vis_resize_bicubic_tv(f1, w, h, rs + fb, (int)ow, (int)oh);
    if (st == H3_OK) st = patchify(c, rs, rs + fb, ow, oh, pixels, grid);
    h3_free(rs);
    if (st != H3_OK) h3_tensor_free(pixels);
    return st;
}

/* ---- positions --------------------------------------------------------------------------------------------
 */

h3_status h3_vision_rope_index(const h3_vis_config *c, const int32_t *ids, int64_t n,
                               const int64_t (*grid)[3], int n_img, int64_t *pos, int64_t *n_vis) {
    int64_t *pt = pos, *ph = pos + n, *pw = pos + 2 * n;
    int64_t r = 0, next = 0, nv = 0;
    int img = 0;
    while (r < n) {
        if (ids[r] == c->image_token_id || ids[r] == c->video_token_id) {
            const int32_t pad = ids[r]; /* a video's blocks are images of one frame pair (Qwen3-VL's t = 1 split) */
            if (r == 0 || ids[r - 1] != c->vision_start_token_id)
                return H3_ERR(H3_ERR_INVALID,
                              "image token at row %lld does not follow a vision-start token (%lld)",
                              (long long)r, (long long)c->vision_start_token_id);
            if (img >= n_img)
                return H3_ERR(H3_ERR_INVALID,
                              "the prompt has more image blocks than the %d image grid%s given", n_img,
                              n_img == 1 ? "" : "s");
            const int64_t t = grid[img][0], gh = grid[img][1] / c->merge, gw = grid[img][2] / c->merge,
                          cnt = t * gh * gw;
            if (r + cnt > n)
                return H3_ERR(H3_ERR_INVALID,
                              "image %d needs %lld image tokens from row %lld; the prompt ends first", img,
                              (long long)cnt, (long long)r);
            for (int64_t k = 0; k < cnt; k++)
                if (ids[r + k] != pad)
                    return H3_ERR(H3_ERR_INVALID,
                                  "image %d (grid %lldx%lldx%lld) needs %lld image tokens from row %lld; "
                                  "row %lld is %d",
                                  img, (long long)grid[img][0], (long long)grid[img][1],
                                  (long long)grid[img][2], (long long)cnt, (long long)r, (long long)(r + k),
                                  ids[r + k]);
            int64_t mx = next - 1;
            for (int64_t k = 0; k < cnt; k++) {
                const int64_t ti = k / (gh * gw), hi = (k / gw) % gh, wi = k % gw;
                pt[r + k] = next + ti;
                ph[r + k] = next + hi;
                pw[r + k] = next + wi;
                if (pt[r + k] > mx) mx = pt[r + k];
                if (ph[r + k] > mx) mx = ph[r + k];
                if (pw[r + k] > mx) mx = pw[r + k];
            }
            next = mx + 1;
            r += cnt;
            nv += cnt;
            img++;
            if (r < n && ids[r] == pad)
                return H3_ERR(H3_ERR_INVALID,
                              "image %d's block at row %lld has more image tokens than its grid's %lld",
                              img - 1, (long long)r, (long long)cnt);
        } else {
            pt[r] = ph[r] = pw[r] = next++;
            r++;
        }
    }
    if (img != n_img)
        return H3_ERR(H3_ERR_INVALID, "the prompt has %d image block%s and %d image grid%s were given", img,
                      img == 1 ? "" : "s", n_img, n_img == 1 ? "" : "s");
    *n_vis = nv;
    return H3_OK;
}

void h3_vision_rope_tables(const h3_vis_config *c, const int64_t (*grid)[3], int n_img, float *cos_out,
                           float *sin_out) {
    const int64_t D = c->hidden / c->heads, dim = D / 2, nf = dim / 2, m = c->merge;
    float inv[512];
    for (int64_t j = 0; j < nf && j < 512; j++) inv[j] = 1.0f / powf(10000.0f, (float)(2 * j) / (float)dim);
    int64_t r = 0;
    for (int i = 0; i < n_img; i++) {
        const int64_t t = grid[i][0], gh = grid[i][1], gw = grid[i][2];
        for (int64_t f = 0; f < t; f++)
            for (int64_t bh = 0; bh < gh / m; bh++)
                for (int64_t bw = 0; bw < gw / m; bw++)
                    for (int64_t mh = 0; mh < m; mh++)
                        for (int64_t mw = 0; mw < m; mw++, r++) {
                            const int64_t py = bh * m + mh, px = bw * m + mw;
                            float *cs = cos_out + r * D, *sn = sin_out + r * D;
                            for (int64_t j = 0; j < nf; j++) {
                                const float a = (float)py * inv[j], b = (float)px * inv[j];
                                cs[j] = cs[j + dim] = cosf(a);
                                sn[j] = sn[j + dim] = sinf(a);
                                cs[nf + j] = cs[nf + j + dim] = cosf(b);
                                sn[nf + j] = sn[nf + j + dim] = sinf(b);
                            }
                        }
    }
}

/* torch.linspace(0, end, steps) in f32 (its scalar path: from the start below halfway, from the end above).
 */
static float linspace_at(float end, int64_t steps, int64_t i) {
    if (steps == 1) return 0.0f;
    const float step = end / (float)(steps - 1);
    return i < steps / 2 ? step * (float)i : end - step * (float)(steps - i - 1);
}

void h3_vision_pos_embed(const h3_vis_config *c, const float *table, const int64_t (*grid)[3], int n_img,
                         float *out) {
    const int64_t side = (int64_t)llround(sqrt((double)c->num_pos)), C = c->hidden, m = c->merge;
    int64_t r = 0;
    for (int i = 0; i < n_img; i++) {
        const int64_t t = grid[i][0], gh = grid[i][1], gw = grid[i][2];
        for (int64_t f = 0; f < t; f++)
            for (int64_t bh = 0; bh < gh / m; bh++)
                for (int64_t bw = 0; bw < gw / m; bw++)
                    for (int64_t mh = 0; mh < m; mh++)
                        for (int64_t mw = 0; mw < m; mw++, r++) {
                            const int64_t y = bh * m + mh, x = bw * m + mw;
                            const float hy = linspace_at((float)(side - 1), gh, y),
                                        wx = linspace_at((float)(side - 1), gw, x);
                            const int64_t y0 = (int64_t)hy, x0 = (int64_t)wx;
                            const int64_t y1 = y0 + 1 < side ? y0 + 1 : side - 1,
                                          x1 = x0 + 1 < side ? x0 + 1 : side - 1;
                            const float dh = hy - (float)y0, dw = wx - (float)x0;
                            const float w00 = (1 - dh) * (1 - dw), w01 = (1 - dh) * dw, w10 = dh * (1 - dw),
                                        w11 = dh * dw;
                            const float *e00 = table + (y0 * side + x0) * C,
                                        *e01 = table + (y0 * side + x1) * C,
                                        *e10 = table + (y1 * side + x0) * C,
                                        *e11 = table + (y1 * side + x1) * C;
                            float *o = out + r * C;
                            for (int64_t k = 0; k < C; k++)
                                o[k] = e00[k] * w00 + e01[k] * w01 + e10[k] * w10 + e11[k] * w11;
                        }
    }
}

/* ---- weights ----------------------------------------------------------------------------------------------
 */

typedef struct vis_block {
    h3_tensor n1w, n1b, n2w, n2b, qkv_w, qkv_b, proj_w, proj_b, fc1_w, fc1_b, fc2_w, fc2_b;
} vis_block;
#define VB_N 12

typedef struct vis_merger {
    h3_tensor nw, nb, fc1_w, fc1_b, fc2_w, fc2_b;
} vis_merger;
#define VM_N 6

typedef struct vis_stem {
    h3_tensor patch_w, patch_b, pos; /* patch_w viewed as [hidden, C·tp·p·p] */
} vis_stem;

struct h3_vision {
    h3_vis_config cfg;
    h3_st_set *set;
    h3_wbind wb;
    char prefix[32];
    char describe[300];
    vis_stem stem;
    vis_block *blocks; /* [depth] */
    vis_merger merger;
    vis_merger *deep; /* [n_deep] */
};

const h3_vis_config *h3_vision_config(const h3_vision *v) {
    return &v->cfg;
}

const char *h3_vision_describe(const h3_vision *v) {
    return v->describe;
}

static h3_tensor *block_field(vis_block *b, int i) {
    return &((h3_tensor *)b)[i];
}

static h3_tensor *merger_field(vis_merger *m, int i) {
    return &((h3_tensor *)m)[i];
}

static h3_status bind_block(h3_vision *v, int l, vis_block *b) {
    const h3_vis_config *c = &v->cfg;
    const int64_t H = c->hidden, F = c->intermediate;
    static const char *const names[VB_N] = {
        "norm1.weight",          "norm1.bias",          "norm2.weight",          "norm2.bias",
        "attn.qkv.weight",       "attn.qkv.bias",       "attn.proj.weight",      "attn.proj.bias",
        "mlp.linear_fc1.weight", "mlp.linear_fc1.bias", "mlp.linear_fc2.weight", "mlp.linear_fc2.bias"};
    const int64_t d0[VB_N] = {H, H, H, H, 3 * H, 3 * H, H, H, F, F, H, H};
    const int64_t d1[VB_N] = {0, 0, 0, 0, H, 0, H, 0, H, 0, F, 0};
    static const char *const words[VB_N] = {"[hidden]",
                                            "[hidden]",
                                            "[hidden]",
                                            "[hidden]",
                                            "[3·hidden, hidden]",
                                            "[3·hidden]",
                                            "[hidden, hidden]",
                                            "[hidden]",
                                            "[intermediate, hidden]",
                                            "[intermediate]",
                                            "[hidden, intermediate]",
                                            "[hidden]"};
    char nm[VB_N][96];
    h3_wb_row rows[VB_N];
    for (int i = 0; i < VB_N; i++) {
        snprintf(nm[i], sizeof nm[i], "blocks.%d.%s", l, names[i]);
        rows[i] = h3_wb_row_make(nm[i], block_field(b, i), d1[i] ? 2 : 1, d0[i], d1[i], 0, 0, H3_WB_FLOATS, 0,
                                 words[i], (h3_wb_unit){"ViT block", l, 1 + l});
    }
    return h3_wb_bind_rows(&v->wb, rows, VB_N);
}

static h3_status bind_merger(h3_vision *v, int k, vis_merger *m) {
    const h3_vis_config *c = &v->cfg;
    const int64_t H = c->hidden, M = H * c->merge * c->merge, O = c->out_hidden, nw = k < 0 ? H : M;
    static const char *const names[VM_N] = {"norm.weight",     "norm.bias",         "linear_fc1.weight",
                                            "linear_fc1.bias", "linear_fc2.weight", "linear_fc2.bias"};
    const int64_t d0[VM_N] = {nw, nw, M, M, O, O}, d1[VM_N] = {0, 0, M, 0, M, 0};
    static const char *const words[VM_N] = {"[norm width]", "[norm width]",           "[4·hidden, 4·hidden]",
                                            "[4·hidden]",   "[out_hidden, 4·hidden]", "[out_hidden]"};
    char nm[VM_N][96];
    h3_wb_row rows[VM_N];
    for (int i = 0; i < VM_N; i++) {
        if (k < 0)
            snprintf(nm[i], sizeof nm[i], "merger.%s", names[i]);
        else
            snprintf(nm[i], sizeof nm[i], "deepstack_merger_list.%d.%s", k, names[i]);
        rows[i] = h3_wb_row_make(nm[i], merger_field(m, i), d1[i] ? 2 : 1, d0[i], d1[i], 0, 0, H3_WB_FLOATS,
                                 0, words[i],
                                 (h3_wb_unit){k < 0 ? "ViT merger" : "ViT deepstack merger", k < 0 ? 0 : k,
                                              (int)c->depth + 1 + (k < 0 ? 0 : 1 + k)});
    }
    return h3_wb_bind_rows(&v->wb, rows, VM_N);
}

static h3_status bind_stem(h3_vision *v) {
    const h3_vis_config *c = &v->cfg;
    const h3_wb_unit u = {"ViT stem", 0, 0};
    h3_wb_row rows[3];
    rows[0] = h3_wb_row_make("patch_embed.proj.weight", &v->stem.patch_w, 5, c->hidden, c->in_channels,
                             c->temporal_patch, c->patch, H3_WB_FLOATS, 0,
                             "[hidden, channels, temporal_patch, patch, patch]", u);
    rows[0].shape[4] = c->patch;
    rows[1] = h3_wb_row_make("patch_embed.proj.bias", &v->stem.patch_b, 1, c->hidden, 0, 0, 0, H3_WB_FLOATS,
                             0, "[hidden]", u);
    rows[2] = h3_wb_row_make("pos_embed.weight", &v->stem.pos, 2, c->num_pos, c->hidden, 0, 0, H3_WB_FLOATS,
                             0, "[num_position_embeddings, hidden]", u);
    H3_TRY(h3_wb_bind_rows(&v->wb, rows, 3));
    if (!h3_tensor_is_contiguous(&v->stem.patch_w))
        return H3_ERR(H3_ERR_FORMAT, "the patch embedding is not contiguous");
    const int64_t s[2] = {c->hidden, c->in_channels * c->temporal_patch * c->patch * c->patch};
    h3_tensor w2;
    H3_TRY(h3_tensor_reshape(&v->stem.patch_w, 2, s, &w2));
    w2.owner = v->stem.patch_w.owner; /* keep whatever the binder owned */
    w2.owned_bytes = v->stem.patch_w.owned_bytes;
    w2.cat = v->stem.patch_w.cat;
    v->stem.patch_w = w2;
    return H3_OK;
}

static void free_merger(vis_merger *m) {
    for (int i = 0; i < VM_N; i++) h3_tensor_free(merger_field(m, i));
}

void h3_vision_close(h3_vision *v) {
    if (!v) return;
    h3_tensor_free(&v->stem.patch_w);
    h3_tensor_free(&v->stem.patch_b);
    h3_tensor_free(&v->stem.pos);
    if (v->blocks)
        for (int64_t l = 0; l < v->cfg.depth; l++)
            for (int i = 0; i < VB_N; i++) h3_tensor_free(block_field(&v->blocks[l], i));
    h3_free(v->blocks);
    free_merger(&v->merger);
    if (v->deep)
        for (int k = 0; k < v->cfg.n_deep; k++) free_merger(&v->deep[k]);
    h3_free(v->deep);
    h3_free(v);
}

h3_status h3_vision_open(h3_text_encoder *te, const char *config_path, h3_vision **out) {
    *out = NULL;
    h3_status st = H3_OK;
    json_t *j = NULL;
    char *pp = NULL;
    h3_vision *v = h3_calloc(1, sizeof *v, H3_MEM_OTHER);
    if (!v) return H3_ERR_NOMEM;
    h3_vis_config_default(&v->cfg);
    const char *source = h3_text_encoder_describe(te);
    v->set = (h3_st_set *)h3_text_encoder_files(te);
    if (!v->set) H3_FAIL(H3_ERR_INVALID, "the text encoder has no files to read a vision tower from");
    if (h3_st_find(v->set, "model.visual.patch_embed.proj.weight"))
        snprintf(v->prefix, sizeof v->prefix, "model.visual.");
    else if (h3_st_find(v->set, "visual.patch_embed.proj.weight"))
        snprintf(v->prefix, sizeof v->prefix, "visual.");
    else
        H3_FAIL(
            H3_ERR_FORMAT,
            "%s holds no vision tower (no model.visual.* or visual.* tensors); images need Qwen3-VL's vision "
            "tower: use the release's text_encoder/ or a repack that keeps it",
            v->set->source);
    v->wb = (h3_wbind){v->set, v->prefix, NULL, "vision tower", NULL, NULL};
    const char *cfgp = config_path ? config_path : h3_text_encoder_config_file(te);
    if (cfgp) {
        H3_CHECK_CTX(h3_json_load_file(cfgp, 4u << 20, &j), "reading the vision config");
        H3_CHECK(config_from_json(j, cfgp, &v->cfg));
        json_decref(j);
        j = NULL;
        char *dir = h3_path_dir(cfgp);
        pp = dir ? h3_path_join(dir, "preprocessor_config.json") : NULL;
        h3_free(dir);
        if (pp && h3_path_is_file(pp)) {
            H3_CHECK_CTX(h3_json_load_file(pp, 1u << 20, &j), "reading the image processor's config");
            H3_CHECK(proc_from_json(j, pp, &v->cfg));
        }
    }
    const h3_vis_config *c = &v->cfg;
    H3_CHECK(bind_stem(v));
    v->blocks = h3_calloc((size_t)c->depth, sizeof *v->blocks, H3_MEM_OTHER);
    v->deep = h3_calloc((size_t)(c->n_deep ? c->n_deep : 1), sizeof *v->deep, H3_MEM_OTHER);
    if (!v->blocks || !v->deep) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    for (int l = 0; l < c->depth; l++) H3_CHECK(bind_block(v, l, &v->blocks[l]));
    H3_CHECK(bind_merger(v, -1, &v->merger));
    for (int k = 0; k < c->n_deep; k++) H3_CHECK(bind_merger(v, k, &v->deep[k]));
    {
        char b[96];
        snprintf(b, sizeof b, "%sblocks.%lld.norm1.weight", v->prefix, (long long)c->depth);
        if (h3_st_find(v->set, b))
            H3_FAIL(H3_ERR_FORMAT, "%s: '%s' exists but the config has %lld vision blocks", v->set->source, b,
                    (long long)c->depth);
    }
    snprintf(v->describe, sizeof v->describe,
             "Qwen3-VL vision tower (%s*), %lld blocks, hidden %lld, %lld heads, FFN %lld, out %lld, "
             "deepstack %d, "
             "%s weights (%s)",
             v->prefix, (long long)c->depth, (long long)c->hidden, (long long)c->heads,
             (long long)c->intermediate, (long long)c->out_hidden, c->n_deep,
             h3_dtype_name(v->blocks[0].qkv_w.dtype), source);
done:
    json_decref(j);
    h3_free(pp);
    if (st != H3_OK) {
        h3_vision_close(v);
        v = NULL;
    }
    *out = v;
    return st;
}

/* ---- forward ----------------------------------------------------------------------------------------------
 */

/* Every unit's tensors, in one list per unit (the stem, blocks, merger, deepstack mergers). */
static int n_units(const h3_vis_config *c) {
    return (int)c->depth + 2 + c->n_deep;
}

static void unit_tensors(h3_vision *v, int u, h3_tensor **t, int *n) {
    const h3_vis_config *c = &v->cfg;
    if (u == 0) {
        t[0] = &v->stem.patch_w;
        t[1] = &v->stem.patch_b;
        *n = 2;
    } else if (u <= c->depth) {
        for (int i = 0; i < VB_N; i++) t[i] = block_field(&v->blocks[u - 1], i);
        *n = VB_N;
    } else {
        vis_merger *m = u == c->depth + 1 ? &v->merger : &v->deep[u - c->depth - 2];
        for (int i = 0; i < VM_N; i++) t[i] = merger_field(m, i);
        *n = VM_N;
    }
}

typedef struct vis_ws {
    h3_tensor x, h, q, k, v, o, f, cos, sin, mh, mf; /* mh [N/4, 4H], mf [N/4, 4H] */
} vis_ws;

static void ws_free(vis_ws *w) {
    h3_tensor *all[] = {&w->x, &w->h, &w->q, &w->k, &w->v, &w->o, &w->f, &w->cos, &w->sin, &w->mh, &w->mf};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) h3_tensor_free(all[i]);
}

static int64_t grid_rows(const int64_t (*grid)[3], int n_img) {
    int64_t N = 0;
    for (int i = 0; i < n_img; i++) N += grid[i][0] * grid[i][1] * grid[i][2];
    return N;
}

/* Activation bytes of the forward for N patches in dtype size es, as ws_alloc allocates (each allocation
 * rounded to the device's granule when device). */
static int64_t ws_bytes(const h3_vis_config *c, int64_t N, int64_t es, int device) {
    const int64_t H = c->hidden, D = H / c->heads, M = H * c->merge * c->merge,
                  ch = N < VIS_CHUNK ? N : VIS_CHUNK, g = c->merge * c->merge;
    const int64_t sz[] = {N * H * es,
                          N * H * es,
                          N * H * es,
                          N * H * es,
                          N * H * es,
                          N * H * es,
                          ch * c->intermediate * es,
                          N * D * 4,
                          N * D * 4,
                          N / g * M * es,
                          N / g * M * es};
    int64_t b = 0;
    for (size_t i = 0; i < sizeof sz / sizeof sz[0]; i++) b += device ? h3_cuda_granule(sz[i]) : sz[i];
    return b;
}

static h3_status ws_alloc(const h3_vis_config *c, int64_t N, h3_place pl, h3_dtype dt, vis_ws *w) {
    const int64_t H = c->hidden, D = H / c->heads, M = H * c->merge * c->merge,
                  ch = N < VIS_CHUNK ? N : VIS_CHUNK;
    memset(w, 0, sizeof *w);
    h3_tensor *hs[] = {&w->x, &w->h, &w->q, &w->k, &w->v, &w->o};
    for (int i = 0; i < 6; i++) H3_TRY(h3_tensor_alloc2(hs[i], pl, dt, N, H, H3_MEM_ACTIVATIONS));
    H3_TRY(h3_tensor_alloc2(&w->f, pl, dt, ch, c->intermediate, H3_MEM_ACTIVATIONS));
    H3_TRY(h3_tensor_alloc2(&w->cos, pl, H3_F32, N, D, H3_MEM_ACTIVATIONS));
    H3_TRY(h3_tensor_alloc2(&w->sin, pl, H3_F32, N, D, H3_MEM_ACTIVATIONS));
    H3_TRY(h3_tensor_alloc2(&w->mh, pl, dt, N / (c->merge * c->merge), M, H3_MEM_ACTIVATIONS));
    H3_TRY(h3_tensor_alloc2(&w->mf, pl, dt, N / (c->merge * c->merge), M, H3_MEM_ACTIVATIONS));
    return H3_OK;
}

static h3_status heads3(const h3_tensor *t, int64_t H, h3_tensor *out) {
    const int64_t s[3] = {t->shape[0], H, t->shape[1] / H};
    return h3_tensor_reshape(t, 3, s, out);
}

static h3_status run_block(const h3_vis_config *c, h3_exec *ex, const h3_tensor *w, vis_ws *s,
                           const int64_t (*grid)[3], int n_img) {
    const int64_t H = c->hidden, N = s->x.shape[0], D = H / c->heads, F = c->intermediate;
    const vis_block *b = (const vis_block *)w;
    h3_tensor wq, wk, wv, bq, bk, bv, q3, k3, v3, o3;
    H3_TRY(h3_op_layer_norm(ex, &s->h, &s->x, &b->n1w, &b->n1b, 1e-6f));
    H3_TRY(h3_tensor_narrow(&b->qkv_w, 0, 0, H, &wq));
    H3_TRY(h3_tensor_narrow(&b->qkv_w, 0, H, H, &wk));
    H3_TRY(h3_tensor_narrow(&b->qkv_w, 0, 2 * H, H, &wv));
    H3_TRY(h3_tensor_narrow(&b->qkv_b, 0, 0, H, &bq));
    H3_TRY(h3_tensor_narrow(&b->qkv_b, 0, H, H, &bk));
    H3_TRY(h3_tensor_narrow(&b->qkv_b, 0, 2 * H, H, &bv));
    H3_TRY(h3_op_gemm(ex, &s->q, &s->h, &wq, &bq, 0));
    H3_TRY(h3_op_gemm(ex, &s->k, &s->h, &wk, &bk, 0));
    H3_TRY(h3_op_gemm(ex, &s->v, &s->h, &wv, &bv, 0));
    H3_TRY(heads3(&s->q, c->heads, &q3));
    H3_TRY(heads3(&s->k, c->heads, &k3));
    H3_TRY(heads3(&s->v, c->heads, &v3));
    H3_TRY(heads3(&s->o, c->heads, &o3));
    H3_TRY(h3_op_rope(ex, &q3, &q3, &s->cos, &s->sin));
    H3_TRY(h3_op_rope(ex, &k3, &k3, &s->cos, &s->sin));
    /* attention within each image (each frame of t > 1 is its own sequence: cu_seqlens) */
    int64_t r0 = 0;
    for (int i = 0; i < n_img; i++)
        for (int64_t f = 0; f < grid[i][0]; f++) {
            const int64_t len = grid[i][1] * grid[i][2];
            h3_tensor qs, ks, vs, os;
            H3_TRY(h3_tensor_narrow(&q3, 0, r0, len, &qs));
            H3_TRY(h3_tensor_narrow(&k3, 0, r0, len, &ks));
            H3_TRY(h3_tensor_narrow(&v3, 0, r0, len, &vs));
            H3_TRY(h3_tensor_narrow(&o3, 0, r0, len, &os));
            H3_TRY(h3_op_attention(ex, &os, &qs, &ks, &vs, (float)(1.0 / sqrt((double)D)), 0));
            r0 += len;
        }
    H3_TRY(h3_op_gemm(ex, &s->x, &s->o, &b->proj_w, &b->proj_b, H3_GEMM_ACCUMULATE));
    H3_TRY(h3_op_layer_norm(ex, &s->h, &s->x, &b->n2w, &b->n2b, 1e-6f));
    for (int64_t a = 0; a < N; a += s->f.shape[0]) {
        const int64_t rows = N - a < s->f.shape[0] ? N - a : s->f.shape[0];
        h3_tensor hr, xr, fr;
        H3_TRY(h3_tensor_narrow(&s->h, 0, a, rows, &hr));
        H3_TRY(h3_tensor_narrow(&s->x, 0, a, rows, &xr));
        H3_TRY(h3_tensor_narrow(&s->f, 0, 0, rows, &fr));
        H3_TRY(h3_op_gemm(ex, &fr, &hr, &b->fc1_w, &b->fc1_b, 0));
        H3_TRY(h3_op_unary(ex, &fr, &fr, c->act_tanh ? H3_UNARY_GELU_TANH : H3_UNARY_GELU));
        H3_TRY(h3_op_gemm(ex, &xr, &fr, &b->fc2_w, &b->fc2_b, H3_GEMM_ACCUMULATE));
    }
    (void)F;
    return H3_OK;
}

/* A merger of x into dst [N/4, out] (at the place; f32 host out copied by the caller). post: the norm after
 * the 2×2 shuffle (the deepstack mergers). */
static h3_status run_merger(const h3_vis_config *c, h3_exec *ex, const h3_tensor *w, vis_ws *s, int post,
                            h3_tensor *dst) {
    const vis_merger *m = (const vis_merger *)w;
    const int64_t N = s->x.shape[0], H = c->hidden, g = c->merge * c->merge;
    const int64_t sm[2] = {N / g, H * g};
    h3_tensor hv;
    if (post) {
        h3_tensor xv;
        H3_TRY(h3_tensor_reshape(&s->x, 2, sm, &xv));
        H3_TRY(h3_op_layer_norm(ex, &s->mh, &xv, &m->nw, &m->nb, 1e-6f));
    } else {
        H3_TRY(h3_op_layer_norm(ex, &s->h, &s->x, &m->nw, &m->nb, 1e-6f));
        H3_TRY(h3_tensor_reshape(&s->h, 2, sm, &hv));
        H3_TRY(h3_op_convert(ex, &s->mh, &hv));
    }
    H3_TRY(h3_op_gemm(ex, &s->mf, &s->mh, &m->fc1_w, &m->fc1_b, 0));
    H3_TRY(h3_op_unary(ex, &s->mf, &s->mf, H3_UNARY_GELU));
    return h3_op_gemm(ex, dst, &s->mf, &m->fc2_w, &m->fc2_b, 0);
}

static h3_status check_grids(const h3_vis_config *c, const h3_tensor *pixels, const int64_t (*grid)[3],
                             int n_img) {
    const int64_t cols = c->in_channels * c->temporal_patch * c->patch * c->patch;
    if (n_img < 1) return H3_ERR(H3_ERR_INVALID, "vision tower: no images");
    int64_t N = 0;
    for (int i = 0; i < n_img; i++) {
        if (grid[i][0] < 1 || grid[i][1] < 1 || grid[i][2] < 1 || grid[i][1] % c->merge ||
            grid[i][2] % c->merge || grid[i][1] > (1 << 16) || grid[i][2] > (1 << 16) ||
            grid[i][0] > (1 << 12))
            return H3_ERR(H3_ERR_INVALID,
                          "image_grid_thw[%d] = [%lld, %lld, %lld]: t, h, w must be at least 1 with h "
                          "and w multiples of %lld",
                          i, (long long)grid[i][0], (long long)grid[i][1], (long long)grid[i][2],
                          (long long)c->merge);
        N += grid[i][0] * grid[i][1] * grid[i][2];
    }
    if (!pixels || pixels->dtype != H3_F32 || pixels->ndim != 2 || pixels->shape[0] != N ||
        pixels->shape[1] != cols || !h3_tensor_is_contiguous(pixels) || pixels->place == H3_PLACE_DEVICE)
        return H3_ERR(H3_ERR_INVALID,
                      "pixel_values must be f32 [%lld, %lld] on the host for these grids (Σ t·h·w "
                      "patches of %lld values)",
                      (long long)N, (long long)cols, (long long)cols);
    return H3_OK;
}

int64_t h3_vision_device_bytes(const h3_vision *v, const int64_t (*grid)[3], int n_img) {
    const h3_vis_config *c = &v->cfg;
    h3_vision *vv = (h3_vision *)v;
    int64_t w = 0;
    for (int u = 0; u < n_units(c); u++) {
        h3_tensor *t[VB_N];
        int n;
        unit_tensors(vv, u, t, &n);
        h3_pack p;
        memset(&p, 0, sizeof p);
        for (int i = 0; i < n; i++) h3_pack_add(&p, t[i], 0);
        w += h3_cuda_granule(p.bytes);
    }
    const int64_t N = grid_rows(grid, n_img), es = (int64_t)h3_dtype_size(v->blocks[0].qkv_w.dtype),
                  cols = c->in_channels * c->temporal_patch * c->patch * c->patch,
                  M = N / (c->merge * c->merge);
    /* the patch embedding: the f32 pixels, their copy in the weights' dtype and the f32 position rows; the
     * mergers: an output in the weights' dtype and its f32 copy */
    const int64_t embed =
        h3_cuda_granule(N * cols * 4) + h3_cuda_granule(N * cols * es) + h3_cuda_granule(N * c->hidden * 4);
    /* during the blocks the mergers' output is held beside the workspace, with a merger's f32 copy or, inside
     * attention, the padded rows a head size the flash kernel lacks (72) takes in arena scratch (the largest
     * image's: attention runs within each image) */
    int64_t smax = 0;
    for (int i = 0; i < n_img; i++)
        if (grid[i][0] * grid[i][1] * grid[i][2] > smax) smax = grid[i][0] * grid[i][1] * grid[i][2];
    const int64_t attn = h3_cuda_granule(h3_cuda_attention_scratch_bytes(v->blocks[0].qkv_w.dtype, smax, smax,
                                                                         c->heads, c->heads, c->hidden / c->heads));
    const int64_t mf = h3_cuda_granule(M * c->out_hidden * 4);
    const int64_t merge = h3_cuda_granule(M * c->out_hidden * es) + (mf > attn ? mf : attn);
    const int64_t io = embed > merge ? embed : merge;
    return H3_CUDA_BACKEND_BYTES + w + ws_bytes(c, N, es, 1) + io;
}

h3_status h3_vision_forward(h3_vision *v, h3_exec *ex, h3_place place, const h3_tensor *pixels,
                            const int64_t (*grid)[3], int n_img, h3_tensor *embeds, h3_tensor *deep) {
    const h3_vis_config *c = &v->cfg;
    H3_TRY(check_grids(c, pixels, grid, n_img));
    const int64_t N = grid_rows(grid, n_img), H = c->hidden, D = H / c->heads, g = c->merge * c->merge;
    const h3_tensor *outs[1 + H3_VIS_MAX_DEEP];
    outs[0] = embeds;
    for (int k = 0; k < c->n_deep; k++) outs[1 + k] = &deep[k];
    for (int k = 0; k <= c->n_deep; k++)
        if (!outs[k] || outs[k]->dtype != H3_F32 || outs[k]->ndim != 2 || outs[k]->shape[0] != N / g ||
            outs[k]->shape[1] != c->out_hidden || !outs[k]->data || outs[k]->place == H3_PLACE_DEVICE)
            return H3_ERR(H3_ERR_INVALID, "vision tower: the outputs must be f32 host tensors [%lld, %lld]",
                          (long long)(N / g), (long long)c->out_hidden);
    const int dev = place == H3_PLACE_DEVICE;
    const h3_dtype dt = dev ? v->blocks[0].qkv_w.dtype : H3_F32;
    const h3_place pl = dev ? H3_PLACE_DEVICE : H3_PLACE_HOST;
    h3_status st = H3_OK;
    vis_ws s;
    memset(&s, 0, sizeof s);
    h3_tensor hp = {0}, hc = {0}, hs = {0}, px = {0}, pos = {0}, tab = {0}, mo = {0};
    h3_units *units = NULL;
    h3_pack *packs = NULL;
    const int nu = n_units(c);
    h3_tensor *tl[VB_N];
    int tn;
    /* host tables: the interpolated position embedding, the rotary cos/sin */
    H3_CHECK(h3_tensor_alloc2(&tab, H3_PLACE_HOST, H3_F32, c->num_pos, H, H3_MEM_WORKSPACE));
    H3_CHECK(h3_tensor_rows_to_f32(&v->stem.pos, 0, c->num_pos, tab.data));
    H3_CHECK(h3_tensor_alloc2(&hp, H3_PLACE_HOST, H3_F32, N, H, H3_MEM_ACTIVATIONS));
    h3_vision_pos_embed(c, tab.data, grid, n_img, hp.data);
    h3_tensor_free(&tab);
    H3_CHECK(h3_tensor_alloc2(&hc, H3_PLACE_HOST, H3_F32, N, D, H3_MEM_ACTIVATIONS));
    H3_CHECK(h3_tensor_alloc2(&hs, H3_PLACE_HOST, H3_F32, N, D, H3_MEM_ACTIVATIONS));
    h3_vision_rope_tables(c, grid, n_img, hc.data, hs.data);
    /* the weights: as bound (host views), or resident on the device */
    packs = h3_calloc((size_t)nu, sizeof *packs, H3_MEM_OTHER);
    if (!packs) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    for (int u = 0; u < nu; u++) {
        unit_tensors(v, u, tl, &tn);
        for (int i = 0; i < tn; i++) h3_pack_add(&packs[u], tl[i], 0);
    }
    {
        const h3_units_config uc = {pl, NULL, 0, 0, v->set, 0, 0, NULL, NULL, "the vision tower's weights",
                                    0, NULL};
        H3_CHECK(h3_units_open(ex, &uc, packs, nu, &units));
    }
    H3_CHECK(ws_alloc(c, N, pl, dt, &s));
    H3_CHECK(h3_copy(ex, &s.cos, &hc));
    H3_CHECK(h3_copy(ex, &s.sin, &hs));
    /* x = patches · Wᵀ + b + pos (in f32, then the activations' dtype, as transformers adds before the cast)
     */
    {
        const h3_tensor *t;
        H3_CHECK(h3_tensor_alloc(&px, pl, H3_F32, 2, pixels->shape, H3_MEM_ACTIVATIONS));
        H3_CHECK(h3_copy(ex, &px, pixels));
        H3_CHECK(h3_tensor_alloc2(&pos, pl, H3_F32, N, H, H3_MEM_ACTIVATIONS));
        H3_CHECK(h3_copy(ex, &pos, &hp));
        H3_CHECK(h3_units_acquire(units, 0, &t));
        if (dev) {
            /* the GEMM takes activations of the weights' dtype; the position rows are added in it too */
            h3_tensor pxd = {0};
            st = h3_tensor_alloc(&pxd, pl, dt, 2, pixels->shape, H3_MEM_ACTIVATIONS);
            if (st == H3_OK) st = h3_op_convert(ex, &pxd, &px);
            if (st == H3_OK) st = h3_op_gemm(ex, &s.x, &pxd, &t[0], &t[1], 0);
            if (st == H3_OK) st = h3_op_convert(ex, &s.h, &pos);
            if (st == H3_OK) st = h3_op_binary(ex, &s.x, &s.x, &s.h, H3_BINARY_ADD);
            if (st == H3_OK) st = h3_exec_sync(ex);
            h3_tensor_free(&pxd);
        } else {
            st = h3_op_gemm(ex, &s.x, &px, &t[0], &t[1], 0);
            if (st == H3_OK) st = h3_op_binary(ex, &s.x, &s.x, &pos, H3_BINARY_ADD);
        }
        h3_units_release(units, 0);
        if (st != H3_OK) goto done;
    }
    h3_tensor_free(&px);
    h3_tensor_free(&pos);
    H3_CHECK(h3_tensor_alloc2(&mo, pl, dev ? dt : H3_F32, N / g, c->out_hidden, H3_MEM_ACTIVATIONS));
    for (int l = 0; l < c->depth; l++) {
        const h3_tensor *t;
        H3_CHECK(h3_units_acquire(units, 1 + l, &t));
        st = run_block(c, ex, t, &s, grid, n_img);
        h3_units_release(units, 1 + l);
        if (st != H3_OK) {
            st = h3_error_wrap(st, "ViT block %d", l);
            goto done;
        }
        for (int k = 0; k < c->n_deep; k++) {
            if (c->deep_idx[k] != l) continue;
            const int u = (int)c->depth + 2 + k;
            H3_CHECK(h3_units_acquire(units, u, &t));
            st = run_merger(c, ex, t, &s, 1, dev ? &mo : &deep[k]);
            h3_units_release(units, u);
            if (st == H3_OK && dev) {
                h3_tensor f = {0};
                st = h3_tensor_alloc2(&f, pl, H3_F32, N / g, c->out_hidden, H3_MEM_ACTIVATIONS);
                if (st == H3_OK) st = h3_op_convert(ex, &f, &mo);
                if (st == H3_OK) st = h3_copy(ex, &deep[k], &f);
                if (st == H3_OK) st = h3_exec_sync(ex);
                h3_tensor_free(&f);
            }
            if (st != H3_OK) goto done;
        }
    }
    {
        const h3_tensor *t;
        const int u = (int)c->depth + 1;
        H3_CHECK(h3_units_acquire(units, u, &t));
        st = run_merger(c, ex, t, &s, 0, dev ? &mo : embeds);
        h3_units_release(units, u);
        if (st != H3_OK) goto done;
        if (dev) {
            h3_tensor f = {0};
            st = h3_tensor_alloc2(&f, pl, H3_F32, N / g, c->out_hidden, H3_MEM_ACTIVATIONS);
            if (st == H3_OK) st = h3_op_convert(ex, &f, &mo);
            if (st == H3_OK) st = h3_copy(ex, embeds, &f);
            h3_tensor_free(&f);
        }
    }
    H3_CHECK(h3_exec_sync(ex));
done:
    if (st != H3_OK && dev) h3_exec_sync(ex);
    ws_free(&s);
    h3_tensor *ts[] = {&hp, &hc, &hs, &px, &pos, &tab, &mo};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) h3_tensor_free(ts[i]);
    h3_units_close(units);
    h3_free(packs);
    return st;
}

/* ---- into the text encoder --------------------------------------------------------------------------------
 */

h3_status h3_vision_encode_prompt(h3_vision *v, h3_text_encoder *te, h3_exec *ex, h3_place vis_place,
                                  const int32_t *ids, int64_t n, const h3_tensor *pixels,
                                  const int64_t (*grid)[3], int n_img, int layer, h3_tensor *out) {
    const h3_vis_config *c = &v->cfg;
    const h3_te_config *tc = h3_text_encoder_config(te);
    if (c->out_hidden != tc->hidden)
        return H3_ERR(H3_ERR_FORMAT,
                      "the vision tower gives %lld-wide rows; the text encoder's hidden size is %lld",
                      (long long)c->out_hidden, (long long)tc->hidden);
    if (c->n_deep > H3_TE_MAX_DEEP)
        return H3_ERR(H3_ERR_UNSUPPORTED, "%d deepstack features (at most %d)", c->n_deep, H3_TE_MAX_DEEP);
    if (n <= 0 || !ids) return H3_ERR(H3_ERR_INVALID, "the prompt has no tokens");
    H3_TRY(check_grids(c, pixels, grid, n_img));
    h3_status st = H3_OK;
    int64_t *pos = h3_malloc((size_t)n * 3 * sizeof *pos, H3_MEM_IO), *rows = NULL, nv = 0;
    h3_tensor emb = {0}, deep[H3_VIS_MAX_DEEP];
    memset(deep, 0, sizeof deep);
    if (!pos) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    H3_CHECK(h3_vision_rope_index(c, ids, n, grid, n_img, pos, &nv));
    const int64_t g = c->merge * c->merge, N = grid_rows(grid, n_img);
    if (nv != N / g)
        H3_FAIL(H3_ERR_INVALID, "the prompt has %lld image tokens; the grids give %lld", (long long)nv,
                (long long)(N / g));
    rows = h3_malloc((size_t)(nv ? nv : 1) * sizeof *rows, H3_MEM_IO);
    if (!rows) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    for (int64_t i = 0, k = 0; i < n; i++)
        if (ids[i] == c->image_token_id || ids[i] == c->video_token_id) rows[k++] = i;
    H3_CHECK(h3_tensor_alloc2(&emb, H3_PLACE_HOST, H3_F32, nv, c->out_hidden, H3_MEM_ACTIVATIONS));
    for (int k = 0; k < c->n_deep; k++)
        H3_CHECK(h3_tensor_alloc2(&deep[k], H3_PLACE_HOST, H3_F32, nv, c->out_hidden, H3_MEM_ACTIVATIONS));
    H3_CHECK_CTX(h3_vision_forward(v, ex, vis_place, pixels, grid, n_img, &emb, deep), "the vision tower");
    {
        const h3_te_mm mm = {pos, rows, nv, &emb, deep, c->n_deep};
        H3_CHECK(h3_text_encoder_encode_mm(te, ex, ids, n, layer, &mm, out));
    }
done:
    h3_free(pos);
    h3_free(rows);
    h3_tensor_free(&emb);
    for (int k = 0; k < H3_VIS_MAX_DEEP; k++) h3_tensor_free(&deep[k]);
    return st;
}
