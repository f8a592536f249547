/* Media output (src/pipeline/media): a synthetic clip (moving gradient + a stereo tone) written frame by
 * frame is checked with ffprobe (H.264, yuv420p, 24 fps, frame count, size, AAC 32 kHz stereo, durations) and
 * decoded back with ffmpeg (pixels and tones survive, written from a buffer overwritten after each call); PNG
 * and WAV round trips; every way of failing midway, on the caller's thread or the encoder's, leaves neither
 * the file nor its
 * ".partial"; the frame queue stays within its bound. Needs ffmpeg's ffprobe and ffmpeg on the PATH
 * (scripts/deps.sh installs them). */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/json.h"
#include "pipeline/geometry.h"
#include "pipeline/media.h"
#include "testutil.h"

enum { W = 192, H = 128, F = 22, RATE = 32000 };

static int exists(const char *p) {
    return access(p, F_OK) == 0;
}

static int have_tool(const char *name) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", name);
    return system(cmd) == 0;
}

/* Reads a command's whole stdout. */
static unsigned char *run_read(const char *cmd, size_t *len) {
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    size_t cap = 1 << 16, n = 0;
    unsigned char *buf = malloc(cap);
    for (;;) {
        if (n == cap) buf = realloc(buf, cap *= 2);
        size_t k = fread(buf + n, 1, cap - n, p);
        if (k == 0) break;
        n += k;
    }
    int rc = pclose(p);
    if (rc != 0) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

/* The synthetic clip: frame t of a [3, F, H, W] float chunk, a gradient that moves right 4 px per frame, and
 * a left/right tone pair of 440 and 660 Hz at amplitude 0.5. */
static float *make_video(void) {
    float *v = malloc((size_t)3 * F * H * W * sizeof(float));
    for (int t = 0; t < F; t++)
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++) {
                size_t o = ((size_t)t * H + y) * W + x;
                v[o] = (float)fmod((x + 4.0 * t) / W, 1.0);                       /* R */
                v[(size_t)F * H * W + o] = (float)y / (H - 1);                    /* G */
                v[(size_t)2 * F * H * W + o] = 0.25f + 0.5f * (float)t / (F - 1); /* B */
            }
    return v;
}

/* The documented conversion, written independently: numpy's (x * 255).round() on float32 values clamped to
 * [0, 1] (the product rounded to float32, then to the nearest integer, half to even). */
static uint8_t u8_of(float x) {
    float v = x < 0 ? 0.0f : x > 1 ? 1.0f : x;
    volatile float p = v * 255.0f;
    double r = floor((double)p + 0.5);
    if ((double)p + 0.5 == r && fmod(r, 2.0) != 0.0) r -= 1.0; /* a tie goes to the even neighbour */
    return (uint8_t)r;
}

static void make_audio(int64_t n, float **l, float **r) {
    *l = malloc((size_t)n * sizeof(float));
    *r = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        (*l)[i] = (float)(0.5 * sin(2 * M_PI * 440.0 * (double)i / RATE));
        (*r)[i] = (float)(0.5 * sin(2 * M_PI * 660.0 * (double)i / RATE));
    }
}

/* Power of frequency f in x (Goertzel), normalised by n. */
static double tone_power(const float *x, size_t n, size_t stride, double f) {
    double w = 2 * M_PI * f / RATE, c = 2 * cos(w), s1 = 0, s2 = 0;
    for (size_t i = 0; i < n; i++) {
        double s0 = x[i * stride] + c * s1 - s2;
        s2 = s1;
        s1 = s0;
    }
    return (s1 * s1 + s2 * s2 - c * s1 * s2) / ((double)n * n);
}

static h3_status write_clip(const char *path, int audio_first, const float *video, const float *l,
                            const float *r, int64_t ns) {
    h3_mp4_opts o;
    h3_mp4_opts_default(&o, W, H);
    o.preset = "veryfast";
    h3_mp4 *m = NULL;
    H3_TRY(h3_mp4_open(path, &o, &m));
    char partial[1100];
    snprintf(partial, sizeof partial, "%s.partial", path);
    CHECK(exists(partial) && !exists(path), "while writing, only the partial file exists");
    h3_status st = H3_OK;
    float *scratch = malloc((size_t)3 * F * H * W * sizeof(float));
    CHECK(scratch != NULL, "out of memory");
    for (int pass = 0; pass < 2 && st == H3_OK; pass++) {
        if ((pass == 0) == (audio_first != 0)) {
            /* audio in uneven chunks */
            for (int64_t i = 0; i < ns && st == H3_OK;) {
                int64_t k = 1 + (int64_t)(t_rand_u64() % 3000);
                if (k > ns - i) k = ns - i;
                st = h3_mp4_write_audio(m, l + i, r + i, k);
                i += k;
            }
        } else if (scratch) {
            /* from a copy that is overwritten as soon as each call returns: the writer must have copied it */
            memcpy(scratch, video, (size_t)3 * F * H * W * sizeof(float));
            for (int t = 0; t < F && st == H3_OK; t++) {
                st = h3_mp4_write_frame(m, scratch + (size_t)t * H * W, (int64_t)F * H * W, W);
                for (int c = 0; c < 3; c++)
                    for (size_t i = 0; i < (size_t)H * W; i++)
                        scratch[((size_t)c * F + t) * H * W + i] = (float)((i + (size_t)t) % 2);
            }
        }
    }
    free(scratch);
    if (st != H3_OK) {
        h3_mp4_abort(m);
        return st;
    }
    CHECK(h3_mp4_frames(m) == F && h3_mp4_audio_samples(m) == ns);
    CHECK(!exists(path), "the final name appears before finish");
    st = h3_mp4_finish(m);
    CHECK(!exists(partial), "finish left the partial file");
    return st;
}

