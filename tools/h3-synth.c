/* h3-synth: the synthetic world of h3run's small trained model (src/synth/world.h): training data, the
 * held-out prompts, single clips, and the adherence check of a generated clip.
 *
 *   h3-synth prompts                          the 54 held-out prompts, one per line (index, combination,
 * caption) h3-synth prompt K [--reference]           held-out prompt K alone (for a shell loop; --reference: its
 * ref2va form, the shape "from <Picture 1>", colour and pitch unsaid) h3-synth clip
 * OUT.mp4 [--combo K | --heldout K] [--seed S] [--frames T] [--size WxH] one scene as an MP4 (H.264 + AAC), to look at and
 * listen to h3-synth frame OUT.png [--combo K | --heldout K] [--seed S] [--at F|last] [--frames T] [--size WxH]
 * one frame of a scene as a PNG (a keyframe for generate's --first-frame / --last-frame) h3-synth
 * check CLIP.mp4 --heldout K [--seed S] [--json] measures the clip (colour, motion, pitch, pan, shape, and where
 * and in which colour it starts and ends) and scores it against held-out prompt K (with --seed: the scene of that
 * seed, whose start and end places its keyframes show); exit 0 whatever the score (3: unreadable clip) h3-synth dataset DIR
 * [--clips N] [--frames T] [--size WxH] [--seed S] [--shard M] [--motion NAME] N training clips
 * (held-out combinations never appear) as DIR/shard-XXXX.safetensors (video U8 [m, T, H, W, 3], audio F32 [m, 2,
 * samples], combo I32 [m]) and DIR/captions.jsonl (each clip's caption and its ref2va form); --motion renders every clip with that motion (its sound too), the
 * captions unchanged (what the small model's bounce LoRA learns from)
 *
 * Defaults: 56 frames (2.33 s at 24 fps), 128x128, seed 1, 256 clips per shard. Exit status 2 for a bad
 * command line, 1 for a failed job (with one line naming the cause). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "base/status.h"
#include "io/safetensors.h"
#include "pipeline/layout.h"
#include "pipeline/media.h"
#include "pipeline/window.h"
#include "synth/world.h"

static int usage(const char *why) {
    fprintf(
        stderr,
        "h3-synth: %s\n"
        "usage: h3-synth prompts | prompt K [--reference] | clip OUT.mp4 [--combo K | --heldout K] [--seed S] [--frames T] [--size WxH]\n"
        "       | frame OUT.png [--combo K | --heldout K] [--seed S] [--at F|last] [--frames T] [--size WxH]\n"
        "       | check CLIP.mp4 --heldout K [--seed S] [--from F] [--to F] [--json]\n"
        "       | seams CLIP.mp4 --window N --overlap N [--json] | dataset DIR [--clips N] [--frames T] [--size WxH]\n"
        "         [--seed S] [--shard M] [--motion left|right|up|down|bounce|stay]\n",
        why);
    return 2;
}

static int fail(void) {
    fprintf(stderr, "h3-synth: error: %s\n", h3_last_error());
    return 1;
}

typedef struct {
    int combo, heldout, frames, w, h, clips, shard, json, text_tokens;
    int from, to;            /* check: the frames [from, to) only (to 0: to the end) */
    int window, overlap;     /* seams: the windows the clip was sampled in */
    int motion;              /* dataset: every clip shows this motion (-1: its combination's), captions unchanged */
    int at;                  /* frame: the frame (-1: the last) */
    int seed_given;          /* check: --seed was given (the scene of that seed, else the fixed one) */
    uint64_t seed;
} args;

static int parse_int(const char *s, long lo, long hi, int *out) {
    char *e;
    errno = 0;
    long v = strtol(s, &e, 10);
    if (errno || *e || e == s || v < lo || v > hi) return 0;
    *out = (int)v;
    return 1;
}

