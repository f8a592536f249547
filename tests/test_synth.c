/* The synthetic world and the adherence check (src/synth/world.h).
 *
 * split: 324 combinations, 54 held out, every colour, shape, background and motion on both sides.
 * ground_truth: every combination rendered (fixed and random free parameters) and measured: the check must
 * find the scene's colour, motion, pitch and pan every time. captions: H3's fields and the scene's words.
 * mp4: clips written through h3run's MP4 writer (H.264 + AAC) and read back: the check survives compression.
 * noise: random frames and sound must score near chance: the check can fail. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "pipeline/media.h"
#include "synth/world.h"
#include "testutil.h"

enum { W = 64, H = 64, T = 56 };

static void test_split(void) {
    int held = 0, seen[4][8][2];
    memset(seen, 0, sizeof seen);
    for (int k = 0; k < H3_SY_COMBOS; k++) {
        int c, s, b, m, h = h3_synth_heldout(k);
        h3_synth_combo(k, &c, &s, &b, &m);
        held += h;
        seen[0][c][h] = seen[1][s][h] = seen[2][b][h] = seen[3][m][h] = 1;
    }
    CHECK(held == 54, "%d held-out combinations", held);
    const int counts[4] = {H3_SY_COLORS, H3_SY_SHAPES, H3_SY_BACKGROUNDS, H3_SY_MOTIONS};
    for (int a = 0; a < 4; a++)
        for (int v = 0; v < counts[a]; v++)
            CHECK(seen[a][v][0] && seen[a][v][1], "attribute %d value %d is not on both sides of the split",
                  a, v);
    for (int k = 0; k < 54; k++) CHECK(h3_synth_heldout(h3_synth_heldout_combo(k)), "held-out index %d", k);
    CHECK(h3_synth_heldout_combo(54) == -1, "a 55th held-out combination");
}

/* the measured fill's range per shape over the scenes checked (printed: the margins to the thresholds) */
static float g_fill_lo[H3_SY_SHAPES] = {2, 2, 2}, g_fill_hi[H3_SY_SHAPES] = {0, 0, 0};

static float g_place_max; /* the largest start / end distance of the ground truth (printed) */

static void check_scene(const h3_synth_scene *s, int w, int h, int64_t t, const char *what) {
    const int64_t n = h3_synth_samples(t);
    float *rgb = malloc((size_t)(t * 3 * w * h) * sizeof(float));
    float *l = malloc((size_t)n * sizeof(float)), *r = malloc((size_t)n * sizeof(float));
    h3_synth_render(s, w, h, t, rgb, l, r);
    h3_synth_measurement m;
    CHECK_OK(h3_synth_measure(rgb, w, h, t, l, r, n, H3_SY_SAMPLE_RATE, &m));
    h3_synth_score sc;
    h3_synth_score_of(s, &m, &sc);
    CHECK(sc.start && sc.end && sc.first_color && sc.last_color,
          "%s: %s %s moving %s: starts %.3f from its place, ends %.3f; first-frame colour %s, last %s", what,
          h3_synth_color_name(s->color), h3_synth_shape_name(s->shape), h3_synth_motion_name(s->motion),
          sc.start_dist, sc.end_dist, h3_synth_color_name(m.first_color), h3_synth_color_name(m.last_color));
    g_place_max = sc.start_dist > g_place_max ? sc.start_dist : g_place_max;
    g_place_max = sc.end_dist > g_place_max ? sc.end_dist : g_place_max;
    CHECK(sc.color && sc.motion && sc.pitch && sc.pan && sc.shape,
          "%s: %s %s %s %s: measured colour %s, motion %s (dx %.2f dy %.2f swing %.2f), pitch %s, pan %s "
          "(%.2f -> %.2f), expected pan %s, shape %s (fill %.3f)",
          what, h3_synth_color_name(s->color), h3_synth_shape_name(s->shape),
          h3_synth_background_name(s->background), h3_synth_motion_name(s->motion),
          h3_synth_color_name(m.color), h3_synth_motion_name(m.motion), m.dx, m.dy, m.y_swing,
          h3_synth_color_name(m.pitch), h3_synth_pan_name(m.pan), m.pan_start, m.pan_end,
          h3_synth_pan_name(h3_synth_expected_pan(s)), h3_synth_shape_name(m.shape), m.fill);
    g_fill_lo[s->shape] = m.fill < g_fill_lo[s->shape] ? m.fill : g_fill_lo[s->shape];
    g_fill_hi[s->shape] = m.fill > g_fill_hi[s->shape] ? m.fill : g_fill_hi[s->shape];
    free(rgb);
    free(l);
    free(r);
}

