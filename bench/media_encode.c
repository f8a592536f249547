/* The MP4 writer fed as generate feeds it: the audio first, then the frames chunk by chunk from a producer
 * that stands for the video VAE on the GPU (a sleep per chunk), then the finish (generate's mux stage).
 *
 *     bench_media_encode [--frames 124] [--size 960x544] [--chunks 7] [--gpu-ms 370] [--preset medium]
 *                        [--crf 18] [--noise 0.02] [--out PATH]
 *
 * The defaults are the e2e workload (W124: 124 frames at 960x544, the VAE's 7 temporal chunks, ~2.6 s of GPU
 * decode in all) and generate's encoder settings. The frames are smooth coloured gradients that move and
 * turn, with a fine texture and per-pixel noise of the given amplitude (noise costs the encoder most); the
 * sound is a 5.2 s stereo tone pair. Each chunk's frames are made before its sleep, which the making's time
 * is taken off.
 *
 * Prints: the open and the audio; the time the producer spent inside h3_mp4_write_frame (what the decode loop
 * waits for between chunks), per chunk and in all; the finish (x264's flush, the AAC, the trailer); the wall
 * time from open to finish against the producer's own time (chunks x gpu-ms): what the encoder adds to the
 * video stage. The file's size and bit rate last.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/log.h"
#include "pipeline/geometry.h"
#include "pipeline/media.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

#define DIE(...)                                                                                             \
    do {                                                                                                     \
        fprintf(stderr, "bench_media_encode: " __VA_ARGS__);                                                 \
        fputc('\n', stderr);                                                                                 \
        exit(1);                                                                                             \
    } while (0)

/* The scene: three planes of (w + 2 frames) x h, smooth gradients with a fine texture; frame t is the window
 * at x = 2t (a pan), plus per-pixel noise. */
static float *make_scene(int frames, int w, int h) {
    const int sw = w + 2 * frames;
    float *s = malloc((size_t)3 * sw * h * sizeof(float));
    if (!s) return NULL;
    for (int c = 0; c < 3; c++)
        for (int y = 0; y < h; y++)
            for (int x = 0; x < sw; x++)
                s[((size_t)c * h + y) * sw + x] =
                    0.5f + 0.35f * sinf(0.011f * (float)x + 0.007f * (float)y + 1.7f * (float)c) +
                    0.08f * sinf(0.31f * (float)x + 0.23f * (float)y);
    return s;
}

/* Frame t of the clip into planes of a [3, n, H, W] chunk at index k. */
static void make_frame(const float *scene, int frames, float *chunk, int64_t n, int k, int t, int w, int h,
                       float noise, uint32_t *seed) {
    const int sw = w + 2 * frames;
    const int64_t plane = (int64_t)n * h * w;
    for (int c = 0; c < 3; c++) {
        float *p = chunk + c * plane + (int64_t)k * h * w;
        for (int y = 0; y < h; y++) {
            const float *row = scene + ((size_t)c * h + y) * sw + 2 * t;
            for (int x = 0; x < w; x++) {
                *seed = *seed * 1664525u + 1013904223u;
                p[(int64_t)y * w + x] = row[x] + noise * ((float)(*seed >> 8) / 16777216.0f - 0.5f);
            }
        }
    }
}