static json_t *ffprobe(const char *path) {
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "ffprobe -v error -count_frames -show_streams -show_format -of json '%s'",
             path);
    size_t n = 0;
    unsigned char *out = run_read(cmd, &n);
    if (!out) return NULL;
    json_t *j = NULL;
    if (h3_json_parse((const char *)out, n, "ffprobe output", &j) != H3_OK) j = NULL;
    free(out);
    return j;
}

static double jstrnum(json_t *o, const char *k) {
    const char *s = h3_json_get_str(o, k);
    return s ? atof(s) : -1;
}

static void check_probe(const char *path, int64_t ns) {
    json_t *j = ffprobe(path);
    CHECK(j != NULL, "ffprobe could not read %s", path);
    if (!j) return;
    json_t *streams = json_object_get(j, "streams");
    CHECK(json_array_size(streams) == 2, "%zu streams", json_array_size(streams));
    json_t *v = NULL, *a = NULL;
    for (size_t i = 0; i < json_array_size(streams); i++) {
        json_t *s = json_array_get(streams, i);
        const char *type = h3_json_get_str(s, "codec_type");
        if (type && !strcmp(type, "video")) v = s;
        if (type && !strcmp(type, "audio")) a = s;
    }
    CHECK(v && a, "a video and an audio stream");
    if (v && a) {
        int64_t w = 0, h = 0, ch = 0;
        h3_json_get_int(v, "width", &w);
        h3_json_get_int(v, "height", &h);
        h3_json_get_int(a, "channels", &ch);
        const char *vc = h3_json_get_str(v, "codec_name"), *pf = h3_json_get_str(v, "pix_fmt");
        const char *rfr = h3_json_get_str(v, "r_frame_rate"), *afr = h3_json_get_str(v, "avg_frame_rate");
        const char *ac = h3_json_get_str(a, "codec_name"), *sr = h3_json_get_str(a, "sample_rate");
        CHECK(vc && !strcmp(vc, "h264"), "video codec %s", vc ? vc : "?");
        CHECK(pf && !strcmp(pf, "yuv420p"), "pixel format %s", pf ? pf : "?");
        CHECK(w == W && h == H, "size %lldx%lld", (long long)w, (long long)h);
        CHECK(rfr && !strcmp(rfr, "24/1") && afr && !strcmp(afr, "24/1"), "frame rate %s / %s",
              rfr ? rfr : "?", afr ? afr : "?");
        double nread = jstrnum(v, "nb_read_frames"), nframes = jstrnum(v, "nb_frames");
        CHECK(nread == F && nframes == F, "frames: %g decoded, %g in the index", nread, nframes);
        CHECK(ac && !strcmp(ac, "aac"), "audio codec %s", ac ? ac : "?");
        CHECK(sr && !strcmp(sr, "32000"), "sample rate %s", sr ? sr : "?");
        CHECK(ch == 2, "%lld channels", (long long)ch);
        const char *cs = h3_json_get_str(v, "color_space");
        CHECK(cs && !strcmp(cs, "bt709"), "color space %s", cs ? cs : "?");
        double vd = jstrnum(v, "duration"), ad = jstrnum(a, "duration");
        double fd = jstrnum(json_object_get(j, "format"), "duration");
        double want = (double)F / 24.0, frame = 1.0 / 24.0;
        printf("ffprobe %s: h264 %lldx%lld yuv420p %s, %g frames, aac %s Hz %lld ch; durations video %.4f "
               "audio %.4f "
               "file %.4f (frames/24 = %.4f, audio written %.4f)\n",
               path, (long long)w, (long long)h, rfr, nread, sr, (long long)ch, vd, ad, fd, want,
               (double)ns / RATE);
        CHECK(fabs(vd - want) < 1e-6, "video duration %.6f", vd);
        CHECK(fabs(ad - want) <= frame, "audio duration %.4f vs %.4f", ad, want);
        CHECK(fabs(fd - want) <= frame, "file duration %.4f vs %.4f", fd, want);
    }
    json_decref(j);
}