static void test_ground_truth(void) {
    for (int k = 0; k < H3_SY_COMBOS; k++) {
        h3_synth_scene s;
        h3_synth_scene_make(k, 0, &s);
        check_scene(&s, W, H, T, "fixed");
        h3_synth_scene_make(k, 1000 + (uint64_t)k * 7919, &s);
        check_scene(&s, W, H, T, "random");
    }
    /* other canvases and lengths: 17n+5 frames */
    h3_synth_scene s;
    h3_synth_scene_make(h3_synth_heldout_combo(7), 5, &s);
    check_scene(&s, 128, 96, 22, "128x96, 22 frames");
    check_scene(&s, 96, 128, 73, "96x128, 73 frames");
    printf("  start and end places: within %.4f of the scene's (the tolerance is %.2f)\n", g_place_max,
           H3_SY_PLACE_TOL);
    for (int sh = 0; sh < H3_SY_SHAPES; sh++)
        printf("  %s: fill %.3f .. %.3f (square from 0.89; a triangle by its lower half)\n", h3_synth_shape_name(sh),
               g_fill_lo[sh], g_fill_hi[sh]);
}

/* The start / end score tells scenes apart by where they are: a clip scored against the same combination drawn
 * with another seed is right where the two scenes' places agree (within half the tolerance) and wrong where they
 * are twice the tolerance apart. */
static void test_places(void) {
    const int64_t n = h3_synth_samples(T);
    float *rgb = malloc((size_t)(T * 3 * W * H) * sizeof(float));
    float *l = malloc((size_t)n * sizeof(float)), *r = malloc((size_t)n * sizeof(float));
    int apart = 0, close = 0;
    for (int k = 0; k < H3_SY_COMBOS; k += 5) {
        h3_synth_scene a, b;
        h3_synth_scene_make(k, 77 + (uint64_t)k, &a);
        h3_synth_scene_make(k, 5077 + (uint64_t)k, &b);
        h3_synth_render(&a, W, H, T, rgb, l, r);
        h3_synth_measurement m;
        CHECK_OK(h3_synth_measure(rgb, W, H, T, l, r, n, H3_SY_SAMPLE_RATE, &m));
        h3_synth_score sc;
        h3_synth_score_of(&b, &m, &sc);
        float xa, ya, xb, yb;
        h3_synth_position(&a, 0, T, &xa, &ya, NULL);
        h3_synth_position(&b, 0, T, &xb, &yb, NULL);
        const float d = hypotf(xa - xb, ya - yb);
        if (d > 2 * H3_SY_PLACE_TOL) {
            apart++;
            CHECK(!sc.start, "combination %d: scenes %.3f apart, scored as starting in place (%.3f)", k, d,
                  sc.start_dist);
        } else if (d < 0.5f * H3_SY_PLACE_TOL) {
            close++;
            CHECK(sc.start, "combination %d: scenes %.3f apart, scored as starting elsewhere (%.3f)", k, d,
                  sc.start_dist);
        }
        CHECK(sc.first_color && sc.last_color, "combination %d: the first / last frame's colour", k);
    }
    CHECK(apart >= 10 && close >= 5, "too few scene pairs to tell: %d apart, %d close", apart, close);
    printf("  places: %d scene pairs apart scored wrong, %d close scored right\n", apart, close);
    free(rgb);
    free(l);
    free(r);
}

static void test_captions(void) {
    char a[512], b[512];
    for (int k = 0; k < H3_SY_COMBOS; k++) {
        h3_synth_scene s;
        h3_synth_scene_make(k, (uint64_t)k + 1, &s);
        int len = h3_synth_caption(&s, a, sizeof a);
        CHECK(len > 0 && len < (int)sizeof a, "caption length %d", len);
        h3_synth_caption(&s, b, sizeof b);
        CHECK(!strcmp(a, b), "captions differ between calls");
        CHECK(!strncmp(a, "integrated_multimodal_description: [Shot 1] ", 44), "caption start: %s", a);
        CHECK(strstr(a, " overall_soundscape: ") && strstr(a, "non_diegetic_music: none."), "fields: %s", a);
        CHECK(strstr(a, h3_synth_color_name(s.color)) && strstr(a, h3_synth_shape_name(s.shape)) &&
                  strstr(a, h3_synth_background_name(s.background)),
              "caption lacks the scene's words: %s", a);
        if (s.motion == H3_SY_BOUNCE) CHECK(strstr(a, "click"), "bounce without a click: %s", a);
        /* the ref2va form: the shape from the picture, no colour and no pitch word, the rest the same fields */
        len = h3_synth_caption_reference(&s, b, sizeof b);
        CHECK(len > 0 && len < (int)sizeof b, "reference caption length %d", len);
        char from[64];
        snprintf(from, sizeof from, "%s from <Picture 1>", h3_synth_shape_name(s.shape));
        CHECK(strstr(b, from) && strstr(b, h3_synth_background_name(s.background)) && strstr(b, "Its own tone"),
              "reference caption lacks the shape from the picture: %s", b);
        for (int col = 0; col < H3_SY_COLORS; col++)
            CHECK(!strstr(b, h3_synth_color_name(col)), "reference caption names a colour: %s", b);
        CHECK(!strstr(b, "low") && !strstr(b, "high") && !strstr(b, "middle tone") && !strstr(b, "bright"),
              "reference caption names a pitch: %s", b);
        const char *pa = strstr(a, " tone"), *pb = strstr(b, "Its own tone");
        CHECK(pa && pb && !strcmp(pa + 5, pb + 12), "the sound's pan and click differ: %s | %s", a, b);
    }
    h3_synth_scene s;
    h3_synth_scene_make(h3_synth_heldout_combo(0), 0, &s);
    h3_synth_caption(&s, a, sizeof a);
    printf("  held-out prompt 0: %s\n", a);
}

