/* The packed t2va layout (src/pipeline/layout): sizes and positions in closed form and against the positions
 * tools/reference/sampling_reference.py computes (two canvases x two lengths,
 * tests/fixtures/sample/layout_*.f64), timestep indices, and the video/audio patchify against the reference's
 * reshape/permute; the geometry module (src/pipeline/geometry) against closed forms and the video VAE's own
 * frame rule. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/fs.h"
#include "base/json.h"
#include "models/video_vae.h"
#include "pipeline/layout.h"
#include "pipeline/window.h"
#include "testutil.h"

static json_t *g_fx;

static json_t *fixture(void) {
    if (g_fx) return g_fx;
    char path[1024];
    t_src_path("tests/fixtures/sample/sampling.json", path, sizeof path);
    if (h3_json_load_file(path, 16u << 20, &g_fx) != H3_OK)
        t_fail_at(__FILE__, __LINE__, "cannot load %s: %s", path, h3_last_error());
    return g_fx;
}

static void test_sizes(void) {
    /* H3-FACTS 3 (temporal chunking) and 4 (audio latents). */
    static const int64_t f2l[][2] = {{5, 2}, {22, 7}, {107, 32}, {124, 37}, {243, 72}, {345, 102}};
    for (size_t i = 0; i < sizeof f2l / sizeof f2l[0]; i++)
        CHECK(h3_video_latent_frames(f2l[i][0]) == f2l[i][1], "%lld frames -> %lld latent frames",
              (long long)f2l[i][0], (long long)h3_video_latent_frames(f2l[i][0]));
    CHECK(h3_video_latent_frames(120) == -1 && h3_video_latent_frames(4) == -1 &&
          h3_video_latent_frames(0) == -1);
    CHECK(h3_audio_latents(124) == 207 && h3_audio_latents(345) == 575 && h3_audio_latents(22) == 37);
    for (int64_t f = 5; f < 2000; f += 17) /* round(f*5/3): never a tie for 17n+5 */
        CHECK(h3_audio_latents(f) == (f * 5 + 1) / 3, "%lld frames: %lld audio latents", (long long)f,
              (long long)h3_audio_latents(f));
    /* The example sequence sizes of H3-FACTS 1.4 (video + audio rows, text excluded). */
    static const int64_t ex[][4] = {
        {1344, 768, 124, 37296}, {1344, 768, 345, 102816}, {960, 544, 124, 18870}};
    static const int64_t ex_audio[] = {414, 1150, 414};
    for (int i = 0; i < 3; i++) {
        h3_seq_layout l;
        CHECK_OK(h3_seq_layout_t2va(11, NULL, ex[i][2], ex[i][0], ex[i][1], &l));
        CHECK(l.n_video_rows == ex[i][3] && l.n_audio_rows == ex_audio[i],
              "%lldx%lld, %lld frames: %lld + %lld rows", (long long)ex[i][0], (long long)ex[i][1],
              (long long)ex[i][2], (long long)l.n_video_rows, (long long)l.n_audio_rows);
        CHECK(l.seq_len == 11 + ex[i][3] + ex_audio[i]);
        /* The counts alone (what sizing a request reads before anything is allocated) are the same, with no
         * tables; the largest request the limits allow is counted without allocating its 69 million rows. */
        h3_seq_layout s;
        CHECK_OK(h3_seq_layout_sizes(11, 0, ex[i][2], ex[i][0], ex[i][1], &s));
        CHECK(
            s.seq_len == l.seq_len && s.n_video_rows == l.n_video_rows && s.n_audio_rows == l.n_audio_rows &&
                s.video_start == l.video_start && s.audio_start == l.audio_start &&
                s.latent_t == l.latent_t && s.tags == NULL && s.pos == NULL && s.video_indices == NULL,
            "sizes of %lldx%lld, %lld frames", (long long)ex[i][0], (long long)ex[i][1], (long long)ex[i][2]);
        h3_seq_layout_free(&l);
    }
    h3_mem_stats a, b;
    h3_mem_get_stats(&a);
    h3_seq_layout s;
    CHECK_OK(h3_seq_layout_sizes(8192, 0, 14387, 8192, 2048, &s));
    h3_mem_get_stats(&b);
    CHECK(s.seq_len == 8192 + 2 * 23978 + 4232LL * 256 * 64 && b.total_peak == a.total_peak,
          "%lld rows counted", (long long)s.seq_len);
    CHECK_ERR(h3_seq_layout_sizes(4, 0, 120, 256, 256, &s), H3_ERR_INVALID, "17n+5");
}

/* The geometry module: frame counts, their neighbours, seconds rounding, audio samples, canvases, and that
 * the video VAE's frames-from-latents rule (its config's) inverts h3_video_latent_frames for every valid
 * count. */
