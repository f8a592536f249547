/* H3's geometry, in one place: how a request's frames and canvas turn into latent frames, latent canvases,
 * audio latents and audio samples, and the packed-sequence row counts the DiT runs on. Every other part (the
 * request's checks, the planner, the stages, generate, media, the packed layout in pipeline/layout.h) asks
 * here instead of re-deriving a rule. The video VAE's tiles and temporal chunks depend on its config and are
 * its own (h3_video_vae_plan in models/video_vae.h); its frames-per-latent rule agrees with
 * h3_video_latent_frames for every count this module accepts (test_layout checks both directions).
 *
 * The rules (H3-FACTS 1.3 and 3):
 *   frames      17n+5 (n >= 0); the video VAE encodes 17-frame chunks into 5 latent frames plus 2 of
 * look-ahead latent T    5n+2 canvas      width and height multiples of 32 (16x VAE downsampling, then 2x2
 * DiT patches) latent HxW  height/16 x width/16; video rows T * (H/2) * (W/2) audio       40 latents per
 * second per channel (800 samples of 32 kHz each), round(frames/24*40), half to even; the clip's samples
 * round(frames * 32000 / 24): the decoded audio is cut to the video's length rows        text + 2 * audio
 * latents + video rows
 */
#ifndef H3_PIPELINE_GEOMETRY_H
#define H3_PIPELINE_GEOMETRY_H

#include <stdint.h>

#define H3_LATENT_CHANNELS       24 /* video latent channels */
#define H3_AUDIO_LATENT_CHANNELS 32 /* audio latent channels per row */
#define H3_VIDEO_ROW_DIM         96 /* 24 channels x (1 x 2 x 2) patch */
#define H3_VAE_SPATIAL           16
#define H3_CANVAS_MULTIPLE       32 /* VAE x16, then the DiT's 2x2 patches */
#define H3_FPS                   24
#define H3_AUDIO_RATE            32000
#define H3_AUDIO_HOP             800 /* samples per audio latent: 40 latents per second */
#define H3_FRAMES_CHUNK          17  /* frames per video VAE chunk */
#define H3_FRAMES_FIRST          5   /* the smallest frame count */

/* 1 when frames is 17n+5, n >= 0. */
int h3_frames_valid(int64_t frames);
/* The valid counts around frames: *lo the largest <= frames (5 when frames < 5), *hi the next one above *lo.
 */
void h3_frames_nearest(int64_t frames, int64_t *lo, int64_t *hi);
/* The valid count nearest to frames, rounded up (a length in seconds becomes frames so). */
int64_t h3_frames_round_up(int64_t frames);
/* 5n+2 latent frames for 17n+5 frames; -1 when frames is not of that form. */
int64_t h3_video_latent_frames(int64_t frames);
/* Audio latents per channel for a clip of `frames` frames at 24 fps: round(frames/24*40), half to even. */
int64_t h3_audio_latents(int64_t frames);
/* Audio samples per channel of the finished clip: round(frames * 32000 / 24); 0 for frames <= 0. */
int64_t h3_audio_samples(int64_t frames);
/* 1 when width and height are usable canvas sides: multiples of 32 from 32 to 65536. */
int h3_canvas_valid(int64_t width, int64_t height);

/* The sizes of one request, all from the rules above (no tables): what sizing needs before anything is
 * allocated. Returns 0 and fills g, or -1 when frames or the canvas is not valid (g zeroed). */
typedef struct h3_geometry {
    int64_t frames, width, height, text_len;
    int64_t latent_t, latent_h, latent_w; /* video latent [24, latent_t, latent_h, latent_w] */
    int64_t audio_t;                      /* audio latents per channel: audio latent [2, 32, audio_t] */
    int64_t audio_samples;                /* samples per channel of the clip */
    int64_t n_video_rows, n_audio_rows;   /* latent_t*(latent_h/2)*(latent_w/2), 2*audio_t */
    int64_t seq_len;                      /* text_len + n_audio_rows + n_video_rows */
} h3_geometry;
int h3_geometry_of(int64_t text_len, int64_t frames, int64_t width, int64_t height, h3_geometry *g);

#endif