static int parse_opts(int argc, char **argv, int i, args *a) {
    for (; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "--json")) {
            a->json = 1;
            continue;
        }
        if (!v) return usage("an option lacks its value");
        i++;
        if (!strcmp(o, "--combo")) {
            if (!parse_int(v, 0, H3_SY_COMBOS - 1, &a->combo)) return usage("--combo takes 0..323");
        } else if (!strcmp(o, "--heldout")) {
            if (!parse_int(v, 0, 53, &a->heldout)) return usage("--heldout takes 0..53");
        } else if (!strcmp(o, "--frames")) {
            if (!parse_int(v, 5, 10000, &a->frames) || (a->frames - 5) % 17)
                return usage("--frames takes 17n+5 (22, 39, 56, 73, ...)");
        } else if (!strcmp(o, "--size")) {
            if (sscanf(v, "%dx%d", &a->w, &a->h) != 2 || a->w < 16 || a->h < 16 || a->w > 4096 ||
                a->h > 4096 || a->w % 16 || a->h % 16)
                return usage("--size takes WxH, multiples of 16 from 16 to 4096");
        } else if (!strcmp(o, "--clips")) {
            if (!parse_int(v, 1, 10000000, &a->clips)) return usage("--clips takes a positive count");
        } else if (!strcmp(o, "--text-tokens")) {
            if (!parse_int(v, 1, 65536, &a->text_tokens)) return usage("--text-tokens takes 1..65536");
        } else if (!strcmp(o, "--from")) {
            if (!parse_int(v, 0, 10000000, &a->from)) return usage("--from takes a frame number");
        } else if (!strcmp(o, "--to")) {
            if (!parse_int(v, 1, 10000000, &a->to)) return usage("--to takes a frame number");
        } else if (!strcmp(o, "--window")) {
            if (!parse_int(v, 22, 10000000, &a->window)) return usage("--window takes a frame count");
        } else if (!strcmp(o, "--overlap")) {
            if (!parse_int(v, 17, 10000000, &a->overlap)) return usage("--overlap takes a frame count");
        } else if (!strcmp(o, "--motion")) {
            a->motion = -1;
            for (int k = 0; k < H3_SY_MOTIONS; k++)
                if (!strcmp(v, h3_synth_motion_name(k))) a->motion = k;
            if (a->motion < 0) return usage("--motion takes left, right, up, down, bounce or stay");
        } else if (!strcmp(o, "--shard")) {
            if (!parse_int(v, 1, 100000, &a->shard)) return usage("--shard takes a positive count");
        } else if (!strcmp(o, "--at")) {
            if (!strcmp(v, "last"))
                a->at = -1;
            else if (!parse_int(v, 0, 10000000, &a->at))
                return usage("--at takes a frame number or last");
        } else if (!strcmp(o, "--seed")) {
            char *e;
            a->seed = strtoull(v, &e, 10);
            if (*e || e == v || v[0] == '-') return usage("--seed takes a non-negative integer");
            a->seed_given = 1;
        } else {
            return usage("unknown option");
        }
    }
    return 0;
}

static int cmd_prompts(void) {
    char buf[512];
    for (int k = 0; k < 54; k++) {
        h3_synth_scene s;
        const int c = h3_synth_heldout_combo(k);
        h3_synth_scene_make(c, 0, &s);
        h3_synth_caption(&s, buf, sizeof buf);
        printf("%d\t%d\t%s\n", k, c, buf);
    }
    return 0;
}

static int render_alloc(const args *a, float **rgb, float **l, float **r, int64_t *n) {
    *n = h3_synth_samples(a->frames);
    *rgb = h3_malloc((size_t)a->frames * 3 * (size_t)a->w * a->h * sizeof(float), H3_MEM_IO);
    *l = h3_malloc((size_t)*n * sizeof(float), H3_MEM_IO);
    *r = h3_malloc((size_t)*n * sizeof(float), H3_MEM_IO);
    if (!*rgb || !*l || !*r) {
        h3_free(*rgb), h3_free(*l), h3_free(*r);
        H3_ERR(H3_ERR_NOMEM, "out of memory for a %dx%d clip of %d frames", a->w, a->h, a->frames);
        return 0;
    }
    return 1;
}

