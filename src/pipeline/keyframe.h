/* fl2va keyframes: images that fix frames of the clip (diffusers' `fl2va` blocks, ComfyUI's any-frame guide).
 *
 * A request names up to H3_MAX_KEYFRAMES images in packed order: `--first-frame` (frame 0), `--last-frame`
 * (the clip's last frame), then each `--keyframe IMG@FRAME` as given. What happens to them, as the reference:
 *
 *  1. The canvas: without --size, the first keyframe's aspect ratio on H3's own geometry
 *     (h3_canvas_from_aspect: short edge 768, at most 768·1344 pixels, both sides rounded to 32).
 *  2. Onto the canvas (PIL's Lanczos, 8-bit): the first keyframe is stretched to width × height; every other
 *     one is cover-cropped: scale = max(W/w, H/h), resized to (max(W, round(w·scale)), max(H, round(h·scale)))
 *     with Python's round (half to even), then the centre crop at ((rw − W) // 2, (rh − H) // 2). A keyframe
 *     already of the canvas's size is taken as it is.
 *  3. The presentation (h3_keyframes_present): for keyframe i (from 1) the text "<Picture i>: " tokenized on
 *     its own, then <|vision_start|>, <|image_pad|> × (grid_h·grid_w/4), <|vision_end|>; then the prompt's
 *     ids. The label's rows are tagged text, the vision block's (its two flanking tokens included) video. The
 *     image processor (models/vision.h) makes pixel_values of the canvas-sized keyframe.
 *  4. The conditioning (h3_keyframes_condition): each keyframe encoded alone by the video VAE's encoder (one
 *     frame, spatial only), its posterior sampled with stream H3_RNG_STREAM_VAE_ENCODE of seed 42 (the
 *     reference's fixed seed; h3run's generator), rounded to float16 and normalized with the VAE's
 *     latents_mean/std (h3_stage_video_encode); then mixed to t = 0.999 as x = 0.999·x0 + (1 − 0.999)·ε in
 *     float32 with ε from stream H3_RNG_STREAM_KEYFRAME of the request's seed (sample/rng.h), and patchified
 *     into the keyframe rows of the packed sequence (pipeline/layout.h), which every step holds unchanged.
 */
#ifndef H3_PIPELINE_KEYFRAME_H
#define H3_PIPELINE_KEYFRAME_H

#include <stdint.h>

#include "base/status.h"
#include "io/tokenizer.h"
#include "models/video_vae_enc.h"
#include "models/vision.h"
#include "pipeline/layout.h"

#define H3_KEYFRAME_LAST   (-1) /* a keyframe's frame: the clip's last one (--last-frame) */
#define H3_KEYFRAME_SEED   42   /* the posterior's seed (diffusers' keyframe_encode_seed) */
#define H3_CANVAS_SHORT    768
#define H3_CANVAS_MAX_AREA (768 * 1344)

/* diffusers' resolve_canvas_size for H3: the canvas of an aspect ratio aw:ah (1:4 to 4:1; H3_ERR_INVALID
 * otherwise): the short edge 768, the area scaled down to 768·1344 when above, each side rounded (half to
 * even) to a multiple of 32, at least 32. */
h3_status h3_canvas_from_aspect(double aw, double ah, int64_t *width, int64_t *height);
/* The same rule at another short edge and area cap (ref2va's videos on a smaller model's canvas). */
h3_status h3_canvas_from_aspect_at(double aw, double ah, int short_edge, double max_area, int64_t *width,
                                   int64_t *height);

/* One keyframe onto an ow × oh canvas (rule 2 above): cover 0 stretches, 1 cover-crops. src [h, w, 3],
 * dst [oh, ow, 3]. */
h3_status h3_keyframe_fit(const uint8_t *src, int w, int h, int ow, int oh, int cover, uint8_t *dst);

