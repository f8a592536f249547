#include "pipeline/keyframe.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "pipeline/media.h"
#include "pipeline/stages.h"
#include "sample/rng.h"

h3_status h3_canvas_from_aspect(double aw, double ah, int64_t *width, int64_t *height) {
    return h3_canvas_from_aspect_at(aw, ah, H3_CANVAS_SHORT, (double)H3_CANVAS_MAX_AREA, width, height);
}

h3_status h3_canvas_from_aspect_at(double aw, double ah, int short_edge, double max_area, int64_t *width,
                                   int64_t *height) {
    if (!(aw > 0) || !(ah > 0))
        return H3_ERR(H3_ERR_INVALID, "an aspect ratio must be positive; got %g:%g", aw, ah);
    const double ratio = aw / ah;
    if (!(ratio >= 0.25 && ratio <= 4.0))
        return H3_ERR(H3_ERR_INVALID,
                      "H3 supports aspect ratios from 1:4 to 4:1; got %g:%g (%.3g): crop the keyframe or give "
                      "--size WxH",
                      aw, ah, ratio);
    double w, h;
    if (ratio >= 1.0) {
        w = short_edge * ratio;
        h = short_edge;
    } else {
        w = short_edge;
        h = short_edge / ratio;
    }
    const double area = w * h;
    if (area > max_area) {
        const double s = pow(max_area / area, 0.5);
        w *= s;
        h *= s;
    }
    const double m = H3_CANVAS_MULTIPLE;
    int64_t rh = (int64_t)nearbyint(h / m) * H3_CANVAS_MULTIPLE, rw = (int64_t)nearbyint(w / m) * H3_CANVAS_MULTIPLE;
    *height = rh < H3_CANVAS_MULTIPLE ? H3_CANVAS_MULTIPLE : rh;
    *width = rw < H3_CANVAS_MULTIPLE ? H3_CANVAS_MULTIPLE : rw;
    return H3_OK;
}

h3_status h3_keyframe_fit(const uint8_t *src, int w, int h, int ow, int oh, int cover, uint8_t *dst) {
    if (w < 1 || h < 1 || ow < 1 || oh < 1) return H3_ERR(H3_ERR_INVALID, "keyframe: an empty image");
    if (w == ow && h == oh) {
        memcpy(dst, src, (size_t)w * (size_t)h * 3);
        return H3_OK;
    }
    if (!cover) return h3_vis_resize_lanczos(src, w, h, dst, ow, oh);
    const double sx = (double)ow / w, sy = (double)oh / h, scale = sx > sy ? sx : sy;
    double fw = nearbyint((double)w * scale), fh = nearbyint((double)h * scale);
    if (fw > 65536.0 || fh > 65536.0)
        return H3_ERR(H3_ERR_INVALID, "keyframe: a %dx%d image would be scaled to %.0fx%.0f", w, h, fw, fh);
    const int rw = fw < ow ? ow : (int)fw, rh = fh < oh ? oh : (int)fh;
    uint8_t *tmp = h3_malloc((size_t)rw * (size_t)rh * 3, H3_MEM_WORKSPACE);
    if (!tmp) return H3_ERR(H3_ERR_NOMEM, "out of memory resizing a %dx%d keyframe", w, h);
    h3_status st = h3_vis_resize_lanczos(src, w, h, tmp, rw, rh);
    if (st == H3_OK) {
        const int left = (rw - ow) / 2, top = (rh - oh) / 2;
        for (int y = 0; y < oh; y++)
            memcpy(dst + (size_t)y * ow * 3, tmp + ((size_t)(y + top) * rw + left) * 3, (size_t)ow * 3);
    }
    h3_free(tmp);
    return st;
}

void h3_keyframes_free(h3_keyframe_set *s) {
    if (!s) return;
    for (int k = 0; k < s->n; k++) {
        h3_free(s->src[k]);
        h3_free(s->rgb[k]);
    }
    memset(s, 0, sizeof *s);
}

h3_status h3_keyframes_read(const char *const *paths, const int64_t *frames, int n, h3_keyframe_set *out) {
    memset(out, 0, sizeof *out);
    if (n < 0 || n > H3_MAX_KEYFRAMES)
        return H3_ERR(H3_ERR_INVALID, "%d keyframes; at most %d", n, H3_MAX_KEYFRAMES);
    for (int k = 0; k < n; k++) {
        out->path[k] = paths[k];
        out->frame[k] = frames[k];
        out->n = k + 1;
        h3_status st = h3_image_read(paths[k], H3_IMAGE_MAX_PIXELS, &out->src[k], &out->sw[k], &out->sh[k]);
        if (st != H3_OK) {
            h3_keyframes_free(out);
            return st;
        }
    }
    return H3_OK;
}

