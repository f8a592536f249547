#include "pipeline/request.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/geometry.h"
#include "pipeline/media.h"
#include "pipeline/window.h"

static void warn(h3_request_warnings *w, const char *fmt, ...) H3_PRINTF(2, 3);
static void warn(h3_request_warnings *w, const char *fmt, ...) {
    if (!w || w->n >= H3_REQUEST_MAX_WARNINGS) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->msg[w->n++], sizeof w->msg[0], fmt, ap);
    va_end(ap);
}

void h3_request_init(h3_request *r) {
    memset(r, 0, sizeof *r);
    r->sampler = H3_SAMPLER_EULER;
    r->scheduler = H3_SCHEDULER_H3;
}

h3_status h3_request_parse_shift(const char *text, double *video, double *audio) {
    char *end = NULL;
    const double v = strtod(text, &end);
    double a = 0.0;
    int audio_given = 0;
    if (end && end != text && *end == ':') {
        char *e2 = NULL;
        a = strtod(end + 1, &e2);
        audio_given = e2 != end + 1;
        end = audio_given ? e2 : NULL;
    }
    if (end == text || !end || *end || !(v >= 0.01 && v <= 1000.0) ||
        (audio_given && !(a >= 0.01 && a <= 1000.0)))
        return H3_ERR(H3_ERR_INVALID,
                      "--shift takes V or V:A, the video and audio sigma shifts from 0.01 to 1000 (the release's "
                      "12:3; 768p turbo LoRAs 6:3); got '%s'",
                      text);
    *video = v;
    *audio = a; /* 0: the released 3 */
    return H3_OK;
}

/* ---- frames
 * ------------------------------------------------------------------------------------------------- */

void h3_request_nearest_frames(int64_t frames, int64_t *lo, int64_t *hi) {
    h3_frames_nearest(frames, lo, hi);
}

h3_status h3_request_check_frames(int64_t frames, h3_request_warnings *warnings) {
    if (frames <= 0)
        return H3_ERR(H3_ERR_INVALID,
                      "frames must be a positive count of the form 17n+5 (e.g. 124 for 5 s); got %" PRId64,
                      frames);
    if (frames > H3_MAX_FRAMES)
        return H3_ERR(H3_ERR_INVALID, "frames must be at most %d (10 minutes at 24 fps); got %" PRId64,
                      H3_MAX_FRAMES, frames);
    if (!h3_frames_valid(frames)) {
        int64_t lo, hi;
        h3_request_nearest_frames(frames, &lo, &hi);
        return H3_ERR(H3_ERR_INVALID,
                      "frames must be 17n+5 (the video VAE works in 17-frame chunks); got %" PRId64
                      ": use %" PRId64 " or %" PRId64,
                      frames, lo, hi);
    }
    if (frames < H3_TRAINED_MIN_FRAMES || frames > H3_TRAINED_MAX_FRAMES)
        warn(warnings,
             "%" PRId64
             " frames is %.2f s at 24 fps, outside the 4-15 s the model was trained on (107 to 345 frames): "
             "expect lower quality",
             frames, (double)frames / 24.0);
    return H3_OK;
}

h3_status h3_request_frames_from_seconds(double seconds, int64_t *frames) {
    if (!isfinite(seconds) || !(seconds > 0.0))
        return H3_ERR(H3_ERR_INVALID, "seconds must be a positive duration (e.g. 5); got %g", seconds);
    if (seconds > (double)H3_MAX_FRAMES / 24.0)
        return H3_ERR(H3_ERR_INVALID, "seconds must be at most %d (10 minutes); got %g", H3_MAX_FRAMES / 24,
                      seconds);
    int64_t f = h3_frames_round_up((int64_t)nearbyint(seconds * H3_FPS));
    if (f > H3_MAX_FRAMES) f -= H3_FRAMES_CHUNK;
    *frames = f;
    return H3_OK;
}