static void test_geometry(void) {
    for (int64_t f = 0; f < 400; f++) {
        const int valid = f >= 5 && (f - 5) % 17 == 0; /* written out here, not taken from the module */
        CHECK(h3_frames_valid(f) == valid, "%lld frames", (long long)f);
        int64_t lo, hi;
        h3_frames_nearest(f, &lo, &hi);
        CHECK(h3_frames_valid(lo) && h3_frames_valid(hi) && hi == lo + 17 &&
                  (f < 5 ? lo == 5 : lo <= f && f < hi),
              "%lld frames: %lld, %lld", (long long)f, (long long)lo, (long long)hi);
        const int64_t up = h3_frames_round_up(f);
        CHECK(h3_frames_valid(up) && up >= f && (f <= 5 || up - f < 17), "%lld frames round up to %lld",
              (long long)f, (long long)up);
    }
    CHECK(h3_audio_samples(124) == 165333 && h3_audio_samples(22) == 29333 && h3_audio_samples(0) == 0 &&
          h3_audio_samples(-3) == 0);
    for (int64_t f = 5; f < 2000; f += 17) /* the audio latents cover the clip's samples */
        CHECK(h3_audio_latents(f) * H3_AUDIO_HOP >= h3_audio_samples(f) - H3_AUDIO_HOP / 2, "%lld frames",
              (long long)f);
    CHECK(h3_canvas_valid(960, 544) && h3_canvas_valid(32, 32) && !h3_canvas_valid(0, 0) &&
          !h3_canvas_valid(960, 540) && !h3_canvas_valid(16, 32) && !h3_canvas_valid(65568, 32));
    h3_geometry g;
    CHECK(h3_geometry_of(135, 124, 960, 544, &g) == 0 && g.latent_t == 37 && g.latent_h == 34 &&
              g.latent_w == 60 && g.audio_t == 207 && g.audio_samples == 165333 && g.n_video_rows == 18870 &&
              g.n_audio_rows == 414 && g.seq_len == 135 + 414 + 18870,
          "W124: %lld rows", (long long)g.seq_len);
    CHECK(h3_geometry_of(1, 120, 960, 544, &g) == -1 && g.seq_len == 0);
    CHECK(h3_geometry_of(1, 124, 960, 540, &g) == -1);
    h3_video_vae_config c;
    h3_video_vae_default_config(&c);
    for (int64_t f = 22; f < 2000; f += 17)
        CHECK(h3_video_vae_num_frames(&c, h3_video_latent_frames(f)) == f,
              "%lld frames -> %lld latent -> %lld", (long long)f, (long long)h3_video_latent_frames(f),
              (long long)h3_video_vae_num_frames(&c, h3_video_latent_frames(f)));
}

/* Closed form of the video time of latent frame f: L + 5/3 * (4f - 3*ceil(f/5)). */
static double frame_time(int64_t L, int64_t f) {
    return (double)L + 5.0 / 3.0 * (double)(4 * f - 3 * ((f + 4) / 5));
}

static void check_layout_closed_form(int64_t L, int64_t frames, int64_t W, int64_t H) {
    h3_seq_layout l;
    CHECK_OK(h3_seq_layout_t2va(L, NULL, frames, W, H, &l));
    const int64_t lh = H / 16, lw = W / 16, ph = lh / 2, pw = lw / 2;
    /* The spatial axes: left end (1 - D/sqrt(HW))/2*32, spacing D/sqrt(HW)/(D/2)*32 = 64/sqrt(HW). */
    const double sq = sqrt((double)(lh * lw)), step = 64.0 / sq;
    const double h0 = (1.0 - lh / sq) / 2.0 * 32.0, w0 = (1.0 - lw / sq) / 2.0 * 32.0;
    double worst = 0;
    int bad = 0;
    for (int64_t r = 0; r < l.seq_len; r++) {
        double want[3];
        int tag;
        if (r < L) {
            tag = H3_TAG_TEXT;
            want[0] = (double)r, want[1] = 0, want[2] = 0;
        } else if (r < L + 2 * l.audio_t) {
            int64_t k = r - L, c = k / l.audio_t;
            tag = H3_TAG_AUDIO;
            want[0] = (double)(L + k % l.audio_t), want[1] = 0,
            want[2] = c == 0 ? w0 : w0 + (double)(pw - 1) * step;
        } else {
            int64_t v = r - L - 2 * l.audio_t, f = v / (ph * pw), i = (v / pw) % ph, j = v % pw;
            tag = H3_TAG_VIDEO;
            want[0] = frame_time(L, f), want[1] = h0 + (double)i * step, want[2] = w0 + (double)j * step;
        }
        if (l.tags[r] != tag) bad++;
        for (int a = 0; a < 3; a++) worst = fmax(worst, fabs(l.pos[3 * r + a] - want[a]));
    }
    CHECK(bad == 0, "%d rows with the wrong tag", bad);
    /* Float64 rounding of sums of a few terms of size <= L + 1000. */
    CHECK(worst < 1e-9, "%lldx%lld, L=%lld, %lld frames: positions differ from the closed form by %g",
          (long long)W, (long long)H, (long long)L, (long long)frames, worst);
    /* The index arrays name the rows of each modality in order. */
    int ok = 1;
    for (int64_t k = 0; k < l.text_len; k++) ok &= l.text_indices[k] == k;
    for (int64_t k = 0; k < l.n_audio_rows; k++) ok &= l.audio_indices[k] == L + k;
    for (int64_t k = 0; k < l.n_video_rows; k++) ok &= l.video_indices[k] == L + l.n_audio_rows + k;
    CHECK(ok, "index arrays");
    CHECK(l.audio_start == L && l.video_start == L + l.n_audio_rows);
    printf("%5lldx%-5lld L=%-4lld %4lld frames: %lld rows, max |position - closed form| %.3g\n", (long long)W,
           (long long)H, (long long)L, (long long)frames, (long long)l.seq_len, worst);
    h3_seq_layout_free(&l);
}