static int cmd_clip(const char *out, const args *a) {
    h3_synth_scene s;
    const int k = a->heldout >= 0 ? h3_synth_heldout_combo(a->heldout) : a->combo;
    h3_synth_scene_make(k, a->seed, &s);
    float *rgb, *l, *r;
    int64_t n;
    if (!render_alloc(a, &rgb, &l, &r, &n)) return fail();
    h3_synth_render(&s, a->w, a->h, a->frames, rgb, l, r);
    h3_mp4_opts o;
    h3_mp4_opts_default(&o, a->w, a->h);
    h3_mp4 *m = NULL;
    h3_status st = h3_mp4_open(out, &o, &m);
    const int64_t P = (int64_t)a->w * a->h;
    for (int64_t f = 0; f < a->frames && st == H3_OK; f++)
        st = h3_mp4_write_frame(m, rgb + f * 3 * P, P, a->w);
    if (st == H3_OK) st = h3_mp4_write_audio(m, l, r, n);
    if (st == H3_OK)
        st = h3_mp4_finish(m);
    else if (m)
        h3_mp4_abort(m);
    h3_free(rgb), h3_free(l), h3_free(r);
    if (st != H3_OK) return fail();
    char cap[512];
    h3_synth_caption(&s, cap, sizeof cap);
    printf("wrote %s: combination %d, %s\n", out, k, cap);
    return 0;
}

static int cmd_frame(const char *out, const args *a) {
    const int k = a->heldout >= 0 ? h3_synth_heldout_combo(a->heldout) : a->combo;
    const int64_t f = a->at < 0 ? a->frames - 1 : a->at;
    if (f >= a->frames) return usage("--at is past the clip's last frame");
    h3_synth_scene s;
    h3_synth_scene_make(k, a->seed, &s);
    /* the whole clip (where the shape is at frame f depends on the clip's length), then that frame */
    float *rgb = h3_malloc((size_t)a->frames * 3 * (size_t)a->w * a->h * sizeof(float), H3_MEM_IO);
    if (!rgb) {
        H3_ERR(H3_ERR_NOMEM, "out of memory for a %dx%d clip of %d frames", a->w, a->h, a->frames);
        return fail();
    }
    h3_synth_render(&s, a->w, a->h, a->frames, rgb, NULL, NULL);
    const int64_t P = (int64_t)a->w * a->h;
    const h3_status st = h3_png_write(out, rgb + f * 3 * P, P, a->w, a->w, a->h);
    h3_free(rgb);
    if (st != H3_OK) return fail();
    printf("wrote %s: frame %lld of %d of combination %d (seed %llu)\n", out, (long long)f, a->frames, k,
           (unsigned long long)a->seed);
    return 0;
}