static void check_decoded(const char *path, const float *video, int64_t ns) {
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "ffmpeg -nostdin -v error -i '%s' -f rawvideo -pix_fmt rgb24 -", path);
    size_t n = 0;
    unsigned char *rgb = run_read(cmd, &n);
    CHECK(rgb && n == (size_t)F * H * W * 3, "decoded %zu bytes of video, expected %d", n, F * H * W * 3);
    if (rgb && n == (size_t)F * H * W * 3) {
        /* Lossy H.264 at crf 18 plus 4:2:0 chroma: small mean error, bounded worst case at the gradient's
         * wrap. */
        double sum = 0;
        int worst = 0;
        size_t big = 0;
        for (int t = 0; t < F; t++)
            for (int y = 0; y < H; y++)
                for (int x = 0; x < W; x++)
                    for (int c = 0; c < 3; c++) {
                        size_t o = ((size_t)t * H + y) * W + x;
                        int want = u8_of(video[(size_t)c * F * H * W + o]);
                        int got = rgb[o * 3 + c];
                        int d = abs(got - want);
                        sum += d;
                        if (d > worst) worst = d;
                        big += d > 16;
                    }
        double mean = sum / ((double)F * H * W * 3);
        printf("decoded pixels vs source: mean |diff| %.2f levels, max %d, %.3f%% above 16\n", mean, worst,
               100.0 * (double)big / ((double)F * H * W * 3));
        CHECK(mean < 2.5, "mean pixel error %.2f levels", mean);
        CHECK((double)big / ((double)F * H * W * 3) < 0.01, "%zu values off by more than 16", big);
    }
    free(rgb);

    snprintf(cmd, sizeof cmd, "ffmpeg -nostdin -v error -i '%s' -f f32le -ac 2 -ar 32000 -", path);
    float *pcm = (float *)run_read(cmd, &n);
    size_t frames = n / 8;
    CHECK(pcm && llabs((long long)frames - (long long)ns) <= 1024, "decoded %zu audio samples, wrote %lld",
          frames, (long long)ns);
    if (pcm && frames > 4096) {
        /* Skip the first and last 1024 samples (encoder priming and the final frame). */
        const float *mid = pcm + 2 * 1024;
        size_t m = frames - 2048;
        double l440 = tone_power(mid, m, 2, 440), l660 = tone_power(mid, m, 2, 660);
        double r440 = tone_power(mid + 1, m, 2, 440), r660 = tone_power(mid + 1, m, 2, 660);
        double rms_l = 0;
        for (size_t i = 0; i < m; i++) rms_l += (double)mid[2 * i] * mid[2 * i];
        rms_l = sqrt(rms_l / (double)m);
        printf("decoded audio: left 440/660 Hz power ratio %.0f, right 660/440 %.0f, left RMS %.3f (written "
               "0.354)\n",
               l440 / l660, r660 / r440, rms_l);
        CHECK(l440 > 100 * l660 && r660 > 100 * r440,
              "channels: left 440 %.3g 660 %.3g, right 440 %.3g 660 %.3g", l440, l660, r440, r660);
        CHECK(fabs(rms_l - 0.5 / sqrt(2.0)) < 0.03, "left RMS %.3f", rms_l);
    }
    free(pcm);
}

static void test_mp4_roundtrip(void) {
    if (!have_tool("ffprobe") || !have_tool("ffmpeg")) {
        t_fail_at(__FILE__, __LINE__, "ffprobe and ffmpeg are needed: install ffmpeg (scripts/deps.sh)");
        return;
    }
    float *video = make_video(), *l, *r;
    int64_t ns = h3_audio_samples(F);
    CHECK(ns == 29333, "%lld samples for 22 frames", (long long)ns);
    make_audio(ns, &l, &r);
    char path[1024];
    for (int audio_first = 1; audio_first >= 0; audio_first--) {
        t_tmp_path(audio_first ? "clip_a.mp4" : "clip_v.mp4", path, sizeof path);
        CHECK_OK(write_clip(path, audio_first, video, l, r, ns));
        CHECK(exists(path));
        check_probe(path, ns);
        if (audio_first) check_decoded(path, video, ns);
        unlink(path);
    }
    free(video);
    free(l);
    free(r);
}

