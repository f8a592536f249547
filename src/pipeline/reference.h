/* ref2va references: images, videos and sounds that say who and what appears and sounds (diffusers' `ref2va`
 * blocks: MiniMaxH3Ref2VASetupStep, MiniMaxH3Ref2VATextEncoderStep, MiniMaxH3Ref2VAReferenceEncoderStep).
 *
 * A request names up to H3_MAX_REF_IMAGES images, H3_MAX_REF_VIDEOS videos and H3_MAX_REF_AUDIOS sounds,
 * H3_MAX_REFS in all, in the order the model reads them (the order labels them and lays them out on the rotary
 * clock); sounds alone are refused (the release's rule). What happens to them, as the reference:
 *
 *  1. Normalized (h3_refs_normalize), for a clip of `frames` frames:
 *     - an image (1:4 to 4:1) to a short edge of its own, image_short (the release: 2048, upscaling included,
 *       no area cap): scale = image_short / min(w, h), each side max(32, round(side·scale / 32)·32) (round half to
 *       even), PIL's Lanczos; an image already of that size is taken as it is;
 *     - a video onto 24 fps (frame i of a file at r fps held from slot floor(i·24/r + 0.5) to the next frame's, the
 *       last to floor(n·24/r + 0.5): ffmpeg's fps filter), cut to `frames` frames, put on the canvas of its own
 *       aspect ratio (h3_canvas_from_aspect with video_short for 768, the area cap scaled with it) by Lanczos;
 *       its soundtrack, when the file has one, is the reference's own audio;
 *     - a sound (and a video's soundtrack) resampled to 32 kHz stereo (mono on both sides; libswresample) and cut
 *       to the clip's length, frames / 24 s.
 *  2. The presentation (h3_refs_present), per reference in order, numbered per kind: a reference with sound
 *     "<Audio j>: " (a video's before its "<Video k>: "); an image "<Picture i>: " and a vision block of
 *     <|image_pad|>; a video "<Video k>: ", then for each pair of its frames sampled at 2 fps (every 12th of the
 *     normalized frames; the last repeated to make the pairs whole) "<T.T seconds>" (the pair's mean time, %.1f
 *     rounding half to even) and a vision block of <|video_pad|> (models/vision.h: h3_vis_preprocess_pair at
 *     the video processor's size). Label rows are tagged text, vision blocks (their flanking tokens included)
 *     video. Then the prompt.
 *  3. The conditioning (h3_refs_condition): an image through the video VAE's encoder (one frame), a video's first
 *     17n + 5 frames (the largest that fit; at least 22) in temporal chunks, each posterior sampled with seed 42,
 *     rounded to float16 and normalized (h3_stage_video_encode), then mixed to t = 0.999 with noise of stream
 *     H3_RNG_STREAM_REFERENCE of the request's seed (h3run's generator; diffusers draws it from the request's)
 *     and patchified: the conditioning video rows, held at max(t_video, 0.999). A sound through the audio VAE's
 *     encoder (posterior mean, the two channels as two items, normalized): rows channel-major, held clean (t = 1).
 *     The layout of the blocks is h3_seq_layout_ref2va (pipeline/layout.h).
 */
#ifndef H3_PIPELINE_REFERENCE_H
#define H3_PIPELINE_REFERENCE_H

#include <stdint.h>

#include "base/status.h"
#include "io/tokenizer.h"
#include "models/audio_vae_enc.h"
#include "models/video_vae_enc.h"
#include "models/vision.h"
#include "pipeline/layout.h"

#define H3_MAX_REF_IMAGES   9
#define H3_MAX_REF_VIDEOS   3
#define H3_MAX_REF_AUDIOS   3
#define H3_REF_IMAGE_SHORT  2048 /* the release's image short edge (diffusers' reference_image_short_edge) */
#define H3_REF_VIDEO_SHORT  768  /* the release's video canvas short edge (its canvas_short_edge) */
#define H3_REF_SAMPLE_FPS   2    /* the rate the text encoder reads a reference video at */
#define H3_MAX_REF_TOKENS   131072 /* a presentation with references: 9 images at 2048 are 65,664 vision rows */
#define H3_REF_MIN_FRAMES   22   /* a reference video's frames at 24 fps, at least (the video VAE's 17 + 5) */

