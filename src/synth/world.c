/* The synthetic world and the adherence check (world.h). */
#include "synth/world.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "pipeline/geometry.h"
#include "pipeline/media.h"

static const char *const g_colors[H3_SY_COLORS] = {"red", "orange", "yellow", "green", "blue", "purple"};
static const float g_rgb[H3_SY_COLORS][3] = {{0.90f, 0.10f, 0.10f}, {0.95f, 0.55f, 0.05f},
                                             {0.95f, 0.90f, 0.10f}, {0.10f, 0.75f, 0.20f},
                                             {0.15f, 0.30f, 0.95f}, {0.60f, 0.15f, 0.80f}};
/* A4-relative pitches a minor third or more apart: A3, C#4, E4, G4, B4, D5 */
static const float g_pitch[H3_SY_COLORS] = {220.00f, 277.18f, 329.63f, 392.00f, 493.88f, 587.33f};
static const char *const g_tone[H3_SY_COLORS] = {"a deep low tone", "a low tone",  "a middle tone",
                                                 "a bright tone",   "a high tone", "a very high tone"};
static const char *const g_shapes[H3_SY_SHAPES] = {"circle", "square", "triangle"};
static const char *const g_bgs[H3_SY_BACKGROUNDS] = {"black", "gray", "white"};
static const float g_bg_rgb[H3_SY_BACKGROUNDS] = {0.05f, 0.50f, 0.95f};
static const char *const g_motions[H3_SY_MOTIONS] = {"left", "right", "up", "down", "bounce", "stay"};
static const char *const g_pans[5] = {"center", "left to right", "right to left", "left", "right"};

const char *h3_synth_color_name(int c) {
    return c >= 0 && c < H3_SY_COLORS ? g_colors[c] : "none";
}
const char *h3_synth_shape_name(int s) {
    return s >= 0 && s < H3_SY_SHAPES ? g_shapes[s] : "none";
}
const char *h3_synth_background_name(int b) {
    return b >= 0 && b < H3_SY_BACKGROUNDS ? g_bgs[b] : "none";
}
const char *h3_synth_motion_name(int m) {
    return m >= 0 && m < H3_SY_MOTIONS ? g_motions[m] : "none";
}
const char *h3_synth_pan_name(int p) {
    return p >= 0 && p < 5 ? g_pans[p] : "none";
}
void h3_synth_color_rgb(int c, float rgb[3]) {
    for (int i = 0; i < 3; i++) rgb[i] = g_rgb[c][i];
}
void h3_synth_background_rgb(int b, float rgb[3]) {
    for (int i = 0; i < 3; i++) rgb[i] = g_bg_rgb[b];
}
float h3_synth_pitch_hz(int c) {
    return g_pitch[c];
}

/* ---- combinations
 * ------------------------------------------------------------------------------------------ */

void h3_synth_combo(int k, int *color, int *shape, int *background, int *motion) {
    *color = k % H3_SY_COLORS;
    *shape = (k / H3_SY_COLORS) % H3_SY_SHAPES;
    *background = (k / (H3_SY_COLORS * H3_SY_SHAPES)) % H3_SY_BACKGROUNDS;
    *motion = (k / (H3_SY_COLORS * H3_SY_SHAPES * H3_SY_BACKGROUNDS)) % H3_SY_MOTIONS;
}

/* One colour per (shape, background, motion): every colour, shape, background and motion still appears in
 * training with the others. */
int h3_synth_heldout(int k) {
    int c, s, b, m;
    h3_synth_combo(k, &c, &s, &b, &m);
    return (c + 2 * s + 3 * b + m) % H3_SY_COLORS == H3_SY_COLORS - 1;
}

int h3_synth_heldout_combo(int k) {
    for (int i = 0, n = 0; i < H3_SY_COMBOS; i++)
        if (h3_synth_heldout(i) && n++ == k) return i;
    return -1;
}

static uint64_t mix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi]; the middle when seed is 0. */
static float draw(uint64_t *st, int fixed, float lo, float hi) {
    if (fixed) return 0.5f * (lo + hi);
    return lo + (hi - lo) * (float)((double)(mix(st) >> 11) * (1.0 / 9007199254740992.0));
}

