#include "pipeline/reference.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "models/audio_vae.h"
#include "pipeline/keyframe.h"
#include "pipeline/media.h"
#include "pipeline/request.h"
#include "pipeline/stages.h"
#include "sample/rng.h"

static const char *kind_name(h3_ref_kind k) {
    return k == H3_REF_IMAGE ? "image" : k == H3_REF_VIDEO ? "video" : "audio";
}

void h3_refs_free(h3_ref_set *s) {
    if (!s) return;
    for (int k = 0; k < s->n; k++) {
        h3_free(s->r[k].src);
        h3_free(s->r[k].rgb);
        h3_free(s->r[k].left);
        h3_free(s->r[k].right);
    }
    memset(s, 0, sizeof *s);
}

/* A file's sound into r (none when it has no audio stream and may_lack). */
static h3_status read_sound(h3_ref *r, double max_seconds, int may_lack) {
    h3_sound snd;
    h3_status st = h3_sound_read(r->path, H3_AUDIO_RATE, (int64_t)ceil(max_seconds * H3_AUDIO_RATE), &snd);
    if (st == H3_ERR_FORMAT && may_lack) {
        h3_clear_error();
        return H3_OK;
    }
    H3_TRY(st);
    r->left = snd.left;
    r->right = snd.right;
    r->samples = snd.samples;
    return H3_OK;
}

h3_status h3_refs_read(const h3_ref_kind *kinds, const char *const *paths, int n, double max_seconds,
                       h3_ref_set *out) {
    memset(out, 0, sizeof *out);
    int count[3] = {0, 0, 0};
    static const int limit[3] = {H3_MAX_REF_IMAGES, H3_MAX_REF_VIDEOS, H3_MAX_REF_AUDIOS};
    static const char *const opt[3] = {"--ref-image", "--ref-video", "--ref-audio"};
    if (n < 0 || n > H3_MAX_REFS)
        return H3_ERR(H3_ERR_INVALID, "%d references; H3 takes at most %d (images, videos and sounds together)", n,
                      H3_MAX_REFS);
    for (int k = 0; k < n; k++) {
        if ((int)kinds[k] < 0 || kinds[k] > H3_REF_AUDIO) return H3_ERR(H3_ERR_INVALID, "reference %d: no kind", k + 1);
        count[kinds[k]]++;
    }
    for (int c = 0; c < 3; c++)
        if (count[c] > limit[c])
            return H3_ERR(H3_ERR_INVALID, "%d %s references (%s); H3 takes at most %d", count[c],
                          kind_name((h3_ref_kind)c), opt[c], limit[c]);
    if (n && count[H3_REF_AUDIO] == n)
        return H3_ERR(H3_ERR_INVALID, "sound references (--ref-audio) need at least one image or video reference "
                                      "beside them (--ref-image or --ref-video): H3 does not take sounds alone");
    for (int k = 0; k < n; k++) {
        h3_ref *r = &out->r[k];
        r->kind = kinds[k];
        r->path = paths[k];
        out->n = k + 1;
        h3_status st = H3_OK;
        if (r->kind == H3_REF_IMAGE) {
            st = h3_image_read(r->path, H3_IMAGE_MAX_PIXELS, &r->src, &r->sw, &r->sh);
        } else if (r->kind == H3_REF_VIDEO) {
            h3_video_frames v;
            st = h3_video_read(r->path, max_seconds, H3_IMAGE_MAX_PIXELS / 16, &v);
            if (st == H3_OK) {
                r->src = v.rgb;
                r->sw = v.width;
                r->sh = v.height;
                r->src_frames = v.frames;
                r->src_fps = v.fps > 0 ? v.fps : H3_FPS;
                st = read_sound(r, max_seconds, 1);
            }
        } else {
            st = read_sound(r, max_seconds, 0);
        }
        if (st != H3_OK) {
            h3_status w = h3_error_wrap(st, "the %s reference %s", kind_name(r->kind), r->path);
            h3_refs_free(out);
            return w;
        }
    }
    return H3_OK;
}

