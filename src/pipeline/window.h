/* Long clips: a clip longer than one window is sampled as overlapping windows of the latent sequence, every one
 * denoised at every step (co-denoising, as ComfyUI's context windows and Gen-L-Video do), their velocities
 * averaged where they overlap with linear ramps, so the sampler integrates one long latent sequence that the
 * VAEs decode as one clip: no seam to hide, no frame decoded twice.
 *
 * Windows are whole 17-frame chunks of the clip: a window is a clip of its own (17w+5 frames, 5w+2 latent
 * frames) whose first latent frame falls on a chunk's one-frame latent (the video VAE's latents repeat with a
 * period of 5: one latent of one frame, four of four frames, H3-FACTS 1.3), so its rotary positions are a
 * plain clip's. Window k starts at chunk u_k (latent frame 5·u_k, pixel frame 17·u_k); its audio starts at
 * audio latent round(17·u_k·40/24), clamped so that the last window ends with the clip's audio (the audio
 * window is the window's own audio length, h3_audio_latents(window frames)). The starts are spread evenly
 * from 0 to the end, the fewest windows whose neighbours overlap by at least `overlap` frames.
 *
 * The fuse weight of a window's latent frame (and of its audio latent) is 1 outside its overlaps and a linear
 * ramp inside them, (j + 0.5)/o from its left edge and (T − j − 0.5)/o towards its right edge (o: that
 * overlap's length in latents); a latent's velocity is the weighted mean over the windows that hold it. Two
 * neighbours' ramps sum to 1 over their overlap: a linear crossfade of their predictions.
 */
#ifndef H3_PIPELINE_WINDOW_H
#define H3_PIPELINE_WINDOW_H

#include <stdint.h>

#include "base/status.h"

#define H3_MAX_PROMPTS        64  /* prompts of one long clip */
#define H3_WINDOW_AUTO_FRAMES 345 /* the window of a clip over H3_TRAINED_MAX_FRAMES: the longest trained 17n+5 */

typedef struct h3_windows {
    int n;                     /* windows (1: the whole clip is one) */
    int64_t frames, window;    /* the clip's frames and a window's (17n+5 each) */
    int64_t overlap;           /* the least overlap asked for, in frames (a multiple of 17) */
    int64_t latent_t, audio_t; /* the clip's latent frames and audio latents per channel */
    int64_t win_t, win_audio_t; /* a window's */
    int64_t *v_start;          /* [n] first latent frame of each window */
    int64_t *a_start;          /* [n] first audio latent (per channel) */
    int64_t *f_start;          /* [n] first pixel frame */
} h3_windows;

/* The windows of a clip of `frames` frames (17n+5) with windows of `window` frames (17w+5, at least 22) and
 * an overlap of at least `overlap` frames (a multiple of 17, at least 17, at most window − 22). A window at
 * least as long as the clip gives one window (overlap unchecked). H3_ERR_INVALID names a bad value and the
 * nearest good ones. Free with h3_windows_free. */
h3_status h3_windows_make(int64_t frames, int64_t window, int64_t overlap, h3_windows *out);
void h3_windows_free(h3_windows *w);
/* A request's window and overlap (0: not given) for a clip of `frames` frames, resolved: the default window
 * (H3_WINDOW_AUTO_FRAMES over H3_TRAINED_MAX_FRAMES, else the clip), the default overlap, and for a clip of one
 * window window = frames and overlap 0; H3_ERR_INVALID naming a bad value (h3_windows_make's checks). */
h3_status h3_windows_resolve(int64_t frames, int64_t *window, int64_t *overlap);
/* A window's own form: 17n+5 frames, at least 22 (H3_ERR_INVALID naming the nearest). */
h3_status h3_windows_check_window(int64_t window);
/* The default overlap of a window: about a quarter of it, in whole chunks (17 frames), at least one. */
int64_t h3_windows_default_overlap(int64_t window);
/* The prompt of each window (prompt_of [w->n]): of n prompts starting at start_s[0] = 0 < start_s[1] < ...
 * seconds, the last one that starts at or before the middle of the window's overlap with the window before
 * (the first window: prompt 0). */
void h3_windows_prompts(const h3_windows *w, const double *start_s, int n, int *prompt_of);
/* The fuse weight of local latent j of window k (audio: of its audio latent j), > 0. */
float h3_window_weight(const h3_windows *w, int k, int64_t j, int audio);

#endif