static void test_png_wav(void) {
    if (!have_tool("ffmpeg") || !have_tool("ffprobe")) {
        t_fail_at(__FILE__, __LINE__, "ffmpeg is needed: install ffmpeg (scripts/deps.sh)");
        return;
    }
    float *video = make_video();
    char dir[1024], cmd[1400];
    t_tmp_path("png", dir, sizeof dir);
    h3_png_seq seq;
    CHECK_OK(h3_png_seq_open(dir, W, H, &seq));
    for (int t = 0; t < 3; t++)
        CHECK_OK(h3_png_seq_write(&seq, video + (size_t)t * H * W, (int64_t)F * H * W, W));
    CHECK_OK(h3_png_seq_finish(&seq));
    /* The level conversion at ties, ends and NaN. */
    CHECK(h3_unit_to_u8(0.5f / 255.0f) == 0 && h3_unit_to_u8(1.5f / 255.0f) == 2 &&
              h3_unit_to_u8(-1.0f) == 0 && h3_unit_to_u8(2.0f) == 255 && h3_unit_to_u8(NAN) == 0 &&
              h3_unit_to_u8(0.2f) == 51,
          "levels round half to even and clamp");
    int bad_levels = 0;
    for (int i = 0; i < 100000; i++) {
        float x = (float)t_uniform(-0.1, 1.1);
        bad_levels += h3_unit_to_u8(x) != u8_of(x);
    }
    CHECK(bad_levels == 0, "%d of 100000 random values convert differently", bad_levels);
    /* every level's ties: the 64 floats on either side of (k + 0.5) / 255, where the product's own rounding
     * decides; and the ends */
    for (int k = 0; k < 255; k++) {
        float x = (float)((k + 0.5) / 255.0);
        for (int i = 0; i < 64; i++) x = nextafterf(x, 0.0f);
        for (int i = 0; i < 129; i++, x = nextafterf(x, 2.0f)) bad_levels += h3_unit_to_u8(x) != u8_of(x);
    }
    static const float ends[] = {0.0f, -0.0f,       1e-45f,     1e-38f,   -1e-45f,
                                 1.0f, 0.99999994f, 1.0000001f, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++)
        bad_levels += h3_unit_to_u8(ends[i]) != u8_of(ends[i]);
    bad_levels += h3_unit_to_u8(-NAN) != 0;
    CHECK(bad_levels == 0, "%d ties or ends convert differently", bad_levels);
    /* PNG is lossless: decoded bytes equal round(255 x) exactly. */
    snprintf(cmd, sizeof cmd, "ffmpeg -nostdin -v error -i '%s/frame_00002.png' -f rawvideo -pix_fmt rgb24 -",
             dir);
    size_t n = 0;
    unsigned char *rgb = run_read(cmd, &n);
    CHECK(rgb && n == (size_t)W * H * 3, "PNG decoded to %zu bytes", n);
    int bad = 0;
    for (int y = 0; rgb && n == (size_t)W * H * 3 && y < H; y++)
        for (int x = 0; x < W; x++)
            for (int c = 0; c < 3; c++)
                bad += rgb[((size_t)y * W + x) * 3 + c] !=
                       u8_of(video[(size_t)c * F * H * W + (size_t)2 * H * W + (size_t)y * W + x]);
    CHECK(bad == 0, "%d PNG values differ from round(255 x)", bad);
    free(rgb);
    snprintf(cmd, sizeof cmd, "%s/frame_00003.png", dir);
    CHECK(!exists(cmd), "a fourth frame exists");
    for (int t = 0; t < 3; t++) {
        snprintf(cmd, sizeof cmd, "%s/frame_%05d.png", dir, t);
        CHECK(exists(cmd), "%s missing", cmd);
        unlink(cmd);
    }
    rmdir(dir);
    free(video);

    /* WAV: header fields and samples read back byte by byte, and ffprobe agrees. */
    int64_t ns = 1000;
    float *l, *r;
    make_audio(ns, &l, &r);
    l[3] = 1.5f;  /* clamps to 32767 */
    r[3] = -2.0f; /* clamps to -32767 */
    char path[1024];
    t_tmp_path("tone.wav", path, sizeof path);
    CHECK_OK(h3_wav_write(path, l, r, ns, 2, RATE));
    FILE *f = fopen(path, "rb");
    unsigned char hdr[44];
    CHECK(f && fread(hdr, 1, 44, f) == 44);
    if (f) {
        CHECK(!memcmp(hdr, "RIFF", 4) && !memcmp(hdr + 8, "WAVEfmt ", 8) && !memcmp(hdr + 36, "data", 4));
        uint32_t rate = hdr[24] | hdr[25] << 8 | hdr[26] << 16 | (uint32_t)hdr[27] << 24;
        uint32_t data = hdr[40] | hdr[41] << 8 | hdr[42] << 16 | (uint32_t)hdr[43] << 24;
        CHECK(hdr[20] == 1 && hdr[22] == 2 && rate == RATE && hdr[34] == 16 && data == ns * 4);
        int16_t s[2000];
        CHECK(fread(s, 2, 2000, f) == 2000);
        int badw = 0;
        for (int i = 0; i < 1000; i++) {
            double wl = l[i] > 1 ? 1 : l[i] < -1 ? -1 : l[i], wr = r[i] > 1 ? 1 : r[i] < -1 ? -1 : r[i];
            badw +=
                abs(s[2 * i] - (int)lrint(wl * 32767)) > 0 || abs(s[2 * i + 1] - (int)lrint(wr * 32767)) > 0;
        }
        CHECK(badw == 0, "%d WAV samples differ", badw);
        fclose(f);
    }
    json_t *j = ffprobe(path);
    json_t *s0 = j ? json_array_get(json_object_get(j, "streams"), 0) : NULL;
    CHECK(s0 && !strcmp(h3_json_get_str(s0, "codec_name"), "pcm_s16le") &&
          !strcmp(h3_json_get_str(s0, "sample_rate"), "32000"));
    if (j) json_decref(j);
    unlink(path);
    free(l);
    free(r);
}

static void no_files(const char *path, const char *what) {
    char partial[1100];
    snprintf(partial, sizeof partial, "%s.partial", path);
    CHECK(!exists(path), "%s: %s exists", what, path);
    CHECK(!exists(partial), "%s: %s exists", what, partial);
    unlink(path);
    unlink(partial);
}