/* Python's round(x), half to even. */
static int64_t round_even(double x) { return (int64_t)nearbyint(x); }

h3_status h3_refs_normalize(h3_ref_set *s, int64_t frames, int image_short, int video_short, int64_t hop) {
    const int m = H3_CANVAS_MULTIPLE;
    if (image_short < m || image_short % m || video_short < m || video_short % m)
        return H3_ERR(H3_ERR_INVALID, "references: short edges %d and %d must be positive multiples of %d",
                      image_short, video_short, m);
    const int64_t keep = frames * H3_AUDIO_RATE / H3_FPS; /* int(duration · rate) */
    for (int k = 0; k < s->n; k++) {
        h3_ref *r = &s->r[k];
        memset(&r->block, 0, sizeof r->block);
        r->block.kind = r->kind;
        h3_free(r->rgb);
        r->rgb = NULL;
        if (r->samples > keep) r->samples = keep;
        if (r->kind != H3_REF_IMAGE && r->samples) r->block.audio_t = (r->samples + hop - 1) / hop;
        if (r->kind == H3_REF_AUDIO && r->samples < hop)
            return H3_ERR(H3_ERR_INVALID, "the audio reference %s holds %.3f s of sound: too short to encode",
                          r->path, (double)r->samples / H3_AUDIO_RATE);
        if (r->kind == H3_REF_IMAGE) {
            if (r->sw > 4 * r->sh || r->sh > 4 * r->sw)
                return H3_ERR(H3_ERR_INVALID, "the image reference %s is %dx%d: H3 takes 1:4 to 4:1; crop it",
                              r->path, r->sw, r->sh);
            const double scale = (double)image_short / (double)(r->sw < r->sh ? r->sw : r->sh);
            int64_t th = round_even((double)r->sh * scale / m) * m, tw = round_even((double)r->sw * scale / m) * m;
            if (th < m) th = m;
            if (tw < m) tw = m;
            r->w = (int)tw;
            r->h = (int)th;
            r->rgb = h3_malloc((size_t)tw * (size_t)th * 3, H3_MEM_ACTIVATIONS);
            if (!r->rgb) return H3_ERR(H3_ERR_NOMEM, "out of memory for the image reference %s", r->path);
            if (r->sw == r->w && r->sh == r->h)
                memcpy(r->rgb, r->src, (size_t)tw * (size_t)th * 3);
            else
                H3_TRY_CTX(h3_vis_resize_lanczos(r->src, r->sw, r->sh, r->rgb, r->w, r->h), "the image reference %s",
                           r->path);
            r->block.lt = 1;
            r->block.lh = th / H3_VAE_SPATIAL;
            r->block.lw = tw / H3_VAE_SPATIAL;
        } else if (r->kind == H3_REF_VIDEO) {
            /* onto 24 fps: source frame i held over the slots [floor(i·s + 0.5), floor((i+1)·s + 0.5)) */
            const double sc = H3_FPS / r->src_fps;
            int64_t n24 = (int64_t)floor((double)r->src_frames * sc + 0.5);
            if (n24 > frames) n24 = frames;
            if (n24 < H3_REF_MIN_FRAMES)
                return H3_ERR(H3_ERR_INVALID,
                              "the video reference %s holds %lld frames at 24 fps (%.2f s): at least %d (%.2f s) are "
                              "needed (the video VAE's first chunk)",
                              r->path, (long long)n24, (double)n24 / H3_FPS, H3_REF_MIN_FRAMES,
                              (double)H3_REF_MIN_FRAMES / H3_FPS);
            int64_t cw, ch;
            const double area = (double)video_short * video_short * (double)H3_CANVAS_MAX_AREA /
                                ((double)H3_CANVAS_SHORT * H3_CANVAS_SHORT);
            H3_TRY_CTX(h3_canvas_from_aspect_at(r->sw, r->sh, video_short, area, &cw, &ch), "the video reference %s",
                       r->path);
            r->w = (int)cw;
            r->h = (int)ch;
            r->frames = n24;
            const size_t fb = (size_t)cw * (size_t)ch * 3, sb = (size_t)r->sw * (size_t)r->sh * 3;
            r->rgb = h3_malloc((size_t)n24 * fb, H3_MEM_ACTIVATIONS);
            if (!r->rgb) return H3_ERR(H3_ERR_NOMEM, "out of memory for the video reference %s", r->path);
            int64_t i = 0; /* the source frame of slot j */
            for (int64_t j = 0; j < n24; j++) {
                while (i + 1 < r->src_frames && (int64_t)floor((double)(i + 1) * sc + 0.5) <= j) i++;
                const uint8_t *src = r->src + (size_t)i * sb;
                if (r->sw == r->w && r->sh == r->h)
                    memcpy(r->rgb + (size_t)j * fb, src, fb);
                else
                    H3_TRY_CTX(h3_vis_resize_lanczos(src, r->sw, r->sh, r->rgb + (size_t)j * fb, r->w, r->h),
                               "the video reference %s", r->path);
            }
            const int64_t fv = ((n24 - 5) / H3_FRAMES_CHUNK) * H3_FRAMES_CHUNK + 5; /* 17n + 5, n >= 1 */
            r->block.lt = h3_video_latent_frames(fv);
            r->block.lh = ch / H3_VAE_SPATIAL;
            r->block.lw = cw / H3_VAE_SPATIAL;
        }
    }
    return H3_OK;
}