typedef struct h3_ref {
    h3_ref_kind kind;
    const char *path;
    /* as read: an image [sh, sw, 3]; a video's frames [src_frames, sh, sw, 3] at src_fps */
    uint8_t *src;
    int sw, sh;
    int64_t src_frames;
    double src_fps;
    /* normalized: the image, or the video's frames at 24 fps [frames, h, w, 3] */
    uint8_t *rgb;
    int w, h;
    int64_t frames;
    /* the sound: an audio reference's, a video's soundtrack (samples 0: none), 32 kHz stereo */
    float *left, *right;
    int64_t samples;
    /* the block: latent geometry (lt, lh, lw) and audio latents a channel (pipeline/layout.h) */
    h3_ref_block block;
} h3_ref;

typedef struct h3_ref_set {
    int n;
    h3_ref r[H3_MAX_REFS];
} h3_ref_set;

/* Reads the references (through libav; a video's first max_seconds, a sound's first max_seconds): the counts
 * are checked first (H3_ERR_INVALID naming the limit); an unreadable file is the error of its reader, naming it.
 * max_seconds is the longest clip the request may make. */
h3_status h3_refs_read(const h3_ref_kind *kinds, const char *const *paths, int n, double max_seconds,
                       h3_ref_set *out);
void h3_refs_free(h3_ref_set *s);
/* Rule 1 for a clip of `frames` frames (17n+5), with the encoder's hop for the sounds' latents (800 at 32 kHz):
 * fills each reference's normalized media and block. A video shorter than H3_REF_MIN_FRAMES at 24 fps, an image
 * outside 1:4..4:1, a silent sound: H3_ERR_INVALID naming the file. */
h3_status h3_refs_normalize(h3_ref_set *s, int64_t frames, int image_short, int video_short, int64_t hop);
/* The blocks, in order, into blocks[s->n]. */
void h3_refs_blocks(const h3_ref_set *s, h3_ref_block *blocks);

/* Rule 2: ids/tags [n] (h3_malloc'd) of the presentation before prompt_ids, the processor's pixel_values (f32
 * host tensor) and grids [*n_img][3] (h3_malloc'd) of every vision block in order (images and video frame pairs). */
h3_status h3_refs_present(const h3_tokenizer *tok, const h3_vis_config *vc, const h3_ref_set *s,
                          const int32_t *prompt_ids, int64_t n_prompt, int32_t **ids, uint8_t **tags, int64_t *n,
                          h3_tensor *pixels, int64_t (**grid)[3], int *n_img);

/* Rule 3, the sounds: arows [Σ audio rows · 32] (h3_malloc'd; the sounds' normalized latents, channel-major, in
 * order) with the audio encoder ae (at its placement; NULL when there are no sounds) and the audio VAE's config av
 * for the normalization. on_done after each sound. */
h3_status h3_refs_encode_sounds(h3_exec *ex, h3_audio_enc *ae, const struct h3_audio_vae_config *av,
                                const h3_ref_set *s, float **arows,
                                h3_status (*on_done)(void *user, int done, int total), void *user);
/* Rule 3, the images and videos: vrows [Σ video rows · 96] (h3_malloc'd; the noised rows, in order) with the video
 * encoder ve where it was placed (NULL when there are none). clean (may be NULL): the conditioning latents before
 * the mix, [h3_refs_latent_values] in order (h3_malloc'd). on_done after each. */
h3_status h3_refs_encode_visuals(h3_exec *ex, h3_video_enc *ve, const h3_ref_set *s, uint64_t seed, float **vrows,
                                 float **clean, h3_status (*on_done)(void *user, int done, int total), void *user);
/* Values of the image and video references' latents, all of them (the noise they take from stream
 * H3_RNG_STREAM_REFERENCE, in order): Σ 24 · lt · lh · lw. */
int64_t h3_refs_latent_values(const h3_ref_set *s);

#endif