/* ---- canvas
 * ------------------------------------------------------------------------------------------------- */

static int canvas_valid(int64_t w, int64_t h) {
    return h3_canvas_valid(w, h) && w <= H3_MAX_SIDE && h <= H3_MAX_SIDE && w <= 4 * h && h <= 4 * w;
}

static int64_t floor32(int64_t v) {
    int64_t r = v / H3_CANVAS_MULTIPLE * H3_CANVAS_MULTIPLE;
    return r < H3_CANVAS_MULTIPLE ? H3_CANVAS_MULTIPLE : r;
}
static int64_t ceil32(int64_t v) {
    int64_t r = (v + H3_CANVAS_MULTIPLE - 1) / H3_CANVAS_MULTIPLE * H3_CANVAS_MULTIPLE;
    return r < H3_CANVAS_MULTIPLE ? H3_CANVAS_MULTIPLE : r;
}

typedef struct {
    int64_t w, h, cost;
} cand;

static void add_cand(cand *c, int *n, int64_t w, int64_t h, int64_t w0, int64_t h0) {
    if (w > H3_MAX_SIDE) w = H3_MAX_SIDE / H3_CANVAS_MULTIPLE * H3_CANVAS_MULTIPLE;
    if (h > H3_MAX_SIDE) h = H3_MAX_SIDE / H3_CANVAS_MULTIPLE * H3_CANVAS_MULTIPLE;
    if (!canvas_valid(w, h)) return;
    for (int i = 0; i < *n; i++)
        if (c[i].w == w && c[i].h == h) return;
    c[*n].w = w;
    c[*n].h = h;
    c[*n].cost = llabs(w - w0) + llabs(h - h0);
    (*n)++;
}

int h3_request_nearest_canvases(int64_t width, int64_t height, int64_t out_w[2], int64_t out_h[2]) {
    cand c[64];
    int n = 0;
    int64_t w0 = width < 1 ? 1 : width, h0 = height < 1 ? 1 : height;
    if (w0 > 4 * H3_MAX_SIDE) w0 = 4 * H3_MAX_SIDE;
    if (h0 > 4 * H3_MAX_SIDE) h0 = 4 * H3_MAX_SIDE;
    int64_t ws[2] = {floor32(w0), ceil32(w0)}, hs[2] = {floor32(h0), ceil32(h0)};
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++) {
            int64_t w = ws[a], h = hs[b];
            add_cand(c, &n, w, h, w0, h0);
            /* Too wide: narrow it to 4:1, or make it taller. Too tall: the same the other way. */
            if (w > 4 * h) {
                add_cand(c, &n, floor32(4 * h), h, w0, h0);
                add_cand(c, &n, w, ceil32((w + 3) / 4), w0, h0);
            }
            if (h > 4 * w) {
                add_cand(c, &n, w, floor32(4 * w), w0, h0);
                add_cand(c, &n, ceil32((h + 3) / 4), h, w0, h0);
            }
        }
    /* Nearest first; ties by width, then height. */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0; j--) {
            cand *p = &c[j - 1], *q = &c[j];
            int swap =
                q->cost < p->cost || (q->cost == p->cost && (q->w < p->w || (q->w == p->w && q->h < p->h)));
            if (!swap) break;
            cand t = *p;
            *p = *q;
            *q = t;
        }
    int k = n < 2 ? n : 2;
    for (int i = 0; i < k; i++) {
        out_w[i] = c[i].w;
        out_h[i] = c[i].h;
    }
    return k;
}

static void suggestion(int64_t w, int64_t h, char *buf, size_t n) {
    int64_t sw[2], sh[2];
    int k = h3_request_nearest_canvases(w, h, sw, sh);
    if (k == 2)
        snprintf(buf, n, ": use %" PRId64 "x%" PRId64 " or %" PRId64 "x%" PRId64, sw[0], sh[0], sw[1], sh[1]);
    else if (k == 1)
        snprintf(buf, n, ": use %" PRId64 "x%" PRId64, sw[0], sh[0]);
    else
        buf[0] = 0;
}