int64_t h3_refs_latent_values(const h3_ref_set *s) {
    int64_t n = 0;
    for (int k = 0; k < s->n; k++) {
        const h3_ref_block *b = &s->r[k].block;
        if (b->kind != H3_REF_AUDIO) n += (int64_t)H3_LATENT_CHANNELS * b->lt * b->lh * b->lw;
    }
    return n;
}

void h3_refs_blocks(const h3_ref_set *s, h3_ref_block *blocks) {
    for (int k = 0; k < s->n; k++) blocks[k] = s->r[k].block;
}

/* The 2 fps frames of a normalized video: their indices into idx (returns how many). */
static int64_t sample_indices(int64_t frames, int64_t *idx) {
    const double stride = (double)H3_FPS / H3_REF_SAMPLE_FPS;
    int64_t n = 0;
    for (double cursor = 0.0; round_even(cursor) < frames; cursor += stride) {
        const int64_t i = round_even(cursor);
        if (!n || i > idx[n - 1]) idx[n++] = i;
    }
    return n;
}

h3_status h3_refs_present(const h3_tokenizer *tok, const h3_vis_config *vc, const h3_ref_set *s,
                          const int32_t *prompt_ids, int64_t n_prompt, int32_t **ids_out, uint8_t **tags_out,
                          int64_t *n_out, h3_tensor *pixels, int64_t (**grid_out)[3], int *n_img_out) {
    h3_status st = H3_OK;
    int32_t *ids = NULL;
    uint8_t *tags = NULL;
    int64_t (*grid)[3] = NULL;
    h3_tensor *parts = NULL;
    int np = 0, cap_parts = 0;
    int64_t n = 0, cap = 0, *idx = NULL;
    memset(pixels, 0, sizeof *pixels);
    const char *names[4] = {"<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"};
    int32_t sp[4];
    for (int i = 0; i < 4; i++) {
        sp[i] = h3_tokenizer_token_id(tok, names[i]);
        if (sp[i] < 0)
            return H3_ERR(H3_ERR_FORMAT, "the tokenizer has no %s token: references need Qwen3-VL's tokenizer",
                          names[i]);
    }
    if (sp[0] != vc->vision_start_token_id || sp[1] != vc->image_token_id || sp[3] != vc->video_token_id)
        return H3_ERR(H3_ERR_FORMAT,
                      "the tokenizer's <|vision_start|>, <|image_pad|> and <|video_pad|> are ids %d, %d and %d, the "
                      "text encoder's config says %lld, %lld and %lld: they are not parts of the same model",
                      sp[0], sp[1], sp[3], (long long)vc->vision_start_token_id, (long long)vc->image_token_id,
                      (long long)vc->video_token_id);
    for (int k = 0; k < s->n; k++) /* vision blocks: an image one, a video one per pair of sampled frames */
        cap_parts += s->r[k].kind == H3_REF_IMAGE ? 1 : s->r[k].kind == H3_REF_VIDEO ? (int)(s->r[k].frames / 24 + 2) : 0;
    parts = h3_calloc((size_t)(cap_parts ? cap_parts : 1), sizeof *parts, H3_MEM_OTHER);
    grid = h3_malloc((size_t)(cap_parts ? cap_parts : 1) * sizeof *grid, H3_MEM_OTHER);
    idx = h3_malloc((size_t)(H3_MAX_FRAMES / 12 + 4) * sizeof *idx, H3_MEM_OTHER);
    if (!parts || !grid || !idx) H3_FAIL(H3_ERR_NOMEM, "out of memory for the presentation");
    int count[3] = {0, 0, 0};
    char label[64];
    for (int k = 0; k < s->n; k++) {
        const h3_ref *r = &s->r[k];
        if (r->samples) {
            snprintf(label, sizeof label, "<Audio %d>: ", ++count[H3_REF_AUDIO]);
            H3_CHECK(h3_present_text(tok, label, &ids, &tags, &n, &cap));
        }
        if (r->kind == H3_REF_IMAGE) {
            snprintf(label, sizeof label, "<Picture %d>: ", ++count[H3_REF_IMAGE]);
            H3_CHECK(h3_present_text(tok, label, &ids, &tags, &n, &cap));
            H3_CHECK_CTX(h3_vis_preprocess(vc, r->rgb, r->w, r->h, &parts[np], grid[np]), "the image reference %s",
                         r->path);
            H3_CHECK(h3_present_vision(sp, sp[1], grid[np][1] * grid[np][2] / (vc->merge * vc->merge), &ids, &tags, &n,
                                 &cap));
            np++;
        } else if (r->kind == H3_REF_VIDEO) {
            snprintf(label, sizeof label, "<Video %d>: ", ++count[H3_REF_VIDEO]);
            H3_CHECK(h3_present_text(tok, label, &ids, &tags, &n, &cap));
            const int64_t ns = sample_indices(r->frames, idx);
            if (ns < 2) H3_FAIL(H3_ERR_INVALID, "the video reference %s is too short for its 2 fps pairs", r->path);
            int64_t oh, ow;
            H3_CHECK_CTX(h3_vis_video_smart_resize(vc, ns, r->h, r->w, &oh, &ow), "the video reference %s", r->path);
            const size_t fb = (size_t)r->w * (size_t)r->h * 3;
            for (int64_t b = 0; b < (ns + 1) / 2; b++) {
                const int64_t i0 = 2 * b, i1 = 2 * b + 1 < ns ? 2 * b + 1 : ns - 1;
                const double t = ((double)i0 / H3_REF_SAMPLE_FPS + (double)i1 / H3_REF_SAMPLE_FPS) / 2.0;
                snprintf(label, sizeof label, "<%.1f seconds>", t);
                H3_CHECK(h3_present_text(tok, label, &ids, &tags, &n, &cap));
                if (np >= cap_parts) H3_FAIL(H3_ERR_INTERNAL, "the video reference %s: more blocks than counted", r->path);
                H3_CHECK_CTX(h3_vis_preprocess_pair(vc, r->rgb + (size_t)idx[i0] * fb, r->rgb + (size_t)idx[i1] * fb,
                                                    r->w, r->h, oh, ow, &parts[np], grid[np]),
                             "the video reference %s", r->path);
                H3_CHECK(h3_present_vision(sp, sp[3], grid[np][1] * grid[np][2] / (vc->merge * vc->merge), &ids, &tags,
                                     &n, &cap));
                np++;
            }
        }
    }
    if (n + n_prompt > cap) {
        const int64_t nc = n + n_prompt + 1;
        int32_t *a = h3_realloc(ids, (size_t)nc * sizeof(int32_t), H3_MEM_OTHER);
        if (a) ids = a;
        uint8_t *b = a ? h3_realloc(tags, (size_t)nc, H3_MEM_OTHER) : NULL;
        if (b) tags = b;
        if (!a || !b) H3_FAIL(H3_ERR_NOMEM, "out of memory for the presentation");
    }
    for (int64_t i = 0; i < n_prompt; i++) {
        ids[n] = prompt_ids[i];
        tags[n++] = H3_TAG_TEXT;
    }
    if (np) {
        int64_t rows = 0;
        for (int i = 0; i < np; i++) rows += parts[i].shape[0];
        H3_CHECK(h3_tensor_alloc2(pixels, H3_PLACE_HOST, H3_F32, rows, parts[0].shape[1], H3_MEM_ACTIVATIONS));
        char *dst = pixels->data;
        for (int i = 0; i < np; i++) {
            const size_t b = (size_t)h3_tensor_numel(&parts[i]) * sizeof(float);
            memcpy(dst, parts[i].data, b);
            dst += b;
        }
    }
    *ids_out = ids;
    *tags_out = tags;
    *n_out = n;
    *grid_out = grid;
    *n_img_out = np;
    ids = NULL;
    tags = NULL;
    grid = NULL;
done:
    if (parts)
        for (int i = 0; i < cap_parts; i++) h3_tensor_free(&parts[i]);
    h3_free(parts);
    h3_free(idx);
    h3_free(ids);
    h3_free(tags);
    h3_free(grid);
    return st;
}