void h3_synth_scene_make(int k, uint64_t seed, h3_synth_scene *s) {
    memset(s, 0, sizeof *s);
    h3_synth_combo(k, &s->color, &s->shape, &s->background, &s->motion);
    uint64_t st = seed;
    const int fx = seed == 0;
    s->size = draw(&st, fx, 0.19f, 0.25f);
    const float a = draw(&st, fx, 0.19f, 0.25f), b = draw(&st, fx, 0.75f, 0.81f);
    const float across = draw(&st, fx, 0.36f, 0.64f), mid = draw(&st, fx, 0.43f, 0.57f);
    switch (s->motion) {
        case H3_SY_MOVE_LEFT:
            s->x0 = b, s->x1 = a, s->y0 = s->y1 = across;
            break;
        case H3_SY_MOVE_RIGHT:
            s->x0 = a, s->x1 = b, s->y0 = s->y1 = across;
            break;
        case H3_SY_MOVE_UP:
            s->y0 = b, s->y1 = a, s->x0 = s->x1 = mid;
            break;
        case H3_SY_MOVE_DOWN:
            s->y0 = a, s->y1 = b, s->x0 = s->x1 = mid;
            break;
        case H3_SY_BOUNCE: /* floor at y0, top of the arc at y1 */
            s->x0 = s->x1 = mid, s->y0 = 0.78f, s->y1 = 0.28f;
            s->bounces = fx ? 2 : 2 + (int)(mix(&st) % 2);
            break;
        default:
            s->x0 = s->x1 = mid, s->y0 = s->y1 = draw(&st, fx, 0.40f, 0.60f);
            break;
    }
    s->template_ = fx ? 0 : (int)(mix(&st) % 3);
}

/* Centre at clip fraction u in [0, 1]. */
static void pos_at(const h3_synth_scene *s, double u, float *x, float *y) {
    if (s->motion == H3_SY_BOUNCE) {
        *x = s->x0;
        *y = (float)(s->y0 - (s->y0 - s->y1) * fabs(sin(M_PI * u * s->bounces)));
        return;
    }
    *x = (float)(s->x0 + (s->x1 - s->x0) * u);
    *y = (float)(s->y0 + (s->y1 - s->y0) * u);
}

void h3_synth_position(const h3_synth_scene *s, int64_t f, int64_t T, float *x, float *y, int *contact) {
    const double u = T > 1 ? (double)f / (double)(T - 1) : 0.0;
    pos_at(s, u, x, y);
    if (contact) {
        *contact = 0;
        if (s->motion == H3_SY_BOUNCE && f > 0 && T > 1) {
            const double u0 = (double)(f - 1) / (double)(T - 1);
            *contact = floor(u * s->bounces + 1e-9) > floor(u0 * s->bounces + 1e-9);
        }
    }
}

static int pan_class(float start, float end) {
    if (end - start > 0.2f) return H3_SY_PAN_LEFT_TO_RIGHT;
    if (start - end > 0.2f) return H3_SY_PAN_RIGHT_TO_LEFT;
    const float m = 0.5f * (start + end);
    return m < 0.35f ? H3_SY_PAN_LEFT : m > 0.65f ? H3_SY_PAN_RIGHT : H3_SY_PAN_CENTER;
}

int h3_synth_expected_pan(const h3_synth_scene *s) {
    /* the means over the first and last quarter of the clip, as the measurement takes them */
    float xs = 0, xe = 0, y;
    for (int i = 0; i < 16; i++) {
        float x;
        pos_at(s, 0.25 * (i + 0.5) / 16.0, &x, &y);
        xs += x / 16;
        pos_at(s, 0.75 + 0.25 * (i + 0.5) / 16.0, &x, &y);
        xe += x / 16;
    }
    return pan_class(xs, xe);
}

/* ---- rendering
 * --------------------------------------------------------------------------------------------- */

int64_t h3_synth_samples(int64_t T) {
    _Static_assert(H3_SY_FPS == H3_FPS && H3_SY_SAMPLE_RATE == H3_AUDIO_RATE, "the synth renders H3's rates");
    return h3_audio_samples(T);
}

static int inside(int shape, float dx, float dy, float r) {
    if (shape == 0) return dx * dx + dy * dy <= r * r;
    if (shape == 1) return fabsf(dx) <= 0.886f * r && fabsf(dy) <= 0.886f * r; /* the circle's area */
    /* triangle, apex up: from y = -r to y = 0.7 r, half-width growing to 1.1 r at the base */
    if (dy < -r || dy > 0.7f * r) return 0;
    return fabsf(dx) <= 1.1f * r * (dy + r) / (1.7f * r);
}