static int cmd_check(const char *path, const args *a) {
    if (a->heldout < 0) return usage("check needs --heldout K");
    h3_clip c;
    if (h3_clip_read(path, &c) != H3_OK) {
        fprintf(stderr, "h3-synth: error: %s\n", h3_last_error());
        return 3;
    }
    h3_synth_scene s;
    h3_synth_scene_make(h3_synth_heldout_combo(a->heldout), a->seed_given ? a->seed : 0, &s);
    /* a part of the clip: frames [from, to) and their sound */
    const int64_t f0 = a->from, f1 = a->to ? a->to : c.frames;
    if (f0 >= f1 || f1 > c.frames) {
        h3_clip_free(&c);
        fprintf(stderr, "h3-synth: error: --from %lld --to %lld: the clip has %lld frames\n", (long long)f0,
                (long long)f1, (long long)c.frames);
        return 2;
    }
    const int64_t s0 = c.samples ? (int64_t)llround((double)f0 * c.sample_rate / c.fps) : 0;
    int64_t s1 = c.samples ? (int64_t)llround((double)f1 * c.sample_rate / c.fps) : 0;
    if (s1 > c.samples) s1 = c.samples;
    h3_synth_measurement m;
    h3_status st = h3_synth_measure(c.rgb + f0 * 3 * (int64_t)c.width * c.height, c.width, c.height, f1 - f0,
                                    s1 > s0 ? c.left + s0 : NULL, s1 > s0 ? c.right + s0 : NULL, s1 - s0,
                                    c.sample_rate, &m);
    h3_clip_free(&c);
    if (st != H3_OK) return fail();
    h3_synth_score sc;
    h3_synth_score_of(&s, &m, &sc);
    if (a->json)
        printf("{\"heldout\": %d, \"expected\": {\"color\": \"%s\", \"motion\": \"%s\", \"pan\": \"%s\", "
               "\"shape\": \"%s\"}, \"measured\": {\"color\": \"%s\", \"motion\": \"%s\", \"pitch\": \"%s\", "
               "\"pan\": \"%s\", \"shape\": \"%s\", \"fill\": %.3f, \"first_color\": \"%s\", \"last_color\": "
               "\"%s\", \"start_dist\": %.4f, \"end_dist\": %.4f}, \"right\": {\"color\": %d, \"motion\": %d, "
               "\"pitch\": %d, \"pan\": %d, \"shape\": %d, \"start\": %d, \"end\": %d, \"first_color\": %d, "
               "\"last_color\": %d}}\n",
               a->heldout, h3_synth_color_name(s.color), h3_synth_motion_name(s.motion),
               h3_synth_pan_name(h3_synth_expected_pan(&s)), h3_synth_shape_name(s.shape),
               h3_synth_color_name(m.color), h3_synth_motion_name(m.motion), h3_synth_color_name(m.pitch),
               h3_synth_pan_name(m.pan), h3_synth_shape_name(m.shape), m.fill, h3_synth_color_name(m.first_color),
               h3_synth_color_name(m.last_color), sc.start_dist, sc.end_dist, sc.color, sc.motion, sc.pitch, sc.pan,
               sc.shape, sc.start, sc.end, sc.first_color, sc.last_color);
    else {
        printf("held-out %d: colour %s (%s), motion %s (%s), pitch %s (%s), pan %s (%s), shape %s (%s)", a->heldout,
               h3_synth_color_name(m.color), sc.color ? "right" : "wrong", h3_synth_motion_name(m.motion),
               sc.motion ? "right" : "wrong", h3_synth_color_name(m.pitch), sc.pitch ? "right" : "wrong",
               h3_synth_pan_name(m.pan), sc.pan ? "right" : "wrong", h3_synth_shape_name(m.shape),
               sc.shape ? "right" : "wrong");
        /* where it starts and ends: against a seed's scene, whose places its keyframes show */
        if (a->seed_given)
            printf("; starts %.3f from its place (%s) in %s (%s), ends %.3f (%s) in %s (%s)", sc.start_dist,
                   sc.start ? "right" : "wrong", h3_synth_color_name(m.first_color), sc.first_color ? "right" : "wrong",
                   sc.end_dist, sc.end ? "right" : "wrong", h3_synth_color_name(m.last_color),
                   sc.last_color ? "right" : "wrong");
        printf("\n");
    }
    return 0;
}

