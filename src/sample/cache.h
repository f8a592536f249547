/* Step caching: model calls skipped where the model's output is predicted to barely change (docs/SAMPLING.md,
 * "Step caching").
 *
 * The rule is EasyCache's (Zhou et al., 2025, "Less is Enough: Training-Free Video Diffusion Acceleration via
 * Runtime-Adaptive Caching"), as ComfyUI's native EasyCache node runs it. It needs no calibration per model
 * (MagCache needs a measured magnitude curve per model and schedule) and no hook inside the DiT (First Block
 * Cache runs the first block every step and streams it on a small GPU), so it wraps the sampler's model call
 * and works the same on the CPU, a resident GPU DiT and a streamed one. With the model's output u (a velocity)
 * and its input x:
 *   - after each computed call i it keeps u_i, x_i, the output's mean |u_i| and the transformation rate
 *     k = mean|u_i - u_prev| / mean|x_i - x_prev| (prev: the computed call before i);
 *   - at a later call j inside the window it adds k * mean|x_j - x_i| / mean|u_i| to a running estimate of the
 *     output's relative change since call i; while that estimate stays below the threshold the call is skipped
 *     and answered with u_i; once it reaches it the model runs and the estimate starts again from 0.
 * EasyCache answers a skip with x_j + (u_i - x_i) (its transformation vector); H3's velocity is better reused
 * as is: on the small model at 49 steps and the same skips, video latents 1.54% against 2.01% relative L2 off
 * the uncached run at threshold 0.2, audio 14.6% against 18.9% (0.52% / 0.65% and 5.1% / 6.9% at 0.05).
 * The window is the calls from start to end as shares of the run's calls (ComfyUI's defaults 0.15 and 0.95),
 * so the first calls, which set the clip's layout, always run, as do the last, which set its detail. A call
 * runs or is skipped for video and audio together (one DiT call makes both), but each stream keeps its own k,
 * norm and estimate, and a call is skipped only while both estimates are below the threshold: the audio's 6k
 * floats would vanish in a mean over the video's millions (measured on the small model: audio latents 28%
 * off with one joint estimate at 0.2).
 */
#ifndef H3_SAMPLE_CACHE_H
#define H3_SAMPLE_CACHE_H

#include <stddef.h>

#include "base/status.h"
#include "sample/sampler.h"

#define H3_CACHE_THRESHOLD 0.2 /* ComfyUI's EasyCache default reuse_threshold */
#define H3_CACHE_START 0.15
#define H3_CACHE_END 0.95

typedef struct h3_cache_opts {
    double threshold; /* > 0: on; the largest estimated relative change of the output a skip may accumulate */
    double start, end; /* the window, as shares of the run's model calls (0 <= start < end <= 1) */
} h3_cache_opts;

typedef struct h3_cache_stats {
    int calls;          /* model calls the sampler asked for (from the first one this run made) */
    int skipped;        /* of them, answered from the cache */
    double est_total;   /* the estimated relative changes the skipped calls accumulated, summed */
    double est_max;     /* the largest estimate a skipped call was answered under */
} h3_cache_stats;

typedef struct h3_step_cache {
    h3_cache_opts o;
    h3_model_fn model; /* the wrapped call */
    void *model_ctx;
    size_t nv, na;
    int n_calls, call; /* the run's calls, the next call's index */
    float *x_prev; /* [nv + na]: the last computed call's input */
    float *u_prev; /* [nv + na]: its output u (the noise-ward velocity, -v) */
    int have_prev, have_k;
    double k[2], u_norm[2], acc[2]; /* per stream: video, audio */
    h3_cache_stats st;
} h3_step_cache;

/* H3_ERR_INVALID naming the rule when the options are out of range. */
h3_status h3_cache_opts_check(const h3_cache_opts *o);
/* The cache for a run of n_calls model calls of nv video and na audio floats, the first one being call
 * first_call (a resumed run: nothing is cached from before it), around model(model_ctx, ...). */
h3_status h3_step_cache_init(h3_step_cache *c, const h3_cache_opts *o, h3_model_fn model, void *model_ctx,
                             size_t nv, size_t na, int n_calls, int first_call);
void h3_step_cache_free(h3_step_cache *c);
/* The wrapped model call (an h3_model_fn; ctx: the h3_step_cache). */
h3_status h3_step_cache_model(void *ctx, const float *x_video, const float *x_audio, float t_video, float t_audio,
                              float *v_video, float *v_audio);

#endif
