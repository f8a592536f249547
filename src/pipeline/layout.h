/* The packed sequence of a t2va or fl2va request: one row per text token, per 2x2 patch of each keyframe's
 * latent, per audio latent of each stereo channel and per 2x2 patch of each video latent frame, in the order
 *
 *     [ text (L) | keyframe conditions (K * H/2 * W/2) | audio left (T_a) | audio right (T_a) | video ]
 *
 * with, for every row, its modality tag (0 video, 1 text, 2 audio; they index the DiT's AdaLN table), its (t, h, w)
 * rotary position in float64, and per step the index of its timestep among the step's distinct timesteps.
 * Positions (H3-FACTS 1.3; diffusers MiniMaxH3PrepareLayoutStep.build_packed_sequence):
 *   text k:            (k, 0, 0)
 *   audio channel c, latent k:  (L + k, 0, c == 0 ? w_grid[0] : w_grid[W/2 - 1])
 *   video frame f, patch (i, j): (L + sum_{g<f} span(g), h_grid[i], w_grid[j]), span(g) = 5/3 * (1,4,4,4,4)[g % 5]
 *   axis grid of a latent dimension D (H or W) of the H x W latent: ratio = D / sqrt(H*W),
 *       grid[i] = (left + i * ((left + ratio) - left) / (D/2)) * 32, left = (1 - ratio)/2   (numpy linspace,
 *       endpoint excluded), i = 0 .. D/2 - 1.
 *   keyframe k at frame f (fl2va: K keyframes, each one latent frame at the target's canvas; diffusers'
 *       build_packed_sequence with ComfyUI's any-frame guides), patch (i, j):
 *       f = 0 ("first"):            (L, h_grid[i], w_grid[j])
 *       f = frames - 1 ("last"):    ((L + S) - 5/3, ...), S = numpy's pairwise sum of the T spans
 *       any other f:                (L + (5/3) * f, ...)
 * The keyframe rows are video rows (tag 0); they come before the target's video rows in the DiT's video rows
 * (diffusers' video_indices) and are held at t = max(t_video, 0.999) in every call.
 * Sizes (frames, latent frames, canvas, audio latents, row counts) come from pipeline/geometry.h.
 */
#ifndef H3_PIPELINE_LAYOUT_H
#define H3_PIPELINE_LAYOUT_H

#include <stdint.h>

#include "base/status.h"
#include "pipeline/geometry.h"

enum { H3_TAG_VIDEO = 0, H3_TAG_TEXT = 1, H3_TAG_AUDIO = 2 };

#define H3_MAX_KEYFRAMES 16 /* keyframes of one request */

typedef struct h3_seq_layout {
    int64_t text_len, frames, width, height;
    int64_t latent_t, latent_h, latent_w; /* video latent [24, latent_t, latent_h, latent_w] */
    int64_t audio_t;                      /* audio latents per channel: audio latent [2, 32, audio_t] */
    int64_t n_video_rows, n_audio_rows;   /* latent_t*(latent_h/2)*(latent_w/2), 2*audio_t */
    int64_t n_keyframes, n_cond_rows;     /* fl2va: K keyframes, K*(latent_h/2)*(latent_w/2) rows */
    int64_t seq_len;                      /* text_len + n_cond_rows + n_audio_rows + n_video_rows */
    int64_t cond_start, audio_start, video_start; /* first keyframe row, first audio row, first video row */
    uint8_t *tags;                        /* [seq_len] modality tag of every row */
    double *pos;                          /* [seq_len, 3] (t, h, w) rotary position of every row */
    int64_t *video_indices;               /* [n_video_rows] sequence rows of the video rows, in order */
    int64_t *cond_indices;                /* [n_cond_rows] sequence rows of the keyframe rows, in order */
    int64_t *audio_indices; /* [n_audio_rows] sequence rows of the audio rows (left then right) */
    int64_t *text_indices;  /* [text_len] */
    /* ref2va (h3_seq_layout_ref2va): the references' audio rows (clean, t = 1 in every call), in packed order;
     * their video rows are the conditioning rows above (n_cond_rows, cond_indices; n_keyframes 0) */
    int64_t n_ref_audio_rows;
    int64_t *ref_audio_indices; /* [n_ref_audio_rows] */
} h3_seq_layout;

/* Builds the layout of a t2va request. text_tags may be NULL (every text row tagged text) or give the tag of
 * each of the text_len rows. frames must be 17n+5 and width, height positive multiples of 32 (h3_request
 * checks the request with friendlier messages first). Free with h3_seq_layout_free. */
h3_status h3_seq_layout_t2va(int64_t text_len, const uint8_t *text_tags, int64_t frames, int64_t width,
                             int64_t height, h3_seq_layout *out);
void h3_seq_layout_free(h3_seq_layout *l);
/* The layout of a fl2va request: n_keyframes keyframes, keyframe k at pixel frame kf_frames[k] (0 ..
 * frames - 1; 0 is diffusers' "first" anchor, frames - 1 its "last"), in packed order. n_keyframes 0 is
 * h3_seq_layout_t2va. A frame outside the clip is H3_ERR_INVALID. */