h3_status h3_request_check_canvas(int64_t width, int64_t height, h3_request_warnings *warnings) {
    char sug[96];
    if (width <= 0 || height <= 0)
        return H3_ERR(H3_ERR_INVALID,
                      "width and height must be positive multiples of 32 (e.g. 1344x768); got %" PRId64
                      "x%" PRId64,
                      width, height);
    if (width > H3_MAX_SIDE || height > H3_MAX_SIDE) {
        suggestion(width, height, sug, sizeof sug);
        return H3_ERR(H3_ERR_INVALID, "width and height must be at most %d; got %" PRId64 "x%" PRId64 "%s",
                      H3_MAX_SIDE, width, height, sug);
    }
    if (width % H3_CANVAS_MULTIPLE || height % H3_CANVAS_MULTIPLE) {
        suggestion(width, height, sug, sizeof sug);
        return H3_ERR(
            H3_ERR_INVALID,
            "width and height must be multiples of 32 (16x video VAE, then 2x2 patches); got %" PRId64
            "x%" PRId64 "%s",
            width, height, sug);
    }
    if (width > 4 * height || height > 4 * width) {
        suggestion(width, height, sug, sizeof sug);
        return H3_ERR(H3_ERR_INVALID,
                      "the aspect ratio must lie between 1:4 and 4:1; got %" PRId64 "x%" PRId64 " (%.3g:1)%s",
                      width, height, (double)width / (double)height, sug);
    }
    if (width * height > (int64_t)H3_DEFAULT_WIDTH * H3_DEFAULT_HEIGHT)
        warn(warnings,
             "%" PRId64 "x%" PRId64
             " is larger in area than the released model's 1344x768 canvas: quality there is "
             "untested",
             width, height);
    return H3_OK;
}

/* "WxH" at the start of s: 1 with *end after it, 0 when it is not that. */
static int parse_wxh(const char *s, long long *w, long long *h, char **end) {
    if (!isdigit((unsigned char)s[0])) return 0;
    errno = 0;
    *w = strtoll(s, end, 10);
    if (errno || (**end != 'x' && **end != 'X') || !isdigit((unsigned char)(*end)[1])) return 0;
    *h = strtoll(*end + 1, end, 10);
    return !errno && *w <= 1000000 && *h <= 1000000;
}

h3_status h3_request_parse_size(const char *text, int64_t *width, int64_t *height) {
    const char *s = text ? text : "";
    char *end;
    long long w, h;
    if (!parse_wxh(s, &w, &h, &end) || *end)
        return H3_ERR(H3_ERR_INVALID, "size must be WIDTHxHEIGHT in pixels (e.g. 1344x768); got '%s'", s);
    if (w == 0 || h == 0) return h3_request_check_canvas(w, h, NULL); /* 0 would read as "not given" */
    *width = w;
    *height = h;
    return H3_OK;
}

h3_status h3_request_parse_output_size(const char *text, int64_t *width, int64_t *height) {
    const char *s = text ? text : "";
    char *end;
    long long w, h;
    if (!parse_wxh(s, &w, &h, &end) || *end)
        return H3_ERR(H3_ERR_INVALID,
                      "--output-size must be WIDTHxHEIGHT in pixels (e.g. 1920x1080); got '%s'", s);
    H3_TRY(h3_media_check_output_size(w, h)); /* 0 is refused, not "not given" */
    *width = w;
    *height = h;
    return H3_OK;
}