static void test_failures(void) {
    float *video = make_video();
    h3_mp4_opts o;
    h3_mp4_opts_default(&o, W, H);
    o.preset = "ultrafast";
    h3_mp4 *m = NULL;
    char path[1024];

    /* A folder that does not exist. */
    t_tmp_path("no/such/dir/out.mp4", path, sizeof path);
    CHECK_ERR(h3_mp4_open(path, &o, &m), H3_ERR_IO, "cannot create");
    CHECK(m == NULL);
    no_files(path, "unwritable path");

    /* Stopped midway: the partial file goes away. */
    t_tmp_path("stopped.mp4", path, sizeof path);
    CHECK_OK(h3_mp4_open(path, &o, &m));
    for (int t = 0; t < 10; t++)
        CHECK_OK(h3_mp4_write_frame(m, video + (size_t)t * H * W, (int64_t)F * H * W, W));
    h3_mp4_abort(m);
    no_files(path, "abort");

    /* A bad frame poisons the writer; finish then fails and removes the partial file. */
    CHECK_OK(h3_mp4_open(path, &o, &m));
    CHECK_OK(h3_mp4_write_frame(m, video, (int64_t)F * H * W, W));
    CHECK_ERR(h3_mp4_write_frame(m, video, 10, W), H3_ERR_INVALID, "plane stride");
    CHECK_ERR(h3_mp4_write_frame(m, video, (int64_t)F * H * W, W), H3_ERR_INVALID, "earlier write failed");
    CHECK_ERR(h3_mp4_finish(m), H3_ERR_INVALID, "not finished");
    no_files(path, "bad frame");

    /* No frames at all is not a clip. */
    CHECK_OK(h3_mp4_open(path, &o, &m));
    float tone[100] = {0};
    CHECK_OK(h3_mp4_write_audio(m, tone, tone, 100));
    CHECK_ERR(h3_mp4_finish(m), H3_ERR_INVALID, "no video frames");
    no_files(path, "no frames");

    /* Audio on a writer without an audio track; bad options. */
    h3_mp4_opts nv = o;
    nv.sample_rate = 0;
    CHECK_OK(h3_mp4_open(path, &nv, &m));
    CHECK_ERR(h3_mp4_write_audio(m, tone, tone, 100), H3_ERR_INVALID, "without an audio track");
    h3_mp4_abort(m);
    no_files(path, "no audio track");
    h3_mp4_opts odd = o;
    odd.width = 191;
    CHECK_ERR(h3_mp4_open(path, &odd, &m), H3_ERR_INVALID, "even frame size");
    odd = o;
    odd.crf = 60;
    CHECK_ERR(h3_mp4_open(path, &odd, &m), H3_ERR_INVALID, "crf");
    odd = o;
    odd.preset = "no-such-preset";
    CHECK_ERR(h3_mp4_open(path, &odd, &m), H3_ERR_INVALID, "unknown x264 preset");
    no_files(path, "bad options");

    /* The disk fills midway (a 48 KB file size limit): the write or the finish fails, and nothing is left.
     * Noise frames do not compress, so the limit is reached within a few frames. */
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    float *noise = malloc((size_t)3 * H * W * sizeof(float));
    t_fill_uniform(noise, (size_t)3 * H * W, 0, 1);
    t_tmp_path("full.mp4", path, sizeof path);
    CHECK_OK(h3_mp4_open(path, &o, &m));
    lim = old;
    lim.rlim_cur = 48 * 1024;
    setrlimit(RLIMIT_FSIZE, &lim);
    h3_status st = H3_OK;
    int t;
    for (t = 0; t < 60 && st == H3_OK; t++) {
        noise[(size_t)t * 7] = 1.0f - noise[(size_t)t * 7];
        st = h3_mp4_write_frame(m, noise, (int64_t)H * W, W);
    }
    if (st == H3_OK)
        st = h3_mp4_finish(m);
    else
        CHECK_ERR(h3_mp4_finish(m), st, NULL);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, prev);
    printf("disk full after %d frames: %s\n", t, h3_last_error());
    CHECK(st == H3_ERR_IO, "a full disk gave %d: %s", st, h3_last_error());
    no_files(path, "disk full");
    free(noise);

    /* The same on a writer without sound, whose packets go to the file as they come: the encoder thread fails
     * while the caller is still writing frames, and the caller's next call says so (a full queue makes the
     * caller wait for the thread, so it cannot run 100 frames ahead of it); finish then fails the same way.
     */
    noise = malloc((size_t)3 * H * W * sizeof(float));
    t_fill_uniform(noise, (size_t)3 * H * W, 0, 1);
    h3_mp4_opts silent = o;
    silent.sample_rate = 0;
    t_tmp_path("full_silent.mp4", path, sizeof path);
    CHECK_OK(h3_mp4_open(path, &silent, &m));
    prev = signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &lim);
    st = H3_OK;
    for (t = 0; t < 100 && st == H3_OK; t++) { /* fresh noise: every frame costs the file ~30 KB */
        t_fill_uniform(noise, (size_t)3 * H * W, 0, 1);
        st = h3_mp4_write_frame(m, noise, (int64_t)H * W, W);
    }
    const h3_status at_finish = h3_mp4_finish(m);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, prev);
    CHECK(st == H3_ERR_IO,
          "the encoder thread's write error was not returned by a later frame (%d after %d frames)", st, t);
    CHECK(at_finish == H3_ERR_IO, "finish after the error gave %d", at_finish);
    no_files(path, "disk full, no sound");
    free(noise);

    /* PNG and WAV into a missing folder: an error, nothing written. */
    t_tmp_path("no/such/dir/x.png", path, sizeof path);
    CHECK_ERR(h3_png_write(path, video, (int64_t)F * H * W, W, W, H), H3_ERR_IO, "cannot create");
    no_files(path, "png");
    t_tmp_path("no/such/dir/x.wav", path, sizeof path);
    CHECK_ERR(h3_wav_write(path, tone, tone, 100, 2, RATE), H3_ERR_IO, "cannot create");
    no_files(path, "wav");
    CHECK_ERR(h3_wav_write(path, tone, tone, 100, 3, RATE), H3_ERR_INVALID, "bad WAV");
    free(video);
}

/* The queue: a caller that runs ahead of the encoder (the slowest preset) waits instead of queueing more than
 * H3_MP4_QUEUE_FRAMES frames; the queue's memory (counted as H3_MEM_IO) stays within that many frames; every
 * frame arrives. */
static void test_queue(void) {
    enum { QW = 64, QH = 32, N = 3 * H3_MP4_QUEUE_FRAMES };
    float *video = malloc((size_t)3 * N * QH * QW * sizeof(float));
    t_fill_uniform(video, (size_t)3 * N * QH * QW, 0, 1);
    h3_mp4_opts o;
    h3_mp4_opts_default(&o, QW, QH);
    o.preset = "placebo";
    o.sample_rate = 0;
    char path[1024];
    t_tmp_path("queue.mp4", path, sizeof path);
    h3_mem_stats base, now;
    h3_mem_reset_peaks();
    h3_mem_get_stats(&base);
    h3_mp4 *m = NULL;
    CHECK_OK(h3_mp4_open(path, &o, &m));
    for (int t = 0; t < N && m; t++)
        CHECK_OK(h3_mp4_write_frame(m, video + (size_t)t * QH * QW, (int64_t)N * QH * QW, QW));
    CHECK(h3_mp4_frames(m) == N, "%lld frames accepted of %d", (long long)h3_mp4_frames(m), N);
    h3_mem_get_stats(&now);
    const int64_t frame = (int64_t)3 * QW * QH * (int64_t)sizeof(float),
                  io = now.peak[H3_MEM_IO] - base.current[H3_MEM_IO];
    CHECK(io >= frame && io <= H3_MP4_QUEUE_FRAMES * frame + 3 * QW * QH + 65536,
          "the writer held %lld bytes (a frame is %lld; the queue may hold %d)", (long long)io,
          (long long)frame, H3_MP4_QUEUE_FRAMES);
    printf("the queue held at most %.1f frames' bytes\n", (double)io / (double)frame);
    CHECK_OK(h3_mp4_finish(m));
    json_t *j = ffprobe(path);
    json_t *v = j ? json_array_get(json_object_get(j, "streams"), 0) : NULL;
    const char *nb = v ? json_string_value(json_object_get(v, "nb_read_frames")) : NULL;
    CHECK(nb && atoi(nb) == N, "ffprobe counts %s frames, %d were written", nb ? nb : "no", N);
    json_decref(j);
    unlink(path);
    free(video);
}