static int cmd_layout(const char *path, const args *a) {
    if (a->text_tokens < 1) return usage("layout needs --text-tokens L");
    if (a->w % 32 || a->h % 32) return usage("layout needs --size WxH in multiples of 32 (h3run's canvases)");
    h3_seq_layout L;
    if (h3_seq_layout_t2va(a->text_tokens, NULL, a->frames, a->w, a->h, &L) != H3_OK) return fail();
    const int64_t S = L.seq_len;
    int32_t *tags = h3_malloc((size_t)S * sizeof(int32_t), H3_MEM_IO);
    int64_t shape4[4] = {L.latent_t, L.latent_h, L.latent_w, L.audio_t};
    h3_status st = tags ? H3_OK : H3_ERR(H3_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; tags && i < S; i++) tags[i] = L.tags[i];
    h3_st_writer *w = NULL;
    if (st == H3_OK) st = h3_st_writer_new(&w);
    const int64_t s1[1] = {S}, s2[2] = {S, 3}, sv[1] = {L.n_video_rows}, sa[1] = {L.n_audio_rows},
                  stx[1] = {L.text_len}, s4[1] = {4};
    if (st == H3_OK) st = h3_st_writer_add(w, "token_tags", H3_I32, 1, s1, tags);
    if (st == H3_OK) st = h3_st_writer_add(w, "position_ids", H3_F64, 2, s2, L.pos);
    if (st == H3_OK) st = h3_st_writer_add(w, "video_indices", H3_I64, 1, sv, L.video_indices);
    if (st == H3_OK) st = h3_st_writer_add(w, "audio_indices", H3_I64, 1, sa, L.audio_indices);
    if (st == H3_OK) st = h3_st_writer_add(w, "text_indices", H3_I64, 1, stx, L.text_indices);
    if (st == H3_OK) st = h3_st_writer_add(w, "latent_shape", H3_I64, 1, s4, shape4);
    if (st == H3_OK) st = h3_st_writer_write(w, path, 0);
    h3_st_writer_free(w);
    h3_free(tags);
    h3_seq_layout_free(&L);
    if (st != H3_OK) return fail();
    printf("wrote %s: %lld rows (%d text, %lld audio, %lld video)\n", path, (long long)S, a->text_tokens,
           (long long)shape4[3] * 2, (long long)(S - a->text_tokens - shape4[3] * 2));
    return 0;
}