int main(int argc, char **argv) {
    int frames = 124, w = 960, h = 544, chunks = 7, crf = 18;
    double gpu_ms = 370;
    float noise = 0.02f;
    const char *preset = "medium";
    char out[1024] = "";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) DIE("%s needs a value", a);
        if (!strcmp(a, "--frames"))
            frames = atoi(v);
        else if (!strcmp(a, "--size")) {
            if (sscanf(v, "%dx%d", &w, &h) != 2) DIE("--size WxH");
        } else if (!strcmp(a, "--chunks"))
            chunks = atoi(v);
        else if (!strcmp(a, "--gpu-ms"))
            gpu_ms = atof(v);
        else if (!strcmp(a, "--preset"))
            preset = v;
        else if (!strcmp(a, "--crf"))
            crf = atoi(v);
        else if (!strcmp(a, "--noise"))
            noise = (float)atof(v);
        else if (!strcmp(a, "--out"))
            snprintf(out, sizeof out, "%s", v);
        else
            DIE("usage: bench_media_encode [--frames N] [--size WxH] [--chunks N] [--gpu-ms MS] [--preset P] "
                "[--crf N] [--noise A] [--out PATH]");
        i++;
    }
    if (frames < 1 || frames > 10000 || chunks < 1 || chunks > frames || w < 16 || h < 16 || w > 4096 ||
        h > 4096 || gpu_ms < 0)
        DIE("bad arguments");
    if (!*out) {
        const char *tmp = getenv("TMPDIR");
        snprintf(out, sizeof out, "%s/h3_media_encode.mp4", tmp && *tmp ? tmp : "/tmp");
    }
    unlink(out);

    h3_mp4_opts o;
    h3_mp4_opts_default(&o, w, h);
    o.preset = preset;
    o.crf = crf;
    const int64_t ns = h3_audio_samples(frames); /* o.fps and o.sample_rate are H3's 24 and 32000 */
    float *left = malloc((size_t)ns * sizeof(float)), *right = malloc((size_t)ns * sizeof(float));
    const int per = (frames + chunks - 1) / chunks;
    float *chunk = malloc((size_t)3 * per * h * w * sizeof(float)), *scene = make_scene(frames, w, h);
    if (!left || !right || !chunk || !scene) DIE("out of memory");
    for (int64_t i = 0; i < ns; i++) {
        left[i] = (float)(0.4 * sin(2 * M_PI * 440.0 * (double)i / o.sample_rate));
        right[i] = (float)(0.4 * sin(2 * M_PI * 660.0 * (double)i / o.sample_rate));
    }

    h3_mp4 *m = NULL;
    const double t0 = now();
    if (h3_mp4_open(out, &o, &m) != H3_OK) DIE("%s", h3_last_error());
    const double t_open = now();
    if (h3_mp4_write_audio(m, left, right, ns) != H3_OK) DIE("%s", h3_last_error());
    const double t_audio = now();
    printf("%d frames at %dx%d in %d chunks, %.0f ms of GPU per chunk, preset %s, crf %d, noise %.3f\n",
           frames, w, h, chunks, gpu_ms, preset, crf, noise);
    printf("open %.3f s, audio (%.2f s of stereo) %.3f s\n", t_open - t0, (double)ns / o.sample_rate,
           t_audio - t_open);
    double in_write = 0, producer = 0;
    uint32_t seed = 1;
    printf("chunk  frames  in write_frame\n");
    for (int c = 0, t = 0; c < chunks && t < frames; c++) {
        const int n = frames - t < per ? frames - t : per;
        const double g0 = now();
        for (int k = 0; k < n; k++) make_frame(scene, frames, chunk, n, k, t + k, w, h, noise, &seed);
        sleep_s(gpu_ms / 1e3 - (now() - g0));
        producer += now() - g0;
        const double w0 = now();
        for (int k = 0; k < n; k++)
            if (h3_mp4_write_frame(m, chunk + (int64_t)k * h * w, (int64_t)n * h * w, w) != H3_OK)
                DIE("%s", h3_last_error());
        const double dw = now() - w0;
        in_write += dw;
        printf("%5d  %6d  %9.3f s\n", c, n, dw);
        t += n;
    }
    const double f0 = now();
    if (h3_mp4_finish(m) != H3_OK) DIE("%s", h3_last_error());
    const double t_end = now();
    struct stat sb;
    stat(out, &sb);
    printf("in write_frame, all chunks   %.3f s\n", in_write);
    printf("finish (flush, trailer)      %.3f s\n", t_end - f0);
    printf("video stage: producer alone  %.3f s; with the encoder %.3f s (+%.3f s); open to finish %.3f s\n",
           producer, producer + in_write + (t_end - f0), in_write + (t_end - f0), t_end - t0);
    printf("file: %.2f MB, %.0f kb/s\n", sb.st_size / 1e6, sb.st_size * 8.0 / 1e3 / (frames / (double)o.fps));
    free(left);
    free(right);
    free(chunk);
    free(scene);
    return 0;
}