static void test_positions_closed_form(void) {
    check_layout_closed_form(9, 124, 1344, 768);
    check_layout_closed_form(250, 22, 768, 1344);
    check_layout_closed_form(1, 107, 512, 512);
    check_layout_closed_form(0, 5, 128, 512); /* 1:4, no text */
    /* A square canvas spans [0, 32): grid i*32/(D/2). */
    h3_seq_layout l;
    CHECK_OK(h3_seq_layout_t2va(3, NULL, 22, 512, 512, &l));
    int64_t r = l.video_start + 15; /* frame 0, patch row 0, column 15 of 16 */
    CHECK(l.pos[3 * r] == 3.0 && l.pos[3 * r + 1] == 0.0 && l.pos[3 * r + 2] == 30.0);
    CHECK(l.pos[3 * l.audio_start + 2] == 0.0 && l.pos[3 * (l.audio_start + l.audio_t) + 2] == 30.0);
    h3_seq_layout_free(&l);
    /* Text tags are taken as given (vision-block rows of other tasks carry the video tag). */
    uint8_t tags[4] = {1, 0, 0, 1};
    CHECK_OK(h3_seq_layout_t2va(4, tags, 5, 64, 64, &l));
    CHECK(l.tags[0] == 1 && l.tags[1] == 0 && l.tags[2] == 0 && l.tags[3] == 1 && l.tags[4] == H3_TAG_AUDIO);
    h3_seq_layout_free(&l);
}

static void test_positions_reference(void) {
    json_t *cases = json_object_get(fixture(), "layouts");
    CHECK(json_array_size(cases) == 4, "%zu layout cases", json_array_size(cases));
    for (size_t c = 0; c < json_array_size(cases); c++) {
        json_t *e = json_array_get(cases, c);
        int64_t L = json_integer_value(json_object_get(e, "text_len"));
        int64_t frames = json_integer_value(json_object_get(e, "frames"));
        int64_t W = json_integer_value(json_object_get(e, "width")),
                H = json_integer_value(json_object_get(e, "height"));
        json_t *lat = json_object_get(e, "latent"), *tags = json_object_get(e, "tags");
        char rel[256], path[1024];
        snprintf(rel, sizeof rel, "tests/fixtures/sample/%s",
                 json_string_value(json_object_get(e, "positions")));
        t_src_path(rel, path, sizeof path);
        char *data = NULL;
        size_t len = 0;
        CHECK_OK(h3_read_file(path, 64u << 20, &data, &len));
        h3_seq_layout l;
        CHECK_OK(h3_seq_layout_t2va(L, NULL, frames, W, H, &l));
        CHECK(l.latent_t == json_integer_value(json_array_get(lat, 0)) &&
              l.latent_h == json_integer_value(json_array_get(lat, 1)) &&
              l.latent_w == json_integer_value(json_array_get(lat, 2)));
        CHECK(l.audio_t == json_integer_value(json_object_get(e, "audio_t")));
        CHECK(l.seq_len == json_integer_value(json_object_get(e, "seq_len")) &&
              (size_t)l.seq_len == json_array_size(tags));
        CHECK(data && len == (size_t)l.seq_len * 24, "%s: %zu bytes for %lld rows", path, len,
              (long long)l.seq_len);
        if (data && len == (size_t)l.seq_len * 24) {
            double worst = 0;
            int tag_bad = 0;
            for (int64_t r = 0; r < l.seq_len; r++) {
                double ref[3];
                memcpy(ref, data + r * 24, 24); /* little-endian float64, as this machine */
                for (int a = 0; a < 3; a++) worst = fmax(worst, fabs(l.pos[3 * r + a] - ref[a]));
                tag_bad += l.tags[r] != json_integer_value(json_array_get(tags, (size_t)r));
            }
            /* Same operations in the same order on both sides (numpy linspace, sequential cumsum): exact. */
            CHECK(worst == 0.0, "%s: positions differ from the reference by %g",
                  json_string_value(json_object_get(e, "name")), worst);
            CHECK(tag_bad == 0, "%d tags differ", tag_bad);
            printf("layout %-10s (%lldx%lld, L=%lld, %lld frames, %lld rows): max |diff| vs reference %.3g\n",
                   json_string_value(json_object_get(e, "name")), (long long)W, (long long)H, (long long)L,
                   (long long)frames, (long long)l.seq_len, worst);
        }
        h3_free(data);
        h3_seq_layout_free(&l);
    }
}