typedef struct h3_keyframe_set {
    int n;
    const char *path[H3_MAX_KEYFRAMES];
    int64_t frame[H3_MAX_KEYFRAMES]; /* as asked (H3_KEYFRAME_LAST), then resolved by h3_keyframes_fit */
    uint8_t *src[H3_MAX_KEYFRAMES];  /* the image as read, [sh, sw, 3] */
    int sw[H3_MAX_KEYFRAMES], sh[H3_MAX_KEYFRAMES];
    uint8_t *rgb[H3_MAX_KEYFRAMES]; /* on the canvas, [height, width, 3] (after h3_keyframes_fit) */
    int64_t width, height;
} h3_keyframe_set;

/* Reads the images (through libav: PNG, JPEG, WebP, ...; at most H3_IMAGE_MAX_PIXELS each): paths[k] with
 * frames[k] (H3_KEYFRAME_LAST or a frame >= 0). An unreadable, empty, truncated or huge image is an error
 * naming the file. */
h3_status h3_keyframes_read(const char *const *paths, const int64_t *frames, int n, h3_keyframe_set *out);
/* Puts them on the canvas and resolves their frames against the clip's (a frame outside 0..frames-1, or two
 * keyframes on one frame, is H3_ERR_INVALID naming the option). */
h3_status h3_keyframes_fit(h3_keyframe_set *s, int64_t width, int64_t height, int64_t frames);
void h3_keyframes_free(h3_keyframe_set *s);

/* Rule 3: ids/tags [n] (h3_malloc'd) of the presentation before prompt_ids, and the processor's pixel_values
 * (f32 host tensor) and grids [s->n][3] (h3_malloc'd) of the canvas-sized keyframes. The tokenizer must know
 * <|vision_start|>, <|image_pad|> and <|vision_end|>. */
h3_status h3_keyframes_present(const h3_tokenizer *tok, const h3_vis_config *vc, const h3_keyframe_set *s,
                               const int32_t *prompt_ids, int64_t n_prompt, int32_t **ids, uint8_t **tags,
                               int64_t *n, h3_tensor *pixels, int64_t (**grid)[3]);

/* Presentations (the keyframes' here, the references' in reference.c): the tokens of text appended, tagged text;
 * a vision block appended (sp[0], np pads of id pad, sp[2]), tagged video. ids and tags grow (h3_realloc) past
 * *cap. */
h3_status h3_present_text(const h3_tokenizer *tok, const char *text, int32_t **ids, uint8_t **tags, int64_t *n,
                          int64_t *cap);
h3_status h3_present_vision(const int32_t sp[3], int32_t pad, int64_t np, int32_t **ids, uint8_t **tags, int64_t *n,
                            int64_t *cap);

/* One conditioning item (a keyframe; an image or video reference, pipeline/reference.h): its F frames of
 * interleaved RGB (H x W) as planar pixels through the video VAE's encoder at its place (h3_stage_video_encode) into
 * [24, lt, lh, lw] latents, copied to clean (NULL: not kept), mixed to t = H3_KEYFRAME_T with the noise of (seed,
 * stream) from position noise_at, and patchified into rows [lt·(lh/2)·(lw/2), 96]. what names the item in an error
 * ("the keyframe a.png"). */
h3_status h3_video_condition(h3_exec *ex, h3_video_enc *e, const uint8_t *rgb, int64_t F, int64_t H, int64_t W,
                             int64_t lt, int64_t lh, int64_t lw, uint64_t seed, uint32_t stream, int64_t noise_at,
                             float *clean, float *rows, const char *what);

/* Rule 4: clean [K, 24, 1, H/16, W/16] (allocated here: the normalized conditioning latents) and rows
 * [K·(H/32)·(W/32), 96] (h3_malloc'd: the noised keyframe rows in packed order) of the keyframes, with the
 * encoder e where it was placed, the request's seed for the mix. on_done (may be NULL) after each keyframe. */
h3_status h3_keyframes_condition(h3_exec *ex, h3_video_enc *e, const h3_keyframe_set *s, uint64_t seed,
                                 h3_tensor *clean, float **rows,
                                 h3_status (*on_done)(void *user, int done, int total), void *user);

#endif