h3_status h3_keyframes_fit(h3_keyframe_set *s, int64_t width, int64_t height, int64_t frames) {
    for (int k = 0; k < s->n; k++) {
        if (s->frame[k] == H3_KEYFRAME_LAST) s->frame[k] = frames - 1;
        if (s->frame[k] < 0 || s->frame[k] >= frames)
            return H3_ERR(H3_ERR_INVALID, "the keyframe %s is at frame %lld, outside the clip's frames 0..%lld",
                          s->path[k], (long long)s->frame[k], (long long)(frames - 1));
        for (int j = 0; j < k; j++)
            if (s->frame[j] == s->frame[k])
                return H3_ERR(H3_ERR_INVALID, "two keyframes (%s and %s) are at frame %lld: give one image a frame",
                              s->path[j], s->path[k], (long long)s->frame[k]);
    }
    s->width = width;
    s->height = height;
    for (int k = 0; k < s->n; k++) {
        h3_free(s->rgb[k]);
        s->rgb[k] = h3_malloc((size_t)width * (size_t)height * 3, H3_MEM_ACTIVATIONS);
        if (!s->rgb[k]) return H3_ERR(H3_ERR_NOMEM, "out of memory for the keyframes");
        H3_TRY_CTX(h3_keyframe_fit(s->src[k], s->sw[k], s->sh[k], (int)width, (int)height, k > 0, s->rgb[k]),
                   "the keyframe %s", s->path[k]);
    }
    return H3_OK;
}

/* Appends the tokens of text (tagged text). */
h3_status h3_present_text(const h3_tokenizer *tok, const char *text, int32_t **ids, uint8_t **tags, int64_t *n,
                          int64_t *cap) {
    int32_t *t = NULL;
    int64_t nt = 0;
    H3_TRY(h3_tokenizer_encode(tok, text, &t, &nt));
    if (*n + nt > *cap) {
        const int64_t nc = (*n + nt) * 2 + 64;
        int32_t *a = h3_realloc(*ids, (size_t)nc * sizeof(int32_t), H3_MEM_OTHER);
        if (a) *ids = a;
        uint8_t *b = a ? h3_realloc(*tags, (size_t)nc, H3_MEM_OTHER) : NULL;
        if (b) *tags = b;
        if (!a || !b) {
            h3_free(t);
            return H3_ERR(H3_ERR_NOMEM, "out of memory for the presentation");
        }
        *cap = nc;
    }
    for (int64_t i = 0; i < nt; i++) {
        (*ids)[*n] = t[i];
        (*tags)[(*n)++] = H3_TAG_TEXT;
    }
    h3_free(t);
    return H3_OK;
}

/* Appends a vision block of np pads. */
h3_status h3_present_vision(const int32_t sp[3], int32_t pad, int64_t np, int32_t **ids, uint8_t **tags,
                            int64_t *n, int64_t *cap) {
    if (*n + np + 2 > *cap) {
        const int64_t nc = (*n + np + 2) * 2 + 64;
        int32_t *a = h3_realloc(*ids, (size_t)nc * sizeof(int32_t), H3_MEM_OTHER);
        if (a) *ids = a;
        uint8_t *b = a ? h3_realloc(*tags, (size_t)nc, H3_MEM_OTHER) : NULL;
        if (b) *tags = b;
        if (!a || !b) return H3_ERR(H3_ERR_NOMEM, "out of memory for the presentation");
        *cap = nc;
    }
    (*ids)[*n] = sp[0];
    (*tags)[(*n)++] = H3_TAG_VIDEO;
    for (int64_t i = 0; i < np; i++) {
        (*ids)[*n] = pad;
        (*tags)[(*n)++] = H3_TAG_VIDEO;
    }
    (*ids)[*n] = sp[2];
    (*tags)[(*n)++] = H3_TAG_VIDEO;
    return H3_OK;
}