static void test_timestep_indices(void) {
    h3_seq_layout l;
    CHECK_OK(h3_seq_layout_t2va(5, NULL, 22, 64, 96, &l));
    int32_t *idx = malloc((size_t)l.seq_len * sizeof(int32_t));
    float u[4];
    /* Video is noisier than audio (shift 12 vs 3): t_v < t_a, sorted ascending, text follows video. */
    int n = h3_seq_layout_timestep_indices(&l, 0.25f, 0.5f, u, idx);
    CHECK(n == 2 && u[0] == 0.25f && u[1] == 0.5f);
    int bad = 0;
    for (int64_t r = 0; r < l.seq_len; r++) bad += idx[r] != (l.tags[r] == H3_TAG_AUDIO ? 1 : 0);
    CHECK(bad == 0, "%d rows with the wrong index", bad);
    n = h3_seq_layout_timestep_indices(&l, 0.75f, 0.5f, u, idx);
    CHECK(n == 2 && u[0] == 0.5f && u[1] == 0.75f);
    bad = 0;
    for (int64_t r = 0; r < l.seq_len; r++) bad += idx[r] != (l.tags[r] == H3_TAG_AUDIO ? 0 : 1);
    CHECK(bad == 0);
    /* The first step (t = 0 for both) has one distinct timestep. */
    n = h3_seq_layout_timestep_indices(&l, 0.0f, 0.0f, u, idx);
    CHECK(n == 1 && u[0] == 0.0f);
    bad = 0;
    for (int64_t r = 0; r < l.seq_len; r++) bad += idx[r] != 0;
    CHECK(bad == 0);
    free(idx);
    h3_seq_layout_free(&l);
}

/* fl2va: keyframe rows between the text and the audio, at their anchors' times on the target's grid, held at
 * max(t_video, 0.999). */