h3_status h3_refs_encode_sounds(h3_exec *ex, h3_audio_enc *ae, const struct h3_audio_vae_config *av,
                                const h3_ref_set *s, float **arows_out,
                                h3_status (*on_done)(void *user, int done, int total), void *user) {
    h3_status st = H3_OK;
    *arows_out = NULL;
    h3_ref_block blocks[H3_MAX_REFS];
    h3_refs_blocks(s, blocks);
    int64_t nv = 0, na = 0;
    h3_ref_blocks_rows(s->n, blocks, &nv, &na);
    if (na && !ae) return H3_ERR(H3_ERR_INVALID, "references: sounds without the audio VAE's encoder");
    float *arows = h3_malloc((size_t)(na * H3_AUDIO_LATENT_CHANNELS) * sizeof(float) + 8, H3_MEM_ACTIVATIONS);
    h3_tensor wave = {0}, alat = {0};
    if (!arows) H3_FAIL(H3_ERR_NOMEM, "out of memory for the references' audio rows");
    int64_t ao = 0;
    int done = 0, total = 0;
    for (int k = 0; k < s->n; k++) total += blocks[k].audio_t > 0;
    for (int k = 0; k < s->n; k++) {
        const h3_ref *r = &s->r[k];
        const h3_ref_block *b = &blocks[k];
        if (!b->audio_t) continue;
        /* two items of the mono encoder, the posterior mean, normalized, channel-major */
        const int64_t ws[3] = {2, 1, r->samples};
        H3_CHECK(h3_tensor_alloc(&wave, H3_PLACE_HOST, H3_F32, 3, ws, H3_MEM_ACTIVATIONS));
        memcpy(wave.data, r->left, (size_t)r->samples * sizeof(float));
        memcpy((float *)wave.data + r->samples, r->right, (size_t)r->samples * sizeof(float));
        H3_CHECK_CTX(h3_audio_enc_encode(ae, ex, &wave, &alat), "encoding the sound of %s", r->path);
        if (alat.shape[2] != b->audio_t)
            H3_FAIL(H3_ERR_INTERNAL, "the sound of %s: %lld latents, not %lld", r->path, (long long)alat.shape[2],
                    (long long)b->audio_t);
        h3_audio_enc_normalize(av, &alat);
        h3_audio_pack(alat.data, b->audio_t, arows + ao * H3_AUDIO_LATENT_CHANNELS);
        ao += 2 * b->audio_t;
        h3_tensor_free(&wave);
        h3_tensor_free(&alat);
        if (on_done) H3_CHECK(on_done(user, ++done, total));
    }
    if (ao != na) H3_FAIL(H3_ERR_INTERNAL, "the references' audio rows do not add up");
    *arows_out = arows;
    arows = NULL;
done:
    h3_tensor_free(&wave);
    h3_tensor_free(&alat);
    h3_free(arows);
    return st;
}