void h3_synth_render(const h3_synth_scene *s, int W, int H, int64_t T, float *rgb, float *left,
                     float *right) {
    float col[3], bg[3];
    h3_synth_color_rgb(s->color, col);
    h3_synth_background_rgb(s->background, bg);
    const float r = 0.5f * s->size * (float)(W < H ? W : H);
    const int64_t P = (int64_t)W * H;
    for (int64_t f = 0; f < T && rgb; f++) {
        float cx, cy;
        h3_synth_position(s, f, T, &cx, &cy, NULL);
        cx *= (float)W;
        cy *= (float)H;
        float *fr = rgb + f * 3 * P;
        for (int yy = 0; yy < H; yy++)
            for (int xx = 0; xx < W; xx++) {
                const int in = inside(s->shape, (float)xx + 0.5f - cx, (float)yy + 0.5f - cy, r);
                for (int c = 0; c < 3; c++) fr[c * P + (int64_t)yy * W + xx] = in ? col[c] : bg[c];
            }
    }
    if (!left || !right) return;
    const int64_t n = h3_synth_samples(T);
    const double sr = H3_SY_SAMPLE_RATE, f0 = g_pitch[s->color], dur = (double)n / sr, fade = 0.01;
    for (int64_t i = 0; i < n; i++) {
        const double t = (double)i / sr, u = dur > 0 ? t / dur : 0;
        float x, y;
        pos_at(s, u, &x, &y);
        double env = 1.0;
        if (t < fade) env = t / fade;
        if (dur - t < fade) env = (dur - t) / fade;
        double v = 0.25 * env * sin(2.0 * M_PI * f0 * t);
        if (s->motion == H3_SY_BOUNCE) /* a 2 kHz click decaying over ~3 ms at each floor contact */
            for (int j = 1; j <= s->bounces; j++) {
                const double tc = dur * (double)j / s->bounces, tau = t - tc + 0.004;
                if (tau >= 0 && tau < 0.02) v += 0.5 * exp(-tau / 0.003) * sin(2.0 * M_PI * 2000.0 * tau);
            }
        const double th = (double)x * M_PI / 2;
        left[i] = (float)(v * cos(th));
        right[i] = (float)(v * sin(th));
    }
}

/* ---- captions
 * ---------------------------------------------------------------------------------------------- */

/* ref: the shape named as the one in the reference image (<Picture 1>), its colour and its tone's pitch unsaid. */
static int caption_of(const h3_synth_scene *s, int ref, char *buf, size_t n) {
    static const char *const move[3][H3_SY_MOTIONS] = {
        {"moves from the right side to the left side", "moves from the left side to the right side",
         "rises from the bottom to the top", "sinks from the top to the bottom",
         "bounces up and down on the floor", "stays still in the middle"},
        {"slides to the left", "slides to the right", "floats upward", "drops downward", "keeps bouncing",
         "does not move"},
        {"travels leftward across the frame", "travels rightward across the frame", "climbs straight up",
         "falls straight down", "hops up and down", "rests in place"},
    };
    const int t = s->template_ >= 0 && s->template_ < 3 ? s->template_ : 0;
    const int pan = h3_synth_expected_pan(s);
    const char *pan_txt =
        pan == H3_SY_PAN_LEFT_TO_RIGHT   ? " that travels from the left speaker to the right speaker"
        : pan == H3_SY_PAN_RIGHT_TO_LEFT ? " that travels from the right speaker to the left speaker"
                                         : " in the center";
    char click[96] = "";
    if (s->motion == H3_SY_BOUNCE)
        snprintf(click, sizeof click, ", with a sharp click each time the %s hits the floor",
                 g_shapes[s->shape]);
    const char *c = g_colors[s->color], *sh = g_shapes[s->shape], *bg = g_bgs[s->background];
    /* the subject, lower case ("an orange triangle", "the triangle from <Picture 1>"; template 2: "a single ...") */
    char subj[96];
    if (ref)
        snprintf(subj, sizeof subj, "the %s%s from <Picture 1>", t == 2 ? "single " : "", sh);
    else
        snprintf(subj, sizeof subj, "%s%s %s", t == 2 ? "a single " : c[0] == 'o' ? "an " : "a ", c, sh);
    char scene[256];
    if (t == 1)
        snprintf(scene, sizeof scene, "On a plain %s background, %s %s.", bg, subj, move[t][s->motion]);
    else if (t == 2)
        snprintf(scene, sizeof scene, "%c%s %s over a flat %s backdrop.", subj[0] - 'a' + 'A', subj + 1,
                 move[t][s->motion], bg);
    else
        snprintf(scene, sizeof scene, "%c%s %s on a plain %s background.", subj[0] - 'a' + 'A', subj + 1,
                 move[t][s->motion], bg);
    char tone[64];
    snprintf(tone, sizeof tone, "%s", ref ? "its own tone" : g_tone[s->color]);
    tone[0] = (char)(tone[0] - 'a' + 'A');
    return snprintf(buf, n,
                    "integrated_multimodal_description: [Shot 1] %s overall_soundscape: %s%s%s. "
                    "non_diegetic_music: none.",
                    scene, tone, pan_txt, click);
}