static void test_fl2va(void) {
    const int64_t L = 7, frames = 124, W = 96, H = 64;
    const int64_t kf[3] = {0, frames - 1, 60};
    h3_seq_layout t, f;
    CHECK_OK(h3_seq_layout_t2va(L, NULL, frames, W, H, &t));
    CHECK_OK(h3_seq_layout_fl2va(L, NULL, frames, W, H, 3, kf, &f));
    const int64_t per = (H / 32) * (W / 32);
    CHECK(f.n_keyframes == 3 && f.n_cond_rows == 3 * per && f.cond_start == L && f.audio_start == L + 3 * per &&
              f.video_start == f.audio_start + t.n_audio_rows && f.seq_len == t.seq_len + 3 * per &&
              f.n_video_rows == t.n_video_rows,
          "fl2va counts");
    h3_seq_layout s;
    CHECK_OK(h3_seq_layout_sizes(L, 3, frames, W, H, &s));
    CHECK(s.seq_len == f.seq_len && s.n_cond_rows == f.n_cond_rows && s.video_start == f.video_start);
    /* The audio and video rows keep their positions (the media clock starts at L either way). */
    int bad = 0;
    for (int64_t k = 0; k < t.n_audio_rows; k++)
        for (int a = 0; a < 3; a++)
            bad += f.pos[3 * f.audio_indices[k] + a] != t.pos[3 * t.audio_indices[k] + a];
    for (int64_t k = 0; k < t.n_video_rows; k++)
        for (int a = 0; a < 3; a++)
            bad += f.pos[3 * f.video_indices[k] + a] != t.pos[3 * t.video_indices[k] + a];
    CHECK(bad == 0, "%d media coordinates moved", bad);
    /* Each keyframe: tag video, the first latent frame's (h, w), its anchor's time: the first at L; the last at
     * L + 5/3·(frames − 1) (the spans of 124 frames sum to 5/3·124, summed here in long double); frame 60 at
     * L + 100. */
    const long double span = 5.0L / 3.0L;
    const double want[3] = {(double)L, (double)((long double)L + span * (frames - 1)), (double)L + 100.0};
    for (int k = 0; k < 3; k++)
        for (int64_t i = 0; i < per; i++) {
            const int64_t r = f.cond_indices[k * per + i], v = t.video_indices[i];
            bad += r != L + k * per + i || f.tags[r] != H3_TAG_VIDEO;
            bad += fabs(f.pos[3 * r] - want[k]) > 1e-12 * want[k];
            bad += f.pos[3 * r + 1] != t.pos[3 * v + 1] || f.pos[3 * r + 2] != t.pos[3 * v + 2];
        }
    CHECK(bad == 0, "%d keyframe rows misplaced (times %.17g %.17g %.17g)", bad, f.pos[3 * L],
          f.pos[3 * (L + per)], f.pos[3 * (L + 2 * per)]);
    CHECK(h3_keyframe_time(L, frames, 0) == (double)L && h3_keyframe_time(L, frames, 60) == (double)L + 100.0);
    /* The "last" anchor to the bit, as numpy 1.24 computes the reference's float(L) + float(spans.sum()) - 5/3
     * (pairwise summation; where the sequential sum differs it is noted). */
    static const struct {
        int64_t L, frames;
        double t;
    } exact[] = {
        {7, 124, 0x1.a7fffffffffffp+7}, /* T 37: 211.99999999999997, sequential 0x1.a7ffffffffffdp+7 */
        {300, 124, 0x1.f8fffffffffffp+8}, /* T 37: 504.99999999999994, sequential 0x1.f8ffffffffffep+8 */
        {128, 362, 0x1.6cd5555555554p+9}, /* T 107: 729.66666666666652, sequential 0x1.6cd5555555557p+9 */
        {1000, 345, 0x1.8955555555554p+10}, /* T 102: 1573.333333333333, sequential 0x1.8955555555557p+10 */
        {5, 22, 0x1.4000000000001p+5}, /* T 7: 40.000000000000007 */
        {64, 719, 0x1.3b2aaaaaaaaa9p+10}, /* T 212: 1260.6666666666663 */
        {3, 1450, 0x1.2e40000000000p+11}, /* T 427: 2418, sequential 0x1.2e40000000003p+11 */
        {11, 5, 0x1.1aaaaaaaaaaabp+4}, /* T 2: 17.666666666666668 */
        {0, 3405, 0x1.6295555555555p+12}, /* T 1002: 5673.333333333333, sequential 0x1.6295555555582p+12 */
    };
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++) {
        const double got = h3_keyframe_time(exact[i].L, exact[i].frames, exact[i].frames - 1);
        CHECK(got == exact[i].t, "L %lld, %lld frames: %a, numpy %a", (long long)exact[i].L,
              (long long)exact[i].frames, got, exact[i].t);
    }
    /* The last frame's anchor continues the video's clock: 5/3 after the last latent frame's start plus its
     * 4 frames' span less one frame, i.e. the last latent frame's time + 3·5/3. */
    const double last_latent = t.pos[3 * t.video_indices[t.n_video_rows - 1]];
    CHECK(fabs(h3_keyframe_time(L, frames, frames - 1) - (last_latent + 5.0)) < 1e-9, "last anchor %.17g vs %.17g",
          h3_keyframe_time(L, frames, frames - 1), last_latent + 5.0);
    /* Timesteps: the keyframe rows at max(t_v, 0.999), sorted with the others. */
    int32_t *idx = malloc((size_t)f.seq_len * sizeof(int32_t));
    float u[4];
    int n = h3_seq_layout_timestep_indices(&f, 0.25f, 0.5f, u, idx);
    CHECK(n == 3 && u[0] == 0.25f && u[1] == 0.5f && u[2] == 0.999f, "%d: %g %g %g", n, u[0], u[1], u[2]);
    bad = 0;
    for (int64_t r = 0; r < f.seq_len; r++) {
        const int want_i = r >= f.cond_start && r < f.audio_start ? 2 : f.tags[r] == H3_TAG_AUDIO && r >= f.audio_start && r < f.video_start ? 1 : 0;
        bad += idx[r] != want_i;
    }
    CHECK(bad == 0, "%d rows with the wrong timestep", bad);
    n = h3_seq_layout_timestep_indices(&f, 0.9995f, 0.5f, u, idx); /* past 0.999: the video's own */
    CHECK(n == 2 && u[0] == 0.5f && u[1] == 0.9995f && idx[f.cond_start] == 1 && idx[f.audio_start] == 0);
    n = h3_seq_layout_timestep_indices(&f, 0.5f, 0.999f, u, idx); /* audio at 0.999 shares the value */
    CHECK(n == 2 && u[1] == 0.999f && idx[f.cond_start] == 1 && idx[f.audio_start] == 1 && idx[0] == 0);
    free(idx);
    /* A keyframe outside the clip, too many keyframes. */
    const int64_t out[1] = {frames};
    CHECK_ERR(h3_seq_layout_fl2va(L, NULL, frames, W, H, 1, out, &s), H3_ERR_INVALID, "outside the clip");
    CHECK_ERR(h3_seq_layout_sizes(L, H3_MAX_KEYFRAMES + 1, frames, W, H, &s), H3_ERR_INVALID, "at most");
    h3_seq_layout_free(&t);
    h3_seq_layout_free(&f);
}