static void test_mp4(void) {
    for (int m = 0; m < H3_SY_MOTIONS; m++) {
        const int k = m * (H3_SY_COLORS * H3_SY_SHAPES * H3_SY_BACKGROUNDS) + (m * 7) % 18;
        h3_synth_scene s;
        h3_synth_scene_make(k, 77 + (uint64_t)m, &s);
        const int64_t n = h3_synth_samples(T);
        float *rgb = malloc((size_t)(T * 3 * 128 * 128) * sizeof(float));
        float *l = malloc((size_t)n * sizeof(float)), *r = malloc((size_t)n * sizeof(float));
        h3_synth_render(&s, 128, 128, T, rgb, l, r);
        char path[1024];
        t_tmp_path("synth.mp4", path, sizeof path);
        h3_mp4_opts o;
        h3_mp4_opts_default(&o, 128, 128);
        h3_mp4 *mp = NULL;
        CHECK_OK(h3_mp4_open(path, &o, &mp));
        for (int64_t f = 0; f < T && mp; f++)
            CHECK_OK(h3_mp4_write_frame(mp, rgb + f * 3 * 128 * 128, 128 * 128, 128));
        if (mp) CHECK_OK(h3_mp4_write_audio(mp, l, r, n));
        if (mp) CHECK_OK(h3_mp4_finish(mp));
        h3_clip c;
        CHECK_OK(h3_clip_read(path, &c));
        CHECK(c.frames == T && c.width == 128 && c.height == 128 && c.channels == 2 && c.sample_rate == 32000,
              "read back %lld frames %dx%d, %d channels at %d Hz", (long long)c.frames, c.width, c.height,
              c.channels, c.sample_rate);
        CHECK(fabs(c.fps - 24.0) < 1e-6, "fps %.3f", c.fps);
        h3_synth_measurement me;
        CHECK_OK(h3_synth_measure(c.rgb, c.width, c.height, c.frames, c.left, c.right, c.samples,
                                  c.sample_rate, &me));
        h3_synth_score sc;
        h3_synth_score_of(&s, &me, &sc);
        CHECK(sc.start && sc.end && sc.first_color && sc.last_color,
              "mp4 %s: starts %.3f from its place, ends %.3f; first-frame colour %s, last %s",
              h3_synth_motion_name(s.motion), sc.start_dist, sc.end_dist, h3_synth_color_name(me.first_color),
              h3_synth_color_name(me.last_color));
        CHECK(sc.color && sc.motion && sc.pitch && sc.pan && sc.shape,
              "mp4 %s: colour %s motion %s pitch %s pan %s shape %s (fill %.3f)", h3_synth_motion_name(s.motion),
              h3_synth_color_name(me.color), h3_synth_motion_name(me.motion), h3_synth_color_name(me.pitch),
              h3_synth_pan_name(me.pan), h3_synth_shape_name(me.shape), me.fill);
        h3_clip_free(&c);
        unlink(path);
        free(rgb);
        free(l);
        free(r);
    }
    h3_clip c;
    CHECK_ERR(h3_clip_read("/nonexistent/clip.mp4", &c), H3_ERR_IO, "/nonexistent/clip.mp4");
    /* garbage and truncated files: an error or a shorter clip, never a crash, nothing leaked */
    char path[1024];
    t_tmp_path("bad.mp4", path, sizeof path);
    FILE *f = fopen(path, "wb");
    for (int i = 0; f && i < 4096; i++) fputc((int)(t_rand_u64() & 255), f);
    if (f) fclose(f);
    h3_mem_stats m0, m1;
    h3_mem_get_stats(&m0);
    CHECK(h3_clip_read(path, &c) != H3_OK, "random bytes read as a clip");
    h3_clear_error();
    h3_mem_get_stats(&m1);
    CHECK(m1.total_current == m0.total_current, "a failed read holds %lld bytes", (long long)(m1.total_current - m0.total_current));
    {
        h3_synth_scene s;
        h3_synth_scene_make(3, 0, &s);
        float *rgb = malloc((size_t)(T * 3 * 64 * 64) * sizeof(float));
        h3_synth_render(&s, 64, 64, T, rgb, NULL, NULL);
        char good[1024];
        t_tmp_path("good.mp4", good, sizeof good);
        h3_mp4_opts o;
        h3_mp4_opts_default(&o, 64, 64);
        o.sample_rate = 0; /* video only */
        h3_mp4 *mp = NULL;
        CHECK_OK(h3_mp4_open(good, &o, &mp));
        for (int64_t fr = 0; fr < T && mp; fr++) CHECK_OK(h3_mp4_write_frame(mp, rgb + fr * 3 * 64 * 64, 64 * 64, 64));
        if (mp) CHECK_OK(h3_mp4_finish(mp));
        free(rgb);
        CHECK_OK(h3_clip_read(good, &c));
        CHECK(c.frames == T && c.samples == 0 && c.channels == 0, "video only: %lld frames, %lld samples",
              (long long)c.frames, (long long)c.samples);
        h3_clip_free(&c);
        FILE *g = fopen(good, "rb");
        long n = 0;
        unsigned char *bytes = NULL;
        if (g) {
            fseek(g, 0, SEEK_END);
            n = ftell(g);
            fseek(g, 0, SEEK_SET);
            bytes = malloc((size_t)n + 1);
            if (bytes && fread(bytes, 1, (size_t)n, g) != (size_t)n) n = 0;
            fclose(g);
        }
        int cuts = 0;
        for (long cut = 16; bytes && cut < n; cut = cut * 2 + 7, cuts++) { /* prefixes of growing length */
            g = fopen(good, "wb");
            if (!g) break;
            fwrite(bytes, 1, (size_t)cut, g);
            fclose(g);
            h3_mem_get_stats(&m0);
            h3_status st = h3_clip_read(good, &c);
            if (st == H3_OK) {
                CHECK(c.frames >= 1 && c.frames <= T, "cut at %ld: %lld frames", cut, (long long)c.frames);
                h3_clip_free(&c);
            }
            h3_clear_error();
            h3_mem_get_stats(&m1);
            CHECK(m1.total_current == m0.total_current, "cut at %ld: %lld bytes held", cut,
                  (long long)(m1.total_current - m0.total_current));
        }
        CHECK(cuts >= 8, "only %d cuts of a %ld-byte file", cuts, n);
        free(bytes);
        unlink(good);
    }
    unlink(path);
}