int h3_synth_caption(const h3_synth_scene *s, char *buf, size_t n) {
    return caption_of(s, 0, buf, n);
}

int h3_synth_caption_reference(const h3_synth_scene *s, char *buf, size_t n) {
    return caption_of(s, 1, buf, n);
}

/* ---- the check
 * --------------------------------------------------------------------------------------------- */

/* Power of x[0..n) at frequency f (Goertzel), per sample. */
static double goertzel(const float *x, int64_t n, double f, double sr) {
    const double w = 2.0 * M_PI * f / sr, c = 2.0 * cos(w);
    double s1 = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) {
        const double s0 = x[i] + c * s1 - s2;
        s2 = s1;
        s1 = s0;
    }
    const double p = s1 * s1 + s2 * s2 - c * s1 * s2;
    return n > 0 ? p / ((double)n * (double)n) : 0;
}

static int nearest_color(const double mc[3]) {
    double best = 1e30;
    int color = -1;
    for (int c = 0; c < H3_SY_COLORS; c++) {
        double d = 0;
        for (int j = 0; j < 3; j++) d += (mc[j] - g_rgb[c][j]) * (mc[j] - g_rgb[c][j]);
        if (d < best) best = d, color = c;
    }
    return color;
}

h3_status h3_synth_measure(const float *rgb, int W, int H, int64_t T, const float *left, const float *right,
                           int64_t n, int sample_rate, h3_synth_measurement *m) {
    memset(m, 0, sizeof *m);
    m->color = m->motion = m->pitch = m->pan = m->shape = -1;
    m->first_color = m->last_color = -1;
    m->first_frame = m->last_frame = -1;
    m->frames = T;
    if (W < 4 || H < 4 || T < 1 || !rgb) return H3_ERR(H3_ERR_INVALID, "synth check: no frames to measure");
    const int64_t P = (int64_t)W * H;
    /* the background: the mean of every frame's border */
    double bg[3] = {0, 0, 0};
    int64_t nb = 0;
    for (int64_t f = 0; f < T; f++)
        for (int c = 0; c < 3; c++) {
            const float *pl = rgb + (f * 3 + c) * P;
            for (int x = 0; x < W; x++) bg[c] += pl[x] + pl[(int64_t)(H - 1) * W + x];
            for (int y = 1; y < H - 1; y++) bg[c] += pl[(int64_t)y * W] + pl[(int64_t)y * W + W - 1];
            if (c == 0) nb += 2 * W + 2 * (H - 2);
        }
    for (int c = 0; c < 3; c++) bg[c] /= (double)nb;
    /* the shape: pixels far from the background; its colour and centroid per frame */
    float *cx = h3_malloc((size_t)T * sizeof(float) * 4, H3_MEM_WORKSPACE);
    int32_t *rows = h3_malloc((size_t)(W + H) * sizeof(int32_t), H3_MEM_WORKSPACE);
    if (!cx || !rows) {
        h3_free(cx);
        h3_free(rows);
        return H3_ERR(H3_ERR_NOMEM, "out of memory");
    }
    float *cy = cx + T, *fills = cx + 2 * T, *lows = cx + 3 * T;
    int32_t *cols = rows + H;
    double sum[3] = {0, 0, 0}, fg_all = 0, first_sum[3] = {0, 0, 0}, last_sum[3] = {0, 0, 0};
    int64_t seen = 0, npix = 0;
    for (int64_t f = 0; f < T; f++) {
        const float *fr = rgb + f * 3 * P;
        double sx = 0, sy = 0, fs[3] = {0, 0, 0};
        int64_t k = 0;
        memset(rows, 0, (size_t)(W + H) * sizeof(int32_t));
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++) {
                const int64_t i = (int64_t)y * W + x;
                const double d0 = fr[i] - bg[0], d1 = fr[P + i] - bg[1], d2 = fr[2 * P + i] - bg[2];
                if (d0 * d0 + d1 * d1 + d2 * d2 < 0.25 * 0.25) continue;
                sx += x + 0.5;
                sy += y + 0.5;
                fs[0] += fr[i], fs[1] += fr[P + i], fs[2] += fr[2 * P + i];
                rows[y]++, cols[x]++;
                k++;
            }
        fg_all += (double)k / (double)P;
        npix += k;
        for (int c = 0; c < 3; c++) sum[c] += fs[c];
        if (k >= (P + 499) / 500) {
            cx[seen] = (float)(sx / (double)k / W);
            cy[seen] = (float)(sy / (double)k / H);
            if (m->first_frame < 0) {
                m->first_frame = f, m->first_x = cx[seen], m->first_y = cy[seen];
                for (int c = 0; c < 3; c++) first_sum[c] = fs[c] / (double)k;
            }
            m->last_frame = f, m->last_x = cx[seen], m->last_y = cy[seen];
            for (int c = 0; c < 3; c++) last_sum[c] = fs[c] / (double)k;
            /* the shape from its bounding box (rows and columns with at least two of its pixels: a stray pixel
             * does not stretch the box): a triangle (apex up) has 3/4 of its pixels in the box's lower half,
             * a square and a circle 1/2; a square fills its box, a circle pi/4 of it */
            int y0 = 0, y1 = H - 1, x0 = 0, x1 = W - 1;
            while (y0 < H - 1 && rows[y0] < 2) y0++;
            while (y1 > y0 && rows[y1] < 2) y1--;
            while (x0 < W - 1 && cols[x0] < 2) x0++;
            while (x1 > x0 && cols[x1] < 2) x1--;
            double in = 0, low = 0;
            const double mid = 0.5 * (y0 + y1 + 1);
            for (int y = y0; y <= y1; y++) {
                in += rows[y];
                low += y + 0.5 > mid ? rows[y] : y + 0.5 == mid ? 0.5 * rows[y] : 0;
            }
            fills[seen] = (float)(in / ((double)(y1 - y0 + 1) * (x1 - x0 + 1)));
            lows[seen] = in > 0 ? (float)(low / in) : 0.5f;
            seen++;
        }
    }
    m->fg_fraction = (float)(fg_all / (double)T);
    if (seen > 0) { /* each frame's shape, then the most frequent; the fill reported is the median */
        int votes[H3_SY_SHAPES] = {0, 0, 0};
        for (int64_t i = 0; i < seen; i++) votes[lows[i] >= 0.625f ? 2 : fills[i] >= 0.89f ? 1 : 0]++;
        m->shape = 0;
        for (int s = 1; s < H3_SY_SHAPES; s++)
            if (votes[s] > votes[m->shape]) m->shape = s;
        for (int64_t i = 1; i < seen; i++) /* insertion sort: a clip has at most a few thousand frames */
            for (int64_t j = i; j > 0 && fills[j - 1] > fills[j]; j--) {
                const float t = fills[j];
                fills[j] = fills[j - 1], fills[j - 1] = t;
            }
        m->fill = fills[seen / 2];
    }
    h3_free(rows);
    const double tot = sum[0] + sum[1] + sum[2];
    if (npix > 0 && tot > 0) { /* the shape's mean colour: the nearest palette colour */
        const double mc[3] = {sum[0] / (double)npix, sum[1] / (double)npix, sum[2] / (double)npix};
        m->color = nearest_color(mc);
    }
    if (m->first_frame >= 0) m->first_color = nearest_color(first_sum), m->last_color = nearest_color(last_sum);
    if (seen >= 4) {
        const int64_t q = seen / 4 > 0 ? seen / 4 : 1;
        double xs = 0, ys = 0, xe = 0, ye = 0;
        for (int64_t i = 0; i < q; i++) {
            xs += cx[i], ys += cy[i];
            xe += cx[seen - 1 - i], ye += cy[seen - 1 - i];
        }
        m->dx = (float)((xe - xs) / q);
        m->dy = (float)((ye - ys) / q);
        /* bounces: reversals of the height's direction by more than 0.08 (hysteresis) */
        int dir = 0, reversals = 0;
        float ext = cy[0], lo = cy[0], hi = cy[0];
        for (int64_t i = 1; i < seen; i++) {
            lo = cy[i] < lo ? cy[i] : lo;
            hi = cy[i] > hi ? cy[i] : hi;
            if (dir >= 0 && cy[i] < ext - 0.08f) { /* going up */
                if (dir > 0) reversals++;
                dir = -1, ext = cy[i];
            } else if (dir <= 0 && cy[i] > ext + 0.08f) { /* going down */
                if (dir < 0) reversals++;
                dir = 1, ext = cy[i];
            } else if ((dir < 0 && cy[i] < ext) || (dir > 0 && cy[i] > ext)) {
                ext = cy[i];
            }
        }
        m->y_swing = hi - lo;
        const float ax = fabsf(m->dx), ay = fabsf(m->dy);
        if (reversals >= 2 && m->y_swing > 0.15f && ax < 0.15f)
            m->motion = H3_SY_BOUNCE;
        else if (ax < 0.15f && ay < 0.15f)
            m->motion = H3_SY_STAY;
        else if (ax >= ay)
            m->motion = m->dx < 0 ? H3_SY_MOVE_LEFT : H3_SY_MOVE_RIGHT;
        else
            m->motion = m->dy < 0 ? H3_SY_MOVE_UP : H3_SY_MOVE_DOWN;
    }
    h3_free(cx);
    /* sound: the loudest palette pitch in the mix, then the channel balance at it in the first and last
     * quarter */
    if (left && right && n >= 64 && sample_rate > 0) {
        float *mono = h3_malloc((size_t)n * sizeof(float), H3_MEM_WORKSPACE);
        if (!mono) return H3_ERR(H3_ERR_NOMEM, "out of memory");
        for (int64_t i = 0; i < n; i++) mono[i] = 0.5f * (left[i] + right[i]);
        double best = 0, all = 0;
        for (int c = 0; c < H3_SY_COLORS; c++) {
            const double p = goertzel(mono, n, g_pitch[c], sample_rate);
            all += p;
            if (p > best) best = p, m->pitch = c;
        }
        h3_free(mono);
        if (!(best > 1e-10) || best < 0.3 * all) m->pitch = -1; /* silence, or no palette pitch stands out */
        if (m->pitch >= 0) {
            const int64_t qn = n / 4;
            const double f = g_pitch[m->pitch];
            const double ls = goertzel(left, qn, f, sample_rate), rs = goertzel(right, qn, f, sample_rate);
            const double le = goertzel(left + n - qn, qn, f, sample_rate),
                         re = goertzel(right + n - qn, qn, f, sample_rate);
            m->pan_start = (float)(atan2(sqrt(rs), sqrt(ls)) / (M_PI / 2));
            m->pan_end = (float)(atan2(sqrt(re), sqrt(le)) / (M_PI / 2));
            m->pan = pan_class(m->pan_start, m->pan_end);
        }
    }
    return H3_OK;
}

void h3_synth_score_of(const h3_synth_scene *s, const h3_synth_measurement *m, h3_synth_score *out) {
    out->color = m->color == s->color;
    out->motion = m->motion == s->motion;
    out->pitch = m->pitch == s->color;
    out->pan = m->pan == h3_synth_expected_pan(s);
    out->shape = m->shape == s->shape;
    out->start_dist = out->end_dist = -1;
    out->start = out->end = 0;
    if (m->first_frame >= 0) {
        float x, y;
        h3_synth_position(s, m->first_frame, m->frames, &x, &y, NULL);
        out->start_dist = hypotf(m->first_x - x, m->first_y - y);
        h3_synth_position(s, m->last_frame, m->frames, &x, &y, NULL);
        out->end_dist = hypotf(m->last_x - x, m->last_y - y);
        out->start = out->start_dist <= H3_SY_PLACE_TOL;
        out->end = out->end_dist <= H3_SY_PLACE_TOL;
    }
    out->first_color = m->first_color == s->color;
    out->last_color = m->last_color == s->color;
}
