#include "pipeline/geometry.h"

#include <math.h>
#include <string.h>

int h3_frames_valid(int64_t frames) {
    return frames >= H3_FRAMES_FIRST && (frames - H3_FRAMES_FIRST) % H3_FRAMES_CHUNK == 0;
}

void h3_frames_nearest(int64_t frames, int64_t *lo, int64_t *hi) {
    const int64_t below = frames <= H3_FRAMES_FIRST ? H3_FRAMES_FIRST
                                                    : H3_FRAMES_FIRST + (frames - H3_FRAMES_FIRST) /
                                                                            H3_FRAMES_CHUNK * H3_FRAMES_CHUNK;
    *lo = below;
    *hi = below + H3_FRAMES_CHUNK;
}

int64_t h3_frames_round_up(int64_t frames) {
    if (frames <= H3_FRAMES_FIRST) return H3_FRAMES_FIRST;
    int64_t lo, hi;
    h3_frames_nearest(frames, &lo, &hi);
    return lo == frames ? lo : hi;
}

int64_t h3_video_latent_frames(int64_t frames) {
    if (!h3_frames_valid(frames)) return -1;
    return (frames - H3_FRAMES_FIRST) / H3_FRAMES_CHUNK * 5 + 2;
}

int64_t h3_audio_latents(int64_t frames) {
    if (frames <= 0) return 0;
    return (int64_t)nearbyint((double)frames / H3_FPS * ((double)H3_AUDIO_RATE / H3_AUDIO_HOP));
}

int64_t h3_audio_samples(int64_t frames) {
    if (frames <= 0) return 0;
    return (int64_t)llround((double)frames * (double)H3_AUDIO_RATE / (double)H3_FPS);
}

int h3_canvas_valid(int64_t width, int64_t height) {
    return width >= H3_CANVAS_MULTIPLE && height >= H3_CANVAS_MULTIPLE && width % H3_CANVAS_MULTIPLE == 0 &&
           height % H3_CANVAS_MULTIPLE == 0 && width <= 65536 && height <= 65536;
}

int h3_geometry_of(int64_t text_len, int64_t frames, int64_t width, int64_t height, h3_geometry *g) {
    memset(g, 0, sizeof *g);
    const int64_t lt = h3_video_latent_frames(frames);
    if (lt < 0 || text_len < 0 || !h3_canvas_valid(width, height)) return -1;
    g->frames = frames;
    g->width = width;
    g->height = height;
    g->text_len = text_len;
    g->latent_t = lt;
    g->latent_h = height / H3_VAE_SPATIAL;
    g->latent_w = width / H3_VAE_SPATIAL;
    g->audio_t = h3_audio_latents(frames);
    g->audio_samples = h3_audio_samples(frames);
    g->n_video_rows = lt * (g->latent_h / 2) * (g->latent_w / 2);
    g->n_audio_rows = 2 * g->audio_t;
    g->seq_len = text_len + g->n_audio_rows + g->n_video_rows;
    return 0;
}