static int cmd_dataset(const char *dir, const args *a) {
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        H3_ERR(H3_ERR_IO, "cannot create %s: %s", dir, strerror(errno));
        return fail();
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/captions.jsonl", dir);
    FILE *cap = fopen(path, "w");
    if (!cap) {
        H3_ERR(H3_ERR_IO, "cannot write %s: %s", path, strerror(errno));
        return fail();
    }
    const int64_t n = h3_synth_samples(a->frames), P = (int64_t)a->w * a->h, T = a->frames;
    float *rgb, *l, *r;
    int64_t nn;
    if (!render_alloc(a, &rgb, &l, &r, &nn)) return fail();
    const int M = a->shard;
    uint8_t *video = h3_malloc((size_t)M * T * P * 3, H3_MEM_IO);
    float *audio = h3_malloc((size_t)M * 2 * n * sizeof(float), H3_MEM_IO);
    int32_t *combos = h3_malloc((size_t)M * sizeof(int32_t), H3_MEM_IO);
    if (!video || !audio || !combos) {
        H3_ERR(H3_ERR_NOMEM, "out of memory for a shard of %d clips", M);
        return fail();
    }
    uint64_t st_seed = a->seed * 0x9E3779B97F4A7C15ull + 1;
    int written = 0, shard = 0;
    h3_status st = H3_OK;
    while (written < a->clips && st == H3_OK) {
        const int m = a->clips - written < M ? a->clips - written : M;
        for (int i = 0; i < m; i++) {
            int k;
            do { /* a training combination */
                st_seed = st_seed * 6364136223846793005ull + 1442695040888963407ull;
                k = (int)((st_seed >> 33) % H3_SY_COMBOS);
            } while (h3_synth_heldout(k));
            h3_synth_scene s;
            h3_synth_scene_make(k, st_seed | 1, &s);
            /* --motion: the clip shows the combination with that motion (same seed, so the same free parameters
             * where they apply); the caption stays its own */
            int cc, csh, cb, cm;
            h3_synth_combo(k, &cc, &csh, &cb, &cm);
            if (a->motion >= 0) cm = a->motion;
            h3_synth_scene shown;
            h3_synth_scene_make(cc + H3_SY_COLORS * (csh + H3_SY_SHAPES * (cb + H3_SY_BACKGROUNDS * cm)), st_seed | 1,
                                &shown);
            h3_synth_render(&shown, a->w, a->h, T, rgb, l, r);
            uint8_t *v = video + (size_t)i * T * P * 3;
            for (int64_t f = 0; f < T; f++)
                for (int64_t p = 0; p < P; p++)
                    for (int c = 0; c < 3; c++) {
                        float x = rgb[(f * 3 + c) * P + p];
                        v[(f * P + p) * 3 + c] = (uint8_t)(x <= 0   ? 0
                                                           : x >= 1 ? 255
                                                                    : (int)(x * 255.0f + 0.5f));
                    }
            memcpy(audio + (size_t)i * 2 * n, l, (size_t)n * sizeof(float));
            memcpy(audio + (size_t)i * 2 * n + n, r, (size_t)n * sizeof(float));
            combos[i] = k;
            char c[512], rc[512];
            h3_synth_caption(&s, c, sizeof c);
            h3_synth_caption_reference(&s, rc, sizeof rc);
            fprintf(cap,
                    "{\"shard\": %d, \"index\": %d, \"combo\": %d, \"color\": \"%s\", \"shape\": \"%s\", "
                    "\"background\": \"%s\", \"motion\": \"%s\", \"shown_motion\": \"%s\", \"caption\": \"%s\", "
                    "\"reference_caption\": \"%s\"}\n",
                    shard, i, k, h3_synth_color_name(s.color), h3_synth_shape_name(s.shape),
                    h3_synth_background_name(s.background), h3_synth_motion_name(s.motion),
                    h3_synth_motion_name(shown.motion), c, rc);
        }
        h3_st_writer *w = NULL;
        st = h3_st_writer_new(&w);
        const int64_t vs[5] = {m, T, a->h, a->w, 3}, as[3] = {m, 2, n}, cs[1] = {m};
        if (st == H3_OK) st = h3_st_writer_add(w, "video", H3_U8, 5, vs, video);
        if (st == H3_OK) st = h3_st_writer_add(w, "audio", H3_F32, 3, as, audio);
        if (st == H3_OK) st = h3_st_writer_add(w, "combo", H3_I32, 1, cs, combos);
        snprintf(path, sizeof path, "%s/shard-%04d.safetensors", dir, shard);
        if (st == H3_OK) st = h3_st_writer_write(w, path, 0);
        h3_st_writer_free(w);
        written += m;
        shard++;
        fprintf(stderr, "\rh3-synth: %d of %d clips", written, a->clips);
    }
    fprintf(stderr, "\n");
    fclose(cap);
    h3_free(video), h3_free(audio), h3_free(combos), h3_free(rgb), h3_free(l), h3_free(r);
    if (st != H3_OK) return fail();
    printf("wrote %d clips of %d frames at %dx%d in %d shards to %s\n", written, a->frames, a->w, a->h, shard,
           dir);
    return 0;
}

/* How smooth a clip sampled in overlapping windows is where the windows meet: the mean absolute difference of
 * each frame from the one before (d), its largest value inside a single window and inside the overlaps, and
 * the same for the sound's sample-to-sample steps. */