h3_status h3_request_parse_refine(const char *text, int64_t *width, int64_t *height, double *denoise) {
    const char *s = text ? text : "";
    char *end;
    long long w, h;
    double d = 0;
    if (!parse_wxh(s, &w, &h, &end)) goto bad;
    if (*end == ':') {
        const char *ds = end + 1;
        errno = 0;
        d = strtod(ds, &end);
        if (errno || end == ds || *end || !isfinite(d)) goto bad;
        if (!(d > 0.0 && d <= 1.0))
            return H3_ERR(H3_ERR_INVALID,
                          "--refine %s: the denoise must be in (0, 1] (the share of the schedule the refine "
                          "pass runs again; 1 starts it from pure noise); got %g",
                          s, d);
    } else if (*end) {
        goto bad;
    }
    if (w == 0 || h == 0) {
        h3_status st = h3_request_check_canvas(w, h, NULL);
        return h3_error_wrap(st, "--refine %s", s);
    }
    *width = w;
    *height = h;
    *denoise = d;
    return H3_OK;
bad:
    return H3_ERR(
        H3_ERR_INVALID,
        "--refine must be WIDTHxHEIGHT or WIDTHxHEIGHT:DENOISE (e.g. 256x256 or 2688x1536:0.4); got '%s'", s);
}

h3_status h3_request_check_refine(int64_t width, int64_t height, int64_t refine_width, int64_t refine_height,
                                  double denoise, h3_request_warnings *warnings) {
    h3_status st = h3_request_check_canvas(refine_width, refine_height, warnings);
    if (st != H3_OK) return h3_error_wrap(st, "the refine canvas");
    if (refine_width < width || refine_height < height)
        return H3_ERR(H3_ERR_INVALID,
                      "the refine canvas %lldx%lld is smaller than the first pass's %lldx%lld: it must be at "
                      "least as wide and as tall (e.g. %lldx%lld, twice the size)",
                      (long long)refine_width, (long long)refine_height, (long long)width, (long long)height,
                      (long long)(2 * width), (long long)(2 * height));
    if (!(denoise > 0.0 && denoise <= 1.0))
        return H3_ERR(H3_ERR_INVALID,
                      "the refine denoise must be in (0, 1] (the share of the schedule the refine pass runs "
                      "again; 1 starts it from pure noise); got %g",
                      denoise);
    return H3_OK;
}

int h3_request_refine_calls(int calls, double denoise) {
    int m = (int)floor((double)calls * denoise + 0.5);
    return m < 1 ? 1 : m > calls ? calls : m;
}

/* ---- the prompt's length
 * ------------------------------------------------------------------------------------ */

h3_status h3_request_check_prompt_bytes(size_t bytes) {
    if (bytes > H3_MAX_PROMPT_BYTES)
        return H3_ERR(
            H3_ERR_INVALID,
            "the prompt is %zu bytes; at most %d (1 MiB) are taken, and no prompt within the limit of %d "
            "tokens is longer: shorten it",
            bytes, H3_MAX_PROMPT_BYTES, H3_MAX_PROMPT_TOKENS);
    return H3_OK;
}

h3_status h3_request_check_prompt_tokens(int64_t tokens, int64_t te_positions) {
    if (te_positions > 0 && te_positions < H3_MAX_PROMPT_TOKENS && tokens > te_positions)
        return H3_ERR(H3_ERR_INVALID,
                      "the prompt is %" PRId64 " tokens; this text encoder has %" PRId64
                      " positions (its config's max_position_embeddings): shorten the prompt",
                      tokens, te_positions);
    if (tokens > H3_MAX_PROMPT_TOKENS)
        return H3_ERR(
            H3_ERR_INVALID,
            "the prompt is %" PRId64 " tokens; at most %d are taken (the text encoder's and the DiT's "
            "attention grow with the square of its length; H3's prompts run to a few hundred tokens): "
            "shorten it",
            tokens, H3_MAX_PROMPT_TOKENS);
    return H3_OK;
}

/* ---- the whole request
 * -------------------------------------------------------------------------------------- */