h3_status h3_keyframes_present(const h3_tokenizer *tok, const h3_vis_config *vc, const h3_keyframe_set *s,
                               const int32_t *prompt_ids, int64_t n_prompt, int32_t **ids_out,
                               uint8_t **tags_out, int64_t *n_out, h3_tensor *pixels,
                               int64_t (**grid_out)[3]) {
    h3_status st = H3_OK;
    int32_t *ids = NULL;
    uint8_t *tags = NULL;
    int64_t (*grid)[3] = NULL;
    h3_tensor parts[H3_MAX_KEYFRAMES];
    memset(parts, 0, sizeof parts);
    memset(pixels, 0, sizeof *pixels);
    const char *names[3] = {"<|vision_start|>", "<|image_pad|>", "<|vision_end|>"};
    int32_t sp[3];
    for (int i = 0; i < 3; i++) {
        sp[i] = h3_tokenizer_token_id(tok, names[i]);
        if (sp[i] < 0)
            return H3_ERR(H3_ERR_FORMAT, "the tokenizer has no %s token: keyframes need Qwen3-VL's tokenizer",
                          names[i]);
    }
    if (sp[0] != vc->vision_start_token_id || sp[1] != vc->image_token_id)
        return H3_ERR(H3_ERR_FORMAT,
                      "the tokenizer's <|vision_start|> and <|image_pad|> are ids %d and %d, the text encoder's "
                      "config says %lld and %lld: they are not parts of the same model",
                      sp[0], sp[1], (long long)vc->vision_start_token_id, (long long)vc->image_token_id);
    grid = h3_malloc((size_t)(s->n ? s->n : 1) * sizeof *grid, H3_MEM_OTHER);
    if (!grid) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    int64_t rows = 0, cols = 0, cap = n_prompt + 16;
    for (int k = 0; k < s->n; k++) {
        H3_CHECK_CTX(h3_vis_preprocess(vc, s->rgb[k], (int)s->width, (int)s->height, &parts[k], grid[k]),
                     "the keyframe %s", s->path[k]);
        rows += parts[k].shape[0];
        cols = parts[k].shape[1];
        cap += grid[k][0] * grid[k][1] * grid[k][2] / (vc->merge * vc->merge) + 2 + 32;
    }
    ids = h3_malloc((size_t)cap * sizeof *ids, H3_MEM_OTHER);
    tags = h3_malloc((size_t)cap, H3_MEM_OTHER);
    if (!ids || !tags) H3_FAIL(H3_ERR_NOMEM, "out of memory for the presentation");
    int64_t n = 0;
    for (int k = 0; k < s->n; k++) {
        char label[32];
        snprintf(label, sizeof label, "<Picture %d>: ", k + 1);
        H3_CHECK(h3_present_text(tok, label, &ids, &tags, &n, &cap));
        H3_CHECK(h3_present_vision(sp, sp[1], grid[k][0] * grid[k][1] * grid[k][2] / (vc->merge * vc->merge), &ids,
                                   &tags, &n, &cap));
    }
    if (n + n_prompt > cap) { /* the prompt after the blocks: room for it */
        const int64_t nc = n + n_prompt;
        int32_t *a = h3_realloc(ids, (size_t)nc * sizeof *ids, H3_MEM_OTHER);
        if (a) ids = a;
        uint8_t *b = a ? h3_realloc(tags, (size_t)nc, H3_MEM_OTHER) : NULL;
        if (b) tags = b;
        if (!a || !b) H3_FAIL(H3_ERR_NOMEM, "out of memory for the presentation");
        cap = nc;
    }
    for (int64_t i = 0; i < n_prompt; i++) {
        ids[n] = prompt_ids[i];
        tags[n++] = H3_TAG_TEXT;
    }
    if (s->n) {
        H3_CHECK(h3_tensor_alloc2(pixels, H3_PLACE_HOST, H3_F32, rows, cols, H3_MEM_ACTIVATIONS));
        char *dst = pixels->data;
        for (int k = 0; k < s->n; k++) {
            const size_t b = (size_t)h3_tensor_numel(&parts[k]) * sizeof(float);
            memcpy(dst, parts[k].data, b);
            dst += b;
        }
    }
    *ids_out = ids;
    *tags_out = tags;
    *n_out = n;
    *grid_out = grid;
    ids = NULL;
    tags = NULL;
    grid = NULL;
done:
    for (int k = 0; k < H3_MAX_KEYFRAMES; k++) h3_tensor_free(&parts[k]);
    h3_free(ids);
    h3_free(tags);
    h3_free(grid);
    return st;
}

