/* The synthetic world of h3run's small trained model, and the objective check of prompt adherence on it.
 *
 * A scene is one coloured shape on a plain background that moves (left, right, up, down, bounces, or stays),
 * with stereo sound tied to what is seen: a tone whose pitch follows the colour, panned with the shape's
 * horizontal position (equal-power), and a click each time a bouncing shape touches the floor. Clips run at
 * 24 fps with 17n+5 frames (H3's frame rule) and 32 kHz stereo sound; captions follow H3's prompt fields
 * (integrated_multimodal_description / overall_soundscape / non_diegetic_music).
 *
 * The 6 colours × 3 shapes × 3 backgrounds × 6 motions = 324 combinations are split once and for all: 54 of
 * them (h3_synth_heldout) never appear in training and are the prompts of the adherence check.
 *
 * The check (h3_synth_measure) reads only the clip: the background from the frame borders, the shape as the
 * pixels far from it, its mean colour (nearest palette colour), the track of its centroid (motion class), the
 * audio's energy at each palette pitch (Goertzel; the loudest is the pitch), and the balance of the two
 * channels at that pitch over time (pan class). h3_synth_score compares a measurement with a scene.
 */
#ifndef H3_SYNTH_WORLD_H
#define H3_SYNTH_WORLD_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

enum { H3_SY_COLORS = 6, H3_SY_SHAPES = 3, H3_SY_BACKGROUNDS = 3, H3_SY_MOTIONS = 6 };
enum { H3_SY_COMBOS = H3_SY_COLORS * H3_SY_SHAPES * H3_SY_BACKGROUNDS * H3_SY_MOTIONS };
enum { H3_SY_MOVE_LEFT = 0, H3_SY_MOVE_RIGHT, H3_SY_MOVE_UP, H3_SY_MOVE_DOWN, H3_SY_BOUNCE, H3_SY_STAY };
enum {
    H3_SY_PAN_CENTER = 0,
    H3_SY_PAN_LEFT_TO_RIGHT,
    H3_SY_PAN_RIGHT_TO_LEFT,
    H3_SY_PAN_LEFT,
    H3_SY_PAN_RIGHT
};

#define H3_SY_FPS         24
#define H3_SY_SAMPLE_RATE 32000

typedef struct h3_synth_scene {
    int color, shape, background, motion;
    float size;    /* the shape's extent as a fraction of the canvas' smaller side */
    float x0, y0;  /* start (or fixed) centre, fractions of width and height (y down) */
    float x1, y1;  /* end centre */
    int bounces;   /* BOUNCE: floor contacts in the clip */
    int template_; /* caption wording (0: the check's fixed wording) */
} h3_synth_scene;

const char *h3_synth_color_name(int color);
const char *h3_synth_shape_name(int shape);
const char *h3_synth_background_name(int background);
const char *h3_synth_motion_name(int motion);
const char *h3_synth_pan_name(int pan);
void h3_synth_color_rgb(int color, float rgb[3]);
void h3_synth_background_rgb(int background, float rgb[3]);
float h3_synth_pitch_hz(int color);

/* Combination index k in [0, 324) <-> attributes; whether it is one of the 54 held-out combinations. */
void h3_synth_combo(int k, int *color, int *shape, int *background, int *motion);
int h3_synth_heldout(int k);
/* The k-th held-out combination, k in [0, 54). */
int h3_synth_heldout_combo(int k);

/* A scene of combination k with its free parameters (size, start, bounces, wording) drawn from seed; fixed
 * (seed-independent mid values, wording 0) when seed is 0. */
void h3_synth_scene_make(int k, uint64_t seed, h3_synth_scene *s);

/* The shape's centre at frame f of T, and whether a bounce touches the floor during frame f. */
void h3_synth_position(const h3_synth_scene *s, int64_t f, int64_t T, float *x, float *y, int *contact);
/* The pan the sound should show: from the horizontal track. */
int h3_synth_expected_pan(const h3_synth_scene *s);

/* Renders T frames of W×H as planar float RGB in [0, 1] (frame t, plane c at rgb + (t·3 + c)·H·W) and the
 * stereo sound, n = h3_synth_samples(T) samples per channel (left, right may be NULL to skip the sound). */
int64_t h3_synth_samples(int64_t T);
void h3_synth_render(const h3_synth_scene *s, int W, int H, int64_t T, float *rgb, float *left, float *right);

/* The caption in H3's prompt fields; returns its length (truncated to n-1 like snprintf). */
int h3_synth_caption(const h3_synth_scene *s, char *buf, size_t n);
/* The caption for ref2va: the shape named as "the <shape> from <Picture 1>" (the reference image shows it), its
 * colour and its tone's pitch unsaid ("its own tone"); the motion, background, pan and click as h3_synth_caption. */
int h3_synth_caption_reference(const h3_synth_scene *s, char *buf, size_t n);

/* What a clip shows. rgb: T frames as h3_synth_render writes them. Fields are -1 where nothing could be
 * measured (no shape visible, no sound). */
typedef struct h3_synth_measurement {
    int color, motion, pitch, pan; /* pitch: the colour whose pitch is loudest */
    int shape;                     /* the most frequent of the frames' shapes: a triangle when 5/8 or more of the
                                    * pixels are in the bounding box's lower half, else a square when they fill
                                    * 0.89 of the box or more, else a circle */
    float fill;                    /* median over frames of the shape's pixels / its bounding box's area */
    float dx, dy;                  /* centroid displacement, first to last quarter, in canvas fractions */
    float y_swing;                 /* BOUNCE: the largest up-and-back excursion of the centroid's height */
    float pan_start, pan_end;      /* 0 left .. 1 right, first and last quarter */
    float fg_fraction;             /* mean fraction of pixels taken as the shape */
    /* The first and the last frame the shape is seen in (-1: none), its centroid there (canvas fractions) and
     * its colour there (nearest palette colour): where and how a clip starts and ends, what keyframes fix. */
    int64_t frames, first_frame, last_frame;
    float first_x, first_y, last_x, last_y;
    int first_color, last_color;
} h3_synth_measurement;
h3_status h3_synth_measure(const float *rgb, int W, int H, int64_t T, const float *left, const float *right,
                           int64_t n, int sample_rate, h3_synth_measurement *m);

/* How far a keyframe's place may be from the shape's measured centroid, in canvas fractions (6.4 pixels at
 * 128x128; the renderer's own clips measure within 0.022 of their scenes' places, a triangle's centroid sitting
 * below its centre: tests/test_synth.c ground_truth). */
#define H3_SY_PLACE_TOL 0.05f

/* 1 where the measurement agrees with the scene: colour, motion, pitch (the colour's), pan, shape; and where the
 * clip starts and ends (the keyframes' check): start / end when the shape's centroid in the first / last frame it
 * is seen in is within H3_SY_PLACE_TOL of the scene's position at that frame (of a whole clip: frame f of
 * m->frames), first_color / last_color when its colour there is the scene's. start_dist / end_dist: those
 * distances (-1: no shape seen). */
typedef struct h3_synth_score {
    int color, motion, pitch, pan, shape;
    int start, end, first_color, last_color;
    float start_dist, end_dist;
} h3_synth_score;
void h3_synth_score_of(const h3_synth_scene *s, const h3_synth_measurement *m, h3_synth_score *out);

#endif