static int cmd_seams(const char *path, const args *a) {
    if (!a->window || !a->overlap) return usage("seams needs --window N --overlap N (generate's)");
    h3_clip c;
    if (h3_clip_read(path, &c) != H3_OK) {
        fprintf(stderr, "h3-synth: error: %s\n", h3_last_error());
        return 3;
    }
    h3_windows w;
    if (h3_windows_make(c.frames, a->window, a->overlap, &w) != H3_OK) {
        h3_clip_free(&c);
        return fail();
    }
    const int64_t plane = (int64_t)c.width * c.height;
    double in_max = 0, ov_max = 0, in_sum = 0;
    int64_t in_n = 0, ov_at = -1;
    double ain_max = 0, aov_max = 0;
    for (int64_t f = 1; f < c.frames; f++) {
        int cover = 0; /* windows holding both frames */
        for (int k = 0; k < w.n; k++)
            if (f - 1 >= w.f_start[k] && f < w.f_start[k] + w.window) cover++;
        double d = 0;
        const float *x = c.rgb + f * 3 * plane, *y = x - 3 * plane;
        for (int64_t i = 0; i < 3 * plane; i++) d += fabs((double)x[i] - y[i]);
        d /= (double)(3 * plane);
        if (cover > 1) {
            if (d > ov_max) ov_max = d, ov_at = f;
        } else {
            if (d > in_max) in_max = d;
            in_sum += d;
            in_n++;
        }
        for (int64_t s = (int64_t)llround((f - 1) * c.sample_rate / c.fps) + 1;
             c.samples && s < (int64_t)llround(f * c.sample_rate / c.fps) && s < c.samples; s++) {
            const double da = fmax(fabs((double)c.left[s] - c.left[s - 1]), fabs((double)c.right[s] - c.right[s - 1]));
            if (cover > 1)
                aov_max = fmax(aov_max, da);
            else
                ain_max = fmax(ain_max, da);
        }
    }
    if (a->json)
        printf("{\"frames\": %lld, \"windows\": %d, \"frame_diff_inside_max\": %.6f, \"frame_diff_inside_mean\": "
               "%.6f, \"frame_diff_overlap_max\": %.6f, \"frame_diff_overlap_max_at\": %lld, "
               "\"audio_step_inside_max\": %.6f, \"audio_step_overlap_max\": %.6f}\n",
               (long long)c.frames, w.n, in_max, in_n ? in_sum / in_n : 0.0, ov_max, (long long)ov_at, ain_max,
               aov_max);
    else
        printf("%lld frames in %d windows: frame difference inside one window max %.4f (mean %.4f), in the "
               "overlaps max %.4f (frame %lld); sound step inside max %.4f, in the overlaps max %.4f\n",
               (long long)c.frames, w.n, in_max, in_n ? in_sum / in_n : 0.0, ov_max, (long long)ov_at, ain_max,
               aov_max);
    h3_windows_free(&w);
    h3_clip_free(&c);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage("no command");
    args a = {.heldout = -1, .frames = 56, .w = 128, .h = 128, .clips = 1024, .shard = 256, .motion = -1, .seed = 1};
    const char *cmd = argv[1];
    if (!strcmp(cmd, "prompts")) return argc == 2 ? cmd_prompts() : usage("prompts takes no arguments");
    if (!strcmp(cmd, "prompt")) {
        int k;
        const int ref = argc == 4 && !strcmp(argv[3], "--reference");
        if ((argc != 3 && !ref) || !parse_int(argv[2], 0, 53, &k))
            return usage("prompt takes K in 0..53 and optionally --reference");
        h3_synth_scene s;
        char buf[512];
        h3_synth_scene_make(h3_synth_heldout_combo(k), 0, &s);
        (ref ? h3_synth_caption_reference : h3_synth_caption)(&s, buf, sizeof buf);
        puts(buf);
        return 0;
    }
    if (argc < 3 || argv[2][0] == '-') return usage("the command needs a path");
    int rc = parse_opts(argc, argv, 3, &a);
    if (rc) return rc;
    if (!strcmp(cmd, "clip")) return cmd_clip(argv[2], &a);
    if (!strcmp(cmd, "check")) return cmd_check(argv[2], &a);
    if (!strcmp(cmd, "frame")) return cmd_frame(argv[2], &a);
    if (!strcmp(cmd, "seams")) return cmd_seams(argv[2], &a);
    if (!strcmp(cmd, "dataset")) return cmd_dataset(argv[2], &a);
    if (!strcmp(cmd, "layout")) return cmd_layout(argv[2], &a);
    return usage("unknown command");
}