h3_status h3_refs_encode_visuals(h3_exec *ex, h3_video_enc *ve, const h3_ref_set *s, uint64_t seed, float **vrows_out,
                                 float **clean_out, h3_status (*on_done)(void *user, int done, int total), void *user) {
    h3_status st = H3_OK;
    *vrows_out = NULL;
    if (clean_out) *clean_out = NULL;
    h3_ref_block blocks[H3_MAX_REFS];
    h3_refs_blocks(s, blocks);
    int64_t nv = 0, na = 0;
    h3_ref_blocks_rows(s->n, blocks, &nv, &na);
    if (nv && !ve) return H3_ERR(H3_ERR_INVALID, "references: image or video rows without the video VAE's encoder");
    float *vrows = NULL, *clean = NULL;
    vrows = h3_malloc((size_t)(nv * H3_VIDEO_ROW_DIM) * sizeof(float) + 8, H3_MEM_ACTIVATIONS);
    if (!vrows) H3_FAIL(H3_ERR_NOMEM, "out of memory for the references' rows");
    if (clean_out) {
        clean = h3_malloc((size_t)h3_refs_latent_values(s) * sizeof(float) + 8, H3_MEM_ACTIVATIONS);
        if (!clean) H3_FAIL(H3_ERR_NOMEM, "out of memory for the references' latents");
    }
    int64_t vo = 0, noise_at = 0;
    int done = 0, total = 0;
    for (int k = 0; k < s->n; k++) total += blocks[k].kind != H3_REF_AUDIO;
    for (int k = 0; k < s->n; k++) {
        const h3_ref *r = &s->r[k];
        const h3_ref_block *b = &blocks[k];
        if (b->kind == H3_REF_AUDIO) continue;
        /* the pixels through the video VAE's encoder, mixed to 0.999 (the keyframes' conditioning) */
        const int64_t F = b->kind == H3_REF_IMAGE ? 1 : ((r->frames - 5) / H3_FRAMES_CHUNK) * H3_FRAMES_CHUNK + 5;
        char what[1100];
        snprintf(what, sizeof what, "the %s reference %s", kind_name(r->kind), r->path);
        H3_CHECK(h3_video_condition(ex, ve, r->rgb, F, r->h, r->w, b->lt, b->lh, b->lw, seed, H3_RNG_STREAM_REFERENCE,
                                    noise_at, clean ? clean + noise_at : NULL, vrows + vo * H3_VIDEO_ROW_DIM, what));
        noise_at += (int64_t)H3_LATENT_CHANNELS * b->lt * b->lh * b->lw;
        vo += b->lt * (b->lh / 2) * (b->lw / 2);
        if (on_done) H3_CHECK(on_done(user, ++done, total));
    }
    if (vo != nv) H3_FAIL(H3_ERR_INTERNAL, "the references' video rows do not add up");
    *vrows_out = vrows;
    if (clean_out) *clean_out = clean;
    vrows = clean = NULL;
done:
    h3_free(vrows);
    h3_free(clean);
    return st;
}