static void test_noise(void) {
    int hits[5] = {0, 0, 0, 0, 0};
    const int64_t n = h3_synth_samples(T);
    float *rgb = malloc((size_t)(T * 3 * W * H) * sizeof(float));
    float *l = malloc((size_t)n * sizeof(float)), *r = malloc((size_t)n * sizeof(float));
    for (int k = 0; k < 54; k++) {
        h3_synth_scene s;
        h3_synth_scene_make(h3_synth_heldout_combo(k), 0, &s);
        for (int64_t i = 0; i < T * 3 * W * H; i++) rgb[i] = (float)(t_rand_u64() % 1000) / 999.0f;
        t_fill_randn(l, (size_t)n, 0.1);
        t_fill_randn(r, (size_t)n, 0.1);
        h3_synth_measurement m;
        CHECK_OK(h3_synth_measure(rgb, W, H, T, l, r, n, H3_SY_SAMPLE_RATE, &m));
        h3_synth_score sc;
        h3_synth_score_of(&s, &m, &sc);
        hits[0] += sc.color, hits[1] += sc.motion, hits[2] += sc.pitch, hits[3] += sc.pan, hits[4] += sc.shape;
    }
    printf("  noise over the 54 held-out prompts: colour %d, motion %d, pitch %d, pan %d, shape %d right\n",
           hits[0], hits[1], hits[2], hits[3], hits[4]);
    for (int a = 0; a < 3; a++) CHECK(hits[a] <= 20, "noise scores %d of 54 on attribute %d", hits[a], a);
    CHECK(hits[4] <= 20, "noise scores %d of 54 on the shape", hits[4]);
    free(rgb);
    free(l);
    free(r);
}

int main(int argc, char **argv) {
    static const t_case cases[] = {{"split", test_split},       {"ground_truth", test_ground_truth}, {"places", test_places},
                                   {"captions", test_captions}, {"mp4", test_mp4},
                                   {"noise", test_noise},       {NULL, NULL}};
    return t_main("test_synth", cases, argc, argv);
}