static void test_patchify(void) {
    json_t *p = json_object_get(fixture(), "patchify"), *shape = json_object_get(p, "shape"),
           *rows = json_object_get(p, "rows");
    int64_t C = json_integer_value(json_array_get(shape, 0)),
            T = json_integer_value(json_array_get(shape, 1));
    int64_t H = json_integer_value(json_array_get(shape, 2)),
            W = json_integer_value(json_array_get(shape, 3));
    CHECK(C == H3_LATENT_CHANNELS);
    size_t n = (size_t)(C * T * H * W);
    CHECK(json_array_size(rows) == n);
    float *lat = malloc(n * sizeof(float)), *r = malloc(n * sizeof(float)), *back = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) lat[i] = (float)i; /* each element holds its flat [C,T,H,W] index */
    h3_video_patchify(lat, T, H, W, r);
    int bad = 0;
    for (size_t i = 0; i < n && i < json_array_size(rows); i++)
        bad += r[i] != (float)json_number_value(json_array_get(rows, i));
    CHECK(bad == 0, "%d patchified values differ from the reference", bad);
    /* Random latents survive the round trip. */
    t_fill_randn(lat, n, 1.0);
    h3_video_patchify(lat, T, H, W, r);
    h3_video_unpatchify(r, T, H, W, back);
    CHECK(memcmp(lat, back, n * sizeof(float)) == 0, "unpatchify(patchify(x)) != x");
    free(lat);
    free(r);
    free(back);

    json_t *a = json_object_get(fixture(), "audio_pack");
    int64_t Ta = json_integer_value(json_object_get(a, "T_a"));
    json_t *arows = json_object_get(a, "rows");
    size_t na = (size_t)(2 * 32 * Ta);
    CHECK(json_array_size(arows) == na);
    float *al = malloc(na * sizeof(float)), *ar = malloc(na * sizeof(float)),
          *ab = malloc(na * sizeof(float));
    for (size_t i = 0; i < na; i++) al[i] = (float)i;
    h3_audio_pack(al, Ta, ar);
    bad = 0;
    for (size_t i = 0; i < na && i < json_array_size(arows); i++)
        bad += ar[i] != (float)json_number_value(json_array_get(arows, i));
    CHECK(bad == 0, "%d packed audio values differ from the reference", bad);
    h3_audio_unpack(ar, Ta, ab);
    CHECK(memcmp(al, ab, na * sizeof(float)) == 0);
    free(al);
    free(ar);
    free(ab);
}

static void test_errors_and_alloc(void) {
    h3_seq_layout l;
    CHECK_ERR(h3_seq_layout_t2va(4, NULL, 120, 256, 256, &l), H3_ERR_INVALID, "17n+5");
    CHECK_ERR(h3_seq_layout_t2va(4, NULL, 124, 250, 256, &l), H3_ERR_INVALID, "multiples of 32");
    CHECK_ERR(h3_seq_layout_t2va(4, NULL, 124, 0, 256, &l), H3_ERR_INVALID, "multiples of 32");
    CHECK_ERR(h3_seq_layout_t2va(-1, NULL, 124, 256, 256, &l), H3_ERR_INVALID, "text length");
    h3_mem_stats base, now;
    h3_mem_get_stats(&base);
    int n;
    for (n = 1; n < 100; n++) {
        h3_mem_fail_at(n, 0);
        h3_status st = h3_seq_layout_t2va(6, NULL, 22, 128, 96, &l);
        int64_t ticks = h3_mem_fail_at(0, 0);
        if (st == H3_OK) {
            CHECK(ticks < n);
            h3_seq_layout_free(&l);
            break;
        }
        CHECK(st == H3_ERR_NOMEM, "allocation %d: %s", n, h3_last_error());
        h3_mem_get_stats(&now);
        CHECK(now.total_current == base.total_current, "allocation %d failing leaked", n);
    }
    CHECK(n > 5 && n < 100, "loop ended at %d", n);
}

static void test_cleanup(void) {
    if (g_fx) json_decref(g_fx);
    g_fx = NULL;
}