static int count_frames(const char *dir) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "ls '%s' 2>/dev/null | grep -c '^frame_[0-9]*\\.png$'", dir);
    size_t n = 0;
    char *out = (char *)run_read(cmd, &n);
    int c = out ? atoi(out) : -1;
    free(out);
    return c;
}

/* PNG frames go into DIR.partial and appear in DIR whole: an unfinished sequence leaves neither folder; a
 * folder that holds anything is refused and kept as it was; a DIR.partial an interrupted run left (frames
 * only) is emptied and reused, anything else there is refused; an MP4, WAV or PNG path that is a FIFO is
 * refused and left a FIFO (it used to be replaced by the renamed .partial file). */
static void test_png_folder(void) {
    float *video = make_video();
    char dir[1024], tmp[1100], path[1200], cmd[2600];
    t_tmp_path("pngs", dir, sizeof dir);
    snprintf(tmp, sizeof tmp, "%s.partial", dir);
    h3_png_seq seq;
    /* unfinished: nothing left */
    CHECK_OK(h3_png_seq_open(dir, W, H, &seq));
    CHECK(exists(tmp) && !exists(dir), "the frames are written into %s", tmp);
    CHECK_OK(h3_png_seq_write(&seq, video, (int64_t)F * H * W, W));
    h3_png_seq_close(&seq);
    CHECK(!exists(tmp) && !exists(dir), "an unfinished sequence left a folder");
    /* a stale DIR.partial of frames is reused: only this run's frames appear */
    CHECK(mkdir(tmp, 0777) == 0);
    for (int i = 0; i < 5; i++) {
        snprintf(path, sizeof path, "%s/frame_%05d.png", tmp, i);
        FILE *f = fopen(path, "w");
        if (f) fclose(f);
    }
    CHECK_OK(h3_png_seq_open(dir, W, H, &seq));
    for (int t = 0; t < 2; t++)
        CHECK_OK(h3_png_seq_write(&seq, video + (size_t)t * H * W, (int64_t)F * H * W, W));
    CHECK_OK(h3_png_seq_finish(&seq));
    CHECK(count_frames(dir) == 2 && !exists(tmp), "%d frames in %s, expected this run's 2", count_frames(dir),
          dir);
    /* the folder now holds frames: refused, kept */
    CHECK_ERR(h3_png_seq_open(dir, W, H, &seq), H3_ERR_IO, "not empty");
    CHECK(count_frames(dir) == 2 && !exists(tmp), "a refused sequence changed %s", dir);
    /* a DIR.partial holding something else: refused, kept */
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s' && echo keep > '%s/notes.txt'", dir, tmp, tmp);
    CHECK(system(cmd) == 0);
    CHECK_ERR(h3_png_seq_open(dir, W, H, &seq), H3_ERR_IO, "remove it");
    snprintf(path, sizeof path, "%s/notes.txt", tmp);
    CHECK(exists(path), "a refused sequence removed %s", path);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    CHECK(system(cmd) == 0);
    /* FIFOs as outputs: refused, still FIFOs */
    float tone[100] = {0};
    t_tmp_path("fifo.out", path, sizeof path);
    unlink(path);
    CHECK(mkfifo(path, 0600) == 0);
    h3_mp4_opts o;
    h3_mp4_opts_default(&o, W, H);
    h3_mp4 *m = NULL;
    CHECK_ERR(h3_mp4_open(path, &o, &m), H3_ERR_IO, "FIFO");
    CHECK_ERR(h3_wav_write(path, tone, tone, 100, 2, RATE), H3_ERR_IO, "FIFO");
    CHECK_ERR(h3_png_write(path, video, (int64_t)F * H * W, W, W, H), H3_ERR_IO, "FIFO");
    struct stat st;
    CHECK(lstat(path, &st) == 0 && S_ISFIFO(st.st_mode), "the FIFO was replaced");
    snprintf(tmp, sizeof tmp, "%s.partial", path);
    CHECK(!exists(tmp), "a .partial was left beside the FIFO");
    unlink(path);
    free(video);
}