h3_status h3_request_resolve(h3_request *r, h3_request_warnings *warnings) {
    if (warnings) warnings->n = 0;
    if (!r->prompt) return H3_ERR(H3_ERR_INVALID, "a prompt is required (--prompt TEXT)");
    H3_TRY(h3_request_check_prompt_bytes(strlen(r->prompt)));
    if (r->frames != 0 && r->seconds != 0.0)
        return H3_ERR(H3_ERR_INVALID, "give the length as frames or as seconds, not both");
    if (r->seconds != 0.0) H3_TRY(h3_request_frames_from_seconds(r->seconds, &r->frames));
    if (r->frames == 0) r->frames = H3_DEFAULT_FRAMES;
    H3_TRY(h3_request_check_frames(r->frames, NULL));
    /* A clip longer than one window is sampled in overlapping windows (pipeline/window.h); the trained length
     * is then the window's. */
    const int64_t overlap_given = r->overlap;
    H3_TRY(h3_windows_resolve(r->frames, &r->window, &r->overlap));
    if (overlap_given && r->window == r->frames)
        warn(warnings, "--overlap %" PRId64 " has no effect: the clip (%" PRId64 " frames) is one window",
             overlap_given, r->frames);
    H3_TRY(h3_request_check_frames(r->window, warnings));
    if (r->width == 0 && r->height == 0) {
        r->width = H3_DEFAULT_WIDTH;
        r->height = H3_DEFAULT_HEIGHT;
    }
    H3_TRY(h3_request_check_canvas(r->width, r->height, warnings));
    if ((unsigned)r->sampler >= H3_SAMPLER_COUNT)
        return H3_ERR(H3_ERR_INVALID, "unknown sampler %d", (int)r->sampler);
    if ((unsigned)r->scheduler >= H3_SCHEDULER_COUNT)
        return H3_ERR(H3_ERR_INVALID, "unknown scheduler %d", (int)r->scheduler);
    if (r->steps == 0)
        r->steps = r->scheduler == H3_SCHEDULER_H3 ? H3_DEFAULT_STEPS_H3 : H3_DEFAULT_STEPS_COMFY;
    if (r->steps < 1 || r->steps > H3_MAX_STEPS)
        return H3_ERR(H3_ERR_INVALID, "steps counts model calls and must be between 1 and %d; got %d",
                      H3_MAX_STEPS, r->steps);
    if (r->shift_video == 0.0) r->shift_video = H3_SHIFT_VIDEO;
    if (r->shift_audio == 0.0) r->shift_audio = H3_SHIFT_AUDIO;
    if (!(r->shift_video >= 0.01 && r->shift_video <= 1000.0) || !(r->shift_audio >= 0.01 && r->shift_audio <= 1000.0))
        return H3_ERR(H3_ERR_INVALID, "a sigma shift must be from 0.01 to 1000 (the release's are 12 and 3); got %g:%g",
                      r->shift_video, r->shift_audio);
    if (r->refine_width || r->refine_height) {
        if (r->refine_denoise == 0.0) r->refine_denoise = H3_REFINE_DEFAULT_DENOISE;
        H3_TRY(h3_request_check_refine(r->width, r->height, r->refine_width, r->refine_height,
                                       r->refine_denoise, warnings));
    } else if (r->refine_denoise != 0.0) {
        return H3_ERR(H3_ERR_INVALID, "a refine denoise without a refine canvas");
    }
    if (r->out_width || r->out_height) H3_TRY(h3_media_check_output_size(r->out_width, r->out_height));
    return H3_OK;
}

const h3_workload *h3_workload_find(const char *name) {
    static const h3_workload w[] = {
        {"W73", 960, 544, 73}, {"W124", 960, 544, 124}, {"W362", 960, 544, 362}, {"W124L", 1344, 768, 124}};
    for (size_t i = 0; name && i < sizeof w / sizeof w[0]; i++)
        if (!strcmp(w[i].name, name)) return &w[i];
    return NULL;
}