/* The refine pass's latent upscale against values computed independently: torch's
 * interpolate(arange(4).view(1, 1, 2, 2), size=(4, 4), mode="bilinear", align_corners=False) (half-pixel
 * centres, clamped edges), written out here; a constant frame stays constant; a linear function of the source
 * position comes out as that function at each output's source position wherever that lies inside the frame
 * (bilinear interpolation reproduces linear functions); the same size is the identity; frames and channels
 * are scaled on their own. */
static void test_upscale(void) {
    static const float src[4] = {0, 1, 2, 3};
    static const float want[16] = {0.0f, 0.25f, 0.75f, 1.0f, 0.5f, 0.75f, 1.25f, 1.5f,
                                   1.5f, 1.75f, 2.25f, 2.5f, 2.0f, 2.25f, 2.75f, 3.0f};
    float out[16];
    CHECK_OK(h3_video_latent_upscale(src, 1, 1, 2, 2, 4, 4, out));
    for (int i = 0; i < 16; i++)
        CHECK(fabsf(out[i] - want[i]) < 1e-6f, "2x2 -> 4x4 [%d]: %g, torch %g", i, out[i], want[i]);
    /* [C=3, T=2, 5, 7] -> [3, 2, 13, 16]: constant planes, then a linear plane per (c, t) */
    enum { C = 3, T = 2, H = 5, Wd = 7, H2 = 13, W2 = 16 };
    float *a = malloc(sizeof(float) * C * T * H * Wd), *b = malloc(sizeof(float) * C * T * H2 * W2);
    double k[C * T];
    for (int f = 0; f < C * T; f++) {
        k[f] = t_uniform(-3, 3);
        for (int i = 0; i < H * Wd; i++) a[f * H * Wd + i] = (float)k[f];
    }
    CHECK_OK(h3_video_latent_upscale(a, C, T, H, Wd, H2, W2, b));
    int bad = 0;
    for (int f = 0; f < C * T; f++)
        for (int i = 0; i < H2 * W2; i++) bad += b[f * H2 * W2 + i] != (float)k[f];
    CHECK(bad == 0, "%d values of constant planes changed", bad);
    double ca[C * T], cb[C * T];
    for (int f = 0; f < C * T; f++) {
        ca[f] = t_uniform(-1, 1);
        cb[f] = t_uniform(-1, 1);
        for (int y = 0; y < H; y++)
            for (int x = 0; x < Wd; x++) a[(f * H + y) * Wd + x] = (float)(k[f] + ca[f] * y + cb[f] * x);
    }
    CHECK_OK(h3_video_latent_upscale(a, C, T, H, Wd, H2, W2, b));
    double worst = 0;
    int inside = 0;
    for (int f = 0; f < C * T; f++)
        for (int i = 0; i < H2; i++)
            for (int j = 0; j < W2; j++) {
                const double py = (i + 0.5) * H / H2 - 0.5, px = (j + 0.5) * Wd / W2 - 0.5;
                if (py < 0 || px < 0 || py > H - 1 || px > Wd - 1) continue;
                inside++;
                const double e = fabs(b[(f * H2 + i) * W2 + j] - (k[f] + ca[f] * py + cb[f] * px));
                if (e > worst) worst = e;
            }
    CHECK(inside > C * T * H2 * W2 / 2 && worst < 1e-5, "a linear plane: %d inside values, worst error %g",
          inside, worst);
    CHECK_OK(h3_video_latent_upscale(a, C, T, H, Wd, H, Wd, b));
    CHECK(!memcmp(a, b, sizeof(float) * C * T * H * Wd), "the same size is not the identity");
    CHECK_ERR(h3_video_latent_upscale(a, C, T, H, Wd, 0, W2, b), H3_ERR_INVALID, "empty");
    free(a);
    free(b);
}

/* Long clips' windows (pipeline/window.h): whole chunks, spread evenly, the last ending with the clip in video
 * and audio, neighbours overlapping by at least the overlap asked, the fuse weights a crossfade, every latent
 * covered; the prompts' windows; bad windows and overlaps refused. */