static void test_alloc_failures(void) {
    /* Every counted allocation of open, write and finish failing in turn: an error, no leak, no file. */
    float *video = make_video();
    float tone[3000] = {0};
    h3_mp4_opts o;
    h3_mp4_opts_default(&o, 64, 32);
    o.preset = "ultrafast";
    char path[1024];
    t_tmp_path("alloc.mp4", path, sizeof path);
    h3_mem_stats base, now;
    h3_mem_get_stats(&base);
    int n;
    for (n = 1; n < 200; n++) {
        h3_mem_fail_at(n, 0);
        h3_mp4 *m = NULL;
        h3_status st = h3_mp4_open(path, &o, &m);
        for (int t = 0; t < 3 && st == H3_OK; t++) st = h3_mp4_write_frame(m, video, 64 * 32, 64);
        if (st == H3_OK) st = h3_mp4_write_audio(m, tone, tone, 3000);
        if (st == H3_OK)
            st = h3_mp4_finish(m);
        else if (m)
            h3_mp4_abort(m);
        int64_t ticks = h3_mem_fail_at(0, 0);
        h3_mem_get_stats(&now);
        CHECK(now.total_current == base.total_current, "allocation %d failing leaked %lld bytes", n,
              (long long)(now.total_current - base.total_current));
        if (st == H3_OK) {
            CHECK(ticks < n);
            CHECK(exists(path));
            unlink(path);
            break;
        }
        CHECK(st == H3_ERR_NOMEM, "allocation %d: %d %s", n, st, h3_last_error());
        no_files(path, "allocation failure");
    }
    CHECK(n > 3 && n < 200, "loop ended at %d", n);
    /* WAV and PNG. */
    for (n = 1; n < 50; n++) {
        h3_mem_fail_at(n, 0);
        t_tmp_path("alloc.wav", path, sizeof path);
        h3_status st = h3_wav_write(path, tone, tone, 3000, 2, RATE);
        if (st == H3_OK) {
            t_tmp_path("alloc.png", path, sizeof path);
            st = h3_png_write(path, video, (int64_t)F * H * W, W, W, H);
        }
        h3_mem_fail_at(0, 0);
        if (st == H3_OK) break;
        CHECK(st == H3_ERR_NOMEM, "allocation %d: %s", n, h3_last_error());
        no_files(path, "allocation failure");
    }
    t_tmp_path("alloc.wav", path, sizeof path);
    unlink(path);
    t_tmp_path("alloc.png", path, sizeof path);
    unlink(path);
    free(video);
}

/* ---- the delivery scaler
 * ----------------------------------------------------------------------------------- */

/* The Lanczos-3 kernel, and one axis of a float64 reference resampler: output j centred at source position
 * (j + 0.5)*n/m - 0.5, the kernel widened by the ratio when shrinking, edges clamped, weights normalized. */
static double lanczos3(double x) {
    x = fabs(x);
    if (x < 1e-12) return 1;
    if (x >= 3) return 0;
    const double p = M_PI * x;
    return 3 * sin(p) * sin(p / 3) / (p * p);
}
static void ref_axis(const double *in, int n, int sin_, double *out, int m, int sout) {
    const double r = (double)n / m, sc = r > 1 ? 1 / r : 1, sup = r > 1 ? 3 * r : 3;
    for (int j = 0; j < m; j++) {
        const double c = (j + 0.5) * r - 0.5;
        double acc = 0, w = 0;
        for (int i = (int)floor(c - sup); i <= (int)ceil(c + sup); i++) {
            const double k = lanczos3((i - c) * sc);
            const int ii = i < 0 ? 0 : i >= n ? n - 1 : i;
            acc += k * in[(size_t)ii * sin_];
            w += k;
        }
        out[(size_t)j * sout] = acc / w;
    }
}

/* h3_frame_scaler (libswscale's Lanczos) against a float64 Lanczos-3 resampler written here: within 2 levels
 * everywhere and 0.5 on average for smooth images and sharp checkerboards, up (128x128 -> 1920x1080, another
 * aspect) and down; a constant image stays that constant exactly; a horizontal ramp stays monotone in every
 * row. Channels are scaled on their own (no chroma subsampling on the way: a red/green checkerboard keeps
 * its colours to within the same bound). */
