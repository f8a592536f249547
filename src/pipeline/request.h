/* What a generate request asks for, checked before anything is loaded, with messages that name the fix.
 *
 * Rules (H3-FACTS 5 "Canvas and frame limits"):
 *  - frames must be 17n+5 (the video VAE encodes 17-frame chunks into 5 latent frames, and keeps 2 of the
 *    first); a bad count is an error that names the two nearest valid counts. Outside the trained 4-15 s
 *    (96-360 frames) is allowed with a warning.
 *  - seconds may be given instead of frames: round(seconds*24) rounded up to the next 17n+5 (ComfyUI's
 *    template rule; 5 s -> 124 frames).
 *  - width and height must be multiples of 32 (16x VAE compression, then the DiT's 2x2 patch: every multiple
 *    of 32 gives an even latent size, and nothing else does) and at least 32; the aspect ratio must lie
 * within 1:4..4:1. A bad canvas is an error naming the nearest valid canvases (1280x720 -> 1280x704 or
 * 1280x736). A canvas larger in area than the released 1344x768 is allowed with a warning.
 *  - the prompt is at most H3_MAX_PROMPT_TOKENS tokens, fewer when the text encoder has fewer positions. The
 *    model sets no useful limit itself (Qwen3-VL has 262,144 positions; the reference truncates nothing), but
 *    the text encoder's attention and the DiT's joint attention grow with the square of the prompt's length:
 *    6,000 tokens take the small model's text encoder most of a minute on two cores, 60,000 would take over
 *    an hour, and the release's activations grow by 115 KB a token. H3's prompts (structured descriptions of
 *    shots, sound and music) run to a few hundred tokens; 8192 leaves them ample room. Before it is
 * tokenized, the prompt is at most H3_MAX_PROMPT_BYTES: no Qwen2/Qwen3 token is longer than 128 bytes, so a
 * longer text could not fit the token limit, and the tokenizer's working memory stays bounded. Every failure
 * is H3_ERR_INVALID (the CLI exits with status 2).
 */
#ifndef H3_PIPELINE_REQUEST_H
#define H3_PIPELINE_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "sample/sampler.h"
#include "sample/schedule.h"

#define H3_DEFAULT_WIDTH       1344
#define H3_DEFAULT_HEIGHT      768
#define H3_DEFAULT_FRAMES      124
#define H3_DEFAULT_STEPS_H3    49    /* diffusers' 50 sigma points */
#define H3_DEFAULT_STEPS_COMFY 20    /* ComfyUI's H3 template */
#define H3_MAX_FRAMES          14400 /* 10 minutes: a bound for arithmetic, far above what fits anywhere */
#define H3_MAX_SIDE            8192
#define H3_TRAINED_MIN_FRAMES  96  /* 4 s */
#define H3_TRAINED_MAX_FRAMES  360 /* 15 s */
#define H3_MAX_PROMPT_TOKENS   8192
#define H3_MAX_PROMPT_BYTES    (128 * H3_MAX_PROMPT_TOKENS) /* 1 MiB */

typedef struct h3_request {
    const char *prompt;
    int64_t frames;         /* 0: not given */
    double seconds;         /* 0: not given (only one of frames and seconds may be given) */
    int64_t width, height;  /* 0: not given (1344x768) */
    int steps;              /* model calls; 0: the scheduler's default */
    h3_sampler sampler;     /* default euler */
    h3_scheduler scheduler; /* default h3 */
    /* the schedule's sigma shifts (--shift V[:A]): 0 takes the released model's, 12 (video) and 3 (audio);
     * turbo LoRAs were distilled at others (pipeline/turbo.h) */
    double shift_video, shift_audio;
    uint64_t seed;
    /* Two-pass refine (--refine WxH[:DENOISE]); refine_width 0: one pass. The first pass samples at width x
     * height with `steps` model calls; its video latents are upscaled (bilinear, per frame) to the refine
     * canvas, re-noised to the schedule's sigma where the last h3_request_refine_calls(steps, denoise) calls
     * begin, and sampled there; the first pass's audio is kept (docs/SAMPLING.md §8). */
    int64_t refine_width, refine_height;
    double refine_denoise; /* (0, 1]; 0: H3_REFINE_DEFAULT_DENOISE */
    /* Delivery size (--output-size WxH): the decoded frames scaled (Lanczos) to it on their way to the MP4
     * and the PNG frames; 0: the canvas (the refine canvas with --refine). Even sides, 2..16384. */
    int64_t out_width, out_height;
    /* A clip longer than one window (pipeline/window.h): sampled as overlapping windows of `window` frames
     * (17n+5; 0: H3_WINDOW_AUTO_FRAMES for a clip over H3_TRAINED_MAX_FRAMES, else the clip), neighbours
     * overlapping by at least `overlap` frames (whole 17-frame chunks; 0: about a quarter of the window). Resolved:
     * window = frames and overlap 0 for a clip of one window. */
    int64_t window, overlap;
} h3_request;