h3_status h3_video_condition(h3_exec *ex, h3_video_enc *e, const uint8_t *rgb, int64_t F, int64_t H, int64_t W,
                             int64_t lt, int64_t lh, int64_t lw, uint64_t seed, uint32_t stream, int64_t noise_at,
                             float *clean, float *rows, const char *what) {
    h3_status st = H3_OK;
    h3_tensor px = {0}, lat = {0};
    float *noise = NULL, *mixed = NULL;
    const int64_t P = H * W, ps[5] = {1, 3, F, H, W}, ls[5] = {1, H3_LATENT_CHANNELS, lt, lh, lw};
    H3_CHECK(h3_tensor_alloc(&px, H3_PLACE_HOST, H3_U8, 5, ps, H3_MEM_ACTIVATIONS));
    uint8_t *p = px.data;
    for (int64_t f = 0; f < F; f++) {
        const uint8_t *src = rgb + (size_t)f * (size_t)P * 3;
        for (int64_t c = 0; c < 3; c++)
            for (int64_t i = 0; i < P; i++) p[(c * F + f) * P + i] = src[i * 3 + c];
    }
    H3_CHECK(h3_tensor_alloc(&lat, H3_PLACE_HOST, H3_F32, 5, ls, H3_MEM_ACTIVATIONS));
    H3_CHECK_CTX(h3_stage_video_encode(ex, e, &px, 1, H3_KEYFRAME_SEED, &lat), "encoding %s", what);
    h3_tensor_free(&px);
    const int64_t per = h3_tensor_numel(&lat);
    noise = h3_malloc((size_t)per * sizeof(float), H3_MEM_ACTIVATIONS);
    mixed = h3_malloc((size_t)per * sizeof(float), H3_MEM_ACTIVATIONS);
    if (!noise || !mixed) H3_FAIL(H3_ERR_NOMEM, "out of memory for %s", what);
    h3_rng_normal_at(seed, stream, (uint64_t)noise_at, noise, (size_t)per);
    const float *x0 = lat.data, t = H3_KEYFRAME_T, keep = 1.0f - H3_KEYFRAME_T;
    if (clean) memcpy(clean, x0, (size_t)per * sizeof(float));
    for (int64_t i = 0; i < per; i++) mixed[i] = t * x0[i] + keep * noise[i];
    h3_video_patchify(mixed, lt, lh, lw, rows);
done:
    h3_tensor_free(&px);
    h3_tensor_free(&lat);
    h3_free(noise);
    h3_free(mixed);
    return st;
}

h3_status h3_keyframes_condition(h3_exec *ex, h3_video_enc *e, const h3_keyframe_set *s, uint64_t seed,
                                 h3_tensor *clean, float **rows_out,
                                 h3_status (*on_done)(void *user, int done, int total), void *user) {
    h3_status st = H3_OK;
    memset(clean, 0, sizeof *clean);
    *rows_out = NULL;
    const int64_t H = s->height, W = s->width, lh = H / H3_VAE_SPATIAL, lw = W / H3_VAE_SPATIAL;
    const int64_t per = (int64_t)H3_LATENT_CHANNELS * lh * lw, per_rows = (lh / 2) * (lw / 2);
    float *rows = NULL;
    const int64_t cs[5] = {s->n, H3_LATENT_CHANNELS, 1, lh, lw};
    H3_CHECK(h3_tensor_alloc(clean, H3_PLACE_HOST, H3_F32, 5, cs, H3_MEM_ACTIVATIONS));
    rows = h3_malloc((size_t)(s->n * per_rows * H3_VIDEO_ROW_DIM) * sizeof(float) + 8, H3_MEM_ACTIVATIONS);
    if (!rows) H3_FAIL(H3_ERR_NOMEM, "out of memory for the keyframes' latents");
    for (int k = 0; k < s->n; k++) {
        char what[1100];
        snprintf(what, sizeof what, "the keyframe %s", s->path[k]);
        H3_CHECK(h3_video_condition(ex, e, s->rgb[k], 1, H, W, 1, lh, lw, seed, H3_RNG_STREAM_KEYFRAME,
                                    (int64_t)k * per, (float *)clean->data + (size_t)k * per,
                                    rows + (size_t)k * per_rows * H3_VIDEO_ROW_DIM, what));
        if (on_done) H3_CHECK(on_done(user, k + 1, s->n));
    }
    *rows_out = rows;
    rows = NULL;
done:
    h3_free(rows);
    if (st != H3_OK) h3_tensor_free(clean);
    return st;
}