static void test_scaler(void) {
    static const struct {
        int sw, sh, dw, dh, pattern; /* 0 smooth, 1 checkerboard of 8-pixel squares, 2 constant, 3 ramp */
    } cases[] = {
        {128, 128, 1920, 1080, 0}, {128, 128, 1920, 1080, 1}, {256, 128, 100, 60, 0},
        {256, 128, 100, 60, 1},    {96, 64, 96, 64, 0},       {128, 128, 1920, 1080, 2},
        {64, 48, 30, 50, 2},       {128, 96, 1000, 40, 3},    {200, 20, 64, 64, 3},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const int sw = cases[ci].sw, sh = cases[ci].sh, dw = cases[ci].dw, dh = cases[ci].dh,
                  pat = cases[ci].pattern;
        uint8_t *src = malloc((size_t)sw * sh * 3), *dst = malloc((size_t)dw * dh * 3);
        double *f = malloc(sizeof(double) * sw * sh), *t = malloc(sizeof(double) * dw * sh),
               *o = malloc(sizeof(double) * dw * dh);
        const double ph = t_uniform(0, 6.28), level[3] = {floor(t_uniform(0, 256)), floor(t_uniform(0, 256)),
                                                          floor(t_uniform(0, 256))};
        for (int y = 0; y < sh; y++)
            for (int x = 0; x < sw; x++)
                for (int k = 0; k < 3; k++) {
                    double v = pat == 0   ? 127.5 + 120 * sin(0.05 * x * (k + 1) + 0.07 * y + ph)
                               : pat == 1 ? ((((x / 8) + (y / 8) + k) & 1) ? 255 : 0)
                               : pat == 2 ? level[k]
                                          : 255.0 * x / (sw - 1);
                    src[((size_t)y * sw + x) * 3 + k] = (uint8_t)lrint(v);
                }
        h3_frame_scaler *sc = NULL;
        CHECK_OK(h3_frame_scaler_new(sw, sh, dw, dh, &sc));
        if (!sc) goto next;
        h3_frame_scaler_run(sc, src, dst);
        h3_frame_scaler_free(sc);
        double max_err = 0, sum = 0;
        int const_bad = 0, mono_bad = 0;
        for (int k = 0; k < 3; k++) {
            for (int i = 0; i < sw * sh; i++) f[i] = src[(size_t)i * 3 + k];
            for (int y = 0; y < sh; y++) ref_axis(f + (size_t)y * sw, sw, 1, t + (size_t)y * dw, dw, 1);
            for (int x = 0; x < dw; x++) ref_axis(t + x, sh, dw, o + x, dh, dw);
            for (int i = 0; i < dw * dh; i++) {
                double r = o[i] < 0 ? 0 : o[i] > 255 ? 255 : o[i];
                const int v = dst[(size_t)i * 3 + k];
                const double e = fabs(v - r);
                sum += e;
                if (e > max_err) max_err = e;
                if (pat == 2 && v != (int)level[k]) const_bad++;
                if (pat == 3 && i % dw && v < dst[(size_t)(i - 1) * 3 + k]) mono_bad++;
            }
        }
        const double mean = sum / (3.0 * dw * dh);
        t_note("scaler %dx%d -> %dx%d pattern %d: max |err| %.2f levels, mean %.3f", sw, sh, dw, dh, pat,
               max_err, mean);
        CHECK(max_err <= 2.0 && mean <= 0.5,
              "%dx%d -> %dx%d pattern %d: max %.2f, mean %.3f levels from Lanczos-3", sw, sh, dw, dh, pat,
              max_err, mean);
        CHECK(const_bad == 0, "%dx%d -> %dx%d: %d values of a constant image changed", sw, sh, dw, dh,
              const_bad);
        CHECK(mono_bad == 0, "%dx%d -> %dx%d: a ramp is not monotone at %d places", sw, sh, dw, dh, mono_bad);
    next:
        free(src);
        free(dst);
        free(f);
        free(t);
        free(o);
    }
    /* the delivery size: even sides within the encoder's limits, odd ones refused naming the even neighbours
     */
    CHECK_OK(h3_media_check_output_size(1920, 1080));
    CHECK_OK(h3_media_check_output_size(2, 16384));
    CHECK_ERR(h3_media_check_output_size(1919, 1080), H3_ERR_INVALID, "use 1918x1080 or 1920x1080");
    CHECK_ERR(h3_media_check_output_size(1, 1), H3_ERR_INVALID, "use 2x2 or 2x2");
    CHECK_ERR(h3_media_check_output_size(0, 1080), H3_ERR_INVALID, "even number from 2 to 16384");
    CHECK_ERR(h3_media_check_output_size(16386, 1080), H3_ERR_INVALID, "even number from 2 to 16384");
    h3_frame_scaler *none = NULL;
    CHECK_ERR(h3_frame_scaler_new(0, 10, 10, 10, &none), H3_ERR_INVALID, "cannot scale");
}

/* An MP4 written from 64x48 frames at 96x54: ffprobe reads 96x54 and every frame; a frame of constant colour
 * comes back that colour (the scaler and the writer's thread put together). */
static void test_mp4_scaled(void) {
    if (!have_tool("ffprobe") || !have_tool("ffmpeg")) {
        t_note("ffprobe/ffmpeg missing: mp4_scaled skipped");
        return;
    }
    char path[512];
    snprintf(path, sizeof path, "%s/h3_scaled_%d.mp4", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getpid());
    h3_mp4_opts o;
    h3_mp4_opts_default(&o, 96, 54);
    o.src_width = 64;
    o.src_height = 48;
    o.sample_rate = 0;
    o.preset = "ultrafast";
    h3_mp4 *m = NULL;
    CHECK_OK(h3_mp4_open(path, &o, &m));
    if (!m) return;
    float *rgb = malloc(sizeof(float) * 3 * 64 * 48);
    for (int i = 0; i < 3 * 64 * 48; i++) rgb[i] = i < 64 * 48 ? 0.8f : i < 2 * 64 * 48 ? 0.3f : 0.5f;
    for (int k = 0; k < 5; k++) CHECK_OK(h3_mp4_write_frame(m, rgb, 64 * 48, 64));
    free(rgb);
    CHECK_OK(h3_mp4_finish(m));
    char cmd[700];
    snprintf(
        cmd, sizeof cmd,
        "ffprobe -v error -count_frames -select_streams v:0 -show_entries stream=width,height,nb_read_frames "
        "-of csv=p=0 %s",
        path);
    size_t n = 0;
    unsigned char *out = run_read(cmd, &n);
    CHECK(out && !strncmp((char *)out, "96,54,5", 7), "ffprobe reads %s", out ? (char *)out : "nothing");
    free(out);
    snprintf(cmd, sizeof cmd, "ffmpeg -v error -i %s -frames:v 1 -f rawvideo -pix_fmt rgb24 -", path);
    out = run_read(cmd, &n);
    CHECK(out && n == 96 * 54 * 3, "decoded %zu bytes", n);
    if (out && n == 96 * 54 * 3) {
        int bad = 0;
        for (size_t i = 0; i < n; i += 3)
            bad += abs(out[i] - 204) > 3 || abs(out[i + 1] - 77) > 3 || abs(out[i + 2] - 128) > 3;
        CHECK(bad == 0, "%d pixels of a constant frame are not its colour after scaling", bad);
    }
    free(out);
    unlink(path);
}

int main(int argc, char **argv) {
    static const t_case cases[] = {
        {"mp4_roundtrip", test_mp4_roundtrip},
        {"png_wav", test_png_wav},
        {"failures", test_failures},
        {"alloc_failures", test_alloc_failures},
        {"png_folder", test_png_folder},
        {"queue", test_queue},
        {"scaler", test_scaler},
        {"mp4_scaled", test_mp4_scaled},
        {NULL, NULL},
    };
    return t_main("test_media", cases, argc, argv);
}