h3_status h3_seq_layout_fl2va(int64_t text_len, const uint8_t *text_tags, int64_t frames, int64_t width,
                              int64_t height, int n_keyframes, const int64_t *kf_frames, h3_seq_layout *out);
/* ref2va (diffusers' MiniMaxH3Ref2VAPrepareLayoutStep.build_ref2va_packed_sequence): the packed sequence
 *
 *     [ text (L) | reference blocks, in request order | target audio (2 T_a) | target video ]
 *
 * A reference block is an image (lt = 1 latent frame of lh x lw: its patches), an audio clip (audio_t latents a
 * channel, channel-major) or a video (its soundtrack's audio rows, when audio_t > 0, then its lt frames of lh x
 * lw). A shared rotary clock starts at L and every block advances it: an image by 1 (its rows at t = clock on
 * its own (h, w) grid), an audio clip by audio_t (its rows as the target's audio, w pinned to the ends of the
 * *target's* width grid), a video by max(audio_t, sum of its frames' spans) (the spans summed one by one, its
 * frames at clock + the exclusive running sum, its soundtrack pinned to the ends of the video's own width grid).
 * The target's audio and video start where the blocks leave the clock. The references' video rows are the
 * conditioning rows (held at max(t_video, 0.999)); their audio rows are held clean (t = 1). */
typedef enum { H3_REF_IMAGE = 0, H3_REF_VIDEO, H3_REF_AUDIO } h3_ref_kind;
typedef struct h3_ref_block {
    h3_ref_kind kind;
    int64_t lt, lh, lw; /* the video latent of an image (lt 1) or a video; even lh, lw */
    int64_t audio_t;    /* audio latents a channel: an audio clip's, a video's soundtrack's (0: none) */
} h3_ref_block;
#define H3_MAX_REFS 12
h3_status h3_seq_layout_ref2va(int64_t text_len, const uint8_t *text_tags, int64_t frames, int64_t width,
                               int64_t height, int n_refs, const h3_ref_block *refs, h3_seq_layout *out);
/* The rows the blocks add: video (conditioning) and audio rows. */
void h3_ref_blocks_rows(int n_refs, const h3_ref_block *refs, int64_t *video_rows, int64_t *audio_rows);

/* The counts of that layout (text_len .. seq_len, cond_start, audio_start, video_start) without its tables
 * (left NULL): what sizing a request needs before anything is allocated. The same checks as the builders. */
h3_status h3_seq_layout_sizes(int64_t text_len, int n_keyframes, int64_t frames, int64_t width,
                              int64_t height, h3_seq_layout *out);
/* The rotary time of a keyframe at pixel frame f of a frames-long clip after text_len text rows (the rule
 * above). */
double h3_keyframe_time(int64_t text_len, int64_t frames, int64_t f);
/* The keyframes' conditioning timestep for a call at t_video: max(t_video, 0.999) in float32, diffusers'
 * keyframe_noise_aug. */
#define H3_KEYFRAME_T 0.999f

/* The distinct timesteps of one step and each row's index into them (diffusers: torch.unique(sorted=True,
 * return_inverse=True) over the row timesteps; text rows carry t_video, keyframe and reference video rows
 * max(t_video, H3_KEYFRAME_T), reference audio rows 1). Writes 1 to 4 values to unique_t (ascending) and
 * returns how many; index has seq_len entries. */
int h3_seq_layout_timestep_indices(const h3_seq_layout *l, float t_video, float t_audio, float unique_t[4],
                                   int32_t *index);

/* Video latent [24, T, H, W] <-> rows [T*(H/2)*(W/2), 96]: row (t, i, j) frame-major then row-major, column
 * c*4 + dy*2 + dx holds latent[c, t, 2i+dy, 2j+dx] (diffusers patchify_video_latents with patch (1, 2, 2)).
 */
void h3_video_patchify(const float *latent, int64_t T, int64_t H, int64_t W, float *rows);
void h3_video_unpatchify(const float *rows, int64_t T, int64_t H, int64_t W, float *latent);
/* The refine pass's latent upscale: video latent [C, T, H, W] -> [C, T, H2, W2], each frame on its own
 * (the frame count unchanged), bilinear with half-pixel centres: source position (j + 0.5)*H/H2 - 0.5,
 * clamped at 0 and at the last row and column. This is torch.nn.functional.interpolate(mode="bilinear",
 * align_corners=False), what ComfyUI's LatentUpscale / LatentUpscaleBy "bilinear" do to a video latent
 * (comfy.utils.common_upscale moves the frames into the batch and scales each in 2-D). Any H2 >= 1, W2 >= 1;
 * H3_ERR_NOMEM when its index tables cannot be allocated. */
h3_status h3_video_latent_upscale(const float *src, int64_t C, int64_t T, int64_t H, int64_t W, int64_t H2,
                                  int64_t W2, float *dst);
/* Audio latent [2, 32, T_a] <-> rows [2*T_a, 32]: row ch*T_a + k holds latent[ch, :, k]. */
void h3_audio_pack(const float *latent, int64_t T_a, float *rows);
void h3_audio_unpack(const float *rows, int64_t T_a, float *latent);

#endif