static void test_windows(void) {
    /* every clip length of 22 to 60 chunks with windows of 3 to 20 chunks and every allowed overlap */
    int checked = 0;
    for (int64_t n = 1; n <= 60; n++)
        for (int64_t w = 1; w <= 20; w++)
            for (int64_t k = 1; k <= w - 1 || (w == 1 && k == 1); k++) {
                const int64_t frames = 17 * n + 5, window = 17 * w + 5, overlap = 17 * k;
                h3_windows W;
                if (w < 2 && w < n) { /* no overlap fits a one-chunk window */
                    CHECK(h3_windows_make(frames, window, overlap, &W) == H3_ERR_INVALID, "window %lld", (long long)window);
                    h3_clear_error();
                    continue;
                }
                CHECK_OK(h3_windows_make(frames, window, overlap, &W));
                if (w >= n) {
                    CHECK(W.n == 1 && W.win_t == h3_video_latent_frames(frames) && W.v_start[0] == 0, "one window");
                    h3_windows_free(&W);
                    continue;
                }
                CHECK(W.win_t == h3_video_latent_frames(window) && W.win_audio_t == h3_audio_latents(window), "sizes");
                CHECK(W.v_start[0] == 0 && W.a_start[0] == 0, "the first window starts the clip");
                CHECK(W.v_start[W.n - 1] + W.win_t == W.latent_t, "the last ends the clip's video");
                CHECK(W.a_start[W.n - 1] + W.win_audio_t == W.audio_t, "the last ends the clip's audio");
                /* the fewest windows: one fewer could not keep the overlap */
                CHECK(W.n == 1 + (n - w + (w - k) - 1) / (w - k), "%d windows", W.n);
                for (int i = 0; i < W.n; i++) {
                    CHECK(W.v_start[i] % 5 == 0 && W.f_start[i] == W.v_start[i] / 5 * 17, "chunk starts");
                    CHECK(llabs(W.a_start[i] - llround(W.f_start[i] * 40.0 / 24)) <= 1, "audio start %lld for frame %lld",
                          (long long)W.a_start[i], (long long)W.f_start[i]);
                    if (i) {
                        CHECK(W.f_start[i - 1] + window - W.f_start[i] >= overlap, "overlap %lld < %lld",
                              (long long)(W.f_start[i - 1] + window - W.f_start[i]), (long long)overlap);
                        CHECK(W.a_start[i] > W.a_start[i - 1] && W.a_start[i - 1] + W.win_audio_t > W.a_start[i],
                              "audio windows overlap");
                    }
                }
                /* weights: positive, 1 outside the overlaps; a latent's weights over two windows sum to 1 */
                for (int audio = 0; audio < 2; audio++) {
                    const int64_t T = audio ? W.audio_t : W.latent_t, Tw = audio ? W.win_audio_t : W.win_t;
                    const int64_t *st = audio ? W.a_start : W.v_start;
                    for (int64_t t = 0; t < T; t++) {
                        double sum = 0;
                        int cover = 0;
                        for (int i = 0; i < W.n; i++)
                            if (t >= st[i] && t < st[i] + Tw) {
                                const float x = h3_window_weight(&W, i, t - st[i], audio);
                                CHECK(x > 0 && x <= 1, "weight %g", (double)x);
                                sum += x;
                                cover++;
                            }
                        CHECK(cover >= 1, "latent %lld in no window", (long long)t);
                        if (cover <= 2) CHECK(fabs(sum - 1) < 1e-5, "weights sum %g over %d windows", sum, cover);
                    }
                }
                h3_windows_free(&W);
                checked++;
            }
    CHECK(checked > 500, "%d cases", checked);
    /* the prompts: each window takes the one in effect at the middle of its overlap with the one before */
    h3_windows W;
    CHECK_OK(h3_windows_make(719, 56, 17, &W)); /* 30 s: 21 windows */
    CHECK(W.n == 21, "%d windows", W.n);
    int of[64];
    const double starts[2] = {0, 15.0};
    h3_windows_prompts(&W, starts, 2, of);
    for (int k = 0; k < W.n; k++) {
        const double mid = k ? (W.f_start[k] + W.f_start[k - 1] + 56) / 48.0 : 0;
        CHECK(of[k] == (mid >= 15.0), "window %d (overlap middle %.2f s): prompt %d", k, mid, of[k]);
        if (k) CHECK(of[k] >= of[k - 1], "prompts in order");
    }
    h3_windows_free(&W);
    /* bad values */
    const int64_t bad[][3] = {{719, 50, 17}, {719, 5, 17}, {719, 56, 10}, {719, 56, 0}, {719, 56, 51}, {719, 39, 34}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(h3_windows_make(bad[i][0], bad[i][1], bad[i][2], &W) == H3_ERR_INVALID, "window %lld overlap %lld",
              (long long)bad[i][1], (long long)bad[i][2]);
        CHECK(strstr(h3_last_error(), bad[i][1] % 17 == 5 && bad[i][1] > 5 ? "--overlap" : "--window") != NULL, "%s",
              h3_last_error());
        h3_clear_error();
    }
}

int main(int argc, char **argv) {
    static const t_case cases[] = {
        {"sizes", test_sizes},
        {"geometry", test_geometry},
        {"positions_closed_form", test_positions_closed_form},
        {"positions_reference", test_positions_reference},
        {"timestep_indices", test_timestep_indices},
        {"fl2va", test_fl2va},
        {"patchify", test_patchify},
        {"upscale", test_upscale},
        {"windows", test_windows},
        {"errors_and_alloc", test_errors_and_alloc},
        {"cleanup", test_cleanup},
        {NULL, NULL},
    };
    return t_main("test_layout", cases, argc, argv);
}