#define H3_REFINE_DEFAULT_DENOISE 0.5

#define H3_REQUEST_MAX_WARNINGS 4
typedef struct h3_request_warnings {
    int n;
    char msg[H3_REQUEST_MAX_WARNINGS][256];
} h3_request_warnings;

void h3_request_init(h3_request *r);

/* Fills defaults (frames from seconds, canvas, steps) and checks every rule that needs no model (the prompt's
 * length in bytes; its length in tokens needs the tokenizer: h3_request_check_prompt_tokens). Warnings (may
 * be NULL) receive the allowed-but-untrained cases. */
h3_status h3_request_resolve(h3_request *r, h3_request_warnings *warnings);

/* The pieces, for the CLI and tests. */
/* "1344x768" -> 1344, 768; a zero side is refused as check_canvas refuses it (0x0 is not "no size given"). */
h3_status h3_request_parse_size(const char *text, int64_t *width, int64_t *height);
/* The prompt's text, before it is tokenized: at most H3_MAX_PROMPT_BYTES. */
h3_status h3_request_check_prompt_bytes(size_t bytes);
/* The prompt's token count against H3_MAX_PROMPT_TOKENS and the text encoder's positions (its config's
 * max_position_embeddings; <= 0: not known). */
h3_status h3_request_check_prompt_tokens(int64_t tokens, int64_t te_positions);
h3_status h3_request_frames_from_seconds(double seconds, int64_t *frames);
h3_status h3_request_check_frames(int64_t frames, h3_request_warnings *warnings);
h3_status h3_request_check_canvas(int64_t width, int64_t height, h3_request_warnings *warnings);
/* "1920x1080" -> 1920, 1080 for --output-size: the syntax, then h3_media_check_output_size (even sides). */
h3_status h3_request_parse_output_size(const char *text, int64_t *width, int64_t *height);
/* "6" or "6:3" -> the video and audio sigma shifts (0.01..1000; audio 0 when not given: the released 3). */
h3_status h3_request_parse_shift(const char *text, double *video, double *audio);
/* "2048x1152" or "2048x1152:0.4" -> the refine canvas and its denoise (0 when not given: the default). */
h3_status h3_request_parse_refine(const char *text, int64_t *width, int64_t *height, double *denoise);
/* The refine canvas against the first pass's: a valid canvas (h3_request_check_canvas), at least as wide and
 * as tall as width x height; denoise in (0, 1]. */
h3_status h3_request_check_refine(int64_t width, int64_t height, int64_t refine_width, int64_t refine_height,
                                  double denoise, h3_request_warnings *warnings);
/* Model calls of the refine pass: round(calls * denoise), half away from zero, at least 1 and at most calls
 * (calls: the first pass's schedule's model calls). The refine pass runs the last that many calls of the
 * first pass's schedule, as ComfyUI's KSampler runs `denoise` of a schedule. */
int h3_request_refine_calls(int calls, double denoise);
/* The two valid frame counts nearest to `frames` (lo < hi). */
void h3_request_nearest_frames(int64_t frames, int64_t *lo, int64_t *hi);
/* Up to two valid canvases nearest to width x height, nearest first; returns how many. */
int h3_request_nearest_canvases(int64_t width, int64_t height, int64_t out_w[2], int64_t out_h[2]);

/* BENCH.md's workloads: W73, W124, W362 (960x544; 3, 5 and 15 s) and W124L (1344x768, 5 s). */
typedef struct h3_workload {
    const char *name;
    int64_t w, h, frames;
} h3_workload;
/* The workload of that name, or NULL. */
const h3_workload *h3_workload_find(const char *name);
/* "W73, W124, W362, W124L": for messages. */
#define H3_WORKLOAD_NAMES "W73, W124, W362, W124L"

#endif
