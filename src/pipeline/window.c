#include "pipeline/window.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "pipeline/geometry.h"
#include "pipeline/request.h"

int64_t h3_windows_default_overlap(int64_t window) {
    const int64_t w = (window - H3_FRAMES_FIRST) / H3_FRAMES_CHUNK; /* chunks of the window */
    int64_t k = (w + 2) / 4;                                         /* about a quarter, rounded */
    if (k < 1) k = 1;
    if (k > w - 1) k = w - 1;
    return k * H3_FRAMES_CHUNK;
}

void h3_windows_free(h3_windows *w) {
    if (!w) return;
    h3_free(w->v_start);
    h3_free(w->a_start);
    h3_free(w->f_start);
    memset(w, 0, sizeof *w);
}

h3_status h3_windows_check_window(int64_t window) {
    if (h3_frames_valid(window) && window >= H3_FRAMES_CHUNK + H3_FRAMES_FIRST) return H3_OK;
    int64_t lo, hi;
    h3_frames_nearest(window, &lo, &hi);
    if (lo < H3_FRAMES_CHUNK + H3_FRAMES_FIRST) {
        lo = H3_FRAMES_CHUNK + H3_FRAMES_FIRST;
        hi = lo + H3_FRAMES_CHUNK;
    }
    return H3_ERR(H3_ERR_INVALID,
                  "--window must be a frame count of the form 17n+5, at least 22; got %" PRId64 ": use %" PRId64
                  " or %" PRId64,
                  window, lo, hi);
}

h3_status h3_windows_resolve(int64_t frames, int64_t *window, int64_t *overlap) {
    if (*window < 0 || *overlap < 0)
        return H3_ERR(H3_ERR_INVALID, "--window and --overlap are frame counts; got %" PRId64 " and %" PRId64,
                      *window, *overlap);
    if (*window == 0) *window = frames > H3_TRAINED_MAX_FRAMES ? H3_WINDOW_AUTO_FRAMES : frames;
    if (*window >= frames) {
        if (*window > frames) H3_TRY(h3_windows_check_window(*window)); /* a window given must be one */
        *window = frames;
        *overlap = 0;
        return H3_OK;
    }
    if (*overlap == 0) *overlap = h3_windows_default_overlap(*window);
    h3_windows w; /* its checks */
    H3_TRY(h3_windows_make(frames, *window, *overlap, &w));
    h3_windows_free(&w);
    return H3_OK;
}

h3_status h3_windows_make(int64_t frames, int64_t window, int64_t overlap, h3_windows *out) {
    memset(out, 0, sizeof *out);
    if (!h3_frames_valid(frames)) return H3_ERR(H3_ERR_INVALID, "windows: frames %" PRId64 " is not 17n+5", frames);
    if (window < frames) H3_TRY(h3_windows_check_window(window));
    const int64_t n_all = (frames - H3_FRAMES_FIRST) / H3_FRAMES_CHUNK; /* the clip's chunks */
    const int64_t w = (window - H3_FRAMES_FIRST) / H3_FRAMES_CHUNK;     /* a window's */
    const int64_t span = window >= frames ? 0 : n_all - w;              /* chunks from the first start to the last */
    out->frames = frames;
    out->latent_t = h3_video_latent_frames(frames);
    out->audio_t = h3_audio_latents(frames);
    if (window >= frames) { /* one window: the clip itself */
        out->n = 1;
        out->window = frames;
        out->win_t = out->latent_t;
        out->win_audio_t = out->audio_t;
    } else {
        if (overlap <= 0 || overlap % H3_FRAMES_CHUNK || overlap > window - (H3_FRAMES_CHUNK + H3_FRAMES_FIRST)) {
            int64_t k = (overlap + H3_FRAMES_CHUNK / 2) / H3_FRAMES_CHUNK;
            if (k < 1) k = 1;
            if (k > w - 1) k = w - 1;
            return H3_ERR(H3_ERR_INVALID,
                          "--overlap must be whole 17-frame chunks, from 17 to the window less 22 (%" PRId64
                          " with --window %" PRId64 "); got %" PRId64 ": use %" PRId64,
                          window - (H3_FRAMES_CHUNK + H3_FRAMES_FIRST), window, overlap, k * H3_FRAMES_CHUNK);
        }
        const int64_t step = w - overlap / H3_FRAMES_CHUNK; /* the most chunks between starts, >= 1 */
        const int64_t n = 1 + (span + step - 1) / step;
        if (n > 100000) return H3_ERR(H3_ERR_INVALID, "windows: %" PRId64 " windows", n);
        out->n = (int)n;
        out->window = window;
        out->overlap = overlap;
        out->win_t = h3_video_latent_frames(window);
        out->win_audio_t = h3_audio_latents(window);
    }
    const size_t nb = (size_t)out->n * sizeof(int64_t);
    out->v_start = h3_malloc(nb, H3_MEM_OTHER);
    out->a_start = h3_malloc(nb, H3_MEM_OTHER);
    out->f_start = h3_malloc(nb, H3_MEM_OTHER);
    if (!out->v_start || !out->a_start || !out->f_start) {
        h3_windows_free(out);
        return H3_ERR(H3_ERR_NOMEM, "out of memory");
    }
    for (int k = 0; k < out->n; k++) {
        /* evenly spread chunk starts: the gaps differ by at most one chunk and none exceeds the step */
        const int64_t u = out->n == 1 ? 0 : ((int64_t)k * span + (out->n - 1) / 2) / (out->n - 1);
        out->v_start[k] = h3_video_latent_frames(H3_FRAMES_CHUNK * u + H3_FRAMES_FIRST) - 2; /* 5 latents a chunk */
        out->f_start[k] = H3_FRAMES_CHUNK * u;
        int64_t a = (int64_t)llround((double)out->f_start[k] * H3_AUDIO_RATE / H3_AUDIO_HOP / H3_FPS);
        if (a > out->audio_t - out->win_audio_t || k == out->n - 1) a = out->audio_t - out->win_audio_t; /* the last
                                                                                  * ends with the clip's audio */
        if (a < 0) a = 0;
        out->a_start[k] = a;
    }
    return H3_OK;
}

float h3_window_weight(const h3_windows *w, int k, int64_t j, int audio) {
    const int64_t *s = audio ? w->a_start : w->v_start;
    const int64_t T = audio ? w->win_audio_t : w->win_t;
    double x = 1.0;
    if (k > 0) { /* the overlap with the window before */
        const int64_t o = s[k - 1] + T - s[k];
        if (o > 0 && j < o) x = fmin(x, ((double)j + 0.5) / (double)o);
    }
    if (k + 1 < w->n) { /* with the window after */
        const int64_t o = s[k] + T - s[k + 1];
        if (o > 0 && j >= T - o) x = fmin(x, ((double)(T - j) - 0.5) / (double)o);
    }
    return (float)x;
}

void h3_windows_prompts(const h3_windows *w, const double *start_s, int n, int *prompt_of) {
    for (int k = 0; k < w->n; k++) {
        /* the middle of the overlap with the window before, in seconds */
        const double t = k ? 0.5 * (double)(w->f_start[k] + w->f_start[k - 1] + w->window) / H3_FPS : 0.0;
        int p = 0;
        for (int i = 1; i < n; i++)
            if (start_s[i] <= t) p = i;
        prompt_of[k] = p;
    }
}
